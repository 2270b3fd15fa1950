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

pub use rx::{
    ArpSender, NdSender, RX_IN_PLACE_AT, Received, RecvMeta, RxFact, RxVerdict, Sender, Standing,
    receive, receive_in_place,
};
pub use tx::{
    Body, IN_PLACE_AT, Otherwise, Route, TxPlan, arp_request, emit_arp, emit_nd, plan_send,
};

use super::eth::Mac;
use super::ipoib::IpoibAddr;
use super::ipv4::Ipv4Cidr;
use super::ipv6::{self, Ipv6Cidr};
use std::net::Ipv6Addr;

/// Who this interface is, as both sides of the translation need it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Local {
    /// Its IPoIB address (QPN and GID).
    pub hw: IpoibAddr,
    /// The MAC the TAP carries.
    pub mac: Mac,
    /// Its IPv4 address and subnet.
    pub addr: Ipv4Cidr,
    /// Its IPv6 addresses.
    pub addr6: Addrs6,
}

/// An interface's IPv6 addresses: the link-local one the kernel derives from the TAP's
/// MAC, and up to [`MAX_ADDR6`] others with their prefixes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addrs6 {
    /// The link-local address (modified EUI-64 of the MAC).
    pub link_local: Ipv6Addr,
    global: [Option<Ipv6Cidr>; MAX_ADDR6],
}

impl Addrs6 {
    /// The addresses of an interface whose TAP has `mac`, with `others` (the first
    /// [`MAX_ADDR6`] of them).
    pub fn new(mac: Mac, others: &[Ipv6Cidr]) -> Addrs6 {
        let mut global = [None; MAX_ADDR6];
        for (slot, a) in global.iter_mut().zip(others) {
            *slot = Some(*a);
        }
        Addrs6 {
            link_local: ipv6::link_local_for_mac(mac.0),
            global,
        }
    }

    /// Every address: the link-local one first.
    pub fn iter(&self) -> impl Iterator<Item = Ipv6Addr> + '_ {
        std::iter::once(self.link_local).chain(self.global.iter().flatten().map(|c| c.addr))
    }

    /// Whether `ip` is one of them.
    pub fn is_own(&self, ip: &Ipv6Addr) -> bool {
        self.iter().any(|a| a == *ip)
    }

    /// Whether `ip` is on this link: link-local, or inside one of the prefixes.
    pub fn on_link(&self, ip: &Ipv6Addr) -> bool {
        ipv6::is_link_local(ip) || self.global.iter().flatten().any(|c| c.contains(ip))
    }

    /// The address to send from to reach `dst`: one whose prefix holds it, else the
    /// link-local one.
    pub fn source_for(&self, dst: &Ipv6Addr) -> Ipv6Addr {
        if ipv6::is_link_local(dst) {
            return self.link_local;
        }
        self.global
            .iter()
            .flatten()
            .find(|c| c.contains(dst))
            .map_or(self.link_local, |c| c.addr)
    }
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
    /// An IPv6 header (or extension header) that does not parse.
    BadIpv6,
    /// A neighbour discovery message that fails RFC 4861's checks, or whose link-layer
    /// address names an impossible sender.
    BadNd,
    /// A neighbour discovery message whose own link-layer address (source option of a
    /// solicitation or router message, target option of an advertisement) is not the
    /// packet's real source.
    NdSpoofed,
    /// A neighbour discovery message claiming an address that is not on this link
    /// (neither link-local nor inside one of the interface's prefixes).
    NdOffLink,
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
    /// Another EtherType.
    Unsupported,
    /// An IPv4 payload larger than the MTU (or than the send buffer).
    Oversized,
    /// An IPv4 header that does not parse.
    BadIpv4,
    /// An IPv6 header (or extension header) that does not parse.
    BadIpv6,
    /// A neighbour discovery message that fails RFC 4861's checks.
    BadNd,
    /// A neighbour discovery message whose link-layer address option names a MAC that is
    /// neither this interface's nor a known peer's (proxy neighbour discovery is not
    /// carried).
    NdForeignLinkAddr,
    /// An ARP that does not parse or does not fit the send buffer.
    BadArp,
    /// An ARP reply to a MAC that stands for no known peer.
    NoNeighbour,
}

/// IPv6 addresses an interface carries besides its link-local one.
pub const MAX_ADDR6: usize = 8;
