//! The systemd notification protocol (`sd_notify`), for `Type=notify` units: datagrams
//! of `KEY=VALUE` lines to the socket named by `NOTIFY_SOCKET` (a path, or `@name` for
//! an abstract socket). The daemon sends `READY=1` once every interface runs (its control
//! socket listening and its first poller started), `STATUS=` with the interfaces' states
//! as they change, `WATCHDOG=1` while no interface is dead (when the unit sets
//! `WatchdogSec=`), and `STOPPING=1` when it begins to stop. Without `NOTIFY_SOCKET`
//! nothing is sent.

use std::io;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// A connection to the service manager's notification socket.
#[derive(Debug)]
pub struct Notifier {
    sock: UnixDatagram,
    addr: SocketAddr,
}

impl Notifier {
    /// The notifier `NOTIFY_SOCKET` names, `None` when it is unset or empty.
    pub fn from_env() -> io::Result<Option<Notifier>> {
        match std::env::var_os("NOTIFY_SOCKET") {
            None => Ok(None),
            Some(v) if v.is_empty() => Ok(None),
            Some(v) => Notifier::to(&v.to_string_lossy()).map(Some),
        }
    }

    /// A notifier for the socket `name`: a path, or `@name` for an abstract socket.
    pub fn to(name: &str) -> io::Result<Notifier> {
        let addr = match name.strip_prefix('@') {
            Some(abs) => SocketAddr::from_abstract_name(abs.as_bytes())?,
            None if name.starts_with('/') => SocketAddr::from_pathname(name)?,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("NOTIFY_SOCKET={name:?} is neither an absolute path nor @abstract"),
                ));
            }
        };
        Ok(Notifier {
            sock: UnixDatagram::unbound()?,
            addr,
        })
    }

    /// Send `msg` (newline-separated `KEY=VALUE` lines) in one datagram.
    pub fn send(&self, msg: &str) -> io::Result<()> {
        self.sock
            .send_to_addr(msg.as_bytes(), &self.addr)
            .map(|_| ())
    }
}

/// How often to send `WATCHDOG=1`: half the `WATCHDOG_USEC` the service manager set (when
/// `WATCHDOG_PID`, if set, is this process), as sd_watchdog_enabled advises.
pub fn watchdog_interval() -> Option<Duration> {
    if let Ok(pid) = std::env::var("WATCHDOG_PID")
        && pid.trim() != std::process::id().to_string()
    {
        return None;
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.trim().parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// The `STATUS=` line for interfaces and their states: `uip0: running`, several joined
/// with `; `.
pub fn status_line<'a>(states: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let parts: Vec<String> = states
        .into_iter()
        .map(|(name, state)| format!("{name}: {state}"))
        .collect();
    format!("STATUS={}", parts.join("; "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datagrams_reach_a_fake_notify_socket() {
        let dir = std::env::temp_dir().join(format!("uipoib-notify-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        let n = Notifier::to(path.to_str().unwrap()).unwrap();
        n.send("READY=1\nSTATUS=uip0: running").unwrap();
        let mut buf = [0u8; 256];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"READY=1\nSTATUS=uip0: running");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_abstract_socket_works_and_junk_is_an_error() {
        let name = format!("uipoib-notify-test-{}", std::process::id());
        let server =
            UnixDatagram::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap())
                .unwrap();
        Notifier::to(&format!("@{name}"))
            .unwrap()
            .send("WATCHDOG=1")
            .unwrap();
        let mut buf = [0u8; 64];
        let len = server.recv(&mut buf).unwrap();
        assert_eq!(&buf[..len], b"WATCHDOG=1");
        let e = Notifier::to("relative/path").unwrap_err();
        assert!(e.to_string().contains("NOTIFY_SOCKET"), "{e}");
    }

    #[test]
    fn status_lines() {
        assert_eq!(status_line([("uip0", "running")]), "STATUS=uip0: running");
        assert_eq!(
            status_line([("uip0", "restarting"), ("uip1", "dead")]),
            "STATUS=uip0: restarting; uip1: dead"
        );
    }
}
