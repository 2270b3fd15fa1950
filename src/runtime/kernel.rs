//! Counters the kernel keeps about an interface outside the daemon, read from sysfs when
//! `stats` is asked for (never on the datapath): the TAP's own, where the kernel counts
//! frames it dropped before the daemon could read them (`tx_dropped`: the TAP's queue
//! was full), and the RDMA port's `hw_counters` (on rxe: packets received, `rdma_recvs`
//! that found a posted receive, and the rest). Packets lost there never reach the
//! daemon, so its own counters cannot show them. Beside them, where the port's netdev
//! does its receive work: with rxe that is where RoCE is received, and in softirq
//! context it also runs inside the restart supervisor's system calls (README, "Running
//! it on a real host").

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// The TAP's statistics shown (the names of `/sys/class/net/TAP/statistics/`).
pub const TAP_COUNTERS: [&str; 6] = [
    "rx_packets",
    "tx_packets",
    "rx_dropped",
    "tx_dropped",
    "rx_errors",
    "tx_errors",
];

/// What was read. A file that could not be read is named in `unreadable`, not guessed.
#[derive(Clone, Debug, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct KernelCounters {
    /// The TAP: `rx` is what the daemon wrote to it (towards the kernel's stack), `tx`
    /// what the kernel queued for the daemon to read.
    pub tap: BTreeMap<String, u64>,
    /// The RDMA port's `hw_counters`, every one the driver has (none on some drivers).
    pub port: BTreeMap<String, u64>,
    /// Files that could not be read or did not hold a number, with why.
    #[serde(default)]
    pub unreadable: Vec<String>,
    /// The port's netdev (RoCE; `None` for a port without one).
    #[serde(default)]
    pub netdev: Option<Netdev>,
}

/// A RoCE port's netdev, and how it does its receive work.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
pub struct Netdev {
    /// Its name (the port's GID entry 0's `ndevs`).
    pub name: String,
    /// Threaded NAPI (`/sys/class/net/NAME/threaded`): its receive work in kernel threads
    /// rather than in softirq context. `None` where the kernel has no such switch.
    pub napi_threaded: Option<bool>,
}

/// Read the counters of `tap` and of `device`'s `port` under `/sys`.
pub fn read(tap: &str, device: &str, port: u8) -> KernelCounters {
    read_under(Path::new("/sys"), tap, device, port)
}

/// [`read`] with another sysfs root (tests).
pub fn read_under(sys: &Path, tap: &str, device: &str, port: u8) -> KernelCounters {
    let mut k = KernelCounters::default();
    if valid_name(tap) {
        let dir = sys.join("class/net").join(tap).join("statistics");
        for name in TAP_COUNTERS {
            k.read_one(&dir.join(name), name, true);
        }
    } else {
        k.unreadable.push(format!("TAP name {tap:?}"));
    }
    if valid_name(device) {
        let port_dir = sys
            .join("class/infiniband")
            .join(device)
            .join("ports")
            .join(port.to_string());
        k.netdev = read_netdev(sys, &port_dir, &mut k.unreadable);
        let dir = port_dir.join("hw_counters");
        match std::fs::read_dir(&dir) {
            Ok(entries) => {
                let mut names: Vec<(String, PathBuf)> = entries
                    .filter_map(Result::ok)
                    .filter_map(|e| Some((e.file_name().into_string().ok()?, e.path())))
                    // `lifespan` is a setting (how long the driver caches the values).
                    .filter(|(n, _)| n != "lifespan")
                    .collect();
                names.sort();
                for (name, path) in names {
                    k.read_one(&path, &name, false);
                }
            }
            // A driver without hardware counters: nothing to show, nothing wrong.
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => k.unreadable.push(format!("{}: {e}", dir.display())),
        }
    } else {
        k.unreadable.push(format!("device name {device:?}"));
    }
    k
}

/// The netdev of the port at `port_dir`, if it has one (an InfiniBand port has none: its
/// `ndevs` entry is missing or refuses the read, EINVAL), and its threaded NAPI switch.
fn read_netdev(sys: &Path, port_dir: &Path, unreadable: &mut Vec<String>) -> Option<Netdev> {
    let path = port_dir.join("gid_attrs/ndevs/0");
    let name = match std::fs::read_to_string(&path) {
        Ok(n) => n.trim().to_string(),
        Err(e)
            if e.kind() == std::io::ErrorKind::NotFound
                || e.raw_os_error() == Some(libc::EINVAL) =>
        {
            return None;
        }
        Err(e) => {
            unreadable.push(format!("{}: {e}", path.display()));
            return None;
        }
    };
    if !valid_name(&name) {
        unreadable.push(format!("netdev name {name:?}"));
        return None;
    }
    let path = sys.join("class/net").join(&name).join("threaded");
    let napi_threaded = match std::fs::read_to_string(&path) {
        Ok(t) => match t.trim() {
            "0" => Some(false),
            // 2: threaded with busy polling (newer kernels).
            "1" | "2" => Some(true),
            other => {
                unreadable.push(format!("{}: not 0, 1 or 2: {other:?}", path.display()));
                None
            }
        },
        // A kernel before 5.12 has no switch: its receive work is in softirq context.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => {
            unreadable.push(format!("{}: {e}", path.display()));
            None
        }
    };
    Some(Netdev {
        name,
        napi_threaded,
    })
}

/// A name that is one path component.
fn valid_name(n: &str) -> bool {
    !n.is_empty() && n != "." && n != ".." && !n.contains('/') && !n.contains('\0')
}

impl KernelCounters {
    fn read_one(&mut self, path: &Path, name: &str, tap: bool) {
        let parsed = std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| {
                t.trim()
                    .parse::<u64>()
                    .map_err(|_| format!("not a number: {:?}", t.trim()))
            });
        match parsed {
            Ok(v) if tap => {
                self.tap.insert(name.to_string(), v);
            }
            Ok(v) => {
                self.port.insert(name.to_string(), v);
            }
            Err(why) => self.unreadable.push(format!("{}: {why}", path.display())),
        }
    }

    /// Lines for `uipoib stats`.
    pub fn to_text(&self, tap: &str, device: &str, port: u8) -> String {
        use std::fmt::Write as _;
        let mut s = String::new();
        let line = |s: &mut String, what: &str, m: &BTreeMap<String, u64>| {
            if m.is_empty() {
                return;
            }
            let _ = writeln!(s, "kernel {what}:");
            for (k, v) in m {
                let _ = writeln!(s, "  {k:<26} {v}");
            }
        };
        line(
            &mut s,
            &format!("TAP {tap} (tx: queued for the daemon)"),
            &self.tap,
        );
        line(
            &mut s,
            &format!("{device} port {port} hw_counters"),
            &self.port,
        );
        if let Some(n) = &self.netdev {
            let how = match n.napi_threaded {
                Some(true) => "in kernel threads (threaded NAPI)",
                Some(false) => "in softirq context (threaded NAPI off)",
                None => "in softirq context (no threaded NAPI switch)",
            };
            let _ = writeln!(
                s,
                "kernel {device} port {port} netdev {}: receive work {how}",
                n.name
            );
        }
        for u in &self.unreadable {
            let _ = writeln!(s, "kernel counter unreadable: {u}");
        }
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write(p: &Path, v: &str) {
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, v).unwrap();
    }

    #[test]
    fn reads_tap_and_port_counters_and_names_what_it_cannot() {
        let root = std::env::temp_dir().join(format!("uipoib-kernel-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        let st = root.join("class/net/uip0/statistics");
        for (n, v) in [
            ("rx_packets", "10\n"),
            ("tx_packets", "20\n"),
            ("rx_dropped", "0\n"),
            ("tx_dropped", "7\n"),
            ("rx_errors", "0\n"),
        ] {
            write(&st.join(n), v);
        }
        write(&st.join("tx_errors"), "junk\n");
        let hw = root.join("class/infiniband/rxe0/ports/1/hw_counters");
        write(&hw.join("rcvd_pkts"), "100\n");
        write(&hw.join("rdma_recvs"), "90\n");
        write(&hw.join("lifespan"), "10\n");
        let k = read_under(&root, "uip0", "rxe0", 1);
        assert_eq!(k.netdev, None, "no ndevs entry: no netdev");
        assert_eq!(k.tap["tx_dropped"], 7);
        assert_eq!(k.tap["rx_packets"], 10);
        assert!(!k.tap.contains_key("tx_errors"));
        assert_eq!(k.port.len(), 2, "{:?}", k.port);
        assert_eq!(k.port["rcvd_pkts"] - k.port["rdma_recvs"], 10);
        assert_eq!(k.unreadable.len(), 1, "{:?}", k.unreadable);
        assert!(k.unreadable[0].contains("tx_errors") && k.unreadable[0].contains("junk"));
        let text = k.to_text("uip0", "rxe0", 1);
        assert!(text.contains("kernel TAP uip0"), "{text}");
        assert!(text.contains("tx_dropped                 7"), "{text}");
        assert!(text.contains("rxe0 port 1 hw_counters"), "{text}");

        // The port's netdev and its receive work, as the kernel says; a kernel without the
        // switch; a value that is neither.
        write(
            &root.join("class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0"),
            "eth0\n",
        );
        let threaded = root.join("class/net/eth0/threaded");
        let said = |k: &KernelCounters| {
            k.to_text("uip0", "rxe0", 1)
                .lines()
                .find(|l| l.contains("netdev"))
                .map(str::to_string)
        };
        for (v, want, text) in [
            ("1\n", Some(true), "in kernel threads (threaded NAPI)"),
            ("2\n", Some(true), "in kernel threads (threaded NAPI)"),
            ("0\n", Some(false), "in softirq context (threaded NAPI off)"),
        ] {
            write(&threaded, v);
            let k = read_under(&root, "uip0", "rxe0", 1);
            let n = k.netdev.as_ref().expect("a netdev");
            assert_eq!((n.name.as_str(), n.napi_threaded), ("eth0", want));
            assert_eq!(
                said(&k).as_deref(),
                Some(format!("kernel rxe0 port 1 netdev eth0: receive work {text}").as_str())
            );
        }
        std::fs::remove_file(&threaded).unwrap();
        let k = read_under(&root, "uip0", "rxe0", 1);
        assert_eq!(k.netdev.as_ref().unwrap().napi_threaded, None);
        assert_eq!(
            k.unreadable.len(),
            1,
            "a missing switch is not an error: {k:?}"
        );
        assert!(said(&k).unwrap().ends_with("(no threaded NAPI switch)"));
        write(&threaded, "x\n");
        let k = read_under(&root, "uip0", "rxe0", 1);
        assert_eq!(k.netdev.as_ref().unwrap().napi_threaded, None);
        assert!(
            k.unreadable
                .iter()
                .any(|u| u.contains("threaded") && u.contains("\"x\"")),
            "{k:?}"
        );
        write(
            &root.join("class/infiniband/rxe0/ports/1/gid_attrs/ndevs/0"),
            "../x\n",
        );
        let k = read_under(&root, "uip0", "rxe0", 1);
        assert_eq!(k.netdev, None);
        assert!(
            k.unreadable.iter().any(|u| u.contains("netdev name")),
            "{k:?}"
        );

        // A port without hw_counters (an empty map, not an error), and names that are not
        // one path component.
        let k = read_under(&root, "../x", "rxe0", 2);
        assert!(k.tap.is_empty() && k.port.is_empty());
        assert_eq!(k.unreadable.len(), 1, "{:?}", k.unreadable);
        assert!(k.unreadable[0].contains("TAP name"));
        let k = read_under(&root, "uip0", "/", 1);
        assert!(
            k.unreadable.iter().any(|u| u.contains("device name")),
            "{k:?}"
        );
        std::fs::remove_dir_all(&root).unwrap();
    }
}
