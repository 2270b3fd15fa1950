//! The process-level system calls: a signal to a child's process group (or to one
//! process), and what the control socket and the scenario runner need (the effective
//! uid, a peer's uid or pid, the umask), and the nice level of the calling thread and
//! what the scheduler counted for it.

use std::io;
use std::os::fd::RawFd;

/// Send `signal` to the process group `pgid` (a child this process started as the
/// leader of a group of its own, so that what it runs gets the signal too).
pub fn kill_group(pgid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pgid)
        .ok()
        .filter(|p| *p > 0)
        .map(|p| -p)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pgid out of range"))?;
    kill(pid, signal)
}

/// Send `signal` to the one process `pid`.
pub fn kill_process(pid: u32, signal: libc::c_int) -> io::Result<()> {
    let pid = libc::pid_t::try_from(pid)
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "pid out of range"))?;
    kill(pid, signal)
}

fn kill(pid: libc::pid_t, signal: libc::c_int) -> io::Result<()> {
    // SAFETY: kill(2) takes two integers and touches no memory of this process; a pid
    // that no longer exists gives ESRCH.
    let r = unsafe { libc::kill(pid, signal) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The effective user id of this process.
pub fn euid() -> u32 {
    // SAFETY: geteuid(2) takes no arguments, touches no memory and cannot fail.
    unsafe { libc::geteuid() }
}

/// The user id of the process at the other end of a connected Unix stream socket, as
/// the kernel recorded it at `connect` (`SO_PEERCRED`): the peer cannot forge it.
pub fn peer_uid(fd: RawFd) -> io::Result<u32> {
    peer_cred(fd).map(|c| c.uid)
}

/// The process id at the other end of a connected Unix stream socket (`SO_PEERCRED`):
/// for a client, the process that called `listen` on the server's socket.
pub fn peer_pid(fd: RawFd) -> io::Result<u32> {
    peer_cred(fd).map(|c| c.pid as u32)
}

fn peer_cred(fd: RawFd) -> io::Result<libc::ucred> {
    let mut cred = libc::ucred {
        pid: 0,
        uid: 0,
        gid: 0,
    };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: SO_PEERCRED writes at most `len` bytes (the size of a `ucred`) through the
    // pointer, which points to a live local of that type, and stores the length written
    // in `len`, another live local; a descriptor that is not a Unix socket gives an
    // error (EBADF, ENOTSOCK, ENOPROTOOPT) and writes nothing.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    if len as usize != std::mem::size_of::<libc::ucred>() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!("SO_PEERCRED returned {len} bytes"),
        ));
    }
    Ok(cred)
}

/// Set the process's file mode creation mask and return the previous one. The mask is
/// process-wide: prefer [`with_umask`], which holds it only around one call.
pub fn set_umask(mask: u32) -> u32 {
    // SAFETY: umask(2) takes an integer, touches no memory and cannot fail.
    unsafe { libc::umask(mask as libc::mode_t) as u32 }
}

/// Serialises [`with_umask`] calls, so that two of them on different threads cannot
/// restore each other's mask.
static UMASK_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Run `f` with the file mode creation mask set to `mask`, then restore the previous
/// one. Files other threads create meanwhile get `mask` too, so `f` should be short
/// (one `bind`).
pub fn with_umask<T>(mask: u32, f: impl FnOnce() -> T) -> T {
    let _held = UMASK_LOCK.lock().unwrap_or_else(|p| p.into_inner());
    let old = set_umask(mask);
    let r = f();
    set_umask(old);
    r
}

/// The calling thread's id, as the scheduler's calls take it.
fn tid() -> libc::id_t {
    // SAFETY: gettid(2) takes no arguments, touches no memory and cannot fail.
    unsafe { libc::gettid() as libc::id_t }
}

/// The calling thread's nice level (-20..=19). On Linux the nice level is a thread's,
/// not the process's: `getpriority(PRIO_PROCESS, tid)` reads this thread's alone.
pub fn thread_nice() -> io::Result<i32> {
    // getpriority(2) may return -1 as a nice level: errno, cleared first, tells a failure.
    // SAFETY: __errno_location returns this thread's errno, valid for the thread's life;
    // getpriority takes two integers and touches no memory of this process.
    let r = unsafe {
        *libc::__errno_location() = 0;
        libc::getpriority(libc::PRIO_PROCESS, tid())
    };
    if r == -1 {
        let e = io::Error::last_os_error();
        if e.raw_os_error().unwrap_or(0) != 0 {
            return Err(e);
        }
    }
    Ok(r)
}

/// Set the calling thread's nice level (`setpriority(PRIO_PROCESS, tid)`); threads it
/// starts afterwards inherit it. Raising the priority (a lower level than the thread
/// has) needs `CAP_SYS_NICE` or a `RLIMIT_NICE` that allows it; lowering it never does.
pub fn set_thread_nice(level: i32) -> io::Result<()> {
    // SAFETY: setpriority(2) takes three integers and touches no memory of this process.
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid(), level) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Put the calling thread under `SCHED_BATCH` (its nice level kept): the scheduler then
/// lets a wake-up of this thread wait for the running task's turn instead of preempting
/// it. Allowed without privilege; threads it starts afterwards inherit it.
pub fn set_thread_batch() -> io::Result<()> {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler(2) reads one `sched_param` through the pointer, which
    // points to a live local; pid 0 is the calling thread.
    let r = unsafe { libc::sched_setscheduler(0, libc::SCHED_BATCH, &param) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// The calling thread's scheduling policy (`SCHED_OTHER`, `SCHED_BATCH`, ...).
pub fn thread_policy() -> io::Result<i32> {
    // SAFETY: sched_getscheduler(2) takes an integer and touches no memory; pid 0 is the
    // calling thread.
    let r = unsafe { libc::sched_getscheduler(0) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(r)
}

/// What the scheduler has counted for the calling thread: its time on a CPU
/// (`CLOCK_THREAD_CPUTIME_ID`, up to date when read) and its time runnable, waiting in a
/// run queue for one (`/proc/thread-self/schedstat`'s second field, complete while the
/// thread runs: it is added as the thread gets a CPU). Time in neither the thread slept
/// (blocked on I/O, a lock, another thread, a timer). `schedstat`'s first field is not
/// used: for a running thread it lags until the next tick or switch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedStat {
    /// Time on a CPU (ns), its system calls included.
    pub on_cpu_ns: u64,
    /// Time runnable but not running (ns).
    pub runqueue_ns: u64,
}

/// The calling thread's [`SchedStat`]. Fails where the kernel keeps no such account
/// (built without `CONFIG_SCHED_INFO`) or `/proc` is not mounted.
pub fn thread_schedstat() -> io::Result<SchedStat> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat")?;
    let runqueue_ns = parse_run_delay(&text).ok_or_else(|| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "/proc/thread-self/schedstat: not three numbers: {:?}",
                text.trim()
            ),
        )
    })?;
    Ok(SchedStat {
        on_cpu_ns: thread_cpu_ns()?,
        runqueue_ns,
    })
}

/// The calling thread's CPU time (ns), `clock_gettime(CLOCK_THREAD_CPUTIME_ID)`: the
/// kernel brings a running thread's count up to date for it.
fn thread_cpu_ns() -> io::Result<u64> {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime(2) writes one `timespec` through the pointer, which points to
    // a live local of that type.
    let r = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    if r < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
}

/// `schedstat`'s text (time on a CPU, time waiting in a run queue, both ns, and
/// timeslices): its second field, the run delay.
fn parse_run_delay(text: &str) -> Option<u64> {
    let mut f = text.split_whitespace().map(str::parse::<u64>);
    f.next()?.ok()?;
    let runqueue_ns = f.next()?.ok()?;
    f.next()?.ok()?;
    if f.next().is_some() {
        return None;
    }
    Some(runqueue_ns)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schedstat_is_three_numbers_and_anything_else_is_refused() {
        assert_eq!(parse_run_delay("1200 340 7\n"), Some(340));
        for bad in ["", "1 2", "1 2 3 4", "1 x 3", "-1 2 3"] {
            assert_eq!(parse_run_delay(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_thread_that_spins_is_counted_on_a_cpu_and_one_that_sleeps_is_not() {
        let Ok(before) = thread_schedstat() else {
            assert!(
                !crate::sys::in_ci(),
                "/proc/thread-self/schedstat is unreadable; CI is set, so this fails"
            );
            eprintln!("SKIPPED: no /proc/thread-self/schedstat");
            return;
        };
        let on = |a: SchedStat, b: SchedStat| b.on_cpu_ns - a.on_cpu_ns;
        // Spinning: the count grows by 20 ms of CPU within seconds, however busy the host.
        let spin = std::time::Instant::now();
        let mut x = 0u64;
        let spun = loop {
            for _ in 0..100_000 {
                x = std::hint::black_box(x.wrapping_add(1));
            }
            let now = thread_schedstat().unwrap();
            if on(before, now) >= 20_000_000 {
                break now;
            }
            assert!(
                spin.elapsed() < std::time::Duration::from_secs(20),
                "20 s of spinning counted {before:?} -> {now:?}"
            );
        };
        std::thread::sleep(std::time::Duration::from_millis(100));
        let slept = thread_schedstat().unwrap();
        // Sleeping 100 ms: the read and the wake-up, far under the time slept.
        assert!(on(spun, slept) < 50_000_000, "{spun:?} -> {slept:?}");
    }

    #[test]
    fn batch_is_the_calling_threads_alone_and_keeps_its_nice_level() {
        let mine = thread_policy().unwrap();
        let here = thread_nice().unwrap();
        let (policy, nice) = std::thread::spawn(|| {
            set_thread_batch().unwrap();
            (thread_policy().unwrap(), thread_nice().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(policy, libc::SCHED_BATCH);
        assert_eq!(nice, here);
        assert_eq!(thread_policy().unwrap(), mine, "the others keep theirs");
    }

    #[test]
    fn a_threads_nice_level_is_its_own_and_its_children_inherit_it() {
        let here = thread_nice().unwrap();
        // One level lower than this thread's: allowed without privilege.
        assert!(
            here < 19,
            "this test needs a nice level below 19, has {here}"
        );
        let lower = here + 1;
        let (set, child, after_child) = std::thread::spawn(move || {
            set_thread_nice(lower).unwrap();
            let set = thread_nice().unwrap();
            let child = std::thread::spawn(|| thread_nice().unwrap())
                .join()
                .unwrap();
            (set, child, thread_nice().unwrap())
        })
        .join()
        .unwrap();
        assert_eq!(set, lower);
        assert_eq!(
            child, lower,
            "a thread started after the change inherits it"
        );
        assert_eq!(after_child, lower);
        assert_eq!(
            thread_nice().unwrap(),
            here,
            "the other threads keep theirs"
        );
    }
}
