//! Playing a scenario against a live daemon through its control socket.
//!
//! While the steps run, a sampler thread reads the daemon's counters every
//! [`SAMPLE_EVERY`]; the background load (if any) runs as a child process whose output
//! is stamped line by line (iperf3's interval lines give its throughput). Each fault
//! record is measured from those samples, the daemon's restart history and the fault
//! switch's injection log. The run never stops at a failed expectation: it records it,
//! goes on, and the report lists every failure. Faults are cleared before the first step
//! and after the last.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::kill;
use super::record::{Record, iperf3_windows};
use super::report::{Outcome, Report};
use super::steps::exec;
use super::traffic::{Load, MAX_SAMPLES, Sampler, lock};
use super::{Action, Scenario};
use crate::iface::stats::Snapshot;
use crate::runtime::control::{self, ControlError};
use crate::runtime::supervisor::Status;

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The windows before and after a fault over which throughput is averaged.
pub const WINDOW: Duration = Duration::from_secs(3);

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The daemon does not answer.
    #[error(transparent)]
    Control(#[from] ControlError),
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The daemon's control socket.
#[derive(Clone)]
pub(super) struct Client {
    pub(super) path: PathBuf,
}

impl Client {
    pub(super) fn ask(&self, req: &Value) -> Result<Value, ControlError> {
        control::request_json(&self.path, req)
    }

    pub(super) fn body<T: serde::de::DeserializeOwned>(
        &self,
        cmd: &str,
    ) -> Result<T, ControlError> {
        let v = self.ask(&json!({ "cmd": cmd }))?;
        serde_json::from_value(v[cmd].clone()).map_err(|e| ControlError::BadReply {
            path: self.path.clone(),
            why: format!("{cmd}: {e}"),
        })
    }

    pub(super) fn stats(&self) -> Result<Snapshot, ControlError> {
        self.body("stats")
    }

    pub(super) fn status(&self) -> Result<Status, ControlError> {
        self.body("status")
    }

    pub(super) fn faults(&self) -> Result<Value, ControlError> {
        self.ask(&json!({"cmd": "faults"}))
    }
}

/// Reads of the daemon's counters and status while faults are followed. A failed read
/// is never taken for zeros (no restarts, empty counters): the last good reading stands
/// in, and the run reports the failure and fails.
#[derive(Default)]
struct Reads {
    failed: u64,
    first_error: Option<String>,
    stats: Option<Snapshot>,
    status: Option<Status>,
}

/// Plays a scenario.
pub struct Runner {
    pub(super) client: Client,
    pub(super) scenario: Scenario,
    pub(super) started: Instant,
    pub(super) quiet: bool,
    /// The most counter samples kept ([`MAX_SAMPLES`] unless set).
    pub(super) sample_cap: usize,
    reads: RefCell<Reads>,
}

impl Runner {
    /// A runner for `scenario` against the daemon at `control`.
    pub fn new(scenario: Scenario, control: &Path) -> Runner {
        Runner {
            client: Client {
                path: control.to_owned(),
            },
            scenario,
            started: Instant::now(),
            quiet: false,
            sample_cap: MAX_SAMPLES,
            reads: RefCell::new(Reads::default()),
        }
    }

    /// Keep at most `cap` counter samples (at least 1; the oldest go first).
    pub fn sample_cap(mut self, cap: usize) -> Runner {
        self.sample_cap = cap.max(1);
        self
    }

    /// The daemon's counters, or the last good reading if this read fails.
    pub(super) fn read_stats(&self) -> Snapshot {
        self.read_or_last("counters", self.client.stats(), |r| &mut r.stats)
    }

    /// Whether a reading of the counters worked since the last [`Self::forget_readings`].
    pub(super) fn has_read_stats(&self) -> bool {
        self.reads.borrow().stats.is_some()
    }

    /// The daemon is a new one: its predecessor's readings do not stand in for its own.
    fn forget_readings(&self) {
        let mut r = self.reads.borrow_mut();
        r.stats = None;
        r.status = None;
    }

    /// The daemon's status, or the last good reading if this read fails.
    pub(super) fn read_status(&self) -> Status {
        self.read_or_last("status", self.client.status(), |r| &mut r.status)
    }

    /// `got`, kept as the last good reading of `what`; on a failed read, that last good
    /// reading (the failure is recorded).
    fn read_or_last<T: Clone + Default>(
        &self,
        what: &str,
        got: Result<T, ControlError>,
        last: impl Fn(&mut Reads) -> &mut Option<T>,
    ) -> T {
        match got {
            Ok(v) => {
                *last(&mut self.reads.borrow_mut()) = Some(v.clone());
                v
            }
            Err(e) => {
                self.read_failed(what, &e);
                last(&mut self.reads.borrow_mut())
                    .clone()
                    .unwrap_or_default()
            }
        }
    }

    fn read_failed(&self, what: &str, e: &ControlError) {
        let first = {
            let mut r = self.reads.borrow_mut();
            r.failed += 1;
            r.first_error.is_none() && {
                r.first_error = Some(format!("{what}: {e}"));
                true
            }
        };
        if first {
            self.say(&format!(
                "reading the daemon's {what} failed: {e} (the last good reading stands in; the run will fail)"
            ));
        }
    }

    /// The check that every read of the daemon's counters and status worked, if one did
    /// not.
    fn reads_check(&self) -> Option<Outcome> {
        let r = self.reads.borrow();
        (r.failed > 0).then(|| Outcome {
            what: "every read of the daemon's counters and status worked".into(),
            ok: false,
            detail: format!(
                "{} failed, the first: {}; figures after it may be stale",
                r.failed,
                r.first_error.as_deref().unwrap_or("?")
            ),
        })
    }

    /// No progress lines on stderr.
    pub fn quiet(mut self) -> Runner {
        self.quiet = true;
        self
    }

    pub(super) fn say(&self, msg: &str) {
        if !self.quiet {
            eprintln!(
                "[{:7.2}s] {}: {msg}",
                self.started.elapsed().as_secs_f64(),
                self.scenario.name
            );
        }
    }

    /// Run it. Errs only when the daemon does not answer at the start; everything after
    /// that is in the report.
    pub fn run(mut self) -> Result<Report, RunError> {
        self.started = Instant::now();
        let sc = self.scenario.clone();
        let first = self.client.status()?;
        self.say(&format!(
            "daemon on {} is {} (epoch {}, {} restarts)",
            self.client.path.display(),
            first.state,
            first.epoch,
            first.restarts
        ));
        let mut report = Report {
            scenario: sc.name.clone(),
            file: sc.file.display().to_string(),
            description: sc.description.clone(),
            control: self.client.path.display().to_string(),
            started_unix_ms: unix_ms(),
            repeat: sc.repeat,
            vars: sc.vars.clone(),
            ..Report::default()
        };
        if let Err(e) = self.client.ask(&json!({"cmd": "clear"})) {
            report.failures.push(format!("clearing faults first: {e}"));
        }
        let sampler = Sampler::start(self.client.clone(), self.sample_cap);
        let mut load = None;
        let mut moved = false;
        if let Some(t) = &sc.traffic {
            self.say(&format!("starting the load: {}", t.command));
            match Load::start(&t.command) {
                Ok(l) => {
                    load = Some(l);
                    moved = self.wait_moving(t.warmup, load.as_mut());
                    if !moved {
                        report.failures.push(format!(
                            "the load `{}` moved no data through the interface within {} ms",
                            t.command,
                            t.warmup.as_millis()
                        ));
                    }
                }
                Err(e) => report
                    .failures
                    .push(format!("cannot start the load `{}`: {e}", t.command)),
            }
        }

        let mut records: Vec<Record> = Vec::new();
        // Daemons a kill step started (they outlive the run).
        let mut children: Vec<std::process::Child> = Vec::new();
        for iteration in 1..=sc.repeat {
            if sc.repeat > 1 {
                self.say(&format!("repetition {iteration} of {}", sc.repeat));
            }
            for step in &sc.steps {
                let at = format!("line {}", step.line);
                match &step.action {
                    Action::Wait(d) => {
                        self.say(&format!("{at}: wait {} ms", d.as_millis()));
                        thread::sleep(*d);
                    }
                    Action::Clear => {
                        self.say(&format!("{at}: clear"));
                        if let Err(e) = self.client.ask(&json!({"cmd": "clear"})) {
                            report.failures.push(format!("{at}: clear: {e}"));
                        }
                    }
                    Action::Inject { spec, label } => {
                        self.open(
                            &mut records,
                            &sampler,
                            iteration,
                            step.line,
                            spec.kind().name(),
                            label,
                            true,
                        );
                        let mut req = spec.to_json();
                        req["cmd"] = "inject".into();
                        self.say(&format!("{at}: inject {spec}"));
                        if let Err(e) = self.client.ask(&req) {
                            report.failures.push(format!("{at}: inject {spec}: {e}"));
                        }
                    }
                    Action::Restart { label } => {
                        self.open(
                            &mut records,
                            &sampler,
                            iteration,
                            step.line,
                            "operator-restart",
                            label,
                            false,
                        );
                        self.say(&format!("{at}: restart"));
                        if let Err(e) = self.client.ask(&json!({"cmd": "restart"})) {
                            report.failures.push(format!("{at}: restart: {e}"));
                        }
                    }
                    Action::Exec {
                        command,
                        timeout,
                        fault,
                        within,
                        may_fail,
                    } => {
                        if let Some(f) = fault {
                            self.open(&mut records, &sampler, iteration, step.line, f, f, false);
                        }
                        self.say(&format!("{at}: exec {command}"));
                        let (outcome, fail) = exec(command, *timeout, *within, *may_fail);
                        self.say(&format!("{at}: {}", outcome.detail));
                        if let Some(r) = records.last_mut().filter(|_| fault.is_some()) {
                            r.rep.expectations.push(outcome);
                        } else if fail {
                            report
                                .failures
                                .push(format!("{at}: {}: {}", outcome.what, outcome.detail));
                        }
                    }
                    Action::Kill(k) => {
                        self.open(
                            &mut records,
                            &sampler,
                            iteration,
                            step.line,
                            "kill",
                            &k.label,
                            false,
                        );
                        self.say(&format!(
                            "{at}: SIG{} to the daemon, then start it again",
                            k.signal_name
                        ));
                        let killed =
                            kill::kill_and_restart(k, &self.client.path, &mut children, || {
                                sampler.next_generation();
                                self.forget_readings();
                            });
                        children.extend(killed.child);
                        let d = killed.report;
                        let outcome = Outcome {
                            what: format!(
                                "SIG{} to the daemon, a new one running within {} ms",
                                k.signal_name,
                                k.timeout.as_millis()
                            ),
                            ok: d.error.is_none(),
                            detail: d.error.clone().unwrap_or_else(|| {
                                format!(
                                    "pid {} gone after {:.0} ms, pid {} running after {:.0} ms (log: {})",
                                    d.old_pid.unwrap_or(0),
                                    d.exit_ms.unwrap_or(0.0),
                                    d.new_pid.unwrap_or(0),
                                    d.up_ms.unwrap_or(0.0),
                                    d.log
                                )
                            }),
                        };
                        self.say(&format!("{at}: {}", outcome.detail));
                        if let Some(r) = records.last_mut() {
                            // The new daemon's counters, restarts and injections start
                            // at 0: so does the record.
                            r.start = Snapshot::default();
                            r.restarts0 = 0;
                            r.injected0 = 0;
                            r.seq0 = 0;
                            r.opened_ms = d.killed_unix_ms.unwrap_or(r.opened_ms);
                            r.generation = sampler.generation();
                            r.rep.expectations.push(outcome);
                            r.rep.daemon = Some(d);
                        }
                    }
                    Action::Storm(storm) => {
                        self.open(
                            &mut records,
                            &sampler,
                            iteration,
                            step.line,
                            "storm",
                            &storm.label,
                            true,
                        );
                        self.storm(storm, &at, &mut report, records.last_mut());
                    }
                    Action::Expect(e) => {
                        // `rate_restored` measures against the rate before the run's first
                        // fault that had one (above zero): after a dead interface is revived,
                        // the window before the revival holds no traffic to compare with.
                        let healthy = records.split_last().and_then(|(_, earlier)| {
                            earlier.iter().find_map(|r| {
                                let name = if r.rep.label.is_empty() {
                                    &r.rep.fault
                                } else {
                                    &r.rep.label
                                };
                                super::record::baseline(r.rep.throughput_mbps.before)
                                    .map(|b| (b, name.clone()))
                            })
                        });
                        let first = records
                            .first()
                            .map(|f| f.rep.injected_unix_ms.unwrap_or(f.opened_ms));
                        let Some(r) = records.last_mut() else {
                            continue; // refused when loading
                        };
                        let first = first.unwrap_or(r.opened_ms);
                        self.say(&format!("{at}: expect (up to {} ms)", e.within.as_millis()));
                        let outcomes = self.expect(e, r, &sampler, load.as_mut(), healthy, first);
                        for o in &outcomes {
                            self.say(&format!(
                                "{at}: {} {}: {}",
                                if o.ok { "ok" } else { "FAILED" },
                                o.what,
                                o.detail
                            ));
                        }
                        r.rep.expectations.extend(outcomes);
                    }
                }
            }
        }

        // The end: close the last fault, stop the load, then check the daemon at rest.
        report.steps_ended_unix_ms = unix_ms();
        let mut traffic = None;
        if let Some(l) = load.take() {
            let iv = l.intervals.clone();
            if let Some(r) = records.last_mut() {
                self.close(r, &sampler, Some(&lock(&iv)));
            }
            let mut t = l.stop();
            t.moved_before_steps = moved;
            self.say(&format!(
                "load stopped ({}; exit {:?})",
                if t.running_at_end {
                    "it was running"
                } else {
                    "it had ended"
                },
                t.exit
            ));
            traffic = Some(t);
            for r in records.iter_mut() {
                self.finish_iperf(r, &lock(&iv));
            }
            report.iperf3 = iperf3_windows(&mut records, &lock(&iv));
            report.series = sampler.series(&lock(&iv), report.started_unix_ms);
        } else {
            if let Some(r) = records.last_mut() {
                self.close(r, &sampler, None);
            }
            report.series = sampler.series(&[], report.started_unix_ms);
        }
        drop(sampler);
        if let Err(e) = self.client.ask(&json!({"cmd": "clear"})) {
            report
                .failures
                .push(format!("clearing faults at the end: {e}"));
        }
        let (checks, at_rest) = self.at_rest();
        report.checks = checks;
        report.at_rest = Some(at_rest);
        report.checks.extend(self.reads_check());
        for r in records.iter_mut() {
            r.rep.opened_unix_ms = r.opened_ms;
            r.rep.closed_unix_ms = r.closed_ms;
            r.rep.passed = r.rep.expectations.iter().all(|o| o.ok);
            for o in r.rep.expectations.iter().filter(|o| !o.ok) {
                report.failures.push(format!(
                    "fault #{} {} (line {}, repetition {}): {}: {}",
                    r.rep.index, r.rep.label, r.rep.line, r.rep.iteration, o.what, o.detail
                ));
            }
        }
        for o in report.checks.iter().filter(|o| !o.ok) {
            report.failures.push(format!("{}: {}", o.what, o.detail));
        }
        if let Some(t) = &traffic
            && !t.running_at_end
        {
            report.failures.push(format!(
                "the load `{}` ended before the scenario did (exit {:?}): {}",
                t.command,
                t.exit,
                t.tail.last().map_or("", String::as_str)
            ));
        }
        report.faults = records.into_iter().map(|r| r.rep).collect();
        report.traffic = traffic;
        report.passed = report.failures.is_empty();
        report.elapsed_ms = self.started.elapsed().as_millis() as u64;
        Ok(report)
    }

    /// Wait until the interface's packet counters move (the load works).
    fn wait_moving(&self, within: Duration, mut load: Option<&mut Load>) -> bool {
        let end = Instant::now() + within;
        let mut first: Option<u64> = None;
        while Instant::now() < end {
            if let Some(l) = load.as_deref_mut()
                && !l.running()
            {
                return false;
            }
            if let Ok(s) = self.client.stats() {
                let p = s.rx_packets + s.tx_packets;
                match first {
                    None => first = Some(p),
                    Some(f) if p > f + 10 => return true,
                    Some(_) => {}
                }
            }
            thread::sleep(Duration::from_millis(100));
        }
        false
    }
}
