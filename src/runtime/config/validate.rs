//! Validation: a merged [`ConfigKeys`] becomes a [`Config`] whose every value is in range,
//! or a [`ConfigError`] naming the key; and the interface parameters a `Config` yields.

use crate::iface::recovery::Policy;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use super::defaults::*;
use super::{ConfigError, ConfigKeys};
use crate::iface::{IfaceConfig, PollFailurePolicy};
use crate::verbs::{EndpointConfig, Gid};
use crate::wire::ipoib;
use crate::wire::ipv4::Ipv4Cidr;
use crate::wire::ipv6::{self, Ipv6Cidr};
use crate::wire::translate::MAX_ADDR6;

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
    /// IPv6 addresses besides the link-local one the kernel derives from the TAP's MAC.
    pub addr6: Vec<Ipv6Cidr>,
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
    /// How long the poller keeps polling after the last work, without arming or sleeping
    /// (zero: off).
    pub busy_poll: Duration,
    /// The receive queue's AQM interval (zero: off; [`crate::iface::aqm`]).
    pub rx_aqm: Duration,
    /// The poller's nice level while a poll finds more than one received frame (`None`:
    /// its own; [`crate::iface::boost`]).
    pub rx_boost_nice: Option<i32>,
    /// The poller thread runs under `SCHED_BATCH` (its wake-ups do not preempt).
    pub poller_batch: bool,
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
    /// A second bank of slots for restarts after a failed poll.
    pub spare_bank: bool,
    /// Rehearse the restart after a failed poll once at start.
    pub rehearse_restart: bool,
    /// The restart supervisor's nice level (`None`: the daemon's).
    pub restart_nice: Option<i32>,
    /// Restart policy.
    pub restart: Policy,
    /// The control socket serves `inject`, `clear` and `faults` (off unless asked for:
    /// a fault breaks the interface on purpose).
    pub allow_faults: bool,
    /// What a failed CQ poll does.
    pub poll_failure: PollFailurePolicy,
    /// Where to serve `GET /metrics`, if anywhere.
    pub metrics_listen: Option<SocketAddr>,
}

/// The restart policy's defaults ([`Policy`] lives with the restart machine).
impl Default for Policy {
    fn default() -> Self {
        Policy {
            max_restarts: DEFAULT_RESTART_MAX,
            window: DEFAULT_RESTART_WINDOW,
            backoff_initial: DEFAULT_BACKOFF_INITIAL,
            backoff_max: DEFAULT_BACKOFF_MAX,
        }
    }
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

fn bad_addr(why: String) -> ConfigError {
    ConfigError::Invalid { key: "addr", why }
}

/// The `addr` list: exactly one IPv4 address (ARP finds the neighbours, and the IPoIB
/// hardware address stands for it) and up to [`MAX_ADDR6`] IPv6 ones, none twice, no
/// link-local one. Each refusal names the offending value.
fn parse_addrs(list: &[String]) -> Result<(Ipv4Cidr, Vec<Ipv6Cidr>), ConfigError> {
    let mut v4: Option<Ipv4Cidr> = None;
    let mut v6: Vec<Ipv6Cidr> = Vec::new();
    for s in list {
        let Some((a, _)) = s.split_once('/') else {
            return Err(bad_addr(format!(
                "{s:?} is not ADDRESS/PREFIX (e.g. 198.18.1.1/24 or 2001:2:0:1::1/64)"
            )));
        };
        if a.parse::<Ipv4Addr>().is_ok() {
            let c: Ipv4Cidr = s.parse().map_err(|why| bad_addr(format!("{s}: {why}")))?;
            if c.prefix > 30 {
                return Err(bad_addr(format!(
                    "{s}: prefix /{} leaves no room for a peer",
                    c.prefix
                )));
            }
            match v4 {
                Some(first) if first.addr == c.addr => {
                    return Err(bad_addr(format!("{s}: {} is given twice", c.addr)));
                }
                Some(first) => {
                    return Err(bad_addr(format!(
                        "{s}: only one IPv4 address per interface ({first} is already given)"
                    )));
                }
                None => v4 = Some(c),
            }
        } else if a.parse::<Ipv6Addr>().is_ok() {
            let c: Ipv6Cidr = s.parse().map_err(|why| bad_addr(format!("{s}: {why}")))?;
            if ipv6::is_link_local(&c.addr) {
                return Err(bad_addr(format!(
                    "{s}: a link-local address (fe80::/10) cannot be given; the kernel \
                     derives the TAP's link-local address from its MAC"
                )));
            }
            if c.prefix > 127 {
                return Err(bad_addr(format!(
                    "{s}: prefix /{} leaves no room for an on-link peer (at most /127)",
                    c.prefix
                )));
            }
            if v6.iter().any(|o| o.addr == c.addr) {
                return Err(bad_addr(format!("{s}: {} is given twice", c.addr)));
            }
            if v6.len() == MAX_ADDR6 {
                return Err(bad_addr(format!(
                    "{s}: at most {MAX_ADDR6} IPv6 addresses per interface"
                )));
            }
            v6.push(c);
        } else {
            return Err(bad_addr(format!(
                "{s:?}: {a:?} is neither an IPv4 nor an IPv6 address"
            )));
        }
    }
    let v4 = v4.ok_or_else(|| {
        bad_addr(match list.len() {
            0 => "an empty list: an IPv4 address is required (ARP bootstraps the \
                  neighbour table)"
                .to_string(),
            _ => format!(
                "{}: an IPv4 address is required besides IPv6 ones (ARP bootstraps the \
                 neighbour table)",
                list.join(", ")
            ),
        })
    })?;
    Ok((v4, v6))
}

/// A nice level from the configuration (-20..=19), or the error that names `key` and says
/// `what` the level is for.
fn nice_level(key: &'static str, n: i64, what: &str) -> Result<i32, ConfigError> {
    match i32::try_from(n) {
        Ok(level) if (-20..=19).contains(&level) => Ok(level),
        _ => Err(ConfigError::Invalid {
            key,
            why: format!("{n} is outside -20..=19 ({what})"),
        }),
    }
}

impl Config {
    /// Validate a merged set of keys.
    pub fn from_keys(f: ConfigKeys) -> Result<Config, ConfigError> {
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
        let addrs = f.addr.ok_or_else(|| missing("addr"))?;
        let (addr, addr6) = parse_addrs(&addrs.0)?;
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
        if let Some(m) = mtu
            && m < MIN_IPV6_MTU
            && !addr6.is_empty()
        {
            return Err(ConfigError::Invalid {
                key: "mtu",
                why: format!(
                    "{m} is below {MIN_IPV6_MTU}, the least IPv6 runs over, and addr has \
                     IPv6 addresses"
                ),
            });
        }
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
        let busy_poll_us = f
            .busy_poll_us
            .unwrap_or(DEFAULT_BUSY_POLL.as_micros() as u64);
        if busy_poll_us > MAX_BUSY_POLL_US {
            return Err(ConfigError::Invalid {
                key: "busy-poll-us",
                why: format!(
                    "{busy_poll_us} is outside 0..={MAX_BUSY_POLL_US} (microseconds of polling \
                     after the last packet; 0 turns it off)"
                ),
            });
        }
        let rx_aqm_ms = f.rx_aqm_ms.unwrap_or(DEFAULT_RX_AQM.as_millis() as u64);
        if rx_aqm_ms > MAX_RX_AQM_MS {
            return Err(ConfigError::Invalid {
                key: "rx-aqm-ms",
                why: format!(
                    "{rx_aqm_ms} is outside 0..={MAX_RX_AQM_MS} (milliseconds the receive queue \
                     may stand before TCP segments are dropped; 0 turns it off)"
                ),
            });
        }
        let rx_boost_nice = f
            .rx_boost_nice
            .map(|n| {
                nice_level(
                    "rx-boost-nice",
                    n,
                    "the poller's nice level while received frames queue up; a level not \
                     below the daemon's changes nothing",
                )
            })
            .transpose()?
            .or(DEFAULT_RX_BOOST_NICE);
        let restart_nice = f
            .restart_nice
            .map(|n| {
                nice_level(
                    "restart-nice",
                    n,
                    "the restart supervisor's nice level; lower runs it before the rest",
                )
            })
            .transpose()?
            .or(DEFAULT_RESTART_NICE);
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
        let allow_faults = f.allow_faults.unwrap_or(false);
        let poll_failure = match f.poll_failure_policy.as_deref() {
            None => PollFailurePolicy::Restart,
            Some(s) => PollFailurePolicy::from_name(s).ok_or_else(|| ConfigError::Invalid {
                key: "poll-failure-policy",
                why: format!("unknown policy {s:?}; one of {}", PollFailurePolicy::NAMES),
            })?,
        };
        if poll_failure.is_demonstration() && !allow_faults {
            return Err(ConfigError::Invalid {
                key: "poll-failure-policy",
                why: format!(
                    "{poll_failure} is one of the alternatives to a restart, kept to show what \
                     they do to a live interface (README: \"Why a failed poll restarts the whole \
                     interface\"); it is accepted only with allow-faults (--allow-faults); \
                     restart is the policy for use"
                ),
            });
        }
        let control = f.control.unwrap_or_else(|| default_control_path(&tap));
        let metrics_listen = match f.metrics_listen.as_deref() {
            None => None,
            Some(s) => Some(s.parse::<SocketAddr>().map_err(|_| ConfigError::Invalid {
                key: "metrics-listen",
                why: format!("{s:?} is not a socket address (e.g. 127.0.0.1:9464 or [::1]:9464)"),
            })?),
        };
        Ok(Config {
            device,
            port,
            gid_index: f.gid_index,
            tap,
            addr,
            addr6,
            mtu,
            budget,
            control,
            recv_ring,
            send_ring,
            poll_batch,
            tx_batch,
            busy_poll: Duration::from_micros(busy_poll_us),
            rx_aqm: Duration::from_millis(rx_aqm_ms),
            rx_boost_nice,
            poller_batch: f.poller_batch.unwrap_or(DEFAULT_POLLER_BATCH),
            qkey,
            group,
            neigh_capacity,
            neigh_max_age: Duration::from_secs(age),
            tx_timeout,
            tap_offload: f.tap_offload.unwrap_or(DEFAULT_TAP_OFFLOAD),
            spare_bank: f.spare_bank.unwrap_or(DEFAULT_SPARE_BANK),
            rehearse_restart: f.rehearse_restart.unwrap_or(DEFAULT_REHEARSE_RESTART),
            restart_nice,
            allow_faults,
            poll_failure,
            metrics_listen,
            restart: Policy {
                max_restarts,
                window: Duration::from_secs(window_s),
                backoff_initial,
                backoff_max,
            },
        })
    }
}

impl Config {
    /// What `uipoib up` would open and create with this configuration, for `up --check`
    /// (nothing is touched to say it).
    pub fn plan(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        let ms = |d: Duration| d.as_millis();
        let _ = writeln!(t, "config ok; `uipoib up` would:");
        let _ = writeln!(
            t,
            "  open RDMA device {} port {}, GID {}",
            self.device,
            self.port,
            match self.gid_index {
                Some(i) => format!("index {i}"),
                None => "the first RoCEv2 IPv4-mapped one (or the first GID on InfiniBand)".into(),
            }
        );
        let _ = writeln!(
            t,
            "  with a UD QP: receive ring {}, send ring {}, Q_Key {:#x}, broadcast group {}",
            self.recv_ring, self.send_ring, self.qkey, self.group
        );
        let addrs: Vec<String> = std::iter::once(self.addr.to_string())
            .chain(self.addr6.iter().map(|a| a.to_string()))
            .collect();
        let _ = writeln!(
            t,
            "  create TAP {} with {}, MTU {}, offloads {}",
            self.tap,
            addrs.join(", "),
            self.mtu.map_or_else(
                || "from the port (active MTU - 4)".into(),
                |m| m.to_string()
            ),
            if self.tap_offload { "on" } else { "off" }
        );
        let _ = writeln!(
            t,
            "  listen on control socket {} (fault injection {})",
            self.control.display(),
            if self.allow_faults {
                "allowed"
            } else {
                "refused"
            }
        );
        if let Some(m) = self.metrics_listen {
            let _ = writeln!(t, "  serve metrics at http://{m}/metrics");
        }
        let _ = writeln!(
            t,
            "  poll: budget {}, {} completions per poll_cq, {} TAP frames per turn, busy poll {}, receive-queue AQM {}; on a failed poll: {}",
            self.budget,
            self.poll_batch,
            self.tx_batch,
            if self.busy_poll.is_zero() {
                "off".to_string()
            } else {
                format!("{} us", self.busy_poll.as_micros())
            },
            if self.rx_aqm.is_zero() {
                "off".to_string()
            } else {
                format!("{} ms", self.rx_aqm.as_millis())
            },
            self.poll_failure
        );
        let _ = writeln!(
            t,
            "  restart: backoff {}..{} ms, dead after more than {} restarts within {} s; send-stall watchdog {} ms; {}",
            ms(self.restart.backoff_initial),
            ms(self.restart.backoff_max),
            self.restart.max_restarts,
            self.restart.window.as_secs(),
            ms(self.tx_timeout),
            if self.spare_bank {
                "a spare bank of slots (registered memory doubled)"
            } else {
                "no spare bank of slots"
            }
        );
        let _ = writeln!(
            t,
            "  restart rehearsed at start: {}",
            if self.rehearse_restart { "yes" } else { "no" }
        );
        let _ = match self.restart_nice {
            Some(n) => writeln!(t, "  restart supervisor's nice level: {n}"),
            None => writeln!(t, "  restart supervisor's nice level: the daemon's"),
        };
        let _ = match self.rx_boost_nice {
            Some(n) => writeln!(
                t,
                "  poller's nice level while received frames queue up: {n} (if below the daemon's)"
            ),
            None => writeln!(
                t,
                "  poller's nice level while received frames queue up: the daemon's"
            ),
        };
        let _ = writeln!(
            t,
            "  poller's scheduling policy: {}",
            if self.poller_batch {
                "SCHED_BATCH (its wake-ups do not preempt)"
            } else {
                "the daemon's"
            }
        );
        let _ = writeln!(
            t,
            "  neighbours: up to {}, forgotten after {} s idle",
            self.neigh_capacity,
            self.neigh_max_age.as_secs()
        );
        t
    }

    /// Parameters from a validated configuration.
    pub fn iface_config(&self) -> IfaceConfig {
        IfaceConfig {
            addr: self.addr,
            addr6: self.addr6.clone(),
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
                banks: if self.spare_bank { 2 } else { 1 },
            },
            neigh_capacity: self.neigh_capacity,
            neigh_max_age: self.neigh_max_age,
            tx_timeout: self.tx_timeout,
            poll_failure: self.poll_failure,
            busy_poll: self.busy_poll,
            rx_aqm: self.rx_aqm,
            rx_boost_nice: self.rx_boost_nice,
            poller_batch: self.poller_batch,
            neigh_view: Default::default(),
        }
    }
}
