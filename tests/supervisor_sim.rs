//! The restart supervisor over the simulated fabric: every cause of a restart ends in a
//! recovered interface with traffic flowing both ways and a balanced ledger (a device loss
//! reopens everything, any other cause keeps the endpoint and renews its QP); a peer
//! follows a restart without operator action; the circuit breaker trips and an operator
//! revives; thousands of restarts leak nothing. And the hardening: events for objects
//! that are not live, GID changes, a panicking, hung or unstartable poller, a device that
//! keeps failing without going away, and where and when replaced QPs are destroyed.

mod common;

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use common::sup::{self, A_IP, B_IP, Side, flows, introduce, pair, pair_with_grace};
use common::{ipv4_frame, nice_levels, nice_levels_at};
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats;
use uipoib::verbs::AsyncEvent;

/// Make A's poller poll (B sends it a frame).
fn poke(a: &Side, b: &Side) {
    b.tap
        .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[9; 20]));
}

/// The status stays in `state` with `restarts` restarts for `d`.
fn stays(side: &Side, state: &str, restarts: u64, d: Duration) {
    let end = Instant::now() + d;
    while Instant::now() < end {
        let s = side.status();
        assert!(
            s.state == state && s.restarts == restarts,
            "expected to stay {state}/{restarts}: {s:?}"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn an_event_for_a_retired_or_spare_object_is_counted_not_a_restart() {
    let (_sim, switch, a, b) = pair(Policy::default());
    a.sup().restart();
    a.wait_state("running", 1);
    // A QP_FATAL (1) and a CQ_ERR (0) for objects that are not the live ones.
    switch.inject_async(AsyncEvent::NotLive(1));
    switch.inject_async(AsyncEvent::NotLive(0));
    let deadline = Instant::now() + Duration::from_secs(5);
    while stats::get(&a.stats.async_not_live) < 2 {
        assert!(Instant::now() < deadline, "the events were not counted");
        std::thread::sleep(Duration::from_millis(10));
    }
    stays(&a, "running", 1, Duration::from_millis(200));
    flows(&a, A_IP, &b, B_IP, 1);
    // The live QP's own fatal event still restarts.
    switch.inject_async(AsyncEvent::QpFatal);
    let s = a.wait_state("running", 2);
    assert_eq!(s.history.last().unwrap().cause, "async-fatal");
    a.end();
    b.end();
}

#[test]
fn a_gid_change_restarts_only_when_our_gid_changed() {
    let (sim, switch, a, b) = pair(Policy::default());
    let before = a.status();
    // Another GID of the table changed (ours did not): nothing happens.
    switch.inject_async(AsyncEvent::GidChange);
    stays(&a, "running", 0, Duration::from_millis(300));
    assert_eq!(a.status().qpn, before.qpn);
    // Ours changed: a restart, on a reopened device with the new GID.
    let opens = switch.opens();
    sim.reconfigure_device("sim0", std::net::Ipv4Addr::new(198, 18, 0, 9), 4096)
        .unwrap();
    switch.inject_async(AsyncEvent::GidChange);
    let s = a.wait_state("running", 1);
    let r = s.history.last().unwrap();
    assert_eq!(r.cause, "gid-changed", "{r:?}");
    assert!(r.detail.contains("::ffff:198.18.0.9"), "{r:?}");
    assert!(!r.kept_device && r.ledger_balanced, "{r:?}");
    assert_eq!(switch.opens(), opens + 1);
    assert_eq!(s.gid, "::ffff:198.18.0.9");
    a.end();
    b.end();
}

#[test]
fn a_restart_that_keeps_the_device_leaves_the_carrier_on_and_carries_what_waited() {
    let (_sim, switch, a, b) = pair(Policy::default());
    switch.arm_poll_error_n(-5, 1);
    poke(&a, &b);
    let s = a.wait_state("running", 1);
    let r = s.history.last().unwrap();
    assert!(r.cause == "poll-failed" && r.kept_device, "{r:?}");
    assert_eq!(
        a.tap.carrier_offs.load(Ordering::SeqCst),
        0,
        "the carrier went off for a restart that kept the device"
    );
    assert!(a.tap.carrier.load(Ordering::SeqCst));
    flows(&a, A_IP, &b, B_IP, 1);
    flows(&b, B_IP, &a, A_IP, 2);
    // A device loss reopens from scratch: the carrier goes off meanwhile.
    switch.inject_async(AsyncEvent::DeviceRemoved);
    a.wait_state("running", 2);
    assert!(a.tap.carrier_offs.load(Ordering::SeqCst) >= 1);
    assert!(a.tap.carrier.load(Ordering::SeqCst));
    a.end();
    b.end();
}

#[test]
fn a_panicking_poller_is_a_restart_from_scratch_with_the_ledger_lost() {
    let (_sim, switch, a, b) = pair(Policy::default());
    let (opens, endpoint_restarts) = (switch.opens(), switch.endpoint_restarts());
    switch.panic_next_poll();
    poke(&a, &b);
    let s = a.wait_state("running", 1);
    let r = s.history.last().unwrap();
    assert_eq!(r.cause, "poller-panicked", "{r:?}");
    assert!(r.detail.contains("injected panic"), "{r:?}");
    // The interface went with the panic: nothing to reap, nothing to vouch for.
    assert!(
        r.ledger_lost && !r.ledger_balanced && !r.kept_device,
        "{r:?}"
    );
    assert_eq!(
        (
            switch.opens() - opens,
            switch.endpoint_restarts() - endpoint_restarts
        ),
        (1, 0),
        "opened from scratch"
    );
    assert!(a.tap.carrier.load(Ordering::SeqCst));
    // Its neighbour table went too: A learns B again from ARP (a kernel behind the TAP
    // answers the re-resolution; here the test does).
    introduce(&a, &b);
    flows(&a, A_IP, &b, B_IP, 1);
    flows(&b, B_IP, &a, A_IP, 2);
    a.end();
    b.end();
}

#[test]
fn a_shutdown_ends_within_its_bound_when_the_poller_hangs() {
    let (_sim, switch, mut a, b) = pair(Policy::default());
    switch.hang_polls(true);
    poke(&a, &b);
    // Let the poller get stuck in its poll.
    std::thread::sleep(Duration::from_millis(100));
    let sup = a.sup.take().unwrap();
    let start = Instant::now();
    sup.begin_close();
    let ended = sup.finish_close(start + Duration::from_millis(300));
    let took = start.elapsed();
    assert!(ended.is_none(), "a hung poller cannot have stopped");
    assert!(took < Duration::from_secs(2), "took {took:?}");
    // Its threads are left behind; let them go.
    switch.hang_polls(false);
    b.end();
}

#[test]
fn a_failed_poller_start_is_a_failed_attempt_not_a_shutdown() {
    let (_sim, switch, a, b) = pair(Policy {
        backoff_initial: Duration::from_millis(5),
        backoff_max: Duration::from_millis(20),
        ..Policy::default()
    });
    switch.fail_registers(2);
    a.sup().restart();
    let s = a.wait_state("running", 1);
    let r = s.history.last().unwrap();
    assert_eq!(r.cause, "operator", "{r:?}");
    assert_eq!(r.failed_attempts, 2, "{r:?}");
    assert!(r.ledger_balanced, "{r:?}");
    assert!(a.tap.carrier.load(Ordering::SeqCst));
    flows(&a, A_IP, &b, B_IP, 1);
    flows(&b, B_IP, &a, A_IP, 2);
    a.end();
    b.end();
}

#[test]
fn a_device_that_keeps_failing_without_going_away_stays_dead() {
    let (_sim, switch, a, b) = pair(Policy {
        max_restarts: 2,
        window: Duration::from_secs(60),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(20),
    });
    for i in 1..=2 {
        switch.inject_async(AsyncEvent::DeviceFatal);
        a.wait_state("running", i);
    }
    switch.inject_async(AsyncEvent::DeviceFatal);
    a.wait_state("dead", 2);
    // The device is still there and opens: it is not "back", the breaker holds.
    stays(&a, "dead", 2, Duration::from_millis(400));
    assert!(!a.tap.carrier.load(Ordering::SeqCst));
    // Gone and back: revived.
    switch.hide_device(true);
    std::thread::sleep(Duration::from_millis(100));
    switch.hide_device(false);
    let s = a.wait_state("running", 3);
    assert_eq!(s.history.last().unwrap().cause, "revived");
    flows(&a, A_IP, &b, B_IP, 1);
    a.end();
    b.end();
}

#[test]
fn replaced_qps_are_destroyed_after_their_grace_and_never_on_the_poller_thread() {
    let grace = Duration::from_millis(150);
    let (sim, _switch, a, b) = pair_with_grace(Policy::default(), grace);
    let mut replaced = Vec::new();
    for i in 1..=3 {
        replaced.push(a.status().qpn);
        a.sup().restart();
        a.wait_state("running", i);
        // Let the poller run its housekeeping (once a second) in between.
        std::thread::sleep(Duration::from_millis(1100));
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    while sim.destroyed().len() < replaced.len() {
        assert!(Instant::now() < deadline, "{:?}", sim.destroyed());
        std::thread::sleep(Duration::from_millis(10));
    }
    let destroyed = sim.destroyed();
    assert_eq!(
        destroyed.iter().map(|d| d.qpn).collect::<Vec<_>>(),
        replaced
    );
    for d in &destroyed {
        assert_eq!(d.thread.as_deref(), Some("reap-sim0"), "{d:?}");
        assert!(d.after >= grace, "{d:?}");
    }
    a.end();
    b.end();
}

#[test]
fn a_shutdown_waits_out_the_replaced_qps_grace() {
    let grace = Duration::from_millis(600);
    let (sim, _switch, a, b) = pair_with_grace(Policy::default(), grace);
    let replaced = a.status().qpn;
    a.sup().restart();
    a.wait_state("running", 1);
    let start = Instant::now();
    a.end();
    let d = sim.destroyed();
    assert_eq!(d.len(), 1, "{d:?}");
    assert_eq!(d[0].qpn, replaced);
    assert!(d[0].after >= grace, "destroyed before its grace: {d:?}");
    assert!(start.elapsed() < Duration::from_secs(5));
    b.end();
}

#[test]
fn every_cause_recovers_with_traffic_and_a_balanced_ledger() {
    let (sim, switch, a, b) = pair(Policy {
        max_restarts: 100,
        ..Policy::default()
    });
    let causes: [(&str, &str); 8] = [
        ("poll", "poll-failed"),
        ("fatal", "device-fatal"),
        ("cq", "async-fatal"),
        ("qp", "async-fatal"),
        ("removed", "device-removed"),
        ("stall", "tx-stall"),
        ("operator", "operator"),
        ("poll-again", "poll-failed"),
    ];
    for (n, (how, kind)) in causes.iter().enumerate() {
        let before = a.status();
        let (opens, endpoint_restarts) = (switch.opens(), switch.endpoint_restarts());
        match *how {
            "poll" | "poll-again" => {
                switch.arm_poll_error_n(-5, 1);
                // Traffic makes the poller poll; it fails once and hands over.
                b.tap
                    .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[9; 20]));
            }
            "fatal" => switch.inject_async(AsyncEvent::DeviceFatal),
            "cq" => switch.inject_async(AsyncEvent::CqError),
            "qp" => switch.inject_async(AsyncEvent::QpFatal),
            "removed" => {
                switch.hide_device(true);
                switch.inject_async(AsyncEvent::DeviceRemoved);
                a.wait_state("waiting-for-device", before.restarts);
                assert!(
                    !a.tap.carrier.load(Ordering::SeqCst),
                    "carrier off while the device is gone"
                );
                std::thread::sleep(Duration::from_millis(300));
                switch.hide_device(false);
            }
            "stall" => {
                // A's sends never complete: the watchdog must fire.
                assert!(sim.hold_sends(before.qpn, true));
                a.tap
                    .inject(&ipv4_frame(b.mac, a.mac, A_IP, B_IP, &[7; 20]));
            }
            "operator" => a.sup().restart(),
            _ => unreachable!(),
        }
        let s = a.wait_state("running", before.restarts + 1);
        let r = s.history.last().expect("a restart record");
        assert_eq!(r.cause, *kind, "{how}: {r:?}");
        assert!(r.ledger_balanced, "{how}: {r:?}");
        // The supervisor starts the next poller's thread while an epoch runs.
        assert!(r.poller_thread_ahead, "{how}: {r:?}");
        // The supervisor's share of it, as the scheduler counted it: parts of the span
        // (the device-removed wait slept 300 ms of it).
        let t = r.supervisor.as_ref().expect("a kernel with schedstat");
        assert!(
            t.on_cpu_ms > 0.0 && t.on_cpu_ms + t.runqueue_ms <= t.span_ms + 1.0,
            "{how}: {t:?}"
        );
        assert!(t.span_ms <= r.recovery_ms + 1.0, "{how}: {t:?} in {r:?}");
        if *how == "removed" {
            assert!(t.slept_ms >= 250.0, "{how}: {t:?}");
        }
        assert_ne!(s.qpn, before.qpn, "{how}: a new QP");
        assert_eq!(s.epoch, before.epoch + 1, "{how}");
        assert!(
            a.tap.carrier.load(Ordering::SeqCst),
            "{how}: carrier back on"
        );
        // A lost device is reopened from scratch (context, PD, memory); anything else
        // keeps the endpoint and replaces only its QP and CQs.
        let lost = matches!(*kind, "device-fatal" | "device-removed");
        assert_eq!(r.kept_device, !lost, "{how}: {r:?}");
        assert_eq!(
            (
                switch.opens() - opens,
                switch.endpoint_restarts() - endpoint_restarts
            ),
            if lost { (1, 0) } else { (0, 1) },
            "{how}: opens / renewals"
        );
        let snap = a.stats.snapshot();
        assert!(snap.ledger_balanced(), "{how}: {}", snap.to_text());
        flows(&a, A_IP, &b, B_IP, 100 + n as u32);
        flows(&b, B_IP, &a, A_IP, 200 + n as u32);
        if *how == "stall" {
            assert!(
                r.sends_reaped + r.flushed > 0,
                "the held send was flushed or reaped: {r:?}"
            );
        }
    }
    assert_eq!(
        stats::get(&a.stats.completions_rejected),
        0,
        "nothing from a stale epoch"
    );
    assert_eq!(stats::get(&a.stats.restarts), causes.len() as u64);
    // One open at start and one per device loss; endpoint_restarts for the six others.
    assert_eq!(switch.opens(), 3);
    assert_eq!(switch.endpoint_restarts(), 6);
    assert_eq!(sim.opens(), 1 + 3, "B opened once, A three times");
    assert!(
        stats::get(&b.stats.neigh_updated) >= causes.len() as u64,
        "B followed every new QPN"
    );
    a.end();
    b.end();
    assert_eq!(sim.live_qps(), 0);
}

#[test]
fn a_peer_restart_is_followed_without_operator_action() {
    let (_sim, _switch, a, b) = pair(Policy::default());
    let qpn_before = a.status().qpn;
    a.sup().restart();
    let s = a.wait_state("running", 1);
    assert_ne!(s.qpn, qpn_before);
    // B learns the new QPN from A's gratuitous ARP: traffic from B reaches A.
    flows(&b, B_IP, &a, A_IP, 1);
    assert!(stats::get(&b.stats.neigh_updated) >= 1);
    a.end();
    b.end();
}

#[test]
fn a_restarted_interface_announces_itself_once() {
    let (_sim, _switch, a, b) = pair(Policy::default());
    flows(&b, B_IP, &a, A_IP, 1);
    let (arp0, restarts0) = (stats::get(&a.stats.arp_tx), a.status().restarts);
    a.sup().restart();
    a.wait_state("running", restarts0 + 1);
    flows(&b, B_IP, &a, A_IP, 2);
    // The supervisor announces the new QPN as soon as the receive ring is posted; the new
    // poller does not announce the same epoch again.
    assert_eq!(
        stats::get(&a.stats.arp_tx) - arp0,
        1,
        "one gratuitous ARP per epoch"
    );
    a.end();
    b.end();
}

#[test]
fn the_restart_rehearsed_at_start_takes_a_failed_polls_path_and_is_not_counted() {
    // One restart allowed: a rehearsal charged to the breaker would make the first real
    // restart its second.
    let policy = Policy {
        max_restarts: 1,
        window: Duration::from_secs(60),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
    };
    let (sim, switch, a, b) = sup::pair_rehearsing(policy);
    let s = a.wait_state("running", 0);
    let r = s.rehearsal.clone().expect("running only once rehearsed");
    assert_eq!(r.cause, "rehearsal");
    // The failed poll's path: the endpoint kept, the given-up QP's whole receive ring
    // (64) and whatever of the first announcement had not completed reaped after the
    // next epoch ran, on the supervisor's thread, the ledger balanced.
    assert!(
        r.kept_device && r.deferred_reap && r.ledger_balanced,
        "{r:?}"
    );
    assert_eq!(r.wr_reaped - r.sends_reaped, 64, "{r:?}");
    assert_eq!((s.restarts, s.history.len(), s.epoch), (0, 0, 2), "{s:?}");
    assert_eq!(stats::get(&a.stats.restarts), 0);
    let gone = sim.destroyed();
    assert_eq!(gone.len(), 1, "{gone:?}");
    assert_eq!(gone[0].thread.as_deref(), Some("sup-sim0"));
    assert_ne!(gone[0].qpn, s.qpn);
    // A real failed poll is the first restart: counted, in the history, at once (no
    // backoff left by the rehearsal's attempt), and not the breaker's second.
    switch.arm_poll_error_n(-5, 1);
    poke(&a, &b);
    let s = a.wait_state("running", 1);
    let r = s.history.last().unwrap();
    assert!(
        r.cause == "poll-failed" && r.epoch == 3 && r.failed_attempts == 0,
        "{r:?}"
    );
    assert_eq!(s.history.len(), 1);
    flows(&a, A_IP, &b, B_IP, 2);
    flows(&b, B_IP, &a, A_IP, 3);
    a.end();
    b.end();
}

#[test]
fn circuit_breaker_declares_dead_and_operator_revives() {
    let (_sim, _switch, a, b) = pair(Policy {
        max_restarts: 3,
        window: Duration::from_secs(60),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
    });
    for i in 1..=3 {
        a.sup().restart();
        a.wait_state("running", i);
    }
    a.sup().restart();
    let s = a.wait_state("dead", 3);
    assert!(
        s.dead_reason
            .as_deref()
            .unwrap_or("")
            .contains("restarts within"),
        "{s:?}"
    );
    assert!(
        !a.tap.carrier.load(Ordering::SeqCst),
        "carrier off while dead"
    );
    // It stays dead.
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(a.status().state, "dead");
    // An operator restart revives it.
    a.sup().restart();
    let s = a.wait_state("running", 4);
    let revived = s.history.last().unwrap();
    assert_eq!(revived.cause, "revived");
    assert!(
        revived.ledger_balanced && revived.wr_reaped == 0,
        "nothing left to reap when reviving: {revived:?}"
    );
    flows(&b, B_IP, &a, A_IP, 5);
    flows(&a, A_IP, &b, B_IP, 6);
    a.end();
    b.end();
}

#[test]
fn a_device_back_with_another_gid_and_mtu_reconfigures_the_tap() {
    let (sim, switch, a, b) = pair(Policy::default());
    let before = a.status();
    switch.hide_device(true);
    switch.inject_async(AsyncEvent::DeviceRemoved);
    a.wait_state("waiting-for-device", 0);
    sim.reconfigure_device("sim0", std::net::Ipv4Addr::new(198, 18, 0, 9), 2048)
        .unwrap();
    switch.hide_device(false);
    let s = a.wait_state("running", 1);
    assert_eq!(s.gid, "::ffff:198.18.0.9");
    assert_eq!(s.mtu, 2044, "port MTU 2048 minus the IPoIB header");
    assert_ne!(s.gid, before.gid);
    let (mac, mtu) = a
        .tap
        .reconfigured
        .lock()
        .unwrap()
        .expect("TAP reconfigured");
    assert_eq!(mac.to_string(), "02:00:c6:12:00:09");
    assert_eq!(mtu, 2044);
    a.end();
    b.end();
}

#[test]
fn a_port_changed_under_a_kept_endpoint_is_reopened_not_renewed() {
    // No device loss is reported, but the port's MTU and GID changed (a flap, a netdev
    // re-addressed): the renewal refuses, the supervisor opens the device again, and the
    // TAP follows, as after a removal.
    let (sim, switch, a, b) = pair(Policy::default());
    let (opens, endpoint_restarts) = (switch.opens(), switch.endpoint_restarts());
    sim.reconfigure_device("sim0", std::net::Ipv4Addr::new(198, 18, 0, 9), 2048)
        .unwrap();
    switch.arm_poll_error_n(-5, 1);
    // A's own send makes it poll (B cannot reach A's old GID any more).
    a.tap
        .inject(&ipv4_frame(b.mac, a.mac, A_IP, B_IP, &[9; 20]));
    let s = a.wait_state("running", 1);
    let r = s.history.last().expect("a restart record");
    assert_eq!(r.cause, "poll-failed");
    assert!(!r.kept_device, "{r:?}");
    assert!(r.ledger_balanced, "{r:?}");
    assert_eq!(
        (
            switch.opens() - opens,
            switch.endpoint_restarts() - endpoint_restarts
        ),
        (1, 0)
    );
    assert_eq!(s.gid, "::ffff:198.18.0.9");
    assert_eq!(s.mtu, 2044);
    assert!(
        a.tap.reconfigured.lock().unwrap().is_some(),
        "TAP reconfigured"
    );
    a.end();
    b.end();
}

/// `restart-nice`: the supervisor's thread runs at its own nice level, the threads it
/// starts (every epoch's poller, the reaper of replaced QPs) at the daemon's.
#[test]
fn the_supervisor_runs_at_its_nice_level_and_the_threads_it_starts_at_the_daemons() {
    let base = uipoib::sys::process::thread_nice().unwrap();
    // The supervisor at a level above this thread's (allowed without privilege); the
    // threads it starts then go back down to `base`, which needs CAP_SYS_NICE or a
    // RLIMIT_NICE that allows it (scripts/test runs as root). Said here if not.
    let level = base + 3;
    assert!(
        level <= 19,
        "this test needs a nice level below 17, has {base}"
    );
    let back = std::thread::spawn(move || {
        uipoib::sys::process::set_thread_nice(base + 1)?;
        uipoib::sys::process::set_thread_nice(base)
    })
    .join()
    .unwrap();
    if let Err(e) = back {
        panic!(
            "this test cannot run here: going back from nice {} to {base} is refused ({e}); \
             it needs CAP_SYS_NICE or a RLIMIT_NICE that allows it",
            base + 1
        );
    }
    let sim = std::sync::Arc::new(common::fabric(4096));
    sim.add_device("nice0", std::net::Ipv4Addr::new(198, 18, 0, 3), 4096)
        .unwrap();
    // Replaced QPs wait out a grace: the reaper thread starts at the first restart.
    sim.set_retire_grace(Duration::from_millis(20));
    let opts = sup::SupOpts {
        restart_nice: Some(level),
        ..sup::SupOpts::default()
    };
    let policy = sup::quick_policy();
    let restart = uipoib::iface::PollFailurePolicy::Restart;
    let a = sup::side_full(sim, "nice0", "198.18.2.1/24", policy, restart, opts);
    a.wait_state("running", 0);
    assert_eq!(nice_levels("sup-nice0"), vec![level]);
    // The poller, and the thread started ahead for the next one once the supervisor has
    // got to it.
    let polls = nice_levels_at("poll-nice0", base);
    assert!(
        (1..=2).contains(&polls.len()) && polls.iter().all(|&p| p == base),
        "pollers at {polls:?}, the daemon at {base}"
    );
    for n in 1..=3 {
        a.sup().restart();
        a.wait_state("running", n);
        let polls = nice_levels_at("poll-nice0", base);
        assert!(
            !polls.is_empty() && polls.iter().all(|&p| p == base),
            "restart {n}: pollers at {polls:?}, the daemon at {base}"
        );
        assert_eq!(
            nice_levels_at("reap-nice0", base),
            vec![base],
            "restart {n}"
        );
        assert_eq!(nice_levels("sup-nice0"), vec![level], "restart {n}");
    }
    a.end();
    // The thread started ahead ends with the supervisor: none is left behind (a joined
    // thread leaves /proc/self/task just after its join returns: given a moment).
    let deadline = std::time::Instant::now() + Duration::from_secs(2);
    while !nice_levels("poll-nice0").is_empty() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(nice_levels("poll-nice0"), Vec::<i32>::new());
}
