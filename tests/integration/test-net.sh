#!/bin/sh
# Network under a policy (issue 14, docs/network.md), black-box through the
# CLI, against a fake internet this suite builds and checks first (DESIGN
# §9: no packet beyond loopback and the namespaces it creates):
#
#   INET   a network namespace holding the servers of tests/net/fakenet.py
#          on addresses put on its lo: 203.0.113.10 and .11 (allowed),
#          198.51.100.7 (denied), 10.1.2.3 (LAN), 169.254.169.254
#          (metadata), DNS on 203.0.113.53, an upstream CONNECT proxy on
#          203.0.113.99:3128; nftables counters on its input hook count
#          what arrives for the denied addresses, non-DNS UDP, ICMP echo,
#          other protocols, and what comes straight from CAPNS to the
#          allowed servers.
#   CAPNS  where capsule runs: its only link is a veth to INET
#          (192.0.2.1/30 here, 192.0.2.2/30 there) with routes to the test
#          prefixes only, and its resolver is the fake DNS. capsule runs in
#          it through a holder process (CAPNS's network, a mount namespace
#          of its own with /etc/resolv.conf bound over, the host's /sys so
#          the jail keeps its cgroups: `ip netns exec` remounts /sys).
#
# Few VMs: five `capsule run` (each case about run), one named sandbox
# "web" for most cases, one "bare" without network. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tests=$(cd "$(dirname "$0")/.." && pwd)
. "$(dirname "$0")/lib.sh"
# A template's RAM holder outlives its VMs by this long (it is ours too:
# the last check waits for it to end).
export CAPSULE_RAM_HOLDER_IDLE_S=1

plan=74
suite="network suite"
net_suite_start ip nft nsenter unshare setpriv curl wget busybox

inet=capinet-$$
capns=capns-$$
third=capx-$$
vi=cni$$	# INET's end of the veth
vc=cnc$$	# CAPNS's end
logs="$rt/fakenet"
mkdir -p "$logs"
holder=
sandboxes=

teardown() {
	[ -n "$holder" ] && for s in $sandboxes; do cn timeout 30 "$capsule" rm -f "$s" >/dev/null 2>&1; done
	# Everything in our namespaces is ours: the servers, the policy
	# processes, the shims, the holder.
	for ns in "$capns" "$inet" "$third"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	done
	[ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null
	for ns in "$capns" "$inet" "$third"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "/etc/netns/$capns"
}
trap 'teardown; cleanup' EXIT
trap 'exit 130' INT TERM HUP PIPE

in_inet() { ip netns exec "$inet" "$@"; }
# Plain tools in CAPNS, as any process there would run.
in_capns() { ip netns exec "$capns" "$@"; }
# capsule's place: CAPNS's network, the fake resolver, the host's /sys.
cn() { nsenter -t "$holder" -m -n -- "$@"; }
c() { cn "$capsule" "$@"; }
counter() { in_inet nft list counter inet capnet "cnt_$1" 2>/dev/null | sed -n 's/.*packets \([0-9]*\) .*/\1/p'; }
counters() { for k in denied lan meta udp icmp other direct10 direct11; do printf '%s=%s ' "$k" "$(counter $k)"; done; }
zero() { for k in "$@"; do [ "$(counter "$k")" = 0 ] || return 1; done; }
reset_counters() { in_inet nft reset counters table inet capnet >/dev/null; }
lines() { cat "$1" 2>/dev/null | wc -l; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }
# pstate PID: the process's state letter (Z: a zombie), nothing once it is reaped.
pstate() { sed -n 's/^[0-9]* (.*) \([A-Za-z]\) .*/\1/p' "/proc/$1/stat" 2>/dev/null; }

# --- the fake internet -------------------------------------------------------
setup() {
	ip netns add "$inet" && ip netns add "$capns" && ip netns add "$third" || return 1
	ip -n "$inet" link set lo up && ip -n "$capns" link set lo up || return 1
	ip link add "$vc" type veth peer name "$vi" || return 1
	ip link set "$vc" netns "$capns" && ip link set "$vi" netns "$inet" || return 1
	ip -n "$capns" addr add 192.0.2.1/30 dev "$vc" && ip -n "$capns" link set "$vc" up || return 1
	ip -n "$inet" addr add 192.0.2.2/30 dev "$vi" && ip -n "$inet" link set "$vi" up || return 1
	# 203.0.113.98: an address where nothing listens (an upstream proxy down)
	for a in 203.0.113.10 203.0.113.11 203.0.113.53 203.0.113.98 203.0.113.99 198.51.100.7 10.1.2.3 169.254.169.254; do
		ip -n "$inet" addr add "$a/32" dev lo || return 1
	done
	for p in 203.0.113.0/24 198.51.100.0/24 10.1.2.0/24 169.254.169.254/32; do
		ip -n "$capns" route add "$p" via 192.0.2.2 || return 1
	done
	in_inet nft -f - <<EOF || return 1
table inet capnet {
	counter cnt_denied {}
	counter cnt_lan {}
	counter cnt_meta {}
	counter cnt_udp {}
	counter cnt_icmp {}
	counter cnt_other {}
	counter cnt_direct10 {}
	counter cnt_direct11 {}
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr 198.51.100.7 counter name "cnt_denied"
		ip daddr 10.1.2.3 counter name "cnt_lan"
		ip daddr 169.254.169.254 counter name "cnt_meta"
		iifname "$vi" meta l4proto udp udp dport != 53 counter name "cnt_udp"
		iifname "$vi" icmp type echo-request counter name "cnt_icmp"
		iifname "$vi" meta nfproto ipv4 meta l4proto != { tcp, udp, icmp } counter name "cnt_other"
		iifname "$vi" ip daddr 203.0.113.10 counter name "cnt_direct10"
		iifname "$vi" ip daddr 203.0.113.11 counter name "cnt_direct11"
	}
}
EOF
	fakenet_serve "$inet" "$capns" "$logs"
}
if ! setup >"$out" 2>"$err"; then
	not_ok "the fake internet is set up" "ip netns, veth, nftables or the servers failed"
	fail_all "the fake internet could not be set up (see above)"
fi
ok "the fake internet is set up ($inet, $capns)"

: >"$out"
for a in 203.0.113.10 203.0.113.11 198.51.100.7 10.1.2.3 169.254.169.254; do
	in_capns curl -s -m 5 "http://$a/" >>"$out" 2>>"$err"
done
in_capns wget -q -T 5 -O- http://203.0.113.10/x >>"$out" 2>>"$err"
check "fake internet: every HTTP server answers from CAPNS (curl, wget)" \
	'[ "$(cat "$out")" = "$(printf "hello from %s\n" 203.0.113.10 203.0.113.11 198.51.100.7 10.1.2.3 169.254.169.254 203.0.113.10)" ] && grep -q "GET /x host=203.0.113.10 from 192.0.2.1" "$logs/http-203.0.113.10.log"'
in_capns "$py" -c 'import socket; s = socket.create_connection(("203.0.113.10", 443), 5); s.sendall(b"abc"); print(s.recv(100).decode().strip())' >"$out" 2>"$err"
check "fake internet: the recorder on 203.0.113.10:443 counts the bytes it gets" \
	'grep -q "recorded 3 bytes" "$out" && grep -q "from 192.0.2.1 bytes 3 first 616263" "$logs/tls-203.0.113.10.log"'
{
	in_capns "$py" "$fake" resolve 203.0.113.53 allowed.test
	in_capns "$py" "$fake" resolve 203.0.113.53 rebind.test
	in_capns "$py" "$fake" resolve 203.0.113.53 nope.test
	in_capns getent hosts other.test
} >"$out" 2>"$err"
check "fake internet: DNS answers the table, NXDOMAIN otherwise, and is CAPNS's resolver" \
	'[ "$(sed -n 1,3p "$out")" = "$(printf "203.0.113.10\n10.1.2.3\nNXDOMAIN")" ] && sed -n 4p "$out" | grep -q "^203.0.113.11 *other.test"'
in_capns curl -s -m 5 -p -x http://203.0.113.99:3128 http://203.0.113.11/ >"$out" 2>"$err"
check "fake internet: the upstream proxy relays a CONNECT and logs its target" \
	'grep -qx "hello from 203.0.113.11" "$out" && grep -q "^CONNECT 203.0.113.11:80 from 192.0.2.1 -> 200" "$logs/proxy.log"'
in_capns "$py" "$fake" udp 203.0.113.10 9999
in_capns busybox ping -c 1 -W 2 203.0.113.10 >/dev/null 2>&1
before=$(counters)
echo "# counters after the checks above: $before"
reset_counters
echo "# counters after a reset: $(counters)"
counted() { for k in denied lan meta udp icmp direct10 direct11; do echo " $before" | grep -q " $k=[1-9]" || return 1; done; }
check "fake internet: its counters count (denied, LAN, metadata, UDP, ICMP, direct) and reset to 0" \
	'counted && zero denied lan meta udp icmp other direct10 direct11'
{
	ip -n "$capns" route get 8.8.8.8
	ip -n "$inet" route get 8.8.8.8
	in_capns "$py" "$fake" get 203.0.113.200 80 1
	ip netns exec "$third" "$py" "$fake" get 203.0.113.10 80 1
} >"$out" 2>"$err"
check "fake internet: closed (no route beyond it from CAPNS or INET; nothing else answers; a fresh namespace reaches nothing)" \
	'[ "$(grep -c "Network is unreachable" "$err")" -eq 2 ] && grep -q "^cannot get 203.0.113.200:80" "$out" && grep -q "^cannot get 203.0.113.10:80: .*unreachable" "$out" && [ "$(ip -n "$capns" -o link | wc -l)" -eq 2 ] && [ "$(ip -n "$inet" -o link | wc -l)" -eq 2 ]'
cn sh -c 'cat /etc/resolv.conf; ls /sys/fs/cgroup; ip -o link' >"$out" 2>"$err"
check "capsule's place: CAPNS's network, the fake resolver, the host's cgroups" \
	'grep -qx "nameserver 203.0.113.53" "$out" && [ -n "$(ls /sys/fs/cgroup)" ] && [ "$(ls /sys/fs/cgroup | head -1)" = "$(sed -n 2p "$out")" ] && grep -q "$vc" "$out"'
reset_counters

elapsed "the fake internet checked"
# --- capsule run -------------------------------------------------------------
c image build base >"$out" 2>"$err"
check "image build base" 'grep -q "^built base" "$out"'

h10=$(lines "$logs/http-203.0.113.10.log")
c run --allow-egress 203.0.113.10 -- wget -qO- http://203.0.113.10/ >"$out" 2>"$err"
rc=$?
check "run --allow-egress 203.0.113.10 -- wget -qO- http://203.0.113.10/ prints the page (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -qx "hello from 203.0.113.10" "$out"'
check "that request came from CAPNS, through the policy process" \
	'[ "$(tail -n +$((h10 + 1)) "$logs/http-203.0.113.10.log")" = "GET / host=203.0.113.10 from 192.0.2.1" ]'

c run -- sh -c 'timeout 5 wget -Y off -q -O- http://203.0.113.10/; echo "wget=$?"; cat /proc/net/dev; ls /sys/class/net' >"$out" 2>"$err"
check "run without a network flag: wget fails with \"network unreachable\"" \
	'grep -q "^wget=[1-9]" "$out" && grep -qi "network is unreachable\|network unreachable" "$err" && ! grep -q "hello from" "$out"'
check "run without a network flag: the guest has lo only" \
	'grep -q "^ *lo:" "$out" && [ "$(grep -c "^ *[a-z0-9]*:" "$out")" -eq 1 ] && grep -qx lo "$out" && ! grep -q eth0 "$out"'

reset_counters
c run -v --allow-egress 203.0.113.10 -- sh -c \
	't0=$(date +%s); timeout 15 wget -Y off -q -O- http://198.51.100.7/; echo "wget=$? took=$(($(date +%s) - t0))"' >"$out" 2>"$err"
took=$(sed -n 's/.*took=\([0-9]*\).*/\1/p' "$out")
echo "# counters: $(counters)"
check "run: a denied CIDR fails fast (${took:-?} s in the guest), not a hang" \
	'grep -q "^wget=[1-9]" "$out" && [ -n "$took" ] && [ "$took" -lt 10 ]'
check "run: stderr says capsule net: refused tcp 198.51.100.7:80 with the rule" \
	'grep -q "^capsule net: refused tcp 198.51.100.7:80: ." "$err"'
check "run: the fake internet counted 0 packets for 198.51.100.7" 'grep -q "wget=" "$out" && zero denied'
check "run -v prints the policy and the route" \
	'grep -q "network: .*--allow-egress 203.0.113.10" "$err" && grep -qi "direct" "$err"'

# An upstream proxy in capsule's environment: allowed traffic goes through
# it by CONNECT, never straight; one that does not answer is an error.
reset_counters
h10=$(lines "$logs/http-203.0.113.10.log")
p0=$(lines "$logs/proxy.log")
cn env HTTPS_PROXY=http://203.0.113.99:3128 "$capsule" run --allow-egress 203.0.113.10 -- \
	wget -qO- http://203.0.113.10/ >"$out" 2>"$err"
check "upstream proxy: an allowed connection goes through it (its log has CONNECT 203.0.113.10:80)" \
	'grep -qx "hello from 203.0.113.10" "$out" && tail -n +$((p0 + 1)) "$logs/proxy.log" | grep -q "^CONNECT 203.0.113.10:80 from 192.0.2.1 -> 200"'
check "upstream proxy: nothing went to 203.0.113.10 straight from CAPNS" \
	'grep -qx "hello from 203.0.113.10" "$out" && zero direct10 && [ "$(tail -n +$((h10 + 1)) "$logs/http-203.0.113.10.log" | grep -c "from 192.0.2.1$")" -eq 0 ]'
h10=$(lines "$logs/http-203.0.113.10.log")
cn env HTTPS_PROXY=http://203.0.113.98:3128 "$capsule" run --allow-egress 203.0.113.10 -- \
	sh -c 'timeout 20 wget -q -O- http://203.0.113.10/; echo "wget=$?"' >"$out" 2>"$err"
check "upstream proxy unreachable: the connection fails and the host log names the proxy" \
	'grep -q "^wget=[1-9]" "$out" && grep -q "^capsule net: .*203.0.113.98:3128" "$err"'
check "upstream proxy unreachable: no direct fallback (0 packets, no request at 203.0.113.10)" \
	'grep -q "wget=" "$out" && zero direct10 && [ "$(lines "$logs/http-203.0.113.10.log")" -eq "$h10" ]'

elapsed "the runs done"
# --- one named sandbox for most cases ---------------------------------------------
web=web
sandboxes="$web"
wlog="$CAPSULE_HOME/sandboxes/$web/net.log"
# g SCRIPT: run SCRIPT in web's guest, bounded (a hang is a failure, not a stall)
g() { c exec --timeout 60 "$web" -- sh -c "$1" >"$out" 2>"$err"; }
mark() { m=$(lines "$wlog"); }
newlog() { tail -n +$((m + 1)) "$wlog" 2>/dev/null; }
# logged PATTERN: a line since the mark matches, within 3 s.
logged() {
	pat=$1
	wait_for 'newlog | grep -q -- "$pat"' 30 && return 0
	echo "# no line matches \"$pat\"; net.log since the case began:"
	newlog | sed 's/^/#   /'
	return 1
}
rtv() { $py -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$CAPSULE_HOME/sandboxes/$1/runtime.json" "$2" 2>/dev/null; }
reset_counters

c create "$web" --allow-egress 203.0.113.10 --allow-egress allowed.test --allow-egress rebind.test \
	--publish 127.0.0.1:18080:8080 --auto-publish >"$out" 2>"$err" && c start "$web" >>"$out" 2>>"$err"
check "create and start a named sandbox with a policy" '[ -n "$(rtv "$web" qemu_pid)" ] && [ -n "$(rtv "$web" netd_pid)" ]'
npid=$(rtv "$web" netd_pid)
grep "^Seccomp\|^NoNewPrivs" "/proc/$npid/status" 2>/dev/null | tr '\t\n' '  ' | sed 's/^/# policy process: /'; echo
check "the policy process $npid runs under its seccomp filter, with no_new_privs" \
	'grep -q "^Seccomp:[[:space:]]*2$" "/proc/$npid/status" && grep -q "^NoNewPrivs:[[:space:]]*1$" "/proc/$npid/status"'
c inspect "$web" >"$out" 2>"$err"
grep "^network:\|^route:" "$out" | sed 's/^/# inspect: /'
check "inspect shows the network line" \
	'grep -q "^network: .*--allow-egress 203.0.113.10 --allow-egress allowed.test --allow-egress rebind.test" "$out" && grep -q "^network: .*--publish 127.0.0.1:18080:8080" "$out" && grep -q "^network: .*--auto-publish" "$out"'
g 'ip -o -4 addr show eth0; ip route; cat /etc/resolv.conf; cat /etc/hosts; env; ls -ln /etc/resolv.conf /etc/hosts; echo x >>/etc/resolv.conf && echo resolv-writable; echo x >>/etc/hosts && echo hosts-writable'
check "guest: eth0 10.0.2.15/24, default via 10.0.2.2" 'grep -q "eth0 *inet 10.0.2.15/24" "$out" && grep -q "^default via 10.0.2.2" "$out"'
check "guest: DNS 10.0.2.3, host.capsule.internal is 10.0.2.2, both files root's and not writable" \
	'grep -qx "nameserver 10.0.2.3" "$out" && grep -q "^10.0.2.2[[:space:]]*host.capsule.internal" "$out" && [ "$(grep -c "^-.* 0 *0 .* /etc/\(resolv.conf\|hosts\)$" "$out")" -eq 2 ] && ! grep -q writable "$out"'
check "guest: HTTP_PROXY, HTTPS_PROXY and NO_PROXY in commands' environment, at the gateway's port 3128" \
	'grep -q "^HTTP_PROXY=http://\(10.0.2.2\|host.capsule.internal\):3128" "$out" && grep -q "^HTTPS_PROXY=http://\(10.0.2.2\|host.capsule.internal\):3128" "$out" && grep -q "^NO_PROXY=" "$out"'
g 'wget -Y off -qO- http://203.0.113.10/'
check "exec: an allowed address answers" 'grep -qx "hello from 203.0.113.10" "$out"'

mark
t0=$(date +%s%N)
g 'timeout 15 wget -Y off -q -O- http://198.51.100.7/; echo "wget=$?"'
took=$(ms_since "$t0")
check "exec: a denied CIDR fails fast (${took} ms for the whole exec)" 'grep -q "^wget=[1-9]" "$out" && [ "$took" -lt 10000 ]'
check "exec: logged in net.log with the rule, 0 packets counted" \
	'logged "^capsule net: refused tcp 198.51.100.7:80: ." && zero denied'

mark
g 'timeout 15 wget -Y off -q -O- http://10.1.2.3/; echo "wget=$?"'
check "LAN without --allow-lan: 10.1.2.3 refused, 0 packets" 'grep -q "^wget=[1-9]" "$out" && zero lan'
check "... and logged with the rule" 'logged "^capsule net: refused tcp 10.1.2.3:80: ."'

ip netns exec "$capns" "$py" "$fake" http "$logs" 127.0.0.1 18099 "hello from the host" >/dev/null 2>&1 &
hostsrv=$!
wait_for 'in_capns "$py" "$fake" connect 127.0.0.1 18099 >/dev/null' 50
mark
g 'timeout 15 wget -Y off -q -O- http://host.capsule.internal:18099/; echo "wget=$?"; timeout 15 wget -Y off -q -O- http://10.0.2.2:18099/; echo "wget=$?"'
check "host without --allow-host: host.capsule.internal and 10.0.2.2 refused, the host service got nothing" \
	'[ "$(grep -c "^wget=[1-9]" "$out")" -eq 2 ] && [ ! -s "$logs/http-127.0.0.1.log" ]'
check "... and logged with the rule" 'logged "^capsule net: refused tcp .*:18099: ."'

reset_counters
mark
d0=$(lines "$logs/dns.log")
g 'tftp -g -r probe -l /tmp/probe 203.0.113.10 9999 2>&1 & sleep 3; kill $! 2>/dev/null
   nslookup directcheck.test 203.0.113.53 2>&1 | tail -2
   ping -c 1 -W 2 203.0.113.10 2>&1; echo "ping=$?"'
sed 's/^/# guest: /' "$out"
check "non-DNS UDP, DNS to another server and ICMP never leave (UDP, ICMP, other: 0 packets; the DNS server saw nothing)" \
	'grep -q "^ping=" "$out" && ! grep -qx "ping=0" "$out" && zero udp icmp other && ! tail -n +$((d0 + 1)) "$logs/dns.log" | grep -q directcheck'
check "... and the dropped datagrams are logged (tftp to 203.0.113.10:9999, DNS to 203.0.113.53)" \
	'logged "^capsule net: dropped udp 203.0.113.10:9999: ." && logged "^capsule net: dropped udp 203.0.113.53:53: ."'

mark
g 'nslookup other.test 2>&1; echo "nslookup=$?"; timeout 15 wget -Y off -q -O- http://other.test/; echo "wget=$?"'
check "DNS: a name outside the policy is NXDOMAIN and wget by it fails" \
	'grep -q "NXDOMAIN" "$out" && ! grep -q "203.0.113.11" "$out" && grep -q "^wget=[1-9]" "$out" && logged "^capsule net: refused dns other.test: ."'
g 'nslookup allowed.test; wget -Y off -qO- http://allowed.test/'
check "DNS: an allowed name resolves and wget by name works" 'grep -q "203.0.113.10" "$out" && grep -qx "hello from 203.0.113.10" "$out"'
# A fork of it: every child reaches the allowed host through a policy
# process of its own, and is refused the rest.
c fork "$web" --count 2 --prefix fk >"$out" 2>"$err"
rc=$?
sandboxes="$sandboxes fk1 fk2"
h10=$(lines "$logs/http-203.0.113.10.log")
c exec fk1 -- wget -Y off -qO- http://allowed.test/ >"$out" 2>"$err"
c exec fk2 -- wget -Y off -qO- http://203.0.113.10/ >>"$out" 2>>"$err"
check "fork of a sandbox with a policy: each child reaches the allowed host (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ "$(grep -cx "hello from 203.0.113.10" "$out")" -eq 2 ] && [ "$(lines "$logs/http-203.0.113.10.log")" -eq $((h10 + 2)) ]'
check "... each through a policy process of its own" \
	'p0=$(rtv "$web" netd_pid); p1=$(rtv fk1 netd_pid); p2=$(rtv fk2 netd_pid); [ -n "$p1" ] && [ -n "$p2" ] && [ "$p1" != "$p0" ] && [ "$p2" != "$p0" ] && [ "$p1" != "$p2" ]'
c exec fk2 -- sh -c 'timeout 15 wget -Y off -q -O- http://198.51.100.7/; echo "wget=$?"' >"$out" 2>"$err"
check "... refused the rest, in its own net.log, without the parent's published port" \
	'grep -q "^wget=[1-9]" "$out" && grep -q "refused tcp 198.51.100.7:80" "$CAPSULE_HOME/sandboxes/fk2/net.log" && ! c inspect fk2 | grep -q -- "--publish"'
c rm -f fk1 >/dev/null 2>&1
c rm -f fk2 >/dev/null 2>&1
c snapshot rm "$web-fork1" >/dev/null 2>&1

reset_counters
mark
g 'nslookup rebind.test; timeout 15 wget -Y off -q -O- http://rebind.test/; echo "wget=$?"; timeout 15 wget -q -O- http://rebind.test/; echo "wget=$?"'
check "DNS rebinding: rebind.test resolves to 10.1.2.3; connecting to it, direct or by the proxy, is refused, 0 packets" \
	'grep -q "^Address: *10.1.2.3" "$out" && [ "$(grep -c "^wget=[1-9]" "$out")" -eq 2 ] && zero lan'
check "... and both refusals are logged with the rule" \
	'logged "^capsule net: refused tcp 10.1.2.3:80: ." && logged "^capsule net: refused proxy GET rebind.test:80: ."'

g 'http_proxy=http://10.0.2.2:3128 wget -qO- http://203.0.113.10/proxied'
check "proxy: wget through http_proxy=10.0.2.2:3128 to an allowed address works" \
	'grep -qx "hello from 203.0.113.10" "$out" && grep -q "GET /proxied " "$logs/http-203.0.113.10.log"'
reset_counters
mark
g "printf 'GET http://198.51.100.7/ HTTP/1.1\\r\\nHost: 198.51.100.7\\r\\n\\r\\n' | timeout 20 nc 10.0.2.2 3128"
check "proxy: an absolute-form request to a denied host gets 403, logged, 0 packets" \
	'head -1 "$out" | grep -q "^HTTP/1.[01] 403" && logged "refused .*198.51.100.7" && zero denied'
h10=$(lines "$logs/http-203.0.113.10.log")
mark
g "printf 'CONNECT 203.0.113.10:80\\r\\nX: y HTTP/1.1\\r\\n\\r\\n' | timeout 20 nc 10.0.2.2 3128; echo; printf 'CONNECT 203.0.113.10:80\\rX HTTP/1.1\\r\\n\\r\\n' | timeout 20 nc 10.0.2.2 3128"
check "proxy: CONNECT targets with CR/LF are refused with 400 and logged; the target got nothing" \
	'[ "$(grep -c "^HTTP/1.[01] 400" "$out")" -eq 2 ] && logged "^capsule net: refused proxy" && [ "$(lines "$logs/http-203.0.113.10.log")" -eq "$h10" ]'
g "(printf 'CONNECT 203.0.113.10:80 HTTP/1.1\\r\\nHost: 203.0.113.10:80\\r\\n\\r\\n'; sleep 2; printf 'GET /tunnel HTTP/1.0\\r\\nHost: 203.0.113.10\\r\\n\\r\\n') | timeout 20 nc 10.0.2.2 3128"
check "proxy: a CONNECT to an allowed target is tunnelled" \
	'head -1 "$out" | grep -q "^HTTP/1.[01] 200" && grep -q "hello from 203.0.113.10" "$out" && grep -q "GET /tunnel " "$logs/http-203.0.113.10.log"'

t10=$(lines "$logs/tls-203.0.113.10.log")
g "printf '$($py "$fake" clienthello ok.test)' | timeout 20 nc 203.0.113.10 443"
check "TLS: a ClientHello with a clean SNI reaches 203.0.113.10:443 whole (70 bytes)" \
	'grep -q "recorded 70 bytes" "$out" && tail -n +$((t10 + 1)) "$logs/tls-203.0.113.10.log" | grep -q "bytes 70 first 16030100"'
t10=$(lines "$logs/tls-203.0.113.10.log")
mark
g "printf '$($py "$fake" clienthello 'a\r\nb.test')' | timeout 20 nc 203.0.113.10 443; echo nc=\$?"
check "TLS: an SNI with control characters: the server gets nothing, the host log has the refusal" \
	'! grep -q recorded "$out" && [ "$(tail -n +$((t10 + 1)) "$logs/tls-203.0.113.10.log" | grep -vc " bytes 0 ")" -eq 0 ] && logged "^capsule net: refused .*203.0.113.10:443"'

elapsed "the policy cases done"
# --- published ports -----------------------------------------------------------------
c exec "$web" -- sh -c 'mkdir -p /tmp/www && echo "published file" > /tmp/www/file' >/dev/null 2>&1
c exec "$web" -- httpd -f -p 8080 -h /tmp/www >"$rt/httpd8080" 2>&1 &
wait_for 'c exec "$web" -- sh -c "netstat -ltn 2>/dev/null | grep -q :8080"' 100
in_capns wget -q -T 10 -O- http://127.0.0.1:18080/file >"$out" 2>"$err"
check "--publish 127.0.0.1:18080:8080 reaches a guest web server from the host" 'grep -qx "published file" "$out"'

c exec "$web" -- sh -c 'echo $$ > /tmp/h18181; exec httpd -f -p 18181 -h /tmp/www' >"$rt/httpd18181" 2>&1 &
t0=$(date +%s%N)
wait_for 'in_capns wget -q -T 2 -O- http://127.0.0.1:18181/file >"$out" 2>"$err"' 150
took=$(ms_since "$t0")
up18181=$(cat "$out")
check "--auto-publish: a listener started after boot is reachable on the host's 127.0.0.1:18181 (${took} ms)" \
	'grep -qx "published file" "$out"'
c exec "$web" -- sh -c 'echo $$ > /tmp/h18282; exec httpd -f -p 127.0.0.1:18282 -h /tmp/www' >"$rt/httpd18282" 2>&1 &
wait_for 'in_capns wget -q -T 2 -O- http://127.0.0.1:18282/file >"$out" 2>"$err"' 150
up18282=$(cat "$out")
check "--auto-publish: a guest listener on 127.0.0.1 only is mirrored too" 'grep -qx "published file" "$out"'
c exec "$web" -- sh -c 'kill $(cat /tmp/h18181) $(cat /tmp/h18282)' >/dev/null 2>&1
t0=$(date +%s%N)
wait_for '[ -n "$up18181$up18282" ] && ! in_capns "$py" "$fake" connect 127.0.0.1 18181 1 >/dev/null && ! in_capns "$py" "$fake" connect 127.0.0.1 18282 1 >/dev/null' 150
took=$(ms_since "$t0")
check "--auto-publish: when the listeners stop, the host ports close (${took} ms)" \
	'[ -n "$up18181$up18282" ] && ! in_capns "$py" "$fake" connect 127.0.0.1 18181 1 >/dev/null && ! in_capns "$py" "$fake" connect 127.0.0.1 18282 1 >/dev/null'

# --- the log and the jail ------------------------------------------------------------
c net log "$web" >"$out" 2>"$err"
check "net log shows the sandbox's refusals (its net.log)" \
	'grep -q "^capsule net: refused tcp 198.51.100.7:80: " "$out" && grep -q "^capsule net: refused tcp 10.1.2.3:80: " "$out" && grep -q "^capsule net: refused dns other.test: " "$out" && cmp -s "$out" "$wlog"'

qpid=$(rtv "$web" qemu_pid)
quid=$(awk '$1 == "Uid:" { print $2 }' "/proc/$qpid/status" 2>/dev/null)
qgid=$(awk '$1 == "Gid:" { print $2 }' "/proc/$qpid/status" 2>/dev/null)
nsenter -t "$qpid" -n ip -o link >"$out" 2>"$err"
sed 's/^/# QEMU namespace: /' "$out"
check "QEMU's network namespace has lo only" '[ "$(wc -l <"$out")" -eq 1 ] && grep -q "^1: lo:" "$out"'
reset_counters
h11=$(lines "$logs/http-203.0.113.11.log")
as_qemu() { nsenter -t "$qpid" -n setpriv --reuid="$quid" --regid="$qgid" --clear-groups "$py" "$@"; }
{
	as_qemu "$fake" get 203.0.113.11 80 2
	as_qemu "$fake" get 198.51.100.7 80 2
	as_qemu "$fake" udp 203.0.113.10 9999
	nsenter -t "$qpid" -n "$py" "$fake" get 203.0.113.10 80 2
} >"$out" 2>"$err"
sed 's/^/# /' "$out"
check "QEMU's namespace, as its UID $quid: 203.0.113.11 (not in the policy) and 198.51.100.7 unreachable, UDP never leaves; as root there nothing is reachable" \
	'[ -n "$quid" ] && [ "$quid" -ne 0 ] && [ "$(grep -c "^cannot get" "$out")" -eq 3 ] && zero denied udp direct11 direct10 && [ "$(lines "$logs/http-203.0.113.11.log")" -eq "$h11" ]'
# slirp forwards ICMP only through ICMP datagram sockets, which need the
# namespace's ping_group_range to include QEMU's GID (DESIGN §9).
as_qemu -c 'import socket
try:
    socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)
    print("icmp socket opened")
except OSError as e:
    print("icmp socket refused: %s" % e)' >"$out" 2>"$err"
echo "# $(cat "$out"); ping_group_range there: $(nsenter -t "$qpid" -n cat /proc/sys/net/ipv4/ping_group_range)"
check "QEMU's UID cannot open an ICMP socket in its namespace (so slirp forwards no ICMP)" 'grep -q "^icmp socket refused" "$out"'

# --- a policy change on the running sandbox ------------------------------------
mark
g 'timeout 15 wget -Y off -q -O- http://203.0.113.11/; echo "wget=$?"'
check "203.0.113.11 refused under the first policy" 'grep -q "^wget=[1-9]" "$out" && logged "^capsule net: refused tcp 203.0.113.11:80: ."'
c net set "$web" --allow-egress 203.0.113.10 --allow-egress 203.0.113.11 >"$out" 2>"$err"
c net show "$web" >>"$out" 2>>"$err"
check "net set replaces the policy, net show shows it" \
	'grep -q "^network: *--allow-egress 203.0.113.10 --allow-egress 203.0.113.11$" "$out" && ! grep -q "next start" "$out"'
g 'wget -Y off -qO- http://203.0.113.11/'
check "the next connection to 203.0.113.11 works, without a restart (QEMU $qpid)" \
	'grep -qx "hello from 203.0.113.11" "$out" && [ "$(rtv "$web" qemu_pid)" = "$qpid" ]'
c net set "$web" --allow-egress 203.0.113.10 >/dev/null 2>&1
reset_counters
mark
g 'timeout 15 wget -Y off -q -O- http://203.0.113.11/; echo "wget=$?"'
check "set back: 203.0.113.11 refused again, 0 packets" 'grep -q "^wget=[1-9]" "$out" && zero direct11'
check "... and logged with the rule" 'logged "^capsule net: refused tcp 203.0.113.11:80: ."'

c net set "$web" --allow-lan >/dev/null 2>&1
g 'wget -Y off -qO- http://10.1.2.3/'
check "--allow-lan reaches 10.1.2.3" 'grep -qx "hello from 10.1.2.3" "$out"'
c net set "$web" --allow-host >/dev/null 2>&1
g 'wget -Y off -qO- http://host.capsule.internal:18099/; wget -Y off -qO- http://10.0.2.2:18099/'
check "--allow-host reaches the host's 127.0.0.1:18099 as host.capsule.internal and 10.0.2.2" \
	'[ "$(grep -cx "hello from the host" "$out")" -eq 2 ]'
reset_counters
c net set "$web" --allow-egress 0.0.0.0/0 --allow-egress meta.test >/dev/null 2>&1
mark
g 'wget -Y off -qO- http://203.0.113.11/
   timeout 15 wget -Y off -q -O- http://169.254.169.254/latest/meta-data/; echo "wget=$?"
   timeout 15 wget -q -O- http://169.254.169.254/latest/meta-data/; echo "wget=$?"
   timeout 15 wget -Y off -q -O- http://meta.test/; echo "wget=$?"'
check "metadata refused under --allow-egress 0.0.0.0/0 (which opens 203.0.113.11) and by name: direct, by the proxy, as meta.test; 0 packets" \
	'grep -qx "hello from 203.0.113.11" "$out" && [ "$(grep -c "^wget=[1-9]" "$out")" -eq 3 ] && zero meta'
check "... and logged with the rule" 'logged "^capsule net: refused tcp 169.254.169.254:80: ." && logged "^capsule net: refused proxy GET 169.254.169.254:80: ."'
c net set "$web" --allow-egress 169.254.169.254 >/dev/null 2>&1
g 'wget -Y off -qO- http://169.254.169.254/latest/meta-data/'
check "metadata reached under --allow-egress 169.254.169.254" 'grep -qx "hello from 169.254.169.254" "$out"'

# --- the policy process killed -----------------------------------------------------
c net set "$web" --allow-egress 203.0.113.10 >/dev/null 2>&1
g 'wget -Y off -qO- http://203.0.113.10/'
check "before the kill: 203.0.113.10 answers" 'grep -qx "hello from 203.0.113.10" "$out"'
npid=$(rtv "$web" netd_pid)
reset_counters
h10=$(lines "$logs/http-203.0.113.10.log")
[ -n "$npid" ] && kill -KILL "$npid"
t0=$(date +%s%N)
g 'timeout 15 wget -Y off -q -O- http://203.0.113.10/; echo "wget=$?"; timeout 15 wget -q -O- http://203.0.113.10/; echo "wget=$?"'
took=$(ms_since "$t0")
check "policy process $npid killed: the next connections (direct and by the proxy) fail (${took} ms), no packet reaches the fake internet another way" \
	'[ -n "$npid" ] && [ "$(grep -c "^wget=[1-9]" "$out")" -eq 2 ] && zero direct10 udp icmp other && [ "$(lines "$logs/http-203.0.113.10.log")" -eq "$h10" ]'
wait_for '[ -z "$(pstate "$npid")" ] && [ -n "$(rtv "$web" network_error)" ]' 50
echo "# policy process $npid after the kill: state '$(pstate "$npid")' (empty: reaped)"
check "... it is reaped within 5 s (no zombie), and runtime.json says the network is gone" \
	'[ -n "$npid" ] && [ -z "$(pstate "$npid")" ] && [ -n "$(rtv "$web" network_error)" ]'
c rm -f "$web" >/dev/null 2>&1

elapsed "web done"
# --- a named sandbox without flags -----------------------------------------------
sandboxes="$sandboxes bare"
c create bare >"$out" 2>"$err" && c exec bare -- sh -c 'cat /proc/net/dev; ls /sys/class/net' >"$out" 2>>"$err"
check "a named sandbox without flags: the guest has lo only" \
	'grep -q "^ *lo:" "$out" && [ "$(grep -c "^ *[a-z0-9]*:" "$out")" -eq 1 ] && ! grep -q eth0 "$out"'
check "... no policy process in runtime.json" \
	'[ -n "$(rtv bare qemu_pid)" ] && $py -c "import json, sys; sys.exit(\"netd_pid\" in json.load(open(sys.argv[1])))" "$CAPSULE_HOME/sandboxes/bare/runtime.json"'
c inspect bare >"$out" 2>"$err"
check "... and inspect says there is no network" 'grep -q "^network: *none" "$out"'
c rm -f bare >/dev/null 2>&1
sandboxes=

kill "$hostsrv" 2>/dev/null
wait "$hostsrv" 2>/dev/null
wait_for '! ip netns pids "$capns" | xargs -r ps -o args= -p | grep -q "ram-holder"' 100
for p in $(ip netns pids "$capns"); do
	[ "$p" = "$holder" ] || echo "# left in CAPNS: $(ps -o pid=,args= -p "$p")"
done
check "nothing of ours is left running: no QEMU, nothing in CAPNS but the holder" \
	'[ "$(ours)" -eq 0 ] && [ "$(ip netns pids "$capns" | grep -vx "$holder" | wc -l)" -eq 0 ]'
elapsed "all done"
[ "$n" -eq "$plan" ] || echo "# plan says $plan, ran $n"
