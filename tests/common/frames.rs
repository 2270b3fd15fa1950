//! Ethernet frames as a kernel would write them to the TAP, for tests and benches.
#![allow(dead_code)]

use std::net::Ipv4Addr;

use uipoib::wire::arp::{self, EthArp};
use uipoib::wire::eth::{self, EthHeader, Mac};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ipv4};

pub fn eth_arp(dst: Mac, op: u16, sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    let mut f = vec![0u8; eth::HEADER_LEN + arp::ETH_ARP_LEN];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst,
            src: sha,
            ethertype: ETHERTYPE_ARP,
        },
    )
    .unwrap();
    EthArp {
        op,
        sha,
        spa,
        tha,
        tpa,
    }
    .emit(&mut f[eth::HEADER_LEN..])
    .unwrap();
    f
}

pub fn arp_request(sha: Mac, spa: Ipv4Addr, tpa: Ipv4Addr) -> Vec<u8> {
    eth_arp(Mac::BROADCAST, arp::OP_REQUEST, sha, spa, Mac::ZERO, tpa)
}

pub fn arp_reply(sha: Mac, spa: Ipv4Addr, tha: Mac, tpa: Ipv4Addr) -> Vec<u8> {
    eth_arp(tha, arp::OP_REPLY, sha, spa, tha, tpa)
}

/// An Ethernet frame carrying a minimal IPv4/UDP-less packet (protocol 253) with
/// `payload` after a 20-byte header with a correct checksum.
pub fn ipv4_frame(dst: Mac, src: Mac, sip: Ipv4Addr, dip: Ipv4Addr, payload: &[u8]) -> Vec<u8> {
    let total = 20 + payload.len();
    let mut f = vec![0u8; eth::HEADER_LEN + total];
    eth::emit_header(
        &mut f,
        &EthHeader {
            dst,
            src,
            ethertype: ETHERTYPE_IPV4,
        },
    )
    .unwrap();
    let ip = &mut f[eth::HEADER_LEN..];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total as u16).to_be_bytes());
    ip[8] = 64;
    ip[9] = 253;
    ip[12..16].copy_from_slice(&sip.octets());
    ip[16..20].copy_from_slice(&dip.octets());
    let c = ipv4::checksum(&ip[..20]);
    ip[10..12].copy_from_slice(&c.to_be_bytes());
    ip[20..].copy_from_slice(payload);
    f
}
