//! metrics_sample: prints the Prometheus exposition (text format 0.0.4) of a sample
//! snapshot, exactly as `uipoib stats --prometheus` and `GET /metrics` format it, for
//! `promtool check metrics` (scripts/test) and the README.
//!
//! ```sh
//! cargo run --quiet --example metrics_sample | promtool check metrics
//! ```

use uipoib::iface::stats::{DropReason, Snapshot};
use uipoib::runtime::supervisor::Status;

fn main() {
    let mut s = Snapshot {
        rx_packets: 1200,
        rx_bytes: 1_650_000,
        tx_packets: 1180,
        tx_bytes: 1_620_000,
        arp_rx: 3,
        arp_tx: 2,
        recv_posted: 1712,
        recv_completed: 1200,
        recv_outstanding: 512,
        send_posted: 1180,
        send_completed: 1180,
        recv_ring: 512,
        send_ring: 512,
        neigh_entries: 1,
        qpn: 0x11,
        mtu: 4092,
        ..Default::default()
    };
    for r in DropReason::ALL {
        s.drops.insert(r.name().to_string(), 0);
    }
    s.drops.insert(DropReason::TxVlan.name().to_string(), 2);
    let status = Status {
        state: "running".into(),
        tap: "uip0".into(),
        ..Default::default()
    };
    print!("{}", s.to_prometheus("uip0", Some(&status)));
}
