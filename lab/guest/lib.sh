# shellcheck shell=bash
# Helpers for scripts that run inside the lab guests (source it from a guest script in
# lab/guest/:   . "$(dirname "$0")/lib.sh").
#
# The two guests coordinate over their eth0 link only:
#   lab_sync N [TIMEOUT]      rendezvous number N (0..999): returns on both guests once
#                             both reached it (a listens on TCP 47000+N, b connects); the
#                             LAB_NHOSTS guests of `scripts/lab vm hosts` meet in the
#                             shared OUTDIR instead (each writes sync/N.ROLE, then waits
#                             for all N files: the 9p share has no cache)
#   lab_wait_listen PORT [TIMEOUT] [PID]  wait until a local TCP socket listens on PORT
#                             (fails at once if process PID, the would-be server, exits)
#   lab_wait_tcp HOST PORT [TIMEOUT] wait until HOST:PORT accepts a connection (do not
#                             use against one-shot servers: the probe is a connection)
#   lab_step TEXT             print a timestamped step header
# and, for the scripts that record their steps for the host's report (lab/report.py):
#   lab_steps_init            mkdir $LAB_OUT/status; failures=0
#   ok STEP / failed STEP WHY  $LAB_OUT/status/ROLE.STEP = "ok" / "FAILED: WHY" (counted
#                             in $failures)
#   meet STEP [TIMEOUT]       the next rendezvous with the peer (both guests call it the
#                             same number of times, in the same order); a missed one fails
#                             STEP, and once the peer is lost later ones wait only briefly
#   ledger_residuals [FILE]   "recv send": the `ledger_residuals` the daemon reports in
#                             `uipoib stats --json` (FILE or stdin), posted - completed -
#                             flushed - reaped - outstanding per ring ("" without stats)
#   daemon_up UIPOIB TAP ADDR TIMEOUT LOG [ARGS...]   `uipoib up ... ARGS` in the background ($daemon), until
#                             TAP is UP with ADDR: records step "up" (or $UP_STEP); an exit
#                             before that in uipoib-ROLE.rc (or $DAEMON_RC)
#   exit_log_balanced LOG     the daemon's exit output says "ledger balanced" (every
#                             interface, none "NOT balanced")
#   daemon_stop LOG [STEP]    SIGTERM: the daemon must exit 0 and its exit log say "ledger
#                             balanced": records step STEP ("stop"), its exit in
#                             uipoib-ROLE.rc (or $DAEMON_RC)
# Environment provided by the lab (lab/guest/stage2): LAB_ROLE LAB_SELF LAB_PEER LAB_OUT
# LAB_IF LAB_RDMA_DEV.

lab_step() { printf '\n=== [%s %(%H:%M:%S)T] %s\n' "${LAB_ROLE:-?}" -1 "$*"; }

lab_sync() {
	local n=$1 timeout=${2:-180} port=$((47000 + $1))
	if [[ -n ${LAB_NHOSTS:-} ]]; then
		local end=$((SECONDS + timeout)) f
		: >"$LAB_OUT/sync/$n.$LAB_ROLE"
		while :; do
			f=("$LAB_OUT/sync/$n".*)
			((${#f[@]} < LAB_NHOSTS)) || return 0
			if ((SECONDS >= end)); then
				echo "lab_sync $n: only ${#f[@]} of $LAB_NHOSTS hosts arrived within ${timeout}s" >&2
				return 1
			fi
			sleep 0.2
		done
	elif [[ $LAB_ROLE == a ]]; then
		timeout "$timeout" busybox nc -l -p "$port" </dev/null >/dev/null || {
			echo "lab_sync $n: peer did not arrive within ${timeout}s" >&2
			return 1
		}
	else
		local end=$((SECONDS + timeout))
		until (exec 3<>"/dev/tcp/$LAB_PEER/$port") 2>/dev/null; do
			if ((SECONDS >= end)); then
				echo "lab_sync $n: peer not ready within ${timeout}s" >&2
				return 1
			fi
			sleep 0.2
		done
	fi
}

lab_wait_listen() {
	local port=$1 timeout=${2:-60} pid=${3:-}
	local end=$((SECONDS + timeout))
	until [[ -n $(ss -Htln "sport = :$port") ]]; do
		if [[ -n $pid ]] && ! kill -0 "$pid" 2>/dev/null; then
			echo "lab_wait_listen: process $pid exited before listening on port $port" >&2
			return 1
		fi
		if ((SECONDS >= end)); then
			echo "lab_wait_listen: nothing listens on port $port after ${timeout}s" >&2
			return 1
		fi
		sleep 0.1
	done
}

lab_wait_tcp() {
	local host=$1 port=$2 timeout=${3:-60}
	local end=$((SECONDS + timeout))
	until (exec 3<>"/dev/tcp/$host/$port") 2>/dev/null; do
		if ((SECONDS >= end)); then
			echo "lab_wait_tcp: $host:$port not reachable after ${timeout}s" >&2
			return 1
		fi
		sleep 0.2
	done
}

lab_steps_init() {
	mkdir -p "$LAB_OUT/status"
	failures=0
}

ok() { echo ok >"$LAB_OUT/status/$LAB_ROLE.$1"; }
failed() {
	local step=$1
	shift
	echo "FAILED: $*" >"$LAB_OUT/status/$LAB_ROLE.$step"
	echo "!!! step $step FAILED: $*"
	failures=$((${failures:-0} + 1))
}

meet_n=0
peer_lost=
meet() {
	meet_n=$((meet_n + 1))
	local t=${2:-120}
	[[ -z $peer_lost ]] || t=5
	if ! lab_sync "$meet_n" "$t"; then
		peer_lost=1
		failed "$1" "rendezvous $meet_n with the peer timed out"
	fi
}

# The counters' conservation law (older daemons had only wr_reaped, whose sends are the
# `reaped` drops).
# lab_tracefs [--tgid] EVENT...: tracefs mounted, tracing off, a 16 MB buffer and the
# events enabled (with --tgid each line also names its task's process). Status 1 if any
# of it fails.
LAB_TRACEFS=/sys/kernel/tracing
lab_tracefs() {
	local T=$LAB_TRACEFS e
	grep -qs " $T tracefs " /proc/mounts || mount -t tracefs nodev "$T" || return 1
	echo 0 >"$T/tracing_on" && echo 16384 >"$T/buffer_size_kb" || return 1
	if [[ ${1:-} == --tgid ]]; then
		echo 1 >"$T/options/record-tgid" || return 1
		shift
	fi
	for e in "$@"; do echo 1 >"$T/events/$e/enable" || return 1; done
}

ledger_residuals() {
	# The daemon computes them (iface::stats::Snapshot::residuals); this only reads them.
	jq -r '.ledger_residuals // empty | "\(.recv) \(.send)"' "$@" 2>/dev/null || true
}

# daemon_up UIPOIB TAP ADDR TIMEOUT LOG [ARGS...]: sets $daemon (empty when it is not running).
daemon_up() {
	local bin=$1 tap=$2 addr=$3 timeout=$4 log=$5 rc end state='' step=${UP_STEP:-up}
	local rcf=${DAEMON_RC:-$LAB_OUT/uipoib-$LAB_ROLE.rc}
	daemon=
	rm -f "$rcf"
	if [[ ! -x $bin ]]; then
		failed "$step" "no uipoib binary at $bin ($(cat "$LAB_OUT/build.status" 2>/dev/null || echo 'not built'))"
		return
	fi
	RUST_LOG=${RUST_LOG:-info} RUST_BACKTRACE=1 \
		"$bin" up --device "$LAB_RDMA_DEV" --tap "$tap" --addr "$addr" "${@:6}" </dev/null >"$log" 2>&1 &
	daemon=$!
	end=$((SECONDS + timeout))
	while ((SECONDS < end)); do
		if ! kill -0 "$daemon" 2>/dev/null; then
			rc=0
			wait "$daemon" || rc=$?
			echo "$rc" >"$rcf"
			daemon=
			state="daemon exited with $rc before $tap was up: $(tail -n 3 "$log" | sed 's/\x1b\[[0-9;]*m//g' | tr '\n' ' ')"
			[[ -s $log ]] || state+="(no output)"
			break
		fi
		if ip -o link show dev "$tap" 2>/dev/null | grep -q '[<,]UP[,>]'; then
			if ip -o -4 addr show dev "$tap" | grep -qF " $addr "; then
				state=up
				break
			fi
			state="$tap is up but has no address $addr after ${timeout}s"
		fi
		sleep 0.2
	done
	if [[ $state == up ]]; then
		ip -o addr show dev "$tap" || true
		ip -o link show dev "$tap" || true
		ok "$step"
	else
		failed "$step" "${state:-$tap not up within ${timeout}s}"
	fi
}

# exit_log_balanced LOG: the daemon's exit output says "ledger balanced" for every
# interface (it prints its final counters and one such line per interface).
exit_log_balanced() {
	! grep -q 'ledger NOT balanced' "$1" && grep -q '^ledger balanced' "$1"
}

daemon_stop() {
	local log=$1 step=${2:-stop} rc end rcf=${DAEMON_RC:-$LAB_OUT/uipoib-$LAB_ROLE.rc}
	if [[ -z ${daemon:-} ]]; then
		failed "$step" "no running daemon"
		return
	fi
	kill -TERM "$daemon" 2>/dev/null || true
	end=$((SECONDS + 20))
	while kill -0 "$daemon" 2>/dev/null && ((SECONDS < end)); do sleep 0.2; done
	if kill -0 "$daemon" 2>/dev/null; then
		kill -KILL "$daemon" 2>/dev/null || true
		wait "$daemon" 2>/dev/null || true
		echo killed >"$rcf"
		failed "$step" "daemon still running 20s after SIGTERM; killed"
	else
		rc=0
		wait "$daemon" || rc=$?
		echo "$rc" >"$rcf"
		if ((rc != 0)); then
			failed "$step" "daemon exited $rc (after SIGTERM)"
		elif ! exit_log_balanced "$log"; then
			failed "$step" "daemon exited 0 but its exit log does not say 'ledger balanced': $(grep -m1 '^ledger' "$log" || echo 'no ledger line')"
		else
			ok "$step"
		fi
	fi
	echo "--- daemon output (tail) ---"
	tail -n 40 "$log" || true
}
