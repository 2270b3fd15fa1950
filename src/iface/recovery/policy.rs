//! The restart policy and its two pure parts: the backoff between failed attempts and
//! the circuit breaker over restarts.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

/// An interface that ran this long since its last restart is healthy again: the next
/// failure restarts it at once instead of backing off.
pub const HEALTHY_AFTER: Duration = Duration::from_secs(1);

/// When and how often an interface is restarted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    /// Restarts allowed within `window` before the interface is declared dead.
    pub max_restarts: u32,
    /// The circuit breaker's window.
    pub window: Duration,
    /// First backoff between consecutive failed attempts.
    pub backoff_initial: Duration,
    /// Longest backoff; also how often a dead interface whose device was lost looks
    /// for the device.
    pub backoff_max: Duration,
}

/// Exponential backoff between consecutive failed attempts.
#[derive(Debug, Clone)]
pub struct Backoff {
    initial: Duration,
    max: Duration,
    consecutive: u32,
}

impl Backoff {
    /// A backoff with this policy.
    pub fn new(p: &Policy) -> Self {
        Backoff {
            initial: p.backoff_initial,
            max: p.backoff_max,
            consecutive: 0,
        }
    }

    /// The delay before the next attempt: zero for the first, then `initial`, doubling
    /// up to `max`.
    pub fn next_delay(&mut self) -> Duration {
        let d = match self.consecutive {
            0 => Duration::ZERO,
            n => self
                .initial
                .saturating_mul(1u32 << (n - 1).min(20))
                .min(self.max),
        };
        self.consecutive = self.consecutive.saturating_add(1);
        d
    }

    /// The interface is healthy again: the next failure restarts at once.
    pub fn reset(&mut self) {
        self.consecutive = 0;
    }
}

/// The circuit breaker: more than `max` restarts within `window` trips it.
#[derive(Debug, Clone)]
pub struct Breaker {
    max: u32,
    window: Duration,
    times: VecDeque<Instant>,
}

impl Breaker {
    /// A breaker with this policy.
    pub fn new(p: &Policy) -> Self {
        Breaker {
            max: p.max_restarts,
            window: p.window,
            times: VecDeque::new(),
        }
    }

    /// Record a restart at `now`; `true` if that trips the breaker.
    pub fn record(&mut self, now: Instant) -> bool {
        while let Some(t) = self.times.front() {
            if now.saturating_duration_since(*t) >= self.window {
                self.times.pop_front();
            } else {
                break;
            }
        }
        self.times.push_back(now);
        self.times.len() as u64 > u64::from(self.max)
    }

    /// Forget every recorded restart (operator revival).
    pub fn reset(&mut self) {
        self.times.clear();
    }
}
