//! Restarts leak nothing: 10,000 back-to-back teardowns and rebuilds of an interface
//! keep file descriptors and memory flat with a balanced ledger every time, both full
//! ones and ones that keep the endpoint and restart its QP and CQs, and 200
//! supervised restarts leave no thread or descriptor behind. The tests of this file run
//! one at a time (they count process-wide resources).

mod common;

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::sup::{A_IP, B_IP, flows, pair};
use common::{fabric, params};
use uipoib::iface::recovery::Policy;
use uipoib::iface::stats::Stats;
use uipoib::iface::{FLUSH_DEADLINE, IfaceConfig, Interface};
use uipoib::runtime::supervisor::Close;
use uipoib::verbs::sim::SimFabric;

static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd")
        .map(|d| d.count())
        .unwrap_or(0)
}

fn rss_kib() -> u64 {
    let s = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = s
        .split_whitespace()
        .nth(1)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    pages * 4
}

/// 10,000 epochs of an interface (16-slot rings, budget 16) beside a peer on one
/// fabric, counted from `base` taken at the 100th: every tenth epoch announces first
/// (sends in flight when it goes down), `restart(sim, iface, p, stats, epoch, i)` closes
/// it and opens the next, whose ledger must check out and whose receive ring must poll.
/// Then nothing may have grown ([`assert_nothing_grew`]) and every QP is closed. Returns
/// the fabric and how many endpoints it had opened once the first epoch was open.
fn ten_thousand_epochs(
    what: &str,
    mut restart: impl FnMut(&SimFabric, Interface, &IfaceConfig, &Arc<Stats>, u16, u32) -> Interface,
) -> (SimFabric, u64) {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let sim = fabric(4096);
    let stats = Arc::new(Stats::default());
    let mut p = params("sim0", "198.18.2.1/24", 16, 16);
    p.budget = 16;
    let peer = common::open(&sim, "sim1", "198.18.2.2/24", 16, 16);
    let tap = common::FakeTap::default();
    let mut iface = Interface::open(&sim, &p, stats.clone(), 1, &mut None).unwrap();
    let opens = sim.opens();
    let mut base = (0, 0);
    for i in 0..10_000u32 {
        if i == 100 {
            base = (fds(), rss_kib());
        }
        // Some traffic in flight when it goes down: sends posted, receives posted.
        if i % 10 == 0 {
            iface.announce(Instant::now());
        }
        let epoch = (i % 60_000 + 2) as u16;
        iface = restart(&sim, iface, &p, &stats, epoch, i);
        assert_eq!(sim.live_qps(), 2, "restart {i}");
        iface.ledger().check().unwrap();
        iface.poll_rx(&tap, Instant::now()).unwrap();
    }
    assert_nothing_grew(what, base, &stats);
    drop(iface.close(FLUSH_DEADLINE));
    drop(peer.close(FLUSH_DEADLINE));
    assert_eq!(sim.live_qps(), 0);
    (sim, opens)
}

#[test]
fn ten_thousand_restarts_leak_nothing() {
    ten_thousand_epochs("10k restarts", |sim, iface, p, stats, epoch, i| {
        let (t, n) = iface.close(FLUSH_DEADLINE);
        t.ledger.unwrap_or_else(|e| panic!("restart {i}: {e}"));
        Interface::open(sim, p, stats.clone(), epoch, &mut Some(n)).unwrap()
    });
}

/// After 10,000 epochs (measured from `base`, taken at the 100th): no file descriptor
/// more, memory within 16 MiB, and the counters conserved across every epoch
/// (posted = completed + flushed + reaped + outstanding), with the 16-slot receive ring
/// posted and the announcements sent.
fn assert_nothing_grew(what: &str, base: (usize, u64), stats: &Stats) {
    let (fd_end, rss_end) = (fds(), rss_kib());
    eprintln!(
        "{what}: fds {} -> {fd_end}, rss {} KiB -> {rss_end} KiB",
        base.0, base.1
    );
    assert_eq!(fd_end, base.0, "file descriptors grew");
    assert!(
        rss_end < base.1 + 16 * 1024,
        "memory grew by {} KiB",
        rss_end - base.1
    );
    let s = stats.snapshot();
    assert!(s.ledger_balanced(), "{}", s.to_text());
    assert_eq!(s.recv_outstanding, 16);
    assert!(s.send_posted >= 1000, "announcements were sent: {s:?}");
}

#[test]
fn ten_thousand_renewals_reuse_the_endpoint_and_leak_nothing() {
    let (sim, opens) = ten_thousand_epochs("10k renewals", |sim, iface, p, stats, epoch, i| {
        let qpn = iface.hw_addr().qpn;
        let (t, n, kept) = iface.close_keeping(FLUSH_DEADLINE, &common::FakeTap::default());
        t.ledger.unwrap_or_else(|e| panic!("restart {i}: {e}"));
        assert!(t.kept, "restart {i}");
        let ep = kept.expect("the endpoint is kept");
        let iface = Interface::open_on(ep, p, stats.clone(), epoch, &mut Some(n)).unwrap();
        assert_ne!(iface.hw_addr().qpn, qpn, "restart {i}: a new QP");
        assert_eq!(sim.mcast_groups(), 1, "restart {i}");
        iface
    });
    // Nothing was opened again: every epoch ran on the first endpoint's memory.
    assert_eq!(sim.opens(), opens);
    assert_eq!(sim.endpoint_restarts(), 10_000);
}

#[test]
fn supervised_restarts_leak_no_threads_or_fds() {
    let _g = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let (_sim, _switch, a, b) = pair(Policy {
        max_restarts: 1_000_000,
        backoff_initial: Duration::from_millis(1),
        backoff_max: Duration::from_millis(1),
        ..Policy::default()
    });
    let threads = || {
        std::fs::read_to_string("/proc/self/status")
            .unwrap_or_default()
            .lines()
            .find(|l| l.starts_with("Threads:"))
            .and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    a.sup().restart();
    a.wait_state("running", 1);
    let (t0, f0) = (threads(), fds());
    for i in 2..=200 {
        a.sup().restart();
        a.wait_state("running", i);
    }
    assert_eq!(threads(), t0, "threads grew");
    assert_eq!(fds(), f0, "file descriptors grew");
    flows(&a, A_IP, &b, B_IP, 7);
    flows(&b, B_IP, &a, A_IP, 8);
    a.end();
    b.end();
}
