//! The restart sequence as a state machine, without I/O, threads or a clock of its own
//! (like [`crate::iface::napi`]): events and `now` go in, [`Action`]s come out, and the
//! supervisor thread (`crate::runtime::supervisor`) performs them and reports back.
//!
//! One restart, in order: the carrier off if the device is reopened from scratch (a
//! restart that keeps it leaves the carrier on: the TAP holds what the kernel sends
//! meanwhile, for the next epoch; any wait turns it off); the failed epoch torn down ([`Action::Close`]:
//! drained and its endpoint kept, only the QP and CQs renewed; or, for a lost device,
//! closed at once, nothing drained; after a failed poll nothing of that epoch is polled
//! again, so there is no drain and the old QP is destroyed first); the breaker asked;
//! the backoff waited out; the next epoch opened (on the kept endpoint, else from
//! scratch; a device that is gone is waited for); its poller started, which turns the
//! carrier on; the restart recorded.
//!
//! Policy: the first restart after a healthy period ([`HEALTHY_AFTER`]) is immediate;
//! consecutive failed attempts back off exponentially ([`Backoff`]); a circuit breaker
//! ([`Breaker`]) declares the interface dead after too many restarts within a window
//! until an operator restart, or, when the device was lost, until the device has been
//! seen gone (an open failing with "no device") and back: a device that keeps failing
//! with `DEVICE_FATAL` while it stays present is held by the breaker like any other
//! cause. A poller that cannot be started is a failed attempt (counted, backed off,
//! retried); a poller that panicked took its interface with it (nothing to drain or
//! reap, the epoch's ledger is lost) and the next epoch is opened from scratch.

mod policy;
mod record;
#[cfg(test)]
mod tests;

pub use policy::{Backoff, Breaker, HEALTHY_AFTER, Policy};
pub use record::{Phases, RestartRecord, ThreadTime, ms};

use std::time::{Duration, Instant};

use crate::iface::{Closed, Failure, OpenTimes};

/// What the status says while the interface is not running.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum State {
    /// Tearing down, or opening the next epoch.
    Restarting,
    /// The last open found no device.
    WaitingForDevice,
}

impl State {
    /// As `uipoib status` shows it.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Restarting => "restarting",
            State::WaitingForDevice => "waiting-for-device",
        }
    }
}

/// What failed in an attempt at bringing up the next epoch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Attempt {
    /// Opening the device (or the kept endpoint, and then the device).
    Open,
    /// Starting the poller on an opened epoch.
    Start,
}

/// Why a dead interface comes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Revival {
    /// `uipoib restart`.
    Operator,
    /// The device was seen gone and is back.
    DeviceReturned,
}

/// What the supervisor tells the machine.
#[derive(Debug)]
pub enum Event {
    /// The poller gave the interface back with this cause, detected at `detected`;
    /// `untrusted`: a poll of that epoch failed (or it is otherwise not to be polled).
    /// [`Failure::PollerPanicked`]: the interface was lost with the poller.
    Failed {
        /// Why.
        cause: Failure,
        /// The interface says none of its CQs may be polled again.
        untrusted: bool,
        /// When the poller detected it.
        detected: Instant,
    },
    /// The teardown asked for is done (or, for a lost interface, what stands for it).
    Closed(Closed),
    /// The open asked for succeeded.
    Opened {
        /// It was on the kept endpoint.
        on_kept: bool,
        /// Where its time went.
        times: OpenTimes,
    },
    /// The open asked for failed.
    OpenFailed {
        /// It was on the kept endpoint (which is closed now).
        on_kept: bool,
        /// The device is not there.
        no_device: bool,
    },
    /// The poller asked for runs, with the carrier on.
    PollerStarted {
        /// Posting the announcement of the new QPN.
        announce: Duration,
        /// When it was posted.
        announced: Instant,
        /// The poller's poll set and registrations, and its thread unless one was
        /// started ahead.
        spawn: Duration,
        /// The status and the carrier on, before the hand-over.
        carrier: Duration,
        /// The poller runs on a thread started ahead (none was created on the way).
        thread_ahead: bool,
        /// When the poller was handed the interface, the carrier on: the restart's end.
        handed: Instant,
    },
    /// The poller asked for could not be started; the interface is back.
    PollerStartFailed,
    /// An operator asked for a restart.
    Operator,
    /// A wait asked for ended.
    Tick,
}

/// What the supervisor is to do. Within one answer, an action with an outcome (a
/// teardown, an open, a poller start, a wait) comes last: its outcome is the next event.
#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    /// Turn the TAP carrier off.
    CarrierOff,
    /// Show this state.
    Status(State),
    /// The interface was lost with its poller: forget its neighbours, endpoint and
    /// reaper; report [`Event::Closed`] with its ledger lost.
    ForgetLost,
    /// Tear the interface down: drain its flushes (bounded) or not, keep its endpoint
    /// (QP and CQs renewed) or close it; report [`Event::Closed`].
    Close {
        /// Move the QP to error and drain flushes; never after a failed poll.
        drain: bool,
        /// Keep the endpoint (not for a lost device).
        keep: bool,
    },
    /// Close the kept endpoint (the interface is declared dead).
    CloseKept,
    /// Open epoch `epoch`; report [`Event::Opened`] or [`Event::OpenFailed`].
    Open {
        /// The epoch to open.
        epoch: u16,
        /// On the kept endpoint, else from scratch.
        on_kept: bool,
    },
    /// Close what the last open opened: it was a probe of a device that did not go away.
    CloseProbe,
    /// Start a poller on what was opened; report [`Event::PollerStarted`] or
    /// [`Event::PollerStartFailed`].
    StartPoller {
        /// Its epoch.
        epoch: u16,
    },
    /// Wait until then, or an operator restart; report [`Event::Tick`] or
    /// [`Event::Operator`].
    WaitUntil(Instant),
    /// Wait for an operator restart; report [`Event::Operator`].
    WaitForOperator,
    /// Ask the running poller to hand the interface over (it reports
    /// [`Event::Failed`] with [`Failure::Operator`]).
    HandOver,
    /// An attempt failed (`attempts` so far in this restart); log it if `log`.
    AttemptFailed {
        /// Failed attempts in this restart.
        attempts: u32,
        /// What failed.
        what: Attempt,
        /// Whether to log it (open failures are logged at the 1st and every 20th).
        log: bool,
    },
    /// A dead interface comes back.
    Revive(Revival),
    /// The breaker tripped: the interface is dead; record this restart.
    Dead {
        /// Why, for the status and the log.
        why: String,
        /// The restart that tripped it.
        record: RestartRecord,
    },
    /// A restart is complete: count it and record it.
    Recovered(RestartRecord),
}

/// What a teardown is for.
#[derive(Debug, Clone)]
enum After {
    /// The failure of a running epoch (its cause, in full).
    Failure { device_lost: bool, cause: String },
    /// A poller that could not be started.
    StartFailure,
}

#[derive(Debug, Clone)]
enum Stage {
    Running,
    Closing(After),
    Backoff {
        until: Instant,
    },
    Opening {
        on_kept: bool,
        attempt_at: Instant,
    },
    Starting {
        since: Instant,
    },
    Dead {
        device_lost: bool,
        seen_gone: bool,
        until: Instant,
    },
    Probing {
        seen_gone: bool,
        at: Instant,
        wall_ms: u64,
    },
}

/// The restart machine of one interface. See the module docs.
#[derive(Debug)]
pub struct Recovery {
    policy: Policy,
    backoff: Backoff,
    breaker: Breaker,
    /// The live (or last live) epoch.
    epoch: u16,
    /// When the live epoch's poller was started.
    last_start: Instant,
    /// The last teardown kept the endpoint for the next epoch.
    kept: bool,
    stage: Stage,
    /// The restart under way.
    record: RestartRecord,
    /// When the restart under way was detected.
    detected: Instant,
    /// The restart under way is the one rehearsed at start ([`Failure::Rehearsal`]):
    /// neither the breaker nor the backoff counts it.
    rehearsing: bool,
}

impl Recovery {
    /// A machine for an interface running epoch `epoch`, started at `now`.
    pub fn new(policy: Policy, epoch: u16, now: Instant) -> Self {
        Recovery {
            backoff: Backoff::new(&policy),
            breaker: Breaker::new(&policy),
            policy,
            epoch,
            last_start: now,
            kept: false,
            stage: Stage::Running,
            record: RestartRecord::default(),
            detected: now,
            rehearsing: false,
        }
    }

    /// The live (or last live) epoch.
    pub fn epoch(&self) -> u16 {
        self.epoch
    }

    /// Whether the interface is dead (the breaker tripped and it was not revived).
    pub fn is_dead(&self) -> bool {
        matches!(self.stage, Stage::Dead { .. } | Stage::Probing { .. })
    }

    /// Whether a poller runs.
    pub fn is_running(&self) -> bool {
        matches!(self.stage, Stage::Running)
    }

    /// The restart under way (or the last one).
    pub fn record(&self) -> &RestartRecord {
        &self.record
    }

    fn next_epoch(&self) -> u16 {
        self.epoch.wrapping_add(1).max(1)
    }

    /// Feed `ev` at `now` (`wall_ms`: the same instant in ms since the Unix epoch, for
    /// the records); the actions to perform, in order. An event the current stage does
    /// not expect changes nothing.
    pub fn handle(&mut self, ev: Event, now: Instant, wall_ms: u64) -> Vec<Action> {
        let mut acts = Vec::new();
        match (self.stage.clone(), ev) {
            (Stage::Running, Event::Operator) => acts.push(Action::HandOver),
            (
                Stage::Running,
                Event::Failed {
                    cause,
                    untrusted,
                    detected,
                },
            ) => self.failed(&cause, untrusted, detected, now, wall_ms, &mut acts),
            (Stage::Closing(after), Event::Closed(t)) => self.closed(after, &t, now, &mut acts),
            (Stage::Backoff { until }, Event::Tick) if now < until => {
                acts.push(Action::WaitUntil(until))
            }
            (Stage::Backoff { .. }, Event::Tick | Event::Operator) => self.open(now, &mut acts),
            (
                Stage::Opening {
                    on_kept,
                    attempt_at,
                },
                Event::Opened {
                    on_kept: opened_on_kept,
                    times,
                },
            ) if on_kept == opened_on_kept => {
                self.kept = false;
                let r = &mut self.record;
                let p = &mut r.phases;
                p.reap_ms = (ms(attempt_at.saturating_duration_since(self.detected))
                    - p.handoff_ms
                    - p.drain_ms
                    - p.destroy_ms)
                    .max(0.0);
                p.open_ms = ms(times.open);
                p.ah_ms = ms(times.ah);
                p.attach_ms = ms(times.attach);
                p.fill_ms = ms(times.fill);
                r.kept_device = on_kept;
                self.start(now, &mut acts);
            }
            (
                Stage::Opening {
                    on_kept: true,
                    attempt_at,
                },
                Event::OpenFailed { on_kept: true, .. },
            ) => {
                // The kept endpoint is closed: the same attempt opens the device, carrier
                // off meanwhile.
                self.kept = false;
                acts.push(Action::CarrierOff);
                self.stage = Stage::Opening {
                    on_kept: false,
                    attempt_at,
                };
                acts.push(Action::Open {
                    epoch: self.next_epoch(),
                    on_kept: false,
                });
            }
            (
                Stage::Opening { on_kept: false, .. },
                Event::OpenFailed {
                    on_kept: false,
                    no_device,
                },
            ) => {
                let attempts = self.failed_attempt();
                acts.push(Action::Status(if no_device {
                    State::WaitingForDevice
                } else {
                    State::Restarting
                }));
                acts.push(Action::AttemptFailed {
                    attempts,
                    what: Attempt::Open,
                    log: attempts == 1 || attempts.is_multiple_of(20),
                });
                self.attempt(now, &mut acts);
            }
            (
                Stage::Starting { since },
                Event::PollerStarted {
                    announce,
                    announced,
                    spawn,
                    carrier,
                    thread_ahead,
                    handed,
                },
            ) => {
                let epoch = self.next_epoch();
                self.epoch = epoch;
                self.last_start = since;
                let r = &mut self.record;
                r.epoch = epoch;
                r.recovery_ms = ms(handed.saturating_duration_since(self.detected));
                r.announced_ms = ms(announced.saturating_duration_since(self.detected));
                r.phases.start_ms = ms(handed.saturating_duration_since(since));
                r.phases.announce_ms = ms(announce);
                r.phases.spawn_ms = ms(spawn);
                r.phases.carrier_ms = ms(carrier);
                r.poller_thread_ahead = thread_ahead;
                if std::mem::take(&mut self.rehearsing) {
                    // Its attempt does not delay the first real restart.
                    self.backoff.reset();
                }
                self.stage = Stage::Running;
                acts.push(Action::Recovered(self.record.clone()));
            }
            (Stage::Starting { since }, Event::PollerStartFailed) => {
                // Its start counts as one, healthy or not, for the next failure.
                self.last_start = since;
                let attempts = self.failed_attempt();
                acts.push(Action::Status(State::Restarting));
                acts.push(Action::AttemptFailed {
                    attempts,
                    what: Attempt::Start,
                    log: true,
                });
                self.stage = Stage::Closing(After::StartFailure);
                acts.push(Action::Close {
                    drain: true,
                    keep: true,
                });
            }
            (Stage::Dead { .. }, Event::Operator) => {
                acts.push(Action::Revive(Revival::Operator));
                self.revived(
                    "operator restart after the circuit breaker tripped",
                    now,
                    wall_ms,
                );
                self.attempt(now, &mut acts);
            }
            (Stage::Dead { until, .. }, Event::Tick) if now < until => {
                acts.push(Action::WaitUntil(until))
            }
            (
                Stage::Dead {
                    device_lost: true,
                    seen_gone,
                    ..
                },
                Event::Tick,
            ) => {
                // Has the device gone and come back?
                self.stage = Stage::Probing {
                    seen_gone,
                    at: now,
                    wall_ms,
                };
                acts.push(Action::Open {
                    epoch: self.next_epoch(),
                    on_kept: false,
                });
            }
            (Stage::Probing { seen_gone, .. }, Event::OpenFailed { no_device, .. }) => {
                self.dead(true, seen_gone || no_device, now, &mut acts);
            }
            (
                Stage::Probing {
                    seen_gone: false, ..
                },
                Event::Opened { .. },
            ) => {
                // Still there: a device that keeps failing without going away stays
                // dead (the breaker holds) until an operator restart.
                acts.push(Action::CloseProbe);
                self.dead(true, false, now, &mut acts);
            }
            (Stage::Probing { at, wall_ms, .. }, Event::Opened { .. }) => {
                acts.push(Action::Revive(Revival::DeviceReturned));
                self.revived(
                    "the device returned after the circuit breaker tripped",
                    at,
                    wall_ms,
                );
                self.start(now, &mut acts);
            }
            _ => {}
        }
        acts
    }

    fn failed(
        &mut self,
        cause: &Failure,
        untrusted: bool,
        detected: Instant,
        now: Instant,
        wall_ms: u64,
        acts: &mut Vec<Action>,
    ) {
        let lost = matches!(cause, Failure::PollerPanicked(_));
        let device_lost = cause.device_lost();
        // The endpoint moves to the GID it would choose now, and only an open chooses
        // one (a renewal keeps the endpoint's GID for as long as the table holds it at
        // the endpoint's index).
        let gid_changed = matches!(cause, Failure::GidChanged { .. });
        // The carrier stays on through a restart that keeps the device (the TAP holds
        // what the kernel sends meanwhile, and the next epoch carries it); it goes off
        // when the device is reopened from scratch, and before any wait.
        if lost || device_lost || gid_changed {
            acts.push(Action::CarrierOff);
        }
        acts.push(Action::Status(State::Restarting));
        self.rehearsing = matches!(cause, Failure::Rehearsal);
        if now.saturating_duration_since(self.last_start) >= HEALTHY_AFTER {
            self.backoff.reset();
        }
        self.detected = detected;
        // `wall_ms` is now, when the supervisor handles it: the failure is older by the
        // hand-over.
        let handoff = now.saturating_duration_since(detected);
        self.record = RestartRecord {
            epoch: self.epoch.wrapping_add(1),
            cause: cause.kind().into(),
            detail: cause.to_string(),
            detected_unix_ms: wall_ms
                .saturating_sub(u64::try_from(handoff.as_millis()).unwrap_or(u64::MAX)),
            ledger_lost: lost,
            phases: Phases {
                handoff_ms: ms(handoff),
                ..Phases::default()
            },
            ..RestartRecord::default()
        };
        self.stage = Stage::Closing(After::Failure {
            device_lost,
            cause: cause.to_string(),
        });
        if lost {
            self.kept = false;
            acts.push(Action::ForgetLost);
        } else if device_lost {
            // A lost device cannot flush anything, and an operator's `rdma link delete`
            // waits until the endpoint is closed: close it at once, reaping everything.
            acts.push(Action::Close {
                drain: false,
                keep: false,
            });
        } else {
            // Anything else keeps the device context, PD, registered memory and channel,
            // and replaces only the QP and CQs; a GID change reopens the device, the only
            // way to choose the GID again. A failed poll's CQs are never polled again: no
            // drain.
            let poll_failed = untrusted || matches!(cause, Failure::PollFailed(_));
            acts.push(Action::Close {
                drain: !poll_failed,
                keep: !gid_changed,
            });
        }
    }

    fn closed(&mut self, after: After, t: &Closed, now: Instant, acts: &mut Vec<Action>) {
        self.kept = t.kept;
        let r = &mut self.record;
        match after {
            After::Failure { device_lost, cause } => {
                r.wr_reaped = t.reaped;
                r.sends_reaped = t.sends_reaped;
                r.flushed = t.flushed;
                r.ledger_balanced = t.ledger.is_ok();
                r.phases.drain_ms = ms(t.drain);
                r.phases.destroy_ms = ms(t.destroy);
                r.phases.renew_ms = ms(t.restart);
                if !self.rehearsing && self.breaker.record(now) {
                    // Dead: nothing of the device is held until it is revived.
                    if self.kept {
                        self.kept = false;
                        acts.push(Action::CloseKept);
                    }
                    acts.push(Action::CarrierOff);
                    let why = format!(
                        "{} restarts within {:?} (last cause: {})",
                        self.policy.max_restarts + 1,
                        self.policy.window,
                        cause
                    );
                    acts.push(Action::Dead {
                        why,
                        record: self.record.clone(),
                    });
                    self.dead(device_lost, false, now, acts);
                    return;
                }
            }
            After::StartFailure => {
                r.wr_reaped += t.reaped;
                r.sends_reaped += t.sends_reaped;
                r.flushed += t.flushed;
                r.ledger_balanced &= t.ledger.is_ok();
            }
        }
        self.attempt(now, acts);
    }

    /// The head of an attempt: the backoff's delay, then the open.
    fn attempt(&mut self, now: Instant, acts: &mut Vec<Action>) {
        let delay = self.backoff.next_delay();
        if delay.is_zero() {
            self.open(now, acts);
        } else {
            let until = now + delay;
            self.stage = Stage::Backoff { until };
            acts.push(Action::CarrierOff);
            acts.push(Action::WaitUntil(until));
        }
    }

    fn open(&mut self, now: Instant, acts: &mut Vec<Action>) {
        self.stage = Stage::Opening {
            on_kept: self.kept,
            attempt_at: now,
        };
        acts.push(Action::Open {
            epoch: self.next_epoch(),
            on_kept: self.kept,
        });
    }

    fn start(&mut self, now: Instant, acts: &mut Vec<Action>) {
        self.stage = Stage::Starting { since: now };
        acts.push(Action::StartPoller {
            epoch: self.next_epoch(),
        });
    }

    fn failed_attempt(&mut self) -> u32 {
        self.record.failed_attempts += 1;
        self.record.failed_attempts
    }

    /// Dead: wait for an operator, or, when the device was lost, look for it every
    /// `backoff_max`.
    fn dead(&mut self, device_lost: bool, seen_gone: bool, now: Instant, acts: &mut Vec<Action>) {
        let until = now + self.policy.backoff_max;
        self.stage = Stage::Dead {
            device_lost,
            seen_gone,
            until,
        };
        acts.push(if device_lost {
            Action::WaitUntil(until)
        } else {
            Action::WaitForOperator
        });
    }

    /// Revived: the breaker and the backoff start over, and a new record with them
    /// (nothing to reap: every work request of the dead interface was reaped when it
    /// was torn down, and that restart's record says whether its ledger balanced).
    fn revived(&mut self, detail: &str, at: Instant, wall_ms: u64) {
        self.breaker.reset();
        self.backoff.reset();
        self.detected = at;
        self.record = RestartRecord {
            cause: "revived".into(),
            detail: detail.into(),
            detected_unix_ms: wall_ms,
            ledger_balanced: true,
            ..RestartRecord::default()
        };
    }
}
