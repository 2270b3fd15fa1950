//! Whole-daemon test on the host: `uipoib sim-pair` runs two interfaces over the
//! simulated fabric with real TAP devices, each in its own network namespace; ping and
//! iperf3 (TCP and UDP) run across them, `uipoib stats` reads the live counters, and
//! SIGTERM tears everything down with balanced ledgers.
//!
//! Needs root, /dev/net/tun, `ip` and `iperf3`; without them it says why and skips.

use std::net::Ipv4Addr;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

struct Netns(String);

impl Netns {
    fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run("ip", &["netns", "add", name]);
        run("ip", &["-n", name, "link", "set", "lo", "up"]);
        Netns(name.to_string())
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

struct Daemon(Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

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
    // Root, read from /proc/self/status (the effective UID is the second field).
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid0 = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(1) == Some("0"));
    if !uid0 {
        return Some("not running as root (network namespaces and TAP devices need it)".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
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

fn iperf(ns_server: &str, ns_client: &str, server: Ipv4Addr, udp: bool) -> f64 {
    let port = if udp { "5212" } else { "5211" };
    let mut srv = Command::new("ip")
        .args([
            "netns", "exec", ns_server, "iperf3", "-s", "-1", "-p", port, "-B",
        ])
        .arg(server.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let server_s = server.to_string();
    let mut args = vec!["iperf3", "-c", &server_s, "-p", port, "-t", "3", "-J"];
    if udp {
        args.extend(["-u", "-b", "200M", "-l", "1400"]);
    }
    let out = ns_exec(ns_client, &args);
    let _ = srv.kill();
    let _ = srv.wait();
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
    if let Some(why) = missing_prerequisite() {
        eprintln!("SKIPPED netns_sim: {why}");
        return;
    }
    let id = std::process::id() % 100_000;
    let (na, nb) = (
        Netns::new(&format!("uipt-a-{id}")),
        Netns::new(&format!("uipt-b-{id}")),
    );
    let (tap_a, tap_b) = (format!("uta{id}"), format!("utb{id}"));
    let dir = std::env::temp_dir().join(format!("uipoib-netns-{id}"));
    std::fs::create_dir_all(&dir).unwrap();
    let (ctl_a, ctl_b) = (dir.join("a.sock"), dir.join("b.sock"));
    let child = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["sim-pair", "--netns-a", &na.0, "--netns-b", &nb.0])
        .args(["--tap-a", &tap_a, "--tap-b", &tap_b])
        .args(["--control-a"])
        .arg(&ctl_a)
        .args(["--control-b"])
        .arg(&ctl_b)
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut daemon = Daemon(child);
    wait_up(&na.0, &tap_a);
    wait_up(&nb.0, &tap_b);

    let a: Ipv4Addr = "198.18.2.1".parse().unwrap();
    let b: Ipv4Addr = "198.18.2.2".parse().unwrap();
    for (ns, dst) in [(&na.0, b), (&nb.0, a)] {
        let o = ns_exec(
            ns,
            &["ping", "-c", "3", "-i", "0.2", "-W", "2", &dst.to_string()],
        );
        assert!(
            o.status.success(),
            "ping {dst} from {ns}: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let tcp = iperf(&nb.0, &na.0, b, false);
    assert!(tcp > 1e6, "TCP through uipoib moved only {tcp} bit/s");
    let udp = iperf(&na.0, &nb.0, a, true);
    assert!(udp > 1e6, "UDP through uipoib moved only {udp} bit/s");
    eprintln!(
        "netns_sim: iperf3 TCP {:.1} Mbit/s, UDP {:.1} Mbit/s",
        tcp / 1e6,
        udp / 1e6
    );

    // Live counters through the control socket.
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(["stats", "--json", "--control"])
        .arg(&ctl_a)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(v["rx_packets"].as_u64().unwrap() > 100, "{v}");
    assert!(v["polls"].as_u64().unwrap() > 0, "{v}");
    assert!(v["arp_rx"].as_u64().unwrap() > 0, "{v}");

    // SIGTERM: orderly teardown, balanced ledgers, exit 0.
    run("kill", &["-TERM", &daemon.0.id().to_string()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(s) = daemon.0.try_wait().unwrap() {
            break s;
        }
        assert!(Instant::now() < deadline, "daemon did not stop on SIGTERM");
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stdout = String::new();
    use std::io::Read;
    daemon
        .0
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut stdout)
        .unwrap();
    assert!(status.success(), "exit {status:?}: {stdout}");
    assert_eq!(stdout.matches("ledger balanced").count(), 2, "{stdout}");
    assert!(!ctl_a.exists(), "control socket removed at exit");
    let _ = std::fs::remove_dir_all(&dir);
}
