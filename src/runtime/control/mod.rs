//! The control socket: a Unix stream socket per interface (`/run/uipoib/<tap>.sock`,
//! mode 0600) speaking line-delimited JSON.
//!
//! Requests are one JSON object per line: `{"cmd":"stats"}`, `{"cmd":"status"}`,
//! `{"cmd":"neigh"}` (the neighbour table, see [`neigh`]), `{"cmd":"restart"}`, `{"cmd":"ping"}`, and for fault injection
//! `{"cmd":"inject","fault":"poll-error","after":1000}` (see
//! [`FaultSpec::from_json`](crate::verbs::fault::FaultSpec::from_json) for the fields),
//! `{"cmd":"clear"}` and `{"cmd":"faults"}` (what is armed and what was
//! injected). Replies are one line: `{"ok":true,...}` or `{"ok":false,"error":"..."}`.
//! Junk gets an error reply naming what is wrong, never a crash. The server runs on its
//! own thread and reads only counters (atomics), a small status record, the neighbour
//! table's snapshot (published by the poller at housekeeping) and the fault
//! switch (whose lock the datapath takes only while a fault is armed, and never across
//! a client's I/O), so a slow or hung client can never stall the datapath.
//!
//! The host is not trusted: the socket's directory must be this user's (created 0700),
//! nothing but a stale socket is ever removed from the socket's path, the socket is
//! bound under umask 077, and a peer whose uid (`SO_PEERCRED`) is neither 0 nor the
//! daemon's gets one error line and is closed (and counted). One mio poll serves every
//! client at once: a client that sends half a line holds up nobody, each request has
//! [`CLIENT_TIMEOUT`] to arrive and be answered, and a line longer than
//! [`MAX_REQUEST`] gets an error reply naming the limit, not more memory. Fault
//! injection is served only when the daemon allows it (`--allow-faults`).
//!
//! Here: `protocol` (a request line to a reply), `connection` (one client's bytes and
//! deadline), `server` (the thread, its poll and the socket's life), `path` (the socket's
//! directory and what may be removed), `client` (one request from the CLI or a scenario),
//! `neigh` (the `neigh` reply and its text) and `watch` (`uipoib stats --watch`: rates
//! between two snapshots and the loop that prints them).

mod client;
mod connection;
pub mod neigh;
mod path;
mod protocol;
mod server;
pub mod watch;

use std::io;
use std::path::PathBuf;
use std::time::Duration;

use crate::verbs::fault::FaultKind;

pub use crate::runtime::supervisor::Status;
pub use client::{request, request_json};
pub use server::{ControlServer, MAX_CLIENTS, peer_allowed};

/// Longest request line accepted: the largest request (an `inject` with every field)
/// is a few hundred bytes, so 64 KiB is generous and bounds what one client costs.
pub const MAX_REQUEST: usize = 64 * 1024;

/// How long a client may take to send a request line (from connecting, or from the
/// previous reply) and to read the reply.
pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// The reply to a fault command on a daemon that does not allow fault injection.
pub const FAULTS_DISABLED: &str = "fault injection is disabled: start the daemon with --allow-faults (config key allow-faults = true) to allow inject, clear and faults";

/// A control-socket failure.
#[derive(Debug, thiserror::Error)]
pub enum ControlError {
    /// Another daemon answers on this socket.
    #[error("{0} is in use by a running uipoib (stop it first, or give --control)")]
    InUse(PathBuf),
    /// Something other than a socket is at the socket's path; it is left alone.
    #[error(
        "control socket path {path} is {kind}, not a socket; it was left alone (remove it yourself, or give another --control)"
    )]
    NotASocket {
        /// The socket path.
        path: PathBuf,
        /// What is there.
        kind: &'static str,
    },
    /// The socket's directory could be written by someone else, or is not usable.
    #[error(
        "control socket directory {dir}: {why} (it must be a directory owned by this user or root that only its owner can write, e.g. mode 0700)"
    )]
    UnsafeDir {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
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

/// The faults `inject` knows.
pub const FAULTS: &str = FaultKind::NAMES;

/// Injections listed by the `faults` command (the most recent).
pub const FAULTS_LISTED: usize = 100;

#[cfg(test)]
mod tests;
