//! The keys a config file (or the command line) gives: all optional, merged with flags
//! first.

use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde::de::{self, Deserializer, SeqAccess, Visitor};

use super::ConfigError;

/// The `[interface]` keys of a config file; every field is optional there.
#[derive(Debug, Default, Deserialize, Clone)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ConfigKeys {
    /// RDMA device name.
    pub device: Option<String>,
    /// Port number.
    pub port: Option<u8>,
    /// GID index.
    pub gid_index: Option<u8>,
    /// TAP name.
    pub tap: Option<String>,
    /// Addresses with prefix, IPv4 and IPv6: one string or a list of them.
    pub addr: Option<AddrList>,
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
    /// Busy-poll window after the last work, in microseconds (0: off).
    pub busy_poll_us: Option<u64>,
    /// Receive-queue AQM interval, in milliseconds (0: off).
    pub rx_aqm_ms: Option<u64>,
    /// The poller's nice level while received frames queue up (-20..=19; one not below
    /// the daemon's turns it off).
    pub rx_boost_nice: Option<i64>,
    /// Run the poller thread under `SCHED_BATCH`.
    pub poller_batch: Option<bool>,
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
    /// A second bank of slots for restarts after a failed poll.
    pub spare_bank: Option<bool>,
    /// Rehearse the restart after a failed poll once at start.
    pub rehearse_restart: Option<bool>,
    /// The restart supervisor's nice level (-20..=19).
    pub restart_nice: Option<i64>,
    /// Serve fault injection on the control socket.
    pub allow_faults: Option<bool>,
    /// What a failed CQ poll does: `restart` (the default), or one of the
    /// demonstrations `skip`, `retry`, `recreate-cq` (only with `allow-faults`).
    pub poll_failure_policy: Option<String>,
    /// Serve the counters over HTTP (`GET /metrics`, Prometheus text format) at this
    /// socket address, e.g. `127.0.0.1:9464`.
    pub metrics_listen: Option<String>,
}

impl ConfigKeys {
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
            interface: ConfigKeys,
        }
        let value: toml::Table = toml::from_str(text).map_err(|e| e.to_string())?;
        if value.contains_key("interface") {
            toml::from_str::<Wrapped>(text)
                .map(|w| w.interface)
                .map_err(|e| e.to_string())
        } else {
            toml::from_str::<ConfigKeys>(text).map_err(|e| e.to_string())
        }
    }

    /// Fill every unset key of `self` from `other`. A key is taken whole: an `addr` list
    /// in `self` replaces `other`'s entirely, it is not added to it.
    pub fn or(self, other: ConfigKeys) -> ConfigKeys {
        ConfigKeys {
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
            busy_poll_us: self.busy_poll_us.or(other.busy_poll_us),
            rx_aqm_ms: self.rx_aqm_ms.or(other.rx_aqm_ms),
            rx_boost_nice: self.rx_boost_nice.or(other.rx_boost_nice),
            poller_batch: self.poller_batch.or(other.poller_batch),
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
            spare_bank: self.spare_bank.or(other.spare_bank),
            rehearse_restart: self.rehearse_restart.or(other.rehearse_restart),
            restart_nice: self.restart_nice.or(other.restart_nice),
            allow_faults: self.allow_faults.or(other.allow_faults),
            poll_failure_policy: self.poll_failure_policy.or(other.poll_failure_policy),
            metrics_listen: self.metrics_listen.or(other.metrics_listen),
        }
    }
}

/// The `addr` key: one `ADDRESS/PREFIX` string, or a list of them (IPv4 and IPv6 alike).
/// Unchecked here; [`super::Config::from_keys`] validates each.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct AddrList(pub Vec<String>);

impl From<&str> for AddrList {
    fn from(s: &str) -> Self {
        AddrList(vec![s.to_string()])
    }
}

impl From<String> for AddrList {
    fn from(s: String) -> Self {
        AddrList(vec![s])
    }
}

impl From<Vec<String>> for AddrList {
    fn from(v: Vec<String>) -> Self {
        AddrList(v)
    }
}

impl<'de> Deserialize<'de> for AddrList {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = AddrList;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an address/prefix string or a list of them")
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<AddrList, E> {
                Ok(AddrList::from(s))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<AddrList, A::Error> {
                let mut v = Vec::new();
                while let Some(s) = seq.next_element::<String>()? {
                    v.push(s);
                }
                Ok(AddrList(v))
            }
        }
        d.deserialize_any(V)
    }
}
