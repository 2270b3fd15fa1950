"""The reports of scripts/perf: the table over rxe, the host comparison, recovery times."""

import glob
import json
import os
import re
import statistics

from common import (
    read,
    read_json,
    load,
    fmt,
    ratio,
    ib_send_bw_received,
    perftest_row,
    parse_ping,
    mb_to_mbit,
    iperf_received_mbit,
    finish,
    read_env,
    run_head,
)


# ---- perf: scripts/perf -----------------------------------------------------------------


def perf_iperf(path):
    """dict(mbit, retransmits | lost_percent, offered, seconds) or None."""
    v = load(path)
    if not v or "end" not in v or v.get("error"):
        return None
    end = v["end"]
    udp = v.get("start", {}).get("test_start", {}).get("protocol") == "UDP"
    if udp:
        s = end.get("sum_received") or end.get("sum")
        if not s:
            return None
        sent = end.get("sum_sent") or end.get("sum") or {}
        lost = s.get("lost_percent") or 0.0
        mbit = s["bits_per_second"] / 1e6
        if "sum_received" not in end:
            # iperf3 < 3.13: "sum" is the sender's rate; the receiver got (1 - loss) of it.
            mbit *= 1 - lost / 100
        return dict(
            mbit=mbit,
            offered=sent.get("bits_per_second", 0) / 1e6,
            lost_percent=lost,
            seconds=s.get("seconds"),
        )
    r = end.get("sum_received")
    if not r:
        return None
    return dict(
        mbit=r["bits_per_second"] / 1e6,
        retransmits=(end.get("sum_sent") or {}).get("retransmits"),
        seconds=r.get("seconds"),
    )


def cpu_ticks(out, tag, role):
    b = read(os.path.join(out, "raw", f"{tag}.before.cpu.{role}"))
    a = read(os.path.join(out, "raw", f"{tag}.after.cpu.{role}"))
    if not a or not b:
        return None
    try:
        ub, sb = map(int, b.split())
        ua, sa = map(int, a.split())
    except ValueError:
        return None
    return ua - ub, sa - sb


def stats_delta(out, tag, role):
    b = load(os.path.join(out, "raw", f"{tag}.before.stats.{role}.json"))
    a = load(os.path.join(out, "raw", f"{tag}.after.stats.{role}.json"))
    if not a or not b:
        return None
    d = {k: a[k] - b[k] for k in a if isinstance(a.get(k), int) and isinstance(b.get(k), int)}
    da, db = a.get("drops") or {}, b.get("drops") or {}
    d["drops"] = {k: da[k] - db.get(k, 0) for k in da if da[k] != db.get(k, 0)}
    return d


def ctxt_delta(out, tag, role):
    b = read(os.path.join(out, "raw", f"{tag}.before.ctxt.{role}"))
    a = read(os.path.join(out, "raw", f"{tag}.after.ctxt.{role}"))
    try:
        return int(a) - int(b)
    except (TypeError, ValueError):
        return None


def link_delta(out, tag, role):
    """TAP counters (rx/tx packets and drops) moved during the step."""
    def get(when):
        v = load(os.path.join(out, "raw", f"{tag}.{when}.link.{role}.json"))
        try:
            s = v[0]["stats64"]
            return {f"{d}_{k}": s[d][k] for d in ("rx", "tx") for k in ("packets", "dropped")}
        except (TypeError, KeyError, IndexError):
            return None
    b, a = get("before"), get("after")
    if not a or not b:
        return None
    return {k: a[k] - b[k] for k in a}


def rxe_delta(out, tag, role):
    """rxe hw_counters that moved during the step."""
    b = rxe_counters(out, tag, "before", role) or {}
    a = rxe_counters(out, tag, "after", role) or {}
    return {k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)}


def rxe_counters(out, tag, when, role):
    """rxe's hw_counters at one sample, or None without the file."""
    t = read(os.path.join(out, "raw", f"{tag}.{when}.rxe.{role}.txt"))
    if t is None:
        return None
    d = {}
    for line in t.splitlines():
        path, _, val = line.rpartition(":")
        try:
            d[os.path.basename(path)] = int(val)
        except ValueError:
            pass
    return d


def rxe_rx_lost(out, tag, role):
    """Packets rxe received and delivered to no receive queue during the step
    (rcvd_pkts - rdma_recvs moved), or None without both samples."""
    b, a = rxe_counters(out, tag, "before", role), rxe_counters(out, tag, "after", role)
    try:
        return (a["rcvd_pkts"] - b["rcvd_pkts"]) - (a["rdma_recvs"] - b["rdma_recvs"])
    except (TypeError, KeyError):
        return None


def udp_delta(out, tag, role):
    """The kernel's UDP counters (/proc/net/snmp) that moved during the step, or None."""
    def get(when):
        t = read(os.path.join(out, "raw", f"{tag}.{when}.udp.{role}.txt")) or ""
        ls = [l.split()[1:] for l in t.splitlines() if l.startswith("Udp:")]
        if len(ls) < 2:
            return None
        try:
            return dict(zip(ls[0], map(int, ls[1])))
        except ValueError:
            return None
    b, a = get("before"), get("after")
    if not a or not b:
        return None
    return {k: a[k] - b.get(k, 0) for k in a}


def backlog_dropped(out, tag, role):
    """Packets the kernel dropped on a full input backlog during the step (the second
    column of /proc/net/softnet_stat, hex, summed over CPUs), or None."""
    def get(when):
        t = read(os.path.join(out, "raw", f"{tag}.{when}.softnet.{role}.txt"))
        try:
            return sum(int(l.split()[1], 16) for l in t.splitlines() if l.strip()) if t else None
        except (ValueError, IndexError):
            return None
    b, a = get("before"), get("after")
    return a - b if a is not None and b is not None else None


def vcpu_split(out, tag, role):
    """How the guest's vCPU spent the step's iperf3 run (its /proc/stat `cpu` line as the
    run began and ended; the `cpu` line sums every vCPU, so with LAB_SMP > 1 this is their
    average): dict of percentages busy, user (with nice), system, irq (hard and soft:
    rxe's receive and the kernel's input among it) and idle (with iowait), or None.
    Busy is the wall time less the idle time when the files have the wall clock (the
    idle time is measured; the busy kinds are sampled at the tick and alias with loads
    paced every millisecond), and the kinds share it as their ticks do."""
    def get(when):
        t = read(os.path.join(out, "raw", f"{tag}.run-{when}.stat.{role}")) or ""
        f = t.split()
        try:
            ticks = [int(x) for x in f[1:9]] if len(f) >= 9 and f[0] == "cpu" else None
            wall = float(f[f.index("wall") + 1]) if "wall" in f[9:] else None
        except (ValueError, IndexError):
            return None, None
        return ticks, wall
    (b, wb), (a, wa) = get("begin"), get("end")
    if not a or not b:
        return None
    d = [x - y for x, y in zip(a, b)]
    total = sum(d)
    if total <= 0:
        return None
    user, nice, system, idle, iowait, irq, softirq, steal = d
    sampled = total - idle - iowait
    busy = 100.0 * sampled / total
    try:
        hz = int((read(os.path.join(out, "raw", "clk_tck")) or "100").strip() or 100)
    except ValueError:
        hz = 100
    if wa is not None and wb is not None and wa > wb:
        # The vCPUs' time over the run: the wall time times their number (which the
        # ticks' total gives, rounded).
        cpus = max(1, round(total / ((wa - wb) * hz)))
        span = (wa - wb) * hz * cpus
        busy = min(100.0, max(0.0, 100.0 * (span - idle - iowait) / span))
    share = lambda v: busy * v / sampled if sampled > 0 else 0.0
    return dict(busy=busy, user=share(user + nice), system=share(system),
                irq=share(irq + softirq), idle=100.0 - busy, steal=share(steal))


def step_text(st):
    """A sweep step's head: the rate asked, sent and received, the loss, the receiver's
    time over the sender's, the verdict and the datagrams lost."""
    return (f"step {st['step']}: -b {fmt(st['target_mbit']):>6} sent {fmt(st['offered_mbit']):>6} "
            f"recvd {fmt(st['received_mbit']):>6} loss {fmt(st['lost_percent'], '.2f'):>6}% "
            f"over {fmt(st['receiver_stretch'], '.2f')}x the time "
            f"{'pass' if st['passed'] else 'FAIL'}; lost {st['lost_packets']}")


def vcpu_text(v):
    """'busy 97% (user 20, system 40, irq 37)' or '-'."""
    if not v:
        return "-"
    return (f"busy {v['busy']:.0f}% (user {v['user']:.0f}, system {v['system']:.0f}, "
            f"irq {v['irq']:.0f})")


def daemon_drops(out, tag, role):
    """The daemon's drops (every reason) during the step, or None."""
    d = stats_delta(out, tag, role)
    return sum(d["drops"].values()) if d else None


def where_lost(out, tag):
    """Where datagrams of a step b -> a went: b's TAP queue (the daemon did not read in
    time: tx_dropped), the daemons' own drop counters, rxe's counters, a's TAP."""
    loss = {}
    for role in ("a", "b"):
        sd = stats_delta(out, tag, role)
        loss[role] = dict(
            tap=link_delta(out, tag, role),
            daemon_drops=sum(sd["drops"].values()) if sd else None,
            daemon=sd and {k: sd.get(k) for k in ("rx_packets", "tx_packets", "tx_backpressure")},
            rxe=rxe_delta(out, tag, role),
            rxe_rx_lost=rxe_rx_lost(out, tag, role),
            udp=udp_delta(out, tag, role),
            backlog_dropped=backlog_dropped(out, tag, role),
            vcpu=vcpu_split(out, tag, role),
        )
    # Sent by b's daemon and not received by a's (the fabric, rxe, a restart's reaped
    # completions; ARP and neighbour discovery ride both ways and roughly cancel).
    tx, rx = (loss["b"]["daemon"] or {}).get("tx_packets"), (loss["a"]["daemon"] or {}).get("rx_packets")
    loss["between_daemons"] = tx - rx if tx is not None and rx is not None else None
    return loss


def where_text(wl):
    """One line: where a step's datagrams were lost (see where_lost)."""
    tb, ta = wl["b"]["tap"] or {}, wl["a"]["tap"] or {}
    return (f"b TAP {tb.get('tx_dropped', '-')}, daemons b {fmt(wl['b']['daemon_drops'], '.0f')} a {fmt(wl['a']['daemon_drops'], '.0f')}, "
            f"b daemon -> a daemon {fmt(wl['between_daemons'], '.0f')} (a rxe {fmt(wl['a']['rxe_rx_lost'], '.0f')}), "
            f"a TAP {ta.get('rx_dropped', '-')}, a backlog {fmt(wl['a']['backlog_dropped'], '.0f')}, "
            f"a UDP socket {fmt((wl['a']['udp'] or {}).get('RcvbufErrors'), '.0f')}")


def parse_ib_send_lat(t):
    """ib_send_lat's result line: dict(t_min, t_max, t_typical, t_avg, ...) in us, or None."""
    f = perftest_row(t, "t_typical", 7)
    if not f:
        return None
    try:
        v = [float(x) for x in f[2:9]]
    except ValueError:
        return None
    keys = ("t_min", "t_max", "t_typical", "t_avg", "t_stdev", "p99", "p99_9")
    return dict(zip(keys, v), iterations=int(f[1]), bytes=int(f[0]))


QPERF_UNITS = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "sec": 1e6, "s": 1e6}


def parse_qperf(t):
    """{test: latency in us} from qperf's output ("tcp_lat:" then "latency = 8809 ns";
    the unit may be ns, us, ms or sec)."""
    res, cur = {}, None
    for line in (t or "").splitlines():
        m = re.match(r"^(\w+):\s*$", line)
        if m:
            cur = m.group(1)
            continue
        m = re.match(r"^\s+latency\s*=\s*([\d.]+)\s*(ns|us|ms|sec|s)\b", line)
        if m and cur:
            res[cur] = float(m.group(1)) * QPERF_UNITS[m.group(2)]
    return res


def latency(out, tag):
    """qperf tcp_lat/udp_lat (us) and ping RTT avg/min (us) of one path."""
    raw = os.path.join(out, "raw")
    q = parse_qperf(read(os.path.join(raw, f"{tag}.qperf.txt")))
    pg = parse_ping(read(os.path.join(raw, f"{tag}.ping.txt")))
    rtt = (pg or {}).get("rtt_ms") or {}
    return dict(
        tcp_lat_us=q.get("tcp_lat"),
        udp_lat_us=q.get("udp_lat"),
        ping_avg_us=rtt["avg"] * 1e3 if "avg" in rtt else None,
        ping_min_us=rtt["min"] * 1e3 if "min" in rtt else None,
        ping_loss_percent=(pg or {}).get("loss_percent"),
    )


# A sweep step passes when the receiver's run lasted at most this many times the sender's.
SWEEP_SUSTAIN = 1.05


def sweep(out, r, pre, steps, limit=1.0, name="sweep"):
    """The UDP rate sweep of one variant in rep r: every step (the rate asked, what was sent
    and received, the loss and where it went) and the lossless rate: the highest offered
    rate with under LIMIT % loss (0 when no step passed; None when a step is missing)."""
    raw = os.path.join(out, "raw")
    res, best, complete = [], 0.0, True
    for k in range(1, steps + 1):
        tag = f"r{r}.{pre}{name}.s{k}"
        v = load(os.path.join(raw, f"{tag}.json"))
        end = (v or {}).get("end") or {}
        rcv, snt = end.get("sum_received"), end.get("sum_sent") or {}
        target = ((v or {}).get("start", {}).get("test_start", {}).get("target_bitrate") or 0) / 1e6 or None
        if not v or v.get("error") or not rcv:
            complete = False
            res.append(dict(step=k, target_mbit=target, missing=True))
            continue
        lost = rcv.get("lost_percent")
        # Carried, not buffered: the receiver's run may not outlast the sender's by more
        # than SUSTAIN (a large socket buffer and the receive ring can absorb a 4 s step
        # and hand it over a second later without a loss).
        stretch = (rcv.get("seconds") or 0) / (snt.get("seconds") or 1)
        ok = (lost is not None and lost < limit and (rcv.get("packets") or 0) > 0
              and stretch <= SWEEP_SUSTAIN)
        offered = snt.get("bits_per_second", 0) / 1e6
        if ok:
            best = max(best, offered)
        res.append(dict(step=k, target_mbit=target, offered_mbit=offered,
                        received_mbit=rcv["bits_per_second"] / 1e6, lost_percent=lost,
                        lost_packets=rcv.get("lost_packets"), packets=rcv.get("packets"),
                        receiver_stretch=stretch,
                        passed=ok, where_lost=where_lost(out, tag)))
    return dict(steps=res, lossless_mbit=best if complete else None)


def restart(out, tag):
    """One injected poll failure under load: the restart records a's status gained during
    the run (after its status before, by epoch; without that file, the newest), the
    iperf3 client's result, and what a lost over it."""
    raw = os.path.join(out, "raw")
    recs = None
    after = load(os.path.join(raw, f"{tag}.status.a.json"))
    if after:
        hist = [h for h in after.get("history", []) if h.get("cause") == "poll-failed"]
        before = load(os.path.join(raw, f"{tag}.status-before.a.json"))
        if before is not None:
            seen = max([h.get("epoch", 0) for h in before.get("history", [])] + [0])
            hist = [h for h in hist if h.get("epoch", 0) > seen]
        else:
            hist = hist[-1:]
        recs = hist
    j = load(os.path.join(raw, f"{tag}.json"))
    end = (j or {}).get("end") or {}
    good = bool(j) and "error" not in j
    rcv = end.get("sum_received") or {}
    return dict(
        recovery_ms=recs[-1].get("recovery_ms") if recs else None,
        announced_ms=recs[-1].get("announced_ms") if recs else None,
        phases=(recs[-1].get("phases") or {}) if recs else {},
        supervisor=recs[-1].get("supervisor") if recs else None,
        restarts=len(recs) if recs is not None else None,
        session_intact=(1.0 if good and rcv.get("bytes", 0) > 0 else 0.0) if j is not None else None,
        retransmits=(end.get("sum_sent") or {}).get("retransmits") if good else None,
        lost_packets=rcv.get("lost_packets") if good else None,
        packets=rcv.get("packets") if good else None,
        rx_lost_rxe=rxe_rx_lost(out, tag, "a"),
        daemon_drops_a=daemon_drops(out, tag, "a"),
        daemon_drops_b=daemon_drops(out, tag, "b"),
        where_lost=where_lost(out, tag),
    )


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else None


def variant(out, r, pre, sweep_steps, tcp_secs_default=1, windowed=False):
    """One variant's measurements in rep r (pre: "" or "alt.")."""
    raw = os.path.join(out, "raw")
    tcp = perf_iperf(os.path.join(raw, f"r{r}.{pre}uiptcp.json"))
    udp = perf_iperf(os.path.join(raw, f"r{r}.{pre}uipudp.json"))
    clk = int((read(os.path.join(raw, "clk_tck")) or "100").strip() or 100)
    # Per-packet cost of the daemons during the TCP run: a receives the data, b sends it.
    cost = {}
    for role, side in (("a", "rx"), ("b", "tx")):
        tag = f"r{r}.{pre}uiptcp"
        ticks = cpu_ticks(out, tag, role)
        d = stats_delta(out, tag, role)
        if not ticks or not d:
            continue
        pkts = d.get("rx_packets", 0) + d.get("tx_packets", 0)
        secs = (tcp or {}).get("seconds") or tcp_secs_default
        per = lambda x: x / pkts if pkts else None  # noqa: E731
        cost[side] = dict(
            cpu_percent=100 * (ticks[0] + ticks[1]) / clk / secs,
            sys_share=(ticks[1] / (ticks[0] + ticks[1])) if sum(ticks) else None,
            packets=pkts,
            us_per_packet=per(1e6 * (ticks[0] + ticks[1]) / clk),
            polls_per_packet=per(d.get("polls", 0)),
            events_per_packet=per(d.get("cq_events", 0)),
            rearms_per_packet=per(d.get("rearms", 0)),
            backpressure=d.get("tx_backpressure"),
            budget_exhausted=d.get("budget_exhausted"),
            ctxt_per_packet=per(ctxt_delta(out, tag, role) or 0),
            vcpu_busy=(vcpu_split(out, tag, role) or {}).get("busy"),
        )
    return dict(tcp=tcp, udp=udp, daemon=cost, udp_loss=where_lost(out, f"r{r}.{pre}uipudp"),
                latency=latency(out, f"r{r}.{pre}uiplat"), sweep=sweep(out, r, pre, sweep_steps),
                sweepw=sweep(out, r, pre, sweep_steps, name="sweepw") if windowed else None)


def perf(args):
    out = args.out
    raw = os.path.join(out, "raw")
    env = read(os.path.join(out, "perf.env")) or ""
    m = re.search(r"^PERF_REPS=(\d+)", env, re.M)
    reps = int(m.group(1)) if m else len(glob.glob(os.path.join(raw, "r*.uiptcp.json")))
    msg = (read(os.path.join(raw, "msg_size")) or "?").strip()
    uip_mtu = (read(os.path.join(raw, "uip_mtu.a")) or "?").strip()

    def env_val(k, default):
        m = re.search(rf"^{k}='?([^'\n]*)'?$", env, re.M)
        return m.group(1) if m and m.group(1) else default

    names = {"": env_val("PERF_BASE_NAME", "base"), "alt.": env_val("PERF_ALT_NAME", "alt")}
    has_alt = bool(env_val("PERF_ALT_BIN", "") or env_val("PERF_ALT_ARGS", "")
                   or env_val("PERF_ALT_NICE", "0") != "0" or env_val("PERF_ALT_TXQLEN", "")
                   or env_val("PERF_ALT_SCHED", "other") != "other") or bool(
        glob.glob(os.path.join(raw, "r*.alt.uiptcp.json")))
    pres = ["", "alt."] if has_alt else [""]
    try:
        sweep_steps = int(env_val("PERF_UDP_SWEEP_STEPS", "5"))
    except ValueError:
        sweep_steps = 5
    window = env_val("PERF_UDP_SWEEP_WINDOW", "")
    # Runs from before the eth0 sweep have no PERF_ETH0_SWEEP line: none was run.
    eth0_sweep = env_val("PERF_ETH0_SWEEP", "0") == "1"

    def iblat(name):
        # The client's output (b); the server prints the same table.
        return (parse_ib_send_lat(read(os.path.join(raw, f"r{r}.{name}.txt")))
                or parse_ib_send_lat(read(os.path.join(raw, f"r{r}.{name}.server.txt"))))

    rows = []
    missing = []
    for r in range(1, reps + 1):
        got = ib_send_bw_received(read(os.path.join(raw, f"r{r}.ibsend.server.txt")),
                                  read(os.path.join(raw, f"r{r}.ibsend.txt")))
        ib = mb_to_mbit(got[1]) if got else None
        ib_sent = mb_to_mbit(got[2]) if got and got[2] is not None else None
        ib_note = f"rep {r}: ib_send_bw's server printed no rate; the sender's figure stands in" if got and got[3] else None
        eth = perf_iperf(os.path.join(raw, f"r{r}.eth0tcp.json"))
        row = dict(rep=r, ib_send_bw=ib, ib_send_bw_sent=ib_sent, ib_send_bw_note=ib_note, eth0_tcp=eth, ib_send_lat=iblat("iblat"), ib_send_lat_e=iblat("iblat-e"),
                   eth0_latency=latency(out, f"r{r}.eth0lat"), variants={},
                   recovery=restart(out, f"r{r}.recovery"), restart_udp=restart(out, f"r{r}.restartudp"))
        row["eth0_sweep"] = sweep(out, r, "", sweep_steps, name="eth0sweep") if eth0_sweep else None
        for pre in pres:
            row["variants"][names[pre]] = variant(out, r, pre, sweep_steps, windowed=bool(window))
        el = row["eth0_latency"]
        checks = [("ib_send_bw", ib), ("eth0 TCP", eth), ("ib_send_lat", row["ib_send_lat"]),
                  ("ib_send_lat -e", row["ib_send_lat_e"]), ("qperf tcp_lat eth0", el["tcp_lat_us"]),
                  ("qperf udp_lat eth0", el["udp_lat_us"]), ("ping eth0", el["ping_avg_us"])]
        if eth0_sweep:
            checks.append(("UDP lossless rate eth0 (a sweep step)", row["eth0_sweep"]["lossless_mbit"]))
        for pre in pres:
            v = row["variants"][names[pre]]
            vl = v["latency"]
            checks += [(f"uipoib TCP ({names[pre]})", v["tcp"]), (f"uipoib UDP ({names[pre]})", v["udp"]),
                       (f"qperf tcp_lat uipoib ({names[pre]})", vl["tcp_lat_us"]),
                       (f"qperf udp_lat uipoib ({names[pre]})", vl["udp_lat_us"]),
                       (f"ping uipoib ({names[pre]})", vl["ping_avg_us"]),
                       (f"UDP lossless rate ({names[pre]}: a sweep step)", v["sweep"]["lossless_mbit"])]
            if window:
                checks.append((f"UDP lossless rate, -w {window} ({names[pre]}: a sweep step)", v["sweepw"]["lossless_mbit"]))
        rec, ru = row["recovery"], row["restart_udp"]
        checks += [("recovery from a poll failure", rec["recovery_ms"]),
                   ("TCP session during the recovery run", rec["session_intact"]),
                   ("TCP retransmits of the recovery run", rec["retransmits"]),
                   ("rxe rx lost during the recovery run", rec["rx_lost_rxe"]),
                   ("daemon drops during the recovery run", rec["daemon_drops_a"]),
                   ("UDP datagrams lost over a restart", ru["lost_packets"]),
                   ("recovery from a poll failure under UDP", ru["recovery_ms"])]
        missing += [f"rep {r}: {n}" for n, v in checks if v is None]
        rows.append(row)

    W = 40  # the label column
    lines = []
    p = lines.append
    p("uipoib performance over rxe (scripts/perf)")
    for l in run_head(out):
        p("  " + l)
    p(f"  message size {msg} B (rxe active MTU); uip0 MTU {uip_mtu}; {reps} rep(s)")
    p("")
    hdr = f"{'measurement':<{W}} " + " ".join(f"{'rep ' + str(r['rep']):>9}" for r in rows) + f" {'median':>9} {'spread':>15}"
    p(hdr)
    p("-" * len(hdr))

    def line(label, vals, spec=".1f"):
        s = spread(vals)
        sp = "-" if s is None else f"{format(s[0], spec)}-{format(s[1], spec)}"
        p(f"{label:<{W}} " + " ".join(f"{fmt(v, spec):>9}" for v in vals) + f" {fmt(med(vals), spec):>9} {sp:>15}")
        return med(vals)

    summary = {}
    ibs = [r["ib_send_bw"] for r in rows]
    eths = [(r["eth0_tcp"] or {}).get("mbit") for r in rows]
    summary["ib_send_bw_mbit"] = line(f"ib_send_bw UD {msg} B recvd Mbit/s", ibs)
    summary["ib_send_bw_sent_mbit"] = line("  sent                     Mbit/s", [r["ib_send_bw_sent"] for r in rows])
    for r in rows:
        if r["ib_send_bw_note"]:
            p("  " + r["ib_send_bw_note"])
    summary["eth0_tcp_mbit"] = line("iperf3 TCP eth0            Mbit/s", eths)
    eth0_lossless = [(r["eth0_sweep"] or {}).get("lossless_mbit") for r in rows]
    if eth0_sweep:
        summary["eth0_udp_lossless_mbit"] = line("UDP lossless eth0          Mbit/s", eth0_lossless)
    vals = {}
    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        vv = [r["variants"][n] for r in rows]
        tcp = [(v["tcp"] or {}).get("mbit") for v in vv]
        udp = [(v["udp"] or {}).get("mbit") for v in vv]
        vals[n] = (tcp, udp)
        summary[f"uip_tcp_mbit{tag}"] = line(f"iperf3 TCP uipoib{tag}".ljust(27) + "Mbit/s", tcp)
        line(f"  TCP retransmits{tag}", [(v["tcp"] or {}).get("retransmits") for v in vv], ".0f")
        line(f"iperf3 UDP uipoib{tag} offered", [(v["udp"] or {}).get("offered") for v in vv])
        summary[f"uip_udp_mbit{tag}"] = line(f"iperf3 UDP uipoib{tag} recvd", udp)
        summary[f"uip_udp_loss_percent{tag}"] = line(f"  UDP loss %{tag}", [(v["udp"] or {}).get("lost_percent") for v in vv], ".2f")
        lossless = [v["sweep"]["lossless_mbit"] for v in vv]
        vals[n] += (lossless,)
        summary[f"uip_udp_lossless_mbit{tag}"] = line(f"UDP lossless uipoib{tag}".ljust(27) + "Mbit/s", lossless)
        if window:
            lw = [v["sweepw"]["lossless_mbit"] for v in vv]
            vals[n] += (lw,)
            summary[f"uip_udp_lossless_w_mbit{tag}"] = line(f"  with -w {window}{tag}".ljust(27) + "Mbit/s", lw)
    p("")
    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        tcp, udp, lossless = vals[n][:3]
        summary[f"ratio_uip_tcp_vs_ib{tag}"] = line(f"ratio TCP uipoib{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(tcp, ibs)], ".3f")
        summary[f"ratio_uip_udp_vs_ib{tag}"] = line(f"ratio UDP uipoib{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(udp, ibs)], ".3f")
        summary[f"ratio_uip_tcp_vs_eth0{tag}"] = line(f"ratio TCP uipoib{tag} / TCP eth0", [ratio(a, b) for a, b in zip(tcp, eths)], ".3f")
        summary[f"ratio_uip_udp_lossless_vs_ib{tag}"] = line(f"ratio UDP lossless{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(lossless, ibs)], ".3f")
        if window:
            summary[f"ratio_uip_udp_lossless_w_vs_ib{tag}"] = line(f"  with -w {window}{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(vals[n][3], ibs)], ".3f")
    summary["ratio_eth0_tcp_vs_ib"] = line("ratio TCP eth0 / ib_send_bw", [ratio(a, b) for a, b in zip(eths, ibs)], ".3f")
    if eth0_sweep:
        summary["ratio_eth0_udp_lossless_vs_ib"] = line("ratio UDP lossless eth0 / ib_send_bw", [ratio(a, b) for a, b in zip(eth0_lossless, ibs)], ".3f")

    # Latency, one way (ib_send_lat, qperf) or round trip (ping), in us.
    p("")
    iblat = [(r["ib_send_lat"] or {}).get("t_typical") for r in rows]
    iblat_e = [(r["ib_send_lat_e"] or {}).get("t_typical") for r in rows]
    summary["ib_send_lat_typical_us"] = line("ib_send_lat UD 64 B t_typical     us", iblat)
    summary["ib_send_lat_min_us"] = line("  t_min                            us", [(r["ib_send_lat"] or {}).get("t_min") for r in rows])
    summary["ib_send_lat_e_typical_us"] = line("ib_send_lat -e UD 64 B t_typical  us", iblat_e)
    summary["ib_send_lat_e_min_us"] = line("  t_min                            us", [(r["ib_send_lat_e"] or {}).get("t_min") for r in rows])
    el = [r["eth0_latency"] for r in rows]
    summary["eth0_tcp_lat_us"] = line("qperf tcp_lat eth0                us", [x["tcp_lat_us"] for x in el])
    summary["eth0_udp_lat_us"] = line("qperf udp_lat eth0                us", [x["udp_lat_us"] for x in el])
    summary["eth0_ping_avg_us"] = line("ping eth0 avg                     us", [x["ping_avg_us"] for x in el])
    summary["eth0_ping_min_us"] = line("  min                              us", [x["ping_min_us"] for x in el])
    lats = {}
    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        vl = [r["variants"][n]["latency"] for r in rows]
        lats[n] = vl
        summary[f"uip_tcp_lat_us{tag}"] = line(f"qperf tcp_lat uipoib{tag}".ljust(34) + "us", [x["tcp_lat_us"] for x in vl])
        summary[f"uip_udp_lat_us{tag}"] = line(f"qperf udp_lat uipoib{tag}".ljust(34) + "us", [x["udp_lat_us"] for x in vl])
        summary[f"uip_ping_avg_us{tag}"] = line(f"ping uipoib{tag} avg".ljust(34) + "us", [x["ping_avg_us"] for x in vl])
        summary[f"uip_ping_min_us{tag}"] = line("  min".ljust(34) + "us", [x["ping_min_us"] for x in vl])
    p("")
    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        vl = lats[n]
        summary[f"ratio_uip_tcp_lat_vs_ib_send_lat{tag}"] = line(
            f"ratio tcp_lat uipoib{tag} / ib_send_lat", [ratio(x["tcp_lat_us"], b) for x, b in zip(vl, iblat)], ".3f")
        summary[f"ratio_uip_tcp_lat_vs_eth0{tag}"] = line(
            f"ratio tcp_lat uipoib{tag} / eth0", [ratio(x["tcp_lat_us"], e["tcp_lat_us"]) for x, e in zip(vl, el)], ".3f")
        summary[f"ratio_uip_udp_lat_vs_eth0{tag}"] = line(
            f"ratio udp_lat uipoib{tag} / eth0", [ratio(x["udp_lat_us"], e["udp_lat_us"]) for x, e in zip(vl, el)], ".3f")
        summary[f"ratio_uip_ping_vs_eth0{tag}"] = line(
            f"ratio ping uipoib{tag} / eth0 (avg)", [ratio(x["ping_avg_us"], e["ping_avg_us"]) for x, e in zip(vl, el)], ".3f")
    summary["ratio_ib_send_lat_e_vs_poll"] = line("ratio ib_send_lat -e / ib_send_lat", [ratio(a, b) for a, b in zip(iblat_e, iblat)], ".3f")
    p("  targets: tcp_lat uipoib / ib_send_lat <= 2.0; UDP lossless / ib_send_bw >= 0.8")
    if has_alt:
        (bt, bu, bl), (at, au, al) = vals[names[""]][:3], vals[names["alt."]][:3]
        blat, alat = lats[names[""]], lats[names["alt."]]
        p("")
        summary["alt_vs_base_tcp"] = line(f"TCP {names['alt.']} / {names['']} (same rep)", [ratio(a, b) for a, b in zip(at, bt)], ".3f")
        summary["alt_vs_base_udp"] = line(f"UDP {names['alt.']} / {names['']} (same rep)", [ratio(a, b) for a, b in zip(au, bu)], ".3f")
        summary["alt_vs_base_udp_lossless"] = line(f"UDP lossless {names['alt.']} / {names['']} (same rep)",
                                                   [ratio(a, b) for a, b in zip(al, bl)], ".3f")
        if window:
            summary["alt_vs_base_udp_lossless_w"] = line(f"  with -w {window} {names['alt.']} / {names['']}",
                                                         [ratio(a, b) for a, b in zip(vals[names["alt."]][3], vals[names[""]][3])], ".3f")
        summary["alt_vs_base_tcp_lat"] = line(f"tcp_lat {names['alt.']} / {names['']} (same rep)",
                                              [ratio(a["tcp_lat_us"], b["tcp_lat_us"]) for a, b in zip(alat, blat)], ".3f")
    # Recovery from one injected poll failure under load (uip0), per rep: the restart
    # record a's status gained during the run, what the run lost over it.
    recs = [r["recovery"] for r in rows]
    rus = [r["restart_udp"] for r in rows]
    p("")
    summary["recovery_ms"] = line("recovery from one poll failure  ms", [x["recovery_ms"] for x in recs], ".1f")
    summary["recovery_announced_ms"] = line("  detection to announcement  ms", [x["announced_ms"] for x in recs], ".1f")
    summary["recovery_session_intact"] = line("  TCP session intact (1 = yes)", [x["session_intact"] for x in recs], ".0f")
    summary["recovery_tcp_retransmits"] = line("  TCP retransmits per restart", [x["retransmits"] for x in recs], ".0f")
    summary["recovery_rx_lost_rxe"] = line("  rx lost per restart (rxe)", [x["rx_lost_rxe"] for x in recs], ".0f")
    summary["recovery_daemon_drops"] = line("  daemon drops per restart (a)", [x["daemon_drops_a"] for x in recs], ".0f")
    summary["recovery_lost_between_daemons"] = line("  b daemon sent - a daemon received", [x["where_lost"]["between_daemons"] for x in recs], ".0f")
    summary["restart_udp_lost_packets"] = line("UDP datagrams lost per restart", [x["lost_packets"] for x in rus], ".0f")
    line("  UDP datagrams in the run", [x["packets"] for x in rus], ".0f")
    summary["restart_udp_recovery_ms"] = line("  recovery ms (UDP run)", [x["recovery_ms"] for x in rus], ".1f")
    summary["restart_udp_announced_ms"] = line("  detection to announcement  ms", [x["announced_ms"] for x in rus], ".1f")
    summary["restart_udp_rx_lost_rxe"] = line("  rx lost per restart (rxe, UDP run)", [x["rx_lost_rxe"] for x in rus], ".0f")
    summary["restart_udp_lost_between_daemons"] = line("  b daemon sent - a daemon received", [x["where_lost"]["between_daemons"] for x in rus], ".0f")
    for r, x, y in zip(rows, rus, recs):
        p(f"  rep {r['rep']} under TCP: restarts seen {y['restarts']}; {where_text(y['where_lost'])}")
        p(f"  rep {r['rep']} under UDP: restarts seen {x['restarts']}; lost {fmt(x['lost_packets'], '.0f')} of "
          f"{fmt(x['packets'], '.0f')}: {where_text(x['where_lost'])}")
    # Where each restart's time went (ms), as `scripts/perf recovery` prints it.
    if any(x["phases"] for x in recs + rus):
        p(f"  {'phases (ms):':<20}" + " ".join(f"{phase_name(k):>8}" for k in PHASES) + supervisor_heads())
        for r, x, y in zip(rows, rus, recs):
            for what, z in (("TCP", y), ("UDP", x)):
                if z["phases"]:
                    p(f"  {'rep ' + str(r['rep']) + ' under ' + what:<20}" + " ".join(phase_cell(z["phases"], k) for k in PHASES)
                      + supervisor_cells(z.get("supervisor")))
        p(f"  {SUPERVISOR_LEGEND}")

    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        p("")
        p(f"daemon cost during iperf3 TCP through uipoib{tag} (a receives the data, b sends it):")
        for side, who in (("rx", "a (rx)"), ("tx", "b (tx)")):
            dv = lambda k: [(r["variants"][n]["daemon"].get(side) or {}).get(k) for r in rows]  # noqa: E731
            summary[f"daemon_{side}_cpu_percent{tag}"] = line(f"  {who} daemon CPU %", dv("cpu_percent"))
            if any(v is not None for v in dv("vcpu_busy")):
                line(f"  {who} guest vCPU busy %", dv("vcpu_busy"))
            line(f"  {who} system share of it", dv("sys_share"), ".2f")
            summary[f"daemon_{side}_us_per_packet{tag}"] = line(f"  {who} CPU us / packet", dv("us_per_packet"))
            line(f"  {who} polls / packet", dv("polls_per_packet"), ".3f")
            line(f"  {who} CQ events / packet", dv("events_per_packet"), ".3f")
            line(f"  {who} re-arms / packet", dv("rearms_per_packet"), ".3f")
            line(f"  {who} TX backpressure episodes", dv("backpressure"), ".0f")
            line(f"  {who} context switches / packet", dv("ctxt_per_packet"), ".2f")
        p("")
        p(f"UDP through uipoib{tag}, where datagrams went (per rep):")
        for row in rows:
            ul = row["variants"][n]["udp_loss"]
            lb, la = ul["b"], ul["a"]
            tb, ta = lb["tap"] or {}, la["tap"] or {}
            p(f"  rep {row['rep']}: daemon drops b {lb['daemon_drops']}, a {la['daemon_drops']}; "
              f"b TAP tx {tb.get('tx_packets', '-')} (dropped {tb.get('tx_dropped', '-')}), "
              f"b daemon sent {(lb['daemon'] or {}).get('tx_packets', '-')}; "
              f"a daemon received {(la['daemon'] or {}).get('rx_packets', '-')}, a TAP rx dropped {ta.get('rx_dropped', '-')}, "
              f"a backlog dropped {fmt(la['backlog_dropped'], '.0f')}, a UDP socket dropped {fmt((la['udp'] or {}).get('RcvbufErrors'), '.0f')}")
            for role in ("b", "a"):
                rx = ul[role]["rxe"]
                if rx:
                    p(f"    rxe counters on {role}: " + ", ".join(f"{k} +{v}" for k, v in sorted(rx.items())))
        p("")
        p(f"UDP rate sweep through uipoib{tag} (-b asked, sent and received Mbit/s, loss, the receiver's time over the")
        p(f"  sender's; lossless: < 1 % loss and the receiver done within {SWEEP_SUSTAIN}x the sender's time;")
        p("  where datagrams were lost: b's TAP queue, the daemons' drops, between the daemons (of it rxe's")
        p("  rcvd_pkts - rdma_recvs on a), a's TAP, a's input backlog, a's UDP socket receive buffer;")
        p("  then each guest's vCPU while iperf3 ran, from /proc/stat: busy, and its user, system and")
        p("  interrupt (hard and soft: rxe's receive, the kernel's input) shares):")
        for row, key in [(row, key) for key in ("sweep", "sweepw") for row in rows]:
            sw = row["variants"][n].get(key)
            if sw is None:
                continue
            how = "" if key == "sweep" else f" (iperf3 -w {window})"
            p(f"  rep {row['rep']}{how}: ib_send_bw {fmt(row['ib_send_bw'])}, lossless {fmt(sw['lossless_mbit'])} Mbit/s")
            for st in sw["steps"]:
                if st.get("missing"):
                    p(f"    step {st['step']}: -b {fmt(st['target_mbit'])}: no result")
                    continue
                p(f"    {step_text(st)}: {where_text(st['where_lost'])}")
                wl = st["where_lost"]
                if wl["a"].get("vcpu") or wl["b"].get("vcpu"):
                    p(f"      vCPU a {vcpu_text(wl['a'].get('vcpu'))}; b {vcpu_text(wl['b'].get('vcpu'))}")

    if eth0_sweep:
        p("")
        p("UDP rate sweep over eth0, the kernel's own path (the same datagrams and bounds, the default")
        p("  buffer; lost in a's input backlog and a's UDP socket receive buffer; each guest's vCPU):")
        for row in rows:
            sw = row["eth0_sweep"]
            p(f"  rep {row['rep']}: ib_send_bw {fmt(row['ib_send_bw'])}, lossless {fmt(sw['lossless_mbit'])} Mbit/s")
            for st in sw["steps"]:
                if st.get("missing"):
                    p(f"    step {st['step']}: -b {fmt(st['target_mbit'])}: no result")
                    continue
                wa = st["where_lost"]["a"]
                p(f"    {step_text(st)}: "
                  f"a backlog {fmt(wa['backlog_dropped'], '.0f')}, a UDP socket {fmt((wa['udp'] or {}).get('RcvbufErrors'), '.0f')}; "
                  f"vCPU a {vcpu_text(wa.get('vcpu'))}; b {vcpu_text(st['where_lost']['b'].get('vcpu'))}")

    for role in ("a", "b"):
        st = read(os.path.join(raw, f"prof.strace.{role}.txt"))
        if st:
            p("")
            p(f"strace -c -f on daemon {role} ({'receiver' if role == 'a' else 'sender'}) during a profile run:")
            for l in st.strip().splitlines()[:16]:
                p("  " + l)
            # Syscalls per packet of the datapath: the control thread's accept/sleep loop
            # (accept4, clock_nanosleep) is not per packet.
            calls = {}
            for l in st.splitlines():
                fs = l.split()
                if len(fs) >= 5 and fs[-1].isidentifier() and fs[3].isdigit():
                    calls[fs[-1]] = int(fs[3])
            d = stats_delta(out, "prof.strace", role)
            pkts = (d or {}).get("rx_packets", 0) + (d or {}).get("tx_packets", 0)
            if calls and pkts:
                dp = {k: v for k, v in calls.items() if k not in ("accept4", "clock_nanosleep", "restart_syscall", "total")}
                p(f"  => {pkts} packets; datapath syscalls per packet {sum(dp.values()) / pkts:.2f}: "
                  + ", ".join(f"{k} {v / pkts:.2f}" for k, v in sorted(dp.items(), key=lambda kv: -kv[1]) if v / pkts >= 0.01))
        pr = read(os.path.join(raw, f"prof.perf-report.{role}.txt"))
        if pr:
            p("")
            p(f"perf record (cpu-clock) on daemon {role}, top symbols:")
            n = 0
            for l in pr.splitlines():
                if l.startswith("#"):
                    continue
                if re.match(r"^\s+[\d.]+%", l):
                    p("  " + " ".join(l.split()))
                    n += 1
                if n >= 20:
                    break

    bad_steps = []
    for s_ in sorted(glob.glob(os.path.join(out, "status", "*"))):
        t = (read(s_) or "").strip()
        if t != "ok":
            bad_steps.append(f"{os.path.basename(s_)}: {t}")
    if bad_steps or missing or args.vm_rc:
        p("")
        p("PROBLEMS:")
        for x in missing:
            p(f"  missing: {x}")
        for x in bad_steps:
            p(f"  {x}")
        if args.vm_rc:
            p(f"  guests exited {args.vm_rc} (see {out}/a.log, b.log)")
    t = "\n".join(lines) + "\n"
    rep = dict(reps=rows, summary=summary, missing=missing, problems=bad_steps, msg_size=msg)
    return finish(out, "perf", "report.txt", "report.json", t, rep, not missing, [f"missing: {x}" for x in missing])


# ---- perf-host: scripts/perf host -------------------------------------------------------------


def perf_host(a):
    out, reps = a.out, a.reps
    L = []

    def row(label, vals, spec):
        xs = [v for v in vals if v is not None]
        md = format(statistics.median(xs), spec) if xs else "-"
        sp = f"{format(min(xs), spec)}-{format(max(xs), spec)}" if xs else "-"
        cells = " ".join(f"{'-' if v is None else format(v, spec):>9}" for v in vals)
        L.append(f"{label:<34} {cells} {md:>9} {sp:>17}")

    runs = {k: [iperf_received_mbit(os.path.join(out, f"r{r}.{k}.json")) for r in range(1, reps + 1)]
            for k in ("uipoib", "tapcopy", "tapcopy-offload")}
    u, t, o = runs["uipoib"], runs["tapcopy"], runs["tapcopy-offload"]
    L.append(f"host comparison (scripts/perf host): iperf3 TCP, MTU 4092, {os.cpu_count()} cores")
    hdr = f"{'measurement':<34} " + " ".join(f"{'rep ' + str(r):>9}" for r in range(1, reps + 1)) + f" {'median':>9} {'spread':>17}"
    L.append(hdr)
    L.append("-" * len(hdr))
    row("uipoib sim-pair TCP        Mbit/s", u, ".0f")
    row("tapcopy TCP                Mbit/s", t, ".0f")
    row("tapcopy --offload TCP      Mbit/s", o, ".0f")
    row("ratio uipoib / tapcopy", [ratio(x, y) for x, y in zip(u, t)], ".3f")
    row("ratio uipoib / tapcopy --offload", [ratio(x, y) for x, y in zip(u, o)], ".3f")
    missing = [f"rep {r}: {k}" for k, vs in runs.items() for r, v in enumerate(vs, 1) if v is None]
    rep = {"reps": reps, "mbit_per_s": runs}
    return finish(out, "perf-host", "report.txt", "report.json", "\n".join(L) + "\n", rep, not missing,
                  [f"missing: {x}" for x in missing])


# ---- recovery: scripts/perf recovery ------------------------------------------------------------

PHASES = ["handoff", "drain", "destroy", "renew", "reap", "open", "ah", "attach", "fill", "start", "announce", "spawn", "carrier",
          "bank_reap"]


def phase_name(k):
    """A phase's column heading, 8 wide at most (`bank_reap`: after the recovery, the failed QP's
    destroy and its bank's reap when a spare bank deferred them)."""
    return {"bank_reap": "bankreap"}.get(k, k)


def phase_cell(phases, k):
    """One restart's phase `k` in ms, 8 wide; "-" where the binary did not record it
    (older than the phase)."""
    return f"{phases[k + '_ms']:8.1f}" if k + "_ms" in phases else f"{'-':>8}"


SUPERVISOR = [("on_cpu", "sup.cpu"), ("runqueue", "sup.runq"), ("slept", "sup.slept")]
SUPERVISOR_LEGEND = ("sup.*: the restart supervisor's thread from taking the restart up to the hand-over, "
                     "as its scheduler counted it: on a CPU, runnable waiting for one, asleep")


def supervisor_heads():
    return " " + " ".join(f"{h:>9}" for _, h in SUPERVISOR)


def supervisor_cells(t):
    """The supervisor's share of one restart (ms), 9 wide each; "-" where the binary or the
    kernel did not record it."""
    return " " + " ".join(f"{t[k + '_ms']:9.1f}" if t and k + "_ms" in t else f"{'-':>9}" for k, _ in SUPERVISOR)


def recovery(a):
    out, n = a.out, a.faults
    L = run_head(out)
    bad = []
    st, err = read_json(os.path.join(out, "recovery-status-a.json"))
    if st is None:
        L.append(f"FAILED: no status from guest a ({err})")
        bad.append(f"no status from guest a ({err})")
        return finish(out, "recovery", "recovery-report.txt", "recovery-report.json", "\n".join(L) + "\n", {}, False, bad)
    hist = [h for h in st.get("history", []) if h["cause"] == "poll-failed"]
    # PERF_RECOVERY_WARMUP: restarts before the load, left out.
    env = read_env(os.path.join(out, "recovery.env"))
    warm = env.get("PERF_RECOVERY_WARMUP", "0")
    warm = int(warm) if warm.isdigit() else 0
    if warm:
        L.append(f"warm-up restarts before the load, left out: {len(hist[:warm])} of {warm}")
        if len(hist) < warm:
            bad.append(f"{len(hist)} restarts recorded for {warm} warm-up faults")
        hist = hist[warm:]
    rec = [h["recovery_ms"] for h in hist]
    # What each guest's eth0 ran its receive work in (LAB_NAPI_NICE: lab/guest/stage2).
    napi = {}
    for r in "ab":
        e = read_env(os.path.join(out, f"recovery-napi-{r}.txt"))
        if e:
            napi[r] = dict(threaded=e.get("NAPI_THREADED"), nice=e.get("NAPI_NICE") or None)
    if napi:
        L.append("eth0's receive work: " + ", ".join(
            f"{r}: " + (f"kernel threads (threaded NAPI, nice {v['nice'] or 'unknown'})" if v["threaded"] == "1"
                        else "softirq context" if v["threaded"] == "0" else f"unknown ({v['threaded']})")
            for r, v in napi.items()))
    L.append(f"poll failures injected: {n}; restarts recorded: {len(hist)}")
    for h in hist:
        ann = f"  announced {h['announced_ms']:6.1f} ms" if "announced_ms" in h else ""
        late = " after the new epoch ran" if h.get("deferred_reap") else ""
        L.append(f"  epoch {h['epoch']:>3}  recovery {h['recovery_ms']:8.1f} ms{ann}  flushed {h['flushed']:>5}  reaped {h['wr_reaped']:>4}{late}  ledger {'ok' if h['ledger_balanced'] else 'BAD'}")
    if rec:
        L.append(f"recovery: median {statistics.median(rec):.1f} ms, worst {max(rec):.1f} ms, best {min(rec):.1f} ms")
    ann = [h["announced_ms"] for h in hist if "announced_ms" in h]
    if ann:
        L.append(f"detection to announcement: median {statistics.median(ann):.1f} ms, worst {max(ann):.1f} ms")
    # Where the time went (ms, per restart, in order); absent from binaries before the phases.
    ph = [h.get("phases") for h in hist]
    if ph and all(ph):
        L.append("phases (ms): " + " ".join(f"{phase_name(x):>8}" for x in PHASES) + "      kept" + supervisor_heads())
        for h, p in zip(hist, ph):
            L.append(f"  epoch {h['epoch']:>3}  " + " ".join(phase_cell(p, x) for x in PHASES)
                     + f"  {'yes' if h.get('kept_device') else 'no':>8}" + supervisor_cells(h.get("supervisor")))
        med = [[p[x + "_ms"] for p in ph if x + "_ms" in p] for x in PHASES]
        sup = [[h["supervisor"][k + "_ms"] for h in hist if h.get("supervisor")] for k, _ in SUPERVISOR]
        L.append("  median     " + " ".join(f"{statistics.median(m):8.1f}" if m else f"{'-':>8}" for m in med)
                 + f"  {'':>8} " + " ".join(f"{statistics.median(m):9.1f}" if m else f"{'-':>9}" for m in sup))
        L.append(f"  {SUPERVISOR_LEGEND}")
    if len(hist) != n:
        bad.append(f"{len(hist)} restarts recorded for {n} faults")
    if not all(h["ledger_balanced"] for h in hist):
        bad.append("a ledger did not balance")
    load = getattr(a, "load", "tcp")
    session = (recovery_udp if load == "udp" else recovery_tcp)(out, hist, L, bad, load)
    capture = None
    if env.get("PERF_RECOVERY_CAPTURE") == "1":
        capture = capture_timeline(out, hist, L, bad, session)
    traced = None
    if env.get("PERF_RECOVERY_FTRACE") == "1":
        from ftrace import announce_section

        lines, traced = announce_section(out, n, "uip0")
        L.extend(lines)
    L.append("RESULT: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)))
    rep = {"faults": n, "load": load, "napi": napi, "restarts": hist, "iperf3": session, "capture": capture, "announce_traced": traced}
    return finish(out, "recovery", "recovery-report.txt", "recovery-report.json", "\n".join(L) + "\n", rep, not bad, bad)


def recovery_tcp(out, hist, L, bad, load):
    """The TCP loads of `scripts/perf recovery` (`tcp`: b sends to a, the side that fails;
    `tcp-reverse`: a sends): the session's rate and whether it survived, the sender's
    retransmits, and where b's packets went missing."""
    try:
        crc = open(os.path.join(out, "recovery-iperf3-client.rc")).read().strip()
        j = json.load(open(os.path.join(out, "recovery-iperf3-client.json")))
        bps = j["end"]["sum_received"]["bits_per_second"] / 1e6
        zero = sum(1 for i in j["intervals"] if i["sum"]["bytes"] == 0)
        # The sender's retransmits over the whole session: with no loss but the restarts'
        # (none otherwise in this lab), what the restarts cost the TCP session.
        retx = (j["end"].get("sum_sent") or {}).get("retransmits")
        session = {"exit": crc, "mbit_per_s": bps, "zero_intervals": zero, "retransmits": retx}
        sender = "a" if load == "tcp-reverse" else "b"
        who = "a sends, b receives" if sender == "a" else "b sends, a receives"
        L.append(f"iperf3 TCP session ({who}): exit {crc}, {bps:.1f} Mbit/s received, {zero} one-second intervals with no data")
        # The sending guest's own count (iperf3 reports the client's side only: nothing
        # for a sending server, under -R).
        kretx = snmp_delta(out, sender, "Tcp", "RetransSegs")
        if kretx is not None:
            session["sender_retrans_segs"] = kretx
            L.append(f"TCP segments retransmitted by the sender ({sender}'s RetransSegs): {kretx}"
                     + (f" ({kretx / len(hist):.0f} per restart)" if hist else ""))
        elif retx is not None and hist:
            L.append(f"TCP retransmits in the session: {retx} ({retx / len(hist):.0f} per restart)")
        session.update(lost_where(out, L, len(hist)))
        if crc != "0":
            bad.append("the TCP session broke")
        return session
    except Exception as e:
        bad.append(f"no iperf3 result ({e})")
        return None


# The first seconds of the UDP stream, before any failure is injected (the guest waits 5 s
# after the stream starts): their loss is the stream's own, without restarts.
UDP_BASELINE_S = 4.0


def snmp_delta(out, role, proto, field):
    """`proto`'s counter `field` in guest `role`'s /proc/net/snmp over the session (the
    copies taken before and after it), or None."""
    def read(when):
        try:
            lines = open(os.path.join(out, f"recovery-snmp-{when}-{role}.txt")).read().splitlines()
        except OSError:
            return None
        rows = [ln.split()[1:] for ln in lines if ln.startswith(proto + ":")]
        if len(rows) < 2:
            return None
        return dict(zip(rows[0], rows[1]))
    b, e = read("before"), read("after")
    try:
        return int(e[field]) - int(b[field])
    except (TypeError, KeyError, ValueError):
        return None


def lost_where(out, L, restarts):
    """Where packets from b went missing over the recovery run: the failed QPs' slots on a
    (a's rxe placed them, no completion was ever polled: the restarts' own loss), b's TAP
    queue (b's daemon read too slowly) or a's rxe."""
    sa, _ = read_json(os.path.join(out, "recovery-stats-a.json"))
    sb, _ = read_json(os.path.join(out, "recovery-stats-b.json"))
    if not (sa and sb):
        return {}
    rxe = (sa.get("kernel") or {}).get("port") or {}
    in_failed = rxe.get("rdma_recvs", 0) - sa.get("recv_completed", 0)
    b_tap = ((sb.get("kernel") or {}).get("tap") or {}).get("tx_dropped")
    a_rxe = rxe.get("rcvd_pkts", 0) - rxe.get("rdma_recvs", 0)
    per = f" ({in_failed / restarts:.1f} per restart)" if restarts else ""
    L.append(f"  where: {in_failed} placed by a's rxe in the failed QPs' slots, never completed{per}; "
             f"{b_tap} dropped by b's TAP (queue full); {a_rxe} dropped by a's rxe")
    return {"in_failed_qps": in_failed, "b_tap_dropped": b_tap, "a_rxe_dropped": a_rxe}


def recovery_udp(out, hist, L, bad, load="udp"):
    """The UDP load of `scripts/perf recovery`: the receiver's datagrams lost over the
    session, in its first UDP_BASELINE_S seconds (no restart yet) and after, per restart."""
    try:
        crc = open(os.path.join(out, "recovery-iperf3-client.rc")).read().strip()
        j = json.load(open(os.path.join(out, "recovery-iperf3-server.json")))
        ivs = [i["sum"] for i in j["intervals"]]
        lost = sum(i["lost_packets"] for i in ivs)
        packets = sum(i["packets"] for i in ivs)
        base = [i for i in ivs if i["end"] <= UDP_BASELINE_S + 0.05]
        base_lost = sum(i["lost_packets"] for i in base)
        base_s = max([i["end"] for i in base] + [0.0])
        rest_lost = lost - base_lost
        secs = ivs[-1]["end"] if ivs else 0.0
        rate = packets / secs if secs else 0.0
        # The restarts detected while the stream ran (its start is known to the second).
        t0 = j["start"]["timestamp"]["timesecs"]
        during = [h for h in hist if t0 <= h["detected_unix_ms"] / 1e3 <= t0 + secs]
        per = rest_lost / len(during) if during else None
        session = {"exit": crc, "packets": packets, "lost_packets": lost, "baseline_seconds": base_s,
                   "baseline_lost": base_lost, "lost_after_baseline": rest_lost, "lost_per_restart": per,
                   "datagrams_per_second": rate}
        L.append(f"iperf3 UDP session: exit {crc}, {packets} datagrams in {secs:.1f} s ({rate:.0f}/s), {lost} lost; "
                 f"{len(during)} of the {len(hist)} restarts during it")
        if len(during) != len(hist):
            bad.append(f"{len(hist) - len(during)} restarts outside the UDP stream")
        L.append(f"  lost in the first {base_s:.1f} s, before any failure: {base_lost}")
        if per is not None:
            L.append(f"  lost after it: {rest_lost}, {per:.1f} per restart")
        session["restarts_during"] = len(during)
        rec = [h["recovery_ms"] for h in during]
        ann = [h["announced_ms"] for h in during if "announced_ms" in h]
        session.update(lost_where(out, L, len(during)))
        if ann:
            # What the window alone predicts: the sender's rate times detection to announcement.
            pred = rate * statistics.mean(ann) / 1e3
            L.append(f"  predicted by the window (rate x mean detection to announcement {statistics.mean(ann):.1f} ms): "
                     f"{pred:.1f} per restart; by the recovery (mean {statistics.mean(rec):.1f} ms): {rate * statistics.mean(rec) / 1e3:.1f}")
            session["predicted_per_restart_announced"] = pred
        if crc != "0":
            bad.append("the UDP stream failed")
        return session
    except Exception as e:
        bad.append(f"no iperf3 UDP result ({e})")
        return None


def median_of(rows, key):
    """The median of `key` over the dicts in `rows` that have it (None: none has)."""
    xs = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(xs) if xs else None


def capture_rows(out, role):
    """Guest ROLE's capture of RoCEv2 on eth0 (recovery-capture-ROLE.tsv, decoded by tshark): (time,
    source, destination, destination QPN, source QPN or None) per frame, the outer IPv4
    header's addresses; None without a decode."""
    t = read(os.path.join(out, f"recovery-capture-{role}.tsv"))
    if t is None:
        return None
    rows = []
    for ln in t.splitlines():
        f = ln.split("\t")
        if len(f) < 4 or not f[0] or not f[3]:
            continue
        try:
            sqp = int(f[4], 16) if len(f) > 4 and f[4] else None
            rows.append((float(f[0]), f[1].split(",")[0], f[2].split(",")[0], int(f[3], 16), sqp))
        except ValueError:
            continue
    return rows


def capture_timeline(out, hist, L, bad, session):
    """Each restart's timeline on a's clock, from a's capture on eth0: the packets from b
    that reached the failed QP after the failed poll (detected_unix_ms), when a's
    announcement of the new QPN left (its first multicast from the new QP), when b's last
    packet to the old QPN and its first to the new one arrived. What rxe placed in the
    failed QPs' slots beyond the packets after the failure was waiting in the failed CQ
    when the poll failed."""
    env = read_env(os.path.join(out, "recovery-capture-a.env"))
    rows = capture_rows(out, "a")
    if not rows or "CAPTURE_SELF" not in env or "CAPTURE_PEER" not in env:
        bad.append("PERF_RECOVERY_CAPTURE=1 but no decoded capture of a (recovery-capture-a.{pcap,tsv,log})")
        return None
    a, b = env["CAPTURE_SELF"], env["CAPTURE_PEER"]
    rows.sort(key=lambda r: r[0])
    to_a = [r for r in rows if r[1] == b and r[2] == a]
    a_mcast = [r for r in rows if r[1] == a and r[3] == 0xFFFFFF and r[4] is not None]
    det = sorted(h["detected_unix_ms"] / 1e3 for h in hist)
    per = []
    for i, tf in enumerate(det):
        until = det[i + 1] if i + 1 < len(det) else float("inf")
        before = [r for r in to_a if r[0] < tf]
        if not before:
            continue
        old = before[-1][3]
        ann = next((r for r in a_mcast if tf <= r[0] < until and r[4] != old), None)
        new = ann[4] if ann else None
        after_old = [r for r in to_a if tf <= r[0] < until and r[3] == old]
        first_new = next((r for r in to_a if tf <= r[0] < until and new is not None and r[3] == new), None)
        ms = lambda t: None if t is None else (t - tf) * 1e3
        per.append({
            "old_qpn": old, "new_qpn": new,
            "to_old_after_failure": len(after_old),
            "announcement_left_ms": ms(ann[0] if ann else None),
            "last_to_old_ms": ms(after_old[-1][0] if after_old else None),
            "first_to_new_ms": ms(first_new[0] if first_new else None),
        })
    L.append(f"capture on a's eth0 ({len(rows)} RoCEv2 frames; ms after each failed poll, on a's clock):")
    L.append("  restart  old->new QPN  to old QP after  announcement left  b's last to old  b's first to new")
    for k, p in enumerate(per, 1):
        L.append(f"  {k:>7}  {p['old_qpn']:>5}->{p['new_qpn'] if p['new_qpn'] is not None else '?':<5}  "
                 f"{p['to_old_after_failure']:>15}  {fmt(p['announcement_left_ms']):>17}  "
                 f"{fmt(p['last_to_old_ms']):>15}  {fmt(p['first_to_new_ms']):>16}")
    summary = {k: median_of(per, k) for k in ("to_old_after_failure", "announcement_left_ms", "last_to_old_ms",
                                     "first_to_new_ms")}
    lag = [p["last_to_old_ms"] - p["announcement_left_ms"] for p in per
           if p["last_to_old_ms"] is not None and p["announcement_left_ms"] is not None]
    summary["b_switch_after_announcement_ms"] = statistics.median(lag) if lag else None
    if per:
        L.append("  median   " + " " * 12 + f"{fmt(summary['to_old_after_failure']):>15}  "
                 f"{fmt(summary['announcement_left_ms']):>17}  {fmt(summary['last_to_old_ms']):>15}  "
                 f"{fmt(summary['first_to_new_ms']):>16}")
    if lag:
        L.append(f"  b's last packet to the old QPN reached a {summary['b_switch_after_announcement_ms']:.1f} ms "
                 "(median) after a's announcement left")
    placed = (session or {}).get("in_failed_qps")
    total_after = sum(p["to_old_after_failure"] for p in per)
    if placed is not None and per:
        L.append(f"  of the {placed} rxe placed in the failed QPs' slots: {total_after} arrived after the failed poll, "
                 f"{placed - total_after} before it (waiting in the failed CQ, or lost by the capture)")
        summary["placed_before_failure"] = placed - total_after
    if len(per) != len(det):
        bad.append(f"the capture has a timeline for {len(per)} of {len(det)} restarts")
    summary["b"] = capture_at_b(out, per, a, b, L, bad)
    summary["restarts"] = per
    summary["frames"] = len(rows)
    return summary


def capture_at_b(out, per, a, b, L, bad):
    """Each restart on b's clock, from b's capture: from the arrival of a's announcement
    (its first multicast from the new QP, found in a's capture) to a's next unicast to b
    and to b's first packet to the new QPN, and what b still sent to the old one."""
    rows = capture_rows(out, "b")
    if not rows:
        bad.append("PERF_RECOVERY_CAPTURE=1 but no decoded capture of b (recovery-capture-b.{pcap,tsv,log})")
        return None
    rows.sort(key=lambda r: r[0])
    L.append(f"capture on b's eth0 ({len(rows)} RoCEv2 frames; ms after a's announcement reached b, on b's clock):")
    L.append("  restart  a's next unicast to b  b's first to new  b's packets to old after it")
    got = []
    after = float("-inf")
    for k, p in enumerate(per, 1):
        new, old = p["new_qpn"], p["old_qpn"]
        # After the last restart's announcement: a QPN can come back.
        ann = next((r for r in rows if r[0] > after and r[1] == a and r[3] == 0xFFFFFF and r[4] == new), None)
        if new is None or ann is None:
            L.append(f"  {k:>7}  (no announcement seen)")
            continue
        t0 = after = ann[0]
        nxt = next((r for r in rows if r[0] > t0 and r[1] == a and r[2] == b), None)
        first = next((r for r in rows if r[0] >= t0 and r[1] == b and r[2] == a and r[3] == new), None)
        stale = sum(1 for r in rows if t0 <= r[0] < t0 + 1.0 and r[1] == b and r[2] == a and r[3] == old)
        e = {"a_next_unicast_ms": None if nxt is None else (nxt[0] - t0) * 1e3,
             "b_first_to_new_ms": None if first is None else (first[0] - t0) * 1e3,
             "b_to_old_after_announcement": stale}
        got.append(e)
        L.append(f"  {k:>7}  {fmt(e['a_next_unicast_ms']):>21}  {fmt(e['b_first_to_new_ms']):>16}  {stale:>27}")
    summary = {k: median_of(got, k) for k in ("a_next_unicast_ms", "b_first_to_new_ms", "b_to_old_after_announcement")}
    if got:
        L.append(f"  median   {fmt(summary['a_next_unicast_ms']):>21}  {fmt(summary['b_first_to_new_ms']):>16}  "
                 f"{fmt(summary['b_to_old_after_announcement']):>27}")
    summary["restarts"] = got
    return summary
