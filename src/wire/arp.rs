//! ARP for IPv4 in its two shapes: as the TAP speaks it (Ethernet, hardware type 1,
//! 6-byte addresses, RFC 826) and as IPoIB carries it (hardware type 32, 20-byte IPoIB
//! addresses, RFC 4391 § 9.1), and the translation between them.
//!
//! Translation only swaps hardware addresses: which MAC stands for which IPoIB address
//! is the neighbour table's business, so the caller passes both in. Parsers accept
//! trailing bytes (Ethernet pads short frames to 60 bytes).

use std::net::Ipv4Addr;

use super::eth::Mac;
use super::ipoib::{HWADDR_LEN, IpoibAddr};
use super::{ETHERTYPE_IPV4, WireError, prefix, prefix_mut};

/// ARP operation: request.
pub const OP_REQUEST: u16 = 1;
/// ARP operation: reply.
pub const OP_REPLY: u16 = 2;
/// Length of an Ethernet/IPv4 ARP message (htype 1, ptype 0x0800, hlen 6, plen 4).
pub const ETH_ARP_LEN: usize = 28;
/// Length of an IPoIB/IPv4 ARP message (htype 32 (`ARPHRD_INFINIBAND`), ptype 0x0800,
/// hlen 20, plen 4).
pub const IPOIB_ARP_LEN: usize = 56;

/// ARP hardware type of Ethernet.
pub const HTYPE_ETHERNET: u16 = 1;
/// ARP hardware type of InfiniBand (`ARPHRD_INFINIBAND`).
pub const HTYPE_INFINIBAND: u16 = 32;

/// `hlen` of an IPoIB ARP message.
const IPOIB_HLEN: u8 = 20;
const _: () = assert!(IPOIB_HLEN as usize == HWADDR_LEN);

/// Length of the fixed part shared by every ARP message (htype, ptype, hlen, plen, op).
const FIXED_LEN: usize = 8;

/// Check the fixed part of an ARP message and return its operation. Looks at the fixed
/// fields as soon as they are present, so a message of the other hardware type is
/// reported as such rather than as truncated.
fn parse_fixed(
    b: &[u8],
    what: &'static str,
    full_len: usize,
    htype: (u16, &'static str),
    hlen: (u8, &'static str),
) -> Result<u16, WireError> {
    let truncated = || WireError::Truncated {
        what,
        need: full_len,
        got: b.len(),
    };
    let f: &[u8; FIXED_LEN] = prefix(b, what).map_err(|_| truncated())?;
    if u16::from_be_bytes([f[0], f[1]]) != htype.0 {
        return Err(WireError::BadArp(htype.1));
    }
    if u16::from_be_bytes([f[2], f[3]]) != ETHERTYPE_IPV4 {
        return Err(WireError::BadArp("protocol type is not IPv4 (0x0800)"));
    }
    if f[4] != hlen.0 {
        return Err(WireError::BadArp(hlen.1));
    }
    if f[5] != 4 {
        return Err(WireError::BadArp("protocol address length is not 4"));
    }
    let op = u16::from_be_bytes([f[6], f[7]]);
    if op != OP_REQUEST && op != OP_REPLY {
        return Err(WireError::BadArp(
            "operation is neither request (1) nor reply (2)",
        ));
    }
    if b.len() < full_len {
        return Err(truncated());
    }
    Ok(op)
}

/// Write the fixed part of an ARP message.
fn emit_fixed(f: &mut [u8], htype: u16, hlen: u8, op: u16) {
    f[0..2].copy_from_slice(&htype.to_be_bytes());
    f[2..4].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    f[4] = hlen;
    f[5] = 4;
    f[6..8].copy_from_slice(&op.to_be_bytes());
}

fn ipv4_at(b: &[u8], at: usize) -> Ipv4Addr {
    Ipv4Addr::new(b[at], b[at + 1], b[at + 2], b[at + 3])
}

fn mac_at(b: &[u8], at: usize) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[at..at + 6]);
    Mac(m)
}

/// An Ethernet/IPv4 ARP message, as the TAP sends and receives it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EthArp {
    /// Operation ([`OP_REQUEST`] or [`OP_REPLY`]).
    pub op: u16,
    /// Sender hardware address.
    pub sha: Mac,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub tha: Mac,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

impl EthArp {
    /// Parse the first [`ETH_ARP_LEN`] bytes of `b`; trailing bytes are ignored.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let op = parse_fixed(
            b,
            "Ethernet ARP message",
            ETH_ARP_LEN,
            (HTYPE_ETHERNET, "hardware type is not 1 (Ethernet)"),
            (6, "hardware address length is not 6"),
        )?;
        let m: &[u8; ETH_ARP_LEN] = prefix(b, "Ethernet ARP message")?;
        Ok(EthArp {
            op,
            sha: mac_at(m, 8),
            spa: ipv4_at(m, 14),
            tha: mac_at(m, 18),
            tpa: ipv4_at(m, 24),
        })
    }

    /// Write the message at `out[0..28]` and return [`ETH_ARP_LEN`]. `op` is written as
    /// it is, even if it is neither request nor reply.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let m: &mut [u8; ETH_ARP_LEN] = prefix_mut(out, "Ethernet ARP message")?;
        emit_fixed(m, HTYPE_ETHERNET, 6, self.op);
        m[8..14].copy_from_slice(&self.sha.0);
        m[14..18].copy_from_slice(&self.spa.octets());
        m[18..24].copy_from_slice(&self.tha.0);
        m[24..28].copy_from_slice(&self.tpa.octets());
        Ok(ETH_ARP_LEN)
    }

    /// The same message in IPoIB form, with `sha` and `tha` standing for this
    /// message's sender and target hardware addresses.
    pub fn to_ipoib(&self, sha: IpoibAddr, tha: IpoibAddr) -> IpoibArp {
        IpoibArp {
            op: self.op,
            sha,
            spa: self.spa,
            tha,
            tpa: self.tpa,
        }
    }
}

/// An IPoIB/IPv4 ARP message, as peers on the fabric send and receive it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IpoibArp {
    /// Operation ([`OP_REQUEST`] or [`OP_REPLY`]).
    pub op: u16,
    /// Sender hardware address.
    pub sha: IpoibAddr,
    /// Sender protocol address.
    pub spa: Ipv4Addr,
    /// Target hardware address (zero in a request).
    pub tha: IpoibAddr,
    /// Target protocol address.
    pub tpa: Ipv4Addr,
}

impl IpoibArp {
    /// Parse the first [`IPOIB_ARP_LEN`] bytes of `b`; trailing bytes are ignored.
    pub fn parse(b: &[u8]) -> Result<Self, WireError> {
        let op = parse_fixed(
            b,
            "IPoIB ARP message",
            IPOIB_ARP_LEN,
            (HTYPE_INFINIBAND, "hardware type is not 32 (InfiniBand)"),
            (IPOIB_HLEN, "hardware address length is not 20"),
        )?;
        let m: &[u8; IPOIB_ARP_LEN] = prefix(b, "IPoIB ARP message")?;
        const SHA: usize = FIXED_LEN;
        const SPA: usize = SHA + HWADDR_LEN;
        const THA: usize = SPA + 4;
        const TPA: usize = THA + HWADDR_LEN;
        Ok(IpoibArp {
            op,
            sha: IpoibAddr::parse(&m[SHA..SPA])?,
            spa: ipv4_at(m, SPA),
            tha: IpoibAddr::parse(&m[THA..TPA])?,
            tpa: ipv4_at(m, TPA),
        })
    }

    /// Write the message at `out[0..56]` and return [`IPOIB_ARP_LEN`]. `op` is written
    /// as it is, even if it is neither request nor reply; QPNs are written in 24 bits.
    pub fn emit(&self, out: &mut [u8]) -> Result<usize, WireError> {
        let m: &mut [u8; IPOIB_ARP_LEN] = prefix_mut(out, "IPoIB ARP message")?;
        emit_fixed(m, HTYPE_INFINIBAND, IPOIB_HLEN, self.op);
        m[8..28].copy_from_slice(&self.sha.to_bytes());
        m[28..32].copy_from_slice(&self.spa.octets());
        m[32..52].copy_from_slice(&self.tha.to_bytes());
        m[52..56].copy_from_slice(&self.tpa.octets());
        Ok(IPOIB_ARP_LEN)
    }

    /// The same message in Ethernet form, with `sha` and `tha` standing for this
    /// message's sender and target hardware addresses.
    pub fn to_eth(&self, sha: Mac, tha: Mac) -> EthArp {
        EthArp {
            op: self.op,
            sha,
            spa: self.spa,
            tha,
            tpa: self.tpa,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::gid::Gid;
    use proptest::prelude::*;

    /// Who has 198.18.0.2? Tell 198.18.0.1 (02:00:c6:12:00:01). RFC 826 layout, by hand.
    const ETH_REQUEST: [u8; 28] = [
        0x00, 0x01, // htype Ethernet
        0x08, 0x00, // ptype IPv4
        6, 4, // hlen, plen
        0x00, 0x01, // request
        0x02, 0x00, 0xc6, 0x12, 0x00, 0x01, // sha
        198, 18, 0, 1, // spa
        0, 0, 0, 0, 0, 0, // tha
        198, 18, 0, 2, // tpa
    ];

    /// The same request from QPN 0x000011, GID ::ffff:198.18.0.1, laid out as RFC 4391
    /// § 9.1.1 gives the hardware address: flags byte, 3 QPN bytes, 16 GID bytes.
    const IPOIB_REQUEST: [u8; 56] = [
        0x00, 0x20, // htype 32 (InfiniBand)
        0x08, 0x00, // ptype IPv4
        20, 4, // hlen, plen
        0x00, 0x01, // request
        0x00, // sha flags
        0x00, 0x00, 0x11, // sha QPN
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 198, 18, 0, 1, // sha GID
        198, 18, 0, 1, // spa
        0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, // tha
        198, 18, 0, 2, // tpa
    ];

    fn eth_request() -> EthArp {
        EthArp {
            op: OP_REQUEST,
            sha: Mac([0x02, 0x00, 0xc6, 0x12, 0x00, 0x01]),
            spa: Ipv4Addr::new(198, 18, 0, 1),
            tha: Mac::ZERO,
            tpa: Ipv4Addr::new(198, 18, 0, 2),
        }
    }

    fn ipoib_request() -> IpoibArp {
        IpoibArp {
            op: OP_REQUEST,
            sha: IpoibAddr::new(0x11, Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 1))),
            spa: Ipv4Addr::new(198, 18, 0, 1),
            tha: IpoibAddr::ZERO,
            tpa: Ipv4Addr::new(198, 18, 0, 2),
        }
    }

    #[test]
    fn eth_known_answer() {
        assert_eq!(EthArp::parse(&ETH_REQUEST), Ok(eth_request()));
        let mut out = [0xEEu8; 30];
        assert_eq!(eth_request().emit(&mut out), Ok(ETH_ARP_LEN));
        assert_eq!(out[..28], ETH_REQUEST);
        assert_eq!(out[28..], [0xEE, 0xEE], "bytes past the message untouched");
    }

    #[test]
    fn ipoib_known_answer() {
        assert_eq!(IpoibArp::parse(&IPOIB_REQUEST), Ok(ipoib_request()));
        let mut out = [0xEEu8; 58];
        assert_eq!(ipoib_request().emit(&mut out), Ok(IPOIB_ARP_LEN));
        assert_eq!(out[..56], IPOIB_REQUEST);
        assert_eq!(out[56..], [0xEE, 0xEE], "bytes past the message untouched");
    }

    #[test]
    fn trailing_padding_is_allowed() {
        let mut padded = [0u8; 46];
        padded[..28].copy_from_slice(&ETH_REQUEST);
        assert_eq!(EthArp::parse(&padded), Ok(eth_request()));
        let mut padded = [0xAAu8; 64];
        padded[..56].copy_from_slice(&IPOIB_REQUEST);
        assert_eq!(IpoibArp::parse(&padded), Ok(ipoib_request()));
    }

    #[test]
    fn replies_parse() {
        let mut b = ETH_REQUEST;
        b[7] = 2;
        assert_eq!(EthArp::parse(&b).map(|a| a.op), Ok(OP_REPLY));
        let mut b = IPOIB_REQUEST;
        b[7] = 2;
        assert_eq!(IpoibArp::parse(&b).map(|a| a.op), Ok(OP_REPLY));
    }

    #[test]
    fn every_short_length_is_truncated() {
        for len in 0..ETH_ARP_LEN {
            assert_eq!(
                EthArp::parse(&ETH_REQUEST[..len]),
                Err(WireError::Truncated {
                    what: "Ethernet ARP message",
                    need: ETH_ARP_LEN,
                    got: len
                }),
                "length {len}"
            );
        }
        for len in 0..IPOIB_ARP_LEN {
            assert_eq!(
                IpoibArp::parse(&IPOIB_REQUEST[..len]),
                Err(WireError::Truncated {
                    what: "IPoIB ARP message",
                    need: IPOIB_ARP_LEN,
                    got: len
                }),
                "length {len}"
            );
        }
    }

    /// Set `bytes[at..at + v.len()] = v` in copies of both known messages and check the
    /// error each parser gives.
    fn patched(at: usize, v: &[u8]) -> (Result<EthArp, WireError>, Result<IpoibArp, WireError>) {
        let mut e = ETH_REQUEST;
        e[at..at + v.len()].copy_from_slice(v);
        let mut i = IPOIB_REQUEST;
        i[at..at + v.len()].copy_from_slice(v);
        (EthArp::parse(&e), IpoibArp::parse(&i))
    }

    #[test]
    fn wrong_hardware_type() {
        for h in [0u16, 6, 0x0100, 0xFFFF] {
            let (e, i) = patched(0, &h.to_be_bytes());
            assert_eq!(
                e,
                Err(WireError::BadArp("hardware type is not 1 (Ethernet)"))
            );
            assert_eq!(
                i,
                Err(WireError::BadArp("hardware type is not 32 (InfiniBand)"))
            );
        }
        // Each parser names the other's message by its hardware type, not as truncated.
        assert_eq!(
            IpoibArp::parse(&ETH_REQUEST),
            Err(WireError::BadArp("hardware type is not 32 (InfiniBand)"))
        );
        assert_eq!(
            EthArp::parse(&IPOIB_REQUEST),
            Err(WireError::BadArp("hardware type is not 1 (Ethernet)"))
        );
    }

    #[test]
    fn wrong_protocol_type() {
        for p in [0u16, 0x86DD, 0x0806, 0x0008] {
            let (e, i) = patched(2, &p.to_be_bytes());
            let want = WireError::BadArp("protocol type is not IPv4 (0x0800)");
            assert_eq!(e, Err(want));
            assert_eq!(i, Err(want));
        }
    }

    #[test]
    fn wrong_hardware_length() {
        for l in [0u8, 4, 16, 255] {
            let (e, i) = patched(4, &[l]);
            assert_eq!(
                e,
                Err(WireError::BadArp("hardware address length is not 6"))
            );
            assert_eq!(
                i,
                Err(WireError::BadArp("hardware address length is not 20"))
            );
        }
        let (e, _) = patched(4, &[20]);
        assert_eq!(
            e,
            Err(WireError::BadArp("hardware address length is not 6"))
        );
        let (_, i) = patched(4, &[6]);
        assert_eq!(
            i,
            Err(WireError::BadArp("hardware address length is not 20"))
        );
    }

    #[test]
    fn wrong_protocol_length() {
        for l in [0u8, 6, 16, 255] {
            let (e, i) = patched(5, &[l]);
            let want = WireError::BadArp("protocol address length is not 4");
            assert_eq!(e, Err(want));
            assert_eq!(i, Err(want));
        }
    }

    #[test]
    fn wrong_operation() {
        // 3/4 are RARP, 8/9 InARP: none is ARP request or reply.
        for op in [0u16, 3, 4, 8, 9, 0x0100, 0xFFFF] {
            let (e, i) = patched(6, &op.to_be_bytes());
            let want = WireError::BadArp("operation is neither request (1) nor reply (2)");
            assert_eq!(e, Err(want), "op {op}");
            assert_eq!(i, Err(want), "op {op}");
        }
    }

    #[test]
    fn emit_into_short_buffer_fails() {
        for len in [0, 27] {
            let mut out = [0u8; 27];
            assert_eq!(
                eth_request().emit(&mut out[..len]),
                Err(WireError::Truncated {
                    what: "Ethernet ARP message",
                    need: ETH_ARP_LEN,
                    got: len
                })
            );
        }
        let mut out = [0u8; 55];
        assert_eq!(
            ipoib_request().emit(&mut out),
            Err(WireError::Truncated {
                what: "IPoIB ARP message",
                need: IPOIB_ARP_LEN,
                got: 55
            })
        );
    }

    #[test]
    fn translation_swaps_only_hardware_addresses() {
        let ib = eth_request().to_ipoib(ipoib_request().sha, IpoibAddr::ZERO);
        assert_eq!(ib, ipoib_request());
        let back = ib.to_eth(eth_request().sha, Mac::ZERO);
        assert_eq!(back, eth_request());
    }

    fn any_ip() -> impl Strategy<Value = Ipv4Addr> {
        any::<u32>().prop_map(Ipv4Addr::from)
    }

    fn any_op() -> impl Strategy<Value = u16> {
        prop_oneof![Just(OP_REQUEST), Just(OP_REPLY)]
    }

    fn any_ipoib_addr() -> impl Strategy<Value = IpoibAddr> {
        (any::<u8>(), 0u32..=0xFF_FFFF, any::<[u8; 16]>()).prop_map(|(flags, qpn, g)| IpoibAddr {
            flags,
            qpn,
            gid: Gid(g),
        })
    }

    fn any_eth_arp() -> impl Strategy<Value = EthArp> {
        (
            any_op(),
            any::<[u8; 6]>(),
            any_ip(),
            any::<[u8; 6]>(),
            any_ip(),
        )
            .prop_map(|(op, sha, spa, tha, tpa)| EthArp {
                op,
                sha: Mac(sha),
                spa,
                tha: Mac(tha),
                tpa,
            })
    }

    fn any_ipoib_arp() -> impl Strategy<Value = IpoibArp> {
        (
            any_op(),
            any_ipoib_addr(),
            any_ip(),
            any_ipoib_addr(),
            any_ip(),
        )
            .prop_map(|(op, sha, spa, tha, tpa)| IpoibArp {
                op,
                sha,
                spa,
                tha,
                tpa,
            })
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = EthArp::parse(&b);
            let _ = IpoibArp::parse(&b);
        }

        #[test]
        fn valid_header_arbitrary_body_never_panics(
            body in proptest::collection::vec(any::<u8>(), 0..64)
        ) {
            let mut e = ETH_REQUEST[..8].to_vec();
            e.extend_from_slice(&body);
            let _ = EthArp::parse(&e);
            let mut i = IPOIB_REQUEST[..8].to_vec();
            i.extend_from_slice(&body);
            let _ = IpoibArp::parse(&i);
        }

        #[test]
        fn eth_round_trip(a in any_eth_arp()) {
            let mut out = [0u8; ETH_ARP_LEN];
            prop_assert_eq!(a.emit(&mut out), Ok(ETH_ARP_LEN));
            prop_assert_eq!(EthArp::parse(&out), Ok(a));
        }

        #[test]
        fn ipoib_round_trip(a in any_ipoib_arp()) {
            let mut out = [0u8; IPOIB_ARP_LEN];
            prop_assert_eq!(a.emit(&mut out), Ok(IPOIB_ARP_LEN));
            prop_assert_eq!(IpoibArp::parse(&out), Ok(a));
        }

        #[test]
        fn accepted_bytes_re_emit_identically(b in any::<[u8; IPOIB_ARP_LEN]>()) {
            // Force a valid fixed part so the body is exercised.
            let mut b = b;
            b[..6].copy_from_slice(&IPOIB_REQUEST[..6]);
            b[6] = 0;
            b[7] = 1 + (b[7] & 1);
            let a = IpoibArp::parse(&b);
            prop_assert!(a.is_ok());
            let mut out = [0u8; IPOIB_ARP_LEN];
            prop_assert_eq!(a.and_then(|a| a.emit(&mut out)), Ok(IPOIB_ARP_LEN));
            prop_assert_eq!(out, b);
        }
    }
}
