//! Fault scenarios: TOML files (under `config/faults/`) that script a fault-injection run
//! against a live daemon, and the runner that plays them (`uipoib fault run FILE`).
//!
//! A scenario is a list of steps played in order (the whole list `repeat` times):
//!
//! ```toml
//! name = "poll-error"
//! description = "One failed ibv_poll_cq under iperf3 TCP load."
//!
//! [vars]                      # defaults; `--var NAME=VALUE` overrides them
//! peer = "198.18.1.1"
//!
//! [traffic]                   # background load, started before the first step
//! command = "iperf3 -c ${peer} -t 600 -i 1 --forceflush"
//!
//! [[step]]
//! do = "wait"
//! ms = 3000
//!
//! [[step]]
//! do = "inject"               # the rest is what `uipoib fault inject` takes
//! fault = "poll-error"
//! after = 100
//!
//! [[step]]
//! do = "expect"
//! restarts = 1
//! cause = "poll-failed"
//! recovered_within_ms = 200
//! ledger_balanced = true
//! drops_only = ["reaped", "tx_flushed"]
//! traffic_running = true
//! ```
//!
//! Steps (`do = ...`): `wait` (`ms`), `inject` (a fault, as the control socket takes
//! it, plus an optional `label`), `clear`, `restart` (an operator restart), `exec` (a
//! command, e.g. `rdma link delete ${device}`; with `fault = "NAME"` it opens a fault
//! record of its own), `storm` (`count` faults spread over `duration_ms`, drawn with
//! `seed` from the weighted `faults` table), `kill` (below) and `expect` (see
//! [`Expect`]). Every `inject`, `restart`, `storm`, `kill` and fault-naming `exec` opens
//! a *fault record*; an `expect` checks the record opened last.
//!
//! ## Comparing the poll-failure policies
//!
//! `uipoib fault compare FILE --tap TAP -- UP_ARGS` plays the same file once per
//! poll-failure policy, each time against a daemon it starts fresh (see
//! [`CompareOptions`]). An optional table says which policies and the windows measured:
//!
//! ```toml
//! [compare]
//! policies = ["restart", "skip", "retry", "recreate-cq"]   # the default: all four
//! during_ms = 2000            # the "during" window, from the fault's first hit
//! after_ms = 3000             # the "after" window, ending with the steps
//! ```
//!
//! The shipped ones are in `config/compare/`.
//!
//! ## Killing the daemon
//!
//! ```toml
//! [[step]]
//! do = "kill"
//! signal = "KILL"             # KILL, TERM, INT, QUIT, HUP or ABRT (SIG prefix allowed)
//! restart = true              # required: the daemon is started again
//! timeout_ms = 30000          # for the old one to exit, then for the new one (default 30 s)
//! log = "${out}/uipoib.2.log" # the new daemon's stdout and stderr (default: a file in
//!                             # the temporary directory named after the killed pid)
//! ```
//!
//! The daemon is the process listening on the control socket (a client's `SO_PEERCRED`
//! names it). Its command line, environment and working directory are read from
//! `/proc/PID`; it gets the signal; once it has exited (gone, or a zombie) and its TAP
//! has gone (when it is in the runner's network namespace) the same command line is
//! started in the same directory with the same environment, detached (stdin from
//! /dev/null, a process group of its own: it outlives the runner; it runs in the
//! runner's namespaces, so the runner belongs where the daemon ran). The step
//! waits until the new pid answers `running` on the control socket (the daemon serves
//! it only once its interface is up). It fails, saying which, if the daemon cannot be
//! found, does not exit within `timeout_ms`, the new one exits first, or does not
//! answer `running` within `timeout_ms`; the failure is the record's first
//! expectation, and the run goes on.
//!
//! A kill's record starts fresh, because the new daemon's counters, restart history and
//! fault switch do: its start counters are zeros and every restart of the new daemon
//! counts as one since the fault (a fresh daemon has none: `restarts = 0` holds). The
//! injection time is the signal's; there is no detection (`detected_within_ms` is
//! refused after a kill); `recovered_within_ms` bounds the time from the signal to the
//! new daemon's interface up (its `interface up` log line, or else its first `running`
//! answer); `resumed_within_ms` counts from the signal to data moving through the new
//! daemon; `ledger_balanced` wants the new daemon's counters to balance; `new_daemon =
//! true` wants the process answering to be the one started (another pid, the same
//! command line). Counter samples carry the daemon they came from, so that no rate or
//! resumption is computed across the two daemons' counters.
//!
//! ## The report (`--json FILE`)
//!
//! One object ([`Report`]); the checks each field serves are computed here only, and
//! the lab's reports read them rather than computing them again:
//! - `passed`, `failures` (one line each), `checks` (the run as a whole);
//! - `at_rest`: `state`, `ledger_residuals` {`recv`, `send`}, `ledger_balanced`: the
//!   daemon after the load stopped (waited for up to 10 s);
//! - `iperf3` (when the load printed iperf3 interval lines): `intervals`,
//!   `baseline_bytes` (median interval before the first fault, the first interval left
//!   out), `zero_limit_bytes` (1% of it: below, an interval is ~0 bytes),
//!   `longest_gap_outside_faults_ms` and `_at_ms` (from the first interval);
//! - `traffic`: `command`, `running_at_end`, `exit`, `tail`;
//! - `faults[]`, one per record ([`FaultReport`]): `index`, `iteration`, `line`,
//!   `fault`, `label`; `injected_unix_ms`, `detected_unix_ms`, `resumed_unix_ms`,
//!   `detect_ms`, `resume_ms` (from the injection); `recovery_ms` (the slowest restart's
//!   detection to running, or a kill's signal to interface up); `restarts`, `causes`,
//!   `wr_reaped`, `sends_reaped`, `flushed`, `failed_attempts` (summed over the
//!   restarts); `fired`, `storm`, `drops`, `stale_completions`; `ledger_balanced`
//!   (every restart's ledger balanced and a live reading did) and `ledger_residuals`
//!   {`recv`, `send`} (the last live reading); `throughput_mbps` and `iperf3_mbps`
//!   {`before`, `during`, `after`}; `iperf3` ([`Iperf3Window`]: `window_ms`,
//!   `gap_ms`, `gap_from_ms`, `gap_to_ms`, `back_ms`, `min_pct`, `bytes_after`,
//!   `intervals_after`, `mbps_after`, offsets from the injection); for a kill, `daemon`
//!   ([`DaemonRestart`]: `signal`, `old_pid`, `new_pid`, `argv`, `cwd`, `log`,
//!   `killed_unix_ms`, `exited_unix_ms`, `started_unix_ms`, `up_unix_ms`,
//!   `log_up_unix_ms`, `exit_ms`, `tap_gone_ms`, `up_ms`, `log_up_ms`, `error`); `expectations[]`
//!   {`what`, `ok`, `detail`} and `passed`.
//!
//! - `series` ([`Series`]): `every_ms`, `cap`, `dropped` (the oldest samples past the
//!   cap), `samples[]` ([`SeriesSample`]: `unix_ms`, `t_ms`, `daemon`, `rx_bytes`,
//!   `tx_bytes`, `rx_packets`, `tx_packets`, `restarts`, `state`), `iperf3[]`
//!   ([`SeriesInterval`], empty when the load is not iperf3), `iperf3_dropped`; and per
//!   fault `opened_unix_ms`, `closed_unix_ms` and `plot` (see [`write_run_plots`]).
//!
//! The ledger's residuals are posted - completed - flushed - reaped - outstanding per
//! ring, from `uipoib stats`; both 0 is a balanced ledger. The iperf3 figures come from
//! the load's own interval lines (the sender's, unless the load runs `iperf3 -R`), each
//! placed on the wall clock from when it was read.
//!
//! Loading refuses anything it does not understand and says where: the file, the line
//! and the field that is wrong (an unknown step or key, a value of the wrong type or out
//! of range, an undefined `${variable}`, a fault option the fault does not take).

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use crate::verbs::fault::FaultSpec;

mod compare;
mod expect;
mod fields;
mod gaps;
mod kill;
mod parse;
mod plot;
mod record;
mod report;
mod run;
mod series;
mod steps;
mod traffic;

pub use compare::{CompareOptions, CompareReport, PolicyRun};
pub use parse::{counter_names, parse_policies, substitute};
pub use plot::{compare_plot_name, run_plot_name, write_compare_plots, write_run_plots};
pub use report::{
    AtRest, DaemonRestart, FaultReport, Iperf3Session, Iperf3Window, Outcome, Report, Throughput,
    TrafficReport,
};
pub use run::{RunError, Runner};
pub use series::{Series, SeriesInterval, SeriesSample};
pub use traffic::{MAX_SAMPLES, iperf3_interval_mbps};

/// Longest a scenario may repeat itself.
pub const MAX_REPEAT: u64 = 1000;
/// Longest single wait, timeout or window a step may name (ms): an hour.
pub const MAX_MS: u64 = 3_600_000;
/// Most faults a storm may inject.
pub const MAX_STORM: u64 = 100_000;

/// A scenario file that cannot be used: where and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ScenarioError {
    /// The file.
    pub file: PathBuf,
    /// 1-based line (0 when the file could not be read).
    pub line: usize,
    /// The field that is wrong (dotted, e.g. `step[3].after`), empty when not one field.
    pub field: String,
    /// What is wrong.
    pub why: String,
}

impl fmt::Display for ScenarioError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.file.display())?;
        if self.line > 0 {
            write!(f, ":{}", self.line)?;
        }
        if !self.field.is_empty() {
            write!(f, ": {}", self.field)?;
        }
        write!(f, ": {}", self.why)
    }
}

impl std::error::Error for ScenarioError {}

/// A loaded scenario, its variables substituted.
#[derive(Debug, Clone)]
pub struct Scenario {
    /// Its name (the file stem unless given).
    pub name: String,
    /// What it does, for the report.
    pub description: String,
    /// Where it came from.
    pub file: PathBuf,
    /// How many times the steps run.
    pub repeat: u64,
    /// The variables (defaults merged with the overrides).
    pub vars: BTreeMap<String, String>,
    /// The background load.
    pub traffic: Option<Traffic>,
    /// The steps.
    pub steps: Vec<Step>,
    /// How `uipoib fault compare` plays it, when the file says (`[compare]`).
    pub compare: Option<CompareSpec>,
}

/// A scenario's `[compare]` table: the poll-failure policies to play it under, one
/// fresh daemon each, and the windows the comparison measures.
#[derive(Debug, Clone, PartialEq)]
pub struct CompareSpec {
    /// The policies, in order (`policies`; default: all four).
    pub policies: Vec<crate::iface::PollFailurePolicy>,
    /// The "during" window, from the injection (`during_ms`, default 2000).
    pub during: Duration,
    /// The "after" window, ending when the steps end (`after_ms`, default 3000).
    pub after: Duration,
}

/// The background load of a scenario.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// The command.
    pub command: Program,
    /// How long to wait for the load to move data before the first step (ms).
    pub warmup: Duration,
}

/// A command to run: a program and its arguments, or a shell line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Program {
    /// Run directly.
    Argv(Vec<String>),
    /// Run with `sh -c`.
    Shell(String),
}

impl fmt::Display for Program {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Program::Argv(a) => write!(f, "{}", a.join(" ")),
            Program::Shell(s) => write!(f, "{s}"),
        }
    }
}

/// One step and the line it starts on.
#[derive(Debug, Clone)]
pub struct Step {
    /// 1-based line of its `[[step]]` header.
    pub line: usize,
    /// What it does.
    pub action: Action,
}

/// What a step does.
#[derive(Debug, Clone)]
pub enum Action {
    /// Sleep.
    Wait(Duration),
    /// Arm a fault.
    Inject {
        /// The fault.
        spec: FaultSpec,
        /// The report's name for it.
        label: String,
    },
    /// Disarm every fault.
    Clear,
    /// Ask for an operator restart.
    Restart {
        /// The report's name for it.
        label: String,
    },
    /// Run a command.
    Exec {
        /// The command.
        command: Program,
        /// Killed (and failed) after this long.
        timeout: Duration,
        /// When set, the command is a fault of this name (it opens a record).
        fault: Option<String>,
        /// The command must finish within this long.
        within: Option<Duration>,
        /// A non-zero exit is only noted, not a failure.
        may_fail: bool,
    },
    /// Many faults, spread over a time.
    Storm(Storm),
    /// Kill the daemon with a signal and start it again the way it was started.
    Kill(Kill),
    /// Check the newest fault record.
    Expect(Box<Expect>),
}

/// A storm: `count` faults spread evenly over `duration`, each drawn from `mix` by
/// weight with a generator seeded by `seed` (the same seed, the same sequence).
#[derive(Debug, Clone)]
pub struct Storm {
    /// How many faults.
    pub count: u64,
    /// Over how long.
    pub duration: Duration,
    /// The generator's seed.
    pub seed: u64,
    /// The faults and their weights.
    pub mix: Vec<(FaultSpec, u64)>,
    /// The report's name for it.
    pub label: String,
}

/// A `kill` step: the daemon behind the control socket gets `signal`; once it has
/// exited, it is started again with the command line, environment and working
/// directory it had, its output going to `log`.
#[derive(Debug, Clone)]
pub struct Kill {
    /// The signal's number (`libc::SIGKILL`, ...).
    pub signal: i32,
    /// Its name without `SIG` (`KILL`), for the report.
    pub signal_name: String,
    /// How long the old daemon may take to exit, and then the new one to answer
    /// `running` on the control socket (each).
    pub timeout: Duration,
    /// Where the new daemon's stdout and stderr go; `None`: a file in the temporary
    /// directory named after the killed pid.
    pub log: Option<PathBuf>,
    /// The report's name for it.
    pub label: String,
}

/// The signals a `kill` step may send, by name.
pub const SIGNALS: [(&str, i32); 6] = [
    ("KILL", libc::SIGKILL),
    ("TERM", libc::SIGTERM),
    ("INT", libc::SIGINT),
    ("QUIT", libc::SIGQUIT),
    ("HUP", libc::SIGHUP),
    ("ABRT", libc::SIGABRT),
];

/// What an `expect` step checks, against the newest fault record. Conditions that take
/// time (`state`, `restarts`, `traffic_running`, ...) are waited for up to `within`.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// How long to wait for the conditions to hold.
    pub within: Duration,
    /// The supervisor's state (`running`, `dead`, ...).
    pub state: Option<String>,
    /// Exactly this many restarts since the fault.
    pub restarts: Option<u64>,
    /// At least this many restarts since the fault.
    pub restarts_at_least: Option<u64>,
    /// Every restart since the fault has one of these causes.
    pub cause: Option<Vec<String>>,
    /// The restarts since the fault failed to open the device at least this many times
    /// in all (the device was away meanwhile).
    pub failed_attempts_at_least: Option<u64>,
    /// Every restart since the fault recovered within this (ms).
    pub recovered_within_ms: Option<f64>,
    /// The fault was detected within this of its injection (ms).
    pub detected_within_ms: Option<u64>,
    /// Traffic moved again within this of the detection (ms).
    pub resumed_within_ms: Option<u64>,
    /// Every restart's ledger balanced and the live counters balance.
    pub ledger_balanced: Option<bool>,
    /// No completion from an old epoch (or unknown, or duplicate) reached the poller.
    pub no_stale_completions: Option<bool>,
    /// Packets dropped since the fault only with these reasons.
    pub drops_only: Option<Vec<String>>,
    /// These counters (`spurious_events`, `drops.tx_post_failed`, ...) rose.
    pub rising: Vec<String>,
    /// The fault fired at least once (`true`) or never (`false`).
    pub fired: Option<bool>,
    /// The background load still runs and moved data after the fault.
    pub traffic_running: Option<bool>,
    /// The interface's rate over the last [`RATE_RESTORED_WINDOW`] is at least this
    /// fraction of its rate in the window before the run's first fault that had one above
    /// zero (this fault's, when it is the first; waited for up to `within`): what a user sees,
    /// not only that some data moved. A later fault's own window may hold no traffic (a
    /// revival after the interface was dead), which would make any rate pass.
    pub rate_restored: Option<f64>,
    /// After a `kill`: a new daemon (another pid, the same command line) answers on the
    /// control socket.
    pub new_daemon: Option<bool>,
    /// The load's iperf3 intervals after the fault's longest ~0-byte stretch hold bytes:
    /// `true` waits (up to `within`) for such an interval, since TCP's backed-off
    /// retransmission timer may take seconds more than the daemon to come back; the
    /// verdict is taken when the load has stopped, since later intervals count.
    pub iperf3_resumed: Option<bool>,
}

/// The trailing window over which `rate_restored` measures the rate now.
pub const RATE_RESTORED_WINDOW: Duration = Duration::from_secs(2);

#[cfg(test)]
mod tests;
