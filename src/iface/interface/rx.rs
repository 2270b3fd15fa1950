//! The receive path: receive completions polled, each packet checked against what the
//! hardware reports and written to the TAP, the receive ring re-posted.

use super::*;
use crate::iface::aqm;
use crate::wire::translate::{
    self, Local, RX_IN_PLACE_AT, Received, RecvMeta, RxDrop, RxFact, RxVerdict, Sender, Standing,
};
use std::net::IpAddr;

impl Interface {
    /// Handle up to the budget of receive completions, writing packets to `tap`, and
    /// re-post the receive ring. A failed poll is returned at once, never retried.
    pub fn poll_rx(&mut self, tap: &dyn FrameIo, now: Instant) -> Result<usize, Failure> {
        let mut done = 0;
        let mut polled = Ok(());
        while done < self.budget {
            let want = self.poll_batch.min(self.budget - done);
            let n = match self.poll_recv_batch(want, Some(tap), now) {
                Ok(n) => n,
                Err(e) => {
                    polled = Err(e);
                    break;
                }
            };
            done += n;
            if n < want {
                // The CQ was empty: whatever waited in it was a burst, not a standing
                // queue (`aqm`).
                self.aqm.on_drained();
                break;
            }
        }
        if done >= self.budget {
            self.aqm.on_backlog(now);
        }
        // What the TAP held back to join goes out now, even when the poll failed.
        let lost = tap.flush();
        if lost > 0 {
            for _ in 0..lost {
                self.stats.count_drop(DropReason::RxTapWrite);
            }
            if self.log.allow(now) {
                tracing::warn!(frames = lost, "writing received frames to the TAP failed");
            }
        }
        polled?;
        self.check_flushes()?;
        if done > 0 {
            self.fill_recv().map_err(Failure::Verbs)?;
        }
        Ok(done)
    }

    /// Flushes outside a teardown mean the QP is in the error state, and a post that left
    /// the ledger unsure of what was posted breaks the epoch: hand over.
    pub(super) fn check_flushes(&mut self) -> Result<(), Failure> {
        self.check_broken()?;
        if self.unexpected_flushes > 0 {
            let n = std::mem::take(&mut self.unexpected_flushes);
            return Err(Failure::QpError(n));
        }
        Ok(())
    }

    pub(super) fn check_broken(&mut self) -> Result<(), Failure> {
        if let Some(e) = self.broken.take() {
            self.untrusted = true;
            return Err(Failure::Verbs(e));
        }
        Ok(())
    }

    pub(super) fn on_recv(&mut self, c: Completion, tap: Option<&dyn FrameIo>, now: Instant) {
        let slot = match self.ledger.complete(Ring::Recv, c.wr_id, c.status) {
            Ok(a) => a.id.slot,
            Err(e) => {
                stats::add(&self.stats.completions_rejected, 1);
                if self.log.allow(now) {
                    tracing::warn!(error = %e, "receive completion rejected by the ledger");
                }
                return;
            }
        };
        match c.status {
            WcStatus::Success => {}
            WcStatus::Flushed => {
                stats::add(&self.stats.recv_flushed, 1);
                if !self.draining {
                    self.unexpected_flushes += 1;
                }
                return;
            }
            WcStatus::Error(code) => {
                stats::add(&self.stats.recv_completed, 1);
                self.stats.count_drop(DropReason::RxCompletionError);
                if self.log.allow(now) {
                    tracing::warn!(status = code, "receive completed with an error");
                }
                return;
            }
        }
        stats::add(&self.stats.recv_completed, 1);
        let len = (c.byte_len as usize).min(self.ep.attrs().max_payload as usize + GRH_LEN);
        let kind = self.ep.attrs().grh_kind;
        let local = self.local();
        let meta = RecvMeta {
            src_qp: c.src_qp,
            has_grh: c.has_grh,
        };
        // The receive buffer lives in the endpoint, the frame scratch in another field. A
        // data packet's Ethernet header is written in front of it in the receive buffer,
        // which is not posted again before this completion is done: no copy.
        let buf = self.ep.recv_buf_mut(slot);
        let end = len.min(buf.len());
        let got = translate::receive_in_place(&mut buf[..end], meta, kind, &local, &mut self.frame);
        let r = self.apply_rx(got, now);
        match r {
            Ok(Some(_)) if tap.is_none() => self.stats.count_drop(DropReason::RxTeardown),
            Ok(Some((n, in_place))) => {
                let frame = if in_place {
                    self.ep
                        .recv_buf(slot)
                        .get(RX_IN_PLACE_AT..RX_IN_PLACE_AT + n)
                        .unwrap_or(&[])
                } else {
                    &self.frame[..n]
                };
                // The receive queue has stood too long: CoDel's drop, of TCP data only
                // (never in a teardown's drain, which delivers what is left).
                if !self.draining
                    && self.aqm.standing(now)
                    && aqm::tcp_carries_data(frame)
                    && self.aqm.should_drop(now)
                {
                    self.stats.count_drop(DropReason::RxAqm);
                    return;
                }
                match tap.map_or(Ok(0), |t| t.write_frame(frame)) {
                    Ok(_) => {
                        stats::add(&self.stats.rx_packets, 1);
                        stats::add(
                            &self.stats.rx_bytes,
                            n.saturating_sub(eth::HEADER_LEN) as u64,
                        );
                    }
                    Err(e) => {
                        self.stats.count_drop(DropReason::RxTapWrite);
                        if self.log.allow(now) {
                            tracing::warn!(error = %e, "writing a received frame to the TAP failed");
                        }
                    }
                }
            }
            Ok(None) => {}
            Err(reason) => {
                self.stats.count_drop(reason);
                if self.log.allow(now) {
                    tracing::debug!(reason = reason.name(), src_qp = c.src_qp, "receive dropped");
                }
            }
        }
    }

    /// One `poll_cq` of up to `want` receive completions, each handled (delivered to
    /// `tap`, or with none counted as dropped). Never polls after a failed poll.
    pub(super) fn poll_recv_batch(
        &mut self,
        want: usize,
        tap: Option<&dyn FrameIo>,
        now: Instant,
    ) -> Result<usize, Failure> {
        let n = self.poll(CqKind::Recv, want)?;
        for i in 0..n {
            let c = self.wc[i];
            self.on_recv(c, tap, now);
        }
        Ok(n)
    }
}

impl Interface {
    /// Who this interface is, for the translation.
    pub(super) fn local(&self) -> Local {
        Local {
            hw: self.own_hw,
            mac: self.own_mac,
            addr: self.addr,
            addr6: self.addr6,
        }
    }

    /// Apply what the translation found to the neighbours and counters.
    /// `Ok(Some((n, in_place)))`: write `n` bytes of the frame to the TAP, from the frame
    /// scratch or (`in_place`) from the receive buffer at [`RX_IN_PLACE_AT`]; `Ok(None)`:
    /// consumed (own loopback); `Err`: dropped for that reason.
    fn apply_rx(
        &mut self,
        got: Received,
        now: Instant,
    ) -> Result<Option<(usize, bool)>, DropReason> {
        match got.fact {
            RxFact::None => {}
            RxFact::OwnLoopback => stats::add(&self.stats.rx_own_looped, 1),
            RxFact::Arp(sender) => {
                stats::add(&self.stats.arp_rx, 1);
                self.learn_from(sender, false, now)?;
            }
            RxFact::Nd(sender) => {
                stats::add(&self.stats.nd_rx, 1);
                self.learn_from(sender, true, now)?;
            }
            RxFact::Data { from } => {
                if let Seen::OtherQpn { .. } = self.neigh.seen(from, now) {
                    stats::add(&self.stats.rx_unknown_qpn, 1);
                }
            }
        }
        match got.verdict {
            RxVerdict::Deliver(n) => Ok(Some((n, false))),
            RxVerdict::DeliverInPlace(n) => Ok(Some((n, true))),
            RxVerdict::Consumed => Ok(None),
            RxVerdict::Drop(why) => Err(rx_drop_reason(why)),
        }
    }
}

impl Interface {
    /// Learn what an ARP or neighbour discovery message says about its sender, as far as
    /// its standing allows. A sender whose MAC stands for another peer's GID is dropped.
    /// `nd`: it came by neighbour discovery (else by ARP), for the counters.
    fn learn_from<I: Into<IpAddr>>(
        &mut self,
        sender: Sender<I>,
        nd: bool,
        now: Instant,
    ) -> Result<(), DropReason> {
        let not_learned = |st: &Stats| {
            if nd {
                stats::add(&st.nd_not_learned, 1);
            } else {
                stats::add(&st.arp_not_learned, 1);
            }
        };
        match sender {
            Sender::Refused | Sender::Silent => {}
            Sender::Probe => not_learned(&self.stats),
            Sender::Claim { ip, hw, standing } => {
                let trust = match standing {
                    Standing::Addressed => Trust::Create,
                    Standing::Announcement => Trust::Update,
                    Standing::Overheard => Trust::Refresh,
                };
                let ip: IpAddr = ip.into();
                let evicted = self.neigh.evicted();
                let (_, learned) = self
                    .neigh
                    .learn(Some(ip), hw, trust, now, &mut self.destroy);
                // A new peer in a full table pushed the least recently seen one out.
                stats::add(&self.stats.neigh_evicted, self.neigh.evicted() - evicted);
                match learned {
                    Learned::New => stats::add(&self.stats.neigh_learned, 1),
                    Learned::QpnChanged { old_qpn } => {
                        stats::add(&self.stats.neigh_updated, 1);
                        tracing::info!(%ip, old_qpn, new_qpn = hw.qpn, "peer moved to a new QPN");
                    }
                    Learned::Refreshed => {}
                    Learned::Unknown | Learned::Conflict => not_learned(&self.stats),
                    // Another GID behind the sender's MAC: not passed on.
                    Learned::Collision => {
                        return Err(if nd {
                            DropReason::RxBadNd
                        } else {
                            DropReason::RxBadArp
                        });
                    }
                }
            }
        }
        Ok(())
    }
}

/// The counter a receive dropped by the translation goes to.
fn rx_drop_reason(why: RxDrop) -> DropReason {
    match why {
        RxDrop::Short => DropReason::RxShort,
        RxDrop::NoGrh => DropReason::RxNoGrh,
        RxDrop::BadGrh => DropReason::RxBadGrh,
        RxDrop::BadHeader => DropReason::RxBadHeader,
        RxDrop::BadArp => DropReason::RxBadArp,
        RxDrop::ArpSpoofed => DropReason::RxArpSpoofed,
        RxDrop::ArpOffSubnet => DropReason::RxArpOffSubnet,
        RxDrop::BadIpv4 => DropReason::RxBadIpv4,
        RxDrop::BadIpv6 => DropReason::RxBadIpv6,
        RxDrop::BadNd => DropReason::RxBadNd,
        RxDrop::NdSpoofed => DropReason::RxNdSpoofed,
        RxDrop::NdOffLink => DropReason::RxNdOffLink,
        RxDrop::Unsupported => DropReason::RxUnsupported,
    }
}
