//! The few IPv4 header fields the datapath needs (addresses and lengths), and the
//! Internet checksum.
//!
//! The datapath looks into IPv4 only to pick a next hop and to check that a packet is
//! whole; it does not verify checksums (the receiving stack does) and never rewrites a
//! packet.

use std::net::Ipv4Addr;

use super::{WireError, prefix};

/// Length of an IPv4 header without options.
pub const MIN_HEADER_LEN: usize = 20;

/// What the datapath reads from an IPv4 header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Summary {
    /// Source address.
    pub src: Ipv4Addr,
    /// Destination address.
    pub dst: Ipv4Addr,
    /// Header length in bytes (IHL × 4, 20..=60).
    pub header_len: usize,
    /// Total length in bytes (header and payload), from the header.
    pub total_len: usize,
    /// Protocol number of the payload.
    pub protocol: u8,
}

/// Checks version 4, IHL >= 5, `header_len <= total_len <= b.len()`; errors are
/// [`WireError::BadIpv4`] / [`WireError::Truncated`] naming the problem. Bytes after
/// `total_len` (Ethernet padding) are allowed. Does not verify the checksum.
pub fn parse_summary(b: &[u8]) -> Result<Ipv4Summary, WireError> {
    let h: &[u8; MIN_HEADER_LEN] = prefix(b, "IPv4 header")?;
    if h[0] >> 4 != 4 {
        return Err(WireError::BadIpv4("version is not 4"));
    }
    let header_len = usize::from(h[0] & 0x0f) * 4;
    if header_len < MIN_HEADER_LEN {
        return Err(WireError::BadIpv4(
            "header length (IHL) is less than 5 words",
        ));
    }
    let total_len = usize::from(u16::from_be_bytes([h[2], h[3]]));
    if total_len < header_len {
        return Err(WireError::BadIpv4(
            "total length is less than the header length",
        ));
    }
    if header_len > b.len() {
        return Err(WireError::Truncated {
            what: "IPv4 header with options",
            need: header_len,
            got: b.len(),
        });
    }
    if total_len > b.len() {
        return Err(WireError::Truncated {
            what: "IPv4 packet (total length)",
            need: total_len,
            got: b.len(),
        });
    }
    Ok(Ipv4Summary {
        src: Ipv4Addr::new(h[12], h[13], h[14], h[15]),
        dst: Ipv4Addr::new(h[16], h[17], h[18], h[19]),
        header_len,
        total_len,
        protocol: h[9],
    })
}

/// The Internet checksum (RFC 1071) of `data`: the ones' complement of the ones'
/// complement sum of its 16-bit big-endian words, an odd last byte padded with zero.
/// Computed over a header whose checksum field is zero, it is the value to store there;
/// computed over a header with a correct checksum, it is 0.
pub fn checksum(data: &[u8]) -> u16 {
    !fold(ones_sum(data, 0))
}

/// The ones' complement sum of `data` as 16-bit big-endian words (an odd last byte is
/// the high byte of a word), added to `acc`, unfolded: chain it over several slices (a
/// pseudo-header, then a segment; only the last may be odd) and [`fold`] the result.
///
/// Eight bytes at a time, in the machine's byte order, with the carry out of each
/// 64-bit add added back in (RFC 1071's deferred carries: 2^16 = 1 in ones' complement
/// arithmetic, so the 64-bit sum folds to the 16-bit one, and a sum of byte-swapped
/// words is the byte-swapped sum). The carry chain keeps the loop scalar: two integer
/// adds per eight bytes, no byte swaps. Vectorised (what the compiler made of a
/// carry-free loop with big-endian loads), each eight bytes cost a dozen SSE shuffles,
/// which QEMU's TCG emulates one helper call each: the lab's guests spent 12-15% of
/// the daemon's CPU time in checksums that way.
pub fn ones_sum(data: &[u8], acc: u64) -> u64 {
    let mut t: u64 = 0;
    let mut chunks = data.chunks_exact(8);
    for c in chunks.by_ref() {
        let w = u64::from_ne_bytes([c[0], c[1], c[2], c[3], c[4], c[5], c[6], c[7]]);
        let (r, carry) = t.overflowing_add(w);
        // No overflow: with a carry out, `r` is at most `w - 1`.
        t = r + u64::from(carry);
    }
    // Fold the native-order sum to 16 bits, then into big-endian order.
    let native = fold((t & 0xffff_ffff) + (t >> 32));
    let mut s = acc
        + u64::from(if cfg!(target_endian = "little") {
            native.swap_bytes()
        } else {
            native
        });
    let mut words = chunks.remainder().chunks_exact(2);
    for w in words.by_ref() {
        s += u64::from(u16::from_be_bytes([w[0], w[1]]));
    }
    if let [last] = words.remainder() {
        s += u64::from(*last) << 8;
    }
    s
}

/// Fold an unfolded ones' complement sum ([`ones_sum`]) to 16 bits.
pub fn fold(mut s: u64) -> u16 {
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    // The loop leaves `s` within 16 bits.
    s as u16
}

/// An IPv4 address with a prefix length (`198.18.1.1/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ipv4Cidr {
    /// The address.
    pub addr: Ipv4Addr,
    /// The prefix length, 0..=32.
    pub prefix: u8,
}

impl Ipv4Cidr {
    /// True if `ip` is in this subnet.
    pub fn contains(&self, ip: Ipv4Addr) -> bool {
        let mask = if self.prefix == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(self.prefix))
        };
        u32::from(ip) & mask == u32::from(self.addr) & mask
    }
}

impl std::fmt::Display for Ipv4Cidr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

impl std::str::FromStr for Ipv4Cidr {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (a, p) = s
            .split_once('/')
            .ok_or_else(|| format!("{s:?} is not ADDRESS/PREFIX (e.g. 198.18.1.1/24)"))?;
        let addr: Ipv4Addr = a
            .parse()
            .map_err(|_| format!("{a:?} is not an IPv4 address"))?;
        let prefix: u8 = p
            .parse()
            .ok()
            .filter(|&p| p <= 32)
            .ok_or_else(|| format!("prefix {p:?} is not a number from 0 to 32"))?;
        if addr.is_unspecified() || addr.is_multicast() || addr.is_broadcast() {
            return Err(format!("{addr} cannot be an interface address"));
        }
        Ok(Ipv4Cidr { addr, prefix })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A UDP packet header, 192.168.0.1 -> 192.168.0.199, total length 0x73, DF, TTL 64,
    /// checksum 0xb861 (the worked example of the Internet checksum on Wikipedia's IPv4
    /// header page).
    const HEADER: [u8; 20] = [
        0x45, 0x00, 0x00, 0x73, 0x00, 0x00, 0x40, 0x00, 0x40, 0x11, 0xb8, 0x61, 0xc0, 0xa8, 0x00,
        0x01, 0xc0, 0xa8, 0x00, 0xc7,
    ];

    fn packet(header: &[u8], total: usize) -> [u8; 0x73 + 8] {
        let mut p = [0u8; 0x73 + 8];
        p[..header.len()].copy_from_slice(header);
        p[2..4].copy_from_slice(&u16::try_from(total).unwrap().to_be_bytes());
        p
    }

    #[test]
    fn known_header() {
        let p = packet(&HEADER, 0x73);
        assert_eq!(
            parse_summary(&p[..0x73]),
            Ok(Ipv4Summary {
                src: Ipv4Addr::new(192, 168, 0, 1),
                dst: Ipv4Addr::new(192, 168, 0, 199),
                header_len: 20,
                total_len: 0x73,
                protocol: 17,
            })
        );
    }

    #[test]
    fn trailing_padding_is_allowed() {
        let p = packet(&HEADER, 0x73);
        assert_eq!(parse_summary(&p).map(|s| s.total_len), Ok(0x73));
    }

    #[test]
    fn header_only_packet() {
        let p = packet(&HEADER, 20);
        assert_eq!(parse_summary(&p[..20]).map(|s| s.total_len), Ok(20));
    }

    #[test]
    fn options_extend_the_header() {
        let mut h = [0u8; 24];
        h[..20].copy_from_slice(&HEADER);
        h[0] = 0x46;
        let p = packet(&h, 40);
        let s = parse_summary(&p[..40]).unwrap();
        assert_eq!((s.header_len, s.total_len), (24, 40));
        assert_eq!(s.dst, Ipv4Addr::new(192, 168, 0, 199));
    }

    #[test]
    fn every_length_below_the_minimum_header_is_truncated() {
        for len in 0..MIN_HEADER_LEN {
            assert_eq!(
                parse_summary(&HEADER[..len]),
                Err(WireError::Truncated {
                    what: "IPv4 header",
                    need: 20,
                    got: len
                })
            );
        }
    }

    #[test]
    fn every_length_below_total_len_is_truncated() {
        let p = packet(&HEADER, 0x73);
        for len in MIN_HEADER_LEN..0x73 {
            assert_eq!(
                parse_summary(&p[..len]),
                Err(WireError::Truncated {
                    what: "IPv4 packet (total length)",
                    need: 0x73,
                    got: len
                }),
                "length {len}"
            );
        }
    }

    #[test]
    fn options_cut_short_are_truncated() {
        let mut h = HEADER;
        h[0] = 0x4f; // 60-byte header
        let p = packet(&h, 0x73);
        assert_eq!(
            parse_summary(&p[..40]),
            Err(WireError::Truncated {
                what: "IPv4 header with options",
                need: 60,
                got: 40
            })
        );
    }

    #[test]
    fn wrong_version_nibbles() {
        for v in (0u8..16).filter(|&v| v != 4) {
            let mut p = packet(&HEADER, 0x73);
            p[0] = (v << 4) | 5;
            assert_eq!(
                parse_summary(&p),
                Err(WireError::BadIpv4("version is not 4")),
                "version {v}"
            );
        }
    }

    #[test]
    fn ihl_below_5() {
        for ihl in 0u8..5 {
            let mut p = packet(&HEADER, 0x73);
            p[0] = 0x40 | ihl;
            assert_eq!(
                parse_summary(&p),
                Err(WireError::BadIpv4(
                    "header length (IHL) is less than 5 words"
                ))
            );
        }
    }

    #[test]
    fn total_len_below_header_len() {
        for total in [0, 1, 19] {
            let p = packet(&HEADER, total);
            assert_eq!(
                parse_summary(&p),
                Err(WireError::BadIpv4(
                    "total length is less than the header length"
                ))
            );
        }
        let mut h = HEADER;
        h[0] = 0x46;
        let p = packet(&h, 23);
        assert_eq!(
            parse_summary(&p),
            Err(WireError::BadIpv4(
                "total length is less than the header length"
            ))
        );
    }

    #[test]
    fn checksum_known_answers() {
        let mut h = HEADER;
        assert_eq!(checksum(&h), 0, "a correct header sums to zero");
        h[10..12].fill(0);
        assert_eq!(checksum(&h), 0xb861);
        // RFC 1071 § 3 example: 00 01 f2 03 f4 f5 f6 f7 sums to 0xddf2.
        assert_eq!(
            checksum(&[0x00, 0x01, 0xf2, 0x03, 0xf4, 0xf5, 0xf6, 0xf7]),
            !0xddf2
        );
        assert_eq!(checksum(&[]), 0xffff);
        assert_eq!(checksum(&[0x12]), !0x1200);
    }

    /// RFC 1071 word by word, as a reference for the eight-byte loop.
    fn rfc1071(data: &[u8]) -> u16 {
        let mut r: u64 = data
            .chunks(2)
            .map(|w| u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)])))
            .sum();
        while r > 0xffff {
            r = (r & 0xffff) + (r >> 16);
        }
        !(r as u16)
    }

    #[test]
    fn carries_out_of_every_add_fold_back() {
        for len in [8, 9, 64, 4096, 65_535] {
            let ones = vec![0xffu8; len];
            assert_eq!(checksum(&ones), rfc1071(&ones), "{len} bytes of 0xff");
        }
    }

    proptest! {
        #[test]
        fn the_wide_sum_is_the_word_by_word_sum(
            data in proptest::collection::vec(any::<u8>(), 0..3000),
        ) {
            prop_assert_eq!(checksum(&data), rfc1071(&data));
        }

        #[test]
        fn chained_sums_are_the_sum_of_the_whole(
            head in proptest::collection::vec(any::<u8>(), 0..200),
            tail in proptest::collection::vec(any::<u8>(), 0..3000),
            ff in any::<bool>(),
        ) {
            // A pseudo-header then a segment, as the TCP checksums chain them; all-ones
            // data makes every 64-bit add carry.
            let mut head = head;
            if head.len() % 2 == 1 {
                head.pop();
            }
            let tail = if ff { vec![0xff; tail.len()] } else { tail };
            let whole = [head.as_slice(), tail.as_slice()].concat();
            prop_assert_eq!(!fold(ones_sum(&tail, ones_sum(&head, 0))), rfc1071(&whole));
        }

        #[test]
        fn arbitrary_bytes_never_panic(b in proptest::collection::vec(any::<u8>(), 0..80)) {
            let _ = parse_summary(&b);
            let _ = checksum(&b);
        }

        #[test]
        fn accepted_summaries_respect_the_bounds(b in proptest::collection::vec(any::<u8>(), 20..80)) {
            if let Ok(s) = parse_summary(&b) {
                prop_assert!(MIN_HEADER_LEN <= s.header_len);
                prop_assert!(s.header_len <= s.total_len);
                prop_assert!(s.total_len <= b.len());
            }
        }

        #[test]
        fn summary_of_a_built_header(src in any::<u32>(), dst in any::<u32>(), proto in any::<u8>(),
                                     ihl in 5u8..=15, payload in 0usize..64, pad in 0usize..8) {
            let header_len = usize::from(ihl) * 4;
            let total_len = header_len + payload;
            let mut b = [0u8; 60 + 64 + 8];
            b[0] = 0x40 | ihl;
            b[2..4].copy_from_slice(&u16::try_from(total_len).unwrap().to_be_bytes());
            b[9] = proto;
            b[12..16].copy_from_slice(&src.to_be_bytes());
            b[16..20].copy_from_slice(&dst.to_be_bytes());
            let want = Ipv4Summary {
                src: Ipv4Addr::from(src),
                dst: Ipv4Addr::from(dst),
                header_len,
                total_len,
                protocol: proto,
            };
            prop_assert_eq!(parse_summary(&b[..total_len + pad]), Ok(want));
        }

        #[test]
        fn storing_the_checksum_makes_the_sum_zero(mut h in any::<[u8; 20]>()) {
            h[10..12].fill(0);
            let c = checksum(&h);
            h[10..12].copy_from_slice(&c.to_be_bytes());
            prop_assert_eq!(checksum(&h), 0);
        }
    }
}
