#!/bin/sh
# Black-box tests of a full host disk and of many clients at once: a
# CAPSULE_HOME on a small tmpfs filled from the guest gives the command an
# I/O error (not a frozen VM), the shim names the disk, and the sandbox
# works again once space is freed; 64 concurrent `capsule exec` on one
# sandbox are all answered, and a shim out of descriptors says so. Needs
# root (mount, prlimit). TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
# rtv DIR KEY [SUBKEY]: a value from the sandbox's runtime.json
rtv() {
	f=$1/runtime.json
	shift
	python3 -c 'import json, sys
v = json.load(open(sys.argv[1]))
for k in sys.argv[2:]: v = v[k]
print(v)' "$f" "$@" 2>/dev/null
}

echo "1..11"

full="$rt/full"
fhome="$full/home"
cf() { CAPSULE_HOME="$fhome" "$capsule" "$@"; }
cleanup_disk() {
	[ -d "$fhome/sandboxes" ] && for s in "$fhome"/sandboxes/*/; do
		[ -f "$s/runtime.json" ] && cf rm --force "$(basename "$s")" >/dev/null 2>&1
	done
	pkill -KILL -f "qemu-system.*$full/" 2>/dev/null
	mountpoint -q "$full" && { umount "$full" 2>/dev/null || umount -l "$full"; }
	cleanup
}
trap cleanup_disk EXIT

if [ "$(id -u)" -ne 0 ]; then
	for t in 1 2 3 4 5 6 7 8 9 10 11; do skip "disk test $t" "needs root (tmpfs, prlimit)"; done
	exit 0
fi

c image build base >"$out" 2>"$err" || not_ok "image build base" "exit $?"

# --- a full host disk ----------------------------------------------------------
# The sandbox is made while the tmpfs is large (creation checks free space),
# then the tmpfs shrinks to 64 MiB; the image and templates stay in the
# normal home. A filler leaves 24 MiB, less than the command writes.
mkdir -p "$full" "$CAPSULE_HOME/templates"
mount -t tmpfs -o size=1g,mode=0700 tmpfs "$full"
mkdir -p "$fhome"
ln -s "$CAPSULE_HOME/images" "$fhome/images"
ln -s "$CAPSULE_HOME/templates" "$fhome/templates"
cf create d1 >"$out" 2>"$err" || not_ok "create d1 on the tmpfs" "exit $?"
mount -o remount,size=64m "$full"
cf exec d1 -- true >"$out" 2>"$err"
avail=$(df -m --output=avail "$full" | tail -1)
fallocate -l "$((avail - 24))M" "$full/filler"
start=$(date +%s)
CAPSULE_HOME="$fhome" timeout 45 "$capsule" exec --timeout 30 d1 -- sh -c 'dd if=/dev/zero of=/work/f bs=1M count=48 conv=fsync' >"$out" 2>"$err"
rc=$?
took=$(($(date +%s) - start))
check "a command filling the host's disk gets an I/O error, not a frozen VM (exit $rc in ${took} s)" \
	'[ "$rc" -ne 0 ] && [ "$rc" -ne 124 ] && grep -q "Input/output error\|No space left on device" "$err"'
check "its stderr names the disk and the host's full file system" \
	'grep -q "^capsule: I/O error on /work (disk capsule-work): no space left on the host.s disk holding $fhome/sandboxes/d1/private.ext4" "$err"'
check "shim.log names the disk and why" \
	'grep -q "I/O error on /work (disk capsule-work): no space left on the host.s disk holding $fhome/sandboxes/d1/private.ext4" "$fhome/sandboxes/d1/shim.log"'
rm -f "$full/filler"
CAPSULE_HOME="$fhome" timeout 30 "$capsule" exec --timeout 20 d1 -- sh -c 'rm -f /work/f; echo ok > /work/g; cat /work/g' >"$out" 2>"$err"
rc=$?
check "once space is freed the next command works, /work writable again" '[ "$rc" -eq 0 ] && grep -qx ok "$out"'
check "runtime.json records the last I/O error: disk, file, no space" \
	'[ "$(rtv "$fhome/sandboxes/d1" io_error disk)" = /work ] && [ "$(rtv "$fhome/sandboxes/d1" io_error path)" = "$fhome/sandboxes/d1/private.ext4" ] && [ "$(rtv "$fhome/sandboxes/d1" io_error nospace)" = True ]'
# Durable results on a full host disk: the command's buffered writes
# succeed in the guest's page cache (more than the blocks earlier tests
# left allocated on the host), the flush before its end fails; the
# end is not called durable and stderr says why (exit status unchanged).
avail=$(df -m --output=avail "$full" | tail -1)
fallocate -l "$((avail - 24))M" "$full/filler"
CAPSULE_HOME="$fhome" timeout 45 "$capsule" exec -v --timeout 30 d1 -- sh -c 'head -c 100000000 /dev/zero > /work/h' >"$out" 2>"$err"
rc=$?
check "writes that cannot reach a full host disk: exit $rc, and not called durable, saying why" \
	'[ "$rc" -eq 0 ] && grep -q "^capsule: the writes could not be made durable: flushing /work: " "$err" && grep -q "; not durable" "$err"'
[ "$rc" -eq 0 ] || sed 's/^/# stderr: /' "$err" | head -5
rm -f "$full/filler"
cf rm --force d1 >/dev/null 2>&1

# --- many clients ----------------------------------------------------------------
c create m1 >"$out" 2>"$err"
c exec m1 -- true >"$out" 2>"$err"
i=1
while [ $i -le 64 ]; do
	c exec m1 -- sh -c "sleep 3; echo run-$i" >"$rt/par-$i" 2>&1 &
	i=$((i + 1))
done
wait
bad=0
i=1
while [ $i -le 64 ]; do
	grep -qx "run-$i" "$rt/par-$i" || { bad=$((bad + 1)); cp "$rt/par-$i" "$err"; }
	i=$((i + 1))
done
check "64 concurrent execs on one sandbox are all answered ($bad not)" '[ "$bad" -eq 0 ]'

# A shim out of descriptors refuses a client, saying so, and logs it.
shim=$(rtv "$CAPSULE_HOME/sandboxes/m1" shim_pid)
control=$(rtv "$CAPSULE_HOME/sandboxes/m1" control)
prlimit --pid "$shim" --nofile=48:48
python3 - "$control" <<'EOF' &
import socket, sys, time
held = []
for _ in range(60):
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[1])
    held.append(s)
time.sleep(4)
EOF
holder=$!
sleep 1
c exec m1 -- true >"$out" 2>"$err"
rc=$?
check "a shim out of descriptors answers \"too many clients (N)\"" \
	'[ "$rc" -ne 0 ] && grep -q "too many clients ([0-9]*): the shim is out of file descriptors" "$err" && ! grep -q "channel closed" "$err"'
check "shim.log says it refused clients" 'grep -q "refused [0-9]* client(s): too many clients" "$CAPSULE_HOME/sandboxes/m1/shim.log"'
wait "$holder"
c exec m1 -- echo again >"$out" 2>"$err"
check "once clients leave, the next exec works" 'grep -qx again "$out"'
c rm --force m1 >/dev/null 2>&1
clean_after "disk suite"
