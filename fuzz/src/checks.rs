//! Checks of the offload codecs that more than one target uses.

use uipoib::wire::ETHERTYPE_IPV6;
use uipoib::wire::ipv4::{self, fold, ones_sum};
use uipoib::wire::offload::{self, GSO_TCPV4, GSO_TCPV6, Plan, VNET_HDR_LEN, VnetHdr};

const ETH: usize = 14;
/// Offset of the IPv4 identification field in a frame.
const IP_ID: std::ops::Range<usize> = ETH + 4..ETH + 6;
/// Offset of the IPv4 header checksum in a frame.
const IP_CSUM: std::ops::Range<usize> = ETH + 10..ETH + 12;

/// Whether the frame is IPv6 (by its EtherType).
fn is_ipv6(frame: &[u8]) -> bool {
    frame[12..14] == ETHERTYPE_IPV6.to_be_bytes()
}

/// Whether `frame` (Ethernet + IPv4 with `ip_hl` header bytes, or IPv6 with 40, + TCP to
/// the end) has a valid IPv4 header checksum (IPv4) and a valid TCP checksum over its
/// family's pseudo-header.
pub fn tcp_checksums_ok(frame: &[u8], ip_hl: usize) -> bool {
    let ip = &frame[ETH..];
    let addrs = if is_ipv6(frame) {
        &ip[8..40]
    } else {
        if ipv4::checksum(&ip[..ip_hl]) != 0 {
            return false;
        }
        &ip[12..20]
    };
    let tcp = &ip[ip_hl..];
    let s = ones_sum(addrs, 6 + tcp.len() as u64);
    fold(ones_sum(tcp, s)) == 0xffff
}

/// Segment `i` of a super-frame checked against the super-frame it was cut from: its
/// length, headers, payload slice, IP length field, sequence number and checksums.
pub fn check_segment(frame: &[u8], p: &Plan, i: usize, seg: &[u8]) {
    let h = p.headers();
    assert_eq!(seg.len(), p.segment_len(i), "segment {i} length");
    let start = i * p.mss;
    assert_eq!(
        &seg[h..],
        &frame[h + start..h + start + (seg.len() - h)],
        "segment {i} payload is not the super-frame's bytes {start}.."
    );
    assert_eq!(seg[..ETH], frame[..ETH], "segment {i} Ethernet header");
    assert_eq!(
        p.ipv6,
        is_ipv6(frame),
        "segment {i}: plan and EtherType disagree"
    );
    if p.ipv6 {
        let plen = usize::from(u16::from_be_bytes([seg[ETH + 4], seg[ETH + 5]]));
        assert_eq!(
            plen,
            seg.len() - ETH - 40,
            "segment {i} IPv6 payload length"
        );
        assert_eq!(
            seg[ETH..ETH + 4],
            frame[ETH..ETH + 4],
            "segment {i} IPv6 header"
        );
        assert_eq!(
            seg[ETH + 6..ETH + 40],
            frame[ETH + 6..ETH + 40],
            "segment {i} IPv6 header"
        );
    } else {
        let total = usize::from(u16::from_be_bytes([seg[ETH + 2], seg[ETH + 3]]));
        assert_eq!(total, seg.len() - ETH, "segment {i} IPv4 total length");
    }
    let t0 = ETH + p.ip_hl;
    let seq = |f: &[u8]| u32::from_be_bytes([f[t0 + 4], f[t0 + 5], f[t0 + 6], f[t0 + 7]]);
    assert_eq!(
        seq(seg),
        seq(frame).wrapping_add(start as u32),
        "segment {i} sequence number"
    );
    assert!(
        tcp_checksums_ok(seg, p.ip_hl),
        "segment {i} of {} has a bad IPv4 or TCP checksum",
        p.segments
    );
}

/// Cut a TSO super-frame into every segment with `offload::segment`, checking each.
/// Returns the segments.
pub fn cut(frame: &[u8], p: &Plan) -> Vec<Vec<u8>> {
    assert!(p.segments >= 1);
    assert_eq!(p.segments, p.payload.div_ceil(p.mss).max(1));
    let mut out = Vec::with_capacity(p.segments);
    let mut buf = vec![0u8; p.headers() + p.mss];
    let mut payload = 0;
    for i in 0..p.segments {
        let n = offload::segment(frame, p, i, &mut buf)
            .unwrap_or_else(|e| panic!("segment {i} of a planned frame failed: {e}"));
        check_segment(frame, p, i, &buf[..n]);
        payload += n - p.headers();
        out.push(buf[..n].to_vec());
    }
    assert_eq!(
        payload, p.payload,
        "the segments do not add up to the payload"
    );
    assert!(
        offload::segment(frame, p, p.segments, &mut buf).is_err(),
        "a segment past the last one was cut"
    );
    out
}

/// What a coalescer wrote (`delivered`: header and frame) must expand back, segment
/// for segment, to the frames it was given (`written`): a frame written alone has the
/// header of a frame written whole (`offload::plain_hdr`: no offload, its headers' length
/// as a hint; all zero from a TAP without offloads) and is unchanged; a joined one is a
/// TCP/IPv4 super-frame with a partial checksum that, completed, is valid, and whose segments, cut as a TAP read
/// would cut them, are the joined frames (but for IPv4 id and the checksums, which the
/// cut recomputes) with valid checksums; a TCP/IPv6 one likewise (all of it equal but
/// the TCP checksum). A joined frame's `gso_type` is its EtherType's family.
pub fn check_coalesced(written: &[Vec<u8>], delivered: &[([u8; VNET_HDR_LEN], Vec<u8>)]) {
    let mut k = 0;
    for (hdr_bytes, frame) in delivered {
        let hdr = VnetHdr::parse(hdr_bytes).expect("a 10-byte header parses");
        if hdr == offload::plain_hdr(frame.len()) || hdr == VnetHdr::default() {
            let w = written.get(k).expect("more frames delivered than written");
            assert_eq!(frame, w, "frame {k} was changed on its way to the TAP");
            k += 1;
            continue;
        }
        let want = if is_ipv6(frame) { GSO_TCPV6 } else { GSO_TCPV4 };
        assert_eq!(hdr.gso_type, want, "a joined frame's gso_type");
        assert_eq!(hdr.flags, offload::F_NEEDS_CSUM, "a joined frame's flags");
        let p = offload::plan(frame, &hdr).expect("a joined frame plans as a TSO frame");
        assert!(p.segments >= 2, "a frame joined from one segment");
        assert_eq!(usize::from(hdr.hdr_len), p.headers(), "hdr_len");
        let mut done = frame.clone();
        offload::finish_checksum(
            &mut done[..],
            usize::from(hdr.csum_start),
            usize::from(hdr.csum_offset),
        )
        .expect("a joined frame's partial checksum completes");
        assert!(
            tcp_checksums_ok(&done, p.ip_hl),
            "a joined frame's completed checksums are not valid"
        );
        let t0 = ETH + p.ip_hl;
        let tcp_csum = t0 + 16..t0 + 18;
        for (i, seg) in cut(frame, &p).into_iter().enumerate() {
            let w = written
                .get(k)
                .expect("a joined frame holds more segments than were written");
            assert_eq!(seg.len(), w.len(), "segment {i} of a joined frame: length");
            let masked = |f: &[u8]| {
                let mut f = f.to_vec();
                f[tcp_csum.clone()].fill(0);
                if !is_ipv6(&f) {
                    for r in [IP_ID, IP_CSUM] {
                        f[r].fill(0);
                    }
                }
                f
            };
            assert_eq!(
                masked(&seg),
                masked(w),
                "segment {i} of a joined frame differs from frame {k} that went in"
            );
            assert!(
                tcp_checksums_ok(w, p.ip_hl),
                "frame {k} joined with a bad checksum"
            );
            k += 1;
        }
    }
    assert_eq!(k, written.len(), "frames written but not delivered");
}
