//! `uipoib stats --watch`: the counters sampled every interval over the control socket,
//! and for each that changed its total and its rate per second (or, for a gauge, how
//! much it moved).
//!
//! On a terminal each interval clears the screen and redraws (as `watch -d ethtool -S`
//! does); otherwise each interval is one block after a timestamp line, no escape codes,
//! so the output can go to a file; with `--json`, one JSON object per interval. A
//! counter lower than at the previous sample (the daemon restarted, its counters began
//! again) is shown as `reset`, never as a negative or huge rate; so is every counter
//! when the daemon's pid changed between two samples.

use std::collections::HashMap;
use std::io::{self, Write};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde_json::{Map, Value, json};

use super::{ControlError, request};
use crate::iface::stats::Snapshot;
use crate::runtime::metrics::GAUGES;

/// Shortest interval accepted.
pub const MIN_INTERVAL: Duration = Duration::from_millis(100);
/// Longest interval accepted.
pub const MAX_INTERVAL: Duration = Duration::from_secs(3600);

/// `--interval SECS`: a number of seconds (fractions allowed) from
/// [`MIN_INTERVAL`] to [`MAX_INTERVAL`].
pub fn parse_interval(s: &str) -> Result<Duration, String> {
    let secs: f64 = s
        .trim()
        .parse()
        .map_err(|_| format!("interval {s:?} is not a number of seconds (e.g. 1 or 0.5)"))?;
    if !secs.is_finite() || secs <= 0.0 {
        return Err(format!(
            "interval {s:?} must be a number of seconds greater than 0 (e.g. 1 or 0.5)"
        ));
    }
    let d = Duration::from_secs_f64(secs);
    if d < MIN_INTERVAL || d > MAX_INTERVAL {
        return Err(format!(
            "interval {s:?} is out of range: from {} to {} seconds",
            MIN_INTERVAL.as_secs_f64(),
            MAX_INTERVAL.as_secs()
        ));
    }
    Ok(d)
}

/// Every counter of a snapshot by name, the drops as `drops.<reason>`, in the order
/// `uipoib stats` prints them.
pub fn flatten(s: &Snapshot) -> Vec<(String, u64)> {
    let mut v: Vec<(String, u64)> = s
        .counters()
        .into_iter()
        .map(|(name, _, value)| (name.to_string(), value))
        .collect();
    v.extend(s.drops.iter().map(|(r, n)| (format!("drops.{r}"), *n)));
    v
}

/// What a counter did between two samples.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Change {
    /// A counter that went up: its rate per second.
    Rate(f64),
    /// A gauge (a value "now"): how much it moved.
    Moved(i128),
    /// Lower than before, or no previous value to compare with (the daemon restarted):
    /// no rate.
    Reset,
}

/// One changed counter.
#[derive(Clone, Debug, PartialEq)]
pub struct Row {
    /// Its name.
    pub name: String,
    /// Its value now.
    pub total: u64,
    /// What it did.
    pub change: Change,
}

/// One sample: when, the daemon's pid if known, every counter.
#[derive(Clone, Debug)]
pub struct Sample {
    /// When it was taken.
    pub at: Instant,
    /// The daemon's pid (from `status`), if it said.
    pub pid: Option<u32>,
    /// Every counter ([`flatten`]).
    pub values: Vec<(String, u64)>,
}

/// The counters that changed from `prev` to `cur`, in `cur`'s order.
pub fn changes(prev: &Sample, cur: &Sample) -> Vec<Row> {
    let restarted = matches!((prev.pid, cur.pid), (Some(a), Some(b)) if a != b);
    let dt = cur.at.saturating_duration_since(prev.at).as_secs_f64();
    let before: HashMap<&str, u64> = prev.values.iter().map(|(k, v)| (k.as_str(), *v)).collect();
    let mut rows = Vec::new();
    for (name, total) in &cur.values {
        let old = before.get(name.as_str()).copied();
        if old == Some(*total) && !restarted {
            continue;
        }
        let change = match old {
            _ if restarted => Change::Reset,
            None => Change::Reset,
            Some(o) if GAUGES.contains(&name.as_str()) => {
                Change::Moved(i128::from(*total) - i128::from(o))
            }
            Some(o) if *total < o => Change::Reset,
            Some(o) if dt > 0.0 => Change::Rate((*total - o) as f64 / dt),
            Some(_) => Change::Rate(0.0),
        };
        rows.push(Row {
            name: name.clone(),
            total: *total,
            change,
        });
    }
    rows
}

/// A change as the rate column shows it: `123.4`, `+2` / `-1` for a gauge, `reset`.
pub fn change_text(c: Change) -> String {
    match c {
        Change::Rate(r) => format!("{r:.1}"),
        Change::Moved(d) if d >= 0 => format!("+{d}"),
        Change::Moved(d) => d.to_string(),
        Change::Reset => "reset".to_string(),
    }
}

/// The table of one interval: a header line, then `counter total rate/s` per changed
/// counter, or one line saying that none changed.
pub fn table(rows: &[Row]) -> String {
    use std::fmt::Write as _;
    let w = rows
        .iter()
        .map(|r| r.name.len())
        .max()
        .unwrap_or(0)
        .max("counter".len());
    let mut t = String::new();
    let _ = writeln!(t, "{:<w$}  {:>20}  {:>14}", "counter", "total", "rate/s");
    if rows.is_empty() {
        let _ = writeln!(t, "(no counter changed)");
    }
    for r in rows {
        let _ = writeln!(
            t,
            "{:<w$}  {:>20}  {:>14}",
            r.name,
            r.total,
            change_text(r.change)
        );
    }
    t
}

/// One interval as a JSON object: `unix_ms`, `interval_s` (the time between the two
/// samples) and `changed`, each changed counter by name with its `total` and one of
/// `rate` (per second), `moved` (a gauge) or `reset: true`.
pub fn json_line(rows: &[Row], unix_ms: u64, interval: Duration) -> Value {
    let changed: Map<String, Value> = rows
        .iter()
        .map(|r| {
            let v = match r.change {
                Change::Rate(x) => json!({"total": r.total, "rate": x}),
                Change::Moved(d) => json!({"total": r.total, "moved": d as i64}),
                Change::Reset => json!({"total": r.total, "reset": true}),
            };
            (r.name.clone(), v)
        })
        .collect();
    json!({
        "unix_ms": unix_ms,
        "interval_s": interval.as_secs_f64(),
        "changed": changed,
    })
}

/// `unix_ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ`.
pub fn utc_text(unix_ms: u64) -> String {
    let (secs, ms) = (unix_ms / 1000, unix_ms % 1000);
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // Civil date from days since 1970-01-01 (H. Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{ms:03}Z",
        rem / 3600,
        (rem / 60) % 60,
        rem % 60
    )
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// How the output looks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// Clear the terminal and redraw each interval.
    Terminal,
    /// One block per interval after a timestamp line.
    Plain,
    /// One JSON object per line per interval.
    Json,
}

/// Why the watch ended other than by a signal.
#[derive(Debug, thiserror::Error)]
pub enum WatchError {
    /// No daemon answered the first sample.
    #[error(transparent)]
    Unreachable(ControlError),
    /// The daemon stopped answering (or answered junk).
    #[error("the daemon at {path} stopped answering: {source}")]
    Lost {
        /// The socket.
        path: std::path::PathBuf,
        /// What the request said.
        #[source]
        source: ControlError,
    },
    /// The daemon's stats reply did not parse.
    #[error("unexpected stats from the daemon at {path}: {why}")]
    BadStats {
        /// The socket.
        path: std::path::PathBuf,
        /// Why.
        why: String,
    },
}

/// Take one sample from the daemon at `path`.
pub fn sample(path: &Path) -> Result<Sample, WatchError> {
    let lost = |source| WatchError::Lost {
        path: path.to_owned(),
        source,
    };
    let v = request(path, "stats").map_err(lost)?;
    let at = Instant::now();
    let s: Snapshot =
        serde_json::from_value(v["stats"].clone()).map_err(|e| WatchError::BadStats {
            path: path.to_owned(),
            why: e.to_string(),
        })?;
    let pid = request(path, "status")
        .map_err(lost)?
        .pointer("/status/pid")
        .and_then(Value::as_u64)
        .and_then(|p| u32::try_from(p).ok());
    Ok(Sample {
        at,
        pid,
        values: flatten(&s),
    })
}

/// Sleep `d`, waking early when `stop` is set; returns whether it was.
fn nap(d: Duration, stop: &AtomicBool) -> bool {
    let end = Instant::now() + d;
    loop {
        if stop.load(Ordering::SeqCst) {
            return true;
        }
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

/// Sample the daemon at `path` every `interval` and print what changed to `out`, until
/// `stop` is set (a signal: `Ok`), `out` is closed (`Ok`), or the daemon goes away.
pub fn run(
    path: &Path,
    interval: Duration,
    mode: Mode,
    stop: &AtomicBool,
    out: &mut dyn Write,
) -> Result<(), WatchError> {
    let mut prev = sample(path).map_err(|e| match e {
        WatchError::Lost { source, .. } => WatchError::Unreachable(source),
        other => other,
    })?;
    loop {
        if nap(interval, stop) {
            return Ok(());
        }
        let cur = sample(path)?;
        let rows = changes(&prev, &cur);
        let dt = cur.at.saturating_duration_since(prev.at);
        let now_ms = unix_ms();
        let text = match mode {
            Mode::Json => format!("{}\n", json_line(&rows, now_ms, dt)),
            Mode::Plain => format!(
                "--- {} ({:.2}s) ---\n{}",
                utc_text(now_ms),
                dt.as_secs_f64(),
                table(&rows)
            ),
            Mode::Terminal => format!(
                "\x1b[H\x1b[2J{}  every {}s  {}\n\n{}",
                path.display(),
                interval.as_secs_f64(),
                utc_text(now_ms),
                table(&rows)
            ),
        };
        match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
            Ok(()) => {}
            // The reader went away (`| head`): done, not an error.
            Err(e) if e.kind() == io::ErrorKind::BrokenPipe => return Ok(()),
            Err(_) => return Ok(()),
        }
        prev = cur;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(at: Instant, pid: Option<u32>, v: &[(&str, u64)]) -> Sample {
        Sample {
            at,
            pid,
            values: v.iter().map(|(k, n)| (k.to_string(), *n)).collect(),
        }
    }

    #[test]
    fn rates_are_per_second_of_the_time_between_samples() {
        let t0 = Instant::now();
        let a = s(t0, Some(1), &[("rx_packets", 100), ("tx_packets", 7)]);
        let b = s(
            t0 + Duration::from_millis(500),
            Some(1),
            &[("rx_packets", 350), ("tx_packets", 7)],
        );
        let rows = changes(&a, &b);
        assert_eq!(
            rows,
            vec![Row {
                name: "rx_packets".into(),
                total: 350,
                change: Change::Rate(500.0)
            }],
            "an unchanged counter is not listed"
        );
    }

    #[test]
    fn a_counter_that_goes_down_is_a_reset_not_a_rate() {
        let t0 = Instant::now();
        let a = s(t0, Some(1), &[("rx_packets", 1_000_000)]);
        let b = s(t0 + Duration::from_secs(1), Some(1), &[("rx_packets", 12)]);
        let rows = changes(&a, &b);
        assert_eq!(rows[0].change, Change::Reset);
        assert_eq!(change_text(rows[0].change), "reset");
        let t = table(&rows);
        assert!(!t.contains('-') && t.contains("reset"), "{t}");
        // A restarted daemon (another pid) whose counters already passed the old ones:
        // no rate from the old process's numbers either.
        let c = s(
            t0 + Duration::from_secs(2),
            Some(2),
            &[("rx_packets", 5_000_000)],
        );
        assert_eq!(changes(&b, &c)[0].change, Change::Reset);
        // A counter new to this sample has nothing to compare with.
        let d = s(
            t0 + Duration::from_secs(3),
            Some(2),
            &[("rx_packets", 5_000_100), ("new_counter", 9)],
        );
        let rows = changes(&c, &d);
        assert_eq!(rows[0].change, Change::Rate(100.0));
        assert_eq!(rows[1].change, Change::Reset);
    }

    #[test]
    fn gauges_show_how_far_they_moved() {
        let t0 = Instant::now();
        let a = s(t0, None, &[("neigh_entries", 3), ("send_outstanding", 10)]);
        let b = s(
            t0 + Duration::from_secs(1),
            None,
            &[("neigh_entries", 1), ("send_outstanding", 12)],
        );
        let rows = changes(&a, &b);
        assert_eq!(rows[0].change, Change::Moved(-2));
        assert_eq!(rows[1].change, Change::Moved(2));
        assert_eq!(change_text(rows[0].change), "-2");
        assert_eq!(change_text(rows[1].change), "+2");
        let j = json_line(&rows, 0, Duration::from_secs(1));
        assert_eq!(j["changed"]["neigh_entries"]["moved"], -2);
    }

    #[test]
    fn table_and_json_show_total_and_rate() {
        let rows = vec![Row {
            name: "rx_packets".into(),
            total: 350,
            change: Change::Rate(500.0),
        }];
        let t = table(&rows);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 2);
        assert!(lines[0].starts_with("counter") && lines[0].ends_with("rate/s"));
        let cols: Vec<&str> = lines[1].split_whitespace().collect();
        assert_eq!(cols, ["rx_packets", "350", "500.0"]);
        assert_eq!(table(&[]).lines().nth(1), Some("(no counter changed)"));
        let j = json_line(&rows, 1234, Duration::from_millis(500));
        assert_eq!(
            j["changed"]["rx_packets"],
            json!({"total": 350, "rate": 500.0})
        );
        assert_eq!(
            (j["unix_ms"].as_u64(), j["interval_s"].as_f64()),
            (Some(1234), Some(0.5))
        );
    }

    #[test]
    fn intervals_are_positive_numbers_of_seconds() {
        assert_eq!(parse_interval("1"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("0.25"), Ok(Duration::from_millis(250)));
        for bad in ["0", "-1", "soon", "", "nan", "inf"] {
            let e = parse_interval(bad).unwrap_err();
            assert!(e.contains(&format!("{bad:?}")), "{bad}: {e}");
        }
        assert!(parse_interval("0").unwrap_err().contains("greater than 0"));
        assert!(parse_interval("0.01").unwrap_err().contains("out of range"));
    }

    #[test]
    fn timestamps_are_utc() {
        assert_eq!(utc_text(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(utc_text(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(utc_text(1_798_761_599_999), "2026-12-31T23:59:59.999Z");
    }

    #[test]
    fn flatten_names_the_drops() {
        let mut snap = Snapshot {
            rx_packets: 4,
            ..Default::default()
        };
        snap.drops.insert("tx_no_route".into(), 2);
        let v = flatten(&snap);
        assert!(v.contains(&("rx_packets".into(), 4)));
        assert!(v.contains(&("drops.tx_no_route".into(), 2)));
    }

    #[test]
    fn on_a_terminal_each_interval_clears_and_redraws() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("uipoib-watch-tty-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
        let path = dir.join("c.sock");
        let _srv = super::super::ControlServer::start_bare(&path, None).unwrap();
        let stop = std::sync::Arc::new(AtomicBool::new(false));
        let s2 = stop.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(450));
            s2.store(true, Ordering::SeqCst);
        });
        let mut out = Vec::new();
        let started = Instant::now();
        run(&path, MIN_INTERVAL * 2, Mode::Terminal, &stop, &mut out).unwrap();
        t.join().unwrap();
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "stopped promptly"
        );
        let text = String::from_utf8(out).unwrap();
        let frames: Vec<&str> = text.split("\x1b[H\x1b[2J").collect();
        assert_eq!(frames[0], "", "every frame starts with the clear: {text:?}");
        assert!(frames.len() >= 3, "two redraws or more: {text:?}");
        assert!(frames[1].contains("counter") && frames[1].contains(path.to_str().unwrap()));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
