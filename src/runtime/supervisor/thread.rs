//! The supervisor's thread: it runs the poller, and when the poller hands the interface
//! over it feeds the restart machine ([`Recovery`]) what happened and performs what the
//! machine asks, until a new epoch runs, the interface is dead and waiting, or a close
//! comes. No restart policy is decided here.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, Sender, select, unbounded};

use super::close::close_timed;
use super::reaper::ReaperThread;
use super::{CLOSE_GRACE_CAP, Ended, HISTORY_LEN, Order, Supervised};
use crate::iface::neigh::Neighbours;
use crate::iface::recovery::{
    Action, Attempt, Event, Recovery, RestartRecord, Revival, State, ThreadTime, ms,
};
use crate::iface::stats;
use crate::iface::{
    Closed, FLUSH_DEADLINE, Failure, Interface, KeptEndpoint, OpenError, Origin, PendingBank,
};
use crate::runtime::poller::{Exit, Poller, PollerThread, SpawnFailed};
use crate::sys::process;
use crate::tap::FrameIo;
use crate::verbs::VerbsError;
use crate::verbs::retire::{self, Reaper};

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// A close came while the restart waited.
struct Stop;

/// How long the supervisor waits for a failed QP whose destroy a restart deferred (a
/// destroy has been seen to block for 1.2 s in the lab); past it, the bank stays
/// pending and the next restart does not defer.
const PENDING_BOUND: Duration = Duration::from_secs(10);

/// The reaps of pending banks, summed for the restart record.
#[derive(Default)]
struct Settled {
    reaped: u64,
    sends_reaped: u64,
    /// A reap found its ledger unbalanced.
    unbalanced: bool,
    took: Duration,
}

/// The state of one supervisor's thread.
pub(super) struct SupervisorThread {
    s: Supervised,
    orders: Receiver<Order>,
    exits_tx: Sender<Exit>,
    exits: Receiver<Exit>,
    machine: Recovery,
    /// The live poller.
    poller: Option<Poller>,
    /// The poller that handed its interface over: joined once the restart is decided
    /// (its exit is not on the restart's path; seen in the lab: 1-10 ms under TCG).
    old_poller: Option<Poller>,
    /// The interface in the restart's hands: handed over, or opened and not yet live.
    iface: Option<Interface>,
    neigh: Option<Neighbours>,
    /// The endpoint the last teardown kept (QP and CQs renewed) for the next epoch.
    kept: Option<KeptEndpoint>,
    last_ledger: Result<(), String>,
    /// Why the last open or poller start failed, for the machine's log line.
    last_error: String,
    /// The teardown under way is of an epoch whose poller could not be started.
    start_failed: bool,
    /// The reaper of the live endpoint, if its provider keeps replaced objects.
    reaper: Option<Arc<dyn Reaper>>,
    /// The failed QP's bank of slots, left to it by the last teardown (a spare bank):
    /// reaped once the new epoch runs ([`SupervisorThread::settle_pending`]).
    pending: Option<PendingBank>,
    /// What the reaps of pending banks found since the last restart record.
    settled: Option<Settled>,
    reaper_thread: ReaperThread,
    rehearsal: Rehearsal,
    /// The daemon's nice level, set once this thread runs at `restart-nice`: the threads
    /// it starts set theirs to it.
    daemon_nice: Option<i32>,
    /// A poller thread started ahead, for the next restart's poller (started while a
    /// poller runs, off any restart's time).
    spare: Option<PollerThread>,
    /// Starting the spare poller thread failed last time (warned once until it works).
    spare_failed: bool,
    /// The restart under way has been said in the log. A line costs milliseconds in the
    /// lab's guests: a restart that runs straight through says it in one line at its end
    /// ([`SupervisorThread::recovered`]); one that waits or fails says it first.
    restart_said: bool,
    /// When this thread took the restart under way up, and its scheduler counts then
    /// (`None` where the kernel keeps none): the record's `supervisor`.
    taken: Option<(Instant, process::SchedStat)>,
}

/// Where the restart rehearsed at start stands ([`Supervised::rehearse`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rehearsal {
    /// None asked for, or done.
    Off,
    /// The first poller was asked to hand over.
    Asked,
    /// The restart under way is the rehearsal.
    Running,
}

impl SupervisorThread {
    pub(super) fn new(s: Supervised, orders: Receiver<Order>) -> Self {
        let (exits_tx, exits) = unbounded();
        SupervisorThread {
            machine: Recovery::new(s.policy, 1, Instant::now()),
            s,
            orders,
            exits_tx,
            exits,
            poller: None,
            old_poller: None,
            iface: None,
            neigh: None,
            kept: None,
            last_ledger: Ok(()),
            last_error: String::new(),
            start_failed: false,
            reaper: None,
            pending: None,
            settled: None,
            reaper_thread: ReaperThread::default(),
            rehearsal: Rehearsal::Off,
            daemon_nice: None,
            spare: None,
            spare_failed: false,
            restart_said: true,
            taken: None,
        }
    }

    /// Say the restart under way, unless said: before anything that makes it wait or
    /// that another line reports.
    fn say_restart(&mut self) {
        if std::mem::replace(&mut self.restart_said, true) {
            return;
        }
        let r = self.machine.record();
        tracing::warn!(iface = %self.s.name, cause = %r.cause, detail = %r.detail, epoch = self.machine.epoch(), "restarting the interface");
    }

    /// Start the poller thread the next restart will use, unless one waits already. On
    /// failure the restart creates its poller's thread itself.
    fn ensure_spare(&mut self) {
        if self.spare.is_some() {
            return;
        }
        match PollerThread::start(&self.s.name, self.daemon_nice) {
            Ok(t) => {
                self.spare = Some(t);
                self.spare_failed = false;
            }
            Err(e) => {
                if !std::mem::replace(&mut self.spare_failed, true) {
                    tracing::warn!(iface = %self.s.name, error = %e, "starting a poller thread ahead failed: the next restart starts its own");
                }
            }
        }
    }

    /// Run this thread at `restart-nice`, if set: a restart then gets the CPU before the
    /// application and the kernel's threads on a loaded host, at the normal policy (it
    /// never keeps them from running, as a real-time policy would).
    fn set_nice(&mut self) {
        let Some(level) = self.s.restart_nice else {
            return;
        };
        let base = match process::thread_nice() {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(iface = %self.s.name, error = %e, "reading the supervisor's nice level failed: restarts run at the daemon's");
                return;
            }
        };
        if base == level {
            return;
        }
        match process::set_thread_nice(level) {
            Ok(()) => {
                tracing::info!(iface = %self.s.name, nice = level, daemon_nice = base, "the restart supervisor runs at its own nice level");
                self.daemon_nice = Some(base);
            }
            Err(e) => {
                tracing::warn!(iface = %self.s.name, error = %e, nice = level, daemon_nice = base, "restart-nice: setting the supervisor's nice level failed (raising it needs CAP_SYS_NICE or a RLIMIT_NICE that allows it): restarts run at the daemon's");
            }
        }
    }

    pub(super) fn run(mut self, first: Interface) -> Ended {
        self.set_nice();
        // The restart after a failed poll, rehearsed once as soon as the first poller
        // runs (the state stays `starting` until it is done): the first poller hands its
        // interface over, which is then handled as after a failed poll, through the
        // whole restart. That restart is found to work on this device at start, and the
        // first real one does not run its code for the first time (under emulation a
        // boot's first restart took several times the later ones; docs/PERFORMANCE.md).
        // It is not a restart: not counted, not in the history, not charged to the
        // breaker or the backoff; `Status::rehearsal` has its record.
        if self.s.rehearse {
            self.rehearsal = Rehearsal::Asked;
        }
        match self.start_poller(first, self.machine.epoch()) {
            Ok((p, _)) => {
                if self.rehearsal == Rehearsal::Asked {
                    p.restart();
                }
                self.poller = Some(p);
            }
            Err(f) => {
                self.rehearsal = Rehearsal::Off;
                tracing::error!(iface = %self.s.name, error = %f.error, "starting the first poller failed: restarting");
                let cause = Failure::PollerStart(f.error.to_string());
                let untrusted = f.iface.untrusted();
                self.iface = Some(*f.iface);
                if !self.restart(cause, untrusted, Instant::now()) {
                    return self.ended();
                }
            }
        }
        let mut closing = false;
        loop {
            let Some(p) = self.poller.take() else {
                tracing::error!(iface = %self.s.name, "no poller after a restart");
                return self.ended();
            };
            self.ensure_spare();
            let exit = select! {
                recv(self.orders) -> c => {
                    self.poller = Some(p);
                    match c {
                        Ok(Order::Restart) => {
                            // The machine asks the poller to hand over.
                            let _ = self.drive(Event::Operator);
                        }
                        Ok(Order::Close) | Err(_) => {
                            closing = true;
                            self.set_state("stopping");
                            if let Some(p) = &self.poller {
                                p.stop();
                            }
                        }
                    }
                    continue;
                }
                recv(self.exits) -> e => e,
            };
            let Ok(exit) = exit else {
                p.join();
                return self.ended();
            };
            let (iface, cause, at) = match exit {
                Exit::Stopped { iface, .. } => {
                    p.join();
                    self.final_close(*iface);
                    return self.ended();
                }
                Exit::Failed {
                    mut iface,
                    cause,
                    at,
                    ..
                } => {
                    let asked = std::mem::replace(&mut self.rehearsal, Rehearsal::Off);
                    let cause = if asked == Rehearsal::Asked && matches!(cause, Failure::Operator) {
                        iface.give_up();
                        self.rehearsal = Rehearsal::Running;
                        Failure::Rehearsal
                    } else {
                        cause
                    };
                    (Some(*iface), cause, at)
                }
                Exit::Panicked { message, at, .. } => (None, Failure::PollerPanicked(message), at),
            };
            if closing {
                if !matches!(cause, Failure::Operator | Failure::Rehearsal) {
                    tracing::warn!(iface = %self.s.name, cause = cause.kind(), detail = %cause, "the poller failed while the interface was closing");
                }
                p.join();
                match iface {
                    Some(iface) => self.final_close(iface),
                    None => self.last_ledger = Err(self.lost_ledger()),
                }
                return self.ended();
            }
            let untrusted = iface.as_ref().is_some_and(Interface::untrusted);
            self.iface = iface;
            self.old_poller = Some(p);
            if !self.restart(cause, untrusted, at) {
                return self.ended();
            }
        }
    }

    /// Bring the interface back after `cause` (detected at `at`): `false` if a close
    /// came first.
    fn restart(&mut self, cause: Failure, untrusted: bool, at: Instant) -> bool {
        self.take_up();
        if matches!(cause, Failure::Rehearsal) {
            tracing::info!(iface = %self.s.name, epoch = self.machine.epoch(), "rehearsing the restart after a failed poll");
        } else {
            // Said at its end, or before it waits (`say_restart`): no write on its way.
            self.restart_said = false;
        }
        self.drive(Event::Failed {
            cause,
            untrusted,
            detected: at,
        })
    }

    /// Feed `ev` to the machine and perform what it asks, feeding back each outcome,
    /// until it asks for nothing more (a poller runs) or a close comes (`false`).
    fn drive(&mut self, mut ev: Event) -> bool {
        loop {
            let actions = self.machine.handle(ev, Instant::now(), unix_ms());
            let mut next = None;
            for a in actions {
                match self.perform(a) {
                    Ok(Some(e)) => next = Some(e),
                    Ok(None) => {}
                    Err(Stop) => {
                        self.join_old_poller();
                        return false;
                    }
                }
            }
            match next {
                Some(e) => ev = e,
                None => return true,
            }
        }
    }

    /// Perform one action; its outcome, if it has one.
    fn perform(&mut self, a: Action) -> Result<Option<Event>, Stop> {
        if matches!(
            a,
            Action::WaitUntil(_)
                | Action::WaitForOperator
                | Action::AttemptFailed { .. }
                | Action::Dead { .. }
                | Action::CloseProbe
        ) {
            self.say_restart();
        }
        Ok(match a {
            Action::CarrierOff => {
                self.carrier(false);
                None
            }
            // The rehearsal's restart leaves the state at `starting`.
            Action::Status(State::Restarting) if self.rehearsal == Rehearsal::Running => None,
            Action::Status(s) => {
                self.set_state(s.as_str());
                None
            }
            Action::ForgetLost => Some(Event::Closed(self.forget_lost())),
            Action::Close { drain, keep } => self.close_epoch(drain, keep),
            Action::CloseKept => {
                if let Some(k) = self.kept.take() {
                    k.close(self.neigh.as_mut(), &self.s.stats);
                }
                None
            }
            Action::Open { epoch, on_kept } => Some(self.open(epoch, on_kept)),
            Action::CloseProbe => {
                if let Some(iface) = self.iface.take() {
                    let (t, neigh, _) = close_timed(iface, Duration::ZERO, None, false);
                    self.neigh = Some(neigh);
                    if t.ledger.is_err() {
                        tracing::error!(iface = %self.s.name, "ledger of a probe open does not balance");
                    }
                }
                None
            }
            Action::StartPoller { epoch } => Some(self.start(epoch)),
            Action::WaitUntil(t) => Some(match self.orders.recv_deadline(t) {
                Ok(Order::Restart) => Event::Operator,
                Ok(Order::Close) => return Err(Stop),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => Event::Tick,
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => return Err(Stop),
            }),
            Action::WaitForOperator => match self.orders.recv() {
                Ok(Order::Restart) => Some(Event::Operator),
                _ => return Err(Stop),
            },
            Action::HandOver => {
                if let Some(p) = &self.poller {
                    p.restart();
                }
                None
            }
            Action::AttemptFailed {
                attempts,
                what,
                log,
            } => {
                if log {
                    let error = &self.last_error;
                    match what {
                        Attempt::Open => {
                            tracing::warn!(iface = %self.s.name, %error, attempts, "reopening the device failed; will retry")
                        }
                        Attempt::Start => {
                            tracing::warn!(iface = %self.s.name, %error, attempts, "starting the poller failed; will retry")
                        }
                    }
                }
                None
            }
            Action::Revive(Revival::Operator) => {
                tracing::info!(iface = %self.s.name, "operator restart: reviving the dead interface");
                self.take_up();
                None
            }
            Action::Revive(Revival::DeviceReturned) => {
                tracing::info!(iface = %self.s.name, "the device returned: reviving the dead interface");
                self.take_up();
                None
            }
            Action::Dead { why, mut record } => {
                self.taken = None;
                tracing::error!(iface = %self.s.name, %why, "circuit breaker tripped: interface declared dead; `uipoib restart` revives it");
                self.settle_pending(PENDING_BOUND);
                self.fold_settled(&mut record);
                self.push_record(record, false);
                if let Ok(mut st) = self.s.status.lock() {
                    st.state = "dead".into();
                    st.dead_reason = Some(why);
                }
                self.join_old_poller();
                None
            }
            Action::Recovered(mut record) => {
                record.supervisor = self.took_up();
                // The new epoch runs: the failed QP it replaced goes now, and its bank
                // of slots is reaped, off the restart's time.
                self.settle_pending(PENDING_BOUND);
                self.fold_settled(&mut record);
                if std::mem::replace(&mut self.rehearsal, Rehearsal::Off) == Rehearsal::Running {
                    self.rehearsed(record);
                } else {
                    self.recovered(record);
                }
                self.join_old_poller();
                None
            }
        })
    }

    /// The interface was lost in a panic: its endpoint was dropped by the unwind, and its
    /// neighbour table with it. Nothing to drain or reap; nothing balanced.
    fn forget_lost(&mut self) -> Closed {
        self.iface = None;
        self.neigh = None;
        self.kept = None;
        self.reaper = None;
        let t = Closed {
            ledger: Err(self.lost_ledger()),
            ..Closed::default()
        };
        self.closed(&t);
        t
    }

    /// Tear down the interface in hand: drained (on the wall clock, at most
    /// [`FLUSH_DEADLINE`]) or not; its endpoint kept (QP and CQs renewed) or closed.
    fn close_epoch(&mut self, drain: bool, keep: bool) -> Option<Event> {
        let mut iface = self.iface.take()?;
        // The other bank is free unless a failed QP's is still pending (then this one's
        // QP is destroyed before the reap, and the next epoch stays on this bank).
        let free = self.settle_pending(PENDING_BOUND);
        iface.allow_deferred_reap(free);
        let deadline = if drain {
            FLUSH_DEADLINE
        } else {
            Duration::ZERO
        };
        // Kept, the TAP takes what the drain delivers; a lost device delivers nothing.
        let tap: Option<&dyn FrameIo> = if keep { Some(&*self.s.tap) } else { None };
        let (t, neigh, mut kept) = close_timed(iface, deadline, tap, keep);
        self.neigh = Some(neigh);
        self.pending = kept.as_mut().and_then(KeptEndpoint::take_pending);
        self.kept = kept;
        self.closed(&t);
        Some(Event::Closed(t))
    }

    /// What every teardown of a restart says, and keeps.
    fn closed(&mut self, t: &Closed) {
        if t.ledger.is_err() || !t.kept {
            self.say_restart();
        }
        if let Err(e) = &t.ledger {
            tracing::error!(iface = %self.s.name, error = %e, "ledger does not balance after the reap");
        }
        self.last_ledger = t.ledger.clone();
        // Kept, the rebuild follows at once and its summary line says all this: no log
        // write on the critical path (in the lab a line costs milliseconds). After a
        // failed poller start, the attempt's line was said.
        if !t.kept && !std::mem::take(&mut self.start_failed) {
            let handoff_ms = self.machine.record().phases.handoff_ms;
            tracing::info!(
                iface = %self.s.name, reaped = t.reaped, sends_reaped = t.sends_reaped,
                flushed = t.flushed, destroy_errors = t.errors, kept_device = t.kept,
                handoff_ms, drain_ms = ms(t.drain), destroy_ms = ms(t.destroy),
                "torn down"
            );
        }
        self.start_failed = false;
    }

    /// Open epoch `epoch` on the kept endpoint or from scratch, timed on the wall clock.
    fn open(&mut self, epoch: u16, on_kept: bool) -> Event {
        let clock = &Instant::now;
        let s = &self.s;
        let origin = if on_kept {
            let Some(kept) = self.kept.take() else {
                // Nothing kept after all: the same attempt opens the device.
                return Event::OpenFailed {
                    on_kept,
                    no_device: false,
                };
            };
            Origin::Kept(kept)
        } else {
            Origin::Device(s.provider.as_ref())
        };
        let opened = Interface::open_timed(
            origin,
            &s.params,
            s.stats.clone(),
            epoch,
            &mut self.neigh,
            Some(clock),
        );
        match opened {
            Ok(iface) => {
                let times = iface.open_times();
                self.iface = Some(iface);
                Event::Opened { on_kept, times }
            }
            Err(e) => {
                if on_kept {
                    self.say_restart();
                    tracing::warn!(iface = %self.s.name, error = %e, "rebuilding on the kept endpoint failed: opening the device again");
                }
                let no_device = matches!(e, OpenError::Verbs(VerbsError::NoDevice(_)));
                self.last_error = e.to_string();
                Event::OpenFailed { on_kept, no_device }
            }
        }
    }

    /// Put the opened epoch to work: adapt the TAP if the device came back with another
    /// GID or MTU, start the poller with the carrier on. If the poller cannot start, the
    /// interface comes back.
    fn start(&mut self, epoch: u16) -> Event {
        let Some(iface) = self.iface.take() else {
            return Event::PollerStartFailed;
        };
        let old = self.s.status.lock().ok().map(|s| (s.gid.clone(), s.mtu));
        if let Some((gid, mtu)) = &old
            && (*gid != iface.hw_addr().gid.to_string() || *mtu != iface.mtu() as u32)
        {
            tracing::warn!(iface = %self.s.name, old_gid = %gid, new_gid = %iface.hw_addr().gid, old_mtu = mtu, new_mtu = iface.mtu(), "the device came back with a different GID or MTU: reconfiguring the TAP");
            if let Err(e) = self.s.tap.reconfigure(iface.mac(), iface.mtu()) {
                tracing::error!(iface = %self.s.name, error = %e, "reconfiguring the TAP failed");
            }
        }
        match self.start_poller(iface, epoch) {
            Ok((p, started)) => {
                self.poller = Some(p);
                started
            }
            Err(f) => {
                self.last_error = f.error.to_string();
                self.iface = Some(*f.iface);
                self.start_failed = true;
                Event::PollerStartFailed
            }
        }
    }

    /// A restart (or a revival) starts here: this thread's scheduler counts, read before
    /// anything else and once more at the hand-over ([`Self::took_up`]): one small read
    /// of /proc and one of the thread's CPU clock each.
    fn take_up(&mut self) {
        self.taken = process::thread_schedstat()
            .ok()
            .map(|s| (Instant::now(), s));
    }

    /// This thread's share of the restart it took up, from [`Self::take_up`] to now.
    fn took_up(&mut self) -> Option<ThreadTime> {
        let (at, then) = self.taken.take()?;
        let now = process::thread_schedstat().ok()?;
        Some(ThreadTime::between(
            at.elapsed(),
            now.on_cpu_ns.saturating_sub(then.on_cpu_ns),
            now.runqueue_ns.saturating_sub(then.runqueue_ns),
        ))
    }

    /// A restart is complete: count it, say it, record it.
    fn recovered(&mut self, record: RestartRecord) {
        stats::add(&self.s.stats.restarts, 1);
        if std::mem::replace(&mut self.restart_said, true) {
            tracing::info!(
                iface = %self.s.name, epoch = record.epoch, recovery_ms = record.recovery_ms,
                kept_device = record.kept_device, reaped = record.wr_reaped,
                sends_reaped = record.sends_reaped, flushed = record.flushed,
                ledger_balanced = record.ledger_balanced, phases = ?record.phases,
                supervisor = ?record.supervisor,
                "interface running again"
            );
        } else {
            tracing::warn!(
                iface = %self.s.name, cause = %record.cause, detail = %record.detail,
                epoch = record.epoch, recovery_ms = record.recovery_ms,
                kept_device = record.kept_device, reaped = record.wr_reaped,
                sends_reaped = record.sends_reaped, flushed = record.flushed,
                ledger_balanced = record.ledger_balanced, phases = ?record.phases,
                supervisor = ?record.supervisor,
                "interface restarted and running again"
            );
        }
        // The count and its record change together: a reader of `status` that sees the
        // new count sees the new record (a client takes the last `restarts - n` records
        // as the restarts since it looked).
        self.push_record(record, true);
    }

    fn rehearsed(&mut self, record: RestartRecord) {
        tracing::info!(
            iface = %self.s.name, epoch = record.epoch, recovery_ms = record.recovery_ms,
            reaped = record.wr_reaped, ledger_balanced = record.ledger_balanced,
            phases = ?record.phases, supervisor = ?record.supervisor,
            "restart after a failed poll rehearsed"
        );
        if let Ok(mut st) = self.s.status.lock() {
            st.rehearsal = Some(record);
        }
    }

    fn push_record(&self, r: RestartRecord, counted: bool) {
        if let Ok(mut st) = self.s.status.lock() {
            if counted {
                st.restarts += 1;
            }
            st.history.push(r);
            if st.history.len() > HISTORY_LEN {
                st.history.remove(0);
            }
        }
    }

    /// Reap the pending bank, if any, once its failed QP is gone (destroyed on this
    /// thread if still due), waiting at most `bound`; what it found is kept for the
    /// restart's record. Whether no bank is pending after.
    fn settle_pending(&mut self, bound: Duration) -> bool {
        let Some(p) = self.pending.take() else {
            return true;
        };
        let start = Instant::now();
        match p.reap(bound) {
            Ok(r) => {
                if let Err(e) = &r.ledger {
                    self.say_restart();
                    tracing::error!(iface = %self.s.name, error = %e, "ledger of the failed QP's bank does not balance after the reap");
                    self.last_ledger = r.ledger.clone();
                }
                let s = self.settled.get_or_insert_default();
                s.reaped += r.reaped;
                s.sends_reaped += r.sends_reaped;
                s.unbalanced |= r.ledger.is_err();
                s.took += start.elapsed();
                true
            }
            Err(p) => {
                self.say_restart();
                tracing::error!(iface = %self.s.name, waited_ms = ms(start.elapsed()), "the failed QP is not destroyed yet: its work requests stay pending");
                self.pending = Some(p);
                false
            }
        }
    }

    /// Put what the pending banks' reaps found into `record`.
    fn fold_settled(&mut self, record: &mut RestartRecord) {
        if let Some(s) = self.settled.take() {
            record.deferred_reap = true;
            record.wr_reaped += s.reaped;
            record.sends_reaped += s.sends_reaped;
            record.ledger_balanced &= !s.unbalanced;
            record.phases.bank_reap_ms += ms(s.took);
        }
    }

    fn join_old_poller(&mut self) {
        if let Some(p) = self.old_poller.take() {
            p.join();
        }
    }

    /// Give the live endpoint's reaper to the reaper thread (started on first use),
    /// unless it has it already: a kept endpoint's is the same, and telling the thread
    /// again would wake it in the middle of the restart (on a guest's one CPU it then runs
    /// before the announcement).
    fn watch_retired(&mut self, iface: &mut Interface) {
        let new = iface.endpoint_mut().reaper();
        let same = match (&self.reaper, &new) {
            (Some(old), Some(new)) => Arc::ptr_eq(old, new),
            _ => false,
        };
        self.reaper = new;
        let Some(r) = self.reaper.clone() else {
            return;
        };
        if same && self.reaper_thread.running() {
            return;
        }
        let (thread, name) = (&mut self.reaper_thread, &self.s.name);
        if let Err(e) = thread.watch(name, r, self.daemon_nice) {
            // The endpoint's teardown destroys them all, later than their grace.
            tracing::error!(iface = %self.s.name, error = %e, "starting the reaper thread failed: replaced QPs wait for the teardown");
        }
    }

    /// A close: destroy the replaced QPs and CQs as they come due, for at most
    /// [`CLOSE_GRACE_CAP`] (the teardown destroys the rest).
    fn wait_out_grace(&self) {
        if let Some(r) = &self.reaper
            && r.next_due().is_some()
        {
            let start = Instant::now();
            let done = retire::wait_out_grace(r.as_ref(), CLOSE_GRACE_CAP);
            tracing::info!(iface = %self.s.name, waited_ms = ms(start.elapsed()), all_due = done, "waited for the replaced QPs' grace before the teardown");
        }
    }

    /// Tear down at a close: the replaced QPs' grace first, then everything.
    fn final_close(&mut self, iface: Interface) {
        self.wait_out_grace();
        let (t, _, _) = close_timed(iface, FLUSH_DEADLINE, Some(&*self.s.tap), false);
        self.last_ledger = t.ledger;
    }

    fn set_state(&self, state: &str) {
        if let Ok(mut st) = self.s.status.lock() {
            st.state = state.to_string();
        }
    }

    fn carrier(&self, on: bool) {
        if let Err(e) = self.s.tap.set_carrier(on) {
            tracing::warn!(iface = %self.s.name, error = %e, "setting the TAP carrier failed");
        }
    }

    /// Announce the new QPN, start a poller on `iface` (epoch `epoch`) and turn the
    /// carrier on; with what each took, as [`Event::PollerStarted`]. On failure the
    /// interface comes back.
    fn start_poller(
        &mut self,
        mut iface: Interface,
        epoch: u16,
    ) -> Result<(Poller, Event), SpawnFailed> {
        let hw = iface.hw_addr();
        let mtu = iface.mtu() as u32;
        self.watch_retired(&mut iface);
        // Peers learn the new QPN from this announcement and send to the old one until it
        // arrives, into nothing: it goes now, with the receive ring posted, not after the
        // poller thread has started and the carrier is on.
        let t0 = Instant::now();
        iface.announce_once(t0);
        let start = Instant::now();
        let announce = start - t0;
        // The poller goes to the daemon's level itself, as it starts: the supervisor
        // stays at its own through the start (dropping it around the spawn put the
        // restart behind the load at the moment it was nearly done). The status and the
        // carrier come before the poller has the interface: woken on this one CPU, it may
        // run at once, and the restart ends as it is handed over.
        let mut spawned = Duration::ZERO;
        let mut spare = self.spare.take();
        let result = Poller::try_spawn(
            self.s.name.clone(),
            iface,
            self.s.tap.clone(),
            self.exits_tx.clone(),
            self.daemon_nice,
            &mut spare,
            || {
                spawned = start.elapsed();
                if let Ok(mut st) = self.s.status.lock() {
                    st.state = if self.rehearsal == Rehearsal::Asked {
                        "starting".into()
                    } else {
                        "running".into()
                    };
                    st.qpn = hw.qpn;
                    st.gid = hw.gid.to_string();
                    st.mtu = mtu;
                    st.epoch = epoch;
                    st.dead_reason = None;
                }
                self.carrier(true);
            },
        );
        // Kept for the next start if this one failed before using it.
        self.spare = spare;
        let (p, handed, thread_ahead) = result?;
        let started = Event::PollerStarted {
            announce,
            announced: start,
            spawn: spawned,
            carrier: handed.saturating_duration_since(start) - spawned,
            thread_ahead,
            handed,
        };
        Ok((p, started))
    }

    fn ended(&mut self) -> Ended {
        // A bank still pending is reaped before the end (its endpoint, if closed,
        // destroyed its QP).
        if !self.settle_pending(PENDING_BOUND) {
            self.pending = None;
            self.last_ledger = Err("the failed QP of the last restart was never destroyed: its work requests cannot be accounted for".into());
        } else if self.settled.as_ref().is_some_and(|s| s.unbalanced) {
            self.last_ledger = Err("the failed QP's bank did not balance after its reap".into());
        }
        if let Some(t) = self.spare.take()
            && !t.end()
        {
            tracing::error!(iface = %self.s.name, "the poller thread started ahead panicked");
        }
        // The reaper thread ends once told (after a destroy in progress, if any).
        self.reaper = None;
        if !self.reaper_thread.end() {
            tracing::error!(iface = %self.s.name, "reaper thread panicked");
        }
        self.set_state("stopped");
        Ended {
            name: self.s.name.clone(),
            stats: self.s.stats.snapshot(),
            ledger: self.last_ledger.clone(),
        }
    }

    /// The ledger verdict of an epoch whose interface was lost with its poller.
    fn lost_ledger(&self) -> String {
        format!(
            "epoch {}'s interface was lost in a poller panic: its work requests cannot be \
             accounted for",
            self.machine.epoch()
        )
    }
}
