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
//! `seed` from the weighted `faults` table) and `expect` (see [`Expect`]). Every
//! `inject`, `restart`, `storm` and fault-naming `exec` opens a *fault record*; an
//! `expect` checks the record opened last.
//!
//! Loading refuses anything it does not understand and says where: the file, the line
//! and the field that is wrong (an unknown step or key, a value of the wrong type or out
//! of range, an undefined `${variable}`, a fault option the fault does not take).

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{Map, Value};
use toml::Spanned;

use crate::iface::stats::{DropReason, Snapshot};
use crate::verbs::fault::{FaultKind, FaultSpec};

mod report;
mod run;

pub use report::{FaultReport, Outcome, Report, Throughput};
pub use run::{RunError, Runner};

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
}

/// The background load of a scenario.
#[derive(Debug, Clone)]
pub struct Traffic {
    /// The command.
    pub command: Command,
    /// How long to wait for the load to move data before the first step (ms).
    pub warmup: Duration,
}

/// A command to run: a program and its arguments, or a shell line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    /// Run directly.
    Argv(Vec<String>),
    /// Run with `sh -c`.
    Shell(String),
}

impl fmt::Display for Command {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Command::Argv(a) => write!(f, "{}", a.join(" ")),
            Command::Shell(s) => write!(f, "{s}"),
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
        command: Command,
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
    /// fraction of its rate in the window before the fault (waited for up to `within`):
    /// what a user sees, not only that some data moved.
    pub rate_restored: Option<f64>,
}

/// The trailing window over which `rate_restored` measures the rate now.
pub const RATE_RESTORED_WINDOW: Duration = Duration::from_secs(2);

impl Scenario {
    /// Load and check `path`, with `overrides` replacing the file's variables.
    pub fn load(path: &Path, overrides: &BTreeMap<String, String>) -> Result<Self, ScenarioError> {
        let text = std::fs::read_to_string(path).map_err(|e| ScenarioError {
            file: path.to_owned(),
            line: 0,
            field: String::new(),
            why: format!("cannot read: {e}"),
        })?;
        Self::parse(path, &text, overrides)
    }

    /// Check `text` as the scenario file `path`.
    pub fn parse(
        path: &Path,
        text: &str,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Self, ScenarioError> {
        let p = Parser { path, text };
        let raw: RawScenario = toml::from_str(text).map_err(|e| ScenarioError {
            file: path.to_owned(),
            line: e.span().map_or(0, |s| p.line(s.start)),
            field: String::new(),
            why: e.message().trim().to_string(),
        })?;
        p.scenario(raw, overrides)
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    name: Option<Spanned<String>>,
    description: Option<String>,
    repeat: Option<Spanned<i64>>,
    #[serde(default)]
    vars: BTreeMap<String, Spanned<toml::Value>>,
    traffic: Option<Spanned<RawTable>>,
    #[serde(default)]
    step: Vec<Spanned<RawTable>>,
}

type RawTable = BTreeMap<String, Spanned<toml::Value>>;

struct Parser<'a> {
    path: &'a Path,
    text: &'a str,
}

/// The keys each step takes besides `do`.
const STEP_KEYS: [(&str, &[&str]); 7] = [
    ("wait", &["ms"]),
    ("inject", &["label"]), // plus the fault's own fields
    ("clear", &[]),
    ("restart", &["label"]),
    (
        "exec",
        &["command", "timeout_ms", "fault", "within_ms", "may_fail"],
    ),
    (
        "storm",
        &["count", "duration_ms", "seed", "faults", "label"],
    ),
    (
        "expect",
        &[
            "within_ms",
            "state",
            "restarts",
            "restarts_at_least",
            "cause",
            "recovered_within_ms",
            "detected_within_ms",
            "resumed_within_ms",
            "ledger_balanced",
            "no_stale_completions",
            "drops_only",
            "rising",
            "fired",
            "traffic_running",
            "rate_restored",
        ],
    ),
];

/// States the supervisor reports.
const STATES: [&str; 6] = [
    "running",
    "restarting",
    "waiting-for-device",
    "dead",
    "stopping",
    "stopped",
];

/// Restart causes the supervisor records.
const CAUSES: [&str; 10] = [
    "poll-failed",
    "verbs-error",
    "device-removed",
    "device-fatal",
    "async-fatal",
    "poller-io",
    "tx-stall",
    "operator",
    "qp-error",
    "revived",
];

impl Parser<'_> {
    fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }

    fn err(&self, span: std::ops::Range<usize>, field: String, why: String) -> ScenarioError {
        ScenarioError {
            file: self.path.to_owned(),
            line: self.line(span.start),
            field,
            why,
        }
    }

    fn scenario(
        &self,
        raw: RawScenario,
        overrides: &BTreeMap<String, String>,
    ) -> Result<Scenario, ScenarioError> {
        let name = match &raw.name {
            Some(n) if n.get_ref().trim().is_empty() => {
                return Err(self.err(n.span(), "name".into(), "must not be empty".into()));
            }
            Some(n) => n.get_ref().clone(),
            None => self
                .path
                .file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "scenario".into()),
        };
        let repeat = match &raw.repeat {
            None => 1,
            Some(r) => match u64::try_from(*r.get_ref()) {
                Ok(n) if (1..=MAX_REPEAT).contains(&n) => n,
                _ => {
                    return Err(self.err(
                        r.span(),
                        "repeat".into(),
                        format!("must be 1..={MAX_REPEAT}, not {}", r.get_ref()),
                    ));
                }
            },
        };
        let mut vars = BTreeMap::new();
        for (k, v) in &raw.vars {
            let s = match v.get_ref() {
                toml::Value::String(s) => s.clone(),
                toml::Value::Integer(i) => i.to_string(),
                toml::Value::Float(f) => f.to_string(),
                toml::Value::Boolean(b) => b.to_string(),
                other => {
                    return Err(self.err(
                        v.span(),
                        format!("vars.{k}"),
                        format!("must be a string or a number, not {}", other.type_str()),
                    ));
                }
            };
            vars.insert(k.clone(), s);
        }
        for (k, v) in overrides {
            vars.insert(k.clone(), v.clone());
        }
        let traffic = match &raw.traffic {
            None => None,
            Some(t) => Some(self.traffic(t, &vars)?),
        };
        if raw.step.is_empty() {
            return Err(ScenarioError {
                file: self.path.to_owned(),
                line: 0,
                field: "step".into(),
                why: "no steps: add at least one [[step]]".into(),
            });
        }
        let mut steps = Vec::with_capacity(raw.step.len());
        let mut opened = false;
        for (i, s) in raw.step.iter().enumerate() {
            let step = self.step(i + 1, s, &vars)?;
            match &step.action {
                Action::Inject { .. }
                | Action::Restart { .. }
                | Action::Storm(_)
                | Action::Exec { fault: Some(_), .. } => opened = true,
                Action::Expect(_) if !opened => {
                    return Err(self.err(
                        s.span(),
                        format!("step[{}]", i + 1),
                        "an expect needs a fault before it (inject, restart, storm, or exec with fault = ...)".into(),
                    ));
                }
                _ => {}
            }
            steps.push(step);
        }
        if traffic.is_none()
            && let Some(s) = steps
                .iter()
                .find(|s| matches!(&s.action, Action::Expect(e) if e.traffic_running.is_some() || e.rate_restored.is_some()))
        {
            let field = match &s.action {
                Action::Expect(e) if e.traffic_running.is_none() => "rate_restored",
                _ => "traffic_running",
            };
            return Err(ScenarioError {
                file: self.path.to_owned(),
                line: s.line,
                field: field.into(),
                why: "needs a [traffic] section (the load it measures)".into(),
            });
        }
        Ok(Scenario {
            name,
            description: raw.description.unwrap_or_default(),
            file: self.path.to_owned(),
            repeat,
            vars,
            traffic,
            steps,
        })
    }

    fn traffic(
        &self,
        t: &Spanned<RawTable>,
        vars: &BTreeMap<String, String>,
    ) -> Result<Traffic, ScenarioError> {
        let f = Fields {
            p: self,
            table: t.get_ref(),
            span: t.span(),
            prefix: "traffic".into(),
        };
        f.only(&["command", "warmup_ms"])?;
        let command = f
            .command("command", vars)?
            .ok_or_else(|| f.missing("command", "the load to run, e.g. an iperf3 client"))?;
        let warmup = Duration::from_millis(f.ms("warmup_ms")?.unwrap_or(10_000));
        Ok(Traffic { command, warmup })
    }

    fn step(
        &self,
        n: usize,
        s: &Spanned<RawTable>,
        vars: &BTreeMap<String, String>,
    ) -> Result<Step, ScenarioError> {
        let f = Fields {
            p: self,
            table: s.get_ref(),
            span: s.span(),
            prefix: format!("step[{n}]"),
        };
        let line = self.line(s.span().start);
        let names = STEP_KEYS.map(|(k, _)| k).join(", ");
        let what = f
            .string("do")?
            .ok_or_else(|| f.missing("do", &format!("what the step does: one of {names}")))?;
        let Some((_, keys)) = STEP_KEYS.iter().find(|(k, _)| *k == what) else {
            return Err(f.wrong("do", format!("unknown step {what:?}; known: {names}")));
        };
        let mut allowed: Vec<&str> = vec!["do"];
        allowed.extend_from_slice(keys);
        if what != "inject" {
            f.only(&allowed)?;
        }
        let label = |default: &str| -> Result<String, ScenarioError> {
            Ok(f.string("label")?.unwrap_or_else(|| default.to_string()))
        };
        let action = match what.as_str() {
            "wait" => Action::Wait(Duration::from_millis(
                f.ms("ms")?
                    .ok_or_else(|| f.missing("ms", "how long to wait"))?,
            )),
            "clear" => Action::Clear,
            "restart" => Action::Restart {
                label: label("operator-restart")?,
            },
            "inject" => {
                let spec = f.fault_spec(&["do", "label"], None)?;
                Action::Inject {
                    label: label(spec.kind().name())?,
                    spec,
                }
            }
            "exec" => {
                let command = f
                    .command("command", vars)?
                    .ok_or_else(|| f.missing("command", "the command to run"))?;
                Action::Exec {
                    command,
                    timeout: Duration::from_millis(f.ms("timeout_ms")?.unwrap_or(30_000)),
                    fault: f.string("fault")?,
                    within: f.ms("within_ms")?.map(Duration::from_millis),
                    may_fail: f.bool("may_fail")?.unwrap_or(false),
                }
            }
            "storm" => Action::Storm(f.storm(label("storm")?)?),
            "expect" => Action::Expect(Box::new(f.expect()?)),
            _ => unreachable!("checked against STEP_KEYS"),
        };
        Ok(Step { line, action })
    }
}

/// The fields of one table, read with their lines.
struct Fields<'a> {
    p: &'a Parser<'a>,
    table: &'a RawTable,
    span: std::ops::Range<usize>,
    prefix: String,
}

impl Fields<'_> {
    fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    fn wrong(&self, k: &str, why: String) -> ScenarioError {
        let span = self
            .table
            .get(k)
            .map_or_else(|| self.span.clone(), |v| v.span());
        self.p.err(span, self.name(k), why)
    }

    fn missing(&self, k: &str, what: &str) -> ScenarioError {
        self.p
            .err(self.span.clone(), self.name(k), format!("missing: {what}"))
    }

    fn only(&self, allowed: &[&str]) -> Result<(), ScenarioError> {
        for k in self.table.keys() {
            if !allowed.contains(&k.as_str()) {
                let known: Vec<&str> = allowed.iter().copied().filter(|a| *a != "do").collect();
                return Err(self.wrong(
                    k,
                    format!(
                        "unknown field; this takes {}",
                        if known.is_empty() {
                            "nothing else".to_string()
                        } else {
                            known.join(", ")
                        }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn get(&self, k: &str) -> Option<&toml::Value> {
        self.table.get(k).map(Spanned::get_ref)
    }

    fn string(&self, k: &str) -> Result<Option<String>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(toml::Value::String(_)) => Err(self.wrong(k, "must not be empty".into())),
            Some(v) => Err(self.wrong(k, format!("must be a string, not {}", v.type_str()))),
        }
    }

    fn bool(&self, k: &str) -> Result<Option<bool>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(k, format!("must be true or false, not {}", v.type_str()))),
        }
    }

    fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::Integer(i)) => match u64::try_from(*i) {
                Ok(n) if n <= max => Ok(Some(n)),
                _ => Err(self.wrong(k, format!("must be 0..={max}, not {i}"))),
            },
            Some(v) => Err(self.wrong(k, format!("must be a whole number, not {}", v.type_str()))),
        }
    }

    /// A number in (0, 1].
    fn fraction(&self, k: &str) -> Result<Option<f64>, ScenarioError> {
        let v = match self.get(k) {
            None => return Ok(None),
            Some(toml::Value::Float(f)) => *f,
            Some(toml::Value::Integer(i)) => *i as f64,
            Some(v) => {
                return Err(self.wrong(k, format!("must be a number, not {}", v.type_str())));
            }
        };
        if v > 0.0 && v <= 1.0 {
            Ok(Some(v))
        } else {
            Err(self.wrong(k, format!("must be a fraction in (0, 1], not {v}")))
        }
    }

    fn ms(&self, k: &str) -> Result<Option<u64>, ScenarioError> {
        self.uint(k, MAX_MS)
    }

    fn strings(&self, k: &str) -> Result<Option<Vec<String>>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) => Ok(Some(vec![s.clone()])),
            Some(toml::Value::Array(a)) => a
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => Ok(s.clone()),
                    other => Err(self.wrong(
                        k,
                        format!(
                            "must be a list of strings, not one with a {}",
                            other.type_str()
                        ),
                    )),
                })
                .collect::<Result<Vec<_>, _>>()
                .map(Some),
            Some(v) => Err(self.wrong(
                k,
                format!(
                    "must be a string or a list of strings, not {}",
                    v.type_str()
                ),
            )),
        }
    }

    fn command(
        &self,
        k: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Option<Command>, ScenarioError> {
        let sub = |s: &str| substitute(s, vars).map_err(|why| self.wrong(k, why));
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) if !s.trim().is_empty() => {
                Ok(Some(Command::Shell(sub(s)?)))
            }
            Some(toml::Value::Array(a)) if !a.is_empty() => {
                let argv = a
                    .iter()
                    .map(|v| match v {
                        toml::Value::String(s) => sub(s),
                        other => Err(self.wrong(
                            k,
                            format!("arguments must be strings, not {}", other.type_str()),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Some(Command::Argv(argv)))
            }
            Some(v) => Err(self.wrong(
                k,
                format!(
                    "must be a shell line or a non-empty list of arguments, not {}",
                    if v.as_str().is_some() || v.as_array().is_some() {
                        "an empty one"
                    } else {
                        v.type_str()
                    }
                ),
            )),
        }
    }

    /// A fault spec from this table's fields but `skip`; `kind` names the fault when the
    /// table does not (a storm's mix).
    fn fault_spec(&self, skip: &[&str], kind: Option<&str>) -> Result<FaultSpec, ScenarioError> {
        let mut m = Map::new();
        if let Some(kind) = kind {
            m.insert("fault".into(), Value::String(kind.into()));
        }
        for (k, v) in self.table {
            if skip.contains(&k.as_str()) {
                continue;
            }
            if k == "cmd" || (kind.is_some() && k == "fault") {
                return Err(self.wrong(k, "unknown field".into()));
            }
            let j = serde_json::to_value(v.get_ref()).map_err(|e| self.wrong(k, e.to_string()))?;
            m.insert(k.clone(), j);
        }
        FaultSpec::from_map(&m).map_err(|e| {
            let field = e.field.clone();
            let why = e.why.clone();
            if self.table.contains_key(&field) {
                self.wrong(&field, why)
            } else {
                self.p.err(self.span.clone(), self.name(&field), why)
            }
        })
    }

    fn storm(&self, label: String) -> Result<Storm, ScenarioError> {
        let count = self
            .uint("count", MAX_STORM)?
            .ok_or_else(|| self.missing("count", "how many faults"))?;
        if count == 0 {
            return Err(self.wrong("count", "must be at least 1".into()));
        }
        let duration = Duration::from_millis(
            self.ms("duration_ms")?
                .ok_or_else(|| self.missing("duration_ms", "over how long (ms)"))?,
        );
        let seed = self.uint("seed", u64::MAX)?.unwrap_or(1);
        let Some(faults) = self.table.get("faults") else {
            return Err(self.missing(
                "faults",
                "a table of fault = weight (or fault = { weight = N, options... })",
            ));
        };
        let toml::Value::Table(t) = faults.get_ref() else {
            return Err(self.wrong(
                "faults",
                format!("must be a table, not {}", faults.get_ref().type_str()),
            ));
        };
        let mut mix = Vec::new();
        for (kind, v) in t {
            let field = format!("faults.{kind}");
            let at = |why: String| self.p.err(faults.span(), self.name(&field), why);
            if FaultKind::from_name(kind).is_none() {
                return Err(at(format!(
                    "unknown fault {kind:?}; known: {}",
                    FaultKind::NAMES
                )));
            }
            let (weight, opts) = match v {
                toml::Value::Integer(w) => (*w, BTreeMap::new()),
                toml::Value::Table(o) => {
                    let w = match o.get("weight") {
                        Some(toml::Value::Integer(w)) => *w,
                        Some(other) => {
                            return Err(at(format!(
                                "weight must be a whole number, not {}",
                                other.type_str()
                            )));
                        }
                        None => 1,
                    };
                    let opts: RawTable = o
                        .iter()
                        .filter(|(k, _)| *k != "weight")
                        .map(|(k, v)| (k.clone(), Spanned::new(faults.span(), v.clone())))
                        .collect();
                    (w, opts)
                }
                other => {
                    return Err(at(format!(
                        "must be a weight or a table, not {}",
                        other.type_str()
                    )));
                }
            };
            if !(1..=1_000_000).contains(&weight) {
                return Err(at(format!("weight must be 1..=1000000, not {weight}")));
            }
            let sub = Fields {
                p: self.p,
                table: &opts,
                span: faults.span(),
                prefix: self.name(&field),
            };
            let mut spec = sub.fault_spec(&[], Some(kind))?;
            if !opts.contains_key("count") {
                spec = spec.limit(1);
            }
            mix.push((spec, weight as u64));
        }
        if mix.is_empty() {
            return Err(self.wrong("faults", "must name at least one fault".into()));
        }
        Ok(Storm {
            count,
            duration,
            seed,
            mix,
            label,
        })
    }

    fn expect(&self) -> Result<Expect, ScenarioError> {
        let mut e = Expect {
            within: Duration::from_millis(self.ms("within_ms")?.unwrap_or(10_000)),
            ..Expect::default()
        };
        if let Some(s) = self.string("state")? {
            if !STATES.contains(&s.as_str()) {
                return Err(self.wrong(
                    "state",
                    format!("unknown state {s:?}; known: {}", STATES.join(", ")),
                ));
            }
            e.state = Some(s);
        }
        e.restarts = self.uint("restarts", 1_000_000)?;
        e.restarts_at_least = self.uint("restarts_at_least", 1_000_000)?;
        if e.restarts.is_some() && e.restarts_at_least.is_some() {
            return Err(self.wrong(
                "restarts_at_least",
                "give restarts or restarts_at_least, not both".into(),
            ));
        }
        if let Some(c) = self.strings("cause")? {
            if let Some(bad) = c.iter().find(|c| !CAUSES.contains(&c.as_str())) {
                return Err(self.wrong(
                    "cause",
                    format!("unknown cause {bad:?}; known: {}", CAUSES.join(", ")),
                ));
            }
            e.cause = Some(c);
        }
        e.recovered_within_ms = self.ms("recovered_within_ms")?.map(|n| n as f64);
        e.detected_within_ms = self.ms("detected_within_ms")?;
        e.resumed_within_ms = self.ms("resumed_within_ms")?;
        e.ledger_balanced = self.bool("ledger_balanced")?;
        e.no_stale_completions = self.bool("no_stale_completions")?;
        if let Some(d) = self.strings("drops_only")? {
            let names: Vec<&str> = DropReason::ALL.iter().map(|r| r.name()).collect();
            if let Some(bad) = d.iter().find(|d| !names.contains(&d.as_str())) {
                return Err(self.wrong(
                    "drops_only",
                    format!("unknown drop reason {bad:?}; known: {}", names.join(", ")),
                ));
            }
            e.drops_only = Some(d);
        }
        if let Some(r) = self.strings("rising")? {
            let known = counter_names();
            if let Some(bad) = r.iter().find(|c| !known.contains(c)) {
                return Err(self.wrong(
                    "rising",
                    format!(
                        "unknown counter {bad:?}; give a `uipoib stats --json` counter or drops.REASON"
                    ),
                ));
            }
            e.rising = r;
        }
        e.fired = self.bool("fired")?;
        e.traffic_running = self.bool("traffic_running")?;
        e.rate_restored = self.fraction("rate_restored")?;
        let checks = [
            e.state.is_some(),
            e.restarts.is_some(),
            e.restarts_at_least.is_some(),
            e.cause.is_some(),
            e.recovered_within_ms.is_some(),
            e.detected_within_ms.is_some(),
            e.resumed_within_ms.is_some(),
            e.ledger_balanced.is_some(),
            e.no_stale_completions.is_some(),
            e.drops_only.is_some(),
            !e.rising.is_empty(),
            e.fired.is_some(),
            e.traffic_running.is_some(),
            e.rate_restored.is_some(),
        ];
        if !checks.iter().any(|c| *c) {
            return Err(self.p.err(
                self.span.clone(),
                self.prefix.clone(),
                "an expect must check something (state, restarts, cause, ledger_balanced, ...)"
                    .into(),
            ));
        }
        Ok(e)
    }
}

/// The counters an expectation may name: every field of `uipoib stats --json` and
/// `drops.REASON`.
pub fn counter_names() -> Vec<String> {
    let mut names: Vec<String> = match serde_json::to_value(Snapshot::default()) {
        Ok(Value::Object(m)) => m.keys().filter(|k| *k != "drops").cloned().collect(),
        _ => Vec::new(),
    };
    names.extend(
        DropReason::ALL
            .iter()
            .map(|r| format!("drops.{}", r.name())),
    );
    names
}

/// Replace every `${name}` in `s` with its variable; an undefined one is an error.
pub fn substitute(s: &str, vars: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find("${") {
        out.push_str(&rest[..i]);
        let after = &rest[i + 2..];
        let Some(j) = after.find('}') else {
            return Err(format!("unclosed ${{ in {s:?}"));
        };
        let name = &after[..j];
        match vars.get(name) {
            Some(v) => out.push_str(v),
            None => {
                return Err(format!(
                    "undefined variable ${{{name}}} (define it under [vars] or give --var {name}=VALUE)"
                ));
            }
        }
        rest = &after[j + 1..];
    }
    out.push_str(rest);
    Ok(out)
}

#[cfg(test)]
mod tests;
