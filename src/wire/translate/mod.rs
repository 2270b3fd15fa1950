//! The Ethernet ⇄ IPoIB translation of one packet, sans I/O.
//!
//! [`receive`] turns one UD receive (GRH, IPoIB header, payload) into the Ethernet frame
//! the TAP is given; [`plan_send`] turns one frame from the TAP into what is sent on the
//! fabric and where. Neither touches the neighbour table or the counters: what a packet
//! means for them comes back as facts ([`RxFact`], [`Route`]) that the interface
//! applies, and a packet that is not carried comes back with why ([`RxDrop`],
//! [`TxDrop`]). The send side reads the table through a lookup the caller passes in.

mod rx;
mod tx;

#[cfg(test)]
mod tests;

pub use rx::{ArpSender, Received, RecvMeta, RxFact, RxVerdict, Standing, receive};
pub use tx::{Body, Otherwise, Route, TxPlan, arp_request, emit_arp, plan_send};

use super::eth::Mac;
use super::ipoib::IpoibAddr;
use super::ipv4::Ipv4Cidr;

/// Who this interface is, as both sides of the translation need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// Its IPoIB address (QPN and GID).
    pub hw: IpoibAddr,
    /// The MAC the TAP carries.
    pub mac: Mac,
    /// Its address and subnet.
    pub addr: Ipv4Cidr,
}

/// Why a receive is not written to the TAP.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RxDrop {
    /// Shorter than GRH + IPoIB header, a truncated IPoIB header, or a packet larger
    /// than the frame it would be written to.
    Short,
    /// No GRH (nothing says who sent it).
    NoGrh,
    /// The GRH does not hold the port's layout.
    BadGrh,
    /// The IPoIB header's reserved bits are set.
    BadHeader,
    /// An ARP that does not parse, names an impossible sender, or (found by the caller)
    /// whose sender's MAC belongs to another GID.
    BadArp,
    /// An ARP whose sender is not the packet's real source.
    ArpSpoofed,
    /// An ARP whose sender address is outside the subnet.
    ArpOffSubnet,
    /// An IPv4 header that does not parse.
    BadIpv4,
    /// An EtherType that is not carried.
    Unsupported,
}

/// Why a frame from the TAP is not sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TxDrop {
    /// Shorter than an Ethernet header.
    Short,
    /// VLAN-tagged.
    Vlan,
    /// IPv6 (not carried until neighbour discovery is translated).
    Ipv6,
    /// Another EtherType.
    Unsupported,
    /// An IPv4 payload larger than the MTU (or than the send buffer).
    Oversized,
    /// An IPv4 header that does not parse.
    BadIpv4,
    /// An ARP that does not parse or does not fit the send buffer.
    BadArp,
    /// An ARP reply to a MAC that stands for no known peer.
    NoNeighbour,
}

/// IPv6 addresses an interface carries besides its link-local one.
pub const MAX_ADDR6: usize = 8;
