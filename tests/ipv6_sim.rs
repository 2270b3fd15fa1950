//! IPv6 between two interfaces over the simulated fabric, driven step by step: the
//! kernel's neighbour discovery translated both ways and learned from, data both ways,
//! resolution of an unknown destination, and a restarted peer followed by its
//! advertisement.

mod common;

use std::net::Ipv6Addr;
use std::time::Instant;

use common::{FakeTap, echo6_frame, na_frame, ns_frame, open6};
use uipoib::iface::napi::TxGate;
use uipoib::runtime::supervisor::Close;
use uipoib::wire::ETHERTYPE_IPV6;
use uipoib::wire::eth::{self, Mac};
use uipoib::wire::ipv6::{self, link_local_for_mac};
use uipoib::wire::ndisc::{self, Nd};

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

const A6: &str = "2001:2:0:1::1";
const B6: &str = "2001:2:0:1::2";

/// The neighbour discovery message in a frame written to a TAP, in its TAP form.
fn written_nd(f: &[u8]) -> Nd<Mac> {
    let (h, p) = eth::parse_frame(f).unwrap();
    assert_eq!(h.ethertype, ETHERTYPE_IPV6);
    let s = ipv6::parse_summary(p).unwrap();
    ndisc::parse::<Mac>(p, &s, s.upper.unwrap().1).expect("a valid TAP-form message")
}

#[test]
fn neighbour_discovery_then_ipv6_both_ways() {
    let f = common::fabric(4096);
    let mut a = open6(&f, "sim0", "198.18.2.1/24", &format!("{A6}/64"), 8, 8);
    let mut b = open6(&f, "sim1", "198.18.2.2/24", &format!("{B6}/64"), 8, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();

    // A's kernel solicits B's address; B's kernel gets it with A's MAC in the option.
    ta.inject(ns_frame(a.mac(), ip6(A6), ip6(B6)));
    a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap();
    a.poll_tx(now).unwrap();
    assert_eq!(b.poll_rx(&tb, now).unwrap(), 1);
    let w = tb.take_written();
    assert_eq!(w.len(), 1);
    let ns = written_nd(&w[0]);
    assert_eq!(
        (ns.kind, ns.target),
        (ndisc::NEIGHBOUR_SOLICIT, Some(ip6(B6)))
    );
    assert_eq!(ns.source_ll, Some(a.mac()));
    let (_, peer) = b
        .neighbours()
        .by_ip(ip6(A6))
        .expect("B learned A from the solicitation");
    assert_eq!(peer.hw, a.hw_addr());

    // B's kernel answers to A's MAC; A's kernel gets B's MAC in the target option.
    tb.inject(na_frame(b.mac(), ip6(B6), a.mac(), ip6(A6)));
    b.tx_from_tap(&tb, &mut TxGate::new(), now).unwrap();
    b.poll_tx(now).unwrap();
    // A also gets its own solicitation back from the group, consumed.
    assert_eq!(a.poll_rx(&ta, now).unwrap(), 2);
    let w = ta.take_written();
    assert_eq!(w.len(), 1);
    let na = written_nd(&w[0]);
    assert_eq!(
        (na.kind, na.target_ll),
        (ndisc::NEIGHBOUR_ADVERT, Some(b.mac()))
    );
    assert_eq!(eth::parse_frame(&w[0]).unwrap().0.dst, a.mac());
    assert_eq!(
        a.neighbours().by_ip(ip6(B6)).expect("A learned B").1.hw,
        b.hw_addr()
    );

    // Echo both ways, payload intact.
    for i in 0..4u8 {
        ta.inject(echo6_frame(b.mac(), a.mac(), ip6(A6), ip6(B6), &[i; 200]));
        a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap();
        assert_eq!(b.poll_rx(&tb, now).unwrap(), 1);
        let w = tb.take_written();
        let (h, p) = eth::parse_frame(&w[0]).unwrap();
        assert_eq!(
            (h.dst, h.src, h.ethertype),
            (b.mac(), a.mac(), ETHERTYPE_IPV6)
        );
        assert_eq!(&p[48..], &[i; 200][..]);
        tb.inject(echo6_frame(a.mac(), b.mac(), ip6(B6), ip6(A6), &[i; 1000]));
        b.tx_from_tap(&tb, &mut TxGate::new(), now).unwrap();
        assert_eq!(a.poll_rx(&ta, now).unwrap(), 1);
        assert_eq!(ta.take_written().len(), 1);
        a.poll_tx(now).unwrap();
        b.poll_tx(now).unwrap();
    }
    let (sa, sb) = (a.stats().snapshot(), b.stats().snapshot());
    assert_eq!((sa.nd_tx, sa.nd_rx, sb.nd_tx, sb.nd_rx), (1, 1, 1, 1));
    assert_eq!(
        sa.drops_total() + sb.drops_total(),
        0,
        "{:?} {:?}",
        sa.drops,
        sb.drops
    );
    a.ledger().check().unwrap();
    b.ledger().check().unwrap();
    a.close(uipoib::iface::FLUSH_DEADLINE).0.ledger.unwrap();
    b.close(uipoib::iface::FLUSH_DEADLINE).0.ledger.unwrap();
}

#[test]
fn an_unknown_ipv6_destination_is_solicited_from_the_matching_address() {
    let f = common::fabric(4096);
    let mut a = open6(&f, "sim0", "198.18.2.1/24", &format!("{A6}/64"), 8, 8);
    let mut b = open6(&f, "sim1", "198.18.2.2/24", &format!("{B6}/64"), 8, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();
    // A's kernel believes it knows B's MAC; A's table does not.
    for dst in [ip6(B6), link_local_for_mac(b.mac().0)] {
        ta.inject(echo6_frame(b.mac(), a.mac(), ip6(A6), dst, &[1; 64]));
        a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap();
        a.poll_tx(now).unwrap();
        b.poll_rx(&tb, now).unwrap();
        let w = tb.take_written();
        assert_eq!(
            w.len(),
            1,
            "the echo was dropped, a solicitation sent instead"
        );
        let ns = written_nd(&w[0]);
        assert_eq!(ns.target, Some(dst));
        let want_src = if ipv6::is_link_local(&dst) {
            link_local_for_mac(a.mac().0)
        } else {
            ip6(A6)
        };
        assert_eq!(ns.src, want_src);
        assert_eq!(ns.source_ll, Some(a.mac()));
        assert!(
            b.neighbours().by_ip(want_src).is_some(),
            "B learned A's {want_src}"
        );
    }
    let s = a.stats().snapshot();
    assert_eq!(s.neigh_resolves, 2);
    assert_eq!(
        s.drop_count(uipoib::iface::stats::DropReason::TxNoNeighbour),
        2
    );
    // B holds both of A's addresses for one peer.
    let p = b.neighbours().by_ip(ip6(A6)).unwrap().1;
    assert_eq!(p.ip6.iter().flatten().count(), 2);
    assert_eq!(b.neighbours().len(), 1);
}

#[test]
fn a_restarted_peer_is_followed_by_its_advertisement() {
    let f = common::fabric(4096);
    let mut a = open6(&f, "sim0", "198.18.2.1/24", &format!("{A6}/64"), 8, 8);
    let mut b = open6(&f, "sim1", "198.18.2.2/24", &format!("{B6}/64"), 8, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let now = Instant::now();
    ta.inject(ns_frame(a.mac(), ip6(A6), ip6(B6)));
    a.tx_from_tap(&ta, &mut TxGate::new(), now).unwrap();
    b.poll_rx(&tb, now).unwrap();
    let old_qpn = b.neighbours().by_ip(ip6(A6)).unwrap().1.hw.qpn;
    // A restarts: a new interface on the same device, a new QPN, announced.
    a.close(uipoib::iface::FLUSH_DEADLINE).0.ledger.unwrap();
    let mut a2 = open6(&f, "sim0", "198.18.2.1/24", &format!("{A6}/64"), 8, 8);
    assert_ne!(a2.hw_addr().qpn, old_qpn);
    a2.announce(now);
    tb.take_written();
    b.poll_rx(&tb, now).unwrap();
    // One gratuitous ARP and an advertisement for each IPv6 address (link-local, A6).
    let w = tb.take_written();
    let nas: Vec<Nd<Mac>> = w
        .iter()
        .filter(|f| eth::parse_frame(f).unwrap().0.ethertype == ETHERTYPE_IPV6)
        .map(|f| written_nd(f))
        .collect();
    assert_eq!(nas.len(), 2);
    assert!(
        nas.iter()
            .all(|n| n.kind == ndisc::NEIGHBOUR_ADVERT && n.flags == ndisc::NA_OVERRIDE)
    );
    // B knew A by A6 alone: the advertisement of A6 moves A's entry to the new QPN; the
    // announcements of addresses B did not know for A (its IPv4 one, its link-local one)
    // come from a new QP and are not believed.
    assert_eq!(b.neighbours().by_ip(ip6(A6)).unwrap().1.hw, a2.hw_addr());
    assert!(
        b.neighbours()
            .by_ip(link_local_for_mac(a2.mac().0))
            .is_none()
    );
    let s = b.stats().snapshot();
    assert_eq!(s.neigh_updated, 1);
    assert_eq!((s.arp_not_learned, s.nd_not_learned), (1, 1));
}
