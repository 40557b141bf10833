#!/bin/sh
# capsule image pull against a real registry: Debian's docker-registry on
# 127.0.0.1 (a free port, storage in this suite's directory), fed with
# small images built here and pushed with skopeo (tests/registry.sh).
# Pull by tag and by digest, the reference and OCI digest recorded and
# usable as --image, a digest the registry lacks or serves other bytes
# for refused, an unreachable registry failing fast with the reason,
# image ls/inspect --json, a moved tag moving; imports dropping device
# nodes and the root overlay mounted nodev,nosuid. One VM. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
registry="$(cd "$(dirname "$0")/.." && pwd)/registry.sh"
c() { "$capsule" "$@"; }
plan=38
suite="pull suite"
start=$(date +%s)
echo "1..$plan"

for tool in skopeo docker-registry busybox python3 curl; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
dead=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CAPSULE_REGISTRY_DIR="$rt/registry"
trap '"$registry" stop "$port" >/dev/null 2>&1; cleanup' EXIT
"$registry" start "$port" >"$out" 2>"$err" || fail_all "the registry did not start: $(cat "$err")"
reg=127.0.0.1:$port

# A small image: busybox and a marker file.
box() { # box DIR MARKER
	mkdir -p "$1/bin" "$1/etc" "$1/dev" "$1/proc" "$1/sys" "$1/tmp" "$1/run" "$1/work" "$1/root"
	cp "$(command -v busybox)" "$1/bin/busybox"
	for a in sh cat id grep ls echo; do ln -sf busybox "$1/bin/$a"; done
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$1/etc/passwd"
	printf 'root:x:0:\n' >"$1/etc/group"
	echo "$2" >"$1/marker"
}
box "$rt/one" one
d1=$("$registry" push-dir "$rt/one" "$reg/t/box:v1" 2>"$err")
check "a locally built image is pushed to the registry with skopeo" 'echo "$d1" | grep -q "^sha256:[0-9a-f]\{64\}$"'

# --- by tag ------------------------------------------------------------
c image pull "$reg/t/box:v1" >"$out" 2>"$err"
rc=$?
check "pull by tag succeeds" '[ "$rc" -eq 0 ] && grep -q "^pulled $reg/t/box:v1 sha256:[0-9a-f]\{64\}$" "$out"'
check "progress in a pipe: one line for the layers, none with bytes" 'grep -q "^image pull: fetching 1 layer, [0-9.]* [KM]i\?B$" "$err" && ! grep -q "%" "$err" && ! grep -q "$(printf "\r")" "$err"'
img1=$(c image inspect "$reg/t/box:v1" | sed -n 's/^digest: *//p')
c image inspect "$reg/t/box:v1" >"$out" 2>"$err"
check "image inspect shows the reference and the OCI manifest digest" 'grep -qx "reference: $reg/t/box:v1" "$out" && grep -qx "oci digest: $d1" "$out" && grep -q "^verified: yes" "$out"'

c create p --image "$reg/t/box:v1" >"$out" 2>"$err"
check "create --image REPO:TAG" 'grep -q "^created sandbox p (image $reg/t/box:v1, $img1)" "$out"'
c exec p -- sh -c 'cat /marker; id -u; grep " / " /proc/mounts' >"$out" 2>"$err"
check "exec in it reads the image's marker" 'grep -qx one "$out"'
check "the root overlay is mounted nodev,nosuid" 'grep " / " "$out" | grep -q "nosuid,nodev"'

# --- by digest -----------------------------------------------------------
c image pull -q "$reg/t/box@$d1" >"$out" 2>"$err"
rc=$?
check "pull by digest succeeds, quietly with -q, to the same image" '[ "$rc" -eq 0 ] && [ ! -s "$err" ] && grep -q "^pulled .* $img1$" "$out"'
check "REPO@sha256:OCIDIGEST finds it" '[ "$(c image inspect "$reg/t/box@$d1" | sed -n "s/^digest: *//p")" = "$img1" ]'
c create p2 --image "$reg/t/box@$d1" >"$out" 2>"$err"
check "create --image REPO@sha256:OCIDIGEST pins it" 'grep -q "^created sandbox p2 .*$img1" "$out"'
c rm p2 >/dev/null 2>&1

nodigest=sha256:$(printf '0%.0s' $(seq 64))
t0=$(date +%s)
c image pull "$reg/t/box@$nodigest" >"$out" 2>"$err"
rc=$?
check "a digest the registry does not have is refused, saying so" '[ "$rc" -eq 125 ] && grep -q "no manifest with that digest" "$err" && grep -q "skopeo:" "$err"'

# --- unreachable -------------------------------------------------------
t0=$(date +%s)
c image pull "127.0.0.1:$dead/t/box:v1" >"$out" 2>"$err"
rc=$?
t1=$(date +%s)
check "an unreachable registry fails within 5 s" '[ "$rc" -eq 125 ] && [ $((t1 - t0)) -le 5 ]'
check "... naming the reason and what to do" 'grep -q "cannot be reached" "$err" && grep -q "connection refused" "$err" && [ "$(wc -l <"$err")" -le 6 ]'
check "no temporary directory is left behind" '[ -z "$(ls "$CAPSULE_HOME/images" | grep tmp-)" ]'
c image pull "$reg/t/NoSuch:v1" >"$out" 2>"$err"
check "a malformed reference is a usage error" '[ $? -eq 2 ] && grep -q "is not a repository" "$err"'
c image pull "$reg/t/box:nosuch" >"$out" 2>"$err"
check "a tag the registry lacks is refused, saying so" '[ $? -eq 125 ] && grep -q "no such repository or tag" "$err"'

# --- JSON ---------------------------------------------------------------
c image ls --json >"$out" 2>"$err"
check "image ls --json parses with python3 -m json.tool" 'python3 -m json.tool "$out" >/dev/null'
check "image ls --json: an array of objects with every field" 'python3 - "$out" "$img1" "$reg/t/box:v1" "$d1" <<EOF
import json, sys
v = json.load(open(sys.argv[1]))
assert isinstance(v, list) and len(v) == 1, v
i = v[0]
assert list(i)[:9] == ["name", "digest", "size", "created", "source", "reference", "oci_digest", "pinned_digest", "file"], list(i)
assert i["name"] is None and i["digest"] == sys.argv[2] and i["reference"] == sys.argv[3] and i["oci_digest"] == sys.argv[4]
assert isinstance(i["size"], int) and i["size"] > 0 and isinstance(i["created"], int) and i["created"] > 1600000000
assert i["source"].startswith("pull of ") and i["file"].endswith("/rootfs.erofs") and i["pinned_digest"] is None
EOF'
c image inspect --json "$reg/t/box:v1" >"$out" 2>"$err"
check "image inspect --json: one object, verified true" 'python3 -m json.tool "$out" >/dev/null && python3 -c "
import json, sys; i = json.load(open(sys.argv[1])); assert i[\"verified\"] is True and i[\"digest\"] == sys.argv[2] and i[\"oci_digest\"] == sys.argv[3]" "$out" "$img1" "$d1"'

# --- a moved tag ----------------------------------------------------------
box "$rt/two" two
d2=$("$registry" push-dir "$rt/two" "$reg/t/box:v1" 2>"$err")
c image pull "$reg/t/box:v1" >"$out" 2>"$err"
img2=$(c image inspect "$reg/t/box:v1" | sed -n 's/^digest: *//p')
check "a tag pulled again at other bytes moves to the new image" '[ "$d2" != "$d1" ] && [ -n "$img2" ] && [ "$img2" != "$img1" ] && c image inspect "$reg/t/box:v1" | grep -qx "oci digest: $d2"'
check "the old image keeps its digest pin and loses the tag" 'c image inspect "$reg/t/box@$d1" | grep -qx "digest:   $img1" && [ "$(c image inspect --json "$img1" | python3 -c "import json, sys; print(json.load(sys.stdin)[\"reference\"])")" = "$reg/t/box@$d1" ]'
c exec p -- cat /marker >"$out" 2>"$err"
check "the sandbox made before keeps its image" 'grep -qx one "$out"'
c rm --force p >/dev/null 2>&1

# --- one content under two references, one a Docker v2s2 manifest -------
box "$rt/three" three
dx=$("$registry" push-dir "$rt/three" "$reg/t/x:1" 2>"$err")
CAPSULE_REGISTRY_FORMAT=v2s2 "$registry" push-dir "$rt/three" "$reg/t/v2:1" >/dev/null 2>"$err"
dv2=$(curl -fsSI -H "Accept: application/vnd.docker.distribution.manifest.v2+json" "http://$reg/v2/t/v2/manifests/1" |
	tr -d '\r' | sed -n 's/^[Dd]ocker-[Cc]ontent-[Dd]igest: *//p')
check "a Docker v2s2 image is in the registry" 'curl -fsSI -H "Accept: application/vnd.docker.distribution.manifest.v2+json" "http://$reg/v2/t/v2/manifests/1" | grep -qi "content-type: application/vnd.docker.distribution.manifest.v2+json" && [ -n "$dv2" ] && [ "$dv2" != "$dx" ]'
c image pull -q "$reg/t/x:1" >/dev/null 2>"$err"
c image pull "$reg/t/v2:1" >"$out" 2>"$err"
rc=$?
img3=$(c image inspect "$reg/t/x:1" | sed -n 's/^digest: *//p')
check "pull of the v2s2 image by tag records the registry's digest" '[ "$rc" -eq 0 ] && grep -qx "registry digest: $dv2" "$out" && ! grep -qx "oci digest: $dv2" "$out"'
check "both references give the same bytes, each keeps its own origin" '[ -n "$img3" ] && grep -q " $img3$" "$out" && c image inspect "$reg/t/x:1" | grep -qx "reference: $reg/t/x:1" && c image inspect "$reg/t/x:1" | grep -qx "oci digest: $dx" && c image inspect "$reg/t/v2:1" | grep -qx "registry digest: $dv2"'
check "REPO@sha256:<digest of the first reference> still finds it" '[ "$(c image inspect "$reg/t/x@$dx" | sed -n "s/^digest: *//p")" = "$img3" ]'
c create p3 --image "$reg/t/v2@$dv2" >"$out" 2>"$err"
check "create --image REPO@sha256:<registry digest of a v2s2 image>" 'grep -q "^created sandbox p3 .*$img3" "$out"'
c rm --force p3 >/dev/null 2>&1
c image pull -q "$reg/t/v2@$dv2" >"$out" 2>"$err"
check "pull by the v2s2 registry digest gives the same image" '[ $? -eq 0 ] && grep -q " $img3$" "$out"'
c image inspect --json "$reg/t/v2:1" >"$out" 2>"$err"
check "image inspect --json: the looked-up origin on top, every origin listed" 'python3 - "$out" "$reg" "$dv2" "$dx" <<EOF
import json, sys
i = json.load(open(sys.argv[1])); reg = sys.argv[2]
assert i["reference"] == reg + "/t/v2:1" and i["registry_digest"] == sys.argv[3], i
refs = {o["reference"]: o for o in i["origins"]}
assert set(refs) == {reg + "/t/x:1", reg + "/t/v2:1", reg + "/t/v2@" + sys.argv[3]}, refs
assert refs[reg + "/t/x:1"]["oci_digest"] == sys.argv[4] and refs[reg + "/t/x:1"]["registry_digest"] == sys.argv[4]
assert all(o["current"] for o in i["origins"]) and all(isinstance(o["pulled"], int) for o in i["origins"])
EOF'
check "image ls shows a pulled image's reference where it has no name" 'c image ls | grep -q "^$reg/t/\(x\|v2\):1 *sha256:"'

# --- references refused before any pull -----------------------------------
c image pull "../x" >"$out" 2>"$err"
rc1=$?
c image pull "[::1]:$port/t/box:v1" >"$out" 2>&1
rc2=$?
check "a malformed host and an IPv6 literal are usage errors" '[ "$rc1" -eq 2 ] && grep -q "is not a registry host" "$err" && [ "$rc2" -eq 2 ] && grep -q "IPv6" "$out"'
long=$reg$(printf '/a%.0s' $(seq 70))
c image pull "$long:v1" >"$out" 2>"$err"
check "a reference too long to store is refused before pulling" '[ $? -eq 2 ] && grep -q "limit of 255" "$err" && ! grep -q skopeo "$err"'

# --- a pull killed midway leaves a directory the next one sweeps -----------
hang=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
python3 -c 'import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(8)
held = []
while True: held.append(s.accept()[0])' "$hang" &
hangpid=$!
sleep 0.2
# In its own process group, SIGINT not ignored (as a background job's is):
# as a pull interrupted with ^C.
python3 -c 'import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL); os.setsid(); os.execv(sys.argv[1], sys.argv[1:])' \
	"$capsule" image pull -q "127.0.0.1:$hang/t/x:1" >/dev/null 2>&1 &
pullpid=$!
i=0
while [ -z "$(ls "$CAPSULE_HOME/images" | grep tmp-pull-)" ] && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
sleep 0.3
kill -INT "-$pullpid" 2>/dev/null
i=0
while kill -0 "$pullpid" 2>/dev/null && [ $i -lt 30 ]; do sleep 0.1; i=$((i + 1)); done
gone=$i
kill -KILL "-$pullpid" 2>/dev/null
wait "$pullpid" 2>/dev/null
kill "$hangpid" 2>/dev/null
wait "$hangpid" 2>/dev/null
left=$(ls "$CAPSULE_HOME/images" | grep -c tmp-pull-)
check "a pull interrupted by SIGINT ends and leaves its temporary directory" '[ "$gone" -lt 30 ] && [ "$left" -ge 1 ]'
c image pull -q "$reg/t/x:1" >/dev/null 2>"$err"
check "the next pull removes it (its lock is not held)" '[ -z "$(ls "$CAPSULE_HOME/images" | grep tmp-)" ]'

# --- a registry serving other bytes for a digest ---------------------------
blob="$CAPSULE_REGISTRY_DIR/storage/docker/registry/v2/blobs/sha256/$(echo "${d2#sha256:}" | cut -c1-2)/${d2#sha256:}/data"
python3 - "$blob" <<'EOF'
import sys
p = sys.argv[1]
b = open(p, "rb").read()
open(p, "wb").write(b + b"\n")  # still JSON, other bytes
EOF
c image pull "$reg/t/box@$d2" >"$out" 2>"$err"
rc=$?
check "a registry serving other bytes for a pinned digest is refused (skopeo verifies)" '[ "$rc" -eq 125 ] && grep -q "do not match the digest: refused" "$err"'

# --- help, imports -------------------------------------------------------
c image build --help >"$out" 2>"$err"
rc=$?
check "image build --help prints the usage and builds nothing" '[ "$rc" -eq 0 ] && grep -q "^Usage: capsule image" "$out" && [ ! -e "$CAPSULE_HOME/images/names/--help" ]'
c image pull -h >"$out" 2>"$err"
check "image pull -h prints the usage" '[ $? -eq 0 ] && grep -q "pull REF" "$out"'
python3 - "$rt/dev.tar" <<'EOF'
import io, sys, tarfile
with tarfile.open(sys.argv[1], "w") as t:
    for name, kind in (("dev", tarfile.DIRTYPE), ("dev/sda", tarfile.BLKTYPE), ("dev/mem", tarfile.CHRTYPE)):
        i = tarfile.TarInfo(name); i.type = kind; i.devmajor, i.devminor = 1, 1; t.addfile(i)
    i = tarfile.TarInfo("hello"); i.size = 3; t.addfile(i, io.BytesIO(b"hi\n"))
EOF
c image import "$rt/dev.tar" --name devs >"$out" 2>"$err"
check "an imported tar's device nodes are dropped and listed" 'grep -q "^imported devs sha256:[0-9a-f]* (dropped 2 device nodes, FIFOs or sockets: /dev/sda, /dev/mem)$" "$out" && grep -q "dropped 2 device nodes" "$err"'
elapsed "done"
