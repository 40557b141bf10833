#!/bin/sh
# containerd-shim-capsule-v2 (docs/oci.md, "containerd's shim v2") under
# a private containerd (its own root, state, sockets; no CRI), the shim
# reached as io.containerd.capsule.v2 (containerd finds the binary on
# PATH: the build directory is put first). ctr run --rm (exit status, the
# guest's kernel, events), run -d, task exec (exit status, a TTY), ps,
# metrics, pause and resume, kill, ls states, delete; after each: no
# QEMU, no shim, no mount, no state left. Then one shim per pod: a
# sandbox and a container with the CRI's annotations share one shim.
# TAP output.
#
#   tests/integration/test-shim.sh build/capsule
# The runtime is capsule-oci beside capsule; CAPSULE_SHIM_TEST_RUNTIME
# names another runc-compatible binary (runc) to check the shim's own
# logic apart from capsule: the checks of the guest's kernel then expect
# the host's.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(dirname "$capsule")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/oci-lib.sh"
shimbin="$build/src/shim/containerd-shim-capsule-v2"
runtime=${CAPSULE_SHIM_TEST_RUNTIME:-$build/capsule-oci}
plan=35
suite="shim suite"
start=$(date +%s)
echo "1..$plan"

for tool in podman containerd ctr script python3; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
[ -x "$shimbin" ] || fail_all "$shimbin is missing (ninja builds it)"
[ -x "$runtime" ] || runtime=$(command -v "$runtime") || fail_all "no runtime $runtime"

img=localhost/capsule-shim-test:latest
oci_podman_init "$rt/podman"
# The shim's places, private to this suite: the runtime's --root
# ($CAPSULE_SHIM_ROOT/NAMESPACE) and its sockets.
shim_root="$rt/shim-root"
sockdir="$rt/s"
bindir="$rt/bin"
mkdir -p "$bindir" "$rt/c"
ln -s "$shimbin" "$bindir/containerd-shim-capsule-v2"
cpid=""
shim_cleanup() {
	if [ -n "$cpid" ]; then
		for t in $(c task ls -q 2>/dev/null); do c task kill -s KILL "$t" >/dev/null 2>&1; done
		sleep 1
		for t in $(c task ls -q 2>/dev/null); do c task delete -f "$t" >/dev/null 2>&1; done
		kill "$cpid" 2>/dev/null
		wait "$cpid" 2>/dev/null
	fi
	for p in $(shims); do kill -KILL "$p" 2>/dev/null; done
	oci_unmount "$rt"
	cleanup
}
trap shim_cleanup EXIT

# Our shims: processes of the shim binary whose sockets are this suite's.
shims() {
	for p in $(pgrep -f "containerd-shim-capsule-v2" 2>/dev/null); do
		tr '\0' ' ' <"/proc/$p/cmdline" 2>/dev/null | grep -q -- "-address $rt/c/sock" && echo "$p"
	done
}
nshims() { shims | wc -l; }
mounts() { awk -v d="$rt/c/" 'index($2, d) == 1' /proc/mounts | wc -l; }
state_left() { ls -A "$shim_root/default" 2>/dev/null | wc -l; }
sockets_left() { ls -A "$sockdir" 2>/dev/null | wc -l; }
# Nothing of a task left: no QEMU, shim, mount, runtime state or socket.
nothing_left() {
	[ "$(ours)" -eq 0 ] && [ "$(nshims)" -eq 0 ] && [ "$(mounts)" -eq 0 ] && [ "$(state_left)" -eq 0 ] &&
		[ "$(sockets_left)" -eq 0 ]
}
left() { echo "qemu $(ours), shims $(nshims), mounts $(mounts), state $(state_left), sockets $(sockets_left)"; }
# The shim's log (containerd copies it into its own) and the runtime's.
clog() {
	grep -a 'io.containerd.capsule.v2' "$rt/c/log" | tail -15 | sed 's/^/# containerd: /'
	for f in "$rt"/c/state/io.containerd.runtime.v2.task/default/*/log.json; do
		[ -f "$f" ] && tail -5 "$f" | sed "s|^|# $(basename "$(dirname "$f")") log.json: |"
	done
}
checkr() { # checkr NAME 'CONDITION': with the logs on failure
	if eval "$2"; then ok "$1"; else not_ok "$1" "failed: $2" "left: $(left)"; clog; fi
}

containerd_config "$rt/c" info
PATH="$bindir:$PATH" CAPSULE_SHIM_RUNTIME="$runtime" CAPSULE_SHIM_ROOT="$shim_root" \
	CAPSULE_SHIM_SOCKET_DIR="$sockdir" containerd --config "$rt/c/config.toml" >"$rt/c/log" 2>&1 &
cpid=$!
c() { ctr -a "$rt/c/sock" "$@"; }
R="--runtime io.containerd.capsule.v2"
wait_for '[ -S "$rt/c/sock" ] && c version >/dev/null 2>&1' 100
oci_image "$rt/img" "$img" >"$out" 2>"$err" &&
	pm save -q --format oci-archive -o "$rt/img.tar" "$img" >"$out" 2>>"$err" &&
	c images import "$rt/img.tar" >"$out" 2>>"$err"
check "a private containerd runs and imports a busybox image" 'c images ls -q | grep -qx "$img"'
case $runtime in
*capsule-oci) kver=$("$capsule" run -q -- uname -r 2>"$err"); what="the capsule guest's" ;;
*) kver=$(uname -r); what="the host's (runtime $runtime)" ;;
esac
check "the kernel to expect: $what ($kver)" '[ -n "$kver" ]'
elapsed "containerd and image"

# --- run --rm: exit status, the kernel, the events -----------------------
c events >"$rt/events" 2>&1 &
evpid=$!
sleep 0.5
# shellcheck disable=SC2086
c run $R --rm "$img" id1 sh -c 'uname -r; echo to-stderr >&2; exit 3' >"$out" 2>"$err"
rc=$?
checkr "ctr run --rm exits with the container's status (3; got $rc)" '[ "$rc" -eq 3 ]'
checkr "... printing $what kernel on stdout and stderr's line too" \
	'[ "$(sed -n 1p "$out")" = "$kver" ] && grep -q to-stderr "$out" "$err"'
checkr "... and leaves nothing ($(left))" 'wait_for nothing_left 100'
kill "$evpid" 2>/dev/null
wait "$evpid" 2>/dev/null
topics=$(awk '/id1|\/tasks\// { for (i = 1; i <= NF; i++) if ($i ~ /^\/tasks\//) print $i }' "$rt/events" | tr '\n' ' ')
checkr "the shim published /tasks/create, start, exit and delete, in order ($topics)" \
	'echo "$topics" | grep -q "/tasks/create /tasks/start /tasks/exit /tasks/delete"'
elapsed "run --rm"

# shellcheck disable=SC2086
c run $R --rm "$img" id0 /no/such/program >"$out" 2>"$err"
rc=$?
checkr "a missing executable fails (exit $rc) and leaves nothing" '[ "$rc" -ne 0 ] && wait_for nothing_left 100'

# --- run -d, exec, ps, metrics, pause, kill, delete -----------------------
# shellcheck disable=SC2086
c run $R -d "$img" id2 sh -c 'echo started; while :; do sleep 0.1; done' >"$out" 2>"$err"
rc=$?
checkr "ctr run -d starts a task (exit $rc), RUNNING in task ls" \
	'[ "$rc" -eq 0 ] && wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*RUNNING\"" 300'
checkr "... served by one shim" '[ "$(nshims)" -eq 1 ]'
c task exec --exec-id e1 id2 sh -c 'echo in-exec; exit 5' >"$out" 2>"$err"
rc=$?
checkr "ctr task exec exits with the process's status (5; got $rc) and prints its output" \
	'[ "$rc" -eq 5 ] && grep -qx in-exec "$out"'
echo from-stdin | c task exec --exec-id e2 id2 sh -c 'read l; echo "got $l"' >"$out" 2>"$err"
checkr "... with its stdin (read from ctr's)" 'grep -qx "got from-stdin" "$out"'
timeout 60 script -qec "ctr -a $rt/c/sock task exec -t --exec-id e3 id2 sh -c 'tty; stty size; exit 4'" /dev/null </dev/null >"$out" 2>"$err"
rc=$?
checkr "ctr task exec -t runs in a TTY (exit 4; got $rc)" '[ "$rc" -eq 4 ] && grep -q "/dev/pts/" "$out"'
pid2=$(c task ls 2>/dev/null | awk '$1 == "id2" { print $2 }')
c task ps id2 >"$out" 2>"$err"
checkr "ctr task ps lists the task's processes" '[ $? -eq 0 ] && [ "$(grep -c "^[0-9]" "$out")" -ge 1 ]'
c task metrics id2 >"$out" 2>"$err"
rc=$?
if "$runtime" events --help >/dev/null 2>&1; then
	checkr "ctr task metrics shows the task's memory and pids ($rc)" '[ "$rc" -eq 0 ] && grep -qi "memory" "$out"'
else
	skip "ctr task metrics" "$runtime has no events verb yet"
fi
c task pause id2 >"$out" 2>"$err"
checkr "ctr task pause: PAUSED in task ls" 'wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*PAUSED\"" 100'
c task resume id2 >"$out" 2>"$err"
checkr "ctr task resume: RUNNING again" 'wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*RUNNING\"" 100'
c task delete id2 >"$out" 2>"$err"
checkr "ctr task delete of a running task is refused" '[ $? -ne 0 ] && c task ls | grep -q "^id2 .*RUNNING"'
c task kill -s KILL id2 >"$out" 2>"$err"
checkr "ctr task kill -s KILL stops the task: STOPPED in task ls" \
	'wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*STOPPED\"" 100'
c task exec --exec-id e4 id2 true >"$out" 2>"$err"
checkr "an exec into the stopped task is refused" '[ $? -ne 0 ]'
c task delete id2 >"$out" 2>"$err"
rc=$?
checkr "ctr task delete succeeds ($rc) and prints the exit status (137)" '[ "$rc" -eq 0 ] && grep -q 137 "$out" "$err"'
c container rm id2 >"$out" 2>"$err"
checkr "... and nothing is left ($(left))" 'wait_for nothing_left 100'
[ -n "$pid2" ] && ! kill -0 "$pid2" 2>/dev/null
checkr "... the task's process (pid $pid2) is gone" '[ $? -eq 0 ]'
elapsed "run -d"

# --- run -t: the init in a TTY; kill -s TERM --------------------------------
timeout 60 script -qec "ctr -a $rt/c/sock run $R -t --rm $img id3 sh -c 'tty; exit 6'" /dev/null </dev/null >"$out" 2>"$err"
rc=$?
checkr "ctr run -t --rm: the init in a TTY (exit 6; got $rc)" '[ "$rc" -eq 6 ] && grep -q "/dev/pts/" "$out"'
checkr "... and nothing left ($(left))" 'wait_for nothing_left 100'
# shellcheck disable=SC2086
c run $R -d "$img" id4 sh -c 'trap "exit 42" TERM; while :; do sleep 0.1; done' >"$out" 2>"$err"
wait_for "c task ls 2>/dev/null | grep -q \"^id4 .*RUNNING\"" 300
sleep 1
c task kill id4 >"$out" 2>"$err"
wait_for "c task ls 2>/dev/null | grep -q \"^id4 .*STOPPED\"" 100
st4=$(c task delete id4 2>&1)
checkr "ctr task kill (TERM) reaches the process's trap: it exits 42 ($st4)" 'echo "$st4" | grep -q 42'
c container rm id4 >/dev/null 2>&1
checkr "... nothing left ($(left))" 'wait_for nothing_left 100'
elapsed "tty and signals"

# --- one shim per pod --------------------------------------------------------
# The CRI's annotations: a sandbox, and a container naming it.
pod=pod-sandbox-$$
# shellcheck disable=SC2086
c run $R -d --annotation io.kubernetes.cri.container-type=sandbox --annotation io.kubernetes.cri.sandbox-id=$pod \
	"$img" "$pod" sh -c 'while :; do sleep 0.1; done' >"$out" 2>"$err"
rc1=$?
# shellcheck disable=SC2086
c run $R -d --annotation io.kubernetes.cri.container-type=container --annotation io.kubernetes.cri.sandbox-id=$pod \
	"$img" pod-c1 sh -c 'echo c1; while :; do sleep 0.1; done' >"$out" 2>>"$err"
rc2=$?
checkr "a pod's sandbox and a container of it both run ($rc1, $rc2)" \
	'[ "$rc1" -eq 0 ] && [ "$rc2" -eq 0 ] && wait_for "c task ls 2>/dev/null | grep -q \"^pod-c1 .*RUNNING\"" 300 && c task ls | grep -q "^$pod .*RUNNING"'
a1=$(cat "$rt/c/state/io.containerd.runtime.v2.task/default/$pod/address" 2>/dev/null)
a2=$(cat "$rt/c/state/io.containerd.runtime.v2.task/default/pod-c1/address" 2>/dev/null)
checkr "... served by one shim: one process, one address ($a1)" '[ "$(nshims)" -eq 1 ] && [ -n "$a1" ] && [ "$a1" = "$a2" ]'
c task exec --exec-id pe pod-c1 sh -c 'exit 7' >"$out" 2>"$err"
checkr "an exec in the pod's container exits 7" '[ $? -eq 7 ]'
c task kill -s KILL pod-c1 >"$out" 2>"$err"
wait_for "c task ls 2>/dev/null | grep -q \"^pod-c1 .*STOPPED\"" 100
c task delete pod-c1 >"$out" 2>"$err" && c container rm pod-c1 >>"$out" 2>>"$err"
checkr "the container removed, the pod's shim still serves its sandbox" \
	'[ "$(nshims)" -eq 1 ] && c task ls | grep -q "^$pod .*RUNNING"'
c task kill -s KILL "$pod" >"$out" 2>"$err"
wait_for "c task ls 2>/dev/null | grep -q \"^$pod .*STOPPED\"" 100
c task delete "$pod" >"$out" 2>"$err" && c container rm "$pod" >>"$out" 2>>"$err"
checkr "the sandbox removed: the shim exits and nothing is left ($(left))" 'wait_for nothing_left 100'
elapsed "one shim per pod"

# --- a shim killed: containerd cleans up through `delete` --------------------
# shellcheck disable=SC2086
c run $R -d "$img" id5 sh -c 'while :; do sleep 0.1; done' >"$out" 2>"$err"
wait_for "c task ls 2>/dev/null | grep -q \"^id5 .*RUNNING\"" 300
for p in $(shims); do kill -KILL "$p"; done
checkr "after kill -9 of the shim, containerd no longer reports the task running (stopped, or removed by its cleanup)" \
	'wait_for "! c task ls 2>/dev/null | grep -q \"^id5 .*RUNNING\"" 300'
c task delete id5 >"$out" 2>"$err"
c container rm id5 >>"$out" 2>>"$err"
checkr "... and delete leaves nothing: the runtime's delete --force ran ($(left))" 'wait_for nothing_left 300'
elapsed "killed shim"

# --- containerd's log: no shim errors ------------------------------------------
checkr "the shim's log reached containerd's (its serving line)" 'grep -q "serving the task API" "$rt/c/log"'
checkr "no event was dropped" '! grep -q "dropping event" "$rt/c/log"'
exit "$nfail"
