//! The IPoIB encapsulation header and IPoIB hardware addresses (RFC 4391).
//!
//! Every IPoIB packet on a UD QP starts with a 4-byte header: the EtherType of the
//! payload, then 16 reserved bits that must be zero. Peers are named by 20-byte
//! hardware addresses: one byte of flags (reserved, carried unchanged), the 24-bit
//! QPN, and the 16-byte port GID. This module only converts bytes; it does not decide
//! which EtherTypes are carried.

use super::gid::Gid;
use super::{WireError, prefix, prefix_mut};

/// Length of the IPoIB encapsulation header.
pub const HEADER_LEN: usize = 4;
/// Length of an IPoIB hardware address.
pub const HWADDR_LEN: usize = 20;

/// The QPN a packet to a multicast group is sent to.
pub const MULTICAST_QPN: u32 = 0xFF_FFFF;

/// QPNs are 24 bits wide.
const QPN_MASK: u32 = 0x00FF_FFFF;

/// 20-byte IPoIB link-layer address: byte 0 flags (reserved, kept), bytes 1..4 the
/// 24-bit QPN big-endian, bytes 4..20 the GID.
///
/// `qpn` is only meaningful in its low 24 bits: [`IpoibAddr::new`] masks it and
/// [`IpoibAddr::to_bytes`] writes only those bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct IpoibAddr {
    /// The reserved flags byte (RFC 4391 § 9.1.1), kept as received.
    pub flags: u8,
    /// The 24-bit queue pair number.
    pub qpn: u32,
    /// The port GID.
    pub gid: Gid,
}

impl IpoibAddr {
    /// The all-zero address (what an ARP request carries as target hardware address).
    pub const ZERO: IpoibAddr = IpoibAddr {
        flags: 0,
        qpn: 0,
        gid: Gid::ZERO,
    };

    /// An address with flags 0; `qpn` is masked to 24 bits.
    pub fn new(qpn: u32, gid: Gid) -> Self {
        IpoibAddr {
            flags: 0,
            qpn: qpn & QPN_MASK,
            gid,
        }
    }

    /// Read an address from the first [`HWADDR_LEN`] bytes of `b` (more may follow).
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let a: &[u8; HWADDR_LEN] = prefix(b, "IPoIB hardware address")?;
        let mut gid = [0u8; 16];
        gid.copy_from_slice(&a[4..HWADDR_LEN]);
        Ok(IpoibAddr {
            flags: a[0],
            qpn: u32::from_be_bytes([0, a[1], a[2], a[3]]),
            gid: Gid(gid),
        })
    }

    /// The 20 bytes of this address as they appear on the wire.
    pub fn to_bytes(&self) -> [u8; HWADDR_LEN] {
        let mut out = [0u8; HWADDR_LEN];
        out[0] = self.flags;
        let q = (self.qpn & QPN_MASK).to_be_bytes();
        out[1..4].copy_from_slice(&q[1..4]);
        out[4..HWADDR_LEN].copy_from_slice(&self.gid.0);
        out
    }

    /// True when the QPN is 0 and the GID is zero (the flags byte is not looked at).
    pub fn is_zero(&self) -> bool {
        self.qpn & QPN_MASK == 0 && self.gid.is_zero()
    }
}

/// Write the 4-byte header (EtherType BE, then 16 zero bits) at `out[0..4]`.
pub fn emit_header(out: &mut [u8], ethertype: u16) -> Result<(), WireError> {
    let h: &mut [u8; HEADER_LEN] = prefix_mut(out, "IPoIB header")?;
    let [t0, t1] = ethertype.to_be_bytes();
    *h = [t0, t1, 0, 0];
    Ok(())
}

/// Parse the 4-byte header; reserved bits must be zero ([`WireError::ReservedNotZero`]).
/// Returns (ethertype, payload after the header).
pub fn parse_header(b: &[u8]) -> Result<(u16, &[u8]), WireError> {
    let h: &[u8; HEADER_LEN] = prefix(b, "IPoIB header")?;
    let reserved = u16::from_be_bytes([h[2], h[3]]);
    if reserved != 0 {
        return Err(WireError::ReservedNotZero(reserved));
    }
    Ok((u16::from_be_bytes([h[0], h[1]]), &b[HEADER_LEN..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4};
    use proptest::prelude::*;
    use std::net::Ipv4Addr;

    /// RFC 4391 layout, written by hand: flags, QPN 0x000011, GID ::ffff:198.18.0.1.
    const ADDR_BYTES: [u8; 20] = [
        0x00, 0x00, 0x00, 0x11, // flags, QPN
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1, // GID
    ];

    #[test]
    fn addr_known_answer() {
        let a = IpoibAddr::parse(&ADDR_BYTES).unwrap();
        assert_eq!(
            a,
            IpoibAddr::new(0x11, Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1)))
        );
        assert_eq!(a.to_bytes(), ADDR_BYTES);
    }

    #[test]
    fn addr_keeps_flags_and_full_24_bit_qpn() {
        let mut b = ADDR_BYTES;
        b[0] = 0x80;
        b[1..4].copy_from_slice(&[0xAB, 0xCD, 0xEF]);
        let a = IpoibAddr::parse(&b).unwrap();
        assert_eq!(a.flags, 0x80);
        assert_eq!(a.qpn, 0xAB_CDEF);
        assert_eq!(a.to_bytes(), b);
    }

    #[test]
    fn addr_reads_only_first_20_bytes() {
        let mut b = [0xEEu8; 25];
        b[..20].copy_from_slice(&ADDR_BYTES);
        assert_eq!(
            IpoibAddr::parse(&b).unwrap(),
            IpoibAddr::parse(&ADDR_BYTES).unwrap()
        );
    }

    #[test]
    fn addr_every_short_length_is_truncated() {
        for len in 0..HWADDR_LEN {
            assert_eq!(
                IpoibAddr::parse(&ADDR_BYTES[..len]),
                Err(WireError::Truncated {
                    what: "IPoIB hardware address",
                    need: HWADDR_LEN,
                    got: len
                }),
                "length {len}"
            );
        }
    }

    #[test]
    fn new_masks_qpn_and_to_bytes_ignores_high_bits() {
        let g = Gid::from_ipv4(Ipv4Addr::new(10, 0, 0, 1));
        assert_eq!(IpoibAddr::new(0xFF12_3456, g).qpn, 0x12_3456);
        let raw = IpoibAddr {
            flags: 0,
            qpn: 0xFF12_3456,
            gid: g,
        };
        assert_eq!(raw.to_bytes()[1..4], [0x12, 0x34, 0x56]);
    }

    #[test]
    fn is_zero() {
        assert!(IpoibAddr::ZERO.is_zero());
        assert!(IpoibAddr::default().is_zero());
        assert_eq!(IpoibAddr::ZERO, IpoibAddr::default());
        assert!(!IpoibAddr::new(1, Gid::ZERO).is_zero());
        assert!(!IpoibAddr::new(0, Gid::from_ipv4(Ipv4Addr::new(0, 0, 0, 1))).is_zero());
        let flagged = IpoibAddr {
            flags: 0x80,
            ..IpoibAddr::ZERO
        };
        assert!(flagged.is_zero());
    }

    #[test]
    fn header_known_answer() {
        let mut out = [0xFFu8; 6];
        emit_header(&mut out, ETHERTYPE_ARP).unwrap();
        assert_eq!(out, [0x08, 0x06, 0x00, 0x00, 0xFF, 0xFF]);
        let (t, payload) = parse_header(&out).unwrap();
        assert_eq!(t, ETHERTYPE_ARP);
        assert_eq!(payload, &[0xFF, 0xFF]);
    }

    #[test]
    fn header_with_empty_payload() {
        assert_eq!(
            parse_header(&[0x08, 0x00, 0, 0]),
            Ok((ETHERTYPE_IPV4, &[][..]))
        );
    }

    #[test]
    fn header_reserved_bits_must_be_zero() {
        assert_eq!(
            parse_header(&[0x08, 0x00, 0x00, 0x01]),
            Err(WireError::ReservedNotZero(0x0001))
        );
        assert_eq!(
            parse_header(&[0x08, 0x00, 0x80, 0x00, 0x45]),
            Err(WireError::ReservedNotZero(0x8000))
        );
    }

    #[test]
    fn header_every_short_length_is_truncated() {
        let b = [0x08, 0x00, 0, 0];
        for len in 0..HEADER_LEN {
            assert_eq!(
                parse_header(&b[..len]),
                Err(WireError::Truncated {
                    what: "IPoIB header",
                    need: HEADER_LEN,
                    got: len
                })
            );
        }
    }

    #[test]
    fn emit_header_into_short_buffer_fails_without_writing() {
        let mut out = [0xAAu8; 3];
        assert_eq!(
            emit_header(&mut out, ETHERTYPE_IPV4),
            Err(WireError::Truncated {
                what: "IPoIB header",
                need: 4,
                got: 3
            })
        );
        assert_eq!(out, [0xAA; 3]);
    }

    fn any_addr() -> impl Strategy<Value = IpoibAddr> {
        (any::<u8>(), 0..=QPN_MASK, any::<[u8; 16]>()).prop_map(|(flags, qpn, g)| IpoibAddr {
            flags,
            qpn,
            gid: Gid(g),
        })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            let _ = IpoibAddr::parse(&b);
            let _ = parse_header(&b);
        }

        #[test]
        fn addr_round_trip(a in any_addr()) {
            prop_assert_eq!(IpoibAddr::parse(&a.to_bytes()), Ok(a));
        }

        #[test]
        fn addr_bytes_round_trip(b in any::<[u8; 20]>()) {
            prop_assert_eq!(IpoibAddr::parse(&b).map(|a| a.to_bytes()), Ok(b));
        }

        #[test]
        fn header_round_trip(t in any::<u16>(), payload in proptest::collection::vec(any::<u8>(), 0..32)) {
            let mut buf = [0u8; 36];
            emit_header(&mut buf, t).unwrap();
            buf[HEADER_LEN..HEADER_LEN + payload.len()].copy_from_slice(&payload);
            let frame = &buf[..HEADER_LEN + payload.len()];
            prop_assert_eq!(parse_header(frame), Ok((t, &payload[..])));
        }
    }
}
