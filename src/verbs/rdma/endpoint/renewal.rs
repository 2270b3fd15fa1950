//! Renewal: a new QP and CQs in place of the old ones (made ahead by `prepare_spare` when it
//! can), keeping the context, PD, memory and channel; the old ones retired for their
//! grace or destroyed at once; and the GID check that says whether a renewal may be done.

use std::io;
use std::time::Instant;

use crate::verbs::rdma::ffi::*;

use super::super::device;
use super::super::objects::{Cq, ret_errno};
use super::multicast::detach_raw;
use super::open::grh_kind;
use super::{Queues, RdmaEndpoint, Retired, raw_gid};
#[cfg(doc)]
use crate::verbs::Endpoint;
use crate::verbs::retire::{self, Gone, OldQp};
use crate::verbs::{CqKind, Gid, VerbsError};

impl RdmaEndpoint {
    /// [`Endpoint::prepare_spare`]: prepare the spare queues (the retired ones are the
    /// reaper's).
    pub(super) fn maintain_queues(&mut self) -> Result<(), VerbsError> {
        if self.spare.is_none() && !self.spare_refused && self.lost.is_none() && !self.closed {
            let start = Instant::now();
            match self.create_queues() {
                Ok(q) => {
                    self.spare = Some(q);
                    tracing::debug!(
                        ms = start.elapsed().as_secs_f64() * 1e3,
                        "spare QP and CQs prepared for the next renewal"
                    );
                }
                Err(e) => {
                    // Not an error of the datapath: the next renewal creates its own.
                    // Not retried every housekeeping; a renewal allows one more try.
                    self.spare_refused = true;
                    tracing::warn!(error = %e, "no spare QP and CQs: the next renewal creates them");
                }
            }
        }
        Ok(())
    }

    /// [`Endpoint::restart`]: new CQs and QP are created, brought up and attached to the
    /// endpoint's multicast groups while the old ones still exist, and swapped in only
    /// when all of that worked; then the old QP is detached and kept aside with its CQs
    /// (`retired`) until the reaper destroys it. The new QP and CQs are the spare ones
    /// `prepare_spare` prepared, if it did.
    /// On any failure before the swap nothing changes; a failed destroy of the old objects is logged, counted and returned (the
    /// object is forgotten, the new ones are in place).
    /// With [`OldQp::Destroy`], the old QP is destroyed here, before returning, instead of
    /// being retired (see [`Endpoint::restart_destroying_old`]); its CQs are retired.
    /// With [`OldQp::Defer`], it is retired for the caller to destroy (the reaper's only
    /// after `CQ_GRACE`) and the [`Gone`] returned says when it is destroyed
    /// ([`Endpoint::restart_deferring_old`]).
    pub(super) fn restart_queues(&mut self, mode: OldQp) -> Result<Option<Gone>, VerbsError> {
        if let Some(ev) = self.lost {
            return Err(VerbsError::RenewRefused(format!(
                "the device was lost ({ev:?})"
            )));
        }
        if self.closed {
            return Err(VerbsError::RenewRefused("the endpoint is closed".into()));
        }
        // Where the time goes (logged): each step's end, from `t0`.
        let t0 = Instant::now();
        let mut marks = [0.0f64; 8];
        let mut mark = |i: usize| marks[i] = t0.elapsed().as_secs_f64() * 1e3;
        // Nothing is destroyed here: the retired queues are the reaper's.
        let mut first: Option<VerbsError> = None;
        mark(0);
        // Re-read the port and the endpoint's GID entry (they move after port flaps and
        // re-adds): the registered slots are sized for the old MTU and the GID is our
        // address. Only the entry at the endpoint's index is read, not the whole table
        // (one GID and one type instead of a scan: on rxe under emulation the scan was
        // most of the renewal, docs/PERFORMANCE.md): the endpoint stays on its GID as
        // long as the table holds it there. Which GID it would choose now is checked at
        // each GID change the port reports (`gid_now`, by the poller), and a different
        // choice reopens the endpoint (the restart machine does not renew after it).
        let cfg = &self.cfg;
        let port = device::query_port(&self.ctx, &cfg.device, cfg.port)?;
        mark(7);
        let gid = match device::choose_gid(
            &self.ctx,
            &cfg.device,
            cfg.port,
            port.gid_tbl_len,
            Some(self.attrs.gid_index),
        ) {
            Ok(g) => g,
            Err(VerbsError::NoGid { why, .. }) => return Err(VerbsError::RenewRefused(why)),
            Err(e) => return Err(e),
        };
        if port.mtu != self.attrs.port_mtu
            || gid.gid != self.attrs.gid
            || grh_kind(&gid) != self.attrs.grh_kind
        {
            return Err(VerbsError::RenewRefused(format!(
                "port MTU {} / GID {} at index {} now, {} / {} at index {} when opened",
                port.mtu,
                gid.gid,
                gid.index,
                self.attrs.port_mtu,
                self.attrs.gid,
                self.attrs.gid_index
            )));
        }
        mark(1);
        // The queues prepared ahead (`prepare_spare`), else new ones now.
        let spare_used = self.spare.is_some();
        let Queues {
            qp,
            recv_cq,
            send_cq,
            max_inline,
        } = match self.spare.take() {
            Some(q) => q,
            None => self.create_queues()?,
        };
        self.spare_refused = false;
        mark(2);
        // The new QP joins every group before the old one leaves, so the device's group
        // never empties: no multicast filter update on the netdev (rxe), and the IP-level
        // memberships are kept as they are.
        for (i, join) in self.mcast.iter().enumerate() {
            let g = raw_gid(&join.gid);
            // SAFETY: the new QP is live; `g` is a valid GID; LID 0 (RoCE has no LIDs).
            let ret = unsafe { ibv_attach_mcast(qp.as_ptr(), &g, 0) };
            if ret != 0 {
                // Leave the new QP as unattached as it came, so that it can be destroyed.
                for done in &self.mcast[..i] {
                    let _ = self
                        .log
                        .destroyed("ibv_detach_mcast", detach_raw(&qp, &done.gid));
                }
                return Err(VerbsError::verb("ibv_attach_mcast", ret_errno(ret)));
            }
        }
        mark(3);
        let mut keep = |r: Result<(), VerbsError>| {
            if let Err(e) = r {
                first.get_or_insert(e);
            }
        };
        let old_qp = std::mem::replace(&mut self.qp, qp);
        let old_recv = std::mem::replace(&mut self.recv_cq, recv_cq);
        let old_send = std::mem::replace(&mut self.send_cq, send_cq);
        // CQs the old QP still completes into (see `recreate_one_cq`) go with it.
        let abandoned_cqs: Vec<Cq> = std::mem::take(&mut self.abandoned)
            .into_iter()
            .map(|(_, cq)| cq)
            .collect();
        // rxe refuses to destroy a QP that is still attached (EBUSY): detach first.
        for join in &self.mcast {
            keep(
                self.log
                    .destroyed("ibv_detach_mcast", detach_raw(&old_qp, &join.gid)),
            );
        }
        mark(4);
        let mut old = Retired {
            qp: old_qp,
            recv_cq: old_recv,
            send_cq: old_send,
            abandoned: abandoned_cqs,
            gone: None,
        };
        let mut gone = None;
        match mode {
            OldQp::Destroy => {
                // The old QP may still own slots that are about to be re-posted: it goes
                // now. This runs on the supervisor's thread (a restart), never on the
                // poller's. Its CQs, never polled, go to the reaper, due shortly after
                // the restart (`retire::CQ_GRACE`): with the QP gone nothing completes
                // into them, and their destroys (1-11 ms each restart under load in the
                // lab) leave the restart's critical path.
                keep(old.qp.close());
                mark(5);
                keep(
                    self.retired
                        .retire_for(Instant::now(), retire::CQ_GRACE, old),
                );
                mark(6);
            }
            OldQp::Defer => {
                // The old QP may still own slots, which nobody re-posts until it is gone
                // (the caller posts the new QP's from another bank). The caller destroys
                // it when its new epoch runs (`Reaper::reap_awaited`), and waits for the
                // `Gone`; the reaper thread only if it is still here a `CQ_GRACE` later.
                // Not due at once: the reaper thread would then destroy it in the middle
                // of the restart, competing with it for the CPU.
                let (signal, waiter) = retire::gone_pair();
                old.gone = Some(signal);
                gone = Some(waiter);
                keep(
                    self.retired
                        .retire_for(Instant::now(), retire::CQ_GRACE, old),
                );
            }
            OldQp::Retire => {
                // The old QP (in the error state with every WR flushed, in no group, never
                // polled again) and its CQs are destroyed later, by the reaper, once
                // their grace is over: off the restart's critical path and off the poller
                // thread, and after rxe has let go of the QP's packets.
                keep(self.retired.retire(Instant::now(), old));
            }
        }
        self.recvs_in_flight = 0;
        self.sends_in_flight = 0;
        let old_qpn = self.attrs.qpn;
        self.attrs.qpn = self.qp.qp_num();
        self.attrs.max_inline = max_inline;
        // (`qp_destroyed_ms` and `cqs_retired_ms` only when the old QP is destroyed here:
        // its destroy, then its CQs handed to the reaper; `query_port_ms` is the end of
        // the port's query, `port_ms` of the GID entry's read after it.)
        let [
            prev_ms,
            port_ms,
            queues_ms,
            attach_ms,
            detach_ms,
            qp_destroyed_ms,
            cqs_retired_ms,
            query_port_ms,
        ] = marks;
        tracing::debug!(
            device = %self.attrs.device, old_qpn, qpn = self.attrs.qpn, spare_used, old = ?mode,
            prev_ms, query_port_ms, port_ms, queues_ms, attach_ms, detach_ms, qp_destroyed_ms, cqs_retired_ms,
            "verbs endpoint renewed: new QP and CQs, context, PD, MR and channel kept \
             (ms since the start of the renewal at the end of each step)"
        );
        match first {
            None => Ok(gone),
            Some(e) => Err(e),
        }
    }

    /// [`Endpoint::gid_now`]: the GID the port's table gives now.
    pub(super) fn gid_choice_now(&mut self) -> Result<Option<(Gid, u8)>, VerbsError> {
        if self.lost.is_some() || self.closed {
            return Ok(None);
        }
        let cfg = &self.cfg;
        let port = device::query_port(&self.ctx, &cfg.device, cfg.port)?;
        match device::choose_gid(
            &self.ctx,
            &cfg.device,
            cfg.port,
            port.gid_tbl_len,
            cfg.gid_index,
        ) {
            Ok(g) => Ok(Some((g.gid, g.index))),
            Err(VerbsError::NoGid { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

impl RdmaEndpoint {
    /// [`Endpoint::recreate_cq`]: a new CQ of the same depth on the endpoint's channel
    /// takes the old one's place for polling and arming; the old one is destroyed if the
    /// device lets it go, else kept (with the kind it was) until the QP is gone.
    pub(super) fn recreate_one_cq(
        &mut self,
        kind: CqKind,
    ) -> Result<crate::verbs::CqRecreated, VerbsError> {
        if self.lost.is_some() || self.closed {
            return Err(VerbsError::RenewRefused(
                "the device is gone; no CQ can be made".into(),
            ));
        }
        let depth = match kind {
            CqKind::Recv => self.attrs.recv_slots,
            CqKind::Send => self.attrs.send_slots,
        };
        let new = Cq::create(&self.ctx, depth, &self.channel, &self.log)?;
        let mut old = match kind {
            CqKind::Recv => std::mem::replace(&mut self.recv_cq, new),
            CqKind::Send => std::mem::replace(&mut self.send_cq, new),
        };
        let refusal = match old.try_close() {
            Ok(()) => None,
            Err(errno) => {
                let why = if errno == libc::EBUSY {
                    format!(
                        "ibv_destroy_cq: {} (QP {} still uses it)",
                        io::Error::from_raw_os_error(errno),
                        self.attrs.qpn
                    )
                } else {
                    format!("ibv_destroy_cq: {}", io::Error::from_raw_os_error(errno))
                };
                self.abandoned.push((kind, old));
                Some(why)
            }
        };
        let bound_elsewhere = self.abandoned.iter().any(|(k, _)| *k == kind);
        tracing::debug!(cq = ?kind, old_destroyed = refusal.is_none(), bound_elsewhere, "CQ re-created, QP kept");
        Ok(crate::verbs::CqRecreated {
            old_destroyed: refusal.is_none(),
            refusal,
            qp_bound_elsewhere: bound_elsewhere,
        })
    }
}
