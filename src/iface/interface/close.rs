//! Closing an epoch: the QP moved to error, flushes drained, every work request still
//! outstanding reaped, and the endpoint destroyed or kept for the next epoch.
//!
//! The drain is driven from outside, one poll at a time ([`Closing::drain_step`]): the
//! caller owns the clock, bounds the drain by its deadline and naps between polls.

use super::*;

/// What a teardown found.
#[derive(Debug, Clone)]
pub struct Closed {
    /// Work requests reaped (their completion never came).
    pub reaped: u64,
    /// Of those, sends (each counted as a drop with reason `reaped`).
    pub sends_reaped: u64,
    /// Flush completions drained before the deadline.
    pub flushed: u64,
    /// Time spent moving the QP to error and draining flushes (filled in by the caller
    /// that drove the drain: [`Closing::finish`] leaves it zero).
    pub drain: Duration,
    /// Time spent detaching and destroying the verbs objects.
    pub destroy: Duration,
    /// Destroy calls that failed.
    pub errors: u64,
    /// The ledger's verdict after the reap.
    pub ledger: Result<(), String>,
    /// Whether the endpoint was kept for the next epoch ([`Closing::finish`] with `keep`,
    /// [`Endpoint::restart`] working): only its QP and CQs were replaced. Of `destroy`,
    /// `restart` was spent replacing them.
    pub kept: bool,
    /// Time spent in [`Endpoint::restart`] (zero when not kept).
    pub restart: Duration,
    /// The reap waits for the failed QP's destroy, off the restart
    /// ([`KeptEndpoint::take_pending`]): `reaped`, `sends_reaped` and `ledger` say
    /// nothing of that QP's work requests, [`PendingBank::reap`] does.
    pub deferred: bool,
}

/// A teardown that reaped, drained and destroyed nothing, took no time and left the
/// ledger balanced; the endpoint not kept.
impl Default for Closed {
    fn default() -> Closed {
        Closed {
            reaped: 0,
            sends_reaped: 0,
            flushed: 0,
            drain: Duration::ZERO,
            destroy: Duration::ZERO,
            errors: 0,
            ledger: Ok(()),
            kept: false,
            restart: Duration::ZERO,
            deferred: false,
        }
    }
}

/// An endpoint kept across a restart by [`Closing::finish`] (QP and CQs renewed),
/// with the broadcast group's address handle, for [`Interface::open_on`].
pub struct KeptEndpoint {
    pub(super) ep: Box<dyn Endpoint>,
    pub(super) group_ah: AhHandle,
    /// The bank of slots the next epoch posts from.
    pub(super) bank: u32,
    /// The failed QP's bank, reaped once that QP is gone.
    pub(super) pending: Option<PendingBank>,
}

impl KeptEndpoint {
    /// Close it instead of reopening on it. Its address handles go with it, so the
    /// neighbour table (which still names them) forgets them; they are counted as
    /// destroyed. A bank still pending is reaped once the endpoint is gone.
    pub fn close(mut self, neigh: Option<&mut Neighbours>, stats: &Stats) {
        forget_ahs(neigh, stats);
        let pending = self.pending.take();
        drop(self.ep);
        if let Some(p) = pending {
            p.reap_waiting();
        }
    }

    /// The failed QP's bank of slots, when this restart deferred its destroy
    /// ([`Interface::allow_deferred_reap`]): the caller reaps it with
    /// [`PendingBank::reap`] once the new epoch runs. Left here, it is reaped (waited
    /// for) when the next epoch opens on this endpoint, or when it is closed.
    pub fn take_pending(&mut self) -> Option<PendingBank> {
        self.pending.take()
    }
}

/// The work requests of a QP that a restart after a failed poll replaced without
/// destroying it first ([`Endpoint::restart_deferring_old`]): they wait here, on their
/// bank of slots, while the next epoch runs on the other bank; once the QP is gone
/// (destroyed by whichever thread reaps it first), each is reaped and the ledger
/// checked. Nothing of this bank is posted again before that.
pub struct PendingBank {
    ledger: Box<Ledger>,
    stats: Arc<Stats>,
    gone: crate::verbs::retire::Gone,
    reaper: Option<Arc<dyn crate::verbs::retire::Reaper>>,
}

/// What the reap of a [`PendingBank`] found.
#[derive(Debug, Clone)]
pub struct BankReaped {
    /// Work requests reaped.
    pub reaped: u64,
    /// Of those, sends (each counted as a drop with reason `reaped`).
    pub sends_reaped: u64,
    /// The ledger's verdict after the reap.
    pub ledger: Result<(), String>,
}

/// How long [`KeptEndpoint`]'s own reap of a bank left to it waits for the QP (a
/// destroy has been seen to block for 1.2 s in the lab).
const PENDING_WAIT: Duration = Duration::from_secs(10);

impl PendingBank {
    /// Destroy the failed QP on this thread if it is still there (the reaper thread may
    /// be at it already), wait at most `bound` for it to be gone, then reap every work
    /// request still posted on it and check the ledger. `Err(self)`: not gone within
    /// `bound`; nothing reaped, try again later.
    pub fn reap(self, bound: Duration) -> Result<BankReaped, PendingBank> {
        if let Some(r) = &self.reaper {
            r.reap_awaited();
        }
        if !self.gone.wait(bound) {
            return Err(self);
        }
        let PendingBank {
            mut ledger, stats, ..
        } = self;
        Ok(Interface::reap_ledger(&mut ledger, &stats))
    }

    /// Reap it here, for a caller that left it to its [`KeptEndpoint`]: the QP destroyed
    /// on this thread if still there (or with its endpoint, when that was closed),
    /// waited for at most [`PENDING_WAIT`]; a ledger that does not balance is logged (no
    /// restart record is left to carry it).
    pub(super) fn reap_waiting(self) {
        match self.reap(PENDING_WAIT) {
            Ok(r) => {
                if let Err(e) = r.ledger {
                    tracing::error!(error = %e, "ledger of the failed QP's bank does not balance after the reap");
                }
            }
            Err(_) => {
                tracing::error!(
                    "the failed QP was not destroyed with its endpoint: its work requests cannot be reaped"
                );
            }
        }
    }
}

/// The endpoint that owned the neighbours' address handles (and the group's) is gone:
/// forget them and count them destroyed.
pub(super) fn forget_ahs(neigh: Option<&mut Neighbours>, stats: &Stats) {
    let n = neigh.map_or(0, |n| n.take_ahs().len() as u64);
    stats::add(&stats.ah_destroyed, n + 1);
}

/// What one drain poll found ([`Closing::drain_step`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DrainStep {
    /// Completions arrived and flushes are still awaited: poll again at once.
    Progress,
    /// Nothing arrived yet (rxe makes the flushes in the kernel after the QP went to
    /// error): the caller may nap before the next poll.
    Idle,
    /// Nothing more to drain: everything is accounted for, a poll failed, or this
    /// epoch's CQs may not be polled at all.
    Done,
}

/// An interface being closed: its QP moved to the error state (unless a poll failed, or
/// the move itself failed), its flushes drained one [`Closing::drain_step`] at a time by
/// a caller that owns the clock and bounds the drain, then [`Closing::finish`]ed.
pub struct Closing {
    iface: Interface,
    flushed_before: u64,
    /// Flushes may be drained: the QP went to the error state and no poll failed.
    drainable: bool,
    /// A drain poll failed: nothing more is polled.
    stopped: bool,
    errors: u64,
}

impl Interface {
    /// Begin a teardown: the QP is moved to the error state, so that everything posted
    /// comes back as a flush completion. After a failed poll nothing of this epoch is
    /// polled again: the QP is not moved and nothing is drained; so it is when the move
    /// fails (the QP is then destroyed before anything it may own is reaped).
    pub fn begin_close(mut self) -> Closing {
        let flushed_before =
            stats::get(&self.stats.recv_flushed) + stats::get(&self.stats.send_flushed);
        self.draining = true;
        let mut errors = 0;
        let mut drainable = false;
        if self.untrusted {
            // A failed poll: what the CQs hold cannot be trusted, so they are not polled
            // again; the QP is destroyed before anything is reaped.
            tracing::debug!("a poll failed: no drain, the QP is destroyed first");
        } else if let Err(e) = self.ep.set_qp_error() {
            errors += 1;
            self.untrusted = true;
            tracing::warn!(error = %e, "moving the QP to the error state failed: it is destroyed before anything is reaped");
        } else {
            drainable = true;
        }
        Closing {
            iface: self,
            flushed_before,
            drainable,
            stopped: false,
            errors,
        }
    }
}

impl Closing {
    /// Whether flush completions are still awaited.
    pub fn pending(&self) -> bool {
        self.drainable && !self.stopped && self.iface.outstanding() > 0
    }

    /// One drain poll of both CQs at `now`. Receives that completed before the flush are
    /// delivered to `tap` (or, without one, counted as dropped, `rx_teardown`).
    pub fn drain_step(&mut self, tap: Option<&dyn FrameIo>, now: Instant) -> DrainStep {
        if !self.pending() {
            return DrainStep::Done;
        }
        let want = self.iface.wc.len();
        let rx = self.iface.poll_recv_batch(want, tap, now);
        let tx = self.iface.poll_tx(now);
        match (rx, tx) {
            (Ok(0), Ok(0)) => DrainStep::Idle,
            (Ok(_), Ok(_)) if self.pending() => DrainStep::Progress,
            (Ok(_), Ok(_)) => DrainStep::Done,
            _ => {
                self.stopped = true;
                DrainStep::Done
            }
        }
    }

    /// End the teardown, in order: detach the group, destroy the AHs, destroy the
    /// endpoint, reap what never completed, check the ledger. Never panics; failures are
    /// counted. The neighbour table is handed back for the next epoch.
    ///
    /// With `keep`, instead of destroying the endpoint, its QP and CQs are replaced
    /// ([`Endpoint::restart`]) and it is handed back for [`Interface::open_on`]: device
    /// context, PD, registered memory, completion channel, the broadcast group's
    /// membership and the neighbours' address handles survive. What was posted on the
    /// old QP is reaped exactly as after a full teardown (the old QP and CQs are
    /// destroyed, so no completion of this epoch can come). If the renewal fails the
    /// endpoint is closed (`None`): open a new one. After a failed poll (or a QP that
    /// could not be moved to the error state) the old QP is destroyed at once
    /// ([`Endpoint::restart_destroying_old`]) before any work request is reaped; a QP in
    /// the error state is kept aside for its grace, even when some of its flushes had
    /// not arrived (rxe is still flushing it then). Not for a lost device: a removal
    /// waits for every context on the device to close.
    ///
    /// `clock`, when given, times the destroy and the renewal (`Closed::destroy`,
    /// `Closed::restart`); the drain's time is the caller's to fill in.
    pub fn finish(
        self,
        tap: Option<&dyn FrameIo>,
        keep: bool,
        clock: Option<Clock<'_>>,
    ) -> (Closed, Neighbours, Option<KeptEndpoint>) {
        let mut t = Closed {
            errors: self.errors,
            ..Closed::default()
        };
        if self.drainable {
            if let Some(tap) = tap {
                for _ in 0..tap.flush() {
                    self.iface.stats.count_drop(DropReason::RxTapWrite);
                }
            }
            // Flushes still missing at the deadline leave the QP (in the error state) to
            // its grace, not to an immediate destroy: rxe is then still flushing it, and
            // destroying a QP rxe still holds makes rxe warn, free it under its tasks
            // and break the device's sends (seen in the lab under iperf3 load).
            if self.iface.outstanding() > 0 {
                tracing::debug!(
                    outstanding = self.iface.outstanding(),
                    "flushes missing after the drain; the QP in the error state is retired"
                );
            }
        }
        let watch = Stopwatch(clock);
        let destroy_start = watch.mark();
        let mut iface = self.iface;
        // Kept, the endpoint moves the group over to its new QP itself and its address
        // handles stay valid: only the retiring ones go.
        if keep {
            return iface.close_keep(t, watch, destroy_start, self.flushed_before);
        }
        if iface.group_attached {
            if let Err(e) = iface.ep.detach_mcast(&iface.group) {
                t.errors += 1;
                tracing::warn!(error = %e, "detaching the broadcast group failed");
            }
            iface.group_attached = false;
        }
        // Every send is accounted for below (completed, flushed or reaped), so every AH
        // can go.
        let mut ahs = iface.neigh.take_ahs();
        ahs.append(&mut iface.destroy);
        ahs.push(iface.group_ah);
        for ah in ahs {
            match iface.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&iface.stats.ah_destroyed, 1),
                Err(e) => {
                    t.errors += 1;
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
        // The endpoint goes first (QP, CQs, channel, MR, PD, context): after that no
        // completion can come for anything still posted, so it is reaped.
        drop(iface.ep);
        t.destroy = watch.since(destroy_start);
        Interface::reap(&mut iface.ledger, &iface.stats, &mut t, self.flushed_before);
        (t, iface.neigh, None)
    }
}

impl Interface {
    /// The rest of a teardown that keeps the endpoint: retiring AHs destroyed, the QP and
    /// CQs renewed (after which no completion can come for anything still posted, so it
    /// is reaped), the live AHs and the group kept. If the renewal fails, everything is
    /// destroyed as in a full teardown.
    pub(super) fn close_keep(
        mut self,
        mut t: Closed,
        watch: Stopwatch<'_>,
        destroy_start: Option<Instant>,
        flushed_before: u64,
    ) -> (Closed, Neighbours, Option<KeptEndpoint>) {
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
        let renew_start = watch.mark();
        // After a failed poll the old QP must be gone before its slots are reaped: with
        // the other bank free, the next epoch posts from that one and the old QP's
        // destroy and reap follow it (off the restart), else the QP goes now.
        let defer = self.untrusted && self.other_bank_free && self.ep.attrs().banks >= 2;
        let mut gone = None;
        let renewed = if defer {
            self.ep.restart_deferring_old().map(|g| gone = Some(g))
        } else if self.untrusted {
            self.ep.restart_destroying_old()
        } else {
            self.ep.restart()
        };
        t.restart = watch.since(renew_start);
        let mut kept = match renewed {
            Ok(()) => Some(KeptEndpoint {
                bank: if gone.is_some() {
                    1 - self.bank.min(1)
                } else {
                    self.bank
                },
                pending: None,
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
        t.destroy = watch.since(destroy_start);
        if let (Some(k), Some(gone)) = (kept.as_mut(), gone) {
            // Counted as any teardown; the work requests wait for the QP.
            t.deferred = true;
            Self::count_teardown(&self.stats, &mut t, flushed_before);
            k.pending = Some(PendingBank {
                reaper: k.ep.reaper(),
                ledger: Box::new(self.ledger),
                stats: self.stats,
                gone,
            });
            return (t, self.neigh, kept);
        }
        Self::reap(&mut self.ledger, &self.stats, &mut t, flushed_before);
        (t, self.neigh, kept)
    }

    /// Reap what never completed and check the ledger (the endpoint is gone or renewed).
    /// Takes the parts it needs: the endpoint has been moved out by then.
    pub(super) fn reap(ledger: &mut Ledger, stats: &Stats, t: &mut Closed, flushed_before: u64) {
        let r = Self::reap_ledger(ledger, stats);
        t.sends_reaped = r.sends_reaped;
        t.reaped = r.reaped;
        t.ledger = r.ledger;
        // Reaped: nothing is waiting for a completion any more.
        stats::set(&stats.recv_never_complete, 0);
        stats::set(&stats.send_never_complete, 0);
        Self::count_teardown(stats, t, flushed_before);
    }

    /// What every teardown counts, its work requests reaped now or left pending: the
    /// flushes it drained, its failed destroys, and nothing outstanding on this epoch.
    fn count_teardown(stats: &Stats, t: &mut Closed, flushed_before: u64) {
        t.flushed =
            stats::get(&stats.recv_flushed) + stats::get(&stats.send_flushed) - flushed_before;
        stats::add(&stats.teardown_errors, t.errors);
        stats::set(&stats.recv_outstanding, 0);
        stats::set(&stats.send_outstanding, 0);
    }

    /// Reap every work request of `ledger` still posted (its QP is gone), count them,
    /// and check the ledger.
    pub(super) fn reap_ledger(ledger: &mut Ledger, stats: &Stats) -> BankReaped {
        // Sends reaped never completed: whether they left is unknown, so each is counted
        // as dropped with reason `reaped`.
        let mut sends_reaped = 0;
        for _ in ledger.reap_all() {
            stats.count_drop(DropReason::TxReaped);
            sends_reaped += 1;
        }
        let (recv, send) = (ledger.totals(Ring::Recv), ledger.totals(Ring::Send));
        stats::add(&stats.recv_reaped, recv.reaped);
        stats::add(&stats.send_reaped, send.reaped);
        let mut check = ledger.check();
        if check.is_ok() && recv.outstanding + send.outstanding != 0 {
            check = Err("work requests still outstanding after the reap".into());
        }
        BankReaped {
            reaped: recv.reaped + send.reaped,
            sends_reaped,
            ledger: check,
        }
    }
}
