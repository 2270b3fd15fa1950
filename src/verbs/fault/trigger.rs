//! When an armed fault fires: a pure schedule over the operations the fault watches.
//!
//! Each fault watches one kind of operation (a `poll_cq` call, a completion, a posted
//! work request; see [`crate::verbs::fault::FaultKind::operation`]). The decorator calls
//! [`Schedule::on_op`] once per such operation with the current time; the schedule says
//! whether this operation is hit. It counts, draws seeded random numbers and compares
//! times; it never reads a clock itself, so tests drive it with any `now`.
//!
//! A schedule fires at most `limit` times (`None`: until the fault is cleared), then it
//! is spent and the decorator disarms it.

use std::fmt;
use std::time::{Duration, Instant};

use super::rng::SplitMix64;

/// What makes a fault fire.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Trigger {
    /// On command: from the next operation on (asynchronous events and spurious
    /// completion events are delivered at once instead).
    Now,
    /// Once `n` operations have passed: from operation `n + 1` on.
    After(u64),
    /// On every `n`-th operation (`n`, `2n`, ...); `n >= 1`.
    Every(u64),
    /// From the first operation at least this long after the fault was armed.
    At(Duration),
    /// Each operation independently with probability `p`, drawn from a generator
    /// seeded with `seed`: the same seed hits the same operations.
    Random {
        /// Probability per operation, in `(0, 1]`.
        p: f64,
        /// Seed of the generator.
        seed: u64,
    },
}

impl Trigger {
    /// How many times the fault fires when no count is given: once for the one-shot
    /// triggers (`Now`, `After`, `At`), until cleared for the recurring ones.
    pub fn default_limit(&self) -> Option<u64> {
        match self {
            Trigger::Now | Trigger::After(_) | Trigger::At(_) => Some(1),
            Trigger::Every(_) | Trigger::Random { .. } => None,
        }
    }

    /// Whether deciding needs the current time (only `At` does).
    pub fn needs_clock(&self) -> bool {
        matches!(self, Trigger::At(_))
    }
}

impl fmt::Display for Trigger {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Trigger::Now => write!(f, "now"),
            Trigger::After(n) => write!(f, "after {n}"),
            Trigger::Every(n) => write!(f, "every {n}"),
            Trigger::At(d) => write!(f, "at {} ms", d.as_millis()),
            Trigger::Random { p, seed } => write!(f, "probability {p} seed {seed}"),
        }
    }
}

/// One armed fault's schedule: its trigger, how often it may still fire, and what it
/// has counted so far.
#[derive(Clone, Debug)]
pub struct Schedule {
    trigger: Trigger,
    limit: Option<u64>,
    armed_at: Instant,
    ops: u64,
    fired: u64,
    rng: SplitMix64,
}

impl Schedule {
    /// A schedule armed at `now`, firing at most `limit` times (`None`: until cleared).
    pub fn new(trigger: Trigger, limit: Option<u64>, now: Instant) -> Self {
        let seed = match trigger {
            Trigger::Random { seed, .. } => seed,
            _ => 0,
        };
        Schedule {
            trigger,
            limit,
            armed_at: now,
            ops: 0,
            fired: 0,
            rng: SplitMix64::new(seed),
        }
    }

    /// The trigger.
    pub fn trigger(&self) -> Trigger {
        self.trigger
    }

    /// One watched operation happens at `now`: `true` if the fault hits it.
    pub fn on_op(&mut self, now: Instant) -> bool {
        if self.spent() {
            return false;
        }
        self.ops += 1;
        let hit = match self.trigger {
            Trigger::Now => true,
            Trigger::After(n) => self.ops > n,
            Trigger::Every(n) => self.ops.is_multiple_of(n.max(1)),
            Trigger::At(d) => now.saturating_duration_since(self.armed_at) >= d,
            Trigger::Random { p, .. } => self.rng.chance(p),
        };
        if hit {
            self.fired += 1;
        }
        hit
    }

    /// Whether it has fired as often as it may (the fault is then disarmed).
    pub fn spent(&self) -> bool {
        self.limit.is_some_and(|l| self.fired >= l)
    }

    /// Operations seen so far (the number of the last one).
    pub fn ops(&self) -> u64 {
        self.ops
    }

    /// Times it fired.
    pub fn fired(&self) -> u64 {
        self.fired
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hits(trigger: Trigger, limit: Option<u64>, ops: u64) -> Vec<u64> {
        let t0 = Instant::now();
        let mut s = Schedule::new(trigger, limit, t0);
        (1..=ops).filter(|_| s.on_op(t0)).collect()
    }

    #[test]
    fn now_after_every() {
        assert_eq!(hits(Trigger::Now, Some(1), 10), vec![1]);
        assert_eq!(hits(Trigger::Now, Some(3), 10), vec![1, 2, 3]);
        assert_eq!(hits(Trigger::Now, None, 4), vec![1, 2, 3, 4]);
        assert_eq!(hits(Trigger::After(5), Some(1), 10), vec![6]);
        assert_eq!(hits(Trigger::After(5), Some(2), 10), vec![6, 7]);
        assert_eq!(hits(Trigger::After(0), Some(1), 10), vec![1]);
        assert_eq!(hits(Trigger::Every(3), None, 10), vec![3, 6, 9]);
        assert_eq!(hits(Trigger::Every(3), Some(2), 100), vec![3, 6]);
        assert_eq!(hits(Trigger::Every(1), Some(2), 100), vec![1, 2]);
        // A zero period is treated as 1 (the parser refuses it anyway).
        assert_eq!(hits(Trigger::Every(0), Some(2), 10), vec![1, 2]);
    }

    #[test]
    fn spent_after_limit_and_counts() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Trigger::Every(2), Some(2), t0);
        assert!(!s.spent());
        let fired: Vec<bool> = (0..6).map(|_| s.on_op(t0)).collect();
        assert_eq!(fired, vec![false, true, false, true, false, false]);
        assert!(s.spent());
        assert_eq!(s.fired(), 2);
        // Once spent, operations are no longer counted.
        assert_eq!(s.ops(), 4);
    }

    #[test]
    fn at_a_time_offset() {
        let t0 = Instant::now();
        let mut s = Schedule::new(Trigger::At(Duration::from_millis(100)), None, t0);
        assert!(!s.on_op(t0));
        assert!(!s.on_op(t0 + Duration::from_millis(99)));
        assert!(s.on_op(t0 + Duration::from_millis(100)));
        assert!(s.on_op(t0 + Duration::from_millis(500)));
        let mut s = Schedule::new(Trigger::At(Duration::from_millis(10)), Some(1), t0);
        assert!(s.on_op(t0 + Duration::from_secs(1)));
        assert!(!s.on_op(t0 + Duration::from_secs(2)));
        assert!(s.spent());
        // A clock that steps back never panics.
        let mut s = Schedule::new(
            Trigger::At(Duration::ZERO),
            None,
            t0 + Duration::from_secs(5),
        );
        assert!(s.on_op(t0));
        assert!(Trigger::At(Duration::ZERO).needs_clock());
        assert!(!Trigger::Every(1).needs_clock());
    }

    #[test]
    fn probability_is_seeded_and_reproducible() {
        let a = hits(Trigger::Random { p: 0.1, seed: 7 }, None, 10_000);
        let b = hits(Trigger::Random { p: 0.1, seed: 7 }, None, 10_000);
        let c = hits(Trigger::Random { p: 0.1, seed: 8 }, None, 10_000);
        assert_eq!(a, b, "same seed, same operations hit");
        assert_ne!(a, c, "another seed, other operations");
        assert!((800..1200).contains(&a.len()), "about 10%: {}", a.len());
        assert_eq!(
            hits(Trigger::Random { p: 1.0, seed: 1 }, Some(3), 10),
            vec![1, 2, 3]
        );
        let first3 = hits(Trigger::Random { p: 0.1, seed: 7 }, Some(3), 10_000);
        assert_eq!(first3, a[..3].to_vec(), "a limit cuts the same sequence");
    }

    #[test]
    fn default_limits_and_display() {
        assert_eq!(Trigger::Now.default_limit(), Some(1));
        assert_eq!(Trigger::After(3).default_limit(), Some(1));
        assert_eq!(Trigger::At(Duration::ZERO).default_limit(), Some(1));
        assert_eq!(Trigger::Every(3).default_limit(), None);
        assert_eq!(Trigger::Random { p: 0.5, seed: 1 }.default_limit(), None);
        assert_eq!(Trigger::After(3).to_string(), "after 3");
        assert_eq!(
            Trigger::Random { p: 0.5, seed: 9 }.to_string(),
            "probability 0.5 seed 9"
        );
        assert_eq!(
            Trigger::At(Duration::from_millis(250)).to_string(),
            "at 250 ms"
        );
    }
}
