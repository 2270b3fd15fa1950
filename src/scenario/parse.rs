//! Reading a scenario file: the top level, the steps and their keys, with the line of
//! whatever is wrong.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use toml::Spanned;

use super::fields::Fields;
use super::{Action, CompareSpec, MAX_REPEAT, Scenario, ScenarioError, Step, Traffic};
use crate::iface::PollFailurePolicy;
use crate::iface::stats::{DropReason, Snapshot};

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
    compare: Option<Spanned<RawTable>>,
    #[serde(default)]
    step: Vec<Spanned<RawTable>>,
}

pub(super) type RawTable = BTreeMap<String, Spanned<toml::Value>>;

pub(super) struct Parser<'a> {
    pub(super) path: &'a Path,
    pub(super) text: &'a str,
}

/// Policy names (`restart`, `skip`, `retry`, `recreate-cq`), each once, in the order
/// given.
pub fn parse_policies<S: AsRef<str>>(names: &[S]) -> Result<Vec<PollFailurePolicy>, String> {
    let mut out = Vec::new();
    for n in names {
        let n = n.as_ref().trim();
        let p = PollFailurePolicy::from_name(n)
            .ok_or_else(|| format!("unknown policy {n:?}; known: {}", PollFailurePolicy::NAMES))?;
        if out.contains(&p) {
            return Err(format!("{n} is listed twice"));
        }
        out.push(p);
    }
    if out.is_empty() {
        return Err("name at least one policy".into());
    }
    Ok(out)
}

/// The keys each step takes besides `do`.
const STEP_KEYS: [(&str, &[&str]); 8] = [
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
    ("kill", &["signal", "restart", "timeout_ms", "log", "label"]),
    (
        "expect",
        &[
            "within_ms",
            "state",
            "restarts",
            "restarts_at_least",
            "cause",
            "recovered_within_ms",
            "failed_attempts_at_least",
            "detected_within_ms",
            "resumed_within_ms",
            "ledger_balanced",
            "no_stale_completions",
            "drops_only",
            "rising",
            "fired",
            "traffic_running",
            "rate_restored",
            "new_daemon",
            "iperf3_resumed",
        ],
    ),
];

/// States the supervisor reports.
pub(super) const STATES: [&str; 6] = [
    "running",
    "restarting",
    "waiting-for-device",
    "dead",
    "stopping",
    "stopped",
];

/// Restart causes the supervisor records.
pub(super) const CAUSES: [&str; 10] = [
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
    pub(super) fn line(&self, offset: usize) -> usize {
        let end = offset.min(self.text.len());
        self.text.as_bytes()[..end]
            .iter()
            .filter(|b| **b == b'\n')
            .count()
            + 1
    }

    pub(super) fn err(
        &self,
        span: std::ops::Range<usize>,
        field: String,
        why: String,
    ) -> ScenarioError {
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
        // Whether the newest fault record is a kill's (a new daemon).
        let mut killed = false;
        for (i, s) in raw.step.iter().enumerate() {
            let step = self.step(i + 1, s, &vars)?;
            let key = |k: &str, why: &str| {
                let span = s.get_ref().get(k).map_or_else(|| s.span(), |v| v.span());
                self.err(span, format!("step[{}].{k}", i + 1), why.into())
            };
            match &step.action {
                Action::Inject { .. }
                | Action::Restart { .. }
                | Action::Storm(_)
                | Action::Exec { fault: Some(_), .. } => (opened, killed) = (true, false),
                Action::Kill(_) => (opened, killed) = (true, true),
                Action::Expect(_) if !opened => {
                    return Err(self.err(
                        s.span(),
                        format!("step[{}]", i + 1),
                        "an expect needs a fault before it (inject, restart, storm, kill, or exec with fault = ...)".into(),
                    ));
                }
                Action::Expect(e) if e.new_daemon.is_some() && !killed => {
                    return Err(key(
                        "new_daemon",
                        "needs a kill step before it (the newest fault must be a kill)",
                    ));
                }
                Action::Expect(e) if e.detected_within_ms.is_some() && killed => {
                    return Err(key(
                        "detected_within_ms",
                        "a killed daemon detects nothing: after a kill, check recovered_within_ms (kill to interface up) or resumed_within_ms",
                    ));
                }
                _ => {}
            }
            steps.push(step);
        }
        if traffic.is_none()
            && let Some(s) = steps
                .iter()
                .find(|s| matches!(&s.action, Action::Expect(e) if e.traffic_running.is_some() || e.rate_restored.is_some() || e.iperf3_resumed.is_some()))
        {
            let field = match &s.action {
                Action::Expect(e) if e.traffic_running.is_some() => "traffic_running",
                Action::Expect(e) if e.rate_restored.is_some() => "rate_restored",
                _ => "iperf3_resumed",
            };
            return Err(ScenarioError {
                file: self.path.to_owned(),
                line: s.line,
                field: field.into(),
                why: "needs a [traffic] section (the load it measures)".into(),
            });
        }
        let compare = match &raw.compare {
            None => None,
            Some(c) => Some(self.compare(c)?),
        };
        Ok(Scenario {
            name,
            description: raw.description.unwrap_or_default(),
            file: self.path.to_owned(),
            repeat,
            vars,
            traffic,
            steps,
            compare,
        })
    }

    fn compare(&self, t: &Spanned<RawTable>) -> Result<CompareSpec, ScenarioError> {
        let f = Fields {
            p: self,
            table: t.get_ref(),
            span: t.span(),
            prefix: "compare".into(),
        };
        f.only(&["policies", "during_ms", "after_ms"])?;
        let policies = match f.strings("policies")? {
            None => PollFailurePolicy::ALL.to_vec(),
            Some(names) => parse_policies(&names).map_err(|why| f.wrong("policies", why))?,
        };
        let during = f.ms("during_ms")?.unwrap_or(2000);
        let after = f.ms("after_ms")?.unwrap_or(3000);
        for (k, v) in [("during_ms", during), ("after_ms", after)] {
            if !(100..=600_000).contains(&v) {
                return Err(f.wrong(k, format!("must be 100..=600000, not {v}")));
            }
        }
        Ok(CompareSpec {
            policies,
            during: Duration::from_millis(during),
            after: Duration::from_millis(after),
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
            "kill" => Action::Kill(f.kill(label("kill-restart")?, vars)?),
            "expect" => Action::Expect(Box::new(f.expect()?)),
            _ => unreachable!("checked against STEP_KEYS"),
        };
        Ok(Step { line, action })
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
