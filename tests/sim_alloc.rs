//! Steady-state zero allocation per packet on the simulated fabric.
//!
//! A counting global allocator (its own test binary, so it affects nothing else) counts
//! the allocations this thread makes while packets flow between two warmed-up endpoints
//! through `post_recv`, `post_send` and `poll_cq`: there must be none.

use std::net::Ipv4Addr;

use uipoib::verbs::sim::SimFabric;
use uipoib::verbs::{
    Completion, CqKind, Dest, EndpointConfig, Gid, MULTICAST_QPN, Provider, SendWr,
};

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

const QKEY: u32 = 0x0B1B_0001;
const RING: u32 = 32;

#[test]
fn no_allocation_per_packet_after_warm_up() {
    let f = SimFabric::new();
    let (ip_a, ip_b) = (Ipv4Addr::new(10, 0, 0, 1), Ipv4Addr::new(10, 0, 0, 2));
    f.add_device("a", ip_a, 4096).unwrap();
    f.add_device("b", ip_b, 4096).unwrap();
    let cfg = |device: &str| EndpointConfig {
        device: device.into(),
        port: 1,
        gid_index: None,
        qkey: QKEY,
        recv_slots: RING,
        send_slots: RING,
        max_payload: None,
        banks: 1,
    };
    let mut a = f.open(&cfg("a")).unwrap();
    let mut b = f.open(&cfg("b")).unwrap();
    let group = Gid::from_ipv4(Ipv4Addr::new(239, 1, 1, 1));
    b.attach_mcast(&group).unwrap();
    let ah = a.create_ah(&Gid::from_ipv4(ip_b)).unwrap();
    let mah = a.create_ah(&group).unwrap();
    let b_qpn = b.attrs().qpn;
    let chain: Vec<SendWr> = (0..RING)
        .map(|i| SendWr {
            wr_id: u64::from(i),
            slot: i,
            len: 1400,
            dest: if i % 4 == 0 {
                Dest {
                    ah: mah,
                    qpn: MULTICAST_QPN,
                    qkey: QKEY,
                }
            } else {
                Dest {
                    ah,
                    qpn: b_qpn,
                    qkey: QKEY,
                }
            },
            signaled: true,
        })
        .collect();
    let mut out = [Completion::EMPTY; RING as usize];

    let mut round = |a: &mut dyn uipoib::verbs::Endpoint, b: &mut dyn uipoib::verbs::Endpoint| {
        for slot in 0..RING {
            b.post_recv(u64::from(slot), slot).unwrap();
        }
        a.post_send(&chain).unwrap();
        assert_eq!(a.poll_cq(CqKind::Send, &mut out).unwrap(), RING as usize);
        assert_eq!(b.poll_cq(CqKind::Recv, &mut out).unwrap(), RING as usize);
    };
    for _ in 0..3 {
        round(&mut *a, &mut *b);
    }
    counting_alloc::start();
    for _ in 0..1000 {
        round(&mut *a, &mut *b);
    }
    let allocs = counting_alloc::stop();
    assert_eq!(
        allocs,
        0,
        "allocations while carrying {} packets",
        1000 * RING
    );
    assert_eq!(f.counters().delivered, 1003 * u64::from(RING));
}
