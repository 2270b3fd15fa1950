//! [`RdmaEndpoint`]: one UD QP with its CQs, channel, memory and address handles.
//!
//! The datapath calls (`post_recv`, `post_send`, `poll_cq`) allocate nothing: work
//! requests, SGEs and work completions are built in arrays sized at open time.
//!
//! Device loss. Two signals end an endpoint's device: `IBV_EVENT_DEVICE_FATAL` on the
//! verbs async fd (drivers with disassociate support, e.g. mlx5; later verbs fail with
//! `EIO`), and rdma_cm's `DEVICE_REMOVAL` on the removal watcher (`super::cm`; the only
//! signal rxe gives when its link is deleted). Both reach the caller through
//! [`Endpoint::next_async_event`] (both fds are in [`WaitFds::events`]: one wait covers
//! both) as [`AsyncEvent::DeviceFatal`] / [`AsyncEvent::DeviceRemoved`], and the endpoint
//! remembers the loss: from then on `EIO` from a destroy or detach means "already
//! destroyed"
//! ([`RdmaProvider::teardown_already_gone`](super::RdmaProvider::teardown_already_gone)),
//! not a teardown error. On removal the caller must drop the endpoint promptly: the
//! kernel's removal (and the operator's `rdma link delete`) waits until every verbs
//! context on the device is closed. The endpoint never blocks in `ibv_get_cq_event` /
//! `ibv_get_async_event` (both fds are nonblocking and only read through `&mut self`), so
//! no read of those fds can run while it tears down.
//!
//! The files, by concern: `open` (open, bring-up, the removal watcher), `datapath` (post,
//! poll, arm, completion events), `events` (asynchronous events), `renewal` (new QP and
//! CQs, the spare, the GID check), `multicast` (group attachments and IP memberships);
//! here the types, the teardown, address handles and the [`Endpoint`] implementation,
//! which hands each call to its concern.

mod datapath;
mod events;
mod multicast;
mod open;
mod renewal;

use std::io;
use std::net::UdpSocket;
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::Instant;

use crate::verbs::rdma::ffi::*;

use super::cm::RemovalWatcher;
use super::objects::{
    Ah, CompChannel, Context, Cq, Mr, Pd, Qp, Region, SlotLayout, TeardownLog, zeroed,
};
use crate::verbs::retire::{Destroy, Gone, GoneSignal, OldQp, Reaper, RetireQueue};
use crate::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    PostRecvError, PostSendError, RecvWr, SendWr, VerbsError, WaitFds,
};
use multicast::detach_raw;

/// Inline data asked for at QP creation: enough for ARP and TCP ACK sized IPoIB packets,
/// which then skip the DMA read of the send slot. The device may grant more, less or
/// refuse (then the QP is created without inline).
const REQUESTED_MAX_INLINE: u32 = 128;

/// Hop limit of every address handle (RoCEv2 puts it in the IP TTL / hop limit): the
/// common IP default, ample for any data-centre path.
const AH_HOP_LIMIT: u8 = 64;

/// A QP and its CQs replaced by a renewal, waiting out their grace period (see
/// [`crate::verbs::retire`]) before they are destroyed: the QP is in the error state and
/// in no multicast group, and nothing polls the CQs. A QP in the error
/// state processes no incoming packet (IBA; rxe drops them), so the slot memory its
/// receive queue still names is never written through it.
struct Retired {
    qp: Qp,
    recv_cq: Cq,
    send_cq: Cq,
    /// CQs the QP was created on that `recreate_cq` replaced and the device would not
    /// destroy while the QP used them: they go after it.
    abandoned: Vec<Cq>,
    /// For a QP whose slots wait for it to go ([`Endpoint::restart_deferring_old`]):
    /// dropped as soon as the QP is destroyed, before its CQs.
    gone: Option<GoneSignal>,
}

// SAFETY: the QP and CQs are owned by this value alone and libibverbs objects may be
// destroyed from any thread; the context, PD and channel they depend on outlive them
// (the endpoint's teardown closes the queue, which waits for a destroy in progress,
// before it closes those).
unsafe impl Send for Retired {}

impl Destroy for Retired {
    /// The QP first, then its CQs. A failure is logged and counted by the teardown log
    /// (the objects are forgotten either way); the first is returned.
    fn destroy(mut self) -> Result<(), VerbsError> {
        let start = Instant::now();
        let qp = self.qp.close();
        let qp_ms = start.elapsed().as_secs_f64() * 1e3;
        // The QP writes into no slot any more (destroyed, or forgotten after a failed
        // destroy): whoever waits for its slots may reap them now.
        drop(self.gone.take());
        // No event of the old CQs is left unacknowledged: `take_cq_events_of`
        // acknowledges the events of any CQ at once, and the kernel drops unread ones.
        let recv = self.recv_cq.close();
        let send = self.send_cq.close();
        let mut abandoned = Ok(());
        for cq in &mut self.abandoned {
            abandoned = abandoned.and(cq.close());
        }
        tracing::debug!(
            qp_ms,
            total_ms = start.elapsed().as_secs_f64() * 1e3,
            "retired QP and CQs destroyed"
        );
        qp.and(recv).and(send).and(abandoned)
    }

    fn awaited(&self) -> bool {
        self.gone.is_some()
    }
}

impl Retired {
    /// Whether the async event element `ptr` is this QP or one of its CQs (a QP destroyed
    /// at its renewal, whose CQs wait here alone, owns nothing any more).
    fn owns(&self, ptr: *mut c_void) -> bool {
        let mine = [
            self.qp.as_ptr().cast::<c_void>(),
            self.recv_cq.as_ptr().cast(),
            self.send_cq.as_ptr().cast(),
        ];
        !ptr.is_null()
            && (mine.contains(&ptr) || self.abandoned.iter().any(|cq| cq.as_ptr().cast() == ptr))
    }
}

/// A UD QP in RTS on its own two CQs, made ahead of a renewal by `prepare_spare` and not used
/// until then: nothing posted, in no group, the CQs not armed.
struct Queues {
    qp: Qp,
    recv_cq: Cq,
    send_cq: Cq,
    /// The inline size the QP was granted (0 without inline).
    max_inline: u32,
}

/// One multicast group the QP is attached to.
struct McastJoin {
    gid: Gid,
    /// On RoCE, the IP-level membership that makes the NIC and the IP stack accept the
    /// group's packets (rxe attaches at the verbs level only); left on drop.
    _ip_member: Option<UdpSocket>,
}

/// The real [`Endpoint`] over libibverbs. See the module docs of [`crate::verbs`].
///
/// Dropping it tears everything down in order (the removal watcher's rdma_cm id and fd,
/// multicast detaches, AHs, QP, CQs, channel, MR, PD, context, then the memory);
/// [`RdmaEndpoint::close`] does the same and returns the first failure.
pub struct RdmaEndpoint {
    attrs: EndpointAttrs,
    /// What it was opened with (`restart` re-reads the port and the endpoint's GID entry
    /// against it).
    cfg: EndpointConfig,
    log: TeardownLog,
    link_layer: u8,
    layout: SlotLayout,
    /// `layout.recv_len` as the SGE length.
    recv_sge_len: u32,
    /// Receives posted whose completion has not been polled yet.
    recvs_in_flight: u32,
    /// Signalled sends posted whose completion has not been polled yet.
    ///
    /// Both counters guard against CQ overflow. A CQ is created with `send_slots` /
    /// `recv_slots` entries, but the device frees a send-queue entry when it *generates*
    /// the completion, not when it is polled: seen on rxe (Linux 6.1), two chains of 8
    /// signalled sends on a QP and CQ of depth 8, with no poll in between, were both
    /// accepted and only 15 of the 16 completions ever arrived (CQ overflow). So the
    /// endpoint bounds what can wait in each CQ: at most `send_slots` signalled sends
    /// and `recv_slots` receives whose completions have not been polled. Beyond that
    /// `post_send` posts the prefix that fits and `post_recv` refuses, both with
    /// `ENOMEM`, as a full device queue would.
    sends_in_flight: u32,
    closed: bool,
    /// The event that told this endpoint its device is gone (`DeviceFatal` or
    /// `DeviceRemoved`); the teardown log knows too.
    lost: Option<AsyncEvent>,
    // Scratch arrays for the datapath, sized at open.
    send_wrs: Vec<ibv_send_wr>,
    send_sges: Vec<ibv_sge>,
    recv_wrs: Vec<ibv_recv_wr>,
    recv_sges: Vec<ibv_sge>,
    wcs: Vec<ibv_wc>,
    // Verbs objects, in teardown order (`teardown` closes them in this order; should it
    // be skipped, field drop order is the same).
    /// rdma_cm id bound to the GID's address; `None` when it could not be set up (then
    /// removal is seen only through DEVICE_FATAL, on drivers that send it). First to go:
    /// the kernel's removal waits for it before it waits for the verbs contexts.
    watcher: Option<RemovalWatcher>,
    /// The QPs and CQs that endpoint_restarts replaced, until their grace is over (see
    /// [`crate::verbs::retire`]), destroyed by whoever holds the reaper (never the
    /// poller); first to go in a teardown: they depend on the PD, channel and context
    /// like the live ones.
    retired: Arc<RetireQueue<Retired>>,
    /// The QP and CQs the next renewal will use, prepared by `prepare_spare`.
    spare: Option<Queues>,
    /// Creating the spare failed since the last renewal: `prepare_spare` does not retry.
    spare_refused: bool,
    mcast: Vec<McastJoin>,
    ahs: Vec<Option<Ah>>,
    qp: Qp,
    recv_cq: Cq,
    send_cq: Cq,
    /// The QP's own CQs that `recreate_cq` replaced and the device kept (the QP still
    /// completes into them; nothing polls them): destroyed after the QP.
    abandoned: Vec<(CqKind, Cq)>,
    channel: CompChannel,
    mr: Mr,
    pd: Pd,
    ctx: Context,
    /// Unmapped last, after the MR that covers it is gone.
    region: Region,
}

// SAFETY: the raw pointers inside (verbs objects, scratch work requests) are owned by
// this endpoint alone and libibverbs objects may be used from any thread; the endpoint is
// used by one thread at a time (`&mut self` on every verb, no `Sync`).
unsafe impl Send for RdmaEndpoint {}

impl RdmaEndpoint {
    /// Tear down now and say whether every step worked (the first failure is returned;
    /// every failure is also logged and counted). Dropping does the same silently.
    pub fn close(mut self) -> Result<(), VerbsError> {
        self.teardown()
    }

    /// Failed teardown steps counted so far by the provider that opened this endpoint.
    pub fn teardown_errors(&self) -> u64 {
        self.log.count()
    }

    /// Destroys taken as already done after a device loss, counted so far by the provider
    /// that opened this endpoint (see [`super::RdmaProvider::teardown_already_gone`]).
    pub fn teardown_already_gone(&self) -> u64 {
        self.log.already_gone()
    }

    /// The event that reported this endpoint's device gone ([`AsyncEvent::DeviceFatal`]
    /// or [`AsyncEvent::DeviceRemoved`]), if any has been read.
    pub fn device_lost(&self) -> Option<AsyncEvent> {
        self.lost
    }

    /// Whether the rdma_cm removal watcher is running (without it, a removal is seen only
    /// on drivers that send `DEVICE_FATAL`; rxe does not).
    pub fn watches_removal(&self) -> bool {
        self.watcher.is_some()
    }

    fn teardown(&mut self) -> Result<(), VerbsError> {
        if self.closed {
            return Ok(());
        }
        self.closed = true;
        let mut first: Option<VerbsError> = None;
        let mut keep = |r: Result<(), VerbsError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        // First the rdma_cm id: on a removal the kernel finishes with the cm ids before it
        // waits for the verbs contexts. Its failure is logged by close; it is not a verbs
        // object, so not counted.
        if let Some(mut w) = self.watcher.take() {
            let _ = w.close();
        }
        keep(self.retired.close());
        if let Some(mut q) = self.spare.take() {
            keep(q.qp.close());
            keep(q.recv_cq.close());
            keep(q.send_cq.close());
        }
        // rxe refuses to destroy a QP that is still attached (EBUSY): detach first.
        for join in std::mem::take(&mut self.mcast) {
            keep(
                self.log
                    .destroyed("ibv_detach_mcast", detach_raw(&self.qp, &join.gid)),
            );
        }
        for ah in std::mem::take(&mut self.ahs).iter_mut().flatten() {
            keep(ah.close());
        }
        keep(self.qp.close());
        // No CQ event is left unacknowledged: take_cq_events acks what it reads.
        keep(self.recv_cq.close());
        keep(self.send_cq.close());
        for (_, mut cq) in std::mem::take(&mut self.abandoned) {
            keep(cq.close());
        }
        keep(self.channel.close());
        keep(self.mr.close());
        keep(self.pd.close());
        keep(self.ctx.close());
        match first {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn cq(&self, kind: CqKind) -> *mut ibv_cq {
        match kind {
            CqKind::Recv => self.recv_cq.as_ptr(),
            CqKind::Send => self.send_cq.as_ptr(),
        }
    }

    fn ah_ptr(&self, h: AhHandle) -> Option<*mut ibv_ah> {
        let i = usize::try_from(h.0).ok()?;
        self.ahs.get(i)?.as_ref().map(Ah::as_ptr)
    }
}

impl Drop for RdmaEndpoint {
    fn drop(&mut self) {
        // Every failure was logged and counted by teardown.
        let _ = self.teardown();
    }
}

fn raw_gid(gid: &Gid) -> ibv_gid {
    ibv_gid { raw: gid.0 }
}

impl Endpoint for RdmaEndpoint {
    fn attrs(&self) -> &EndpointAttrs {
        &self.attrs
    }

    fn recv_buf(&self, slot: u32) -> &[u8] {
        // An out-of-range slot (a caller bug) reads as empty rather than panicking.
        self.layout
            .recv_offset(slot)
            .and_then(|off| self.region.slice(off, self.layout.recv_len))
            .unwrap_or(&[])
    }

    fn recv_buf_mut(&mut self, slot: u32) -> &mut [u8] {
        let len = self.layout.recv_len;
        self.layout
            .recv_offset(slot)
            .and_then(|off| self.region.slice_mut(off, len))
            .unwrap_or(&mut [])
    }

    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        let len = self.layout.send_len;
        self.layout
            .send_offset(slot)
            .and_then(|off| self.region.slice_mut(off, len))
            .unwrap_or(&mut [])
    }

    fn send_room(&mut self, slot: u32) -> &mut [u8] {
        let len = self.layout.send_room_len();
        self.layout
            .send_room_offset(slot)
            .and_then(|off| self.region.slice_mut(off, len))
            .unwrap_or(&mut [])
    }

    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        self.post_one_recv(wr_id, slot)
    }

    fn post_recv_chain(&mut self, wrs: &[RecvWr]) -> Result<(), PostRecvError> {
        self.post_recv_list(wrs)
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        self.post_send_list(wrs)
    }

    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError> {
        self.poll_into(cq, out)
    }

    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        self.arm_cq(cq)
    }

    /// The completion channel, the device's async event fd and, when there is one, the
    /// rdma_cm removal watcher (drained by `next_async_event` with the async fd). All of
    /// them are the endpoint's for its whole life: nothing to make or close here.
    fn watch(&mut self) -> io::Result<WaitFds> {
        let mut events = vec![self.ctx.async_fd()];
        events.extend(self.watcher.as_ref().map(|w| w.fd()));
        Ok(WaitFds {
            cq: vec![self.channel.fd()],
            events,
        })
    }

    fn unwatch(&mut self) {}

    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError> {
        let (recv, send) = (self.recv_cq.as_ptr(), self.send_cq.as_ptr());
        self.take_cq_events_of(recv, send)
    }

    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        self.next_event()
    }

    fn create_ah(&mut self, gid: &Gid) -> Result<AhHandle, VerbsError> {
        let mut attr: ibv_ah_attr = zeroed();
        attr.grh = ibv_global_route {
            dgid: raw_gid(gid),
            flow_label: 0,
            sgid_index: self.attrs.gid_index,
            hop_limit: AH_HOP_LIMIT,
            traffic_class: 0,
        };
        attr.is_global = 1;
        attr.port_num = self.attrs.port;
        // Handles of destroyed AHs are reused: the caller drops a handle when it destroys
        // the AH (see `Endpoint::destroy_ah`).
        let free = self.ahs.iter().position(Option::is_none);
        let index = free.unwrap_or(self.ahs.len());
        let handle = AhHandle(u32::try_from(index).map_err(|_| VerbsError::Invalid {
            field: "address handles",
            why: "more than 2^32 address handles".into(),
        })?);
        let ah = Ah::create(&self.pd, &mut attr, &self.log)?;
        match free {
            Some(i) => self.ahs[i] = Some(ah),
            None => self.ahs.push(Some(ah)),
        }
        Ok(handle)
    }

    fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        let slot = usize::try_from(ah.0)
            .ok()
            .and_then(|i| self.ahs.get_mut(i))
            .and_then(Option::take);
        match slot {
            Some(mut owned) => owned.close(),
            None => Err(VerbsError::UnknownAh(ah)),
        }
    }

    fn attach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.attach_group(gid)
    }

    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.detach_group(gid)
    }

    fn set_qp_error(&mut self) -> Result<(), VerbsError> {
        let mut attr: ibv_qp_attr = zeroed();
        attr.qp_state = ibv_qp_state::IBV_QPS_ERR;
        self.qp.modify(
            &mut attr,
            ibv_qp_attr_mask::IBV_QP_STATE,
            "ibv_modify_qp(ERR)",
        )
    }

    fn restart(&mut self) -> Result<(), VerbsError> {
        self.restart_queues(OldQp::Retire).map(drop)
    }

    fn recreate_cq(&mut self, cq: CqKind) -> Result<crate::verbs::CqRecreated, VerbsError> {
        self.recreate_one_cq(cq)
    }

    fn restart_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.restart_queues(OldQp::Destroy).map(drop)
    }

    fn restart_deferring_old(&mut self) -> Result<Gone, VerbsError> {
        self.restart_queues(OldQp::Defer)
            .map(|gone| gone.unwrap_or_else(Gone::already))
    }

    fn prepare_spare(&mut self) -> Result<(), VerbsError> {
        self.maintain_queues()
    }

    fn reaper(&self) -> Option<Arc<dyn Reaper>> {
        let r: Arc<dyn Reaper> = self.retired.clone();
        Some(r)
    }

    fn gid_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        self.gid_choice_now()
    }
}
