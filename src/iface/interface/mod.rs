//! One interface's datapath: an [`Endpoint`], its work-request [`Ledger`], its
//! [`Neighbours`], and the facts of the translation between TAP Ethernet frames and
//! IPoIB (`wire::translate`) applied to them.
//!
//! An [`Interface`] is driven by a caller above it (the runtime's poller): it never reads a
//! clock of its own and never waits. `now` comes in as an argument; where it times its
//! own steps (the open, a teardown's destroy and renewal) it reads the [`Clock`] its
//! caller passes, if any; a teardown's drain is polled one step at a time by a caller
//! that bounds it and naps between polls ([`Closing`]). Every packet that is not carried is counted in
//! [`Stats`] under its [`DropReason`]. An [`Interface`] is moved by value: the poller
//! owns it while it runs, and hands it whole to the supervisor when a poll fails.

mod close;
mod poll_failure;
mod rx;
mod tx;

pub use poll_failure::PollFailurePolicy;
use poll_failure::cq_index;

use close::forget_ahs;
pub use close::{BankReaped, Closed, Closing, DrainStep, KeptEndpoint, PendingBank};

use std::io;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::iface::aqm::RxAqm;
use crate::iface::ledger::{Ledger, Ring, SendMeta};
use crate::iface::neigh::{
    Learned, NEIGH_LISTED, NeighView, Neighbours, REACHABLE_TIME, Seen, Trust,
};
use crate::iface::stats::{self, DropReason, Stats};
use crate::tap::FrameIo;
use crate::verbs::{
    AhHandle, Completion, CqKind, Dest, Endpoint, EndpointConfig, GRH_LEN, Gid, MULTICAST_QPN,
    Provider, RecvWr, SEND_HEADROOM, SendWr, VerbsError, WcStatus,
};
use crate::wire::arp::IpoibArp;
use crate::wire::eth::{self, Mac, mac_for_gid};
use crate::wire::ipoib::{self, IpoibAddr};
use crate::wire::ipv4::Ipv4Cidr;
use crate::wire::ipv6::Ipv6Cidr;
use crate::wire::translate::Addrs6;

/// How long a teardown waits for flush completions after moving the QP to error.
pub const FLUSH_DEADLINE: Duration = Duration::from_millis(200);

/// Receives a restart posts on the kept endpoint before the announcement; the poller
/// posts the rest of the ring as its first act. The peers' traffic reaches the new QP
/// only after the announcement has reached them, and this many receives outlast rxe's
/// fastest UD stream (about 9,400 MTU-sized packets a second here) for 50 ms, while the
/// whole ring (4096 by default) took 0.8-4.2 ms of the restart's window to post.
pub const RESTART_FIRST_FILL: usize = 512;

/// What an interface needs to know besides its endpoint.
#[derive(Clone, Debug)]
pub struct IfaceConfig {
    /// Interface address and subnet.
    pub addr: Ipv4Cidr,
    /// IPv6 addresses besides the link-local one (which comes from the TAP's MAC);
    /// at most [`crate::wire::translate::MAX_ADDR6`].
    pub addr6: Vec<Ipv6Cidr>,
    /// IPoIB MTU (IP packet size); `None`: the port's active MTU minus 4.
    pub mtu: Option<u32>,
    /// Q_Key.
    pub qkey: u32,
    /// Broadcast group.
    pub group: Gid,
    /// Receive completions per poll.
    pub budget: u32,
    /// Completions per `poll_cq` call.
    pub poll_batch: u32,
    /// Frames read from the TAP per turn.
    pub tx_batch: u32,
    /// Endpoint to open.
    pub endpoint: EndpointConfig,
    /// Neighbour table capacity.
    pub neigh_capacity: u32,
    /// Neighbour max age.
    pub neigh_max_age: Duration,
    /// Send-stall watchdog: sends outstanding and no send completion for this long
    /// restarts the interface.
    pub tx_timeout: Duration,
    /// What a failed CQ poll does ([`PollFailurePolicy::Restart`] but in demonstrations).
    pub poll_failure: PollFailurePolicy,
    /// How long the poller keeps polling the CQs and the TAP, without arming or
    /// sleeping, after the last work (zero: never; see [`crate::iface::napi`]).
    pub busy_poll: Duration,
    /// The receive queue's active queue management interval (zero: off; see
    /// [`crate::iface::aqm`]).
    pub rx_aqm: Duration,
    /// The poller's nice level while received frames queue up (`None`: its own; see
    /// [`crate::iface::boost`]).
    pub rx_boost_nice: Option<i32>,
    /// The poller thread runs under `SCHED_BATCH`.
    pub poller_batch: bool,
    /// Where every epoch publishes its neighbour table at housekeeping (for the
    /// control socket's `neigh`); shared by the clones of this configuration.
    pub neigh_view: NeighView,
}

/// A peer being sent to that has been silent this long is re-resolved by ARP (it may
/// have restarted at a new QPN and its announcement been lost).
pub const PEER_SILENT_PROBE: Duration = REACHABLE_TIME;

/// Why an interface could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The device refused.
    #[error(transparent)]
    Verbs(#[from] VerbsError),
    /// The MTU asked for is more than the path carries.
    #[error(
        "invalid mtu: {asked} exceeds what the path can carry (port active MTU {port_mtu} - 4 = {max})"
    )]
    Mtu {
        /// MTU asked for.
        asked: u32,
        /// The port's active MTU.
        port_mtu: u32,
        /// Largest IPoIB MTU.
        max: u32,
    },
}

/// Why an interface was torn down or failed; what the supervisor is told.
#[derive(Debug, thiserror::Error)]
pub enum Failure {
    /// A CQ poll failed. Never retried.
    #[error("completion queue poll failed: {0}")]
    PollFailed(VerbsError),
    /// Another verb failed in a way the datapath cannot continue from.
    #[error("verbs failure: {0}")]
    Verbs(VerbsError),
    /// A fatal asynchronous event.
    #[error("fatal asynchronous event: {0:?}")]
    AsyncFatal(crate::verbs::AsyncEvent),
    /// The poller's own I/O (epoll) failed.
    #[error("poller I/O failed: {0}")]
    Io(io::Error),
    /// Sends outstanding and no send completion for the watchdog's time.
    #[error("send stall: {outstanding} sends outstanding, no send completion for {since:?}")]
    TxStall {
        /// Sends outstanding.
        outstanding: u64,
        /// Time since the last send completion.
        since: Duration,
    },
    /// An operator asked for a restart.
    #[error("operator requested a restart")]
    Operator,
    /// Flush completions outside a teardown: the QP is in the error state (with or
    /// without an async event), and only a rebuild recovers it.
    #[error("the QP is in the error state ({0} work requests flushed)")]
    QpError(u64),
    /// The port's GID table changed and our GID (or its index) with it.
    #[error("our GID changed: {was} when opened, {now} now")]
    GidChanged {
        /// GID and index when the endpoint was opened.
        was: String,
        /// What the endpoint would choose now (`none` when no usable GID is left).
        now: String,
    },
    /// The poller thread panicked; the interface went with it.
    #[error("the poller thread panicked: {0}")]
    PollerPanicked(String),
    /// A new poller could not be started on a rebuilt interface.
    #[error("starting the poller failed: {0}")]
    PollerStart(String),
    /// Not a failure: the restart after a failed poll, rehearsed once at start
    /// (`rehearse-restart`); the interface is handled as after a failed poll.
    #[error("the restart after a failed poll, rehearsed at start")]
    Rehearsal,
}

impl Failure {
    /// Short name of the cause, for status and reports.
    pub fn kind(&self) -> &'static str {
        match self {
            Failure::PollFailed(_) => "poll-failed",
            Failure::Verbs(_) => "verbs-error",
            Failure::AsyncFatal(crate::verbs::AsyncEvent::DeviceRemoved) => "device-removed",
            Failure::AsyncFatal(crate::verbs::AsyncEvent::DeviceFatal) => "device-fatal",
            Failure::AsyncFatal(_) => "async-fatal",
            Failure::Io(_) => "poller-io",
            Failure::TxStall { .. } => "tx-stall",
            Failure::Operator => "operator",
            Failure::QpError(_) => "qp-error",
            Failure::GidChanged { .. } => "gid-changed",
            Failure::PollerPanicked(_) => "poller-panicked",
            Failure::PollerStart(_) => "poller-start",
            Failure::Rehearsal => "rehearsal",
        }
    }

    /// Whether the device itself is gone or broken (close it and wait for it to return).
    pub fn device_lost(&self) -> bool {
        matches!(
            self,
            Failure::AsyncFatal(
                crate::verbs::AsyncEvent::DeviceRemoved | crate::verbs::AsyncEvent::DeviceFatal
            )
        )
    }
}

/// Allows a bounded number of log lines per second (for peer-triggerable messages).
#[derive(Debug)]
pub struct RateLimit {
    window: Option<Instant>,
    used: u32,
    per_sec: u32,
}

impl RateLimit {
    /// At most `per_sec` lines per second.
    pub fn new(per_sec: u32) -> Self {
        RateLimit {
            window: None,
            used: 0,
            per_sec,
        }
    }

    /// Whether a line may be logged now.
    pub fn allow(&mut self, now: Instant) -> bool {
        match self.window {
            Some(w) if now.saturating_duration_since(w) < Duration::from_secs(1) => {}
            _ => {
                self.window = Some(now);
                self.used = 0;
            }
        }
        if self.used < self.per_sec {
            self.used += 1;
            true
        } else {
            false
        }
    }
}

/// The clock a caller hands the interface to time the steps of an open or a teardown
/// (the runtime passes the wall clock, a test may pass a virtual one).
pub type Clock<'a> = &'a dyn Fn() -> Instant;

/// Times steps on the caller's clock; without one every step takes no time.
#[derive(Clone, Copy)]
pub(super) struct Stopwatch<'a>(pub(super) Option<Clock<'a>>);

impl Stopwatch<'_> {
    pub(super) fn mark(&self) -> Option<Instant> {
        self.0.map(|c| c())
    }

    pub(super) fn since(&self, mark: Option<Instant>) -> Duration {
        match (self.0, mark) {
            (Some(c), Some(m)) => c().saturating_duration_since(m),
            _ => Duration::ZERO,
        }
    }
}

/// Where the time of [`Interface::open_timed`] went (all zero after an untimed open).
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenTimes {
    /// Opening the endpoint (device context, PD, memory registration, channel, CQs, QP);
    /// zero for a kept endpoint.
    pub open: Duration,
    /// Creating the broadcast group's address handle.
    pub ah: Duration,
    /// Attaching the QP to the broadcast group (and the IP-level join on RoCE).
    pub attach: Duration,
    /// Posting the receive ring (a restart: its first [`RESTART_FIRST_FILL`]).
    pub fill: Duration,
    /// Receives posted.
    pub posted: usize,
}

/// Where [`Interface::open_timed`] gets its endpoint.
pub enum Origin<'a> {
    /// A new endpoint from the provider, as [`Interface::open`].
    Device(&'a dyn Provider),
    /// The endpoint a teardown kept, as [`Interface::open_on`].
    Kept(KeptEndpoint),
}

/// One interface. See the module docs.
pub struct Interface {
    ep: Box<dyn Endpoint>,
    ledger: Ledger,
    /// The bank of the endpoint's slots this epoch posts from (0 unless a restart
    /// deferred its failed QP's destroy, [`Endpoint::restart_deferring_old`]).
    bank: u32,
    /// The caller allows a restart after a failed poll to leave this epoch's bank to its
    /// QP and open the next on the other bank ([`Interface::allow_deferred_reap`]).
    other_bank_free: bool,
    neigh: Neighbours,
    stats: Arc<Stats>,
    addr: Ipv4Cidr,
    addr6: Addrs6,
    mtu: usize,
    qkey: u32,
    group: Gid,
    group_ah: AhHandle,
    group_attached: bool,
    own_hw: IpoibAddr,
    own_mac: Mac,
    budget: usize,
    poll_batch: usize,
    tx_batch: usize,
    wc: Vec<Completion>,
    frame: Vec<u8>,
    chain: Vec<SendWr>,
    chain_meta: Vec<SendMeta>,
    /// Receives to post as one chain (capacity: the receive ring).
    recv_chain: Vec<RecvWr>,
    destroy: Vec<AhHandle>,
    probe: Vec<IpAddr>,
    log: RateLimit,
    tx_timeout: Duration,
    busy_poll: Duration,
    rx_boost_nice: Option<i32>,
    poller_batch: bool,
    /// The receive queue's CoDel state.
    aqm: RxAqm,
    /// Set while `close` drains flushes (expected then).
    draining: bool,
    /// Set when a `poll_cq` of this epoch failed (or a post left unknown what was posted,
    /// or the QP could not be moved to the error state): no CQ of this epoch is polled again (not even by the teardown's drain),
    /// and the QP is destroyed before anything it may own is reaped or re-posted.
    untrusted: bool,
    /// This epoch has announced its address (gratuitous ARP, unsolicited advertisements).
    announced: bool,
    /// A verb failed in a way that leaves the ledger unsure of what was posted (a
    /// `bad_wr` outside the chain): the next call from the poller hands over.
    broken: Option<VerbsError>,
    /// Flush completions seen outside a teardown since the last check.
    unexpected_flushes: u64,
    /// Where the time of this epoch's open went.
    open_times: OpenTimes,
    /// What a failed poll does.
    poll_failure: PollFailurePolicy,
    /// Per CQ (receive, send): left by `skip` after a failed poll, not polled or armed
    /// until an event for it arrives.
    parked: [bool; 2],
    /// Per CQ: armed and no event taken since.
    armed: [bool; 2],
    /// Per ring: its QP completes into a CQ nothing polls (`recreate-cq`).
    stranded: [bool; 2],
    /// `retry`: a failed poll asks to be polled again at once.
    retry_due: bool,
    /// Where the neighbour table is published.
    neigh_view: NeighView,
}

impl Interface {
    /// Open the endpoint, join the broadcast group and post the receive ring.
    /// `neigh` carries the neighbour table over from a previous epoch (its AHs were
    /// destroyed with that epoch's endpoint).
    pub fn open(
        provider: &dyn Provider,
        p: &IfaceConfig,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
    ) -> Result<Interface, OpenError> {
        Self::open_timed(Origin::Device(provider), p, stats, epoch, neigh, None)
    }

    /// Like [`Interface::open`] on an endpoint kept from the previous epoch by a
    /// teardown ([`Closing::finish`] with `keep`: its QP and CQs are new; context, PD,
    /// memory and channel are the old ones), with the neighbour table that teardown
    /// returned (whose address handles live on that endpoint). On failure the endpoint
    /// is closed and the table forgets its AHs.
    pub fn open_on(
        kept: KeptEndpoint,
        p: &IfaceConfig,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
    ) -> Result<Interface, OpenError> {
        Self::open_timed(Origin::Kept(kept), p, stats, epoch, neigh, None)
    }

    /// [`Interface::open`] or [`Interface::open_on`], as `origin` says, its steps timed
    /// on `clock` when given ([`Interface::open_times`]).
    pub fn open_timed(
        origin: Origin<'_>,
        p: &IfaceConfig,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
        clock: Option<Clock<'_>>,
    ) -> Result<Interface, OpenError> {
        let watch = Stopwatch(clock);
        match origin {
            Origin::Device(provider) => {
                let start = watch.mark();
                let ep = provider.open(&p.endpoint)?;
                let opened = watch.since(start);
                Self::on_endpoint(ep, None, opened, p, stats, epoch, neigh, watch)
            }
            Origin::Kept(mut kept) => {
                let st = stats.clone();
                if let Some(p) = kept.take_pending() {
                    // The caller left the failed QP's bank here: it is reaped before
                    // anything else opens on this endpoint.
                    p.reap_waiting();
                }
                let r = Self::on_endpoint(
                    kept.ep,
                    Some((kept.group_ah, kept.bank)),
                    Duration::ZERO,
                    p,
                    stats,
                    epoch,
                    neigh,
                    watch,
                );
                if r.is_err() {
                    // The endpoint was closed with its AHs; the neighbours still name
                    // theirs unless the table went with a failed epoch.
                    forget_ahs(neigh.as_mut(), &st);
                }
                r
            }
        }
    }

    /// Where the time of this epoch's open went.
    pub fn open_times(&self) -> OpenTimes {
        self.open_times
    }

    #[allow(clippy::too_many_arguments)]
    fn on_endpoint(
        mut ep: Box<dyn Endpoint>,
        kept: Option<(AhHandle, u32)>,
        opened: Duration,
        p: &IfaceConfig,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
        watch: Stopwatch<'_>,
    ) -> Result<Interface, OpenError> {
        let on_kept = kept.is_some();
        let (group_ah, bank) = match kept {
            Some((ah, bank)) => (Some(ah), bank),
            None => (None, 0),
        };
        let mut times = OpenTimes {
            open: opened,
            ..OpenTimes::default()
        };
        let a = ep.attrs().clone();
        let max_mtu = a.max_payload.saturating_sub(ipoib::HEADER_LEN as u32);
        let mtu = match p.mtu {
            Some(m) if m > max_mtu => {
                return Err(OpenError::Mtu {
                    asked: m,
                    port_mtu: a.port_mtu,
                    max: a.port_mtu.saturating_sub(4),
                });
            }
            Some(m) => m,
            None => max_mtu,
        };
        let t = watch.mark();
        let group_ah = match group_ah {
            Some(ah) => ah,
            None => {
                let ah = ep.create_ah(&p.group)?;
                stats::add(&stats.ah_created, 1);
                ah
            }
        };
        times.ah = watch.since(t);
        let t = watch.mark();
        ep.attach_mcast(&p.group)?;
        times.attach = watch.since(t);
        let own_hw = IpoibAddr::new(a.qpn, a.gid);
        let mut iface = Interface {
            ledger: Ledger::in_bank(epoch, a.recv_slots, a.send_slots, bank),
            bank,
            other_bank_free: false,
            neigh: neigh
                .take()
                .unwrap_or_else(|| Neighbours::new(p.neigh_capacity as usize, p.neigh_max_age)),
            stats,
            addr: p.addr,
            addr6: Addrs6::new(mac_for_gid(&a.gid), &p.addr6),
            mtu: mtu as usize,
            qkey: p.qkey,
            group: p.group,
            group_ah,
            group_attached: true,
            own_hw,
            own_mac: mac_for_gid(&a.gid),
            budget: p.budget as usize,
            poll_batch: p.poll_batch.max(1) as usize,
            tx_batch: p.tx_batch.max(1) as usize,
            wc: vec![Completion::EMPTY; (p.poll_batch.max(1) as usize).max(a.send_slots as usize)],
            frame: vec![0; eth::HEADER_LEN + mtu as usize + 64],
            chain: Vec::with_capacity(a.send_slots as usize),
            chain_meta: Vec::with_capacity(a.send_slots as usize),
            recv_chain: Vec::with_capacity(a.recv_slots as usize),
            destroy: Vec::new(),
            probe: Vec::new(),
            log: RateLimit::new(10),
            tx_timeout: p.tx_timeout,
            busy_poll: p.busy_poll,
            rx_boost_nice: p.rx_boost_nice,
            poller_batch: p.poller_batch,
            aqm: RxAqm::new(p.rx_aqm),
            draining: false,
            untrusted: false,
            announced: false,
            broken: None,
            unexpected_flushes: 0,
            open_times: times,
            poll_failure: p.poll_failure,
            parked: [false; 2],
            armed: [false; 2],
            stranded: [false; 2],
            retry_due: false,
            neigh_view: p.neigh_view.clone(),
            ep,
        };
        stats::set(&iface.stats.qpn, u64::from(a.qpn));
        stats::set(&iface.stats.mtu, mtu as u64);
        stats::set(&iface.stats.recv_ring, u64::from(a.recv_slots));
        stats::set(&iface.stats.send_ring, u64::from(a.send_slots));
        let t = watch.mark();
        // A restart posts a first chunk: the rest waits for the poller, after the
        // announcement (a fresh open posts the whole ring: no peer waits for it).
        let first = if on_kept {
            RESTART_FIRST_FILL
        } else {
            usize::MAX
        };
        match iface.post_recv_up_to(first) {
            Ok(n) => iface.open_times.posted = n,
            Err(e) => {
                // Receives posted before the failure are reaped with the endpoint.
                let _ = iface.begin_close().finish(None, false, None);
                return Err(e.into());
            }
        }
        iface.open_times.fill = watch.since(t);
        iface.sync_gauges();
        iface.sync_loss_gauges();
        if on_kept {
            // On a kept endpoint: the supervisor's summary line follows.
            tracing::debug!(qpn = a.qpn, epoch, "interface open on the kept endpoint");
        } else {
            tracing::info!(
                device = %a.device, port = a.port, qpn = a.qpn, gid = %a.gid, gid_index = a.gid_index,
                mtu, port_mtu = a.port_mtu, group = %p.group, epoch,
                "interface open"
            );
        }
        Ok(iface)
    }

    /// The endpoint (for registration with the poller).
    pub fn endpoint_mut(&mut self) -> &mut dyn Endpoint {
        self.ep.as_mut()
    }

    /// Own IPoIB address (QPN + GID).
    pub fn hw_addr(&self) -> IpoibAddr {
        self.own_hw
    }

    /// The MAC the TAP must carry.
    pub fn mac(&self) -> Mac {
        self.own_mac
    }

    /// The IPoIB MTU (the TAP's MTU).
    pub fn mtu(&self) -> usize {
        self.mtu
    }

    /// Receive completions per poll.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// The busy-poll window (zero: off).
    pub fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    /// The poller's nice level while received frames queue up (`None`: its own).
    pub fn rx_boost_nice(&self) -> Option<i32> {
        self.rx_boost_nice
    }

    /// Whether the poller thread runs under `SCHED_BATCH`.
    pub fn poller_batch(&self) -> bool {
        self.poller_batch
    }

    /// Counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
    }

    /// Handle this epoch as after a failed poll from now on (nothing of its CQs is
    /// polled again; its QP is destroyed before its slots are reaped): for the restart
    /// rehearsed at start, which must take the failed poll's path.
    pub fn give_up(&mut self) {
        self.untrusted = true;
    }

    /// Let a teardown after a failed poll (keeping the endpoint, which has two banks of
    /// slots) leave this epoch's work requests to its QP and open the next epoch on the
    /// other bank: the QP is destroyed and its work requests reaped after the next epoch
    /// runs, by whoever takes the [`PendingBank`] ([`KeptEndpoint::take_pending`]). Only
    /// when the other bank is free, that is when no earlier [`PendingBank`] of this
    /// endpoint is still waiting. Off unless allowed.
    pub fn allow_deferred_reap(&mut self, allow: bool) {
        self.other_bank_free = allow;
    }

    /// The bank of slots this epoch posts from.
    pub fn bank(&self) -> u32 {
        self.bank
    }

    /// The ledger (for checks).
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// The neighbour table.
    pub fn neighbours(&self) -> &Neighbours {
        &self.neigh
    }

    /// Free send slots.
    pub fn free_send_slots(&self) -> usize {
        self.ledger.free_send()
    }

    fn sync_gauges(&self) {
        let s = &self.stats;
        stats::set(
            &s.recv_outstanding,
            self.ledger.totals(Ring::Recv).outstanding,
        );
        stats::set(
            &s.send_outstanding,
            self.ledger.totals(Ring::Send).outstanding,
        );
        stats::set(&s.neigh_entries, self.neigh.len() as u64);
    }

    /// Publish a copy of the neighbour table (at housekeeping only: it allocates).
    fn publish_neigh(&self, now: Instant) {
        self.neigh_view
            .publish(self.neigh.snapshot(now, NEIGH_LISTED));
    }

    /// The never-completing gauges (a scan of both rings: at open and in housekeeping,
    /// never per poll).
    fn sync_loss_gauges(&self) {
        let [recv, send] = self.never_completing();
        stats::set(&self.stats.recv_never_complete, recv);
        stats::set(&self.stats.send_never_complete, send);
    }

    /// Post every free receive slot, as one chain (one `ibv_post_recv`).
    pub fn fill_recv(&mut self) -> Result<usize, VerbsError> {
        self.post_recv_up_to(usize::MAX)
    }

    /// Post up to `limit` free receive slots, as one chain.
    fn post_recv_up_to(&mut self, limit: usize) -> Result<usize, VerbsError> {
        self.recv_chain.clear();
        let limit = limit.min(self.recv_chain.capacity());
        while self.recv_chain.len() < limit
            && let Some(slot) = self.ledger.reserve_recv()
        {
            let wr_id = self.ledger.wr_id(Ring::Recv, slot);
            self.recv_chain.push(RecvWr { wr_id, slot });
        }
        if self.recv_chain.is_empty() {
            return Ok(0);
        }
        let res = self.ep.post_recv_chain(&self.recv_chain);
        let n = match &res {
            Ok(()) => self.recv_chain.len(),
            Err(e) => e.posted.min(self.recv_chain.len()),
        };
        for w in &self.recv_chain[..n] {
            self.ledger.posted_recv(w.slot);
        }
        // Not posted: back to free.
        for w in &self.recv_chain[n..] {
            self.ledger.release(Ring::Recv, w.slot);
        }
        self.recv_chain.clear();
        // What was posted before a failure is in the ledger: count it too.
        stats::add(&self.stats.recv_posted, n as u64);
        res.map(|()| n).map_err(|e| e.error)
    }

    /// Periodic work: age neighbours and destroy their idle AHs, re-resolve peers that
    /// went silent while in use, and run the send-stall watchdog.
    pub fn housekeeping(&mut self, now: Instant) -> Result<(), Failure> {
        // Reap what has completed since the last poll, so that the watchdog below measures
        // from a send still outstanding, not from one whose completion waits unpolled.
        self.poll_tx(now)?;
        // The next restart's QP and CQs are made ahead (a failure is counted; it does not
        // stop the datapath, and a renewal makes what is missing). The previous epoch's
        // are destroyed by the supervisor's reaper thread, never here: a destroy can
        // block for a second.
        if let Err(e) = self.ep.prepare_spare() {
            stats::add(&self.stats.teardown_errors, 1);
            tracing::warn!(error = %e, "endpoint maintenance (retired or spare QP and CQs) failed");
        }
        let before = self.neigh.evicted();
        self.neigh.expire(now, &mut self.destroy);
        stats::add(&self.stats.neigh_evicted, self.neigh.evicted() - before);
        self.release_ahs();
        let mut probe = std::mem::take(&mut self.probe);
        self.neigh
            .silent_in_use(now, PEER_SILENT_PROBE, PEER_SILENT_PROBE, &mut probe);
        for ip in probe.drain(..) {
            self.resolve(ip, now);
        }
        self.probe = probe;
        self.flush_chain(now);
        self.check_broken()?;
        self.sync_gauges();
        self.sync_loss_gauges();
        self.publish_neigh(now);
        // The watchdog measures from the oldest send still outstanding, so one lost
        // completion is caught even while other sends keep completing.
        let outstanding = self.ledger.totals(Ring::Send).outstanding;
        if let Some(oldest) = self.ledger.oldest_send()
            && now.saturating_duration_since(oldest) >= self.tx_timeout
        {
            return Err(Failure::TxStall {
                outstanding,
                since: now.saturating_duration_since(oldest),
            });
        }
        Ok(())
    }

    /// Whether a `poll_cq` of this epoch failed or the QP can otherwise not be trusted to
    /// have finished with its slots (then none of its CQs is polled again, and the QP is
    /// destroyed before its work requests are reaped).
    pub fn untrusted(&self) -> bool {
        self.untrusted
    }

    /// The one place that calls `poll_cq`. After a failed poll it refuses, so nothing of
    /// this epoch can poll again.
    fn poll(&mut self, cq: CqKind, want: usize) -> Result<usize, Failure> {
        if self.untrusted {
            return Err(Failure::PollFailed(VerbsError::PollFailed { cq, ret: 0 }));
        }
        if self.parked[cq_index(cq)] {
            return Ok(0);
        }
        match self.ep.poll_cq(cq, &mut self.wc[..want]) {
            Ok(n) => Ok(n),
            Err(e) => self.on_poll_failure(cq, e),
        }
    }

    fn outstanding(&self) -> u64 {
        self.ledger.totals(Ring::Recv).outstanding + self.ledger.totals(Ring::Send).outstanding
    }
}
