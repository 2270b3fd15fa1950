# shellcheck shell=bash
# The rxe lab's host library, sourced by every lab entry point (scripts/lab, scripts/faults,
# scripts/perf). The guests' side is in lab/guest/.
#
# Host side only. What it provides:
#   lab_log / lab_die              messages on stderr
#   lab_ensure_pkgs PKG...         install the Debian packages that are missing
#   lab_kernel                     fetch + cache Debian's stock kernel; sets LAB_KVER, LAB_VMLINUZ
#   lab_initramfs                  build + cache the guests' initramfs; sets LAB_INITRD
#   lab_free_port                  a free TCP port on 127.0.0.1
#   lab_vm_run OUTDIR SCRIPT_A SCRIPT_B   boot the two guests (the body of `scripts/lab vm run`)
#   lab_guests OUTDIR SCRIPT_A SCRIPT_B   the same in a process of its own
#   lab_vm_hosts OUTDIR N SCRIPT   boot N guests (h1..hN) on one segment (a bridge or a vde
#                                  switch), SCRIPT on each (the body of `scripts/lab vm hosts`)
#   lab_guests_hosts OUTDIR N SCRIPT      the same in a process of its own
#   lab_target_dir                 cargo's target directory of the repo
#   lab_cargo_build LOG ARGS...    cargo build ARGS at the repo root; prints ok / FAILED: why
#   lab_uipoib_build OUTDIR BUILD  the uipoib binary's build step (LAB_UIPOIB_SOURCE, _STATUS)
#   lab_uipoib OUTDIR BUILD        the same, recorded in OUTDIR/build.status and staged
#   lab_stage_bin OUTDIR NAME PATH STATUS  the guests' private copy of a binary
#   lab_guest_kver                 the kernel's name for a report ("unavailable" if none)
#   lab_report KIND ARGS...        python3 lab/report KIND ARGS...
#
# Environment:
#   UIPOIB_LAB_CACHE  cache dir for kernel + initramfs (default /var/cache/uipoib-lab)
#   LAB_KVER          kernel ABI to use, e.g. 6.1.0-57-amd64 (default: what linux-image-amd64 depends on)
#   LAB_TIMEOUT       seconds to wait for both guests (default 600)
#   LAB_MEM           MiB of RAM per guest (default 1024)
#   LAB_SMP           vCPUs per guest (default 1)
#   LAB_MAXCPUS       QEMU's maxcpus per guest (default: unset, QEMU's own: LAB_SMP); 2
#                     with one vCPU makes TCG keep the guest's memory barriers, which QEMU
#                     7.2 elides when maxcpus is 1 (docs/RXE-LAB.md, "The link stall")
#   LAB_KERNEL_ARGS   more guest kernel parameters, space-separated name or name=value
#                     (default none; e.g. init_on_alloc=0: docs/RXE-LAB.md, "Zeroing on
#                     allocation")
#   LAB_LINK          the two guests' link: socket (default: QEMU's socket netdev over
#                     loopback, which pushes back instead of dropping, as a lossless RoCE
#                     fabric does) or bridge (a Linux bridge and their two TAPs in a network
#                     namespace of the run's own, as lab_vm_hosts's: it drops when a guest
#                     falls behind; docs/RXE-LAB.md)
#   LAB_STALL_RETRIES how many times lab_vm_run boots the two guests again after a boot
#                     whose link stalled (a guest's NETDEV WATCHDOG, or the TRANSMIT
#                     STALL of its lab/guest/txwatch; default 4); each
#                     boot has the whole LAB_TIMEOUT
#   LAB_LINK_QUICKACK the socket link only: 0 (default: the host's namespace, where the
#                     link holds a small frame for the peer's delayed ACK) or 1 (their
#                     QEMUs in a network namespace whose loopback acknowledges every
#                     segment at once)
#   LAB_NAPI_NICE     unset (default): each guest's eth0 does its receive work (its NAPI
#                     poll, and rxe's receive inside it) in softirq context, the kernel's
#                     default, where it also runs inside any syscall that re-enables bottom
#                     halves; a nice level (-20..19): in kernel threads (threaded NAPI,
#                     /sys/class/net/eth0/threaded) at that level (docs/RXE-LAB.md)
#   LAB_HOSTS_NET     the segment of lab_vm_hosts: bridge (default: a Linux bridge and one TAP
#                     per guest in a network namespace of the run's own) or vde (a vde switch)
#   LAB_HOSTS_MTU     eth0's MTU there (default 9000 on the bridge; 1500 on vde, which
#                     carries no larger frame, docs/RXE-LAB.md)

LAB_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
LAB_GUEST_DIR=$LAB_DIR/guest
# shellcheck disable=SC2034 # used by the scripts that source this file
LAB_REPO_ROOT=$(cd "$LAB_DIR/.." && pwd)
# shellcheck disable=SC2034 # the entry points
LAB_SCRIPTS_DIR=$LAB_REPO_ROOT/scripts
LAB_CACHE=${UIPOIB_LAB_CACHE:-/var/cache/uipoib-lab}

# Packages the VM runner needs on the host (their binaries also run inside the guests).
LAB_VM_PKGS=(qemu-system-x86 busybox-static rdma-core ibverbs-utils perftest iperf3 procps
	iproute2 iputils-ping kmod util-linux coreutils gzip)
# ... and what lab_vm_hosts needs besides: the switch.
LAB_HOSTS_PKGS=(vde2)

# Modules loaded by lab/guest/init (their dependencies are pulled in automatically).
# tcp_diag: `ss -ti` shows per-connection byte counters (scripts/lab-guest-faults).
# sch_tbf: the held-packets scenario holds eth0's packets in a `tc ... tbf` queue.
LAB_GUEST_MODULES=(crc32_generic virtio_pci virtio_net virtio_rng 9pnet_virtio 9p overlay tun
	rdma_rxe ib_uverbs rdma_ucm tcp_diag sch_tbf)
# LAB_GUEST_EXTRA_MODULES (space-separated, exported by a job that needs them) adds
# modules for that job alone, so every other job boots the same initramfs as before
# (scripts/perf cost: sch_ingress cls_u32 act_gact, for its ingress drop on eth0).
lab__guest_modules() {
	local extra=${LAB_GUEST_EXTRA_MODULES:-}
	[[ $extra =~ ^[a-z0-9_\ -]*$ ]] || lab_die "LAB_GUEST_EXTRA_MODULES holds module names, not '$extra'"
	# shellcheck disable=SC2206 # names, split on purpose
	GUEST_MODULES=("${LAB_GUEST_MODULES[@]}" $extra)
}

# Bump when the initramfs layout changes in a way the hashed inputs do not show.
LAB_INITRAMFS_FORMAT=1

LAB__PIDS=() # QEMU processes of this run
LAB__SWITCH_PIDS=() # vde switches of this run (stopped after the guests)
LAB__NETNS=()       # network namespaces of this run (the bridge's deleted after its guests, the socket link's on exit)
LAB__QEMU_PREFIX=() # what QEMU runs under (ip netns exec NS: the bridge's, or the socket link's)
LAB__TMPS=() # temporary directories of this run

lab__cleanup() {
	lab__kill_guests
	lab__kill_switches
	if ((${#LAB__TMPS[@]})); then
		rm -rf "${LAB__TMPS[@]}"
		LAB__TMPS=()
	fi
}
# Every script sourcing this file stops its guests and removes its temporary files on
# exit, Ctrl-C or SIGTERM.
trap 'lab__cleanup' EXIT
trap 'lab_log "interrupted; cleaning up"; lab__cleanup; exit 130' INT
trap 'lab_log "terminated; cleaning up"; lab__cleanup; exit 143' TERM

lab_log() { printf '[lab %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
lab_die() {
	printf '[lab] ERROR: %s\n' "$*" >&2
	exit 1
}

lab_pkg_installed() {
	[[ $(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null) == installed ]]
}

# lab_ensure_pkgs PKG... : apt-get install the ones not installed (apt-get update first).
lab_ensure_pkgs() {
	local p missing=()
	for p in "$@"; do
		lab_pkg_installed "$p" || missing+=("$p")
	done
	((${#missing[@]} == 0)) && return 0
	[[ $EUID -eq 0 ]] || lab_die "missing packages (${missing[*]}) and not root to install them"
	lab_log "installing missing packages: ${missing[*]}"
	export DEBIAN_FRONTEND=noninteractive
	apt-get -q -o DPkg::Lock::Timeout=300 update >&2 || lab_log "apt-get update failed; trying the install anyway"
	apt-get -q -y -o DPkg::Lock::Timeout=300 install --no-install-recommends "${missing[@]}" >&2 ||
		lab_die "apt-get install ${missing[*]} failed"
}

# Holds an exclusive lock on the cache while a command runs (builds are shared by
# everyone using the same cache dir).
lab_with_cache_lock() {
	mkdir -p "$LAB_CACHE"
	local fd
	exec {fd}>"$LAB_CACHE/.lock"
	flock "$fd"
	local rc=0
	"$@" || rc=$?
	exec {fd}>&-
	return "$rc"
}

# A temporary directory in the cache (same filesystem as the results); the caller
# appends it to LAB__TMPS so that an interrupted build leaves nothing behind. Leftovers
# of killed runs (older than a day) are removed here.
lab__mktemp() {
	find "$LAB_CACHE" -maxdepth 1 -name 'tmp.*' -mtime +1 -exec rm -rf {} + 2>/dev/null || true
	mktemp -d "$LAB_CACHE/tmp.XXXXXX"
}

lab__latest_kver() {
	apt-cache depends linux-image-amd64 2>/dev/null |
		sed -n 's/^ *Depends: linux-image-\([0-9][^ ]*-amd64\)$/\1/p' | head -n1
}

# Sets LAB_KVER and LAB_VMLINUZ; downloads and unpacks the kernel package if not cached.
lab_kernel() {
	if [[ -z ${LAB_KVER:-} ]]; then
		LAB_KVER=$(lab__latest_kver)
		if [[ -z $LAB_KVER ]]; then
			lab_log "apt-cache knows no linux-image-amd64; running apt-get update"
			apt-get -q -o DPkg::Lock::Timeout=300 update >&2 || true
			LAB_KVER=$(lab__latest_kver)
		fi
		if [[ -z $LAB_KVER ]]; then
			# Offline: use the newest kernel already in the cache.
			LAB_KVER=$(find "$LAB_CACHE/kernel" -mindepth 2 -maxdepth 2 -name vmlinuz 2>/dev/null |
				sed 's|.*/kernel/\([^/]*\)/vmlinuz|\1|' | sort -V | tail -n1)
		fi
		[[ -n $LAB_KVER ]] || lab_die "cannot determine the kernel version (apt-cache depends linux-image-amd64)"
	fi
	LAB_VMLINUZ="$LAB_CACHE/kernel/$LAB_KVER/vmlinuz"
	[[ -s $LAB_VMLINUZ && -s $LAB_CACHE/kernel/$LAB_KVER/linux-image.deb ]] && return 0
	lab_with_cache_lock lab__fetch_kernel
}

lab__fetch_kernel() {
	local dir="$LAB_CACHE/kernel/$LAB_KVER"
	[[ -s $dir/vmlinuz && -s $dir/linux-image.deb ]] && return 0
	local tmp
	tmp=$(lab__mktemp)
	LAB__TMPS+=("$tmp")
	lab_log "downloading linux-image-$LAB_KVER"
	chmod 755 "$tmp"
	if ! (cd "$tmp" && apt-get -q download "linux-image-$LAB_KVER" >&2); then
		rm -rf "$tmp"
		lab_die "apt-get download linux-image-$LAB_KVER failed"
	fi
	local deb
	deb=$(find "$tmp" -maxdepth 1 -name "linux-image-${LAB_KVER}_*.deb" | head -n1)
	[[ -n $deb ]] || {
		rm -rf "$tmp"
		lab_die "no .deb after apt-get download"
	}
	# Only the kernel image is kept unpacked; modules are taken from the .deb when the
	# initramfs is built.
	mkdir -p "$tmp/x"
	dpkg-deb --fsys-tarfile "$deb" | tar -x -C "$tmp/x" ./boot
	mkdir -p "$dir"
	cp "$tmp/x/boot/vmlinuz-$LAB_KVER" "$dir/vmlinuz.new"
	cp "$tmp/x/boot/config-$LAB_KVER" "$dir/config"
	mv "$deb" "$dir/linux-image.deb"
	mv "$dir/vmlinuz.new" "$dir/vmlinuz"
	rm -rf "$tmp"
}

lab__initramfs_key() {
	local GUEST_MODULES
	lab__guest_modules
	{
		echo "format=$LAB_INITRAMFS_FORMAT kver=$LAB_KVER modules=${GUEST_MODULES[*]}"
		sha256sum "$LAB_GUEST_DIR/init" | cut -d' ' -f1
		sha256sum "$LAB_CACHE/kernel/$LAB_KVER/linux-image.deb" | cut -d' ' -f1
		sha256sum /bin/busybox | cut -d' ' -f1
	} | sha256sum | cut -c1-16
}

# Sets LAB_INITRD; builds the initramfs when its inputs (kernel, module list,
# lab/guest/init, busybox) changed.
lab_initramfs() {
	local key
	key=$(lab__initramfs_key)
	LAB_INITRD="$LAB_CACHE/initramfs/$LAB_KVER-$key.cpio.gz"
	[[ -s $LAB_INITRD ]] && return 0
	lab_with_cache_lock lab__build_initramfs
}

lab__build_initramfs() {
	[[ -s $LAB_INITRD ]] && return 0
	lab_log "building the guest initramfs for $LAB_KVER"
	local tmp
	tmp=$(lab__mktemp)
	LAB__TMPS+=("$tmp")
	local k="$tmp/k" r="$tmp/root"
	mkdir -p "$k" "$r"
	dpkg-deb --fsys-tarfile "$LAB_CACHE/kernel/$LAB_KVER/linux-image.deb" |
		tar -x -C "$k" "./lib/modules/$LAB_KVER"
	busybox depmod -b "$k" "$LAB_KVER"
	local mdir="lib/modules/$LAB_KVER"
	# Resolve the module list to files, with their (transitive) dependencies.
	local -A want=()
	local m line path deps d found
	local GUEST_MODULES
	lab__guest_modules
	for m in "${GUEST_MODULES[@]}"; do
		found=
		while IFS= read -r line; do
			path=${line%%:*}
			local base=${path##*/}
			base=${base%%.ko*}
			base=${base//-/_}
			[[ $base == "${m//-/_}" ]] || continue
			found=1
			want[$path]=1
			deps=${line#*:}
			for d in $deps; do want[$d]=1; done
		done <"$k/$mdir/modules.dep"
		if [[ -z $found ]]; then
			if grep -qE "/${m//_/[-_]}\.ko" "$k/$mdir/modules.builtin"; then
				lab_log "module $m is built in"
			else
				rm -rf "$tmp"
				lab_die "module $m not found in linux-image-$LAB_KVER"
			fi
		fi
	done
	# modules.dep lists the full dependency closure; make sure of it anyway.
	local changed=1
	while ((changed)); do
		changed=0
		for path in "${!want[@]}"; do
			line=$(grep -m1 "^$path:" "$k/$mdir/modules.dep") || continue
			for d in ${line#*:}; do
				if [[ -z ${want[$d]:-} ]]; then
					want[$d]=1
					changed=1
				fi
			done
		done
	done
	for path in "${!want[@]}"; do
		mkdir -p "$r/$mdir/$(dirname "$path")"
		cp "$k/$mdir/$path" "$r/$mdir/$path"
	done
	cp "$k/$mdir/modules.builtin" "$k/$mdir/modules.order" "$r/$mdir/" 2>/dev/null || true
	busybox depmod -b "$r" "$LAB_KVER"

	mkdir -p "$r/bin" "$r/sbin" "$r/usr/bin" "$r/usr/sbin" "$r/dev" "$r/proc" "$r/sys" \
		"$r/tmp" "$r/lower" "$r/rw" "$r/newroot" "$r/etc"
	cp /bin/busybox "$r/bin/busybox"
	ln -s busybox "$r/bin/sh"
	install -m 0755 "$LAB_GUEST_DIR/init" "$r/init"
	mknod -m 600 "$r/dev/console" c 5 1 2>/dev/null || true
	mknod -m 666 "$r/dev/null" c 1 3 2>/dev/null || true

	mkdir -p "$LAB_CACHE/initramfs"
	(cd "$r" && find . | busybox cpio -o -H newc -R 0:0 2>/dev/null | gzip -6) >"$LAB_INITRD.tmp"
	mv "$LAB_INITRD.tmp" "$LAB_INITRD"
	rm -rf "$tmp"
	lab_log "initramfs: $LAB_INITRD ($(du -h "$LAB_INITRD" | cut -f1), ${#want[@]} modules)"
	# Drop initramfs images of this kernel older than a week (other keys may be in use
	# by other worktrees right now, so recent ones stay).
	find "$LAB_CACHE/initramfs" -name "$LAB_KVER-*.cpio.gz" -mtime +7 -delete 2>/dev/null || true
}

# A TCP port on 127.0.0.1 nobody listens on right now.
lab_free_port() {
	local p i
	for i in $(seq 1 200); do
		p=$((20000 + (RANDOM * 32768 + RANDOM) % 40000))
		if [[ -z $(ss -Htln "sport = :$p" 2>/dev/null) ]]; then
			echo "$p"
			return 0
		fi
		: "$i"
	done
	lab_die "no free TCP port found"
}

# (In the namespace QEMU runs in: lab__socket_link's, when it made one.)
lab_port_listening() { [[ -n $("${LAB__QEMU_PREFIX[@]}" ss -Htln "src 127.0.0.1 and sport = :$1" 2>/dev/null) ]]; }

# lab__guest_results OUT END NAME...: each guest's exit code from OUT/NAME.rc (124 when
# the run ended in a timeout (END=timeout) without one, 126 when it was stopped for a
# stalled link (END=stalled), 125 when the guest died without one (END=done), written
# back), logged; non-zero if any guest did not exit 0.
lab__guest_results() {
	local out=$1 end=$2 fail=0 rc r
	shift 2
	for r in "$@"; do
		if [[ -s $out/$r.rc ]]; then
			rc=$(<"$out/$r.rc")
		elif [[ $end == stalled ]]; then
			rc=126
			echo "$rc" >"$out/$r.rc"
			lab_log "guest $r: stopped, the link had stalled (no exit code)"
		elif [[ $end == timeout ]]; then
			rc=124
			echo "$rc" >"$out/$r.rc"
			lab_log "guest $r: timed out (no exit code)"
		else
			rc=125
			echo "$rc" >"$out/$r.rc"
			lab_log "guest $r: died without an exit code; see $out/$r.console and $out/$r.qemu.log"
		fi
		[[ $rc == 0 ]] || fail=1
		lab_log "guest $r: exit $rc (log $out/$r.log)"
	done
	return "$fail"
}

# ---------------------------------------------------------------------------
# lab_vm_run: the body of `scripts/lab vm run` (the guests are stopped by the traps above
# if the script is interrupted).

lab__kill_guests() {
	local pid
	for pid in "${LAB__PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	local t
	for t in $(seq 1 50); do
		local alive=0
		for pid in "${LAB__PIDS[@]}"; do
			kill -0 "$pid" 2>/dev/null && alive=1
		done
		((alive)) || break
		sleep 0.1
		: "$t"
	done
	for pid in "${LAB__PIDS[@]}"; do
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	LAB__PIDS=()
}

lab__kill_switches() {
	local pid ns
	for pid in "${LAB__SWITCH_PIDS[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	LAB__SWITCH_PIDS=()
	for ns in "${LAB__NETNS[@]}"; do
		ip netns del "$ns" 2>/dev/null || true
	done
	LAB__NETNS=()
	LAB__QEMU_PREFIX=()
}

# lab__bridge MTU TAP...: a network namespace of this run's own holding a bridge (no STP,
# no multicast snooping: every frame floods, like a hub with learning) and the TAPs on it
# at MTU, for QEMU run in that namespace; nothing in it has an address (IPv6 off), so
# only the guests' frames cross it. Removed with the run's switches (lab__kill_switches);
# one of this name not made here was left by a killed run whose PID this one has.
lab__bridge() {
	local mtu=$1 ns=uipoib-lab-$$ tap
	shift
	ip netns del "$ns" 2>/dev/null || true
	ip netns add "$ns" || lab_die "ip netns add $ns failed"
	LAB__NETNS+=("$ns")
	ip netns exec "$ns" sysctl -qw net.ipv6.conf.all.disable_ipv6=1 net.ipv6.conf.default.disable_ipv6=1 ||
		lab_die "cannot turn IPv6 off in $ns"
	ip -n "$ns" link add br0 type bridge stp_state 0 forward_delay 0 mcast_snooping 0 ||
		lab_die "ip link add br0 type bridge failed in $ns"
	for tap in "$@"; do
		ip -n "$ns" tuntap add dev "$tap" mode tap || lab_die "ip tuntap add $tap failed in $ns"
		ip -n "$ns" link set "$tap" mtu "$mtu" master br0 up || lab_die "$tap: mtu $mtu, br0, up failed in $ns"
	done
	ip -n "$ns" link set br0 mtu "$mtu" up || lab_die "br0 up failed"
	LAB__QEMU_PREFIX=(ip netns exec "$ns")
}

# lab__stalled OUTDIR ROLE...: "ROLE: LINE" for the first guest whose console shows the
# kernel's NETDEV WATCHDOG (its eth0 transmit queue made no progress for 5 s) or the
# lab's own TRANSMIT STALL (lab/guest/txwatch: nothing transmitted for 5 s while rxe
# handed eth0 packets, too few to fill the ring and stop the queue); false if none has.
# Seen on this lab's hosts under 300+ Mbit/s on both links: the guest's virtio-net
# transmit ring stops being served by QEMU for good, and every later step
# fails (docs/RXE-LAB.md, "The link stall"). It is the emulation's fault, not the
# datapath's: uipoib never touches eth0's queue.
lab__stalled() {
	local out=$1 r l
	shift
	for r in "$@"; do
		# The serial console ends its lines with CR LF.
		l=$(grep -a -m1 -e "NETDEV WATCHDOG" -e "TRANSMIT STALL" "$out/$r.console" 2>/dev/null | tr -d '\r') || true
		[[ -n $l ]] || continue
		echo "$r: $l"
		return 0
	done
	return 1
}

# lab__set_aside OUTDIR BOOT STAMP: every file a stalled boot wrote (made or changed
# after the file STAMP was touched, just before the boot) moved to
# OUTDIR/stalled-boot-BOOT/ at the same relative path, but the lock and the stall record:
# the next boot starts from what the host had prepared, no file of the stalled boot can
# stand for one of the next, and the stalled boot's evidence is kept.
lab__set_aside() {
	local out=$1 boot=$2 stamp=$3 f
	while IFS= read -r f; do
		mkdir -p "$out/stalled-boot-$boot/$(dirname "$f")"
		mv -f "$out/$f" "$out/stalled-boot-$boot/$f"
	done < <(cd "$out" && find . -mindepth 1 \( -type f -o -type l \) -newer "$stamp" ! -name .lab-vm.lock \
		! -name lab-stalls.txt ! -path './stalled-boot-*' -printf '%P\n')
}

# lab__link_stats OUTDIR ROLE...: the bridge's count of each guest's frames (its TAP
# uipoib-ROLE: frames from the guest, frames toward it, and those dropped toward it
# because its QEMU did not take them in time: the link's only loss), in OUTDIR/link.txt
# and logged. Called before the bridge's namespace goes.
lab__link_stats() {
	local out=$1 ns=uipoib-lab-$$ r st from to dropped
	shift
	: >"$out/link.txt"
	for r in "$@"; do
		st=/sys/class/net/uipoib-$r/statistics
		# shellcheck disable=SC2016 # expanded by the inner shell
		read -r from to dropped < <(ip netns exec "$ns" sh -c 'cat "$1/rx_packets" "$1/tx_packets" "$1/tx_dropped" | tr "\n" " "' - "$st" 2>/dev/null) ||
			true
		echo "$r frames_from=${from:-?} frames_to=${to:-?} dropped_to=${dropped:-?}" >>"$out/link.txt"
		lab_log "link (bridge): guest $r sent ${from:-?} frames, was sent ${to:-?}, ${dropped:-?} dropped on the way to it (its QEMU full)"
	done
}

# lab__socket_link: a network namespace of this run's own for the two guests' QEMUs, whose
# socket link is a TCP connection over loopback. QEMU does not turn Nagle off on it, so a
# small frame written while an earlier one is unacknowledged waits for the peer kernel's
# delayed ACK (40 ms) whenever the other direction has nothing to carry the ACK: measured,
# after a restart under iperf3 TCP the frames a sent 0.2-7 ms after its announcement
# reached b 40-45 ms after it, all at once (docs/RXE-LAB.md). In the namespace the
# loopback routes have `quickack 1`, so every segment is acknowledged at once and the link
# holds nothing back. Off by default (LAB_LINK_QUICKACK=1 turns it on; docs/RXE-LAB.md
# says why).
lab__socket_link() {
	LAB__QEMU_PREFIX=()
	[[ ${LAB_LINK_QUICKACK:-0} == 1 ]] || return 0
	local ns=uipoib-link-$$ r
	# One namespace for every boot of this process (removed on exit, lab__cleanup); one
	# of this name not made here was left by a killed run whose PID this one has.
	if [[ " ${LAB__NETNS[*]} " != *" $ns "* ]]; then
		ip netns del "$ns" 2>/dev/null || true
		ip netns add "$ns" || lab_die "ip netns add $ns failed (without LAB_LINK_QUICKACK=1 the link needs no namespace)"
		LAB__NETNS+=("$ns")
	fi
	ip -n "$ns" link set lo up || lab_die "lo up failed in $ns"
	for r in 127.0.0.1 127.0.0.0/8; do
		ip -n "$ns" route replace local "$r" dev lo proto kernel scope host src 127.0.0.1 table local quickack 1 ||
			lab_die "cannot set quickack on the loopback route $r in $ns"
	done
	LAB__QEMU_PREFIX=(ip netns exec "$ns")
}

# LAB_LOGLEVEL, the guests' console loglevel (lab__qemu_guest), checked before a boot.
lab__check_loglevel() {
	[[ ${LAB_LOGLEVEL:-4} =~ ^[0-8]$ ]] ||
		lab_die "LAB_LOGLEVEL must be 0..8 (the guest kernel's console loglevel), not '$LAB_LOGLEVEL'"
	((${LAB_LOGLEVEL:-4} >= 3)) ||
		lab_log "warning: LAB_LOGLEVEL=$LAB_LOGLEVEL hides the guest kernel's NETDEV WATCHDOG line (level 2) from the console: a stalled link will not be seen (needs 3 or more)"
	[[ -z ${LAB_MAXCPUS:-} || ( $LAB_MAXCPUS =~ ^[1-9][0-9]?$ && $LAB_MAXCPUS -ge ${LAB_SMP:-1} ) ]] ||
		lab_die "LAB_MAXCPUS must be a number of vCPUs no smaller than LAB_SMP (${LAB_SMP:-1}), not '$LAB_MAXCPUS'"
	local a args
	[[ -z ${LAB_NAPI_NICE:-} || ( $LAB_NAPI_NICE =~ ^-?(0|[1-9][0-9]?)$ && $LAB_NAPI_NICE -ge -20 && $LAB_NAPI_NICE -le 19 ) ]] ||
		lab_die "LAB_NAPI_NICE must be unset (eth0's receive work in softirq context) or a nice level -20..19 (threaded NAPI at that level), not '$LAB_NAPI_NICE'"
	[[ ${LAB_KERNEL_ARGS:-} != *$'\n'* ]] || lab_die "LAB_KERNEL_ARGS must be one line"
	read -ra args <<<"${LAB_KERNEL_ARGS:-}"
	for a in "${args[@]}"; do
		[[ $a =~ ^[A-Za-z][A-Za-z0-9_.-]*(=[A-Za-z0-9_.,:-]+)?$ ]] ||
			lab_die "LAB_KERNEL_ARGS takes kernel parameters (name or name=value, space-separated), not '$a'"
		case ${a%%=*} in
		lab.* | console | loglevel | panic | oops)
			lab_die "LAB_KERNEL_ARGS: '${a%%=*}' is set by the lab itself (LAB_LOGLEVEL sets the loglevel)"
			;;
		esac
	done
}

# ROLE NETDEV(tap,ifname=... | socket,listen=... | socket,connect=... | vde,sock=...) OUTDIR SCRIPT MAC [APPEND]
lab__qemu_guest() {
	local role=$1 net=$2 out=$3 script=$4 mac=$5
	# The console (an emulated serial port, ROLE.console) shows the kernel's errors only
	# (LAB_LOGLEVEL, default 4: Debian's `quiet`): a line printed there costs the thread
	# that logs it ~3.5 us a byte under TCG, and rxe logs a warning at every port query
	# (0.2 ms of each restart's renewal; docs/RXE-LAB.md). The whole kernel log is in
	# ROLE.dmesg.
	local append="console=ttyS0 panic=-1 oops=panic loglevel=${LAB_LOGLEVEL:-4}"
	append+=" lab.role=$role lab.out=$out lab.script=$script lab.stage2=$LAB_GUEST_DIR/stage2"
	[[ -z ${6:-} ]] || append+=" $6"
	[[ -z ${LAB_NAPI_NICE:-} ]] || append+=" lab.napi_nice=$LAB_NAPI_NICE"
	[[ -z ${LAB_KERNEL_ARGS:-} ]] || append+=" $LAB_KERNEL_ARGS"
	exec "${LAB__QEMU_PREFIX[@]}" qemu-system-x86_64 \
		-name "uipoib-lab-$role" \
		-accel tcg,thread=multi -cpu max -smp "${LAB_SMP:-1}${LAB_MAXCPUS:+,maxcpus=$LAB_MAXCPUS}" -m "${LAB_MEM:-1024}" \
		-nodefaults -no-user-config -display none -no-reboot \
		-kernel "$LAB_VMLINUZ" -initrd "$LAB_INITRD" -append "$append" \
		-chardev "file,id=con0,path=$out/$role.console" -serial chardev:con0 \
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
		-virtfs "local,path=$out,mount_tag=labout,security_model=none,multidevs=remap" \
		-netdev "$net,id=n0" -device "virtio-net-pci,netdev=n0,mac=$mac" \
		-device virtio-rng-pci \
		</dev/null >"$out/$role.qemu.log" 2>&1
}

# lab_vm_run OUTDIR SCRIPT_A SCRIPT_B
lab_vm_run() {
	(($# == 3)) || lab_die "usage: scripts/lab vm run OUTDIR SCRIPT_A SCRIPT_B"
	local out=$1 sa=$2 sb=$3
	local s
	for s in "$sa" "$sb"; do
		[[ -f $s && -r $s ]] || lab_die "no such script: $s"
	done
	sa=$(realpath "$sa")
	sb=$(realpath "$sb")
	mkdir -p "$out"
	out=$(realpath "$out")
	for s in "$out" "$sa" "$sb" "$LAB_GUEST_DIR"; do
		[[ $s =~ ^/[A-Za-z0-9_./+@:-]*$ ]] ||
			lab_die "path '$s' must be absolute and free of spaces, commas and shell specials"
	done
	[[ $out != / ]] || lab_die "OUTDIR must not be /"
	local lockfd
	exec {lockfd}>"$out/.lab-vm.lock"
	flock -n "$lockfd" || lab_die "another run of the guests is using $out"

	lab_ensure_pkgs "${LAB_VM_PKGS[@]}"
	lab__check_loglevel
	lab_kernel
	lab_initramfs

	local timeout=${LAB_TIMEOUT:-600}
	local r
	for r in a b; do
		rm -f "$out/$r.log" "$out/$r.rc" "$out/$r.console" "$out/$r.qemu.log" "$out/$r.dmesg"
	done
	rm -f "$out/link.txt" "$out/host-cpu.txt"

	local link=${LAB_LINK:-socket}
	[[ $link == bridge || $link == socket ]] ||
		lab_die "LAB_LINK must be socket (the default: QEMU's socket netdev over loopback) or bridge (a bridge and two TAPs in a namespace of the run's own), not '$link'"
	[[ ${LAB_LINK_QUICKACK:-0} =~ ^[01]$ ]] ||
		lab_die "LAB_LINK_QUICKACK must be 0 (the default) or 1 (the guests' socket link acknowledges at once), not '$LAB_LINK_QUICKACK'"
	[[ $link == socket || ${LAB_LINK_QUICKACK:-0} == 0 ]] ||
		lab_die "LAB_LINK_QUICKACK=1 is a setting of the socket link: set LAB_LINK=socket with it"
	local retries=${LAB_STALL_RETRIES:-4}
	[[ $retries =~ ^[0-9]$ ]] ||
		lab_die "LAB_STALL_RETRIES must be 0..9 (boots repeated after a stalled link), not '$retries'"
	rm -rf "$out"/stalled-boot-*
	rm -f "$out/lab-stalls.txt"
	local stamp boot=1 why first=$SECONDS
	stamp=$(mktemp /tmp/uipoib-lab-boot.XXXXXX)
	LAB__TMPS+=("$stamp")
	while :; do
		touch "$stamp"
		lab__boot_pair "$out" "$sa" "$sb" "$link" "$timeout"
		[[ $LAB__BOOT_END == stalled ]] || break
		why="boot $boot: the link stalled, guest $LAB__BOOT_STALL (+${LAB__BOOT_SECS}s)"
		if ((boot > retries)); then
			echo "$why; no boot left (LAB_STALL_RETRIES=$retries): the run failed" >>"$out/lab-stalls.txt"
			lab_log "the link stalled in boot $boot and no repeat is left (LAB_STALL_RETRIES=$retries): the run failed; see $out/lab-stalls.txt"
			break
		fi
		lab__set_aside "$out" "$boot" "$stamp"
		echo "$why; its files are in stalled-boot-$boot/, the run was repeated" >>"$out/lab-stalls.txt"
		lab_log "the guests' link stalled ($LAB__BOOT_STALL): an emulation fault, not the datapath's (docs/RXE-LAB.md); boot $boot's files set aside in $out/stalled-boot-$boot/; booting again ($boot of $retries repeats)"
		boot=$((boot + 1))
	done

	local fail=0
	lab__guest_results "$out" "$LAB__BOOT_END" a b || fail=1
	if ((boot > 1)); then
		lab_log "both guests done in ${LAB__BOOT_SECS}s (boot $boot; $((SECONDS - first))s since the first)"
	else
		lab_log "both guests done in ${LAB__BOOT_SECS}s"
	fi
	return "$fail"
}

# lab__host_cpu: the host's CPU time so far, /proc/stat's first line without its name
# (user nice system idle iowait irq softirq steal ..., in ticks).
lab__host_cpu() {
	local _name rest
	read -r _name rest </proc/stat
	echo "$rest"
}

# lab__host_cpu_write OUTDIR BEFORE SECS: where the host's CPU time went since BEFORE (a
# lab__host_cpu line), over a boot of SECS seconds: busy here (the guests' emulation and
# everything else on the host), stolen (the hypervisor ran someone else: on a shared
# cloud machine the guests then run slower by about that share, and a boot's timings
# are comparable only with boots of a similar share), idle. Written to
# OUTDIR/host-cpu.txt (HOST_CPUS, HOST_CPU_SECS, HOST_CPU_BUSY_PCT, HOST_CPU_STEAL_PCT,
# HOST_CPU_IDLE_PCT; every report prints it) and logged; nothing when /proc/stat says
# nothing usable.
lab__host_cpu_write() {
	local out=$1 before=$2 secs=$3 text
	rm -f "$out/host-cpu.txt"
	text=$(awk -v b="$before" -v a="$(lab__host_cpu)" -v s="$secs" -v n="$(nproc --all)" 'BEGIN {
		if (split(b, x, " ") < 8 || split(a, y, " ") < 8) exit 1
		for (i = 1; i <= 8; i++) { d[i] = y[i] - x[i]; t += d[i] }
		if (t <= 0) exit 1
		printf "HOST_CPUS=%d\nHOST_CPU_SECS=%d\n", n, s
		printf "HOST_CPU_BUSY_PCT=%.1f\n", 100 * (d[1] + d[2] + d[3] + d[6] + d[7]) / t
		printf "HOST_CPU_STEAL_PCT=%.1f\n", 100 * d[8] / t
		printf "HOST_CPU_IDLE_PCT=%.1f\n", 100 * (d[4] + d[5]) / t
	}') || return 0
	echo "$text" >"$out/host-cpu.txt" || return 0
	local busy steal idle
	busy=$(sed -n 's/^HOST_CPU_BUSY_PCT=//p' <<<"$text") || true
	steal=$(sed -n 's/^HOST_CPU_STEAL_PCT=//p' <<<"$text") || true
	idle=$(sed -n 's/^HOST_CPU_IDLE_PCT=//p' <<<"$text") || true
	lab_log "host CPU over the boot ($(nproc --all) cores, ${secs}s): ${busy}% busy, ${steal}% stolen by the hypervisor, ${idle}% idle"
	return 0
}

# lab__boot_pair OUTDIR SCRIPT_A SCRIPT_B LINK TIMEOUT: one boot of the two guests, until
# both have powered off, TIMEOUT seconds have passed or a guest's link stalled
# (lab__stalled). Sets LAB__BOOT_END (done, timeout or stalled: the second argument of
# lab__guest_results), LAB__BOOT_STALL (which guest, and its console
# line) and LAB__BOOT_SECS.
lab__boot_pair() {
	local out=$1 sa=$2 sb=$3 link=$4 timeout=$5
	local start=$SECONDS port pa pb attempt up cpu0
	cpu0=$(lab__host_cpu)
	LAB__BOOT_END=done LAB__BOOT_STALL=''
	if [[ $link == bridge ]]; then
		lab__bridge 9000 uipoib-a uipoib-b
		lab_log "kernel $LAB_KVER; booting guest a ($sa) and guest b ($sb); out=$out; timeout ${timeout}s; link: bridge"
		lab__qemu_guest a "tap,ifname=uipoib-a,script=no,downscript=no" "$out" "$sa" 52:54:00:c6:12:01 &
		pa=$!
		LAB__PIDS=("$pa")
		lab__qemu_guest b "tap,ifname=uipoib-b,script=no,downscript=no" "$out" "$sb" 52:54:00:c6:12:02 &
		pb=$!
		LAB__PIDS=("$pa" "$pb")
	else
		lab__socket_link
		lab_log "kernel $LAB_KVER; booting guest a ($sa) and guest b ($sb); out=$out; timeout ${timeout}s; link: socket, quickack ${LAB_LINK_QUICKACK:-0}"
		for attempt in 1 2 3 4 5; do
			port=$(lab_free_port)
			lab__qemu_guest a "socket,listen=127.0.0.1:$port" "$out" "$sa" 52:54:00:c6:12:01 &
			pa=$!
			LAB__PIDS=("$pa")
			up=
			for _ in $(seq 1 150); do
				if lab_port_listening "$port"; then
					up=1
					break
				fi
				kill -0 "$pa" 2>/dev/null || break
				sleep 0.1
			done
			[[ -n $up ]] && break
			lab_log "guest a did not listen on 127.0.0.1:$port (attempt $attempt): $(tail -n 3 "$out/a.qemu.log" 2>/dev/null)"
			lab__kill_guests
		done
		[[ -n $up ]] || lab_die "could not start guest a"
		lab__qemu_guest b "socket,connect=127.0.0.1:$port" "$out" "$sb" 52:54:00:c6:12:02 &
		pb=$!
		LAB__PIDS=("$pa" "$pb")
	fi

	LAB__SEEN=()
	while kill -0 "$pa" 2>/dev/null || kill -0 "$pb" 2>/dev/null; do
		lab__progress "$out" "$start" a b
		if LAB__BOOT_STALL=$(lab__stalled "$out" a b); then
			LAB__BOOT_END=stalled
			lab_log "STALLED LINK: guest ${LAB__BOOT_STALL}; stopping the guests"
			break
		fi
		if ((SECONDS - start >= timeout)); then
			LAB__BOOT_END=timeout
			lab_log "TIMEOUT after ${timeout}s; killing the guests"
			break
		fi
		sleep 1
	done
	lab__progress "$out" "$start" a b
	lab__kill_guests
	# Both guests may have powered off between the last look and a stall line: a stall
	# that left a guest without exit code 0 counts as one.
	local r
	if [[ $LAB__BOOT_END == done ]] && LAB__BOOT_STALL=$(lab__stalled "$out" a b); then
		for r in a b; do
			if [[ $(cat "$out/$r.rc" 2>/dev/null) != 0 ]]; then
				LAB__BOOT_END=stalled
				lab_log "STALLED LINK: guest ${LAB__BOOT_STALL} (seen after the guests had stopped)"
				break
			fi
		done
		[[ $LAB__BOOT_END == stalled ]] ||
			lab_log "a guest's console shows a stalled link ($LAB__BOOT_STALL), but both guests' scripts exited 0: the boot stands"
	fi
	if [[ $link == bridge ]]; then
		lab__link_stats "$out" a b
		lab__kill_switches
	fi
	LAB__BOOT_SECS=$((SECONDS - start))
	lab__host_cpu_write "$out" "$cpu0" "$LAB__BOOT_SECS"
}

# lab_stall_check OUTDIR: the stall handling of lab_vm_run checked with a stall line
# faked by guest b in its first boot (lab/guest/stall-check): with one repeat allowed the
# run passes, the first boot's files set aside and recorded; with none it fails, b's
# exit code 126. In the repeated boot the guests check lab/guest/txwatch with the real
# counters: a watch told that no qdisc holds anything reports the ring a tbf holds as not
# served, and stage2's own watch, which sees the tbf's backlog, stays silent. OUTDIR/1
# and OUTDIR/0 hold the two runs. Prints PASSED or FAILED with each reason; non-zero if
# FAILED.
lab_stall_check() {
	local out=$1 rc why=() g=$LAB_GUEST_DIR/stall-check
	rm -rf "${out:?}/1" "${out:?}/0"
	rc=0
	LAB_STALL_RETRIES=1 lab_vm_run "$out/1" "$g" "$g" || rc=$?
	((rc == 0)) || why+=("with one repeat allowed the run exited $rc, not 0")
	[[ $(wc -l <"$out/1/lab-stalls.txt" 2>/dev/null) == 1 ]] ||
		why+=("with one repeat: lab-stalls.txt does not hold exactly one line")
	grep -q "guest b: .*NETDEV WATCHDOG" "$out/1/lab-stalls.txt" 2>/dev/null ||
		why+=("with one repeat: lab-stalls.txt does not name guest b's watchdog line")
	grep -q "NETDEV WATCHDOG" "$out/1/stalled-boot-1/b.console" 2>/dev/null ||
		why+=("with one repeat: stalled-boot-1/b.console (the stalled boot's console) does not hold the line")
	[[ -f $out/1/stalled-boot-1/stall-check-a.txt && -f $out/1/stall-check-a.txt && -f $out/1/stall-check-b.txt ]] ||
		why+=("with one repeat: the guests' files are not where they belong (stalled-boot-1/ for the first boot, OUTDIR for the second)")
	! grep -q "NETDEV WATCHDOG" "$out/1/b.console" 2>/dev/null ||
		why+=("with one repeat: the second boot's console holds the first boot's line")
	grep -q "TRANSMIT STALL" "$out/1/txwatch-forced.txt" 2>/dev/null ||
		why+=("the transmit watch told no qdisc holds anything did not report the ring the tbf held (txwatch-forced.txt)")
	! grep -a -q "TRANSMIT STALL" "$out/1/a.console" "$out/1/b.console" 2>/dev/null ||
		why+=("the guests' own transmit watch reported a stall while the tbf held the packets (console)")
	rc=0
	LAB_STALL_RETRIES=0 lab_vm_run "$out/0" "$g" "$g" || rc=$?
	((rc != 0)) || why+=("with no repeat allowed the run exited 0")
	[[ $(cat "$out/0/b.rc" 2>/dev/null) == 126 ]] || why+=("with no repeat: b's exit code is not 126 (stopped for a stalled link)")
	grep -q "no boot left" "$out/0/lab-stalls.txt" 2>/dev/null ||
		why+=("with no repeat: lab-stalls.txt does not say the run failed for it")
	if ((${#why[@]})); then
		printf 'stall-check: FAILED: %s\n' "${why[@]}"
		return 1
	fi
	echo "stall-check: PASSED: a faked stall stopped its boot, which was set aside and repeated (one repeat allowed) or failed the run (none allowed); the transmit watch reported packets held in eth0 only when told no qdisc held them"
}

# lab_vm_hosts OUTDIR N SCRIPT: N guests (2..4), roles h1..hN, their NICs on one segment
# (LAB_HOSTS_NET: a bridge in a network namespace of the run's own, or a private vde
# switch in a temporary directory; either is removed at the end); SCRIPT runs on
# each (LAB_HOST=K, LAB_NHOSTS=N tell them apart; lab/guest/stage2). Exit codes in
# OUTDIR/hK.rc, logs in OUTDIR/hK.log; 1 if a guest did not exit 0.
lab_vm_hosts() {
	(($# == 3)) || lab_die "usage: scripts/lab vm hosts OUTDIR N SCRIPT"
	local out=$1 n=$2 script=$3
	[[ $n =~ ^[2-4]$ ]] || lab_die "the number of hosts must be 2, 3 or 4, not '$n'"
	[[ -f $script && -r $script ]] || lab_die "no such script: $script"
	script=$(realpath "$script")
	mkdir -p "$out"
	out=$(realpath "$out")
	local s
	for s in "$out" "$script" "$LAB_GUEST_DIR"; do
		[[ $s =~ ^/[A-Za-z0-9_./+@:-]*$ ]] ||
			lab_die "path '$s' must be absolute and free of spaces, commas and shell specials"
	done
	[[ $out != / ]] || lab_die "OUTDIR must not be /"
	local lockfd
	exec {lockfd}>"$out/.lab-vm.lock"
	flock -n "$lockfd" || lab_die "another run of the guests is using $out"

	lab_ensure_pkgs "${LAB_VM_PKGS[@]}" "${LAB_HOSTS_PKGS[@]}"
	lab__check_loglevel
	lab_kernel
	lab_initramfs

	local timeout=${LAB_TIMEOUT:-900} net=${LAB_HOSTS_NET:-bridge} mtu k r
	LAB__QEMU_PREFIX=()
	case "$net" in
	bridge) mtu=${LAB_HOSTS_MTU:-9000} ;;
	vde) mtu=${LAB_HOSTS_MTU:-1500} ;;
	*) lab_die "LAB_HOSTS_NET must be bridge or vde, not '$net'" ;;
	esac
	[[ $mtu =~ ^[0-9]+$ ]] || lab_die "LAB_HOSTS_MTU must be a number, not '$mtu'"
	for k in $(seq 1 "$n"); do
		rm -f "$out/h$k.log" "$out/h$k.rc" "$out/h$k.console" "$out/h$k.qemu.log" "$out/h$k.dmesg"
	done
	# The guests' rendezvous directory (lab/guest/lib.sh: lab_sync).
	rm -rf "${out:?}/sync"
	mkdir -p "$out/sync"

	local sw=
	if [[ $net == vde ]]; then
		# The switch's socket directory must be short (a unix socket path) and private.
		sw=$(mktemp -d /tmp/uipoib-vde.XXXXXX)
		LAB__TMPS+=("$sw")
		vde_switch -s "$sw/sw" -n 8 -d -p "$sw/pid" </dev/null >"$out/vde_switch.log" 2>&1 ||
			lab_die "vde_switch -s $sw/sw -d failed: $(tail -n 3 "$out/vde_switch.log")"
		for _ in $(seq 1 50); do
			[[ -s $sw/pid && -S $sw/sw/ctl ]] && break
			sleep 0.1
		done
		[[ -s $sw/pid && -S $sw/sw/ctl ]] || lab_die "vde_switch did not create $sw/sw/ctl"
		LAB__SWITCH_PIDS=("$(<"$sw/pid")")
	else
		# shellcheck disable=SC2046 # the TAPs' names, one word each
		lab__bridge "$mtu" $(seq -f 'uipoib-h%g' 1 "$n")
	fi

	local start=$SECONDS pids=() nd cpu0
	cpu0=$(lab__host_cpu)
	lab_log "kernel $LAB_KVER; booting $n guests on one $net segment (eth0 mtu $mtu; $script); out=$out; timeout ${timeout}s"
	for k in $(seq 1 "$n"); do
		if [[ $net == vde ]]; then
			nd="vde,sock=$sw/sw"
		else
			nd="tap,ifname=uipoib-h$k,script=no,downscript=no"
		fi
		lab__qemu_guest "h$k" "$nd" "$out" "$script" "52:54:00:c6:13:0$k" \
			"lab.hosts=$n lab.mtu=$mtu" &
		pids+=($!)
		LAB__PIDS=("${pids[@]}")
	done

	local end=done alive pid stall
	rm -f "$out/lab-stalls.txt" "$out/host-cpu.txt"
	LAB__SEEN=()
	while :; do
		alive=
		for pid in "${pids[@]}"; do
			kill -0 "$pid" 2>/dev/null && alive=1
		done
		# shellcheck disable=SC2046 # the guest names, one word each
		lab__progress "$out" "$start" $(seq -f 'h%g' 1 "$n")
		[[ -n $alive ]] || break
		# shellcheck disable=SC2046 # the guest names, one word each
		if stall=$(lab__stalled "$out" $(seq -f 'h%g' 1 "$n")); then
			end=stalled
			echo "the link stalled, guest $stall (+$((SECONDS - start))s); the hosts lab does not repeat its boot: the run failed" >"$out/lab-stalls.txt"
			lab_log "STALLED LINK: guest $stall; stopping the guests (an emulation fault, not the datapath's; docs/RXE-LAB.md)"
			break
		fi
		if ((SECONDS - start >= timeout)); then
			end=timeout
			lab_log "TIMEOUT after ${timeout}s; killing the guests"
			break
		fi
		sleep 1
	done
	lab__kill_guests
	lab__kill_switches
	lab__host_cpu_write "$out" "$cpu0" "$((SECONDS - start))"

	local fail=0
	# shellcheck disable=SC2046 # the guest names, one word each
	lab__guest_results "$out" "$end" $(seq -f 'h%g' 1 "$n") || fail=1
	lab_log "all $n guests done in $((SECONDS - start))s"
	return "$fail"
}

# ---------------------------------------------------------------------------
# What the entry points share around a run: the build, the guests' copies of the
# binaries, the kernel's name, the report.

# lab__progress OUTDIR START ROLE...: print each guest's steps as they begin (the
# `=== [ROLE HH:MM:SS] step` lines its script writes to OUTDIR/ROLE.log), once each, with
# the seconds since START. LAB__SEEN[ROLE] counts the lines already printed.
declare -gA LAB__SEEN=()
lab__progress() {
	local out=$1 start=$2 r i lines
	shift 2
	for r in "$@"; do
		[[ -f $out/$r.log ]] || continue
		mapfile -t lines < <(grep -a '^=== \[' "$out/$r.log" 2>/dev/null || true)
		for ((i = ${LAB__SEEN[$r]:-0}; i < ${#lines[@]}; i++)); do
			lab_log "+$((SECONDS - start))s $(sed -E 's/^=== \[([^ ]+) [0-9:]+\] /\1: /' <<<"${lines[i]}")"
		done
		LAB__SEEN[$r]=${#lines[@]}
	done
}

# lab_target_dir: cargo's target directory of the repo (CARGO_TARGET_DIR is honoured).
lab_target_dir() {
	(cd "$LAB_REPO_ROOT" && cargo metadata --format-version 1 --no-deps 2>/dev/null |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["target_directory"])' 2>/dev/null) ||
		echo "${CARGO_TARGET_DIR:-$LAB_REPO_ROOT/target}"
}

# lab_cargo_build LOG ARGS...: `cargo build ARGS` at the repo root, its output appended to
# LOG; prints "ok" or "FAILED: why" (and the log's tail on stderr).
lab_cargo_build() {
	local log=$1 rc=0
	shift
	local why
	if ! why=$("$LAB_REPO_ROOT/scripts/need-rust" 2>&1); then
		echo "FAILED: $why"
		return
	fi
	lab_log "cargo build $* in $LAB_REPO_ROOT (log: $log)"
	local t0=$SECONDS pid n last=-1 said=0 check=$((SECONDS + 10))
	(cd "$LAB_REPO_ROOT" && cargo build "$@") >>"$log" 2>&1 &
	pid=$!
	# Progress while it builds (checked every 10 s): crates compiled so far and the latest,
	# on a new crate or after 30 s on one (uipoib itself takes a minute or more).
	while kill -0 "$pid" 2>/dev/null; do
		sleep 1
		((SECONDS >= check)) || continue
		check=$((SECONDS + 10))
		n=$(grep -c '^ *Compiling ' "$log" || true)
		if ((n != last || SECONDS - said >= 30)); then
			lab_log "building ($((SECONDS - t0))s): $n crates compiled, now $(grep '^ *Compiling ' "$log" | tail -n1 | awk '{print $2, $3}')"
			last=$n said=$SECONDS
		fi
	done
	wait "$pid" || rc=$?
	lab_log "cargo build $* finished in $((SECONDS - t0))s (exit $rc)"
	if ((rc == 0)); then
		echo ok
	else
		echo "FAILED: cargo build $* exited $rc: $(grep -m1 -E '^error' "$log" || tail -n1 "$log")"
		tail -n 20 "$log" >&2
	fi
}

# lab_uipoib_build OUTDIR BUILD: the build step of the uipoib binary the guests run:
# LAB_UIPOIB_BIN when set, else the repo's release build, built first (output in
# OUTDIR/build.log) when BUILD is not empty. Sets LAB_UIPOIB_SOURCE (the binary's path)
# and LAB_UIPOIB_STATUS ("ok ..." or "FAILED: why").
lab_uipoib_build() {
	local out=$1 build=$2
	LAB_UIPOIB_SOURCE=${LAB_UIPOIB_BIN:-}
	if [[ -n $LAB_UIPOIB_SOURCE ]]; then
		LAB_UIPOIB_STATUS="ok (given: $LAB_UIPOIB_SOURCE)"
		return
	fi
	LAB_UIPOIB_SOURCE=$(lab_target_dir)/release/uipoib
	if [[ -n $build ]]; then
		LAB_UIPOIB_STATUS=$(lab_cargo_build "$out/build.log" --release)
	else
		LAB_UIPOIB_STATUS="ok (not rebuilt)"
	fi
}

# lab_uipoib OUTDIR BUILD: lab_uipoib_build, its status in OUTDIR/build.status and the
# guests' copy OUTDIR/bin/uipoib; without a usable binary it stops the run (lab_die)
# before any guest boots.
lab_uipoib() {
	lab_uipoib_build "$1" "$2"
	echo "$LAB_UIPOIB_STATUS" >"$1/build.status"
	lab_log "build: $LAB_UIPOIB_STATUS"
	lab_stage_bin "$1" uipoib "$LAB_UIPOIB_SOURCE" "$LAB_UIPOIB_STATUS" ||
		lab_die "no usable uipoib binary ($(tr "\n" " " <"$1/build.status")); not booting the guests (build log: $1/build.log)"
}

# lab_stage_bin OUTDIR NAME PATH STATUS: the guests run a private copy, OUTDIR/bin/NAME (a
# concurrent rebuild cannot swap it mid-run), made when STATUS says ok and PATH is a
# program. Otherwise appends why to OUTDIR/build.status and returns 1.
lab_stage_bin() {
	local out=$1 name=$2 path=$3 status=$4
	if [[ -x $path && $status == ok* ]]; then
		mkdir -p "$out/bin"
		cp "$path" "$out/bin/$name"
		return 0
	fi
	[[ -x $path ]] || echo "FAILED: no binary at $path" >>"$out/build.status"
	return 1
}

# lab_guest_kver: the guests' kernel, fetched here only to name it in the report (the
# boot fails, and the report says what is missing, if it cannot be had).
lab_guest_kver() {
	(
		lab_kernel >&2
		echo "$LAB_KVER"
	) || echo unavailable
}

# lab_guests OUTDIR SCRIPT_A SCRIPT_B: `scripts/lab vm run` in a process of its own: its
# traps stop the guests whatever happens, and a failure to set them up is its exit status
# (which the report explains), not the caller's end.
lab_guests() { "$LAB_SCRIPTS_DIR/lab" vm run "$@"; }
# lab_guests_hosts OUTDIR N SCRIPT: `scripts/lab vm hosts` the same way.
lab_guests_hosts() { "$LAB_SCRIPTS_DIR/lab" vm hosts "$@"; }

# lab_report KIND ARGS...: the report of a run (lab/report/).
lab_report() { python3 "$LAB_DIR/report" "$@"; }
