"""The report of `scripts/perf queue`: where a TCP bulk flow's queue stands."""

import os
import re
import shlex
import statistics

from common import read, read_json, read_env, finish, fmt, guest_failures, parse_iperf, run_head


def samples(out, role):
    """(start time, stats) of each of ROLE's `uipoib stats --json` samples, in order."""
    d = os.path.join(out, "queue-samples")
    times = read(os.path.join(d, f"{role}-times.txt")) or ""
    rows = []
    for line in times.splitlines():
        try:
            n, t0, _ = line.split()
            t = float(t0)
        except ValueError:
            continue
        s, _ = read_json(os.path.join(d, f"{role}-{n}.json"))
        if isinstance(s, dict):
            rows.append((t, s))
    return rows


def ss_rows(out):
    """(time, unacked, cwnd, rtt ms) from b's `ss -tni` samples of the data connection
    (the one with unacked data or the largest window; iperf3's control connection idles)."""
    rows = []
    for line in (read(os.path.join(out, "queue-samples", "b-ss.txt")) or "").splitlines():
        t, _, rest = line.partition(" ")
        best = None
        for conn in rest.split("ESTAB")[1:]:
            cwnd = re.search(r"\bcwnd:(\d+)", conn)
            rtt = re.search(r"\brtt:([\d.]+)/", conn)
            un = re.search(r"\bunacked:(\d+)", conn)
            c = (int(un.group(1)) if un else 0, int(cwnd.group(1)) if cwnd else 0,
                 float(rtt.group(1)) if rtt else None)
            if best is None or c[:2] > best[:2]:
                best = c
        if best is not None:
            try:
                rows.append((float(t), *best))
            except ValueError:
                pass
    return rows


def med(xs):
    return statistics.median(xs) if xs else None


def queue(a):
    out = a.out
    L, bad = [], []
    args = read_env(os.path.join(out, "queue.env")).get("PERF_QUEUE_ARGS", "")
    # Written with printf %q: shell quoting to undo.
    try:
        flags = " ".join(shlex.split(args))
    except ValueError:
        flags = args
    L.extend(run_head(out))
    L.append("uipoib flags: " + (flags or "(defaults)"))
    rc = (read(os.path.join(out, "queue-iperf3-client.rc")) or "").strip()
    res, why = parse_iperf(os.path.join(out, "queue-iperf3-client.json"))
    mbit = None
    if res:
        mbit = res["mbit_per_s"]
        retx = res.get("retransmits")
        L.append(f"iperf3 TCP b -> a through uip0: exit {rc or '?'}, {mbit:.1f} Mbit/s received, "
                 f"{'?' if retx is None else retx} retransmits")
    else:
        bad.append(f"no iperf3 result ({why})")
    if rc not in ("", "0"):
        bad.append(f"iperf3 exited {rc}")
    sa, sb, ss = samples(out, "a"), samples(out, "b"), ss_rows(out)
    if not sa or not sb or not ss:
        bad.append(f"samples missing (a {len(sa)}, b {len(sb)}, b's socket {len(ss)})")
    t0 = min([t for t, _ in sa + sb] + [r[0] for r in ss] or [0.0])
    ss = [(t - t0, *rest) for t, *rest in ss]
    ra = []
    for t, s in sa:
        port = (s.get("kernel") or {}).get("port") or {}
        if "rdma_recvs" not in port:
            continue
        ra.append((t - t0, port["rdma_recvs"] - s.get("recv_completed", 0),
                   port.get("rcvd_pkts", 0) - port["rdma_recvs"], s.get("drops", {}).get("rx_aqm", 0)))
    rb = []
    for t, s in sb:
        tap = (s.get("kernel") or {}).get("tap") or {}
        # Frames b's daemon took from its TAP: the super-frames it cut, the frames it sent
        # whole, and the ones it dropped.
        read_frames = (s.get("tso_frames", 0) + s.get("tx_packets", 0) - s.get("tso_segments", 0)
                       + sum(v for k, v in (s.get("drops") or {}).items() if k.startswith("tx_")))
        if "tx_packets" in tap:
            rb.append((t - t0, tap["tx_packets"] - read_frames))
    L.append("")
    L.append("a: the receive CQ's backlog (rxe's rdma_recvs - the daemon's recv_completed), rxe's own queue")
    L.append("(rcvd_pkts - rdma_recvs) and the AQM's drops so far; b: frames waiting in its TAP (queued by")
    L.append("the kernel - read by the daemon) and its socket (ss: unacked segments, window, smoothed RTT)")
    L.append(f"{'t (s)':>7} {'a: CQ':>7} {'rxe q':>6} {'rx_aqm':>7}   {'t (s)':>7} {'b: TAP':>7}   {'t (s)':>7} {'unacked':>8} {'cwnd':>6} {'rtt ms':>8}")
    for i in range(max(len(ra), len(rb), len(ss))):
        x = ra[i] if i < len(ra) else None
        y = rb[i] if i < len(rb) else None
        z = ss[i] if i < len(ss) else None
        L.append((f"{x[0]:7.1f} {x[1]:7d} {x[2]:6d} {x[3]:7d}" if x else " " * 30) + "   "
                 + (f"{y[0]:7.1f} {y[1]:7d}" if y else " " * 15) + "   "
                 + (f"{z[0]:7.1f} {z[1]:8d} {z[2]:6d} {fmt(z[3]):>8}" if z else ""))
    # The flow's second half: its window has grown by then.
    end = max([r[0] for r in ra] + [0.0])
    half = end / 2
    cq = [r[1] for r in ra if r[0] >= half]
    tapq = [r[1] for r in rb if r[0] >= half]
    sq = [r for r in ss if r[0] >= half]
    rep = {
        "mbit_per_s": mbit,
        "samples": {"a": len(ra), "b": len(rb), "b_ss": len(ss)},
        "second_half": {
            "cq_backlog_median": med(cq), "cq_backlog_max": max(cq) if cq else None,
            "b_tap_queue_median": med(tapq),
            "unacked_median": med([r[1] for r in sq]), "cwnd_median": med([r[2] for r in sq]),
            "rtt_ms_median": med([r[3] for r in sq if r[3] is not None]),
        },
        "rx_aqm_drops": ra[-1][3] if ra else None,
    }
    h = rep["second_half"]
    L.append("")
    L.append(f"second half of the flow (from {half:.0f} s): a's CQ backlog median {fmt(h['cq_backlog_median'], '.0f')} "
             f"(max {fmt(h['cq_backlog_max'], '.0f')}), b's TAP queue median {fmt(h['b_tap_queue_median'], '.0f')}; "
             f"b's socket: unacked median {fmt(h['unacked_median'], '.0f')}, window {fmt(h['cwnd_median'], '.0f')}, "
             f"RTT {fmt(h['rtt_ms_median'])} ms; rx_aqm drops over the run: {fmt(rep['rx_aqm_drops'], '.0f')}")
    _, why = guest_failures(out, a.vm_rc)
    bad.extend(why)
    if a.vm_rc not in (None, 0):
        bad.append(f"the guests' run exited {a.vm_rc}")
    L.append("RESULT: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)))
    return finish(out, "queue", "queue-report.txt", "queue-report.json", "\n".join(L) + "\n", rep, not bad, bad)
