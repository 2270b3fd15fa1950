//! uipoib: a userspace IPoIB-like datapath. A TAP interface whose traffic is carried as
//! IPoIB over RDMA UD queue pairs, with a budgeted NAPI-style poll loop and a restart
//! supervisor that takes over an interface whose completion-queue poll failed.
//!
//! The layers, bottom up (imports point down only; docs/ARCHITECTURE.md walks them):
//! - [`wire`]: the codecs and the Ethernet ⇄ IPoIB translation, pure functions over bytes;
//! - [`verbs`]: the RDMA boundary (traits, libibverbs, retirement of replaced objects) and
//!   the fault-injecting decorator with its fault kinds and triggers;
//! - [`sys`]: the system calls outside the verbs FFI (TAP ioctls, signals, peer
//!   credentials), the only other code exempt from the crate's lint against raw FFI
//!   blocks (Cargo.toml `[lints]`);
//! - [`tap`]: the TAP device and its frame I/O;
//! - [`iface`]: one interface's logic: receive and send paths, the NAPI budget, the
//!   work-request ledger, neighbours, counters and the restart state machine, no threads;
//! - [`runtime`]: the threads: poller, supervisor, control socket, the daemon;
//! - [`scenario`]: scripted fault runs, a client of the control socket.

#![warn(missing_docs)]

pub mod iface;
pub mod runtime;
pub mod scenario;
pub mod sys;
pub mod tap;
pub mod verbs;
pub mod wire;
