//! Tests of the decorator, over the simulated fabric.

use std::time::Duration;

use super::*;
use crate::verbs::fault::CqSel;
use crate::verbs::sim::SimFabric;
use crate::verbs::sim::tests::{cfg_qkey, fabric, unwatch_with, watch_with};
use crate::verbs::{
    AhHandle, Completion, CqKind, Dest, Endpoint, EndpointConfig, GRH_LEN, PostSendError, SendWr,
    VerbsError, WcStatus,
};

const QKEY: u32 = 0x0B1B;

struct Rig {
    _sim: Arc<SimFabric>,
    switch: Arc<FaultSwitch>,
    /// Through the decorator.
    a: Box<dyn Endpoint>,
    /// Plain.
    b: Box<dyn Endpoint>,
    ah: AhHandle,
}

fn cfg(device: &str) -> EndpointConfig {
    cfg_qkey(device, QKEY)
}

fn rig() -> Rig {
    let sim = Arc::new(fabric());
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let mut a = faulty.open(&cfg("a")).unwrap();
    let b = sim.open(&cfg("b")).unwrap();
    let ah = a.create_ah(&b.attrs().gid).unwrap();
    Rig {
        _sim: sim,
        switch,
        a,
        b,
        ah,
    }
}

impl Rig {
    fn wr(&self, wr_id: u64) -> SendWr {
        SendWr {
            wr_id,
            slot: (wr_id % 16) as u32,
            len: 100,
            dest: Dest {
                ah: self.ah,
                qpn: self.b.attrs().qpn,
                qkey: QKEY,
            },
            signaled: true,
        }
    }
    /// A sends `n` packets (ids from `first`) to B, which has receives posted.
    fn a_sends(&mut self, first: u64, n: u64) -> Result<(), PostSendError> {
        let wrs: Vec<SendWr> = (first..first + n).map(|i| self.wr(i)).collect();
        self.a.post_send(&wrs)
    }
    /// B sends `n` packets to A.
    fn b_sends(&mut self, n: u64) {
        let ah = self.b.create_ah(&self.a.attrs().gid).unwrap();
        for i in 0..n {
            let buf = self.b.send_buf(0);
            buf[..100].fill(0x11);
            self.b
                .post_send(&[SendWr {
                    wr_id: 1000 + i,
                    slot: 0,
                    len: 100,
                    dest: Dest {
                        ah,
                        qpn: self.a.attrs().qpn,
                        qkey: QKEY,
                    },
                    signaled: true,
                }])
                .unwrap();
        }
        poll(&mut *self.b, CqKind::Send);
    }
}

fn poll(ep: &mut dyn Endpoint, cq: CqKind) -> Vec<Completion> {
    let mut out = [Completion::EMPTY; 64];
    let n = ep.poll_cq(cq, &mut out).unwrap();
    out[..n].to_vec()
}

fn ids(c: &[Completion]) -> Vec<u64> {
    c.iter().map(|c| c.wr_id).collect()
}

#[test]
fn renew_starts_the_qp_afresh_and_refuses_after_a_device_loss() {
    let mut r = rig();
    r.switch.arm_poll_error_n(-5, 1);
    let mut out = [Completion::EMPTY; 4];
    assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_err());
    // A failed poll is never retried on that QP; after a renewal the QP is another.
    let qpn = r.a.attrs().qpn;
    r.a.restart().unwrap();
    assert_ne!(r.a.attrs().qpn, qpn);
    assert_eq!((r.switch.opens(), r.switch.endpoint_restarts()), (1, 1));
    assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
    assert_eq!(r.switch.polls_after_failure(), 0);
    // A hidden device (gone) cannot be renewed ...
    r.switch.hide_device(true);
    assert!(matches!(r.a.restart(), Err(VerbsError::RenewRefused(_))));
    r.switch.hide_device(false);
    // ... nor one whose loss this endpoint reported.
    r.switch.inject_async(AsyncEvent::DeviceFatal);
    assert_eq!(
        r.a.next_async_event().unwrap(),
        Some(AsyncEvent::DeviceFatal)
    );
    assert!(matches!(r.a.restart(), Err(VerbsError::RenewRefused(_))));
    assert_eq!(r.switch.endpoint_restarts(), 1);
}

#[test]
fn inert_until_armed_then_poll_error_after_n() {
    let mut r = rig();
    r.a_sends(1, 3).unwrap();
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2, 3]);
    assert_eq!(r.switch.injected(), 0);
    r.switch.arm(
        FaultSpec::new(Fault::poll_error(-22))
            .trigger(Trigger::After(2))
            .limit(2),
    );
    let mut out = [Completion::EMPTY; 4];
    assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
    assert!(r.a.poll_cq(CqKind::Send, &mut out).is_ok());
    for _ in 0..2 {
        match r.a.poll_cq(CqKind::Recv, &mut out) {
            Err(VerbsError::PollFailed { ret: -22, .. }) => {}
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(r.switch.polls_failed(), 2);
    assert_eq!(r.switch.polls_after_failure(), 1);
    assert!(r.switch.armed().is_empty(), "spent after two hits");
    assert!(r.a.poll_cq(CqKind::Recv, &mut out).is_ok());
    let log = r.switch.injections();
    assert_eq!(
        log.iter()
            .map(|i| (i.seq, i.kind, i.op))
            .collect::<Vec<_>>(),
        vec![(1, FaultKind::PollError, 3), (2, FaultKind::PollError, 4)]
    );
    assert_eq!(log[0].endpoint, Some(0));
}

#[test]
fn lost_completion_is_swallowed_on_its_cq_only() {
    let mut r = rig();
    r.switch.arm(
        FaultSpec::new(Fault::LostCompletion { cq: CqSel::Send })
            .trigger(Trigger::Every(2))
            .limit(2),
    );
    r.b.post_recv(77, 0).unwrap();
    r.a_sends(1, 6).unwrap();
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 3, 5, 6]);
    // Receives are not selected.
    r.a.post_recv(9, 0).unwrap();
    r.b_sends(1);
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Recv)), vec![9]);
    assert_eq!(r.switch.fired(FaultKind::LostCompletion), 2);
}

#[test]
fn post_errors_post_the_prefix_and_fail_the_rest() {
    let mut r = rig();
    r.switch.arm(
        FaultSpec::new(Fault::PostSendError {
            errno: libc::EINVAL,
        })
        .trigger(Trigger::After(2)),
    );
    let e = r.a_sends(1, 4).unwrap_err();
    assert_eq!(e.posted, 2);
    assert!(
        matches!(&e.error, VerbsError::Verb { verb: "ibv_post_send", source } if source.raw_os_error() == Some(libc::EINVAL)),
        "{e}"
    );
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2]);
    // Spent: the next chain goes through.
    r.a_sends(10, 2).unwrap();
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![10, 11]);

    r.switch.arm(
        FaultSpec::new(Fault::PostRecvError {
            errno: libc::ENOMEM,
        })
        .limit(1),
    );
    match r.a.post_recv(5, 5) {
        Err(VerbsError::Verb {
            verb: "ibv_post_recv",
            source,
        }) => assert_eq!(source.raw_os_error(), Some(libc::ENOMEM)),
        other => panic!("{other:?}"),
    }
    r.a.post_recv(5, 5).unwrap();
    r.b_sends(1);
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Recv)), vec![5]);
}

#[test]
fn qp_error_flushes_and_can_raise_qp_fatal() {
    let mut r = rig();
    for i in 0..4 {
        r.a.post_recv(i, i as u32).unwrap();
    }
    r.switch
        .arm(FaultSpec::new(Fault::QpError { fatal_event: true }));
    let c = poll(&mut *r.a, CqKind::Recv);
    assert_eq!(ids(&c), vec![0, 1, 2, 3]);
    assert!(c.iter().all(|c| c.status == WcStatus::Flushed));
    assert_eq!(r.a.next_async_event().unwrap(), Some(AsyncEvent::QpFatal));
    assert_eq!(r.a.next_async_event().unwrap(), None);
    // Later posts flush too.
    r.a_sends(1, 1).unwrap();
    assert_eq!(poll(&mut *r.a, CqKind::Send)[0].status, WcStatus::Flushed);
}

#[test]
fn spurious_event_reports_an_event_with_nothing_behind_it() {
    let mut r = rig();
    assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
    // On command: at once, to every endpoint.
    r.switch.arm(FaultSpec::new(Fault::SpuriousEvent));
    assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
    assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
    assert!(poll(&mut *r.a, CqKind::Recv).is_empty());
    // By trigger: at the hit poll.
    r.switch
        .arm(FaultSpec::new(Fault::SpuriousEvent).trigger(Trigger::After(1)));
    poll(&mut *r.a, CqKind::Recv);
    assert_eq!(r.a.take_cq_events().unwrap(), (0, 0));
    poll(&mut *r.a, CqKind::Recv);
    assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
    assert_eq!(r.switch.fired(FaultKind::SpuriousEvent), 2);
}

#[test]
fn spurious_event_wakes_a_registered_channel() {
    let mut r = rig();
    let mut poll_ = mio::Poll::new().unwrap();
    let fds = watch_with(&mut *r.a, poll_.registry(), mio::Token(1), mio::Token(2));
    r.switch.arm(FaultSpec::new(Fault::SpuriousEvent));
    let mut events = mio::Events::with_capacity(8);
    poll_
        .poll(&mut events, Some(Duration::from_secs(2)))
        .unwrap();
    assert!(events.iter().any(|e| e.token() == mio::Token(1)));
    assert_eq!(r.a.take_cq_events().unwrap(), (1, 0));
    unwatch_with(&mut *r.a, poll_.registry(), &fds);
}

#[test]
fn slow_poll_delays_each_poll_hit() {
    let mut r = rig();
    r.switch.arm(
        FaultSpec::new(Fault::SlowPoll {
            delay: Duration::from_millis(30),
        })
        .limit(2),
    );
    let t = Instant::now();
    poll(&mut *r.a, CqKind::Recv);
    poll(&mut *r.a, CqKind::Send);
    assert!(t.elapsed() >= Duration::from_millis(60));
    let t = Instant::now();
    poll(&mut *r.a, CqKind::Recv);
    assert!(t.elapsed() < Duration::from_millis(30));
}

#[test]
fn corrupt_rx_flips_bytes_in_a_copy_until_the_next_poll() {
    let mut r = rig();
    // Posted before arming: its slot is unknown, it is left alone.
    r.a.post_recv(100, 0).unwrap();
    r.switch.arm(
        FaultSpec::new(Fault::CorruptRx { bytes: 3 })
            .trigger(Trigger::Every(1))
            .unlimited(),
    );
    r.a.post_recv(101, 1).unwrap();
    r.b_sends(2);
    let c = poll(&mut *r.a, CqKind::Recv);
    assert_eq!(ids(&c), vec![100, 101]);
    let len = c[1].byte_len as usize;
    assert_eq!(len, GRH_LEN + 100);
    let clean = r.a.recv_buf(0)[..len].to_vec();
    let dirty = r.a.recv_buf(1)[..len].to_vec();
    let diff = clean.iter().zip(&dirty).filter(|(x, y)| x != y).count();
    assert_eq!(diff, 3, "three bytes flipped");
    assert_eq!(r.a.recv_buf(1).len(), r.a.recv_buf(0).len());
    assert_eq!(r.switch.fired(FaultKind::CorruptRx), 1);
    // The next receive poll drops the copy: the slot reads as delivered.
    poll(&mut *r.a, CqKind::Recv);
    assert_eq!(r.a.recv_buf(1)[..len], clean[..]);
}

/// The 16-bit ones'-complement sum of `b` (an odd last byte padded with zero), folded,
/// modulo 0xffff: the value an Internet checksum over `b` compares.
fn ones_complement_sum(b: &[u8]) -> u64 {
    let mut s: u64 = b
        .chunks(2)
        .map(|w| u64::from(w[0]) << 8 | u64::from(*w.get(1).unwrap_or(&0)))
        .sum();
    while s > 0xffff {
        s = (s & 0xffff) + (s >> 16);
    }
    s % 0xffff
}

#[test]
fn corrupt_rx_damage_shows_in_every_checksum_over_it() {
    // A receive buffer as a TCP segment over IPv4 arrives: GRH, IPoIB header, IPv4, TCP
    // with timestamps, 4000 bytes of payload; its bytes from a fixed generator.
    let len = GRH_LEN + 4 + 20 + 32 + 4000;
    let mut g = crate::verbs::fault::SplitMix64::new(42);
    let clean: Vec<u8> = (0..len).map(|_| g.next_u64() as u8).collect();
    let (ip, tcp_sum_start) = (GRH_LEN + 4, GRH_LEN + 4 + 12);
    let (mut seen_in_tcp, mut four) = (0, 0);
    for noise in 0..6_000u64 {
        let mut dirty = clean.clone();
        super::endpoint::flip(&mut dirty, len, 4, noise);
        let changed: Vec<usize> = (0..len).filter(|&i| dirty[i] != clean[i]).collect();
        assert!(!changed.is_empty(), "noise {noise}: nothing flipped");
        four += usize::from(changed.len() == 4);
        // The ranges IPv4's header checksum and TCP's (the pseudo-header's addresses, then
        // the segment) cover, and ranges of either alignment around the flips.
        let mut ranges = vec![(ip, ip + 20), (tcp_sum_start, len)];
        for &c in &changed {
            let s = c & !1;
            ranges.push((s, (s + 2).min(len)));
            ranges.push((s.saturating_sub(6), (c + 9).min(len)));
            ranges.push((0, c + 1));
            ranges.push((s, len));
            ranges.push((c, (c + 7).min(len)));
        }
        for (a, b) in ranges {
            if !changed.iter().any(|&c| (a..b).contains(&c)) {
                continue;
            }
            assert_ne!(
                ones_complement_sum(&clean[a..b]),
                ones_complement_sum(&dirty[a..b]),
                "noise {noise}: bytes {changed:?} changed, but the checksum over {a}..{b} still matches"
            );
            if (a, b) == (tcp_sum_start, len) {
                seen_in_tcp += 1;
            }
        }
    }
    assert!(
        seen_in_tcp > 5_700,
        "{seen_in_tcp} of 6000 damaged the TCP range"
    );
    // Not by falling back to one byte: the four asked for, every time.
    assert_eq!(four, 6_000, "{four} of 6000 flipped four bytes");
}

#[test]
fn stall_send_holds_completions_until_cleared() {
    let mut r = rig();
    r.switch.arm(FaultSpec::new(Fault::StallSend));
    r.a_sends(1, 3).unwrap();
    assert!(poll(&mut *r.a, CqKind::Send).is_empty());
    assert!(r.switch.stalled());
    assert!(r.switch.armed().is_empty(), "spent, but the stall stays");
    assert!(poll(&mut *r.a, CqKind::Send).is_empty());
    r.switch.clear();
    assert!(!r.switch.stalled());
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![1, 2, 3]);
    // A stalled endpoint that goes away takes its stall with it.
    r.switch.arm(FaultSpec::new(Fault::StallSend));
    poll(&mut *r.a, CqKind::Send);
    assert!(r.switch.stalled());
    drop(r.a);
    assert!(!r.switch.stalled());
    assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
}

#[test]
fn async_fatal_on_command_and_by_trigger() {
    let mut r = rig();
    r.switch.arm(FaultSpec::new(Fault::AsyncFatal {
        event: AsyncEvent::CqError,
    }));
    assert_eq!(r.a.next_async_event().unwrap(), Some(AsyncEvent::CqError));
    assert_eq!(r.a.next_async_event().unwrap(), None);
    r.switch.arm(
        FaultSpec::new(Fault::AsyncFatal {
            event: AsyncEvent::DeviceFatal,
        })
        .trigger(Trigger::Every(3))
        .limit(1),
    );
    poll(&mut *r.a, CqKind::Recv);
    poll(&mut *r.a, CqKind::Recv);
    assert_eq!(r.a.next_async_event().unwrap(), None);
    poll(&mut *r.a, CqKind::Recv);
    assert_eq!(
        r.a.next_async_event().unwrap(),
        Some(AsyncEvent::DeviceFatal)
    );
    let log = r.switch.injections();
    assert_eq!(log[0].endpoint, None);
    assert_eq!((log[1].endpoint, log[1].op), (Some(0), 3));
}

#[test]
fn seeded_faults_hit_the_same_operations() {
    let run = |seed: u64| {
        let mut r = rig();
        r.switch.arm(
            FaultSpec::new(Fault::LostCompletion { cq: CqSel::Send })
                .trigger(Trigger::Random { p: 0.3, seed }),
        );
        let mut seen = Vec::new();
        for i in 0..20 {
            r.a_sends(i * 4, 4).unwrap();
            seen.extend(ids(&poll(&mut *r.a, CqKind::Send)));
        }
        (
            seen,
            r.switch
                .injections()
                .iter()
                .map(|i| i.op)
                .collect::<Vec<_>>(),
        )
    };
    assert_eq!(run(5), run(5));
    assert_ne!(run(5), run(6));
}

#[test]
fn clear_disarms_everything() {
    let r = rig();
    r.switch.arm_poll_error(-5);
    r.switch.arm(FaultSpec::new(Fault::SlowPoll {
        delay: Duration::from_millis(1),
    }));
    r.switch.hide_device(true);
    assert_eq!(r.switch.armed().len(), 2);
    r.switch.clear();
    assert!(r.switch.armed().is_empty());
    assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
    assert!(!r.switch.hidden.load(Ordering::SeqCst));
    r.switch
        .arm(FaultSpec::new(Fault::CorruptRx { bytes: 1 }).unlimited());
    r.switch.disarm(FaultKind::CorruptRx);
    assert_eq!(r.switch.mask.load(Ordering::Relaxed), 0);
}

#[test]
fn a_lossy_poll_error_swallows_what_the_failing_poll_found_and_only_hits_a_poll_that_finds_some() {
    let mut r = rig();
    r.switch.arm(FaultSpec::new(Fault::PollError {
        ret: -5,
        lose: 2,
        cq: CqSel::Send,
    }));
    let mut out = [Completion::EMPTY; 4];
    // The receive CQ is not selected; an empty send poll has nothing to lose.
    assert_eq!(r.a.poll_cq(CqKind::Recv, &mut out).unwrap(), 0);
    assert_eq!(r.a.poll_cq(CqKind::Send, &mut out).unwrap(), 0);
    assert_eq!(r.switch.polls_failed(), 0);
    r.a_sends(1, 3).unwrap();
    // The next send poll finds completions: it fails and takes two of them with it.
    assert!(matches!(
        r.a.poll_cq(CqKind::Send, &mut out),
        Err(VerbsError::PollFailed { ret: -5, .. })
    ));
    assert_eq!(r.switch.completions_swallowed(), 2);
    assert!(r.switch.first_hit_unix_ms(FaultKind::PollError).is_some());
    // Spent; the third completion is still there.
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![3]);
    // Armed but not hitting yet (after 1), a poll still gets all it asked for.
    r.switch.arm(
        FaultSpec::new(Fault::PollError {
            ret: -5,
            lose: 2,
            cq: CqSel::Send,
        })
        .trigger(Trigger::After(1)),
    );
    r.a_sends(4, 3).unwrap();
    assert_eq!(ids(&poll(&mut *r.a, CqKind::Send)), vec![4, 5, 6]);
    assert_eq!(r.switch.polls_failed(), 1);
}

#[test]
fn the_first_hit_is_kept_after_the_log_has_moved_on() {
    let mut r = rig();
    r.switch
        .arm(FaultSpec::new(Fault::poll_error(-5)).trigger(Trigger::Every(1)));
    let mut out = [Completion::EMPTY; 4];
    let _ = r.a.poll_cq(CqKind::Recv, &mut out);
    let first = r.switch.first_hit_unix_ms(FaultKind::PollError).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(5));
    for _ in 0..200 {
        let _ = r.a.poll_cq(CqKind::Recv, &mut out);
    }
    assert_eq!(
        r.switch.first_hit_unix_ms(FaultKind::PollError),
        Some(first)
    );
    assert!(r.switch.recent_injections(100)[0].unix_ms > first);
    // A new arming starts afresh.
    r.switch.arm(FaultSpec::new(Fault::poll_error(-5)));
    assert_eq!(r.switch.first_hit_unix_ms(FaultKind::PollError), None);
}
