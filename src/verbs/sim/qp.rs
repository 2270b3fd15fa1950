//! A QP's side of the fabric: building its queues, its completion events (the armed
//! flag, the counted events, the waker), the fabric's counters, and the "destroy" of a
//! retired QP.

use std::collections::VecDeque;
use std::io::{self, Write};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::verbs::retire::Destroy;
use crate::verbs::{Completion, CqKind, VerbsError, WcStatus};

use super::{
    AtomicCounters, Notifier, Qp, QpState, RecvCqe, SendCqe, SendSide, SimCounters, SimDestroy,
    SimRetired, Tally, cq_index, lock,
};

impl Destroy for SimRetired {
    fn destroy(self) -> Result<(), VerbsError> {
        lock(&self.fabric.destroyed).push(SimDestroy {
            qpn: self.qpn,
            thread: std::thread::current().name().map(str::to_string),
            after: self.at.elapsed(),
        });
        drop(self.gone);
        Ok(())
    }

    fn awaited(&self) -> bool {
        self.gone.is_some()
    }
}

impl Qp {
    /// `template` with empty queues sized for its rings (its `send` and `state` are
    /// replaced).
    pub(super) fn new(template: Qp) -> Qp {
        let (recv, send) = (template.recv_slots as usize, template.send_slots as usize);
        Qp {
            send: Mutex::new(SendSide {
                held: false,
                queue: VecDeque::with_capacity(send),
                pool: Vec::new(),
            }),
            state: Mutex::new(QpState {
                error: false,
                recv_posted: VecDeque::with_capacity(recv),
                recv_cq: VecDeque::with_capacity(recv),
                send_cq: VecDeque::with_capacity(send),
                send_outstanding: 0,
                unsignaled_done: 0,
                armed: [false; 2],
                events: [0; 2],
                waker: None,
                pool: Vec::with_capacity(recv),
            }),
            ..template
        }
    }

    /// The same QP under a new number, with empty queues (for [`Endpoint::restart`]).
    pub(super) fn renumbered(&self, qpn: u32) -> Qp {
        Qp::new(Qp {
            qpn,
            device: self.device,
            qkey: self.qkey,
            max_payload: self.max_payload,
            grh_kind: self.grh_kind,
            gid: self.gid,
            ipv4: self.ipv4,
            recv_slots: self.recv_slots,
            send_slots: self.send_slots,
            send: Mutex::new(SendSide::default()),
            state: Mutex::new(QpState::default()),
        })
    }
}

impl AtomicCounters {
    pub(super) fn add(&self, t: &Tally) {
        let pairs = [
            (&self.qkey_mismatch, t.qkey_mismatch),
            (&self.no_recv_posted, t.no_recv_posted),
            (&self.oversized, t.oversized),
            (&self.unknown_dest, t.unknown_dest),
            (&self.receiver_in_error, t.receiver_in_error),
            (&self.delivered, t.delivered),
            (&self.mcast_delivered, t.mcast_delivered),
        ];
        for (c, v) in pairs {
            if v != 0 {
                c.fetch_add(v, Ordering::Relaxed);
            }
        }
    }

    pub(super) fn snapshot(&self) -> SimCounters {
        SimCounters {
            qkey_mismatch: self.qkey_mismatch.load(Ordering::Relaxed),
            no_recv_posted: self.no_recv_posted.load(Ordering::Relaxed),
            oversized: self.oversized.load(Ordering::Relaxed),
            unknown_dest: self.unknown_dest.load(Ordering::Relaxed),
            receiver_in_error: self.receiver_in_error.load(Ordering::Relaxed),
            delivered: self.delivered.load(Ordering::Relaxed),
            mcast_delivered: self.mcast_delivered.load(Ordering::Relaxed),
        }
    }
}

impl Notifier {
    pub(super) fn wake(&self) -> io::Result<()> {
        match (&self.tx).write(&[1]) {
            Ok(_) => Ok(()),
            // Full: the reader has bytes pending already, so it will wake anyway.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(()),
            Err(e) => Err(e),
        }
    }
}

pub(super) fn wake(waker: Option<Arc<Notifier>>) {
    if let Some(w) = waker
        && let Err(e) = w.wake()
    {
        tracing::debug!(error = %e, "sim: waking the completion-channel waker failed");
    }
}

impl QpState {
    /// A completion was queued on `cq`: raise its event if armed. Returns the waker to
    /// wake once the state lock is released.
    pub(super) fn completion_added(&mut self, cq: CqKind) -> Option<Arc<Notifier>> {
        let i = cq_index(cq);
        if self.armed[i] {
            self.armed[i] = false;
            self.events[i] = self.events[i].saturating_add(1);
            self.waker.clone()
        } else {
            None
        }
    }

    /// Queue a send completion; it retires itself and the unsignaled sends before it.
    pub(super) fn push_send_cqe(&mut self, wr_id: u64, status: WcStatus) {
        let retires = 1 + std::mem::take(&mut self.unsignaled_done);
        self.send_cq.push_back(SendCqe {
            wc: Completion {
                wr_id,
                status,
                ..Completion::EMPTY
            },
            retires,
        });
    }

    /// Queue a flushed receive completion.
    pub(super) fn push_recv_flush(&mut self, wr_id: u64, slot: u32) {
        self.recv_cq.push_back(RecvCqe {
            wc: Completion {
                wr_id,
                status: WcStatus::Flushed,
                ..Completion::EMPTY
            },
            slot,
            packet: None,
        });
    }
}
