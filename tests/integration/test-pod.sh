#!/bin/sh
# One VM per pod (docs/oci.md, "Pods"): capsule-oci driven directly, as
# containerd's CRI drives its runtime, with the CRI annotations in each
# config.json. A sandbox bundle (a pause-like loop) makes the pod's VM;
# two container bundles naming it run in that one VM (one QEMU), each in
# its own root (a file of one is absent from the other), talking over
# 127.0.0.1; exec into a container (exit code, stdin); update of memory
# read back from events --stats; a container over its memory.max is
# OOM-killed (137, the oom file) while the pod lives; what is refused
# (a directory volume, a missing sandbox); kill -9 of the pod's QEMU ends
# every monitor, and delete --force leaves no QEMU, mount or state.
# TAP output.
#
#   tests/integration/test-pod.sh build/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/oci-lib.sh"
plan=31
suite="pod suite"
start=$(date +%s)
echo "1..$plan"
for tool in busybox python3; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
[ "$(id -u)" -eq 0 ] || skip_all "not root: capsule-oci's jail needs root"
oci="$(dirname "$capsule")/capsule-oci"
[ -x "$oci" ] || fail_all "$oci is missing (ninja makes the capsule-oci link)"
root="$rt/root"
b="$rt/b"
O() { "$oci" --root "$root" "$@"; }
pod_cleanup() {
	for c in big c1 c2 sb1; do O delete --force "$c" >/dev/null 2>&1; done
	oci_unmount "$rt"
	cleanup
}
trap pod_cleanup EXIT

# pod_bundle DIR TYPE SANDBOX_ID ARGS_JSON [MEMORY_LIMIT [EXTRA_MOUNTS_JSON]]:
# a bundle as containerd's CRI writes one: the annotations, the mounts it
# gives (proc, /dev tmpfs, devpts, sysfs ro, mqueue, cgroup), and for a
# container /etc/hosts bound from a file of the bundle.
pod_bundle() {
	mkdir -p "$1" && oci_tree "$1/rootfs" && python3 - "$@" <<'PY'
import json, os, sys
d, typ, sid, args = sys.argv[1:5]
d = os.path.abspath(d)
limit = int(sys.argv[5]) if len(sys.argv) > 5 and sys.argv[5] else 0
extra = json.loads(sys.argv[6]) if len(sys.argv) > 6 else []
mounts = [{"destination": "/proc", "type": "proc", "source": "proc", "options": ["nosuid", "noexec", "nodev"]},
          {"destination": "/dev", "type": "tmpfs", "source": "tmpfs",
           "options": ["nosuid", "strictatime", "mode=755", "size=65536k"]},
          {"destination": "/dev/pts", "type": "devpts", "source": "devpts",
           "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620", "gid=5"]},
          {"destination": "/dev/mqueue", "type": "mqueue", "source": "mqueue", "options": ["nosuid", "noexec", "nodev"]},
          {"destination": "/sys", "type": "sysfs", "source": "sysfs", "options": ["nosuid", "noexec", "nodev", "ro"]},
          {"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
           "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]}]
if typ == "container":
    with open(d + "/hosts", "w") as f:
        f.write("127.0.0.1 localhost\n10.88.0.9 pod1-" + os.path.basename(d) + "\n")
    mounts.append({"destination": "/etc/hosts", "type": "bind", "source": d + "/hosts",
                   "options": ["rbind", "rprivate", "rw"]})
mounts += extra
ann = {"io.kubernetes.cri.container-type": typ, "io.kubernetes.cri.sandbox-id": sid,
       "io.kubernetes.cri.sandbox-name": "pod1", "io.kubernetes.cri.sandbox-namespace": "default"}
res = {"memory": {"limit": limit}} if limit else {}
c = {"ociVersion": "1.0.2",
     "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": json.loads(args),
                 "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "cwd": "/"},
     "root": {"path": "rootfs"}, "hostname": "pod1", "annotations": ann, "mounts": mounts,
     "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")],
               "resources": res}}
json.dump(c, open(d + "/config.json", "w"), indent=1)
PY
}
status_of() { O state "$1" 2>/dev/null | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>/dev/null; }
# stat_of ID EXPR: a value of events --stats' data (EXPR: python on d).
stat_of() {
	O events --stats "$1" 2>"$err" | python3 -c 'import json, sys; d = json.load(sys.stdin)["data"]; print('"$2"')' 2>>"$err"
}
alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null && [ "$(cut -d' ' -f3 "/proc/$1/stat" 2>/dev/null)" != Z ]; }

# --- the pod's VM: the sandbox container -------------------------------------
pod_bundle "$b/sb" sandbox sb1 '["sh", "-c", "trap exit TERM; while :; do sleep 1; done"]' || fail_all "cannot make the bundles"
O create --bundle "$b/sb" --pid-file "$b/sb.pid" sb1 </dev/null >"$out" 2>"$err" && O start sb1 >>"$out" 2>>"$err"
check "the sandbox container (container-type sandbox) starts the pod's VM" '[ "$(status_of sb1)" = running ] && [ "$(ours)" -eq 1 ]'
elapsed "sandbox"

# --- two containers in it -------------------------------------------------------
# c1 writes a file in its root; c2 serves on 127.0.0.1:8080 with busybox nc.
pod_bundle "$b/c1" container sb1 '["sh", "-c", "echo one > /only-c1; while :; do sleep 1; done"]' 134217728 &&
	pod_bundle "$b/c2" container sb1 '["sh", "-c", "while :; do echo hello-from-c2 | nc -l -p 8080; done"]' || fail_all "cannot make the bundles"
O create --bundle "$b/c1" --pid-file "$b/c1.pid" c1 </dev/null >"$out" 2>"$err" && O start c1 >>"$out" 2>>"$err"
check "a container of the pod (container-type container) is created and started" '[ "$(status_of c1)" = running ]'
O create --bundle "$b/c2" --pid-file "$b/c2.pid" c2 </dev/null >"$out" 2>"$err" && O start c2 >>"$out" 2>>"$err"
check "a second one too" '[ "$(status_of c2)" = running ]'
check "both run in the pod's one VM: still one QEMU" '[ "$(ours)" -eq 1 ]'
check "they name the sandbox's VM in their state" \
	'[ "$(python3 -c "import json; print(json.load(open(\"$root/c1/state.json\"))[\"sandbox\"])")" = "$(python3 -c "import json; print(json.load(open(\"$root/sb1/state.json\"))[\"sandbox\"])")" ]'
elapsed "two containers"

wait_for 'O exec c1 cat /only-c1 >"$out" 2>"$err"' 100
check "c1's file is in its root" 'grep -qx one "$out"'
O exec c2 sh -c 'ls /only-c1' >"$out" 2>"$err"
rc=$?
check "... and absent from c2's (exit $rc)" '[ "$rc" -ne 0 ]'
O exec c1 cat /etc/hosts >"$out" 2>"$err"
check "the bind-mounted /etc/hosts was copied into c1's root" 'grep -q "pod1-c1" "$out"'
O exec c1 sh -c 'grep -c " / " /proc/mounts; ls /dev/null /dev/pts/ptmx; cat /proc/self/cgroup' >"$out" 2>"$err"
check "c1 has its own root, /dev with nodes and devpts, and its own cgroup" \
	'[ -s "$out" ] && grep -q "^/dev/null$" "$out" && grep -q "ctr-c1" "$out"'
# The answer of the try that got one: wait_for tries its condition once
# more after it held, and that try may find c2 between two listens.
rm -f "$rt/nc-ok"
wait_for '[ -s "$rt/nc-ok" ] || { O exec c1 sh -c "nc 127.0.0.1 8080 </dev/null" >"$out" 2>"$err" && grep -q hello-from-c2 "$out" && cp "$out" "$rt/nc-ok"; }' 100
[ -s "$rt/nc-ok" ] && cp "$rt/nc-ok" "$out"
check "c1 reaches c2 over 127.0.0.1 (the pod's network namespace)" 'grep -qx hello-from-c2 "$out"'
O exec c1 hostname >"$out" 2>"$err"
check "they share the pod's hostname" 'grep -qx pod1 "$out"'
elapsed "isolation and localhost"

# --- exec ------------------------------------------------------------------------
O exec c2 sh -c 'echo in-c2; exit 5' >"$out" 2>"$err"
rc=$?
check "exec in a pod's container exits with its status (5; got $rc)" '[ "$rc" -eq 5 ] && grep -qx in-c2 "$out"'
printf 'abc\n' | O exec c1 sh -c 'read x; echo "got $x"; ls /only-c1' >"$out" 2>"$err"
check "exec passes stdin, in the container's own root" 'grep -qx "got abc" "$out" && grep -qx /only-c1 "$out"'

# --- update and stats --------------------------------------------------------------
check "events --stats reports c1's memory limit from its config (128 MiB)" '[ "$(stat_of c1 "d[\"memory\"][\"usage\"][\"limit\"]")" = 134217728 ]'
echo '{"memory": {"limit": 100663296}, "pids": {"limit": 64}}' | O update --resources - c1 >"$out" 2>"$err"
rc=$?
check "update --resources - sets c1's memory and pids (exit $rc)" '[ "$rc" -eq 0 ]'
got=$(stat_of c1 "(d[\"memory\"][\"usage\"][\"limit\"], d[\"pids\"][\"limit\"])")
check "... which events --stats reads back from the guest's cgroup ($got)" '[ "$got" = "(100663296, 64)" ]'
check "events --stats has CPU time and memory in use" '[ "$(stat_of c1 "d[\"cpu\"][\"usage\"][\"total\"] > 0 and d[\"memory\"][\"usage\"][\"usage\"] > 0")" = True ]'
echo '{"cpu": {"quota": 50000, "period": 100000}}' | O update --resources - c1 >"$out" 2>"$err"
rc=$?
check "update sets a CPU quota (cpu.max; exit $rc)" '[ "$rc" -eq 0 ]'
check "events --stats of the sandbox is the whole VM (its RAM as the limit)" \
	'[ "$(stat_of sb1 "d[\"memory\"][\"usage\"][\"limit\"] > 256 << 20 and d[\"pids\"][\"current\"] > 3")" = True ]'
echo '{"memory": {"limit": 100663296}}' | O update --resources - sb1 >"$out" 2>"$err"
rc=$?
check "update of the sandbox is refused, naming why (exit $rc)" '[ "$rc" -ne 0 ] && grep -q "sized when it is created" "$err"'
elapsed "update and stats"

# --- OOM -----------------------------------------------------------------------------
pod_bundle "$b/big" container sb1 '["sh", "-c", "dd if=/dev/zero of=/dev/null bs=96M count=1; echo survived"]' 33554432 ||
	fail_all "cannot make the bundles"
O create --bundle "$b/big" --pid-file "$b/big.pid" big </dev/null >"$out" 2>"$err" && O start big >>"$out" 2>>"$err"
wait_for '[ -f "$root/big/exit" ]' 600
check "a container over its memory.max is OOM-killed in the VM: exit 137 ($(cat "$root/big/exit" 2>/dev/null))" \
	'[ "$(cat "$root/big/exit" 2>/dev/null)" = 137 ]'
check "... its monitor says so in its state directory (oom)" '[ -f "$root/big/oom" ]'
check "... while the pod and its other containers live" '[ "$(status_of c1)" = running ] && [ "$(status_of sb1)" = running ] && [ "$(ours)" -eq 1 ]'
O delete big >"$out" 2>"$err"
check "delete of the stopped container removes its state" '[ ! -d "$root/big" ]'
elapsed "oom"

# --- what is refused ----------------------------------------------------------------
mkdir -p "$rt/hostdir"
pod_bundle "$b/vol" container sb1 '["true"]' "" '[{"destination": "/data", "type": "bind", "source": "'"$rt/hostdir"'", "options": ["rbind"]}]'
O create --bundle "$b/vol" vol </dev/null >"$out" 2>"$err"
rc=$?
check "a bind-mounted host directory (not emptyDir) is refused, naming it (exit $rc)" '[ "$rc" -ne 0 ] && grep -q "$rt/hostdir" "$err" && [ ! -d "$root/vol" ]'
pod_bundle "$b/orphan" container nosuchpod '["true"]'
O create --bundle "$b/orphan" orphan </dev/null >"$out" 2>"$err"
rc=$?
check "a container whose sandbox does not exist is refused, naming it (exit $rc)" '[ "$rc" -ne 0 ] && grep -q nosuchpod "$err"'

# --- kill -9 of the pod's QEMU ---------------------------------------------------------
q=$(pgrep -f "qemu-system.*$rt/")
kill -9 $q 2>/dev/null
p1=$(cat "$b/c1.pid"); p2=$(cat "$b/c2.pid"); ps=$(cat "$b/sb.pid")
wait_for '! alive "$p1" && ! alive "$p2" && ! alive "$ps"' 300
check "kill -9 of the pod's QEMU: every monitor exits promptly" '! alive "$p1" && ! alive "$p2" && ! alive "$ps"'
check "... non-zero (137), and state calls each stopped" \
	'[ "$(cat "$root/c1/exit")" = 137 ] && [ "$(cat "$root/c2/exit")" = 137 ] && [ "$(status_of c1)" = stopped ] && [ "$(status_of sb1)" = stopped ]'
for c in c1 c2 sb1; do O delete --force "$c" >>"$out" 2>>"$err"; done
check "delete --force of each removes every state directory" '[ -z "$(ls -A "$root" 2>/dev/null)" ]'
check "... the pod's sandbox and disks" '[ -z "$(ls -A "$CAPSULE_HOME/sandboxes" 2>/dev/null)" ]'
check "... and leaves no QEMU and no mount" '[ "$(ours)" -eq 0 ] && ! grep -q "$rt/" /proc/mounts'
elapsed "kill -9"
[ "$nfail" -eq 0 ]
