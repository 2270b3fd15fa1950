//! Frames, packets and headers built with the crate's own emitters: Ethernet frames as
//! a kernel writes them to the TAP, IPoIB packets as a peer sends them, TAP reads with
//! offloads. Shared by the integration tests, the benches and the fuzz crate (its seed
//! corpus and its worlds), each of which includes this file as a module.
#![allow(dead_code)]

use std::net::{Ipv4Addr, Ipv6Addr};

use uipoib::verbs::Gid;
use uipoib::wire::arp::{self, EthArp, IpoibArp};
use uipoib::wire::eth::{self, EthHeader, Mac};
use uipoib::wire::ipoib::{self, IpoibAddr};
use uipoib::wire::offload::{self, VNET_HDR_LEN, VnetHdr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, ipv4};

/// An Ethernet header and `payload`.
pub fn eth_frame(dst: Mac, src: Mac, ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut f = vec![0u8; eth::HEADER_LEN];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst,
            src,
            ethertype,
        },
    )
    .expect("room for the header");
    f.extend_from_slice(payload);
    f
}

/// An Ethernet/IPv4 ARP message (28 bytes).
pub fn eth_arp(op: u16, sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut m = vec![0u8; arp::ETH_ARP_LEN];
    EthArp {
        op,
        sha,
        spa,
        tha,
        tpa,
    }
    .emit(&mut m)
    .expect("room for the message");
    m
}

/// An IPoIB/IPv4 ARP message (56 bytes).
pub fn ipoib_arp(op: u16, sha: IpoibAddr, spa: Ipv4Addr, tha: IpoibAddr, tpa: Ipv4Addr) -> Vec<u8> {
    let mut m = vec![0u8; arp::IPOIB_ARP_LEN];
    IpoibArp {
        op,
        sha,
        spa,
        tha,
        tpa,
    }
    .emit(&mut m)
    .expect("room for the message");
    m
}

/// An IPoIB header and `payload`: a UD payload.
pub fn ipoib_packet(ethertype: u16, payload: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; ipoib::HEADER_LEN];
    ipoib::emit_header(&mut p, ethertype).expect("room for the header");
    p.extend_from_slice(payload);
    p
}

/// An IPv4 header (no options, DF, TTL 64, id `id`, correct checksum) and `payload`.
pub fn ipv4_packet(src: Ipv4Addr, dst: Ipv4Addr, proto: u8, id: u16, payload: &[u8]) -> Vec<u8> {
    ipv4_packet_flags(src, dst, proto, id, 0x40, payload)
}

/// [`ipv4_packet`] with `flags` (the byte of DF and MF: 0x40 is DF) in place of DF.
pub fn ipv4_packet_flags(
    src: Ipv4Addr,
    dst: Ipv4Addr,
    proto: u8,
    id: u16,
    flags: u8,
    payload: &[u8],
) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut p = vec![0u8; 20];
    p[0] = 0x45;
    p[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    p[4..6].copy_from_slice(&id.to_be_bytes());
    p[6] = flags;
    p[8] = 64;
    p[9] = proto;
    p[12..16].copy_from_slice(&src.octets());
    p[16..20].copy_from_slice(&dst.octets());
    let c = ipv4::checksum(&p);
    p[10..12].copy_from_slice(&c.to_be_bytes());
    p.extend_from_slice(payload);
    p
}

/// An ICMP echo request with `data`.
pub fn icmp_echo(src: Ipv4Addr, dst: Ipv4Addr, data: &[u8]) -> Vec<u8> {
    let mut m = vec![8, 0, 0, 0, 0x12, 0x34, 0, 1];
    m.extend_from_slice(data);
    let c = ipv4::checksum(&m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    ipv4_packet(src, dst, 1, 1, &m)
}

/// A UDP datagram (checksum 0: none) from port 5000 to `dport`.
pub fn udp(src: Ipv4Addr, dst: Ipv4Addr, dport: u16, data: &[u8]) -> Vec<u8> {
    let mut u = Vec::new();
    u.extend_from_slice(&5000u16.to_be_bytes());
    u.extend_from_slice(&dport.to_be_bytes());
    u.extend_from_slice(&((8 + data.len()) as u16).to_be_bytes());
    u.extend_from_slice(&[0, 0]);
    u.extend_from_slice(data);
    ipv4_packet(src, dst, 17, 2, &u)
}

/// A TCP/IPv4 segment 40000 -> 5201 with sequence number `seq`, flags `flags` (ACK is
/// 0x10, PSH 0x08), IPv4 id `id`, and a correct TCP checksum.
pub fn tcp(src: Ipv4Addr, dst: Ipv4Addr, seq: u32, flags: u8, id: u16, data: &[u8]) -> Vec<u8> {
    let mut t = vec![0u8; 20];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&5201u16.to_be_bytes());
    t[4..8].copy_from_slice(&seq.to_be_bytes());
    t[8..12].copy_from_slice(&7u32.to_be_bytes());
    t[12] = 5 << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&501u16.to_be_bytes());
    t.extend_from_slice(data);
    let mut p = ipv4_packet(src, dst, 6, id, &t);
    let s = ipv4::ones_sum(&p[12..20], 6 + t.len() as u64);
    let c = !ipv4::fold(ipv4::ones_sum(&p[20..], s));
    p[36..38].copy_from_slice(&c.to_be_bytes());
    p
}

/// One TAP read with offloads: `hdr` then `frame`.
pub fn vnet_read(hdr: &VnetHdr, frame: &[u8]) -> Vec<u8> {
    let mut h = [0u8; VNET_HDR_LEN];
    hdr.emit(&mut h);
    let mut r = h.to_vec();
    r.extend_from_slice(frame);
    r
}

/// The header of a TSO super-frame with segments of `mss` bytes and a partial checksum,
/// as the kernel hands one to a TAP with `IFF_VNET_HDR`.
pub fn tso_hdr(mss: u16) -> VnetHdr {
    VnetHdr {
        flags: offload::F_NEEDS_CSUM,
        gso_type: offload::GSO_TCPV4,
        hdr_len: 14 + 20 + 20,
        gso_size: mss,
        csum_start: 14 + 20,
        csum_offset: 16,
    }
}

/// An IPv4-mapped GID.
pub fn gid(ip: Ipv4Addr) -> Gid {
    Gid::from_ipv4(ip)
}

/// An Ethernet ARP frame from `sha` to `dst`, as the kernel writes it to the TAP.
pub fn eth_arp_frame(
    dst: Mac,
    op: u16,
    sha: Mac,
    spa: Ipv4Addr,
    tha: Mac,
    tpa: Ipv4Addr,
) -> Vec<u8> {
    eth_frame(dst, sha, ETHERTYPE_ARP, &eth_arp(op, sha, spa, tha, tpa))
}

/// A broadcast ARP request from `sha`/`spa` for `tpa`.
pub fn arp_request(sha: Mac, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    eth_arp_frame(Mac::BROADCAST, arp::OP_REQUEST, sha, spa, Mac::ZERO, tpa)
}

/// An ARP reply from `sha`/`spa` to `tha`/`tpa`.
pub fn arp_reply(sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    eth_arp_frame(tha, arp::OP_REPLY, sha, spa, tha, tpa)
}

/// An Ethernet frame carrying a minimal IPv4 packet (protocol 253, id 0, no DF) with
/// `payload` after a 20-byte header with a correct checksum.
pub fn ipv4_frame(dst: Mac, src: Mac, sip: Ipv4Addr, dip: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let ip = ipv4_packet_flags(sip, dip, 253, 0, 0, payload);
    eth_frame(dst, src, ETHERTYPE_IPV4, &ip)
}

/// An IPv6 packet from `src` to `dst` (hop limit `hop`) carrying the ICMPv6 message
/// `msg`, its checksum filled in.
pub fn icmp6_packet(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, msg: &[u8]) -> Vec<u8> {
    let mut p = vec![0u8; 40];
    p[0] = 0x60;
    p[4..6].copy_from_slice(&(msg.len() as u16).to_be_bytes());
    p[6] = uipoib::wire::ipv6::PROTO_ICMPV6;
    p[7] = hop;
    p[8..24].copy_from_slice(&src.octets());
    p[24..40].copy_from_slice(&dst.octets());
    p.extend_from_slice(msg);
    let c =
        uipoib::wire::ipv6::upper_checksum(&src, &dst, uipoib::wire::ipv6::PROTO_ICMPV6, &p[40..]);
    p[42..44].copy_from_slice(&c.to_be_bytes());
    p
}

/// What a kernel sends on its TAP to resolve `target`: a neighbour solicitation from
/// `src` to the target's solicited-node group, `sll` (the TAP's MAC) in its source
/// link-layer option.
pub fn ns_frame(sll: Mac, src: Ipv6Addr, target: Ipv6Addr) -> Vec<u8> {
    let group = uipoib::wire::ipv6::solicited_node(&target);
    let mut m = vec![135, 0, 0, 0, 0, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&[1, 1]);
    m.extend_from_slice(&sll.0);
    let dst = Mac(uipoib::wire::ipv6::multicast_mac_octets(&group));
    eth_frame(dst, sll, ETHERTYPE_IPV6, &icmp6_packet(src, group, 255, &m))
}

/// A kernel's solicited advertisement of `target` (its own address) at `tll` (its MAC),
/// unicast to `dst_mac` / `dst`.
pub fn na_frame(tll: Mac, target: Ipv6Addr, dst_mac: Mac, dst: Ipv6Addr) -> Vec<u8> {
    let mut m = vec![136, 0, 0, 0, 0x60, 0, 0, 0];
    m.extend_from_slice(&target.octets());
    m.extend_from_slice(&[2, 1]);
    m.extend_from_slice(&tll.0);
    eth_frame(
        dst_mac,
        tll,
        ETHERTYPE_IPV6,
        &icmp6_packet(target, dst, 255, &m),
    )
}

/// An ICMPv6 echo request from `src` to `dst` with `payload`.
pub fn echo6_frame(
    dst_mac: Mac,
    src_mac: Mac,
    src: Ipv6Addr,
    dst: Ipv6Addr,
    payload: &[u8],
) -> Vec<u8> {
    let mut m = vec![128, 0, 0, 0, 0, 1, 0, 1];
    m.extend_from_slice(payload);
    eth_frame(
        dst_mac,
        src_mac,
        ETHERTYPE_IPV6,
        &icmp6_packet(src, dst, 64, &m),
    )
}
