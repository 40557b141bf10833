#!/bin/sh
# make bench, row (j): the network under a policy, measured against the
# same client in the host's namespace, in one run. Like the tests, it
# builds its own internet: a namespace holding 203.0.113.10 (and the fake
# HTTPS APIs api.test and plain.test of tests/net/fakenet.py, with their
# DNS) on its lo, and a namespace for capsule whose only link goes there
# (DESIGN §9). Prints "key value baseline" lines for bench/run.sh, and
# "https INTERCEPTED PASSED HOST" (ms).
#   bench-net.sh CAPSULE RUNS
set -eu
capsule=$1
runs=${2:-7}
top=$(cd "$(dirname "$0")/.." && pwd)
py="$top/bench/bench-net.py"
. "$top/scripts/fake-internet.sh"
inet=capbinet-$$
cns=capbns-$$
home=$(mktemp -d /tmp/capsule-bnet.XXXXXX)
now_ns() { date +%s%N; }
median() { sort -n | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

cleanup() {
	ip netns exec "$cns" env CAPSULE_HOME="$home" "$capsule" rm --force bn >/dev/null 2>&1 || true
	ip netns exec "$cns" env CAPSULE_HOME="$home" "$capsule" rm --force bs >/dev/null 2>&1 || true
	if [ -n "${srv2:-}" ]; then kill "$srv2" 2>/dev/null || true; fi
	rm -rf "/etc/netns/$cns"
	if [ -n "${srv:-}" ]; then kill "$srv" 2>/dev/null || true; fi
	fake_internet_down "$inet" "$cns"
	rm -rf "$home"
}
trap cleanup EXIT

fake_internet_up "$inet" "$cns" 203.0.113.10 203.0.113.20 203.0.113.23 203.0.113.53
# `ip netns exec` puts this file over /etc/resolv.conf: the fake DNS.
mkdir -p "/etc/netns/$cns" "$home/certs"
echo "nameserver 203.0.113.53" >"/etc/netns/$cns/resolv.conf"
python3 "$top/tests/net/fakenet.py" certs "$home/certs"
ip netns exec "$inet" python3 "$py" serve 203.0.113.10 &
srv=$!
ip netns exec "$inet" python3 "$py" serve-https "$home" "$home/certs" &
srv2=$!
in_cns() { ip netns exec "$cns" env CAPSULE_HOME="$home" "$@"; }
i=0
until in_cns python3 "$py" connect 203.0.113.10 1 >/dev/null 2>&1; do
	i=$((i + 1)); [ $i -lt 50 ] || { echo "bench-net: the fake internet did not come up" >&2; exit 1; }
	sleep 0.1
done

in_cns "$capsule" image build base >/dev/null 2>&1
in_cns "$capsule" create bn --allow-egress 203.0.113.10 >/dev/null
in_cns "$capsule" start bn
qpid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["qemu_pid"])' "$home/sandboxes/bn/runtime.json")
quid=$(awk '/^Uid:/ { print $2 }' "/proc/$qpid/status")
# The same client, once in the host's namespace, once as QEMU's user in
# QEMU's namespace, where nftables hands it to the policy process.
# The system's python3: QEMU's user cannot read root's (a pyenv shim, say).
as_qemu() { nsenter -t "$qpid" -n setpriv --reuid="$quid" --regid="$quid" --clear-groups /usr/bin/python3 "$@"; }
# Both sides or nothing: a figure without its baseline is no figure.
row() {
	[ -n "$2" ] && [ -n "$3" ] || { echo "bench-net: measuring $1 failed (policy '$2', host '$3')" >&2; exit 1; }
	echo "$1 $2 $3"
}
a=$(as_qemu "$py" connect 203.0.113.10 200)
b=$(in_cns /usr/bin/python3 "$py" connect 203.0.113.10 200)
row connect "$a" "$b"
a=$(as_qemu "$py" fetch 203.0.113.10 "$runs")
b=$(in_cns /usr/bin/python3 "$py" fetch 203.0.113.10 "$runs")
row fetch "$a" "$b"

# From the guest: busybox wget of 10 MB, against the host's busybox wget.
: >"$home/g"; : >"$home/h"
i=0
while [ $i -lt "$runs" ]; do
	t=$(now_ns); in_cns "$capsule" exec bn -- wget -q -O /dev/null http://203.0.113.10/10mb; echo $(( $(now_ns) - t )) >>"$home/g"
	t=$(now_ns); in_cns busybox wget -q -O /dev/null http://203.0.113.10/10mb; echo $(( $(now_ns) - t )) >>"$home/h"
	i=$((i + 1))
done
echo "guest_fetch $(median <"$home/g" | awk '{ print 10e6 / ($1 / 1e9) / 1e6 }') $(median <"$home/h" | awk '{ print 10e6 / ($1 / 1e9) / 1e6 }')"
in_cns "$capsule" rm --force bn >/dev/null

# HTTPS request latency, a new connection each (TLS verified, one request):
# through the proxy to api.test, a secret's host, so intercepted (the
# sandbox's CA answers, the value is put in); through the proxy to
# plain.test, allowed without a secret, so passed through; and from the
# host's namespace straight to api.test. The fake APIs' CA is trusted by
# capsule through CAPSULE_CA_FILE.
BENCH_TOKEN="bench-$(od -An -tx1 -N8 /dev/urandom | tr -d ' \n')" CAPSULE_CA_FILE="$home/certs/ca.pem" \
	in_cns "$capsule" create bs --secret TOKEN=env:BENCH_TOKEN@api.test --allow-egress plain.test:443 >/dev/null
BENCH_TOKEN=unused-here CAPSULE_CA_FILE="$home/certs/ca.pem" in_cns "$capsule" start bs
qpid=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["qemu_pid"])' "$home/sandboxes/bs/runtime.json")
quid=$(awk '/^Uid:/ { print $2 }' "/proc/$qpid/status")
# QEMU's user reads the CAs from a directory it can reach.
pub=$(mktemp -d /tmp/capsule-bnet-ca.XXXXXX)
chmod 755 "$pub"
cp "$home/sandboxes/bs/ca.pem" "$pub/sandbox.pem"
cp "$home/certs/ca.pem" "$pub/test.pem"
chmod 644 "$pub"/*.pem
n=$((runs * 3))
a=$(as_qemu "$py" https api.test "$n" "$pub/sandbox.pem" 127.0.0.1:3128) || a=
b=$(as_qemu "$py" https plain.test "$n" "$pub/test.pem" 127.0.0.1:3128) || b=
h=$(in_cns /usr/bin/python3 "$py" https api.test "$n" "$pub/test.pem") || h=
rm -rf "$pub"
[ -n "$a" ] && [ -n "$b" ] && [ -n "$h" ] || { echo "bench-net: measuring https failed (intercepted '$a', passed '$b', host '$h')" >&2; exit 1; }
echo "https $a $b $h"
in_cns "$capsule" rm --force bs >/dev/null

# New sandbox to first result, with a NIC and without, alternating.
: >"$home/a"; : >"$home/b"
in_cns "$capsule" run -q --allow-egress 203.0.113.10 -- true >/dev/null 2>&1	# its template
i=0
while [ $i -lt "$runs" ]; do
	t=$(now_ns); in_cns "$capsule" run -q --allow-egress 203.0.113.10 -- true >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$home/a"
	t=$(now_ns); in_cns "$capsule" run -q -- true >/dev/null 2>&1; echo $(( $(now_ns) - t )) >>"$home/b"
	i=$((i + 1))
done
echo "start $(median <"$home/a") $(median <"$home/b")"
