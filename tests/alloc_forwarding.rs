//! Steady-state forwarding allocates nothing per packet.
//!
//! Two [`Interface`]s on the simulated fabric, introduced by ARP, forward IPv4 (and, in a
//! second test, IPv6) both ways
//! (full-MTU packets one way, ACK-sized ones back, as a TCP stream does) through the
//! whole datapath: TAP read, Ethernet → IPoIB, neighbour lookup, the send chain, the
//! ledger, completions, GRH parsing, IPoIB → Ethernet, TAP write, receive re-posting.
//! A counting global allocator (this test binary's own) counts the allocations this
//! thread makes once the pair is warm: there must be none.
//!
//! The harness's TAP double allocates nothing; `allocating_tap_is_caught` runs the same
//! measurement with a TAP that copies every written frame into a new `Vec`, and asserts
//! that the counter sees one allocation per packet: the test can fail.
//!
//! [`Interface`]: uipoib::iface::Interface

#[path = "../benches/support/mod.rs"]
mod support;

use std::time::Instant;

use support::Pair;

#[path = "counting_alloc/mod.rs"]
mod counting_alloc;

#[global_allocator]
static GLOBAL: counting_alloc::Counting = counting_alloc::Counting;

/// Frames per burst from each side (more than one TX batch, less than the send ring).
const BURST: usize = 100;
const WARM_ROUNDS: usize = 20;
const ROUNDS: usize = 200;

/// Forward `rounds` bursts each way; returns (allocations counted, packets delivered).
fn measure(p: &mut Pair, rounds: usize) -> (u64, u64) {
    let now = Instant::now();
    for _ in 0..WARM_ROUNDS {
        p.ta.load(BURST);
        p.a_to_b(now);
        p.tb.load(BURST);
        p.b_to_a(now);
    }
    counting_alloc::start();
    let mut delivered = 0;
    for _ in 0..rounds {
        p.ta.load(BURST);
        delivered += p.a_to_b(now);
        p.tb.load(BURST);
        delivered += p.b_to_a(now);
    }
    (counting_alloc::stop(), delivered)
}

#[test]
fn steady_state_forwarding_allocates_nothing_per_packet() {
    let mut p = Pair::new(4096, false);
    let mtu = p.a.mtu();
    p.set_traffic(mtu, 52);
    let (allocs, delivered) = measure(&mut p, ROUNDS);
    assert_eq!(
        delivered,
        (2 * ROUNDS * BURST) as u64,
        "every packet arrived"
    );
    assert_eq!(
        allocs, 0,
        "{allocs} heap allocations while forwarding {delivered} packets"
    );
    let (sa, sb) = (p.a.stats().snapshot(), p.b.stats().snapshot());
    assert_eq!(sa.drops_total() + sb.drops_total(), 0, "{sa:?} {sb:?}");
    p.a.ledger().check().unwrap();
    p.b.ledger().check().unwrap();
}

#[test]
fn steady_state_ipv6_forwarding_allocates_nothing_per_packet() {
    let mut p = Pair::new(4096, false);
    let mtu = p.a.mtu();
    p.set_traffic6(mtu, 60);
    let (allocs, delivered) = measure(&mut p, ROUNDS);
    assert_eq!(
        delivered,
        (2 * ROUNDS * BURST) as u64,
        "every packet arrived"
    );
    assert_eq!(
        allocs, 0,
        "{allocs} heap allocations while forwarding {delivered} IPv6 packets"
    );
    let (sa, sb) = (p.a.stats().snapshot(), p.b.stats().snapshot());
    assert_eq!(sa.drops_total() + sb.drops_total(), 0, "{sa:?} {sb:?}");
}

#[test]
fn allocating_tap_is_caught() {
    let mut p = Pair::new(4096, true);
    p.set_traffic(1000, 52);
    let (allocs, delivered) = measure(&mut p, 10);
    assert_eq!(delivered, (2 * 10 * BURST) as u64);
    assert!(
        allocs >= delivered,
        "the counter missed allocations: {allocs} counted for {delivered} packets, each of which allocates"
    );
}
