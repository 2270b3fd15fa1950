//! Multicast groups: the QP's attachments and, on RoCE, the IP-level membership that
//! goes with each; `ibv_detach_mcast` for the renewal and the teardown.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, UdpSocket};
use std::os::raw::c_int;

use crate::verbs::rdma::ffi::*;

use super::super::device::{self, LINK_LAYER_ETHERNET};
use super::super::objects::{Qp, ret_errno};
use super::{McastJoin, RdmaEndpoint, raw_gid};
#[cfg(doc)]
use crate::verbs::Endpoint;
use crate::verbs::{Gid, VerbsError};

impl RdmaEndpoint {
    /// [`Endpoint::attach_mcast`]: the verbs attachment, then the IP membership.
    pub(super) fn attach_group(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        if !gid.is_multicast() {
            return Err(VerbsError::Invalid {
                field: "multicast gid",
                why: format!("{gid} is not a multicast GID"),
            });
        }
        if self.mcast.iter().any(|j| j.gid == *gid) {
            return Ok(());
        }
        let g = raw_gid(gid);
        // SAFETY: the QP is live; `g` is a valid GID; LID 0 (RoCE has no LIDs).
        let ret = unsafe { ibv_attach_mcast(self.qp.as_ptr(), &g, 0) };
        if ret != 0 {
            return Err(VerbsError::verb("ibv_attach_mcast", ret_errno(ret)));
        }
        match self.ip_join(gid) {
            Ok(ip_member) => {
                self.mcast.push(McastJoin {
                    gid: *gid,
                    _ip_member: ip_member,
                });
                Ok(())
            }
            Err(e) => {
                let undo = detach_raw(&self.qp, gid);
                if undo != 0 {
                    let undo = VerbsError::verb("ibv_detach_mcast", ret_errno(undo));
                    tracing::warn!(
                        error = %undo, group = %gid,
                        "detach after a failed IP join failed"
                    );
                }
                Err(e)
            }
        }
    }

    /// [`Endpoint::detach_mcast`].
    pub(super) fn detach_group(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        let Some(i) = self.mcast.iter().position(|j| j.gid == *gid) else {
            return Err(VerbsError::Invalid {
                field: "multicast gid",
                why: format!("{gid} is not attached"),
            });
        };
        // On failure the group stays listed, so teardown tries again before the QP goes.
        // After a device loss, EIO means the attachment went with the device.
        self.log
            .excused("ibv_detach_mcast", detach_raw(&self.qp, gid))?;
        self.mcast.swap_remove(i);
        Ok(())
    }

    /// The IP-level multicast membership that RoCE needs next to `ibv_attach_mcast`.
    ///
    /// Seen on rxe (Linux 6.1): attaching `::ffff:239.1.1.1` returns 0, but rxe adds
    /// only the IPv6-style MAC `33:33:ef:01:01:01` to the netdev (`ip maddr`), and with
    /// the join below disabled no packet of the group arrived in the lab. The IPv4 group
    /// joined by a UDP socket on the interface that owns our GID's address adds
    /// `01:00:5e:01:01:01` and the IP membership; it is left when the socket closes.
    fn ip_join(&self, group: &Gid) -> Result<Option<UdpSocket>, VerbsError> {
        if self.link_layer != LINK_LAYER_ETHERNET {
            return Ok(None);
        }
        let fail = |verb: &'static str| move |source: io::Error| VerbsError::Verb { verb, source };
        if let Some(v4) = group.as_ipv4() {
            let iface = self.attrs.gid.as_ipv4().unwrap_or(Ipv4Addr::UNSPECIFIED);
            let sock = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0))
                .map_err(fail("bind (multicast join)"))?;
            sock.join_multicast_v4(&v4, &iface)
                .map_err(fail("IP_ADD_MEMBERSHIP"))?;
            return Ok(Some(sock));
        }
        let ifindex = device::gid_netdev(&self.attrs.device, self.attrs.port, self.attrs.gid_index)
            .and_then(|ndev| device::ifindex(&ndev))
            .unwrap_or(0);
        let sock =
            UdpSocket::bind((Ipv6Addr::UNSPECIFIED, 0)).map_err(fail("bind (multicast join)"))?;
        sock.join_multicast_v6(&Ipv6Addr::from(group.0), ifindex)
            .map_err(fail("IPV6_ADD_MEMBERSHIP"))?;
        Ok(Some(sock))
    }
}

/// `ibv_detach_mcast`'s return value (0 or an error code).
pub(super) fn detach_raw(qp: &Qp, gid: &Gid) -> c_int {
    let g = raw_gid(gid);
    // SAFETY: the QP is live (detach happens before it is closed); `g` is a valid GID.
    unsafe { ibv_detach_mcast(qp.as_ptr(), &g, 0) }
}
