#!/bin/sh
# The KVM suite's checks, run where /dev/kvm works: on a KVM host, or in
# the L1 guest of tests/kvm/l1.sh (tests/integration/test-kvm.sh decides).
# Everything here runs under KVM and fails if it does not: `run` (output,
# exit codes, timeout), a template built and restored under KVM with its
# RAM shared, a named sandbox's lifecycle with /work kept, kill -9 of QEMU
# and of the shim then recovery, CAPSULE_REQUIRE_KVM, the jail's own
# /dev/kvm, and the OCI runtime's cgroup v2 limits. The jail suite, the
# network policy and serve's idle pause run after it (suite.sh calls
# them). TAP output.
#   tests/kvm/suite.sh BUILD/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(dirname "$capsule")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/../integration/lib.sh"
c() { "$capsule" "$@"; }
sbdir() { echo "$CAPSULE_HOME/sandboxes/$1"; }
state() { c ls | awk -v n="$1" '$1 == n { print $3 }'; }
status() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$2/status"; }
count() { c template ls | tail -n +2 | wc -l; }
plan=35
suite="KVM suite"
start=$(date +%s)
echo "1..$plan"

# --- the accelerator, as a new user finds it -------------------------------
c doctor >"$out" 2>"$err"
accel=$(sed -n 's/^accel: *//p' "$out")
echo "# accel: $accel"
echo "# /dev/kvm: $(ls -l /dev/kvm 2>&1)"
check "doctor picks KVM" 'echo "$accel" | grep -q "^kvm"'
[ "${accel%% *}" = kvm ] || fail_all "no KVM here ($accel): nothing else in this suite would run under KVM"
c doctor --json >"$out" 2>"$err"
check "doctor --json says kvm with no isolation warning" 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"accel\"][\"name\"] == \"kvm\" and d[\"isolation_warning\"] is None" "$out"'

# --- run --------------------------------------------------------------------
c run -v -- uname -r >"$out" 2>"$err"
rc=$?
sed 's/^/# first run: /' "$err" | grep -E 'accel|template|cold|restored' | head -5
check "run -- uname -r prints the capsule kernel under KVM" '[ "$rc" -eq 0 ] && grep -q -- "-capsule$" "$out" && ! grep -qi "tcg" "$err"'
elapsed "first run (template built)"
c run -q -v -- sh -c 'echo out; echo err >&2; exit 7' >"$out" 2>"$err"
rc=$?
check "output and the exit code pass through (7)" '[ "$rc" -eq 7 ] && grep -qx out "$out" && grep -qx err "$err"'
check "the next run is restored from the KVM template" 'grep -q "restored from template" "$err" && [ "$(count)" -eq 1 ]'
c template ls --json >"$out" 2>"$err"
check "the template was made under KVM" 'grep -q "\"shape\": *\"[^\"]*kvm" "$out"'
c run -q -- sh -c 'grep -m1 -o "hypervisor" /proc/cpuinfo; cat /sys/devices/system/clocksource/clocksource0/current_clocksource' >"$out" 2>"$err"
echo "# guest sees: $(tr '\n' ' ' <"$out")"
check "the guest runs on KVM's clock (kvm-clock)" 'grep -qx kvm-clock "$out"'
t0=$(date +%s)
c run -q --timeout 2 -- sleep 60 >"$out" 2>"$err"
rc=$?
took=$(($(date +%s) - t0))
check "a command past its --timeout is ended: exit 124 (${took} s)" '[ "$rc" -eq 124 ] && [ "$took" -lt 30 ]'
c run -q -- nosuchcommand >"$out" 2>"$err"
check "a command not found exits 127" '[ $? -eq 127 ]'
a=$(c run -q -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
b=$(c run -q -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
check "two VMs restored from one KVM template draw different random bytes" '[ ${#a} -eq 32 ] && [ "$a" != "$b" ]'
check "no QEMU is left after one-shot runs" '[ "$(ours)" -eq 0 ]'
elapsed "runs"

# --- a named sandbox under KVM: its jail, its lifecycle, its durability -----
c create --memory 256 k1 >"$out" 2>"$err"
check "create k1" '[ $? -eq 0 ]'
c exec k1 -- sh -c 'echo kept > /work/f; sync' >"$out" 2>"$err"
check "exec writes /work" '[ $? -eq 0 ]'
p1=$(rtv "$(sbdir k1)" qemu_pid)
check "its QEMU uses shared template RAM (a sealed memfd) under KVM" '[ -n "$p1" ] && grep -q "/memfd:" "/proc/$p1/maps"'
# The jail, as the jail suite checks it under TCG.
u1=$(status Uid "$p1")
differ=0
for ns in mnt pid ipc uts net; do
	[ "$(readlink "/proc/$p1/ns/$ns")" != "$(readlink "/proc/self/ns/$ns")" ] && differ=$((differ + 1))
done
echo "# QEMU $p1: uid $u1, $differ namespaces of its own, Seccomp $(status Seccomp "$p1"), NoNewPrivs $(status NoNewPrivs "$p1")"
check "QEMU runs as a user of its own in five namespaces of its own, seccomp filter mode and no_new_privs" '[ "$u1" -ge 1900000000 ] && [ "$differ" -eq 5 ] && [ "$(status Seccomp "$p1")" = 2 ] && [ "$(status NoNewPrivs "$p1")" = 1 ]'
check "its QEMU holds its own /dev/kvm, not group 0 or another group" '[ -z "$(status Groups "$p1")" ] && ls -l "/proc/$p1/fd" | grep -q "/dev/kvm"'
kv=$(stat -c '%u %a %t:%T' "/proc/$p1/root/dev/kvm" 2>&1)
echo "# its /dev/kvm: $kv; the host's: $(stat -c '%u %a %t:%T' /dev/kvm)"
check "the jail's /dev/kvm is the jail user's, 0600" '[ "$kv" = "$u1 600 a:e8" ]'
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	cg=/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$p1/cgroup")
	mem=$(cat "$cg/memory.max"); pids=$(cat "$cg/pids.max"); w=$(cat "$cg/cpu.weight"); swap=$(cat "$cg/memory.swap.max" 2>/dev/null)
	echo "# cgroup v2 $cg: memory.max $mem, memory.swap.max $swap, pids.max $pids, cpu.weight $w"
	check "cgroup v2: capsule/vm-N with memory.max = 2 x 256 + 256 MiB (shared RAM), pids.max 130, cpu.weight 100, no swap" '[ "${cg%/vm-*}" = /sys/fs/cgroup/capsule ] && [ "$mem" = $(((2 * 256 + 256) * 1048576)) ] && [ "$pids" = 130 ] && [ "$w" = 100 ] && [ "${swap:-0}" = 0 ]'
else
	skip "the jail's cgroup v2" "this host mounts cgroup v1 (the jail suite checks v1)"
fi
c exec k1 -- sh -c 'x=$(head -c 1000000000 /dev/zero | tr "\0" x); echo survived ${#x}' >"$out" 2>"$err"
rc=$?
peak=$(cat "$cg/memory.peak" 2>/dev/null || echo 0)
echo "# a guest allocation of 1 GB in 256 MiB: exit $rc; QEMU's peak $peak of ${mem:-?}"
check "a guest allocating 4 times its RAM is killed inside the guest; QEMU stays under its ceiling" '[ "$rc" -ne 0 ] && [ "$rc" -ne 125 ] && ! grep -q survived "$out" && [ "$(rtv "$(sbdir k1)" qemu_pid)" = "$p1" ] && [ "$peak" -le "$mem" ]'
c stop k1 >"$out" 2>"$err"
check "stop ends QEMU and removes its cgroup" '[ $? -eq 0 ] && ! kill -0 "$p1" 2>/dev/null && [ ! -d "${cg:-/nonexistent}" ]'
c start k1 >"$out" 2>"$err"
c exec k1 -- cat /work/f >"$out" 2>"$err"
check "start again: /work kept" 'grep -qx kept "$out"'
answer=$(pause_vm "$(rtv "$(sbdir k1)" control)")
check "pause: the shim pauses a KVM guest" '[ "$answer" = 0 ] && [ "$(state k1)" = paused ]'
c exec k1 -- cat /work/f >"$out" 2>"$err"
check "exec resumes it, /work intact" 'grep -qx kept "$out" && [ "$(state k1)" = running ]'
# Durable results: written without sync, QEMU killed (SIGKILL) as soon
# as the call returns, there after the restart (the durable suite does
# 20 cycles under TCG).
lost=""
for j in 1 2 3; do
	c exec k1 -- sh -c "printf %s 'content-$j' > /work/d_$j" >"$out" 2>"$err" || lost="$lost $j(exec)"
	q=$(rtv "$(sbdir k1)" qemu_pid)
	kill -KILL "$q"
	wait_for '! kill -0 "$q" 2>/dev/null && [ "$(state k1)" = stopped ]' 200 || lost="$lost $j(no crash)"
done
c exec k1 -- sh -c 'for j in 1 2 3; do cat /work/d_$j; echo; done; cat /work/f' >"$out" 2>"$err"
echo "# after 3 kills of QEMU: $(tr '\n' ' ' <"$out")"
check "files written without sync survive kill -9 of QEMU right after each call, 3 of 3" '[ -z "$lost" ] && [ "$(tr "\n" " " <"$out")" = "content-1 content-2 content-3 kept " ]'
shim1=$(rtv "$(sbdir k1)" shim_pid); qemu1=$(rtv "$(sbdir k1)" qemu_pid)
kill -KILL "$shim1" "$qemu1"
wait_for '! kill -0 "$shim1" 2>/dev/null && ! kill -0 "$qemu1" 2>/dev/null' 100
c start k1 >"$out" 2>"$err"
rc=$?
c exec k1 -- cat /work/f >>"$out" 2>>"$err"
check "after kill -9 of shim and QEMU, start recovers and /work is intact" '[ "$rc" -eq 0 ] && grep -qx kept "$out" && [ "$(rtv "$(sbdir k1)" shim_pid)" != "$shim1" ]'
c rm --force k1 >"$out" 2>"$err"
check "rm --force removes it and its QEMU" '[ $? -eq 0 ] && [ ! -e "$(sbdir k1)" ] && [ "$(ours)" -eq 0 ]'
elapsed "lifecycle"

# --- CAPSULE_REQUIRE_KVM ----------------------------------------------------
CAPSULE_REQUIRE_KVM=1 c run -q -- true >"$out" 2>"$err"
check "CAPSULE_REQUIRE_KVM=1 runs where KVM works" '[ $? -eq 0 ]'
# KVM gone (its module cannot be unloaded while others use it, so hide
# the device: a /dev of a mount namespace's own without it): a clear
# refusal, never a fall back to TCG.
nokvm() {
	unshare -m sh -c 'mount -t tmpfs -o mode=0755 nokvm /dev || exit 125
		mknod -m 0666 /dev/null c 1 3 && mknod -m 0666 /dev/zero c 1 5 &&
		mknod -m 0666 /dev/urandom c 1 9 && mknod -m 0666 /dev/random c 1 8 || exit 125
		exec "$@"' nokvm "$@"
}
CAPSULE_REQUIRE_KVM=1 nokvm "$capsule" run -q -- true >"$out" 2>"$err"
rc=$?
check "CAPSULE_REQUIRE_KVM=1 without /dev/kvm refuses (125), naming it" '[ "$rc" -eq 125 ] && grep -q "/dev/kvm" "$err" && grep -q "CAPSULE_REQUIRE_KVM" "$err"'
# /dev/kvm that opens but is not KVM (another device at its path).
unshare -m sh -c 'mount --bind /dev/null /dev/kvm && CAPSULE_REQUIRE_KVM=1 exec "$0" run -q -- true' "$capsule" >"$out" 2>"$err"
rc=$?
check "CAPSULE_REQUIRE_KVM=1 with a /dev/kvm that is not KVM refuses (125), naming it" '[ "$rc" -eq 125 ] && grep -q "/dev/kvm" "$err" && ! grep -q "^qemu-system" "$err"'
# (A TCG guest inside L1 is TCG inside TCG: too slow to boot in time;
# the TCG suites run TCG.)
nokvm "$capsule" doctor >"$out" 2>"$err"
check "without it, auto would take TCG and doctor says why, naming /dev/kvm" 'grep -q "^accel: *tcg (KVM not used: .*/dev/kvm" "$out"'

elapsed "CAPSULE_REQUIRE_KVM"

# --- /dev/kvm as devtmpfs makes it without udev -----------------------------
mode=$(stat -c '%a %U:%G' /dev/kvm)
chown root:root /dev/kvm && chmod 0600 /dev/kvm
c run -q -- uname -r >"$out" 2>"$err"
rc=$?
check "with /dev/kvm root:root 0600 a run works, or fails naming /dev/kvm and what to do" '{ [ "$rc" -eq 0 ] && grep -q -- "-capsule$" "$out"; } || { grep -q "/dev/kvm" "$err" && ! grep -q "^Could not access KVM" "$err"; }'
check "with /dev/kvm root:root 0600 a run works" '[ "$rc" -eq 0 ] && grep -q -- "-capsule$" "$out"'
chmod "${mode%% *}" /dev/kvm && chown "${mode#* }" /dev/kvm 2>/dev/null
"$here/check-devkvm.sh" "$capsule" >"$rt/devkvm" 2>&1
kvmok=$?
sed 's/^/#   /' "$rt/devkvm"
check "/dev/kvm root:root 0600: doctor as root and as another user, --accel kvm not root" '[ "$kvmok" -eq 0 ]'
elapsed "/dev/kvm"

# --- the OCI runtime on cgroup v2 -------------------------------------------
if [ -f /sys/fs/cgroup/cgroup.controllers ]; then
	"$here/check-oci-v2.sh" "$build" >"$rt/oci" 2>&1
	ociok=$?
	sed 's/^/#   /' "$rt/oci"
	check "the OCI runtime's cgroup v2 limits (memory, pids, cpu) and its leaf" '[ "$ociok" -eq 0 ]'
else
	skip "the OCI runtime's cgroup v2 limits" "this host mounts cgroup v1; L1 mounts v2"
fi
clean_after "KVM suite"
elapsed "KVM suite"
