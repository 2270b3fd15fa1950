//! Every fault kind of the fault-injecting decorator, on the simulated fabric, under
//! traffic through a supervised pair (side A's provider is wrapped in the decorator; B
//! is plain), each with its expectation: recovered within a bound (or, where the fault
//! does not call for a restart, still running), the ledger balanced, nothing accepted
//! from a stale epoch, drops only with the expected reasons.
//!
//! And a seeded random run of 1,000 mixed faults that drives two interfaces directly,
//! without threads (the supervisor's restart emulated with `close`/`open`): the same
//! seed gives the same injected sequence and the same ledger totals.

mod common;

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sup::{A_IP, B_IP, Side, flows, pair};
use common::{FakeTap, arp_reply, ipv4_frame, params};
use serde_json::json;
use uipoib::iface::napi::TxGate;
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats::{self, DropReason, Snapshot, Stats};
use uipoib::iface::{FLUSH_DEADLINE, Failure, IfaceConfig, Interface};
use uipoib::runtime::control::{self, ControlError, ControlServer};
use uipoib::runtime::supervisor::Close;
use uipoib::runtime::supervisor::{RestartRecord, Status};
use uipoib::verbs::fault::{CqSel, Fault, FaultKind, FaultSpec, SplitMix64, Trigger};
use uipoib::verbs::fault::{FaultSwitch, FaultyProvider};
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{AsyncEvent, Provider};
use uipoib::wire::arp::{self, EthArp};
use uipoib::wire::eth::{self, Mac};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4};

/// Restart policy for these tests: no breaker trips, short backoff.
fn policy() -> Policy {
    common::sup::quick_policy()
}

/// From detection to running again, for a restart whose flushes all arrive (a teardown
/// with work requests that never complete waits out `FLUSH_DEADLINE` first). It takes
/// milliseconds; the bound leaves room for a loaded machine running tests in parallel.
const RECOVERY_BOUND: Duration = Duration::from_millis(2000);

/// From injection to running again for faults detected at the next poll (with the same
/// room).
const DETECT_BOUND: Duration = Duration::from_secs(5);

/// Drops a restart may cause: flushed and reaped sends.
const RESTART_DROPS: [DropReason; 2] = [DropReason::TxFlushed, DropReason::TxReaped];

/// Drops a corrupted receive may cause (the codecs reject it, or a flipped byte in an
/// ARP's sender makes it claim a source it did not come from, or an address outside the
/// subnet; or, with its EtherType turned into IPv6's, the IPv6 and neighbour discovery
/// checks).
const CORRUPT_DROPS: [DropReason; 12] = [
    DropReason::RxShort,
    DropReason::RxBadGrh,
    DropReason::RxBadHeader,
    DropReason::RxBadArp,
    DropReason::RxBadIpv4,
    DropReason::RxUnsupported,
    DropReason::RxArpSpoofed,
    DropReason::RxArpOffSubnet,
    DropReason::RxBadIpv6,
    DropReason::RxBadNd,
    DropReason::RxNdSpoofed,
    DropReason::RxNdOffLink,
];

fn drops_only(s: &Snapshot, allowed: &[DropReason], what: &str) {
    for r in DropReason::ALL {
        if !allowed.contains(&r) {
            assert_eq!(
                s.drop_count(r),
                0,
                "{what}: unexpected drops with reason {}\n{}",
                r.name(),
                s.to_text()
            );
        }
    }
}

/// Wait until A has completed `restarts` restarts and runs; check the bound from
/// `since` and the restart record.
fn recovered(a: &Side, restarts: u64, since: Instant, bound: Duration, cause: &str) -> Status {
    let s = a.wait_state("running", restarts);
    let took = since.elapsed();
    assert!(
        took <= bound,
        "{cause}: recovered after {took:?}, bound {bound:?}"
    );
    let r = s.history.last().expect("a restart record");
    assert_eq!(r.cause, cause, "{r:?}");
    assert!(r.ledger_balanced, "{r:?}");
    s
}

fn last(s: &Status) -> &RestartRecord {
    s.history.last().expect("a restart record")
}

/// Traffic both ways gets through (retrying while a restart is in progress).
fn both_ways(a: &Side, b: &Side, tag: u32) {
    flows(a, A_IP, b, B_IP, tag);
    flows(b, B_IP, a, A_IP, tag + 1);
}

/// End both sides; the cumulative ledgers balance and nothing came from a stale epoch.
fn finish(a: Side, b: Side) -> (Snapshot, Snapshot) {
    finish_with(a, b, true)
}

/// [`finish`], checking the two rings one by one when `recv_exact` is false (for a
/// failed receive post that lands in the middle of a refill), with the same result.
fn finish_with(a: Side, b: Side, recv_exact: bool) -> (Snapshot, Snapshot) {
    let (sa, sb) = (a.stats.clone(), b.stats.clone());
    a.end();
    b.end();
    let (sa, sb) = (sa.snapshot(), sb.snapshot());
    for (name, s) in [("A", &sa), ("B", &sb)] {
        if recv_exact {
            assert!(s.ledger_balanced(), "{name}: ledger\n{}", s.to_text());
        } else {
            let [p, c, f, x, o] = s.ledger(false);
            assert_eq!(p, c + f + x + o, "{name}: send ledger\n{}", s.to_text());
            let [p, c, f, x, o] = s.ledger(true);
            assert_eq!(p, c + f + x + o, "{name}: receive ledger\n{}", s.to_text());
        }
        assert_eq!(s.completions_rejected, 0, "{name}: stale-epoch completions");
        assert_eq!((s.recv_outstanding, s.send_outstanding), (0, 0), "{name}");
    }
    (sa, sb)
}

/// Wait for a counter condition (the poller publishes some counters once per turn).
fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn b_to_a(a: &Side, b: &Side, body: &[u8]) {
    b.tap.inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, body));
}

fn a_to_b(a: &Side, b: &Side, body: &[u8]) {
    a.tap.inject(&ipv4_frame(b.mac, a.mac, A_IP, B_IP, body));
}

#[test]
fn poll_error_after_n_polls_restarts_with_its_return_value() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(FaultSpec::new(Fault::poll_error(-22)).trigger(Trigger::After(5)));
    for i in 0..20 {
        b_to_a(&a, &b, &[i; 40]);
    }
    let s = recovered(&a, 1, t, DETECT_BOUND, "poll-failed");
    assert!(last(&s).detail.contains("-22"), "{:?}", last(&s));
    assert!(last(&s).recovery_ms < RECOVERY_BOUND.as_secs_f64() * 1e3);
    assert_eq!(switch.fired(FaultKind::PollError), 1);
    assert_eq!(switch.injections()[0].op, 6, "the sixth poll failed");
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "poll-error");
}

#[test]
fn poll_error_with_a_seeded_probability_restarts() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(
        FaultSpec::new(Fault::poll_error(-5))
            .trigger(Trigger::Random { p: 0.2, seed: 42 })
            .limit(1),
    );
    for i in 0..20 {
        b_to_a(&a, &b, &[i; 40]);
    }
    recovered(&a, 1, t, DETECT_BOUND, "poll-failed");
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "poll-error (random)");
}

#[test]
fn lost_send_completion_is_caught_by_the_watchdog_and_reaped() {
    let (_sim, switch, a, b) = pair(policy());
    switch.arm(FaultSpec::new(Fault::LostCompletion { cq: CqSel::Send }));
    let t = Instant::now();
    a_to_b(&a, &b, &[1; 40]);
    wait_for("the lost completion", || {
        switch.fired(FaultKind::LostCompletion) == 1
    });
    // No more sends: the lost one stays outstanding and the watchdog (300 ms here,
    // checked every second) hands the interface over.
    let s = recovered(
        &a,
        1,
        t,
        Duration::from_millis(300) + Duration::from_secs(1) + DETECT_BOUND,
        "tx-stall",
    );
    let r = last(&s);
    assert!(r.sends_reaped >= 1, "the lost send was reaped: {r:?}");
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    assert!(sa.send_reaped >= 1);
    drops_only(&sa, &RESTART_DROPS, "lost send completion");
}

#[test]
fn lost_receive_completions_are_reaped_at_the_next_restart() {
    let (_sim, switch, a, b) = pair(policy());
    switch.arm(
        FaultSpec::new(Fault::LostCompletion { cq: CqSel::Recv })
            .trigger(Trigger::Every(2))
            .limit(3),
    );
    for i in 0..10 {
        flows(&b, B_IP, &a, A_IP, 100 + i);
    }
    assert_eq!(switch.fired(FaultKind::LostCompletion), 3);
    // Nothing notices three receive slots gone (the ring is just smaller) until a
    // restart reaps them.
    assert_eq!(a.status().restarts, 0);
    assert_eq!(a.stats.snapshot().recv_reaped, 0);
    let t = Instant::now();
    a.sup().restart();
    let s = recovered(&a, 1, t, FLUSH_DEADLINE + DETECT_BOUND, "operator");
    assert_eq!(last(&s).wr_reaped, 3, "{:?}", last(&s));
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    assert_eq!(sa.recv_reaped, 3, "the three lost receives, nothing else");
    drops_only(&sa, &RESTART_DROPS, "lost receive completions");
}

#[test]
fn qp_error_with_qp_fatal_flushes_and_restarts() {
    let (_sim, switch, a, b) = pair(policy());
    let flushed0 = stats::get(&a.stats.recv_flushed);
    let t = Instant::now();
    switch.arm(FaultSpec::new(Fault::QpError { fatal_event: true }).trigger(Trigger::After(3)));
    for i in 0..10 {
        b_to_a(&a, &b, &[i; 40]);
    }
    let s = recovered(&a, 1, t, DETECT_BOUND, "async-fatal");
    assert!(last(&s).detail.contains("QpFatal"), "{:?}", last(&s));
    assert!(
        stats::get(&a.stats.recv_flushed) > flushed0,
        "the posted receives were flushed"
    );
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "qp-error + QP_FATAL");
}

#[test]
fn qp_error_alone_flushes_and_a_restart_recovers() {
    let (_sim, switch, a, b) = pair(policy());
    let flushed0 = stats::get(&a.stats.recv_flushed);
    switch.arm(FaultSpec::new(Fault::QpError { fatal_event: false }));
    b_to_a(&a, &b, &[1; 40]);
    wait_for("receive flushes", || {
        stats::get(&a.stats.recv_flushed) > flushed0
    });
    // Sends into a QP in the error state are flushed, and counted as such.
    a_to_b(&a, &b, &[2; 40]);
    wait_for("a flushed send", || {
        a.stats.drops(DropReason::TxFlushed) > 0 || a.status().restarts > 0
    });
    // Flush completions are the only sign of the error; a restart (the operator's, if
    // the datapath has not restarted by itself) brings the interface back.
    a.sup().restart();
    a.wait_state("running", 1);
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "qp-error");
}

/// Flush completions outside a teardown mean a QP in the error state: the datapath hands
/// the interface over even when no async event says so.
#[test]
fn qp_error_alone_restarts_without_an_operator() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(FaultSpec::new(Fault::QpError { fatal_event: false }));
    for i in 0..5 {
        b_to_a(&a, &b, &[i; 40]);
        a_to_b(&a, &b, &[i; 40]);
    }
    let s = a.wait_state("running", 1);
    assert!(t.elapsed() <= DETECT_BOUND, "{:?}", t.elapsed());
    assert!(last(&s).ledger_balanced);
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "qp-error alone");
}

#[test]
fn post_send_errors_are_dropped_with_their_reason_and_nothing_restarts() {
    let (_sim, switch, a, b) = pair(policy());
    switch.arm(
        FaultSpec::new(Fault::PostSendError {
            errno: libc::EINVAL,
        })
        .trigger(Trigger::Every(2))
        .limit(5),
    );
    for i in 0..20 {
        a_to_b(&a, &b, &[i; 40]);
        std::thread::sleep(Duration::from_millis(2));
    }
    wait_for("five failed posts", || {
        switch.fired(FaultKind::PostSendError) == 5
    });
    both_ways(&a, &b, 10);
    assert_eq!(a.status().restarts, 0, "a failed post is not a failure");
    let (sa, _) = finish(a, b);
    assert!(
        sa.drop_count(DropReason::TxPostFailed) >= 5,
        "{}",
        sa.to_text()
    );
    drops_only(
        &sa,
        &[DropReason::TxPostFailed, DropReason::TxReaped],
        "post-send-error",
    );
}

#[test]
fn post_recv_error_restarts_the_interface() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(
        FaultSpec::new(Fault::PostRecvError {
            errno: libc::ENOMEM,
        })
        .trigger(Trigger::After(2)),
    );
    for i in 0..10 {
        b_to_a(&a, &b, &[i; 40]);
    }
    let s = recovered(&a, 1, t, DETECT_BOUND, "verbs-error");
    assert!(last(&s).detail.contains("ibv_post_recv"), "{:?}", last(&s));
    both_ways(&a, &b, 10);
    let (sa, _) = finish_with(a, b, false);
    drops_only(&sa, &RESTART_DROPS, "post-recv-error");
}

/// A receive refill that fails after posting part of its batch: the cumulative ledger
/// still balances (what was posted before the failure is counted). Driven without
/// threads, so the failure lands mid-batch every time.
#[test]
fn post_recv_error_mid_batch_keeps_the_cumulative_ledger() {
    let sim = Arc::new(common::fabric(4096));
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let mut a = common::open(&faulty, "sim0", "198.18.2.1/24", 16, 16);
    let mut b = common::open(sim.as_ref(), "sim1", "198.18.2.2/24", 16, 16);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    common::introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    let now = Instant::now();
    for i in 0..4 {
        tb.inject(ipv4_frame(a.mac(), b.mac(), B_IP, A_IP, &[i; 40]));
    }
    b.tx_from_tap(&tb, &mut TxGate::new(), now).unwrap();
    // The refill after this poll re-posts four receives: the second one fails.
    switch.arm(
        FaultSpec::new(Fault::PostRecvError {
            errno: libc::ENOMEM,
        })
        .trigger(Trigger::After(1)),
    );
    match a.poll_rx(&ta, now) {
        Err(Failure::Verbs(_)) => {}
        Err(other) => panic!("{other}"),
        Ok(n) => panic!("the refill did not fail ({n} completions)"),
    }
    let stats = a.stats().clone();
    let (t, _) = a.close(FLUSH_DEADLINE);
    t.ledger.expect("the epoch's own ledger balances");
    let s = stats.snapshot();
    assert!(s.ledger_balanced(), "{}", s.to_text());
    drop(b);
}

#[test]
fn async_fatal_by_trigger_and_at_a_time_offset() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(
        FaultSpec::new(Fault::AsyncFatal {
            event: AsyncEvent::CqError,
        })
        .trigger(Trigger::After(10)),
    );
    for i in 0..20 {
        b_to_a(&a, &b, &[i; 40]);
    }
    let s = recovered(&a, 1, t, DETECT_BOUND, "async-fatal");
    assert!(last(&s).detail.contains("CqError"), "{:?}", last(&s));
    both_ways(&a, &b, 10);

    // At 300 ms after arming: not before.
    let t = Instant::now();
    switch.arm(
        FaultSpec::new(Fault::AsyncFatal {
            event: AsyncEvent::DeviceFatal,
        })
        .trigger(Trigger::At(Duration::from_millis(300))),
    );
    let until = t + Duration::from_millis(600);
    let mut i = 0u8;
    while Instant::now() < until && a.status().restarts < 2 {
        b_to_a(&a, &b, &[i; 40]);
        i = i.wrapping_add(1);
        std::thread::sleep(Duration::from_millis(10));
    }
    recovered(&a, 2, t, DETECT_BOUND, "device-fatal");
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "fired before its time: {:?}",
        t.elapsed()
    );
    both_ways(&a, &b, 20);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "async-fatal");
}

#[test]
fn spurious_events_are_counted_and_harmless() {
    let (_sim, switch, a, b) = pair(policy());
    // Let A go idle (both CQs armed, waiting for an event).
    std::thread::sleep(Duration::from_millis(100));
    let (ev0, sp0) = (
        stats::get(&a.stats.cq_events),
        stats::get(&a.stats.spurious_events),
    );
    for _ in 0..3 {
        switch.arm(FaultSpec::new(Fault::SpuriousEvent));
        std::thread::sleep(Duration::from_millis(30));
    }
    wait_for("three completion events", || {
        stats::get(&a.stats.cq_events) >= ev0 + 3
    });
    wait_for("a spurious event counted", || {
        stats::get(&a.stats.spurious_events) > sp0
    });
    assert_eq!(switch.fired(FaultKind::SpuriousEvent), 3);
    both_ways(&a, &b, 10);
    assert_eq!(a.status().restarts, 0);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &[DropReason::TxReaped], "spurious-event");
}

#[test]
fn slow_polls_keep_traffic_flowing() {
    let (_sim, switch, a, b) = pair(policy());
    switch.arm(FaultSpec::new(Fault::SlowPoll {
        delay: Duration::from_millis(20),
    }));
    let t = Instant::now();
    both_ways(&a, &b, 10);
    both_ways(&a, &b, 20);
    // Each slowed poll sleeps 20 ms in a poller (the two pollers may sleep at once).
    // How many polls the exchanges take depends on the loop (a send completion raises
    // no event unless a sender waits for a slot), not on the fault.
    let fired = switch.fired(FaultKind::SlowPoll);
    assert!(fired >= 2, "only {fired} polls slowed");
    assert!(
        t.elapsed() >= Duration::from_millis(10) * fired as u32,
        "polls were slowed: {fired} in {:?}",
        t.elapsed()
    );
    switch.clear();
    both_ways(&a, &b, 30);
    assert_eq!(a.status().restarts, 0, "slow is not failed");
    let (sa, _) = finish(a, b);
    drops_only(&sa, &[DropReason::TxReaped], "slow-poll");
}

#[test]
fn corrupted_receives_are_dropped_by_the_codecs_never_a_panic() {
    let (_sim, switch, a, b) = pair(policy());
    switch.arm(
        FaultSpec::new(Fault::CorruptRx { bytes: 8 })
            .trigger(Trigger::Random { p: 0.7, seed: 3 })
            .unlimited(),
    );
    let body: Vec<u8> = (0..60).collect();
    for batch in 0..20 {
        for _ in 0..10 {
            b_to_a(&a, &b, &body);
        }
        // Drain what reached A's TAP (corrupted or not).
        while a.tap.recv().is_some() {}
        assert_eq!(a.status().restarts, 0, "batch {batch}");
    }
    wait_for("corrupted packets", || {
        switch.fired(FaultKind::CorruptRx) >= 50
    });
    let rx_drops: u64 = CORRUPT_DROPS.iter().map(|r| a.stats.drops(*r)).sum();
    assert!(rx_drops > 0, "some corruption was caught by the codecs");
    assert!(rx_drops <= switch.fired(FaultKind::CorruptRx));
    switch.clear();
    // The poller survived: traffic flows again, unharmed.
    both_ways(&a, &b, 10);
    assert_eq!(a.status().restarts, 0);
    let (sa, _) = finish(a, b);
    let mut allowed = CORRUPT_DROPS.to_vec();
    allowed.push(DropReason::TxReaped);
    drops_only(&sa, &allowed, "corrupt-rx");
}

#[test]
fn stalled_sends_fire_the_watchdog() {
    let (_sim, switch, a, b) = pair(policy());
    let t = Instant::now();
    switch.arm(FaultSpec::new(Fault::StallSend));
    for i in 0..5 {
        a_to_b(&a, &b, &[i; 40]);
    }
    let s = recovered(
        &a,
        1,
        t,
        Duration::from_millis(300) + Duration::from_secs(1) + DETECT_BOUND,
        "tx-stall",
    );
    assert!(last(&s).sends_reaped >= 1, "{:?}", last(&s));
    assert!(!switch.stalled(), "the stall ended with its endpoint");
    both_ways(&a, &b, 10);
    let (sa, _) = finish(a, b);
    drops_only(&sa, &RESTART_DROPS, "stall-send");
}

fn sock(tag: &str) -> PathBuf {
    // A directory of its own: the control socket refuses one others can write (/tmp).
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("uipoib-faults-{}-{tag}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    dir.join("c.sock")
}

#[test]
fn inject_and_clear_over_the_control_socket() {
    let (_sim, switch, a, b) = pair(policy());
    let path = sock("ctl");
    let srv = ControlServer::start(
        &path,
        a.stats.clone(),
        a.status.clone(),
        Default::default(),
        Some(a.sup().orders()),
        Some(switch.clone()),
    )
    .unwrap();
    let t = Instant::now();
    let v = control::request_json(
        &path,
        &json!({"cmd": "inject", "fault": "poll-error", "after": 3, "ret": -11}),
    )
    .unwrap();
    assert_eq!(v["injected"], "poll-error");
    for i in 0..10 {
        b_to_a(&a, &b, &[i; 40]);
    }
    recovered(&a, 1, t, DETECT_BOUND, "poll-failed");
    let v = control::request(&path, "faults").unwrap();
    assert_eq!(v["injected"], 1, "{v}");
    assert_eq!(v["recent"][0]["kind"], "poll-error");
    assert_eq!(v["recent"][0]["op"], 4);
    // A slow poll until cleared, then cleared.
    control::request_json(
        &path,
        &json!({"cmd": "inject", "fault": "slow-poll", "delay_ms": 1}),
    )
    .unwrap();
    assert_eq!(switch.armed().len(), 1);
    control::request(&path, "clear").unwrap();
    assert!(switch.armed().is_empty());
    for (bad, field) in [
        (
            json!({"cmd": "inject", "fault": "stall-send", "every": 0}),
            "every",
        ),
        (
            json!({"cmd": "inject", "fault": "corrupt-rx", "bytes": "lots"}),
            "bytes",
        ),
        (
            json!({"cmd": "inject", "fault": "slow-poll", "probability": 2}),
            "probability",
        ),
    ] {
        match control::request_json(&path, &bad) {
            Err(ControlError::Refused(m)) => assert!(m.contains(field), "{m}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    drop(srv);
    both_ways(&a, &b, 10);
    finish(a, b);
}

// ---------------------------------------------------------------------------------
// The seeded random run: two interfaces driven directly, no threads.

/// Faults armed by one seeded run.
const RANDOM_FAULTS: usize = 1000;

/// Traffic rounds after each arming; each round advances the virtual clock by 1 ms.
const ROUNDS_PER_FAULT: u32 = 4;

/// The send-stall watchdog of the driven interfaces (virtual time).
const RANDOM_TX_TIMEOUT: Duration = Duration::from_millis(20);

/// One interface driven step by step the way its poller would, restarted the way its
/// supervisor would.
struct Node {
    ip: Ipv4Addr,
    peer_ip: Ipv4Addr,
    provider: Arc<dyn Provider>,
    switch: Arc<FaultSwitch>,
    params: IfaceConfig,
    stats: Arc<Stats>,
    iface: Option<Interface>,
    epoch: u16,
    tap: FakeTap,
    mac: Mac,
    delivered: u64,
    restarts: Vec<&'static str>,
    failed_opens: u64,
}

impl Node {
    fn new(sim: &Arc<SimFabric>, dev: &str, ip: Ipv4Addr, peer_ip: Ipv4Addr) -> Node {
        let faulty = FaultyProvider::new(sim.clone());
        let switch = faulty.switch();
        let provider: Arc<dyn Provider> = Arc::new(faulty);
        let mut params = params(dev, &format!("{ip}/24"), 32, 16);
        params.tx_timeout = RANDOM_TX_TIMEOUT;
        let stats = Arc::new(Stats::default());
        let iface =
            Interface::open(provider.as_ref(), &params, stats.clone(), 1, &mut None).expect("open");
        Node {
            ip,
            peer_ip,
            mac: iface.mac(),
            provider,
            switch,
            params,
            stats,
            iface: Some(iface),
            epoch: 1,
            tap: FakeTap::default(),
            delivered: 0,
            restarts: Vec::new(),
            failed_opens: 0,
        }
    }

    /// One turn of the poller: events, polls, TX, housekeeping.
    fn turn(&mut self, now: Instant) -> Result<(), Failure> {
        let tap = &self.tap;
        let iface = self.iface.as_mut().expect("an interface");
        let ep = iface.endpoint_mut();
        ep.take_cq_events().map_err(Failure::Verbs)?;
        while let Some(ev) = ep.next_async_event().map_err(Failure::Verbs)? {
            if matches!(
                ev,
                AsyncEvent::DeviceFatal
                    | AsyncEvent::CqError
                    | AsyncEvent::QpFatal
                    | AsyncEvent::DeviceRemoved
            ) {
                return Err(Failure::AsyncFatal(ev));
            }
        }
        iface.poll_rx(tap, now)?;
        iface.poll_tx(now)?;
        iface.tx_from_tap(tap, &mut TxGate::new(), now)?;
        iface.housekeeping(now)
    }

    /// The kernel's side of the TAP: count delivered IPv4, answer ARP requests.
    fn kernel(&mut self) {
        for f in self.tap.take_written() {
            let Ok((h, p)) = eth::parse_frame(&f) else {
                continue;
            };
            match h.ethertype {
                ETHERTYPE_IPV4 => self.delivered += 1,
                ETHERTYPE_ARP => {
                    if let Ok(a) = EthArp::parse(p)
                        && a.op == arp::OP_REQUEST
                        && a.tpa == self.ip
                        && a.spa != self.ip
                    {
                        self.tap.inject(arp_reply(self.mac, self.ip, a.sha, a.spa));
                    }
                }
                _ => {}
            }
        }
    }

    /// The supervisor's restart: tear down (reaping what never completed), open_on with
    /// a new epoch, announce. The teardown is immediate, as the supervisor's for a lost
    /// device: a flush drain bounded by wall-clock time would make the outcome depend on
    /// the machine's timing (the supervised tests drain flushes).
    fn restart(&mut self, cause: Failure, now: Instant) {
        let iface = self.iface.take().expect("an interface");
        let (t, neigh) = iface.close(Duration::ZERO);
        if let Err(e) = t.ledger {
            panic!("ledger after the reap ({cause}): {e}");
        }
        self.restarts.push(cause.kind());
        let mut neigh = Some(neigh);
        for attempt in 0.. {
            let epoch = self.epoch.wrapping_add(1).max(1);
            match Interface::open(
                self.provider.as_ref(),
                &self.params,
                self.stats.clone(),
                epoch,
                &mut neigh,
            ) {
                Ok(mut i) => {
                    self.epoch = epoch;
                    i.announce(now);
                    self.iface = Some(i);
                    return;
                }
                Err(e) => {
                    self.failed_opens += 1;
                    assert!(attempt < 100, "reopening keeps failing: {e}");
                }
            }
        }
    }

    /// Frames waiting in the TAP stay few (the kernel would stop too).
    fn offer(&self, to: Mac, tag: u32) {
        if self.tap.pending() < 4 {
            self.tap.inject(ipv4_frame(
                to,
                self.mac,
                self.ip,
                self.peer_ip,
                &tag.to_be_bytes().repeat(16),
            ));
        }
    }
}

fn random_fault(rng: &mut SplitMix64) -> FaultSpec {
    let kind = FaultKind::ALL[rng.below(FaultKind::ALL.len() as u64) as usize];
    let pick = |rng: &mut SplitMix64, xs: &[i32]| xs[rng.below(xs.len() as u64) as usize];
    let fault = match kind {
        FaultKind::PollError => Fault::PollError {
            ret: -1 - rng.below(30) as i32,
            lose: rng.below(3) as u32,
            cq: [CqSel::Send, CqSel::Recv, CqSel::Any][rng.below(3) as usize],
        },
        FaultKind::LostCompletion => Fault::LostCompletion {
            cq: [CqSel::Send, CqSel::Recv, CqSel::Any][rng.below(3) as usize],
        },
        FaultKind::QpError => Fault::QpError {
            fatal_event: rng.chance(0.5),
        },
        FaultKind::PostSendError => Fault::PostSendError {
            errno: pick(rng, &[libc::ENOMEM, libc::EINVAL, libc::EAGAIN]),
        },
        FaultKind::PostRecvError => Fault::PostRecvError {
            errno: pick(rng, &[libc::ENOMEM, libc::EINVAL, libc::EAGAIN]),
        },
        FaultKind::AsyncFatal => Fault::AsyncFatal {
            event: [
                AsyncEvent::DeviceFatal,
                AsyncEvent::CqError,
                AsyncEvent::QpFatal,
                AsyncEvent::DeviceRemoved,
            ][rng.below(4) as usize],
        },
        FaultKind::SpuriousEvent => Fault::SpuriousEvent,
        FaultKind::SlowPoll => Fault::SlowPoll {
            delay: Duration::from_millis(1),
        },
        FaultKind::CorruptRx => Fault::CorruptRx {
            bytes: 1 + rng.below(8) as u32,
        },
        FaultKind::StallSend => Fault::StallSend,
    };
    let trigger = match rng.below(4) {
        0 => Trigger::Now,
        1 => Trigger::After(rng.below(20)),
        2 => Trigger::Every(2 + rng.below(8)),
        _ => Trigger::Random {
            p: 0.05 + 0.45 * rng.next_f64(),
            seed: rng.next_u64(),
        },
    };
    FaultSpec::new(fault)
        .trigger(trigger)
        .limit(1 + rng.below(3))
}

/// What one seeded run did.
#[derive(Debug, PartialEq)]
struct RunRecord {
    /// Per side: (kind, endpoint, operation) of every hit, in order.
    injected: [Vec<(FaultKind, Option<u64>, u64)>; 2],
    /// Per side: the counters at the end (ledger totals, drops by reason, ...).
    stats: [Snapshot; 2],
    /// Per side: IPv4 packets that reached the TAP.
    delivered: [u64; 2],
    /// Per side: restart causes, in order.
    restarts: [Vec<&'static str>; 2],
    /// Per side: open_on attempts that failed.
    failed_opens: [u64; 2],
}

fn seeded_run(seed: u64, faults: usize) -> RunRecord {
    let sim = Arc::new(common::fabric(4096));
    let mut nodes = [
        Node::new(&sim, "sim0", A_IP, B_IP),
        Node::new(&sim, "sim1", B_IP, A_IP),
    ];
    let macs = [nodes[0].mac, nodes[1].mac];
    let base = Instant::now();
    let mut ms = 0u64;
    let mut rng = SplitMix64::new(seed);
    // Introduce the two through their kernels' ARP (request from A, reply from B).
    nodes[0]
        .tap
        .inject(common::arp_request(macs[0], A_IP, B_IP));
    let mut tag = 0u32;
    for _ in 0..faults {
        let side = rng.below(2) as usize;
        let spec = random_fault(&mut rng);
        nodes[side].switch.arm(spec);
        for _ in 0..ROUNDS_PER_FAULT {
            ms += 1;
            let now = base + Duration::from_millis(ms);
            for i in 0..2 {
                tag += 1;
                nodes[i].offer(macs[1 - i], tag);
                if let Err(cause) = nodes[i].turn(now) {
                    nodes[i].restart(cause, now);
                }
                nodes[i].kernel();
            }
        }
    }
    // Disarm and let both settle; then both end with everything accounted for.
    for n in &mut nodes {
        n.switch.clear();
    }
    for _ in 0..50 {
        ms += 1;
        let now = base + Duration::from_millis(ms);
        for n in &mut nodes {
            if let Err(cause) = n.turn(now) {
                n.restart(cause, now);
            }
            n.kernel();
        }
    }
    let mut out = RunRecord {
        injected: [Vec::new(), Vec::new()],
        stats: [Snapshot::default(), Snapshot::default()],
        delivered: [0; 2],
        restarts: [Vec::new(), Vec::new()],
        failed_opens: [0; 2],
    };
    for (i, mut n) in nodes.into_iter().enumerate() {
        let iface = n.iface.take().expect("an interface");
        let (t, _) = iface.close(Duration::ZERO);
        t.ledger
            .unwrap_or_else(|e| panic!("side {i} at the end: {e}"));
        out.injected[i] = n
            .switch
            .injections()
            .iter()
            .map(|j| (j.kind, j.endpoint, j.op))
            .collect();
        out.stats[i] = n.stats.snapshot();
        out.delivered[i] = n.delivered;
        out.restarts[i] = n.restarts;
        out.failed_opens[i] = n.failed_opens;
    }
    assert_eq!(sim.live_qps(), 0);
    out
}

#[test]
fn seeded_random_run_of_a_thousand_faults_is_reproducible() {
    let t = Instant::now();
    let first = seeded_run(0x5EED_0001, RANDOM_FAULTS);
    let took = t.elapsed();
    let second = seeded_run(0x5EED_0001, RANDOM_FAULTS);
    let kinds: std::collections::BTreeMap<&str, usize> = FaultKind::ALL
        .iter()
        .map(|k| {
            (
                k.name(),
                first
                    .injected
                    .iter()
                    .flatten()
                    .filter(|(kk, _, _)| kk == k)
                    .count(),
            )
        })
        .collect();
    eprintln!(
        "seeded run: {took:?}; injected {} + {}, by kind {kinds:?}; restarts {} + {}; \
         delivered {:?}; failed opens {:?}",
        first.injected[0].len(),
        first.injected[1].len(),
        first.restarts[0].len(),
        first.restarts[1].len(),
        first.delivered,
        first.failed_opens,
    );
    for side in 0..2 {
        let (x, y) = (&first.injected[side], &second.injected[side]);
        if let Some(i) = (0..x.len().min(y.len())).find(|&i| x[i] != y[i]) {
            panic!(
                "side {side}: the runs part at injection {i}: {:?} vs {:?}\nrestarts {:?}\nvs {:?}",
                &x[i.saturating_sub(5)..(i + 5).min(x.len())],
                &y[i.saturating_sub(5)..(i + 5).min(y.len())],
                first.restarts[side],
                second.restarts[side]
            );
        }
    }
    assert_eq!(first.injected, second.injected, "the same faults, in order");
    assert_eq!(
        first.stats, second.stats,
        "the same counters and ledger totals"
    );
    assert_eq!(first, second);

    // What the run must show besides: every kind hit, restarts and traffic, every
    // ledger balanced, nothing from a stale epoch, drops only for the faults' reasons.
    for (k, n) in &kinds {
        assert!(*n > 0, "{k} never fired");
    }
    let mut allowed = CORRUPT_DROPS.to_vec();
    allowed.extend([
        DropReason::TxPostFailed,
        DropReason::TxFlushed,
        DropReason::TxReaped,
        DropReason::TxNoNeighbour,
    ]);
    for (i, s) in first.stats.iter().enumerate() {
        // Every teardown's own ledger balanced (checked at each restart), and so do
        // the cumulative counters of both rings.
        let [p, c, f, x, o] = s.ledger(false);
        assert_eq!(p, c + f + x + o, "side {i}: send ledger\n{}", s.to_text());
        let [p, c, f, x, o] = s.ledger(true);
        assert_eq!(
            p,
            c + f + x + o,
            "side {i}: receive ledger\n{}",
            s.to_text()
        );
        assert_eq!(s.completions_rejected, 0, "side {i}");
        assert_eq!((s.recv_outstanding, s.send_outstanding), (0, 0));
        drops_only(s, &allowed, &format!("side {i}"));
        assert!(
            first.restarts[i].len() >= 10,
            "side {i}: {:?}",
            first.restarts[i]
        );
        assert!(first.delivered[i] > 0, "side {i}");
    }

    // Another seed, another sequence.
    let other = seeded_run(0x5EED_0002, 100);
    assert_ne!(other.injected, first.injected);
}
