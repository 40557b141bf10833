#!/bin/sh
# make bench, row (s): snapshots and forks, each against its baseline in
# the same run (docs/architecture.md, "Snapshots and forks"):
#   fork1    `capsule fork p` to the child running vs `create` + `start`
#            of a fresh sandbox (medians of RUNS, ms)
#   fork8    `fork p --count 8` vs 8 fresh sandboxes made and started
#            one after the other (one run each, ms)
#   held8    host memory held by those 8 children, idle and running, vs
#            by the 8 fresh ones (MemTotal - MemAvailable, before and
#            after, settled 3 s; KiB)
#   snapshot `capsule snapshot p` (save, disks' copy, seal) vs a cold boot
#            of a created sandbox to running (`start` with
#            CAPSULE_TEMPLATES=0; medians, ms)
#   resume   `capsule start` of a sandbox made --from a snapshot vs that
#            cold boot (medians, ms)
# Prints "key value baseline" lines for bench/run.sh.
#   bench-fork.sh CAPSULE RUNS
set -eu
capsule=$1
runs=${2:-5}
home=$(mktemp -d /tmp/capsule-bfork.XXXXXX)
export CAPSULE_HOME="$home"
now_ns() { date +%s%N; }
ms_since() { echo $((($(now_ns) - $1) / 1000000)); }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
used_kib() { awk '/^MemTotal:/ { t = $2 } /^MemAvailable:/ { a = $2 } END { print t - a }' /proc/meminfo; }
c() { "$capsule" "$@"; }
cleanup() {
	for d in "$home"/sandboxes/*/; do
		[ -d "$d" ] && c rm --force "$(basename "$d")" >/dev/null 2>&1 || true
	done
	rm -rf "$home"
}
trap cleanup EXIT

c image build base >/dev/null 2>&1 || true
c create p >/dev/null && c exec p -- sh -c 'echo 1 > /work/x' >/dev/null
# The template both kinds of start restore from, made before timing.
c create warm >/dev/null && c start warm >/dev/null && c rm --force warm >/dev/null

: >"$home/a"
: >"$home/b"
i=0
while [ "$i" -lt "$runs" ]; do
	t=$(now_ns); c fork p --prefix f$i- >/dev/null; ms_since "$t" >>"$home/a"
	t=$(now_ns); c create n$i >/dev/null && c start n$i >/dev/null; ms_since "$t" >>"$home/b"
	c rm --force f$i-1 >/dev/null; c rm --force n$i >/dev/null
	i=$((i + 1))
done
echo "fork1 $(median <"$home/a") $(median <"$home/b")"

base=$(used_kib)
t=$(now_ns); c fork p --count 8 --prefix e >/dev/null; fork8=$(ms_since "$t")
sleep 3
held_fork=$(($(used_kib) - base))
for k in 1 2 3 4 5 6 7 8; do c rm --force e$k >/dev/null; done
sleep 3
base=$(used_kib)
t=$(now_ns)
for k in 1 2 3 4 5 6 7 8; do c create m$k >/dev/null && c start m$k >/dev/null; done
fresh8=$(ms_since "$t")
sleep 3
held_fresh=$(($(used_kib) - base))
for k in 1 2 3 4 5 6 7 8; do c rm --force m$k >/dev/null; done
echo "fork8 $fork8 $fresh8"
echo "held8 $held_fork $held_fresh"

: >"$home/a"
: >"$home/b"
: >"$home/c"
i=0
while [ "$i" -lt "$runs" ]; do
	t=$(now_ns); c snapshot p s$i >/dev/null; ms_since "$t" >>"$home/a"
	c create r$i --from s$i >/dev/null
	t=$(now_ns); c start r$i >/dev/null; ms_since "$t" >>"$home/c"
	c create k$i >/dev/null
	t=$(now_ns); CAPSULE_TEMPLATES=0 c start k$i >/dev/null; ms_since "$t" >>"$home/b"
	c rm --force r$i >/dev/null; c rm --force k$i >/dev/null
	i=$((i + 1))
done
echo "snapshot $(median <"$home/a") $(median <"$home/b")"
echo "resume $(median <"$home/c") $(median <"$home/b")"
