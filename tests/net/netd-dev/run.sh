#!/bin/bash
# The policy process's development harness (not run by make test): three
# namespaces mirroring the engine's layout, a fake internet, and checks.
#   h2inet  the fake internet: test addresses on lo, servers (servers.py)
#   h2cap   where capsule runs: a veth to h2inet only; the driver runs here
#   h2jail  QEMU's namespace: lo, "local 0.0.0.0/0 dev lo", nftables
#           redirecting TCP of UID 12345 to the policy listener
# Run as root from anywhere: tests/net/netd-dev/run.sh [BUILDDIR]
# (NETD_DEV_WRAP="strace -f -o FILE" runs the driver under a wrapper.)
set -u
set -o pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../../.." && pwd)
build=${1:-$root/build-h2}
tmp=$(mktemp -d /tmp/netd-dev.XXXXXX)
chmod 755 "$tmp"
I=h2inet C=h2cap J=h2jail
LPORT=15001
PY=/usr/bin/python3
fails=0
netd_pid= servers_pid= extra_pids=()

cleanup() {
	stop_netd
	for p in $servers_pid "${extra_pids[@]}"; do kill "$p" 2>/dev/null; done
	wait 2>/dev/null
	for n in $I $C $J; do ip netns del $n 2>/dev/null; done
	rm -rf "$tmp"
}
trap cleanup EXIT

if [ -n "${NETD_DEV_ASAN:-}" ]; then	# the sources, under ASan and UBSan
	cc -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -O1 -fsanitize=address,undefined \
		-fno-sanitize-recover=all -I"$root/src/common" -I"$root/src/net" "$here/driver.c" \
		"$root"/src/net/{policy,dns,sniff,nflog,netd,netd-conn,netd-proxy,netd-dns,netd-tls,rewrite}.c \
		"$root"/src/common/{util,err,buf}.c -lssl -lcrypto -o "$tmp/driver" || exit 1
else
	ninja -C "$build" libcapsule.a libcapguestcore.a > /dev/null || exit 1
	cc -std=gnu11 -D_GNU_SOURCE -Wall -Wextra -Werror -g -I"$root/src/common" -I"$root/src/net" \
		"$here/driver.c" "$build/libcapsule.a" "$build/libcapguestcore.a" -lssl -lcrypto -o "$tmp/driver" || exit 1
fi
cp "$here/client.py" "$here/servers.py" "$tmp/"
echo "nameserver 192.0.2.53" > "$tmp/resolv.conf"
chmod 644 "$tmp"/*.py "$tmp/resolv.conf"

for n in $I $C $J; do ip netns add $n; ip -n $n link set lo up; done
for a in 203.0.113.10 203.0.113.11 198.51.100.7 10.1.2.3 169.254.169.254 192.0.2.53 192.0.2.80 192.0.2.81; do
	ip -n $I addr add $a/32 dev lo
done
ip -n $I link add h2vi type veth peer name h2vc netns $C
ip -n $I addr add 172.31.255.1/30 dev h2vi
ip -n $C addr add 172.31.255.2/30 dev h2vc
ip -n $I link set h2vi up
ip -n $C link set h2vc up
for r in 203.0.113.0/24 198.51.100.0/24 10.1.2.0/24 169.254.169.254/32 192.0.2.0/24; do
	ip -n $C route add $r via 172.31.255.1
done
ip -n $J route add local 0.0.0.0/0 dev lo
ip netns exec $J nft -f - <<EOF
table inet t {
	chain o {
		type nat hook output priority -100;
		meta skuid 12345 meta l4proto tcp redirect to :$LPORT
	}
}
EOF

ip netns exec $I $PY "$tmp/servers.py" "$tmp" > "$tmp/servers.out" 2>&1 &
servers_pid=$!
# The host's loopback service (for --allow-host) and the guest's web server
# behind QEMU's forward (127.0.0.2 in the jail, for publish).
ip netns exec $C $PY -m http.server --bind 127.0.0.1 8099 --directory "$tmp" > /dev/null 2>&1 &
extra_pids+=($!)
ip netns exec $J $PY -m http.server --bind 127.0.0.2 8080 --directory "$here" > /dev/null 2>&1 &
extra_pids+=($!)
for _ in $(seq 50); do grep -q ready "$tmp/servers.out" 2>/dev/null && break; sleep 0.1; done

start_netd() {
	: > "$tmp/netd.log"
	rm -f "$tmp/ctl"
	mkfifo "$tmp/ctl"
	ip netns exec $C ${NETD_DEV_WRAP:-} "$tmp/driver" --jail /run/netns/$J --port $LPORT --uid 65534 \
		--resolv "$tmp/resolv.conf" --verbose "$@" < "$tmp/ctl" 2> "$tmp/netd.log" &
	netd_pid=$!
	exec 3> "$tmp/ctl"
	sleep 0.3
}

stop_netd() {
	[ -n "$netd_pid" ] || return 0
	exec 3>&-
	wait "$netd_pid"
	local rc=$?
	netd_pid=
	cat "$tmp/netd.log" >> "$tmp/all.log"
	return $rc
}

guest() {
	ip netns exec $J setpriv --reuid 12345 --regid 12345 --clear-groups $PY "$tmp/client.py" "$@" 2>&1
}

check() {	# NAME WANT COMMAND...: WANT is a substring of the output
	local name=$1 want=$2 out
	shift 2
	out=$("$@" 2>&1)
	if [[ "$out" == *"$want"* ]]; then
		echo "ok   $name"
	else
		echo "FAIL $name: got [$out], want [$want]"
		fails=$((fails + 1))
	fi
}

check_not() {
	local name=$1 bad=$2 out
	shift 2
	out=$("$@" 2>&1)
	if [[ "$out" != *"$bad"* ]]; then
		echo "ok   $name"
	else
		echo "FAIL $name: got [$out], must not hold [$bad]"
		fails=$((fails + 1))
	fi
}

log_has() {
	check "log: $1" "$1" cat "$tmp/netd.log"
}

echo "== direct, DNS, proxy"
start_netd allow-egress=203.0.113.10 allow-egress=allowed.test allow-egress=*.allowed.test \
	allow-egress=rebind.test allow-egress=two.test:80
check "allowed address" "server=203.0.113.10:80" guest http 203.0.113.10 80
check "denied address" "ERR" guest http 198.51.100.7 80
log_has "capsule net: refused tcp 198.51.100.7:80: no rule allows 198.51.100.7:80"
check "LAN denied" "ERR" guest http 10.1.2.3 80
check "metadata denied" "ERR" guest http 169.254.169.254 80
check "host denied" "ERR" guest http 127.0.0.1 8099
check "dns allowed" "rcode=0 addrs=203.0.113.10" guest dns allowed.test
check "dns answer keeps the guest's id" "id=0x4242" guest dns allowed.test
check "dns through a CNAME" "rcode=0 addrs=203.0.113.10" guest dns www.allowed.test
check "dns outside the policy" "rcode=3" guest dns evil.test
log_has "capsule net: refused dns evil.test:"
check "dns over tcp, pipelined" "rcode=0 addrs=203.0.113.10
id=0x4242 rcode=3 addrs=
id=0x4242 rcode=0 addrs=10.1.2.3" guest dnstcp allowed.test evil.test rebind.test
check "dns upstream NXDOMAIN" "rcode=3" guest dns nothing.allowed.test
# Queries are rebuilt from the parsed question, never forwarded verbatim.
check "dns question compressed into the header: FORMERR" "rcode=1" guest dnsodd compressed x
log_has "its question's name uses compression"
check "dns query with an answer record: FORMERR" "rcode=1" guest dnsodd ancount allowed.test
log_has "refused dns \"allowed.test\": it carries answer or authority records"
check "dns query with EDNS: answered" "rcode=0 q=allowed.test" guest dnsodd edns allowed.test
check "the resolver got a fresh query (no OPT)" "query allowed.test 1 ar=0" tail -1 "$tmp/dns.log"
check "dns answer echoes the guest's question" "id=0x4242 rcode=0 q=AlLoWeD.test" guest dnsodd case AlLoWeD.test
# A message netd does not answer ends its TCP connection (no slot leak).
check "dns over tcp, a reply sent as a query: closed" "closed=20/20" guest dnstcpqr 20
check "dns of a rebinding name" "addrs=10.1.2.3" guest dns rebind.test
check "rebinding name's LAN address refused" "ERR" guest http 10.1.2.3 80
check "dns two addresses" "addrs=198.51.100.7,203.0.113.10" guest dns two.test
check "an address known by name (two.test:80)" "server=198.51.100.7:80" guest http 198.51.100.7 80
log_has "allowed tcp 198.51.100.7:80 (two.test) by"
check "connect by address" "200 Connection established | echo:hi" guest connect 203.0.113.10:443
check "connect by name" "200 Connection established | echo:hi" guest connect allowed.test:443
check "connect CR LF" "400 Bad Request" guest connect 'a\r\nb:80'
log_has 'capsule net: refused proxy CONNECT "a\r\nb:80": control character in the target'
check "connect space" "400" guest connect 'a b:80'
check "connect bad port" "400" guest connect 'allowed.test:99999'
check "connect name outside the policy" "403 Forbidden" guest connect denied.test:443
check "connect name to a LAN address" "403 Forbidden" guest connect rebind.test:80
check "connect unknown allowed name" "502" guest connect nothing.allowed.test:443
check "connect name, first address refused, second taken" "echo:hi" guest connect two.test:443
check "absolute-form GET" "200 OK | server=203.0.113.10:80 path=/x?y=1 host=allowed.test connection=close" \
	guest get 'http://allowed.test/x?y=1'
check_not "hop-by-hop fields removed" "Proxy-Connection" guest get http://allowed.test/
check_not "fields named by Connection removed" "X-Drop" guest get http://allowed.test/
check "other fields kept" "X-Keep" guest get http://allowed.test/
check "GET https URL refused" "400" guest get https://allowed.test/
check "TLS with a good SNI" "forwarded" guest tls 203.0.113.10 443 ok.example
check "TLS with CR LF in the SNI" "dropped" guest tls 203.0.113.10 443 'a\r\nb.example'
log_has 'TLS server name "a\r\nb.example" has control characters or whitespace'
check "TLS with a space in the SNI" "dropped" guest tls 203.0.113.10 443 'a b'
check_not "nothing of a bad hello reached the server" "a\\\\r\\\\nb" cat "$tmp/echo.log"
# A guest's loop of refused queries does not flood the host's disk.
check "a loop of 3000 refused queries, all answered" "answered=3000/3000" guest flood 3000 evil.test
sleep 1.5
n=$(grep -c "refused dns evil.test" "$tmp/netd.log")
check "refusal lines are rate limited" "limited" bash -c "[ $n -le 250 ] && echo limited || echo 'unlimited: $n lines'"
log_has "more lines suppressed (rate limit)"

echo "== policy change, host, publish"
echo "policy allow-egress=198.51.100.7 allow-host" >&3
sleep 0.3
check "newly allowed address" "server=198.51.100.7:80" guest http 198.51.100.7 80
check "formerly allowed address refused" "ERR" guest http 203.0.113.10 80
check "dns now refused" "rcode=3" guest dns allowed.test
check "host allowed" "Directory listing" guest http 127.0.0.1 8099 /
check "gateway through the proxy" "200" guest connect 10.0.2.2:8099
echo "policy bogus-flag" >&3
sleep 0.2
log_has "control: policy not changed"
# Auto-publish of a port the policy process cannot bind says what to do.
echo "publish 127.0.0.1 80 80" >&3
echo "publish 127.0.0.1 8099 8099" >&3
sleep 0.3
log_has "guest port 80 is not mirrored: the host's 127.0.0.1:80 cannot be bound by the policy process (Permission denied); publish it explicitly with --publish 8080:80"
log_has "guest port 8099 is not mirrored: the host's 127.0.0.1:8099 is taken on the host; publish it explicitly on a free port, e.g. --publish 18099:8099"
echo "publish 127.0.0.1 18080 8080" >&3
sleep 0.3
check "published port reaches the guest" "driver.c" ip netns exec $C curl -s --max-time 5 http://127.0.0.1:18080/
echo "unpublish 18080" >&3
sleep 0.3
check "unpublished port closed" "000" ip netns exec $C curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:18080/
echo "publish 127.0.0.1 18081 9" >&3
sleep 0.3
check "published port without a guest server" "000" ip netns exec $C curl -s -o /dev/null -w '%{http_code}' --max-time 5 http://127.0.0.1:18081/
log_has "cannot reach guest port 9: Connection refused"
echo "policy" >&3
sleep 0.3
check "empty policy refuses" "ERR" guest http 198.51.100.7 80
stop_netd
check "exit 0 on control EOF" "exit 0" cat "$tmp/netd.log"

echo "== upstream proxy"
: > "$tmp/proxy.log"
HTTPS_PROXY=http://192.0.2.80:3128 NO_PROXY="localhost, .example-cdn.test,203.0.113.11" \
	start_netd allow-egress=203.0.113.0/24 allow-egress=allowed.test allow-egress=www.allowed.test
check "via upstream by address" "server=203.0.113.10:80" guest http 203.0.113.10 80
check "upstream got CONNECT address" "CONNECT 203.0.113.10:80 HTTP/1.1" cat "$tmp/proxy.log"
log_has "via upstream proxy 192.0.2.80:3128"
check "no_proxy address goes direct" "server=203.0.113.11:80" guest http 203.0.113.11 80
check_not "upstream did not see it" "203.0.113.11" cat "$tmp/proxy.log"
check "proxy CONNECT by name via upstream" "echo:hi" guest connect allowed.test:443
# The address netd checked, never the name (the proxy would resolve it
# again: DNS rebinding behind it); the name only in Host.
check "upstream got CONNECT to the checked address" "CONNECT 203.0.113.10:443 HTTP/1.1 [Host: allowed.test:443]" cat "$tmp/proxy.log"
check_not "upstream never got CONNECT by name" "CONNECT allowed.test" cat "$tmp/proxy.log"
guest dns allowed.test > /dev/null
check "direct connection known by name, via upstream" "server=203.0.113.10" guest http 203.0.113.10 80
check "upstream got the address, the name in Host" "CONNECT 203.0.113.10:80 HTTP/1.1 [Host: allowed.test:80]" cat "$tmp/proxy.log"
stop_netd

HTTPS_PROXY=http://192.0.2.81:3128 start_netd allow-egress=203.0.113.0/24
check "unreachable upstream: fails" "ERR" guest http 203.0.113.10 80
log_has "upstream proxy 192.0.2.81:3128 unreachable"
check "unreachable upstream: proxy request 502" "502" guest connect 203.0.113.10:443
stop_netd

HTTPS_PROXY=socks5://192.0.2.80:1080 start_netd allow-egress=203.0.113.0/24
log_has "only http:// proxies are supported"
check "bad scheme: fails closed" "ERR" guest http 203.0.113.10 80
stop_netd

echo "== allow-public, volume, DNS timeouts"
start_netd allow-public
check "10 MB download" "len=10485760 sha-ok" guest big 203.0.113.10
check "5 MB upload, half-close carried" "got 5000000" guest upload 203.0.113.10 9000 5000000
check "200 connections at once" "ok=200/200" guest many 203.0.113.10 200
check "public allowed" "server=203.0.113.10:80" guest http 203.0.113.10 80
check "LAN still refused" "ERR" guest http 10.1.2.3 80
check "dns under allow-public" "rcode=0" guest dns other.test
check "dns timeout is SERVFAIL" "rcode=2" guest dns slow.test
log_has "no answer from the resolver"
stop_netd
check_not "no sanitizer report" "Sanitizer" cat "$tmp/all.log"
check_not "no sanitizer report (UB)" "runtime error" cat "$tmp/all.log"

echo
if [ $fails -eq 0 ]; then echo "all checks passed"; else echo "$fails checks FAILED"; fi
[ $fails -eq 0 ]
