"""What every report of the lab reads and writes: a run's files, the tools' outputs, the
report's text and its JSON envelope."""

import json
import os
import re
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
        m = re.match(r"([A-Z][A-Z0-9_]*)=(.*)$", line)
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
        elif rc == "126":
            why.append(f"guest {r} was stopped: the guests' link stalled in the last boot allowed (see lab-stalls.txt)")
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


def perftest_row(t, column, fields):
    """The fields of perftest's result row (at least `fields` of them, the message size
    first) under its header line naming `column`, or None."""
    if not t:
        return None
    lines = t.splitlines()
    for i, line in enumerate(lines):
        if "#bytes" in line and column in line:
            for data in lines[i + 1 :]:
                f = data.split()
                if len(f) >= fields and f[0].isdigit():
                    return f
    return None


def parse_ib_send_bw(t):
    """(msg_size, BW average MB/s) from perftest output; perftest's MB is 2^20 bytes."""
    f = perftest_row(t, "BW average", 4)
    try:
        return (int(f[0]), float(f[3])) if f else None
    except ValueError:
        return None


def ib_send_bw_received(server_text, client_text):
    """ib_send_bw's rate as (msg_size, received MB/s, sent MB/s or None, sender_stands_in),
    or None without a rate. UD has no flow control: the rate is what the receiver (the
    server) counted; the sender's also counts what a dropping link (the lab's bridge)
    never delivered. perftest's server sometimes ends a -D run with "0.00" after thousands
    of iterations, which is no rate: the sender's then stands in (on the default socket
    link nothing is dropped), and the caller says so."""
    ib, sent = parse_ib_send_bw(server_text), parse_ib_send_bw(client_text)
    sent_mb = sent[1] if sent and sent[1] > 0 else None
    if ib and ib[1] > 0:
        return ib[0], ib[1], sent_mb, False
    if sent_mb is not None:
        return sent[0], sent_mb, sent_mb, True
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


def run_head(out):
    """The lines scripts/perf writes to OUT/run.txt before a boot (the binary, its commit,
    the host, the guests and their link), which every perf-family report starts with."""
    return (read(os.path.join(out, "run.txt")) or "").splitlines()


def lab_stalls(out):
    """The boots of this run stopped for a stalled link (lab/lib.sh writes lab-stalls.txt:
    a guest's eth0 transmit queue timed out, the emulation's fault), one line each."""
    try:
        # newline="": a CR copied from the guest's serial console is not a line break.
        with open(os.path.join(out, "lab-stalls.txt"), encoding="utf-8", errors="replace", newline="") as f:
            t = f.read().replace("\r", "")
    except OSError:
        return []
    return [x for x in t.split("\n") if x.strip()]


def host_cpu(out):
    """Where the host's CPU time went over the run's boot (lab/lib.sh writes
    host-cpu.txt from /proc/stat): {cpus, secs, busy_pct, steal_pct, idle_pct}, or None.
    Steal is time the hypervisor gave to other machines: the guests' emulation ran
    slower by about that share."""
    e = read_env(os.path.join(out, "host-cpu.txt"))
    keys = {"cpus": "HOST_CPUS", "secs": "HOST_CPU_SECS", "busy_pct": "HOST_CPU_BUSY_PCT",
            "steal_pct": "HOST_CPU_STEAL_PCT", "idle_pct": "HOST_CPU_IDLE_PCT"}
    try:
        return {k: float(e[v]) for k, v in keys.items()}
    except (KeyError, ValueError):
        return None


def host_cpu_text(h):
    return (f"host CPU over the boot ({h['cpus']:.0f} cores, {h['secs']:.0f} s): {h['busy_pct']:.1f}% busy, "
            f"{h['steal_pct']:.1f}% stolen by the hypervisor (the guests ran slower by about that share), "
            f"{h['idle_pct']:.1f}% idle")


def finish(out, kind, txt_name, json_name, t, rep, ok, failures):
    """Prints the text, writes it and the JSON report (with the envelope); the exit status.
    A run whose boots were repeated after a stalled link says so before its verdict, and
    every report says where the host's CPU time went during the boot (host_cpu)."""
    stalls = lab_stalls(out)
    cpu = host_cpu(out)
    notes = [f"lab: {x}" for x in stalls] + ([f"lab: {host_cpu_text(cpu)}"] if cpu else [])
    if notes:
        note = "".join(f"{x}\n" for x in notes)
        lines = t.splitlines(keepends=True)
        at = next((i for i in range(len(lines) - 1, -1, -1) if lines[i].startswith("RESULT:")), len(lines))
        t = "".join(lines[:at]) + note + "".join(lines[at:])
    rep = {**rep, "kind": kind, "ok": bool(ok), "failures": [] if ok else list(failures), "lab_stalls": stalls,
           "host_cpu": cpu}
    with open(os.path.join(out, txt_name), "w", encoding="utf-8") as f:
        f.write(t)
    with open(os.path.join(out, json_name), "w", encoding="utf-8") as f:
        json.dump(rep, f, indent=2, sort_keys=True, default=str)
        f.write("\n")
    sys.stdout.write(t)
    return 0 if ok else 1
