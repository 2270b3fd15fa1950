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
//! cannot touch the interface again: it no longer owns it.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicU8, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token, Waker};

use crate::datapath::{Failure, Interface};
use crate::napi::{Action, Napi, TxGate};
use crate::stats;
use crate::tap::TapDevice;
use crate::verbs::{AsyncEvent, CqKind};

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
        mut iface: Interface,
        tap: Arc<dyn TapDevice>,
        exits: Sender<Exit>,
    ) -> io::Result<Poller> {
        let poll = Poll::new()?;
        let waker = Arc::new(Waker::new(poll.registry(), WAKE)?);
        let fd = tap.raw_fd();
        poll.registry()
            .register(&mut SourceFd(&fd), TAP, Interest::READABLE)?;
        iface.endpoint_mut().register(poll.registry(), CQ, ASYNC)?;
        let request = Arc::new(AtomicU8::new(RUN));
        let request2 = request.clone();
        let thread = std::thread::Builder::new()
            .name(format!("poll-{name}"))
            .spawn(move || {
                let exit = run(name, iface, tap.as_ref(), poll, &request2);
                // The receiver may be gone when the daemon is exiting; nothing to do then.
                let _ = exits.send(exit);
            })?;
        Ok(Poller {
            waker,
            request,
            thread: Some(thread),
        })
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

fn run(
    name: String,
    mut iface: Interface,
    tap: &dyn TapDevice,
    mut poll: Poll,
    request: &AtomicU8,
) -> Exit {
    let mut napi = Napi::new(iface.budget());
    let mut gate = TxGate::new();
    let mut events = Events::with_capacity(64);
    let mut next_hk = Instant::now() + HOUSEKEEPING_INTERVAL;
    let mut published = Published::default();
    iface.announce(Instant::now());
    let result: Result<(), Failure> = (|| {
        loop {
            let now = Instant::now();
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
            if napi.poll_due() {
                let rx = iface.poll_rx(tap, now)?;
                let tx = iface.poll_tx(now)?;
                if napi.polled(rx, tx) == Action::ArmAndRecheck {
                    let ep = iface.endpoint_mut();
                    ep.req_notify(CqKind::Recv).map_err(Failure::Verbs)?;
                    ep.req_notify(CqKind::Send).map_err(Failure::Verbs)?;
                    let rx = iface.poll_rx(tap, now)?;
                    let tx = iface.poll_tx(now)?;
                    napi.polled(rx, tx);
                }
            }
            // TX's turn. When the ring runs low, reap send completions first.
            if gate.pending() && iface.free_send_slots() < iface.budget().min(32) {
                iface.poll_tx(now)?;
            }
            iface.tx_from_tap(tap, &mut gate, now)?;
            if now >= next_hk {
                iface.housekeeping(now)?;
                next_hk = now + HOUSEKEEPING_INTERVAL;
            }
            published.publish(&iface, &napi, &gate);
        }
    })();
    published.publish(&iface, &napi, &gate);
    if let Err(e) = iface.endpoint_mut().deregister(poll.registry()) {
        tracing::debug!(error = %e, "deregistering the endpoint failed");
    }
    let fd = tap.raw_fd();
    let _ = poll.registry().deregister(&mut SourceFd(&fd));
    drop(poll);
    match result {
        Ok(()) => Exit::Stopped {
            name,
            iface: Box::new(iface),
        },
        Err(cause) => {
            if matches!(cause, Failure::Operator) {
                tracing::info!(iface = %name, "poller stopped for an operator restart");
            } else {
                tracing::error!(iface = %name, %cause, "poller stopped: handing the interface to the supervisor");
            }
            Exit::Failed {
                name,
                iface: Box::new(iface),
                cause,
                at: Instant::now(),
            }
        }
    }
}

/// What this poller has already added to the interface's counters (which outlive
/// pollers across restarts): each publish adds only what is new.
#[derive(Default)]
struct Published {
    napi: crate::napi::NapiCounters,
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
        stats::add(&s.spurious_events, c.spurious_events - p.spurious_events);
        stats::add(&s.tx_backpressure, gate.backpressure() - self.backpressure);
        self.napi = c;
        self.backpressure = gate.backpressure();
    }
}
