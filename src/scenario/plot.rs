//! Plots of a run's recoveries: one SVG per fault (and one per policy of a comparison),
//! drawn from the report's time series ([`super::series`]) as hand-written SVG text.
//!
//! A plot shows, against seconds from the injection (the fault's first hit), the
//! interface's receive and send rate in Mbit/s between consecutive counter samples (a
//! line breaks where a new daemon's counters start again), the load's iperf3 intervals
//! as a step line when the load is iperf3, a shaded band while the supervisor was not
//! `running`, and three vertical markers: the injection, the detection (the restart's
//! start, or the first counter that showed the fault) and the resumption (traffic moving
//! again). The title names the scenario, the fault and its recovery time.
//!
//! Files, next to the JSON report:
//! - `uipoib fault run`: `SCENARIO-N-FAULT.svg`, N the fault's 1-based index in the
//!   report (`faults[N-1]`), FAULT its kind (`poll-error`, `kill`, `storm`, ...);
//! - `uipoib fault compare`: `compare-SCENARIO-POLICY.svg`, one per policy, every one
//!   on the same Mbit/s scale so that they can be set side by side.
//!
//! Characters other than letters, digits, `.`, `_` and `-` in a name become `_`.
//! Every number written is finite: an empty series gives a plot that says so.

use std::fmt::Write as _;
use std::path::Path;

use super::compare::{CompareReport, PolicyRun};
use super::report::{FaultReport, Report};
use super::series::{SeriesInterval, SeriesSample, finite};

/// The picture's size (px).
const W: f64 = 960.0;
const H: f64 = 500.0;
/// The plot area's edges (px).
const LEFT: f64 = 76.0;
const RIGHT: f64 = W - 24.0;
const TOP: f64 = 64.0;
const BOTTOM: f64 = H - 112.0;
/// Seconds shown before the injection.
const BEFORE_MS: u64 = 3000;

const RX_COLOR: &str = "#1f77b4";
const TX_COLOR: &str = "#9467bd";
const IPERF_COLOR: &str = "#7f7f7f";
const INJECT_COLOR: &str = "#d62728";
const DETECT_COLOR: &str = "#ff7f0e";
const RESUME_COLOR: &str = "#2ca02c";

/// A line: its name (for the legend), colour, dashes, and its pieces (each a run of
/// points; a new piece where the data breaks off).
#[derive(Debug, Clone, Default)]
pub(super) struct Line {
    pub(super) name: String,
    pub(super) color: &'static str,
    pub(super) dash: Option<&'static str>,
    pub(super) pieces: Vec<Vec<(f64, f64)>>,
}

impl Line {
    fn points(&self) -> impl Iterator<Item = &(f64, f64)> {
        self.pieces.iter().flatten()
    }
}

/// A vertical marker at `x` (s).
#[derive(Debug, Clone)]
pub(super) struct Marker {
    /// `injection`, `detection` or `resume` (its SVG class).
    pub(super) kind: &'static str,
    pub(super) label: String,
    pub(super) x: f64,
    pub(super) color: &'static str,
}

/// What a plot shows.
#[derive(Debug, Clone, Default)]
pub(super) struct Plot {
    pub(super) title: String,
    pub(super) subtitle: String,
    pub(super) x_label: String,
    pub(super) lines: Vec<Line>,
    pub(super) markers: Vec<Marker>,
    /// Stretches (s) in which the supervisor was not running.
    pub(super) bands: Vec<(f64, f64)>,
    /// The x axis' range (s), when set; else the data's and the markers'.
    pub(super) x_range: Option<(f64, f64)>,
    /// The y axis' top (Mbit/s) at least, when set (the same scale across plots).
    pub(super) y_max: Option<f64>,
    /// What the plot area says when there is no line to draw.
    pub(super) empty: String,
    /// Lines of notes under the legend.
    pub(super) notes: Vec<String>,
}

/// Data to pixels.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Scale {
    pub(super) x0: f64,
    pub(super) x1: f64,
    pub(super) y1: f64,
}

impl Scale {
    /// Pixels from the left of a time `x` (s).
    pub(super) fn x(&self, x: f64) -> f64 {
        finite(LEFT + (x - self.x0) / (self.x1 - self.x0) * (RIGHT - LEFT))
    }

    /// Pixels from the top of a rate `y` (Mbit/s); the y axis starts at 0.
    pub(super) fn y(&self, y: f64) -> f64 {
        finite(BOTTOM - y / self.y1 * (BOTTOM - TOP))
    }
}

/// A step of 1, 2 or 5 times a power of ten that cuts `lo..hi` into about `target`.
pub(super) fn tick_step(lo: f64, hi: f64, target: f64) -> f64 {
    let span = hi - lo;
    if !span.is_finite() || span <= 0.0 || !target.is_finite() || target < 1.0 {
        return 1.0;
    }
    let raw = span / target;
    let mag = 10f64.powf(raw.log10().floor());
    let norm = raw / mag;
    let step = if norm <= 1.0 {
        1.0
    } else if norm <= 2.0 {
        2.0
    } else if norm <= 5.0 {
        5.0
    } else {
        10.0
    } * mag;
    if step.is_finite() && step > 0.0 {
        step
    } else {
        1.0
    }
}

/// The ticks of `lo..hi` (multiples of the step), at most 100.
pub(super) fn ticks(lo: f64, hi: f64, target: f64) -> (f64, Vec<f64>) {
    let step = tick_step(lo, hi, target);
    let mut v = Vec::new();
    if !(lo.is_finite() && hi.is_finite()) {
        return (step, v);
    }
    let mut t = (lo / step).ceil() * step;
    while t <= hi + step * 1e-9 && v.len() < 100 {
        v.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    (step, v)
}

/// A tick's label, with as many decimals as the step needs.
fn tick_label(v: f64, step: f64) -> String {
    let d = if step >= 1.0 {
        0
    } else {
        (-step.log10().floor()).clamp(0.0, 6.0) as usize
    };
    let s = format!("{:.*}", d, finite(v));
    if s.trim_start_matches('-')
        .chars()
        .all(|c| c == '0' || c == '.')
    {
        "0".into()
    } else {
        s
    }
}

/// The top of the y axis for data up to `max`: a tick at or above it (1 when nothing
/// moved).
fn y_top(max: f64) -> f64 {
    if !max.is_finite() || max <= 0.0 {
        return 1.0;
    }
    let step = tick_step(0.0, max * 1.05, 5.0);
    ((max * 1.05 / step).ceil() * step).max(step)
}

/// A number for an attribute: finite, one decimal.
fn n(v: f64) -> String {
    format!("{:.1}", finite(v))
}

/// Text for XML content or an attribute.
pub(super) fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            // Not allowed in XML 1.0.
            c if (c as u32) < 0x20 && !matches!(c, '\t' | '\n' | '\r') => o.push(' '),
            c => o.push(c),
        }
    }
    o
}

impl Plot {
    /// The scale: the x range given (or the data's and the markers', or -1..1), the y
    /// axis from 0 to a tick above the highest point.
    pub(super) fn scale(&self) -> Scale {
        let xs = self
            .lines
            .iter()
            .flat_map(|l| l.points().map(|p| p.0))
            .chain(self.markers.iter().map(|m| m.x))
            .chain(self.bands.iter().flat_map(|b| [b.0, b.1]))
            .filter(|x| x.is_finite());
        let (mut x0, mut x1) = match self.x_range {
            Some((a, b)) if a.is_finite() && b.is_finite() => (a, b),
            _ => xs.fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), x| {
                (a.min(x), b.max(x))
            }),
        };
        if !(x0.is_finite() && x1.is_finite()) {
            (x0, x1) = (-1.0, 1.0);
        }
        if x1 - x0 < 1e-3 {
            (x0, x1) = (x0 - 1.0, x1 + 1.0);
        }
        let ymax = self
            .lines
            .iter()
            .flat_map(|l| l.points().map(|p| p.1))
            .filter(|y| y.is_finite())
            .fold(self.y_max.map_or(0.0, finite), f64::max);
        Scale {
            x0,
            x1,
            y1: y_top(ymax),
        }
    }

    /// The SVG document.
    pub(super) fn render(&self) -> String {
        let sc = self.scale();
        let mut s = String::new();
        let _ = writeln!(
            s,
            r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" viewBox="0 0 {w} {h}" font-family="sans-serif" font-size="12">"#,
            w = n(W),
            h = n(H)
        );
        let _ = writeln!(s, "<title>{}</title>", esc(&self.title));
        let _ = writeln!(
            s,
            r##"<rect x="0" y="0" width="{}" height="{}" fill="#ffffff"/>"##,
            n(W),
            n(H)
        );
        let _ = writeln!(
            s,
            r#"<defs><clipPath id="area"><rect x="{}" y="{}" width="{}" height="{}"/></clipPath></defs>"#,
            n(LEFT),
            n(TOP),
            n(RIGHT - LEFT),
            n(BOTTOM - TOP)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="22" font-size="16" font-weight="bold">{}</text>"#,
            n(LEFT),
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="42">{}</text>"#,
            n(LEFT),
            esc(&self.subtitle)
        );
        // Bands where the supervisor was not running.
        let _ = writeln!(s, r#"<g clip-path="url(#area)">"#);
        for (a, b) in &self.bands {
            let (xa, xb) = (sc.x(*a), sc.x(*b));
            let _ = writeln!(
                s,
                r##"<rect class="not-running" x="{}" y="{}" width="{}" height="{}" fill="#d62728" fill-opacity="0.08"/>"##,
                n(xa.min(xb)),
                n(TOP),
                n((xb - xa).abs().max(1.0)),
                n(BOTTOM - TOP)
            );
        }
        let _ = writeln!(s, "</g>");
        // Grid and ticks.
        let (xstep, xt) = ticks(sc.x0, sc.x1, 10.0);
        let (ystep, yt) = ticks(0.0, sc.y1, 5.0);
        for t in &xt {
            let x = sc.x(*t);
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#e6e6e6"/><line x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="#000000"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                n(TOP),
                n(BOTTOM),
                n(BOTTOM),
                n(BOTTOM + 5.0),
                n(BOTTOM + 19.0),
                tick_label(*t, xstep),
                x = n(x)
            );
        }
        for t in &yt {
            let y = sc.y(*t);
            let _ = writeln!(
                s,
                r##"<line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#e6e6e6"/><line x1="{}" y1="{y}" x2="{}" y2="{y}" stroke="#000000"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                n(LEFT),
                n(RIGHT),
                n(LEFT - 5.0),
                n(LEFT),
                n(LEFT - 8.0),
                n(y + 4.0),
                tick_label(*t, ystep),
                y = n(y)
            );
        }
        // Axes and their labels.
        let _ = writeln!(
            s,
            r##"<rect x="{}" y="{}" width="{}" height="{}" fill="none" stroke="#000000"/>"##,
            n(LEFT),
            n(TOP),
            n(RIGHT - LEFT),
            n(BOTTOM - TOP)
        );
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            n((LEFT + RIGHT) / 2.0),
            n(BOTTOM + 38.0),
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="18" y="{y}" text-anchor="middle" transform="rotate(-90 18 {y})">Mbit/s</text>"#,
            y = n((TOP + BOTTOM) / 2.0)
        );
        // The lines.
        let _ = writeln!(s, r#"<g clip-path="url(#area)" fill="none">"#);
        for l in &self.lines {
            for piece in &l.pieces {
                let pts: Vec<String> = piece
                    .iter()
                    .filter(|(x, y)| x.is_finite() && y.is_finite())
                    .map(|(x, y)| format!("{},{}", n(sc.x(*x)), n(sc.y(*y))))
                    .collect();
                match pts.len() {
                    0 => {}
                    1 => {
                        let (x, y) = pts[0].split_once(',').unwrap_or(("0", "0"));
                        let _ =
                            writeln!(s, r#"<circle cx="{x}" cy="{y}" r="2" fill="{}"/>"#, l.color);
                    }
                    _ => {
                        let _ = writeln!(
                            s,
                            r#"<polyline points="{}" stroke="{}" stroke-width="1.5"{}/>"#,
                            pts.join(" "),
                            l.color,
                            l.dash
                                .map(|d| format!(r#" stroke-dasharray="{d}""#))
                                .unwrap_or_default()
                        );
                    }
                }
            }
        }
        let _ = writeln!(s, "</g>");
        if self.lines.iter().all(|l| l.points().next().is_none()) {
            let _ = writeln!(
                s,
                r##"<text class="empty" x="{}" y="{}" text-anchor="middle" font-size="16" fill="#555555">{}</text>"##,
                n((LEFT + RIGHT) / 2.0),
                n((TOP + BOTTOM) / 2.0),
                esc(if self.empty.is_empty() {
                    "no samples"
                } else {
                    &self.empty
                })
            );
        }
        // The markers, their labels one under the other (they are often close).
        for (k, m) in self.markers.iter().enumerate() {
            let x = sc.x(m.x);
            if !(LEFT - 0.5..=RIGHT + 0.5).contains(&x) {
                continue;
            }
            let _ = writeln!(
                s,
                r#"<line class="marker {}" x1="{x}" y1="{}" x2="{x}" y2="{}" stroke="{}" stroke-width="1.5" stroke-dasharray="5 3"/>"#,
                m.kind,
                n(TOP),
                n(BOTTOM),
                m.color,
                x = n(x)
            );
            let ly = TOP + 14.0 + 15.0 * k as f64;
            let (lx, anchor) = if x > RIGHT - 180.0 {
                (x - 4.0, "end")
            } else {
                (x + 4.0, "start")
            };
            let _ = writeln!(
                s,
                r#"<text class="marker-label {}" x="{}" y="{}" text-anchor="{anchor}" fill="{}" stroke="white" stroke-width="3" paint-order="stroke">{}</text>"#,
                m.kind,
                n(lx),
                n(ly),
                m.color,
                esc(&m.label)
            );
        }
        // The legend, then the notes.
        let mut items: Vec<(String, String)> = Vec::new();
        let line_swatch = |color: &str, dash: Option<&str>| {
            format!(
                r#"<line x1="0" y1="0" x2="22" y2="0" stroke="{color}" stroke-width="2"{}/>"#,
                dash.map(|d| format!(r#" stroke-dasharray="{d}""#))
                    .unwrap_or_default()
            )
        };
        for l in &self.lines {
            items.push((line_swatch(l.color, l.dash), l.name.clone()));
        }
        if !self.bands.is_empty() {
            items.push((
                r##"<rect x="0" y="-5" width="22" height="10" fill="#d62728" fill-opacity="0.15"/>"##
                    .into(),
                "not running".into(),
            ));
        }
        for (kind, color, label) in [
            ("injection", INJECT_COLOR, "injection"),
            ("detection", DETECT_COLOR, "detection"),
            ("resume", RESUME_COLOR, "traffic resumed"),
        ] {
            if self.markers.iter().any(|m| m.kind == kind) {
                items.push((line_swatch(color, Some("5 3")), label.into()));
            }
        }
        let mut lx = LEFT;
        let ly = BOTTOM + 62.0;
        let _ = writeln!(s, r#"<g class="legend">"#);
        for (swatch, label) in &items {
            let _ = writeln!(
                s,
                r#"<g transform="translate({} {})">{swatch}<text x="28" y="4">{}</text></g>"#,
                n(lx),
                n(ly),
                esc(label)
            );
            lx += 40.0 + 6.5 * label.chars().count() as f64;
        }
        let _ = writeln!(s, "</g>");
        if !self.notes.is_empty() {
            let _ = writeln!(
                s,
                r##"<text class="notes" x="{}" y="{}" font-size="11" fill="#555555">{}</text>"##,
                n(LEFT),
                n(BOTTOM + 86.0),
                esc(&self.notes.join("; "))
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

/// `s` as a file-name part: letters, digits, `.`, `_` and `-` kept, the rest `_`.
fn safe(s: &str) -> String {
    let o: String = s
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if o.is_empty() || o.starts_with('.') {
        format!("_{o}")
    } else {
        o
    }
}

/// The file name of fault `index` (1-based) of a run: `SCENARIO-N-FAULT.svg`.
pub fn run_plot_name(scenario: &str, index: usize, fault: &str) -> String {
    format!("{}-{index}-{}.svg", safe(scenario), safe(fault))
}

/// The file name of a comparison's plot for one policy: `compare-SCENARIO-POLICY.svg`.
pub fn compare_plot_name(scenario: &str, policy: &str) -> String {
    format!("compare-{}-{}.svg", safe(scenario), safe(policy))
}

/// Seconds from `origin` to `t` (both ms since the Unix epoch).
fn secs(t: u64, origin: u64) -> f64 {
    (t as f64 - origin as f64) / 1e3
}

/// The receive and send rates (Mbit/s) between consecutive samples of one daemon, at
/// the later sample's time, within `from..=to` (ms since the Unix epoch).
fn rate_lines(samples: &[SeriesSample], origin: u64, from: u64, to: u64) -> [Line; 2] {
    let mut rx = Line {
        name: "received (uipoib)".into(),
        color: RX_COLOR,
        ..Line::default()
    };
    let mut tx = Line {
        name: "sent (uipoib)".into(),
        color: TX_COLOR,
        dash: None,
        ..Line::default()
    };
    let (mut prx, mut ptx) = (Vec::new(), Vec::new());
    for w in samples.windows(2) {
        let (a, b) = (&w[0], &w[1]);
        let ok = a.daemon == b.daemon
            && b.unix_ms > a.unix_ms
            && b.rx_bytes >= a.rx_bytes
            && b.tx_bytes >= a.tx_bytes;
        let inside = b.unix_ms >= from && b.unix_ms <= to;
        if ok && inside {
            let dt = (b.unix_ms - a.unix_ms) as f64;
            let x = secs(b.unix_ms, origin);
            prx.push((x, (b.rx_bytes - a.rx_bytes) as f64 * 8.0 / (dt * 1e3)));
            ptx.push((x, (b.tx_bytes - a.tx_bytes) as f64 * 8.0 / (dt * 1e3)));
        } else {
            rx.pieces
                .extend((!prx.is_empty()).then(|| std::mem::take(&mut prx)));
            tx.pieces
                .extend((!ptx.is_empty()).then(|| std::mem::take(&mut ptx)));
        }
    }
    rx.pieces.extend((!prx.is_empty()).then_some(prx));
    tx.pieces.extend((!ptx.is_empty()).then_some(ptx));
    [rx, tx]
}

/// iperf3's intervals within `from..=to` as a step line (each interval ends when its
/// line was read); a piece ends where a line is missing.
fn iperf3_line(iv: &[SeriesInterval], origin: u64, from: u64, to: u64) -> Line {
    let mut l = Line {
        name: "iperf3 intervals".into(),
        color: IPERF_COLOR,
        dash: Some("6 3"),
        ..Line::default()
    };
    let mut piece: Vec<(f64, f64)> = Vec::new();
    let mut last_end: Option<f64> = None;
    for i in iv {
        let dur_ms = finite((i.end_s - i.start_s) * 1e3).clamp(0.0, 60_000.0);
        let end = i.unix_ms as f64;
        let start = end - dur_ms;
        if end < from as f64 || start > to as f64 {
            continue;
        }
        if last_end.is_some_and(|e| start > e + 500.0) && !piece.is_empty() {
            l.pieces.push(std::mem::take(&mut piece));
        }
        let y = finite(i.mbps).max(0.0);
        piece.push(((start - origin as f64) / 1e3, y));
        piece.push(((end - origin as f64) / 1e3, y));
        last_end = Some(end);
    }
    if !piece.is_empty() {
        l.pieces.push(piece);
    }
    l
}

/// The stretches (s) within `from..=to` in which the samples say the supervisor was
/// not running.
fn not_running(samples: &[SeriesSample], origin: u64, from: u64, to: u64) -> Vec<(f64, f64)> {
    let mut bands = Vec::new();
    let mut start: Option<u64> = None;
    let mut prev: Option<u64> = None;
    for s in samples {
        let down = !s.state.is_empty() && s.state != "running";
        match (down, start) {
            (true, None) => start = Some(prev.unwrap_or(s.unix_ms)),
            (false, Some(a)) => {
                bands.push((a, s.unix_ms));
                start = None;
            }
            _ => {}
        }
        prev = Some(s.unix_ms);
    }
    if let (Some(a), Some(b)) = (start, prev) {
        bands.push((a, b));
    }
    bands
        .into_iter()
        .filter(|(a, b)| *b >= from && *a <= to)
        .map(|(a, b)| (secs(a.max(from), origin), secs(b.min(to), origin)))
        .collect()
}

/// A duration: one decimal below 10 ms (a restart on the simulated fabric takes less
/// than one), none above.
fn ms_text(v: Option<f64>) -> String {
    v.map_or_else(
        || "-".into(),
        |v| {
            let v = finite(v);
            if v.abs() < 10.0 {
                format!("{v:.1} ms")
            } else {
                format!("{v:.0} ms")
            }
        },
    )
}

/// The three markers from the times given (ms since the Unix epoch), as offsets from
/// `origin`, and the notes for the missing ones.
fn markers(
    origin: u64,
    injected: Option<u64>,
    detected: Option<u64>,
    resumed: Option<u64>,
    injection_label: &str,
    notes: &mut Vec<String>,
) -> Vec<Marker> {
    let mut m = Vec::new();
    let off = |t: u64| format!("{:+.0} ms", t as f64 - origin as f64);
    match injected {
        Some(t) => m.push(Marker {
            kind: "injection",
            label: format!("{injection_label} {}", off(t)),
            x: secs(t, origin),
            color: INJECT_COLOR,
        }),
        None => notes.push("no injection: the fault never fired".into()),
    }
    if let Some(t) = detected {
        m.push(Marker {
            kind: "detection",
            label: format!("detection {}", off(t)),
            x: secs(t, origin),
            color: DETECT_COLOR,
        });
    }
    match resumed {
        Some(t) => m.push(Marker {
            kind: "resume",
            label: format!("traffic resumed {}", off(t)),
            x: secs(t, origin),
            color: RESUME_COLOR,
        }),
        None => notes.push("traffic did not resume while the fault was followed".into()),
    }
    m
}

/// What the plot area says without lines: no samples, or too few.
fn empty_text(samples: &[SeriesSample], from: u64, to: u64) -> String {
    let inside = samples
        .iter()
        .filter(|s| s.unix_ms >= from && s.unix_ms <= to)
        .count();
    match (samples.len(), inside) {
        (0, _) => "no samples".into(),
        (_, 0) => "no samples in this window".into(),
        (_, k) => format!(
            "{k} sample{}: too few for a rate",
            if k == 1 { "" } else { "s" }
        ),
    }
}

/// The plot of fault `i` of a run.
pub(super) fn fault_plot(report: &Report, i: usize) -> Plot {
    let f: &FaultReport = &report.faults[i];
    let series = &report.series;
    let last = series.samples.last().map_or(0, |s| s.unix_ms);
    let opened = if f.opened_unix_ms > 0 {
        f.opened_unix_ms
    } else {
        f.injected_unix_ms.unwrap_or(last)
    };
    let origin = f.injected_unix_ms.unwrap_or(opened);
    // Up to 3 s before the step, not before the run.
    let from = opened
        .min(origin)
        .saturating_sub(BEFORE_MS)
        .max(report.started_unix_ms.min(opened.min(origin)));
    let to = f
        .closed_unix_ms
        .unwrap_or(last)
        .max(f.resumed_unix_ms.unwrap_or(0))
        .max(origin + 1000);
    let mut notes = Vec::new();
    // A kill's injection is its signal.
    let injection_label = match &f.daemon {
        Some(d) => format!("SIG{}", d.signal),
        None => "injection".into(),
    };
    let markers = markers(
        origin,
        f.injected_unix_ms,
        f.detected_unix_ms,
        f.resumed_unix_ms,
        &injection_label,
        &mut notes,
    );
    if f.detected_unix_ms.is_none() {
        notes.push(if f.daemon.is_some() {
            "no detection: the daemon was killed and started again".into()
        } else {
            "no detection: no restart and no counter showed the fault".into()
        });
    }
    if series.dropped > 0 {
        notes.insert(
            0,
            format!(
                "{} oldest samples dropped (at most {} kept)",
                series.dropped, series.cap
            ),
        );
    }
    let [rx, tx] = rate_lines(&series.samples, origin, from, to);
    let mut lines = vec![rx, tx];
    let ip = iperf3_line(&series.iperf3, origin, from, to);
    if !ip.pieces.is_empty() {
        lines.push(ip);
    }
    let label = if f.label.is_empty() || f.label == f.fault {
        String::new()
    } else {
        format!(" ({})", f.label)
    };
    Plot {
        title: format!(
            "{}: fault #{} {}{label}, recovery {}",
            report.scenario,
            f.index,
            f.fault,
            ms_text(f.recovery_ms)
        ),
        subtitle: format!(
            "detected after {}, traffic back after {}; {} restart{}{}",
            ms_text(f.detect_ms),
            ms_text(f.resume_ms),
            f.restarts,
            if f.restarts == 1 { "" } else { "s" },
            if f.causes.is_empty() {
                String::new()
            } else {
                format!(" ({})", f.causes.join(", "))
            }
        ),
        x_label: if f.injected_unix_ms.is_some() {
            "seconds from the injection (the first hit)".into()
        } else {
            "seconds from the step".into()
        },
        lines,
        markers,
        bands: not_running(&series.samples, origin, from, to),
        x_range: Some((secs(from, origin), secs(to, origin))),
        y_max: None,
        empty: empty_text(&series.samples, from, to),
        notes,
    }
}

/// The plot of one policy's run in a comparison, on a y scale of at least `y_max`.
fn policy_plot(c: &CompareReport, row: &PolicyRun, run: &Report, y_max: Option<f64>) -> Plot {
    let series = &run.series;
    let f = run.faults.first();
    let last = series.samples.last().map_or(0, |s| s.unix_ms);
    let origin = row
        .injected_unix_ms
        .or_else(|| f.map(|f| f.opened_unix_ms).filter(|t| *t > 0))
        .unwrap_or(last);
    let from = origin
        .saturating_sub(BEFORE_MS)
        .max(run.started_unix_ms.min(origin));
    let to = run.steps_ended_unix_ms.max(origin + 1000);
    let mut notes = Vec::new();
    let resumed = row.resumed_ms.map(|ms| origin + finite(ms).max(0.0) as u64);
    let detected = f.and_then(|f| f.detected_unix_ms);
    let markers = markers(
        origin,
        row.injected_unix_ms,
        detected,
        resumed,
        "injection",
        &mut notes,
    );
    if detected.is_none() {
        notes.push("no detection: no restart and no counter showed the fault".into());
    }
    if series.dropped > 0 {
        notes.insert(0, format!("{} oldest samples dropped", series.dropped));
    }
    let [rx, tx] = rate_lines(&series.samples, origin, from, to);
    let mut lines = vec![rx, tx];
    let ip = iperf3_line(&series.iperf3, origin, from, to);
    if !ip.pieces.is_empty() {
        lines.push(ip);
    }
    Plot {
        title: format!(
            "{}: policy {}, {}, recovery {}",
            c.scenario,
            row.policy,
            f.map_or("no fault", |f| f.fault.as_str()),
            ms_text(row.recovery_ms)
        ),
        subtitle: row.verdict.clone(),
        x_label: "seconds from the injection (the first hit)".into(),
        lines,
        markers,
        bands: not_running(&series.samples, origin, from, to),
        x_range: Some((secs(from, origin), secs(to, origin))),
        y_max,
        empty: empty_text(&series.samples, from, to),
        notes,
    }
}

/// Write one plot per fault of `report` into `dir` (created if need be), each named
/// by [`run_plot_name`], and note each in its fault's `plot`. Returns what could not
/// be written.
pub fn write_run_plots(report: &mut Report, dir: &Path) -> Vec<String> {
    if report.faults.is_empty() {
        return Vec::new();
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        return vec![format!("creating {}: {e}", dir.display())];
    }
    let mut errors = Vec::new();
    for i in 0..report.faults.len() {
        let svg = fault_plot(report, i).render();
        let f = &report.faults[i];
        let path = dir.join(run_plot_name(&report.scenario, f.index, &f.fault));
        match std::fs::write(&path, svg) {
            Ok(()) => report.faults[i].plot = Some(path.display().to_string()),
            Err(e) => errors.push(format!("writing {}: {e}", path.display())),
        }
    }
    errors
}

/// Write one plot per policy that ran into `dir` (created if need be), named by
/// [`compare_plot_name`], all on the same Mbit/s scale, and note each in its row's
/// `plot`. Returns what could not be written.
pub fn write_compare_plots(report: &mut CompareReport, dir: &Path) -> Vec<String> {
    if report.runs.iter().all(|r| r.run.is_none()) {
        return Vec::new();
    }
    if let Err(e) = std::fs::create_dir_all(dir) {
        return vec![format!("creating {}: {e}", dir.display())];
    }
    let plots: Vec<Option<Plot>> = report
        .runs
        .iter()
        .map(|row| {
            row.run
                .as_ref()
                .map(|run| policy_plot(report, row, run, None))
        })
        .collect();
    let y_max = plots
        .iter()
        .flatten()
        .flat_map(|p| p.lines.iter().flat_map(|l| l.points().map(|p| p.1)))
        .filter(|y| y.is_finite())
        .fold(0.0, f64::max);
    let mut errors = Vec::new();
    for (i, p) in plots.into_iter().enumerate() {
        let Some(mut p) = p else { continue };
        p.y_max = Some(y_max);
        let path = dir.join(compare_plot_name(&report.scenario, &report.runs[i].policy));
        match std::fs::write(&path, p.render()) {
            Ok(()) => report.runs[i].plot = Some(path.display().to_string()),
            Err(e) => errors.push(format!("writing {}: {e}", path.display())),
        }
    }
    errors
}

#[cfg(test)]
#[path = "plot_tests.rs"]
mod tests;
