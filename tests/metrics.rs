//! The `GET /metrics` listener over a real TCP socket on 127.0.0.1: the exposition and
//! its content type, 404, 405, junk and a slow client, and that it keeps serving.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use uipoib::iface::stats::{self, DropReason, Stats};
use uipoib::runtime::metrics::{CONTENT_TYPE, MAX_REQUEST_HEAD, MetricsServer};
use uipoib::runtime::supervisor::Status;

fn server() -> (MetricsServer, Arc<Stats>, Arc<Mutex<Status>>) {
    let stats = Arc::new(Stats::default());
    let status = Arc::new(Mutex::new(Status {
        state: "running".into(),
        tap: "uip0".into(),
        ..Default::default()
    }));
    let m = MetricsServer::start(
        "127.0.0.1:0".parse().unwrap(),
        "uip0".into(),
        stats.clone(),
        status.clone(),
    )
    .expect("bind 127.0.0.1:0");
    assert_ne!(m.local_addr().port(), 0);
    (m, stats, status)
}

/// Send `req` raw, read until the server closes; (status line, headers, body).
fn exchange(addr: SocketAddr, req: &[u8]) -> (String, String, String) {
    let mut c = TcpStream::connect(addr).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    c.write_all(req).unwrap();
    let mut out = Vec::new();
    c.read_to_end(&mut out).unwrap();
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").expect("no header end");
    let (line, headers) = head.split_once("\r\n").unwrap_or((head, ""));
    (line.to_string(), headers.to_string(), body.to_string())
}

#[test]
fn serves_metrics_and_refuses_the_rest() {
    let (m, st, status) = server();
    let addr = m.local_addr();
    stats::add(&st.rx_packets, 42);
    stats::set(&st.mtu, 4092);
    st.count_drop(DropReason::TxVlan);

    let (line, headers, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(
        headers
            .lines()
            .any(|h| h == format!("Content-Type: {CONTENT_TYPE}")),
        "{headers}"
    );
    assert!(
        headers.contains(&format!("Content-Length: {}", body.len())),
        "{headers}"
    );
    assert!(
        body.contains("uipoib_rx_packets_total{tap=\"uip0\"} 42\n"),
        "{body}"
    );
    assert!(body.contains("uipoib_mtu{tap=\"uip0\"} 4092\n"), "{body}");
    assert!(body.contains("uipoib_drops_total{tap=\"uip0\",reason=\"tx_vlan\"} 1\n"));
    assert!(body.contains("uipoib_state{tap=\"uip0\",state=\"running\"} 1\n"));

    // The status is read at each scrape.
    status.lock().unwrap().state = "restarting".into();
    let (_, _, body) = exchange(addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(body.contains("uipoib_state{tap=\"uip0\",state=\"restarting\"} 1\n"));
    assert!(body.contains("uipoib_state{tap=\"uip0\",state=\"running\"} 0\n"));

    let (line, _, _) = exchange(addr, b"GET /other HTTP/1.1\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 404 Not Found");
    let (line, headers, _) = exchange(addr, b"POST /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 405 Method Not Allowed");
    assert!(headers.contains("Allow: GET, HEAD"), "{headers}");
    let (line, _, body) = exchange(addr, b"HEAD /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(body.is_empty());

    for junk in [
        &b"\x00\xff\x16\x03\r\n\r\n"[..],
        b"hello\r\n\r\n",
        b"GET\r\n\r\n",
    ] {
        let (line, _, _) = exchange(addr, junk);
        assert_eq!(line, "HTTP/1.1 400 Bad Request", "{junk:?}");
    }
    // A request head that never ends within the limit.
    let mut long = b"GET /".to_vec();
    long.resize(MAX_REQUEST_HEAD, b'a');
    let (line, _, _) = exchange(addr, &long);
    assert_eq!(line, "HTTP/1.1 431 Request Header Fields Too Large");
    // A client that connects and hangs up without a request.
    drop(TcpStream::connect(addr).unwrap());

    // Still serving.
    let (line, _, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(body.contains("uipoib_up{tap=\"uip0\"} 1\n"));
}

#[test]
fn a_slow_client_is_cut_off_and_the_next_is_served() {
    let (m, _, _) = server();
    let addr = m.local_addr();
    let mut slow = TcpStream::connect(addr).unwrap();
    slow.write_all(b"GET /met").unwrap();
    let t = Instant::now();
    let (line, _, body) = exchange(addr, b"GET /metrics HTTP/1.1\r\n\r\n");
    assert_eq!(line, "HTTP/1.1 200 OK");
    assert!(body.contains("uipoib_up"));
    let waited = t.elapsed();
    assert!(waited < Duration::from_secs(9), "{waited:?}");
    let mut rest = String::new();
    slow.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let _ = slow.read_to_string(&mut rest);
    assert!(rest.starts_with("HTTP/1.1 408 Request Timeout"), "{rest:?}");
}

#[test]
fn a_taken_address_is_an_error() {
    let (m, st, status) = server();
    let err = MetricsServer::start(m.local_addr(), "uip1".into(), st, status).err();
    assert!(err.is_some());
}

/// The daemon's wiring: `metrics-listen` serves the live interface, and an address that
/// is taken stops the start with an error naming it. Needs root and /dev/net/tun (a TAP
/// in a namespace of its own); skipped, saying so, without them.
#[cfg(feature = "sim")]
mod daemon {
    use super::*;
    use std::net::{Ipv4Addr, TcpListener};
    use std::process::Command;
    use uipoib::runtime::config::{Config, ConfigKeys};
    use uipoib::runtime::daemon::{self, DaemonError, Launch};
    use uipoib::verbs::sim::SimFabric;

    struct Netns(String);
    impl Drop for Netns {
        fn drop(&mut self) {
            let _ = Command::new("ip").args(["netns", "del", &self.0]).status();
        }
    }

    fn netns(tag: &str) -> Option<Netns> {
        let name = format!("uipm-{tag}-{}", std::process::id());
        let ok = std::fs::metadata("/dev/net/tun").is_ok()
            && Command::new("ip")
                .args(["netns", "add", &name])
                .status()
                .is_ok_and(|s| s.success());
        if !ok {
            eprintln!("SKIP: needs root, ip netns and /dev/net/tun");
            return None;
        }
        Some(Netns(name))
    }

    fn launch(tap: &str, ns: &Netns, metrics: SocketAddr) -> (Arc<SimFabric>, Launch) {
        let fabric = Arc::new(SimFabric::new());
        fabric
            .add_device("sim0", Ipv4Addr::new(198, 18, 0, 1), 4096)
            .unwrap();
        let dir = std::env::temp_dir().join(format!("uipm-{tap}-{}", std::process::id()));
        let config = Config::from_keys(ConfigKeys {
            device: Some("sim0".into()),
            tap: Some(tap.into()),
            addr: Some("198.18.7.1/24".into()),
            control: Some(dir.join("c.sock")),
            metrics_listen: Some(metrics.to_string()),
            ..Default::default()
        })
        .unwrap();
        let spec = Launch {
            config,
            netns: Some(ns.0.clone()),
        };
        (fabric, spec)
    }

    fn get(addr: SocketAddr) -> Option<String> {
        let mut c = TcpStream::connect(addr).ok()?;
        c.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
        c.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").ok()?;
        let mut s = String::new();
        c.read_to_string(&mut s).ok()?;
        Some(s)
    }

    #[test]
    fn metrics_listen_serves_the_live_interface() {
        let Some(ns) = netns("serve") else { return };
        let addr = {
            let l = TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap()
        };
        let (fabric, spec) = launch("uipm0", &ns, addr);
        let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
        let run = std::thread::spawn(move || daemon::run(vec![spec], fabric, Some(stop_rx)));
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut last = None;
        while Instant::now() < deadline {
            last = get(addr);
            if last
                .as_deref()
                .is_some_and(|s| s.contains("uipoib_state{tap=\"uipm0\",state=\"running\"} 1\n"))
            {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = stop_tx.send(());
        let outcome = run.join().unwrap().expect("daemon run");
        let text = last.expect("no answer on metrics-listen");
        assert!(text.starts_with("HTTP/1.1 200 OK\r\n"), "{text}");
        assert!(
            text.contains("uipoib_state{tap=\"uipm0\",state=\"running\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("uipoib_mtu{tap=\"uipm0\"} 4092\n"), "{text}");
        assert_eq!(outcome.exit_code(), 0);
        // Gone with the daemon.
        assert!(TcpStream::connect(addr).is_err());
    }

    #[test]
    fn the_daemon_rehearses_the_restart_at_start_and_accounts_for_its_ring() {
        for rehearse in [true, false] {
            let Some(ns) = netns(if rehearse { "reh" } else { "noreh" }) else {
                return;
            };
            let addr = {
                let l = TcpListener::bind("127.0.0.1:0").unwrap();
                l.local_addr().unwrap()
            };
            let tap = if rehearse { "uipm2" } else { "uipm3" };
            let (fabric, mut spec) = launch(tap, &ns, addr);
            spec.config.rehearse_restart = rehearse;
            let f = fabric.clone();
            let (stop_tx, stop_rx) = crossbeam_channel::bounded(1);
            let run = std::thread::spawn(move || daemon::run(vec![spec], f, Some(stop_rx)));
            let running = format!("uipoib_state{{tap=\"{tap}\",state=\"running\"}} 1\n");
            let deadline = Instant::now() + Duration::from_secs(10);
            let mut last = None;
            while Instant::now() < deadline {
                last = get(addr);
                if last.as_deref().is_some_and(|s| s.contains(&running)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let _ = stop_tx.send(());
            let outcome = run.join().unwrap().expect("daemon run");
            let text = last.expect("no answer on metrics-listen");
            assert!(text.contains(&running), "{text}");
            assert!(
                text.contains(&format!("uipoib_restarts_total{{tap=\"{tap}\"}} 0\n")),
                "rehearse {rehearse}: the rehearsal counted as a restart\n{text}"
            );
            assert_eq!(outcome.exit_code(), 0);
            let (_, stats, ledger) = &outcome.interfaces[0];
            ledger.as_ref().unwrap();
            // The default receive ring, flushed at the stop (or reaped) and, before
            // it, reaped at the rehearsal (nothing of the given-up QP is drained, as
            // after a failed poll); every QP destroyed by then.
            let rings = if rehearse { 2 } else { 1 };
            assert_eq!(
                stats.recv_reaped + stats.recv_flushed,
                rings * 4096,
                "rehearse {rehearse}: {stats:?}"
            );
            assert!(stats.recv_reaped >= (rings - 1) * 4096, "{stats:?}");
            assert_eq!(stats.restarts, 0);
            // The given-up QP is the one replaced QP the fabric saw destroyed.
            let replaced = fabric.destroyed();
            assert_eq!(replaced.len(), usize::from(rehearse), "{replaced:?}");
        }
    }

    #[test]
    fn a_taken_metrics_address_stops_the_start() {
        let Some(ns) = netns("taken") else { return };
        let held = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = held.local_addr().unwrap();
        let (fabric, spec) = launch("uipm1", &ns, addr);
        match daemon::run(vec![spec], fabric, None) {
            Err(e @ DaemonError::Metrics { .. }) => {
                let msg = e.to_string();
                assert!(msg.contains(&format!("metrics-listen {addr}")), "{msg}");
            }
            other => panic!("expected a metrics-listen error, got {other:?}"),
        }
    }
}
