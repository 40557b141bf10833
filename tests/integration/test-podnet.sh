#!/bin/sh
# A pod's network in its VM (docs/oci.md, "The pod's network"): CNI's
# bridge plugin (with host-local IPAM), run as containerd runs it, makes
# two pod namespaces A and B on a bridge that lives in a third namespace
# of the suite's own (no address on the host's interfaces). A capsule-oci
# sandbox container (CRI's container-type "sandbox") in A: the guest has
# A's address, MAC and routes; it reaches a server in B; B reaches a
# server in the guest by the pod's address; 127.0.0.1:PORT inside A
# (what containerd's PortForward dials) reaches the guest's servers on
# 0.0.0.0 and on 127.0.0.1 only; listeners follow the guest's. Refusals:
# a namespace with two interfaces, one with an IPv6 address only, one
# with no address, and a pod without a namespace (hostNetwork). After:
# no QEMU, tap, tc filter, sandbox or state left. TAP output.
#
#   tests/integration/test-podnet.sh build/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
here=$(cd "$(dirname "$0")" && pwd)
. "$here/lib.sh"
. "$here/oci-lib.sh"
oci=$(dirname "$capsule")/capsule-oci
plan=22
suite="pod network suite"
start=$(date +%s)
echo "1..$plan"

[ "$(id -u)" -eq 0 ] || skip_all "needs root (network namespaces, CNI)"
for tool in ip busybox python3 nsenter; do
	command -v "$tool" >/dev/null || fail_all "$tool is not installed"
done
cni=/usr/lib/cni
[ -x "$cni/bridge" ] && [ -x "$cni/host-local" ] && [ -x "$cni/loopback" ] || fail_all "CNI plugins missing in $cni (containernetworking-plugins)"
[ -x "$oci" ] || fail_all "$oci is missing (ninja makes the capsule-oci link)"

tag=cpn$$
nsn=$tag-node	# the bridge's namespace
nsa=$tag-a
nsb=$tag-b
nsx=$tag-x	# for the refusals
net="10.$((200 + $$ % 50)).$(($$ % 250)).0/24"
dstate="$rt/state"
o() { timeout 120 "$oci" --root "$dstate" "$@"; }
in_ns() { ns=$1; shift; ip netns exec "$ns" "$@"; }
podnet_cleanup() {
	o delete --force pod1 >/dev/null 2>&1
	o delete --force bad >/dev/null 2>&1
	[ -n "${bpid:-}" ] && kill "$bpid" 2>/dev/null
	for ns in $nsa $nsb $nsx $nsn; do ip netns del "$ns" 2>/dev/null; done
	oci_unmount "$rt"
	cleanup
}
trap podnet_cleanup EXIT

for ns in $nsn $nsa $nsb $nsx; do
	ip netns add "$ns" || fail_all "ip netns add $ns failed"
done
in_ns "$nsn" ip link set lo up
mkdir -p "$rt/cni"
cat >"$rt/cni/conf.json" <<EOF
{"cniVersion": "0.4.0", "name": "$tag", "type": "bridge", "bridge": "br-$tag",
 "isGateway": true, "ipMasq": false,
 "ipam": {"type": "host-local", "subnet": "$net", "routes": [{"dst": "0.0.0.0/0"}],
          "dataDir": "$rt/cni/ipam"}}
EOF
echo '{"cniVersion": "0.4.0", "name": "cni-loopback", "type": "loopback"}' >"$rt/cni/lo.json"
# cni_add NS: what containerd does for a pod (CNI_COMMAND=ADD), from the
# node's namespace, where the bridge is made: the loopback plugin on lo
# (containerd's CRI always adds it), then the bridge; prints the
# bridge's result.
cni_add() {
	ip netns exec "$nsn" env CNI_COMMAND=ADD CNI_CONTAINERID="$1-$tag" CNI_NETNS="/run/netns/$1" \
		CNI_IFNAME=lo CNI_PATH="$cni" "$cni/loopback" <"$rt/cni/lo.json" >/dev/null &&
	ip netns exec "$nsn" env CNI_COMMAND=ADD CNI_CONTAINERID="$1-$tag" CNI_NETNS="/run/netns/$1" \
		CNI_IFNAME=eth0 CNI_PATH="$cni" "$cni/bridge" <"$rt/cni/conf.json"
}
cni_add "$nsa" >"$rt/cni/a.json" 2>"$err" && cni_add "$nsb" >"$rt/cni/b.json" 2>>"$err"
check "CNI's bridge plugin makes pods A and B on a bridge in a namespace of the suite's own" '[ $? -eq 0 ]'
addr_of() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ips"][0]["address"].split("/")[0])' "$1"; }
ipa=$(addr_of "$rt/cni/a.json" 2>/dev/null)
ipb=$(addr_of "$rt/cni/b.json" 2>/dev/null)
gw=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["ips"][0]["gateway"])' "$rt/cni/a.json" 2>/dev/null)
maca=$(in_ns "$nsa" cat /sys/class/net/eth0/address 2>/dev/null)
mtua=$(in_ns "$nsa" cat /sys/class/net/eth0/mtu 2>/dev/null)
echo "# pod A $ipa ($maca, MTU $mtua), pod B $ipb, gateway $gw"
check "... and no address of the suite's is on the host's own interfaces" \
	'! ip -4 addr show | grep -q "inet ${net%.0/24}\."'

oci_tree "$rt/tree" || fail_all "cannot make the busybox tree"
mkdir -p "$rt/tree/www"
echo "guest-hello" >"$rt/tree/www/index.html"
# pod_bundle DIR NETNS TYPE ARGS: a bundle of CRI's shape: the container
# type annotation, the network namespace path ("" for none at all).
pod_bundle() {
	oci_bundle "$1" "$rt/tree" "" "$4" && python3 - "$1/config.json" "$2" "$3" <<'PY'
import json, sys
f, ns, ctype = sys.argv[1:4]
c = json.load(open(f))
c["annotations"] = {"io.kubernetes.cri.container-type": ctype, "io.kubernetes.cri.sandbox-id": "pod"}
n = [x for x in c["linux"]["namespaces"] if x["type"] != "network"]
if ns:
    n.append({"type": "network", "path": ns})
c["linux"]["namespaces"] = n
json.dump(c, open(f, "w"), indent=1)
PY
}
# The pod: servers on 0.0.0.0:8080 and 127.0.0.1:8081 (busybox httpd).
pod_bundle "$rt/pod1" "/run/netns/$nsa" sandbox \
	'["sh", "-c", "httpd -p 0.0.0.0:8080 -h /www; httpd -p 127.0.0.1:8081 -h /www; exec sleep 1000"]'
o create --bundle "$rt/pod1" --pid-file "$rt/pod1.pid" pod1 </dev/null >"$out" 2>"$err" && o start pod1 2>>"$err"
rc=$?
check "a sandbox container in pod A's namespace is created and started" '[ $rc -eq 0 ]'
[ "$rc" -eq 0 ] || { sed 's/^/# shim.log: /' "$CAPSULE_HOME"/sandboxes/*/shim.log; sed 's/^/# console: /' "$CAPSULE_HOME"/sandboxes/*/console.log | tail -20; } 2>/dev/null
elapsed "the pod's VM"
ox() { o exec pod1 "$@" </dev/null 2>>"$err"; }
ox ip -4 addr show eth0 >"$out"
check "the guest's eth0 has pod A's address" 'grep -q "inet $ipa/24" "$out"'
ox cat /sys/class/net/eth0/address >"$out"
check "... the veth's MAC ($maca)" 'grep -qx "$maca" "$out"'
ox cat /sys/class/net/eth0/mtu >"$out"
check "... its MTU ($mtua)" 'grep -qx "$mtua" "$out"'
ox ip -4 route >"$out"
check "... and the default route via the bridge's gateway ($gw)" 'grep -q "default via $gw dev eth0" "$out"'
ox sh -c 'env; cat /etc/resolv.conf 2>/dev/null' >"$out"
check "... and no proxy variables (a pod's network is not a policy's)" '! grep -qi "proxy=" "$out"'
check "the tap is in pod A's namespace, joined by tc filters both ways" \
	'in_ns "$nsa" ip link show tap0_capsule >/dev/null 2>&1 && in_ns "$nsa" tc filter show dev eth0 ingress | grep -q "mirred" && in_ns "$nsa" tc filter show dev tap0_capsule ingress | grep -q "mirred"'
check "QEMU has no uplink: its namespace holds nothing but lo" \
	'qp=$(pgrep -f "qemu-system.*$CAPSULE_HOME" | head -1) && [ -n "$qp" ] && [ "$(nsenter -t "$qp" -n ip -o link show | grep -vc ": lo:")" -eq 0 ]'

# wget's time limits are timeout's: Debian's busybox 1.35 wget dies of
# SIGSEGV on -T before it connects, which would pass the checks that
# expect no answer.
# B's server, reached from the guest.
mkdir -p "$rt/wwwb"
echo "b-hello" >"$rt/wwwb/index.html"
in_ns "$nsb" busybox httpd -f -p "$ipb:8090" -h "$rt/wwwb" &
bpid=$!
wait_for 'in_ns "$nsb" timeout 2 busybox wget -q -O- "http://$ipb:8090/" 2>/dev/null | grep -q b-hello' 50
ox timeout 10 wget -q -O- "http://$ipb:8090/" >"$out"
check "the guest reaches a server in pod B ($ipb:8090)" 'grep -qx b-hello "$out"'
wait_for 'in_ns "$nsb" timeout 3 busybox wget -q -O- "http://$ipa:8080/" 2>/dev/null | grep -q guest-hello' 30
in_ns "$nsb" timeout 10 busybox wget -q -O- "http://$ipa:8080/" >"$out" 2>"$err"
check "pod B reaches the guest's server by the pod's address ($ipa:8080)" 'grep -qx guest-hello "$out"'
in_ns "$nsb" timeout 5 busybox wget -q -O- "http://$ipa:8081/" >"$out" 2>"$err"
check "... but not its server on 127.0.0.1 only (8081)" '! grep -q guest-hello "$out"'
# PortForward: containerd enters the pod's namespace and dials 127.0.0.1.
wait_for 'in_ns "$nsa" timeout 3 busybox wget -q -O- "http://127.0.0.1:8080/" 2>/dev/null | grep -q guest-hello' 60
in_ns "$nsa" timeout 10 busybox wget -q -O- "http://127.0.0.1:8080/" >"$out" 2>"$err"
check "127.0.0.1:8080 in pod A's namespace reaches the guest's server on 0.0.0.0 (PortForward)" 'grep -qx guest-hello "$out"'
in_ns "$nsa" timeout 10 busybox wget -q -O- "http://127.0.0.1:8081/" >"$out" 2>"$err"
check "127.0.0.1:8081 reaches the guest's server on 127.0.0.1 only" 'grep -qx guest-hello "$out"'
# Bytes both ways and a half-close: nc in the guest echoes what it reads
# back reversed once the host's side has closed its half.
o exec --detach pod1 nc -l -p 9000 -e sh -c 'cat | rev' </dev/null >/dev/null 2>>"$err"
wait_for 'in_ns "$nsa" sh -c "ss -ltn 2>/dev/null || netstat -ltn" | grep -q "127.0.0.1:9000"' 60
printf 'abc\n' | in_ns "$nsa" busybox nc 127.0.0.1 9000 >"$out" 2>"$err"
check "a new guest listener (9000) is forwarded; bytes go both ways past the host's half-close" 'grep -qx cba "$out"'
wait_for '! in_ns "$nsa" sh -c "netstat -ltn" | grep -q "127.0.0.1:9000"' 60
check "... and is no longer listened on in the pod's namespace once the guest's is gone" \
	'! in_ns "$nsa" netstat -ltn | grep -q "127.0.0.1:9000"'

o delete --force pod1 >"$out" 2>"$err"
wait_for '[ "$(ours)" -eq 0 ]' 50
check "after delete: no QEMU, no tap, no tc filter on the veth, no sandbox, no state" \
	'[ "$(pgrep -fc "qemu-system.*$CAPSULE_HOME")" -eq 0 ] && ! in_ns "$nsa" ip link show tap0_capsule >/dev/null 2>&1 && [ -z "$(in_ns "$nsa" tc qdisc show dev eth0 ingress)" ] && [ -z "$(ls "$CAPSULE_HOME/sandboxes" 2>/dev/null)" ] && [ ! -e "$dstate/pod1" ]'

# Refusals, each naming the namespace and what it holds.
refused() { # refused NETNS_PATH WHAT
	pod_bundle "$rt/bad" "$1" sandbox '["true"]' && o create --bundle "$rt/bad" bad </dev/null >"$out" 2>"$err"
	rc=$?
	o delete --force bad >/dev/null 2>&1
	[ "$rc" -ne 0 ] && grep -q "$2" "$err" && [ -z "$(ls "$CAPSULE_HOME/sandboxes" 2>/dev/null)" ]
}
# In the kernel's order (the peer, made first, is listed first): either.
in_ns "$nsx" ip link add v1 type veth peer name v2
check "a namespace with two interfaces is refused, naming it and them" \
	'refused /run/netns/$nsx "/run/netns/$nsx holds v1 (veth), v2 (veth)\\|/run/netns/$nsx holds v2 (veth), v1 (veth)"'
in_ns "$nsx" ip link del v1
in_ns "$nsx" ip link add eth0 type veth peer name peer0 netns "$nsn"
in_ns "$nsx" ip link set eth0 up
in_ns "$nsx" ip -6 addr add fd00:1::2/64 dev eth0 nodad 2>/dev/null
check "one whose veth has an IPv6 address only is refused, naming it" \
	'refused /run/netns/$nsx "eth0 in the network namespace /run/netns/$nsx has 0 IPv4 addresses (IPv6 only)"'
in_ns "$nsx" ip -6 addr flush dev eth0
check "... and one whose veth has no address" \
	'refused /run/netns/$nsx "eth0 in the network namespace /run/netns/$nsx has 0 IPv4 addresses"'
check "a pod without a network namespace (hostNetwork) is refused by name" \
	'refused "" "hostNetwork pods are not supported"'
elapsed "the suite"
