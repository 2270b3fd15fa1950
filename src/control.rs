//! The control socket: a Unix stream socket per interface (`/run/uipoib/<tap>.sock`,
//! mode 0600) speaking line-delimited JSON.
//!
//! Requests are one JSON object per line: `{"cmd":"stats"}`, `{"cmd":"status"}`,
//! `{"cmd":"restart"}`, `{"cmd":"ping"}`. Replies are one line: `{"ok":true,...}` or
//! `{"ok":false,"error":"..."}`. Junk gets an error reply, never a crash. The server runs
//! on its own thread and reads only counters (atomics) and a small status record, so a
//! slow or hung client can never stall the datapath; each client has a read timeout.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crossbeam_channel::Sender;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::stats::Stats;
use crate::supervisor::Command;
pub use crate::supervisor::Status;
use crate::verbs::AsyncEvent;
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

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Request {
    cmd: String,
    /// For `inject`: the fault's name.
    fault: Option<String>,
    /// For `inject poll-error`: how many polls fail (default 1).
    count: Option<u64>,
    /// For `inject poll-error`: the negative value `ibv_poll_cq` returns (default -5).
    ret: Option<i32>,
    /// For `inject async-fatal`: which event (default `device-fatal`).
    event: Option<String>,
}

/// The faults `inject` knows today.
pub const FAULTS: &str = "poll-error, async-fatal";

fn inject(req: &Request, faults: &FaultSwitch) -> Result<Value, String> {
    match req.fault.as_deref() {
        Some("poll-error") => {
            let ret = req.ret.unwrap_or(-5);
            if ret >= 0 {
                return Err(format!(
                    "ret must be negative (a failed ibv_poll_cq), not {ret}"
                ));
            }
            let count = req.count.unwrap_or(1);
            if count == 0 {
                return Err("count must be at least 1".into());
            }
            faults.arm_poll_error_n(ret, count);
            Ok(json!({"ok": true, "injected": "poll-error", "ret": ret, "count": count}))
        }
        Some("async-fatal") => {
            let ev = match req.event.as_deref().unwrap_or("device-fatal") {
                "device-fatal" => AsyncEvent::DeviceFatal,
                "cq-error" => AsyncEvent::CqError,
                "qp-fatal" => AsyncEvent::QpFatal,
                "device-removed" => AsyncEvent::DeviceRemoved,
                other => {
                    return Err(format!(
                        "unknown event {other:?}; known: device-fatal, cq-error, qp-fatal, device-removed"
                    ));
                }
            };
            faults.inject_async(ev);
            Ok(json!({"ok": true, "injected": "async-fatal", "event": format!("{ev:?}")}))
        }
        Some(other) => Err(format!("unknown fault {other:?}; known: {FAULTS}")),
        None => Err(format!("inject needs a \"fault\" ({FAULTS})")),
    }
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
    let req: Request = match serde_json::from_str(line) {
        Ok(r) => r,
        Err(e) => {
            return json!({"ok": false, "error": format!("bad request (a JSON object with a \"cmd\" string and only known fields): {e}")});
        }
    };
    match req.cmd.as_str() {
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
        "inject" | "clear" => match &cx.faults {
            None => {
                json!({"ok": false, "error": "fault injection is not available on this interface"})
            }
            Some(f) if req.cmd == "clear" => {
                f.clear();
                json!({"ok": true, "cleared": true})
            }
            Some(f) => inject(&req, f).unwrap_or_else(|e| json!({"ok": false, "error": e})),
        },
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?}; known: ping, stats, status, restart, inject, clear"),
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
        for bad in [
            json!({"cmd": "inject"}),
            json!({"cmd": "inject", "fault": "meteor"}),
            json!({"cmd": "inject", "fault": "poll-error", "ret": 3}),
            json!({"cmd": "inject", "fault": "async-fatal", "event": "boom"}),
            json!({"cmd": "stats", "typo": 1}),
        ] {
            assert!(
                matches!(request_json(&path, &bad), Err(ControlError::Refused(_))),
                "{bad}"
            );
        }
        request(&path, "clear").unwrap();
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
