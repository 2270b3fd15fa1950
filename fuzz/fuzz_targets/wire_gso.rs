//! TAP offloads (`wire::offload`). The mode byte picks what the records are:
//! - even: one `virtio_net_hdr` + frame per record, as a TAP read: the header written
//!   back byte for byte; a partial checksum completed (nothing else changes); a TSO
//!   super-frame (TCP over IPv4 or IPv6) planned, only with the `gso_type` of its
//!   EtherType's family, and cut into every segment (each checked: length, IP length
//!   field, payload, sequence number, checksums), and the segments joined again by the
//!   `Coalescer`; the same frame is also planned with the other family's `gso_type`,
//!   which must be refused;
//! - odd: frames handed to the `Coalescer` in order (what GRO is given on receive).
//!
//! Whatever the coalescer writes must cut back, segment for segment, into what it was
//! given, with valid checksums.
#![no_main]

use libfuzzer_sys::fuzz_target;
use uipoib::wire::offload::{
    self, Coalescer, FrameSink, GSO_ECN, GSO_TCPV4, GSO_TCPV6, VNET_HDR_LEN, VnetHdr,
};
use uipoib::wire::{ETHERTYPE_IPV4, ETHERTYPE_IPV6};
use uipoib_fuzz::{checks, input};

type Delivered = Vec<([u8; VNET_HDR_LEN], Vec<u8>)>;

struct Sink<'a>(&'a mut Delivered);

impl FrameSink for Sink<'_> {
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> std::io::Result<()> {
        self.0.push((*hdr, frame.to_vec()));
        Ok(())
    }
}

fn coalesce(frames: &[Vec<u8>]) {
    let mut c = Coalescer::new();
    let mut out = Delivered::new();
    for f in frames {
        c.push(f, &mut Sink(&mut out))
            .expect("the sink does not fail");
    }
    c.flush(&mut Sink(&mut out))
        .expect("the sink does not fail");
    assert_eq!(c.pending(), 0);
    checks::check_coalesced(frames, &out);
}

fn tap_read(read: &[u8]) {
    let Ok(hdr) = VnetHdr::parse(read) else {
        assert!(read.len() < VNET_HDR_LEN);
        return;
    };
    let mut back = [0u8; VNET_HDR_LEN];
    hdr.emit(&mut back);
    assert_eq!(back[..], read[..VNET_HDR_LEN]);
    let frame = &read[VNET_HDR_LEN..];
    if hdr.flags & offload::F_NEEDS_CSUM != 0 {
        let mut f = frame.to_vec();
        let (start, off) = (usize::from(hdr.csum_start), usize::from(hdr.csum_offset));
        if offload::finish_checksum(&mut f, start, off).is_ok() {
            let at = start + off;
            assert!(at + 2 <= f.len());
            assert_eq!(f[..at], frame[..at]);
            assert_eq!(f[at + 2..], frame[at + 2..]);
        }
    }
    let family = hdr.gso_type & !GSO_ECN;
    if let Ok(p) = offload::plan(frame, &hdr) {
        let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
        let (want, gso) = if p.ipv6 {
            (ETHERTYPE_IPV6, GSO_TCPV6)
        } else {
            (ETHERTYPE_IPV4, GSO_TCPV4)
        };
        assert_eq!(ethertype, want, "planned a frame of the other family");
        assert_eq!(family, gso, "planned with a gso_type of the other family");
        let other = VnetHdr {
            gso_type: hdr.gso_type ^ (GSO_TCPV4 | GSO_TCPV6),
            ..hdr
        };
        assert!(
            offload::plan(frame, &other).is_err(),
            "planned with the gso_type of both families"
        );
        assert!(p.headers() <= frame.len());
        assert_eq!(p.headers() + p.payload, frame.len());
        // Keep each run short: a 1-byte MSS over a long frame is many segments.
        if p.segments <= 512 {
            let segs = checks::cut(frame, &p);
            coalesce(&segs);
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let (mode, records) = input::split(data);
    if mode & 1 == 0 {
        for r in &records {
            tap_read(r.bytes);
        }
    } else {
        let frames: Vec<Vec<u8>> = records.iter().map(|r| r.bytes.to_vec()).collect();
        coalesce(&frames);
    }
});
