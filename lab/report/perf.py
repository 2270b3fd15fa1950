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
    parse_ib_send_bw,
    mb_to_mbit,
    iperf_received_mbit,
    finish,
)


# ---- perf: scripts/perf -----------------------------------------------------------------


def ib_send_bw_mbit(t):
    """ib_send_bw's 'BW average' as Mbit/s; perftest sometimes ends a -D run with "0.00"
    after thousands of iterations: that is no measurement."""
    ib = parse_ib_send_bw(t)
    v = mb_to_mbit(ib[1]) if ib else None
    return v if v else None


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
    def get(when):
        t = read(os.path.join(out, "raw", f"{tag}.{when}.rxe.{role}.txt")) or ""
        d = {}
        for line in t.splitlines():
            path, _, val = line.rpartition(":")
            try:
                d[os.path.basename(path)] = int(val)
            except ValueError:
                pass
        return d
    b, a = get("before"), get("after")
    return {k: a[k] - b.get(k, 0) for k in a if a[k] != b.get(k, 0)}


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs):
    xs = [x for x in xs if x is not None]
    return (min(xs), max(xs)) if xs else None


def variant(out, r, pre, tcp_secs_default=1):
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
        )
    # Where UDP datagrams were lost: b's TAP queue (the daemon did not read in time:
    # tx_dropped), the daemons' own drop counters, rxe's counters, a's TAP.
    loss = {}
    for role in ("a", "b"):
        tag = f"r{r}.{pre}uipudp"
        sd = stats_delta(out, tag, role)
        loss[role] = dict(
            tap=link_delta(out, tag, role),
            daemon_drops=sum(sd["drops"].values()) if sd else None,
            daemon=sd and {k: sd.get(k) for k in ("rx_packets", "tx_packets", "tx_backpressure")},
            rxe=rxe_delta(out, tag, role),
        )
    return dict(tcp=tcp, udp=udp, daemon=cost, udp_loss=loss)


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
                   or env_val("PERF_ALT_NICE", "0") != "0" or env_val("PERF_ALT_TXQLEN", "")) or bool(
        glob.glob(os.path.join(raw, "r*.alt.uiptcp.json")))
    pres = ["", "alt."] if has_alt else [""]

    rows = []
    missing = []
    for r in range(1, reps + 1):
        ib = ib_send_bw_mbit(read(os.path.join(raw, f"r{r}.ibsend.txt")))
        eth = perf_iperf(os.path.join(raw, f"r{r}.eth0tcp.json"))
        row = dict(rep=r, ib_send_bw=ib, eth0_tcp=eth, variants={})
        for pre in pres:
            row["variants"][names[pre]] = variant(out, r, pre)
        checks = [("ib_send_bw", ib), ("eth0 TCP", eth)]
        for pre in pres:
            v = row["variants"][names[pre]]
            checks += [(f"uipoib TCP ({names[pre]})", v["tcp"]), (f"uipoib UDP ({names[pre]})", v["udp"])]
        missing += [f"rep {r}: {n}" for n, v in checks if v is None]
        rows.append(row)

    lines = []
    p = lines.append
    p("uipoib performance over rxe (scripts/perf)")
    for l in (read(os.path.join(out, "run.txt")) or "").splitlines():
        p("  " + l)
    p(f"  message size {msg} B (rxe active MTU); uip0 MTU {uip_mtu}; {reps} rep(s)")
    p("")
    hdr = f"{'measurement':<36} " + " ".join(f"{'rep ' + str(r['rep']):>9}" for r in rows) + f" {'median':>9} {'spread':>15}"
    p(hdr)
    p("-" * len(hdr))

    def line(label, vals, spec=".1f"):
        s = spread(vals)
        sp = "-" if s is None else f"{format(s[0], spec)}-{format(s[1], spec)}"
        p(f"{label:<36} " + " ".join(f"{fmt(v, spec):>9}" for v in vals) + f" {fmt(med(vals), spec):>9} {sp:>15}")
        return med(vals)

    summary = {}
    ibs = [r["ib_send_bw"] for r in rows]
    eths = [(r["eth0_tcp"] or {}).get("mbit") for r in rows]
    summary["ib_send_bw_mbit"] = line(f"ib_send_bw UD {msg} B      Mbit/s", ibs)
    summary["eth0_tcp_mbit"] = line("iperf3 TCP eth0            Mbit/s", eths)
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
    p("")
    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        tcp, udp = vals[n]
        summary[f"ratio_uip_tcp_vs_ib{tag}"] = line(f"ratio TCP uipoib{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(tcp, ibs)], ".3f")
        summary[f"ratio_uip_udp_vs_ib{tag}"] = line(f"ratio UDP uipoib{tag} / ib_send_bw", [ratio(a, b) for a, b in zip(udp, ibs)], ".3f")
        summary[f"ratio_uip_tcp_vs_eth0{tag}"] = line(f"ratio TCP uipoib{tag} / TCP eth0", [ratio(a, b) for a, b in zip(tcp, eths)], ".3f")
    summary["ratio_eth0_tcp_vs_ib"] = line("ratio TCP eth0 / ib_send_bw", [ratio(a, b) for a, b in zip(eths, ibs)], ".3f")
    if has_alt:
        (bt, bu), (at, au) = vals[names[""]], vals[names["alt."]]
        p("")
        summary["alt_vs_base_tcp"] = line(f"TCP {names['alt.']} / {names['']} (same rep)", [ratio(a, b) for a, b in zip(at, bt)], ".3f")
        summary["alt_vs_base_udp"] = line(f"UDP {names['alt.']} / {names['']} (same rep)", [ratio(a, b) for a, b in zip(au, bu)], ".3f")
    # Recovery from one injected poll failure under TCP load (uip0), per rep: the newest
    # poll-failed restart record in a's status after the rep's recovery run.
    rec, intact = [], []
    for r in range(1, reps + 1):
        ms = None
        try:
            with open(os.path.join(out, "raw", f"r{r}.recovery.status.a.json")) as fh:
                hist = [h for h in json.load(fh).get("history", []) if h.get("cause") == "poll-failed"]
            if hist:
                ms = hist[-1].get("recovery_ms")
        except Exception:
            pass
        rec.append(ms)
        ok = None
        try:
            with open(os.path.join(out, "raw", f"r{r}.recovery.json")) as fh:
                j = json.load(fh)
            ok = 1.0 if "error" not in j and j.get("end", {}).get("sum_received", {}).get("bytes", 0) > 0 else 0.0
        except Exception:
            pass
        intact.append(ok)
    p("")
    summary["recovery_ms"] = line("recovery from one poll failure  ms", rec, ".1f")
    summary["recovery_session_intact"] = line("  TCP session intact (1 = yes)", intact, ".0f")
    missing += [f"rep {r}: recovery from a poll failure" for r, v in enumerate(rec, 1) if v is None]
    missing += [f"rep {r}: TCP session during the recovery run" for r, v in enumerate(intact, 1) if v is None]

    for pre in pres:
        n = names[pre]
        tag = "" if not has_alt else f" [{n}]"
        p("")
        p(f"daemon cost during iperf3 TCP through uipoib{tag} (a receives the data, b sends it):")
        for side, who in (("rx", "a (rx)"), ("tx", "b (tx)")):
            dv = lambda k: [(r["variants"][n]["daemon"].get(side) or {}).get(k) for r in rows]  # noqa: E731
            summary[f"daemon_{side}_cpu_percent{tag}"] = line(f"  {who} daemon CPU %", dv("cpu_percent"))
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
              f"a daemon received {(la['daemon'] or {}).get('rx_packets', '-')}, a TAP rx dropped {ta.get('rx_dropped', '-')}")
            for role in ("b", "a"):
                rx = ul[role]["rxe"]
                if rx:
                    p(f"    rxe counters on {role}: " + ", ".join(f"{k} +{v}" for k, v in sorted(rx.items())))

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

PHASES = ["handoff", "drain", "destroy", "renew", "reap", "open", "ah", "attach", "fill", "start", "spawn", "carrier"]


def recovery(a):
    out, n = a.out, a.faults
    L = []
    bad = []
    st, err = read_json(os.path.join(out, "recovery-status-a.json"))
    if st is None:
        L.append(f"FAILED: no status from guest a ({err})")
        bad.append(f"no status from guest a ({err})")
        return finish(out, "recovery", "recovery-report.txt", "recovery-report.json", "\n".join(L) + "\n", {}, False, bad)
    hist = [h for h in st.get("history", []) if h["cause"] == "poll-failed"]
    rec = [h["recovery_ms"] for h in hist]
    L.append(f"poll failures injected: {n}; restarts recorded: {len(hist)}")
    for h in hist:
        L.append(f"  epoch {h['epoch']:>3}  recovery {h['recovery_ms']:8.1f} ms  flushed {h['flushed']:>5}  reaped {h['wr_reaped']:>4}  ledger {'ok' if h['ledger_balanced'] else 'BAD'}")
    if rec:
        L.append(f"recovery: median {statistics.median(rec):.1f} ms, worst {max(rec):.1f} ms, best {min(rec):.1f} ms")
    # Where the time went (ms, per restart, in order); absent from binaries before the phases.
    ph = [h.get("phases") for h in hist]
    if ph and all(ph):
        L.append("phases (ms): " + " ".join(f"{x:>8}" for x in PHASES) + "      kept")
        for h, p in zip(hist, ph):
            L.append(f"  epoch {h['epoch']:>3}  " + " ".join(f"{p.get(x + '_ms', 0.0):8.1f}" for x in PHASES) + f"  {'yes' if h.get('kept_device') else 'no':>8}")
        L.append("  median     " + " ".join(f"{statistics.median(p.get(x + '_ms', 0.0) for p in ph):8.1f}" for x in PHASES))
    if len(hist) != n:
        bad.append(f"{len(hist)} restarts recorded for {n} faults")
    if not all(h["ledger_balanced"] for h in hist):
        bad.append("a ledger did not balance")
    session = None
    try:
        crc = open(os.path.join(out, "recovery-iperf3-client.rc")).read().strip()
        j = json.load(open(os.path.join(out, "recovery-iperf3-client.json")))
        bps = j["end"]["sum_received"]["bits_per_second"] / 1e6
        zero = sum(1 for i in j["intervals"] if i["sum"]["bytes"] == 0)
        session = {"exit": crc, "mbit_per_s": bps, "zero_intervals": zero}
        L.append(f"iperf3 TCP session: exit {crc}, {bps:.1f} Mbit/s received, {zero} one-second intervals with no data")
        if crc != "0":
            bad.append("the TCP session broke")
    except Exception as e:
        bad.append(f"no iperf3 result ({e})")
    L.append("RESULT: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)))
    rep = {"faults": n, "restarts": hist, "iperf3": session}
    return finish(out, "recovery", "recovery-report.txt", "recovery-report.json", "\n".join(L) + "\n", rep, not bad, bad)
