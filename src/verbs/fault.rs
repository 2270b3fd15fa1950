//! A fault-injecting decorator around any [`Provider`]: inert unless a fault is armed.
//!
//! Wrap a provider with [`FaultyProvider::new`]; every endpoint it opens shares the
//! provider's [`FaultSwitch`]. Faults available here:
//! - `poll_error`: the next `poll_cq` calls return [`VerbsError::PollFailed`] with the
//!   armed return value (like a negative `ibv_poll_cq`);
//! - `async`: an asynchronous event (`DEVICE_FATAL`, `CQ_ERR`, `QP_FATAL`, device
//!   removal, port down/up) is delivered through the endpoint's async source;
//! - `hide_device`: `open` fails with [`VerbsError::NoDevice`], as after a device
//!   removal, until the device is shown again.
//!
//! The switch also counts `poll_cq` calls made after a failed poll was returned, which
//! is how tests prove the poller never retries.

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::{
    AhHandle, AsyncEvent, Completion, CqKind, Endpoint, EndpointAttrs, EndpointConfig, Gid,
    PostSendError, Provider, SendWr, VerbsError,
};

/// The shared fault switches and their counters.
#[derive(Debug, Default)]
pub struct FaultSwitch {
    poll_error: AtomicI32,
    /// Polls left to fail; `u64::MAX` means until cleared.
    poll_error_left: AtomicU64,
    polls_failed: AtomicU64,
    polls_after_failure: AtomicU64,
    hidden: AtomicBool,
    opens: AtomicU64,
    async_events: Mutex<VecDeque<AsyncEvent>>,
    /// Write ends of the async sources of the endpoints registered now.
    async_wakers: Mutex<Vec<(u64, UnixStream)>>,
    next_id: AtomicU64,
}

impl FaultSwitch {
    /// Make every `poll_cq` fail with `ret` (a negative value) until cleared.
    pub fn arm_poll_error(&self, ret: i32) {
        self.arm_poll_error_n(ret, u64::MAX);
    }

    /// Make the next `n` `poll_cq` calls fail with `ret`.
    pub fn arm_poll_error_n(&self, ret: i32, n: u64) {
        self.poll_error_left.store(n, Ordering::SeqCst);
        self.poll_error.store(ret.min(-1), Ordering::SeqCst);
    }

    /// Disarm every fault (pending async events are dropped; a hidden device is shown).
    pub fn clear(&self) {
        self.poll_error.store(0, Ordering::SeqCst);
        self.hidden.store(false, Ordering::SeqCst);
        if let Ok(mut q) = self.async_events.lock() {
            q.clear();
        }
    }

    /// Deliver `ev` through the async source of the (registered) endpoints.
    pub fn inject_async(&self, ev: AsyncEvent) {
        if let Ok(mut q) = self.async_events.lock() {
            q.push_back(ev);
        }
        if let Ok(w) = self.async_wakers.lock() {
            for (_, s) in w.iter() {
                let _ = (&*s).write(&[1]);
            }
        }
    }

    /// Make `open` fail with `NoDevice` (`true`) or work again (`false`).
    pub fn hide_device(&self, hidden: bool) {
        self.hidden.store(hidden, Ordering::SeqCst);
    }

    /// Successful opens through this switch's provider.
    pub fn opens(&self) -> u64 {
        self.opens.load(Ordering::SeqCst)
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
        if self.switch.hidden.load(Ordering::SeqCst) {
            return Err(VerbsError::NoDevice(cfg.device.clone()));
        }
        let inner = self.inner.open(cfg)?;
        self.switch.opens.fetch_add(1, Ordering::SeqCst);
        Ok(Box::new(FaultyEndpoint {
            inner,
            switch: self.switch.clone(),
            failed: false,
            async_rx: None,
            id: self.switch.next_id.fetch_add(1, Ordering::SeqCst),
        }))
    }
}

struct FaultyEndpoint {
    inner: Box<dyn Endpoint>,
    switch: Arc<FaultSwitch>,
    failed: bool,
    async_rx: Option<UnixStream>,
    id: u64,
}

impl FaultyEndpoint {
    fn drop_waker(&mut self) {
        if let Ok(mut w) = self.switch.async_wakers.lock() {
            w.retain(|(id, _)| *id != self.id);
        }
    }
}

impl Drop for FaultyEndpoint {
    fn drop(&mut self) {
        self.drop_waker();
    }
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
        if ret < 0
            && self
                .switch
                .poll_error_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| match n {
                    0 => None,
                    u64::MAX => Some(u64::MAX),
                    n => Some(n - 1),
                })
                .is_ok()
        {
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
        self.inner.register(registry, cq_token, async_token)?;
        let (rx, tx) = UnixStream::pair()?;
        rx.set_nonblocking(true)?;
        tx.set_nonblocking(true)?;
        registry.register(
            &mut mio::unix::SourceFd(&rx.as_raw_fd()),
            async_token,
            mio::Interest::READABLE,
        )?;
        let pending = self
            .switch
            .async_events
            .lock()
            .map(|q| !q.is_empty())
            .unwrap_or(false);
        if pending {
            let _ = (&tx).write(&[1]);
        }
        self.drop_waker();
        if let Ok(mut w) = self.switch.async_wakers.lock() {
            w.push((self.id, tx));
        }
        self.async_rx = Some(rx);
        Ok(())
    }
    fn deregister(&mut self, registry: &mio::Registry) -> io::Result<()> {
        if let Some(rx) = self.async_rx.take() {
            let _ = registry.deregister(&mut mio::unix::SourceFd(&rx.as_raw_fd()));
        }
        self.drop_waker();
        self.inner.deregister(registry)
    }
    fn take_cq_events(&mut self) -> Result<(u32, u32), VerbsError> {
        self.inner.take_cq_events()
    }
    fn next_async_event(&mut self) -> Result<Option<AsyncEvent>, VerbsError> {
        if let Some(rx) = &self.async_rx {
            let mut b = [0u8; 64];
            while matches!((&*rx).read(&mut b), Ok(n) if n > 0) {}
        }
        let injected = self
            .switch
            .async_events
            .lock()
            .ok()
            .and_then(|mut q| q.pop_front());
        match injected {
            Some(ev) => Ok(Some(ev)),
            None => self.inner.next_async_event(),
        }
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
