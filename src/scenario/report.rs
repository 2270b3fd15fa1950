//! What a scenario run found: per fault, when it was injected, detected and got over,
//! what it cost, and whether each expectation held. Printed as a table and written as
//! JSON (the same content).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use super::series::Series;
use crate::iface::stats::Residuals;

/// One checked expectation.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Outcome {
    /// What was expected, e.g. `recovered within 200 ms`.
    pub what: String,
    /// Whether it held.
    pub ok: bool,
    /// What was seen.
    pub detail: String,
}

/// Throughput in three windows around a fault (Mbit/s): the seconds before it, from it
/// until traffic resumed, and the seconds after.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Throughput {
    /// Before the injection.
    pub before: Option<f64>,
    /// From the injection until traffic resumed.
    pub during: Option<f64>,
    /// After traffic resumed.
    pub after: Option<f64>,
}

/// One fault of the run (an inject, an operator restart, a storm, or a command named a
/// fault) and what followed it.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct FaultReport {
    /// 1-based, in the order the faults were opened.
    pub index: usize,
    /// The repetition of the scenario (1-based).
    pub iteration: u64,
    /// The line of the step that opened it.
    pub line: usize,
    /// The fault (`poll-error`, `operator-restart`, `storm`, `device-flap`, ...).
    pub fault: String,
    /// The name the scenario gave it.
    pub label: String,
    /// When it was injected (ms since the Unix epoch): the first hit of an armed fault,
    /// or when the command or restart request was made.
    pub injected_unix_ms: Option<u64>,
    /// When the daemon noticed it: the first restart's detection, or else the first
    /// counter that shows it (a drop, a spurious event, a rejected completion).
    pub detected_unix_ms: Option<u64>,
    /// When traffic moved again after it.
    pub resumed_unix_ms: Option<u64>,
    /// Detection minus injection (ms).
    pub detect_ms: Option<f64>,
    /// Resumption minus injection (ms).
    pub resume_ms: Option<f64>,
    /// The longest restart's recovery (detection to a running poller), ms.
    pub recovery_ms: Option<f64>,
    /// Restarts that followed.
    pub restarts: u64,
    /// Their causes, in order.
    pub causes: Vec<String>,
    /// Work requests reaped at those restarts.
    pub wr_reaped: u64,
    /// Of those, sends.
    pub sends_reaped: u64,
    /// Work requests flushed at those restarts' teardowns.
    pub flushed: u64,
    /// Failed attempts to open the device during those restarts (a device away).
    pub failed_attempts: u64,
    /// Times the armed faults hit.
    pub fired: u64,
    /// For a storm: faults injected by kind.
    pub storm: BTreeMap<String, u64>,
    /// Packets dropped meanwhile, by reason (non-zero only).
    pub drops: BTreeMap<String, u64>,
    /// Completions rejected meanwhile (stale epoch, unknown, duplicate).
    pub stale_completions: u64,
    /// Every restart's ledger balanced, and the live counters did when checked.
    pub ledger_balanced: Option<bool>,
    /// The daemon's own throughput (bytes through the interface, both ways).
    pub throughput_mbps: Throughput,
    /// What the iperf3 load reported for its intervals, when the load is iperf3.
    pub iperf3_mbps: Throughput,
    /// The conservation law's residuals in the last live reading of the counters, per
    /// ring: posted - completed - flushed - reaped - outstanding (0 when balanced).
    pub ledger_residuals: Option<Residuals>,
    /// For a `kill` step: the daemon killed and the one started in its place.
    pub daemon: Option<DaemonRestart>,
    /// The load's iperf3 intervals around the fault (when the load is iperf3).
    pub iperf3: Option<Iperf3Window>,
    /// The expectations checked on it.
    pub expectations: Vec<Outcome>,
    /// Every expectation held.
    pub passed: bool,
    /// When its step started (ms since the Unix epoch; for a kill, the signal).
    pub opened_unix_ms: u64,
    /// When the next fault's step started, or the steps ended.
    pub closed_unix_ms: Option<u64>,
    /// Its plot (an SVG file next to the JSON report), when one was written.
    pub plot: Option<String>,
}

/// A daemon killed by a `kill` step and the one started in its place. Times are ms
/// since the Unix epoch; durations are ms from the signal.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct DaemonRestart {
    /// The signal sent (`KILL`, `TERM`, ...).
    pub signal: String,
    /// The killed daemon (the process that listens on the control socket).
    pub old_pid: Option<u32>,
    /// The daemon started in its place.
    pub new_pid: Option<u32>,
    /// The command line both ran with.
    pub argv: Vec<String>,
    /// The working directory both ran in.
    pub cwd: String,
    /// Where the new daemon's output goes.
    pub log: String,
    /// When the signal was sent.
    pub killed_unix_ms: Option<u64>,
    /// When the old daemon was seen gone.
    pub exited_unix_ms: Option<u64>,
    /// When the new one was started.
    pub started_unix_ms: Option<u64>,
    /// When the new one first answered `running` on the control socket.
    pub up_unix_ms: Option<u64>,
    /// The time of the new daemon's `interface up` log line, when its log has one.
    pub log_up_unix_ms: Option<u64>,
    /// Signal to the old daemon gone.
    pub exit_ms: Option<f64>,
    /// Signal to the old daemon's TAP gone (when it was in the runner's network
    /// namespace, and went within the step's timeout).
    pub tap_gone_ms: Option<f64>,
    /// Signal to the new daemon answering `running`.
    pub up_ms: Option<f64>,
    /// Signal to the new daemon's `interface up` log line.
    pub log_up_ms: Option<f64>,
    /// Why the step failed, when it did.
    pub error: Option<String>,
}

/// The load's iperf3 intervals around one fault, from 1 s before its injection to the
/// next fault (or the end of the load). Offsets are ms from the injection. An interval
/// is ~0 bytes when it holds less than [`Iperf3Session::zero_limit_bytes`].
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Iperf3Window {
    /// Where the window starts (-1000) and ends.
    pub window_ms: [f64; 2],
    /// The longest run of consecutive ~0-byte intervals (0 when none).
    pub gap_ms: f64,
    /// Where it starts.
    pub gap_from_ms: Option<f64>,
    /// Where it ends.
    pub gap_to_ms: Option<f64>,
    /// When the data came back: the end of that run, never before the injection (0
    /// without a run).
    pub back_ms: f64,
    /// The lowest interval, in % of the steady median.
    pub min_pct: Option<f64>,
    /// Bytes in the intervals after the run, to the end of the window.
    pub bytes_after: f64,
    /// How many intervals that is.
    pub intervals_after: usize,
    /// Their rate (Mbit/s).
    pub mbps_after: Option<f64>,
}

/// The load's iperf3 session as a whole.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Iperf3Session {
    /// Interval lines read.
    pub intervals: usize,
    /// The steady median: bytes per interval before the first fault (the first
    /// interval, TCP's slow start, left out).
    pub baseline_bytes: Option<f64>,
    /// Below this an interval counts as ~0 bytes: 1% of the baseline (64 KiB without
    /// one).
    pub zero_limit_bytes: f64,
    /// The longest run of ~0-byte intervals outside every fault's window (at least
    /// 500 ms; 0 when none): a stall of the test bed, for scale.
    pub longest_gap_outside_faults_ms: f64,
    /// Where it starts, in ms from the first interval.
    pub longest_gap_outside_faults_at_ms: Option<f64>,
}

/// The daemon at the end of the run, after the load stopped.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct AtRest {
    /// Its state.
    pub state: String,
    /// The ledger's residuals in the last reading (none if no reading worked).
    pub ledger_residuals: Option<Residuals>,
    /// Both residuals were 0 in one reading.
    pub ledger_balanced: bool,
}

/// The background load.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct TrafficReport {
    /// The command.
    pub command: String,
    /// It moved data before the first step.
    pub moved_before_steps: bool,
    /// It was still running when the scenario ended.
    pub running_at_end: bool,
    /// Its exit status, when it ended (by itself or when stopped).
    pub exit: Option<i32>,
    /// Its last lines of output.
    pub tail: Vec<String>,
}

/// A whole run.
#[derive(Debug, Clone, Default, Serialize, PartialEq)]
pub struct Report {
    /// The scenario's name.
    pub scenario: String,
    /// Its file.
    pub file: String,
    /// What it does.
    pub description: String,
    /// The control socket used.
    pub control: String,
    /// Every expectation held and every step worked.
    pub passed: bool,
    /// What went wrong, one line each.
    pub failures: Vec<String>,
    /// When it started (ms since the Unix epoch).
    pub started_unix_ms: u64,
    /// How long it took.
    pub elapsed_ms: u64,
    /// When the last step ended (ms since the Unix epoch), before the load was stopped
    /// and the faults cleared.
    pub steps_ended_unix_ms: u64,
    /// Repetitions of the steps.
    pub repeat: u64,
    /// The variables used.
    pub vars: BTreeMap<String, String>,
    /// The faults.
    pub faults: Vec<FaultReport>,
    /// Checks of the run as a whole (the ledger at the end).
    pub checks: Vec<Outcome>,
    /// The daemon at rest, after the load stopped.
    pub at_rest: Option<AtRest>,
    /// The load's iperf3 session, when the load is iperf3.
    pub iperf3: Option<Iperf3Session>,
    /// The background load, if any.
    pub traffic: Option<TrafficReport>,
    /// The counter samples and the load's iperf3 intervals over the run.
    pub series: Series,
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
}

fn mbps(t: &Throughput) -> String {
    let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.1}"));
    format!("{}/{}/{}", f(t.before), f(t.during), f(t.after))
}

impl Report {
    /// The human table.
    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "scenario {} ({}): {} — {} fault{}, {:.1} s{}",
            self.scenario,
            self.file,
            if self.passed { "PASSED" } else { "FAILED" },
            self.faults.len(),
            if self.faults.len() == 1 { "" } else { "s" },
            self.elapsed_ms as f64 / 1000.0,
            if self.repeat > 1 {
                format!(", steps repeated {} times", self.repeat)
            } else {
                String::new()
            }
        );
        if !self.description.is_empty() {
            let _ = writeln!(t, "  {}", self.description.trim());
        }
        let iperf = self
            .faults
            .iter()
            .any(|f| f.iperf3_mbps != Throughput::default());
        let _ = writeln!(
            t,
            "{:>3} {:<18} {:>9} {:>9} {:>11} {:>8} {:>9} {:>6} {:<24} {:>20} {:>20}  result",
            "#",
            "fault",
            "detect_ms",
            "resume_ms",
            "recovery_ms",
            "restarts",
            "wr_reaped",
            "ledger",
            "drops",
            "Mbit/s b/d/a (uipoib)",
            if iperf { "Mbit/s b/d/a (iperf3)" } else { "" },
        );
        for f in &self.faults {
            let drops = if f.drops.is_empty() {
                "-".to_string()
            } else {
                f.drops
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(",")
            };
            let _ = writeln!(
                t,
                "{:>3} {:<18} {:>9} {:>9} {:>11} {:>8} {:>9} {:>6} {:<24} {:>20} {:>20}  {}",
                f.index,
                f.label,
                ms(f.detect_ms),
                ms(f.resume_ms),
                f.recovery_ms
                    .map_or_else(|| "-".into(), |v| format!("{v:.1}")),
                f.restarts,
                f.wr_reaped,
                match f.ledger_balanced {
                    Some(true) => "ok",
                    Some(false) => "BAD",
                    None => "-",
                },
                drops,
                mbps(&f.throughput_mbps),
                if iperf {
                    mbps(&f.iperf3_mbps)
                } else {
                    String::new()
                },
                if f.passed { "ok" } else { "FAIL" },
            );
            if !f.storm.is_empty() {
                let s: Vec<String> = f.storm.iter().map(|(k, v)| format!("{k}={v}")).collect();
                let _ = writeln!(t, "      storm: {} (fired {})", s.join(" "), f.fired);
            }
            if let Some(d) = &f.daemon {
                let _ = writeln!(
                    t,
                    "      daemon: SIG{} pid {} -> pid {}: gone after {} ms, running after {} ms, interface up after {} ms by its log ({})",
                    d.signal,
                    d.old_pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    d.new_pid.map_or_else(|| "-".into(), |p| p.to_string()),
                    ms(d.exit_ms),
                    ms(d.up_ms),
                    ms(d.log_up_ms),
                    d.log
                );
            }
            if let Some(w) = &f.iperf3 {
                let _ = writeln!(
                    t,
                    "      iperf3: longest ~0-byte stretch {:.1} s ({}..{} s from the fault), back at {:+.1} s, lowest interval {}% of steady, {:.1} MiB after",
                    w.gap_ms / 1e3,
                    w.gap_from_ms
                        .map_or_else(|| "-".into(), |v| format!("{:+.1}", v / 1e3)),
                    w.gap_to_ms
                        .map_or_else(|| "-".into(), |v| format!("{:+.1}", v / 1e3)),
                    w.back_ms / 1e3,
                    ms(w.min_pct),
                    w.bytes_after / (1024.0 * 1024.0)
                );
            }
            if let Some(p) = &f.plot {
                let _ = writeln!(t, "      plot: {p}");
            }
            for o in &f.expectations {
                let _ = writeln!(
                    t,
                    "      {} {}: {}",
                    if o.ok { "ok  " } else { "FAIL" },
                    o.what,
                    o.detail
                );
            }
        }
        for o in &self.checks {
            let _ = writeln!(
                t,
                "  {} {}: {}",
                if o.ok { "ok  " } else { "FAIL" },
                o.what,
                o.detail
            );
        }
        if let Some(s) = &self.iperf3 {
            let _ = writeln!(
                t,
                "  iperf3: {} intervals, steady {} KiB each, longest ~0-byte stretch away from the faults {:.1} s",
                s.intervals,
                s.baseline_bytes
                    .map_or_else(|| "-".into(), |b| format!("{:.0}", b / 1024.0)),
                s.longest_gap_outside_faults_ms / 1e3
            );
        }
        if self.series.dropped > 0 {
            let _ = writeln!(
                t,
                "  series: {} samples kept, the {} oldest dropped (at most {} are kept)",
                self.series.samples.len(),
                self.series.dropped,
                self.series.cap
            );
        }
        if let Some(tr) = &self.traffic {
            let _ = writeln!(
                t,
                "  traffic: {} ({}; exit {})",
                tr.command,
                if tr.running_at_end {
                    "ran to the end"
                } else {
                    "NOT running at the end"
                },
                tr.exit.map_or_else(|| "-".into(), |c| c.to_string())
            );
        }
        if !self.failures.is_empty() {
            let _ = writeln!(t, "failures:");
            for f in &self.failures {
                let _ = writeln!(t, "  - {f}");
            }
        }
        t
    }
}
