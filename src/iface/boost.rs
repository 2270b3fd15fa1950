//! When the poller raises its own priority: while received frames queue up behind it
//! (`rx-boost-nice`), without any I/O.
//!
//! Each frame the poller writes to the TAP wakes the application it is for, and on a busy
//! CPU that application then preempts the poller as the write returns: two context
//! switches a frame, where the kernel's own receive path (a softirq) delivers its whole
//! budget before the woken task runs. A poller a few nice levels above the application
//! is not preempted by the wake-up (its virtual runtime stays behind), so it delivers
//! what it polled and the application reads it in one run. On a sender, the same level
//! makes each frame the application writes to the TAP wake the poller ahead of it, and
//! in a ping-pong the answer then waits for the poller to sleep: so the level is raised
//! only while a poll finds more than one received frame (a backlog: the receive load is
//! ahead of the poller), and dropped once none has for [`RX_BOOST_HOLD`].
//!
//! [`RxBoost`] decides; the shell (`poller`) sets the thread's nice level.

use std::time::{Duration, Instant};

/// How long the raised level outlives the last poll that found a backlog.
pub const RX_BOOST_HOLD: Duration = Duration::from_millis(100);

/// Received frames in one poll that make a backlog.
pub const RX_BOOST_BACKLOG: usize = 2;

/// What the shell does to the thread's level.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// To the raised level.
    Raise,
    /// Back to the thread's own.
    Lower,
}

/// The decision. See the module's documentation.
#[derive(Debug)]
pub struct RxBoost {
    hold: Duration,
    /// Raised until then (`None`: at the thread's own level).
    until: Option<Instant>,
}

impl RxBoost {
    /// At the thread's own level; raised levels outlive their backlog by `hold`.
    pub fn new(hold: Duration) -> RxBoost {
        RxBoost { hold, until: None }
    }

    /// Whether the level is raised now.
    pub fn raised(&self) -> bool {
        self.until.is_some()
    }

    /// A poll delivered `rx` received frames at `now`.
    pub fn polled(&mut self, rx: usize, now: Instant) -> Option<Change> {
        if rx >= RX_BOOST_BACKLOG {
            let was = self.until.replace(now + self.hold);
            return was.is_none().then_some(Change::Raise);
        }
        self.expire(now)
    }

    /// The time passes (a wake-up, before anything is polled): a raised level whose hold
    /// is over comes down, so that a frame after a quiet spell is delivered at the
    /// thread's own level.
    pub fn expire(&mut self, now: Instant) -> Option<Change> {
        match self.until {
            Some(t) if now >= t => {
                self.until = None;
                Some(Change::Lower)
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn single_frames_never_raise_the_level() {
        let mut b = RxBoost::new(100 * MS);
        let t0 = Instant::now();
        for i in 0..1000 {
            assert_eq!(b.polled(i % 2, t0 + i as u32 * MS), None);
        }
        assert!(!b.raised());
    }

    #[test]
    fn a_backlog_raises_once_and_the_level_holds_while_backlogs_come() {
        let mut b = RxBoost::new(100 * MS);
        let t0 = Instant::now();
        assert_eq!(b.polled(2, t0), Some(Change::Raise));
        assert!(b.raised());
        // Backlogs and single frames within the hold: no change, the hold renewed.
        for i in 1..50u32 {
            let rx = if i % 5 == 0 { 7 } else { 1 };
            assert_eq!(b.polled(rx, t0 + i * 20 * MS), None, "poll {i}");
        }
        assert!(b.raised());
        // The last backlog was at 45 * 20 ms; the hold ends 100 ms later.
        let last = t0 + 45 * 20 * MS;
        assert_eq!(b.polled(1, last + 99 * MS), None);
        assert_eq!(b.polled(1, last + 100 * MS), Some(Change::Lower));
        assert!(!b.raised());
        assert_eq!(b.polled(0, last + 200 * MS), None);
        assert_eq!(b.polled(3, last + 201 * MS), Some(Change::Raise));
    }

    #[test]
    fn a_wake_up_after_the_hold_lowers_before_anything_is_polled() {
        let mut b = RxBoost::new(100 * MS);
        let t0 = Instant::now();
        assert_eq!(b.polled(64, t0), Some(Change::Raise));
        assert_eq!(b.expire(t0 + 50 * MS), None);
        assert!(b.raised());
        assert_eq!(b.expire(t0 + 100 * MS), Some(Change::Lower));
        assert_eq!(b.expire(t0 + 300 * MS), None);
    }
}
