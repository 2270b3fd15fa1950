//! IPv6 neighbour discovery (RFC 4861) as the TAP speaks it and as IPoIB carries it.
//!
//! The messages are the same on both sides except for the source and target link-layer
//! address options: on the TAP they hold a 6-byte MAC (option length 1, RFC 2464 §6);
//! on IPoIB a 20-byte IPoIB address behind two reserved bytes (option length 3,
//! RFC 4391 §9.1.1: type, length, 2 zero bytes, QPN word, GID). Translating a message
//! rewrites those options, the IPv6 payload length and the ICMPv6 checksum; every other
//! option and every other byte is carried as it is.
//!
//! A message is checked as RFC 4861 §6.1.1/§6.1.2/§7.1.1/§7.1.2/§8.1 asks before it is
//! translated (hop limit 255, code 0, minimum length, options of non-zero length that fit,
//! a correct checksum) and refused with [`WireError::BadNd`] naming what was wrong, so a
//! bad checksum is never "repaired" by the rewrite.

use std::net::Ipv6Addr;

use super::eth::Mac;
use super::ipoib::{HWADDR_LEN, IpoibAddr};
use super::ipv6::{self, Ipv6Summary, PROTO_ICMPV6, upper_checksum};
use super::{WireError, prefix};

/// Router solicitation.
pub const ROUTER_SOLICIT: u8 = 133;
/// Router advertisement.
pub const ROUTER_ADVERT: u8 = 134;
/// Neighbour solicitation.
pub const NEIGHBOUR_SOLICIT: u8 = 135;
/// Neighbour advertisement.
pub const NEIGHBOUR_ADVERT: u8 = 136;
/// Redirect.
pub const REDIRECT: u8 = 137;

/// Source link-layer address option.
pub const OPT_SOURCE_LL: u8 = 1;
/// Target link-layer address option.
pub const OPT_TARGET_LL: u8 = 2;

/// NA flag: the sender is a router.
pub const NA_ROUTER: u8 = 0x80;
/// NA flag: sent in answer to a solicitation.
pub const NA_SOLICITED: u8 = 0x40;
/// NA flag: override an existing cache entry.
pub const NA_OVERRIDE: u8 = 0x20;

/// Bytes a translation can add to a message: two link-layer options, each 16 bytes
/// longer in the IPoIB form.
pub const MAX_GROWTH: usize = 2 * (IPOIB_OPT_LEN - ETH_OPT_LEN);

const ETH_OPT_LEN: usize = 8;
const IPOIB_OPT_LEN: usize = 24;

/// Whether an ICMPv6 type is a neighbour discovery message this module translates.
pub fn is_nd(icmp_type: u8) -> bool {
    (ROUTER_SOLICIT..=REDIRECT).contains(&icmp_type)
}

/// A link-layer address as one side's options carry it.
pub trait LinkAddr: Copy + PartialEq {
    /// The option's length in units of 8 bytes.
    const UNITS: u8;
    /// Read the address from a whole option (type and length included).
    fn read(opt: &[u8]) -> Result<Self, WireError>;
    /// Write the whole option (type and length included) to `out`, `UNITS * 8` bytes.
    fn write(&self, kind: u8, out: &mut [u8]);
}

impl LinkAddr for Mac {
    const UNITS: u8 = 1;
    fn read(opt: &[u8]) -> Result<Self, WireError> {
        let o: &[u8; ETH_OPT_LEN] = prefix(opt, "link-layer address option")?;
        let mut m = [0u8; 6];
        m.copy_from_slice(&o[2..8]);
        Ok(Mac(m))
    }
    fn write(&self, kind: u8, out: &mut [u8]) {
        out[0] = kind;
        out[1] = Self::UNITS;
        out[2..8].copy_from_slice(&self.0);
    }
}

impl LinkAddr for IpoibAddr {
    const UNITS: u8 = 3;
    fn read(opt: &[u8]) -> Result<Self, WireError> {
        let o: &[u8; IPOIB_OPT_LEN] = prefix(opt, "link-layer address option")?;
        if o[2] != 0 || o[3] != 0 {
            return Err(WireError::BadNd(
                "reserved bytes of a link-layer address option are not zero",
            ));
        }
        IpoibAddr::parse(&o[4..4 + HWADDR_LEN])
    }
    fn write(&self, kind: u8, out: &mut [u8]) {
        out[0] = kind;
        out[1] = Self::UNITS;
        out[2] = 0;
        out[3] = 0;
        out[4..4 + HWADDR_LEN].copy_from_slice(&self.to_bytes());
    }
}

/// A neighbour discovery message that passed the checks, with the link-layer addresses
/// its options name in `A`'s form.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Nd<A> {
    /// The ICMPv6 type.
    pub kind: u8,
    /// The IPv6 source address.
    pub src: Ipv6Addr,
    /// The IPv6 destination address.
    pub dst: Ipv6Addr,
    /// The target address (NS, NA, redirect); `None` for RS and RA.
    pub target: Option<Ipv6Addr>,
    /// The NA flags (router, solicited, override); 0 for other messages.
    pub flags: u8,
    /// The source link-layer address option's address.
    pub source_ll: Option<A>,
    /// The target link-layer address option's address.
    pub target_ll: Option<A>,
    /// Where the ICMPv6 message starts in the packet.
    icmp_at: usize,
    /// The packet's length (IPv6 header to the end of the message).
    total_len: usize,
}

/// Bytes of each message before its options.
fn fixed_len(kind: u8) -> usize {
    match kind {
        ROUTER_SOLICIT => 8,
        ROUTER_ADVERT => 16,
        NEIGHBOUR_SOLICIT | NEIGHBOUR_ADVERT => 24,
        _ => 40,
    }
}

/// Check the neighbour discovery message in `packet` (a whole IPv6 packet whose summary
/// is `s` and whose upper layer is ICMPv6 at `icmp_at`) and read its link-layer options
/// in `A`'s form. Any other option is skipped; a link-layer option of the other form's
/// length, or repeated, is refused.
pub fn parse<A: LinkAddr>(
    packet: &[u8],
    s: &Ipv6Summary,
    icmp_at: usize,
) -> Result<Nd<A>, WireError> {
    let msg = packet
        .get(icmp_at..s.total_len)
        .ok_or(WireError::BadNd("ICMPv6 message outside the packet"))?;
    let Some(&[kind, code]) = msg.first_chunk::<2>() else {
        return Err(WireError::BadNd("ICMPv6 header truncated"));
    };
    if !is_nd(kind) {
        return Err(WireError::BadNd("not a neighbour discovery message"));
    }
    if s.hop_limit != 255 {
        return Err(WireError::BadNd(
            "hop limit is not 255 (not from this link)",
        ));
    }
    if code != 0 {
        return Err(WireError::BadNd("ICMPv6 code is not 0"));
    }
    let fixed = fixed_len(kind);
    if msg.len() < fixed {
        return Err(WireError::BadNd("message shorter than its fixed part"));
    }
    if upper_checksum(&s.src, &s.dst, PROTO_ICMPV6, msg) != 0 {
        return Err(WireError::BadNd("ICMPv6 checksum is wrong"));
    }
    let addr_at = |at: usize| {
        let mut a = [0u8; 16];
        a.copy_from_slice(&msg[at..at + 16]);
        Ipv6Addr::from(a)
    };
    let target = match kind {
        NEIGHBOUR_SOLICIT | NEIGHBOUR_ADVERT | REDIRECT => Some(addr_at(8)),
        _ => None,
    };
    if let Some(t) = target
        && kind != REDIRECT
        && t.is_multicast()
    {
        return Err(WireError::BadNd("target address is multicast"));
    }
    let flags = if kind == NEIGHBOUR_ADVERT {
        msg[4] & 0xe0
    } else {
        0
    };
    // RFC 4861 §7.1.2: an answer to a solicitation goes to the soliciter, never to a group.
    if flags & NA_SOLICITED != 0 && s.dst.is_multicast() {
        return Err(WireError::BadNd(
            "solicited advertisement to a multicast address",
        ));
    }
    let mut nd = Nd {
        kind,
        src: s.src,
        dst: s.dst,
        target,
        flags,
        source_ll: None,
        target_ll: None,
        icmp_at,
        total_len: s.total_len,
    };
    let mut at = fixed;
    while at < msg.len() {
        let Some(&[t, units]) = msg[at..].first_chunk::<2>() else {
            return Err(WireError::BadNd("option header truncated"));
        };
        let len = usize::from(units) * 8;
        if len == 0 {
            return Err(WireError::BadNd("option of length 0"));
        }
        let Some(opt) = msg.get(at..at + len) else {
            return Err(WireError::BadNd("option longer than the message"));
        };
        if t == OPT_SOURCE_LL || t == OPT_TARGET_LL {
            if units != A::UNITS {
                return Err(WireError::BadNd(
                    "link-layer address option of the wrong length for this link",
                ));
            }
            let slot = if t == OPT_SOURCE_LL {
                &mut nd.source_ll
            } else {
                &mut nd.target_ll
            };
            if slot.is_some() {
                return Err(WireError::BadNd("link-layer address option repeated"));
            }
            *slot = Some(A::read(opt)?);
        }
        at += len;
    }
    // RFC 4861 §7.1.1: a solicitation from the unspecified address (duplicate address
    // detection) carries no source link-layer address.
    if kind == NEIGHBOUR_SOLICIT && s.src.is_unspecified() && nd.source_ll.is_some() {
        return Err(WireError::BadNd(
            "solicitation from :: with a source link-layer address",
        ));
    }
    Ok(nd)
}

impl<A: LinkAddr> Nd<A> {
    /// Write `packet` (the one this was parsed from) to `out` in the other link's form:
    /// the source and target link-layer options hold `source_ll` and `target_ll` (an
    /// option whose new address is `None` is left out), the payload length and the
    /// checksum are recomputed. Returns the new packet's length.
    pub fn translate<B: LinkAddr>(
        &self,
        packet: &[u8],
        source_ll: Option<B>,
        target_ll: Option<B>,
        out: &mut [u8],
    ) -> Result<usize, WireError> {
        let too_small = WireError::BadNd("translated message does not fit the buffer");
        let fixed_end = self.icmp_at + fixed_len(self.kind);
        let head = packet
            .get(..fixed_end)
            .ok_or(WireError::BadNd("message outside the packet"))?;
        out.get_mut(..fixed_end)
            .ok_or(too_small)?
            .copy_from_slice(head);
        let mut w = fixed_end;
        let mut at = fixed_end;
        while at < self.total_len {
            // Checked by `parse`: every option has a non-zero length and fits.
            let len = usize::from(packet[at + 1]) * 8;
            let t = packet[at];
            let new = match t {
                OPT_SOURCE_LL => Some(source_ll),
                OPT_TARGET_LL => Some(target_ll),
                _ => None,
            };
            match new {
                Some(Some(addr)) => {
                    let n = usize::from(B::UNITS) * 8;
                    addr.write(t, out.get_mut(w..w + n).ok_or(too_small)?);
                    w += n;
                }
                Some(None) => {}
                None => {
                    out.get_mut(w..w + len)
                        .ok_or(too_small)?
                        .copy_from_slice(&packet[at..at + len]);
                    w += len;
                }
            }
            at += len;
        }
        let payload = u16::try_from(w - ipv6::HEADER_LEN)
            .map_err(|_| WireError::BadNd("translated message longer than IPv6 allows"))?;
        ipv6::set_payload_len(out, payload);
        out[self.icmp_at + 2] = 0;
        out[self.icmp_at + 3] = 0;
        let c = upper_checksum(&self.src, &self.dst, PROTO_ICMPV6, &out[self.icmp_at..w]);
        out[self.icmp_at + 2..self.icmp_at + 4].copy_from_slice(&c.to_be_bytes());
        Ok(w)
    }
}

/// Write a neighbour solicitation for `target` from `src` (one of this interface's
/// addresses) with `own` as its source link-layer address, sent to `target`'s
/// solicited-node group: the packet from the IPv6 header on. Returns its length.
pub fn solicit(
    own: IpoibAddr,
    src: Ipv6Addr,
    target: Ipv6Addr,
    out: &mut [u8],
) -> Result<usize, WireError> {
    let dst = ipv6::solicited_node(&target);
    let mut body = [0u8; 24 + IPOIB_OPT_LEN];
    body[0] = NEIGHBOUR_SOLICIT;
    body[8..24].copy_from_slice(&target.octets());
    own.write(OPT_SOURCE_LL, &mut body[24..]);
    emit_icmp(src, dst, &body, out)
}

/// Write an unsolicited neighbour advertisement (override set) of `target` at `own`, to
/// all nodes: what a restarted interface sends so that peers follow it to its new QPN.
/// Returns its length.
pub fn advertise(own: IpoibAddr, target: Ipv6Addr, out: &mut [u8]) -> Result<usize, WireError> {
    let mut body = [0u8; 24 + IPOIB_OPT_LEN];
    body[0] = NEIGHBOUR_ADVERT;
    body[4] = NA_OVERRIDE;
    body[8..24].copy_from_slice(&target.octets());
    own.write(OPT_TARGET_LL, &mut body[24..]);
    emit_icmp(
        target,
        Ipv6Addr::new(0xff02, 0, 0, 0, 0, 0, 0, 1),
        &body,
        out,
    )
}

/// An IPv6 packet (hop limit 255) carrying the ICMPv6 message `body`, its checksum
/// filled in.
fn emit_icmp(
    src: Ipv6Addr,
    dst: Ipv6Addr,
    body: &[u8],
    out: &mut [u8],
) -> Result<usize, WireError> {
    let total = ipv6::HEADER_LEN + body.len();
    let got = out.len();
    let out = out.get_mut(..total).ok_or(WireError::Truncated {
        what: "neighbour discovery message",
        need: total,
        got,
    })?;
    out[..ipv6::HEADER_LEN].fill(0);
    out[0] = 0x60;
    // `body` is a fixed-size message far below 64 KiB.
    out[4..6].copy_from_slice(&(body.len() as u16).to_be_bytes());
    out[6] = PROTO_ICMPV6;
    out[7] = 255;
    out[8..24].copy_from_slice(&src.octets());
    out[24..40].copy_from_slice(&dst.octets());
    let m = &mut out[ipv6::HEADER_LEN..];
    m.copy_from_slice(body);
    let c = upper_checksum(&src, &dst, PROTO_ICMPV6, m);
    m[2..4].copy_from_slice(&c.to_be_bytes());
    Ok(total)
}

#[cfg(test)]
mod tests;
