//! TAP offloads: the `virtio_net_hdr` a TAP opened with `IFF_VNET_HDR` puts in front of
//! every frame, completing a partial checksum, and cutting a TCP/IPv4 super-frame (TSO,
//! up to 64 KiB) into MSS-sized segments, each with its own IPv4 id, TCP sequence
//! number, flags and checksums, as the kernel's own GSO would.
//!
//! With these, one TAP read carries up to 64 KiB of a TCP stream where it would carry
//! one MTU, and the kernel's TCP stack handles one large packet instead of many.

use super::ipv4::{self, fold, ones_sum as sum};
use super::{ETHERTYPE_IPV4, WireError};

/// Length of the `virtio_net_hdr` (without `num_buffers`) set with `TUNSETVNETHDRSZ`.
pub const VNET_HDR_LEN: usize = 10;
/// `flags`: the checksum at `csum_start + csum_offset` is partial.
pub const F_NEEDS_CSUM: u8 = 1;
/// `gso_type`: not a super-frame.
pub const GSO_NONE: u8 = 0;
/// `gso_type`: TCP over IPv4.
pub const GSO_TCPV4: u8 = 1;
/// `gso_type` bit: the stream uses ECN (CWR goes on the first segment only).
pub const GSO_ECN: u8 = 0x80;
/// The largest frame a TAP read returns with offloads on (an IPv4 packet of 64 KiB and
/// its Ethernet header).
pub const MAX_SUPER_FRAME: usize = 14 + 65_535;

const ETH: usize = 14;
const TCP: u8 = 6;
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// A `virtio_net_hdr` (little-endian, as on the hosts this runs on).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct VnetHdr {
    /// `F_NEEDS_CSUM`, ...
    pub flags: u8,
    /// `GSO_NONE`, `GSO_TCPV4`, ... with `GSO_ECN`.
    pub gso_type: u8,
    /// Length of the headers (a hint).
    pub hdr_len: u16,
    /// Payload bytes per segment (the MSS).
    pub gso_size: u16,
    /// Where the checksummed range starts.
    pub csum_start: u16,
    /// Where in it the checksum field is.
    pub csum_offset: u16,
}

impl VnetHdr {
    /// Parse the first [`VNET_HDR_LEN`] bytes of `b`.
    pub fn parse(b: &[u8]) -> Result<VnetHdr, WireError> {
        if b.len() < VNET_HDR_LEN {
            return Err(WireError::Truncated {
                what: "virtio_net_hdr",
                need: VNET_HDR_LEN,
                got: b.len(),
            });
        }
        let u = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
        Ok(VnetHdr {
            flags: b[0],
            gso_type: b[1],
            hdr_len: u(2),
            gso_size: u(4),
            csum_start: u(6),
            csum_offset: u(8),
        })
    }

    /// Write it to the first [`VNET_HDR_LEN`] bytes of `b`.
    pub fn emit(&self, b: &mut [u8; VNET_HDR_LEN]) {
        b[0] = self.flags;
        b[1] = self.gso_type;
        b[2..4].copy_from_slice(&self.hdr_len.to_le_bytes());
        b[4..6].copy_from_slice(&self.gso_size.to_le_bytes());
        b[6..8].copy_from_slice(&self.csum_start.to_le_bytes());
        b[8..10].copy_from_slice(&self.csum_offset.to_le_bytes());
    }
}

/// Complete a partial checksum (`F_NEEDS_CSUM`): the field at `start + offset` holds the
/// pseudo-header sum; the sum from `start` to the end of the frame goes there.
pub fn finish_checksum(frame: &mut [u8], start: usize, offset: usize) -> Result<(), WireError> {
    let at = start
        .checked_add(offset)
        .filter(|a| *a < usize::MAX - 2)
        .ok_or(WireError::BadOffload("checksum offset out of range"))?;
    if at + 2 > frame.len() {
        return Err(WireError::Truncated {
            what: "partial checksum",
            need: at + 2,
            got: frame.len(),
        });
    }
    let mut c = !fold(sum(&frame[start..], 0));
    // A UDP checksum of 0 means "none": the kernel writes 0xffff instead; for TCP the
    // two are the same value.
    if c == 0 {
        c = 0xffff;
    }
    frame[at..at + 2].copy_from_slice(&c.to_be_bytes());
    Ok(())
}

/// How a TCP/IPv4 super-frame is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// IPv4 header length.
    pub ip_hl: usize,
    /// TCP header length.
    pub tcp_hl: usize,
    /// Payload bytes per segment.
    pub mss: usize,
    /// Payload bytes in all.
    pub payload: usize,
    /// Segments (at least 1).
    pub segments: usize,
    /// Whether CWR stays on the first segment only.
    pub ecn: bool,
}

impl Plan {
    /// Ethernet, IPv4 and TCP headers.
    pub fn headers(&self) -> usize {
        ETH + self.ip_hl + self.tcp_hl
    }

    /// The length of segment `i`'s frame.
    pub fn segment_len(&self, i: usize) -> usize {
        let start = i * self.mss;
        self.headers() + self.mss.min(self.payload.saturating_sub(start))
    }
}

/// Check a TSO super-frame (Ethernet + IPv4 + TCP + payload) and plan its segments.
pub fn plan(frame: &[u8], hdr: &VnetHdr) -> Result<Plan, WireError> {
    if frame.len() < ETH + 20 {
        return Err(WireError::Truncated {
            what: "TSO frame",
            need: ETH + 20,
            got: frame.len(),
        });
    }
    if u16::from_be_bytes([frame[12], frame[13]]) != ETHERTYPE_IPV4 {
        return Err(WireError::BadOffload("TSO frame is not IPv4"));
    }
    let ip = &frame[ETH..];
    if ip[0] >> 4 != 4 {
        return Err(WireError::BadOffload("TSO frame is not IPv4"));
    }
    let ip_hl = usize::from(ip[0] & 0x0f) * 4;
    if ip_hl < 20 || ip[9] != TCP {
        return Err(WireError::BadOffload("TSO frame is not TCP"));
    }
    if ip.len() < ip_hl + 20 {
        return Err(WireError::Truncated {
            what: "TSO frame",
            need: ETH + ip_hl + 20,
            got: frame.len(),
        });
    }
    let tcp_hl = usize::from(ip[ip_hl + 12] >> 4) * 4;
    if tcp_hl < 20 || ip.len() < ip_hl + tcp_hl {
        return Err(WireError::BadOffload("TSO frame's TCP header is cut short"));
    }
    let mss = usize::from(hdr.gso_size);
    if mss == 0 {
        return Err(WireError::BadOffload("TSO frame with gso_size 0"));
    }
    let payload = ip.len() - ip_hl - tcp_hl;
    Ok(Plan {
        ip_hl,
        tcp_hl,
        mss,
        payload,
        segments: payload.div_ceil(mss).max(1),
        ecn: hdr.gso_type & GSO_ECN != 0,
    })
}

/// Write segment `i` of the super-frame `frame` (planned by [`plan`]) to `out`, with
/// its own IPv4 total length, id and checksum, TCP sequence number, flags (FIN and PSH
/// on the last segment only, CWR on the first only) and TCP checksum. Returns its length.
pub fn segment(frame: &[u8], p: &Plan, i: usize, out: &mut [u8]) -> Result<usize, WireError> {
    let len = p.segment_len(i);
    if i >= p.segments {
        return Err(WireError::BadOffload("no such segment"));
    }
    if out.len() < len {
        return Err(WireError::Truncated {
            what: "segment buffer",
            need: len,
            got: out.len(),
        });
    }
    let h = p.headers();
    let start = i * p.mss;
    let seg = len - h;
    out[..h].copy_from_slice(&frame[..h]);
    out[h..len].copy_from_slice(&frame[h + start..h + start + seg]);

    // IPv4: total length, id, checksum.
    let ip = &mut out[ETH..ETH + p.ip_hl];
    let total = (p.ip_hl + p.tcp_hl + seg) as u16;
    ip[2..4].copy_from_slice(&total.to_be_bytes());
    let id = u16::from_be_bytes([ip[4], ip[5]]).wrapping_add(i as u16);
    ip[4..6].copy_from_slice(&id.to_be_bytes());
    ip[10..12].copy_from_slice(&[0, 0]);
    let c = ipv4::checksum(ip);
    ip[10..12].copy_from_slice(&c.to_be_bytes());

    // TCP: sequence number, flags, checksum.
    let t0 = ETH + p.ip_hl;
    let tcp = &mut out[t0..t0 + p.tcp_hl];
    let seq = u32::from_be_bytes([tcp[4], tcp[5], tcp[6], tcp[7]]).wrapping_add(start as u32);
    tcp[4..8].copy_from_slice(&seq.to_be_bytes());
    if i + 1 < p.segments {
        tcp[13] &= !(TCP_FIN | TCP_PSH);
    }
    if i > 0 {
        tcp[13] &= !TCP_CWR;
    }
    tcp[16..18].copy_from_slice(&[0, 0]);
    let ip = &out[ETH..ETH + p.ip_hl];
    let tcp_len = (p.tcp_hl + seg) as u16;
    let mut s = sum(&ip[12..20], 0);
    s += u64::from(TCP) + u64::from(tcp_len);
    s = sum(&out[t0..len], s);
    let c = !fold(s);
    out[t0 + 16..t0 + 18].copy_from_slice(&c.to_be_bytes());
    Ok(len)
}

/// The writer a [`Coalescer`] hands its frames to: a `virtio_net_hdr` and a frame.
pub trait FrameSink {
    /// Write one frame behind its header.
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> std::io::Result<()>;
}

/// Frames a [`Coalescer`] could not write, and why.
#[derive(Debug)]
pub struct Lost {
    /// How many received frames were in what failed to be written.
    pub frames: usize,
    /// The write's error.
    pub error: std::io::Error,
}

const TCP_SYN: u8 = 0x02;
const TCP_RST: u8 = 0x04;
const TCP_ACK: u8 = 0x10;
const TCP_URG: u8 = 0x20;
const TCP_ECE: u8 = 0x40;
/// IPv4 header bytes that must match for two segments to join (all but total length,
/// id and checksum), as ranges.
const IP_SAME: [std::ops::Range<usize>; 3] = [0..2, 6..10, 12..20];

/// Receive-side coalescing (what the kernel's GRO does): consecutive, full-sized TCP
/// segments of one IPv4 flow with identical headers (options included) and valid
/// checksums are joined into one super-frame of up to 64 KiB, written to the TAP with a
/// `virtio_net_hdr` that describes its segments and a partial checksum, so the kernel's
/// TCP takes them in one go. Anything else, or a segment that does not follow, is
/// written on its own (after what is pending, so order is kept) with an empty header:
/// the kernel checks its checksums itself. The caller calls [`Coalescer::flush`] at
/// the end of each batch of receives.
pub struct Coalescer {
    buf: Vec<u8>,
    /// Bytes of the pending frame (0: nothing pending).
    len: usize,
    /// Received segments in it.
    segs: usize,
    /// TCP header length of the pending frame.
    tcp_hl: usize,
    /// Payload of its first segment (the segment size).
    mss: usize,
    /// The sequence number the next segment must have.
    next_seq: u32,
    /// A short or PSH segment ended it: nothing more joins.
    closed: bool,
    /// Super-frames written, and the segments in them.
    pub coalesced: (u64, u64),
}

impl Default for Coalescer {
    fn default() -> Self {
        Coalescer::new()
    }
}

/// A TCP/IPv4 segment that may join: its TCP header length, payload, sequence number.
fn candidate(f: &[u8]) -> Option<(usize, usize, u32)> {
    if f.len() < ETH + 40 || u16::from_be_bytes([f[12], f[13]]) != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = &f[ETH..];
    // No IPv4 options, exactly the frame's length, DF, not a fragment, TCP.
    if ip[0] != 0x45
        || usize::from(u16::from_be_bytes([ip[2], ip[3]])) != ip.len()
        || ip[6] & 0x7f != 0x40
        || ip[7] != 0
        || ip[9] != TCP
    {
        return None;
    }
    let t = &ip[20..];
    let tcp_hl = usize::from(t[12] >> 4) * 4;
    if tcp_hl < 20 || t.len() <= tcp_hl {
        return None;
    }
    let fl = t[13];
    if fl & (TCP_SYN | TCP_FIN | TCP_RST | TCP_URG | TCP_ECE | TCP_CWR) != 0 || fl & TCP_ACK == 0 {
        return None;
    }
    if ipv4::checksum(&ip[..20]) != 0 {
        return None;
    }
    let s = sum(&ip[12..20], u64::from(TCP) + t.len() as u64);
    if fold(sum(t, s)) != 0xffff {
        return None;
    }
    Some((
        tcp_hl,
        t.len() - tcp_hl,
        u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
    ))
}

impl Coalescer {
    /// An empty coalescer (its buffer is allocated here, once).
    pub fn new() -> Coalescer {
        Coalescer {
            buf: vec![0; MAX_SUPER_FRAME],
            len: 0,
            segs: 0,
            tcp_hl: 0,
            mss: 0,
            next_seq: 0,
            closed: false,
            coalesced: (0, 0),
        }
    }

    /// Segments pending.
    pub fn pending(&self) -> usize {
        self.segs
    }

    /// Whether segment `f` (a candidate) continues the pending frame.
    fn follows(&self, f: &[u8], tcp_hl: usize, payload: usize, seq: u32) -> bool {
        if self.segs == 0 || self.closed || tcp_hl != self.tcp_hl || seq != self.next_seq {
            return false;
        }
        if payload > self.mss || self.len + payload > MAX_SUPER_FRAME {
            return false;
        }
        let (p, t0) = (&self.buf[..self.len], ETH + 20);
        f[..ETH] == p[..ETH]
            && IP_SAME.iter().all(|r| f[ETH + r.start..ETH + r.end] == p[ETH + r.start..ETH + r.end])
            // Ports; then acknowledgement, data offset, flags but PSH, window; then the
            // urgent pointer and every option.
            && f[t0..t0 + 4] == p[t0..t0 + 4]
            && f[t0 + 8..t0 + 13] == p[t0 + 8..t0 + 13]
            && f[t0 + 13] & !TCP_PSH == p[t0 + 13] & !TCP_PSH
            && f[t0 + 14..t0 + 16] == p[t0 + 14..t0 + 16]
            && f[t0 + 18..t0 + tcp_hl] == p[t0 + 18..t0 + tcp_hl]
    }

    /// Take one received frame.
    pub fn push(&mut self, f: &[u8], sink: &mut dyn FrameSink) -> Result<(), Lost> {
        let Some((tcp_hl, payload, seq)) = candidate(f) else {
            self.flush(sink)?;
            return write_one(f, sink);
        };
        if !self.follows(f, tcp_hl, payload, seq) {
            self.flush(sink)?;
            if f.len() > self.buf.len() {
                return write_one(f, sink);
            }
            self.buf[..f.len()].copy_from_slice(f);
            self.len = f.len();
            self.segs = 1;
            self.tcp_hl = tcp_hl;
            self.mss = payload;
            self.next_seq = seq.wrapping_add(payload as u32);
            self.closed = f[ETH + 20 + 13] & TCP_PSH != 0;
            return Ok(());
        }
        let h = ETH + 20 + tcp_hl;
        self.buf[self.len..self.len + payload].copy_from_slice(&f[h..]);
        self.len += payload;
        self.segs += 1;
        self.next_seq = self.next_seq.wrapping_add(payload as u32);
        if f[ETH + 20 + 13] & TCP_PSH != 0 {
            self.buf[ETH + 20 + 13] |= TCP_PSH;
            self.closed = true;
        }
        if payload < self.mss {
            self.closed = true;
        }
        Ok(())
    }

    /// Write what is pending.
    pub fn flush(&mut self, sink: &mut dyn FrameSink) -> Result<(), Lost> {
        let segs = std::mem::take(&mut self.segs);
        if segs == 0 {
            return Ok(());
        }
        let len = std::mem::take(&mut self.len);
        self.closed = false;
        if segs == 1 {
            return write_one(&self.buf[..len], sink);
        }
        // IPv4: the joined length and a new header checksum.
        let f = &mut self.buf[..len];
        let ip_len = (len - ETH) as u16;
        f[ETH + 2..ETH + 4].copy_from_slice(&ip_len.to_be_bytes());
        f[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
        let c = ipv4::checksum(&f[ETH..ETH + 20]);
        f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        // TCP: a partial checksum (the pseudo-header sum), as the kernel's GRO leaves it;
        // every segment's own checksum was verified before it joined.
        let t0 = ETH + 20;
        let tcp_len = (len - t0) as u64;
        let ps = fold(sum(&f[ETH + 12..ETH + 20], u64::from(TCP) + tcp_len));
        f[t0 + 16..t0 + 18].copy_from_slice(&ps.to_be_bytes());
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: GSO_TCPV4,
            hdr_len: (t0 + self.tcp_hl) as u16,
            gso_size: self.mss as u16,
            csum_start: t0 as u16,
            csum_offset: 16,
        };
        let mut h = [0u8; VNET_HDR_LEN];
        hdr.emit(&mut h);
        sink.write(&h, f).map_err(|error| Lost {
            frames: segs,
            error,
        })?;
        self.coalesced.0 += 1;
        self.coalesced.1 += segs as u64;
        Ok(())
    }
}

fn write_one(f: &[u8], sink: &mut dyn FrameSink) -> Result<(), Lost> {
    sink.write(&[0; VNET_HDR_LEN], f)
        .map_err(|error| Lost { frames: 1, error })
}

#[cfg(test)]
mod tests {
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
        assert_eq!(rec.out, vec![(VnetHdr::default(), segs[0].clone())]);
        c.flush(&mut rec).unwrap();
        assert_eq!(rec.out.len(), 1, "nothing left");
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
        assert_eq!(rec.out[1].0, VnetHdr::default());
        assert_eq!(rec.out[3], (VnetHdr::default(), bad));
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
}
