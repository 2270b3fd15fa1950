//! Fault records: one per fault the steps open, measured from the counter samples, the
//! daemon's restart history and the fault switch's injection log.

use serde_json::Value;

use super::gaps;
use super::report::{FaultReport, Iperf3Session, Outcome, Throughput};
use super::run::{Runner, WINDOW, unix_ms};
use super::traffic::{Interval, Sample, Sampler};
use crate::iface::stats::Snapshot;
use crate::runtime::supervisor::{RestartRecord, Status};

/// A fault being followed.
pub(super) struct Record {
    pub(super) rep: FaultReport,
    /// When its step started.
    pub(super) opened_ms: u64,
    /// Whether it is an armed fault (its injection time comes from the switch's log).
    pub(super) armed: bool,
    pub(super) start: Snapshot,
    pub(super) restarts0: u64,
    pub(super) injected0: u64,
    pub(super) seq0: u64,
    /// A live snapshot balanced since it opened (after its restarts).
    pub(super) live_balanced: bool,
    pub(super) closed_ms: Option<u64>,
    /// The generation of the counter samples that are this record's daemon's.
    pub(super) generation: u32,
    /// An `expect` asked for `iperf3_resumed`, checked once the load has stopped.
    pub(super) want_iperf3_resumed: Option<bool>,
}

/// The restart records added since `restarts0` restarts.
pub(super) fn records_since(status: &Status, restarts0: u64) -> Vec<RestartRecord> {
    let n = status.restarts.saturating_sub(restarts0) as usize;
    let h = &status.history;
    h[h.len().saturating_sub(n)..].to_vec()
}

/// The interface's rate from `from` to `to` (Mbit/s), over samples of one daemon (the
/// one read at `to`: a new daemon's counters start again from 0).
pub(super) fn rate(samples: &[Sample], from: u64, to: u64) -> Option<f64> {
    let b = samples.iter().rev().find(|s| s.unix_ms <= to)?;
    let a = samples
        .iter()
        .find(|s| s.unix_ms >= from && s.generation == b.generation)?;
    let dt = b.unix_ms.checked_sub(a.unix_ms)?;
    if dt < 200 {
        return None;
    }
    Some((b.bytes.saturating_sub(a.bytes)) as f64 * 8.0 / (dt as f64 / 1e3) / 1e6)
}

/// For `rate_restored`: a rate measured before a fault, if it can be a baseline. A window
/// without traffic cannot: against zero any rate would pass.
pub(super) fn baseline(before: Option<f64>) -> Option<f64> {
    before.filter(|b| *b > 0.0)
}

/// For `rate_restored`: the rate in the window before this fault (the check prefers the
/// run's first fault's, see `Runner::expect`), and over the last
/// [`super::RATE_RESTORED_WINDOW`] of samples, none of them from before the traffic
/// resumed (or, without a resumption, from before the injection).
pub(super) fn rates_for_restore(
    rep: &super::report::FaultReport,
    samples: &[Sample],
) -> (Option<f64>, Option<f64>) {
    let before = rep.throughput_mbps.before;
    let Some(last) = samples.last().map(|s| s.unix_ms) else {
        return (before, None);
    };
    let w = super::RATE_RESTORED_WINDOW.as_millis() as u64;
    let since = rep.resumed_unix_ms.or(rep.injected_unix_ms).unwrap_or(0);
    let now = rate(samples, last.saturating_sub(w).max(since), last);
    (before, now)
}

pub(super) fn mean_in(iv: &[Interval], from: u64, to: u64) -> Option<f64> {
    let v: Vec<f64> = iv
        .iter()
        .filter(|i| i.stamp_ms > from && i.stamp_ms <= to)
        .map(|i| i.mbps)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
}

impl Runner {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn open(
        &self,
        records: &mut Vec<Record>,
        sampler: &Sampler,
        iteration: u64,
        line: usize,
        fault: &str,
        label: &str,
        armed: bool,
    ) {
        if let Some(r) = records.last_mut() {
            self.close(r, sampler, None);
        }
        let start = self.read_stats();
        let status = self.read_status();
        let faults = self.client.faults().unwrap_or(Value::Null);
        let seq0 = faults["recent"]
            .as_array()
            .and_then(|r| r.iter().filter_map(|i| i["seq"].as_u64()).max())
            .unwrap_or(0);
        records.push(Record {
            rep: FaultReport {
                index: records.len() + 1,
                iteration,
                line,
                fault: fault.into(),
                label: label.into(),
                ..FaultReport::default()
            },
            opened_ms: unix_ms(),
            armed,
            start,
            restarts0: status.restarts,
            injected0: faults["injected"].as_u64().unwrap_or(0),
            seq0,
            live_balanced: false,
            closed_ms: None,
            generation: sampler.generation(),
            want_iperf3_resumed: None,
        });
    }

    /// Bring a record's measurements up to date.
    pub(super) fn refresh(&self, r: &mut Record, samples: &[Sample]) -> (Snapshot, Status) {
        let now = self.read_stats();
        let status = self.read_status();
        let rep = &mut r.rep;
        if let Ok(f) = self.client.faults() {
            rep.fired = f["injected"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(r.injected0);
            if r.armed {
                // The first hit of this arming: the switch keeps it per kind (the list of
                // recent hits moves on when a fault hits more than it holds); the oldest
                // recent hit after the arming stands in for a daemon that does not say.
                let first = f["first_hit_unix_ms"][rep.fault.as_str()]
                    .as_u64()
                    .filter(|t| *t + 1000 >= r.opened_ms);
                let recent = f["recent"].as_array().and_then(|a| {
                    a.iter()
                        .filter(|i| i["seq"].as_u64().is_some_and(|s| s > r.seq0))
                        .filter_map(|i| i["unix_ms"].as_u64())
                        .min()
                });
                rep.injected_unix_ms = match (rep.injected_unix_ms, first.or(recent)) {
                    (Some(a), Some(b)) => Some(a.min(b)),
                    (a, b) => a.or(b),
                };
            }
        }
        if !r.armed {
            rep.injected_unix_ms = Some(r.opened_ms);
        }
        let recs = records_since(&status, r.restarts0);
        rep.restarts = status.restarts.saturating_sub(r.restarts0);
        rep.causes = recs.iter().map(|h| h.cause.clone()).collect();
        rep.wr_reaped = recs.iter().map(|h| h.wr_reaped).sum();
        rep.sends_reaped = recs.iter().map(|h| h.sends_reaped).sum();
        rep.flushed = recs.iter().map(|h| h.flushed).sum();
        rep.failed_attempts = recs.iter().map(|h| u64::from(h.failed_attempts)).sum();
        // A killed daemon's recovery: from the signal to the new one's `interface up`
        // (its log line, or else its first `running` answer).
        let killed = rep.daemon.as_ref();
        let kill_recovery = killed.and_then(|d| d.log_up_ms.or(d.up_ms));
        rep.recovery_ms = recs
            .iter()
            .map(|h| h.recovery_ms)
            .chain(kill_recovery)
            .reduce(f64::max);
        rep.drops = now
            .drops
            .iter()
            .filter_map(|(k, v)| {
                let d = v.saturating_sub(r.start.drops.get(k).copied().unwrap_or(0));
                (d > 0).then(|| (k.clone(), d))
            })
            .collect();
        rep.stale_completions = now
            .completions_rejected
            .saturating_sub(r.start.completions_rejected);
        let restarts_ok = recs.iter().all(|h| h.ledger_balanced);
        if self.has_read_stats() {
            let res = now.residuals();
            rep.ledger_residuals = Some(res);
            if res.balanced() && now.restarts >= status.restarts {
                r.live_balanced = true;
            }
        }
        rep.ledger_balanced = Some(restarts_ok && r.live_balanced);

        let from = rep.injected_unix_ms.unwrap_or(r.opened_ms);
        // Only the samples of this record's daemon say what happened to it.
        let cur: Vec<Sample> = samples
            .iter()
            .filter(|s| s.generation == r.generation)
            .copied()
            .collect();
        let base = cur
            .iter()
            .rev()
            .find(|s| s.unix_ms <= from)
            .or(cur.first())
            .copied();
        rep.detected_unix_ms = if killed.is_some() {
            // A killed daemon notices nothing; its successor starts fresh.
            None
        } else {
            recs.first().map(|h| h.detected_unix_ms).or_else(|| {
                let b = base?;
                cur.iter()
                    .find(|s| s.unix_ms > from && s.evidence > b.evidence)
                    .map(|s| s.unix_ms)
            })
        };
        // Traffic resumes after the last restart's recovery (or after the injection),
        // and after a kill once the new daemon is up: it moved past what the new daemon
        // had counted then (nothing, if no sample came before).
        let up = killed.map(|d| d.up_unix_ms.unwrap_or(u64::MAX));
        let back = recs
            .last()
            .map_or(from, |h| h.detected_unix_ms + h.recovery_ms.ceil() as u64)
            .max(up.unwrap_or(0));
        let before_back = cur.iter().rev().find(|s| s.unix_ms <= back).copied();
        let base_back = match (before_back, up) {
            (Some(s), _) => Some(s),
            (None, Some(_)) => Some(Sample::ZERO),
            (None, None) => base,
        };
        rep.resumed_unix_ms = base_back.and_then(|b| {
            cur.iter()
                .find(|s| s.unix_ms > back.max(b.unix_ms) && s.packets > b.packets)
                .map(|s| s.unix_ms)
        });
        let since = |t: Option<u64>| t.map(|t| t as f64 - from as f64);
        rep.detect_ms = since(rep.detected_unix_ms).filter(|_| rep.injected_unix_ms.is_some());
        rep.resume_ms = since(rep.resumed_unix_ms).filter(|_| rep.injected_unix_ms.is_some());
        let end = r.closed_ms.unwrap_or_else(unix_ms);
        let w = WINDOW.as_millis() as u64;
        let resumed = rep.resumed_unix_ms;
        rep.throughput_mbps = Throughput {
            before: rate(samples, from.saturating_sub(w), from),
            during: rate(samples, from, resumed.unwrap_or(end)),
            after: resumed.and_then(|t| rate(samples, t, (t + w).min(end))),
        };
        (now, status)
    }

    pub(super) fn close(&self, r: &mut Record, sampler: &Sampler, iperf: Option<&[Interval]>) {
        if r.closed_ms.is_some() {
            return;
        }
        r.closed_ms = Some(unix_ms());
        self.refresh(r, &sampler.snapshot());
        if let Some(iv) = iperf {
            self.finish_iperf(r, iv);
        }
    }

    pub(super) fn finish_iperf(&self, r: &mut Record, iv: &[Interval]) {
        if iv.is_empty() {
            return;
        }
        let rep = &mut r.rep;
        let from = rep.injected_unix_ms.unwrap_or(r.opened_ms);
        let end = r.closed_ms.unwrap_or_else(unix_ms);
        let w = WINDOW.as_millis() as u64;
        // An interval line is stamped when it ends: a line within a second of the
        // resumption still covers the gap.
        let back = rep.resumed_unix_ms.map(|t| t + 1000);
        rep.iperf3_mbps = Throughput {
            before: mean_in(iv, from.saturating_sub(w), from),
            during: mean_in(iv, from, back.unwrap_or(end).min(end)),
            after: back.and_then(|b| mean_in(iv, b, (b + w).min(end))),
        };
    }
}

/// Whether the load's iperf3 has moved data again after the fault of `r`: an interval
/// that starts once the daemon's counters saw traffic move again after the fault (or,
/// after a kill, once the new daemon answered) and holds more than ~0 bytes (~0 as the
/// verdict of [`iperf3_windows`] measures it, the steady rate taken before `first`, the
/// run's first fault). An `expect` waits for it within its `within_ms`: after a long
/// outage TCP's retransmission timer has backed off, and its next try may come seconds
/// after the daemon is back. Never true before the traffic has resumed, so an interval
/// printed between the fault and the outage showing in iperf3 does not count.
pub(super) fn iperf3_back(r: &Record, first: u64, iv: &[Interval]) -> bool {
    let up = r.rep.daemon.as_ref().and_then(|d| d.up_unix_ms);
    match (r.rep.resumed_unix_ms, up) {
        (None, None) => false,
        (a, b) => gaps::moved_after(iv, first, a.max(b).unwrap_or(0)),
    }
}

/// The load's iperf3 intervals around every record's fault (see [`super::gaps`]), and
/// the `iperf3_resumed` checks the records' expectations asked for. `None` when the
/// load printed no interval line.
pub(super) fn iperf3_windows(records: &mut [Record], iv: &[Interval]) -> Option<Iperf3Session> {
    let end = unix_ms();
    let faults: Vec<(u64, u64)> = records
        .iter()
        .map(|r| {
            (
                r.rep.injected_unix_ms.unwrap_or(r.opened_ms),
                r.closed_ms.unwrap_or(end),
            )
        })
        .collect();
    let (session, windows) = gaps::analyse(iv, &faults);
    for (r, w) in records.iter_mut().zip(windows) {
        if let Some(want) = r.want_iperf3_resumed {
            let (ok, detail) = match &w {
                None if iv.is_empty() => (false, "the load printed no iperf3 interval".into()),
                None => (false, "no iperf3 interval around the fault".into()),
                Some(w) if w.intervals_after == 0 => (
                    false,
                    "no iperf3 interval after the fault (the session ended or its output stopped)"
                        .into(),
                ),
                Some(w) => (
                    w.bytes_after > 0.0,
                    format!(
                        "{:.1} MiB in {} interval(s) after the longest ~0-byte stretch ({:.1} s, back {:+.1} s from the fault)",
                        w.bytes_after / (1024.0 * 1024.0),
                        w.intervals_after,
                        w.gap_ms / 1e3,
                        w.back_ms / 1e3
                    ),
                ),
            };
            r.rep.expectations.push(Outcome {
                what: if want {
                    "iperf3 moved data after the fault"
                } else {
                    "iperf3 moved no data after the fault"
                }
                .into(),
                ok: ok == want,
                detail,
            });
        }
        r.rep.iperf3 = w;
    }
    (!iv.is_empty()).then_some(session)
}
