//! `uipoib fault compare`: one scenario played once per poll-failure policy, each time
//! against a daemon started fresh for it (the same file, the same seed, the same load),
//! and one table of what each policy did.
//!
//! For each policy the comparison starts `uipoib up ARGS --tap TAP --allow-faults
//! --poll-failure-policy POLICY` (its output to a log file), waits until that process
//! answers `running` on the control socket, plays the scenario with the ordinary runner,
//! reads the daemon's counters, status and fault switch once more after a housekeeping
//! round (the never-completing gauges are refreshed once a second), stops the daemon with
//! SIGTERM and waits for it to exit. Meanwhile a sampler of its own reads the daemon's
//! packet and byte counters and its CPU time (`/proc/PID/stat`) every 50 ms.
//!
//! What a row measures, from the injection (the fault's first hit):
//! - the daemon's throughput (both ways, Mbit/s) in the 3 s before, in the `during`
//!   window after it, and in the `after` window that ends with the steps;
//! - when traffic resumed: the first 100 ms after the last restart (or the injection) in
//!   which packets moved both ways (received and sent) in two samples running; "never"
//!   when that did not happen before the steps ended;
//! - the work requests that will never complete (the daemon's `recv_never_complete` and
//!   `send_never_complete`: outstanding behind a later completion, or on a CQ nothing
//!   polls) and the completions the failing polls swallowed (the fault switch's count);
//! - the CPU time the daemon used in the `during` window (the whole process: the poller,
//!   and the control thread answering the samplers);
//! - the state, restarts and causes, and the ledger: posted = completed + flushed +
//!   reaped + outstanding, per ring, in the last reading.
//!
//! The comparison passes when every policy's daemon started, ran the scenario and
//! stopped, every ledger accounts for every work request, and `restart` (when compared)
//! recovered: running, traffic resumed, nothing left that will never complete.

use std::ffi::OsString;
use std::fmt::Write as _;
use std::fs::File;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use serde::Serialize;

use super::kill;
use super::report::{Report, Throughput};
use super::run::{Client, Runner, unix_ms};
use super::{CompareSpec, Scenario};
use crate::iface::PollFailurePolicy;
use crate::iface::stats::Snapshot;
use crate::runtime::supervisor::Status;
use crate::sys::process as sys;

/// How often the comparison's own sampler reads the daemon.
const SAMPLE_EVERY: Duration = Duration::from_millis(50);
/// The window before the injection.
const BEFORE: Duration = Duration::from_secs(3);
/// How long a daemon may take to exit on SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(25);
/// Clock ticks per second in `/proc/PID/stat` (USER_HZ, 100 on Linux).
const USER_HZ: f64 = 100.0;

/// What to compare and how.
pub struct CompareOptions {
    /// The scenario (loaded, variables substituted).
    pub scenario: Scenario,
    /// The policies, in order.
    pub policies: Vec<PollFailurePolicy>,
    /// The TAP every daemon gets (`--tap`).
    pub tap: String,
    /// The control socket those daemons listen on.
    pub control: PathBuf,
    /// `--control` for the daemons, when not the default for the TAP.
    pub control_flag: Option<PathBuf>,
    /// The rest of `uipoib up`'s arguments (device, address, tuning, config file).
    pub up_args: Vec<OsString>,
    /// The `uipoib` binary that runs the daemons.
    pub program: PathBuf,
    /// Where each daemon's log goes (`uipoib-SCENARIO-POLICY.log`).
    pub logs: PathBuf,
    /// How long a daemon may take to answer `running`.
    pub start_timeout: Duration,
    /// No progress lines.
    pub quiet: bool,
}

/// What one policy did.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PolicyRun {
    /// The policy.
    pub policy: String,
    /// Why it could not be measured, when it could not.
    pub error: Option<String>,
    /// The daemon's pid.
    pub pid: Option<u32>,
    /// Its log.
    pub log: String,
    /// The fault's first hit (ms since the Unix epoch).
    pub injected_unix_ms: Option<u64>,
    /// The daemon's throughput, both ways (Mbit/s): before, during, after.
    pub mbps: Throughput,
    /// What iperf3 reported, when the load is iperf3 (the runner's windows).
    pub iperf3_mbps: Throughput,
    /// Injection to traffic moving both ways again (ms); `None`: never.
    pub resumed_ms: Option<f64>,
    /// Restarts after the injection, and their causes.
    pub restarts: u64,
    /// The causes, in order.
    pub causes: Vec<String>,
    /// The slowest restart's recovery (ms).
    pub recovery_ms: Option<f64>,
    /// Failed polls the daemon saw.
    pub poll_failures: u64,
    /// `retry`: failed polls polled again.
    pub poll_retries: u64,
    /// `skip`: failed polls dropped.
    pub poll_failures_skipped: u64,
    /// Of those, with their CQ armed (its next event brings it back).
    pub poll_failures_skipped_armed: u64,
    /// `recreate-cq`: CQs re-created; of their predecessors, those the device kept.
    pub cq_recreated: u64,
    /// Old CQs the device would not destroy (the QP still used them).
    pub cq_kept_in_use: u64,
    /// Receive WRs that will never complete.
    pub recv_never_complete: u64,
    /// Send WRs that will never complete.
    pub send_never_complete: u64,
    /// Completions the failing polls swallowed.
    pub completions_lost: u64,
    /// WRs reaped by restarts.
    pub wr_reaped: u64,
    /// Receive WRs outstanding at the end, of the ring's size.
    pub recv_outstanding: u64,
    /// Receive ring size.
    pub recv_ring: u64,
    /// Send WRs outstanding at the end.
    pub send_outstanding: u64,
    /// Send ring size.
    pub send_ring: u64,
    /// CPU time the daemon used in the `during` window (ms).
    pub cpu_ms: Option<f64>,
    /// The same, in % of one CPU.
    pub cpu_pct: Option<f64>,
    /// The daemon's state at the end.
    pub state: String,
    /// The ledger's verdict in words.
    pub ledger: String,
    /// Every work request accounted for (both rings' residuals 0, every restart's
    /// ledger balanced).
    pub ledger_balanced: bool,
    /// Exit status after SIGTERM (`None`: killed, or not started).
    pub exit: Option<i32>,
    /// The signal that ended it, when one did.
    pub exit_signal: Option<i32>,
    /// It had not exited `STOP_TIMEOUT` after SIGTERM and was killed.
    pub stop_timed_out: bool,
    /// SIGTERM to exit (ms).
    pub exit_ms: Option<f64>,
    /// What the row shows, in one line.
    pub verdict: String,
    /// The scenario runner's own report of this run (its `series` holds the samples).
    pub run: Option<Report>,
    /// Its plot (an SVG file next to the JSON report), when one was written.
    pub plot: Option<String>,
}

impl PolicyRun {
    /// Work requests that will never complete, both rings.
    pub fn never_complete(&self) -> u64 {
        self.recv_never_complete + self.send_never_complete
    }

    /// Whether it recovered: running, traffic resumed, nothing left that never completes.
    pub fn recovered(&self) -> bool {
        self.error.is_none()
            && self.state == "running"
            && self.resumed_ms.is_some()
            && self.never_complete() == 0
    }
}

/// The whole comparison.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CompareReport {
    /// The scenario's name.
    pub scenario: String,
    /// Its file.
    pub file: String,
    /// What it does.
    pub description: String,
    /// The `during` window (ms).
    pub during_ms: u64,
    /// The `after` window (ms).
    pub after_ms: u64,
    /// One row per policy.
    pub runs: Vec<PolicyRun>,
    /// Every check held.
    pub passed: bool,
    /// What did not, one line each.
    pub failures: Vec<String>,
    /// When it started (ms since the Unix epoch).
    pub started_unix_ms: u64,
    /// How long it took (ms).
    pub elapsed_ms: u64,
}

#[derive(Clone, Copy, Debug)]
struct Sample {
    unix_ms: u64,
    rx_packets: u64,
    tx_packets: u64,
    bytes: u64,
    cpu_ticks: Option<u64>,
}

/// A thread reading the daemon's counters and CPU time.
struct Sampler {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    thread: Option<thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(client: Client, pid: u32) -> Sampler {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (s2, stop2) = (samples.clone(), stop.clone());
        let thread = thread::spawn(move || {
            while !stop2.load(Ordering::Relaxed) {
                let t = Instant::now();
                if let Ok(st) = client.stats() {
                    let s = Sample {
                        unix_ms: unix_ms(),
                        rx_packets: st.rx_packets,
                        tx_packets: st.tx_packets,
                        bytes: st.rx_bytes + st.tx_bytes,
                        cpu_ticks: cpu_ticks(pid),
                    };
                    s2.lock().unwrap_or_else(|e| e.into_inner()).push(s);
                }
                thread::sleep(SAMPLE_EVERY.saturating_sub(t.elapsed()));
            }
        });
        Sampler {
            samples,
            stop,
            thread: Some(thread),
        }
    }

    fn finish(mut self) -> Vec<Sample> {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        std::mem::take(&mut *self.samples.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

/// User plus system time of `pid`, all its threads (`/proc/PID/stat` fields 14 and 15).
fn cpu_ticks(pid: u32) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = s.rsplit_once(')')?;
    // After the command: state (field 3) ... utime is field 14, stime 15.
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// The sample at or just before `t`, and the one at or just after `t`.
fn at_or_before(s: &[Sample], t: u64) -> Option<&Sample> {
    s.iter().rev().find(|x| x.unix_ms <= t)
}

fn at_or_after(s: &[Sample], t: u64) -> Option<&Sample> {
    s.iter().find(|x| x.unix_ms >= t)
}

/// Mbit/s between the samples nearest `from` (at or after) and `to` (at or before).
fn rate(s: &[Sample], from: u64, to: u64) -> Option<f64> {
    let a = at_or_after(s, from)?;
    let b = at_or_before(s, to)?;
    let dt = b.unix_ms.checked_sub(a.unix_ms)?;
    if dt < 200 {
        return None;
    }
    Some(b.bytes.saturating_sub(a.bytes) as f64 * 8.0 / (dt as f64 / 1e3) / 1e6)
}

/// CPU time (ms) between the samples nearest `from` and `to`, and over how long.
fn cpu(s: &[Sample], from: u64, to: u64) -> Option<(f64, f64)> {
    let a = at_or_after(s, from)?;
    let b = at_or_before(s, to)?;
    let dt = b.unix_ms.checked_sub(a.unix_ms)?;
    if dt < 200 {
        return None;
    }
    let ticks = b.cpu_ticks?.checked_sub(a.cpu_ticks?)?;
    Some((ticks as f64 * 1e3 / USER_HZ, dt as f64))
}

/// When packets started moving both ways again after `since`: the start of the first two
/// sample intervals running, both after `since`, in which both the received and the sent
/// count grew (so traffic before `since` never counts; the resolution is the sampling
/// interval, 50 ms).
fn resumed(s: &[Sample], since: u64) -> Option<u64> {
    let start = s.iter().position(|x| x.unix_ms >= since)?;
    s[start..].windows(3).find_map(|w| {
        let moved =
            |a: &Sample, b: &Sample| b.rx_packets > a.rx_packets && b.tx_packets > a.tx_packets;
        (moved(&w[0], &w[1]) && moved(&w[1], &w[2])).then_some(w[0].unix_ms.max(since))
    })
}

impl CompareOptions {
    fn say(&self, msg: &str) {
        if !self.quiet {
            eprintln!("[compare] {}: {msg}", self.scenario.name);
        }
    }

    /// Play the scenario under every policy and compare.
    pub fn run(&self) -> CompareReport {
        let start = Instant::now();
        let spec = self.scenario.compare.clone().unwrap_or(CompareSpec {
            policies: PollFailurePolicy::ALL.to_vec(),
            during: Duration::from_secs(2),
            after: Duration::from_secs(3),
        });
        let mut rep = CompareReport {
            scenario: self.scenario.name.clone(),
            file: self.scenario.file.display().to_string(),
            description: self.scenario.description.clone(),
            during_ms: spec.during.as_millis() as u64,
            after_ms: spec.after.as_millis() as u64,
            started_unix_ms: unix_ms(),
            ..CompareReport::default()
        };
        if let Err(e) = std::fs::create_dir_all(&self.logs) {
            rep.failures
                .push(format!("cannot create {}: {e}", self.logs.display()));
        }
        for &p in &self.policies {
            self.say(&format!("policy {p}: starting a fresh daemon"));
            let run = self.one(p, &spec);
            self.say(&format!("policy {p}: {}", run.verdict));
            // A daemon that refused its arguments (exit 2) refuses them under every
            // policy: the others are not tried.
            let refused = run.pid.is_some() && run.run.is_none() && run.exit == Some(2);
            rep.runs.push(run);
            if refused {
                rep.failures.push(format!(
                    "the daemon refused its arguments (exit 2); the policies after {p} were not run"
                ));
                break;
            }
        }
        for r in &rep.runs {
            if let Some(e) = &r.error {
                rep.failures.push(format!("{}: {e}", r.policy));
                continue;
            }
            if !r.ledger_balanced {
                rep.failures.push(format!(
                    "{}: the ledger does not account for every work request ({})",
                    r.policy, r.ledger
                ));
            }
            if r.stop_timed_out {
                rep.failures.push(format!(
                    "{}: the daemon did not exit within {} s of SIGTERM (killed)",
                    r.policy,
                    STOP_TIMEOUT.as_secs()
                ));
            } else if let Some(sig) = r.exit_signal {
                rep.failures.push(format!(
                    "{}: the daemon was ended by signal {sig}",
                    r.policy
                ));
            }
            if r.policy == PollFailurePolicy::Restart.name() && !r.recovered() {
                rep.failures
                    .push(format!("restart did not recover: {}", r.verdict));
            }
            if r.policy == PollFailurePolicy::Restart.name() && r.exit != Some(0) {
                rep.failures.push(format!(
                    "restart: the daemon exited with {:?} on SIGTERM, not 0",
                    r.exit
                ));
            }
        }
        rep.passed = rep.failures.is_empty();
        rep.elapsed_ms = start.elapsed().as_millis() as u64;
        rep
    }

    /// The daemon's command line for `policy`.
    fn command(&self, policy: PollFailurePolicy) -> Command {
        let mut c = Command::new(&self.program);
        c.arg("up").args(&self.up_args).arg("--tap").arg(&self.tap);
        if let Some(ctl) = &self.control_flag {
            c.arg("--control").arg(ctl);
        }
        c.args(["--allow-faults", "--poll-failure-policy", policy.name()]);
        c
    }

    fn one(&self, policy: PollFailurePolicy, spec: &CompareSpec) -> PolicyRun {
        let log = self.logs.join(format!(
            "uipoib-{}-{}.log",
            self.scenario.name,
            policy.name()
        ));
        let mut row = PolicyRun {
            policy: policy.name().into(),
            log: log.display().to_string(),
            ..PolicyRun::default()
        };
        if let Ok((pid, st)) = kill::answering(&self.control) {
            row.error = Some(format!(
                "a daemon (pid {pid}, {}) already answers on {}: the comparison starts its own",
                st.state,
                self.control.display()
            ));
            row.verdict = "not run".into();
            return row;
        }
        let mut child = match self.spawn(policy, &log) {
            Ok(c) => c,
            Err(e) => {
                row.error = Some(e);
                row.verdict = "not run".into();
                return row;
            }
        };
        let pid = child.id();
        row.pid = Some(pid);
        if let Err(e) = self.wait_running(&mut child, policy, &log) {
            row.error = Some(e);
            row.verdict = "not run".into();
            self.stop(&mut child, &mut row);
            return row;
        }
        let client = Client {
            path: self.control.clone(),
        };
        let sampler = Sampler::start(client.clone(), pid);
        let mut runner = Runner::new(self.scenario.clone(), &self.control);
        if self.quiet {
            runner = runner.quiet();
        }
        let report = runner.run();
        // One housekeeping round (1 s) refreshes the never-completing gauges.
        thread::sleep(Duration::from_millis(1200));
        let stats = client.stats();
        let status = client.status();
        let faults = client.faults();
        let samples = sampler.finish();
        self.stop(&mut child, &mut row);
        let report = match report {
            Ok(r) => r,
            Err(e) => {
                row.error = Some(format!("the scenario did not run: {e}"));
                row.verdict = "not run".into();
                return row;
            }
        };
        let (stats, status) = match (stats, status) {
            (Ok(s), Ok(t)) => (s, t),
            (Err(e), _) | (_, Err(e)) => {
                row.error = Some(format!("reading the daemon after the run: {e}"));
                row.verdict = "not measured".into();
                row.run = Some(report);
                return row;
            }
        };
        if status.poll_failure_policy != policy.name() {
            row.error = Some(format!(
                "the daemon ran with policy {:?}, not {policy}",
                status.poll_failure_policy
            ));
        }
        row.completions_lost = faults
            .ok()
            .and_then(|v| v["completions_swallowed"].as_u64())
            .unwrap_or(0);
        self.measure(&mut row, &report, &stats, &status, &samples, spec);
        row.run = Some(report);
        row
    }

    fn spawn(&self, policy: PollFailurePolicy, log: &Path) -> Result<Child, String> {
        let out = File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
        let err = out
            .try_clone()
            .map_err(|e| format!("{}: {e}", log.display()))?;
        self.command(policy)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| format!("cannot start {}: {e}", self.program.display()))
    }

    fn wait_running(
        &self,
        child: &mut Child,
        policy: PollFailurePolicy,
        log: &Path,
    ) -> Result<(), String> {
        let end = Instant::now() + self.start_timeout;
        let pid = child.id();
        let mut last = String::from("no answer on the control socket");
        while Instant::now() < end {
            if let Ok(Some(st)) = child.try_wait() {
                return Err(format!(
                    "the daemon ({policy}) exited with {st} before it was running: {}",
                    kill::tail(log)
                ));
            }
            match kill::answering(&self.control) {
                Ok((p, st)) if p == pid && st.state == "running" => return Ok(()),
                Ok((p, st)) => last = format!("pid {p} answers {}", st.state),
                Err(e) => last = e.to_string(),
            }
            thread::sleep(Duration::from_millis(50));
        }
        Err(format!(
            "the daemon ({policy}) was not running within {} s ({last}): {}",
            self.start_timeout.as_secs(),
            kill::tail(log)
        ))
    }

    fn stop(&self, child: &mut Child, row: &mut PolicyRun) {
        let t = Instant::now();
        if let Ok(Some(st)) = child.try_wait() {
            // Exited (and reaped) already: its pid may be someone else's by now.
            row.exit = st.code();
            row.exit_signal = st.signal();
            return;
        }
        if let Err(e) = sys::kill_process(child.id(), libc::SIGTERM) {
            tracing::debug!(error = %e, "SIGTERM to the daemon");
        }
        while t.elapsed() < STOP_TIMEOUT {
            if let Ok(Some(st)) = child.try_wait() {
                row.exit = st.code();
                row.exit_signal = st.signal();
                row.exit_ms = Some(t.elapsed().as_secs_f64() * 1e3);
                return;
            }
            thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
        row.stop_timed_out = true;
    }

    fn measure(
        &self,
        row: &mut PolicyRun,
        report: &Report,
        stats: &Snapshot,
        status: &Status,
        samples: &[Sample],
        spec: &CompareSpec,
    ) {
        let history_balanced = status.history.iter().all(|h| h.ledger_balanced);
        let f = report.faults.first();
        row.injected_unix_ms = f.and_then(|f| f.injected_unix_ms);
        row.restarts = f.map_or(0, |f| f.restarts);
        row.causes = f.map(|f| f.causes.clone()).unwrap_or_default();
        row.recovery_ms = f.and_then(|f| f.recovery_ms);
        row.wr_reaped = f.map_or(0, |f| f.wr_reaped);
        row.iperf3_mbps = f.map(|f| f.iperf3_mbps.clone()).unwrap_or_default();
        row.poll_failures = stats.poll_failures;
        row.poll_retries = stats.poll_retries;
        row.poll_failures_skipped = stats.poll_failures_skipped;
        row.poll_failures_skipped_armed = stats.poll_failures_skipped_armed;
        row.cq_recreated = stats.cq_recreated;
        row.cq_kept_in_use = stats.cq_kept_in_use;
        row.recv_never_complete = stats.recv_never_complete;
        row.send_never_complete = stats.send_never_complete;
        row.recv_outstanding = stats.recv_outstanding;
        row.send_outstanding = stats.send_outstanding;
        row.recv_ring = stats.recv_ring;
        row.send_ring = stats.send_ring;
        row.state = status.state.clone();
        let res = stats.residuals();
        // The reading after the load stopped (counters and gauges settled), and every
        // restart's teardown (its reap checked the ledger). A reading taken under load
        // may be off by the receives handled since the gauges were last set: not used.
        let restarts_ok = history_balanced;
        row.ledger_balanced = res.balanced() && restarts_ok;
        row.ledger = if res.balanced() && restarts_ok {
            "balanced".into()
        } else if res.balanced() {
            "a restart's teardown found it NOT BALANCED".into()
        } else {
            format!(
                "NOT BALANCED (residual recv {}, send {})",
                res.recv, res.send
            )
        };
        // The steps' end: after it the load stops and the faults are cleared.
        let end = report.steps_ended_unix_ms;
        let Some(inj) = row.injected_unix_ms else {
            row.error
                .get_or_insert_with(|| "the fault never fired".into());
            row.verdict = "the fault never fired".into();
            return;
        };
        let during = spec.during.as_millis() as u64;
        row.mbps = Throughput {
            before: rate(samples, inj.saturating_sub(BEFORE.as_millis() as u64), inj),
            during: rate(samples, inj, inj + during),
            after: rate(
                samples,
                end.saturating_sub(spec.after.as_millis() as u64),
                end,
            ),
        };
        // Resumption counts after the last restart's recovery.
        let since = f
            .and_then(|f| {
                f.detected_unix_ms
                    .zip(f.recovery_ms)
                    .map(|(d, r)| d + r.ceil() as u64)
            })
            .unwrap_or(inj)
            .max(inj);
        row.resumed_ms = resumed(samples, since)
            .filter(|t| *t <= end)
            .map(|t| t.saturating_sub(inj) as f64);
        if let Some((ms, over)) = cpu(samples, inj, inj + during) {
            row.cpu_ms = Some(ms);
            row.cpu_pct = Some(ms / over * 100.0);
        }
        row.verdict = verdict(row);
    }
}

/// `a, a, a, b` as `a ×3, b`.
fn runs_of(causes: &[String]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < causes.len() {
        let n = causes[i..].iter().take_while(|c| **c == causes[i]).count();
        out.push(if n == 1 {
            causes[i].clone()
        } else {
            format!("{} ×{n}", causes[i])
        });
        i += n;
    }
    out.join(", ")
}

/// What a row shows, in words, from its numbers.
fn verdict(r: &PolicyRun) -> String {
    let mut parts: Vec<String> = Vec::new();
    let restarted = if r.restarts > 0 {
        format!(
            "{} restart{} ({})",
            r.restarts,
            if r.restarts == 1 { "" } else { "s" },
            runs_of(&r.causes)
        )
    } else {
        "no restart".into()
    };
    let busy = r.cpu_pct.is_some_and(|p| p >= 50.0);
    match r.resumed_ms {
        Some(ms) if r.never_complete() == 0 => parts.push(format!(
            "recovered: {restarted}, traffic back {ms:.0} ms after the fault"
        )),
        Some(ms) => parts.push(format!(
            "carried on leaking: {restarted}, traffic back {ms:.0} ms after the fault"
        )),
        None if busy => parts.push(format!("busy: {restarted}, traffic never resumed")),
        None => parts.push(format!("wedged: {restarted}, traffic never resumed")),
    }
    if r.never_complete() > 0 {
        parts.push(format!(
            "{} receive and {} send WRs will never complete (receive ring {}/{} outstanding)",
            r.recv_never_complete, r.send_never_complete, r.recv_outstanding, r.recv_ring
        ));
    }
    if r.completions_lost > 0 {
        parts.push(format!(
            "{} completions swallowed by the failing polls",
            r.completions_lost
        ));
    }
    if let Some(p) = r.cpu_pct {
        parts.push(format!("CPU {p:.0}% of one core during the fault"));
    }
    if r.poll_failures_skipped > 0 {
        let armed = r.poll_failures_skipped_armed;
        parts.push(format!(
            "{} failed poll{} dropped, {armed} of them while the CQ was armed (its next event polls it again; an unarmed one is never polled again)",
            r.poll_failures_skipped,
            if r.poll_failures_skipped == 1 { "" } else { "s" },
        ));
    }
    if r.poll_retries > 0 {
        parts.push(format!("{} failed polls retried", r.poll_retries));
    }
    if r.cq_kept_in_use > 0 {
        parts.push(format!(
            "{} old CQ{} kept: the device refused to destroy a CQ its QP still uses",
            r.cq_kept_in_use,
            if r.cq_kept_in_use == 1 { "" } else { "s" }
        ));
    }
    if r.state != "running" {
        parts.push(format!("ended {}", r.state));
    }
    if !r.ledger_balanced {
        parts.push(format!("ledger {}", r.ledger));
    }
    parts.join("; ")
}

fn opt(v: Option<f64>, unit: &str) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.0}{unit}"))
}

impl CompareReport {
    /// The table, and a line per row saying what it shows.
    pub fn to_text(&self) -> String {
        let mut t = String::new();
        let _ = writeln!(
            t,
            "poll-failure policies compared: {} ({})",
            self.scenario, self.file
        );
        if !self.description.is_empty() {
            let _ = writeln!(t, "  {}", self.description);
        }
        let _ = writeln!(
            t,
            "  Mbit/s through the interface: 3 s before the fault / {} ms from it / the last {} ms",
            self.during_ms, self.after_ms
        );
        let _ = writeln!(
            t,
            "{:<12} {:>17} {:>9} {:>8} {:>11} {:>5} {:>9} {:>8}  {:<8} ledger",
            "policy",
            "Mbit/s b/d/a",
            "resumed",
            "restarts",
            "never-compl",
            "lost",
            "CPU",
            "rx usable",
            "state",
        );
        for r in &self.runs {
            if r.error.is_some() && r.run.is_none() {
                let _ = writeln!(
                    t,
                    "{:<12} not run: {}",
                    r.policy,
                    r.error.as_deref().unwrap_or("")
                );
                continue;
            }
            let f = |v: Option<f64>| v.map_or_else(|| "-".into(), |v| format!("{v:.0}"));
            let _ = writeln!(
                t,
                "{:<12} {:>17} {:>9} {:>8} {:>11} {:>5} {:>9} {:>8}  {:<8} {}",
                r.policy,
                format!(
                    "{}/{}/{}",
                    f(r.mbps.before),
                    f(r.mbps.during),
                    f(r.mbps.after)
                ),
                r.resumed_ms
                    .map_or_else(|| "never".into(), |v| format!("{v:.0} ms")),
                r.restarts,
                format!("{}+{}", r.recv_never_complete, r.send_never_complete),
                r.completions_lost,
                match (r.cpu_ms, r.cpu_pct) {
                    (Some(ms), Some(p)) => format!("{ms:.0}ms {p:.0}%"),
                    _ => "-".into(),
                },
                format!(
                    "{}/{}",
                    r.recv_ring.saturating_sub(r.recv_never_complete),
                    r.recv_ring
                ),
                r.state,
                if r.ledger_balanced {
                    "balanced"
                } else {
                    "NOT BALANCED"
                }
            );
        }
        let _ = writeln!(t);
        for r in &self.runs {
            let _ = writeln!(t, "{:<12} {}", r.policy, r.verdict);
        }
        let plots: Vec<&str> = self.runs.iter().filter_map(|r| r.plot.as_deref()).collect();
        if !plots.is_empty() {
            let _ = writeln!(t, "  plots: {}", plots.join(" "));
        }
        let _ = writeln!(
            t,
            "  never-compl: receive+send WRs whose completion will never be seen; lost: completions the failing polls swallowed; CPU: the daemon's, in the {} ms from the fault; rx usable: receive slots that can still complete, of the ring; recovery (restart, the slowest, backoff included) {}",
            self.during_ms,
            self.runs
                .iter()
                .find(|r| r.policy == "restart")
                .map_or_else(|| "-".into(), |r| opt(r.recovery_ms, " ms"))
        );
        if self.passed {
            let _ = writeln!(t, "PASSED: every ledger balanced; restart recovered");
        } else {
            let _ = writeln!(t, "FAILED:");
            for x in &self.failures {
                let _ = writeln!(t, "  {x}");
            }
        }
        t
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(t: u64, rx: u64, tx: u64, bytes: u64, cpu: u64) -> Sample {
        Sample {
            unix_ms: t,
            rx_packets: rx,
            tx_packets: tx,
            bytes,
            cpu_ticks: Some(cpu),
        }
    }

    #[test]
    fn resumption_needs_both_ways_twice() {
        // Sends go on (retransmits) but nothing is received: never.
        let wedged: Vec<Sample> = (0..20).map(|i| s(i * 50, 10, 10 + i, 0, 0)).collect();
        assert_eq!(resumed(&wedged, 0), None);
        // One stray packet each way is not a resumption; two samples running are.
        let mut v = vec![s(0, 1, 1, 0, 0), s(50, 2, 2, 0, 0), s(100, 2, 2, 0, 0)];
        v.extend((3..12).map(|i| s(i * 50, i, i, 0, 0)));
        assert_eq!(resumed(&v, 0), Some(100));
        // Moving all along: back at the first sample after `since`; the interval that
        // holds `since` is not counted (it holds traffic from before it).
        assert_eq!(resumed(&v, 400), Some(400));
        assert_eq!(resumed(&v, 420), Some(450));
        // Traffic only before `since`: never.
        let stopped: Vec<Sample> = (0..20)
            .map(|i| s(i * 50, i.min(5), i.min(5), 0, 0))
            .collect();
        assert_eq!(resumed(&stopped, 230), None);
    }

    #[test]
    fn rates_and_cpu_between_samples() {
        let v: Vec<Sample> = (0..=20)
            .map(|i| s(i * 100, i, i, i * 125_000, i * 5))
            .collect();
        // 125 kB per 100 ms = 10 Mbit/s.
        let r = rate(&v, 0, 2000).unwrap();
        assert!((r - 10.0).abs() < 1e-9, "{r}");
        // 5 ticks (50 ms) per 100 ms: 50% of one CPU.
        let (ms, over) = cpu(&v, 500, 1500).unwrap();
        assert_eq!((ms, over), (500.0, 1000.0));
        // Too short a window says nothing.
        assert_eq!(rate(&v, 1000, 1100), None);
    }

    #[test]
    fn causes_in_runs() {
        let c = |v: &[&str]| runs_of(&v.iter().map(|s| s.to_string()).collect::<Vec<_>>());
        assert_eq!(c(&[]), "");
        assert_eq!(c(&["poll-failed"; 9]), "poll-failed ×9");
        assert_eq!(
            c(&["poll-failed", "poll-failed", "tx-stall", "poll-failed"]),
            "poll-failed ×2, tx-stall, poll-failed"
        );
    }

    #[test]
    fn verdicts_follow_the_numbers() {
        let mut r = PolicyRun {
            policy: "restart".into(),
            state: "running".into(),
            restarts: 1,
            causes: vec!["poll-failed".into()],
            resumed_ms: Some(60.0),
            ledger_balanced: true,
            ledger: "balanced".into(),
            ..PolicyRun::default()
        };
        assert!(r.recovered());
        assert!(verdict(&r).starts_with("recovered: 1 restart (poll-failed)"));
        r.recv_never_complete = 64;
        r.completions_lost = 64;
        assert!(!r.recovered());
        let v = verdict(&r);
        assert!(v.starts_with("carried on leaking"), "{v}");
        assert!(
            v.contains("64 receive and 0 send WRs will never complete"),
            "{v}"
        );
        r.resumed_ms = None;
        r.cpu_pct = Some(99.0);
        assert!(verdict(&r).starts_with("busy"));
        r.cpu_pct = Some(1.0);
        assert!(verdict(&r).starts_with("wedged"));
    }
}
