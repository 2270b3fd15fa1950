//! The daemon: opens interfaces, creates and configures their TAPs, starts a restart
//! supervisor (which runs the poller) and a control socket for each, and waits for
//! SIGINT/SIGTERM. Then every supervisor tears its interface down in order and the
//! counters are printed. The teardown is bounded: all interfaces stop together, within
//! [`CLOSE_BOUND`] (15 s: 5 s to stop the poller and tear down, plus what is left of
//! the replaced QPs' 10 s grace); an interface that has not stopped by then (a hung
//! poller or destroy) is reported as such and the daemon exits without it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use crossbeam_channel::{Receiver, select, unbounded};
use signal_hook::consts::{SIGINT, SIGTERM};

use crate::iface::stats::Stats;
use crate::iface::{Interface, OpenError};
use crate::runtime::config::Config;
use crate::runtime::control::{ControlError, ControlServer};
use crate::runtime::metrics::MetricsServer;
use crate::runtime::notify;
use crate::runtime::supervisor::{CLOSE_BOUND, Status, Supervised, Supervisor};
use crate::tap::{Tap, TapDevice, TapError};
use crate::verbs::Provider;
use crate::verbs::fault::FaultyProvider;

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
    /// The metrics listener (`metrics-listen`) could not be bound.
    #[error("metrics-listen {addr}: {source}")]
    Metrics {
        /// The address.
        addr: std::net::SocketAddr,
        /// Why.
        #[source]
        source: std::io::Error,
    },
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
pub struct Launch {
    /// Its validated configuration.
    pub config: Config,
    /// Network namespace to move the TAP into (tests).
    pub netns: Option<String>,
}

/// How the daemon ended.
#[derive(Debug)]
pub struct Outcome {
    /// Per interface: name, final counters, last teardown's ledger verdict.
    pub interfaces: Vec<(String, crate::iface::stats::Snapshot, Result<(), String>)>,
}

impl Outcome {
    /// Exit code: 0 when every ledger balanced at the end, 1 otherwise.
    pub fn exit_code(&self) -> i32 {
        if self.interfaces.iter().all(|(_, _, l)| l.is_ok()) {
            0
        } else {
            1
        }
    }
}

struct Running {
    supervisor: Supervisor,
    name: String,
    stats: Arc<Stats>,
    status: Arc<Mutex<Status>>,
    _control: ControlServer,
    _metrics: Option<MetricsServer>,
    _tap: Arc<Tap>,
}

/// How often the daemon looks at its interfaces' states for the service manager (and
/// at most how long between two watchdog pings).
const NOTIFY_TICK: std::time::Duration = std::time::Duration::from_millis(250);

/// Run interfaces until SIGINT/SIGTERM (or until `stop` receives), then tear down. Under
/// a service manager (`NOTIFY_SOCKET`), report readiness, state and liveness to it (see
/// [`notify`]).
pub fn run(
    specs: Vec<Launch>,
    provider: Arc<dyn Provider>,
    stop: Option<Receiver<()>>,
) -> Result<Outcome, DaemonError> {
    // Signals first, so a signal during start-up is not lost.
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

    let mut running: Vec<Running> = Vec::new();
    let started = (|| {
        for spec in &specs {
            running.push(start(spec, provider.clone())?);
        }
        Ok::<(), DaemonError>(())
    })();
    if let Err(e) = started {
        for r in running {
            let _ = r.supervisor.close();
        }
        sig_handle.close();
        let _ = sig_thread.join();
        return Err(e);
    }

    let stop_rx = stop.unwrap_or_else(crossbeam_channel::never);
    // The service manager (systemd `Type=notify`), when there is one.
    let notifier = match notify::Notifier::from_env() {
        Ok(n) => n,
        Err(e) => {
            tracing::warn!(error = %e, "NOTIFY_SOCKET is unusable: no notifications to the service manager");
            None
        }
    };
    let watchdog = notifier.as_ref().and(notify::watchdog_interval());
    let tick = watchdog.map_or(NOTIFY_TICK, |w| w.min(NOTIFY_TICK));
    let mut ready = false;
    let mut last_status = String::new();
    loop {
        select! {
            recv(sig_rx) -> s => {
                tracing::info!(signal = s.unwrap_or(0), "stopping");
                break;
            }
            recv(stop_rx) -> _ => {
                tracing::info!("stopping");
                break;
            }
            default(tick) => {}
        }
        let Some(n) = &notifier else { continue };
        let states: Vec<(String, String)> = running
            .iter()
            .map(|r| {
                let st = r.status.lock().map(|s| s.state.clone()).unwrap_or_default();
                (r.name.clone(), st)
            })
            .collect();
        let line = notify::status_line(states.iter().map(|(a, b)| (a.as_str(), b.as_str())));
        let mut msg = String::new();
        if !ready && states.iter().all(|(_, s)| s == "running") {
            ready = true;
            msg.push_str("READY=1\n");
        }
        if line != last_status {
            msg.push_str(&line);
            msg.push('\n');
            last_status = line;
        }
        // The watchdog is fed while no interface is dead (restarting and waiting for a
        // device are the supervisor at work); a dead one lets it fire, and the service
        // manager's restart is the operator restart.
        if watchdog.is_some() && ready && states.iter().all(|(_, s)| s != "dead") {
            msg.push_str("WATCHDOG=1\n");
        }
        if !msg.is_empty()
            && let Err(e) = n.send(&msg)
        {
            tracing::debug!(error = %e, "notifying the service manager failed");
        }
    }
    if let Some(n) = &notifier {
        let _ = n.send("STOPPING=1\nSTATUS=stopping");
    }
    let outcome = stop_all(running, CLOSE_BOUND);
    sig_handle.close();
    let _ = sig_thread.join();
    Ok(outcome)
}

/// Stop every interface together, waiting at most `bound` for all of them. One that has
/// not stopped by then is in the outcome with its counters so far and a ledger verdict
/// that says so (exit code 1).
fn stop_all(running: Vec<Running>, bound: std::time::Duration) -> Outcome {
    for r in &running {
        r.supervisor.begin_close();
    }
    let deadline = std::time::Instant::now() + bound;
    let mut outcome = Outcome {
        interfaces: Vec::new(),
    };
    for r in running {
        match r.supervisor.finish_close(deadline) {
            Some(e) => {
                tracing::info!(iface = %e.name, ledger = ?e.ledger, "interface torn down");
                outcome.interfaces.push((e.name, e.stats, e.ledger));
            }
            None => {
                let why = format!("did not stop within {bound:?}: torn down by the exit");
                tracing::error!(iface = %r.name, "{why}");
                outcome
                    .interfaces
                    .push((r.name, r.stats.snapshot(), Err(why)));
            }
        }
    }
    outcome
}

fn start(spec: &Launch, provider: Arc<dyn Provider>) -> Result<Running, DaemonError> {
    let c = &spec.config;
    // Every interface's endpoints go through its own fault switch: inert unless a fault
    // is injected through the control socket, which serves injection only with
    // `allow-faults` (the switch stays in the path either way, so that the datapath is
    // the same one with and without the flag).
    let faulty = FaultyProvider::new(provider);
    let faults = faulty.switch();
    let provider: Arc<dyn Provider> = Arc::new(faulty);
    let stats = Arc::new(Stats::default());
    let params = c.iface_config();
    let neigh_view = params.neigh_view.clone();
    let iface = Interface::open(provider.as_ref(), &params, stats.clone(), 1, &mut None).map_err(
        |source| DaemonError::Open {
            tap: c.tap.clone(),
            source,
        },
    )?;
    let tap_started = std::time::Instant::now();
    let tap = Arc::new(Tap::create(&c.tap, c.tap_offload)?.with_stats(stats.clone()));
    tap.configure(
        iface.mac(),
        iface.mtu(),
        c.addr,
        &c.addr6,
        spec.netns.as_deref(),
    )?;
    let addr6: Vec<String> = c.addr6.iter().map(|a| a.to_string()).collect();
    let status = Arc::new(Mutex::new(Status {
        state: "starting".into(),
        tap: c.tap.clone(),
        device: c.device.clone(),
        port: c.port,
        addr: c.addr.to_string(),
        addr6: addr6.clone(),
        epoch: 1,
        poll_failure_policy: c.poll_failure.name().into(),
        pid: std::process::id(),
        ..Default::default()
    }));
    tracing::info!(tap = %c.tap, addr = %c.addr, addr6 = %format_args!("[{}]", addr6.join(", ")), mac = %iface.mac(), mtu = iface.mtu(), control = %c.control.display(), allow_faults = c.allow_faults, poll_failure_policy = %c.poll_failure, tap_setup_ms = tap_started.elapsed().as_millis() as u64, "interface up");
    let dev: Arc<dyn TapDevice> = tap.clone();
    let supervisor = Supervisor::spawn(
        Supervised {
            name: c.tap.clone(),
            params,
            policy: c.restart,
            provider,
            tap: dev,
            stats: stats.clone(),
            status: status.clone(),
            rehearse: c.rehearse_restart,
            restart_nice: c.restart_nice,
        },
        iface,
    )
    .map_err(|source| DaemonError::Io {
        what: "starting the supervisor",
        source,
    })?;
    let metrics = match c.metrics_listen {
        None => None,
        Some(addr) => {
            match MetricsServer::start(addr, c.tap.clone(), stats.clone(), status.clone()) {
                Ok(m) => {
                    tracing::info!(tap = %c.tap, addr = %m.local_addr(), "serving GET /metrics");
                    Some(m)
                }
                Err(source) => {
                    let _ = supervisor.close();
                    return Err(DaemonError::Metrics { addr, source });
                }
            }
        }
    };
    let control = match ControlServer::start(
        &c.control,
        stats.clone(),
        status.clone(),
        neigh_view,
        Some(supervisor.orders()),
        c.allow_faults.then_some(faults),
    ) {
        Ok(c) => c,
        Err(e) => {
            let _ = supervisor.close();
            return Err(e.into());
        }
    };
    Ok(Running {
        supervisor,
        name: c.tap.clone(),
        stats,
        status,
        _control: control,
        _metrics: metrics,
        _tap: tap,
    })
}

/// The control socket path for the CLI: `--control`, else the TAP's default.
pub fn control_path(tap: Option<&str>, control: Option<PathBuf>) -> Option<PathBuf> {
    control.or_else(|| tap.map(crate::runtime::config::default_control_path))
}
