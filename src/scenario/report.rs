//! What a scenario run found: per fault, when it was injected, detected and got over,
//! what it cost, and whether each expectation held. Printed as a table and written as
//! JSON (the same content).

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

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
    /// The expectations checked on it.
    pub expectations: Vec<Outcome>,
    /// Every expectation held.
    pub passed: bool,
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
    /// Repetitions of the steps.
    pub repeat: u64,
    /// The variables used.
    pub vars: BTreeMap<String, String>,
    /// The faults.
    pub faults: Vec<FaultReport>,
    /// Checks of the run as a whole (the ledger at the end).
    pub checks: Vec<Outcome>,
    /// The background load, if any.
    pub traffic: Option<TrafficReport>,
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
