//! Steps that act: a storm of faults, a command.

use std::collections::BTreeMap;
use std::sync::mpsc;
use std::thread;
use std::time::{Duration, Instant};

use super::record::Record;
use super::report::{Outcome, Report};
use super::run::Runner;
use super::traffic::spawn;
use super::{Program, Storm};
use crate::verbs::fault::SplitMix64;

impl Runner {
    pub(super) fn storm(
        &self,
        storm: &Storm,
        at: &str,
        report: &mut Report,
        rec: Option<&mut Record>,
    ) {
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
}

/// Run a command with a time limit: its outcome, and whether it counts as a failure.
pub(super) fn exec(
    command: &Program,
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
            let _ = crate::sys::process::kill_group(pid, libc::SIGKILL);
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
