//! Tests of the simulated fabric: the helpers here, the fabric's opens and deliveries in
//! `delivery`, a QP's queues, events and renewal in `queues`.

mod delivery;
mod queues;

use std::time::Duration;

use mio::unix::SourceFd;

use super::*;
use crate::verbs::{
    AhHandle, Completion, CqKind, Dest, Endpoint, EndpointConfig, GRH_LEN, Gid, GrhKind,
    MULTICAST_QPN, Provider, SEND_HEADROOM, SEND_TAILROOM, SendWr, VerbsError, WaitFds, WcStatus,
};

const QKEY: u32 = 0x0B1B_0001;
const A_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 1);
const B_IP: Ipv4Addr = Ipv4Addr::new(10, 0, 0, 2);

/// Two devices, `a` (10.0.0.1) and `b` (10.0.0.2), both with a 4096-byte MTU.
pub(crate) fn fabric() -> SimFabric {
    let f = SimFabric::new();
    f.add_device("a", A_IP, 4096).unwrap();
    f.add_device("b", B_IP, 4096).unwrap();
    f
}

fn cfg(device: &str) -> EndpointConfig {
    cfg_qkey(device, QKEY)
}

/// An endpoint on port 1 of `device`, the provider's GID, 16-slot rings, Q_Key `qkey`.
pub(crate) fn cfg_qkey(device: &str, qkey: u32) -> EndpointConfig {
    EndpointConfig {
        device: device.into(),
        port: 1,
        gid_index: None,
        qkey,
        recv_slots: 16,
        send_slots: 16,
        max_payload: None,
        banks: 1,
    }
}

fn open(f: &SimFabric, device: &str) -> Box<dyn Endpoint> {
    f.open(&cfg(device)).unwrap()
}

/// What the poller does with [`Endpoint::watch`]: every completion fd into
/// `registry` under `cq`, every event fd under `events`.
pub(crate) fn watch_with(
    ep: &mut dyn Endpoint,
    registry: &mio::Registry,
    cq: mio::Token,
    events: mio::Token,
) -> WaitFds {
    let fds = ep.watch().unwrap();
    for (list, token) in [(&fds.cq, cq), (&fds.events, events)] {
        for fd in list {
            registry
                .register(&mut SourceFd(fd), token, mio::Interest::READABLE)
                .unwrap();
        }
    }
    fds
}

/// Undo [`watch_with`].
pub(crate) fn unwatch_with(ep: &mut dyn Endpoint, registry: &mio::Registry, fds: &WaitFds) {
    for fd in fds.cq.iter().chain(&fds.events) {
        registry.deregister(&mut SourceFd(fd)).unwrap();
    }
    ep.unwatch();
}

fn open_err(f: &SimFabric, cfg: &EndpointConfig) -> VerbsError {
    match f.open(cfg) {
        Ok(_) => panic!("open({cfg:?}) succeeded"),
        Err(e) => e,
    }
}

/// A signaled send of `payload` from slot 0.
fn wr(wr_id: u64, ah: AhHandle, qpn: u32, qkey: u32, len: usize) -> SendWr {
    SendWr {
        wr_id,
        slot: 0,
        len: len as u32,
        dest: Dest { ah, qpn, qkey },
        signaled: true,
    }
}

fn send(ep: &mut dyn Endpoint, ah: AhHandle, qpn: u32, qkey: u32, wr_id: u64, payload: &[u8]) {
    ep.send_buf(0)[..payload.len()].copy_from_slice(payload);
    ep.post_send(&[wr(wr_id, ah, qpn, qkey, payload.len())])
        .unwrap();
}

fn poll_all(ep: &mut dyn Endpoint, cq: CqKind) -> Vec<Completion> {
    let mut out = [Completion::EMPTY; 64];
    let n = ep.poll_cq(cq, &mut out).unwrap();
    out[..n].to_vec()
}

fn errno(e: &VerbsError) -> Option<(&'static str, i32)> {
    match e {
        VerbsError::Verb { verb, source } => Some((verb, source.raw_os_error()?)),
        _ => None,
    }
}

fn invalid_field(e: &VerbsError) -> Option<&'static str> {
    match e {
        VerbsError::Invalid { field, .. } => Some(field),
        _ => None,
    }
}
