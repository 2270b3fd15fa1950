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
//!
//! The CQs of a QP destroyed at once (after a failed poll the QP itself cannot wait, see
//! [`crate::verbs::Endpoint::restart_destroying_old`]) need no grace: nothing completes
//! into them once their QP is gone. They wait [`CQ_GRACE`] only, so that their destroys
//! (1-11 ms under load in the lab) fall after the restart rather than inside it.
//!
//! A destroy can block (1.2 s measured, above), so it never runs on the poller thread: an
//! endpoint keeps its retired objects in a [`RetireQueue`], which it hands out as a
//! [`Reaper`] (see [`crate::verbs::Endpoint::reaper`]); the supervisor's reaper thread
//! destroys what is due. The endpoint's own teardown destroys what is left, after any
//! destroy in progress on the reaper thread (so nothing outlives the context and PD it
//! depends on). A close waits out the remaining grace first, bounded
//! ([`wait_out_grace`]); a device loss cannot wait.

use std::collections::VecDeque;
use std::sync::mpsc::{Receiver, RecvTimeoutError, SyncSender, sync_channel};
use std::sync::{Mutex, MutexGuard, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::VerbsError;

/// How long a retired QP waits before it is destroyed (see the module docs).
pub const RETIRE_GRACE: Duration = Duration::from_secs(10);

/// How many retired QPs may wait at once (see the module docs).
pub const RETIRED_CAP: usize = 16;

/// How long the CQs of a QP that was destroyed at once wait (see the module docs).
pub const CQ_GRACE: Duration = Duration::from_secs(1);

/// Retired objects in the order they are due, each with its retirement time and when it
/// is due.
#[derive(Debug)]
pub struct Retirement<T> {
    items: VecDeque<(Instant, Instant, T)>,
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

    /// Keep `item`, retired at `now`, due `grace` later.
    pub fn retire(&mut self, now: Instant, item: T) {
        self.retire_for(now, self.grace, item);
    }

    /// Keep `item`, retired at `now`, due `wait` later (instead of the list's grace).
    pub fn retire_for(&mut self, now: Instant, wait: Duration, item: T) {
        let due = now + wait;
        // In due order: behind every item due no later.
        let at = self.items.partition_point(|(_, d, _)| *d <= due);
        self.items.insert(at, (now, due, item));
    }

    /// The item due first, taken out of the list if it is due at `now`, or if more than
    /// the cap wait. `None` when nothing is due.
    pub fn take_due(&mut self, now: Instant) -> Option<T> {
        let over = self.items.len() > self.cap;
        let (_, due, _) = self.items.front()?;
        if over || now >= *due {
            self.items.pop_front().map(|(_, _, t)| t)
        } else {
            None
        }
    }

    /// The first item that satisfies `f`, due or not.
    pub fn take_first(&mut self, f: impl Fn(&T) -> bool) -> Option<T> {
        let at = self.items.iter().position(|(_, _, t)| f(t))?;
        self.items.remove(at).map(|(_, _, t)| t)
    }

    /// The item due first, due or not (a teardown takes them all this way).
    pub fn take_oldest(&mut self) -> Option<T> {
        self.items.pop_front().map(|(_, _, t)| t)
    }

    /// When the item due first is due, or its retirement time (that is, now) when more
    /// than the cap wait. `None` when none waits.
    pub fn next_due(&self) -> Option<Instant> {
        let (at, due, _) = self.items.front()?;
        if self.items.len() > self.cap {
            Some(*at)
        } else {
            Some(*due)
        }
    }

    /// Whether any waiting item satisfies `f`.
    pub fn any(&self, f: impl Fn(&T) -> bool) -> bool {
        self.items.iter().any(|(_, _, t)| f(t))
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

/// What a renewal does with the QP it replaces, one per renewal of
/// [`crate::verbs::Endpoint`] (`restart`, `restart_destroying_old`,
/// `restart_deferring_old`); the providers share it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OldQp {
    /// Retired with its CQs for the grace.
    Retire,
    /// Destroyed before the renewal returns; its CQs retired for [`CQ_GRACE`].
    Destroy,
    /// Retired with its CQs, for the caller to destroy when it chooses
    /// ([`Reaper::reap_awaited`]; due [`CQ_GRACE`] later for the reaper), with a [`Gone`].
    Defer,
}

/// A retired object: destroying it may block.
pub trait Destroy: Send {
    /// Destroy it. A failure is logged and counted by the provider, and returned.
    fn destroy(self) -> Result<(), VerbsError>;

    /// Whether someone waits for it to go (it holds a [`GoneSignal`]):
    /// [`Reaper::reap_awaited`] destroys it before it is due.
    fn awaited(&self) -> bool {
        false
    }
}

/// Destroys, on whatever thread calls it, what an endpoint's endpoint_restarts retired, once due.
pub trait Reaper: Send + Sync {
    /// Destroy every retired object that is due at `now`; how many were destroyed
    /// (failures included: they are logged and counted by the provider).
    fn reap_due(&self, now: Instant) -> usize;

    /// When the next retired object is due; `None` when none waits or the endpoint is
    /// closed.
    fn next_due(&self) -> Option<Instant>;

    /// Destroy, due or not, every retired object someone waits for ([`Destroy::awaited`]):
    /// the caller that holds its [`Gone`] does it on its own thread when it chooses, instead
    /// of waiting for the reaper's. How many were destroyed.
    fn reap_awaited(&self) -> usize;
}

/// Retired objects shared between their endpoint (which retires them and, at its
/// teardown, destroys what is left) and a [`Reaper`] on another thread.
///
/// Locks: `list` only for moments (never across a destroy), so a renewal that retires
/// never waits for a destroy; `open` is read-held by the reaper across each destroy and
/// write-held by [`RetireQueue::close`], so the endpoint's teardown waits for a destroy
/// in progress and nothing is destroyed after it.
#[derive(Debug)]
pub struct RetireQueue<T> {
    open: RwLock<bool>,
    list: Mutex<Retirement<T>>,
}

impl<T: Destroy> RetireQueue<T> {
    /// An empty queue (see [`Retirement::new`]).
    pub fn new(grace: Duration, cap: usize) -> Self {
        RetireQueue {
            open: RwLock::new(true),
            list: Mutex::new(Retirement::new(grace, cap)),
        }
    }

    fn list(&self) -> MutexGuard<'_, Retirement<T>> {
        self.list.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Keep `item`, retired at `now`; after [`RetireQueue::close`] it is destroyed at once.
    pub fn retire(&self, now: Instant, item: T) -> Result<(), VerbsError> {
        self.retire_with(now, None, item)
    }

    /// [`RetireQueue::retire`], due `wait` after `now` instead of the grace.
    pub fn retire_for(&self, now: Instant, wait: Duration, item: T) -> Result<(), VerbsError> {
        self.retire_with(now, Some(wait), item)
    }

    fn retire_with(&self, now: Instant, wait: Option<Duration>, item: T) -> Result<(), VerbsError> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if *open {
            let mut list = self.list();
            match wait {
                Some(w) => list.retire_for(now, w, item),
                None => list.retire(now, item),
            }
            Ok(())
        } else {
            drop(open);
            item.destroy()
        }
    }

    /// Whether a waiting item satisfies `f` (for matching an event to its object).
    pub fn any(&self, f: impl Fn(&T) -> bool) -> bool {
        self.list().any(f)
    }

    /// How many wait.
    pub fn len(&self) -> usize {
        self.list().len()
    }

    /// Whether none wait.
    pub fn is_empty(&self) -> bool {
        self.list().is_empty()
    }

    /// Destroy everything that waits, due or not, after any destroy in progress; from now
    /// on nothing is reaped and a retirement destroys at once. The first failure is
    /// returned.
    pub fn close(&self) -> Result<(), VerbsError> {
        let mut open = self.open.write().unwrap_or_else(PoisonError::into_inner);
        *open = false;
        let mut first = None;
        loop {
            let next = self.list().take_oldest();
            let Some(item) = next else { break };
            if let Err(e) = item.destroy() {
                first.get_or_insert(e);
            }
        }
        first.map_or(Ok(()), Err)
    }

    /// Destroy what `take` takes out of the list, one item at a time, while the queue is
    /// open (a teardown in progress waits; after it nothing is taken); how many.
    fn reap_with(&self, take: impl Fn(&mut Retirement<T>) -> Option<T>) -> usize {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return 0;
        }
        let mut n = 0;
        loop {
            // The list's lock is released before the destroy.
            let next = take(&mut self.list());
            let Some(item) = next else { break };
            // Logged and counted by the provider.
            let _ = item.destroy();
            n += 1;
        }
        drop(open);
        n
    }
}

impl<T: Destroy> Reaper for RetireQueue<T> {
    fn reap_due(&self, now: Instant) -> usize {
        self.reap_with(|list| list.take_due(now))
    }

    fn reap_awaited(&self) -> usize {
        self.reap_with(|list| list.take_first(T::awaited))
    }

    fn next_due(&self) -> Option<Instant> {
        let open = self.open.read().unwrap_or_else(PoisonError::into_inner);
        if !*open {
            return None;
        }
        self.list().next_due()
    }
}

/// The caller's side of [`gone_pair`]: says when a retired object is gone (destroyed,
/// or forgotten after a failed destroy: either way the device no longer uses it).
#[derive(Debug)]
pub struct Gone(Receiver<()>);

/// The object's side of [`gone_pair`]: kept inside the retired object and dropped the
/// moment it is gone.
#[derive(Debug)]
pub struct GoneSignal {
    _tx: SyncSender<()>,
}

/// A pair that tells the holder of the [`Gone`] when the object holding the
/// [`GoneSignal`] has dropped it.
pub fn gone_pair() -> (GoneSignal, Gone) {
    let (tx, rx) = sync_channel(0);
    (GoneSignal { _tx: tx }, Gone(rx))
}

impl Gone {
    /// One that is gone already (for a provider that destroyed the object at once).
    pub fn already() -> Gone {
        gone_pair().1
    }

    /// Wait at most `bound` for the object to be gone; whether it is.
    pub fn wait(&self, bound: Duration) -> bool {
        matches!(
            self.0.recv_timeout(bound),
            Err(RecvTimeoutError::Disconnected)
        )
    }
}

/// Wait for the retired objects of `reaper` to come due and destroy each as it does, for
/// at most `cap`: a close keeps the grace where it can, and is bounded. Returns whether
/// none is left waiting (what is left is destroyed by the endpoint's teardown).
pub fn wait_out_grace(reaper: &dyn Reaper, cap: Duration) -> bool {
    let start = Instant::now();
    let end = start + cap;
    loop {
        let now = Instant::now();
        let Some(due) = reaper.next_due() else {
            return true;
        };
        if due <= now {
            reaper.reap_due(now);
            continue;
        }
        if now >= end {
            return false;
        }
        std::thread::sleep(due.min(end).saturating_duration_since(now));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// Each destroy: the item's number and the thread it ran on.
    type Log = Arc<Mutex<Vec<(u32, Option<String>)>>>;

    /// Records the thread each destroy ran on.
    struct Item(u32, Log);

    impl Destroy for Item {
        fn destroy(self) -> Result<(), VerbsError> {
            let name = std::thread::current().name().map(str::to_string);
            self.1.lock().unwrap().push((self.0, name));
            Ok(())
        }
    }

    #[test]
    fn the_queue_reaps_what_is_due_and_its_close_takes_the_rest() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let q = Arc::new(RetireQueue::new(Duration::from_millis(50), 4));
        let t0 = Instant::now();
        q.retire(t0, Item(1, log.clone())).unwrap();
        q.retire(t0 + Duration::from_millis(30), Item(2, log.clone()))
            .unwrap();
        assert_eq!(q.next_due(), Some(t0 + Duration::from_millis(50)));
        assert_eq!(q.reap_due(t0 + Duration::from_millis(49)), 0);
        let r: Arc<dyn Reaper> = q.clone();
        let reaped = std::thread::Builder::new()
            .name("reaper".into())
            .spawn(move || r.reap_due(t0 + Duration::from_millis(60)))
            .unwrap()
            .join()
            .unwrap();
        assert_eq!(reaped, 1);
        assert!(q.any(|i| i.0 == 2) && !q.any(|i| i.0 == 1));
        q.close().unwrap();
        assert!(q.is_empty());
        assert_eq!(q.next_due(), None);
        // Closed: nothing is reaped, a late retirement is destroyed at once.
        q.retire(t0, Item(3, log.clone())).unwrap();
        assert_eq!(q.reap_due(t0 + Duration::from_secs(99)), 0);
        let log = log.lock().unwrap();
        let here = std::thread::current().name().map(str::to_string);
        assert_eq!(
            *log,
            vec![(1, Some("reaper".into())), (2, here.clone()), (3, here)]
        );
    }

    #[test]
    fn waiting_out_the_grace_destroys_each_when_due_and_is_bounded() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let q = RetireQueue::new(Duration::from_millis(100), 4);
        let t0 = Instant::now();
        q.retire(t0, Item(1, log.clone())).unwrap();
        assert!(wait_out_grace(&q, Duration::from_secs(5)));
        assert!(
            t0.elapsed() >= Duration::from_millis(100),
            "the grace was kept"
        );
        assert_eq!(log.lock().unwrap().len(), 1);
        // A grace longer than the cap: the wait ends at the cap, the item still waits.
        let q = RetireQueue::new(Duration::from_secs(60), 4);
        q.retire(Instant::now(), Item(2, log.clone())).unwrap();
        let start = Instant::now();
        assert!(!wait_out_grace(&q, Duration::from_millis(100)));
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(100) && took < Duration::from_secs(2),
            "{took:?}"
        );
        assert_eq!(q.len(), 1);
    }

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
    fn an_item_retired_for_less_than_the_grace_is_due_first_in_its_own_time() {
        let t0 = Instant::now();
        let mut r = Retirement::new(Duration::from_secs(10), 4);
        r.retire(t0, 1u32);
        // Retired later, due sooner: it goes ahead of the first, and the first keeps its
        // grace.
        r.retire_for(t0 + Duration::from_secs(2), Duration::from_secs(1), 2);
        assert_eq!(r.next_due(), Some(t0 + Duration::from_secs(3)));
        assert_eq!(r.take_due(t0 + Duration::from_millis(2_999)), None);
        assert_eq!(r.take_due(t0 + Duration::from_secs(3)), Some(2));
        assert_eq!(r.take_due(t0 + Duration::from_secs(3)), None);
        assert_eq!(r.next_due(), Some(t0 + Duration::from_secs(10)));
        assert_eq!(r.take_due(t0 + Duration::from_secs(10)), Some(1));
        // Equal due times keep their order of retirement.
        r.retire_for(t0, Duration::from_secs(1), 3);
        r.retire_for(t0, Duration::from_secs(1), 4);
        assert_eq!(r.take_oldest(), Some(3));
        assert_eq!(r.take_oldest(), Some(4));
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

    #[test]
    fn gone_says_when_the_signal_is_dropped_and_not_before() {
        let (signal, gone) = gone_pair();
        assert!(
            !gone.wait(Duration::from_millis(20)),
            "gone while still held"
        );
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(30));
            drop(signal);
        });
        assert!(gone.wait(Duration::from_secs(10)));
        t.join().unwrap();
        assert!(Gone::already().wait(Duration::ZERO));
    }

    /// Destroyed on `reap_awaited` when it holds a signal.
    struct Awaited(u32, Log, Option<GoneSignal>);

    impl Destroy for Awaited {
        fn destroy(self) -> Result<(), VerbsError> {
            self.1.lock().unwrap().push((self.0, None));
            Ok(())
        }

        fn awaited(&self) -> bool {
            self.2.is_some()
        }
    }

    #[test]
    fn reap_awaited_takes_only_what_is_waited_for_and_not_yet_due() {
        let log: Log = Arc::new(Mutex::new(Vec::new()));
        let q = RetireQueue::new(Duration::from_secs(60), 4);
        let t0 = Instant::now();
        let (signal, gone) = gone_pair();
        q.retire(t0, Awaited(1, log.clone(), None)).unwrap();
        q.retire(t0, Awaited(2, log.clone(), Some(signal))).unwrap();
        assert!(!gone.wait(Duration::ZERO));
        assert_eq!(q.reap_due(t0), 0, "nothing is due");
        assert_eq!(q.reap_awaited(), 1);
        assert!(gone.wait(Duration::ZERO), "its signal went with it");
        assert_eq!(
            log.lock().unwrap().iter().map(|e| e.0).collect::<Vec<_>>(),
            [2]
        );
        assert_eq!(q.len(), 1, "the other waits for its grace");
        assert_eq!(q.reap_awaited(), 0);
        q.close().unwrap();
        assert_eq!(log.lock().unwrap().len(), 2);
    }
}
