#!/bin/sh
# capsule image check, image outdated, serve's image_check and pull's
# progress against a real registry: Debian's docker-registry on 127.0.0.1
# (tests/registry.sh), fed with small images pushed with skopeo and with
# manifests and indexes put through the registry's HTTP API (an artifact,
# an index for arm64 only, an index wrapping the same manifest). Layers
# not downloaded by a check (the registry's access log); a tag re-pushed
# with a new manifest outdated, the same manifest under a new index not;
# a registry wanting credentials refused, saying how to log in; an
# offline registry and one that never answers "unknown" within the
# timeout; bytes and percentages per layer on a pty, none in a pipe. No
# VM. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
top="$(cd "$(dirname "$0")/../.." && pwd)"
registry="$top/tests/registry.sh"
c() { "$capsule" "$@"; }
plan=37
suite="image check suite"
start=$(date +%s)
echo "1..$plan"

for tool in skopeo docker-registry busybox python3 curl script; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed (scripts/bootstrap.sh installs it)"
done
freeport() { python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
port=$(freeport)
port2=$(freeport)
export CAPSULE_REGISTRY_DIR="$rt/registry"
hangpid=
servepid=
trap 'CAPSULE_REGISTRY_DIR="$rt/registry" "$registry" stop "$port" >/dev/null 2>&1
	CAPSULE_REGISTRY_DIR="$rt/registry2" "$registry" stop "$port2" >/dev/null 2>&1
	[ -n "$hangpid" ] && kill "$hangpid" 2>/dev/null
	[ -n "$servepid" ] && kill "$servepid" 2>/dev/null && wait "$servepid" 2>/dev/null
	cleanup' EXIT
"$registry" start "$port" >"$out" 2>"$err" || fail_all "the registry did not start: $(cat "$err")"
reg=127.0.0.1:$port
log="$CAPSULE_REGISTRY_DIR/log"

# The registry's HTTP API, for documents skopeo would not push as they are.
cat >"$rt/regput.py" <<'EOF'
"""regput.py HOST REPO blob FILE | manifest TAG MEDIATYPE FILE: upload,
print the digest."""
import hashlib, sys, urllib.request
host, repo, what = sys.argv[1:4]
def req(method, url, data=b"", ctype=None):
    r = urllib.request.Request(url, data=data, method=method)
    if ctype:
        r.add_header("Content-Type", ctype)
    return urllib.request.urlopen(r)
if what == "blob":
    data = open(sys.argv[4], "rb").read()
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    loc = req("POST", f"http://{host}/v2/{repo}/blobs/uploads/").headers["Location"]
    loc = loc if loc.startswith("http") else f"http://{host}{loc}"
    req("PUT", f"{loc}{'&' if '?' in loc else '?'}digest={d}", data, "application/octet-stream")
else:
    tag, mt, data = sys.argv[4], sys.argv[5], open(sys.argv[6], "rb").read()
    d = "sha256:" + hashlib.sha256(data).hexdigest()
    req("PUT", f"http://{host}/v2/{repo}/manifests/{tag}", data, mt)
print(d)
EOF
regput() { python3 "$rt/regput.py" "$reg" "$@"; }
manifest_of() { # manifest_of REPO REF: the registry's bytes
	curl -fsS -H "Accept: application/vnd.oci.image.manifest.v1+json" -H "Accept: application/vnd.oci.image.index.v1+json" \
		"http://$reg/v2/$1/manifests/$2"
}
# An OCI index of entries "DIGEST SIZE OS/ARCH" on stdin, with an annotation.
index_json() { # index_json NOTE
	python3 -c 'import json, sys
m = []
for line in sys.stdin:
    d, size, plat = line.split()
    os_, arch = plat.split("/")
    m.append({"mediaType": "application/vnd.oci.image.manifest.v1+json", "digest": d, "size": int(size),
              "platform": {"os": os_, "architecture": arch}})
print(json.dumps({"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json",
                  "manifests": m, "annotations": {"note": sys.argv[1]}}))' "$1"
}

box() { # box DIR MARKER
	mkdir -p "$1/bin" "$1/etc"
	cp "$(command -v busybox)" "$1/bin/busybox"
	ln -sf busybox "$1/bin/sh"
	echo "$2" >"$1/marker"
}
box "$rt/one" one
d1=$("$registry" push-dir "$rt/one" "$reg/t/box:v1" 2>"$err")
check "an image is pushed to the registry" 'echo "$d1" | grep -q "^sha256:[0-9a-f]\{64\}$"'
manifest_of t/box "$d1" >"$rt/m1.json"
layer=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["layers"][0]["digest"])' "$rt/m1.json")
lsize=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["layers"][0]["size"])' "$rt/m1.json")
cdigest=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["config"]["digest"])' "$rt/m1.json")

# --- check of a good reference --------------------------------------------
before=$(wc -l <"$log")
c image check "$reg/t/box:v1" >"$out" 2>"$err"
rc=$?
check "image check of a good reference succeeds" '[ "$rc" -eq 0 ] && grep -qx "reference:       $reg/t/box:v1" "$out"'
check "... naming the manifest digest, the layers and their size, the config" 'grep -q "^manifest digest: $d1 (application/vnd.oci.image.manifest.v1+json)$" "$out" && grep -q "^layers: *1, .*$lsize bytes.* compressed$" "$out" && grep -q "^cmd: *\[\"/bin/sh\"\]$" "$out" && grep -q "^os/arch: *linux/amd64$" "$out"'
sed -n "$((before + 1)),\$p" "$log" | grep '"GET /v2/t/box/blobs/' >"$rt/blobs"
check "... without downloading a layer: only the config blob is fetched" '[ "$(wc -l <"$rt/blobs")" -eq 1 ] && grep -q "blobs/$cdigest " "$rt/blobs" && ! grep -q "$layer" "$rt/blobs"'
c image check --json "$reg/t/box:v1" >"$out" 2>"$err"
check "image check --json: the documented shape with the registry's numbers" 'python3 - "$out" "$d1" "$lsize" "$cdigest" <<EOF
import json, sys
j = json.load(open(sys.argv[1]))
assert j["platform_digest"] == sys.argv[2] == j["registry_digest"] and j["index"] is False and j["platforms"] == [], j
assert j["layer_count"] == 1 and j["compressed_bytes"] == int(sys.argv[3]) == j["layers"][0]["size_bytes"], j
assert j["config"]["digest"] == sys.argv[4] and j["config"]["os"] == "linux" and j["config"]["architecture"] == "amd64", j
assert j["config"]["cmd"] == ["/bin/sh"] and j["config"]["entrypoint"] is None and j["config"]["env"], j
assert j["platform"] == "linux/amd64" and j["media_type"] == j["manifest_media_type"] == "application/vnd.oci.image.manifest.v1+json"
EOF'

c image check "$reg/t/box@$d1" >"$out" 2>"$err" && c image check "$reg/t/box:v1@$d1" >>"$out" 2>>"$err"
check "image check by REPO@DIGEST and REPO:TAG@DIGEST" '[ $? -eq 0 ] && [ "$(grep -c "^manifest digest: $d1 " "$out")" -eq 2 ]'

# --- refusals ------------------------------------------------------------------------
c image check "$reg/t/box:nope" >"$out" 2>"$err"
rc=$?
check "a missing tag: exit 125 naming the reference and what to do" '[ "$rc" -eq 125 ] && [ ! -s "$out" ] && grep -q "cannot check $reg/t/box:nope: the registry has no such repository or tag: check the name and tag" "$err"'
c image check "../x" >"$out" 2>"$err"
rc=$?
check "a malformed reference is a usage error naming it" '[ "$rc" -eq 2 ] && grep -q "is not a registry host" "$err"'
c image check "$reg/t/box:v1" --platform linux >"$out" 2>"$err"
check "a malformed platform is a usage error" '[ $? -eq 2 ] && grep -q "is not OS/ARCH" "$err"'

# An artifact: an OCI manifest whose config and layer are a Helm chart's.
printf '{}' >"$rt/helm-config"
printf 'chart' >"$rt/helm-layer"
hc=$(regput t/helm blob "$rt/helm-config")
hl=$(regput t/helm blob "$rt/helm-layer")
printf '{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json", "config": {"mediaType": "application/vnd.cncf.helm.config.v1+json", "digest": "%s", "size": 2}, "layers": [{"mediaType": "application/vnd.cncf.helm.chart.content.v1.tar+gzip", "digest": "%s", "size": 5}]}' \
	"$hc" "$hl" >"$rt/helm.json"
regput t/helm manifest 1 application/vnd.oci.image.manifest.v1+json "$rt/helm.json" >/dev/null 2>"$err"
c image check "$reg/t/helm:1" >"$out" 2>"$err"
rc=$?
check "a media type capsule does not take is refused, naming it" '[ "$rc" -eq 125 ] && grep -q "cannot check $reg/t/helm:1: its config.s media type is application/vnd.cncf.helm.config.v1+json, not an image config" "$err"'

# An index offering arm64 only (its entry is our amd64 manifest, mislabelled:
# the check goes by the index, and fetches nothing more).
m1size=$(wc -c <"$rt/m1.json")
echo "$d1 $m1size linux/arm64" | index_json arm >"$rt/arm.json"
regput t/box manifest arm application/vnd.oci.image.index.v1+json "$rt/arm.json" >/dev/null 2>"$err"
c image check "$reg/t/box:arm" >"$out" 2>"$err"
rc=$?
check "an index with no manifest for linux/amd64 is refused, naming the platforms offered" '[ "$rc" -eq 125 ] && grep -q "cannot check $reg/t/box:arm: the index has no manifest for linux/amd64, the platform capsule runs; it offers linux/arm64$" "$err"'

# An index for two platforms, amd64 being the manifest pushed first.
printf '%s %s linux/amd64\n%s %s linux/arm64\n' "$d1" "$m1size" "$d1" "$m1size" | index_json multi >"$rt/multi.json"
dm=$(regput t/box manifest multi application/vnd.oci.image.index.v1+json "$rt/multi.json" 2>"$err")
c image check --json "$reg/t/box:multi" >"$out" 2>"$err"
check "through an index: the per-platform manifest digest and the index's" 'python3 - "$out" "$d1" "$dm" <<EOF
import json, sys
j = json.load(open(sys.argv[1]))
assert j["index"] is True and j["registry_digest"] == sys.argv[3] != sys.argv[2] and j["platform_digest"] == sys.argv[2], j
assert j["platforms"] == ["linux/amd64", "linux/arm64"] and j["media_type"] == "application/vnd.oci.image.index.v1+json", j
assert j["layer_count"] == 1, j
EOF'

# A registry that wants credentials (htpasswd; the password does not matter).
port3=$(freeport)
mkdir -p "$rt/registry3/storage"
python3 -W ignore -c 'import crypt; print("u:" + crypt.crypt("p", crypt.mksalt(crypt.METHOD_BLOWFISH)))' >"$rt/registry3/htpasswd"
cat >"$rt/registry3/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $rt/registry3/storage
auth:
  htpasswd:
    realm: capsule-test
    path: $rt/registry3/htpasswd
http:
  addr: 127.0.0.1:$port3
EOF
docker-registry serve "$rt/registry3/config.yml" >"$rt/registry3/log" 2>&1 &
authpid=$!
i=0
until [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$port3/v2/")" = 401 ] || [ $i -gt 50 ]; do sleep 0.1; i=$((i + 1)); done
c image check "127.0.0.1:$port3/t/x:1" >"$out" 2>"$err"
rc=$?
kill "$authpid" 2>/dev/null
wait "$authpid" 2>/dev/null
check "a registry that wants credentials: refused, saying how to log in" '[ "$rc" -eq 125 ] && grep -q "cannot check 127.0.0.1:$port3/t/x:1: the registry wants credentials, or the repository does not exist: log in with .skopeo login HOST." "$err"'

# --- unreachable and silent registries ------------------------------------------------
dead=$(freeport)
t0=$(date +%s)
c image check "127.0.0.1:$dead/t/x:1" >"$out" 2>"$err"
rc=$?
check "nothing listening: refused at once, saying it cannot be reached" '[ "$rc" -eq 125 ] && [ $(($(date +%s) - t0)) -le 3 ] && grep -q "cannot check 127.0.0.1:$dead/t/x:1: the registry cannot be reached" "$err"'
hang=$(freeport)
python3 -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64)
open(sys.argv[2], "w").close()
held = []
while True: held.append(s.accept()[0])' "$hang" "$rt/silent-up" &
hangpid=$!
wait_for '[ -e "$rt/silent-up" ]' 100
rm -f "$rt/silent-up"
t0=$(date +%s%N)
c image check --timeout 2 "127.0.0.1:$hang/t/x:1" >"$out" 2>"$err"
rc=$?
ms=$((($(date +%s%N) - t0) / 1000000))
check "a registry that never answers: refused within --timeout 2 (+1 s), saying so ($ms ms)" '[ "$rc" -eq 125 ] && [ "$ms" -ge 1500 ] && [ "$ms" -le 3000 ] && grep -q "the registry did not answer in time" "$err"'

# --- outdated ----------------------------------------------------------------------
c image pull -q "$reg/t/box:v1" >/dev/null 2>"$err"
c image outdated >"$out" 2>"$err"
check "a tag just pulled is up to date" '[ $? -eq 0 ] && grep -qx "$reg/t/box:v1: up to date ($d1)" "$out"'
check "the pull recorded the platform manifest digest" '[ "$(c image inspect --json "$reg/t/box:v1" | python3 -c "import json, sys; print(json.load(sys.stdin)[\"origins\"][0].get(\"platform_digest\"))")" = "$d1" ]'

# The same manifest again, now under a new index at the tag.
printf '%s %s linux/amd64\n%s %s linux/arm64\n' "$d1" "$m1size" "$d1" "$m1size" | index_json repush >"$rt/repush.json"
di=$(regput t/box manifest v1 application/vnd.oci.image.index.v1+json "$rt/repush.json" 2>"$err")
c image check --json "$reg/t/box:v1" >"$rt/now.json" 2>"$err"
check "the tag now names a new index" 'python3 -c "import json, sys; j = json.load(open(sys.argv[1])); assert j[\"registry_digest\"] == sys.argv[2] != sys.argv[3]" "$rt/now.json" "$di" "$d1"'
c image outdated "$reg/t/box:v1" >"$out" 2>"$err"
check "the same manifest under a new index is NOT outdated" '[ $? -eq 0 ] && grep -qx "$reg/t/box:v1: up to date ($d1)" "$out"'
# The same manifest pushed again as it was.
skopeo copy --quiet --retry-times 0 --src-tls-verify=false --dest-tls-verify=false "docker://$reg/t/box@$d1" "docker://$reg/t/box:v1" >/dev/null 2>"$err"
c image outdated --json >"$out" 2>"$err"
check "the same manifest pushed again is NOT outdated either" 'python3 - "$out" "$reg" "$d1" <<EOF
import json, sys
j = json.load(open(sys.argv[1]))
assert len(j) == 1 and j[0]["reference"] == sys.argv[2] + "/t/box:v1" and j[0]["state"] == "up_to_date", j
assert j[0]["recorded_digest"] == j[0]["current_digest"] == sys.argv[3] and j[0]["reason"] is None, j
EOF'

# A new manifest at the tag.
box "$rt/two" two
d2=$("$registry" push-dir "$rt/two" "$reg/t/box:v1" 2>"$err")
c image outdated >"$out" 2>"$err"
check "a tag re-pushed with a new manifest is outdated, naming both digests" '[ "$d2" != "$d1" ] && grep -qx "$reg/t/box:v1: outdated: pulled $d1, the registry now has $d2; \`capsule image pull $reg/t/box:v1\` gets it" "$out"'
c image outdated --json "$reg/t/box:v1" >"$out" 2>"$err"
check "... and so says --json" 'python3 -c "import json, sys; j = json.load(open(sys.argv[1])); assert [(x[\"state\"], x[\"recorded_digest\"], x[\"current_digest\"]) for x in j] == [(\"outdated\", sys.argv[2], sys.argv[3])], j" "$out" "$d1" "$d2"'
c image pull -q "$reg/t/box:v1" >/dev/null 2>"$err"
c image outdated "$reg/t/box:v1" >"$out" 2>"$err"
check "pulled again, it is up to date" 'grep -qx "$reg/t/box:v1: up to date ($d2)" "$out"'

# A tag pulled for another platform is compared for that platform.
curl -fsS "http://$reg/v2/t/box/blobs/$cdigest" >"$rt/c1.json"
python3 - "$rt/c1.json" "$rt/m1.json" "$rt/armc.json" <<'EOF'
import json, sys
c = json.load(open(sys.argv[1]))
c["architecture"] = "arm64"
open(sys.argv[3], "w").write(json.dumps(c))
EOF
ac=$(regput t/box blob "$rt/armc.json")
python3 - "$rt/m1.json" "$ac" "$(wc -c <"$rt/armc.json")" >"$rt/armm.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["config"]["digest"], m["config"]["size"] = sys.argv[2], int(sys.argv[3])
print(json.dumps(m))
EOF
da=$(regput t/box manifest armonly application/vnd.oci.image.manifest.v1+json "$rt/armm.json")
printf '%s %s linux/amd64\n%s %s linux/arm64\n' "$d2" "$(manifest_of t/box "$d2" | wc -c)" "$da" "$(wc -c <"$rt/armm.json")" |
	index_json both >"$rt/both.json"
regput t/box manifest both application/vnd.oci.image.index.v1+json "$rt/both.json" >/dev/null
c image pull -q --platform linux/arm64 "$reg/t/box:both" >/dev/null 2>"$err"
c image outdated --json "$reg/t/box:both" >"$out" 2>&1
check "a tag pulled for linux/arm64 is compared for linux/arm64 (up to date), its platform recorded" 'python3 - "$out" "$da" <<EOF
import json, sys
j = json.load(open(sys.argv[1]))
assert [(x["state"], x["recorded_digest"], x["current_digest"]) for x in j] == [("up_to_date", sys.argv[2], sys.argv[2])], j
EOF
[ $? -eq 0 ] && c image inspect --json "$reg/t/box:both" | python3 -c "import json, sys; o = [x for x in json.load(sys.stdin)[\"origins\"] if x[\"reference\"].endswith(\"/t/box:both\")]; assert o[0][\"platform\"] == \"linux/arm64\", o"'

# An image pulled before digests were recorded.
c image pull -q "$reg/t/box:multi" >/dev/null 2>"$err"
hex=$(c image inspect --json "$reg/t/box:multi" | python3 -c 'import json, sys; print(json.load(sys.stdin)["digest"][7:])')
python3 - "$CAPSULE_HOME/images/$hex/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
for o in m["origins"]:
    o.pop("platform_digest", None)
m.pop("platform_digest", None)
json.dump(m, open(sys.argv[1], "w"))
EOF
c image outdated "$reg/t/box:multi" >"$out" 2>"$err"
check "an image pulled before digests were recorded: unknown, saying so" '[ $? -eq 0 ] && grep -qx "$reg/t/box:multi: unknown (pulled before digests were recorded): pull it again to record one" "$out"'

# Offline: a second registry, gone after the pull; then one that never answers.
CAPSULE_REGISTRY_DIR="$rt/registry2" "$registry" start "$port2" >/dev/null 2>"$err"
CAPSULE_REGISTRY_DIR="$rt/registry2" "$registry" push-dir "$rt/one" "127.0.0.1:$port2/t/off:1" >/dev/null 2>"$err"
c image pull -q "127.0.0.1:$port2/t/off:1" >/dev/null 2>"$err"
CAPSULE_REGISTRY_DIR="$rt/registry2" "$registry" stop "$port2" >/dev/null 2>&1
t0=$(date +%s)
c image outdated --json >"$out" 2>"$err"
check "a registry gone offline: unknown (offline) at once, the others still answered" '[ $(($(date +%s) - t0)) -le 3 ] && python3 - "$out" "$port2" <<EOF
import json, sys
j = {x["reference"].split("/")[0] + "/" + x["reference"].split("/", 1)[1]: x for x in json.load(open(sys.argv[1]))}
off = [x for r, x in j.items() if r.startswith("127.0.0.1:" + sys.argv[2] + "/")]
assert len(off) == 1 and off[0]["state"] == "unknown" and off[0]["reason"] == "offline" and off[0]["current_digest"] is None, off
assert "cannot be reached" in off[0]["message"], off
assert sum(1 for x in j.values() if x["state"] == "up_to_date") == 1, j
EOF'
# The same host and port now accept and never answer (nothing else checked: IMAGE given).
kill "$hangpid" 2>/dev/null
wait "$hangpid" 2>/dev/null
python3 -c 'import socket, sys
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(64)
open(sys.argv[2], "w").close()
held = []
while True: held.append(s.accept()[0])' "$port2" "$rt/silent-up" &
hangpid=$!
wait_for '[ -e "$rt/silent-up" ]' 100
rm -f "$rt/silent-up"
t0=$(date +%s%N)
c image outdated --timeout 2 "127.0.0.1:$port2/t/off:1" >"$out" 2>"$err"
ms=$((($(date +%s%N) - t0) / 1000000))
check "a registry that never answers: unknown (timeout) within --timeout 2 (+1 s) ($ms ms)" '[ "$ms" -le 3000 ] && grep -q "^127.0.0.1:$port2/t/off:1: unknown (timeout): cannot check 127.0.0.1:$port2/t/off:1: the registry did not answer in time" "$out"'
t0=$(date +%s%N)
c image outdated --timeout 2 >"$out" 2>"$err"
ms=$((($(date +%s%N) - t0) / 1000000))
check "every tag at once still within the timeout ($ms ms): the silent one unknown, the others answered" '[ "$ms" -le 3000 ] && grep -q "/t/off:1: unknown (timeout)" "$out" && grep -qx "$reg/t/box:v1: up to date ($d2)" "$out"'
kill "$hangpid" 2>/dev/null
wait "$hangpid" 2>/dev/null
hangpid=

# --- progress --------------------------------------------------------------------------
box "$rt/big" big
head -c 12000000 /dev/urandom >"$rt/big/noise"
db=$("$registry" push-dir "$rt/big" "$reg/t/big:1" 2>"$err")
bsize=$(manifest_of t/big "$db" | python3 -c 'import json, sys; print(json.load(sys.stdin)["layers"][0]["size"])')
bhex=$(manifest_of t/big "$db" | python3 -c 'import json, sys; print(json.load(sys.stdin)["layers"][0]["digest"][7:19])')
human=$(python3 -c 'import sys; print("%.1f MiB" % (int(sys.argv[1]) / 1048576))' "$bsize")
script -qec "stty cols 250; '$capsule' image pull '$reg/t/big:1'" /dev/null >"$rt/pty" 2>&1
rc=$?
tr '\r' '\n' <"$rt/pty" >"$out"
check "pull on a terminal: the layer's bytes and percentage, to 100%" '[ "$rc" -eq 0 ] && grep -q "^.*image pull: fetching 1 layer, $human: layer 1/1 $bhex $human of $human 100%" "$out" && grep -q "pulled $reg/t/big:1 sha256:" "$out"'
check "... rewritten in place (a carriage return and erase before each)" 'grep -q "$(printf "\r\033\\[K")image pull: fetching 1 layer" "$rt/pty"'
c image rm "$reg/t/big:1" >/dev/null 2>&1
c image pull "$reg/t/big:1" >"$out" 2>"$err"
check "pull in a pipe: one line for the layers, no bytes, no percentage" '[ $? -eq 0 ] && grep -qx "image pull: fetching 1 layer, $human" "$err" && ! grep -q "%\|Copying blob" "$err"'

# Three layers, fetched side by side: each told with its own bytes.
python3 - "$rt/three" >"$rt/want" <<'EOF'
import gzip, hashlib, io, json, os, sys, tarfile
out = sys.argv[1]
os.makedirs(out)
layers, diffs = [], []
for i, size in enumerate((3000000, 5000000, 2000000)):
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as t:
        info = tarfile.TarInfo(f"noise{i}")
        info.size = size
        t.addfile(info, io.BytesIO(os.urandom(size)))
    tar = raw.getvalue()
    gz = gzip.compress(tar, compresslevel=1, mtime=0)
    d = "sha256:" + hashlib.sha256(gz).hexdigest()
    open(f"{out}/layer{i}", "wb").write(gz)
    layers.append({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": len(gz)})
    diffs.append("sha256:" + hashlib.sha256(tar).hexdigest())
config = json.dumps({"architecture": "amd64", "os": "linux", "config": {"Cmd": ["/bin/sh"]},
                     "rootfs": {"type": "layers", "diff_ids": diffs}}).encode()
open(f"{out}/config", "wb").write(config)
m = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
     "config": {"mediaType": "application/vnd.oci.image.config.v1+json",
                "digest": "sha256:" + hashlib.sha256(config).hexdigest(), "size": len(config)},
     "layers": layers}
open(f"{out}/manifest", "w").write(json.dumps(m))
# What progress must end with, for each layer and in all.
mib = lambda b: "%.1f MiB" % (b / 1048576)
for i, l in enumerate(layers):
    print(f"layer {i + 1}/3 {l['digest'][7:19]} {mib(l['size'])} of {mib(l['size'])} 100%")
print("fetching 3 layers, " + mib(sum(l["size"] for l in layers)))
EOF
for f in config layer0 layer1 layer2; do regput t/three blob "$rt/three/$f" >/dev/null; done
regput t/three manifest 1 application/vnd.oci.image.manifest.v1+json "$rt/three/manifest" >/dev/null
script -qec "stty cols 250; '$capsule' image pull '$reg/t/three:1'" /dev/null >"$rt/pty" 2>&1
rc=$?
tr '\r' '\n' <"$rt/pty" | sed 's/; /\n/g' >"$out"
check "three layers on a terminal: each one's bytes to 100%, under their total" '[ "$rc" -eq 0 ] && [ "$(wc -l <"$rt/want")" -eq 4 ] && miss=0 && while read -r line; do grep -qF "$line" "$out" || miss=1; done <"$rt/want" && [ "$miss" -eq 0 ]'

# --- serve's image_check ------------------------------------------------------------
sock="$rt/serve.sock"
"$capsule" serve --socket "$sock" >"$rt/serve.log" 2>&1 &
servepid=$!
i=0
while [ ! -S "$sock" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
/usr/bin/python3 - "$top" "$sock" "$reg" "$d2" "$hang" >"$out" 2>&1 <<'EOF'
import json, subprocess, sys, time
sys.path.insert(0, sys.argv[1] + "/clients/python/src")
from capsule_client import Client, ToolRefused, InvalidParams
_, top, sock, reg, d2, hang = sys.argv
with Client(sock) as c:
    r = c.image_check(reg + "/t/box:v1")
    cli = json.loads(subprocess.run([top + "/build/capsule", "image", "check", "--json", reg + "/t/box:v1"],
                                    stdout=subprocess.PIPE, check=False).stdout or "null")
    print("result", r.platform_digest == d2 and r.layer_count == 1 and r.raw == cli)
    try:
        c.image_check(reg + "/t/box:nope")
        print("missing answered")
    except ToolRefused as e:
        print("missing", e.data.get("reason"), "cannot check " + reg + "/t/box:nope" in str(e))
    try:
        c.image_check("../x")
        print("bad answered")
    except InvalidParams as e:
        print("bad", e.data.get("reason"))
    # A check of a registry that never answers holds up no other call.
    import socket, threading
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(16)
    ref = "127.0.0.1:%d/x:1" % silent.getsockname()[1]
    got = []
    def slow():
        t = time.time()
        try:
            c.image_check(ref, timeout=2)
        except ToolRefused as e:
            got.append((e.data.get("reason"), time.time() - t))
    th = threading.Thread(target=slow)
    th.start()
    time.sleep(0.3)
    t = time.time()
    c.info()
    print("info", time.time() - t < 0.5)
    th.join()
    print("slow", got[0][0], 1.5 <= got[0][1] <= 3.5)
EOF
check "serve image_check answers what image check --json prints" 'grep -qx "result True" "$out"'
check "serve image_check refuses a missing tag (ToolRefused, reason not_found) and a bad reference (InvalidParams)" 'grep -qx "missing not_found True" "$out" && grep -qx "bad bad_reference" "$out"'
check "a check of a silent registry holds up no other call, and ends by its timeout (reason timeout)" 'grep -qx "info True" "$out" && grep -qx "slow timeout True" "$out"'
kill "$servepid" 2>/dev/null
wait "$servepid" 2>/dev/null
servepid=
check "capsule serve --schema lists image_check with ref and timeout" 'c serve --schema | python3 -c "import json, sys; m = json.load(sys.stdin)[\"methods\"][\"image_check\"][\"params\"]; assert m[\"ref\"] == {\"type\": \"string\", \"required\": True} and m[\"timeout\"][\"type\"] == \"number\""'
check "no temporary directory is left in the store" '[ -z "$(ls "$CAPSULE_HOME/images" | grep tmp-)" ]'
elapsed "done"
