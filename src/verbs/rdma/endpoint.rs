//! [`RdmaEndpoint`]: one UD QP with its CQs, channel, memory and address handles.
//!
//! The datapath calls (`post_recv`, `post_send`, `poll_cq`) allocate nothing: work
//! requests, SGEs and work completions are built in arrays sized at open time.
//!
//! Device loss. Two signals end an endpoint's device: `IBV_EVENT_DEVICE_FATAL` on the
//! verbs async fd (drivers with disassociate support, e.g. mlx5; later verbs fail with
//! `EIO`), and rdma_cm's `DEVICE_REMOVAL` on the removal watcher (`super::cm`; the only
//! signal rxe gives when its link is deleted). Both reach the caller through
//! [`Endpoint::next_async_event`] (both fds are in [`WaitFds::events`], one wait covers both) as
//! [`AsyncEvent::DeviceFatal`] / [`AsyncEvent::DeviceRemoved`], and the endpoint remembers
//! the loss: from then on `EIO` from a destroy or detach means "already destroyed"
//! ([`RdmaProvider::teardown_already_gone`](super::RdmaProvider::teardown_already_gone)),
//! not a teardown error. On removal the caller must drop the endpoint promptly: the
//! kernel's removal (and the operator's `rdma link delete`) waits until every verbs
//! context on the device is closed. The endpoint never blocks in `ibv_get_cq_event` /
//! `ibv_get_async_event` (both fds are nonblocking and only read through `&mut self`), so
//! no read of those fds can run while it tears down.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::raw::{c_int, c_void};
use std::ptr;
use std::sync::Arc;
use std::time::Instant;

use rdma_sys::*;

use super::cm::{self, CM_EVENT_DEVICE_REMOVAL, RemovalWatcher};
use super::device::{self, GidChoice, LINK_LAYER_ETHERNET};
use super::objects::{
    Ah, CompChannel, Context, Cq, Mr, Pd, Qp, QpRequest, Region, SlotLayout, TeardownLog,
    last_errno, ret_errno, set_nonblocking, zeroed,
};
use crate::verbs::retire::{Destroy, RETIRE_GRACE, RETIRED_CAP, Reaper, RetireQueue};
use crate::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    GrhKind, PostRecvError, PostSendError, RecvWr, SendWr, VerbsError, WaitFds, WcStatus,
};

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
        // No event of the old CQs is left unacknowledged: `take_cq_events_of`
        // acknowledges the events of any CQ at once, and the kernel drops unread ones.
        let recv = self.recv_cq.close();
        let send = self.send_cq.close();
        tracing::debug!(
            qp_ms,
            total_ms = start.elapsed().as_secs_f64() * 1e3,
            "retired QP and CQs destroyed"
        );
        qp.and(recv).and(send)
    }
}

impl Retired {
    /// Whether the async event element `ptr` is this QP or one of its CQs.
    fn owns(&self, ptr: *mut c_void) -> bool {
        [
            self.qp.as_ptr().cast::<c_void>(),
            self.recv_cq.as_ptr().cast(),
            self.send_cq.as_ptr().cast(),
        ]
        .contains(&ptr)
    }
}

/// A UD QP in RTS on its own two CQs, made ahead of a renewal by `maintain` and not used
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
    /// What it was opened with (`renew` re-reads the port and GID table against it).
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
    torn_down: bool,
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
    /// The QPs and CQs that renewals replaced, until their grace is over (see
    /// [`crate::verbs::retire`]), destroyed by whoever holds the reaper (never the
    /// poller); first to go in a teardown: they depend on the PD, channel and context
    /// like the live ones.
    retired: Arc<RetireQueue<Retired>>,
    /// The QP and CQs the next renewal will use, prepared by `maintain`.
    spare: Option<Queues>,
    /// Creating the spare failed since the last renewal: `maintain` does not retry.
    spare_refused: bool,
    mcast: Vec<McastJoin>,
    ahs: Vec<Option<Ah>>,
    qp: Qp,
    recv_cq: Cq,
    send_cq: Cq,
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
    /// Open the device and build a ready endpoint (see [`crate::verbs::Provider::open`]).
    pub(super) fn open(cfg: &EndpointConfig, log: TeardownLog) -> Result<Self, VerbsError> {
        if cfg.recv_slots == 0 {
            return Err(VerbsError::Invalid {
                field: "recv_slots",
                why: "must be at least 1".into(),
            });
        }
        if cfg.send_slots == 0 {
            return Err(VerbsError::Invalid {
                field: "send_slots",
                why: "must be at least 1".into(),
            });
        }
        if cfg.port == 0 {
            return Err(VerbsError::BadPort {
                device: cfg.device.clone(),
                port: 0,
                why: "port numbers start at 1".into(),
            });
        }

        // Locals are declared in creation order, so an early return drops (destroys)
        // them in reverse: QP, CQs, channel, MR, PD, memory, context.
        let ctx = device::open_by_name(&cfg.device, &log)?;
        let port = device::query_port(&ctx, &cfg.device, cfg.port)?;
        device::check_link_layer(&cfg.device, cfg.port, port.link_layer)?;
        let gid = device::choose_gid(&ctx, &cfg.device, cfg.port, port.gid_tbl_len, cfg.gid_index)?;
        let max_payload = match cfg.max_payload {
            None => port.mtu,
            Some(0) => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: "max_payload must be at least 1 byte".into(),
                });
            }
            Some(p) if p > port.mtu => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: format!(
                        "max_payload {p} exceeds the active MTU {} of {} port {}",
                        port.mtu, cfg.device, cfg.port
                    ),
                });
            }
            Some(p) => p,
        };
        let layout = SlotLayout::new(cfg.recv_slots, cfg.send_slots, max_payload)?;
        let recv_sge_len = u32::try_from(layout.recv_len).map_err(|_| VerbsError::Invalid {
            field: "mtu",
            why: "receive slot exceeds 4 GiB".into(),
        })?;
        let total = layout.total_len().ok_or_else(|| VerbsError::Invalid {
            field: "recv_slots/send_slots",
            why: "buffer region does not fit in memory".into(),
        })?;
        let region = Region::map(total)?;
        let pd = Pd::alloc(&ctx, &log)?;
        let mr = Mr::register(&pd, &region, &log)?;
        let channel = CompChannel::create(&ctx, &log)?;
        set_nonblocking(ctx.async_fd(), "fcntl(O_NONBLOCK) on the async event fd")?;
        let recv_cq = Cq::create(&ctx, cfg.recv_slots, &channel, &log)?;
        let send_cq = Cq::create(&ctx, cfg.send_slots, &channel, &log)?;
        let mut req = QpRequest {
            max_send_wr: cfg.send_slots,
            max_recv_wr: cfg.recv_slots,
            max_inline_data: REQUESTED_MAX_INLINE,
        };
        let (qp, caps) = match Qp::create_ud(&pd, &send_cq, &recv_cq, &req, &log) {
            Ok(created) => created,
            Err(e) => {
                tracing::debug!(error = %e, "UD QP with inline data refused; retrying without");
                req.max_inline_data = 0;
                Qp::create_ud(&pd, &send_cq, &recv_cq, &req, &log)?
            }
        };
        bring_up(&qp, cfg)?;
        let watcher = open_watcher(&ctx, cfg, &gid)?;

        let attrs = EndpointAttrs {
            device: cfg.device.clone(),
            port: cfg.port,
            qpn: qp.qp_num(),
            gid: gid.gid,
            gid_index: gid.index,
            grh_kind: grh_kind(&gid),
            max_payload,
            port_mtu: port.mtu,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            // What the device granted (it may round the request up); 0 if the QP was
            // created without inline.
            max_inline: if req.max_inline_data == 0 {
                0
            } else {
                caps.max_inline_data
            },
        };
        tracing::info!(
            device = %attrs.device, port = attrs.port, qpn = attrs.qpn, gid = %attrs.gid,
            gid_index = attrs.gid_index, gid_type = ?gid.gid_type, grh = ?attrs.grh_kind,
            mtu = attrs.port_mtu, max_payload = attrs.max_payload,
            max_inline = attrs.max_inline, removal_watcher = watcher.is_some(),
            "verbs endpoint open"
        );
        let send_n = usize::try_from(cfg.send_slots).unwrap_or(usize::MAX);
        let recv_n = usize::try_from(cfg.recv_slots).unwrap_or(usize::MAX);
        let wc_n = usize::try_from(cfg.recv_slots.max(cfg.send_slots)).unwrap_or(usize::MAX);
        Ok(RdmaEndpoint {
            attrs,
            cfg: cfg.clone(),
            log,
            link_layer: port.link_layer,
            layout,
            recv_sge_len,
            recvs_in_flight: 0,
            sends_in_flight: 0,
            torn_down: false,
            lost: None,
            send_wrs: (0..send_n).map(|_| zeroed()).collect(),
            send_sges: (0..send_n).map(|_| zeroed()).collect(),
            recv_wrs: (0..recv_n).map(|_| zeroed()).collect(),
            recv_sges: (0..recv_n).map(|_| zeroed()).collect(),
            wcs: (0..wc_n).map(|_| zeroed()).collect(),
            watcher,
            retired: Arc::new(RetireQueue::new(RETIRE_GRACE, RETIRED_CAP)),
            spare: None,
            spare_refused: false,
            mcast: Vec::new(),
            ahs: Vec::new(),
            qp,
            recv_cq,
            send_cq,
            channel,
            mr,
            pd,
            ctx,
            region,
        })
    }

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

    /// Record that the device is gone (see the module docs).
    fn note_loss(&mut self, ev: AsyncEvent) {
        if matches!(ev, AsyncEvent::DeviceFatal | AsyncEvent::DeviceRemoved) {
            if self.lost.is_none() {
                tracing::warn!(device = %self.attrs.device, event = ?ev, "verbs device lost");
            }
            self.lost.get_or_insert(ev);
            self.log.mark_device_lost();
        }
    }

    /// The next event of the verbs async fd, `None` when none is pending. Once the device
    /// is lost, `EIO`/`ENODEV` from the fd (a disassociated context) also read as none.
    fn next_verbs_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        let mut ev = RawAsyncEvent {
            element: RawAsyncElement {
                ptr: ptr::null_mut(),
            },
            event_type: 0,
        };
        let raw: *mut ibv_async_event = (&mut ev as *mut RawAsyncEvent).cast();
        // SAFETY: the context is live and its async fd nonblocking; `raw` points to
        // storage of the size and alignment of `ibv_async_event` (asserted above) whose
        // type field is read back as a plain integer.
        let ret = unsafe { ibv_get_async_event(self.ctx.as_ptr(), raw) };
        if ret != 0 {
            return match last_errno() {
                libc::EAGAIN | libc::EINTR => Ok(None),
                libc::EIO | libc::ENODEV if self.lost.is_some() => Ok(None),
                e => Err(VerbsError::verb("ibv_get_async_event", e)),
            };
        }
        // SAFETY: the 8 bytes were initialised (null) above and the kernel wrote the
        // element; any bit pattern is a valid c_int, meaningful for port events, and a
        // valid pointer value, compared (never dereferenced) for QP and CQ events.
        let (port_num, element) = unsafe { (ev.element.port_num, ev.element.ptr) };
        let mapped = map_async_event(ev.event_type, port_num, self.attrs.port);
        let mapped = match element_kind(ev.event_type) {
            Element::None => mapped,
            Element::Object => self.match_object(ev.event_type, element, mapped),
        };
        // SAFETY: `raw` holds the event just returned, acknowledged exactly once (a QP or
        // CQ with unacknowledged events cannot be destroyed).
        unsafe { ibv_ack_async_event(raw) };
        tracing::debug!(event_type = ev.event_type, ?mapped, "verbs async event");
        Ok(Some(mapped))
    }

    /// Which of this endpoint's objects a QP or CQ event's `element` is: the live QP or
    /// CQs keep the event `mapped`; any other (a retired or spare one) makes it
    /// [`AsyncEvent::NotLive`].
    fn match_object(
        &self,
        event_type: u32,
        element: *mut c_void,
        mapped: AsyncEvent,
    ) -> AsyncEvent {
        let live = [
            self.qp.as_ptr().cast::<c_void>(),
            self.recv_cq.as_ptr().cast(),
            self.send_cq.as_ptr().cast(),
        ];
        let owner = if live.contains(&element) {
            Owner::Live
        } else if self.retired.any(|r| r.owns(element)) {
            Owner::Retired
        } else if self.spare.as_ref().is_some_and(|q| {
            [
                q.qp.as_ptr().cast::<c_void>(),
                q.recv_cq.as_ptr().cast(),
                q.send_cq.as_ptr().cast(),
            ]
            .contains(&element)
        }) {
            Owner::Spare
        } else {
            Owner::Unknown
        };
        classify(event_type, mapped, owner)
    }

    /// The next rdma_cm event of the removal watcher, `None` when none is pending (or
    /// there is no watcher).
    fn next_cm_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        let Some(w) = self.watcher.as_mut() else {
            return Ok(None);
        };
        let Some(ev) = w.next_event()? else {
            return Ok(None);
        };
        let mapped = cm::map_cm_event(ev.event);
        if ev.event == CM_EVENT_DEVICE_REMOVAL {
            tracing::info!(device = %self.attrs.device, "rdma_cm: DEVICE_REMOVAL");
        } else {
            tracing::debug!(
                event = ev.event,
                status = ev.status,
                ?mapped,
                "rdma_cm event"
            );
        }
        Ok(Some(mapped))
    }

    /// Read every pending completion event, acknowledge them, and count those for `recv`
    /// and `send` (the endpoint's CQs, or during a renewal the old ones).
    fn take_cq_events_of(
        &mut self,
        recv: *mut ibv_cq,
        send: *mut ibv_cq,
    ) -> Result<(u32, u32), VerbsError> {
        let (mut n_recv, mut n_send) = (0u32, 0u32);
        let mut failure = None;
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut cq_ctx: *mut c_void = ptr::null_mut();
            // SAFETY: the channel is live and its fd nonblocking; both out-pointers are
            // valid. No other thread reads this channel (`&mut self`).
            let ret = unsafe { ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut cq_ctx) };
            if ret != 0 {
                match last_errno() {
                    libc::EAGAIN => break,
                    libc::EINTR => continue,
                    e => {
                        failure = Some(VerbsError::verb("ibv_get_cq_event", e));
                        break;
                    }
                }
            }
            if cq == recv {
                n_recv = n_recv.saturating_add(1);
            } else if cq == send {
                n_send = n_send.saturating_add(1);
            } else if !cq.is_null() {
                // Another CQ of this channel: one a renewal retired (events of its last
                // completions may still come until it is destroyed). Acknowledge it at
                // once so that destroying it never waits; it means nothing to the
                // current QP.
                // SAFETY: only this endpoint's CQs use this channel, and a CQ whose
                // events are not all acknowledged is still live: ibv_destroy_cq, also
                // when the reaper thread runs it concurrently, waits for every event the
                // kernel reported to be acknowledged, and the kernel drops the unread
                // events of a destroyed CQ; so `cq` is live.
                unsafe { ibv_ack_cq_events(cq, 1) };
            }
        }
        // Acknowledge in batch, on the error path too: an unacknowledged event makes
        // ibv_destroy_cq wait forever.
        for (cq, n) in [(recv, n_recv), (send, n_send)] {
            if n > 0 {
                // SAFETY: the CQ is live and `n` events were taken for it above.
                unsafe { ibv_ack_cq_events(cq, n) };
            }
        }
        match failure {
            None => Ok((n_recv, n_send)),
            Some(e) => Err(e),
        }
    }

    /// A receive and a send CQ on the endpoint's channel and a UD QP on them in RTS, as
    /// at open (the same depths and inline request).
    fn create_queues(&self) -> Result<Queues, VerbsError> {
        let recv_cq = Cq::create(&self.ctx, self.attrs.recv_slots, &self.channel, &self.log)?;
        let send_cq = Cq::create(&self.ctx, self.attrs.send_slots, &self.channel, &self.log)?;
        let req = QpRequest {
            max_send_wr: self.attrs.send_slots,
            max_recv_wr: self.attrs.recv_slots,
            max_inline_data: if self.attrs.max_inline == 0 {
                0
            } else {
                REQUESTED_MAX_INLINE
            },
        };
        let (qp, caps) = Qp::create_ud(&self.pd, &send_cq, &recv_cq, &req, &self.log)?;
        bring_up(&qp, &self.cfg)?;
        Ok(Queues {
            qp,
            recv_cq,
            send_cq,
            max_inline: if req.max_inline_data == 0 {
                0
            } else {
                caps.max_inline_data
            },
        })
    }

    /// [`Endpoint::maintain`]: prepare the spare queues (the retired ones are the
    /// reaper's).
    fn maintain_queues(&mut self) -> Result<(), VerbsError> {
        if self.spare.is_none() && !self.spare_refused && self.lost.is_none() && !self.torn_down {
            let start = Instant::now();
            match self.create_queues() {
                Ok(q) => {
                    self.spare = Some(q);
                    tracing::debug!(
                        ms = start.elapsed().as_secs_f64() * 1e3,
                        "spare QP and CQs prepared for the next renewal"
                    );
                }
                Err(e) => {
                    // Not an error of the datapath: the next renewal creates its own.
                    // Not retried every housekeeping; a renewal allows one more try.
                    self.spare_refused = true;
                    tracing::warn!(error = %e, "no spare QP and CQs: the next renewal creates them");
                }
            }
        }
        Ok(())
    }

    /// [`Endpoint::renew`]: new CQs and QP are created, brought up and attached to the
    /// endpoint's multicast groups while the old ones still exist, and swapped in only
    /// when all of that worked; then the old QP is detached and kept aside with its CQs
    /// (`retired`) until the reaper destroys it. The new QP and CQs are the spare ones
    /// `maintain` prepared, if it did.
    /// On any failure before the swap nothing changes; a failed destroy of the old objects is logged, counted and returned (the
    /// object is forgotten, the new ones are in place).
    /// With `destroy_old`, the old QP and CQs are destroyed here, before returning, instead
    /// of being retired (see [`Endpoint::renew_destroying_old`]).
    fn renew_queues(&mut self, destroy_old: bool) -> Result<(), VerbsError> {
        if let Some(ev) = self.lost {
            return Err(VerbsError::RenewRefused(format!(
                "the device was lost ({ev:?})"
            )));
        }
        if self.torn_down {
            return Err(VerbsError::RenewRefused("the endpoint is closed".into()));
        }
        // Where the time goes (logged): each step's end, from `t0`.
        let t0 = Instant::now();
        let mut marks = [0.0f64; 5];
        let mut mark = |i: usize| marks[i] = t0.elapsed().as_secs_f64() * 1e3;
        // Nothing is destroyed here: the retired queues are the reaper's.
        let mut first: Option<VerbsError> = None;
        mark(0);
        // Re-read the port and the GID table (they move after port flaps and re-adds):
        // the registered slots are sized for the old MTU and the GID is our address.
        let cfg = &self.cfg;
        let port = device::query_port(&self.ctx, &cfg.device, cfg.port)?;
        let gid = device::choose_gid(
            &self.ctx,
            &cfg.device,
            cfg.port,
            port.gid_tbl_len,
            cfg.gid_index,
        )?;
        if port.mtu != self.attrs.port_mtu
            || gid.gid != self.attrs.gid
            || gid.index != self.attrs.gid_index
            || grh_kind(&gid) != self.attrs.grh_kind
        {
            return Err(VerbsError::RenewRefused(format!(
                "port MTU {} / GID {} at index {} now, {} / {} at index {} when opened",
                port.mtu,
                gid.gid,
                gid.index,
                self.attrs.port_mtu,
                self.attrs.gid,
                self.attrs.gid_index
            )));
        }
        mark(1);
        // The queues prepared ahead (`maintain`), else new ones now.
        let spare_used = self.spare.is_some();
        let Queues {
            qp,
            recv_cq,
            send_cq,
            max_inline,
        } = match self.spare.take() {
            Some(q) => q,
            None => self.create_queues()?,
        };
        self.spare_refused = false;
        mark(2);
        // The new QP joins every group before the old one leaves, so the device's group
        // never empties: no multicast filter update on the netdev (rxe), and the IP-level
        // memberships are kept as they are.
        for (i, join) in self.mcast.iter().enumerate() {
            let g = raw_gid(&join.gid);
            // SAFETY: the new QP is live; `g` is a valid GID; LID 0 (RoCE has no LIDs).
            let ret = unsafe { ibv_attach_mcast(qp.as_ptr(), &g, 0) };
            if ret != 0 {
                // Leave the new QP as unattached as it came, so that it can be destroyed.
                for done in &self.mcast[..i] {
                    let _ = self
                        .log
                        .destroyed("ibv_detach_mcast", detach_raw(&qp, &done.gid));
                }
                return Err(VerbsError::verb("ibv_attach_mcast", ret_errno(ret)));
            }
        }
        mark(3);
        let mut keep = |r: Result<(), VerbsError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        let old_qp = std::mem::replace(&mut self.qp, qp);
        let old_recv = std::mem::replace(&mut self.recv_cq, recv_cq);
        let old_send = std::mem::replace(&mut self.send_cq, send_cq);
        // rxe refuses to destroy a QP that is still attached (EBUSY): detach first.
        for join in &self.mcast {
            keep(
                self.log
                    .destroyed("ibv_detach_mcast", detach_raw(&old_qp, &join.gid)),
            );
        }
        mark(4);
        if destroy_old {
            // The old QP may still own slots that are about to be re-posted: it goes now,
            // QP first (it holds its CQs), then the CQs, never polled. This runs on the
            // supervisor's thread (a restart), never on the poller's.
            let mut old = Retired {
                qp: old_qp,
                recv_cq: old_recv,
                send_cq: old_send,
            };
            keep(old.qp.close());
            keep(old.recv_cq.close());
            keep(old.send_cq.close());
        } else {
            // The old QP (in the error state with every WR flushed, in no group, never
            // polled again) and its CQs are destroyed later, by the reaper, once their
            // grace is over: off the restart's critical path and off the poller thread,
            // and after rxe has let go of the QP's packets.
            keep(self.retired.retire(
                Instant::now(),
                Retired {
                    qp: old_qp,
                    recv_cq: old_recv,
                    send_cq: old_send,
                },
            ));
        }
        self.recvs_in_flight = 0;
        self.sends_in_flight = 0;
        let old_qpn = self.attrs.qpn;
        self.attrs.qpn = self.qp.qp_num();
        self.attrs.max_inline = max_inline;
        let [prev_ms, port_ms, queues_ms, attach_ms, detach_ms] = marks;
        tracing::debug!(
            device = %self.attrs.device, old_qpn, qpn = self.attrs.qpn, spare_used,
            prev_ms, port_ms, queues_ms, attach_ms, detach_ms,
            "verbs endpoint renewed: new QP and CQs, context, PD, MR and channel kept \
             (ms since the start of the renewal at the end of each step)"
        );
        match first {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn teardown(&mut self) -> Result<(), VerbsError> {
        if self.torn_down {
            return Ok(());
        }
        self.torn_down = true;
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

    /// The IP-level multicast membership that RoCE needs next to `ibv_attach_mcast`.
    ///
    /// Seen on rxe (Linux 6.1): attaching `::ffff:239.1.1.1` returns 0, but rxe adds
    /// only the IPv6-style MAC `33:33:ef:01:01:01` to the netdev (`ip maddr`), and with
    /// the join below disabled no packet of the group arrived in the lab. The IPv4 group
    /// joined by a UDP socket on the interface that owns our GID's address adds
    /// `01:00:5e:01:01:01` and the IP membership; it is left when the socket closes.
    fn ip_join(&self, group: &Gid) -> Result<Option<UdpSocket>, VerbsError> {
        if self.link_layer != LINK_LAYER_ETHERNET {
            return Ok(None);
        }
        let fail = |verb: &'static str| move |source: io::Error| VerbsError::Verb { verb, source };
        if let Some(v4) = group.as_ipv4() {
            let iface = self.attrs.gid.as_ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED);
            let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
                .map_err(fail("bind (multicast join)"))?;
            sock.join_multicast_v4(&v4, &iface)
                .map_err(fail("IP_ADD_MEMBERSHIP"))?;
            return Ok(Some(sock));
        }
        let ifindex = device::gid_netdev(&self.attrs.device, self.attrs.port, self.attrs.gid_index)
            .and_then(|ndev| device::ifindex(&ndev))
            .unwrap_or(0);
        let sock =
            UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)).map_err(fail("bind (multicast join)"))?;
        sock.join_multicast_v6(&Ipv6Addr::from(group.0), ifindex)
            .map_err(fail("IPV6_ADD_MEMBERSHIP"))?;
        Ok(Some(sock))
    }
}

impl Drop for RdmaEndpoint {
    fn drop(&mut self) {
        // Every failure was logged and counted by teardown.
        let _ = self.teardown();
    }
}

/// RESET → INIT (P_Key index 0, port, Q_Key) → RTR → RTS (SQ PSN 0): a UD QP's bring-up.
fn bring_up(qp: &Qp, cfg: &EndpointConfig) -> Result<(), VerbsError> {
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = cfg.port;
    attr.qkey = cfg.qkey;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_QKEY,
        "ibv_modify_qp(INIT)",
    )?;
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE,
        "ibv_modify_qp(RTR)",
    )?;
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
    attr.sq_psn = 0;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
        "ibv_modify_qp(RTS)",
    )
}

fn grh_kind(gid: &GidChoice) -> GrhKind {
    if gid.is_ipv4_rocev2() {
        GrhKind::Ipv4
    } else {
        GrhKind::Ipv6
    }
}

fn raw_gid(gid: &Gid) -> ibv_gid {
    ibv_gid { raw: gid.0 }
}

/// `ibv_detach_mcast`'s return value (0 or an error code).
fn detach_raw(qp: &Qp, gid: &Gid) -> c_int {
    let g = raw_gid(gid);
    // SAFETY: the QP is live (detach happens before it is closed); `g` is a valid GID.
    unsafe { ibv_detach_mcast(qp.as_ptr(), &g, 0) }
}

/// Set up the removal watcher for the endpoint's GID, or log why not and run without.
/// A watcher that the kernel bound to another device or port than the one opened is an
/// error: its removal events would be another device's, and this one's would go unseen.
fn open_watcher(
    ctx: &Context,
    cfg: &EndpointConfig,
    gid: &GidChoice,
) -> Result<Option<RemovalWatcher>, VerbsError> {
    let scope_id = device::gid_netdev(&cfg.device, cfg.port, gid.index)
        .and_then(|ndev| device::ifindex(&ndev))
        .unwrap_or(0);
    let addr = cm::bind_addr(&gid.gid, scope_id);
    let (watcher, bound) = match RemovalWatcher::open(&addr) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                device = %cfg.device, %addr, error = %e,
                "no rdma_cm removal watcher: a device removal is detected only on drivers \
                 that report DEVICE_FATAL (rxe does not)"
            );
            return Ok(None);
        }
    };
    let bound_name = bound.ibdev_index.and_then(device::name_by_index);
    check_binding(cfg, &addr, ctx.identity(), &bound, bound_name.as_deref())?;
    tracing::debug!(%addr, ibdev_index = ?bound.ibdev_index, "rdma_cm removal watcher bound");
    Ok(Some(watcher))
}

/// Whether the watcher's binding (`bound`, on the device called `bound_name` if known) is
/// the opened device (`own`: node GUID and kernel index) and port; else an error naming
/// both devices.
fn check_binding(
    cfg: &EndpointConfig,
    addr: &std::net::SocketAddr,
    own: (u64, Option<u32>),
    bound: &cm::Binding,
    bound_name: Option<&str>,
) -> Result<(), VerbsError> {
    let (guid, index) = own;
    let same_index = match (index, bound.ibdev_index) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    if bound.node_guid == guid && same_index && bound.port == cfg.port {
        return Ok(());
    }
    let other = match bound_name {
        Some(name) => name.to_string(),
        None => format!("with node GUID {:016x}", u64::from_be(bound.node_guid)),
    };
    Err(VerbsError::BadPort {
        device: cfg.device.clone(),
        port: cfg.port,
        why: format!(
            "the address {addr} of its GID belongs to device {other} port {} for rdma_cm, \
             not to {} port {}: the removal watcher would report device {other}'s removal, \
             and {}'s would go unseen (give {} a GID of its own, or pick another gid_index)",
            bound.port, cfg.device, cfg.port, cfg.device, cfg.device
        ),
    })
}

/// A work completion in the provider-independent form.
fn completion(wc: &ibv_wc) -> Completion {
    Completion {
        wr_id: wc.wr_id,
        status: match wc.status {
            ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            other => WcStatus::Error(other),
        },
        byte_len: wc.byte_len,
        src_qp: wc.src_qp,
        has_grh: wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0,
    }
}

/// `ibv_async_event` with the event type read as a plain integer: rdma-sys declares it
/// a Rust enum, and a kernel newer than its bindings may report a value outside it.
#[repr(C)]
struct RawAsyncEvent {
    element: RawAsyncElement,
    event_type: u32,
}

#[repr(C)]
union RawAsyncElement {
    ptr: *mut c_void,
    port_num: c_int,
}

const _: () = assert!(
    std::mem::size_of::<RawAsyncEvent>() == std::mem::size_of::<ibv_async_event>()
        && std::mem::align_of::<RawAsyncEvent>() == std::mem::align_of::<ibv_async_event>()
);

// `ibv_event_type` values (stable ABI of <infiniband/verbs.h>).
const EV_CQ_ERR: u32 = 0;
const EV_QP_FATAL: u32 = 1;
const EV_QP_REQ_ERR: u32 = 2;
const EV_QP_ACCESS_ERR: u32 = 3;
const EV_DEVICE_FATAL: u32 = 8;
const EV_PORT_ACTIVE: u32 = 9;
const EV_PORT_ERR: u32 = 10;

/// `IBV_EVENT_GID_CHANGE`.
const EV_GID_CHANGE: u32 = 18;

/// What an async event's element names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Element {
    /// A QP, CQ, SRQ or WQ (`element.qp` / `.cq` / `.srq` / `.wq`).
    Object,
    /// A port number, or nothing (`DEVICE_FATAL`).
    None,
}

/// The element of an event of type `t` (`<infiniband/verbs.h>`, `ibv_event_type`):
/// CQ_ERR, the QP events (0..=7), the SRQ events, QP_LAST_WQE_REACHED and WQ_FATAL name an
/// object; DEVICE_FATAL, the port events (PORT_ACTIVE, PORT_ERR, LID_CHANGE, PKEY_CHANGE,
/// SM_CHANGE, CLIENT_REREGISTER, GID_CHANGE) a port or nothing.
fn element_kind(t: u32) -> Element {
    match t {
        0..=7 | 14..=16 | 19 => Element::Object,
        _ => Element::None,
    }
}

/// Whose object an event names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Owner {
    /// The live QP or one of the live CQs.
    Live,
    /// A QP or CQ a renewal replaced, waiting for its grace.
    Retired,
    /// The spare QP or CQs made ahead.
    Spare,
    /// None of the above: a retired one the reaper has taken out of the queue and is
    /// destroying (its destroy waits for this event's acknowledgement). Never the live
    /// QP or CQs, which are compared first.
    Unknown,
}

/// An object event: `mapped` for the live objects, else [`AsyncEvent::NotLive`].
fn classify(event_type: u32, mapped: AsyncEvent, owner: Owner) -> AsyncEvent {
    match owner {
        Owner::Live => mapped,
        Owner::Retired | Owner::Spare | Owner::Unknown => AsyncEvent::NotLive(event_type),
    }
}

/// Map an async event; port events of another port are `Other`.
fn map_async_event(event_type: u32, port_num: c_int, our_port: u8) -> AsyncEvent {
    let ours = port_num == c_int::from(our_port);
    match event_type {
        EV_DEVICE_FATAL => AsyncEvent::DeviceFatal,
        EV_CQ_ERR => AsyncEvent::CqError,
        EV_QP_FATAL | EV_QP_REQ_ERR | EV_QP_ACCESS_ERR => AsyncEvent::QpFatal,
        EV_PORT_ERR if ours => AsyncEvent::PortDown,
        EV_PORT_ACTIVE if ours => AsyncEvent::PortUp,
        EV_GID_CHANGE if ours => AsyncEvent::GidChange,
        other => AsyncEvent::Other(other),
    }
}

/// How many leading work requests of `wrs` can be posted while at most `room` signalled
/// sends may be added.
fn signaled_prefix(wrs: &[SendWr], room: u32) -> usize {
    let mut left = room;
    for (i, w) in wrs.iter().enumerate() {
        if w.signaled {
            if left == 0 {
                return i;
            }
            left -= 1;
        }
    }
    wrs.len()
}

/// A verbs work request as a chain links it: to its SGE and to the next request.
trait Chained {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self);
}

impl Chained for ibv_recv_wr {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self) {
        self.sg_list = sge;
        self.next = next;
    }
}

impl Chained for ibv_send_wr {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self) {
        self.sg_list = sge;
        self.next = next;
    }
}

/// Link `wrs[..n]` into one chain, the i-th request to `sges[i]`, and return its head.
/// The pointers are taken once from each array and written through, so the chain stays
/// valid for the post that follows as long as the arrays are not touched in between.
fn link_chain<W: Chained>(wrs: &mut [W], sges: &mut [ibv_sge], n: usize) -> *mut W {
    let n = n.min(wrs.len()).min(sges.len());
    let wr_base = wrs.as_mut_ptr();
    let sge_base = sges.as_mut_ptr();
    for i in 0..n {
        // SAFETY: `i < n <= len` of both arrays, so every pointer is in bounds; no other
        // reference to either array is alive while the chain is written.
        unsafe {
            let next = if i + 1 < n {
                wr_base.add(i + 1)
            } else {
                ptr::null_mut()
            };
            (*wr_base.add(i)).link(sge_base.add(i), next);
        }
    }
    wr_base
}

/// How many work requests of a chain starting at `base` (length `n`) precede `bad`, the
/// first one the provider did not post. `None` when `bad` is not in the chain.
fn posted_before<T>(base: *const T, bad: *const T, n: usize) -> Option<usize> {
    let size = std::mem::size_of::<T>();
    let delta = (bad as usize).checked_sub(base as usize)?;
    (delta % size == 0 && delta / size < n).then_some(delta / size)
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

    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        let len = self.layout.send_len;
        match self.layout.send_offset(slot) {
            Some(off) => self.region.slice_mut(off, len).unwrap_or(&mut []),
            None => &mut [],
        }
    }

    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        if self.recvs_in_flight >= self.attrs.recv_slots {
            // Full: see `sends_in_flight`.
            return Err(VerbsError::verb("ibv_post_recv", libc::ENOMEM));
        }
        let off = self
            .layout
            .recv_offset(slot)
            .ok_or_else(|| VerbsError::Invalid {
                field: "slot",
                why: format!("receive slot {slot} of {}", self.attrs.recv_slots),
            })?;
        let mut sge = ibv_sge {
            addr: self.region.addr(off),
            length: self.recv_sge_len,
            lkey: self.mr.lkey(),
        };
        let mut wr: ibv_recv_wr = zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` outlive the call (the provider copies
        // them); the SGE covers one receive slot inside the MR.
        let ret = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            self.recvs_in_flight += 1;
            Ok(())
        } else {
            Err(VerbsError::verb("ibv_post_recv", ret_errno(ret)))
        }
    }

    fn post_recv_chain(&mut self, wrs: &[RecvWr]) -> Result<(), PostRecvError> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        let reject = |error| Err(PostRecvError { posted: 0, error });
        // Only as many as the receive CQ has room for (see `sends_in_flight`).
        let room = self.attrs.recv_slots.saturating_sub(self.recvs_in_flight) as usize;
        let fit = n.min(room).min(self.recv_wrs.len());
        if fit == 0 {
            return reject(VerbsError::verb("ibv_post_recv", libc::ENOMEM));
        }
        let lkey = self.mr.lkey();
        // Validate and fill the scratch arrays; nothing is posted if any WR is invalid.
        for (i, w) in wrs[..fit].iter().enumerate() {
            let Some(off) = self.layout.recv_offset(w.slot) else {
                return reject(VerbsError::Invalid {
                    field: "slot",
                    why: format!("receive slot {} of {}", w.slot, self.attrs.recv_slots),
                });
            };
            self.recv_sges[i] = ibv_sge {
                addr: self.region.addr(off),
                length: self.recv_sge_len,
                lkey,
            };
            let wr = &mut self.recv_wrs[i];
            wr.wr_id = w.wr_id;
            wr.num_sge = 1;
        }
        let wr_base = link_chain(&mut self.recv_wrs, &mut self.recv_sges, fit);
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain of `fit` WRs and their SGEs lies in arrays
        // that outlive the call (the provider copies them); every SGE covers one receive
        // slot inside the MR.
        let ret = unsafe { ibv_post_recv(self.qp.as_ptr(), wr_base, &mut bad) };
        if ret == 0 {
            self.recvs_in_flight += fit as u32;
            return if fit == n {
                Ok(())
            } else {
                Err(PostRecvError {
                    posted: fit,
                    error: VerbsError::verb("ibv_post_recv", libc::ENOMEM),
                })
            };
        }
        let Some(posted) = posted_before(wr_base, bad, fit) else {
            // Nothing says how many were posted: all of them may be, so all are taken as
            // posted (reaped once the QP is destroyed), and the interface restarts.
            self.recvs_in_flight += fit as u32;
            return Err(PostRecvError {
                posted: fit,
                error: VerbsError::BadWrOutsideChain {
                    verb: "ibv_post_recv",
                    source: io::Error::from_raw_os_error(ret_errno(ret)),
                },
            });
        };
        self.recvs_in_flight += posted as u32;
        Err(PostRecvError {
            posted,
            error: VerbsError::verb("ibv_post_recv", ret_errno(ret)),
        })
    }

    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        let reject = |error| Err(PostSendError { posted: 0, error });
        if n > self.send_wrs.len() {
            return reject(VerbsError::Invalid {
                field: "post_send",
                why: format!(
                    "chain of {n} exceeds the send queue ({})",
                    self.send_wrs.len()
                ),
            });
        }
        let lkey = self.mr.lkey();
        let max_inline = self.attrs.max_inline;
        // Validate and fill the scratch arrays; nothing is posted if any WR is invalid.
        for (i, w) in wrs.iter().enumerate() {
            let Some(off) = self.layout.send_offset(w.slot) else {
                return reject(VerbsError::Invalid {
                    field: "slot",
                    why: format!("send slot {} of {}", w.slot, self.attrs.send_slots),
                });
            };
            if w.len > self.attrs.max_payload {
                return reject(VerbsError::Invalid {
                    field: "len",
                    why: format!(
                        "send of {} bytes exceeds max_payload {}",
                        w.len, self.attrs.max_payload
                    ),
                });
            }
            let Some(ah) = self.ah_ptr(w.dest.ah) else {
                return reject(VerbsError::UnknownAh(w.dest.ah));
            };
            self.send_sges[i] = ibv_sge {
                addr: self.region.addr(off),
                length: w.len,
                lkey,
            };
            let mut flags = 0;
            if w.signaled {
                flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if max_inline > 0 && w.len <= max_inline {
                flags |= ibv_send_flags::IBV_SEND_INLINE.0;
            }
            let wr = &mut self.send_wrs[i];
            wr.wr_id = w.wr_id;
            wr.num_sge = 1;
            wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
            wr.send_flags = flags;
            wr.wr = wr_t {
                ud: ud_t {
                    ah,
                    remote_qpn: w.dest.qpn,
                    remote_qkey: w.dest.qkey,
                },
            };
        }
        // Post only the prefix whose signalled sends fit in the send CQ (see `sends_in_flight`).
        let room = self.attrs.send_slots.saturating_sub(self.sends_in_flight);
        let fit = signaled_prefix(wrs, room);
        if fit == 0 {
            return reject(VerbsError::verb("ibv_post_send", libc::ENOMEM));
        }
        let wr_base = link_chain(&mut self.send_wrs, &mut self.send_sges, fit);
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain of `fit` WRs and their SGEs lies in arrays
        // that outlive the call; every SGE covers part of one send slot inside the MR and
        // every AH is live and owned by this endpoint.
        let ret = unsafe { ibv_post_send(self.qp.as_ptr(), wr_base, &mut bad) };
        let signaled = |wrs: &[SendWr]| wrs.iter().filter(|w| w.signaled).count() as u32;
        if ret == 0 {
            self.sends_in_flight += signaled(&wrs[..fit]);
            return if fit == n {
                Ok(())
            } else {
                Err(PostSendError {
                    posted: fit,
                    error: VerbsError::verb("ibv_post_send", libc::ENOMEM),
                })
            };
        }
        let Some(posted) = posted_before(wr_base, bad, fit) else {
            // As for receives: all of the chain is taken as posted, and the interface
            // restarts.
            self.sends_in_flight += signaled(&wrs[..fit]);
            return Err(PostSendError {
                posted: fit,
                error: VerbsError::BadWrOutsideChain {
                    verb: "ibv_post_send",
                    source: io::Error::from_raw_os_error(ret_errno(ret)),
                },
            });
        };
        self.sends_in_flight += signaled(&wrs[..posted]);
        Err(PostSendError {
            posted,
            error: VerbsError::verb("ibv_post_send", ret_errno(ret)),
        })
    }

    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError> {
        let n = out.len().min(self.wcs.len()).min(c_int::MAX as usize);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the CQ is live; `wcs` has room for `n` completions.
        let ret = unsafe { ibv_poll_cq(self.cq(cq), n as c_int, self.wcs.as_mut_ptr()) };
        if ret < 0 {
            return Err(VerbsError::PollFailed { cq, ret });
        }
        let got = usize::try_from(ret).unwrap_or(0).min(n);
        let in_flight = match cq {
            CqKind::Recv => &mut self.recvs_in_flight,
            CqKind::Send => &mut self.sends_in_flight,
        };
        // Saturating: flushed unsignalled sends complete too.
        *in_flight = in_flight.saturating_sub(got as u32);
        for (o, wc) in out.iter_mut().zip(&self.wcs[..got]) {
            *o = completion(wc);
        }
        Ok(got)
    }

    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        // SAFETY: the CQ is live; 0 = notify on any completion, not only solicited.
        let ret = unsafe { ibv_req_notify_cq(self.cq(cq), 0) };
        if ret == 0 {
            Ok(())
        } else {
            Err(VerbsError::verb("ibv_req_notify_cq", ret_errno(ret)))
        }
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
        // The verbs async fd first (DEVICE_FATAL, port and QP events), then rdma_cm.
        let ev = match self.next_verbs_event()? {
            Some(ev) => Some(ev),
            None => self.next_cm_event()?,
        };
        if let Some(ev) = ev {
            self.note_loss(ev);
        }
        Ok(ev)
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
        if !gid.is_multicast() {
            return Err(VerbsError::Invalid {
                field: "multicast gid",
                why: format!("{gid} is not a multicast GID"),
            });
        }
        if self.mcast.iter().any(|j| j.gid == *gid) {
            return Ok(());
        }
        let g = raw_gid(gid);
        // SAFETY: the QP is live; `g` is a valid GID; LID 0 (RoCE has no LIDs).
        let ret = unsafe { ibv_attach_mcast(self.qp.as_ptr(), &g, 0) };
        if ret != 0 {
            return Err(VerbsError::verb("ibv_attach_mcast", ret_errno(ret)));
        }
        match self.ip_join(gid) {
            Ok(ip_member) => {
                self.mcast.push(McastJoin {
                    gid: *gid,
                    _ip_member: ip_member,
                });
                Ok(())
            }
            Err(e) => {
                let undo = detach_raw(&self.qp, gid);
                if undo != 0 {
                    let undo = VerbsError::verb("ibv_detach_mcast", ret_errno(undo));
                    tracing::warn!(
                        error = %undo, group = %gid,
                        "detach after a failed IP join failed"
                    );
                }
                Err(e)
            }
        }
    }

    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        let Some(i) = self.mcast.iter().position(|j| j.gid == *gid) else {
            return Err(VerbsError::Invalid {
                field: "multicast gid",
                why: format!("{gid} is not attached"),
            });
        };
        // On failure the group stays listed, so teardown tries again before the QP goes.
        // After a device loss, EIO means the attachment went with the device.
        self.log
            .excused("ibv_detach_mcast", detach_raw(&self.qp, gid))?;
        self.mcast.swap_remove(i);
        Ok(())
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

    fn renew(&mut self) -> Result<(), VerbsError> {
        self.renew_queues(false)
    }

    fn renew_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.renew_queues(true)
    }

    fn maintain(&mut self) -> Result<(), VerbsError> {
        self.maintain_queues()
    }

    fn reaper(&self) -> Option<Arc<dyn Reaper>> {
        let r: Arc<dyn Reaper> = self.retired.clone();
        Some(r)
    }

    fn gid_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        if self.lost.is_some() || self.torn_down {
            return Ok(None);
        }
        let cfg = &self.cfg;
        let port = device::query_port(&self.ctx, &cfg.device, cfg.port)?;
        match device::choose_gid(
            &self.ctx,
            &cfg.device,
            cfg.port,
            port.gid_tbl_len,
            cfg.gid_index,
        ) {
            Ok(g) => Ok(Some((g.gid, g.index))),
            Err(VerbsError::NoGid { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wc_mapping() {
        let mut wc: ibv_wc = zeroed();
        wc.wr_id = 7;
        wc.byte_len = 140;
        wc.src_qp = 17;
        wc.wc_flags = ibv_wc_flags::IBV_WC_GRH.0;
        assert_eq!(
            completion(&wc),
            Completion {
                wr_id: 7,
                status: WcStatus::Success,
                byte_len: 140,
                src_qp: 17,
                has_grh: true
            }
        );
        wc.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        wc.wc_flags = 0;
        let c = completion(&wc);
        assert_eq!((c.status, c.has_grh), (WcStatus::Flushed, false));
        wc.status = ibv_wc_status::IBV_WC_LOC_LEN_ERR;
        assert_eq!(completion(&wc).status, WcStatus::Error(1));
    }

    #[test]
    fn async_event_mapping() {
        assert_eq!(map_async_event(8, 0, 1), AsyncEvent::DeviceFatal);
        assert_eq!(map_async_event(0, 0, 1), AsyncEvent::CqError);
        for t in [1, 2, 3] {
            assert_eq!(map_async_event(t, 0, 1), AsyncEvent::QpFatal);
        }
        assert_eq!(map_async_event(10, 1, 1), AsyncEvent::PortDown);
        assert_eq!(map_async_event(9, 1, 1), AsyncEvent::PortUp);
        assert_eq!(map_async_event(9, 2, 1), AsyncEvent::Other(9));
        assert_eq!(map_async_event(18, 1, 1), AsyncEvent::GidChange);
        assert_eq!(map_async_event(18, 2, 1), AsyncEvent::Other(18));
        assert_eq!(map_async_event(99, 1, 1), AsyncEvent::Other(99));
    }

    #[test]
    fn object_events_count_only_for_the_live_objects() {
        // The types that name a QP or CQ, from <infiniband/verbs.h>.
        use rdma_sys::ibv_event_type as t;
        for ty in [
            t::IBV_EVENT_CQ_ERR,
            t::IBV_EVENT_QP_FATAL,
            t::IBV_EVENT_QP_REQ_ERR,
            t::IBV_EVENT_QP_ACCESS_ERR,
            t::IBV_EVENT_COMM_EST,
            t::IBV_EVENT_SQ_DRAINED,
            t::IBV_EVENT_PATH_MIG,
            t::IBV_EVENT_PATH_MIG_ERR,
            t::IBV_EVENT_SRQ_ERR,
            t::IBV_EVENT_SRQ_LIMIT_REACHED,
            t::IBV_EVENT_QP_LAST_WQE_REACHED,
            t::IBV_EVENT_WQ_FATAL,
        ] {
            assert_eq!(element_kind(ty as u32), Element::Object, "{ty:?}");
        }
        for ty in [
            t::IBV_EVENT_DEVICE_FATAL,
            t::IBV_EVENT_PORT_ACTIVE,
            t::IBV_EVENT_PORT_ERR,
            t::IBV_EVENT_LID_CHANGE,
            t::IBV_EVENT_PKEY_CHANGE,
            t::IBV_EVENT_SM_CHANGE,
            t::IBV_EVENT_CLIENT_REREGISTER,
            t::IBV_EVENT_GID_CHANGE,
        ] {
            assert_eq!(element_kind(ty as u32), Element::None, "{ty:?}");
        }
        assert_eq!(EV_GID_CHANGE, t::IBV_EVENT_GID_CHANGE as u32);
        // A QP_FATAL: a restart only when it is the live QP's.
        let fatal = map_async_event(EV_QP_FATAL, 0, 1);
        assert_eq!(
            classify(EV_QP_FATAL, fatal, Owner::Live),
            AsyncEvent::QpFatal
        );
        for owner in [Owner::Retired, Owner::Spare, Owner::Unknown] {
            assert_eq!(
                classify(EV_QP_FATAL, fatal, owner),
                AsyncEvent::NotLive(EV_QP_FATAL),
                "{owner:?}"
            );
        }
        let cq = map_async_event(EV_CQ_ERR, 0, 1);
        assert_eq!(classify(EV_CQ_ERR, cq, Owner::Live), AsyncEvent::CqError);
        assert_eq!(
            classify(EV_CQ_ERR, cq, Owner::Retired),
            AsyncEvent::NotLive(EV_CQ_ERR)
        );
    }

    #[test]
    fn signaled_prefix_counts_only_signalled() {
        let wr = |signaled| SendWr {
            wr_id: 0,
            slot: 0,
            len: 0,
            dest: crate::verbs::Dest {
                ah: AhHandle(0),
                qpn: 0,
                qkey: 0,
            },
            signaled,
        };
        let chain = [wr(true), wr(false), wr(true), wr(true)];
        assert_eq!(signaled_prefix(&chain, 0), 0);
        assert_eq!(signaled_prefix(&chain, 1), 2);
        assert_eq!(signaled_prefix(&chain, 2), 3);
        assert_eq!(signaled_prefix(&chain, 3), 4);
        assert_eq!(signaled_prefix(&[wr(false)], 0), 1);
    }

    #[test]
    fn bad_wr_offsets() {
        let wrs: Vec<ibv_send_wr> = (0..4).map(|_| zeroed()).collect();
        let base = wrs.as_ptr();
        assert_eq!(posted_before(base, base, 4), Some(0));
        assert_eq!(posted_before(base, base.wrapping_add(3), 4), Some(3));
        assert_eq!(posted_before(base, base.wrapping_add(4), 4), None);
        assert_eq!(posted_before(base, ptr::null(), 4), None);
        let odd = (base as usize + 1) as *const ibv_send_wr;
        assert_eq!(posted_before(base, odd, 4), None);
    }

    #[test]
    fn a_watcher_bound_to_another_device_is_an_error_naming_both() {
        let cfg = EndpointConfig {
            device: "rxe0".into(),
            port: 1,
            gid_index: None,
            qkey: 1,
            recv_slots: 8,
            send_slots: 8,
            max_payload: None,
        };
        let addr: std::net::SocketAddr = "198.18.0.1:0".parse().unwrap();
        let own = (0x1122_u64.to_be(), Some(3));
        let ours = cm::Binding {
            node_guid: 0x1122_u64.to_be(),
            ibdev_index: Some(3),
            port: 1,
        };
        assert!(check_binding(&cfg, &addr, own, &ours, Some("rxe0")).is_ok());
        // A kernel that does not report the index: the GUID and port decide.
        let no_index = cm::Binding {
            ibdev_index: None,
            ..ours
        };
        assert!(check_binding(&cfg, &addr, own, &no_index, None).is_ok());
        for other in [
            cm::Binding {
                ibdev_index: Some(4),
                ..ours
            },
            cm::Binding {
                node_guid: 0x3344_u64.to_be(),
                ibdev_index: Some(4),
                port: 1,
            },
            cm::Binding { port: 2, ..ours },
        ] {
            let e = check_binding(&cfg, &addr, own, &other, Some("mlx5_1"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("rxe0") && e.contains("mlx5_1"), "{e}");
            assert!(e.contains("198.18.0.1"), "{e}");
        }
        let unnamed = cm::Binding {
            node_guid: 0x3344_u64.to_be(),
            ibdev_index: None,
            port: 1,
        };
        let e = check_binding(&cfg, &addr, own, &unnamed, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node GUID 0000000000003344"), "{e}");
    }

    #[test]
    fn a_chain_links_each_request_to_its_sge_and_the_next() {
        let mut wrs: Vec<ibv_recv_wr> = (0..4).map(|_| zeroed()).collect();
        let mut sges: Vec<ibv_sge> = (0..4).map(|_| zeroed()).collect();
        let head = link_chain(&mut wrs, &mut sges, 3);
        assert_eq!(head, wrs.as_mut_ptr());
        let sge_base = sges.as_mut_ptr();
        for (i, wr) in wrs[..3].iter().enumerate() {
            assert_eq!(wr.sg_list, sge_base.wrapping_add(i));
        }
        let base = wrs.as_mut_ptr();
        assert_eq!(wrs[0].next, base.wrapping_add(1));
        assert_eq!(wrs[1].next, base.wrapping_add(2));
        assert!(wrs[2].next.is_null(), "the chain ends at n");
        // The request past the chain is left as it was.
        assert!(wrs[3].sg_list.is_null() && wrs[3].next.is_null());
        // n beyond the arrays links what there is.
        let mut short: Vec<ibv_sge> = (0..2).map(|_| zeroed()).collect();
        let mut send: Vec<ibv_send_wr> = (0..4).map(|_| zeroed()).collect();
        link_chain(&mut send, &mut short, 4);
        assert!(send[1].next.is_null() && send[2].sg_list.is_null());
    }
}
