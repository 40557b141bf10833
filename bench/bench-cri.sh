#!/bin/sh
# make bench, row (r): Kubernetes pods through containerd's CRI, the
# runtime handler BENCH_CRI_RUNTIME (default capsule: containerd-shim-capsule-v2
# beside CAPSULE) against BENCH_CRI_BASELINE (default runc) in the same
# run, on the containerd, network namespace, CNI and loopback registry of
# the CRI suite (tests/integration/cri-lib.sh). bench/bench-cri.py times
# RunPodSandbox + CreateContainer + StartContainer to the container's
# first line of output, and measures host memory held per idle pod
# (BENCH_CRI_PODS of them, default 3).
# Prints "key handler baseline" lines for bench/run.sh:
#   first_output  ns (medians of RUNS)
#   pod_memory    KiB per idle pod
# A handler that fails has 0 there (and its error on stderr).
#   bench-cri.sh CAPSULE RUNS
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
runs=${2:-5}
top=$(cd "$(dirname "$0")/.." && pwd)
. "$top/tests/integration/oci-lib.sh"
. "$top/tests/integration/cri-lib.sh"
work=$(mktemp -d /tmp/capsule-bcri.XXXXXX)
export CAPSULE_HOME="$work/home" XDG_RUNTIME_DIR="$work"
trap 'cri_env_stop; oci_unmount "$work"; rm -rf "$work"' EXIT
if ! cri_env_start "$work/env" "capsule-bcri-$$" "$(dirname "$capsule")"; then
	echo "bench-cri: $cri_why" >&2
	echo "first_output 0 0"
	echo "pod_memory 0 0"
	exit 0
fi
cri pull "$cri_pause" >/dev/null 2>&1
cri pull "$cri_busybox" >/dev/null 2>&1
nsenter --net="$cri_netns" /usr/bin/python3 "$top/bench/bench-cri.py" "$runs" "${BENCH_CRI_PODS:-3}" \
	"$cri_cgroup" "$cri_busybox" "${BENCH_CRI_RUNTIME:-capsule}" "${BENCH_CRI_BASELINE:-runc}" ||
	echo "bench-cri: bench-cri.py failed" >&2
