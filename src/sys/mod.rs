//! The system calls the crate makes outside the verbs FFI, in one place: the TUN/TAP
//! ioctls ([`tap`]) and the process-level calls of the runtime and the scenario runner
//! ([`process`]: signals, the effective uid, a peer's uid or pid, the umask). With
//! `src/verbs/rdma*`, this is the only code allowed `unsafe` (`Cargo.toml`'s `[lints]`
//! deny it elsewhere); every block says why it holds.
#![allow(unsafe_code)]

pub mod process;
pub mod tap;
