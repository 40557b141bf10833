#!/bin/sh
# A local OCI registry for tests and for trying `capsule image pull`:
# Debian's docker-registry on 127.0.0.1, its storage in a temporary
# directory, fed through skopeo. Nothing here reaches another host.
#
#   tests/registry.sh start [PORT]        start on 127.0.0.1:PORT (5000)
#   tests/registry.sh stop [PORT]         stop it and remove its storage
#   tests/registry.sh push-dir DIR REF    push the tree DIR as a one-layer
#                                         linux/amd64 OCI image REF
#   tests/registry.sh push-python REF     push a small image with this
#                                         machine's python3 and busybox
#   tests/registry.sh layout DIR OUT      only write DIR as an OCI layout OUT
#
# e.g.  tests/registry.sh start && tests/registry.sh push-python 127.0.0.1:5000/py:latest
#       capsule image pull 127.0.0.1:5000/py:latest
#
# CAPSULE_REGISTRY_FORMAT=v2s2 makes push-* store a Docker v2 schema 2
# manifest instead of an OCI one (skopeo copy --format v2s2).
# CAPSULE_REGISTRY_CMD='["/bin/sleep", "infinity"]' (a JSON array) is the
# image's Cmd for push-dir and layout (default ["/bin/sh"]).
#
# State lives in ${CAPSULE_REGISTRY_DIR:-/tmp/capsule-registry-PORT}
# (config.yml, storage/, pid, log). push-* print the pushed manifest digest.
set -eu

die() { echo "registry.sh: $*" >&2; exit 1; }
state() { echo "${CAPSULE_REGISTRY_DIR:-/tmp/capsule-registry-$1}"; }

start() {
	port=${1:-5000}
	dir=$(state "$port")
	command -v docker-registry >/dev/null || die "docker-registry is not installed (apt-get install docker-registry)"
	if [ -f "$dir/pid" ] && kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
		echo "registry already running on 127.0.0.1:$port ($dir)"
		return 0
	fi
	mkdir -p "$dir/storage"
	cat >"$dir/config.yml" <<EOF
version: 0.1
log:
  level: warn
storage:
  filesystem:
    rootdirectory: $dir/storage
  delete:
    enabled: true
  maintenance:
    uploadpurging:
      enabled: false
http:
  addr: 127.0.0.1:$port
EOF
	docker-registry serve "$dir/config.yml" >"$dir/log" 2>&1 &
	echo $! >"$dir/pid"
	i=0
	until curl -fsS "http://127.0.0.1:$port/v2/" >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 100 ] || ! kill -0 "$(cat "$dir/pid")" 2>/dev/null; then
			tail -5 "$dir/log" >&2
			die "the registry did not start on 127.0.0.1:$port (log: $dir/log)"
		fi
		sleep 0.1
	done
	echo "registry on 127.0.0.1:$port, storage in $dir/storage"
}

stop() {
	port=${1:-5000}
	dir=$(state "$port")
	if [ -f "$dir/pid" ]; then
		pid=$(cat "$dir/pid")
		kill "$pid" 2>/dev/null || true
		i=0
		while kill -0 "$pid" 2>/dev/null && [ $i -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
		kill -9 "$pid" 2>/dev/null || true
	fi
	rm -rf "$dir"
}

# layout DIR OUT: a one-layer linux/amd64 OCI image layout of the tree
# DIR (owners root, times fixed: the same tree gives the same digests).
layout() {
	[ -d "$1" ] || die "$1 is not a directory"
	python3 - "$1" "$2" "${CAPSULE_REGISTRY_CMD:-[\"/bin/sh\"]}" <<'EOF'
import gzip, hashlib, io, json, os, sys, tarfile
src, out, cmd = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
os.makedirs(out + "/blobs/sha256", exist_ok=True)
def blob(data):
    d = hashlib.sha256(data).hexdigest()
    with open(f"{out}/blobs/sha256/{d}", "wb") as f:
        f.write(data)
    return "sha256:" + d, len(data)
raw = io.BytesIO()
with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as t:
    for top, dirs, files in os.walk(src):
        dirs.sort()
        for name in sorted(dirs) + sorted(files):
            p = os.path.join(top, name)
            info = t.gettarinfo(p, os.path.relpath(p, src))
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            if info.isfile():
                with open(p, "rb") as f:
                    t.addfile(info, f)
            else:
                t.addfile(info)
tar = raw.getvalue()
gz = gzip.compress(tar, mtime=0)
layer, lsize = blob(gz)
config = {"architecture": "amd64", "os": "linux",
          "config": {"Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"], "Cmd": cmd},
          "rootfs": {"type": "layers", "diff_ids": ["sha256:" + hashlib.sha256(tar).hexdigest()]}}
cdig, csize = blob(json.dumps(config, sort_keys=True).encode())
manifest = {"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cdig, "size": csize},
            "layers": [{"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": layer, "size": lsize}]}
mdig, msize = blob(json.dumps(manifest, sort_keys=True).encode())
index = {"schemaVersion": 2, "manifests": [{"mediaType": "application/vnd.oci.image.manifest.v1+json",
         "digest": mdig, "size": msize, "platform": {"architecture": "amd64", "os": "linux"}}]}
with open(out + "/index.json", "w") as f:
    json.dump(index, f)
with open(out + "/oci-layout", "w") as f:
    json.dump({"imageLayoutVersion": "1.0.0"}, f)
EOF
}

# push-dir DIR REF: prints the digest of the manifest the registry holds.
push_dir() {
	[ $# -eq 2 ] || die "usage: push-dir DIR REF"
	tmp=$(mktemp -d /tmp/capsule-push.XXXXXX)
	trap 'rm -rf "$tmp"' EXIT
	layout "$1" "$tmp/layout"
	skopeo copy --quiet --retry-times 0 --dest-tls-verify=false --digestfile "$tmp/digest" \
		${CAPSULE_REGISTRY_FORMAT:+--format "$CAPSULE_REGISTRY_FORMAT"} \
		"oci:$tmp/layout" "docker://$2" >&2
	cat "$tmp/digest"
	echo
	rm -rf "$tmp"
	trap - EXIT
}

# A root with the host's /usr/bin/python3 (Debian's 3.11), the shared
# libraries it and its extension modules need, its standard library
# without tests, IDLE, tkinter and the build configuration, and busybox
# for /bin/sh and the usual commands.
push_python() {
	[ $# -eq 1 ] || die "usage: push-python REF"
	py=/usr/bin/python3
	[ -x "$py" ] || die "$py is not installed"
	ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
	lib=/usr/lib/python$ver
	[ -d "$lib" ] || die "$lib is missing"
	busybox=$(command -v busybox) || die "busybox is not installed (apt-get install busybox-static)"
	root=$(mktemp -d /tmp/capsule-pyroot.XXXXXX)
	mkdir -p "$root/bin" "$root/usr/bin" "$root/usr/lib" "$root/etc" "$root/tmp" "$root/root" \
		"$root/dev" "$root/proc" "$root/sys" "$root/run" "$root/work"
	chmod 1777 "$root/tmp"
	cp "$busybox" "$root/bin/busybox"
	for a in $("$root/bin/busybox" --list); do
		[ -e "$root/bin/$a" ] || ln -s busybox "$root/bin/$a"
	done
	cp -L "$py" "$root/usr/bin/python$ver"
	ln -s "python$ver" "$root/usr/bin/python3"
	(cd /usr/lib && tar -cf - --exclude=__pycache__ --exclude="python$ver/test" \
		--exclude="python$ver/idlelib" --exclude="python$ver/tkinter" \
		--exclude="python$ver/turtledemo" --exclude="python$ver/ensurepip" \
		--exclude="python$ver/lib2to3" --exclude="python$ver/pydoc_data" \
		--exclude="python$ver/config-*" --exclude="python$ver/site-packages" \
		--exclude="python$ver/dist-packages" "python$ver") | tar -xf - -C "$root/usr/lib"
	# Shared libraries: the interpreter's and its extension modules'.
	for f in "$py" "$lib"/lib-dynload/*.so; do
		ldd "$f" 2>/dev/null | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }'
	done | sort -u | while read -r so; do
		mkdir -p "$root$(dirname "$so")"
		cp -L "$so" "$root$so"
	done
	[ -e "$root/lib64" ] || { mkdir -p "$root/lib64"; cp -L /lib64/ld-linux-x86-64.so.2 "$root/lib64/"; }
	printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/work:/bin/sh\n' >"$root/etc/passwd"
	printf 'root:x:0:\nuser:x:1000:\n' >"$root/etc/group"
	push_dir "$root" "$1"
	rm -rf "$root"
}

case "${1:-}" in
start) shift; start "$@" ;;
stop) shift; stop "$@" ;;
push-dir) shift; push_dir "$@" ;;
push-python) shift; push_python "$@" ;;
layout) shift; layout "$@" ;;
*) sed -n '2,/^set -eu/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
