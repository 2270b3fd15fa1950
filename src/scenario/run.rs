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
use std::collections::{BTreeMap, VecDeque};
use std::io::{BufRead, BufReader, Read};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use super::report::{FaultReport, Outcome, Report, Throughput, TrafficReport};
use super::{Action, Command, Expect, Scenario, Storm};
use crate::iface::stats::Snapshot;
use crate::runtime::control::{self, ControlError};
use crate::runtime::supervisor::{RestartRecord, Status};
use crate::verbs::fault::SplitMix64;

/// How often the counters are sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The windows before and after a fault over which throughput is averaged.
pub const WINDOW: Duration = Duration::from_secs(3);
/// Lines of the load's output kept for the report.
const TAIL: usize = 20;

/// A run that could not start.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// The daemon does not answer.
    #[error(transparent)]
    Control(#[from] ControlError),
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The daemon's control socket.
#[derive(Clone)]
struct Client {
    path: PathBuf,
}

impl Client {
    fn ask(&self, req: &Value) -> Result<Value, ControlError> {
        control::request_json(&self.path, req)
    }

    fn body<T: serde::de::DeserializeOwned>(&self, cmd: &str) -> Result<T, ControlError> {
        let v = self.ask(&json!({ "cmd": cmd }))?;
        serde_json::from_value(v[cmd].clone()).map_err(|e| ControlError::BadReply {
            path: self.path.clone(),
            why: format!("{cmd}: {e}"),
        })
    }

    fn stats(&self) -> Result<Snapshot, ControlError> {
        self.body("stats")
    }

    fn status(&self) -> Result<Status, ControlError> {
        self.body("status")
    }

    fn faults(&self) -> Result<Value, ControlError> {
        self.ask(&json!({"cmd": "faults"}))
    }
}

/// One counter sample.
#[derive(Clone, Copy, Debug)]
struct Sample {
    unix_ms: u64,
    /// Packets through the interface, both ways.
    packets: u64,
    /// Bytes through the interface, both ways.
    bytes: u64,
    /// Counters that show a fault: drops, spurious events, rejected completions.
    evidence: u64,
}

impl Sample {
    fn of(s: &Snapshot) -> Sample {
        Sample {
            unix_ms: unix_ms(),
            packets: s.rx_packets + s.tx_packets,
            bytes: s.rx_bytes + s.tx_bytes,
            evidence: s.drops_total() + s.spurious_events + s.completions_rejected,
        }
    }
}

type Shared<T> = Arc<Mutex<T>>;

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

struct Sampler {
    samples: Shared<Vec<Sample>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    fn start(client: Client) -> Sampler {
        let samples: Shared<Vec<Sample>> = Arc::default();
        let stop = Arc::new(AtomicBool::new(false));
        let (s, st) = (samples.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !st.load(Ordering::Relaxed) {
                if let Ok(snap) = client.stats() {
                    lock(&s).push(Sample::of(&snap));
                }
                thread::sleep(SAMPLE_EVERY);
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    fn snapshot(&self) -> Vec<Sample> {
        lock(&self.samples).clone()
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// An iperf3 interval line's throughput (Mbit/s): `[  5]   1.00-2.00   sec  11.2 MBytes
/// 94.0 Mbits/sec ...`. Summary lines (`sender`, `receiver`) are not intervals.
pub fn iperf3_interval_mbps(line: &str) -> Option<f64> {
    if line.contains("sender") || line.contains("receiver") {
        return None;
    }
    let t: Vec<&str> = line.split_whitespace().collect();
    let i = t.iter().position(|w| *w == "sec")?;
    let (value, unit) = (t.get(i + 3)?, t.get(i + 4)?);
    let v: f64 = value.parse().ok()?;
    let scale = match *unit {
        "bits/sec" => 1e-6,
        "Kbits/sec" => 1e-3,
        "Mbits/sec" => 1.0,
        "Gbits/sec" => 1e3,
        _ => return None,
    };
    Some(v * scale)
}

/// The background load, its output stamped.
struct Load {
    child: Child,
    command: String,
    intervals: Shared<Vec<(u64, f64)>>,
    tail: Shared<VecDeque<String>>,
    readers: Vec<JoinHandle<()>>,
}

fn spawn(command: &Command) -> std::io::Result<Child> {
    let mut c = match command {
        Command::Argv(a) => {
            let mut c = std::process::Command::new(&a[0]);
            c.args(&a[1..]);
            c
        }
        Command::Shell(s) => {
            let mut c = std::process::Command::new("sh");
            c.arg("-c").arg(s);
            c
        }
    };
    // A group of its own: a signal reaches what a shell line started, too.
    c.process_group(0);
    c.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
}

impl Load {
    fn start(command: &Command) -> std::io::Result<Load> {
        let mut child = spawn(command)?;
        let intervals: Shared<Vec<(u64, f64)>> = Arc::default();
        let tail: Shared<VecDeque<String>> = Arc::default();
        let mut readers = Vec::new();
        let outs: [Option<Box<dyn Read + Send>>; 2] = [
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn Read + Send>),
        ];
        for out in outs.into_iter().flatten() {
            let (iv, tl) = (intervals.clone(), tail.clone());
            readers.push(thread::spawn(move || {
                for line in BufReader::new(out).lines() {
                    let Ok(line) = line else { break };
                    if let Some(m) = iperf3_interval_mbps(&line) {
                        lock(&iv).push((unix_ms(), m));
                    }
                    let mut t = lock(&tl);
                    if t.len() == TAIL {
                        t.pop_front();
                    }
                    t.push_back(line);
                }
            }));
        }
        Ok(Load {
            child,
            command: command.to_string(),
            intervals,
            tail,
            readers,
        })
    }

    fn running(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(None))
    }

    /// Stop it (SIGINT, so iperf3 ends its test cleanly; SIGKILL after 5 s).
    fn stop(mut self) -> TrafficReport {
        let running = self.running();
        if running {
            let _ = crate::runtime::sys::kill_group(self.child.id(), libc::SIGINT);
            let end = Instant::now() + Duration::from_secs(5);
            while Instant::now() < end && self.running() {
                thread::sleep(Duration::from_millis(20));
            }
            if self.running() {
                let _ = crate::runtime::sys::kill_group(self.child.id(), libc::SIGKILL);
            }
        }
        let status = self.child.wait().ok();
        for r in self.readers.drain(..) {
            let _ = r.join();
        }
        TrafficReport {
            command: self.command.clone(),
            moved_before_steps: false,
            running_at_end: running,
            exit: status.and_then(|s| s.code()),
            tail: lock(&self.tail).iter().cloned().collect(),
        }
    }
}

/// A fault being followed.
struct Record {
    rep: FaultReport,
    /// When its step started.
    opened_ms: u64,
    /// Whether it is an armed fault (its injection time comes from the switch's log).
    armed: bool,
    start: Snapshot,
    restarts0: u64,
    injected0: u64,
    seq0: u64,
    /// A live snapshot balanced since it opened (after its restarts).
    live_balanced: bool,
    closed_ms: Option<u64>,
}

fn residuals(s: &Snapshot) -> (i128, i128) {
    let r = |l: [u64; 5]| l[0] as i128 - l[1..].iter().map(|v| *v as i128).sum::<i128>();
    (r(s.ledger(true)), r(s.ledger(false)))
}

/// The restart records added since `restarts0` restarts.
fn records_since(status: &Status, restarts0: u64) -> Vec<RestartRecord> {
    let n = status.restarts.saturating_sub(restarts0) as usize;
    let h = &status.history;
    h[h.len().saturating_sub(n)..].to_vec()
}

fn rate(samples: &[Sample], from: u64, to: u64) -> Option<f64> {
    let a = samples.iter().find(|s| s.unix_ms >= from)?;
    let b = samples.iter().rev().find(|s| s.unix_ms <= to)?;
    let dt = b.unix_ms.checked_sub(a.unix_ms)?;
    if dt < 200 {
        return None;
    }
    Some((b.bytes.saturating_sub(a.bytes)) as f64 * 8.0 / (dt as f64 / 1e3) / 1e6)
}

/// For `rate_restored`: the rate in the window before the fault, and over the last
/// [`super::RATE_RESTORED_WINDOW`] of samples, none of them from before the traffic
/// resumed (or, without a resumption, from before the injection).
fn rates_for_restore(
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

fn mean_in(iv: &[(u64, f64)], from: u64, to: u64) -> Option<f64> {
    let v: Vec<f64> = iv
        .iter()
        .filter(|(t, _)| *t > from && *t <= to)
        .map(|(_, m)| *m)
        .collect();
    (!v.is_empty()).then(|| v.iter().sum::<f64>() / v.len() as f64)
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
    client: Client,
    scenario: Scenario,
    started: Instant,
    quiet: bool,
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
            reads: RefCell::new(Reads::default()),
        }
    }

    /// The daemon's counters, or the last good reading if this read fails.
    fn read_stats(&self) -> Snapshot {
        self.read_or_last("counters", self.client.stats(), |r| &mut r.stats)
    }

    /// The daemon's status, or the last good reading if this read fails.
    fn read_status(&self) -> Status {
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

    fn say(&self, msg: &str) {
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
        let sampler = Sampler::start(self.client.clone());
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
                        let Some(r) = records.last_mut() else {
                            continue; // refused when loading
                        };
                        self.say(&format!("{at}: expect (up to {} ms)", e.within.as_millis()));
                        let outcomes = self.expect(e, r, &sampler, load.as_mut());
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
        } else if let Some(r) = records.last_mut() {
            self.close(r, &sampler, None);
        }
        drop(sampler);
        if let Err(e) = self.client.ask(&json!({"cmd": "clear"})) {
            report
                .failures
                .push(format!("clearing faults at the end: {e}"));
        }
        report.checks = self.at_rest();
        report.checks.extend(self.reads_check());
        for r in records.iter_mut() {
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

    #[allow(clippy::too_many_arguments)]
    fn open(
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
        });
    }

    /// Bring a record's measurements up to date.
    fn refresh(&self, r: &mut Record, samples: &[Sample]) -> (Snapshot, Status) {
        let now = self.read_stats();
        let status = self.read_status();
        let rep = &mut r.rep;
        if let Ok(f) = self.client.faults() {
            rep.fired = f["injected"]
                .as_u64()
                .unwrap_or(0)
                .saturating_sub(r.injected0);
            if r.armed {
                rep.injected_unix_ms = f["recent"].as_array().and_then(|a| {
                    a.iter()
                        .filter(|i| i["seq"].as_u64().is_some_and(|s| s > r.seq0))
                        .filter_map(|i| i["unix_ms"].as_u64())
                        .min()
                });
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
        rep.recovery_ms = recs.iter().map(|h| h.recovery_ms).reduce(f64::max);
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
        if residuals(&now) == (0, 0) && now.restarts >= status.restarts {
            r.live_balanced = true;
        }
        rep.ledger_balanced = Some(restarts_ok && r.live_balanced);

        let from = rep.injected_unix_ms.unwrap_or(r.opened_ms);
        let base = samples
            .iter()
            .rev()
            .find(|s| s.unix_ms <= from)
            .or(samples.first())
            .copied();
        rep.detected_unix_ms = recs.first().map(|h| h.detected_unix_ms).or_else(|| {
            let b = base?;
            samples
                .iter()
                .find(|s| s.unix_ms > from && s.evidence > b.evidence)
                .map(|s| s.unix_ms)
        });
        // Traffic resumes after the last restart's recovery (or after the injection).
        let back = recs
            .last()
            .map_or(from, |h| h.detected_unix_ms + h.recovery_ms.ceil() as u64);
        rep.resumed_unix_ms = samples
            .iter()
            .rev()
            .find(|s| s.unix_ms <= back)
            .or(base.as_ref())
            .and_then(|b| {
                samples
                    .iter()
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

    fn close(&self, r: &mut Record, sampler: &Sampler, iperf: Option<&[(u64, f64)]>) {
        if r.closed_ms.is_some() {
            return;
        }
        r.closed_ms = Some(unix_ms());
        self.refresh(r, &sampler.snapshot());
        if let Some(iv) = iperf {
            self.finish_iperf(r, iv);
        }
    }

    fn finish_iperf(&self, r: &mut Record, iv: &[(u64, f64)]) {
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

    fn storm(&self, storm: &Storm, at: &str, report: &mut Report, rec: Option<&mut Record>) {
        let total: u64 = storm.mix.iter().map(|(_, w)| w).sum();
        let mut rng = SplitMix64::new(storm.seed);
        let t0 = Instant::now();
        let mut by_kind: BTreeMap<String, u64> = BTreeMap::new();
        let mut errors = 0u64;
        self.say(&format!(
            "{at}: storm of {} faults over {} ms (seed {})",
            storm.count,
            storm.duration.as_millis(),
            storm.seed
        ));
        for i in 0..storm.count {
            let due = t0 + storm.duration.mul_f64(i as f64 / storm.count as f64);
            if let Some(d) = due.checked_duration_since(Instant::now()) {
                thread::sleep(d);
            }
            let mut pick = rng.below(total);
            let spec = storm
                .mix
                .iter()
                .find(|(_, w)| {
                    if pick < *w {
                        true
                    } else {
                        pick -= w;
                        false
                    }
                })
                .map_or(storm.mix[0].0, |(s, _)| *s);
            *by_kind.entry(spec.kind().name().to_string()).or_default() += 1;
            let mut req = spec.to_json();
            req["cmd"] = "inject".into();
            if let Err(e) = self.client.ask(&req) {
                errors += 1;
                if errors <= 3 {
                    report
                        .failures
                        .push(format!("{at}: storm fault {} ({spec}): {e}", i + 1));
                }
            }
        }
        if errors > 3 {
            report
                .failures
                .push(format!("{at}: storm: {errors} injections refused in all"));
        }
        let list: Vec<String> = by_kind.iter().map(|(k, v)| format!("{k}={v}")).collect();
        self.say(&format!("{at}: storm done: {}", list.join(" ")));
        if let Some(r) = rec {
            r.rep.storm = by_kind;
        }
    }

    fn expect(
        &self,
        e: &Expect,
        r: &mut Record,
        sampler: &Sampler,
        load: Option<&mut Load>,
    ) -> Vec<Outcome> {
        let deadline = Instant::now() + e.within;
        let want_restarts = e.restarts.or(e.restarts_at_least);
        let (mut now, mut status);
        loop {
            (now, status) = self.refresh(r, &sampler.snapshot());
            let rep = &r.rep;
            let rose = |c: &String| counter(&now, c) > counter(&r.start, c);
            let pending = e.state.as_ref().is_some_and(|s| *s != status.state)
                || want_restarts.is_some_and(|n| rep.restarts < n)
                || (e.cause.is_some() || e.recovered_within_ms.is_some()) && rep.restarts == 0
                || e.fired == Some(true) && rep.fired == 0
                || !e.rising.iter().all(rose)
                || (e.traffic_running.is_some() || e.resumed_within_ms.is_some())
                    && rep.resumed_unix_ms.is_none()
                || e.rate_restored.is_some_and(|f| {
                    let (before, now) = rates_for_restore(rep, &sampler.snapshot());
                    !matches!((before, now), (Some(b), Some(n)) if n >= f * b)
                })
                || e.detected_within_ms.is_some() && rep.detected_unix_ms.is_none()
                || e.ledger_balanced.is_some() && rep.ledger_balanced != Some(true);
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
                format!("traffic resumed within {bound} ms of the detection"),
                after.is_some_and(|a| a <= bound as f64),
                after.map_or_else(
                    || format!("no traffic moved ({waited})"),
                    |a| format!("resumed {a:.0} ms after it"),
                ),
            );
        }
        if let Some(want) = e.ledger_balanced {
            let (rr, sr) = residuals(&now);
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
            let secs = super::RATE_RESTORED_WINDOW.as_secs_f64();
            check(
                format!("rate restored to {:.0}% of before", f * 100.0),
                matches!((before, last), (Some(b), Some(n)) if n >= f * b),
                match (before, last) {
                    (None, _) => "no rate measured before the fault".into(),
                    (Some(b), None) => format!("{b:.1} Mbit/s before, nothing measured now"),
                    (Some(b), Some(n)) => format!(
                        "{b:.1} Mbit/s before, {n:.1} Mbit/s over the last {secs:.0} s ({:.0}%, {waited})",
                        if b > 0.0 { n / b * 100.0 } else { 0.0 }
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
        out
    }

    /// The daemon at rest, after the load stopped: running, and its ledger balanced.
    fn at_rest(&self) -> Vec<Outcome> {
        let end = Instant::now() + Duration::from_secs(10);
        let (mut state, mut res) = (String::from("unknown"), None);
        while Instant::now() < end {
            if let Ok(s) = self.client.status() {
                state = s.state;
            }
            if let Ok(s) = self.client.stats() {
                res = Some(residuals(&s));
            }
            if state == "running" && res == Some((0, 0)) {
                break;
            }
            thread::sleep(Duration::from_millis(100));
        }
        vec![
            Outcome {
                what: "the interface runs at the end".into(),
                ok: state == "running",
                detail: format!("state {state}"),
            },
            Outcome {
                what: "ledger balanced at the end".into(),
                ok: res == Some((0, 0)),
                detail: res.map_or_else(
                    || "no counters".into(),
                    |(r, s)| format!("residuals recv {r}, send {s} (posted - completed - flushed - reaped - outstanding)"),
                ),
            },
        ]
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

/// Run a command with a time limit: its outcome, and whether it counts as a failure.
fn exec(
    command: &Command,
    timeout: Duration,
    within: Option<Duration>,
    may_fail: bool,
) -> (Outcome, bool) {
    let what = match within {
        Some(w) => format!("`{command}` succeeds within {} ms", w.as_millis()),
        None => format!("`{command}` succeeds"),
    };
    let t0 = Instant::now();
    let child = match spawn(command) {
        Ok(c) => c,
        Err(e) => {
            return (
                Outcome {
                    what,
                    ok: may_fail,
                    detail: format!("cannot start it: {e}"),
                },
                !may_fail,
            );
        }
    };
    let pid = child.id();
    let (tx, rx) = mpsc::channel();
    let waiter = thread::spawn(move || {
        let _ = tx.send(child.wait_with_output());
    });
    let result = match rx.recv_timeout(timeout) {
        Ok(r) => Some(r),
        Err(_) => {
            let _ = crate::runtime::sys::kill_group(pid, libc::SIGKILL);
            None
        }
    };
    let _ = waiter.join();
    let took = t0.elapsed();
    let (ok, detail) = match result {
        None => (
            false,
            format!("killed after {} ms (timeout)", timeout.as_millis()),
        ),
        Some(Err(e)) => (false, format!("wait failed: {e}")),
        Some(Ok(o)) => {
            let text = String::from_utf8_lossy(if o.stderr.is_empty() {
                &o.stdout
            } else {
                &o.stderr
            })
            .trim()
            .chars()
            .take(200)
            .collect::<String>();
            let in_time = within.is_none_or(|w| took <= w);
            (
                o.status.success() && in_time,
                format!(
                    "{} in {} ms{}",
                    o.status,
                    took.as_millis(),
                    if text.is_empty() {
                        String::new()
                    } else {
                        format!(": {text}")
                    }
                ),
            )
        }
    };
    let fail = !ok && !may_fail;
    (
        Outcome {
            what,
            ok: ok || may_fail,
            detail,
        },
        fail,
    )
}
