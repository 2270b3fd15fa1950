//! The 40 bytes in front of every UD receive ([`GRH_LEN`]).
//!
//! Who sent a packet is known only from these bytes: the source GID names the peer (its
//! QPN comes from the completion). Their layout depends on the port: an IB GRH (or the
//! IPv6 header of RoCEv2 over IPv6) carries the GIDs at fixed offsets; RoCEv2 over IPv4
//! leaves the first 20 bytes undefined and puts the IPv4 header in the last 20, whose
//! addresses stand for IPv4-mapped GIDs. The emitters write what a fabric would, for
//! tests and the simulated fabric.

use super::gid::Gid;
use super::{WireError, ipv4, prefix, prefix_mut};

/// Size of the Global Routing Header that precedes every UD receive.
pub const GRH_LEN: usize = 40;

/// How the 40 bytes in front of a UD receive are laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrhKind {
    /// An IB GRH / IPv6 header: source GID at bytes 8..24, destination GID at 24..40.
    Ipv6,
    /// RoCEv2 over IPv4: bytes 0..20 undefined, bytes 20..40 hold the IPv4 header.
    Ipv4,
}

/// Next-header value of an IB GRH carrying a BTH (IBA 8.3.1: "IBA transport").
const NEXT_HEADER_IBA: u8 = 0x1B;
/// Hop limit a simulated fabric writes: one subnet, no router.
const HOP_LIMIT: u8 = 1;
/// Offset of the IPv4 header in a RoCEv2-IPv4 GRH.
const IPV4_AT: usize = GRH_LEN - ipv4::MIN_HEADER_LEN;
/// TTL a simulated RoCEv2-IPv4 fabric writes (the Linux default).
const IPV4_TTL: u8 = 64;
/// IP protocol number of UDP, which carries RoCEv2.
const IPPROTO_UDP: u8 = 17;

/// The addresses a GRH carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GrhInfo {
    /// Source GID: the sending peer's port.
    pub sgid: Gid,
    /// Destination GID: this port's GID, or a multicast group's.
    pub dgid: Gid,
}

fn gid_at(b: &[u8; GRH_LEN], at: usize) -> Gid {
    let mut g = [0u8; 16];
    g.copy_from_slice(&b[at..at + 16]);
    Gid(g)
}

/// Parse the 40 bytes in front of a UD receive.
///
/// - [`GrhKind::Ipv6`] (IB GRH / RoCEv2-IPv6): the IP version nibble of byte 0 must be
///   6; sgid = bytes 8..24, dgid = 24..40.
/// - [`GrhKind::Ipv4`] (RoCEv2 over IPv4): bytes 0..20 are undefined and ignored; bytes
///   20..40 are an IPv4 header (version 4, IHL 5): sgid = `Gid::from_ipv4(src)`, dgid =
///   `Gid::from_ipv4(dst)`. Its checksum is not verified (the device has done so).
///
/// Fewer than 40 bytes → [`WireError::Truncated`]; a layout that does not match `kind`
/// → [`WireError::BadGrh`].
pub fn parse(grh: &[u8], kind: GrhKind) -> Result<GrhInfo, WireError> {
    let g: &[u8; GRH_LEN] = prefix(grh, "GRH")?;
    match kind {
        GrhKind::Ipv6 => {
            if g[0] >> 4 != 6 {
                return Err(WireError::BadGrh("IP version of an IB/IPv6 GRH is not 6"));
            }
            Ok(GrhInfo {
                sgid: gid_at(g, 8),
                dgid: gid_at(g, 24),
            })
        }
        GrhKind::Ipv4 => {
            let h = &g[IPV4_AT..];
            if h[0] >> 4 != 4 {
                return Err(WireError::BadGrh(
                    "IP version of the IPv4 header in a RoCEv2-IPv4 GRH is not 4",
                ));
            }
            if h[0] & 0x0f != 5 {
                return Err(WireError::BadGrh(
                    "IHL of the IPv4 header in a RoCEv2-IPv4 GRH is not 5",
                ));
            }
            let ip = |at: usize| std::net::Ipv4Addr::new(h[at], h[at + 1], h[at + 2], h[at + 3]);
            Ok(GrhInfo {
                sgid: Gid::from_ipv4(ip(12)),
                dgid: Gid::from_ipv4(ip(16)),
            })
        }
    }
}

/// Write a GRH as a simulated fabric would ([`GrhKind::Ipv6`] layout: version 6, traffic
/// class and flow label 0, payload length, next header 0x1B, hop limit 1, sgid, dgid)
/// into `out[0..40]`. For tests and the simulated fabric.
pub fn emit_ipv6(
    out: &mut [u8],
    payload_len: u16,
    sgid: &Gid,
    dgid: &Gid,
) -> Result<(), WireError> {
    let g: &mut [u8; GRH_LEN] = prefix_mut(out, "GRH")?;
    g[0..4].copy_from_slice(&[0x60, 0, 0, 0]);
    g[4..6].copy_from_slice(&payload_len.to_be_bytes());
    g[6] = NEXT_HEADER_IBA;
    g[7] = HOP_LIMIT;
    g[8..24].copy_from_slice(&sgid.0);
    g[24..40].copy_from_slice(&dgid.0);
    Ok(())
}

/// Write a RoCEv2-IPv4-style GRH into `out[0..40]`: 20 undefined bytes zeroed, then a
/// valid IPv4 header (no options, DF set, protocol UDP (17), TTL 64, correct checksum,
/// total length `20 + payload_len`) whose addresses are those of the IPv4-mapped GIDs.
/// A GID that is not IPv4-mapped, or a `payload_len` above 65515, is
/// [`WireError::BadIpv4`]; nothing is written then.
pub fn emit_ipv4(
    out: &mut [u8],
    payload_len: u16,
    sgid: &Gid,
    dgid: &Gid,
) -> Result<(), WireError> {
    let src = sgid
        .as_ipv4()
        .ok_or(WireError::BadIpv4("source GID is not IPv4-mapped"))?;
    let dst = dgid
        .as_ipv4()
        .ok_or(WireError::BadIpv4("destination GID is not IPv4-mapped"))?;
    let total_len =
        payload_len
            .checked_add(ipv4::MIN_HEADER_LEN as u16)
            .ok_or(WireError::BadIpv4(
                "payload length does not fit the IPv4 total length",
            ))?;
    let g: &mut [u8; GRH_LEN] = prefix_mut(out, "GRH")?;
    g[..IPV4_AT].fill(0);
    let h = &mut g[IPV4_AT..];
    h[0] = 0x45; // version 4, IHL 5
    h[1] = 0; // DSCP/ECN
    h[2..4].copy_from_slice(&total_len.to_be_bytes());
    h[4..6].fill(0); // identification
    h[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF, offset 0
    h[8] = IPV4_TTL;
    h[9] = IPPROTO_UDP;
    h[10..12].fill(0);
    h[12..16].copy_from_slice(&src.octets());
    h[16..20].copy_from_slice(&dst.octets());
    let sum = ipv4::checksum(h);
    h[10..12].copy_from_slice(&sum.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    fn v4(a: u8, b: u8, c: u8, d: u8) -> Gid {
        Gid::from_ipv4(Ipv4Addr::new(a, b, c, d))
    }

    /// An IB GRH from fe80::1 to ff12:401b::1 (an IPoIB broadcast-like group), payload 100.
    const IB_GRH: [u8; 40] = [
        0x60, 0x00, 0x00, 0x00, // version 6, TC 0, flow 0
        0x00, 0x64, 0x1B, 0x01, // payload 100, next header IBA, hop limit 1
        0xfe, 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, // sgid
        0xff, 0x12, 0x40, 0x1b, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0x01, // dgid
    ];

    /// A RoCEv2-IPv4 GRH: 20 undefined bytes, then the IPv4 header 192.168.0.1 ->
    /// 192.168.0.199, total length 0x73, DF, TTL 64, UDP, checksum 0xb861.
    const ROCE_V4_GRH: [u8; 40] = [
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // undefined
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, // IPv4
        0xc0, 0xa8, 0x00, 0x01, 0xc0, 0xa8, 0x00, 0xc7, // src, dst
    ];

    fn ib_sgid() -> Gid {
        "fe80::1".parse().unwrap()
    }

    fn ib_dgid() -> Gid {
        "ff12:401b::1".parse().unwrap()
    }

    #[test]
    fn ipv6_known_answer() {
        assert_eq!(
            parse(&IB_GRH, GrhKind::Ipv6),
            Ok(GrhInfo {
                sgid: ib_sgid(),
                dgid: ib_dgid()
            })
        );
        let mut out = [0xAAu8; 42];
        emit_ipv6(&mut out, 100, &ib_sgid(), &ib_dgid()).unwrap();
        assert_eq!(out[..40], IB_GRH);
        assert_eq!(out[40..], [0xAA, 0xAA]);
    }

    #[test]
    fn ipv4_known_answer() {
        let want = GrhInfo {
            sgid: v4(192, 168, 0, 1),
            dgid: v4(192, 168, 0, 199),
        };
        assert_eq!(parse(&ROCE_V4_GRH, GrhKind::Ipv4), Ok(want));
        let mut out = [0xAAu8; 42];
        emit_ipv4(&mut out, 0x73 - 20, &want.sgid, &want.dgid).unwrap();
        assert_eq!(out[..40], ROCE_V4_GRH);
        assert_eq!(out[40..], [0xAA, 0xAA]);
    }

    #[test]
    fn ipv4_undefined_bytes_are_ignored() {
        let mut g = ROCE_V4_GRH;
        g[..20].fill(0x6f);
        assert_eq!(parse(&g, GrhKind::Ipv4), parse(&ROCE_V4_GRH, GrhKind::Ipv4));
    }

    #[test]
    fn receive_buffer_may_hold_more_than_the_grh() {
        let mut buf = [0x55u8; 100];
        buf[..40].copy_from_slice(&IB_GRH);
        assert_eq!(parse(&buf, GrhKind::Ipv6).map(|i| i.sgid), Ok(ib_sgid()));
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..GRH_LEN {
            for (bytes, kind) in [(&IB_GRH, GrhKind::Ipv6), (&ROCE_V4_GRH, GrhKind::Ipv4)] {
                assert_eq!(
                    parse(&bytes[..len], kind),
                    Err(WireError::Truncated {
                        what: "GRH",
                        need: GRH_LEN,
                        got: len
                    }),
                    "{kind:?} length {len}"
                );
            }
        }
    }

    #[test]
    fn ipv6_version_nibble_must_be_6() {
        for v in (0u8..16).filter(|&v| v != 6) {
            let mut g = IB_GRH;
            g[0] = v << 4;
            assert_eq!(
                parse(&g, GrhKind::Ipv6),
                Err(WireError::BadGrh("IP version of an IB/IPv6 GRH is not 6")),
                "version {v}"
            );
        }
        // A RoCEv2-IPv4 receive read as IPv6 is refused, not misread.
        let mut g = ROCE_V4_GRH;
        g[0] = 0x45;
        assert!(parse(&g, GrhKind::Ipv6).is_err());
    }

    #[test]
    fn ipv4_version_nibble_must_be_4() {
        for v in (0u8..16).filter(|&v| v != 4) {
            let mut g = ROCE_V4_GRH;
            g[20] = (v << 4) | 5;
            assert_eq!(
                parse(&g, GrhKind::Ipv4),
                Err(WireError::BadGrh(
                    "IP version of the IPv4 header in a RoCEv2-IPv4 GRH is not 4"
                )),
                "version {v}"
            );
        }
        // An IB GRH read as RoCEv2-IPv4: byte 20 is inside the source GID.
        assert!(parse(&IB_GRH, GrhKind::Ipv4).is_err());
    }

    #[test]
    fn ipv4_ihl_must_be_5() {
        for ihl in (0u8..16).filter(|&i| i != 5) {
            let mut g = ROCE_V4_GRH;
            g[20] = 0x40 | ihl;
            assert_eq!(
                parse(&g, GrhKind::Ipv4),
                Err(WireError::BadGrh(
                    "IHL of the IPv4 header in a RoCEv2-IPv4 GRH is not 5"
                )),
                "IHL {ihl}"
            );
        }
    }

    #[test]
    fn emitted_ipv4_header_is_valid() {
        let mut out = [0u8; 40];
        emit_ipv4(&mut out, 1000, &v4(10, 0, 0, 1), &v4(239, 1, 2, 3)).unwrap();
        assert_eq!(ipv4::checksum(&out[20..]), 0);
        // The header claims 1020 bytes; give it a buffer that long.
        let mut pkt = [0u8; 1020];
        pkt[..20].copy_from_slice(&out[20..]);
        let s = ipv4::parse_summary(&pkt).unwrap();
        assert_eq!(s.total_len, 1020);
        assert_eq!(s.protocol, 17);
        assert_eq!(s.src, Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(s.dst, Ipv4Addr::new(239, 1, 2, 3));
    }

    #[test]
    fn emit_ipv4_needs_ipv4_mapped_gids() {
        let mut out = [0xAAu8; 40];
        assert_eq!(
            emit_ipv4(&mut out, 0, &ib_sgid(), &v4(1, 2, 3, 4)),
            Err(WireError::BadIpv4("source GID is not IPv4-mapped"))
        );
        assert_eq!(
            emit_ipv4(&mut out, 0, &v4(1, 2, 3, 4), &Gid::ZERO),
            Err(WireError::BadIpv4("destination GID is not IPv4-mapped"))
        );
        assert_eq!(out, [0xAA; 40], "nothing written on error");
    }

    #[test]
    fn emit_ipv4_payload_length_limit() {
        let mut out = [0u8; 40];
        let (a, b) = (v4(1, 2, 3, 4), v4(5, 6, 7, 8));
        assert_eq!(emit_ipv4(&mut out, 65515, &a, &b), Ok(()));
        assert_eq!(out[22..24], [0xff, 0xff]);
        assert_eq!(
            emit_ipv4(&mut out, 65516, &a, &b),
            Err(WireError::BadIpv4(
                "payload length does not fit the IPv4 total length"
            ))
        );
    }

    #[test]
    fn emit_into_short_buffer_fails() {
        let mut out = [0u8; 39];
        let want = Err(WireError::Truncated {
            what: "GRH",
            need: 40,
            got: 39,
        });
        assert_eq!(emit_ipv6(&mut out, 0, &ib_sgid(), &ib_dgid()), want);
        assert_eq!(
            emit_ipv4(&mut out, 0, &v4(1, 2, 3, 4), &v4(1, 2, 3, 5)),
            want
        );
    }

    fn any_v4_gid() -> impl Strategy<Value = Gid> {
        any::<u32>().prop_map(|a| Gid::from_ipv4(Ipv4Addr::from(a)))
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = parse(&b, GrhKind::Ipv6);
            let _ = parse(&b, GrhKind::Ipv4);
        }

        #[test]
        fn ipv6_round_trip(len in any::<u16>(), s in any::<[u8; 16]>(), d in any::<[u8; 16]>()) {
            let (sgid, dgid) = (Gid(s), Gid(d));
            let mut out = [0u8; GRH_LEN];
            emit_ipv6(&mut out, len, &sgid, &dgid).unwrap();
            prop_assert_eq!(parse(&out, GrhKind::Ipv6), Ok(GrhInfo { sgid, dgid }));
            prop_assert_eq!(u16::from_be_bytes([out[4], out[5]]), len);
        }

        #[test]
        fn ipv4_round_trip(len in 0u16..=65515, sgid in any_v4_gid(), dgid in any_v4_gid()) {
            let mut out = [0u8; GRH_LEN];
            emit_ipv4(&mut out, len, &sgid, &dgid).unwrap();
            prop_assert_eq!(parse(&out, GrhKind::Ipv4), Ok(GrhInfo { sgid, dgid }));
            prop_assert_eq!(ipv4::checksum(&out[IPV4_AT..]), 0);
        }
    }
}
