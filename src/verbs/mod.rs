//! The verbs boundary.
//!
//! Everything above this module talks to an RDMA device through the [`Provider`] and
//! [`Endpoint`] traits defined here, never through libibverbs types. Two providers exist:
//! [`rdma::RdmaProvider`] over libibverbs (the FFI; with [`crate::sys`], the only code
//! allowed `unsafe`), and `sim::SimFabric`, a
//! deterministic in-process fabric that is a test double for tests and benches (nothing
//! measured "over rxe" uses it). The simulated fabric is compiled
//! only with the `sim` feature, which the tests, benches and examples turn on and the
//! daemon's release build does not.
//!
//! An [`Endpoint`] bundles what one IPoIB-like interface needs on one port: protection
//! domain, registered buffer memory (receive and send slots), one completion channel, a
//! receive CQ and a send CQ, one UD QP in RTS, and the address handles created on it. It
//! owns them all; dropping it destroys them in the right order (AHs, multicast
//! attachments, QP, CQs, channel, MR, PD). Destroy failures are logged and counted, never
//! a panic. [`Endpoint::restart`] replaces only the QP and the CQs, keeping the device
//! context, PD, registered memory and completion channel: what a restart after anything
//! but a device loss needs (opening a context and registering the receive ring are most
//! of a full open's cost under emulation, see docs/PERFORMANCE.md).
//!
//! Rules this module keeps:
//! - a verb's failure is a typed [`VerbsError`] naming the verb; no raw errno or `ibv_wc`
//!   escapes;
//! - `poll_cq` returns `Ok(n)` for `n >= 0` completions and `Err(VerbsError::PollFailed)`
//!   for a negative return: the caller must not retry (see the supervisor);
//! - work-request ids are opaque to the provider: it hands them back unchanged.

pub mod fault;
pub mod rdma;
pub mod retire;
#[cfg(feature = "sim")]
pub mod sim;

use std::io;
use std::os::fd::RawFd;
use std::sync::Arc;

pub use crate::wire::gid::Gid;
pub use crate::wire::grh::{GRH_LEN, GrhKind};

/// Which of the endpoint's two completion queues.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CqKind {
    /// Receive completions.
    Recv,
    /// Send completions.
    Send,
}

/// What [`Endpoint::recreate_cq`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CqRecreated {
    /// The old CQ was destroyed. `false`: the device refused (the QP still uses it), so
    /// it is kept, unpolled, until the QP goes.
    pub old_destroyed: bool,
    /// Why the old CQ was kept, when it was (e.g. `ibv_destroy_cq: EBUSY`).
    pub refusal: Option<String>,
    /// Completions the old CQ may still receive that nothing will poll: whether the QP
    /// still completes into a CQ other than the one polled now.
    pub qp_bound_elsewhere: bool,
}

/// Outcome of one work request, as reported by a completion.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WcStatus {
    /// The work request completed.
    Success,
    /// The QP was in the error state: the request was flushed, not executed.
    Flushed,
    /// Any other failure; the value is the provider's status code (`ibv_wc_status`).
    Error(u32),
}

/// One completion, provider independent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The id given when the work request was posted, unchanged.
    pub wr_id: u64,
    /// What happened.
    pub status: WcStatus,
    /// Bytes received, including the 40-byte GRH when `has_grh` (receives only).
    pub byte_len: u32,
    /// The sender's QP number (receives only).
    pub src_qp: u32,
    /// Whether the first [`GRH_LEN`] bytes of the buffer hold a GRH (receives only).
    pub has_grh: bool,
}

impl Completion {
    /// An all-zero completion, for pre-sized arrays.
    pub const EMPTY: Completion = Completion {
        wr_id: 0,
        status: WcStatus::Success,
        byte_len: 0,
        src_qp: 0,
        has_grh: false,
    };
}

/// Handle of an address handle owned by an [`Endpoint`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct AhHandle(pub u32);

/// Where a UD send goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dest {
    /// Address handle for the destination GID (unicast or multicast).
    pub ah: AhHandle,
    /// Destination QP number (`0xFFFFFF` for multicast).
    pub qpn: u32,
    /// Q_Key the receiver checks.
    pub qkey: u32,
}

/// The multicast QPN.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// One UD send: `len` bytes from the start of send slot `slot`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SendWr {
    /// Opaque id handed back in the completion.
    pub wr_id: u64,
    /// Send slot index (`0..EndpointAttrs::send_slots`).
    pub slot: u32,
    /// Bytes to send from the slot.
    pub len: u32,
    /// Destination.
    pub dest: Dest,
    /// Ask for a completion (every send is signalled today).
    pub signaled: bool,
}

/// One receive to post: receive slot `slot` with id `wr_id`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RecvWr {
    /// Opaque id handed back in the completion.
    pub wr_id: u64,
    /// Receive slot index (`0..EndpointAttrs::recv_slots`).
    pub slot: u32,
}

/// Asynchronous events the datapath acts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AsyncEvent {
    /// The device is gone or broken (`IBV_EVENT_DEVICE_FATAL`).
    DeviceFatal,
    /// A completion queue overran or failed (`IBV_EVENT_CQ_ERR`).
    CqError,
    /// The QP failed (`IBV_EVENT_QP_FATAL`, `_REQ_ERR`, `_ACCESS_ERR`).
    QpFatal,
    /// The port went down (`IBV_EVENT_PORT_ERR`).
    PortDown,
    /// The port came up (`IBV_EVENT_PORT_ACTIVE`).
    PortUp,
    /// The device was removed (rdma_cm `DEVICE_REMOVAL`).
    DeviceRemoved,
    /// An event (the `ibv_event_type` value) for a QP or CQ of this endpoint that is not
    /// the live one: one a renewal retired (kept for its grace, see [`retire`]) or a spare
    /// made ahead by [`Endpoint::prepare_spare`]. It says nothing about the live QP: logged and
    /// counted, never a restart.
    NotLive(u32),
    /// The port's GID table changed (`IBV_EVENT_GID_CHANGE`): whether our GID did is for
    /// [`Endpoint::gid_now`] to say.
    GidChange,
    /// Anything else, logged with no action: an `ibv_event_type` value, or for rdma_cm
    /// events `0x100 +` the `rdma_cm_event_type` (see `rdma::CM_EVENT_OTHER_BASE`).
    Other(u32),
}

/// What to open.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointConfig {
    /// Device name (`rxe0`, `mlx5_0`, or a simulated device's name).
    pub device: String,
    /// Port number, 1-based.
    pub port: u8,
    /// GID index; `None` picks the first RoCEv2 IPv4-mapped GID (else index 0).
    pub gid_index: Option<u8>,
    /// Q_Key of the UD QP.
    pub qkey: u32,
    /// Receive ring size (receive slots and receive CQ depth).
    pub recv_slots: u32,
    /// Send ring size (send slots and send CQ depth).
    pub send_slots: u32,
    /// Cap on the UD payload in bytes; `None` uses the port's active MTU. Must not exceed
    /// it.
    pub max_payload: Option<u32>,
    /// Banks of slots in the registered memory, 1 or 2, each `recv_slots` receive and
    /// `send_slots` send slots: with two, a renewal after a failed poll can hand the new
    /// QP the bank the failed one never had ([`Endpoint::restart_deferring_old`]).
    pub banks: u32,
}

impl EndpointConfig {
    /// `banks` is 1 or 2 (every provider checks it before it sizes its memory).
    pub(crate) fn check_banks(&self) -> Result<(), VerbsError> {
        if (1..=2).contains(&self.banks) {
            Ok(())
        } else {
            Err(VerbsError::Invalid {
                field: "banks",
                why: format!("{} banks of slots: 1 or 2", self.banks),
            })
        }
    }
}

/// What an opened endpoint is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EndpointAttrs {
    /// Device name.
    pub device: String,
    /// Port number.
    pub port: u8,
    /// The UD QP's number.
    pub qpn: u32,
    /// The local GID used as source.
    pub gid: Gid,
    /// Index of `gid` in the port's GID table.
    pub gid_index: u8,
    /// Layout of the GRH on receives.
    pub grh_kind: GrhKind,
    /// Largest UD payload in bytes (the port's active MTU, or the configured cap).
    pub max_payload: u32,
    /// Port's active MTU in bytes.
    pub port_mtu: u32,
    /// Receive slots (each `GRH_LEN + max_payload` bytes).
    pub recv_slots: u32,
    /// Send slots (each `max_payload` bytes, between [`SEND_HEADROOM`] and
    /// [`SEND_TAILROOM`] bytes of room of their own).
    pub send_slots: u32,
    /// Largest send the device can inline (0 if none).
    pub max_inline: u32,
    /// Banks of slots (see [`EndpointConfig::banks`]): receive slot numbers run up to
    /// `banks * recv_slots`, send slot numbers up to `banks * send_slots`; bank `b`
    /// holds the `b`-th run of each. A QP still has `recv_slots` receives and
    /// `send_slots` signalled sends at most outstanding.
    pub banks: u32,
}

/// Bytes of room in front of every send slot ([`Endpoint::send_room`]).
pub const SEND_HEADROOM: usize = 16;

/// Bytes of room behind every send slot ([`Endpoint::send_room`]): a frame read into a
/// slot that is longer than a send may be is then seen whole (and refused as too long)
/// rather than cut short.
pub const SEND_TAILROOM: usize = 64;

/// A verbs failure, naming what failed.
#[derive(Debug, thiserror::Error)]
pub enum VerbsError {
    /// No device with this name.
    #[error("no RDMA device named {0} (see `rdma link` / `ibv_devices`)")]
    NoDevice(String),
    /// The port does not exist or is unusable.
    #[error("device {device} port {port}: {why}")]
    BadPort {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// What is wrong.
        why: String,
    },
    /// The port's link layer is not Ethernet (RoCE). InfiniBand needs LID routing and
    /// path records from the subnet administrator, which are not implemented.
    #[error(
        "device {device} port {port} has an {link_layer} link layer; uipoib supports only \
         Ethernet (RoCE) link layers for now"
    )]
    UnsupportedLinkLayer {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// The link layer found (`InfiniBand`, or `unknown (n)`).
        link_layer: String,
    },
    /// No usable GID at the requested (or any) index.
    #[error("device {device} port {port}: no usable GID ({why})")]
    NoGid {
        /// Device name.
        device: String,
        /// Port number.
        port: u8,
        /// What is wrong.
        why: String,
    },
    /// A configuration value the device cannot honour.
    #[error("invalid {field}: {why}")]
    Invalid {
        /// The field.
        field: &'static str,
        /// Why.
        why: String,
    },
    /// `ibv_poll_cq` returned a negative value. Never retried: the interface restarts.
    #[error("ibv_poll_cq on the {cq:?} CQ failed (returned {ret})")]
    PollFailed {
        /// Which CQ.
        cq: CqKind,
        /// The negative return value.
        ret: i32,
    },
    /// A verb call failed.
    #[error("{verb} failed: {source}")]
    Verb {
        /// The verb's name, e.g. `ibv_post_send`.
        verb: &'static str,
        /// The errno it gave.
        #[source]
        source: io::Error,
    },
    /// A post verb failed and its `bad_wr` points outside the chain it was given: how
    /// much of the chain was posted is unknown. Every work request of the chain is then
    /// taken as posted (it is reaped once the QP is destroyed) and the interface restarts.
    #[error("{verb} failed ({source}) and named a bad work request outside the chain")]
    BadWrOutsideChain {
        /// The verb's name.
        verb: &'static str,
        /// The errno it gave.
        #[source]
        source: io::Error,
    },
    /// An address handle the endpoint does not own.
    #[error("unknown address handle {0:?}")]
    UnknownAh(AhHandle),
    /// [`Endpoint::restart`] refused: the device was lost, or the port's MTU or the
    /// endpoint's GID entry changed since the endpoint was opened. Open a new endpoint
    /// instead.
    #[error("cannot renew the endpoint's QP and CQs: {0}; it must be reopened")]
    RenewRefused(String),
}

impl VerbsError {
    /// A [`VerbsError::Verb`] from an errno value.
    pub fn verb(verb: &'static str, errno: i32) -> Self {
        VerbsError::Verb {
            verb,
            source: io::Error::from_raw_os_error(errno),
        }
    }
}

/// A failed [`Endpoint::post_send`]: how many of the chain were posted, and why the next
/// one was not.
#[derive(Debug, thiserror::Error)]
#[error("{error} (after posting {posted} of the chain)")]
pub struct PostSendError {
    /// Work requests of the chain that were posted (a prefix).
    pub posted: usize,
    /// Why the next one was not.
    #[source]
    pub error: VerbsError,
}

/// A failed [`Endpoint::post_recv_chain`]: how many of the chain were posted, and why the
/// next one was not.
#[derive(Debug, thiserror::Error)]
#[error("{error} (after posting {posted} of the receive chain)")]
pub struct PostRecvError {
    /// Receives of the chain that were posted (a prefix).
    pub posted: usize,
    /// Why the next one was not.
    #[source]
    pub error: VerbsError,
}

/// The file descriptors a poller waits on for one [`Endpoint`], from
/// [`Endpoint::watch`]. Reading them is the endpoint's business: the poller only waits
/// until one is readable and then calls the method that goes with its list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WaitFds {
    /// Readable when a completion event is pending (the completion channel): take them
    /// with [`Endpoint::take_cq_events`].
    pub cq: Vec<RawFd>,
    /// Readable when an asynchronous event is pending (the device's async event fd, the
    /// rdma_cm removal watcher): read them with [`Endpoint::next_async_event`] until it
    /// says `None`.
    pub events: Vec<RawFd>,
}

/// Opens endpoints on a device. Implemented by the real and the simulated provider.
pub trait Provider: Send + Sync {
    /// Open the device and build a ready endpoint: PD, memory, channel, CQs, UD QP in RTS.
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError>;
}

/// Everything one interface needs on one port. See the module docs.
pub trait Endpoint: Send {
    /// What this endpoint is.
    fn attrs(&self) -> &EndpointAttrs;

    /// Receive slot `slot`: `GRH_LEN + max_payload` bytes. Read it only after its
    /// completion.
    fn recv_buf(&self, slot: u32) -> &[u8];

    /// Receive slot `slot`, writable: for rewriting a received packet's headers in place
    /// after its completion, before the slot is posted again (out of range: empty).
    fn recv_buf_mut(&mut self, slot: u32) -> &mut [u8];

    /// Send slot `slot`: `max_payload` bytes. Write it only while it is not posted.
    fn send_buf(&mut self, slot: u32) -> &mut [u8];

    /// Send slot `slot` with its room: [`SEND_HEADROOM`] bytes, the `max_payload` bytes of
    /// [`Endpoint::send_buf`], then [`SEND_TAILROOM`] bytes. What a send carries always
    /// starts at [`SEND_HEADROOM`]; the room lets a caller read a frame whose headers are
    /// longer than the ones it sends straight into the slot, rewrite the headers in place
    /// and send the rest, without copying the payload (out of range: empty).
    fn send_room(&mut self, slot: u32) -> &mut [u8];

    /// Post receive slot `slot` with id `wr_id`.
    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError>;

    /// Post a chain of receives with one call where the device allows (one
    /// `ibv_post_recv` with a linked list). On failure, `wrs[..err.posted]` were posted
    /// and the rest were not. The default posts them one by one.
    fn post_recv_chain(&mut self, wrs: &[RecvWr]) -> Result<(), PostRecvError> {
        for (posted, w) in wrs.iter().enumerate() {
            self.post_recv(w.wr_id, w.slot)
                .map_err(|error| PostRecvError { posted, error })?;
        }
        Ok(())
    }

    /// Post a chain of sends with one call (one doorbell / system call where the device
    /// allows). On failure, `wrs[..err.posted]` were posted and the rest were not.
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError>;

    /// Poll up to `out.len()` completions from `cq`. `Ok(0)` when empty.
    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError>;

    /// Arm `cq` for the next completion event.
    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError>;

    /// Make the endpoint's event sources ready to be waited on and say which file
    /// descriptors to wait on (see [`WaitFds`]). The caller adds them to its poll set
    /// (epoll, edge- or level-triggered: every one is readable while an event is pending,
    /// and one with events already pending when this returns reads as readable when
    /// added). They stay valid until [`Endpoint::unwatch`] or the endpoint's drop; the
    /// caller removes them from its poll set before either. A second call without an
    /// `unwatch` between replaces the first one's descriptors.
    fn watch(&mut self) -> io::Result<WaitFds>;

    /// The descriptors [`Endpoint::watch`] gave are no longer waited on: the provider may
    /// close the ones it made for the watch. A no-op when not watched.
    fn unwatch(&mut self);

    /// Read every pending completion event without blocking, acknowledge them, and say
    /// which CQs they were for (`(recv_events, send_events)`).
    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError>;

    /// Read one pending asynchronous event without blocking (`None` when none).
    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError>;

    /// Create an address handle for `gid` on this endpoint's port.
    fn create_ah(&mut self, gid: &Gid) -> Result<AhHandle, VerbsError>;

    /// Destroy an address handle. The caller guarantees no posted send uses it.
    fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError>;

    /// Attach the QP to multicast group `gid` (and do whatever else the device needs for
    /// packets of that group to arrive, such as an IP-level join on RoCE).
    fn attach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError>;

    /// Detach the QP from multicast group `gid`.
    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError>;

    /// Move the QP to the error state: every posted WR completes as [`WcStatus::Flushed`].
    fn set_qp_error(&mut self) -> Result<(), VerbsError>;

    /// Replace the QP and both CQs with new ones (a new QPN, in RTS, nothing posted) and
    /// keep everything else: device context, protection domain, registered slot memory
    /// (and its contents), completion channel, address handles, the removal watcher.
    ///
    /// Every work request posted on the old QP is gone with it: no completion will ever
    /// come for it (the caller reaps it), and none of the old CQs' can be polled. Pending
    /// completion events of the old CQs are taken and acknowledged. The multicast groups
    /// of the old QP are joined by the new one before the old one leaves them (so the
    /// device's and the IP stack's memberships never lapse); [`Endpoint::attach_mcast`]
    /// of such a group afterwards is a no-op. Address handles stay valid (they belong to
    /// the protection domain). The endpoint must not be watched ([`Endpoint::watch`])
    /// while this runs.
    ///
    /// Before replacing anything the port is queried again: if its active MTU differs
    /// from what it was opened with, or its GID table no longer holds the endpoint's GID
    /// at the endpoint's index (with the same GRH kind: IPv4 for an IPv4-mapped RoCE v2
    /// GID), this fails and nothing changes. Which GID the endpoint would choose now is
    /// [`Endpoint::gid_now`]'s question, asked at each [`AsyncEvent::GidChange`]; a
    /// different answer reopens the endpoint, never renews it. It also fails once the
    /// device was reported lost ([`AsyncEvent::DeviceFatal`] /
    /// [`AsyncEvent::DeviceRemoved`]). After any `Err` the caller drops the endpoint and
    /// opens a new one (the old QP, in whatever state, is still the endpoint's, so
    /// dropping it is always sound).
    fn restart(&mut self) -> Result<(), VerbsError>;

    /// [`Endpoint::restart`], but the replaced QP is destroyed before this returns instead
    /// of being kept aside for its grace (its CQs may be: nothing completes into them
    /// once the QP is gone). For a QP that may still own
    /// buffers: one whose CQ poll failed (its completions cannot be trusted, so nothing
    /// says which receives it has finished with), one that could not be moved to the
    /// error state, or one whose flushes did not all arrive. Only a destroyed QP is
    /// certain to write into none of the slots that are then re-posted. An `Err` after
    /// the swap (a failed destroy) leaves the new QP in place; the caller then drops the
    /// endpoint, as after any failed renewal, so the slot memory goes with it.
    fn restart_destroying_old(&mut self) -> Result<(), VerbsError>;

    /// [`Endpoint::restart_destroying_old`], except that the replaced QP is not destroyed
    /// before this returns: it is retired with its CQs ([`Endpoint::reaper`]) for the
    /// caller to destroy on its own thread when it chooses ([`retire::Reaper::reap_awaited`];
    /// the reaper destroys it after [`retire::CQ_GRACE`] if the caller has not), and the
    /// returned [`retire::Gone`] says when it is gone. Until then it
    /// may still write into any receive slot posted on it, so the caller posts the new
    /// QP's work requests from another bank of slots (see [`EndpointAttrs::banks`]) and
    /// re-posts none of the old QP's before that. For a restart after a failed poll whose
    /// new ring and announcement should not wait for the old QP's destroy. The default
    /// destroys it at once, as [`Endpoint::restart_destroying_old`], and says so.
    fn restart_deferring_old(&mut self) -> Result<retire::Gone, VerbsError> {
        self.restart_destroying_old()?;
        Ok(retire::Gone::already())
    }

    /// Replace one CQ and keep the QP and everything posted on it: a new CQ of the same
    /// depth on the same channel is polled and armed from now on, and the old one is
    /// destroyed if the device lets it go. The `recreate-cq` poll-failure policy, a
    /// demonstration only: a QP's CQs are fixed when the QP is created (no verb moves a
    /// QP to another CQ), and the IBTA (C11-17) has the device refuse to destroy a CQ
    /// that a work queue still uses; rxe does (`EBUSY`). The QP's completions then go
    /// on landing in the old CQ, which nothing polls, until a restart destroys the QP
    /// and, after it, the old CQ. The default refuses.
    fn recreate_cq(&mut self, cq: CqKind) -> Result<CqRecreated, VerbsError> {
        let _ = cq;
        Err(VerbsError::Invalid {
            field: "recreate-cq",
            why: "this provider cannot re-create a CQ".into(),
        })
    }

    /// Housekeeping between restarts, off their critical path (the datapath calls it
    /// from its periodic housekeeping, on the poller thread): prepare the QP and CQs the
    /// next `restart` will use, if the provider makes them ahead (the real provider does:
    /// creating a 4096-entry CQ and its QP costs milliseconds under emulation). A spare
    /// QP is in RTS with nothing posted and its CQs unarmed. It destroys nothing: what
    /// [`Endpoint::restart`] replaced is destroyed through [`Endpoint::reaper`], on another
    /// thread (a destroy can block for a second, see [`retire`]). Cheap when there is
    /// nothing to do; a failure is logged and counted by the provider. Dropping the
    /// endpoint destroys the spare.
    fn prepare_spare(&mut self) -> Result<(), VerbsError> {
        Ok(())
    }

    /// The QPs and CQs that [`Endpoint::restart`] replaced, if the provider keeps them for
    /// a grace period before destroying them (see [`retire`]): a handle for another
    /// thread to destroy them once due. The same handle for the endpoint's whole life;
    /// after the endpoint is dropped it destroys nothing. `None` (the default) when
    /// replaced objects are destroyed at once.
    fn reaper(&self) -> Option<Arc<dyn retire::Reaper>> {
        None
    }

    /// The GID (and its index) this endpoint would choose now, read again from the
    /// port's GID table (after [`AsyncEvent::GidChange`]); `None` when no usable GID is
    /// left. If it is not `attrs().gid` at `attrs().gid_index`, the endpoint must be
    /// reopened. The default says nothing changed.
    fn gid_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        Ok(Some((self.attrs().gid, self.attrs().gid_index)))
    }
}
