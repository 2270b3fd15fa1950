//! Shared test helpers: a TAP double, frame builders, a pair of interfaces on a
//! simulated fabric.
#![allow(dead_code)]

mod frames;
pub mod netns;
pub mod sup;

pub use frames::{arp_reply, arp_request, ipv4_frame};
#[allow(unused_imports)]
pub use frames::{echo6_frame, eth_frame, icmp6_packet, na_frame, ns_frame, tcp, udp};

use std::collections::VecDeque;
use std::io;
use std::net::Ipv4Addr;
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uipoib::iface::napi::TxGate;
use uipoib::iface::stats::Stats;
use uipoib::iface::{IfaceConfig, Interface};
use uipoib::runtime::config::{DEFAULT_GROUP, DEFAULT_QKEY};
use uipoib::tap::FrameIo;
use uipoib::tap::TapDevice;
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{EndpointConfig, Gid, Provider};
use uipoib::wire::eth::Mac;
use uipoib::wire::ipv4::Ipv4Cidr;

/// A TAP double: frames to be read are queued by the test; frames written are kept.
#[derive(Default)]
pub struct FakeTap {
    inbound: Mutex<VecDeque<Vec<u8>>>,
    written: Mutex<Vec<Vec<u8>>>,
}

impl FakeTap {
    pub fn inject(&self, f: Vec<u8>) {
        self.inbound.lock().unwrap().push_back(f);
    }
    pub fn pending(&self) -> usize {
        self.inbound.lock().unwrap().len()
    }
    pub fn take_written(&self) -> Vec<Vec<u8>> {
        std::mem::take(&mut *self.written.lock().unwrap())
    }
}

impl FrameIo for FakeTap {
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
        self.written.lock().unwrap().push(frame.to_vec());
        Ok(frame.len())
    }
}

/// A TAP double with a real descriptor (a datagram socket pair), for the poller.
pub struct SockTap {
    ours: UnixDatagram,
    theirs: UnixDatagram,
    pub carrier: std::sync::atomic::AtomicBool,
    /// How many times the carrier was turned off.
    pub carrier_offs: std::sync::atomic::AtomicU32,
    pub reconfigured: Mutex<Option<(Mac, usize)>>,
}

impl SockTap {
    pub fn new() -> Arc<SockTap> {
        let (ours, theirs) = UnixDatagram::pair().unwrap();
        ours.set_nonblocking(true).unwrap();
        theirs
            .set_read_timeout(Some(Duration::from_millis(50)))
            .unwrap();
        Arc::new(SockTap {
            ours,
            theirs,
            carrier: std::sync::atomic::AtomicBool::new(true),
            carrier_offs: std::sync::atomic::AtomicU32::new(0),
            reconfigured: Mutex::new(None),
        })
    }
    /// The "kernel" sends a frame into the TAP.
    pub fn inject(&self, f: &[u8]) {
        self.theirs.send(f).unwrap();
    }
    /// The next frame the datapath wrote to the TAP, if any within 50 ms.
    pub fn recv(&self) -> Option<Vec<u8>> {
        let mut b = vec![0u8; 9000];
        match self.theirs.recv(&mut b) {
            Ok(n) => {
                b.truncate(n);
                Some(b)
            }
            Err(_) => None,
        }
    }
}

impl FrameIo for SockTap {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        self.ours.recv(buf)
    }
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        self.ours.send(frame)
    }
}

impl TapDevice for SockTap {
    fn raw_fd(&self) -> RawFd {
        self.ours.as_raw_fd()
    }
    fn set_carrier(&self, on: bool) -> io::Result<()> {
        self.carrier.store(on, std::sync::atomic::Ordering::SeqCst);
        if !on {
            self.carrier_offs
                .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        Ok(())
    }
    fn reconfigure(&self, mac: Mac, mtu: usize) -> Result<(), uipoib::tap::TapError> {
        *self.reconfigured.lock().unwrap() = Some((mac, mtu));
        Ok(())
    }
}

pub fn params(device: &str, addr: &str, recv: u32, send: u32) -> IfaceConfig {
    IfaceConfig {
        addr: addr.parse::<Ipv4Cidr>().unwrap(),
        addr6: Vec::new(),
        mtu: None,
        qkey: DEFAULT_QKEY,
        group: Gid::from_ipv4(DEFAULT_GROUP),
        budget: 4.min(recv),
        poll_batch: 2,
        tx_batch: 32,
        endpoint: EndpointConfig {
            device: device.into(),
            port: 1,
            gid_index: None,
            qkey: DEFAULT_QKEY,
            recv_slots: recv,
            send_slots: send,
            max_payload: None,
            banks: 1,
        },
        neigh_capacity: 64,
        neigh_max_age: Duration::from_secs(300),
        tx_timeout: Duration::from_secs(3),
        poll_failure: Default::default(),
        busy_poll: Default::default(),
        // Off, as by default: these tests count every frame delivered, on hosts of any
        // speed; the AQM has its own tests (src/iface/aqm.rs, tests/rx_aqm.rs).
        rx_aqm: std::time::Duration::ZERO,
        rx_boost_nice: None,
        poller_batch: false,
        neigh_view: Default::default(),
    }
}

pub fn fabric(mtu: u32) -> SimFabric {
    let f = SimFabric::new();
    f.add_device("sim0", Ipv4Addr::new(198, 18, 0, 1), mtu)
        .unwrap();
    f.add_device("sim1", Ipv4Addr::new(198, 18, 0, 2), mtu)
        .unwrap();
    f
}

/// Two interfaces (budget 4) on a fresh fabric.
pub fn pair(mtu: u32, recv: u32, send: u32) -> (SimFabric, Interface, Interface) {
    let f = fabric(mtu);
    let a = open(&f, "sim0", "198.18.2.1/24", recv, send);
    let b = open(&f, "sim1", "198.18.2.2/24", recv, send);
    (f, a, b)
}

/// An interface with an IPv6 address (`addr6`, with its prefix) besides its IPv4 one.
pub fn open6(
    p: &dyn Provider,
    dev: &str,
    addr: &str,
    addr6: &str,
    recv: u32,
    send: u32,
) -> Interface {
    let mut params = params(dev, addr, recv, send);
    params.addr6 = vec![addr6.parse().unwrap()];
    open_with(p, &params)
}

pub fn open(p: &dyn Provider, dev: &str, addr: &str, recv: u32, send: u32) -> Interface {
    open_with(p, &params(dev, addr, recv, send))
}

/// [`open`] with parameters of the caller's (from [`params`], changed).
pub fn open_with(p: &dyn Provider, params: &IfaceConfig) -> Interface {
    Interface::open(p, params, Arc::new(Stats::default()), 1, &mut None).unwrap()
}

/// Let A and B learn each other through an ARP exchange, step by step.
pub fn introduce(
    a: &mut Interface,
    ta: &FakeTap,
    b: &mut Interface,
    tb: &FakeTap,
    a_ip: Ipv4Addr,
    b_ip: Ipv4Addr,
) {
    let now = Instant::now();
    let mut g = TxGate::new();
    ta.inject(arp_request(a.mac(), a_ip, b_ip));
    a.tx_from_tap(ta, &mut g, now).unwrap();
    b.poll_rx(tb, now).unwrap();
    tb.take_written();
    tb.inject(arp_reply(b.mac(), b_ip, a.mac(), a_ip));
    let mut g = TxGate::new();
    b.tx_from_tap(tb, &mut g, now).unwrap();
    a.poll_rx(ta, now).unwrap();
    ta.take_written();
    a.poll_tx(now).unwrap();
    b.poll_tx(now).unwrap();
    assert!(a.neighbours().by_ip(b_ip).is_some());
    assert!(b.neighbours().by_ip(a_ip).is_some());
}

/// The nice level of each of this process's threads named `name`.
pub fn nice_levels(name: &str) -> Vec<i32> {
    // After the command's closing parenthesis: the state is field 3, nice field 19.
    stat_fields(name, 16)
}

/// The scheduling policy of each of this process's threads named `name` (`SCHED_OTHER`
/// 0, `SCHED_BATCH` 3).
pub fn policies(name: &str) -> Vec<i32> {
    // Field 41 of /proc's stat.
    stat_fields(name, 38)
}

/// Field `at` (counted from the state, 0) of /proc's stat of each thread named `name`.
fn stat_fields(name: &str, at: usize) -> Vec<i32> {
    let mut found = Vec::new();
    for t in std::fs::read_dir("/proc/self/task").unwrap().flatten() {
        let comm = std::fs::read_to_string(t.path().join("comm")).unwrap_or_default();
        if comm.trim_end() != name {
            continue;
        }
        // A thread that ends between the two reads is gone: skipped.
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 1..];
        found.push(rest.split_whitespace().nth(at).unwrap().parse().unwrap());
    }
    found
}

/// The nice levels of the threads named `name` once every one is at `want`, or as they
/// are after five seconds: a thread sets its level as it starts, which may be after the
/// state it is waited on says `running`.
pub fn nice_levels_at(name: &str, want: i32) -> Vec<i32> {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    loop {
        let found = nice_levels(name);
        if (!found.is_empty() && found.iter().all(|&l| l == want))
            || std::time::Instant::now() > deadline
        {
            return found;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
