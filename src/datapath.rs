//! One interface's datapath: an [`Endpoint`], its work-request [`Ledger`], its
//! [`Neighbours`] and the translation between TAP Ethernet frames and IPoIB.
//!
//! An [`Interface`] is driven by the poller (`crate::poller`): it never reads a clock or
//! waits; `now` comes in as an argument. Every packet that is not carried is counted in
//! [`Stats`] under its [`DropReason`]. An [`Interface`] is moved by value: the poller
//! owns it while it runs, and hands it whole to the supervisor when a poll fails.

use std::io;
use std::net::Ipv4Addr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::{Config, Ipv4Cidr};
use crate::ledger::{Ledger, Ring, SendMeta};
use crate::neigh::{Learned, Neighbours, Seen, Trust};
use crate::stats::{self, DropReason, Stats};
use crate::verbs::{
    AhHandle, Completion, CqKind, Dest, Endpoint, EndpointConfig, GRH_LEN, Gid, MULTICAST_QPN,
    Provider, RecvWr, SendWr, VerbsError, WcStatus,
};
use crate::wire::arp::{self, EthArp, IpoibArp};
use crate::wire::eth::{self, EthHeader, Mac, mac_for_gid, multicast_mac};
use crate::wire::ipoib::{self, IpoibAddr};
use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, WireError, grh, ipv4};

/// How long a teardown waits for flush completions after moving the QP to error.
pub const FLUSH_DEADLINE: Duration = Duration::from_millis(200);

/// How long a teardown sleeps when a drain poll finds no flush completion yet (rxe
/// generates them in the kernel after the QP went to error). Was 1 ms; a restart's
/// drain takes 2-4 ms in the lab, so a finer nap notices the flushes sooner.
const DRAIN_NAP: Duration = Duration::from_micros(200);

/// Frames in and out of the TAP. Implemented by the real TAP device and by test doubles.
pub trait FrameIo: Send + Sync {
    /// Read one Ethernet frame; `WouldBlock` when none is waiting.
    fn read_frame(&self, buf: &mut [u8]) -> io::Result<usize>;
    /// Write one Ethernet frame (a TAP with offloads may hold it back to join it with the
    /// next ones, until [`FrameIo::flush`]).
    fn write_frame(&self, frame: &[u8]) -> io::Result<usize>;
    /// Write out the frames held back; returns how many frames, since the last call, were
    /// accepted by `write_frame` but then could not be written.
    fn flush(&self) -> usize {
        0
    }
}

/// What an interface needs to know besides its endpoint.
#[derive(Clone, Debug)]
pub struct Params {
    /// Interface address and subnet.
    pub addr: Ipv4Cidr,
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
}

/// A peer being sent to that has been silent this long is re-resolved by ARP (it may
/// have restarted at a new QPN and its announcement been lost).
pub const PEER_SILENT_PROBE: Duration = Duration::from_secs(3);

impl Params {
    /// Parameters from a validated configuration.
    pub fn from_config(c: &Config) -> Params {
        Params {
            addr: c.addr,
            mtu: c.mtu,
            qkey: c.qkey,
            group: c.group,
            budget: c.budget,
            poll_batch: c.poll_batch,
            tx_batch: c.tx_batch,
            endpoint: EndpointConfig {
                device: c.device.clone(),
                port: c.port,
                gid_index: c.gid_index,
                qkey: c.qkey,
                recv_slots: c.recv_ring,
                send_slots: c.send_ring,
                max_payload: c.mtu.map(|m| m + ipoib::HEADER_LEN as u32),
            },
            neigh_capacity: c.neigh_capacity,
            neigh_max_age: c.neigh_max_age,
            tx_timeout: c.tx_timeout,
        }
    }
}

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

/// What a teardown found.
#[derive(Debug, Clone)]
pub struct Teardown {
    /// Work requests reaped (their completion never came).
    pub reaped: u64,
    /// Of those, sends (each counted as a drop with reason `reaped`).
    pub sends_reaped: u64,
    /// Flush completions drained before the deadline.
    pub flushed: u64,
    /// Time spent moving the QP to error and draining flushes.
    pub drain: Duration,
    /// Time spent detaching and destroying the verbs objects.
    pub destroy: Duration,
    /// Destroy calls that failed.
    pub errors: u64,
    /// The ledger's verdict after the reap.
    pub ledger: Result<(), String>,
    /// Whether the endpoint was kept for the next epoch ([`Interface::recycle`] with
    /// [`Endpoint::renew`] working): only its QP and CQs were replaced. Of `destroy`,
    /// `renew` was spent replacing them.
    pub kept: bool,
    /// Time spent in [`Endpoint::renew`] (zero when not kept).
    pub renew: Duration,
}

/// An endpoint kept across a restart by [`Interface::recycle`] (QP and CQs renewed),
/// with the broadcast group's address handle, for [`Interface::reopen`].
pub struct KeptEndpoint {
    ep: Box<dyn Endpoint>,
    group_ah: AhHandle,
}

impl KeptEndpoint {
    /// Close it instead of reopening on it. Its address handles go with it, so the
    /// neighbour table (which still names them) forgets them; they are counted as
    /// destroyed.
    pub fn close(self, neigh: Option<&mut Neighbours>, stats: &Stats) {
        forget_ahs(neigh, stats);
        drop(self.ep);
    }
}

/// The endpoint that owned the neighbours' address handles (and the group's) is gone:
/// forget them and count them destroyed.
fn forget_ahs(neigh: Option<&mut Neighbours>, stats: &Stats) {
    let n = neigh.map_or(0, |n| n.take_ahs().len() as u64);
    stats::add(&stats.ah_destroyed, n + 1);
}

/// Where the time of [`Interface::open`] / [`Interface::reopen`] went.
#[derive(Debug, Clone, Copy, Default)]
pub struct OpenTimes {
    /// Opening the endpoint (device context, PD, memory registration, channel, CQs, QP);
    /// zero for a kept endpoint.
    pub open: Duration,
    /// Creating the broadcast group's address handle.
    pub ah: Duration,
    /// Attaching the QP to the broadcast group (and the IP-level join on RoCE).
    pub attach: Duration,
    /// Posting the receive ring.
    pub fill: Duration,
    /// Receives posted.
    pub posted: usize,
}

/// One interface. See the module docs.
pub struct Interface {
    ep: Box<dyn Endpoint>,
    ledger: Ledger,
    neigh: Neighbours,
    stats: Arc<Stats>,
    addr: Ipv4Cidr,
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
    probe: Vec<Ipv4Addr>,
    log: RateLimit,
    tx_timeout: Duration,
    /// Set while `shutdown` drains flushes (expected then).
    draining: bool,
    /// Set when a `poll_cq` of this epoch failed (or a post left unknown what was posted,
    /// or the QP could not be moved to the error state): no CQ of this epoch is polled again (not even by the teardown's drain),
    /// and the QP is destroyed before anything it may own is reaped or re-posted.
    untrusted: bool,
    /// A verb failed in a way that leaves the ledger unsure of what was posted (a
    /// `bad_wr` outside the chain): the next call from the poller hands over.
    broken: Option<VerbsError>,
    /// Flush completions seen outside a teardown since the last check.
    unexpected_flushes: u64,
    /// Where the time of this epoch's open went.
    open_times: OpenTimes,
}

impl Interface {
    /// Open the endpoint, join the broadcast group and post the receive ring.
    /// `neigh` carries the neighbour table over from a previous epoch (its AHs were
    /// destroyed with that epoch's endpoint).
    pub fn open(
        provider: &dyn Provider,
        p: &Params,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
    ) -> Result<Interface, OpenError> {
        let start = Instant::now();
        let ep = provider.open(&p.endpoint)?;
        let opened = start.elapsed();
        Self::on_endpoint(ep, None, opened, p, stats, epoch, neigh)
    }

    /// Like [`Interface::open`] on an endpoint kept from the previous epoch by
    /// [`Interface::recycle`] (its QP and CQs are new; context, PD, memory and channel
    /// are the old ones), with the neighbour table `recycle` returned (whose address
    /// handles live on that endpoint). On failure the endpoint is closed and the table
    /// forgets its AHs.
    pub fn reopen(
        kept: KeptEndpoint,
        p: &Params,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
    ) -> Result<Interface, OpenError> {
        let st = stats.clone();
        let r = Self::on_endpoint(
            kept.ep,
            Some(kept.group_ah),
            Duration::ZERO,
            p,
            stats,
            epoch,
            neigh,
        );
        if r.is_err() {
            // The endpoint was closed with its AHs; the neighbours still name theirs
            // unless the table went with a failed epoch.
            forget_ahs(neigh.as_mut(), &st);
        }
        r
    }

    /// Where the time of this epoch's open went.
    pub fn open_times(&self) -> OpenTimes {
        self.open_times
    }

    fn on_endpoint(
        mut ep: Box<dyn Endpoint>,
        group_ah: Option<AhHandle>,
        opened: Duration,
        p: &Params,
        stats: Arc<Stats>,
        epoch: u16,
        neigh: &mut Option<Neighbours>,
    ) -> Result<Interface, OpenError> {
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
        let t = Instant::now();
        let group_ah = match group_ah {
            Some(ah) => ah,
            None => {
                let ah = ep.create_ah(&p.group)?;
                stats::add(&stats.ah_created, 1);
                ah
            }
        };
        times.ah = t.elapsed();
        let t = Instant::now();
        ep.attach_mcast(&p.group)?;
        times.attach = t.elapsed();
        let own_hw = IpoibAddr::new(a.qpn, a.gid);
        let mut iface = Interface {
            ledger: Ledger::new(epoch, a.recv_slots, a.send_slots),
            neigh: neigh
                .take()
                .unwrap_or_else(|| Neighbours::new(p.neigh_capacity as usize, p.neigh_max_age)),
            stats,
            addr: p.addr,
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
            draining: false,
            untrusted: false,
            broken: None,
            unexpected_flushes: 0,
            open_times: times,
            ep,
        };
        stats::set(&iface.stats.qpn, u64::from(a.qpn));
        stats::set(&iface.stats.mtu, mtu as u64);
        stats::set(&iface.stats.recv_ring, u64::from(a.recv_slots));
        stats::set(&iface.stats.send_ring, u64::from(a.send_slots));
        let t = Instant::now();
        match iface.fill_recv() {
            Ok(n) => iface.open_times.posted = n,
            Err(e) => {
                // Receives posted before the failure are reaped with the endpoint.
                let _ = iface.shutdown(Duration::ZERO);
                return Err(e.into());
            }
        }
        iface.open_times.fill = t.elapsed();
        iface.sync_gauges();
        if opened.is_zero() {
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

    /// Counters.
    pub fn stats(&self) -> &Arc<Stats> {
        &self.stats
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

    /// Post every free receive slot, as one chain (one `ibv_post_recv`).
    pub fn fill_recv(&mut self) -> Result<usize, VerbsError> {
        self.recv_chain.clear();
        while self.recv_chain.len() < self.recv_chain.capacity()
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

    /// Handle up to the budget of receive completions, writing packets to `tap`, and
    /// re-post the receive ring. A failed poll is returned at once, never retried.
    pub fn poll_rx(&mut self, tap: &dyn FrameIo, now: Instant) -> Result<usize, Failure> {
        let mut done = 0;
        let mut polled = Ok(());
        while done < self.budget {
            let want = self.poll_batch.min(self.budget - done);
            let n = match self.poll_recv_batch(want, Some(tap), now) {
                Ok(n) => n,
                Err(e) => {
                    polled = Err(e);
                    break;
                }
            };
            done += n;
            if n < want {
                break;
            }
        }
        // What the TAP held back to join goes out now, even when the poll failed.
        let lost = tap.flush();
        if lost > 0 {
            for _ in 0..lost {
                self.stats.count_drop(DropReason::RxTapWrite);
            }
            if self.log.allow(now) {
                tracing::warn!(frames = lost, "writing received frames to the TAP failed");
            }
        }
        polled?;
        self.check_flushes()?;
        if done > 0 {
            self.fill_recv().map_err(Failure::Verbs)?;
        }
        Ok(done)
    }

    /// Flushes outside a teardown mean the QP is in the error state, and a post that left
    /// the ledger unsure of what was posted breaks the epoch: hand over.
    fn check_flushes(&mut self) -> Result<(), Failure> {
        self.check_broken()?;
        if self.unexpected_flushes > 0 {
            let n = std::mem::take(&mut self.unexpected_flushes);
            return Err(Failure::QpError(n));
        }
        Ok(())
    }

    fn check_broken(&mut self) -> Result<(), Failure> {
        if let Some(e) = self.broken.take() {
            self.untrusted = true;
            return Err(Failure::Verbs(e));
        }
        Ok(())
    }

    /// Reap send completions. Returns how many.
    pub fn poll_tx(&mut self, now: Instant) -> Result<usize, Failure> {
        let mut done = 0;
        loop {
            let want = self.wc.len();
            let n = self.poll(CqKind::Send, want)?;
            for i in 0..n {
                let c = self.wc[i];
                self.on_send_done(c, now);
            }
            done += n;
            if n < want {
                break;
            }
        }
        self.release_ahs();
        if done > 0 {
            self.sync_gauges();
        }
        self.check_flushes()?;
        Ok(done)
    }

    fn release_ahs(&mut self) {
        while let Some(ah) = self.destroy.pop() {
            match self.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&self.stats.ah_destroyed, 1),
                Err(e) => {
                    stats::add(&self.stats.teardown_errors, 1);
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
    }

    fn on_send_done(&mut self, c: Completion, now: Instant) {
        let acc = match self.ledger.complete(Ring::Send, c.wr_id, c.status) {
            Ok(a) => a,
            Err(e) => {
                stats::add(&self.stats.completions_rejected, 1);
                if self.log.allow(now) {
                    tracing::warn!(error = %e, "send completion rejected by the ledger");
                }
                return;
            }
        };
        let meta = acc.send.unwrap_or_default();
        match c.status {
            WcStatus::Success => {
                stats::add(&self.stats.send_completed, 1);
                stats::add(&self.stats.tx_packets, 1);
                stats::add(&self.stats.tx_bytes, u64::from(meta.bytes));
            }
            WcStatus::Flushed => {
                stats::add(&self.stats.send_flushed, 1);
                self.stats.count_drop(DropReason::TxFlushed);
                if !self.draining {
                    self.unexpected_flushes += 1;
                }
            }
            WcStatus::Error(code) => {
                stats::add(&self.stats.send_completed, 1);
                self.stats.count_drop(DropReason::TxCompletionError);
                if self.log.allow(now) {
                    tracing::warn!(status = code, "send completed with an error");
                }
            }
        }
        if let Some(ah) = meta.ah
            && let Some(ah) = self.neigh.send_finished(ah)
        {
            self.destroy.push(ah);
        }
    }

    fn on_recv(&mut self, c: Completion, tap: Option<&dyn FrameIo>, now: Instant) {
        let slot = match self.ledger.complete(Ring::Recv, c.wr_id, c.status) {
            Ok(a) => a.id.slot,
            Err(e) => {
                stats::add(&self.stats.completions_rejected, 1);
                if self.log.allow(now) {
                    tracing::warn!(error = %e, "receive completion rejected by the ledger");
                }
                return;
            }
        };
        match c.status {
            WcStatus::Success => {}
            WcStatus::Flushed => {
                stats::add(&self.stats.recv_flushed, 1);
                if !self.draining {
                    self.unexpected_flushes += 1;
                }
                return;
            }
            WcStatus::Error(code) => {
                stats::add(&self.stats.recv_completed, 1);
                self.stats.count_drop(DropReason::RxCompletionError);
                if self.log.allow(now) {
                    tracing::warn!(status = code, "receive completed with an error");
                }
                return;
            }
        }
        stats::add(&self.stats.recv_completed, 1);
        let len = (c.byte_len as usize).min(self.ep.attrs().max_payload as usize + GRH_LEN);
        let kind = self.ep.attrs().grh_kind;
        // Split borrows: the receive buffer lives in the endpoint, the frame scratch and
        // the tables in other fields.
        let buf = &self.ep.recv_buf(slot)[..len];
        let r = rx_packet(
            buf,
            c,
            kind,
            &mut RxCtx {
                neigh: &mut self.neigh,
                stats: &self.stats,
                own_hw: self.own_hw,
                own_mac: self.own_mac,
                addr: self.addr,
                frame: &mut self.frame,
                destroy: &mut self.destroy,
                now,
            },
        );
        match r {
            Ok(Some(_)) if tap.is_none() => self.stats.count_drop(DropReason::RxTeardown),
            Ok(Some(n)) => match tap.map_or(Ok(0), |t| t.write_frame(&self.frame[..n])) {
                Ok(_) => {
                    stats::add(&self.stats.rx_packets, 1);
                    stats::add(
                        &self.stats.rx_bytes,
                        n.saturating_sub(eth::HEADER_LEN) as u64,
                    );
                }
                Err(e) => {
                    self.stats.count_drop(DropReason::RxTapWrite);
                    if self.log.allow(now) {
                        tracing::warn!(error = %e, "writing a received frame to the TAP failed");
                    }
                }
            },
            Ok(None) => {}
            Err(reason) => {
                self.stats.count_drop(reason);
                if self.log.allow(now) {
                    tracing::debug!(reason = reason.name(), src_qp = c.src_qp, "receive dropped");
                }
            }
        }
    }

    /// Read frames from the TAP while the send ring has room (at most one batch), and
    /// post them as one chain. Returns frames taken from the TAP. `Ok` with the TAP
    /// drained is signalled through `gate`.
    pub fn tx_from_tap(
        &mut self,
        tap: &dyn FrameIo,
        gate: &mut crate::napi::TxGate,
        now: Instant,
    ) -> Result<usize, Failure> {
        let mut taken = 0;
        while taken < self.tx_batch && gate.may_read(self.ledger.free_send()) {
            let n = match tap.read_frame(&mut self.frame) {
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    gate.on_drained();
                    break;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    // A frame the TAP layer could not turn into frames (a bad offload
                    // request): dropped and counted, the next one is read.
                    taken += 1;
                    self.stats.count_drop(DropReason::TxBadOffload);
                    if self.log.allow(now) {
                        tracing::warn!(error = %e, "a frame from the TAP was dropped");
                    }
                    continue;
                }
                Err(e) => {
                    // The TAP itself failing is not a verbs failure: count and stop this
                    // turn; the loop will try again on the next readiness.
                    gate.on_drained();
                    if self.log.allow(now) {
                        tracing::warn!(error = %e, "reading the TAP failed");
                    }
                    break;
                }
            };
            taken += 1;
            if let Err(reason) = self.tx_frame(n, now) {
                self.stats.count_drop(reason);
            }
        }
        self.flush_chain(now);
        self.check_broken()?;
        Ok(taken)
    }

    /// Translate the frame in `self.frame[..n]` into a send on the chain.
    fn tx_frame(&mut self, n: usize, now: Instant) -> Result<(), DropReason> {
        let (h, payload) = match eth::parse_frame(&self.frame[..n]) {
            Ok(x) => x,
            Err(WireError::Vlan) => return Err(DropReason::TxVlan),
            Err(_) => return Err(DropReason::TxShort),
        };
        match h.ethertype {
            ETHERTYPE_IPV4 => {
                if payload.len() > self.mtu {
                    return Err(DropReason::TxOversized);
                }
                let sum = ipv4::parse_summary(payload).map_err(|_| DropReason::TxBadIpv4)?;
                let plen = payload.len();
                let dest = if h.dst.is_multicast() {
                    self.group_dest()
                } else {
                    match self.unicast_dest(&h.dst, now) {
                        Ok(d) => d,
                        Err(DropReason::TxNoNeighbour) => {
                            self.resolve(sum.dst, now);
                            return Err(DropReason::TxNoNeighbour);
                        }
                        Err(r) => return Err(r),
                    }
                };
                let slot = self.ledger.reserve_send().ok_or(DropReason::TxPostFailed)?;
                let sbuf = self.ep.send_buf(slot);
                // The header cannot fail: the slot holds max_payload >= mtu + 4 bytes.
                let _ = ipoib::emit_header(sbuf, ETHERTYPE_IPV4);
                sbuf[ipoib::HEADER_LEN..ipoib::HEADER_LEN + plen]
                    .copy_from_slice(&self.frame[eth::HEADER_LEN..eth::HEADER_LEN + plen]);
                self.push_send(slot, plen, dest, false);
                Ok(())
            }
            ETHERTYPE_ARP => {
                let a = EthArp::parse(payload).map_err(|_| DropReason::TxBadArp)?;
                self.tx_arp(&h, &a, now)
            }
            ETHERTYPE_IPV6 => Err(DropReason::TxIpv6),
            _ => Err(DropReason::TxUnsupported),
        }
    }

    fn tx_arp(&mut self, h: &EthHeader, a: &EthArp, now: Instant) -> Result<(), DropReason> {
        let tha = if a.tha == self.own_mac {
            self.own_hw
        } else {
            self.neigh
                .by_mac(&a.tha)
                .map(|p| p.hw)
                .unwrap_or(IpoibAddr::ZERO)
        };
        if a.op == arp::OP_REPLY && tha.is_zero() {
            return Err(DropReason::TxNoNeighbour);
        }
        let dest = if h.dst.is_multicast() {
            self.group_dest()
        } else {
            match self.unicast_dest(&h.dst, now) {
                Ok(d) => d,
                // A unicast request (the kernel re-validating an entry) to a peer we
                // lost: ask everyone instead.
                Err(_) if a.op == arp::OP_REQUEST => self.group_dest(),
                Err(r) => return Err(r),
            }
        };
        let msg = IpoibArp {
            op: a.op,
            sha: self.own_hw,
            spa: a.spa,
            tha,
            tpa: a.tpa,
        };
        self.push_arp(&msg, dest)
    }

    fn push_arp(
        &mut self,
        msg: &IpoibArp,
        dest: (Dest, Option<AhHandle>),
    ) -> Result<(), DropReason> {
        let slot = self.ledger.reserve_send().ok_or(DropReason::TxPostFailed)?;
        let sbuf = self.ep.send_buf(slot);
        let _ = ipoib::emit_header(sbuf, ETHERTYPE_ARP);
        match msg.emit(&mut sbuf[ipoib::HEADER_LEN..]) {
            Ok(n) => {
                stats::add(&self.stats.arp_tx, 1);
                self.push_send(slot, n, dest, true);
                Ok(())
            }
            Err(_) => {
                self.ledger.release(Ring::Send, slot);
                Err(DropReason::TxBadArp)
            }
        }
    }

    /// Ask the broadcast group who has `ip` (rate-limited per address).
    fn resolve(&mut self, ip: Ipv4Addr, now: Instant) {
        if !self.neigh.should_resolve(ip, now) || self.ledger.free_send() == 0 {
            return;
        }
        let msg = IpoibArp {
            op: arp::OP_REQUEST,
            sha: self.own_hw,
            spa: self.addr.addr,
            tha: IpoibAddr::ZERO,
            tpa: ip,
        };
        let dest = self.group_dest();
        if self.push_arp(&msg, dest).is_ok() {
            stats::add(&self.stats.neigh_resolves, 1);
        }
    }

    /// Announce this interface's address (gratuitous ARP to the broadcast group).
    pub fn announce(&mut self, now: Instant) {
        let msg = IpoibArp {
            op: arp::OP_REQUEST,
            sha: self.own_hw,
            spa: self.addr.addr,
            tha: IpoibAddr::ZERO,
            tpa: self.addr.addr,
        };
        let dest = self.group_dest();
        if let Err(r) = self.push_arp(&msg, dest) {
            self.stats.count_drop(r);
        }
        self.flush_chain(now);
    }

    fn group_dest(&self) -> (Dest, Option<AhHandle>) {
        (
            Dest {
                ah: self.group_ah,
                qpn: MULTICAST_QPN,
                qkey: self.qkey,
            },
            None,
        )
    }

    fn unicast_dest(
        &mut self,
        mac: &Mac,
        now: Instant,
    ) -> Result<(Dest, Option<AhHandle>), DropReason> {
        let peer = *self.neigh.by_mac(mac).ok_or(DropReason::TxNoNeighbour)?;
        self.neigh.mark_used(mac, now);
        let ah = match peer.ah {
            Some(ah) => ah,
            None => match self.ep.create_ah(&peer.hw.gid) {
                Ok(ah) => {
                    stats::add(&self.stats.ah_created, 1);
                    self.neigh.set_ah(mac, ah);
                    ah
                }
                Err(e) => {
                    tracing::warn!(gid = %peer.hw.gid, error = %e, "creating an address handle failed");
                    return Err(DropReason::TxAhFailed);
                }
            },
        };
        Ok((
            Dest {
                ah,
                qpn: peer.hw.qpn,
                qkey: self.qkey,
            },
            Some(ah),
        ))
    }

    fn push_send(&mut self, slot: u32, payload: usize, dest: (Dest, Option<AhHandle>), arp: bool) {
        self.chain.push(SendWr {
            wr_id: self.ledger.wr_id(Ring::Send, slot),
            slot,
            len: (payload + ipoib::HEADER_LEN) as u32,
            dest: dest.0,
            signaled: true,
        });
        self.chain_meta.push(SendMeta {
            ah: dest.1,
            bytes: payload as u32,
            arp,
            posted_at: None,
        });
    }

    /// Post the pending chain with one call.
    fn flush_chain(&mut self, now: Instant) {
        if self.chain.is_empty() {
            return;
        }
        let posted = match self.ep.post_send(&self.chain) {
            Ok(()) => self.chain.len(),
            Err(e) => {
                if self.log.allow(now) {
                    tracing::warn!(error = %e, "posting sends failed");
                }
                let posted = e.posted.min(self.chain.len());
                if let VerbsError::BadWrOutsideChain { .. } = e.error {
                    // Which of the chain went is unknown: all count as posted (reaped once
                    // the QP is destroyed) and the interface restarts.
                    self.broken = Some(e.error);
                }
                posted
            }
        };
        for (i, (wr, meta)) in self.chain.iter().zip(self.chain_meta.iter()).enumerate() {
            if i < posted {
                let meta = SendMeta {
                    posted_at: Some(now),
                    ..*meta
                };
                self.ledger.posted_send(wr.slot, meta);
                if let Some(ah) = meta.ah {
                    self.neigh.send_started(ah);
                }
            } else {
                self.ledger.release(Ring::Send, wr.slot);
                self.stats.count_drop(DropReason::TxPostFailed);
            }
        }
        stats::add(&self.stats.send_posted, posted as u64);
        self.chain.clear();
        self.chain_meta.clear();
        self.sync_gauges();
    }

    /// Periodic work: age neighbours and destroy their idle AHs, re-resolve peers that
    /// went silent while in use, and run the send-stall watchdog.
    pub fn housekeeping(&mut self, now: Instant) -> Result<(), Failure> {
        // The next restart's QP and CQs are made ahead (a failure is counted; it does not
        // stop the datapath, and a renewal makes what is missing). The previous epoch's
        // are destroyed by the supervisor's reaper thread, never here: a destroy can
        // block for a second.
        if let Err(e) = self.ep.maintain() {
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

    /// Tear down in order: QP to error, drain flushes (bounded by `deadline`), detach the
    /// group, destroy AHs, destroy the endpoint, reap what never completed, check the
    /// ledger. Never panics; failures are counted. Receives that complete during the
    /// drain have nowhere to go and are counted as dropped (`rx_teardown`): use
    /// [`Interface::shutdown_into`] where the TAP is still there.
    /// The neighbour table is handed back for the next epoch.
    pub fn shutdown(self, deadline: Duration) -> (Teardown, Neighbours) {
        let (t, neigh, _) = self.teardown(deadline, None, false);
        (t, neigh)
    }

    /// [`Interface::shutdown`], delivering the receives that complete during the drain
    /// to `tap`.
    pub fn shutdown_into(self, deadline: Duration, tap: &dyn FrameIo) -> (Teardown, Neighbours) {
        let (t, neigh, _) = self.teardown(deadline, Some(tap), false);
        (t, neigh)
    }

    /// Like [`Interface::shutdown_into`], but instead of destroying the endpoint, replace
    /// its QP and CQs ([`Endpoint::renew`]) and hand it back for [`Interface::reopen`]:
    /// device context, PD, registered memory, completion channel, the broadcast group's
    /// membership and the neighbours' address handles survive. What was
    /// posted on the old QP is reaped exactly as after a full teardown (the old QP and
    /// CQs are destroyed, so no completion of this epoch can come). If the renewal fails
    /// the endpoint is closed (`None`): open a new one.
    ///
    /// After a failed poll nothing of this epoch is polled again: there is no drain, and
    /// the old QP is destroyed at once ([`Endpoint::renew_destroying_old`]) before any
    /// work request is reaped. So it is when the QP could not be moved to the error
    /// state. A QP in the error state is kept aside for its grace, even when some of its
    /// flushes had not arrived by `deadline` (rxe is still flushing it then).
    ///
    /// Not for a lost device: use [`Interface::shutdown`] then, which closes everything
    /// at once (a removal waits for every context on the device to close).
    pub fn recycle(
        self,
        deadline: Duration,
        tap: &dyn FrameIo,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        self.teardown(deadline, Some(tap), true)
    }

    /// Whether a `poll_cq` of this epoch failed or the QP can otherwise not be trusted to
    /// have finished with its slots (then none of its CQs is polled again, and the QP is
    /// destroyed before its work requests are reaped).
    pub fn untrusted(&self) -> bool {
        self.untrusted
    }

    fn teardown(
        mut self,
        deadline: Duration,
        tap: Option<&dyn FrameIo>,
        keep: bool,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        let mut t = Teardown {
            reaped: 0,
            sends_reaped: 0,
            flushed: 0,
            drain: Duration::ZERO,
            destroy: Duration::ZERO,
            errors: 0,
            ledger: Ok(()),
            kept: false,
            renew: Duration::ZERO,
        };
        let flushed_before =
            stats::get(&self.stats.recv_flushed) + stats::get(&self.stats.send_flushed);
        self.draining = true;
        let start = Instant::now();
        if self.untrusted {
            // A failed poll: what the CQs hold cannot be trusted, so they are not polled
            // again; the QP is destroyed before anything is reaped.
            tracing::debug!("a poll failed: no drain, the QP is destroyed first");
        } else if let Err(e) = self.ep.set_qp_error() {
            t.errors += 1;
            self.untrusted = true;
            tracing::warn!(error = %e, "moving the QP to the error state failed: it is destroyed before anything is reaped");
        } else {
            // Drain flush completions until everything posted is accounted for.
            // Receives that completed before the flush are delivered.
            while self.outstanding() > 0 && start.elapsed() < deadline {
                let rx = self.poll_recv_batch(self.wc.len(), tap, Instant::now());
                let tx = self.poll_tx(Instant::now());
                match (rx, tx) {
                    (Ok(0), Ok(0)) => std::thread::sleep(DRAIN_NAP),
                    (Ok(_), Ok(_)) => {}
                    _ => break,
                }
            }
            if let Some(tap) = tap {
                for _ in 0..tap.flush() {
                    self.stats.count_drop(DropReason::RxTapWrite);
                }
            }
            // Flushes still missing at the deadline leave the QP (in the error state) to
            // its grace, not to an immediate destroy: rxe is then still flushing it, and
            // destroying a QP rxe still holds makes rxe warn, free it under its tasks
            // and break the device's sends (seen in the lab under iperf3 load).
            if self.outstanding() > 0 {
                tracing::debug!(
                    outstanding = self.outstanding(),
                    "flushes missing after the drain; the QP in the error state is retired"
                );
            }
        }
        t.drain = start.elapsed();
        let destroy_start = Instant::now();
        // Kept, the endpoint moves the group over to its new QP itself and its address
        // handles stay valid: only the retiring ones go.
        if keep {
            return self.teardown_keep(t, destroy_start, flushed_before);
        }
        if self.group_attached {
            if let Err(e) = self.ep.detach_mcast(&self.group) {
                t.errors += 1;
                tracing::warn!(error = %e, "detaching the broadcast group failed");
            }
            self.group_attached = false;
        }
        // Every send is accounted for below (completed, flushed or reaped), so every AH
        // can go.
        let mut ahs = self.neigh.take_ahs();
        ahs.append(&mut self.destroy);
        ahs.push(self.group_ah);
        for ah in ahs {
            match self.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&self.stats.ah_destroyed, 1),
                Err(e) => {
                    t.errors += 1;
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
        // The endpoint goes first (QP, CQs, channel, MR, PD, context): after that no
        // completion can come for anything still posted, so it is reaped.
        drop(self.ep);
        t.destroy = destroy_start.elapsed();
        Self::reap(&mut self.ledger, &self.stats, &mut t, flushed_before);
        (t, self.neigh, None)
    }

    /// The rest of a teardown that keeps the endpoint: retiring AHs destroyed, the QP and
    /// CQs renewed (after which no completion can come for anything still posted, so it
    /// is reaped), the live AHs and the group kept. If the renewal fails, everything is
    /// destroyed as in a full teardown.
    fn teardown_keep(
        mut self,
        mut t: Teardown,
        destroy_start: Instant,
        flushed_before: u64,
    ) -> (Teardown, Neighbours, Option<KeptEndpoint>) {
        let mut ahs = self.neigh.take_retiring_ahs();
        ahs.append(&mut self.destroy);
        for ah in ahs {
            match self.ep.destroy_ah(ah) {
                Ok(()) => stats::add(&self.stats.ah_destroyed, 1),
                Err(e) => {
                    t.errors += 1;
                    tracing::warn!(error = %e, "destroying an address handle failed");
                }
            }
        }
        let renew_start = Instant::now();
        let renewed = if self.untrusted {
            self.ep.renew_destroying_old()
        } else {
            self.ep.renew()
        };
        t.renew = renew_start.elapsed();
        let kept = match renewed {
            Ok(()) => Some(KeptEndpoint {
                ep: self.ep,
                group_ah: self.group_ah,
            }),
            Err(e) => {
                tracing::warn!(error = %e, "renewing the endpoint failed: closing it (the next epoch opens the device again)");
                // Dropping it detaches the group and destroys every AH with it; the
                // neighbours forget theirs.
                forget_ahs(Some(&mut self.neigh), &self.stats);
                drop(self.ep);
                None
            }
        };
        t.kept = kept.is_some();
        t.destroy = destroy_start.elapsed();
        Self::reap(&mut self.ledger, &self.stats, &mut t, flushed_before);
        (t, self.neigh, kept)
    }

    /// Reap what never completed and check the ledger (the endpoint is gone or renewed).
    /// Takes the parts it needs: the endpoint has been moved out by then.
    fn reap(ledger: &mut Ledger, stats: &Stats, t: &mut Teardown, flushed_before: u64) {
        // Sends reaped never completed: whether they left is unknown, so each is counted
        // as dropped with reason `reaped`.
        for _ in ledger.reap_all() {
            stats.count_drop(DropReason::TxReaped);
            t.sends_reaped += 1;
        }
        t.reaped = ledger.totals(Ring::Recv).reaped + ledger.totals(Ring::Send).reaped;
        t.flushed =
            stats::get(&stats.recv_flushed) + stats::get(&stats.send_flushed) - flushed_before;
        stats::add(&stats.recv_reaped, ledger.totals(Ring::Recv).reaped);
        stats::add(&stats.send_reaped, ledger.totals(Ring::Send).reaped);
        t.ledger = ledger.check();
        if t.ledger.is_ok()
            && ledger.totals(Ring::Recv).outstanding + ledger.totals(Ring::Send).outstanding != 0
        {
            t.ledger = Err("work requests still outstanding after the reap".into());
        }
        stats::add(&stats.teardown_errors, t.errors);
        stats::set(&stats.recv_outstanding, 0);
        stats::set(&stats.send_outstanding, 0);
    }

    /// The one place that calls `poll_cq`. After a failed poll it refuses, so nothing of
    /// this epoch can poll again.
    fn poll(&mut self, cq: CqKind, want: usize) -> Result<usize, Failure> {
        if self.untrusted {
            return Err(Failure::PollFailed(VerbsError::PollFailed { cq, ret: 0 }));
        }
        self.ep.poll_cq(cq, &mut self.wc[..want]).map_err(|e| {
            self.untrusted = true;
            Failure::PollFailed(e)
        })
    }

    fn outstanding(&self) -> u64 {
        self.ledger.totals(Ring::Recv).outstanding + self.ledger.totals(Ring::Send).outstanding
    }

    /// One `poll_cq` of up to `want` receive completions, each handled (delivered to
    /// `tap`, or with none counted as dropped). Never polls after a failed poll.
    fn poll_recv_batch(
        &mut self,
        want: usize,
        tap: Option<&dyn FrameIo>,
        now: Instant,
    ) -> Result<usize, Failure> {
        let n = self.poll(CqKind::Recv, want)?;
        for i in 0..n {
            let c = self.wc[i];
            self.on_recv(c, tap, now);
        }
        Ok(n)
    }
}

struct RxCtx<'a> {
    neigh: &'a mut Neighbours,
    stats: &'a Stats,
    own_hw: IpoibAddr,
    own_mac: Mac,
    addr: Ipv4Cidr,
    frame: &'a mut [u8],
    destroy: &'a mut Vec<AhHandle>,
    now: Instant,
}

/// Turn one UD receive (GRH + IPoIB header + payload) into an Ethernet frame in
/// `cx.frame`. `Ok(Some(n))`: write `n` bytes to the TAP; `Ok(None)`: consumed (own
/// loopback); `Err`: dropped for that reason.
fn rx_packet(
    buf: &[u8],
    c: Completion,
    kind: crate::verbs::GrhKind,
    cx: &mut RxCtx<'_>,
) -> Result<Option<usize>, DropReason> {
    if buf.len() < GRH_LEN + ipoib::HEADER_LEN {
        return Err(DropReason::RxShort);
    }
    // A UD receive on RoCE always carries the GRH: without it nothing says who sent the
    // packet (the IB link layer, whose local traffic may come without one, is refused at
    // startup).
    if !c.has_grh {
        return Err(DropReason::RxNoGrh);
    }
    let g = grh::parse(&buf[..GRH_LEN], kind).map_err(|_| DropReason::RxBadGrh)?;
    // The packet's real source, as the hardware reports it.
    let src_hw = IpoibAddr::new(c.src_qp, g.sgid);
    if src_hw.qpn == cx.own_hw.qpn && src_hw.gid == cx.own_hw.gid {
        stats::add(&cx.stats.rx_own_looped, 1);
        return Ok(None);
    }
    let (ethertype, payload) = match ipoib::parse_header(&buf[GRH_LEN..]) {
        Ok(x) => x,
        Err(WireError::Truncated { .. }) => return Err(DropReason::RxShort),
        Err(_) => return Err(DropReason::RxBadHeader),
    };
    match ethertype {
        ETHERTYPE_ARP => {
            let a = IpoibArp::parse(payload).map_err(|_| DropReason::RxBadArp)?;
            stats::add(&cx.stats.arp_rx, 1);
            if a.sha.is_zero()
                || a.sha.gid.is_multicast()
                || a.sha.gid.is_zero()
                || is_reserved_qpn(a.sha.qpn)
            {
                return Err(DropReason::RxBadArp);
            }
            // Believed only from its real source: the claimed sender must be the QP and
            // GID the packet came from.
            if a.sha != src_hw {
                return Err(DropReason::RxArpSpoofed);
            }
            // 0.0.0.0 is an address probe's sender (RFC 5227): passed on, never learned.
            let probe = a.spa.is_unspecified();
            if !probe && !cx.addr.contains(a.spa) {
                return Err(DropReason::RxArpOffSubnet);
            }
            // A new neighbour only from a reply or a request for our address (as the
            // kernel's ARP does); a gratuitous announcement only updates a known one (a
            // restarted peer at its new QPN); any other ARP changes nothing.
            let trust =
                if a.op == arp::OP_REPLY || (a.op == arp::OP_REQUEST && a.tpa == cx.addr.addr) {
                    Trust::Create
                } else if a.spa == a.tpa {
                    Trust::Update
                } else {
                    Trust::Refresh
                };
            let learned = if probe {
                None
            } else {
                Some(
                    cx.neigh
                        .learn(Some(a.spa), a.sha, trust, cx.now, cx.destroy),
                )
            };
            let src_mac = match learned {
                Some((mac, l)) => {
                    match l {
                        Learned::New => stats::add(&cx.stats.neigh_learned, 1),
                        Learned::QpnChanged { old_qpn } => {
                            stats::add(&cx.stats.neigh_updated, 1);
                            tracing::info!(ip = %a.spa, old_qpn, new_qpn = a.sha.qpn, "peer moved to a new QPN");
                        }
                        Learned::Refreshed => {}
                        Learned::Unknown | Learned::Conflict => {
                            stats::add(&cx.stats.arp_not_learned, 1)
                        }
                        Learned::Collision => return Err(DropReason::RxBadArp),
                    }
                    mac
                }
                None => {
                    stats::add(&cx.stats.arp_not_learned, 1);
                    mac_for_gid(&a.sha.gid)
                }
            };
            let tha = if a.tha.is_zero() {
                Mac::ZERO
            } else if a.tha.gid == cx.own_hw.gid {
                cx.own_mac
            } else {
                mac_for_gid(&a.tha.gid)
            };
            let dst = if a.op == arp::OP_REQUEST {
                Mac::BROADCAST
            } else {
                cx.own_mac
            };
            let e = EthArp {
                op: a.op,
                sha: src_mac,
                spa: a.spa,
                tha,
                tpa: a.tpa,
            };
            let h = EthHeader {
                dst,
                src: src_mac,
                ethertype: ETHERTYPE_ARP,
            };
            eth::emit_header(cx.frame, &h).map_err(|_| DropReason::RxShort)?;
            let n = e
                .emit(&mut cx.frame[eth::HEADER_LEN..])
                .map_err(|_| DropReason::RxBadArp)?;
            Ok(Some(eth::HEADER_LEN + n))
        }
        ETHERTYPE_IPV4 => {
            let s = ipv4::parse_summary(payload).map_err(|_| DropReason::RxBadIpv4)?;
            let payload = &payload[..s.total_len];
            // Traffic refreshes a peer only from the QPN it is known at, and never moves it:
            // any QP on the peer's host sends from the same GID.
            if let Seen::OtherQpn { .. } = cx.neigh.seen(src_hw, cx.now) {
                stats::add(&cx.stats.rx_unknown_qpn, 1);
            }
            let src_mac = mac_for_gid(&g.sgid);
            let via_group = g.dgid.is_multicast();
            let dst = if s.dst.is_multicast() {
                multicast_mac(s.dst)
            } else if via_group || s.dst.is_broadcast() || is_subnet_broadcast(&cx.addr, s.dst) {
                Mac::BROADCAST
            } else {
                cx.own_mac
            };
            let total = eth::HEADER_LEN + payload.len();
            if total > cx.frame.len() {
                return Err(DropReason::RxShort);
            }
            let h = EthHeader {
                dst,
                src: src_mac,
                ethertype: ETHERTYPE_IPV4,
            };
            eth::emit_header(cx.frame, &h).map_err(|_| DropReason::RxShort)?;
            cx.frame[eth::HEADER_LEN..total].copy_from_slice(payload);
            Ok(Some(total))
        }
        _ => Err(DropReason::RxUnsupported),
    }
}

/// QPNs no sender of IPoIB traffic can have: QP0 and QP1 (the management QPs) and the
/// multicast QPN.
fn is_reserved_qpn(qpn: u32) -> bool {
    qpn <= 1 || qpn == MULTICAST_QPN
}

fn is_subnet_broadcast(net: &Ipv4Cidr, ip: Ipv4Addr) -> bool {
    if net.prefix >= 31 {
        return false;
    }
    let host_mask = u32::MAX >> net.prefix;
    net.contains(ip) && u32::from(ip) & host_mask == host_mask
}
