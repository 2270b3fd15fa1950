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
    let srv = ControlServer::start_bare(&path, Some(switch.clone())).unwrap();
    (path, switch, srv)
}

#[test]
fn inject_arms_what_the_flags_say() {
    let (path, switch, _srv) = serve("arm");
    let cases: [(&[&str], FaultSpec); 8] = [
        (
            &[
                "inject",
                "poll-error",
                "--every",
                "1",
                "--cq",
                "recv",
                "--lose",
                "16",
                "--for-ms",
                "2000",
            ],
            FaultSpec {
                window: Some(Duration::from_millis(2000)),
                ..FaultSpec::new(Fault::PollError {
                    ret: -5,
                    lose: 16,
                    cq: CqSel::Recv,
                })
                .trigger(Trigger::Every(1))
            },
        ),
        (
            &["inject", "poll-error", "--every", "1", "--until-restart"],
            FaultSpec {
                until_restart: true,
                ..FaultSpec::new(Fault::poll_error(-5)).trigger(Trigger::Every(1))
            },
        ),
        // Last of its kind: the one left armed (arming replaces a fault of the same kind).
        (
            &["inject", "poll-error", "--after", "1000", "--ret", "-22"],
            FaultSpec::new(Fault::poll_error(-22)).trigger(Trigger::After(1000)),
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
    let _srv = ControlServer::start_bare(&path, None).unwrap();
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

// ---- the scenario step that kills the daemon and starts it again ----------------------

/// Environment of the fake daemon process: its control socket.
const FAKE_SOCK: &str = "UIPOIB_TEST_FAKE_DAEMON_SOCK";
/// A marker file: the first incarnation creates it; a later one, finding it, does what
/// [`FAKE_THEN`] says (`hang`: never serve; `exit`: exit 3; otherwise serve).
const FAKE_ONCE: &str = "UIPOIB_TEST_FAKE_DAEMON_ONCE";
const FAKE_THEN: &str = "UIPOIB_TEST_FAKE_DAEMON_THEN";
/// A TAP the fake daemon holds (and names in its status), as a daemon does.
const FAKE_TAP: &str = "UIPOIB_TEST_FAKE_DAEMON_TAP";
/// How long the fake daemon takes to come up (what the kill step must measure).
const FAKE_START: Duration = Duration::from_millis(300);

/// Not a test by itself: run as a process of its own by the kill tests (this test
/// binary with `--exact` on this name and [`FAKE_SOCK`] set), it serves a control
/// socket like a running daemon until it is killed.
#[test]
fn fake_daemon_process() {
    let Some(sock) = std::env::var_os(FAKE_SOCK) else {
        return;
    };
    if let Some(marker) = std::env::var_os(FAKE_ONCE) {
        if Path::new(&marker).exists() {
            match std::env::var(FAKE_THEN).as_deref() {
                Ok("hang") => loop {
                    std::thread::sleep(Duration::from_secs(1));
                },
                Ok("exit") => std::process::exit(3),
                _ => {}
            }
        } else {
            std::fs::write(&marker, b"started once\n").unwrap();
        }
    }
    std::thread::sleep(FAKE_START);
    let tap_name = std::env::var(FAKE_TAP).unwrap_or_default();
    let _tap = (!tap_name.is_empty()).then(|| uipoib::tap::Tap::create(&tap_name, false).unwrap());
    let _srv = ControlServer::start(
        Path::new(&sock),
        Arc::new(Stats::default()),
        Arc::new(Mutex::new(Status {
            state: "running".into(),
            tap: tap_name,
            epoch: 1,
            ..Status::default()
        })),
        Default::default(),
        None,
        Some(Arc::new(FaultSwitch::default())),
    )
    .unwrap();
    println!("fake daemon {} serving", std::process::id());
    loop {
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// The fake daemon, started by this test: its process and its command line.
struct FakeDaemon {
    child: std::process::Child,
    argv: Vec<String>,
    dir: PathBuf,
    sock: PathBuf,
}

fn cmdline(pid: u32) -> Vec<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .unwrap_or_default()
        .split(|c| *c == 0)
        .filter(|s| !s.is_empty())
        .map(|s| String::from_utf8_lossy(s).into_owned())
        .collect()
}

fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, r)| r.split_whitespace().next() != Some("Z"))
        })
        .unwrap_or(false)
}

/// Start the fake daemon; `then` is what a later incarnation does (see [`FAKE_THEN`]);
/// with `tap`, it holds a TAP of that name.
fn fake_daemon(tag: &str, then: &str, tap: Option<&str>) -> FakeDaemon {
    let sock = sock_path(&format!("kill-{tag}"));
    let dir = sock.parent().unwrap().to_owned();
    let exe = std::env::current_exe().unwrap();
    let args = [
        "fake_daemon_process",
        "--exact",
        "--nocapture",
        "--test-threads=1",
    ];
    let child = Command::new(&exe)
        .args(args)
        .env(FAKE_SOCK, &sock)
        .env(FAKE_ONCE, dir.join("started"))
        .env(FAKE_THEN, then)
        .env(FAKE_TAP, tap.unwrap_or(""))
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let end = std::time::Instant::now() + Duration::from_secs(20);
    while uipoib::runtime::control::request(&sock, "status").is_err() {
        assert!(
            std::time::Instant::now() < end,
            "the fake daemon never came up"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let argv = cmdline(child.id());
    assert_eq!(argv[0], exe.to_string_lossy());
    assert_eq!(&argv[1..], &args[..]);
    FakeDaemon {
        child,
        argv,
        dir,
        sock,
    }
}

const KILL_SCENARIO: &str = r#"
name = "kill"
description = "the daemon killed and started again"

[[step]]
do = "kill"
signal = "KILL"
restart = true
timeout_ms = TIMEOUT
log = "${dir}/new.log"

[[step]]
do = "expect"
within_ms = 3000
new_daemon = true
state = "running"
ledger_balanced = true
recovered_within_ms = 10000
"#;

/// Play [`KILL_SCENARIO`] with `uipoib fault run` against `d`: exit code, stdout and
/// the JSON report.
fn run_kill(d: &FakeDaemon, timeout_ms: u64) -> (Option<i32>, String, serde_json::Value) {
    let file = d.dir.join("kill.toml");
    std::fs::write(
        &file,
        KILL_SCENARIO.replace("TIMEOUT", &timeout_ms.to_string()),
    )
    .unwrap();
    let json = d.dir.join("report.json");
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["fault", "run"])
        .arg(&file)
        .arg("--control")
        .arg(&d.sock)
        .arg("--var")
        .arg(format!("dir={}", d.dir.display()))
        .arg("--json")
        .arg(&json)
        .arg("--quiet")
        .output()
        .unwrap();
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap_or_default())
            .unwrap_or(serde_json::Value::Null);
    (out.status.code(), text(&out.stdout), report)
}

/// Stop what the run left: the daemon it started, and ours.
fn cleanup(mut d: FakeDaemon, report: &serde_json::Value) {
    if let Some(pid) = report["faults"][0]["daemon"]["new_pid"].as_u64() {
        let _ = uipoib::sys::process::kill_process(pid as u32, libc::SIGKILL);
    }
    let _ = d.child.kill();
    let _ = d.child.wait();
    let _ = std::fs::remove_dir_all(&d.dir);
}

#[test]
fn a_kill_step_kills_the_daemon_and_starts_it_again_as_it_was() {
    // With a TAP when this may create one: the new daemon starts once it is gone.
    let tap = format!("ukf{}", std::process::id() % 100_000);
    let tap = std::path::Path::new("/dev/net/tun")
        .exists()
        .then_some(tap)
        .filter(|_| uipoib::sys::process::euid() == 0);
    let mut d = fake_daemon("ok", "serve", tap.as_deref());
    if let Some(t) = &tap {
        assert!(Path::new("/sys/class/net").join(t).exists(), "no TAP {t}");
    }
    let old = d.child.id();
    let (code, stdout, r) = run_kill(&d, 10_000);
    assert_eq!(code, Some(0), "{stdout}\n{r}");
    assert_eq!(r["passed"], true, "{r}");
    // The one the run killed is ours: it exited by SIGKILL.
    let st = d.child.wait().unwrap();
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&st),
        Some(libc::SIGKILL)
    );
    let f = &r["faults"][0];
    let dm = &f["daemon"];
    assert_eq!(dm["old_pid"], old, "{dm}");
    assert_eq!(dm["signal"], "KILL");
    let new = dm["new_pid"].as_u64().expect("a new pid") as u32;
    assert_ne!(new, old);
    // The new daemon outlives the run, with the same command line and environment.
    assert!(alive(new), "the new daemon is gone");
    assert_eq!(cmdline(new), d.argv);
    let argv: Vec<String> = dm["argv"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    assert_eq!(argv, d.argv);
    let env = std::fs::read(format!("/proc/{new}/environ")).unwrap();
    let want = format!("{FAKE_SOCK}={}", d.sock.display());
    assert!(
        env.split(|c| *c == 0).any(|kv| kv == want.as_bytes()),
        "the environment was not carried over"
    );
    assert_eq!(dm["log"], d.dir.join("new.log").display().to_string());
    assert!(text(&std::fs::read(d.dir.join("new.log")).unwrap()).contains("serving"));
    // The timing: signal, exit, start, up, in that order; the fake takes 300 ms to
    // come up after its exec, and the record's recovery is the kill to up. (The start
    // is stamped when the spawn has returned, after the exec: on a loaded host that may
    // be late by more than the fake's own start-up, so the 300 ms are counted from the
    // kill, which comes before the exec.)
    let t = |k: &str| dm[k].as_u64().unwrap_or_else(|| panic!("{k}: {dm}"));
    assert!(t("killed_unix_ms") <= t("exited_unix_ms"), "{dm}");
    assert!(t("exited_unix_ms") <= t("started_unix_ms"), "{dm}");
    assert!(t("started_unix_ms") <= t("up_unix_ms"), "{dm}");
    assert!(
        t("killed_unix_ms") + FAKE_START.as_millis() as u64 <= t("up_unix_ms"),
        "{dm}"
    );
    let up = dm["up_ms"].as_f64().unwrap();
    assert!(up >= FAKE_START.as_millis() as f64 && up < 10_000.0, "{dm}");
    assert!(dm["exit_ms"].as_f64().unwrap() <= up, "{dm}");
    if tap.is_some() {
        let gone = dm["tap_gone_ms"].as_f64().expect("the TAP went");
        assert!(
            dm["exit_ms"].as_f64().unwrap() <= gone && gone <= up,
            "{dm}"
        );
    } else {
        assert!(dm["tap_gone_ms"].is_null(), "{dm}");
    }
    assert_eq!(f["recovery_ms"].as_f64(), Some(up), "{f}");
    assert_eq!(f["injected_unix_ms"], dm["killed_unix_ms"], "{f}");
    assert!(dm["error"].is_null(), "{dm}");
    // Its expectations held, the new daemon's among them.
    let what: Vec<&str> = f["expectations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["what"].as_str().unwrap())
        .collect();
    assert!(what.contains(&"a new daemon answers"), "{what:?}");
    assert_eq!(r["at_rest"]["ledger_balanced"], true, "{r}");
    assert_eq!(r["at_rest"]["ledger_residuals"]["recv"], 0, "{r}");
    assert_eq!(f["ledger_residuals"]["send"], 0, "{f}");
    cleanup(d, &r);
}

#[test]
fn a_daemon_that_does_not_come_back_in_time_fails_the_step() {
    let d = fake_daemon("hang", "hang", None);
    let t0 = std::time::Instant::now();
    let (code, stdout, r) = run_kill(&d, 1_500);
    assert_eq!(code, Some(1), "{stdout}\n{r}");
    let f = &r["faults"][0];
    let step = &f["expectations"][0];
    assert_eq!(step["ok"], false, "{step}");
    let why = step["detail"].as_str().unwrap();
    assert!(
        why.contains("did not answer `running`") && why.contains("within 1500 ms"),
        "{why}"
    );
    assert_eq!(f["daemon"]["error"].as_str(), Some(why));
    assert!(
        r["failures"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l.as_str().unwrap().contains("did not answer `running`")),
        "{r}"
    );
    assert_eq!(f["daemon"]["up_unix_ms"], serde_json::Value::Null);
    assert!(f["recovery_ms"].is_null(), "{f}");
    // The run gave up on it after its timeout (and the checks at the end).
    assert!(t0.elapsed() < Duration::from_secs(40));
    cleanup(d, &r);
}

#[test]
fn a_daemon_that_exits_at_once_fails_the_step_saying_so() {
    let d = fake_daemon("exit", "exit", None);
    let (code, stdout, r) = run_kill(&d, 10_000);
    assert_eq!(code, Some(1), "{stdout}\n{r}");
    let why = r["faults"][0]["daemon"]["error"].as_str().unwrap_or("");
    assert!(
        why.contains("exited (exit status: 3) before it answered"),
        "{why}"
    );
    cleanup(d, &r);
}

#[test]
fn the_alternative_poll_failure_policies_are_refused_without_allow_faults() {
    for policy in ["skip", "retry", "recreate-cq"] {
        // A device that does not exist: the refusal must come first, from the config.
        let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(["up", "--device", "nodev9", "--tap", "uipcli0"])
            .args(["--addr", "198.18.9.1/24", "--poll-failure-policy", policy])
            .output()
            .expect("running uipoib");
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{policy}: {err}");
        assert!(err.contains("poll-failure-policy"), "{err}");
        assert!(err.contains("--allow-faults"), "{err}");
        assert!(err.contains(policy), "{err}");
        assert!(!err.contains("nodev9"), "refused before the device: {err}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["up", "--device", "nodev9", "--tap", "uipcli0"])
        .args(["--addr", "198.18.9.1/24", "--poll-failure-policy", "ignore"])
        .arg("--allow-faults")
        .output()
        .expect("running uipoib");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("\"ignore\"") && err.contains("restart, skip, retry, recreate-cq"));
}

#[test]
fn fault_compare_refuses_bad_use_and_a_daemon_already_there() {
    let compare = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(["fault", "compare"])
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/compare/transient.toml"))
            .args(args)
            .output()
            .expect("running uipoib")
    };
    for (args, want) in [
        (
            &[
                "--tap",
                "uipcli0",
                "--policies",
                "restart,nope",
                "--",
                "--device",
                "x",
            ][..],
            "\"nope\"",
        ),
        (
            &[
                "--tap",
                "uipcli0",
                "--policies",
                "skip,skip",
                "--",
                "--device",
                "x",
            ][..],
            "twice",
        ),
        (
            &["--tap", "uipcli0", "--", "--device", "x", "--allow-faults"][..],
            "--allow-faults after `--`",
        ),
        (
            &["--tap", "uipcli0", "--", "--device", "x", "--tap=y"][..],
            "--tap after `--`",
        ),
    ] {
        let out = compare(args);
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
    // Something answers on the control socket already: the comparison starts daemons of
    // its own and will not measure another one; each policy says so and it fails.
    let (sock, _switch, _server) = serve("compare");
    let logs = sock.parent().unwrap().join("logs");
    let json = sock.parent().unwrap().join("compare.json");
    let out = compare(&[
        "--tap",
        "uipcli0",
        "--control",
        sock.to_str().unwrap(),
        "--policies",
        "restart,retry",
        "--logs",
        logs.to_str().unwrap(),
        "--json",
        json.to_str().unwrap(),
        "-q",
        "--",
        "--device",
        "nodev9",
        "--addr",
        "198.18.9.1/24",
    ]);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("already answers"), "{stdout}");
    assert!(stdout.contains("FAILED"), "{stdout}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["passed"], false);
    let runs = v["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 2);
    assert_eq!(runs[0]["policy"], "restart");
    assert_eq!(runs[1]["policy"], "retry");
    assert!(
        runs[1]["error"]
            .as_str()
            .unwrap()
            .contains("already answers")
    );
}

#[test]
fn a_rust_log_that_does_not_parse_is_refused_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["status", "--tap", "uipcli0"])
        .env("RUST_LOG", "info,[")
        .output()
        .expect("running uipoib");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RUST_LOG=\"info,[\" does not parse"), "{err}");
    // A good one is taken, and stderr to a pipe carries no colour codes.
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["status", "--tap", "uipcli0"])
        .env("RUST_LOG", "uipoib=debug,info")
        .output()
        .expect("running uipoib");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "no daemon: {err}");
    assert!(!err.contains('\x1b'), "{err:?}");
}

#[test]
fn up_check_validates_and_says_what_it_would_open_without_a_device() {
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["up", "--check", "--device", "nodev9", "--tap", "uipcli0"])
        .args(["--addr", "198.18.9.1/24", "--addr", "2001:2:0:9::1/64"])
        .output()
        .expect("running uipoib");
    let plan = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{plan}{}", text(&out.stderr));
    assert!(plan.contains("open RDMA device nodev9 port 1"), "{plan}");
    assert!(
        plan.contains("create TAP uipcli0 with 198.18.9.1/24, 2001:2:0:9::1/64"),
        "{plan}"
    );
    assert!(plan.contains("on a failed poll: restart"), "{plan}");
    // A range error in a file names the file, the line and the key; a flag that sets
    // the key instead wins, and then the file is not blamed.
    let dir = sock_path("check");
    let file = dir.parent().unwrap().join("uip.toml");
    std::fs::write(
        &file,
        "[interface]\ndevice = \"nodev9\"\ntap = \"uipcli0\"\naddr = \"198.18.9.1/24\"\nrecv-ring = 3\n",
    )
    .unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["up", "--check", "--config"])
        .arg(&file)
        .output()
        .expect("running uipoib");
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains(&format!("config file {}:5: recv-ring:", file.display())),
        "{err}"
    );
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["up", "--check", "--recv-ring", "128", "--config"])
        .arg(&file)
        .output()
        .expect("running uipoib");
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert!(text(&out.stdout).contains("receive ring 128"));
}
