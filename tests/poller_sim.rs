//! The poller threads over the simulated fabric: traffic flows through the mio shell,
//! and a failed CQ poll stops the poller at once and hands the interface over by value.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{
    SockTap, arp_reply, arp_request, fabric, ipv4_frame, nice_levels, nice_levels_at, open,
    open_with, params, policies,
};
use crossbeam_channel::unbounded;
use uipoib::iface::{FLUSH_DEADLINE, Failure};
use uipoib::runtime::poller::{Exit, Poller};
use uipoib::runtime::supervisor::Close;
use uipoib::tap::TapDevice;
use uipoib::verbs::VerbsError;
use uipoib::verbs::fault::{Fault, FaultSpec, FaultyProvider};
use uipoib::wire::arp::EthArp;
use uipoib::wire::eth::{self, Mac};

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

/// The ARP message in an Ethernet frame, if it is one.
fn arp_of(f: &[u8]) -> Option<EthArp> {
    eth::parse_frame(f)
        .ok()
        .and_then(|(_, p)| EthArp::parse(p).ok())
}

/// One ARP exchange through two running pollers: the asking side's kernel asks for the
/// other's address, the other side's kernel sees the request and answers, and the
/// answer reaches the asker.
fn arp_exchange(ask: (&SockTap, Mac, Ipv4Addr), answer: (&SockTap, Mac, Ipv4Addr)) {
    let (ask_tap, ask_mac, ask_ip) = ask;
    let (answer_tap, answer_mac, answer_ip) = answer;
    ask_tap.inject(&arp_request(ask_mac, ask_ip, answer_ip));
    wait_frame(answer_tap, "ARP request", |f| {
        arp_of(f).is_some_and(|a| a.tpa == answer_ip && a.spa == ask_ip)
    });
    answer_tap.inject(&arp_reply(answer_mac, answer_ip, ask_mac, ask_ip));
    wait_frame(ask_tap, "ARP reply", |f| {
        arp_of(f).is_some_and(|a| a.spa == answer_ip && a.op == 2)
    });
}

/// Wait for the next frame on `tap` that satisfies `pred`.
fn wait_frame(tap: &SockTap, what: &str, pred: impl Fn(&[u8]) -> bool) -> Vec<u8> {
    let deadline = Instant::now() + Duration::from_secs(5);
    while Instant::now() < deadline {
        if let Some(f) = tap.recv()
            && pred(&f)
        {
            return f;
        }
    }
    panic!("timed out waiting for {what}");
}

#[test]
fn traffic_flows_then_a_failed_poll_hands_the_interface_over() {
    let sim = Arc::new(fabric(4096));
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let a = open(&faulty, "sim0", "198.18.2.1/24", 64, 32);
    let b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 64, 32);
    let (a_mac, b_mac) = (a.mac(), b.mac());
    let (ta, tb) = (SockTap::new(), SockTap::new());
    let (tx, rx) = unbounded();
    let da: Arc<dyn TapDevice> = ta.clone();
    let db: Arc<dyn TapDevice> = tb.clone();
    let pa = Poller::spawn("a".into(), a, da, tx.clone()).unwrap();
    let pb = Poller::spawn("b".into(), b, db, tx).unwrap();

    // Each poller announces itself with a gratuitous ARP at start; the other side's
    // kernel sees it.
    wait_frame(&tb, "A's gratuitous ARP", |f| {
        arp_of(f).is_some_and(|a| a.spa == A_IP && a.tpa == A_IP)
    });

    arp_exchange((&ta, a_mac, A_IP), (&tb, b_mac, B_IP));
    for i in 0..200u32 {
        let body = i.to_be_bytes().repeat(200);
        ta.inject(&ipv4_frame(b_mac, a_mac, A_IP, B_IP, &body));
        let f = wait_frame(&tb, "IPv4 frame", |f| f.len() == 14 + 20 + body.len());
        assert_eq!(&f[34..], &body[..]);
    }

    // Now every poll on A fails.
    switch.arm_poll_error(-5);
    // Traffic towards A makes its poller poll.
    tb.inject(&ipv4_frame(a_mac, b_mac, B_IP, A_IP, &[1; 10]));
    let exit = rx
        .recv_timeout(Duration::from_secs(5))
        .expect("A's poller reported");
    let polls_after = switch.polls_after_failure();
    match exit {
        Exit::Failed {
            name, iface, cause, ..
        } => {
            assert_eq!(name, "a");
            assert!(
                matches!(
                    cause,
                    Failure::PollFailed(VerbsError::PollFailed { ret: -5, .. })
                ),
                "{cause:?}"
            );
            assert_eq!(polls_after, 0, "the poller retried a failed poll");
            // The poller is gone: more traffic does not make anything poll A's CQs.
            tb.inject(&ipv4_frame(a_mac, b_mac, B_IP, A_IP, &[2; 10]));
            std::thread::sleep(Duration::from_millis(200));
            assert_eq!(switch.polls_after_failure(), 0);
            assert_eq!(
                switch.polls_failed(),
                1,
                "exactly one failed poll, no retry"
            );
            switch.clear();
            let (t, _) = iface.close(FLUSH_DEADLINE);
            t.ledger.expect("ledger balances after teardown");
        }
        Exit::Stopped { .. } => panic!("expected a failure"),
        Exit::Panicked { message, .. } => panic!("A's poller panicked: {message}"),
    }
    pa.join();
    pb.stop();
    match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
        Exit::Stopped { name, iface } => {
            assert_eq!(name, "b");
            let s = iface.stats().snapshot();
            assert!(s.rx_packets >= 200, "{s:?}");
            assert_eq!(s.drops_total(), 0, "{:?}", s.drops);
            iface.close(FLUSH_DEADLINE).0.ledger.unwrap();
        }
        Exit::Failed { cause, .. } => panic!("B failed: {cause}"),
        Exit::Panicked { message, .. } => panic!("B's poller panicked: {message}"),
    }
    pb.join();
    assert_eq!(sim.live_qps(), 0, "every QP destroyed");
}

/// `rx-boost-nice`: a poll that finds a backlog of received frames raises the poller's
/// nice level (counted as `rx_boosts`), and a wake-up after 100 ms without one lowers it
/// again, before the frame that woke it is delivered.
#[test]
fn a_receive_backlog_raises_the_pollers_level_and_a_quiet_spell_lowers_it() {
    let base = uipoib::sys::process::thread_nice().unwrap();
    let raised = base - 2;
    // Raising a thread's priority needs CAP_SYS_NICE or a RLIMIT_NICE that allows it
    // (scripts/test runs as root). Said here if not.
    let allowed = std::thread::spawn(move || uipoib::sys::process::set_thread_nice(raised))
        .join()
        .unwrap();
    if let Err(e) = allowed {
        panic!(
            "this test cannot run here: raising a thread from nice {base} to {raised} is \
             refused ({e}); it needs CAP_SYS_NICE or a RLIMIT_NICE that allows it"
        );
    }
    let sim = Arc::new(fabric(4096));
    let mut pa = params("sim0", "198.18.2.1/24", 256, 32);
    pa.rx_boost_nice = Some(raised);
    // A budget of 64: a poll takes a whole burst.
    pa.budget = 64;
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let a = open_with(&faulty, &pa);
    let b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 64, 32);
    let (a_mac, b_mac) = (a.mac(), b.mac());
    let (sa, sb) = (a.stats().clone(), b.stats().clone());
    let (ta, tb) = (SockTap::new(), SockTap::new());
    let (tx, rx) = unbounded();
    let da: Arc<dyn TapDevice> = ta.clone();
    let db: Arc<dyn TapDevice> = tb.clone();
    let pa = Poller::spawn("boost".into(), a, da, tx.clone()).unwrap();
    let pb = Poller::spawn("plain".into(), b, db, tx).unwrap();
    assert_eq!(nice_levels_at("poll-boost", base), vec![base]);

    arp_exchange((&tb, b_mac, B_IP), (&ta, a_mac, A_IP));
    // The start's announcements may have arrived together (a backlog of two): past the
    // hold, one frame at a time, each delivered before the next: no backlog, no boost.
    std::thread::sleep(Duration::from_millis(150));
    let before = stats_of(&sa).rx_boosts;
    for i in 0..20u32 {
        let body = i.to_be_bytes().repeat(100);
        tb.inject(&ipv4_frame(a_mac, b_mac, B_IP, A_IP, &body));
        wait_frame(&ta, "a single frame", |f| f.len() == 14 + 20 + body.len());
    }
    assert_eq!(stats_of(&sa).rx_boosts, before);
    assert_eq!(nice_levels("poll-boost"), vec![base]);

    // A burst while A's poller is held up (its next poll sleeps: `slow-poll`): the frames
    // wait in its receive CQ, a backlog. The first frame wakes A; once A's poll sleeps the
    // rest go, and B has posted all of them (on the simulated fabric a packet is in A's
    // receive queue when its post returns) before the sleep ends: the backlog does not
    // depend on how fast either poller runs on a loaded machine. (Eight: the test's TAP, a
    // Unix datagram socket, queues at most ten frames for this reader.)
    let hold = Duration::from_secs(2);
    switch.arm(FaultSpec::new(Fault::SlowPoll { delay: hold }).limit(1));
    let burst = 8u32;
    let frame = |i: u32| {
        ipv4_frame(
            a_mac,
            b_mac,
            B_IP,
            A_IP,
            &(1000 + i).to_be_bytes().repeat(100),
        )
    };
    let posted = stats_of(&sb).send_posted;
    tb.inject(&frame(0));
    let deadline = Instant::now() + Duration::from_secs(10);
    while switch.fired(uipoib::verbs::fault::FaultKind::SlowPoll) == 0 {
        assert!(Instant::now() < deadline, "A's poll never slept");
        std::thread::sleep(Duration::from_millis(1));
    }
    let slept = Instant::now();
    for i in 1..burst {
        tb.inject(&frame(i));
    }
    while stats_of(&sb).send_posted < posted + u64::from(burst) {
        assert!(
            slept.elapsed() < hold,
            "B posted {} of the burst of {burst} within A's {hold:?} slow poll",
            stats_of(&sb).send_posted - posted
        );
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut got = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while got < burst && Instant::now() < deadline {
        if ta.recv().is_some_and(|f| f.len() == 14 + 20 + 400) {
            got += 1;
        }
    }
    assert_eq!(got, burst, "the burst delivered");
    assert_eq!(switch.fired(uipoib::verbs::fault::FaultKind::SlowPoll), 1);
    // The poller counts the raise once its poll has returned, after the frames are out:
    // on a loaded machine the last frame can be read here first.
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats_of(&sa).rx_boosts == before && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(1));
    }
    let boosts = stats_of(&sa).rx_boosts;
    assert!(boosts > before, "no boost for a burst of {burst}");
    // B's poller has no level to raise to, whatever it receives.
    assert_eq!(stats_of(&sb).rx_boosts, 0);
    assert_eq!(nice_levels("poll-plain"), vec![base]);

    // After the hold, the next wake-up lowers the level again.
    std::thread::sleep(Duration::from_millis(150));
    tb.inject(&ipv4_frame(a_mac, b_mac, B_IP, A_IP, &[7; 300]));
    wait_frame(&ta, "the frame after the hold", |f| {
        f.len() == 14 + 20 + 300
    });
    assert_eq!(nice_levels_at("poll-boost", base), vec![base]);
    assert_eq!(stats_of(&sa).rx_boosts, boosts, "raised again by one frame");

    for (p, name) in [(pa, "boost"), (pb, "plain")] {
        p.stop();
        match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
            Exit::Stopped { iface, .. } => {
                assert_eq!(iface.stats().snapshot().drops_total(), 0);
                iface.close(FLUSH_DEADLINE).0.ledger.unwrap();
            }
            Exit::Failed { cause, .. } => panic!("{name} failed: {cause}"),
            Exit::Panicked { message, .. } => panic!("{name}'s poller panicked: {message}"),
        }
        p.join();
    }
}

/// `poller-batch`: the poller thread runs under SCHED_BATCH, its level kept; a poller
/// without it keeps the daemon's policy.
#[test]
fn poller_batch_puts_the_poller_thread_alone_under_sched_batch() {
    let sim = Arc::new(fabric(4096));
    let mut pa = params("sim0", "198.18.2.1/24", 64, 32);
    pa.poller_batch = true;
    let a = open_with(sim.as_ref(), &pa);
    let b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 64, 32);
    let (tx, rx) = unbounded();
    let (ta, tb) = (SockTap::new(), SockTap::new());
    let base = uipoib::sys::process::thread_nice().unwrap();
    let mine = uipoib::sys::process::thread_policy().unwrap();
    let pa = Poller::spawn("batch".into(), a, ta.clone(), tx.clone()).unwrap();
    let pb = Poller::spawn("other".into(), b, tb.clone(), tx).unwrap();
    // A thread names itself and sets its policy as it starts: given a moment.
    let deadline = Instant::now() + Duration::from_secs(5);
    while (policies("poll-batch") != vec![libc::SCHED_BATCH] || policies("poll-other").is_empty())
        && Instant::now() < deadline
    {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(policies("poll-batch"), vec![libc::SCHED_BATCH]);
    assert_eq!(nice_levels("poll-batch"), vec![base]);
    assert_eq!(policies("poll-other"), vec![mine]);
    for p in [pa, pb] {
        p.stop();
        match rx.recv_timeout(Duration::from_secs(5)).unwrap() {
            Exit::Stopped { iface, .. } => iface.close(FLUSH_DEADLINE).0.ledger.unwrap(),
            Exit::Failed { cause, .. } => panic!("failed: {cause}"),
            Exit::Panicked { message, .. } => panic!("panicked: {message}"),
        }
        p.join();
    }
}

fn stats_of(s: &uipoib::iface::stats::Stats) -> uipoib::iface::stats::Snapshot {
    s.snapshot()
}
