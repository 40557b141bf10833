#!/bin/sh
# An L1 guest with KVM, for running capsule under KVM on a host without
# it (docs/architecture.md, "Acceleration": how the KVM suite runs).
#
# QEMU's TCG with `-cpu max` emulates AMD SVM with nested paging; a
# Debian kernel (linux-image-6.1.0-*-amd64, fetched with `apt-get
# download` and unpacked, never installed) booted that way loads kvm_amd,
# and /dev/kvm works inside it. L1 sees this host's root read-only over
# 9p with a tmpfs on top (overlayfs) and chroots into it, so the built
# capsule, QEMU and ~/.cache/capsule are all there without copying. One
# host directory (RUN) is shared read-write: the command's output, its
# exit status and whatever a test keeps between two boots.
#
#   tests/kvm/l1.sh setup            fetch and unpack the kernel (cached)
#   tests/kvm/l1.sh run [opts] -- CMD...
#       boot L1, run CMD (a shell command line) as root in the chroot,
#       in the current directory, print its output as it comes, power
#       off; exit with CMD's status (125: L1 did not come up).
#       --cpu MODEL   L1's CPU (default max; e.g. EPYC with +svm,+npt)
#       --mem MIB     L1's memory (default 4096)
#       --smp N       L1's vCPUs (default 1)
#       --run DIR     the shared directory (default: a new one, removed);
#                     `touch DIR/ask` makes L1 write its ps listing to DIR/ps
#       --timeout S   power L1 off after S seconds (default 900)
#
# A hung L1 is told in a minute or two, not at --timeout:
# - L1's kernel panics, and L1 powers off, when one of its CPUs is stuck
#   in the kernel for 60 s (softlockup_panic, watchdog_thresh=30), with
#   every CPU's backtrace on its console;
# - L1 touches RUN/alive every 2 s from a shell loop; when it stops for
#   120 s (L1's clock or all its CPUs stopped, where its kernel cannot
#   tell), l1.sh asks QEMU for each vCPU's registers and local APIC
#   (HMP over RUN/qmp; kept in RUN/frozen) and stops it.
# Such a run, and one whose L1 panicked, exits 125 and leaves RUN/hung
# (what was seen); tests/integration/test-kvm.sh boots L1 again once
# then.
#
# Environment: CAPSULE_CACHE_DIR (default ~/.cache/capsule) holds
# kvm/<kernel version>/; CAPSULE_L1_KERNEL names a package to use instead
# of the one linux-image-amd64 depends on.
set -eu

cache=${CAPSULE_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/capsule}/kvm
qemu=${QEMU:-qemu-system-x86_64}
busybox=/bin/busybox # busybox-static (scripts/bootstrap.sh)
# Modules, in load order, that mount L1's root: the rest come from the
# unpacked tree through busybox's modprobe once it is mounted.
early="virtio_ring virtio virtio_pci_legacy_dev virtio_pci_modern_dev virtio_pci
netfs fscache 9pnet 9pnet_virtio 9p overlay"

die() { echo "l1: $*" >&2; exit 125; }
# How L1's kernel tells on its console that it stopped (a soft lockup
# made a panic by softlockup_panic, or any other panic).
stopped='soft lockup|Kernel panic'

# The kernel package to use: the one linux-image-amd64 depends on.
package() {
	if [ -n "${CAPSULE_L1_KERNEL:-}" ]; then
		echo "$CAPSULE_L1_KERNEL"
		return
	fi
	apt-cache depends linux-image-amd64 2>/dev/null |
		awk '/Depends: linux-image-6\.[0-9.]+-[0-9]+-amd64$/ { print $2; exit }'
}

# Fetch and unpack the kernel into $cache/<version>, once. Prints the
# directory.
setup() {
	pkg=$(package)
	[ -n "$pkg" ] || die "cannot tell which kernel linux-image-amd64 depends on (apt-cache depends linux-image-amd64 printed none; run apt-get update)"
	ver=${pkg#linux-image-}
	dir=$cache/$ver
	if [ ! -f "$dir/ready" ]; then
		[ -x "$busybox" ] || die "$busybox is missing: install busybox-static (scripts/bootstrap.sh)"
		mkdir -p "$cache"
		tmp=$(mktemp -d "$cache/.fetch.XXXXXX")
		# apt-get download writes to the current directory; as root it
		# warns that _apt cannot write there, which is harmless.
		if ! (cd "$tmp" && apt-get download -q "$pkg" >"$tmp/log" 2>&1); then
			cat "$tmp/log" >&2
			rm -rf "$tmp"
			die "apt-get download $pkg failed (the log is above)"
		fi
		dpkg -x "$tmp"/*.deb "$tmp/root" || { rm -rf "$tmp"; die "dpkg -x of $pkg failed"; }
		"$busybox" depmod -b "$tmp/root" "$ver" || { rm -rf "$tmp"; die "depmod for $ver failed"; }
		initramfs "$tmp" "$ver" || { rm -rf "$tmp"; die "cannot make L1's initramfs"; }
		mkdir -p "$dir"
		mv "$tmp/root/boot/vmlinuz-$ver" "$dir/vmlinuz"
		mv "$tmp/root/lib/modules/$ver" "$dir/modules"
		mv "$tmp/initrd" "$dir/initrd"
		rm -rf "$tmp"
		echo "$ver" >"$dir/ready"
	fi
	# The initramfs again when l1-init changed.
	if ! cmp -s "$(dirname "$0")/l1-init" "$dir/init"; then
		tmp=$(mktemp -d "$cache/.init.XXXXXX")
		mkdir -p "$tmp/root/lib/modules"
		ln -s "$dir/modules" "$tmp/root/lib/modules/$ver"
		initramfs "$tmp" "$ver" || { rm -rf "$tmp"; die "cannot make L1's initramfs"; }
		mv "$tmp/initrd" "$dir/initrd"
		cp "$(dirname "$0")/l1-init" "$dir/init"
		rm -rf "$tmp"
	fi
	echo "$dir"
}

# L1's initramfs: busybox, the early modules and /init.
initramfs() { # TMP VERSION
	t=$1/initramfs
	mkdir -p "$t/bin" "$t/mods" "$t/proc" "$t/sys" "$t/dev" "$t/lower" "$t/upper" "$t/new"
	cp "$busybox" "$t/bin/busybox"
	for m in $early; do
		f=$(find -L "$1/root/lib/modules/$2" -name "$m.ko" -o -name "$(echo "$m" | tr _ -).ko" | head -1)
		[ -n "$f" ] || { echo "l1: module $m is not in $2" >&2; return 1; }
		cp "$f" "$t/mods/$m.ko"
	done
	echo "$early" | tr ' ' '\n' | grep . >"$t/mods/order"
	cp "$(dirname "$0")/l1-init" "$t/init"
	chmod 0755 "$t/init"
	(cd "$t" && find . | cpio -o -H newc --quiet | gzip -1) >"$1/initrd"
}

# Stop L1 (QEMU, pid $1) when RUN ($2)/alive is 120 s old, first
# asking QEMU for the state of its $3 vCPUs, into RUN/frozen.
watchdog() {
	while kill -0 "$1" 2>/dev/null; do
		sleep 5
		age=$(($(date +%s) - $(stat -c %Y "$2/alive" 2>/dev/null || date +%s)))
		[ "$age" -ge 120 ] || continue
		echo "L1 stopped touching $2/alive from inside: nothing there ran for $age s" >"$2/hung"
		python3 - "$2/qmp" "$3" >"$2/frozen" 2>&1 <<-'EOF' || true
		import json, socket, sys
		s = socket.socket(socket.AF_UNIX)
		s.settimeout(10)
		s.connect(sys.argv[1])
		f = s.makefile("rw")
		def ask(cmd, **args):
		    f.write(json.dumps({"execute": cmd, "arguments": args}) + "\n")
		    f.flush()
		    while True:
		        r = json.loads(f.readline())
		        if "return" in r or "error" in r:
		            return r.get("return", r.get("error"))
		f.readline()
		ask("qmp_capabilities")
		for c in ["info status", "info cpus", "info registers -a"] + ["info lapic %d" % i for i in range(int(sys.argv[2]))]:
		    print("(qemu) " + c)
		    r = ask("human-monitor-command", **{"command-line": c})
		    # The vector and x87 registers say nothing of a hang.
		    print("\n".join(l for l in str(r).splitlines() if l.strip() and not l.startswith(("YMM", "XMM", "FPR", "FCW"))))
		EOF
		kill "$1" 2>/dev/null || true
		return
	done
}

run() {
	cpu=max mem=4096 smp=1 rundir="" timeout=900
	while [ $# -gt 0 ]; do
		case $1 in
		--cpu) cpu=$2; shift 2 ;;
		--mem) mem=$2; shift 2 ;;
		--smp) smp=$2; shift 2 ;;
		--run) rundir=$2; shift 2 ;;
		--timeout) timeout=$2; shift 2 ;;
		--) shift; break ;;
		*) die "unknown option $1 (see the head of $0)" ;;
		esac
	done
	[ $# -gt 0 ] || die "no command given: l1.sh run [options] -- CMD"
	dir=$(setup)
	keep=1
	if [ -z "$rundir" ]; then
		rundir=$(mktemp -d /tmp/l1run.XXXXXX)
		keep=0
	fi
	mkdir -p "$rundir"
	rundir=$(cd "$rundir" && pwd)
	rm -f "$rundir/rc" "$rundir/out" "$rundir/console" "$rundir/qemu.log" "$rundir/hung" "$rundir/frozen" "$rundir/ktext"
	touch "$rundir/alive"
	printf '%s\n' "$*" >"$rundir/cmd"
	pwd >"$rundir/cwd"
	# What the command sees of this environment: CAPSULE_* and a few more.
	env | grep -E '^(CAPSULE_[A-Z_]*|FAKE_[A-Z_]*|TMPDIR|HOME)=' | sed "s/'/'\\\\''/g; s/=/='/; s/\$/'/; s/^/export /" >"$rundir/env" || true
	: >"$rundir/out"
	timeout "$timeout" "$qemu" -machine q35,accel=tcg -cpu "$cpu" -smp "$smp" -m "$mem" \
		-nodefaults -no-user-config -display none -no-reboot \
		-kernel "$dir/vmlinuz" -initrd "$dir/initrd" \
		-append "console=ttyS0 loglevel=5 panic=-1 softlockup_panic=1 watchdog_thresh=30 softlockup_all_cpu_backtrace=1 capsule.run=$rundir capsule.modules=$dir/modules" \
		-serial "file:$rundir/console" \
		-virtfs local,path=/,mount_tag=hostroot,security_model=none,readonly=on,multidevs=remap \
		-virtfs "local,path=$rundir,mount_tag=run,security_model=none,multidevs=remap" \
		-device virtio-rng-pci -qmp "unix:$rundir/qmp,server=on,wait=off" 2>"$rundir/qemu.log" &
	qpid=$!
	watchdog "$qpid" "$rundir" "$smp" &
	wpid=$!
	# Print the command's output while it runs.
	tail -n +1 -f --pid="$qpid" "$rundir/out" &
	lpid=$!
	qrc=0
	wait "$qpid" || qrc=$?
	wait "$lpid" 2>/dev/null || true
	kill "$wpid" 2>/dev/null || true
	wait "$wpid" 2>/dev/null || true
	[ "$qrc" -ne 124 ] || echo "l1: L1 was stopped after $timeout s (--timeout)" >&2
	# QEMU's own warnings (features TCG lacks for a named CPU model) are
	# kept in qemu.log; its errors are shown.
	grep -v "warning: TCG doesn't support requested feature" "$rundir/qemu.log" >&2 || true
	if [ -f "$rundir/rc" ]; then
		rc=$(cat "$rundir/rc")
	elif [ -f "$rundir/frozen" ]; then
		echo "l1: $(cat "$rundir/hung"); L1's kernel text at $(cut -d' ' -f1 "$rundir/ktext" 2>/dev/null) (_text; 0xffffffff81000000 without KASLR); what QEMU said of its vCPUs:" >&2
		cat "$rundir/frozen" >&2
		rc=125
	elif grep -qE "$stopped" "$rundir/console"; then
		# L1's kernel, not the command, stopped: the first report and
		# the backtraces after it (softlockup_all_cpu_backtrace).
		grep -m1 -E "$stopped" "$rundir/console" | tr -d '\r' >"$rundir/hung"
		echo "l1: L1's kernel stopped before the command finished: $(cat "$rundir/hung")" >&2
		echo "l1: L1's console from there:" >&2
		sed -n -E "/$stopped/,\$p" "$rundir/console" | tr -d '\r' | head -120 >&2
		rc=125
	else
		echo "l1: the command left no exit status; L1's console ends:" >&2
		tail -20 "$rundir/console" >&2
		rc=125
	fi
	[ "$keep" = 1 ] || rm -rf "$rundir"
	return "$rc"
}

case ${1:-} in
setup) setup ;;
run) shift; run "$@" ;;
*) die "usage: l1.sh setup | run [--cpu M] [--mem MIB] [--smp N] [--run DIR] [--timeout S] -- CMD" ;;
esac
