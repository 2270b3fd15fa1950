//! The real provider over libibverbs (bindings generated from the system headers: `ffi`).
//!
//! This module owns every `unsafe` line of the crate. It turns an [`EndpointConfig`] into
//! a [`RdmaEndpoint`]: device context, protection domain, one registered buffer region,
//! a completion channel, a receive and a send CQ, a UD QP in RTS, address handles and
//! multicast attachments. Each verbs object has an owning type whose `Drop` destroys it;
//! the endpoint tears them down in dependency order. A destroy that fails is logged and
//! counted ([`RdmaProvider::teardown_errors`]), never a panic; after the device was lost,
//! `EIO` from a destroy is counted apart as already destroyed
//! ([`RdmaProvider::teardown_already_gone`]).
//!
//! Device loss is reported through [`Endpoint::next_async_event`]: `DEVICE_FATAL` from the
//! verbs async fd, and rdma_cm's `DEVICE_REMOVAL` from a watcher id bound to the
//! endpoint's address (rxe signals a removal only there). After either, drop the endpoint
//! at once: the kernel finishes removing the device (and `rdma link delete` returns) only
//! when every verbs context on it is closed. Then [`Provider::open`] answers
//! [`VerbsError::NoDevice`] until a device of that name is back.
//!
//! What it must not do: retry a failed `ibv_poll_cq`, hide a negative return, cache
//! anything about a device across opens (GID indexes move after port flaps and device
//! re-adds), or let a raw errno or `ibv_wc` escape: everything leaves as the types of
//! [`crate::verbs`].
//!
//! Layout:
//! - `device`: device lookup, port query, GID entries (GID and type, `ibv_query_gid_ex`), MTU;
//! - `objects`: the owning wrappers, the buffer region, errno helpers, the teardown log;
//! - `cm`: the removal watcher (an rdma_cm id over the kernel ABI, see there why not
//!   librdmacm);
//! - `endpoint`: [`RdmaEndpoint`], the [`Endpoint`] implementation.
#![allow(unsafe_code)]

mod cm;
mod device;
mod endpoint;
mod ffi;
mod objects;

use std::sync::Arc;
use std::sync::atomic::Ordering;

pub use cm::CM_EVENT_OTHER_BASE;
pub use endpoint::RdmaEndpoint;

use super::{Endpoint, EndpointConfig, Provider, VerbsError};

/// Opens [`RdmaEndpoint`]s on real verbs devices (rxe, mlx5, ...).
///
/// Cheap to clone; clones share the teardown counters, which outlive every endpoint the
/// provider opened so that a supervisor can read them after dropping one.
#[derive(Clone, Debug, Default)]
pub struct RdmaProvider {
    teardown: Arc<objects::TeardownCounters>,
}

impl RdmaProvider {
    /// A provider with a zeroed teardown-error counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many destroy/detach verbs failed while tearing down endpoints (or address
    /// handles) opened by this provider. Each failure was also logged with `warn!`.
    pub fn teardown_errors(&self) -> u64 {
        self.teardown.failed.load(Ordering::Relaxed)
    }

    /// How many destroy/detach verbs returned `EIO` after their endpoint's device was
    /// reported lost (`DeviceFatal` / `DeviceRemoved`) and were taken as already
    /// destroyed: the kernel released the objects with the device, rdma-core freed the
    /// userspace side. Not included in [`Self::teardown_errors`].
    pub fn teardown_already_gone(&self) -> u64 {
        self.teardown.already_gone.load(Ordering::Relaxed)
    }

    /// Like [`Provider::open`], returning the concrete type (which adds
    /// [`RdmaEndpoint::close`] and [`RdmaEndpoint::teardown_errors`]).
    pub fn open_endpoint(&self, cfg: &EndpointConfig) -> Result<RdmaEndpoint, VerbsError> {
        RdmaEndpoint::open(cfg, objects::TeardownLog::new(self.teardown.clone()))
    }
}

impl Provider for RdmaProvider {
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError> {
        Ok(Box::new(self.open_endpoint(cfg)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(device: &str) -> EndpointConfig {
        EndpointConfig {
            device: device.to_string(),
            port: 1,
            gid_index: None,
            qkey: 0x1111_1111,
            recv_slots: 8,
            send_slots: 8,
            max_payload: None,
            banks: 1,
        }
    }

    #[test]
    fn open_unknown_device_is_no_device() {
        // Holds on any machine: with no RDMA at all the device list is empty, and no real
        // device is called this.
        let p = RdmaProvider::new();
        match p.open(&cfg("uipoib-no-such-device")) {
            Err(VerbsError::NoDevice(msg)) => {
                assert!(msg.starts_with("uipoib-no-such-device"), "{msg}");
                assert!(msg.contains("available"), "{msg}");
            }
            Err(e) => panic!("expected NoDevice, got {e}"),
            Ok(_) => panic!("opened a device that cannot exist"),
        }
        assert_eq!(p.teardown_errors(), 0);
        assert_eq!(p.teardown_already_gone(), 0);
    }

    #[test]
    fn zero_slots_are_rejected_before_touching_a_device() {
        let p = RdmaProvider::new();
        let mut c = cfg("uipoib-no-such-device");
        c.recv_slots = 0;
        assert!(matches!(
            p.open(&c),
            Err(VerbsError::Invalid {
                field: "recv_slots",
                ..
            })
        ));
    }
}
