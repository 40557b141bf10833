#!/bin/sh
# Snapshots and forks (docs/cli.md, "Snapshots and forks"): pause and
# resume; a fork of a running sandbox whose children go on with the
# parent's background process, read what it wrote, write apart from each
# other and the parent, differ in entropy and hostname; create --from; a
# child's restart; a fork of a fork; a snapshot with dependants refused
# removal; bad input refused by name. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
state() { c ls | awk -v n="$1" '$1 == n { print $3 }'; }
tick() { c exec "$1" -- cat /tmp/tick 2>/dev/null; }

echo "1..32"

# --- pause and resume ------------------------------------------------------------------
c create p -q >"$out" 2>"$err" && c exec p -- sh -c 'echo 1 > /work/x' >"$out" 2>"$err"
check "a sandbox made and written to" '[ "$(c exec p -- cat /work/x)" = 1 ]'
c pause p >"$out" 2>"$err"
check "pause freezes it: its state is paused" '[ "$(state p)" = paused ]'
c resume p >"$out" 2>"$err"
check "resume continues it" '[ "$(state p)" = running ] && [ "$(c exec p -- cat /work/x)" = 1 ]'
c pause p >/dev/null 2>&1
check "a paused sandbox's next command wakes it" '[ "$(c exec p -- cat /work/x)" = 1 ] && [ "$(state p)" = running ]'

# --- a background process, then the fork ---------------------------------------------------
# No time limit: exec's default 30 s would end it part way through a
# slow run, and the checks below would read a file no process writes.
c exec --timeout 0 p -- sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/tick; sleep 0.2; done' >/dev/null 2>&1 &
loop=$!
sleep 3
c fork p --count 3 >"$out" 2>"$err"
rc=$?
check "fork --count 3 starts three children and prints their names" '[ "$rc" -eq 0 ] && [ "$(tr "\n" " " <"$out")" = "p-1 p-2 p-3 " ]'
check "each child reads what the parent wrote" '[ "$(c exec p-1 -- cat /work/x)$(c exec p-2 -- cat /work/x)$(c exec p-3 -- cat /work/x)" = 111 ]'
a=$(tick p-1); sleep 2; b=$(tick p-1)
check "a child continues the background process the parent started ($a, then $b)" '[ -n "$a" ] && [ -n "$b" ] && [ "$b" -gt "$a" ]'
a=$(tick p); sleep 1; b=$(tick p)
check "the parent went on running, its process too ($a, then $b)" '[ "$(state p)" = running ] && [ "$b" -gt "$a" ]'
for k in 1 2 3; do c exec p-$k -- sh -c "echo child$k > /work/y" >/dev/null 2>&1; done
check "children's writes diverge" '[ "$(c exec p-1 -- cat /work/y)$(c exec p-2 -- cat /work/y)$(c exec p-3 -- cat /work/y)" = child1child2child3 ]'
check "the parent's disk is unchanged by them" 'c exec p -- sh -c "test ! -e /work/y" && [ "$(c exec p -- cat /work/x)" = 1 ]'
snapdisk="$CAPSULE_HOME/snapshots/p-fork1/private.ext4"
sum=$(sha256sum <"$snapdisk")
c exec p-2 -- sh -c 'head -c 1048576 /dev/zero > /work/big; sync' >/dev/null 2>&1
check "the snapshot's disk is unchanged by a child's writes" '[ "$(sha256sum <"$snapdisk")" = "$sum" ]'
r1=$(c exec p-1 -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
r2=$(c exec p-2 -- sh -c 'head -c 16 /dev/urandom | od -An -tx1 | tr -d " \n"')
check "two children's /dev/urandom differ" '[ ${#r1} -eq 32 ] && [ "$r1" != "$r2" ]'
check "each child's hostname is its name" '[ "$(c exec p-1 -- hostname)" = p-1 ] && [ "$(c exec p-3 -- hostname)" = p-3 ]'
host=$(date +%s); guest=$(c exec p-3 -- date +%s)
check "a child's clock is the host's ($guest against $host)" '[ $((guest - host)) -lt 5 ] && [ $((host - guest)) -lt 5 ]'
check "the children resumed the snapshot with its RAM shared (shim.log)" 'grep -q "resumed from snapshot .*p-fork1 (shared RAM)" "$CAPSULE_HOME/sandboxes/p-1/shim.log"'
used=$(c inspect --json p-3 | sed -n "s/.*\"disk_bytes\": \([0-9]*\).*/\1/p")
check "a child's disks take little of the host (${used:-?} bytes: overlays over the snapshot's)" '[ -n "$used" ] && [ "$used" -lt 4194304 ]'

# --- the snapshot -----------------------------------------------------------------------------
c snapshot rm p-fork1 >"$out" 2>"$err"
rc=$?
check "a snapshot with dependants cannot be removed (125), and they are named" '[ "$rc" -eq 125 ] && grep -q "p-1 p-2 p-3" "$err" && [ -d "$CAPSULE_HOME/snapshots/p-fork1" ]'
c snapshot inspect p-fork1 --json >"$out" 2>"$err"
check "snapshot inspect --json names its parent and children" 'python3 -c "import json,sys; d=json.load(open(sys.argv[1])); assert d[\"parent\"]==\"p\" and d[\"children\"]==[\"p-1\",\"p-2\",\"p-3\"] and d[\"ram_bytes\"]>0" "$out"'
c snapshot p s1 >"$out" 2>"$err" && c create q --from s1 >"$out" 2>"$err"
check "create --from makes a stopped sandbox" '[ "$(state q)" = stopped ]'
qx=$(c exec q -- cat /work/x 2>"$err"); qt=$(c exec q -- cat /tmp/tick 2>>"$err"); qh=$(c exec q -- hostname 2>>"$err")
grep "running (" "$CAPSULE_HOME/sandboxes/q/shim.log" >"$out" 2>&1	# how it started, should the check fail
check "its first start resumes the snapshot: the file, the process, its own name (x $qx, tick $qt, $qh)" '[ "$qx" = 1 ] && [ -n "$qt" ] && [ "$qh" = q ]'
c stop p-2 >/dev/null 2>&1
check "a child stopped and started again keeps what it wrote" '[ "$(c exec p-2 -- cat /work/y)" = child2 ] && c exec p-2 -- test -s /work/big'
c fork p-1 --prefix g >"$out" 2>"$err"
check "a fork of a fork: its snapshot flattens the child's disk" '[ "$(cat "$out")" = g1 ] && [ "$(c exec g1 -- cat /work/y)" = child1 ] && [ "$(c exec g1 -- cat /work/x)" = 1 ]'
c fork p --paused >"$out" 2>"$err"
check "fork --paused leaves the parent paused" '[ "$(cat "$out")" = p-4 ] && [ "$(state p)" = paused ]'
# QEMU refuses to migrate a VM its last migration left stopped; the
# shim takes its disks back first, and the sandbox stays paused.
c snapshot p s2 >"$out" 2>"$err"
rc=$?
check "a sandbox a snapshot left paused is snapshotted again, and stays paused" '[ "$rc" -eq 0 ] && [ "$(state p)" = paused ] && [ -d "$CAPSULE_HOME/snapshots/s2" ]'

# --- bad input ----------------------------------------------------------------------------------
c stop q >/dev/null 2>&1
c fork q >"$out" 2>"$err"
rc=$?
check "a stopped sandbox is not forked (125), and the message says to start it" '[ "$rc" -eq 125 ] && grep -q "is stopped: .capsule start q. first" "$err"'
c snapshot p s1 >"$out" 2>"$err"
rc=$?
check "a snapshot name in use is refused by name (125)" '[ "$rc" -eq 125 ] && grep -q "a snapshot named .s1. exists" "$err"'
c create r --from s1 --cpus 2 >"$out" 2>"$err"
rc1=$?
c create r --from nosuch >"$out" 2>"$err"
rc2=$?
check "create --from takes no other option (2), and an unknown snapshot is named (125)" '[ "$rc1" -eq 2 ] && [ "$rc2" -eq 125 ] && grep -q "no snapshot named .nosuch." "$err" && [ ! -d "$CAPSULE_HOME/sandboxes/r" ]'
c fork p --count 0 >"$out" 2>"$err"
rc1=$?
c snapshot p 'Bad/Name' >"$out" 2>"$err"
rc2=$?
check "--count 0 and a bad snapshot name are usage errors (2)" '[ "$rc1" -eq 2 ] && [ "$rc2" -eq 2 ] && grep -q "not a valid snapshot name" "$err"'
# A child that cannot start undoes the fork: the children made (the one
# that started too) and the snapshot are removed, and the message says
# so; the parent is kept. CAPSULE_BIN is a capsule whose shim fails for
# the second child only: the snapshot's RAM holder and the first
# child's shim run as always.
printf '#!/bin/sh\n[ "$1 $3" = "shim p-6" ] && { echo "test: no shim for p-6" >&2; exit 1; }\nexec "%s" "$@"\n' "$capsule" >"$rt/no-shim"
chmod +x "$rt/no-shim"
CAPSULE_BIN=$rt/no-shim c fork p --count 2 >"$out" 2>"$err"
rc=$?
check "a fork whose second child cannot start fails (125) and is undone: no child, no snapshot left" '[ "$rc" -eq 125 ] && grep -q "fork 2 of 2 (p-6)" "$err" && grep -q "the fork was undone (children removed: p-5, p-6; its snapshot .p-fork3. removed)" "$err" && [ ! -e "$CAPSULE_HOME/sandboxes/p-5" ] && [ ! -e "$CAPSULE_HOME/sandboxes/p-6" ] && [ ! -e "$CAPSULE_HOME/snapshots/p-fork3" ] && [ "$(c exec p -- cat /work/x)" = 1 ]'

# --- removal -------------------------------------------------------------------------------------
kill "$loop" 2>/dev/null
c rm -f p-1 p-2 p-3 p-4 g1 q >"$out" 2>"$err"
check "rm -f of the six children at once (running ones too)" '[ $? -eq 0 ] && [ -z "$(c ls | awk "NR > 1 && \$1 != \"p\"")" ]'
c snapshot rm p-fork1 p-fork2 p-1-fork1 s1 s2 >"$out" 2>"$err"
rc=$?
c snapshot ls >"$out" 2>/dev/null
check "once its sandboxes are gone, a snapshot is removed" '[ "$rc" -eq 0 ] && [ "$(wc -l <"$out")" -eq 1 ] && [ ! -e "$CAPSULE_HOME/snapshots/p-fork1" ]'
c rm -f p >/dev/null 2>&1
sleep 3
clean_after "the fork suite"
