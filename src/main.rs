//! `uipoib`: the command-line front end. See `uipoib --help`.
#![deny(unsafe_code)]

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Args, Parser, Subcommand};
use tracing_subscriber::EnvFilter;

use uipoib::config::{Config, ConfigError, FileConfig};
use uipoib::control;
use uipoib::daemon::{self, Spec};
use uipoib::stats::Snapshot;
use uipoib::supervisor::Status;
use uipoib::verbs::rdma::RdmaProvider;
use uipoib::verbs::sim::SimFabric;

#[derive(Parser)]
#[command(
    name = "uipoib",
    version,
    about = "A userspace IPoIB-like datapath: a TAP interface carried over RDMA UD queue pairs"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Bring an interface up and carry its traffic until SIGINT/SIGTERM.
    Up(UpArgs),
    /// Print a running daemon's counters.
    Stats(QueryArgs),
    /// Print a running daemon's state and restart history.
    Status(QueryArgs),
    /// Ask a running daemon to restart its interface (also revives a dead one).
    Restart(QueryArgs),
    /// Inject or clear faults in a running daemon (for recovery tests).
    #[command(subcommand)]
    Fault(FaultCmd),
    /// Run two interfaces over the in-process simulated fabric, each TAP in its own
    /// network namespace (for tests; not a measurement of any RDMA device).
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
    /// Q_Key of the UD QP.
    #[arg(long, value_parser = parse_u32)]
    qkey: Option<u32>,
    /// Broadcast group: an IPv4 multicast address or a multicast GID.
    #[arg(long)]
    group: Option<String>,
}

#[derive(Args)]
struct UpArgs {
    /// RDMA device (e.g. rxe0, mlx5_0).
    #[arg(long)]
    device: Option<String>,
    /// TAP device name to create.
    #[arg(long)]
    tap: Option<String>,
    /// Interface address with prefix, e.g. 198.18.1.1/24.
    #[arg(long)]
    addr: Option<String>,
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

#[derive(Subcommand)]
enum FaultCmd {
    /// Arm a fault.
    Inject(InjectArgs),
    /// Disarm every fault.
    Clear(QueryArgs),
}

#[derive(Args)]
struct InjectArgs {
    #[command(flatten)]
    target: QueryArgs,
    /// The fault: poll-error (ibv_poll_cq returns a negative value) or async-fatal (a
    /// fatal asynchronous event is delivered).
    fault: String,
    /// poll-error: how many polls fail.
    #[arg(long)]
    count: Option<u64>,
    /// poll-error: the negative value the poll returns.
    #[arg(long, allow_negative_numbers = true)]
    ret: Option<i32>,
    /// async-fatal: device-fatal, cq-error, qp-fatal or device-removed.
    #[arg(long)]
    event: Option<String>,
}

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
    /// First address.
    #[arg(long, default_value = "198.18.2.1/24")]
    addr_a: String,
    /// Second address.
    #[arg(long, default_value = "198.18.2.2/24")]
    addr_b: String,
    /// Control socket of the first interface (default /run/uipoib/<tap-a>.sock).
    #[arg(long)]
    control_a: Option<PathBuf>,
    /// Control socket of the second interface.
    #[arg(long)]
    control_b: Option<PathBuf>,
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
    fn apply(&self, f: FileConfig) -> FileConfig {
        FileConfig {
            mtu: self.mtu,
            budget: self.budget,
            recv_ring: self.recv_ring,
            send_ring: self.send_ring,
            poll_batch: self.poll_batch,
            tx_batch: self.tx_batch,
            qkey: self.qkey,
            group: self.group.clone(),
            ..Default::default()
        }
        .or(f)
    }
}

fn up_config(a: &UpArgs) -> Result<Config, ConfigError> {
    let file = match &a.config {
        Some(p) => FileConfig::load(p)?,
        None => FileConfig::default(),
    };
    let flags = FileConfig {
        device: a.device.clone(),
        tap: a.tap.clone(),
        addr: a.addr.clone(),
        port: a.port,
        gid_index: a.gid_index,
        control: a.control.clone(),
        ..Default::default()
    };
    Config::from_file_config(a.tune.apply(flags.or(file)))
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
    tracing_subscriber::fmt()
        .with_env_filter(
            EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match cli.cmd {
        Cmd::Up(a) => {
            let cfg = match up_config(&a) {
                Ok(c) => c,
                Err(e) => {
                    eprintln!("uipoib: {e}");
                    return ExitCode::from(2);
                }
            };
            let provider = Arc::new(RdmaProvider::new());
            match daemon::run(
                vec![Spec {
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
        Cmd::Stats(q) => query(&q, "stats"),
        Cmd::Status(q) => query(&q, "status"),
        Cmd::Restart(q) => query(&q, "restart"),
        Cmd::Fault(FaultCmd::Clear(q)) => query(&q, "clear"),
        Cmd::Fault(FaultCmd::Inject(a)) => {
            let mut req = serde_json::json!({"cmd": "inject", "fault": a.fault});
            if let Some(c) = a.count {
                req["count"] = c.into();
            }
            if let Some(r) = a.ret {
                req["ret"] = r.into();
            }
            if let Some(e) = &a.event {
                req["event"] = e.clone().into();
            }
            send(&a.target, &req)
        }
        Cmd::SimPair(a) => sim_pair(a),
    }
}

fn send(q: &QueryArgs, req: &serde_json::Value) -> ExitCode {
    let Some(path) = daemon::control_path(q.tap.as_deref(), q.control.clone()) else {
        eprintln!("uipoib: give --tap or --control");
        return ExitCode::from(2);
    };
    match control::request_json(&path, req) {
        Ok(v) => {
            println!("{v}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("uipoib: {e}");
            ExitCode::from(1)
        }
    }
}

fn query(q: &QueryArgs, cmd: &str) -> ExitCode {
    let Some(path) = daemon::control_path(q.tap.as_deref(), q.control.clone()) else {
        eprintln!("uipoib: give --tap or --control");
        return ExitCode::from(2);
    };
    match control::request(&path, cmd) {
        Ok(v) => {
            let body = &v[cmd];
            if q.json {
                println!("{body}");
            } else if cmd == "stats" {
                match serde_json::from_value::<Snapshot>(body.clone()) {
                    Ok(s) => print!("{}", s.to_text()),
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
        Err(e) => {
            eprintln!("uipoib: {e}");
            ExitCode::from(1)
        }
    }
}

fn status_text(s: &Status) -> String {
    use std::fmt::Write as _;
    let mut t = String::new();
    let _ = writeln!(t, "state     {}", s.state);
    if let Some(why) = &s.dead_reason {
        let _ = writeln!(t, "dead      {why}");
    }
    let _ = writeln!(t, "tap       {} ({})", s.tap, s.addr);
    let _ = writeln!(t, "device    {}", s.device);
    let _ = writeln!(t, "qpn       {}", s.qpn);
    let _ = writeln!(t, "gid       {}", s.gid);
    let _ = writeln!(t, "mtu       {}", s.mtu);
    let _ = writeln!(t, "epoch     {}", s.epoch);
    let _ = writeln!(t, "restarts  {}", s.restarts);
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
        let f = FileConfig {
            device: Some(dev.into()),
            tap: Some(tap.clone()),
            addr: Some(addr.clone()),
            control: control.clone(),
            ..Default::default()
        };
        match Config::from_file_config(a.tune.apply(f)) {
            Ok(config) => specs.push(Spec {
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
