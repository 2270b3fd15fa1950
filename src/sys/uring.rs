//! Writes to one descriptor batched through io_uring: frames are copied into the batch's
//! own buffer and written, in order, by one `io_uring_enter` that also waits for them.
//!
//! Why: each `write` of a received frame to the TAP runs the kernel's receive of it in the
//! writer's context and wakes the application it is for, which then preempts the writer
//! as the call returns; on one CPU every frame costs two context switches. Inside one
//! `io_uring_enter` the writes follow each other and the woken application runs once,
//! after the batch (docs/PERFORMANCE.md, "The TAP's writes batched").
//!
//! The descriptor must be non-blocking (`O_NONBLOCK`): its writes are then issued inline,
//! in submission order, and complete within the call. A batch whose ring failed is not
//! used again; its buffer is kept alive until the ring is gone, so no request the kernel
//! might still hold points at freed memory.

use io_uring::{IoUring, opcode, types};
use std::io;
use std::os::fd::RawFd;

/// One pending write: where its bytes are in the buffer, and how many received frames
/// it carries (a joined super-frame carries several).
#[derive(Clone, Copy, Debug, Default)]
struct Pending {
    off: usize,
    len: usize,
    frames: usize,
}

/// Writes waiting for one submission. See the module's documentation.
pub struct WriteBatch {
    ring: IoUring,
    fd: RawFd,
    buf: Box<[u8]>,
    used: usize,
    pending: Vec<Pending>,
    max_writes: usize,
    /// Received frames whose write failed since [`WriteBatch::take_lost`].
    lost: usize,
    /// The first error of those writes.
    error: Option<io::Error>,
    /// The ring failed: nothing more goes through it.
    broken: bool,
}

impl WriteBatch {
    /// A batch of up to `max_writes` writes and `bytes` bytes to `fd` (non-blocking, kept
    /// open by the caller for the batch's life). Fails where io_uring is not available
    /// (an old kernel, a seccomp filter, `kernel.io_uring_disabled`).
    pub fn new(fd: RawFd, max_writes: usize, bytes: usize) -> io::Result<WriteBatch> {
        let max_writes = max_writes.clamp(1, 4096);
        let ring = IoUring::new(max_writes.next_power_of_two() as u32)?;
        Ok(WriteBatch {
            ring,
            fd,
            buf: vec![0; bytes].into_boxed_slice(),
            used: 0,
            pending: Vec::with_capacity(max_writes),
            max_writes,
            lost: 0,
            error: None,
            broken: false,
        })
    }

    /// The ring failed; writes must go around the batch from now on.
    pub fn broken(&self) -> bool {
        self.broken
    }

    /// Whether a write of `len` bytes could join the batch at all (a larger one must be
    /// written on its own).
    pub fn takes(&self, len: usize) -> bool {
        len <= self.buf.len() && len <= u32::MAX as usize
    }

    /// Queue one write of `parts`, back to back, carrying `frames` received frames.
    /// Submits what waits first when the batch is full. Returns false (nothing queued)
    /// when the write is larger than the batch or the ring has failed.
    pub fn push(&mut self, parts: &[&[u8]], frames: usize) -> bool {
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if self.broken || !self.takes(len) {
            return false;
        }
        if self.pending.len() >= self.max_writes || self.used + len > self.buf.len() {
            self.submit();
            if self.broken {
                return false;
            }
        }
        let off = self.used;
        let mut at = off;
        for p in parts {
            self.buf[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        self.used = at;
        self.pending.push(Pending { off, len, frames });
        true
    }

    /// Write everything queued, in order, and wait for it. Failed or short writes count
    /// their frames as lost ([`WriteBatch::take_lost`]).
    pub fn submit(&mut self) {
        let n = self.pending.len();
        if n == 0 || self.broken {
            return;
        }
        let mut queued = 0;
        {
            let mut sq = self.ring.submission();
            for (i, p) in self.pending.iter().enumerate() {
                // `takes` bounds every length by u32::MAX.
                let len = p.len as u32;
                let e = opcode::Write::new(types::Fd(self.fd), self.buf[p.off..].as_ptr(), len)
                    // The descriptor is a stream: no offset, like write(2).
                    .offset(u64::MAX)
                    .build()
                    .user_data(i as u64);
                // SAFETY: the entry points into `self.buf`, which is neither written nor
                // freed until every queued entry has completed: this function waits for
                // all of them below, and if the ring fails first, `broken` keeps the
                // buffer untouched (`push` refuses) and `Drop` leaks it.
                if unsafe { sq.push(&e) }.is_err() {
                    break;
                }
                queued += 1;
            }
        }
        // The ring holds `max_writes` rounded up to a power of two: never full here.
        let mut done = 0;
        let mut ok: Done = [0; 64];
        while done < queued {
            match self.ring.submit_and_wait(queued - done) {
                Ok(_) => {}
                Err(e)
                    if matches!(
                        e.raw_os_error(),
                        Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY)
                    ) => {}
                Err(e) => {
                    // Whatever has not completed is lost, and the ring is not used again.
                    self.broken = true;
                    self.fail(e);
                    break;
                }
            }
            for c in self.ring.completion() {
                done += 1;
                let i = c.user_data() as usize;
                let Some(p) = self.pending.get(i).copied() else {
                    continue;
                };
                mark(&mut ok, i);
                let r = c.result();
                let e = if r < 0 {
                    io::Error::from_raw_os_error(-r)
                } else if r as usize != p.len {
                    io::Error::new(
                        io::ErrorKind::WriteZero,
                        format!("the TAP took {r} of {} bytes", p.len),
                    )
                } else {
                    continue;
                };
                self.lost += p.frames;
                if self.error.is_none() {
                    self.error = Some(e);
                }
            }
        }
        if done < n {
            // Not queued, or not known to be written.
            for (i, p) in self.pending.iter().enumerate() {
                if !is_marked(&ok, i) {
                    self.lost += p.frames;
                }
            }
            if self.error.is_none() {
                self.error = Some(io::Error::other("writes not completed by io_uring"));
            }
        }
        if !self.broken {
            self.pending.clear();
            self.used = 0;
        }
    }

    fn fail(&mut self, e: io::Error) {
        if self.error.is_none() {
            self.error = Some(e);
        }
    }

    /// Received frames lost in failed writes since the last call, and the first error.
    pub fn take_lost(&mut self) -> (usize, Option<io::Error>) {
        (std::mem::take(&mut self.lost), self.error.take())
    }
}

impl Drop for WriteBatch {
    fn drop(&mut self) {
        if self.broken && !self.pending.is_empty() {
            // The kernel may still hold writes into the buffer: it outlives the ring.
            std::mem::forget(std::mem::take(&mut self.buf));
        }
    }
}

/// Which writes of a submission completed: a bit per entry, up to 4096 (`max_writes`).
type Done = [u64; 64];

fn mark(d: &mut Done, i: usize) {
    if let Some(w) = d.get_mut(i / 64) {
        *w |= 1 << (i % 64);
    }
}

fn is_marked(d: &Done, i: usize) -> bool {
    d.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::fd::AsRawFd;

    fn pipe() -> (std::fs::File, std::fs::File) {
        let mut fds = [0; 2];
        // SAFETY: `fds` is a live two-element array pipe2(2) fills; both descriptors are
        // then owned by the Files below and by nothing else.
        let r = unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_NONBLOCK | libc::O_CLOEXEC) };
        assert_eq!(r, 0, "pipe2: {}", io::Error::last_os_error());
        // SAFETY: as above: fresh descriptors, each owned once.
        unsafe {
            use std::os::fd::FromRawFd;
            (
                std::fs::File::from_raw_fd(fds[0]),
                std::fs::File::from_raw_fd(fds[1]),
            )
        }
    }

    /// io_uring may be refused (seccomp, `kernel.io_uring_disabled`); the tests cannot
    /// run then and say so, failing under CI, where the daemon's default depends on it.
    fn batch_or_skip(fd: RawFd, writes: usize, bytes: usize) -> Option<WriteBatch> {
        match WriteBatch::new(fd, writes, bytes) {
            Ok(b) => Some(b),
            Err(e) if !under_ci() => {
                eprintln!("io_uring is not available here ({e}): this test cannot run");
                None
            }
            Err(e) => panic!("io_uring is not available under CI: {e}"),
        }
    }

    fn under_ci() -> bool {
        std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
    }

    #[test]
    fn writes_arrive_whole_and_in_order_across_submissions() {
        let (mut r, w) = pipe();
        // Room for 3 writes or 40 bytes: the pushes below overflow both.
        let Some(mut b) = batch_or_skip(w.as_raw_fd(), 3, 40) else {
            return;
        };
        let mut want = Vec::new();
        for i in 0..10u8 {
            let head = [b'h', i];
            let body = vec![i; 5 + i as usize];
            assert!(b.push(&[&head, &body], 1));
            want.extend_from_slice(&head);
            want.extend_from_slice(&body);
        }
        b.submit();
        assert_eq!(b.take_lost().0, 0);
        let mut got = vec![0; want.len() + 10];
        let n = r.read(&mut got).unwrap();
        assert_eq!(&got[..n], &want[..]);
    }

    #[test]
    fn failed_writes_count_the_frames_they_carried() {
        // A descriptor open for reading only: every write fails with EBADF.
        let f = std::fs::File::open("/dev/null").unwrap();
        let Some(mut b) = batch_or_skip(f.as_raw_fd(), 4, 1024) else {
            return;
        };
        assert!(b.push(&[b"one frame"], 1));
        assert!(b.push(&[b"a super-frame of 16"], 16));
        b.submit();
        let (lost, e) = b.take_lost();
        assert_eq!(lost, 17);
        assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::EBADF));
        // Counted once.
        assert_eq!(b.take_lost().0, 0);
        assert!(!b.broken());
    }

    #[test]
    fn a_write_larger_than_the_batch_is_refused() {
        let (_r, w) = pipe();
        let Some(mut b) = batch_or_skip(w.as_raw_fd(), 4, 16) else {
            return;
        };
        assert!(!b.takes(17));
        assert!(!b.push(&[&[0u8; 17]], 1));
        assert!(b.push(&[&[0u8; 16]], 1));
        b.submit();
        assert_eq!(b.take_lost().0, 0);
    }
}
