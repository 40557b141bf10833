#!/bin/sh
# make bench, row (t): TCG's translation buffer size per image class
# (issue 36, item 5), measured in one run. For each class (the busybox
# base image, python, a compiler: gcc and libc6-dev, debootstrapped from
# this machine's Debian mirror and imported) and each size (CAPSULE_TCG_TB_MIB: 16, 32, 64,
# 128), a named sandbox is started and its class's workload run three
# times: the first run translates, the median of the other two is the
# steady time (what a smaller buffer's flushes cost in retranslation).
# After the runs: the buffer's resident pages (QEMU's rwx mapping) and
# QEMU's PSS (guest pages included). Prints "tb CLASS MIB TB_KIB PSS_KIB
# FIRST_MS STEADY_MS" lines; a class whose image cannot be built is left
# out.
#   bench-tb.sh CAPSULE
set -eu
capsule=$1
# BENCH_TB_HOME: a CAPSULE_HOME whose python image is built already (kept).
home=${BENCH_TB_HOME:-$(mktemp -d /tmp/capsule-btb.XXXXXX)}
export CAPSULE_HOME="$home"
now_ns() { date +%s%N; }
c() { "$capsule" "$@"; }
cleanup() {
	for s in tb-base tb-python tb-cc; do c rm --force "$s" >/dev/null 2>&1 || true; done
	[ -n "${BENCH_TB_HOME:-}" ] || rm -rf "$home"
	rm -rf "${ccroot:-}"
}
trap cleanup EXIT

base_work='for i in 1 2 3; do ls -lR / >/dev/null 2>&1; find / -name nosuch >/dev/null 2>&1; sort /proc/kallsyms | uniq -c | sort -n | tail -1 >/dev/null; awk "BEGIN { for (i = 0; i < 20000; i++) s += i * i; print s }" >/dev/null; done'
python_work='python3 -c "import re, collections, functools, itertools, string, struct, hashlib, random, textwrap, heapq, bisect; print(sum(i * i for i in range(200000)), len(textwrap.wrap(string.ascii_letters * 2000, 70)), hashlib.sha256(bytes(range(256)) * 4000).hexdigest(), sorted(random.Random(1).random() for _ in range(20000))[0])" >/dev/null'

# The compiler's workload: 100 small functions and the C library's
# headers, compiled at -O2 (gcc's cc1 is the largest code of the three).
cc_work='cd /tmp && awk "BEGIN { print \"#include <stdio.h>\"; print \"#include <stdlib.h>\"; print \"#include <string.h>\"; for (i = 0; i < 100; i++) printf \"int f%d(int *a, int n) { int s = 0; for (int j = 0; j < n; j++) s += a[j] * %d ^ (s >> 3); return s; }\\n\", i, i }" >big.c && gcc -O2 -c big.c -o big.o'

run_class() { # run_class CLASS IMAGE WORK
	cls=$1 image=$2 work=$3
	for mib in 16 32 64 128; do
		c rm --force "tb-$cls" >/dev/null 2>&1 || true
		c create "tb-$cls" --image "$image" >/dev/null 2>&1 || return 0
		CAPSULE_TCG_TB_MIB=$mib c start "tb-$cls" >/dev/null
		t=$(now_ns); c exec --timeout 0 "tb-$cls" -- sh -c "$work" >/dev/null; first=$((($(now_ns) - t) / 1000000))
		t=$(now_ns); c exec --timeout 0 "tb-$cls" -- sh -c "$work" >/dev/null; s1=$((($(now_ns) - t) / 1000000))
		t=$(now_ns); c exec --timeout 0 "tb-$cls" -- sh -c "$work" >/dev/null; s2=$((($(now_ns) - t) / 1000000))
		pid=$(c inspect --json "tb-$cls" | sed -n 's/.*"vmm_pid": \([0-9]*\).*/\1/p')
		pss=$(awk '/^Pss:/ { print $2 }' "/proc/$pid/smaps_rollup" 2>/dev/null || echo 0)
		# The buffer: QEMU's one rwx mapping of about its size.
		tb=$(awk -v m=$((mib * 1024 - 4096)) '/^[0-9a-f]+-[0-9a-f]+ / { x = ($2 ~ /x/) } /^Size:/ { sz = $2 } /^Rss:/ { if (x && sz >= m) print $2 }' "/proc/$pid/smaps" 2>/dev/null | head -1)
		echo "tb $cls $mib ${tb:-0} ${pss:-0} $first $(((s1 + s2) / 2))"
		c rm --force "tb-$cls" >/dev/null
	done
}

c image build base >/dev/null 2>&1 || true
run_class base base "$base_work"
if c image build python >/dev/null 2>&1; then
	run_class python python "$python_work"
fi
if ! c image inspect tb-cc >/dev/null 2>&1; then
	mirror=$(awk '/^URIs:/ { print $2; exit }' /etc/apt/sources.list.d/*.sources 2>/dev/null)
	suite=$(. /etc/os-release && echo "$VERSION_CODENAME")
	ccroot=$(mktemp -d /tmp/capsule-btb-cc.XXXXXX)
	if debootstrap --variant=minbase --include=gcc,libc6-dev "$suite" "$ccroot/root" "${mirror:-http://deb.debian.org/debian}" >"$ccroot/log" 2>&1; then
		mkdir -p "$ccroot/root/work" "$ccroot/root/source"
		rm -f "$ccroot"/root/var/cache/apt/archives/*.deb "$ccroot"/root/var/lib/apt/lists/* 2>/dev/null || true
		c image import "$ccroot/root" --name tb-cc -q >/dev/null 2>&1 || true
	else
		echo "bench-tb: debootstrap of the compiler image failed; its log ends:" >&2
		tail -5 "$ccroot/log" >&2
	fi
	rm -rf "$ccroot"
fi
if c image inspect tb-cc >/dev/null 2>&1; then
	run_class cc tb-cc "$cc_work"
fi
