//! Supervised interfaces on the simulated fabric, for the supervisor tests.
#![allow(dead_code)]

use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::{SockTap, arp_reply, arp_request, fabric, ipv4_frame, params};
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats::Stats;
use uipoib::iface::{Interface, PollFailurePolicy};
use uipoib::runtime::supervisor::{Status, Supervised, Supervisor};
use uipoib::tap::TapDevice;
use uipoib::verbs::Provider;
use uipoib::verbs::fault::{FaultSwitch, FaultyProvider};
use uipoib::verbs::sim::SimFabric;
use uipoib::wire::arp::EthArp;
use uipoib::wire::eth::{self, Mac};

pub const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
pub const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

pub struct Side {
    pub sup: Option<Supervisor>,
    pub tap: Arc<SockTap>,
    pub stats: Arc<Stats>,
    pub status: Arc<Mutex<Status>>,
    pub mac: Mac,
}

impl Side {
    pub fn status(&self) -> Status {
        self.status.lock().unwrap().clone()
    }
    pub fn sup(&self) -> &Supervisor {
        self.sup.as_ref().unwrap()
    }
    pub fn wait_state(&self, state: &str, restarts: u64) -> Status {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = self.status();
            if s.state == state && s.restarts >= restarts {
                return s;
            }
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {state}/{restarts}: {s:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    pub fn end(mut self) {
        let e = self.sup.take().unwrap().close().unwrap();
        e.ledger.expect("ledger balanced at the end");
    }
}

pub fn side(provider: Arc<dyn Provider>, dev: &str, addr: &str, policy: Policy) -> Side {
    side_with(provider, dev, addr, policy, PollFailurePolicy::Restart)
}

/// [`side`] with a poll-failure policy.
pub fn side_with(
    provider: Arc<dyn Provider>,
    dev: &str,
    addr: &str,
    policy: Policy,
    on_poll_failure: PollFailurePolicy,
) -> Side {
    side_full(
        provider,
        dev,
        addr,
        policy,
        on_poll_failure,
        SupOpts::default(),
    )
}

/// What a side's supervisor does beyond the defaults of these tests.
#[derive(Debug, Default, Clone, Copy)]
pub struct SupOpts {
    /// Rehearse the restart after a failed poll at start (`rehearse-restart`).
    pub rehearse: bool,
    /// The supervisor's nice level (`restart-nice`).
    pub restart_nice: Option<i32>,
}

/// [`side`] with a poll-failure policy and supervisor options.
pub fn side_full(
    provider: Arc<dyn Provider>,
    dev: &str,
    addr: &str,
    policy: Policy,
    on_poll_failure: PollFailurePolicy,
    opts: SupOpts,
) -> Side {
    let mut p = params(dev, addr, 64, 32);
    // As the daemon's default: a spare bank of slots for restarts after a failed poll.
    p.endpoint.banks = 2;
    p.poll_failure = on_poll_failure;
    p.tx_timeout = Duration::from_millis(300);
    let stats = Arc::new(Stats::default());
    let iface = Interface::open(provider.as_ref(), &p, stats.clone(), 1, &mut None).unwrap();
    let mac = iface.mac();
    let tap = SockTap::new();
    let status = Arc::new(Mutex::new(Status::default()));
    let dev_tap: Arc<dyn TapDevice> = tap.clone();
    let sup = Supervisor::spawn(
        Supervised {
            name: dev.into(),
            params: p,
            policy,
            provider,
            tap: dev_tap,
            stats: stats.clone(),
            status: status.clone(),
            rehearse: opts.rehearse,
            restart_nice: opts.restart_nice,
        },
        iface,
    )
    .unwrap();
    Side {
        sup: Some(sup),
        tap,
        stats,
        status,
        mac,
    }
}

pub fn is_arp(f: &[u8], pred: impl Fn(&EthArp) -> bool) -> bool {
    eth::parse_frame(f)
        .ok()
        .and_then(|(_, p)| EthArp::parse(p).ok())
        .is_some_and(|a| pred(&a))
}

pub fn wait_frame(tap: &SockTap, what: &str, pred: impl Fn(&[u8]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(f) = tap.recv()
            && pred(&f)
        {
            return;
        }
    }
    panic!("timed out waiting for {what}");
}

pub fn introduce(a: &Side, b: &Side) {
    a.tap.inject(&arp_request(a.mac, A_IP, B_IP));
    wait_frame(&b.tap, "ARP request", |f| is_arp(f, |x| x.tpa == B_IP));
    b.tap.inject(&arp_reply(b.mac, B_IP, a.mac, A_IP));
    wait_frame(&a.tap, "ARP reply", |f| {
        is_arp(f, |x| x.spa == B_IP && x.op == 2)
    });
}

/// A frame from `from` to `to` gets through, retrying while a restart is in progress.
pub fn flows(from: &Side, from_ip: Ipv4Addr, to: &Side, to_ip: Ipv4Addr, tag: u32) {
    let body = tag.to_be_bytes().repeat(50);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        from.tap
            .inject(&ipv4_frame(to.mac, from.mac, from_ip, to_ip, &body));
        let until = Instant::now() + Duration::from_millis(300);
        while Instant::now() < until {
            if let Some(f) = to.tap.recv()
                && f.len() == 34 + body.len()
                && f[34..] == body[..]
            {
                return;
            }
        }
        assert!(
            Instant::now() < deadline,
            "traffic {from_ip} -> {to_ip} did not resume"
        );
    }
}

pub fn pair(policy: Policy) -> (Arc<SimFabric>, Arc<FaultSwitch>, Side, Side) {
    pair_with_grace(policy, Duration::ZERO)
}

/// Like [`pair`], side A (the faulty one) under `on_poll_failure`.
pub fn pair_policy(
    policy: Policy,
    on_poll_failure: PollFailurePolicy,
) -> (Arc<SimFabric>, Arc<FaultSwitch>, Side, Side) {
    pair_of(policy, Duration::ZERO, on_poll_failure, SupOpts::default())
}

/// Like [`pair`], side A rehearsing the restart after a failed poll at start, as the
/// daemon does by default (the other pairs do not: their tests count from a first
/// epoch).
pub fn pair_rehearsing(policy: Policy) -> (Arc<SimFabric>, Arc<FaultSwitch>, Side, Side) {
    let opts = SupOpts {
        rehearse: true,
        ..SupOpts::default()
    };
    pair_of(policy, Duration::ZERO, PollFailurePolicy::Restart, opts)
}

/// Two supervised sides that have met (ARP both ways) and carried a frame each way; A's
/// provider is the faulty one.
fn pair_of(
    policy: Policy,
    grace: Duration,
    on_poll_failure: PollFailurePolicy,
    opts: SupOpts,
) -> (Arc<SimFabric>, Arc<FaultSwitch>, Side, Side) {
    let sim = Arc::new(fabric(4096));
    sim.set_retire_grace(grace);
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let a = side_full(
        Arc::new(faulty),
        "sim0",
        "198.18.2.1/24",
        policy,
        on_poll_failure,
        opts,
    );
    let b = side(sim.clone(), "sim1", "198.18.2.2/24", policy);
    a.wait_state("running", 0);
    b.wait_state("running", 0);
    introduce(&a, &b);
    flows(&a, A_IP, &b, B_IP, 0);
    flows(&b, B_IP, &a, A_IP, 0);
    (sim, switch, a, b)
}

/// Like [`pair`], on a fabric whose endpoint_restarts keep the replaced QP for `grace`.
pub fn pair_with_grace(
    policy: Policy,
    grace: Duration,
) -> (Arc<SimFabric>, Arc<FaultSwitch>, Side, Side) {
    pair_of(
        policy,
        grace,
        PollFailurePolicy::Restart,
        SupOpts::default(),
    )
}

/// A restart policy for fault tests: no breaker trips, short backoff.
pub fn quick_policy() -> Policy {
    Policy {
        max_restarts: 100,
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
        ..Policy::default()
    }
}
