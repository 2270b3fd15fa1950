"""The report of `scripts/perf cost`: what one full-size packet costs the receiving guest's
vCPU on each path, at the same packet rates, and what that leaves for the lossless-UDP
target.

Each window's vCPU time is its wall time less the idle time the guest's kernel counted
(/proc/stat's idle + iowait: measured at every idle entry and exit, not sampled): the busy
columns are sampled at the timer tick, which a load paced every millisecond can alias."""

import os
import statistics

from common import read, read_json, finish, fmt, guest_failures, perftest_row, run_head, steps_of

PATHS = (
    ("eth0drop", "eth0, dropped at its ingress (virtio's receive)"),
    ("eth0", "eth0 to iperf3 (the kernel's own path)"),
    ("rxe", "rxe to ib_send_bw -e (a verbs receiver)"),
    ("uip", "uipoib to iperf3"),
    ("uipbatch", "uipoib to iperf3 at SCHED_BATCH"),
    ("uipnice", "uipoib, its daemon at nice -10"),
)


def counters(path):
    """The counters file of one end of a window: {wall, idle (s), eth0_rx, rxe_rcvd,
    uip0_rx, daemon (s of CPU)}; None if missing or unreadable."""
    t = read(path)
    if t is None:
        return None
    r = {}
    try:
        for line in t.splitlines():
            k, _, v = line.partition(" ")
            v = v.strip()
            if k == "wall":
                r["wall"] = float(v)
            elif k == "cpu":
                f = [int(x) for x in v.split()]
                r["idle_ticks"] = f[3] + f[4]
            elif k in ("eth0_rx", "rxe_rcvd", "uip0_rx", "ctxt"):
                r[k] = int(v)
            elif k == "daemon" and v:
                f = v.split()
                # /proc/PID/stat after the command's ")": utime and stime are the 12th
                # and 13th fields (14 and 15 of the whole line).
                r["daemon_ticks"] = int(f[11]) + int(f[12])
    except (ValueError, IndexError):
        return None
    return r if {"wall", "idle_ticks", "eth0_rx"} <= r.keys() else None


def window(out, tag, role, hz):
    """{wall, busy, eth0_rx, rxe_rcvd, uip0_rx, daemon} over one window, or None."""
    b = counters(os.path.join(out, "raw", f"{tag}.begin.{role}"))
    e = counters(os.path.join(out, "raw", f"{tag}.end.{role}"))
    if not b or not e:
        return None
    wall = e["wall"] - b["wall"]
    if wall <= 0:
        return None
    w = {"wall": wall, "busy": wall - (e["idle_ticks"] - b["idle_ticks"]) / hz}
    for k in ("eth0_rx", "rxe_rcvd", "uip0_rx", "ctxt", "daemon_ticks"):
        if k in b and k in e:
            w[k] = e[k] - b[k]
    if "daemon_ticks" in w:
        w["daemon"] = w.pop("daemon_ticks") / hz
    return w


def setup(out):
    s = {}
    for line in (read(os.path.join(out, "raw", "setup.txt")) or "").splitlines():
        k, _, v = line.partition(" ")
        s[k] = v.strip()
    return s


def sent(out, tag, path):
    """What b sent in the window: iperf3's datagrams, or ib_send_bw's messages."""
    if path == "rxe":
        f = perftest_row(read(os.path.join(out, "raw", f"{tag}.out.b")), "#iterations", 2)
        return int(f[1]) if f else None
    j, _ = read_json(os.path.join(out, "raw", f"{tag}.out.b"))
    try:
        return int(j["end"]["sum_sent"]["packets"])
    except (TypeError, KeyError, ValueError):
        return None


def delivered(out, tag, path, w):
    """What reached the receiving application: iperf3's count, or rxe's receive count."""
    if path == "rxe":
        return w.get("rxe_rcvd")
    if path == "eth0drop":
        return 0
    j, _ = read_json(os.path.join(out, "raw", f"{tag}.out.b"))
    try:
        return int(j["end"]["sum_received"]["packets"])
    except (TypeError, KeyError, ValueError):
        return None


def full_rate(out, rep):
    """The rep's full-speed ib_send_bw message rate as a's receiver counted it (1/s)."""
    f = perftest_row(read(os.path.join(out, "raw", f"r{rep}.ibbw.out.a")), "MsgRate", 5)
    try:
        return float(f[4]) * 1e6 if f else None
    except ValueError:
        return None


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def spread(xs, spec):
    xs = [x for x in xs if x is not None]
    return f"{min(xs):{spec}}-{max(xs):{spec}}" if xs else "-"


def cost(a):
    out = a.out
    L, bad = [], []
    L.extend(run_head(out))
    s = setup(out)
    try:
        hz = int(s.get("clk_tck", "100"))
        reps = sorted({int(n[1:].split(".")[0]) for n in os.listdir(os.path.join(out, "raw"))
                       if n.startswith("r") and ".ibbw.begin." in n})
    except (OSError, ValueError):
        hz, reps = 100, []
    paths = s.get("paths", "eth0drop eth0 rxe uip").split()
    udp_len = int(s["udp_len"]) if s.get("udp_len", "").isdigit() else None
    L.append(f"b sends, a receives; packets of {s.get('msg', '?')} bytes (IPoIB), UDP datagrams of "
             f"{s.get('udp_len', '?')} bytes; windows of {s.get('seconds', '?')} s; rates {s.get('rates', '?')}")
    L.append("a's vCPU time per packet = (window's busy time - the idle window's busy share x its length)")
    L.append("/ packets that reached a's eth0; busy = wall - the kernel's idle time.")
    L.append("")
    rep_json = {"reps": {}, "setup": s}
    if not reps:
        bad.append("no rep's windows in raw/")

    # Per rep: the idle share, the full rate, and each path at each rate.
    rows = {}  # (path, rate key) -> list of per-rep dicts
    idle_share = []
    fulls = []
    for rep in reps:
        rr = {}
        iw = window(out, f"r{rep}.idle", "a", hz)
        if not iw:
            bad.append(f"rep {rep}: no idle window")
            continue
        base = iw["busy"] / iw["wall"]
        idle_share.append(base)
        full = full_rate(out, rep)
        fulls.append(full)
        rr["idle_busy_share"] = base
        rr["full_msg_rate"] = full
        rates = (read(os.path.join(out, "raw", f"r{rep}.rates.a")) or "").split()
        for i, rate in enumerate(rates):
            key = "target" if (s.get("rates", "").split() + [""] * 9)[i] == "target" else rate
            for path, _ in PATHS:
                tag = f"r{rep}.{path}.{rate}"
                w = window(out, tag, "a", hz)
                if not w:
                    if path in paths:
                        bad.append(f"rep {rep}: window {path} at {rate}/s missing")
                    continue
                n = w["eth0_rx"]
                if n <= 0:
                    bad.append(f"rep {rep}: no packet reached a's eth0 in {path} at {rate}/s")
                    continue
                busy = w["busy"] - base * w["wall"]
                d = {
                    "rate": int(rate),
                    "busy_share": w["busy"] / w["wall"],
                    "us_per_packet": 1e6 * busy / n,
                    "arrived": n,
                    "sent": sent(out, tag, path),
                    "delivered": delivered(out, tag, path, w),
                    "incomplete": os.path.exists(os.path.join(out, "raw", f"{tag}.incomplete")),
                }
                if "ctxt" in w:
                    d["switches_per_packet"] = w["ctxt"] / n
                if path.startswith("uip") and "daemon" in w:
                    d["daemon_us_per_packet"] = 1e6 * w["daemon"] / n
                rr[f"{path}.{rate}"] = d
                rows.setdefault((path, key), []).append(d)
        rep_json["reps"][rep] = rr

    full = med(fulls)
    L.append(f"ib_send_bw -c UD at full speed (a's receiver): {fmt(full, '.0f')} messages/s "
             f"(reps: {', '.join(fmt(x, '.0f') for x in fulls) or '-'}); a's idle vCPU busy "
             f"{fmt(100 * med(idle_share) if idle_share else None)}%")
    L.append("")
    keys = []
    for rate in s.get("rates", "").split():
        keys.append(rate)
    summary = {}
    for key in keys:
        per = {p: rows.get((p, key), []) for p, _ in PATHS}
        if not any(per.values()):
            continue
        rates = sorted({d["rate"] for ds in per.values() for d in ds})
        title = f"at {key if key != 'target' else 'the target rate'}"
        if key == "target":
            title += f" ({s.get('target', '0.8')} x each rep's full rate: {', '.join(map(str, rates))}/s)"
        else:
            title += " packets/s"
        L.append(title)
        L.append(f"  {'path':<44} {'us/packet':>9} {'spread':>13} {'vCPU busy':>9} {'lost %':>7} {'switches':>8}")
        m = {}
        for path, label in PATHS:
            ds = per[path]
            us = [d["us_per_packet"] for d in ds]
            sh = [d["busy_share"] for d in ds]
            lost = []
            for d in ds:
                if path == "eth0drop" or not d["sent"]:
                    continue
                got = d["delivered"] if d["delivered"] is not None else d["arrived"]
                lost.append(100.0 * max(0, d["sent"] - got) / d["sent"])
            if not ds:
                continue
            sw = med([d.get("switches_per_packet") for d in ds])
            m[path] = {"us": med(us), "busy": med(sh), "lost": med(lost), "switches": sw}
            inc = sum(1 for d in ds if d["incomplete"])
            note = f"  ({inc} rep(s): the receiver missed messages)" if inc else ""
            L.append(f"  {label:<44} {fmt(med(us)):>9} {spread(us, '.0f'):>13} "
                     f"{fmt(100 * med(sh) if sh else None):>8}% {fmt(med(lost), '.2f'):>7} {fmt(sw, '.2f'):>8}{note}")
            if path.startswith("uip"):
                du = med([d.get("daemon_us_per_packet") for d in ds])
                L.append(f"    of it in the daemon's own threads (user + its syscalls): {fmt(du)} us")
                m[path]["daemon_us"] = du
        L.append("  (switches: the guest's context switches per packet)")
        v, e, r, u = (m.get(p, {}).get("us") for p in ("eth0drop", "eth0", "rxe", "uip"))
        if None not in (v, e, r, u):
            k = e - v
            floor = r + k
            L.append(f"  the kernel's delivery above the NIC (eth0 - eth0drop):   {k:7.1f} us")
            L.append(f"  floor: rxe to a verbs receiver + that delivery:          {floor:7.1f} us")
            L.append(f"  uipoib above the floor:                                  {u - floor:7.1f} us "
                     f"({100 * (u - floor) / u:.0f}% of its {u:.1f})")
            res = {"k_us": k, "floor_us": floor, "uip_us": u, "above_floor_us": u - floor}
            bv, be, br = (m[p]["busy"] for p in ("eth0drop", "eth0", "rxe"))
            if None not in (bv, be, br):
                fb = br + be - bv
                res["floor_busy_share"] = fb
                L.append(f"  a's vCPU the floor needs at this rate (rxe + eth0 - eth0drop busy): {100 * fb:.0f}%"
                         f"{'  > 100%: no datapath over rxe to a socket carries this rate on this vCPU' if fb > 1 else ''}")
            if full and udp_len:
                base = med(idle_share) or 0.0
                for name, c in (("floor", floor), ("uipoib", u)):
                    cap = (1 - base) / (c * 1e-6)
                    res[f"{name}_capacity_per_s"] = cap
                    L.append(f"  packets/s a's vCPU could take at the {name}'s cost: {cap:7.0f} = "
                             f"{cap / full:.2f} x ib_send_bw's full rate")
            ub = m.get("uipbatch", {}).get("us")
            if ub is not None:
                res["uipbatch_us"] = ub
                L.append(f"  uipoib with iperf3 at SCHED_BATCH (its wake-up does not preempt the daemon's TAP write): "
                         f"{ub:.1f} us, {ub / u:.2f} x")
            un = m.get("uipnice", {}).get("us")
            if un is not None:
                res["uipnice_us"] = un
                L.append(f"  uipoib with its daemon at nice -10 (the same, from the daemon's side): {un:.1f} us, {un / u:.2f} x")
            summary[key] = res
        L.append("")
    rep_json["summary"] = summary

    # The profiles, when the run took them.
    prof = {}
    pw = window(out, "prof.strace", "a", hz)
    st = read(os.path.join(out, "raw", "prof.strace.prof.a"))
    if st and pw and pw["eth0_rx"] > 0:
        n = pw["eth0_rx"]
        L.append(f"the daemon's system calls through uipoib ({n} packets reached a's eth0; strace -c -f, which slows it):")
        L.append(f"  {'calls/packet':>12} {'errors/packet':>13}  syscall")
        calls = {}
        for line in st.splitlines():
            f = line.split()
            if len(f) >= 5 and f[0].replace(".", "").isdigit() and f[-1] not in ("total",):
                try:
                    c = int(f[3])
                    e = int(f[4]) if len(f) == 6 else 0
                except ValueError:
                    continue
                calls[f[-1]] = (c, e)
        for name, (c, e) in sorted(calls.items(), key=lambda x: -x[1][0]):
            if c / n >= 0.01:
                L.append(f"  {c / n:12.2f} {e / n:13.2f}  {name}")
        prof["syscalls_per_packet"] = {k: v[0] / n for k, v in calls.items()}
        L.append("")
    for tag, what in (("prof.uip", "through uipoib to iperf3"), ("prof.rxe", "rxe to ib_send_bw -e")):
        t = read(os.path.join(out, "raw", f"{tag}.perf-report.a"))
        if not t:
            continue
        rows = [x for x in t.splitlines() if not x.startswith("#") and "%" in x][:25]
        L.append(f"a's vCPU {what} (perf record -a, cpu-clock; the top symbols, share of all samples):")
        L.extend("  " + " ".join(x.split()) for x in rows)
        prof[tag] = rows
        L.append("")
    rep_json["profile"] = prof
    rep_json["full_msg_rate"] = full

    if a.vm_rc is not None:
        _, why = guest_failures(out, a.vm_rc)
        bad.extend(why)
        for role in "ab":
            for step, st in steps_of(out, role).items():
                if st != "ok":
                    bad.append(f"{role}: step {step}: {st}")
    L.append("RESULT: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)))
    return finish(out, "cost", "cost-report.txt", "cost-report.json", "\n".join(L) + "\n", rep_json, not bad, bad)
