#!/bin/sh
# Install the Debian packages capsule needs to build, test and run
# (docs/architecture.md, "Dependencies"). Idempotent: apt-get update and
# apt-get install run only when a package is missing.
set -eu

PACKAGES="
  build-essential pkg-config meson ninja-build
  libjansson-dev libarchive-dev libssl-dev libcmocka-dev
  qemu-system-x86 busybox-static cpio gzip e2fsprogs erofs-utils debootstrap
  linux-source-6.1 bc bison flex libelf-dev xz-utils
  python3 procps util-linux tmux zstd
"

missing=""
for p in $PACKAGES; do
	if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
		missing="$missing $p"
	fi
done

if [ -z "$missing" ]; then
	exit 0
fi

echo "bootstrap: installing:$missing"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
	if command -v sudo >/dev/null 2>&1; then
		SUDO="sudo"
	else
		echo "bootstrap: these Debian packages are missing:$missing" >&2
		echo "bootstrap: run this script as root, or install them with apt-get" >&2
		exit 1
	fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -q
# shellcheck disable=SC2086
$SUDO apt-get install -y -q --no-install-recommends $missing
echo "bootstrap: done"
