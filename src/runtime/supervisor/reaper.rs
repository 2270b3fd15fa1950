//! The reaper thread (`reap-<tap>`): destroys the QPs and CQs a renewal replaced once
//! their grace is over, off the poller's and the supervisor's paths (a destroy can block
//! for a second).

use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, RecvTimeoutError, Sender, unbounded};

use crate::verbs::retire::Reaper;

/// Longest the reaper thread sleeps between looks at the retired objects when nothing
/// tells it of a new one (a retirement beyond [`crate::verbs::retire::RETIRED_CAP`] is
/// due at once and waits at most this long).
const REAP_IDLE: Duration = Duration::from_secs(1);

/// The reaper thread of one interface, started on first use.
#[derive(Default)]
pub(super) struct ReaperThread {
    /// Hands reapers to the thread (`None` until started, and once told to end).
    tx: Option<Sender<Arc<dyn Reaper>>>,
    thread: Option<JoinHandle<()>>,
}

impl ReaperThread {
    /// Give `r` to the thread, starting it if it is not running (with `nice`, the thread
    /// sets its nice level to it first thing). An error: it could not be started (the
    /// endpoint's teardown then destroys the retired objects, later than their grace).
    pub(super) fn watch(
        &mut self,
        name: &str,
        r: Arc<dyn Reaper>,
        nice: Option<i32>,
    ) -> std::io::Result<()> {
        if self.tx.is_none() {
            let (tx, rx) = unbounded();
            let iface = name.to_string();
            let t = std::thread::Builder::new()
                .name(format!("reap-{name}"))
                .spawn(move || {
                    if let Some(level) = nice {
                        crate::runtime::set_own_nice(&iface, "reaper", level);
                    }
                    reap(rx)
                })?;
            self.tx = Some(tx);
            self.thread = Some(t);
        }
        if let Some(tx) = &self.tx {
            let _ = tx.send(r);
        }
        Ok(())
    }

    /// Whether the thread was started (and not told to end).
    pub(super) fn running(&self) -> bool {
        self.tx.is_some()
    }

    /// Tell the thread to end (after a destroy in progress, if any) and wait for it;
    /// `false` if it panicked.
    pub(super) fn end(&mut self) -> bool {
        self.tx = None;
        match self.thread.take() {
            Some(t) => t.join().is_ok(),
            None => true,
        }
    }
}

/// The reaper thread: destroys the retired objects of every reaper it was given once
/// they are due; forgets a reaper once its endpoint is gone. Ends when `rx` disconnects.
fn reap(rx: Receiver<Arc<dyn Reaper>>) {
    let mut watched: Vec<Arc<dyn Reaper>> = Vec::new();
    loop {
        let now = Instant::now();
        let next = watched.iter().filter_map(|r| r.next_due()).min();
        let idle = next.map_or(REAP_IDLE, |t| {
            t.saturating_duration_since(now).min(REAP_IDLE)
        });
        match rx.recv_timeout(idle) {
            Ok(r) => {
                if !watched
                    .iter()
                    .any(|w| std::ptr::addr_eq(Arc::as_ptr(w), Arc::as_ptr(&r)))
                {
                    watched.push(r);
                }
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
        let now = Instant::now();
        for r in &watched {
            r.reap_due(now);
        }
        // Only this thread holds it: its endpoint is gone (and destroyed the rest).
        watched.retain(|r| Arc::strong_count(r) > 1);
    }
}
