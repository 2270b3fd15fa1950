//! Requests and replies: one JSON object per line in, one per line out.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crossbeam_channel::Sender;
use serde_json::{Map, Value, json};

use super::{FAULTS_DISABLED, FAULTS_LISTED, Status};
use crate::iface::neigh::NeighView;
use crate::iface::stats::Stats;
use crate::runtime::supervisor::Order;
use crate::verbs::fault::{FaultKind, FaultSpec, FaultSwitch};

/// `inject`: arm the fault the request describes. A bad request is refused naming the
/// field that is wrong.
fn inject(req: &Map<String, Value>, faults: &FaultSwitch) -> Result<Value, String> {
    let spec = FaultSpec::from_map(req).map_err(|e| e.to_string())?;
    faults.arm(spec);
    let mut v = spec.to_json();
    v["ok"] = true.into();
    v["injected"] = spec.kind().name().into();
    v["armed"] = spec.to_string().into();
    Ok(v)
}

/// `faults`: what is armed and what has been injected.
fn faults_report(faults: &FaultSwitch) -> Value {
    let fired: Map<String, Value> = FaultKind::ALL
        .iter()
        .map(|k| (k.name().to_string(), faults.fired(*k).into()))
        .collect();
    let recent = faults.recent_injections(FAULTS_LISTED);
    let first: Map<String, Value> = FaultKind::ALL
        .iter()
        .map(|k| (k.name().to_string(), faults.first_hit_unix_ms(*k).into()))
        .collect();
    json!({
        "ok": true,
        "armed": faults.armed().iter().map(FaultSpec::to_json).collect::<Vec<_>>(),
        "injected": faults.injected(),
        "fired": fired,
        "stalled": faults.stalled(),
        "polls_failed": faults.polls_failed(),
        "polls_after_failure": faults.polls_after_failure(),
        "completions_swallowed": faults.completions_swallowed(),
        "first_hit_unix_ms": first,
        "recent": recent,
    })
}

/// What the server thread serves.
pub(super) struct Served {
    pub(super) stats: Arc<Stats>,
    pub(super) status: Arc<Mutex<Status>>,
    /// The neighbour table as the poller last published it.
    pub(super) neigh: NeighView,
    pub(super) orders: Option<Sender<Order>>,
    pub(super) faults: Option<Arc<FaultSwitch>>,
    /// Peers refused for their uid.
    pub(super) refused: Arc<AtomicU64>,
}

pub(super) fn handle_line(line: &str, cx: &Served) -> Value {
    let (stats, status) = (&cx.stats, &cx.status);
    let bad = |why: String| json!({"ok": false, "error": format!("bad request (a JSON object with a \"cmd\" string and only known fields): {why}")});
    let req: Map<String, Value> = match serde_json::from_str(line) {
        Ok(Value::Object(m)) => m,
        Ok(other) => return bad(format!("not an object: {other}")),
        Err(e) => return bad(e.to_string()),
    };
    let cmd = match req.get("cmd") {
        Some(Value::String(c)) => c.as_str(),
        Some(other) => return bad(format!("\"cmd\" must be a string, not {other}")),
        None => return bad("missing \"cmd\"".into()),
    };
    // Only `inject` takes more than the command, and `stats` its `kernel` flag.
    if cmd != "inject"
        && let Some(k) = req
            .keys()
            .find(|k| *k != "cmd" && !(cmd == "stats" && *k == "kernel"))
    {
        return bad(format!("unknown field {k:?} for {cmd:?}"));
    }
    match cmd {
        "ping" => json!({"ok": true}),
        "stats" => {
            let mut v = json!({"ok": true, "stats": stats.snapshot()});
            // What the kernel dropped before the daemon saw it (the TAP's queue, the
            // port), when asked (sysfs reads: not for the samplers that poll every 50 ms)
            // and this server serves a live interface.
            let asked = req.get("kernel") == Some(&Value::Bool(true));
            let at = asked
                .then(|| status.lock().ok())
                .flatten()
                .filter(|s| !s.tap.is_empty())
                .map(|s| (s.tap.clone(), s.device.clone(), s.port));
            if let Some((tap, device, port)) = at {
                let k = crate::runtime::kernel::read(&tap, &device, port);
                v["stats"]["kernel"] = json!({"tap_name": tap, "device": device, "port_num": port});
                if let (Value::Object(m), Ok(Value::Object(r))) =
                    (&mut v["stats"]["kernel"], serde_json::to_value(&k))
                {
                    m.extend(r);
                }
            }
            v
        }
        "neigh" => super::neigh::reply(&cx.neigh.read(), std::time::Instant::now()),
        "status" => {
            let mut s = status.lock().map(|s| s.clone()).unwrap_or_default();
            s.allow_faults = cx.faults.is_some();
            s.control_peers_refused = cx.refused.load(Ordering::Relaxed);
            json!({"ok": true, "status": s})
        }
        "restart" => match &cx.orders {
            Some(tx) if tx.send(Order::Restart).is_ok() => {
                json!({"ok": true, "restart": "requested"})
            }
            _ => json!({"ok": false, "error": "this interface has no supervisor to restart it"}),
        },
        "inject" | "clear" | "faults" => match &cx.faults {
            None => json!({"ok": false, "error": FAULTS_DISABLED}),
            Some(f) if cmd == "clear" => {
                f.clear();
                json!({"ok": true, "cleared": true})
            }
            Some(f) if cmd == "faults" => faults_report(f),
            Some(f) => inject(&req, f).unwrap_or_else(|e| json!({"ok": false, "error": e})),
        },
        other => json!({
            "ok": false,
            "error": format!("unknown command {other:?}; known: ping, stats, status, neigh, restart, inject, clear, faults"),
        }),
    }
}
