use std::collections::BTreeMap;
use std::path::Path;

use super::traffic::iperf3_interval_mbps;
use super::*;

fn parse(text: &str) -> Result<Scenario, ScenarioError> {
    Scenario::parse(Path::new("t.toml"), text, &BTreeMap::new())
}

fn err(text: &str) -> ScenarioError {
    match parse(text) {
        Ok(s) => panic!("accepted: {s:?}"),
        Err(e) => e,
    }
}

const OK: &str = r#"
name = "t"
[vars]
peer = "198.18.1.1"

[traffic]
command = "iperf3 -c ${peer}"

[[step]]
do = "wait"
ms = 100

[[step]]
do = "inject"
fault = "poll-error"
after = 5

[[step]]
do = "expect"
restarts = 1
cause = "poll-failed"
traffic_running = true
"#;

#[test]
fn every_shipped_scenario_loads() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/faults");
    let mut n = 0;
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        if p.extension().is_some_and(|x| x == "toml") {
            let s = Scenario::load(&p, &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(
                Some(s.name.as_str()),
                p.file_stem().and_then(|s| s.to_str())
            );
            assert!(!s.description.is_empty(), "{}", p.display());
            n += 1;
        }
    }
    // One per fault kind (some share a file), a storm, a device flap and the breaker.
    assert!(n >= 13, "{n} scenarios");
}

#[test]
fn the_shipped_comparisons_load_with_every_policy_and_a_poll_error_on_the_receive_cq() {
    use crate::iface::PollFailurePolicy;
    use crate::verbs::fault::{CqSel, Fault};
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/compare");
    let mut names = Vec::new();
    for e in std::fs::read_dir(&dir).unwrap() {
        let p = e.unwrap().path();
        let s = Scenario::load(&p, &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}"));
        let c = s.compare.as_ref().expect("a [compare] table");
        assert_eq!(
            c.policies,
            PollFailurePolicy::ALL.to_vec(),
            "{}",
            p.display()
        );
        assert!(s.traffic.is_some(), "under load: {}", p.display());
        let faults: Vec<_> = s
            .steps
            .iter()
            .filter_map(|st| match &st.action {
                Action::Inject { spec, .. } => Some(*spec),
                _ => None,
            })
            .collect();
        assert_eq!(faults.len(), 1, "{}", p.display());
        let Fault::PollError { cq, lose, .. } = faults[0].fault else {
            panic!("{}: not a poll-error", p.display());
        };
        assert_eq!(cq, CqSel::Recv);
        assert_eq!(lose > 0, s.name.ends_with("-lost"), "{}", p.display());
        names.push(s.name);
    }
    names.sort();
    assert_eq!(
        names,
        [
            "persistent",
            "persistent-lost",
            "transient",
            "transient-lost",
            "unrecoverable"
        ]
    );
}

#[test]
fn a_compare_table_names_what_is_wrong() {
    let with = |table: &str| parse(&format!("{OK}\n[compare]\n{table}\n")).map(|s| s.compare);
    let c = with("policies = [\"restart\", \"retry\"]\nduring_ms = 500")
        .unwrap()
        .unwrap();
    assert_eq!(c.policies.len(), 2);
    assert_eq!(c.during, Duration::from_millis(500));
    assert_eq!(c.after, Duration::from_millis(3000));
    for (bad, field) in [
        ("policies = [\"restart\", \"reboot\"]", "compare.policies"),
        ("policies = [\"skip\", \"skip\"]", "compare.policies"),
        ("during_ms = 5", "compare.during_ms"),
        ("typo = 1", "compare.typo"),
    ] {
        let e = with(bad).unwrap_err();
        assert_eq!(e.field, field, "{bad}: {e}");
    }
}

#[test]
fn a_good_file_loads_with_its_variables_substituted() {
    let s = parse(OK).unwrap();
    assert_eq!(s.name, "t");
    assert_eq!(s.repeat, 1);
    assert_eq!(s.steps.len(), 3);
    assert_eq!(s.steps[1].line, 13);
    let t = s.traffic.unwrap();
    assert_eq!(t.command, Program::Shell("iperf3 -c 198.18.1.1".into()));
    let Action::Inject { spec, label } = &s.steps[1].action else {
        panic!("{:?}", s.steps[1]);
    };
    assert_eq!(spec.kind(), crate::verbs::fault::FaultKind::PollError);
    assert_eq!(label, "poll-error");
}

#[test]
fn a_variable_given_on_the_command_line_wins() {
    let mut o = BTreeMap::new();
    o.insert("peer".to_string(), "198.18.9.9".to_string());
    let s = Scenario::parse(Path::new("t.toml"), OK, &o).unwrap();
    assert_eq!(
        s.traffic.unwrap().command,
        Program::Shell("iperf3 -c 198.18.9.9".into())
    );
}

#[test]
fn an_unknown_step_names_its_line_and_field() {
    let e = err("[[step]]\ndo = \"wait\"\nms = 1\n\n[[step]]\ndo = \"sleep\"\n");
    assert_eq!((e.line, e.field.as_str()), (6, "step[2].do"), "{e}");
    assert!(e.why.contains("unknown step \"sleep\""), "{e}");
    assert!(e.to_string().starts_with("t.toml:6: step[2].do: "), "{e}");
}

#[test]
fn a_misspelt_fault_option_names_its_line() {
    let e = err("[[step]]\ndo = \"inject\"\nfault = \"poll-error\"\n\naftr = 3\n");
    assert_eq!((e.line, e.field.as_str()), (5, "step[1].aftr"), "{e}");
    assert!(e.why.contains("unknown field"), "{e}");
}

#[test]
fn an_option_the_fault_does_not_take_is_refused() {
    let e = err("[[step]]\ndo = \"inject\"\nfault = \"qp-error\"\nret = -5\n");
    assert_eq!((e.line, e.field.as_str()), (4, "step[1].ret"), "{e}");
    assert!(e.why.contains("does not apply to qp-error"), "{e}");
}

#[test]
fn an_unknown_fault_is_refused_with_the_list() {
    let e = err("[[step]]\ndo = \"inject\"\nfault = \"pol-error\"\n");
    assert_eq!((e.line, e.field.as_str()), (3, "step[1].fault"), "{e}");
    assert!(e.why.contains("poll-error"), "{e}");
}

#[test]
fn two_triggers_are_refused() {
    let e = err("[[step]]\ndo = \"inject\"\nfault = \"poll-error\"\nafter = 1\nevery = 2\n");
    assert_eq!(e.line, 5, "{e}");
    assert_eq!(e.field, "step[1].every");
}

#[test]
fn a_value_of_the_wrong_type_is_refused() {
    let e = err("[[step]]\ndo = \"wait\"\nms = \"5s\"\n");
    assert_eq!((e.line, e.field.as_str()), (3, "step[1].ms"), "{e}");
    assert!(e.why.contains("whole number"), "{e}");
    let e = err("[[step]]\ndo = \"wait\"\nms = -1\n");
    assert_eq!(e.line, 3, "{e}");
}

#[test]
fn a_missing_field_names_the_step() {
    let e = err("\n[[step]]\ndo = \"wait\"\n");
    assert_eq!((e.line, e.field.as_str()), (2, "step[1].ms"), "{e}");
    assert!(e.why.starts_with("missing"), "{e}");
    let e = err("[[step]]\nms = 3\n");
    assert_eq!(e.field, "step[1].do", "{e}");
}

#[test]
fn an_undefined_variable_is_refused() {
    let e =
        err("[[step]]\ndo = \"exec\"\ncommand = [\"rdma\", \"link\", \"delete\", \"${device}\"]\n");
    assert_eq!((e.line, e.field.as_str()), (3, "step[1].command"), "{e}");
    assert!(e.why.contains("${device}"), "{e}");
    let e = err("[[step]]\ndo = \"exec\"\ncommand = \"echo ${oops\"\n");
    assert!(e.why.contains("unclosed"), "{e}");
}

#[test]
fn toml_syntax_and_unknown_top_level_keys_name_the_line() {
    let e = err("name = \"x\"\n[[step]]\ndo = \"wait\n");
    assert_eq!(e.line, 3, "{e}");
    let e = err("name = \"x\"\nrepeats = 3\n[[step]]\ndo = \"clear\"\n");
    assert_eq!(e.line, 2, "{e}");
    assert!(e.why.contains("repeats"), "{e}");
}

#[test]
fn repeat_must_be_in_range() {
    let e = err("repeat = 0\n[[step]]\ndo = \"clear\"\n");
    assert_eq!((e.line, e.field.as_str()), (1, "repeat"), "{e}");
}

#[test]
fn an_expect_needs_a_fault_and_something_to_check() {
    let e = err("[[step]]\ndo = \"expect\"\nstate = \"running\"\n");
    assert_eq!(e.line, 1, "{e}");
    assert!(e.why.contains("needs a fault before it"), "{e}");
    let e = err("[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\nwithin_ms = 5\n");
    assert_eq!(e.line, 3, "{e}");
    assert!(e.why.contains("must check something"), "{e}");
}

#[test]
fn expectations_are_checked_against_known_names() {
    let base = "[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\n";
    let e = err(&format!("{base}state = \"sleeping\"\n"));
    assert_eq!((e.line, e.field.as_str()), (5, "step[2].state"), "{e}");
    let e = err(&format!("{base}cause = [\"poll-failed\", \"gremlins\"]\n"));
    assert!(e.why.contains("gremlins"), "{e}");
    let e = err(&format!("{base}drops_only = [\"reaped\", \"lost\"]\n"));
    assert!(e.why.contains("\"lost\""), "{e}");
    let e = err(&format!("{base}rising = [\"drops.nope\"]\n"));
    assert!(e.why.contains("drops.nope"), "{e}");
    let e = err(&format!("{base}restarts = 1\nrestarts_at_least = 1\n"));
    assert_eq!(e.field, "step[2].restarts_at_least", "{e}");
    // A counter and a drop reason that exist are fine.
    parse(&format!(
        "{base}rising = [\"spurious_events\", \"drops.tx_post_failed\"]\n"
    ))
    .unwrap();
}

#[test]
fn traffic_running_needs_traffic() {
    let e = err("[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\ntraffic_running = true\n");
    assert_eq!((e.line, e.field.as_str()), (3, "traffic_running"), "{e}");
}

#[test]
fn a_storm_mix_is_checked() {
    let ok = "[[step]]\ndo = \"storm\"\ncount = 10\nduration_ms = 100\n[step.faults]\ncorrupt-rx = 3\nlost-completion = { weight = 2, cq = \"recv\" }\n";
    let s = parse(ok).unwrap();
    let Action::Storm(st) = &s.steps[0].action else {
        panic!()
    };
    assert_eq!(st.mix.len(), 2);
    assert_eq!(st.mix.iter().map(|(_, w)| w).sum::<u64>(), 5);
    let e = err(
        "[[step]]\ndo = \"storm\"\ncount = 10\nduration_ms = 100\n[step.faults]\ncorupt-rx = 3\n",
    );
    assert_eq!(e.field, "step[1].faults.corupt-rx", "{e}");
    assert!(e.why.contains("unknown fault"), "{e}");
    let e = err(
        "[[step]]\ndo = \"storm\"\ncount = 10\nduration_ms = 100\n[step.faults]\nqp-error = { weight = 1, cq = \"recv\" }\n",
    );
    assert_eq!(e.field, "step[1].faults.qp-error.cq", "{e}");
    let e = err(
        "[[step]]\ndo = \"storm\"\ncount = 10\nduration_ms = 100\n[step.faults]\nqp-error = 0\n",
    );
    assert!(e.why.contains("weight"), "{e}");
    let e = err("[[step]]\ndo = \"storm\"\ncount = 10\n");
    assert_eq!(e.field, "step[1].duration_ms", "{e}");
}

#[test]
fn an_exec_takes_a_shell_line_or_arguments() {
    let s = parse("[[step]]\ndo = \"exec\"\ncommand = [\"true\"]\nfault = \"x\"\nwithin_ms = 5\n")
        .unwrap();
    let Action::Exec {
        command,
        fault,
        within,
        ..
    } = &s.steps[0].action
    else {
        panic!()
    };
    assert_eq!(*command, Program::Argv(vec!["true".into()]));
    assert_eq!(fault.as_deref(), Some("x"));
    assert_eq!(*within, Some(std::time::Duration::from_millis(5)));
    let e = err("[[step]]\ndo = \"exec\"\ncommand = []\n");
    assert_eq!(e.field, "step[1].command", "{e}");
    let e = err("[[step]]\ndo = \"exec\"\ncommand = 5\n");
    assert!(e.why.contains("integer"), "{e}");
}

#[test]
fn iperf3_interval_lines_give_their_throughput() {
    let l = "[  5]   1.00-2.00   sec  11.2 MBytes  94.0 Mbits/sec    0    250 KBytes";
    assert_eq!(iperf3_interval_mbps(l), Some(94.0));
    let l = "[  5]   2.00-3.00   sec   120 KBytes   983 Kbits/sec";
    assert!((iperf3_interval_mbps(l).unwrap() - 0.983).abs() < 1e-9);
    let l = "[  5]   3.00-4.00   sec  1.10 GBytes  1.2 Gbits/sec";
    assert_eq!(iperf3_interval_mbps(l), Some(1200.0));
    let l = "[  5]   0.00-10.00  sec   112 MBytes  94.0 Mbits/sec    3             sender";
    assert_eq!(iperf3_interval_mbps(l), None);
    assert_eq!(iperf3_interval_mbps("Connecting to host 198.18.1.1"), None);
    assert_eq!(iperf3_interval_mbps("[  5]   1.00-2.00   sec  x y z"), None);
}

/// A control socket that answers like a running daemon with no faults, except that once
/// it has answered `bad_after` `faults` requests (the runner's first is the fault
/// record's opening, after its status read) it answers `status` with something that is
/// not a status. (Counted by `faults` requests, not `status` ones: the sampler reads the
/// status too, as often as it likes.)
fn fake_daemon(path: &Path, bad_after: usize) -> std::thread::JoinHandle<()> {
    fake_daemon_moving(path, bad_after, |_| 0)
}

/// [`fake_daemon`] whose interface has received `bytes(ms)` bytes `ms` after it started.
fn fake_daemon_moving(
    path: &Path,
    bad_after: usize,
    bytes: impl Fn(u64) -> u64 + Send + 'static,
) -> std::thread::JoinHandle<()> {
    use std::io::{BufRead, BufReader, Write};
    use std::os::unix::net::UnixListener;
    let listener = UnixListener::bind(path).unwrap();
    let t0 = std::time::Instant::now();
    std::thread::spawn(move || {
        let mut faults = 0;
        for stream in listener.incoming() {
            let Ok(stream) = stream else { return };
            let mut line = String::new();
            if BufReader::new(&stream).read_line(&mut line).is_err() {
                continue;
            }
            let req: serde_json::Value = serde_json::from_str(&line).unwrap_or_default();
            let reply = match req["cmd"].as_str() {
                Some("status") => {
                    if faults >= bad_after {
                        serde_json::json!({"ok": true, "status": {"state": 7}})
                    } else {
                        let st = crate::runtime::supervisor::Status {
                            state: "running".into(),
                            epoch: 1,
                            ..Default::default()
                        };
                        serde_json::json!({"ok": true, "status": st})
                    }
                }
                Some("stats") => {
                    let b = bytes(t0.elapsed().as_millis() as u64);
                    let snap = crate::iface::stats::Snapshot {
                        rx_bytes: b,
                        rx_packets: b / 1000,
                        ..Default::default()
                    };
                    serde_json::json!({"ok": true, "stats": snap})
                }
                Some("faults") => {
                    faults += 1;
                    serde_json::json!({"ok": true, "injected": 0, "recent": []})
                }
                Some("quit") => return,
                _ => serde_json::json!({"ok": true}),
            };
            let _ = writeln!(&stream, "{reply}");
        }
    })
}

fn run_against_fake(tag: &str, bad_after: usize) -> super::report::Report {
    run_fake(
        &format!("reads-{tag}"),
        |sock| fake_daemon(sock, bad_after),
        r#"
name = "reads"
description = "a fault record and an expectation against a fake daemon"

step = [
    { do = "exec", fault = "probe", command = ["true"] },
    { do = "wait", ms = 300 },
    { do = "expect", within_ms = 300, state = "running" },
]
"#,
    )
}

/// Play `scenario` against the fake daemon `start` serves on a fresh socket, then stop it.
fn run_fake(
    tag: &str,
    start: impl FnOnce(&Path) -> std::thread::JoinHandle<()>,
    scenario: &str,
) -> super::report::Report {
    run_fake_capped(tag, start, scenario, super::MAX_SAMPLES)
}

/// [`run_fake`] keeping at most `cap` counter samples.
fn run_fake_capped(
    tag: &str,
    start: impl FnOnce(&Path) -> std::thread::JoinHandle<()>,
    scenario: &str,
    cap: usize,
) -> super::report::Report {
    let dir = std::env::temp_dir().join(format!("uipoib-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sock = dir.join("ctl.sock");
    let server = start(&sock);
    let report = super::run::Runner::new(parse(scenario).unwrap(), &sock)
        .quiet()
        .sample_cap(cap)
        .run()
        .unwrap();
    let _ = crate::runtime::control::request(&sock, "quit");
    server.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    report
}

#[test]
fn a_failed_status_read_is_reported_not_taken_for_zeros() {
    // Good status reads up to the fault record's opening, then garbage: the expectation
    // sees the last good status, and the run fails saying why.
    let r = run_against_fake("bad", 1);
    assert!(!r.passed, "{r:?}");
    let f = &r.faults[0];
    assert!(f.expectations.iter().all(|o| o.ok), "{:?}", f.expectations);
    let check = r
        .checks
        .iter()
        .find(|o| {
            o.what
                .contains("every read of the daemon's counters and status")
        })
        .expect("a check for the failed reads");
    assert!(!check.ok);
    assert!(
        check.detail.starts_with("status: ") || check.detail.contains("the first: status"),
        "{}",
        check.detail
    );
    assert!(
        r.failures.iter().any(|l| l.contains("every read")),
        "{:?}",
        r.failures
    );
}

#[test]
fn good_reads_add_no_check() {
    let r = run_against_fake("good", usize::MAX);
    assert!(r.passed, "{:?}", r.failures);
    assert!(
        !r.checks.iter().any(|o| o.what.contains("every read")),
        "{:?}",
        r.checks
    );
}

/// The steps of a run with one fault (`probe`) `wait_ms` into the load, then the
/// `rate_restored = 0.5` check from 300 ms after it (for up to 2.5 s).
fn one_fault_steps(wait_ms: u64) -> String {
    format!(
        r#"    {{ do = "wait", ms = {wait_ms} }},
    {{ do = "exec", fault = "probe", command = ["true"] }},
    {{ do = "wait", ms = 300 }},
    {{ do = "expect", within_ms = 2500, rate_restored = 0.5 }},
"#
    )
}

/// A scenario of `steps` (TOML array items) under a placeholder load, against a fake
/// daemon whose byte counter is `moving(ms since it started)`: the runs of the
/// `rate_restored` tests below.
fn rate_scenario(
    tag: &str,
    moving: impl Fn(u64) -> u64 + Send + 'static,
    steps: &str,
) -> super::report::Report {
    run_fake(
        &format!("rate-{tag}"),
        |sock| fake_daemon_moving(sock, usize::MAX, moving),
        &format!(
            "name = \"rate-{tag}\"\ndescription = \"rate_restored against a fake rate\"\n\n\
             step = [\n{steps}]\n\n[traffic]\ncommand = [\"sleep\", \"60\"]\n"
        ),
    )
}

/// The `rate_restored` outcome of fault record `i`.
fn rate_check(r: &super::report::Report, i: usize) -> &super::report::Outcome {
    r.faults[i]
        .expectations
        .iter()
        .find(|o| o.what.starts_with("rate restored"))
        .expect("the rate check")
}

/// A run whose fault (opened at 3.5 s) cuts the fake interface's rate from 8 Mbit/s to
/// `after` Mbit/s, checked by `rate_restored = 0.5`.
fn rate_run(tag: &str, after_mbps: u64) -> super::report::Report {
    // 8 Mbit/s = 1000 bytes per ms until the fault, then `after_mbps`.
    let moving = move |ms: u64| {
        let cut = 3_600;
        if ms <= cut {
            ms * 1000
        } else {
            cut * 1000 + (ms - cut) * after_mbps * 125
        }
    };
    rate_scenario(tag, moving, &one_fault_steps(3500))
}

#[test]
fn a_rate_that_stays_low_after_the_fault_fails_rate_restored() {
    let r = rate_run("low", 1);
    let o = rate_check(&r, 0);
    assert!(!o.ok, "{o:?}");
    assert!(o.detail.contains("Mbit/s before"), "{}", o.detail);
    assert!(!r.passed);
}

#[test]
fn a_rate_back_to_most_of_before_passes_rate_restored() {
    let r = rate_run("back", 7);
    assert!(rate_check(&r, 0).ok, "{:?}", rate_check(&r, 0));
}

/// A run whose first fault (at 3.5 s) stops the fake interface's traffic (8 Mbit/s)
/// until a second one, a revival at ~7.3 s, after which it moves `after` Mbit/s:
/// `rate_restored` after the revival compares with the rate before the first fault,
/// not the dead window before the revival.
fn revived_rate_run(tag: &str, after_mbps: u64) -> super::report::Report {
    let moving = move |ms: u64| {
        let (dead, back) = (3_600, 7_400);
        if ms <= dead {
            ms * 1000
        } else if ms <= back {
            dead * 1000
        } else {
            dead * 1000 + (ms - back) * after_mbps * 125
        }
    };
    rate_scenario(
        &format!("revived-{tag}"),
        moving,
        r#"    { do = "wait", ms = 3500 },
    { do = "exec", fault = "dies", command = ["true"] },
    { do = "wait", ms = 3800 },
    { do = "exec", fault = "revive", command = ["true"] },
    { do = "wait", ms = 300 },
    { do = "expect", within_ms = 2500, rate_restored = 0.5 },
"#,
    )
}

#[test]
fn a_revival_is_measured_against_the_rate_before_the_first_fault() {
    let low = revived_rate_run("low", 1);
    let o = rate_check(&low, 1);
    // The window before the revival carried nothing: against it any rate would pass.
    assert!(!o.ok, "{o:?}");
    assert!(
        o.detail.contains("before the run's first fault (dies)"),
        "{}",
        o.detail
    );
    let back = revived_rate_run("back", 7);
    assert!(rate_check(&back, 1).ok, "{:?}", rate_check(&back, 1));
}

/// A fault whose window before it carried nothing gives `rate_restored` no baseline:
/// the check fails (against zero any rate would pass).
#[test]
fn no_traffic_before_the_fault_is_no_baseline_for_rate_restored() {
    // 8 Mbit/s for the first second (the load's warm-up), nothing from 1 s to 5 s (the
    // fault's window before it), 8 Mbit/s again after.
    let moving = |ms: u64| match ms {
        0..=1_000 => ms * 1000,
        1_001..=5_000 => 1_000_000,
        _ => 1_000_000 + (ms - 5_000) * 1000,
    };
    let r = rate_scenario("idle", moving, &one_fault_steps(4500));
    let o = rate_check(&r, 0);
    assert!(!o.ok, "{o:?}");
    assert!(o.detail.contains("no rate measured"), "{}", o.detail);
}

#[test]
fn rate_restored_is_a_fraction_and_needs_traffic() {
    let base =
        "[traffic]\ncommand = \"true\"\n[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\n";
    let e = err(&format!("{base}rate_restored = 1.5\n"));
    assert!(e.field.ends_with("].rate_restored"), "{e}");
    assert!(e.why.contains("(0, 1]"), "{e}");
    let e = err(&format!("{base}rate_restored = \"most\"\n"));
    assert!(e.why.contains("must be a number"), "{e}");
    assert!(parse(&format!("{base}rate_restored = 0.8\n")).is_ok());
    let e = err("[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\nrate_restored = 0.5\n");
    assert_eq!(e.field, "rate_restored", "{e}");
}

#[test]
fn a_kill_step_loads_with_its_signal_and_log() {
    let mut o = BTreeMap::new();
    o.insert("out".to_string(), "/tmp/lab".to_string());
    let s = Scenario::parse(
        Path::new("t.toml"),
        "[[step]]\ndo = \"kill\"\nsignal = \"SIGKILL\"\nrestart = true\nlog = \"${out}/d.log\"\n[[step]]\ndo = \"expect\"\nnew_daemon = true\n",
        &o,
    )
    .unwrap();
    let Action::Kill(k) = &s.steps[0].action else {
        panic!("{:?}", s.steps[0]);
    };
    assert_eq!((k.signal, k.signal_name.as_str()), (libc::SIGKILL, "KILL"));
    assert_eq!(k.log.as_deref(), Some(Path::new("/tmp/lab/d.log")));
    assert_eq!(k.timeout, std::time::Duration::from_millis(30_000));
    assert_eq!(k.label, "kill-restart");
    let s = parse("[[step]]\ndo = \"kill\"\nsignal = \"TERM\"\nrestart = true\ntimeout_ms = 5000\nlabel = \"k\"\n").unwrap();
    let Action::Kill(k) = &s.steps[0].action else {
        panic!()
    };
    assert_eq!(
        (k.signal, k.timeout.as_millis(), k.label.as_str()),
        (libc::SIGTERM, 5000, "k")
    );
}

#[test]
fn a_kill_step_names_what_is_wrong() {
    let e = err("[[step]]\ndo = \"kill\"\nsignal = \"KIL\"\nrestart = true\n");
    assert_eq!((e.line, e.field.as_str()), (3, "step[1].signal"), "{e}");
    assert!(e.why.contains("unknown signal \"KIL\""), "{e}");
    assert!(e.why.contains("KILL, TERM"), "{e}");
    assert!(
        e.to_string().starts_with("t.toml:3: step[1].signal: "),
        "{e}"
    );
    let e = err("[[step]]\ndo = \"kill\"\nsignal = 9\nrestart = true\n");
    assert_eq!((e.line, e.field.as_str()), (3, "step[1].signal"), "{e}");
    assert!(e.why.contains("must be a string"), "{e}");
    let e = err("\n[[step]]\ndo = \"kill\"\nrestart = true\n");
    assert_eq!((e.line, e.field.as_str()), (2, "step[1].signal"), "{e}");
    assert!(e.why.starts_with("missing"), "{e}");
    let e = err("[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\n");
    assert_eq!((e.line, e.field.as_str()), (1, "step[1].restart"), "{e}");
    assert!(e.why.starts_with("missing"), "{e}");
    let e = err("[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\nrestart = false\n");
    assert_eq!((e.line, e.field.as_str()), (4, "step[1].restart"), "{e}");
    assert!(e.why.contains("must be true"), "{e}");
    let e = err("[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\nrestart = true\nwait_ms = 3\n");
    assert_eq!((e.line, e.field.as_str()), (5, "step[1].wait_ms"), "{e}");
    assert!(e.why.contains("unknown field"), "{e}");
    let e =
        err("[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\nrestart = true\nlog = \"${nope}/x\"\n");
    assert_eq!((e.line, e.field.as_str()), (5, "step[1].log"), "{e}");
    let e = err("[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\nrestart = true\ntimeout_ms = -1\n");
    assert_eq!((e.line, e.field.as_str()), (5, "step[1].timeout_ms"), "{e}");
}

#[test]
fn kill_expectations_need_a_kill_and_fit_one() {
    let e = err("[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\nnew_daemon = true\n");
    assert_eq!((e.line, e.field.as_str()), (5, "step[2].new_daemon"), "{e}");
    assert!(e.why.contains("needs a kill step"), "{e}");
    let kill = "[[step]]\ndo = \"kill\"\nsignal = \"KILL\"\nrestart = true\n";
    let e = err(&format!(
        "{kill}[[step]]\ndo = \"expect\"\ndetected_within_ms = 100\n"
    ));
    assert_eq!(
        (e.line, e.field.as_str()),
        (7, "step[2].detected_within_ms"),
        "{e}"
    );
    // An expect alone after a kill is fine; a fault after the kill is the newest.
    parse(&format!(
        "{kill}[[step]]\ndo = \"expect\"\nstate = \"running\"\n"
    ))
    .unwrap();
    let e = err(&format!(
        "{kill}[[step]]\ndo = \"restart\"\n[[step]]\ndo = \"expect\"\nnew_daemon = true\n"
    ));
    assert_eq!(e.field, "step[3].new_daemon", "{e}");
    let e = err(&format!(
        "{kill}[[step]]\ndo = \"expect\"\niperf3_resumed = true\n"
    ));
    assert_eq!(e.field, "iperf3_resumed", "{e}");
    assert!(e.why.contains("[traffic]"), "{e}");
}

#[test]
fn iperf3_lines_of_the_load_give_the_gap_figures_and_iperf3_resumed() {
    // A load that prints a quarter-second iperf3 interval every quarter second.
    let r = run_fake(
        "iperf3-lines",
        |sock| fake_daemon_moving(sock, usize::MAX, |ms| ms * 1000),
        r#"
name = "iperf3-lines"
description = "iperf3 interval lines of the load are measured around the fault"

step = [
    { do = "wait", ms = 1500 },
    { do = "exec", fault = "probe", command = ["true"] },
    { do = "expect", within_ms = 1000, iperf3_resumed = true },
    { do = "wait", ms = 1500 },
]

[traffic]
command = "s=0; while :; do e=$((s+25)); printf '[  5]   %d.%02d-%d.%02d   sec   256 KBytes  8.39 Mbits/sec    0   100 KBytes\n' $((s/100)) $((s%100)) $((e/100)) $((e%100)); s=$e; sleep 0.25; done"
warmup_ms = 2000
"#,
    );
    let s = r.iperf3.as_ref().expect("the session's figures");
    assert!(s.intervals >= 8, "{s:?}");
    assert_eq!(s.baseline_bytes, Some(256.0 * 1024.0), "{s:?}");
    assert_eq!(s.longest_gap_outside_faults_ms, 0.0, "{s:?}");
    let f = &r.faults[0];
    let w = f.iperf3.as_ref().expect("the fault's window");
    assert_eq!(w.gap_ms, 0.0, "{w:?}");
    assert!(w.intervals_after >= 3 && w.bytes_after > 0.0, "{w:?}");
    assert_eq!(w.min_pct, Some(100.0), "{w:?}");
    let o = f
        .expectations
        .iter()
        .find(|o| o.what == "iperf3 moved data after the fault")
        .expect("the deferred check");
    assert!(o.ok, "{o:?}");
    assert!(r.passed, "{:?}", r.failures);
    assert!(
        r.at_rest.as_ref().is_some_and(|a| a.ledger_balanced),
        "{r:?}"
    );
}

#[test]
fn an_expect_waits_for_iperf3_to_move_again_after_its_outage() {
    // The load prints a quarter-second interval every quarter second; the fault makes
    // it print 0-byte intervals for 1.5 s (TCP backing off after an outage), then data
    // again. The expect comes right after the fault and the load stops 100 ms after
    // it: only a wait inside the expect leaves an interval with data after the outage.
    let dir = std::env::temp_dir().join(format!("uipoib-iperf3-back-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mark = dir.join("outage");
    let m = mark.display();
    let t0 = std::time::Instant::now();
    let r = run_fake(
        "iperf3-back",
        |sock| fake_daemon_moving(sock, usize::MAX, |ms| ms * 1000),
        &format!(
            r#"
name = "iperf3-back"
description = "an expect waits for iperf3's data after the outage"

step = [
    {{ do = "wait", ms = 1000 }},
    {{ do = "exec", fault = "probe", command = ["touch", "{m}"] }},
    {{ do = "expect", within_ms = 10000, iperf3_resumed = true }},
    {{ do = "wait", ms = 100 }},
]

[traffic]
command = "s=0 z=0; while :; do e=$((s+25)); b=256; if [ -e '{m}' ]; then b=0; z=$((z+1)); [ $z -lt 6 ] || rm -f '{m}'; fi; printf '[  5]   %d.%02d-%d.%02d   sec   %d KBytes  8.39 Mbits/sec    0   100 KBytes\n' $((s/100)) $((s%100)) $((e/100)) $((e%100)) $b; s=$e; sleep 0.25; done"
warmup_ms = 1500
"#
        ),
    );
    let took = t0.elapsed();
    let _ = std::fs::remove_dir_all(&dir);
    let f = &r.faults[0];
    let w = f.iperf3.as_ref().expect("the fault's window");
    assert!(w.gap_ms >= 1000.0, "{w:?}");
    assert!(w.intervals_after >= 1 && w.bytes_after > 0.0, "{w:?}");
    let o = f
        .expectations
        .iter()
        .find(|o| o.what == "iperf3 moved data after the fault")
        .expect("the deferred check");
    assert!(o.ok, "{o:?}");
    assert!(r.passed, "{:?}", r.failures);
    // It waited for the outage's end, and no longer than the load needed.
    assert!(took < std::time::Duration::from_secs(9), "{took:?}");
}

#[test]
fn the_report_keeps_the_samples_up_to_the_cap_and_counts_the_rest() {
    let scenario = r#"
name = "series"
description = "the counter samples of a run"

step = [
    { do = "exec", fault = "probe", command = ["true"] },
    { do = "wait", ms = 700 },
]
"#;
    // 8 Mbit/s received.
    let moving = |ms: u64| ms * 1000;
    let r = run_fake(
        "series-all",
        |sock| fake_daemon_moving(sock, usize::MAX, moving),
        scenario,
    );
    let s = &r.series;
    assert_eq!((s.every_ms, s.cap, s.dropped), (50, super::MAX_SAMPLES, 0));
    assert!(s.samples.len() >= 6, "{s:?}");
    assert!(s.iperf3.is_empty());
    let (a, b) = (&s.samples[0], &s.samples[s.samples.len() - 1]);
    assert!(b.rx_bytes > a.rx_bytes && b.t_ms > a.t_ms, "{a:?} {b:?}");
    assert_eq!(b.state, "running");
    assert!(s.samples.windows(2).all(|w| w[0].unix_ms <= w[1].unix_ms));
    assert!(!r.to_text().contains("oldest dropped"));
    // The same run keeping 3: the newest 3 stay, the others are counted and said.
    let r = run_fake_capped(
        "series-capped",
        |sock| fake_daemon_moving(sock, usize::MAX, moving),
        scenario,
        3,
    );
    let s = &r.series;
    assert_eq!(s.samples.len(), 3, "{s:?}");
    assert!(s.dropped >= 3, "{s:?}");
    assert!(
        r.to_text().contains(&format!(
            "3 samples kept, the {} oldest dropped (at most 3 are kept)",
            s.dropped
        )),
        "{}",
        r.to_text()
    );
    // The fault's measurements still work from the newest samples.
    assert!(r.passed, "{:?}", r.failures);
    let v = serde_json::to_value(&r).unwrap();
    assert_eq!(v["series"]["dropped"], s.dropped);
    assert_eq!(v["series"]["iperf3"], serde_json::json!([]));
}
