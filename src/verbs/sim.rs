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

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::io::{self, Read, Write};
use std::net::Ipv4Addr;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard};
use std::time::{Duration, Instant};

use super::retire::{Destroy, RETIRED_CAP, Reaper, RetireQueue};

use super::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, GRH_LEN,
    Gid, GrhKind, MULTICAST_QPN, PostSendError, Provider, SendWr, VerbsError, WaitFds, WcStatus,
};

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
}

impl Destroy for SimRetired {
    fn destroy(self) -> Result<(), VerbsError> {
        lock(&self.fabric.destroyed).push(SimDestroy {
            qpn: self.qpn,
            thread: std::thread::current().name().map(str::to_string),
            after: self.at.elapsed(),
        });
        Ok(())
    }
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
    /// Successful [`Endpoint::renew`]s: a new QP and CQs, nothing else.
    renewals: AtomicU64,
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

impl Qp {
    /// `template` with empty queues sized for its rings (its `send` and `state` are
    /// replaced).
    fn new(template: Qp) -> Qp {
        let (recv, send) = (template.recv_slots as usize, template.send_slots as usize);
        Qp {
            send: Mutex::new(SendSide {
                held: false,
                queue: VecDeque::with_capacity(send),
                pool: Vec::new(),
            }),
            state: Mutex::new(QpState {
                error: false,
                recv_posted: VecDeque::with_capacity(recv),
                recv_cq: VecDeque::with_capacity(recv),
                send_cq: VecDeque::with_capacity(send),
                send_outstanding: 0,
                unsignaled_done: 0,
                armed: [false; 2],
                events: [0; 2],
                waker: None,
                pool: Vec::with_capacity(recv),
            }),
            ..template
        }
    }

    /// The same QP under a new number, with empty queues (for [`Endpoint::renew`]).
    fn renumbered(&self, qpn: u32) -> Qp {
        Qp::new(Qp {
            qpn,
            device: self.device,
            qkey: self.qkey,
            max_payload: self.max_payload,
            grh_kind: self.grh_kind,
            gid: self.gid,
            ipv4: self.ipv4,
            recv_slots: self.recv_slots,
            send_slots: self.send_slots,
            send: Mutex::new(SendSide::default()),
            state: Mutex::new(QpState::default()),
        })
    }
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

impl AtomicCounters {
    fn add(&self, t: &Tally) {
        let pairs = [
            (&self.qkey_mismatch, t.qkey_mismatch),
            (&self.no_recv_posted, t.no_recv_posted),
            (&self.oversized, t.oversized),
            (&self.unknown_dest, t.unknown_dest),
            (&self.receiver_in_error, t.receiver_in_error),
            (&self.delivered, t.delivered),
            (&self.mcast_delivered, t.mcast_delivered),
        ];
        for (c, v) in pairs {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    fn snapshot(&self) -> SimCounters {
        SimCounters {
            qkey_mismatch: self.qkey_mismatch.load(Ordering::Relaxed),
            no_recv_posted: self.no_recv_posted.load(Ordering::Relaxed),
            oversized: self.oversized.load(Ordering::Relaxed),
            unknown_dest: self.unknown_dest.load(Ordering::Relaxed),
            receiver_in_error: self.receiver_in_error.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            mcast_delivered: self.mcast_delivered.load(Ordering::Relaxed),
        }
    }
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

impl Notifier {
    fn wake(&self) -> io::Result<()> {
        match (&self.tx).write(&[1]) {
            Ok(_) => Ok(()),
            // Full: the reader has bytes pending already, so it will wake anyway.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

fn wake(waker: Option<Arc<Notifier>>) {
    if let Some(w) = waker
        && let Err(e) = w.wake()
    {
        tracing::debug!(error = %e, "sim: waking the completion-channel waker failed");
    }
}

impl QpState {
    /// A completion was queued on `cq`: raise its event if armed. Returns the waker to
    /// wake once the state lock is released.
    fn completion_added(&mut self, cq: CqKind) -> Option<Arc<Notifier>> {
        let i = cq_index(cq);
        if self.armed[i] {
            self.armed[i] = false;
            self.events[i] = self.events[i].saturating_add(1);
            self.waker.clone()
        } else {
            None
        }
    }

    /// Queue a send completion; it retires itself and the unsignaled sends before it.
    fn push_send_cqe(&mut self, wr_id: u64, status: WcStatus) {
        let retires = 1 + std::mem::take(&mut self.unsignaled_done);
        self.send_cq.push_back(SendCqe {
            wc: Completion {
                wr_id,
                status,
                ..Completion::EMPTY
            },
            retires,
        });
    }

    /// Queue a flushed receive completion.
    fn push_recv_flush(&mut self, wr_id: u64, slot: u32) {
        self.recv_cq.push_back(RecvCqe {
            wc: Completion {
                wr_id,
                status: WcStatus::Flushed,
                ..Completion::EMPTY
            },
            slot,
            packet: None,
        });
    }
}

impl Default for SimFabric {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topo = read(&self.inner.topo);
        f.debug_struct("SimFabric")
            .field(
                "devices",
                &topo.devices.iter().map(|d| &d.name).collect::<Vec<_>>(),
            )
            .field("live_qps", &topo.qps.len())
            .field("groups", &topo.groups.len())
            .finish()
    }
}

impl SimFabric {
    /// An empty fabric: no devices.
    pub fn new() -> Self {
        SimFabric {
            inner: Arc::new(Fabric {
                topo: RwLock::new(Topology {
                    devices: Vec::new(),
                    by_name: HashMap::new(),
                    by_gid: HashMap::new(),
                    qps: HashMap::new(),
                    groups: HashMap::new(),
                    next_qpn: FIRST_QPN,
                }),
                counters: AtomicCounters::default(),
                opens: AtomicU64::new(0),
                renewals: AtomicU64::new(0),
                retire_grace: Mutex::new(Duration::ZERO),
                destroyed: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Endpoints opened so far (each is a device context, PD and memory registration
    /// on real verbs).
    pub fn opens(&self) -> u64 {
        self.inner.opens.load(Ordering::Relaxed)
    }

    /// [`Endpoint::renew`]s so far (a new QP and CQs on an endpoint kept open).
    pub fn renewals(&self) -> u64 {
        self.inner.renewals.load(Ordering::Relaxed)
    }

    /// How long the QP a renewal replaced waits before it is destroyed, for endpoints
    /// opened from now on (the real provider's is [`super::retire::RETIRE_GRACE`]).
    pub fn set_retire_grace(&self, grace: Duration) {
        *lock(&self.inner.retire_grace) = grace;
    }

    /// Every destroy of a replaced QP so far, in order.
    pub fn destroyed(&self) -> Vec<SimDestroy> {
        lock(&self.inner.destroyed).clone()
    }

    /// Add a device with one port (port 1), a GID table (index 0 an `fe80::` link-local
    /// GID, index 1 the IPv4-mapped GID `::ffff:<ipv4>`, like rxe), and an active MTU in
    /// bytes (256/512/1024/2048/4096).
    ///
    /// Names and IPv4 addresses must be unique on the fabric (GIDs route packets). The
    /// link-local GID is the EUI-64 of the MAC `02:00:<ipv4>`.
    pub fn add_device(&self, name: &str, ipv4: Ipv4Addr, mtu: u32) -> Result<(), VerbsError> {
        if !PORT_MTUS.contains(&mtu) {
            return Err(VerbsError::Invalid {
                field: "mtu",
                why: format!("{mtu} is not an IB MTU (one of {PORT_MTUS:?})"),
            });
        }
        if name.is_empty() {
            return Err(VerbsError::Invalid {
                field: "device",
                why: "empty device name".into(),
            });
        }
        let gids = [link_local_gid(ipv4), Gid::from_ipv4(ipv4)];
        let mut topo = write(&self.inner.topo);
        if topo.by_name.contains_key(name) {
            return Err(VerbsError::Invalid {
                field: "device",
                why: format!("a device named {name:?} already exists"),
            });
        }
        if gids.iter().any(|g| topo.by_gid.contains_key(g)) {
            return Err(VerbsError::Invalid {
                field: "ipv4",
                why: format!("another device already has address {ipv4}"),
            });
        }
        let idx = topo.devices.len();
        topo.devices.push(Device {
            name: name.to_owned(),
            ipv4,
            mtu,
            gids,
        });
        topo.by_name.insert(name.to_owned(), idx);
        for g in gids {
            topo.by_gid.insert(g, idx);
        }
        Ok(())
    }

    /// Change a device's port MTU and IPv4 address (so its GIDs), as when a device is
    /// deleted and re-added on a netdev with another MTU or address. Endpoints already
    /// open keep what they had; later opens see the new values.
    pub fn reconfigure_device(
        &self,
        name: &str,
        ipv4: Ipv4Addr,
        mtu: u32,
    ) -> Result<(), VerbsError> {
        if !PORT_MTUS.contains(&mtu) {
            return Err(VerbsError::Invalid {
                field: "mtu",
                why: format!("{mtu} is not an IB MTU (one of {PORT_MTUS:?})"),
            });
        }
        let mut topo = write(&self.inner.topo);
        let idx = *topo
            .by_name
            .get(name)
            .ok_or_else(|| VerbsError::NoDevice(name.to_owned()))?;
        let gids = [link_local_gid(ipv4), Gid::from_ipv4(ipv4)];
        if gids
            .iter()
            .any(|g| topo.by_gid.get(g).is_some_and(|i| *i != idx))
        {
            return Err(VerbsError::Invalid {
                field: "ipv4",
                why: format!("another device already has address {ipv4}"),
            });
        }
        let old = topo.devices[idx].gids;
        for g in old {
            topo.by_gid.remove(&g);
        }
        for g in gids {
            topo.by_gid.insert(g, idx);
        }
        let d = &mut topo.devices[idx];
        d.ipv4 = ipv4;
        d.mtu = mtu;
        d.gids = gids;
        Ok(())
    }

    /// The GID table of `device`'s port 1, `None` for an unknown device.
    pub fn gids(&self, device: &str) -> Option<Vec<Gid>> {
        let topo = read(&self.inner.topo);
        let idx = *topo.by_name.get(device)?;
        Some(topo.devices[idx].gids.to_vec())
    }

    /// Fabric-wide counters (silent drops the receivers never see, and deliveries).
    pub fn counters(&self) -> SimCounters {
        self.inner.counters.snapshot()
    }

    /// QPs currently open (endpoints not yet dropped).
    pub fn live_qps(&self) -> usize {
        read(&self.inner.topo).qps.len()
    }

    /// Multicast groups with at least one QP attached.
    pub fn mcast_groups(&self) -> usize {
        read(&self.inner.topo).groups.len()
    }

    /// Hold back (`hold == true`) or release the sends of QP `qpn`, like a link that
    /// stalls. A held send is copied at post time and stays outstanding without a
    /// completion; it is flushed if the QP enters the error state. Releasing executes the
    /// held sends in order (delivery and completions) before returning. Returns `false`
    /// when no QP has that number.
    pub fn hold_sends(&self, qpn: u32, hold: bool) -> bool {
        // Clone the QP out and release the topology before taking its send lock (lock
        // order: send side, then topology).
        let Some(qp) = read(&self.inner.topo).qps.get(&qpn).cloned() else {
            return false;
        };
        let mut send = lock(&qp.send);
        send.held = hold;
        if !hold && !send.queue.is_empty() {
            let mut tally = Tally::default();
            let topo = read(&self.inner.topo);
            for h in &send.queue {
                deliver(&topo, &mut tally, &qp, &h.dgid, h.dqpn, h.qkey, &h.data);
            }
            drop(topo);
            self.inner.counters.add(&tally);
            let SendSide { queue, pool, .. } = &mut *send;
            let mut st = lock(&qp.state);
            for h in queue.drain(..) {
                if h.signaled {
                    st.push_send_cqe(h.wr_id, WcStatus::Success);
                } else {
                    st.unsignaled_done += 1;
                }
                pool.push(h.data);
            }
            let waker = if st.send_cq.is_empty() {
                None
            } else {
                st.completion_added(CqKind::Send)
            };
            drop(st);
            wake(waker);
        }
        true
    }
}

/// The link-local GID of a simulated device: `fe80::` + EUI-64 of MAC `02:00:<ipv4>`.
fn link_local_gid(ipv4: Ipv4Addr) -> Gid {
    let o = ipv4.octets();
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    // EUI-64 of 02:00:o0:o1:o2:o3 with the U/L bit flipped: 00:00:o0:ff:fe:o1:o2:o3.
    g[8..16].copy_from_slice(&[0x00, 0x00, o[0], 0xff, 0xfe, o[1], o[2], o[3]]);
    Gid(g)
}

impl Provider for SimFabric {
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError> {
        let mut topo = write(&self.inner.topo);
        let dev_idx = *topo
            .by_name
            .get(&cfg.device)
            .ok_or_else(|| VerbsError::NoDevice(cfg.device.clone()))?;
        let dev = &topo.devices[dev_idx];
        if cfg.port != 1 {
            return Err(VerbsError::BadPort {
                device: dev.name.clone(),
                port: cfg.port,
                why: "a simulated device has only port 1".into(),
            });
        }
        let gid_index = match cfg.gid_index {
            Some(i) => i,
            None => dev
                .gids
                .iter()
                .position(|g| g.as_ipv4().is_some())
                .unwrap_or(0) as u8,
        };
        let gid = *dev
            .gids
            .get(usize::from(gid_index))
            .ok_or_else(|| VerbsError::NoGid {
                device: dev.name.clone(),
                port: cfg.port,
                why: format!(
                    "index {gid_index} is outside the GID table of {} entries",
                    dev.gids.len()
                ),
            })?;
        for (field, v) in [
            ("recv_slots", cfg.recv_slots),
            ("send_slots", cfg.send_slots),
        ] {
            if v == 0 || v > MAX_SLOTS {
                return Err(VerbsError::Invalid {
                    field,
                    why: format!("{v} is outside 1..={MAX_SLOTS}"),
                });
            }
        }
        let max_payload = match cfg.max_payload {
            None => dev.mtu,
            Some(p) if p == 0 || p > dev.mtu => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: format!(
                        "max_payload {p} is outside 1..={} (the active MTU of {} port 1)",
                        dev.mtu, dev.name
                    ),
                });
            }
            Some(p) => p,
        };
        let qpn = topo.next_qpn;
        if qpn > MAX_QPN {
            return Err(VerbsError::verb("ibv_create_qp", libc::ENOMEM));
        }
        let (grh_kind, ipv4) = match gid.as_ipv4() {
            Some(a) => (GrhKind::Ipv4, a),
            None => (GrhKind::Ipv6, dev.ipv4),
        };
        let attrs = EndpointAttrs {
            device: dev.name.clone(),
            port: 1,
            qpn,
            gid,
            gid_index,
            grh_kind,
            max_payload,
            port_mtu: dev.mtu,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            max_inline: 0,
        };
        let recv_slots = cfg.recv_slots as usize;
        let send_slots = cfg.send_slots as usize;
        let qp = Arc::new(Qp::new(Qp {
            qpn,
            device: dev_idx,
            qkey: cfg.qkey,
            max_payload,
            grh_kind,
            gid,
            ipv4,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            send: Mutex::new(SendSide::default()),
            state: Mutex::new(QpState::default()),
        }));
        topo.next_qpn = qpn + 1;
        topo.qps.insert(qpn, Arc::clone(&qp));
        drop(topo);
        self.inner.opens.fetch_add(1, Ordering::Relaxed);

        let recv_stride = GRH_LEN + max_payload as usize;
        Ok(Box::new(SimEndpoint {
            fabric: Arc::clone(&self.inner),
            qp,
            recv_stride,
            recv_mem: vec![0; recv_slots * recv_stride],
            send_mem: vec![0; send_slots * max_payload as usize],
            attrs,
            ahs: HashMap::new(),
            next_ah: 1,
            groups: Vec::new(),
            polled: Vec::with_capacity(recv_slots),
            spare: Vec::with_capacity(recv_slots),
            channel: None,
            retired: Arc::new(RetireQueue::new(
                *lock(&self.inner.retire_grace),
                RETIRED_CAP,
            )),
        }))
    }
}

/// Deliver one packet from `src` to `dgid`/`dqpn` (or to every member of a multicast
/// group). Called with the topology read-locked; locks each receiver's state in turn.
fn deliver(
    topo: &Topology,
    tally: &mut Tally,
    src: &Qp,
    dgid: &Gid,
    dqpn: u32,
    qkey: u32,
    payload: &[u8],
) {
    let qkey = if qkey & QKEY_USE_QP != 0 {
        src.qkey
    } else {
        qkey
    };
    if dqpn == MULTICAST_QPN && dgid.is_multicast() {
        match topo.groups.get(dgid) {
            Some(members) => {
                for dst in members {
                    if deliver_one(tally, src, dst, dgid, qkey, payload) {
                        tally.mcast_delivered += 1;
                    }
                }
            }
            None => tally.unknown_dest += 1,
        }
        return;
    }
    let dst = topo
        .by_gid
        .get(dgid)
        .and_then(|&dev| topo.qps.get(&dqpn).filter(|qp| qp.device == dev));
    match dst {
        Some(dst) => {
            deliver_one(tally, src, dst, dgid, qkey, payload);
        }
        None => tally.unknown_dest += 1,
    }
}

/// Place one packet in `dst`'s oldest posted receive, or count why not. True when
/// delivered.
fn deliver_one(
    tally: &mut Tally,
    src: &Qp,
    dst: &Qp,
    dgid: &Gid,
    qkey: u32,
    payload: &[u8],
) -> bool {
    if qkey != dst.qkey {
        tally.qkey_mismatch += 1;
        return false;
    }
    if payload.len() > dst.max_payload as usize {
        tally.oversized += 1;
        return false;
    }
    let dst_v4 = dgid.as_ipv4().unwrap_or(dst.ipv4);
    let grh = build_grh(
        dst.grh_kind,
        payload.len(),
        &src.gid,
        dgid,
        src.ipv4,
        dst_v4,
    );
    let mut st = lock(&dst.state);
    if st.error {
        tally.receiver_in_error += 1;
        return false;
    }
    let Some((wr_id, slot)) = st.recv_posted.pop_front() else {
        tally.no_recv_posted += 1;
        return false;
    };
    let mut buf = st
        .pool
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(GRH_LEN + dst.max_payload as usize));
    buf.clear();
    buf.extend_from_slice(&grh);
    buf.extend_from_slice(payload);
    st.recv_cq.push_back(RecvCqe {
        wc: Completion {
            wr_id,
            status: WcStatus::Success,
            // Bounded by GRH_LEN + 4096 (checked above), so it fits.
            byte_len: (GRH_LEN + payload.len()) as u32,
            src_qp: src.qpn,
            has_grh: true,
        },
        slot,
        packet: Some(buf),
    });
    let waker = st.completion_added(CqKind::Recv);
    drop(st);
    wake(waker);
    tally.delivered += 1;
    true
}

/// The 40 bytes in front of a UD receive, in layout `kind`, for a payload of
/// `payload_len` bytes (at most 4096, so every length fits in 16 bits).
fn build_grh(
    kind: GrhKind,
    payload_len: usize,
    sgid: &Gid,
    dgid: &Gid,
    src_v4: Ipv4Addr,
    dst_v4: Ipv4Addr,
) -> [u8; GRH_LEN] {
    let mut h = [0u8; GRH_LEN];
    match kind {
        GrhKind::Ipv6 => {
            h[0] = 0x60; // version 6, traffic class 0, flow label 0
            let paylen = (payload_len + IB_PAYLEN_OVERHEAD) as u16;
            h[4..6].copy_from_slice(&paylen.to_be_bytes());
            h[6] = GRH_NEXT_HEADER_BTH;
            h[7] = GRH_HOP_LIMIT;
            h[8..24].copy_from_slice(&sgid.0);
            h[24..40].copy_from_slice(&dgid.0);
        }
        GrhKind::Ipv4 => {
            // Bytes 0..20 stay zero; the IPv4 header of the RoCEv2 packet follows.
            let ip = &mut h[20..40];
            ip[0] = 0x45; // version 4, IHL 5
            let total = (payload_len + ROCE_V4_OVERHEAD) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6] = 0x40; // don't fragment, as rxe sends
            ip[8] = GRH_HOP_LIMIT;
            ip[9] = 17; // UDP
            ip[12..16].copy_from_slice(&src_v4.octets());
            ip[16..20].copy_from_slice(&dst_v4.octets());
            let sum = crate::wire::ipv4::checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
        }
    }
    h
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
    /// `send_slots * max_payload` bytes.
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
    /// QPs renewals replaced, until the reaper (or the drop) destroys them.
    retired: Arc<RetireQueue<SimRetired>>,
}

impl SimEndpoint {
    /// Why `wr` cannot be posted, if it cannot; else its destination GID.
    fn check_send(&self, wr: &SendWr) -> Result<Gid, VerbsError> {
        if wr.slot >= self.attrs.send_slots {
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
        let start = wr.slot as usize * self.attrs.max_payload as usize;
        &self.send_mem[start..start + wr.len as usize]
    }
}

impl Endpoint for SimEndpoint {
    fn attrs(&self) -> &EndpointAttrs {
        &self.attrs
    }

    /// An out-of-range slot gives an empty slice.
    fn recv_buf(&self, slot: u32) -> &[u8] {
        if slot >= self.attrs.recv_slots {
            return &[];
        }
        let start = slot as usize * self.recv_stride;
        &self.recv_mem[start..start + self.recv_stride]
    }

    /// An out-of-range slot gives an empty slice.
    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        if slot >= self.attrs.send_slots {
            return &mut [];
        }
        let len = self.attrs.max_payload as usize;
        let start = slot as usize * len;
        &mut self.send_mem[start..start + len]
    }

    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        if slot >= self.attrs.recv_slots {
            return Err(VerbsError::Invalid {
                field: "slot",
                why: format!(
                    "receive slot {slot} is outside 0..{}",
                    self.attrs.recv_slots
                ),
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
        lock(&self.qp.state).armed[cq_index(cq)] = true;
        Ok(())
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
    fn renew(&mut self) -> Result<(), VerbsError> {
        self.renew_qp(false)
    }
    fn renew_destroying_old(&mut self) -> Result<(), VerbsError> {
        self.renew_qp(true)
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
    /// [`Endpoint::renew`]: a new QP (new number, empty queues and CQs) on the same
    /// device, slot memory and address handles, in the old one's multicast groups; the
    /// old QP leaves the fabric, and what was posted on it never completes.
    /// With `destroy_old`, the old QP is destroyed here (recorded on this thread, at
    /// once) instead of being retired for its grace.
    fn renew_qp(&mut self, destroy_old: bool) -> Result<(), VerbsError> {
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
        let old = SimRetired {
            qpn: self.qp.qpn,
            at: Instant::now(),
            fabric: Arc::clone(&self.fabric),
        };
        if destroy_old {
            old.destroy()?;
        } else {
            self.retired.retire(Instant::now(), old)?;
        }
        // The completion channel stays: a watched one now hears the new QP.
        let waker = lock(&self.qp.state).waker.take();
        lock(&qp.state).waker = waker;
        self.qp = qp;
        self.attrs.qpn = qpn;
        self.polled.clear();
        self.fabric.renewals.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// Remove QP `qpn` from group `gid`, and the group when it empties.
fn detach(topo: &mut Topology, gid: &Gid, qpn: u32) {
    if let Some(members) = topo.groups.get_mut(gid) {
        members.retain(|m| m.qpn != qpn);
        if members.is_empty() {
            topo.groups.remove(gid);
        }
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

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use mio::unix::SourceFd;
    use std::time::Duration;

    const QKEY: u32 = 0x0B1B_0001;
    const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
    const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

    /// Two devices, `a` (10.0.0.1) and `b` (10.0.0.2), both with a 4096-byte MTU.
    fn fabric() -> SimFabric {
        let f = SimFabric::new();
        f.add_device("a", A_IP, 4096).unwrap();
        f.add_device("b", B_IP, 4096).unwrap();
        f
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

    fn open(f: &SimFabric, device: &str) -> Box<dyn Endpoint> {
        f.open(&cfg(device)).unwrap()
    }

    /// What the poller does with [`Endpoint::watch`]: every completion fd into
    /// `registry` under `cq`, every event fd under `events`.
    pub(crate) fn watch_with(
        ep: &mut dyn Endpoint,
        registry: &mio::Registry,
        cq: mio::Token,
        events: mio::Token,
    ) -> WaitFds {
        let fds = ep.watch().unwrap();
        for (list, token) in [(&fds.cq, cq), (&fds.events, events)] {
            for fd in list {
                registry
                    .register(&mut SourceFd(fd), token, mio::Interest::READABLE)
                    .unwrap();
            }
        }
        fds
    }

    /// Undo [`watch_with`].
    pub(crate) fn unwatch_with(ep: &mut dyn Endpoint, registry: &mio::Registry, fds: &WaitFds) {
        for fd in fds.cq.iter().chain(&fds.events) {
            registry.deregister(&mut SourceFd(fd)).unwrap();
        }
        ep.unwatch();
    }

    fn open_err(f: &SimFabric, cfg: &EndpointConfig) -> VerbsError {
        match f.open(cfg) {
            Ok(_) => panic!("open({cfg:?}) succeeded"),
            Err(e) => e,
        }
    }

    /// A signaled send of `payload` from slot 0.
    fn wr(wr_id: u64, ah: AhHandle, qpn: u32, qkey: u32, len: usize) -> SendWr {
        SendWr {
            wr_id,
            slot: 0,
            len: len as u32,
            dest: Dest { ah, qpn, qkey },
            signaled: true,
        }
    }

    fn send(ep: &mut dyn Endpoint, ah: AhHandle, qpn: u32, qkey: u32, wr_id: u64, payload: &[u8]) {
        ep.send_buf(0)[..payload.len()].copy_from_slice(payload);
        ep.post_send(&[wr(wr_id, ah, qpn, qkey, payload.len())])
            .unwrap();
    }

    fn poll_all(ep: &mut dyn Endpoint, cq: CqKind) -> Vec<Completion> {
        let mut out = [Completion::EMPTY; 64];
        let n = ep.poll_cq(cq, &mut out).unwrap();
        out[..n].to_vec()
    }

    fn errno(e: &VerbsError) -> Option<(&'static str, i32)> {
        match e {
            VerbsError::Verb { verb, source } => Some((verb, source.raw_os_error()?)),
            _ => None,
        }
    }

    fn invalid_field(e: &VerbsError) -> Option<&'static str> {
        match e {
            VerbsError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    use super::super::Dest;

    #[test]
    fn open_attrs_like_rxe() {
        let f = fabric();
        let a = open(&f, "a");
        let at = a.attrs();
        assert_eq!(at.qpn, FIRST_QPN);
        assert_eq!(at.device, "a");
        assert_eq!(at.port, 1);
        assert_eq!(at.gid_index, 1);
        assert_eq!(at.gid, Gid::from_ipv4(A_IP));
        assert_eq!(at.grh_kind, GrhKind::Ipv4);
        assert_eq!(at.max_payload, 4096);
        assert_eq!(at.port_mtu, 4096);
        assert_eq!((at.recv_slots, at.send_slots, at.max_inline), (16, 16, 0));
        assert_eq!(a.recv_buf(0).len(), GRH_LEN + 4096);
        assert_eq!(a.recv_buf(15).len(), GRH_LEN + 4096);
        assert!(a.recv_buf(16).is_empty());

        let mut c = cfg("b");
        c.gid_index = Some(0);
        c.max_payload = Some(1024);
        let mut b = f.open(&c).unwrap();
        let bt = b.attrs().clone();
        assert_eq!(bt.qpn, FIRST_QPN + 1);
        assert_eq!(bt.grh_kind, GrhKind::Ipv6);
        assert_eq!(&bt.gid.0[..2], &[0xfe, 0x80]);
        assert_eq!(bt.gid, f.gids("b").unwrap()[0]);
        assert_eq!(bt.max_payload, 1024);
        assert_eq!(bt.port_mtu, 4096);
        assert_eq!(b.send_buf(0).len(), 1024);
        assert!(b.send_buf(16).is_empty());
        assert_eq!(f.gids("b").unwrap()[1], Gid::from_ipv4(B_IP));
        assert!(f.gids("nope").is_none());
    }

    #[test]
    fn bad_config_is_refused() {
        let f = fabric();
        let mut c = cfg("nope");
        assert!(matches!(open_err(&f, &c), VerbsError::NoDevice(d) if d == "nope"));
        c = cfg("a");
        c.port = 2;
        assert!(matches!(
            open_err(&f, &c),
            VerbsError::BadPort { port: 2, .. }
        ));
        c = cfg("a");
        c.gid_index = Some(2);
        assert!(matches!(open_err(&f, &c), VerbsError::NoGid { .. }));
        for (r, s) in [(0, 16), (16, 0), (MAX_SLOTS + 1, 16), (16, MAX_SLOTS + 1)] {
            c = cfg("a");
            c.recv_slots = r;
            c.send_slots = s;
            let e = open_err(&f, &c);
            assert!(
                matches!(invalid_field(&e), Some("recv_slots" | "send_slots")),
                "{e}"
            );
        }
        for p in [0, 4097] {
            c = cfg("a");
            c.max_payload = Some(p);
            assert_eq!(invalid_field(&open_err(&f, &c)), Some("mtu"));
        }
        // Nothing half-opened, and failed opens use no QPN.
        assert_eq!(f.live_qps(), 0);
        assert_eq!(open(&f, "a").attrs().qpn, FIRST_QPN);

        assert_eq!(
            invalid_field(
                &f.add_device("c", Ipv4Addr::new(10, 0, 0, 3), 1500)
                    .unwrap_err()
            ),
            Some("mtu")
        );
        assert_eq!(
            invalid_field(
                &f.add_device("a", Ipv4Addr::new(10, 0, 0, 3), 1024)
                    .unwrap_err()
            ),
            Some("device")
        );
        assert_eq!(
            invalid_field(&f.add_device("c", A_IP, 1024).unwrap_err()),
            Some("ipv4")
        );
    }

    #[test]
    fn qpns_increase_and_are_never_reused() {
        let f = fabric();
        let mut seen = Vec::new();
        for i in 0..10 {
            let ep = open(&f, if i % 2 == 0 { "a" } else { "b" });
            seen.push(ep.attrs().qpn);
            drop(ep);
        }
        let want: Vec<u32> = (FIRST_QPN..FIRST_QPN + 10).collect();
        assert_eq!(seen, want);
        // Also when an older endpoint is still open.
        let keep = open(&f, "a");
        let next = open(&f, "b");
        assert_eq!(
            (keep.attrs().qpn, next.attrs().qpn),
            (FIRST_QPN + 10, FIRST_QPN + 11)
        );
    }

    /// Verify a RoCEv2 IPv4 GRH and return nothing; panics with what differs.
    fn check_ipv4_grh(grh: &[u8], len: usize, src: Ipv4Addr, dst: Ipv4Addr) {
        assert_eq!(&grh[..20], &[0; 20]);
        let ip = &grh[20..40];
        assert_eq!(ip[0], 0x45);
        assert_eq!(
            u16::from_be_bytes([ip[2], ip[3]]) as usize,
            len + ROCE_V4_OVERHEAD
        );
        assert_eq!(ip[8], 64, "ttl");
        assert_eq!(ip[9], 17, "protocol");
        assert_eq!(&ip[12..16], &src.octets());
        assert_eq!(&ip[16..20], &dst.octets());
        // A correct checksum makes the header sum to 0xffff.
        let mut sum: u32 = ip
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        while sum > 0xffff {
            sum = (sum & 0xffff) + (sum >> 16);
        }
        assert_eq!(sum, 0xffff, "checksum");
    }

    #[test]
    fn unicast_ipv4_grh_and_byte_len() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        let b_qpn = b.attrs().qpn;
        for slot in [3, 5] {
            b.post_recv(100 + u64::from(slot), slot).unwrap();
        }
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let p1: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
        send(&mut *a, ah, b_qpn, QKEY, 7, &p1);
        send(&mut *a, ah, b_qpn, QKEY, 8, b"second");

        assert_eq!(
            poll_all(&mut *a, CqKind::Send),
            vec![
                Completion {
                    wr_id: 7,
                    ..Completion::EMPTY
                },
                Completion {
                    wr_id: 8,
                    ..Completion::EMPTY
                }
            ]
        );
        let rc = poll_all(&mut *b, CqKind::Recv);
        let expect = |wr_id, len: usize| Completion {
            wr_id,
            status: WcStatus::Success,
            byte_len: (len + GRH_LEN) as u32,
            src_qp: a.attrs().qpn,
            has_grh: true,
        };
        assert_eq!(rc, vec![expect(103, 1000), expect(105, 6)]);
        let buf = b.recv_buf(3);
        check_ipv4_grh(&buf[..GRH_LEN], 1000, A_IP, B_IP);
        assert_eq!(&buf[GRH_LEN..GRH_LEN + 1000], &p1[..]);
        let buf = b.recv_buf(5);
        check_ipv4_grh(&buf[..GRH_LEN], 6, A_IP, B_IP);
        assert_eq!(&buf[GRH_LEN..GRH_LEN + 6], b"second");
        let c = f.counters();
        assert_eq!(c.delivered, 2);
        assert_eq!(SimCounters { delivered: 0, ..c }, SimCounters::default());
    }

    #[test]
    fn unicast_ipv6_grh() {
        let f = fabric();
        let mut c = cfg("a");
        c.gid_index = Some(0);
        let mut a = f.open(&c).unwrap();
        c.device = "b".into();
        let mut b = f.open(&c).unwrap();
        let (a_gid, b_gid) = (a.attrs().gid, b.attrs().gid);
        b.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&b_gid).unwrap();
        send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"hello ipv6");
        let rc = poll_all(&mut *b, CqKind::Recv);
        assert_eq!(rc.len(), 1);
        assert_eq!(rc[0].byte_len, 50);
        assert!(rc[0].has_grh);
        let g = &b.recv_buf(0)[..GRH_LEN];
        assert_eq!(g[0], 0x60);
        assert_eq!(&g[1..4], &[0, 0, 0]);
        assert_eq!(u16::from_be_bytes([g[4], g[5]]), 10 + 24);
        assert_eq!(g[6], 0x1B);
        assert_eq!(g[7], 64);
        assert_eq!(&g[8..24], &a_gid.0);
        assert_eq!(&g[24..40], &b_gid.0);
        assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 10], b"hello ipv6");
    }

    #[test]
    fn grh_follows_the_receivers_layout() {
        // An IPv4-mapped sender to a link-local receiver: IPv6 layout at the receiver.
        let f = fabric();
        let mut a = open(&f, "a");
        let mut c = cfg("b");
        c.gid_index = Some(0);
        let mut b = f.open(&c).unwrap();
        b.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&b.attrs().gid).unwrap();
        send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"x");
        assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);
        let g = &b.recv_buf(0)[..GRH_LEN];
        assert_eq!(g[0], 0x60);
        assert_eq!(&g[8..24], &Gid::from_ipv4(A_IP).0);
    }

    #[test]
    fn multicast_reaches_every_member_including_the_sender() {
        let f = fabric();
        let group = Gid::from_ipv4(Ipv4Addr::new(239, 1, 2, 3));
        let mut eps: Vec<Box<dyn Endpoint>> =
            ["a", "b", "b", "a"].iter().map(|d| open(&f, d)).collect();
        for (i, ep) in eps.iter_mut().enumerate() {
            ep.post_recv(10 + i as u64, 0).unwrap();
            ep.post_recv(20 + i as u64, 1).unwrap();
            if i < 3 {
                ep.attach_mcast(&group).unwrap();
                ep.attach_mcast(&group).unwrap(); // idempotent
            }
        }
        assert_eq!(f.mcast_groups(), 1);
        let ah = eps[0].create_ah(&group).unwrap();
        send(&mut *eps[0], ah, MULTICAST_QPN, QKEY, 99, b"to all");
        assert_eq!(poll_all(&mut *eps[0], CqKind::Send).len(), 1);
        let src_qp = eps[0].attrs().qpn;
        for (i, ep) in eps.iter_mut().enumerate() {
            let rc = poll_all(&mut **ep, CqKind::Recv);
            if i < 3 {
                assert_eq!(rc.len(), 1, "member {i} gets exactly one copy");
                assert_eq!(rc[0].wr_id, 10 + i as u64);
                assert_eq!(rc[0].src_qp, src_qp);
                assert_eq!(rc[0].byte_len, 46);
                let own_ip = ep.attrs().gid.as_ipv4().unwrap();
                assert_ne!(own_ip, Ipv4Addr::new(239, 1, 2, 3));
                check_ipv4_grh(
                    &ep.recv_buf(0)[..GRH_LEN],
                    6,
                    A_IP,
                    Ipv4Addr::new(239, 1, 2, 3),
                );
                assert_eq!(&ep.recv_buf(0)[GRH_LEN..GRH_LEN + 6], b"to all");
            } else {
                assert!(rc.is_empty(), "non-member got {rc:?}");
            }
        }
        let c = f.counters();
        assert_eq!((c.delivered, c.mcast_delivered), (3, 3));

        // Detach: only the others get the next one; detaching twice is EINVAL.
        eps[1].detach_mcast(&group).unwrap();
        assert_eq!(
            errno(&eps[1].detach_mcast(&group).unwrap_err()),
            Some(("ibv_detach_mcast", libc::EINVAL))
        );
        send(&mut *eps[0], ah, MULTICAST_QPN, QKEY, 100, b"again");
        let got: Vec<usize> = eps
            .iter_mut()
            .map(|ep| poll_all(&mut **ep, CqKind::Recv).len())
            .collect();
        assert_eq!(got, vec![1, 0, 1, 0]);

        // A multicast GID with a unicast QPN, or a group nobody joined, goes nowhere.
        let member_qpn = eps[2].attrs().qpn;
        send(&mut *eps[0], ah, member_qpn, QKEY, 101, b"x");
        let empty = eps[0].create_ah(&"ff12:401b::1".parse().unwrap()).unwrap();
        send(&mut *eps[0], empty, MULTICAST_QPN, QKEY, 102, b"x");
        assert_eq!(f.counters().unknown_dest, 2);

        // Attaching a unicast GID is refused.
        assert_eq!(
            invalid_field(&eps[3].attach_mcast(&Gid::from_ipv4(B_IP)).unwrap_err()),
            Some("mcast gid")
        );
    }

    #[test]
    fn ib_style_multicast_group() {
        let f = fabric();
        let group: Gid = "ff12:401b:ffff::1".parse().unwrap();
        let mut c = cfg("a");
        c.gid_index = Some(0);
        let mut a = f.open(&c).unwrap();
        a.attach_mcast(&group).unwrap();
        a.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&group).unwrap();
        send(&mut *a, ah, MULTICAST_QPN, QKEY, 1, b"loop");
        assert_eq!(poll_all(&mut *a, CqKind::Recv).len(), 1);
        assert_eq!(&a.recv_buf(0)[24..40], &group.0);
    }

    #[test]
    fn qkey_mismatch_is_dropped_and_counted() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let qpn = b.attrs().qpn;
        send(&mut *a, ah, qpn, QKEY + 1, 5, b"wrong key");
        assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
        assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
        assert_eq!(f.counters().qkey_mismatch, 1);
        // The receive is still posted: the next good packet takes it.
        send(&mut *a, ah, qpn, QKEY, 6, b"right key");
        assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].wr_id, 1);
        // High bit set: the sender's own Q_Key is used (equal here).
        b.post_recv(2, 0).unwrap();
        send(&mut *a, ah, qpn, 0x8000_0000, 7, b"qp key");
        assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].wr_id, 2);
        assert_eq!(f.counters().qkey_mismatch, 1);
        assert_eq!(f.counters().delivered, 2);
    }

    #[test]
    fn no_posted_receive_is_dropped_and_counted() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"nobody home");
        assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
        assert_eq!(f.counters().no_recv_posted, 1);
        b.post_recv(1, 0).unwrap();
        assert!(
            poll_all(&mut *b, CqKind::Recv).is_empty(),
            "not delivered late"
        );
    }

    #[test]
    fn oversize_is_dropped_and_counted() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut c = cfg("b");
        c.max_payload = Some(1000);
        let mut b = f.open(&c).unwrap();
        b.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let qpn = b.attrs().qpn;
        send(&mut *a, ah, qpn, QKEY, 1, &[7; 1001]);
        assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
        assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
        assert_eq!(f.counters().oversized, 1);
        send(&mut *a, ah, qpn, QKEY, 2, &[7; 1000]);
        assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].byte_len, 1040);

        // Over the sender's own limit: refused at post time.
        let e = b
            .post_send(&[wr(1, AhHandle(0), qpn, QKEY, 1001)])
            .unwrap_err();
        assert_eq!(e.posted, 0);
        assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::EINVAL)));
    }

    #[test]
    fn unknown_destination_is_dropped_and_counted() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.post_recv(1, 0).unwrap();
        let to_b = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let to_a = a.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
        let nowhere = a
            .create_ah(&Gid::from_ipv4(Ipv4Addr::new(10, 9, 9, 9)))
            .unwrap();
        let b_qpn = b.attrs().qpn;
        send(&mut *a, to_b, 4242, QKEY, 1, b"no such qpn");
        send(&mut *a, to_a, b_qpn, QKEY, 2, b"qp is on the other device");
        send(&mut *a, nowhere, b_qpn, QKEY, 3, b"no such gid");
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 3);
        assert_eq!(f.counters().unknown_dest, 3);
        assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
    }

    #[test]
    fn set_qp_error_flushes_both_queues_in_order() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.post_recv(1, 0).unwrap();
        for (id, slot) in [(10, 4), (11, 2), (12, 9)] {
            a.post_recv(id, slot).unwrap();
        }
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let b_qpn = b.attrs().qpn;
        // A completed send stays a success; held sends are outstanding.
        send(&mut *a, ah, b_qpn, QKEY, 1, b"done");
        assert!(f.hold_sends(a.attrs().qpn, true));
        let chain: Vec<SendWr> = (2..5).map(|id| wr(id, ah, b_qpn, QKEY, 4)).collect();
        a.post_send(&chain).unwrap();
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
        assert!(poll_all(&mut *a, CqKind::Send).is_empty());

        a.set_qp_error().unwrap();
        let flushed = |ids: &[u64]| -> Vec<Completion> {
            ids.iter()
                .map(|&wr_id| Completion {
                    wr_id,
                    status: WcStatus::Flushed,
                    ..Completion::EMPTY
                })
                .collect()
        };
        assert_eq!(poll_all(&mut *a, CqKind::Recv), flushed(&[10, 11, 12]));
        assert_eq!(poll_all(&mut *a, CqKind::Send), flushed(&[2, 3, 4]));
        assert_eq!(f.counters().delivered, 1, "held sends were never delivered");

        // Afterwards every post flushes at once and nothing is delivered.
        a.post_recv(13, 0).unwrap();
        send(&mut *a, ah, b_qpn, QKEY, 5, b"after");
        assert_eq!(poll_all(&mut *a, CqKind::Recv), flushed(&[13]));
        assert_eq!(poll_all(&mut *a, CqKind::Send), flushed(&[5]));
        assert_eq!(f.counters().delivered, 1);
        assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);

        // Packets to a QP in error are dropped and counted.
        let mut c = open(&f, "b");
        let to_a = c.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
        send(&mut *c, to_a, a.attrs().qpn, QKEY, 1, b"to error");
        assert_eq!(f.counters().receiver_in_error, 1);
    }

    #[test]
    fn error_keeps_completions_already_queued() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.post_recv(1, 0).unwrap();
        b.post_recv(2, 1).unwrap();
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"arrived");
        b.set_qp_error().unwrap();
        let rc = poll_all(&mut *b, CqKind::Recv);
        assert_eq!(
            rc.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
            vec![(1, WcStatus::Success), (2, WcStatus::Flushed)]
        );
        assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 7], b"arrived");
    }

    #[test]
    fn held_sends_are_copied_at_post_time_and_run_on_release() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.post_recv(1, 0).unwrap();
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        assert!(!f.hold_sends(9999, true));
        assert!(f.hold_sends(a.attrs().qpn, true));
        send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"original");
        a.send_buf(0)[..8].copy_from_slice(b"mutated!");
        assert!(poll_all(&mut *a, CqKind::Send).is_empty());
        assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
        assert!(f.hold_sends(a.attrs().qpn, false));
        assert_eq!(poll_all(&mut *a, CqKind::Send)[0].wr_id, 1);
        assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);
        assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 8], b"original");
    }

    #[test]
    fn post_errors() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        assert_eq!(
            invalid_field(&a.post_recv(1, 16).unwrap_err()),
            Some("slot")
        );
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let qpn = b.attrs().qpn;

        // A bad WR in the middle: the prefix is posted, the rest is not.
        let mut chain = [
            wr(1, ah, qpn, QKEY, 1),
            wr(2, ah, qpn, QKEY, 1),
            wr(3, ah, qpn, QKEY, 1),
        ];
        chain[1].slot = 16;
        let e = a.post_send(&chain).unwrap_err();
        assert_eq!(e.posted, 1);
        assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::EINVAL)));
        chain[1].slot = 0;
        chain[2].dest.ah = AhHandle(77);
        let e = a.post_send(&chain).unwrap_err();
        assert_eq!(e.posted, 2);
        assert!(matches!(e.error, VerbsError::UnknownAh(AhHandle(77))));
        assert_eq!(
            poll_all(&mut *a, CqKind::Send)
                .iter()
                .map(|c| c.wr_id)
                .collect::<Vec<_>>(),
            vec![1, 1, 2]
        );

        // AHs: unknown destroy, destroyed handle no longer usable.
        assert!(matches!(
            a.destroy_ah(AhHandle(77)),
            Err(VerbsError::UnknownAh(_))
        ));
        let ah2 = a.create_ah(&Gid::ZERO).unwrap();
        assert_ne!(ah2, ah);
        a.destroy_ah(ah2).unwrap();
        assert!(matches!(a.destroy_ah(ah2), Err(VerbsError::UnknownAh(_))));
        let e = a.post_send(&[wr(9, ah2, qpn, QKEY, 1)]).unwrap_err();
        assert!(matches!(e.error, VerbsError::UnknownAh(_)));

        // Send queue full until completions are polled (16 slots).
        let many: Vec<SendWr> = (0..17).map(|i| wr(i, ah, qpn, QKEY, 1)).collect();
        let e = a.post_send(&many).unwrap_err();
        assert_eq!(e.posted, 16);
        assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::ENOMEM)));
        let e = a.post_send(&many[..1]).unwrap_err();
        assert_eq!(e.posted, 0);
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 16);
        a.post_send(&many[..1]).unwrap();

        // Unsignaled sends hold their entries until a later completion is polled.
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
        let mut quiet = many.clone();
        for w in &mut quiet {
            w.signaled = false;
        }
        a.post_send(&quiet[..15]).unwrap();
        assert!(poll_all(&mut *a, CqKind::Send).is_empty());
        a.post_send(&many[..1]).unwrap();
        assert_eq!(a.post_send(&many[..1]).unwrap_err().posted, 0);
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
        a.post_send(&many[..16]).unwrap();

        // Receive queue full: posted plus completed-but-unpolled.
        for i in 0..16 {
            b.post_recv(i, i as u32).unwrap();
        }
        assert_eq!(
            errno(&b.post_recv(16, 0).unwrap_err()),
            Some(("ibv_post_recv", libc::ENOMEM))
        );
        // Completed receives still count until polled.
        assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 16);
        a.post_send(&many[..8]).unwrap();
        assert!(b.post_recv(16, 0).is_err());
        assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 8);
        for i in 0..8 {
            b.post_recv(16 + i, i as u32).unwrap();
        }
        assert!(b.post_recv(24, 0).is_err());
    }

    #[test]
    fn events_fire_once_when_armed_and_wake_mio() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        let mut poll = mio::Poll::new().unwrap();
        let mut events = mio::Events::with_capacity(8);
        const CQ: mio::Token = mio::Token(1);
        let fds = watch_with(&mut *b, poll.registry(), CQ, mio::Token(2));
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let qpn = b.attrs().qpn;
        for i in 0..4 {
            b.post_recv(i, i as u32).unwrap();
        }
        let short = Some(Duration::from_millis(50));

        // Unarmed: completion, no event, no wakeup.
        send(&mut *a, ah, qpn, QKEY, 1, b"1");
        poll.poll(&mut events, short).unwrap();
        assert!(events.is_empty());
        assert_eq!(b.take_cq_events().unwrap(), (0, 0));

        // Armed: two completions, one event, one wakeup.
        b.req_notify(CqKind::Recv).unwrap();
        send(&mut *a, ah, qpn, QKEY, 2, b"2");
        send(&mut *a, ah, qpn, QKEY, 3, b"3");
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            events.iter().map(|e| e.token()).collect::<Vec<_>>(),
            vec![CQ]
        );
        assert_eq!(b.take_cq_events().unwrap(), (1, 0));
        assert_eq!(b.take_cq_events().unwrap(), (0, 0));
        assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 3);

        // The send CQ is armed separately.
        b.req_notify(CqKind::Send).unwrap();
        let to_a = b.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
        send(&mut *b, to_a, a.attrs().qpn, QKEY, 1, b"back");
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(events.iter().count(), 1);
        assert_eq!(b.take_cq_events().unwrap(), (0, 1));

        // Flushes raise events too.
        b.req_notify(CqKind::Recv).unwrap();
        b.set_qp_error().unwrap();
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(events.iter().count(), 1);
        assert_eq!(b.take_cq_events().unwrap(), (1, 0));

        // Unwatched: events still counted, nobody woken.
        unwatch_with(&mut *b, poll.registry(), &fds);
        b.req_notify(CqKind::Recv).unwrap();
        b.post_recv(9, 0).unwrap();
        poll.poll(&mut events, short).unwrap();
        assert!(events.is_empty());
        assert_eq!(b.take_cq_events().unwrap(), (1, 0));
        assert_eq!(b.next_async_event().unwrap(), None);
    }

    #[test]
    fn watch_with_pending_events_wakes_at_once() {
        let f = fabric();
        let mut a = open(&f, "a");
        a.req_notify(CqKind::Recv).unwrap();
        a.set_qp_error().unwrap();
        a.post_recv(1, 0).unwrap();
        let mut poll = mio::Poll::new().unwrap();
        let mut events = mio::Events::with_capacity(8);
        watch_with(&mut *a, poll.registry(), mio::Token(7), mio::Token(8));
        poll.poll(&mut events, Some(Duration::from_secs(5)))
            .unwrap();
        assert_eq!(
            events.iter().map(|e| e.token()).collect::<Vec<_>>(),
            vec![mio::Token(7)]
        );
        assert_eq!(a.take_cq_events().unwrap(), (1, 0));
    }

    #[test]
    fn dropping_endpoints_leaves_nothing_behind() {
        let f = fabric();
        let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 0, 1));
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        let mut c = open(&f, "b");
        for ep in [&mut a, &mut b, &mut c] {
            ep.attach_mcast(&group).unwrap();
            ep.post_recv(1, 0).unwrap();
        }
        let mut poll = mio::Poll::new().unwrap();
        watch_with(&mut *b, poll.registry(), mio::Token(1), mio::Token(2));
        let b_qpn = b.attrs().qpn;
        assert_eq!((f.live_qps(), f.mcast_groups()), (3, 1));
        drop(b);
        assert_eq!(f.live_qps(), 2);
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        send(&mut *a, ah, b_qpn, QKEY, 1, b"gone");
        assert_eq!(f.counters().unknown_dest, 1);
        let m = a.create_ah(&group).unwrap();
        send(&mut *a, m, MULTICAST_QPN, QKEY, 2, b"still a group");
        assert_eq!(f.counters().mcast_delivered, 2);
        drop(a);
        drop(c);
        assert_eq!((f.live_qps(), f.mcast_groups()), (0, 0));
        // Every QP, with its packet buffers, is freed: only the fabric holds the topology.
        let topo = read(&f.inner.topo);
        assert!(topo.qps.is_empty() && topo.groups.is_empty());
        drop(topo);
        let _ = poll.poll(&mut mio::Events::with_capacity(1), Some(Duration::ZERO));
    }

    #[test]
    fn renew_replaces_the_qp_and_keeps_memory_and_handles() {
        let f = fabric();
        let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 0, 1));
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        b.attach_mcast(&group).unwrap();
        b.post_recv(7, 3).unwrap();
        b.post_recv(8, 4).unwrap();
        b.send_buf(2)[..4].copy_from_slice(b"kept");
        let to_a = b.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
        let old = b.attrs().qpn;
        // Watched while renewing: the channel hears the new QP.
        let poll = mio::Poll::new().unwrap();
        let fds = watch_with(&mut *b, poll.registry(), mio::Token(1), mio::Token(2));
        assert_eq!((f.opens(), f.renewals()), (2, 0));
        b.renew().unwrap();
        assert_eq!((f.opens(), f.renewals()), (2, 1), "no open, one renewal");
        let new = b.attrs().qpn;
        assert!(new > old, "a new QPN: {old} -> {new}");
        assert_eq!(f.live_qps(), 2);
        // The new QP is in the group, the old one is not.
        let members: Vec<u32> = read(&f.inner.topo).groups[&group]
            .iter()
            .map(|m| m.qpn)
            .collect();
        assert_eq!(members, vec![new]);
        b.attach_mcast(&group).unwrap();
        assert_eq!(read(&f.inner.topo).groups[&group].len(), 1, "no-op");
        // The slot memory is the same memory.
        assert_eq!(&b.send_buf(2)[..4], b"kept");
        // What was posted on the old QP never completes (the caller reaps it) ...
        assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
        // ... and the old QPN is gone from the fabric.
        let to_b = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        send(&mut *a, to_b, old, QKEY, 1, b"stale");
        assert_eq!(f.counters().unknown_dest, 1);
        // The new QP works, and the address handle made before the renewal too.
        b.post_recv(9, 0).unwrap();
        b.req_notify(CqKind::Recv).unwrap();
        send(&mut *a, to_b, new, QKEY, 2, b"fresh");
        let got = poll_all(&mut *b, CqKind::Recv);
        assert_eq!(got.len(), 1);
        assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::Success));
        assert_eq!(
            b.take_cq_events().unwrap(),
            (1, 0),
            "event on the kept channel"
        );
        a.post_recv(1, 0).unwrap();
        send(&mut *b, to_a, a.attrs().qpn, QKEY, 3, b"back");
        assert_eq!(poll_all(&mut *a, CqKind::Recv).len(), 1);
        unwatch_with(&mut *b, poll.registry(), &fds);
    }

    #[test]
    fn renew_refuses_when_the_port_changed() {
        let f = fabric();
        let mut a = open(&f, "a");
        let qpn = a.attrs().qpn;
        f.reconfigure_device("a", Ipv4Addr::new(10, 0, 0, 9), 2048)
            .unwrap();
        assert!(matches!(a.renew(), Err(VerbsError::RenewRefused(_))));
        assert_eq!(a.attrs().qpn, qpn, "nothing changed");
        assert_eq!(f.renewals(), 0);
        drop(a);
        assert_eq!(f.live_qps(), 0);
    }

    #[test]
    fn packet_buffers_are_recycled() {
        let f = fabric();
        let mut a = open(&f, "a");
        let mut b = open(&f, "b");
        let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
        let qpn = b.attrs().qpn;
        let mut out = [Completion::EMPTY; 16];
        for round in 0..100u64 {
            for i in 0..16 {
                b.post_recv(round * 16 + i, i as u32).unwrap();
            }
            let chain: Vec<SendWr> = (0..16).map(|i| wr(i, ah, qpn, QKEY, 1500)).collect();
            a.post_send(&chain).unwrap();
            assert_eq!(a.poll_cq(CqKind::Send, &mut out).unwrap(), 16);
            assert_eq!(b.poll_cq(CqKind::Recv, &mut out).unwrap(), 16);
        }
        // Reposting returns the last poll's buffers to the pool: all 16 ever allocated
        // are there, and the pool never grew past its initial capacity.
        b.post_recv(0, 0).unwrap();
        let b_qp = read(&f.inner.topo).qps[&qpn].clone();
        let st = lock(&b_qp.state);
        assert_eq!((st.pool.len(), st.pool.capacity()), (16, 16));
        drop(st);
        assert_eq!(f.counters().delivered, 1600);
    }

    #[test]
    fn two_threads_exchange_100k_packets_without_loss() {
        const PACKETS: u64 = 100_000;
        const RING: u32 = 64;
        let f = fabric();
        let mut c = cfg("a");
        c.recv_slots = RING;
        c.send_slots = RING;
        let a = f.open(&c).unwrap();
        c.device = "b".into();
        let b = f.open(&c).unwrap();
        let (a_qpn, b_qpn) = (a.attrs().qpn, b.attrs().qpn);
        // Credits: a receiver hands one back to its peer for every receive it reposts.
        let (to_a, a_credits) = crossbeam_channel::unbounded::<u32>();
        let (to_b, b_credits) = crossbeam_channel::unbounded::<u32>();

        let run = move |mut ep: Box<dyn Endpoint>,
                        peer: Gid,
                        peer_qpn: u32,
                        credits: crossbeam_channel::Receiver<u32>,
                        give: crossbeam_channel::Sender<u32>| {
            move || {
                let ah = ep.create_ah(&peer).unwrap();
                for slot in 0..RING {
                    ep.post_recv(u64::from(slot), slot).unwrap();
                }
                give.send(RING).unwrap();
                let (mut sent, mut received, mut window) = (0u64, 0u64, 0u32);
                let mut out = [Completion::EMPTY; 32];
                let mut send_free: Vec<u32> = (0..RING).collect();
                while sent < PACKETS || received < PACKETS {
                    let mut idle = true;
                    while let Ok(n) = credits.try_recv() {
                        window += n;
                    }
                    while sent < PACKETS && window > 0 {
                        let Some(slot) = send_free.pop() else { break };
                        ep.send_buf(slot)[..8].copy_from_slice(&sent.to_be_bytes());
                        ep.post_send(&[SendWr {
                            wr_id: u64::from(slot),
                            slot,
                            len: 8 + (sent % 1000) as u32,
                            dest: Dest {
                                ah,
                                qpn: peer_qpn,
                                qkey: QKEY,
                            },
                            signaled: true,
                        }])
                        .unwrap();
                        sent += 1;
                        window -= 1;
                        idle = false;
                    }
                    let n = ep.poll_cq(CqKind::Send, &mut out).unwrap();
                    for c in &out[..n] {
                        assert_eq!(c.status, WcStatus::Success);
                        send_free.push(c.wr_id as u32);
                    }
                    let n = ep.poll_cq(CqKind::Recv, &mut out).unwrap();
                    for c in &out[..n] {
                        assert_eq!(c.status, WcStatus::Success);
                        let slot = c.wr_id as u32;
                        let buf = ep.recv_buf(slot);
                        let seq = u64::from_be_bytes(buf[GRH_LEN..GRH_LEN + 8].try_into().unwrap());
                        assert_eq!(seq, received, "in order, none lost");
                        assert_eq!(c.byte_len as u64, GRH_LEN as u64 + 8 + seq % 1000);
                        received += 1;
                        ep.post_recv(c.wr_id, slot).unwrap();
                    }
                    if n > 0 {
                        // The peer may stop caring once it has sent everything.
                        let _ = give.send(n as u32);
                        idle = false;
                    }
                    if idle {
                        std::thread::yield_now();
                    }
                }
                ep
            }
        };
        let ta = std::thread::spawn(run(a, Gid::from_ipv4(B_IP), b_qpn, a_credits, to_b));
        let tb = std::thread::spawn(run(b, Gid::from_ipv4(A_IP), a_qpn, b_credits, to_a));
        let a = ta.join().unwrap();
        let b = tb.join().unwrap();
        let c = f.counters();
        assert_eq!(c.delivered, 2 * PACKETS);
        assert_eq!(SimCounters { delivered: 0, ..c }, SimCounters::default());
        drop((a, b));
        assert_eq!(f.live_qps(), 0);
    }
}
