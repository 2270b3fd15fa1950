//! Asynchronous events: the verbs async fd (device fatal, port and QP/CQ events, told
//! apart as the live objects' or a retired or spare one's) and the rdma_cm removal
//! watcher, mapped to [`AsyncEvent`]; a device loss is remembered (see the module docs of
//! the endpoint).

use std::os::raw::{c_int, c_void};
use std::ptr;

use crate::verbs::rdma::ffi::*;

use super::super::cm::{self, CM_EVENT_DEVICE_REMOVAL};
use super::super::objects::last_errno;
use super::RdmaEndpoint;
#[cfg(doc)]
use crate::verbs::Endpoint;
use crate::verbs::{AsyncEvent, VerbsError};

impl RdmaEndpoint {
    /// [`Endpoint::next_async_event`]: the verbs async fd first, then rdma_cm; a device
    /// loss is remembered.
    pub(super) fn next_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
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
        // A CQ `recreate_cq` replaced but could not destroy is still the live QP's: its
        // errors are the live QP's.
        let abandoned = self
            .abandoned
            .iter()
            .any(|(_, cq)| cq.as_ptr().cast::<c_void>() == element);
        let owner = if live.contains(&element) || abandoned {
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
}

/// `ibv_async_event` with the event type read as a plain integer: the bindings declare
/// it a Rust enum, and a kernel newer than the headers they came from may report a value
/// outside it.
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

#[cfg(test)]
mod tests {
    use super::*;

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
        use crate::verbs::rdma::ffi::ibv_event_type as t;
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
            assert_eq!(
                element_kind(ty as u32),
                Element::Object,
                "event type {}",
                ty as u32
            );
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
            assert_eq!(
                element_kind(ty as u32),
                Element::None,
                "event type {}",
                ty as u32
            );
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
}
