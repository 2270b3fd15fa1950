//! The recovery rule kept strictly, and a fabric that is not trusted, over the simulated
//! fabric:
//! - after a failed poll no CQ of that epoch is polled again, through the whole restart,
//!   with the fault still armed; the old QP is destroyed before anything is reaped;
//! - a QP that cannot be moved to the error state is destroyed before its buffers are
//!   reaped or re-posted; one whose flushes do not all arrive is retired, not destroyed
//!   under the device;
//! - receives that completed before an operator's restart reach the TAP;
//! - an ARP is believed only from its real source, inside the subnet;
//! - data packets from a rogue QP at a peer's GID change nothing;
//! - a peer claiming many addresses holds one entry.

mod common;

use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::sup::{self, A_IP, B_IP};
use common::{FakeTap, fabric, introduce, ipv4_frame, open};
use uipoib::iface::ledger::Ring;
use uipoib::iface::napi::TxGate;
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats::DropReason;
use uipoib::iface::{FLUSH_DEADLINE, Interface, RESTART_FIRST_FILL};
use uipoib::runtime::config::DEFAULT_QKEY;
use uipoib::runtime::supervisor::Close;
use uipoib::verbs::fault::FaultyProvider;
use uipoib::verbs::fault::{Fault, FaultSpec};
use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{Dest, Endpoint, EndpointConfig, Gid, MULTICAST_QPN, Provider, SendWr};
use uipoib::wire::arp::{self, IpoibArp};
use uipoib::wire::ipoib::{self, IpoibAddr};
use uipoib::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4};

/// A (through the fault switch) and B on a fresh fabric, introduced to each other: the
/// fabric, the switch, A, its TAP, B, its TAP.
fn faulty_pair() -> (
    Arc<SimFabric>,
    Arc<uipoib::verbs::fault::FaultSwitch>,
    Interface,
    FakeTap,
    Interface,
    FakeTap,
) {
    let sim = Arc::new(fabric(4096));
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let mut a = open(&faulty, "sim0", "198.18.2.1/24", 16, 8);
    let mut b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 16, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    (sim, switch, a, ta, b, tb)
}

/// Poll `a`'s receive CQ until it is empty.
fn drain_rx(a: &mut Interface, ta: &FakeTap) {
    while a.poll_rx(ta, Instant::now()).unwrap() > 0 {}
}

/// A frame from B's TAP to A, `n` times; A does not poll.
fn send_b_to_a(a: &Interface, b: &mut Interface, tb: &FakeTap, n: usize) {
    let now = Instant::now();
    for i in 0..n {
        let body = (i as u32).to_be_bytes().repeat(25);
        tb.inject(ipv4_frame(a.mac(), b.mac(), B_IP, A_IP, &body));
    }
    let mut g = TxGate::new();
    while tb.pending() > 0 {
        b.tx_from_tap(tb, &mut g, now).unwrap();
        b.poll_tx(now).unwrap();
    }
}

#[test]
fn a_failed_poll_is_never_followed_by_a_poll_through_the_whole_restart() {
    let policy = Policy {
        max_restarts: 4,
        window: Duration::from_secs(60),
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(5),
    };
    let (_, switch, a, b) = sup::pair(policy);
    let renewals_before = switch.endpoint_restarts();
    // Every poll fails from now on, and the fault stays armed through every restart
    // until the breaker gives up.
    switch.arm_poll_error(-5);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut tag = 1u32;
    while a.status().state != "dead" {
        assert!(Instant::now() < deadline, "never dead: {:?}", a.status());
        // Traffic towards A makes whatever epoch is running poll.
        let body = tag.to_be_bytes().repeat(20);
        b.tap.inject(&ipv4_frame(a.mac, b.mac, B_IP, A_IP, &body));
        tag += 1;
        assert_eq!(
            switch.polls_after_failure(),
            0,
            "a CQ was polled after its poll failed"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
    let s = a.status();
    assert!(s.restarts >= 4, "{s:?}");
    assert_eq!(switch.polls_after_failure(), 0, "polled after the failure");
    assert!(switch.polls_failed() >= 4);
    // Each restart destroyed the QP whose poll failed at once, none kept it.
    let renewed = switch.endpoint_restarts() - renewals_before;
    assert!(renewed >= 4, "{renewed}");
    assert_eq!(switch.endpoint_restarts_destroying(), renewed);
    for r in &s.history {
        assert_eq!(r.cause, "poll-failed");
        assert!(r.ledger_balanced, "{r:?}");
        // The failed QP's ring (64 receives) was reaped after the new epoch ran.
        if r.kept_device {
            assert!(r.deferred_reap && r.wr_reaped >= 64, "{r:?}");
        }
    }
    assert!(s.history.iter().any(|r| r.deferred_reap), "{:?}", s.history);
    // Cleared, the operator revives it and traffic flows again.
    switch.clear();
    a.sup().restart();
    a.wait_state("running", s.restarts + 1);
    sup::flows(&b, B_IP, &a, A_IP, 99);
    sup::flows(&a, A_IP, &b, B_IP, 99);
    assert_eq!(switch.polls_after_failure(), 0);
    a.end();
    b.end();
}

#[test]
fn the_teardown_after_a_failed_poll_does_not_drain_and_reaps_everything() {
    let (_, switch, mut a, ta, mut b, tb) = faulty_pair();
    send_b_to_a(&a, &mut b, &tb, 3);
    switch.arm_poll_error(-5);
    assert!(a.poll_rx(&ta, Instant::now()).is_err());
    assert!(a.untrusted());
    let (t, _, kept) = a.close_keeping(FLUSH_DEADLINE, &ta);
    assert_eq!(
        switch.polls_after_failure(),
        0,
        "the drain polled a failed CQ"
    );
    assert_eq!(
        switch.endpoint_restarts_destroying(),
        1,
        "the old QP was kept, not destroyed"
    );
    t.ledger.expect("the ledger balances");
    assert_eq!(t.flushed, 0, "nothing drained");
    assert_eq!(t.reaped, 16, "every receive reaped as lost");
    assert!(
        ta.take_written().is_empty(),
        "nothing of the failed CQ delivered"
    );
    assert!(kept.is_some());
}

#[test]
fn with_a_spare_bank_the_failed_qps_slots_are_reaped_after_the_next_epoch_opens_on_the_other() {
    let sim = Arc::new(fabric(4096));
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let mut p = common::params("sim0", "198.18.2.1/24", 16, 8);
    p.endpoint.banks = 2;
    let stats = Arc::new(uipoib::iface::stats::Stats::default());
    let mut a = Interface::open(&faulty, &p, stats.clone(), 1, &mut None).unwrap();
    let mut b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 16, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    for (epoch, bank) in [(2u16, 1u32), (3, 0), (4, 1)] {
        assert_eq!(
            a.bank(),
            1 - bank,
            "epoch {} runs on the other bank",
            epoch - 1
        );
        switch.arm_poll_error(-5);
        assert!(a.poll_rx(&ta, Instant::now()).is_err());
        switch.clear();
        let failed_qpn = a.hw_addr().qpn;
        let reaped_before = stats.snapshot().recv_reaped;
        a.allow_deferred_reap(true);
        let (t, n, kept) = a.close_keeping(FLUSH_DEADLINE, &ta);
        let mut neigh = Some(n);
        assert_eq!(switch.polls_after_failure(), 0, "the failed CQ was polled");
        assert!(t.deferred && t.kept, "{t:?}");
        assert_eq!(t.reaped, 0, "nothing reaped before the failed QP is gone");
        let mut kept = kept.expect("the endpoint is kept");
        let pending = kept
            .take_pending()
            .expect("the failed QP's bank is pending");
        assert!(
            !sim.destroyed().iter().any(|d| d.qpn == failed_qpn),
            "the failed QP was destroyed before the next epoch opened"
        );
        // The next epoch posts its whole ring from the other bank while the failed QP
        // still exists.
        let next = Interface::open_on(kept, &p, stats.clone(), epoch, &mut neigh).unwrap();
        assert_eq!(next.bank(), bank);
        assert_eq!(
            next.ledger()
                .totals(uipoib::iface::ledger::Ring::Recv)
                .outstanding,
            16
        );
        // Then the failed QP goes (on this thread: the test is the reaper) and its bank
        // is reaped: the 16 receives it held, the ledger balanced.
        let r = pending
            .reap(Duration::from_secs(5))
            .unwrap_or_else(|_| panic!("not gone"));
        assert_eq!((r.reaped, r.sends_reaped), (16, 0));
        r.ledger.unwrap();
        assert_eq!(stats.snapshot().recv_reaped - reaped_before, 16);
        let gone = sim.destroyed();
        let d = gone
            .iter()
            .find(|d| d.qpn == failed_qpn)
            .expect("the failed QP destroyed");
        assert_eq!(d.thread.as_deref(), std::thread::current().name());
        a = next;
    }
    // The last epoch carries traffic on bank 1, its completions accepted by its ledger.
    let mut g = TxGate::new();
    tb.inject(common::arp_request(b.mac(), B_IP, A_IP));
    b.tx_from_tap(&tb, &mut g, Instant::now()).unwrap();
    while a.poll_rx(&ta, Instant::now()).unwrap() > 0 {}
    assert!(
        ta.take_written().iter().any(|f| f.len() >= 42),
        "nothing delivered on the new bank"
    );
    assert_eq!(a.ledger().rejected(), 0);
    a.ledger().check().unwrap();
}

#[test]
fn a_restart_posts_a_first_chunk_before_its_announcement_and_the_rest_after() {
    let ring = 2 * RESTART_FIRST_FILL as u32;
    let sim = Arc::new(fabric(4096));
    let faulty = FaultyProvider::new(sim.clone());
    let switch = faulty.switch();
    let mut p = common::params("sim0", "198.18.2.1/24", ring, 8);
    p.endpoint.banks = 2;
    let stats = Arc::new(uipoib::iface::stats::Stats::default());
    let mut a = Interface::open(&faulty, &p, stats.clone(), 1, &mut None).unwrap();
    let recv = |i: &Interface| i.ledger().totals(Ring::Recv).outstanding as usize;
    assert_eq!(recv(&a), ring as usize, "a fresh open posts the whole ring");
    let mut b = open(sim.as_ref(), "sim1", "198.18.2.2/24", 16, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    switch.arm_poll_error(-5);
    assert!(a.poll_rx(&ta, Instant::now()).is_err());
    switch.clear();
    a.allow_deferred_reap(true);
    let (_, n, kept) = a.close_keeping(FLUSH_DEADLINE, &ta);
    let mut kept = kept.expect("the endpoint is kept");
    let pending = kept
        .take_pending()
        .expect("the failed QP's bank is pending");
    let mut a = Interface::open_on(kept, &p, stats.clone(), 2, &mut Some(n)).unwrap();
    assert_eq!(
        recv(&a),
        RESTART_FIRST_FILL,
        "the restart posts its first chunk"
    );
    assert_eq!(a.open_times().posted, RESTART_FIRST_FILL);
    // The peer learns the new QPN and sends at once: the first chunk takes it.
    a.announce_once(Instant::now());
    drain_rx(&mut b, &tb);
    ta.take_written();
    send_b_to_a(&a, &mut b, &tb, 4);
    // (the poller's first act)
    assert_eq!(a.fill_recv().unwrap(), RESTART_FIRST_FILL);
    drain_rx(&mut a, &ta);
    let got = ta.take_written().iter().filter(|f| f.len() > 100).count();
    assert_eq!(got, 4, "what reached the first chunk was lost");
    assert_eq!(recv(&a), ring as usize, "the ring is whole again");
    let r = pending
        .reap(Duration::from_secs(5))
        .unwrap_or_else(|_| panic!("not gone"));
    assert_eq!(r.reaped, ring as u64);
    r.ledger.unwrap();
    a.ledger().check().unwrap();
}

#[test]
fn receives_completed_before_an_operator_restart_reach_the_tap() {
    let f = fabric(4096);
    let mut a = open(&f, "sim0", "198.18.2.1/24", 16, 8);
    let mut b = open(&f, "sim1", "198.18.2.2/24", 16, 8);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    send_b_to_a(&a, &mut b, &tb, 5);
    let before = a.stats().snapshot();
    let stats = a.stats().clone();
    // The operator restarts A before it polled: the drain finds the five receives.
    let (t, _, kept) = a.close_keeping(FLUSH_DEADLINE, &ta);
    t.ledger.expect("the ledger balances");
    let written = ta.take_written();
    assert_eq!(written.len(), 5, "the drained receives reach the TAP");
    let s = stats.snapshot();
    assert_eq!(s.rx_packets - before.rx_packets, 5);
    assert_eq!(s.drops_total(), 0, "{:?}", s.drops);
    assert!(kept.is_some());

    // Without a TAP (a final stop), they are counted as dropped, not as delivered.
    let mut a = open(&f, "sim0", "198.18.2.1/24", 16, 8);
    let ta = FakeTap::default();
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    send_b_to_a(&a, &mut b, &tb, 4);
    let stats = a.stats().clone();
    let rx_before = stats.snapshot().rx_packets;
    let (t, _) = a.close(FLUSH_DEADLINE);
    t.ledger.unwrap();
    assert_eq!(stats.drops(DropReason::RxTeardown), 4);
    assert_eq!(stats.snapshot().rx_packets, rx_before);
}

#[test]
fn a_qp_that_cannot_be_moved_to_error_is_destroyed_before_its_buffers_are_reaped() {
    let (_, switch, a, ta, mut b, tb) = faulty_pair();
    switch.refuse_qp_error(true);
    let stats = a.stats().clone();
    let (t, neigh, kept) = a.close_keeping(FLUSH_DEADLINE, &ta);
    assert_eq!(
        switch.endpoint_restarts_destroying(),
        1,
        "destroyed, not retired"
    );
    assert_eq!(t.errors, 1, "the failed move to ERR is counted");
    t.ledger.unwrap();
    assert_eq!(t.reaped, 16);
    switch.refuse_qp_error(false);
    // The next epoch re-posts the same slots on the new QP and carries traffic.
    let p = common::params("sim0", "198.18.2.1/24", 16, 8);
    let mut n = Some(neigh);
    let mut a = Interface::open_on(kept.unwrap(), &p, stats, 2, &mut n).unwrap();
    // Its gratuitous ARP moves B's entry for it to the new QPN.
    a.announce(Instant::now());
    drain_rx(&mut b, &tb);
    tb.take_written();
    send_b_to_a(&a, &mut b, &tb, 2);
    drain_rx(&mut a, &ta);
    assert_eq!(ta.take_written().len(), 2);
}

#[test]
fn a_qp_whose_flushes_do_not_all_arrive_is_retired_in_the_error_state() {
    let (_, switch, mut a, ta, b, _) = faulty_pair();
    // Send completions are held back: the drain cannot account for A's sends.
    switch.arm(FaultSpec::new(Fault::StallSend).unlimited());
    a.poll_tx(Instant::now()).unwrap();
    send_b_to_a(&b, &mut a, &ta, 3);
    let (t, _, _) = a.close_keeping(Duration::from_millis(50), &ta);
    t.ledger.clone().unwrap();
    assert!(t.sends_reaped >= 3, "{t:?}");
    // rxe is still flushing such a QP: destroying it now would free it under rxe's
    // tasks. It waits out its grace in the error state instead.
    assert_eq!(
        switch.endpoint_restarts_destroying(),
        0,
        "destroyed while still flushing"
    );
    assert_eq!(switch.endpoint_restarts(), 1);
}

/// A raw endpoint on `dev` (a rogue QP on that host), with an AH for `to`.
struct Rogue {
    ep: Box<dyn Endpoint>,
    dest: Dest,
    slot: u32,
}

impl Rogue {
    fn open(sim: &SimFabric, dev: &str, to: Gid, qpn: u32) -> Rogue {
        let mut ep = sim
            .open(&EndpointConfig {
                device: dev.into(),
                port: 1,
                gid_index: None,
                qkey: DEFAULT_QKEY,
                recv_slots: 4,
                send_slots: 4,
                max_payload: None,
                banks: 1,
            })
            .unwrap();
        let ah = ep.create_ah(&to).unwrap();
        Rogue {
            ep,
            dest: Dest {
                ah,
                qpn,
                qkey: DEFAULT_QKEY,
            },
            slot: 0,
        }
    }
    fn hw(&self) -> IpoibAddr {
        IpoibAddr::new(self.ep.attrs().qpn, self.ep.attrs().gid)
    }
    /// Send one IPoIB packet (`payload` behind the 4-byte header).
    fn send(&mut self, ethertype: u16, payload: &[u8]) {
        let slot = self.slot;
        self.slot = (self.slot + 1) % 4;
        let buf = self.ep.send_buf(slot);
        ipoib::emit_header(buf, ethertype).unwrap();
        buf[ipoib::HEADER_LEN..ipoib::HEADER_LEN + payload.len()].copy_from_slice(payload);
        self.ep
            .post_send(&[SendWr {
                wr_id: u64::from(slot),
                slot,
                len: (ipoib::HEADER_LEN + payload.len()) as u32,
                dest: self.dest,
                signaled: true,
            }])
            .unwrap();
        let mut wc = [uipoib::verbs::Completion::EMPTY; 4];
        while self
            .ep
            .poll_cq(uipoib::verbs::CqKind::Send, &mut wc)
            .unwrap()
            > 0
        {}
    }
    fn arp(&mut self, op: u16, sha: IpoibAddr, spa: Ipv4Addr, tpa: Ipv4Addr) {
        let mut b = [0u8; 64];
        let n = IpoibArp {
            op,
            sha,
            spa,
            tha: IpoibAddr::ZERO,
            tpa,
        }
        .emit(&mut b)
        .unwrap();
        self.send(ETHERTYPE_ARP, &b[..n]);
    }
}

/// A and B introduced, and a rogue QP on B's device (`sim1`) aimed at A.
fn rogue_rig() -> (
    SimFabric,
    Interface,
    FakeTap,
    Interface,
    FakeTap,
    Rogue,
    IpoibAddr,
) {
    let f = fabric(4096);
    let mut a = open(&f, "sim0", "198.18.2.1/24", 64, 32);
    let mut b = open(&f, "sim1", "198.18.2.2/24", 64, 32);
    let (ta, tb) = (FakeTap::default(), FakeTap::default());
    introduce(&mut a, &ta, &mut b, &tb, A_IP, B_IP);
    let a_hw = a.hw_addr();
    let rogue = Rogue::open(&f, "sim1", a_hw.gid, a_hw.qpn);
    let b_hw = b.hw_addr();
    assert_eq!(rogue.hw().gid, b_hw.gid, "the rogue shares B's GID");
    assert_ne!(rogue.hw().qpn, b_hw.qpn);
    (f, a, ta, b, tb, rogue, b_hw)
}

#[test]
fn an_arp_is_believed_only_from_its_real_source() {
    let (_f, mut a, ta, _b, _tb, mut rogue, b_hw) = rogue_rig();
    let stats = a.stats().clone();
    // The rogue claims to be B's daemon (B's QPN), from its own QP.
    rogue.arp(arp::OP_REPLY, b_hw, B_IP, A_IP);
    rogue.arp(arp::OP_REQUEST, b_hw, B_IP, B_IP);
    // Reserved QPNs as the sender.
    for q in [0, 1, MULTICAST_QPN] {
        rogue.arp(arp::OP_REPLY, IpoibAddr::new(q, b_hw.gid), B_IP, A_IP);
    }
    // Its own real address, but a sender IP outside A's subnet.
    let real = rogue.hw();
    rogue.arp(arp::OP_REPLY, real, Ipv4Addr::new(198, 19, 9, 9), A_IP);
    drain_rx(&mut a, &ta);
    assert_eq!(stats.drops(DropReason::RxArpSpoofed), 2);
    assert_eq!(stats.drops(DropReason::RxBadArp), 3);
    assert_eq!(stats.drops(DropReason::RxArpOffSubnet), 1);
    assert!(
        ta.take_written().is_empty(),
        "nothing of it reached A's kernel"
    );
    let (_, peer) = a.neighbours().by_ip(B_IP).unwrap();
    assert_eq!(peer.hw, b_hw, "B's entry unchanged");
    assert!(a.neighbours().by_ip(Ipv4Addr::new(198, 19, 9, 9)).is_none());
    // A request for someone else from an unknown sender is passed on, not learned.
    rogue.arp(
        arp::OP_REQUEST,
        real,
        Ipv4Addr::new(198, 18, 2, 77),
        Ipv4Addr::new(198, 18, 2, 78),
    );
    drain_rx(&mut a, &ta);
    assert_eq!(ta.take_written().len(), 1);
    assert!(
        a.neighbours()
            .by_ip(Ipv4Addr::new(198, 18, 2, 77))
            .is_none()
    );
    assert_eq!(stats.snapshot().arp_not_learned, 1);
    // Its real address, asking for A's address from another sender address: that would
    // move B's entry (same GID) to the rogue's QP and a new address at once.
    rogue.arp(arp::OP_REQUEST, real, Ipv4Addr::new(198, 18, 2, 79), A_IP);
    drain_rx(&mut a, &ta);
    assert_eq!(stats.snapshot().arp_not_learned, 2);
    let (_, peer) = a.neighbours().by_ip(B_IP).unwrap();
    assert_eq!(peer.hw, b_hw, "B's entry unchanged");
    assert!(
        a.neighbours()
            .by_ip(Ipv4Addr::new(198, 18, 2, 79))
            .is_none()
    );
}

#[test]
fn data_from_a_rogue_qp_at_a_peers_gid_changes_nothing() {
    let (_f, mut a, ta, mut b, tb, mut rogue, b_hw) = rogue_rig();
    let now = Instant::now();
    let stats = a.stats().clone();
    let updated_before = stats.snapshot().neigh_updated;
    let pkt = ipv4_frame(a.mac(), b.mac(), B_IP, A_IP, &[7; 40]);
    for _ in 0..10 {
        rogue.send(ETHERTYPE_IPV4, &pkt[14..]);
    }
    drain_rx(&mut a, &ta);
    let s = stats.snapshot();
    assert_eq!(s.rx_unknown_qpn, 10);
    assert_eq!(s.neigh_updated, updated_before);
    let (_, peer) = a.neighbours().by_ip(B_IP).unwrap();
    assert_eq!(peer.hw, b_hw, "B is still known at its own QPN");
    ta.take_written();
    // A's traffic to B still reaches B's daemon, not the rogue.
    ta.inject(ipv4_frame(b.mac(), a.mac(), A_IP, B_IP, &[9; 40]));
    let mut g = TxGate::new();
    a.tx_from_tap(&ta, &mut g, now).unwrap();
    drain_rx(&mut b, &tb);
    let got = tb.take_written();
    assert_eq!(got.len(), 1, "B received A's packet");
    assert_eq!(&got[0][34..], &[9; 40][..]);
}

#[test]
fn a_peer_claiming_many_addresses_holds_one_entry() {
    let (_f, mut a, ta, _b, _tb, mut rogue, _b_hw) = rogue_rig();
    let real = rogue.hw();
    // Requests for A's address from 20,000 distinct sender addresses in the subnet, and
    // as many for someone else.
    for i in 0..20_000u32 {
        let spa = Ipv4Addr::from(u32::from(Ipv4Addr::new(198, 18, 2, 0)) | (i % 250 + 3));
        let spa = if i % 2 == 0 {
            spa
        } else {
            Ipv4Addr::from(0xC612_0200 | (i % 253))
        };
        let tpa = if i % 3 == 0 {
            Ipv4Addr::new(198, 18, 2, 99)
        } else {
            A_IP
        };
        rogue.arp(arp::OP_REQUEST, real, spa, tpa);
        if i % 32 == 31 {
            drain_rx(&mut a, &ta);
            ta.take_written();
        }
    }
    drain_rx(&mut a, &ta);
    let n = a.neighbours();
    assert!(n.len() <= 2, "{} peers", n.len());
    assert!(
        n.ip_entries() <= n.len(),
        "{} addresses for {} peers",
        n.ip_entries(),
        n.len()
    );
}

#[test]
fn a_bad_wr_outside_the_chain_restarts_and_takes_the_chain_as_posted() {
    let (_, switch, mut a, ta, b, _) = faulty_pair();
    switch.bad_wr_once();
    for i in 0..3u8 {
        ta.inject(ipv4_frame(b.mac(), a.mac(), A_IP, B_IP, &[i; 30]));
    }
    let mut g = TxGate::new();
    let r = a.tx_from_tap(&ta, &mut g, Instant::now());
    assert!(
        matches!(
            r,
            Err(uipoib::iface::Failure::Verbs(
                uipoib::verbs::VerbsError::BadWrOutsideChain { .. }
            ))
        ),
        "{r:?}"
    );
    assert!(a.untrusted());
    let stats = a.stats().clone();
    assert_eq!(
        stats.snapshot().send_outstanding,
        3,
        "the whole chain counts as posted"
    );
    let (t, _, _) = a.close_keeping(FLUSH_DEADLINE, &ta);
    t.ledger.clone().unwrap();
    assert_eq!(t.sends_reaped, 3, "{t:?}");
    assert_eq!(switch.endpoint_restarts_destroying(), 1);
    assert_eq!(switch.polls_after_failure(), 0);
}
