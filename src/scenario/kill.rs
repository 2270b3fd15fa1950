//! The `kill` step: find the daemon behind the control socket, send it a signal, wait
//! until it has exited, start it again the way it was started and wait until the new
//! one answers `running` on the control socket.
//!
//! The daemon is the process that listens on the control socket: a client's
//! `SO_PEERCRED` names it. Its command line, environment and working directory come
//! from `/proc/PID/{cmdline,environ,cwd}`; the new daemon gets the same three, no
//! terminal (stdin from /dev/null, stdout and stderr to the step's log) and a process
//! group of its own, so that it outlives the runner like the one it replaces. It is
//! started once the old daemon's TAP, if it was in the runner's network namespace, is
//! gone (the kernel removes it after the process has exited). It runs in the runner's
//! namespaces and cgroup, not necessarily the old one's: the runner belongs where the
//! daemon ran.

use std::ffi::OsString;
use std::fs::File;
use std::io::{self, BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use super::Kill;
use super::report::DaemonRestart;
use super::run::unix_ms;
use crate::runtime::supervisor::Status;
use crate::sys::process as sys;

/// How often the old daemon's exit and the new one's control socket are looked at.
const POLL: Duration = Duration::from_millis(10);

/// A process as `/proc` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Process {
    /// Its pid.
    pub pid: u32,
    /// Its command line.
    pub argv: Vec<OsString>,
    /// Its environment.
    pub env: Vec<(OsString, OsString)>,
    /// Its working directory.
    pub cwd: PathBuf,
}

/// Ask the control socket at `control` for the status, and say which process answered
/// (the one that listens on it).
pub fn answering(control: &Path) -> io::Result<(u32, Status)> {
    let stream = UnixStream::connect(control)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    let pid = sys::peer_pid(stream.as_raw_fd())?;
    writeln!(&stream, "{}", json!({"cmd": "status"}))?;
    let mut line = String::new();
    BufReader::new(&stream).read_line(&mut line)?;
    let v: Value = serde_json::from_str(&line)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e}: {line:?}")))?;
    let status = serde_json::from_value(v["status"].clone())
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("status: {e}")))?;
    Ok((pid, status))
}

/// What `/proc` says of `pid`.
pub fn process(pid: u32) -> io::Result<Process> {
    let dir = PathBuf::from(format!("/proc/{pid}"));
    let split = |b: Vec<u8>| -> Vec<Vec<u8>> {
        b.split(|c| *c == 0)
            .filter(|s| !s.is_empty())
            .map(<[u8]>::to_vec)
            .collect()
    };
    let argv: Vec<OsString> = split(std::fs::read(dir.join("cmdline"))?)
        .into_iter()
        .map(OsString::from_vec)
        .collect();
    if argv.is_empty() {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("pid {pid} has no command line (it has exited)"),
        ));
    }
    let env = split(std::fs::read(dir.join("environ"))?)
        .into_iter()
        .filter_map(|kv| {
            let i = kv.iter().position(|c| *c == b'=')?;
            Some((
                OsString::from_vec(kv[..i].to_vec()),
                OsString::from_vec(kv[i + 1..].to_vec()),
            ))
        })
        .collect();
    let cwd = std::fs::read_link(dir.join("cwd"))?;
    Ok(Process {
        pid,
        argv,
        env,
        cwd,
    })
}

/// Whether `pid` has exited: it is gone, or a zombie nobody has reaped yet.
pub fn exited(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(s) => s
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_none_or(|st| st == "Z" || st == "X"),
    }
}

/// Start `p` again: the same command line, environment and working directory, output
/// to `log`, in a process group of its own.
pub fn start_again(p: &Process, log: &Path) -> io::Result<Child> {
    let out = File::create(log)?;
    let err = out.try_clone()?;
    let arg0 = &p.argv[0];
    // A relative program path is the old process's, relative to its directory.
    let program = if arg0.as_bytes().contains(&b'/') {
        p.cwd.join(arg0)
    } else {
        PathBuf::from(arg0)
    };
    let mut c = std::process::Command::new(program);
    c.arg0(arg0)
        .args(&p.argv[1..])
        .env_clear()
        .envs(p.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&p.cwd)
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .process_group(0);
    c.spawn()
}

/// The last lines of a log, for an error message.
pub(super) fn tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().rev().take(3).collect();
    let t: Vec<&str> = lines.into_iter().rev().collect();
    if t.is_empty() {
        "no output".into()
    } else {
        t.join(" | ")
    }
}

/// The time of the first `interface up` line of a daemon's log (ms since the Unix
/// epoch), read from its leading RFC 3339 UTC timestamp (`2026-12-01T12:49:01.123456Z`),
/// colour codes ignored.
pub fn log_up_unix_ms(log: &Path) -> Option<u64> {
    let text = std::fs::read_to_string(log).ok()?;
    text.lines()
        .map(strip_ansi)
        .find(|l| l.contains("interface up"))
        .and_then(|l| l.split_whitespace().next().and_then(rfc3339_utc_ms))
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut it = s.chars();
    while let Some(c) = it.next() {
        if c == '\x1b' {
            // ESC [ ... final letter
            for d in it.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// `YYYY-MM-DDTHH:MM:SS[.frac]Z` as ms since the Unix epoch.
pub fn rfc3339_utc_ms(s: &str) -> Option<u64> {
    let s = s.strip_suffix('Z')?;
    let (date, time) = s.split_once('T')?;
    let mut d = date.splitn(3, '-').map(|x| x.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':').map(|x| x.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    if !(1..=12).contains(&m) || !(1..=31).contains(&day) || hh > 23 || mm > 59 || ss > 60 {
        return None;
    }
    let ms_frac: i64 = if frac.is_empty() {
        0
    } else {
        if !frac.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        format!("{frac:0<3}")[..3].parse().ok()?
    };
    // Days from the civil date (proleptic Gregorian), 1970-01-01 being day 0.
    let (y, m) = if m <= 2 { (y - 1, m + 9) } else { (y, m - 3) };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let ms = ((days * 24 + hh) * 60 + mm) * 60_000 + ss * 1000 + ms_frac;
    u64::try_from(ms).ok()
}

/// What the step did, and the new daemon (when one was started).
pub(super) struct Killed {
    pub(super) report: DaemonRestart,
    pub(super) child: Option<Child>,
}

/// Play a `kill` step against the daemon at `control`. `children` are daemons this
/// run started before (a kill of one of them reaps it). `exited_hook` runs once the old
/// daemon is gone, before the new one starts. The new daemon's output goes to the
/// step's `log`, or else to `uipoib-restarted-OLDPID.log` in the temporary directory.
pub(super) fn kill_and_restart(
    k: &Kill,
    control: &Path,
    children: &mut Vec<Child>,
    exited_hook: impl FnOnce(),
) -> Killed {
    let mut rep = DaemonRestart {
        signal: k.signal_name.clone(),
        ..DaemonRestart::default()
    };
    let fail = |mut rep: DaemonRestart, why: String| {
        rep.error = Some(why);
        Killed {
            report: rep,
            child: None,
        }
    };
    let (old, tap) = match answering(control).and_then(|(pid, st)| Ok((process(pid)?, st.tap))) {
        Ok(p) => p,
        Err(e) => {
            return fail(
                rep,
                format!("cannot find the daemon behind {}: {e}", control.display()),
            );
        }
    };
    rep.old_pid = Some(old.pid);
    let log = k
        .log
        .clone()
        .unwrap_or_else(|| std::env::temp_dir().join(format!("uipoib-restarted-{}.log", old.pid)));
    let log = log.as_path();
    rep.log = log.display().to_string();
    rep.argv = old
        .argv
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    rep.cwd = old.cwd.display().to_string();
    // The old daemon's TAP, when it is in this network namespace: the kernel removes
    // it after the process has gone, and a new daemon must not race its removal.
    let sys_tap = Some(Path::new("/sys/class/net").join(&tap))
        .filter(|p| !tap.is_empty() && !tap.contains('/') && p.exists());
    let t0 = Instant::now();
    rep.killed_unix_ms = Some(unix_ms());
    if let Err(e) = sys::kill_process(old.pid, k.signal) {
        return fail(rep, format!("kill -{} {}: {e}", k.signal_name, old.pid));
    }
    let ms = |t: Instant| t.duration_since(t0).as_secs_f64() * 1e3;
    // Exited: gone from /proc, a zombie, or a child of ours that wait reaps.
    let gone = |children: &mut Vec<Child>| {
        if let Some(i) = children.iter().position(|c| c.id() == old.pid) {
            if matches!(children[i].try_wait(), Ok(Some(_))) {
                // Reaped already: this wait returns the status at once.
                let _ = children.remove(i).wait();
                return true;
            }
            return false;
        }
        exited(old.pid)
    };
    while !gone(children) {
        if t0.elapsed() >= k.timeout {
            return fail(
                rep,
                format!(
                    "the daemon (pid {}) was still running {} ms after SIG{}",
                    old.pid,
                    k.timeout.as_millis(),
                    k.signal_name
                ),
            );
        }
        thread::sleep(POLL / 5);
    }
    let exited_at = Instant::now();
    rep.exited_unix_ms = Some(unix_ms());
    rep.exit_ms = Some(ms(exited_at));
    exited_hook();
    if let Some(p) = &sys_tap {
        // Bounded by the step's timeout; a TAP that stays (a persistent one) is the new
        // daemon's to take over.
        while p.exists() && exited_at.elapsed() < k.timeout {
            thread::sleep(POLL / 5);
        }
        if !p.exists() {
            rep.tap_gone_ms = Some(ms(Instant::now()));
        }
    }

    let mut child = match start_again(&old, log) {
        Ok(c) => c,
        Err(e) => {
            let why = format!("cannot start `{}` again: {e}", rep.argv.join(" "));
            return fail(rep, why);
        }
    };
    let pid = child.id();
    rep.new_pid = Some(pid);
    rep.started_unix_ms = Some(unix_ms());
    let started = Instant::now();
    let mut last;
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            rep.error = Some(format!(
                "the new daemon (pid {pid}) exited ({st}) before it answered `running` on {}: {}",
                control.display(),
                tail(log)
            ));
            return Killed {
                report: rep,
                child: None,
            };
        }
        match answering(control) {
            Ok((p, st)) if p == pid && st.state == "running" => break,
            Ok((p, st)) if p == pid => last = format!("state {}", st.state),
            Ok((p, _)) => last = format!("pid {p} answers, not the new daemon"),
            Err(e) => last = e.to_string(),
        }
        if started.elapsed() >= k.timeout {
            rep.error = Some(format!(
                "the new daemon (pid {pid}) did not answer `running` on {} within {} ms (last: {last}); its log: {}",
                control.display(),
                k.timeout.as_millis(),
                tail(log)
            ));
            return Killed {
                report: rep,
                child: Some(child),
            };
        }
        thread::sleep(POLL);
    }
    let up = Instant::now();
    rep.up_unix_ms = Some(unix_ms());
    rep.up_ms = Some(ms(up));
    rep.log_up_unix_ms = log_up_unix_ms(log);
    if let (Some(l), Some(k)) = (rep.log_up_unix_ms, rep.killed_unix_ms) {
        rep.log_up_ms = Some(l as f64 - k as f64);
    }
    Killed {
        report: rep,
        child: Some(child),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn log_timestamps_are_read_as_utc() {
        assert_eq!(rfc3339_utc_ms("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(rfc3339_utc_ms("1970-01-02T00:00:01.5Z"), Some(86_401_500));
        assert_eq!(
            rfc3339_utc_ms("2026-12-01T12:49:01.123456Z"),
            Some(1_796_129_341_123)
        );
        assert_eq!(
            rfc3339_utc_ms("2000-02-29T00:00:00Z"),
            Some(951_782_400_000)
        );
        assert_eq!(rfc3339_utc_ms("2026-12-01 12:49:01Z"), None);
        assert_eq!(rfc3339_utc_ms("2026-13-01T12:49:01Z"), None);
        assert_eq!(rfc3339_utc_ms("INFO"), None);
    }

    #[test]
    fn the_interface_up_line_gives_the_time() {
        let dir = std::env::temp_dir().join(format!("uipoib-logup-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("d.log");
        std::fs::write(
            &log,
            "2026-12-01T12:49:00.000000Z  INFO uipoib: starting\n\x1b[2m2026-12-01T12:49:01.250000Z\x1b[0m \x1b[32m INFO\x1b[0m uipoib::runtime::daemon: interface up tap=uip0\n",
        )
        .unwrap();
        assert_eq!(log_up_unix_ms(&log), Some(1_796_129_341_250));
        std::fs::write(&log, "nothing here\n").unwrap();
        assert_eq!(log_up_unix_ms(&log), None);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = process(std::process::id()).unwrap();
        assert_eq!(me.argv[0], std::env::args_os().next().unwrap());
        assert_eq!(me.cwd, std::env::current_dir().unwrap());
        assert!(!exited(std::process::id()));
        assert!(exited(u32::MAX / 2));
    }
}
