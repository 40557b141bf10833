#!/bin/sh
# Install the Debian packages capsule needs to build, test and run
# (docs/architecture.md, "Dependencies"). Idempotent: apt-get update and
# apt-get install run only when a package is missing.
set -eu

PACKAGES="
  build-essential pkg-config meson ninja-build
  libjansson-dev libarchive-dev libssl-dev libcmocka-dev
  qemu-system-x86 qemu-utils busybox-static cpio gzip e2fsprogs erofs-utils debootstrap
  linux-source-6.1 bc bison flex libelf-dev xz-utils
  python3 procps util-linux tmux zstd runsc git
  libnftables-dev libmnl-dev iproute2 nftables wget
  skopeo docker-registry curl dpkg-dev fakeroot lintian man-db systemd file
  podman conmon runc containerd
  clang-14 libclang-rt-14-dev llvm-14
  protobuf-c-compiler libprotobuf-c-dev libprotobuf-dev golang-github-containerd-containerd-dev
  containernetworking-plugins python3-grpcio python3-grpc-tools python3-prometheus-client
"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

need_node=""
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
	need_node=" nodejs npm"
fi
SUDO=""
if [ "$(id -u)" -ne 0 ] && [ -n "$missing$need_node" ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo"
	else
		echo "bootstrap: these Debian packages are missing:$missing$need_node" >&2
		echo "bootstrap: run this script as root, or install them with apt-get" >&2
		exit 1
	fi
fi
export DEBIAN_FRONTEND=noninteractive
if [ -n "$missing" ]; then
	echo "bootstrap: installing:$missing"
	$SUDO apt-get update -q
	# shellcheck disable=SC2086
	$SUDO apt-get install -y -q --no-install-recommends $missing
	echo "bootstrap: done"
fi

# The MCP client test drives `capsule mcp` with the official TypeScript SDK
# from the npm registry (a test dependency, pinned in tests/mcp). Node.js
# and npm come from Debian when the machine has none.
if [ -n "$need_node" ]; then
	echo "bootstrap: installing nodejs npm"
	$SUDO apt-get update -q
	$SUDO apt-get install -y -q --no-install-recommends nodejs npm
fi
top=$(cd "$(dirname "$0")/.." && pwd)
if [ ! -f "$top/tests/mcp/node_modules/@modelcontextprotocol/sdk/package.json" ]; then
	echo "bootstrap: npm ci in tests/mcp (the MCP SDK for the client test)"
	(cd "$top/tests/mcp" && npm ci --no-audit --no-fund --loglevel=error)
fi
# The TypeScript client (clients/typescript) is built with tsc and typed
# against @types/node, both dev dependencies pinned in its package-lock.json
# (it has no runtime dependency); its tests use Node's own node:test.
# Installed again when the pinned typescript is not the one installed.
ts_pin=$(cd "$top/clients/typescript" && node -p 'require("./package.json").devDependencies.typescript')
ts_have=$(cd "$top/clients/typescript" && node -p 'require("./node_modules/typescript/package.json").version' 2>/dev/null || true)
if [ "$ts_pin" != "$ts_have" ]; then
	echo "bootstrap: npm ci in clients/typescript (typescript $ts_pin and @types/node, to build the client)"
	(cd "$top/clients/typescript" && npm ci --no-audit --no-fund --loglevel=error)
fi
