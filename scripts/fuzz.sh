#!/bin/sh
# Coverage-guided fuzzing of the decoders of untrusted bytes (tests/fuzz,
# docs/architecture.md "Tests"), with the libFuzzer binaries of a clang
# tree built with -Dfuzzing=true (made here when missing).
#
#   scripts/fuzz.sh [BUILD]          `make fuzz`: each target for FUZZ_TIME
#                                    seconds (default 60), going on past
#                                    crashes; a line per target at the end
#   scripts/fuzz.sh --tap BUILD T    one target briefly (FUZZ_TIME, default
#                                    10 s) as a TAP suite, for tests/run.sh:
#                                    ok unless it crashed; stops at the first
#   scripts/fuzz.sh --setup BUILD    only make and build the tree
#
# FUZZ_TARGETS: the targets (default: every tests/fuzz/corpus/<target>).
# FUZZ_JOBS: how many run at once (default 1).
# Each target starts from its checked-in seeds, tests/fuzz/corpus/<t>/.
# What a run finds goes to fuzz-out/<t>/ (not checked in):
#   corpus/   the inputs it added (new coverage); to grow the checked-in
#             corpus with those that add coverage to it, run with
#             FUZZ_MERGE=1 (libFuzzer's -merge=1 into tests/fuzz/corpus/<t>)
#             or the command printed
#   crashes/  crash-*, timeout-*, oom-*, leak-* inputs; replay one with
#             BUILD/tests/fuzz/fuzz-<t> FILE
#   log       libFuzzer's output
set -u
top=$(cd "$(dirname "$0")/.." && pwd)
cd "$top" || exit 1

tap=""
setup_only=""
case "${1:-}" in
--tap) tap=1; shift ;;
--setup) setup_only=1; shift ;;
esac
build=${1:-build-clang}
[ $# -gt 0 ] && shift

# The sanitizers' settings of every run (whatever the caller's): leaks
# and UBSan's findings are failures, none suppressed.
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS UBSAN_OPTIONS

# The tree: clang (CLANG, default clang-14), ASan and UBSan, libFuzzer's
# instrumentation. llvm-symbolizer (llvm-14) names the frames of a report.
if [ ! -f "$build/build.ninja" ]; then
	CC=${CLANG:-clang-14} meson setup "$build" -Db_sanitize=address,undefined -Db_lundef=false \
		-Dfuzzing=true >/dev/null || exit 1
elif ! meson introspect "$build" --buildoptions | grep -q '"name": "fuzzing", "value": true'; then
	# A clang tree made without it (CC=clang meson setup build-clang).
	meson configure "$build" -Db_sanitize=address,undefined -Db_lundef=false -Dfuzzing=true >/dev/null ||
		{ echo "fuzz: $build is not a clang tree: remove it or name another (make fuzz CLANG_BUILD=...)" >&2; exit 1; }
fi
if [ -n "$setup_only" ]; then
	ninja -C "$build" >/dev/null
	exit $?
fi

if [ -n "$tap" ]; then
	t=${1:?--tap BUILD TARGET}
	bin=$build/tests/fuzz/fuzz-$t
	out=$(mktemp -d /tmp/capsule-fuzz.XXXXXX)
	echo "1..1"
	if [ ! -x "$bin" ]; then
		echo "not ok 1 - fuzz-$t: $bin is not built (a -Dfuzzing=true clang tree)"
		rm -rf "$out"
		exit 1
	fi
	# A copy of the seeds to grow, so the checked-in corpus is untouched.
	mkdir "$out/corpus" "$out/crashes"
	"$bin" -max_total_time="${FUZZ_TIME:-10}" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$out/crashes/" "$out/corpus" "tests/fuzz/corpus/$t" >"$out/log" 2>&1
	rc=$?
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$out/log" | tail -1)
	cov=$(grep -o 'cov: [0-9]* ft: [0-9]*' "$out/log" | tail -1)
	crash=$(ls "$out/crashes" 2>/dev/null | head -1)
	if [ "$rc" -eq 0 ] && [ -z "$crash" ]; then
		echo "ok 1 - fuzz-$t: ${execs:-?} inputs, ${cov:-no coverage line}, no crash"
	else
		# Keep the input where the run's report names it.
		keep=fuzz-out/$t/crashes
		mkdir -p "$keep"
		[ -n "$crash" ] && cp "$out/crashes/$crash" "$keep/"
		grep -E 'fuzz check failed|ERROR: |SUMMARY|runtime error' "$out/log" | head -5 | sed 's/^/# /'
		echo "not ok 1 - fuzz-$t: exit $rc after ${execs:-?} inputs${crash:+, input kept as $keep/$crash}"
	fi
	rm -rf "$out"
	exit 0
fi

ninja -C "$build" >/dev/null || exit 1
targets=${FUZZ_TARGETS:-$(ls tests/fuzz/corpus)}
time=${FUZZ_TIME:-60}
found=""
summary=$(mktemp)
trap 'rm -f "$summary"' EXIT
# One target for $time s; its summary lines go to $summary.$t.
run_one() {
	t=$1
	bin=$build/tests/fuzz/fuzz-$t
	dir=fuzz-out/$t
	mkdir -p "$dir/corpus" "$dir/crashes"
	echo "fuzz: $t for $time s" >&2
	# One worker in fork mode: it goes on past a crash, keeping each.
	"$bin" -fork=1 -ignore_crashes=1 -ignore_timeouts=1 -ignore_ooms=1 \
		-max_total_time="$time" -timeout=25 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$dir/crashes/" "$dir/corpus" "tests/fuzz/corpus/$t" >"$dir/log" 2>&1
	# The last stats line: "#EXECS: cov: C ft: F corp: N ... crash: a/b/c ..."
	last=$(grep -E '^#[0-9]+: cov:' "$dir/log" | tail -1)
	execs=$(echo "$last" | sed -n 's/^#\([0-9]*\):.*/\1/p')
	cov=$(echo "$last" | grep -o 'cov: [0-9]* ft: [0-9]*')
	crashes=$(find "$dir/crashes" -type f | wc -l)
	if [ -n "${FUZZ_MERGE:-}" ]; then
		"$bin" -merge=1 "tests/fuzz/corpus/$t" "$dir/corpus" >>"$dir/log" 2>&1
	fi
	{
		printf '%-14s %10s inputs  %-22s %3d crash(es)%s\n' "$t" "${execs:-?}" "${cov:-cov: ? ft: ?}" "$crashes" \
			"$([ "$crashes" -gt 0 ] && echo "  in $dir/crashes/")"
		find "$dir/crashes" -type f | sed 's/^/    /'
	} >"$summary.$t"
}

for t in $targets; do
	if [ ! -x "$build/tests/fuzz/fuzz-$t" ] || [ ! -d "tests/fuzz/corpus/$t" ]; then
		echo "fuzz: no target $t (tests/fuzz/corpus/$t and $build/tests/fuzz/fuzz-$t)" >&2
		exit 1
	fi
done
# FUZZ_JOBS targets at a time (default 1), in batches: each still runs
# for $time s of the wall clock, sharing the cores.
jobs=${FUZZ_JOBS:-1}
n=0
for t in $targets; do
	run_one "$t" &
	n=$((n + 1))
	if [ "$n" -ge "$jobs" ]; then
		wait
		n=0
	fi
done
wait
for t in $targets; do
	cat "$summary.$t" >>"$summary"
	rm -f "$summary.$t"
done
grep -q 'crash(es)  in' "$summary" && found=1
echo "fuzz: $time s per target; inputs, coverage (libFuzzer's cov: edges, ft: features), crashes:"
cat "$summary"
[ -z "${FUZZ_MERGE:-}" ] &&
	echo "fuzz: new inputs are in fuzz-out/<target>/corpus; FUZZ_MERGE=1 (or $build/tests/fuzz/fuzz-<target> -merge=1 tests/fuzz/corpus/<target> fuzz-out/<target>/corpus) adds those that add coverage to the checked-in corpus"
[ -z "$found" ]
