#!/usr/bin/env python3
"""The reports of the rxe lab, built from the files a run left in its OUTDIR.

Usage: python3 lab/report KIND OUTDIR [options]   (the entry points call it)

  e2e OUTDIR [--check] [--test] [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/lab`: ib_send_bw, iperf3 over eth0 and through uipoib, ping, counters,
      the fault run and the poll-failure comparisons (compare-CASE.{json,txt}, the
      cases in LAB_COMPARE). Writes report.{txt,json}. Exit 1 if ping failed either way or a measurement is
      missing; with --check also on anything else missing or wrong (a failed step, a
      guest script that did not exit 0, missing counters, a daemon that did not exit 0
      after SIGTERM, ping loss above 0%, no TCP throughput through uipoib). --test
      (`scripts/lab test`) then asserts: ping both ways with 0% loss, TCP through uipoib
      > 0 bits/s, UDP through uipoib ran, both daemons exited 0 on SIGTERM with "ledger
      balanced" for every interface in their exit log; for each comparison: it ran and
      passed, restart recovered, every policy's ledger balanced; the comparison's own
      daemon on a started and stopped cleanly.
  hostile OUTDIR [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/lab hostile`: the rogue-QP checks (a), (b), (c). Writes
      hostile-report.{txt,json}. Exit 1 if a check failed.
  hosts OUTDIR [--vm-rc N] [--elapsed S] [--vm-elapsed S]
      `scripts/lab --hosts N`: a row per host (eth0, rxe0 and uip0 MTUs, QPN, each step's
      verdict), each host's numbers (pings, responders, TCP, follow times). Writes
      hosts-report.{txt,json}. Exit 1 if any step failed on any host (an IPv6 step that
      did not run fails unless LAB_IPV6=0), a guest did not finish or the build failed.
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
  recovery OUTDIR FAULTS [tcp|tcp-reverse|udp]
      `scripts/perf recovery`: recovery times of the injected poll failures, and what
      the load (iperf3 TCP, or UDP: datagrams lost per restart) lost over them. Writes
      recovery-report.{txt,json}. Exit 1 if the session broke, a ledger did not balance
      or a restart is missing.
  queue OUTDIR [--vm-rc N]
      `scripts/perf queue`: a TCP bulk flow's queue, sampled: a's receive CQ backlog and
      rxe's queue, b's TAP queue and socket (unacked, window, RTT), and their medians over
      the flow's second half. Writes queue-report.{txt,json}. Exit 1 if the flow or the
      samples are missing or the guests' run failed.
  trace OUTDIR [--vm-rc N] [--tap TAP]
      `scripts/perf trace`: where one request/response turnaround's time goes on guest a
      (ft.uip.a.txt, ft.eth.a.txt: ftrace of a qperf tcp_lat ping-pong through uipoib and
      over eth0), stage by stage, beside qperf's latency traced and untraced. TAP (default
      PERF_TRACE_TAP of trace.env, else uip0) names the poller thread (poll-TAP). Without
      --vm-rc it only analyses the traces. Writes trace-report.{txt,json}. Exit 1 if a
      window's trace or a qperf result is missing or no turnaround fits (with --vm-rc also
      on a failed guest step).
  cost OUTDIR [--vm-rc N]
      `scripts/perf cost`: what one full-size packet costs the receiving guest's vCPU on
      each path (eth0 dropped at ingress, eth0 to iperf3, rxe to ib_send_bw -e, uipoib to
      iperf3) at each rate, the floor a datapath over rxe to a socket pays (rxe's receive
      plus the kernel's delivery), uipoib above it, and the packet rate each cost allows
      against ib_send_bw's full rate. Writes cost-report.{txt,json}. Exit 1 if a window is
      missing or (with --vm-rc) a guest step failed.

Every JSON report has one envelope beside its own fields: "kind" (the KIND above), "ok"
(the verdict the exit status gives) and "failures" (why ok is false; empty when ok).
"""

import argparse
import sys

from faults import faults
from hosts import hosts
from lab import e2e, hostile
from perf import perf, perf_host, recovery
from ftrace import trace
from tcpqueue import queue
from cost import cost


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
    kind("hosts", hosts, times=True)
    kind("faults", faults, check=True, times=True)
    kind("perf", perf).add_argument("--vm-rc", type=int)
    kind("perf-host", perf_host).add_argument("reps", type=int)
    p = kind("recovery", recovery)
    p.add_argument("faults", type=int)
    p.add_argument("load", nargs="?", default="tcp", choices=["tcp", "tcp-reverse", "udp"])
    kind("queue", queue).add_argument("--vm-rc", type=int)
    p = kind("trace", trace)
    p.add_argument("--vm-rc", type=int)
    p.add_argument("--tap")
    kind("cost", cost).add_argument("--vm-rc", type=int)
    a = ap.parse_args()
    return a.func(a)


if __name__ == "__main__":
    sys.exit(main())
