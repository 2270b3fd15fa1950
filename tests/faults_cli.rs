//! `uipoib fault inject|show|clear` against a control socket served in this process:
//! the CLI's flags become the fault armed on the switch, and a bad flag is refused
//! naming the field, before any daemon is asked.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use uipoib::iface::stats::Stats;
use uipoib::runtime::control::ControlServer;
use uipoib::runtime::supervisor::Status;
use uipoib::verbs::fault::FaultSwitch;
use uipoib::verbs::fault::{CqSel, Fault, FaultKind, FaultSpec, Trigger};

fn uipoib(control: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .arg("fault")
        .arg(args[0])
        .arg("--control")
        .arg(control)
        .args(&args[1..])
        .output()
        .expect("running uipoib")
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// A socket in a fresh directory of its own (the control socket refuses a directory
/// others can write to, such as /tmp itself).
fn sock_path(tag: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("uipoib-faults-cli-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir.join("c.sock")
}

fn serve(tag: &str) -> (PathBuf, Arc<FaultSwitch>, ControlServer) {
    let path = sock_path(tag);
    let switch = Arc::new(FaultSwitch::default());
    let srv = ControlServer::start(
        &path,
        Arc::new(Stats::default()),
        Arc::new(Mutex::new(Status::default())),
        None,
        Some(switch.clone()),
    )
    .unwrap();
    (path, switch, srv)
}

#[test]
fn inject_arms_what_the_flags_say() {
    let (path, switch, _srv) = serve("arm");
    let cases: [(&[&str], FaultSpec); 6] = [
        (
            &["inject", "poll-error", "--after", "1000", "--ret", "-22"],
            FaultSpec::new(Fault::PollError { ret: -22 }).trigger(Trigger::After(1000)),
        ),
        (
            &[
                "inject",
                "lost-completion",
                "--every",
                "7",
                "--cq",
                "recv",
                "--count",
                "3",
            ],
            FaultSpec::new(Fault::LostCompletion { cq: CqSel::Recv })
                .trigger(Trigger::Every(7))
                .limit(3),
        ),
        (
            &[
                "inject",
                "corrupt-rx",
                "--probability",
                "0.25",
                "--seed",
                "9",
                "--bytes",
                "4",
            ],
            FaultSpec::new(Fault::CorruptRx { bytes: 4 })
                .trigger(Trigger::Random { p: 0.25, seed: 9 }),
        ),
        (
            &[
                "inject",
                "slow-poll",
                "--delay-ms",
                "20",
                "--at-ms",
                "500",
                "--count",
                "unlimited",
            ],
            FaultSpec::new(Fault::SlowPoll {
                delay: Duration::from_millis(20),
            })
            .trigger(Trigger::At(Duration::from_millis(500)))
            .unlimited(),
        ),
        (
            &[
                "inject",
                "post-send-error",
                "--errno",
                "EINVAL",
                "--every",
                "10",
            ],
            FaultSpec::new(Fault::PostSendError {
                errno: libc::EINVAL,
            })
            .trigger(Trigger::Every(10)),
        ),
        (
            &["inject", "qp-error", "--event", "qp-fatal", "--after", "5"],
            FaultSpec::new(Fault::QpError { fatal_event: true }).trigger(Trigger::After(5)),
        ),
    ];
    for (args, want) in cases {
        let out = uipoib(&path, args);
        assert!(out.status.success(), "{args:?}: {}", text(&out.stderr));
        let armed = switch.armed();
        assert!(armed.contains(&want), "{args:?}: armed {armed:?}");
    }
    // On command: an async event is delivered at once (and recorded), not armed.
    let out = uipoib(&path, &["inject", "async-fatal", "--event", "cq-error"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(switch.fired(FaultKind::AsyncFatal), 1);
    let out = uipoib(&path, &["show"]);
    assert!(out.status.success());
    let shown = text(&out.stdout);
    assert!(
        shown.contains("poll-error (ret -22), after 1000, once"),
        "{shown}"
    );
    assert!(shown.contains("async-fatal"), "{shown}");
    let out = uipoib(&path, &["show", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["injected"], 1);
    assert_eq!(v["armed"].as_array().map(Vec::len), Some(6));

    let out = uipoib(&path, &["clear"]);
    assert!(out.status.success());
    assert!(switch.armed().is_empty());
}

#[test]
fn junk_is_refused_naming_the_field() {
    let (path, switch, _srv) = serve("junk");
    for (args, field) in [
        (&["inject", "meteor"][..], "fault"),
        (&["inject", "poll-error", "--ret", "5"][..], "ret"),
        (&["inject", "poll-error", "--every", "0"][..], "every"),
        (&["inject", "slow-poll", "--bytes", "3"][..], "bytes"),
        (&["inject", "corrupt-rx", "--bytes", "500"][..], "bytes"),
        (
            &["inject", "post-recv-error", "--errno", "EWHAT"][..],
            "errno",
        ),
        (&["inject", "stall-send", "--count", "lots"][..], "count"),
        (
            &["inject", "poll-error", "--probability", "1.5"][..],
            "probability",
        ),
        (&["inject", "lost-completion", "--cq", "both"][..], "cq"),
        (&["inject", "async-fatal", "--event", "boom"][..], "event"),
    ] {
        let out = uipoib(&path, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = text(&out.stderr);
        assert!(err.contains(&format!("\"{field}\"")), "{args:?}: {err}");
    }
    // Two triggers, or a seed without a probability: clap refuses, naming both.
    for args in [
        &["inject", "poll-error", "--after", "1", "--every", "2"][..],
        &["inject", "poll-error", "--seed", "3"][..],
    ] {
        let out = uipoib(&path, args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(text(&out.stderr).contains("--"), "{args:?}");
    }
    assert!(switch.armed().is_empty(), "nothing junk got through");
    assert_eq!(switch.injected(), 0);
}

fn status_cli(control: &Path, json: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_uipoib"));
    c.arg("status").arg("--control").arg(control);
    if json {
        c.arg("--json");
    }
    c.output().expect("running uipoib")
}

#[test]
fn without_the_switch_inject_is_refused_and_status_says_so() {
    let path = sock_path("off");
    let _srv = ControlServer::start(
        &path,
        Arc::new(Stats::default()),
        Arc::new(Mutex::new(Status::default())),
        None,
        None,
    )
    .unwrap();
    let out = uipoib(&path, &["inject", "poll-error", "--after", "10"]);
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("fault injection is disabled: start the daemon with --allow-faults"),
        "{err}"
    );
    for cmd in ["show", "clear"] {
        let out = uipoib(&path, &[cmd]);
        assert_eq!(out.status.code(), Some(1), "{cmd}");
        assert!(text(&out.stderr).contains("--allow-faults"), "{cmd}");
    }
    let out = status_cli(&path, false);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("faults    disabled"),
        "{}",
        text(&out.stdout)
    );
    let out = status_cli(&path, true);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["allow_faults"], false, "{v}");

    // With the switch (what --allow-faults gives the daemon): allowed, and said so.
    let (path, switch, _srv) = serve("on");
    let out = uipoib(&path, &["inject", "poll-error", "--after", "10"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(switch.armed().len(), 1);
    let out = status_cli(&path, false);
    assert!(
        text(&out.stdout).contains("faults    allowed"),
        "{}",
        text(&out.stdout)
    );
    let v: serde_json::Value = serde_json::from_slice(&status_cli(&path, true).stdout).unwrap();
    assert_eq!(v["allow_faults"], true, "{v}");
}
