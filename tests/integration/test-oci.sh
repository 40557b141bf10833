#!/bin/sh
# capsule as an OCI runtime (docs/oci.md) under the engines that drive it:
# Podman (through conmon) and a private containerd (through its runc v2
# shim). The image is a local busybox tree (podman import, never a
# registry) in a Podman storage of this suite's own. Podman: output and
# exit status, the guest's kernel, root in the guest, exec, exec -it
# under tmux (a terminal, its size, a resize), kill -s USR1 and stop -t 5
# reaching a trap in the guest, a missing executable (127), --memory to
# the VM's RAM and the cgroup, and rm leaving no sandbox, state
# directory, cgroup or QEMU. containerd: run --rm, run -d with task exec,
# task kill, delete, the same leftovers. TAP output.
#
#   tests/integration/test-oci.sh build/capsule
# The runtime is capsule-oci beside it; CAPSULE_OCI_TEST_RUNTIME names
# another runc-compatible binary (runc) to check this harness itself:
# the checks of capsule's own state fail then, the rest pass.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/oci-lib.sh"
oci=${CAPSULE_OCI_TEST_RUNTIME:-$(dirname "$capsule")/capsule-oci}
plan=69
suite="oci suite"
start=$(date +%s)
echo "1..$plan"

for tool in podman conmon containerd ctr tmux busybox python3; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
[ -x "$oci" ] || fail_all "$oci is missing (ninja makes the capsule-oci link)"

img=localhost/capsule-oci-test:latest
state="$rt/oci"	# the runtime's --root under Podman
ctr_root="$rt/ctr-oci"	# ... under containerd: ctr --runc-root,
ctr_state="$ctr_root/default"	# which the shim gives as ROOT/NAMESPACE
wrapper="$rt/capsule-oci-wrapper"
oci_podman_init "$rt/podman"
pmr() { pm --runtime "$wrapper" "$@"; }
cgroups=""	# cgroup paths seen, removed on exit if the runtime left them
cpid=""
oci_cleanup() {
	pmr rm -af -t 0 >/dev/null 2>&1
	if [ -n "$cpid" ]; then
		ctr -a "$rt/c/sock" task kill -s KILL id2 >/dev/null 2>&1
		kill "$cpid" 2>/dev/null
		wait "$cpid" 2>/dev/null
	fi
	tmux -S "$rt/tmux" kill-server >/dev/null 2>&1
	for p in $cgroups; do
		for c in /sys/fs/cgroup/*/"$p"; do
			[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
		done
	done
	oci_unmount "$rt"
	cleanup
}
trap oci_cleanup EXIT

# What capsule's own state holds: oci-* sandboxes in the home, QEMU
# processes of this suite's home.
sandboxes() { ls "$CAPSULE_HOME/sandboxes" 2>/dev/null | grep -c '^oci-'; }
listed() { "$capsule" ls 2>/dev/null | grep -c '^oci-'; }
# cgroup_of CONTAINER: linux.cgroupsPath of its config.json.
cgroup_of() {
	python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["linux"].get("cgroupsPath", ""))' \
		"$(pmr inspect --format '{{.OCIConfigPath}}' "$1")" 2>/dev/null
}
# The runtime's log of errors: Podman names none; say what capsule ls and
# the state root hold.
context() {
	echo "# runtime: $oci, state root $state: $(ls "$state" 2>/dev/null | tr '\n' ' ')"
	"$capsule" ls 2>&1 | sed 's/^/# capsule ls: /'
}
fail_ctx() { not_ok "$@"; context; }
checkc() { # checkc NAME 'CONDITION': check, with the runtime's context on failure
	if eval "$2"; then ok "$1"; else fail_ctx "$1" "failed: $2"; fi
}

oci_wrapper "$wrapper" "$oci" "$state" "$CAPSULE_HOME" || fail_all "cannot write $wrapper"
oci_image "$rt/img" "$img" >"$out" 2>"$err"
check "podman import makes $img from a local busybox tree" '[ $? -eq 0 ] && pm image exists "$img"'
# The kernel capsule boots, to tell the guest's from the host's.
kver=$("$capsule" run -q -- uname -r 2>"$err")
check "capsule run -- uname -r names the guest kernel ($kver; host $(uname -r))" '[ -n "$kver" ] && [ "$kver" != "$(uname -r)" ]'
elapsed "image and kernel"

# --- podman run --rm ---------------------------------------------------------
# shellcheck disable=SC2086
pmr run --rm $oci_run_flags "$img" sh -c 'uname -r; id -u; exit 7' >"$out" 2>"$err"
rc=$?
checkc "podman run --rm exits with the container's status (7; got $rc)" '[ "$rc" -eq 7 ]'
checkc "it prints the capsule guest's kernel ($kver)" '[ "$(sed -n 1p "$out")" = "$kver" ]'
checkc "the process runs as root in the guest (id -u is 0)" '[ "$(sed -n 2p "$out")" = 0 ]'
checkc "run --rm leaves no sandbox in the home" '[ "$(sandboxes)" -eq 0 ] && [ "$(listed)" -eq 0 ]'
checkc "... no state directory under --root" '[ -z "$(ls -A "$state" 2>/dev/null)" ]'
checkc "... no QEMU process" '[ "$(ours)" -eq 0 ]'
elapsed "run --rm"

# shellcheck disable=SC2086
pmr run --rm $oci_run_flags "$img" /no/such/program >"$out" 2>"$err"
rc=$?
checkc "a missing executable exits 127 (got $rc)" '[ "$rc" -eq 127 ]'
checkc "... and leaves no sandbox" '[ "$(sandboxes)" -eq 0 ]'
elapsed "missing executable"

# --- a read-only root: --read-only's tmpfs at /var/tmp, a --tmpfs the image
# lacks, a working directory in it (Podman refuses a -w the image lacks
# unless a mount holds it; ctr's --cwd below is one made at create) ---------
# shellcheck disable=SC2086
pmr run --rm --read-only --tmpfs /cache -w /cache/new/dir $oci_run_flags "$img" sh -c '
	echo x > /var/tmp/a && echo y > /cache/b && cat /var/tmp/a /cache/b && pwd
	echo "tmpfs $(grep -c tmpfs /proc/mounts) $(awk "\$3 == \"tmpfs\" && (\$2 == \"/var/tmp\" || \$2 == \"/cache\") { print \$2 }" /proc/mounts | sort | tr "\n" " ")"
	touch /z 2>/dev/null; echo "root $?"' >"$out" 2>"$err"
rc=$?
checkc "podman run --read-only --tmpfs /cache: writes in /var/tmp and /cache work ($rc)" \
	'[ "$rc" -eq 0 ] && [ "$(sed -n 1p "$out")" = x ] && [ "$(sed -n 2p "$out")" = y ] && grep -q "^tmpfs [0-9]* /cache /var/tmp $" "$out" && grep -qx "root 1" "$out"'
checkc "... and -w /cache/new/dir, in the tmpfs, is the working directory" 'grep -qx /cache/new/dir "$out"'
elapsed "read-only root"

# --- one long-running container: exec, memory, cgroup, signals, stop, rm -----
# USR1 and TERM are trapped; TERM's trap exits 42.
# shellcheck disable=SC2086
pmr run -d --name c1 --memory 300m $oci_run_flags "$img" sh -c '
	trap "echo got-usr1" USR1
	trap "echo got-term; exit 42" TERM
	echo started
	while :; do sleep 0.1; done' >"$out" 2>"$err"
rc=$?
checkc "podman run -d starts a container (exit $rc)" '[ "$rc" -eq 0 ] && wait_for "pmr logs c1 2>/dev/null | grep -q started" 300'
id1=$(pmr inspect --format '{{.Id}}' c1 2>/dev/null)
cg1=$(cgroup_of c1)
cgroups="$cgroups $cg1"
checkc "one oci- sandbox while it runs, listed by capsule ls" '[ "$(sandboxes)" -eq 1 ] && [ "$(listed)" -eq 1 ]'
checkc "its state directory is under --root ($state/$id1)" '[ -n "$id1" ] && [ -f "$state/$id1/state.json" ]'
checkc "one QEMU process runs for it" '[ "$(ours)" -eq 1 ]'

pmr exec c1 sh -c 'echo in-exec; exit 5' >"$out" 2>"$err"
rc=$?
checkc "podman exec exits with the process's status (5; got $rc)" '[ "$rc" -eq 5 ] && grep -qx in-exec "$out"'
pmr exec c1 id -u >"$out" 2>"$err"
checkc "exec runs as root too" '[ "$(cat "$out")" = 0 ]'

# --memory 300m: the guest gets 300 - 96 MiB (CAP_OCI_MEMORY_RESERVE_MIB),
# less what the kernel keeps; the cgroup gets the limit itself.
mem=$(pmr exec c1 sh -c "awk '/^MemTotal:/ { print \$2 }' /proc/meminfo" 2>"$err")
checkc "--memory 300m gives the guest about 204 MiB (MemTotal ${mem:-?} kB)" \
	'[ -n "$mem" ] && [ "$mem" -gt $((150 * 1024)) ] && [ "$mem" -le $((204 * 1024)) ]'
limit=$(cat "/sys/fs/cgroup/memory$cg1/memory.limit_in_bytes" 2>/dev/null)
checkc "the cgroupsPath $cg1 is limited to 300 MiB (${limit:-none})" '[ "$limit" = 314572800 ]'
# Every process of the container (monitor, shim, QEMU) is under it.
qemu=$(pgrep -f "qemu-system.*$rt/" | head -1)
checkc "QEMU ($qemu) is in the cgroupsPath's memory cgroup" \
	'[ -n "$qemu" ] && grep -q "^[0-9]*:memory:$cg1/" "/proc/$qemu/cgroup"'

# exec -it under tmux: a terminal, the pane's size, then a resize.
cat >"$rt/tty.sh" <<EOF
#!/bin/sh
. '$here/oci-lib.sh'
oci_pdir='$oci_pdir'
pm --runtime '$wrapper' exec -it c1 sh -c '[ -t 0 ] && echo is-a-tty; echo "size \$(stty size)"; trap "echo \"winch \\\$(stty size)\"" WINCH; i=0; while [ \$i -lt 30 ] && ! read -t 1 line; do i=\$((i + 1)); done; echo "read \$line"; exit 6'
echo "exec-done \$?"
sleep 60
EOF
tmux -S "$rt/tmux" -f /dev/null new-session -d -s t -x 100 -y 30 "sh $rt/tty.sh" 2>"$err"
pane() { tmux -S "$rt/tmux" capture-pane -p -t t 2>/dev/null; }
wait_for 'pane | grep -q "^size"' 200
pane >"$out"
checkc "exec -it under tmux: the guest's stdin is a terminal" 'grep -q "^is-a-tty" "$out"'
psize=$(tmux -S "$rt/tmux" display -p -t t '#{pane_height} #{pane_width}' 2>/dev/null)
checkc "... of the pane's size ($psize)" '[ -n "$psize" ] && grep -q "^size $psize" "$out"'
tmux -S "$rt/tmux" resize-window -t t -x 90 -y 20 2>>"$err"
psize2=$(tmux -S "$rt/tmux" display -p -t t '#{pane_height} #{pane_width}' 2>/dev/null)
wait_for 'pane | grep -q "^winch $psize2"' 100
pane >"$out"
checkc "... and a resize reaches it as SIGWINCH and the new size ($psize2)" '[ "$psize2" != "$psize" ] && grep -q "^winch $psize2" "$out"'
tmux -S "$rt/tmux" send-keys -t t quit Enter 2>>"$err"
wait_for 'pane | grep -q "^exec-done"' 100
pane >"$out"
checkc "... which reads a typed line and exits with its status (6)" 'grep -q "^read quit" "$out" && grep -q "^exec-done 6" "$out"'
tmux -S "$rt/tmux" kill-server >/dev/null 2>&1

# pause and unpause (runc freezes the cgroup; capsule pauses the VM).
pmr pause c1 >"$out" 2>"$err"
rc=$?
checkc "podman pause pauses it ($rc)" '[ "$rc" -eq 0 ] && [ "$(pmr inspect --format "{{.State.Status}}" c1)" = paused ]'
# A signal to a paused container waits for unpause, as in runc's frozen
# cgroup.
t0=$(date +%s%N)
timeout 30 podman --root "$oci_pdir/storage" --runroot "$oci_pdir/runroot" --tmpdir "$oci_pdir/tmp" \
	--cgroup-manager cgroupfs --events-backend file --runtime "$wrapper" kill -s USR1 c1 >"$out" 2>"$err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
checkc "podman kill -s USR1 of the paused container returns at once ($rc, ${ms} ms)" '[ "$rc" -eq 0 ] && [ "$ms" -lt 5000 ]'
pmr unpause c1 >"$out" 2>"$err"
rc=$?
checkc "podman unpause resumes it ($rc): exec runs again" '[ "$rc" -eq 0 ] && pmr exec c1 true 2>>"$err"'
checkc "... and the USR1 sent while paused reaches the guest's trap then" \
	'wait_for "pmr logs c1 2>/dev/null | grep -c got-usr1 | grep -qx 1" 100'
pmr kill -s USR1 c1 >"$out" 2>"$err"
checkc "podman kill -s USR1 reaches the guest's trap (podman logs)" \
	'wait_for "pmr logs c1 2>/dev/null | grep -c got-usr1 | grep -qx 2" 100'
checkc "... and the container goes on running" '[ "$(pmr inspect --format "{{.State.Running}}" c1)" = true ]'

t0=$(date +%s%N)
pmr stop -t 5 c1 >"$out" 2>"$err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
checkc "podman stop -t 5 stops it ($rc) well before 5 s (${ms} ms)" '[ "$rc" -eq 0 ] && [ "$ms" -lt 4000 ]'
pmr logs c1 >"$out" 2>"$err"
checkc "the TERM trap ran in the guest (podman logs)" 'grep -qx got-term "$out"'
code=$(pmr inspect --format '{{.State.ExitCode}}' c1 2>"$err")
checkc "its exit status is the trap's (42; got $code)" '[ "$code" = 42 ]'
checkc "stopped: no QEMU process left" 'wait_for "[ \$(ours) -eq 0 ]" 50'

pmr rm c1 >"$out" 2>"$err"
checkc "podman rm removes it" '[ $? -eq 0 ]'
checkc "rm leaves no sandbox" '[ "$(sandboxes)" -eq 0 ] && [ "$(listed)" -eq 0 ]'
checkc "... no state directory" '[ -n "$id1" ] && [ ! -e "$state/$id1" ]'
checkc "... no cgroup ($cg1 in any hierarchy)" '[ -n "$cg1" ] && ! ls -d /sys/fs/cgroup/*"$cg1" 2>/dev/null | grep -q .'
checkc "... no QEMU process" '[ "$(ours)" -eq 0 ]'
# runc's exec processes die with the container's init (its PID namespace
# goes): Podman's stop refuses to clean up while an exec session's pid
# lives ("has active exec sessions"), so an exec's monitor must end with
# the container.
# shellcheck disable=SC2086
pmr run -d --name c2 $oci_run_flags "$img" sh -c 'trap "exit 42" TERM; echo started; while :; do sleep 0.1; done' >"$out" 2>"$err" &&
	wait_for "pmr logs c2 2>/dev/null | grep -q started" 300 &&
	pmr exec -d c2 sleep 100 >"$out" 2>"$err"
t0=$(date +%s%N)
pmr stop -t 5 c2 >"$out" 2>"$err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
checkc "podman stop with an exec session running succeeds ($rc, ${ms} ms)" '[ "$rc" -eq 0 ] && [ "$ms" -lt 4000 ]'
pmr rm -f c2 >"$out" 2>"$err"
checkc "... and rm leaves no sandbox or QEMU" '[ "$(sandboxes)" -eq 0 ] && wait_for "[ \$(ours) -eq 0 ]" 50'
# SIGKILL to a paused container ends it (runc thaws for it), and rm -f
# of a paused one leaves nothing.
# shellcheck disable=SC2086
pmr run -d --name c3 $oci_run_flags "$img" sh -c 'echo started; while :; do sleep 0.1; done' >"$out" 2>"$err" &&
	wait_for "pmr logs c3 2>/dev/null | grep -q started" 300 && pmr pause c3 >"$out" 2>"$err"
t0=$(date +%s%N)
pmr kill c3 >"$out" 2>"$err" && wait_for '[ "$(pmr inspect --format "{{.State.Status}}" c3)" = exited ]' 100
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
code=$(pmr inspect --format '{{.State.ExitCode}}' c3 2>"$err")
checkc "podman kill of a paused container ends it ($rc, ${ms} ms, exit status ${code:-?}: 137)" \
	'[ "$rc" -eq 0 ] && [ "$ms" -lt 8000 ] && [ "$code" = 137 ]'
pmr rm c3 >"$out" 2>"$err"
# shellcheck disable=SC2086
pmr run -d --name c4 $oci_run_flags "$img" sh -c 'echo started; while :; do sleep 0.1; done' >"$out" 2>"$err" &&
	wait_for "pmr logs c4 2>/dev/null | grep -q started" 300 && pmr pause c4 >"$out" 2>"$err"
cg4=$(cgroup_of c4)
cgroups="$cgroups $cg4"
pmr rm -f c4 >"$out" 2>"$err"
rc=$?
checkc "podman rm -f of a paused container ($rc) leaves no sandbox, state, cgroup or QEMU" \
	'[ "$rc" -eq 0 ] && [ "$(sandboxes)" -eq 0 ] && [ -z "$(ls -A "$state" 2>/dev/null)" ] && [ -n "$cg4" ] && ! ls -d /sys/fs/cgroup/*"$cg4" 2>/dev/null | grep -q . && wait_for "[ \$(ours) -eq 0 ]" 50'
elapsed "podman lifecycle"

# --- the runtime alone: a flood nobody reads, a monitor that is stopped, a
# create killed half-way ---------------------------------------------------
# runc delivers signals whatever the container's stdout does: a monitor
# whose stdout is a FIFO nobody reads must still answer kill and delete,
# and end once SIGKILL ended the process (its last output dropped).
dstate="$rt/direct"
o() { timeout 30 "$oci" --root "$dstate" "$@"; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
gone() { # gone ID PIDFILE CGROUP: nothing of the container is left
	! o state "$1" >/dev/null 2>&1 && [ ! -e "$dstate/$1" ] && [ "$(sandboxes)" -eq 0 ] &&
		[ "$(ours)" -eq 0 ] && { [ ! -s "$2" ] || ! kill -0 "$(cat "$2")" 2>/dev/null; } &&
		{ [ -z "$3" ] || ! ls -d /sys/fs/cgroup/*"$3" 2>/dev/null | grep -q .; } &&
		! pgrep -f -- "--root $dstate create" >/dev/null
}
cgd1=/capsule-oci-test-flood-$$
cgd3=/capsule-oci-test-half-$$
cgroups="$cgroups $cgd1 $cgd3"
oci_bundle "$rt/b1" "$rt/img/tree" "$cgd1" '["sh", "-c", "while :; do echo xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx; done"]'
mkfifo "$rt/fifo"
exec 7<>"$rt/fifo"	# a reader that never reads
o create --bundle "$rt/b1" --pid-file "$rt/d1.pid" d1 <"/dev/null" >"$rt/fifo" 2>"$err" && o start d1 2>>"$err"
rc=$?
sleep 2	# the pipe and what the monitor holds fill up
t0=$(date +%s%N)
o kill d1 KILL >"$out" 2>>"$err"
rc2=$?
ms=$(ms_since "$t0")
checkc "kill KILL answers while the container's stdout is full and unread ($rc, $rc2, ${ms} ms)" \
	'[ "$rc" -eq 0 ] && [ "$rc2" -eq 0 ] && [ "$ms" -lt 3000 ]'
st1() { o state d1 2>>"$err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>>"$err"; }
wait_for '! kill -0 "$(cat "$rt/d1.pid")" 2>/dev/null' 100
ms=$(ms_since "$t0")
checkc "... and its monitor exits ($ms ms) with 137 though nobody reads; state says stopped" \
	'[ "$ms" -lt 10000 ] && [ "$(st1)" = stopped ] && [ "$(cat "$dstate/d1/exit" 2>/dev/null)" = 137 ]'
t0=$(date +%s%N)
o delete --force d1 >"$out" 2>>"$err"
rc=$?
ms=$(ms_since "$t0")
checkc "... delete --force removes it ($rc, ${ms} ms): no sandbox, state, cgroup, QEMU or monitor" \
	'[ "$rc" -eq 0 ] && [ "$ms" -lt 10000 ] && wait_for "gone d1 $rt/d1.pid $cgd1" 30'
exec 7<&-

# A monitor that does not answer (stopped here): kill says so after its
# deadline, not "not running"; delete --force ends it and its sandbox.
oci_bundle "$rt/b2" "$rt/img/tree" "" '["sleep", "1000"]'
o create --bundle "$rt/b2" --pid-file "$rt/d2.pid" d2 </dev/null >/dev/null 2>"$err" && o start d2 2>>"$err"
# Before that, a non-detached exec --tty --console-socket: the engine's
# resize of the PTY master reaches the guest as SIGWINCH and the size.
python3 - "$oci" "$dstate" d2 "$rt/console.sock" >"$out" 2>>"$err" <<'PY'
import array, fcntl, os, socket, struct, subprocess, sys, termios, time
oci, root, cid, path = sys.argv[1:5]
srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
srv.bind(path)
srv.listen(1)
srv.settimeout(20)
p = subprocess.Popen([oci, "--root", root, "exec", "--tty", "--console-socket", path, cid, "sh", "-c",
                      'echo "size $(stty size)"; trap "echo \\"winch \\$(stty size)\\"" WINCH; '
                      'i=0; while [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done'],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
try:
    c, _ = srv.accept()
    _, anc, _, _ = c.recvmsg(64, socket.CMSG_SPACE(4))
    m = array.array("i", anc[0][2][:4])[0]
    fcntl.ioctl(m, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    os.set_blocking(m, False)
    buf, resized, until = b"", False, time.time() + 15
    while time.time() < until and b"winch 33 99" not in buf:
        try:
            buf += os.read(m, 4096)
        except BlockingIOError:
            time.sleep(0.05)
        if b"size" in buf and not resized:
            time.sleep(0.3)
            fcntl.ioctl(m, termios.TIOCSWINSZ, struct.pack("HHHH", 33, 99, 0, 0))
            resized = True
    sys.stdout.write(buf.decode(errors="replace"))
finally:
    p.terminate()
    try:
        p.wait(10)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
PY
checkc "a non-detached exec --console-socket gets a resize of the master as SIGWINCH (33 99)" \
	'grep -q "^size 24 80" "$out" && grep -q "^winch 33 99" "$out"'
# O_NONBLOCK belongs to a file description, which a monitor shares with
# its caller: an exec -d whose stdout and stderr are the test's FIFO must
# leave the test's description blocking while it runs.
mkfifo "$rt/fifo2"
exec 9<>"$rt/fifo2"
exec 8>"$rt/fifo2"
o exec -d --pid-file "$rt/e2.pid" d2 sleep 3 </dev/null >&8 2>&8
rc=$?
fl=$(sed -n 's/^flags:[[:space:]]*//p' "/proc/$$/fdinfo/8")
checkc "exec -d leaves its caller's stdout blocking while it runs ($rc, flags ${fl:-?})" \
	'[ "$rc" -eq 0 ] && kill -0 "$(cat "$rt/e2.pid")" 2>/dev/null && [ -n "$fl" ] && [ $((fl & 04000)) -eq 0 ]'
exec 8>&- 9<&-
kill -STOP "$(cat "$rt/d2.pid")"
t0=$(date +%s%N)
o kill d2 KILL >"$out" 2>&1
rc=$?
ms=$(ms_since "$t0")
checkc "kill of a container whose monitor is stopped fails within its deadline ($rc, ${ms} ms), naming why" \
	'[ "$rc" -ne 0 ] && [ "$ms" -lt 8000 ] && grep -q "did not answer" "$out" && ! grep -q "not running" "$out"'
t0=$(date +%s%N)
o delete --force d2 >"$out" 2>"$err"
rc=$?
ms=$(ms_since "$t0")
checkc "... delete --force kills it and its sandbox ($rc, ${ms} ms) and leaves nothing" \
	'[ "$rc" -eq 0 ] && [ "$ms" -lt 12000 ] && wait_for "gone d2 $rt/d2.pid \"\"" 30'

# A create killed once its cgroup is made: state.json names what it made,
# so state says stopped and delete removes all of it.
oci_bundle "$rt/b3" "$rt/img/tree" "$cgd3" '["sleep", "1000"]'
"$oci" --root "$dstate" create --bundle "$rt/b3" d3 </dev/null >/dev/null 2>"$err" &
cr=$!
wait_for '[ -d "/sys/fs/cgroup/memory$cgd3" ]' 300
kill -KILL "$cr" 2>/dev/null
wait "$cr" 2>/dev/null
st3=$(o state d3 2>>"$err" | python3 -c 'import json, sys; print(json.load(sys.stdin)["status"])' 2>>"$err")
checkc "a create killed half-way leaves a container that state calls stopped (${st3:-none})" '[ "$st3" = stopped ]'
checkc "... and list shows" 'o list -q 2>>"$err" | grep -qx d3'
o delete d3 >"$out" 2>>"$err"
rc=$?
checkc "... which delete removes whole ($rc): no sandbox, state, cgroup, QEMU or monitor" \
	'[ "$rc" -eq 0 ] && wait_for "gone d3 \"\" $cgd3" 30'

# A cgroupsPath naming someone else's cgroup, a process in it and limits
# of its own: create is refused (runc's rule: a new or empty cgroup
# only), and delete --force signals nothing and removes nothing of it.
cgf=/capsule-oci-test-foreign-$$
cgroups="$cgroups $cgf"
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	fdirs=/sys/fs/cgroup$cgf
	fpids=$fdirs/pids.max fmem=$fdirs/memory.max
else
	fdirs="/sys/fs/cgroup/pids$cgf /sys/fs/cgroup/memory$cgf"
	fpids=/sys/fs/cgroup/pids$cgf/pids.max fmem=/sys/fs/cgroup/memory$cgf/memory.limit_in_bytes
fi
sleep 1000 </dev/null >/dev/null 2>&1 &
fpid=$!
for d in $fdirs; do mkdir -p "$d" && echo "$fpid" >"$d/cgroup.procs"; done
echo 55 >"$fpids"
echo 209715200 >"$fmem"
oci_bundle "$rt/b4" "$rt/img/tree" "$cgf" '["sleep", "1000"]'
python3 - "$rt/b4/config.json" <<'PY2'
import json, sys
c = json.load(open(sys.argv[1]))
c["linux"]["resources"] = {"memory": {"limit": 300 << 20}, "pids": {"limit": 77}}
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY2
o create --bundle "$rt/b4" d4 </dev/null >/dev/null 2>"$err"
rc=$?
checkc "create with a cgroupsPath holding someone else's process is refused ($rc), naming the cgroup and the pid" \
	'[ "$rc" -ne 0 ] && grep -q "not this container" "$err" && grep -q "$cgf" "$err" && grep -q "pid $fpid" "$err"'
o delete --force d4 >"$out" 2>>"$err"
checkc "... and delete --force leaves that process alive and its cgroup as it was (pids.max $(cat "$fpids" 2>/dev/null), memory $(cat "$fmem" 2>/dev/null))" \
	'kill -0 "$fpid" 2>/dev/null && [ "$(cat "$fpids")" = 55 ] && [ "$(cat "$fmem")" = 209715200 ] && [ "$(sandboxes)" -eq 0 ]'
kill "$fpid" 2>/dev/null
wait "$fpid" 2>/dev/null

# A network namespace path that is a FIFO: refused at once, named (its
# open waited for a writer for ever).
mkfifo "$rt/netns-fifo"
oci_bundle "$rt/b5" "$rt/img/tree" "" '["true"]'
python3 - "$rt/b5/config.json" "$rt/netns-fifo" <<'PY2'
import json, sys
c = json.load(open(sys.argv[1]))
c["linux"]["namespaces"] = [n if n["type"] != "network" else {"type": "network", "path": sys.argv[2]}
                            for n in c["linux"]["namespaces"]]
json.dump(c, open(sys.argv[1], "w"), indent=1)
PY2
t0=$(date +%s%N)
timeout 10 "$oci" --root "$dstate" create --bundle "$rt/b5" d5 </dev/null >/dev/null 2>"$err"
rc=$?
ms=$(ms_since "$t0")
checkc "create with a FIFO as the network namespace's path is refused at once ($rc, ${ms} ms), naming it" \
	'[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && [ "$ms" -lt 5000 ] && grep -q "$rt/netns-fifo: it is not a namespace file" "$err" && ! o state d5 >/dev/null 2>&1'
exec 6<>"$rt/netns-fifo"	# frees an open stuck on it, should one be
exec 6<&-
elapsed "the runtime alone"

# --- containerd ---------------------------------------------------------------
# A private instance (its own root, state, sockets; no CRI); the shim it
# starts passes its environment (CAPSULE_HOME) on to the runtime.
mkdir -p "$rt/c"
containerd_config "$rt/c"
containerd --config "$rt/c/config.toml" >"$rt/c/log" 2>&1 &
cpid=$!
c() { ctr -a "$rt/c/sock" "$@"; }
wait_for '[ -S "$rt/c/sock" ] && c version >/dev/null 2>&1' 100
pm save -q --format oci-archive -o "$rt/img.tar" "$img" >"$out" 2>"$err" &&
	c images import "$rt/img.tar" >"$out" 2>>"$err"
checkc "a private containerd runs and imports the image (podman save, ctr images import)" 'c images ls -q | grep -qx "$img"'
run_flags="--runc-binary $oci --runc-root $ctr_root"
# The runc shim's --log, where the runtime writes its errors.
clog() { for f in "$rt"/c/state/io.containerd.runtime.v2.task/default/*/log.json; do [ -f "$f" ] && sed "s|^|# $(basename "$(dirname "$f")") log: |" "$f"; done; }
checkr() { # checkr NAME 'CONDITION': with the runtime's log on failure
	if eval "$2"; then ok "$1"; else fail_ctx "$1" "failed: $2"; clog | tail -20; fi
}

# shellcheck disable=SC2086
c run --rm --read-only --cwd /new/dir $run_flags "$img" id1 sh -c 'uname -r; pwd; touch /z 2>/dev/null; echo "root $?"; exit 3' >"$out" 2>"$err"
rc=$?
checkr "ctr run --rm exits with the container's status (3; got $rc)" '[ "$rc" -eq 3 ]'
checkr "... in the capsule guest ($kver)" '[ "$(sed -n 1p "$out")" = "$kver" ]'
checkr "... --read-only --cwd /new/dir, which the image lacks: made at create, the root read-only" \
	'[ "$(sed -n 2,3p "$out" | paste -sd " ")" = "/new/dir root 1" ]'
checkr "... and leaves no sandbox, state directory or QEMU" '[ "$(sandboxes)" -eq 0 ] && [ ! -e "$ctr_state/id1" ] && [ "$(ours)" -eq 0 ]'

# shellcheck disable=SC2086
c run -d $run_flags "$img" id2 sh -c 'echo started; while :; do sleep 0.1; done' >"$out" 2>"$err"
rc=$?
checkr "ctr run -d starts a task (exit $rc)" '[ "$rc" -eq 0 ] && wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*RUNNING\"" 100'
cg2=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["linux"].get("cgroupsPath", ""))' \
	"$rt/c/state/io.containerd.runtime.v2.task/default/id2/config.json" 2>/dev/null)
cgroups="$cgroups $cg2"
checkr "... in one sandbox with its state under --runc-root" '[ "$(sandboxes)" -eq 1 ] && [ -f "$ctr_state/id2/state.json" ]'
c task exec --exec-id e1 id2 sh -c 'exit 5' >"$out" 2>"$err"
rc=$?
checkr "ctr task exec exits with the process's status (5; got $rc)" '[ "$rc" -eq 5 ]'
c task kill -s KILL id2 >"$out" 2>"$err"
checkr "ctr task kill -s KILL stops the task" 'wait_for "c task ls 2>/dev/null | grep -q \"^id2 .*STOPPED\"" 100'
c task delete id2 >"$out" 2>"$err" && c container rm id2 >>"$out" 2>>"$err"
checkr "ctr task delete and container rm succeed" '[ $? -eq 0 ]'
checkr "nothing is left: no sandbox, state directory or QEMU" '[ "$(sandboxes)" -eq 0 ] && [ ! -e "$ctr_state/id2" ] && [ "$(ours)" -eq 0 ]'
checkr "... and no cgroup ($cg2)" '[ -n "$cg2" ] && ! ls -d /sys/fs/cgroup/*"$cg2" 2>/dev/null | grep -q .'
elapsed "containerd lifecycle"
