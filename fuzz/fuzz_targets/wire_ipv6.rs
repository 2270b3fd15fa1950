//! IPv6 and neighbour discovery (`wire::ipv6`, `wire::ndisc`).
//!
//! Input: a control byte, the link-layer addresses a translation is to write (a source
//! and a target MAC, a source and a target IPoIB address: 6 + 6 + 20 + 20 bytes), then an
//! IPv6 packet. Control bit 0 fills in the ICMPv6 checksum before anything reads the
//! packet (else a mutated message rarely gets past the checksum check); the other bits
//! say how many bytes short the too-small buffer is.
//!
//! Properties: `parse_summary` keeps its bounds on any bytes. A neighbour discovery
//! message that passes `ndisc::parse` in one link's form translates into one of exactly
//! the expected length that passes it in the other form, with the same type, addresses,
//! target and flags and the given link-layer addresses; into a buffer one byte (or more)
//! too small it is refused; translated back it is the packet it was. A solicitation and
//! an advertisement written for any addresses parse, unless RFC 4861 forbids their
//! addresses (a multicast target), and are refused by a buffer too small.
#![no_main]

use std::net::Ipv6Addr;

use libfuzzer_sys::fuzz_target;
use uipoib::runtime::config::MAX_IPOIB_MTU;
use uipoib::wire::eth::Mac;
use uipoib::wire::ipoib::IpoibAddr;
use uipoib::wire::ipv6::{self, Ipv6Summary, PROTO_ICMPV6, upper_checksum};
use uipoib::wire::ndisc::{self, LinkAddr, NA_OVERRIDE, NEIGHBOUR_ADVERT, NEIGHBOUR_SOLICIT};

/// Bytes before the packet: the control byte and the four link-layer addresses.
const PREFIX: usize = 1 + 6 + 6 + 20 + 20;

/// The largest packet a translation writes: what the biggest IPoIB MTU holds.
const MTU: usize = MAX_IPOIB_MTU as usize;

fn mac(b: &[u8]) -> Mac {
    let mut m = [0u8; 6];
    m.copy_from_slice(&b[..6]);
    Mac(m)
}

fn hw(b: &[u8]) -> IpoibAddr {
    IpoibAddr::parse(b).expect("20 bytes")
}

fn addr(b: &[u8]) -> Ipv6Addr {
    let mut a = [0u8; 16];
    a.copy_from_slice(&b[..16]);
    Ipv6Addr::from(a)
}

/// `parse_summary`'s documented bounds.
fn check_summary(p: &[u8], s: &Ipv6Summary) {
    assert_eq!(p[0] >> 4, 6);
    assert_eq!(
        s.total_len,
        ipv6::HEADER_LEN + usize::from(u16::from_be_bytes([p[4], p[5]]))
    );
    assert!(s.total_len <= p.len());
    assert_eq!((s.next_header, s.hop_limit), (p[6], p[7]));
    assert_eq!(s.src.octets()[..], p[8..24]);
    assert_eq!(s.dst.octets()[..], p[24..40]);
    if let Some((_, at)) = s.upper {
        assert!(
            at >= ipv6::HEADER_LEN && at <= s.total_len,
            "upper layer at {at}"
        );
        assert_eq!((at - ipv6::HEADER_LEN) % 8, 0, "upper layer at {at}");
    }
}

/// One translation's property: `p` (whose summary is `s`, ICMPv6 at `at`) parsed in
/// `A`'s form is translated to `B`'s with the addresses `sll` and `tll`.
fn check_nd<A: LinkAddr + std::fmt::Debug, B: LinkAddr + std::fmt::Debug>(
    p: &[u8],
    s: &Ipv6Summary,
    at: usize,
    sll: B,
    tll: B,
    short: usize,
) {
    let Ok(nd) = ndisc::parse::<A>(p, s, at) else {
        return;
    };
    let msg = &p[at..s.total_len];
    assert_eq!(nd.kind, msg[0]);
    assert!(ndisc::is_nd(nd.kind));
    assert_eq!((nd.src, nd.dst), (s.src, s.dst));
    assert_eq!(s.hop_limit, 255);
    let new_s = nd.source_ll.map(|_| sll);
    let new_t = nd.target_ll.map(|_| tll);
    let options = usize::from(nd.source_ll.is_some()) + usize::from(nd.target_ll.is_some());
    let want = (s.total_len + options * usize::from(B::UNITS) * 8)
        .checked_sub(options * usize::from(A::UNITS) * 8)
        .expect("the options were in the packet");

    // A buffer too small by `short` bytes (at least one) refuses it.
    let mut small = vec![0u8; want.saturating_sub(short)];
    assert!(
        nd.translate(p, new_s, new_t, &mut small).is_err(),
        "a {want}-byte translation fit {} bytes",
        small.len()
    );

    let mut out = vec![0u8; MTU];
    let n = match nd.translate(p, new_s, new_t, &mut out) {
        Ok(n) => n,
        Err(e) => {
            assert!(want > MTU, "a {want}-byte translation refused: {e}");
            return;
        }
    };
    assert_eq!(n, want, "translated length");
    let out = &out[..n];
    let s2 = ipv6::parse_summary(out).expect("the translated packet's IPv6 header");
    assert_eq!(s2.total_len, n);
    assert_eq!(s2.upper, Some((PROTO_ICMPV6, at)), "the upper layer moved");
    // Before the message only the payload length changed.
    assert_eq!(out[..4], p[..4]);
    assert_eq!(out[4..6], ((n - ipv6::HEADER_LEN) as u16).to_be_bytes());
    assert_eq!(out[6..at], p[6..at]);
    let back = ndisc::parse::<B>(out, &s2, at).unwrap_or_else(|e| {
        panic!("a message that passed the checks translates into one that fails them: {e}")
    });
    assert_eq!(
        (back.kind, back.src, back.dst, back.target, back.flags),
        (nd.kind, nd.src, nd.dst, nd.target, nd.flags)
    );
    assert_eq!(back.source_ll, new_s, "source link-layer address");
    assert_eq!(back.target_ll, new_t, "target link-layer address");

    // And back again: the original packet (without what followed it).
    let mut again = vec![0u8; s.total_len];
    let m = back
        .translate(out, nd.source_ll, nd.target_ll, &mut again)
        .expect("the translation back fits the original's size");
    assert_eq!(m, s.total_len);
    let orig = &p[..s.total_len];
    let c = at + 2..at + 4;
    if orig[c.clone()] == [0xff, 0xff] {
        // 0xffff and 0 are the same sum (RFC 1071); the one written is 0.
        assert_eq!(again[c.clone()], [0, 0]);
        again[c.clone()].copy_from_slice(&[0xff, 0xff]);
    }
    assert_eq!(
        &again[..],
        orig,
        "translated back, the packet is the original"
    );
}

/// `solicit` and `advertise` for any addresses.
fn check_emitters(own: IpoibAddr, src: Ipv6Addr, target: Ipv6Addr) {
    let mut out = [0u8; 256];
    let mut small = [0u8; 87];
    let parsed = |p: &[u8]| {
        let s = ipv6::parse_summary(p).expect("an emitted packet's IPv6 header");
        assert_eq!(s.total_len, p.len());
        assert_eq!(s.upper, Some((PROTO_ICMPV6, ipv6::HEADER_LEN)));
        ndisc::parse::<IpoibAddr>(p, &s, ipv6::HEADER_LEN)
    };
    // RFC 4861 §7.1.1/§7.1.2: a multicast target is refused on receipt.
    let refused = target.is_multicast();

    assert!(ndisc::solicit(own, src, target, &mut small).is_err());
    let n = ndisc::solicit(own, src, target, &mut out).expect("a solicitation fits 256 bytes");
    assert_eq!(n, small.len() + 1);
    match parsed(&out[..n]) {
        Ok(nd) => {
            assert!(!refused, "a solicitation of multicast {target} parsed");
            // §7.1.1: from :: it would carry no source link-layer address.
            assert!(
                !src.is_unspecified(),
                "a solicitation from :: with an option parsed"
            );
            assert_eq!(
                (nd.kind, nd.src, nd.dst, nd.target, nd.flags),
                (
                    NEIGHBOUR_SOLICIT,
                    src,
                    ipv6::solicited_node(&target),
                    Some(target),
                    0
                )
            );
            assert_eq!((nd.source_ll, nd.target_ll), (Some(own), None));
        }
        Err(e) => assert!(
            refused || src.is_unspecified(),
            "a solicitation from {src} of {target} does not parse: {e}"
        ),
    }

    assert!(ndisc::advertise(own, target, &mut small).is_err());
    let n = ndisc::advertise(own, target, &mut out).expect("an advertisement fits 256 bytes");
    assert_eq!(n, small.len() + 1);
    match parsed(&out[..n]) {
        Ok(nd) => {
            assert!(!refused, "an advertisement of multicast {target} parsed");
            assert_eq!(
                (nd.kind, nd.src, nd.dst, nd.target, nd.flags),
                (
                    NEIGHBOUR_ADVERT,
                    target,
                    Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
                    Some(target),
                    NA_OVERRIDE
                )
            );
            assert_eq!((nd.source_ll, nd.target_ll), (None, Some(own)));
        }
        Err(e) => assert!(refused, "an advertisement of {target} does not parse: {e}"),
    }
}

fuzz_target!(|data: &[u8]| {
    let mut head = [0u8; PREFIX];
    let k = data.len().min(PREFIX);
    head[..k].copy_from_slice(&data[..k]);
    let mut p = data[k..].to_vec();
    let ctl = head[0];
    let (mac_s, mac_t) = (mac(&head[1..7]), mac(&head[7..13]));
    let (hw_s, hw_t) = (hw(&head[13..33]), hw(&head[33..53]));

    // The emitters, for addresses taken from the packet's bytes.
    let mut a = [0u8; 32];
    let j = p.len().min(32);
    a[..j].copy_from_slice(&p[..j]);
    check_emitters(hw_s, addr(&a[..16]), addr(&a[16..]));

    if ctl & 1 != 0
        && let Ok(s) = ipv6::parse_summary(&p)
        && let Some((PROTO_ICMPV6, at)) = s.upper
        && s.total_len >= at + 4
    {
        p[at + 2..at + 4].fill(0);
        let c = upper_checksum(&s.src, &s.dst, PROTO_ICMPV6, &p[at..s.total_len]);
        p[at + 2..at + 4].copy_from_slice(&c.to_be_bytes());
    }
    let Ok(s) = ipv6::parse_summary(&p) else {
        return;
    };
    check_summary(&p, &s);
    let Some((PROTO_ICMPV6, at)) = s.upper else {
        return;
    };
    if !p.get(at).is_some_and(|&t| ndisc::is_nd(t)) || at >= s.total_len {
        return;
    }
    let short = 1 + usize::from(ctl >> 1);
    check_nd::<Mac, IpoibAddr>(&p, &s, at, hw_s, hw_t, short);
    check_nd::<IpoibAddr, Mac>(&p, &s, at, mac_s, mac_t, short);
});
