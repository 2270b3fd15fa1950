//! Opening: the device, port and GID checks, memory, PD, MR, channel, CQs and the UD QP
//! brought up to RTS, and the removal watcher bound to the GID's address; also the QP and
//! CQs a renewal makes the same way.

use std::sync::Arc;

use crate::verbs::rdma::ffi::*;

use super::super::cm::{self, RemovalWatcher};
use super::super::device::{self, GidChoice};
use super::super::objects::{
    CompChannel, Context, Cq, Mr, Pd, Qp, QpRequest, Region, SlotLayout, TeardownLog,
    set_nonblocking, zeroed,
};
use super::{Queues, REQUESTED_MAX_INLINE, RdmaEndpoint};
use crate::verbs::retire::{RETIRE_GRACE, RETIRED_CAP, RetireQueue};
use crate::verbs::{EndpointAttrs, EndpointConfig, GrhKind, VerbsError};

impl RdmaEndpoint {
    /// Open the device and build a ready endpoint (see [`crate::verbs::Provider::open`]).
    pub(in crate::verbs::rdma) fn open(
        cfg: &EndpointConfig,
        log: TeardownLog,
    ) -> Result<Self, VerbsError> {
        if cfg.recv_slots == 0 {
            return Err(VerbsError::Invalid {
                field: "recv_slots",
                why: "must be at least 1".into(),
            });
        }
        if cfg.send_slots == 0 {
            return Err(VerbsError::Invalid {
                field: "send_slots",
                why: "must be at least 1".into(),
            });
        }
        cfg.check_banks()?;
        if cfg.port == 0 {
            return Err(VerbsError::BadPort {
                device: cfg.device.clone(),
                port: 0,
                why: "port numbers start at 1".into(),
            });
        }

        // Locals are declared in creation order, so an early return drops (destroys)
        // them in reverse: QP, CQs, channel, MR, PD, memory, context.
        let ctx = device::open_by_name(&cfg.device, &log)?;
        let port = device::query_port(&ctx, &cfg.device, cfg.port)?;
        device::check_link_layer(&cfg.device, cfg.port, port.link_layer)?;
        let gid = device::choose_gid(&ctx, &cfg.device, cfg.port, port.gid_tbl_len, cfg.gid_index)?;
        let max_payload = match cfg.max_payload {
            None => port.mtu,
            Some(0) => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: "max_payload must be at least 1 byte".into(),
                });
            }
            Some(p) if p > port.mtu => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: format!(
                        "max_payload {p} exceeds the active MTU {} of {} port {}",
                        port.mtu, cfg.device, cfg.port
                    ),
                });
            }
            Some(p) => p,
        };
        // Every bank's slots in the one region and MR: bank `b`'s receive slots are the
        // `b`-th run of `recv_slots`, its send slots the `b`-th run of `send_slots`.
        let too_many = || VerbsError::Invalid {
            field: "recv_slots/send_slots",
            why: format!(
                "{} banks of {} receive and {} send slots do not fit",
                cfg.banks, cfg.recv_slots, cfg.send_slots
            ),
        };
        let layout = SlotLayout::new(
            cfg.recv_slots.checked_mul(cfg.banks).ok_or_else(too_many)?,
            cfg.send_slots.checked_mul(cfg.banks).ok_or_else(too_many)?,
            max_payload,
        )?;
        let recv_sge_len = u32::try_from(layout.recv_len).map_err(|_| VerbsError::Invalid {
            field: "mtu",
            why: "receive slot exceeds 4 GiB".into(),
        })?;
        let total = layout.total_len().ok_or_else(|| VerbsError::Invalid {
            field: "recv_slots/send_slots",
            why: "buffer region does not fit in memory".into(),
        })?;
        let region = Region::map(total)?;
        let pd = Pd::alloc(&ctx, &log)?;
        let mr = Mr::register(&pd, &region, &log)?;
        let channel = CompChannel::create(&ctx, &log)?;
        set_nonblocking(ctx.async_fd(), "fcntl(O_NONBLOCK) on the async event fd")?;
        let recv_cq = Cq::create(&ctx, cfg.recv_slots, &channel, &log)?;
        let send_cq = Cq::create(&ctx, cfg.send_slots, &channel, &log)?;
        let mut req = QpRequest {
            max_send_wr: cfg.send_slots,
            max_recv_wr: cfg.recv_slots,
            max_inline_data: REQUESTED_MAX_INLINE,
        };
        let (qp, caps) = match Qp::create_ud(&pd, &send_cq, &recv_cq, &req, &log) {
            Ok(created) => created,
            Err(e) => {
                tracing::debug!(error = %e, "UD QP with inline data refused; retrying without");
                req.max_inline_data = 0;
                Qp::create_ud(&pd, &send_cq, &recv_cq, &req, &log)?
            }
        };
        bring_up(&qp, cfg)?;
        let watcher = open_watcher(&ctx, cfg, &gid)?;

        let attrs = EndpointAttrs {
            device: cfg.device.clone(),
            port: cfg.port,
            qpn: qp.qp_num(),
            gid: gid.gid,
            gid_index: gid.index,
            grh_kind: grh_kind(&gid),
            max_payload,
            port_mtu: port.mtu,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            // What the device granted (it may round the request up); 0 if the QP was
            // created without inline.
            max_inline: if req.max_inline_data == 0 {
                0
            } else {
                caps.max_inline_data
            },
            banks: cfg.banks,
        };
        tracing::info!(
            device = %attrs.device, port = attrs.port, qpn = attrs.qpn, gid = %attrs.gid,
            gid_index = attrs.gid_index, gid_type = ?gid.gid_type, grh = ?attrs.grh_kind,
            mtu = attrs.port_mtu, max_payload = attrs.max_payload,
            max_inline = attrs.max_inline, banks = attrs.banks, registered_bytes = total,
            removal_watcher = watcher.is_some(),
            "verbs endpoint open"
        );
        let send_n = usize::try_from(cfg.send_slots).unwrap_or(usize::MAX);
        let recv_n = usize::try_from(cfg.recv_slots).unwrap_or(usize::MAX);
        let wc_n = usize::try_from(cfg.recv_slots.max(cfg.send_slots)).unwrap_or(usize::MAX);
        Ok(RdmaEndpoint {
            attrs,
            cfg: cfg.clone(),
            log,
            link_layer: port.link_layer,
            layout,
            recv_sge_len,
            recvs_in_flight: 0,
            sends_in_flight: 0,
            closed: false,
            lost: None,
            send_wrs: (0..send_n).map(|_| zeroed()).collect(),
            send_sges: (0..send_n).map(|_| zeroed()).collect(),
            recv_wrs: (0..recv_n).map(|_| zeroed()).collect(),
            recv_sges: (0..recv_n).map(|_| zeroed()).collect(),
            wcs: (0..wc_n).map(|_| zeroed()).collect(),
            watcher,
            retired: Arc::new(RetireQueue::new(RETIRE_GRACE, RETIRED_CAP)),
            spare: None,
            spare_refused: false,
            mcast: Vec::new(),
            ahs: Vec::new(),
            qp,
            recv_cq,
            send_cq,
            abandoned: Vec::new(),
            channel,
            mr,
            pd,
            ctx,
            region,
        })
    }

    /// A receive and a send CQ on the endpoint's channel and a UD QP on them in RTS, as
    /// at open (the same depths and inline request).
    pub(super) fn create_queues(&self) -> Result<Queues, VerbsError> {
        let recv_cq = Cq::create(&self.ctx, self.attrs.recv_slots, &self.channel, &self.log)?;
        let send_cq = Cq::create(&self.ctx, self.attrs.send_slots, &self.channel, &self.log)?;
        let req = QpRequest {
            max_send_wr: self.attrs.send_slots,
            max_recv_wr: self.attrs.recv_slots,
            max_inline_data: if self.attrs.max_inline == 0 {
                0
            } else {
                REQUESTED_MAX_INLINE
            },
        };
        let (qp, caps) = Qp::create_ud(&self.pd, &send_cq, &recv_cq, &req, &self.log)?;
        bring_up(&qp, &self.cfg)?;
        Ok(Queues {
            qp,
            recv_cq,
            send_cq,
            max_inline: if req.max_inline_data == 0 {
                0
            } else {
                caps.max_inline_data
            },
        })
    }
}

/// RESET → INIT (P_Key index 0, port, Q_Key) → RTR → RTS (SQ PSN 0): a UD QP's bring-up.
fn bring_up(qp: &Qp, cfg: &EndpointConfig) -> Result<(), VerbsError> {
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_INIT;
    attr.pkey_index = 0;
    attr.port_num = cfg.port;
    attr.qkey = cfg.qkey;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE
            | ibv_qp_attr_mask::IBV_QP_PKEY_INDEX
            | ibv_qp_attr_mask::IBV_QP_PORT
            | ibv_qp_attr_mask::IBV_QP_QKEY,
        "ibv_modify_qp(INIT)",
    )?;
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTR;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE,
        "ibv_modify_qp(RTR)",
    )?;
    let mut attr: ibv_qp_attr = zeroed();
    attr.qp_state = ibv_qp_state::IBV_QPS_RTS;
    attr.sq_psn = 0;
    qp.modify(
        &mut attr,
        ibv_qp_attr_mask::IBV_QP_STATE | ibv_qp_attr_mask::IBV_QP_SQ_PSN,
        "ibv_modify_qp(RTS)",
    )
}

pub(super) fn grh_kind(gid: &GidChoice) -> GrhKind {
    if gid.is_ipv4_rocev2() {
        GrhKind::Ipv4
    } else {
        GrhKind::Ipv6
    }
}

/// Set up the removal watcher for the endpoint's GID, or log why not and run without.
/// A watcher that the kernel bound to another device or port than the one opened is an
/// error: its removal events would be another device's, and this one's would go unseen.
fn open_watcher(
    ctx: &Context,
    cfg: &EndpointConfig,
    gid: &GidChoice,
) -> Result<Option<RemovalWatcher>, VerbsError> {
    let scope_id = device::gid_netdev(&cfg.device, cfg.port, gid.index)
        .and_then(|ndev| device::ifindex(&ndev))
        .unwrap_or(0);
    let addr = cm::bind_addr(&gid.gid, scope_id);
    let (watcher, bound) = match RemovalWatcher::open(&addr) {
        Ok(w) => w,
        Err(e) => {
            tracing::warn!(
                device = %cfg.device, %addr, error = %e,
                "no rdma_cm removal watcher: a device removal is detected only on drivers \
                 that report DEVICE_FATAL (rxe does not)"
            );
            return Ok(None);
        }
    };
    let bound_name = bound.ibdev_index.and_then(device::name_by_index);
    check_binding(cfg, &addr, ctx.identity(), &bound, bound_name.as_deref())?;
    tracing::debug!(%addr, ibdev_index = ?bound.ibdev_index, "rdma_cm removal watcher bound");
    Ok(Some(watcher))
}

/// Whether the watcher's binding (`bound`, on the device called `bound_name` if known) is
/// the opened device (`own`: node GUID and kernel index) and port; else an error naming
/// both devices.
fn check_binding(
    cfg: &EndpointConfig,
    addr: &std::net::SocketAddr,
    own: (u64, Option<u32>),
    bound: &cm::Binding,
    bound_name: Option<&str>,
) -> Result<(), VerbsError> {
    let (guid, index) = own;
    let same_index = match (index, bound.ibdev_index) {
        (Some(a), Some(b)) => a == b,
        _ => true,
    };
    if bound.node_guid == guid && same_index && bound.port == cfg.port {
        return Ok(());
    }
    let other = match bound_name {
        Some(name) => name.to_string(),
        None => format!("with node GUID {:016x}", u64::from_be(bound.node_guid)),
    };
    Err(VerbsError::BadPort {
        device: cfg.device.clone(),
        port: cfg.port,
        why: format!(
            "the address {addr} of its GID belongs to device {other} port {} for rdma_cm, \
             not to {} port {}: the removal watcher would report device {other}'s removal, \
             and {}'s would go unseen (give {} a GID of its own, or pick another gid_index)",
            bound.port, cfg.device, cfg.port, cfg.device, cfg.device
        ),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watcher_bound_to_another_device_is_an_error_naming_both() {
        let cfg = EndpointConfig {
            device: "rxe0".into(),
            port: 1,
            gid_index: None,
            qkey: 1,
            recv_slots: 8,
            send_slots: 8,
            banks: 1,
            max_payload: None,
        };
        let addr: std::net::SocketAddr = "198.18.0.1:0".parse().unwrap();
        let own = (0x1122_u64.to_be(), Some(3));
        let ours = cm::Binding {
            node_guid: 0x1122_u64.to_be(),
            ibdev_index: Some(3),
            port: 1,
        };
        assert!(check_binding(&cfg, &addr, own, &ours, Some("rxe0")).is_ok());
        // A kernel that does not report the index: the GUID and port decide.
        let no_index = cm::Binding {
            ibdev_index: None,
            ..ours
        };
        assert!(check_binding(&cfg, &addr, own, &no_index, None).is_ok());
        for other in [
            cm::Binding {
                ibdev_index: Some(4),
                ..ours
            },
            cm::Binding {
                node_guid: 0x3344_u64.to_be(),
                ibdev_index: Some(4),
                port: 1,
            },
            cm::Binding { port: 2, ..ours },
        ] {
            let e = check_binding(&cfg, &addr, own, &other, Some("mlx5_1"))
                .unwrap_err()
                .to_string();
            assert!(e.contains("rxe0") && e.contains("mlx5_1"), "{e}");
            assert!(e.contains("198.18.0.1"), "{e}");
        }
        let unnamed = cm::Binding {
            node_guid: 0x3344_u64.to_be(),
            ibdev_index: None,
            port: 1,
        };
        let e = check_binding(&cfg, &addr, own, &unnamed, None)
            .unwrap_err()
            .to_string();
        assert!(e.contains("node GUID 0000000000003344"), "{e}");
    }
}
