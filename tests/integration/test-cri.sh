#!/bin/sh
# Kubernetes pods through containerd's CRI plugin (docs/oci.md,
# "Kubernetes (CRI)"), the suite playing the kubelet: tests/cri/cri.py
# speaks the CRI (runtime.v1, tests/cri/api.proto) to a private
# containerd in a network namespace of the suite's own
# (tests/integration/cri-lib.sh: CNI bridge, loopback registry, streaming
# server, all in there). The images come from the loopback registry by
# PullImage. Cases: a pod of two containers that talk over 127.0.0.1; a
# second pod that reaches the first by its pod IP; ExecSync (exit code,
# stdout, stderr), Exec with stdin and with a terminal through the
# streaming server (WebSocket, v4.channel.k8s.io); PortForward to a
# server that listens on the pod's 127.0.0.1 only; UpdateContainerResources
# of the memory limit, seen in ContainerStatus, ContainerStats and the
# container's cgroup; the container log in the CRI format; StopContainer
# with a grace period; stop and remove of pods; a container over its
# memory limit OOM-killed while its pod lives; kill -9 of the pod's QEMU
# and of its shim. After each case: no QEMU, shim, mount, network
# namespace, CNI lease, container cgroup or capsule sandbox of its pods
# is left. TAP output.
#
#   tests/integration/test-cri.sh build/capsule
# CAPSULE_CRI_RUNTIME picks the runtime handler the pods run with:
# capsule (the default: containerd-shim-capsule-v2 beside build/capsule)
# or runc (to check this harness itself against containerd's own shim;
# the checks only a VM can pass are skipped then, each saying so).
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
top=$(cd "$here/../.." && pwd)
. "$here/lib.sh"
. "$here/oci-lib.sh"
. "$here/cri-lib.sh"
runtime=${CAPSULE_CRI_RUNTIME:-capsule}
plan=55
suite="cri suite"
start=$(date +%s)
echo "1..$plan"

[ "$(id -u)" -eq 0 ] || skip_all "not root: containerd, network namespaces and the jail need it"
for tool in containerd nsenter ip skopeo docker-registry busybox curl; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
for p in bridge host-local loopback portmap; do
	[ -x "/usr/lib/cni/$p" ] || fail_all "/usr/lib/cni/$p is missing (apt-get install containernetworking-plugins)"
done
/usr/bin/python3 -c 'import grpc, grpc_tools' 2>/dev/null ||
	fail_all "/usr/bin/python3 has no grpc or grpc_tools (apt-get install python3-grpcio python3-grpc-tools)"
case $runtime in
capsule)
	[ -x "$(dirname "$capsule")/containerd-shim-capsule-v2" ] ||
		fail_all "$(dirname "$capsule")/containerd-shim-capsule-v2 is missing (ninja builds it)"
	vm=1 ;;
runc)
	command -v containerd-shim-runc-v2 >/dev/null && command -v runc >/dev/null ||
		fail_all "runc or containerd-shim-runc-v2 is not installed"
	vm=0 ;;
*) fail_all "CAPSULE_CRI_RUNTIME=$runtime: capsule or runc" ;;
esac
export CRI_RUNTIME_HANDLER="$runtime"
novm="runc runs no VM (CAPSULE_CRI_RUNTIME=runc)"
vmcheck() { # vmcheck NAME 'CONDITION': only with a VM per pod
	if [ "$vm" -eq 1 ]; then check "$@"; else skip "$1" "$novm"; fi
}

ns=capsule-cri-$$
host_links() { ip -o link show | awk '{ print $2 }' | sort; ip -o addr show | awk '{ print $2, $4 }' | sort; }
host_links >"$rt/links-before"
trap 'cri_env_stop; oci_unmount "$rt"; cleanup' EXIT
cri_env_start "$rt/cri-env" "$ns" "$(dirname "$capsule")" || fail_all "$cri_why"
B=$cri_busybox

# What a case may leave: QEMU of this suite's home, shims of this
# containerd, mounts under its root and state (rootfs, shm, netns), the
# pods' netns files, CNI leases, container cgroups below the pods' parents
# (the parents are the kubelet's), capsule sandboxes, pods.
leases() { ls "$cri_dir/cni/ipam/$cri_net" 2>/dev/null | grep -c "^$cri_subnet\."; }
mounts() { awk -v d="$cri_dir/c/" 'index($2, d) == 1' /proc/mounts | wc -l; }
netnses() { ls "$cri_dir/c/state/io.containerd.grpc.v1.cri/netns" 2>/dev/null | wc -l; }
cgroups() { find /sys/fs/cgroup/*"$cri_cgroup" -mindepth 2 -type d 2>/dev/null | wc -l; }
sandboxes() { ls "$CAPSULE_HOME/sandboxes" 2>/dev/null | wc -l; }
what_left() {
	echo "qemu $(ours) shims $(cri_shims | wc -l) mounts $(mounts) netns $(netnses) leases $(leases) cgroups $(cgroups) sandboxes $(sandboxes) pods $(cri pods -q 2>/dev/null | wc -l)"
}
nothing_left() { [ "$(what_left)" = "qemu 0 shims 0 mounts 0 netns 0 leases 0 cgroups 0 sandboxes 0 pods 0" ]; }
clean_case() { # clean_case NAME: after its pods were removed
	if wait_for nothing_left 300; then ok "$1: nothing is left (QEMU, shim, mount, netns, CNI lease, cgroup, sandbox)"
	else not_ok "$1: nothing is left" "left: $(what_left)"; context; fi
}
# On a failure: what containerd and the shims said.
context() {
	grep 'level=error' "$cri_dir/c/log" | tail -5 | cut -c1-400 | sed 's/^/# containerd: /'
}
checkc() { # checkc NAME 'CONDITION': check, with containerd's errors on failure
	if eval "$2"; then ok "$1"; else not_ok "$1" "failed: $2"; context; fi
}
# sleeper_pod NAME: a pod NAME running one container "sleeper"; sets
# $pod, $ctr and $rc (0 when both calls succeeded).
sleeper_pod() {
	pod=$(cri runp "$1" --cgroup-parent "$cri_cgroup/$1" 2>"$err")
	ctr=$(cri create "$pod" sleeper "$B" -- sleep 100000 2>>"$err") && cri start "$ctr" 2>>"$err"
	rc=$?
}
# remove_pod POD CASE: StopPodSandbox and RemovePodSandbox of POD, checked,
# then nothing of CASE is left.
remove_pod() {
	cri stopp "$1" >"$out" 2>"$err" && cri rmp "$1" >>"$out" 2>>"$err"
	rc=$?
	checkc "the pod stops and is removed after it ($rc)" '[ "$rc" -eq 0 ] && [ -z "$(cri pods -q)" ]'
	clean_case "$2"
}
# field JSON-FILE EXPRESSION: a value of cri.py's JSON (j is the object).
field() { /usr/bin/python3 -c 'import json, sys; j = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2" 2>/dev/null; }
state() { cri state "$1" 2>/dev/null; }
podstate() { cri pods 2>/dev/null | awk -v p="$1" '$1 == p { print $3 }'; }

v=$(cri version 2>"$err")
checkc "containerd's CRI answers Version in namespace $ns ($v)" 'echo "$v" | grep -q "^containerd .* v1$"'
cri status >"$out" 2>"$err"
checkc "Status: RuntimeReady and NetworkReady (CNI: $cri_net in $cri_dir/cni/net.d)" \
	'[ "$(field "$out" "\" \".join(sorted(c[\"type\"] for c in j[\"status\"][\"conditions\"] if c.get(\"status\")))")" = "NetworkReady RuntimeReady" ]'
cri pull "$cri_pause" >"$out" 2>"$err" && cri pull "$B" >>"$out" 2>>"$err"
checkc "PullImage pulls the pause and busybox images from the loopback registry" \
	'[ "$(grep -c "^sha256:" "$out")" -eq 2 ] && cri inspecti "$B" >/dev/null 2>&1 && cri inspecti "$cri_pause" >/dev/null 2>&1'
if [ "$vm" -eq 1 ]; then
	kver=$("$capsule" run -q -- uname -r 2>"$err")
else
	kver=$(uname -r)
fi
elapsed "containerd and images"

# --- a pod of two containers that talk over 127.0.0.1 --------------------------
# server: one httpd on 127.0.0.1:8080 only, one on every address :8081.
p1=$(cri runp web --cgroup-parent "$cri_cgroup/web" 2>"$err")
checkc "RunPodSandbox ($runtime) starts pod web, READY" '[ -n "$p1" ] && [ "$(podstate "$p1")" = SANDBOX_READY ]'
ip1=$(cri podip "$p1" 2>"$err")
checkc "PodSandboxStatus.network.ip is its CNI address ($ip1)" 'echo "$ip1" | grep -q "^$cri_subnet\.[0-9]*$"'
srv=$(cri create "$p1" server "$B" -- sh -c '
	mkdir -p /www && echo "page of pod web" >/www/index.html && hostname >/www/host
	httpd -p 127.0.0.1:8080 -h /www && httpd -f -p 8081 -h /www' 2>"$err") && cri start "$srv" 2>>"$err"
rc=$?
cli=$(cri create "$p1" client "$B" -- sh -c '
	i=0; until wget -q -O - http://127.0.0.1:8080/; do i=$((i + 1)); [ $i -lt 300 ] || exit 9; sleep 0.1; done
	wget -q -O - http://127.0.0.1:8080/host; echo "client on $(hostname)"; exec sleep 100000' 2>>"$err") && cri start "$cli" 2>>"$err"
rc2=$?
checkc "CreateContainer and StartContainer: a server and a client container ($rc, $rc2)" \
	'[ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$(state "$srv")" = CONTAINER_RUNNING ] && [ "$(state "$cli")" = CONTAINER_RUNNING ]'
checkc "the client reads the server's page over 127.0.0.1:8080 (its log)" \
	'wait_for "cri logs $cli 2>/dev/null | grep -qx \"page of pod web\"" 600'
cri logs "$cli" >"$out" 2>"$err"
checkc "... both containers have the pod's hostname, web (UTS shared)" 'grep -qx web "$out" && grep -qx "client on web" "$out"'
cri ps --pod "$p1" >"$out" 2>"$err"
checkc "ListContainers lists both in the pod, RUNNING" '[ "$(grep -c " CONTAINER_RUNNING $p1$" "$out")" -eq 2 ]'
vmcheck "the pod is one VM: one QEMU for its two containers" '[ "$(ours)" -eq 1 ]'
kr=$(cri exec-sync "$cli" -- uname -r 2>"$err")
if [ "$vm" -eq 1 ]; then
	checkc "ExecSync uname -r in the pod prints the capsule kernel's release ($kr; capsule run: $kver; host $(uname -r))" \
		'[ -n "$kr" ] && [ "$kr" = "$kver" ] && [ "$kr" != "$(uname -r)" ]'
else
	checkc "ExecSync uname -r in the pod prints the host's release under runc ($kr)" '[ "$kr" = "$kver" ]'
fi
host_links >"$rt/links-now"
checkc "the CNI bridge and the pod's veth are in the suite's namespace only: the host's links and addresses are as they were" \
	'cmp -s "$rt/links-before" "$rt/links-now" && ip -n "$ns" -o link show | grep -q cni-capsule0 && ! ip -o link show | grep -q cni-capsule0'
elapsed "pod web"

# --- a second pod reaches the first by its pod IP ------------------------------
p2=$(cri runp web2 --cgroup-parent "$cri_cgroup/web2" 2>"$err")
c3=$(cri create "$p2" other "$B" -- sleep 100000 2>>"$err") && cri start "$c3" 2>>"$err"
rc=$?
ip2=$(cri podip "$p2" 2>>"$err")
checkc "a second pod, web2, runs with an address of its own ($ip2; web: $ip1)" \
	'[ "$rc" -eq 0 ] && [ -n "$ip2" ] && [ "$ip2" != "$ip1" ] && [ "$(state "$c3")" = CONTAINER_RUNNING ]'
cri exec-sync "$c3" -- timeout 10 wget -q -O - "http://$ip1:8081/" >"$out" 2>"$err"
checkc "web2 reaches web's server by web's pod IP ($ip1:8081)" 'grep -qx "page of pod web" "$out"'
cri exec-sync "$c3" -- timeout 10 wget -q -O - http://127.0.0.1:8080/ >"$out" 2>"$err"
rc=$?
checkc "... and web2's 127.0.0.1:8080 is its own, where nothing listens (wget: $rc, connection refused)" \
	'[ "$rc" -ne 0 ] && ! grep -q "page of pod web" "$out" && grep -q "Connection refused" "$err"'
vmcheck "two pods, two VMs" '[ "$(ours)" -eq 2 ]'
elapsed "pod web2"

# --- exec ---------------------------------------------------------------------
cri exec-sync "$srv" -- sh -c 'echo out; echo err >&2; exit 3' >"$out" 2>"$err"
rc=$?
checkc "ExecSync: its exit code (3; got $rc), stdout and stderr apart" \
	'[ "$rc" -eq 3 ] && [ "$(cat "$out")" = out ] && grep -qx err "$err"'
echo "a line from the kubelet" | cri exec -i "$srv" -- sh -c 'read l; echo "got: $l"; echo to-stderr >&2; exit 4' >"$out" 2>"$err"
rc=$?
checkc "Exec -i through the streaming server: stdin reaches the process, exit code 4 (got $rc)" \
	'[ "$rc" -eq 4 ] && grep -qx "got: a line from the kubelet" "$out" && grep -qx to-stderr "$err"'
# A terminal of 33x99, resized to 40x120 once it said so: SIGWINCH and
# the new size reach the process, the typed line is echoed and read.
echo typed | cri exec -i -t --size 33x99 --resize-when "size 33 99:40x120" "$srv" -- sh -c '
	trap "echo \"winch \$(stty size)\"" WINCH
	i=0; while [ "$(stty size 2>/dev/null)" != "33 99" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	[ -t 0 ] && [ -t 1 ] && echo is-a-tty
	echo "size $(stty size)"
	i=0; while [ "$(stty size)" != "40 120" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
	sleep 0.3; read l; echo "read $l"; exit 6' >"$out" 2>"$err"
rc=$?
tr -d '\r' <"$out" >"$out.lf"
checkc "Exec -i -t: a terminal (stdin and stdout), of the size asked (33 99)" \
	'grep -qx is-a-tty "$out.lf" && grep -qx "size 33 99" "$out.lf" && grep -q "$(printf "is-a-tty\r")" "$out"'
checkc "... a resize reaches the process as SIGWINCH with the new size (40 120)" 'grep -qx "winch 40 120" "$out.lf"'
checkc "... which reads the typed line and exits with its status (6; got $rc)" '[ "$rc" -eq 6 ] && grep -qx "read typed" "$out.lf"'
cri exec-sync "$srv" -- /no/such/program >"$out" 2>"$err"
rc=$?
checkc "ExecSync of a missing program fails (exit $rc), the container goes on" '[ "$rc" -ne 0 ] && [ "$(state "$srv")" = CONTAINER_RUNNING ]'
elapsed "exec"

# --- port-forward ----------------------------------------------------------------
printf 'GET / HTTP/1.0\r\n\r\n' | cri port-forward "$p1" 8080 >"$out" 2>"$err"
rc=$?
checkc "PortForward to 8080, which listens on the pod's 127.0.0.1 only, reaches the server ($rc)" \
	'[ "$rc" -eq 0 ] && head -1 "$out" | grep -q "^HTTP/1.[01] 200" && grep -q "^page of pod web" "$out"'
printf 'GET /host HTTP/1.0\r\n\r\n' | cri port-forward "$p1" 8081 >"$out" 2>"$err"
checkc "... and to 8081 (every address)" 'head -1 "$out" | grep -q "^HTTP/1.[01] 200" && grep -qx web "$out"'
cri port-forward "$p1" 8099 </dev/null >"$out" 2>"$err"
rc=$?
checkc "PortForward to a port where nothing listens fails, naming the port ($rc)" '[ "$rc" -ne 0 ] && grep -q 8099 "$err"'
elapsed "port-forward"

# --- resources: update, status, stats, the container's cgroup -------------------
mem=$(cri create "$p1" mem "$B" --memory $((64 << 20)) -- sh -c 'i=0; while [ $i -lt 200000 ]; do i=$((i + 1)); done; exec sleep 100000' 2>"$err") &&
	cri start "$mem" 2>>"$err"
rc=$?
limit() { cri exec-sync "$mem" -- sh -c 'cat /sys/fs/cgroup/memory.max 2>/dev/null || cat /sys/fs/cgroup/memory/memory.limit_in_bytes' 2>>"$err"; }
l0=$(limit)
checkc "a container created with a 64 MiB limit sees it in its cgroup (${l0:-?})" '[ "$rc" -eq 0 ] && [ "$l0" = $((64 << 20)) ]'
cri update "$mem" --memory $((96 << 20)) >"$out" 2>"$err"
rc=$?
l1=$(limit)
checkc "UpdateContainerResources to 96 MiB ($rc): the container's cgroup says so (${l1:-?})" '[ "$rc" -eq 0 ] && [ "$l1" = $((96 << 20)) ]'
cri inspect "$mem" >"$out" 2>"$err"
checkc "... ContainerStatus.resources says so" '[ "$(field "$out" "j[\"resources\"][\"linux\"][\"memory_limit_in_bytes\"]")" = $((96 << 20)) ]'
wait_for '[ "$(state "$mem")" = CONTAINER_RUNNING ] && cri exec-sync "$mem" -- true 2>/dev/null' 50
cri stats "$mem" >"$out" 2>"$err"
ws=$(field "$out" 'j["memory"]["working_set_bytes"]["value"]')
av=$(field "$out" 'j["memory"]["available_bytes"]["value"]')
cpu=$(field "$out" 'j["cpu"]["usage_core_nano_seconds"]["value"]')
checkc "... ContainerStats: working set + available = 96 MiB (${ws:-?} + ${av:-?})" \
	'[ -n "$ws" ] && [ -n "$av" ] && [ "$ws" -gt 0 ] && [ $((ws + av)) -eq $((96 << 20)) ]'
checkc "ContainerStats: CPU used by the container's busy loop (${cpu:-?} ns)" '[ -n "$cpu" ] && [ "$cpu" -gt 10000000 ]'
elapsed "resources"

# --- logs -------------------------------------------------------------------
lg=$(cri create "$p1" logger "$B" -- sh -c 'echo first; echo second >&2; head -c 20000 /dev/zero | tr "\0" x; echo; echo last; exec sleep 100000' 2>"$err") &&
	cri start "$lg" 2>>"$err"
wait_for 'cri logs "$lg" 2>/dev/null | grep -qx last' 300
cri logs "$lg" >"$out" 2>"$err"
rc=$?
lp=$(cri inspect "$lg" 2>/dev/null | /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["log_path"])' 2>/dev/null)
checkc "the log ($lp) is in the pod's log directory, every line in the CRI format ($rc)" \
	'[ "$rc" -eq 0 ] && [ -f "$lp" ] && case "$lp" in "$CRI_STATE"/logs/default_web_*/logger/0.log) true ;; *) false ;; esac'
checkc "... stdout and stderr are told apart" \
	'[ "$(sed -n 1p "$out")" = first ] && grep -qx second "$err" && ! grep -qx second "$out" && grep -q " stderr F second$" "$lp"'
checkc "... a 20000-byte line is split in partial lines (P) and joined whole again" \
	'grep -q " stdout P x" "$lp" && grep -qx "$(head -c 20000 /dev/zero | tr "\0" x)" "$out" && [ "$(tail -1 "$out")" = last ]'
elapsed "logs"

# --- stop one container, with a grace period ------------------------------------
tc=$(cri create "$p1" term "$B" -- sh -c 'trap "echo got-term; exit 42" TERM; echo started; while :; do sleep 0.1; done' 2>"$err") &&
	cri start "$tc" 2>>"$err" && wait_for 'cri logs "$tc" 2>/dev/null | grep -qx started' 300
t0=$(date +%s%N)
cri stop -t 10 "$tc" >"$out" 2>"$err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
cri inspect "$tc" >"$out" 2>>"$err"
code=$(field "$out" 'j.get("exit_code", 0)')
checkc "StopContainer -t 10 ($rc, ${ms} ms): TERM reaches the trap, which exits 42 (got ${code:-?}) before the grace period" \
	'[ "$rc" -eq 0 ] && [ "$ms" -lt 9000 ] && [ "$code" = 42 ] && [ "$(state "$tc")" = CONTAINER_EXITED ] && cri logs "$tc" 2>/dev/null | grep -qx got-term'
cri rm "$tc" >"$out" 2>"$err"
checkc "RemoveContainer removes it; the pod's others run on" \
	'[ $? -eq 0 ] && ! cri ps 2>/dev/null | grep -q "^$tc " && [ "$(state "$srv")" = CONTAINER_RUNNING ]'

# --- stop and remove both pods --------------------------------------------------
cri stopp "$p1" >"$out" 2>"$err" && cri stopp "$p2" >>"$out" 2>>"$err"
rc=$?
checkc "StopPodSandbox of both ($rc): their containers EXITED, the pods NOTREADY" \
	'[ "$rc" -eq 0 ] && ! cri ps 2>/dev/null | grep -v " CONTAINER_EXITED " | grep -q . && [ "$(podstate "$p1")" = SANDBOX_NOTREADY ] && [ "$(podstate "$p2")" = SANDBOX_NOTREADY ]'
vmcheck "... and their VMs are gone" 'wait_for "[ \$(ours) -eq 0 ]" 300'
cri rmp "$p1" >"$out" 2>"$err" && cri rmp "$p2" >>"$out" 2>>"$err"
rc=$?
checkc "RemovePodSandbox of both ($rc): no pod, no container listed" '[ "$rc" -eq 0 ] && [ -z "$(cri pods -q)" ] && [ -z "$(cri ps -q)" ]'
clean_case "pods web and web2"
elapsed "stop and remove"

# --- a container over its memory limit is OOM-killed; its pod lives --------------
p3=$(cri runp oom --cgroup-parent "$cri_cgroup/oom" 2>"$err")
kp=$(cri create "$p3" keeper "$B" -- sleep 100000 2>>"$err") && cri start "$kp" 2>>"$err"
hog=$(cri create "$p3" hog "$B" --memory $((32 << 20)) -- sh -c 'echo start; x=$(head -c 100000000 /dev/zero | tr "\0" a); echo survived' 2>>"$err") &&
	cri start "$hog" 2>>"$err"
rc=$?
wait_for '[ "$(state "$hog")" = CONTAINER_EXITED ]' 900
cri inspect "$hog" >"$out" 2>"$err"
reason=$(field "$out" 'j.get("reason", "")')
code=$(field "$out" 'j.get("exit_code", 0)')
checkc "a container that fills more than its 32 MiB ends OOMKilled ($rc; reason ${reason:-none}, exit ${code:-?})" \
	'[ "$reason" = OOMKilled ] && [ "$code" = 137 ] && ! cri logs "$hog" 2>/dev/null | grep -q survived'
checkc "... while its pod stays READY and the pod's other container runs and execs" \
	'[ "$(podstate "$p3")" = SANDBOX_READY ] && [ "$(state "$kp")" = CONTAINER_RUNNING ] && [ "$(cri exec-sync "$kp" -- echo alive 2>/dev/null)" = alive ]'
vmcheck "... in its VM, which runs on" '[ "$(ours)" -eq 1 ]'
remove_pod "$p3" "the OOM pod"
elapsed "OOM"

# --- kill -9 of the pod's QEMU -------------------------------------------------
sleeper_pod vmkill
p4=$pod c4=$ctr
checkc "a pod to kill runs ($rc)" '[ "$rc" -eq 0 ] && [ "$(state "$c4")" = CONTAINER_RUNNING ]'
if [ "$vm" -eq 1 ]; then
	q=$(pgrep -f "qemu-system.*$rt/" | head -1)
	[ -n "$q" ] && kill -KILL "$q"
	wait_for '[ "$(state "$c4")" = CONTAINER_EXITED ]' 600
	checkc "kill -9 of its QEMU (${q:-none}): the pod's container reports EXITED" '[ -n "$q" ] && [ "$(state "$c4")" = CONTAINER_EXITED ]'
else
	skip "kill -9 of its QEMU: the pod's container reports EXITED" "$novm"
fi
remove_pod "$p4" "the pod whose QEMU was killed"
elapsed "kill -9 of QEMU"

# --- kill -9 of the pod's shim --------------------------------------------------
sleeper_pod shimkill
p5=$pod c5=$ctr
sh5=$(pgrep -f "containerd-shim-$runtime-v2 .*-id $p5 " | head -1)
checkc "a pod runs with one shim ($rc; shim ${sh5:-none})" \
	'[ "$rc" -eq 0 ] && [ -n "$sh5" ] && [ "$(cri_shims | wc -l)" -eq 1 ] && [ "$(state "$c5")" = CONTAINER_RUNNING ]'
[ -n "$sh5" ] && kill -KILL "$sh5"
wait_for '[ "$(state "$c5")" = CONTAINER_EXITED ] && [ "$(podstate "$p5")" = SANDBOX_NOTREADY ]' 600
checkc "kill -9 of the shim: containerd reports the container EXITED and the pod NOTREADY" \
	'[ "$(state "$c5")" = CONTAINER_EXITED ] && [ "$(podstate "$p5")" = SANDBOX_NOTREADY ]'
vmcheck "... and the pod's VM is gone (containerd's shim delete)" 'wait_for "[ \$(ours) -eq 0 ]" 300'
remove_pod "$p5" "the pod whose shim was killed"
elapsed "kill -9 of the shim"

# --- the end -----------------------------------------------------------------------
cri rmi "$B" >"$out" 2>"$err"
checkc "RemoveImage removes the busybox image" '[ $? -eq 0 ] && ! cri inspecti "$B" >/dev/null 2>&1'
host_links >"$rt/links-now"
checkc "the host's links and addresses are as they were" 'cmp -s "$rt/links-before" "$rt/links-now"'
elapsed "all"
