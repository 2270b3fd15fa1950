//! `uipoib fault run`'s time series and plots, against a supervised interface on the
//! simulated fabric: a short scenario injects one failed poll while frames flow both
//! ways; the report holds the 50 ms counter samples (and the load's iperf3-style
//! interval lines) and the fault's plot marks the injection, the detection and the
//! resumption.

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::ipv4_frame;
use common::sup::{A_IP, B_IP, pair, quick_policy};
use uipoib::runtime::control::ControlServer;
use uipoib::scenario::{Runner, Scenario, write_run_plots};

/// `x1` of the plot's marker line of `kind`.
fn marker_x(svg: &str, kind: &str) -> Option<f64> {
    let key = format!(r#"class="marker {kind}" x1=""#);
    let v = &svg[svg.find(&key)? + key.len()..];
    v[..v.find('"')?].parse().ok()
}

#[test]
fn a_fault_run_keeps_its_samples_and_plots_the_recovery() {
    let (_sim, switch, a, b) = pair(quick_policy());
    // A directory of its own: the control socket refuses one others can write.
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("uipoib-plot-sim-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).unwrap();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    let sock = dir.join("c.sock");
    let srv = ControlServer::start(
        &sock,
        a.stats.clone(),
        a.status.clone(),
        Default::default(),
        Some(a.sup().orders()),
        Some(switch.clone()),
    )
    .unwrap();

    // Frames both ways, every few ms, until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let load = {
        let (ta, tb, ma, mb, stop) = (a.tap.clone(), b.tap.clone(), a.mac, b.mac, stop.clone());
        std::thread::spawn(move || {
            let body = [7u8; 600];
            while !stop.load(Ordering::Relaxed) {
                for _ in 0..4 {
                    ta.inject(&ipv4_frame(mb, ma, A_IP, B_IP, &body));
                    tb.inject(&ipv4_frame(ma, mb, B_IP, A_IP, &body));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
        })
    };
    // Drain what reaches the "kernel" side of both TAPs.
    let drains: Vec<_> = [a.tap.clone(), b.tap.clone()]
        .into_iter()
        .map(|t| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = t.recv();
                }
            })
        })
        .collect();

    let file = dir.join("plot-poll-error.toml");
    std::fs::write(
        &file,
        r#"
name = "plot-poll-error"
description = "one failed poll while frames flow; the report keeps the series"

step = [
    { do = "wait", ms = 1000 },
    { do = "inject", fault = "poll-error", after = 20, ret = -5 },
    { do = "expect", within_ms = 5000, restarts = 1, cause = "poll-failed", resumed_within_ms = 3000 },
    { do = "wait", ms = 800 },
]

[traffic]
command = "s=0; while :; do e=$((s+25)); printf '[  5]   %d.%02d-%d.%02d   sec   256 KBytes  8.39 Mbits/sec    0   100 KBytes\n' $((s/100)) $((s%100)) $((e/100)) $((e%100)); s=$e; sleep 0.25; done"
warmup_ms = 3000
"#,
    )
    .unwrap();
    let scenario = Scenario::load(&file, &Default::default()).unwrap();
    let mut report = Runner::new(scenario, &sock).quiet().run().unwrap();
    stop.store(true, Ordering::Relaxed);
    load.join().unwrap();
    for d in drains {
        d.join().unwrap();
    }

    let errors = write_run_plots(&mut report, &dir);
    assert!(errors.is_empty(), "{errors:?}");
    assert!(report.passed, "{}", report.to_text());
    let f = &report.faults[0];
    let (inj, det, res) = (
        f.injected_unix_ms.unwrap(),
        f.detected_unix_ms.unwrap(),
        f.resumed_unix_ms.unwrap(),
    );
    assert!(inj <= det && det <= res, "{f:?}");

    // The JSON holds the series: ~20 samples a second, counters that rose both ways,
    // a restart among them, and the load's interval lines.
    let json: serde_json::Value =
        serde_json::from_str(&serde_json::to_string(&report).unwrap()).unwrap();
    let s = &json["series"];
    assert_eq!(s["every_ms"], 50);
    assert_eq!(s["dropped"], 0);
    let samples = s["samples"].as_array().unwrap();
    let secs = report.elapsed_ms as f64 / 1e3;
    assert!(
        samples.len() as f64 >= secs * 8.0,
        "{} samples in {secs} s",
        samples.len()
    );
    let first = &samples[0];
    let last = &samples[samples.len() - 1];
    for k in ["rx_bytes", "tx_bytes", "rx_packets", "tx_packets"] {
        assert!(
            last[k].as_u64() > first[k].as_u64(),
            "{k}: {first} -> {last}"
        );
    }
    assert_eq!(last["restarts"], 1, "{last}");
    assert_eq!(last["state"], "running");
    assert!(last["t_ms"].as_u64().unwrap() > first["t_ms"].as_u64().unwrap());
    assert_eq!(
        last["unix_ms"].as_u64().unwrap() - last["t_ms"].as_u64().unwrap(),
        report.started_unix_ms
    );
    let iperf = s["iperf3"].as_array().unwrap();
    assert!(iperf.len() >= 8, "{iperf:?}");
    assert_eq!(iperf[0]["mbps"], 8.39);

    // The plot exists, is named in the report, and marks the three moments in order.
    let path = dir.join("plot-poll-error-1-poll-error.svg");
    assert_eq!(f.plot.as_deref(), Some(path.to_str().unwrap()));
    let svg = std::fs::read_to_string(&path).unwrap();
    assert!(svg.starts_with("<svg ") && svg.trim_end().ends_with("</svg>"));
    assert!(!svg.contains("NaN") && !svg.contains("inf"));
    let xs: Vec<f64> = ["injection", "detection", "resume"]
        .iter()
        .map(|k| marker_x(&svg, k).unwrap_or_else(|| panic!("no {k} marker:\n{svg}")))
        .collect();
    assert!(xs[0] <= xs[1] && xs[1] <= xs[2], "{xs:?}");
    assert!(svg.contains("<polyline"), "{svg}");
    assert!(svg.contains(">iperf3 intervals</text>"));
    assert!(svg.contains("plot-poll-error: fault #1 poll-error, recovery "));

    drop(srv);
    a.end();
    b.end();
    let _ = std::fs::remove_dir_all(&dir);
}
