//! When a QP that a renewal replaced may be destroyed.
//!
//! A QP's packets can outlive its work requests: rxe hands each send to the IP stack as
//! an skb that holds a reference on the QP until the netdev frees it, and the send's
//! completion is generated when the skb is handed over, not when it is freed. An skb can
//! wait for seconds on the way out, in the neighbour layer while the peer's address is
//! re-resolved, or in a stalled TX queue. Destroying such a QP blocks until its packets
//! go (1.2 s in the lab with packets held in a `tc` queue); if they do not go in time,
//! rxe (Linux 6.1) warns (`__rxe_cleanup`) and frees the QP anyway, and the skb's
//! destructor later touches the freed QP. Seen in the lab: after such a warning, sends
//! on the device never completed again.
//!
//! So a retired QP (in the error state, in no group, never polled) is kept for a grace
//! period longer than any such wait before it is destroyed. The neighbour layer gives
//! up on an address after at most `delay_first_probe_time` (5 s) plus `ucast_solicit`
//! (3) × `retrans_time` (1 s) = 8 s and frees what it queued, so the grace is 10 s. At
//! most [`RETIRED_CAP`] wait; a further retirement makes the oldest due at once (a
//! restart storm does not pile up queues without bound: each retired QP and its CQs hold
//! about a megabyte of kernel memory at the default ring sizes).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// How long a retired QP waits before it is destroyed (see the module docs).
pub const RETIRE_GRACE: Duration = Duration::from_secs(10);

/// How many retired QPs may wait at once (see the module docs).
pub const RETIRED_CAP: usize = 16;

/// Retired objects in the order they were retired, each with its retirement time.
#[derive(Debug)]
pub struct Retirement<T> {
    items: VecDeque<(Instant, T)>,
    grace: Duration,
    cap: usize,
}

impl<T> Retirement<T> {
    /// An empty list whose items are due `grace` after retirement, or as soon as more
    /// than `cap` wait (`cap` is at least 1).
    pub fn new(grace: Duration, cap: usize) -> Self {
        let cap = cap.max(1);
        Retirement {
            items: VecDeque::with_capacity(cap + 1),
            grace,
            cap,
        }
    }

    /// Keep `item`, retired at `now`.
    pub fn retire(&mut self, now: Instant, item: T) {
        self.items.push_back((now, item));
    }

    /// The oldest item that is due at `now`, taken out of the list: retired at least
    /// `grace` ago, or beyond the cap. `None` when nothing is due.
    pub fn take_due(&mut self, now: Instant) -> Option<T> {
        let over = self.items.len() > self.cap;
        let (at, _) = self.items.front()?;
        if over || now.saturating_duration_since(*at) >= self.grace {
            self.items.pop_front().map(|(_, t)| t)
        } else {
            None
        }
    }

    /// The oldest item, due or not (a teardown takes them all this way).
    pub fn take_oldest(&mut self) -> Option<T> {
        self.items.pop_front().map(|(_, t)| t)
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.items.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nothing_is_due_before_the_grace() {
        let t0 = Instant::now();
        let mut r = Retirement::new(Duration::from_secs(10), 4);
        assert_eq!(r.take_due(t0), None::<u32>);
        r.retire(t0, 1u32);
        r.retire(t0 + Duration::from_secs(3), 2);
        assert_eq!(r.take_due(t0 + Duration::from_millis(9_999)), None);
        assert_eq!(r.len(), 2);
        // The first is due at its tenth second; the second waits for its own.
        assert_eq!(r.take_due(t0 + Duration::from_secs(10)), Some(1));
        assert_eq!(r.take_due(t0 + Duration::from_secs(10)), None);
        assert_eq!(r.take_due(t0 + Duration::from_secs(13)), Some(2));
        assert!(r.is_empty());
    }

    #[test]
    fn beyond_the_cap_the_oldest_is_due_at_once() {
        let t0 = Instant::now();
        let mut r = Retirement::new(Duration::from_secs(10), 2);
        for i in 0..3u32 {
            r.retire(t0, i);
        }
        assert_eq!(r.take_due(t0), Some(0));
        // Back at the cap: the rest wait for their grace.
        assert_eq!(r.take_due(t0), None);
        assert_eq!(r.len(), 2);
        assert_eq!(r.take_oldest(), Some(1));
        assert_eq!(r.take_oldest(), Some(2));
        assert_eq!(r.take_oldest(), None);
        assert!(r.is_empty());
    }

    #[test]
    fn a_zero_cap_still_keeps_one() {
        let t0 = Instant::now();
        let mut r = Retirement::new(Duration::from_secs(1), 0);
        r.retire(t0, 'a');
        assert_eq!(r.take_due(t0), None);
        r.retire(t0, 'b');
        assert_eq!(r.take_due(t0), Some('a'));
    }
}
