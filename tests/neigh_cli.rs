//! `uipoib neigh` and `uipoib stats --watch`, the binary against a control socket.
//!
//! In-process: two interfaces on the simulated fabric learn each other by ARP; one
//! publishes its table at housekeeping into the view a [`ControlServer`] serves, and
//! `uipoib neigh` must list the peer (address, QPN, GID, MAC) as text and as JSON.
//! `stats --watch` reads counters a thread keeps moving, must print blocks with a
//! positive rate, stop with exit 0 on SIGTERM, and fail naming the socket when the
//! server goes away.
//!
//! As root with network namespaces: the same over a whole `uipoib sim-pair`, the
//! neighbour learned from a real ping (IPv4 and IPv6), `stats --watch` while ping
//! traffic flows.

mod common;

use std::io::{BufRead, BufReader};
use std::net::Ipv4Addr;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::netns::{Daemon, Netns, is_ci, root_or_tun_missing};
use common::{FakeTap, fabric, introduce, open, params};
use uipoib::iface::Interface;
use uipoib::iface::neigh::NeighView;
use uipoib::iface::stats::{self, Stats};
use uipoib::runtime::control::{ControlServer, Status};

const A: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

fn tmp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("uipoib-neigh-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir
}

fn uipoib(args: &[&str], ctl: &Path) -> (Option<i32>, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_uipoib"))
        .args(args)
        .arg("--control")
        .arg(ctl)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn neigh_lists_a_peer_learned_over_the_simulated_fabric() {
    let f = fabric(4096);
    let view = NeighView::default();
    let mut pa = params("sim0", "198.18.2.1/24", 64, 64);
    pa.neigh_view = view.clone();
    let st = Arc::new(Stats::default());
    let mut a = Interface::open(&f, &pa, st.clone(), 1, &mut None).unwrap();
    let mut b = open(&f, "sim1", "198.18.2.2/24", 64, 64);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    let dir = tmp_dir("list");
    let ctl = dir.join("a.sock");
    let _srv = ControlServer::start(
        &ctl,
        st,
        Arc::new(Mutex::new(Status::default())),
        view,
        None,
        None,
    )
    .unwrap();
    // Nothing published yet: an empty table prints nothing, and succeeds.
    let (code, out, err) = uipoib(&["neigh"], &ctl);
    assert_eq!((code, out.as_str()), (Some(0), ""), "{err}");
    let (code, out, err) = uipoib(&["neigh", "--json"], &ctl);
    assert_eq!((code, out.trim()), (Some(0), "[]"), "{err}");

    introduce(&mut a, &ta, &mut b, &tb, A, B);
    a.housekeeping(Instant::now()).unwrap();
    let peer = b.hw_addr();

    let (code, out, err) = uipoib(&["neigh"], &ctl);
    assert_eq!(code, Some(0), "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 1, "{out}");
    let want = format!(
        "198.18.2.2 lladdr {} gid {} qpn {} ah ",
        b.mac(),
        peer.gid,
        peer.qpn
    );
    assert!(lines[0].starts_with(&want), "{out}\nwant {want}");
    assert!(lines[0].ends_with(" REACHABLE"), "{out}");

    let (code, out, err) = uipoib(&["neigh", "--json"], &ctl);
    assert_eq!(code, Some(0), "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    let arr = v.as_array().expect("a JSON array");
    assert_eq!(arr.len(), 1, "{v}");
    let e = &arr[0];
    assert_eq!(e["addrs"], serde_json::json!(["198.18.2.2"]), "{e}");
    assert_eq!(e["qpn"], u64::from(peer.qpn), "{e}");
    assert_eq!(e["gid"], peer.gid.to_string(), "{e}");
    assert_eq!(e["mac"], b.mac().to_string(), "{e}");
    assert_eq!(e["state"], "REACHABLE", "{e}");
    assert!(e["last_seen_ms"].as_u64().is_some(), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn neigh_without_a_daemon_says_so() {
    let dir = tmp_dir("none");
    let ctl = dir.join("nobody.sock");
    let (code, out, err) = uipoib(&["neigh"], &ctl);
    assert_eq!((code, out.as_str()), (Some(1), ""));
    assert!(
        err.contains("no uipoib daemon is listening on") && err.contains(ctl.to_str().unwrap()),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A running `uipoib stats --watch`, its stdout lines arriving on a channel.
struct Watch {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Watch {
    /// Every 0.2 s unless `extra` gives `--interval`.
    fn start(ctl: &Path, extra: &[&str]) -> Watch {
        let every: &[&str] = if extra.contains(&"--interval") {
            &[]
        } else {
            &["--interval", "0.2"]
        };
        let mut child = Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(["stats", "--watch"])
            .args(every)
            .args(extra)
            .arg("--control")
            .arg(ctl)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Watch { child, lines }
    }

    /// Lines until `done` says so (given every line so far), within `within`.
    fn until(&self, within: Duration, mut done: impl FnMut(&[String]) -> bool) -> Vec<String> {
        let end = Instant::now() + within;
        let mut got = Vec::new();
        while !done(&got) {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => got.push(l),
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    panic!("stats --watch ended its output early, after: {got:#?}")
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    panic!("within {within:?}, only: {got:#?}")
                }
            }
        }
        got
    }

    /// Wait for the exit; (code, stderr).
    fn wait(mut self, within: Duration) -> (Option<i32>, String) {
        let end = Instant::now() + within;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            if Instant::now() > end {
                let _ = self.child.kill();
                panic!("stats --watch did not exit within {within:?}");
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        let mut err = String::new();
        use std::io::Read;
        self.child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut err)
            .unwrap();
        (status.code(), err)
    }

    fn term(&self) {
        let st = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status()
            .unwrap();
        assert!(st.success());
    }
}

/// The rate column of `counter`'s row in a plain block, if listed.
fn rate_of(line: &str, counter: &str) -> Option<f64> {
    let cols: Vec<&str> = line.split_whitespace().collect();
    match cols.as_slice() {
        [name, _total, rate] if *name == counter => rate.parse().ok(),
        _ => None,
    }
}

/// Blocks (a `--- ` timestamp line starts each) in which `counter` has a positive rate.
fn blocks_with_rate(lines: &[String], counter: &str) -> usize {
    let mut n = 0;
    let mut this = false;
    for l in lines {
        if l.starts_with("--- ") {
            n += usize::from(this);
            this = false;
        } else if rate_of(l, counter).is_some_and(|r| r > 0.0) {
            this = true;
        }
    }
    n + usize::from(this)
}

/// A server whose `rx_packets` a thread raises by 10 every 10 ms until dropped.
struct Moving {
    _srv: ControlServer,
    stop: Arc<AtomicBool>,
}

impl Moving {
    fn start(ctl: &Path) -> Moving {
        let st = Arc::new(Stats::default());
        let srv = ControlServer::start(
            ctl,
            st.clone(),
            Arc::new(Mutex::new(Status::default())),
            NeighView::default(),
            None,
            None,
        )
        .unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        std::thread::spawn(move || {
            while !s2.load(Ordering::SeqCst) {
                stats::add(&st.rx_packets, 10);
                std::thread::sleep(Duration::from_millis(10));
            }
        });
        Moving { _srv: srv, stop }
    }
}

impl Drop for Moving {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
    }
}

#[test]
fn stats_watch_prints_blocks_with_rates_and_stops_on_sigterm() {
    let dir = tmp_dir("watch");
    let ctl = dir.join("w.sock");
    let _m = Moving::start(&ctl);
    let w = Watch::start(&ctl, &[]);
    let lines = w.until(Duration::from_secs(5), |l| {
        blocks_with_rate(l, "rx_packets") >= 2
    });
    assert!(
        lines.iter().all(|l| !l.contains('\x1b')),
        "no escape codes when stdout is not a terminal: {lines:?}"
    );
    assert!(
        lines[0].starts_with("--- ") && lines[0].ends_with("s) ---"),
        "{lines:?}"
    );
    assert!(lines[1].starts_with("counter"), "{lines:?}");
    // About 1000/s (10 every 10 ms, less the sleeps' slack): not a total, not a huge
    // number.
    let r = lines.iter().find_map(|l| rate_of(l, "rx_packets")).unwrap();
    assert!(r > 100.0 && r < 2000.0, "rate {r}: {lines:?}");
    w.term();
    let (code, err) = w.wait(Duration::from_secs(3));
    assert_eq!(code, Some(0), "SIGTERM ends the watch cleanly: {err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stats_watch_json_prints_one_object_per_interval() {
    let dir = tmp_dir("wjson");
    let ctl = dir.join("w.sock");
    let _m = Moving::start(&ctl);
    let w = Watch::start(&ctl, &["--json"]);
    let lines = w.until(Duration::from_secs(5), |l| l.len() >= 2);
    for l in &lines {
        let v: serde_json::Value = serde_json::from_str(l).unwrap();
        let rate = v["changed"]["rx_packets"]["rate"].as_f64().unwrap_or(0.0);
        assert!(rate > 0.0, "{l}");
        assert!(v["interval_s"].as_f64().unwrap() > 0.1, "{l}");
    }
    w.term();
    assert_eq!(w.wait(Duration::from_secs(3)).0, Some(0));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stats_watch_fails_naming_the_socket_when_the_daemon_goes_away() {
    let dir = tmp_dir("gone");
    let ctl = dir.join("g.sock");
    let m = Moving::start(&ctl);
    let w = Watch::start(&ctl, &[]);
    w.until(Duration::from_secs(5), |l| {
        l.iter().any(|l| l.starts_with("--- "))
    });
    drop(m);
    let (code, err) = w.wait(Duration::from_secs(3));
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("stopped answering") && err.contains(ctl.to_str().unwrap()),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Why the whole-daemon test cannot run here, if it cannot.
fn missing_prerequisite() -> Option<String> {
    if let Some(why) = root_or_tun_missing() {
        return Some(why);
    }
    for tool in ["ip", "ping"] {
        if Command::new(tool).arg("-V").output().is_err() {
            return Some(format!("{tool} is not installed"));
        }
    }
    None
}

fn json_of(args: &[&str], ctl: &Path) -> serde_json::Value {
    let (code, out, err) = uipoib(args, ctl);
    assert_eq!(code, Some(0), "uipoib {args:?}: {err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"))
}

#[test]
fn a_sim_pair_daemon_lists_its_neighbour_and_watches_its_rates() {
    if let Some(why) = missing_prerequisite() {
        assert!(!is_ci(), "neigh_cli cannot run in CI: {why}");
        eprintln!("SKIPPED neigh_cli sim-pair: {why}");
        return;
    }
    let id = std::process::id() % 10_000;
    let na = Netns::new(&format!("uipn-a-{id}"));
    let nb = Netns::new(&format!("uipn-b-{id}"));
    let (tap_a, tap_b) = (format!("na{id}"), format!("nb{id}"));
    let dir = tmp_dir("pair");
    let (ctl_a, ctl_b) = (dir.join("a.sock"), dir.join("b.sock"));
    let daemon = Daemon(
        Command::new(env!("CARGO_BIN_EXE_uipoib"))
            .args(["sim-pair", "--netns-a", &na.0, "--netns-b", &nb.0])
            .args(["--tap-a", &tap_a, "--tap-b", &tap_b])
            .args(["--addr-a", "198.18.2.1/24", "--addr-a", "2001:2:0:2::1/64"])
            .args(["--addr-b", "198.18.2.2/24", "--addr-b", "2001:2:0:2::2/64"])
            .arg("--control-a")
            .arg(&ctl_a)
            .arg("--control-b")
            .arg(&ctl_b)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // Up once B answers a ping (IPv6 waits for duplicate address detection).
    let end = Instant::now() + Duration::from_secs(8);
    for args in [
        &["ping", "-c", "1", "-W", "1", "198.18.2.2"][..],
        &["ping", "-6", "-c", "1", "-W", "1", "2001:2:0:2::2"][..],
    ] {
        while !na.exec(args).status.success() {
            assert!(Instant::now() < end, "{args:?} never answered");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let peer = json_of(&["status", "--json"], &ctl_b);
    // Published at the next housekeeping (once a second).
    let end = Instant::now() + Duration::from_secs(3);
    let entry = loop {
        let v = json_of(&["neigh", "--json"], &ctl_a);
        if let Some(e) = v.as_array().and_then(|a| {
            a.iter()
                .find(|e| e["addrs"].as_array().is_some_and(|a| a.len() == 2))
        }) {
            break e.clone();
        }
        assert!(
            Instant::now() < end,
            "B never listed with both addresses: {v}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    assert_eq!(
        entry["addrs"],
        serde_json::json!(["198.18.2.2", "2001:2:0:2::2"]),
        "{entry}"
    );
    assert_eq!(entry["qpn"], peer["qpn"], "{entry} vs {peer}");
    assert_eq!(entry["gid"], peer["gid"], "{entry} vs {peer}");
    assert_eq!(entry["ah"], "ready", "sent to: {entry}");
    let (code, text, err) = uipoib(&["neigh"], &ctl_a);
    assert_eq!(code, Some(0), "{err}");
    let want = format!(
        "198.18.2.2,2001:2:0:2::2 lladdr {} gid {} qpn {} ah ready",
        entry["mac"].as_str().unwrap(),
        peer["gid"].as_str().unwrap(),
        peer["qpn"]
    );
    assert!(text.starts_with(&want), "{text}\nwant {want}");
    eprintln!("uipoib neigh (of {tap_a}):\n{text}");

    // Traffic while watching: pings every 20 ms for 3 s.
    let ping = Command::new("ip")
        .args([
            "netns", "exec", &na.0, "ping", "-q", "-i", "0.02", "-w", "3",
        ])
        .arg("198.18.2.2")
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let _ping = Daemon(ping);
    let w = Watch::start(&ctl_a, &["--interval", "0.5"]);
    let lines = w.until(Duration::from_secs(4), |l| {
        blocks_with_rate(l, "tx_packets") >= 2
    });
    eprintln!("uipoib stats --watch --interval 0.5:\n{}", lines.join("\n"));
    w.term();
    assert_eq!(w.wait(Duration::from_secs(3)).0, Some(0));
    drop(daemon);
    let _ = std::fs::remove_dir_all(&dir);
}
