//! [`SimFabric`]: its devices and GID tables, counters, held sends, and `open`; the
//! topology's multicast bookkeeping.

use std::collections::HashMap;
use std::fmt;
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use crate::verbs::retire::{RETIRED_CAP, RetireQueue};
use crate::verbs::{
    CqKind, Endpoint, EndpointAttrs, EndpointConfig, GRH_LEN, Gid, GrhKind, Provider, VerbsError,
    WcStatus,
};

use super::delivery::deliver;
use super::endpoint::send_stride;
use super::qp::wake;
use super::{
    AtomicCounters, Device, FIRST_QPN, Fabric, MAX_QPN, MAX_SLOTS, PORT_MTUS, Qp, QpState,
    SendSide, SimCounters, SimDestroy, SimEndpoint, SimFabric, Tally, Topology, lock, read, write,
};

impl Default for SimFabric {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let topo = read(&self.inner.topo);
        f.debug_struct("SimFabric")
            .field(
                "devices",
                &topo.devices.iter().map(|d| &d.name).collect::<Vec<_>>(),
            )
            .field("live_qps", &topo.qps.len())
            .field("groups", &topo.groups.len())
            .finish()
    }
}

impl SimFabric {
    /// An empty fabric: no devices.
    pub fn new() -> Self {
        SimFabric {
            inner: Arc::new(Fabric {
                topo: RwLock::new(Topology {
                    devices: Vec::new(),
                    by_name: HashMap::new(),
                    by_gid: HashMap::new(),
                    qps: HashMap::new(),
                    groups: HashMap::new(),
                    next_qpn: FIRST_QPN,
                }),
                counters: AtomicCounters::default(),
                opens: AtomicU64::new(0),
                endpoint_restarts: AtomicU64::new(0),
                retire_grace: Mutex::new(Duration::ZERO),
                destroyed: Mutex::new(Vec::new()),
            }),
        }
    }

    /// Endpoints opened so far (each is a device context, PD and memory registration
    /// on real verbs).
    pub fn opens(&self) -> u64 {
        self.inner.opens.load(Ordering::Relaxed)
    }

    /// [`Endpoint::restart`]s so far (a new QP and CQs on an endpoint kept open).
    pub fn endpoint_restarts(&self) -> u64 {
        self.inner.endpoint_restarts.load(Ordering::Relaxed)
    }

    /// How long the QP a renewal replaced waits before it is destroyed, for endpoints
    /// opened from now on (the real provider's is [`crate::verbs::retire::RETIRE_GRACE`]).
    pub fn set_retire_grace(&self, grace: Duration) {
        *lock(&self.inner.retire_grace) = grace;
    }

    /// Every destroy of a replaced QP so far, in order.
    pub fn destroyed(&self) -> Vec<SimDestroy> {
        lock(&self.inner.destroyed).clone()
    }

    /// Add a device with one port (port 1), a GID table (index 0 an `fe80::` link-local
    /// GID, index 1 the IPv4-mapped GID `::ffff:<ipv4>`, like rxe), and an active MTU in
    /// bytes (256/512/1024/2048/4096).
    ///
    /// Names and IPv4 addresses must be unique on the fabric (GIDs route packets). The
    /// link-local GID is the EUI-64 of the MAC `02:00:<ipv4>`.
    pub fn add_device(&self, name: &str, ipv4: Ipv4Addr, mtu: u32) -> Result<(), VerbsError> {
        if !PORT_MTUS.contains(&mtu) {
            return Err(VerbsError::Invalid {
                field: "mtu",
                why: format!("{mtu} is not an IB MTU (one of {PORT_MTUS:?})"),
            });
        }
        if name.is_empty() {
            return Err(VerbsError::Invalid {
                field: "device",
                why: "empty device name".into(),
            });
        }
        let gids = [link_local_gid(ipv4), Gid::from_ipv4(ipv4)];
        let mut topo = write(&self.inner.topo);
        if topo.by_name.contains_key(name) {
            return Err(VerbsError::Invalid {
                field: "device",
                why: format!("a device named {name:?} already exists"),
            });
        }
        if gids.iter().any(|g| topo.by_gid.contains_key(g)) {
            return Err(VerbsError::Invalid {
                field: "ipv4",
                why: format!("another device already has address {ipv4}"),
            });
        }
        let idx = topo.devices.len();
        topo.devices.push(Device {
            name: name.to_owned(),
            ipv4,
            mtu,
            gids,
        });
        topo.by_name.insert(name.to_owned(), idx);
        for g in gids {
            topo.by_gid.insert(g, idx);
        }
        Ok(())
    }

    /// Change a device's port MTU and IPv4 address (so its GIDs), as when a device is
    /// deleted and re-added on a netdev with another MTU or address. Endpoints already
    /// open keep what they had; later opens see the new values.
    pub fn reconfigure_device(
        &self,
        name: &str,
        ipv4: Ipv4Addr,
        mtu: u32,
    ) -> Result<(), VerbsError> {
        if !PORT_MTUS.contains(&mtu) {
            return Err(VerbsError::Invalid {
                field: "mtu",
                why: format!("{mtu} is not an IB MTU (one of {PORT_MTUS:?})"),
            });
        }
        let mut topo = write(&self.inner.topo);
        let idx = *topo
            .by_name
            .get(name)
            .ok_or_else(|| VerbsError::NoDevice(name.to_owned()))?;
        let gids = [link_local_gid(ipv4), Gid::from_ipv4(ipv4)];
        if gids
            .iter()
            .any(|g| topo.by_gid.get(g).is_some_and(|i| *i != idx))
        {
            return Err(VerbsError::Invalid {
                field: "ipv4",
                why: format!("another device already has address {ipv4}"),
            });
        }
        let old = topo.devices[idx].gids;
        for g in old {
            topo.by_gid.remove(&g);
        }
        for g in gids {
            topo.by_gid.insert(g, idx);
        }
        let d = &mut topo.devices[idx];
        d.ipv4 = ipv4;
        d.mtu = mtu;
        d.gids = gids;
        Ok(())
    }

    /// The GID table of `device`'s port 1, `None` for an unknown device.
    pub fn gids(&self, device: &str) -> Option<Vec<Gid>> {
        let topo = read(&self.inner.topo);
        let idx = *topo.by_name.get(device)?;
        Some(topo.devices[idx].gids.to_vec())
    }

    /// Fabric-wide counters (silent drops the receivers never see, and deliveries).
    pub fn counters(&self) -> SimCounters {
        self.inner.counters.snapshot()
    }

    /// QPs currently open (endpoints not yet dropped).
    pub fn live_qps(&self) -> usize {
        read(&self.inner.topo).qps.len()
    }

    /// Multicast groups with at least one QP attached.
    pub fn mcast_groups(&self) -> usize {
        read(&self.inner.topo).groups.len()
    }

    /// Hold back (`hold == true`) or release the sends of QP `qpn`, like a link that
    /// stalls. A held send is copied at post time and stays outstanding without a
    /// completion; it is flushed if the QP enters the error state. Releasing executes the
    /// held sends in order (delivery and completions) before returning. Returns `false`
    /// when no QP has that number.
    pub fn hold_sends(&self, qpn: u32, hold: bool) -> bool {
        // Clone the QP out and release the topology before taking its send lock (lock
        // order: send side, then topology).
        let Some(qp) = read(&self.inner.topo).qps.get(&qpn).cloned() else {
            return false;
        };
        let mut send = lock(&qp.send);
        send.held = hold;
        if !hold && !send.queue.is_empty() {
            let mut tally = Tally::default();
            let topo = read(&self.inner.topo);
            for h in &send.queue {
                deliver(&topo, &mut tally, &qp, &h.dgid, h.dqpn, h.qkey, &h.data);
            }
            drop(topo);
            self.inner.counters.add(&tally);
            let SendSide { queue, pool, .. } = &mut *send;
            let mut st = lock(&qp.state);
            for h in queue.drain(..) {
                if h.signaled {
                    st.push_send_cqe(h.wr_id, WcStatus::Success);
                } else {
                    st.unsignaled_done += 1;
                }
                pool.push(h.data);
            }
            let waker = if st.send_cq.is_empty() {
                None
            } else {
                st.completion_added(CqKind::Send)
            };
            drop(st);
            wake(waker);
        }
        true
    }
}

/// The link-local GID of a simulated device: `fe80::` + EUI-64 of MAC `02:00:<ipv4>`.
fn link_local_gid(ipv4: Ipv4Addr) -> Gid {
    let o = ipv4.octets();
    let mut g = [0u8; 16];
    g[0] = 0xfe;
    g[1] = 0x80;
    // EUI-64 of 02:00:o0:o1:o2:o3 with the U/L bit flipped: 00:00:o0:ff:fe:o1:o2:o3.
    g[8..16].copy_from_slice(&[0x00, 0x00, o[0], 0xff, 0xfe, o[1], o[2], o[3]]);
    Gid(g)
}

impl Provider for SimFabric {
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError> {
        let mut topo = write(&self.inner.topo);
        let dev_idx = *topo
            .by_name
            .get(&cfg.device)
            .ok_or_else(|| VerbsError::NoDevice(cfg.device.clone()))?;
        let dev = &topo.devices[dev_idx];
        if cfg.port != 1 {
            return Err(VerbsError::BadPort {
                device: dev.name.clone(),
                port: cfg.port,
                why: "a simulated device has only port 1".into(),
            });
        }
        let gid_index = match cfg.gid_index {
            Some(i) => i,
            None => dev
                .gids
                .iter()
                .position(|g| g.as_ipv4().is_some())
                .unwrap_or(0) as u8,
        };
        let gid = *dev
            .gids
            .get(usize::from(gid_index))
            .ok_or_else(|| VerbsError::NoGid {
                device: dev.name.clone(),
                port: cfg.port,
                why: format!(
                    "index {gid_index} is outside the GID table of {} entries",
                    dev.gids.len()
                ),
            })?;
        cfg.check_banks()?;
        for (field, v) in [
            ("recv_slots", cfg.recv_slots),
            ("send_slots", cfg.send_slots),
        ] {
            if v == 0 || v > MAX_SLOTS {
                return Err(VerbsError::Invalid {
                    field,
                    why: format!("{v} is outside 1..={MAX_SLOTS}"),
                });
            }
        }
        let max_payload = match cfg.max_payload {
            None => dev.mtu,
            Some(p) if p == 0 || p > dev.mtu => {
                return Err(VerbsError::Invalid {
                    field: "mtu",
                    why: format!(
                        "max_payload {p} is outside 1..={} (the active MTU of {} port 1)",
                        dev.mtu, dev.name
                    ),
                });
            }
            Some(p) => p,
        };
        let qpn = topo.next_qpn;
        if qpn > MAX_QPN {
            return Err(VerbsError::verb("ibv_create_qp", libc::ENOMEM));
        }
        let (grh_kind, ipv4) = match gid.as_ipv4() {
            Some(a) => (GrhKind::Ipv4, a),
            None => (GrhKind::Ipv6, dev.ipv4),
        };
        let attrs = EndpointAttrs {
            device: dev.name.clone(),
            port: 1,
            qpn,
            gid,
            gid_index,
            grh_kind,
            max_payload,
            port_mtu: dev.mtu,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            max_inline: 0,
            banks: cfg.banks,
        };
        let recv_slots = cfg.recv_slots as usize;
        let send_slots = cfg.send_slots as usize;
        let banks = cfg.banks as usize;
        let qp = Arc::new(Qp::new(Qp {
            qpn,
            device: dev_idx,
            qkey: cfg.qkey,
            max_payload,
            grh_kind,
            gid,
            ipv4,
            recv_slots: cfg.recv_slots,
            send_slots: cfg.send_slots,
            send: Mutex::new(SendSide::default()),
            state: Mutex::new(QpState::default()),
        }));
        topo.next_qpn = qpn + 1;
        topo.qps.insert(qpn, Arc::clone(&qp));
        drop(topo);
        self.inner.opens.fetch_add(1, Ordering::Relaxed);

        let recv_stride = GRH_LEN + max_payload as usize;
        Ok(Box::new(SimEndpoint {
            fabric: Arc::clone(&self.inner),
            qp,
            recv_stride,
            recv_mem: vec![0; banks * recv_slots * recv_stride],
            send_mem: vec![0; banks * send_slots * send_stride(max_payload)],
            attrs,
            ahs: HashMap::new(),
            next_ah: 1,
            groups: Vec::new(),
            polled: Vec::with_capacity(recv_slots),
            spare: Vec::with_capacity(recv_slots),
            channel: None,
            retired: Arc::new(RetireQueue::new(
                *lock(&self.inner.retire_grace),
                RETIRED_CAP,
            )),
            recreated: [false; 2],
        }))
    }
}

/// Remove QP `qpn` from group `gid`, and the group when it empties.
pub(super) fn detach(topo: &mut Topology, gid: &Gid, qpn: u32) {
    if let Some(members) = topo.groups.get_mut(gid) {
        members.retain(|m| m.qpn != qpn);
        if members.is_empty() {
            topo.groups.remove(gid);
        }
    }
}
