# shellcheck shell=bash
# Helpers for scripts that run inside the lab guests (source it from a guest script:
#   . "$(dirname "$0")/lab-guest-lib.sh"   or   . /abs/path/scripts/lab-guest-lib.sh).
#
# The two guests coordinate over their eth0 link only:
#   lab_sync N [TIMEOUT]      rendezvous number N (0..999): returns on both guests once
#                             both reached it (a listens on TCP 47000+N, b connects)
#   lab_wait_listen PORT [TIMEOUT] [PID]  wait until a local TCP socket listens on PORT
#                             (fails at once if process PID, the would-be server, exits)
#   lab_wait_tcp HOST PORT [TIMEOUT] wait until HOST:PORT accepts a connection (do not
#                             use against one-shot servers: the probe is a connection)
#   lab_step TEXT             print a timestamped step header
# Environment provided by the lab (lab-guest-stage2): LAB_ROLE LAB_SELF LAB_PEER LAB_OUT
# LAB_IF LAB_RDMA_DEV.

lab_step() { printf '\n=== [%s %(%H:%M:%S)T] %s\n' "${LAB_ROLE:-?}" -1 "$*"; }

lab_sync() {
	local n=$1 timeout=${2:-180} port=$((47000 + $1))
	if [[ $LAB_ROLE == a ]]; then
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
