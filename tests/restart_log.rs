//! What a restart says in the daemon's log: one warning that names its cause. A restart
//! that runs straight through says it in one line at its end (a line costs milliseconds
//! in the lab's guests, and none is written on the restart's way); one that waits says it
//! before the wait, and its end is an info line.
//!
//! Its own test binary: it installs the process's log subscriber.

mod common;

use std::io::{self, Write};
use std::sync::{Arc, Mutex};

use common::sup::*;
use uipoib::iface::recovery::Policy;
use uipoib::verbs::AsyncEvent;

#[derive(Clone, Default)]
struct Buf(Arc<Mutex<Vec<u8>>>);

impl Write for Buf {
    fn write(&mut self, b: &[u8]) -> io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

const SAID: [&str; 3] = [
    "restarting the interface",
    "interface restarted and running again",
    "interface running again",
];

/// The restart lines of interface `iface` so far, as (level, message, cause).
fn said(buf: &Buf, iface: &str) -> Vec<(String, String, String)> {
    let text = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["fields"]["iface"] == iface)
        .filter_map(|v| {
            let msg = v["fields"]["message"].as_str()?.to_string();
            SAID.contains(&msg.as_str()).then(|| {
                (
                    v["level"].as_str().unwrap_or_default().to_string(),
                    msg,
                    v["fields"]["cause"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
        })
        .collect()
}

fn line(level: &str, msg: &str, cause: &str) -> (String, String, String) {
    (level.into(), msg.into(), cause.into())
}

#[test]
fn a_restart_says_its_cause_once_at_its_end_or_before_it_waits() {
    let buf = Buf::default();
    let w = buf.clone();
    tracing_subscriber::fmt()
        .json()
        .with_max_level(tracing::Level::INFO)
        .with_writer(move || w.clone())
        .init();
    let (_sim, switch, a, b) = pair(Policy::default());

    // Straight through: one warning, at the end, with the cause.
    a.sup().restart();
    a.wait_state("running", 1);
    assert_eq!(
        said(&buf, "sim0"),
        vec![line(
            "WARN",
            "interface restarted and running again",
            "operator"
        )]
    );

    // A restart that waits for its device says so before the wait; its end is info.
    switch.hide_device(true);
    switch.inject_async(AsyncEvent::DeviceRemoved);
    a.wait_state("waiting-for-device", 1);
    assert_eq!(
        said(&buf, "sim0")[1..],
        [line("WARN", "restarting the interface", "device-removed")]
    );
    switch.hide_device(false);
    a.wait_state("running", 2);
    assert_eq!(
        said(&buf, "sim0")[1..],
        [
            line("WARN", "restarting the interface", "device-removed"),
            line("INFO", "interface running again", ""),
        ]
    );
    a.end();
    b.end();
}
