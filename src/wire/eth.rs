//! Ethernet frames as the TAP sees them, and the MACs that stand for IPoIB peers.
//!
//! The TAP speaks Ethernet; the fabric does not have MACs. Each peer is shown to the
//! kernel under a locally administered MAC derived from its GID ([`mac_for_gid`]), and
//! IPv4 multicast groups under their usual `01:00:5e` MACs ([`multicast_mac`]). This
//! module parses and writes the 14-byte header; which EtherTypes are carried is decided
//! by the caller, except that VLAN tags are refused here because they hide the real
//! EtherType.

use core::fmt;
use core::str::FromStr;
use std::net::Ipv4Addr;

use super::gid::Gid;
use super::{ETHERTYPE_QINQ, ETHERTYPE_VLAN, WireError, prefix, prefix_mut};

/// Length of an Ethernet header (no VLAN tag, no FCS).
pub const HEADER_LEN: usize = 14;

/// A 48-bit Ethernet MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Mac(pub [u8; 6]);

impl Mac {
    /// `ff:ff:ff:ff:ff:ff`.
    pub const BROADCAST: Mac = Mac([0xff; 6]);
    /// `00:00:00:00:00:00`.
    pub const ZERO: Mac = Mac([0; 6]);

    /// True for `ff:ff:ff:ff:ff:ff`.
    pub fn is_broadcast(&self) -> bool {
        *self == Mac::BROADCAST
    }

    /// True when the group (I/G) bit is set; this includes broadcast.
    pub fn is_multicast(&self) -> bool {
        self.0[0] & 0x01 != 0
    }
}

impl fmt::Display for Mac {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let m = &self.0;
        write!(
            f,
            "{:02x}:{:02x}:{:02x}:{:02x}:{:02x}:{:02x}",
            m[0], m[1], m[2], m[3], m[4], m[5]
        )
    }
}

/// Why a string is not a MAC address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid MAC address: {reason}")]
pub struct ParseMacError {
    reason: &'static str,
}

impl ParseMacError {
    /// What was wrong with the string.
    pub fn reason(&self) -> &'static str {
        self.reason
    }
}

impl FromStr for Mac {
    type Err = ParseMacError;

    /// Parses six groups of one or two hexadecimal digits separated by `:`
    /// (`aa:bb:cc:dd:ee:ff`, case-insensitive).
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = |reason| ParseMacError { reason };
        let mut out = [0u8; 6];
        let mut groups = s.split(':');
        for byte in out.iter_mut() {
            let g = groups
                .next()
                .ok_or(err("fewer than 6 colon-separated groups"))?;
            if g.is_empty() || g.len() > 2 || !g.bytes().all(|c| c.is_ascii_hexdigit()) {
                return Err(err("each group must be 1 or 2 hexadecimal digits"));
            }
            *byte = u8::from_str_radix(g, 16)
                .map_err(|_| err("each group must be 1 or 2 hexadecimal digits"))?;
        }
        if groups.next().is_some() {
            return Err(err("more than 6 colon-separated groups"));
        }
        Ok(Mac(out))
    }
}

/// FNV-1a, 32-bit: small, stable across builds and platforms, good enough spread for
/// 16-byte GIDs.
fn fnv1a32(bytes: &[u8]) -> u32 {
    const OFFSET_BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes
        .iter()
        .fold(OFFSET_BASIS, |h, &b| (h ^ u32::from(b)).wrapping_mul(PRIME))
}

/// A locally administered unicast MAC standing for the peer with this GID:
/// deterministic, and independent of the QPN (so it survives a peer's restart).
///
/// - IPv4-mapped GID `::ffff:a.b.c.d` → `02:00:a:b:c:d` (unique per address).
/// - Any other GID → `02:01` followed by the 4 bytes (big-endian) of the FNV-1a 32-bit
///   hash of its 16 bytes.
///
/// The two forms cannot collide with each other, and IPv4-mapped GIDs never collide.
/// Two non-IPv4 GIDs *can* map to the same MAC (a 32-bit hash); the neighbour table
/// detects such a collision (one MAC claimed by two GIDs).
pub fn mac_for_gid(gid: &Gid) -> Mac {
    match gid.as_ipv4() {
        Some(ip) => {
            let [a, b, c, d] = ip.octets();
            Mac([0x02, 0x00, a, b, c, d])
        }
        None => {
            let [a, b, c, d] = fnv1a32(&gid.0).to_be_bytes();
            Mac([0x02, 0x01, a, b, c, d])
        }
    }
}

/// The Ethernet multicast MAC of an IPv4 multicast group: `01:00:5e` followed by the
/// low 23 bits of the address (RFC 1112 § 6.4). The address is not checked to be
/// multicast.
pub fn multicast_mac(ip: Ipv4Addr) -> Mac {
    let [_, b, c, d] = ip.octets();
    Mac([0x01, 0x00, 0x5e, b & 0x7f, c, d])
}

/// An Ethernet header (no VLAN tag).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthHeader {
    /// Destination MAC.
    pub dst: Mac,
    /// Source MAC.
    pub src: Mac,
    /// EtherType of the payload.
    pub ethertype: u16,
}

/// Parse a frame from the TAP: header + payload. EtherType 0x8100 / 0x88A8 →
/// [`WireError::Vlan`]; fewer than 14 bytes → [`WireError::Truncated`]. Does not judge
/// other EtherTypes.
pub fn parse_frame(frame: &[u8]) -> Result<(EthHeader, &[u8]), WireError> {
    let h: &[u8; HEADER_LEN] = prefix(frame, "Ethernet header")?;
    let ethertype = u16::from_be_bytes([h[12], h[13]]);
    if ethertype == ETHERTYPE_VLAN || ethertype == ETHERTYPE_QINQ {
        return Err(WireError::Vlan);
    }
    let mut dst = [0u8; 6];
    let mut src = [0u8; 6];
    dst.copy_from_slice(&h[0..6]);
    src.copy_from_slice(&h[6..12]);
    let header = EthHeader {
        dst: Mac(dst),
        src: Mac(src),
        ethertype,
    };
    Ok((header, &frame[HEADER_LEN..]))
}

/// Write a 14-byte header at `out[0..14]`.
pub fn emit_header(out: &mut [u8], h: &EthHeader) -> Result<(), WireError> {
    let o: &mut [u8; HEADER_LEN] = prefix_mut(out, "Ethernet header")?;
    o[0..6].copy_from_slice(&h.dst.0);
    o[6..12].copy_from_slice(&h.src.0);
    o[12..14].copy_from_slice(&h.ethertype.to_be_bytes());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6};
    use proptest::prelude::*;
    use std::collections::HashMap;

    /// A broadcast ARP frame header from 02:00:c6:12:00:01, written by hand.
    const FRAME: [u8; 16] = [
        0xff, 0xff, 0xff, 0xff, 0xff, 0xff, // dst
        0x02, 0x00, 0xc6, 0x12, 0x00, 0x01, // src
        0x08, 0x06, // ARP
        0xAB, 0xCD, // payload
    ];

    #[test]
    fn parse_known_frame() {
        let (h, payload) = parse_frame(&FRAME).unwrap();
        assert_eq!(
            h,
            EthHeader {
                dst: Mac::BROADCAST,
                src: Mac([0x02, 0x00, 0xc6, 0x12, 0x00, 0x01]),
                ethertype: ETHERTYPE_ARP,
            }
        );
        assert_eq!(payload, &[0xAB, 0xCD]);
    }

    #[test]
    fn emit_known_header() {
        let mut out = [0u8; 16];
        out[14..].copy_from_slice(&[0xAB, 0xCD]);
        let (h, _) = parse_frame(&FRAME).unwrap();
        emit_header(&mut out, &h).unwrap();
        assert_eq!(out, FRAME);
    }

    #[test]
    fn header_only_frame_has_empty_payload() {
        let (h, payload) = parse_frame(&FRAME[..14]).unwrap();
        assert_eq!(h.ethertype, ETHERTYPE_ARP);
        assert!(payload.is_empty());
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..HEADER_LEN {
            assert_eq!(
                parse_frame(&FRAME[..len]),
                Err(WireError::Truncated {
                    what: "Ethernet header",
                    need: HEADER_LEN,
                    got: len
                })
            );
        }
    }

    #[test]
    fn vlan_tags_are_refused() {
        for tag in [[0x81, 0x00], [0x88, 0xA8]] {
            let mut f = FRAME;
            f[12..14].copy_from_slice(&tag);
            assert_eq!(parse_frame(&f), Err(WireError::Vlan));
        }
    }

    #[test]
    fn other_ethertypes_are_not_judged() {
        for t in [ETHERTYPE_IPV4, ETHERTYPE_IPV6, 0x0000, 0x88CC, 0xFFFF] {
            let mut f = FRAME;
            f[12..14].copy_from_slice(&t.to_be_bytes());
            assert_eq!(parse_frame(&f).map(|(h, _)| h.ethertype), Ok(t));
        }
    }

    #[test]
    fn emit_into_short_buffer_fails() {
        let mut out = [0u8; 13];
        let (h, _) = parse_frame(&FRAME).unwrap();
        assert_eq!(
            emit_header(&mut out, &h),
            Err(WireError::Truncated {
                what: "Ethernet header",
                need: 14,
                got: 13
            })
        );
    }

    #[test]
    fn broadcast_and_multicast() {
        assert!(Mac::BROADCAST.is_broadcast());
        assert!(Mac::BROADCAST.is_multicast());
        assert!(!Mac::ZERO.is_broadcast());
        assert!(!Mac::ZERO.is_multicast());
        let mc = Mac([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01]);
        assert!(mc.is_multicast() && !mc.is_broadcast());
        let uc = Mac([0x02, 0xff, 0xff, 0xff, 0xff, 0xff]);
        assert!(!uc.is_multicast() && !uc.is_broadcast());
        assert_eq!(Mac::default(), Mac::ZERO);
    }

    #[test]
    fn display_and_parse() {
        let m = Mac([0x02, 0x00, 0xc6, 0x12, 0x0a, 0xff]);
        assert_eq!(m.to_string(), "02:00:c6:12:0a:ff");
        assert_eq!("02:00:c6:12:0a:ff".parse::<Mac>(), Ok(m));
        assert_eq!("02:00:C6:12:A:FF".parse::<Mac>(), Ok(m));
    }

    #[test]
    fn parse_rejects_malformed_strings() {
        for s in [
            "",
            "02:00:c6:12:0a",
            "02:00:c6:12:0a:ff:00",
            "02:00:c6:12:0a:",
            "02::c6:12:0a:ff",
            "02:00:c6:12:0a:fff",
            "02:00:c6:12:0a:+f",
            "02:00:c6:12:0a:fg",
            "02-00-c6-12-0a-ff",
            " 02:00:c6:12:0a:ff",
        ] {
            assert!(s.parse::<Mac>().is_err(), "{s:?} parsed");
        }
        assert_eq!(
            "1:2:3".parse::<Mac>().unwrap_err().reason(),
            "fewer than 6 colon-separated groups"
        );
    }

    #[test]
    fn fnv1a32_known_answers() {
        // Published FNV-1a 32-bit test vectors.
        assert_eq!(fnv1a32(b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn mac_for_ipv4_gid() {
        let g = Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1));
        assert_eq!(mac_for_gid(&g), Mac([0x02, 0x00, 198, 18, 0, 1]));
    }

    #[test]
    fn mac_for_other_gid() {
        // fe80::211:22ff:fe33:4455; FNV-1a 32 of its 16 bytes is 0x6f47c7ed.
        let g: Gid = "fe80::211:22ff:fe33:4455".parse().unwrap();
        assert_eq!(mac_for_gid(&g), Mac([0x02, 0x01, 0x6f, 0x47, 0xc7, 0xed]));
        // The zero GID is not IPv4-mapped: FNV-1a 32 of 16 zero bytes is 0x69691905.
        assert_eq!(
            mac_for_gid(&Gid::ZERO),
            Mac([0x02, 0x01, 0x69, 0x69, 0x19, 0x05])
        );
    }

    #[test]
    fn multicast_mac_uses_low_23_bits() {
        assert_eq!(
            multicast_mac(Ipv4Addr::new(224, 0, 0, 1)),
            Mac([0x01, 0x00, 0x5e, 0x00, 0x00, 0x01])
        );
        // 239.255.255.250 and 224.127.255.250 share a MAC: the 24th bit is dropped.
        assert_eq!(
            multicast_mac(Ipv4Addr::new(239, 255, 255, 250)),
            Mac([0x01, 0x00, 0x5e, 0x7f, 0xff, 0xfa])
        );
        assert_eq!(
            multicast_mac(Ipv4Addr::new(224, 127, 255, 250)),
            multicast_mac(Ipv4Addr::new(239, 255, 255, 250))
        );
    }

    #[test]
    fn peer_macs_do_not_collide_across_a_small_fabric() {
        // 1024 link-local GIDs with distinct interface ids: no MAC is shared.
        let mut seen = HashMap::new();
        for i in 0u16..1024 {
            let mut g = [0u8; 16];
            g[0] = 0xfe;
            g[1] = 0x80;
            g[14..16].copy_from_slice(&i.to_be_bytes());
            assert_eq!(seen.insert(mac_for_gid(&Gid(g)), i), None, "GID #{i}");
        }
    }

    fn any_mac() -> impl Strategy<Value = Mac> {
        any::<[u8; 6]>().prop_map(Mac)
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..40)) {
            let _ = parse_frame(&b);
        }

        #[test]
        fn arbitrary_strings_never_panic(s in "\\PC{0,24}") {
            let _ = s.parse::<Mac>();
        }

        #[test]
        fn mac_string_round_trip(m in any_mac()) {
            prop_assert_eq!(m.to_string().parse::<Mac>(), Ok(m));
        }

        #[test]
        fn header_round_trip(dst in any_mac(), src in any_mac(), ethertype in any::<u16>(),
                             payload in proptest::collection::vec(any::<u8>(), 0..32)) {
            prop_assume!(ethertype != ETHERTYPE_VLAN && ethertype != ETHERTYPE_QINQ);
            let h = EthHeader { dst, src, ethertype };
            let mut buf = [0u8; HEADER_LEN + 32];
            emit_header(&mut buf, &h).unwrap();
            buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(&payload);
            let frame = &buf[..HEADER_LEN + payload.len()];
            prop_assert_eq!(parse_frame(frame), Ok((h, &payload[..])));
        }

        #[test]
        fn peer_macs_are_locally_administered_unicast(g in any::<[u8; 16]>()) {
            let m = mac_for_gid(&Gid(g));
            prop_assert_eq!(m.0[0], 0x02);
            prop_assert!(!m.is_multicast());
            prop_assert_eq!(m, mac_for_gid(&Gid(g)));
        }

        #[test]
        fn ipv4_peer_macs_are_injective(a in any::<u32>(), b in any::<u32>()) {
            let ma = mac_for_gid(&Gid::from_ipv4(Ipv4Addr::from(a)));
            let mb = mac_for_gid(&Gid::from_ipv4(Ipv4Addr::from(b)));
            prop_assert_eq!(ma == mb, a == b);
        }

        #[test]
        fn multicast_macs_are_multicast(ip in any::<u32>()) {
            let m = multicast_mac(Ipv4Addr::from(ip));
            prop_assert!(m.is_multicast() && !m.is_broadcast());
            prop_assert_eq!(&m.0[..3], &[0x01, 0x00, 0x5e]);
        }
    }
}
