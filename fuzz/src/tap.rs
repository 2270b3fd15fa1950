//! A TAP double for [`uipoib::tap::FrameIo`].
//!
//! Without offloads a read returns one queued frame and a write keeps the frame. With
//! offloads it does what `uipoib::tap::Tap` does on a TAP opened with `IFF_VNET_HDR`,
//! with the same [`Segmenter`] and [`Joiner`]: a queued read starts with a
//! `virtio_net_hdr`; a partial checksum is completed, a TCP/IPv4 super-frame is cut into
//! segments handed out one per read, a bad request is `InvalidData`; written frames are
//! joined (GRO) until [`FrameIo::flush`]. Only the file descriptor of the real `Tap`
//! (which needs `/dev/net/tun` and root) is replaced by queues.
//!
//! It records what the datapath read (each segment), what it wrote (before joining) and
//! what reached the "kernel" (after joining, with the header), for the checks.

use std::collections::VecDeque;
use std::io;
use std::sync::Mutex;

use uipoib::tap::FrameIo;
use uipoib::wire::offload::{FrameSink, Joiner, Lost, Segmenter, Taken, VNET_HDR_LEN};

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
    cut: Option<Segmenter>,
    gro: Option<Joiner>,
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

fn lost(l: Lost) -> ! {
    panic!("the joiner lost {} frames: {}", l.frames, l.error)
}

impl TapDouble {
    /// A double with (`offload`) or without `IFF_VNET_HDR`.
    pub fn new(offload: bool) -> TapDouble {
        TapDouble {
            offload,
            inner: Mutex::new(Inner {
                inbound: VecDeque::new(),
                cut: offload.then(Segmenter::new),
                gro: offload.then(Joiner::new),
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
        !g.inbound.is_empty() || g.cut.as_ref().is_some_and(Segmenter::pending)
    }

    /// With offloads: (super-frames written, received frames joined into them).
    pub fn coalesced(&self) -> (u64, u64) {
        self.lock().gro.as_ref().map_or((0, 0), Joiner::coalesced)
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
    /// `uipoib::tap::Tap::read_frame` with offloads, over the queued reads; each segment
    /// handed out is checked against its super-frame.
    fn read_offload(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let cut = self.cut.as_mut().expect("a double with offloads");
        if let Some((p, i, r)) = cut.next_segment(buf) {
            let n = r.map_err(bad_offload)?;
            crate::checks::check_segment(cut.super_frame(), &p, i, &buf[..n]);
            return Ok(n);
        }
        let Some(read) = self.inbound.pop_front() else {
            return Err(io::ErrorKind::WouldBlock.into());
        };
        let into = cut.read_buf();
        let n = read.len().min(into.len());
        into[..n].copy_from_slice(&read[..n]);
        match cut.take(n, buf).map_err(bad_offload)? {
            Taken::Frame(len) => Ok(len),
            Taken::Cut { plan, first } => {
                let len = first.map_err(bad_offload)?;
                crate::checks::check_segment(cut.super_frame(), &plan, 0, &buf[..len]);
                Ok(len)
            }
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
            // The sink cannot fail, so nothing is lost.
            Some(j) => j
                .push(frame, &mut Sink(&mut g.log.delivered))
                .unwrap_or_else(|l| lost(l)),
            None => g.log.delivered.push(([0; VNET_HDR_LEN], frame.to_vec())),
        }
        Ok(frame.len())
    }

    fn flush(&self) -> usize {
        let mut g = self.lock();
        let g = &mut *g;
        match &mut g.gro {
            Some(j) => j.flush(&mut Sink(&mut g.log.delivered)).lost,
            None => 0,
        }
    }
}
