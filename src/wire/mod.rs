//! Wire formats, sans I/O: pure functions over byte slices.
//!
//! - [`ipoib`]: the 4-byte IPoIB encapsulation header and 20-byte IPoIB hardware
//!   addresses (RFC 4391);
//! - [`arp`]: ARP as the TAP speaks it (Ethernet, hardware type 1) and as IPoIB carries it
//!   (hardware type 32, 20-byte addresses), and translation between the two;
//! - [`ipv4`], [`ipv6`]: the IP header fields the datapath reads, checksums;
//! - [`ndisc`]: IPv6 neighbour discovery as the TAP speaks it (6-byte MACs in the
//!   link-layer address options) and as IPoIB carries it (20-byte addresses, RFC 4391),
//!   and translation between the two;
//! - [`eth`]: Ethernet frames from and to the TAP, and the locally administered MACs that
//!   stand for IPoIB peers;
//! - [`grh`]: the 40 bytes in front of every UD receive;
//! - [`translate`]: the Ethernet ⇄ IPoIB translation of one packet, what it means for
//!   the neighbour table and the counters returned as facts;
//! - [`offload`]: the TAP's offloads: super-frames cut into segments, received segments
//!   joined.
//!
//! Nothing here allocates, does I/O or reads a clock. Every parser returns a
//! [`WireError`] naming what was wrong; none panics on any input.

pub mod arp;
pub mod eth;
pub mod gid;
pub mod grh;
pub mod ipoib;
pub mod ipv4;
pub mod ipv6;
pub mod ndisc;
pub mod offload;
pub mod translate;

/// EtherType of IPv4.
pub const ETHERTYPE_IPV4: u16 = 0x0800;
/// EtherType of ARP.
pub const ETHERTYPE_ARP: u16 = 0x0806;
/// EtherType of IPv6.
pub const ETHERTYPE_IPV6: u16 = 0x86DD;
/// EtherType of an 802.1Q VLAN tag.
pub const ETHERTYPE_VLAN: u16 = 0x8100;
/// EtherType of an 802.1ad (QinQ) tag.
pub const ETHERTYPE_QINQ: u16 = 0x88A8;

/// Why bytes could not be parsed or carried. Each variant is a drop reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Fewer bytes than the header or message needs.
    #[error("truncated: {what} needs {need} bytes, got {got}")]
    Truncated {
        /// What was being parsed.
        what: &'static str,
        /// Bytes needed.
        need: usize,
        /// Bytes present.
        got: usize,
    },
    /// The IPoIB header's reserved 16 bits were not zero.
    #[error("IPoIB header reserved bits are {0:#06x}, not zero")]
    ReservedNotZero(u16),
    /// An EtherType this datapath does not carry.
    #[error("unsupported EtherType {0:#06x}")]
    UnsupportedEtherType(u16),
    /// A VLAN-tagged frame.
    #[error("VLAN-tagged frames are not carried")]
    Vlan,
    /// Larger than the IPoIB MTU.
    #[error("frame payload of {len} bytes exceeds the MTU of {mtu}")]
    Oversized {
        /// Payload length.
        len: usize,
        /// The limit.
        mtu: usize,
    },
    /// An ARP message with a field this datapath does not accept.
    #[error("bad ARP: {0}")]
    BadArp(&'static str),
    /// An IPv4 header that does not parse.
    #[error("bad IPv4 header: {0}")]
    BadIpv4(&'static str),
    /// An IPv6 header (or extension header) that does not parse.
    #[error("bad IPv6 packet: {0}")]
    BadIpv6(&'static str),
    /// A neighbour discovery message (or one of its options) that does not parse or
    /// cannot be translated.
    #[error("bad neighbour discovery message: {0}")]
    BadNd(&'static str),
    /// The 40 bytes in front of a UD receive do not hold the GRH layout the port uses.
    #[error("bad GRH: {0}")]
    BadGrh(&'static str),
    /// A TAP offload (virtio_net_hdr) request that cannot be carried out.
    #[error("bad offload request: {0}")]
    BadOffload(&'static str),
    /// A frame from the TAP longer than the buffer it is read into (the MTU's).
    #[error("a {0}-byte frame from the TAP exceeds the MTU")]
    FrameTooLong(usize),
}

/// The first `N` bytes of `b` as an array, or [`WireError::Truncated`] naming `what`.
fn prefix<'a, const N: usize>(b: &'a [u8], what: &'static str) -> Result<&'a [u8; N], WireError> {
    b.first_chunk::<N>().ok_or(WireError::Truncated {
        what,
        need: N,
        got: b.len(),
    })
}

/// The first `N` bytes of `out` as a mutable array, or [`WireError::Truncated`] naming
/// `what` when `out` is too small to write into.
fn prefix_mut<'a, const N: usize>(
    out: &'a mut [u8],
    what: &'static str,
) -> Result<&'a mut [u8; N], WireError> {
    let got = out.len();
    out.first_chunk_mut::<N>()
        .ok_or(WireError::Truncated { what, need: N, got })
}
