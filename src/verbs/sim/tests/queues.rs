//! A QP's queues: the error state's flushes, held sends, post errors, completion
//! events and the channel, drops, renewal, buffer recycling, two threads.

use super::*;

#[test]
fn set_qp_error_flushes_both_queues_in_order() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.post_recv(1, 0).unwrap();
    for (id, slot) in [(10, 4), (11, 2), (12, 9)] {
        a.post_recv(id, slot).unwrap();
    }
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let b_qpn = b.attrs().qpn;
    // A completed send stays a success; held sends are outstanding.
    send(&mut *a, ah, b_qpn, QKEY, 1, b"done");
    assert!(f.hold_sends(a.attrs().qpn, true));
    let chain: Vec<SendWr> = (2..5).map(|id| wr(id, ah, b_qpn, QKEY, 4)).collect();
    a.post_send(&chain).unwrap();
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
    assert!(poll_all(&mut *a, CqKind::Send).is_empty());

    a.set_qp_error().unwrap();
    let flushed = |ids: &[u64]| -> Vec<Completion> {
        ids.iter()
            .map(|&wr_id| Completion {
                wr_id,
                status: WcStatus::Flushed,
                ..Completion::EMPTY
            })
            .collect()
    };
    assert_eq!(poll_all(&mut *a, CqKind::Recv), flushed(&[10, 11, 12]));
    assert_eq!(poll_all(&mut *a, CqKind::Send), flushed(&[2, 3, 4]));
    assert_eq!(f.counters().delivered, 1, "held sends were never delivered");

    // Afterwards every post flushes at once and nothing is delivered.
    a.post_recv(13, 0).unwrap();
    send(&mut *a, ah, b_qpn, QKEY, 5, b"after");
    assert_eq!(poll_all(&mut *a, CqKind::Recv), flushed(&[13]));
    assert_eq!(poll_all(&mut *a, CqKind::Send), flushed(&[5]));
    assert_eq!(f.counters().delivered, 1);
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);

    // Packets to a QP in error are dropped and counted.
    let mut c = open(&f, "b");
    let to_a = c.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
    send(&mut *c, to_a, a.attrs().qpn, QKEY, 1, b"to error");
    assert_eq!(f.counters().receiver_in_error, 1);
}

#[test]
fn error_keeps_completions_already_queued() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.post_recv(1, 0).unwrap();
    b.post_recv(2, 1).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"arrived");
    b.set_qp_error().unwrap();
    let rc = poll_all(&mut *b, CqKind::Recv);
    assert_eq!(
        rc.iter().map(|c| (c.wr_id, c.status)).collect::<Vec<_>>(),
        vec![(1, WcStatus::Success), (2, WcStatus::Flushed)]
    );
    assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 7], b"arrived");
}

#[test]
fn held_sends_are_copied_at_post_time_and_run_on_release() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    assert!(!f.hold_sends(9999, true));
    assert!(f.hold_sends(a.attrs().qpn, true));
    send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"original");
    a.send_buf(0)[..8].copy_from_slice(b"mutated!");
    assert!(poll_all(&mut *a, CqKind::Send).is_empty());
    assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
    assert!(f.hold_sends(a.attrs().qpn, false));
    assert_eq!(poll_all(&mut *a, CqKind::Send)[0].wr_id, 1);
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);
    assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 8], b"original");
}

#[test]
fn post_errors() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    assert_eq!(
        invalid_field(&a.post_recv(1, 16).unwrap_err()),
        Some("slot")
    );
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let qpn = b.attrs().qpn;

    // A bad WR in the middle: the prefix is posted, the rest is not.
    let mut chain = [
        wr(1, ah, qpn, QKEY, 1),
        wr(2, ah, qpn, QKEY, 1),
        wr(3, ah, qpn, QKEY, 1),
    ];
    chain[1].slot = 16;
    let e = a.post_send(&chain).unwrap_err();
    assert_eq!(e.posted, 1);
    assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::EINVAL)));
    chain[1].slot = 0;
    chain[2].dest.ah = AhHandle(77);
    let e = a.post_send(&chain).unwrap_err();
    assert_eq!(e.posted, 2);
    assert!(matches!(e.error, VerbsError::UnknownAh(AhHandle(77))));
    assert_eq!(
        poll_all(&mut *a, CqKind::Send)
            .iter()
            .map(|c| c.wr_id)
            .collect::<Vec<_>>(),
        vec![1, 1, 2]
    );

    // AHs: unknown destroy, destroyed handle no longer usable.
    assert!(matches!(
        a.destroy_ah(AhHandle(77)),
        Err(VerbsError::UnknownAh(_))
    ));
    let ah2 = a.create_ah(&Gid::ZERO).unwrap();
    assert_ne!(ah2, ah);
    a.destroy_ah(ah2).unwrap();
    assert!(matches!(a.destroy_ah(ah2), Err(VerbsError::UnknownAh(_))));
    let e = a.post_send(&[wr(9, ah2, qpn, QKEY, 1)]).unwrap_err();
    assert!(matches!(e.error, VerbsError::UnknownAh(_)));

    // Send queue full until completions are polled (16 slots).
    let many: Vec<SendWr> = (0..17).map(|i| wr(i, ah, qpn, QKEY, 1)).collect();
    let e = a.post_send(&many).unwrap_err();
    assert_eq!(e.posted, 16);
    assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::ENOMEM)));
    let e = a.post_send(&many[..1]).unwrap_err();
    assert_eq!(e.posted, 0);
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 16);
    a.post_send(&many[..1]).unwrap();

    // Unsignaled sends hold their entries until a later completion is polled.
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
    let mut quiet = many.clone();
    for w in &mut quiet {
        w.signaled = false;
    }
    a.post_send(&quiet[..15]).unwrap();
    assert!(poll_all(&mut *a, CqKind::Send).is_empty());
    a.post_send(&many[..1]).unwrap();
    assert_eq!(a.post_send(&many[..1]).unwrap_err().posted, 0);
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 1);
    a.post_send(&many[..16]).unwrap();

    // Receive queue full: posted plus completed-but-unpolled.
    for i in 0..16 {
        b.post_recv(i, i as u32).unwrap();
    }
    assert_eq!(
        errno(&b.post_recv(16, 0).unwrap_err()),
        Some(("ibv_post_recv", libc::ENOMEM))
    );
    // Completed receives still count until polled.
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 16);
    a.post_send(&many[..8]).unwrap();
    assert!(b.post_recv(16, 0).is_err());
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 8);
    for i in 0..8 {
        b.post_recv(16 + i, i as u32).unwrap();
    }
    assert!(b.post_recv(24, 0).is_err());
}

#[test]
fn events_fire_once_when_armed_and_wake_mio() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let mut poll = mio::Poll::new().unwrap();
    let mut events = mio::Events::with_capacity(8);
    const CQ: mio::Token = mio::Token(1);
    let fds = watch_with(&mut *b, poll.registry(), CQ, mio::Token(2));
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let qpn = b.attrs().qpn;
    for i in 0..4 {
        b.post_recv(i, i as u32).unwrap();
    }
    let short = Some(Duration::from_millis(50));

    // Unarmed: completion, no event, no wakeup.
    send(&mut *a, ah, qpn, QKEY, 1, b"1");
    poll.poll(&mut events, short).unwrap();
    assert!(events.is_empty());
    assert_eq!(b.take_cq_events().unwrap(), (0, 0));

    // Armed: two completions, one event, one wakeup.
    b.req_notify(CqKind::Recv).unwrap();
    send(&mut *a, ah, qpn, QKEY, 2, b"2");
    send(&mut *a, ah, qpn, QKEY, 3, b"3");
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        events.iter().map(|e| e.token()).collect::<Vec<_>>(),
        vec![CQ]
    );
    assert_eq!(b.take_cq_events().unwrap(), (1, 0));
    assert_eq!(b.take_cq_events().unwrap(), (0, 0));
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 3);

    // The send CQ is armed separately.
    b.req_notify(CqKind::Send).unwrap();
    let to_a = b.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
    send(&mut *b, to_a, a.attrs().qpn, QKEY, 1, b"back");
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(events.iter().count(), 1);
    assert_eq!(b.take_cq_events().unwrap(), (0, 1));

    // Flushes raise events too.
    b.req_notify(CqKind::Recv).unwrap();
    b.set_qp_error().unwrap();
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(events.iter().count(), 1);
    assert_eq!(b.take_cq_events().unwrap(), (1, 0));

    // Unwatched: events still counted, nobody woken.
    unwatch_with(&mut *b, poll.registry(), &fds);
    b.req_notify(CqKind::Recv).unwrap();
    b.post_recv(9, 0).unwrap();
    poll.poll(&mut events, short).unwrap();
    assert!(events.is_empty());
    assert_eq!(b.take_cq_events().unwrap(), (1, 0));
    assert_eq!(b.next_async_event().unwrap(), None);
}

#[test]
fn watch_with_pending_events_wakes_at_once() {
    let f = fabric();
    let mut a = open(&f, "a");
    a.req_notify(CqKind::Recv).unwrap();
    a.set_qp_error().unwrap();
    a.post_recv(1, 0).unwrap();
    let mut poll = mio::Poll::new().unwrap();
    let mut events = mio::Events::with_capacity(8);
    watch_with(&mut *a, poll.registry(), mio::Token(7), mio::Token(8));
    poll.poll(&mut events, Some(Duration::from_secs(5)))
        .unwrap();
    assert_eq!(
        events.iter().map(|e| e.token()).collect::<Vec<_>>(),
        vec![mio::Token(7)]
    );
    assert_eq!(a.take_cq_events().unwrap(), (1, 0));
}

#[test]
fn dropping_endpoints_leaves_nothing_behind() {
    let f = fabric();
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 0, 1));
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let mut c = open(&f, "b");
    for ep in [&mut a, &mut b, &mut c] {
        ep.attach_mcast(&group).unwrap();
        ep.post_recv(1, 0).unwrap();
    }
    let mut poll = mio::Poll::new().unwrap();
    watch_with(&mut *b, poll.registry(), mio::Token(1), mio::Token(2));
    let b_qpn = b.attrs().qpn;
    assert_eq!((f.live_qps(), f.mcast_groups()), (3, 1));
    drop(b);
    assert_eq!(f.live_qps(), 2);
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    send(&mut *a, ah, b_qpn, QKEY, 1, b"gone");
    assert_eq!(f.counters().unknown_dest, 1);
    let m = a.create_ah(&group).unwrap();
    send(&mut *a, m, MULTICAST_QPN, QKEY, 2, b"still a group");
    assert_eq!(f.counters().mcast_delivered, 2);
    drop(a);
    drop(c);
    assert_eq!((f.live_qps(), f.mcast_groups()), (0, 0));
    // Every QP, with its packet buffers, is freed: only the fabric holds the topology.
    let topo = read(&f.inner.topo);
    assert!(topo.qps.is_empty() && topo.groups.is_empty());
    drop(topo);
    let _ = poll.poll(&mut mio::Events::with_capacity(1), Some(Duration::ZERO));
}

#[test]
fn renew_replaces_the_qp_and_keeps_memory_and_handles() {
    let f = fabric();
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 0, 0, 1));
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.attach_mcast(&group).unwrap();
    b.post_recv(7, 3).unwrap();
    b.post_recv(8, 4).unwrap();
    b.send_buf(2)[..4].copy_from_slice(b"kept");
    let to_a = b.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
    let old = b.attrs().qpn;
    // Watched while renewing: the channel hears the new QP.
    let poll = mio::Poll::new().unwrap();
    let fds = watch_with(&mut *b, poll.registry(), mio::Token(1), mio::Token(2));
    assert_eq!((f.opens(), f.endpoint_restarts()), (2, 0));
    b.restart().unwrap();
    assert_eq!(
        (f.opens(), f.endpoint_restarts()),
        (2, 1),
        "no open, one renewal"
    );
    let new = b.attrs().qpn;
    assert!(new > old, "a new QPN: {old} -> {new}");
    assert_eq!(f.live_qps(), 2);
    // The new QP is in the group, the old one is not.
    let members: Vec<u32> = read(&f.inner.topo).groups[&group]
        .iter()
        .map(|m| m.qpn)
        .collect();
    assert_eq!(members, vec![new]);
    b.attach_mcast(&group).unwrap();
    assert_eq!(read(&f.inner.topo).groups[&group].len(), 1, "no-op");
    // The slot memory is the same memory.
    assert_eq!(&b.send_buf(2)[..4], b"kept");
    // What was posted on the old QP never completes (the caller reaps it) ...
    assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
    // ... and the old QPN is gone from the fabric.
    let to_b = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    send(&mut *a, to_b, old, QKEY, 1, b"stale");
    assert_eq!(f.counters().unknown_dest, 1);
    // The new QP works, and the address handle made before the renewal too.
    b.post_recv(9, 0).unwrap();
    b.req_notify(CqKind::Recv).unwrap();
    send(&mut *a, to_b, new, QKEY, 2, b"fresh");
    let got = poll_all(&mut *b, CqKind::Recv);
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].wr_id, got[0].status), (9, WcStatus::Success));
    assert_eq!(
        b.take_cq_events().unwrap(),
        (1, 0),
        "event on the kept channel"
    );
    a.post_recv(1, 0).unwrap();
    send(&mut *b, to_a, a.attrs().qpn, QKEY, 3, b"back");
    assert_eq!(poll_all(&mut *a, CqKind::Recv).len(), 1);
    unwatch_with(&mut *b, poll.registry(), &fds);
}

#[test]
fn renew_refuses_when_the_port_changed() {
    let f = fabric();
    let mut a = open(&f, "a");
    let qpn = a.attrs().qpn;
    f.reconfigure_device("a", Ipv4Addr::new(10, 0, 0, 9), 2048)
        .unwrap();
    assert!(matches!(a.restart(), Err(VerbsError::RenewRefused(_))));
    assert_eq!(a.attrs().qpn, qpn, "nothing changed");
    assert_eq!(f.endpoint_restarts(), 0);
    drop(a);
    assert_eq!(f.live_qps(), 0);
}

#[test]
fn packet_buffers_are_recycled() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let qpn = b.attrs().qpn;
    let mut out = [Completion::EMPTY; 16];
    for round in 0..100u64 {
        for i in 0..16 {
            b.post_recv(round * 16 + i, i as u32).unwrap();
        }
        let chain: Vec<SendWr> = (0..16).map(|i| wr(i, ah, qpn, QKEY, 1500)).collect();
        a.post_send(&chain).unwrap();
        assert_eq!(a.poll_cq(CqKind::Send, &mut out).unwrap(), 16);
        assert_eq!(b.poll_cq(CqKind::Recv, &mut out).unwrap(), 16);
    }
    // Reposting returns the last poll's buffers to the pool: all 16 ever allocated
    // are there, and the pool never grew past its initial capacity.
    b.post_recv(0, 0).unwrap();
    let b_qp = read(&f.inner.topo).qps[&qpn].clone();
    let st = lock(&b_qp.state);
    assert_eq!((st.pool.len(), st.pool.capacity()), (16, 16));
    drop(st);
    assert_eq!(f.counters().delivered, 1600);
}

#[test]
fn two_threads_exchange_100k_packets_without_loss() {
    const PACKETS: u64 = 100_000;
    const RING: u32 = 64;
    let f = fabric();
    let mut c = cfg("a");
    c.recv_slots = RING;
    c.send_slots = RING;
    let a = f.open(&c).unwrap();
    c.device = "b".into();
    let b = f.open(&c).unwrap();
    let (a_qpn, b_qpn) = (a.attrs().qpn, b.attrs().qpn);
    // Credits: a receiver hands one back to its peer for every receive it reposts.
    let (to_a, a_credits) = crossbeam_channel::unbounded::<u32>();
    let (to_b, b_credits) = crossbeam_channel::unbounded::<u32>();

    let run = move |mut ep: Box<dyn Endpoint>,
                    peer: Gid,
                    peer_qpn: u32,
                    credits: crossbeam_channel::Receiver<u32>,
                    give: crossbeam_channel::Sender<u32>| {
        move || {
            let ah = ep.create_ah(&peer).unwrap();
            for slot in 0..RING {
                ep.post_recv(u64::from(slot), slot).unwrap();
            }
            give.send(RING).unwrap();
            let (mut sent, mut received, mut window) = (0u64, 0u64, 0u32);
            let mut out = [Completion::EMPTY; 32];
            let mut send_free: Vec<u32> = (0..RING).collect();
            while sent < PACKETS || received < PACKETS {
                let mut idle = true;
                while let Ok(n) = credits.try_recv() {
                    window += n;
                }
                while sent < PACKETS && window > 0 {
                    let Some(slot) = send_free.pop() else { break };
                    ep.send_buf(slot)[..8].copy_from_slice(&sent.to_be_bytes());
                    ep.post_send(&[SendWr {
                        wr_id: u64::from(slot),
                        slot,
                        len: 8 + (sent % 1000) as u32,
                        dest: Dest {
                            ah,
                            qpn: peer_qpn,
                            qkey: QKEY,
                        },
                        signaled: true,
                    }])
                    .unwrap();
                    sent += 1;
                    window -= 1;
                    idle = false;
                }
                let n = ep.poll_cq(CqKind::Send, &mut out).unwrap();
                for c in &out[..n] {
                    assert_eq!(c.status, WcStatus::Success);
                    send_free.push(c.wr_id as u32);
                }
                let n = ep.poll_cq(CqKind::Recv, &mut out).unwrap();
                for c in &out[..n] {
                    assert_eq!(c.status, WcStatus::Success);
                    let slot = c.wr_id as u32;
                    let buf = ep.recv_buf(slot);
                    let seq = u64::from_be_bytes(buf[GRH_LEN..GRH_LEN + 8].try_into().unwrap());
                    assert_eq!(seq, received, "in order, none lost");
                    assert_eq!(c.byte_len as u64, GRH_LEN as u64 + 8 + seq % 1000);
                    received += 1;
                    ep.post_recv(c.wr_id, slot).unwrap();
                }
                if n > 0 {
                    // The peer may stop caring once it has sent everything.
                    let _ = give.send(n as u32);
                    idle = false;
                }
                if idle {
                    std::thread::yield_now();
                }
            }
            ep
        }
    };
    let ta = std::thread::spawn(run(a, Gid::from_ipv4(B_IP), b_qpn, a_credits, to_b));
    let tb = std::thread::spawn(run(b, Gid::from_ipv4(A_IP), a_qpn, b_credits, to_a));
    let a = ta.join().unwrap();
    let b = tb.join().unwrap();
    let c = f.counters();
    assert_eq!(c.delivered, 2 * PACKETS);
    assert_eq!(SimCounters { delivered: 0, ..c }, SimCounters::default());
    drop((a, b));
    assert_eq!(f.live_qps(), 0);
}
