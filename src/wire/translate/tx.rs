//! Send: one Ethernet frame from the TAP in, what goes on the fabric and where out.

use std::net::Ipv4Addr;

use super::{Local, TxDrop};
use crate::wire::arp::{self, EthArp, IpoibArp};
use crate::wire::eth::{self, Mac};
use crate::wire::ipoib::{self, IpoibAddr};
use crate::wire::{ETHERTYPE_ARP, ETHERTYPE_IPV4, ETHERTYPE_IPV6, WireError, ipv4};

/// Where a frame goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Route {
    /// To the broadcast group (the frame was for a multicast or broadcast MAC).
    Group,
    /// To the peer behind `mac`; `otherwise` says what to do when no way to it is found
    /// (the peer is not known, or no address handle could be made for it).
    Peer {
        /// The destination MAC.
        mac: Mac,
        /// What to do without a way to the peer.
        otherwise: Otherwise,
    },
}

/// What to do with a frame for a peer there is no way to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Otherwise {
    /// Drop it; if the peer is not known, ask the group who has this address.
    Resolve(Ipv4Addr),
    /// Send it to the group instead (an ARP request re-validating a lost peer).
    Group,
    /// Drop it.
    Drop,
}

/// What is sent: the bytes behind the IPoIB header.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// The IPv4 packet of this many bytes behind the frame's Ethernet header.
    Ipv4 {
        /// Its length (the frame's payload, padding included).
        len: usize,
    },
    /// An ARP message, rewritten in its IPoIB form.
    Arp(IpoibArp),
}

/// What [`plan_send`] made of one frame: where it goes, and what.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TxPlan {
    /// Where it goes.
    pub route: Route,
    /// What is sent.
    pub body: Body,
}

/// Translate a frame from the TAP into a [`TxPlan`], or say why it is not sent.
///
/// An IPv4 packet goes as it is, to the group (multicast or broadcast MAC) or to the
/// peer its MAC stands for. An ARP is rewritten with this interface as its sender and
/// the target hardware address `peer` knows for the target MAC (this interface's own,
/// or zero when not known); a reply to an unknown target is not sent, a unicast request
/// whose peer is lost goes to the group. `peer` looks a MAC up in the neighbour table.
pub fn plan_send(
    frame: &[u8],
    local: &Local,
    mtu: usize,
    peer: impl Fn(&Mac) -> Option<IpoibAddr>,
) -> Result<TxPlan, TxDrop> {
    let (h, payload) = match eth::parse_frame(frame) {
        Ok(x) => x,
        Err(WireError::Vlan) => return Err(TxDrop::Vlan),
        Err(_) => return Err(TxDrop::Short),
    };
    match h.ethertype {
        ETHERTYPE_IPV4 => {
            if payload.len() > mtu {
                return Err(TxDrop::Oversized);
            }
            let s = ipv4::parse_summary(payload).map_err(|_| TxDrop::BadIpv4)?;
            let route = if h.dst.is_multicast() {
                Route::Group
            } else {
                Route::Peer {
                    mac: h.dst,
                    otherwise: Otherwise::Resolve(s.dst),
                }
            };
            Ok(TxPlan {
                route,
                body: Body::Ipv4 { len: payload.len() },
            })
        }
        ETHERTYPE_ARP => {
            let a = EthArp::parse(payload).map_err(|_| TxDrop::BadArp)?;
            let tha = if a.tha == local.mac {
                local.hw
            } else {
                peer(&a.tha).unwrap_or(IpoibAddr::ZERO)
            };
            if a.op == arp::OP_REPLY && tha.is_zero() {
                return Err(TxDrop::NoNeighbour);
            }
            let route = if h.dst.is_multicast() {
                Route::Group
            } else {
                Route::Peer {
                    mac: h.dst,
                    // A unicast request (the kernel re-validating an entry) to a peer we
                    // lost: ask everyone instead.
                    otherwise: if a.op == arp::OP_REQUEST {
                        Otherwise::Group
                    } else {
                        Otherwise::Drop
                    },
                }
            };
            Ok(TxPlan {
                route,
                body: Body::Arp(a.to_ipoib(local.hw, tha)),
            })
        }
        ETHERTYPE_IPV6 => Err(TxDrop::Ipv6),
        _ => Err(TxDrop::Unsupported),
    }
}

impl Body {
    /// Whether it is an ARP message.
    pub fn is_arp(&self) -> bool {
        matches!(self, Body::Arp(_))
    }

    /// Write the IPoIB header and the body to `out`, taking an IPv4 packet from `frame`
    /// (the frame [`plan_send`] planned). Returns the bytes behind the IPoIB header.
    pub fn emit(&self, frame: &[u8], out: &mut [u8]) -> Result<usize, TxDrop> {
        match self {
            Body::Ipv4 { len } => {
                let packet = frame
                    .get(eth::HEADER_LEN..eth::HEADER_LEN + len)
                    .ok_or(TxDrop::Short)?;
                let to = out
                    .get_mut(ipoib::HEADER_LEN..ipoib::HEADER_LEN + len)
                    .ok_or(TxDrop::Oversized)?;
                to.copy_from_slice(packet);
                // Cannot fail: `out` holds more than the header.
                let _ = ipoib::emit_header(out, ETHERTYPE_IPV4);
                Ok(*len)
            }
            Body::Arp(msg) => emit_arp(msg, out),
        }
    }
}

/// Write an IPoIB ARP message behind its IPoIB header to `out`; returns the message's
/// length.
pub fn emit_arp(msg: &IpoibArp, out: &mut [u8]) -> Result<usize, TxDrop> {
    ipoib::emit_header(out, ETHERTYPE_ARP).map_err(|_| TxDrop::BadArp)?;
    msg.emit(&mut out[ipoib::HEADER_LEN..])
        .map_err(|_| TxDrop::BadArp)
}

/// An ARP request from `own` (at `spa`) for `tpa`: a resolution, or with `spa == tpa` a
/// gratuitous announcement.
pub fn arp_request(own: IpoibAddr, spa: Ipv4Addr, tpa: Ipv4Addr) -> IpoibArp {
    IpoibArp {
        op: arp::OP_REQUEST,
        sha: own,
        spa,
        tha: IpoibAddr::ZERO,
        tpa,
    }
}
