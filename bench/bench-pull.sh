#!/bin/sh
# make bench, row (l): images by reference and preparing, each against a
# baseline measured in the same run:
#   pull     `capsule image pull` of an image with this machine's python3
#            (tests/registry.sh push-python) from Debian's docker-registry
#            on a loopback port, into an empty image store, vs `skopeo
#            copy` of the same reference into an OCI layout alone (the
#            fetch and verification capsule delegates; the rest is the
#            layer import and mkfs.erofs)
#   prepare  `capsule prepare` of a prepared home (four checks, nothing
#            built) vs `capsule --version` (the process alone)
# Prints "key capsule_ns baseline_ns" lines (medians) for bench/run.sh.
#   bench-pull.sh CAPSULE RUNS
set -eu
capsule=$1
runs=${2:-5}
top=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d /tmp/capsule-bpl.XXXXXX)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CAPSULE_REGISTRY_DIR="$work/registry"
cleanup() {
	"$top/tests/registry.sh" stop "$port" >/dev/null 2>&1 || true
	rm -rf "$work"
}
trap cleanup EXIT
now_ns() { date +%s%N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

"$top/tests/registry.sh" start "$port" >/dev/null
ref="127.0.0.1:$port/py:bench"
"$top/tests/registry.sh" push-python "$ref" >/dev/null

: >"$work/a"; : >"$work/b"
i=0
while [ "$i" -lt "$runs" ]; do
	rm -rf "$work/home" "$work/oci"
	t=$(now_ns); CAPSULE_HOME="$work/home" "$capsule" image pull -q "$ref" >/dev/null; echo $(( $(now_ns) - t )) >>"$work/a"
	t=$(now_ns); skopeo copy -q --src-tls-verify=false "docker://$ref" "oci:$work/oci:bench" >/dev/null; echo $(( $(now_ns) - t )) >>"$work/b"
	i=$((i + 1))
done
echo "pull $(median <"$work/a") $(median <"$work/b")"

# prepare of a prepared home vs the bare process.
export CAPSULE_HOME="$work/home"
"$capsule" prepare -q >/dev/null
: >"$work/a"; : >"$work/b"
i=0
while [ "$i" -lt "$runs" ]; do
	t=$(now_ns); "$capsule" prepare -q >/dev/null; echo $(( $(now_ns) - t )) >>"$work/a"
	t=$(now_ns); "$capsule" --version >/dev/null; echo $(( $(now_ns) - t )) >>"$work/b"
	i=$((i + 1))
done
echo "prepare $(median <"$work/a") $(median <"$work/b")"
