//! The server thread: binding the socket, accepting peers (by uid, up to
//! [`MAX_CLIENTS`]), driving every connection from one mio poll, and removing the socket
//! it bound when stopped.

use std::collections::HashMap;
use std::io::{self, Write};
use std::os::fd::AsRawFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crossbeam_channel::Sender;
use serde_json::json;

use super::connection::{Client, Drive};
use super::path::{file_kind, prepare_dir, socket_id};
use super::protocol::Served;
use super::{CLIENT_TIMEOUT, ControlError, Status};
use crate::iface::neigh::NeighView;
use crate::iface::stats::Stats;
use crate::runtime::supervisor::Order;
use crate::sys::process as sys;
use crate::verbs::fault::FaultSwitch;

/// A running control server. Dropping it stops the thread and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    /// Device and inode of the socket bound, so that only it is removed at the end.
    bound: Option<(u64, u64)>,
    stop: Arc<AtomicBool>,
    waker: mio::Waker,
    refused: Arc<AtomicU64>,
    thread: Option<JoinHandle<()>>,
}

/// Whether a peer whose `SO_PEERCRED` uid is `peer` may use the control socket of a
/// daemon running as `own`: root, or the daemon's own user.
pub fn peer_allowed(peer: u32, own: u32) -> bool {
    peer == 0 || peer == own
}

/// Most clients served at once; one more is answered with an error and closed, so a
/// peer that opens connections without end cannot exhaust the daemon's descriptors.
pub const MAX_CLIENTS: usize = 64;

const LISTENER: mio::Token = mio::Token(0);
const WAKER: mio::Token = mio::Token(1);
const FIRST_CLIENT: usize = 2;

/// Write one error line to a connection that is about to be dropped. The socket is
/// fresh and its buffer empty, so the short line fits; if not, the peer gets nothing.
fn refuse(stream: &mut mio::net::UnixStream, why: &str) {
    let mut line = json!({"ok": false, "error": why}).to_string();
    line.push('\n');
    let _ = stream.write(line.as_bytes());
}

/// The server thread: one mio poll over the listener, every client and a waker.
fn serve(
    mut listener: mio::net::UnixListener,
    mut poll: mio::Poll,
    stop: &AtomicBool,
    cx: &Served,
) {
    let own = sys::euid();
    let mut events = mio::Events::with_capacity(64);
    let mut clients: HashMap<mio::Token, Client> = HashMap::new();
    let mut next = FIRST_CLIENT;
    if let Err(e) = poll
        .registry()
        .register(&mut listener, LISTENER, mio::Interest::READABLE)
    {
        tracing::error!(error = %e, "control socket: cannot poll the listener");
        return;
    }
    while !stop.load(Ordering::SeqCst) {
        let now = Instant::now();
        let timeout = clients
            .values()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min();
        if let Err(e) = poll.poll(&mut events, timeout)
            && e.kind() != io::ErrorKind::Interrupted
        {
            tracing::error!(error = %e, "control socket: poll failed");
            return;
        }
        let now = Instant::now();
        let mut ready: Vec<mio::Token> = Vec::new();
        for ev in events.iter() {
            match ev.token() {
                LISTENER => loop {
                    let mut stream = match listener.accept() {
                        Ok((s, _)) => s,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                        Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                        Err(e) => {
                            // EMFILE and the like: the pending connection stays queued
                            // and is retried at the next readiness or client event.
                            tracing::warn!(error = %e, "control socket accept failed");
                            break;
                        }
                    };
                    match sys::peer_uid(stream.as_raw_fd()) {
                        Ok(uid) if peer_allowed(uid, own) => {}
                        got => {
                            let n = cx.refused.fetch_add(1, Ordering::Relaxed) + 1;
                            let who = match got {
                                Ok(uid) => format!("uid {uid}"),
                                Err(e) => format!("a peer whose uid is unknown ({e})"),
                            };
                            if n.is_power_of_two() {
                                tracing::warn!(peer = %who, refused = n, "control socket: peer refused");
                            }
                            refuse(
                                &mut stream,
                                &format!(
                                    "permission denied: {who} may not use this control socket (only root and uid {own})"
                                ),
                            );
                            continue;
                        }
                    }
                    if clients.len() >= MAX_CLIENTS {
                        refuse(
                            &mut stream,
                            &format!("busy: {MAX_CLIENTS} clients are connected already"),
                        );
                        continue;
                    }
                    let token = mio::Token(next);
                    next = if next == usize::MAX {
                        FIRST_CLIENT
                    } else {
                        next + 1
                    };
                    if poll
                        .registry()
                        .register(
                            &mut stream,
                            token,
                            mio::Interest::READABLE | mio::Interest::WRITABLE,
                        )
                        .is_ok()
                    {
                        clients.insert(token, Client::new(stream, now));
                        ready.push(token);
                    }
                },
                WAKER => {}
                t => ready.push(t),
            }
        }
        for t in ready {
            if let Some(c) = clients.get_mut(&t)
                && c.drive(cx, now) == Drive::Close
                && let Some(mut c) = clients.remove(&t)
            {
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
        // Requests not read and answered in time.
        let late: Vec<mio::Token> = clients
            .iter()
            .filter(|(_, c)| c.deadline <= now)
            .map(|(t, _)| *t)
            .collect();
        for t in late {
            if let Some(mut c) = clients.remove(&t) {
                if c.output.is_empty() {
                    refuse(
                        &mut c.stream,
                        &format!(
                            "no complete request line within {} ms; closing",
                            CLIENT_TIMEOUT.as_millis()
                        ),
                    );
                }
                let _ = poll.registry().deregister(&mut c.stream);
            }
        }
    }
}

impl ControlServer {
    /// Bind `path` and serve requests on a thread.
    ///
    /// The directory is created (mode 0700) if missing and refused if someone other
    /// than this user or root owns it, or its group or others may write to it. A stale
    /// socket at `path` is removed and a live one (a daemon answers) refused; anything
    /// else there (a file, a symbolic link, a directory) is left alone and refused.
    /// The socket is bound under umask 077 and is mode 0600. Only peers whose uid is 0
    /// or this process's effective uid are served.
    ///
    /// `faults` is the interface's fault switch when fault injection is allowed (the
    /// daemon's `--allow-faults`); with `None`, `inject`, `clear` and `faults` are
    /// refused. `neigh` is where the interface publishes its neighbour table.
    pub fn start(
        path: &Path,
        stats: Arc<Stats>,
        status: Arc<Mutex<Status>>,
        neigh: NeighView,
        orders: Option<Sender<Order>>,
        faults: Option<Arc<FaultSwitch>>,
    ) -> Result<ControlServer, ControlError> {
        use std::os::unix::fs::FileTypeExt;
        let refused = Arc::new(AtomicU64::new(0));
        let cx = Served {
            stats,
            status,
            neigh,
            orders,
            faults,
            refused: refused.clone(),
        };
        let io_err = |source| ControlError::Io {
            path: path.to_owned(),
            source,
        };
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        prepare_dir(dir)?;
        match std::fs::symlink_metadata(path) {
            Ok(md) if md.file_type().is_socket() => {
                if UnixStream::connect(path).is_ok() {
                    return Err(ControlError::InUse(path.to_owned()));
                }
                // Stale: no daemon answers. The directory is this user's, so nobody
                // else can have swapped the socket for something else since the check.
                std::fs::remove_file(path).map_err(io_err)?;
            }
            Ok(md) => {
                return Err(ControlError::NotASocket {
                    path: path.to_owned(),
                    kind: file_kind(&md),
                });
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(io_err(e)),
        }
        let listener = sys::with_umask(0o077, || UnixListener::bind(path)).map_err(io_err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(io_err)?;
        let bound = socket_id(path);
        listener.set_nonblocking(true).map_err(io_err)?;
        let listener = mio::net::UnixListener::from_std(listener);
        let poll = mio::Poll::new().map_err(io_err)?;
        let waker = mio::Waker::new(poll.registry(), WAKER).map_err(io_err)?;
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let thread = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || serve(listener, poll, &stop2, &cx))
            .map_err(io_err)?;
        Ok(ControlServer {
            path: path.to_owned(),
            bound,
            stop,
            waker,
            refused,
            thread: Some(thread),
        })
    }

    /// [`ControlServer::start`] with fresh counters, a default status, an empty neighbour
    /// table and no supervisor
    /// to order: a socket that answers for no interface (what a test of the socket or of
    /// the client serves).
    pub fn start_bare(
        path: &Path,
        faults: Option<Arc<FaultSwitch>>,
    ) -> Result<ControlServer, ControlError> {
        Self::start(
            path,
            Arc::new(Stats::default()),
            Arc::new(Mutex::new(Status::default())),
            NeighView::default(),
            None,
            faults,
        )
    }

    /// Connections refused because the peer's uid was neither 0 nor this process's.
    pub fn peers_refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = self.waker.wake();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Only the socket this server bound: never whatever may have replaced it.
        if self.bound.is_some() && socket_id(&self.path) == self.bound {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
