//! The restart supervisor: one thread per interface that receives the interface whenever
//! its poller gives it up, and brings it back.
//!
//! A poller hands its interface over (by value, on a crossbeam channel) when a CQ poll
//! fails, a fatal asynchronous event or a device removal arrives, the send-stall
//! watchdog fires, or an operator asks (`uipoib restart`). The supervisor then, in order:
//! sets the TAP carrier off (the TAP and its address stay); tears the interface down
//! (QP to error, flushes drained within a deadline, group detached, AHs, QP, CQs,
//! channel, MR, PD and context destroyed, every work request still outstanding reaped,
//! the ledger checked); if the device is gone, waits with backoff until it can be opened
//! again; rebuilds with a new epoch (re-posting the receive ring and re-attaching the
//! broadcast group), adapts the TAP if the device came back with another GID or MTU,
//! turns the carrier on and starts a fresh poller, which announces the new QPN with a
//! gratuitous ARP.
//!
//! Policy: the first restart after a healthy period is immediate; consecutive failures
//! back off exponentially; a circuit breaker declares the interface dead after too many
//! restarts within a window (carrier off, clear log line, `uipoib status` says so) until
//! an operator restart, or, when the device was lost, until the device returns.
//!
//! A device that keeps failing with `DEVICE_FATAL` while it stays present is held by the
//! breaker like any other cause: a dead interface whose device was lost is revived only
//! once the device has been seen gone (opens failing with "no device") and back.
//!
//! A poller that cannot be started on a rebuilt interface is a failed attempt (counted,
//! backed off, retried), and a poller thread that panics is a restart cause
//! (`poller-panicked`): the interface went with the panic, so the next epoch is opened
//! from scratch and that epoch's ledger is reported as lost.
//!
//! The QPs and CQs a renewal replaced are destroyed on a reaper thread (`reap-<tap>`),
//! never on the poller thread, once their grace is over (see [`crate::verbs::retire`]); a
//! shutdown waits out what is left of the grace, at most [`SHUTDOWN_GRACE_CAP`]. A
//! shutdown ends within [`SHUTDOWN_BOUND`] even if the poller hangs
//! ([`Supervisor::finish_shutdown`]).
//!
//! [`Backoff`] and [`Breaker`] are pure and take `now`; the thread is the shell.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, select, unbounded};
use serde::{Deserialize, Serialize};

use crate::iface::neigh::Neighbours;
use crate::iface::stats::{self, Snapshot, Stats};
use crate::iface::{FLUSH_DEADLINE, Failure, Interface, KeptEndpoint, OpenError, Params, Teardown};
use crate::runtime::config::RestartPolicy;
use crate::runtime::poller::{Exit, Poller, SpawnFailed};
use crate::tap::TapDevice;
use crate::verbs::retire::{self, RETIRE_GRACE, Reaper};
use crate::verbs::{Provider, VerbsError};

/// An interface that ran this long since its last restart is healthy again: the next
/// failure restarts it at once instead of backing off.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// Restart records kept for `uipoib status`.
pub const HISTORY_LEN: usize = 32;

/// What a shutdown may take for stopping the poller and tearing the interface down: the
/// flush drain ([`FLUSH_DEADLINE`]) and the destroys, of which one can block for 1.2 s
/// (measured, see [`crate::verbs::retire`]), with room for several.
pub const SHUTDOWN_TEARDOWN_BOUND: Duration = Duration::from_secs(5);

/// Longest a shutdown waits for the QPs a renewal replaced to come due
/// ([`RETIRE_GRACE`]): at most one whole grace.
pub const SHUTDOWN_GRACE_CAP: Duration = RETIRE_GRACE;

/// Longest a shutdown takes (15 s): [`SHUTDOWN_TEARDOWN_BOUND`] plus
/// [`SHUTDOWN_GRACE_CAP`]. A supervisor (or poller) that has not ended by then is left
/// behind, and the daemon exits without it.
pub const SHUTDOWN_BOUND: Duration = SHUTDOWN_TEARDOWN_BOUND.saturating_add(SHUTDOWN_GRACE_CAP);

/// Longest the reaper thread sleeps between looks at the retired objects when nothing
/// tells it of a new one (a retirement beyond [`crate::verbs::retire::RETIRED_CAP`] is
/// due at once and waits at most this long).
const REAP_IDLE: Duration = Duration::from_secs(1);

/// What can be asked of a supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Command {
    /// Restart the interface now (also revives a dead one).
    Restart,
    /// Tear down and end.
    Shutdown,
}

/// One restart, as `uipoib status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RestartRecord {
    /// The epoch it started.
    pub epoch: u16,
    /// Short cause (`poll-failed`, `device-removed`, `tx-stall`, `operator`, ...).
    pub cause: String,
    /// The cause in full.
    pub detail: String,
    /// When the failure was detected (ms since the Unix epoch).
    pub detected_unix_ms: u64,
    /// From detection to the new poller running with the carrier on (ms).
    pub recovery_ms: f64,
    /// Work requests reaped at the teardown.
    pub wr_reaped: u64,
    /// Of those, sends (counted as dropped with reason `reaped`).
    pub sends_reaped: u64,
    /// Flush completions drained.
    pub flushed: u64,
    /// Whether the ledger balanced with nothing outstanding after the reap.
    pub ledger_balanced: bool,
    /// Open attempts that failed before the rebuild succeeded.
    pub failed_attempts: u32,
    /// Whether the device context, PD, registered memory and completion channel were
    /// kept (only the QP and CQs were replaced); `false` after a device loss or when the
    /// renewal failed, when everything was reopened.
    #[serde(default)]
    pub kept_device: bool,
    /// Where the recovery time went (ms), in order; see [`Phases`].
    #[serde(default)]
    pub phases: Phases,
    /// Whether the failed epoch's interface was lost (a poller panic): nothing was
    /// drained or reaped, and `ledger_balanced` is `false` because its work requests
    /// cannot be accounted for, not because a reap found them unbalanced.
    #[serde(default)]
    pub ledger_lost: bool,
}

/// Where one recovery's time went, in milliseconds, in the order the phases run. Their
/// sum is `recovery_ms` up to the bookkeeping between them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Phases {
    /// From detection (in the poller) to the supervisor starting the restart: the
    /// poller's exit and the hand-over.
    pub handoff_ms: f64,
    /// Moving the QP to the error state and draining flush completions.
    pub drain_ms: f64,
    /// Detaching the group, destroying the AHs and the endpoint, or, when kept, replacing
    /// its QP and CQs (of which `renew_ms`).
    pub destroy_ms: f64,
    /// [`crate::verbs::Endpoint::renew`]: new CQs and QP brought up, the old destroyed.
    pub renew_ms: f64,
    /// Reaping and checking the ledger, and the backoff wait before the rebuild.
    pub reap_ms: f64,
    /// Opening the endpoint (context, PD, memory registration, channel, CQs, QP); zero
    /// when kept.
    pub open_ms: f64,
    /// Creating the broadcast group's address handle.
    pub ah_ms: f64,
    /// Attaching the broadcast group.
    pub attach_ms: f64,
    /// Posting the receive ring.
    pub fill_ms: f64,
    /// Starting the poller and turning the carrier on (of which `spawn_ms` and
    /// `carrier_ms`).
    pub start_ms: f64,
    /// Starting the poller: its poll set, registrations and thread (on one CPU the new
    /// thread may run first: its gratuitous ARP is then in here too).
    #[serde(default)]
    pub spawn_ms: f64,
    /// The TAP carrier on (`TUNSETCARRIER`).
    #[serde(default)]
    pub carrier_ms: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// What `uipoib status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// `running`, `restarting`, `waiting-for-device`, `dead`, `stopping`, `stopped`.
    pub state: String,
    /// TAP name.
    pub tap: String,
    /// RDMA device.
    pub device: String,
    /// Local QPN of the current epoch.
    pub qpn: u32,
    /// Local GID of the current epoch.
    pub gid: String,
    /// IPoIB MTU.
    pub mtu: u32,
    /// Interface address.
    pub addr: String,
    /// Restart epoch (1 at start).
    pub epoch: u16,
    /// Restarts completed.
    pub restarts: u64,
    /// Why the interface is dead, when it is.
    pub dead_reason: Option<String>,
    /// The most recent restarts, oldest first.
    pub history: Vec<RestartRecord>,
    /// Whether the control socket serves fault injection (`--allow-faults`); filled in
    /// by the control server.
    #[serde(default)]
    pub allow_faults: bool,
    /// Control-socket peers refused for their uid; filled in by the control server.
    #[serde(default)]
    pub control_peers_refused: u64,
}

/// Exponential backoff between consecutive failed attempts.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    consecutive: u32,
}

impl Backoff {
    /// A backoff with this policy.
    pub fn new(p: &RestartPolicy) -> Self {
        Backoff {
            initial: p.backoff_initial,
            max: p.backoff_max,
            consecutive: 0,
        }
    }

    /// The delay before the next attempt: zero for the first, then `initial`, doubling
    /// up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = match self.consecutive {
            0 => Duration::ZERO,
            n => self
                .initial
                .saturating_mul(1u32 << (n - 1).min(20))
                .min(self.max),
        };
        self.consecutive = self.consecutive.saturating_add(1);
        d
    }

    /// The interface is healthy again: the next failure restarts at once.
    pub fn reset(&mut self) {
        self.consecutive = 0;
    }
}

/// The circuit breaker: more than `max` restarts within `window` trips it.
#[derive(Debug, Clone)]
pub struct Breaker {
    max: u32,
    window: Duration,
    times: VecDeque<Instant>,
}

impl Breaker {
    /// A breaker with this policy.
    pub fn new(p: &RestartPolicy) -> Self {
        Breaker {
            max: p.max_restarts,
            window: p.window,
            times: VecDeque::new(),
        }
    }

    /// Record a restart at `now`; `true` if that trips the breaker.
    pub fn record(&mut self, now: Instant) -> bool {
        while let Some(t) = self.times.front() {
            if now.saturating_duration_since(*t) >= self.window {
                self.times.pop_front();
            } else {
                break;
            }
        }
        self.times.push_back(now);
        self.times.len() as u64 > u64::from(self.max)
    }

    /// Forget every recorded restart (operator revival).
    pub fn reset(&mut self) {
        self.times.clear();
    }
}

/// How one interface ended.
#[derive(Debug)]
pub struct Ended {
    /// TAP name.
    pub name: String,
    /// Counters at the end.
    pub stats: Snapshot,
    /// The last teardown's ledger verdict.
    pub ledger: Result<(), String>,
}

/// A running supervisor.
pub struct Supervisor {
    commands: Sender<Command>,
    thread: Option<JoinHandle<()>>,
    /// The thread's [`Ended`], sent as its last act.
    ended: Receiver<Ended>,
    name: String,
}

/// Everything a supervisor needs.
pub struct Setup {
    /// TAP name.
    pub name: String,
    /// How to rebuild the interface.
    pub params: Params,
    /// Restart policy.
    pub policy: RestartPolicy,
    /// The provider to reopen the device with.
    pub provider: Arc<dyn Provider>,
    /// The TAP (stays up across restarts).
    pub tap: Arc<dyn TapDevice>,
    /// Counters (outlive epochs).
    pub stats: Arc<Stats>,
    /// Status shown on the control socket.
    pub status: Arc<Mutex<Status>>,
}

impl Supervisor {
    /// Start supervising `first`, which is already open; its poller starts now.
    pub fn spawn(setup: Setup, first: Interface) -> std::io::Result<Supervisor> {
        let (commands, rx) = unbounded();
        let (ended_tx, ended) = crossbeam_channel::bounded(1);
        let name = setup.name.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sup-{name}"))
            .spawn(move || {
                let e = Shell::new(setup, rx).run(first);
                let _ = ended_tx.send(e);
            })?;
        Ok(Supervisor {
            commands,
            thread: Some(thread),
            ended,
            name,
        })
    }

    /// A handle to send commands (for the control socket).
    pub fn commands(&self) -> Sender<Command> {
        self.commands.clone()
    }

    /// Ask for a restart.
    pub fn restart(&self) {
        let _ = self.commands.send(Command::Restart);
    }

    /// Tear down and wait for the end, at most [`SHUTDOWN_BOUND`]; `None` if it did not
    /// end by then (see [`Supervisor::finish_shutdown`]).
    pub fn shutdown(self) -> Option<Ended> {
        self.begin_shutdown();
        self.finish_shutdown(Instant::now() + SHUTDOWN_BOUND)
    }

    /// Ask for the teardown without waiting (several interfaces then stop together).
    pub fn begin_shutdown(&self) {
        let _ = self.commands.send(Command::Shutdown);
    }

    /// Wait for the end until `deadline`. `None` if the supervisor had not ended by then
    /// (a hung poller or destroy): its threads are left behind, logged, and the caller
    /// goes on (the daemon exits).
    pub fn finish_shutdown(mut self, deadline: Instant) -> Option<Ended> {
        match self.ended.recv_deadline(deadline) {
            Ok(e) => {
                if let Some(t) = self.thread.take()
                    && t.join().is_err()
                {
                    tracing::error!(iface = %self.name, "supervisor thread panicked");
                }
                Some(e)
            }
            Err(_) => {
                tracing::error!(iface = %self.name, "the interface did not stop in time: leaving its threads behind");
                None
            }
        }
    }
}

struct Shell {
    s: Setup,
    commands: Receiver<Command>,
    exits_tx: Sender<Exit>,
    exits: Receiver<Exit>,
    backoff: Backoff,
    breaker: Breaker,
    epoch: u16,
    last_start: Instant,
    neigh: Option<Neighbours>,
    last_ledger: Result<(), String>,
    dead_device_lost: bool,
    /// The endpoint the last teardown kept (QP and CQs renewed) for the next epoch.
    kept: Option<KeptEndpoint>,
    /// The last poller start: thread and registration, then the carrier.
    last_spawn: (Duration, Duration),
    /// Since the breaker tripped on a device loss, an open found the device gone.
    seen_gone: bool,
    /// The reaper of the live endpoint, if its provider keeps replaced objects.
    reaper: Option<Arc<dyn Reaper>>,
    /// Hands reapers to the reaper thread (`None` once it is told to end).
    reaping: Option<Sender<Arc<dyn Reaper>>>,
    reaper_thread: Option<JoinHandle<()>>,
}

/// The reaper thread: destroys the retired objects of every reaper it was given once
/// they are due; forgets a reaper once its endpoint is gone. Ends when `rx` disconnects.
fn reap(rx: Receiver<Arc<dyn Reaper>>) {
    let mut watched: Vec<Arc<dyn Reaper>> = Vec::new();
    loop {
        let now = Instant::now();
        let next = watched.iter().filter_map(|r| r.next_due()).min();
        let idle = next.map_or(REAP_IDLE, |t| {
            t.saturating_duration_since(now).min(REAP_IDLE)
        });
        match rx.recv_timeout(idle) {
            Ok(r) => {
                if !watched
                    .iter()
                    .any(|w| std::ptr::addr_eq(Arc::as_ptr(w), Arc::as_ptr(&r)))
                {
                    watched.push(r);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        for r in &watched {
            r.reap_due(now);
        }
        // Only this thread holds it: its endpoint is gone (and destroyed the rest).
        watched.retain(|r| Arc::strong_count(r) > 1);
    }
}

enum Wait {
    Elapsed,
    Restart,
    Shutdown,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl Shell {
    fn new(s: Setup, commands: Receiver<Command>) -> Self {
        let (exits_tx, exits) = unbounded();
        Shell {
            backoff: Backoff::new(&s.policy),
            breaker: Breaker::new(&s.policy),
            s,
            commands,
            exits_tx,
            exits,
            epoch: 1,
            last_start: Instant::now(),
            neigh: None,
            last_ledger: Ok(()),
            dead_device_lost: false,
            kept: None,
            last_spawn: (Duration::ZERO, Duration::ZERO),
            seen_gone: false,
            reaper: None,
            reaping: None,
            reaper_thread: None,
        }
    }

    /// Give the live endpoint's reaper to the reaper thread (started on first use).
    fn watch_retired(&mut self, iface: &mut Interface) {
        self.reaper = iface.endpoint_mut().reaper();
        let Some(r) = self.reaper.clone() else {
            return;
        };
        if self.reaping.is_none() {
            let (tx, rx) = unbounded();
            match std::thread::Builder::new()
                .name(format!("reap-{}", self.s.name))
                .spawn(move || reap(rx))
            {
                Ok(t) => {
                    self.reaping = Some(tx);
                    self.reaper_thread = Some(t);
                }
                Err(e) => {
                    // The endpoint's teardown destroys them all, later than their grace.
                    tracing::error!(iface = %self.s.name, error = %e, "starting the reaper thread failed: replaced QPs wait for the teardown");
                    return;
                }
            }
        }
        if let Some(tx) = &self.reaping {
            let _ = tx.send(r);
        }
    }

    /// A shutdown: destroy the replaced QPs and CQs as they come due, for at most
    /// [`SHUTDOWN_GRACE_CAP`] (the teardown destroys the rest).
    fn wait_out_grace(&self) {
        if let Some(r) = &self.reaper
            && r.next_due().is_some()
        {
            let start = Instant::now();
            let done = retire::wait_out_grace(r.as_ref(), SHUTDOWN_GRACE_CAP);
            tracing::info!(iface = %self.s.name, waited_ms = ms(start.elapsed()), all_due = done, "waited for the replaced QPs' grace before the teardown");
        }
    }

    /// Tear down at a shutdown: the replaced QPs' grace first, then everything.
    fn final_teardown(&mut self, iface: Interface) {
        self.wait_out_grace();
        let (t, _) = iface.shutdown_into(FLUSH_DEADLINE, &*self.s.tap);
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

    /// Start a poller on `iface` (epoch `epoch`) and turn the carrier on. On failure
    /// the interface comes back.
    fn start_poller(&mut self, mut iface: Interface, epoch: u16) -> Result<Poller, SpawnFailed> {
        let hw = iface.hw_addr();
        let mtu = iface.mtu() as u32;
        self.watch_retired(&mut iface);
        self.last_start = Instant::now();
        let p = Poller::try_spawn(
            self.s.name.clone(),
            iface,
            self.s.tap.clone(),
            self.exits_tx.clone(),
        )?;
        let spawned = self.last_start.elapsed();
        if let Ok(mut st) = self.s.status.lock() {
            st.state = "running".into();
            st.qpn = hw.qpn;
            st.gid = hw.gid.to_string();
            st.mtu = mtu;
            st.epoch = epoch;
            st.dead_reason = None;
        }
        self.carrier(true);
        self.last_spawn = (spawned, self.last_start.elapsed() - spawned);
        Ok(p)
    }

    /// Wait up to `d` for a command.
    fn wait(&self, d: Duration) -> Wait {
        match self.commands.recv_timeout(d) {
            Ok(Command::Restart) => Wait::Restart,
            Ok(Command::Shutdown) => Wait::Shutdown,
            Err(crossbeam_channel::RecvTimeoutError::Timeout) => Wait::Elapsed,
            Err(crossbeam_channel::RecvTimeoutError::Disconnected) => Wait::Shutdown,
        }
    }

    fn ended(&mut self) -> Ended {
        // The reaper thread ends once told (after a destroy in progress, if any).
        self.reaper = None;
        self.reaping = None;
        if let Some(t) = self.reaper_thread.take()
            && t.join().is_err()
        {
            tracing::error!(iface = %self.s.name, "reaper thread panicked");
        }
        self.set_state("stopped");
        Ended {
            name: self.s.name.clone(),
            stats: self.s.stats.snapshot(),
            ledger: self.last_ledger.clone(),
        }
    }

    fn run(mut self, first: Interface) -> Ended {
        let mut poller = match self.start_poller(first, self.epoch) {
            Ok(p) => Some(p),
            Err(f) => {
                tracing::error!(iface = %self.s.name, error = %f.error, "starting the first poller failed: restarting");
                let cause = Failure::PollerStart(f.error.to_string());
                match self.restart(Some(*f.iface), cause, Instant::now()) {
                    Restarted::Running(p) => Some(p),
                    Restarted::Dead => None,
                    Restarted::Shutdown => return self.ended(),
                }
            }
        };
        let mut shutting_down = false;
        loop {
            let Some(p) = poller.take() else {
                // No poller: the interface is dead. Wait for an operator restart, the
                // device's return, or a shutdown.
                match self.revive() {
                    Some(p) => {
                        poller = Some(p);
                        continue;
                    }
                    None => return self.ended(),
                }
            };
            let exit = select! {
                recv(self.commands) -> c => {
                    match c {
                        Ok(Command::Restart) => p.restart(),
                        Ok(Command::Shutdown) | Err(_) => {
                            shutting_down = true;
                            self.set_state("stopping");
                            p.stop();
                        }
                    }
                    poller = Some(p);
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
                    self.final_teardown(*iface);
                    return self.ended();
                }
                Exit::Failed {
                    iface, cause, at, ..
                } => (Some(*iface), cause, at),
                Exit::Panicked { message, at, .. } => (None, Failure::PollerPanicked(message), at),
            };
            if shutting_down {
                p.join();
                match iface {
                    Some(iface) => self.final_teardown(iface),
                    None => self.last_ledger = Err(self.lost_ledger()),
                }
                return self.ended();
            }
            // The old poller has handed the interface over (or lost it); all its thread
            // has left to do is end. Join it once the new epoch runs: its exit is not on
            // the restart's path (seen in the lab: 1-10 ms under TCG).
            let restarted = self.restart(iface, cause, at);
            p.join();
            match restarted {
                Restarted::Running(p) => poller = Some(p),
                Restarted::Dead => poller = None,
                Restarted::Shutdown => return self.ended(),
            }
        }
    }

    /// The ledger verdict of an epoch whose interface was lost with its poller.
    fn lost_ledger(&self) -> String {
        format!(
            "epoch {}'s interface was lost in a poller panic: its work requests cannot be \
             accounted for",
            self.epoch
        )
    }

    /// Tear down a failed interface (`None`: it was lost with its poller) and bring up a
    /// new epoch.
    fn restart(
        &mut self,
        iface: Option<Interface>,
        cause: Failure,
        detected: Instant,
    ) -> Restarted {
        let detected_unix_ms = unix_ms();
        let handoff = detected.elapsed();
        tracing::warn!(iface = %self.s.name, cause = cause.kind(), detail = %cause, epoch = self.epoch, "restarting the interface");
        self.carrier(false);
        self.set_state("restarting");
        if self.last_start.elapsed() >= HEALTHY_AFTER {
            self.backoff.reset();
        }
        // A lost device cannot flush anything, and an operator's `rdma link delete` waits
        // until the endpoint is closed: tear down at once, reaping everything.
        // Anything else keeps the device context, PD, registered memory and channel, and
        // replaces only the QP and CQs (the kernel's IPoIB does the same).
        let t = match iface {
            None => {
                // Lost in a panic: its endpoint was dropped by the unwind, and its
                // neighbour table with it. Nothing to drain or reap; nothing balanced.
                self.neigh = None;
                self.kept = None;
                self.reaper = None;
                Teardown {
                    reaped: 0,
                    sends_reaped: 0,
                    flushed: 0,
                    drain: Duration::ZERO,
                    destroy: Duration::ZERO,
                    errors: 0,
                    ledger: Err(self.lost_ledger()),
                    kept: false,
                    renew: Duration::ZERO,
                }
            }
            Some(iface) if cause.device_lost() => {
                let (t, neigh) = iface.shutdown(Duration::ZERO);
                self.neigh = Some(neigh);
                t
            }
            Some(iface) => {
                let (t, neigh, kept) = iface.recycle(FLUSH_DEADLINE, &*self.s.tap);
                self.neigh = Some(neigh);
                self.kept = kept;
                t
            }
        };
        let lost = matches!(cause, Failure::PollerPanicked(_));
        match &t.ledger {
            Ok(()) => {}
            Err(e) => {
                tracing::error!(iface = %self.s.name, error = %e, "ledger does not balance after the reap")
            }
        }
        self.last_ledger = t.ledger.clone();
        // Kept, the rebuild follows at once and its summary line says all this: no log
        // write on the critical path (in the lab a line costs milliseconds).
        if !t.kept {
            tracing::info!(
                iface = %self.s.name, reaped = t.reaped, sends_reaped = t.sends_reaped,
                flushed = t.flushed, destroy_errors = t.errors, kept_device = t.kept,
                handoff_ms = ms(handoff), drain_ms = ms(t.drain), destroy_ms = ms(t.destroy),
                "torn down"
            );
        }
        let mut record = RestartRecord {
            epoch: self.epoch.wrapping_add(1),
            cause: cause.kind().into(),
            detail: cause.to_string(),
            detected_unix_ms,
            recovery_ms: 0.0,
            wr_reaped: t.reaped,
            sends_reaped: t.sends_reaped,
            flushed: t.flushed,
            ledger_balanced: t.ledger.is_ok(),
            failed_attempts: 0,
            kept_device: false,
            phases: Phases {
                handoff_ms: ms(handoff),
                drain_ms: ms(t.drain),
                destroy_ms: ms(t.destroy),
                renew_ms: ms(t.renew),
                ..Phases::default()
            },
            ledger_lost: lost,
        };
        if self.breaker.record(Instant::now()) {
            // Dead: nothing of the device is held until it is revived.
            if let Some(k) = self.kept.take() {
                k.close(self.neigh.as_mut(), &self.s.stats);
            }
            let why = format!(
                "{} restarts within {:?} (last cause: {})",
                self.s.policy.max_restarts + 1,
                self.s.policy.window,
                cause
            );
            tracing::error!(iface = %self.s.name, %why, "circuit breaker tripped: interface declared dead; `uipoib restart` revives it");
            self.push_record(record);
            if let Ok(mut st) = self.s.status.lock() {
                st.state = "dead".into();
                st.dead_reason = Some(why);
            }
            self.dead_device_lost = cause.device_lost();
            self.seen_gone = false;
            return Restarted::Dead;
        }
        match self.rebuild(&mut record, detected) {
            Some(p) => {
                self.push_record(record);
                Restarted::Running(p)
            }
            None => Restarted::Shutdown,
        }
    }

    fn push_record(&self, r: RestartRecord) {
        if let Ok(mut st) = self.s.status.lock() {
            st.history.push(r);
            if st.history.len() > HISTORY_LEN {
                st.history.remove(0);
            }
        }
    }

    /// Open the next epoch: on the endpoint the last teardown kept, if any (only its QP
    /// and CQs are new), else by opening the device.
    fn open_epoch(&mut self) -> Result<Interface, OpenError> {
        let epoch = self.epoch.wrapping_add(1).max(1);
        if let Some(kept) = self.kept.take() {
            match Interface::reopen(
                kept,
                &self.s.params,
                self.s.stats.clone(),
                epoch,
                &mut self.neigh,
            ) {
                Ok(iface) => return Ok(iface),
                Err(e) => {
                    tracing::warn!(iface = %self.s.name, error = %e, "rebuilding on the kept endpoint failed: opening the device again");
                }
            }
        }
        Interface::open(
            self.s.provider.as_ref(),
            &self.s.params,
            self.s.stats.clone(),
            epoch,
            &mut self.neigh,
        )
    }

    /// Put a freshly opened epoch to work: adapt the TAP if the device came back with
    /// another GID or MTU, start the poller with the carrier on, record the restart. If
    /// the poller cannot start, the interface comes back.
    fn go_live(
        &mut self,
        iface: Interface,
        record: &mut RestartRecord,
        detected: Instant,
    ) -> Result<Poller, SpawnFailed> {
        let old = self.s.status.lock().ok().map(|s| (s.gid.clone(), s.mtu));
        if let Some((gid, mtu)) = &old
            && (*gid != iface.hw_addr().gid.to_string() || *mtu != iface.mtu() as u32)
        {
            tracing::warn!(iface = %self.s.name, old_gid = %gid, new_gid = %iface.hw_addr().gid, old_mtu = mtu, new_mtu = iface.mtu(), "the device came back with a different GID or MTU: reconfiguring the TAP");
            if let Err(e) = self.s.tap.reconfigure(iface.mac(), iface.mtu()) {
                tracing::error!(iface = %self.s.name, error = %e, "reconfiguring the TAP failed");
            }
        }
        let epoch = self.epoch.wrapping_add(1).max(1);
        let live = Instant::now();
        let p = self.start_poller(iface, epoch)?;
        self.epoch = epoch;
        record.recovery_ms = ms(detected.elapsed());
        record.epoch = epoch;
        record.phases.start_ms = ms(live.elapsed());
        record.phases.spawn_ms = ms(self.last_spawn.0);
        record.phases.carrier_ms = ms(self.last_spawn.1);
        stats::add(&self.s.stats.restarts, 1);
        if let Ok(mut st) = self.s.status.lock() {
            st.restarts += 1;
        }
        tracing::info!(
            iface = %self.s.name, epoch, recovery_ms = record.recovery_ms,
            kept_device = record.kept_device, reaped = record.wr_reaped,
            sends_reaped = record.sends_reaped, flushed = record.flushed,
            ledger_balanced = record.ledger_balanced, phases = ?record.phases,
            "interface running again"
        );
        Ok(p)
    }

    /// A poller could not be started on a rebuilt interface: tear it down (keeping the
    /// device where it can), count a failed attempt; the caller backs off and retries.
    fn start_failed(&mut self, f: SpawnFailed, record: &mut RestartRecord) {
        record.failed_attempts += 1;
        self.set_state("restarting");
        tracing::warn!(iface = %self.s.name, error = %f.error, attempts = record.failed_attempts, "starting the poller failed; will retry");
        let (t, neigh, kept) = f.iface.recycle(FLUSH_DEADLINE, &*self.s.tap);
        self.neigh = Some(neigh);
        self.kept = kept;
        if let Err(e) = &t.ledger {
            tracing::error!(iface = %self.s.name, error = %e, "ledger does not balance after the reap");
        }
        record.wr_reaped += t.reaped;
        record.sends_reaped += t.sends_reaped;
        record.flushed += t.flushed;
        record.ledger_balanced &= t.ledger.is_ok();
        self.last_ledger = t.ledger;
    }

    /// Open a new epoch, waiting (with backoff) for the device if it is gone, and start
    /// its poller. `None` if a shutdown came first.
    fn rebuild(&mut self, record: &mut RestartRecord, detected: Instant) -> Option<Poller> {
        loop {
            let delay = self.backoff.next_delay();
            if !delay.is_zero() {
                match self.wait(delay) {
                    Wait::Shutdown => return None,
                    Wait::Restart | Wait::Elapsed => {}
                }
            }
            let attempt = Instant::now();
            let kept = self.kept.is_some();
            match self.open_epoch() {
                Ok(iface) => {
                    let o = iface.open_times();
                    let p = &mut record.phases;
                    p.reap_ms = (ms(attempt.saturating_duration_since(detected))
                        - p.handoff_ms
                        - p.drain_ms
                        - p.destroy_ms)
                        .max(0.0);
                    p.open_ms = ms(o.open);
                    p.ah_ms = ms(o.ah);
                    p.attach_ms = ms(o.attach);
                    p.fill_ms = ms(o.fill);
                    record.kept_device = kept && o.open.is_zero();
                    match self.go_live(iface, record, detected) {
                        Ok(p) => return Some(p),
                        Err(f) => self.start_failed(f, record),
                    }
                }
                Err(e) => {
                    record.failed_attempts += 1;
                    let gone = matches!(e, OpenError::Verbs(VerbsError::NoDevice(_)));
                    self.set_state(if gone {
                        "waiting-for-device"
                    } else {
                        "restarting"
                    });
                    if record.failed_attempts == 1 || record.failed_attempts.is_multiple_of(20) {
                        tracing::warn!(iface = %self.s.name, error = %e, attempts = record.failed_attempts, "reopening the device failed; will retry");
                    }
                }
            }
        }
    }

    /// A dead interface: wait for `uipoib restart` (or, when the device was lost, for it
    /// to go and return); then rebuild. `None` on shutdown.
    fn revive(&mut self) -> Option<Poller> {
        loop {
            let w = if self.dead_device_lost {
                self.wait(self.s.policy.backoff_max)
            } else {
                match self.commands.recv() {
                    Ok(Command::Restart) => Wait::Restart,
                    _ => Wait::Shutdown,
                }
            };
            let start = Instant::now();
            // Nothing to reap: every work request of the dead interface was reaped when
            // it was torn down, and that restart's record says whether its ledger balanced.
            let mut record = RestartRecord {
                cause: "revived".into(),
                detected_unix_ms: unix_ms(),
                ledger_balanced: true,
                ..Default::default()
            };
            match w {
                Wait::Shutdown => return None,
                Wait::Elapsed => {
                    // The device was lost: has it gone and come back?
                    let iface = match self.open_epoch() {
                        Ok(iface) => iface,
                        Err(e) => {
                            if matches!(e, OpenError::Verbs(VerbsError::NoDevice(_))) {
                                self.seen_gone = true;
                            }
                            continue;
                        }
                    };
                    if !self.seen_gone {
                        // Still there: a device that keeps failing without going away
                        // stays dead (the breaker holds) until an operator restart.
                        let (t, neigh) = iface.shutdown(Duration::ZERO);
                        self.neigh = Some(neigh);
                        if t.ledger.is_err() {
                            tracing::error!(iface = %self.s.name, "ledger of a probe open does not balance");
                        }
                        continue;
                    }
                    tracing::info!(iface = %self.s.name, "the device returned: reviving the dead interface");
                    self.revived();
                    record.detail = "the device returned after the circuit breaker tripped".into();
                    match self.go_live(iface, &mut record, start) {
                        Ok(p) => {
                            self.push_record(record);
                            return Some(p);
                        }
                        Err(f) => {
                            self.start_failed(f, &mut record);
                            let p = self.rebuild(&mut record, start)?;
                            self.push_record(record);
                            return Some(p);
                        }
                    }
                }
                Wait::Restart => {
                    tracing::info!(iface = %self.s.name, "operator restart: reviving the dead interface");
                    self.revived();
                    record.detail = "operator restart after the circuit breaker tripped".into();
                    let p = self.rebuild(&mut record, start)?;
                    self.push_record(record);
                    return Some(p);
                }
            }
        }
    }

    fn revived(&mut self) {
        self.breaker.reset();
        self.backoff.reset();
        self.dead_device_lost = false;
        self.seen_gone = false;
    }
}

enum Restarted {
    Running(Poller),
    Dead,
    Shutdown,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RestartPolicy {
        RestartPolicy {
            max_restarts: 3,
            window: Duration::from_secs(10),
            backoff_initial: Duration::from_millis(10),
            backoff_max: Duration::from_millis(50),
        }
    }

    #[test]
    fn backoff_first_immediate_then_doubles_to_max() {
        let mut b = Backoff::new(&policy());
        let d: Vec<u64> = (0..6).map(|_| b.next_delay().as_millis() as u64).collect();
        assert_eq!(d, vec![0, 10, 20, 40, 50, 50]);
        b.reset();
        assert_eq!(b.next_delay(), Duration::ZERO);
    }

    #[test]
    fn breaker_trips_after_max_in_window_only() {
        let t0 = Instant::now();
        let mut br = Breaker::new(&policy());
        assert!(!br.record(t0));
        assert!(!br.record(t0 + Duration::from_secs(1)));
        assert!(!br.record(t0 + Duration::from_secs(2)));
        assert!(br.record(t0 + Duration::from_secs(3)), "4th within 10 s");
        // Spread out: never trips.
        let mut br = Breaker::new(&policy());
        for i in 0..20 {
            assert!(!br.record(t0 + Duration::from_secs(4 * i)));
        }
        br.reset();
        assert!(!br.record(t0));
    }
}
