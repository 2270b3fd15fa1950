//! The neighbour table at 10, 1,000 and 100,000 entries (criterion).
//!
//! - `by_mac`: the TX path's lookup (destination MAC → peer, QPN, AH);
//! - `by_ip`: IPv4 address → peer (ARP handling, re-resolution);
//! - `seen`: the RX path's refresh from a received packet's GRH and source QPN;
//! - `learn`: an ARP message from a known peer (refresh, IP re-bound).
//!
//! Keys are drawn in a fixed pseudo-random order over every entry, so large tables are
//! measured with cache misses, not with one hot entry.

#[path = "support/short.rs"]
mod short;

use std::hint::black_box;
use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use uipoib::iface::neigh::{Neighbours, Trust};
use uipoib::verbs::{AhHandle, Gid};
use uipoib::wire::eth::Mac;
use uipoib::wire::ipoib::IpoibAddr;

const SIZES: [usize; 3] = [10, 1_000, 100_000];
/// Lookups per key sequence (the sequence repeats).
const KEYS: usize = 4096;

/// Entry `i`: a GID in 198.18.0.0/15 (131,072 addresses) and an IP in 198.18.0.0/15.
fn entry(i: usize) -> (Ipv4Addr, IpoibAddr) {
    let base = u32::from(Ipv4Addr::new(198, 18, 0, 0));
    let a = Ipv4Addr::from(base + i as u32);
    (a, IpoibAddr::new(17 + (i as u32 % 1000), Gid::from_ipv4(a)))
}

fn table(n: usize) -> (Neighbours, Vec<(Ipv4Addr, IpoibAddr, Mac)>) {
    let now = Instant::now();
    let mut t = Neighbours::new(n, Duration::from_secs(3600));
    let mut destroy = Vec::new();
    let mut all = Vec::with_capacity(n);
    for i in 0..n {
        let (ip, hw) = entry(i);
        let (mac, _) = t.learn(Some(ip), hw, Trust::Create, now, &mut destroy);
        t.set_ah(&mac, AhHandle(i as u32));
        all.push((ip, hw, mac));
    }
    assert_eq!(t.len(), n);
    assert!(destroy.is_empty());
    // A fixed pseudo-random order (xorshift) over the entries.
    let mut x: u64 = 0x9E37_79B9_7F4A_7C15;
    let keys = (0..KEYS)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            all[(x % n as u64) as usize]
        })
        .collect();
    (t, keys)
}

fn bench_neigh(c: &mut Criterion) {
    let mut g = c.benchmark_group("neigh");
    g.throughput(Throughput::Elements(1));
    for n in SIZES {
        let (mut t, keys) = table(n);
        let now = Instant::now();
        let mut i = 0usize;
        let mut next = || {
            i = (i + 1) % KEYS;
            keys[i]
        };
        g.bench_with_input(BenchmarkId::new("by_mac", n), &n, |b, _| {
            b.iter(|| {
                let (_, _, mac) = next();
                t.by_mac(black_box(&mac)).map(|p| p.hw.qpn)
            })
        });
        g.bench_with_input(BenchmarkId::new("by_ip", n), &n, |b, _| {
            b.iter(|| {
                let (ip, _, _) = next();
                t.by_ip(black_box(ip)).map(|(m, _)| m)
            })
        });
        g.bench_with_input(BenchmarkId::new("seen", n), &n, |b, _| {
            b.iter(|| {
                let (_, hw, _) = next();
                t.seen(black_box(hw), now)
            })
        });
        let mut destroy = Vec::new();
        g.bench_with_input(BenchmarkId::new("learn", n), &n, |b, _| {
            b.iter(|| {
                let (ip, hw, _) = next();
                t.learn(Some(black_box(ip)), hw, Trust::Create, now, &mut destroy)
                    .1
            })
        });
        assert_eq!(t.len(), n);
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = short::short();
    targets = bench_neigh
}
criterion_main!(benches);
