//! The send path: frames from the TAP translated and posted, ARP answered and resolved,
//! send completions polled and their slots and address handles freed.

use super::*;
use crate::wire::translate::{self, Body, Otherwise, Route, TxDrop};
use std::net::{IpAddr, Ipv6Addr};

// The verbs layer and the codecs name the same multicast QPN.
const _: () = assert!(MULTICAST_QPN == ipoib::MULTICAST_QPN);

/// Where a frame from the TAP is read into a send slot's room: its Ethernet header ends
/// where the IPoIB header does once translated in place ([`translate::IN_PLACE_AT`]), so
/// the IPoIB packet starts at [`SEND_HEADROOM`], where every send starts.
const FRAME_AT: usize = SEND_HEADROOM - translate::IN_PLACE_AT;

impl Interface {
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

    pub(super) fn release_ahs(&mut self) {
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

    pub(super) fn on_send_done(&mut self, c: Completion, now: Instant) {
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

    /// Read frames from the TAP while the send ring has room (at most one batch), and
    /// post them as one chain. Returns frames taken from the TAP. `Ok` with the TAP
    /// drained is signalled through `gate`.
    pub fn tx_from_tap(
        &mut self,
        tap: &dyn FrameIo,
        gate: &mut crate::iface::napi::TxGate,
        now: Instant,
    ) -> Result<usize, Failure> {
        let mut taken = 0;
        while taken < self.tx_batch && gate.may_read(self.ledger.free_send()) {
            // The frame is read straight into a send slot's room, placed so that its IP
            // packet already lies where the send carries it: a data packet is sent
            // without being copied again.
            let Some(slot) = self.ledger.reserve_send() else {
                break;
            };
            // (A reserved slot always has its room; an empty one reads as a short frame.)
            let room = self
                .ep
                .send_room(slot)
                .get_mut(FRAME_AT..)
                .unwrap_or_default();
            let read = tap.read_frame(room);
            if read.is_err() {
                self.ledger.release(Ring::Send, slot);
            }
            let n = match read {
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
            if let Err(reason) = self.tx_slot(slot, n, now) {
                self.stats.count_drop(reason);
            }
        }
        self.flush_chain(now);
        self.check_broken()?;
        Ok(taken)
    }

    /// Translate the frame of `n` bytes read into send slot `slot`'s room (at
    /// [`FRAME_AT`]) into a send on the chain. The slot is reserved; a dropped frame
    /// gives it back.
    pub(super) fn tx_slot(&mut self, slot: u32, n: usize, now: Instant) -> Result<(), DropReason> {
        match self.tx_slot_inner(slot, n, now) {
            Ok(()) => Ok(()),
            Err((reason, resolve)) => {
                self.ledger.release(Ring::Send, slot);
                // Given back first: the request may take the slot the frame had.
                if let Some(ip) = resolve {
                    self.resolve(ip, now);
                }
                Err(reason)
            }
        }
    }

    fn tx_slot_inner(
        &mut self,
        slot: u32,
        n: usize,
        now: Instant,
    ) -> Result<(), (DropReason, Option<IpAddr>)> {
        let drop = |r| (r, None);
        let local = self.local();
        let neigh = &self.neigh;
        let frame = self
            .ep
            .send_room(slot)
            .get_mut(FRAME_AT..FRAME_AT + n)
            .ok_or((DropReason::TxOversized, None))?;
        let plan = translate::plan_send(frame, &local, self.mtu, |mac| {
            neigh.by_mac(mac).map(|p| p.hw)
        })
        .map_err(|why| drop(tx_drop_reason(why)))?;
        let dest = match plan.route {
            Route::Group => self.group_dest(),
            Route::Peer { mac, otherwise } => match (self.unicast_dest(&mac, now), otherwise) {
                (Ok(d), _) => d,
                (Err(_), Otherwise::Group) => self.group_dest(),
                (Err(DropReason::TxNoNeighbour), Otherwise::Resolve(ip)) => {
                    return Err((DropReason::TxNoNeighbour, Some(ip)));
                }
                (Err(r), _) => return Err(drop(r)),
            },
        };
        let room = self.ep.send_room(slot);
        let frame = &mut room[FRAME_AT..FRAME_AT + n];
        let len = match plan.body.emit_in_place(frame) {
            Ok(Some(len)) => len,
            Ok(None) => {
                // ARP and neighbour discovery change length on the way: copied out and
                // written back translated (the control plane, not the data path).
                let copy = self
                    .frame
                    .get_mut(..n)
                    .ok_or((DropReason::TxOversized, None))?;
                copy.copy_from_slice(frame);
                plan.body
                    .emit(&self.frame[..n], self.ep.send_buf(slot))
                    .map_err(|why| drop(tx_drop_reason(why)))?
            }
            Err(why) => return Err(drop(tx_drop_reason(why))),
        };
        let kind = match plan.body {
            Body::Arp(_) => Sent::Arp,
            Body::Nd { .. } => Sent::Nd,
            Body::Ipv4 { .. } | Body::Ipv6 { .. } => Sent::Data,
        };
        self.push_send(slot, len, dest, kind);
        Ok(())
    }

    pub(super) fn push_arp(
        &mut self,
        msg: &IpoibArp,
        dest: (Dest, Option<AhHandle>),
    ) -> Result<(), DropReason> {
        let slot = self.ledger.reserve_send().ok_or(DropReason::TxPostFailed)?;
        match translate::emit_arp(msg, self.ep.send_buf(slot)) {
            Ok(n) => {
                self.push_send(slot, n, dest, Sent::Arp);
                Ok(())
            }
            Err(why) => {
                self.ledger.release(Ring::Send, slot);
                Err(tx_drop_reason(why))
            }
        }
    }

    /// Write a neighbour discovery message of this interface's own (a solicitation for
    /// `target` from `src`, or with `src` `None` an unsolicited advertisement of `target`)
    /// and send it to the group.
    pub(super) fn push_nd(
        &mut self,
        src: Option<Ipv6Addr>,
        target: Ipv6Addr,
    ) -> Result<(), DropReason> {
        let slot = self.ledger.reserve_send().ok_or(DropReason::TxPostFailed)?;
        match translate::emit_nd(self.own_hw, src, target, self.ep.send_buf(slot)) {
            Ok(n) => {
                let dest = self.group_dest();
                self.push_send(slot, n, dest, Sent::Nd);
                Ok(())
            }
            Err(why) => {
                self.ledger.release(Ring::Send, slot);
                Err(tx_drop_reason(why))
            }
        }
    }

    /// Ask the broadcast group who has `ip` (rate-limited per address): an ARP request
    /// for IPv4, a neighbour solicitation (from the address of ours that fits) for IPv6.
    pub(super) fn resolve(&mut self, ip: IpAddr, now: Instant) {
        if !self.neigh.should_resolve(ip, now) || self.ledger.free_send() == 0 {
            return;
        }
        let sent = match ip {
            IpAddr::V4(ip) => {
                let msg = translate::arp_request(self.own_hw, self.addr.addr, ip);
                let dest = self.group_dest();
                self.push_arp(&msg, dest)
            }
            IpAddr::V6(ip) => self.push_nd(Some(self.addr6.source_for(&ip)), ip),
        };
        if sent.is_ok() {
            stats::add(&self.stats.neigh_resolves, 1);
        }
    }

    /// Announce this interface's address (gratuitous ARP to the broadcast group).
    pub fn announce(&mut self, now: Instant) {
        self.announced = true;
        let msg = translate::arp_request(self.own_hw, self.addr.addr, self.addr.addr);
        let dest = self.group_dest();
        if let Err(r) = self.push_arp(&msg, dest) {
            self.stats.count_drop(r);
        }
        // And each IPv6 address, by unsolicited advertisement (override set): a peer that
        // knows this interface only by IPv6 follows it to its new QPN too.
        let addrs = self.addr6;
        for a in addrs.iter() {
            if let Err(r) = self.push_nd(None, a) {
                self.stats.count_drop(r);
            }
        }
        self.flush_chain(now);
    }

    /// [`Interface::announce`], unless this epoch already did: the supervisor announces a
    /// rebuilt interface as soon as its receive ring is posted, before its poller starts.
    pub fn announce_once(&mut self, now: Instant) {
        if !self.announced {
            self.announce(now);
        }
    }

    pub(super) fn group_dest(&self) -> (Dest, Option<AhHandle>) {
        (
            Dest {
                ah: self.group_ah,
                qpn: MULTICAST_QPN,
                qkey: self.qkey,
            },
            None,
        )
    }

    pub(super) fn unicast_dest(
        &mut self,
        mac: &Mac,
        now: Instant,
    ) -> Result<(Dest, Option<AhHandle>), DropReason> {
        let peer = self
            .neigh
            .use_peer(mac, now)
            .ok_or(DropReason::TxNoNeighbour)?;
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

    /// Queue slot `slot` (`payload` bytes behind the IPoIB header) on the chain; an ARP
    /// is counted here.
    pub(super) fn push_send(
        &mut self,
        slot: u32,
        payload: usize,
        dest: (Dest, Option<AhHandle>),
        kind: Sent,
    ) {
        match kind {
            Sent::Arp => stats::add(&self.stats.arp_tx, 1),
            Sent::Nd => stats::add(&self.stats.nd_tx, 1),
            Sent::Data => {}
        }
        let arp = kind != Sent::Data;
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
    pub(super) fn flush_chain(&mut self, now: Instant) {
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
}

/// The counter a frame dropped by the translation goes to.
fn tx_drop_reason(why: TxDrop) -> DropReason {
    match why {
        TxDrop::Short => DropReason::TxShort,
        TxDrop::Vlan => DropReason::TxVlan,
        TxDrop::BadIpv6 => DropReason::TxBadIpv6,
        TxDrop::BadNd => DropReason::TxBadNd,
        TxDrop::NdForeignLinkAddr => DropReason::TxNdForeignLinkAddr,
        TxDrop::Unsupported => DropReason::TxUnsupported,
        TxDrop::Oversized => DropReason::TxOversized,
        TxDrop::BadIpv4 => DropReason::TxBadIpv4,
        TxDrop::BadArp => DropReason::TxBadArp,
        TxDrop::NoNeighbour => DropReason::TxNoNeighbour,
    }
}

/// What a send carries, for the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Sent {
    /// An IP packet.
    Data,
    /// An ARP message.
    Arp,
    /// A neighbour discovery message.
    Nd,
}
