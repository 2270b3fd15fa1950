"""The report of scripts/faults: every scenario's table, one row per injected fault."""

import os
import re

from common import (
    read,
    read_json,
    text,
    read_env,
    steps_of,
    guest_failures,
    num,
    fmt,
    verdict,
    finish,
)


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
