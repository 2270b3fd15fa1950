//! Closing an epoch: the QP moved to error, flushes drained, every work request still
//! outstanding reaped, and the endpoint destroyed or kept for the next epoch.

use super::*;

/// How long a teardown sleeps when a drain poll finds no flush completion yet (rxe
/// generates them in the kernel after the QP went to error). Was 1 ms; a restart's
/// drain takes 2-4 ms in the lab, so a finer nap notices the flushes sooner.
const DRAIN_NAP: Duration = Duration::from_micros(200);

/// What a teardown found.
#[derive(Debug, Clone)]
pub struct Teardown {
    /// Work requests reaped (their completion never came).
    pub reaped: u64,
    /// Of those, sends (each counted as a drop with reason `reaped`).
    pub sends_reaped: u64,
    /// Flush completions drained before the deadline.
    pub flushed: u64,
    /// Time spent moving the QP to error and draining flushes.
    pub drain: Duration,
    /// Time spent detaching and destroying the verbs objects.
    pub destroy: Duration,
    /// Destroy calls that failed.
    pub errors: u64,
    /// The ledger's verdict after the reap.
    pub ledger: Result<(), String>,
    /// Whether the endpoint was kept for the next epoch ([`Interface::recycle`] with
    /// [`Endpoint::renew`] working): only its QP and CQs were replaced. Of `destroy`,
    /// `renew` was spent replacing them.
    pub kept: bool,
    /// Time spent in [`Endpoint::renew`] (zero when not kept).
    pub renew: Duration,
}

/// An endpoint kept across a restart by [`Interface::recycle`] (QP and CQs renewed),
/// with the broadcast group's address handle, for [`Interface::reopen`].
pub struct KeptEndpoint {
    pub(super) ep: Box<dyn Endpoint>,
    pub(super) group_ah: AhHandle,
}

impl KeptEndpoint {
    /// Close it instead of reopening on it. Its address handles go with it, so the
    /// neighbour table (which still names them) forgets them; they are counted as
    /// destroyed.
    pub fn close(self, neigh: Option<&mut Neighbours>, stats: &Stats) {
        forget_ahs(neigh, stats);
        drop(self.ep);
    }
}

/// The endpoint that owned the neighbours' address handles (and the group's) is gone:
/// forget them and count them destroyed.
pub(super) fn forget_ahs(neigh: Option<&mut Neighbours>, stats: &Stats) {
    let n = neigh.map_or(0, |n| n.take_ahs().len() as u64);
    stats::add(&stats.ah_destroyed, n + 1);
}

impl Interface {
    /// Tear down in order: QP to error, drain flushes (bounded by `deadline`), detach the
    /// group, destroy AHs, destroy the endpoint, reap what never completed, check the
    /// ledger. Never panics; failures are counted. Receives that complete during the
    /// drain have nowhere to go and are counted as dropped (`rx_teardown`): use
    /// [`Interface::shutdown_into`] where the TAP is still there.
    /// The neighbour table is handed back for the next epoch.
    pub fn shutdown(self, deadline: Duration) -> (Teardown, Neighbours) {
        let (t, neigh, _) = self.teardown(deadline, None, false);
        (t, neigh)
    }

    /// [`Interface::shutdown`], delivering the receives that complete during the drain
    /// to `tap`.
    pub fn shutdown_into(self, deadline: Duration, tap: &dyn FrameIo) -> (Teardown, Neighbours) {
        let (t, neigh, _) = self.teardown(deadline, Some(tap), false);
        (t, neigh)
    }

    /// Like [`Interface::shutdown_into`], but instead of destroying the endpoint, replace
    /// its QP and CQs ([`Endpoint::renew`]) and hand it back for [`Interface::reopen`]:
    /// device context, PD, registered memory, completion channel, the broadcast group's
    /// membership and the neighbours' address handles survive. What was
    /// posted on the old QP is reaped exactly as after a full teardown (the old QP and
    /// CQs are destroyed, so no completion of this epoch can come). If the renewal fails
    /// the endpoint is closed (`None`): open a new one.
    ///
    /// After a failed poll nothing of this epoch is polled again: there is no drain, and
    /// the old QP is destroyed at once ([`Endpoint::renew_destroying_old`]) before any
    /// work request is reaped. So it is when the QP could not be moved to the error
    /// state. A QP in the error state is kept aside for its grace, even when some of its
    /// flushes had not arrived by `deadline` (rxe is still flushing it then).
    ///
    /// Not for a lost device: use [`Interface::shutdown`] then, which closes everything
    /// at once (a removal waits for every context on the device to close).
    pub fn recycle(
        self,
        deadline: Duration,
        tap: &dyn FrameIo,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        self.teardown(deadline, Some(tap), true)
    }

    pub(super) fn teardown(
        mut self,
        deadline: Duration,
        tap: Option<&dyn FrameIo>,
        keep: bool,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        let mut t = Teardown {
            reaped: 0,
            sends_reaped: 0,
            flushed: 0,
            drain: Duration::ZERO,
            destroy: Duration::ZERO,
            errors: 0,
            ledger: Ok(()),
            kept: false,
            renew: Duration::ZERO,
        };
        let flushed_before =
            stats::get(&self.stats.recv_flushed) + stats::get(&self.stats.send_flushed);
        self.draining = true;
        let start = Instant::now();
        if self.untrusted {
            // A failed poll: what the CQs hold cannot be trusted, so they are not polled
            // again; the QP is destroyed before anything is reaped.
            tracing::debug!("a poll failed: no drain, the QP is destroyed first");
        } else if let Err(e) = self.ep.set_qp_error() {
            t.errors += 1;
            self.untrusted = true;
            tracing::warn!(error = %e, "moving the QP to the error state failed: it is destroyed before anything is reaped");
        } else {
            // Drain flush completions until everything posted is accounted for.
            // Receives that completed before the flush are delivered.
            while self.outstanding() > 0 && start.elapsed() < deadline {
                let rx = self.poll_recv_batch(self.wc.len(), tap, Instant::now());
                let tx = self.poll_tx(Instant::now());
                match (rx, tx) {
                    (Ok(0), Ok(0)) => std::thread::sleep(DRAIN_NAP),
                    (Ok(_), Ok(_)) => {}
                    _ => break,
                }
            }
            if let Some(tap) = tap {
                for _ in 0..tap.flush() {
                    self.stats.count_drop(DropReason::RxTapWrite);
                }
            }
            // Flushes still missing at the deadline leave the QP (in the error state) to
            // its grace, not to an immediate destroy: rxe is then still flushing it, and
            // destroying a QP rxe still holds makes rxe warn, free it under its tasks
            // and break the device's sends (seen in the lab under iperf3 load).
            if self.outstanding() > 0 {
                tracing::debug!(
                    outstanding = self.outstanding(),
                    "flushes missing after the drain; the QP in the error state is retired"
                );
            }
        }
        t.drain = start.elapsed();
        let destroy_start = Instant::now();
        // Kept, the endpoint moves the group over to its new QP itself and its address
        // handles stay valid: only the retiring ones go.
        if keep {
            return self.teardown_keep(t, destroy_start, flushed_before);
        }
        if self.group_attached {
            if let Err(e) = self.ep.detach_mcast(&self.group) {
                t.errors += 1;
                tracing::warn!(error = %e, "detaching the broadcast group failed");
            }
            self.group_attached = false;
        }
        // Every send is accounted for below (completed, flushed or reaped), so every AH
        // can go.
        let mut ahs = self.neigh.take_ahs();
        ahs.append(&mut self.destroy);
        ahs.push(self.group_ah);
        for ah in ahs {
            match self.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&self.stats.ah_destroyed, 1),
                Err(e) => {
                    t.errors += 1;
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
        // The endpoint goes first (QP, CQs, channel, MR, PD, context): after that no
        // completion can come for anything still posted, so it is reaped.
        drop(self.ep);
        t.destroy = destroy_start.elapsed();
        Self::reap(&mut self.ledger, &self.stats, &mut t, flushed_before);
        (t, self.neigh, None)
    }

    /// The rest of a teardown that keeps the endpoint: retiring AHs destroyed, the QP and
    /// CQs renewed (after which no completion can come for anything still posted, so it
    /// is reaped), the live AHs and the group kept. If the renewal fails, everything is
    /// destroyed as in a full teardown.
    pub(super) fn teardown_keep(
        mut self,
        mut t: Teardown,
        destroy_start: Instant,
        flushed_before: u64,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        let mut ahs = self.neigh.take_retiring_ahs();
        ahs.append(&mut self.destroy);
        for ah in ahs {
            match self.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&self.stats.ah_destroyed, 1),
                Err(e) => {
                    t.errors += 1;
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
        let renew_start = Instant::now();
        let renewed = if self.untrusted {
            self.ep.renew_destroying_old()
        } else {
            self.ep.renew()
        };
        t.renew = renew_start.elapsed();
        let kept = match renewed {
            Ok(()) => Some(KeptEndpoint {
                ep: self.ep,
                group_ah: self.group_ah,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "renewing the endpoint failed: closing it (the next epoch opens the device again)");
                // Dropping it detaches the group and destroys every AH with it; the
                // neighbours forget theirs.
                forget_ahs(Some(&mut self.neigh), &self.stats);
                drop(self.ep);
                None
            }
        };
        t.kept = kept.is_some();
        t.destroy = destroy_start.elapsed();
        Self::reap(&mut self.ledger, &self.stats, &mut t, flushed_before);
        (t, self.neigh, kept)
    }

    /// Reap what never completed and check the ledger (the endpoint is gone or renewed).
    /// Takes the parts it needs: the endpoint has been moved out by then.
    pub(super) fn reap(ledger: &mut Ledger, stats: &Stats, t: &mut Teardown, flushed_before: u64) {
        // Sends reaped never completed: whether they left is unknown, so each is counted
        // as dropped with reason `reaped`.
        for _ in ledger.reap_all() {
            stats.count_drop(DropReason::TxReaped);
            t.sends_reaped += 1;
        }
        t.reaped = ledger.totals(Ring::Recv).reaped + ledger.totals(Ring::Send).reaped;
        t.flushed =
            stats::get(&stats.recv_flushed) + stats::get(&stats.send_flushed) - flushed_before;
        stats::add(&stats.recv_reaped, ledger.totals(Ring::Recv).reaped);
        stats::add(&stats.send_reaped, ledger.totals(Ring::Send).reaped);
        t.ledger = ledger.check();
        if t.ledger.is_ok()
            && ledger.totals(Ring::Recv).outstanding + ledger.totals(Ring::Send).outstanding != 0
        {
            t.ledger = Err("work requests still outstanding after the reap".into());
        }
        stats::add(&stats.teardown_errors, t.errors);
        stats::set(&stats.recv_outstanding, 0);
        stats::set(&stats.send_outstanding, 0);
    }
}
