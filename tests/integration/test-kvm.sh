#!/bin/sh
# The KVM suite (docs/architecture.md, "Acceleration"): capsule under
# KVM, on a host with usable KVM directly, otherwise inside an L1 guest
# that has it (tests/kvm/l1.sh: nested SVM under TCG, built from Debian's
# kernel package), and says which. In L1: tests/kvm/suite.sh (run, a
# template under KVM, a named sandbox's lifecycle, kill -9 and recovery,
# CAPSULE_REQUIRE_KVM, the jail's /dev/kvm, the OCI runtime on cgroup
# v2), the jail suite on cgroup v2, a network policy on a fake internet
# inside L1 and serve's idle pause; then L1 booted again with another CPU
# model, where the template made on the first must not be restored.
# TAP output (several plans, one per part).
#   tests/integration/test-kvm.sh BUILD/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(dirname "$capsule")
top=$(cd "$(dirname "$0")/../.." && pwd)
cd "$top" || exit 1
l1=tests/kvm/l1.sh
# What runs under KVM: each part prints its own plan.
parts="tests/kvm/suite.sh $capsule
tests/integration/test-jail.sh $capsule
tests/kvm/check-net.sh $capsule
tests/kvm/check-serve.py $capsule"

direct=false
"$capsule" doctor >/tmp/kvm-doctor.$$ 2>&1
grep -q '^accel: *kvm' /tmp/kvm-doctor.$$ && direct=true
rm -f /tmp/kvm-doctor.$$
if $direct; then
	echo "# this host has usable KVM: the KVM suite runs here"
	echo "$parts" | while read -r script arg; do
		[ -x "$script" ] && "$script" "$arg"
	done
	echo "1..1"
	echo "ok 1 - the template key follows the CPU model # SKIP this host's CPU cannot be changed (it is checked in L1 on hosts without KVM)"
	exit 0
fi

echo "# no usable KVM on this host: the KVM suite runs in an L1 guest (TCG -cpu max with nested SVM; tests/kvm/l1.sh)"
start=$(date +%s)
if ! dir=$("$l1" setup); then
	echo "1..1"
	echo "not ok 1 - cannot make the L1 guest (tests/kvm/l1.sh setup failed; its message is above)"
	exit 1
fi
echo "# L1 kernel: $(cat "$dir/ready") ($dir)"
run=$(mktemp -d /tmp/kvmrun.XXXXXX)
trap 'rm -rf "$run"' EXIT
cmds="unset CAPSULE_TEST_SHARE; "$(echo "$parts" | while read -r script arg; do
	printf '%s %s; ' "$script" "$arg"
done)
"$l1" run --mem 6144 --smp 2 --run "$run" --timeout 900 -- "$cmds"
echo "# L1, first boot: $(($(date +%s) - start)) s"

# The CPU model: a template made on one CPU is not restored on another.
# The state is kept in $run (the shared directory) across two boots.
t0=$(date +%s)
# CAPSULE_HOME stays on L1's tmpfs (QEMU cannot map guest RAM from a
# file on 9p) and is carried between the boots as a sparse tar in $run.
cpucheck='
	export XDG_RUNTIME_DIR=$(mktemp -d) CAPSULE_HOME=/tmp/home
	mkdir -p $CAPSULE_HOME
	[ -f $0/home.tar ] && tar -C $CAPSULE_HOME -xSf $0/home.tar
	grep -m1 "^model name" /proc/cpuinfo | sed "s/^/# L1 CPU: /"
	capsule=$1
	$capsule run -q -v -- true 2>$0/err-$2
	echo "rc=$?" >>$0/err-$2
	$capsule template ls --json >$0/templates-$2
	tar -C $CAPSULE_HOME -cSf $0/home.tar .
'
"$l1" run --mem 2048 --run "$run" --timeout 300 -- "sh -c '$cpucheck' $run $capsule max"
"$l1" run --cpu EPYC,+svm,+npt --mem 2048 --run "$run" --timeout 300 -- "sh -c '$cpucheck' $run $capsule epyc"
echo "1..3"
n() { python3 -c 'import json, sys; print(len(json.load(open(sys.argv[1]))))' "$1" 2>/dev/null; }
if grep -q rc=0 "$run/err-max" && [ "$(n "$run/templates-max")" = 1 ]; then
	echo "ok 1 - L1 with -cpu max: a run builds a KVM template"
else
	echo "not ok 1 - L1 with -cpu max: a run builds a KVM template"
	sed 's/^/# /' "$run/err-max" 2>/dev/null | tail -5
fi
if grep -q rc=0 "$run/err-epyc"; then
	echo "ok 2 - L1 with -cpu EPYC: the run works"
else
	echo "not ok 2 - L1 with -cpu EPYC: the run works"
	sed 's/^/# /' "$run/err-epyc" 2>/dev/null | tail -5
fi
# The first boot's template is listed as made on another CPU.
stale() { python3 -c 'import json, sys; print(sum(1 for t in json.load(open(sys.argv[1])) if "cpu" in t.get("host_mismatch", [])))' "$1" 2>/dev/null; }
if [ "$(n "$run/templates-epyc")" = 2 ] && [ "$(stale "$run/templates-epyc")" = 1 ]; then
	echo "ok 3 - another CPU model makes another template instead of restoring the first"
else
	echo "not ok 3 - another CPU model makes another template instead of restoring the first ($(n "$run/templates-epyc") templates)"
fi
echo "# L1, two boots for the CPU model: $(($(date +%s) - t0)) s"
echo "# KVM suite: $(($(date +%s) - start)) s"
