#!/bin/bash
# Drive engine-dev (build.sh first) and check a NIC under a policy from
# both sides: the guest's connections, DNS, ICMP and UDP; QEMU's namespace
# from the host (nsenter, as QEMU's UID); the policy process's
# confinement; forwards and deny updates on the running VM; teardown.
# Usage: check.sh BUILDDIR   (as root; CAPSULE_AGENT defaults to BUILDDIR's)
set -u
b=$(cd "${1:?usage: check.sh BUILDDIR}" && pwd)
export CAPSULE_AGENT=${CAPSULE_AGENT:-$b/capsule-agent}
# As the shim runs: what the jail makes must not depend on our umask.
umask 077
log=$(mktemp /tmp/engine-dev-log.XXXXXX)
fails=0 n=0
ok() { n=$((n + 1)); if eval "$2"; then echo "ok $n - $1"; else echo "not ok $n - $1"; echo "$ans" | sed "s/^/#   got: /"; fails=$((fails + 1)); fi; }
coproc DEV { exec "$b/engine-dev" "$log" 2>&1; }
dev=$DEV_PID
# send CMD: print the answer up to OK/ERR into $ans
send() {
	echo "$1" >&"${DEV[1]}"
	ans=
	while IFS= read -r -t 120 l <&"${DEV[0]}"; do
		case $l in OK) return 0 ;; ERR*) ans="$ans$l"; return 1 ;; esac
		ans="$ans$l
"
	done
	return 1
}
read -r -t 300 ready <&"${DEV[0]}"
echo "# $ready"
qemu=$(echo "$ready" | sed -n 's/.*qemu=\([0-9]*\).*/\1/p')
pol=$(echo "$ready" | sed -n 's/.*policy=\([0-9]*\).*/\1/p')
[ -n "$qemu" ] && [ -n "$pol" ] || { echo "Bail out! $ready"; exit 1; }
quid=$(awk '$1 == "Uid:" { print $2 }' /proc/$qemu/status)
puid=$(awk '$1 == "Uid:" { print $2 }' /proc/$pol/status)

# --- the guest's side ---
send "guest nc -w 10 203.0.113.10 80 </dev/null 2>&1"
ok "a public address reaches the policy process, with its original destination" '[[ $ans == *"policy saw 203.0.113.10:80"* ]]'
send "guest nc -w 10 10.0.2.2 3128 </dev/null 2>&1"
ok "the proxy at the gateway reaches the policy process although the host is denied" '[[ $ans == *"policy saw 127.0.0.1:3128"* ]]'
send "guest nc -w 10 10.0.2.3 53 </dev/null 2>&1"
ok "DNS over TCP (slirp sends it to 127.0.0.1:53) reaches the policy process although the host is denied" '[[ $ans == *"policy saw 127.0.0.1:53"* ]]'
send "guest nc -w 10 198.51.100.7 80 </dev/null 2>&1"
ok "a denied range is refused at once (reset)" '[[ $ans == *"refused"* ]]'
send "guest nc -w 10 10.0.2.2 80 </dev/null 2>&1"
ok "the host (denied here) is refused" '[[ $ans == *"refused"* ]]'
send "guest nc -w 10 169.254.169.254 80 </dev/null 2>&1"
ok "metadata (denied here) is refused" '[[ $ans == *"refused"* ]]'
send "guest nslookup example.com 2>&1; true"
ok "DNS queries reach the policy's socket" 'sleep 0.5; grep -q "^dns example.com" "$log"'
send "guest ping -c 1 -W 2 203.0.113.10 2>&1; echo rc=\$?"
ok "ICMP goes nowhere" '[[ $ans == *"rc=1"* ]]'
# (busybox's nc has no -u: nslookup sends the UDP)
send "guest nslookup -port=9999 -timeout=1 -retry=1 example.com 203.0.113.10 2>&1; echo rc=\$?"
ok "other UDP reaches no policy socket" '! grep -q "^dns.*9999\|^tcp.*9999" "$log"'
sleep 0.5
grep "^nflog" "$log" | sed 's/^/#   /'
ok "the guest's connection to a denied range is logged to the policy process (NFLOG)" 'grep -q "^nflog capsule reset proto 6 .* > 198.51.100.7:80 " "$log"'
ok "so is its UDP to a port other than DNS" 'grep -q "^nflog capsule drop proto 17 .* > 203.0.113.10:9999 " "$log"'
ok "NFLOG messages are parsed whole" '! grep -q "^nflog: " "$log"'

# --- QEMU's namespace from the host ---
ifaces=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' "/proc/$qemu/net/dev" | tr '\n' ' ')
ok "QEMU's namespace has loopback only ($ifaces)" '[ "$ifaces" = "lo " ]'
rules=$(nsenter -t "$qemu" -n nft list ruleset)
ok "its nftables rules match QEMU's UID $quid" 'grep -q "meta skuid != $quid accept" <<<"$rules" && grep -q "redirect to :" <<<"$rules"'
ok "they log what they reset or drop to NFLOG group 1, rate-limited" '[ "$(grep -c "limit rate 20/second burst 40 packets log prefix \"capsule \(reset\|drop\)\" group 1$" <<<"$rules")" = 2 ]'
echo "$rules" | sed 's/^/#   /'
ok "ping_group_range excludes QEMU's GID" '[ "$(nsenter -t "$qemu" -n cat /proc/sys/net/ipv4/ping_group_range)" = "$(printf "1\t0")" ]'
asq() { nsenter -t "$qemu" -n setpriv --reuid "$quid" --regid "$quid" --clear-groups /usr/bin/python3 -c "$1" 2>&1; }
r=$(asq 'import socket; s=socket.create_connection(("203.0.113.10",443),3); print(s.recv(100).decode().strip())')
ok "as QEMU's UID a connection lands in the policy listener ($r)" '[ "$r" = "policy saw 203.0.113.10:443" ]'
r=$(asq 'import socket
try: socket.create_connection(("198.51.100.7",80),3); print("connected")
except Exception as e: print(type(e).__name__)')
ok "as QEMU's UID a denied address gets a reset ($r)" '[ "$r" = ConnectionRefusedError ]'
sleep 0.5
ok "and the reset is logged to the policy process" 'grep -q "^nflog capsule reset proto 6 [0-9.]*:[0-9]* > 198.51.100.7:80 type 0$" "$log"'
r=$(asq 'import socket; s=socket.create_connection(("127.0.0.1",53),3); print(s.recv(100).decode().strip())')
ok "as QEMU's UID a TCP connection to 127.0.0.1:53 (slirp's DNS over TCP) lands in the policy listener ($r)" '[ "$r" = "policy saw 127.0.0.1:53" ]'
r=$(asq 'import socket
try: socket.create_connection(("127.0.0.1",54),3); print("connected")
except Exception as e: print(type(e).__name__)')
ok "as QEMU's UID another port of the denied host is still reset ($r)" '[ "$r" = ConnectionRefusedError ]'
lport=$(grep -o 'redirect to :[0-9]*' <<<"$rules" | head -1 | cut -d: -f2)
r=$(asq "import socket
try: socket.create_connection(('127.0.0.1',$lport),3); print('connected')
except Exception as e: print(type(e).__name__)")
ok "as QEMU's UID the listener cannot be reached directly ($r)" '[ "$r" = ConnectionRefusedError ]'
r=$(asq 'import socket; u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); u.sendto(b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\x03udp\x04test\x00\x00\x01\x00\x01",("127.0.0.1",53)); u.settimeout(3); print(len(u.recv(512)))')
ok "as QEMU's UID, UDP to 127.0.0.1:53 reaches the DNS socket ($r)" 'grep -q "^dns udp.test" "$log"'
r=$(asq 'import socket; u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
try: u.sendto(b"x",("203.0.113.10",53)); print("sent")
except Exception as e: print(type(e).__name__)')
ok "as QEMU's UID other UDP is dropped ($r)" '[ "$r" = PermissionError ]'
sleep 0.5
ok "and logged to the policy process" 'grep -q "^nflog capsule drop proto 17 [0-9.]*:[0-9]* > 203.0.113.10:53 type 0$" "$log"'
# QEMU has no ping socket (below) and no CAP_NET_RAW; given the latter, an
# echo request of its UID is dropped and logged all the same.
r=$(nsenter -t "$qemu" -n setpriv --reuid "$quid" --regid "$quid" --clear-groups --inh-caps +net_raw --ambient-caps +net_raw \
	/usr/bin/python3 -c 'import socket; s=socket.socket(socket.AF_INET,socket.SOCK_RAW,socket.IPPROTO_ICMP)
try: s.sendto(b"\x08\x00\xf7\xfe\x00\x01\x00\x00",("203.0.113.10",0)); print("sent")
except Exception as e: print(type(e).__name__)' 2>&1)
sleep 0.5
ok "as QEMU's UID (with CAP_NET_RAW) an ICMP echo is dropped ($r) and logged" '[ "$r" = PermissionError ] && grep -q "^nflog capsule drop proto 1 [0-9.]*:0 > 203.0.113.10:0 type 8$" "$log"'
# slirp's stand-in for a guest's ping when it has no ICMP socket.
asq 'import socket; u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)
try: u.sendto(b"This is a pseudo-PING packet used by Slirp to emulate ICMP ECHO-REQUEST packets.\n",("203.0.113.10",7))
except Exception: pass' >/dev/null
sleep 0.5
ok "QEMU's UDP stand-in for a ping is dropped and logged as the ping it is" 'grep -q "^nflog-line dropped icmp 203.0.113.10 (type 8, sent by QEMU as UDP to port 7): ICMP never leaves the sandbox$" "$log"'
before=$(grep -c "^nflog " "$log")
r=$(asq 'import socket; u=socket.socket(socket.AF_INET,socket.SOCK_DGRAM); n=0
for i in range(500):
    try: u.sendto(b"x",("203.0.113.10",9000+i))
    except PermissionError: n+=1
print(n)')
sleep 1
after=$(grep -c "^nflog " "$log")
ok "a flood of 500 is all dropped ($r) and at most a burst of it logged ($((after - before)))" '[ "$r" = 500 ] && [ $((after - before)) -ge 20 ] && [ $((after - before)) -le 60 ]'
r=$(asq 'import socket
try: socket.socket(socket.AF_INET,socket.SOCK_DGRAM,socket.IPPROTO_ICMP); print("open")
except Exception as e: print(type(e).__name__)')
ok "as QEMU's UID no ping socket ($r)" '[ "$r" = PermissionError ]'

# --- the policy process ---
ok "the policy process runs as its own user $puid, not QEMU's nor root" '[ "$puid" -ne 0 ] && [ "$puid" -ne "$quid" ]'
ok "with no_new_privs" '[ "$(awk "\$1 == \"NoNewPrivs:\" { print \$2 }" /proc/$pol/status)" = 1 ]'
ok "in QEMU's cgroup" '[ "$(cat /proc/$pol/cgroup)" = "$(cat /proc/$qemu/cgroup)" ]'
ok "in the host's network namespace, not QEMU's" '[ "$(readlink /proc/$pol/ns/net)" = "$(readlink /proc/self/ns/net)" ] && [ "$(readlink /proc/$qemu/ns/net)" != "$(readlink /proc/self/ns/net)" ]'
fds=$(ls /proc/$pol/fd | sort -n | tr '\n' ' ')
ok "holding only 0-2, its five descriptors and the one kept ($fds)" '[ "$(ls /proc/$pol/fd | wc -l)" -eq 9 ]'
ls -l /proc/$pol/fd | awk 'NR > 1 { print "#   " $(NF-2), $NF }'
ok "rlimits NOFILE 4096, CORE 0" 'grep -q "Max open files *4096 *4096" /proc/$pol/limits && grep -q "Max core file size *0 *0" /proc/$pol/limits'
conn=$(pgrep -P $$ -f engine-dev >/dev/null; ps -o pid= --ppid "$dev" | tr -d " " | grep -vx "$qemu" | grep -vx "$pol")
echo "# connector: $conn"
ok "the connector runs in QEMU's namespace as the helper user" '[ -n "$conn" ] && [ "$(readlink /proc/$conn/ns/net)" = "$(readlink /proc/$qemu/ns/net)" ] && [ "$(awk "\$1 == \"Uid:\" { print \$2 }" /proc/$conn/status)" = "$puid" ] && [ "$(ls /proc/$conn/fd | wc -l)" -eq 4 ]'

# Each helper: its own mount and IPC namespaces, a read-only root of its own.
tree() { (cd "/proc/$1/root" && find . -mindepth 1 -maxdepth 3 | sort | tr '\n' ' '); }
rootopts() { awk '$5 == "/" { print $6 }' "/proc/$1/mountinfo"; }
ns_own() { [ "$(readlink /proc/$1/ns/mnt)" != "$(readlink /proc/self/ns/mnt)" ] && [ "$(readlink /proc/$1/ns/ipc)" != "$(readlink /proc/self/ns/ipc)" ]; }
ptree=$(tree "$pol")
ok "the policy process has mount and IPC namespaces of its own" 'ns_own "$pol"'
ok "its root holds /dev/null and the resolver's files only (${ptree:0:200})" '[[ " $ptree" == *" ./dev/null "* ]] && [[ " $ptree" == *" ./etc/resolv.conf "* ]] && ! [ -e "/proc/$pol/root/usr" ] && ! [ -e "/proc/$pol/root/tmp" ] && [ -z "$(sed "s#\./dev/null ##; s#\./dev ##; s#\./etc ##; s#\./etc/\(resolv.conf\|hosts\|nsswitch.conf\|host.conf\|gai.conf\) ##g" <<<"$ptree")" ]'
ok "read-only ($(rootopts "$pol"))" '[[ $(rootopts "$pol") == ro,* ]] && ! (echo x >"/proc/$pol/root/etc/x") 2>/dev/null'
ok "and what it needs there is the host's ($(cat /proc/$pol/root/etc/resolv.conf 2>&1 | head -1))" 'cmp -s /etc/resolv.conf "/proc/$pol/root/etc/resolv.conf"'
ok "it resolves a name through the host's /etc/hosts there ($(grep "^resolved localhost" "$log"))" 'grep -q "^resolved localhost 127.0.0.1$" "$log"'
ctree=$([ -n "$conn" ] && tree "$conn")
ok "the connector has mount and IPC namespaces of its own" '[ -n "$conn" ] && ns_own "$conn"'
ok "its root holds /dev/null only (${ctree:0:200})" '[ "$ctree" = "./dev ./dev/null " ] && [[ $(rootopts "$conn") == ro,* ]]'

# --- forwards, the connector, deny updates ---
send "bg echo from-guest-8080 | nc -l -p 8080"
sleep 2
send "ctl dial 8080"; sleep 2
ok "a forward given at start reaches the guest through the connector" 'grep -q "^dial 8080: from-guest-8080" "$log"'
send "fwd add 8081"; a1=$?
send "fwd add 8081"; a2=$?
send "bg echo from-guest-8081 | nc -l -p 8081"
sleep 2
send "ctl dial 8081"; sleep 2
ok "a forward added while it runs (twice is fine) reaches the guest" '[ $a1 = 0 ] && [ $a2 = 0 ] && grep -q "^dial 8081: from-guest-8081" "$log"'
send "fwd del 8081"
send "ctl dial 8081"; sleep 1
ok "a removed forward is gone" 'grep -q "^dial 8081: error Connection refused" "$log"'
# The guest's tool user cannot listen on 80; QEMU's bind is what counts.
send "fwd add 80"; a1=$?
send "ctl dial 80"; sleep 1
ok "QEMU can forward a low port (bound in its namespace)" '[ $a1 = 0 ] && grep -q "^dial 80: .*(socket" "$log"'
send "fwd del 80"
send "deny"
send "guest nc -w 10 198.51.100.7 80 </dev/null 2>&1"
ok "after emptying the deny set the address reaches the policy process" '[[ $ans == *"policy saw 198.51.100.7:80"* ]]'
send "deny 203.0.113.0-203.0.113.255 203.0.113.128-203.0.113.130"
send "guest nc -w 10 203.0.113.10 80 </dev/null 2>&1"
ok "a new deny set applies to the next connection" '[[ $ans == *"refused"* ]]'

# --- teardown ---
echo quit >&"${DEV[1]}"
IFS= read -r -t 60 bye <&"${DEV[0]}"
wait "$dev" 2>/dev/null
echo "# $bye"
ok "the owner has the descriptors it had before the VM, in its own network namespace" '[[ $bye =~ fds\ before=([0-9]+)\ after=([0-9]+)\ netns\ unchanged ]] && [ "${BASH_REMATCH[1]}" = "${BASH_REMATCH[2]}" ]'

ok "QEMU, the policy process and the connector are gone" '! [ -d /proc/$qemu ] && ! [ -d /proc/$pol ] && { [ -z "$conn" ] || ! [ -d /proc/$conn ]; }'
grep -v "^tcp \|^dns \|^nflog-line " "$log" | sed 's/^/# log: /'

# --- a template with a NIC, restored with other forwards ---
t=$(mktemp -d /tmp/engine-dev-template.XXXXXX)
ans=$("$b/engine-dev" "$log" template "$t" 2>&1)
ok "a template build has the NIC, everything denied, no policy process nor logging" '[[ $ans == SAVED\ policy=-1* ]] && grep -q "elements = { 0.0.0.0/0 }" <<<"$ans" && ! grep -q "redirect\|log " <<<"$ans"'
: >"$log"
ans=$(printf '%s\n' "guest echo | nc -w 5 203.0.113.10 80" "bg echo from-restored | nc -l -p 8080" "guest sleep 2" "ctl dial 8080" "guest sleep 2" quit |
	"$b/engine-dev" "$log" restore "$t" 2>&1)
ok "restored with a forward the template lacked, it reaches the policy and is reached" '[[ $ans == *"policy saw 203.0.113.10:80"* ]] && grep -q "^dial 8080: from-restored" "$log"'
rm -rf "$t"

# --- without a NIC, and without the jail ---
ans=$(printf '%s\n' "guest ls /sys/class/net" quit | "$b/engine-dev" "$log" nonet 2>&1)
ok "a VM without a NIC has none and no policy process" '[[ $ans == *"policy=-1"* ]] && [[ $ans == *$'"'"'\nlo\nexit 0'"'"'* ]]'
ans=$(echo quit | CAPSULE_JAIL=0 "$b/engine-dev" "$log" 2>&1)
ok "a NIC without the jail is refused" '[[ $ans == *"a network policy needs the jail"* ]]'
rm -f "$log"
echo "1..$n"
[ "$fails" = 0 ]
