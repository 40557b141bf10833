#!/bin/sh
# gen-proto.sh PROTOC_C OUTDIR TTRPC_PROTO: the shim's protobuf-c code,
# generated from the proto files Debian ships (golang-github-containerd-
# containerd-dev, golang-github-containerd-cgroups-dev, libprotobuf-dev)
# plus src/shim/ttrpc.proto, into OUTDIR under flat names (meson's outputs
# cannot hold a '/'): NAME.pb-c.c and NAME.pb-c.h, their #include lines
# rewritten to match. gogo.proto and fieldpath.proto define only options
# (extensions of descriptor.proto, which protoc-c ignores): their headers
# are not generated and their includes are dropped.
set -eu
protoc=$1 out=$2 ttrpc=$3
go=/usr/share/gocode/src
c=github.com/containerd/containerd
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# flat name, proto path
list="any google/protobuf/any.proto
empty google/protobuf/empty.proto
timestamp google/protobuf/timestamp.proto
mount $c/api/types/mount.proto
types-task $c/api/types/task/task.proto
shim $c/runtime/v2/task/shim.proto
events-task $c/api/events/task.proto
events-ttrpc $c/api/services/ttrpc/events/v1/events.proto
metrics-v2 github.com/containerd/cgroups/v2/stats/metrics.proto
runc-options $c/runtime/v2/runc/options/oci.proto"
for p in $(echo "$list" | cut -d' ' -f2); do
	case $p in
	google/*) [ -f "/usr/include/$p" ] || { echo "gen-proto.sh: /usr/include/$p is missing: install libprotobuf-dev" >&2; exit 1; } ;;
	*) [ -f "$go/$p" ] || { echo "gen-proto.sh: $go/$p is missing: scripts/bootstrap.sh installs golang-github-containerd-containerd-dev" >&2; exit 1; } ;;
	esac
done
# shellcheck disable=SC2046
"$protoc" --c_out="$tmp" -I"$go" -I"$go/github.com/gogo/protobuf" -I/usr/include \
	$(echo "$list" | cut -d' ' -f2)
"$protoc" --c_out="$tmp" -I"$(dirname "$ttrpc")" "$ttrpc"
{
	echo '/gogoproto\/gogo\.pb-c\.h/d'
	echo '/fieldpath\.pb-c\.h/d'
	echo '/google\/protobuf\/descriptor\.pb-c\.h/d'
	echo "$list" | while read -r name p; do echo "s|\"${p%.proto}.pb-c.h\"|\"$name.pb-c.h\"|"; done
} >"$tmp/flat.sed"
echo "$list" | while read -r name p; do
	for ext in c h; do
		sed -f "$tmp/flat.sed" "$tmp/${p%.proto}.pb-c.$ext" >"$out/$name.pb-c.$ext"
	done
done
for ext in c h; do sed -f "$tmp/flat.sed" "$tmp/ttrpc.pb-c.$ext" >"$out/ttrpc.pb-c.$ext"; done
