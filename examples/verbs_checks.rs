//! Lab checks of the real verbs provider's error paths and async events (rxe in the lab
//! guests), through the crate's public API only.
//!
//! ```text
//! verbs_checks --device rxe0 --mode errors
//! verbs_checks --device rxe0 --mode port-events
//! # meanwhile, after it printed READY:
//! ip link set eth0 down; sleep 2; ip link set eth0 up
//! verbs_checks --device rxe0 --mode removal --netdev eth0   # deletes and re-adds rxe0!
//! ```
//! `errors`: every misuse and impossible configuration comes back as the documented
//! error; a send queue overrun reports a posted prefix whose completions all arrive
//! (the count the ledger relies on); posts to a QP in the error state.
//! `port-events`: PORT_ERR and PORT_ACTIVE arrive on the async fd (through mio) as
//! `PortDown` / `PortUp`; opening while the port is down is `BadPort` naming the state;
//! opening after it is up works.
//! `removal` (rxe only: it runs `rdma link delete/add` itself): with receives posted, an
//! AH and a multicast attachment, `rdma link delete` in the background must surface as
//! `DeviceRemoved` through mio (the rdma_cm watcher) within 5 s; `open` while the device
//! is going and after it is gone must be `NoDevice` at once; dropping the endpoint must let
//! the delete finish within 2 s, with no teardown error; after `rdma link add` `open`
//! (polled with backoff) must succeed with the GID read again, and a unicast to itself
//! must arrive. Lines starting `TIMING` carry the measurements.
//! The last line says `RESULT ok` or `RESULT FAILED`.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

use clap::{Parser, ValueEnum};
use mio::{Events, Poll, Token};

#[path = "common/pollset.rs"]
mod pollset;
use uipoib::verbs::rdma::{RdmaEndpoint, RdmaProvider};
use uipoib::verbs::{
    AhHandle, AsyncEvent, Completion, CqKind, Dest, Endpoint, EndpointConfig, Gid, Provider,
    SendWr, VerbsError, WcStatus,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Mode {
    Errors,
    PortEvents,
    Removal,
}

#[derive(Parser, Debug)]
struct Args {
    #[arg(long, default_value = "rxe0")]
    device: String,
    #[arg(long, value_enum)]
    mode: Mode,
    #[arg(long, default_value_t = 60)]
    timeout_secs: u64,
    /// Network device to re-add the rxe link on (`removal`).
    #[arg(long, default_value = "eth0")]
    netdev: String,
}

const QKEY: u32 = 0x1111_1111;

fn cfg(device: &str) -> EndpointConfig {
    EndpointConfig {
        device: device.to_string(),
        port: 1,
        gid_index: None,
        qkey: QKEY,
        recv_slots: 8,
        send_slots: 8,
        max_payload: None,
        banks: 1,
    }
}

fn check(ok: bool, what: String, failures: &mut Vec<String>) {
    println!("{} {what}", if ok { "ok  " } else { "FAIL" });
    if !ok {
        failures.push(what);
    }
}

/// Poll `cq` until `want` completions arrived or `timeout` passed.
fn collect(ep: &mut RdmaEndpoint, cq: CqKind, want: usize, timeout: Duration) -> Vec<Completion> {
    let mut got = Vec::new();
    let mut buf = [Completion::EMPTY; 16];
    let until = Instant::now() + timeout;
    while got.len() < want && Instant::now() < until {
        match ep.poll_cq(cq, &mut buf) {
            Ok(0) => std::thread::sleep(Duration::from_millis(2)),
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) => {
                println!("poll_cq: {e}");
                break;
            }
        }
    }
    // Anything beyond `want` is a miscount too: look once more.
    std::thread::sleep(Duration::from_millis(50));
    if let Ok(n) = ep.poll_cq(cq, &mut buf) {
        got.extend_from_slice(&buf[..n]);
    }
    got
}

/// Post `chain` and check that exactly its first `want` work requests were posted: all
/// of it with `Ok`, fewer with an error saying how many.
fn check_posts(
    ep: &mut RdmaEndpoint,
    chain: &[SendWr],
    want: usize,
    what: &str,
    f: &mut Vec<String>,
) {
    let r = ep.post_send(chain);
    let ok = match &r {
        Ok(()) => want == chain.len(),
        Err(e) => e.posted == want && want < chain.len(),
    };
    check(ok, format!("{what}: {r:?}"), f);
}

/// Close `ep` and check that no teardown of `p` has failed so far.
fn close_clean(ep: RdmaEndpoint, p: &RdmaProvider, f: &mut Vec<String>) -> Result<(), String> {
    ep.close().map_err(|e| e.to_string())?;
    check(
        p.teardown_errors() == 0,
        format!("teardown_errors = {}", p.teardown_errors()),
        f,
    );
    Ok(())
}

fn sends(dest: Dest, first_id: u64, n: u32, len: u32) -> Vec<SendWr> {
    (0..n)
        .map(|i| SendWr {
            wr_id: first_id + u64::from(i),
            slot: i,
            len,
            dest,
            signaled: true,
        })
        .collect()
}

fn errors(p: &RdmaProvider, device: &str) -> Result<Vec<String>, String> {
    let mut f = Vec::new();
    let r = p.open(&cfg("uipoib-nosuch"));
    let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
    check(
        msg.contains("uipoib-nosuch") && msg.contains(device),
        format!("unknown device -> NoDevice listing the real ones: {msg}"),
        &mut f,
    );
    for port in [0u8, 2] {
        let r = p.open(&EndpointConfig {
            port,
            ..cfg(device)
        });
        let ok = matches!(&r, Err(VerbsError::BadPort { .. }));
        let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
        check(ok, format!("port {port} -> BadPort: {msg}"), &mut f);
    }
    let r = p.open(&EndpointConfig {
        gid_index: Some(200),
        ..cfg(device)
    });
    let ok = matches!(&r, Err(VerbsError::NoGid { .. }));
    let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
    check(ok, format!("gid index 200 -> NoGid: {msg}"), &mut f);

    let mut ep = p.open_endpoint(&cfg(device)).map_err(|e| e.to_string())?;
    let mtu = ep.attrs().port_mtu;
    let r = p.open(&EndpointConfig {
        max_payload: Some(mtu + 1),
        ..cfg(device)
    });
    let ok = matches!(&r, Err(VerbsError::Invalid { field: "mtu", .. }));
    let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
    check(
        ok,
        format!("max_payload {} -> Invalid mtu: {msg}", mtu + 1),
        &mut f,
    );
    match p.open(&EndpointConfig {
        max_payload: Some(1024),
        gid_index: Some(0),
        ..cfg(device)
    }) {
        Ok(small) => check(
            small.attrs().max_payload == 1024
                && small.attrs().gid_index == 0
                && small.recv_buf(0).len() == 1024 + 40,
            format!(
                "max_payload 1024, gid index 0 -> {:?} (recv slot {} bytes)",
                small.attrs(),
                small.recv_buf(0).len()
            ),
            &mut f,
        ),
        Err(e) => check(false, format!("max_payload 1024: {e}"), &mut f),
    }

    check(
        matches!(
            ep.post_recv(1, 8),
            Err(VerbsError::Invalid { field: "slot", .. })
        ),
        "post_recv slot 8 of 8 -> Invalid slot".into(),
        &mut f,
    );
    check(
        ep.recv_buf(8).is_empty() && ep.send_buf(8).is_empty(),
        "out-of-range buffers are empty".into(),
        &mut f,
    );
    check(
        matches!(ep.destroy_ah(AhHandle(3)), Err(VerbsError::UnknownAh(_))),
        "destroy_ah unknown -> UnknownAh".into(),
        &mut f,
    );
    let own: Gid = ep.attrs().gid;
    check(
        matches!(ep.attach_mcast(&own), Err(VerbsError::Invalid { .. })),
        "attach_mcast of a unicast GID -> Invalid".into(),
        &mut f,
    );
    let group: Gid = "::ffff:239.1.1.2".parse().map_err(|e| format!("{e}"))?;
    check(
        matches!(ep.detach_mcast(&group), Err(VerbsError::Invalid { .. })),
        "detach_mcast of a group not attached -> Invalid".into(),
        &mut f,
    );
    let ah = ep.create_ah(&own).map_err(|e| e.to_string())?;
    let dest = Dest {
        ah,
        qpn: ep.attrs().qpn,
        qkey: QKEY,
    };
    let bad_ah = Dest {
        ah: AhHandle(99),
        ..dest
    };
    let mut chain = sends(dest, 100, 3, 64);
    chain[2].dest = bad_ah;
    let r = ep.post_send(&chain);
    check(
        matches!(&r, Err(e) if e.posted == 0 && matches!(e.error, VerbsError::UnknownAh(_))),
        format!("chain with an unknown AH -> nothing posted, UnknownAh: {r:?}"),
        &mut f,
    );
    let big = sends(dest, 100, 1, mtu + 1);
    let what = "send longer than max_payload -> rejected";
    check_posts(&mut ep, &big, 0, what, &mut f);
    let long = sends(dest, 100, 9, 64);
    let what = "chain longer than the send queue -> rejected";
    check_posts(&mut ep, &long, 0, what, &mut f);
    check(
        collect(&mut ep, CqKind::Send, 0, Duration::ZERO).is_empty(),
        "no completion from rejected chains".into(),
        &mut f,
    );

    // Overrun the send CQ (8) with two chains of 8 to ourselves (no receive posted: the
    // receiver drops them) and no poll in between. The endpoint must post the first
    // chain and refuse the second (ENOMEM, nothing posted), and exactly the posted WRs
    // must complete (rxe alone accepts both and loses one completion to CQ overflow).
    let first = ep.post_send(&sends(dest, 1000, 8, 64));
    let second = ep.post_send(&sends(dest, 2000, 8, 2048));
    let posted = |r: &Result<(), uipoib::verbs::PostSendError>, n: usize| match r {
        Ok(()) => n,
        Err(e) => e.posted,
    };
    let (a, b) = (posted(&first, 8), posted(&second, 8));
    println!("overrun: first chain {first:?}, second chain {second:?} -> posted {a} + {b}");
    check(
        a == 8
            && b == 0
            && second
                .as_ref()
                .is_err_and(|e| e.error.to_string().contains("memory")),
        format!("overrun: second chain refused with ENOMEM ({a} + {b} posted)"),
        &mut f,
    );
    let got = collect(&mut ep, CqKind::Send, a + b, Duration::from_secs(5));
    let ok_n = got.iter().filter(|c| c.status == WcStatus::Success).count();
    let ids_ok = got.iter().all(|c| {
        (1000..1000 + a as u64).contains(&c.wr_id) || (2000..2000 + b as u64).contains(&c.wr_id)
    });
    check(
        got.len() == a + b && ok_n == a + b && ids_ok,
        format!(
            "overrun: {} completions ({ok_n} success) for {} posted WRs, \
             ids in the posted prefixes: {ids_ok}",
            got.len(),
            a + b
        ),
        &mut f,
    );
    // Polled: room again. A chain of 8 where the limit cuts after 4 signalled sends.
    let four = sends(dest, 4000, 4, 2048);
    let what = "after polling, a chain of 4 posts";
    check_posts(&mut ep, &four, 4, what, &mut f);
    let eight = sends(dest, 5000, 8, 64);
    let what = "with 4 in flight, a chain of 8 posts its first 4";
    check_posts(&mut ep, &eight, 4, what, &mut f);
    let got = collect(&mut ep, CqKind::Send, 8, Duration::from_secs(5));
    check(
        got.len() == 8 && got.iter().all(|c| c.status == WcStatus::Success),
        format!("{} of the 8 posted sends completed", got.len()),
        &mut f,
    );
    let mut async_seen = Vec::new();
    while let Ok(Some(ev)) = ep.next_async_event() {
        async_seen.push(ev);
    }
    check(
        async_seen.is_empty(),
        format!("no async event (no CQ overflow): {async_seen:?}"),
        &mut f,
    );

    // A receive ring, then the error state: posts still accepted? completions flushed?
    for slot in 0..8 {
        ep.post_recv(u64::from(slot), slot)
            .map_err(|e| e.to_string())?;
    }
    ep.set_qp_error().map_err(|e| e.to_string())?;
    let flushed = collect(&mut ep, CqKind::Recv, 8, Duration::from_secs(5));
    check(
        flushed.len() == 8 && flushed.iter().all(|c| c.status == WcStatus::Flushed),
        format!("set_qp_error: {} of 8 receives flushed", flushed.len()),
        &mut f,
    );
    let r = ep.post_send(&sends(dest, 3000, 2, 64));
    let n = posted(&r, 2);
    let got = collect(&mut ep, CqKind::Send, n, Duration::from_secs(5));
    println!(
        "post_send on an ERR QP: {r:?}; completions {:?}",
        got.iter().map(|c| c.status).collect::<Vec<_>>()
    );
    check(
        got.len() == n && got.iter().all(|c| c.status == WcStatus::Flushed),
        format!("post_send on an ERR QP: {n} posted, {} flushed", got.len()),
        &mut f,
    );
    let r = ep.post_recv(9, 0);
    let got = collect(
        &mut ep,
        CqKind::Recv,
        usize::from(r.is_ok()),
        Duration::from_secs(5),
    );
    println!("post_recv on an ERR QP: {r:?}; completions {got:?}");
    ep.destroy_ah(ah).map_err(|e| e.to_string())?;
    close_clean(ep, p, &mut f)?;
    Ok(f)
}

fn port_events(p: &RdmaProvider, device: &str, timeout: Duration) -> Result<Vec<String>, String> {
    let mut f = Vec::new();
    let mut ep = p.open_endpoint(&cfg(device)).map_err(|e| e.to_string())?;
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut events = Events::with_capacity(4);
    let fds =
        pollset::watch(&mut ep, poll.registry(), Token(0), Token(1)).map_err(|e| e.to_string())?;
    println!("READY qpn={}", ep.attrs().qpn);
    let until = Instant::now() + timeout;
    let mut seen = Vec::new();
    let mut down_open = None;
    while !seen.contains(&AsyncEvent::PortUp) && Instant::now() < until {
        poll.poll(&mut events, Some(Duration::from_millis(200)))
            .map_err(|e| e.to_string())?;
        let readable = events.iter().any(|e| e.token() == Token(1));
        // Drain until None, readable or not (mio is edge-triggered).
        while let Some(ev) = ep.next_async_event().map_err(|e| e.to_string())? {
            println!("async event: {ev:?} (fd readable: {readable})");
            seen.push(ev);
            if ev == AsyncEvent::PortDown && down_open.is_none() {
                let r = p.open(&cfg(device));
                let msg = r.err().map(|e| e.to_string()).unwrap_or_default();
                println!("open while down: {msg}");
                down_open = Some(msg);
            }
        }
    }
    check(
        seen.contains(&AsyncEvent::PortDown),
        format!("PortDown seen: {seen:?}"),
        &mut f,
    );
    check(
        seen.contains(&AsyncEvent::PortUp),
        format!("PortUp seen: {seen:?}"),
        &mut f,
    );
    check(
        down_open.as_deref().is_some_and(|m| m.contains("DOWN")),
        format!("open while the port is down -> BadPort naming the state: {down_open:?}"),
        &mut f,
    );
    // The port may need a moment after PORT_ACTIVE before the GIDs are back.
    let mut reopened = Err("not tried".to_string());
    let until = Instant::now() + Duration::from_secs(10);
    while Instant::now() < until {
        reopened = p
            .open(&cfg(device))
            .map(|e| e.attrs().clone())
            .map_err(|e| e.to_string());
        if reopened.is_ok() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    check(
        reopened.is_ok(),
        format!("open after PortUp: {reopened:?}"),
        &mut f,
    );
    pollset::unwatch(&mut ep, poll.registry(), &fds).map_err(|e| e.to_string())?;
    close_clean(ep, p, &mut f)?;
    Ok(f)
}

/// How long the removal event may take to arrive.
const REMOVAL_EVENT_DEADLINE: Duration = Duration::from_secs(5);
/// How long `rdma link delete` may take once the endpoint is dropped.
const DELETE_DEADLINE: Duration = Duration::from_secs(2);
/// An `open` of a missing device must answer faster than this (no hang).
const NO_DEVICE_DEADLINE: Duration = Duration::from_secs(1);
/// How long to keep polling `open` after `rdma link add`.
const REOPEN_DEADLINE: Duration = Duration::from_secs(20);

/// `open` now (the endpoint, if any, dropped at once) and how long it took.
/// Open an endpoint on `device` `when` (a phrase: "with the device gone"), print how long
/// that took, and check that it failed with `NoDevice` within [`NO_DEVICE_DEADLINE`].
fn check_open_is_no_device(p: &RdmaProvider, device: &str, when: &str, f: &mut Vec<String>) {
    let t = Instant::now();
    let r = p.open(&cfg(device)).map(drop);
    let dt = t.elapsed();
    println!(
        "TIMING open {when}: {:.3} s: {}",
        dt.as_secs_f64(),
        r.as_ref().err().map_or("opened".into(), |e| e.to_string())
    );
    check(
        matches!(r, Err(VerbsError::NoDevice(_))) && dt < NO_DEVICE_DEADLINE,
        format!("open {when} -> NoDevice at once"),
        f,
    );
}

/// Wait up to `limit` for `child` to exit.
fn wait_child(
    child: &mut std::process::Child,
    limit: Duration,
) -> Result<Option<std::process::ExitStatus>, String> {
    let until = Instant::now() + limit;
    loop {
        if let Some(st) = child.try_wait().map_err(|e| e.to_string())? {
            return Ok(Some(st));
        }
        if Instant::now() >= until {
            return Ok(None);
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// One unicast from the endpoint to itself: returns what arrived.
fn loopback(ep: &mut RdmaEndpoint) -> Result<String, String> {
    let own = ep.attrs().gid;
    let payload = b"uipoib removal check";
    ep.post_recv(7, 0).map_err(|e| e.to_string())?;
    let ah = ep.create_ah(&own).map_err(|e| e.to_string())?;
    ep.send_buf(0)[..payload.len()].copy_from_slice(payload);
    let dest = Dest {
        ah,
        qpn: ep.attrs().qpn,
        qkey: QKEY,
    };
    ep.post_send(&sends(dest, 70, 1, payload.len() as u32))
        .map_err(|e| e.to_string())?;
    let got = collect(ep, CqKind::Recv, 1, Duration::from_secs(5));
    let sent = collect(ep, CqKind::Send, 1, Duration::from_secs(1));
    ep.destroy_ah(ah).map_err(|e| e.to_string())?;
    let Some(c) = got.first() else {
        return Err(format!("nothing received (send completions {sent:?})"));
    };
    let buf = ep.recv_buf(0);
    let body = &buf[uipoib::verbs::GRH_LEN..];
    if c.status != WcStatus::Success
        || c.byte_len as usize != uipoib::verbs::GRH_LEN + payload.len()
        || &body[..payload.len()] != payload
    {
        return Err(format!("received {c:?}, not the payload"));
    }
    Ok(format!("{} bytes from QPN {}", payload.len(), c.src_qp))
}

fn removal(p: &RdmaProvider, device: &str, netdev: &str) -> Result<Vec<String>, String> {
    let mut f = Vec::new();
    let mut ep = p.open_endpoint(&cfg(device)).map_err(|e| e.to_string())?;
    let before = ep.attrs().clone();
    println!(
        "open: qpn {} gid {} (index {})",
        before.qpn, before.gid, before.gid_index
    );
    check(
        ep.watches_removal(),
        "the rdma_cm removal watcher is bound".into(),
        &mut f,
    );
    // What a running interface holds: posted receives, an AH, a multicast attachment.
    for slot in 0..8 {
        ep.post_recv(u64::from(slot), slot)
            .map_err(|e| e.to_string())?;
    }
    let _ah = ep.create_ah(&before.gid).map_err(|e| e.to_string())?;
    let group: Gid = "::ffff:239.1.1.3".parse().map_err(|e| format!("{e}"))?;
    ep.attach_mcast(&group).map_err(|e| e.to_string())?;
    // A second endpoint on the same device, on GID index 0 (rxe: the netdev's IPv6
    // link-local address), so that its watcher binds an IPv6 address with a scope.
    let ep6 = p
        .open_endpoint(&EndpointConfig {
            gid_index: Some(0),
            ..cfg(device)
        })
        .map_err(|e| e.to_string())?;
    println!(
        "second endpoint: qpn {} gid {} (index {})",
        ep6.attrs().qpn,
        ep6.attrs().gid,
        ep6.attrs().gid_index
    );
    check(
        ep6.watches_removal(),
        format!(
            "the removal watcher of the GID {} endpoint is bound",
            ep6.attrs().gid
        ),
        &mut f,
    );
    let mut poll = Poll::new().map_err(|e| e.to_string())?;
    let mut events = Events::with_capacity(8);
    let mut eps = [ep, ep6];
    let mut fds = Vec::with_capacity(eps.len());
    for (i, e) in eps.iter_mut().enumerate() {
        fds.push(
            pollset::watch(e, poll.registry(), Token(2 * i), Token(2 * i + 1))
                .map_err(|e| e.to_string())?,
        );
        let quiet = e.next_async_event().map_err(|e| e.to_string())?;
        check(
            quiet.is_none(),
            format!("endpoint {i}: no async event before the delete: {quiet:?}"),
            &mut f,
        );
    }

    let spawned = Instant::now();
    let mut child = Command::new("rdma")
        .args(["link", "delete", device])
        .spawn()
        .map_err(|e| format!("spawn rdma link delete: {e}"))?;
    let until = spawned + REMOVAL_EVENT_DEADLINE;
    let mut seen = [Vec::new(), Vec::new()];
    let mut latency = [None, None];
    let mut woken = [false, false];
    while latency.iter().any(Option::is_none) {
        let now = Instant::now();
        if now >= until {
            break;
        }
        poll.poll(&mut events, Some(until - now))
            .map_err(|e| e.to_string())?;
        // Read an endpoint's events only when its async token fired, as the datapath
        // does: a missed wakeup then shows as a missing event. Drain until None
        // (edge-triggered).
        let fired: Vec<usize> = events
            .iter()
            .filter(|ev| ev.token().0 % 2 == 1)
            .map(|ev| ev.token().0 / 2)
            .collect();
        for i in fired {
            woken[i] = true;
            while let Some(ev) = eps[i].next_async_event().map_err(|e| e.to_string())? {
                seen[i].push(ev);
                if ev == AsyncEvent::DeviceRemoved && latency[i].is_none() {
                    latency[i] = Some(spawned.elapsed());
                }
            }
        }
    }
    for i in 0..2 {
        match latency[i] {
            Some(l) => println!(
                "TIMING endpoint {i}: removal event {:.3} s after spawning `rdma link delete`",
                l.as_secs_f64()
            ),
            None => {
                println!("TIMING endpoint {i}: no removal event within {REMOVAL_EVENT_DEADLINE:?}")
            }
        }
        check(
            latency[i].is_some() && woken[i],
            format!(
                "endpoint {i}: DeviceRemoved through mio on its async token (events {:?})",
                seen[i]
            ),
            &mut f,
        );
        check(
            eps[i].device_lost() == Some(AsyncEvent::DeviceRemoved),
            format!(
                "endpoint {i} remembers the loss: {:?}",
                eps[i].device_lost()
            ),
            &mut f,
        );
    }
    let still_running = child.try_wait().map_err(|e| e.to_string())?.is_none();
    println!("`rdma link delete` still waiting while the endpoints are open: {still_running}");
    check_open_is_no_device(p, device, "while the device is being removed", &mut f);

    for (e, fds) in eps.iter_mut().zip(&fds) {
        pollset::unwatch(e, poll.registry(), fds).map_err(|e| e.to_string())?;
    }
    let dropped = Instant::now();
    drop(eps);
    let drop_took = dropped.elapsed();
    let status = wait_child(&mut child, Duration::from_secs(10))?;
    let delete_took = dropped.elapsed();
    match status {
        Some(st) => println!(
            "TIMING delete finished {:.3} s after the drop began (drop took {:.3} s), {st}",
            delete_took.as_secs_f64(),
            drop_took.as_secs_f64()
        ),
        None => {
            println!("TIMING delete still blocked 10 s after the drop; killing it");
            let _ = child.kill();
        }
    }
    check(
        status.is_some_and(|s| s.success()) && delete_took < DELETE_DEADLINE,
        format!("`rdma link delete` done within {DELETE_DEADLINE:?} of the drop"),
        &mut f,
    );
    check(
        p.teardown_errors() == 0,
        format!(
            "teardown after removal: {} errors, {} already gone",
            p.teardown_errors(),
            p.teardown_already_gone()
        ),
        &mut f,
    );
    check_open_is_no_device(p, device, "with the device gone", &mut f);

    let added = Instant::now();
    let st = Command::new("rdma")
        .args(["link", "add", device, "type", "rxe", "netdev", netdev])
        .status()
        .map_err(|e| format!("rdma link add: {e}"))?;
    println!(
        "TIMING `rdma link add` took {:.3} s: {st}",
        added.elapsed().as_secs_f64()
    );
    check(st.success(), "rdma link add".into(), &mut f);
    // What a supervisor does: poll open with backoff until the device is back.
    let mut delay = Duration::from_millis(10);
    let mut attempts = 0u32;
    let mut errors: Vec<String> = Vec::new();
    let mut reopened = None;
    while added.elapsed() < REOPEN_DEADLINE {
        attempts += 1;
        match p.open_endpoint(&cfg(device)) {
            Ok(ep) => {
                reopened = Some(ep);
                break;
            }
            Err(e) => {
                let kind = format!("{e}");
                if errors.last() != Some(&kind) {
                    errors.push(kind);
                }
            }
        }
        std::thread::sleep(delay);
        delay = (delay * 2).min(Duration::from_millis(200));
    }
    let Some(mut ep) = reopened else {
        check(
            false,
            format!("reopen within {REOPEN_DEADLINE:?}: errors {errors:?}"),
            &mut f,
        );
        return Ok(f);
    };
    println!(
        "TIMING open_on succeeded {:.3} s after `rdma link add` began ({attempts} attempts; \
         errors on the way: {errors:?})",
        added.elapsed().as_secs_f64()
    );
    let after = ep.attrs().clone();
    println!(
        "reopened: qpn {} gid {} (index {}) watcher {}",
        after.qpn,
        after.gid,
        after.gid_index,
        ep.watches_removal()
    );
    check(
        !after.gid.is_zero() && after.gid == before.gid && ep.watches_removal(),
        format!(
            "GID read again after the re-add: {} (index {}), was {} (index {})",
            after.gid, after.gid_index, before.gid, before.gid_index
        ),
        &mut f,
    );
    match loopback(&mut ep) {
        Ok(what) => check(
            true,
            format!("unicast to itself after reopen: {what}"),
            &mut f,
        ),
        Err(e) => check(
            false,
            format!("unicast to itself after reopen: {e}"),
            &mut f,
        ),
    }
    close_clean(ep, p, &mut f)?;
    Ok(f)
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let p = RdmaProvider::new();
    let r = match args.mode {
        Mode::Errors => errors(&p, &args.device),
        Mode::PortEvents => port_events(&p, &args.device, Duration::from_secs(args.timeout_secs)),
        Mode::Removal => removal(&p, &args.device, &args.netdev),
    };
    match r {
        Ok(f) if f.is_empty() => {
            println!("RESULT ok");
            ExitCode::SUCCESS
        }
        Ok(f) => {
            println!("{} checks failed", f.len());
            println!("RESULT FAILED");
            ExitCode::FAILURE
        }
        Err(e) => {
            println!("error: {e}");
            println!("RESULT FAILED");
            ExitCode::FAILURE
        }
    }
}
