//! The daemon: opens interfaces, creates and configures their TAPs, starts their pollers
//! and control sockets, and acts as their supervisor until SIGINT/SIGTERM.
//!
//! Supervision today: a poller that fails hands its interface over on a crossbeam
//! channel; the supervisor logs the cause, tears the interface down in order (QP to
//! error, drain flushes, detach, destroy, reap), checks the ledger, and the daemon exits
//! non-zero. Signals stop every poller, tear every interface down the same way and print
//! the counters.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use crossbeam_channel::{Receiver, select, unbounded};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::config::Config;
use crate::control::{ControlError, ControlServer, Status};
use crate::datapath::{FLUSH_DEADLINE, Failure, Interface, OpenError, Params};
use crate::poller::{Exit, Poller};
use crate::stats::Stats;
use crate::tap::{Tap, TapDevice, TapError};
use crate::verbs::Provider;

/// What stopped the daemon from starting or running.
#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    /// Opening the RDMA side failed.
    #[error("interface {tap}: {source}")]
    Open {
        /// TAP name.
        tap: String,
        /// Why.
        #[source]
        source: OpenError,
    },
    /// The TAP failed.
    #[error(transparent)]
    Tap(#[from] TapError),
    /// The control socket failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// Threads, signals.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// One interface to run.
pub struct Spec {
    /// Its validated configuration.
    pub config: Config,
    /// Network namespace to move the TAP into (tests).
    pub netns: Option<String>,
}

/// How the daemon ended.
#[derive(Debug)]
pub struct Outcome {
    /// Per interface: name, final counters, teardown verdict.
    pub interfaces: Vec<(String, crate::stats::Snapshot, Result<(), String>)>,
    /// The failure that ended it, if one did.
    pub failure: Option<String>,
}

impl Outcome {
    /// Exit code: 0 after a clean stop with balanced ledgers, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.failure.is_none() && self.interfaces.iter().all(|(_, _, l)| l.is_ok()) {
            0
        } else {
            1
        }
    }
}

struct Running {
    name: String,
    poller: Option<Poller>,
    status: Arc<Mutex<Status>>,
    stats: Arc<Stats>,
    _tap: Arc<Tap>,
    _control: ControlServer,
}

/// Run interfaces until a signal (or until `stop` receives), then tear down.
pub fn run(
    specs: Vec<Spec>,
    provider: &dyn Provider,
    stop: Option<Receiver<()>>,
) -> Result<Outcome, DaemonError> {
    let (exit_tx, exit_rx) = unbounded::<Exit>();
    let mut running: Vec<Running> = Vec::new();
    for spec in &specs {
        let c = &spec.config;
        let stats = Arc::new(Stats::default());
        let iface = Interface::open(provider, &Params::from_config(c), stats.clone(), 1).map_err(
            |source| DaemonError::Open {
                tap: c.tap.clone(),
                source,
            },
        )?;
        let tap = Arc::new(Tap::create(&c.tap)?);
        tap.configure(iface.mac(), iface.mtu(), c.addr, spec.netns.as_deref())?;
        let hw = iface.hw_addr();
        let status = Arc::new(Mutex::new(Status {
            state: "running".into(),
            tap: c.tap.clone(),
            device: c.device.clone(),
            qpn: hw.qpn,
            gid: hw.gid.to_string(),
            mtu: iface.mtu() as u32,
            addr: c.addr.to_string(),
            epoch: 1,
            last_failure: None,
        }));
        let control = ControlServer::start(&c.control, stats.clone(), status.clone())?;
        tracing::info!(tap = %c.tap, addr = %c.addr, mac = %iface.mac(), mtu = iface.mtu(), control = %c.control.display(), "interface up");
        let dev: Arc<dyn TapDevice> = tap.clone();
        let poller =
            Poller::spawn(c.tap.clone(), iface, dev, exit_tx.clone()).map_err(|source| {
                DaemonError::Io {
                    what: "starting the poller",
                    source,
                }
            })?;
        running.push(Running {
            name: c.tap.clone(),
            poller: Some(poller),
            status,
            stats,
            _tap: tap,
            _control: control,
        });
    }

    let (sig_tx, sig_rx) = unbounded::<i32>();
    let mut signals = signal_hook::iterator::Signals::new([SIGINT, SIGTERM]).map_err(|source| {
        DaemonError::Io {
            what: "installing signal handlers",
            source,
        }
    })?;
    let sig_handle = signals.handle();
    let sig_thread = std::thread::spawn(move || {
        for s in signals.forever() {
            if sig_tx.send(s).is_err() {
                break;
            }
        }
    });
    let never = crossbeam_channel::never();
    let stop_rx = stop.unwrap_or(never);

    let mut outcome = Outcome {
        interfaces: Vec::new(),
        failure: None,
    };
    let mut pending = running.len();
    let mut stopping = false;
    let stop_all = |running: &mut Vec<Running>| {
        for r in running.iter_mut() {
            if let Some(p) = &r.poller {
                p.stop();
            }
            if let Ok(mut s) = r.status.lock() {
                s.state = "stopping".into();
            }
        }
    };
    while pending > 0 {
        select! {
            recv(sig_rx) -> s => {
                if !stopping {
                    tracing::info!(signal = s.unwrap_or(0), "stopping");
                    stopping = true;
                    stop_all(&mut running);
                }
            }
            recv(stop_rx) -> _ => {
                if !stopping {
                    stopping = true;
                    stop_all(&mut running);
                }
            }
            recv(exit_rx) -> exit => {
                let Ok(exit) = exit else { break };
                pending -= 1;
                let (name, iface, failure) = match exit {
                    Exit::Stopped { name, iface } => (name, iface, None),
                    Exit::Failed { name, iface, cause, at } => (name, iface, Some((cause, at))),
                };
                if let Some((cause, at)) = &failure {
                    supervise_failure(&name, cause, *at);
                    if let Some(r) = running.iter().find(|r| r.name == name)
                        && let Ok(mut s) = r.status.lock()
                    {
                        s.state = "failed".into();
                        s.last_failure = Some(cause.to_string());
                    }
                    outcome.failure.get_or_insert_with(|| format!("{name}: {cause}"));
                    if !stopping {
                        // Without a restart policy the daemon ends: stop the others too.
                        stopping = true;
                        stop_all(&mut running);
                    }
                }
                let r = running.iter_mut().find(|r| r.name == name);
                let t = iface.shutdown(FLUSH_DEADLINE);
                if let Err(e) = &t.ledger {
                    tracing::error!(iface = %name, error = %e, "ledger does not balance after teardown");
                }
                tracing::info!(iface = %name, reaped = t.reaped, errors = t.errors, "interface torn down");
                if let Some(r) = r {
                    if let Some(p) = r.poller.take() {
                        p.join();
                    }
                    outcome.interfaces.push((name, r.stats.snapshot(), t.ledger));
                }
            }
        }
    }
    sig_handle.close();
    let _ = sig_thread.join();
    drop(running);
    Ok(outcome)
}

/// What the supervisor does with a failed interface in this version: say so clearly.
/// (The interface is then torn down by the caller; restart is not attempted.)
fn supervise_failure(name: &str, cause: &Failure, at: Instant) {
    tracing::error!(
        iface = %name,
        %cause,
        since_ms = at.elapsed().as_millis() as u64,
        "interface failed; tearing it down (no restart policy configured)"
    );
}

/// Default path of an interface's control socket, for the CLI.
pub fn control_path(tap: Option<&str>, control: Option<PathBuf>) -> Option<PathBuf> {
    control.or_else(|| tap.map(crate::config::default_control_path))
}
