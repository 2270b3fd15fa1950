use super::*;
use proptest::prelude::*;

/// A TCP/IPv4 frame 198.18.1.2:40000 -> 198.18.1.1:5201 with `payload`, seq 1000,
/// flags `flags`, IPv4 id 77, and the checksums a TSO super-frame carries (IPv4
/// header checksum of the big packet; TCP: anything, segments recompute it).
fn tcp_frame(payload: &[u8], flags: u8, options: usize) -> Vec<u8> {
    let tcp_hl = 20 + options;
    let total = 20 + tcp_hl + payload.len();
    let mut f = vec![0u8; 14 + total];
    f[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    let ip = &mut f[14..34];
    ip[0] = 0x45;
    ip[2..4].copy_from_slice(&(total.min(65535) as u16).to_be_bytes());
    ip[4..6].copy_from_slice(&77u16.to_be_bytes());
    ip[6] = 0x40;
    ip[8] = 64;
    ip[9] = TCP;
    ip[12..16].copy_from_slice(&[198, 18, 1, 2]);
    ip[16..20].copy_from_slice(&[198, 18, 1, 1]);
    let t = &mut f[34..34 + tcp_hl];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&5201u16.to_be_bytes());
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    t[8..12].copy_from_slice(&5u32.to_be_bytes());
    t[12] = ((tcp_hl / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    for (k, b) in t[20..].iter_mut().enumerate() {
        *b = if k + 1 == options { 0 } else { 1 }; // NOPs, then EOL
    }
    f[14 + 20 + tcp_hl..].copy_from_slice(payload);
    f
}

fn tso(mss: u16) -> VnetHdr {
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV4,
        hdr_len: 54,
        gso_size: mss,
        csum_start: 34,
        csum_offset: 16,
    }
}

/// The TCP checksum of a whole segment verifies (sums to zero with the pseudo-header).
fn tcp_ok(f: &[u8]) -> bool {
    let ip = &f[14..];
    let hl = usize::from(ip[0] & 15) * 4;
    let total = usize::from(u16::from_be_bytes([ip[2], ip[3]]));
    let mut s = sum(&ip[12..20], 0) + u64::from(TCP) + (total - hl) as u64;
    s = sum(&ip[hl..total], s);
    fold(s) == 0xffff
}

#[test]
fn the_header_round_trips() {
    let h = tso(1448);
    let mut b = [0u8; VNET_HDR_LEN];
    h.emit(&mut b);
    assert_eq!(VnetHdr::parse(&b).unwrap(), h);
    assert!(VnetHdr::parse(&b[..9]).is_err());
}

#[test]
fn a_super_frame_becomes_segments_the_peer_accepts() {
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
    let f = tcp_frame(&payload, TCP_PSH | 0x10 | TCP_CWR, 12);
    let h = VnetHdr {
        gso_type: GSO_TCPV4 | GSO_ECN,
        ..tso(4000)
    };
    let p = plan(&f, &h).unwrap();
    assert_eq!(
        (p.segments, p.mss, p.payload, p.tcp_hl),
        (3, 4000, 10_000, 32)
    );
    let mut out = vec![0u8; 9000];
    let mut joined = Vec::new();
    for i in 0..3 {
        let n = segment(&f, &p, i, &mut out).unwrap();
        let s = &out[..n];
        assert_eq!(n, p.segment_len(i));
        assert_eq!(n, 14 + 20 + 32 + [4000, 4000, 2000][i]);
        // IPv4: total length, id + i, a valid header checksum.
        let ip = &s[14..34];
        assert_eq!(usize::from(u16::from_be_bytes([ip[2], ip[3]])), n - 14);
        assert_eq!(u16::from_be_bytes([ip[4], ip[5]]), 77 + i as u16);
        assert_eq!(ipv4::checksum(ip), 0, "segment {i}");
        // TCP: seq advances by the MSS, flags, checksum.
        let t = &s[34..];
        assert_eq!(
            u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            1000 + 4000 * i as u32
        );
        assert_eq!(t[13] & TCP_PSH != 0, i == 2, "PSH on the last only");
        assert_eq!(t[13] & TCP_CWR != 0, i == 0, "CWR on the first only");
        assert!(t[13] & 0x10 != 0, "ACK on all");
        assert!(tcp_ok(s), "segment {i} TCP checksum");
        // The options travel with every segment.
        assert_eq!(&s[54..66], &f[54..66]);
        joined.extend_from_slice(&s[66..]);
    }
    assert_eq!(joined, payload);
    assert!(segment(&f, &p, 3, &mut out).is_err());
    assert!(segment(&f, &p, 0, &mut out[..100]).is_err());
}

#[test]
fn fin_goes_on_the_last_segment_only() {
    let f = tcp_frame(&[9u8; 3000], TCP_FIN | 0x10, 0);
    let p = plan(&f, &tso(1000)).unwrap();
    let mut out = vec![0u8; 2000];
    for i in 0..p.segments {
        let n = segment(&f, &p, i, &mut out).unwrap();
        assert_eq!(out[47] & TCP_FIN != 0, i + 1 == p.segments);
        assert!(tcp_ok(&out[..n]));
    }
}

#[test]
fn a_frame_without_payload_is_one_segment() {
    let f = tcp_frame(&[], 0x10, 0);
    let p = plan(&f, &tso(1000)).unwrap();
    assert_eq!(p.segments, 1);
    let mut out = vec![0u8; 100];
    let n = segment(&f, &p, 0, &mut out).unwrap();
    assert_eq!(n, 54);
    assert!(tcp_ok(&out[..n]));
}

#[test]
fn what_is_not_tcp_over_ipv4_is_refused() {
    let mut f = tcp_frame(&[1; 100], 0x10, 0);
    assert!(plan(&f, &tso(0)).is_err(), "gso_size 0");
    f[23] = 17; // UDP
    assert!(plan(&f, &tso(50)).is_err());
    let mut f = tcp_frame(&[1; 100], 0x10, 0);
    f[12] = 0x86;
    f[13] = 0xdd;
    assert!(plan(&f, &tso(50)).is_err());
    let f = tcp_frame(&[1; 100], 0x10, 0);
    assert!(plan(&f[..40], &tso(50)).is_err());
    let mut f = tcp_frame(&[1; 100], 0x10, 0);
    f[14 + 20 + 12] = 0xf0; // TCP header of 60 bytes in a 54-byte frame... of 154
    let mut g = f.clone();
    g.truncate(14 + 20 + 40);
    assert!(plan(&g, &tso(50)).is_err());
}

#[test]
fn a_partial_checksum_is_completed() {
    let mut f = tcp_frame(&[5u8; 301], 0x18, 0);
    // What the kernel leaves with CHECKSUM_PARTIAL: the pseudo-header sum, not
    // complemented, in the TCP checksum field.
    let tcp_len = (20 + 301) as u64;
    let ps = fold(sum(&f[26..34], 0) + u64::from(TCP) + tcp_len);
    f[50..52].copy_from_slice(&ps.to_be_bytes());
    finish_checksum(&mut f, 34, 16).unwrap();
    assert!(tcp_ok(&f));
    assert!(finish_checksum(&mut f, 34, 400).is_err());
    assert!(finish_checksum(&mut f, usize::MAX, 16).is_err());
}

/// What a coalescer wrote: (header, frame) per write; fails writes when `fail`.
#[derive(Default)]
struct Rec {
    out: Vec<(VnetHdr, Vec<u8>)>,
    fail: bool,
}

impl FrameSink for Rec {
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> std::io::Result<()> {
        if self.fail {
            return Err(std::io::Error::other("queue full"));
        }
        self.out
            .push((VnetHdr::parse(hdr).unwrap(), frame.to_vec()));
        Ok(())
    }
}

/// The segments of a stream of `payload` cut at `mss` (valid checksums, DF).
fn segments(payload: &[u8], mss: u16, flags: u8) -> Vec<Vec<u8>> {
    let f = tcp_frame(payload, flags, 12);
    let p = plan(&f, &tso(mss)).unwrap();
    let mut out = vec![0u8; 70_000];
    (0..p.segments)
        .map(|i| {
            let n = segment(&f, &p, i, &mut out).unwrap();
            out[..n].to_vec()
        })
        .collect()
}

/// Complete a coalesced frame's partial checksum and check it.
fn complete_ok(hdr: &VnetHdr, f: &[u8]) -> bool {
    let mut f = f.to_vec();
    finish_checksum(&mut f, hdr.csum_start.into(), hdr.csum_offset.into()).unwrap();
    tcp_ok(&f) && ipv4::checksum(&f[14..34]) == 0
}

#[test]
fn consecutive_segments_are_joined_into_one_super_frame() {
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 251) as u8).collect();
    let segs = segments(&payload, 4000, 0x18); // ACK|PSH: PSH lands on the last
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    for s in &segs {
        c.push(s, &mut rec).unwrap();
    }
    assert!(rec.out.is_empty(), "held until the flush");
    assert_eq!(c.pending(), 3);
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out.len(), 1);
    let (h, f) = &rec.out[0];
    assert_eq!(
        (h.gso_type, h.gso_size, h.flags),
        (GSO_TCPV4, 4000, F_NEEDS_CSUM)
    );
    assert_eq!((h.csum_start, h.csum_offset, h.hdr_len), (34, 16, 66));
    assert_eq!(f.len(), 14 + 20 + 32 + 10_000);
    assert_eq!(&f[66..], &payload[..]);
    assert_eq!(
        usize::from(u16::from_be_bytes([f[16], f[17]])),
        f.len() - 14
    );
    assert_eq!(u32::from_be_bytes([f[38], f[39], f[40], f[41]]), 1000);
    assert!(f[47] & TCP_PSH != 0, "the last segment's PSH is kept");
    assert!(complete_ok(h, f));
    // Cutting it again gives back the very segments that came in.
    let p = plan(f, h).unwrap();
    let mut out = vec![0u8; 5000];
    for (i, s) in segs.iter().enumerate() {
        let n = segment(f, &p, i, &mut out).unwrap();
        assert_eq!(&out[..n], &s[..], "segment {i}");
    }
    assert_eq!(c.coalesced, (1, 3));
}

#[test]
fn a_single_segment_goes_out_untouched() {
    let segs = segments(&[7u8; 500], 1000, 0x10);
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    c.push(&segs[0], &mut rec).unwrap();
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out, vec![(plain_hdr(segs[0].len()), segs[0].clone())]);
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out.len(), 1, "nothing left");
}

#[test]
fn a_frame_written_whole_hints_its_headers_never_beyond_its_end() {
    for (len, hint) in [(60, 60), (127, 127), (128, 128), (129, 128), (4082, 128)] {
        let h = plain_hdr(len);
        assert_eq!(usize::from(h.hdr_len), hint, "{len}");
        // Nothing else: no offload is asked of the kernel for it.
        assert_eq!(VnetHdr { hdr_len: 0, ..h }, VnetHdr::default(), "{len}");
    }
    // Through the joiner: an ARP frame and a full-MTU frame that is not TCP.
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    let arp = vec![0xffu8; 60];
    let mut udp = vec![0u8; 4082];
    udp[12..14].copy_from_slice(&ETHERTYPE_IPV4.to_be_bytes());
    c.push(&arp, &mut rec).unwrap();
    c.push(&udp, &mut rec).unwrap();
    let hints: Vec<u16> = rec.out.iter().map(|(h, _)| h.hdr_len).collect();
    assert_eq!(hints, [60, 128]);
}

#[test]
fn anything_that_does_not_follow_breaks_the_run_in_order() {
    let segs = segments(&[1u8; 8000], 2000, 0x10);
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    // A gap (segment 2 missing), a frame that is not TCP, a bad checksum.
    c.push(&segs[0], &mut rec).unwrap();
    c.push(&segs[1], &mut rec).unwrap();
    c.push(&segs[3], &mut rec).unwrap(); // gap: flushes 0+1, starts a new run
    let arp = vec![0xffu8; 60];
    c.push(&arp, &mut rec).unwrap(); // not TCP: flushes, then goes out itself
    let mut bad = segs[2].clone();
    let last = bad.len() - 1;
    bad[last] ^= 0x55;
    c.push(&bad, &mut rec).unwrap(); // bad checksum: alone, for the kernel to drop
    c.flush(&mut rec).unwrap();
    let lens: Vec<usize> = rec.out.iter().map(|(_, f)| f.len()).collect();
    assert_eq!(lens, vec![66 + 4000, segs[3].len(), 60, bad.len()]);
    assert_eq!(rec.out[0].0.gso_type, GSO_TCPV4);
    assert_eq!(rec.out[1].0, plain_hdr(segs[3].len()));
    assert_eq!(rec.out[2].0, plain_hdr(60));
    assert_eq!(rec.out[3], (plain_hdr(bad.len()), bad));
}

#[test]
fn a_short_or_pushed_segment_ends_a_run() {
    // 2000, 2000, 1000 (short): then a new stream position cannot join.
    let segs = segments(&[3u8; 5000], 2000, 0x10);
    let more = segments(&[4u8; 2000], 2000, 0x10);
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    for s in &segs {
        c.push(s, &mut rec).unwrap();
    }
    c.push(&more[0], &mut rec).unwrap();
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out.len(), 2);
    assert_eq!(rec.out[0].1.len(), 66 + 5000);
    // Different options (a new timestamp) do not join either.
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    let mut other = segs[1].clone();
    other[60] = 2; // an option byte
    let c0 = u16::from_be_bytes([other[50], other[51]]);
    other[50..52].copy_from_slice(&(!fold(u64::from(!c0) + 0xfffe)).to_be_bytes());
    c.push(&segs[0], &mut rec).unwrap();
    c.push(&other, &mut rec).unwrap();
    c.flush(&mut rec).unwrap();
    assert_eq!(
        rec.out.len(),
        2,
        "{:?}",
        rec.out.iter().map(|o| o.1.len()).collect::<Vec<_>>()
    );
}

#[test]
fn a_failed_write_reports_every_frame_in_it() {
    let segs = segments(&[5u8; 6000], 2000, 0x10);
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    for s in &segs {
        c.push(s, &mut rec).unwrap();
    }
    rec.fail = true;
    let lost = c.flush(&mut rec).unwrap_err();
    assert_eq!(lost.frames, 3);
    assert_eq!(c.pending(), 0, "nothing is retried later");
    let lost = c.push(&[0u8; 60], &mut rec).unwrap_err();
    assert_eq!(lost.frames, 1);
}

/// A frame that does not join what is pending is not lost with it when writing the
/// pending frames fails: it is written (or held), and the loss counts what was lost.
#[test]
fn a_failed_flush_does_not_take_the_next_frame_with_it() {
    /// Fails its first write only.
    #[derive(Default)]
    struct FailOnce {
        failed: bool,
        out: Vec<Vec<u8>>,
    }
    impl FrameSink for FailOnce {
        fn write(&mut self, _: &[u8; VNET_HDR_LEN], frame: &[u8]) -> std::io::Result<()> {
            if !self.failed {
                self.failed = true;
                return Err(std::io::Error::other("queue full"));
            }
            self.out.push(frame.to_vec());
            Ok(())
        }
    }
    let segs = segments(&[5u8; 6000], 2000, 0x10);
    // A frame that is no candidate (not TCP): written at once after the failed flush.
    let mut c = Coalescer::new();
    let mut sink = FailOnce::default();
    c.push(&segs[0], &mut sink).unwrap();
    let other = [0u8; 60];
    let lost = c.push(&other, &mut sink).unwrap_err();
    assert_eq!(lost.frames, 1, "the pending segment, not the new frame");
    assert_eq!(sink.out, vec![other.to_vec()], "the new frame was written");
    // A segment of another flow: held after the failed flush, written by the next one.
    let mut c = Coalescer::new();
    let mut sink = FailOnce::default();
    c.push(&segs[0], &mut sink).unwrap();
    let mut other_flow = segs[1].clone();
    other_flow[14 + 20 + 1] ^= 1; // another source port
    let t0 = 14 + 20;
    other_flow[t0 + 16..t0 + 18].fill(0);
    let c16 = {
        let ip = &other_flow[14..34];
        let mut s = ipv4::ones_sum(&ip[12..20], 6 + (other_flow.len() - t0) as u64);
        s = ipv4::ones_sum(&other_flow[t0..], s);
        !ipv4::fold(s)
    };
    other_flow[t0 + 16..t0 + 18].copy_from_slice(&c16.to_be_bytes());
    let lost = c.push(&other_flow, &mut sink).unwrap_err();
    assert_eq!(lost.frames, 1);
    assert_eq!(c.pending(), 1, "the new segment is held");
    c.flush(&mut sink).unwrap();
    assert_eq!(sink.out, vec![other_flow]);
}

/// One TAP read into `s`: `hdr` and `frame`.
fn read_into(s: &mut Segmenter, hdr: &VnetHdr, frame: &[u8]) -> usize {
    let mut h = [0u8; VNET_HDR_LEN];
    hdr.emit(&mut h);
    let b = s.read_buf();
    b[..VNET_HDR_LEN].copy_from_slice(&h);
    b[VNET_HDR_LEN..VNET_HDR_LEN + frame.len()].copy_from_slice(frame);
    VNET_HDR_LEN + frame.len()
}

#[test]
fn the_segmenter_hands_out_a_super_frame_one_segment_per_call() {
    let f = tcp_frame(&[7u8; 5000], 0x18, 0);
    let want = plan(&f, &tso(2000)).unwrap();
    let mut s = Segmenter::new();
    let mut out = vec![0u8; 2100];
    assert!(!s.pending());
    assert_eq!(s.next_segment(&mut out), None, "nothing read yet");
    let n = read_into(&mut s, &tso(2000), &f);
    let Taken::Cut { plan: p, first } = s.take(n, &mut out).unwrap() else {
        panic!("a TSO read is cut");
    };
    assert_eq!(p, want);
    assert_eq!(s.super_frame(), &f[..]);
    let mut got = vec![out[..first.unwrap()].to_vec()];
    while s.pending() {
        let (pp, i, r) = s.next_segment(&mut out).unwrap();
        assert_eq!((pp, i), (want, got.len()));
        got.push(out[..r.unwrap()].to_vec());
    }
    assert_eq!(s.next_segment(&mut out), None);
    let mut cut = vec![0u8; 2100];
    let each: Vec<Vec<u8>> = (0..want.segments)
        .map(|i| {
            let n = segment(&f, &want, i, &mut cut).unwrap();
            cut[..n].to_vec()
        })
        .collect();
    assert_eq!(got, each, "the segments `segment` cuts, in order");
}

#[test]
fn the_segmenter_passes_a_plain_frame_and_completes_its_checksum() {
    let f = tcp_frame(&[3u8; 100], 0x18, 0);
    let mut s = Segmenter::new();
    let mut out = vec![0u8; 1600];
    let plain = VnetHdr::default();
    let n = read_into(&mut s, &plain, &f);
    assert_eq!(s.take(n, &mut out), Ok(Taken::Frame(f.len())));
    assert_eq!(&out[..f.len()], &f[..]);
    assert!(!s.pending());
    let partial = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 34,
        csum_offset: 16,
        ..VnetHdr::default()
    };
    let mut g = f.clone();
    let ps = fold(sum(&g[26..34], u64::from(TCP) + (g.len() - 34) as u64));
    g[50..52].copy_from_slice(&ps.to_be_bytes());
    let n = read_into(&mut s, &partial, &g);
    assert_eq!(s.take(n, &mut out), Ok(Taken::Frame(g.len())));
    assert!(tcp_ok(&out[..g.len()]));
}

#[test]
fn the_segmenter_refuses_what_it_cannot_carry_and_holds_nothing() {
    let f = tcp_frame(&[1u8; 3000], 0x10, 0);
    let mut s = Segmenter::new();
    let mut out = vec![0u8; 1600];
    // (case, header, frame, room, error)
    let udp = VnetHdr {
        gso_type: 3,
        ..tso(1000)
    };
    let far = VnetHdr {
        flags: F_NEEDS_CSUM,
        csum_start: 60_000,
        csum_offset: 6,
        ..VnetHdr::default()
    };
    assert_eq!(
        s.take(4, &mut out),
        Err(WireError::Truncated {
            what: "virtio_net_hdr",
            need: VNET_HDR_LEN,
            got: 4
        })
    );
    let n = read_into(&mut s, &udp, &f);
    assert_eq!(
        s.take(n, &mut out),
        Err(WireError::BadOffload(
            "a segmentation type other than TCP/IPv4 or TCP/IPv6"
        ))
    );
    let n = read_into(&mut s, &far, &f);
    assert!(s.take(n, &mut out).is_err());
    let n = read_into(&mut s, &VnetHdr::default(), &f);
    assert_eq!(s.take(n, &mut out), Err(WireError::FrameTooLong(f.len())));
    assert!(!s.pending());
    // A first segment that does not fit ends the super-frame: nothing more comes.
    let n = read_into(&mut s, &tso(1400), &f);
    let Ok(Taken::Cut { first, .. }) = s.take(n, &mut out[..100]) else {
        panic!("planned");
    };
    assert!(first.is_err());
    assert!(!s.pending());
    assert_eq!(s.next_segment(&mut out), None);
}

#[test]
fn the_joiner_reports_what_it_lost_and_joined_since_the_last_flush() {
    let segs = segments(&[5u8; 6000], 2000, 0x10);
    let mut j = Joiner::new();
    let mut rec = Rec::default();
    for s in &segs {
        j.push(s, &mut rec).unwrap();
    }
    assert_eq!(
        j.flush(&mut rec),
        Flushed {
            lost: 0,
            joined: (1, 3)
        }
    );
    assert_eq!(j.flush(&mut rec), Flushed::default(), "only what is new");
    for s in &segs {
        j.push(s, &mut rec).unwrap();
    }
    rec.fail = true;
    assert_eq!(
        j.flush(&mut rec),
        Flushed {
            lost: 3,
            joined: (0, 0)
        }
    );
    assert!(j.push(&[0u8; 60], &mut rec).is_err());
    assert!(j.push(&[0u8; 60], &mut rec).is_err());
    assert_eq!(
        j.flush(&mut rec),
        Flushed {
            lost: 2,
            joined: (0, 0)
        }
    );
    assert_eq!(j.coalesced(), (1, 3));
    assert_eq!(j.flush(&mut rec).lost, 0, "reported once");
}

proptest! {
    #[test]
    fn segments_rebuild_the_stream(
        payload in proptest::collection::vec(any::<u8>(), 0..9000),
        mss in 1u16..3000,
        options in 0usize..10,
    ) {
        let f = tcp_frame(&payload, 0x18, options * 4);
        let p = plan(&f, &tso(mss)).unwrap();
        let mut out = vec![0u8; 4000];
        let mut joined = Vec::new();
        for i in 0..p.segments {
            let n = segment(&f, &p, i, &mut out).unwrap();
            prop_assert!(n - p.headers() <= usize::from(mss));
            prop_assert!(tcp_ok(&out[..n]));
            prop_assert_eq!(ipv4::checksum(&out[14..14 + p.ip_hl]), 0);
            joined.extend_from_slice(&out[p.headers()..n]);
        }
        prop_assert_eq!(joined, payload);
    }

    #[test]
    fn coalescing_keeps_every_byte_in_order(
        payload in proptest::collection::vec(any::<u8>(), 1..20_000),
        mss in 500u16..4000,
        flush_every in 1usize..20,
    ) {
        let segs = segments(&payload, mss, 0x10);
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        for (i, s) in segs.iter().enumerate() {
            c.push(s, &mut rec).unwrap();
            if (i + 1) % flush_every == 0 {
                c.flush(&mut rec).unwrap();
            }
        }
        c.flush(&mut rec).unwrap();
        let mut joined = Vec::new();
        for (h, f) in &rec.out {
            if h.gso_type == GSO_TCPV4 {
                prop_assert!(complete_ok(h, f));
            } else {
                prop_assert!(tcp_ok(f));
            }
            joined.extend_from_slice(&f[66..]);
        }
        prop_assert_eq!(joined, payload);
    }

    #[test]
    fn arbitrary_bytes_never_panic(
        frame in proptest::collection::vec(any::<u8>(), 0..300),
        mss in 0u16..200,
    ) {
        if let Ok(p) = plan(&frame, &tso(mss)) {
            let mut out = vec![0u8; 600];
            for i in 0..p.segments.min(8) {
                let _ = segment(&frame, &p, i, &mut out);
            }
        }
        let mut f = frame.clone();
        let _ = finish_checksum(&mut f, 14, 6);
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        let _ = c.push(&frame, &mut rec);
        let _ = c.push(&frame, &mut rec);
        let _ = c.flush(&mut rec);
    }
}

// TCP over IPv6.

use super::super::ipv6::{self, PROTO_UDP};
use std::net::Ipv6Addr;

const SRC6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2);
const DST6: Ipv6Addr = Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 1);

/// A TCP/IPv6 frame [2001:2:0:1::2]:40000 -> [2001:2:0:1::1]:5201 with `payload`, seq
/// 1000, flags `flags`, traffic class 0x28, flow label 0x12345, hop limit 64, `options`
/// bytes of TCP options, and a valid TCP checksum.
fn tcp6_frame(payload: &[u8], flags: u8, options: usize) -> Vec<u8> {
    let tcp_hl = 20 + options;
    let plen = tcp_hl + payload.len();
    let mut f = vec![0u8; 14 + 40 + plen];
    f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
    let ip = &mut f[14..54];
    // Version 6, traffic class 0x28, flow label 0x12345.
    ip[0..4].copy_from_slice(&[0x62, 0x81, 0x23, 0x45]);
    ip[4..6].copy_from_slice(&(plen.min(65535) as u16).to_be_bytes());
    ip[6] = TCP;
    ip[7] = 64;
    ip[8..24].copy_from_slice(&SRC6.octets());
    ip[24..40].copy_from_slice(&DST6.octets());
    let t = &mut f[54..54 + tcp_hl];
    t[0..2].copy_from_slice(&40000u16.to_be_bytes());
    t[2..4].copy_from_slice(&5201u16.to_be_bytes());
    t[4..8].copy_from_slice(&1000u32.to_be_bytes());
    t[8..12].copy_from_slice(&5u32.to_be_bytes());
    t[12] = ((tcp_hl / 4) as u8) << 4;
    t[13] = flags;
    t[14..16].copy_from_slice(&512u16.to_be_bytes());
    for (k, b) in t[20..].iter_mut().enumerate() {
        *b = if k + 1 == options { 0 } else { 1 };
    }
    f[54 + tcp_hl..].copy_from_slice(payload);
    let c = ipv6::upper_checksum(&SRC6, &DST6, TCP, &f[54..]);
    f[70..72].copy_from_slice(&c.to_be_bytes());
    f
}

fn tso6(mss: u16) -> VnetHdr {
    VnetHdr {
        flags: F_NEEDS_CSUM,
        gso_type: GSO_TCPV6,
        hdr_len: 74,
        gso_size: mss,
        csum_start: 54,
        csum_offset: 16,
    }
}

/// The upper-layer checksum of a whole IPv6 frame verifies with `proto`'s pseudo-header
/// (computed by `ipv6::upper_checksum`, over what the payload length says).
fn upper6_ok(f: &[u8], proto: u8) -> bool {
    let ip = &f[14..];
    let plen = usize::from(u16::from_be_bytes([ip[4], ip[5]]));
    let a = |r: std::ops::Range<usize>| Ipv6Addr::from(<[u8; 16]>::try_from(&ip[r]).unwrap());
    plen + 40 == ip.len() && ipv6::upper_checksum(&a(8..24), &a(24..40), proto, &ip[40..]) == 0
}

fn tcp6_ok(f: &[u8]) -> bool {
    upper6_ok(f, TCP)
}

#[test]
fn a_tso6_super_frame_becomes_segments_the_peer_accepts() {
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i * 13) as u8).collect();
    let f = tcp6_frame(&payload, TCP_FIN | TCP_PSH | 0x10 | TCP_CWR, 12);
    let h = VnetHdr {
        gso_type: GSO_TCPV6 | GSO_ECN,
        ..tso6(4000)
    };
    let p = plan(&f, &h).unwrap();
    assert_eq!(
        (
            p.ipv6, p.ip_hl, p.tcp_hl, p.mss, p.payload, p.segments, p.ecn
        ),
        (true, 40, 32, 4000, 10_000, 3, true)
    );
    assert_eq!(p.headers(), 14 + 40 + 32);
    let mut out = vec![0u8; 9000];
    let mut joined = Vec::new();
    for i in 0..3 {
        let n = segment(&f, &p, i, &mut out).unwrap();
        let s = &out[..n];
        assert_eq!(n, p.segment_len(i));
        assert_eq!(n, 14 + 40 + 32 + [4000, 4000, 2000][i]);
        // Ethernet and IPv6 headers as they were, but for the payload length.
        assert_eq!(&s[..18], &f[..18]);
        assert_eq!(usize::from(u16::from_be_bytes([s[18], s[19]])), n - 54);
        assert_eq!(&s[20..54], &f[20..54]);
        let t = &s[54..];
        assert_eq!(
            u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
            1000 + 4000 * i as u32
        );
        assert_eq!(t[13] & TCP_PSH != 0, i == 2, "PSH on the last only");
        assert_eq!(t[13] & TCP_FIN != 0, i == 2, "FIN on the last only");
        assert_eq!(t[13] & TCP_CWR != 0, i == 0, "CWR on the first only");
        assert!(t[13] & 0x10 != 0, "ACK on all");
        assert!(
            tcp6_ok(s),
            "segment {i} TCP checksum over the IPv6 pseudo-header"
        );
        assert_eq!(
            &s[74..86],
            &f[74..86],
            "the options travel with every segment"
        );
        joined.extend_from_slice(&s[86..]);
    }
    assert_eq!(joined, payload);
    assert!(segment(&f, &p, 3, &mut out).is_err());
    assert!(segment(&f, &p, 0, &mut out[..100]).is_err());
}

#[test]
fn a_tso6_frame_without_payload_is_one_segment() {
    let f = tcp6_frame(&[], 0x10, 0);
    let p = plan(&f, &tso6(1000)).unwrap();
    assert_eq!(p.segments, 1);
    let mut out = vec![0u8; 100];
    let n = segment(&f, &p, 0, &mut out).unwrap();
    assert_eq!(&out[..n], &f[..]);
    assert!(tcp6_ok(&out[..n]));
}

#[test]
fn a_gso_type_of_the_other_family_is_refused() {
    let f4 = tcp_frame(&[1; 100], 0x10, 0);
    let f6 = tcp6_frame(&[1; 100], 0x10, 0);
    assert_eq!(
        plan(&f6, &tso(50)),
        Err(WireError::BadOffload(
            "TSO frame is IPv6 but its gso_type is TCP/IPv4"
        ))
    );
    assert_eq!(
        plan(&f4, &tso6(50)),
        Err(WireError::BadOffload(
            "TSO frame is IPv4 but its gso_type is TCP/IPv6"
        ))
    );
    let ecn4 = VnetHdr {
        gso_type: GSO_TCPV4 | GSO_ECN,
        ..tso(50)
    };
    assert!(
        plan(&f6, &ecn4).is_err(),
        "the ECN bit does not change the family"
    );
    assert!(plan(&f4, &ecn4).is_ok());
    assert!(plan(&f6, &tso6(50)).is_ok());
    let udp = VnetHdr {
        gso_type: 3,
        ..tso6(50)
    };
    assert_eq!(
        plan(&f6, &udp),
        Err(WireError::BadOffload(
            "a segmentation type other than TCP/IPv4 or TCP/IPv6"
        ))
    );
}

#[test]
fn what_is_not_tcp_right_behind_ipv6_is_refused() {
    let f = tcp6_frame(&[1; 100], 0x10, 0);
    assert_eq!(
        plan(&f[..53], &tso6(50)),
        Err(WireError::Truncated {
            what: "TSO frame",
            need: 54,
            got: 53
        })
    );
    assert!(matches!(
        plan(&f[..70], &tso6(50)),
        Err(WireError::Truncated { need: 74, .. })
    ));
    assert!(plan(&f, &tso6(0)).is_err(), "gso_size 0");
    let mut v4 = f.clone();
    v4[14] = 0x45;
    assert_eq!(
        plan(&v4, &tso6(50)),
        Err(WireError::BadOffload("TSO frame is not IPv6"))
    );
    let mut arp = f.clone();
    arp[12..14].copy_from_slice(&[0x08, 0x06]);
    assert_eq!(
        plan(&arp, &tso6(50)),
        Err(WireError::BadOffload("TSO frame is not IPv6"))
    );
    let mut udp = f.clone();
    udp[20] = PROTO_UDP;
    assert_eq!(
        plan(&udp, &tso6(50)),
        Err(WireError::BadOffload("TSO frame is not TCP"))
    );
    // Hop-by-hop options, routing, fragment, destination options in front of TCP.
    for next in [0, 43, 44, 60] {
        let mut ext = f.clone();
        ext[20] = next;
        assert_eq!(
            plan(&ext, &tso6(50)),
            Err(WireError::BadOffload(
                "TSO frame has IPv6 extension headers (only TCP right behind the IPv6 header is cut)"
            )),
            "next header {next}"
        );
    }
    let mut short_tcp = f.clone();
    short_tcp[54 + 12] = 0xf0;
    short_tcp.truncate(54 + 40);
    assert_eq!(
        plan(&short_tcp, &tso6(50)),
        Err(WireError::BadOffload("TSO frame's TCP header is cut short"))
    );
}

#[test]
fn a_segment_longer_than_an_ip_length_field_is_refused() {
    // 65,515 payload bytes with an MSS as large: one IPv6 segment of payload length
    // 65,535 fits; one byte more does not. An IPv4 segment holds 20 bytes less.
    let f = tcp6_frame(&vec![0; 65_515], 0x10, 0);
    assert_eq!(plan(&f, &tso6(u16::MAX)).unwrap().segments, 1);
    let f = tcp6_frame(&vec![0; 65_516], 0x10, 0);
    assert!(plan(&f, &tso6(u16::MAX)).is_err());
    assert_eq!(plan(&f, &tso6(60_000)).unwrap().segments, 2);
    let f = tcp_frame(&vec![0; 65_496], 0x10, 0);
    assert!(plan(&f, &tso(u16::MAX)).is_err());
}

#[test]
fn a_partial_tcp6_or_udp6_checksum_is_completed() {
    let mut f = tcp6_frame(&[5u8; 301], 0x18, 0);
    // The pseudo-header sum, not complemented, in the TCP checksum field.
    let ps = fold(sum(&f[22..54], 0) + u64::from(TCP) + (f.len() - 54) as u64);
    f[70..72].copy_from_slice(&ps.to_be_bytes());
    assert!(!tcp6_ok(&f));
    finish_checksum(&mut f, 54, 16).unwrap();
    assert!(tcp6_ok(&f));

    // UDP over IPv6 whose checksum comes to 0: it must be sent as 0xffff (RFC 8200
    // §8.1: a zero UDP checksum over IPv6 is discarded by the receiver).
    let udp6 = |payload: &[u8]| {
        let mut f = vec![0u8; 54];
        f[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        f[14] = 0x60;
        let ulen = 8 + payload.len();
        f[18..20].copy_from_slice(&(ulen as u16).to_be_bytes());
        f[20] = PROTO_UDP;
        f[21] = 64;
        f[22..38].copy_from_slice(&SRC6.octets());
        f[38..54].copy_from_slice(&DST6.octets());
        f.extend_from_slice(&5353u16.to_be_bytes());
        f.extend_from_slice(&5353u16.to_be_bytes());
        f.extend_from_slice(&(ulen as u16).to_be_bytes());
        f.extend_from_slice(&[0, 0]);
        f.extend_from_slice(payload);
        let ps = fold(sum(&f[22..54], 0) + u64::from(PROTO_UDP) + ulen as u64);
        f[60..62].copy_from_slice(&ps.to_be_bytes());
        f
    };
    let mut g = udp6(b"query!");
    finish_checksum(&mut g, 54, 6).unwrap();
    assert!(upper6_ok(&g, PROTO_UDP));
    // A last word chosen so that everything sums to 0xffff (checksum 0).
    let mut z = udp6(&[0xab, 0xcd, 0, 0]);
    let s0 = fold(sum(&z[54..], 0));
    z[64..66].copy_from_slice(&(!s0).to_be_bytes());
    // The partial sum in the field counts: recompute with it in place.
    assert_eq!(fold(sum(&z[54..], 0)), 0xffff);
    finish_checksum(&mut z, 54, 6).unwrap();
    assert_eq!(&z[60..62], &[0xff, 0xff], "0 is sent as 0xffff");
    assert!(upper6_ok(&z, PROTO_UDP));
}

#[test]
fn the_segmenter_cuts_a_tso6_read() {
    let f = tcp6_frame(&[7u8; 5000], 0x18, 0);
    let want = plan(&f, &tso6(2000)).unwrap();
    let mut s = Segmenter::new();
    let mut out = vec![0u8; 2100];
    let n = read_into(&mut s, &tso6(2000), &f);
    let Taken::Cut { plan: p, first } = s.take(n, &mut out).unwrap() else {
        panic!("a TSO6 read is cut");
    };
    assert_eq!(p, want);
    let mut got = vec![out[..first.unwrap()].to_vec()];
    while let Some((_, _, r)) = s.next_segment(&mut out) {
        got.push(out[..r.unwrap()].to_vec());
    }
    let lens: Vec<usize> = got.iter().map(Vec::len).collect();
    assert_eq!(lens, vec![74 + 2000, 74 + 2000, 74 + 1000]);
    assert!(got.iter().all(|g| tcp6_ok(g)));
    assert!(got[..2].iter().all(|g| g[67] & TCP_PSH == 0));
    assert!(got[2][67] & TCP_PSH != 0);
    // The wrong family for the frame: refused, nothing handed out.
    let n = read_into(&mut s, &tso(2000), &f);
    assert_eq!(
        s.take(n, &mut out),
        Err(WireError::BadOffload(
            "TSO frame is IPv6 but its gso_type is TCP/IPv4"
        ))
    );
    assert!(!s.pending());
}

/// The segments of an IPv6 stream of `payload` cut at `mss`.
fn segments6(payload: &[u8], mss: u16, flags: u8) -> Vec<Vec<u8>> {
    let f = tcp6_frame(payload, flags, 12);
    let p = plan(&f, &tso6(mss)).unwrap();
    let mut out = vec![0u8; 70_000];
    (0..p.segments)
        .map(|i| {
            let n = segment(&f, &p, i, &mut out).unwrap();
            out[..n].to_vec()
        })
        .collect()
}

/// Complete a coalesced IPv6 frame's partial checksum and check it.
fn complete6_ok(hdr: &VnetHdr, f: &[u8]) -> bool {
    let mut f = f.to_vec();
    finish_checksum(&mut f, hdr.csum_start.into(), hdr.csum_offset.into()).unwrap();
    tcp6_ok(&f)
}

#[test]
fn consecutive_v6_segments_are_joined_into_one_super_frame() {
    let payload: Vec<u8> = (0..10_000u32).map(|i| (i % 253) as u8).collect();
    let segs = segments6(&payload, 4000, 0x18);
    assert!(segs.iter().all(|s| tcp6_ok(s)));
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    for s in &segs {
        c.push(s, &mut rec).unwrap();
    }
    assert!(rec.out.is_empty(), "held until the flush");
    assert_eq!(c.pending(), 3);
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out.len(), 1);
    let (h, f) = &rec.out[0];
    assert_eq!(
        (h.gso_type, h.gso_size, h.flags),
        (GSO_TCPV6, 4000, F_NEEDS_CSUM)
    );
    assert_eq!((h.csum_start, h.csum_offset, h.hdr_len), (54, 16, 86));
    assert_eq!(f.len(), 14 + 40 + 32 + 10_000);
    assert_eq!(&f[86..], &payload[..]);
    assert_eq!(
        usize::from(u16::from_be_bytes([f[18], f[19]])),
        f.len() - 54,
        "the joined payload length"
    );
    assert_eq!(u32::from_be_bytes([f[58], f[59], f[60], f[61]]), 1000);
    assert!(f[67] & TCP_PSH != 0, "the last segment's PSH is kept");
    assert!(complete6_ok(h, f));
    let p = plan(f, h).unwrap();
    let mut out = vec![0u8; 5000];
    for (i, s) in segs.iter().enumerate() {
        let n = segment(f, &p, i, &mut out).unwrap();
        assert_eq!(&out[..n], &s[..], "segment {i}");
    }
    assert_eq!(c.coalesced, (1, 3));
}

/// `f` with byte `at` set to `v` and the TCP checksum fixed (IPv6 segments).
fn edit6(f: &[u8], at: usize, v: u8) -> Vec<u8> {
    let mut g = f.to_vec();
    g[at] = v;
    g[70..72].copy_from_slice(&[0, 0]);
    let (a, b) = (
        Ipv6Addr::from(<[u8; 16]>::try_from(&g[22..38]).unwrap()),
        Ipv6Addr::from(<[u8; 16]>::try_from(&g[38..54]).unwrap()),
    );
    let c = ipv6::upper_checksum(&a, &b, TCP, &g[54..]);
    g[70..72].copy_from_slice(&c.to_be_bytes());
    assert!(tcp6_ok(&g));
    g
}

#[test]
fn v6_segments_differing_in_a_header_field_or_family_do_not_join() {
    let segs = segments6(&[2u8; 6000], 2000, 0x10);
    // Traffic class, flow label, hop limit, a source address byte, a destination
    // address byte, a port: each makes the second segment a run of its own.
    for at in [14, 15, 17, 21, 37, 53, 55] {
        let other = edit6(&segs[1], at, segs[1][at] ^ 0x01);
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        c.push(&segs[0], &mut rec).unwrap();
        c.push(&other, &mut rec).unwrap();
        c.flush(&mut rec).unwrap();
        assert_eq!(rec.out.len(), 2, "byte {at}");
        assert!(rec.out.iter().all(|(h, f)| *h == plain_hdr(f.len())));
    }
    // A bad checksum, an extension header, a payload length that is not the frame's.
    let mut bad = segs[1].clone();
    bad[100] ^= 0x10;
    let mut ext = segs[1].clone();
    ext[20] = 60;
    let mut long = segs[1].clone();
    long[19] = long[19].wrapping_sub(1);
    for g in [bad, ext, long] {
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        c.push(&segs[0], &mut rec).unwrap();
        c.push(&g, &mut rec).unwrap();
        c.flush(&mut rec).unwrap();
        assert_eq!(rec.out.len(), 2);
        assert_eq!(rec.out[1], (plain_hdr(g.len()), g), "goes out untouched");
    }
    // IPv4 and IPv6 segments of the same ports and sequence numbers, interleaved:
    // never one run.
    let v4 = segments(&[2u8; 6000], 2000, 0x10);
    let mut c = Coalescer::new();
    let mut rec = Rec::default();
    for (a, b) in v4.iter().zip(&segs) {
        c.push(a, &mut rec).unwrap();
        c.push(b, &mut rec).unwrap();
    }
    c.flush(&mut rec).unwrap();
    assert_eq!(rec.out.len(), 6);
    // One family after the other: two runs, one of each.
    let mut rec = Rec::default();
    for s in v4.iter().chain(&segs) {
        c.push(s, &mut rec).unwrap();
    }
    c.flush(&mut rec).unwrap();
    let types: Vec<u8> = rec.out.iter().map(|(h, _)| h.gso_type).collect();
    assert_eq!(types, vec![GSO_TCPV4, GSO_TCPV6]);
    assert_eq!(c.coalesced, (2, 6));
}

proptest! {
    #[test]
    fn v6_segments_rebuild_the_stream(
        payload in proptest::collection::vec(any::<u8>(), 0..9000),
        mss in 1u16..3000,
        options in 0usize..10,
        flags in prop_oneof![Just(0x10u8), Just(0x18), Just(0x19), Just(0x98)],
    ) {
        let f = tcp6_frame(&payload, flags, options * 4);
        let p = plan(&f, &tso6(mss)).unwrap();
        let mut out = vec![0u8; 4000];
        let mut joined = Vec::new();
        for i in 0..p.segments {
            let n = segment(&f, &p, i, &mut out).unwrap();
            prop_assert!(n - p.headers() <= usize::from(mss));
            prop_assert!(tcp6_ok(&out[..n]));
            let last = i + 1 == p.segments;
            prop_assert_eq!(out[67] & (TCP_FIN | TCP_PSH), if last { flags & 0x09 } else { 0 });
            prop_assert_eq!(out[67] & TCP_CWR, if i == 0 { flags & TCP_CWR } else { 0 });
            joined.extend_from_slice(&out[p.headers()..n]);
        }
        prop_assert_eq!(joined, payload);
    }

    #[test]
    fn v6_coalescing_keeps_every_byte_in_order(
        payload in proptest::collection::vec(any::<u8>(), 1..20_000),
        mss in 500u16..4000,
        flush_every in 1usize..20,
    ) {
        let segs = segments6(&payload, mss, 0x10);
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        for (i, s) in segs.iter().enumerate() {
            c.push(s, &mut rec).unwrap();
            if (i + 1) % flush_every == 0 {
                c.flush(&mut rec).unwrap();
            }
        }
        c.flush(&mut rec).unwrap();
        let mut joined = Vec::new();
        for (h, f) in &rec.out {
            if h.gso_type == GSO_TCPV6 {
                prop_assert!(complete6_ok(h, f));
            } else {
                prop_assert_eq!(*h, plain_hdr(f.len()));
                prop_assert!(tcp6_ok(f));
            }
            joined.extend_from_slice(&f[86..]);
        }
        prop_assert_eq!(joined, payload);
    }

    #[test]
    fn arbitrary_v6_frames_never_panic(
        tail in proptest::collection::vec(any::<u8>(), 0..300),
        next in prop_oneof![Just(TCP), Just(0u8), Just(60), any::<u8>()],
        mss in 0u16..200,
        gso in prop_oneof![Just(GSO_TCPV6), Just(GSO_TCPV4), Just(GSO_TCPV6 | GSO_ECN), any::<u8>()],
        cut in 0usize..400,
    ) {
        // An Ethernet + IPv6 header (next header `next`), then random bytes.
        let mut frame = vec![0u8; 54];
        frame[12..14].copy_from_slice(&ETHERTYPE_IPV6.to_be_bytes());
        frame[14] = 0x60;
        frame[18..20].copy_from_slice(&(tail.len() as u16).to_be_bytes());
        frame[20] = next;
        frame.extend_from_slice(&tail);
        frame.truncate(cut.max(14));
        let hdr = VnetHdr { gso_type: gso, ..tso6(mss) };
        if let Ok(p) = plan(&frame, &hdr) {
            prop_assert!(p.ipv6);
            prop_assert_eq!(p.headers() + p.payload, frame.len());
            let mut out = vec![0u8; 600];
            for i in 0..p.segments.min(8) {
                if let Ok(n) = segment(&frame, &p, i, &mut out) {
                    prop_assert!(tcp6_ok(&out[..n]));
                }
            }
        }
        let mut s = Segmenter::new();
        let mut out = vec![0u8; 600];
        let n = read_into(&mut s, &hdr, &frame);
        let _ = s.take(n, &mut out);
        while let Some((_, _, r)) = s.next_segment(&mut out) {
            let _ = r;
        }
        let mut f = frame.clone();
        let _ = finish_checksum(&mut f, 54, 16);
        let mut c = Coalescer::new();
        let mut rec = Rec::default();
        let _ = c.push(&frame, &mut rec);
        let _ = c.push(&frame, &mut rec);
        let _ = c.flush(&mut rec);
    }
}
