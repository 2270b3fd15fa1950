//! The poller: one thread per interface, a thin mio shell around [`Napi`] and [`TxGate`].
//!
//! It waits on the TAP fd, the completion channel, the async-event source and a waker;
//! feeds events and poll results into the state machines; and does what they decide:
//! poll within the budget, yield to TX, re-arm and poll once more, read the TAP while the
//! send ring has room.
//!
//! The rule this module exists to keep: when a CQ poll fails, the poller does not retry
//! and does not reschedule. It stops touching the verbs objects, deregisters, and moves
//! the [`Interface`] by value into an [`Exit::Failed`] message to the supervisor. It
//! cannot touch the interface again: it no longer owns it. (The poll-failure policies
//! that replay the alternatives, allowed only with `--allow-faults`, bend this rule on
//! purpose: see [`crate::iface::PollFailurePolicy`].)
//!
//! A panic in the poller thread is caught at the thread's top ([`Exit::Panicked`]): the
//! interface was dropped by the unwind (its endpoint destroyed), and the supervisor
//! rebuilds from scratch, reporting that epoch's ledger as lost. A poller is never a
//! silently dead thread.

use std::io;
use std::panic::{self, AssertUnwindSafe};
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::iface::boost::{Change, RX_BOOST_HOLD, RxBoost};
use crate::iface::napi::{Action, Napi, TxGate};
use crate::iface::stats;
use crate::iface::{Failure, Interface};
use crate::sys::process;
use crate::tap::TapDevice;
use crate::verbs::{AsyncEvent, Endpoint, WaitFds};

const TAP: Token = Token(0);
const CQ: Token = Token(1);
const ASYNC: Token = Token(2);
const WAKE: Token = Token(3);

/// How often neighbours are aged when the loop is otherwise idle.
pub const HOUSEKEEPING_INTERVAL: Duration = Duration::from_secs(1);

/// How a poller ended. Either way the interface comes back by value.
pub enum Exit {
    /// Asked to stop.
    Stopped {
        /// The interface name (TAP).
        name: String,
        /// The interface, intact.
        iface: Box<Interface>,
    },
    /// A poll (or another verb) failed: the supervisor takes over.
    Failed {
        /// The interface name (TAP).
        name: String,
        /// The interface, as it was when the failure was seen.
        iface: Box<Interface>,
        /// Why.
        cause: Failure,
        /// When it was seen.
        at: Instant,
    },
    /// The poller thread panicked. The interface was dropped by the unwind: its verbs
    /// objects are destroyed, and its work requests can no longer be accounted for.
    Panicked {
        /// The interface name (TAP).
        name: String,
        /// The panic's message.
        message: String,
        /// When it was caught.
        at: Instant,
    },
}

/// A poller that could not be started, with the interface it was given (untouched but
/// for a registration that was undone).
pub struct SpawnFailed {
    /// Why.
    pub error: io::Error,
    /// The interface, back.
    pub iface: Box<Interface>,
}

/// The message of a caught panic.
fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "a panic with a non-text payload".into()
    }
}

/// Nothing asked of the poller.
const RUN: u8 = 0;
/// Stop and hand the interface back intact.
const STOP: u8 = 1;
/// Stop and hand the interface to the supervisor for a restart.
const RESTART: u8 = 2;

/// A running poller.
pub struct Poller {
    waker: Arc<Waker>,
    request: Arc<AtomicU8>,
    thread: Option<JoinHandle<()>>,
}

impl Poller {
    /// Start a poller thread owning `iface`. Its end is reported on `exits`.
    pub fn spawn(
        name: String,
        iface: Interface,
        tap: Arc<dyn TapDevice>,
        exits: Sender<Exit>,
    ) -> io::Result<Poller> {
        Self::try_spawn(name, iface, tap, exits, None, &mut None, || {})
            .map(|(p, _, _)| p)
            .map_err(|f| f.error)
    }

    /// Like [`Poller::spawn`], but a failure hands the interface back. With `nice`, the
    /// thread sets its nice level to it first thing, whatever it inherited: the thread
    /// that starts it may run at another (the restart supervisor, `restart-nice`) and
    /// keeps it through the start. With a thread in `spare` (started ahead,
    /// [`PollerThread::start`]), that thread runs the interface and none is created now
    /// (should it be gone, a new one is); it stays there if the start fails before.
    /// `ready` runs once the poll set and the thread are there, just before the thread
    /// is handed the interface (the supervisor turns the carrier on there); the instant
    /// of the hand-over comes back with the poller, and whether a thread started ahead
    /// took it.
    pub fn try_spawn(
        name: String,
        mut iface: Interface,
        tap: Arc<dyn TapDevice>,
        exits: Sender<Exit>,
        nice: Option<i32>,
        spare: &mut Option<PollerThread>,
        ready: impl FnOnce(),
    ) -> Result<(Poller, Instant, bool), SpawnFailed> {
        let (poll, fds) = match Self::poll_set(&mut iface, tap.as_ref()) {
            Ok(p) => p,
            Err(error) => {
                return Err(SpawnFailed {
                    error,
                    iface: Box::new(iface),
                });
            }
        };
        let waker = match Waker::new(poll.registry(), WAKE) {
            Ok(w) => Arc::new(w),
            Err(error) => {
                unwatch(&mut iface, &poll, &fds);
                return Err(SpawnFailed {
                    error,
                    iface: Box::new(iface),
                });
            }
        };
        let request = Arc::new(AtomicU8::new(RUN));
        let job = Job {
            name: name.clone(),
            iface,
            tap,
            poll,
            fds,
            request: request.clone(),
            exits,
        };
        // The thread: the one started ahead, else one started now (if that fails, the
        // interface comes back).
        let ahead = match spare.take() {
            Some(t) if t.waiting() => Some(t),
            Some(_) => {
                tracing::warn!(iface = %name, "the poller thread started ahead has ended: starting another");
                None
            }
            None => None,
        };
        let thread_ahead = ahead.is_some();
        let t = match ahead {
            Some(t) => t,
            None => match PollerThread::start(&name, nice) {
                Ok(t) => t,
                Err(error) => return Err(job.give_back(error)),
            },
        };
        ready();
        // On one CPU the thread, woken, may run at once: the hand-over is this instant.
        let handed = Instant::now();
        match t.give.send(job) {
            Ok(()) => Ok((
                Poller {
                    waker,
                    request,
                    thread: Some(t.thread),
                },
                handed,
                thread_ahead,
            )),
            // Cannot happen: the thread holds the receiver until it gets its job (and
            // was seen waiting). Hand the interface back all the same.
            Err(back) => Err(back.into_inner().give_back(io::Error::other(
                "the poller thread ended before it started",
            ))),
        }
    }

    /// A poll set with the TAP and the endpoint's descriptors registered, and those
    /// descriptors (to take out again, see [`unwatch`]).
    fn poll_set(iface: &mut Interface, tap: &dyn TapDevice) -> io::Result<(Poll, WaitFds)> {
        let poll = Poll::new()?;
        let fd = tap.raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), TAP, Interest::READABLE)?;
        let fds = watch(iface, &poll)?;
        Ok((poll, fds))
    }

    /// Ask the poller to stop; it reports [`Exit::Stopped`].
    pub fn stop(&self) {
        self.ask(STOP);
    }

    /// Ask the poller to hand its interface over for a restart; it reports
    /// [`Exit::Failed`] with [`Failure::Operator`].
    pub fn restart(&self) {
        self.ask(RESTART);
    }

    fn ask(&self, what: u8) {
        // A stop wins over a restart already asked for.
        let _ = self
            .request
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |cur| {
                (what == STOP || cur == RUN).then_some(what)
            });
        if let Err(e) = self.waker.wake() {
            tracing::warn!(error = %e, "waking the poller failed");
        }
    }

    /// Wait for the thread to end.
    pub fn join(mut self) {
        if let Some(t) = self.thread.take()
            && t.join().is_err()
        {
            tracing::error!("poller thread panicked");
        }
    }
}

/// What a poller thread is given to run: the interface and its poll set.
struct Job {
    name: String,
    iface: Interface,
    tap: Arc<dyn TapDevice>,
    poll: Poll,
    fds: WaitFds,
    request: Arc<AtomicU8>,
    exits: Sender<Exit>,
}

impl Job {
    /// The job not run: its descriptors out of the poll set, the interface back.
    fn give_back(self, error: io::Error) -> SpawnFailed {
        let Job {
            mut iface,
            poll,
            fds,
            ..
        } = self;
        unwatch(&mut iface, &poll, &fds);
        SpawnFailed {
            error,
            iface: Box::new(iface),
        }
    }
}

/// A poller thread started ahead of its interface, waiting for it. The restart
/// supervisor keeps one so that a restart hands the new interface to a running thread
/// instead of creating one on its way to recovery (1.6-1.9 ms a restart in the lab's
/// guests, and 15-20 ms in one that comes soon after a TCP session starts:
/// docs/PERFORMANCE.md). Dropped unused, it ends.
pub struct PollerThread {
    give: Sender<Job>,
    thread: JoinHandle<()>,
}

impl PollerThread {
    /// Start a poller thread for interface `name`; with `nice`, it sets its nice level to
    /// it first thing (see [`Poller::try_spawn`]).
    pub fn start(name: &str, nice: Option<i32>) -> io::Result<PollerThread> {
        let (give, take) = crossbeam_channel::bounded::<Job>(1);
        let iface_name = name.to_string();
        let thread = std::thread::Builder::new()
            .name(format!("poll-{name}"))
            .spawn(move || {
                if let Some(level) = nice {
                    super::set_own_nice(&iface_name, "poller", level);
                }
                // No job: the thread was not needed (the daemon is ending).
                let Ok(job) = take.recv() else { return };
                let Job {
                    name,
                    iface,
                    tap,
                    poll,
                    fds,
                    request,
                    exits,
                } = job;
                let caught = panic::catch_unwind(AssertUnwindSafe(|| {
                    run(name.clone(), iface, tap.as_ref(), poll, fds, &request)
                }));
                let exit = caught.unwrap_or_else(|payload| {
                    let message = panic_message(payload.as_ref());
                    tracing::error!(iface = %name, %message, "the poller thread panicked: the interface is lost, the supervisor rebuilds it");
                    Exit::Panicked {
                        name,
                        message,
                        at: Instant::now(),
                    }
                });
                // The receiver may be gone when the daemon is exiting; nothing to do then.
                let _ = exits.send(exit);
            })?;
        Ok(PollerThread { give, thread })
    }

    /// Whether the thread still waits for its job (it always does, unless it panicked).
    fn waiting(&self) -> bool {
        !self.thread.is_finished()
    }

    /// Let the thread end without a job and wait for it. False if it panicked.
    pub fn end(self) -> bool {
        drop(self.give);
        self.thread.join().is_ok()
    }
}

/// Put the endpoint's descriptors ([`Endpoint::watch`]) in `poll`: the completion
/// channel's under [`CQ`], the async events' under [`ASYNC`]. Nothing stays half
/// registered on failure.
fn watch(iface: &mut Interface, poll: &Poll) -> io::Result<WaitFds> {
    let fds = iface.endpoint_mut().watch()?;
    let tokens = fds.cq.iter().map(|fd| (fd, CQ));
    let tokens = tokens.chain(fds.events.iter().map(|fd| (fd, ASYNC)));
    let mut added = Vec::with_capacity(fds.cq.len() + fds.events.len());
    for (fd, token) in tokens {
        if let Err(e) = poll
            .registry()
            .register(&mut SourceFd(fd), token, Interest::READABLE)
        {
            for fd in added {
                let _ = poll.registry().deregister(&mut SourceFd(fd));
            }
            iface.endpoint_mut().unwatch();
            return Err(e);
        }
        added.push(fd);
    }
    Ok(fds)
}

/// Undo [`watch`]: the descriptors out of `poll`, then [`Endpoint::unwatch`].
fn unwatch(iface: &mut Interface, poll: &Poll, fds: &WaitFds) {
    for fd in fds.cq.iter().chain(&fds.events) {
        if let Err(e) = poll.registry().deregister(&mut SourceFd(fd)) {
            tracing::debug!(error = %e, fd, "deregistering an endpoint descriptor failed");
        }
    }
    iface.endpoint_mut().unwatch();
}

fn run(
    name: String,
    mut iface: Interface,
    tap: &dyn TapDevice,
    mut poll: Poll,
    fds: WaitFds,
    request: &AtomicU8,
) -> Exit {
    let mut napi = Napi::new(iface.budget()).with_busy_poll(iface.busy_poll());
    let mut gate = TxGate::new();
    let mut events = Events::with_capacity(64);
    let mut next_hk = Instant::now() + HOUSEKEEPING_INTERVAL;
    let mut published = Published::default();
    if iface.poller_batch()
        && let Err(e) = process::set_thread_batch()
    {
        tracing::warn!(iface = %name, error = %e, "poller-batch: putting the poller under SCHED_BATCH failed: it runs at the daemon's policy");
    }
    let mut boost = Boost::new(&name, iface.rx_boost_nice());
    iface.announce_once(Instant::now());
    let result: Result<(), Failure> = (|| {
        // A restart posted a first chunk of the receive ring before its announcement
        // (see `RESTART_FIRST_FILL`); the rest goes now, before the first wait.
        iface.fill_recv().map_err(Failure::Verbs)?;
        loop {
            let now = Instant::now();
            // The `retry` policy: a failed poll (in the last turn's polls, TX reaping or
            // housekeeping) is polled again at once, not after the next event.
            if iface.take_poll_retry() {
                napi.retry();
            }
            let busy = napi.poll_due() || (gate.pending() && iface.free_send_slots() > 0);
            let timeout = if busy {
                Duration::ZERO
            } else {
                next_hk.saturating_duration_since(now)
            };
            match poll.poll(&mut events, Some(timeout)) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(Failure::Io(e)),
            }
            for ev in events.iter() {
                match ev.token() {
                    TAP => gate.on_readable(),
                    CQ => {
                        let (r, s) = iface
                            .endpoint_mut()
                            .take_cq_events()
                            .map_err(Failure::Verbs)?;
                        iface.on_cq_events(r, s);
                        napi.on_events(r + s);
                    }
                    ASYNC => {
                        while let Some(ev) = iface
                            .endpoint_mut()
                            .next_async_event()
                            .map_err(Failure::Verbs)?
                        {
                            match ev {
                                AsyncEvent::DeviceFatal
                                | AsyncEvent::CqError
                                | AsyncEvent::QpFatal
                                | AsyncEvent::DeviceRemoved => {
                                    return Err(Failure::AsyncFatal(ev));
                                }
                                AsyncEvent::PortDown => {
                                    tracing::warn!(iface = %name, "port down: carrier off until it is active again");
                                    if let Err(e) = tap.set_carrier(false) {
                                        tracing::warn!(error = %e, "setting the TAP carrier failed");
                                    }
                                    stats::add(&iface.stats().port_down_events, 1);
                                }
                                AsyncEvent::PortUp => {
                                    tracing::info!(iface = %name, "port active: carrier on");
                                    if let Err(e) = tap.set_carrier(true) {
                                        tracing::warn!(error = %e, "setting the TAP carrier failed");
                                    }
                                    iface.announce(Instant::now());
                                }
                                AsyncEvent::NotLive(n) => {
                                    stats::add(&iface.stats().async_not_live, 1);
                                    tracing::info!(iface = %name, event = n, "async event for a retired or spare QP or CQ: not the live epoch's, ignored");
                                }
                                AsyncEvent::GidChange => {
                                    gid_check(&name, iface.endpoint_mut())?;
                                }
                                AsyncEvent::Other(n) => {
                                    tracing::debug!(iface = %name, event = n, "async event")
                                }
                            }
                        }
                    }
                    _ => {}
                }
            }
            match request.load(Ordering::SeqCst) {
                STOP => return Ok(()),
                RESTART => return Err(Failure::Operator),
                _ => {}
            }
            let now = Instant::now();
            // A raised level whose hold is over comes down before anything is delivered.
            if let Some(b) = &mut boost {
                let change = b.rule.expire(now);
                Boost::apply(&mut boost, change, &name, &iface);
            }
            if napi.poll_due() {
                let rx = iface.poll_rx(tap, now)?;
                Boost::polled(&mut boost, rx, now, &name, &iface);
                let tx = iface.poll_tx(now)?;
                match napi.polled(rx, tx, now) {
                    Action::ArmAndRecheck => {
                        // Frames just written to the TAP may have woken a local
                        // application whose answer (on one CPU: already written, the
                        // application ran when our write returned) waits in the TAP now:
                        // it is read and posted before the arm and the wait, which then
                        // happen while the peer works, not on the answer's way out.
                        if rx > 0 && iface.free_send_slots() > 0 {
                            gate.on_readable();
                            if iface.tx_from_tap(tap, &mut gate, now)? > 0 {
                                napi.on_tx_work(now);
                            }
                        }
                        // Both CQs (never one the `skip` policy left after a failed poll).
                        // Leaving the send CQ unarmed unless frames wait for a slot saved
                        // a wake-up per packet sent, but in the lab's slow-poll scenario
                        // the unfaulted side's sends then stopped completing (send-stall
                        // restarts, no ping after it): not kept until that is understood.
                        iface.arm_cqs()?;
                        let rx = iface.poll_rx(tap, now)?;
                        Boost::polled(&mut boost, rx, now, &name, &iface);
                        let tx = iface.poll_tx(now)?;
                        napi.polled(rx, tx, now);
                    }
                    // Busy polling and nothing found: let the thread that the last
                    // delivery woke run first (one CPU may be all there is).
                    Action::BusyPoll if rx + tx == 0 => std::thread::yield_now(),
                    _ => {}
                }
            }
            // TX's turn. When the ring runs low, reap send completions first.
            if gate.pending() && iface.free_send_slots() < iface.budget().min(32) {
                iface.poll_tx(now)?;
            }
            if iface.tx_from_tap(tap, &mut gate, now)? > 0 {
                napi.on_tx_work(now);
            }
            if now >= next_hk {
                iface.housekeeping(now)?;
                next_hk = now + HOUSEKEEPING_INTERVAL;
            }
            published.publish(&iface, &napi, &gate);
        }
    })();
    // The failure's moment: the restart's time runs from here, the poller's own exit
    // (the last publish, the deregistrations, the hand-over) included.
    let ended = Instant::now();
    published.publish(&iface, &napi, &gate);
    unwatch(&mut iface, &poll, &fds);
    let fd = tap.raw_fd();
    let _ = poll.registry().deregister(&mut SourceFd(&fd));
    drop(poll);
    match result {
        Ok(()) => Exit::Stopped {
            name,
            iface: Box::new(iface),
        },
        Err(cause) => {
            // The supervisor says why it restarts (a warning with the cause): the line
            // here is for debugging, and no write is on the restart's way.
            tracing::debug!(iface = %name, %cause, "poller stopped: handing the interface to the supervisor");
            Exit::Failed {
                name,
                iface: Box::new(iface),
                cause,
                at: ended,
            }
        }
    }
}

/// After a GID table change: a restart if our GID (or its index) is not what the endpoint
/// would choose now, else nothing.
fn gid_check(name: &str, ep: &mut dyn Endpoint) -> Result<(), Failure> {
    let was = (ep.attrs().gid, ep.attrs().gid_index);
    let now = ep.gid_now().map_err(Failure::Verbs)?;
    if now == Some(was) {
        tracing::info!(iface = %name, gid = %was.0, "GID table changed; our GID did not");
        return Ok(());
    }
    let show = |g: Option<(crate::verbs::Gid, u8)>| match g {
        Some((gid, index)) => format!("{gid} at index {index}"),
        None => "none".to_string(),
    };
    Err(Failure::GidChanged {
        was: show(Some(was)),
        now: show(now),
    })
}

/// The poller's side of `rx-boost-nice` ([`crate::iface::boost`]): the decision and the
/// two levels it moves the thread between.
struct Boost {
    rule: RxBoost,
    raised: i32,
    own: i32,
}

impl Boost {
    /// `None` when there is nothing to do: no level asked for, or one not below the
    /// thread's own (read here: the thread set it first thing, see [`PollerThread`]).
    fn new(name: &str, level: Option<i32>) -> Option<Boost> {
        let raised = level?;
        let own = match process::thread_nice() {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(iface = %name, error = %e, "rx-boost-nice: reading the poller's nice level failed: no boost");
                return None;
            }
        };
        if raised >= own {
            tracing::debug!(iface = %name, nice = raised, own, "rx-boost-nice is not below the poller's own level: no boost");
            return None;
        }
        Some(Boost {
            rule: RxBoost::new(RX_BOOST_HOLD),
            raised,
            own,
        })
    }

    /// A poll delivered `rx` received frames.
    fn polled(boost: &mut Option<Boost>, rx: usize, now: Instant, name: &str, iface: &Interface) {
        if let Some(b) = boost {
            let change = b.rule.polled(rx, now);
            Boost::apply(boost, change, name, iface);
        }
    }

    /// Set the thread's level as `change` says. A refused change ends the boosting (a
    /// raise is refused without CAP_SYS_NICE or a RLIMIT_NICE that allows it).
    fn apply(boost: &mut Option<Boost>, change: Option<Change>, name: &str, iface: &Interface) {
        let (Some(b), Some(change)) = (boost.as_ref(), change) else {
            return;
        };
        let level = match change {
            Change::Raise => b.raised,
            Change::Lower => b.own,
        };
        match process::set_thread_nice(level) {
            Ok(()) if change == Change::Raise => stats::add(&iface.stats().rx_boosts, 1),
            Ok(()) => {}
            Err(e) => {
                tracing::warn!(iface = %name, error = %e, nice = level, ?change, "rx-boost-nice: setting the poller's nice level failed (raising it needs CAP_SYS_NICE or a RLIMIT_NICE that allows it): no boost from now on");
                *boost = None;
            }
        }
    }
}

/// What this poller has already added to the interface's counters (which outlive
/// pollers across restarts): each publish adds only what is new.
#[derive(Default)]
struct Published {
    napi: crate::iface::napi::NapiCounters,
    backpressure: u64,
}

impl Published {
    fn publish(&mut self, iface: &Interface, napi: &Napi, gate: &TxGate) {
        let c = napi.counters();
        let p = self.napi;
        let s = iface.stats();
        stats::add(&s.polls, c.polls - p.polls);
        stats::add(&s.budget_exhausted, c.budget_exhausted - p.budget_exhausted);
        stats::add(&s.rearms, c.rearms - p.rearms);
        stats::add(
            &s.caught_after_rearm,
            c.caught_after_rearm - p.caught_after_rearm,
        );
        stats::add(&s.cq_events, c.events - p.events);
        stats::add(&s.busy_polls, c.busy_polls - p.busy_polls);
        stats::add(&s.spurious_events, c.spurious_events - p.spurious_events);
        stats::add(&s.tx_backpressure, gate.backpressure() - self.backpressure);
        self.napi = c;
        self.backpressure = gate.backpressure();
    }
}
