//! Many interfaces on one simulated fabric, in one process: 256 of them, every pair
//! resolving and exchanging data, one broadcast reaching every other; a neighbour table
//! at and beyond its capacity; the memory a neighbour costs.
//!
//! Each interface has a TAP double that plays its kernel ([`KernelTap`]): frames the test
//! injects are what a kernel writes to a TAP (ARP requests and replies, IPv6 neighbour
//! solicitations and advertisements, data), and frames the datapath writes to it are
//! checked as a kernel would read them. Overheard broadcasts are counted, not kept, so
//! the double's memory stays flat.
//!
//! Every call into `Neighbours` and every frame builder sits in a small helper
//! ([`solicit`], [`advertise`], [`data_frame`], [`neigh_hw_by_ip`], [`learn`], ...) so
//! that the IPv6 neighbour API (`IpAddr` keys) changes only those.
//!
//! Rings are small (4 receives, 8 sends, a 1024-byte port MTU) so that 256 interfaces
//! take a few megabytes. The process RSS is printed before and after.
//!
//! Which pairs: a release build (`cargo test --release --test scale_sim`, about 27 s)
//! covers all 32,640; a debug build (the CI suite, about 5 s) covers 2,875 of them,
//! every pair with host 0, 1, 2 or 3 and every 17th of the rest, since each pair costs
//! 256 receive polls (its request reaches every host); `UIPOIB_SCALE_ALL_PAIRS=1` makes a
//! debug build cover all of them too (about a minute). See [`pairs`].
//!
//! The tests of this binary run one at a time (`SERIAL`), so each one's RSS readings are
//! its own.

#[path = "common/frames.rs"]
mod frames;

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

use std::collections::{HashMap, VecDeque};
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use uipoib::iface::napi::TxGate;
use uipoib::iface::neigh::{Neighbours, Peer, Trust};
use uipoib::iface::stats::{self, DropReason, Stats};
use uipoib::iface::{FLUSH_DEADLINE, IfaceConfig, Interface};
use uipoib::runtime::config::{DEFAULT_GROUP, DEFAULT_QKEY};
use uipoib::runtime::supervisor::Close;
use uipoib::tap::FrameIo;
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{AhHandle, EndpointConfig, Gid};
use uipoib::wire::arp::{self, EthArp};
use uipoib::wire::eth::{self, Mac};
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::ipv4::Ipv4Cidr;
use uipoib::wire::ipv6::{self, Ipv6Cidr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4};

/// Interfaces on the fabric of the all-pairs tests.
const HOSTS: usize = 256;
/// Port MTU of every simulated device (IPoIB MTU 1020).
const PORT_MTU: u32 = 1024;
const RECV_SLOTS: u32 = 4;
const SEND_SLOTS: u32 = 8;
const ETHERTYPE_IPV6: u16 = 0x86DD;

static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

/// The process's resident set, in KiB (`VmRSS` of /proc/self/status).
fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    s.lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("a VmRSS line")
}

// ---------------------------------------------------------------------------------
// Addresses

/// Host `i`'s device address (its GID is the IPv4-mapped one): 198.18.0.1 + i.
fn device_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i as u32)
}

/// Host `i`'s TAP address: 198.19.0.10 + i, in 198.19.0.0/16.
fn host_ip4(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 10)) + i as u32)
}

/// Host `i`'s global IPv6 address: 2001:2:0:1::K with K = i + 1, in 2001:2:0:1::/64.
fn host_ip6(i: usize) -> Ipv6Addr {
    Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, i as u16 + 1)
}

fn config(i: usize, neigh_capacity: u32, send_slots: u32) -> IfaceConfig {
    IfaceConfig {
        addr: Ipv4Cidr {
            addr: host_ip4(i),
            prefix: 16,
        },
        addr6: vec![Ipv6Cidr {
            addr: host_ip6(i),
            prefix: 64,
        }],
        mtu: None,
        qkey: DEFAULT_QKEY,
        group: Gid::from_ipv4(DEFAULT_GROUP),
        budget: RECV_SLOTS,
        poll_batch: 2,
        tx_batch: 32,
        endpoint: EndpointConfig {
            device: format!("sim{i}"),
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            recv_slots: RECV_SLOTS,
            send_slots,
            max_payload: None,
            banks: 1,
        },
        neigh_capacity,
        neigh_max_age: Duration::from_secs(300),
        tx_timeout: Duration::from_secs(3),
        poll_failure: Default::default(),
        busy_poll: Default::default(),
        rx_aqm: uipoib::runtime::config::DEFAULT_RX_AQM,
        rx_boost_nice: None,
        poller_batch: false,
        neigh_view: Default::default(),
    }
}

// ---------------------------------------------------------------------------------
// The kernel behind each TAP

/// A TAP double playing a host's kernel: queues injected frames for the datapath to
/// read; of the frames the datapath writes, keeps those the kernel would act on (sent to
/// its MAC, an ARP request for its IPv4 address, a neighbour solicitation for its IPv6
/// address) and counts every one, remembering the last.
struct KernelTap {
    mac: Mac,
    ip4: Ipv4Addr,
    ip6: Ipv6Addr,
    inbound: Mutex<VecDeque<Vec<u8>>>,
    kept: Mutex<Vec<Vec<u8>>>,
    last: Mutex<Vec<u8>>,
    written: AtomicU64,
}

impl KernelTap {
    fn new(mac: Mac, ip4: Ipv4Addr, ip6: Ipv6Addr) -> KernelTap {
        KernelTap {
            mac,
            ip4,
            ip6,
            inbound: Mutex::new(VecDeque::new()),
            kept: Mutex::new(Vec::new()),
            last: Mutex::new(Vec::with_capacity(2048)),
            written: AtomicU64::new(0),
        }
    }
    fn inject(&self, f: Vec<u8>) {
        self.inbound.lock().unwrap().push_back(f);
    }
    fn pending(&self) -> usize {
        self.inbound.lock().unwrap().len()
    }
    fn take_kept(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.kept.lock().unwrap())
    }
    fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }
    fn last(&self) -> Vec<u8> {
        self.last.lock().unwrap().clone()
    }
    /// Whether this host's kernel acts on `frame`.
    fn concerns(&self, frame: &[u8]) -> bool {
        let Ok((h, p)) = eth::parse_frame(frame) else {
            return true;
        };
        if h.dst == self.mac {
            return true;
        }
        match h.ethertype {
            ETHERTYPE_ARP => EthArp::parse(p).is_ok_and(|a| a.tpa == self.ip4),
            ETHERTYPE_IPV6 => ns_target(p) == Some(self.ip6),
            _ => false,
        }
    }
}

impl FrameIo for KernelTap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        match self.inbound.lock().unwrap().pop_front() {
            Some(f) => {
                let n = f.len().min(buf.len());
                buf[..n].copy_from_slice(&f[..n]);
                Ok(n)
            }
            None => Err(io::ErrorKind::WouldBlock.into()),
        }
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.written.fetch_add(1, Ordering::Relaxed);
        {
            let mut l = self.last.lock().unwrap();
            l.clear();
            l.extend_from_slice(frame);
        }
        if self.concerns(frame) {
            self.kept.lock().unwrap().push(frame.to_vec());
        }
        Ok(frame.len())
    }
}

/// One host: an interface and its kernel.
struct Host {
    iface: Interface,
    tap: KernelTap,
    gate: TxGate,
}

impl Host {
    fn open(fabric: &SimFabric, i: usize, neigh_capacity: u32, send_slots: u32) -> Host {
        let iface = Interface::open(
            fabric,
            &config(i, neigh_capacity, send_slots),
            Arc::new(Stats::default()),
            1,
            &mut None,
        )
        .unwrap();
        let tap = KernelTap::new(iface.mac(), host_ip4(i), host_ip6(i));
        Host {
            iface,
            tap,
            gate: TxGate::new(),
        }
    }
    /// The kernel writes `f` to the TAP and the datapath sends whatever the TAP holds,
    /// then reaps its send completions.
    fn send(&mut self, f: Vec<u8>, now: Instant) {
        self.tap.inject(f);
        self.gate.on_readable();
        while self.tap.pending() > 0 {
            self.iface
                .tx_from_tap(&self.tap, &mut self.gate, now)
                .unwrap();
            self.gate.on_readable();
        }
        self.iface.poll_tx(now).unwrap();
    }
    /// Receive everything that arrived. Returns how many completions.
    fn recv(&mut self, now: Instant) -> usize {
        let mut n = 0;
        loop {
            let got = self.iface.poll_rx(&self.tap, now).unwrap();
            n += got;
            if got == 0 {
                return n;
            }
        }
    }
    fn ip(&self, fam: Family) -> IpAddr {
        match fam {
            Family::V4 => IpAddr::V4(self.tap.ip4),
            Family::V6 => IpAddr::V6(self.tap.ip6),
        }
    }
}

fn fabric_of(n: usize) -> SimFabric {
    let f = SimFabric::new();
    for i in 0..n {
        f.add_device(&format!("sim{i}"), device_ip(i), PORT_MTU)
            .unwrap();
    }
    f
}

/// Two distinct hosts, mutably.
fn two(hosts: &mut [Host], i: usize, j: usize) -> (&mut Host, &mut Host) {
    assert_ne!(i, j);
    if i < j {
        let (a, b) = hosts.split_at_mut(j);
        (&mut a[i], &mut b[0])
    } else {
        let (a, b) = hosts.split_at_mut(i);
        (&mut b[0], &mut a[j])
    }
}

// ---------------------------------------------------------------------------------
// Neighbour-table calls (the IPv6 API takes `IpAddr`: adapt these only)

/// The IPoIB address `n` holds for `ip`.
fn neigh_hw_by_ip(n: &Neighbours, ip: IpAddr) -> Option<IpoibAddr> {
    n.by_ip(ip).map(|(_, p)| p.hw)
}

/// Learn `hw` at `ip` as from an ARP reply.
fn learn(
    n: &mut Neighbours,
    ip: Ipv4Addr,
    hw: IpoibAddr,
    now: Instant,
    destroy: &mut Vec<AhHandle>,
) -> Mac {
    n.learn(Some(ip), hw, Trust::Create, now, destroy).0
}

/// Peers in `n` that hold an address handle.
fn peers_with_ah(n: &Neighbours, macs: impl Iterator<Item = Mac>) -> usize {
    macs.filter(|m| n.by_mac(m).is_some_and(|p| p.ah.is_some()))
        .count()
}

// ---------------------------------------------------------------------------------
// Frames as a kernel writes them to its TAP, and what a kernel checks in frames read

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Family {
    V4,
    V6,
}

/// "Who has `to`'s address?" from `from`'s kernel: a broadcast ARP request, or a
/// neighbour solicitation from `from`'s global address to `to`'s solicited-node group
/// (33:33:ff:..) with a source link-layer address option carrying `from`'s TAP MAC.
fn solicit(fam: Family, from: &KernelTap, to: &KernelTap) -> Vec<u8> {
    match fam {
        Family::V4 => frames::arp_request(from.mac, from.ip4, to.ip4),
        Family::V6 => {
            let dst = ipv6::solicited_node(&to.ip6);
            let mut m = vec![135, 0, 0, 0, 0, 0, 0, 0];
            m.extend_from_slice(&to.ip6.octets());
            m.extend_from_slice(&[1, 1]);
            m.extend_from_slice(&from.mac.0);
            ipv6_frame(
                Mac(ipv6::multicast_mac_octets(&dst)),
                from.mac,
                from.ip6,
                dst,
                255,
                m,
            )
        }
    }
}

/// The answer of `from`'s kernel to `to`'s solicitation: an ARP reply, or a solicited
/// neighbour advertisement (S and O set) with a target link-layer address option.
fn advertise(fam: Family, from: &KernelTap, to: &KernelTap) -> Vec<u8> {
    match fam {
        Family::V4 => frames::arp_reply(from.mac, from.ip4, to.mac, to.ip4),
        Family::V6 => {
            let mut m = vec![136, 0, 0, 0, 0x60, 0, 0, 0];
            m.extend_from_slice(&from.ip6.octets());
            m.extend_from_slice(&[2, 1]);
            m.extend_from_slice(&from.mac.0);
            ipv6_frame(to.mac, from.mac, from.ip6, to.ip6, 255, m)
        }
    }
}

/// A data frame from `from` to `to` carrying `tag`: an IPv4 packet, or an ICMPv6 echo
/// (a request, or with `reply` the reply).
fn data_frame(fam: Family, from: &KernelTap, to: &KernelTap, tag: &[u8], reply: bool) -> Vec<u8> {
    match fam {
        Family::V4 => frames::ipv4_frame(to.mac, from.mac, from.ip4, to.ip4, tag),
        Family::V6 => ipv6_frame(to.mac, from.mac, from.ip6, to.ip6, 64, echo6(reply, tag)),
    }
}

/// A frame to every host carrying `tag`: an IPv4 broadcast, or an ICMPv6 echo request to
/// all nodes (ff02::1, 33:33:00:00:00:01).
fn broadcast_frame(fam: Family, from: &KernelTap, tag: &[u8]) -> Vec<u8> {
    match fam {
        Family::V4 => frames::ipv4_frame(
            Mac::BROADCAST,
            from.mac,
            from.ip4,
            Ipv4Addr::new(198, 19, 255, 255),
            tag,
        ),
        Family::V6 => {
            let all = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
            let dst = Mac(ipv6::multicast_mac_octets(&all));
            ipv6_frame(dst, from.mac, from.ip6, all, 1, echo6(false, tag))
        }
    }
}

fn echo6(reply: bool, tag: &[u8]) -> Vec<u8> {
    let mut m = vec![if reply { 129 } else { 128 }, 0, 0, 0, 0x12, 0x34, 0, 1];
    m.extend_from_slice(tag);
    m
}

/// An Ethernet frame with an IPv6 header (hop limit `hop`) and the ICMPv6 message `m`
/// (its checksum filled in).
fn ipv6_frame(
    dst: Mac,
    src: Mac,
    sip: Ipv6Addr,
    dip: Ipv6Addr,
    hop: u8,
    mut m: Vec<u8>,
) -> Vec<u8> {
    m[2..4].copy_from_slice(&[0, 0]);
    let c = ipv6::upper_checksum(&sip, &dip, ipv6::PROTO_ICMPV6, &m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    let mut p = vec![0u8; ipv6::HEADER_LEN];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(m.len() as u16).to_be_bytes());
    p[6] = ipv6::PROTO_ICMPV6;
    p[7] = hop;
    p[8..24].copy_from_slice(&sip.octets());
    p[24..40].copy_from_slice(&dip.octets());
    p.extend_from_slice(&m);
    frames::eth_frame(dst, src, ETHERTYPE_IPV6, &p)
}

/// The ICMPv6 message of an IPv6 packet without extension headers.
fn icmp6(p: &[u8]) -> Option<&[u8]> {
    (p.len() >= ipv6::HEADER_LEN + 8 && p[0] >> 4 == 6 && p[6] == ipv6::PROTO_ICMPV6)
        .then(|| &p[ipv6::HEADER_LEN..])
}

/// The target of a neighbour solicitation.
fn ns_target(p: &[u8]) -> Option<Ipv6Addr> {
    let m = icmp6(p)?;
    (m[0] == 135 && m.len() >= 24).then(|| Ipv6Addr::from(<[u8; 16]>::try_from(&m[8..24]).unwrap()))
}

/// The link-layer address option of kind `kind` (1 source, 2 target) of an NS or NA.
fn nd_lladdr(m: &[u8], kind: u8) -> Option<Mac> {
    let mut at = 24;
    while at + 8 <= m.len() {
        let (t, len) = (m[at], usize::from(m[at + 1]) * 8);
        if len == 0 {
            return None;
        }
        if t == kind && len >= 8 {
            return Some(Mac(m[at + 2..at + 8].try_into().unwrap()));
        }
        at += len;
    }
    None
}

/// Whether `f` is `from`'s solicitation for `to`'s address as `to`'s kernel needs it:
/// from `from`'s MAC, naming `from`'s address and MAC (the ARP sender, or the NS source
/// and its source link-layer address option).
fn is_solicit(fam: Family, f: &[u8], from: &KernelTap, to: &KernelTap) -> bool {
    let Ok((h, p)) = eth::parse_frame(f) else {
        return false;
    };
    if h.src != from.mac {
        return false;
    }
    match fam {
        Family::V4 => EthArp::parse(p).is_ok_and(|a| {
            (a.op, a.sha, a.spa, a.tpa) == (arp::OP_REQUEST, from.mac, from.ip4, to.ip4)
        }),
        Family::V6 => {
            h.ethertype == ETHERTYPE_IPV6
                && ns_target(p) == Some(to.ip6)
                && p[8..24] == from.ip6.octets()
                && h.dst.0[..3] == [0x33, 0x33, 0xff]
                && icmp6(p).and_then(|m| nd_lladdr(m, 1)) == Some(from.mac)
        }
    }
}

/// Whether `f` is `from`'s answer to `to`, naming `from`'s MAC.
fn is_advert(fam: Family, f: &[u8], from: &KernelTap, to: &KernelTap) -> bool {
    let Ok((h, p)) = eth::parse_frame(f) else {
        return false;
    };
    if (h.dst, h.src) != (to.mac, from.mac) {
        return false;
    }
    match fam {
        Family::V4 => EthArp::parse(p).is_ok_and(|a| {
            (a.op, a.sha, a.spa, a.tha, a.tpa)
                == (arp::OP_REPLY, from.mac, from.ip4, to.mac, to.ip4)
        }),
        Family::V6 => icmp6(p).is_some_and(|m| {
            m[0] == 136 && m[8..24] == from.ip6.octets() && nd_lladdr(m, 2) == Some(from.mac)
        }),
    }
}

/// Whether `f` is a data frame from `from` (to `to`'s MAC, or with `to == None` to a
/// group MAC) whose packet ends with `tag`.
fn is_data(fam: Family, f: &[u8], from: &KernelTap, to: Option<&KernelTap>, tag: &[u8]) -> bool {
    let Ok((h, p)) = eth::parse_frame(f) else {
        return false;
    };
    let dst_ok = match to {
        Some(t) => h.dst == t.mac,
        None => h.dst.is_multicast(),
    };
    let family_ok = match fam {
        Family::V4 => h.ethertype == ETHERTYPE_IPV4 && p[12..16] == from.ip4.octets(),
        Family::V6 => h.ethertype == ETHERTYPE_IPV6 && p[8..24] == from.ip6.octets(),
    };
    dst_ok && h.src == from.mac && family_ok && p.ends_with(tag)
}

fn tag(i: usize, j: usize) -> [u8; 16] {
    let mut t = [0u8; 16];
    for k in 0..4 {
        t[k * 4..k * 4 + 4].copy_from_slice(&[i as u8, (i >> 8) as u8, j as u8, (j >> 8) as u8]);
    }
    t
}

// ---------------------------------------------------------------------------------
// The scenarios

/// `i`'s kernel resolves `j` (its solicitation is broadcast; every host receives it),
/// `j`'s kernel answers, then a data frame goes each way. Both tables end up holding the
/// other at its IPoIB address; every frame arrives as the receiving kernel needs it.
fn resolve_and_exchange(fabric_hosts: &mut [Host], fam: Family, i: usize, j: usize, now: Instant) {
    let ns = solicit(fam, &fabric_hosts[i].tap, &fabric_hosts[j].tap);
    fabric_hosts[i].send(ns, now);
    for h in fabric_hosts.iter_mut() {
        h.recv(now);
    }
    let (a, b) = two(fabric_hosts, i, j);
    let got = b.tap.take_kept();
    assert!(
        got.len() == 1 && is_solicit(fam, &got[0], &a.tap, &b.tap),
        "{fam:?} {i}->{j}: {j}'s kernel got {} frames, not {i}'s solicitation",
        got.len()
    );
    b.send(advertise(fam, &b.tap, &a.tap), now);
    a.recv(now);
    let got = a.tap.take_kept();
    assert!(
        got.len() == 1 && is_advert(fam, &got[0], &b.tap, &a.tap),
        "{fam:?} {i}->{j}: {i}'s kernel got no answer from {j}"
    );
    assert_eq!(
        neigh_hw_by_ip(a.iface.neighbours(), b.ip(fam)),
        Some(b.iface.hw_addr()),
        "{fam:?}: {i} resolved {j}"
    );
    assert_eq!(
        neigh_hw_by_ip(b.iface.neighbours(), a.ip(fam)),
        Some(a.iface.hw_addr()),
        "{fam:?}: {j} learned {i} from its solicitation"
    );
    let t = tag(i, j);
    a.send(data_frame(fam, &a.tap, &b.tap, &t, false), now);
    b.recv(now);
    let got = b.tap.take_kept();
    assert!(
        got.len() == 1 && is_data(fam, &got[0], &a.tap, Some(&b.tap), &t),
        "{fam:?} data {i}->{j}"
    );
    let t = tag(j, i);
    b.send(data_frame(fam, &b.tap, &a.tap, &t, true), now);
    a.recv(now);
    let got = a.tap.take_kept();
    assert!(
        got.len() == 1 && is_data(fam, &got[0], &b.tap, Some(&a.tap), &t),
        "{fam:?} data {j}->{i}"
    );
}

/// One broadcast from host 0 reaches every other host's kernel exactly once.
fn broadcast_reaches_all(fabric: &SimFabric, hosts: &mut [Host], fam: Family, now: Instant) {
    let before: Vec<u64> = hosts.iter().map(|h| h.tap.written()).collect();
    let mcast = fabric.counters().mcast_delivered;
    let t = tag(0, 0xffff);
    let f = broadcast_frame(fam, &hosts[0].tap, &t);
    hosts[0].send(f, now);
    for h in hosts.iter_mut() {
        h.recv(now);
    }
    // Every attached QP gets a copy; the sender's own comes back and is consumed.
    assert_eq!(
        fabric.counters().mcast_delivered - mcast,
        hosts.len() as u64,
        "{fam:?}: one copy per member of the group"
    );
    assert_eq!(
        hosts[0].tap.written(),
        before[0],
        "its own copy is not written back"
    );
    for (k, h) in hosts.iter().enumerate().skip(1) {
        assert_eq!(
            h.tap.written() - before[k],
            1,
            "{fam:?}: host {k} got it once"
        );
        assert!(
            is_data(fam, &h.tap.last(), &hosts[0].tap, None, &t),
            "{fam:?}: host {k} got the broadcast intact"
        );
        h.tap.take_kept();
    }
}

/// Pairs `(i, j)`, `i < j`, covered by [`all_pairs`]: every one in a release build; in a
/// debug build (the CI suite, `cargo test`) every pair with host 0, 1, 2 or 3 as `i`
/// plus a stride-17 sample of the rest, so the test stays within its time budget.
fn pairs(n: usize) -> Vec<(usize, usize)> {
    let all = !cfg!(debug_assertions) || std::env::var_os("UIPOIB_SCALE_ALL_PAIRS").is_some();
    let mut v = Vec::new();
    let mut k = 0usize;
    for i in 0..n {
        for j in i + 1..n {
            k += 1;
            if all || i < 4 || k.is_multiple_of(17) {
                v.push((i, j));
            }
        }
    }
    v
}

/// 256 hosts: a broadcast reaches all, then every pair of [`pairs`] resolves and
/// exchanges data; the ledgers balance and every address handle is destroyed at the
/// end. Prints the RSS and the time per pair.
fn all_pairs(fam: Family) {
    let _one = serial();
    let rss0 = rss_kib();
    let t0 = Instant::now();
    let fabric = fabric_of(HOSTS);
    let mut hosts: Vec<Host> = (0..HOSTS)
        .map(|i| Host::open(&fabric, i, HOSTS as u32, SEND_SLOTS))
        .collect();
    let opened = t0.elapsed();
    let rss_open = rss_kib();
    let now = Instant::now();

    broadcast_reaches_all(&fabric, &mut hosts, fam, now);

    let pairs = pairs(HOSTS);
    let t1 = Instant::now();
    for &(i, j) in &pairs {
        resolve_and_exchange(&mut hosts, fam, i, j, now);
    }
    let spent = t1.elapsed();
    let rss_pairs = rss_kib();
    let full = pairs.len() == HOSTS * (HOSTS - 1) / 2;
    if full {
        for h in &hosts {
            assert_eq!(
                h.iface.neighbours().len(),
                HOSTS - 1,
                "everyone knows everyone"
            );
        }
    }
    let c = fabric.counters();
    assert_eq!(c.no_recv_posted, 0, "no receive ring overflowed");
    assert_eq!(
        c.unknown_dest + c.qkey_mismatch + c.oversized + c.receiver_in_error,
        0
    );
    let neighbours: usize = hosts.iter().map(|h| h.iface.neighbours().len()).sum();
    println!(
        "{fam:?}: {HOSTS} interfaces opened in {opened:?}; RSS {rss0} KiB before, {rss_open} KiB \
         open ({} KiB each), {rss_pairs} KiB after {} pairs ({neighbours} neighbours, \
         {:.0} bytes each); pairs took {spent:?} ({:.1} us/pair, {} deliveries, {} of them \
         broadcast copies); all pairs: {full}",
        rss_open.saturating_sub(rss0) / HOSTS as u64,
        pairs.len(),
        (rss_pairs.saturating_sub(rss_open) * 1024) as f64 / neighbours.max(1) as f64,
        spent.as_secs_f64() * 1e6 / pairs.len() as f64,
        c.delivered,
        c.mcast_delivered,
    );
    for (k, h) in hosts.into_iter().enumerate() {
        let stats = Arc::clone(h.iface.stats());
        let (closed, _) = h.iface.close(FLUSH_DEADLINE);
        closed.ledger.unwrap();
        let s = stats.snapshot();
        assert!(s.ledger_balanced(), "host {k}: {:?}", s.residuals());
        assert_eq!(s.drops_total(), 0, "host {k}: {:?}", s.drops);
        assert_eq!(s.teardown_errors, 0);
        assert_eq!(s.ah_created, s.ah_destroyed, "host {k}: every AH destroyed");
    }
}

/// The tests of this file one at a time: they read the process's RSS, which another test
/// running beside them would move.
fn one_at_a_time() -> MutexGuard<'static, ()> {
    static ONE: Mutex<()> = Mutex::new(());
    ONE.lock().unwrap_or_else(|e| e.into_inner())
}

#[test]
fn ipv4_256_interfaces_every_pair_resolves_and_a_broadcast_reaches_all() {
    let _one = one_at_a_time();
    all_pairs(Family::V4);
}

/// The same over IPv6: neighbour solicitation and advertisement, ICMPv6 echo between
/// 2001:2:0:1::K/64 addresses, an echo to all nodes.
#[test]
fn ipv6_256_interfaces_every_pair_resolves_and_a_multicast_reaches_all() {
    let _one = one_at_a_time();
    all_pairs(Family::V6);
}

/// A hub with neighbour capacity 16 and 48 peers talking to it, its sends held in
/// flight: the table never holds more than 16, 32 peers are evicted, and the address
/// handle of an evicted peer whose reply is still in flight is destroyed only when that
/// send completes. An evicted peer the hub's kernel still sends to is resolved again.
#[test]
fn a_neighbour_table_beyond_capacity_evicts_and_frees_ahs_after_their_last_send() {
    let _one = one_at_a_time();
    let _one = serial();
    const C: usize = 16;
    const P: usize = 48;
    let fabric = fabric_of(P + 1);
    // Host 0 is the hub; its send ring holds every reply while the sends are held.
    let mut hosts: Vec<Host> = (0..=P)
        .map(|i| {
            if i == 0 {
                Host::open(&fabric, i, C as u32, 64)
            } else {
                Host::open(&fabric, i, 64, SEND_SLOTS)
            }
        })
        .collect();
    let now = Instant::now();
    let hub_qpn = hosts[0].iface.hw_addr().qpn;
    let hub_stats = Arc::clone(hosts[0].iface.stats());
    let peer_macs: Vec<Mac> = hosts[1..].iter().map(|h| h.iface.mac()).collect();
    assert!(fabric.hold_sends(hub_qpn, true));
    for p in 1..=P {
        let t = Instant::now();
        let ns = solicit(Family::V4, &hosts[p].tap, &hosts[0].tap);
        hosts[p].send(ns, t);
        for h in hosts.iter_mut() {
            h.recv(t);
        }
        let got = hosts[0].tap.take_kept();
        assert!(got.len() == 1 && is_solicit(Family::V4, &got[0], &hosts[p].tap, &hosts[0].tap));
        let (hub, peer) = two(&mut hosts, 0, p);
        hub.send(advertise(Family::V4, &hub.tap, &peer.tap), t);
        let n = hub.iface.neighbours();
        assert!(n.len() <= C, "the table holds at most {C}: {}", n.len());
        assert_eq!(n.len(), p.min(C));
        assert_eq!(n.evicted(), p.saturating_sub(C) as u64);
        assert_eq!(
            n.retiring(),
            p.saturating_sub(C),
            "each evicted peer's AH waits for its reply to complete"
        );
        let s = hub_stats.snapshot();
        assert_eq!(s.ah_created, 1 + p as u64, "the group's and one per peer");
        assert_eq!(
            s.ah_destroyed, 0,
            "no AH destroyed while its send is in flight"
        );
        assert_eq!(s.send_outstanding, p as u64);
    }
    // The link moves again: the replies go out, their completions free the retired AHs.
    assert!(fabric.hold_sends(hub_qpn, false));
    hosts[0].iface.poll_tx(now).unwrap();
    for h in hosts.iter_mut() {
        h.recv(now);
    }
    let n = hosts[0].iface.neighbours();
    assert_eq!(n.retiring(), 0);
    let s = hub_stats.snapshot();
    assert_eq!(
        s.ah_destroyed,
        (P - C) as u64,
        "the evicted peers' AHs, after their sends"
    );
    assert_eq!(s.send_outstanding, 0);
    let live = peers_with_ah(n, peer_macs.iter().copied());
    assert_eq!(live, C);
    assert_eq!(
        s.ah_created - s.ah_destroyed,
        1 + live as u64,
        "live AHs: the group's and the table's"
    );
    for (p, h) in hosts.iter().enumerate().skip(1) {
        let got = h.tap.take_kept();
        assert!(
            got.len() == 1 && is_advert(Family::V4, &got[0], &hosts[0].tap, &h.tap),
            "peer {p} got the hub's reply, evicted or not"
        );
    }
    println!(
        "capacity {C}, {P} peers: evicted {} (counter neigh_evicted: {}), AHs created {} \
         destroyed {}",
        n.evicted(),
        s.neigh_evicted,
        s.ah_created,
        s.ah_destroyed
    );
    assert_eq!(s.neigh_evicted, n.evicted(), "every eviction is counted");

    // Peer 1 was the first evicted; the hub's kernel still has its MAC and sends to it.
    let t = tag(0, 1);
    let (hub, p1) = two(&mut hosts, 0, 1);
    let f = data_frame(Family::V4, &hub.tap, &p1.tap, &t, false);
    hub.send(f.clone(), now);
    assert_eq!(hub_stats.drops(DropReason::TxNoNeighbour), 1);
    assert_eq!(stats::get(&hub_stats.neigh_resolves), 1, "re-resolved");
    p1.recv(now);
    let got = p1.tap.take_kept();
    assert_eq!(got.len(), 1, "the hub's ARP request for peer 1");
    let req = EthArp::parse(eth::parse_frame(&got[0]).unwrap().1).unwrap();
    assert_eq!(
        (req.op, req.spa, req.tpa),
        (arp::OP_REQUEST, hub.tap.ip4, p1.tap.ip4)
    );
    p1.send(advertise(Family::V4, &p1.tap, &hub.tap), now);
    hub.recv(now);
    assert!(neigh_hw_by_ip(hub.iface.neighbours(), p1.ip(Family::V4)).is_some());
    assert_eq!(hub.iface.neighbours().len(), C);
    assert_eq!(hub.iface.neighbours().evicted(), (P - C + 1) as u64);
    hub.send(f, now);
    p1.recv(now);
    let got = p1.tap.take_kept();
    assert!(got.len() == 1 && is_data(Family::V4, &got[0], &hub.tap, Some(&p1.tap), &t));
    for h in hosts.iter_mut() {
        h.recv(now);
        h.iface.poll_tx(now).unwrap();
    }

    for (k, h) in hosts.into_iter().enumerate() {
        let stats = Arc::clone(h.iface.stats());
        let (closed, _) = h.iface.close(FLUSH_DEADLINE);
        closed.ledger.unwrap();
        let s = stats.snapshot();
        assert!(s.ledger_balanced(), "host {k}: {:?}", s.residuals());
        assert_eq!(
            s.teardown_errors, 0,
            "host {k}: no AH destroyed twice or unknown"
        );
        assert_eq!(s.ah_created, s.ah_destroyed, "host {k}: every AH destroyed");
    }
    let s = hub_stats.snapshot();
    assert_eq!(
        s.drops_total(),
        1,
        "only the frame to the evicted peer: {:?}",
        s.drops
    );
}

/// hashbrown's bucket count for a map that reports `capacity` (7/8 of a power of two).
fn buckets(capacity: usize) -> usize {
    if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    }
}

/// The memory a neighbour costs: 100,000 learned into one table. The table allocates no
/// memory per entry (only when its maps grow); its two maps are measured through maps of
/// the same types grown the same way, and the RSS growth bounds it from above.
#[test]
fn memory_per_neighbour_is_two_map_slots() {
    let _one = one_at_a_time();
    let _one = serial();
    const N: usize = 100_000;
    let now = Instant::now();
    let entries: Vec<(Ipv4Addr, IpoibAddr)> = (0..N)
        .map(|i| {
            let a = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 0)) + i as u32);
            (a, IpoibAddr::new(17 + i as u32 % 1000, Gid::from_ipv4(a)))
        })
        .collect();
    let mut destroy = Vec::new();
    let rss0 = rss_kib();
    counting_alloc::start();
    let mut n = Neighbours::new(N, Duration::from_secs(3600));
    for (ip, hw) in &entries {
        learn(&mut n, *ip, *hw, now, &mut destroy);
    }
    let allocs = counting_alloc::stop();
    let rss1 = rss_kib();
    assert_eq!(n.len(), N);
    assert_eq!(n.ip_entries(), N);

    // The same growth with plain maps of the table's key and value types.
    let mut peers: HashMap<Mac, Peer> = HashMap::with_capacity(4096);
    let mut ips: HashMap<Ipv4Addr, Mac> = HashMap::with_capacity(4096);
    for (ip, hw) in &entries {
        let mac = eth::mac_for_gid(&hw.gid);
        peers.insert(
            mac,
            Peer {
                hw: *hw,
                ah: None,
                last_seen: now,
                ip: Some(*ip),
                ip6: [None; uipoib::iface::neigh::PEER_ADDR6],
                last_used: None,
            },
        );
        ips.insert(*ip, mac);
    }
    let slot_peer = std::mem::size_of::<(Mac, Peer)>() + 1;
    let slot_ip = std::mem::size_of::<(Ipv4Addr, Mac)>() + 1;
    let bytes = buckets(peers.capacity()) * slot_peer + buckets(ips.capacity()) * slot_ip;
    let per = bytes as f64 / N as f64;
    let rss_per = (rss1.saturating_sub(rss0) * 1024) as f64 / N as f64;
    // At most 7/8 of a map's buckets are used, and a map doubles when it fills: just
    // after a doubling 8/7 * 2 buckets per entry, never more.
    let bound = (slot_peer + slot_ip) as f64 * 16.0 / 7.0;
    println!(
        "{N} neighbours: {allocs} allocations while learning; (Mac, Peer) {} bytes, \
         (Ipv4Addr, Mac) {} bytes; maps {} + {} buckets = {bytes} bytes, {per:.1} bytes per \
         neighbour (bound {bound:.0}); RSS grew {} KiB, {rss_per:.1} bytes per neighbour",
        slot_peer - 1,
        slot_ip - 1,
        buckets(peers.capacity()),
        buckets(ips.capacity()),
        rss1.saturating_sub(rss0),
    );
    assert!(
        allocs < 64,
        "{allocs} allocations for {N} entries: the table allocates only when a map grows"
    );
    assert!(per <= bound, "{per} bytes per neighbour, bound {bound}");
    assert!(
        rss_per <= 2.0 * bound,
        "RSS grew by {rss_per} bytes per neighbour (freed old tables included), bound {}",
        2.0 * bound
    );
    // Beyond capacity: one more peer evicts one, nothing grows.
    let extra = Ipv4Addr::new(198, 19, 200, 1);
    counting_alloc::start();
    learn(
        &mut n,
        extra,
        IpoibAddr::new(17, Gid::from_ipv4(extra)),
        now,
        &mut destroy,
    );
    assert_eq!(
        counting_alloc::stop(),
        0,
        "a learn at capacity allocates nothing"
    );
    assert_eq!(n.len(), N);
    assert_eq!(n.evicted(), 1);
}
