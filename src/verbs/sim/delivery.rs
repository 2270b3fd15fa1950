//! A packet on the fabric: from a sender to the receiver(s) its destination names, each
//! check a real device makes (Q_Key, size, a posted receive, the QP's state), and the
//! GRH the receiver finds in front of the payload.

use std::net::Ipv4Addr;

use crate::verbs::{Completion, CqKind, GRH_LEN, Gid, GrhKind, MULTICAST_QPN, WcStatus};

use super::qp::wake;
use super::{
    GRH_HOP_LIMIT, GRH_NEXT_HEADER_BTH, IB_PAYLEN_OVERHEAD, QKEY_USE_QP, Qp, ROCE_V4_OVERHEAD,
    RecvCqe, Tally, Topology, lock,
};

/// Deliver one packet from `src` to `dgid`/`dqpn` (or to every member of a multicast
/// group). Called with the topology read-locked; locks each receiver's state in turn.
pub(super) fn deliver(
    topo: &Topology,
    tally: &mut Tally,
    src: &Qp,
    dgid: &Gid,
    dqpn: u32,
    qkey: u32,
    payload: &[u8],
) {
    let qkey = if qkey & QKEY_USE_QP != 0 {
        src.qkey
    } else {
        qkey
    };
    if dqpn == MULTICAST_QPN && dgid.is_multicast() {
        match topo.groups.get(dgid) {
            Some(members) => {
                for dst in members {
                    if deliver_one(tally, src, dst, dgid, qkey, payload) {
                        tally.mcast_delivered += 1;
                    }
                }
            }
            None => tally.unknown_dest += 1,
        }
        return;
    }
    let dst = topo
        .by_gid
        .get(dgid)
        .and_then(|&dev| topo.qps.get(&dqpn).filter(|qp| qp.device == dev));
    match dst {
        Some(dst) => {
            deliver_one(tally, src, dst, dgid, qkey, payload);
        }
        None => tally.unknown_dest += 1,
    }
}

/// Place one packet in `dst`'s oldest posted receive, or count why not. True when
/// delivered.
fn deliver_one(
    tally: &mut Tally,
    src: &Qp,
    dst: &Qp,
    dgid: &Gid,
    qkey: u32,
    payload: &[u8],
) -> bool {
    if qkey != dst.qkey {
        tally.qkey_mismatch += 1;
        return false;
    }
    if payload.len() > dst.max_payload as usize {
        tally.oversized += 1;
        return false;
    }
    let dst_v4 = dgid.as_ipv4().unwrap_or(dst.ipv4);
    let grh = build_grh(
        dst.grh_kind,
        payload.len(),
        &src.gid,
        dgid,
        src.ipv4,
        dst_v4,
    );
    let mut st = lock(&dst.state);
    if st.error {
        tally.receiver_in_error += 1;
        return false;
    }
    let Some((wr_id, slot)) = st.recv_posted.pop_front() else {
        tally.no_recv_posted += 1;
        return false;
    };
    let mut buf = st
        .pool
        .pop()
        .unwrap_or_else(|| Vec::with_capacity(GRH_LEN + dst.max_payload as usize));
    buf.clear();
    buf.extend_from_slice(&grh);
    buf.extend_from_slice(payload);
    st.recv_cq.push_back(RecvCqe {
        wc: Completion {
            wr_id,
            status: WcStatus::Success,
            // Bounded by GRH_LEN + 4096 (checked above), so it fits.
            byte_len: (GRH_LEN + payload.len()) as u32,
            src_qp: src.qpn,
            has_grh: true,
        },
        slot,
        packet: Some(buf),
    });
    let waker = st.completion_added(CqKind::Recv);
    drop(st);
    wake(waker);
    tally.delivered += 1;
    true
}

/// The 40 bytes in front of a UD receive, in layout `kind`, for a payload of
/// `payload_len` bytes (at most 4096, so every length fits in 16 bits).
fn build_grh(
    kind: GrhKind,
    payload_len: usize,
    sgid: &Gid,
    dgid: &Gid,
    src_v4: Ipv4Addr,
    dst_v4: Ipv4Addr,
) -> [u8; GRH_LEN] {
    let mut h = [0u8; GRH_LEN];
    match kind {
        GrhKind::Ipv6 => {
            h[0] = 0x60; // version 6, traffic class 0, flow label 0
            let paylen = (payload_len + IB_PAYLEN_OVERHEAD) as u16;
            h[4..6].copy_from_slice(&paylen.to_be_bytes());
            h[6] = GRH_NEXT_HEADER_BTH;
            h[7] = GRH_HOP_LIMIT;
            h[8..24].copy_from_slice(&sgid.0);
            h[24..40].copy_from_slice(&dgid.0);
        }
        GrhKind::Ipv4 => {
            // Bytes 0..20 stay zero; the IPv4 header of the RoCEv2 packet follows.
            let ip = &mut h[20..40];
            ip[0] = 0x45; // version 4, IHL 5
            let total = (payload_len + ROCE_V4_OVERHEAD) as u16;
            ip[2..4].copy_from_slice(&total.to_be_bytes());
            ip[6] = 0x40; // don't fragment, as rxe sends
            ip[8] = GRH_HOP_LIMIT;
            ip[9] = 17; // UDP
            ip[12..16].copy_from_slice(&src_v4.octets());
            ip[16..20].copy_from_slice(&dst_v4.octets());
            let sum = crate::wire::ipv4::checksum(ip);
            ip[10..12].copy_from_slice(&sum.to_be_bytes());
        }
    }
    h
}
