//! `neigh`: the neighbour table as the poller last published it
//! ([`NeighView`](crate::iface::neigh::NeighView), refreshed at housekeeping, about once
//! a second), as JSON on the socket and as `ip neigh`-like lines in the CLI.
//!
//! The reply is `{"ok":true,"neigh":[ENTRY...],"total":N,"retiring_ahs":N,
//! "retiring_inflight":N,"snapshot_age_ms":MS}`: `total` peers in the table (more than
//! listed only beyond [`NEIGH_LISTED`](crate::iface::neigh::NEIGH_LISTED), the most
//! recently heard being listed), address handles of peers gone that wait for their last
//! sends, and the age of the snapshot (`null` before the first housekeeping). Each ENTRY
//! has the fields of [`NEIGH_FIELDS`], always all of them (serialized with sorted keys).

use std::fmt::Write as _;
use std::time::Instant;

use serde_json::{Value, json};

use crate::iface::neigh::{NeighEntry, NeighSnapshot};

/// The fields of one `neigh` entry with what each holds (the list
/// `uipoib neigh --help` and the README show).
pub const NEIGH_FIELDS: &[(&str, &str)] = &[
    (
        "addrs",
        "its IP addresses, strings: the IPv4 one first, then the IPv6 ones oldest first",
    ),
    (
        "mac",
        "the Ethernet MAC the TAP knows it by (derived from its GID)",
    ),
    ("gid", "its GID"),
    ("qpn", "its UD QP number (decimal)"),
    (
        "ah",
        "its address handle: \"none\" (none yet: made on the first send) or \"ready\"",
    ),
    (
        "ah_inflight",
        "sends posted on that address handle and not completed yet",
    ),
    (
        "state",
        "\"REACHABLE\" (heard from within 3 s), \"STALE\" (silent longer) or \"PROBE\" (being re-resolved by ARP or neighbour solicitation)",
    ),
    (
        "last_seen_ms",
        "milliseconds since it was last heard from (ARP, neighbour discovery, or data from its known QPN)",
    ),
    (
        "last_used_ms",
        "milliseconds since a frame was last sent to it, or null if never",
    ),
];

fn ms_since(now: Instant, t: Instant) -> u64 {
    u64::try_from(now.saturating_duration_since(t).as_millis()).unwrap_or(u64::MAX)
}

/// One entry's JSON object, its ages measured at `now`.
pub fn entry_json(e: &NeighEntry, now: Instant) -> Value {
    let addrs: Vec<String> = e.addrs().map(|a| a.to_string()).collect();
    json!({
        "addrs": addrs,
        "mac": e.mac.to_string(),
        "gid": e.hw.gid.to_string(),
        "qpn": e.hw.qpn,
        "ah": if e.ah { "ready" } else { "none" },
        "ah_inflight": e.ah_inflight,
        "state": e.state(now).name(),
        "last_seen_ms": ms_since(now, e.last_seen),
        "last_used_ms": e.last_used.map(|t| ms_since(now, t)),
    })
}

/// The `neigh` reply for `snap`, its ages measured at `now`.
pub fn reply(snap: &NeighSnapshot, now: Instant) -> Value {
    let entries: Vec<Value> = snap.entries.iter().map(|e| entry_json(e, now)).collect();
    json!({
        "ok": true,
        "neigh": entries,
        "total": snap.total,
        "retiring_ahs": snap.retiring,
        "retiring_inflight": snap.retiring_inflight,
        "snapshot_age_ms": snap.taken.map(|t| ms_since(now, t)),
    })
}

/// An age in `ip`'s manner: `0.4s`, `12.5s`, `340s`.
pub fn age_text(ms: u64) -> String {
    if ms < 100_000 {
        format!("{}.{}s", ms / 1000, (ms % 1000) / 100)
    } else {
        format!("{}s", ms / 1000)
    }
}

/// One entry as a line of `uipoib neigh`:
/// `ADDR[,ADDR...] lladdr MAC gid GID qpn QPN ah none|ready[ inflight N] seen AGE ago[ used AGE ago] STATE`.
/// Fields missing from the entry are printed as `?`, never skipped silently.
pub fn entry_text(e: &Value) -> String {
    let s = |k: &str| e[k].as_str().unwrap_or("?").to_string();
    let addrs: Vec<&str> = e["addrs"]
        .as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut t = if addrs.is_empty() {
        "-".to_string()
    } else {
        addrs.join(",")
    };
    let qpn = e["qpn"]
        .as_u64()
        .map_or_else(|| "?".to_string(), |q| q.to_string());
    let _ = write!(
        t,
        " lladdr {} gid {} qpn {qpn} ah {}",
        s("mac"),
        s("gid"),
        s("ah")
    );
    if let Some(n) = e["ah_inflight"].as_u64()
        && n > 0
    {
        let _ = write!(t, " inflight {n}");
    }
    match e["last_seen_ms"].as_u64() {
        Some(ms) => {
            let _ = write!(t, " seen {} ago", age_text(ms));
        }
        None => t.push_str(" seen ?"),
    }
    if let Some(ms) = e["last_used_ms"].as_u64() {
        let _ = write!(t, " used {} ago", age_text(ms));
    }
    let _ = write!(t, " {}", s("state"));
    t
}

/// The text of a whole `neigh` reply: one line per entry, nothing for an empty table.
pub fn text(reply: &Value) -> String {
    let mut t = String::new();
    for e in reply["neigh"].as_array().map(Vec::as_slice).unwrap_or(&[]) {
        t.push_str(&entry_text(e));
        t.push('\n');
    }
    t
}

/// The field list for `--help` and the README: one `  name  what` line per field.
pub fn fields_help() -> String {
    let w = NEIGH_FIELDS.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    let mut t = String::new();
    for (k, what) in NEIGH_FIELDS {
        let _ = writeln!(t, "  {k:<w$}  {what}");
    }
    t
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};
    use std::time::Duration;

    use super::*;
    use crate::iface::neigh::PEER_ADDR6;
    use crate::verbs::Gid;
    use crate::wire::eth::mac_for_gid;
    use crate::wire::ipoib::IpoibAddr;

    fn entry(t0: Instant) -> NeighEntry {
        let gid = Gid::from_ipv4(Ipv4Addr::new(198, 18, 0, 2));
        let mut ip6 = [None; PEER_ADDR6];
        ip6[0] = Some(Ipv6Addr::new(0x2001, 2, 0, 1, 0, 0, 0, 2));
        NeighEntry {
            mac: mac_for_gid(&gid),
            hw: IpoibAddr::new(0x11, gid),
            ip: Some(Ipv4Addr::new(198, 18, 1, 2)),
            ip6,
            ah: true,
            ah_inflight: 3,
            last_seen: t0,
            last_used: None,
            resolving: false,
        }
    }

    #[test]
    fn entry_json_has_every_field_in_order_and_the_text_line_shows_them() {
        let t0 = Instant::now();
        let e = entry(t0);
        let now = t0 + Duration::from_millis(1234);
        let v = entry_json(&e, now);
        let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
        let mut want: Vec<&str> = NEIGH_FIELDS.iter().map(|(k, _)| *k).collect();
        want.sort_unstable();
        let mut got = keys.clone();
        got.sort_unstable();
        assert_eq!(got, want);
        assert_eq!(v["addrs"], json!(["198.18.1.2", "2001:2:0:1::2"]));
        assert_eq!(v["qpn"], 17);
        assert_eq!(v["gid"], "::ffff:198.18.0.2");
        assert_eq!(v["last_seen_ms"], 1234);
        assert_eq!(v["last_used_ms"], Value::Null);
        assert_eq!(v["state"], "REACHABLE");
        assert_eq!(
            entry_text(&v),
            format!(
                "198.18.1.2,2001:2:0:1::2 lladdr {} gid ::ffff:198.18.0.2 qpn 17 ah ready inflight 3 seen 1.2s ago REACHABLE",
                e.mac
            )
        );
        let mut e2 = e;
        e2.ah = false;
        e2.ah_inflight = 0;
        e2.last_used = Some(t0 + Duration::from_millis(1000));
        let later = t0 + Duration::from_secs(200);
        let line = entry_text(&entry_json(&e2, later));
        assert!(
            line.ends_with("qpn 17 ah none seen 200s ago used 199s ago STALE"),
            "{line}"
        );
    }

    #[test]
    fn an_empty_or_untaken_snapshot_prints_nothing() {
        let r = reply(&NeighSnapshot::default(), Instant::now());
        assert_eq!(r["neigh"], json!([]));
        assert_eq!(r["snapshot_age_ms"], Value::Null);
        assert_eq!(text(&r), "");
    }

    #[test]
    fn ages_read_like_ip() {
        assert_eq!(age_text(0), "0.0s");
        assert_eq!(age_text(1249), "1.2s");
        assert_eq!(age_text(99_999), "99.9s");
        assert_eq!(age_text(100_000), "100s");
    }

    #[test]
    fn a_malformed_entry_prints_question_marks() {
        assert_eq!(
            entry_text(&json!({})),
            "- lladdr ? gid ? qpn ? ah ? seen ? ?"
        );
    }
}
