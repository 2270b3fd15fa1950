//! The control socket: a Unix stream socket per interface (`/run/uipoib/<tap>.sock`,
//! mode 0600) speaking line-delimited JSON.
//!
//! Requests are one JSON object per line: `{"cmd":"stats"}`, `{"cmd":"status"}`,
//! `{"cmd":"restart"}`, `{"cmd":"ping"}`, and for fault injection
//! `{"cmd":"inject","fault":"poll-error","after":1000}` (see [`FaultSpec::from_json`]
//! for the fields), `{"cmd":"clear"}` and `{"cmd":"faults"}` (what is armed and what was
//! injected). Replies are one line: `{"ok":true,...}` or `{"ok":false,"error":"..."}`.
//! Junk gets an error reply naming what is wrong, never a crash. The server runs on its
//! own thread and reads only counters (atomics), a small status record and the fault
//! switch (whose lock the datapath takes only while a fault is armed, and never across
//! a client's I/O), so a slow or hung client can never stall the datapath; each client
//! has a read timeout.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use serde_json::{Map, Value, json};

use crate::faults::{FaultKind, FaultSpec};
use crate::stats::Stats;
use crate::supervisor::Command;
pub use crate::supervisor::Status;
use crate::verbs::fault::FaultSwitch;

/// Longest request line accepted.
pub const MAX_REQUEST: usize = 64 * 1024;

/// How long a client may take to send its request.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// A control-socket failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another daemon answers on this socket.
    #[error("{0} is in use by a running uipoib (stop it first, or give --control)")]
    InUse(PathBuf),
    /// Setting up the socket failed.
    #[error("control socket {path}: {source}")]
    Io {
        /// The socket path.
        path: PathBuf,
        /// Why.
        #[source]
        source: io::Error,
    },
    /// Nothing listens there.
    #[error(
        "no uipoib daemon is listening on {path} ({why}); is `uipoib up` running for that interface?"
    )]
    NotRunning {
        /// The socket path.
        path: PathBuf,
        /// What connect said.
        why: String,
    },
    /// The daemon answered something that is not a reply.
    #[error("bad reply from {path}: {why}")]
    BadReply {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        why: String,
    },
    /// The daemon answered with an error.
    #[error("daemon refused: {0}")]
    Refused(String),
}

/// A running control server. Dropping it stops the thread and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

/// The faults `inject` knows.
pub const FAULTS: &str = FaultKind::NAMES;

/// Injections listed by the `faults` command (the most recent).
pub const FAULTS_LISTED: usize = 100;

/// `inject`: arm the fault the request describes. A bad request is refused naming the
/// field that is wrong.
fn inject(req: &Map<String, Value>, faults: &FaultSwitch) -> Result<Value, String> {
    let spec = FaultSpec::from_map(req).map_err(|e| e.to_string())?;
    faults.arm(spec);
    let mut v = spec.to_json();
    v["ok"] = true.into();
    v["injected"] = spec.kind().name().into();
    v["armed"] = spec.to_string().into();
    Ok(v)
}

/// `faults`: what is armed and what has been injected.
fn faults_report(faults: &FaultSwitch) -> Value {
    let fired: Map<String, Value> = FaultKind::ALL
        .iter()
        .map(|k| (k.name().to_string(), faults.fired(*k).into()))
        .collect();
    let recent = faults.recent_injections(FAULTS_LISTED);
    json!({
        "ok": true,
        "armed": faults.armed().iter().map(FaultSpec::to_json).collect::<Vec<_>>(),
        "injected": faults.injected(),
        "fired": fired,
        "stalled": faults.stalled(),
        "recent": recent,
    })
}

/// What the server thread serves.
struct Ctx {
    stats: Arc<Stats>,
    status: Arc<Mutex<Status>>,
    commands: Option<Sender<Command>>,
    faults: Option<Arc<FaultSwitch>>,
}

fn handle_line(line: &str, cx: &Ctx) -> Value {
    let (stats, status) = (&cx.stats, &cx.status);
    let bad = |why: String| json!({"ok": false, "error": format!("bad request (a JSON object with a \"cmd\" string and only known fields): {why}")});
    let req: Map<String, Value> = match serde_json::from_str(line) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return bad(format!("not an object: {other}")),
        Err(e) => return bad(e.to_string()),
    };
    let cmd = match req.get("cmd") {
        Some(Value::String(c)) => c.as_str(),
        Some(other) => return bad(format!("\"cmd\" must be a string, not {other}")),
        None => return bad("missing \"cmd\"".into()),
    };
    // Only `inject` takes more than the command.
    if cmd != "inject"
        && let Some(k) = req.keys().find(|k| *k != "cmd")
    {
        return bad(format!("unknown field {k:?} for {cmd:?}"));
    }
    match cmd {
        "ping" => json!({"ok": true}),
        "stats" => json!({"ok": true, "stats": stats.snapshot()}),
        "status" => {
            let s = status.lock().map(|s| s.clone()).unwrap_or_default();
            json!({"ok": true, "status": s})
        }
        "restart" => match &cx.commands {
            Some(tx) if tx.send(Command::Restart).is_ok() => {
                json!({"ok": true, "restart": "requested"})
            }
            _ => json!({"ok": false, "error": "this interface has no supervisor to restart it"}),
        },
        "inject" | "clear" | "faults" => match &cx.faults {
            None => {
                json!({"ok": false, "error": "fault injection is not available on this interface"})
            }
            Some(f) if cmd == "clear" => {
                f.clear();
                json!({"ok": true, "cleared": true})
            }
            Some(f) if cmd == "faults" => faults_report(f),
            Some(f) => inject(&req, f).unwrap_or_else(|e| json!({"ok": false, "error": e})),
        },
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?}; known: ping, stats, status, restart, inject, clear, faults"),
        }),
    }
}

fn serve_client(stream: UnixStream, cx: &Ctx) -> io::Result<()> {
    stream.set_read_timeout(Some(CLIENT_TIMEOUT))?;
    stream.set_write_timeout(Some(CLIENT_TIMEOUT))?;
    let mut reader = BufReader::new((&stream).take(MAX_REQUEST as u64 + 1));
    let mut writer = &stream;
    let mut line = String::new();
    loop {
        line.clear();
        let n = match reader.read_line(&mut line) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let r = json!({"ok": false, "error": "request is not UTF-8"});
                writeln!(writer, "{r}")?;
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if n == 0 {
            return Ok(());
        }
        if line.len() > MAX_REQUEST {
            let r =
                json!({"ok": false, "error": format!("request longer than {MAX_REQUEST} bytes")});
            writeln!(writer, "{r}")?;
            return Ok(());
        }
        let trimmed = line.trim();
        if trimmed.is_empty() {
            continue;
        }
        let reply = handle_line(trimmed, cx);
        writeln!(writer, "{reply}")?;
    }
}

impl ControlServer {
    /// Bind `path` (removing a stale socket, refusing one a live daemon answers on) and
    /// serve requests on a thread.
    pub fn start(
        path: &Path,
        stats: Arc<Stats>,
        status: Arc<Mutex<Status>>,
        commands: Option<Sender<Command>>,
        faults: Option<Arc<FaultSwitch>>,
    ) -> Result<ControlServer, ControlError> {
        let cx = Ctx {
            stats,
            status,
            commands,
            faults,
        };
        let io_err = |source| ControlError::Io {
            path: path.to_owned(),
            source,
        };
        if let Some(dir) = path.parent()
            && !dir.as_os_str().is_empty()
        {
            std::fs::create_dir_all(dir).map_err(io_err)?;
        }
        if path.exists() {
            if UnixStream::connect(path).is_ok() {
                return Err(ControlError::InUse(path.to_owned()));
            }
            std::fs::remove_file(path).map_err(io_err)?;
        }
        let listener = UnixListener::bind(path).map_err(io_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err)?;
        listener.set_nonblocking(true).map_err(io_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || {
                while !stop2.load(Ordering::SeqCst) {
                    match listener.accept() {
                        Ok((s, _)) => {
                            let _ = s.set_nonblocking(false);
                            if let Err(e) = serve_client(s, &cx) {
                                tracing::debug!(error = %e, "control client");
                            }
                        }
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                            std::thread::sleep(Duration::from_millis(50));
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "control socket accept failed");
                            std::thread::sleep(Duration::from_millis(200));
                        }
                    }
                }
            })
            .map_err(io_err)?;
        Ok(ControlServer {
            path: path.to_owned(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Send `{"cmd": cmd}` and return the reply (`ok` checked).
pub fn request(path: &Path, cmd: &str) -> Result<Value, ControlError> {
    request_json(path, &json!({ "cmd": cmd }))
}

/// Send one request object and return the reply (`ok` checked).
pub fn request_json(path: &Path, req: &Value) -> Result<Value, ControlError> {
    let stream = UnixStream::connect(path).map_err(|e| ControlError::NotRunning {
        path: path.to_owned(),
        why: e.to_string(),
    })?;
    let bad = |why: String| ControlError::BadReply {
        path: path.to_owned(),
        why,
    };
    stream
        .set_read_timeout(Some(Duration::from_secs(5)))
        .map_err(|e| bad(e.to_string()))?;
    let mut w = &stream;
    writeln!(w, "{req}").map_err(|e| bad(e.to_string()))?;
    let mut line = String::new();
    BufReader::new(&stream)
        .read_line(&mut line)
        .map_err(|e| bad(e.to_string()))?;
    let v: Value = serde_json::from_str(&line).map_err(|e| bad(format!("{e}: {line:?}")))?;
    if v.get("ok") == Some(&Value::Bool(true)) {
        Ok(v)
    } else {
        Err(ControlError::Refused(
            v.get("error")
                .and_then(Value::as_str)
                .unwrap_or("no error message")
                .to_string(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{self, DropReason};

    fn tmp_sock(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("uipoib-test-{tag}-{}.sock", std::process::id()))
    }

    #[test]
    fn stats_status_and_junk() {
        let path = tmp_sock("a");
        let st = Arc::new(Stats::default());
        stats::add(&st.rx_packets, 5);
        st.count_drop(DropReason::TxIpv6);
        let status = Arc::new(Mutex::new(Status {
            state: "running".into(),
            tap: "uip0".into(),
            ..Default::default()
        }));
        let (ctx, crx) = crossbeam_channel::unbounded();
        let faults = Arc::new(FaultSwitch::default());
        let srv = ControlServer::start(&path, st.clone(), status, Some(ctx), Some(faults.clone()))
            .unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let v = request(&path, "stats").unwrap();
        assert_eq!(v["stats"]["rx_packets"], 5);
        assert_eq!(v["stats"]["drops"]["tx_ipv6"], 1);
        let v = request(&path, "status").unwrap();
        assert_eq!(v["status"]["tap"], "uip0");
        request(&path, "restart").unwrap();
        assert_eq!(crx.try_recv(), Ok(Command::Restart));
        let v = request_json(
            &path,
            &json!({"cmd": "inject", "fault": "poll-error", "count": 2}),
        )
        .unwrap();
        assert_eq!(v["count"], 2);
        assert_eq!(faults.polls_failed(), 0);
        let v = request_json(
            &path,
            &json!({"cmd": "inject", "fault": "corrupt-rx", "probability": 0.5, "seed": 3, "bytes": 2}),
        )
        .unwrap();
        assert_eq!(
            (v["seed"].as_u64(), v["bytes"].as_u64()),
            (Some(3), Some(2))
        );
        assert_eq!(faults.armed().len(), 2);
        // On command, an async event is delivered at once and recorded.
        request_json(
            &path,
            &json!({"cmd": "inject", "fault": "async-fatal", "event": "qp-fatal"}),
        )
        .unwrap();
        let v = request(&path, "faults").unwrap();
        assert_eq!(v["armed"].as_array().map(Vec::len), Some(2), "{v}");
        assert_eq!(v["injected"], 1);
        assert_eq!(v["fired"]["async-fatal"], 1);
        assert_eq!(v["recent"][0]["kind"], "async-fatal");
        for (bad, field) in [
            (json!({"cmd": "inject"}), "fault"),
            (json!({"cmd": "inject", "fault": "meteor"}), "fault"),
            (
                json!({"cmd": "inject", "fault": "poll-error", "ret": 3}),
                "ret",
            ),
            (
                json!({"cmd": "inject", "fault": "async-fatal", "event": "boom"}),
                "event",
            ),
            (
                json!({"cmd": "inject", "fault": "poll-error", "after": "soon"}),
                "after",
            ),
            (
                json!({"cmd": "inject", "fault": "poll-error", "after": 1, "every": 2}),
                "every",
            ),
            (
                json!({"cmd": "inject", "fault": "slow-poll", "bytes": 2}),
                "bytes",
            ),
            (
                json!({"cmd": "inject", "fault": "poll-error", "colour": "red"}),
                "colour",
            ),
            (json!({"cmd": "stats", "typo": 1}), "typo"),
            (json!({"cmd": 5}), "cmd"),
        ] {
            match request_json(&path, &bad) {
                Err(ControlError::Refused(m)) => assert!(m.contains(field), "{bad}: {m}"),
                other => panic!("{bad}: {other:?}"),
            }
        }
        request(&path, "clear").unwrap();
        assert!(faults.armed().is_empty());
        match request(&path, "reboot") {
            Err(ControlError::Refused(m)) => assert!(m.contains("unknown command"), "{m}"),
            other => panic!("{other:?}"),
        }
        // Raw junk, a huge line, invalid UTF-8: each gets an error reply.
        for junk in [
            b"not json\n".to_vec(),
            b"{\"cmd\": 5}\n".to_vec(),
            vec![0xff, 0xfe, b'\n'],
            vec![b'a'; MAX_REQUEST + 10],
        ] {
            let mut s = UnixStream::connect(&path).unwrap();
            s.write_all(&junk).unwrap();
            let mut line = String::new();
            BufReader::new(&s).read_line(&mut line).unwrap();
            let v: Value = serde_json::from_str(&line).unwrap();
            assert_eq!(v["ok"], false, "{line}");
        }
        // A second server on the same path is refused while the first lives.
        let again = ControlServer::start(
            &path,
            st.clone(),
            Arc::new(Mutex::new(Status::default())),
            None,
            None,
        );
        assert!(matches!(again, Err(ControlError::InUse(_))));
        // A client that connects and says nothing does not block others for long.
        let _idle = UnixStream::connect(&path).unwrap();
        let t = std::time::Instant::now();
        request(&path, "ping").unwrap();
        assert!(t.elapsed() < CLIENT_TIMEOUT * 3);
        drop(srv);
        assert!(!path.exists());
        assert!(matches!(
            request(&path, "ping"),
            Err(ControlError::NotRunning { .. })
        ));
    }

    #[test]
    fn stale_socket_is_replaced() {
        let path = tmp_sock("b");
        {
            let _l = UnixListener::bind(&path).unwrap();
        } // listener gone, file stays: stale
        assert!(path.exists());
        let srv = ControlServer::start(
            &path,
            Arc::new(Stats::default()),
            Arc::new(Mutex::new(Status::default())),
            None,
            None,
        )
        .unwrap();
        request(&path, "ping").unwrap();
        assert!(matches!(
            request(&path, "restart"),
            Err(ControlError::Refused(_))
        ));
        drop(srv);
    }
}
