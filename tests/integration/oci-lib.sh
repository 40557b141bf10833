# Helpers shared by the OCI runtime suite (test-oci.sh) and its bench
# (bench/bench-oci.sh): a container image made from a local busybox tree
# (never a registry), a Podman with private storage, and the runtime
# wrapper Podman is given.
#
# Podman runs the runtime through conmon, which passes it a filtered
# environment (no CAPSULE_HOME; not even HOME for start and delete) and
# no --root: the wrapper names the capsule home and a private state root,
# so nothing here touches the machine's /run/capsule-oci or capsule home.

# oci_tree DIR: busybox-static with its applet links, root in /etc/passwd
# and /etc/group, the directories a container root has.
oci_tree() {
	mkdir -p "$1/bin" "$1/etc" "$1/dev" "$1/proc" "$1/sys" "$1/tmp" "$1/run" "$1/root" || return 1
	cp "$(command -v busybox)" "$1/bin/busybox" || return 1
	for a in $("$1/bin/busybox" --list); do
		[ "$a" = busybox ] || ln -sf busybox "$1/bin/$a"
	done
	printf 'root:x:0:0:root:/root:/bin/sh\n' >"$1/etc/passwd"
	printf 'root:x:0:\n' >"$1/etc/group"
}

# oci_podman_init DIR: pm runs podman with its storage, run root, tmp dir
# and events under DIR, the cgroupfs manager (no systemd here).
oci_podman_init() {
	oci_pdir=$1
	mkdir -p "$oci_pdir"
}
pm() {
	podman --root "$oci_pdir/storage" --runroot "$oci_pdir/runroot" \
		--tmpdir "$oci_pdir/tmp" --cgroup-manager cgroupfs \
		--events-backend file "$@"
}
# This host has no CAP_SYS_RESOURCE: Podman's default rlimits (raising
# nofile and nproc to its own maximum) fail in runc; give them explicitly.
oci_run_flags="--network none --ulimit nofile=1024:1024 --ulimit nproc=1024:1024"

# oci_image DIR REF: the busybox tree imported as REF (podman import).
oci_image() {
	oci_tree "$1/tree" && tar -C "$1/tree" -cf "$1/tree.tar" . &&
		pm import -q "$1/tree.tar" "$2" >/dev/null
}

# oci_wrapper PATH RUNTIME STATE_ROOT HOME: a runtime for podman --runtime
# that runs RUNTIME --root STATE_ROOT with CAPSULE_HOME=HOME.
oci_wrapper() {
	cat >"$1" <<EOF || return 1
#!/bin/sh
CAPSULE_HOME='$4'
export CAPSULE_HOME
exec '$2' --root '$3' "\$@"
EOF
	chmod 755 "$1"
}

# oci_unmount DIR: unmount what is left mounted below DIR (a container
# killed mid-run leaves its overlay), deepest first.
oci_unmount() {
	awk -v d="$1/" 'index($2, d) == 1 { print $2 }' /proc/mounts | sort -r |
		while read -r m; do umount -l "$m" 2>/dev/null; done
}

# oci_bundle DIR ROOTFS CGROUPS_PATH ARGS_JSON: a bundle of the runtime's
# own (for calling it without an engine): DIR/config.json running
# ARGS_JSON (a JSON array) as root in ROOTFS, stdio without a terminal,
# a new empty network namespace, cgroupsPath CGROUPS_PATH ("": none).
oci_bundle() {
	mkdir -p "$1" && python3 - "$@" <<'PY'
import json, sys
d, rootfs, cg, args = sys.argv[1:5]
linux = {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]}
if cg:
    linux["cgroupsPath"] = cg
c = {"ociVersion": "1.0.2",
     "process": {"terminal": False, "user": {"uid": 0, "gid": 0}, "args": json.loads(args),
                 "env": ["PATH=/usr/sbin:/usr/bin:/sbin:/bin"], "cwd": "/"},
     "root": {"path": rootfs}, "hostname": "direct",
     "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
     "linux": linux}
json.dump(c, open(d + "/config.json", "w"), indent=1)
PY
}

# containerd_config DIR [DEBUG-LEVEL]: DIR/config.toml for a private
# containerd (its root, state and sockets under DIR; no CRI plugin).
containerd_config() {
	cat >"$1/config.toml" <<EOF
version = 2
root = "$1/root"
state = "$1/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "$1/sock"
[ttrpc]
  address = "$1/sock.ttrpc"
[debug]
  address = "$1/debug.sock"
EOF
	[ -z "${2:-}" ] || echo "  level = \"$2\"" >>"$1/config.toml"
}
