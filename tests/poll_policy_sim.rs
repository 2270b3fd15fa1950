//! The poll-failure policies on the simulated fabric: the same failed receive-CQ poll
//! under each, side A (the faulty one) supervised, traffic both ways. What each policy
//! does is asserted from the counters, the ledger and the traffic, as the lab's
//! comparison measures it over rxe:
//! - `restart`: one restart, nothing left outstanding for ever, traffic back;
//! - `skip`: no restart, and the receive CQ is never polled again (it was not re-armed):
//!   nothing reaches A, every posted receive is stranded;
//! - `retry`: no restart; a transient failure costs nothing, completions the failing
//!   poll swallowed leave their receive buffers out for ever (the ledger sees exactly
//!   those), and a failure that lasts keeps the poller spinning until it stops;
//! - `recreate-cq`: the QP's CQ cannot be destroyed while the QP uses it, so the new CQ
//!   receives nothing: wedged until an operator restart, which reaps everything.
//!
//! Every run ends with both ledgers balanced (the teardown reaps what never completed).

mod common;

use std::time::{Duration, Instant};

use common::ipv4_frame;
use common::sup::{A_IP, B_IP, Side, flows, pair_policy};
use uipoib::iface::PollFailurePolicy;
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats::{self, Snapshot};
use uipoib::verbs::fault::{CqSel, Fault, FaultKind, FaultSpec, Trigger};

/// Restart policy for these tests: no breaker trips, short backoff.
fn policy() -> Policy {
    common::sup::quick_policy()
}

/// A failed poll of A's receive CQ.
fn recv_poll_error(lose: u32) -> Fault {
    Fault::PollError {
        ret: -5,
        lose,
        cq: CqSel::Recv,
    }
}

/// Send one frame from `from` to `to` and say whether it arrived within `within`.
fn delivered(
    from: &Side,
    from_ip: std::net::Ipv4Addr,
    to: &Side,
    to_ip: std::net::Ipv4Addr,
    tag: u32,
    within: Duration,
) -> bool {
    let body = tag.to_be_bytes().repeat(50);
    from.tap
        .inject(&ipv4_frame(to.mac, from.mac, from_ip, to_ip, &body));
    let until = Instant::now() + within;
    while Instant::now() < until {
        if let Some(f) = to.tap.recv()
            && f.len() == 34 + body.len()
            && f[34..] == body[..]
        {
            return true;
        }
    }
    false
}

fn wait_for(what: &str, within: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// End both sides: the ledgers balance (what never completed is reaped at the close).
fn finish(a: Side, b: Side) -> Snapshot {
    let sa = a.stats.clone();
    a.end();
    b.end();
    let s = sa.snapshot();
    assert!(s.ledger_balanced(), "A's ledger\n{}", s.to_text());
    assert_eq!((s.recv_outstanding, s.send_outstanding), (0, 0));
    s
}

#[test]
fn restart_recovers_and_reaps_what_the_failing_poll_swallowed() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::Restart);
    switch.arm(FaultSpec::new(recv_poll_error(4)));
    // A burst towards A: several completions wait in the CQ when the poll fails.
    for i in 0..8u8 {
        b.tap
            .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[i; 40]));
    }
    let s = a.wait_state("running", 1);
    assert_eq!(s.history[0].cause, "poll-failed");
    assert!(s.history[0].ledger_balanced);
    flows(&a, A_IP, &b, B_IP, 10);
    flows(&b, B_IP, &a, A_IP, 11);
    assert_eq!(stats::get(&a.stats.poll_failures), 1);
    // A new epoch: nothing of the old one is waiting for a completion.
    wait_for("a housekeeping round", Duration::from_secs(3), || {
        stats::get(&a.stats.recv_never_complete) == 0
    });
    assert_eq!(stats::get(&a.stats.send_never_complete), 0);
    let s = finish(a, b);
    assert!(
        s.recv_reaped >= 1,
        "the old ring was reaped\n{}",
        s.to_text()
    );
}

#[test]
fn skip_leaves_the_receive_cq_unarmed_and_the_interface_deaf() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::Skip);
    // Let the poller go idle (both CQs armed): the next receive raises an event, and the
    // poll it schedules is the one that fails. (A poll that fails right after the CQs
    // were armed leaves the CQ armed: its next completion's event brings it back. That
    // is `skip` too, and the lab's comparison shows which one happened.)
    std::thread::sleep(Duration::from_millis(300));
    switch.arm(FaultSpec::new(recv_poll_error(0)));
    b.tap
        .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[7; 40]));
    wait_for("the failed poll", Duration::from_secs(5), || {
        switch.fired(FaultKind::PollError) == 1
    });
    // Nothing reaches A any more, and nothing restarts; A still sends.
    for tag in 20..23 {
        assert!(
            !delivered(&b, B_IP, &a, A_IP, tag, Duration::from_millis(300)),
            "a frame reached A through a CQ skip left"
        );
    }
    assert!(delivered(&a, A_IP, &b, B_IP, 30, Duration::from_secs(2)));
    let s = a.status();
    assert_eq!((s.state.as_str(), s.restarts), ("running", 0));
    assert_eq!(stats::get(&a.stats.poll_failures_skipped), 1);
    assert_eq!(switch.polls_failed(), 1);
    // Every posted receive is stranded: its completion lands in a CQ no one polls.
    wait_for("the stranded receives", Duration::from_secs(3), || {
        let n = stats::get(&a.stats.recv_never_complete);
        n > 0 && n == stats::get(&a.stats.recv_outstanding)
    });
    let s = finish(a, b);
    assert!(
        s.recv_reaped >= 64,
        "the close reaped the ring\n{}",
        s.to_text()
    );
}

#[test]
fn retry_carries_on_and_leaks_exactly_what_the_failing_poll_swallowed() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::Retry);
    // A burst towards A: the failing poll may find several completions to swallow.
    switch.arm(FaultSpec::new(recv_poll_error(3)));
    for i in 0..8u8 {
        b.tap
            .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[i; 40]));
    }
    wait_for("the failed poll", Duration::from_secs(5), || {
        switch.fired(FaultKind::PollError) == 1
    });
    // Traffic goes on without a restart.
    flows(&b, B_IP, &a, A_IP, 40);
    flows(&a, A_IP, &b, B_IP, 41);
    for tag in 42..60 {
        flows(&b, B_IP, &a, A_IP, tag);
    }
    let s = a.status();
    assert_eq!((s.state.as_str(), s.restarts), ("running", 0));
    assert!(stats::get(&a.stats.poll_retries) >= 1);
    let lost = switch.completions_swallowed();
    assert!((1..=3).contains(&lost), "swallowed {lost}");
    // The ledger, on its own, finds exactly the receives whose completions were taken:
    // later ones completed, those never will.
    wait_for("the leaked receives", Duration::from_secs(3), || {
        stats::get(&a.stats.recv_never_complete) == lost
    });
    assert_eq!(stats::get(&a.stats.send_never_complete), 0);
    let s = finish(a, b);
    assert!(s.recv_reaped >= lost);
}

#[test]
fn retry_spins_while_every_poll_fails_and_resumes_after() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::Retry);
    let t = Instant::now();
    switch.arm(
        FaultSpec {
            window: Some(Duration::from_millis(400)),
            ..FaultSpec::new(recv_poll_error(0)).trigger(Trigger::Every(1))
        }
        .unlimited(),
    );
    b.tap
        .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[1; 40]));
    // Every receive poll fails for 400 ms: the poller polls again and again.
    wait_for("the window to pass", Duration::from_secs(5), || {
        switch.armed().is_empty() && t.elapsed() > Duration::from_millis(400)
    });
    let spins = stats::get(&a.stats.poll_retries);
    assert!(
        spins > 50,
        "only {spins} retries in 400 ms of failing polls"
    );
    assert_eq!(
        switch.polls_failed(),
        spins,
        "every failure was retried, none restarted"
    );
    flows(&b, B_IP, &a, A_IP, 50);
    flows(&a, A_IP, &b, B_IP, 51);
    assert_eq!(a.status().restarts, 0);
    finish(a, b);
}

#[test]
fn recreate_cq_keeps_the_qp_on_a_cq_nothing_polls_until_a_restart() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::RecreateCq);
    switch.arm(FaultSpec::new(recv_poll_error(0)));
    b.tap
        .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[9; 40]));
    wait_for("the re-created CQ", Duration::from_secs(5), || {
        stats::get(&a.stats.cq_recreated) == 1
    });
    // The old CQ could not be destroyed (the QP uses it) and still gets the QP's
    // completions; the new one gets none.
    assert_eq!(stats::get(&a.stats.cq_kept_in_use), 1);
    for tag in 60..63 {
        assert!(!delivered(
            &b,
            B_IP,
            &a,
            A_IP,
            tag,
            Duration::from_millis(300)
        ));
    }
    assert_eq!(a.status().restarts, 0);
    wait_for("the stranded receives", Duration::from_secs(3), || {
        let n = stats::get(&a.stats.recv_never_complete);
        n > 0 && n == stats::get(&a.stats.recv_outstanding)
    });
    // Only a restart (new QP on new CQs) brings A back; it reaps the stranded ring.
    a.sup().restart();
    let s = a.wait_state("running", 1);
    assert_eq!(s.history[0].cause, "operator");
    assert!(s.history[0].ledger_balanced);
    flows(&b, B_IP, &a, A_IP, 70);
    flows(&a, A_IP, &b, B_IP, 71);
    wait_for("nothing stranded", Duration::from_secs(3), || {
        stats::get(&a.stats.recv_never_complete) == 0
    });
    finish(a, b);
}

#[test]
fn a_fault_until_restart_ends_with_the_endpoint_it_hit() {
    let (_sim, switch, a, b) = pair_policy(policy(), PollFailurePolicy::Restart);
    switch.arm(
        FaultSpec {
            until_restart: true,
            ..FaultSpec::new(recv_poll_error(0)).trigger(Trigger::Every(1))
        }
        .unlimited(),
    );
    b.tap
        .inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &[3; 40]));
    let s = a.wait_state("running", 1);
    assert_eq!(s.history[0].cause, "poll-failed");
    // The new endpoint's polls succeed: one restart, and the fault is spent.
    flows(&b, B_IP, &a, A_IP, 80);
    flows(&a, A_IP, &b, B_IP, 81);
    assert_eq!(a.status().restarts, 1);
    assert!(switch.armed().is_empty(), "{:?}", switch.armed());
    assert_eq!(switch.polls_failed(), 1);
    finish(a, b);
}
