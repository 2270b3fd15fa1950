//! Per-packet cost of the datapath on the simulated fabric (criterion).
//!
//! Two interfaces with the daemon's default budget, rings and batches, introduced by
//! ARP, on a port MTU of 4096 (IPoIB MTU 4092) — the lab's configuration. One
//! criterion iteration is one packet; packets move in bursts of [`BURST`].
//!
//! - `tx/<len>`: A's send side alone: TAP read, Ethernet → IPoIB, neighbour lookup, the
//!   chain of sends posted with one call, the ledger, reaping send completions. The
//!   simulated fabric delivers while posting, so its copy into B's receive queue is
//!   included; B's receive side runs outside the timed part.
//! - `rx/<len>`: B's receive side alone: polling the receive CQ in batches, GRH and IPoIB
//!   parsing, neighbour refresh, IPoIB → Ethernet, TAP write, re-posting the ring.
//! - `forward/<len>`: both, one way.
//!
//! `<len>` is the IP packet: 52 (a TCP ACK), 1500, 4092 (a full IPoIB MTU).
//! The TAP double copies a template frame in and counts frames out; the simulated
//! fabric copies each packet twice (into its pool, then into the receive slot). What a
//! real TAP or device costs is not here: see `scripts/perf` and docs/PERFORMANCE.md.

mod support;

use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use support::Pair;

/// Packets per burst (more than one TX batch, less than the send ring).
const BURST: u64 = 128;
const LENS: [usize; 3] = [52, 1500, 4092];

/// The lab's pair of interfaces, A sending IP packets of `len` bytes to B.
fn pair(len: usize) -> Pair {
    let mut p = Pair::new(4096, false);
    p.set_traffic(len, 52);
    p
}

/// Move `iters` packets in bursts of at most [`BURST`]: `burst(p, n)` moves `n` and
/// says how long its timed part took; the sum is the measurement.
fn in_bursts(
    p: &mut Pair,
    iters: u64,
    mut burst: impl FnMut(&mut Pair, u64) -> Duration,
) -> Duration {
    let mut spent = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(BURST);
        spent += burst(p, n);
        left -= n;
    }
    spent
}

fn bench_paths(c: &mut Criterion) {
    let mut g = c.benchmark_group("datapath");
    for len in LENS {
        g.throughput(Throughput::Elements(1));
        g.bench_with_input(BenchmarkId::new("tx", len), &len, |bch, &len| {
            let mut p = pair(len);
            bch.iter_custom(|iters| {
                let now = Instant::now();
                in_bursts(&mut p, iters, |p, n| {
                    p.ta.load(n as usize);
                    let t = Instant::now();
                    p.a_tx(now);
                    let spent = t.elapsed();
                    p.b_rx(now);
                    spent
                })
            });
        });
        g.bench_with_input(BenchmarkId::new("rx", len), &len, |bch, &len| {
            let mut p = pair(len);
            bch.iter_custom(|iters| {
                let now = Instant::now();
                in_bursts(&mut p, iters, |p, n| {
                    p.ta.load(n as usize);
                    p.a_tx(now);
                    let t = Instant::now();
                    let got = p.b_rx(now);
                    let spent = t.elapsed();
                    assert_eq!(got as u64, n, "every packet arrived");
                    spent
                })
            });
        });
        g.bench_with_input(BenchmarkId::new("forward", len), &len, |bch, &len| {
            let mut p = pair(len);
            bch.iter_custom(|iters| {
                let now = Instant::now();
                in_bursts(&mut p, iters, |p, n| {
                    let t = Instant::now();
                    p.ta.load(n as usize);
                    p.a_to_b(now);
                    t.elapsed()
                })
            });
        });
    }
    g.finish();
}

criterion_group! {
    name = benches;
    config = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .sample_size(30);
    targets = bench_paths
}
criterion_main!(benches);
