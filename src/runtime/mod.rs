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

/// Set the calling thread's nice level to `level`: the poller and the reaper do so first
/// thing, since they are spawned by a restart supervisor that may run above the daemon's
/// level. `iface` and `what` (the thread) name it in the warning if that fails: the
/// thread then runs at the level it inherited.
pub(crate) fn set_own_nice(iface: &str, what: &str, level: i32) {
    if let Err(e) = crate::sys::process::set_thread_nice(level) {
        tracing::warn!(%iface, error = %e, nice = level, "setting the {what} thread's nice level to the daemon's failed: it runs at the restart supervisor's");
    }
}
