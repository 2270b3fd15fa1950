//! [`SimEndpoint`], the [`Endpoint`] of the simulated fabric: slot memory, posting,
//! polling, the completion channel, address handles, multicast, the error state and
//! renewal.

use std::io::{self, Read};
use std::ops::Range;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use crate::verbs::retire::{Destroy, Gone, OldQp, Reaper, gone_pair};
use crate::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, Gid, PostSendError,
    SEND_HEADROOM, SEND_TAILROOM, SendWr, VerbsError, WaitFds, WcStatus,
};

/// Bytes of one send slot with its room.
pub(super) fn send_stride(max_payload: u32) -> usize {
    SEND_HEADROOM + max_payload as usize + SEND_TAILROOM
}

use super::delivery::deliver;
use super::fabric::detach;
use super::qp::wake;
use super::{
    HeldSend, MAX_QPN, Notifier, QpState, SendSide, SimEndpoint, SimRetired, Tally, cq_index, lock,
    read, write,
};

impl SimEndpoint {
    /// Why `wr` cannot be posted, if it cannot; else its destination GID.
    fn check_send(&self, wr: &SendWr) -> Result<Gid, VerbsError> {
        if wr.slot >= self.attrs.send_slots * self.attrs.banks {
            return Err(VerbsError::verb("ibv_post_send", libc::EINVAL));
        }
        if wr.len > self.attrs.max_payload {
            return Err(VerbsError::verb("ibv_post_send", libc::EINVAL));
        }
        self.ahs
            .get(&wr.dest.ah.0)
            .copied()
            .ok_or(VerbsError::UnknownAh(wr.dest.ah))
    }

    fn send_slice(&self, wr: &SendWr) -> &[u8] {
        let start = wr.slot as usize * send_stride(self.attrs.max_payload) + SEND_HEADROOM;
        &self.send_mem[start..start + wr.len as usize]
    }

    /// Where receive slot `slot` lies in `recv_mem` (`None`: out of range).
    fn recv_range(&self, slot: u32) -> Option<Range<usize>> {
        let start = (slot < self.attrs.recv_slots * self.attrs.banks)
            .then(|| slot as usize * self.recv_stride)?;
        Some(start..start + self.recv_stride)
    }

    /// Where send slot `slot` with its room lies in `send_mem` (`None`: out of range).
    fn send_room_range(&self, slot: u32) -> Option<Range<usize>> {
        let len = send_stride(self.attrs.max_payload);
        let start =
            (slot < self.attrs.send_slots * self.attrs.banks).then(|| slot as usize * len)?;
        Some(start..start + len)
    }
}

impl Endpoint for SimEndpoint {
    fn attrs(&self) -> &EndpointAttrs {
        &self.attrs
    }

    /// An out-of-range slot gives an empty slice.
    fn recv_buf(&self, slot: u32) -> &[u8] {
        self.recv_range(slot).map_or(&[], |r| &self.recv_mem[r])
    }

    /// An out-of-range slot gives an empty slice.
    fn recv_buf_mut(&mut self, slot: u32) -> &mut [u8] {
        self.recv_range(slot)
            .map_or(&mut [], |r| &mut self.recv_mem[r])
    }

    /// An out-of-range slot gives an empty slice.
    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        let len = self.attrs.max_payload as usize;
        self.send_room_range(slot).map_or(&mut [], |r| {
            &mut self.send_mem[r.start + SEND_HEADROOM..r.start + SEND_HEADROOM + len]
        })
    }

    /// An out-of-range slot gives an empty slice.
    fn send_room(&mut self, slot: u32) -> &mut [u8] {
        self.send_room_range(slot)
            .map_or(&mut [], |r| &mut self.send_mem[r])
    }

    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        let slots = self.attrs.recv_slots * self.attrs.banks;
        if slot >= slots {
            return Err(VerbsError::Invalid {
                field: "slot",
                why: format!("receive slot {slot} is outside 0..{slots}"),
            });
        }
        let mut st = lock(&self.qp.state);
        // Return the last poll's packet buffers: deliveries need posted receives, so a
        // QP never holds more buffers than it has receive slots.
        st.pool.append(&mut self.spare);
        // A receive occupies the queue until its completion is polled.
        if st.recv_posted.len() + st.recv_cq.len() >= self.qp.recv_slots as usize {
            return Err(VerbsError::verb("ibv_post_recv", libc::ENOMEM));
        }
        if st.error {
            st.push_recv_flush(wr_id, slot);
            let waker = st.completion_added(CqKind::Recv);
            drop(st);
            wake(waker);
        } else {
            st.recv_posted.push_back((wr_id, slot));
        }
        Ok(())
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        let qp = &*self.qp;
        let mut send = lock(&qp.send);

        // The longest valid prefix, and why it stops.
        let mut n = wrs.len();
        let mut error = None;
        for (i, wr) in wrs.iter().enumerate() {
            if let Err(e) = self.check_send(wr) {
                n = i;
                error = Some(e);
                break;
            }
        }

        // Reserve send queue entries; flush at once in the error state.
        let mut st = lock(&qp.state);
        let room = (qp.send_slots - st.send_outstanding) as usize;
        if n > room {
            n = room;
            error = Some(VerbsError::verb("ibv_post_send", libc::ENOMEM));
        }
        st.send_outstanding += n as u32;
        let done = |error: Option<VerbsError>| match error {
            None => Ok(()),
            Some(error) => Err(PostSendError { posted: n, error }),
        };
        if st.error {
            for wr in &wrs[..n] {
                st.push_send_cqe(wr.wr_id, WcStatus::Flushed);
            }
            let waker = if n > 0 {
                st.completion_added(CqKind::Send)
            } else {
                None
            };
            drop(st);
            wake(waker);
            return done(error);
        }
        drop(st);

        if send.held {
            let SendSide { queue, pool, .. } = &mut *send;
            for wr in &wrs[..n] {
                let mut data = pool
                    .pop()
                    .unwrap_or_else(|| Vec::with_capacity(self.attrs.max_payload as usize));
                data.clear();
                data.extend_from_slice(self.send_slice(wr));
                queue.push_back(HeldSend {
                    wr_id: wr.wr_id,
                    signaled: wr.signaled,
                    dgid: self.ahs[&wr.dest.ah.0],
                    dqpn: wr.dest.qpn,
                    qkey: wr.dest.qkey,
                    data,
                });
            }
            return done(error);
        }

        if n > 0 {
            let mut tally = Tally::default();
            let topo = read(&self.fabric.topo);
            for wr in &wrs[..n] {
                let dgid = self.ahs[&wr.dest.ah.0];
                deliver(
                    &topo,
                    &mut tally,
                    qp,
                    &dgid,
                    wr.dest.qpn,
                    wr.dest.qkey,
                    self.send_slice(wr),
                );
            }
            drop(topo);
            self.fabric.counters.add(&tally);

            let mut st = lock(&qp.state);
            let mut signaled = false;
            for wr in &wrs[..n] {
                if wr.signaled {
                    st.push_send_cqe(wr.wr_id, WcStatus::Success);
                    signaled = true;
                } else {
                    st.unsignaled_done += 1;
                }
            }
            let waker = if signaled {
                st.completion_added(CqKind::Send)
            } else {
                None
            };
            drop(st);
            wake(waker);
        }
        drop(send);
        done(error)
    }

    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError> {
        if self.recreated[cq_index(cq)] {
            // A re-created CQ: no work queue completes into it.
            return Ok(0);
        }
        match cq {
            CqKind::Send => {
                let mut st = lock(&self.qp.state);
                let QpState {
                    send_cq,
                    send_outstanding,
                    ..
                } = &mut *st;
                let n = out.len().min(send_cq.len());
                for (o, cqe) in out.iter_mut().zip(send_cq.drain(..n)) {
                    *o = cqe.wc;
                    // Retiring can never exceed what was posted; saturate all the same.
                    *send_outstanding = send_outstanding.saturating_sub(cqe.retires);
                }
                Ok(n)
            }
            CqKind::Recv => {
                let mut st = lock(&self.qp.state);
                st.pool.append(&mut self.spare);
                let n = out.len().min(st.recv_cq.len());
                self.polled.extend(st.recv_cq.drain(..n));
                drop(st);
                for (o, cqe) in out.iter_mut().zip(self.polled.drain(..)) {
                    *o = cqe.wc;
                    if let Some(packet) = cqe.packet {
                        let start = cqe.slot as usize * self.recv_stride;
                        self.recv_mem[start..start + packet.len()].copy_from_slice(&packet);
                        self.spare.push(packet);
                    }
                }
                Ok(n)
            }
        }
    }

    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        if self.recreated[cq_index(cq)] {
            // Armed, but nothing will ever complete into it: no event.
            return Ok(());
        }
        lock(&self.qp.state).armed[cq_index(cq)] = true;
        Ok(())
    }

    /// As the IBTA has it (C11-17) and rxe does: the QP's CQ cannot be destroyed while
    /// the QP uses it, so it is kept and goes on receiving the QP's completions, and the
    /// new CQ (polled and armed from now on) receives none. A CQ made by an earlier
    /// re-creation is used by no QP and goes.
    fn recreate_cq(&mut self, cq: CqKind) -> Result<crate::verbs::CqRecreated, VerbsError> {
        let i = cq_index(cq);
        let first = !self.recreated[i];
        self.recreated[i] = true;
        if first {
            // The old CQ's pending event (if it was armed) means nothing any more.
            let mut st = lock(&self.qp.state);
            st.armed[i] = false;
            st.events[i] = 0;
        }
        Ok(crate::verbs::CqRecreated {
            old_destroyed: !first,
            refusal: first.then(|| {
                format!(
                    "ibv_destroy_cq: {} (QP {} still uses it)",
                    io::Error::from_raw_os_error(libc::EBUSY),
                    self.qp.qpn
                )
            }),
            qp_bound_elsewhere: true,
        })
    }

    /// Makes the simulated completion channel (the read end of a socket pair) and gives
    /// its fd. The simulated fabric raises no asynchronous events, so there is no event
    /// fd.
    fn watch(&mut self) -> io::Result<WaitFds> {
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        let fd = rx.as_raw_fd();
        let notifier = Arc::new(Notifier { tx });
        let mut st = lock(&self.qp.state);
        let pending = st.events != [0, 0];
        st.waker = Some(Arc::clone(&notifier));
        drop(st);
        self.channel = Some(rx);
        // Like a completion channel fd that already has events queued: readable at once.
        if pending {
            notifier.wake()?;
        }
        Ok(WaitFds {
            cq: vec![fd],
            events: Vec::new(),
        })
    }

    /// Closes the channel.
    fn unwatch(&mut self) {
        lock(&self.qp.state).waker = None;
        self.channel = None;
    }

    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError> {
        if let Some(rx) = &self.channel {
            let mut buf = [0u8; 64];
            loop {
                match (&*rx).read(&mut buf) {
                    Ok(0) => break,
                    Ok(_) => continue,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                    Err(_) => break,
                }
            }
        }
        let [r, s] = std::mem::take(&mut lock(&self.qp.state).events);
        // Events of a CQ that was replaced are not the polled CQ's.
        let r = if self.recreated[0] { 0 } else { r };
        let s = if self.recreated[1] { 0 } else { s };
        Ok((r, s))
    }

    /// Always `Ok(None)`: the simulated fabric raises no asynchronous events.
    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        Ok(None)
    }

    fn create_ah(&mut self, gid: &Gid) -> Result<AhHandle, VerbsError> {
        let h = self.next_ah;
        self.next_ah = h
            .checked_add(1)
            .ok_or_else(|| VerbsError::verb("ibv_create_ah", libc::ENOMEM))?;
        self.ahs.insert(h, *gid);
        Ok(AhHandle(h))
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        self.ahs
            .remove(&ah.0)
            .map(|_| ())
            .ok_or(VerbsError::UnknownAh(ah))
    }

    fn attach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        if !gid.is_multicast() {
            return Err(VerbsError::Invalid {
                field: "mcast gid",
                why: format!("{gid} is not a multicast GID"),
            });
        }
        if self.groups.contains(gid) {
            return Ok(());
        }
        write(&self.fabric.topo)
            .groups
            .entry(*gid)
            .or_default()
            .push(Arc::clone(&self.qp));
        self.groups.push(*gid);
        Ok(())
    }

    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        let Some(pos) = self.groups.iter().position(|g| g == gid) else {
            return Err(VerbsError::verb("ibv_detach_mcast", libc::EINVAL));
        };
        self.groups.swap_remove(pos);
        let mut topo = write(&self.fabric.topo);
        detach(&mut topo, gid, self.qp.qpn);
        Ok(())
    }

    fn set_qp_error(&mut self) -> Result<(), VerbsError> {
        let mut send = lock(&self.qp.send);
        let SendSide { queue, pool, .. } = &mut *send;
        let mut st = lock(&self.qp.state);
        st.error = true;
        let mut recv_flushed = false;
        while let Some((wr_id, slot)) = st.recv_posted.pop_front() {
            st.push_recv_flush(wr_id, slot);
            recv_flushed = true;
        }
        let mut send_flushed = false;
        for h in queue.drain(..) {
            st.push_send_cqe(h.wr_id, WcStatus::Flushed);
            pool.push(h.data);
            send_flushed = true;
        }
        let wakers = [
            recv_flushed.then(|| st.completion_added(CqKind::Recv)),
            send_flushed.then(|| st.completion_added(CqKind::Send)),
        ];
        drop(st);
        drop(send);
        for w in wakers.into_iter().flatten() {
            wake(w);
        }
        Ok(())
    }
    fn restart(&mut self) -> Result<(), VerbsError> {
        self.restart_qp(OldQp::Retire).map(drop)
    }
    fn restart_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.restart_qp(OldQp::Destroy).map(drop)
    }
    /// The old QP leaves the fabric at once, as in every renewal here (nothing reaches
    /// it), but its "destroy" waits for the caller (or the reaper, `CQ_GRACE` later):
    /// the caller's wait for the [`Gone`] and its deferred reap run as they do over a
    /// real device.
    fn restart_deferring_old(&mut self) -> Result<Gone, VerbsError> {
        self.restart_qp(OldQp::Defer)
            .map(|g| g.unwrap_or_else(Gone::already))
    }

    fn reaper(&self) -> Option<Arc<dyn Reaper>> {
        let r: Arc<dyn Reaper> = self.retired.clone();
        Some(r)
    }

    fn gid_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        let topo = read(&self.fabric.topo);
        let dev = &topo.devices[self.qp.device];
        let i = self.attrs.gid_index;
        Ok(dev.gids.get(usize::from(i)).map(|g| (*g, i)))
    }
}

impl SimEndpoint {
    /// [`Endpoint::restart`]: a new QP (new number, empty queues and CQs) on the same
    /// device, slot memory and address handles, in the old one's multicast groups; the
    /// old QP leaves the fabric, and what was posted on it never completes.
    /// With [`OldQp::Destroy`], the old QP is destroyed here (recorded on this thread,
    /// at once) instead of being retired for its grace; with [`OldQp::Defer`] it is
    /// retired for the caller to destroy, and the [`Gone`] returned says when it is.
    fn restart_qp(&mut self, mode: OldQp) -> Result<Option<Gone>, VerbsError> {
        let mut topo = write(&self.fabric.topo);
        let dev = &topo.devices[self.qp.device];
        let gid_now = dev.gids.get(usize::from(self.attrs.gid_index)).copied();
        if dev.mtu != self.attrs.port_mtu || gid_now != Some(self.attrs.gid) {
            return Err(VerbsError::RenewRefused(format!(
                "device {} changed: MTU {} / GID {:?} now, {} / {} when opened",
                dev.name, dev.mtu, gid_now, self.attrs.port_mtu, self.attrs.gid
            )));
        }
        let qpn = topo.next_qpn;
        if qpn > MAX_QPN {
            return Err(VerbsError::verb("ibv_create_qp", libc::ENOMEM));
        }
        let qp = Arc::new(self.qp.renumbered(qpn));
        topo.next_qpn = qpn + 1;
        topo.qps.remove(&self.qp.qpn);
        // The new QP joins the old one's groups, which it then leaves.
        for g in &self.groups {
            let members = topo.groups.entry(*g).or_default();
            members.push(Arc::clone(&qp));
            members.retain(|m| m.qpn != self.qp.qpn);
        }
        topo.qps.insert(qpn, Arc::clone(&qp));
        drop(topo);
        let mut old = SimRetired {
            qpn: self.qp.qpn,
            at: Instant::now(),
            fabric: Arc::clone(&self.fabric),
            gone: None,
        };
        let mut gone = None;
        match mode {
            OldQp::Destroy => old.destroy()?,
            OldQp::Retire => self.retired.retire(Instant::now(), old)?,
            OldQp::Defer => {
                let (signal, waiter) = gone_pair();
                old.gone = Some(signal);
                gone = Some(waiter);
                self.retired
                    .retire_for(Instant::now(), crate::verbs::retire::CQ_GRACE, old)?;
            }
        }
        // The completion channel stays: a watched one now hears the new QP.
        let waker = lock(&self.qp.state).waker.take();
        lock(&qp.state).waker = waker;
        self.qp = qp;
        self.attrs.qpn = qpn;
        self.polled.clear();
        self.recreated = [false; 2];
        self.fabric
            .endpoint_restarts
            .fetch_add(1, Ordering::Relaxed);
        Ok(gone)
    }
}

impl Drop for SimEndpoint {
    /// Removes the QP and its multicast attachments from the fabric: later sends to it
    /// count as unknown destinations.
    fn drop(&mut self) {
        let mut topo = write(&self.fabric.topo);
        topo.qps.remove(&self.qp.qpn);
        for g in &self.groups {
            detach(&mut topo, g, self.qp.qpn);
        }
        drop(topo);
        lock(&self.qp.state).waker = None;
        let _ = self.retired.close();
    }
}
