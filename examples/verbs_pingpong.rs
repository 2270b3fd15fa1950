//! Lab check of the real verbs provider on a real device (rxe in the lab guests).
//!
//! Exercises, through the crate's public API only: open (device, port, GID table, PD,
//! MR, channel, CQs, UD QP to RTS), post_recv, chained post_send with and without
//! inline, poll_cq, completion events through mio, address handles, multicast attach and
//! detach, set_qp_error (every posted receive must come back flushed), teardown (no
//! failed destroy) and a second open of the same device.
//!
//! ```text
//! # guest a
//! verbs_pingpong --device rxe0 --role server [--mcast] [--qpn-file F]
//! # guest b
//! verbs_pingpong --device rxe0 --role client --peer-gid ::ffff:198.18.0.1 --peer-qpn 17 --count 20
//! verbs_pingpong --device rxe0 --role client --mcast --count 20
//! ```
//! The client sends `count` pings (alternately small enough to be sent inline and as
//! large as the payload allows), each retried until its pong arrives, then one burst of
//! pings posted as a single chain, then "bye". The server echoes every ping as a pong
//! (unicast to the sender's GID and QPN taken from the GRH and the completion, or to
//! the multicast group with `--mcast`) until "bye" or the timeout. Exit status 0 only if
//! every check passed; the last line says `RESULT ok` or `RESULT FAILED`.

use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[path = "common/cli.rs"]
mod cli;
use clap::{Parser, ValueEnum};
use mio::{Events, Poll, Token};

#[path = "common/pollset.rs"]
mod pollset;
use uipoib::verbs::rdma::{RdmaEndpoint, RdmaProvider};
use uipoib::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Dest, Endpoint, GRH_LEN, Gid, GrhKind, MULTICAST_QPN,
    SendWr, WaitFds, WcStatus,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Role {
    Server,
    Client,
}

#[derive(Parser, Debug)]
#[command(about = "UD ping-pong over the real verbs provider")]
struct Args {
    #[command(flatten)]
    dev: cli::Device,
    #[arg(long, value_enum)]
    role: Role,
    /// Server's GID (client, unicast).
    #[arg(long)]
    peer_gid: Option<Gid>,
    /// Server's QPN (client, unicast).
    #[arg(long)]
    peer_qpn: Option<u32>,
    /// Pings to exchange.
    #[arg(long, default_value_t = 20)]
    count: u32,
    /// Use the multicast group for pings and pongs.
    #[arg(long)]
    mcast: bool,
    /// Multicast group.
    #[arg(long, default_value = "::ffff:239.1.1.1")]
    group: Gid,
    /// Q_Key of both QPs.
    #[arg(long, default_value_t = 0x1111_1111)]
    qkey: u32,
    /// Ring sizes.
    #[arg(long, default_value_t = 64)]
    slots: u32,
    /// Overall deadline in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Write the QPN here once ready (server).
    #[arg(long)]
    qpn_file: Option<std::path::PathBuf>,
}

const MAGIC: &[u8; 4] = b"UIPP";
const HDR: usize = 16;
const PING: u8 = 1;
const PONG: u8 = 2;
const BYE: u8 = 3;
/// Send work-request ids carry this bit; receive ids are the slot number.
const SEND_TAG: u64 = 1 << 63;
/// Small sends: below any device's inline limit we ask for.
const SMALL: u32 = 64;
/// Pings posted as one chain in the burst test.
const BURST: u32 = 8;
/// Client retransmit interval (UD is unreliable; the server may not be up yet).
const RETRY: Duration = Duration::from_millis(300);
/// Sequence numbers of burst pings start here.
const BURST_SEQ: u32 = 1_000_000;

const CQ_TOKEN: Token = Token(0);
const ASYNC_TOKEN: Token = Token(1);

/// A received, parsed message.
#[derive(Debug)]
struct Msg {
    kind: u8,
    seq: u32,
    len: u32,
    intact: bool,
    src_gid: Gid,
    src_qp: u32,
    dst: Option<Gid>,
}

struct Node {
    ep: RdmaEndpoint,
    poll: Poll,
    /// The endpoint's descriptors in `poll`.
    fds: WaitFds,
    events: Events,
    free_send: Vec<u32>,
    posted_recv: u32,
    comps: Vec<Completion>,
    ahs: HashMap<Gid, AhHandle>,
    cq_events: (u64, u64),
    wakeups: u64,
    send_ok: u64,
    errors: Vec<String>,
    async_events: Vec<AsyncEvent>,
    /// Messages received while waiting for a send slot.
    pending: Vec<Msg>,
}

fn fill(buf: &mut [u8], kind: u8, seq: u32, qpn: u32) {
    buf[..4].copy_from_slice(MAGIC);
    buf[4] = kind;
    buf[5..8].fill(0);
    buf[8..12].copy_from_slice(&seq.to_be_bytes());
    buf[12..16].copy_from_slice(&qpn.to_be_bytes());
    for (j, b) in buf[HDR..].iter_mut().enumerate() {
        *b = (seq as usize).wrapping_add(j) as u8;
    }
}

fn grh_addrs(grh: &[u8], kind: GrhKind) -> (Gid, Gid) {
    match kind {
        GrhKind::Ipv4 => {
            let ip = |o: usize| std::net::Ipv4Addr::new(grh[o], grh[o + 1], grh[o + 2], grh[o + 3]);
            (Gid::from_ipv4(ip(32)), Gid::from_ipv4(ip(36)))
        }
        GrhKind::Ipv6 => {
            let mut s = [0u8; 16];
            let mut d = [0u8; 16];
            s.copy_from_slice(&grh[8..24]);
            d.copy_from_slice(&grh[24..40]);
            (Gid(s), Gid(d))
        }
    }
}

impl Node {
    fn new(provider: &RdmaProvider, args: &Args) -> Result<Node, String> {
        let cfg = args.dev.endpoint(args.qkey, args.slots);
        let mut ep = provider
            .open_endpoint(&cfg)
            .map_err(|e| format!("open: {e}"))?;
        let poll = Poll::new().map_err(|e| format!("mio: {e}"))?;
        let fds = pollset::watch(&mut ep, poll.registry(), CQ_TOKEN, ASYNC_TOKEN)
            .map_err(|e| format!("register: {e}"))?;
        let mut node = Node {
            free_send: (0..args.slots).rev().collect(),
            ep,
            poll,
            fds,
            events: Events::with_capacity(8),
            posted_recv: 0,
            comps: vec![Completion::EMPTY; 32],
            ahs: HashMap::new(),
            cq_events: (0, 0),
            wakeups: 0,
            send_ok: 0,
            errors: Vec::new(),
            async_events: Vec::new(),
            pending: Vec::new(),
        };
        for slot in 0..args.slots {
            node.ep
                .post_recv(u64::from(slot), slot)
                .map_err(|e| format!("post_recv: {e}"))?;
            node.posted_recv += 1;
        }
        node.ep
            .req_notify(CqKind::Recv)
            .map_err(|e| format!("req_notify: {e}"))?;
        node.ep
            .req_notify(CqKind::Send)
            .map_err(|e| format!("req_notify: {e}"))?;
        Ok(node)
    }

    fn ah(&mut self, gid: Gid) -> Result<AhHandle, String> {
        if let Some(h) = self.ahs.get(&gid) {
            return Ok(*h);
        }
        let h = self
            .ep
            .create_ah(&gid)
            .map_err(|e| format!("create_ah {gid}: {e}"))?;
        self.ahs.insert(gid, h);
        Ok(h)
    }

    /// Queue sends (one chain, one post): `(kind, seq, len)` each, to `dest`.
    fn send(&mut self, msgs: &[(u8, u32, u32)], dest: Dest) -> Result<(), String> {
        let mut wrs = Vec::with_capacity(msgs.len());
        let qpn = self.ep.attrs().qpn;
        for &(kind, seq, len) in msgs {
            let slot = loop {
                if let Some(s) = self.free_send.pop() {
                    break s;
                }
                let early = self.pump(Duration::from_millis(50))?;
                self.pending.extend(early);
            };
            fill(&mut self.ep.send_buf(slot)[..len as usize], kind, seq, qpn);
            wrs.push(SendWr {
                wr_id: SEND_TAG | u64::from(slot),
                slot,
                len,
                dest,
                signaled: true,
            });
        }
        match self.ep.post_send(&wrs) {
            Ok(()) => Ok(()),
            Err(e) => {
                for w in &wrs[e.posted..] {
                    self.free_send.push(w.slot);
                }
                Err(format!("post_send: {e}"))
            }
        }
    }

    /// Drain both CQs; re-post receives; return parsed messages.
    fn drain(&mut self, out: &mut Vec<Msg>) -> Result<(), String> {
        let grh_kind = self.ep.attrs().grh_kind;
        loop {
            let n = self
                .ep
                .poll_cq(CqKind::Recv, &mut self.comps)
                .map_err(|e| format!("poll recv: {e}"))?;
            for k in 0..n {
                let c = self.comps[k];
                self.posted_recv -= 1;
                let slot = c.wr_id as u32;
                if c.status != WcStatus::Success {
                    self.errors.push(format!("recv completion {c:?}"));
                    continue;
                }
                let buf = self.ep.recv_buf(slot);
                let total = c.byte_len as usize;
                if !c.has_grh || total < GRH_LEN + HDR || total > buf.len() {
                    self.errors.push(format!("odd receive {c:?}"));
                } else {
                    let (src_gid, dst) = grh_addrs(&buf[..GRH_LEN], grh_kind);
                    let p = &buf[GRH_LEN..total];
                    if &p[..4] == MAGIC {
                        let seq = u32::from_be_bytes([p[8], p[9], p[10], p[11]]);
                        let intact = p[HDR..]
                            .iter()
                            .enumerate()
                            .all(|(j, b)| *b == (seq as usize).wrapping_add(j) as u8);
                        out.push(Msg {
                            kind: p[4],
                            seq,
                            len: (total - GRH_LEN) as u32,
                            intact,
                            src_gid,
                            src_qp: c.src_qp,
                            dst: Some(dst),
                        });
                    }
                }
                self.ep
                    .post_recv(c.wr_id, slot)
                    .map_err(|e| format!("post_recv: {e}"))?;
                self.posted_recv += 1;
            }
            let m = self
                .ep
                .poll_cq(CqKind::Send, &mut self.comps)
                .map_err(|e| format!("poll send: {e}"))?;
            for c in &self.comps[..m] {
                if c.status == WcStatus::Success {
                    self.send_ok += 1;
                } else {
                    self.errors.push(format!("send completion {c:?}"));
                }
                self.free_send.push((c.wr_id & !SEND_TAG) as u32);
            }
            if n == 0 && m == 0 {
                return Ok(());
            }
        }
    }

    /// Wait up to `timeout` for events, then drain, re-arm and drain again (the
    /// missed-event race).
    fn pump(&mut self, timeout: Duration) -> Result<Vec<Msg>, String> {
        let mut out = std::mem::take(&mut self.pending);
        self.poll
            .poll(&mut self.events, Some(timeout))
            .map_err(|e| format!("mio poll: {e}"))?;
        let mut cq_ready = false;
        for ev in self.events.iter() {
            if ev.token() == CQ_TOKEN {
                cq_ready = true;
            } else if ev.token() == ASYNC_TOKEN {
                while let Some(a) = self
                    .ep
                    .next_async_event()
                    .map_err(|e| format!("async: {e}"))?
                {
                    println!("async event: {a:?}");
                    self.async_events.push(a);
                }
            }
        }
        if cq_ready {
            self.wakeups += 1;
            let (r, s) = self
                .ep
                .take_cq_events()
                .map_err(|e| format!("take_cq_events: {e}"))?;
            self.cq_events.0 += u64::from(r);
            self.cq_events.1 += u64::from(s);
        }
        self.drain(&mut out)?;
        self.ep
            .req_notify(CqKind::Recv)
            .map_err(|e| format!("req_notify: {e}"))?;
        self.ep
            .req_notify(CqKind::Send)
            .map_err(|e| format!("req_notify: {e}"))?;
        self.drain(&mut out)?;
        Ok(out)
    }

    /// Move the QP to error and check that every posted receive is flushed.
    fn flush_check(&mut self) -> Result<(), String> {
        let posted = self.posted_recv;
        self.ep
            .set_qp_error()
            .map_err(|e| format!("set_qp_error: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(10);
        let mut flushed = 0u32;
        while flushed < posted && Instant::now() < deadline {
            let n = self
                .ep
                .poll_cq(CqKind::Recv, &mut self.comps)
                .map_err(|e| format!("poll recv: {e}"))?;
            for c in &self.comps[..n] {
                if c.status == WcStatus::Flushed {
                    flushed += 1;
                } else {
                    self.errors
                        .push(format!("non-flush completion after ERR: {c:?}"));
                }
            }
            if n == 0 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        println!("flush: {flushed}/{posted} posted receives completed as Flushed");
        if flushed != posted {
            return Err(format!("only {flushed} of {posted} receives flushed"));
        }
        self.posted_recv = 0;
        Ok(())
    }
}

fn print_ready(role: &str, ep: &RdmaEndpoint) {
    let a = ep.attrs();
    println!(
        "READY role={role} device={} port={} qpn={} gid={} gid_index={} grh={:?} mtu={} \
         max_payload={} max_inline={} slots={}/{}",
        a.device,
        a.port,
        a.qpn,
        a.gid,
        a.gid_index,
        a.grh_kind,
        a.port_mtu,
        a.max_payload,
        a.max_inline,
        a.recv_slots,
        a.send_slots
    );
}

fn server(node: &mut Node, args: &Args, deadline: Instant) -> Result<(), String> {
    let group_dest = if args.mcast {
        node.ep
            .attach_mcast(&args.group)
            .map_err(|e| format!("attach_mcast: {e}"))?;
        println!("attached to {}", args.group);
        Some(Dest {
            ah: node.ah(args.group)?,
            qpn: MULTICAST_QPN,
            qkey: args.qkey,
        })
    } else {
        None
    };
    let (mut pings, mut bad) = (0u32, 0u32);
    let mut peers = std::collections::BTreeSet::new();
    loop {
        if Instant::now() > deadline {
            return Err(format!("deadline passed after {pings} pings (no bye)"));
        }
        let msgs = node.pump(Duration::from_millis(200))?;
        let mut replies: Vec<((u8, u32, u32), Dest)> = Vec::new();
        for m in msgs {
            match m.kind {
                PING => {
                    pings += 1;
                    if !m.intact {
                        bad += 1;
                    }
                    if pings == 1 {
                        println!(
                            "first ping: seq={} len={} from {} qpn {} to {:?}",
                            m.seq, m.len, m.src_gid, m.src_qp, m.dst
                        );
                    }
                    peers.insert((m.src_gid, m.src_qp));
                    let dest = match group_dest {
                        Some(d) => d,
                        None => Dest {
                            ah: node.ah(m.src_gid)?,
                            qpn: m.src_qp,
                            qkey: args.qkey,
                        },
                    };
                    replies.push(((PONG, m.seq, m.len), dest));
                }
                BYE => {
                    println!(
                        "bye after {pings} pings ({bad} corrupt) from {peers:?}; \
                         cq events recv={} send={} wakeups={} sends ok={}",
                        node.cq_events.0, node.cq_events.1, node.wakeups, node.send_ok
                    );
                    if bad > 0 {
                        return Err(format!("{bad} corrupt pings"));
                    }
                    // Let the last pongs complete.
                    let _ = node.pump(Duration::from_millis(100))?;
                    return Ok(());
                }
                _ => {}
            }
        }
        // Echo; consecutive replies to one destination go out as one chain.
        let mut i = 0;
        while i < replies.len() {
            let dest = replies[i].1;
            let mut j = i;
            while j < replies.len() && replies[j].1 == dest && j - i < BURST as usize {
                j += 1;
            }
            let chunk: Vec<_> = replies[i..j].iter().map(|r| r.0).collect();
            node.send(&chunk, dest)?;
            i = j;
        }
    }
}

fn client(node: &mut Node, args: &Args, deadline: Instant) -> Result<(), String> {
    let dest = if args.mcast {
        node.ep
            .attach_mcast(&args.group)
            .map_err(|e| format!("attach_mcast: {e}"))?;
        println!("attached to {}", args.group);
        Dest {
            ah: node.ah(args.group)?,
            qpn: MULTICAST_QPN,
            qkey: args.qkey,
        }
    } else {
        let gid = args.peer_gid.ok_or("--peer-gid is required")?;
        let qpn = args.peer_qpn.ok_or("--peer-qpn is required")?;
        Dest {
            ah: node.ah(gid)?,
            qpn,
            qkey: args.qkey,
        }
    };
    let max = node.ep.attrs().max_payload;
    let mut rtts = Vec::new();
    let mut retries = 0u32;
    for seq in 0..args.count {
        let len = if seq % 2 == 0 { SMALL } else { max };
        let start = Instant::now();
        let mut sent_at = start;
        node.send(&[(PING, seq, len)], dest)?;
        'wait: loop {
            if Instant::now() > deadline {
                return Err(format!("no pong for seq {seq} before the deadline"));
            }
            for m in node.pump(Duration::from_millis(50))? {
                if m.kind == PONG && m.seq == seq {
                    if !m.intact || m.len != len {
                        return Err(format!("pong {seq} corrupt or wrong length {}", m.len));
                    }
                    if seq == 0 {
                        println!(
                            "first pong: len={} from {} qpn {} to {:?}",
                            m.len, m.src_gid, m.src_qp, m.dst
                        );
                    }
                    rtts.push(start.elapsed());
                    break 'wait;
                }
            }
            if sent_at.elapsed() > RETRY {
                retries += 1;
                sent_at = Instant::now();
                node.send(&[(PING, seq, len)], dest)?;
            }
        }
    }
    let steady: Vec<_> = rtts.iter().skip(1).collect();
    let avg = if steady.is_empty() {
        Duration::ZERO
    } else {
        steady.iter().copied().sum::<Duration>() / steady.len() as u32
    };
    println!(
        "pingpong: {} pongs, {retries} retransmits, first rtt {:?}, mean rtt after it {avg:?}",
        rtts.len(),
        rtts.first().copied().unwrap_or_default()
    );

    // One chain of BURST pings in one post_send (mixed inline and not).
    let burst = BURST.min(args.slots);
    let msgs: Vec<_> = (0..burst)
        .map(|i| (PING, BURST_SEQ + i, if i % 2 == 0 { SMALL } else { max }))
        .collect();
    node.send(&msgs, dest)?;
    let mut got = std::collections::BTreeSet::new();
    let until = Instant::now() + Duration::from_secs(5);
    while got.len() < burst as usize && Instant::now() < until {
        for m in node.pump(Duration::from_millis(50))? {
            if m.kind == PONG && m.seq >= BURST_SEQ && m.intact {
                got.insert(m.seq);
            }
        }
    }
    println!(
        "burst: one chain of {burst} sends, {} pongs back",
        got.len()
    );
    if got.len() != burst as usize {
        return Err(format!("burst: only {} of {burst} pongs", got.len()));
    }
    for _ in 0..3 {
        node.send(&[(BYE, 0, SMALL)], dest)?;
        let _ = node.pump(Duration::from_millis(50))?;
    }
    println!(
        "client: cq events recv={} send={} wakeups={} sends ok={}",
        node.cq_events.0, node.cq_events.1, node.wakeups, node.send_ok
    );
    Ok(())
}

fn run(args: &Args) -> Result<(), String> {
    let provider = RdmaProvider::new();
    let deadline = Instant::now() + Duration::from_secs(args.timeout_secs);
    let role = match args.role {
        Role::Server => "server",
        Role::Client => "client",
    };
    let mut node = Node::new(&provider, args)?;
    print_ready(role, &node.ep);
    if let Some(path) = &args.qpn_file {
        std::fs::write(path, format!("{}\n", node.ep.attrs().qpn))
            .map_err(|e| format!("write {}: {e}", path.display()))?;
    }
    match args.role {
        Role::Server => server(&mut node, args, deadline)?,
        Role::Client => client(&mut node, args, deadline)?,
    }
    if !node.errors.is_empty() {
        return Err(format!("completion errors: {:?}", node.errors));
    }
    if node.cq_events.0 == 0 {
        return Err("no receive completion event was ever delivered".into());
    }

    // Explicit detach and AH destroy, then the flush check, then teardown.
    if args.mcast {
        node.ep
            .detach_mcast(&args.group)
            .map_err(|e| format!("detach_mcast: {e}"))?;
        println!("detached from {}", args.group);
    }
    let ahs: Vec<_> = node.ahs.drain().collect();
    for (gid, h) in &ahs {
        node.ep
            .destroy_ah(*h)
            .map_err(|e| format!("destroy_ah {gid}: {e}"))?;
    }
    println!("destroyed {} address handles", ahs.len());
    node.flush_check()?;
    pollset::unwatch(&mut node.ep, node.poll.registry(), &node.fds)
        .map_err(|e| format!("deregister: {e}"))?;
    let Node { ep, .. } = node;
    let started = Instant::now();
    ep.close().map_err(|e| format!("close: {e}"))?;
    println!(
        "teardown: {:?}, teardown_errors={}",
        started.elapsed(),
        provider.teardown_errors()
    );

    // The device must open again right away (nothing left behind), and an endpoint
    // dropped with receives posted and a group attached must tear down cleanly too.
    let mut again = Node::new(&provider, args)?;
    if args.mcast {
        again
            .ep
            .attach_mcast(&args.group)
            .map_err(|e| format!("re-attach: {e}"))?;
    }
    println!(
        "reopen: qpn={} (posted {} receives)",
        again.ep.attrs().qpn,
        again.posted_recv
    );
    drop(again);
    println!("dropped: teardown_errors={}", provider.teardown_errors());
    if provider.teardown_errors() != 0 {
        return Err(format!("{} teardown errors", provider.teardown_errors()));
    }
    Ok(())
}

fn main() -> ExitCode {
    cli::init_tracing();
    let args = Args::parse();
    match run(&args) {
        Ok(()) => {
            println!("RESULT ok");
            ExitCode::SUCCESS
        }
        Err(e) => {
            println!("error: {e}");
            println!("RESULT FAILED");
            ExitCode::FAILURE
        }
    }
}
