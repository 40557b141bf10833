#!/bin/sh
# make bench's row (q): host memory held per idle sandbox under KVM beside
# the same under TCG, in one run (issue 31). The measurement is row (p)'s,
# bench/bench-density.py with the template's RAM shared, once per
# accelerator: TCG on this host, and KVM on this host when its KVM is
# usable, else in an L1 guest with nested KVM (tests/kvm/l1.sh: QEMU's
# TCG with -cpu max emulates AMD SVM). Memory held in L1 is what a KVM
# host holds; times there are not (L1 runs at TCG speed): the times
# printed are labelled nested and compared with nothing, and the CPU
# figures are not taken (BENCH_DENSITY_CPU=0).
#
#   bench/bench-kvm.sh CAPSULE BENCH_PAUSE [DENSITY_FILE...]
#
# Prints row (q)'s lines in make bench's table layout (bench/run.sh),
# progress on stderr. A DENSITY_FILE is a bench-density output of the
# same run (row (p)'s shared-RAM pass), used for the column of the
# accelerator its sandboxes ran under instead of measuring it again.
# Each column says which accelerator its QEMUs were started with; the
# KVM column fails unless that is kvm and, in L1, `capsule doctor
# --json` there said accel kvm. A pass cut short keeps the N it finished.
#
# In L1 each sandbox takes ~6 s to create, start and pause (nested), so
# N = 50 makes the L1 part about 5 minutes on this 2-core host (298 s and
# 345 s in two runs, its boot and the template's build included);
# BENCH_KVM_N="1 10" takes about 2.
#
# Environment: BENCH_KVM_N, the N to measure (default "1 10 50");
# BENCH_KVM_L1_MEM, L1's memory in MiB (default 4096: 50 idle sandboxes
# and the bench's CAPSULE_HOME in L1's tmpfs /tmp took about 1.3 GiB of
# 8 GiB here; row (q) prints what was left at the largest N);
# BENCH_KVM_L1_SMP, its vCPUs (default 1: with 2, starts in L1 were
# slower here, the host's two cores being shared).
set -u
capsule=$(readlink -f "$1")
pause=$(readlink -f "$2")
shift 2
top=$(cd "$(dirname "$0")/.." && pwd)
density="$top/bench/bench-density.py"
ns=${BENCH_KVM_N:-1 10 50}
l1_mem=${BENCH_KVM_L1_MEM:-4096}
l1_smp=${BENCH_KVM_L1_SMP:-1}
work=$(mktemp -d /tmp/capsule-bench-kvm.XXXXXX)
trap 'rm -rf "$work"' EXIT
: >"$work/tcg"
: >"$work/kvm"
kvm_where="this host"
why=""
l1_doctor=""
l1_s=""

# config KEY FILE: the value of bench-density's last "config KEY" line.
config() { awk -v k="$1" '$1 == "config" && $2 == k { v = $3 } END { print v }' "$2"; }

for f in "$@"; do
	a=$(config accel "$f")
	if [ "$a" = tcg ] || [ "$a" = kvm ]; then
		[ -s "$work/$a" ] || cp "$f" "$work/$a"
	fi
done

host_accel=$("$capsule" doctor --json 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["accel"]["name"] or "none")' 2>/dev/null)
if [ ! -s "$work/tcg" ]; then
	echo "bench: KVM vs TCG: idle sandboxes under TCG on this host, N = $ns..." >&2
	# shellcheck disable=SC2086
	CAPSULE_ACCEL=tcg BENCH_DENSITY_CPU=0 python3 "$density" "$capsule" "$pause" $ns >"$work/tcg" 2>"$work/tcg.err" || true
fi
if [ ! -s "$work/kvm" ] && [ "$host_accel" = kvm ]; then
	echo "bench: KVM vs TCG: idle sandboxes under KVM on this host, N = $ns..." >&2
	# shellcheck disable=SC2086
	CAPSULE_ACCEL=kvm CAPSULE_REQUIRE_KVM=1 BENCH_DENSITY_CPU=0 python3 "$density" "$capsule" "$pause" $ns >"$work/kvm" 2>"$work/kvm.err" || true
elif [ ! -s "$work/kvm" ]; then
	kvm_where="L1"
	echo "bench: KVM vs TCG: no usable KVM here ($host_accel); idle sandboxes under KVM in an L1 guest ($l1_mem MiB, $l1_smp vCPUs, nested SVM under TCG), N = $ns..." >&2
	mkdir -p "$work/l1"
	# In L1, /dev/kvm is devtmpfs's crw------- root root, as it is left:
	# the jail makes its own node. Doctor must say kvm there, or the
	# column fails.
	# shellcheck disable=SC2016
	cmd='a=$("$1" doctor --json | python3 -c "import json, sys; print(json.load(sys.stdin)[\"accel\"][\"name\"] or \"none\")")
		echo "$a" >"$4/doctor-accel"
		[ "$a" = kvm ] || { echo "bench: capsule doctor in L1 says accel $a, not kvm" >"$4/kvm.err"; exit 3; }
		CAPSULE_ACCEL=kvm CAPSULE_REQUIRE_KVM=1 BENCH_DENSITY_CPU=0 python3 "$3" "$1" "$2" $5 >"$4/kvm" 2>"$4/kvm.err"'
	t0=$(date +%s)
	"$top/tests/kvm/l1.sh" run --mem "$l1_mem" --smp "$l1_smp" --run "$work/l1" --timeout 1200 -- \
		"set -- '$capsule' '$pause' '$density' '$work/l1' '$ns'; $cmd" >"$work/l1.out" 2>&1
	rc=$?
	l1_s=$(( $(date +%s) - t0 ))
	cp "$work/l1/kvm" "$work/kvm" 2>/dev/null
	cat "$work/l1/kvm.err" >"$work/kvm.err" 2>/dev/null
	l1_doctor=$(cat "$work/l1/doctor-accel" 2>/dev/null)
	if [ "$rc" != 0 ]; then
		why="L1 run exited $rc"
		[ -n "$l1_doctor" ] && [ "$l1_doctor" != kvm ] && why="capsule doctor in L1 said accel $l1_doctor"
		echo "bench: KVM vs TCG: $why; its output, errors and L1's console end:" >&2
		for f in "$work/l1.out" "$work/kvm.err" "$work/l1/console"; do
			[ -s "$f" ] && tail -n 8 "$f" >&2
		done
	fi
fi
for c in tcg kvm; do
	if [ -s "$work/$c.err" ] && [ "$(config seconds "$work/$c")" = "" ]; then
		echo "bench: KVM vs TCG: the $c pass failed; its errors end:" >&2
		tail -5 "$work/$c.err" >&2
	fi
done

tcg_accel=$(config accel "$work/tcg")
kvm_accel=$(config accel "$work/kvm")
# A column counts only if its QEMUs ran under its accelerator (and, in
# L1, doctor said kvm).
[ "$tcg_accel" = tcg ] || : >"$work/tcg"
if [ "$kvm_accel" != kvm ] || { [ "$kvm_where" = L1 ] && [ "$l1_doctor" != kvm ]; }; then
	: >"$work/kvm"
fi

# dn COLUMN FIELD KEY...: field FIELD of the line starting with KEY.
dn() { dn_f=$1 dn_c=$2; shift 2; awk -v k="$* " -v c="$dn_c" 'index($0, k) == 1 { print $c }' "$work/$dn_f"; }
dn_mib() {	# label a b: a row of two KiB figures, "failed" for a missing one
	awk -v m="$1" -v a="$2" -v b="$3" 'BEGIN {
		if (a > 0 && b > 0) printf "%-59s %8.1fMiB %8.1fMiB %7.2fx\n", m, a / 1024, b / 1024, a / b
		else printf "%-59s %12s %12s %8s\n", m, (a > 0) ? sprintf("%8.1fMiB", a / 1024) : "failed", (b > 0) ? sprintf("%8.1fMiB", b / 1024) : "failed", "-" }'
}

if [ "$kvm_where" = L1 ]; then
	k_label="${kvm_accel:-${l1_doctor:-?}} in L1"
else
	k_label=${kvm_accel:-failed}
fi
printf '%-59s %12s %12s %8s\n' "(q) accelerator the QEMUs ran under: KVM vs TCG column" "$k_label" "${tcg_accel:-failed}" "-"
for n in $ns; do
	for st in paused running; do
		dn_mib "(q) held per $st sandbox, N=$n: KVM vs TCG" "$(dn kvm 4 held "$st" "$n")" "$(dn tcg 4 held "$st" "$n")"
	done
done
# Where the difference is: the parts of "held" at the largest N, running.
n=$(echo "$ns" | tr ' ' '\n' | sort -n | tail -1)
for c in kvm tcg; do
	dn $c 0 parts running "$n" | awk -v c="$c" -v n="$n" '{
		printf "%-59s %s\n", "(q) " toupper(c) ", N=" n " running, MiB each:", sprintf("VM anon %.1f, shmem %.1f, kernel %.1f; shims %.1f; holder %.1f", $4 / 1024, $5 / 1024, $6 / 1024, $7 / 1024, $8 / 1024) }'
done
if [ "$kvm_where" = L1 ]; then
	# How much room L1 had left at the largest N.
	awk -v n="$n" '$1 == "avail" && $2 == "paused" && $3 == n {
		printf "%-59s %8.0fMiB %8.0fMiB %7.2fx\n", "(q) L1 at N=" n " paused: memory available vs its total", $4 / 1024, $5 / 1024, $4 / $5 }' "$work/kvm"
	s=$(config seconds "$work/kvm")
	printf '%-59s %s\n' "(q) KVM in L1, nested times (not compared):" "density pass ${s:-failed}${s:+ s}, L1 boot to power-off $l1_s s"
fi
