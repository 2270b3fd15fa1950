//! `uipoib`: the command-line front end. See `uipoib --help`.

use std::collections::BTreeMap;
#[cfg(feature = "sim")]
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{ArgAction, Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use uipoib::iface::PollFailurePolicy;
use uipoib::iface::stats::Snapshot;
use uipoib::runtime::config::{AddrList, Config, ConfigError, ConfigKeys};
use uipoib::runtime::control;
use uipoib::runtime::daemon::{self, Launch};
use uipoib::runtime::kernel::KernelCounters;
use uipoib::runtime::supervisor::Status;
use uipoib::scenario::{Runner, Scenario};
use uipoib::verbs::fault::FaultSpec;
use uipoib::verbs::rdma::RdmaProvider;
#[cfg(feature = "sim")]
use uipoib::verbs::sim::SimFabric;

#[derive(Parser)]
#[command(
    name = "uipoib",
    version,
    about = "A userspace IPoIB-like datapath: a TAP interface carried over RDMA UD queue pairs"
)]
struct Cli {
    /// How log lines are written to stderr: text (coloured only when stderr is a
    /// terminal) or json (one object per line, for journald or a collector). RUST_LOG
    /// sets the level (default info); one that does not parse is an error.
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text)]
    log_format: LogFormat,
    #[command(subcommand)]
    cmd: Cmd,
}

/// `--log-format`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum LogFormat {
    /// Human lines.
    Text,
    /// One JSON object per line.
    Json,
}

/// The level filter from RUST_LOG (info without it); one that does not parse is an error
/// naming it, never a silent `info`.
fn log_filter(rust_log: Option<&str>) -> Result<EnvFilter, String> {
    match rust_log {
        None => Ok(EnvFilter::new("info")),
        Some(s) => EnvFilter::builder()
            .parse(s)
            .map_err(|e| format!("RUST_LOG={s:?} does not parse: {e}")),
    }
}

/// The log subscriber: `format` to `writer`, ANSI colour only with `ansi`.
fn log_subscriber<W>(
    format: LogFormat,
    filter: EnvFilter,
    ansi: bool,
    writer: W,
) -> Box<dyn tracing::Subscriber + Send + Sync>
where
    W: for<'w> tracing_subscriber::fmt::MakeWriter<'w> + Send + Sync + 'static,
{
    let b = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(writer);
    match format {
        LogFormat::Text => Box::new(b.with_ansi(ansi).finish()),
        LogFormat::Json => Box::new(b.json().with_ansi(false).finish()),
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring an interface up and carry its traffic until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Print a running daemon's counters.
    Stats(StatsArgs),
    /// Print a running daemon's state and restart history.
    Status(QueryArgs),
    /// Print a running daemon's neighbour table, one line per peer, like `ip neigh`:
    /// its addresses (IPv4 first, then IPv6), the MAC the TAP knows it by, its GID and
    /// QPN, its address handle (none or ready, and the sends in flight on it), when it
    /// was last heard from and sent to, and its state (REACHABLE, STALE or PROBE). Every
    /// entry is learned from ARP or neighbour discovery; there are no static entries.
    /// The table is as the datapath last published it (at most a second old). An empty
    /// table prints nothing.
    #[command(after_help = neigh_after_help())]
    Neigh(QueryArgs),
    /// Ask a running daemon to restart its interface (also revives a dead one).
    Restart(QueryArgs),
    /// Print a shell completion script (e.g. `uipoib completions bash >
    /// /etc/bash_completion.d/uipoib`).
    Completions {
        /// The shell.
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
    /// Write the man pages (uipoib.1 and one per subcommand, uipoib-up.1, ...) into DIR,
    /// or print uipoib.1 alone without DIR.
    Man {
        /// Where to write them (created if missing).
        dir: Option<PathBuf>,
    },
    /// Inject or clear faults in a running daemon (for recovery tests).
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Run two interfaces over the in-process simulated fabric, each TAP in its own
    /// network namespace (for tests; not a measurement of any RDMA device). Built only
    /// with the `sim` feature.
    #[cfg(feature = "sim")]
    SimPair(SimPairArgs),
}

#[derive(Args, Default)]
struct TuneArgs {
    /// IPoIB MTU (default: the port's active MTU minus 4).
    #[arg(long)]
    mtu: Option<u32>,
    /// Receive completions per poll before yielding.
    #[arg(long)]
    budget: Option<u32>,
    /// Receive ring size (power of two).
    #[arg(long)]
    recv_ring: Option<u32>,
    /// Send ring size (power of two).
    #[arg(long)]
    send_ring: Option<u32>,
    /// Completions per ibv_poll_cq call.
    #[arg(long)]
    poll_batch: Option<u32>,
    /// Frames read from the TAP per turn (posted as one chain).
    #[arg(long)]
    tx_batch: Option<u32>,
    /// Keep polling the CQs and the TAP this many microseconds after the last packet
    /// instead of arming and sleeping: lower latency for CPU time (0: off).
    #[arg(long, value_name = "MICROSECONDS")]
    busy_poll_us: Option<u64>,
    /// Active queue management of the receive queue: once every poll has left completions
    /// in the receive CQ for this long, drop received TCP segments at CoDel's rate until
    /// a poll empties it (0, the default: off; 100 is CoDel's own interval).
    #[arg(long, value_name = "MILLISECONDS")]
    rx_aqm_ms: Option<u64>,
    /// The poller thread's nice level while a poll finds more than one received frame
    /// waiting (and for 100 ms after the last such poll): the applications the TAP's
    /// writes wake then do not preempt it frame by frame. A level lower than the daemon's
    /// needs CAP_SYS_NICE or a RLIMIT_NICE that allows it; one not below it does nothing.
    #[arg(long, value_name = "NICE", allow_negative_numbers = true)]
    rx_boost_nice: Option<i64>,
    /// Run the poller thread under SCHED_BATCH: a wake-up of it (a TAP frame, a
    /// completion) waits for the running task's turn instead of preempting it, so an
    /// application writing to the TAP is not interrupted frame by frame: true or false.
    #[arg(long, value_name = "BOOL")]
    poller_batch: Option<bool>,
    /// Q_Key of the UD QP.
    #[arg(long, value_parser = parse_u32)]
    qkey: Option<u32>,
    /// Broadcast group: an IPv4 multicast address or a multicast GID.
    #[arg(long)]
    group: Option<String>,
    /// TAP checksum and TCP segmentation offload: true or false (default true).
    #[arg(long, value_name = "BOOL")]
    tap_offload: Option<bool>,
    /// A second bank of receive and send slots, so that a restart after a failed poll
    /// posts the new ring and announces it before the failed QP is destroyed (doubles
    /// the registered memory): true or false (default true).
    #[arg(long, value_name = "BOOL")]
    spare_bank: Option<bool>,
    /// Rehearse the restart after a failed poll once at start, before the first
    /// announcement, so that the first real one does not run its code for the first time:
    /// true or false (default true).
    #[arg(long, value_name = "BOOL")]
    rehearse_restart: Option<bool>,
    /// The restart supervisor's nice level, -20..=19 (default -10; the daemon's own level
    /// leaves it as is); the datapath's threads keep the daemon's. A level lower than
    /// the daemon's needs CAP_SYS_NICE or a RLIMIT_NICE that allows it.
    #[arg(long, value_name = "NICE", allow_negative_numbers = true)]
    restart_nice: Option<i64>,
}

#[derive(Args)]
struct UpArgs {
    /// RDMA device (e.g. rxe0, mlx5_0).
    #[arg(long)]
    device: Option<String>,
    /// TAP device name to create.
    #[arg(long)]
    tap: Option<String>,
    /// Interface address with prefix, IPv4 or IPv6; repeat the flag for more: exactly one
    /// IPv4 (e.g. 198.18.1.1/24) and up to 8 IPv6 (e.g. 2001:2:0:1::1/64; the link-local
    /// one comes from the TAP's MAC). Given here, these replace the config file's `addr`
    /// list entirely.
    #[arg(long, value_name = "ADDR/PREFIX", action = ArgAction::Append)]
    addr: Vec<String>,
    /// TOML config file; flags given on the command line win.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Port number (default 1).
    #[arg(long)]
    port: Option<u8>,
    /// GID index (default: the first RoCEv2 IPv4-mapped GID).
    #[arg(long)]
    gid_index: Option<u8>,
    /// Control socket (default /run/uipoib/<tap>.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Serve fault injection (`uipoib fault inject|clear|show`, `fault run`) on the
    /// control socket; without it those are refused. For recovery tests only.
    #[arg(long)]
    allow_faults: bool,
    /// What a failed CQ poll does: restart (the default: the whole interface is torn
    /// down, reaped and rebuilt), or, to see why, one of the alternatives argued in
    /// 2016: skip (drop the poll, leave the CQ unarmed), retry (poll again at once),
    /// recreate-cq (replace that CQ, keep the QP). The alternatives need --allow-faults.
    #[arg(long, value_name = "POLICY")]
    poll_failure_policy: Option<String>,
    /// Validate the flags and the config file and print what would be opened and
    /// created, without touching any device; exit 0 if valid, 2 naming what is wrong.
    #[arg(long)]
    check: bool,
    /// Serve the counters at http://ADDR/metrics (Prometheus text format), e.g.
    /// 127.0.0.1:9464.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<String>,
    #[command(flatten)]
    tune: TuneArgs,
}

#[derive(Args)]
struct QueryArgs {
    /// The interface's TAP name (finds /run/uipoib/<tap>.sock).
    #[arg(long, required_unless_present = "control")]
    tap: Option<String>,
    /// The control socket path.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Machine-readable output.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
struct StatsArgs {
    #[command(flatten)]
    q: QueryArgs,
    /// The counters in the Prometheus text exposition format (0.0.4), with the state
    /// from `uipoib status`.
    #[arg(long, conflicts_with = "json")]
    prometheus: bool,
    /// Print, every interval, each counter that changed with its total and its rate per
    /// second (a gauge: how far it moved; a counter that went down, as after a daemon
    /// restart: `reset`). On a terminal the screen is redrawn; otherwise one block per
    /// interval after a timestamp line; with --json one object per interval. Ends on
    /// Ctrl-C or SIGTERM (exit 0), or when the daemon goes away (exit 1).
    #[arg(long, conflicts_with = "prometheus")]
    watch: bool,
    /// Seconds between two samples of --watch (fractions allowed, 0.1 to 3600).
    #[arg(long, value_name = "SECS", requires = "watch", value_parser = control::watch::parse_interval, default_value = "1")]
    interval: std::time::Duration,
}

fn neigh_after_help() -> String {
    format!(
        "With --json: a JSON array, one object per peer with these fields (always all of them):\n{}",
        control::neigh::fields_help()
    )
}

#[derive(Subcommand)]
enum FaultCmd {
    /// Arm a fault (see the fault list below; without a trigger it fires on command).
    Inject(Box<InjectArgs>),
    /// Disarm every fault (stalled sends flow again, a hidden device returns).
    Clear(QueryArgs),
    /// Show the armed faults and the most recent injections.
    Show(QueryArgs),
    /// Play a scenario file (config/faults/*.toml) against a running daemon and report
    /// on every fault; exits 1 if an expectation failed, 2 if the file is invalid.
    Run(RunArgs),
    /// Check scenario files without running them (exits 2 naming the first problem).
    Check(CheckArgs),
    /// Play a scenario once per poll-failure policy, each against a daemon this command
    /// starts fresh (`uipoib up UP_ARGS --tap TAP --allow-faults --poll-failure-policy
    /// P`), and print one table of what each policy did (also as JSON). Exits 1 if a
    /// ledger does not account for every work request, restart did not recover, or a
    /// daemon could not be run; 2 on a usage error.
    Compare(CompareArgs),
}

#[derive(Args)]
#[command(
    after_help = "Example (in the rxe lab, guest b, guest a serving iperf3):
  uipoib fault compare config/compare/transient.toml --tap uip0 \
      --var peer=198.18.1.1 --json compare.json -- --device rxe0 --addr 198.18.1.2/24"
)]
struct CompareArgs {
    /// The scenario file (its `[compare]` table may list the policies).
    file: PathBuf,
    /// The policies to compare, comma-separated (default: the file's, else all four:
    /// restart, skip, retry, recreate-cq).
    #[arg(long, value_delimiter = ',')]
    policies: Vec<String>,
    /// The TAP each daemon creates.
    #[arg(long)]
    tap: String,
    /// The daemons' control socket (default /run/uipoib/<tap>.sock).
    #[arg(long)]
    control: Option<PathBuf>,
    /// Set a scenario variable (overrides the file's [vars]); repeatable.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Also write the comparison as JSON to this file (each policy's run with its
    /// 50 ms counter samples and iperf3 intervals), and next to it one plot per policy,
    /// compare-SCENARIO-POLICY.svg (Mbit/s over time, the injection, detection and
    /// resumption marked, every policy on the same scale).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// No plots next to the --json file.
    #[arg(long)]
    no_plot: bool,
    /// Where the daemons' logs go (default: the system's temporary directory).
    #[arg(long, value_name = "DIR")]
    logs: Option<PathBuf>,
    /// How long each daemon may take to answer `running`.
    #[arg(long, default_value_t = 30, value_name = "SECONDS")]
    start_timeout_secs: u64,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
    /// `uipoib up`'s other arguments (device, address, config file, tuning), after `--`.
    #[arg(last = true, required = true, value_name = "UP_ARGS")]
    up_args: Vec<std::ffi::OsString>,
}

fn scenario_compare(a: &CompareArgs) -> ExitCode {
    let usage = |m: String| {
        eprintln!("uipoib: {m}");
        ExitCode::from(2)
    };
    let vars = match parse_vars(&a.vars) {
        Ok(v) => v,
        Err(e) => return usage(e),
    };
    let scenario = match Scenario::load(&a.file, &vars) {
        Ok(s) => s,
        Err(e) => return usage(e.to_string()),
    };
    let policies = if a.policies.is_empty() {
        scenario
            .compare
            .as_ref()
            .map_or_else(|| PollFailurePolicy::ALL.to_vec(), |c| c.policies.clone())
    } else {
        match uipoib::scenario::parse_policies(&a.policies) {
            Ok(p) => p,
            Err(e) => return usage(format!("--policies: {e}")),
        }
    };
    for arg in &a.up_args {
        let s = arg.to_string_lossy();
        let name = s.split('=').next().unwrap_or("");
        if [
            "--tap",
            "--control",
            "--allow-faults",
            "--poll-failure-policy",
        ]
        .contains(&name)
        {
            return usage(format!(
                "{name} after `--`: the comparison sets it for every daemon (give --tap and --control before `--`)"
            ));
        }
    }
    let program = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => return usage(format!("cannot find this program's path: {e}")),
    };
    let control = a
        .control
        .clone()
        .unwrap_or_else(|| uipoib::runtime::config::default_control_path(&a.tap));
    // A config file among the daemon's arguments must not move the control socket away
    // from where the comparison looks for it.
    let mut args = a.up_args.iter();
    while let Some(arg) = args.next() {
        let s = arg.to_string_lossy();
        let file = match s.strip_prefix("--config=") {
            Some(f) => Some(PathBuf::from(f)),
            None if s == "--config" => args.next().map(PathBuf::from),
            None => None,
        };
        if let Some(f) = file {
            match ConfigKeys::load(&f) {
                Ok(k) => {
                    if let Some(c) = k.control
                        && c != control
                    {
                        return usage(format!(
                            "{} sets control = {:?}: give --control {} to the comparison (before `--`) so that it finds the daemons",
                            f.display(),
                            c.display(),
                            c.display()
                        ));
                    }
                }
                Err(e) => return usage(e.to_string()),
            }
        }
    }
    let opts = uipoib::scenario::CompareOptions {
        scenario,
        policies,
        tap: a.tap.clone(),
        control,
        control_flag: a.control.clone(),
        up_args: a.up_args.clone(),
        program,
        logs: a.logs.clone().unwrap_or_else(std::env::temp_dir),
        start_timeout: std::time::Duration::from_secs(a.start_timeout_secs.max(1)),
        quiet: a.quiet,
    };
    let mut report = opts.run();
    let plotted = match &a.json {
        Some(j) if !a.no_plot => plots_written(uipoib::scenario::write_compare_plots(
            &mut report,
            &plot_dir(j),
        )),
        _ => true,
    };
    finish(
        &report.to_text(),
        a.json.as_deref(),
        &report,
        "the comparison",
        report.passed && plotted,
    )
}

#[derive(Args)]
struct RunArgs {
    /// The scenario file.
    file: PathBuf,
    /// The interface's TAP name (finds /run/uipoib/<tap>.sock).
    #[arg(long, required_unless_present = "control")]
    tap: Option<String>,
    /// The control socket path.
    #[arg(long)]
    control: Option<PathBuf>,
    /// Set a scenario variable (overrides the file's [vars]); repeatable.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
    /// Also write the report as JSON to this file (with the run's 50 ms counter samples
    /// and iperf3 intervals), and next to it one plot per fault, SCENARIO-N-FAULT.svg
    /// (N: its index in the report; Mbit/s over time, the injection, detection and
    /// resumption marked).
    #[arg(long, value_name = "PATH")]
    json: Option<PathBuf>,
    /// No plots next to the --json file.
    #[arg(long)]
    no_plot: bool,
    /// No progress lines on stderr.
    #[arg(long, short)]
    quiet: bool,
}

/// Where the plots of a report written to `json` go: its directory.
fn plot_dir(json: &std::path::Path) -> PathBuf {
    json.parent()
        .filter(|p| !p.as_os_str().is_empty())
        .map_or_else(|| PathBuf::from("."), std::path::Path::to_path_buf)
}

/// Print what `write` could not write; whether it wrote everything.
fn plots_written(errors: Vec<String>) -> bool {
    for e in &errors {
        eprintln!("uipoib: plot: {e}");
    }
    errors.is_empty()
}

#[derive(Args)]
struct CheckArgs {
    /// The scenario files.
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Set a scenario variable; repeatable.
    #[arg(long = "var", value_name = "NAME=VALUE")]
    vars: Vec<String>,
}

/// `NAME=VALUE` pairs.
fn parse_vars(vars: &[String]) -> Result<BTreeMap<String, String>, String> {
    vars.iter()
        .map(|v| match v.split_once('=') {
            Some((k, val)) if !k.is_empty() => Ok((k.to_string(), val.to_string())),
            _ => Err(format!("--var {v:?}: give NAME=VALUE")),
        })
        .collect()
}

fn scenario_check(a: &CheckArgs) -> ExitCode {
    let vars = match parse_vars(&a.vars) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("uipoib: {e}");
            return ExitCode::from(2);
        }
    };
    let mut bad = false;
    for f in &a.files {
        match Scenario::load(f, &vars) {
            Ok(s) => println!(
                "{}: ok ({}: {} steps{})",
                f.display(),
                s.name,
                s.steps.len(),
                if s.repeat > 1 {
                    format!(", {} times", s.repeat)
                } else {
                    String::new()
                }
            ),
            Err(e) => {
                eprintln!("uipoib: {e}");
                bad = true;
            }
        }
    }
    if bad {
        ExitCode::from(2)
    } else {
        ExitCode::SUCCESS
    }
}

/// Print a run's table, write it as JSON to `json` when given (a failure is printed,
/// naming `what`), and exit 0 only if it `passed` and was written.
fn finish(
    table: &str,
    json: Option<&std::path::Path>,
    value: &impl serde::Serialize,
    what: &str,
    passed: bool,
) -> ExitCode {
    print!("{table}");
    if let Some(path) = json {
        let text = match serde_json::to_string_pretty(value) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("uipoib: {what} as JSON: {e}");
                return ExitCode::from(1);
            }
        };
        if let Err(e) = std::fs::write(path, text + "\n") {
            eprintln!("uipoib: writing {}: {e}", path.display());
            return ExitCode::from(1);
        }
    }
    if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn scenario_run(a: &RunArgs) -> ExitCode {
    let vars = match parse_vars(&a.vars) {
        Ok(v) => v,
        Err(e) => {
            eprintln!("uipoib: {e}");
            return ExitCode::from(2);
        }
    };
    let scenario = match Scenario::load(&a.file, &vars) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("uipoib: {e}");
            return ExitCode::from(2);
        }
    };
    let Some(path) = daemon::control_path(a.tap.as_deref(), a.control.clone()) else {
        eprintln!("uipoib: give --tap or --control");
        return ExitCode::from(2);
    };
    let mut runner = Runner::new(scenario, &path);
    if a.quiet {
        runner = runner.quiet();
    }
    let mut report = match runner.run() {
        Ok(r) => r,
        Err(e) => {
            eprintln!("uipoib: {e}");
            return ExitCode::from(1);
        }
    };
    let plotted = match &a.json {
        Some(j) if !a.no_plot => {
            plots_written(uipoib::scenario::write_run_plots(&mut report, &plot_dir(j)))
        }
        _ => true,
    };
    finish(
        &report.to_text(),
        a.json.as_deref(),
        &report,
        "the report",
        report.passed && plotted,
    )
}

#[derive(Args)]
#[command(after_help = "Faults (and the operations their triggers count):
  poll-error        ibv_poll_cq returns a negative value [--ret] [--cq] [--lose N] (poll_cq calls)
  lost-completion   a completion is swallowed [--cq send|recv|any]      (completions)
  qp-error          the QP is moved to the error state [--event qp-fatal|none] (poll_cq calls)
  post-send-error   posting a send fails [--errno]                      (send WRs)
  post-recv-error   posting a receive fails [--errno]                   (receive WRs)
  async-fatal       a fatal async event [--event device-fatal|cq-error|qp-fatal|device-removed]
  spurious-event    a completion event with nothing to poll             (poll_cq calls)
  slow-poll         each poll is delayed [--delay-ms] (default: every poll until cleared)
  corrupt-rx        bytes of received packets are flipped [--bytes]     (receive completions)
  stall-send        send completions are held back until cleared or a restart (send polls)")]
struct InjectArgs {
    #[command(flatten)]
    target: QueryArgs,
    /// The fault (see below).
    fault: String,
    /// Fire once N operations have passed.
    #[arg(long, value_name = "N", conflicts_with_all = ["every", "at_ms", "probability"])]
    after: Option<u64>,
    /// Fire on every N-th operation.
    #[arg(long, value_name = "N", conflicts_with_all = ["at_ms", "probability"])]
    every: Option<u64>,
    /// Fire from the first operation T milliseconds after arming.
    #[arg(long, value_name = "T", conflicts_with = "probability")]
    at_ms: Option<u64>,
    /// Fire on each operation with probability P (0 < P <= 1), drawn from --seed.
    #[arg(long, value_name = "P")]
    probability: Option<f64>,
    /// Seed of --probability (the same seed hits the same operations).
    #[arg(long, value_name = "S", requires = "probability")]
    seed: Option<u64>,
    /// Fire at most N times (default: once, or until cleared for --every and
    /// --probability); "unlimited" fires until cleared.
    #[arg(long, value_name = "N")]
    count: Option<String>,
    /// poll-error: the negative value the poll returns (default -5).
    #[arg(long, allow_negative_numbers = true)]
    ret: Option<i32>,
    /// post-send-error, post-recv-error: the errno, a number or a name (default ENOMEM).
    #[arg(long)]
    errno: Option<String>,
    /// async-fatal: device-fatal, cq-error, qp-fatal or device-removed; qp-error:
    /// qp-fatal to raise QP_FATAL too.
    #[arg(long)]
    event: Option<String>,
    /// slow-poll: the delay of each poll hit, in ms (default 5).
    #[arg(long, value_name = "MS")]
    delay_ms: Option<u64>,
    /// corrupt-rx: bytes flipped per packet hit (default 1).
    #[arg(long)]
    bytes: Option<u32>,
    /// lost-completion: which CQ's completions are lost: send (default), recv or any;
    /// poll-error: which CQ's polls fail (default any).
    #[arg(long)]
    cq: Option<String>,
    /// poll-error: the failing poll consumes up to N completions and never returns them.
    #[arg(long, value_name = "N")]
    lose: Option<u64>,
    /// Once it has fired, keep it armed for MS milliseconds, then spend it ("every poll
    /// fails for 2 s": --every 1 --for-ms 2000; without --count it fires until then).
    #[arg(long, value_name = "MS")]
    for_ms: Option<u64>,
    /// Hit only the endpoint it first hits, until that endpoint restarts ("every poll
    /// fails until the interface is restarted": --every 1 --until-restart; without
    /// --count it fires until then; `fault show` lists it until the next poll after the
    /// restart finds it spent).
    #[arg(long)]
    until_restart: bool,
}

impl InjectArgs {
    /// The request for the control socket.
    fn request(&self) -> serde_json::Value {
        let mut req = serde_json::json!({"cmd": "inject", "fault": self.fault});
        let mut put = |k: &str, v: Option<serde_json::Value>| {
            if let Some(v) = v {
                req[k] = v;
            }
        };
        put("after", self.after.map(Into::into));
        put("every", self.every.map(Into::into));
        put("at_ms", self.at_ms.map(Into::into));
        put("probability", self.probability.map(Into::into));
        put("seed", self.seed.map(Into::into));
        put(
            "count",
            self.count.as_ref().map(|c| match c.parse::<u64>() {
                Ok(n) => n.into(),
                Err(_) => c.clone().into(),
            }),
        );
        put("ret", self.ret.map(Into::into));
        put("errno", self.errno.clone().map(Into::into));
        put("event", self.event.clone().map(Into::into));
        put("delay_ms", self.delay_ms.map(Into::into));
        put("bytes", self.bytes.map(Into::into));
        put("cq", self.cq.clone().map(Into::into));
        put("lose", self.lose.map(Into::into));
        put("for_ms", self.for_ms.map(Into::into));
        put("until_restart", self.until_restart.then_some(true.into()));
        req
    }
}

#[cfg(feature = "sim")]
#[derive(Args)]
struct SimPairArgs {
    /// Namespace for the first TAP (must exist).
    #[arg(long)]
    netns_a: String,
    /// Namespace for the second TAP (must exist).
    #[arg(long)]
    netns_b: String,
    /// First TAP name.
    #[arg(long, default_value = "uipa")]
    tap_a: String,
    /// Second TAP name.
    #[arg(long, default_value = "uipb")]
    tap_b: String,
    /// First interface's address with prefix; repeat for more (one IPv4, up to 8 IPv6),
    /// as `up --addr`. Given, these replace the default.
    #[arg(long, default_value = "198.18.2.1/24", action = ArgAction::Append)]
    addr_a: Vec<String>,
    /// Second interface's address(es), as `--addr-a`.
    #[arg(long, default_value = "198.18.2.2/24", action = ArgAction::Append)]
    addr_b: Vec<String>,
    /// Control socket of the first interface (default /run/uipoib/<tap-a>.sock).
    #[arg(long)]
    control_a: Option<PathBuf>,
    /// Control socket of the second interface.
    #[arg(long)]
    control_b: Option<PathBuf>,
    /// Serve fault injection on both control sockets. Off unless given, as for `up`:
    /// the rig's TAPs and control sockets are real, and the same opt-in everywhere
    /// means a test that forgets the flag fails, not a daemon that forgets to refuse.
    #[arg(long)]
    allow_faults: bool,
    /// Simulated port MTU (256..4096).
    #[arg(long, default_value_t = 4096)]
    port_mtu: u32,
    #[command(flatten)]
    tune: TuneArgs,
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = if let Some(h) = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        u32::from_str_radix(h, 16)
    } else {
        s.parse()
    };
    r.map_err(|_| format!("{s:?} is not a 32-bit number"))
}

impl TuneArgs {
    fn apply(&self, f: ConfigKeys) -> ConfigKeys {
        ConfigKeys {
            mtu: self.mtu,
            budget: self.budget,
            recv_ring: self.recv_ring,
            send_ring: self.send_ring,
            poll_batch: self.poll_batch,
            tx_batch: self.tx_batch,
            busy_poll_us: self.busy_poll_us,
            rx_aqm_ms: self.rx_aqm_ms,
            rx_boost_nice: self.rx_boost_nice,
            poller_batch: self.poller_batch,
            qkey: self.qkey,
            group: self.group.clone(),
            tap_offload: self.tap_offload,
            spare_bank: self.spare_bank,
            rehearse_restart: self.rehearse_restart,
            restart_nice: self.restart_nice,
            ..Default::default()
        }
        .or(f)
    }
}

fn up_config(a: &UpArgs) -> Result<Config, ConfigError> {
    let (file, text) = match &a.config {
        Some(p) => (ConfigKeys::load(p)?, std::fs::read_to_string(p).ok()),
        None => (ConfigKeys::default(), None),
    };
    let flags = ConfigKeys {
        device: a.device.clone(),
        tap: a.tap.clone(),
        addr: (!a.addr.is_empty()).then(|| AddrList(a.addr.clone())),
        port: a.port,
        gid_index: a.gid_index,
        control: a.control.clone(),
        allow_faults: a.allow_faults.then_some(true),
        poll_failure_policy: a.poll_failure_policy.clone(),
        metrics_listen: a.metrics_listen.clone(),
        ..Default::default()
    };
    let from_flags = flag_keys(a);
    Config::from_keys(a.tune.apply(flags.or(file))).map_err(|e| match (&e, &a.config, &text) {
        // A value the file gave (no flag overrode it): name the file and line.
        (ConfigError::Invalid { key, .. }, Some(p), Some(t)) if !from_flags.contains(key) => {
            e.in_file(p, t)
        }
        _ => e,
    })
}

/// The config keys the command line sets (they win over the file's).
fn flag_keys(a: &UpArgs) -> Vec<&'static str> {
    let t = &a.tune;
    [
        ("device", a.device.is_some()),
        ("tap", a.tap.is_some()),
        ("addr", !a.addr.is_empty()),
        ("port", a.port.is_some()),
        ("gid-index", a.gid_index.is_some()),
        ("control", a.control.is_some()),
        ("allow-faults", a.allow_faults),
        ("poll-failure-policy", a.poll_failure_policy.is_some()),
        ("metrics-listen", a.metrics_listen.is_some()),
        ("mtu", t.mtu.is_some()),
        ("budget", t.budget.is_some()),
        ("recv-ring", t.recv_ring.is_some()),
        ("send-ring", t.send_ring.is_some()),
        ("poll-batch", t.poll_batch.is_some()),
        ("tx-batch", t.tx_batch.is_some()),
        ("busy-poll-us", t.busy_poll_us.is_some()),
        ("rx-aqm-ms", t.rx_aqm_ms.is_some()),
        ("rx-boost-nice", t.rx_boost_nice.is_some()),
        ("poller-batch", t.poller_batch.is_some()),
        ("qkey", t.qkey.is_some()),
        ("group", t.group.is_some()),
        ("tap-offload", t.tap_offload.is_some()),
        ("spare-bank", t.spare_bank.is_some()),
        ("rehearse-restart", t.rehearse_restart.is_some()),
        ("restart-nice", t.restart_nice.is_some()),
    ]
    .into_iter()
    .filter_map(|(k, set)| set.then_some(k))
    .collect()
}

/// `uipoib man`: uipoib.1 to stdout, or every page (the command and each subcommand,
/// nested ones as uipoib-fault-run.1) into `dir`.
fn man_pages(dir: Option<&std::path::Path>) -> ExitCode {
    use clap::CommandFactory as _;
    let cmd = Cli::command();
    let Some(dir) = dir else {
        let mut page = Vec::new();
        return match clap_mangen::Man::new(cmd).render(&mut page) {
            Ok(()) => write_stdout(&page),
            Err(e) => {
                eprintln!("uipoib: rendering the man page: {e}");
                ExitCode::from(1)
            }
        };
    };
    if let Err(e) = std::fs::create_dir_all(dir) {
        eprintln!("uipoib: creating {}: {e}", dir.display());
        return ExitCode::from(1);
    }
    // The command and its subcommands, depth first, each page named by its path.
    let mut todo = vec![(String::from("uipoib"), String::from("uipoib"), cmd)];
    while let Some((name, path, c)) = todo.pop() {
        for sub in c.get_subcommands().filter(|s| s.get_name() != "help") {
            todo.push((
                format!("{name}-{}", sub.get_name()),
                format!("{path} {}", sub.get_name()),
                sub.clone(),
            ));
        }
        let page = c.display_name(name.clone()).bin_name(path);
        let path = dir.join(format!("{name}.1"));
        let written = std::fs::File::create(&path)
            .and_then(|mut f| clap_mangen::Man::new(page).render(&mut f));
        if let Err(e) = written {
            eprintln!("uipoib: writing {}: {e}", path.display());
            return ExitCode::from(1);
        }
        println!("{}", path.display());
    }
    ExitCode::SUCCESS
}

fn print_outcome(o: &daemon::Outcome) {
    for (name, snap, ledger) in &o.interfaces {
        println!("== {name} counters ==");
        print!("{}", snap.to_text());
        match ledger {
            Ok(()) => println!("ledger balanced"),
            Err(e) => println!("ledger NOT balanced: {e}"),
        }
    }
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let rust_log = std::env::var("RUST_LOG").ok();
    let filter = match log_filter(rust_log.as_deref()) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("uipoib: {e} (e.g. RUST_LOG=info or RUST_LOG=uipoib=debug,info)");
            return ExitCode::from(2);
        }
    };
    use std::io::IsTerminal as _;
    let ansi = std::io::stderr().is_terminal();
    if let Err(e) = tracing::subscriber::set_global_default(log_subscriber(
        cli.log_format,
        filter,
        ansi,
        std::io::stderr,
    )) {
        eprintln!("uipoib: setting up logging: {e}");
        return ExitCode::from(1);
    }
    match cli.cmd {
        Cmd::Up(a) => {
            let cfg = match up_config(&a) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("uipoib: {e}");
                    return ExitCode::from(2);
                }
            };
            if a.check {
                print!("{}", cfg.plan());
                return ExitCode::SUCCESS;
            }
            let provider = Arc::new(RdmaProvider::new());
            match daemon::run(
                vec![Launch {
                    config: cfg,
                    netns: None,
                }],
                provider,
                None,
            ) {
                Ok(o) => {
                    print_outcome(&o);
                    ExitCode::from(o.exit_code() as u8)
                }
                Err(e) => {
                    eprintln!("uipoib: {e}");
                    ExitCode::from(1)
                }
            }
        }
        Cmd::Completions { shell } => {
            use clap::CommandFactory as _;
            // Into a buffer first: clap_complete panics on a write error, and a reader that
            // stops early (`| head`) is not one.
            let mut script = Vec::new();
            clap_complete::generate(shell, &mut Cli::command(), "uipoib", &mut script);
            write_stdout(&script)
        }
        Cmd::Man { dir } => man_pages(dir.as_deref()),
        Cmd::Stats(a) if a.prometheus => prometheus(&a.q),
        Cmd::Stats(a) if a.watch => watch(&a),
        Cmd::Stats(a) => query(&a.q, "stats"),
        Cmd::Status(q) => query(&q, "status"),
        Cmd::Neigh(q) => neigh(&q),
        Cmd::Restart(q) => query(&q, "restart"),
        Cmd::Fault(FaultCmd::Clear(q)) => query(&q, "clear"),
        Cmd::Fault(FaultCmd::Show(q)) => query(&q, "faults"),
        Cmd::Fault(FaultCmd::Run(a)) => scenario_run(&a),
        Cmd::Fault(FaultCmd::Check(a)) => scenario_check(&a),
        Cmd::Fault(FaultCmd::Compare(a)) => scenario_compare(&a),
        Cmd::Fault(FaultCmd::Inject(a)) => {
            let req = a.request();
            // Checked here too, so a mistake is named even when no daemon runs.
            if let Err(e) = FaultSpec::from_json(&req) {
                eprintln!("uipoib: {e}");
                return ExitCode::from(2);
            }
            send(&a.target, &req)
        }
        #[cfg(feature = "sim")]
        Cmd::SimPair(a) => sim_pair(a),
    }
}

/// Write `bytes` to stdout: a reader that went away (EPIPE) ends the command quietly with
/// success, as `cat` does; any other write error is named.
fn write_stdout(bytes: &[u8]) -> ExitCode {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uipoib: writing to stdout: {e}");
            ExitCode::from(1)
        }
    }
}

/// Send one request to the daemon named by `q`; on failure the error is printed and
/// the exit code to end with is returned.
fn ask(q: &QueryArgs, req: &serde_json::Value) -> Result<serde_json::Value, ExitCode> {
    let Some(path) = daemon::control_path(q.tap.as_deref(), q.control.clone()) else {
        eprintln!("uipoib: give --tap or --control");
        return Err(ExitCode::from(2));
    };
    control::request_json(&path, req).map_err(|e| {
        eprintln!("uipoib: {e}");
        ExitCode::from(1)
    })
}

fn send(q: &QueryArgs, req: &serde_json::Value) -> ExitCode {
    match ask(q, req) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

fn query(q: &QueryArgs, cmd: &str) -> ExitCode {
    // `uipoib stats` shows the kernel's counters too (read by the daemon from sysfs).
    let req = if cmd == "stats" {
        serde_json::json!({ "cmd": cmd, "kernel": true })
    } else {
        serde_json::json!({ "cmd": cmd })
    };
    match ask(q, &req) {
        Ok(v) if cmd == "faults" => {
            if q.json {
                println!("{v}");
            } else {
                print!("{}", faults_text(&v));
            }
            ExitCode::SUCCESS
        }
        Ok(v) => {
            let body = &v[cmd];
            if q.json {
                println!("{body}");
            } else if cmd == "stats" {
                match serde_json::from_value::<Snapshot>(body.clone()) {
                    Ok(s) => {
                        print!("{}", s.to_text());
                        let k = &body["kernel"];
                        if let Ok(c) = serde_json::from_value::<KernelCounters>(k.clone()) {
                            print!(
                                "{}",
                                c.to_text(
                                    k["tap_name"].as_str().unwrap_or("?"),
                                    k["device"].as_str().unwrap_or("?"),
                                    k["port_num"].as_u64().unwrap_or(0) as u8
                                )
                            );
                        }
                    }
                    Err(e) => {
                        eprintln!("uipoib: unexpected stats from the daemon: {e}");
                        return ExitCode::from(1);
                    }
                }
            } else if cmd == "status" {
                match serde_json::from_value::<Status>(body.clone()) {
                    Ok(s) => print!("{}", status_text(&s)),
                    Err(e) => {
                        eprintln!("uipoib: unexpected status from the daemon: {e}");
                        return ExitCode::from(1);
                    }
                }
            } else if cmd == "restart" {
                println!("restart requested");
            } else {
                println!("{v}");
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// `uipoib neigh`: the neighbour table, as lines or (`--json`) as an array.
fn neigh(q: &QueryArgs) -> ExitCode {
    match ask(q, &serde_json::json!({ "cmd": "neigh" })) {
        Ok(v) => {
            if q.json {
                println!("{}", v["neigh"]);
            } else {
                print!("{}", control::neigh::text(&v));
            }
            let (total, listed) = (
                v["total"].as_u64().unwrap_or(0),
                v["neigh"].as_array().map_or(0, Vec::len) as u64,
            );
            if total > listed {
                eprintln!(
                    "uipoib: {listed} of {total} neighbours listed (the most recently heard)"
                );
            }
            ExitCode::SUCCESS
        }
        Err(code) => code,
    }
}

/// `uipoib stats --watch`: until Ctrl-C or SIGTERM (exit 0) or the daemon goes away.
fn watch(a: &StatsArgs) -> ExitCode {
    use control::watch::Mode;
    use std::io::IsTerminal as _;
    let Some(path) = daemon::control_path(a.q.tap.as_deref(), a.q.control.clone()) else {
        eprintln!("uipoib: give --tap or --control");
        return ExitCode::from(2);
    };
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        if let Err(e) = signal_hook::flag::register(sig, stop.clone()) {
            eprintln!("uipoib: installing signal handlers: {e}");
            return ExitCode::from(1);
        }
    }
    let stdout = std::io::stdout();
    let mode = if a.q.json {
        Mode::Json
    } else if stdout.is_terminal() {
        Mode::Terminal
    } else {
        Mode::Plain
    };
    match control::watch::run(&path, a.interval, mode, &stop, &mut stdout.lock()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("uipoib: stats --watch: {e}");
            ExitCode::from(1)
        }
    }
}

/// `uipoib stats --prometheus`: the counters and the state, in the exposition format.
fn prometheus(q: &QueryArgs) -> ExitCode {
    let stats = match ask(q, &serde_json::json!({ "cmd": "stats" })) {
        Ok(v) => match serde_json::from_value::<Snapshot>(v["stats"].clone()) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("uipoib: unexpected stats from the daemon: {e}");
                return ExitCode::from(1);
            }
        },
        Err(code) => return code,
    };
    let status = ask(q, &serde_json::json!({ "cmd": "status" }))
        .ok()
        .and_then(|v| serde_json::from_value::<Status>(v["status"].clone()).ok());
    let tap = match (&q.tap, &status) {
        (Some(t), _) => t.clone(),
        (None, Some(s)) => s.tap.clone(),
        (None, None) => String::new(),
    };
    print!("{}", stats.to_prometheus(&tap, status.as_ref()));
    ExitCode::SUCCESS
}

fn faults_text(v: &serde_json::Value) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let armed = v["armed"].as_array().cloned().unwrap_or_default();
    if armed.is_empty() {
        let _ = writeln!(t, "armed     none");
    }
    for a in &armed {
        match FaultSpec::from_json(a) {
            Ok(s) => {
                let _ = writeln!(t, "armed     {s}");
            }
            Err(_) => {
                let _ = writeln!(t, "armed     {a}");
            }
        }
    }
    if v["stalled"] == true {
        let _ = writeln!(
            t,
            "stalled   sends are held back (uipoib fault clear releases them)"
        );
    }
    let _ = writeln!(t, "injected  {}", v["injected"]);
    if let Some(fired) = v["fired"].as_object() {
        for (k, n) in fired {
            if n.as_u64().unwrap_or(0) > 0 {
                let _ = writeln!(t, "  {k:<16} {n}");
            }
        }
    }
    let recent = v["recent"].as_array().cloned().unwrap_or_default();
    if !recent.is_empty() {
        let _ = writeln!(
            t,
            "{:>8}  {:<16} {:>8} {:>10}  unix_ms",
            "seq", "fault", "endpoint", "op"
        );
        for r in &recent {
            let ep = r["endpoint"]
                .as_u64()
                .map_or_else(|| "any".to_string(), |e| e.to_string());
            let _ = writeln!(
                t,
                "{:>8}  {:<16} {:>8} {:>10}  {}",
                r["seq"],
                r["kind"].as_str().unwrap_or("?"),
                ep,
                r["op"],
                r["unix_ms"]
            );
        }
    }
    t
}

fn status_text(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(t, "state     {}", s.state);
    if let Some(why) = &s.dead_reason {
        let _ = writeln!(t, "dead      {why}");
    }
    let addrs: Vec<&str> = std::iter::once(s.addr.as_str())
        .chain(s.addr6.iter().map(String::as_str))
        .collect();
    let _ = writeln!(t, "tap       {} ({})", s.tap, addrs.join(", "));
    let _ = writeln!(t, "device    {}", s.device);
    let _ = writeln!(t, "qpn       {}", s.qpn);
    let _ = writeln!(t, "gid       {}", s.gid);
    let _ = writeln!(t, "mtu       {}", s.mtu);
    let _ = writeln!(t, "epoch     {}", s.epoch);
    let _ = writeln!(t, "restarts  {}", s.restarts);
    if let Some(r) = &s.rehearsal {
        let _ = writeln!(
            t,
            "rehearsal restart after a failed poll at start: {:.1} ms, {} work requests reaped, ledger {}",
            r.recovery_ms,
            r.wr_reaped,
            if r.ledger_balanced { "ok" } else { "BAD" }
        );
    }
    let _ = writeln!(
        t,
        "on fail   {}",
        if s.poll_failure_policy == "restart" {
            "restart (a failed CQ poll restarts the interface)".to_string()
        } else {
            format!(
                "{} (a failed CQ poll does not restart: a demonstration, not for use)",
                s.poll_failure_policy
            )
        }
    );
    let _ = writeln!(
        t,
        "faults    {}",
        if s.allow_faults {
            "allowed (--allow-faults)"
        } else {
            "disabled (start with --allow-faults to inject)"
        }
    );
    if s.control_peers_refused > 0 {
        let _ = writeln!(
            t,
            "refused   {} control-socket peers (uid neither 0 nor the daemon's)",
            s.control_peers_refused
        );
    }
    if !s.history.is_empty() {
        let _ = writeln!(
            t,
            "{:>5}  {:<16} {:>12} {:>9} {:>8} {:>7}  detail",
            "epoch", "cause", "recovery_ms", "wr_reaped", "dropped", "ledger"
        );
        for r in &s.history {
            let _ = writeln!(
                t,
                "{:>5}  {:<16} {:>12.1} {:>9} {:>8} {:>7}  {}",
                r.epoch,
                r.cause,
                r.recovery_ms,
                r.wr_reaped,
                r.sends_reaped,
                if r.ledger_balanced { "ok" } else { "BAD" },
                r.detail
            );
        }
    }
    t
}

#[cfg(feature = "sim")]
fn sim_pair(a: SimPairArgs) -> ExitCode {
    let fabric = Arc::new(SimFabric::new());
    let devs = [
        ("sim0", Ipv4Addr::new(198, 18, 0, 1)),
        ("sim1", Ipv4Addr::new(198, 18, 0, 2)),
    ];
    for (name, ip) in devs {
        if let Err(e) = fabric.add_device(name, ip, a.port_mtu) {
            eprintln!("uipoib: {e}");
            return ExitCode::from(2);
        }
    }
    let mut specs = Vec::new();
    for (dev, tap, addr, ns, control) in [
        ("sim0", &a.tap_a, &a.addr_a, &a.netns_a, &a.control_a),
        ("sim1", &a.tap_b, &a.addr_b, &a.netns_b, &a.control_b),
    ] {
        let f = ConfigKeys {
            device: Some(dev.into()),
            tap: Some(tap.clone()),
            addr: Some(AddrList(addr.clone())),
            control: control.clone(),
            allow_faults: Some(a.allow_faults),
            ..Default::default()
        };
        match Config::from_keys(a.tune.apply(f)) {
            Ok(config) => specs.push(Launch {
                config,
                netns: Some(ns.clone()),
            }),
            Err(e) => {
                eprintln!("uipoib: {e}");
                return ExitCode::from(2);
            }
        }
    }
    match daemon::run(specs, fabric.clone(), None) {
        Ok(o) => {
            print_outcome(&o);
            println!("fabric: {:?}", fabric.counters());
            ExitCode::from(o.exit_code() as u8)
        }
        Err(e) => {
            eprintln!("uipoib: {e}");
            ExitCode::from(1)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn up_args(args: &[&str]) -> UpArgs {
        let cli = Cli::try_parse_from(["uipoib", "up"].iter().chain(args)).unwrap();
        match cli.cmd {
            Cmd::Up(a) => a,
            _ => unreachable!("parsed as `up`"),
        }
    }

    fn addrs(c: &Config) -> Vec<String> {
        std::iter::once(c.addr.to_string())
            .chain(c.addr6.iter().map(|a| a.to_string()))
            .collect()
    }

    #[test]
    fn up_takes_addr_more_than_once() {
        let a = up_args(&[
            "--device",
            "rxe0",
            "--tap",
            "uip0",
            "--addr",
            "198.18.1.1/24",
            "--addr",
            "2001:2:0:1::1/64",
        ]);
        let c = up_config(&a).unwrap();
        assert_eq!(addrs(&c), ["198.18.1.1/24", "2001:2:0:1::1/64"]);
        let e = up_config(&up_args(&[
            "--device",
            "rxe0",
            "--tap",
            "uip0",
            "--addr",
            "2001:2:0:1::1/64",
        ]))
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("invalid addr") && e.contains("IPv4 address is required"),
            "{e}"
        );
    }

    #[test]
    fn restart_nice_takes_a_negative_level_and_names_a_bad_one() {
        let with = |extra: &[&str]| {
            let base = "--device rxe0 --tap uip0 --addr 198.18.1.1/24".split(' ');
            let args: Vec<&str> = base.chain(extra.iter().copied()).collect();
            up_config(&up_args(&args))
        };
        assert_eq!(with(&[]).unwrap().restart_nice, Some(-10));
        let c = with(&["--restart-nice", "-5"]).unwrap();
        assert_eq!(c.restart_nice, Some(-5));
        let e = with(&["--restart-nice", "-21"]).unwrap_err().to_string();
        assert!(e.contains("restart-nice") && e.contains("-20..=19"), "{e}");
    }

    #[test]
    fn command_line_addrs_replace_the_config_files() {
        let dir = std::env::temp_dir().join(format!("uipoib-main-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("up.toml");
        std::fs::write(
            &file,
            "[interface]\ndevice = \"rxe0\"\ntap = \"uip0\"\n\
             addr = [\"198.18.5.1/24\", \"2001:2:0:5::1/64\"]\n",
        )
        .unwrap();
        let f = file.to_str().unwrap();
        let c = up_config(&up_args(&["--config", f])).unwrap();
        assert_eq!(addrs(&c), ["198.18.5.1/24", "2001:2:0:5::1/64"]);
        let c = up_config(&up_args(&["--config", f, "--addr", "198.18.1.1/24"])).unwrap();
        assert_eq!(addrs(&c), ["198.18.1.1/24"]);
        let c = up_config(&up_args(&[
            "--config",
            f,
            "--addr",
            "2001:2:0:1::1/64",
            "--addr",
            "198.18.1.1/24",
        ]))
        .unwrap();
        assert_eq!(addrs(&c), ["198.18.1.1/24", "2001:2:0:1::1/64"]);
        let _ = std::fs::remove_dir_all(&dir);
        // The help says so.
        let help = Cli::try_parse_from(["uipoib", "up", "--help"])
            .err()
            .unwrap()
            .to_string();
        assert!(help.contains("replace the config file's"), "{help}");
    }

    #[test]
    fn status_lists_every_address() {
        let s = Status {
            tap: "uip0".into(),
            addr: "198.18.1.1/24".into(),
            addr6: vec!["2001:2:0:1::1/64".into(), "2001:2:0:2::1/64".into()],
            ..Default::default()
        };
        assert!(
            status_text(&s)
                .contains("tap       uip0 (198.18.1.1/24, 2001:2:0:1::1/64, 2001:2:0:2::1/64)\n"),
            "{}",
            status_text(&s)
        );
        let s = Status {
            addr6: Vec::new(),
            ..s
        };
        assert!(status_text(&s).contains("tap       uip0 (198.18.1.1/24)\n"));
        assert!(!status_text(&s).contains("rehearsal"));
        let s = Status {
            rehearsal: Some(uipoib::iface::recovery::RestartRecord {
                recovery_ms: 12.34,
                wr_reaped: 4096,
                ledger_balanced: true,
                ..Default::default()
            }),
            ..s
        };
        assert!(
            status_text(&s).contains(
                "rehearsal restart after a failed poll at start: 12.3 ms, 4096 work requests reaped, ledger ok\n"
            ),
            "{}",
            status_text(&s)
        );
    }
}

#[cfg(test)]
mod log_tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    fn logged(format: LogFormat, ansi: bool) -> String {
        let buf = Buf::default();
        let b2 = buf.clone();
        let sub = log_subscriber(format, log_filter(None).unwrap(), ansi, move || b2.clone());
        tracing::subscriber::with_default(sub, || {
            tracing::info!(tap = "uip0", epoch = 2, "interface running again");
            tracing::debug!("not at info");
        });
        String::from_utf8(buf.0.lock().unwrap().clone()).unwrap()
    }

    #[test]
    fn json_lines_are_objects_with_the_fields() {
        let out = logged(LogFormat::Json, true);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines.len(), 1, "{out}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert_eq!(v["level"], "INFO");
        assert_eq!(v["fields"]["message"], "interface running again");
        assert_eq!(v["fields"]["tap"], "uip0");
        assert_eq!(v["fields"]["epoch"], 2);
        assert!(!out.contains('\x1b'), "no escapes in JSON: {out:?}");
    }

    #[test]
    fn text_has_colour_only_when_asked() {
        assert!(!logged(LogFormat::Text, false).contains('\x1b'));
        let coloured = logged(LogFormat::Text, true);
        assert!(coloured.contains('\x1b'), "{coloured:?}");
        assert!(coloured.contains("interface running again"));
    }

    #[test]
    fn a_rust_log_that_does_not_parse_is_an_error() {
        for bad in ["info,[", "uipoib=loud", "=info"] {
            let e = log_filter(Some(bad)).unwrap_err();
            assert!(e.contains("RUST_LOG") && e.contains(bad), "{bad}: {e}");
        }
        for good in ["info", "uipoib=debug,info", "warn"] {
            assert!(log_filter(Some(good)).is_ok(), "{good}");
        }
    }
}
