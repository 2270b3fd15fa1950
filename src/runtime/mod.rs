//! The threads and the process: the poller that runs an interface, the supervisor that
//! restarts it, the control socket, the daemon that wires them together, and the daemon's
//! configuration.

pub mod config;
pub mod control;
pub mod daemon;
pub mod kernel;
pub mod metrics;
pub mod notify;
pub mod poller;
pub mod supervisor;
