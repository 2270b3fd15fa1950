//! IPv6 and neighbour discovery, both directions.

use std::net::Ipv6Addr;

use super::*;
use crate::wire::ipv6;
use crate::wire::ipv6::test_packets::icmp6;
use crate::wire::ndisc::{self, LinkAddr, NA_OVERRIDE, NA_SOLICITED};

fn ip6(s: &str) -> Ipv6Addr {
    s.parse().unwrap()
}

/// A link-layer option holding `a` in its link's form.
fn ll_opt<A: LinkAddr>(kind: u8, a: A) -> Vec<u8> {
    let mut o = vec![0u8; usize::from(A::UNITS) * 8];
    a.write(kind, &mut o);
    o
}

/// An NS or NA body: type, flags, target, then `opts`.
fn nd_body(kind: u8, flags: u8, target: Ipv6Addr, opts: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0, flags, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(opts);
    m
}

fn peer_ns(src: Ipv6Addr, target: Ipv6Addr, sll: IpoibAddr) -> Vec<u8> {
    let body = nd_body(
        ndisc::NEIGHBOUR_SOLICIT,
        0,
        target,
        &ll_opt(ndisc::OPT_SOURCE_LL, sll),
    );
    from_peer(
        ETHERTYPE_IPV6,
        &icmp6(src, ipv6::solicited_node(&target), 255, &body),
    )
}

fn peer_na(flags: u8, target: Ipv6Addr, tll: IpoibAddr, dst: Ipv6Addr) -> Vec<u8> {
    let body = nd_body(
        ndisc::NEIGHBOUR_ADVERT,
        flags,
        target,
        &ll_opt(ndisc::OPT_TARGET_LL, tll),
    );
    from_peer(ETHERTYPE_IPV6, &icmp6(target, dst, 255, &body))
}

fn nd_fact(s: Sender<Ipv6Addr>) -> RxFact {
    RxFact::Nd(s)
}

fn claim(ip: Ipv6Addr, standing: Standing) -> RxFact {
    nd_fact(Sender::Claim {
        ip,
        hw: peer_hw(),
        standing,
    })
}

/// The Ethernet frame's IPv6 payload, parsed as ND in its TAP form.
fn tap_nd(frame: &[u8], n: usize) -> ndisc::Nd<Mac> {
    let p = &frame[eth::HEADER_LEN..n];
    let s = ipv6::parse_summary(p).unwrap();
    ndisc::parse::<Mac>(p, &s, s.upper.unwrap().1).expect("the TAP form parses")
}

#[test]
fn a_solicitation_for_our_address_is_addressed_and_written_with_a_mac() {
    let (r, frame) = rx(
        &peer_ns(ip6(PEER_IP6_ADDR), ip6(OWN_IP6_ADDR), peer_hw()),
        meta(PEER_QPN),
    );
    assert_eq!(r.fact, claim(ip6(PEER_IP6_ADDR), Standing::Addressed));
    let RxVerdict::Deliver(n) = r.verdict else {
        panic!("{r:?}")
    };
    let (h, _) = eth::parse_frame(&frame[..n]).unwrap();
    assert_eq!(h.ethertype, ETHERTYPE_IPV6);
    assert_eq!(h.src, mac_for_gid(&peer_gid()));
    let sn = ipv6::solicited_node(&ip6(OWN_IP6_ADDR));
    assert_eq!(h.dst.0, ipv6::multicast_mac_octets(&sn));
    let nd = tap_nd(&frame, n);
    assert_eq!(nd.source_ll, Some(mac_for_gid(&peer_gid())));
    // For someone else's address (or our link-local via another prefix): overheard.
    let (r, _) = rx(
        &peer_ns(ip6(PEER_IP6_ADDR), ip6("2001:2:0:1::99"), peer_hw()),
        meta(PEER_QPN),
    );
    assert_eq!(r.fact, claim(ip6(PEER_IP6_ADDR), Standing::Overheard));
    let ll = local().addr6.link_local;
    let (r, _) = rx(&peer_ns(ip6("fe80::5"), ll, peer_hw()), meta(PEER_QPN));
    assert_eq!(r.fact, claim(ip6("fe80::5"), Standing::Addressed));
}

#[test]
fn advertisements_have_the_standing_of_their_flags() {
    let me = ip6(OWN_IP6_ADDR);
    let peer = ip6(PEER_IP6_ADDR);
    for (flags, standing) in [
        (NA_SOLICITED | NA_OVERRIDE, Standing::Addressed),
        (NA_OVERRIDE, Standing::Announcement),
        (0, Standing::Overheard),
    ] {
        let (r, frame) = rx(&peer_na(flags, peer, peer_hw(), me), meta(PEER_QPN));
        assert_eq!(r.fact, claim(peer, standing), "flags {flags:#x}");
        let RxVerdict::Deliver(n) = r.verdict else {
            panic!("{r:?}")
        };
        let nd = tap_nd(&frame, n);
        assert_eq!(nd.flags, flags);
        assert_eq!(nd.target_ll, Some(mac_for_gid(&peer_gid())));
        assert_eq!(eth::parse_frame(&frame[..n]).unwrap().0.dst, local().mac);
    }
    // The unsolicited advertisement a restarted interface sends.
    let mut out = vec![0u8; 200];
    let n = emit_nd(peer_hw(), None, peer, &mut out).unwrap();
    let b = recv(
        peer_gid(),
        Gid::from_ipv4(Ipv4Addr::new(224, 0, 0, 1)),
        ETHERTYPE_IPV6,
        &out[4..4 + n],
    );
    let (r, _) = rx(&b, meta(PEER_QPN));
    assert_eq!(r.fact, claim(peer, Standing::Announcement));
}

#[test]
fn neighbour_discovery_is_believed_only_from_its_real_source_and_link() {
    let spoof_qpn = IpoibAddr::new(0x99, peer_gid());
    let (r, _) = rx(
        &peer_ns(ip6(PEER_IP6_ADDR), ip6(OWN_IP6_ADDR), spoof_qpn),
        meta(PEER_QPN),
    );
    assert_eq!(
        r,
        Received {
            fact: nd_fact(Sender::Refused),
            verdict: RxVerdict::Drop(RxDrop::NdSpoofed)
        }
    );
    let other_gid = IpoibAddr::new(PEER_QPN, Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 9)));
    let (r, _) = rx(
        &peer_na(
            NA_SOLICITED,
            ip6(PEER_IP6_ADDR),
            other_gid,
            ip6(OWN_IP6_ADDR),
        ),
        meta(PEER_QPN),
    );
    assert_eq!(r.verdict, RxVerdict::Drop(RxDrop::NdSpoofed));
    let (r, _) = rx(
        &peer_ns(ip6("2001:2:0:9::5"), ip6(OWN_IP6_ADDR), peer_hw()),
        meta(PEER_QPN),
    );
    assert_eq!(
        r,
        Received {
            fact: nd_fact(Sender::Refused),
            verdict: RxVerdict::Drop(RxDrop::NdOffLink)
        }
    );
    let mcast_qpn = IpoibAddr::new(ipoib::MULTICAST_QPN, peer_gid());
    let (r, _) = rx(
        &peer_ns(ip6(PEER_IP6_ADDR), ip6(OWN_IP6_ADDR), mcast_qpn),
        meta(PEER_QPN),
    );
    assert_eq!(r.verdict, RxVerdict::Drop(RxDrop::BadNd));
    // Forwarded from off-link (hop limit 64): refused before anything is believed.
    let body = nd_body(
        ndisc::NEIGHBOUR_SOLICIT,
        0,
        ip6(OWN_IP6_ADDR),
        &ll_opt(ndisc::OPT_SOURCE_LL, peer_hw()),
    );
    let b = from_peer(
        ETHERTYPE_IPV6,
        &icmp6(ip6(PEER_IP6_ADDR), ip6(OWN_IP6_ADDR), 64, &body),
    );
    assert_eq!(rx(&b, meta(PEER_QPN)).0, nothing(RxDrop::BadNd));
    // A TAP-form (6-byte) option arriving from the fabric.
    let body = nd_body(
        ndisc::NEIGHBOUR_SOLICIT,
        0,
        ip6(OWN_IP6_ADDR),
        &ll_opt(ndisc::OPT_SOURCE_LL, Mac([2, 0, 0, 0, 0, 1])),
    );
    let b = from_peer(
        ETHERTYPE_IPV6,
        &icmp6(ip6(PEER_IP6_ADDR), ip6(OWN_IP6_ADDR), 255, &body),
    );
    assert_eq!(rx(&b, meta(PEER_QPN)).0, nothing(RxDrop::BadNd));
    let mut bad = icmp6(
        ip6(PEER_IP6_ADDR),
        ip6(OWN_IP6_ADDR),
        255,
        &[128, 0, 0, 0, 0, 1, 0, 1],
    );
    bad[0] = 0x40;
    assert_eq!(
        rx(&from_peer(ETHERTYPE_IPV6, &bad), meta(PEER_QPN)).0,
        nothing(RxDrop::BadIpv6)
    );
}

#[test]
fn duplicate_address_detection_passes_and_claims_nothing() {
    let target = ip6("2001:2:0:1::7");
    let body = nd_body(ndisc::NEIGHBOUR_SOLICIT, 0, target, &[]);
    let b = from_peer(
        ETHERTYPE_IPV6,
        &icmp6(
            Ipv6Addr::UNSPECIFIED,
            ipv6::solicited_node(&target),
            255,
            &body,
        ),
    );
    let (r, frame) = rx(&b, meta(PEER_QPN));
    assert_eq!(r.fact, nd_fact(Sender::Probe));
    let RxVerdict::Deliver(n) = r.verdict else {
        panic!("{r:?}")
    };
    assert_eq!(tap_nd(&frame, n).target, Some(target));
}

#[test]
fn ipv6_data_goes_to_our_mac_or_its_multicast_mac() {
    let echo = icmp6(
        ip6(PEER_IP6_ADDR),
        ip6(OWN_IP6_ADDR),
        64,
        &[128, 0, 0, 0, 0, 1, 0, 1, 9, 9],
    );
    let (r, frame) = rx(&from_peer(ETHERTYPE_IPV6, &echo), meta(PEER_QPN));
    assert_eq!(r.fact, RxFact::Data { from: peer_hw() });
    assert_eq!(r.verdict, RxVerdict::Deliver(eth::HEADER_LEN + echo.len()));
    assert_eq!(
        &frame[eth::HEADER_LEN..eth::HEADER_LEN + echo.len()],
        &echo[..]
    );
    assert_eq!(eth::parse_frame(&frame).unwrap().0.dst, local().mac);
    let all = icmp6(
        ip6(PEER_IP6_ADDR),
        ip6("ff02::1"),
        1,
        &[128, 0, 0, 0, 0, 1, 0, 1],
    );
    let (r, frame) = rx(&from_peer(ETHERTYPE_IPV6, &all), meta(PEER_QPN));
    assert!(matches!(r.verdict, RxVerdict::Deliver(_)));
    assert_eq!(
        eth::parse_frame(&frame).unwrap().0.dst,
        Mac([0x33, 0x33, 0, 0, 0, 1])
    );
}

/// The kernel's solicitation on the TAP: from `src` for `target`, our MAC in the option.
fn kernel_ns(dst: Mac, src: Ipv6Addr, target: Ipv6Addr, sll: Mac) -> Vec<u8> {
    let body = nd_body(
        ndisc::NEIGHBOUR_SOLICIT,
        0,
        target,
        &ll_opt(ndisc::OPT_SOURCE_LL, sll),
    );
    let ipdst = if dst.is_multicast() {
        ipv6::solicited_node(&target)
    } else {
        target
    };
    eth_frame(dst, ETHERTYPE_IPV6, &icmp6(src, ipdst, 255, &body))
}

#[test]
fn the_kernels_solicitation_goes_to_the_group_with_our_ipoib_address() {
    let target = ip6(PEER_IP6_ADDR);
    let sn_mac = Mac(ipv6::multicast_mac_octets(&ipv6::solicited_node(&target)));
    let f = kernel_ns(sn_mac, ip6(OWN_IP6_ADDR), target, local().mac);
    let plan = tx(&f).unwrap();
    assert_eq!(plan.route, Route::Group);
    let Body::Nd {
        source_ll,
        target_ll,
        ..
    } = plan.body
    else {
        panic!("{plan:?}")
    };
    assert_eq!(source_ll, Some(local().hw));
    assert_eq!(target_ll, None);
    // On the wire it is 16 bytes longer, and the peer gets back exactly the frame the
    // kernel sent (our MAC stands for our GID on both sides).
    let mut wire = vec![0u8; GRH_LEN + 400];
    let n = plan.body.emit(&f, &mut wire[GRH_LEN..]).unwrap();
    assert_eq!(n, f.len() - eth::HEADER_LEN + 16);
    grh::emit_ipv6(&mut wire, (n + 4) as u16, &own_gid(), &peer_gid()).unwrap();
    let peer = Local {
        hw: peer_hw(),
        mac: mac_for_gid(&peer_gid()),
        addr: local().addr,
        addr6: Addrs6::new(mac_for_gid(&peer_gid()), &[PEER_IP6.parse().unwrap()]),
    };
    let mut frame = vec![0u8; 512];
    let r = receive(
        &wire[..GRH_LEN + 4 + n],
        meta(OWN_QPN),
        GrhKind::Ipv6,
        &peer,
        &mut frame,
    );
    assert_eq!(
        r.fact,
        RxFact::Nd(Sender::Claim {
            ip: ip6(OWN_IP6_ADDR),
            hw: local().hw,
            standing: Standing::Addressed
        })
    );
    assert_eq!(r.verdict, RxVerdict::Deliver(f.len()));
    assert_eq!(frame[..f.len()], f[..]);
}

#[test]
fn link_layer_options_from_the_tap_must_name_us_or_a_known_peer() {
    let stranger = Mac([2, 0, 198, 18, 0, 77]);
    let f = kernel_ns(
        Mac::BROADCAST,
        ip6(OWN_IP6_ADDR),
        ip6(PEER_IP6_ADDR),
        stranger,
    );
    assert_eq!(tx(&f), Err(TxDrop::NdForeignLinkAddr));
    // An advertisement of ours, unicast to the peer.
    let peer_mac = mac_for_gid(&peer_gid());
    let body = nd_body(
        ndisc::NEIGHBOUR_ADVERT,
        NA_SOLICITED,
        ip6(OWN_IP6_ADDR),
        &ll_opt(ndisc::OPT_TARGET_LL, local().mac),
    );
    let f = eth_frame(
        peer_mac,
        ETHERTYPE_IPV6,
        &icmp6(ip6(OWN_IP6_ADDR), ip6(PEER_IP6_ADDR), 255, &body),
    );
    let plan = tx(&f).unwrap();
    assert_eq!(
        plan.route,
        Route::Peer {
            mac: peer_mac,
            otherwise: Otherwise::Drop
        }
    );
    assert!(matches!(plan.body, Body::Nd { target_ll: Some(hw), .. } if hw == local().hw));
    let body = nd_body(
        ndisc::NEIGHBOUR_ADVERT,
        0,
        ip6(OWN_IP6_ADDR),
        &ll_opt(ndisc::OPT_TARGET_LL, stranger),
    );
    let f = eth_frame(
        peer_mac,
        ETHERTYPE_IPV6,
        &icmp6(ip6(OWN_IP6_ADDR), ip6(PEER_IP6_ADDR), 255, &body),
    );
    assert_eq!(tx(&f), Err(TxDrop::NdForeignLinkAddr));
    // A redirect naming an unknown next hop: the option is left out.
    let mut body = vec![ndisc::REDIRECT, 0, 0, 0, 0, 0, 0, 0];
    body.extend_from_slice(&ip6("fe80::3").octets());
    body.extend_from_slice(&ip6("2001:2:0:9::1").octets());
    body.extend(ll_opt(ndisc::OPT_TARGET_LL, stranger));
    let f = eth_frame(
        peer_mac,
        ETHERTYPE_IPV6,
        &icmp6(local().addr6.link_local, ip6("fe80::2"), 255, &body),
    );
    let plan = tx(&f).unwrap();
    assert!(matches!(
        plan.body,
        Body::Nd {
            target_ll: None,
            ..
        }
    ));
    // A unicast solicitation (the kernel re-validating) to a lost peer asks the group.
    let f = kernel_ns(peer_mac, ip6(OWN_IP6_ADDR), ip6(PEER_IP6_ADDR), local().mac);
    assert_eq!(
        tx(&f).unwrap().route,
        Route::Peer {
            mac: peer_mac,
            otherwise: Otherwise::Group
        }
    );
    // Bad ones are refused with their reason.
    let mut bad = kernel_ns(
        Mac::BROADCAST,
        ip6(OWN_IP6_ADDR),
        ip6(PEER_IP6_ADDR),
        local().mac,
    );
    bad[eth::HEADER_LEN + 7] = 64;
    assert_eq!(tx(&bad), Err(TxDrop::BadNd));
}

#[test]
fn ipv6_data_goes_to_its_peer_or_the_group() {
    let peer_mac = mac_for_gid(&peer_gid());
    let echo = icmp6(
        ip6(OWN_IP6_ADDR),
        ip6(PEER_IP6_ADDR),
        64,
        &[128, 0, 0, 0, 0, 1, 0, 1],
    );
    let plan = tx(&eth_frame(peer_mac, ETHERTYPE_IPV6, &echo)).unwrap();
    assert_eq!(
        plan.route,
        Route::Peer {
            mac: peer_mac,
            otherwise: Otherwise::Resolve(ip6(PEER_IP6_ADDR).into())
        }
    );
    assert_eq!(plan.body, Body::Ipv6 { len: echo.len() });
    let mut out = vec![0u8; 200];
    let f = eth_frame(peer_mac, ETHERTYPE_IPV6, &echo);
    let n = plan.body.emit(&f, &mut out).unwrap();
    assert_eq!(&out[4..4 + n], &echo[..]);
    assert_eq!(ipoib::parse_header(&out).unwrap().0, ETHERTYPE_IPV6);
    let all = icmp6(
        ip6(OWN_IP6_ADDR),
        ip6("ff02::1"),
        1,
        &[128, 0, 0, 0, 0, 1, 0, 1],
    );
    assert_eq!(
        tx(&eth_frame(
            Mac([0x33, 0x33, 0, 0, 0, 1]),
            ETHERTYPE_IPV6,
            &all
        ))
        .unwrap()
        .route,
        Route::Group
    );
    let big = {
        let mut p = vec![0u8; 1501];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&1461u16.to_be_bytes());
        p[6] = ipv6::PROTO_UDP;
        p
    };
    assert_eq!(
        tx(&eth_frame(peer_mac, ETHERTYPE_IPV6, &big)),
        Err(TxDrop::Oversized)
    );
}

#[test]
fn our_addresses_and_which_one_to_send_from() {
    let a = local().addr6;
    assert!(a.is_own(&ip6(OWN_IP6_ADDR)));
    assert!(a.is_own(&a.link_local));
    assert!(!a.is_own(&ip6(PEER_IP6_ADDR)));
    assert!(a.on_link(&ip6("fe80::1234")));
    assert!(a.on_link(&ip6("2001:2:0:1::abcd")));
    assert!(!a.on_link(&ip6("2001:2:0:2::1")));
    assert_eq!(a.source_for(&ip6("2001:2:0:1::9")), ip6(OWN_IP6_ADDR));
    assert_eq!(a.source_for(&ip6("fe80::9")), a.link_local);
    assert_eq!(a.source_for(&ip6("2001:2:0:7::9")), a.link_local);
    assert_eq!(a.iter().count(), 2);
}
