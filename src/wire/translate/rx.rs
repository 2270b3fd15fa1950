//! Receive: one UD receive in, one Ethernet frame for the TAP out.

use std::net::Ipv4Addr;

use super::{Local, RxDrop};
use crate::wire::arp::{self, IpoibArp};
use crate::wire::eth::{self, EthHeader, Mac, mac_for_gid, multicast_mac};
use crate::wire::grh::{self, GRH_LEN, GrhKind};
use crate::wire::ipoib::{self, IpoibAddr, MULTICAST_QPN};
use crate::wire::ipv4::{self, Ipv4Cidr};
use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, WireError};

/// What the completion reports of one receive, besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sending QP.
    pub src_qp: u32,
    /// Whether the receive starts with a GRH.
    pub has_grh: bool,
}

/// How far an ARP's claim about its sender may be believed, by what the message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// A reply, or a request for this interface's address: the sender talks to us.
    Addressed,
    /// A gratuitous announcement (sender address = target address).
    Announcement,
    /// Any other ARP: overheard.
    Overheard,
}

/// What an ARP that parsed says about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ArpSender {
    /// Refused by the checks (the verdict says why): nothing to learn.
    Refused,
    /// An address probe (sender 0.0.0.0, RFC 5227): passed on, never learned.
    Probe,
    /// A claim that passed every check: `ip` is at `hw`, the packet's real source.
    Claim {
        /// The sender's address.
        ip: Ipv4Addr,
        /// The sender's IPoIB address.
        hw: IpoibAddr,
        /// How far it may be believed.
        standing: Standing,
    },
}

/// What one receive means for the neighbour table and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxFact {
    /// Nothing (it was refused before its kind was known).
    None,
    /// This interface's own packet, looped back by the group.
    OwnLoopback,
    /// An ARP message that parsed.
    Arp(ArpSender),
    /// A data packet from `from`, as the hardware reports it (the GRH's source GID and
    /// the completion's source QPN).
    Data {
        /// Its real source.
        from: IpoibAddr,
    },
}

/// Whether a receive goes to the TAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxVerdict {
    /// Write the first this many bytes of the frame to the TAP.
    Deliver(usize),
    /// Nothing to write and nothing dropped (own loopback).
    Consumed,
    /// Dropped for this reason.
    Drop(RxDrop),
}

/// What [`receive`] made of one receive: the facts to apply, and the verdict. Facts come
/// with a drop too (an ARP refused by its checks still was an ARP received).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Received {
    /// What it means for the table and the counters.
    pub fact: RxFact,
    /// Whether (and how much of) the frame goes to the TAP.
    pub verdict: RxVerdict,
}

impl Received {
    fn drop(fact: RxFact, why: RxDrop) -> Received {
        Received {
            fact,
            verdict: RxVerdict::Drop(why),
        }
    }
}

/// Translate one UD receive into an Ethernet frame in `frame`.
///
/// `buf` is the receive buffer cut to the completion's length: the GRH (laid out as
/// `grh` says), the IPoIB header and the payload. The sender is who the hardware says
/// (GRH source GID, completion source QPN); an ARP is passed on only when it names that
/// sender, a sender QPN that can send, and an address in `local`'s subnet (or 0.0.0.0,
/// a probe). The frame's source MAC stands for the sender's GID; its destination is ours,
/// broadcast (a request, or a packet to the group, the broadcast or the subnet's
/// broadcast address) or the IPv4 multicast MAC.
pub fn receive(
    buf: &[u8],
    meta: RecvMeta,
    grh: GrhKind,
    local: &Local,
    frame: &mut [u8],
) -> Received {
    use RxFact::None as Nothing;
    if buf.len() < GRH_LEN + ipoib::HEADER_LEN {
        return Received::drop(Nothing, RxDrop::Short);
    }
    // A UD receive on RoCE always carries the GRH: without it nothing says who sent the
    // packet (the IB link layer, whose local traffic may come without one, is refused at
    // startup).
    if !meta.has_grh {
        return Received::drop(Nothing, RxDrop::NoGrh);
    }
    let Ok(g) = grh::parse(&buf[..GRH_LEN], grh) else {
        return Received::drop(Nothing, RxDrop::BadGrh);
    };
    // The packet's real source, as the hardware reports it.
    let src_hw = IpoibAddr::new(meta.src_qp, g.sgid);
    if src_hw.qpn == local.hw.qpn && src_hw.gid == local.hw.gid {
        return Received {
            fact: RxFact::OwnLoopback,
            verdict: RxVerdict::Consumed,
        };
    }
    let (ethertype, payload) = match ipoib::parse_header(&buf[GRH_LEN..]) {
        Ok(x) => x,
        Err(WireError::Truncated { .. }) => return Received::drop(Nothing, RxDrop::Short),
        Err(_) => return Received::drop(Nothing, RxDrop::BadHeader),
    };
    match ethertype {
        ETHERTYPE_ARP => match IpoibArp::parse(payload) {
            Ok(a) => receive_arp(&a, src_hw, local, frame),
            Err(_) => Received::drop(Nothing, RxDrop::BadArp),
        },
        ETHERTYPE_IPV4 => {
            let Ok(s) = ipv4::parse_summary(payload) else {
                return Received::drop(Nothing, RxDrop::BadIpv4);
            };
            let payload = &payload[..s.total_len];
            // Traffic refreshes a peer only from the QPN it is known at, and never moves
            // it: any QP on the peer's host sends from the same GID.
            let fact = RxFact::Data { from: src_hw };
            let via_group = g.dgid.is_multicast();
            let dst = if s.dst.is_multicast() {
                multicast_mac(s.dst)
            } else if via_group || s.dst.is_broadcast() || is_subnet_broadcast(&local.addr, s.dst) {
                Mac::BROADCAST
            } else {
                local.mac
            };
            let total = eth::HEADER_LEN + payload.len();
            if total > frame.len() {
                return Received::drop(fact, RxDrop::Short);
            }
            let h = EthHeader {
                dst,
                src: mac_for_gid(&g.sgid),
                ethertype: ETHERTYPE_IPV4,
            };
            if eth::emit_header(frame, &h).is_err() {
                return Received::drop(fact, RxDrop::Short);
            }
            frame[eth::HEADER_LEN..total].copy_from_slice(payload);
            Received {
                fact,
                verdict: RxVerdict::Deliver(total),
            }
        }
        _ => Received::drop(Nothing, RxDrop::Unsupported),
    }
}

/// An ARP from `src_hw`, checked and written in its Ethernet form.
fn receive_arp(a: &IpoibArp, src_hw: IpoibAddr, local: &Local, frame: &mut [u8]) -> Received {
    let refused = RxFact::Arp(ArpSender::Refused);
    if a.sha.is_zero()
        || a.sha.gid.is_multicast()
        || a.sha.gid.is_zero()
        || is_reserved_qpn(a.sha.qpn)
    {
        return Received::drop(refused, RxDrop::BadArp);
    }
    // Believed only from its real source: the claimed sender must be the QP and GID the
    // packet came from.
    if a.sha != src_hw {
        return Received::drop(refused, RxDrop::ArpSpoofed);
    }
    let probe = a.spa.is_unspecified();
    if !probe && !local.addr.contains(a.spa) {
        return Received::drop(refused, RxDrop::ArpOffSubnet);
    }
    let fact = RxFact::Arp(if probe {
        ArpSender::Probe
    } else {
        // A new neighbour only from a reply or a request for our address (as the kernel's
        // ARP does); a gratuitous announcement only updates a known one (a restarted
        // peer at its new QPN); any other ARP changes nothing.
        let standing =
            if a.op == arp::OP_REPLY || (a.op == arp::OP_REQUEST && a.tpa == local.addr.addr) {
                Standing::Addressed
            } else if a.spa == a.tpa {
                Standing::Announcement
            } else {
                Standing::Overheard
            };
        ArpSender::Claim {
            ip: a.spa,
            hw: a.sha,
            standing,
        }
    });
    let src_mac = mac_for_gid(&a.sha.gid);
    let tha = if a.tha.is_zero() {
        Mac::ZERO
    } else if a.tha.gid == local.hw.gid {
        local.mac
    } else {
        mac_for_gid(&a.tha.gid)
    };
    let h = EthHeader {
        dst: if a.op == arp::OP_REQUEST {
            Mac::BROADCAST
        } else {
            local.mac
        },
        src: src_mac,
        ethertype: ETHERTYPE_ARP,
    };
    if eth::emit_header(frame, &h).is_err() {
        return Received::drop(fact, RxDrop::Short);
    }
    match a.to_eth(src_mac, tha).emit(&mut frame[eth::HEADER_LEN..]) {
        Ok(n) => Received {
            fact,
            verdict: RxVerdict::Deliver(eth::HEADER_LEN + n),
        },
        Err(_) => Received::drop(fact, RxDrop::BadArp),
    }
}

/// QPNs no sender of IPoIB traffic can have: QP0 and QP1 (the management QPs) and the
/// multicast QPN.
fn is_reserved_qpn(qpn: u32) -> bool {
    qpn <= 1 || qpn == MULTICAST_QPN
}

/// Whether `ip` is the broadcast address of `net` (a /31 or /32 has none).
fn is_subnet_broadcast(net: &Ipv4Cidr, ip: Ipv4Addr) -> bool {
    if net.prefix >= 31 {
        return false;
    }
    let host_mask = u32::MAX >> net.prefix;
    net.contains(ip) && u32::from(ip) & host_mask == host_mask
}
