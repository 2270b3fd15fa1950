//! What can be injected: the fault kinds, their options, and a [`FaultSpec`] (a fault, a
//! trigger and how often it fires) parsed from a control-socket request.
//!
//! Parsing refuses anything it does not understand and names the field that is wrong:
//! an unknown fault, a misspelt or inapplicable option, two triggers at once, a value of
//! the wrong type or out of range. [`FaultSpec::to_json`] writes the request back, so a
//! spec survives a round trip through the socket unchanged.

use std::fmt;
use std::time::Duration;

use serde_json::{Map, Value, json};

use super::trigger::Trigger;
use crate::verbs::{AsyncEvent, CqKind};

/// The faults, by name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FaultKind {
    /// `poll_cq` fails with a negative return (never retried: the interface restarts).
    PollError,
    /// A completion is swallowed: its work request never completes.
    LostCompletion,
    /// The QP is forced into the error state: flush completions follow.
    QpError,
    /// Posting a send fails with an errno.
    PostSendError,
    /// Posting a receive fails with an errno.
    PostRecvError,
    /// A fatal asynchronous event is delivered.
    AsyncFatal,
    /// A completion event with nothing behind it.
    SpuriousEvent,
    /// A poll is delayed.
    SlowPoll,
    /// Bytes of a received packet are flipped.
    CorruptRx,
    /// Send completions are held back.
    StallSend,
}

impl FaultKind {
    /// Every kind.
    pub const ALL: [FaultKind; 10] = [
        FaultKind::PollError,
        FaultKind::LostCompletion,
        FaultKind::QpError,
        FaultKind::PostSendError,
        FaultKind::PostRecvError,
        FaultKind::AsyncFatal,
        FaultKind::SpuriousEvent,
        FaultKind::SlowPoll,
        FaultKind::CorruptRx,
        FaultKind::StallSend,
    ];

    /// The names, for error messages.
    pub const NAMES: &'static str = "poll-error, lost-completion, qp-error, post-send-error, \
         post-recv-error, async-fatal, spurious-event, slow-poll, corrupt-rx, stall-send";

    /// Stable name (what `uipoib fault inject` takes).
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::PollError => "poll-error",
            FaultKind::LostCompletion => "lost-completion",
            FaultKind::QpError => "qp-error",
            FaultKind::PostSendError => "post-send-error",
            FaultKind::PostRecvError => "post-recv-error",
            FaultKind::AsyncFatal => "async-fatal",
            FaultKind::SpuriousEvent => "spurious-event",
            FaultKind::SlowPoll => "slow-poll",
            FaultKind::CorruptRx => "corrupt-rx",
            FaultKind::StallSend => "stall-send",
        }
    }

    /// The kind with this name.
    pub fn from_name(s: &str) -> Option<FaultKind> {
        FaultKind::ALL.into_iter().find(|k| k.name() == s)
    }

    /// Position in [`FaultKind::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }

    /// The operations this fault's trigger counts.
    pub fn operation(self) -> &'static str {
        match self {
            FaultKind::PollError
            | FaultKind::QpError
            | FaultKind::AsyncFatal
            | FaultKind::SpuriousEvent
            | FaultKind::SlowPoll => "poll_cq call",
            FaultKind::StallSend => "poll_cq call on the send CQ",
            FaultKind::LostCompletion => "completion polled (on the selected CQ)",
            FaultKind::CorruptRx => "successful receive completion",
            FaultKind::PostSendError => "send work request posted",
            FaultKind::PostRecvError => "receive work request posted",
        }
    }
}

impl serde::Serialize for FaultKind {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl fmt::Display for FaultKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Which completion queue a lost completion is taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CqSel {
    /// Send completions only.
    Send,
    /// Receive completions only.
    Recv,
    /// Either.
    Any,
}

impl CqSel {
    /// Stable name.
    pub fn name(self) -> &'static str {
        match self {
            CqSel::Send => "send",
            CqSel::Recv => "recv",
            CqSel::Any => "any",
        }
    }

    /// Whether completions of `cq` are selected.
    pub fn matches(self, cq: CqKind) -> bool {
        matches!(
            (self, cq),
            (CqSel::Any, _) | (CqSel::Send, CqKind::Send) | (CqSel::Recv, CqKind::Recv)
        )
    }
}

/// A fault and its options.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Fault {
    /// `poll_cq` returns `ret` (negative).
    PollError {
        /// What `ibv_poll_cq` returns.
        ret: i32,
        /// Completions the failing poll consumes from the CQ and never returns (at most
        /// this many, up to what the CQ holds and the poll asked for): a CQ that fails on
        /// real hardware may have taken entries it does not give back, and nothing
        /// flushes them. With `lose`, only polls that find completions count as the
        /// fault's operations (an empty one has nothing to lose).
        lose: u32,
        /// Which CQ's polls fail.
        cq: CqSel,
    },
    /// A completion on `cq` is swallowed.
    LostCompletion {
        /// Which CQ's completions.
        cq: CqSel,
    },
    /// The QP is moved to the error state.
    QpError {
        /// Also deliver `QP_FATAL`, as a device does for an error it cannot report
        /// through a completion. Without it the flush completions are the only sign.
        fatal_event: bool,
    },
    /// `post_send` fails with `errno` at the hit work request (the ones before it in the
    /// chain are posted).
    PostSendError {
        /// The errno.
        errno: i32,
    },
    /// `post_recv` fails with `errno`.
    PostRecvError {
        /// The errno.
        errno: i32,
    },
    /// `event` is delivered through the async-event source.
    AsyncFatal {
        /// The event.
        event: AsyncEvent,
    },
    /// The completion channel becomes readable and reports an event with nothing
    /// behind it.
    SpuriousEvent,
    /// The poll sleeps `delay` before polling.
    SlowPoll {
        /// How long.
        delay: Duration,
    },
    /// `bytes` bytes of the received packet (GRH included) are flipped.
    CorruptRx {
        /// How many bytes.
        bytes: u32,
    },
    /// The endpoint hit stops returning send completions (they stay in the device CQ)
    /// until the fault is cleared or the endpoint is destroyed by a restart.
    StallSend,
}

impl Fault {
    /// A failed poll returning `ret`, on any CQ, losing nothing.
    pub fn poll_error(ret: i32) -> Fault {
        Fault::PollError {
            ret,
            lose: 0,
            cq: CqSel::Any,
        }
    }
}

/// Most completions one failed poll may swallow (`lose`).
pub const MAX_LOSE: u32 = 4096;

/// Longest `for_ms` window accepted (an hour).
pub const MAX_FOR_MS: u64 = 3_600_000;

/// Default `ret` of a failed poll (`-EIO`).
pub const DEFAULT_POLL_RET: i32 = -5;
/// Default errno of a failed post (`ENOMEM`: the queue is full, what mlx5 returns).
pub const DEFAULT_POST_ERRNO: i32 = libc::ENOMEM;
/// Default slow-poll delay.
pub const DEFAULT_DELAY: Duration = Duration::from_millis(5);
/// Longest slow-poll delay accepted (a longer one is a hang, not a slow poll).
pub const MAX_DELAY_MS: u64 = 10_000;
/// Most bytes flipped in one received packet.
pub const MAX_CORRUPT_BYTES: u32 = 64;
/// Longest time offset accepted for `at_ms` (a day).
pub const MAX_AT_MS: u64 = 86_400_000;

impl Fault {
    /// Its kind.
    pub fn kind(&self) -> FaultKind {
        match self {
            Fault::PollError { .. } => FaultKind::PollError,
            Fault::LostCompletion { .. } => FaultKind::LostCompletion,
            Fault::QpError { .. } => FaultKind::QpError,
            Fault::PostSendError { .. } => FaultKind::PostSendError,
            Fault::PostRecvError { .. } => FaultKind::PostRecvError,
            Fault::AsyncFatal { .. } => FaultKind::AsyncFatal,
            Fault::SpuriousEvent => FaultKind::SpuriousEvent,
            Fault::SlowPoll { .. } => FaultKind::SlowPoll,
            Fault::CorruptRx { .. } => FaultKind::CorruptRx,
            Fault::StallSend => FaultKind::StallSend,
        }
    }

    /// `kind` with default options.
    pub fn default_for(kind: FaultKind) -> Fault {
        match kind {
            FaultKind::PollError => Fault::PollError {
                ret: DEFAULT_POLL_RET,
                lose: 0,
                cq: CqSel::Any,
            },
            FaultKind::LostCompletion => Fault::LostCompletion { cq: CqSel::Send },
            FaultKind::QpError => Fault::QpError { fatal_event: false },
            FaultKind::PostSendError => Fault::PostSendError {
                errno: DEFAULT_POST_ERRNO,
            },
            FaultKind::PostRecvError => Fault::PostRecvError {
                errno: DEFAULT_POST_ERRNO,
            },
            FaultKind::AsyncFatal => Fault::AsyncFatal {
                event: AsyncEvent::DeviceFatal,
            },
            FaultKind::SpuriousEvent => Fault::SpuriousEvent,
            FaultKind::SlowPoll => Fault::SlowPoll {
                delay: DEFAULT_DELAY,
            },
            FaultKind::CorruptRx => Fault::CorruptRx { bytes: 1 },
            FaultKind::StallSend => Fault::StallSend,
        }
    }
}

/// A fault, when it fires, and how often.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct FaultSpec {
    /// The fault and its options.
    pub fault: Fault,
    /// When it fires.
    pub trigger: Trigger,
    /// How many times it fires before it is disarmed; `None`: until cleared.
    pub limit: Option<u64>,
    /// Once it has fired, it stays armed this long and is then spent (`for_ms`): "every
    /// poll fails for 2 s". `None`: no such window.
    pub window: Option<Duration>,
    /// It hits only the endpoint it first hit, and is spent once that endpoint is
    /// restarted or closed (`until_restart`): "every poll fails until the interface is
    /// restarted".
    pub until_restart: bool,
}

impl FaultSpec {
    /// `fault` with its kind's default trigger: on command, once; a slow poll delays
    /// every poll until cleared.
    pub fn new(fault: Fault) -> FaultSpec {
        let trigger = match fault.kind() {
            FaultKind::SlowPoll => Trigger::Every(1),
            _ => Trigger::Now,
        };
        FaultSpec {
            fault,
            trigger,
            limit: trigger.default_limit(),
            window: None,
            until_restart: false,
        }
    }

    /// Its kind.
    pub fn kind(&self) -> FaultKind {
        self.fault.kind()
    }

    /// With another trigger (and that trigger's default limit).
    pub fn trigger(mut self, t: Trigger) -> FaultSpec {
        self.trigger = t;
        self.limit = t.default_limit();
        self
    }

    /// Fire at most `n` times.
    pub fn limit(mut self, n: u64) -> FaultSpec {
        self.limit = Some(n);
        self
    }

    /// Fire until cleared.
    pub fn unlimited(mut self) -> FaultSpec {
        self.limit = None;
        self
    }

    /// Parse an `inject` request: a JSON object with `fault`, at most one trigger
    /// (`after`, `every`, `at_ms`, `probability` with `seed`), `count`, and the fault's
    /// options. A `cmd` field is ignored; any other field is refused.
    pub fn from_json(v: &Value) -> Result<FaultSpec, SpecError> {
        match v {
            Value::Object(m) => FaultSpec::from_map(m),
            _ => Err(SpecError::new("request", "must be a JSON object")),
        }
    }

    /// See [`FaultSpec::from_json`].
    pub fn from_map(m: &Map<String, Value>) -> Result<FaultSpec, SpecError> {
        for k in m.keys() {
            if !FIELDS.contains(&k.as_str()) {
                return Err(SpecError {
                    field: k.clone(),
                    why: format!("unknown field; known: {}", FIELDS[1..].join(", ")),
                });
            }
        }
        let kind = match m.get("fault") {
            None | Some(Value::Null) => {
                return Err(SpecError::new(
                    "fault",
                    format!("missing; one of {}", FaultKind::NAMES),
                ));
            }
            Some(Value::String(s)) => FaultKind::from_name(s).ok_or_else(|| {
                SpecError::new(
                    "fault",
                    format!("unknown fault {s:?}; known: {}", FaultKind::NAMES),
                )
            })?,
            Some(other) => {
                return Err(SpecError::new(
                    "fault",
                    format!("must be a string, not {other}"),
                ));
            }
        };
        let mut spec = FaultSpec::new(Fault::default_for(kind));

        // The trigger: at most one.
        let mut given: Option<&'static str> = None;
        let mut one = |field: &'static str| -> Result<(), SpecError> {
            if let Some(first) = given {
                return Err(SpecError::new(
                    field,
                    format!("give one trigger only (already have {first})"),
                ));
            }
            given = Some(field);
            Ok(())
        };
        if let Some(n) = get_u64(m, "after")? {
            one("after")?;
            spec = spec.trigger(Trigger::After(n));
        }
        if let Some(n) = get_u64(m, "every")? {
            one("every")?;
            if n == 0 {
                return Err(SpecError::new("every", "must be at least 1"));
            }
            spec = spec.trigger(Trigger::Every(n));
        }
        if let Some(ms) = get_u64(m, "at_ms")? {
            one("at_ms")?;
            if ms > MAX_AT_MS {
                return Err(SpecError::new(
                    "at_ms",
                    format!("at most {MAX_AT_MS} (a day), not {ms}"),
                ));
            }
            spec = spec.trigger(Trigger::At(Duration::from_millis(ms)));
        }
        let seed = get_u64(m, "seed")?;
        match m.get("probability") {
            None | Some(Value::Null) => {
                if seed.is_some() {
                    return Err(SpecError::new("seed", "only goes with probability"));
                }
            }
            Some(v) => {
                one("probability")?;
                let p = v.as_f64().ok_or_else(|| {
                    SpecError::new("probability", format!("must be a number, not {v}"))
                })?;
                if !(p > 0.0 && p <= 1.0) {
                    return Err(SpecError::new(
                        "probability",
                        format!("must be in (0, 1], not {p}"),
                    ));
                }
                spec = spec.trigger(Trigger::Random {
                    p,
                    seed: seed.unwrap_or(0),
                });
            }
        }

        if let Some(ms) = get_u64(m, "for_ms")? {
            if ms == 0 || ms > MAX_FOR_MS {
                return Err(SpecError::new(
                    "for_ms",
                    format!("must be 1..={MAX_FOR_MS}, not {ms}"),
                ));
            }
            spec.window = Some(Duration::from_millis(ms));
        }
        match m.get("until_restart") {
            None | Some(Value::Null) => {}
            Some(Value::Bool(b)) => spec.until_restart = *b,
            Some(v) => {
                return Err(SpecError::new(
                    "until_restart",
                    format!("must be true or false, not {v}"),
                ));
            }
        }

        match m.get("count") {
            // A window or a QP to stay with means nothing to a fault that fires once:
            // without a count, they make it fire until they end it.
            None | Some(Value::Null) if spec.window.is_some() || spec.until_restart => {
                spec = spec.unlimited()
            }
            None | Some(Value::Null) => {}
            Some(Value::String(s)) if s == "unlimited" => spec = spec.unlimited(),
            Some(v) => match v.as_u64() {
                Some(0) | None => {
                    return Err(SpecError::new(
                        "count",
                        format!("must be a whole number at least 1, or \"unlimited\", not {v}"),
                    ));
                }
                Some(n) => spec = spec.limit(n),
            },
        }

        // Options, each only where it applies.
        let inapplicable = |field: &'static str| {
            SpecError::new(field, format!("does not apply to {}", kind.name()))
        };
        if let Some(v) = m.get("ret").filter(|v| !v.is_null()) {
            let Fault::PollError { ret, .. } = &mut spec.fault else {
                return Err(inapplicable("ret"));
            };
            let r = v
                .as_i64()
                .and_then(|r| i32::try_from(r).ok())
                .ok_or_else(|| SpecError::new("ret", format!("must be an integer, not {v}")))?;
            if r >= 0 {
                return Err(SpecError::new(
                    "ret",
                    format!("must be negative (a failed ibv_poll_cq), not {r}"),
                ));
            }
            *ret = r;
        }
        if let Some(v) = m.get("errno").filter(|v| !v.is_null()) {
            let errno = match &mut spec.fault {
                Fault::PostSendError { errno } | Fault::PostRecvError { errno } => errno,
                _ => return Err(inapplicable("errno")),
            };
            *errno = parse_errno(v)?;
        }
        if let Some(v) = m.get("event").filter(|v| !v.is_null()) {
            let s = v
                .as_str()
                .ok_or_else(|| SpecError::new("event", format!("must be a string, not {v}")))?;
            match &mut spec.fault {
                Fault::AsyncFatal { event } => {
                    *event = event_from_name(s).ok_or_else(|| {
                        SpecError::new(
                            "event",
                            format!("unknown event {s:?}; known: {ASYNC_EVENT_NAMES}"),
                        )
                    })?;
                }
                Fault::QpError { fatal_event } => {
                    *fatal_event = match s {
                        "qp-fatal" => true,
                        "none" => false,
                        _ => {
                            return Err(SpecError::new(
                                "event",
                                format!("for qp-error: qp-fatal or none, not {s:?}"),
                            ));
                        }
                    };
                }
                _ => return Err(inapplicable("event")),
            }
        }
        if let Some(ms) = get_u64(m, "delay_ms")? {
            let Fault::SlowPoll { delay } = &mut spec.fault else {
                return Err(inapplicable("delay_ms"));
            };
            if ms == 0 || ms > MAX_DELAY_MS {
                return Err(SpecError::new(
                    "delay_ms",
                    format!("must be 1..={MAX_DELAY_MS}, not {ms}"),
                ));
            }
            *delay = Duration::from_millis(ms);
        }
        if let Some(n) = get_u64(m, "bytes")? {
            let Fault::CorruptRx { bytes } = &mut spec.fault else {
                return Err(inapplicable("bytes"));
            };
            if n == 0 || n > u64::from(MAX_CORRUPT_BYTES) {
                return Err(SpecError::new(
                    "bytes",
                    format!("must be 1..={MAX_CORRUPT_BYTES}, not {n}"),
                ));
            }
            *bytes = n as u32;
        }
        if let Some(n) = get_u64(m, "lose")? {
            let Fault::PollError { lose, .. } = &mut spec.fault else {
                return Err(inapplicable("lose"));
            };
            if n > u64::from(MAX_LOSE) {
                return Err(SpecError::new(
                    "lose",
                    format!("at most {MAX_LOSE}, not {n}"),
                ));
            }
            *lose = n as u32;
        }
        if let Some(v) = m.get("cq").filter(|v| !v.is_null()) {
            let (Fault::LostCompletion { cq } | Fault::PollError { cq, .. }) = &mut spec.fault
            else {
                return Err(inapplicable("cq"));
            };
            *cq = match v.as_str() {
                Some("send") => CqSel::Send,
                Some("recv") => CqSel::Recv,
                Some("any") => CqSel::Any,
                _ => {
                    return Err(SpecError::new(
                        "cq",
                        format!("must be send, recv or any, not {v}"),
                    ));
                }
            };
        }
        Ok(spec)
    }

    /// The request that [`FaultSpec::from_json`] turns back into this spec (without
    /// `cmd`).
    pub fn to_json(&self) -> Value {
        let mut v = json!({ "fault": self.kind().name() });
        match self.trigger {
            Trigger::Now => {}
            Trigger::After(n) => v["after"] = n.into(),
            Trigger::Every(n) => v["every"] = n.into(),
            Trigger::At(d) => v["at_ms"] = (d.as_millis() as u64).into(),
            Trigger::Random { p, seed } => {
                v["probability"] = p.into();
                v["seed"] = seed.into();
            }
        }
        if let Some(w) = self.window {
            v["for_ms"] = (w.as_millis() as u64).into();
        }
        if self.until_restart {
            v["until_restart"] = true.into();
        }
        v["count"] = match self.limit {
            Some(n) => n.into(),
            None => "unlimited".into(),
        };
        match self.fault {
            Fault::PollError { ret, lose, cq } => {
                v["ret"] = ret.into();
                v["lose"] = lose.into();
                v["cq"] = cq.name().into();
            }
            Fault::LostCompletion { cq } => v["cq"] = cq.name().into(),
            Fault::QpError { fatal_event } => {
                v["event"] = if fatal_event { "qp-fatal" } else { "none" }.into()
            }
            Fault::PostSendError { errno } | Fault::PostRecvError { errno } => {
                v["errno"] = errno.into()
            }
            Fault::AsyncFatal { event } => v["event"] = event_name(event).into(),
            Fault::SlowPoll { delay } => v["delay_ms"] = (delay.as_millis() as u64).into(),
            Fault::CorruptRx { bytes } => v["bytes"] = bytes.into(),
            Fault::SpuriousEvent | Fault::StallSend => {}
        }
        v
    }
}

impl fmt::Display for FaultSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.kind())?;
        match self.fault {
            Fault::PollError { ret, lose, cq } => {
                write!(f, " (ret {ret}")?;
                if cq != CqSel::Any {
                    write!(f, ", {} CQ", cq.name())?;
                }
                if lose > 0 {
                    write!(f, ", losing up to {lose} completions")?;
                }
                write!(f, ")")?
            }
            Fault::LostCompletion { cq } => write!(f, " (cq {})", cq.name())?,
            Fault::QpError { fatal_event: true } => write!(f, " (with QP_FATAL)")?,
            Fault::QpError { fatal_event: false } => {}
            Fault::PostSendError { errno } | Fault::PostRecvError { errno } => {
                write!(f, " (errno {errno})")?
            }
            Fault::AsyncFatal { event } => write!(f, " ({})", event_name(event))?,
            Fault::SlowPoll { delay } => write!(f, " ({} ms)", delay.as_millis())?,
            Fault::CorruptRx { bytes } => write!(f, " ({bytes} bytes)")?,
            Fault::SpuriousEvent | Fault::StallSend => {}
        }
        write!(f, ", {}", self.trigger)?;
        match self.limit {
            Some(1) => write!(f, ", once")?,
            Some(n) => write!(f, ", {n} times")?,
            None => write!(f, ", until cleared")?,
        }
        if let Some(w) = self.window {
            write!(f, ", for {} ms from its first hit", w.as_millis())?;
        }
        if self.until_restart {
            write!(f, ", until the endpoint it hits restarts")?;
        }
        Ok(())
    }
}

/// A request field that is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field:?}: {why}")]
pub struct SpecError {
    /// The field.
    pub field: String,
    /// What is wrong with it.
    pub why: String,
}

impl SpecError {
    fn new(field: &str, why: impl Into<String>) -> SpecError {
        SpecError {
            field: field.into(),
            why: why.into(),
        }
    }
}

/// Fields an `inject` request may carry (`cmd` first).
const FIELDS: [&str; 17] = [
    "cmd",
    "fault",
    "after",
    "every",
    "at_ms",
    "probability",
    "seed",
    "count",
    "ret",
    "errno",
    "event",
    "delay_ms",
    "bytes",
    "cq",
    "lose",
    "for_ms",
    "until_restart",
];

fn get_u64(m: &Map<String, Value>, field: &'static str) -> Result<Option<u64>, SpecError> {
    match m.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| SpecError::new(field, format!("must be a whole number >= 0, not {v}"))),
    }
}

/// Errno names accepted besides numbers.
const ERRNOS: [(&str, i32); 8] = [
    ("EIO", libc::EIO),
    ("EAGAIN", libc::EAGAIN),
    ("ENOMEM", libc::ENOMEM),
    ("EFAULT", libc::EFAULT),
    ("EBUSY", libc::EBUSY),
    ("EINVAL", libc::EINVAL),
    ("ENOSPC", libc::ENOSPC),
    ("ENETDOWN", libc::ENETDOWN),
];

fn parse_errno(v: &Value) -> Result<i32, SpecError> {
    let n = match v {
        Value::Number(_) => v.as_i64(),
        Value::String(s) => match s.parse::<i64>() {
            Ok(n) => Some(n),
            Err(_) => ERRNOS
                .iter()
                .find(|(name, _)| name.eq_ignore_ascii_case(s))
                .map(|(_, n)| i64::from(*n)),
        },
        _ => None,
    };
    match n {
        Some(n @ 1..=4095) => Ok(n as i32),
        _ => Err(SpecError::new(
            "errno",
            format!(
                "must be an errno 1..=4095 or one of {}, not {v}",
                ERRNOS.map(|(n, _)| n).join(", ")
            ),
        )),
    }
}

/// Names of the events `async-fatal` delivers.
pub const ASYNC_EVENT_NAMES: &str = "device-fatal, cq-error, qp-fatal, device-removed";

/// The event named `s` (one of [`ASYNC_EVENT_NAMES`]).
pub fn event_from_name(s: &str) -> Option<AsyncEvent> {
    match s {
        "device-fatal" => Some(AsyncEvent::DeviceFatal),
        "cq-error" => Some(AsyncEvent::CqError),
        "qp-fatal" => Some(AsyncEvent::QpFatal),
        "device-removed" => Some(AsyncEvent::DeviceRemoved),
        _ => None,
    }
}

/// The name of an event `async-fatal` can deliver (others by their debug name).
pub fn event_name(ev: AsyncEvent) -> String {
    match ev {
        AsyncEvent::DeviceFatal => "device-fatal".into(),
        AsyncEvent::CqError => "cq-error".into(),
        AsyncEvent::QpFatal => "qp-fatal".into(),
        AsyncEvent::DeviceRemoved => "device-removed".into(),
        other => format!("{other:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(v: Value) -> Result<FaultSpec, SpecError> {
        FaultSpec::from_json(&v)
    }

    fn field_of(v: Value) -> String {
        match parse(v.clone()) {
            Err(e) => e.field,
            Ok(s) => panic!("{v} was accepted as {s}"),
        }
    }

    #[test]
    fn names_round_trip() {
        for k in FaultKind::ALL {
            assert_eq!(FaultKind::from_name(k.name()), Some(k));
            assert!(FaultKind::NAMES.contains(k.name()));
            assert_eq!(FaultKind::ALL[k.index()], k);
            assert_eq!(Fault::default_for(k).kind(), k);
        }
        assert_eq!(FaultKind::from_name("meteor"), None);
    }

    #[test]
    fn defaults() {
        let s = parse(json!({"cmd": "inject", "fault": "poll-error"})).unwrap();
        assert_eq!(s.fault, Fault::poll_error(-5));
        assert_eq!((s.trigger, s.limit), (Trigger::Now, Some(1)));
        let s = parse(json!({"fault": "slow-poll"})).unwrap();
        assert_eq!((s.trigger, s.limit), (Trigger::Every(1), None));
        assert_eq!(
            s.fault,
            Fault::SlowPoll {
                delay: DEFAULT_DELAY
            }
        );
        let s = parse(json!({"fault": "post-send-error", "every": 10})).unwrap();
        assert_eq!(
            s.fault,
            Fault::PostSendError {
                errno: libc::ENOMEM
            }
        );
        assert_eq!((s.trigger, s.limit), (Trigger::Every(10), None));
        let s = parse(json!({"fault": "lost-completion"})).unwrap();
        assert_eq!(s.fault, Fault::LostCompletion { cq: CqSel::Send });
    }

    #[test]
    fn every_trigger_and_option() {
        let s =
            parse(json!({"fault": "poll-error", "after": 1000, "ret": -22, "count": 3})).unwrap();
        assert_eq!(s.fault, Fault::poll_error(-22));
        assert_eq!((s.trigger, s.limit), (Trigger::After(1000), Some(3)));
        let s = parse(json!({"fault": "corrupt-rx", "probability": 0.25, "seed": 9, "bytes": 4}))
            .unwrap();
        assert_eq!(s.trigger, Trigger::Random { p: 0.25, seed: 9 });
        assert_eq!(s.fault, Fault::CorruptRx { bytes: 4 });
        let s = parse(json!({"fault": "async-fatal", "at_ms": 250, "event": "cq-error"})).unwrap();
        assert_eq!(s.trigger, Trigger::At(Duration::from_millis(250)));
        assert_eq!(
            s.fault,
            Fault::AsyncFatal {
                event: AsyncEvent::CqError
            }
        );
        let s = parse(json!({"fault": "qp-error", "event": "qp-fatal"})).unwrap();
        assert_eq!(s.fault, Fault::QpError { fatal_event: true });
        let s = parse(json!({"fault": "post-recv-error", "errno": "EINVAL"})).unwrap();
        assert_eq!(
            s.fault,
            Fault::PostRecvError {
                errno: libc::EINVAL
            }
        );
        let s = parse(json!({"fault": "post-recv-error", "errno": "5"})).unwrap();
        assert_eq!(s.fault, Fault::PostRecvError { errno: 5 });
        let s = parse(json!({"fault": "slow-poll", "delay_ms": 20, "count": "unlimited"})).unwrap();
        assert_eq!(
            s.fault,
            Fault::SlowPoll {
                delay: Duration::from_millis(20)
            }
        );
        assert_eq!(s.limit, None);
        let s = parse(json!({"fault": "lost-completion", "cq": "recv", "every": 2})).unwrap();
        assert_eq!(s.fault, Fault::LostCompletion { cq: CqSel::Recv });
        // A null is the same as absent.
        let s = parse(json!({"fault": "stall-send", "after": null, "count": null})).unwrap();
        assert_eq!(s, FaultSpec::new(Fault::StallSend));
    }

    #[test]
    fn junk_names_the_field() {
        let cases = [
            (json!({}), "fault"),
            (json!({"fault": 3}), "fault"),
            (json!({"fault": "meteor"}), "fault"),
            (json!({"fault": "poll-error", "typo": 1}), "typo"),
            (json!({"fault": "poll-error", "after": "x"}), "after"),
            (json!({"fault": "poll-error", "after": -1}), "after"),
            (json!({"fault": "poll-error", "after": 1.5}), "after"),
            (json!({"fault": "poll-error", "every": 0}), "every"),
            (
                json!({"fault": "poll-error", "after": 1, "every": 2}),
                "every",
            ),
            (
                json!({"fault": "poll-error", "at_ms": 99_999_999_999u64}),
                "at_ms",
            ),
            (
                json!({"fault": "poll-error", "probability": 0}),
                "probability",
            ),
            (
                json!({"fault": "poll-error", "probability": 1.5}),
                "probability",
            ),
            (
                json!({"fault": "poll-error", "probability": "half"}),
                "probability",
            ),
            (
                json!({"fault": "poll-error", "every": 3, "probability": 0.5}),
                "probability",
            ),
            (json!({"fault": "poll-error", "seed": 3}), "seed"),
            (
                json!({"fault": "poll-error", "probability": 0.5, "seed": -3}),
                "seed",
            ),
            (json!({"fault": "poll-error", "count": 0}), "count"),
            (json!({"fault": "poll-error", "count": "lots"}), "count"),
            (json!({"fault": "poll-error", "ret": 3}), "ret"),
            (json!({"fault": "poll-error", "ret": "x"}), "ret"),
            (
                json!({"fault": "poll-error", "ret": 99_999_999_999i64}),
                "ret",
            ),
            (json!({"fault": "slow-poll", "ret": -5}), "ret"),
            (json!({"fault": "post-send-error", "errno": 0}), "errno"),
            (
                json!({"fault": "post-send-error", "errno": "EWHAT"}),
                "errno",
            ),
            (json!({"fault": "poll-error", "errno": 5}), "errno"),
            (json!({"fault": "async-fatal", "event": "boom"}), "event"),
            (json!({"fault": "async-fatal", "event": 1}), "event"),
            (
                json!({"fault": "qp-error", "event": "device-fatal"}),
                "event",
            ),
            (json!({"fault": "corrupt-rx", "event": "qp-fatal"}), "event"),
            (json!({"fault": "slow-poll", "delay_ms": 0}), "delay_ms"),
            (
                json!({"fault": "slow-poll", "delay_ms": 60_000}),
                "delay_ms",
            ),
            (json!({"fault": "poll-error", "delay_ms": 5}), "delay_ms"),
            (json!({"fault": "corrupt-rx", "bytes": 0}), "bytes"),
            (json!({"fault": "corrupt-rx", "bytes": 65}), "bytes"),
            (json!({"fault": "stall-send", "bytes": 1}), "bytes"),
            (json!({"fault": "lost-completion", "cq": "both"}), "cq"),
            (json!({"fault": "qp-error", "cq": "send"}), "cq"),
        ];
        for (v, field) in cases {
            assert_eq!(field_of(v.clone()), field, "{v}");
            let msg = parse(v).unwrap_err().to_string();
            assert!(msg.contains(field), "{msg}");
        }
        assert!(FaultSpec::from_json(&json!([1])).is_err());
    }

    #[test]
    fn to_json_round_trips() {
        let mut specs = Vec::new();
        for k in FaultKind::ALL {
            let base = FaultSpec::new(Fault::default_for(k));
            specs.push(base);
            specs.push(base.trigger(Trigger::After(7)).limit(2));
            specs.push(base.trigger(Trigger::Every(3)));
            specs.push(
                base.trigger(Trigger::At(Duration::from_millis(40)))
                    .unlimited(),
            );
            specs.push(
                base.trigger(Trigger::Random { p: 0.125, seed: 77 })
                    .limit(9),
            );
        }
        specs.push(FaultSpec::new(Fault::QpError { fatal_event: true }));
        specs.push(FaultSpec::new(Fault::LostCompletion { cq: CqSel::Any }));
        specs.push(FaultSpec::new(Fault::AsyncFatal {
            event: AsyncEvent::DeviceRemoved,
        }));
        specs.push(FaultSpec {
            window: Some(Duration::from_millis(2000)),
            until_restart: true,
            ..FaultSpec::new(Fault::PollError {
                ret: -22,
                lose: 64,
                cq: CqSel::Recv,
            })
            .trigger(Trigger::Every(1))
        });
        for s in specs {
            let back = FaultSpec::from_json(&s.to_json()).unwrap();
            assert_eq!(back, s, "{}", s.to_json());
            assert!(s.to_string().starts_with(s.kind().name()));
        }
        let s = FaultSpec::new(Fault::poll_error(-5)).trigger(Trigger::After(1000));
        assert_eq!(s.to_string(), "poll-error (ret -5), after 1000, once");
    }

    #[test]
    fn a_poll_error_that_loses_completions_for_a_while() {
        let s = parse(
            json!({"fault": "poll-error", "every": 1, "cq": "recv", "lose": 64, "for_ms": 2000}),
        )
        .unwrap();
        assert_eq!(
            s.fault,
            Fault::PollError {
                ret: DEFAULT_POLL_RET,
                lose: 64,
                cq: CqSel::Recv
            }
        );
        assert_eq!(s.window, Some(Duration::from_millis(2000)));
        assert!(!s.until_restart);
        assert_eq!(
            s.to_string(),
            "poll-error (ret -5, recv CQ, losing up to 64 completions), every 1, until cleared, for 2000 ms from its first hit"
        );
        let s = parse(json!({"fault": "poll-error", "every": 1, "until_restart": true})).unwrap();
        assert!(s.until_restart && s.window.is_none());
        // Without a count, a one-shot trigger fires until the window or the QP ends it.
        let s = parse(json!({"fault": "poll-error", "after": 50, "for_ms": 2000})).unwrap();
        assert_eq!(s.limit, None);
        let s =
            parse(json!({"fault": "poll-error", "after": 50, "until_restart": true, "count": 3}))
                .unwrap();
        assert_eq!(s.limit, Some(3));
        for (bad, field) in [
            (json!({"fault": "poll-error", "lose": 5000}), "lose"),
            (json!({"fault": "poll-error", "lose": -1}), "lose"),
            (json!({"fault": "lost-completion", "lose": 1}), "lose"),
            (json!({"fault": "poll-error", "cq": "both"}), "cq"),
            (json!({"fault": "poll-error", "for_ms": 0}), "for_ms"),
            (
                json!({"fault": "poll-error", "until_restart": "yes"}),
                "until_restart",
            ),
        ] {
            let e = parse(bad.clone()).unwrap_err();
            assert_eq!(e.field, field, "{bad}: {e}");
        }
    }
}
