"""The report of scripts/perf trace: where one request/response turnaround's time goes on
guest a, from an ftrace of a qperf tcp_lat ping-pong through uipoib and over eth0.

A turnaround starts at a receive interrupt of the virtio NIC (`virtio*-input`) and ends
when the reply leaves on eth0 (`net_dev_xmit dev=eth0`): through uipoib that is rxe's
packet sent by the daemon's post_send, over eth0 the kernel's TCP segment. Its time is
cut at events that must appear in a fixed order (below); a turnaround whose events do not
fit that order, or that a second receive interrupt interrupts, is skipped and counted,
never forced. The syscall numbers are x86_64's (the lab's guests).
"""

import os
import re
import statistics

from common import read, read_env, fmt, finish, guest_failures, run_head, step_failure
from perf import parse_qperf

# x86_64 syscall numbers.
SYS_READ, SYS_WRITE, SYS_IOCTL, SYS_WRITEV = 0, 1, 16, 20
SYS_SENDTO, SYS_SENDMSG, SYS_EPOLL_WAIT = 44, 46, 232
EAGAIN = -11
COMM_MAX = 15  # a Linux thread name's length (TASK_COMM_LEN - 1)

UIP_STAGES = [
    ("rx", "rxe receive (irq -> NET_RX softirq exit)"),
    ("wake", "completion event -> daemon running (TASKLET, switch, epoll_wait returns)"),
    ("chan", "completion channel reads (until EAGAIN)"),
    ("user", "daemon userspace before the TAP write"),
    ("tapw", "TAP write (writev: TCP receive, app wake-up)"),
    ("app", "application (qperf) until it sleeps (reply into the TAP)"),
    ("after", "daemon outside the app: arm, epoll_wait, TAP reads"),
    ("send", "post_send (uverbs write) -> eth0 transmit"),
]
ETH_STAGES = [
    ("rx", "NET_RX (irq -> softirq exit: TCP receive, app wake-up)"),
    ("wake", "softirq exit -> application running"),
    ("app", "application until its send"),
    ("send", "its send (write -> eth0 transmit)"),
]

# A line; with the `record-tgid` option the task's process follows its pid, "(   160)",
# or "(-------)" when not known.
LINE = re.compile(
    r"^\s*(?P<comm>.+)-(?P<pid>\d+)\s+(?:\(\s*(?P<tgid>\d+|-+)\)\s+)?\[(?P<cpu>\d+)\]\s+(?:\S+\s+)?"
    r"(?P<ts>\d+\.\d+):\s+(?P<ev>\w+):\s?(?P<rest>.*)$"
)
SWITCH = re.compile(
    r"prev_comm=(?P<prev>.*) prev_pid=(?P<prev_pid>\d+) prev_prio=\S+ prev_state=(?P<state>\S+) ==> "
    r"next_comm=(?P<next>.*) next_pid=(?P<next_pid>\d+)"
)
# Kernel threads run on the address space of the task before them (lazy TLB): a switch to
# one changes no page tables. A task with a syscall in the trace is a user task whatever
# its name; one without is a kernel thread if its name is one a lab guest runs.
KTHREAD = re.compile(
    r"^(swapper/\d+|ksoftirqd/\d+|kworker/\S+|rcu_\w+|migration/\d+|cpuhp/\d+|idle_inject/\d+|watchdog/\d+|"
    r"kthreadd|kcompactd\d+|khugepaged|kswapd\d+|oom_reaper|kauditd|khungtaskd|kdevtmpfs|irq/\S+|jbd2/\S+|"
    r"kblockd|scsi_\w+|ib-comp-\S+|ib_\w+_wq|rdma_cm|iw_cm_wq|kintegrityd|netns|mm_percpu_wq|khvcd|hwrng|"
    r"kthrotld|ipv6_addrconf|zswap\S*|writeback|blkcg_punt_bio|inet_frag_wq|ext4-rsv-conver|xfsalloc|xfs_mru_cache|"
    r"rxe_wq|ipoib_wq|krdsd)$"
)


class Ev:
    __slots__ = ("ts", "comm", "ev", "a", "b", "c")

    def __init__(self, ts, comm, ev, a=None, b=None, c=None):
        self.ts, self.comm, self.ev, self.a, self.b, self.c = ts, comm, ev, a, b, c


def parse(text):
    """(events, header facts). Events: irq (a=name), sirq_in/sirq_out (a=action), rx/tx
    (a=dev), enter (a=nr, b=first argument, c=second or None), exit (a=nr, b=return),
    switch (a=prev comm, b=prev state, c=next comm), wakeup (a=comm)."""
    evs, lost = [], None
    for line in text.splitlines():
        if line.startswith("#"):
            m = re.search(r"entries-in-buffer/entries-written: (\d+)/(\d+)", line)
            if m:
                lost = int(m.group(2)) - int(m.group(1))
            continue
        m = LINE.match(line)
        if not m:
            continue
        ts, comm, ev, rest = float(m["ts"]) * 1e6, m["comm"].strip(), m["ev"], m["rest"]
        if ev == "irq_handler_entry":
            n = re.search(r"name=(\S+)", rest)
            evs.append(Ev(ts, comm, "irq", n.group(1) if n else ""))
        elif ev in ("softirq_entry", "softirq_exit"):
            n = re.search(r"action=(\w+)", rest)
            evs.append(Ev(ts, comm, "sirq_in" if ev == "softirq_entry" else "sirq_out", n.group(1) if n else ""))
        elif ev in ("netif_receive_skb", "net_dev_xmit"):
            n = re.search(r"dev=(\S+)", rest)
            evs.append(Ev(ts, comm, "rx" if ev == "netif_receive_skb" else "tx", n.group(1) if n else ""))
        elif ev == "sys_enter":
            n = re.match(r"NR (\d+) \(([0-9a-f]+)(?:, ([0-9a-f]+))?", rest)
            if n:
                second = int(n.group(3), 16) if n.group(3) else None
                evs.append(Ev(ts, comm, "enter", int(n.group(1)), int(n.group(2), 16), second))
        elif ev == "sys_exit":
            n = re.match(r"NR (\d+) = (-?\d+)", rest)
            if n:
                evs.append(Ev(ts, comm, "exit", int(n.group(1)), int(n.group(2))))
        elif ev == "sched_switch":
            n = SWITCH.search(rest)
            if n:
                evs.append(Ev(ts, comm, "switch", n["prev"], n["state"], n["next"]))
        elif ev == "sched_wakeup":
            n = re.search(r"comm=(.*) pid=\d+", rest)
            if n:
                evs.append(Ev(ts, comm, "wakeup", n.group(1)))
    return evs, {"events": len(evs), "lost": lost}


def is_rx_irq(e):
    return e.ev == "irq" and e.a.startswith("virtio") and "-input" in e.a


class Skip(Exception):
    pass


def find(evs, i, end, pred, why):
    """The index of the first event in [i, end) that PRED accepts; Skip(WHY) if none."""
    for k in range(i, end):
        if pred(evs[k]):
            return k
    raise Skip(why)


def net_rx_exit(evs, i, end):
    """The index of the exit of the first NET_RX softirq that received on eth0, from the
    interrupt EVS[I] on (or from the NET_RX softirq the interrupt arrived in)."""
    k = i + 1
    for j in range(i - 1, max(-1, i - 200), -1):
        if evs[j].ev in ("sirq_in", "sirq_out"):
            if evs[j].ev == "sirq_in" and evs[j].a == "NET_RX":
                k = j
            break
    while True:
        k = find(evs, k, end, lambda e: e.ev == "sirq_in" and e.a == "NET_RX", "no NET_RX softirq received on eth0")
        x = find(evs, k, end, lambda e: e.ev == "sirq_out" and e.a == "NET_RX", "a NET_RX softirq without its exit")
        if any(e.ev == "rx" and e.a == "eth0" for e in evs[k:x]):
            return x
        k = x + 1


def overlap(a0, a1, b0, b1):
    return max(0.0, min(a1, b1) - max(a0, b0))


def on_cpu(evs, i, end, t0, t1, by_action=False):
    """Microseconds each task ran in [t0, t1], and "softirq": the softirqs' time, whoever
    they interrupted (hard interrupts count for the task they hit); with BY_ACTION,
    "softirq ACTION" for each kind instead."""
    cur, last, acc, soft, kind = evs[i].comm, t0, {}, None, "softirq"
    for e in evs[i:end]:
        if e.ev == "sirq_in" and soft is None:
            acc[cur] = acc.get(cur, 0.0) + e.ts - last
            soft, last = e.ts, e.ts
            kind = f"softirq {e.a}" if by_action else "softirq"
        elif e.ev == "sirq_out" and soft is not None:
            acc[kind] = acc.get(kind, 0.0) + e.ts - soft
            soft, last = None, e.ts
        elif e.ev == "switch":
            acc[e.a] = acc.get(e.a, 0.0) + e.ts - last
            cur, last = e.c, e.ts
    if soft is None:
        acc[cur] = acc.get(cur, 0.0) + t1 - last
    return acc


def idle(comm):
    return comm.startswith("swapper")


def uip_turn(evs, i, end, poller, tap, app):
    """The stages (us) of the turnaround that starts with the receive interrupt EVS[I]."""

    def mine(e):
        return e.comm == poller

    t0 = evs[i].ts
    k1 = net_rx_exit(evs, i, end)
    k2 = find(evs, k1, end, lambda e: mine(e) and e.ev == "exit" and e.a == SYS_EPOLL_WAIT, "the poller did not return from epoll_wait")
    if not any(e.ev == "wakeup" and e.a == poller for e in evs[i:k2]):
        raise Skip("the poller was busy, not woken from epoll_wait")
    k4 = find(evs, k2, end, lambda e: mine(e) and e.ev == "enter" and e.a == SYS_WRITEV, "no TAP write")
    calls = [e for e in evs[k2 + 1 : k4] if mine(e) and e.ev in ("enter", "exit")]
    if any(e.a != SYS_READ for e in calls):
        raise Skip("a syscall other than read between epoll_wait and the TAP write")
    reads = [e for e in calls if e.ev == "exit"]
    if not reads or reads[-1].b != EAGAIN:
        raise Skip("the completion channel reads did not end in EAGAIN")
    t3 = reads[-1].ts
    tap_fd = evs[k4].b
    if any(e.comm == app for e in evs[k2:k4]):
        raise Skip("the application was running already")
    kw = find(evs, k4, end, lambda e: mine(e) and e.ev == "exit" and e.a == SYS_WRITEV, "the TAP write did not return")
    ka = find(evs, k4, end, lambda e: e.ev == "switch" and e.c == app, "the application never ran")
    kz = find(evs, ka, end, lambda e: e.ev == "switch" and e.a == app and e.b.startswith(("S", "D", "I")), "the application did not sleep again")
    if not any(e.ev == "tx" and e.a == tap and e.comm == app for e in evs[ka:kz]):
        raise Skip("the application wrote no reply into the TAP")
    k7 = find(evs, max(kz, kw), end, lambda e: mine(e) and e.ev == "enter" and e.a == SYS_WRITE, "no post_send after the reply")
    if not any(mine(e) and e.ev == "enter" and e.a == SYS_READ and e.b == tap_fd for e in evs[kz:k7]):
        raise Skip("the reply was not read from the TAP before the post_send")
    k8 = find(evs, k7, end, lambda e: e.ev == "tx" and e.a == "eth0", "no eth0 transmit before the next receive interrupt")
    t1, t2, t4, tw, ta, tz, t7, t8 = (evs[k].ts for k in (k1, k2, k4, kw, ka, kz, k7, k8))
    appt = tz - ta
    tapw = (tw - t4) - overlap(t4, tw, ta, tz)
    st = dict(rx=t1 - t0, wake=t2 - t1, chan=t3 - t2, user=t4 - t3, tapw=tapw, app=appt, after=(t7 - t4) - tapw - appt, send=t8 - t7)
    after = [e for e in evs[k4:k7] if mine(e) and e.ev == "enter"]
    cpu = on_cpu(evs, i, k8 + 1, t0, t8)
    if ta < tw:
        sched = "inside"
    elif evs[ka].a == poller and evs[ka].b.startswith("R"):
        sched = "preempted"
    elif evs[ka].a == poller:
        sched = "slept"
    else:
        sched = "other"
    detail = dict(
        app_sched=sched,
        channel_reads=len(reads),
        arms=sum(1 for e in after if e.a == SYS_IOCTL),
        epoll_waits=sum(1 for e in after if e.a == SYS_EPOLL_WAIT),
        tap_reads=sum(1 for e in after if e.a == SYS_READ and e.b == tap_fd),
        softirq_us=cpu.get("softirq", 0.0),
        other_us=sum(v for c, v in cpu.items() if c not in (poller, app, "softirq") and not idle(c)),
        idle_us=sum(v for c, v in cpu.items() if idle(c)),
    )
    return t8 - t0, st, detail


def eth_turn(evs, i, end, app):
    t0 = evs[i].ts
    k1 = net_rx_exit(evs, i, end)
    if evs[k1].comm == app:
        raise Skip("the application was running already")
    ka = find(evs, k1, end, lambda e: e.ev == "switch" and e.c == app, "the application never ran")
    if not any(e.ev == "wakeup" and e.a == app for e in evs[i:ka]):
        raise Skip("the application was not woken (it was not sleeping)")
    kw = find(evs, ka, end, lambda e: e.comm == app and e.ev == "enter" and e.a in (SYS_WRITE, SYS_WRITEV, SYS_SENDTO, SYS_SENDMSG), "the application sent nothing")
    k8 = find(evs, kw, end, lambda e: e.ev == "tx" and e.a == "eth0", "no eth0 transmit before the next receive interrupt")
    t1, ta, tw, t8 = (evs[k].ts for k in (k1, ka, kw, k8))
    cpu = on_cpu(evs, i, k8 + 1, t0, t8)
    detail = dict(
        softirq_us=cpu.get("softirq", 0.0),
        other_us=sum(v for c, v in cpu.items() if c not in (app, "softirq") and not idle(c)),
        idle_us=sum(v for c, v in cpu.items() if idle(c)),
    )
    return t8 - t0, dict(rx=t1 - t0, wake=ta - t1, app=tw - ta, send=t8 - tw), detail


def turnarounds(evs, turn):
    """Every turnaround of a trace: (used: [(total, stages, detail, round trip)], skipped:
    {why: n}). A turnaround runs from a receive interrupt to the next one at most; the
    round trip is the time to that next one (a's turnaround, the wire and b's)."""
    starts = [k for k, e in enumerate(evs) if is_rx_irq(e)]
    used, skipped = [], {}
    for n, i in enumerate(starts):
        end = starts[n + 1] if n + 1 < len(starts) else len(evs)
        try:
            total, st, detail = turn(evs, i, end)
        except Skip as s:
            why = str(s)
            if n + 1 == len(starts):
                why = "the trace ends inside it"
            skipped[why] = skipped.get(why, 0) + 1
            continue
        rtt = evs[end].ts - evs[i].ts if end < len(evs) else None
        used.append((total, st, detail, rtt))
    return used, skipped


def med(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def window(out, name, role, stages, turn):
    """The analysis of one window's trace (a dict) and its text lines."""
    path = os.path.join(out, f"ft.{name}.{role}.txt")
    t = read(path)
    res = dict(file=os.path.basename(path), used=0, skipped={}, stages={}, turnaround_us=None)
    if t is None:
        return res, [f"  no trace ({os.path.basename(path)} missing)"], f"no trace of window {name}"
    evs, facts = parse(t)
    used, skipped = turnarounds(evs, turn)
    res.update(events=facts["events"], lost_events=facts["lost"], used=len(used), skipped=skipped)
    L = []
    if facts["lost"]:
        L.append(f"  WARNING: the buffer overflowed, {facts['lost']} events lost (the oldest)")
    nskip = sum(skipped.values())
    L.append(f"  turnarounds used {len(used)}, skipped {nskip}" + (": " + "; ".join(f"{v} {k}" for k, v in sorted(skipped.items(), key=lambda x: -x[1])) if skipped else ""))
    if not used:
        return res, L, f"window {name}: no turnaround fits the expected order"
    tot = med([u[0] for u in used])
    rtt = med([u[3] for u in used])
    res["turnaround_us"] = tot
    res["round_trip_us"] = rtt
    width = max(len(d) for _, d in stages)
    L.append(f"  {'stage':<{width}}  {'median us':>9}  {'share':>6}  {'mean us':>8}")
    sum_med = 0.0
    for key, desc in stages:
        xs = [u[1][key] for u in used]
        m, mean = med(xs), statistics.fmean(xs)
        share = sum(xs) / sum(u[0] for u in used)
        sum_med += m
        res["stages"][key] = dict(what=desc, median_us=m, mean_us=mean, share=share)
        L.append(f"  {desc:<{width}}  {m:9.1f}  {share * 100:5.1f}%  {mean:8.1f}")
    L.append(f"  {'turnaround (irq -> eth0 transmit)':<{width}}  {tot:9.1f}  {'100%':>6}  {statistics.fmean(u[0] for u in used):8.1f}")
    L.append(f"  (the stages' medians add up to {sum_med:.1f} us; a share is the stage's part of all used turnarounds' time)")
    if rtt:
        L.append(f"  round trip as a sees it (irq -> next irq): median {rtt:.1f} us; a's turnaround is {tot / rtt * 100:.0f}% of it")
    det = [u[2] for u in used]
    for k in ("softirq_us", "other_us", "idle_us"):
        res[k] = med([d[k] for d in det])
    L.append(
        f"  inside a turnaround, median: softirqs {res['softirq_us']:.1f} us, other tasks {res['other_us']:.1f} us, "
        f"the CPU idle {res['idle_us']:.1f} us"
    )
    if "app_sched" in det[0]:
        sched = {k: sum(1 for d in det if d["app_sched"] == k) for k in ("inside", "preempted", "slept", "other")}
        res["app_sched"] = sched
        L.append(
            f"  the application ran: inside the TAP write {sched['inside']}, when the writev returned (daemon preempted) "
            f"{sched['preempted']}, once the daemon slept {sched['slept']}, otherwise {sched['other']}"
        )
        counts = {k: med([d[k] for d in det]) for k in ("channel_reads", "arms", "epoll_waits", "tap_reads")}
        res["syscalls"] = counts
        L.append(
            "  per turnaround, median: channel reads {channel_reads:.0f}; after the TAP write: arm ioctls {arms:.0f}, "
            "epoll_waits {epoll_waits:.0f}, TAP reads {tap_reads:.0f}".format(**counts)
        )
    return res, L, None


def switch_costs(text):
    """The context switches of a trace taken with `record-tgid`: for each task woken from a
    blocking syscall (switched out asleep, then in again), the time from its switch-in to
    its syscall's return, split by whether the switch loaded another process's page tables
    (the last user task to run on that CPU was of another process) or not (kernel threads
    keep the last user task's; threads of one process share theirs). A woken task switched
    out again before its syscall returns gives no sample (counted as "cut"). Returns
    {"changed": [us...], "kept": [us...], "by_task": {(comm, changed): [us...]}, "changes":
    n, "rx_irqs": n, "cut": n} or None without process ids."""
    tgid, user, evs = {}, set(), []
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        m = LINE.match(line)
        if not m:
            continue
        pid, ev = int(m["pid"]), m["ev"]
        if m["tgid"] and m["tgid"][0].isdigit():
            tgid.setdefault(pid, int(m["tgid"]))
        if ev in ("sys_enter", "sys_exit"):
            user.add(pid)
        evs.append((float(m["ts"]) * 1e6, int(m["cpu"]), pid, ev, m["rest"]))
    if not tgid:
        return None

    def kthread(pid, comm):
        return pid == 0 or (pid not in user and bool(KTHREAD.match(comm)))

    res = {"changed": [], "kept": [], "by_task": {}, "changes": 0, "rx_irqs": 0, "cut": 0}
    # Per CPU: the process whose page tables are loaded, and the woken task awaited.
    mm, pending, slept = {}, {}, {}
    for ts, cpu, pid, ev, rest in evs:
        if ev == "irq_handler_entry" and re.search(r"name=virtio\S*-input", rest):
            res["rx_irqs"] += 1
        if ev == "sched_switch":
            n = SWITCH.search(rest)
            if pending.pop(cpu, None):
                res["cut"] += 1
            if not n:
                mm.pop(cpu, None)
                continue
            prev, nxt = int(n["prev_pid"]), int(n["next_pid"])
            slept[prev] = n["state"].startswith(("S", "D"))
            if kthread(nxt, n["next"].strip()):
                continue
            t, had = tgid.get(nxt), mm.get(cpu)
            changed = None if had is None or t is None else t != had
            if changed:
                res["changes"] += 1
            mm[cpu] = t
            if changed is not None and slept.get(nxt):
                pending[cpu] = (ts, nxt, n["next"].strip(), changed)
            continue
        p = pending.get(cpu)
        if p and pid == p[1] and ev in ("sys_exit", "sys_enter"):
            del pending[cpu]
            t0, _, comm, changed = p
            if ev == "sys_exit":
                res["changed" if changed else "kept"].append(ts - t0)
                res["by_task"].setdefault((comm, changed), []).append(ts - t0)
    return res


def parse_pipe_bench(t):
    """`perf bench sched pipe`'s microseconds per round trip, or None."""
    m = re.search(r"([\d.]+)\s+usecs/op", t or "")
    return float(m.group(1)) if m else None


def switch_section(out, env):
    """The context switches' section of the report: lines and a dict."""
    L, rep = ["context switches on a (a task woken from a blocking syscall: its switch-in to the syscall's return; per CPU)"], {}
    width = 54
    for name, label in (("uip", "through uipoib"), ("eth", "over eth0")):
        t = read(os.path.join(out, f"ft.{name}.a.txt"))
        r = switch_costs(t) if t else None
        if r is None:
            L.append(f"  window {name}: no process ids in the trace (taken without record-tgid)")
            continue
        w = rep[name] = dict(
            changed_n=len(r["changed"]), changed_median_us=med(r["changed"]), kept_n=len(r["kept"]), kept_median_us=med(r["kept"]),
            changes=r["changes"], rx_irqs=r["rx_irqs"], cut=r["cut"], by_task={},
        )
        L.append(f"  window {name} ({label}): {r['changes']} switches loaded another process's page tables, "
                 f"{r['changes'] / r['rx_irqs']:.2f} per receive interrupt" if r["rx_irqs"] else f"  window {name}: no receive interrupt")
        if r["cut"]:
            L.append(f"    ({r['cut']} woken tasks switched out again before their syscall returned: no sample)")
        for key, what in (("changed", "from a task of another process"), ("kept", "from the idle task, a kernel thread or its own process")):
            xs = r[key]
            L.append(f"    {what:<{width}} {len(xs):6d}  median {fmt(med(xs)):>7} us")
        for (comm, changed), xs in sorted(r["by_task"].items(), key=lambda x: -len(x[1])):
            if len(xs) >= 20:
                w["by_task"][f"{comm} {'changed' if changed else 'kept'}"] = dict(n=len(xs), median_us=med(xs))
                L.append(f"      {comm + (' (changed)' if changed else ' (kept)'):<{width - 2}} {len(xs):6d}  median {med(xs):7.1f} us")
    proc = parse_pipe_bench(read(os.path.join(out, "bench-pipe.process.txt")))
    thr = parse_pipe_bench(read(os.path.join(out, "bench-pipe.thread.txt")))
    loops = env.get("PERF_TRACE_PIPE_LOOPS", "?")
    if proc and thr:
        rep["pipe"] = dict(process_us=proc, thread_us=thr, per_switch_extra_us=(proc - thr) / 2, loops=loops)
        L.append(f"  untraced, perf bench sched pipe -l {loops} (two switches a round trip): between two processes "
                 f"{proc:.1f} us a round trip, between two threads {thr:.1f}")
        L.append(f"    a switch that loads another process's page tables costs {(proc - thr) / 2:.1f} us more "
                 "(QEMU's TCG drops its whole software TLB when CR3 is written)")
    else:
        L.append("  no perf bench sched pipe result (bench-pipe.*.txt)")
    return L, rep


def trace(a):
    out = a.out
    env = read_env(os.path.join(out, "trace.env"))
    tap = a.tap or env.get("PERF_TRACE_TAP") or "uip0"
    poller = ("poll-" + tap)[:COMM_MAX]
    app = "qperf"
    L, bad = [], []
    L.extend(run_head(out))
    secs = env.get("PERF_TRACE_SECONDS", "?")
    L.append(f"qperf -t {secs} -m 64 tcp_lat, b -> a; ftrace of guest a (poller thread {poller}, application {app})")
    L.append("")
    rep = {"tap": tap, "poller": poller, "windows": {}, "qperf": {}}

    # The latencies, traced and not: tracing inflates every step.
    L.append("qperf tcp_lat (one way, us)     traced  untraced  traced/untraced")
    for name, label in (("uip", "through uipoib"), ("eth", "over eth0")):
        tr = parse_qperf(read(os.path.join(out, f"qperf.{name}.traced.txt"))).get("tcp_lat")
        pl = parse_qperf(read(os.path.join(out, f"qperf.{name}.plain.txt"))).get("tcp_lat")
        rep["qperf"][name] = dict(traced_us=tr, untraced_us=pl)
        L.append(f"  {label:<28} {fmt(tr):>8}  {fmt(pl):>8}  {fmt(tr / pl if tr and pl else None, '.2f'):>15}")
        for v, what in ((tr, "traced"), (pl, "untraced")):
            if v is None:
                bad.append(f"no {what} qperf tcp_lat {label}")
    L.append("  Tracing inflates every step (each event costs time under TCG): the stages below are")
    L.append("  traced times; compare their shares, not their absolute values with the untraced latency.")
    L.append("")

    windows = (
        ("uip", f"through uipoib ({tap}): rxe receive ... daemon ... qperf ... daemon ... rxe send", UIP_STAGES, lambda e, i, n: uip_turn(e, i, n, poller, tap, app)),
        ("eth", "over eth0: the kernel's own path", ETH_STAGES, lambda e, i, n: eth_turn(e, i, n, app)),
    )
    for name, title, stages, turn in windows:
        L.append(f"window {name}, {title}")
        res, lines, err = window(out, name, "a", stages, turn)
        rep["windows"][name] = res
        L.extend(lines)
        if err:
            bad.append(err)
        L.append("")
    u, e = rep["windows"]["uip"].get("turnaround_us"), rep["windows"]["eth"].get("turnaround_us")
    if u and e:
        L.append(f"a's turnaround through uipoib / over eth0 (traced): {u / e:.2f}")
        rep["turnaround_ratio"] = u / e
    L.append("")
    lines, rep["switches"] = switch_section(out, env)
    L.extend(lines)
    L.append("")

    if a.vm_rc is not None:  # a lab run (not an analysis of existing traces)
        _, why = guest_failures(out, a.vm_rc)
        bad.extend(why)
        for step, roles in (("up", "ab"), ("ping", "ab"), ("tracefs", "ab"), ("server", "a"), ("trace-uip", "ab"), ("trace-eth", "ab"), ("plain", "ab"), ("bench", "ab"), ("stop", "ab")):
            f = step_failure(out, roles, step)
            if f:
                bad.append(f"step {step}: {f}")
    L.append("RESULT: " + ("OK" if not bad else "FAILED: " + "; ".join(bad)))
    return finish(out, "trace", "trace-report.txt", "trace-report.json", "\n".join(L) + "\n", rep, not bad, bad)


# `TUNSETCARRIER`, the ioctl that turns the TAP's carrier on as a restart ends.
TUNSETCARRIER = 0x400454E2


def announce_post(text, sup):
    """Where the announcement's post of one traced restart went (`scripts/perf recovery`
    with PERF_RECOVERY_FTRACE=1): the supervisor thread SUP posts it (a `write` on the
    uverbs descriptor: rxe sends inside it) last before it turns the carrier on. Returns
    {"total_us", "parts": {who: us}} (who: the supervisor, "softirq ACTION", another
    task's name, "idle"), and "rx": {device: packets received inside it}, or None when the
    trace has no such post."""
    evs, _ = parse(text)

    def mine(e, ev, nr):
        return e.comm == sup and e.ev == ev and e.a == nr

    kc = next((k for k, e in enumerate(evs) if mine(e, "enter", SYS_IOCTL) and e.c == TUNSETCARRIER), None)
    if kc is None:
        return None
    ke = next((k for k in range(kc - 1, -1, -1) if mine(evs[k], "enter", SYS_WRITE)), None)
    if ke is None:
        return None
    kx = next((k for k in range(ke + 1, kc) if mine(evs[k], "exit", SYS_WRITE)), None)
    if kx is None:
        return None
    t0, t1 = evs[ke].ts, evs[kx].ts
    parts, rx = {}, {}
    for who, us in on_cpu(evs, ke, kx + 1, t0, t1, by_action=True).items():
        who = "idle" if idle(who) else who
        parts[who] = parts.get(who, 0.0) + us
    for e in evs[ke:kx]:
        if e.ev == "rx":
            rx[e.a] = rx.get(e.a, 0) + 1
    return {"total_us": t1 - t0, "parts": parts, "rx": rx}


def announce_section(out, n, tap):
    """The report's lines on the traced restarts' announcement posts, and a dict."""
    sup = ("sup-" + tap)[:COMM_MAX]
    L, rows = [f"the announcement's post in each traced restart (recovery-ft.N.txt; {sup}'s write, rxe sending inside it; traced times):"], []
    for i in range(1, n + 1):
        t = read(os.path.join(out, f"recovery-ft.{i}.txt"))
        r = announce_post(t, sup) if t else None
        if r is None:
            L.append(f"  restart {i}: " + ("no trace" if t is None else "no announcement's post before the carrier in the trace"))
            continue
        rows.append(r)
        top = sorted(r["parts"].items(), key=lambda x: -x[1])
        L.append(f"  restart {i}: {r['total_us'] / 1000:6.2f} ms: " + ", ".join(f"{who} {us / 1000:.2f}" for who, us in top if us >= 10)
                 + rx_text(r))
    if rows:
        keys = sorted({k for r in rows for k in r["parts"]}, key=lambda k: -sum(r["parts"].get(k, 0.0) for r in rows))
        tot = sum(r["total_us"] for r in rows)
        L.append(f"  median {statistics.median(r['total_us'] for r in rows) / 1000:.2f} ms; shares of all: "
                 + ", ".join(f"{k} {sum(r['parts'].get(k, 0.0) for r in rows) / tot * 100:.0f}%" for k in keys[:8]))
        # NET_RX's time a packet where the post received a NAPI poll's worth of the peer's
        # (in the others NET_RX is mostly one or two packets and the transmit's own work).
        big = [r for r in rows if r["rx"].get(RX_DEV, 0) >= 10]
        pkts = sum(r["rx"][RX_DEV] for r in big)
        if pkts:
            net_rx = sum(r["parts"].get("softirq NET_RX", 0.0) for r in big)
            L.append(f"  the {len(big)} posts that received 10 or more packets on {RX_DEV}: {pkts} packets, "
                     f"NET_RX {net_rx / pkts:.0f} us a packet")
    return L, rows


RX_DEV = "eth0"  # the netdev under rxe in the lab's guests


def rx_text(r):
    """The packets received inside one post, by device (traces with netif_receive_skb)."""
    if not r["rx"]:
        return ""
    return "; packets received inside: " + ", ".join(f"{dev} {n}" for dev, n in sorted(r["rx"].items(), key=lambda x: -x[1]))
