//! Fault injection, in one tree: which faults exist ([`spec`]), when an armed fault fires
//! ([`trigger`]), the seeded randomness behind both ([`rng`]), and the verbs decorator
//! that applies them to a live endpoint ([`decorator`]).
//!
//! `spec`, `trigger` and `rng` are pure: nothing there touches a verbs object, a socket
//! or the clock (`now` comes in as an argument). The decorator asks a
//! [`trigger::Schedule`] at each operation whether the fault fires and applies it; the
//! control socket and the CLI build a [`spec::FaultSpec`] from a request and refuse a bad
//! one naming the field that is wrong. Scripted runs of faults under load (scenario
//! files) are played from above, by the scenario runner, through the control socket.

pub mod decorator;
pub mod rng;
pub mod spec;
pub mod trigger;

pub use decorator::{FaultSwitch, FaultyProvider, Injection};
pub use rng::SplitMix64;
pub use spec::{CqSel, Fault, FaultKind, FaultSpec, SpecError};
pub use trigger::{Schedule, Trigger};
