//! A TAP double for [`uipoib::tap::FrameIo`].
//!
//! Without offloads a read returns one queued frame and a write keeps the frame. With
//! offloads it does what `uipoib::tap::Tap` does on a TAP opened with `IFF_VNET_HDR`
//! (its `FrameIo` impl, step for step): a queued read starts with a `virtio_net_hdr`; a
//! partial checksum is completed, a TCP/IPv4 super-frame is cut into segments handed out
//! one per read, a bad request is `InvalidData`; written frames go through a
//! [`Coalescer`] (GRO), joined until [`FrameIo::flush`]. The real `Tap` needs
//! `/dev/net/tun` and root, and is built around a file descriptor, so the double repeats
//! those few lines over the same `uipoib::wire::gso` functions.
//!
//! It records what the datapath read (each segment), what it wrote (before joining) and
//! what reached the "kernel" (after joining, with the header), for the checks.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use uipoib::tap::FrameIo;
use uipoib::wire::gso::{self, Coalescer, FrameSink, Plan, VNET_HDR_LEN, VnetHdr};

/// What the double saw; see the module docs.
#[derive(Default)]
pub struct Log {
    /// Frames handed to the datapath by `read_frame` (segments of a super-frame each).
    pub read: Vec<Vec<u8>>,
    /// Reads that were `InvalidData` (a bad offload request).
    pub bad_reads: usize,
    /// Frames given to `write_frame`.
    pub written: Vec<Vec<u8>>,
    /// What reached the kernel side: header and frame (the header is all zero without
    /// offloads and for a frame that was not joined).
    pub delivered: Vec<([u8; VNET_HDR_LEN], Vec<u8>)>,
}

struct Inner {
    inbound: VecDeque<Vec<u8>>,
    buf: Vec<u8>,
    len: usize,
    plan: Option<Plan>,
    next: usize,
    gro: Option<Coalescer>,
    log: Log,
}

/// See the module docs.
pub struct TapDouble {
    offload: bool,
    inner: Mutex<Inner>,
}

struct Sink<'a>(&'a mut Vec<([u8; VNET_HDR_LEN], Vec<u8>)>);

impl FrameSink for Sink<'_> {
    fn write(&mut self, hdr: &[u8; VNET_HDR_LEN], frame: &[u8]) -> io::Result<()> {
        self.0.push((*hdr, frame.to_vec()));
        Ok(())
    }
}

fn bad_offload(e: uipoib::wire::WireError) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, e)
}

impl TapDouble {
    /// A double with (`offload`) or without `IFF_VNET_HDR`.
    pub fn new(offload: bool) -> TapDouble {
        TapDouble {
            offload,
            inner: Mutex::new(Inner {
                inbound: VecDeque::new(),
                buf: if offload {
                    vec![0; VNET_HDR_LEN + gso::MAX_SUPER_FRAME]
                } else {
                    Vec::new()
                },
                len: 0,
                plan: None,
                next: 0,
                gro: offload.then(Coalescer::new),
                log: Log::default(),
            }),
        }
    }

    /// Whether reads and writes carry a `virtio_net_hdr`.
    pub fn offload(&self) -> bool {
        self.offload
    }

    /// Queue what one read of the TAP returns (with offloads: header first).
    pub fn inject(&self, bytes: &[u8]) {
        self.lock().inbound.push_back(bytes.to_vec());
    }

    /// Whether a read would return something (queued reads, or segments still to cut).
    pub fn pending(&self) -> bool {
        let g = self.lock();
        !g.inbound.is_empty() || g.plan.is_some()
    }

    /// With offloads: (super-frames written, received frames joined into them).
    pub fn coalesced(&self) -> (u64, u64) {
        self.lock().gro.as_ref().map_or((0, 0), |c| c.coalesced)
    }

    /// Take what was logged so far.
    pub fn take_log(&self) -> Log {
        std::mem::take(&mut self.lock().log)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl Inner {
    /// `uipoib::tap::Tap::read_frame` with offloads, over the queued reads.
    fn read_offload(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some(p) = self.plan {
            let i = self.next;
            self.next += 1;
            if self.next >= p.segments {
                self.plan = None;
            }
            let frame = &self.buf[VNET_HDR_LEN..self.len];
            let n = gso::segment(frame, &p, i, buf).map_err(bad_offload)?;
            crate::checks::check_segment(frame, &p, i, &buf[..n]);
            return Ok(n);
        }
        let Some(read) = self.inbound.pop_front() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let n = read.len().min(self.buf.len());
        self.buf[..n].copy_from_slice(&read[..n]);
        let hdr = VnetHdr::parse(&self.buf[..n]).map_err(bad_offload)?;
        let frame = &mut self.buf[VNET_HDR_LEN..n];
        match hdr.gso_type & !gso::GSO_ECN {
            gso::GSO_NONE => {
                if hdr.flags & gso::F_NEEDS_CSUM != 0 {
                    gso::finish_checksum(
                        frame,
                        usize::from(hdr.csum_start),
                        usize::from(hdr.csum_offset),
                    )
                    .map_err(bad_offload)?;
                }
                let out = buf.get_mut(..frame.len()).ok_or_else(|| {
                    io::Error::new(io::ErrorKind::InvalidData, "frame exceeds the MTU")
                })?;
                out.copy_from_slice(frame);
                Ok(frame.len())
            }
            gso::GSO_TCPV4 => {
                let p = gso::plan(frame, &hdr).map_err(bad_offload)?;
                self.len = n;
                if p.segments > 1 {
                    self.plan = Some(p);
                    self.next = 1;
                }
                let frame = &self.buf[VNET_HDR_LEN..n];
                let r = gso::segment(frame, &p, 0, buf).map_err(|e| {
                    self.plan = None;
                    bad_offload(e)
                });
                if let Ok(len) = r {
                    crate::checks::check_segment(frame, &p, 0, &buf[..len]);
                }
                r
            }
            _ => Err(bad_offload(uipoib::wire::WireError::BadOffload(
                "a segmentation type other than TCP/IPv4",
            ))),
        }
    }
}

impl FrameIo for TapDouble {
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize> {
        let mut g = self.lock();
        let r = if self.offload {
            g.read_offload(buf)
        } else {
            match g.inbound.pop_front() {
                // A read into a short buffer returns what fits (the rest is lost).
                Some(f) => {
                    let n = f.len().min(buf.len());
                    buf[..n].copy_from_slice(&f[..n]);
                    Ok(n)
                }
                None => Err(io::ErrorKind::WouldBlock.into()),
            }
        };
        match &r {
            Ok(n) => g.log.read.push(buf[..*n].to_vec()),
            Err(e) if e.kind() == io::ErrorKind::InvalidData => g.log.bad_reads += 1,
            Err(_) => {}
        }
        r
    }

    fn write_frame(&self, frame: &[u8]) -> io::Result<usize> {
        let mut g = self.lock();
        let g = &mut *g;
        g.log.written.push(frame.to_vec());
        match &mut g.gro {
            Some(c) => {
                // The sink cannot fail, so nothing is lost.
                if let Err(lost) = c.push(frame, &mut Sink(&mut g.log.delivered)) {
                    panic!("the coalescer lost {} frames: {}", lost.frames, lost.error);
                }
            }
            None => g.log.delivered.push(([0; VNET_HDR_LEN], frame.to_vec())),
        }
        Ok(frame.len())
    }

    fn flush(&self) -> usize {
        let mut g = self.lock();
        let g = &mut *g;
        if let Some(c) = &mut g.gro
            && let Err(lost) = c.flush(&mut Sink(&mut g.log.delivered))
        {
            panic!("the coalescer lost {} frames: {}", lost.frames, lost.error);
        }
        0
    }
}
