//! The load's iperf3 intervals around the faults: the longest stretch of ~0-byte
//! intervals near each fault and where it ends, the lowest interval, the bytes after it,
//! and the longest such stretch away from every fault. Pure functions over the stamped
//! interval lines.

use super::report::{Iperf3Session, Iperf3Window};
use super::traffic::Interval;

/// Below this many bytes an interval is ~0 when there is no baseline to take 1% of.
const ZERO_WITHOUT_BASELINE: f64 = 64.0 * 1024.0;
/// A window starts this long before its fault's injection (ms).
const BEFORE_MS: f64 = 1000.0;
/// A stretch away from the faults counts from this long (ms).
const OUTSIDE_MIN_MS: f64 = 500.0;

/// An interval placed on the wall clock (ms since the Unix epoch).
#[derive(Clone, Copy, Debug)]
struct Placed {
    start: f64,
    end: f64,
    secs: f64,
    bytes: f64,
}

/// Each line is stamped when it is read, about when its interval ended: the test's
/// start on the wall clock is the median of stamp - end, which one late line does not
/// move.
fn place(iv: &[Interval]) -> Vec<Placed> {
    if iv.is_empty() {
        return Vec::new();
    }
    let t0 = median(
        iv.iter()
            .map(|i| i.stamp_ms as f64 - i.end_s * 1000.0)
            .collect(),
    )
    .unwrap_or(0.0);
    iv.iter()
        .map(|i| Placed {
            start: t0 + i.start_s * 1000.0,
            end: t0 + i.end_s * 1000.0,
            secs: i.end_s - i.start_s,
            bytes: i.bytes,
        })
        .collect()
}

fn median(mut v: Vec<f64>) -> Option<f64> {
    if v.is_empty() {
        return None;
    }
    v.sort_by(f64::total_cmp);
    let n = v.len();
    Some(if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    })
}

/// The longest run of consecutive intervals of `run` under `zero` bytes, as (its
/// duration, first, last).
fn longest_run<'a>(
    iv: impl Iterator<Item = &'a Placed>,
    zero: impl Fn(&Placed) -> bool,
) -> Option<(f64, Placed, Placed)> {
    let mut best: Option<(f64, Placed, Placed)> = None;
    let mut run: Option<(Placed, Placed)> = None;
    let mut end_run = |run: &mut Option<(Placed, Placed)>| {
        if let Some((a, b)) = run.take() {
            let d = b.end - a.start;
            if best.is_none_or(|(bd, _, _)| d > bd) {
                best = Some((d, a, b));
            }
        }
    };
    for i in iv {
        if zero(i) {
            run = Some(run.map_or((*i, *i), |(a, _)| (a, *i)));
        } else {
            end_run(&mut run);
        }
    }
    end_run(&mut run);
    best
}

/// The steady rate (the median bytes of the intervals before `first`, the first fault,
/// the slow start left out) and the ~0 limit taken from it.
fn steady(placed: &[Placed], first: Option<f64>) -> (Option<f64>, f64) {
    let before: Vec<f64> = placed
        .iter()
        .skip(1)
        .filter(|p| first.is_none_or(|f| p.end <= f))
        .map(|p| p.bytes)
        .collect();
    let baseline = median(before);
    (
        baseline,
        baseline.map_or(ZERO_WITHOUT_BASELINE, |b| b * 0.01),
    )
}

/// The whole session and each fault's window. `faults` are the faults' injection
/// times and the ends of their windows (the next fault, or the end of the load), in
/// order.
pub(super) fn analyse(
    iv: &[Interval],
    faults: &[(u64, u64)],
) -> (Iperf3Session, Vec<Option<Iperf3Window>>) {
    let placed = place(iv);
    let (baseline, zero_limit) = steady(&placed, faults.first().map(|(t, _)| *t as f64));
    let windows: Vec<(f64, f64)> = faults
        .iter()
        .map(|(t, end)| (*t as f64 - BEFORE_MS, *end as f64))
        .collect();
    let per_fault = faults
        .iter()
        .zip(&windows)
        .map(|((t, _), (from, to))| window(&placed, *t as f64, *from, *to, baseline, zero_limit))
        .collect();
    let outside = longest_run(placed.iter(), |p| {
        p.bytes < zero_limit && !windows.iter().any(|(a, b)| *a < p.end && p.start < *b)
    })
    .filter(|(d, _, _)| *d >= OUTSIDE_MIN_MS);
    let session = Iperf3Session {
        intervals: placed.len(),
        baseline_bytes: baseline,
        zero_limit_bytes: zero_limit,
        longest_gap_outside_faults_ms: outside.map_or(0.0, |(d, _, _)| d),
        longest_gap_outside_faults_at_ms: outside
            .zip(placed.first())
            .map(|((_, a, _), p0)| a.start - p0.start),
    };
    (session, per_fault)
}

/// Whether an interval that starts at `from` (ms since the Unix epoch) or later moved
/// more than ~0 bytes, ~0 measured as by [`analyse`] with `first` the run's first fault
/// (the steady rate is taken before it).
pub(super) fn moved_after(iv: &[Interval], first: u64, from: u64) -> bool {
    let placed = place(iv);
    let (_, zero_limit) = steady(&placed, Some(first as f64));
    placed
        .iter()
        .any(|p| p.start >= from as f64 - 1.0 && p.bytes >= zero_limit)
}

fn window(
    placed: &[Placed],
    t: f64,
    from: f64,
    to: f64,
    baseline: Option<f64>,
    zero_limit: f64,
) -> Option<Iperf3Window> {
    let win: Vec<&Placed> = placed
        .iter()
        .filter(|p| p.end > from && p.start < to)
        .collect();
    if win.is_empty() {
        return None;
    }
    let gap = longest_run(win.iter().copied(), |p| p.bytes < zero_limit);
    let after_from = gap.map_or(t, |(_, _, last)| last.end);
    let after: Vec<&&Placed> = win.iter().filter(|p| p.start >= after_from - 1.0).collect();
    // (A sum of no f64 is -0.0.)
    let bytes_after = after.iter().fold(0.0, |s, p| s + p.bytes);
    let secs = after.iter().fold(0.0, |s, p| s + p.secs);
    let lowest = win.iter().map(|p| p.bytes).fold(f64::INFINITY, f64::min);
    Some(Iperf3Window {
        window_ms: [from - t, to - t],
        gap_ms: gap.map_or(0.0, |(d, _, _)| d),
        gap_from_ms: gap.map(|(_, a, _)| a.start - t),
        gap_to_ms: gap.map(|(_, _, b)| b.end - t),
        back_ms: gap.map_or(0.0, |(_, _, b)| (b.end - t).max(0.0)),
        min_pct: baseline.filter(|b| *b > 0.0).map(|b| lowest * 100.0 / b),
        bytes_after,
        intervals_after: after.len(),
        mbps_after: (secs > 0.0).then(|| bytes_after * 8.0 / secs / 1e6),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One-second intervals from `t0` ms, each line read 30 ms after its end.
    fn series(t0: u64, bytes: &[f64]) -> Vec<Interval> {
        bytes
            .iter()
            .enumerate()
            .map(|(n, b)| Interval {
                stamp_ms: t0 + (n as u64 + 1) * 1000 + 30,
                start_s: n as f64,
                end_s: n as f64 + 1.0,
                bytes: *b,
                mbps: b * 8.0 / 1e6,
            })
            .collect()
    }

    #[test]
    fn the_longest_stretch_near_a_fault_and_where_it_ends() {
        let m = 10e6;
        // Slow start, 4 steady, the fault at 5.5 s, 3 s of nothing, then back at half,
        // then a stall of 2 s away from the fault (its window ends at 12 s).
        let b = [
            1e6,
            m,
            m,
            m,
            m,
            m,
            0.0,
            0.0,
            0.0,
            m / 2.0,
            m,
            m,
            m,
            0.0,
            0.0,
            m,
        ];
        let iv = series(100_000, &b);
        // The lines are read 30 ms late: the test started at 100.030 s.
        let t = 100_030 + 5_500;
        let (s, w) = analyse(&iv, &[(t, 100_030 + 12_000)]);
        assert_eq!(s.intervals, 16);
        assert_eq!(s.baseline_bytes, Some(m));
        assert_eq!(s.zero_limit_bytes, m * 0.01);
        let w = w[0].clone().unwrap();
        assert!((w.gap_ms - 3000.0).abs() < 1.0, "{w:?}");
        assert!((w.gap_from_ms.unwrap() - 500.0).abs() < 1.0, "{w:?}");
        assert!((w.gap_to_ms.unwrap() - 3500.0).abs() < 1.0, "{w:?}");
        assert!((w.back_ms - 3500.0).abs() < 1.0, "{w:?}");
        assert_eq!(w.min_pct, Some(0.0));
        // After the stretch: 9..12 s, three intervals in the window.
        assert_eq!(w.intervals_after, 3);
        assert_eq!(w.bytes_after, m / 2.0 + 2.0 * m);
        assert!(
            (s.longest_gap_outside_faults_ms - 2000.0).abs() < 1.0,
            "{s:?}"
        );
        assert!((s.longest_gap_outside_faults_at_ms.unwrap() - 13_000.0).abs() < 1.0);
    }

    #[test]
    fn no_stretch_means_back_at_once() {
        let m = 10e6;
        let iv = series(0, &[m, m, m, m / 4.0, m, m]);
        let (_, w) = analyse(&iv, &[(3_230, 6_030)]);
        let w = w[0].clone().unwrap();
        assert_eq!((w.gap_ms, w.back_ms, w.gap_from_ms), (0.0, 0.0, None));
        assert_eq!(w.min_pct, Some(25.0));
        assert!(w.bytes_after > 0.0);
    }

    #[test]
    fn moved_after_counts_only_intervals_from_the_given_time_above_the_zero_limit() {
        let m = 10e6;
        // Read 30 ms after each end: the test started at 30 ms. Steady to 4 s, the first
        // fault at 4.5 s, 1% of steady at 5-6 s (not ~0: at the limit), ~0 to 8 s, then
        // data from 8 s.
        let iv = series(0, &[m, m, m, m, m, m * 0.01, 10.0, 10.0, m, m]);
        assert!(moved_after(&iv, 4_530, 8_030), "the data from 8 s");
        assert!(moved_after(&iv, 4_530, 5_030), "1% of steady is data");
        assert!(
            !moved_after(&iv, 4_530, 9_100),
            "nothing starts after 9.1 s"
        );
        // ~0 alone after the time: no.
        let iv = series(0, &[m, m, m, m, m, 10.0, 10.0, 10.0]);
        assert!(!moved_after(&iv, 4_530, 5_030));
        // Without a steady rate before the first fault the limit is 64 KiB.
        let iv = series(0, &[70e3, 60e3]);
        assert!(moved_after(&iv, 0, 30));
        assert!(!moved_after(&iv, 0, 1_030));
        assert!(!moved_after(&[], 0, 0));
    }

    #[test]
    fn without_intervals_there_is_no_window() {
        let (s, w) = analyse(&[], &[(1_000, 2_000)]);
        assert_eq!(s.intervals, 0);
        assert_eq!(s.zero_limit_bytes, ZERO_WITHOUT_BASELINE);
        assert!(w[0].is_none());
    }
}
