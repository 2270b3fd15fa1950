//! The operating-system calls the crate makes outside the verbs FFI: one TUN/TAP ioctl
//! and a signal to a child process. Like `verbs::rdma`, this module is allowed `unsafe`;
//! every block says why it holds.
#![allow(unsafe_code)]

use std::io;
use std::os::fd::RawFd;

/// `TUNSETCARRIER` on a TUN/TAP descriptor (Linux 5.0 and later): the link carrier on or
/// off.
pub fn tun_set_carrier(fd: RawFd, on: bool) -> io::Result<()> {
    let value: libc::c_int = on.into();
    // SAFETY: TUNSETCARRIER reads one `c_int` through the pointer, which points to a live
    // local for the duration of the call; a descriptor that is not an open TUN/TAP fd
    // makes the kernel return an error (EBADF, ENOTTY), never touch other memory.
    let r = unsafe { libc::ioctl(fd, libc::TUNSETCARRIER, &value as *const libc::c_int) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Send `signal` to the process group `pgid` (a child this process started as the
/// leader of a group of its own, so that what it runs gets the signal too).
pub fn kill_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pgid)
        .ok()
        .filter(|p| *p > 0)
        .map(|p| -p)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pgid out of range"))?;
    // SAFETY: kill(2) takes two integers and touches no memory of this process; a pid
    // that no longer exists gives ESRCH.
    let r = unsafe { libc::kill(pid, signal) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}
