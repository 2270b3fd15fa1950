//! Receive: one UD receive in, one Ethernet frame for the TAP out.

use std::net::{Ipv4Addr, Ipv6Addr};

use super::{Local, RxDrop};
use crate::wire::arp::{self, IpoibArp};
use crate::wire::eth::{self, EthHeader, Mac, mac_for_gid, multicast_mac};
use crate::wire::grh::{self, GRH_LEN, GrhKind};
use crate::wire::ipoib::{self, IpoibAddr, MULTICAST_QPN};
use crate::wire::ipv4::{self, Ipv4Cidr};
use crate::wire::ipv6::{self, Ipv6Summary, PROTO_ICMPV6};
use crate::wire::ndisc::{self, NA_OVERRIDE, NA_SOLICITED};
use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, WireError};

/// What the completion reports of one receive, besides its bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecvMeta {
    /// The sending QP.
    pub src_qp: u32,
    /// Whether the receive starts with a GRH.
    pub has_grh: bool,
}

/// How far an ARP's or a neighbour discovery message's claim about its sender may be believed, by what the message is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    /// A reply, or a request for this interface's address (ARP); a solicited
    /// advertisement, or a solicitation for one of this interface's addresses (ND): the
    /// sender talks to us.
    Addressed,
    /// A gratuitous announcement (ARP: sender address = target address; ND: an
    /// unsolicited advertisement with the override flag).
    Announcement,
    /// Any other message: overheard.
    Overheard,
}

/// What an ARP or neighbour discovery message that parsed says about its sender.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sender<I> {
    /// Refused by the checks (the verdict says why): nothing to learn.
    Refused,
    /// An address probe (ARP sender 0.0.0.0, RFC 5227; a duplicate address detection
    /// solicitation from ::, RFC 4862): passed on, never learned.
    Probe,
    /// A message naming no link-layer address of its sender (an advertisement without
    /// a target option, a router solicitation without a source option, a redirect):
    /// passed on, nothing to learn.
    Silent,
    /// A claim that passed every check: `ip` is at `hw`, the packet's real source.
    Claim {
        /// The sender's address.
        ip: I,
        /// The sender's IPoIB address.
        hw: IpoibAddr,
        /// How far it may be believed.
        standing: Standing,
    },
}

/// What an ARP says about its sender.
pub type ArpSender = Sender<Ipv4Addr>;
/// What a neighbour discovery message says about its sender.
pub type NdSender = Sender<Ipv6Addr>;

/// What one receive means for the neighbour table and the counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxFact {
    /// Nothing (it was refused before its kind was known).
    None,
    /// This interface's own packet, looped back by the group.
    OwnLoopback,
    /// An ARP message that parsed.
    Arp(ArpSender),
    /// A neighbour discovery message that parsed.
    Nd(NdSender),
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
    /// Write this many bytes of the receive buffer, from [`RX_IN_PLACE_AT`], to the TAP
    /// ([`receive_in_place`] only).
    DeliverInPlace(usize),
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
    let ip = match ip_to_deliver(buf, meta, grh, local, frame) {
        Ok(ip) => ip,
        Err(done) => return done,
    };
    // Cannot fail: `frame` holds more than the header.
    let _ = eth::emit_header(frame, &ip.header);
    frame[eth::HEADER_LEN..ip.total].copy_from_slice(&buf[IP_AT..IP_AT + ip.len]);
    ip.delivered(RxVerdict::Deliver(ip.total))
}

/// An IP packet [`classify`] passed on whose frame fits: its Ethernet header, the
/// packet's `len` bytes at [`IP_AT`], the frame's `total` bytes.
struct IpFrame {
    header: EthHeader,
    len: usize,
    total: usize,
    fact: RxFact,
}

impl IpFrame {
    fn delivered(&self, verdict: RxVerdict) -> Received {
        Received {
            fact: self.fact,
            verdict,
        }
    }
}

/// [`classify`], then for an IP packet the check both ways of delivering it share: its
/// frame must fit in `frame` (and the packet lie in `buf`). `Err`: the result as it
/// stands (anything but an IP packet, or the drop of one that does not fit).
fn ip_to_deliver(
    buf: &[u8],
    meta: RecvMeta,
    grh: GrhKind,
    local: &Local,
    frame: &mut [u8],
) -> Result<IpFrame, Received> {
    match classify(buf, meta, grh, local, frame) {
        Classified::Done(r) => Err(r),
        Classified::Ip { header, len, fact } => {
            let total = eth::HEADER_LEN + len;
            if total > frame.len() || IP_AT + len > buf.len() {
                return Err(Received::drop(fact, RxDrop::Short));
            }
            Ok(IpFrame {
                header,
                len,
                total,
                fact,
            })
        }
    }
}

/// Where the IP packet of a data receive starts in the receive buffer.
const IP_AT: usize = GRH_LEN + ipoib::HEADER_LEN;

/// Where [`receive_in_place`] leaves a data frame in the receive buffer: its Ethernet
/// header over the end of the GRH and the IPoIB header, right before the IP packet.
pub const RX_IN_PLACE_AT: usize = IP_AT - eth::HEADER_LEN;

/// [`receive`], but an IP packet (not neighbour discovery) is not copied: its Ethernet
/// header is written over the GRH's last bytes and the IPoIB header in `buf` (after they
/// were checked), and the verdict is [`RxVerdict::DeliverInPlace`]: the frame is
/// `buf[RX_IN_PLACE_AT..RX_IN_PLACE_AT + n]`. ARP and neighbour discovery, whose
/// translation changes their length, are written to `frame` as [`receive`] writes them.
/// A frame is delivered either way only if it fits in `frame`, so both ways refuse the
/// same packets.
pub fn receive_in_place(
    buf: &mut [u8],
    meta: RecvMeta,
    grh: GrhKind,
    local: &Local,
    frame: &mut [u8],
) -> Received {
    let ip = match ip_to_deliver(buf, meta, grh, local, frame) {
        Ok(ip) => ip,
        Err(done) => return done,
    };
    // Cannot fail: the buffer holds the GRH and the IPoIB header before the packet.
    let _ = eth::emit_header(&mut buf[RX_IN_PLACE_AT..], &ip.header);
    ip.delivered(RxVerdict::DeliverInPlace(ip.total))
}

/// What [`classify`] found: a result, or an IP packet to pass on behind `header` (the
/// packet is `len` bytes at [`IP_AT`] in the receive buffer).
enum Classified {
    Done(Received),
    Ip {
        header: EthHeader,
        len: usize,
        fact: RxFact,
    },
}

impl From<Received> for Classified {
    fn from(r: Received) -> Classified {
        Classified::Done(r)
    }
}

/// The checks and the translation of [`receive`], up to where an IP packet would be
/// copied.
fn classify(
    buf: &[u8],
    meta: RecvMeta,
    grh: GrhKind,
    local: &Local,
    frame: &mut [u8],
) -> Classified {
    use RxFact::None as Nothing;
    if buf.len() < GRH_LEN + ipoib::HEADER_LEN {
        return Received::drop(Nothing, RxDrop::Short).into();
    }
    // A UD receive on RoCE always carries the GRH: without it nothing says who sent the
    // packet (the IB link layer, whose local traffic may come without one, is refused at
    // startup).
    if !meta.has_grh {
        return Received::drop(Nothing, RxDrop::NoGrh).into();
    }
    let Ok(g) = grh::parse(&buf[..GRH_LEN], grh) else {
        return Received::drop(Nothing, RxDrop::BadGrh).into();
    };
    // The packet's real source, as the hardware reports it.
    let src_hw = IpoibAddr::new(meta.src_qp, g.sgid);
    if src_hw.qpn == local.hw.qpn && src_hw.gid == local.hw.gid {
        return Received {
            fact: RxFact::OwnLoopback,
            verdict: RxVerdict::Consumed,
        }
        .into();
    }
    let (ethertype, payload) = match ipoib::parse_header(&buf[GRH_LEN..]) {
        Ok(x) => x,
        Err(WireError::Truncated { .. }) => return Received::drop(Nothing, RxDrop::Short).into(),
        Err(_) => return Received::drop(Nothing, RxDrop::BadHeader).into(),
    };
    match ethertype {
        ETHERTYPE_ARP => match IpoibArp::parse(payload) {
            Ok(a) => receive_arp(&a, src_hw, local, frame).into(),
            Err(_) => Received::drop(Nothing, RxDrop::BadArp).into(),
        },
        ETHERTYPE_IPV4 => {
            let Ok(s) = ipv4::parse_summary(payload) else {
                return Received::drop(Nothing, RxDrop::BadIpv4).into();
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
            Classified::Ip {
                header: EthHeader {
                    dst,
                    src: mac_for_gid(&g.sgid),
                    ethertype: ETHERTYPE_IPV4,
                },
                len: payload.len(),
                fact,
            }
        }
        ETHERTYPE_IPV6 => {
            let Ok(s) = ipv6::parse_summary(payload) else {
                return Received::drop(Nothing, RxDrop::BadIpv6).into();
            };
            let payload = &payload[..s.total_len];
            if let Some((PROTO_ICMPV6, at)) = s.upper
                && payload.get(at).is_some_and(|t| ndisc::is_nd(*t))
            {
                return receive_nd(payload, &s, at, src_hw, g.sgid, local, frame).into();
            }
            let fact = RxFact::Data { from: src_hw };
            let dst = if s.dst.is_multicast() {
                Mac(ipv6::multicast_mac_octets(&s.dst))
            } else {
                local.mac
            };
            Classified::Ip {
                header: EthHeader {
                    dst,
                    src: mac_for_gid(&g.sgid),
                    ethertype: ETHERTYPE_IPV6,
                },
                len: payload.len(),
                fact,
            }
        }
        _ => Received::drop(Nothing, RxDrop::Unsupported).into(),
    }
}

/// A neighbour discovery message from `src_hw` (whose GID is `sgid`), checked and
/// written in its Ethernet form.
///
/// The message's own link-layer address (the source option of a solicitation or a
/// router message, the target option of an advertisement) must be the packet's real
/// source, and the address it claims (the source address; an advertisement's target)
/// must be on this link. A redirect's target option names another host: it is checked
/// to be possible, not believed.
fn receive_nd(
    packet: &[u8],
    s: &Ipv6Summary,
    at: usize,
    src_hw: IpoibAddr,
    sgid: crate::wire::gid::Gid,
    local: &Local,
    frame: &mut [u8],
) -> Received {
    let refused = RxFact::Nd(Sender::Refused);
    let Ok(nd) = ndisc::parse::<IpoibAddr>(packet, s, at) else {
        return Received::drop(RxFact::None, RxDrop::BadNd);
    };
    if [nd.source_ll, nd.target_ll]
        .iter()
        .flatten()
        .any(|a| !is_possible_sender(a))
    {
        return Received::drop(refused, RxDrop::BadNd);
    }
    let (own_ll, claimed) = match nd.kind {
        ndisc::NEIGHBOUR_ADVERT => (nd.target_ll, nd.target),
        ndisc::REDIRECT => (None, None),
        _ => (nd.source_ll, Some(nd.src)),
    };
    if own_ll.is_some_and(|a| a != src_hw) {
        return Received::drop(refused, RxDrop::NdSpoofed);
    }
    let sender = match (own_ll, claimed) {
        (_, Some(ip)) if ip.is_unspecified() => {
            if nd.kind == ndisc::NEIGHBOUR_SOLICIT {
                Sender::Probe
            } else {
                Sender::Silent
            }
        }
        (Some(hw), Some(ip)) => {
            if !local.addr6.on_link(&ip) {
                return Received::drop(refused, RxDrop::NdOffLink);
            }
            let standing = match nd.kind {
                ndisc::NEIGHBOUR_SOLICIT if nd.target.is_some_and(|t| local.addr6.is_own(&t)) => {
                    Standing::Addressed
                }
                ndisc::NEIGHBOUR_ADVERT if nd.flags & NA_SOLICITED != 0 => Standing::Addressed,
                ndisc::NEIGHBOUR_ADVERT if nd.flags & NA_OVERRIDE != 0 => Standing::Announcement,
                _ => Standing::Overheard,
            };
            Sender::Claim { ip, hw, standing }
        }
        _ => Sender::Silent,
    };
    let fact = RxFact::Nd(sender);
    let to_mac = |a: IpoibAddr| {
        if a.gid == local.hw.gid {
            local.mac
        } else {
            mac_for_gid(&a.gid)
        }
    };
    let dst = if s.dst.is_multicast() {
        Mac(ipv6::multicast_mac_octets(&s.dst))
    } else {
        local.mac
    };
    let h = EthHeader {
        dst,
        src: mac_for_gid(&sgid),
        ethertype: ETHERTYPE_IPV6,
    };
    if eth::emit_header(frame, &h).is_err() {
        return Received::drop(fact, RxDrop::Short);
    }
    match nd.translate(
        packet,
        nd.source_ll.map(to_mac),
        nd.target_ll.map(to_mac),
        &mut frame[eth::HEADER_LEN..],
    ) {
        Ok(n) => Received {
            fact,
            verdict: RxVerdict::Deliver(eth::HEADER_LEN + n),
        },
        Err(_) => Received::drop(fact, RxDrop::Short),
    }
}

/// Whether an IPoIB address could be a sender's: not zero, a unicast non-zero GID, a
/// QPN that can send.
fn is_possible_sender(a: &IpoibAddr) -> bool {
    !a.is_zero() && !a.gid.is_multicast() && !a.gid.is_zero() && !is_reserved_qpn(a.qpn)
}

/// An ARP from `src_hw`, checked and written in its Ethernet form.
fn receive_arp(a: &IpoibArp, src_hw: IpoibAddr, local: &Local, frame: &mut [u8]) -> Received {
    let refused = RxFact::Arp(ArpSender::Refused);
    if !is_possible_sender(&a.sha) {
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
