#!/usr/bin/env python3
"""The reports of the rxe lab, built from the files a run left in its OUTDIR.

Usage: python3 lab/report.py KIND OUTDIR [options]   (the entry points call it)

  e2e OUTDIR [--check] [--test] [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/lab`: ib_send_bw, iperf3 over eth0 and through uipoib, ping, counters.
      Writes report.{txt,json}. Exit 1 if ping failed either way or a measurement is
      missing; with --check also on anything else missing or wrong (a failed step, a
      guest script that did not exit 0, missing counters, a daemon that did not exit 0
      after SIGTERM, ping loss above 0%, no TCP throughput through uipoib). --test
      (`scripts/lab test`) then asserts: ping both ways with 0% loss, TCP through uipoib
      > 0 bits/s, UDP through uipoib ran, both daemons exited 0 on SIGTERM with "ledger
      balanced" for every interface in their exit log.
  hostile OUTDIR [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/lab hostile`: the rogue-QP checks (a), (b), (c). Writes
      hostile-report.{txt,json}. Exit 1 if a check failed.
  faults OUTDIR [--check] [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/faults`: each scenario's table, then a row per injected fault (detect /
      resume / recovery ms, WRs reaped, drops, ledger, iperf3 Mbit/s before/during/after,
      pass/FAIL) and every failure. Writes faults-summary.{txt,json}. A scenario fails
      when the engine says so, when it hit its time limit, when its report is missing or
      unreadable, or when the daemon had to be repaired after it. Exit 1 if a scenario or
      a guest step failed or a guest did not finish; with --check also on a missing
      result or measurement, a failed build or boot.
  perf OUTDIR [--vm-rc N]
      `scripts/perf`: the table (per rep, median, spread, ratios, daemon cost, UDP loss,
      profiles). Writes report.{txt,json}. Exit 1 if a rep lacks a measurement.
  perf-host OUTDIR REPS
      `scripts/perf host`: uipoib sim-pair against tapcopy. Writes report.{txt,json}.
      Exit 1 if a measurement is missing.
  recovery OUTDIR FAULTS
      `scripts/perf recovery`: recovery times of the injected poll failures. Writes
      recovery-report.{txt,json}. Exit 1 if the session broke, a ledger did not balance
      or a restart is missing.

Every JSON report has one envelope beside its own fields: "kind" (the KIND above), "ok"
(the verdict the exit status gives) and "failures" (why ok is false; empty when ok).
"""

import argparse
import glob
import json
import os
import re
import statistics
import sys

MIB = 1 << 20


# ---- reading a run's files ----------------------------------------------------------


def read(path):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return None


def read_json(path):
    """(value, error): error is None, 'missing', 'empty' or the parse error."""
    t = read(path)
    if t is None:
        return None, "missing"
    if not t.strip():
        return None, "empty"
    try:
        return json.loads(t), None
    except ValueError as e:
        return None, f"not JSON ({e})"


def load(path):
    """The JSON value in PATH, or None."""
    return read_json(path)[0]


def text(path):
    """The stripped text of PATH, or None."""
    t = read(path)
    return t.strip() if t is not None else None


def read_env(path):
    """The NAME=value lines of a run's env file (quotes dropped)."""
    env = {}
    for line in (read(path) or "").splitlines():
        m = re.match(r"([A-Z_]+)=(.*)$", line)
        if m:
            env[m.group(1)] = m.group(2).strip("'\"")
    return env


def status_of(out, role, step):
    """What the guest recorded for STEP: "ok", "FAILED: why", or None (never ran)."""
    return text(os.path.join(out, "status", f"{role}.{step}"))


def steps_of(out, role):
    """Every step ROLE recorded, by name."""
    d = os.path.join(out, "status")
    names = sorted(n.split(".", 1)[1] for n in os.listdir(d) if n.startswith(role + ".")) if os.path.isdir(d) else []
    return {n: status_of(out, role, n) for n in names}


def step_failure(out, roles, step):
    """The recorded failure reason of STEP on ROLES, or None."""
    reasons = []
    for r in roles:
        s = status_of(out, r, step)
        if s is None:
            reasons.append(f"guest {r}: step '{step}' never ran")
        elif s != "ok":
            reasons.append(f"guest {r}: {s.removeprefix('FAILED: ')}")
    return "; ".join(reasons) or None


def guest_failures(out, vm_rc, timeout=None):
    """(exit codes of the guests' scripts, why a guest did not finish)."""
    rcs, why = {}, []
    for r in "ab":
        rc = text(os.path.join(out, f"{r}.rc")) or None
        rcs[r] = rc
        if rc is None:
            why.append(f"guest {r} did not run (the guests' boot exited {vm_rc}; see the messages above and {r}.console)")
        elif rc == "124":
            why.append(f"guest {r} timed out (LAB_TIMEOUT{' ' + timeout + 's' if timeout else ''}; see {r}.log, {r}.console)")
        elif rc == "125":
            why.append(f"guest {r}: lab setup failed in the guest (see {r}.log, {r}.console)")
    return rcs, why


def tail(t, n):
    if not t:
        return []
    return t.rstrip("\n").splitlines()[-n:]


def num(v):
    return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def fmt(v, spec=".1f"):
    v = num(v)
    return "-" if v is None else format(v, spec)


def ratio(a, b):
    return a / b if a is not None and b else None


# ---- tools' outputs -----------------------------------------------------------------


def parse_ping(t):
    if not t:
        return None
    m = re.search(r"(\d+) packets transmitted, (\d+) received,(?: \+(\d+) errors,)? ([\d.]+)% packet loss", t)
    if not m:
        return None
    res = {
        "transmitted": int(m.group(1)),
        "received": int(m.group(2)),
        "errors": int(m.group(3) or 0),
        "loss_percent": float(m.group(4)),
        "rtt_ms": None,
    }
    m = re.search(r"rtt min/avg/max/mdev = ([\d.]+)/([\d.]+)/([\d.]+)/([\d.]+) ms", t)
    if m:
        res["rtt_ms"] = dict(zip(("min", "avg", "max", "mdev"), map(float, m.groups())))
    return res


def parse_ib_send_bw(t):
    """(msg_size, BW average MB/s) from perftest output; perftest's MB is 2^20 bytes."""
    if not t:
        return None
    lines = t.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" in line and "BW average" in line:
            for data in lines[i + 1 :]:
                f = data.split()
                if len(f) >= 4 and f[0].isdigit():
                    try:
                        return int(f[0]), float(f[3])
                    except ValueError:
                        return None
    return None


def mb_to_mbit(mb):
    return mb * MIB * 8 / 1e6


def parse_iperf(path):
    """(result dict, error string) from an iperf3 -J client output."""
    t = read(path)
    if t is None:
        return None, "no iperf3 output"
    try:
        d = json.loads(t)
    except ValueError:
        return None, f"iperf3 output is not JSON: {t[:200]!r}"
    if d.get("error"):
        return None, f"iperf3: {d['error']}"
    end = d.get("end") or {}
    start = d.get("start") or {}
    proto = (start.get("test_start") or {}).get("protocol", "")
    res = {"protocol": proto, "blksize": (start.get("test_start") or {}).get("blksize")}
    if proto == "UDP":
        s = end.get("sum_received") or end.get("sum")
        if not s:
            return None, "iperf3 UDP output has no end summary"
        sent = end.get("sum_sent") or {}
        res.update(
            mbit_per_s=s["bits_per_second"] / 1e6,
            sender_mbit_per_s=sent.get("bits_per_second", 0) / 1e6 if sent else None,
            lost_percent=s.get("lost_percent"),
            lost_packets=s.get("lost_packets"),
            packets=s.get("packets"),
            jitter_ms=s.get("jitter_ms"),
            seconds=s.get("seconds"),
        )
    else:
        rcv = end.get("sum_received")
        snt = end.get("sum_sent") or {}
        if not rcv:
            return None, "iperf3 TCP output has no receiver summary"
        res.update(
            mbit_per_s=rcv["bits_per_second"] / 1e6,
            sender_mbit_per_s=snt.get("bits_per_second", 0) / 1e6,
            retransmits=snt.get("retransmits"),
            seconds=rcv.get("seconds"),
        )
    return res, None


def iperf_received_mbit(path):
    """The receiver's Mbit/s of an iperf3 -J output, or None."""
    try:
        return load(path)["end"]["sum_received"]["bits_per_second"] / 1e6
    except (TypeError, KeyError):
        return None


# ---- writing a report -----------------------------------------------------------------


def verdict(sections, ok, check):
    """The end of a report's text: each (title, items) section that has items, then RESULT."""
    L = []
    for title, items in sections:
        if items:
            L.append(title)
            L.extend("  - " + x for x in items)
    L.append(f"RESULT: {'OK' if ok else 'FAILED'}" + (" (check mode)" if check else ""))
    return L


def finish(out, kind, txt_name, json_name, t, rep, ok, failures):
    """Prints the text, writes it and the JSON report (with the envelope); the exit status."""
    rep = {**rep, "kind": kind, "ok": bool(ok), "failures": [] if ok else list(failures)}
    with open(os.path.join(out, txt_name), "w", encoding="utf-8") as f:
        f.write(t)
    with open(os.path.join(out, json_name), "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    sys.stdout.write(t)
    return 0 if ok else 1


# ---- e2e: scripts/lab ---------------------------------------------------------------------


def e2e(a):
    out = a.out
    env = read_env(os.path.join(out, "lab.env"))
    build = text(os.path.join(out, "build.status")) or "unknown"

    rep = {
        "config": {
            "msg_size": int(env.get("LAB_MSG_SIZE", "4096")),
            "ib_send_bw_seconds": env.get("LAB_IBBW_SECONDS"),
            "iperf_seconds": env.get("LAB_IPERF_SECONDS"),
            "udp_rate": env.get("LAB_UDP_RATE"),
            "uipoib_bin": env.get("LAB_UIPOIB_SOURCE") or env.get("LAB_UIPOIB_BIN"),
            "kernel": env.get("LAB_KVER"),
            "build": build,
        },
        "timing": {"total_s": a.elapsed, "vm_s": a.vm_elapsed},
    }
    missing = []  # measurement missing or ping failed -> exit 1
    problems = []  # only fatal with --check

    # --- the guests themselves (the cause when everything is missing) ---
    guests, why = guest_failures(out, a.vm_rc)
    missing += why

    # --- uipoib up (the cause when everything through uip0 fails) ---
    for r in "ab":
        f = step_failure(out, r, "up")
        if f:
            missing.append(f"uipoib not up: {f}")

    # --- ping ---
    rep["ping"] = {}
    for r, name, peer in (("a", "a_to_b", "198.18.1.2"), ("b", "b_to_a", "198.18.1.1")):
        p = parse_ping(read(os.path.join(out, f"ping-{r}.txt")))
        fail = step_failure(out, r, "ping")
        if p is None or p["received"] == 0:
            why = fail or "no ping output"
            rep["ping"][name] = {"status": f"FAILED: {why}", "target": peer}
            missing.append(f"ping {name.replace('_', ' ')} ({peer}): {why}")
        else:
            rep["ping"][name] = {"status": "ok" if not fail else f"FAILED: {fail}", "target": peer, **p}
            if p["loss_percent"] > 0:
                problems.append(f"ping {name.replace('_', ' ')}: {p['loss_percent']}% packet loss")
            elif fail:
                missing.append(f"ping {name.replace('_', ' ')}: {fail}")

    # --- ib_send_bw UD ---
    ib = None
    for f in ("ib_send_bw-client.txt", "ib_send_bw-server.txt"):
        ib = parse_ib_send_bw(read(os.path.join(out, f)))
        if ib:
            break
    if ib:
        rep["ib_send_bw_ud"] = {"status": "ok", "msg_size": ib[0], "MB_per_s": ib[1], "mbit_per_s": mb_to_mbit(ib[1])}
        if ib[0] != rep["config"]["msg_size"]:
            problems.append(f"ib_send_bw ran with {ib[0]}-byte messages, not {rep['config']['msg_size']}")
    else:
        why = step_failure(out, "ab", "ibsend") or "no bandwidth line in the ib_send_bw output"
        rep["ib_send_bw_ud"] = {"status": f"FAILED: {why}"}
        missing.append(f"ib_send_bw UD: {why}")

    # --- iperf3 ---
    for key, step, fname, label in (
        ("iperf3_eth0_tcp", "eth0tcp", "iperf3-eth0-tcp.json", "iperf3 TCP over eth0"),
        ("iperf3_uipoib_tcp", "uiptcp", "iperf3-uipoib-tcp.json", "iperf3 TCP through uipoib"),
        ("iperf3_uipoib_udp", "uipudp", "iperf3-uipoib-udp.json", "iperf3 UDP through uipoib"),
    ):
        res, err = parse_iperf(os.path.join(out, fname))
        if res is None:
            why = step_failure(out, "b", step) or err
            if err and why != err:
                why = f"{why} ({err})"
            rep[key] = {"status": f"FAILED: {why}"}
            missing.append(f"{label}: {why}")
        else:
            fail = step_failure(out, "ab", step)
            rep[key] = {"status": "ok", **res}
            if fail:
                problems.append(f"{label}: {fail}")
    tcp = rep["iperf3_uipoib_tcp"]
    if tcp.get("status") == "ok" and not tcp.get("mbit_per_s"):
        problems.append("iperf3 TCP through uipoib moved no data (0 bits/s)")

    # --- ratios ---
    u = rep["iperf3_uipoib_tcp"].get("mbit_per_s")
    rep["ratios"] = {
        "uipoib_tcp_over_ib_send_bw_ud": ratio(u, rep["ib_send_bw_ud"].get("mbit_per_s")),
        "uipoib_tcp_over_eth0_tcp": ratio(u, rep["iperf3_eth0_tcp"].get("mbit_per_s")),
    }

    # --- daemons ---
    rep["daemons"] = {}
    for r in "ab":
        d = {}
        stats_text = read(os.path.join(out, f"uipoib-stats-{r}.json"))
        stats = None
        if stats_text and stats_text.strip():
            try:
                stats = json.loads(stats_text)
            except ValueError:
                d["stats_raw"] = stats_text[:2000]
        d["stats"] = stats
        sfail = step_failure(out, r, "stats")
        if stats is not None and not sfail:
            d["stats_status"] = "ok"
        else:
            why = sfail or ("stats output is not JSON" if stats_text else "no stats output")
            d["stats_status"] = f"FAILED: {why}"
            missing.append(f"uipoib counters of guest {r}: {why}")
        d["exit_code"] = text(os.path.join(out, f"uipoib-{r}.rc"))
        d["stop_status"] = status_of(out, r, "stop")
        d["up_status"] = status_of(out, r, "up")
        d["log_tail"] = tail(read(os.path.join(out, f"uipoib-{r}.log")), 15)
        if d["exit_code"] != "0":
            problems.append(f"uipoib daemon on guest {r}: exit code {d['exit_code'] or 'unknown'} ({d['stop_status'] or 'not stopped'})")
        rep["daemons"][r] = d

    # --- steps and guests ---
    steps = ("ibsend", "eth0tcp", "up", "ping", "uiptcp", "uipudp", "stats", "stop")
    rep["steps"] = {r: {s: status_of(out, r, s) for s in steps} for r in "ab"}
    rep["guests"] = guests
    for r in "ab":
        if guests[r] != "0":
            problems.append(f"guest {r} script exit code {guests[r] or 'missing'} (see {r}.log)")
    if not build.startswith("ok"):
        problems.append(f"build: {build}")
    if a.vm_rc not in (None, 0):
        problems.append(f"the guests' boot exited {a.vm_rc}")
    for r in "ab":
        for s, v in rep["steps"][r].items():
            if v is not None and v != "ok":
                reason = v.removeprefix("FAILED: ")
                if not any(reason in p for p in problems + missing):
                    problems.append(f"step {s} on guest {r}: {reason}")

    rep["missing"] = missing
    rep["problems"] = problems
    rep["ok"] = not missing and (not a.check or not problems)
    rep["mode"] = "check" if a.check else "report"

    # --- text ---
    L = []
    c = rep["config"]
    L.append("uipoib rxe lab report")
    L.append("=" * 72)
    L.append(f"kernel {c['kernel']}; msg size {c['msg_size']}; iperf3 {c['iperf_seconds']}s; UDP rate {c['udp_rate']}")
    L.append(f"uipoib binary: {c['uipoib_bin']} (build: {build})")
    if a.elapsed is not None:
        L.append(f"time: {a.elapsed:.0f}s total, {fmt(a.vm_elapsed, '.0f')}s in the guests")
    L.append("(absolute numbers are TCG-emulation bound; compare ratios within one run)")
    L.append("")
    L.append("uipoib up:  " + "   ".join(f"{r}: {rep['steps'][r]['up'] or 'never ran'}" for r in "ab"))
    L.append("")
    L.append("ping over uip0 (198.18.1.x)")
    for name in ("a_to_b", "b_to_a"):
        p = rep["ping"][name]
        if "loss_percent" in p:
            rtt = p.get("rtt_ms") or {}
            L.append(
                f"  {name.replace('_', ' '):7s} {p['received']}/{p['transmitted']} received, {p['loss_percent']:g}% loss, "
                f"rtt min/avg/max {fmt(rtt.get('min'), '.2f')}/{fmt(rtt.get('avg'), '.2f')}/{fmt(rtt.get('max'), '.2f')} ms"
                + ("" if p["status"] == "ok" else f"  [{p['status']}]")
            )
        else:
            L.append(f"  {name.replace('_', ' '):7s} {p['status']}")
    L.append("")
    ibr = rep["ib_send_bw_ud"]
    if ibr["status"] == "ok":
        L.append(f"ib_send_bw -c UD -s {ibr['msg_size']}:   {ibr['MB_per_s']:.2f} MB/s (MiB/s) = {ibr['mbit_per_s']:.1f} Mbit/s")
    else:
        L.append(f"ib_send_bw -c UD:   {ibr['status']}")
    for key, label in (
        ("iperf3_eth0_tcp", "iperf3 TCP over eth0:   "),
        ("iperf3_uipoib_tcp", "iperf3 TCP via uipoib:  "),
        ("iperf3_uipoib_udp", "iperf3 UDP via uipoib:  "),
    ):
        r = rep[key]
        if r["status"] != "ok":
            L.append(f"{label}{r['status']}")
        elif r.get("protocol") == "UDP":
            L.append(
                f"{label}{r['mbit_per_s']:.1f} Mbit/s received (sent {fmt(r.get('sender_mbit_per_s'))}), "
                f"loss {fmt(r.get('lost_percent'), '.2f')}% ({r.get('lost_packets')}/{r.get('packets')}), "
                f"jitter {fmt(r.get('jitter_ms'), '.3f')} ms, {r.get('blksize')}-byte datagrams"
            )
        else:
            L.append(
                f"{label}{r['mbit_per_s']:.1f} Mbit/s received (sent {fmt(r.get('sender_mbit_per_s'))}, "
                f"{r.get('retransmits')} retransmits)"
            )
    L.append("")
    rr = rep["ratios"]
    L.append(f"ratio uipoib TCP / ib_send_bw UD:  {fmt(rr['uipoib_tcp_over_ib_send_bw_ud'], '.3f')}")
    L.append(f"ratio uipoib TCP / eth0 TCP:       {fmt(rr['uipoib_tcp_over_eth0_tcp'], '.3f')}")
    L.append("")
    for r in "ab":
        d = rep["daemons"][r]
        L.append(f"daemon {r}: up {d['up_status'] or '-'}; exit code after SIGTERM {d['exit_code'] or '-'} ({d['stop_status'] or '-'})")
        if d["stats"] is not None:
            L.append("  counters: " + json.dumps(d["stats"], sort_keys=True))
        else:
            L.append(f"  counters: {d['stats_status']}")
        if d["log_tail"]:
            L.append("  output (tail):")
            L.extend("    " + x for x in d["log_tail"][-8:])
    L.append("")
    L += verdict([("MISSING / FAILED:", missing), ("CHECK FAILED:" if a.check else "other problems:", problems)],
                 rep["ok"], a.check)
    t = "\n".join(L) + "\n"
    failures = missing + (problems if a.check else [])
    if a.test:
        lines, test_failures = e2e_assert(out, rep)
        t += "\n".join(lines) + "\n"
        rep["test"] = {"ok": not test_failures, "failures": test_failures}
        if not rep["ok"]:
            test_failures.append("the lab run failed (see the report above)")
        failures = failures + test_failures
    return finish(out, "e2e", "report.txt", "report.json", t, rep, not failures, failures)


def e2e_assert(out, rep):
    """`scripts/lab test`'s assertions on the report: (text lines, the failed ones)."""
    L = ["", "lab test assertions (" + os.path.join(out, "report.json") + "):"]
    bad = []

    def check(ok, what, detail):
        L.append(f"  {'PASS' if ok else 'FAIL'}  {what}: {detail}")
        if not ok:
            bad.append(f"{what}: {detail}")

    for name, label in (("a_to_b", "ping a -> b over uip0"), ("b_to_a", "ping b -> a over uip0")):
        p = rep.get("ping", {}).get(name, {})
        loss = p.get("loss_percent")
        check(loss == 0 and p.get("received", 0) > 0, label + " with 0% loss",
              f"{p.get('received')}/{p.get('transmitted')} received, {loss}% loss" if loss is not None else p.get("status"))
    t = rep.get("iperf3_uipoib_tcp", {})
    check((t.get("mbit_per_s") or 0) > 0, "iperf3 TCP through uipoib > 0 bits/s",
          f"{t['mbit_per_s']:.2f} Mbit/s" if t.get("mbit_per_s") is not None else t.get("status"))
    u = rep.get("iperf3_uipoib_udp", {})
    check(u.get("status") == "ok" and u.get("mbit_per_s") is not None, "iperf3 UDP through uipoib ran",
          f"{u['mbit_per_s']:.2f} Mbit/s, {u.get('lost_percent')}% loss" if u.get("mbit_per_s") is not None else u.get("status"))
    for r in "ab":
        rc = text(os.path.join(out, f"uipoib-{r}.rc")) or ""
        check(rc == "0", f"daemon {r} exited 0 on SIGTERM", f"exit {rc or 'unknown'}")
        log = read(os.path.join(out, f"uipoib-{r}.log")) or ""
        lines = [x for x in log.splitlines() if x.startswith(("ledger balanced", "ledger NOT balanced"))]
        check(bool(lines) and all(x == "ledger balanced" for x in lines),
              f"daemon {r}'s exit log says 'ledger balanced' (every interface)",
              "; ".join(lines) or f"no ledger line in uipoib-{r}.log")
    if not rep.get("ok"):
        L.append("  FAIL  the lab run failed (see the report above)")
    L.append("lab test: " + ("PASSED" if not bad and rep.get("ok") else "FAILED"))
    return L, bad


# ---- hostile: scripts/lab hostile -----------------------------------------------------------


def hostile(a):
    out = a.out
    env = read_env(os.path.join(out, "hostile.env"))
    margin = float(env.get("LAB_HOSTILE_LOSS_MARGIN", "2"))
    rss_limit = int(env.get("LAB_HOSTILE_RSS_LIMIT_KIB", "1024"))
    arp_count = int(env.get("LAB_HOSTILE_ARP_COUNT", "80000"))
    rogue_rate = env.get("LAB_HOSTILE_ROGUE_RATE")
    udp_rate, udp_len, udp_secs = env.get("LAB_HOSTILE_UDP_RATE"), env.get("LAB_HOSTILE_UDP_LEN"), env.get("LAB_HOSTILE_UDP_SECONDS")
    arp_rate = env.get("LAB_HOSTILE_ARP_RATE")

    def ld(name):
        return load(os.path.join(out, name))

    def tx(name):
        return text(os.path.join(out, name))

    def delta(before, after, key):
        b, af = ld(before), ld(after)
        if not isinstance(b, dict) or not isinstance(af, dict) or key not in af or key not in b:
            return None
        return af[key] - b[key]

    def udp(name):
        # The loss is what the receiver did not get of what the sender sent (bytes, as
        # iperf3's end.sum_sent / end.sum_received say). iperf3's own lost_percent counts
        # sequence gaps only: a stream that stops arriving altogether shows 0% there.
        j = ld(f"hostile-{name}-iperf3.json")
        end = j.get("end", {}) if isinstance(j, dict) else {}
        sent, recv = end.get("sum_sent", {}), end.get("sum_received", {})
        lost = None
        if sent.get("bytes") and "bytes" in recv:
            lost = max(0.0, 100.0 * (1 - recv["bytes"] / sent["bytes"]))
        r = {
            "lost_percent": lost,
            "sent_packets": sent.get("packets"),
            "received_packets": recv.get("packets"),
            "sent_bytes": sent.get("bytes"),
            "received_bytes": recv.get("bytes"),
            "iperf3_gap_lost_percent": recv.get("lost_percent"),
            "mbit_per_s": recv["bits_per_second"] / 1e6 if "bits_per_second" in recv else None,
            "error": j.get("error") if isinstance(j, dict) else "no iperf3 output",
        }
        for role in "ab":
            for key in ("neigh_updated", "neigh_learned", "rx_packets", "tx_packets", "arp_rx"):
                r[f"{role}_{key}"] = delta(f"hostile-{name}-before-stats-{role}.json", f"hostile-{name}-after-stats-{role}.json", key)
        return r

    checks = []

    def check(ok, what, detail):
        checks.append({"ok": bool(ok), "what": what, "detail": detail})

    st_a, st_b = ld("hostile-status-a.json") or {}, ld("hostile-status-b.json") or {}
    base, rog = udp("udp-base"), udp("udp-rogue")
    ri = ld("hostile-rogue-ipv4.json") or {}
    rep = {
        "vm_rc": a.vm_rc,
        "elapsed_s": a.elapsed,
        "vm_elapsed_s": a.vm_elapsed,
        "build": tx("build.status"),
        "daemon_a": {"qpn": st_a.get("qpn"), "gid": st_a.get("gid")},
        "daemon_b": {"qpn": st_b.get("qpn"), "gid": st_b.get("gid")},
        "udp": {"rate": udp_rate, "len": int(udp_len or 0), "seconds": int(udp_secs or 0), "without_rogue": base, "with_rogue": rog},
        "rogue_ipv4": ri,
    }

    # (a)
    lb, lr = base["lost_percent"], rog["lost_percent"]
    rogue_ran = ri.get("send_ok") is not None and ri.get("requested") and ri["send_ok"] >= 0.9 * ri["requested"]
    check(rogue_ran and ri.get("qpn") not in (None, st_b.get("qpn")) and ri.get("gid") == st_b.get("gid"),
          "(a) rogue QP at b's GID, not b's daemon's QPN, sent IPv4 to a's daemon",
          f"rogue qpn {ri.get('qpn')} gid {ri.get('gid')} (b's daemon: qpn {st_b.get('qpn')} gid {st_b.get('gid')}); "
          f"{ri.get('send_ok')}/{ri.get('requested')} sends completed at {rogue_rate}/s"
          + (f"; {ri.get('error')}" if ri.get("error") else ""))
    if lb is None or lr is None:
        check(False, "(a) UDP a -> b loss with the rogue <= without + margin",
              f"no loss figure (without: {base['error'] or lb}, with: {rog['error'] or lr})")
    else:
        check(lr <= lb + margin, f"(a) UDP a -> b loss with the rogue <= without + {margin:g} points",
              f"without {lb:.2f}% ({base['received_packets']}/{base['sent_packets']} datagrams received), "
              f"with {lr:.2f}% ({rog['received_packets']}/{rog['sent_packets']}); a's neigh_updated +{rog['a_neigh_updated']} "
              f"(without: +{base['a_neigh_updated']}); a's packets the rogue QP received: {ri.get('rx_ipv4')} IPv4, "
              f"{ri.get('rx_arp')} ARP")

    # (b)
    fa = ld("hostile-arp-a.json") or {}
    ra = ld("hostile-rogue-arp.json") or {}
    before, after = "hostile-arp-before-stats-a.json", "hostile-arp-after-stats-a.json"
    # Delivered: receives a's daemon completed during the flood (whatever it then did with
    # them: counted as ARP, dropped under a reason); arp_rx shown alongside.
    delivered = delta(before, after, "recv_completed")
    arp_rx = delta(before, after, "arp_rx")
    r0, r1 = fa.get("rss_before_kib"), fa.get("rss_after_kib")
    growth = r1 - r0 if isinstance(r0, int) and isinstance(r1, int) else None
    af = ld(after) or {}
    bf = ld(before) or {}
    rep["arp_flood"] = {
        "count": arp_count, "rate": int(arp_rate or 0), "rogue": ra, "delivered_recv_completed": delivered,
        "a_arp_rx": arp_rx, "rss_before_kib": r0, "rss_after_kib": r1, "rss_growth_kib": growth,
        "a_neigh_entries": af.get("neigh_entries"),
        "a_neigh_learned": delta(before, after, "neigh_learned"),
        "a_neigh_updated": delta(before, after, "neigh_updated"),
        "a_drops_after": af.get("drops"), "a_drops_before": bf.get("drops"),
        "ping_rc": fa.get("ping_rc"), "ping_seconds": fa.get("ping_seconds"),
        "ping": tx("hostile-ping-after-arp.txt"),
    }
    check(delivered is not None and delivered >= 0.9 * arp_count,
          f"(b) the flood reached a's daemon (receives completed >= 90% of {arp_count})",
          f"recv_completed +{delivered}, arp_rx +{arp_rx}; rogue: {ra.get('send_ok')}/{ra.get('requested')} sends completed, "
          f"{ra.get('completed_rate', 0):.0f}/s" + (f"; {ra.get('error')}" if ra.get("error") else ""))
    check(growth is not None and growth < rss_limit, f"(b) a's daemon VmRSS grew < {rss_limit} KiB",
          f"{r0} -> {r1} kB ({'+' if (growth or 0) >= 0 else ''}{growth} KiB)" if growth is not None else "no VmRSS figures")
    ping_lines = [x for x in (tx("hostile-ping-after-arp.txt") or "").splitlines() if "packet loss" in x]
    check(fa.get("ping_rc") == 0, "(b) ping -c 3 -w 30 a -> b over uip0 works after the flood",
          f"exit {fa.get('ping_rc')} after {fa.get('ping_seconds')}s: {ping_lines[0] if ping_lines else 'no summary'}")

    # (c) and the steps
    steps = {}
    for role in "ab":
        rcv = tx(f"uipoib-{role}.rc")
        stop = status_of(out, role, "stop")
        final = status_of(out, role, "final")
        check(rcv == "0" and stop == "ok", f"(c) daemon {role} exited 0 on SIGTERM with 'ledger balanced'",
              f"exit {rcv}; {stop or 'no stop step'}")
        check(final == "ok", f"(c) daemon {role}'s counters balance at rest", final or "no final step")
        steps.update({f"{role}.{k}": v for k, v in steps_of(out, role).items()})
    bad_steps = {k: v for k, v in steps.items() if v != "ok"}
    check(not bad_steps and a.vm_rc == 0, "every guest step ran",
          "; ".join(f"{k}: {v}" for k, v in bad_steps.items()) or f"guests exit {tx('a.rc')}/{tx('b.rc')}")
    rep["steps"] = steps
    rep["checks"] = checks
    rep["passed"] = all(c["ok"] for c in checks)

    arp = rep["arp_flood"]
    L = [
        "uipoib hostile-peer lab (real rdma_rxe, two QEMU guests)",
        f"  daemon a (victim): qpn {st_a.get('qpn')} gid {st_a.get('gid')}; daemon b: qpn {st_b.get('qpn')} gid {st_b.get('gid')}",
        f"  UDP a -> b: iperf3 -u -b {udp_rate} -l {udp_len} -t {udp_secs}",
        f"    without rogue: loss {fmt(lb, '.2f')}% ({base['received_packets']}/{base['sent_packets']} datagrams received), "
        f"{fmt(base['mbit_per_s'], '.2f')} Mbit/s received; "
        f"a neigh_updated +{base['a_neigh_updated']}, b neigh_updated +{base['b_neigh_updated']}",
        f"    with rogue ({rogue_rate}/s IPv4 from qpn {ri.get('qpn')}): loss {fmt(lr, '.2f')}% "
        f"({rog['received_packets']}/{rog['sent_packets']} datagrams received), {fmt(rog['mbit_per_s'], '.2f')} Mbit/s received; "
        f"a neigh_updated +{rog['a_neigh_updated']}, b neigh_updated +{rog['b_neigh_updated']}; "
        f"rogue received {ri.get('rx_ipv4')} IPv4 + {ri.get('rx_arp')} ARP meant for b",
        f"  ARP flood: {ra.get('posted')}/{arp_count} requests posted at {arp_rate}/s, {ra.get('send_ok')} completed "
        f"({ra.get('completed_rate', 0):.0f}/s); a recv_completed +{delivered}, arp_rx +{arp_rx}, neigh_learned +{arp['a_neigh_learned']}, "
        f"neigh_updated +{arp['a_neigh_updated']}, neigh_entries {af.get('neigh_entries')}",
        f"    a's daemon VmRSS {r0} -> {r1} kB (growth {growth} KiB); ping after: exit {fa.get('ping_rc')} in {fa.get('ping_seconds')}s",
        f"  elapsed {fmt(a.elapsed, '.0f')}s (guests {fmt(a.vm_elapsed, '.0f')}s)",
        "checks:",
    ]
    L += [f"  {'PASS' if c['ok'] else 'FAIL'}  {c['what']}: {c['detail']}" for c in checks]
    L.append("lab hostile: " + ("PASSED" if rep["passed"] else "FAILED"))
    t = "\n".join(L) + "\n"
    failures = [f"{c['what']}: {c['detail']}" for c in checks if not c["ok"]]
    return finish(out, "hostile", "hostile-report.txt", "hostile-report.json", t, rep, rep["passed"], failures)


# ---- faults: scripts/faults ---------------------------------------------------------------

def trio(d):
    d = d if isinstance(d, dict) else {}
    return "/".join(fmt(d.get(k), ".1f") for k in ("before", "during", "after"))


def drops_text(d):
    if not isinstance(d, dict) or not d:
        return "-"
    items = [(k, v) for k, v in d.items() if num(v)]
    return ",".join(f"{k}={v}" for k, v in sorted(items)) if items else "0"


def clip(s, n):
    return s if len(s) <= n else s[: n - 1] + "…"


def faults(a):
    out = a.out
    F = os.path.join(out, "faults")

    env = read_env(os.path.join(out, "faults.env"))
    build = text(os.path.join(out, "build.status")) or "unknown"
    scen_list = []
    for line in (read(os.path.join(out, "scenarios", "list")) or "").splitlines():
        if line.strip():
            n, _, rest = line.partition(" ")
            _, _, src = rest.partition(" ")
            scen_list.append((n, src))
    if not scen_list:
        scen_list = [(n, None) for n in env.get("FAULTS_SCENARIOS", "").split()]

    failures = []  # -> exit 1
    missing = []  # -> exit 1 with --check
    problems = []  # -> exit 1 with --check

    # --- guests ---
    guests, why = guest_failures(out, a.vm_rc, env.get("LAB_TIMEOUT"))
    failures += why

    steps = {}
    for r in "ab":
        steps[r] = steps_of(out, r)
        for n, v in steps[r].items():
            if v != "ok":
                failures.append(f"guest {r}, step {n}: {v.removeprefix('FAILED: ')}")
        for n in ("up", "ping", "final", "stop"):
            if n not in steps[r] and guests[r] is not None:
                failures.append(f"guest {r}, step {n}: never ran (see {r}.log)")

    # --- scenarios ---
    scenarios = []
    rows = []
    for name, src in scen_list:
        base = os.path.join(F, name)
        s = {"scenario": name, "source": src}
        sfail = []  # this scenario's failures
        rep, err = read_json(base + ".json")
        harness, herr = read_json(base + ".harness.json")
        peer, _ = read_json(base + ".peer.json")
        rc_text = (read(base + ".rc") or "").strip()
        rc = int(rc_text) if rc_text.lstrip("-").isdigit() else None
        s["rc"] = rc
        s["text"] = read(base + ".txt")
        log = read(base + ".log") or ""
        s["log_tail"] = log.splitlines()[-8:]
        s["harness"] = harness
        s["peer"] = peer
        s["report"] = rep
        ran = rc is not None
        if not ran:
            sfail.append("did not run (the lab did not get there)")
        else:
            if harness and harness.get("timed_out"):
                sfail.append(f"killed after the time limit ({harness.get('timeout_s')}s; exit {rc})")
            elif rc == 2:
                sfail.append("invalid scenario or usage (uipoib fault run exited 2): " + ("; ".join(s["log_tail"][-3:]) or "no output"))
            elif rc not in (0, 1):
                sfail.append(f"uipoib fault run exited {rc}: " + ("; ".join(s["log_tail"][-3:]) or "no output"))
            if rep is None:
                msg = f"no JSON report ({err}: faults/{name}.json)"
                if rc == 0:
                    sfail.append(msg)
                else:
                    missing.append(f"{name}: {msg}")
            if harness is None:
                missing.append(f"{name}: the harness's record ({herr}: faults/{name}.harness.json)")
        if isinstance(rep, dict):
            passed = rep.get("passed")
            for x in rep.get("failures") or []:
                sfail.append(str(x))
            if rc == 0 and passed is not True:
                sfail.append(f"exit 0 but the report says passed={passed}")
            if rc == 1 and passed is True:
                sfail.append("the report says passed but uipoib fault run exited 1")
            if rc == 1 and not rep.get("failures"):
                sfail.append("uipoib fault run exited 1 without naming a failure: " + ("; ".join(s["log_tail"][-3:]) or "no output"))
            for e in rep.get("checks") or []:
                if isinstance(e, dict) and e.get("ok") is False and not any(str(e.get("what")) in x for x in sfail):
                    sfail.append(f"at the end: expected {e.get('what')}: {e.get('detail')}")
            traffic = rep.get("traffic") if isinstance(rep.get("traffic"), dict) else {}
            iperf_load = "iperf3" in str(traffic.get("command") or "")
            faults = rep.get("faults") if isinstance(rep.get("faults"), list) else []
            if not faults:
                missing.append(f"{name}: the report lists no fault")
            for f in faults:
                if not isinstance(f, dict):
                    continue
                label = str(f.get("label") or f.get("fault") or "?")
                if isinstance(rep.get("repeat"), int) and rep["repeat"] > 1 and f.get("iteration") is not None:
                    label += f" #{f['iteration']}"  # the round of a repeating scenario
                exps = f.get("expectations") if isinstance(f.get("expectations"), list) else []
                for e in exps:
                    if isinstance(e, dict) and e.get("ok") is False:
                        line = f"{label}: expected {e.get('what')}: {e.get('detail')}"
                        # the engine usually lists these in failures already
                        if not any(str(e.get("what")) in x for x in sfail):
                            sfail.append(line)
                if f.get("passed") is False and not any(isinstance(e, dict) and e.get("ok") is False for e in exps):
                    sfail.append(f"{label}: failed")
                # measurements every fault of a passing scenario should have: the
                # detection time when it caused a restart, iperf3's rate before it
                restarts = f.get("restarts") if isinstance(f.get("restarts"), int) else 0
                if restarts > 0 and num(f.get("detect_ms")) is None:
                    missing.append(f"{name}/{label}: detect_ms (restarts {restarts})")
                ip = f.get("iperf3_mbps") if isinstance(f.get("iperf3_mbps"), dict) else {}
                if iperf_load and num(ip.get("before")) is None:
                    missing.append(f"{name}/{label}: iperf3 Mbit/s before the fault")
                rows.append(
                    {
                        "scenario": name,
                        "fault": f.get("fault"),
                        "label": label,
                        "detect_ms": num(f.get("detect_ms")),
                        "resume_ms": num(f.get("resume_ms")),
                        "recovery_ms": num(f.get("recovery_ms")),
                        "restarts": f.get("restarts"),
                        "causes": f.get("causes"),
                        "wr_reaped": f.get("wr_reaped"),
                        "drops": f.get("drops"),
                        "ledger_balanced": f.get("ledger_balanced"),
                        "iperf3_mbps": f.get("iperf3_mbps"),
                        "throughput_mbps": f.get("throughput_mbps"),
                        "passed": f.get("passed") is True,
                    }
                )
        for who, h in (("b", harness), ("a", peer)):
            if isinstance(h, dict):
                for x in h.get("repairs") or []:
                    sfail.append(f"left behind on {who}: {x}")
        s["failures"] = sfail
        s["passed"] = ran and not sfail
        if not any(r["scenario"] == name for r in rows):
            rows.append({"scenario": name, "fault": None, "label": "-", "passed": False, "no_faults": True})
        for r in rows:
            if r["scenario"] == name and not s["passed"]:
                r["scenario_failed"] = True
        failures.extend(f"{name}: {x}" for x in sfail)
        scenarios.append(s)

    # --- daemons at the end ---
    daemons = {}
    for r in "ab":
        st, _ = read_json(os.path.join(out, f"faults-final-status-{r}.json"))
        logs = sorted(n for n in os.listdir(out) if re.fullmatch(rf"uipoib-{r}\.\d+\.log", n)) if os.path.isdir(out) else []
        rcs = {n: (read(os.path.join(out, n[:-4] + ".rc")) or "").strip() or None for n in logs}
        daemons[r] = {
            "final_step": steps.get(r, {}).get("final"),
            "stop_step": steps.get(r, {}).get("stop"),
            "restarts": (st or {}).get("restarts") if isinstance(st, dict) else None,
            "daemons_started": len(logs),
            "exit_codes": rcs,
        }

    if not build.startswith("ok"):
        problems.append(f"build: {build}")
    if a.vm_rc not in (None, 0):
        problems.append(f"the guests' boot exited {a.vm_rc}")

    ok = not failures and (not a.check or (not missing and not problems))

    # --- text ---
    L = ["uipoib rxe lab: fault scenarios (uipoib fault run), iperf3 TCP b -> a over uip0", "=" * 100]
    L.append(f"kernel {env.get('LAB_KVER')}; uipoib binary: {env.get('LAB_UIPOIB_SOURCE')} (build: {build})")
    L.append(
        f"{len(scen_list)} scenario(s), time limits {env.get('FAULTS_LIMITS')} s"
        + (f"; {a.elapsed:.0f}s total, {fmt(a.vm_elapsed, '.0f')}s in the guests" if a.elapsed is not None else "")
    )
    for s in scenarios:
        h = s["harness"] or {}
        L.append("")
        L.append(
            f"--- {s['scenario']}: exit {s['rc'] if s['rc'] is not None else '-'}"
            f", {fmt((h.get('elapsed_ms') or 0) / 1000 if h else None, '.0f')} s"
            f"{', TIMED OUT' if h.get('timed_out') else ''}; {'passed' if s['passed'] else 'FAILED'}"
        )
        if s["text"] and s["text"].strip():
            L.append(s["text"].rstrip("\n"))
        elif s["rc"] is not None:
            L.append(f"(no table on stdout; last lines of faults/{s['scenario']}.log:)")
            L.extend("  " + x for x in s["log_tail"])
    L.append("")
    L.append("=" * 100)
    L.append("summary (times in ms; iperf3 in Mbit/s before/during/after the fault)")
    hdr = (
        f"{'scenario':<17} {'fault':<22} {'detect':>7} {'resume':>7} {'recovery':>8} {'WRs':>6} "
        f"{'drops':<32} {'ledger':>6} {'iperf3 b/d/a':>17} {'result':>6}"
    )
    L.append(hdr)
    L.append("-" * len(hdr))
    for r in rows:
        if r.get("no_faults"):
            L.append(f"{r['scenario']:<17.17} {'(no result)':<22} {'':<{len(hdr) - 48}} {'FAIL':>6}")
            continue
        led = {True: "ok", False: "BAD"}.get(r.get("ledger_balanced"), "-")
        res = "pass" if r["passed"] and not r.get("scenario_failed") else "FAIL"
        if r["passed"] and r.get("scenario_failed"):
            res = "(FAIL)"  # this fault met its expectations, its scenario did not pass
        label = str(r.get("label") or r.get("fault"))
        L.append(
            f"{r['scenario']:<17.17} {label:<22.22} {fmt(r.get('detect_ms'), '.0f'):>7} {fmt(r.get('resume_ms'), '.0f'):>7} "
            f"{fmt(r.get('recovery_ms'), '.0f'):>8} {fmt(r.get('wr_reaped'), '.0f'):>6} {clip(drops_text(r.get('drops')), 32):<32} "
            f"{led:>6} {trio(r.get('iperf3_mbps')):>17} {res:>6}"
        )
    L.append("")
    npass = sum(1 for s in scenarios if s["passed"])
    L.append(f"scenarios: {npass} of {len(scenarios)} passed" + (f"; failed: {', '.join(s['scenario'] for s in scenarios if not s['passed'])}" if npass < len(scenarios) else ""))
    for r in "ab":
        dm = daemons[r]
        L.append(
            f"daemon {r}: {dm['daemons_started']} started; counters at rest: {dm['final_step'] or '-'}; "
            f"restarts {dm['restarts']}; exit after SIGTERM: {dm['stop_step'] or '-'}"
        )
    L.append("")
    L += verdict(
        [
            ("FAILED:", failures),
            ("MISSING:" if a.check else "missing (fatal with --check):", missing),
            ("CHECK FAILED:" if a.check else "other problems (fatal with --check):", problems),
        ],
        ok,
        a.check,
    )
    t = "\n".join(L) + "\n"

    summary = {
        "config": {k: env.get(k) for k in sorted(env)},
        "build": build,
        "timing": {"total_s": a.elapsed, "vm_s": a.vm_elapsed},
        "scenarios": [
            {k: s[k] for k in ("scenario", "source", "rc", "passed", "failures", "harness", "peer", "report")} for s in scenarios
        ],
        "faults": rows,
        "daemons": daemons,
        "steps": steps,
        "guests": guests,
        "missing": missing,
        "problems": problems,
        "mode": "check" if a.check else "report",
    }
    why = failures + ([f"missing: {x}" for x in missing] + problems if a.check else [])
    return finish(out, "faults", "faults-summary.txt", "faults-summary.json", t, summary, ok, why)


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


# ---- the command line -----------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="The reports of the rxe lab (see this file's head).")
    sub = ap.add_subparsers(dest="kind", required=True)

    def kind(name, func, check=False, times=False):
        p = sub.add_parser(name)
        p.set_defaults(func=func)
        p.add_argument("out")
        if check:
            p.add_argument("--check", action="store_true")
        if times:
            p.add_argument("--vm-rc", type=int)
            p.add_argument("--elapsed", type=float)
            p.add_argument("--vm-elapsed", type=float)
        return p

    kind("e2e", e2e, check=True, times=True).add_argument("--test", action="store_true")
    kind("hostile", hostile, times=True)
    kind("faults", faults, check=True, times=True)
    kind("perf", perf).add_argument("--vm-rc", type=int)
    kind("perf-host", perf_host).add_argument("reps", type=int)
    kind("recovery", recovery).add_argument("faults", type=int)
    a = ap.parse_args()
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
