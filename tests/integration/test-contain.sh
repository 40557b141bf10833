#!/bin/sh
# Black-box tests of command containment in the guest: each command runs
# in its own cgroup with a pids.max, and whatever it started (setsid,
# double fork, a fork bomb) is killed with it, at its end, its timeout or
# a kill from the host. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
now() { date +%s%N | cut -c1-13; }	# milliseconds
# A bound for calls that must end on their own: a failing agent must not
# hang the suite.
t() { timeout -s KILL 40 "$capsule" "$@"; }
BOMB='f(){ f|f& }; f 2>/dev/null; sleep 100'
# Processes of earlier commands still alive, as "ps" lines naming MARK.
left() { grep -c "$1" "$out"; }

echo "1..14"

# --- capsule run --------------------------------------------------------------
c run -q -- sh -c 'exit 7' >"$out" 2>"$err"
rc=$?
check "run: exit 7 comes through as 7" '[ "$rc" -eq 7 ]'
c run -q -- sh -c 'setsid sleep 1000 >/dev/null 2>&1 & kill -KILL $$' >"$out" 2>"$err"
rc=$?
check "run: a command killed by SIGKILL that left a setsid child reports 137" '[ "$rc" -eq 137 ]'
c run -q -- sh -c 'cat /proc/self/cgroup; cat /sys/fs/cgroup/$(cut -d/ -f2 /proc/self/cgroup)/pids.max' >"$out" 2>"$err"
check "run: the command runs in its own cgroup with pids.max 1024" \
	'head -1 "$out" | grep -qx "0::/cmd-[0-9]*" && sed -n 2p "$out" | grep -qx 1024'
s=$(now)
t run -q --timeout 5 -- sh -c "$BOMB" >"$out" 2>"$err"
rc=$? ms=$(($(now) - s))
check "run: a fork bomb with --timeout 5 ends with 124 within 5 s + boot + 4 s ($ms ms)" \
	'[ "$rc" -eq 124 ] && [ "$ms" -lt 11000 ]'

# --- a named sandbox ------------------------------------------------------------
c image build base >/dev/null 2>&1
c create k >"$out" 2>"$err"
t exec k -- sh -c 'touch /tmp/same-vm' >"$out" 2>"$err"
check "create and start a named sandbox" '[ $? -eq 0 ]'

# (a) setsid and a double-forked daemon started by one command are gone in
# the next.
t exec k -- sh -c 'setsid sleep 1000 >/dev/null 2>&1 </dev/null &
	(sh -c "sleep 1001 </dev/null >/dev/null 2>&1 &" &)
	sleep 0.3; echo started' >"$out" 2>"$err"
check "exec: a command that leaves a setsid child and a daemon returns at once" \
	'[ $? -eq 0 ] && grep -qx started "$out"'
t exec k -- ps -o pid,args >"$out" 2>"$err"
check "exec: the next command sees neither the setsid child nor the daemon" \
	'[ "$(left "sleep 100[01]")" -eq 0 ] && grep -q "ps -o" "$out"'

# A kill from the host (its client killed): the whole cgroup goes.
"$capsule" exec k -- sh -c 'setsid sleep 1002 >/dev/null 2>&1 </dev/null & sleep 100' >/dev/null 2>&1 &
pid=$!
sleep 2
kill -KILL "$pid"
wait "$pid" 2>/dev/null
sleep 0.5
t exec k -- ps -o pid,args >"$out" 2>"$err"
check "exec: a command whose client was killed leaves nothing behind" \
	'[ "$(left "sleep 100[02]")" -eq 0 ] && grep -q "ps -o" "$out"'

# (b) fork bombs, ten in a row, each ended on time: within its timeout
# plus the host's grace (5 s), the promise whoever keeps it (the guest, as
# measured here, ends them within about 1.5 s of the timeout).
times=""
bad=0
for i in 1 2 3 4 5 6 7 8 9 10; do
	s=$(now)
	t exec --timeout 5 k -- sh -c "$BOMB" >"$out" 2>"$err"
	rc=$? ms=$(($(now) - s))
	times="$times ${ms}ms"
	[ "$rc" -eq 124 ] && [ "$ms" -lt 10500 ] || bad=$((bad + 1))
done
check "exec: 10 fork bombs with --timeout 5 each end with 124 within 5 s + 5 s (${times# })" '[ "$bad" -eq 0 ]'
t exec k -- sh -c 'echo ok; ls /tmp/same-vm; ps -o user,pid,args | grep -c "^ *user" ; ls /sys/fs/cgroup | grep -c "^cmd-"' >"$out" 2>"$err"
check "exec: after the bombs the same VM answers, with no process or cgroup left" \
	'[ "$(sed -n 1p "$out")" = ok ] && [ "$(sed -n 2p "$out")" = /tmp/same-vm ] && [ "$(sed -n 3p "$out")" -le 3 ] && [ "$(sed -n 4p "$out")" -eq 1 ]'

# (c) the main process's status still comes through.
t exec k -- sh -c 'sleep 1003 >/dev/null 2>&1 & exit 7' >"$out" 2>"$err"
check "exec: exit 7 with a child left behind comes through as 7" '[ $? -eq 7 ]'
t exec k -- sh -c 'kill -TERM $$' >"$out" 2>"$err"
check "exec: killed by SIGTERM comes through as 143" '[ $? -eq 143 ]'
t exec k -- ps -o pid,args >"$out" 2>"$err"
check "exec: the child of the exit-7 command is gone" '[ "$(left "sleep 1003")" -eq 0 ]'

c stop k >/dev/null 2>&1
clean_after "contain"
