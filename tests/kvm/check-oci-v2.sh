#!/bin/sh
# The OCI runtime's cgroup v2 path, driven the way runc's callers drive
# it (create, start, state, kill, delete; no Podman): a container's
# cgroupsPath made in the unified tree, limited as linux.resources says
# (memory.max, pids.max, cpu.weight, cpu.max), the monitor in its leaf
# "capsule", the VM's QEMU in the jail's vm-N beside it with the
# controllers handed down, and delete removing what create made.
# Run by tests/kvm/suite.sh on a cgroup v2 host; prints what it saw and
# exits 0 only when every step held.
#   tests/kvm/check-oci-v2.sh BUILD
set -u
build=$1
oci=$(cd "$build" && pwd)/capsule-oci
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../integration/oci-lib.sh"
t=$(mktemp -d /tmp/ociv2.XXXXXX)
state=$t/state
cg=/capsule-oci-v2-$$
trap 'o delete --force v2 >/dev/null 2>&1; rmdir /sys/fs/cgroup$cg/capsule /sys/fs/cgroup$cg 2>/dev/null; rm -rf "$t"' EXIT
export CAPSULE_HOME=${CAPSULE_HOME:-$t/home}
o() { timeout 60 "$oci" --root "$state" "$@"; }
bad=0
say() { echo "$1"; }
need() { # need WHAT 'CONDITION'
	if eval "$2"; then say "ok: $1"; else say "FAILED: $1 ($2)"; bad=$((bad + 1)); fi
}

oci_tree "$t/root" || { echo "cannot make a busybox tree in $t/root"; exit 1; }
oci_bundle "$t/b" "$t/root" "$cg" '["sh", "-c", "echo started; exec sleep 600"]'
# linux.resources: 300 MiB, 200 PIDs, 512 shares, half a CPU.
python3 - "$t/b/config.json" <<'PY'
import json, sys
p = sys.argv[1]
c = json.load(open(p))
c["linux"]["resources"] = {"memory": {"limit": 314572800}, "pids": {"limit": 200},
                           "cpu": {"shares": 512, "quota": 50000, "period": 100000}}
json.dump(c, open(p, "w"), indent=1)
PY
o create --bundle "$t/b" --pid-file "$t/pid" v2 </dev/null >"$t/out" 2>"$t/err" && o start v2 2>>"$t/err"
rc=$?
need "create and start ($rc)" '[ "$rc" -eq 0 ]'
[ "$rc" -eq 0 ] || sed 's/^/  stderr: /' "$t/err"
d=/sys/fs/cgroup$cg
say "cgroup $d: memory.max $(cat "$d/memory.max" 2>&1), pids.max $(cat "$d/pids.max" 2>&1), cpu.weight $(cat "$d/cpu.weight" 2>&1), cpu.max $(cat "$d/cpu.max" 2>&1)"
say "  subtree_control: $(cat "$d/cgroup.subtree_control" 2>&1); below it: $(cd "$d" 2>/dev/null && ls -d -- */ 2>/dev/null | tr '\n' ' ')"
need "memory.max is 314572800" '[ "$(cat "$d/memory.max" 2>/dev/null)" = 314572800 ]'
need "pids.max is 200" '[ "$(cat "$d/pids.max" 2>/dev/null)" = 200 ]'
need "cpu.weight is runc'\''s conversion of 512 shares (20)" '[ "$(cat "$d/cpu.weight" 2>/dev/null)" = 20 ]'
need "cpu.max is 50000 100000" '[ "$(cat "$d/cpu.max" 2>/dev/null)" = "50000 100000" ]'
need "memory, pids and cpu are handed down below it" 'for k in memory pids cpu; do grep -qw "$k" "$d/cgroup.subtree_control" || exit 1; done'
mon=$(cat "$t/pid" 2>/dev/null)
need "the monitor ($mon) is in the leaf $cg/capsule" '[ -n "$mon" ] && grep -qx "0::$cg/capsule" "/proc/$mon/cgroup"'
qemu=$(pgrep -f "qemu-system.*$CAPSULE_HOME/" | head -1)
qcg=$(sed -n 's/^0:://p' "/proc/$qemu/cgroup" 2>/dev/null)
say "QEMU $qemu in $qcg: memory.max $(cat "/sys/fs/cgroup$qcg/memory.max" 2>&1)"
need "QEMU is in a vm-N folder below the cgroupsPath, not in the leaf" 'echo "$qcg" | grep -q "^$cg/vm-[0-9]*$"'
need "no process sits in $cg itself (v2: no internal processes)" '[ -z "$(cat "$d/cgroup.procs")" ]'
st=$(o state v2 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null)
need "state says running ($st)" '[ "$st" = running ]'
o kill v2 KILL 2>>"$t/err"
i=0
while [ -n "$mon" ] && kill -0 "$mon" 2>/dev/null && [ $i -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
o delete --force v2 >/dev/null 2>>"$t/err"
rc=$?
i=0
while [ -d "$d" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
need "kill and delete --force ($rc) remove the cgroup and leave no QEMU" '[ "$rc" -eq 0 ] && [ ! -d "$d" ] && ! pgrep -f "qemu-system.*$CAPSULE_HOME/" >/dev/null'
[ "$bad" -eq 0 ]
