"""The report of `scripts/lab --hosts N`: N guests on one segment (lab/guest/hosts).

Reads OUTDIR/hosts.env, the steps each host recorded (OUTDIR/status/hK.STEP) and their
numbers (OUTDIR/hosts/hK.facts, KEY=VALUE lines). A row per host: the segment's MTUs,
the daemon's QPN and every step's verdict; then each host's numbers; then every failure.
"""

import os

from common import finish, read, read_env, status_of, text, verdict

STEPS = ("mtu", "up", "ping4", "ping6", "ping6ll", "bcast", "mcast6", "tcp4", "tcp6", "restart", "kill", "stop")
IPV6_STEPS = ("ping6", "ping6ll", "mcast6", "tcp6")


def facts(out, role):
    f = {}
    for line in (read(os.path.join(out, "hosts", f"{role}.facts")) or "").splitlines():
        k, sep, v = line.partition("=")
        if sep:
            f[k] = v
    return f


def hosts(a):
    out = a.out
    env = read_env(os.path.join(out, "hosts.env"))
    n = int(env.get("LAB_NHOSTS") or 0)
    v6_optional = env.get("LAB_IPV6_OPTIONAL") == "1"
    roles = [f"h{k}" for k in range(1, n + 1)]
    failures = []
    build = text(os.path.join(out, "build.status"))
    if not n:
        failures.append("no hosts.env (the run did not start)")
    if not build or not build.startswith("ok"):
        failures.append(f"build: {build or 'no build status'}")

    rows = {}
    for r in roles:
        rc = text(os.path.join(out, f"{r}.rc"))
        st = {s: status_of(out, r, s) for s in STEPS}
        f = facts(out, r)
        rows[r] = {"rc": rc, "steps": st, "facts": f}
        if rc is None:
            failures.append(f"{r}: did not run (the boot exited {a.vm_rc}; see {r}.console)")
        elif rc == "124":
            failures.append(f"{r}: timed out (LAB_TIMEOUT; see {r}.log, {r}.console)")
        elif rc == "125":
            failures.append(f"{r}: lab setup failed in the guest (see {r}.log, {r}.console)")
        elif rc == "126":
            failures.append(f"{r}: stopped, the guests' link stalled (see lab-stalls.txt)")
        for s, v in st.items():
            if v == "ok":
                continue
            if v is None:
                if rc not in (None, "124", "125", "126"):
                    failures.append(f"{r} {s}: never ran")
            elif v.startswith("skipped"):
                if not (v6_optional and s in IPV6_STEPS):
                    failures.append(f"{r} {s}: {v}")
            else:
                failures.append(f"{r} {s}: {v.removeprefix('FAILED: ')}")
        if rc not in (None, "0", "124", "125", "126"):
            failures.append(f"{r}: guest script exited {rc}")

    def mark(v):
        if v == "ok":
            return "ok"
        if v is None:
            return "-"
        return "skip" if v.startswith("skipped") else "FAIL"

    f1 = rows.get("h1", {}).get("facts", {})
    L = [
        f"uipoib lab: {n} hosts on one {env.get('LAB_HOSTS_NET', '?')} segment, eth0 MTU {env.get('LAB_HOSTS_MTU', '?')} (kernel {env.get('LAB_KVER', '?')}; build: {build or '?'})",
        f"  the segment: {f1.get('eth0_sweep', '?')} (ping -M do -s SIZE h1 -> h2 over eth0 at MTU 9000); "
        f"largest IP packet carried {f1.get('segment_mtu', '?')} bytes",
        f"  IPv6 steps: {'run' if env.get('LAB_IPV6') == '1' else env.get('LAB_IPV6_WHY', '?')}",
        "",
    ]
    head = ["host", "eth0", "rxe0", "uip0", "qpn"] + list(STEPS)
    table = [head]
    for r in roles:
        f = rows[r]["facts"]
        table.append([r, f.get("eth0_mtu", "-"), (f.get("rxe_active_mtu") or "-").split()[0], f.get("uip0_mtu", "-"), f.get("qpn", "-")]
                     + [mark(rows[r]["steps"][s]) for s in STEPS])
    w = [max(len(row[i]) for row in table) for i in range(len(head))]
    for row in table:
        L.append("  " + "  ".join(c.ljust(w[i]) for i, c in enumerate(row)).rstrip())
    L.append("")
    for r in roles:
        f = rows[r]["facts"]
        parts = []
        for k in sorted(f):
            if k.startswith(("ping4_", "ping6_", "ping6ll_", "bcast_", "mcast6_", "tcp", "restart_", "kill_")):
                parts.append(f"{k}={f[k]}")
        L.append(f"  {r}: " + ("; ".join(parts) or "no numbers"))
    L.append(f"  times: {a.elapsed if a.elapsed is not None else '?'} s in all, {a.vm_elapsed if a.vm_elapsed is not None else '?'} s in the guests")
    L.append("")
    ok = not failures
    L.extend(verdict([("Failures:", failures)], ok, False))
    rep = {
        "hosts": n,
        "segment_kind": env.get("LAB_HOSTS_NET"),
        "eth0_mtu": env.get("LAB_HOSTS_MTU"),
        "vm_rc": a.vm_rc,
        "elapsed_s": a.elapsed,
        "vm_elapsed_s": a.vm_elapsed,
        "build": build,
        "ipv6": env.get("LAB_IPV6") == "1",
        "ipv6_why": env.get("LAB_IPV6_WHY") or None,
        "segment": {k: f1.get(k) for k in ("eth0_sweep", "eth0_largest_icmp_payload", "segment_mtu")},
        "rows": [{"host": r, **rows[r]} for r in roles],
    }
    return finish(out, "hosts", "hosts-report.txt", "hosts-report.json", "\n".join(L) + "\n", rep, ok, failures)
