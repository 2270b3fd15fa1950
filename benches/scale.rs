//! What the number of peers costs (criterion): one interface with 2, 16, 64 and 256
//! peers on the simulated fabric, and the neighbour table at 100,000 entries.
//!
//! - `unicast_send/<peers>`: one IPv4 frame from the TAP to a known peer, posted
//!   (TAP read, Ethernet → IPoIB, neighbour lookup, the chain posted, the send
//!   completion reaped), destinations in turn over every peer. The simulated fabric
//!   delivers while posting, so its copy into the receiver's queue is included; the
//!   receivers run outside the timed part.
//! - `lookup/<peers>`: the send path's neighbour lookup (destination MAC → peer) in the
//!   sender's table of `<peers>` entries.
//! - `broadcast_send/<peers>`: one broadcast frame from the TAP, posted to the group;
//!   the simulated fabric makes `<peers>` + 1 copies while posting (a real fabric
//!   replicates in the switch: see docs/SCALE.md).
//! - `broadcast_rx_all/<peers>`: every receiver's work for that one broadcast (each
//!   polls it, translates it and writes it to its TAP): what the hosts of a fabric spend
//!   together per broadcast.
//! - `table/{by_mac,by_ip,learn_known,learn_new_at_capacity}/<entries>`: the table alone
//!   at the default capacity (4,096) and at 100,000 entries; `learn_new_at_capacity` is
//!   a peer not yet known arriving when the table is full (the least recently seen one
//!   is evicted).
//!
//! Rings are small (sender 128 receives and 256 sends, peers 128 and 8) and the port
//! MTU 1024, so that 257 interfaces fit in about 100 MB.

mod support;

#[path = "support/short.rs"]
mod short;

use std::hint::black_box;
use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use support::{RingTap, ipv4_frame};
use uipoib::iface::napi::TxGate;
use uipoib::iface::neigh::{Neighbours, Trust};
use uipoib::iface::stats::Stats;
use uipoib::iface::{IfaceConfig, Interface};
use uipoib::runtime::config::{DEFAULT_GROUP, DEFAULT_NEIGH_CAPACITY, DEFAULT_QKEY};
use uipoib::tap::FrameIo;
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{AhHandle, EndpointConfig, Gid};
use uipoib::wire::arp::{self, EthArp};
use uipoib::wire::eth::{self, EthHeader, Mac};
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::ipv4::Ipv4Cidr;

const PEERS: [usize; 4] = [2, 16, 64, 256];
const PORT_MTU: u32 = 1024;
/// Unicast frames per burst (less than the sender's send ring).
const BURST: u64 = 128;
/// Broadcasts per burst (no more than a receive ring).
const BCAST_BURST: u64 = 64;
/// Neighbour tables: the default capacity and 100,000 entries.
const TABLES: [usize; 2] = [DEFAULT_NEIGH_CAPACITY as usize, 100_000];
/// Lookups per key sequence of the table benches (the sequence repeats).
const KEYS: usize = 4096;

/// A TAP double that hands out the frames of a list in turn, as many as loaded, without
/// allocating.
struct CycleTap {
    frames: Mutex<Vec<Vec<u8>>>,
    next: AtomicUsize,
    pending: AtomicUsize,
}

impl CycleTap {
    fn new(frames: Vec<Vec<u8>>) -> CycleTap {
        CycleTap {
            frames: Mutex::new(frames),
            next: AtomicUsize::new(0),
            pending: AtomicUsize::new(0),
        }
    }
    fn set(&self, frames: Vec<Vec<u8>>) {
        *self.frames.lock().unwrap() = frames;
        self.next.store(0, Ordering::Relaxed);
    }
    fn load(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::Relaxed);
    }
    fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }
}

impl FrameIo for CycleTap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1))
            .is_err()
        {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let frames = self.frames.lock().unwrap();
        let i = self.next.fetch_add(1, Ordering::Relaxed) % frames.len();
        let f = &frames[i];
        let n = f.len().min(buf.len());
        buf[..n].copy_from_slice(&f[..n]);
        Ok(n)
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        Ok(frame.len())
    }
}

fn device_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 0, 1)) + i as u32)
}

fn host_ip(i: usize) -> Ipv4Addr {
    Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 19, 0, 10)) + i as u32)
}

fn config(i: usize, recv: u32, send: u32) -> IfaceConfig {
    IfaceConfig {
        addr: Ipv4Cidr {
            addr: host_ip(i),
            prefix: 16,
        },
        addr6: Vec::new(),
        mtu: None,
        qkey: DEFAULT_QKEY,
        group: Gid::from_ipv4(DEFAULT_GROUP),
        budget: 64,
        poll_batch: 16,
        tx_batch: 32,
        endpoint: EndpointConfig {
            device: format!("sim{i}"),
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            recv_slots: recv,
            send_slots: send,
            max_payload: None,
            banks: 1,
        },
        neigh_capacity: 4096,
        neigh_max_age: Duration::from_secs(3600),
        tx_timeout: Duration::from_secs(3),
        poll_failure: Default::default(),
        busy_poll: Default::default(),
        rx_aqm: uipoib::runtime::config::DEFAULT_RX_AQM,
        rx_boost_nice: None,
        poller_batch: false,
        neigh_view: Default::default(),
    }
}

/// Host 0 and `peers` others on one fabric, every peer known to host 0 (introduced by
/// ARP: host 0's kernel asks, the peer's kernel answers) with its address handle made.
struct Star {
    _fabric: SimFabric,
    sender: Interface,
    tap: CycleTap,
    gate: TxGate,
    peers: Vec<(Interface, RingTap)>,
}

impl Star {
    fn new(peers: usize) -> Star {
        let fabric = SimFabric::new();
        for i in 0..=peers {
            fabric
                .add_device(&format!("sim{i}"), device_ip(i), PORT_MTU)
                .unwrap();
        }
        let open = |i: usize, recv, send| {
            Interface::open(
                &fabric,
                &config(i, recv, send),
                Arc::new(Stats::default()),
                1,
                &mut None,
            )
            .unwrap()
        };
        let sender = open(0, 128, 256);
        let max = 14 + sender.mtu();
        let peers = (1..=peers)
            .map(|i| (open(i, 128, 8), RingTap::new(max)))
            .collect();
        let mut s = Star {
            _fabric: fabric,
            sender,
            tap: CycleTap::new(Vec::new()),
            gate: TxGate::new(),
            peers,
        };
        let now = Instant::now();
        let am = s.sender.mac();
        for k in 0..s.peers.len() {
            let (pip, pm) = (host_ip(k + 1), s.peers[k].0.mac());
            s.tap.set(vec![arp_frame(
                Mac::BROADCAST,
                arp::OP_REQUEST,
                am,
                host_ip(0),
                Mac::ZERO,
                pip,
            )]);
            s.tap.load(1);
            s.send(now);
            s.drain(now);
            let (p, ptap) = &mut s.peers[k];
            ptap.set_template(&arp_frame(am, arp::OP_REPLY, pm, pip, am, host_ip(0)));
            ptap.load(1);
            let mut g = TxGate::new();
            g.on_readable();
            p.tx_from_tap(ptap, &mut g, now).unwrap();
            p.poll_tx(now).unwrap();
            while s.sender.poll_rx(&s.tap, now).unwrap() > 0 {}
            assert!(neigh_knows(s.sender.neighbours(), pip), "peer {k} known");
        }
        // One frame to each peer makes its address handle.
        s.unicast_frames();
        s.tap.load(s.peers.len());
        s.send(now);
        s.drain(now);
        s
    }

    /// One IPv4 frame (64-byte packet) to each peer, in turn.
    fn unicast_frames(&self) {
        let am = self.sender.mac();
        let frames = (0..self.peers.len())
            .map(|k| {
                let pm = self.peers[k].0.mac();
                ipv4_frame(pm, am, host_ip(0), host_ip(k + 1), 64)
            })
            .collect();
        self.tap.set(frames);
    }

    fn broadcast_frames(&self) {
        let f = ipv4_frame(
            Mac::BROADCAST,
            self.sender.mac(),
            host_ip(0),
            Ipv4Addr::new(198, 19, 255, 255),
            64,
        );
        self.tap.set(vec![f]);
    }

    /// The sender reads everything its TAP holds and posts it, reaping completions.
    fn send(&mut self, now: Instant) {
        self.gate.on_readable();
        while self.tap.pending() > 0 {
            self.sender
                .tx_from_tap(&self.tap, &mut self.gate, now)
                .unwrap();
            self.sender.poll_tx(now).unwrap();
            self.gate.on_readable();
        }
        self.sender.poll_tx(now).unwrap();
    }

    /// Every peer (and the sender, for its looped-back broadcasts) receives everything.
    /// Returns the frames the peers wrote to their TAPs.
    fn drain(&mut self, now: Instant) -> u64 {
        let mut n = 0;
        for (p, t) in &mut self.peers {
            let before = t.written();
            while p.poll_rx(t, now).unwrap() > 0 {}
            n += t.written() - before;
        }
        while self.sender.poll_rx(&self.tap, now).unwrap() > 0 {}
        n
    }
}

/// An Ethernet ARP frame as a kernel writes it to its TAP.
fn arp_frame(dst: Mac, op: u16, sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0u8; eth::HEADER_LEN + arp::ETH_ARP_LEN];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst,
            src: sha,
            ethertype: uipoib::wire::ETHERTYPE_ARP,
        },
    )
    .expect("room for the header");
    EthArp {
        op,
        sha,
        spa,
        tha,
        tpa,
    }
    .emit(&mut f[eth::HEADER_LEN..])
    .expect("room for the message");
    f
}

// Neighbour-table calls, in one place (the IPv6 API takes `IpAddr`).

fn neigh_knows(n: &Neighbours, ip: Ipv4Addr) -> bool {
    n.by_ip(ip).is_some()
}

fn neigh_by_ip(n: &Neighbours, ip: Ipv4Addr) -> Option<Mac> {
    n.by_ip(ip).map(|(m, _)| m)
}

fn neigh_learn(
    n: &mut Neighbours,
    ip: Ipv4Addr,
    hw: IpoibAddr,
    now: Instant,
    destroy: &mut Vec<AhHandle>,
) -> Mac {
    n.learn(Some(ip), hw, Trust::Create, now, destroy).0
}

/// Move `iters` in bursts of at most `burst`, summing the timed parts.
fn in_bursts(
    s: &mut Star,
    iters: u64,
    burst: u64,
    mut f: impl FnMut(&mut Star, u64) -> Duration,
) -> Duration {
    let mut spent = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(burst);
        spent += f(s, n);
        left -= n;
    }
    spent
}

fn bench_peers(c: &mut Criterion) {
    let mut g = c.benchmark_group("scale");
    g.throughput(Throughput::Elements(1));
    for peers in PEERS {
        let mut s = Star::new(peers);
        s.unicast_frames();
        g.bench_with_input(BenchmarkId::new("unicast_send", peers), &peers, |b, _| {
            b.iter_custom(|iters| {
                let now = Instant::now();
                in_bursts(&mut s, iters, BURST, |s, n| {
                    s.tap.load(n as usize);
                    let t = Instant::now();
                    s.send(now);
                    let spent = t.elapsed();
                    assert_eq!(s.drain(now), n, "every frame arrived");
                    spent
                })
            })
        });
        let macs: Vec<Mac> = s.peers.iter().map(|(p, _)| p.mac()).collect();
        let mut i = 0usize;
        g.bench_with_input(BenchmarkId::new("lookup", peers), &peers, |b, _| {
            b.iter(|| {
                i = (i + 7) % macs.len();
                s.sender
                    .neighbours()
                    .by_mac(black_box(&macs[i]))
                    .map(|p| p.hw.qpn)
            })
        });
        s.broadcast_frames();
        g.bench_with_input(BenchmarkId::new("broadcast_send", peers), &peers, |b, _| {
            b.iter_custom(|iters| {
                let now = Instant::now();
                in_bursts(&mut s, iters, BCAST_BURST, |s, n| {
                    s.tap.load(n as usize);
                    let t = Instant::now();
                    s.send(now);
                    let spent = t.elapsed();
                    assert_eq!(s.drain(now), n * peers as u64, "every peer got each");
                    spent
                })
            })
        });
        g.bench_with_input(
            BenchmarkId::new("broadcast_rx_all", peers),
            &peers,
            |b, _| {
                b.iter_custom(|iters| {
                    let now = Instant::now();
                    in_bursts(&mut s, iters, BCAST_BURST, |s, n| {
                        s.tap.load(n as usize);
                        s.send(now);
                        let t = Instant::now();
                        let got = s.drain(now);
                        let spent = t.elapsed();
                        assert_eq!(got, n * peers as u64, "every peer got each");
                        spent
                    })
                })
            },
        );
    }
    g.finish();
}

/// Entry `i`: a GID and an IP in 198.18.0.0/15 (131,072 addresses).
fn entry(i: usize) -> (Ipv4Addr, IpoibAddr) {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    let a = Ipv4Addr::from(base + (i % 131_072) as u32);
    (a, IpoibAddr::new(17 + (i as u32 % 1000), Gid::from_ipv4(a)))
}

fn bench_table(c: &mut Criterion) {
    let mut g = c.benchmark_group("table");
    g.throughput(Throughput::Elements(1));
    for n in TABLES {
        let t0 = Instant::now();
        let mut t = Neighbours::new(n, Duration::from_secs(3600));
        let mut destroy = Vec::new();
        let mut all = Vec::with_capacity(n);
        for i in 0..n {
            let (ip, hw) = entry(i);
            let now = t0 + Duration::from_nanos(i as u64);
            let mac = neigh_learn(&mut t, ip, hw, now, &mut destroy);
            t.set_ah(&mac, AhHandle(i as u32));
            all.push((ip, hw, mac));
        }
        assert_eq!(t.len(), n);
        let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
        let keys: Vec<_> = (0..KEYS)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                all[(x % n as u64) as usize]
            })
            .collect();
        let mut i = 0usize;
        let mut next = || {
            i = (i + 1) % KEYS;
            keys[i]
        };
        g.bench_with_input(BenchmarkId::new("by_mac", n), &n, |b, _| {
            b.iter(|| {
                let (_, _, mac) = next();
                t.by_mac(black_box(&mac)).map(|p| p.hw.qpn)
            })
        });
        g.bench_with_input(BenchmarkId::new("by_ip", n), &n, |b, _| {
            b.iter(|| {
                let (ip, _, _) = next();
                neigh_by_ip(&t, black_box(ip))
            })
        });
        let late = t0 + Duration::from_secs(1);
        g.bench_with_input(BenchmarkId::new("learn_known", n), &n, |b, _| {
            b.iter(|| {
                let (ip, hw, _) = next();
                neigh_learn(&mut t, black_box(ip), hw, late, &mut destroy)
            })
        });
        // Fresh peers in turn: each evicts the least recently seen (the earliest learned).
        let mut k = n;
        g.bench_with_input(BenchmarkId::new("learn_new_at_capacity", n), &n, |b, _| {
            b.iter(|| {
                let (ip, hw) = entry(k);
                k += 1;
                let now = late + Duration::from_nanos(k as u64);
                neigh_learn(&mut t, black_box(ip), hw, now, &mut destroy)
            })
        });
        assert_eq!(t.len(), n);
        assert!(t.evicted() > 0);
    }
    g.finish();
}

criterion_group! {
    name = peers;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(20);
    targets = bench_peers
}
criterion_group! {
    name = table;
    config = short::short();
    targets = bench_table
}
criterion_main!(peers, table);
