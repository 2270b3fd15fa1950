//! The poll loop's decisions (the NAPI analogue), without any I/O.
//!
//! [`Napi`] decides when to poll, when to yield and when to re-arm:
//! - a completion event schedules a poll;
//! - a poll handles at most `budget` receive completions (and reaps send completions);
//! - at budget it yields: the shell gives the TX side its turn, then polls again without
//!   arming;
//! - below budget it re-arms both CQs and polls once more, because a completion that
//!   arrived between the last poll and the arm raises no event (userspace verbs has no
//!   `IB_CQ_REPORT_MISSED_EVENTS`); completions found then keep the poller scheduled.
//!
//! - with a busy-poll window (`busy-poll-us`, off by default), a poll that finds nothing
//!   within the window after the last work does not arm: the shell polls again without
//!   sleeping (the kernel's NAPI busy poll). Work is a completion, or a frame read from
//!   the TAP ([`Napi::on_tx_work`]), which also starts polling when the machine was idle:
//!   the reply to what was just sent is polled for, not waited for. Once the window has
//!   passed without work the machine arms and rechecks as above.
//!
//! [`TxGate`] decides when the TAP is read: while it may have frames and the send ring
//! has room; a full ring stops reading (backpressure) until send completions free slots.
//!
//! The shell (`poller`) feeds events and poll results in and does what comes out.

use std::time::{Duration, Instant};

/// Where the poller is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// CQs armed, waiting for a completion event.
    Idle,
    /// A poll is due.
    Scheduled,
    /// CQs were just armed; one more poll closes the missed-event race.
    Rechecking,
}

/// What the shell does after a poll.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Action {
    /// Let TX run, then poll again (no arming).
    Yield,
    /// Arm both CQs, then poll once more and report it.
    ArmAndRecheck,
    /// Nothing pending: wait for an event.
    Sleep,
    /// Inside the busy-poll window: poll again without arming and without sleeping.
    BusyPoll,
}

/// Counters the machine keeps.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NapiCounters {
    /// Polls reported.
    pub polls: u64,
    /// Polls that used the whole budget.
    pub budget_exhausted: u64,
    /// Times the CQs were armed.
    pub rearms: u64,
    /// Polls right after arming that found completions.
    pub caught_after_rearm: u64,
    /// Events after which the first poll found nothing.
    pub spurious_events: u64,
    /// Completion events fed in.
    pub events: u64,
    /// Polls that found nothing and, inside the busy-poll window, kept polling instead
    /// of arming.
    pub busy_polls: u64,
}

/// The poll state machine.
#[derive(Debug)]
pub struct Napi {
    state: State,
    budget: usize,
    after_event: bool,
    counters: NapiCounters,
    /// Keep polling this long after the last work (zero: never).
    busy_poll: Duration,
    /// When work was last seen (completions, or frames read from the TAP).
    last_work: Option<Instant>,
}

impl Napi {
    /// A machine with this receive budget. It starts scheduled: the first poll runs before
    /// anything is armed, and arming follows from it.
    pub fn new(budget: usize) -> Self {
        Napi {
            state: State::Scheduled,
            budget: budget.max(1),
            after_event: false,
            counters: NapiCounters::default(),
            busy_poll: Duration::ZERO,
            last_work: None,
        }
    }

    /// The same machine, polling without arming for `window` after the last work.
    pub fn with_busy_poll(mut self, window: Duration) -> Self {
        self.busy_poll = window;
        self
    }

    /// The busy-poll window (zero: off).
    pub fn busy_poll(&self) -> Duration {
        self.busy_poll
    }

    /// Frames were read from the TAP and posted at `now`. With a busy-poll window this is
    /// work: the window restarts, and an idle machine polls again (for the completion of
    /// the send and the reply it may bring) instead of waiting for an event. Without a
    /// window nothing changes.
    pub fn on_tx_work(&mut self, now: Instant) {
        if self.busy_poll.is_zero() {
            return;
        }
        self.last_work = Some(now);
        if self.state == State::Idle {
            self.state = State::Scheduled;
        }
    }

    /// Whether `now` is inside the busy-poll window.
    fn busy(&self, now: Instant) -> bool {
        !self.busy_poll.is_zero()
            && self
                .last_work
                .is_some_and(|t| now.saturating_duration_since(t) < self.busy_poll)
    }

    /// The receive budget of one poll.
    pub fn budget(&self) -> usize {
        self.budget
    }

    /// Current state.
    pub fn state(&self) -> State {
        self.state
    }

    /// Whether a poll is due now.
    pub fn poll_due(&self) -> bool {
        self.state != State::Idle
    }

    /// Counters so far.
    pub fn counters(&self) -> NapiCounters {
        self.counters
    }

    /// `n` completion events were read from the channel.
    pub fn on_events(&mut self, n: u32) {
        if n == 0 {
            return;
        }
        self.counters.events += u64::from(n);
        if self.state == State::Idle {
            self.state = State::Scheduled;
            self.after_event = true;
        }
    }

    /// A failed poll is to be polled again at once (the `retry` poll-failure policy): a
    /// poll stays due, whatever the last one found.
    pub fn retry(&mut self) {
        self.state = State::Scheduled;
        self.after_event = false;
    }

    /// A poll at `now` handled `rx` receive and `tx` send completions. Returns what to do
    /// next.
    pub fn polled(&mut self, rx: usize, tx: usize, now: Instant) -> Action {
        self.counters.polls += 1;
        if rx + tx > 0 && !self.busy_poll.is_zero() {
            self.last_work = Some(now);
        }
        if self.after_event {
            self.after_event = false;
            if rx + tx == 0 {
                self.counters.spurious_events += 1;
            }
        }
        if rx >= self.budget {
            self.counters.budget_exhausted += 1;
            if self.state == State::Rechecking {
                self.counters.caught_after_rearm += 1;
            }
            self.state = State::Scheduled;
            return Action::Yield;
        }
        match self.state {
            State::Rechecking => {
                if rx + tx > 0 {
                    self.counters.caught_after_rearm += 1;
                    self.state = State::Scheduled;
                    Action::Yield
                } else {
                    self.state = State::Idle;
                    Action::Sleep
                }
            }
            State::Scheduled | State::Idle if self.busy(now) => {
                // Nothing now, but work was recent: poll again rather than arm and sleep.
                if rx + tx == 0 {
                    self.counters.busy_polls += 1;
                }
                self.state = State::Scheduled;
                Action::BusyPoll
            }
            State::Scheduled | State::Idle => {
                self.counters.rearms += 1;
                self.state = State::Rechecking;
                Action::ArmAndRecheck
            }
        }
    }
}

/// When to read the TAP.
#[derive(Debug, Default)]
pub struct TxGate {
    readable: bool,
    stopped: bool,
    backpressure: u64,
}

impl TxGate {
    /// A gate that assumes the TAP may already hold frames.
    pub fn new() -> Self {
        TxGate {
            readable: true,
            stopped: false,
            backpressure: 0,
        }
    }

    /// The TAP fd became readable.
    pub fn on_readable(&mut self) {
        self.readable = true;
    }

    /// A read returned `WouldBlock`: the TAP is drained.
    pub fn on_drained(&mut self) {
        self.readable = false;
    }

    /// Whether to read a frame now, given free send slots. Entering backpressure (frames
    /// waiting, ring full) is counted once per episode.
    pub fn may_read(&mut self, free_send_slots: usize) -> bool {
        if !self.readable {
            return false;
        }
        if free_send_slots == 0 {
            if !self.stopped {
                self.stopped = true;
                self.backpressure += 1;
            }
            return false;
        }
        self.stopped = false;
        true
    }

    /// Whether the TAP may still hold frames (the shell must not sleep on the TAP fd then
    /// unless the ring is full).
    pub fn pending(&self) -> bool {
        self.readable
    }

    /// Whether reading is stopped because the send ring is full.
    pub fn stopped(&self) -> bool {
        self.stopped
    }

    /// Backpressure episodes so far.
    pub fn backpressure(&self) -> u64 {
        self.backpressure
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Machines without a busy-poll window do not look at the clock.
    fn now() -> Instant {
        Instant::now()
    }

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn busy_poll_keeps_polling_inside_the_window_then_arms() {
        let t = Instant::now();
        let mut n = Napi::new(4).with_busy_poll(10 * MS);
        // No work seen yet: arms as without a window.
        assert_eq!(n.polled(0, 0, t), Action::ArmAndRecheck);
        assert_eq!(n.polled(0, 0, t), Action::Sleep);
        n.on_events(1);
        assert_eq!(
            n.polled(2, 0, t),
            Action::BusyPoll,
            "work: poll again, unarmed"
        );
        assert_eq!(n.state(), State::Scheduled);
        assert_eq!(n.polled(0, 0, t + 5 * MS), Action::BusyPoll);
        assert_eq!(
            n.polled(0, 1, t + 9 * MS),
            Action::BusyPoll,
            "a send completion is work"
        );
        assert_eq!(n.polled(0, 0, t + 18 * MS), Action::BusyPoll);
        assert_eq!(
            n.polled(0, 0, t + 19 * MS),
            Action::ArmAndRecheck,
            "window over"
        );
        assert_eq!(n.polled(0, 0, t + 19 * MS), Action::Sleep);
        let c = n.counters();
        assert_eq!(c.busy_polls, 2, "the empty polls inside the window");
        assert_eq!(c.rearms, 2);
    }

    #[test]
    fn tx_work_wakes_an_idle_machine_only_with_a_window() {
        let t = Instant::now();
        let mut plain = Napi::new(4);
        plain.polled(0, 0, t);
        plain.polled(0, 0, t);
        plain.on_tx_work(t);
        assert!(
            !plain.poll_due(),
            "without a window a send does not schedule a poll"
        );

        let mut n = Napi::new(4).with_busy_poll(MS);
        n.polled(0, 0, t);
        n.polled(0, 0, t);
        assert_eq!(n.state(), State::Idle);
        n.on_tx_work(t);
        assert!(
            n.poll_due(),
            "polls for the reply instead of waiting for its event"
        );
        assert_eq!(n.polled(0, 0, t), Action::BusyPoll);
        assert_eq!(n.polled(0, 0, t + 2 * MS), Action::ArmAndRecheck);
    }

    #[test]
    fn busy_poll_still_yields_at_budget() {
        let t = Instant::now();
        let mut n = Napi::new(4).with_busy_poll(MS);
        assert_eq!(n.polled(4, 0, t), Action::Yield);
        assert_eq!(n.counters().budget_exhausted, 1);
        assert_eq!(n.polled(3, 0, t), Action::BusyPoll);
    }

    #[test]
    fn below_budget_arms_then_rechecks_then_sleeps() {
        let mut n = Napi::new(4);
        assert!(n.poll_due());
        assert_eq!(n.polled(2, 0, now()), Action::ArmAndRecheck);
        assert_eq!(n.state(), State::Rechecking);
        assert_eq!(n.polled(0, 0, now()), Action::Sleep);
        assert!(!n.poll_due());
        let c = n.counters();
        assert_eq!((c.polls, c.rearms, c.caught_after_rearm), (2, 1, 0));
    }

    #[test]
    fn at_budget_yields_without_arming() {
        let mut n = Napi::new(4);
        assert_eq!(n.polled(4, 0, now()), Action::Yield);
        assert_eq!(n.polled(4, 3, now()), Action::Yield);
        assert_eq!(n.counters().budget_exhausted, 2);
        assert_eq!(n.counters().rearms, 0);
        assert_eq!(n.polled(1, 0, now()), Action::ArmAndRecheck);
    }

    #[test]
    fn race_after_arm_is_caught() {
        let mut n = Napi::new(4);
        assert_eq!(n.polled(0, 0, now()), Action::ArmAndRecheck);
        // A completion slipped in before the arm: no event will come for it.
        assert_eq!(n.polled(1, 0, now()), Action::Yield);
        assert_eq!(n.counters().caught_after_rearm, 1);
        assert!(n.poll_due());
        assert_eq!(n.polled(0, 0, now()), Action::ArmAndRecheck);
        assert_eq!(n.polled(0, 0, now()), Action::Sleep);
    }

    #[test]
    fn events_schedule_only_when_idle_and_spurious_counted() {
        let mut n = Napi::new(4);
        n.on_events(1); // while scheduled: nothing changes
        assert_eq!(n.state(), State::Scheduled);
        n.polled(0, 0, now());
        n.polled(0, 0, now());
        assert_eq!(n.state(), State::Idle);
        n.on_events(2);
        assert_eq!(n.state(), State::Scheduled);
        assert_eq!(n.polled(0, 0, now()), Action::ArmAndRecheck);
        assert_eq!(n.counters().spurious_events, 1);
        assert_eq!(n.counters().events, 3);
        n.on_events(0);
        assert_eq!(n.counters().events, 3);
    }

    #[test]
    fn tx_gate_backpressure() {
        let mut g = TxGate::new();
        assert!(g.may_read(3));
        assert!(!g.may_read(0));
        assert!(g.stopped());
        assert!(!g.may_read(0));
        assert_eq!(g.backpressure(), 1, "one episode");
        assert!(g.may_read(1));
        assert!(!g.stopped());
        g.on_drained();
        assert!(!g.may_read(10));
        assert!(!g.pending());
        g.on_readable();
        assert!(g.may_read(10));
    }

    /// A model CQ with verbs semantics: completions arrive at any time; an armed CQ raises
    /// one event on the next arrival and disarms.
    #[derive(Default)]
    struct ModelCq {
        queued: usize,
        armed: bool,
        event: bool,
    }

    impl ModelCq {
        fn arrive(&mut self, k: usize) {
            self.queued += k;
            if k > 0 && self.armed {
                self.armed = false;
                self.event = true;
            }
        }
        fn poll(&mut self, max: usize) -> usize {
            let n = self.queued.min(max);
            self.queued -= n;
            n
        }
    }

    proptest! {
        /// Whatever the interleaving of arrivals with the loop's steps, the machine never
        /// goes to sleep while completions are queued with no event coming, and every
        /// completion is eventually handled.
        #[test]
        fn never_sleeps_on_unsignalled_work(
            budget in 1usize..8,
            arrivals in proptest::collection::vec(0usize..6, 1..200),
            window in 0u32..4,
        ) {
            let mut cq = ModelCq::default();
            // A virtual clock, one millisecond a step; a busy-poll window of 0..=3 ms.
            let t0 = Instant::now();
            let mut n = Napi::new(budget).with_busy_poll(window * MS);
            let mut total_in = 0;
            let mut handled = 0;
            let mut arrivals = arrivals.into_iter();
            let mut steps = 0;
            loop {
                steps += 1;
                prop_assert!(steps < 10_000);
                let at = t0 + steps * MS;
                // completions may arrive between any two steps
                let k = arrivals.next();
                if let Some(k) = k { cq.arrive(k); total_in += k; }
                if n.poll_due() {
                    let got = cq.poll(budget);
                    handled += got;
                    match n.polled(got, 0, at) {
                        Action::Yield | Action::BusyPoll => {}
                        Action::ArmAndRecheck => {
                            // an arrival may race the arm
                            if let Some(k) = arrivals.next() { cq.arrive(k); total_in += k; }
                            cq.armed = true;
                            let got = cq.poll(budget);
                            handled += got;
                            let _ = n.polled(got, 0, at);
                        }
                        Action::Sleep => {}
                    }
                } else {
                    prop_assert!(cq.queued == 0 || cq.event,
                        "asleep with {} queued and no event", cq.queued);
                    if cq.event { cq.event = false; n.on_events(1); }
                    else if k.is_none() { break; }
                }
            }
            prop_assert_eq!(handled, total_in);
        }
    }
}
