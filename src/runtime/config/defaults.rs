//! Every default and limit of the configuration, each with why it is that value.

use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

/// Receive completions handled per poll before the poller yields to TX and other work.
/// 64 is the kernel's NAPI weight for IPoIB: large enough to amortise the arm/re-poll
/// cost, small enough that a receive burst cannot starve the TAP reader.
pub const DEFAULT_BUDGET: u32 = 64;

/// Receive ring size, a power of two (the kernel's IPoIB uses 256 and allows up to 8192).
/// 4096: in the rxe lab (`scripts/perf`, UDP offered at the verbs limit) a 512 ring ran
/// dry while the poller was off the CPU, and rxe dropped 5-20% of the datagrams that
/// reached the receiver (its `rcvd_pkts` above `rdma_recvs`) in every rep of two runs; at
/// 4096 it dropped none in 9 of 10 reps. It absorbs bursts, it cannot make up for a
/// receiver short of CPU (at ~5,600 datagrams/s rxe still dropped 15-35%). TCP did not
/// move measurably. It costs 4096 x (40 + MTU) bytes of registered memory: 17 MiB at a
/// 4096-byte MTU.
pub const DEFAULT_RECV_RING: u32 = 4096;

/// Send ring size: the kernel's IPoIB uses 128; 256 lets one TAP read burst fill a chain.
pub const DEFAULT_SEND_RING: u32 = 256;

/// Completions fetched per `ibv_poll_cq` call. The kernel's IPoIB polls 4 at a time for
/// receive; a larger batch amortises the provider's lock and ring accesses: 16. (In the
/// rxe lab a receiving daemon handled 20-35 completions per poll, two or three calls;
/// rxe's `ibv_poll_cq` reads a ring shared with the kernel.)
pub const DEFAULT_POLL_BATCH: u32 = 16;

/// Frames read from the TAP (and posted as one chain) per turn of the loop. Not binding
/// in the rxe lab: a TCP sender's daemon found 7-9 frames per turn (0.11-0.15 polls per
/// packet, `scripts/perf`), so a larger batch would not lengthen the chains there.
pub const DEFAULT_TX_BATCH: u32 = 32;

/// Busy polling after the last work: off unless asked for (docs/PERFORMANCE.md,
/// "Latency", has what it gains and costs).
pub const DEFAULT_BUSY_POLL: Duration = Duration::ZERO;

/// The longest busy-poll window accepted, in microseconds.
pub const MAX_BUSY_POLL_US: u64 = 100_000;

/// The receive queue's active queue management ([`crate::iface::aqm`]): off by default.
/// At CoDel's 100 ms it cut a TCP flow's round trip through the lab from ~730 to ~90 ms
/// and what a restart loses 2.4-5x, but cut the flow's throughput there by ~40% (the
/// receiver, CPU-bound, lost its batching): docs/PERFORMANCE.md, "The receive queue
/// under TCP, and its AQM".
pub const DEFAULT_RX_AQM: Duration = Duration::ZERO;

/// The poller's nice level while received frames queue up ([`crate::iface::boost`]): -10,
/// as the restart supervisor's (the systemd unit's `LimitNICE=-10` allows both). With
/// [`DEFAULT_POLLER_BATCH`], in the lab's one-vCPU guests, TCP 0.99-1.21 x `ib_send_bw`
/// against 0.78-0.82 without, lossless UDP with 4 MiB buffers 0.78-0.97 against 0.50,
/// `tcp_lat` unchanged; -5 carried TCP 0.77x of -10's: docs/PERFORMANCE.md, "The poller
/// raised while frames queue up".
pub const DEFAULT_RX_BOOST_NICE: Option<i32> = Some(-10);

/// The poller thread under `SCHED_BATCH`: on. Beside `rx-boost-nice` it carried TCP
/// 1.13-1.17x in the same reps (the sender's poller, woken by each frame its application
/// writes, no longer preempts it).
pub const DEFAULT_POLLER_BATCH: bool = true;

/// The longest receive-queue AQM interval accepted, in milliseconds.
pub const MAX_RX_AQM_MS: u64 = 10_000;

/// Most neighbours kept; the least recently seen is evicted beyond this.
pub const DEFAULT_NEIGH_CAPACITY: u32 = 4096;

/// A neighbour not heard from for this long is dropped (re-resolved by ARP on next use).
pub const DEFAULT_NEIGH_MAX_AGE: Duration = Duration::from_secs(300);

/// The Q_Key the kernel's IPoIB uses for its broadcast group.
pub const DEFAULT_QKEY: u32 = 0x0B1B;

/// The broadcast group: an IPv4-mapped multicast GID (what RoCE can carry). 239/8 is the
/// administratively scoped range; the group never leaves the RDMA link.
pub const DEFAULT_GROUP: Ipv4Addr = Ipv4Addr::new(239, 18, 0, 1);

/// TAP offloads on: one read takes up to 64 KiB of a TCP stream (cut into segments here)
/// instead of one MTU. See docs/PERFORMANCE.md for what it changes.
pub const DEFAULT_TAP_OFFLOAD: bool = true;

/// A second bank of receive and send slots, so that a restart after a failed poll posts
/// the new QP's receive ring and announces it before the failed QP is destroyed (the
/// registered memory doubles: 34 MiB at the default rings and a 4096-byte MTU). See
/// docs/PERFORMANCE.md for what it changes.
pub const DEFAULT_SPARE_BANK: bool = true;

/// Rehearse the restart after a failed poll once at start, before the first
/// announcement (the supervisor runs it as `Failure::Rehearsal`): a boot's first restart
/// then does not pay for running its code for the first time. See docs/PERFORMANCE.md.
pub const DEFAULT_REHEARSE_RESTART: bool = true;

/// The restart supervisor's nice level (`None` would run it at the daemon's): on a
/// loaded host a restart gets the CPU before the application and the kernel's threads,
/// at the normal policy. The datapath's threads keep the daemon's level. See
/// docs/PERFORMANCE.md ("The restart supervisor at nice -10").
pub const DEFAULT_RESTART_NICE: Option<i32> = Some(-10);

/// Send-stall watchdog. The kernel's IPoIB uses a 1 s netdev watchdog; emulated lab
/// guests stall for longer than that under load without anything being wrong, so 3 s.
pub const DEFAULT_TX_TIMEOUT: Duration = Duration::from_secs(3);

/// Circuit breaker: this many restarts within [`DEFAULT_RESTART_WINDOW`] declare the
/// interface dead until an operator restart or the device's return.
pub const DEFAULT_RESTART_MAX: u32 = 10;

/// The circuit breaker's window.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// First delay between consecutive failed restart attempts; doubles up to
/// [`DEFAULT_BACKOFF_MAX`]. The first restart after a healthy period is immediate.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(10);

/// Longest delay between restart attempts (and between polls for a returning device).
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Largest IPoIB MTU: a 4096-byte port MTU minus the 4-byte IPoIB header.
pub const MAX_IPOIB_MTU: u32 = 4092;

/// Smallest IPoIB MTU accepted: IPv4 needs 68.
pub const MIN_IPOIB_MTU: u32 = 68;

/// Default control socket for a TAP name.
pub fn default_control_path(tap: &str) -> PathBuf {
    PathBuf::from(format!("/run/uipoib/{tap}.sock"))
}

/// The least MTU IPv6 runs over (RFC 8200 §5); the kernel switches IPv6 off on a link
/// below it, so an interface with IPv6 addresses needs at least this much.
pub const MIN_IPV6_MTU: u32 = 1280;
