//! Neighbours: IPv4 and IPv6 addresses → IPoIB hardware address (QPN + GID) → address
//! handle.
//!
//! The TAP side speaks Ethernet, so each peer is also known by the locally administered
//! MAC derived from its GID ([`crate::wire::eth::mac_for_gid`]). The MAC does not depend
//! on the QPN, so when a peer restarts with a new QPN the kernel's ARP cache on the TAP
//! stays valid and only this table changes.
//!
//! The table is bounded (least recently seen evicted), aged (`max_age`) and learned from
//! ARP and neighbour discovery only, after the datapath checked that the message's
//! sender link-layer address is the packet's real source: an entry is created from a reply or from a request aimed at our own
//! address, a gratuitous announcement only updates a peer already known, and any other
//! ARP only refreshes a peer heard at exactly its known address ([`Trust`]). Each map is
//! bounded: a peer has one IPv4 address and at most [`PEER_ADDR6`] IPv6 addresses at a
//! time (the oldest forgotten first), so the address maps never hold more than that many
//! entries per peer. Data packets refresh a peer only when they come from the
//! QPN it is known at; they never change it ([`Neighbours::seen`]). Address handles are created
//! by the datapath on first use; an address handle whose peer is gone is destroyed only
//! after the last send that used it has completed ([`Neighbours::send_finished`]).
//!
//! Pure: time comes in as an argument; verbs calls are returned as decisions.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::verbs::AhHandle;
use crate::wire::eth::{Mac, mac_for_gid};
use crate::wire::ipoib::IpoibAddr;

/// IPv6 addresses one peer holds at a time (a link-local and a few global ones).
pub const PEER_ADDR6: usize = 4;

/// How often an ARP request or neighbour solicitation may be sent to re-resolve the same address.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(1);

/// A peer heard from within this long is reachable; one silent longer is stale (and,
/// while it is being sent to, re-resolved: the interface's `PEER_SILENT_PROBE`).
pub const REACHABLE_TIME: Duration = Duration::from_secs(3);

/// Most peers a [`NeighSnapshot`] lists (the most recently heard); the table may hold
/// more (`neigh-capacity`), and the snapshot says how many ([`NeighSnapshot::total`]).
pub const NEIGH_LISTED: usize = 4096;

/// One peer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its IPoIB address (QPN and GID).
    pub hw: IpoibAddr,
    /// Address handle for its GID, once created.
    pub ah: Option<AhHandle>,
    /// Last time it was heard from.
    pub last_seen: Instant,
    /// Last IPv4 address learned for it.
    pub ip: Option<Ipv4Addr>,
    /// IPv6 addresses learned for it, oldest first.
    pub ip6: [Option<Ipv6Addr>; PEER_ADDR6],
    /// Last time a frame was sent to it.
    pub last_used: Option<Instant>,
}

/// One peer as [`Neighbours::snapshot`] copied it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NeighEntry {
    /// The MAC the TAP knows it by (derived from its GID).
    pub mac: Mac,
    /// Its IPoIB address (QPN and GID).
    pub hw: IpoibAddr,
    /// Its IPv4 address.
    pub ip: Option<Ipv4Addr>,
    /// Its IPv6 addresses, oldest first.
    pub ip6: [Option<Ipv6Addr>; PEER_ADDR6],
    /// Whether an address handle has been created for it (on first send).
    pub ah: bool,
    /// Sends posted on its address handle and not completed yet.
    pub ah_inflight: u32,
    /// Last time it was heard from.
    pub last_seen: Instant,
    /// Last time a frame was sent to it.
    pub last_used: Option<Instant>,
    /// An ARP request or neighbour solicitation for one of its addresses was sent
    /// within [`RESOLVE_INTERVAL`] (it is being re-resolved).
    pub resolving: bool,
}

/// Where a peer stands, in `ip neigh`'s words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NeighState {
    /// Heard from within [`REACHABLE_TIME`].
    Reachable,
    /// Silent for longer, not being re-resolved.
    Stale,
    /// Being re-resolved (an ARP request or solicitation is out).
    Probe,
}

impl NeighState {
    /// Its name in `uipoib neigh` (upper case, as `ip neigh` prints it).
    pub fn name(self) -> &'static str {
        match self {
            NeighState::Reachable => "REACHABLE",
            NeighState::Stale => "STALE",
            NeighState::Probe => "PROBE",
        }
    }
}

impl NeighEntry {
    /// Every address it holds: the IPv4 one first, then the IPv6 ones oldest first.
    pub fn addrs(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.ip
            .map(IpAddr::V4)
            .into_iter()
            .chain(self.ip6.iter().flatten().map(|a| IpAddr::V6(*a)))
    }

    /// Its state at `now`.
    pub fn state(&self, now: Instant) -> NeighState {
        if self.resolving {
            NeighState::Probe
        } else if now.saturating_duration_since(self.last_seen) < REACHABLE_TIME {
            NeighState::Reachable
        } else {
            NeighState::Stale
        }
    }

    /// Listing order: peers with an IPv4 address first by it, then by first IPv6
    /// address, then by MAC.
    fn sort_key(&self) -> (Option<IpAddr>, Mac) {
        (self.addrs().next(), self.mac)
    }
}

/// A bounded copy of the neighbour table, published by the poller at housekeeping.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeighSnapshot {
    /// When it was taken; `None` before the first.
    pub taken: Option<Instant>,
    /// The peers listed (at most [`NEIGH_LISTED`]), sorted by address.
    pub entries: Vec<NeighEntry>,
    /// Peers in the table (more than listed when the table is larger).
    pub total: usize,
    /// Address handles of peers gone, waiting for their last send to complete.
    pub retiring: usize,
    /// Sends in flight on those retiring address handles.
    pub retiring_inflight: u64,
}

/// Where the poller publishes the [`NeighSnapshot`] and the control socket reads it:
/// one short lock each, once per housekeeping and once per request, never per packet.
#[derive(Clone, Default)]
pub struct NeighView(Arc<Mutex<Arc<NeighSnapshot>>>);

impl std::fmt::Debug for NeighView {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("NeighView")
    }
}

impl NeighView {
    /// Replace the published snapshot (the old one is freed outside the lock, or by
    /// the last reader still holding it).
    pub fn publish(&self, snap: NeighSnapshot) {
        let snap = Arc::new(snap);
        let old = {
            let mut g = self.0.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::replace(&mut *g, snap)
        };
        drop(old);
    }

    /// The published snapshot (shared, not copied: the lock is held for a reference
    /// count).
    pub fn read(&self) -> Arc<NeighSnapshot> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// What [`Neighbours::learn`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Learned {
    /// A new peer.
    New,
    /// Known peer, same address.
    Refreshed,
    /// Known peer (same GID) at a new QPN: it restarted.
    QpnChanged {
        /// The QPN it had.
        old_qpn: u32,
    },
    /// A different GID maps to the same MAC (a hash collision for non-IPv4 GIDs): ignored.
    Collision,
    /// Not known and not to be created, or known and not to be changed by a message
    /// trusted this little: nothing changed.
    Unknown,
    /// A known peer's GID at another QPN claiming another address: both at once would
    /// move the peer's entry to another QP on its host. Nothing changed.
    Conflict,
}

/// How much an ARP may change in the table ([`Neighbours::learn`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trust {
    /// A reply, or a request for our own address: add the sender, or update it.
    Create,
    /// A gratuitous announcement (sender address = target address): update a known
    /// peer's QPN and address (a restarted peer's way to say where it is now); never add.
    Update,
    /// Any other ARP: refresh a known peer heard at exactly its known QPN; change
    /// nothing else.
    Refresh,
}

/// What [`Neighbours::seen`] found for a data packet's source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Seen {
    /// A known peer at its known QPN: refreshed.
    Known,
    /// A known peer's GID at another QPN: nothing changed (a restarted peer announces its
    /// new QPN by ARP; a peer that goes silent is re-resolved).
    OtherQpn {
        /// The QPN the peer is known at.
        known_qpn: u32,
    },
    /// A GID that is not in the table, or that collides with another peer's MAC.
    Unknown,
}

/// The table's maps hash with foldhash, seeded at random per map: several times cheaper
/// than std's SipHash for keys this small (a MAC, an address, a handle), looked up for
/// every packet sent and received, and still seeded, so a peer cannot choose keys that
/// collide (the keys come from the wire).
type Map<K, V> = HashMap<K, V, foldhash::quality::RandomState>;

/// The neighbour table.
pub struct Neighbours {
    peers: Map<Mac, Peer>,
    ips: Map<Ipv4Addr, Mac>,
    ips6: Map<Ipv6Addr, Mac>,
    inflight: Map<AhHandle, u32>,
    retiring: Vec<AhHandle>,
    resolving: Map<IpAddr, Instant>,
    capacity: usize,
    max_age: Duration,
    evicted: u64,
}

impl Neighbours {
    /// An empty table.
    pub fn new(capacity: usize, max_age: Duration) -> Self {
        Neighbours {
            peers: Map::with_capacity_and_hasher(capacity.min(4096), Default::default()),
            ips: Map::with_capacity_and_hasher(capacity.min(4096), Default::default()),
            ips6: Map::default(),
            inflight: Map::default(),
            retiring: Vec::new(),
            resolving: Map::default(),
            capacity: capacity.max(1),
            max_age,
            evicted: 0,
        }
    }

    /// Peers in the table.
    pub fn len(&self) -> usize {
        self.peers.len()
    }

    /// True when empty.
    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    /// Peers evicted so far (aged or pushed out).
    pub fn evicted(&self) -> u64 {
        self.evicted
    }

    /// Learn (or refresh) `hw` as the address of `ip`, as far as `trust` allows: a peer
    /// not yet known is added only with [`Trust::Create`]; a known one changes its QPN or
    /// address only with [`Trust::Create`] or [`Trust::Update`]. A peer holds one IPv4
    /// address (learning a new one forgets the old one) and up to [`PEER_ADDR6`] IPv6
    /// addresses (the oldest forgotten first). AHs that can be destroyed right away (of an
    /// evicted peer with no send in flight) are pushed to `destroy`.
    pub fn learn<I: Into<IpAddr>>(
        &mut self,
        ip: Option<I>,
        hw: IpoibAddr,
        trust: Trust,
        now: Instant,
        destroy: &mut Vec<AhHandle>,
    ) -> (Mac, Learned) {
        let ip: Option<IpAddr> = ip.map(Into::into);
        let mac = mac_for_gid(&hw.gid);
        let learned = match self.peers.get_mut(&mac) {
            Some(p) if p.hw.gid != hw.gid => return (mac, Learned::Collision),
            Some(p) if trust == Trust::Refresh => {
                if p.hw == hw && ip.is_none_or(|ip| p.holds(ip)) {
                    p.last_seen = now;
                    return (mac, Learned::Refreshed);
                }
                return (mac, Learned::Unknown);
            }
            Some(p) if p.hw.qpn != hw.qpn && ip.is_some_and(|ip| p.holds_other(ip)) => {
                // A new QP claiming an address the known host's entry does not hold (of
                // either family): a restarted peer keeps its addresses, and a readdressed
                // one keeps its QP. Another QP on the peer's host must not take the
                // peer's entry over this way, by ARP or by neighbour discovery.
                return (mac, Learned::Conflict);
            }
            Some(p) => {
                p.last_seen = now;
                let r = if p.hw.qpn != hw.qpn {
                    Learned::QpnChanged { old_qpn: p.hw.qpn }
                } else {
                    Learned::Refreshed
                };
                p.hw = hw;
                r
            }
            None if trust != Trust::Create => return (mac, Learned::Unknown),
            None => {
                if self.peers.len() >= self.capacity {
                    self.evict_oldest(destroy);
                }
                self.peers.insert(
                    mac,
                    Peer {
                        hw,
                        ah: None,
                        last_seen: now,
                        ip: None,
                        ip6: [None; PEER_ADDR6],
                        last_used: None,
                    },
                );
                Learned::New
            }
        };
        match ip {
            Some(IpAddr::V4(ip)) => self.assign4(mac, ip),
            Some(IpAddr::V6(ip)) => self.assign6(mac, ip),
            None => {}
        }
        if let Some(ip) = ip {
            self.resolving.remove(&ip);
        }
        (mac, learned)
    }

    /// `ip` is now the IPv4 address of the (known) peer behind `mac`.
    fn assign4(&mut self, mac: Mac, ip: Ipv4Addr) {
        let Some(p) = self.peers.get_mut(&mac) else {
            return;
        };
        let forget = p.ip.filter(|old| *old != ip);
        p.ip = Some(ip);
        if let Some(old_ip) = forget
            && self.ips.get(&old_ip) == Some(&mac)
        {
            self.ips.remove(&old_ip);
        }
        if let Some(old) = self.ips.insert(ip, mac)
            && old != mac
            && let Some(p) = self.peers.get_mut(&old)
            && p.ip == Some(ip)
        {
            p.ip = None;
        }
    }

    /// `ip` is now one of the IPv6 addresses of the (known) peer behind `mac`.
    fn assign6(&mut self, mac: Mac, ip: Ipv6Addr) {
        let Some(p) = self.peers.get_mut(&mac) else {
            return;
        };
        if p.ip6.contains(&Some(ip)) {
            return;
        }
        // The oldest address makes room: slots are kept oldest first.
        let forget = if p.ip6.iter().all(Option::is_some) {
            let f = p.ip6[0];
            p.ip6.rotate_left(1);
            p.ip6[PEER_ADDR6 - 1] = Some(ip);
            f
        } else {
            if let Some(slot) = p.ip6.iter_mut().find(|s| s.is_none()) {
                *slot = Some(ip);
            }
            None
        };
        if let Some(old_ip) = forget
            && self.ips6.get(&old_ip) == Some(&mac)
        {
            self.ips6.remove(&old_ip);
        }
        if let Some(old) = self.ips6.insert(ip, mac)
            && old != mac
            && let Some(p) = self.peers.get_mut(&old)
        {
            p.forget6(ip);
        }
    }

    /// Refresh a known peer from received traffic (the completion's source QPN and the
    /// GRH's source GID), only when it comes from the QPN the peer is known at. Traffic
    /// never adds a peer (it does not say which IPv4 address a peer owns) and never moves
    /// one to another QPN: any QP on a peer's host can send from that host's GID.
    pub fn seen(&mut self, hw: IpoibAddr, now: Instant) -> Seen {
        let mac = mac_for_gid(&hw.gid);
        match self.peers.get_mut(&mac) {
            Some(p) if p.hw.gid == hw.gid && p.hw.qpn == hw.qpn => {
                p.last_seen = now;
                Seen::Known
            }
            Some(p) if p.hw.gid == hw.gid => Seen::OtherQpn {
                known_qpn: p.hw.qpn,
            },
            _ => Seen::Unknown,
        }
    }

    /// Entries in the IPv4 address map (never more than [`Neighbours::len`]).
    pub fn ip_entries(&self) -> usize {
        self.ips.len()
    }

    /// Entries in the IPv6 address map (never more than [`PEER_ADDR6`] ×
    /// [`Neighbours::len`]).
    pub fn ip6_entries(&self) -> usize {
        self.ips6.len()
    }

    /// The peer behind a MAC.
    pub fn by_mac(&self, mac: &Mac) -> Option<&Peer> {
        self.peers.get(mac)
    }

    /// The peer owning an IPv4 or IPv6 address.
    pub fn by_ip(&self, ip: impl Into<IpAddr>) -> Option<(Mac, &Peer)> {
        let mac = match ip.into() {
            IpAddr::V4(ip) => self.ips.get(&ip)?,
            IpAddr::V6(ip) => self.ips6.get(&ip)?,
        };
        self.peers.get(mac).map(|p| (*mac, p))
    }

    /// Record the AH created for a peer.
    pub fn set_ah(&mut self, mac: &Mac, ah: AhHandle) {
        if let Some(p) = self.peers.get_mut(mac) {
            p.ah = Some(ah);
        }
    }

    /// A frame is being sent to the peer behind `mac`: marked used, and returned (one
    /// lookup for both).
    pub fn use_peer(&mut self, mac: &Mac, now: Instant) -> Option<Peer> {
        let p = self.peers.get_mut(mac)?;
        p.last_used = Some(now);
        Some(*p)
    }

    /// Peers that are being sent to (within `window`) but have not been heard from for
    /// `silent` longer than that: they may have moved to a new QPN whose announcement was
    /// lost. An address of each (its IPv4 one, else its newest IPv6 one) goes to `out`,
    /// to be re-resolved.
    pub fn silent_in_use(
        &self,
        now: Instant,
        silent: Duration,
        window: Duration,
        out: &mut Vec<IpAddr>,
    ) {
        for p in self.peers.values() {
            let ip =
                p.ip.map(IpAddr::V4)
                    .or_else(|| p.ip6.iter().rev().flatten().next().map(|a| IpAddr::V6(*a)));
            if let (Some(used), Some(ip)) = (p.last_used, ip)
                && now.saturating_duration_since(used) < window
                && used.saturating_duration_since(p.last_seen) >= silent
            {
                out.push(ip);
            }
        }
    }

    /// Take every address handle out of the table (live and retiring), keeping the
    /// peers: used when the endpoint that owns the AHs is torn down for a restart. New
    /// AHs are created on first use after the rebuild.
    pub fn take_ahs(&mut self) -> Vec<AhHandle> {
        let mut all: Vec<AhHandle> = self
            .peers
            .values_mut()
            .filter_map(|p| p.ah.take())
            .collect();
        all.append(&mut self.retiring);
        self.inflight.clear();
        all
    }

    /// Take the retiring address handles (their peers are gone) and forget every send in
    /// flight, keeping the live peers' AHs: used when the endpoint that owns the AHs
    /// stays open across a restart (its QP renewed) and every send has been accounted
    /// for (completed, flushed or reaped).
    pub fn take_retiring_ahs(&mut self) -> Vec<AhHandle> {
        self.inflight.clear();
        std::mem::take(&mut self.retiring)
    }

    /// A send using `ah` was posted.
    pub fn send_started(&mut self, ah: AhHandle) {
        *self.inflight.entry(ah).or_insert(0) += 1;
    }

    /// A send using `ah` completed (or was flushed or reaped). Returns the AH if it may now
    /// be destroyed (its peer is gone and this was its last send).
    pub fn send_finished(&mut self, ah: AhHandle) -> Option<AhHandle> {
        let n = self.inflight.get_mut(&ah)?;
        *n = n.saturating_sub(1);
        if *n == 0 {
            self.inflight.remove(&ah);
            if let Some(i) = self.retiring.iter().position(|a| *a == ah) {
                self.retiring.swap_remove(i);
                return Some(ah);
            }
        }
        None
    }

    /// AHs waiting for their last send to complete.
    pub fn retiring(&self) -> usize {
        self.retiring.len()
    }

    /// Whether an ARP request or neighbour solicitation for `ip` may be sent now (at
    /// most one per [`RESOLVE_INTERVAL`] per address); records it if so.
    pub fn should_resolve(&mut self, ip: impl Into<IpAddr>, now: Instant) -> bool {
        let ip = ip.into();
        match self.resolving.get(&ip) {
            Some(t) if now.saturating_duration_since(*t) < RESOLVE_INTERVAL => false,
            _ => {
                if self.resolving.len() >= self.capacity {
                    self.resolving
                        .retain(|_, t| now.saturating_duration_since(*t) < RESOLVE_INTERVAL);
                    if self.resolving.len() >= self.capacity {
                        return false;
                    }
                }
                self.resolving.insert(ip, now);
                true
            }
        }
    }

    /// A copy of the table for readers off the datapath (`uipoib neigh`): at most
    /// `limit` peers, the most recently heard ones, sorted by address. Called at
    /// housekeeping, never per packet; it allocates.
    pub fn snapshot(&self, now: Instant, limit: usize) -> NeighSnapshot {
        let pick: Vec<Mac> = if self.peers.len() <= limit {
            self.peers.keys().copied().collect()
        } else {
            // The `limit` most recently heard, in O(n log limit) and `limit` memory.
            let mut heap: BinaryHeap<Reverse<(Instant, Mac)>> = BinaryHeap::with_capacity(limit);
            for (mac, p) in &self.peers {
                if heap.len() < limit {
                    heap.push(Reverse((p.last_seen, *mac)));
                } else if let Some(Reverse((oldest, _))) = heap.peek()
                    && p.last_seen > *oldest
                {
                    heap.pop();
                    heap.push(Reverse((p.last_seen, *mac)));
                }
            }
            heap.into_iter().map(|Reverse((_, m))| m).collect()
        };
        let mut entries: Vec<NeighEntry> = pick
            .into_iter()
            .filter_map(|mac| {
                let p = self.peers.get(&mac)?;
                let resolving =
                    p.ip.map(IpAddr::V4)
                        .into_iter()
                        .chain(p.ip6.iter().flatten().map(|a| IpAddr::V6(*a)))
                        .any(|ip| {
                            self.resolving.get(&ip).is_some_and(|t| {
                                now.saturating_duration_since(*t) < RESOLVE_INTERVAL
                            })
                        });
                Some(NeighEntry {
                    mac,
                    hw: p.hw,
                    ip: p.ip,
                    ip6: p.ip6,
                    ah: p.ah.is_some(),
                    ah_inflight: p
                        .ah
                        .and_then(|ah| self.inflight.get(&ah).copied())
                        .unwrap_or(0),
                    last_seen: p.last_seen,
                    last_used: p.last_used,
                    resolving,
                })
            })
            .collect();
        entries.sort_by_key(NeighEntry::sort_key);
        NeighSnapshot {
            taken: Some(now),
            total: self.peers.len(),
            retiring: self.retiring.len(),
            retiring_inflight: self
                .retiring
                .iter()
                .map(|ah| u64::from(self.inflight.get(ah).copied().unwrap_or(0)))
                .sum(),
            entries,
        }
    }

    fn retire(&mut self, ah: AhHandle, destroy: &mut Vec<AhHandle>) {
        if self.inflight.get(&ah).copied().unwrap_or(0) == 0 {
            destroy.push(ah);
        } else {
            self.retiring.push(ah);
        }
    }

    fn remove(&mut self, mac: Mac, destroy: &mut Vec<AhHandle>) {
        if let Some(p) = self.peers.remove(&mac) {
            if let Some(ip) = p.ip
                && self.ips.get(&ip) == Some(&mac)
            {
                self.ips.remove(&ip);
            }
            for ip in p.ip6.iter().flatten() {
                if self.ips6.get(ip) == Some(&mac) {
                    self.ips6.remove(ip);
                }
            }
            if let Some(ah) = p.ah {
                self.retire(ah, destroy);
            }
            self.evicted += 1;
        }
    }

    fn evict_oldest(&mut self, destroy: &mut Vec<AhHandle>) {
        if let Some(mac) = self
            .peers
            .iter()
            .min_by_key(|(_, p)| p.last_seen)
            .map(|(m, _)| *m)
        {
            self.remove(mac, destroy);
        }
    }

    /// Drop peers not heard from for `max_age`; AHs free to destroy go to `destroy`.
    pub fn expire(&mut self, now: Instant, destroy: &mut Vec<AhHandle>) {
        let max_age = self.max_age;
        let old: Vec<Mac> = self
            .peers
            .iter()
            .filter(|(_, p)| now.saturating_duration_since(p.last_seen) >= max_age)
            .map(|(m, _)| *m)
            .collect();
        for mac in old {
            self.remove(mac, destroy);
        }
        self.resolving
            .retain(|_, t| now.saturating_duration_since(*t) < RESOLVE_INTERVAL);
    }
}

impl Peer {
    /// Whether `ip` is one of its addresses.
    pub fn holds(&self, ip: IpAddr) -> bool {
        match ip {
            IpAddr::V4(a) => self.ip == Some(a),
            IpAddr::V6(a) => self.ip6.contains(&Some(a)),
        }
    }

    /// Whether it holds any address, and `ip` is not one of them.
    fn holds_other(&self, ip: IpAddr) -> bool {
        let any = self.ip.is_some() || self.ip6.iter().any(Option::is_some);
        any && !self.holds(ip)
    }

    /// Forget one of its IPv6 addresses, keeping the others oldest first.
    fn forget6(&mut self, ip: Ipv6Addr) {
        if let Some(i) = self.ip6.iter().position(|a| *a == Some(ip)) {
            self.ip6[i] = None;
            self.ip6[i..].rotate_left(1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verbs::Gid;

    fn hw(last: u8, qpn: u32) -> IpoibAddr {
        IpoibAddr::new(qpn, Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, last)))
    }

    fn ip(last: u8) -> Ipv4Addr {
        Ipv4Addr::new(198, 18, 1, last)
    }

    #[test]
    fn learn_lookup_and_qpn_change() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        let (mac, l) = n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        assert_eq!(l, Learned::New);
        assert_eq!(n.by_mac(&mac).unwrap().hw.qpn, 17);
        assert_eq!(n.by_ip(ip(2)).unwrap().0, mac);
        assert_eq!(
            n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d).1,
            Learned::Refreshed
        );
        assert_eq!(
            n.learn(Some(ip(2)), hw(2, 18), Trust::Create, t0, &mut d).1,
            Learned::QpnChanged { old_qpn: 17 }
        );
        assert_eq!(n.seen(hw(2, 18), t0), Seen::Known);
        assert_eq!(n.seen(hw(2, 19), t0), Seen::OtherQpn { known_qpn: 18 });
        assert_eq!(
            n.by_mac(&mac).unwrap().hw.qpn,
            18,
            "traffic never moves a peer to another QPN"
        );
        assert_eq!(
            n.seen(hw(9, 1), t0),
            Seen::Unknown,
            "traffic does not add peers"
        );
        assert_eq!(n.by_mac(&mac).unwrap().ip, Some(ip(2)));
        assert!(d.is_empty());
    }

    #[test]
    fn traffic_from_another_qpn_does_not_refresh() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        let (mac, _) = n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        let later = t0 + Duration::from_secs(5);
        assert_eq!(n.seen(hw(2, 99), later), Seen::OtherQpn { known_qpn: 17 });
        assert_eq!(n.by_mac(&mac).unwrap().last_seen, t0);
        assert_eq!(n.seen(hw(2, 17), later), Seen::Known);
        assert_eq!(n.by_mac(&mac).unwrap().last_seen, later);
    }

    #[test]
    fn an_unknown_peer_is_not_created_unless_asked() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        assert_eq!(
            n.learn(Some(ip(2)), hw(2, 17), Trust::Update, t0, &mut d).1,
            Learned::Unknown
        );
        assert!(n.is_empty());
        assert_eq!(n.ip_entries(), 0);
        n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        assert_eq!(
            n.learn(Some(ip(2)), hw(2, 18), Trust::Update, t0, &mut d).1,
            Learned::QpnChanged { old_qpn: 17 },
            "a known peer is updated by an announcement"
        );
        assert_eq!(
            n.learn(Some(ip(3)), hw(2, 99), Trust::Refresh, t0, &mut d)
                .1,
            Learned::Unknown,
            "an ARP for someone else moves nothing"
        );
        assert_eq!(n.by_ip(ip(2)).unwrap().1.hw.qpn, 18);
        assert_eq!(
            n.learn(Some(ip(3)), hw(2, 99), Trust::Create, t0, &mut d).1,
            Learned::Conflict,
            "another QP of the peer's host claiming another address moves nothing"
        );
        assert_eq!(n.by_ip(ip(2)).unwrap().1.hw.qpn, 18);
        assert!(n.by_ip(ip(3)).is_none());
        assert_eq!(
            n.learn(Some(ip(3)), hw(2, 18), Trust::Create, t0, &mut d).1,
            Learned::Refreshed,
            "the peer's own QP may change its address"
        );
        assert_eq!(
            n.learn(Some(ip(3)), hw(2, 18), Trust::Refresh, t0, &mut d)
                .1,
            Learned::Refreshed
        );
    }

    #[test]
    fn one_peer_claiming_many_addresses_holds_one_entry() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(64, Duration::from_secs(10));
        let mut d = vec![];
        for i in 0..80_000u32 {
            let a = Ipv4Addr::from(0xC612_0000 | (i & 0xFFFF));
            n.learn(Some(a), hw(2, 17), Trust::Create, t0, &mut d);
        }
        assert_eq!(n.len(), 1);
        assert_eq!(n.ip_entries(), 1, "the replaced addresses are forgotten");
        let last = Ipv4Addr::from(0xC612_0000 | (79_999 & 0xFFFF));
        assert!(n.by_ip(last).is_some());
        assert!(n.by_ip(Ipv4Addr::from(0xC612_0000u32)).is_none());
    }

    #[test]
    fn bounded_evicts_least_recent_and_retires_ah() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(2, Duration::from_secs(10));
        let mut d = vec![];
        let (m1, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m1, AhHandle(1));
        n.send_started(AhHandle(1));
        n.learn(
            Some(ip(2)),
            hw(2, 17),
            Trust::Create,
            t0 + Duration::from_secs(1),
            &mut d,
        );
        n.learn(
            Some(ip(3)),
            hw(3, 17),
            Trust::Create,
            t0 + Duration::from_secs(2),
            &mut d,
        );
        assert_eq!(n.len(), 2);
        assert!(n.by_mac(&m1).is_none());
        assert!(n.by_ip(ip(1)).is_none());
        assert!(d.is_empty(), "AH 1 still has a send in flight");
        assert_eq!(n.retiring(), 1);
        assert_eq!(n.send_finished(AhHandle(1)), Some(AhHandle(1)));
        assert_eq!(n.retiring(), 0);
        assert_eq!(n.evicted(), 1);
    }

    #[test]
    fn aging_destroys_idle_ah_at_once() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        let (m, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m, AhHandle(4));
        n.expire(t0 + Duration::from_secs(9), &mut d);
        assert_eq!(n.len(), 1);
        n.expire(t0 + Duration::from_secs(10), &mut d);
        assert_eq!(n.len(), 0);
        assert_eq!(d, vec![AhHandle(4)]);
    }

    #[test]
    fn resolve_is_rate_limited() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        assert!(n.should_resolve(ip(5), t0));
        assert!(!n.should_resolve(ip(5), t0 + Duration::from_millis(500)));
        assert!(n.should_resolve(ip(6), t0));
        assert!(n.should_resolve(ip(5), t0 + RESOLVE_INTERVAL));
    }

    #[test]
    fn ip_moves_between_peers() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        let (m1, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        let (m2, _) = n.learn(Some(ip(1)), hw(2, 17), Trust::Create, t0, &mut d);
        assert_eq!(n.by_ip(ip(1)).unwrap().0, m2);
        assert_eq!(n.by_mac(&m1).unwrap().ip, None);
    }

    #[test]
    fn using_a_peer_marks_it_used_and_hands_it_out() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(300));
        let mut d = vec![];
        let (m, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        assert_eq!(n.by_mac(&m).unwrap().last_used, None);
        let later = t0 + Duration::from_secs(1);
        let p = n.use_peer(&m, later).unwrap();
        assert_eq!((p.hw.qpn, p.last_used), (17, Some(later)));
        assert_eq!(n.by_mac(&m).unwrap().last_used, Some(later));
        let (other, _) = {
            let mut o = Neighbours::new(8, Duration::from_secs(300));
            o.learn(Some(ip(2)), hw(2, 18), Trust::Create, t0, &mut d)
        };
        assert!(n.use_peer(&other, later).is_none());
    }

    #[test]
    fn silent_peers_in_use_are_found_and_take_ahs_keeps_peers() {
        let t0 = Instant::now();
        let s = Duration::from_secs(3);
        let mut n = Neighbours::new(8, Duration::from_secs(300));
        let mut d = vec![];
        let (m, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m, AhHandle(3));
        n.send_started(AhHandle(3));
        let mut out = vec![];
        n.use_peer(&m, t0 + Duration::from_secs(2));
        n.silent_in_use(t0 + Duration::from_secs(2), s, s, &mut out);
        assert!(out.is_empty(), "heard from recently enough");
        n.use_peer(&m, t0 + Duration::from_secs(4));
        n.silent_in_use(t0 + Duration::from_secs(4), s, s, &mut out);
        assert_eq!(out, vec![ip(1)]);
        out.clear();
        n.silent_in_use(t0 + Duration::from_secs(60), s, s, &mut out);
        assert!(out.is_empty(), "not in use any more");
        assert_eq!(n.take_ahs(), vec![AhHandle(3)]);
        assert_eq!(n.len(), 1);
        assert_eq!(n.by_mac(&m).unwrap().ah, None);
        assert_eq!(
            n.send_finished(AhHandle(3)),
            None,
            "in-flight counts were reset"
        );
    }

    #[test]
    fn take_ahs_returns_live_and_retiring_ahs() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(1, Duration::from_secs(10));
        let mut d = vec![];
        let (m1, _) = n.learn(Some(ip(1)), hw(1, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m1, AhHandle(1));
        n.send_started(AhHandle(1));
        let (m2, _) = n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m2, AhHandle(2));
        let mut all = n.take_ahs();
        all.sort();
        assert_eq!(all, vec![AhHandle(1), AhHandle(2)]);
        assert_eq!(n.retiring(), 0);
        assert_eq!(n.len(), 1, "the peers stay for the next epoch");
    }

    fn ip6(last: u16) -> Ipv6Addr {
        Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, last)
    }

    #[test]
    fn a_peer_holds_its_ipv4_and_a_bounded_set_of_ipv6_addresses() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(10));
        let mut d = vec![];
        let (mac, l) = n.learn(Some(ip6(2)), hw(2, 17), Trust::Create, t0, &mut d);
        assert_eq!(l, Learned::New);
        n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        assert_eq!(n.by_ip(ip6(2)).unwrap().0, mac);
        assert_eq!(n.by_ip(ip(2)).unwrap().0, mac);
        assert_eq!(n.len(), 1);
        // More IPv6 addresses than a peer holds: the oldest are forgotten, the maps stay
        // bounded.
        for k in 3..1000u16 {
            n.learn(Some(ip6(k)), hw(2, 17), Trust::Create, t0, &mut d);
        }
        assert_eq!(n.ip6_entries(), PEER_ADDR6);
        assert!(n.by_ip(ip6(2)).is_none());
        assert!(n.by_ip(ip6(999)).is_some());
        assert!(n.by_ip(ip6(996)).is_some());
        assert_eq!(n.by_ip(ip(2)).unwrap().0, mac, "the IPv4 address stays");
        // Refresh only at a held address and the known QPN.
        assert_eq!(
            n.learn(Some(ip6(999)), hw(2, 17), Trust::Refresh, t0, &mut d)
                .1,
            Learned::Refreshed
        );
        assert_eq!(
            n.learn(Some(ip6(5)), hw(2, 17), Trust::Refresh, t0, &mut d)
                .1,
            Learned::Unknown
        );
        // Another QP of the host claiming an IPv6 address the peer does not hold.
        assert_eq!(
            n.learn(Some(ip6(5)), hw(2, 99), Trust::Create, t0, &mut d)
                .1,
            Learned::Conflict
        );
        // Nor by the other family: a peer known by IPv4 alone is not moved by an IPv6
        // claim from another QP of its host, and the reverse.
        let (m4, _) = n.learn(Some(ip(7)), hw(7, 17), Trust::Create, t0, &mut d);
        assert_eq!(
            n.learn(Some(ip6(70)), hw(7, 99), Trust::Update, t0, &mut d)
                .1,
            Learned::Conflict
        );
        let (m6, _) = n.learn(Some(ip6(80)), hw(8, 17), Trust::Create, t0, &mut d);
        assert_eq!(
            n.learn(Some(ip(8)), hw(8, 99), Trust::Update, t0, &mut d).1,
            Learned::Conflict
        );
        assert_eq!(
            (n.by_mac(&m4).unwrap().hw.qpn, n.by_mac(&m6).unwrap().hw.qpn),
            (17, 17)
        );
        // The peer's own QP may add an address of the other family.
        assert_eq!(
            n.learn(Some(ip6(70)), hw(7, 17), Trust::Create, t0, &mut d)
                .1,
            Learned::Refreshed
        );
        // A restarted peer announcing one of its addresses moves.
        assert_eq!(
            n.learn(Some(ip6(999)), hw(2, 99), Trust::Update, t0, &mut d)
                .1,
            Learned::QpnChanged { old_qpn: 17 }
        );
        // An address moving to another peer leaves the first.
        n.learn(Some(ip6(999)), hw(3, 20), Trust::Create, t0, &mut d);
        assert_eq!(n.by_ip(ip6(999)).unwrap().1.hw, hw(3, 20));
        assert!(!n.by_mac(&mac).unwrap().holds(IpAddr::V6(ip6(999))));
        assert_eq!(
            n.ip6_entries(),
            PEER_ADDR6 + 2,
            "peers 2 and 3 hold four, 7 and 8 one each"
        );
        // Eviction forgets every address of the peer.
        n.expire(t0 + Duration::from_secs(60), &mut d);
        assert_eq!((n.len(), n.ip_entries(), n.ip6_entries()), (0, 0, 0));
    }

    #[test]
    fn snapshot_lists_addresses_ah_and_state_and_is_bounded() {
        let t0 = Instant::now();
        let mut n = Neighbours::new(8, Duration::from_secs(60));
        let mut d = vec![];
        let (m2, _) = n.learn(Some(ip(2)), hw(2, 17), Trust::Create, t0, &mut d);
        n.learn(Some(ip6(2)), hw(2, 17), Trust::Create, t0, &mut d);
        n.set_ah(&m2, AhHandle(7));
        n.send_started(AhHandle(7));
        n.send_started(AhHandle(7));
        let later = t0 + Duration::from_secs(5);
        n.learn(Some(ip(1)), hw(1, 18), Trust::Create, later, &mut d);
        let s = n.snapshot(later, NEIGH_LISTED);
        assert_eq!((s.total, s.entries.len(), s.taken), (2, 2, Some(later)));
        // Sorted by address: .1 before .2.
        let (e1, e2) = (&s.entries[0], &s.entries[1]);
        assert_eq!(e1.ip, Some(ip(1)));
        assert_eq!((e1.ah, e1.ah_inflight, e1.hw.qpn), (false, 0, 18));
        assert_eq!(e1.state(later), NeighState::Reachable);
        assert_eq!(
            e2.addrs().collect::<Vec<_>>(),
            vec![IpAddr::V4(ip(2)), IpAddr::V6(ip6(2))]
        );
        assert_eq!((e2.ah, e2.ah_inflight, e2.mac), (true, 2, m2));
        assert_eq!(e2.state(later), NeighState::Stale, "silent for 5 s");
        // Being re-resolved: probe.
        assert!(n.should_resolve(ip(2), later));
        let s = n.snapshot(later, NEIGH_LISTED);
        assert_eq!(s.entries[1].state(later), NeighState::Probe);
        // Evicted with a send in flight: its AH retires, counted apart.
        n.expire(t0 + Duration::from_secs(61), &mut d);
        let s = n.snapshot(t0 + Duration::from_secs(61), NEIGH_LISTED);
        assert_eq!((s.total, s.retiring, s.retiring_inflight), (1, 1, 2));
        // More peers than listed: the most recently heard are kept.
        let mut n = Neighbours::new(64, Duration::from_secs(60));
        for k in 1..=20u8 {
            n.learn(
                Some(ip(k)),
                hw(k, 17),
                Trust::Create,
                t0 + Duration::from_secs(u64::from(k)),
                &mut d,
            );
        }
        let s = n.snapshot(t0 + Duration::from_secs(30), 5);
        assert_eq!((s.total, s.entries.len()), (20, 5));
        let listed: Vec<_> = s.entries.iter().map(|e| e.ip.unwrap()).collect();
        assert_eq!(listed, (16..=20).map(ip).collect::<Vec<_>>());
    }

    #[test]
    fn a_view_serves_the_last_published_snapshot() {
        let v = NeighView::default();
        assert_eq!(v.read().taken, None);
        let t0 = Instant::now();
        let kept = v.read();
        v.publish(NeighSnapshot {
            taken: Some(t0),
            total: 3,
            ..Default::default()
        });
        assert_eq!((v.read().taken, v.read().total), (Some(t0), 3));
        assert_eq!(kept.total, 0, "a reader's copy is its own");
    }
}
