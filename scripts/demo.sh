#!/bin/sh
# The main job, as a newcomer sees it: what capsule found on this host, then
# a command running in a fresh microVM with its output streamed back, and
# the VM gone afterwards.
set -eu
build=${1:-build}
capsule="$build/capsule"

echo "== capsule doctor"
"$capsule" doctor || true
echo
echo "== capsule run -- sh -c 'uname -a; id; ...'"
start=$(date +%s%N)
set +e
"$capsule" run -- sh -c 'uname -a; id; echo "hostname: $(hostname), cwd: $(pwd)"; echo "this line goes to stderr" >&2'
rc=$?
set -e
end=$(date +%s%N)
echo "(exit code $rc, $(( (end - start) / 1000000 )) ms including boot and teardown)"
echo
echo "== exit codes pass through: capsule run -- sh -c 'exit 7'"
set +e
"$capsule" run -q -- sh -c 'exit 7'
echo "exit code: $?"
set -e
echo
left=$(pgrep -c -f 'qemu-system-x86_64 -M microvm' || true)
echo "== QEMU processes left running: $left"
