//! The counters in the Prometheus text exposition format (version 0.0.4), for
//! `uipoib stats --prometheus` and for the daemon's optional `GET /metrics` listener
//! (`metrics-listen`).
//!
//! Every counter of [`Snapshot`] becomes a family `uipoib_<name>`: a counter (with the
//! `_total` suffix) when it only goes up, a gauge when it is a value "now" or a size
//! ([`GAUGES`]). The drops are one family, `uipoib_drops_total{reason=...}`, every reason
//! present (zeros included); the ledger's residuals are the gauge
//! `uipoib_ledger_residual{ring=...}`. With the daemon's [`Status`], `uipoib_state` says
//! which of the supervisor's states the interface is in (1 for it, 0 for the others);
//! `uipoib_up` is 1 whenever the daemon answered.
//!
//! The listener is plain HTTP/1.1 on a thread of its own: one request per connection,
//! answered and closed. A request head must arrive within [`REQUEST_TIMEOUT`] and fit in
//! [`MAX_REQUEST_HEAD`]; junk gets a 400, another path a 404, another method a 405. It
//! reads only atomics and a copy of the status record, so a scrape never stalls the
//! datapath. Clients are served one after another: a slow one holds the next scrape back
//! by at most [`REQUEST_TIMEOUT`].

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crate::iface::stats::{DropReason, Snapshot, Stats};
use crate::runtime::supervisor::Status;

/// The counters that are values "now" or sizes, not totals: exposed as gauges (no
/// `_total` suffix).
pub const GAUGES: &[&str] = &[
    "recv_outstanding",
    "send_outstanding",
    "recv_ring",
    "send_ring",
    "neigh_entries",
    "recv_never_complete",
    "send_never_complete",
    "qpn",
    "mtu",
];

/// The supervisor's states, each a sample of `uipoib_state`.
pub const STATES: &[&str] = &[
    "starting",
    "running",
    "restarting",
    "waiting-for-device",
    "dead",
    "stopping",
    "stopped",
];

/// The `Content-Type` of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4";

/// Longest request head (request line and headers) read.
pub const MAX_REQUEST_HEAD: usize = 8 * 1024;

/// How long a client may take to send its request head.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// A label value escaped per the text format: backslash, double quote and newline.
pub fn escape_label(v: &str) -> String {
    let mut s = String::with_capacity(v.len());
    for c in v.chars() {
        match c {
            '\\' => s.push_str("\\\\"),
            '"' => s.push_str("\\\""),
            '\n' => s.push_str("\\n"),
            c => s.push(c),
        }
    }
    s
}

/// HELP text escaped per the text format: backslash and newline.
fn escape_help(v: &str) -> String {
    v.replace('\\', "\\\\").replace('\n', "\\n")
}

/// The first sentence of a doc comment, on one line.
fn first_sentence(doc: &str) -> String {
    let line = doc.split_whitespace().collect::<Vec<_>>().join(" ");
    match line.find(". ") {
        Some(i) => line[..=i].to_string(),
        None => line,
    }
}

fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {}", escape_help(help));
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

impl Snapshot {
    /// These counters in the Prometheus text format (0.0.4), every sample labelled
    /// `tap="<tap>"`; with `status`, also the interface's state.
    pub fn to_prometheus(&self, tap: &str, status: Option<&Status>) -> String {
        let tap = escape_label(tap);
        let mut out = String::new();
        family(
            &mut out,
            "uipoib_up",
            "gauge",
            "Whether the daemon answered (1).",
        );
        let _ = writeln!(out, "uipoib_up{{tap=\"{tap}\"}} 1");
        if let Some(st) = status {
            family(
                &mut out,
                "uipoib_state",
                "gauge",
                "The interface's state: 1 for the one it is in.",
            );
            let mut states: Vec<&str> = STATES.to_vec();
            if !states.contains(&st.state.as_str()) {
                states.push(&st.state);
            }
            for s in states {
                let _ = writeln!(
                    out,
                    "uipoib_state{{tap=\"{tap}\",state=\"{}\"}} {}",
                    escape_label(s),
                    u8::from(s == st.state)
                );
            }
        }
        for (name, doc, value) in self.counters() {
            let gauge = GAUGES.contains(&name);
            let metric = if gauge {
                format!("uipoib_{name}")
            } else {
                format!("uipoib_{name}_total")
            };
            let kind = if gauge { "gauge" } else { "counter" };
            family(&mut out, &metric, kind, &first_sentence(doc));
            let _ = writeln!(out, "{metric}{{tap=\"{tap}\"}} {value}");
        }
        family(
            &mut out,
            "uipoib_drops_total",
            "counter",
            "Packets dropped, by reason.",
        );
        for r in DropReason::ALL {
            let _ = writeln!(
                out,
                "uipoib_drops_total{{tap=\"{tap}\",reason=\"{}\"}} {}",
                r.name(),
                self.drop_count(r)
            );
        }
        family(
            &mut out,
            "uipoib_ledger_residual",
            "gauge",
            "Work requests posted minus completed, flushed, reaped and outstanding (0 when the ledger balances).",
        );
        let res = self.residuals();
        for (ring, v) in [("recv", res.recv), ("send", res.send)] {
            let _ = writeln!(
                out,
                "uipoib_ledger_residual{{tap=\"{tap}\",ring=\"{ring}\"}} {v}"
            );
        }
        out
    }
}

/// The daemon's `GET /metrics` listener; stops (and joins its thread) when dropped.
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Bind `addr` (port 0 picks a free one: see [`MetricsServer::local_addr`]) and serve
    /// the interface's counters and status there.
    pub fn start(
        addr: SocketAddr,
        tap: String,
        stats: Arc<Stats>,
        status: Arc<Mutex<Status>>,
    ) -> io::Result<MetricsServer> {
        let listener = TcpListener::bind(addr)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name(format!("metrics-{tap}"))
            .spawn(move || serve(listener, &flag, &tap, &stats, &status))?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn serve(
    listener: TcpListener,
    stop: &AtomicBool,
    tap: &str,
    stats: &Stats,
    status: &Mutex<Status>,
) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((conn, _)) => {
                let body = || {
                    let st = status.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    stats.snapshot().to_prometheus(tap, Some(&st))
                };
                if let Err(e) = handle(conn, body) {
                    tracing::debug!(error = %e, "metrics client");
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}

/// What a request head asks for.
#[derive(Debug, PartialEq, Eq)]
enum Reply {
    Metrics { head_only: bool },
    Status(u16, &'static str),
}

/// Read a request head (up to `\r\n\r\n`), bounded in size and time.
fn read_head(conn: &mut TcpStream) -> Result<Vec<u8>, Reply> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    loop {
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(buf);
        }
        if buf.len() >= MAX_REQUEST_HEAD {
            return Err(Reply::Status(431, "Request Header Fields Too Large"));
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Reply::Status(408, "Request Timeout"));
        }
        if conn.set_read_timeout(Some(left)).is_err() {
            return Err(Reply::Status(500, "Internal Server Error"));
        }
        let want = chunk.len().min(MAX_REQUEST_HEAD - buf.len());
        match conn.read(&mut chunk[..want]) {
            Ok(0) => return Err(Reply::Status(400, "Bad Request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e)
                if e.kind() == io::ErrorKind::WouldBlock || e.kind() == io::ErrorKind::TimedOut =>
            {
                return Err(Reply::Status(408, "Request Timeout"));
            }
            Err(_) => return Err(Reply::Status(400, "Bad Request")),
        }
    }
}

/// The reply to a request head.
fn route(head: &[u8]) -> Reply {
    let line_end = head.iter().position(|&b| b == b'\n').unwrap_or(head.len());
    let Ok(line) = std::str::from_utf8(&head[..line_end]) else {
        return Reply::Status(400, "Bad Request");
    };
    let mut parts = line.trim_end_matches('\r').split(' ');
    let (Some(method), Some(target), Some(version), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Reply::Status(400, "Bad Request");
    };
    if !version.starts_with("HTTP/1.")
        || method.is_empty()
        || !method.bytes().all(|b| b.is_ascii_uppercase())
        || !target.starts_with('/')
    {
        return Reply::Status(400, "Bad Request");
    }
    if target.split('?').next() != Some("/metrics") {
        return Reply::Status(404, "Not Found");
    }
    match method {
        "GET" => Reply::Metrics { head_only: false },
        "HEAD" => Reply::Metrics { head_only: true },
        _ => Reply::Status(405, "Method Not Allowed"),
    }
}

fn handle(mut conn: TcpStream, body: impl FnOnce() -> String) -> io::Result<()> {
    conn.set_nonblocking(false)?;
    conn.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let reply = match read_head(&mut conn) {
        Ok(head) => route(&head),
        Err(r) => r,
    };
    let (code, reason, ctype, text, head_only) = match reply {
        Reply::Metrics { head_only } => (200, "OK", CONTENT_TYPE, body(), head_only),
        Reply::Status(code, reason) => (
            code,
            reason,
            "text/plain; charset=utf-8",
            format!("{code} {reason}\n"),
            false,
        ),
    };
    let mut out = format!(
        "HTTP/1.1 {code} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        text.len()
    );
    if code == 405 {
        out.push_str("Allow: GET, HEAD\r\n");
    }
    out.push_str("\r\n");
    if !head_only {
        out.push_str(&text);
    }
    conn.write_all(out.as_bytes())?;
    let _ = conn.shutdown(std::net::Shutdown::Both);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, HashSet};

    fn sample() -> Snapshot {
        let mut s = Stats::default().snapshot();
        s.rx_packets = 7;
        s.mtu = 4092;
        s.recv_posted = 5;
        s.recv_outstanding = 5;
        s.drops.insert("rx_short".into(), 3);
        s
    }

    fn status(state: &str) -> Status {
        Status {
            state: state.into(),
            ..Default::default()
        }
    }

    /// Parse the exposition line by line as the format says, returning each family's
    /// type and its samples (name with labels, value); panics on any violation.
    fn parse(text: &str) -> BTreeMap<String, (String, Vec<(String, i64)>)> {
        let mut fams: BTreeMap<String, (String, Vec<(String, i64)>)> = BTreeMap::new();
        let mut helped = HashSet::new();
        let mut current: Option<String> = None;
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# HELP ") {
                let (name, help) = rest.split_once(' ').expect("HELP without text");
                assert!(!help.is_empty(), "{line}");
                assert!(helped.insert(name.to_string()), "HELP twice: {name}");
                assert!(!fams.contains_key(name), "HELP after TYPE/samples: {name}");
                current = Some(name.to_string());
            } else if let Some(rest) = line.strip_prefix("# TYPE ") {
                let (name, kind) = rest.split_once(' ').expect("TYPE without kind");
                assert_eq!(current.as_deref(), Some(name), "TYPE not after its HELP");
                assert!(matches!(kind, "counter" | "gauge"), "{line}");
                assert!(
                    fams.insert(name.into(), (kind.into(), vec![])).is_none(),
                    "family twice: {name}"
                );
            } else {
                assert!(!line.starts_with('#') && !line.is_empty(), "{line:?}");
                let name_end = line.find(['{', ' ']).expect("sample without value");
                let name = &line[..name_end];
                assert!(
                    name.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b':'),
                    "bad metric name {name}"
                );
                assert_eq!(current.as_deref(), Some(name), "sample outside its family");
                let (series, value) = line.rsplit_once(' ').unwrap();
                let value: i64 = value.parse().unwrap_or_else(|_| panic!("value: {line}"));
                fams.get_mut(name)
                    .expect("sample before TYPE")
                    .1
                    .push((series.to_string(), value));
            }
        }
        fams
    }

    #[test]
    fn exposition_parses_and_names_follow_convention() {
        let text = sample().to_prometheus("uip0", Some(&status("running")));
        let fams = parse(&text);
        for (name, (kind, samples)) in &fams {
            assert!(!samples.is_empty(), "{name} has no samples");
            assert_eq!(
                kind == "counter",
                name.ends_with("_total"),
                "{name} is a {kind}"
            );
        }
        let n_counters = Snapshot::default().counters().len();
        // up, state, every counter, drops, ledger residual.
        assert_eq!(fams.len(), n_counters + 4);
        assert_eq!(
            fams["uipoib_rx_packets_total"].1,
            vec![("uipoib_rx_packets_total{tap=\"uip0\"}".into(), 7)]
        );
        assert_eq!(fams["uipoib_mtu"].0, "gauge");
        assert_eq!(fams["uipoib_mtu"].1[0].1, 4092);
        for g in GAUGES {
            assert_eq!(fams[&format!("uipoib_{g}")].0, "gauge", "{g}");
        }
        let drops = &fams["uipoib_drops_total"].1;
        assert_eq!(drops.len(), DropReason::ALL.len());
        assert!(drops.contains(&(
            "uipoib_drops_total{tap=\"uip0\",reason=\"rx_short\"}".into(),
            3
        )));
        assert!(drops.contains(&(
            "uipoib_drops_total{tap=\"uip0\",reason=\"tx_vlan\"}".into(),
            0
        )));
        let states = &fams["uipoib_state"].1;
        assert_eq!(states.iter().map(|s| s.1).sum::<i64>(), 1);
        assert!(states.contains(&("uipoib_state{tap=\"uip0\",state=\"running\"}".into(), 1)));
        assert!(text.contains(
            "# HELP uipoib_rx_packets_total Packets written to the TAP from the wire.\n"
        ));
    }

    #[test]
    fn without_status_no_state_and_unknown_state_is_shown() {
        let fams = parse(&sample().to_prometheus("uip0", None));
        assert!(!fams.contains_key("uipoib_state"));
        assert!(fams.contains_key("uipoib_up"));
        let fams = parse(&sample().to_prometheus("uip0", Some(&status("odd\"one"))));
        let states = &fams["uipoib_state"].1;
        assert!(states.contains(&("uipoib_state{tap=\"uip0\",state=\"odd\\\"one\"}".into(), 1)));
    }

    #[test]
    fn tap_label_is_escaped() {
        assert_eq!(escape_label("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
        let text = sample().to_prometheus("u\"i\\p", None);
        parse(&text);
        assert!(
            text.contains("uipoib_rx_packets_total{tap=\"u\\\"i\\\\p\"} 7\n"),
            "{text}"
        );
    }

    #[test]
    fn help_is_one_sentence_on_one_line() {
        assert_eq!(first_sentence("Send WRs likewise.\n"), "Send WRs likewise.");
        assert_eq!(
            first_sentence(" Packets from a peer: delivered.\n Never believed.\n"),
            "Packets from a peer: delivered."
        );
        for (name, doc, _) in Snapshot::default().counters() {
            let s = first_sentence(doc);
            assert!(!s.is_empty() && !s.contains('\n'), "{name}: {s:?}");
        }
    }

    #[test]
    fn routes() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\n\r\n"),
            Reply::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"),
            Reply::Metrics { head_only: false }
        );
        assert_eq!(
            route(b"GET / HTTP/1.1\r\n\r\n"),
            Reply::Status(404, "Not Found")
        );
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Reply::Status(405, "Method Not Allowed")
        );
        for junk in [
            &b"\xff\xfe\r\n\r\n"[..],
            b"hello\r\n\r\n",
            b"GET /metrics\r\n\r\n",
            b"GET /metrics SPDY/3\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
        ] {
            assert_eq!(route(junk), Reply::Status(400, "Bad Request"), "{junk:?}");
        }
    }
}
