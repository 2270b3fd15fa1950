//! The restart supervisor: one thread per interface that receives the interface whenever
//! its poller gives it up, and brings it back.
//!
//! A poller hands its interface over (by value, on a crossbeam channel) when a CQ poll
//! fails, a fatal asynchronous event or a device removal arrives, the send-stall
//! watchdog fires, or an operator asks (`uipoib restart`). What happens then, and when,
//! is decided by the restart machine ([`crate::iface::recovery`]: the sequence, the
//! backoff, the circuit breaker, device loss and return); the supervisor's thread
//! (`thread.rs`) feeds it what happened and performs what it asks: sets the TAP carrier
//! off (the TAP and its address stay); tears the interface down ([`close`]: QP to
//! error, flushes drained within a deadline on the wall clock, group detached, AHs,
//! QP, CQs, channel, MR, PD and context destroyed or the endpoint kept with a new QP
//! and CQs, every work request still outstanding reaped, the ledger checked); waits;
//! opens the next epoch (re-posting the receive ring and re-attaching the broadcast
//! group), adapts the TAP if the device came back with another GID or MTU, turns the
//! carrier on and starts a fresh poller, which announces the new QPN with a gratuitous
//! ARP; and keeps the status (`uipoib status`: state, dead reason, restart records).
//!
//! The QPs and CQs a renewal replaced are destroyed on a reaper thread (`reap-<tap>`,
//! `reaper.rs`), never on the poller thread, once their grace is over (see
//! [`crate::verbs::retire`]); a close waits out what is left of the grace, at most
//! [`CLOSE_GRACE_CAP`]. A close ends within [`CLOSE_BOUND`] even if the poller
//! hangs ([`Supervisor::finish_close`]).

pub mod close;
mod reaper;
mod thread;

use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender, unbounded};
use serde::{Deserialize, Serialize};

use crate::iface::recovery::Policy;
use crate::iface::stats::{Snapshot, Stats};
use crate::iface::{IfaceConfig, Interface};
use crate::tap::TapDevice;
use crate::verbs::Provider;
use crate::verbs::retire::RETIRE_GRACE;

pub use crate::iface::recovery::{HEALTHY_AFTER, Phases, RestartRecord};
pub use close::Close;
use thread::SupervisorThread;

/// Restart records kept for `uipoib status`.
pub const HISTORY_LEN: usize = 32;

/// What a close may take for stopping the poller and tearing the interface down: the
/// flush drain ([`crate::iface::FLUSH_DEADLINE`]) and the destroys, of which one can block for 1.2 s
/// (measured, see [`crate::verbs::retire`]), with room for several.
pub const CLOSE_EPOCH_BOUND: Duration = Duration::from_secs(5);

/// Longest a close waits for the QPs a renewal replaced to come due
/// ([`RETIRE_GRACE`]): at most one whole grace.
pub const CLOSE_GRACE_CAP: Duration = RETIRE_GRACE;

/// Longest a close takes (15 s): [`CLOSE_EPOCH_BOUND`] plus
/// [`CLOSE_GRACE_CAP`]. A supervisor (or poller) that has not ended by then is left
/// behind, and the daemon exits without it.
pub const CLOSE_BOUND: Duration = CLOSE_EPOCH_BOUND.saturating_add(CLOSE_GRACE_CAP);

/// What can be asked of a supervisor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// Restart the interface now (also revives a dead one).
    Restart,
    /// Close the interface and end.
    Close,
}

/// What `uipoib status` shows.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq)]
pub struct Status {
    /// `running`, `restarting`, `waiting-for-device`, `dead`, `stopping`, `stopped`.
    pub state: String,
    /// TAP name.
    pub tap: String,
    /// RDMA device.
    pub device: String,
    /// Its port.
    #[serde(default)]
    pub port: u8,
    /// Local QPN of the current epoch.
    pub qpn: u32,
    /// Local GID of the current epoch.
    pub gid: String,
    /// IPoIB MTU.
    pub mtu: u32,
    /// Interface address (IPv4).
    pub addr: String,
    /// IPv6 addresses besides the link-local one the kernel derives from the TAP's MAC.
    #[serde(default)]
    pub addr6: Vec<String>,
    /// Restart epoch (1 at start).
    pub epoch: u16,
    /// Restarts completed.
    pub restarts: u64,
    /// Why the interface is dead, when it is.
    pub dead_reason: Option<String>,
    /// The most recent restarts, oldest first.
    pub history: Vec<RestartRecord>,
    /// The restart rehearsed at start (`rehearse-restart`), once done: not a restart,
    /// not in `history` nor `restarts`.
    #[serde(default)]
    pub rehearsal: Option<RestartRecord>,
    /// Whether the control socket serves fault injection (`--allow-faults`); filled in
    /// by the control server.
    #[serde(default)]
    pub allow_faults: bool,
    /// Control-socket peers refused for their uid; filled in by the control server.
    #[serde(default)]
    pub control_peers_refused: u64,
    /// What a failed CQ poll does (`restart` but in demonstrations).
    #[serde(default = "default_policy_name")]
    pub poll_failure_policy: String,
    /// The daemon's process id (a fault comparison measures its CPU time).
    #[serde(default)]
    pub pid: u32,
}

fn default_policy_name() -> String {
    crate::iface::PollFailurePolicy::Restart.name().into()
}

/// How one interface ended.
#[derive(Debug)]
pub struct Ended {
    /// TAP name.
    pub name: String,
    /// Counters at the end.
    pub stats: Snapshot,
    /// The last teardown's ledger verdict.
    pub ledger: Result<(), String>,
}

/// A running supervisor.
pub struct Supervisor {
    orders: Sender<Order>,
    thread: Option<JoinHandle<()>>,
    /// The thread's [`Ended`], sent as its last act.
    ended: Receiver<Ended>,
    name: String,
}

/// Everything a supervisor needs.
pub struct Supervised {
    /// TAP name.
    pub name: String,
    /// How to rebuild the interface.
    pub params: IfaceConfig,
    /// Restart policy.
    pub policy: Policy,
    /// The provider to open_on the device with.
    pub provider: Arc<dyn Provider>,
    /// The TAP (stays up across restarts).
    pub tap: Arc<dyn TapDevice>,
    /// Counters (outlive epochs).
    pub stats: Arc<Stats>,
    /// Status shown on the control socket.
    pub status: Arc<Mutex<Status>>,
    /// Rehearse the restart after a failed poll once, as soon as the first poller runs
    /// (`rehearse-restart`; the supervisor thread runs it before the first announcement).
    pub rehearse: bool,
    /// The supervisor thread's nice level (`restart-nice`; `None`: the daemon's). The
    /// threads it starts run at the daemon's.
    pub restart_nice: Option<i32>,
}

impl Supervisor {
    /// Start supervising `first`, which is already open; its poller starts now.
    pub fn spawn(setup: Supervised, first: Interface) -> std::io::Result<Supervisor> {
        let (orders, rx) = unbounded();
        let (ended_tx, ended) = crossbeam_channel::bounded(1);
        let name = setup.name.clone();
        let thread = std::thread::Builder::new()
            .name(format!("sup-{name}"))
            .spawn(move || {
                let e = SupervisorThread::new(setup, rx).run(first);
                let _ = ended_tx.send(e);
            })?;
        Ok(Supervisor {
            orders,
            thread: Some(thread),
            ended,
            name,
        })
    }

    /// A handle to send orders (for the control socket).
    pub fn orders(&self) -> Sender<Order> {
        self.orders.clone()
    }

    /// Ask for a restart.
    pub fn restart(&self) {
        let _ = self.orders.send(Order::Restart);
    }

    /// Tear down and wait for the end, at most [`CLOSE_BOUND`]; `None` if it did not
    /// end by then (see [`Supervisor::finish_close`]).
    pub fn close(self) -> Option<Ended> {
        self.begin_close();
        self.finish_close(Instant::now() + CLOSE_BOUND)
    }

    /// Ask for the teardown without waiting (several interfaces then stop together).
    pub fn begin_close(&self) {
        let _ = self.orders.send(Order::Close);
    }

    /// Wait for the end until `deadline`. `None` if the supervisor had not ended by then
    /// (a hung poller or destroy): its threads are left behind, logged, and the caller
    /// goes on (the daemon exits).
    pub fn finish_close(mut self, deadline: Instant) -> Option<Ended> {
        match self.ended.recv_deadline(deadline) {
            Ok(e) => {
                if let Some(t) = self.thread.take()
                    && t.join().is_err()
                {
                    tracing::error!(iface = %self.name, "supervisor thread panicked");
                }
                Some(e)
            }
            Err(_) => {
                tracing::error!(iface = %self.name, "the interface did not stop in time: leaving its threads behind");
                None
            }
        }
    }
}
