//! Writes the seed corpus, `fuzz/seeds/<target>/<name>`, from real frames built with the
//! crate's own emitters (each file's name says what it is). Run it from `fuzz/` when a
//! target's input layout changes:
//!
//!     cargo run --example seeds
//!
//! The seeds are committed; `scripts/fuzz` copies them into a scratch corpus.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use uipoib::runtime::config::DEFAULT_GROUP;
use uipoib::verbs::{GRH_LEN, Gid};
use uipoib::wire::arp::{OP_REPLY, OP_REQUEST};
use uipoib::wire::eth::{Mac, mac_for_gid};
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::ipv6::{
    self, PROTO_ICMPV6, PROTO_TCP, PROTO_UDP, link_local_for_mac, solicited_node, upper_checksum,
};
use uipoib::wire::ndisc::{
    NA_OVERRIDE, NA_SOLICITED, NEIGHBOUR_ADVERT, NEIGHBOUR_SOLICIT, OPT_SOURCE_LL, OPT_TARGET_LL,
    REDIRECT, ROUTER_ADVERT, ROUTER_SOLICIT,
};
use uipoib::wire::offload::{self, VnetHdr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ETHERTYPE_VLAN, grh};
use uipoib_fuzz::frames::*;
use uipoib_fuzz::input::join;
use uipoib_fuzz::world::{A_IP, B_IP, RX_HOLD, RX_TO_GROUP, RxWorld, TxWorld, mode, read_for};

const R_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 9);
const MCAST: Ipv4Addr = Ipv4Addr::new(224, 0, 0, 251);

fn write(target: &str, name: &str, bytes: &[u8]) {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("seeds")
        .join(target);
    std::fs::create_dir_all(&dir).expect("seed dir");
    std::fs::write(dir.join(name), bytes).expect("seed file");
}

/// A TSO super-frame `src -> dst` of `payload` bytes, with the header the kernel gives.
fn tso(dst: Mac, src: Mac, payload: usize, mss: u16) -> Vec<u8> {
    let data: Vec<u8> = (0..payload).map(|i| i as u8).collect();
    let mut ip = tcp(A_IP, B_IP, 1000, 0x18, 77, &data);
    // A super-frame's TCP checksum field holds the pseudo-header sum (partial).
    let s = uipoib::wire::ipv4::ones_sum(&ip[12..20], 6 + (ip.len() - 20) as u64);
    let ps = uipoib::wire::ipv4::fold(s);
    ip[36..38].copy_from_slice(&ps.to_be_bytes());
    vnet_read(&tso_hdr(mss), &eth_frame(dst, src, ETHERTYPE_IPV4, &ip))
}

/// Interface addresses of the IPv6 seeds (2001:2::/48).
const A6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1);
const B6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2);
const ALL_NODES: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1);
const ALL_ROUTERS: Ipv6Addr = Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 2);

/// An IPv6 packet `src -> dst`: the header, the extension headers `exts` (each its type
/// and its bytes after the next-header byte), then the upper-layer message `msg` of
/// protocol `proto`, whose 16-bit checksum at `csum_at` (within `msg`) is filled in.
fn ip6(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    hop: u8,
    exts: &[(u8, &[u8])],
    proto: u8,
    msg: &[u8],
    csum_at: Option<usize>,
) -> Vec<u8> {
    let mut p = vec![0u8; ipv6::HEADER_LEN];
    p[0] = 0x60;
    p[6] = exts.first().map_or(proto, |e| e.0);
    p[7] = hop;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    for (i, (_, body)) in exts.iter().enumerate() {
        p.push(exts.get(i + 1).map_or(proto, |e| e.0));
        p.extend_from_slice(body);
    }
    let at = p.len();
    p.extend_from_slice(msg);
    let payload_len = (p.len() - ipv6::HEADER_LEN) as u16;
    ipv6::set_payload_len(&mut p, payload_len);
    if let Some(c) = csum_at {
        p[at + c..at + c + 2].fill(0);
        let sum = upper_checksum(&src, &dst, proto, &p[at..]);
        p[at + c..at + c + 2].copy_from_slice(&sum.to_be_bytes());
    }
    p
}

/// An ICMPv6 message (type, code, then `rest` after the checksum) in an IPv6 packet.
fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, kind: u8, rest: &[u8]) -> Vec<u8> {
    let mut m = vec![kind, 0, 0, 0];
    m.extend_from_slice(rest);
    ip6(src, dst, hop, &[], PROTO_ICMPV6, &m, Some(2))
}

/// A link-layer address option in the TAP's form (RFC 2464 §6).
fn mac_opt(kind: u8, m: Mac) -> Vec<u8> {
    let mut o = vec![kind, 1];
    o.extend_from_slice(&m.0);
    o
}

/// A link-layer address option in IPoIB's form (RFC 4391 §9.1.1).
fn ib_opt(kind: u8, a: IpoibAddr) -> Vec<u8> {
    let mut o = vec![kind, 3, 0, 0];
    o.extend_from_slice(&a.to_bytes());
    o
}

/// Every neighbour discovery message between `a` (address `a6`, link-local `a_ll`: it
/// solicits) and `b` (`b6`, `b_ll`: it advertises, and is the router); `ll(kind, is_a)`
/// writes a link-layer option naming `a` or `b` in one link's form.
fn nd_messages(
    (a6, a_ll): (Ipv6Addr, Ipv6Addr),
    (b6, b_ll): (Ipv6Addr, Ipv6Addr),
    ll: &dyn Fn(u8, bool) -> Vec<u8>,
) -> Vec<(&'static str, Vec<u8>)> {
    let with = |fixed: &[u8], opts: &[Vec<u8>]| {
        let mut m = fixed.to_vec();
        for o in opts {
            m.extend_from_slice(o);
        }
        m
    };
    let target = |flags: u8, t: Ipv6Addr| {
        let mut f = vec![flags, 0, 0, 0];
        f.extend_from_slice(&t.octets());
        f
    };
    let ns = icmp6(
        a_ll,
        solicited_node(&b6),
        255,
        NEIGHBOUR_SOLICIT,
        &with(&target(0, b6), &[ll(OPT_SOURCE_LL, true)]),
    );
    let na_solicited = icmp6(
        b6,
        a_ll,
        255,
        NEIGHBOUR_ADVERT,
        &with(
            &target(NA_SOLICITED | NA_OVERRIDE, b6),
            &[ll(OPT_TARGET_LL, false)],
        ),
    );
    let na_unsolicited = icmp6(
        b6,
        ALL_NODES,
        255,
        NEIGHBOUR_ADVERT,
        &with(&target(NA_OVERRIDE, b6), &[ll(OPT_TARGET_LL, false)]),
    );
    let rs = icmp6(
        a_ll,
        ALL_ROUTERS,
        255,
        ROUTER_SOLICIT,
        &with(&[0; 4], &[ll(OPT_SOURCE_LL, true)]),
    );
    // Cur hop limit 64, no flags, router lifetime 1800 s, reachable and retrans unset.
    let ra_fixed = [64, 0, 0x07, 0x08, 0, 0, 0, 0, 0, 0, 0, 0];
    let mtu = vec![5, 1, 0, 0, 0, 0, 0x07, 0xfc];
    let mut prefix_info = vec![3, 4, 64, 0xc0];
    prefix_info.extend_from_slice(&2_592_000u32.to_be_bytes());
    prefix_info.extend_from_slice(&604_800u32.to_be_bytes());
    prefix_info.extend_from_slice(&[0; 4]);
    prefix_info.extend_from_slice(&Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 0).octets());
    let ra = icmp6(
        b_ll,
        ALL_NODES,
        255,
        ROUTER_ADVERT,
        &with(&ra_fixed, &[ll(OPT_SOURCE_LL, false), mtu, prefix_info]),
    );
    // B, the router, sends A to itself (on-link) for 2001:2:0:2::9; with the start of
    // the packet that prompted it.
    let dest = Ipv6Addr::new(0x2001, 2, 0, 2, 0, 0, 0, 9);
    let mut fixed = target(0, b_ll);
    fixed.extend_from_slice(&dest.octets());
    let prompted = icmp6(a6, dest, 64, 128, &[0, 7, 0, 1, 1, 2, 3, 4]);
    let mut redirected = vec![4, (8 + prompted.len()).div_ceil(8) as u8, 0, 0, 0, 0, 0, 0];
    redirected.extend_from_slice(&prompted);
    redirected.resize(usize::from(redirected[1]) * 8, 0);
    let redirect = icmp6(
        b_ll,
        a_ll,
        255,
        REDIRECT,
        &with(&fixed, &[ll(OPT_TARGET_LL, false), redirected]),
    );
    let dad = icmp6(
        Ipv6Addr::UNSPECIFIED,
        solicited_node(&a6),
        255,
        NEIGHBOUR_SOLICIT,
        &target(0, a6),
    );
    vec![
        ("ns", ns),
        ("na-solicited", na_solicited),
        ("na-unsolicited", na_unsolicited),
        ("rs", rs),
        ("ra-prefix-mtu", ra),
        ("redirect", redirect),
        ("dad-ns", dad),
    ]
}

/// The neighbour discovery messages `me` sends to `peer` (each `(address, link-local)`):
/// its solicitations, its advertisements (as router too) and its duplicate address
/// detection; `ll(kind, is_me)` writes a link-layer option in one link's form.
fn nd_from(
    me: (Ipv6Addr, Ipv6Addr),
    peer: (Ipv6Addr, Ipv6Addr),
    ll: &dyn Fn(u8, bool) -> Vec<u8>,
) -> Vec<(&'static str, Vec<u8>)> {
    let mut out: Vec<_> = nd_messages(me, peer, ll)
        .into_iter()
        .filter(|(n, _)| matches!(*n, "ns" | "rs" | "dad-ns"))
        .collect();
    let peer_ll = |kind: u8, is_peer: bool| ll(kind, !is_peer);
    out.extend(
        nd_messages(peer, me, &peer_ll)
            .into_iter()
            .filter(|(n, _)| n.starts_with("na-") || matches!(*n, "ra-prefix-mtu" | "redirect")),
    );
    out
}

/// IPv6 packets `src -> dst` other than neighbour discovery: an echo request, an MLDv2
/// report behind a hop-by-hop router alert, the first fragment of a UDP datagram, a TCP
/// SYN and a UDP datagram.
fn ipv6_data(src_ll: Ipv6Addr, src: Ipv6Addr, dst: Ipv6Addr) -> Vec<(&'static str, Vec<u8>)> {
    let echo = icmp6(
        src,
        dst,
        64,
        128,
        &[0x12, 0x34, 0, 1, b'p', b'i', b'n', b'g'],
    );
    let mut report = vec![143, 0, 0, 0, 0, 0, 0, 1, 4, 0, 0, 0];
    report.extend_from_slice(&solicited_node(&src).octets());
    let router_alert: &[u8] = &[0, 5, 2, 0, 0, 1, 0];
    let mld = ip6(
        src_ll,
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 0x16),
        1,
        &[(0, router_alert)],
        PROTO_ICMPV6,
        &report,
        Some(2),
    );
    let mut dgram = vec![0x13, 0x88, 0x13, 0x89, 0x05, 0xdc, 0, 0];
    dgram.extend_from_slice(&[0x5a; 64]);
    // Offset 0, more fragments, identification 7.
    let fragment: &[u8] = &[0, 0, 1, 0, 0, 0, 7];
    let frag = ip6(src, dst, 64, &[(44, fragment)], PROTO_UDP, &dgram, None);
    let mut syn = vec![0u8; 20];
    syn[..4].copy_from_slice(&[0xc3, 0x50, 0, 22]);
    syn[4..8].copy_from_slice(&1000u32.to_be_bytes());
    syn[12] = 0x50;
    syn[13] = 0x02;
    syn[14..16].copy_from_slice(&64240u16.to_be_bytes());
    let tcp6 = ip6(src, dst, 64, &[], PROTO_TCP, &syn, Some(16));
    let mut u = vec![0xd4, 0x31, 0, 53, 0, 13, 0, 0];
    u.extend_from_slice(b"query");
    let udp6 = ip6(src, dst, 64, &[], PROTO_UDP, &u, Some(6));
    vec![
        ("icmpv6-echo", echo),
        ("mld-report-hop-by-hop", mld),
        ("udp-first-fragment", frag),
        ("tcp-syn", tcp6),
        ("udp", udp6),
    ]
}

/// A `wire_ipv6` input: the control byte, the addresses a translation writes, `packet`.
fn ipv6_input(ctl: u8, packet: &[u8]) -> Vec<u8> {
    let mut v = vec![ctl];
    v.extend_from_slice(&[2, 0, 0x20, 0x01, 0, 0x0a]);
    v.extend_from_slice(&[2, 0, 0x20, 0x01, 0, 0x0b]);
    v.extend_from_slice(&IpoibAddr::new(0x2a, gid(Ipv4Addr::new(198, 18, 0, 10))).to_bytes());
    v.extend_from_slice(&IpoibAddr::new(0x2b, gid(Ipv4Addr::new(198, 18, 0, 11))).to_bytes());
    v.extend_from_slice(packet);
    v
}

fn main() {
    let a_mac = Mac([2, 0, 198, 18, 0, 1]);
    let b_mac = Mac([2, 0, 198, 18, 0, 2]);

    // wire_eth
    let arp_req = eth_arp_frame(Mac::BROADCAST, OP_REQUEST, a_mac, A_IP, Mac::ZERO, B_IP);
    let ping = eth_frame(
        b_mac,
        a_mac,
        ETHERTYPE_IPV4,
        &icmp_echo(A_IP, B_IP, b"ping"),
    );
    write("wire_eth", "arp-request-frame", &arp_req);
    write("wire_eth", "icmp-echo-frame", &ping);
    write(
        "wire_eth",
        "vlan-tagged-frame",
        &eth_frame(b_mac, a_mac, ETHERTYPE_VLAN, &[0, 5, 8, 0]),
    );
    write("wire_eth", "mac-text", b"02:00:c6:12:00:01");

    // wire_arp
    write(
        "wire_arp",
        "eth-request",
        &eth_arp(OP_REQUEST, a_mac, A_IP, Mac::ZERO, B_IP),
    );
    write(
        "wire_arp",
        "eth-reply",
        &eth_arp(OP_REPLY, b_mac, B_IP, a_mac, A_IP),
    );
    let a_hw = IpoibAddr::new(17, gid(Ipv4Addr::new(198, 18, 0, 1)));
    let b_hw = IpoibAddr::new(18, gid(Ipv4Addr::new(198, 18, 0, 2)));
    write(
        "wire_arp",
        "ipoib-request",
        &ipoib_arp(OP_REQUEST, a_hw, A_IP, IpoibAddr::ZERO, B_IP),
    );
    write(
        "wire_arp",
        "ipoib-reply",
        &ipoib_arp(OP_REPLY, b_hw, B_IP, a_hw, A_IP),
    );

    // wire_ipoib
    let ib_arp = ipoib_packet(
        ETHERTYPE_ARP,
        &ipoib_arp(OP_REQUEST, a_hw, A_IP, IpoibAddr::ZERO, B_IP),
    );
    write("wire_ipoib", "arp-packet", &ib_arp);
    write(
        "wire_ipoib",
        "ipv4-packet",
        &ipoib_packet(ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, b"ping")),
    );
    write("wire_ipoib", "hw-address", &a_hw.to_bytes());

    // wire_grh
    let (sg, dg) = (
        gid(Ipv4Addr::new(198, 18, 0, 2)),
        gid(Ipv4Addr::new(198, 18, 0, 1)),
    );
    let mut g6 = [0u8; GRH_LEN];
    grh::emit_ipv6(&mut g6, 88, &sg, &Gid::from_ipv4(DEFAULT_GROUP)).expect("grh");
    write("wire_grh", "ib-grh-to-group", &g6);
    let mut g4 = [0u8; GRH_LEN];
    grh::emit_ipv4(&mut g4, 88, &sg, &dg).expect("grh");
    write("wire_grh", "rocev2-ipv4-grh", &g4);

    // wire_ipv4
    write("wire_ipv4", "icmp-echo", &icmp_echo(A_IP, B_IP, b"ping"));
    write(
        "wire_ipv4",
        "tcp-segment",
        &tcp(A_IP, B_IP, 1, 0x10, 3, &[7; 100]),
    );
    let mut opts = ipv4_packet(A_IP, B_IP, 253, 4, &[0; 8]);
    opts[0] = 0x46;
    write("wire_ipv4", "header-with-options", &opts);

    // wire_ipv6: every neighbour discovery message in both forms, then other IPv6.
    let (a_ll, b_ll) = (link_local_for_mac(a_mac.0), link_local_for_mac(b_mac.0));
    let eth_ll = |kind: u8, is_a: bool| mac_opt(kind, if is_a { a_mac } else { b_mac });
    let ib_ll = |kind: u8, is_a: bool| ib_opt(kind, if is_a { a_hw } else { b_hw });
    for (form, ll) in [
        ("eth", &eth_ll as &dyn Fn(u8, bool) -> Vec<u8>),
        ("ipoib", &ib_ll),
    ] {
        for (name, p) in nd_messages((A6, a_ll), (B6, b_ll), ll) {
            write("wire_ipv6", &format!("{name}-{form}"), &ipv6_input(0, &p));
        }
    }
    let ns = &nd_messages((A6, a_ll), (B6, b_ll), &eth_ll)[0].1;
    let mut padded = ns.clone();
    padded.extend_from_slice(&[0; 6]);
    write("wire_ipv6", "ns-eth-padded", &ipv6_input(0, &padded));
    let mut unsummed = ns.clone();
    unsummed[42..44].fill(0);
    write(
        "wire_ipv6",
        "ns-eth-checksum-filled-in",
        &ipv6_input(1, &unsummed),
    );
    for (name, p) in ipv6_data(a_ll, A6, B6) {
        write("wire_ipv6", name, &ipv6_input(0, &p));
    }

    // wire_gso: even mode byte, TAP reads; odd, frames to join.
    write(
        "wire_gso",
        "tso-3-segments",
        &join(0, &[(0, &tso(b_mac, a_mac, 2500, 1000))]),
    );
    let udp_frame = eth_frame(b_mac, a_mac, ETHERTYPE_IPV4, &udp(A_IP, B_IP, 53, b"query"));
    let csum = VnetHdr {
        flags: offload::F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    write(
        "wire_gso",
        "udp-partial-checksum",
        &join(0, &[(0, &vnet_read(&csum, &udp_frame))]),
    );
    let seg = |seq: u32, flags: u8, n: usize| {
        eth_frame(
            b_mac,
            a_mac,
            ETHERTYPE_IPV4,
            &tcp(A_IP, B_IP, seq, flags, seq as u16, &vec![5; n]),
        )
    };
    let (s1, s2, s3) = (
        seg(1, 0x10, 1000),
        seg(1001, 0x10, 1000),
        seg(2001, 0x18, 300),
    );
    write(
        "wire_gso",
        "gro-3-segments",
        &join(1, &[(0, &s1), (0, &s2), (0, &s3)]),
    );
    write(
        "wire_gso",
        "gro-gap-then-syn",
        &join(1, &[(0, &s1), (0, &s3), (0, &seg(9, 0x12, 0))]),
    );

    // tx_tap: the mode byte, then one TAP read per record.
    for (name, m) in [
        ("plain", 0),
        ("introduced-one-by-one", mode::INTRODUCE | mode::ONE_BY_ONE),
        (
            "link-local-small-mtu",
            mode::INTRODUCE | mode::LINK_LOCAL | mode::SMALL_MTU,
        ),
    ] {
        let w = TxWorld::new(m);
        let (am, bm) = (w.a_mac(), w.b_mac());
        w.finish();
        let f1 = eth_arp_frame(Mac::BROADCAST, OP_REQUEST, am, A_IP, Mac::ZERO, B_IP);
        let f2 = eth_frame(bm, am, ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, &[1; 64]));
        let f3 = eth_frame(
            Mac([1, 0, 0x5e, 0, 0, 251]),
            am,
            ETHERTYPE_IPV4,
            &udp(A_IP, MCAST, 5353, b"mdns"),
        );
        let f4 = eth_arp_frame(bm, OP_REPLY, am, A_IP, bm, B_IP);
        let f5 = eth_frame(bm, am, ETHERTYPE_IPV6, &[0x60; 40]);
        write(
            "tx_tap",
            name,
            &join(m, &[(0, &f1), (0, &f2), (0, &f3), (0, &f4), (0, &f5)]),
        );
        // IPv6 as A's kernel sends it: neighbour discovery in the TAP's form, then data.
        let (a_ll, b_ll) = (link_local_for_mac(am.0), link_local_for_mac(bm.0));
        let ll = |kind: u8, is_a: bool| mac_opt(kind, if is_a { am } else { bm });
        let mut packets = nd_from((A6, a_ll), (B6, b_ll), &ll);
        packets.extend(ipv6_data(a_ll, A6, B6));
        let frames: Vec<Vec<u8>> = packets
            .iter()
            .map(|(_, p)| {
                let dst = Ipv6Addr::from(<[u8; 16]>::try_from(&p[24..40]).expect("16 bytes"));
                let to = if dst.is_multicast() {
                    Mac(ipv6::multicast_mac_octets(&dst))
                } else {
                    bm
                };
                eth_frame(to, am, ETHERTYPE_IPV6, p)
            })
            .collect();
        let records: Vec<(u8, &[u8])> = frames.iter().map(|f| (0, &f[..])).collect();
        write("tx_tap", &format!("ipv6-{name}"), &join(m, &records));
    }
    for (name, m) in [
        (
            "offload-tso",
            mode::A_OFFLOAD | mode::INTRODUCE | mode::ONE_BY_ONE,
        ),
        (
            "offload-tso-gro",
            mode::A_OFFLOAD | mode::B_OFFLOAD | mode::INTRODUCE,
        ),
    ] {
        let w = TxWorld::new(m);
        let (am, bm) = (w.a_mac(), w.b_mac());
        w.finish();
        let ping = read_for(
            true,
            &eth_frame(bm, am, ETHERTYPE_IPV4, &icmp_echo(A_IP, B_IP, b"x")),
        );
        let mut partial = udp_frame.clone();
        partial[..6].copy_from_slice(&bm.0);
        partial[6..12].copy_from_slice(&am.0);
        write(
            "tx_tap",
            name,
            &join(
                m,
                &[
                    (0, &tso(bm, am, 4000, 1448)),
                    (0, &ping),
                    (0, &vnet_read(&csum, &partial)),
                ],
            ),
        );
    }

    // rx_fabric: the mode byte, then one UD payload per record (flags: to the group; held
    // for the next poll).
    for (name, m) in [
        ("plain", 0),
        ("offload-gro", mode::A_OFFLOAD),
        ("link-local", mode::LINK_LOCAL),
    ] {
        let w = RxWorld::new(m);
        let (r, a) = (w.sender(), w.a_hw());
        w.finish();
        let req = ipoib_packet(
            ETHERTYPE_ARP,
            &ipoib_arp(OP_REQUEST, r, R_IP, IpoibAddr::ZERO, A_IP),
        );
        let rep = ipoib_packet(ETHERTYPE_ARP, &ipoib_arp(OP_REPLY, r, R_IP, a, A_IP));
        let echo = ipoib_packet(ETHERTYPE_IPV4, &icmp_echo(R_IP, A_IP, &[2; 56]));
        let seg = |seq: u32, flags: u8, n: usize| {
            ipoib_packet(
                ETHERTYPE_IPV4,
                &tcp(R_IP, A_IP, seq, flags, seq as u16, &vec![9; n]),
            )
        };
        let mut bad = echo.clone();
        bad[3] = 1;
        let v6 = ipoib_packet(ETHERTYPE_IPV6, &[0x60; 40]);
        write(
            "rx_fabric",
            name,
            &join(
                m,
                &[
                    (RX_TO_GROUP, &req),
                    (0, &rep),
                    (0, &echo),
                    (RX_HOLD, &seg(1, 0x10, 1000)),
                    (RX_HOLD, &seg(1001, 0x10, 1000)),
                    (0, &seg(2001, 0x18, 10)),
                    (
                        RX_TO_GROUP,
                        &ipoib_packet(ETHERTYPE_IPV4, &udp(R_IP, MCAST, 5353, b"mdns")),
                    ),
                    (0, &bad),
                    (0, &v6),
                    (0, &[8, 0]),
                ],
            ),
        );
        // IPv6 from the sender: neighbour discovery in IPoIB's form (multicast to the
        // group), then data.
        let r6 = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 9);
        let r_ll = link_local_for_mac(mac_for_gid(&r.gid).0);
        let a_ll = link_local_for_mac(mac_for_gid(&a.gid).0);
        let ll = |kind: u8, is_r: bool| ib_opt(kind, if is_r { r } else { a });
        let mut packets = nd_from((r6, r_ll), (A6, a_ll), &ll);
        packets.extend(ipv6_data(r_ll, r6, A6));
        let payloads: Vec<(u8, Vec<u8>)> = packets
            .iter()
            .map(|(_, p)| {
                let to_group = p[24] == 0xff;
                (
                    if to_group { RX_TO_GROUP } else { 0 },
                    ipoib_packet(ETHERTYPE_IPV6, p),
                )
            })
            .collect();
        let records: Vec<(u8, &[u8])> = payloads.iter().map(|(f, p)| (*f, &p[..])).collect();
        write("rx_fabric", &format!("ipv6-{name}"), &join(m, &records));
    }

    // config
    let example =
        std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("../config/uipoib.toml"))
            .expect("config/uipoib.toml");
    write("config", "example-uipoib-toml", &example);
    write("config", "top-level-keys", b"device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nmtu = 2044\ngroup = \"ff12:401b::1\"\n");
    write(
        "config",
        "bad-ring",
        b"[interface]\nrecv-ring = 1000\nbudget = 0\nqkey = 0x80000000\n",
    );
}
