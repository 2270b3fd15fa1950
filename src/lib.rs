//! uipoib: a userspace IPoIB-like datapath. A TAP interface whose traffic is carried as
//! IPoIB over RDMA UD queue pairs, with a budgeted NAPI-style poll loop and a restart
//! supervisor that takes over an interface whose completion-queue poll failed.
#![deny(unsafe_code)]
#![warn(missing_docs)]

pub mod config;
pub mod control;
pub mod daemon;
pub mod datapath;
pub mod faults;
pub mod ledger;
pub mod napi;
pub mod neigh;
pub mod poller;
pub mod scenario;
pub mod stats;
pub mod supervisor;
pub mod sys;
pub mod tap;
pub mod verbs;
pub mod wire;
