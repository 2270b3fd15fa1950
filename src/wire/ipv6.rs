//! The IPv6 header fields the datapath needs (addresses, lengths, the upper-layer
//! protocol behind any extension headers), the ICMPv6 checksum, and interface addresses
//! with a prefix.
//!
//! As with IPv4, the datapath looks into IPv6 to pick a next hop and to check that a
//! packet is whole; the one exception is neighbour discovery, whose link-layer address
//! options it rewrites ([`super::ndisc`]).

use std::net::Ipv6Addr;

use super::ipv4::{fold, ones_sum};
use super::{WireError, prefix};

/// Length of the fixed IPv6 header.
pub const HEADER_LEN: usize = 40;

/// Next-header value of ICMPv6.
pub const PROTO_ICMPV6: u8 = 58;
/// Next-header value of TCP.
pub const PROTO_TCP: u8 = 6;
/// Next-header value of UDP.
pub const PROTO_UDP: u8 = 17;

const HOP_BY_HOP: u8 = 0;
const ROUTING: u8 = 43;
const FRAGMENT: u8 = 44;
const DEST_OPTS: u8 = 60;

/// Extension headers walked before giving up on finding the upper layer.
const MAX_EXT_HEADERS: usize = 8;

/// What the datapath reads from an IPv6 packet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv6Summary {
    /// Source address.
    pub src: Ipv6Addr,
    /// Destination address.
    pub dst: Ipv6Addr,
    /// The fixed header's next header.
    pub next_header: u8,
    /// Hop limit.
    pub hop_limit: u8,
    /// Header and payload, from the payload length (40 + payload length).
    pub total_len: usize,
    /// The upper-layer protocol and where it starts, behind any hop-by-hop, routing and
    /// destination-options headers; `None` behind a fragment header (only the first
    /// fragment holds it, and neighbour discovery is never fragmented, RFC 6980). More
    /// than 8 extension headers are refused.
    pub upper: Option<(u8, usize)>,
}

/// Checks version 6 and `40 + payload length <= b.len()`, and walks the extension
/// headers; errors are [`WireError::BadIpv6`] / [`WireError::Truncated`] naming the
/// problem. Bytes after the packet (Ethernet padding) are allowed. A jumbogram (payload
/// length 0, RFC 2675) is refused: no link here carries one.
pub fn parse_summary(b: &[u8]) -> Result<Ipv6Summary, WireError> {
    let h: &[u8; HEADER_LEN] = prefix(b, "IPv6 header")?;
    if h[0] >> 4 != 6 {
        return Err(WireError::BadIpv6("version is not 6"));
    }
    let payload_len = usize::from(u16::from_be_bytes([h[4], h[5]]));
    let total_len = HEADER_LEN + payload_len;
    if total_len > b.len() {
        return Err(WireError::Truncated {
            what: "IPv6 packet (payload length)",
            need: total_len,
            got: b.len(),
        });
    }
    let mut src = [0u8; 16];
    src.copy_from_slice(&h[8..24]);
    let mut dst = [0u8; 16];
    dst.copy_from_slice(&h[24..40]);
    let next_header = h[6];
    let upper = walk(&b[..total_len], next_header)?;
    Ok(Ipv6Summary {
        src: Ipv6Addr::from(src),
        dst: Ipv6Addr::from(dst),
        next_header,
        hop_limit: h[7],
        total_len,
        upper,
    })
}

/// Follow the extension headers of `packet` from `next`, to the upper layer.
fn walk(packet: &[u8], mut next: u8) -> Result<Option<(u8, usize)>, WireError> {
    let mut at = HEADER_LEN;
    for _ in 0..=MAX_EXT_HEADERS {
        match next {
            HOP_BY_HOP | ROUTING | DEST_OPTS => {
                let Some(&[nh, len]) = packet.get(at..at + 2).and_then(|s| s.first_chunk::<2>())
                else {
                    return Err(WireError::BadIpv6("extension header truncated"));
                };
                let ext = (usize::from(len) + 1) * 8;
                if at + ext > packet.len() {
                    return Err(WireError::BadIpv6(
                        "extension header longer than the packet",
                    ));
                }
                next = nh;
                at += ext;
            }
            FRAGMENT => return Ok(None),
            proto => return Ok(Some((proto, at))),
        }
    }
    // Refused rather than passed on unread: what follows could be a neighbour discovery
    // message that would then skip its checks and its translation.
    Err(WireError::BadIpv6(
        "more extension headers than the datapath walks",
    ))
}

/// The checksum of an upper-layer message (ICMPv6, TCP, UDP) over IPv6: the Internet
/// checksum of the pseudo-header (RFC 8200 §8.1) followed by `message`. Computed with the
/// checksum field zero it is the value to store; over a correct message it is 0.
pub fn upper_checksum(src: &Ipv6Addr, dst: &Ipv6Addr, proto: u8, message: &[u8]) -> u16 {
    let mut s = ones_sum(&src.octets(), 0);
    s = ones_sum(&dst.octets(), s);
    let len = message.len() as u64;
    s += (len >> 16) + (len & 0xffff) + u64::from(proto);
    !fold(ones_sum(message, s))
}

/// Set the payload length of the IPv6 header at the start of `packet`.
pub fn set_payload_len(packet: &mut [u8], payload_len: u16) {
    if let Some(h) = packet.get_mut(4..6) {
        h.copy_from_slice(&payload_len.to_be_bytes());
    }
}

/// Whether `ip` is link-local unicast (fe80::/10).
pub fn is_link_local(ip: &Ipv6Addr) -> bool {
    ip.segments()[0] & 0xffc0 == 0xfe80
}

/// The Ethernet multicast MAC of an IPv6 multicast address (RFC 2464 §7: 33:33 and the
/// address's last 32 bits).
pub fn multicast_mac_octets(ip: &Ipv6Addr) -> [u8; 6] {
    let o = ip.octets();
    [0x33, 0x33, o[12], o[13], o[14], o[15]]
}

/// The solicited-node multicast address of `ip` (RFC 4291 §2.7.1).
pub fn solicited_node(ip: &Ipv6Addr) -> Ipv6Addr {
    let o = ip.octets();
    Ipv6Addr::from([
        0xff, 0x02, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1, 0xff, o[13], o[14], o[15],
    ])
}

/// The link-local address the kernel gives an Ethernet interface with `mac` (modified
/// EUI-64, RFC 4291 appendix A).
pub fn link_local_for_mac(mac: [u8; 6]) -> Ipv6Addr {
    Ipv6Addr::from([
        0xfe,
        0x80,
        0,
        0,
        0,
        0,
        0,
        0,
        mac[0] ^ 0x02,
        mac[1],
        mac[2],
        0xff,
        0xfe,
        mac[3],
        mac[4],
        mac[5],
    ])
}

/// An IPv6 address with a prefix length (`2001:2:0:1::1/64`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Ipv6Cidr {
    /// The address.
    pub addr: Ipv6Addr,
    /// The prefix length, 0..=128.
    pub prefix: u8,
}

impl Ipv6Cidr {
    /// True if `ip` is in this prefix.
    pub fn contains(&self, ip: &Ipv6Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u128::MAX << (128 - u32::from(self.prefix))
        };
        u128::from(*ip) & mask == u128::from(self.addr) & mask
    }
}

impl std::fmt::Display for Ipv6Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Ipv6Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not ADDRESS/PREFIX (e.g. 2001:2:0:1::1/64)"))?;
        let addr: Ipv6Addr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IPv6 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|&p| p <= 128)
            .ok_or_else(|| format!("prefix {p:?} is not a number from 0 to 128"))?;
        if addr.is_unspecified() || addr.is_multicast() || addr.is_loopback() {
            return Err(format!("{addr} cannot be an interface address"));
        }
        if addr.to_ipv4_mapped().is_some() {
            return Err(format!(
                "{addr} is an IPv4-mapped address; give the IPv4 address instead"
            ));
        }
        Ok(Ipv6Cidr { addr, prefix })
    }
}

/// Packets built for the unit tests of this module's users.
#[cfg(test)]
pub(crate) mod test_packets {
    use super::*;

    /// An IPv6 packet from `src` to `dst` (hop limit `hop`) carrying the ICMPv6 message
    /// `msg`, its checksum filled in.
    pub(crate) fn icmp6(src: Ipv6Addr, dst: Ipv6Addr, hop: u8, msg: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&(msg.len() as u16).to_be_bytes());
        p[6] = PROTO_ICMPV6;
        p[7] = hop;
        p[8..24].copy_from_slice(&src.octets());
        p[24..40].copy_from_slice(&dst.octets());
        p.extend_from_slice(msg);
        let c = upper_checksum(&src, &dst, PROTO_ICMPV6, &p[HEADER_LEN..]);
        p[42..44].copy_from_slice(&c.to_be_bytes());
        p
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn packet(next: u8, payload: &[u8]) -> Vec<u8> {
        let mut p = vec![0u8; HEADER_LEN];
        p[0] = 0x60;
        p[4..6].copy_from_slice(&u16::try_from(payload.len()).unwrap().to_be_bytes());
        p[6] = next;
        p[7] = 255;
        p[8..24].copy_from_slice(&"fe80::1".parse::<Ipv6Addr>().unwrap().octets());
        p[24..40].copy_from_slice(&"ff02::1".parse::<Ipv6Addr>().unwrap().octets());
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn parses_fixed_header_and_upper_layer() {
        let p = packet(PROTO_ICMPV6, &[128, 0, 0, 0, 0, 1, 0, 1]);
        let s = parse_summary(&p).unwrap();
        assert_eq!(s.src, "fe80::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(s.dst, "ff02::1".parse::<Ipv6Addr>().unwrap());
        assert_eq!(s.total_len, 48);
        assert_eq!(s.hop_limit, 255);
        assert_eq!(s.upper, Some((PROTO_ICMPV6, 40)));
    }

    #[test]
    fn walks_hop_by_hop_to_icmpv6() {
        // An MLD report's hop-by-hop header with the router alert option.
        let mut payload = vec![PROTO_ICMPV6, 0, 5, 2, 0, 0, 1, 0];
        payload.extend_from_slice(&[143, 0, 0, 0, 0, 0, 0, 0]);
        let s = parse_summary(&packet(HOP_BY_HOP, &payload)).unwrap();
        assert_eq!(s.upper, Some((PROTO_ICMPV6, 48)));
    }

    #[test]
    fn fragment_header_hides_the_upper_layer() {
        let payload = [PROTO_ICMPV6, 0, 0, 1, 0, 0, 0, 1, 135, 0, 0, 0];
        let s = parse_summary(&packet(FRAGMENT, &payload)).unwrap();
        assert_eq!(s.upper, None);
    }

    #[test]
    fn refuses_what_does_not_hold_together() {
        let mut p = packet(PROTO_UDP, &[0; 8]);
        p[0] = 0x45;
        assert_eq!(
            parse_summary(&p),
            Err(WireError::BadIpv6("version is not 6"))
        );
        let p = packet(PROTO_UDP, &[0; 8]);
        assert!(matches!(
            parse_summary(&p[..44]),
            Err(WireError::Truncated { need: 48, .. })
        ));
        assert!(matches!(
            parse_summary(&p[..20]),
            Err(WireError::Truncated { need: 40, .. })
        ));
        // A hop-by-hop header claiming 16 bytes in an 8-byte payload.
        let p = packet(HOP_BY_HOP, &[PROTO_UDP, 1, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            parse_summary(&p),
            Err(WireError::BadIpv6(
                "extension header longer than the packet"
            ))
        );
        let p = packet(HOP_BY_HOP, &[]);
        assert_eq!(
            parse_summary(&p),
            Err(WireError::BadIpv6("extension header truncated"))
        );
        // Eight destination-options headers then ICMPv6: walked; nine: refused.
        for (n, ok) in [(8, true), (9, false)] {
            let mut payload = Vec::new();
            for i in 0..n {
                let next = if i + 1 == n { PROTO_ICMPV6 } else { DEST_OPTS };
                payload.extend_from_slice(&[next, 0, 1, 4, 0, 0, 0, 0]);
            }
            payload.extend_from_slice(&[136, 0, 0, 0, 0, 0, 0, 0]);
            let r = parse_summary(&packet(DEST_OPTS, &payload));
            if ok {
                assert_eq!(r.unwrap().upper, Some((PROTO_ICMPV6, 40 + 8 * n)));
            } else {
                assert!(matches!(r, Err(WireError::BadIpv6(_))), "{r:?}");
            }
        }
    }

    #[test]
    fn checksum_of_a_known_echo_request() {
        // ping6 fe80::1 -> ff02::1, id 1 seq 1, no data: checksum chosen so the message
        // sums to zero, then verified.
        let src: Ipv6Addr = "fe80::1".parse().unwrap();
        let dst: Ipv6Addr = "ff02::1".parse().unwrap();
        let mut m = [128u8, 0, 0, 0, 0, 1, 0, 1];
        let c = upper_checksum(&src, &dst, PROTO_ICMPV6, &m);
        m[2..4].copy_from_slice(&c.to_be_bytes());
        assert_eq!(upper_checksum(&src, &dst, PROTO_ICMPV6, &m), 0);
        // Computed by hand: pseudo-header sum 0xfe80+1+0xff02+1+8+58 plus the message's
        // 0x8000+1+1, folded and complemented.
        let sum: u32 = 0xfe80 + 1 + 0xff02 + 1 + 8 + 58 + 0x8000 + 1 + 1;
        let folded = (sum & 0xffff) + (sum >> 16);
        let folded = (folded & 0xffff) + (folded >> 16);
        assert_eq!(c, !(folded as u16));
    }

    #[test]
    fn addresses_the_kernel_derives() {
        let mac = [0x02, 0x00, 0x0a, 0x0b, 0x0c, 0x0d];
        assert_eq!(
            link_local_for_mac(mac),
            "fe80::aff:fe0b:c0d".parse::<Ipv6Addr>().unwrap()
        );
        let ip: Ipv6Addr = "2001:2:0:1::1:2:3".parse().unwrap();
        assert_eq!(
            solicited_node(&ip),
            "ff02::1:ff02:3".parse::<Ipv6Addr>().unwrap()
        );
        assert_eq!(
            multicast_mac_octets(&"ff02::1".parse().unwrap()),
            [0x33, 0x33, 0, 0, 0, 1]
        );
        assert!(is_link_local(&"fe80::1".parse().unwrap()));
        assert!(!is_link_local(&"2001:2::1".parse().unwrap()));
    }

    #[test]
    fn cidr_parses_and_contains() {
        let c: Ipv6Cidr = "2001:2:0:1::1/64".parse().unwrap();
        assert_eq!(c.prefix, 64);
        assert!(c.contains(&"2001:2:0:1::ffff".parse().unwrap()));
        assert!(!c.contains(&"2001:2:0:2::1".parse().unwrap()));
        assert_eq!(c.to_string(), "2001:2:0:1::1/64");
        for bad in [
            "2001:2::1",
            "2001:2::1/129",
            "::/0",
            "ff02::1/64",
            "::1/128",
            "x/64",
            "::ffff:198.18.0.1/96",
        ] {
            assert!(bad.parse::<Ipv6Cidr>().is_err(), "{bad}");
        }
        let all: Ipv6Cidr = "2001:2::1/0".parse().unwrap();
        assert!(all.contains(&"fe80::1".parse().unwrap()));
    }

    proptest! {
        #[test]
        fn never_panics(b in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = parse_summary(&b);
        }
    }
}
