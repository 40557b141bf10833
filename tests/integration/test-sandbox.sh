#!/bin/sh
# Black-box tests of images and named sandboxes: persistence, quotas,
# imports with whiteouts, bad input, the interactive shell. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
sbdir() { echo "$CAPSULE_HOME/sandboxes/$1"; }
state() { c ls | awk -v n="$1" '$1 == n { print $3 }'; }
qemu_pid() { c inspect "$1" | sed -n 's/^processes: *shim [0-9]*, qemu \([0-9]*\)/\1/p'; }
echo "1..54"

# --- images ----------------------------------------------------------------
c image build base >"$out" 2>"$err"
check "image build base" 'grep -q "^built base sha256:[0-9a-f]\{64\}" "$out"'
c image ls >"$out" 2>"$err"
check "image ls lists base" 'grep -q "^base  *sha256:" "$out"'
base_digest=$(c image inspect base | sed -n 's/^digest: *//p')
c image inspect "${base_digest%${base_digest#sha256:????????????}}" >"$out" 2>"$err"
check "an image is found by a 12-digit digest prefix" 'grep -q "verified: yes" "$out"'

# --- a named sandbox --------------------------------------------------------
c create p >"$out" 2>"$err"
check "create p" 'grep -q "created sandbox p" "$out" && [ -f "$(sbdir p)/private.ext4" ] && [ -f "$(sbdir p)/root-upper.ext4" ]'
check "a new sandbox is stopped" '[ "$(state p)" = stopped ]'
# What a creation killed half-way leaves (no record.json) is made again;
# one being made by another process (its directory locked) is not touched.
mkdir -p "$(sbdir half)" && echo partial > "$(sbdir half)/private.ext4"
c create half >"$out" 2>"$err"
check "create over the remains of an interrupted creation makes it again" \
	'grep -q "created sandbox half" "$out" && grep -q "interrupted creation" "$err" && [ "$(state half)" = stopped ] && [ "$(stat -c %s "$(sbdir half)/private.ext4")" -gt 1000 ]'
c rm half >/dev/null 2>&1
mkdir -p "$(sbdir busy)"
flock "$(sbdir busy)" sleep 3 &
sleep 0.3
c create busy >"$out" 2>"$err"
check "create of a sandbox another process is making is refused, nothing removed" \
	'grep -q "being created by another process" "$err" && [ -d "$(sbdir busy)" ]'
wait
rm -rf "$(sbdir busy)"
c exec p -- sh -c 'echo keep > /work/a' >"$out" 2>"$err"
rc=$?
check "exec on a stopped sandbox starts it" '[ "$rc" -eq 0 ] && [ "$(state p)" = running ]'
c exec p -- sh -c 'stat -c %u /work; grep " /work " /proc/mounts' >"$out" 2>"$err"
check "/work is owned by UID 1000 and mounted nosuid,nodev" 'head -1 "$out" | grep -qx 1000 && grep -q "nosuid,nodev" "$out"'
c exec p -- sh -c 'head -c 1048576 /dev/urandom > /work/r; md5sum /work/r' >"$out" 2>"$err"
sum=$(cut -d" " -f1 "$out")
c stop p >"$out" 2>"$err"
check "stop p" '[ $? -eq 0 ] && [ "$(state p)" = stopped ]'
check "stop leaves no QEMU" '[ "$(ours)" -eq 0 ]'
c start p >"$out" 2>"$err"
check "start p" '[ "$(state p)" = running ]'
c exec p -- sh -c 'cat /work/a; md5sum /work/r' >"$out" 2>"$err"
check "/work bytes survive stop and start" 'head -1 "$out" | grep -qx keep && grep -q "^$sum " "$out"'
check "a running sandbox's directory holds no agent.sock or qmp.sock" '[ -S "$(sbdir p)/control.sock" ] && [ ! -e "$(sbdir p)/agent.sock" ] && [ ! -e "$(sbdir p)/qmp.sock" ]'

# SIGKILL of QEMU: what was synced survives, and the disk still mounts.
c exec p -- sh -c 'echo synced > /work/s; sync' >"$out" 2>"$err"
pid=$(qemu_pid p)
kill -KILL "$pid"
wait_for '[ "$(state p)" = stopped ]' 100
check "a killed QEMU leaves the sandbox stopped" '[ "$(state p)" = stopped ]'
c exec p -- sh -c 'cat /work/s /work/a' >"$out" 2>"$err"
check "synced data survives SIGKILL of QEMU and the disk mounts" '[ "$(cat "$out")" = "$(printf "synced\nkeep")" ]'

# --- quotas -------------------------------------------------------------------
c exec p -- sh -c 'dd if=/dev/zero of=/work/big bs=1M count=600' >"$out" 2>"$err"
rc=$?
check "filling /work gives ENOSPC in the guest" '[ "$rc" -ne 0 ] && grep -q "No space left on device" "$err"'
check "the host file of /work stays at its 512 MiB size" '[ "$(stat -c %s "$(sbdir p)/private.ext4")" -eq 536870912 ] && [ $(( $(stat -c %b "$(sbdir p)/private.ext4") * 512 )) -le 536870912 ]'
c exec p -- true >"$out" 2>"$err"
check "the sandbox still answers after ENOSPC" '[ $? -eq 0 ]'
c exec p -- sh -c 'rm /work/big; dd if=/dev/zero of=/var/tmp/big bs=1M count=400' >"$out" 2>"$err"
rc=$?
check "filling the root layer gives ENOSPC in the guest" '[ "$rc" -ne 0 ] && grep -q "No space left on device" "$err"'
check "the host file of the root layer stays at 256 MiB" '[ "$(stat -c %s "$(sbdir p)/root-upper.ext4")" -eq 268435456 ]'
c exec p -- sh -c 'rm -f /var/tmp/big; cat /work/a' >"$out" 2>"$err"
check "the sandbox works after the root layer filled up" 'grep -qx keep "$out"'

# --- the interactive shell, in tmux ---------------------------------------------
if command -v tmux >/dev/null; then
	sock="$rt/tmux"
	tmux -S "$sock" new-session -d -x 100 -y 30 "stty -g > $rt/stty-before; $capsule shell p; echo rc=\$? > $rt/shell-rc; stty -g > $rt/stty-after; sleep 30"
	wait_for 'tmux -S "$sock" capture-pane -p | grep -q "[$#] *$"' 150
	tmux -S "$sock" send-keys 'echo $((6*7)); stty size' Enter
	wait_for 'tmux -S "$sock" capture-pane -p | grep -q "^30 100"' 100
	check "shell: a PTY with the window size of the terminal" 'tmux -S "$sock" capture-pane -p | grep -q "^42" && tmux -S "$sock" capture-pane -p | grep -q "^30 100"'
	tmux -S "$sock" resize-window -x 120 -y 40 2>/dev/null || tmux -S "$sock" resize-pane -x 120 -y 40
	sleep 0.5
	tmux -S "$sock" send-keys 'stty size' Enter
	wait_for 'tmux -S "$sock" capture-pane -p | grep -q "^40 120"' 100
	check "shell: a resize reaches the guest" 'tmux -S "$sock" capture-pane -p | grep -q "^40 120"'
	tmux -S "$sock" send-keys 'exit 3' Enter
	wait_for '[ -s "$rt/shell-rc" ] && [ -s "$rt/stty-after" ]' 100
	check "shell: the exit code comes back" 'grep -qx "rc=3" "$rt/shell-rc"'
	check "shell: the terminal mode is restored" 'cmp -s "$rt/stty-before" "$rt/stty-after"'
	tmux -S "$sock" kill-server 2>/dev/null
else
	for t in "PTY size" "resize" "exit code" "terminal restored"; do skip "shell: $t" "tmux is not installed"; done
fi

# Three commands at once on a stopped sandbox: one start wins, all run.
c stop p >/dev/null 2>&1
for i in 1 2 3; do c exec p -- sh -c "echo run-$i" >"$rt/par-$i" 2>&1 & done
wait
check "concurrent execs on a stopped sandbox all run in one VM" 'grep -qx run-1 "$rt/par-1" && grep -qx run-2 "$rt/par-2" && grep -qx run-3 "$rt/par-3" && [ "$(pgrep -f "qemu-system.*$(sbdir p)" | wc -l)" -eq 1 ]'

# A guest that does not end a command on time (frozen here: its QEMU
# stopped with SIGSTOP) is given up on at the timeout plus 5 s: exit 124
# on time, its VM killed, its disks kept.
c exec p -- sh -c 'echo kept > /work/dl; sync' >/dev/null 2>&1
t0=$(date +%s%N)
: >"$out"	# not the "started" of a command before
timeout -s KILL 30 "$capsule" exec --timeout 2 p -- sh -c 'echo started; exec sleep 60' >"$out" 2>"$err" &
dl=$!
wait_for 'grep -q started "$out"' 20
kill -STOP "$(rtv "$(sbdir p)" qemu_pid)"
wait $dl
rc=$?
took=$((($(date +%s%N) - t0) / 1000000))
check "a command the guest does not end is given up on at its timeout + 5 s (exit 124, ${took} ms)" \
	'[ "$rc" -eq 124 ] && [ "$took" -lt 9500 ] && grep -q "did not end it within 5 s more" "$err" && grep -q "stopping sandbox" "$err" && [ "$(state p)" = stopped ]'
c exec p -- cat /work/dl >"$out" 2>"$err"
check "that sandbox is stopped, then starts again with its disks" '[ $? -eq 0 ] && grep -qx kept "$out"'

# A paused guest's clock stands still with its vCPUs; the resume gives it
# the host's (CLOCK), before the command that resumed it runs.
answer=$(pause_vm "$(rtv "$(sbdir p)" control)")
sleep 4
c exec p -- date +%s >"$out" 2>"$err"
skew=$(($(date +%s) - $(grep -x "[0-9]*" "$out" || echo 0)))
check "after 4 s paused, exec resumes it with the host's clock (${skew} s behind)" \
	'[ "$answer" = 0 ] && [ "$skew" -ge -1 ] && [ "$skew" -le 2 ]'

# --- removal ----------------------------------------------------------------
c rm p >"$out" 2>"$err"
rc=$?
check "rm refuses a running sandbox without --force" '[ "$rc" -ne 0 ] && grep -q -- "--force" "$err" && [ -f "$(sbdir p)/private.ext4" ]'
# Paused, its VM still has the disks open: rm refuses it just the same.
answer=$(pause_vm "$(rtv "$(sbdir p)" control)")
c rm p >"$out" 2>"$err"
rc=$?
check "rm refuses a paused sandbox without --force" '[ "$answer" = 0 ] && [ "$rc" -ne 0 ] && grep -q -- "--force" "$err" && [ -f "$(sbdir p)/private.ext4" ] && [ "$(state p)" = paused ]'
c rm --force p >"$out" 2>"$err"
check "rm --force removes it" '[ $? -eq 0 ] && [ ! -e "$(sbdir p)" ] && [ "$(ours)" -eq 0 ]'

# --- a sandbox directory too deep for sun_path; a crashed shim -------------------
# Its sockets go to a short run directory; its logs stay next to the disks.
long="$rt/h$(printf '%0100d' 0)"
mkdir -p "$long" "$CAPSULE_HOME/templates"
ln -s "$CAPSULE_HOME/images" "$long/images"
ln -s "$CAPSULE_HOME/templates" "$long/templates"
cl() { CAPSULE_HOME="$long" "$capsule" "$@"; }
lg="$long/sandboxes/lg"
cl create lg >"$out" 2>"$err" && cl start lg >"$out" 2>"$err"
run1=$(dirname "$(rtv "$lg" control)")
cl stop lg >"$out" 2>"$err"
check "deep sandbox: console.log and qemu.log stay next to the disks after stop" '[ "${run1#"$rt"/capsule-}" != "$run1" ] && [ ! -e "$run1" ] && [ -f "$lg/console.log" ] && [ -f "$lg/qemu.log" ]'

# kill -9 of the shim and its QEMU; the next start cleans up after them.
cl exec lg -- sh -c 'echo kept > /work/k; sync' >"$out" 2>"$err"
shim1=$(rtv "$lg" shim_pid); qemu1=$(rtv "$lg" qemu_pid); run1=$(dirname "$(rtv "$lg" control)")
kill -KILL "$shim1" "$qemu1"
wait_for '! kill -0 "$shim1" 2>/dev/null && ! kill -0 "$qemu1" 2>/dev/null' 50
cl start lg >"$out" 2>"$err"
rc=$?
shim2=$(rtv "$lg" shim_pid); run2=$(dirname "$(rtv "$lg" control)")
check "after kill -9 of shim and QEMU, start works and nothing of the dead shim is left" '[ "$rc" -eq 0 ] && [ -n "$shim2" ] && [ "$shim2" != "$shim1" ] && kill -0 "$shim2" && [ "$run2" != "$run1" ] && [ ! -e "$run1" ] && [ -S "$run2/control.sock" ] && [ "$(leftovers)" -eq 1 ]'
cl exec lg -- cat /work/k >"$out" 2>"$err"
check "the disks and /work survive the crash" 'grep -qx kept "$out" && [ -f "$lg/private.ext4" ] && [ -f "$lg/root-upper.ext4" ]'
cl rm --force lg >"$out" 2>"$err"

# --- bad input: clear errors, nothing deleted ------------------------------------
c create ../x >"$out" 2>"$err"
rc=$?
check "a name like ../x is refused, naming the rule" '[ "$rc" -ne 0 ] && grep -q "not a valid sandbox name" "$err" && [ ! -e "$CAPSULE_HOME/x" ]'
c exec nosuch -- true >"$out" 2>"$err"
rc=$?
check "an unknown sandbox is named" '[ "$rc" -ne 0 ] && grep -q "no sandbox named '\''nosuch'\''" "$err"'
c create q --image nosuch >"$out" 2>"$err"
rc=$?
check "a missing image is named and nothing is created" '[ "$rc" -ne 0 ] && grep -q "no image named '\''nosuch'\''" "$err" && [ ! -e "$(sbdir q)" ]'

# A corrupt image is refused before boot, naming both digests.
mkdir -p "$rt/tree/bin" && cp /bin/busybox "$rt/tree/bin/" && ln -s busybox "$rt/tree/bin/sh"
c image import "$rt/tree" --name corrupt >"$out" 2>"$err"
c create k --image corrupt >"$out" 2>"$err"
img=$(c image inspect corrupt | sed -n 's/^file: *//p')
digest=$(c image inspect corrupt | sed -n 's/^digest: *//p')
printf 'X' | dd of="$img" bs=1 seek=2000 conv=notrunc 2>/dev/null
c exec k -- true >"$out" 2>"$err"
rc=$?
check "a corrupt image is refused before boot, naming both digests" '[ "$rc" -ne 0 ] && grep -q "$digest" "$err" && [ "$(grep -o "sha256:[0-9a-f]\{64\}" "$err" | sort -u | wc -l)" -ge 2 ] && [ "$(ours)" -eq 0 ]'
check "the refused sandbox keeps its disks" '[ -f "$(sbdir k)/private.ext4" ]'
c image rm corrupt >"$out" 2>"$err"
check "image rm refuses an image a sandbox uses" '[ $? -ne 0 ] && grep -q "used by a sandbox" "$err"'
c rm k >/dev/null 2>&1

# --- import: OCI layout with whiteouts, docker save, tar -----------------------
L="$rt/layers"
mkdir -p "$L/l1/bin" "$L/l1/a" "$L/l1/b/x" "$L/l1/c" "$L/l2/a" "$L/l2/b" "$L/l2/d"
cp /bin/busybox "$L/l1/bin/" && ln -s busybox "$L/l1/bin/sh"
echo keep >"$L/l1/a/keep"; echo gone >"$L/l1/a/gone"; echo 1 >"$L/l1/b/x/1"; echo f >"$L/l1/c/file"
: >"$L/l2/a/.wh.gone"; : >"$L/l2/b/.wh..wh..opq"; echo new >"$L/l2/b/new"; echo added >"$L/l2/d/added"
tar -C "$L/l1" -czf "$L/layer1.tar.gz" . && tar -C "$L/l2" --zstd -cf "$L/layer2.tar.zst" .
oci="$rt/oci"
mkdir -p "$oci/blobs/sha256"
blob() { h=$(sha256sum "$1" | cut -d" " -f1); cp "$1" "$oci/blobs/sha256/$h"; echo "$h"; }
h1=$(blob "$L/layer1.tar.gz"); h2=$(blob "$L/layer2.tar.zst")
printf '{"architecture":"amd64","os":"linux","rootfs":{"type":"layers","diff_ids":[]}}' >"$L/config.json"
hc=$(blob "$L/config.json")
printf '{"schemaVersion":2,"mediaType":"application/vnd.oci.image.manifest.v1+json","config":{"mediaType":"application/vnd.oci.image.config.v1+json","digest":"sha256:%s","size":%d},"layers":[{"mediaType":"application/vnd.oci.image.layer.v1.tar+gzip","digest":"sha256:%s","size":%d},{"mediaType":"application/vnd.oci.image.layer.v1.tar+zstd","digest":"sha256:%s","size":%d}]}' \
	"$hc" "$(stat -c %s "$L/config.json")" "$h1" "$(stat -c %s "$L/layer1.tar.gz")" "$h2" "$(stat -c %s "$L/layer2.tar.zst")" >"$L/manifest.json"
hm=$(blob "$L/manifest.json")
printf '{"imageLayoutVersion":"1.0.0"}' >"$oci/oci-layout"
printf '{"schemaVersion":2,"manifests":[{"mediaType":"application/vnd.oci.image.manifest.v1+json","digest":"sha256:%s","size":%d,"platform":{"architecture":"amd64","os":"linux"}}]}' \
	"$hm" "$(stat -c %s "$L/manifest.json")" >"$oci/index.json"
expected="/a /a/keep /b /b/new /c /c/file /d /d/added"
tree() { c exec "$1" -- /bin/busybox sh -c 'cd / && /bin/busybox find a b c d | /bin/busybox sort | /bin/busybox sed "s|^|/|" | /bin/busybox tr "\n" " "'; }

c image import "$oci" --name oci-dir >"$out" 2>"$err"
c create o1 --image oci-dir >/dev/null 2>&1
check "OCI layout import applies file and opaque whiteouts" '[ "$(tree o1) " = "$expected " ] || [ "$(tree o1)" = "$expected " ]'
tar -C "$oci" -cf "$rt/oci.tar" .
c image import "$rt/oci.tar" --name oci-tar >"$out" 2>"$err"
check "an OCI layout in a tar imports to the same image" '[ "$(c image inspect oci-tar | sed -n "s/^digest: *//p")" = "$(c image inspect oci-dir | sed -n "s/^digest: *//p")" ]'
ds="$rt/dsave"
mkdir -p "$ds/l1" "$ds/l2"
gzip -dc "$L/layer1.tar.gz" >"$ds/l1/layer.tar" && zstd -q -dc "$L/layer2.tar.zst" >"$ds/l2/layer.tar"
printf '[{"Config":"c.json","RepoTags":["t:latest"],"Layers":["l1/layer.tar","l2/layer.tar"]}]' >"$ds/manifest.json"
cp "$L/config.json" "$ds/c.json"
tar -C "$ds" -cf "$rt/dsave.tar" .
c image import "$rt/dsave.tar" --name dsave >"$out" 2>"$err"
check "a docker save archive imports to the same tree" '[ "$(c image inspect dsave | sed -n "s/^digest: *//p")" = "$(c image inspect oci-dir | sed -n "s/^digest: *//p")" ]'
tar -C "$L/l1" -cf "$rt/plain.tar" .
c image import "$rt/plain.tar" --name plain >"$out" 2>"$err"
c create o2 --image plain >/dev/null 2>&1
check "a plain tar imports as a root tree" '[ "$(c exec o2 -- /bin/busybox cat /a/gone)" = gone ]'
printf 'not an archive' >"$rt/junk.tar"
c image import "$rt/junk.tar" --name junk >"$out" 2>"$err"
check "a file that is not an archive is refused, named" '[ $? -ne 0 ] && grep -q "junk.tar" "$err"'
rm -f "$oci/blobs/sha256/$h2"
printf 'tampered' >"$oci/blobs/sha256/$h2"
c image import "$oci" --name tampered >"$out" 2>"$err"
check "a layer blob that does not match its digest is refused" '[ $? -ne 0 ] && grep -q "does not match its digest" "$err"'
c rm --force o1 >/dev/null 2>&1; c rm --force o2 >/dev/null 2>&1
c image prune >"$out" 2>"$err"
check "prune removes unused images" 'grep -q "removed" "$out" && ! c image inspect oci-dir >/dev/null 2>&1'

# --- the python image ----------------------------------------------------------
c image build python >"$out" 2>"$err"
rc=$?
# For the suites after this one (tests/run.sh): the image store as built.
[ "$rc" -eq 0 ] && [ -d "${CAPSULE_TEST_SHARE:-}" ] && cp -a "$CAPSULE_HOME/images" "$CAPSULE_TEST_SHARE/"
if [ "$rc" -eq 0 ]; then
	c create py --image python >/dev/null 2>&1
	c exec py -- python3 -c 'print(6*7)' >"$out" 2>"$err"
	check "python image: python3 prints 42" 'grep -qx 42 "$out"'
	c image prune >"$out" 2>"$err"
	check "prune keeps an image a sandbox uses" 'c image inspect python >/dev/null 2>&1'
	c rm --force py >/dev/null 2>&1
else
	not_ok "python image: python3 prints 42" "image build python failed (exit $rc)"
	not_ok "prune keeps an image a sandbox uses" "no python image"
fi
# A sandbox whose record cannot be read: rm says why and how, rm --force
# removes it (and only it).
mkdir -p "$CAPSULE_HOME/sandboxes/broken" && echo '{bad' >"$CAPSULE_HOME/sandboxes/broken/record.json" &&
	: >"$CAPSULE_HOME/sandboxes/broken/private.ext4"
c rm broken >"$out" 2>"$err"
rc=$?
check "rm of a sandbox with an unreadable record refuses (exit $rc), naming the record and rm --force" \
	'[ "$rc" -eq 125 ] && grep -q "record.json is unreadable" "$err" && grep -q "capsule rm --force broken" "$err" && [ -f "$CAPSULE_HOME/sandboxes/broken/private.ext4" ]'
c rm --force broken >"$out" 2>"$err"
rc=$?
check "rm --force removes it (exit $rc)" '[ "$rc" -eq 0 ] && [ ! -e "$CAPSULE_HOME/sandboxes/broken" ]'
clean_after "sandbox suite"
