//! Global identifiers: the 128-bit addresses of RDMA ports (IPv6 addresses on RoCE, an
//! IPv4 address mapped into IPv6 on RoCEv2 over IPv4).

use core::fmt;
use std::net::Ipv4Addr;

/// A 128-bit global identifier (an IPv6 address on RoCE).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default, PartialOrd, Ord)]
pub struct Gid(pub [u8; 16]);

impl Gid {
    /// The all-zero GID.
    pub const ZERO: Gid = Gid([0; 16]);

    /// The IPv4-mapped GID `::ffff:a.b.c.d` (how RoCEv2 names an IPv4 address).
    pub fn from_ipv4(addr: Ipv4Addr) -> Gid {
        let mut g = [0u8; 16];
        g[10] = 0xff;
        g[11] = 0xff;
        g[12..16].copy_from_slice(&addr.octets());
        Gid(g)
    }

    /// The IPv4 address of an IPv4-mapped GID, `None` for any other GID.
    pub fn as_ipv4(&self) -> Option<Ipv4Addr> {
        if self.0[..10].iter().all(|&b| b == 0) && self.0[10] == 0xff && self.0[11] == 0xff {
            Some(Ipv4Addr::new(
                self.0[12], self.0[13], self.0[14], self.0[15],
            ))
        } else {
            None
        }
    }

    /// True for multicast GIDs: IB/IPv6 multicast (`ff..`) or IPv4-mapped multicast.
    pub fn is_multicast(&self) -> bool {
        self.0[0] == 0xff || self.as_ipv4().is_some_and(|a| a.is_multicast())
    }

    /// True for the all-zero GID.
    pub fn is_zero(&self) -> bool {
        self.0 == [0; 16]
    }
}

impl fmt::Display for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Some(v4) = self.as_ipv4() {
            return write!(f, "::ffff:{v4}");
        }
        std::net::Ipv6Addr::from(self.0).fmt(f)
    }
}

impl fmt::Debug for Gid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Gid({self})")
    }
}

impl std::str::FromStr for Gid {
    type Err = std::net::AddrParseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if let Ok(v4) = s.parse::<Ipv4Addr>() {
            return Ok(Gid::from_ipv4(v4));
        }
        Ok(Gid(s.parse::<std::net::Ipv6Addr>()?.octets()))
    }
}
