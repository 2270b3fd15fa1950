//! The receive path: receive completions polled, each packet checked against what the
//! hardware reports and written to the TAP, the receive ring re-posted.

use super::*;

impl Interface {
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
    pub(super) fn check_flushes(&mut self) -> Result<(), Failure> {
        self.check_broken()?;
        if self.unexpected_flushes > 0 {
            let n = std::mem::take(&mut self.unexpected_flushes);
            return Err(Failure::QpError(n));
        }
        Ok(())
    }

    pub(super) fn check_broken(&mut self) -> Result<(), Failure> {
        if let Some(e) = self.broken.take() {
            self.untrusted = true;
            return Err(Failure::Verbs(e));
        }
        Ok(())
    }

    pub(super) fn on_recv(&mut self, c: Completion, tap: Option<&dyn FrameIo>, now: Instant) {
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

    /// One `poll_cq` of up to `want` receive completions, each handled (delivered to
    /// `tap`, or with none counted as dropped). Never polls after a failed poll.
    pub(super) fn poll_recv_batch(
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

pub(super) struct RxCtx<'a> {
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
pub(super) fn rx_packet(
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
pub(super) fn is_reserved_qpn(qpn: u32) -> bool {
    qpn <= 1 || qpn == MULTICAST_QPN
}

pub(super) fn is_subnet_broadcast(net: &Ipv4Cidr, ip: Ipv4Addr) -> bool {
    if net.prefix >= 31 {
        return false;
    }
    let host_mask = u32::MAX >> net.prefix;
    net.contains(ip) && u32::from(ip) & host_mask == host_mask
}
