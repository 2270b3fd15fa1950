//! Checking an `expect` step against the newest fault record, and the daemon at rest.

use std::thread;
use std::time::{Duration, Instant};

use super::record::{Record, iperf3_back, rates_for_restore, records_since};
use super::report::AtRest;
use super::report::Outcome;
use super::run::Runner;
use super::traffic::{Load, Sampler};
use super::{Expect, kill};
use crate::iface::stats::Residuals;
use crate::iface::stats::Snapshot;

impl Runner {
    pub(super) fn expect(
        &self,
        e: &Expect,
        r: &mut Record,
        sampler: &Sampler,
        mut load: Option<&mut Load>,
        healthy: Option<(f64, String)>,
        first_fault_unix_ms: u64,
    ) -> Vec<Outcome> {
        // The rate `rate_restored` compares with: an earlier fault's (the run's first
        // measured), else this one's; a window without traffic is no baseline (any rate
        // would pass against it).
        let baseline = |before: Option<f64>| match &healthy {
            Some((b, _)) => Some(*b),
            None => super::record::baseline(before),
        };
        let deadline = Instant::now() + e.within;
        let want_restarts = e.restarts.or(e.restarts_at_least);
        let intervals = load.as_ref().map(|l| l.intervals.clone());
        let waits_for_iperf3 = e.iperf3_resumed == Some(true);
        let (mut now, mut status);
        loop {
            (now, status) = self.refresh(r, &sampler.snapshot());
            let rep = &r.rep;
            let rose = |c: &String| counter(&now, c) > counter(&r.start, c);
            let pending = e.state.as_ref().is_some_and(|s| *s != status.state)
                || want_restarts.is_some_and(|n| rep.restarts < n)
                || e.cause.is_some() && rep.restarts == 0
                || e.failed_attempts_at_least
                    .is_some_and(|n| rep.restarts == 0 || rep.failed_attempts < n)
                || e.recovered_within_ms.is_some() && rep.recovery_ms.is_none()
                || e.new_daemon == Some(true) && !self.new_daemon(r).0
                || e.fired == Some(true) && rep.fired == 0
                || !e.rising.iter().all(rose)
                || (e.traffic_running.is_some() || e.resumed_within_ms.is_some())
                    && rep.resumed_unix_ms.is_none()
                || e.rate_restored.is_some_and(|f| {
                    let (before, now) = rates_for_restore(rep, &sampler.snapshot());
                    !matches!((baseline(before), now), (Some(b), Some(n)) if n >= f * b)
                })
                || e.detected_within_ms.is_some() && rep.detected_unix_ms.is_none()
                || e.ledger_balanced.is_some() && rep.ledger_balanced != Some(true)
                || waits_for_iperf3
                    && load.as_deref_mut().is_some_and(Load::running)
                    && intervals.as_ref().is_some_and(|iv| {
                        !iperf3_back(r, first_fault_unix_ms, &super::traffic::lock(iv))
                    });
            if !pending || Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let rep = &r.rep;
        let mut out = Vec::new();
        let mut check = |what: String, ok: bool, detail: String| {
            out.push(Outcome { what, ok, detail });
        };
        let waited = format!("after up to {} ms", e.within.as_millis());
        if let Some(s) = &e.state {
            check(
                format!("state {s}"),
                status.state == *s,
                format!("state {} ({waited})", status.state),
            );
        }
        if let Some(n) = e.restarts {
            check(
                format!("restarts = {n}"),
                rep.restarts == n,
                format!("{} restart(s): {}", rep.restarts, rep.causes.join(", ")),
            );
        }
        if let Some(n) = e.restarts_at_least {
            check(
                format!("restarts >= {n}"),
                rep.restarts >= n,
                format!("{} restart(s)", rep.restarts),
            );
        }
        if let Some(c) = &e.cause {
            check(
                format!("cause in {{{}}}", c.join(", ")),
                !rep.causes.is_empty() && rep.causes.iter().all(|x| c.contains(x)),
                if rep.causes.is_empty() {
                    format!("no restart ({waited})")
                } else {
                    format!("causes: {}", rep.causes.join(", "))
                },
            );
        }
        if let Some(n) = e.failed_attempts_at_least {
            check(
                format!("failed open attempts >= {n}"),
                rep.restarts > 0 && rep.failed_attempts >= n,
                if rep.restarts == 0 {
                    format!("no restart ({waited})")
                } else {
                    format!(
                        "{} failed attempt(s) in {} restart(s)",
                        rep.failed_attempts, rep.restarts
                    )
                },
            );
        }
        if let Some(bound) = e.recovered_within_ms {
            check(
                format!("recovered within {bound} ms"),
                rep.recovery_ms.is_some_and(|m| m <= bound),
                rep.recovery_ms.map_or_else(
                    || "no restart to recover from".into(),
                    |m| format!("slowest recovery {m:.1} ms"),
                ),
            );
        }
        if let Some(bound) = e.detected_within_ms {
            check(
                format!("detected within {bound} ms"),
                rep.detect_ms.is_some_and(|d| d <= bound as f64),
                rep.detect_ms.map_or_else(
                    || format!("not detected ({waited})"),
                    |d| format!("detected after {d:.0} ms"),
                ),
            );
        }
        if let Some(bound) = e.resumed_within_ms {
            let after = match (
                rep.resumed_unix_ms,
                rep.detected_unix_ms.or(rep.injected_unix_ms),
            ) {
                (Some(t), Some(d)) => Some(t as f64 - d as f64),
                _ => None,
            };
            check(
                format!(
                    "traffic resumed within {bound} ms of the {}",
                    if rep.detected_unix_ms.is_some() {
                        "detection"
                    } else {
                        "fault"
                    }
                ),
                after.is_some_and(|a| a <= bound as f64),
                after.map_or_else(
                    || format!("no traffic moved ({waited})"),
                    |a| format!("resumed {a:.0} ms after it"),
                ),
            );
        }
        if let Some(want) = e.ledger_balanced {
            let res = now.residuals();
            let (rr, sr) = (res.recv, res.send);
            let bad: Vec<u16> = records_since(&status, r.restarts0)
                .iter()
                .filter(|h| !h.ledger_balanced)
                .map(|h| h.epoch)
                .collect();
            check(
                "ledger balanced".into(),
                (rep.ledger_balanced == Some(true)) == want,
                if bad.is_empty() {
                    format!(
                        "every restart balanced; live counters {} (last residuals recv {rr}, send {sr})",
                        if r.live_balanced {
                            "balanced"
                        } else {
                            "never balanced"
                        }
                    )
                } else {
                    format!("restarts of epochs {bad:?} did not balance")
                },
            );
        }
        if let Some(want) = e.no_stale_completions {
            check(
                "no stale-epoch completions".into(),
                (rep.stale_completions == 0) == want,
                format!("{} rejected completion(s)", rep.stale_completions),
            );
        }
        if let Some(allowed) = &e.drops_only {
            let other: Vec<String> = rep
                .drops
                .iter()
                .filter(|(k, _)| !allowed.contains(k))
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            check(
                format!("drops only with reasons in {{{}}}", allowed.join(", ")),
                other.is_empty(),
                if other.is_empty() {
                    let d: Vec<String> =
                        rep.drops.iter().map(|(k, v)| format!("{k}={v}")).collect();
                    format!(
                        "drops: {}",
                        if d.is_empty() {
                            "none".into()
                        } else {
                            d.join(", ")
                        }
                    )
                } else {
                    format!("other drops: {}", other.join(", "))
                },
            );
        }
        for c in &e.rising {
            let (a, b) = (counter(&r.start, c), counter(&now, c));
            check(format!("{c} rose"), b > a, format!("{a} -> {b}"));
        }
        if let Some(want) = e.fired {
            check(
                if want {
                    "the fault fired"
                } else {
                    "the fault never fired"
                }
                .into(),
                (rep.fired > 0) == want,
                format!("{} injection(s)", rep.fired),
            );
        }
        if let Some(f) = e.rate_restored {
            let (before, last) = rates_for_restore(rep, &sampler.snapshot());
            let before = baseline(before);
            let secs = super::RATE_RESTORED_WINDOW.as_secs_f64();
            let whose = match &healthy {
                Some((_, label)) => format!("before the run's first fault ({label})"),
                None => "before".into(),
            };
            check(
                format!("rate restored to {:.0}% of before", f * 100.0),
                matches!((before, last), (Some(b), Some(n)) if n >= f * b),
                match (before, last) {
                    (None, _) => {
                        "no rate measured before the fault (no traffic in its window)".into()
                    }
                    (Some(b), None) => format!("{b:.1} Mbit/s {whose}, nothing measured now"),
                    (Some(b), Some(n)) => format!(
                        "{b:.1} Mbit/s {whose}, {n:.1} Mbit/s over the last {secs:.0} s ({:.0}%, {:.0}% needed, {waited})",
                        if b > 0.0 { n / b * 100.0 } else { 0.0 },
                        f * 100.0
                    ),
                },
            );
        }
        if let Some(want) = e.traffic_running {
            let alive = load.is_some_and(Load::running);
            let ok = alive && rep.resumed_unix_ms.is_some();
            check(
                "traffic still running".into(),
                ok == want,
                match (alive, rep.resumed_unix_ms, rep.resume_ms) {
                    (false, _, _) => "the load has ended".into(),
                    (true, None, _) => {
                        format!("running, but no data moved since the fault ({waited})")
                    }
                    (true, Some(_), Some(t)) => {
                        format!("moving again {t:.0} ms after the injection")
                    }
                    (true, Some(_), None) => "moving (the fault never hit)".into(),
                },
            );
        }
        if let Some(want) = e.new_daemon {
            let (ok, detail) = self.new_daemon(r);
            check(
                "a new daemon answers".into(),
                ok == want,
                format!("{detail} ({waited})"),
            );
        }
        if e.iperf3_resumed.is_some() {
            // Waited for above (when wanted); the verdict when the load has stopped: the
            // intervals after the fault count.
            r.want_iperf3_resumed = e.iperf3_resumed;
        }
        out
    }

    /// Whether the daemon answering on the control socket is the one the newest kill
    /// started (another pid than the killed one, the same command line), and what was
    /// seen.
    fn new_daemon(&self, r: &Record) -> (bool, String) {
        let Some(d) = &r.rep.daemon else {
            return (false, "no kill before it".into());
        };
        let (Some(old), Some(new)) = (d.old_pid, d.new_pid) else {
            return (
                false,
                d.error.clone().unwrap_or_else(|| "no new daemon".into()),
            );
        };
        match kill::answering(&self.client.path) {
            Err(e) => (false, format!("nothing answers: {e}")),
            Ok((pid, st)) => {
                let argv = kill::process(pid).map(|p| {
                    p.argv
                        .iter()
                        .map(|a| a.to_string_lossy().into_owned())
                        .collect::<Vec<_>>()
                });
                let same = argv.as_ref().is_ok_and(|a| *a == d.argv);
                (
                    pid == new && pid != old && same && st.state == "running",
                    format!(
                        "pid {pid} answers ({}; killed {old}, started {new}), command line {}",
                        st.state,
                        if same { "the same" } else { "DIFFERENT" }
                    ),
                )
            }
        }
    }

    /// The daemon at rest, after the load stopped: running, and its ledger balanced.
    pub(super) fn at_rest(&self) -> (Vec<Outcome>, AtRest) {
        let end = Instant::now() + Duration::from_secs(10);
        let (mut state, mut res) = (String::from("unknown"), None::<Residuals>);
        while Instant::now() < end {
            if let Ok(s) = self.client.status() {
                state = s.state;
            }
            if let Ok(s) = self.client.stats() {
                res = Some(s.residuals());
            }
            if state == "running" && res.is_some_and(|r| r.balanced()) {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        let balanced = res.is_some_and(|r| r.balanced());
        let rest = AtRest {
            state: state.clone(),
            ledger_residuals: res,
            ledger_balanced: balanced,
        };
        let checks = vec![
            Outcome {
                what: "the interface runs at the end".into(),
                ok: state == "running",
                detail: format!("state {state}"),
            },
            Outcome {
                what: "ledger balanced at the end".into(),
                ok: balanced,
                detail: res.map_or_else(
                    || "no counters".into(),
                    |r| format!("residuals recv {}, send {} (posted - completed - flushed - reaped - outstanding)", r.recv, r.send),
                ),
            },
        ];
        (checks, rest)
    }
}

/// A counter by name (`drops.REASON` for a drop reason).
fn counter(s: &Snapshot, name: &str) -> u64 {
    if let Some(r) = name.strip_prefix("drops.") {
        return s.drops.get(r).copied().unwrap_or(0);
    }
    serde_json::to_value(s)
        .ok()
        .and_then(|v| v[name].as_u64())
        .unwrap_or(0)
}
