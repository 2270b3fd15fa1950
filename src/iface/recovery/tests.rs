//! The restart machine on a virtual clock: a fixed base `Instant` and offsets, no
//! sleeping; every test asserts the exact actions and the times they name.

use std::time::{Duration, Instant};

use super::*;
use crate::verbs::{AsyncEvent, CqKind, VerbsError};

fn policy() -> Policy {
    Policy {
        max_restarts: 3,
        window: Duration::from_secs(10),
        backoff_initial: Duration::from_millis(10),
        backoff_max: Duration::from_millis(50),
    }
}

/// The virtual clock: `t(ms)` is the base plus `ms` milliseconds.
struct Clock(Instant);

impl Clock {
    fn t(&self, ms: u64) -> Instant {
        self.0 + Duration::from_millis(ms)
    }
}

fn clock() -> Clock {
    Clock(Instant::now())
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

fn torn(kept: bool) -> Closed {
    Closed {
        kept,
        ..Closed::default()
    }
}

fn opened(on_kept: bool) -> Event {
    Event::Opened {
        on_kept,
        times: OpenTimes::default(),
    }
}

/// The poller started, handed the interface at `handed` (the restart's end).
fn started(handed: Instant) -> Event {
    Event::PollerStarted {
        announce: Duration::ZERO,
        announced: Instant::now(),
        spawn: Duration::ZERO,
        carrier: Duration::ZERO,
        thread_ahead: false,
        handed,
    }
}

fn failed(cause: Failure, untrusted: bool, detected: Instant) -> Event {
    Event::Failed {
        cause,
        untrusted,
        detected,
    }
}

fn poll_failed() -> Failure {
    Failure::PollFailed(VerbsError::PollFailed {
        cq: CqKind::Recv,
        ret: -5,
    })
}

fn reopen(epoch: u16, on_kept: bool) -> Action {
    Action::Open { epoch, on_kept }
}

fn attempt_failed(attempts: u32, what: Attempt, log: bool) -> Action {
    Action::AttemptFailed {
        attempts,
        what,
        log,
    }
}

fn close_act(drain: bool, keep: bool) -> Action {
    Action::Close { drain, keep }
}

/// What a failure handed over asks for: restarting and the close, the carrier off first
/// only when the endpoint is not kept (a restart that keeps it leaves the carrier on).
fn handed_over(drain: bool, keep: bool) -> Vec<Action> {
    let mut acts = if keep {
        Vec::new()
    } else {
        vec![Action::CarrierOff]
    };
    acts.extend([Action::Status(State::Restarting), close_act(drain, keep)]);
    acts
}

fn open_failed(on_kept: bool, no_device: bool) -> Event {
    Event::OpenFailed { on_kept, no_device }
}

fn recorded(acts: &[Action]) -> RestartRecord {
    match acts {
        [Action::Recovered(r)] => r.clone(),
        other => panic!("expected one Recovered, got {other:?}"),
    }
}

/// A whole restart that keeps the endpoint and succeeds at once, fed at `at` ms;
/// returns the record.
fn quick_restart(m: &mut Recovery, c: &Clock, at: u64, cause: Failure) -> RestartRecord {
    let epoch = m.epoch();
    let acts = m.handle(failed(cause, false, c.t(at)), c.t(at), 0);
    assert_eq!(acts, handed_over(true, true));
    assert_eq!(
        m.handle(Event::Closed(torn(true)), c.t(at), 0),
        vec![reopen(epoch + 1, true)]
    );
    assert_eq!(
        m.handle(opened(true), c.t(at), 0),
        vec![Action::StartPoller { epoch: epoch + 1 }]
    );
    recorded(&m.handle(started(c.t(at)), c.t(at), 0))
}

#[test]
fn backoff_first_immediate_then_doubles_to_max() {
    let mut b = Backoff::new(&policy());
    let d: Vec<u64> = (0..6).map(|_| b.next_delay().as_millis() as u64).collect();
    assert_eq!(d, vec![0, 10, 20, 40, 50, 50]);
    b.reset();
    assert_eq!(b.next_delay(), Duration::ZERO);
}

#[test]
fn breaker_trips_after_max_in_window_only() {
    let t0 = Instant::now();
    let mut br = Breaker::new(&policy());
    assert!(!br.record(t0));
    assert!(!br.record(t0 + Duration::from_secs(1)));
    assert!(!br.record(t0 + Duration::from_secs(2)));
    assert!(br.record(t0 + Duration::from_secs(3)), "4th within 10 s");
    // Spread out: never trips.
    let mut br = Breaker::new(&policy());
    for i in 0..20 {
        assert!(!br.record(t0 + Duration::from_secs(4 * i)));
    }
    br.reset();
    assert!(!br.record(t0));
}

#[test]
fn a_restart_keeps_the_endpoint_and_records_where_its_time_went() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let stall = Failure::TxStall {
        outstanding: 3,
        since: Duration::from_millis(300),
    };
    // Detected at 5000 ms, handed over at 5002.
    let acts = m.handle(failed(stall, false, c.t(5000)), c.t(5002), 77);
    assert_eq!(acts, handed_over(true, true));
    let t = Closed {
        reaped: 5,
        sends_reaped: 2,
        flushed: 40,
        drain: Duration::from_millis(3),
        destroy: Duration::from_millis(4),
        restart: Duration::from_millis(1),
        ..torn(true)
    };
    assert_eq!(
        m.handle(Event::Closed(t), c.t(5010), 0),
        vec![reopen(2, true)]
    );
    let times = OpenTimes {
        ah: Duration::from_millis(1),
        attach: Duration::from_millis(2),
        fill: Duration::from_millis(1),
        ..OpenTimes::default()
    };
    assert_eq!(
        m.handle(
            Event::Opened {
                on_kept: true,
                times
            },
            c.t(5015),
            0
        ),
        vec![Action::StartPoller { epoch: 2 }]
    );
    assert!(!m.is_running());
    let r = recorded(&m.handle(
        Event::PollerStarted {
            announce: Duration::from_micros(500),
            announced: c.t(5015) + Duration::from_micros(500),
            spawn: Duration::from_millis(1),
            carrier: Duration::from_micros(500),
            thread_ahead: true,
            handed: c.t(5017),
        },
        // Seen by the machine after the hand-over, which ends the restart.
        c.t(5019),
        0,
    ));
    assert!(m.is_running());
    assert_eq!(m.epoch(), 2);
    // The wall clock read 77 ms when the machine handled the failure, 2 ms after its
    // detection: the record has the detection's.
    assert_eq!(
        (r.epoch, r.cause.as_str(), r.detected_unix_ms),
        (2, "tx-stall", 75)
    );
    assert!(
        r.detail.starts_with("send stall: 3 sends outstanding"),
        "{r:?}"
    );
    assert_eq!((r.wr_reaped, r.sends_reaped, r.flushed), (5, 2, 40));
    assert!(r.ledger_balanced && r.kept_device && !r.ledger_lost && r.poller_thread_ahead);
    assert_eq!(r.failed_attempts, 0);
    let p = &r.phases;
    assert!(close(r.recovery_ms, 17.0), "{r:?}");
    assert!(close(p.handoff_ms, 2.0) && close(p.drain_ms, 3.0), "{p:?}");
    assert!(close(p.destroy_ms, 4.0) && close(p.renew_ms, 1.0), "{p:?}");
    // From detection to the open: 10 ms, of which 2 + 3 + 4 are accounted for.
    assert!(close(p.reap_ms, 1.0), "{p:?}");
    assert!(close(p.open_ms, 0.0) && close(p.ah_ms, 1.0), "{p:?}");
    assert!(close(p.attach_ms, 2.0) && close(p.fill_ms, 1.0), "{p:?}");
    assert!(close(p.start_ms, 2.0) && close(p.spawn_ms, 1.0), "{p:?}");
    assert!(close(p.carrier_ms, 0.5), "{p:?}");
    assert!(close(p.announce_ms, 0.5), "{p:?}");
    // Detected at 5000 ms; the start began at 5015 and announced half a millisecond in.
    assert!(close(r.announced_ms, 15.5), "{r:?}");
}

#[test]
fn an_operator_restart_of_a_running_interface_asks_the_poller_to_hand_over() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    assert_eq!(
        m.handle(Event::Operator, c.t(10), 0),
        vec![Action::HandOver]
    );
    // Nothing else is expected of a running interface.
    assert_eq!(m.handle(Event::Tick, c.t(20), 0), vec![]);
    assert_eq!(m.handle(Event::Closed(torn(true)), c.t(20), 0), vec![]);
    let r = quick_restart(&mut m, &c, 30, Failure::Operator);
    assert_eq!(r.cause, "operator");
}

#[test]
fn a_failed_poll_is_never_drained_and_its_qp_destroyed_first() {
    let c = clock();
    for untrusted in [true, false] {
        let mut m = Recovery::new(policy(), 1, c.t(0));
        let acts = m.handle(failed(poll_failed(), untrusted, c.t(100)), c.t(100), 0);
        assert_eq!(acts, handed_over(false, true), "untrusted: {untrusted}");
    }
    // Another cause on an interface that says it may not be polled: no drain either.
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let cause = Failure::Verbs(VerbsError::NoDevice("x".into()));
    let acts = m.handle(failed(cause, true, c.t(100)), c.t(100), 0);
    assert_eq!(acts.last(), Some(&close_act(false, true)));
    // Nor is the failed epoch drained on the way to the next: the machine goes straight
    // from the teardown to the open, and a start failure of the new epoch drains only
    // that epoch.
    assert_eq!(
        m.handle(Event::Closed(torn(true)), c.t(105), 0),
        vec![reopen(2, true)]
    );
}

#[test]
fn a_gid_change_reopens_the_device_on_the_gid_chosen_now() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let cause = Failure::GidChanged {
        was: "::ffff:198.18.0.1 at index 1".into(),
        now: "::ffff:198.18.0.9 at index 0".into(),
    };
    let acts = m.handle(failed(cause, false, c.t(100)), c.t(100), 0);
    assert_eq!(acts, handed_over(true, false));
    assert_eq!(
        m.handle(Event::Closed(torn(false)), c.t(105), 0),
        vec![reopen(2, false)]
    );
}

#[test]
fn failed_opens_back_off_doubling_and_a_healthy_period_resets_the_backoff() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let _ = m.handle(failed(Failure::Operator, false, c.t(100)), c.t(100), 0);
    assert_eq!(
        m.handle(Event::Closed(torn(false)), c.t(100), 0),
        vec![reopen(2, false)]
    );
    let mut now = 100;
    for (n, delay) in [(1u32, 10u64), (2, 20), (3, 40), (4, 50), (5, 50)] {
        let acts = m.handle(open_failed(false, false), c.t(now), 0);
        assert_eq!(
            acts,
            vec![
                Action::Status(State::Restarting),
                Action::AttemptFailed {
                    attempts: n,
                    what: Attempt::Open,
                    log: n == 1
                },
                Action::CarrierOff,
                Action::WaitUntil(c.t(now + delay))
            ],
            "attempt {n}"
        );
        // A tick before the deadline waits on.
        assert_eq!(
            m.handle(Event::Tick, c.t(now + 1), 0),
            vec![Action::WaitUntil(c.t(now + delay))]
        );
        now += delay;
        assert_eq!(m.handle(Event::Tick, c.t(now), 0), vec![reopen(2, false)]);
    }
    assert_eq!(
        m.handle(opened(false), c.t(now), 0),
        vec![Action::StartPoller { epoch: 2 }]
    );
    let r = recorded(&m.handle(started(c.t(now)), c.t(now), 0));
    assert_eq!((r.failed_attempts, r.kept_device), (5, false));
    assert!(close(r.recovery_ms, (now - 100) as f64), "{r:?}");

    // Failing again within HEALTHY_AFTER of that start: the backoff goes on (50 ms).
    let again = now + 500;
    let _ = m.handle(failed(Failure::Operator, false, c.t(again)), c.t(again), 0);
    assert_eq!(
        m.handle(Event::Closed(torn(true)), c.t(again), 0),
        vec![Action::CarrierOff, Action::WaitUntil(c.t(again + 50))]
    );
    // An operator restart cuts the wait short.
    assert_eq!(
        m.handle(Event::Operator, c.t(again + 5), 0),
        vec![reopen(3, true)]
    );
    assert_eq!(
        m.handle(opened(true), c.t(again + 5), 0),
        vec![Action::StartPoller { epoch: 3 }]
    );
    let _ = recorded(&m.handle(started(c.t(again + 5)), c.t(again + 5), 0));

    // After a healthy second, the next failure restarts at once.
    let healthy = again + 5 + HEALTHY_AFTER.as_millis() as u64;
    let r = quick_restart(&mut m, &c, healthy, Failure::Operator);
    assert_eq!((r.epoch, r.failed_attempts), (4, 0));
}

#[test]
fn the_breaker_declares_the_interface_dead_until_an_operator_restart() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    // Three restarts within the window are allowed (each after a healthy second, so
    // none backs off).
    for i in 1..=3u64 {
        quick_restart(&mut m, &c, i * 1100, Failure::Operator);
    }
    let at = 4400;
    let _ = m.handle(failed(poll_failed(), true, c.t(at)), c.t(at), 0);
    let acts = m.handle(Event::Closed(torn(true)), c.t(at + 1), 0);
    let why = format!("4 restarts within 10s (last cause: {})", poll_failed());
    match acts.as_slice() {
        [
            Action::CloseKept,
            Action::CarrierOff,
            Action::Dead { why: w, record },
            Action::WaitForOperator,
        ] => {
            assert_eq!(record.cause, "poll-failed");
            assert_eq!(record.epoch, 5);
            assert!(close(record.recovery_ms, 0.0));
            assert_eq!(*w, why);
        }
        other => panic!("{other:?}"),
    }
    assert!(m.is_dead());
    // Dead, not lost: no probing, ticks change nothing.
    assert_eq!(m.handle(Event::Tick, c.t(at + 1000), 0), vec![]);
    // The operator revives it: breaker and backoff start over, the device is opened
    // from scratch (the kept endpoint was closed).
    assert_eq!(
        m.handle(Event::Operator, c.t(at + 2000), 99),
        vec![Action::Revive(Revival::Operator), reopen(5, false)]
    );
    assert_eq!(
        m.handle(opened(false), c.t(at + 2003), 0),
        vec![Action::StartPoller { epoch: 5 }]
    );
    let r = recorded(&m.handle(started(c.t(at + 2004)), c.t(at + 2004), 0));
    assert_eq!(
        (r.cause.as_str(), r.epoch, r.detected_unix_ms),
        ("revived", 5, 99)
    );
    assert_eq!(
        r.detail,
        "operator restart after the circuit breaker tripped"
    );
    assert!(r.ledger_balanced && !r.kept_device);
    assert!(close(r.recovery_ms, 4.0), "{r:?}");
    assert!(!m.is_dead());
    // The breaker starts over: three more restarts in a row are allowed.
    for i in 1..=3u64 {
        quick_restart(&mut m, &c, at + 2004 + i * 1100, Failure::Operator);
    }
}

#[test]
fn a_lost_device_is_closed_at_once_waited_for_and_reopened() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let removed = Failure::AsyncFatal(AsyncEvent::DeviceRemoved);
    assert_eq!(
        m.handle(failed(removed, false, c.t(2000)), c.t(2000), 0),
        handed_over(false, false)
    );
    assert_eq!(
        m.handle(Event::Closed(torn(false)), c.t(2001), 0),
        vec![reopen(2, false)]
    );
    // Two opens find no device: backed off 10 ms, then 20 ms; only the first is logged.
    for (attempts, at, until, log) in [(1, 2002, 2012, true), (2, 2013, 2033, false)] {
        assert_eq!(
            m.handle(open_failed(false, true), c.t(at), 0),
            vec![
                Action::Status(State::WaitingForDevice),
                attempt_failed(attempts, Attempt::Open, log),
                Action::CarrierOff,
                Action::WaitUntil(c.t(until))
            ]
        );
        assert_eq!(m.handle(Event::Tick, c.t(until), 0), vec![reopen(2, false)]);
    }
    // The device is back.
    assert_eq!(
        m.handle(opened(false), c.t(2040), 0),
        vec![Action::StartPoller { epoch: 2 }]
    );
    let r = recorded(&m.handle(started(c.t(2041)), c.t(2041), 0));
    assert_eq!(r.cause, "device-removed");
    assert_eq!((r.failed_attempts, r.kept_device), (2, false));
    assert!(close(r.recovery_ms, 41.0), "{r:?}");
    assert!(close(r.phases.reap_ms, 33.0), "{r:?}");
}

#[test]
fn a_device_fatal_loop_is_held_by_the_breaker_until_the_device_went_and_came_back() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let fatal = || Failure::AsyncFatal(AsyncEvent::DeviceFatal);
    let mut now = 0;
    for epoch in 2..=4u16 {
        now += 1100;
        let acts = m.handle(failed(fatal(), false, c.t(now)), c.t(now), 0);
        assert_eq!(acts.last(), Some(&close_act(false, false)));
        assert_eq!(
            m.handle(Event::Closed(torn(false)), c.t(now), 0),
            vec![Action::Open {
                epoch,
                on_kept: false
            }]
        );
        let _ = m.handle(opened(false), c.t(now), 0);
        let r = recorded(&m.handle(started(c.t(now)), c.t(now), 0));
        assert_eq!(r.cause, "device-fatal");
    }
    now += 1100;
    let _ = m.handle(failed(fatal(), false, c.t(now)), c.t(now), 0);
    let acts = m.handle(Event::Closed(torn(false)), c.t(now), 0);
    assert!(
        matches!(acts.as_slice(), [Action::CarrierOff, Action::Dead { .. }, Action::WaitUntil(t)] if *t == c.t(now + 50)),
        "{acts:?}"
    );
    // The device is still there: the probe's open succeeds and is closed again.
    assert_eq!(
        m.handle(Event::Tick, c.t(now + 10), 0),
        vec![Action::WaitUntil(c.t(now + 50))]
    );
    now += 50;
    assert_eq!(m.handle(Event::Tick, c.t(now), 0), vec![reopen(5, false)]);
    assert_eq!(
        m.handle(opened(false), c.t(now + 2), 0),
        vec![Action::CloseProbe, Action::WaitUntil(c.t(now + 52))]
    );
    assert!(m.is_dead());
    // A probe failing for another reason than a missing device is not "gone".
    now += 52;
    let _ = m.handle(Event::Tick, c.t(now), 0);
    let other = open_failed(false, false);
    assert_eq!(
        m.handle(other, c.t(now), 0),
        vec![Action::WaitUntil(c.t(now + 50))]
    );
    now += 50;
    let _ = m.handle(Event::Tick, c.t(now), 0);
    assert_eq!(
        m.handle(opened(false), c.t(now), 0),
        vec![Action::CloseProbe, Action::WaitUntil(c.t(now + 50))]
    );
    // Now it goes...
    now += 50;
    let _ = m.handle(Event::Tick, c.t(now), 0);
    let gone = open_failed(false, true);
    assert_eq!(
        m.handle(gone, c.t(now), 0),
        vec![Action::WaitUntil(c.t(now + 50))]
    );
    assert!(m.is_dead());
    // ... and comes back: revived without an operator.
    now += 50;
    let probe_at = now;
    assert_eq!(m.handle(Event::Tick, c.t(now), 5), vec![reopen(5, false)]);
    assert_eq!(
        m.handle(opened(false), c.t(now + 3), 0),
        vec![
            Action::Revive(Revival::DeviceReturned),
            Action::StartPoller { epoch: 5 }
        ]
    );
    let r = recorded(&m.handle(started(c.t(now + 4)), c.t(now + 4), 0));
    assert_eq!((r.cause.as_str(), r.epoch), ("revived", 5));
    assert_eq!(
        r.detail,
        "the device returned after the circuit breaker tripped"
    );
    assert_eq!(r.detected_unix_ms, 5);
    assert!(close(r.recovery_ms, (now + 4 - probe_at) as f64), "{r:?}");
    assert!(m.is_running() && !m.is_dead());
}

#[test]
fn a_poller_that_cannot_start_is_a_failed_attempt() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let _ = m.handle(failed(Failure::Operator, false, c.t(3000)), c.t(3000), 0);
    let t = Closed {
        reaped: 4,
        ..torn(true)
    };
    let _ = m.handle(Event::Closed(t), c.t(3001), 0);
    assert_eq!(
        m.handle(opened(true), c.t(3002), 0),
        vec![Action::StartPoller { epoch: 2 }]
    );
    assert_eq!(
        m.handle(Event::PollerStartFailed, c.t(3003), 0),
        vec![
            Action::Status(State::Restarting),
            attempt_failed(1, Attempt::Start, true),
            close_act(true, true)
        ]
    );
    let t = Closed {
        reaped: 3,
        ledger: Err("x".into()),
        ..torn(true)
    };
    // Backed off: the second attempt waits initial (10 ms).
    assert_eq!(
        m.handle(Event::Closed(t), c.t(3005), 0),
        vec![Action::CarrierOff, Action::WaitUntil(c.t(3015))]
    );
    assert_eq!(m.handle(Event::Tick, c.t(3015), 0), vec![reopen(2, true)]);
    let _ = m.handle(opened(true), c.t(3016), 0);
    let r = recorded(&m.handle(started(c.t(3017)), c.t(3017), 0));
    assert_eq!((r.epoch, r.failed_attempts, r.wr_reaped), (2, 1, 7));
    assert!(
        !r.ledger_balanced,
        "the second teardown did not balance: {r:?}"
    );
    assert!(close(r.recovery_ms, 17.0), "{r:?}");
}

#[test]
fn a_kept_endpoint_that_cannot_be_reopened_makes_the_same_attempt_open_the_device() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let _ = m.handle(failed(Failure::Operator, false, c.t(2000)), c.t(2000), 0);
    let _ = m.handle(Event::Closed(torn(true)), c.t(2000), 0);
    let bad_kept = open_failed(true, false);
    assert_eq!(
        m.handle(bad_kept, c.t(2001), 0),
        vec![Action::CarrierOff, reopen(2, false)],
        "the carrier goes off while the device is reopened from scratch"
    );
    let _ = m.handle(opened(false), c.t(2002), 0);
    let r = recorded(&m.handle(started(c.t(2003)), c.t(2003), 0));
    assert_eq!((r.failed_attempts, r.kept_device), (0, false));
}

#[test]
fn a_poller_panic_loses_the_epoch_and_opens_the_next_from_scratch() {
    let c = clock();
    let mut m = Recovery::new(policy(), 1, c.t(0));
    let panicked = Failure::PollerPanicked("boom".into());
    assert_eq!(
        m.handle(failed(panicked, false, c.t(2000)), c.t(2001), 0),
        vec![
            Action::CarrierOff,
            Action::Status(State::Restarting),
            Action::ForgetLost
        ]
    );
    let lost = Closed {
        ledger: Err("lost".into()),
        ..torn(false)
    };
    assert_eq!(
        m.handle(Event::Closed(lost), c.t(2001), 0),
        vec![reopen(2, false)]
    );
    let _ = m.handle(opened(false), c.t(2002), 0);
    let r = recorded(&m.handle(started(c.t(2003)), c.t(2003), 0));
    assert_eq!(r.cause, "poller-panicked");
    assert!(
        r.ledger_lost && !r.ledger_balanced && !r.kept_device,
        "{r:?}"
    );
}
