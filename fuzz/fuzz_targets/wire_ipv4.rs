//! IPv4 (`wire::ipv4`): `parse_summary` on any bytes keeps its documented bounds, and the
//! Internet checksum (eight bytes at a time with deferred carries) agrees with a plain
//! word-by-word RFC 1071 sum, also when chained over two slices.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::wire::ipv4::{self, checksum, fold, ones_sum};

/// RFC 1071, one 16-bit big-endian word at a time.
fn reference(data: &[u8], acc: u64) -> u16 {
    let mut s = acc;
    for w in data.chunks(2) {
        s += u64::from(u16::from_be_bytes([w[0], *w.get(1).unwrap_or(&0)]));
        s = (s & 0xffff) + (s >> 16);
    }
    fold(s)
}

fuzz_target!(|data: &[u8]| {
    if let Ok(s) = ipv4::parse_summary(data) {
        assert!((20..=60).contains(&s.header_len) && s.header_len % 4 == 0);
        assert!(s.header_len <= s.total_len && s.total_len <= data.len());
        assert_eq!(
            s.total_len,
            usize::from(u16::from_be_bytes([data[2], data[3]]))
        );
        assert_eq!(s.protocol, data[9]);
        assert_eq!(s.src.octets()[..], data[12..16]);
    }
    // The accumulator a caller passes is a small sum (a pseudo-header): take 32 bits.
    let (acc, body) = match data.split_first_chunk::<4>() {
        Some((a, b)) => (u64::from(u32::from_le_bytes(*a)), b),
        None => (0, data),
    };
    assert_eq!(fold(ones_sum(body, acc)), reference(body, acc), "ones_sum");
    assert_eq!(checksum(body), !reference(body, 0), "checksum");
    // Chained: an even first part, then the rest.
    let k = (body.first().copied().unwrap_or(0) as usize * 2).min(body.len() & !1);
    let chained = ones_sum(&body[k..], ones_sum(&body[..k], acc));
    assert_eq!(
        fold(chained),
        reference(body, acc),
        "ones_sum chained at {k}"
    );
    // A header with its checksum filled in sums to zero.
    if body.len() >= 20 {
        let mut h = body[..20].to_vec();
        h[10..12].fill(0);
        let c = checksum(&h);
        h[10..12].copy_from_slice(&c.to_be_bytes());
        assert_eq!(checksum(&h), 0);
    }
});
