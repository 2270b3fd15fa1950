//! Per-interface counters, shared between the datapath (writer) and the control socket
//! (reader) without locks: relaxed atomics, one writer thread.
//!
//! Every dropped packet is counted here under a [`DropReason`]; nothing is lost without a
//! counter moving. A test asserts that every reason has a stable, unique name.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};

use serde::Serialize;

/// Why a packet was dropped. The names are what `uipoib stats` prints.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(usize)]
pub enum DropReason {
    /// Receive shorter than GRH + IPoIB header.
    RxShort,
    /// Receive without a GRH (UD receives always have one here).
    RxNoGrh,
    /// GRH did not parse.
    RxBadGrh,
    /// IPoIB header did not parse (reserved bits set).
    RxBadHeader,
    /// IPoIB ARP did not parse or was not for IPv4.
    RxBadArp,
    /// IPv4 header did not parse.
    RxBadIpv4,
    /// EtherType not carried.
    RxUnsupported,
    /// Receive completion with an error status.
    RxCompletionError,
    /// Writing the frame to the TAP failed.
    RxTapWrite,
    /// Frame from the TAP shorter than an Ethernet header.
    TxShort,
    /// VLAN-tagged frame from the TAP.
    TxVlan,
    /// Another EtherType from the TAP.
    TxUnsupported,
    /// Frame payload larger than the IPoIB MTU.
    TxOversized,
    /// Ethernet ARP from the TAP that did not parse.
    TxBadArp,
    /// No neighbour for the destination MAC (an ARP request was sent to re-resolve it).
    TxNoNeighbour,
    /// The address handle for the destination could not be created.
    TxAhFailed,
    /// `ibv_post_send` refused the request.
    TxPostFailed,
    /// Send completion with an error status.
    TxCompletionError,
    /// Send flushed by a QP in the error state.
    TxFlushed,
    /// IPv4 frame from the TAP whose header did not parse.
    TxBadIpv4,
    /// Send reaped at teardown: its completion never came.
    TxReaped,
    /// A frame from the TAP with an offload request that cannot be carried out (a
    /// super-frame that is not TCP/IPv4, a checksum position outside the frame).
    TxBadOffload,
    /// An ARP whose sender hardware address is not the packet's real source (the GRH's
    /// source GID and the completion's source QPN).
    RxArpSpoofed,
    /// An ARP whose sender IPv4 address is outside the interface's subnet.
    RxArpOffSubnet,
    /// Received during a teardown's drain with no TAP to deliver it to (a final stop).
    RxTeardown,
    /// IPv6 header (or an extension header) from the wire that did not parse.
    RxBadIpv6,
    /// Neighbour discovery message from the wire that failed RFC 4861's checks (hop
    /// limit, code, lengths, options, checksum) or named an impossible link-layer address.
    RxBadNd,
    /// Neighbour discovery message whose own link-layer address option is not the
    /// packet's real source.
    RxNdSpoofed,
    /// Neighbour discovery message claiming an address that is not on this link.
    RxNdOffLink,
    /// IPv6 frame from the TAP whose header did not parse.
    TxBadIpv6,
    /// Neighbour discovery message from the TAP that failed RFC 4861's checks.
    TxBadNd,
    /// Neighbour discovery message from the TAP whose link-layer option names a MAC that
    /// is neither this interface's nor a known peer's.
    TxNdForeignLinkAddr,
    /// A received TCP segment dropped because the receive queue stood longer than the
    /// active queue management allows (`rx-aqm-ms`, [`crate::iface::aqm`]): a congestion
    /// signal to its sender.
    RxAqm,
}

impl DropReason {
    /// Every reason, in counter order.
    pub const ALL: [DropReason; 33] = [
        DropReason::RxShort,
        DropReason::RxNoGrh,
        DropReason::RxBadGrh,
        DropReason::RxBadHeader,
        DropReason::RxBadArp,
        DropReason::RxBadIpv4,
        DropReason::RxUnsupported,
        DropReason::RxCompletionError,
        DropReason::RxTapWrite,
        DropReason::TxShort,
        DropReason::TxVlan,
        DropReason::TxUnsupported,
        DropReason::TxOversized,
        DropReason::TxBadArp,
        DropReason::TxNoNeighbour,
        DropReason::TxAhFailed,
        DropReason::TxPostFailed,
        DropReason::TxCompletionError,
        DropReason::TxFlushed,
        DropReason::TxBadIpv4,
        DropReason::TxReaped,
        DropReason::TxBadOffload,
        DropReason::RxArpSpoofed,
        DropReason::RxArpOffSubnet,
        DropReason::RxTeardown,
        DropReason::RxBadIpv6,
        DropReason::RxBadNd,
        DropReason::RxNdSpoofed,
        DropReason::RxNdOffLink,
        DropReason::TxBadIpv6,
        DropReason::TxBadNd,
        DropReason::TxNdForeignLinkAddr,
        DropReason::RxAqm,
    ];

    /// Stable name used in stats output.
    pub fn name(self) -> &'static str {
        match self {
            DropReason::RxShort => "rx_short",
            DropReason::RxNoGrh => "rx_no_grh",
            DropReason::RxBadGrh => "rx_bad_grh",
            DropReason::RxBadHeader => "rx_bad_header",
            DropReason::RxBadArp => "rx_bad_arp",
            DropReason::RxBadIpv4 => "rx_bad_ipv4",
            DropReason::RxUnsupported => "rx_unsupported",
            DropReason::RxCompletionError => "rx_completion_error",
            DropReason::RxTapWrite => "rx_tap_write",
            DropReason::TxShort => "tx_short",
            DropReason::TxVlan => "tx_vlan",
            DropReason::TxUnsupported => "tx_unsupported",
            DropReason::TxOversized => "tx_oversized",
            DropReason::TxBadArp => "tx_bad_arp",
            DropReason::TxNoNeighbour => "tx_no_neighbour",
            DropReason::TxAhFailed => "tx_ah_failed",
            DropReason::TxPostFailed => "tx_post_failed",
            DropReason::TxCompletionError => "tx_completion_error",
            DropReason::TxFlushed => "tx_flushed",
            DropReason::TxBadIpv4 => "tx_bad_ipv4",
            DropReason::TxReaped => "reaped",
            DropReason::TxBadOffload => "tx_bad_offload",
            DropReason::RxArpSpoofed => "rx_arp_spoofed",
            DropReason::RxArpOffSubnet => "rx_arp_off_subnet",
            DropReason::RxTeardown => "rx_teardown",
            DropReason::RxBadIpv6 => "rx_bad_ipv6",
            DropReason::RxBadNd => "rx_bad_nd",
            DropReason::RxNdSpoofed => "rx_nd_spoofed",
            DropReason::RxNdOffLink => "rx_nd_off_link",
            DropReason::TxBadIpv6 => "tx_bad_ipv6",
            DropReason::TxBadNd => "tx_bad_nd",
            DropReason::TxNdForeignLinkAddr => "tx_nd_foreign_link_addr",
            DropReason::RxAqm => "rx_aqm",
        }
    }
}

/// One counter per [`DropReason`], in [`DropReason::ALL`]'s order.
#[derive(Debug)]
struct DropCounters([AtomicU64; DropReason::ALL.len()]);

impl Default for DropCounters {
    fn default() -> Self {
        DropCounters(std::array::from_fn(|_| AtomicU64::new(0)))
    }
}

macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident),* $(,)?) => {
        /// The counters of one interface.
        #[derive(Default, Debug)]
        pub struct Stats {
            $($(#[doc = $doc])* pub $name: AtomicU64,)*
            drops: DropCounters,
        }

        /// A point-in-time copy of [`Stats`], as `uipoib stats` shows it.
        #[derive(Default, Debug, Clone, Serialize, serde::Deserialize, PartialEq, Eq)]
        pub struct Snapshot {
            $($(#[doc = $doc])* pub $name: u64,)*
            /// Drops by reason (every reason present, zero included).
            pub drops: std::collections::BTreeMap<String, u64>,
            /// The ledger's residuals when the copy was taken ([`Snapshot::residuals`]),
            /// for readers of the JSON; a reader in Rust recomputes them.
            #[serde(default)]
            pub ledger_residuals: Residuals,
        }

        impl Stats {
            /// Copy every counter.
            pub fn snapshot(&self) -> Snapshot {
                let mut s = Snapshot {
                    $($name: self.$name.load(Ordering::Relaxed),)*
                    drops: DropReason::ALL
                        .iter()
                        .map(|r| (r.name().to_string(), self.drops.0[*r as usize].load(Ordering::Relaxed)))
                        .collect(),
                    ledger_residuals: Residuals::default(),
                };
                s.ledger_residuals = s.residuals();
                s
            }
        }

        impl Snapshot {
            /// Every counter in declaration order: its name, its doc comment (the lines
            /// joined by newlines) and its value. The drops are not among them.
            pub fn counters(&self) -> Vec<(&'static str, &'static str, u64)> {
                vec![$((stringify!($name), concat!($($doc, "\n"),*), self.$name),)*]
            }

            /// `name value` lines, for humans.
            pub fn to_text(&self) -> String {
                let mut s = String::new();
                $(let _ = writeln!(s, "{:<28} {}", stringify!($name), self.$name);)*
                let _ = writeln!(s, "{:<28} {}", "drops_total", self.drops_total());
                let res = self.residuals();
                for (ring, [p, c, f, r, o], left) in [("recv", self.ledger(true), res.recv), ("send", self.ledger(false), res.send)] {
                    let _ = writeln!(
                        s,
                        "ledger {ring}: posted {p} = completed {c} + flushed {f} + reaped {r} + outstanding {o} ({})",
                        if left == 0 { "balanced" } else { "NOT BALANCED" }
                    );
                }
                for (k, v) in &self.drops {
                    if *v != 0 {
                        let _ = writeln!(s, "  drop {:<23} {}", k, v);
                    }
                }
                s
            }
        }
    };
}

counters! {
    /// Packets written to the TAP from the wire.
    rx_packets,
    /// Bytes of those packets (IP payload, without Ethernet or IPoIB headers).
    rx_bytes,
    /// Packets sent to the wire from the TAP (send completed successfully).
    tx_packets,
    /// Bytes of those packets (IPoIB payload).
    tx_bytes,
    /// ARP messages received from the wire.
    arp_rx,
    /// ARP messages sent to the wire.
    arp_tx,
    /// Own multicast packets looped back by the fabric and ignored.
    rx_own_looped,
    /// Packets from a known peer's GID at a QPN that peer is not known at: delivered,
    /// never believed (the neighbour is not changed; a restarted peer announces its new
    /// QPN by ARP, and a silent one is re-resolved).
    rx_unknown_qpn,
    /// ARP messages not learned from: a sender that is not in the table and that is
    /// neither a reply nor a request for our address, or another QP of a known peer's
    /// host claiming another address (which would take the peer's entry over). Passed
    /// on, not learned.
    arp_not_learned,
    /// Neighbour discovery messages received from the wire.
    nd_rx,
    /// Neighbour discovery messages sent to the wire (the kernel's, translated, and
    /// this interface's own solicitations and advertisements).
    nd_tx,
    /// Neighbour discovery messages not learned from, as `arp_not_learned` (and
    /// duplicate address detection probes).
    nd_not_learned,
    /// NAPI polls run.
    polls,
    /// Polls that used their whole budget and yielded.
    budget_exhausted,
    /// Times both CQs were re-armed.
    rearms,
    /// Polls after re-arming that found completions (the missed-event race, caught).
    caught_after_rearm,
    /// Completion events read from the channel.
    cq_events,
    /// Completion events that found nothing to poll.
    spurious_events,
    /// Polls that found nothing inside the busy-poll window and polled again instead of
    /// arming (`busy-poll-us`).
    busy_polls,
    /// Times the poller raised its nice level for a receive backlog (`rx-boost-nice`).
    rx_boosts,
    /// Times the TAP reader stopped because the send ring was full.
    tx_backpressure,
    /// TCP super-frames read from the TAP (segmentation offload).
    tso_frames,
    /// Segments cut from them.
    tso_segments,
    /// Super-frames written to the TAP (received segments joined).
    gro_frames,
    /// Received segments joined into them.
    gro_segments,
    /// Receive WRs posted.
    recv_posted,
    /// Receive WRs completed (any status but flushed).
    recv_completed,
    /// Receive WRs flushed.
    recv_flushed,
    /// Send WRs posted.
    send_posted,
    /// Send WRs completed (any status but flushed).
    send_completed,
    /// Send WRs flushed.
    send_flushed,
    /// Receive WRs outstanding now.
    recv_outstanding,
    /// Send WRs outstanding now.
    send_outstanding,
    /// Receive ring size.
    recv_ring,
    /// Send ring size.
    send_ring,
    /// Neighbours now in the table.
    neigh_entries,
    /// Neighbours learned.
    neigh_learned,
    /// Neighbours whose QPN or GID changed.
    neigh_updated,
    /// Neighbours evicted (aged out or table full).
    neigh_evicted,
    /// ARP requests and neighbour solicitations sent to resolve an unknown destination.
    neigh_resolves,
    /// Address handles created.
    ah_created,
    /// Address handles destroyed.
    ah_destroyed,
    /// Verbs destroy calls that failed (logged, never fatal).
    teardown_errors,
    /// Receive WRs reaped at teardowns (their completion never came).
    recv_reaped,
    /// Send WRs reaped at teardowns (each also a drop with reason `reaped`).
    send_reaped,
    /// Interface restarts completed.
    restarts,
    /// Port-down events (carrier turned off until the port is active again).
    port_down_events,
    /// Asynchronous events for a QP or CQ that is not the live one (retired or spare):
    /// logged, never a restart.
    async_not_live,
    /// Completions rejected by the ledger (stale epoch, unknown id, duplicate).
    completions_rejected,
    /// CQ polls that failed (under every policy; under `restart` each is a restart).
    poll_failures,
    /// `skip`: failed polls dropped, their CQ left unarmed.
    poll_failures_skipped,
    /// Of those, polls that failed while their CQ was armed (the recheck right after
    /// arming): an event brings such a CQ back, the others stay unpolled.
    poll_failures_skipped_armed,
    /// `retry`: failed polls taken as empty and polled again.
    poll_retries,
    /// `recreate-cq`: CQs re-created under a kept QP.
    cq_recreated,
    /// `recreate-cq`: old CQs the device would not destroy because the QP still uses
    /// them (kept, unpolled, until the QP goes).
    cq_kept_in_use,
    /// Receive WRs outstanding whose completion will never be seen now: behind a later
    /// one that completed, or on a CQ nothing polls (0 after a failed poll under
    /// `restart`, which reaps them).
    recv_never_complete,
    /// Send WRs likewise.
    send_never_complete,
    /// The local QPN.
    qpn,
    /// The IPoIB MTU.
    mtu,
}

impl Stats {
    /// Count one drop.
    pub fn count_drop(&self, reason: DropReason) {
        self.drops.0[reason as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Drops so far for one reason.
    pub fn drops(&self, reason: DropReason) -> u64 {
        self.drops.0[reason as usize].load(Ordering::Relaxed)
    }
}

/// Shorthand: add to a counter.
pub fn add(c: &AtomicU64, n: u64) {
    c.fetch_add(n, Ordering::Relaxed);
}

/// Shorthand: set a gauge.
pub fn set(c: &AtomicU64, n: u64) {
    c.store(n, Ordering::Relaxed);
}

/// Shorthand: read a counter.
pub fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

impl Snapshot {
    /// Sum of all drops.
    pub fn drops_total(&self) -> u64 {
        self.drops.values().sum()
    }

    /// `[posted, completed, flushed, reaped, outstanding]` of the receive (`true`) or
    /// send ring, summed over every epoch.
    pub fn ledger(&self, recv: bool) -> [u64; 5] {
        if recv {
            [
                self.recv_posted,
                self.recv_completed,
                self.recv_flushed,
                self.recv_reaped,
                self.recv_outstanding,
            ]
        } else {
            [
                self.send_posted,
                self.send_completed,
                self.send_flushed,
                self.send_reaped,
                self.send_outstanding,
            ]
        }
    }

    /// The ledger's residuals, per ring: posted - completed - flushed - reaped -
    /// outstanding. The one place the conservation law is computed.
    pub fn residuals(&self) -> Residuals {
        let r = |l: [u64; 5]| {
            let v = l[0] as i128 - l[1..].iter().map(|v| *v as i128).sum::<i128>();
            v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
        };
        Residuals {
            recv: r(self.ledger(true)),
            send: r(self.ledger(false)),
        }
    }

    /// Whether both rings' totals balance.
    pub fn ledger_balanced(&self) -> bool {
        self.residuals().balanced()
    }

    /// Drops for one reason by name (0 if absent).
    pub fn drop_count(&self, reason: DropReason) -> u64 {
        self.drops.get(reason.name()).copied().unwrap_or(0)
    }
}

/// The residuals of the work-request ledger, per ring: posted - completed - flushed -
/// reaped - outstanding. Both 0 when the counters balance.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Residuals {
    /// The receive ring's.
    pub recv: i64,
    /// The send ring's.
    pub send: i64,
}

impl Residuals {
    /// Both rings balance.
    pub fn balanced(&self) -> bool {
        *self == Residuals::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reason_names_are_unique_and_ordered() {
        let mut names = std::collections::HashSet::new();
        for (i, r) in DropReason::ALL.iter().enumerate() {
            assert_eq!(*r as usize, i, "{r:?} out of order");
            assert!(names.insert(r.name()), "duplicate name {}", r.name());
        }
    }

    #[test]
    fn drops_show_in_snapshot() {
        let s = Stats::default();
        s.count_drop(DropReason::TxVlan);
        s.count_drop(DropReason::TxVlan);
        add(&s.rx_packets, 3);
        let snap = s.snapshot();
        assert_eq!(snap.drop_count(DropReason::TxVlan), 2);
        assert_eq!(snap.drops_total(), 2);
        assert_eq!(snap.rx_packets, 3);
        let text = snap.to_text();
        assert!(text.contains("tx_vlan"), "{text}");
        let json = serde_json::to_string(&snap).unwrap();
        let back: Snapshot = serde_json::from_str(&json).unwrap();
        assert_eq!(back, snap);
    }
}
