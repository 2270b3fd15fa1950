//! Interfaces on the simulated fabric, driven through the public API, with the checks
//! the datapath targets make after every frame.
//!
//! Each input gets a fresh fabric (`sim0` 198.18.0.1, `sim1` 198.18.0.2) so that a
//! crashing input reproduces on its own. Interface A (198.18.2.1/24 on `sim0`) is the
//! one fuzzed; in the TX target interface B (198.18.2.2 on `sim1`) receives what A sends,
//! in the RX target a raw endpoint on `sim1` sends A whatever the input holds.

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use uipoib::iface::napi::TxGate;
use uipoib::iface::stats::{self, DropReason, Stats};
use uipoib::iface::{IfaceConfig, Interface};
use uipoib::runtime::config::{DEFAULT_GROUP, DEFAULT_QKEY};
use uipoib::runtime::supervisor::Close;
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{
    AhHandle, Completion, CqKind, Dest, Endpoint, EndpointConfig, Gid, MULTICAST_QPN, Provider,
    SendWr,
};
use uipoib::wire::arp::{EthArp, IpoibArp};
use uipoib::wire::eth::{self, Mac, mac_for_gid};
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::ipv4::Ipv4Cidr;
use uipoib::wire::ndisc::{self, LinkAddr};
use uipoib::wire::offload::{GSO_ECN, GSO_TCPV4, GSO_TCPV6, VNET_HDR_LEN};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ipoib, ipv6};

use crate::checks::check_coalesced;
use crate::frames::{arp_reply, arp_request};
use crate::tap::TapDouble;

/// Interface A's address.
pub const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
/// Interface B's address.
pub const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);
/// Receive ring of each interface: more than a send ring, so that nothing one batch
/// sends finds the receiver's ring empty.
const RECV_SLOTS: u32 = 16;
/// Send ring of each interface (small, so that backpressure is reached).
const SEND_SLOTS: u32 = 8;
/// Bound on TX turns for one TAP read (a 64 KiB super-frame of 1-byte segments needs
/// 8192 turns of 8).
const MAX_TURNS: usize = 10_000;

/// The smallest `gso_size` the TX target gives A's TAP: the kernel's smallest TCP MSS
/// (`TCP_MIN_SND_MSS`), so a super-frame of the largest input is cut into at most ~90
/// segments.
pub const MIN_MSS: u16 = 48;

/// Mode bits of an input, shared by the datapath targets.
pub mod mode {
    /// Interface A's TAP has offloads (`IFF_VNET_HDR`: TAP reads start with a
    /// `virtio_net_hdr`; received frames are joined).
    pub const A_OFFLOAD: u8 = 1 << 0;
    /// Interface B's TAP has offloads (TX target).
    pub const B_OFFLOAD: u8 = 1 << 1;
    /// A and B learn each other by an ARP exchange before the input's frames (TX
    /// target).
    pub const INTRODUCE: u8 = 1 << 2;
    /// Use GID index 0 (the link-local GID: IB/IPv6 GRH layout) instead of the
    /// IPv4-mapped GID (RoCEv2/IPv4 GRH layout).
    pub const LINK_LOCAL: u8 = 1 << 3;
    /// Port MTU 256 instead of 2048.
    pub const SMALL_MTU: u8 = 1 << 4;
    /// Read one frame per TX turn (`tx-batch` 1), so each frame is checked to arrive at
    /// B translated; otherwise 32 per turn, checked in aggregate (TX target).
    pub const ONE_BY_ONE: u8 = 1 << 5;
}

/// Counters one check compares before and after.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    rx_drops: u64,
    tx_drops: u64,
    rx_packets: u64,
    rx_own_looped: u64,
    recv_completed: u64,
    send_posted: u64,
    neigh_resolves: u64,
    completions_rejected: u64,
}

impl Tally {
    /// Read them from `s`.
    pub fn of(s: &Stats) -> Tally {
        let mut t = Tally {
            rx_packets: stats::get(&s.rx_packets),
            rx_own_looped: stats::get(&s.rx_own_looped),
            recv_completed: stats::get(&s.recv_completed),
            send_posted: stats::get(&s.send_posted),
            neigh_resolves: stats::get(&s.neigh_resolves),
            completions_rejected: stats::get(&s.completions_rejected),
            ..Tally::default()
        };
        for r in DropReason::ALL {
            if r.name().starts_with("rx_") {
                t.rx_drops += s.drops(r);
            } else {
                t.tx_drops += s.drops(r);
            }
        }
        t
    }

    fn minus(self, b: Tally) -> Tally {
        Tally {
            rx_drops: self.rx_drops - b.rx_drops,
            tx_drops: self.tx_drops - b.tx_drops,
            rx_packets: self.rx_packets - b.rx_packets,
            rx_own_looped: self.rx_own_looped - b.rx_own_looped,
            recv_completed: self.recv_completed - b.recv_completed,
            send_posted: self.send_posted - b.send_posted,
            neigh_resolves: self.neigh_resolves - b.neigh_resolves,
            completions_rejected: self.completions_rejected - b.completions_rejected,
        }
    }
}

fn params(device: &str, addr: Ipv4Addr, m: u8, tx_batch: u32) -> IfaceConfig {
    IfaceConfig {
        addr: Ipv4Cidr { addr, prefix: 24 },
        addr6: Vec::new(),
        mtu: None,
        qkey: DEFAULT_QKEY,
        group: Gid::from_ipv4(DEFAULT_GROUP),
        budget: RECV_SLOTS,
        poll_batch: 4,
        tx_batch,
        endpoint: EndpointConfig {
            device: device.into(),
            port: 1,
            gid_index: gid_index(m),
            qkey: DEFAULT_QKEY,
            recv_slots: RECV_SLOTS,
            send_slots: SEND_SLOTS,
            max_payload: None,
            banks: 1,
        },
        neigh_capacity: 16,
        neigh_max_age: Duration::from_secs(300),
        tx_timeout: Duration::from_secs(3),
        poll_failure: Default::default(),
        busy_poll: Default::default(),
        // On, so that received frames can reach the AQM's TCP parse when a poll's queue
        // stands.
        rx_aqm: uipoib::iface::aqm::CODEL_INTERVAL,
        rx_boost_nice: None,
        poller_batch: false,
        neigh_view: Default::default(),
    }
}

fn gid_index(m: u8) -> Option<u8> {
    (m & mode::LINK_LOCAL != 0).then_some(0)
}

fn fabric(m: u8) -> SimFabric {
    let mtu = if m & mode::SMALL_MTU != 0 { 256 } else { 2048 };
    let f = SimFabric::new();
    f.add_device("sim0", Ipv4Addr::new(198, 18, 0, 1), mtu)
        .expect("sim0");
    f.add_device("sim1", Ipv4Addr::new(198, 18, 0, 2), mtu)
        .expect("sim1");
    f
}

fn open(f: &SimFabric, dev: &str, ip: Ipv4Addr, m: u8, tx_batch: u32) -> Interface {
    Interface::open(
        f,
        &params(dev, ip, m, tx_batch),
        Arc::new(Stats::default()),
        1,
        &mut None,
    )
    .expect("opening an interface on the simulated fabric")
}

/// The ledger and the stats' view of it balance.
fn check_ledger(i: &Interface, who: &str) {
    if let Err(e) = i.ledger().check() {
        panic!("{who}: the ledger does not balance: {e}");
    }
    assert!(
        i.stats().snapshot().ledger_balanced(),
        "{who}: the stats' ledger totals do not balance"
    );
}

/// Every receive completion polled was counted once: as a frame written to the TAP, as
/// an own looped-back packet, or as a receive drop; and the TAP got exactly the frames
/// counted as written.
fn check_rx(d: Tally, written: usize, who: &str) {
    assert_eq!(
        d.completions_rejected, 0,
        "{who}: completions rejected by the ledger"
    );
    assert_eq!(
        d.recv_completed,
        d.rx_packets + d.rx_own_looped + d.rx_drops,
        "{who}: receives completed != written + own looped + dropped ({d:?})"
    );
    assert_eq!(
        d.rx_packets as usize, written,
        "{who}: rx_packets moved by {} but the TAP got {written} frames",
        d.rx_packets
    );
}

/// Poll `i`'s receive CQ until it is empty (writing to `tap`) and reap its sends.
fn drain(i: &mut Interface, tap: &TapDouble, now: Instant, who: &str) {
    for _ in 0..1000 {
        let n = i
            .poll_rx(tap, now)
            .unwrap_or_else(|e| panic!("{who}: poll_rx failed on the simulated fabric: {e}"));
        i.poll_tx(now)
            .unwrap_or_else(|e| panic!("{who}: poll_tx failed on the simulated fabric: {e}"));
        if n == 0 {
            return;
        }
    }
    panic!("{who}: the receive CQ does not drain");
}

/// Shut `i` down and check the teardown's ledger verdict.
fn close(i: Interface, who: &str) {
    let (t, _) = i.close(Duration::ZERO);
    if let Err(e) = t.ledger {
        panic!("{who}: the ledger after the teardown: {e}");
    }
}

/// Wrap `frame` as one TAP read: behind an empty `virtio_net_hdr` with offloads.
fn as_read(tap: &TapDouble, frame: &[u8]) -> Vec<u8> {
    read_for(tap.offload(), frame)
}

/// `frame` as one read of a TAP with or without offloads.
pub fn read_for(offload: bool, frame: &[u8]) -> Vec<u8> {
    let mut r = Vec::new();
    if offload {
        r.extend_from_slice(&[0; uipoib::wire::offload::VNET_HDR_LEN]);
    }
    r.extend_from_slice(frame);
    r
}

/// The TX direction: TAP reads into interface A, sent over the fabric to interface B.
pub struct TxWorld {
    _fabric: SimFabric,
    a: Interface,
    ta: TapDouble,
    b: Interface,
    tb: TapDouble,
    one_by_one: bool,
    now: Instant,
}

impl TxWorld {
    /// A fresh world for an input with mode byte `m`.
    pub fn new(m: u8) -> TxWorld {
        let one_by_one = m & mode::ONE_BY_ONE != 0;
        let batch = if one_by_one { 1 } else { 32 };
        let fabric = fabric(m);
        let a = open(&fabric, "sim0", A_IP, m, batch);
        let b = open(&fabric, "sim1", B_IP, m, batch);
        let mut w = TxWorld {
            _fabric: fabric,
            a,
            ta: TapDouble::new(m & mode::A_OFFLOAD != 0),
            b,
            tb: TapDouble::new(m & mode::B_OFFLOAD != 0),
            one_by_one,
            now: Instant::now(),
        };
        if m & mode::INTRODUCE != 0 {
            w.introduce();
        }
        w
    }

    /// A's MAC.
    pub fn a_mac(&self) -> Mac {
        self.a.mac()
    }

    /// B's MAC.
    pub fn b_mac(&self) -> Mac {
        self.b.mac()
    }

    /// A asks who has B's address, B replies: each learns the other.
    fn introduce(&mut self) {
        let (am, bm) = (self.a.mac(), self.b.mac());
        let req = arp_request(am, A_IP, B_IP);
        self.ta.inject(&as_read(&self.ta, &req));
        self.turn();
        let rep = arp_reply(bm, B_IP, am, A_IP);
        self.tb.inject(&as_read(&self.tb, &rep));
        let mut g = TxGate::new();
        self.b
            .tx_from_tap(&self.tb, &mut g, self.now)
            .expect("B's TX");
        drain(&mut self.a, &self.ta, self.now, "A");
        drain(&mut self.b, &self.tb, self.now, "B");
        self.ta.take_log();
        self.tb.take_log();
        assert!(
            self.a.neighbours().by_ip(B_IP).is_some(),
            "A did not learn B"
        );
        assert!(
            self.b.neighbours().by_ip(A_IP).is_some(),
            "B did not learn A"
        );
    }

    /// One TX turn of A, then both interfaces drained. Returns frames A took.
    fn turn(&mut self) -> usize {
        let mut g = TxGate::new();
        let n = self
            .a
            .tx_from_tap(&self.ta, &mut g, self.now)
            .expect("A's TX");
        drain(&mut self.b, &self.tb, self.now, "B");
        drain(&mut self.a, &self.ta, self.now, "A");
        n
    }

    /// Give A one TAP read (`bytes`, with offloads a `virtio_net_hdr` first) and check
    /// what became of every frame in it. A TSO read's `gso_size` is raised to
    /// [`MIN_MSS`] (keeps each run short; smaller cuts are fuzzed in `wire_gso`).
    pub fn step(&mut self, bytes: &[u8]) {
        let mut read = bytes.to_vec();
        if self.ta.offload()
            && read.len() >= VNET_HDR_LEN
            && matches!(read[1] & !GSO_ECN, GSO_TCPV4 | GSO_TCPV6)
        {
            let mss = u16::from_le_bytes([read[4], read[5]]).max(MIN_MSS);
            read[4..6].copy_from_slice(&mss.to_le_bytes());
        }
        self.ta.inject(&read);
        let mut turns = 0;
        while self.ta.pending() {
            turns += 1;
            assert!(turns <= MAX_TURNS, "A does not drain its TAP");
            let (a0, b0) = (Tally::of(self.a.stats()), Tally::of(self.b.stats()));
            let taken = self.turn();
            let (la, lb) = (self.ta.take_log(), self.tb.take_log());
            let (da, db) = (
                Tally::of(self.a.stats()).minus(a0),
                Tally::of(self.b.stats()).minus(b0),
            );
            check_ledger(&self.a, "A");
            check_ledger(&self.b, "B");
            assert_eq!(
                taken,
                la.read.len() + la.bad_reads,
                "A took {taken} frames, the TAP handed out {} and {} bad reads",
                la.read.len(),
                la.bad_reads
            );
            // Each frame taken is either dropped (counted once) or posted; an ARP request
            // sent to resolve an unknown destination is posted besides.
            assert_eq!(
                da.tx_drops + da.send_posted - da.neigh_resolves,
                taken as u64,
                "A: frames taken != dropped + posted ({da:?})"
            );
            check_rx(da, la.written.len(), "A");
            check_rx(db, lb.written.len(), "B");
            check_coalesced(&lb.written, &lb.delivered);
            // What A posted reached B (the fabric loses nothing here, B's ring has room):
            // each frame carried, and each resolving ARP request. B delivers it or counts
            // why not (an ARP it must not believe, say): check_rx holds B to that.
            let carried = da.send_posted - da.neigh_resolves;
            assert_eq!(
                db.recv_completed,
                carried + da.neigh_resolves,
                "B received {} for {carried} frames carried and {} resolves",
                db.recv_completed,
                da.neigh_resolves
            );
            if self.one_by_one && carried == 1 && lb.written.len() == 1 {
                check_translated(&la.read[0], &lb.written[0], self.a.mac());
            }
        }
    }

    /// Tear both interfaces down and check their ledgers.
    pub fn finish(self) {
        close(self.a, "A");
        close(self.b, "B");
    }
}

/// `sent`, a frame A read from its TAP and carried, arrived at B's TAP as `got`.
fn check_translated(sent: &[u8], got: &[u8], a_mac: Mac) {
    let (h, payload) = eth::parse_frame(sent).expect("a carried frame parses");
    let (gh, gp) = eth::parse_frame(got).expect("a written frame parses");
    assert_eq!(gh.ethertype, h.ethertype, "the EtherType changed");
    assert_eq!(gh.src, a_mac, "B's frame is not from A's MAC");
    match h.ethertype {
        ETHERTYPE_IPV4 => {
            let total = usize::from(u16::from_be_bytes([payload[2], payload[3]]));
            assert_eq!(gp, &payload[..total], "the IPv4 packet changed on the way");
        }
        ETHERTYPE_ARP => {
            let s = EthArp::parse(payload).expect("a carried ARP parses");
            let g = EthArp::parse(gp).expect("a written ARP parses");
            assert_eq!(
                (g.op, g.spa, g.tpa, g.sha),
                (s.op, s.spa, s.tpa, a_mac),
                "the ARP message changed on the way"
            );
        }
        ETHERTYPE_IPV6 => check_ipv6::<Mac, Mac>(payload, gp),
        t => panic!("a frame of EtherType {t:#06x} was carried"),
    }
}

/// The RX direction: a raw endpoint on `sim1` sends UD payloads to interface A.
pub struct RxWorld {
    fabric: SimFabric,
    a: Interface,
    ta: TapDouble,
    r: Box<dyn Endpoint>,
    to_a: Dest,
    to_group: Dest,
    /// Packets delivered to A since its last poll.
    burst: Vec<Vec<u8>>,
    /// A's counters at its last poll.
    before: Tally,
    now: Instant,
}

/// Record flag of the RX target: send to the broadcast group instead of A's QPN.
pub const RX_TO_GROUP: u8 = 1 << 0;
/// Record flag of the RX target: A does not poll after this packet (the next ones
/// arrive with it, and GRO may join them).
pub const RX_HOLD: u8 = 1 << 1;

impl RxWorld {
    /// A fresh world for an input with mode byte `m`.
    pub fn new(m: u8) -> RxWorld {
        let fabric = fabric(m);
        let a = open(&fabric, "sim0", A_IP, m, 32);
        let mut r = fabric
            .open(&EndpointConfig {
                device: "sim1".into(),
                port: 1,
                gid_index: gid_index(m),
                qkey: DEFAULT_QKEY,
                recv_slots: 1,
                send_slots: 1,
                max_payload: None,
                banks: 1,
            })
            .expect("the raw endpoint");
        let ah =
            |r: &mut Box<dyn Endpoint>, g: &Gid| -> AhHandle { r.create_ah(g).expect("an AH") };
        let a_ah = ah(&mut r, &a.hw_addr().gid);
        let g_ah = ah(&mut r, &Gid::from_ipv4(DEFAULT_GROUP));
        RxWorld {
            to_a: Dest {
                ah: a_ah,
                qpn: a.hw_addr().qpn,
                qkey: DEFAULT_QKEY,
            },
            to_group: Dest {
                ah: g_ah,
                qpn: MULTICAST_QPN,
                qkey: DEFAULT_QKEY,
            },
            before: Tally::of(a.stats()),
            burst: Vec::new(),
            fabric,
            a,
            ta: TapDouble::new(m & mode::A_OFFLOAD != 0),
            r,
            now: Instant::now(),
        }
    }

    /// The sender's GID.
    pub fn sender_gid(&self) -> Gid {
        self.r.attrs().gid
    }

    /// The sender's IPoIB address.
    pub fn sender(&self) -> ipoib::IpoibAddr {
        ipoib::IpoibAddr::new(self.r.attrs().qpn, self.r.attrs().gid)
    }

    /// A's IPoIB address.
    pub fn a_hw(&self) -> ipoib::IpoibAddr {
        self.a.hw_addr()
    }

    /// Send `payload` (an IPoIB header and what follows, cut to the port's payload
    /// limit) to A (or the group). Unless `flags` has [`RX_HOLD`], A then polls what
    /// was sent since its last poll and the checks run.
    pub fn step(&mut self, flags: u8, payload: &[u8]) {
        let n = payload.len().min(self.r.attrs().max_payload as usize);
        let payload = &payload[..n];
        self.r.send_buf(0)[..n].copy_from_slice(payload);
        let wr = SendWr {
            wr_id: 1,
            slot: 0,
            len: n as u32,
            dest: if flags & RX_TO_GROUP != 0 {
                self.to_group
            } else {
                self.to_a
            },
            signaled: true,
        };
        let before = self.fabric.counters().delivered;
        self.r.post_send(&[wr]).expect("the raw send");
        let mut wc = [Completion::EMPTY; 1];
        assert_eq!(
            self.r
                .poll_cq(CqKind::Send, &mut wc)
                .expect("the raw send's completion"),
            1
        );
        let delivered = self.fabric.counters().delivered - before;
        assert!(delivered <= 1, "one send delivered {delivered} times");
        if delivered == 1 {
            self.burst.push(payload.to_vec());
        }
        if flags & RX_HOLD == 0 {
            self.settle();
        }
    }

    /// A polls what was delivered since its last poll; check what became of it.
    fn settle(&mut self) {
        drain(&mut self.a, &self.ta, self.now, "A");
        let burst = std::mem::take(&mut self.burst);
        let da = Tally::of(self.a.stats()).minus(self.before);
        self.before = Tally::of(self.a.stats());
        let log = self.ta.take_log();
        check_ledger(&self.a, "A");
        assert_eq!(
            da.recv_completed,
            burst.len() as u64,
            "A completed {} receives for {} packets delivered",
            da.recv_completed,
            burst.len()
        );
        check_rx(da, log.written.len(), "A");
        check_coalesced(&log.written, &log.delivered);
        // With nothing dropped or looped back, the frames are the packets, in order.
        if log.written.len() == burst.len() {
            for (p, f) in burst.iter().zip(&log.written) {
                self.check_translated(p, f);
            }
        }
    }

    /// `payload`, sent by the raw endpoint, arrived at A's TAP as the Ethernet `frame`.
    fn check_translated(&self, payload: &[u8], frame: &[u8]) {
        let (ethertype, body) = ipoib::parse_header(payload).expect("a written packet's header");
        let (h, fp) = eth::parse_frame(frame).expect("a written frame parses");
        assert_eq!(h.ethertype, ethertype, "the EtherType changed");
        let sender = mac_for_gid(&self.sender_gid());
        match ethertype {
            ETHERTYPE_IPV4 => {
                let total = usize::from(u16::from_be_bytes([body[2], body[3]]));
                assert_eq!(fp, &body[..total], "the IPv4 packet changed on the way");
                assert_eq!(h.src, sender, "the frame is not from the sender's MAC");
            }
            ETHERTYPE_ARP => {
                let s = IpoibArp::parse(body).expect("a written ARP parses");
                let g = EthArp::parse(fp).expect("a written ARP frame parses");
                assert_eq!(
                    (g.op, g.spa, g.tpa, g.sha),
                    (s.op, s.spa, s.tpa, mac_for_gid(&s.sha.gid)),
                    "the ARP message changed on the way"
                );
                assert_eq!(h.src, g.sha, "the ARP frame's source is not its sender");
            }
            ETHERTYPE_IPV6 => {
                check_ipv6::<IpoibAddr, Mac>(body, fp);
                assert_eq!(h.src, sender, "the frame is not from the sender's MAC");
            }
            t => panic!("a packet of EtherType {t:#06x} was written"),
        }
    }

    /// Poll what is left, tear A down and check its ledger.
    pub fn finish(mut self) {
        self.settle();
        close(self.a, "A");
    }
}

/// The IPv6 packet `sent` (its link-layer options in `A`'s form) arrived as `got` (in
/// `B`'s): a neighbour discovery message is the same message (type, addresses, target,
/// flags, which link-layer options it has, except that a redirect's target option may be
/// left out), its options in `B`'s form; anything else is the packet as it was sent.
fn check_ipv6<A: LinkAddr, B: LinkAddr>(sent: &[u8], got: &[u8]) {
    let s = ipv6::parse_summary(sent).expect("a carried IPv6 packet parses");
    let nd = match s.upper {
        Some((ipv6::PROTO_ICMPV6, at)) if sent.get(at).is_some_and(|&t| ndisc::is_nd(t)) => {
            ndisc::parse::<A>(sent, &s, at).ok().map(|nd| (nd, at))
        }
        _ => None,
    };
    let Some((nd, at)) = nd else {
        assert_eq!(
            got,
            &sent[..s.total_len],
            "the IPv6 packet changed on the way"
        );
        return;
    };
    let g = ipv6::parse_summary(got).expect("a written IPv6 packet parses");
    assert_eq!(g.total_len, got.len(), "the written IPv6 packet's length");
    assert_eq!(
        g.upper,
        Some((ipv6::PROTO_ICMPV6, at)),
        "the ICMPv6 message moved"
    );
    let gn = ndisc::parse::<B>(got, &g, at)
        .expect("a translated neighbour discovery message passes the checks");
    assert_eq!(
        (gn.kind, gn.src, gn.dst, gn.target, gn.flags),
        (nd.kind, nd.src, nd.dst, nd.target, nd.flags),
        "the neighbour discovery message changed on the way"
    );
    // The one option that may go: a redirect's target option naming a MAC that stands
    // for no known peer is left out (the redirect stays valid without it).
    let target_kept = gn.target_ll.is_some() == nd.target_ll.is_some()
        || (nd.kind == ndisc::REDIRECT && gn.target_ll.is_none());
    assert!(
        gn.source_ll.is_some() == nd.source_ll.is_some() && target_kept,
        "a link-layer address option came or went: sent {:?}/{:?}, got {:?}/{:?}",
        nd.source_ll.is_some(),
        nd.target_ll.is_some(),
        gn.source_ll.is_some(),
        gn.target_ll.is_some()
    );
}
