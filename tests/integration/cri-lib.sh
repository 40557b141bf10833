# Shared by the CRI suite (tests/integration/test-cri.sh) and its bench
# (bench/bench-cri.sh): a private containerd with its CRI plugin, run in
# a network namespace of its own, where everything the pods' network
# needs lives (CNI's bridge, the pods' veths and addresses, the loopback
# registry the images come from, the CRI streaming server), so nothing
# is added to the host's interfaces. Source after tests/integration/oci-lib.sh,
# with $top set to the source tree.
#
# containerd gets its own root, state, sockets and config.toml, which
# names two runtime handlers (RunPodSandboxRequest.runtime_handler, the
# kubelet's RuntimeClass handler):
#   capsule  runtime_type io.containerd.capsule.v2 (containerd-shim-capsule-v2,
#            found on containerd's PATH: $cri_bin first)
#   runc     runtime_type io.containerd.runc.v2, its state under our root
# The CNI configuration (bridge, host-local IPAM with its leases under our
# directory, portmap; containerd adds loopback) is in a directory of ours,
# its plugins those of containernetworking-plugins in /usr/lib/cni. The
# images are pushed to the registry (tests/registry.sh) from local trees
# and pulled by CRI PullImage: $cri_pause (busybox's sleep, the sandbox
# image) and $cri_busybox (oci-lib.sh's busybox tree).

cri_port=5000	# the registry's, inside the namespace
cri_net=capsule-cri-test	# the CNI network's name
cri_subnet=10.88.0	# .0/24, the pods' addresses (in the namespace only)

# cri_env_start DIR NS BIN: all of the above under DIR, in the new
# network namespace NS; BIN is put first on containerd's PATH (the
# capsule shim). Sets $cri_sock, $cri_netns, $cri_cgroup (the cgroup
# parent the pods go under), $cri_cpid (containerd). On failure, returns
# 1 with what failed in $cri_why.
cri_env_start() {
	cri_dir=$1 cri_ns=$2 cri_bin=$3
	cri_netns=/run/netns/$cri_ns
	cri_sock=$cri_dir/c/sock
	cri_cgroup=/$cri_ns
	cri_pause=127.0.0.1:$cri_port/capsule-test/pause:1
	cri_busybox=127.0.0.1:$cri_port/capsule-test/busybox:1
	cri_cpid=""
	export CRI_SOCKET="$cri_sock" CRI_PYDIR="$cri_dir/py" CRI_STATE="$cri_dir/cri"
	export CAPSULE_REGISTRY_DIR="$cri_dir/registry"
	mkdir -p "$cri_dir/c" "$cri_dir/cni/net.d" "$cri_dir/cni/ipam" || { cri_why="cannot make $cri_dir"; return 1; }
	ip netns add "$cri_ns" 2>"$cri_dir/why" && ip -n "$cri_ns" link set lo up 2>>"$cri_dir/why" ||
		{ cri_why="ip netns add $cri_ns: $(cat "$cri_dir/why")"; return 1; }
	nsenter --net="$cri_netns" "$top/tests/registry.sh" start "$cri_port" >"$cri_dir/why" 2>&1 ||
		{ cri_why="the registry: $(tail -3 "$cri_dir/why")"; return 1; }
	oci_tree "$cri_dir/busybox" || { cri_why="cannot make the busybox tree"; return 1; }
	mkdir -p "$cri_dir/pause/bin" && cp "$(command -v busybox)" "$cri_dir/pause/bin/busybox" &&
		ln -sf busybox "$cri_dir/pause/bin/sleep" || { cri_why="cannot make the pause tree"; return 1; }
	nsenter --net="$cri_netns" "$top/tests/registry.sh" push-dir "$cri_dir/busybox" "$cri_busybox" >"$cri_dir/why" 2>&1 &&
		CAPSULE_REGISTRY_CMD='["/bin/sleep", "infinity"]' \
		nsenter --net="$cri_netns" "$top/tests/registry.sh" push-dir "$cri_dir/pause" "$cri_pause" >"$cri_dir/why" 2>&1 ||
		{ cri_why="push to the registry: $(tail -3 "$cri_dir/why")"; return 1; }
	cat >"$cri_dir/cni/net.d/10-$cri_net.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "$cri_net",
  "plugins": [
    {"type": "bridge", "bridge": "cni-capsule0", "isGateway": true, "ipMasq": false, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "$cri_dir/cni/ipam",
              "ranges": [[{"subnet": "$cri_subnet.0/24"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	# restrict_oom_score_adj: the sandbox's default -998 needs
	# CAP_SYS_RESOURCE, which a CI container may lack (runc then fails
	# "can't get final child's PID from pipe"); clamped to containerd's.
	cat >"$cri_dir/c/config.toml" <<EOF
version = 2
root = "$cri_dir/c/root"
state = "$cri_dir/c/state"
[grpc]
  address = "$cri_sock"
[ttrpc]
  address = "$cri_sock.ttrpc"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$cri_pause"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.capsule]
      runtime_type = "io.containerd.capsule.v2"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$cri_dir/c/runc"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$cri_dir/cni/net.d"
  [plugins."io.containerd.grpc.v1.cri".registry.mirrors."127.0.0.1:$cri_port"]
    endpoint = ["http://127.0.0.1:$cri_port"]
EOF
	PATH="$cri_bin:$PATH" nsenter --net="$cri_netns" containerd --config "$cri_dir/c/config.toml" >"$cri_dir/c/log" 2>&1 &
	cri_cpid=$!
	i=0
	until [ -S "$cri_sock" ] && cri version >/dev/null 2>&1; do
		i=$((i + 1))
		if [ $i -gt 300 ] || ! kill -0 "$cri_cpid" 2>/dev/null; then
			cri_why="containerd did not answer on $cri_sock: $(grep -i 'level=error\|level=fatal' "$cri_dir/c/log" | tail -3)"
			return 1
		fi
		sleep 0.1
	done
}

# cri VERB ARGS...: tests/cri/cri.py in the namespace (the streaming
# server's URLs are on its 127.0.0.1), every call bounded.
cri() {
	timeout "${CRI_CALL_TIMEOUT:-300}" nsenter --net="$cri_netns" /usr/bin/python3 "$top/tests/cri/cri.py" "$@"
}

# cri_shims: the shim processes containerd started (any runtime).
cri_shims() { pgrep -f "containerd-shim-[a-z0-9]*-v2 .*-address $cri_sock( |$)"; }

# cri_env_stop: every pod stopped and removed (as the kubelet would),
# containerd ended, whatever is left killed, unmounted and removed, the
# registry and the namespace gone.
cri_env_stop() {
	[ -n "${cri_dir:-}" ] || return 0
	if [ -n "$cri_cpid" ] && kill -0 "$cri_cpid" 2>/dev/null; then
		for p in $(CRI_CALL_TIMEOUT=30 cri pods -q 2>/dev/null); do
			CRI_CALL_TIMEOUT=60 cri stopp "$p" >/dev/null 2>&1
			CRI_CALL_TIMEOUT=60 cri rmp "$p" >/dev/null 2>&1
		done
		kill "$cri_cpid" 2>/dev/null
		wait "$cri_cpid" 2>/dev/null
	fi
	for p in $(cri_shims); do kill -KILL "$p" 2>/dev/null; done
	oci_unmount "$cri_dir"
	nsenter --net="$cri_netns" "$top/tests/registry.sh" stop "$cri_port" >/dev/null 2>&1
	ip netns del "$cri_ns" 2>/dev/null
	for c in /sys/fs/cgroup/*"$cri_cgroup"; do
		[ -d "$c" ] && find "$c" -depth -type d -exec rmdir {} + 2>/dev/null
	done
	cri_cpid=""
}
