use super::*;
use crate::scenario::report::Report;
use crate::scenario::series::{Series, SeriesInterval, SeriesSample};

/// A structural check of an SVG document: it starts with `<svg` and ends with
/// `</svg>`, every tag is closed in order, attribute values are quoted, text holds no
/// raw `<` or stray `&`, and every coordinate is a finite number.
pub(crate) fn check_svg(svg: &str) -> Result<(), String> {
    if !svg.starts_with("<svg ") {
        return Err("does not start with <svg".into());
    }
    if !svg.trim_end().ends_with("</svg>") {
        return Err("does not end with </svg>".into());
    }
    let mut stack: Vec<String> = Vec::new();
    let mut rest = svg;
    while let Some(open) = rest.find('<') {
        check_text(&rest[..open])?;
        let close = rest[open..]
            .find('>')
            .ok_or_else(|| format!("unclosed tag at {:?}", &rest[open..open + 20]))?;
        let tag = &rest[open + 1..open + close];
        rest = &rest[open + close + 1..];
        if let Some(name) = tag.strip_prefix('/') {
            match stack.pop() {
                Some(top) if top == name.trim() => {}
                top => return Err(format!("</{name}> closes {top:?}")),
            }
            continue;
        }
        let self_closing = tag.ends_with('/');
        let body = tag.trim_end_matches('/');
        let name = body.split_whitespace().next().unwrap_or("");
        if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric()) {
            return Err(format!("bad tag name in <{tag}>"));
        }
        check_attributes(&body[name.len()..])?;
        if !self_closing {
            stack.push(name.to_string());
        }
        if stack.is_empty() && !self_closing {
            return Err("content after the root".into());
        }
    }
    check_text(rest)?;
    if !stack.is_empty() {
        return Err(format!("unclosed: {stack:?}"));
    }
    Ok(())
}

fn check_text(t: &str) -> Result<(), String> {
    let mut rest = t;
    while let Some(i) = rest.find('&') {
        let e = &rest[i..];
        if !["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"]
            .iter()
            .any(|x| e.starts_with(x))
        {
            return Err(format!("stray & in {t:?}"));
        }
        rest = &rest[i + 1..];
    }
    if t.contains('>') {
        return Err(format!("raw > in {t:?}"));
    }
    Ok(())
}

const NUMERIC: [&str; 13] = [
    "x", "y", "x1", "y1", "x2", "y2", "cx", "cy", "r", "width", "height", "points", "viewBox",
];

fn check_attributes(a: &str) -> Result<(), String> {
    let mut rest = a.trim();
    while !rest.is_empty() {
        let eq = rest
            .find('=')
            .ok_or_else(|| format!("attribute without a value: {rest:?}"))?;
        let name = rest[..eq].trim();
        let v = &rest[eq + 1..];
        let q = v.chars().next().ok_or("no value")?;
        if q != '"' {
            return Err(format!("unquoted value of {name}"));
        }
        let end = v[1..]
            .find('"')
            .ok_or_else(|| format!("unclosed value of {name}"))?;
        let value = &v[1..1 + end];
        check_text(value)?;
        if value.contains('<') {
            return Err(format!("< in the value of {name}"));
        }
        if NUMERIC.contains(&name) {
            for num in value.split([' ', ',']).filter(|s| !s.is_empty()) {
                match num.parse::<f64>() {
                    Ok(f) if f.is_finite() => {}
                    _ => return Err(format!("{name}={value:?}: {num:?} is not a finite number")),
                }
            }
        }
        rest = v[end + 2..].trim_start();
    }
    Ok(())
}

/// `x1` of the marker line of `kind`.
fn marker_x(svg: &str, kind: &str) -> Option<f64> {
    let at = svg.find(&format!(r#"class="marker {kind}" x1=""#))?;
    let v = &svg[at + format!(r#"class="marker {kind}" x1=""#).len()..];
    v[..v.find('"')?].parse().ok()
}

const T0: u64 = 1_700_000_000_000;

/// A run of 10 s from T0: 8 Mbit/s received and 4 sent, nothing from 5.0 s to 5.5 s
/// (restarting), back after; fault injected at 5.0 s, detected at 5.02 s, resumed at
/// 5.55 s.
fn report(samples: usize) -> Report {
    let mut s = Vec::new();
    let (mut rx, mut tx) = (0u64, 0u64);
    for i in 0..samples as u64 {
        let t = i * 50;
        let down = (5000..5500).contains(&t);
        if i > 0 && !down {
            rx += 50_000; // 50 kB per 50 ms = 8 Mbit/s
            tx += 25_000;
        }
        s.push(SeriesSample {
            unix_ms: T0 + t,
            t_ms: t,
            daemon: 0,
            rx_bytes: rx,
            tx_bytes: tx,
            rx_packets: rx / 1000,
            tx_packets: tx / 1000,
            restarts: u64::from(t >= 5500),
            state: if down { "restarting" } else { "running" }.into(),
        });
    }
    Report {
        scenario: "poll-error".into(),
        started_unix_ms: T0,
        steps_ended_unix_ms: T0 + 10_000,
        faults: vec![FaultReport {
            index: 1,
            fault: "poll-error".into(),
            label: "poll-error".into(),
            opened_unix_ms: T0 + 4_900,
            closed_unix_ms: Some(T0 + 10_000),
            injected_unix_ms: Some(T0 + 5_000),
            detected_unix_ms: Some(T0 + 5_020),
            resumed_unix_ms: Some(T0 + 5_550),
            detect_ms: Some(20.0),
            resume_ms: Some(550.0),
            recovery_ms: Some(480.0),
            restarts: 1,
            causes: vec!["poll-failed".into()],
            ..FaultReport::default()
        }],
        series: Series {
            every_ms: 50,
            cap: 12_000,
            samples: s,
            ..Series::default()
        },
        ..Report::default()
    }
}

#[test]
fn a_plot_is_well_formed_and_scaled_to_its_window() {
    let r = report(201);
    let p = fault_plot(&r, 0);
    let sc = p.scale();
    // From 3 s before the step (4.9 s) to the fault's close (10 s), in s from the
    // injection at 5 s.
    assert!((sc.x0 - -3.1).abs() < 1e-9, "{sc:?}");
    assert!((sc.x1 - 5.0).abs() < 1e-9, "{sc:?}");
    // 8 Mbit/s at most: the axis goes to the tick above (8.4 -> 10 with steps of 2).
    assert_eq!(sc.y1, 10.0, "{sc:?}");
    assert_eq!(sc.x(sc.x0), LEFT);
    assert_eq!(sc.x(sc.x1), RIGHT);
    assert_eq!(sc.y(0.0), BOTTOM);
    assert_eq!(sc.y(sc.y1), TOP);
    // The rates: 8 and 4 Mbit/s before, 0 while restarting, a break nowhere (one daemon).
    let rx = &p.lines[0];
    assert_eq!(rx.pieces.len(), 1);
    let at = |x: f64| {
        rx.pieces[0]
            .iter()
            .find(|p| (p.0 - x).abs() < 1e-9)
            .unwrap()
            .1
    };
    assert!((at(-1.0) - 8.0).abs() < 1e-9);
    assert_eq!(at(0.25), 0.0);
    assert!((p.lines[1].pieces[0][0].1 - 4.0).abs() < 1e-9);
    // The restart is a band from the last running sample to the first running again.
    assert_eq!(p.bands.len(), 1);
    assert!((p.bands[0].0 - -0.05).abs() < 1e-9 && (p.bands[0].1 - 0.5).abs() < 1e-9);

    let svg = p.render();
    check_svg(&svg).unwrap();
    assert!(svg.contains("poll-error: fault #1 poll-error, recovery 480 ms"));
    for (kind, x, label) in [
        ("injection", 0.0, "injection +0 ms"),
        ("detection", 0.02, "detection +20 ms"),
        ("resume", 0.55, "traffic resumed +550 ms"),
    ] {
        let got = marker_x(&svg, kind).unwrap_or_else(|| panic!("no {kind} marker"));
        assert!(
            (got - sc.x(x)).abs() <= 0.05,
            "{kind}: {got} vs {}",
            sc.x(x)
        );
        assert!(svg.contains(label), "{label}");
    }
    // The markers keep their order left to right.
    let xs: Vec<f64> = ["injection", "detection", "resume"]
        .iter()
        .map(|k| marker_x(&svg, k).unwrap())
        .collect();
    assert!(xs[0] < xs[1] && xs[1] < xs[2], "{xs:?}");
    for legend in [
        "received (uipoib)",
        "sent (uipoib)",
        "not running",
        "traffic resumed",
    ] {
        assert!(svg.contains(&format!(">{legend}</text>")), "{legend}");
    }
    assert!(!svg.contains("NaN") && !svg.contains("inf"), "{svg}");
}

#[test]
fn an_empty_series_says_no_samples() {
    let mut r = report(0);
    r.faults[0].detected_unix_ms = None;
    r.faults[0].resumed_unix_ms = None;
    r.faults[0].recovery_ms = None;
    let svg = fault_plot(&r, 0).render();
    check_svg(&svg).unwrap();
    assert!(svg.contains(">no samples</text>"), "{svg}");
    assert!(svg.contains("recovery -</title>"), "{svg}");
    assert!(svg.contains("traffic did not resume"), "{svg}");
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    // The injection is still marked; the missing ones are not.
    assert!(marker_x(&svg, "injection").is_some());
    assert!(marker_x(&svg, "detection").is_none());
    // Nothing at all: no fault time, no sample.
    let mut r = report(0);
    r.faults[0] = FaultReport::default();
    let svg = fault_plot(&r, 0).render();
    check_svg(&svg).unwrap();
    assert!(svg.contains(">no samples</text>"));
    assert!(svg.contains("the fault never fired"));
}

#[test]
fn a_single_sample_or_zero_throughput_gives_finite_numbers() {
    let mut r = report(1);
    r.faults[0].opened_unix_ms = T0;
    r.faults[0].injected_unix_ms = Some(T0);
    let svg = fault_plot(&r, 0).render();
    check_svg(&svg).unwrap();
    assert!(svg.contains("1 sample: too few for a rate"), "{svg}");
    // Samples that never move: a flat line at 0 on an axis up to 1 Mbit/s.
    let mut r = report(50);
    for s in &mut r.series.samples {
        (s.rx_bytes, s.tx_bytes) = (0, 0);
    }
    r.faults[0].injected_unix_ms = Some(T0 + 1000);
    let p = fault_plot(&r, 0);
    assert_eq!(p.scale().y1, 1.0);
    let svg = p.render();
    check_svg(&svg).unwrap();
    assert!(svg.contains("<polyline"), "{svg}");
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    // Nonsense in the data never reaches the document.
    let mut bad = Plot {
        lines: vec![Line {
            name: "x".into(),
            color: RX_COLOR,
            pieces: vec![vec![(f64::NAN, 1.0), (1.0, f64::INFINITY), (2.0, 3.0)]],
            ..Line::default()
        }],
        y_max: Some(f64::NAN),
        x_range: Some((f64::NEG_INFINITY, 1.0)),
        ..Plot::default()
    };
    check_svg(&bad.render()).unwrap();
    bad.x_range = Some((2.0, 2.0));
    check_svg(&bad.render()).unwrap();
}

#[test]
fn a_new_daemon_breaks_the_line_and_iperf3_is_a_step_line() {
    let mut r = report(201);
    for s in r.series.samples.iter_mut().filter(|s| s.t_ms >= 6000) {
        s.daemon = 1;
        s.rx_bytes -= 40_000_000.min(s.rx_bytes);
    }
    r.series.iperf3 = (1..=9)
        .map(|i| SeriesInterval {
            unix_ms: T0 + i * 1000,
            t_ms: i * 1000,
            start_s: (i - 1) as f64,
            end_s: i as f64,
            bytes: 1e6,
            mbps: if i == 6 { 0.0 } else { 8.0 },
        })
        .collect();
    let p = fault_plot(&r, 0);
    assert_eq!(p.lines[0].pieces.len(), 2, "{:?}", p.lines[0].pieces.len());
    let ip = p
        .lines
        .iter()
        .find(|l| l.name == "iperf3 intervals")
        .unwrap();
    // The intervals that end from 1.9 s on: 2..=9, two points each, in one piece.
    assert_eq!(ip.pieces.len(), 1);
    assert_eq!(ip.pieces[0].len(), 16);
    assert_eq!(ip.pieces[0][8], (0.0, 0.0));
    let svg = p.render();
    check_svg(&svg).unwrap();
    assert!(svg.contains(">iperf3 intervals</text>"));
}

#[test]
fn ticks_are_round_and_labels_escaped() {
    assert_eq!(tick_step(0.0, 10.0, 10.0), 1.0);
    assert_eq!(tick_step(0.0, 9.0, 5.0), 2.0);
    assert_eq!(tick_step(-3.0, 5.0, 10.0), 1.0);
    assert_eq!(tick_step(0.0, 0.3, 5.0), 0.1);
    assert_eq!(tick_step(0.0, 0.0, 5.0), 1.0);
    assert_eq!(tick_step(0.0, f64::NAN, 5.0), 1.0);
    let (step, t) = ticks(-3.1, 5.0, 10.0);
    assert_eq!(step, 1.0);
    assert_eq!(t, [-3.0, -2.0, -1.0, 0.0, 1.0, 2.0, 3.0, 4.0, 5.0]);
    assert_eq!(tick_label(-0.0, 0.5), "0");
    assert_eq!(tick_label(0.5, 0.5), "0.5");
    assert_eq!(tick_label(2000.0, 500.0), "2000");
    assert_eq!(y_top(0.0), 1.0);
    assert_eq!(y_top(950.0), 1000.0);
    assert_eq!(
        esc(r#"a<b & "c" 'd'>"#),
        "a&lt;b &amp; &quot;c&quot; &apos;d&apos;&gt;"
    );
    let mut r = report(10);
    r.scenario = "odd <name> & \"more\"\u{1}".into();
    let svg = fault_plot(&r, 0).render();
    check_svg(&svg).unwrap();
    assert!(svg.contains("odd &lt;name&gt; &amp; &quot;more&quot; "));
    // The checker itself refuses what is wrong.
    assert!(check_svg("<svg a=\"1\"><g></svg>").is_err());
    assert!(check_svg("<svg x=\"NaN\"></svg>").is_err());
    assert!(check_svg("<svg><text>a & b</text></svg>").is_err());
    assert!(check_svg("<svg a=1></svg>").is_err());
    assert!(check_svg("<svg a=\"1\"></svg>").is_ok());
}

#[test]
fn file_names_are_safe_and_say_what_they_show() {
    assert_eq!(
        run_plot_name("poll-error", 1, "poll-error"),
        "poll-error-1-poll-error.svg"
    );
    assert_eq!(run_plot_name("a b/c", 12, "kill"), "a_b_c-12-kill.svg");
    assert_eq!(run_plot_name("", 1, ".."), "_-1-_...svg");
    assert_eq!(
        compare_plot_name("transient", "recreate-cq"),
        "compare-transient-recreate-cq.svg"
    );
}

#[test]
fn plots_are_written_next_to_the_report_and_named_in_it() {
    let dir = std::env::temp_dir().join(format!("uipoib-plots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let mut r = report(201);
    let errors = write_run_plots(&mut r, &dir);
    assert!(errors.is_empty(), "{errors:?}");
    let path = dir.join("poll-error-1-poll-error.svg");
    assert_eq!(r.faults[0].plot.as_deref(), Some(path.to_str().unwrap()));
    let svg = std::fs::read_to_string(&path).unwrap();
    check_svg(&svg).unwrap();
    assert!(r.to_text().contains(&format!("plot: {}", path.display())));
    // xmllint, when the machine has it, agrees that it is well-formed XML.
    match std::process::Command::new("xmllint")
        .arg("--noout")
        .arg(&path)
        .output()
    {
        Ok(out) => assert!(
            out.status.success(),
            "xmllint: {}",
            String::from_utf8_lossy(&out.stderr)
        ),
        Err(_) => eprintln!(
            "SKIPPED the xmllint check of {}: no xmllint",
            path.display()
        ),
    }
    // A directory that cannot be made: said, not a panic.
    let file = dir.join("a-file");
    std::fs::write(&file, "").unwrap();
    let errors = write_run_plots(&mut r, &file.join("sub"));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(errors[0].contains("a-file"), "{errors:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_comparison_gets_one_plot_per_policy_on_one_scale() {
    let dir = std::env::temp_dir().join(format!("uipoib-cmp-plots-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let slow = {
        let mut r = report(201);
        for s in &mut r.series.samples {
            (s.rx_bytes, s.tx_bytes) = (s.rx_bytes / 4, s.tx_bytes / 4);
        }
        r
    };
    let mut c = CompareReport {
        scenario: "transient".into(),
        runs: vec![
            PolicyRun {
                policy: "restart".into(),
                injected_unix_ms: Some(T0 + 5000),
                resumed_ms: Some(550.0),
                recovery_ms: Some(480.0),
                verdict: "recovered".into(),
                run: Some(report(201)),
                ..PolicyRun::default()
            },
            PolicyRun {
                policy: "skip".into(),
                injected_unix_ms: Some(T0 + 5000),
                verdict: "wedged".into(),
                run: Some(slow),
                ..PolicyRun::default()
            },
            PolicyRun {
                policy: "retry".into(),
                error: Some("not run".into()),
                ..PolicyRun::default()
            },
        ],
        ..CompareReport::default()
    };
    let errors = write_compare_plots(&mut c, &dir);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(c.runs[2].plot.is_none());
    let read = |i: usize| std::fs::read_to_string(c.runs[i].plot.as_ref().unwrap()).unwrap();
    let (a, b) = (read(0), read(1));
    assert!(
        c.runs[0]
            .plot
            .as_ref()
            .unwrap()
            .ends_with("compare-transient-restart.svg")
    );
    for svg in [&a, &b] {
        check_svg(svg).unwrap();
        // The same scale: the slower one's axis also goes to 10 Mbit/s.
        assert!(svg.contains(r#"text-anchor="end">10</text>"#), "{svg}");
    }
    assert!(marker_x(&a, "resume").is_some());
    assert!(marker_x(&b, "resume").is_none());
    assert!(b.contains("traffic did not resume"));
    assert!(a.contains("transient: policy restart, poll-error, recovery 480 ms"));
    let _ = std::fs::remove_dir_all(&dir);
}
