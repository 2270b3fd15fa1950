//! Opens and deliveries: attributes, refused configurations, QPNs, GRHs, multicast,
//! and the drops a receiver never sees.

use super::*;

#[test]
fn open_attrs_like_rxe() {
    let f = fabric();
    let a = open(&f, "a");
    let at = a.attrs();
    assert_eq!(at.qpn, FIRST_QPN);
    assert_eq!(at.device, "a");
    assert_eq!(at.port, 1);
    assert_eq!(at.gid_index, 1);
    assert_eq!(at.gid, Gid::from_ipv4(A_IP));
    assert_eq!(at.grh_kind, GrhKind::Ipv4);
    assert_eq!(at.max_payload, 4096);
    assert_eq!(at.port_mtu, 4096);
    assert_eq!((at.recv_slots, at.send_slots, at.max_inline), (16, 16, 0));
    assert_eq!(a.recv_buf(0).len(), GRH_LEN + 4096);
    assert_eq!(a.recv_buf(15).len(), GRH_LEN + 4096);
    assert!(a.recv_buf(16).is_empty());

    let mut c = cfg("b");
    c.gid_index = Some(0);
    c.max_payload = Some(1024);
    let mut b = f.open(&c).unwrap();
    let bt = b.attrs().clone();
    assert_eq!(bt.qpn, FIRST_QPN + 1);
    assert_eq!(bt.grh_kind, GrhKind::Ipv6);
    assert_eq!(&bt.gid.0[..2], &[0xfe, 0x80]);
    assert_eq!(bt.gid, f.gids("b").unwrap()[0]);
    assert_eq!(bt.max_payload, 1024);
    assert_eq!(bt.port_mtu, 4096);
    assert_eq!(b.send_buf(0).len(), 1024);
    assert!(b.send_buf(16).is_empty());
    assert_eq!(f.gids("b").unwrap()[1], Gid::from_ipv4(B_IP));
    assert!(f.gids("nope").is_none());
}

#[test]
fn bad_config_is_refused() {
    let f = fabric();
    let mut c = cfg("nope");
    assert!(matches!(open_err(&f, &c), VerbsError::NoDevice(d) if d == "nope"));
    c = cfg("a");
    c.port = 2;
    assert!(matches!(
        open_err(&f, &c),
        VerbsError::BadPort { port: 2, .. }
    ));
    c = cfg("a");
    c.gid_index = Some(2);
    assert!(matches!(open_err(&f, &c), VerbsError::NoGid { .. }));
    for (r, s) in [(0, 16), (16, 0), (MAX_SLOTS + 1, 16), (16, MAX_SLOTS + 1)] {
        c = cfg("a");
        c.recv_slots = r;
        c.send_slots = s;
        let e = open_err(&f, &c);
        assert!(
            matches!(invalid_field(&e), Some("recv_slots" | "send_slots")),
            "{e}"
        );
    }
    for p in [0, 4097] {
        c = cfg("a");
        c.max_payload = Some(p);
        assert_eq!(invalid_field(&open_err(&f, &c)), Some("mtu"));
    }
    for b in [0, 3] {
        c = cfg("a");
        c.banks = b;
        assert_eq!(invalid_field(&open_err(&f, &c)), Some("banks"));
    }
    // Nothing half-opened, and failed opens use no QPN.
    assert_eq!(f.live_qps(), 0);
    assert_eq!(open(&f, "a").attrs().qpn, FIRST_QPN);

    assert_eq!(
        invalid_field(
            &f.add_device("c", Ipv4Addr::new(10, 0, 0, 3), 1500)
                .unwrap_err()
        ),
        Some("mtu")
    );
    assert_eq!(
        invalid_field(
            &f.add_device("a", Ipv4Addr::new(10, 0, 0, 3), 1024)
                .unwrap_err()
        ),
        Some("device")
    );
    assert_eq!(
        invalid_field(&f.add_device("c", A_IP, 1024).unwrap_err()),
        Some("ipv4")
    );
}

#[test]
fn qpns_increase_and_are_never_reused() {
    let f = fabric();
    let mut seen = Vec::new();
    for i in 0..10 {
        let ep = open(&f, if i % 2 == 0 { "a" } else { "b" });
        seen.push(ep.attrs().qpn);
        drop(ep);
    }
    let want: Vec<u32> = (FIRST_QPN..FIRST_QPN + 10).collect();
    assert_eq!(seen, want);
    // Also when an older endpoint is still open.
    let keep = open(&f, "a");
    let next = open(&f, "b");
    assert_eq!(
        (keep.attrs().qpn, next.attrs().qpn),
        (FIRST_QPN + 10, FIRST_QPN + 11)
    );
}

/// Verify a RoCEv2 IPv4 GRH and return nothing; panics with what differs.
fn check_ipv4_grh(grh: &[u8], len: usize, src: Ipv4Addr, dst: Ipv4Addr) {
    assert_eq!(&grh[..20], &[0; 20]);
    let ip = &grh[20..40];
    assert_eq!(ip[0], 0x45);
    assert_eq!(
        u16::from_be_bytes([ip[2], ip[3]]) as usize,
        len + ROCE_V4_OVERHEAD
    );
    assert_eq!(ip[8], 64, "ttl");
    assert_eq!(ip[9], 17, "protocol");
    assert_eq!(&ip[12..16], &src.octets());
    assert_eq!(&ip[16..20], &dst.octets());
    // A correct checksum makes the header sum to 0xffff.
    let mut sum: u32 = ip
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    assert_eq!(sum, 0xffff, "checksum");
}

#[test]
fn unicast_ipv4_grh_and_byte_len() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let b_qpn = b.attrs().qpn;
    for slot in [3, 5] {
        b.post_recv(100 + u64::from(slot), slot).unwrap();
    }
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let p1: Vec<u8> = (0..1000u32).map(|i| i as u8).collect();
    send(&mut *a, ah, b_qpn, QKEY, 7, &p1);
    send(&mut *a, ah, b_qpn, QKEY, 8, b"second");

    assert_eq!(
        poll_all(&mut *a, CqKind::Send),
        vec![
            Completion {
                wr_id: 7,
                ..Completion::EMPTY
            },
            Completion {
                wr_id: 8,
                ..Completion::EMPTY
            }
        ]
    );
    let rc = poll_all(&mut *b, CqKind::Recv);
    let expect = |wr_id, len: usize| Completion {
        wr_id,
        status: WcStatus::Success,
        byte_len: (len + GRH_LEN) as u32,
        src_qp: a.attrs().qpn,
        has_grh: true,
    };
    assert_eq!(rc, vec![expect(103, 1000), expect(105, 6)]);
    let buf = b.recv_buf(3);
    check_ipv4_grh(&buf[..GRH_LEN], 1000, A_IP, B_IP);
    assert_eq!(&buf[GRH_LEN..GRH_LEN + 1000], &p1[..]);
    let buf = b.recv_buf(5);
    check_ipv4_grh(&buf[..GRH_LEN], 6, A_IP, B_IP);
    assert_eq!(&buf[GRH_LEN..GRH_LEN + 6], b"second");
    let c = f.counters();
    assert_eq!(c.delivered, 2);
    assert_eq!(SimCounters { delivered: 0, ..c }, SimCounters::default());
}

#[test]
fn unicast_ipv6_grh() {
    let f = fabric();
    let mut c = cfg("a");
    c.gid_index = Some(0);
    let mut a = f.open(&c).unwrap();
    c.device = "b".into();
    let mut b = f.open(&c).unwrap();
    let (a_gid, b_gid) = (a.attrs().gid, b.attrs().gid);
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&b_gid).unwrap();
    send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"hello ipv6");
    let rc = poll_all(&mut *b, CqKind::Recv);
    assert_eq!(rc.len(), 1);
    assert_eq!(rc[0].byte_len, 50);
    assert!(rc[0].has_grh);
    let g = &b.recv_buf(0)[..GRH_LEN];
    assert_eq!(g[0], 0x60);
    assert_eq!(&g[1..4], &[0, 0, 0]);
    assert_eq!(u16::from_be_bytes([g[4], g[5]]), 10 + 24);
    assert_eq!(g[6], 0x1B);
    assert_eq!(g[7], 64);
    assert_eq!(&g[8..24], &a_gid.0);
    assert_eq!(&g[24..40], &b_gid.0);
    assert_eq!(&b.recv_buf(0)[GRH_LEN..GRH_LEN + 10], b"hello ipv6");
}

#[test]
fn grh_follows_the_receivers_layout() {
    // An IPv4-mapped sender to a link-local receiver: IPv6 layout at the receiver.
    let f = fabric();
    let mut a = open(&f, "a");
    let mut c = cfg("b");
    c.gid_index = Some(0);
    let mut b = f.open(&c).unwrap();
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&b.attrs().gid).unwrap();
    send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"x");
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);
    let g = &b.recv_buf(0)[..GRH_LEN];
    assert_eq!(g[0], 0x60);
    assert_eq!(&g[8..24], &Gid::from_ipv4(A_IP).0);
}

#[test]
fn multicast_reaches_every_member_including_the_sender() {
    let f = fabric();
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 1, 2, 3));
    let mut eps: Vec<Box<dyn Endpoint>> =
        ["a", "b", "b", "a"].iter().map(|d| open(&f, d)).collect();
    for (i, ep) in eps.iter_mut().enumerate() {
        ep.post_recv(10 + i as u64, 0).unwrap();
        ep.post_recv(20 + i as u64, 1).unwrap();
        if i < 3 {
            ep.attach_mcast(&group).unwrap();
            ep.attach_mcast(&group).unwrap(); // idempotent
        }
    }
    assert_eq!(f.mcast_groups(), 1);
    let ah = eps[0].create_ah(&group).unwrap();
    send(&mut *eps[0], ah, MULTICAST_QPN, QKEY, 99, b"to all");
    assert_eq!(poll_all(&mut *eps[0], CqKind::Send).len(), 1);
    let src_qp = eps[0].attrs().qpn;
    for (i, ep) in eps.iter_mut().enumerate() {
        let rc = poll_all(&mut **ep, CqKind::Recv);
        if i < 3 {
            assert_eq!(rc.len(), 1, "member {i} gets exactly one copy");
            assert_eq!(rc[0].wr_id, 10 + i as u64);
            assert_eq!(rc[0].src_qp, src_qp);
            assert_eq!(rc[0].byte_len, 46);
            let own_ip = ep.attrs().gid.as_ipv4().unwrap();
            assert_ne!(own_ip, Ipv4Addr::new(239, 1, 2, 3));
            check_ipv4_grh(
                &ep.recv_buf(0)[..GRH_LEN],
                6,
                A_IP,
                Ipv4Addr::new(239, 1, 2, 3),
            );
            assert_eq!(&ep.recv_buf(0)[GRH_LEN..GRH_LEN + 6], b"to all");
        } else {
            assert!(rc.is_empty(), "non-member got {rc:?}");
        }
    }
    let c = f.counters();
    assert_eq!((c.delivered, c.mcast_delivered), (3, 3));

    // Detach: only the others get the next one; detaching twice is EINVAL.
    eps[1].detach_mcast(&group).unwrap();
    assert_eq!(
        errno(&eps[1].detach_mcast(&group).unwrap_err()),
        Some(("ibv_detach_mcast", libc::EINVAL))
    );
    send(&mut *eps[0], ah, MULTICAST_QPN, QKEY, 100, b"again");
    let got: Vec<usize> = eps
        .iter_mut()
        .map(|ep| poll_all(&mut **ep, CqKind::Recv).len())
        .collect();
    assert_eq!(got, vec![1, 0, 1, 0]);

    // A multicast GID with a unicast QPN, or a group nobody joined, goes nowhere.
    let member_qpn = eps[2].attrs().qpn;
    send(&mut *eps[0], ah, member_qpn, QKEY, 101, b"x");
    let empty = eps[0].create_ah(&"ff12:401b::1".parse().unwrap()).unwrap();
    send(&mut *eps[0], empty, MULTICAST_QPN, QKEY, 102, b"x");
    assert_eq!(f.counters().unknown_dest, 2);

    // Attaching a unicast GID is refused.
    assert_eq!(
        invalid_field(&eps[3].attach_mcast(&Gid::from_ipv4(B_IP)).unwrap_err()),
        Some("mcast gid")
    );
}

#[test]
fn ib_style_multicast_group() {
    let f = fabric();
    let group: Gid = "ff12:401b:ffff::1".parse().unwrap();
    let mut c = cfg("a");
    c.gid_index = Some(0);
    let mut a = f.open(&c).unwrap();
    a.attach_mcast(&group).unwrap();
    a.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&group).unwrap();
    send(&mut *a, ah, MULTICAST_QPN, QKEY, 1, b"loop");
    assert_eq!(poll_all(&mut *a, CqKind::Recv).len(), 1);
    assert_eq!(&a.recv_buf(0)[24..40], &group.0);
}

#[test]
fn qkey_mismatch_is_dropped_and_counted() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let qpn = b.attrs().qpn;
    send(&mut *a, ah, qpn, QKEY + 1, 5, b"wrong key");
    assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
    assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
    assert_eq!(f.counters().qkey_mismatch, 1);
    // The receive is still posted: the next good packet takes it.
    send(&mut *a, ah, qpn, QKEY, 6, b"right key");
    assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].wr_id, 1);
    // High bit set: the sender's own Q_Key is used (equal here).
    b.post_recv(2, 0).unwrap();
    send(&mut *a, ah, qpn, 0x8000_0000, 7, b"qp key");
    assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].wr_id, 2);
    assert_eq!(f.counters().qkey_mismatch, 1);
    assert_eq!(f.counters().delivered, 2);
}

#[test]
fn no_posted_receive_is_dropped_and_counted() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    send(&mut *a, ah, b.attrs().qpn, QKEY, 1, b"nobody home");
    assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
    assert_eq!(f.counters().no_recv_posted, 1);
    b.post_recv(1, 0).unwrap();
    assert!(
        poll_all(&mut *b, CqKind::Recv).is_empty(),
        "not delivered late"
    );
}

#[test]
fn oversize_is_dropped_and_counted() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut c = cfg("b");
    c.max_payload = Some(1000);
    let mut b = f.open(&c).unwrap();
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let qpn = b.attrs().qpn;
    send(&mut *a, ah, qpn, QKEY, 1, &[7; 1001]);
    assert_eq!(poll_all(&mut *a, CqKind::Send)[0].status, WcStatus::Success);
    assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
    assert_eq!(f.counters().oversized, 1);
    send(&mut *a, ah, qpn, QKEY, 2, &[7; 1000]);
    assert_eq!(poll_all(&mut *b, CqKind::Recv)[0].byte_len, 1040);

    // Over the sender's own limit: refused at post time.
    let e = b
        .post_send(&[wr(1, AhHandle(0), qpn, QKEY, 1001)])
        .unwrap_err();
    assert_eq!(e.posted, 0);
    assert_eq!(errno(&e.error), Some(("ibv_post_send", libc::EINVAL)));
}

#[test]
fn unknown_destination_is_dropped_and_counted() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    b.post_recv(1, 0).unwrap();
    let to_b = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    let to_a = a.create_ah(&Gid::from_ipv4(A_IP)).unwrap();
    let nowhere = a
        .create_ah(&Gid::from_ipv4(Ipv4Addr::new(10, 9, 9, 9)))
        .unwrap();
    let b_qpn = b.attrs().qpn;
    send(&mut *a, to_b, 4242, QKEY, 1, b"no such qpn");
    send(&mut *a, to_a, b_qpn, QKEY, 2, b"qp is on the other device");
    send(&mut *a, nowhere, b_qpn, QKEY, 3, b"no such gid");
    assert_eq!(poll_all(&mut *a, CqKind::Send).len(), 3);
    assert_eq!(f.counters().unknown_dest, 3);
    assert!(poll_all(&mut *b, CqKind::Recv).is_empty());
}

#[test]
fn a_send_carries_its_slot_from_the_headroom_on() {
    let f = fabric();
    let mut a = open(&f, "a");
    let mut b = open(&f, "b");
    let max = a.attrs().max_payload as usize;
    assert_eq!(a.send_room(0).len(), SEND_HEADROOM + max + SEND_TAILROOM);
    assert!(a.send_room(16).is_empty());
    // Slot 1's room written whole, slot 0's headroom and tailroom written too: none of it
    // reaches slot 0's send, which is exactly what send_buf(0) holds.
    a.send_room(1).fill(0xee);
    let room = a.send_room(0);
    room.fill(0xaa);
    room[SEND_HEADROOM..SEND_HEADROOM + 5].copy_from_slice(b"slot0");
    assert_eq!(&a.send_buf(0)[..5], b"slot0");
    b.post_recv(1, 0).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(B_IP)).unwrap();
    a.post_send(&[wr(1, ah, b.attrs().qpn, QKEY, max)]).unwrap();
    assert_eq!(poll_all(&mut *b, CqKind::Recv).len(), 1);
    let got = &b.recv_buf(0)[GRH_LEN..GRH_LEN + max];
    assert_eq!(&got[..5], b"slot0");
    assert!(got[5..].iter().all(|&x| x == 0xaa));
}
