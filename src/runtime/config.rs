//! Configuration: every `uipoib up` flag has a key in the TOML file, and the flags win.
//!
//! This module owns parsing and validation only. A bad value is a [`ConfigError`] naming
//! the key (and, for a file, where it is); nothing here opens a device or a TAP.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::iface::Params;
use crate::verbs::{EndpointConfig, Gid};
use crate::wire::ipoib;
use crate::wire::ipv4::Ipv4Cidr;

/// Receive completions handled per poll before the poller yields to TX and other work.
/// 64 is the kernel's NAPI weight for IPoIB: large enough to amortise the arm/re-poll
/// cost, small enough that a receive burst cannot starve the TAP reader.
pub const DEFAULT_BUDGET: u32 = 64;

/// Receive ring size, a power of two (the kernel's IPoIB uses 256 and allows up to 8192).
/// 4096: in the rxe lab (`scripts/perf`, UDP offered at the verbs limit) a 512 ring ran
/// dry while the poller was off the CPU, and rxe dropped 5-20% of the datagrams that
/// reached the receiver (its `rcvd_pkts` above `rdma_recvs`) in every rep of two runs; at
/// 4096 it dropped none in 9 of 10 reps. It absorbs bursts, it cannot make up for a
/// receiver short of CPU (at ~5,600 datagrams/s rxe still dropped 15-35%). TCP did not
/// move measurably. It costs 4096 x (40 + MTU) bytes of registered memory: 17 MiB at a
/// 4096-byte MTU.
pub const DEFAULT_RECV_RING: u32 = 4096;

/// Send ring size: the kernel's IPoIB uses 128; 256 lets one TAP read burst fill a chain.
pub const DEFAULT_SEND_RING: u32 = 256;

/// Completions fetched per `ibv_poll_cq` call. The kernel's IPoIB polls 4 at a time for
/// receive; a larger batch amortises the provider's lock and ring accesses: 16. (In the
/// rxe lab a receiving daemon handled 20-35 completions per poll, two or three calls;
/// rxe's `ibv_poll_cq` reads a ring shared with the kernel.)
pub const DEFAULT_POLL_BATCH: u32 = 16;

/// Frames read from the TAP (and posted as one chain) per turn of the loop. Not binding
/// in the rxe lab: a TCP sender's daemon found 7-9 frames per turn (0.11-0.15 polls per
/// packet, `scripts/perf`), so a larger batch would not lengthen the chains there.
pub const DEFAULT_TX_BATCH: u32 = 32;

/// Most neighbours kept; the least recently seen is evicted beyond this.
pub const DEFAULT_NEIGH_CAPACITY: u32 = 4096;

/// A neighbour not heard from for this long is dropped (re-resolved by ARP on next use).
pub const DEFAULT_NEIGH_MAX_AGE: Duration = Duration::from_secs(300);

/// The Q_Key the kernel's IPoIB uses for its broadcast group.
pub const DEFAULT_QKEY: u32 = 0x0B1B;

/// The broadcast group: an IPv4-mapped multicast GID (what RoCE can carry). 239/8 is the
/// administratively scoped range; the group never leaves the RDMA link.
pub const DEFAULT_GROUP: Ipv4Addr = Ipv4Addr::new(239, 18, 0, 1);

/// TAP offloads on: one read takes up to 64 KiB of a TCP stream (cut into segments here)
/// instead of one MTU. See docs/PERFORMANCE.md for what it changes.
pub const DEFAULT_TAP_OFFLOAD: bool = true;

/// Send-stall watchdog. The kernel's IPoIB uses a 1 s netdev watchdog; emulated lab
/// guests stall for longer than that under load without anything being wrong, so 3 s.
pub const DEFAULT_TX_TIMEOUT: Duration = Duration::from_secs(3);

/// Circuit breaker: this many restarts within [`DEFAULT_RESTART_WINDOW`] declare the
/// interface dead until an operator restart or the device's return.
pub const DEFAULT_RESTART_MAX: u32 = 10;

/// The circuit breaker's window.
pub const DEFAULT_RESTART_WINDOW: Duration = Duration::from_secs(60);

/// First delay between consecutive failed restart attempts; doubles up to
/// [`DEFAULT_BACKOFF_MAX`]. The first restart after a healthy period is immediate.
pub const DEFAULT_BACKOFF_INITIAL: Duration = Duration::from_millis(10);

/// Longest delay between restart attempts (and between polls for a returning device).
pub const DEFAULT_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// Largest IPoIB MTU: a 4096-byte port MTU minus the 4-byte IPoIB header.
pub const MAX_IPOIB_MTU: u32 = 4092;

/// Smallest IPoIB MTU accepted: IPv4 needs 68.
pub const MIN_IPOIB_MTU: u32 = 68;

/// A configuration problem, naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read config file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not valid TOML for this schema (the message names line and key).
    #[error("config file {path}: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// The parser's message, with line, column and key.
        message: String,
    },
    /// A value out of range or missing.
    #[error("invalid {key}: {why}")]
    Invalid {
        /// The key (same name in the file and as a flag).
        key: &'static str,
        /// Why.
        why: String,
    },
}

/// The `[interface]` keys of a config file; every field is optional there.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    /// RDMA device name.
    pub device: Option<String>,
    /// Port number.
    pub port: Option<u8>,
    /// GID index.
    pub gid_index: Option<u8>,
    /// TAP name.
    pub tap: Option<String>,
    /// Address/prefix.
    pub addr: Option<String>,
    /// IPoIB MTU.
    pub mtu: Option<u32>,
    /// Poll budget.
    pub budget: Option<u32>,
    /// Control socket path.
    pub control: Option<PathBuf>,
    /// Receive ring size.
    pub recv_ring: Option<u32>,
    /// Send ring size.
    pub send_ring: Option<u32>,
    /// Completions per `ibv_poll_cq`.
    pub poll_batch: Option<u32>,
    /// Frames per TX turn.
    pub tx_batch: Option<u32>,
    /// Q_Key.
    pub qkey: Option<u32>,
    /// Broadcast group (IPv4 multicast address or a multicast GID).
    pub group: Option<String>,
    /// Neighbour table size.
    pub neigh_capacity: Option<u32>,
    /// Neighbour max age in seconds.
    pub neigh_max_age_secs: Option<u64>,
    /// Send-stall watchdog in milliseconds.
    pub tx_timeout_ms: Option<u64>,
    /// Circuit breaker: restarts allowed within the window.
    pub restart_max: Option<u32>,
    /// Circuit breaker window in seconds.
    pub restart_window_secs: Option<u64>,
    /// First backoff between failed restart attempts, in milliseconds.
    pub backoff_initial_ms: Option<u64>,
    /// Longest backoff, in milliseconds.
    pub backoff_max_ms: Option<u64>,
    /// TAP checksum and TCP segmentation offload (`IFF_VNET_HDR`).
    pub tap_offload: Option<bool>,
    /// Serve fault injection on the control socket.
    pub allow_faults: Option<bool>,
}

impl FileConfig {
    /// Read and parse a config file.
    pub fn load(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(&text).map_err(|message| ConfigError::Parse {
            path: path.to_owned(),
            message,
        })
    }

    /// Parse config text (the `[interface]` table, or the keys at top level).
    pub fn parse(text: &str) -> Result<Self, String> {
        #[derive(Deserialize)]
        #[serde(deny_unknown_fields)]
        struct Wrapped {
            interface: FileConfig,
        }
        let value: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        if value.contains_key("interface") {
            toml::from_str::<Wrapped>(text)
                .map(|w| w.interface)
                .map_err(|e| e.to_string())
        } else {
            toml::from_str::<FileConfig>(text).map_err(|e| e.to_string())
        }
    }

    /// Fill every unset key of `self` from `other`.
    pub fn or(self, other: FileConfig) -> FileConfig {
        FileConfig {
            device: self.device.or(other.device),
            port: self.port.or(other.port),
            gid_index: self.gid_index.or(other.gid_index),
            tap: self.tap.or(other.tap),
            addr: self.addr.or(other.addr),
            mtu: self.mtu.or(other.mtu),
            budget: self.budget.or(other.budget),
            control: self.control.or(other.control),
            recv_ring: self.recv_ring.or(other.recv_ring),
            send_ring: self.send_ring.or(other.send_ring),
            poll_batch: self.poll_batch.or(other.poll_batch),
            tx_batch: self.tx_batch.or(other.tx_batch),
            qkey: self.qkey.or(other.qkey),
            group: self.group.or(other.group),
            neigh_capacity: self.neigh_capacity.or(other.neigh_capacity),
            neigh_max_age_secs: self.neigh_max_age_secs.or(other.neigh_max_age_secs),
            tx_timeout_ms: self.tx_timeout_ms.or(other.tx_timeout_ms),
            restart_max: self.restart_max.or(other.restart_max),
            restart_window_secs: self.restart_window_secs.or(other.restart_window_secs),
            backoff_initial_ms: self.backoff_initial_ms.or(other.backoff_initial_ms),
            backoff_max_ms: self.backoff_max_ms.or(other.backoff_max_ms),
            tap_offload: self.tap_offload.or(other.tap_offload),
            allow_faults: self.allow_faults.or(other.allow_faults),
        }
    }
}

/// A validated interface configuration.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// RDMA device name.
    pub device: String,
    /// Port number (1-based).
    pub port: u8,
    /// GID index; `None` picks the first RoCEv2 IPv4-mapped GID.
    pub gid_index: Option<u8>,
    /// TAP device name.
    pub tap: String,
    /// Interface address.
    pub addr: Ipv4Cidr,
    /// IPoIB MTU; `None` means the port's active MTU minus 4.
    pub mtu: Option<u32>,
    /// Receive completions per poll.
    pub budget: u32,
    /// Control socket path.
    pub control: PathBuf,
    /// Receive ring size.
    pub recv_ring: u32,
    /// Send ring size.
    pub send_ring: u32,
    /// Completions per `ibv_poll_cq` call.
    pub poll_batch: u32,
    /// Frames read from the TAP per turn.
    pub tx_batch: u32,
    /// Q_Key.
    pub qkey: u32,
    /// Broadcast group GID.
    pub group: Gid,
    /// Neighbour table capacity.
    pub neigh_capacity: u32,
    /// Neighbour max age.
    pub neigh_max_age: Duration,
    /// Send-stall watchdog.
    pub tx_timeout: Duration,
    /// TAP checksum and TCP segmentation offload.
    pub tap_offload: bool,
    /// Restart policy.
    pub restart: RestartPolicy,
    /// The control socket serves `inject`, `clear` and `faults` (off unless asked for:
    /// a fault breaks the interface on purpose).
    pub allow_faults: bool,
}

/// When and how often the supervisor restarts an interface.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestartPolicy {
    /// Restarts allowed within `window` before the interface is declared dead.
    pub max_restarts: u32,
    /// The circuit breaker's window.
    pub window: Duration,
    /// First backoff between consecutive failed attempts.
    pub backoff_initial: Duration,
    /// Longest backoff.
    pub backoff_max: Duration,
}

impl Default for RestartPolicy {
    fn default() -> Self {
        RestartPolicy {
            max_restarts: DEFAULT_RESTART_MAX,
            window: DEFAULT_RESTART_WINDOW,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }
}

/// Default control socket for a TAP name.
pub fn default_control_path(tap: &str) -> PathBuf {
    PathBuf::from(format!("/run/uipoib/{tap}.sock"))
}

fn check_range(key: &'static str, v: u32, lo: u32, hi: u32) -> Result<u32, ConfigError> {
    if v < lo || v > hi {
        return Err(ConfigError::Invalid {
            key,
            why: format!("{v} is outside {lo}..={hi}"),
        });
    }
    Ok(v)
}

fn parse_group(s: &str) -> Result<Gid, ConfigError> {
    let gid: Gid = s.parse().map_err(|_| ConfigError::Invalid {
        key: "group",
        why: format!("{s:?} is neither an IPv4 address nor a GID"),
    })?;
    if !gid.is_multicast() {
        return Err(ConfigError::Invalid {
            key: "group",
            why: format!("{s} is not a multicast address"),
        });
    }
    Ok(gid)
}

/// A valid Linux interface name: 1..=15 bytes, no `/`, whitespace or NUL.
pub fn check_ifname(key: &'static str, name: &str) -> Result<(), ConfigError> {
    let ok = !name.is_empty()
        && name.len() <= 15
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'/' && b != b':');
    if ok {
        Ok(())
    } else {
        Err(ConfigError::Invalid {
            key,
            why: format!(
                "{name:?} is not a valid interface name (1-15 printable characters, no '/' or ':')"
            ),
        })
    }
}

impl Config {
    /// Validate a merged set of keys.
    pub fn from_file_config(f: FileConfig) -> Result<Config, ConfigError> {
        let missing = |key| ConfigError::Invalid {
            key,
            why: "missing (give the flag or the config key)".into(),
        };
        let device = f.device.ok_or_else(|| missing("device"))?;
        if device.is_empty() {
            return Err(ConfigError::Invalid {
                key: "device",
                why: "empty".into(),
            });
        }
        let tap = f.tap.ok_or_else(|| missing("tap"))?;
        check_ifname("tap", &tap)?;
        let addr_s = f.addr.ok_or_else(|| missing("addr"))?;
        let addr: Ipv4Cidr = addr_s
            .parse()
            .map_err(|why| ConfigError::Invalid { key: "addr", why })?;
        if addr.prefix > 30 {
            return Err(ConfigError::Invalid {
                key: "addr",
                why: format!("prefix /{} leaves no room for a peer", addr.prefix),
            });
        }
        let port = f.port.unwrap_or(1);
        if port == 0 {
            return Err(ConfigError::Invalid {
                key: "port",
                why: "ports are numbered from 1".into(),
            });
        }
        let mtu = match f.mtu {
            Some(m) => Some(check_range("mtu", m, MIN_IPOIB_MTU, MAX_IPOIB_MTU)?),
            None => None,
        };
        let ring = |key, v: Option<u32>, d| -> Result<u32, ConfigError> {
            let v = check_range(key, v.unwrap_or(d), 2, 16384)?;
            if !v.is_power_of_two() {
                return Err(ConfigError::Invalid {
                    key,
                    why: format!("{v} is not a power of two"),
                });
            }
            Ok(v)
        };
        let recv_ring = ring("recv-ring", f.recv_ring, DEFAULT_RECV_RING)?;
        let send_ring = ring("send-ring", f.send_ring, DEFAULT_SEND_RING)?;
        let budget = check_range("budget", f.budget.unwrap_or(DEFAULT_BUDGET), 1, recv_ring)?;
        let poll_batch = check_range(
            "poll-batch",
            f.poll_batch.unwrap_or(DEFAULT_POLL_BATCH),
            1,
            256,
        )?;
        let tx_batch = check_range(
            "tx-batch",
            f.tx_batch.unwrap_or(DEFAULT_TX_BATCH.min(send_ring)),
            1,
            send_ring,
        )?;
        let qkey = f.qkey.unwrap_or(DEFAULT_QKEY);
        if qkey & 0x8000_0000 != 0 {
            return Err(ConfigError::Invalid {
                key: "qkey",
                why: format!(
                    "{qkey:#x} has the high bit set (a controlled Q_Key, not allowed for UD sends)"
                ),
            });
        }
        let group = match f.group {
            Some(g) => parse_group(&g)?,
            None => Gid::from_ipv4(DEFAULT_GROUP),
        };
        let neigh_capacity = check_range(
            "neigh-capacity",
            f.neigh_capacity.unwrap_or(DEFAULT_NEIGH_CAPACITY),
            1,
            1 << 20,
        )?;
        let age = f
            .neigh_max_age_secs
            .unwrap_or(DEFAULT_NEIGH_MAX_AGE.as_secs());
        if age == 0 || age > 86_400 {
            return Err(ConfigError::Invalid {
                key: "neigh-max-age-secs",
                why: format!("{age} is outside 1..=86400"),
            });
        }
        let ms = |key: &'static str, v: Option<u64>, d: Duration, lo: u64, hi: u64| {
            let v = v.unwrap_or(d.as_millis() as u64);
            if v < lo || v > hi {
                return Err(ConfigError::Invalid {
                    key,
                    why: format!("{v} is outside {lo}..={hi}"),
                });
            }
            Ok(Duration::from_millis(v))
        };
        let tx_timeout = ms(
            "tx-timeout-ms",
            f.tx_timeout_ms,
            DEFAULT_TX_TIMEOUT,
            100,
            600_000,
        )?;
        let backoff_initial = ms(
            "backoff-initial-ms",
            f.backoff_initial_ms,
            DEFAULT_BACKOFF_INITIAL,
            1,
            60_000,
        )?;
        let backoff_max = ms(
            "backoff-max-ms",
            f.backoff_max_ms,
            DEFAULT_BACKOFF_MAX,
            1,
            600_000,
        )?;
        if backoff_max < backoff_initial {
            return Err(ConfigError::Invalid {
                key: "backoff-max-ms",
                why: "smaller than backoff-initial-ms".into(),
            });
        }
        let max_restarts = check_range(
            "restart-max",
            f.restart_max.unwrap_or(DEFAULT_RESTART_MAX),
            1,
            1_000_000,
        )?;
        let window_s = f
            .restart_window_secs
            .unwrap_or(DEFAULT_RESTART_WINDOW.as_secs());
        if window_s == 0 || window_s > 86_400 {
            return Err(ConfigError::Invalid {
                key: "restart-window-secs",
                why: format!("{window_s} is outside 1..=86400"),
            });
        }
        let control = f.control.unwrap_or_else(|| default_control_path(&tap));
        Ok(Config {
            device,
            port,
            gid_index: f.gid_index,
            tap,
            addr,
            mtu,
            budget,
            control,
            recv_ring,
            send_ring,
            poll_batch,
            tx_batch,
            qkey,
            group,
            neigh_capacity,
            neigh_max_age: Duration::from_secs(age),
            tx_timeout,
            tap_offload: f.tap_offload.unwrap_or(DEFAULT_TAP_OFFLOAD),
            allow_faults: f.allow_faults.unwrap_or(false),
            restart: RestartPolicy {
                max_restarts,
                window: Duration::from_secs(window_s),
                backoff_initial,
                backoff_max,
            },
        })
    }
}

impl Config {
    /// Parameters from a validated configuration.
    pub fn interface_params(&self) -> Params {
        Params {
            addr: self.addr,
            mtu: self.mtu,
            qkey: self.qkey,
            group: self.group,
            budget: self.budget,
            poll_batch: self.poll_batch,
            tx_batch: self.tx_batch,
            endpoint: EndpointConfig {
                device: self.device.clone(),
                port: self.port,
                gid_index: self.gid_index,
                qkey: self.qkey,
                recv_slots: self.recv_ring,
                send_slots: self.send_ring,
                max_payload: self.mtu.map(|m| m + ipoib::HEADER_LEN as u32),
            },
            neigh_capacity: self.neigh_capacity,
            neigh_max_age: self.neigh_max_age,
            tx_timeout: self.tx_timeout,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> FileConfig {
        FileConfig {
            device: Some("rxe0".into()),
            tap: Some("uip0".into()),
            addr: Some("198.18.1.1/24".into()),
            ..Default::default()
        }
    }

    #[test]
    fn defaults_fill_in() {
        let c = Config::from_file_config(base()).unwrap();
        assert_eq!(c.port, 1);
        assert_eq!(c.budget, DEFAULT_BUDGET);
        assert_eq!(c.control, PathBuf::from("/run/uipoib/uip0.sock"));
        assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
        assert_eq!(c.addr.addr, Ipv4Addr::new(198, 18, 1, 1));
        assert_eq!(c.addr.prefix, 24);
    }

    #[test]
    fn each_bad_value_names_its_key() {
        let cases: Vec<(FileConfig, &str)> = vec![
            (
                FileConfig {
                    addr: Some("198.18.1.1".into()),
                    ..base()
                },
                "addr",
            ),
            (
                FileConfig {
                    addr: Some("198.18.1.999/24".into()),
                    ..base()
                },
                "addr",
            ),
            (
                FileConfig {
                    addr: Some("198.18.1.1/33".into()),
                    ..base()
                },
                "addr",
            ),
            (
                FileConfig {
                    addr: Some("224.0.0.1/24".into()),
                    ..base()
                },
                "addr",
            ),
            (
                FileConfig {
                    addr: Some("198.18.1.1/31".into()),
                    ..base()
                },
                "addr",
            ),
            (
                FileConfig {
                    mtu: Some(9000),
                    ..base()
                },
                "mtu",
            ),
            (
                FileConfig {
                    mtu: Some(10),
                    ..base()
                },
                "mtu",
            ),
            (
                FileConfig {
                    budget: Some(0),
                    ..base()
                },
                "budget",
            ),
            (
                FileConfig {
                    budget: Some(100_000),
                    ..base()
                },
                "budget",
            ),
            (
                FileConfig {
                    recv_ring: Some(300),
                    ..base()
                },
                "recv-ring",
            ),
            (
                FileConfig {
                    send_ring: Some(1),
                    ..base()
                },
                "send-ring",
            ),
            (
                FileConfig {
                    port: Some(0),
                    ..base()
                },
                "port",
            ),
            (
                FileConfig {
                    qkey: Some(0x8000_0001),
                    ..base()
                },
                "qkey",
            ),
            (
                FileConfig {
                    group: Some("198.18.0.1".into()),
                    ..base()
                },
                "group",
            ),
            (
                FileConfig {
                    group: Some("nonsense".into()),
                    ..base()
                },
                "group",
            ),
            (
                FileConfig {
                    tap: Some("a/b".into()),
                    ..base()
                },
                "tap",
            ),
            (
                FileConfig {
                    tap: Some("waytoolonginterfacename".into()),
                    ..base()
                },
                "tap",
            ),
            (
                FileConfig {
                    tap: None,
                    ..base()
                },
                "tap",
            ),
            (
                FileConfig {
                    device: None,
                    ..base()
                },
                "device",
            ),
            (
                FileConfig {
                    neigh_max_age_secs: Some(0),
                    ..base()
                },
                "neigh-max-age-secs",
            ),
            (
                FileConfig {
                    tx_timeout_ms: Some(5),
                    ..base()
                },
                "tx-timeout-ms",
            ),
            (
                FileConfig {
                    restart_max: Some(0),
                    ..base()
                },
                "restart-max",
            ),
            (
                FileConfig {
                    restart_window_secs: Some(0),
                    ..base()
                },
                "restart-window-secs",
            ),
            (
                FileConfig {
                    backoff_initial_ms: Some(500),
                    backoff_max_ms: Some(100),
                    ..base()
                },
                "backoff-max-ms",
            ),
        ];
        for (cfg, key) in cases {
            match Config::from_file_config(cfg.clone()) {
                Err(ConfigError::Invalid { key: k, .. }) => assert_eq!(k, key, "{cfg:?}"),
                other => panic!("{cfg:?}: expected an error for {key}, got {other:?}"),
            }
        }
    }

    #[test]
    fn file_keys_and_errors_with_location() {
        let f = FileConfig::parse(
            "[interface]\ndevice = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\nbudget = 32\nrecv-ring = 1024\n",
        )
        .unwrap();
        let c = Config::from_file_config(f).unwrap();
        assert_eq!(c.budget, 32);
        assert_eq!(c.recv_ring, 1024);

        let err = FileConfig::parse("device = \"rxe0\"\nbudgte = 3\n").unwrap_err();
        assert!(err.contains("budgte"), "{err}");
        assert!(err.contains("line 2"), "{err}");
        let err = FileConfig::parse("budget = \"many\"\n").unwrap_err();
        assert!(err.contains("budget"), "{err}");
    }

    #[test]
    fn flags_win_over_file() {
        let flags = FileConfig {
            budget: Some(8),
            ..Default::default()
        };
        let file = FileConfig {
            budget: Some(32),
            qkey: Some(7),
            ..base()
        };
        let c = Config::from_file_config(flags.or(file)).unwrap();
        assert_eq!(c.budget, 8);
        assert_eq!(c.qkey, 7);
    }

    #[test]
    fn shipped_example_config_is_valid() {
        let text = include_str!("../../config/uipoib.toml");
        let c = Config::from_file_config(FileConfig::parse(text).unwrap()).unwrap();
        assert_eq!(c.device, "rxe0");
        assert_eq!(c.qkey, DEFAULT_QKEY);
        assert_eq!(c.group, Gid::from_ipv4(DEFAULT_GROUP));
    }

    #[test]
    fn allow_faults_is_an_opt_in_bool() {
        assert!(!Config::from_file_config(base()).unwrap().allow_faults);
        let text = "device = \"rxe0\"\ntap = \"uip0\"\naddr = \"198.18.1.1/24\"\n";
        let on = FileConfig::parse(&format!("{text}allow-faults = true\n")).unwrap();
        assert!(Config::from_file_config(on).unwrap().allow_faults);
        let off = FileConfig::parse(&format!("{text}allow-faults = false\n")).unwrap();
        assert!(!Config::from_file_config(off).unwrap().allow_faults);
        for bad in ["allow-faults = \"yes\"", "allow-faults = 1"] {
            let err = FileConfig::parse(&format!("{text}{bad}\n")).unwrap_err();
            assert!(err.contains("allow-faults"), "{bad}: {err}");
            assert!(err.contains("bool"), "{bad}: {err}");
        }
        let err = FileConfig::parse(&format!("{text}allow_faults = true\n")).unwrap_err();
        assert!(err.contains("allow_faults"), "{err}");
        // The flag (true) wins over a file's false.
        let flags = FileConfig {
            allow_faults: Some(true),
            ..Default::default()
        };
        let file = FileConfig {
            allow_faults: Some(false),
            ..base()
        };
        assert!(
            Config::from_file_config(flags.or(file))
                .unwrap()
                .allow_faults
        );
    }

    #[test]
    fn cidr_contains() {
        let c: Ipv4Cidr = "198.18.1.1/24".parse().unwrap();
        assert!(c.contains(Ipv4Addr::new(198, 18, 1, 200)));
        assert!(!c.contains(Ipv4Addr::new(198, 18, 2, 1)));
    }
}
