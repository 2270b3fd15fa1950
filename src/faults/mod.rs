//! Fault injection: which faults exist, when an armed fault fires, and the seeded
//! randomness behind both.
//!
//! This module is pure: nothing here touches a verbs object, a socket or the clock
//! (`now` comes in as an argument). The fault-injecting verbs decorator
//! (`crate::verbs::fault`) asks a [`trigger::Schedule`] at each operation whether the
//! fault fires and applies it; the control socket and the CLI build a [`spec::FaultSpec`]
//! from a request and refuse a bad one naming the field that is wrong.

pub mod rng;
pub mod spec;
pub mod trigger;

pub use rng::SplitMix64;
pub use spec::{CqSel, Fault, FaultKind, FaultSpec, SpecError};
pub use trigger::{Schedule, Trigger};
