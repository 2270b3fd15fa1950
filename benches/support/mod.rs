//! A forwarding harness for the benches and the allocation test: two [`Interface`]s on
//! the simulated fabric, each with a TAP double that allocates nothing per frame.
//!
//! [`RingTap`] hands out copies of one template frame as many times as it was loaded
//! and only counts what is written to it, so whatever allocates while packets flow is
//! the datapath's (or the fabric's), not the harness's.
#![allow(dead_code)]

use std::io;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uipoib::iface::napi::TxGate;
use uipoib::iface::stats::Stats;
use uipoib::iface::{IfaceConfig, Interface};
use uipoib::runtime::config::{
    DEFAULT_BUDGET, DEFAULT_GROUP, DEFAULT_POLL_BATCH, DEFAULT_QKEY, DEFAULT_RECV_RING,
    DEFAULT_SEND_RING, DEFAULT_TX_BATCH,
};
use uipoib::tap::FrameIo;
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{EndpointConfig, Gid};
use uipoib::wire::eth::{self, Mac};
use uipoib::wire::ipv4;
use uipoib::wire::ipv4::Ipv4Cidr;

#[path = "../../tests/common/frames.rs"]
mod frames;

/// A TAP double that reads copies of one template frame and counts writes.
pub struct RingTap {
    template: Mutex<Vec<u8>>,
    pending: AtomicUsize,
    written: AtomicU64,
    written_bytes: AtomicU64,
    /// When set, every write copies the frame into a new `Vec` (an allocating TAP), to
    /// show that the allocation test notices a per-packet allocation.
    alloc_on_write: bool,
}

impl RingTap {
    /// An empty TAP double; frames up to `max_frame` bytes.
    pub fn new(max_frame: usize) -> RingTap {
        RingTap {
            template: Mutex::new(Vec::with_capacity(max_frame)),
            pending: AtomicUsize::new(0),
            written: AtomicU64::new(0),
            written_bytes: AtomicU64::new(0),
            alloc_on_write: false,
        }
    }

    /// Like [`RingTap::new`], but allocating on every write.
    pub fn allocating(max_frame: usize) -> RingTap {
        RingTap {
            alloc_on_write: true,
            ..RingTap::new(max_frame)
        }
    }

    /// Use `frame` as the template from now on (allocation-free when it fits).
    pub fn set_template(&self, frame: &[u8]) {
        let mut t = self.template.lock().unwrap();
        t.clear();
        t.extend_from_slice(frame);
    }

    /// Let the "kernel" send `n` more copies of the template.
    pub fn load(&self, n: usize) {
        self.pending.fetch_add(n, Ordering::Relaxed);
    }

    /// Frames not read yet.
    pub fn pending(&self) -> usize {
        self.pending.load(Ordering::Relaxed)
    }

    /// Frames written so far.
    pub fn written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Bytes written so far.
    pub fn written_bytes(&self) -> u64 {
        self.written_bytes.load(Ordering::Relaxed)
    }
}

impl FrameIo for RingTap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        if self
            .pending
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |p| p.checked_sub(1))
            .is_err()
        {
            return Err(io::ErrorKind::WouldBlock.into());
        }
        let t = self.template.lock().unwrap();
        let n = t.len().min(buf.len());
        buf[..n].copy_from_slice(&t[..n]);
        Ok(n)
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        if self.alloc_on_write {
            std::hint::black_box(frame.to_vec());
        }
        self.written.fetch_add(1, Ordering::Relaxed);
        self.written_bytes
            .fetch_add(frame.len() as u64, Ordering::Relaxed);
        Ok(frame.len())
    }
}

/// Interface A's address.
pub const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
/// Interface B's address.
pub const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

/// The daemon's defaults (budget, rings, batches) on a simulated device.
pub fn params(device: &str, addr: Ipv4Addr) -> IfaceConfig {
    IfaceConfig {
        addr: Ipv4Cidr { addr, prefix: 24 },
        addr6: Vec::new(),
        mtu: None,
        qkey: DEFAULT_QKEY,
        group: Gid::from_ipv4(DEFAULT_GROUP),
        budget: DEFAULT_BUDGET,
        poll_batch: DEFAULT_POLL_BATCH,
        tx_batch: DEFAULT_TX_BATCH,
        endpoint: EndpointConfig {
            device: device.into(),
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            recv_slots: DEFAULT_RECV_RING,
            send_slots: DEFAULT_SEND_RING,
            max_payload: None,
            banks: 1,
        },
        neigh_capacity: 64,
        neigh_max_age: Duration::from_secs(300),
        tx_timeout: uipoib::runtime::config::DEFAULT_TX_TIMEOUT,
        poll_failure: Default::default(),
        busy_poll: Default::default(),
        rx_aqm: uipoib::runtime::config::DEFAULT_RX_AQM,
        rx_boost_nice: None,
        poller_batch: false,
        neigh_view: Default::default(),
    }
}

/// Two interfaces that know each other, with their TAP doubles.
pub struct Pair {
    /// The fabric (kept alive).
    pub fabric: SimFabric,
    /// Interface A.
    pub a: Interface,
    /// Interface B.
    pub b: Interface,
    /// A's TAP.
    pub ta: RingTap,
    /// B's TAP.
    pub tb: RingTap,
    gate_a: TxGate,
    gate_b: TxGate,
}

/// An Ethernet frame with an IPv4 packet of `ip_len` bytes in total (protocol 253, a
/// correct header checksum, zero payload).
pub fn ipv4_frame(dst: Mac, src: Mac, sip: Ipv4Addr, dip: Ipv4Addr, ip_len: usize) -> Vec<u8> {
    frames::ipv4_frame(dst, src, sip, dip, &vec![0; ip_len - ipv4::MIN_HEADER_LEN])
}

impl Pair {
    /// Two interfaces on port MTU `port_mtu`, introduced to each other by an ARP
    /// exchange, their send completions reaped.
    pub fn new(port_mtu: u32, alloc_tap: bool) -> Pair {
        let fabric = SimFabric::new();
        fabric
            .add_device("sim0", Ipv4Addr::new(198, 18, 0, 1), port_mtu)
            .unwrap();
        fabric
            .add_device("sim1", Ipv4Addr::new(198, 18, 0, 2), port_mtu)
            .unwrap();
        let open = |dev: &str, ip| {
            Interface::open(
                &fabric,
                &params(dev, ip),
                Arc::new(Stats::default()),
                1,
                &mut None,
            )
            .unwrap()
        };
        let a = open("sim0", A_IP);
        let b = open("sim1", B_IP);
        let max = eth::HEADER_LEN + a.mtu();
        let tap = |alloc| {
            if alloc {
                RingTap::allocating(max)
            } else {
                RingTap::new(max)
            }
        };
        let mut p = Pair {
            fabric,
            a,
            b,
            ta: tap(alloc_tap),
            tb: tap(alloc_tap),
            gate_a: TxGate::new(),
            gate_b: TxGate::new(),
        };
        let now = Instant::now();
        let (am, bm) = (p.a.mac(), p.b.mac());
        p.ta.set_template(&frames::arp_request(am, A_IP, B_IP));
        p.ta.load(1);
        p.a_to_b(now);
        p.tb.set_template(&frames::arp_reply(bm, B_IP, am, A_IP));
        p.tb.load(1);
        p.b_to_a(now);
        assert!(p.a.neighbours().by_ip(B_IP).is_some(), "A learned B");
        assert!(p.b.neighbours().by_ip(A_IP).is_some(), "B learned A");
        p
    }

    /// From now on A's kernel sends IPv4 packets of `ip_len` bytes to B, and B's kernel
    /// packets of `back_len` bytes to A.
    pub fn set_traffic(&mut self, ip_len: usize, back_len: usize) {
        let (am, bm) = (self.a.mac(), self.b.mac());
        self.ta
            .set_template(&ipv4_frame(bm, am, A_IP, B_IP, ip_len));
        self.tb
            .set_template(&ipv4_frame(am, bm, B_IP, A_IP, back_len));
    }

    /// The same with IPv6: ICMPv6 echoes of `ip_len` bytes from A to B and of `back_len`
    /// bytes back (between 2001:2:0:1::1 and ::2; the route is by MAC, as for IPv4).
    pub fn set_traffic6(&mut self, ip_len: usize, back_len: usize) {
        let (am, bm) = (self.a.mac(), self.b.mac());
        let (a6, b6): (std::net::Ipv6Addr, std::net::Ipv6Addr) = (
            "2001:2:0:1::1".parse().unwrap(),
            "2001:2:0:1::2".parse().unwrap(),
        );
        // 40 bytes of IPv6 header and 8 of ICMPv6 echo header in front of the data.
        self.ta
            .set_template(&frames::echo6_frame(bm, am, a6, b6, &vec![0; ip_len - 48]));
        self.tb.set_template(&frames::echo6_frame(
            am,
            bm,
            b6,
            a6,
            &vec![0; back_len - 48],
        ));
    }

    /// A reads everything its TAP holds and sends it; B receives it all; A reaps its
    /// send completions. Returns the packets B wrote to its TAP.
    pub fn a_to_b(&mut self, now: Instant) -> u64 {
        forward(
            &mut self.a,
            &self.ta,
            &mut self.gate_a,
            &mut self.b,
            &self.tb,
            now,
        )
    }

    /// The same from B to A.
    pub fn b_to_a(&mut self, now: Instant) -> u64 {
        forward(
            &mut self.b,
            &self.tb,
            &mut self.gate_b,
            &mut self.a,
            &self.ta,
            now,
        )
    }

    /// Only A's send side: read the TAP and post (the fabric delivers while posting),
    /// reap send completions.
    pub fn a_tx(&mut self, now: Instant) {
        self.gate_a.on_readable();
        while self.ta.pending() > 0 {
            self.a.tx_from_tap(&self.ta, &mut self.gate_a, now).unwrap();
            self.a.poll_tx(now).unwrap();
        }
    }

    /// Only B's receive side: poll the receive CQ until empty (re-posting the ring).
    pub fn b_rx(&mut self, now: Instant) -> usize {
        let mut n = 0;
        loop {
            let got = self.b.poll_rx(&self.tb, now).unwrap();
            n += got;
            if got == 0 {
                return n;
            }
        }
    }
}

fn forward(
    a: &mut Interface,
    ta: &RingTap,
    gate: &mut TxGate,
    b: &mut Interface,
    tb: &RingTap,
    now: Instant,
) -> u64 {
    let before = tb.written();
    gate.on_readable();
    loop {
        a.tx_from_tap(ta, gate, now).unwrap();
        // Receive what arrived (the budget bounds each call), then reap the sends.
        while b.poll_rx(tb, now).unwrap() > 0 {}
        a.poll_tx(now).unwrap();
        if ta.pending() == 0 {
            break;
        }
        gate.on_readable();
    }
    tb.written() - before
}
