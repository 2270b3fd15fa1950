//! What the interface does when a CQ poll fails: the poll-failure policy.
//!
//! `restart` is the design: a failed poll is a "should never happen" error, the epoch
//! stops being trusted, and the supervisor tears down, reaps and rebuilds. The other
//! three replay the alternatives argued on linux-rdma in July 2016 ("IB/ipoib: Skip
//! napi_schedule if ib_poll_cq fails"), each doing what it says and nothing more, so that
//! what each one loses can be measured against the same ledger:
//! - `skip`, the patch: the failed poll is dropped, and that CQ is neither polled nor
//!   re-armed again until a completion event for it arrives (an unarmed CQ raises none);
//! - `retry`: the failure is taken as transient, the poll as empty, and the poll runs
//!   again at once;
//! - `recreate-cq`: the failed CQ alone is replaced ([`Endpoint::recreate_cq`]), the QP
//!   and everything posted on it kept.
//!
//! None of the three is for production; the daemon accepts them only with
//! `--allow-faults`.

use std::fmt;

use super::*;

/// What the poller does when `poll_cq` fails.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum PollFailurePolicy {
    /// The whole interface to the supervisor: torn down, reaped, rebuilt.
    #[default]
    Restart,
    /// The failed poll dropped; the CQ not rescheduled and not re-armed.
    Skip,
    /// The failed poll taken as empty; polled again at once.
    Retry,
    /// The failed CQ destroyed and re-created; the QP kept as it is.
    RecreateCq,
}

impl PollFailurePolicy {
    /// Every policy, the design first.
    pub const ALL: [PollFailurePolicy; 4] = [
        PollFailurePolicy::Restart,
        PollFailurePolicy::Skip,
        PollFailurePolicy::Retry,
        PollFailurePolicy::RecreateCq,
    ];

    /// The names, for messages.
    pub const NAMES: &'static str = "restart, skip, retry, recreate-cq";

    /// Stable name (config, flags, status, reports).
    pub fn name(self) -> &'static str {
        match self {
            PollFailurePolicy::Restart => "restart",
            PollFailurePolicy::Skip => "skip",
            PollFailurePolicy::Retry => "retry",
            PollFailurePolicy::RecreateCq => "recreate-cq",
        }
    }

    /// The policy of that name.
    pub fn from_name(s: &str) -> Option<PollFailurePolicy> {
        Self::ALL.into_iter().find(|p| p.name() == s)
    }

    /// Whether it is one of the demonstrations (allowed only with `--allow-faults`).
    pub fn is_demonstration(self) -> bool {
        self != PollFailurePolicy::Restart
    }
}

impl fmt::Display for PollFailurePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl serde::Serialize for PollFailurePolicy {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

pub(super) fn cq_index(cq: CqKind) -> usize {
    match cq {
        CqKind::Recv => 0,
        CqKind::Send => 1,
    }
}

impl Interface {
    /// The policy in force.
    pub fn poll_failure_policy(&self) -> PollFailurePolicy {
        self.poll_failure
    }

    /// A `poll_cq` on `cq` failed with `e`: what the policy makes of it. `Err` hands the
    /// interface over; `Ok(0)` carries on as if the poll had found nothing.
    pub(super) fn on_poll_failure(&mut self, cq: CqKind, e: VerbsError) -> Result<usize, Failure> {
        stats::add(&self.stats.poll_failures, 1);
        // A failure that repeats is logged at the 1st, 2nd, 4th, 8th, ... time (the
        // counters have every one).
        let n = stats::get(&self.stats.poll_failures);
        let say = n.is_power_of_two();
        let i = cq_index(cq);
        match self.poll_failure {
            PollFailurePolicy::Restart => {
                self.untrusted = true;
                Err(Failure::PollFailed(e))
            }
            PollFailurePolicy::Skip => {
                stats::add(&self.stats.poll_failures_skipped, 1);
                self.parked[i] = true;
                if self.armed[i] {
                    // The poll that follows an arm (the missed-event recheck): the CQ's
                    // next completion raises an event and brings it back.
                    stats::add(&self.stats.poll_failures_skipped_armed, 1);
                }
                if say {
                    tracing::warn!(cq = ?cq, error = %e, policy = "skip", armed = self.armed[i], failures = n, "poll failed: dropped; the CQ is not polled or re-armed until a completion event for it (none comes unless it was armed)");
                }
                Ok(0)
            }
            PollFailurePolicy::Retry => {
                stats::add(&self.stats.poll_retries, 1);
                if say {
                    tracing::warn!(cq = ?cq, error = %e, policy = "retry", failures = n, "poll failed: taken as empty, polled again at once");
                }
                self.retry_due = true;
                Ok(0)
            }
            PollFailurePolicy::RecreateCq => match self.ep.recreate_cq(cq) {
                Ok(r) => {
                    stats::add(&self.stats.cq_recreated, 1);
                    if !r.old_destroyed {
                        stats::add(&self.stats.cq_kept_in_use, 1);
                    }
                    self.stranded[i] |= r.qp_bound_elsewhere;
                    if say {
                        tracing::warn!(cq = ?cq, error = %e, policy = "recreate-cq", old_destroyed = r.old_destroyed, refusal = r.refusal.as_deref().unwrap_or(""), failures = n, "poll failed: CQ re-created, QP kept");
                    }
                    Ok(0)
                }
                Err(e2) => {
                    // The policy cannot do its one step: nothing left but the restart.
                    tracing::error!(cq = ?cq, error = %e2, "recreate-cq: re-creating the CQ failed; handing the interface over");
                    self.untrusted = true;
                    Err(Failure::PollFailed(e))
                }
            },
        }
    }

    /// Completion events were read: `recv` for the receive CQ, `send` for the send CQ. A
    /// CQ the `skip` policy left is polled again once an event for it comes.
    pub fn on_cq_events(&mut self, recv: u32, send: u32) {
        for (i, n) in [(0, recv), (1, send)] {
            if n > 0 {
                // An event disarms its CQ.
                self.armed[i] = false;
            }
            if n > 0 && self.parked[i] {
                self.parked[i] = false;
                tracing::info!(
                    cq = i,
                    "completion event for a CQ left after a failed poll: polled again"
                );
            }
        }
    }

    /// Arm every CQ that is to be armed (`skip` leaves the CQ whose poll failed unarmed).
    pub fn arm_cqs(&mut self) -> Result<(), Failure> {
        for cq in [CqKind::Recv, CqKind::Send] {
            if !self.parked[cq_index(cq)] {
                self.ep.req_notify(cq).map_err(Failure::Verbs)?;
                self.armed[cq_index(cq)] = true;
            }
        }
        Ok(())
    }

    /// Whether a failed poll asked to be polled again at once (`retry`); clears it.
    pub fn take_poll_retry(&mut self) -> bool {
        std::mem::take(&mut self.retry_due)
    }

    /// Work requests whose completion will never be seen, per ring (receive, send):
    /// those still outstanding behind a later one that completed (a queue completes in
    /// order, so the earlier one's completion was lost), and every outstanding one of a
    /// ring whose completions go where nothing polls (a CQ `skip` left unarmed, or the
    /// QP's own CQ after `recreate-cq`). After a failed poll under `restart` both are 0
    /// (the restart reaped everything); a lost completion without a failed poll (the
    /// `lost-completion` fault) shows here under every policy until a restart. A CQ that
    /// `skip` left while it was armed is taken to come back at its next completion,
    /// which holds while completions can still arrive.
    pub fn never_completing(&self) -> [u64; 2] {
        let mut out = [0; 2];
        for (i, ring) in [(0, Ring::Recv), (1, Ring::Send)] {
            // A CQ left by `skip` that was armed before its poll failed raises an event
            // at its next completion and is polled again; one that was not, never.
            out[i] = if self.stranded[i] || (self.parked[i] && !self.armed[i]) {
                self.ledger.totals(ring).outstanding
            } else {
                self.ledger.behind(ring)
            };
        }
        out
    }
}
