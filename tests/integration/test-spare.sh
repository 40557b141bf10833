#!/bin/sh
# Spares for capsule run (docs/cli.md, "Spares for capsule run"):
# `capsule spares` keeps a VM restored and warmed; a plain run takes it,
# its output, exit code, stdin and timeout as always; a spare is given
# once, goes with its run (ended or killed) and is replaced; two runs'
# entropy differs and the clock is the host's; a run of another shape,
# or with CAPSULE_SPARES=0, does not take one; one holder per home; bad
# input; the holder's end takes every VM with it. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
log="$rt/spares.log"
holder=
stop_holder() {
	[ -n "$holder" ] && kill -TERM "$holder" 2>/dev/null && wait "$holder" 2>/dev/null
	holder=
}
trap 'stop_holder; cleanup' EXIT
readies() { cat "$log" 2>/dev/null | grep -c "spare ready"; }
# The VM pid a -v run's boot note names, from $err.
spare_pid() { sed -n 's/.*a spare of `capsule spares` (pid [0-9]*): VM pid \([0-9]*\),.*/\1/p' "$err" | head -1; }
gone() { ! kill -0 "$1" 2>/dev/null; }

echo "1..25"

c run -v -- true >"$out" 2>"$err"
check "without a holder a run restores as always (and the template is made)" '! grep -q "spare" "$err" && grep -q "restored from template" "$err"'

"$capsule" spares --count 1 >/dev/null 2>"$log" &
holder=$!
wait_for '[ "$(readies)" -ge 1 ]' 600
check "capsule spares keeps one ready" '[ "$(readies)" -ge 1 ] && [ -S "$CAPSULE_HOME/spares/run.sock" ]'
c spares >"$out" 2>"$err"
rc=$?
check "a second holder for the same home is refused (125), naming the first" '[ "$rc" -eq 125 ] && grep -q "pid $holder" "$err"'

c run -v -- sh -c 'echo hi; echo oops >&2; exit 3' >"$out" 2>"$err"
rc=$?
p1=$(spare_pid)
check "a plain run takes the spare (boot note)" '[ -n "$p1" ]'
check "its output and exit code are the command's" '[ "$rc" -eq 3 ] && [ "$(cat "$out")" = hi ] && grep -q "^oops$" "$err"'
check "its start is the hand-over (-v's phases)" 'grep -q "start .* ms: prepare .*, spare " "$err"'
wait_for "gone $p1" 100
check "its VM goes with the run (pid $p1)" "gone $p1"
wait_for '[ "$(readies)" -ge 2 ]' 600
check "another spare is made in the background" '[ "$(readies)" -ge 2 ]'
cg=$(c run -v -- cat /proc/self/cgroup 2>"$err")
check "the spare was warmed: the run's command is the guest's second (cgroup $cg)" '[ -n "$(spare_pid)" ] && [ "$cg" = "0::/cmd-2" ]'
wait_for '[ "$(readies)" -ge 3 ]' 600

r1=$(c run -v -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"' 2>"$err")
p2=$(spare_pid)
check "a spare is never given twice (VM pid $p2, then $p1)" '[ -n "$p2" ] && [ "$p2" != "$p1" ]'
wait_for '[ "$(readies)" -ge 4 ]' 600
r2=$(c run -v -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"' 2>"$err")
p3=$(spare_pid)
check "two spares' /dev/urandom differ" '[ -n "$p3" ] && [ ${#r1} -eq 32 ] && [ "$r1" != "$r2" ]'

wait_for '[ "$(readies)" -ge 5 ]' 600
sleep 3	# it waits: the guest's clock must still be the host's
host=$(date +%s)
guest=$(c run -v -- date +%s 2>"$err")
check "a spare's clock is the host's ($guest against $host)" '[ -n "$(spare_pid)" ] && [ $((guest - host)) -lt 5 ] && [ $((host - guest)) -lt 5 ]'

wait_for '[ "$(readies)" -ge 6 ]' 600
got=$(echo abc | c run -v -- cat 2>"$err")
check "standard input reaches a spare's command" '[ -n "$(spare_pid)" ] && [ "$got" = abc ]'
wait_for '[ "$(readies)" -ge 7 ]' 600
c run -v --timeout 1 -- sleep 10 >"$out" 2>"$err"
rc=$?
check "--timeout holds in a spare (124)" '[ -n "$(spare_pid)" ] && [ "$rc" -eq 124 ]'

wait_for '[ "$(readies)" -ge 8 ]' 600
"$capsule" run -v -- sleep 60 >"$out" 2>"$err" &
run=$!
wait_for '[ -n "$(spare_pid)" ]' 100
pk=$(spare_pid)
kill -KILL "$run"
wait "$run" 2>/dev/null
wait_for "gone $pk" 100
check "a run killed with SIGKILL: its VM goes all the same (pid $pk)" '[ -n "$pk" ] && gone "$pk"'

wait_for '[ "$(readies)" -ge 9 ]' 600
c run -v --root -- id -u >"$out" 2>"$err"
check "a run as root does not take a spare (another SETUP)" '[ "$(cat "$out")" = 0 ] && ! grep -q "spare" "$err"'
c run -v --memory 256 -- true >"$out" 2>"$err"
rc=$?
check "a run of another size is not given one, and says why" '[ "$rc" -eq 0 ] && grep -q "no spare: \`capsule spares\` keeps spares of template" "$err"'
CAPSULE_SPARES=0 c run -v -- true >"$out" 2>"$err"
check "CAPSULE_SPARES=0: no spare taken" '! grep -q "spare" "$err" && grep -q "restored from template" "$err"'

c spares --count 0 >"$out" 2>"$err"
rc=$?
check "--count 0 is refused (2), by value" '[ "$rc" -eq 2 ] && grep -q "\-\-count .0." "$err"'
c spares extra >"$out" 2>"$err"
rc=$?
check "an argument is refused (2), by value" '[ "$rc" -eq 2 ] && grep -q "extra" "$err"'
CAPSULE_TEMPLATES=0 c spares >"$out" 2>"$err"
rc=$?
check "CAPSULE_TEMPLATES=0 is refused (2): spares are template restores" '[ "$rc" -eq 2 ] && grep -q "CAPSULE_TEMPLATES=0" "$err"'

ready_pid=$(sed -n 's/.*spare ready: VM pid \([0-9]*\),.*/\1/p' "$log" | tail -1)
pid=$holder
stop_holder
check "the holder ends on SIGTERM and its ready spare's VM with it (pid $ready_pid)" '[ -n "$ready_pid" ] && gone "$ready_pid" && gone "$pid" && grep -q "every spare.s VM is gone" "$log"'
check "its socket is gone" '[ ! -e "$CAPSULE_HOME/spares/run.sock" ]'
c run -v -- true >"$out" 2>"$err"
check "a run after it restores as always" '! grep -q "spare" "$err" && grep -q "restored from template" "$err"'
clean_after "spares"
