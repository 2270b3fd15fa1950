//! TAP offloads: the `virtio_net_hdr` a TAP opened with `IFF_VNET_HDR` puts in front of
//! every frame, completing a partial checksum, and cutting a TCP super-frame over IPv4 or
//! IPv6 (TSO, up to 64 KiB) into MSS-sized segments, each with its own IPv4 id and header
//! checksum or IPv6 payload length, TCP sequence number, flags and checksum, as the
//! kernel's own GSO would.
//!
//! With these, one TAP read carries up to 64 KiB of a TCP stream where it would carry
//! one MTU, and the kernel's TCP stack handles one large packet instead of many.
//!
//! Both directions of a TAP with offloads are here, sans I/O: [`Segmenter`] turns what
//! one read of the TAP returned into ordinary frames (cut), and [`Joiner`] joins received
//! frames into super-frames for the TAP's writes (with a [`Coalescer`]). The TAP device
//! and the test doubles only move bytes in and out of them.

use super::ipv4::{self, fold, ones_sum as sum};
use super::{ETHERTYPE_IPV4, ETHERTYPE_IPV6, WireError};

/// Length of the `virtio_net_hdr` (without `num_buffers`) set with `TUNSETVNETHDRSZ`.
pub const VNET_HDR_LEN: usize = 10;
/// `flags`: the checksum at `csum_start + csum_offset` is partial.
pub const F_NEEDS_CSUM: u8 = 1;
/// `gso_type`: not a super-frame.
pub const GSO_NONE: u8 = 0;
/// `gso_type`: TCP over IPv4.
pub const GSO_TCPV4: u8 = 1;
/// `gso_type`: TCP over IPv6.
pub const GSO_TCPV6: u8 = 4;
/// `gso_type` bit: the stream uses ECN (CWR goes on the first segment only).
pub const GSO_ECN: u8 = 0x80;
/// The largest frame a TAP read returns with offloads on (an IP packet of 64 KiB and its
/// Ethernet header: the kernel keeps a super-frame within the TAP's 64 KiB GSO limit,
/// IPv6 too), and the largest frame the [`Coalescer`] joins.
pub const MAX_SUPER_FRAME: usize = 14 + 65_535;

const ETH: usize = 14;
const TCP: u8 = 6;
/// Length of the fixed IPv6 header.
const IP6: usize = super::ipv6::HEADER_LEN;
/// IPv6 next-header values of extension headers (RFC 8200 §4, RFC 7045): a super-frame
/// with any is not cut (TCP behind them is not looked for).
const IP6_EXT: [u8; 9] = [0, 43, 44, 50, 51, 60, 135, 139, 140];
const TCP_FIN: u8 = 0x01;
const TCP_PSH: u8 = 0x08;
const TCP_CWR: u8 = 0x80;

/// A `virtio_net_hdr`, little-endian (the TAP is told so with `TUNSETVNETLE`, so that a
/// big-endian host reads the same bytes).
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

/// How a TCP super-frame (over IPv4 or IPv6) is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Plan {
    /// Whether it is TCP/IPv6 (`GSO_TCPV6`); otherwise TCP/IPv4.
    pub ipv6: bool,
    /// IP header length: IPv4's with its options, or IPv6's fixed 40 bytes.
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
    /// Ethernet, IP and TCP headers.
    pub fn headers(&self) -> usize {
        ETH + self.ip_hl + self.tcp_hl
    }

    /// The length of segment `i`'s frame.
    pub fn segment_len(&self, i: usize) -> usize {
        let start = i * self.mss;
        self.headers() + self.mss.min(self.payload.saturating_sub(start))
    }
}

/// The ones' complement sum of the pseudo-header addresses of the IPv4 or (`ipv6`) IPv6
/// packet behind the Ethernet header of `f`.
fn addr_sum(f: &[u8], ipv6: bool) -> u64 {
    if ipv6 {
        sum(&f[ETH + 8..ETH + IP6], 0)
    } else {
        sum(&f[ETH + 12..ETH + 20], 0)
    }
}

/// Check a TSO super-frame (Ethernet + IPv4 or IPv6 + TCP + payload) against its header's
/// `gso_type` (`GSO_TCPV4` or `GSO_TCPV6`, with or without `GSO_ECN`) and plan its
/// segments. The frame's length is the packet's (its IP length field is not read: each
/// segment gets its own). An IPv6 super-frame with extension headers is refused.
pub fn plan(frame: &[u8], hdr: &VnetHdr) -> Result<Plan, WireError> {
    let ipv6 = match hdr.gso_type & !GSO_ECN {
        GSO_TCPV4 => false,
        GSO_TCPV6 => true,
        _ => {
            return Err(WireError::BadOffload(
                "a segmentation type other than TCP/IPv4 or TCP/IPv6",
            ));
        }
    };
    let min = ETH + if ipv6 { IP6 } else { 20 };
    if frame.len() < min {
        return Err(WireError::Truncated {
            what: "TSO frame",
            need: min,
            got: frame.len(),
        });
    }
    let ethertype = u16::from_be_bytes([frame[12], frame[13]]);
    let ip = &frame[ETH..];
    let ip_hl = match (ipv6, ethertype) {
        (false, ETHERTYPE_IPV4) => {
            if ip[0] >> 4 != 4 {
                return Err(WireError::BadOffload("TSO frame is not IPv4"));
            }
            let ip_hl = usize::from(ip[0] & 0x0f) * 4;
            if ip_hl < 20 || ip[9] != TCP {
                return Err(WireError::BadOffload("TSO frame is not TCP"));
            }
            ip_hl
        }
        (true, ETHERTYPE_IPV6) => {
            if ip[0] >> 4 != 6 {
                return Err(WireError::BadOffload("TSO frame is not IPv6"));
            }
            if IP6_EXT.contains(&ip[6]) {
                return Err(WireError::BadOffload(
                    "TSO frame has IPv6 extension headers (only TCP right behind the IPv6 header is cut)",
                ));
            }
            if ip[6] != TCP {
                return Err(WireError::BadOffload("TSO frame is not TCP"));
            }
            IP6
        }
        (false, ETHERTYPE_IPV6) => {
            return Err(WireError::BadOffload(
                "TSO frame is IPv6 but its gso_type is TCP/IPv4",
            ));
        }
        (true, ETHERTYPE_IPV4) => {
            return Err(WireError::BadOffload(
                "TSO frame is IPv4 but its gso_type is TCP/IPv6",
            ));
        }
        (false, _) => return Err(WireError::BadOffload("TSO frame is not IPv4")),
        (true, _) => return Err(WireError::BadOffload("TSO frame is not IPv6")),
    };
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
    // The IPv4 total length or the IPv6 payload length of the largest segment.
    let largest = tcp_hl + mss.min(payload) + if ipv6 { 0 } else { ip_hl };
    if largest > usize::from(u16::MAX) {
        return Err(WireError::BadOffload(
            "TSO frame's segments would be longer than an IP length field holds",
        ));
    }
    Ok(Plan {
        ipv6,
        ip_hl,
        tcp_hl,
        mss,
        payload,
        segments: payload.div_ceil(mss).max(1),
        ecn: hdr.gso_type & GSO_ECN != 0,
    })
}

/// Write segment `i` of the super-frame `frame` (planned by [`plan`]) to `out`, with
/// its own IPv4 total length, id and checksum (or IPv6 payload length), TCP sequence
/// number, flags (FIN and PSH on the last segment only, CWR on the first only) and TCP
/// checksum (over the IPv4 or IPv6 pseudo-header). Returns its length.
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

    let ip = &mut out[ETH..ETH + p.ip_hl];
    if p.ipv6 {
        // IPv6: the payload length (no id, no header checksum).
        let payload_len = (p.tcp_hl + seg) as u16;
        ip[4..6].copy_from_slice(&payload_len.to_be_bytes());
    } else {
        // IPv4: total length, id, checksum.
        let total = (p.ip_hl + p.tcp_hl + seg) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        let id = u16::from_be_bytes([ip[4], ip[5]]).wrapping_add(i as u16);
        ip[4..6].copy_from_slice(&id.to_be_bytes());
        ip[10..12].copy_from_slice(&[0, 0]);
        let c = ipv4::checksum(ip);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
    }

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
    let tcp_len = (p.tcp_hl + seg) as u64;
    let mut s = addr_sum(out, p.ipv6) + u64::from(TCP) + tcp_len;
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
/// IPv6 header bytes that must match for two segments to join (all but the payload
/// length: version, traffic class, flow label; next header, hop limit, addresses).
const IP6_SAME: [std::ops::Range<usize>; 2] = [0..4, 6..40];

/// Receive-side coalescing (what the kernel's GRO does): consecutive, full-sized TCP
/// segments of one TCP flow over IPv4 or IPv6 with identical headers (TCP options
/// included) and valid checksums are joined into one super-frame of up to 64 KiB
/// (`GSO_TCPV4` or `GSO_TCPV6`; never across the two), written to the TAP with a
/// `virtio_net_hdr` that describes its segments and a partial checksum, so the kernel's
/// TCP takes them in one go. Anything else, or a segment that does not follow, is
/// written on its own (after what is pending, so order is kept) with a header that asks
/// for no offload ([`plain_hdr`]: only its headers' length, as a hint): the kernel checks
/// its checksums itself. The caller calls [`Coalescer::flush`] at
/// the end of each batch of receives.
pub struct Coalescer {
    buf: Vec<u8>,
    /// Bytes of the pending frame (0: nothing pending).
    len: usize,
    /// Received segments in it.
    segs: usize,
    /// IP header length of the pending frame: 20 (IPv4, no options) or 40 (IPv6).
    ip_hl: usize,
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

/// What a segment that may join is: its IP header length (20: IPv4, 40: IPv6), TCP
/// header length, payload and sequence number.
#[derive(Clone, Copy)]
struct Candidate {
    ip_hl: usize,
    tcp_hl: usize,
    payload: usize,
    seq: u32,
}

/// A TCP segment over IPv4 (no options, DF, not a fragment, valid header checksum) or
/// IPv6 (no extension headers), exactly the frame's length, with ACK and payload, none of
/// SYN, FIN, RST, URG, ECE, CWR, and a valid TCP checksum.
fn candidate(f: &[u8]) -> Option<Candidate> {
    if f.len() < ETH + 40 {
        return None;
    }
    let ip = &f[ETH..];
    let ip_hl = match u16::from_be_bytes([f[12], f[13]]) {
        ETHERTYPE_IPV4 => {
            if ip[0] != 0x45
                || usize::from(u16::from_be_bytes([ip[2], ip[3]])) != ip.len()
                || ip[6] & 0x7f != 0x40
                || ip[7] != 0
                || ip[9] != TCP
                || ipv4::checksum(&ip[..20]) != 0
            {
                return None;
            }
            20
        }
        ETHERTYPE_IPV6 => {
            if ip.len() < IP6 + 20
                || ip[0] >> 4 != 6
                || usize::from(u16::from_be_bytes([ip[4], ip[5]])) != ip.len() - IP6
                || ip[6] != TCP
            {
                return None;
            }
            IP6
        }
        _ => return None,
    };
    let t = &ip[ip_hl..];
    let tcp_hl = usize::from(t[12] >> 4) * 4;
    if tcp_hl < 20 || t.len() <= tcp_hl {
        return None;
    }
    let fl = t[13];
    if fl & (TCP_SYN | TCP_FIN | TCP_RST | TCP_URG | TCP_ECE | TCP_CWR) != 0 || fl & TCP_ACK == 0 {
        return None;
    }
    let s = addr_sum(f, ip_hl == IP6) + u64::from(TCP) + t.len() as u64;
    if fold(sum(t, s)) != 0xffff {
        return None;
    }
    Some(Candidate {
        ip_hl,
        tcp_hl,
        payload: t.len() - tcp_hl,
        seq: u32::from_be_bytes([t[4], t[5], t[6], t[7]]),
    })
}

impl Coalescer {
    /// An empty coalescer (its buffer is allocated here, once).
    pub fn new() -> Coalescer {
        Coalescer {
            buf: vec![0; MAX_SUPER_FRAME],
            len: 0,
            segs: 0,
            ip_hl: 0,
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

    /// Whether segment `f` (candidate `c`) continues the pending frame.
    fn follows(&self, f: &[u8], c: Candidate) -> bool {
        if self.segs == 0
            || self.closed
            || c.ip_hl != self.ip_hl
            || c.tcp_hl != self.tcp_hl
            || c.seq != self.next_seq
        {
            return false;
        }
        if c.payload > self.mss || self.len + c.payload > MAX_SUPER_FRAME {
            return false;
        }
        let (p, t0, tcp_hl) = (&self.buf[..self.len], ETH + c.ip_hl, c.tcp_hl);
        let same: &[std::ops::Range<usize>] = if c.ip_hl == IP6 { &IP6_SAME } else { &IP_SAME };
        // The EtherType is in the Ethernet header: one family.
        f[..ETH] == p[..ETH]
            && same.iter().all(|r| f[ETH + r.start..ETH + r.end] == p[ETH + r.start..ETH + r.end])
            // Ports; then acknowledgement, data offset, flags but PSH, window; then the
            // urgent pointer and every option.
            && f[t0..t0 + 4] == p[t0..t0 + 4]
            && f[t0 + 8..t0 + 13] == p[t0 + 8..t0 + 13]
            && f[t0 + 13] & !TCP_PSH == p[t0 + 13] & !TCP_PSH
            && f[t0 + 14..t0 + 16] == p[t0 + 14..t0 + 16]
            && f[t0 + 18..t0 + tcp_hl] == p[t0 + 18..t0 + tcp_hl]
    }

    /// Take one received frame. What is pending is written first when `f` does not
    /// join it; if that write fails, `f` is still written (or held), and the error
    /// counts every frame lost, the pending ones and `f` if its own write failed too.
    pub fn push(&mut self, f: &[u8], sink: &mut dyn FrameSink) -> Result<(), Lost> {
        let Some(c) = candidate(f) else {
            let flushed = self.flush(sink);
            return both(flushed, write_one(f, sink));
        };
        let (payload, flags) = (c.payload, ETH + c.ip_hl + 13);
        if !self.follows(f, c) {
            let flushed = self.flush(sink);
            if f.len() > self.buf.len() {
                return both(flushed, write_one(f, sink));
            }
            self.buf[..f.len()].copy_from_slice(f);
            self.len = f.len();
            self.segs = 1;
            self.ip_hl = c.ip_hl;
            self.tcp_hl = c.tcp_hl;
            self.mss = payload;
            self.next_seq = c.seq.wrapping_add(payload as u32);
            self.closed = f[flags] & TCP_PSH != 0;
            return flushed;
        }
        let h = ETH + c.ip_hl + c.tcp_hl;
        self.buf[self.len..self.len + payload].copy_from_slice(&f[h..]);
        self.len += payload;
        self.segs += 1;
        self.next_seq = self.next_seq.wrapping_add(payload as u32);
        if f[flags] & TCP_PSH != 0 {
            self.buf[flags] |= TCP_PSH;
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
        let f = &mut self.buf[..len];
        let ipv6 = self.ip_hl == IP6;
        if ipv6 {
            // IPv6: the joined payload length.
            let payload_len = (len - ETH - IP6) as u16;
            f[ETH + 4..ETH + 6].copy_from_slice(&payload_len.to_be_bytes());
        } else {
            // IPv4: the joined length and a new header checksum.
            let ip_len = (len - ETH) as u16;
            f[ETH + 2..ETH + 4].copy_from_slice(&ip_len.to_be_bytes());
            f[ETH + 10..ETH + 12].copy_from_slice(&[0, 0]);
            let c = ipv4::checksum(&f[ETH..ETH + 20]);
            f[ETH + 10..ETH + 12].copy_from_slice(&c.to_be_bytes());
        }
        // TCP: a partial checksum (the pseudo-header sum), as the kernel's GRO leaves it;
        // every segment's own checksum was verified before it joined.
        let t0 = ETH + self.ip_hl;
        let tcp_len = (len - t0) as u64;
        let ps = fold(addr_sum(f, ipv6) + u64::from(TCP) + tcp_len);
        f[t0 + 16..t0 + 18].copy_from_slice(&ps.to_be_bytes());
        let hdr = VnetHdr {
            flags: F_NEEDS_CSUM,
            gso_type: if ipv6 { GSO_TCPV6 } else { GSO_TCPV4 },
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

/// Two writes' outcomes as one: the frames both lost, the first error.
fn both(a: Result<(), Lost>, b: Result<(), Lost>) -> Result<(), Lost> {
    match (a, b) {
        (Ok(()), r) | (r, Ok(())) => r,
        (Err(a), Err(b)) => Err(Lost {
            frames: a.frames + b.frames,
            error: a.error,
        }),
    }
}

/// The `hdr_len` given with a frame written whole: how many of its first bytes the TAP
/// puts in the packet's linear head, the rest going into pages. With 0 (no hint) the
/// kernel's TAP puts all of a full-MTU frame (4 KiB) in one head from an 8 KiB slab, and
/// the receiving socket is charged 8,448 bytes for a datagram of 4,040; with the headers'
/// room here the payload goes into a page, charged 4,928 bytes, and a socket buffer holds
/// 1.7x the datagrams (a default 208 KiB one 43 instead of 25, measured; tests/netns_sim.rs
/// checks the charge per datagram). A frame shorter than a page goes whole into the head
/// either way.
/// 128 bytes hold Ethernet, IPv6 and a TCP header with options; a longer header is pulled
/// by the stack as it would be from a NIC's pages.
pub const LINEAR_HINT: usize = 128;

/// A frame that is not a super-frame: no offload asked, the linear head hinted.
fn write_one(f: &[u8], sink: &mut dyn FrameSink) -> Result<(), Lost> {
    let mut h = [0u8; VNET_HDR_LEN];
    plain_hdr(f.len()).emit(&mut h);
    sink.write(&h, f).map_err(|error| Lost { frames: 1, error })
}

/// The header of a frame of `len` bytes written whole (see [`LINEAR_HINT`]): never more
/// than the frame, which the TAP refuses.
pub fn plain_hdr(len: usize) -> VnetHdr {
    VnetHdr {
        hdr_len: len.min(LINEAR_HINT) as u16,
        ..VnetHdr::default()
    }
}

/// The cut side of a TAP opened with offloads. One read of the TAP (a `virtio_net_hdr`
/// and a frame) goes into [`Segmenter::read_buf`] and is taken with
/// [`Segmenter::take`]: a frame that is not a super-frame comes out whole (its partial
/// checksum completed); a TCP super-frame (IPv4 or IPv6) is planned and comes out one
/// segment per call, the first from `take`, the others from
/// [`Segmenter::next_segment`], which the caller asks before reading the TAP again.
pub struct Segmenter {
    buf: Vec<u8>,
    /// Bytes of the last read that was planned as a super-frame.
    len: usize,
    /// The last plan and the segment to hand out next (`next == segments`: done).
    plan: Option<Plan>,
    next: usize,
}

/// What [`Segmenter::take`] made of one read.
#[derive(Debug, PartialEq, Eq)]
pub enum Taken {
    /// An ordinary frame of this many bytes.
    Frame(usize),
    /// A super-frame cut by `plan` (its segments still to come are handed out by
    /// [`Segmenter::next_segment`]), and its first segment.
    Cut {
        /// How the super-frame is cut.
        plan: Plan,
        /// The first segment's length, or why it could not be cut (then nothing of the
        /// super-frame is handed out).
        first: Result<usize, WireError>,
    },
}

impl Default for Segmenter {
    fn default() -> Self {
        Segmenter::new()
    }
}

impl Segmenter {
    /// A segmenter with room for the largest read (allocated here, once).
    pub fn new() -> Segmenter {
        Segmenter {
            buf: vec![0; VNET_HDR_LEN + MAX_SUPER_FRAME],
            len: 0,
            plan: None,
            next: 0,
        }
    }

    /// Whether segments of a super-frame are still to be handed out.
    pub fn pending(&self) -> bool {
        self.plan.is_some_and(|p| self.next < p.segments)
    }

    /// Where the next read of the TAP goes: header and frame.
    pub fn read_buf(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// The super-frame of the last [`Taken::Cut`] (without its header).
    pub fn super_frame(&self) -> &[u8] {
        &self.buf[VNET_HDR_LEN..self.len]
    }

    /// The next segment of the super-frame being cut, written to `out`: its plan, its
    /// index and its length (or why it could not be cut); `None` when none is left.
    pub fn next_segment(
        &mut self,
        out: &mut [u8],
    ) -> Option<(Plan, usize, Result<usize, WireError>)> {
        let p = self.plan.filter(|p| self.next < p.segments)?;
        let i = self.next;
        self.next += 1;
        Some((p, i, segment(self.super_frame(), &p, i, out)))
    }

    /// Take the `n` bytes a read left in [`Segmenter::read_buf`] and write the frame it
    /// holds (or the first segment of its super-frame) to `out`. A header that does not
    /// parse, a checksum position outside the frame, a segmentation type other than
    /// TCP/IPv4 and TCP/IPv6, one that does not match the frame, or a frame longer than
    /// `out` is an error and hands out nothing.
    pub fn take(&mut self, n: usize, out: &mut [u8]) -> Result<Taken, WireError> {
        self.plan = None;
        let n = n.min(self.buf.len());
        let hdr = VnetHdr::parse(&self.buf[..n])?;
        let frame = &mut self.buf[VNET_HDR_LEN..n];
        match hdr.gso_type & !GSO_ECN {
            GSO_NONE => {
                if hdr.flags & F_NEEDS_CSUM != 0 {
                    finish_checksum(
                        frame,
                        usize::from(hdr.csum_start),
                        usize::from(hdr.csum_offset),
                    )?;
                }
                let dst = out
                    .get_mut(..frame.len())
                    .ok_or(WireError::FrameTooLong(frame.len()))?;
                dst.copy_from_slice(frame);
                Ok(Taken::Frame(frame.len()))
            }
            GSO_TCPV4 | GSO_TCPV6 => {
                let p = plan(frame, &hdr)?;
                self.len = n;
                let first = segment(self.super_frame(), &p, 0, out);
                // A first segment that cannot be cut ends the super-frame.
                self.next = if first.is_ok() { 1 } else { p.segments };
                self.plan = Some(p);
                Ok(Taken::Cut { plan: p, first })
            }
            _ => Err(WireError::BadOffload(
                "a segmentation type other than TCP/IPv4 or TCP/IPv6",
            )),
        }
    }
}

/// The join side of a TAP opened with offloads: frames for the TAP go through a
/// [`Coalescer`] into a [`FrameSink`]; frames that could not be written are remembered
/// until the next [`Joiner::flush`], which reports them with the joining done since.
#[derive(Default)]
pub struct Joiner {
    coalescer: Coalescer,
    lost: usize,
    /// What `coalescer.coalesced` was at the last flush.
    reported: (u64, u64),
}

/// What a [`Joiner::flush`] reports since the one before.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Flushed {
    /// Frames taken by [`Joiner::push`] that then could not be written.
    pub lost: usize,
    /// Super-frames written, and the frames joined into them.
    pub joined: (u64, u64),
}

impl Joiner {
    /// An empty joiner.
    pub fn new() -> Joiner {
        Joiner::default()
    }

    /// Take one frame for the TAP (written at once, or held back to be joined). Frames
    /// the sink refused are counted for the next flush and returned.
    pub fn push(&mut self, frame: &[u8], sink: &mut dyn FrameSink) -> Result<(), Lost> {
        self.coalescer.push(frame, sink).inspect_err(|lost| {
            self.lost += lost.frames;
        })
    }

    /// Write what is held back; report what was lost and joined since the last flush.
    pub fn flush(&mut self, sink: &mut dyn FrameSink) -> Flushed {
        if let Err(lost) = self.coalescer.flush(sink) {
            self.lost += lost.frames;
        }
        let (now, before) = (self.coalescer.coalesced, self.reported);
        self.reported = now;
        Flushed {
            lost: std::mem::take(&mut self.lost),
            joined: (now.0 - before.0, now.1 - before.1),
        }
    }

    /// Super-frames written so far, and the frames joined into them.
    pub fn coalesced(&self) -> (u64, u64) {
        self.coalescer.coalesced
    }
}

#[cfg(test)]
mod tests;
