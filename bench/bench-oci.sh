#!/bin/sh
# make bench, row (m): `podman run --rm --network none IMG true` with
# capsule-oci as the runtime, against runc and gVisor's runsc measured in
# the same run, alternating, on the same busybox image (podman import of
# a local tree, tests/integration/oci-lib.sh) in a private Podman
# storage. Each runtime runs once untimed first (capsule's first run
# builds the rootfs image and the template). runsc needs
# --runtime-flag network=none: with Podman's empty network namespace it
# refuses to start ("cannot run with network enabled in root network
# namespace").
# Prints "key capsule_ns baseline_ns" lines (medians) for bench/run.sh:
#   runc   capsule-oci vs runc
#   runsc  capsule-oci vs runsc
# A runtime that fails has 0 there (and its error on stderr).
#   bench-oci.sh CAPSULE RUNS
set -eu
capsule=$1
runs=${2:-5}
top=$(cd "$(dirname "$0")/.." && pwd)
oci=$(dirname "$capsule")/capsule-oci
work=$(mktemp -d /tmp/capsule-boci.XXXXXX)
. "$top/tests/integration/oci-lib.sh"
oci_podman_init "$work/podman"
cleanup() {
	pm --runtime "$work/wrapper" rm -af -t 0 >/dev/null 2>&1 || true
	CAPSULE_HOME="$work/home" "$capsule" ls 2>/dev/null | awk '/^oci-/ { print $1 }' |
		while read -r s; do CAPSULE_HOME="$work/home" "$capsule" rm --force "$s" >/dev/null 2>&1 || true; done
	oci_unmount "$work"
	rm -rf "$work"
}
trap cleanup EXIT
now_ns() { date +%s%N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

img=localhost/capsule-oci-bench:latest
oci_image "$work/img" "$img"
oci_wrapper "$work/wrapper" "$oci" "$work/state" "$work/home"
# shellcheck disable=SC2086
with() { # with RUNTIME [FLAGS]: one podman run --rm of true
	r=$1
	shift
	pm --runtime "$r" "$@" run --rm $oci_run_flags "$img" true >/dev/null 2>>"$work/errors"
}
# A runtime that fails its untimed run is not timed: its median is 0.
ok_capsule=1; ok_runc=1; ok_runsc=1
with "$work/wrapper" || ok_capsule=0
with runc || ok_runc=0
with runsc --runtime-flag network=none || ok_runsc=0
[ "$ok_capsule" -eq 1 ] || echo "bench-oci: capsule-oci failed: $(tail -3 "$work/errors")" >&2
[ "$ok_runsc" -eq 1 ] || echo "bench-oci: runsc failed: $(tail -3 "$work/errors")" >&2

: >"$work/a"; : >"$work/b"; : >"$work/c"
i=0
while [ "$i" -lt "$runs" ]; do
	if [ "$ok_capsule" -eq 1 ]; then
		t=$(now_ns); with "$work/wrapper"; echo $(( $(now_ns) - t )) >>"$work/a"
	fi
	if [ "$ok_runc" -eq 1 ]; then
		t=$(now_ns); with runc; echo $(( $(now_ns) - t )) >>"$work/b"
	fi
	if [ "$ok_runsc" -eq 1 ]; then
		t=$(now_ns); with runsc --runtime-flag network=none; echo $(( $(now_ns) - t )) >>"$work/c"
	fi
	i=$((i + 1))
done
med() { if [ -s "$1" ]; then median <"$1"; else echo 0; fi; }
a=$(med "$work/a")
echo "runc $a $(med "$work/b")"
echo "runsc $a $(med "$work/c")"
