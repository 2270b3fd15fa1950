//! Simulated in-process fabric (test double).
//!
//! [`SimFabric`] is a [`Provider`] whose devices, ports, GID tables, UD QPs, CQs,
//! completion events and multicast groups live in this process. It is what unit tests,
//! the two-daemons-in-one-process integration test and the benches run on; nothing
//! measured "over rxe" uses it. It owns the UD semantics a real device (rxe) gives the
//! datapath and must not do anything a real device would not:
//!
//! - a send is executed when it is posted (unless the test holds the QP's sends back
//!   with [`SimFabric::hold_sends`]): its bytes are copied and the packet is delivered
//!   (or silently dropped) before `post_send` returns, and its sender gets a success
//!   completion either way (UD is unreliable);
//! - a work request occupies its queue until its completion is polled (as on mlx5), so
//!   neither CQ can overflow: one more than `recv_slots` receives or `send_slots` sends
//!   outstanding is `ENOMEM`; an unsignaled send is retired by the next send completion
//!   polled after it;
//! - a receiver silently drops a packet whose Q_Key does not match, that is larger than
//!   its receive buffers, that finds no posted receive or a QP in the error state; a
//!   packet for a QPN or GID nobody owns is dropped too. The receiver never sees these;
//!   the fabric counts each by reason ([`SimFabric::counters`]);
//! - a delivered packet takes the oldest posted receive, whose completion says
//!   `byte_len = GRH_LEN + len`, `has_grh`, and the sender's QPN, and whose slot then
//!   holds a 40-byte GRH in the receiver's [`GrhKind`] layout followed by the payload
//!   (an RoCEv2 IPv4 header names the sender's IPv4-mapped GID's address, or its
//!   device's address when it sends from the link-local GID);
//! - a send whose Q_Key has the high bit set uses the sending QP's own Q_Key (IBA
//!   10.2.5);
//! - a CQ armed with `req_notify` raises exactly one event for the next completion and
//!   wakes the watched completion channel; a completion on an unarmed CQ raises none
//!   (the missed-event race the poll loop closes by polling after arming);
//! - a QP moved to the error state flushes every posted receive and every held send, in
//!   posting order, and flushes everything posted afterwards.
//!
//! - a renewal keeps the replaced QP's number in a [`RetireQueue`] for the fabric's
//!   retire grace ([`SimFabric::set_retire_grace`], zero unless set) and hands it out as
//!   the endpoint's reaper, as the real provider does; its "destroy" only records the
//!   thread it ran on and how long after the retirement ([`SimFabric::destroyed`]).
//!
//! It is deterministic: no threads or timers of its own, QPNs allocated from 17 up and
//! never reused, and nothing happens except inside a call.
//!
//! # Locking
//! Three kinds of lock, always taken in this order, never two of one kind at once:
//! 1. a QP's send-side lock (`Qp::send`), held for a whole `post_send`,
//!    `set_qp_error` or [`SimFabric::hold_sends`] release, so that held sends and new
//!    sends keep their order;
//! 2. the fabric topology (`Fabric::topo`, an `RwLock`): read once per `post_send`
//!    chain to resolve destinations, written only by `open`, drop and multicast
//!    attach/detach;
//! 3. a QP's state (`Qp::state`): its receive queue, both CQs, event arming and
//!    packet buffer pool. A sender holds the receiver's state lock only to take a
//!    receive, copy the packet into a pooled buffer and queue the completion; the owner
//!    holds it only to move completions out. Copies into the receive slots happen
//!    outside any lock. Wakers are woken after the state lock is released.
//!
//! Lookups per packet are hash-map lookups (destination GID → device, QPN → QP, address
//! handle → GID, group → members); nothing scans all QPs.
//!
//! # Allocation
//! Slot memory is allocated once at `open`. Packet data travels in `Vec<u8>` buffers
//! that are recycled: each QP keeps a pool of receive-sized buffers that senders take
//! from when they deliver to it. Its owner copies a polled packet into the receive slot
//! outside the lock and keeps the buffer aside; the next `post_recv` or `poll_cq`, which
//! lock the state anyway, put the kept buffers back. Since a delivery needs a posted
//! receive, a QP never holds more buffers than it has receive slots (plus send slots,
//! for held sends), so after warm-up a packet costs no allocation. Queues and pools are
//! created with their bound as capacity.
//!
//! # Files
//! Here the data model (the fabric, its devices and QPs, an endpoint) and the locking
//! helpers; `fabric`: [`SimFabric`]'s own API (devices, counters, held sends) and `open`;
//! `delivery`: a packet from a sender to its receivers (with the GRH it gets); `qp`: a
//! QP's queues, completion events and waker, the counters, a retired QP's "destroy";
//! `endpoint`: the [`Endpoint`] implementation. Tests in `tests/`.

mod delivery;
mod endpoint;
mod fabric;
mod qp;
#[cfg(test)]
pub(crate) mod tests;

use std::collections::{HashMap, VecDeque};
use std::net::Ipv4Addr;
use std::os::unix::net::UnixStream;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use super::retire::RetireQueue;
use super::{Completion, CqKind, EndpointAttrs, Gid, GrhKind, MULTICAST_QPN};
#[cfg(doc)]
use super::{Endpoint, Provider, retire::Destroy};

/// First QPN handed out on a fresh fabric (rxe's first UD QP on a fresh host is 17).
pub const FIRST_QPN: u32 = 17;

/// Largest QPN (24 bits; `0xFFFFFF` is the multicast QPN).
const MAX_QPN: u32 = MULTICAST_QPN - 1;

/// Largest receive or send ring an endpoint may ask for (rxe's `max_qp_wr` is 1 << 15).
pub const MAX_SLOTS: u32 = 32768;

/// Active MTUs a simulated port may have (the IB MTU enumeration).
pub const PORT_MTUS: [u32; 5] = [256, 512, 1024, 2048, 4096];

/// Hop limit / TTL written into simulated GRHs (what a Linux host sends by default).
const GRH_HOP_LIMIT: u8 = 64;

/// IB GRH `PayLen` beyond the UD payload: BTH (12) + DETH (8) + ICRC (4).
const IB_PAYLEN_OVERHEAD: usize = 24;

/// RoCEv2 IPv4 total length beyond the UD payload: IPv4 (20) + UDP (8) + BTH (12) +
/// DETH (8) + ICRC (4).
const ROCE_V4_OVERHEAD: usize = 52;

/// IB GRH next header for a BTH.
const GRH_NEXT_HEADER_BTH: u8 = 0x1B;

/// A Q_Key with this bit set in a send means "use the sending QP's own Q_Key" (IBA 10.2.5).
const QKEY_USE_QP: u32 = 0x8000_0000;

/// Fabric-wide counters. Every packet a receiver never sees is counted here by reason;
/// `delivered` counts packets placed in a receive.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SimCounters {
    /// Dropped: the send's Q_Key differed from the receiving QP's.
    pub qkey_mismatch: u64,
    /// Dropped: the receiving QP had no receive posted.
    pub no_recv_posted: u64,
    /// Dropped: larger than the receiving QP's receive buffers (its payload limit).
    pub oversized: u64,
    /// Dropped: no QP with the destination QPN on a device owning the destination GID,
    /// or a multicast group nobody is attached to.
    pub unknown_dest: u64,
    /// Dropped: the receiving QP was in the error state.
    pub receiver_in_error: u64,
    /// Packets placed in a receive (unicast and multicast copies).
    pub delivered: u64,
    /// Of `delivered`, the multicast copies (one per attached QP reached).
    pub mcast_delivered: u64,
}

/// One destroy of a QP that a renewal replaced.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimDestroy {
    /// The QP's number.
    pub qpn: u32,
    /// The name of the thread the destroy ran on.
    pub thread: Option<String>,
    /// From the retirement to the destroy.
    pub after: Duration,
}

/// A QP a renewal replaced (already out of the fabric), until its destroy.
struct SimRetired {
    qpn: u32,
    at: Instant,
    fabric: Arc<Fabric>,
    /// Dropped at its destroy ([`crate::verbs::Endpoint::restart_deferring_old`]).
    gone: Option<crate::verbs::retire::GoneSignal>,
}

/// An in-process RDMA fabric implementing [`Provider`]. Cheap to clone; clones share the
/// fabric. See the module docs for what it simulates and how.
#[derive(Clone)]
pub struct SimFabric {
    inner: Arc<Fabric>,
}

/// The shared fabric.
struct Fabric {
    /// Devices, QPs and multicast groups.
    topo: RwLock<Topology>,
    /// Drop and delivery counters.
    counters: AtomicCounters,
    /// Successful opens: each stands for a device context, a PD and a memory
    /// registration of the slots on real verbs.
    opens: AtomicU64,
    /// Successful [`Endpoint::restart`]s: a new QP and CQs, nothing else.
    endpoint_restarts: AtomicU64,
    /// How long a renewal's replaced QP waits before it is destroyed.
    retire_grace: Mutex<Duration>,
    /// The destroys of replaced QPs, in order.
    destroyed: Mutex<Vec<SimDestroy>>,
}

/// Who is where. Read per `post_send` chain; written on open, drop, attach and detach.
struct Topology {
    /// Devices by index; never removed.
    devices: Vec<Device>,
    /// Device name → index.
    by_name: HashMap<String, usize>,
    /// Every GID of every device → device index.
    by_gid: HashMap<Gid, usize>,
    /// Live QPs by number.
    qps: HashMap<u32, Arc<Qp>>,
    /// Multicast group → attached QPs (no duplicates; no empty groups).
    groups: HashMap<Gid, Vec<Arc<Qp>>>,
    /// Next QPN to hand out.
    next_qpn: u32,
}

/// One simulated device with its single port.
struct Device {
    name: String,
    ipv4: Ipv4Addr,
    mtu: u32,
    /// GID table of port 1: index 0 link-local, index 1 IPv4-mapped.
    gids: [Gid; 2],
}

/// One UD QP with its two CQs: the part of an endpoint other threads reach.
struct Qp {
    qpn: u32,
    device: usize,
    qkey: u32,
    /// Receive buffer payload limit (the endpoint's `max_payload`).
    max_payload: u32,
    grh_kind: GrhKind,
    /// Source GID of its sends.
    gid: Gid,
    /// IPv4 address of its sends (the GID's, else its device's).
    ipv4: Ipv4Addr,
    recv_slots: u32,
    send_slots: u32,
    /// Send-side serialisation and held sends. Lock before `state`.
    send: Mutex<SendSide>,
    /// Receive queue, CQs, events. Lock last.
    state: Mutex<QpState>,
}

/// Sends that the fabric holds back ([`SimFabric::hold_sends`]).
#[derive(Default)]
struct SendSide {
    held: bool,
    queue: VecDeque<HeldSend>,
    /// Recycled buffers for held-send copies.
    pool: Vec<Vec<u8>>,
}

/// A send posted while held: its bytes were copied at post time.
struct HeldSend {
    wr_id: u64,
    signaled: bool,
    dgid: Gid,
    dqpn: u32,
    qkey: u32,
    data: Vec<u8>,
}

/// Everything other threads may change about a QP.
#[derive(Default)]
struct QpState {
    error: bool,
    /// Posted receives, oldest first: (wr_id, slot).
    recv_posted: VecDeque<(u64, u32)>,
    /// Receive completions not yet polled.
    recv_cq: VecDeque<RecvCqe>,
    /// Send completions not yet polled.
    send_cq: VecDeque<SendCqe>,
    /// Sends posted and not yet retired by polling their (or a later) completion.
    send_outstanding: u32,
    /// Unsignaled sends executed since the last send completion was queued; the next
    /// completion retires them too (as a real send queue does).
    unsignaled_done: u32,
    /// Armed for one event: `[recv, send]`.
    armed: [bool; 2],
    /// Events raised and not yet taken: `[recv, send]`.
    events: [u32; 2],
    /// Woken when an event is raised.
    waker: Option<Arc<Notifier>>,
    /// Recycled packet buffers (capacity `GRH_LEN + max_payload`).
    pool: Vec<Vec<u8>>,
}

/// A receive completion and, on success, the packet (GRH + payload) its slot gets when
/// it is polled.
struct RecvCqe {
    wc: Completion,
    slot: u32,
    packet: Option<Vec<u8>>,
}

/// A send completion and how many send queue entries polling it frees.
struct SendCqe {
    wc: Completion,
    retires: u32,
}

/// The fabric's counters.
#[derive(Default)]
struct AtomicCounters {
    qkey_mismatch: AtomicU64,
    no_recv_posted: AtomicU64,
    oversized: AtomicU64,
    unknown_dest: AtomicU64,
    receiver_in_error: AtomicU64,
    delivered: AtomicU64,
    mcast_delivered: AtomicU64,
}

/// Counts gathered over one chain, added to the fabric's atomics once.
#[derive(Default)]
struct Tally {
    qkey_mismatch: u64,
    no_recv_posted: u64,
    oversized: u64,
    unknown_dest: u64,
    receiver_in_error: u64,
    delivered: u64,
    mcast_delivered: u64,
}

/// Lock, ignoring poisoning: the state stays consistent at every unlock, and a panic in
/// one test thread must not cascade.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

fn read<T>(m: &RwLock<T>) -> RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(PoisonError::into_inner)
}

fn write<T>(m: &RwLock<T>) -> RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(PoisonError::into_inner)
}

fn cq_index(cq: CqKind) -> usize {
    match cq {
        CqKind::Recv => 0,
        CqKind::Send => 1,
    }
}

/// The simulated completion channel: a socket pair. The poller waits on the read end
/// (like a completion channel fd); raising an event writes a byte to the write end.
struct Notifier {
    tx: UnixStream,
}

/// An endpoint on a [`SimFabric`]: slot memory, address handles and multicast
/// attachments are its own; its QP and CQs are shared with senders.
struct SimEndpoint {
    fabric: Arc<Fabric>,
    qp: Arc<Qp>,
    attrs: EndpointAttrs,
    /// `GRH_LEN + max_payload`.
    recv_stride: usize,
    /// `recv_slots * recv_stride` bytes.
    recv_mem: Vec<u8>,
    /// `send_slots * send_stride(max_payload)` bytes: each slot between its head- and
    /// tailroom.
    send_mem: Vec<u8>,
    /// Address handle → GID.
    ahs: HashMap<u32, Gid>,
    next_ah: u32,
    /// Multicast groups attached.
    groups: Vec<Gid>,
    /// Receive completions moved out of the shared state by one poll (kept for its
    /// capacity).
    polled: Vec<RecvCqe>,
    /// Packet buffers of the last poll, returned to the pool by the next.
    spare: Vec<Vec<u8>>,
    /// Read end of the simulated completion channel, while watched.
    channel: Option<UnixStream>,
    /// QPs endpoint_restarts replaced, until the reaper (or the drop) destroys them.
    retired: Arc<RetireQueue<SimRetired>>,
    /// Per CQ kind (receive, send): the CQ polled and armed is one `recreate_cq` made,
    /// which the QP does not complete into (the QP's own CQ could not be destroyed and
    /// goes on filling, unpolled). Cleared by a restart (a new QP on new CQs).
    recreated: [bool; 2],
}
