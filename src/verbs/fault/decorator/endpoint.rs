//! The fault-injecting [`Endpoint`]: each verb asks the switch whether an armed fault hits
//! it and applies what fires, else passes the call to the inner endpoint.

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use super::{BAD_WR, EpShared, FaultSwitch, FaultyProvider, Hit, KNOBS, POLL_HOOKS, bit, lock};
use crate::verbs::fault::{Fault, FaultKind, SplitMix64};
use crate::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    PostRecvError, PostSendError, Provider, RecvWr, SendWr, VerbsError, WaitFds, WcStatus,
};

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
    /// `restart` refuses after it, as the real provider does.
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
        // A poll-error that loses completions (`lose`) can only hit a poll that finds
        // some: it is decided after the inner poll, below.
        let mut lossy: Option<u32> = None;
        {
            let mut st = lock(&sw.state);
            if mask & bit(FaultKind::PollError) != 0
                && let Some(Fault::PollError { cq: sel, lose, .. }) = st.armed
                    [FaultKind::PollError.index()]
                .as_ref()
                .map(|a| a.spec.fault)
                && sel.matches(cq)
                && lose > 0
            {
                lossy = Some(lose);
            }
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
                if kind == FaultKind::PollError
                    && !matches!(
                        st.armed[kind.index()].as_ref().map(|a| a.spec.fault),
                        Some(Fault::PollError { cq: sel, .. }) if sel.matches(cq)
                    )
                {
                    // Only the selected CQ's polls count.
                    continue;
                }
                if kind == FaultKind::PollError && lossy.is_some() {
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
                Fault::PollError { ret, .. } => {
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
        let mut n = match lossy {
            None => self.inner.poll_cq(cq, out)?,
            Some(lose) => {
                // At most `lose` taken; an empty poll has nothing to lose and is not one
                // the fault counts.
                let want = out.len().min(lose as usize);
                let n = self.inner.poll_cq(cq, &mut out[..want])?;
                if n == 0 {
                    return Ok(0);
                }
                let hit = lock(&sw.state).check(&sw.mask, FaultKind::PollError, id, now);
                if let Some(Hit {
                    fault: Fault::PollError { ret, .. },
                    ..
                }) = hit
                {
                    // The failing poll consumed them and returns none: their work
                    // requests will never complete.
                    for c in &out[..n] {
                        self.recv_slots.remove(&c.wr_id);
                    }
                    sw.completions_swallowed
                        .fetch_add(n as u64, Ordering::SeqCst);
                    self.failed = true;
                    sw.polls_failed.fetch_add(1, Ordering::SeqCst);
                    return Err(VerbsError::PollFailed { cq, ret });
                }
                // Not hit: the poll gets what it asked for, not only the first `lose`.
                if n == want && want < out.len() {
                    n + self.inner.poll_cq(cq, &mut out[n..])?
                } else {
                    n
                }
            }
        };
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
/// positions and with values drawn from `noise`, so that the damage shows in every 16-bit
/// ones'-complement checksum over a range that holds any of them (IPv4's header, TCP, UDP,
/// ICMP): the corruption a link's CRC let through and the protocols' own checks catch.
/// Drawn freely, flips that cancel in that sum are common, not one in 65,536: four bytes
/// in one byte lane cancel when their changes add up to 0, and in the simulated fabric's
/// runs about eight damaged TCP segments a run still checked out (most in the payload,
/// a few in the header, and one that did could stop the flow), which tests the peer's TCP,
/// not the datapath. So the values are drawn again (up to [`FLIP_DRAWS`] times, then one
/// byte is flipped alone, which every such checksum sees) until every run of consecutive
/// flips changes the sum ([`shows_in_checksums`]).
pub(super) fn flip(buf: &mut [u8], len: usize, bytes: u32, noise: u64) {
    let len = len.min(buf.len());
    if len == 0 {
        return;
    }
    let mut r = SplitMix64::new(noise);
    let want = (bytes as usize).min(len);
    let mut hit: Vec<(usize, u8)> = Vec::with_capacity(want);
    while hit.len() < want {
        let at = r.below(len as u64) as usize;
        if hit.iter().any(|&(p, _)| p == at) {
            continue;
        }
        hit.push((at, 0));
    }
    hit.sort_unstable_by_key(|&(p, _)| p);
    let mut shown = false;
    for _ in 0..FLIP_DRAWS {
        for h in hit.iter_mut() {
            h.1 = (r.below(255) + 1) as u8;
        }
        if shows_in_checksums(buf, &hit) {
            shown = true;
            break;
        }
    }
    if !shown {
        // One byte alone: the last drawn position's (not the lowest, which leans towards
        // the GRH that no checksum covers).
        let keep = hit.len() - 1;
        hit.swap(0, keep);
        hit.truncate(1);
    }
    for &(at, x) in &hit {
        buf[at] ^= x;
    }
}

/// How many times [`flip`] draws the values before it flips one byte alone.
const FLIP_DRAWS: usize = 64;

/// Whether XOR-ing each `(position, value)` of `hit` (sorted by position) into `buf`
/// changes the 16-bit ones'-complement sum of every contiguous range that holds any of
/// them: such a range holds a run of consecutive ones. A byte's change counts 256 times
/// over at an even position (a word's high byte) and once at an odd one; a range that
/// starts at an odd offset swaps the lanes, which multiplies the whole change by 256,
/// invertible modulo 0xffff, so that it is zero for one alignment exactly when it is for
/// the other. A change shows unless it is a multiple of 0xffff; one byte's alone never is.
pub(super) fn shows_in_checksums(buf: &[u8], hit: &[(usize, u8)]) -> bool {
    let weight = |&(at, x): &(usize, u8)| -> i64 {
        let old = i64::from(buf[at]);
        let new = i64::from(buf[at] ^ x);
        (new - old) * if at % 2 == 0 { 256 } else { 1 }
    };
    (0..hit.len()).all(|i| {
        let mut sum = 0i64;
        hit[i..].iter().all(|h| {
            sum += weight(h);
            sum.rem_euclid(0xffff) != 0
        })
    })
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
    /// A corrupted copy stands for the slot here too: what the datapath rewrites in place
    /// is what it reads.
    fn recv_buf_mut(&mut self, slot: u32) -> &mut [u8] {
        if let Some(i) = self.corrupted.iter().position(|(s, _)| *s == slot) {
            return &mut self.corrupted[i].1;
        }
        self.inner.recv_buf_mut(slot)
    }

    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        self.inner.send_buf(slot)
    }

    fn send_room(&mut self, slot: u32) -> &mut [u8] {
        self.inner.send_room(slot)
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
    fn prepare_spare(&mut self) -> Result<(), VerbsError> {
        self.inner.prepare_spare()
    }
    fn recreate_cq(&mut self, cq: CqKind) -> Result<crate::verbs::CqRecreated, VerbsError> {
        self.inner.recreate_cq(cq)
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
    fn restart(&mut self) -> Result<(), VerbsError> {
        self.restart_with(false)
    }
    /// As [`Endpoint::restart`] here, counted apart ([`FaultSwitch::endpoint_restarts_destroying`]).
    fn restart_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.restart_with(true)
    }
    /// As [`Endpoint::restart_destroying_old`] here (counted with it), the old QP's
    /// destroy deferred by the inner endpoint.
    fn restart_deferring_old(&mut self) -> Result<crate::verbs::retire::Gone, VerbsError> {
        let mut gone = None;
        self.restart_checked(|inner| {
            gone = Some(inner.restart_deferring_old()?);
            Ok(true)
        })?;
        Ok(gone.unwrap_or_else(crate::verbs::retire::Gone::already))
    }
}

impl FaultyEndpoint {
    fn restart_with(&mut self, destroy_old: bool) -> Result<(), VerbsError> {
        self.restart_checked(|inner| {
            if destroy_old {
                inner.restart_destroying_old()?;
            } else {
                inner.restart()?;
            }
            Ok(destroy_old)
        })
    }

    /// Refused while the device is hidden or lost; else `renew` renews the inner
    /// endpoint (returning whether the old QP was destroyed rather than retired for its
    /// grace) and the per-QP fault state starts afresh.
    fn restart_checked(
        &mut self,
        renew: impl FnOnce(&mut dyn Endpoint) -> Result<bool, VerbsError>,
    ) -> Result<(), VerbsError> {
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
        if renew(self.inner.as_mut())? {
            self.switch
                .endpoint_restarts_destroying
                .fetch_add(1, Ordering::SeqCst);
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
        self.switch.endpoint_restarts.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
}
