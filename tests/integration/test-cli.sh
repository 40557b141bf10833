#!/bin/sh
# Black-box tests of the capsule CLI against real VMs. TAP output.
# Each VM's sockets live under a private XDG_RUNTIME_DIR, so that the test
# can tell its own QEMU processes and leftovers from anyone else's.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"

echo "1..44"

"$capsule" --version >"$out" 2>"$err"
check "--version" 'grep -q '\''^capsule [0-9]'\'' "$out"'
"$capsule" --help >"$out" 2>"$err" && "$capsule" run --help >>"$out" 2>>"$err"
check "--help and run --help" 'grep -q -- '\''--timeout S'\'' "$out"'

"$capsule" run -q -- sh -c 'exit 7' >"$out" 2>"$err"
rc=$?
check "exit code 7 passes through" '[ "$rc" -eq 7 ]'

"$capsule" run -q -- sh -c 'echo to-out; echo to-err >&2' >"$out" 2>"$err"
check "stdout and stderr arrive separately" '[ "$(cat "$out")" = to-out ] && grep -qx to-err "$err"'

"$capsule" run -q -- sh -c 'yes | head -c 1000000' >"$out" 2>"$err"
size=$(wc -c <"$out")
marker_len=$(printf '\n[capsule: output truncated at 262144 bytes]\n' | wc -c)
check "1 MB of output is cut at 256 KiB plus the marker ($size bytes)" '[ "$size" -le $((262144 + marker_len)) ] && [ "$size" -gt 262144 ]'
check "the truncation marker is visible" 'tail -c 100 "$out" | grep -q "output truncated at 262144 bytes" && grep -q "output cap" "$err"'

start=$(date +%s)
"$capsule" run -q --timeout 2 -- sleep 100 >"$out" 2>"$err"
rc=$?
took=$(( $(date +%s) - start ))
check "--timeout 2 kills sleep 100 (exit $rc after ${took}s)" '[ "$rc" -eq 124 ] && [ "$took" -lt 20 ]'
check "the timeout is named in the message" 'grep -q '\''timed out after 2 s'\'' "$err"'

"$capsule" run -q -- sh -c 'kill -9 $$' >"$out" 2>"$err"
rc=$?
check "death by signal 9 gives 137" '[ "$rc" -eq 137 ]'

"$capsule" run -q -- no-such-command >"$out" 2>"$err"
rc=$?
check "a missing command gives 127 and names it" '[ "$rc" -eq 127 ] && grep -q "no-such-command" "$err"'

printf 'line1\nline2\n' | "$capsule" run -q -- sh -c 'wc -l' >"$out" 2>"$err"
check "piped stdin is forwarded" 'grep -qx 2 "$out"'

"$capsule" run -q -- sh -c 'id -u' >"$out" 2>"$err"
check "commands run as UID 1000" 'grep -qx 1000 "$out"'

# Ctrl-C: the command is interrupted and the VM removed.
"$capsule" run -q -- sh -c 'echo started; sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
kill -INT "$pid"
wait "$pid"
rc=$?
check "Ctrl-C stops the command (exit $rc)" '[ "$rc" -eq 130 ]'
clean_after "Ctrl-C"

# A guest that does not end a command on time (its QEMU frozen with
# SIGSTOP) is given up on at the timeout + 5 s and its VM destroyed.
timeout -s KILL 30 "$capsule" run -q --timeout 2 -- sh -c 'echo started; exec sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
s0=$(date +%s%N)
kill -STOP $(pgrep -f "qemu-system.*$rt/capsule-")
wait "$pid"
rc=$?
ms=$((($(date +%s%N) - s0) / 1000000))
check "run: a frozen guest is given up on at the timeout + 5 s (exit $rc after $ms ms)" \
	'[ "$rc" -eq 124 ] && [ "$ms" -lt 8000 ] && grep -q "did not end it within 5 s more" "$err" && grep -q "destroying the VM" "$err"'
clean_after "a frozen guest"

# QEMU runs confined by what capsule sets before exec: seccomp filter
# mode, no new privileges, no core dumps.
"$capsule" run -q -- sh -c 'echo started; sleep 5' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
qpid=$(pgrep -f "qemu-system.*$rt/capsule-" | head -1)
status=$(cat /proc/"$qpid"/status 2>/dev/null)
limits=$(cat /proc/"$qpid"/limits 2>/dev/null)
check "QEMU runs with seccomp (mode 2) and no_new_privs" 'echo "$status" | grep -q "^Seccomp:[[:space:]]*2" && echo "$status" | grep -q "^NoNewPrivs:[[:space:]]*1"'
check "QEMU may not dump core" 'echo "$limits" | grep -q "^Max core file size *0 *0 "'
wait "$pid"

# SIGKILL of capsule itself: QEMU must not outlive it.
"$capsule" run -q -- sh -c 'echo started; sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
kill -KILL "$pid"
wait "$pid" 2>/dev/null
wait_for '[ "$(ours)" -eq 0 ]' 50
check "QEMU dies with a SIGKILLed capsule" '[ "$(ours)" -eq 0 ]'
rm -rf "$rt"/capsule-*	# a SIGKILLed process cannot clean its run dir

# A failed boot: a kernel that is not a kernel.
printf 'not a kernel' >"$rt/bad-vmlinux"
CAPSULE_KERNEL="$rt/bad-vmlinux" "$capsule" run -q -- true >"$out" 2>"$err"
rc=$?
check "a broken kernel fails with 125 and QEMU's words" '[ "$rc" -eq 125 ] && grep -q "QEMU" "$err"'
rm -f "$rt/bad-vmlinux"
clean_after "failed boot"

CAPSULE_KERNEL=/nonexistent/vmlinux "$capsule" run -q -- true >"$out" 2>"$err"
rc=$?
check "a missing kernel is named, with what to do" '[ "$rc" -eq 125 ] && grep -q "/nonexistent/vmlinux" "$err" && grep -q "make kernel" "$err"'

# Sizes: refused at request time with exit 2, naming the value and the
# bound, on run and create alike; --force-size lifts the host's bounds.
ncpu=$(getconf _NPROCESSORS_ONLN)
total=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
reserve=$((total / 10 > 512 ? total / 10 : 512))
most=$((total - reserve))
avail=$(df -Pm "$rt" | awk 'NR == 2 { print $4 }')
"$capsule" image build base >/dev/null 2>&1
refused() { # refused VERB 'OPTIONS' 'MESSAGE'
	if [ "$1" = run ]; then "$capsule" run -q $2 -- true >"$out" 2>"$err"
	else "$capsule" create sz $2 >"$out" 2>"$err"; fi
	rc=$? want=$3
	check "$1 $2 is refused with exit 2 ($rc), naming the value and the bound" '[ "$rc" -eq 2 ] && grep -qF -- "$want" "$err" && [ ! -e "$CAPSULE_HOME/sandboxes/sz" ]'
}
for verb in run create; do
	refused $verb "--cpus 0" "--cpus 0 is out of range: 1 to 16 vCPUs"
	refused $verb "--cpus 17" "--cpus 17 is out of range: 1 to 16 vCPUs"
	if [ "$ncpu" -lt 16 ]; then
		refused $verb "--cpus $((ncpu + 1))" "--cpus $((ncpu + 1)) is more than this host's $ncpu online CPUs"
	else
		skip "$verb --cpus above the host's CPUs is refused" "this host has 16 CPUs or more"
	fi
	refused $verb "--memory 127" "--memory 127 MiB is out of range: 128 to 1048576 MiB"
	refused $verb "--memory $((most + 1))" "--memory $((most + 1)) MiB is more than this host can give: at most $most MiB (its $total MiB less a reserve of $reserve MiB"
done
refused create "--root-size 15" "--root-size 15 MiB is out of range: 16 to 1048576 MiB"
refused create "--work-size 1048577" "--work-size 1048577 MiB is out of range: 16 to 1048576 MiB"
if [ "$avail" -lt $((1048576 - 1024)) ]; then
	refused create "--work-size $((avail + 1024))" "--work-size $((avail + 1024)) MiB ($((avail + 1024 + 256)) MiB together) are more than the"
else
	skip "create --work-size above the free space is refused" "more than 1 TiB free"
fi
"$capsule" create sz --memory "$most" >"$out" 2>"$err"
rc=$?
check "create --memory $most, the host's bound itself, is accepted" '[ "$rc" -eq 0 ]'
"$capsule" rm sz >/dev/null 2>&1
if [ "$ncpu" -lt 16 ]; then
	"$capsule" run -q --force-size --cpus $((ncpu + 1)) -- nproc >"$out" 2>"$err"
	check "run --force-size --cpus $((ncpu + 1)) boots a guest with $((ncpu + 1)) vCPUs" 'grep -qx $((ncpu + 1)) "$out"'
	"$capsule" create sz --force-size --cpus $((ncpu + 1)) >"$out" 2>"$err"
	check "create --force-size --cpus $((ncpu + 1)) is accepted" '[ $? -eq 0 ] && grep -q "created sandbox sz" "$out"'
else
	skip "run --force-size above the host's CPUs" "this host has 16 CPUs or more"
	"$capsule" create sz >"$out" 2>"$err"
	skip "create --force-size above the host's CPUs" "this host has 16 CPUs or more"
fi
# A sandbox's disks are its owner's only; QEMU gets descriptors from the jail.
modes=$(cd "$CAPSULE_HOME/sandboxes/sz" && stat -c '%a %n' root-upper.ext4 private.ext4 source.erofs | tr '\n' ' ')
check "a created sandbox's disk files are 0600 ($modes)" '[ "$modes" = "600 root-upper.ext4 600 private.ext4 600 source.erofs " ]'
"$capsule" exec sz -- true >"$out" 2>"$err"
check "a sandbox with 0600 disks starts and runs a command" '[ $? -eq 0 ]'
"$capsule" rm --force sz >/dev/null 2>&1

"$capsule" run >"$out" 2>"$err"
rc=$?
check "run without a command is refused" '[ "$rc" -eq 2 ]'

"$capsule" doctor >"$out" 2>"$err"
if grep -qE '^flags.* (vmx|svm)' /proc/cpuinfo && [ -w /dev/kvm ]; then
	check "doctor names KVM on a host with hardware virtualization" 'grep -q '\''^accel: *kvm'\'' "$out"'
	skip "--accel kvm refuses without KVM" "this host has usable KVM"
else
	check "doctor names TCG and why KVM was not used" 'grep -q "^accel: *tcg (KVM not used: " "$out" && grep -q "WARNING" "$out"'
	"$capsule" run --accel kvm -- true >"$out" 2>"$err"
	rc=$?
	check "--accel kvm refuses to start without KVM" '[ "$rc" -eq 125 ] && grep -q "asks for KVM" "$err"'
fi
clean_after "whole suite"
