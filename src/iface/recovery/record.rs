//! What one restart is recorded as (`uipoib status` shows the most recent).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// One restart, as `uipoib status` shows it.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct RestartRecord {
    /// The epoch it started.
    pub epoch: u16,
    /// Short cause (`poll-failed`, `device-removed`, `tx-stall`, `operator`, ...).
    pub cause: String,
    /// The cause in full.
    pub detail: String,
    /// When the failure was detected (ms since the Unix epoch).
    pub detected_unix_ms: u64,
    /// From detection (the poller's loop returning the failure; for a panic or a failed
    /// start, when the supervisor learned of it) to the new poller handed the interface
    /// with the carrier on (ms).
    pub recovery_ms: f64,
    /// Work requests reaped at the teardown.
    pub wr_reaped: u64,
    /// Of those, sends (counted as dropped with reason `reaped`).
    pub sends_reaped: u64,
    /// Flush completions drained.
    pub flushed: u64,
    /// Whether the ledger balanced with nothing outstanding after the reap.
    pub ledger_balanced: bool,
    /// Open attempts that failed before the rebuild succeeded.
    pub failed_attempts: u32,
    /// Whether the device context, PD, registered memory and completion channel were
    /// kept (only the QP and CQs were replaced); `false` after a device loss or when the
    /// renewal failed, when everything was reopened.
    #[serde(default)]
    pub kept_device: bool,
    /// Where the recovery time went (ms), in order; see [`Phases`].
    #[serde(default)]
    pub phases: Phases,
    /// From detection to the announcement of the new QPN posted (ms): peers send to the
    /// QP that is gone until it reaches them, so what a restart loses under load grows
    /// with it.
    #[serde(default)]
    pub announced_ms: f64,
    /// Whether the failed epoch's interface was lost (a poller panic): nothing was
    /// drained or reaped, and `ledger_balanced` is `false` because its work requests
    /// cannot be accounted for, not because a reap found them unbalanced.
    #[serde(default)]
    pub ledger_lost: bool,
    /// Whether the failed QP's destroy and the reap of its work requests came after the
    /// new epoch was running (a spare bank of slots: the new ring was posted from the
    /// other bank); `wr_reaped`, `sends_reaped` and `ledger_balanced` include that reap,
    /// `phases.bank_reap_ms` is its time.
    #[serde(default)]
    pub deferred_reap: bool,
    /// Whether the new epoch's poller runs on a thread started ahead, while the last
    /// epoch ran (`phases.spawn_ms` then holds no thread creation).
    #[serde(default)]
    pub poller_thread_ahead: bool,
    /// The restart supervisor's thread from taking the restart up (the end of
    /// `phases.handoff_ms`) to the hand-over, as the scheduler counted it: whether a slow
    /// restart was its own work, a wait for a CPU, or a sleep. `None` where the kernel
    /// keeps no such account (the thread's CPU clock and `/proc/thread-self/schedstat`).
    #[serde(default)]
    pub supervisor: Option<ThreadTime>,
}

/// A thread's share of a span of wall time, as the scheduler counted it (ms).
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct ThreadTime {
    /// The span of wall time.
    pub span_ms: f64,
    /// On a CPU (its system calls included, and on kernels that do not account interrupt
    /// time apart, the softirqs that ran inside them).
    pub on_cpu_ms: f64,
    /// Runnable, waiting in a run queue for a CPU.
    pub runqueue_ms: f64,
    /// Neither: asleep (blocked on I/O, a lock, another thread or a timer). The span less
    /// the other two, never below zero.
    pub slept_ms: f64,
}

impl ThreadTime {
    /// The share of `span` between two readings of the thread's counts (ns).
    pub fn between(span: Duration, on_cpu_ns: u64, runqueue_ns: u64) -> ThreadTime {
        let span_ms = ms(span);
        let on_cpu_ms = on_cpu_ns as f64 / 1e6;
        let runqueue_ms = runqueue_ns as f64 / 1e6;
        ThreadTime {
            span_ms,
            on_cpu_ms,
            runqueue_ms,
            slept_ms: (span_ms - on_cpu_ms - runqueue_ms).max(0.0),
        }
    }
}

/// Where one recovery's time went, in milliseconds, in the order the phases run. Their
/// sum is `recovery_ms` up to the bookkeeping between them.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Phases {
    /// From detection (in the poller) to the supervisor starting the restart: the
    /// poller's exit and the hand-over.
    pub handoff_ms: f64,
    /// Moving the QP to the error state and draining flush completions.
    pub drain_ms: f64,
    /// Detaching the group, destroying the AHs and the endpoint, or, when kept, replacing
    /// its QP and CQs (of which `renew_ms`).
    pub destroy_ms: f64,
    /// [`crate::verbs::Endpoint::restart`]: new CQs and QP brought up, the old destroyed.
    pub renew_ms: f64,
    /// Reaping and checking the ledger, and the backoff wait before the rebuild.
    pub reap_ms: f64,
    /// Opening the endpoint (context, PD, memory registration, channel, CQs, QP); zero
    /// when kept.
    pub open_ms: f64,
    /// Creating the broadcast group's address handle.
    pub ah_ms: f64,
    /// Attaching the broadcast group.
    pub attach_ms: f64,
    /// Posting the receive ring (on a kept endpoint its first
    /// [`crate::iface::interface::RESTART_FIRST_FILL`] receives; the poller posts the rest).
    pub fill_ms: f64,
    /// Announcing the new QPN, starting the poller and turning the carrier on (of which
    /// `announce_ms`, `spawn_ms` and `carrier_ms`).
    pub start_ms: f64,
    /// Posting the announcement (the gratuitous ARP and the unsolicited advertisements),
    /// before the poller starts.
    #[serde(default)]
    pub announce_ms: f64,
    /// Starting the poller: its poll set, registrations and thread (a thread started
    /// ahead, when there is one: `poller_thread_ahead`).
    #[serde(default)]
    pub spawn_ms: f64,
    /// The status and the TAP carrier on (`TUNSETCARRIER`), just before the poller
    /// thread is handed the interface: the restart ends there (on one CPU the woken
    /// thread may run at once, its first polls the datapath's work, not the restart's).
    #[serde(default)]
    pub carrier_ms: f64,
    /// After the new epoch runs (not part of `recovery_ms`): the failed QP destroyed and
    /// its bank of slots reaped, when the restart deferred them (`deferred_reap`).
    #[serde(default)]
    pub bank_reap_ms: f64,
}

/// Milliseconds, as the records and log lines give durations.
pub fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
