//! A fault-injecting decorator around any [`Provider`]: inert unless a fault is armed.
//!
//! Wrap a provider with [`FaultyProvider::new`]; every endpoint it opens shares the
//! provider's [`FaultSwitch`]. Faults available here:
//! - `poll_error`: the next `poll_cq` calls return [`VerbsError::PollFailed`] with the
//!   armed return value (like a negative `ibv_poll_cq`).
//!
//! The switch also counts `poll_cq` calls made after a failed poll was returned, which
//! is how tests prove the poller never retries.

use std::io;
use std::sync::Arc;
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};

use super::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    PostSendError, Provider, SendWr, VerbsError,
};

/// The shared fault switches and their counters.
#[derive(Debug, Default)]
pub struct FaultSwitch {
    poll_error: AtomicI32,
    polls_failed: AtomicU64,
    polls_after_failure: AtomicU64,
}

impl FaultSwitch {
    /// Make every `poll_cq` fail with `ret` (a negative value) until cleared.
    pub fn arm_poll_error(&self, ret: i32) {
        self.poll_error.store(ret.min(-1), Ordering::SeqCst);
    }

    /// Disarm every fault.
    pub fn clear(&self) {
        self.poll_error.store(0, Ordering::SeqCst);
    }

    /// Polls that were made to fail.
    pub fn polls_failed(&self) -> u64 {
        self.polls_failed.load(Ordering::SeqCst)
    }

    /// `poll_cq` calls on an endpoint after it returned a failed poll.
    pub fn polls_after_failure(&self) -> u64 {
        self.polls_after_failure.load(Ordering::SeqCst)
    }
}

/// A provider whose endpoints obey a [`FaultSwitch`].
pub struct FaultyProvider {
    inner: Arc<dyn Provider>,
    switch: Arc<FaultSwitch>,
}

impl FaultyProvider {
    /// Wrap `inner`.
    pub fn new(inner: Arc<dyn Provider>) -> Self {
        FaultyProvider {
            inner,
            switch: Arc::new(FaultSwitch::default()),
        }
    }

    /// The switch shared by every endpoint this provider opens.
    pub fn switch(&self) -> Arc<FaultSwitch> {
        self.switch.clone()
    }
}

impl Provider for FaultyProvider {
    fn open(&self, cfg: &EndpointConfig) -> Result<Box<dyn Endpoint>, VerbsError> {
        Ok(Box::new(FaultyEndpoint {
            inner: self.inner.open(cfg)?,
            switch: self.switch.clone(),
            failed: false,
        }))
    }
}

struct FaultyEndpoint {
    inner: Box<dyn Endpoint>,
    switch: Arc<FaultSwitch>,
    failed: bool,
}

impl Endpoint for FaultyEndpoint {
    fn attrs(&self) -> &EndpointAttrs {
        self.inner.attrs()
    }
    fn recv_buf(&self, slot: u32) -> &[u8] {
        self.inner.recv_buf(slot)
    }
    fn send_buf(&mut self, slot: u32) -> &mut [u8] {
        self.inner.send_buf(slot)
    }
    fn post_recv(&mut self, wr_id: u64, slot: u32) -> Result<(), VerbsError> {
        self.inner.post_recv(wr_id, slot)
    }
    fn post_send(&mut self, wrs: &[SendWr]) -> Result<(), PostSendError> {
        self.inner.post_send(wrs)
    }
    fn poll_cq(&mut self, cq: CqKind, out: &mut [Completion]) -> Result<usize, VerbsError> {
        if self.failed {
            self.switch
                .polls_after_failure
                .fetch_add(1, Ordering::SeqCst);
        }
        let ret = self.switch.poll_error.load(Ordering::SeqCst);
        if ret < 0 {
            self.failed = true;
            self.switch.polls_failed.fetch_add(1, Ordering::SeqCst);
            return Err(VerbsError::PollFailed { cq, ret });
        }
        self.inner.poll_cq(cq, out)
    }
    fn req_notify(&mut self, cq: CqKind) -> Result<(), VerbsError> {
        self.inner.req_notify(cq)
    }
    fn register(
        &mut self,
        registry: &mio::Registry,
        cq_token: mio::Token,
        async_token: mio::Token,
    ) -> io::Result<()> {
        self.inner.register(registry, cq_token, async_token)
    }
    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        self.inner.deregister(registry)
    }
    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError> {
        self.inner.take_cq_events()
    }
    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        self.inner.next_async_event()
    }
    fn create_ah(&mut self, gid: &Gid) -> Result<AhHandle, VerbsError> {
        self.inner.create_ah(gid)
    }
    fn destroy_ah(&mut self, ah: AhHandle) -> Result<(), VerbsError> {
        self.inner.destroy_ah(ah)
    }
    fn attach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.inner.attach_mcast(gid)
    }
    fn detach_mcast(&mut self, gid: &Gid) -> Result<(), VerbsError> {
        self.inner.detach_mcast(gid)
    }
    fn set_qp_error(&mut self) -> Result<(), VerbsError> {
        self.inner.set_qp_error()
    }
}
