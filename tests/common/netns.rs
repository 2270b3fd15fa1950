//! Network namespaces and child processes for the tests that run real TAPs (as root).

use std::process::{Child, Command, Output};

/// A network namespace of the test's own, with `lo` up; deleted when dropped (a stale one
/// of the same name is deleted first).
pub struct Netns(pub String);

impl Netns {
    pub fn new(name: &str) -> Netns {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        for args in [
            &["netns", "add", name][..],
            &["-n", name, "link", "set", "lo", "up"][..],
        ] {
            let out = Command::new("ip").args(args).output().expect("running ip");
            assert!(
                out.status.success(),
                "ip {args:?} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Netns(name.to_string())
    }

    /// `ip netns exec NAME ARGS...`, its output.
    pub fn exec(&self, args: &[&str]) -> Output {
        Command::new("ip")
            .args(["netns", "exec", &self.0])
            .args(args)
            .output()
            .expect("running ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.0]).output();
    }
}

/// A child killed and reaped when dropped (a daemon, a ping).
pub struct Daemon(pub Child);

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `CI` is set (to anything but empty, `0` or `false`).
pub fn is_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// Why namespaces with TAPs cannot be made here, if they cannot: root (read from
/// /proc/self/status, `Uid:` real, effective, saved, fs) and /dev/net/tun.
pub fn root_or_tun_missing() -> Option<String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let uid0 = status
        .lines()
        .find(|l| l.starts_with("Uid:"))
        .is_some_and(|l| l.split_whitespace().nth(2) == Some("0"));
    if !uid0 {
        return Some("not running as root (network namespaces and TAP devices need it)".into());
    }
    if !std::path::Path::new("/dev/net/tun").exists() {
        return Some("/dev/net/tun is missing".into());
    }
    None
}
