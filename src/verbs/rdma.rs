//! The real provider over libibverbs (rdma-sys).
//!
//! This module owns every `unsafe` line of the crate. It turns an [`EndpointConfig`] into
//! a [`RdmaEndpoint`]: device context, protection domain, one registered buffer region,
//! a completion channel, a receive and a send CQ, a UD QP in RTS, address handles and
//! multicast attachments. Each verbs object has an owning type whose `Drop` destroys it;
//! the endpoint tears them down in dependency order. A destroy that fails is logged and
//! counted ([`RdmaProvider::teardown_errors`]), never a panic.
//!
//! What it must not do: retry a failed `ibv_poll_cq`, hide a negative return, cache
//! anything about a device across opens (GID indexes move after port flaps and device
//! re-adds), or let a raw errno or `ibv_wc` escape: everything leaves as the types of
//! [`crate::verbs`].
//!
//! Layout:
//! - `device`: device lookup, port query, GID table (with the sysfs GID type), MTU;
//! - `objects`: the owning wrappers, the buffer region, errno helpers, the teardown log;
//! - `endpoint`: [`RdmaEndpoint`], the [`Endpoint`] implementation.
#![allow(unsafe_code)]
#![deny(clippy::undocumented_unsafe_blocks)]

mod device;
mod endpoint;
mod objects;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

pub use endpoint::RdmaEndpoint;

use super::{Endpoint, EndpointConfig, Provider, VerbsError};

/// Opens [`RdmaEndpoint`]s on real verbs devices (rxe, mlx5, ...).
///
/// Cheap to clone; clones share the teardown-error counter, which outlives every endpoint
/// the provider opened so that a supervisor can read it after dropping one.
#[derive(Clone, Debug, Default)]
pub struct RdmaProvider {
    teardown_errors: Arc<AtomicU64>,
}

impl RdmaProvider {
    /// A provider with a zeroed teardown-error counter.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many destroy/detach verbs failed while tearing down endpoints (or address
    /// handles) opened by this provider. Each failure was also logged with `warn!`.
    pub fn teardown_errors(&self) -> u64 {
        self.teardown_errors.load(Ordering::Relaxed)
    }

    /// Like [`Provider::open`], returning the concrete type (which adds
    /// [`RdmaEndpoint::close`] and [`RdmaEndpoint::teardown_errors`]).
    pub fn open_endpoint(&self, cfg: &EndpointConfig) -> Result<RdmaEndpoint, VerbsError> {
        RdmaEndpoint::open(cfg, objects::TeardownLog::new(self.teardown_errors.clone()))
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
