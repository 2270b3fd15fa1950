//! The hot path: posting receives and sends (one chain, one doorbell), polling a CQ,
//! arming it, and taking the completion channel's events. Nothing here allocates: work
//! requests, SGEs and work completions live in arrays sized at open.

use std::io;
use std::os::raw::{c_int, c_void};
use std::ptr;

use crate::verbs::rdma::ffi::*;

use super::super::objects::{last_errno, ret_errno, zeroed};
use super::RdmaEndpoint;
#[cfg(doc)]
use crate::verbs::Endpoint;
use crate::verbs::{
    Completion, CqKind, PostRecvError, PostSendError, RecvWr, SendWr, VerbsError, WcStatus,
};

impl RdmaEndpoint {
    /// [`Endpoint::post_recv`]: one receive, one `ibv_post_recv`.
    #[inline]
    pub(super) fn post_one_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        if self.recvs_in_flight >= self.attrs.recv_slots {
            // Full: see `sends_in_flight`.
            return Err(VerbsError::verb("ibv_post_recv", libc::ENOMEM));
        }
        let off = self
            .layout
            .recv_offset(slot)
            .ok_or_else(|| VerbsError::Invalid {
                field: "slot",
                why: format!(
                    "receive slot {slot} of {}",
                    self.attrs.recv_slots * self.attrs.banks
                ),
            })?;
        let mut sge = ibv_sge {
            addr: self.region.addr(off),
            length: self.recv_sge_len,
            lkey: self.mr.lkey(),
        };
        let mut wr: ibv_recv_wr = zeroed();
        wr.wr_id = wr_id;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; `wr` and `sge` outlive the call (the provider copies
        // them); the SGE covers one receive slot inside the MR.
        let ret = unsafe { ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            self.recvs_in_flight += 1;
            Ok(())
        } else {
            Err(VerbsError::verb("ibv_post_recv", ret_errno(ret)))
        }
    }

    /// [`Endpoint::post_recv_chain`]: the receives that fit, linked, one `ibv_post_recv`.
    #[inline]
    pub(super) fn post_recv_list(&mut self, wrs: &[RecvWr]) -> Result<(), PostRecvError> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        let reject = |error| Err(PostRecvError { posted: 0, error });
        // Only as many as the receive CQ has room for (see `sends_in_flight`).
        let room = self.attrs.recv_slots.saturating_sub(self.recvs_in_flight) as usize;
        let fit = n.min(room).min(self.recv_wrs.len());
        if fit == 0 {
            return reject(VerbsError::verb("ibv_post_recv", libc::ENOMEM));
        }
        let lkey = self.mr.lkey();
        // Validate and fill the scratch arrays; nothing is posted if any WR is invalid.
        for (i, w) in wrs[..fit].iter().enumerate() {
            let Some(off) = self.layout.recv_offset(w.slot) else {
                return reject(VerbsError::Invalid {
                    field: "slot",
                    why: format!(
                        "receive slot {} of {}",
                        w.slot,
                        self.attrs.recv_slots * self.attrs.banks
                    ),
                });
            };
            self.recv_sges[i] = ibv_sge {
                addr: self.region.addr(off),
                length: self.recv_sge_len,
                lkey,
            };
            let wr = &mut self.recv_wrs[i];
            wr.wr_id = w.wr_id;
            wr.num_sge = 1;
        }
        let wr_base = link_chain(&mut self.recv_wrs, &mut self.recv_sges, fit);
        let mut bad: *mut ibv_recv_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain of `fit` WRs and their SGEs lies in arrays
        // that outlive the call (the provider copies them); every SGE covers one receive
        // slot inside the MR.
        let ret = unsafe { ibv_post_recv(self.qp.as_ptr(), wr_base, &mut bad) };
        if ret == 0 {
            self.recvs_in_flight += fit as u32;
            return if fit == n {
                Ok(())
            } else {
                Err(PostRecvError {
                    posted: fit,
                    error: VerbsError::verb("ibv_post_recv", libc::ENOMEM),
                })
            };
        }
        let Some(posted) = posted_before(wr_base, bad, fit) else {
            // Nothing says how many were posted: all of them may be, so all are taken as
            // posted (reaped once the QP is destroyed), and the interface restarts.
            self.recvs_in_flight += fit as u32;
            return Err(PostRecvError {
                posted: fit,
                error: VerbsError::BadWrOutsideChain {
                    verb: "ibv_post_recv",
                    source: io::Error::from_raw_os_error(ret_errno(ret)),
                },
            });
        };
        self.recvs_in_flight += posted as u32;
        Err(PostRecvError {
            posted,
            error: VerbsError::verb("ibv_post_recv", ret_errno(ret)),
        })
    }

    /// [`Endpoint::post_send`]: the sends whose completions fit, linked, one
    /// `ibv_post_send`.
    #[inline]
    pub(super) fn post_send_list(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        let n = wrs.len();
        if n == 0 {
            return Ok(());
        }
        let reject = |error| Err(PostSendError { posted: 0, error });
        if n > self.send_wrs.len() {
            return reject(VerbsError::Invalid {
                field: "post_send",
                why: format!(
                    "chain of {n} exceeds the send queue ({})",
                    self.send_wrs.len()
                ),
            });
        }
        let lkey = self.mr.lkey();
        let max_inline = self.attrs.max_inline;
        // Validate and fill the scratch arrays; nothing is posted if any WR is invalid.
        for (i, w) in wrs.iter().enumerate() {
            let Some(off) = self.layout.send_offset(w.slot) else {
                return reject(VerbsError::Invalid {
                    field: "slot",
                    why: format!(
                        "send slot {} of {}",
                        w.slot,
                        self.attrs.send_slots * self.attrs.banks
                    ),
                });
            };
            if w.len > self.attrs.max_payload {
                return reject(VerbsError::Invalid {
                    field: "len",
                    why: format!(
                        "send of {} bytes exceeds max_payload {}",
                        w.len, self.attrs.max_payload
                    ),
                });
            }
            let Some(ah) = self.ah_ptr(w.dest.ah) else {
                return reject(VerbsError::UnknownAh(w.dest.ah));
            };
            self.send_sges[i] = ibv_sge {
                addr: self.region.addr(off),
                length: w.len,
                lkey,
            };
            let mut flags = 0;
            if w.signaled {
                flags |= ibv_send_flags::IBV_SEND_SIGNALED.0;
            }
            if max_inline > 0 && w.len <= max_inline {
                flags |= ibv_send_flags::IBV_SEND_INLINE.0;
            }
            let wr = &mut self.send_wrs[i];
            wr.wr_id = w.wr_id;
            wr.num_sge = 1;
            wr.opcode = ibv_wr_opcode::IBV_WR_SEND;
            wr.send_flags = flags;
            wr.wr = ibv_send_wr_wr {
                ud: ibv_send_wr_ud {
                    ah,
                    remote_qpn: w.dest.qpn,
                    remote_qkey: w.dest.qkey,
                },
            };
        }
        // Post only the prefix whose signalled sends fit in the send CQ (see `sends_in_flight`).
        let room = self.attrs.send_slots.saturating_sub(self.sends_in_flight);
        let fit = signaled_prefix(wrs, room);
        if fit == 0 {
            return reject(VerbsError::verb("ibv_post_send", libc::ENOMEM));
        }
        let wr_base = link_chain(&mut self.send_wrs, &mut self.send_sges, fit);
        let mut bad: *mut ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is live; the chain of `fit` WRs and their SGEs lies in arrays
        // that outlive the call; every SGE covers part of one send slot inside the MR and
        // every AH is live and owned by this endpoint.
        let ret = unsafe { ibv_post_send(self.qp.as_ptr(), wr_base, &mut bad) };
        let signaled = |wrs: &[SendWr]| wrs.iter().filter(|w| w.signaled).count() as u32;
        if ret == 0 {
            self.sends_in_flight += signaled(&wrs[..fit]);
            return if fit == n {
                Ok(())
            } else {
                Err(PostSendError {
                    posted: fit,
                    error: VerbsError::verb("ibv_post_send", libc::ENOMEM),
                })
            };
        }
        let Some(posted) = posted_before(wr_base, bad, fit) else {
            // As for receives: all of the chain is taken as posted, and the interface
            // restarts.
            self.sends_in_flight += signaled(&wrs[..fit]);
            return Err(PostSendError {
                posted: fit,
                error: VerbsError::BadWrOutsideChain {
                    verb: "ibv_post_send",
                    source: io::Error::from_raw_os_error(ret_errno(ret)),
                },
            });
        };
        self.sends_in_flight += signaled(&wrs[..posted]);
        Err(PostSendError {
            posted,
            error: VerbsError::verb("ibv_post_send", ret_errno(ret)),
        })
    }

    /// [`Endpoint::poll_cq`]: a negative `ibv_poll_cq` is [`VerbsError::PollFailed`].
    #[inline]
    pub(super) fn poll_into(
        &mut self,
        cq: CqKind,
        out: &mut [Completion],
    ) -> Result<usize, VerbsError> {
        let n = out.len().min(self.wcs.len()).min(c_int::MAX as usize);
        if n == 0 {
            return Ok(0);
        }
        // SAFETY: the CQ is live; `wcs` has room for `n` completions.
        let ret = unsafe { ibv_poll_cq(self.cq(cq), n as c_int, self.wcs.as_mut_ptr()) };
        if ret < 0 {
            return Err(VerbsError::PollFailed { cq, ret });
        }
        let got = usize::try_from(ret).unwrap_or(0).min(n);
        let in_flight = match cq {
            CqKind::Recv => &mut self.recvs_in_flight,
            CqKind::Send => &mut self.sends_in_flight,
        };
        // Saturating: flushed unsignalled sends complete too.
        *in_flight = in_flight.saturating_sub(got as u32);
        for (o, wc) in out.iter_mut().zip(&self.wcs[..got]) {
            *o = completion(wc);
        }
        Ok(got)
    }

    /// [`Endpoint::req_notify`].
    #[inline]
    pub(super) fn arm_cq(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        // SAFETY: the CQ is live; 0 = notify on any completion, not only solicited.
        let ret = unsafe { ibv_req_notify_cq(self.cq(cq), 0) };
        if ret == 0 {
            Ok(())
        } else {
            Err(VerbsError::verb("ibv_req_notify_cq", ret_errno(ret)))
        }
    }

    /// Read every pending completion event, acknowledge them, and count those for `recv`
    /// and `send` (the endpoint's CQs, or during a renewal the old ones).
    pub(super) fn take_cq_events_of(
        &mut self,
        recv: *mut ibv_cq,
        send: *mut ibv_cq,
    ) -> Result<(u32, u32), VerbsError> {
        let (mut n_recv, mut n_send) = (0u32, 0u32);
        let mut failure = None;
        loop {
            let mut cq: *mut ibv_cq = ptr::null_mut();
            let mut cq_ctx: *mut c_void = ptr::null_mut();
            // SAFETY: the channel is live and its fd nonblocking; both out-pointers are
            // valid. No other thread reads this channel (`&mut self`).
            let ret = unsafe { ibv_get_cq_event(self.channel.as_ptr(), &mut cq, &mut cq_ctx) };
            if ret != 0 {
                match last_errno() {
                    libc::EAGAIN => break,
                    libc::EINTR => continue,
                    e => {
                        failure = Some(VerbsError::verb("ibv_get_cq_event", e));
                        break;
                    }
                }
            }
            if cq == recv {
                n_recv = n_recv.saturating_add(1);
            } else if cq == send {
                n_send = n_send.saturating_add(1);
            } else if !cq.is_null() {
                // Another CQ of this channel: one a renewal retired (events of its last
                // completions may still come until it is destroyed). Acknowledge it at
                // once so that destroying it never waits; it means nothing to the
                // current QP.
                // SAFETY: only this endpoint's CQs use this channel, and a CQ whose
                // events are not all acknowledged is still live: ibv_destroy_cq, also
                // when the reaper thread runs it concurrently, waits for every event the
                // kernel reported to be acknowledged, and the kernel drops the unread
                // events of a destroyed CQ; so `cq` is live.
                unsafe { ibv_ack_cq_events(cq, 1) };
            }
        }
        // Acknowledge in batch, on the error path too: an unacknowledged event makes
        // ibv_destroy_cq wait forever.
        for (cq, n) in [(recv, n_recv), (send, n_send)] {
            if n > 0 {
                // SAFETY: the CQ is live and `n` events were taken for it above.
                unsafe { ibv_ack_cq_events(cq, n) };
            }
        }
        match failure {
            None => Ok((n_recv, n_send)),
            Some(e) => Err(e),
        }
    }
}

/// A work completion in the provider-independent form.
fn completion(wc: &ibv_wc) -> Completion {
    Completion {
        wr_id: wc.wr_id,
        status: match wc.status {
            ibv_wc_status::IBV_WC_SUCCESS => WcStatus::Success,
            ibv_wc_status::IBV_WC_WR_FLUSH_ERR => WcStatus::Flushed,
            other => WcStatus::Error(other),
        },
        byte_len: wc.byte_len,
        src_qp: wc.src_qp,
        has_grh: wc.wc_flags & ibv_wc_flags::IBV_WC_GRH.0 != 0,
    }
}

/// How many leading work requests of `wrs` can be posted while at most `room` signalled
/// sends may be added.
fn signaled_prefix(wrs: &[SendWr], room: u32) -> usize {
    let mut left = room;
    for (i, w) in wrs.iter().enumerate() {
        if w.signaled {
            if left == 0 {
                return i;
            }
            left -= 1;
        }
    }
    wrs.len()
}

/// A verbs work request as a chain links it: to its SGE and to the next request.
trait Chained {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self);
}

impl Chained for ibv_recv_wr {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self) {
        self.sg_list = sge;
        self.next = next;
    }
}

impl Chained for ibv_send_wr {
    fn link(&mut self, sge: *mut ibv_sge, next: *mut Self) {
        self.sg_list = sge;
        self.next = next;
    }
}

/// Link `wrs[..n]` into one chain, the i-th request to `sges[i]`, and return its head.
/// The pointers are taken once from each array and written through, so the chain stays
/// valid for the post that follows as long as the arrays are not touched in between.
fn link_chain<W: Chained>(wrs: &mut [W], sges: &mut [ibv_sge], n: usize) -> *mut W {
    let n = n.min(wrs.len()).min(sges.len());
    let wr_base = wrs.as_mut_ptr();
    let sge_base = sges.as_mut_ptr();
    for i in 0..n {
        // SAFETY: `i < n <= len` of both arrays, so every pointer is in bounds; no other
        // reference to either array is alive while the chain is written.
        unsafe {
            let next = if i + 1 < n {
                wr_base.add(i + 1)
            } else {
                ptr::null_mut()
            };
            (*wr_base.add(i)).link(sge_base.add(i), next);
        }
    }
    wr_base
}

/// How many work requests of a chain starting at `base` (length `n`) precede `bad`, the
/// first one the provider did not post. `None` when `bad` is not in the chain.
fn posted_before<T>(base: *const T, bad: *const T, n: usize) -> Option<usize> {
    let size = std::mem::size_of::<T>();
    let delta = (bad as usize).checked_sub(base as usize)?;
    (delta % size == 0 && delta / size < n).then_some(delta / size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::AhHandle;

    #[test]
    fn wc_mapping() {
        let mut wc: ibv_wc = zeroed();
        wc.wr_id = 7;
        wc.byte_len = 140;
        wc.src_qp = 17;
        wc.wc_flags = ibv_wc_flags::IBV_WC_GRH.0;
        assert_eq!(
            completion(&wc),
            Completion {
                wr_id: 7,
                status: WcStatus::Success,
                byte_len: 140,
                src_qp: 17,
                has_grh: true
            }
        );
        wc.status = ibv_wc_status::IBV_WC_WR_FLUSH_ERR;
        wc.wc_flags = 0;
        let c = completion(&wc);
        assert_eq!((c.status, c.has_grh), (WcStatus::Flushed, false));
        wc.status = ibv_wc_status::IBV_WC_LOC_LEN_ERR;
        assert_eq!(completion(&wc).status, WcStatus::Error(1));
    }

    #[test]
    fn signaled_prefix_counts_only_signalled() {
        let wr = |signaled| SendWr {
            wr_id: 0,
            slot: 0,
            len: 0,
            dest: crate::verbs::Dest {
                ah: AhHandle(0),
                qpn: 0,
                qkey: 0,
            },
            signaled,
        };
        let chain = [wr(true), wr(false), wr(true), wr(true)];
        assert_eq!(signaled_prefix(&chain, 0), 0);
        assert_eq!(signaled_prefix(&chain, 1), 2);
        assert_eq!(signaled_prefix(&chain, 2), 3);
        assert_eq!(signaled_prefix(&chain, 3), 4);
        assert_eq!(signaled_prefix(&[wr(false)], 0), 1);
    }

    #[test]
    fn bad_wr_offsets() {
        let wrs: Vec<ibv_send_wr> = (0..4).map(|_| zeroed()).collect();
        let base = wrs.as_ptr();
        assert_eq!(posted_before(base, base, 4), Some(0));
        assert_eq!(posted_before(base, base.wrapping_add(3), 4), Some(3));
        assert_eq!(posted_before(base, base.wrapping_add(4), 4), None);
        assert_eq!(posted_before(base, ptr::null(), 4), None);
        let odd = (base as usize + 1) as *const ibv_send_wr;
        assert_eq!(posted_before(base, odd, 4), None);
    }

    #[test]
    fn a_chain_links_each_request_to_its_sge_and_the_next() {
        let mut wrs: Vec<ibv_recv_wr> = (0..4).map(|_| zeroed()).collect();
        let mut sges: Vec<ibv_sge> = (0..4).map(|_| zeroed()).collect();
        let head = link_chain(&mut wrs, &mut sges, 3);
        assert_eq!(head, wrs.as_mut_ptr());
        let sge_base = sges.as_mut_ptr();
        for (i, wr) in wrs[..3].iter().enumerate() {
            assert_eq!(wr.sg_list, sge_base.wrapping_add(i));
        }
        let base = wrs.as_mut_ptr();
        assert_eq!(wrs[0].next, base.wrapping_add(1));
        assert_eq!(wrs[1].next, base.wrapping_add(2));
        assert!(wrs[2].next.is_null(), "the chain ends at n");
        // The request past the chain is left as it was.
        assert!(wrs[3].sg_list.is_null() && wrs[3].next.is_null());
        // n beyond the arrays links what there is.
        let mut short: Vec<ibv_sge> = (0..2).map(|_| zeroed()).collect();
        let mut send: Vec<ibv_send_wr> = (0..4).map(|_| zeroed()).collect();
        link_chain(&mut send, &mut short, 4);
        assert!(send[1].next.is_null() && send[2].sg_list.is_null());
    }
}
