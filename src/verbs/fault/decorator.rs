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

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;

use super::{Fault, FaultKind, FaultSpec, Schedule, SplitMix64, Trigger};
use crate::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    PostRecvError, PostSendError, Provider, RecvWr, SendWr, VerbsError, WaitFds, WcStatus,
};

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
    hidden: AtomicBool,
    opens: AtomicU64,
    renewals: AtomicU64,
    renewals_destroying: AtomicU64,
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
        let hit = a.schedule.on_op(now);
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
        if self.log.len() == LOG_LEN {
            self.log.pop_front();
        }
        self.log.push_back(Injection {
            seq: self.seq,
            kind,
            endpoint,
            op,
            unix_ms: unix_ms(),
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
        });
        self.mask.fetch_or(bit(kind), Ordering::Relaxed);
    }

    /// Make every `poll_cq` fail with `ret` (a negative value) until cleared.
    pub fn arm_poll_error(&self, ret: i32) {
        self.arm(FaultSpec::new(Fault::PollError { ret: ret.min(-1) }).unlimited());
    }

    /// Make the next `n` `poll_cq` calls fail with `ret` (`u64::MAX`: until cleared).
    pub fn arm_poll_error_n(&self, ret: i32, n: u64) {
        let spec = FaultSpec::new(Fault::PollError { ret: ret.min(-1) });
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

    /// Successful [`Endpoint::renew`]s of endpoints opened through this switch's provider
    /// (a new QP and CQs on a kept device context and memory).
    pub fn renewals(&self) -> u64 {
        self.renewals.load(Ordering::SeqCst)
    }

    /// Of [`FaultSwitch::renewals`], those that destroyed the old QP at once
    /// ([`Endpoint::renew_destroying_old`]) instead of keeping it for its grace.
    pub fn renewals_destroying(&self) -> u64 {
        self.renewals_destroying.load(Ordering::SeqCst)
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

impl Provider for FaultyProvider {
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError> {
        if self.switch.hidden.load(Ordering::SeqCst) {
            return Err(VerbsError::NoDevice(cfg.device.clone()));
        }
        let inner = self.inner.open(cfg)?;
        self.switch.opens.fetch_add(1, Ordering::SeqCst);
        let shared = Arc::new(EpShared {
            id: self.switch.next_id.fetch_add(1, Ordering::SeqCst),
            spurious: AtomicU32::new(0),
            stalled: AtomicBool::new(false),
            cq_waker: Mutex::new(None),
            async_waker: Mutex::new(None),
        });
        lock(&self.switch.endpoints).push(shared.clone());
        Ok(Box::new(FaultyEndpoint {
            inner,
            switch: self.switch.clone(),
            shared,
            failed: false,
            lost: None,
            async_rx: None,
            cq_rx: None,
            recv_slots: HashMap::new(),
            corrupted: Vec::new(),
            spare: Vec::new(),
        }))
    }
}

struct FaultyEndpoint {
    inner: Box<dyn Endpoint>,
    switch: Arc<FaultSwitch>,
    shared: Arc<EpShared>,
    failed: bool,
    /// A device-loss event (`DeviceFatal`, `DeviceRemoved`) this endpoint delivered:
    /// `renew` refuses after it, as the real provider does.
    lost: Option<AsyncEvent>,
    async_rx: Option<UnixStream>,
    cq_rx: Option<UnixStream>,
    /// Receive work request id → slot, recorded while `corrupt-rx` is armed.
    recv_slots: HashMap<u64, u32>,
    /// Corrupted copies of receive slots, valid until the next receive poll.
    corrupted: Vec<(u32, Vec<u8>)>,
    /// Buffers of earlier corrupted copies, for reuse.
    spare: Vec<Vec<u8>>,
}

impl FaultyEndpoint {
    fn drop_wakers(&mut self) {
        *lock(&self.shared.cq_waker) = None;
        *lock(&self.shared.async_waker) = None;
    }

    fn id(&self) -> u64 {
        self.shared.id
    }

    /// The slow path of `poll_cq`: something is armed or stalled.
    fn poll_faulty(
        &mut self,
        cq: CqKind,
        out: &mut [Completion],
        mask: u32,
    ) -> Result<usize, VerbsError> {
        let now = Instant::now();
        let id = self.id();
        let sw = self.switch.clone();
        let mut hits: [Option<Hit>; 6] = [None; 6];
        {
            let mut st = lock(&sw.state);
            for (i, kind) in [
                FaultKind::SlowPoll,
                FaultKind::AsyncFatal,
                FaultKind::SpuriousEvent,
                FaultKind::QpError,
                FaultKind::PollError,
                FaultKind::StallSend,
            ]
            .into_iter()
            .enumerate()
            {
                if mask & bit(kind) == 0 || (kind == FaultKind::StallSend && cq != CqKind::Send) {
                    continue;
                }
                hits[i] = st.check(&sw.mask, kind, id, now);
            }
        }
        for hit in hits.into_iter().flatten() {
            match hit.fault {
                Fault::SlowPoll { delay } => std::thread::sleep(delay),
                Fault::AsyncFatal { event } => sw.inject_async(event),
                Fault::SpuriousEvent => sw.spurious_to(&self.shared),
                Fault::QpError { fatal_event } => {
                    if let Err(e) = self.inner.set_qp_error() {
                        tracing::warn!(error = %e, "fault qp-error: set_qp_error failed");
                    }
                    if fatal_event {
                        sw.inject_async(AsyncEvent::QpFatal);
                    }
                }
                Fault::PollError { ret } => {
                    self.failed = true;
                    sw.polls_failed.fetch_add(1, Ordering::SeqCst);
                    return Err(VerbsError::PollFailed { cq, ret });
                }
                Fault::StallSend => sw.stall(&self.shared),
                _ => {}
            }
        }
        if cq == CqKind::Send && self.shared.stalled.load(Ordering::Relaxed) {
            return Ok(0);
        }
        let mut n = self.inner.poll_cq(cq, out)?;
        let per_completion = mask & (bit(FaultKind::LostCompletion) | bit(FaultKind::CorruptRx));
        if n == 0 || per_completion == 0 {
            return Ok(n);
        }
        let mut st = lock(&sw.state);
        if mask & bit(FaultKind::LostCompletion) != 0 {
            let mut kept = 0;
            for i in 0..n {
                let c = out[i];
                let selected = match st.armed[FaultKind::LostCompletion.index()].as_ref() {
                    Some(a) => match a.spec.fault {
                        Fault::LostCompletion { cq: sel } => sel.matches(cq),
                        _ => false,
                    },
                    None => false,
                };
                let lost = selected
                    && st
                        .check(&sw.mask, FaultKind::LostCompletion, id, now)
                        .is_some();
                if lost {
                    self.recv_slots.remove(&c.wr_id);
                } else {
                    out[kept] = c;
                    kept += 1;
                }
            }
            n = kept;
        }
        if cq == CqKind::Recv && mask & bit(FaultKind::CorruptRx) != 0 {
            for c in &out[..n] {
                let Some(slot) = self.recv_slots.remove(&c.wr_id) else {
                    continue;
                };
                if c.status != WcStatus::Success {
                    continue;
                }
                let Some(Hit {
                    fault: Fault::CorruptRx { bytes },
                    noise,
                }) = st.check(&sw.mask, FaultKind::CorruptRx, id, now)
                else {
                    continue;
                };
                let src = self.inner.recv_buf(slot);
                let mut copy = self.spare.pop().unwrap_or_default();
                copy.clear();
                copy.extend_from_slice(src);
                flip(&mut copy, c.byte_len as usize, bytes, noise);
                self.corrupted.push((slot, copy));
            }
        }
        Ok(n)
    }
}

/// Flip `bytes` distinct bytes within the first `len` of `buf` (XOR with a nonzero value), at
/// positions drawn from `noise`.
fn flip(buf: &mut [u8], len: usize, bytes: u32, noise: u64) {
    let len = len.min(buf.len());
    if len == 0 {
        return;
    }
    let mut r = SplitMix64::new(noise);
    let want = (bytes as usize).min(len);
    let mut hit: Vec<usize> = Vec::with_capacity(want);
    while hit.len() < want {
        let at = r.below(len as u64) as usize;
        if hit.contains(&at) {
            continue;
        }
        hit.push(at);
        buf[at] ^= (r.below(255) + 1) as u8;
    }
}

impl Drop for FaultyEndpoint {
    fn drop(&mut self) {
        self.drop_wakers();
        self.switch.unstall(&self.shared);
        lock(&self.switch.endpoints).retain(|e| !Arc::ptr_eq(e, &self.shared));
    }
}

impl Endpoint for FaultyEndpoint {
    fn attrs(&self) -> &EndpointAttrs {
        self.inner.attrs()
    }
    fn recv_buf(&self, slot: u32) -> &[u8] {
        if !self.corrupted.is_empty()
            && let Some((_, b)) = self.corrupted.iter().find(|(s, _)| *s == slot)
        {
            return b;
        }
        self.inner.recv_buf(slot)
    }
    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        self.inner.send_buf(slot)
    }
    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        if !self.corrupted.is_empty()
            && let Some(i) = self.corrupted.iter().position(|(s, _)| *s == slot)
        {
            let (_, b) = self.corrupted.swap_remove(i);
            self.spare.push(b);
        }
        let mask = self.switch.mask.load(Ordering::Relaxed);
        if mask & (bit(FaultKind::PostRecvError) | bit(FaultKind::CorruptRx)) == 0 {
            return self.inner.post_recv(wr_id, slot);
        }
        if mask & bit(FaultKind::PostRecvError) != 0 {
            let hit = lock(&self.switch.state).check(
                &self.switch.mask,
                FaultKind::PostRecvError,
                self.shared.id,
                Instant::now(),
            );
            if let Some(Hit {
                fault: Fault::PostRecvError { errno },
                ..
            }) = hit
            {
                return Err(VerbsError::verb("ibv_post_recv", errno));
            }
        }
        if mask & bit(FaultKind::CorruptRx) != 0 {
            self.recv_slots.insert(wr_id, slot);
        }
        self.inner.post_recv(wr_id, slot)
    }
    fn post_recv_chain(&mut self, wrs: &[RecvWr]) -> Result<(), PostRecvError> {
        let mask = self.switch.mask.load(Ordering::Relaxed);
        if self.corrupted.is_empty()
            && mask & (bit(FaultKind::PostRecvError) | bit(FaultKind::CorruptRx)) == 0
        {
            return self.inner.post_recv_chain(wrs);
        }
        // Armed (or corrupted copies to retire): one by one through the hooks.
        for (posted, w) in wrs.iter().enumerate() {
            self.post_recv(w.wr_id, w.slot)
                .map_err(|error| PostRecvError { posted, error })?;
        }
        Ok(())
    }
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        let mask = self.switch.mask.load(Ordering::Relaxed);
        if mask & (bit(FaultKind::PostSendError) | BAD_WR) == 0 {
            return self.inner.post_send(wrs);
        }
        if mask & BAD_WR != 0 && self.switch.mask.fetch_and(!BAD_WR, Ordering::SeqCst) & BAD_WR != 0
        {
            // The provider posted the chain but names a bad work request outside it, so
            // the caller cannot know how much went.
            self.inner.post_send(wrs)?;
            return Err(PostSendError {
                posted: wrs.len(),
                error: VerbsError::BadWrOutsideChain {
                    verb: "ibv_post_send",
                    source: std::io::Error::from_raw_os_error(libc::EINVAL),
                },
            });
        }
        if mask & bit(FaultKind::PostSendError) == 0 {
            return self.inner.post_send(wrs);
        }
        let now = Instant::now();
        let hit = {
            let mut st = lock(&self.switch.state);
            wrs.iter().enumerate().find_map(|(i, _)| {
                match st.check(
                    &self.switch.mask,
                    FaultKind::PostSendError,
                    self.shared.id,
                    now,
                ) {
                    Some(Hit {
                        fault: Fault::PostSendError { errno },
                        ..
                    }) => Some((i, errno)),
                    _ => None,
                }
            })
        };
        let Some((k, errno)) = hit else {
            return self.inner.post_send(wrs);
        };
        if k > 0 {
            self.inner.post_send(&wrs[..k])?;
        }
        Err(PostSendError {
            posted: k,
            error: VerbsError::verb("ibv_post_send", errno),
        })
    }
    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError> {
        if self.failed {
            self.switch
                .polls_after_failure
                .fetch_add(1, Ordering::SeqCst);
        }
        let mask = self.switch.mask.load(Ordering::Relaxed);
        if mask & KNOBS != 0 {
            self.switch.poll_knobs();
        }
        if cq == CqKind::Recv && !self.corrupted.is_empty() {
            // The datapath has read the corrupted copies by now (they are valid from
            // the poll that returned them to the next receive poll).
            self.spare.extend(self.corrupted.drain(..).map(|(_, b)| b));
        }
        if mask & POLL_HOOKS == 0 {
            return self.inner.poll_cq(cq, out);
        }
        self.poll_faulty(cq, out, mask)
    }
    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        self.inner.req_notify(cq)
    }
    fn watch(&mut self) -> io::Result<WaitFds> {
        if self
            .switch
            .fail_registers
            .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
            .is_ok()
        {
            return Err(io::Error::other("injected registration failure"));
        }
        let mut fds = self.inner.watch()?;
        // Two sources of our own beside the device's: one waited on with the completion
        // channel (spurious events) and one with the async fds (injected events).
        let pair = || -> io::Result<(UnixStream, UnixStream)> {
            let (rx, tx) = UnixStream::pair()?;
            rx.set_nonblocking(true)?;
            tx.set_nonblocking(true)?;
            Ok((rx, tx))
        };
        let (cq_rx, cq_tx, async_rx, async_tx) = match (pair(), pair()) {
            (Ok((cq_rx, cq_tx)), Ok((async_rx, async_tx))) => (cq_rx, cq_tx, async_rx, async_tx),
            (Err(e), _) | (_, Err(e)) => {
                // Leave nothing half-watched.
                self.inner.unwatch();
                return Err(e);
            }
        };
        if !lock(&self.switch.async_events).is_empty() {
            let _ = (&async_tx).write(&[1]);
        }
        if self.shared.spurious.load(Ordering::SeqCst) != 0 {
            let _ = (&cq_tx).write(&[1]);
        }
        fds.cq.push(cq_rx.as_raw_fd());
        fds.events.push(async_rx.as_raw_fd());
        *lock(&self.shared.async_waker) = Some(async_tx);
        *lock(&self.shared.cq_waker) = Some(cq_tx);
        self.async_rx = Some(async_rx);
        self.cq_rx = Some(cq_rx);
        Ok(fds)
    }
    fn unwatch(&mut self) {
        self.async_rx = None;
        self.cq_rx = None;
        self.drop_wakers();
        self.inner.unwatch();
    }
    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError> {
        let (r, s) = self.inner.take_cq_events()?;
        if self.shared.spurious.load(Ordering::Relaxed) == 0 {
            return Ok((r, s));
        }
        if let Some(rx) = &self.cq_rx {
            let mut b = [0u8; 64];
            while matches!((&*rx).read(&mut b), Ok(n) if n > 0) {}
        }
        let extra = self.shared.spurious.swap(0, Ordering::SeqCst);
        Ok((r.saturating_add(extra), s))
    }
    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        if let Some(rx) = &self.async_rx {
            let mut b = [0u8; 64];
            while matches!((&*rx).read(&mut b), Ok(n) if n > 0) {}
        }
        let injected = lock(&self.switch.async_events).pop_front();
        let ev = match injected {
            Some(ev) => Some(ev),
            None => self.inner.next_async_event()?,
        };
        if let Some(e @ (AsyncEvent::DeviceFatal | AsyncEvent::DeviceRemoved)) = ev {
            self.lost.get_or_insert(e);
        }
        Ok(ev)
    }
    fn create_ah(&mut self, gid: &Gid) -> Result<AhHandle, VerbsError> {
        self.inner.create_ah(gid)
    }
    fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        self.inner.destroy_ah(ah)
    }
    fn attach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.inner.attach_mcast(gid)
    }
    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.inner.detach_mcast(gid)
    }
    fn set_qp_error(&mut self) -> Result<(), VerbsError> {
        if self.switch.refuse_qp_error.load(Ordering::SeqCst) {
            return Err(VerbsError::verb("ibv_modify_qp(ERR)", libc::EINVAL));
        }
        self.inner.set_qp_error()
    }
    fn maintain(&mut self) -> Result<(), VerbsError> {
        self.inner.maintain()
    }

    fn reaper(&self) -> Option<Arc<dyn crate::verbs::retire::Reaper>> {
        self.inner.reaper()
    }

    fn gid_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        self.inner.gid_now()
    }
    /// Refused while the device is hidden or after this endpoint delivered a device loss;
    /// else the inner endpoint renews, and this endpoint's per-QP fault state (a failed
    /// poll, stalled sends, spurious events, corrupted copies) starts afresh.
    fn renew(&mut self) -> Result<(), VerbsError> {
        self.renew_with(false)
    }
    /// As [`Endpoint::renew`] here, counted apart ([`FaultSwitch::renewals_destroying`]).
    fn renew_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.renew_with(true)
    }
}

impl FaultyEndpoint {
    fn renew_with(&mut self, destroy_old: bool) -> Result<(), VerbsError> {
        if self.switch.hidden.load(Ordering::SeqCst) {
            return Err(VerbsError::RenewRefused(
                "the device is gone (hidden)".into(),
            ));
        }
        if let Some(ev) = self.lost {
            return Err(VerbsError::RenewRefused(format!(
                "the device was lost ({ev:?})"
            )));
        }
        if destroy_old {
            self.inner.renew_destroying_old()?;
            self.switch
                .renewals_destroying
                .fetch_add(1, Ordering::SeqCst);
        } else {
            self.inner.renew()?;
        }
        self.failed = false;
        self.switch.unstall(&self.shared);
        // A new id, as a new open would have: injections name the QP they hit. The
        // wakers (set while watched) move over.
        let shared = Arc::new(EpShared {
            id: self.switch.next_id.fetch_add(1, Ordering::SeqCst),
            spurious: AtomicU32::new(0),
            stalled: AtomicBool::new(false),
            cq_waker: Mutex::new(lock(&self.shared.cq_waker).take()),
            async_waker: Mutex::new(lock(&self.shared.async_waker).take()),
        });
        {
            let mut eps = lock(&self.switch.endpoints);
            eps.retain(|e| !Arc::ptr_eq(e, &self.shared));
            eps.push(shared.clone());
        }
        self.shared = shared;
        self.recv_slots.clear();
        self.spare.extend(self.corrupted.drain(..).map(|(_, b)| b));
        self.switch.renewals.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}

#[cfg(all(test, feature = "sim"))]
mod tests {
    use super::*;
    use crate::verbs::fault::CqSel;
    use crate::verbs::sim::SimFabric;
    use crate::verbs::sim::tests::{unwatch_with, watch_with};
    use crate::verbs::{Dest, GRH_LEN};
    use std::net::Ipv4Addr;
    use std::time::Duration;

    const QKEY: u32 = 0x0B1B;

    struct Rig {
        _sim: Arc<SimFabric>,
        switch: Arc<FaultSwitch>,
        /// Through the decorator.
        a: Box<dyn Endpoint>,
        /// Plain.
        b: Box<dyn Endpoint>,
        ah: AhHandle,
    }

    fn cfg(device: &str) -> EndpointConfig {
        EndpointConfig {
            device: device.into(),
            port: 1,
            gid_index: None,
            qkey: QKEY,
            recv_slots: 16,
            send_slots: 16,
            max_payload: None,
        }
    }

    fn rig() -> Rig {
        let sim = Arc::new(SimFabric::new());
        sim.add_device("a", Ipv4Addr::new(10, 0, 0, 1), 4096)
            .unwrap();
        sim.add_device("b", Ipv4Addr::new(10, 0, 0, 2), 4096)
            .unwrap();
        let faulty = FaultyProvider::new(sim.clone());
        let switch = faulty.switch();
        let mut a = faulty.open(&cfg("a")).unwrap();
        let b = sim.open(&cfg("b")).unwrap();
        let ah = a.create_ah(&b.attrs().gid).unwrap();
        Rig {
            _sim: sim,
            switch,
            a,
            b,
            ah,
        }
    }

    impl Rig {
        fn wr(&self, wr_id: u64) -> SendWr {
            SendWr {
                wr_id,
                slot: (wr_id % 16) as u32,
                len: 100,
                dest: Dest {
                    ah: self.ah,
                    qpn: self.b.attrs().qpn,
                    qkey: QKEY,
                },
                signaled: true,
            }
        }
        /// A sends `n` packets (ids from `first`) to B, which has receives posted.
        fn a_sends(&mut self, first: u64, n: u64) -> Result<(), PostSendError> {
            let wrs: Vec<SendWr> = (first..first + n).map(|i| self.wr(i)).collect();
            self.a.post_send(&wrs)
        }
        /// B sends `n` packets to A.
        fn b_sends(&mut self, n: u64) {
            let ah = self.b.create_ah(&self.a.attrs().gid).unwrap();
            for i in 0..n {
                let buf = self.b.send_buf(0);
                buf[..100].fill(0x11);
                self.b
                    .post_send(&[SendWr {
                        wr_id: 1000 + i,
                        slot: 0,
                        len: 100,
                        dest: Dest {
                            ah,
                            qpn: self.a.attrs().qpn,
                            qkey: QKEY,
                        },
                        signaled: true,
                    }])
                    .unwrap();
            }
            poll(&mut *self.b, CqKind::Send);
        }
    }

    fn poll(ep: &mut dyn Endpoint, cq: CqKind) -> Vec<Completion> {
        let mut out = [Completion::EMPTY; 64];
        let n = ep.poll_cq(cq, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn ids(c: &[Completion]) -> Vec<u64> {
        c.iter().map(|c| c.wr_id).collect()
    }

    #[test]
    fn renew_starts_the_qp_afresh_and_refuses_after_a_device_loss() {
        let mut r = rig();
        r.switch.arm_poll_error_n(-5, 1);
        let mut out = [Completion::EMPTY; 4];
        assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_err());
        // A failed poll is never retried on that QP; after a renewal the QP is another.
        let qpn = r.a.attrs().qpn;
        r.a.renew().unwrap();
        assert_ne!(r.a.attrs().qpn, qpn);
        assert_eq!((r.switch.opens(), r.switch.renewals()), (1, 1));
        assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
        assert_eq!(r.switch.polls_after_failure(), 0);
        // A hidden device (gone) cannot be renewed ...
        r.switch.hide_device(true);
        assert!(matches!(r.a.renew(), Err(VerbsError::RenewRefused(_))));
        r.switch.hide_device(false);
        // ... nor one whose loss this endpoint reported.
        r.switch.inject_async(AsyncEvent::DeviceFatal);
        assert_eq!(
            r.a.next_async_event().unwrap(),
            Some(AsyncEvent::DeviceFatal)
        );
        assert!(matches!(r.a.renew(), Err(VerbsError::RenewRefused(_))));
        assert_eq!(r.switch.renewals(), 1);
    }

    #[test]
    fn inert_until_armed_then_poll_error_after_n() {
        let mut r = rig();
        r.a_sends(1, 3).unwrap();
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2, 3]);
        assert_eq!(r.switch.injected(), 0);
        r.switch.arm(
            FaultSpec::new(Fault::PollError { ret: -22 })
                .trigger(Trigger::After(2))
                .limit(2),
        );
        let mut out = [Completion::EMPTY; 4];
        assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
        assert!(r.a.poll_cq(CqKind::Send, &mut out).is_ok());
        for _ in 0..2 {
            match r.a.poll_cq(CqKind::Recv, &mut out) {
                Err(VerbsError::PollFailed { ret: -22, .. }) => {}
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(r.switch.polls_failed(), 2);
        assert_eq!(r.switch.polls_after_failure(), 1);
        assert!(r.switch.armed().is_empty(), "spent after two hits");
        assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
        let log = r.switch.injections();
        assert_eq!(
            log.iter()
                .map(|i| (i.seq, i.kind, i.op))
                .collect::<Vec<_>>(),
            vec![(1, FaultKind::PollError, 3), (2, FaultKind::PollError, 4)]
        );
        assert_eq!(log[0].endpoint, Some(0));
    }

    #[test]
    fn lost_completion_is_swallowed_on_its_cq_only() {
        let mut r = rig();
        r.switch.arm(
            FaultSpec::new(Fault::LostCompletion { cq: CqSel::Send })
                .trigger(Trigger::Every(2))
                .limit(2),
        );
        r.b.post_recv(77, 0).unwrap();
        r.a_sends(1, 6).unwrap();
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 3, 5, 6]);
        // Receives are not selected.
        r.a.post_recv(9, 0).unwrap();
        r.b_sends(1);
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Recv)), vec![9]);
        assert_eq!(r.switch.fired(FaultKind::LostCompletion), 2);
    }

    #[test]
    fn post_errors_post_the_prefix_and_fail_the_rest() {
        let mut r = rig();
        r.switch.arm(
            FaultSpec::new(Fault::PostSendError {
                errno: libc::EINVAL,
            })
            .trigger(Trigger::After(2)),
        );
        let e = r.a_sends(1, 4).unwrap_err();
        assert_eq!(e.posted, 2);
        assert!(
            matches!(&e.error, VerbsError::Verb { verb: "ibv_post_send", source } if source.raw_os_error() == Some(libc::EINVAL)),
            "{e}"
        );
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2]);
        // Spent: the next chain goes through.
        r.a_sends(10, 2).unwrap();
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![10, 11]);

        r.switch.arm(
            FaultSpec::new(Fault::PostRecvError {
                errno: libc::ENOMEM,
            })
            .limit(1),
        );
        match r.a.post_recv(5, 5) {
            Err(VerbsError::Verb {
                verb: "ibv_post_recv",
                source,
            }) => assert_eq!(source.raw_os_error(), Some(libc::ENOMEM)),
            other => panic!("{other:?}"),
        }
        r.a.post_recv(5, 5).unwrap();
        r.b_sends(1);
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Recv)), vec![5]);
    }

    #[test]
    fn qp_error_flushes_and_can_raise_qp_fatal() {
        let mut r = rig();
        for i in 0..4 {
            r.a.post_recv(i, i as u32).unwrap();
        }
        r.switch
            .arm(FaultSpec::new(Fault::QpError { fatal_event: true }));
        let c = poll(&mut *r.a, CqKind::Recv);
        assert_eq!(ids(&c), vec![0, 1, 2, 3]);
        assert!(c.iter().all(|c| c.status == WcStatus::Flushed));
        assert_eq!(r.a.next_async_event().unwrap(), Some(AsyncEvent::QpFatal));
        assert_eq!(r.a.next_async_event().unwrap(), None);
        // Later posts flush too.
        r.a_sends(1, 1).unwrap();
        assert_eq!(poll(&mut *r.a, CqKind::Send)[0].status, WcStatus::Flushed);
    }

    #[test]
    fn spurious_event_reports_an_event_with_nothing_behind_it() {
        let mut r = rig();
        assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
        // On command: at once, to every endpoint.
        r.switch.arm(FaultSpec::new(Fault::SpuriousEvent));
        assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
        assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
        assert!(poll(&mut *r.a, CqKind::Recv).is_empty());
        // By trigger: at the hit poll.
        r.switch
            .arm(FaultSpec::new(Fault::SpuriousEvent).trigger(Trigger::After(1)));
        poll(&mut *r.a, CqKind::Recv);
        assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
        poll(&mut *r.a, CqKind::Recv);
        assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
        assert_eq!(r.switch.fired(FaultKind::SpuriousEvent), 2);
    }

    #[test]
    fn spurious_event_wakes_a_registered_channel() {
        let mut r = rig();
        let mut poll_ = mio::Poll::new().unwrap();
        let fds = watch_with(&mut *r.a, poll_.registry(), mio::Token(1), mio::Token(2));
        r.switch.arm(FaultSpec::new(Fault::SpuriousEvent));
        let mut events = mio::Events::with_capacity(8);
        poll_
            .poll(&mut events, Some(Duration::from_secs(2)))
            .unwrap();
        assert!(events.iter().any(|e| e.token() == mio::Token(1)));
        assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
        unwatch_with(&mut *r.a, poll_.registry(), &fds);
    }

    #[test]
    fn slow_poll_delays_each_poll_hit() {
        let mut r = rig();
        r.switch.arm(
            FaultSpec::new(Fault::SlowPoll {
                delay: Duration::from_millis(30),
            })
            .limit(2),
        );
        let t = Instant::now();
        poll(&mut *r.a, CqKind::Recv);
        poll(&mut *r.a, CqKind::Send);
        assert!(t.elapsed() >= Duration::from_millis(60));
        let t = Instant::now();
        poll(&mut *r.a, CqKind::Recv);
        assert!(t.elapsed() < Duration::from_millis(30));
    }

    #[test]
    fn corrupt_rx_flips_bytes_in_a_copy_until_the_next_poll() {
        let mut r = rig();
        // Posted before arming: its slot is unknown, it is left alone.
        r.a.post_recv(100, 0).unwrap();
        r.switch.arm(
            FaultSpec::new(Fault::CorruptRx { bytes: 3 })
                .trigger(Trigger::Every(1))
                .unlimited(),
        );
        r.a.post_recv(101, 1).unwrap();
        r.b_sends(2);
        let c = poll(&mut *r.a, CqKind::Recv);
        assert_eq!(ids(&c), vec![100, 101]);
        let len = c[1].byte_len as usize;
        assert_eq!(len, GRH_LEN + 100);
        let clean = r.a.recv_buf(0)[..len].to_vec();
        let dirty = r.a.recv_buf(1)[..len].to_vec();
        let diff = clean.iter().zip(&dirty).filter(|(x, y)| x != y).count();
        assert_eq!(diff, 3, "three bytes flipped");
        assert_eq!(r.a.recv_buf(1).len(), r.a.recv_buf(0).len());
        assert_eq!(r.switch.fired(FaultKind::CorruptRx), 1);
        // The next receive poll drops the copy: the slot reads as delivered.
        poll(&mut *r.a, CqKind::Recv);
        assert_eq!(r.a.recv_buf(1)[..len], clean[..]);
    }

    #[test]
    fn stall_send_holds_completions_until_cleared() {
        let mut r = rig();
        r.switch.arm(FaultSpec::new(Fault::StallSend));
        r.a_sends(1, 3).unwrap();
        assert!(poll(&mut *r.a, CqKind::Send).is_empty());
        assert!(r.switch.stalled());
        assert!(r.switch.armed().is_empty(), "spent, but the stall stays");
        assert!(poll(&mut *r.a, CqKind::Send).is_empty());
        r.switch.clear();
        assert!(!r.switch.stalled());
        assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2, 3]);
        // A stalled endpoint that goes away takes its stall with it.
        r.switch.arm(FaultSpec::new(Fault::StallSend));
        poll(&mut *r.a, CqKind::Send);
        assert!(r.switch.stalled());
        drop(r.a);
        assert!(!r.switch.stalled());
        assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
    }

    #[test]
    fn async_fatal_on_command_and_by_trigger() {
        let mut r = rig();
        r.switch.arm(FaultSpec::new(Fault::AsyncFatal {
            event: AsyncEvent::CqError,
        }));
        assert_eq!(r.a.next_async_event().unwrap(), Some(AsyncEvent::CqError));
        assert_eq!(r.a.next_async_event().unwrap(), None);
        r.switch.arm(
            FaultSpec::new(Fault::AsyncFatal {
                event: AsyncEvent::DeviceFatal,
            })
            .trigger(Trigger::Every(3))
            .limit(1),
        );
        poll(&mut *r.a, CqKind::Recv);
        poll(&mut *r.a, CqKind::Recv);
        assert_eq!(r.a.next_async_event().unwrap(), None);
        poll(&mut *r.a, CqKind::Recv);
        assert_eq!(
            r.a.next_async_event().unwrap(),
            Some(AsyncEvent::DeviceFatal)
        );
        let log = r.switch.injections();
        assert_eq!(log[0].endpoint, None);
        assert_eq!((log[1].endpoint, log[1].op), (Some(0), 3));
    }

    #[test]
    fn seeded_faults_hit_the_same_operations() {
        let run = |seed: u64| {
            let mut r = rig();
            r.switch.arm(
                FaultSpec::new(Fault::LostCompletion { cq: CqSel::Send })
                    .trigger(Trigger::Random { p: 0.3, seed }),
            );
            let mut seen = Vec::new();
            for i in 0..20 {
                r.a_sends(i * 4, 4).unwrap();
                seen.extend(ids(&poll(&mut *r.a, CqKind::Send)));
            }
            (
                seen,
                r.switch
                    .injections()
                    .iter()
                    .map(|i| i.op)
                    .collect::<Vec<_>>(),
            )
        };
        assert_eq!(run(5), run(5));
        assert_ne!(run(5), run(6));
    }

    #[test]
    fn clear_disarms_everything() {
        let r = rig();
        r.switch.arm_poll_error(-5);
        r.switch.arm(FaultSpec::new(Fault::SlowPoll {
            delay: Duration::from_millis(1),
        }));
        r.switch.hide_device(true);
        assert_eq!(r.switch.armed().len(), 2);
        r.switch.clear();
        assert!(r.switch.armed().is_empty());
        assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
        assert!(!r.switch.hidden.load(Ordering::SeqCst));
        r.switch
            .arm(FaultSpec::new(Fault::CorruptRx { bytes: 1 }).unlimited());
        r.switch.disarm(FaultKind::CorruptRx);
        assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
    }
}
