//! The fields of one table of a scenario file (a step, the traffic, a storm's mix),
//! each read with its type and range checked and its line kept for the error.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::{Map, Value};
use toml::Spanned;

use super::parse::{CAUSES, Parser, RawTable, STATES, counter_names, substitute};
use super::{Expect, Kill, MAX_MS, MAX_STORM, Program, SIGNALS, ScenarioError, Storm};
use crate::iface::stats::DropReason;
use crate::verbs::fault::{FaultKind, FaultSpec};

/// The fields of one table, read with their lines.
pub(super) struct Fields<'a> {
    pub(super) p: &'a Parser<'a>,
    pub(super) table: &'a RawTable,
    pub(super) span: std::ops::Range<usize>,
    pub(super) prefix: String,
}

impl Fields<'_> {
    pub(super) fn name(&self, k: &str) -> String {
        format!("{}.{k}", self.prefix)
    }

    pub(super) fn wrong(&self, k: &str, why: String) -> ScenarioError {
        let span = self
            .table
            .get(k)
            .map_or_else(|| self.span.clone(), |v| v.span());
        self.p.err(span, self.name(k), why)
    }

    pub(super) fn missing(&self, k: &str, what: &str) -> ScenarioError {
        self.p
            .err(self.span.clone(), self.name(k), format!("missing: {what}"))
    }

    pub(super) fn only(&self, allowed: &[&str]) -> Result<(), ScenarioError> {
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

    pub(super) fn get(&self, k: &str) -> Option<&toml::Value> {
        self.table.get(k).map(Spanned::get_ref)
    }

    pub(super) fn string(&self, k: &str) -> Result<Option<String>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) if !s.is_empty() => Ok(Some(s.clone())),
            Some(toml::Value::String(_)) => Err(self.wrong(k, "must not be empty".into())),
            Some(v) => Err(self.wrong(k, format!("must be a string, not {}", v.type_str()))),
        }
    }

    pub(super) fn bool(&self, k: &str) -> Result<Option<bool>, ScenarioError> {
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::Boolean(b)) => Ok(Some(*b)),
            Some(v) => Err(self.wrong(k, format!("must be true or false, not {}", v.type_str()))),
        }
    }

    pub(super) fn uint(&self, k: &str, max: u64) -> Result<Option<u64>, ScenarioError> {
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
    pub(super) fn fraction(&self, k: &str) -> Result<Option<f64>, ScenarioError> {
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

    pub(super) fn ms(&self, k: &str) -> Result<Option<u64>, ScenarioError> {
        self.uint(k, MAX_MS)
    }

    pub(super) fn strings(&self, k: &str) -> Result<Option<Vec<String>>, ScenarioError> {
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

    pub(super) fn command(
        &self,
        k: &str,
        vars: &BTreeMap<String, String>,
    ) -> Result<Option<Program>, ScenarioError> {
        let sub = |s: &str| substitute(s, vars).map_err(|why| self.wrong(k, why));
        match self.get(k) {
            None => Ok(None),
            Some(toml::Value::String(s)) if !s.trim().is_empty() => {
                Ok(Some(Program::Shell(sub(s)?)))
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
                Ok(Some(Program::Argv(argv)))
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
    pub(super) fn fault_spec(
        &self,
        skip: &[&str],
        kind: Option<&str>,
    ) -> Result<FaultSpec, ScenarioError> {
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

    pub(super) fn storm(&self, label: String) -> Result<Storm, ScenarioError> {
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

    pub(super) fn kill(
        &self,
        label: String,
        vars: &BTreeMap<String, String>,
    ) -> Result<Kill, ScenarioError> {
        let names: Vec<&str> = SIGNALS.iter().map(|(n, _)| *n).collect();
        let given = self.string("signal")?.ok_or_else(|| {
            self.missing(
                "signal",
                &format!("the signal to send: one of {}", names.join(", ")),
            )
        })?;
        let name = given.strip_prefix("SIG").unwrap_or(&given);
        let Some((name, signal)) = SIGNALS.iter().find(|(n, _)| *n == name) else {
            return Err(self.wrong(
                "signal",
                format!("unknown signal {given:?}; known: {}", names.join(", ")),
            ));
        };
        match self.bool("restart")? {
            Some(true) => {}
            Some(false) => {
                return Err(self.wrong(
                    "restart",
                    "must be true: the scenario goes on against the daemon, so it is started again"
                        .into(),
                ));
            }
            None => {
                return Err(self.missing(
                    "restart",
                    "restart = true (the daemon is started again as it was)",
                ));
            }
        }
        let log = match self.string("log")? {
            None => None,
            Some(l) => Some(PathBuf::from(
                substitute(&l, vars).map_err(|why| self.wrong("log", why))?,
            )),
        };
        Ok(Kill {
            signal: *signal,
            signal_name: (*name).to_string(),
            timeout: Duration::from_millis(self.ms("timeout_ms")?.unwrap_or(30_000)),
            log,
            label,
        })
    }

    pub(super) fn expect(&self) -> Result<Expect, ScenarioError> {
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
        e.failed_attempts_at_least = self.uint("failed_attempts_at_least", 1_000_000)?;
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
        e.new_daemon = self.bool("new_daemon")?;
        e.iperf3_resumed = self.bool("iperf3_resumed")?;
        let checks = [
            e.state.is_some(),
            e.restarts.is_some(),
            e.restarts_at_least.is_some(),
            e.cause.is_some(),
            e.recovered_within_ms.is_some(),
            e.failed_attempts_at_least.is_some(),
            e.detected_within_ms.is_some(),
            e.resumed_within_ms.is_some(),
            e.ledger_balanced.is_some(),
            e.no_stale_completions.is_some(),
            e.drops_only.is_some(),
            !e.rising.is_empty(),
            e.fired.is_some(),
            e.traffic_running.is_some(),
            e.rate_restored.is_some(),
            e.new_daemon.is_some(),
            e.iperf3_resumed.is_some(),
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
