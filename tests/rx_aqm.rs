//! The receive queue's active queue management over the simulated fabric, driven step by
//! step with a clock of the test's own: a receive CQ that a slow poller never empties
//! drops TCP segments that carry data, at CoDel's pace, and counts each one; datagrams and
//! pure acknowledgements are delivered whatever the queue; a poller that keeps up, or an
//! interface with the AQM off, drops nothing.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{FakeTap, eth_frame, introduce, params, tcp, udp};
use uipoib::iface::Interface;
use uipoib::iface::aqm::CODEL_INTERVAL;
use uipoib::iface::napi::TxGate;
use uipoib::iface::stats::{DropReason, Stats};
use uipoib::verbs::sim::SimFabric;
use uipoib::wire::ETHERTYPE_IPV4;

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);
const MS: Duration = Duration::from_millis(1);

/// A (the receiver, budget 4 a poll, AQM `aqm`) and B, introduced to each other.
fn pair(aqm: Duration) -> (SimFabric, Interface, FakeTap, Interface, FakeTap) {
    let f = common::fabric(4096);
    let mut pa = params("sim0", "198.18.2.1/24", 256, 64);
    pa.rx_aqm = aqm;
    let mut a = Interface::open(&f, &pa, Arc::new(Stats::default()), 1, &mut None).unwrap();
    let pb = params("sim1", "198.18.2.2/24", 256, 64);
    let mut b = Interface::open(&f, &pb, Arc::new(Stats::default()), 1, &mut None).unwrap();
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    (f, a, ta, b, tb)
}

/// B sends `frames` (IPv4 packets) to A.
fn send(b: &mut Interface, tb: &FakeTap, a: &Interface, packets: &[Vec<u8>], now: Instant) {
    for p in packets {
        tb.inject(eth_frame(a.mac(), b.mac(), ETHERTYPE_IPV4, p));
        assert_eq!(b.tx_from_tap(tb, &mut TxGate::new(), now).unwrap(), 1);
        b.poll_tx(now).unwrap();
    }
}

/// Poll A every `gap` from `t0` until its CQ is empty; what reached its TAP.
fn drain(a: &mut Interface, ta: &FakeTap, t0: Instant, gap: Duration) -> Vec<Vec<u8>> {
    let mut now = t0;
    let mut out = Vec::new();
    loop {
        let n = a.poll_rx(ta, now).unwrap();
        out.extend(ta.take_written());
        if n == 0 {
            return out;
        }
        now += gap;
    }
}

fn data(n: usize) -> Vec<Vec<u8>> {
    (0..n as u32)
        .map(|i| tcp(B_IP, A_IP, 1000 + i * 100, 0x18, i as u16, &[0xab; 100]))
        .collect()
}

#[test]
fn a_standing_queue_of_tcp_data_loses_a_few_segments_at_codels_pace() {
    let (_f, mut a, ta, mut b, tb) = pair(CODEL_INTERVAL);
    let t0 = Instant::now();
    // 120 segments wait; a poll every 30 ms takes 4: the queue stands for ~900 ms.
    send(&mut b, &tb, &a, &data(120), t0);
    let got = drain(&mut a, &ta, t0, 30 * MS);
    let s = a.stats().snapshot();
    let dropped = s.drop_count(DropReason::RxAqm);
    assert_eq!(
        got.len() as u64 + dropped,
        120,
        "every segment delivered or counted"
    );
    // Every poll leaves some behind from the first (0 ms): standing from the poll at 120
    // ms on. CoDel's schedule (the n-th gap 100 / sqrt(n) ms: 100, 71, 58, 50, 45, 41,
    // 38, 35, 33, 32, ...) against a poll every 30 ms, one drop a poll at most: drops at
    // 120, 240, 300, 360, 420, 450, 510, 540, 570, ... ms, then at every poll once the
    // gap is under 30 ms, until the queue empties (~30 polls): about 19.
    assert!((17..=21).contains(&dropped), "{dropped} dropped");
    assert_eq!(s.drops_total(), dropped, "{:?}", s.drops);
    a.ledger().check().unwrap();
}

#[test]
fn datagrams_and_acknowledgements_are_never_dropped() {
    let (_f, mut a, ta, mut b, tb) = pair(CODEL_INTERVAL);
    let t0 = Instant::now();
    let mut packets: Vec<Vec<u8>> = (0..60)
        .map(|i| udp(B_IP, A_IP, 5201, &[i as u8; 200]))
        .collect();
    packets.extend((0..60u32).map(|i| tcp(B_IP, A_IP, 1000, 0x10, i as u16, &[])));
    send(&mut b, &tb, &a, &packets, t0);
    let got = drain(&mut a, &ta, t0, 30 * MS);
    assert_eq!(got.len(), 120);
    assert_eq!(a.stats().snapshot().drops_total(), 0);
}

#[test]
fn a_poller_that_keeps_up_or_the_aqm_off_drops_nothing() {
    // The same standing queue with the AQM off.
    let (_f, mut a, ta, mut b, tb) = pair(Duration::ZERO);
    let t0 = Instant::now();
    send(&mut b, &tb, &a, &data(120), t0);
    assert_eq!(drain(&mut a, &ta, t0, 30 * MS).len(), 120);
    assert_eq!(a.stats().snapshot().drops_total(), 0);

    // On: the same 120 segments in bursts of 3, each polled empty in one poll.
    let (_f, mut a, ta, mut b, tb) = pair(CODEL_INTERVAL);
    let mut now = t0;
    let mut got = 0;
    for burst in data(120).chunks(3) {
        send(&mut b, &tb, &a, burst, now);
        got += drain(&mut a, &ta, now, 30 * MS).len();
        now += 150 * MS;
    }
    assert_eq!(got, 120);
    assert_eq!(a.stats().snapshot().drops_total(), 0);
}
