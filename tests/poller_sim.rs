//! The poller threads over the simulated fabric: traffic flows through the mio shell,
//! and a failed CQ poll stops the poller at once and hands the interface over by value.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{SockTap, arp_reply, arp_request, fabric, ipv4_frame, open};
use crossbeam_channel::unbounded;
use uipoib::iface::{FLUSH_DEADLINE, Failure};
use uipoib::runtime::poller::{Exit, Poller};
use uipoib::runtime::supervisor::Close;
use uipoib::tap::TapDevice;
use uipoib::verbs::VerbsError;
use uipoib::verbs::fault::FaultyProvider;
use uipoib::wire::arp::EthArp;
use uipoib::wire::eth;

const A_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(198, 18, 2, 2);

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
        eth::parse_frame(f)
            .ok()
            .and_then(|(_, p)| EthArp::parse(p).ok())
            .is_some_and(|a| a.spa == A_IP && a.tpa == A_IP)
    });

    ta.inject(&arp_request(a_mac, A_IP, B_IP));
    wait_frame(&tb, "ARP request", |f| {
        eth::parse_frame(f)
            .ok()
            .and_then(|(_, p)| EthArp::parse(p).ok())
            .is_some_and(|a| a.tpa == B_IP && a.spa == A_IP)
    });
    tb.inject(&arp_reply(b_mac, B_IP, a_mac, A_IP));
    wait_frame(&ta, "ARP reply", |f| {
        eth::parse_frame(f)
            .ok()
            .and_then(|(_, p)| EthArp::parse(p).ok())
            .is_some_and(|a| a.spa == B_IP && a.op == 2)
    });
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
