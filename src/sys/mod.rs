//! The system calls the crate makes outside the verbs FFI, in one place: the TUN/TAP
//! ioctls ([`tap`]) and the process-level calls of the runtime and the scenario runner
//! ([`process`]: signals, the effective uid, a peer's uid or pid, the umask) and the
//! rtnetlink requests that configure a device ([`netdev`]). With
//! `src/verbs/rdma*`, this is the only code allowed `unsafe` (`Cargo.toml`'s `[lints]`
//! deny it elsewhere); every block says why it holds.
#![allow(unsafe_code)]

pub mod netdev;
pub mod process;
pub mod tap;

/// `e` prefixed with what failed (`TUNSETIFF: Operation not permitted`), its kind kept
/// (its errno is in the text only).
pub(crate) fn named(what: &str, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The last OS error, [`named`] after the call that failed.
pub(crate) fn last_error(call: &str) -> std::io::Error {
    named(call, std::io::Error::last_os_error())
}

/// Whether the tests run in CI (`CI` set, not empty, "0" or "false"), where a test that
/// cannot run fails instead of skipping.
#[cfg(test)]
pub(crate) fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}
