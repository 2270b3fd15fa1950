//! Whole-daemon test on the host: `uipoib sim-pair` runs two interfaces over the
//! simulated fabric with real TAP devices, each in its own network namespace; ping and
//! iperf3 (TCP and UDP) run across them, `uipoib stats` reads the live counters, and
//! SIGTERM tears everything down with balanced ledgers. A second test restarts both
//! interfaces (an injected failed poll, a fatal async event, an operator restart) in the
//! middle of an iperf3 TCP session, which survives. A pair is used once both interfaces
//! say `running`; a failed ping's panic carries both daemons' status, counters and
//! neighbours and both namespaces' link counters and neighbour tables. Another sends
//! full-MTU datagrams to a socket that does not read, and checks what the kernel charged
//! it for each (this test binary run again in each namespace as the sender and receiver).
//!
//! Needs root, /dev/net/tun, `ip`, `ping` and `iperf3`; without them it says why and
//! skips, except when the `CI` environment variable is set: then it fails, so that a CI
//! run cannot pass without having run it.

mod common;

use std::net::Ipv4Addr;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::netns::{Daemon, Netns, is_ci, root_or_tun_missing};

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(
        out.status.success(),
        "{cmd} {args:?} failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn missing_prerequisite() -> Option<String> {
    if let Some(why) = root_or_tun_missing() {
        return Some(why);
    }
    for tool in ["ip", "iperf3", "ping"] {
        if Command::new(tool).arg("-V").output().is_err()
            && Command::new(tool).arg("--version").output().is_err()
        {
            return Some(format!(
                "{tool} is not installed (apt-get install iproute2 iperf3 iputils-ping)"
            ));
        }
    }
    None
}

/// What to do about a missing prerequisite: `Ok(None)` run; `Ok(Some(line))` print the
/// line and skip; `Err` fail (in CI a skip would pass silently).
fn skip_decision(test: &str, missing: Option<String>, ci: bool) -> Result<Option<String>, String> {
    match missing {
        None => Ok(None),
        Some(why) if ci => Err(format!(
            "{test} cannot run: {why}; CI is set, so this fails instead of skipping"
        )),
        Some(why) => Ok(Some(format!("SKIPPED {test}: {why}"))),
    }
}

/// True if `test` can run here; prints why not and returns false, or panics under CI.
fn can_run(test: &str) -> bool {
    match skip_decision(test, missing_prerequisite(), is_ci()) {
        Ok(None) => true,
        Ok(Some(line)) => {
            eprintln!("{line}");
            false
        }
        Err(e) => panic!("{e}"),
    }
}

#[test]
fn in_ci_a_missing_prerequisite_fails_instead_of_skipping() {
    let why = || Some("not running as root".to_string());
    let e = skip_decision("netns_sim", why(), true).unwrap_err();
    assert!(e.contains("not running as root") && e.contains("CI"), "{e}");
    let line = skip_decision("netns_sim", why(), false).unwrap().unwrap();
    assert!(
        line.starts_with("SKIPPED netns_sim: not running as root"),
        "{line}"
    );
    assert_eq!(skip_decision("netns_sim", None, true), Ok(None));
}

fn ns_exec(ns: &str, args: &[&str]) -> std::process::Output {
    Command::new("ip")
        .args(["netns", "exec", ns])
        .args(args)
        .output()
        .unwrap()
}

fn wait_up(ns: &str, tap: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        let o = Command::new("ip")
            .args(["-n", ns, "-o", "addr", "show", "dev", tap])
            .output()
            .unwrap();
        if String::from_utf8_lossy(&o.stdout).contains("inet ") {
            return;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    panic!("{tap} never came up in {ns}");
}

struct Pair {
    na: Netns,
    nb: Netns,
    ctl_a: std::path::PathBuf,
    ctl_b: std::path::PathBuf,
    dir: std::path::PathBuf,
    daemon: Daemon,
}

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

impl Pair {
    /// A sim-pair with `extra` flags (e.g. `--tap-offload false`).
    fn start(tag: u32, extra: &[&str]) -> Pair {
        Self::start_env(tag, extra, &[])
    }

    /// [`Pair::start`] with environment variables set for the daemon.
    fn start_env(tag: u32, extra: &[&str], env: &[(&str, &str)]) -> Pair {
        let id = std::process::id() % 10_000;
        let na = Netns::new(&format!("uipt-a-{id}-{tag}"));
        let nb = Netns::new(&format!("uipt-b-{id}-{tag}"));
        let (tap_a, tap_b) = (format!("ua{id}x{tag}"), format!("ub{id}x{tag}"));
        let dir = std::env::temp_dir().join(format!("uipoib-netns-{id}-{tag}"));
        std::fs::create_dir_all(&dir).unwrap();
        // The control sockets' directory must be writable by its owner only.
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let (ctl_a, ctl_b) = (dir.join("a.sock"), dir.join("b.sock"));
        let child = Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(["sim-pair", "--netns-a", &na.0, "--netns-b", &nb.0])
            .args(["--tap-a", &tap_a, "--tap-b", &tap_b])
            .args(["--control-a"])
            .arg(&ctl_a)
            .args(["--control-b"])
            .arg(&ctl_b)
            .args(extra)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let daemon = Daemon(child);
        wait_up(&na.0, &tap_a);
        wait_up(&nb.0, &tap_b);
        let p = Pair {
            na,
            nb,
            ctl_a,
            ctl_b,
            dir,
            daemon,
        };
        p.wait_running();
        p
    }

    /// Until both interfaces report `running`: an address on the TAP comes before the
    /// restart rehearsed at start is over, and a test's first packet should not race it.
    fn wait_running(&self) {
        let deadline = Instant::now() + Duration::from_secs(20);
        for ctl in [&self.ctl_a, &self.ctl_b] {
            loop {
                let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
                    .args(["status", "--json", "--control"])
                    .arg(ctl)
                    .output()
                    .unwrap();
                let last = if out.status.success() {
                    let s: serde_json::Value =
                        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null);
                    if s["state"] == "running" {
                        break;
                    }
                    s.to_string()
                } else {
                    String::from_utf8_lossy(&out.stderr).into_owned()
                };
                assert!(
                    Instant::now() < deadline,
                    "{} not running 20 s after start: {last}",
                    ctl.display()
                );
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }

    /// `ping` with `args` in namespace `ns`; when it fails, the panic carries what tells
    /// "never left the kernel", "never read from the TAP" and "lost between the two"
    /// apart: both daemons' status, counters and neighbours and both namespaces' link
    /// counters and neighbour tables, read before the pair is torn down.
    fn ping(&self, ns: &str, args: &[&str]) {
        let mut cmd = vec!["ping"];
        cmd.extend_from_slice(args);
        let o = ns_exec(ns, &cmd);
        if o.status.success() {
            return;
        }
        let mut report = format!(
            "{cmd:?} in {ns} failed:\n{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
        // One section per command: its name, then what it printed.
        let mut section = |label: String, cmd: &mut Command| {
            let out = cmd.output().unwrap();
            report += &format!(
                "\n--- {label}:\n{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        };
        for (side, ctl) in [("a", &self.ctl_a), ("b", &self.ctl_b)] {
            for what in [&["status", "--json"][..], &["stats", "--json"], &["neigh"]] {
                section(
                    format!("{side}: uipoib {}", what.join(" ")),
                    Command::new(env!("CARGO_BIN_EXE_uipoib"))
                        .args(what)
                        .arg("--control")
                        .arg(ctl),
                );
            }
        }
        for n in [&self.na.0, &self.nb.0] {
            for what in [&["-s", "link", "show"][..], &["neigh", "show"]] {
                section(
                    format!("ip -n {n} {}", what.join(" ")),
                    Command::new("ip").arg("-n").arg(n).args(what),
                );
            }
        }
        panic!("{report}");
    }

    fn cli(&self, args: &[&str], ctl: &std::path::Path) -> serde_json::Value {
        let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(args)
            .arg("--control")
            .arg(ctl)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "uipoib {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap_or(serde_json::Value::Null)
    }

    /// SIGTERM; returns the daemon's stdout after checking it exited 0.
    fn stop(mut self) -> String {
        run("kill", &["-TERM", &self.daemon.0.id().to_string()]);
        let deadline = Instant::now() + Duration::from_secs(10);
        let status = loop {
            if let Some(s) = self.daemon.0.try_wait().unwrap() {
                break s;
            }
            assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(50));
        };
        let mut stdout = String::new();
        use std::io::Read;
        self.daemon
            .0
            .stdout
            .take()
            .unwrap()
            .read_to_string(&mut stdout)
            .unwrap();
        assert!(status.success(), "exit {status:?}: {stdout}");
        assert_eq!(stdout.matches("ledger balanced").count(), 2, "{stdout}");
        assert!(!self.ctl_a.exists(), "control socket removed at exit");
        let _ = std::fs::remove_dir_all(&self.dir);
        stdout
    }
}

/// `iperf3 -s` in namespace `ns` on `addr`:`port` (`one_off`: `-1`, one test and out),
/// half a second to start listening. Killed when dropped, after a failed assertion too: a
/// server left running keeps its port and every descriptor it inherited (a lock its
/// caller holds, say).
fn iperf3_server(ns: &str, addr: impl Into<std::net::IpAddr>, port: &str, one_off: bool) -> Daemon {
    let addr: std::net::IpAddr = addr.into();
    let mut args = vec!["netns", "exec", ns, "iperf3", "-s"];
    if one_off {
        args.push("-1");
    }
    args.extend(["-p", port, "-B"]);
    let srv = Daemon(
        Command::new("ip")
            .args(args)
            .arg(addr.to_string())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_millis(500));
    srv
}

fn iperf(ns_server: &str, ns_client: &str, server: impl Into<std::net::IpAddr>, udp: bool) -> f64 {
    let server: std::net::IpAddr = server.into();
    let port = if udp { "5212" } else { "5211" };
    let srv = iperf3_server(ns_server, server, port, true);
    let server_s = server.to_string();
    let mut args = vec!["iperf3", "-c", &server_s, "-p", port, "-t", "3", "-J"];
    if udp {
        args.extend(["-u", "-b", "200M", "-l", "1400"]);
    }
    let out = ns_exec(ns_client, &args);
    drop(srv);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "iperf3 failed: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("iperf3 JSON");
    let end = &v["end"];
    let bps = if udp {
        end["sum"]["bits_per_second"].as_f64()
    } else {
        end["sum_received"]["bits_per_second"].as_f64()
    };
    bps.expect("bits_per_second in iperf3 output")
}

#[test]
fn ping_and_iperf3_across_two_namespaces_over_the_simulated_fabric() {
    if !can_run("netns_sim") {
        return;
    }
    // No --allow-faults: fault injection is refused, and the status says so.
    let p = Pair::start(1, &["--tap-offload", "true"]);
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["fault", "inject", "poll-error", "--control"])
        .arg(&p.ctl_a)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("fault injection is disabled: start the daemon with --allow-faults"),
        "{err}"
    );
    assert_eq!(
        p.cli(&["status", "--json"], &p.ctl_a)["allow_faults"],
        false
    );
    for (ns, dst) in [(&p.na.0, B), (&p.nb.0, A)] {
        p.ping(ns, &["-c", "3", "-i", "0.2", "-W", "2", &dst.to_string()]);
    }
    let tcp = iperf(&p.nb.0, &p.na.0, B, false);
    assert!(tcp > 1e6, "TCP through uipoib moved only {tcp} bit/s");
    let udp = iperf(&p.na.0, &p.nb.0, A, true);
    assert!(udp > 1e6, "UDP through uipoib moved only {udp} bit/s");
    eprintln!(
        "netns_sim: iperf3 TCP {:.1} Mbit/s, UDP {:.1} Mbit/s",
        tcp / 1e6,
        udp / 1e6
    );
    // Live counters through the control socket.
    let v = p.cli(&["stats", "--json"], &p.ctl_a);
    // TCP went from a to b, and UDP from b to a: a cut super-frames from its TAP, b
    // joined received segments into super-frames for its TAP.
    assert!(v["tso_frames"].as_u64().unwrap() > 0, "{v}");
    assert!(
        v["tso_segments"].as_u64().unwrap() > v["tso_frames"].as_u64().unwrap(),
        "{v}"
    );
    let vb = p.cli(&["stats", "--json"], &p.ctl_b);
    assert!(vb["gro_frames"].as_u64().unwrap() > 0, "{vb}");
    assert!(
        vb["gro_segments"].as_u64().unwrap() > vb["gro_frames"].as_u64().unwrap(),
        "{vb}"
    );
    assert_eq!(vb["drops"]["tx_bad_offload"], 0, "{vb}");
    assert!(v["rx_packets"].as_u64().unwrap() > 100, "{v}");
    assert!(v["polls"].as_u64().unwrap() > 0, "{v}");
    assert!(v["arp_rx"].as_u64().unwrap() > 0, "{v}");
    p.stop();
}

#[test]
fn restarts_under_iperf3_keep_the_tcp_session() {
    if !can_run("netns_sim restarts") {
        return;
    }
    // The plain TAP path (no vnet headers) is covered here.
    let p = Pair::start(2, &["--tap-offload", "false", "--allow-faults"]);
    assert_eq!(p.cli(&["status", "--json"], &p.ctl_a)["allow_faults"], true);
    p.ping(
        &p.na.0,
        &["-c", "2", "-i", "0.2", "-W", "2", &B.to_string()],
    );
    let srv = iperf3_server(&p.nb.0, B, "5213", true);
    let client = Command::new("ip")
        .args([
            "netns",
            "exec",
            &p.na.0,
            "iperf3",
            "-c",
            &B.to_string(),
            "-p",
            "5213",
        ])
        .args(["-t", "8", "-i", "0.5", "-J"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    p.cli(&["fault", "inject", "poll-error"], &p.ctl_a);
    std::thread::sleep(Duration::from_millis(1500));
    p.cli(&["restart"], &p.ctl_b);
    std::thread::sleep(Duration::from_millis(1500));
    p.cli(
        &["fault", "inject", "async-fatal", "--event", "qp-fatal"],
        &p.ctl_a,
    );
    let out = client.wait_with_output().unwrap();
    drop(srv);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "iperf3 session broke: {text}");
    let v: serde_json::Value = serde_json::from_str(&text).expect("iperf3 JSON");
    let received = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    assert!(received > 1_000_000, "only {received} bytes arrived");
    let intervals = v["intervals"].as_array().unwrap();
    let last = intervals.last().unwrap()["sum"]["bytes"].as_u64().unwrap();
    assert!(
        last > 0,
        "no data in the last interval: the session did not resume"
    );

    for (ctl, want) in [(&p.ctl_a, 2), (&p.ctl_b, 1)] {
        let s = p.cli(&["status", "--json"], ctl);
        assert_eq!(s["state"], "running", "{s}");
        let hist = s["history"].as_array().unwrap();
        assert_eq!(hist.len(), want, "{s}");
        for r in hist {
            assert_eq!(r["ledger_balanced"], true, "{r}");
            assert!(r["recovery_ms"].as_f64().unwrap() < 1000.0, "{r}");
        }
        eprintln!("netns_sim restarts: {}", s["history"]);
    }
    let causes: Vec<_> = p.cli(&["status", "--json"], &p.ctl_a)["history"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["cause"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(causes, ["poll-failed", "async-fatal"]);
    p.stop();
}

/// `uipoib fault run` inside namespace `ns` against the daemon at `ctl`, with the iperf3
/// server at `peer`: (exit code, stdout, stderr, the JSON report if written).
fn fault_run(
    ns: &str,
    file: &std::path::Path,
    ctl: &std::path::Path,
    peer: Ipv4Addr,
    port: &str,
    json: &std::path::Path,
) -> (i32, String, String, serde_json::Value) {
    let _ = std::fs::remove_file(json);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            ns,
            env!("CARGO_BIN_EXE_uipoib"),
            "fault",
            "run",
        ])
        .arg(file)
        .arg("--control")
        .arg(ctl)
        .args([
            "--var",
            &format!("peer={peer}"),
            "--var",
            &format!("port={port}"),
        ])
        .arg("--json")
        .arg(json)
        .output()
        .unwrap();
    let report = std::fs::read_to_string(json)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(serde_json::Value::Null);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        report,
    )
}

#[test]
fn shipped_scenarios_run_against_a_live_daemon_and_fail_when_they_should() {
    if !can_run("netns_sim scenarios") {
        return;
    }
    let p = Pair::start(3, &["--allow-faults"]);
    let port = "5214";
    let srv = iperf3_server(&p.na.0, A, port, false);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/faults");
    let json = p.dir.join("report.json");

    // Shipped scenarios, each under an iperf3 TCP session: every expectation holds.
    for name in ["poll-error", "qp-error", "corrupt-rx"] {
        let (code, stdout, stderr, r) = fault_run(
            &p.nb.0,
            &dir.join(format!("{name}.toml")),
            &p.ctl_b,
            A,
            port,
            &json,
        );
        assert_eq!(code, 0, "{name}: {stdout}\n{stderr}");
        assert_eq!(r["passed"], true, "{name}: {r}");
        assert_eq!(r["scenario"], name);
        let f = &r["faults"][0];
        assert_eq!(f["passed"], true, "{f}");
        assert!(f["expectations"].as_array().unwrap().len() >= 5, "{f}");
        assert_eq!(f["ledger_balanced"], true, "{f}");
        if name == "corrupt-rx" {
            assert_eq!(f["restarts"], 0, "{f}");
            assert!(f["fired"].as_u64().unwrap() > 0, "{f}");
        } else {
            assert_eq!(f["restarts"], 1, "{f}");
            assert!(f["detect_ms"].as_f64().is_some(), "{f}");
            assert!(f["resume_ms"].as_f64().is_some(), "{f}");
        }
        assert!(stdout.contains("PASSED"), "{stdout}");
        eprintln!("netns_sim scenario {name}:\n{stdout}");
    }

    // An expectation that cannot hold fails the run (exit 1) and says which.
    let wrong = p.dir.join("wrong.toml");
    let text = std::fs::read_to_string(dir.join("poll-error.toml"))
        .unwrap()
        .replace("restarts = 1", "restarts = 0");
    std::fs::write(&wrong, text).unwrap();
    let (code, stdout, _, r) = fault_run(&p.nb.0, &wrong, &p.ctl_b, A, port, &json);
    assert_eq!(code, 1, "{stdout}");
    assert_eq!(r["passed"], false, "{r}");
    let failures: Vec<&str> = r["failures"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|f| f.as_str())
        .collect();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert!(failures[0].contains("restarts = 0"), "{failures:?}");

    // An invalid file is refused before anything runs (exit 2), naming line and field.
    std::fs::write(
        &wrong,
        "name = \"bad\"\n[[step]]\ndo = \"inject\"\nfault = \"poll-error\"\nafter = -3\n",
    )
    .unwrap();
    let restarts_before = p.cli(&["status", "--json"], &p.ctl_b)["restarts"].clone();
    let (code, _, stderr, _) = fault_run(&p.nb.0, &wrong, &p.ctl_b, A, port, &json);
    assert_eq!(code, 2, "{stderr}");
    assert!(stderr.contains("wrong.toml:5: step[1].after:"), "{stderr}");
    assert_eq!(
        p.cli(&["status", "--json"], &p.ctl_b)["restarts"],
        restarts_before
    );
    drop(srv);
    p.stop();
}

#[test]
fn sim_pair_leaves_a_file_at_its_control_path_alone() {
    if !can_run("netns_sim control path") {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let id = std::process::id() % 10_000;
    let na = Netns::new(&format!("uipt-a-{id}-4"));
    let nb = Netns::new(&format!("uipt-b-{id}-4"));
    let dir = std::env::temp_dir().join(format!("uipoib-netns-{id}-4"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let file = dir.join("notes.txt");
    std::fs::write(&file, "not a socket\n").unwrap();
    let child = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["sim-pair", "--netns-a", &na.0, "--netns-b", &nb.0])
        .args([
            "--tap-a",
            &format!("ua{id}x4"),
            "--tap-b",
            &format!("ub{id}x4"),
        ])
        .arg("--control-a")
        .arg(&file)
        .arg("--control-b")
        .arg(dir.join("b.sock"))
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // It must give up at once; one still running after 20 s has taken the path.
    let mut daemon = Daemon(child);
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let left = std::fs::symlink_metadata(&file).map(|m| m.file_type());
            panic!("sim-pair started on a regular file at its control path (now: {left:?})");
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut err = String::new();
    use std::io::Read;
    daemon
        .0
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    assert_eq!(status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!(
            "control socket path {} is a regular file",
            file.display()
        )),
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&file).unwrap(), "not a socket\n");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The TAP's MAC in `ns` (from `ip -o link show`).
fn tap_mac(ns: &str, tap: &str) -> [u8; 6] {
    let text = run("ip", &["-n", ns, "-o", "link", "show", "dev", tap]);
    let hex = text
        .split_whitespace()
        .skip_while(|w| *w != "link/ether")
        .nth(1)
        .unwrap_or_else(|| panic!("no MAC in {text}"));
    let mut mac = [0u8; 6];
    for (o, h) in mac.iter_mut().zip(hex.split(':')) {
        *o = u8::from_str_radix(h, 16).unwrap();
    }
    mac
}

/// Waits until `tap` in `ns` has every address of `want` (as `ip -6 addr` prints them,
/// `ADDR/PREFIX scope SCOPE`) past duplicate address detection; returns the listing.
fn wait_ipv6(ns: &str, tap: &str, want: &[String]) -> String {
    wait_ipv6_addrs(ns, tap, want, true)
}

/// [`wait_ipv6`], and with `settled` false, tentative addresses count too.
fn wait_ipv6_addrs(ns: &str, tap: &str, want: &[String], settled: bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = run("ip", &["-n", ns, "-6", "-o", "addr", "show", "dev", tap]);
        assert!(!text.contains("dadfailed"), "{tap} in {ns}: {text}");
        let ready = want.iter().all(|w| {
            text.lines().any(|l| {
                l.contains(&format!("inet6 {w} ")) && !(settled && l.contains("tentative"))
            })
        });
        if ready {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "{tap} in {ns} never showed {want:?}{}: {text}",
            if settled { " past DAD" } else { "" }
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Dual stack: each TAP has its IPv4 address, its IPv6 one and the link-local one the
/// kernel derives from the TAP's MAC; `ping -6` works between the global addresses and
/// between the link-local ones.
#[test]
fn ipv6_addresses_and_ping6_across_two_namespaces() {
    if !can_run("netns_sim ipv6") {
        return;
    }
    let (g_a, g_b) = ("2001:2:0:1::1", "2001:2:0:1::2");
    let p = Pair::start(
        5,
        &[
            "--addr-a",
            "198.18.2.1/24",
            "--addr-a",
            &format!("{g_a}/64"),
            "--addr-b",
            &format!("{g_b}/64"),
            "--addr-b",
            "198.18.2.2/24",
        ],
    );
    let id = std::process::id() % 10_000;
    let (tap_a, tap_b) = (format!("ua{id}x5"), format!("ub{id}x5"));
    let mut link_local = Vec::new();
    for (ns, tap, g, ctl) in [
        (&p.na.0, &tap_a, g_a, &p.ctl_a),
        (&p.nb.0, &tap_b, g_b, &p.ctl_b),
    ] {
        let s = p.cli(&["status", "--json"], ctl);
        assert_eq!(s["addr6"], serde_json::json!([format!("{g}/64")]), "{s}");
        let ll = uipoib::wire::ipv6::link_local_for_mac(tap_mac(ns, tap));
        let text = wait_ipv6(
            ns,
            tap,
            &[
                format!("{g}/64 scope global"),
                format!("{ll}/64 scope link"),
            ],
        );
        eprintln!("netns_sim ipv6: {tap} in {ns}:\n{text}");
        link_local.push(ll);
    }
    // IPv4 alongside.
    p.ping(
        &p.na.0,
        &["-c", "2", "-i", "0.2", "-W", "2", &B.to_string()],
    );
    let (ll_a, ll_b) = (link_local[0].to_string(), link_local[1].to_string());
    for (ns, args) in [
        (&p.na.0, vec![g_b]),
        (&p.nb.0, vec![g_a]),
        (&p.na.0, vec!["-I", &tap_a, &ll_b]),
        (&p.nb.0, vec!["-I", &tap_b, &ll_a]),
    ] {
        let mut cmd = vec!["-6", "-c", "3", "-i", "0.2", "-W", "2"];
        cmd.extend(args.iter().copied());
        p.ping(ns, &cmd);
    }
    // TCP over IPv6, both ways.
    let g_b6: std::net::Ipv6Addr = g_b.parse().unwrap();
    let g_a6: std::net::Ipv6Addr = g_a.parse().unwrap();
    let ab = iperf(&p.nb.0, &p.na.0, g_b6, false);
    let ba = iperf(&p.na.0, &p.nb.0, g_a6, false);
    eprintln!("netns_sim ipv6: iperf3 TCP a->b {ab:.0} bit/s, b->a {ba:.0} bit/s");
    assert!(ab > 0.0 && ba > 0.0);
    for ctl in [&p.ctl_a, &p.ctl_b] {
        let s = p.cli(&["stats", "--json"], ctl);
        assert!(
            s["nd_rx"].as_u64().unwrap() > 0 && s["nd_tx"].as_u64().unwrap() > 0,
            "{s}"
        );
        let drops = s["drops"].as_object().unwrap();
        let bad: Vec<_> = drops
            .iter()
            .filter(|(k, v)| k.contains("nd") && v.as_u64() != Some(0))
            .collect();
        assert!(bad.is_empty(), "neighbour discovery drops: {bad:?}");
    }
    p.stop();
}

/// Duplicate address detection through the datapath: A and B are given the same address,
/// and a kernel marks it dadfailed (the other's probe or its answer came through).
#[test]
fn a_duplicate_ipv6_address_fails_duplicate_address_detection() {
    if !can_run("netns_sim ipv6 dad") {
        return;
    }
    let g = "2001:2:0:1::1";
    let p = Pair::start(
        7,
        &[
            "--addr-a",
            "198.18.2.1/24",
            "--addr-a",
            &format!("{g}/64"),
            "--addr-b",
            "198.18.2.2/24",
            "--addr-b",
            &format!("{g}/64"),
        ],
    );
    let id = std::process::id() % 10_000;
    let (tap_a, tap_b) = (format!("ua{id}x7"), format!("ub{id}x7"));
    let deadline = Instant::now() + Duration::from_secs(15);
    let (text_a, text_b) = loop {
        let a = run(
            "ip",
            &["-n", &p.na.0, "-6", "-o", "addr", "show", "dev", &tap_a],
        );
        let b = run(
            "ip",
            &["-n", &p.nb.0, "-6", "-o", "addr", "show", "dev", &tap_b],
        );
        if a.contains("dadfailed") || b.contains("dadfailed") {
            break (a, b);
        }
        assert!(Instant::now() < deadline, "no dadfailed:\na: {a}\nb: {b}");
        std::thread::sleep(Duration::from_millis(100));
    };
    eprintln!("netns_sim dad:\na: {text_a}\nb: {text_b}");
    let failed = |t: &str| {
        t.lines()
            .any(|l| l.contains(&format!("inet6 {g}/64")) && l.contains("dadfailed"))
    };
    // A side lost the address only if the other's probe or defence crossed the fabric;
    // probes that cross while both are tentative fail both (RFC 4862 §5.4.3).
    assert!(failed(&text_a) || failed(&text_b));
    // The probe was carried and learned from by no one.
    let nd = |ctl| {
        p.cli(&["stats", "--json"], ctl)["nd_not_learned"]
            .as_u64()
            .unwrap()
    };
    assert!(nd(&p.ctl_a) + nd(&p.ctl_b) > 0);
    p.stop();
}

/// IPv6 addresses on a link whose MTU is below IPv6's 1280 bytes are refused when the
/// TAP is configured, naming the MTU.
#[test]
fn ipv6_addresses_need_an_mtu_of_1280() {
    if !can_run("netns_sim ipv6 mtu") {
        return;
    }
    let id = std::process::id() % 10_000;
    let na = Netns::new(&format!("uipt-a-{id}-6"));
    let nb = Netns::new(&format!("uipt-b-{id}-6"));
    let dir = std::env::temp_dir().join(format!("uipoib-netns-{id}-6"));
    std::fs::create_dir_all(&dir).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["sim-pair", "--netns-a", &na.0, "--netns-b", &nb.0])
        .args([
            "--tap-a",
            &format!("ua{id}x6"),
            "--tap-b",
            &format!("ub{id}x6"),
        ])
        .args(["--port-mtu", "1024"])
        .args(["--addr-a", "198.18.2.1/24", "--addr-a", "2001:2:0:1::1/64"])
        .arg("--control-a")
        .arg(dir.join("a.sock"))
        .arg("--control-b")
        .arg(dir.join("b.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("MTU 1020 is below the 1280 bytes IPv6 needs"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// `Tap::configure` on a real TAP in a namespace: the IPv4 and IPv6 addresses, the
/// link-local one from the MAC; `Tap::reconfigure` to another MAC: the link-local address
/// follows it, the old one is gone, and the IPv6 and IPv4 addresses are there again. A
/// TAP without IPv6 addresses has the link-local address alone.
#[test]
fn tap_configure_and_reconfigure_derive_the_link_local_from_the_mac() {
    if !can_run("netns_sim tap configure") {
        return;
    }
    use uipoib::wire::eth::Mac;
    use uipoib::wire::ipv6::link_local_for_mac;
    let id = std::process::id() % 10_000;
    let ns = Netns::new(&format!("uipt-c-{id}-7"));
    let name = format!("uc{id}x7");
    let tap = uipoib::tap::Tap::create(&name, false).unwrap();
    let (mac1, mac2) = ([0x02, 0, 198, 18, 7, 1], [0x02, 0, 198, 18, 7, 2]);
    let g = "2001:2:0:7::1/64";
    tap.configure(
        Mac(mac1),
        1500,
        "198.18.7.1/24".parse().unwrap(),
        &[g.parse().unwrap()],
        Some(&ns.0),
    )
    .unwrap();
    let ll1 = format!("{}/64 scope link", link_local_for_mac(mac1));
    let text = wait_ipv6_addrs(
        &ns.0,
        &name,
        &[format!("{g} scope global"), ll1.clone()],
        false,
    );
    assert_eq!(text.lines().count(), 2, "{text}");
    let sysctl = |key: &str| {
        let o = ns_exec(
            &ns.0,
            &["sysctl", "-n", &format!("net/ipv6/conf/{name}/{key}")],
        );
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    };
    assert_eq!(sysctl("disable_ipv6"), "0");
    assert_eq!(sysctl("addr_gen_mode"), "0");
    // Duplicate address detection stays on.
    assert_ne!(sysctl("dad_transmits"), "0");
    assert!(!text.contains("nodad"), "{text}");

    uipoib::tap::Tap::reconfigure(&tap, Mac(mac2), 1400).unwrap();
    let ll2 = format!("{}/64 scope link", link_local_for_mac(mac2));
    let text = wait_ipv6_addrs(&ns.0, &name, &[format!("{g} scope global"), ll2], false);
    assert!(
        !text.contains(&ll1),
        "the old link-local address stayed: {text}"
    );
    assert_eq!(text.lines().count(), 2, "{text}");
    let link = run("ip", &["-n", &ns.0, "-o", "link", "show", "dev", &name]);
    assert!(
        link.contains("mtu 1400") && link.contains("02:00:c6:12:07:02"),
        "{link}"
    );
    let v4 = run(
        "ip",
        &["-n", &ns.0, "-4", "-o", "addr", "show", "dev", &name],
    );
    assert!(v4.contains("inet 198.18.7.1/24"), "{v4}");

    // Without IPv6 addresses, IPv6 stays off: no link-local address, no kernel chatter.
    let name4 = format!("ud{id}x7");
    let tap4 = uipoib::tap::Tap::create(&name4, false).unwrap();
    tap4.configure(
        Mac(mac1),
        1500,
        "198.18.8.1/24".parse().unwrap(),
        &[],
        Some(&ns.0),
    )
    .unwrap();
    uipoib::tap::Tap::reconfigure(&tap4, Mac(mac2), 1500).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    let o = ns_exec(
        &ns.0,
        &[
            "sysctl",
            "-n",
            &format!("net/ipv6/conf/{name4}/disable_ipv6"),
        ],
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    // An IPv4-only interface has IPv6 too: the link-local address of its final MAC, and
    // nothing else.
    let v6 = run(
        "ip",
        &["-n", &ns.0, "-6", "-o", "addr", "show", "dev", &name4],
    );
    let ll = uipoib::wire::ipv6::link_local_for_mac(mac2).to_string();
    assert_eq!(v6.lines().count(), 1, "{v6}");
    assert!(v6.contains(&format!("{ll}/64")), "{v6}");

    // A namespace that is not there: the error names the step and the path looked for.
    let lost = uipoib::tap::Tap::create(&format!("ue{id}x7"), false).unwrap();
    let e = lost
        .configure(
            Mac(mac1),
            1500,
            "198.18.9.1/24".parse().unwrap(),
            &[],
            Some("uipt-no-such-ns"),
        )
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("moving it to network namespace uipt-no-such-ns failed")
            && e.contains("/run/netns/uipt-no-such-ns"),
        "{e}"
    );
}

#[test]
fn the_daemon_tells_a_service_manager_ready_status_watchdog_and_stopping() {
    if !can_run("the_daemon_tells_a_service_manager_ready_status_watchdog_and_stopping") {
        return;
    }
    use std::os::unix::net::UnixDatagram;
    let dir = std::env::temp_dir().join(format!("uipoib-notify-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("notify.sock");
    let sock = UnixDatagram::bind(&path).unwrap();
    sock.set_read_timeout(Some(Duration::from_secs(20)))
        .unwrap();
    // A fake service manager: NOTIFY_SOCKET, and a 400 ms watchdog.
    let pair = Pair::start_env(
        9,
        &[],
        &[
            ("NOTIFY_SOCKET", path.to_str().unwrap()),
            ("WATCHDOG_USEC", "400000"),
        ],
    );
    let mut got = String::new();
    let mut buf = [0u8; 512];
    let deadline = Instant::now() + Duration::from_secs(20);
    while !(got.contains("READY=1") && got.matches("WATCHDOG=1").count() >= 2) {
        assert!(Instant::now() < deadline, "so far: {got:?}");
        let n = sock.recv(&mut buf).expect("a notification");
        got.push_str(&String::from_utf8_lossy(&buf[..n]));
        got.push('\n');
    }
    // Ready only once both interfaces run, and the status names them.
    let ready = got.find("READY=1").unwrap();
    let status = got.find("STATUS=").unwrap();
    assert!(got[status..].contains(": running"), "{got}");
    assert!(
        got[..ready].lines().all(|l| !l.starts_with("WATCHDOG")),
        "{got}"
    );
    pair.stop();
    let mut tail = String::new();
    while let Ok(n) = sock.recv(&mut buf) {
        tail.push_str(&String::from_utf8_lossy(&buf[..n]));
        if tail.contains("STOPPING=1") {
            break;
        }
    }
    assert!(tail.contains("STOPPING=1"), "{tail:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Not a test by itself: what the socket-charge test runs in a namespace, through
/// `ip netns exec` and this very binary, as `UIPOIB_UDP_HELPER` says:
/// - `recv ADDR`: bind a UDP socket to ADDR, say `udp-helper bound`, read nothing until a
///   line comes on stdin, then say what the kernel charged the socket for what waits in
///   it (`/proc/net/udp`'s rx_queue), how many datagrams that is and how many it dropped;
/// - `send ADDR N LEN`: N datagrams of LEN bytes to ADDR, 2 ms apart.
#[test]
#[ignore = "run by a_full_mtu_datagram_is_charged_to_its_socket_as_a_page_and_a_head"]
fn udp_helper() {
    use std::io::{BufRead, Write};
    let Ok(what) = std::env::var("UIPOIB_UDP_HELPER") else {
        eprintln!(
            "udp_helper: nothing to do without UIPOIB_UDP_HELPER (the socket-charge test runs it)"
        );
        return;
    };
    let args: Vec<&str> = what.split_whitespace().collect();
    match args[..] {
        ["recv", addr] => {
            let s = std::net::UdpSocket::bind(addr).unwrap();
            let port = s.local_addr().unwrap().port();
            println!("udp-helper bound");
            std::io::stdout().flush().unwrap();
            let mut line = String::new();
            std::io::stdin().lock().read_line(&mut line).unwrap();
            // (charged bytes, drops) from /proc/net/udp: columns sl local rem st
            // tx_queue:rx_queue ... drops (the last).
            let read = || -> (u64, u64) {
                let table = std::fs::read_to_string("/proc/net/udp").unwrap();
                let row = table
                    .lines()
                    .find(|l| {
                        l.split_whitespace()
                            .nth(1)
                            .is_some_and(|a| a.ends_with(&format!(":{port:04X}")))
                    })
                    .unwrap_or_else(|| panic!("port {port} not in /proc/net/udp:\n{table}"));
                let cols: Vec<&str> = row.split_whitespace().collect();
                let rx_queue = cols[4].split(':').nth(1).unwrap();
                let charged = u64::from_str_radix(rx_queue, 16).unwrap();
                (charged, cols.last().unwrap().parse().unwrap())
            };
            // Until nothing more arrives: the same reading 300 ms apart (5 s at most).
            let mut last = read();
            for _ in 0..17 {
                std::thread::sleep(Duration::from_millis(300));
                let now = read();
                if now == last {
                    break;
                }
                last = now;
            }
            let (charged, drops) = last;
            s.set_nonblocking(true).unwrap();
            let mut buf = [0u8; 65536];
            let mut queued = 0;
            while s.recv(&mut buf).is_ok() {
                queued += 1;
            }
            // Nothing came in while the queue was read: the charge is the count's.
            let after = read().1;
            println!(
                "udp-helper charged={charged} queued={queued} drops={drops} drops_after={after}"
            );
        }
        ["send", addr, n, len] => {
            let s = std::net::UdpSocket::bind("0.0.0.0:0").unwrap();
            let payload = vec![0x5au8; len.parse().unwrap()];
            for _ in 0..n.parse::<u32>().unwrap() {
                s.send_to(&payload, addr).unwrap();
                std::thread::sleep(Duration::from_millis(2));
            }
            println!("udp-helper sent");
        }
        _ => panic!("UIPOIB_UDP_HELPER={what:?}: not `recv ADDR` or `send ADDR N LEN`"),
    }
}

/// This binary's `udp_helper` in namespace `ns`, doing `what`.
fn udp_helper_in(ns: &str, what: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns])
        .arg(std::env::current_exe().unwrap())
        .args([
            "udp_helper",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("UIPOIB_UDP_HELPER", what);
    c
}

/// A full-MTU datagram the daemon writes to the TAP is charged to the receiving socket as
/// a page and a small head (`LINEAR_HINT` in its `virtio_net_hdr`), not as one buffer
/// from the 8 KiB slab: with the hint 4,928 bytes for a 4,040-byte datagram here, without
/// it 8,448, so a socket buffer holds 1.7x the datagrams before it drops.
#[test]
fn a_full_mtu_datagram_is_charged_to_its_socket_as_a_page_and_a_head() {
    if !can_run("netns_sim socket charge") {
        return;
    }
    use std::io::{BufRead, BufReader, Write};
    let p = Pair::start(10, &["--tap-offload", "true"]);
    p.ping(
        &p.na.0,
        &["-c", "2", "-i", "0.2", "-W", "2", &B.to_string()],
    );
    let mut recv = Daemon(
        udp_helper_in(&p.nb.0, &format!("recv {B}:9000"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let mut out = BufReader::new(recv.0.stdout.take().unwrap());
    let mut line = String::new();
    let mut said = String::new();
    // The harness writes its own words before the helper's on the same line.
    while !line.contains("udp-helper bound") {
        line.clear();
        assert!(
            out.read_line(&mut line).unwrap() > 0,
            "the receiver ended: {said}"
        );
        said += &line;
    }
    // 60 datagrams of 4,040 bytes (a 4,082-byte frame; the pair's MTU is 4,092) fill a default
    // 208 KiB buffer either way; the charge per datagram is what tells.
    let (n, len) = (60u64, 4040);
    let sent = udp_helper_in(&p.na.0, &format!("send {B}:9000 {n} {len}"))
        .output()
        .unwrap();
    assert!(
        sent.status.success(),
        "{}{}",
        String::from_utf8_lossy(&sent.stdout),
        String::from_utf8_lossy(&sent.stderr)
    );
    let mut stdin = recv.0.stdin.take().unwrap();
    writeln!(stdin, "go").unwrap();
    let mut result = String::new();
    while !result.contains("udp-helper charged=") {
        result.clear();
        assert!(
            out.read_line(&mut result).unwrap() > 0,
            "no result from the receiver"
        );
    }
    let field = |k: &str| -> u64 {
        result
            .split_whitespace()
            .find_map(|kv| kv.strip_prefix(k))
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{k} in {result:?}"))
    };
    let (charged, queued, drops) = (field("charged="), field("queued="), field("drops="));
    assert_eq!(
        field("drops_after="),
        drops,
        "a datagram came in late: {result}"
    );
    eprintln!("netns_sim socket charge: {result}");
    let stats = p.cli(&["stats", "--json"], &p.ctl_b);
    assert_eq!(
        queued + drops,
        n,
        "every datagram reached the socket: {stats}"
    );
    assert!(queued > 0, "{result}");
    let each = charged / queued;
    // A page (4,096 bytes) and a head from a 512-byte slab with the sk_buff: 4,928 bytes
    // here. One linear buffer from the 8 KiB slab would be 8,448.
    assert!(
        (4096..=4096 + 1536).contains(&each),
        "{each} bytes charged per {len}-byte datagram ({result}): not a page and a small head"
    );
    drop(recv);
    p.stop();
}
