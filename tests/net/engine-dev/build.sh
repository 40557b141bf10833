#!/bin/sh
# Build the engine's NIC harness against a build directory's libraries:
# tests/net/engine-dev/build.sh BUILDDIR  ->  BUILDDIR/engine-dev
set -eu
top=$(cd "$(dirname "$0")/../../.." && pwd)
b=${1:?usage: build.sh BUILDDIR}
ninja -C "$b" libcapsule.a libcapguestcore.a capsule-agent >/dev/null
cc -std=gnu11 -Wall -Wextra -Werror -O1 -g -DCAPSULE_VERSION='"dev"' \
	-I"$top/src/common" -I"$top/src/proto" -I"$top/src/engine" -I"$top/src/store" -I"$top/src/net" \
	-o "$b/engine-dev" "$top/tests/net/engine-dev/engine-dev.c" \
	-Wl,--start-group "$b/libcapsule.a" "$b/libcapguestcore.a" -Wl,--end-group \
	-ljansson -lcrypto -larchive -lnftables -lmnl
