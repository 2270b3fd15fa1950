//! Send: one Ethernet frame from the TAP in, what goes on the fabric and where out.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use super::{Local, TxDrop};
use crate::wire::arp::{self, EthArp, IpoibArp};
use crate::wire::eth::{self, Mac};
use crate::wire::ipoib::{self, IpoibAddr};
use crate::wire::ipv6::{self, PROTO_ICMPV6};
use crate::wire::ndisc::{self, Nd};
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
    /// Drop it; if the peer is not known, ask the group who has this address (ARP for
    /// IPv4, a neighbour solicitation for IPv6).
    Resolve(IpAddr),
    /// Send it to the group instead (an ARP request or a neighbour solicitation
    /// re-validating a lost peer).
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
    /// The IPv6 packet of this many bytes behind the frame's Ethernet header.
    Ipv6 {
        /// Its length (the frame's payload, without padding).
        len: usize,
    },
    /// A neighbour discovery message, to be rewritten with IPoIB link-layer options.
    Nd {
        /// The message as parsed from the frame's payload.
        nd: Nd<Mac>,
        /// The address its source link-layer option gets (this interface's).
        source_ll: Option<IpoibAddr>,
        /// The address its target link-layer option gets (`None`: left out).
        target_ll: Option<IpoibAddr>,
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
/// whose peer is lost goes to the group. An IPv6 packet goes as it is, except that a
/// neighbour discovery message has its link-layer options rewritten: a source option must
/// hold this interface's MAC; a target option this interface's MAC or a known peer's (a
/// redirect's target option naming an unknown MAC is left out). `peer` looks a MAC up in
/// the neighbour table.
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
                    otherwise: Otherwise::Resolve(IpAddr::V4(s.dst)),
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
        ETHERTYPE_IPV6 => plan_ipv6(h.dst, payload, local, mtu, peer),
        _ => Err(TxDrop::Unsupported),
    }
}

/// The IPv6 part of [`plan_send`].
fn plan_ipv6(
    dst: Mac,
    payload: &[u8],
    local: &Local,
    mtu: usize,
    peer: impl Fn(&Mac) -> Option<IpoibAddr>,
) -> Result<TxPlan, TxDrop> {
    if payload.len() > mtu {
        return Err(TxDrop::Oversized);
    }
    let s = ipv6::parse_summary(payload).map_err(|_| TxDrop::BadIpv6)?;
    let payload = &payload[..s.total_len];
    let nd = match s.upper {
        Some((PROTO_ICMPV6, at)) if payload.get(at).is_some_and(|t| ndisc::is_nd(*t)) => {
            Some(ndisc::parse::<Mac>(payload, &s, at).map_err(|_| TxDrop::BadNd)?)
        }
        _ => None,
    };
    let Some(nd) = nd else {
        let route = if dst.is_multicast() {
            Route::Group
        } else {
            Route::Peer {
                mac: dst,
                otherwise: Otherwise::Resolve(IpAddr::V6(s.dst)),
            }
        };
        return Ok(TxPlan {
            route,
            body: Body::Ipv6 { len: s.total_len },
        });
    };
    let source_ll = match nd.source_ll {
        None => None,
        Some(m) if m == local.mac => Some(local.hw),
        Some(_) => return Err(TxDrop::NdForeignLinkAddr),
    };
    let target_ll = match nd.target_ll {
        None => None,
        Some(m) if m == local.mac => Some(local.hw),
        Some(m) => match peer(&m) {
            Some(hw) => Some(hw),
            None if nd.kind == ndisc::REDIRECT => None,
            None => return Err(TxDrop::NdForeignLinkAddr),
        },
    };
    let grown =
        s.total_len + 16 * (usize::from(source_ll.is_some()) + usize::from(target_ll.is_some()));
    if grown > mtu {
        return Err(TxDrop::Oversized);
    }
    let route = if dst.is_multicast() {
        Route::Group
    } else {
        Route::Peer {
            mac: dst,
            // A unicast solicitation (the kernel re-validating an entry) to a peer we
            // lost: ask everyone instead.
            otherwise: if nd.kind == ndisc::NEIGHBOUR_SOLICIT {
                Otherwise::Group
            } else {
                Otherwise::Drop
            },
        }
    };
    Ok(TxPlan {
        route,
        body: Body::Nd {
            nd,
            source_ll,
            target_ll,
        },
    })
}

impl Body {
    /// Whether it is an ARP or neighbour discovery message (sent from the ARP budget
    /// of the send ring, not counted as data).
    pub fn is_arp(&self) -> bool {
        matches!(self, Body::Arp(_) | Body::Nd { .. })
    }

    /// Write the IPoIB header and the body to `out`, taking an IP packet from `frame`
    /// (the frame [`plan_send`] planned). Returns the bytes behind the IPoIB header.
    pub fn emit(&self, frame: &[u8], out: &mut [u8]) -> Result<usize, TxDrop> {
        match self {
            Body::Ipv4 { len } | Body::Ipv6 { len } => {
                let packet = frame
                    .get(eth::HEADER_LEN..eth::HEADER_LEN + len)
                    .ok_or(TxDrop::Short)?;
                let to = out
                    .get_mut(ipoib::HEADER_LEN..ipoib::HEADER_LEN + len)
                    .ok_or(TxDrop::Oversized)?;
                to.copy_from_slice(packet);
                let ethertype = if matches!(self, Body::Ipv4 { .. }) {
                    ETHERTYPE_IPV4
                } else {
                    ETHERTYPE_IPV6
                };
                // Cannot fail: `out` holds more than the header.
                let _ = ipoib::emit_header(out, ethertype);
                Ok(*len)
            }
            Body::Nd {
                nd,
                source_ll,
                target_ll,
            } => {
                let packet = frame.get(eth::HEADER_LEN..).ok_or(TxDrop::Short)?;
                ipoib::emit_header(out, ETHERTYPE_IPV6).map_err(|_| TxDrop::Oversized)?;
                nd.translate(
                    packet,
                    *source_ll,
                    *target_ll,
                    &mut out[ipoib::HEADER_LEN..],
                )
                .map_err(|_| TxDrop::Oversized)
            }
            Body::Arp(msg) => emit_arp(msg, out),
        }
    }

    /// Turn the frame in `frame` (from its Ethernet header on) into its IPoIB packet where
    /// it lies, for the bodies that carry the IP packet unchanged (IPv4 and IPv6 that is
    /// not neighbour discovery): the last [`ipoib::HEADER_LEN`] bytes of the Ethernet
    /// header become the IPoIB header, so the packet is
    /// `frame[IN_PLACE_AT..IN_PLACE_AT + ipoib::HEADER_LEN + len]`. Returns `Some(len)`,
    /// the IP packet's length; `None` for ARP and neighbour discovery, whose translation
    /// changes their length and goes through [`Body::emit`] into another buffer.
    pub fn emit_in_place(&self, frame: &mut [u8]) -> Result<Option<usize>, TxDrop> {
        let (Body::Ipv4 { len } | Body::Ipv6 { len }) = *self else {
            return Ok(None);
        };
        if frame.len() < eth::HEADER_LEN + len {
            return Err(TxDrop::Short);
        }
        let ethertype = if matches!(self, Body::Ipv4 { .. }) {
            ETHERTYPE_IPV4
        } else {
            ETHERTYPE_IPV6
        };
        ipoib::emit_header(&mut frame[IN_PLACE_AT..], ethertype).map_err(|_| TxDrop::Short)?;
        Ok(Some(len))
    }
}

/// Where [`Body::emit_in_place`] leaves the IPoIB packet in the frame: the Ethernet
/// header's last [`ipoib::HEADER_LEN`] bytes.
pub const IN_PLACE_AT: usize = eth::HEADER_LEN - ipoib::HEADER_LEN;

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

/// Write a neighbour discovery message this interface sends itself behind its IPoIB
/// header to `out`: a solicitation for `target` from `src` (`Some`), or an unsolicited
/// advertisement of `target` (`None`). Returns the bytes behind the IPoIB header.
pub fn emit_nd(
    own: IpoibAddr,
    src: Option<Ipv6Addr>,
    target: Ipv6Addr,
    out: &mut [u8],
) -> Result<usize, TxDrop> {
    ipoib::emit_header(out, ETHERTYPE_IPV6).map_err(|_| TxDrop::BadNd)?;
    let body = &mut out[ipoib::HEADER_LEN..];
    match src {
        Some(src) => ndisc::solicit(own, src, target, body),
        None => ndisc::advertise(own, target, body),
    }
    .map_err(|_| TxDrop::BadNd)
}
