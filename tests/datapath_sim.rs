//! Two interfaces over the simulated fabric, driven step by step without threads: ARP
//! translation both ways, IPv4 forwarding, drops by reason, backpressure, the ledger.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::Instant;

use common::{FakeTap, arp_reply, arp_request, ipv4_frame, pair};
use uipoib::iface::napi::TxGate;
use uipoib::iface::stats::{self, DropReason};
use uipoib::runtime::supervisor::Close;
use uipoib::wire::arp::{self as warp, EthArp};
use uipoib::wire::eth::{self, Mac};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4};

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

#[test]
fn arp_then_ipv4_both_ways() {
    let (_f, mut a, mut b) = pair(4096, 8, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();

    // A's kernel asks who has B_IP.
    ta.inject(arp_request(a.mac(), A_IP, B_IP));
    assert_eq!(a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap(), 1);
    a.poll_tx(now).unwrap();
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 1);
    let f = tb.take_written();
    assert_eq!(f.len(), 1);
    let (h, p) = eth::parse_frame(&f[0]).unwrap();
    assert_eq!(h.dst, Mac::BROADCAST);
    assert_eq!(h.src, a.mac());
    assert_eq!(h.ethertype, ETHERTYPE_ARP);
    let req = EthArp::parse(p).unwrap();
    assert_eq!(req.op, warp::OP_REQUEST);
    assert_eq!((req.sha, req.spa, req.tpa), (a.mac(), A_IP, B_IP));
    assert_eq!(b.neighbours().len(), 1, "B learned A from the request");

    // B's kernel replies to A's MAC.
    tb.inject(arp_reply(b.mac(), B_IP, a.mac(), A_IP));
    b.tx_from_tap(&tb, &mut TxGate::new(), now).unwrap();
    // A also gets its own request back (multicast loopback), consumed silently.
    assert_eq!(a.poll_rx(&ta, now).unwrap(), 2);
    assert_eq!(a.stats().snapshot().rx_own_looped, 1);
    let f = ta.take_written();
    assert_eq!(f.len(), 1);
    let (h, p) = eth::parse_frame(&f[0]).unwrap();
    assert_eq!(h.dst, a.mac());
    let rep = EthArp::parse(p).unwrap();
    assert_eq!(
        (rep.op, rep.sha, rep.spa, rep.tha, rep.tpa),
        (warp::OP_REPLY, b.mac(), B_IP, a.mac(), A_IP)
    );
    let peer = a.neighbours().by_ip(B_IP).expect("A learned B");
    assert_eq!(peer.1.hw, b.hw_addr());

    // IPv4 both ways, payload intact, MACs right.
    for i in 0..5u8 {
        ta.inject(ipv4_frame(b.mac(), a.mac(), A_IP, B_IP, &[i; 100]));
        a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap();
        assert_eq!(b.poll_rx(&tb, now).unwrap(), 1);
        let f = tb.take_written();
        let (h, p) = eth::parse_frame(&f[0]).unwrap();
        assert_eq!(
            (h.dst, h.src, h.ethertype),
            (b.mac(), a.mac(), ETHERTYPE_IPV4)
        );
        assert_eq!(&p[20..], &[i; 100][..]);
        tb.inject(ipv4_frame(a.mac(), b.mac(), B_IP, A_IP, &[i; 1000]));
        b.tx_from_tap(&tb, &mut TxGate::new(), now).unwrap();
        assert_eq!(a.poll_rx(&ta, now).unwrap(), 1);
        assert_eq!(ta.take_written().len(), 1);
        a.poll_tx(now).unwrap();
        b.poll_tx(now).unwrap();
    }
    let sa = a.stats().snapshot();
    assert_eq!(sa.tx_packets, 6, "1 ARP + 5 IPv4 sent by A");
    assert_eq!(sa.rx_packets, 6);
    assert_eq!(sa.drops_total(), 0, "{:?}", sa.drops);
    assert_eq!(sa.send_outstanding, 0);
    a.ledger().check().unwrap();
    b.ledger().check().unwrap();
    let (ta_, _) = a.close(uipoib::iface::FLUSH_DEADLINE);
    ta_.ledger.unwrap();
    let (tb_, _) = b.close(uipoib::iface::FLUSH_DEADLINE);
    tb_.ledger.unwrap();
}

#[test]
fn tap_garbage_is_counted_by_reason() {
    let (_f, mut a, mut b) = pair(1024, 8, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();
    let mut g = TxGate::new();
    let unknown = Mac([0x02, 0, 9, 9, 9, 9]);
    let frames: Vec<(Vec<u8>, DropReason)> = vec![
        (vec![1, 2, 3], DropReason::TxShort),
        (
            eth_frame(Mac::BROADCAST, a.mac(), 0x8100, &[0; 50]),
            DropReason::TxVlan,
        ),
        (
            eth_frame(Mac::BROADCAST, a.mac(), 0x86DD, &[0x60; 60]),
            DropReason::TxBadIpv6,
        ),
        (
            eth_frame(Mac::BROADCAST, a.mac(), 0x88CC, &[0; 60]),
            DropReason::TxUnsupported,
        ),
        (
            ipv4_frame(Mac::BROADCAST, a.mac(), A_IP, B_IP, &[0; 1100]),
            DropReason::TxOversized,
        ),
        (
            eth_frame(Mac::BROADCAST, a.mac(), ETHERTYPE_IPV4, &[0x45, 0, 0]),
            DropReason::TxBadIpv4,
        ),
        (
            eth_frame(Mac::BROADCAST, a.mac(), ETHERTYPE_ARP, &[0; 10]),
            DropReason::TxBadArp,
        ),
        (
            ipv4_frame(unknown, a.mac(), A_IP, B_IP, &[0; 10]),
            DropReason::TxNoNeighbour,
        ),
    ];
    for (frame, reason) in &frames {
        let before = a.stats().drops(*reason);
        ta.inject(frame.clone());
        g.on_readable();
        a.tx_from_tap(&ta, &mut g, now).unwrap();
        assert_eq!(a.stats().drops(*reason), before + 1, "{reason:?}");
    }
    // The unknown neighbour triggered one ARP request to the broadcast group.
    assert_eq!(stats::get(&a.stats().neigh_resolves), 1);
    b.poll_rx(&tb, now).unwrap();
    let w = tb.take_written();
    assert_eq!(w.len(), 1);
    let (_, p) = eth::parse_frame(&w[0]).unwrap();
    assert_eq!(EthArp::parse(p).unwrap().tpa, B_IP);
    a.ledger().check().unwrap();
}

#[test]
fn send_ring_backpressure_and_recovery() {
    let (_f, mut a, mut b) = pair(4096, 64, 4);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();
    common::introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    let mut g = TxGate::new();
    for i in 0..10u8 {
        ta.inject(ipv4_frame(b.mac(), a.mac(), A_IP, B_IP, &[i; 64]));
    }
    let taken = a.tx_from_tap(&ta, &mut g, now).unwrap();
    assert_eq!(taken, 4, "only as many frames as free send slots");
    assert_eq!(a.free_send_slots(), 0);
    assert_eq!(a.tx_from_tap(&ta, &mut g, now).unwrap(), 0);
    assert!(g.stopped());
    assert_eq!(g.backpressure(), 1);
    assert_eq!(ta.pending(), 6, "the rest wait in the TAP, not dropped");
    assert_eq!(a.poll_tx(now).unwrap(), 4);
    let mut got = 0;
    while got < 6 {
        got += a.tx_from_tap(&ta, &mut g, now).unwrap();
        a.poll_tx(now).unwrap();
    }
    while b.poll_rx(&tb, now).unwrap() > 0 {}
    assert_eq!(tb.take_written().len(), 10);
    assert_eq!(a.stats().snapshot().drops_total(), 0);
    a.ledger().check().unwrap();
}

#[test]
fn budget_bounds_one_poll_and_ring_is_reposted() {
    let (_f, mut a, mut b) = pair(4096, 16, 16);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();
    common::introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    let mut g = TxGate::new();
    for i in 0..12u8 {
        ta.inject(ipv4_frame(b.mac(), a.mac(), A_IP, B_IP, &[i; 64]));
    }
    while ta.pending() > 0 {
        a.tx_from_tap(&ta, &mut g, now).unwrap();
        a.poll_tx(now).unwrap();
    }
    // budget is 4 in `pair`
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 4);
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 4);
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 4);
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 0);
    let s = b.stats().snapshot();
    assert_eq!(s.recv_outstanding, 16, "every slot re-posted");
    b.ledger().check().unwrap();
}

#[test]
fn wire_garbage_from_a_peer_is_counted_never_forwarded() {
    use uipoib::verbs::{Dest, EndpointConfig, MULTICAST_QPN, Provider, SendWr};
    let (fabric, mut a, _b) = pair(4096, 16, 16);
    let ta = FakeTap::default();
    let now = Instant::now();
    // A raw endpoint on the second device plays a hostile peer.
    let mut evil = fabric
        .open(&EndpointConfig {
            device: "sim1".into(),
            port: 1,
            gid_index: None,
            qkey: uipoib::runtime::config::DEFAULT_QKEY,
            recv_slots: 4,
            send_slots: 16,
            max_payload: None,
            banks: 1,
        })
        .unwrap();
    let group = uipoib::verbs::Gid::from_ipv4(uipoib::runtime::config::DEFAULT_GROUP);
    let ah = evil.create_ah(&group).unwrap();
    let cases: Vec<(Vec<u8>, DropReason)> = vec![
        (vec![0x08], DropReason::RxShort),
        (vec![0x08, 0x00, 0x12, 0x34, 0x45], DropReason::RxBadHeader),
        (vec![0x86, 0xDD, 0, 0, 0x60, 0, 0, 0], DropReason::RxBadIpv6),
        (vec![0x08, 0x06, 0, 0, 0, 1, 8, 0], DropReason::RxBadArp),
        (vec![0x08, 0x00, 0, 0, 0x45, 0, 0, 0], DropReason::RxBadIpv4),
        (vec![0x12, 0x34, 0, 0], DropReason::RxUnsupported),
    ];
    for (i, (bytes, reason)) in cases.iter().enumerate() {
        let before = a.stats().drops(*reason);
        evil.send_buf(i as u32)[..bytes.len()].copy_from_slice(bytes);
        evil.post_send(&[SendWr {
            wr_id: i as u64,
            slot: i as u32,
            len: bytes.len() as u32,
            dest: Dest {
                ah,
                qpn: MULTICAST_QPN,
                qkey: uipoib::runtime::config::DEFAULT_QKEY,
            },
            signaled: true,
        }])
        .unwrap();
        a.poll_rx(&ta, now).unwrap();
        assert_eq!(a.stats().drops(*reason), before + 1, "case {i}: {reason:?}");
    }
    assert!(
        ta.take_written().is_empty(),
        "nothing mangled reached the TAP"
    );
    a.ledger().check().unwrap();
    let _ = Arc::new(());
}

fn eth_frame(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; 14 + payload.len()];
    eth::emit_header(
        &mut f,
        &eth::EthHeader {
            dst,
            src,
            ethertype,
        },
    )
    .unwrap();
    f[14..].copy_from_slice(payload);
    f
}
