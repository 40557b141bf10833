#!/bin/sh
# make bench, row (k): a project in and out of a sandbox (docs/workspace.md),
# each against a host baseline measured in the same run:
#   create  `capsule create --workspace` of a 10000-file tree (scan, hash,
#           mke2fs -d, base manifest; no VM) vs `cp -a` of the same tree
#   diff    `capsule diff` of a running sandbox with 10 files changed in
#           10000 (the guest hashes its tree) vs `diff -rq` of the host tree
#           against a copy with the same 10 changes
#   cp_in   `capsule cp` of a 100 MiB file into /work vs `cat | cat` on the host
#   cp_out  `capsule cp` of it back out vs the same pipe
# Prints "key capsule_ns baseline_ns" lines (medians) for bench/run.sh.
#   bench-workspace.sh CAPSULE TREE RUNS
set -eu
capsule=$1
tree=$2
runs=${3:-5}
home=$(mktemp -d /tmp/capsule-bws.XXXXXX)
export CAPSULE_HOME="$home/home"
now_ns() { date +%s%N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
cleanup() {
	for n in $(seq 0 "$runs") w; do "$capsule" rm --force "bw$n" >/dev/null 2>&1 || true; done
	rm -rf "$home"
}
trap cleanup EXIT
"$capsule" image build base >/dev/null 2>&1

# create --workspace vs cp -a, alternating.
: >"$home/a"; : >"$home/b"
i=0
while [ "$i" -lt "$runs" ]; do
	rm -rf "$home/copy"; sync
	t=$(now_ns); "$capsule" create "bw$i" --workspace "$tree" >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$home/a"
	t=$(now_ns); cp -a "$tree" "$home/copy"; echo $(( $(now_ns) - t )) >>"$home/b"
	"$capsule" rm --force "bw$i" >/dev/null
	i=$((i + 1))
done
echo "create $(median <"$home/a") $(median <"$home/b")"

# diff with 10 changed files of 10000: the same 10 changes in the guest and
# in a host copy.
"$capsule" create bww --workspace "$tree" >/dev/null 2>&1
"$capsule" exec -q bww -- sh -c 'for d in 0 1 2 3 4 5 6 7 8 9; do echo changed >>/workspace/d$d/f0; done'
rm -rf "$home/copy"; cp -a "$tree" "$home/copy"
for d in 0 1 2 3 4 5 6 7 8 9; do echo changed >>"$home/copy/d$d/f0"; done
: >"$home/a"; : >"$home/b"
i=0
while [ "$i" -lt "$runs" ]; do
	t=$(now_ns); "$capsule" diff bww >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$home/a"
	t=$(now_ns); diff -rq "$tree" "$home/copy" >/dev/null || true; echo $(( $(now_ns) - t )) >>"$home/b"
	i=$((i + 1))
done
echo "diff $(median <"$home/a") $(median <"$home/b")"
n=$("$capsule" diff bww 2>/dev/null | wc -l)
[ "$n" -eq 10 ] || echo "bench-workspace: diff listed $n changes, not 10" >&2

# 100 MiB in and out vs a host pipe.
head -c $((100 * 1024 * 1024)) /dev/urandom >"$home/big"
: >"$home/a"; : >"$home/b"; : >"$home/c"
i=0
while [ "$i" -lt "$runs" ]; do
	rm -f "$home/out" "$home/piped"
	t=$(now_ns); "$capsule" cp -q "$home/big" bww:/work/big; echo $(( $(now_ns) - t )) >>"$home/a"
	t=$(now_ns); "$capsule" cp -q bww:/work/big "$home/out"; echo $(( $(now_ns) - t )) >>"$home/b"
	t=$(now_ns); cat "$home/big" | cat >"$home/piped"; echo $(( $(now_ns) - t )) >>"$home/c"
	i=$((i + 1))
done
cmp -s "$home/big" "$home/out" || echo "bench-workspace: the 100 MiB file did not come back equal" >&2
echo "cp_in $(median <"$home/a") $(median <"$home/c")"
echo "cp_out $(median <"$home/b") $(median <"$home/c")"
