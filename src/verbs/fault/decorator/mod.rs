//! A fault-injecting decorator around any [`Provider`]: inert unless a fault is armed.
//!
//! Wrap a provider with [`FaultyProvider::new`]; every endpoint it opens shares the
//! provider's [`FaultSwitch`]. A fault is armed with [`FaultSwitch::arm`] from a
//! [`FaultSpec`] (a fault, a trigger, how often); each kind watches one kind of
//! operation and its [`Schedule`] decides which operations it hits:
//! - `poll-error` (each `poll_cq`): the poll returns [`VerbsError::PollFailed`] with the
//!   armed return value, like a negative `ibv_poll_cq`;
//! - `lost-completion` (each completion polled on the selected CQ): the completion is
//!   swallowed, so its work request never completes; only a teardown's reap accounts for
//!   it;
//! - `qp-error` (each `poll_cq`): the inner QP is moved to the error state with
//!   `set_qp_error` (flush completions follow), optionally with a `QP_FATAL` event;
//! - `post-send-error`, `post-recv-error` (each work request posted): posting fails with
//!   the errno; in a send chain the requests before the hit one are posted;
//! - `async-fatal` (each `poll_cq`, or at once on command): an asynchronous event is
//!   delivered through the endpoint's async source;
//! - `spurious-event` (each `poll_cq`, or at once on command): the completion channel
//!   becomes readable and `take_cq_events` reports an event with nothing behind it;
//! - `slow-poll` (each `poll_cq`): the poll sleeps first;
//! - `corrupt-rx` (each successful receive completion): bytes of the packet are flipped
//!   in a copy that [`Endpoint::recv_buf`] returns for that slot until the next receive
//!   poll or the slot is re-posted;
//! - `stall-send` (each `poll_cq` on the send CQ): the endpoint stops returning send
//!   completions (they stay in the device's CQ) until cleared or destroyed.
//!
//! Besides: `hide_device` makes `open` fail with [`VerbsError::NoDevice`], as after a
//! device removal; for the supervisor's tests, `panic_next_poll` makes the next `poll_cq`
//! panic (a bug in the poller thread), `hang_polls` makes `poll_cq` block until cleared
//! (a hung poller), and `fail_registers` makes the next [`Endpoint::watch`] calls,
//! which a poller makes to fill its poll set, fail (a poller that cannot start). Every hit is recorded ([`FaultSwitch::injections`]), in order, so a
//! seeded run can be compared with another.
//!
//! Cost when nothing is armed: one relaxed atomic load per verb call on the datapath
//! (plus a check of the endpoint's own fields). Armed, a hook takes the switch's mutex.
//! The switch also counts `poll_cq` calls made after a failed poll was returned, which is
//! how tests prove the poller never retries.
//!
//! Here the switch (what is armed, what fired) and the provider; the endpoint that
//! applies the faults to each verb is in `endpoint`.

mod endpoint;
#[cfg(all(test, feature = "sim"))]
mod tests;

use std::collections::VecDeque;
use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{Fault, FaultKind, FaultSpec, Schedule, SplitMix64, Trigger};
use crate::verbs::{AsyncEvent, Provider};
#[cfg(doc)]
use crate::verbs::{Endpoint, VerbsError};

/// Injections kept for [`FaultSwitch::injections`] (older ones are forgotten; the total
/// keeps counting).
pub const LOG_LEN: usize = 65_536;

/// Most events one on-command `async-fatal` or `spurious-event` delivers at once.
pub const MAX_IMMEDIATE: u64 = 1024;

const fn bit(k: FaultKind) -> u32 {
    1 << k as u32
}

/// Mask bit: some live endpoint has stalled sends.
const STALLED: u32 = 1 << 31;

/// Mask bit: `panic_next_poll` or `hang_polls` is set.
const KNOBS: u32 = 1 << 30;

/// Mask bit: the next `post_send` posts its chain and then reports a `bad_wr` outside it
/// ([`FaultSwitch::bad_wr_once`]).
const BAD_WR: u32 = 1 << 29;

/// Bits that make `poll_cq` take the slow path.
const POLL_HOOKS: u32 = bit(FaultKind::PollError)
    | bit(FaultKind::LostCompletion)
    | bit(FaultKind::QpError)
    | bit(FaultKind::AsyncFatal)
    | bit(FaultKind::SpuriousEvent)
    | bit(FaultKind::SlowPoll)
    | bit(FaultKind::CorruptRx)
    | bit(FaultKind::StallSend)
    | STALLED;

/// One hit of a fault, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Injection {
    /// 1 for the first hit since the switch was made.
    pub seq: u64,
    /// The fault.
    pub kind: FaultKind,
    /// The endpoint hit (numbered from 0 in opening order); `None` when delivered to
    /// whichever endpoint takes it (an on-command asynchronous event).
    pub endpoint: Option<u64>,
    /// The number of the operation hit, counted by the fault's schedule from its arming
    /// (0 for an on-command delivery).
    pub op: u64,
    /// When (ms since the Unix epoch).
    pub unix_ms: u64,
}

/// An armed fault.
struct Armed {
    spec: FaultSpec,
    schedule: Schedule,
    /// Chooses the bytes a corruption flips.
    noise: SplitMix64,
    /// When it first hit (its `for_ms` window runs from then).
    first_hit: Option<Instant>,
    /// The endpoint it first hit (with `until_restart`, the only one it hits).
    bound: Option<u64>,
}

/// What a hit hands the hook.
#[derive(Clone, Copy)]
struct Hit {
    fault: Fault,
    noise: u64,
}

#[derive(Default)]
struct State {
    armed: [Option<Armed>; FaultKind::ALL.len()],
    fired: [u64; FaultKind::ALL.len()],
    log: VecDeque<Injection>,
    seq: u64,
    /// Per kind: when the fault armed last hit first (ms since the Unix epoch), kept
    /// after it is spent (the log may have moved past it).
    first_hit_ms: [Option<u64>; FaultKind::ALL.len()],
    /// Live endpoints with stalled sends.
    stalled: u32,
}

/// Per-endpoint state the switch reaches from other threads.
struct EpShared {
    id: u64,
    /// Spurious completion events delivered and not yet taken.
    spurious: AtomicU32,
    /// Sends stalled (`stall-send` hit this endpoint).
    stalled: AtomicBool,
    /// Write ends of the endpoint's fault sources: completion channel, async events.
    cq_waker: Mutex<Option<UnixStream>>,
    async_waker: Mutex<Option<UnixStream>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn poke(w: &Mutex<Option<UnixStream>>) {
    if let Some(s) = lock(w).as_ref() {
        // Full: the reader has bytes pending already and will wake anyway.
        let _ = (&*s).write(&[1]);
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// The shared fault switches and their counters.
#[derive(Default)]
pub struct FaultSwitch {
    /// Bit per armed kind, plus [`STALLED`]. Changed only with `state` locked.
    mask: AtomicU32,
    state: Mutex<State>,
    polls_failed: AtomicU64,
    polls_after_failure: AtomicU64,
    completions_swallowed: AtomicU64,
    hidden: AtomicBool,
    opens: AtomicU64,
    endpoint_restarts: AtomicU64,
    endpoint_restarts_destroying: AtomicU64,
    refuse_qp_error: AtomicBool,
    async_events: Mutex<VecDeque<AsyncEvent>>,
    endpoints: Mutex<Vec<Arc<EpShared>>>,
    next_id: AtomicU64,
    panic_poll: AtomicBool,
    hang_polls: AtomicBool,
    fail_registers: AtomicU64,
}

impl std::fmt::Debug for FaultSwitch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultSwitch")
            .field("armed", &self.armed())
            .field("injected", &self.injected())
            .finish()
    }
}

impl State {
    /// One operation watched by `kind` on endpoint `ep`: `Some` if the fault hits it.
    fn check(&mut self, mask: &AtomicU32, kind: FaultKind, ep: u64, now: Instant) -> Option<Hit> {
        let slot = &mut self.armed[kind.index()];
        let a = slot.as_mut()?;
        let over = a.bound.is_some_and(|b| b != ep)
            || a.spec
                .window
                .zip(a.first_hit)
                .is_some_and(|(w, t0)| now.saturating_duration_since(t0) >= w);
        if over {
            // Its window has passed, or the endpoint it was bound to is gone (restarted
            // or closed): spent.
            *slot = None;
            mask.fetch_and(!bit(kind), Ordering::Relaxed);
            return None;
        }
        let hit = a.schedule.on_op(now);
        if hit {
            a.first_hit.get_or_insert(now);
            if a.spec.until_restart {
                a.bound.get_or_insert(ep);
            }
        }
        let out = hit.then(|| Hit {
            fault: a.spec.fault,
            noise: a.noise.next_u64(),
        });
        let op = a.schedule.ops();
        if a.schedule.spent() {
            *slot = None;
            mask.fetch_and(!bit(kind), Ordering::Relaxed);
        }
        if out.is_some() {
            self.record(kind, Some(ep), op);
        }
        out
    }

    fn record(&mut self, kind: FaultKind, endpoint: Option<u64>, op: u64) {
        self.seq += 1;
        self.fired[kind.index()] += 1;
        let now_ms = unix_ms();
        self.first_hit_ms[kind.index()].get_or_insert(now_ms);
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(Injection {
            seq: self.seq,
            kind,
            endpoint,
            op,
            unix_ms: now_ms,
        });
    }
}

impl FaultSwitch {
    /// Arm `spec`, replacing an armed fault of the same kind. An `async-fatal` or
    /// `spurious-event` on command (trigger `Now`) is delivered at once instead (as many
    /// as its limit, at most [`MAX_IMMEDIATE`]): the event is queued for whichever
    /// endpoint takes it, the spurious event goes to every endpoint open now (none when
    /// the interface is between epochs). Everything else waits for the operations its
    /// kind watches.
    pub fn arm(&self, spec: FaultSpec) {
        let kind = spec.kind();
        lock(&self.state).first_hit_ms[kind.index()] = None;
        if spec.trigger == Trigger::Now {
            let n = spec.limit.unwrap_or(1).min(MAX_IMMEDIATE);
            match spec.fault {
                Fault::AsyncFatal { event } => {
                    for _ in 0..n {
                        lock(&self.state).record(kind, None, 0);
                        self.inject_async(event);
                    }
                    return;
                }
                Fault::SpuriousEvent => {
                    let eps = lock(&self.endpoints).clone();
                    for _ in 0..n {
                        for ep in &eps {
                            lock(&self.state).record(kind, Some(ep.id), 0);
                            self.spurious_to(ep);
                        }
                    }
                    return;
                }
                _ => {}
            }
        }
        let mut st = lock(&self.state);
        // The noise seed follows the trigger's seed, so a seeded run corrupts the same
        // bytes every time.
        let noise_seed = match spec.trigger {
            Trigger::Random { seed, .. } => seed ^ 0x5EED_F00D,
            _ => 0x5EED_F00D,
        };
        st.armed[kind.index()] = Some(Armed {
            spec,
            schedule: Schedule::new(spec.trigger, spec.limit, Instant::now()),
            noise: SplitMix64::new(noise_seed),
            first_hit: None,
            bound: None,
        });
        self.mask.fetch_or(bit(kind), Ordering::Relaxed);
    }

    /// Make every `poll_cq` fail with `ret` (a negative value) until cleared.
    pub fn arm_poll_error(&self, ret: i32) {
        self.arm(FaultSpec::new(Fault::poll_error(ret.min(-1))).unlimited());
    }

    /// Make the next `n` `poll_cq` calls fail with `ret` (`u64::MAX`: until cleared).
    pub fn arm_poll_error_n(&self, ret: i32, n: u64) {
        let spec = FaultSpec::new(Fault::poll_error(ret.min(-1)));
        self.arm(if n == u64::MAX {
            spec.unlimited()
        } else {
            spec.limit(n.max(1))
        });
    }

    /// Disarm every fault: stalled sends flow again, pending async events are dropped, a
    /// hidden device is shown. What has been injected stays recorded.
    pub fn clear(&self) {
        {
            let mut st = lock(&self.state);
            st.armed = Default::default();
            st.stalled = 0;
            for ep in lock(&self.endpoints).iter() {
                ep.stalled.store(false, Ordering::Relaxed);
            }
            self.mask.store(0, Ordering::Relaxed);
        }
        self.hidden.store(false, Ordering::SeqCst);
        self.panic_poll.store(false, Ordering::SeqCst);
        self.hang_polls.store(false, Ordering::SeqCst);
        self.fail_registers.store(0, Ordering::SeqCst);
        lock(&self.async_events).clear();
    }

    /// Disarm faults of one kind (a stall it caused stays until [`FaultSwitch::clear`]
    /// or the endpoint's end).
    pub fn disarm(&self, kind: FaultKind) {
        let mut st = lock(&self.state);
        st.armed[kind.index()] = None;
        self.mask.fetch_and(!bit(kind), Ordering::Relaxed);
    }

    /// Deliver `ev` through the async source of the (watched) endpoints.
    pub fn inject_async(&self, ev: AsyncEvent) {
        lock(&self.async_events).push_back(ev);
        for ep in lock(&self.endpoints).iter() {
            poke(&ep.async_waker);
        }
    }

    fn spurious_to(&self, ep: &EpShared) {
        // Count first, then wake: whoever is woken finds the count.
        ep.spurious.fetch_add(1, Ordering::SeqCst);
        poke(&ep.cq_waker);
    }

    /// Make the next `poll_cq` (of any endpoint) panic.
    pub fn panic_next_poll(&self) {
        self.panic_poll.store(true, Ordering::SeqCst);
        self.mask.fetch_or(KNOBS, Ordering::SeqCst);
    }

    /// Make every `poll_cq` block (`true`) until called with `false`.
    pub fn hang_polls(&self, hang: bool) {
        self.hang_polls.store(hang, Ordering::SeqCst);
        if hang {
            self.mask.fetch_or(KNOBS, Ordering::SeqCst);
        }
    }

    /// `poll_cq` with [`KNOBS`] set: panic or hang as asked.
    fn poll_knobs(&self) {
        if self.panic_poll.swap(false, Ordering::SeqCst) {
            panic!("injected panic in poll_cq");
        }
        while self.hang_polls.load(Ordering::SeqCst) {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }

    /// Make the next `n` [`Endpoint::watch`] calls fail: the poller cannot put the
    /// endpoint in its poll set, so it cannot start.
    pub fn fail_registers(&self, n: u64) {
        self.fail_registers.store(n, Ordering::SeqCst);
    }

    /// Make `open` fail with `NoDevice` (`true`) or work again (`false`).
    pub fn hide_device(&self, hidden: bool) {
        self.hidden.store(hidden, Ordering::SeqCst);
    }

    /// Successful opens through this switch's provider.
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::SeqCst)
    }

    /// Successful [`Endpoint::restart`]s of endpoints opened through this switch's provider
    /// (a new QP and CQs on a kept device context and memory).
    pub fn endpoint_restarts(&self) -> u64 {
        self.endpoint_restarts.load(Ordering::SeqCst)
    }

    /// Of [`FaultSwitch::endpoint_restarts`], those that destroyed the old QP at once
    /// ([`Endpoint::restart_destroying_old`]) instead of keeping it for its grace.
    pub fn endpoint_restarts_destroying(&self) -> u64 {
        self.endpoint_restarts_destroying.load(Ordering::SeqCst)
    }

    /// Make the next `post_send` post its chain and then fail naming a `bad_wr` outside
    /// it ([`VerbsError::BadWrOutsideChain`]): a test's way to reach the restart for a
    /// post whose outcome is unknown.
    pub fn bad_wr_once(&self) {
        let _st = lock(&self.state);
        self.mask.fetch_or(BAD_WR, Ordering::SeqCst);
    }

    /// Make moving a QP to the error state fail (`true`) or work again (`false`): a
    /// test's way to reach the teardown that cannot trust the QP to have stopped.
    pub fn refuse_qp_error(&self, refuse: bool) {
        self.refuse_qp_error.store(refuse, Ordering::SeqCst);
    }

    /// Polls that were made to fail.
    pub fn polls_failed(&self) -> u64 {
        self.polls_failed.load(Ordering::SeqCst)
    }

    /// Completions taken from a CQ by failing polls (`poll-error` with `lose`) and never
    /// returned: the work requests they completed will never complete.
    pub fn completions_swallowed(&self) -> u64 {
        self.completions_swallowed.load(Ordering::SeqCst)
    }

    /// `poll_cq` calls on an endpoint after it returned a failed poll.
    pub fn polls_after_failure(&self) -> u64 {
        self.polls_after_failure.load(Ordering::SeqCst)
    }

    /// The faults armed now.
    pub fn armed(&self) -> Vec<FaultSpec> {
        lock(&self.state)
            .armed
            .iter()
            .flatten()
            .map(|a| a.spec)
            .collect()
    }

    /// Hits so far, all kinds.
    pub fn injected(&self) -> u64 {
        lock(&self.state).seq
    }

    /// Hits so far of one kind.
    pub fn fired(&self, kind: FaultKind) -> u64 {
        lock(&self.state).fired[kind.index()]
    }

    /// When the fault of `kind` armed last first hit (ms since the Unix epoch), even
    /// after it is spent and the log has moved on; `None` before its first hit.
    pub fn first_hit_unix_ms(&self, kind: FaultKind) -> Option<u64> {
        lock(&self.state).first_hit_ms[kind.index()]
    }

    /// The recorded hits, oldest first (the last [`LOG_LEN`]).
    pub fn injections(&self) -> Vec<Injection> {
        lock(&self.state).log.iter().cloned().collect()
    }

    /// The last `n` recorded hits, oldest first.
    pub fn recent_injections(&self, n: usize) -> Vec<Injection> {
        let st = lock(&self.state);
        st.log
            .iter()
            .skip(st.log.len().saturating_sub(n))
            .cloned()
            .collect()
    }

    /// Whether any endpoint has its sends stalled.
    pub fn stalled(&self) -> bool {
        lock(&self.state).stalled > 0
    }

    fn stall(&self, ep: &EpShared) {
        let mut st = lock(&self.state);
        if !ep.stalled.swap(true, Ordering::Relaxed) {
            st.stalled += 1;
            self.mask.fetch_or(STALLED, Ordering::Relaxed);
        }
    }

    fn unstall(&self, ep: &EpShared) {
        let mut st = lock(&self.state);
        if ep.stalled.swap(false, Ordering::Relaxed) {
            st.stalled = st.stalled.saturating_sub(1);
            if st.stalled == 0 {
                self.mask.fetch_and(!STALLED, Ordering::Relaxed);
            }
        }
    }
}

/// A provider whose endpoints obey a [`FaultSwitch`].
pub struct FaultyProvider {
    inner: Arc<dyn Provider>,
    switch: Arc<FaultSwitch>,
}

impl FaultyProvider {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        FaultyProvider {
            inner,
            switch: Arc::new(FaultSwitch::default()),
        }
    }

    /// The switch shared by every endpoint this provider opens.
    pub fn switch(&self) -> Arc<FaultSwitch> {
        self.switch.clone()
    }
}
