#!/bin/sh
# A sandbox with a network policy on a fake internet, under KVM (issue 31),
# for tests/kvm/suite.sh. The fake internet is tests/integration/test-net.sh's,
# smaller, built where this runs (inside L1 when there is no KVM host; DESIGN
# §9: no packet beyond loopback and the namespaces made here):
#
#   INET   a network namespace holding tests/net/fakenet.py's servers on its
#          lo (203.0.113.10 allowed, 198.51.100.7 denied, DNS on
#          203.0.113.53); an nftables counter counts what reaches the
#          denied address.
#   CAPNS  where capsule runs (lib.sh's fakenet_serve holder): its only link
#          is a veth to INET, routed to the test prefixes only, its resolver
#          the fake DNS.
#
# The cases: no network by default; an allowed address reachable by
# address and by name (the body is right, the request came from CAPNS); a
# denied address refused fast with no packet out; DNS through the policy
# (a name outside it is NXDOMAIN); `capsule net log` showing the
# refusals. The rest of the policy (the upstream proxy, TLS, published
# ports, policy changes, the policy process killed) stays with the TCG
# suite: it is the host's policy process and nftables, the same under
# either accelerator. What differs under KVM is QEMU's side (slirp in a
# jailed QEMU with -accel kvm and /dev/kvm in its root), which every case
# here goes through. TAP output.
#
#   tests/kvm/check-net.sh BUILD/capsule [--expect-kvm]
#
# With --expect-kvm or CAPSULE_REQUIRE_KVM=1, an accelerator other than
# KVM fails every check. Root only (network namespaces).
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
expect=${CAPSULE_REQUIRE_KVM:-0}
[ "${2:-}" = --expect-kvm ] && expect=1
here=$(cd "$(dirname "$0")" && pwd)
tests=$(dirname "$here")
. "$tests/integration/lib.sh"
export CAPSULE_RAM_HOLDER_IDLE_S=1

plan=12
suite="KVM network checks"
net_suite_start ip nft nsenter unshare curl

# --- the accelerator -----------------------------------------------------------
# "# accel: NAME", and why when it is not kvm.
"$capsule" doctor --json 2>"$err" | "$py" -c 'import json, sys
a = json.load(sys.stdin)["accel"]
why = a.get("error") or a.get("reason")
print("# accel: %s%s" % (a.get("name") or "none", "" if a.get("name") == "kvm" or not why else " (%s)" % why))' >"$out" 2>>"$err"
cat "$out"
accel=$(sed -n 's/^# accel: \([a-z]*\).*/\1/p' "$out")
if [ "$expect" = 1 ]; then
	check "the accelerator is kvm (doctor --json)" '[ "$accel" = kvm ]'
	[ "$accel" = kvm ] || fail_all "the accelerator is ${accel:-unknown}, not kvm: nothing here would run under KVM"
else
	ok "the accelerator is ${accel:-unknown} (kvm not required: no --expect-kvm or CAPSULE_REQUIRE_KVM=1)"
fi

inet=kinet-$$
capns=kcapns-$$
vi=kni$$
vc=knc$$
logs="$rt/fakenet"
mkdir -p "$logs"
holder=
sandboxes=
teardown() {
	[ -n "$holder" ] && for s in $sandboxes; do cn timeout 30 "$capsule" rm -f "$s" >/dev/null 2>&1; done
	for ns in "$capns" "$inet"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	done
	[ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null
	for ns in "$capns" "$inet"; do ip netns del "$ns" 2>/dev/null; done
	rm -rf "/etc/netns/$capns"
}
trap 'teardown; cleanup' EXIT
trap 'exit 130' INT TERM HUP PIPE

in_inet() { ip netns exec "$inet" "$@"; }
in_capns() { ip netns exec "$capns" "$@"; }
# -r -w: the holder's root and directory too, for a caller in a chroot
# (L1's command ran in one before its switch_root): entering a mount
# namespace alone puts nsenter at that namespace's root, where this tree
# may not be.
cn() { nsenter -t "$holder" -m -n -r -w -- "$@"; }
c() { cn "$capsule" "$@"; }
denied() { in_inet nft list counter inet capnet cnt_denied 2>/dev/null | sed -n 's/.*packets \([0-9]*\) .*/\1/p'; }
lines() { cat "$1" 2>/dev/null | wc -l; }
ms_since() { echo $((($(date +%s%N) - $1) / 1000000)); }

# --- the fake internet -----------------------------------------------------------
# The modules nftables and capsule's rules need (the jail's NAT redirect,
# conntrack, reject, the refusals' log), and veth. A kernel asks for them
# itself where modprobe works; loading them first names the one missing.
modules() {
	[ -d "/lib/modules/$(uname -r)" ] || return 0
	mp=modprobe
	command -v modprobe >/dev/null || mp="busybox modprobe"
	missing=
	for m in veth nf_tables nft_chain_nat nft_redir nft_ct nft_reject_inet nft_limit nft_log nfnetlink_log; do
		$mp "$m" 2>/dev/null || missing="$missing $m"
	done
	[ -z "$missing" ] || echo "# $mp did not load:$missing (built in, or missing)"
}
setup() {
	modules
	ip netns add "$inet" && ip netns add "$capns" || return 1
	ip -n "$inet" link set lo up && ip -n "$capns" link set lo up || return 1
	ip link add "$vc" type veth peer name "$vi" || return 1
	ip link set "$vc" netns "$capns" && ip link set "$vi" netns "$inet" || return 1
	ip -n "$capns" addr add 192.0.2.1/30 dev "$vc" && ip -n "$capns" link set "$vc" up || return 1
	ip -n "$inet" addr add 192.0.2.2/30 dev "$vi" && ip -n "$inet" link set "$vi" up || return 1
	# fakenet.py serve listens on all of its addresses.
	for a in 203.0.113.10 203.0.113.11 203.0.113.53 203.0.113.99 198.51.100.7 10.1.2.3 169.254.169.254; do
		ip -n "$inet" addr add "$a/32" dev lo || return 1
	done
	for p in 203.0.113.0/24 198.51.100.0/24; do
		ip -n "$capns" route add "$p" via 192.0.2.2 || return 1
	done
	in_inet nft -f - <<EOF || return 1
table inet capnet {
	counter cnt_denied {}
	chain input {
		type filter hook input priority 0; policy accept;
		ip daddr 198.51.100.7 counter name "cnt_denied"
	}
}
EOF
	fakenet_serve "$inet" "$capns" "$logs"
}
if ! setup >"$out" 2>"$err"; then
	not_ok "the fake internet is set up" "ip netns, veth, nftables or the servers failed"
	fail_all "the fake internet could not be set up (see above)"
fi
grep '^# ' "$out"
: >"$out"
in_capns curl -s -m 10 http://203.0.113.10/ >>"$out" 2>>"$err"
in_capns curl -s -m 10 http://198.51.100.7/ >>"$out" 2>>"$err"
cn getent hosts allowed.test >>"$out" 2>>"$err"
check "the fake internet answers from CAPNS (HTTP on the allowed and the denied address; DNS, capsule's resolver), and counts" \
	'[ "$(sed -n 1,2p "$out")" = "$(printf "hello from %s\n" 203.0.113.10 198.51.100.7)" ] && sed -n 3p "$out" | grep -q "^203.0.113.10 *allowed.test" && [ "$(denied)" -gt 0 ]'
in_inet nft reset counters table inet capnet >/dev/null
elapsed "the fake internet up"

# --- no network by default ---------------------------------------------------------
c run -- sh -c 'timeout 5 wget -Y off -q -O- http://203.0.113.10/; echo "wget=$?"; ls /sys/class/net' >"$out" 2>"$err"
check "run without a network flag: the guest has lo only and wget fails" \
	'grep -q "^wget=[1-9]" "$out" && grep -qx lo "$out" && [ "$(grep -cv "^wget=" "$out")" -eq 1 ] && ! grep -q "hello from" "$out"'
elapsed "run without network (the template built, or found shared)"

# --- a named sandbox with a policy -----------------------------------------------
web=web
sandboxes=$web
wlog="$CAPSULE_HOME/sandboxes/$web/net.log"
g() { c exec --timeout 60 "$web" -- sh -c "$1" >"$out" 2>"$err"; }
c create "$web" --allow-egress 203.0.113.10 --allow-egress allowed.test >"$out" 2>"$err" &&
	c start "$web" >>"$out" 2>>"$err"
qpid=$(rtv "$CAPSULE_HOME/sandboxes/$web" qemu_pid)
check "create and start a sandbox with a policy (QEMU ${qpid:-none}, policy process $(rtv "$CAPSULE_HOME/sandboxes/$web" netd_pid))" \
	'[ -n "$qpid" ] && [ -n "$(rtv "$CAPSULE_HOME/sandboxes/$web" netd_pid)" ]'
args=$(tr '\0' ' ' <"/proc/$qpid/cmdline" 2>/dev/null)
echo "# its QEMU: $(echo "$args" | grep -o -- '-accel [^ ]*')"
if [ "$accel" = kvm ]; then
	check "its QEMU runs with -accel kvm" 'echo " $args " | grep -q -- " -accel kvm "'
else
	skip "its QEMU runs with -accel kvm" "the accelerator is ${accel:-unknown}"
fi

h10=$(lines "$logs/http-203.0.113.10.log")
g 'wget -Y off -qO- http://203.0.113.10/'
check "an allowed address answers with its page, the request from CAPNS" \
	'grep -qx "hello from 203.0.113.10" "$out" && [ "$(tail -n +$((h10 + 1)) "$logs/http-203.0.113.10.log")" = "GET / host=203.0.113.10 from 192.0.2.1" ]'

t0=$(date +%s%N)
g 'timeout 15 wget -Y off -q -O- http://198.51.100.7/; echo "wget=$?"'
took=$(ms_since "$t0")
check "a denied address is refused fast (${took} ms for the whole exec), 0 packets reach it" \
	'grep -q "^wget=[1-9]" "$out" && [ "$took" -lt 10000 ] && [ "$(denied)" = 0 ]'

d0=$(lines "$logs/dns.log")
g 'nslookup allowed.test; wget -Y off -qO- http://allowed.test/'
check "DNS through the policy: an allowed name resolves (the fake DNS asked) and wget by it works" \
	'grep -q "203.0.113.10" "$out" && grep -qx "hello from 203.0.113.10" "$out" && tail -n +$((d0 + 1)) "$logs/dns.log" | grep -q "allowed.test"'
d0=$(lines "$logs/dns.log")
g 'nslookup other.test 2>&1; echo "nslookup=$?"; timeout 15 wget -Y off -q -O- http://other.test/; echo "wget=$?"'
check "DNS through the policy: a name outside it is NXDOMAIN, never asked upstream, and wget by it fails" \
	'grep -q "NXDOMAIN" "$out" && ! grep -q "203.0.113.11" "$out" && grep -q "^wget=[1-9]" "$out" && ! tail -n +$((d0 + 1)) "$logs/dns.log" | grep -q other.test'

wait_for 'grep -q "refused dns other.test" "$wlog" 2>/dev/null' 50
c net log "$web" >"$out" 2>"$err"
check "net log shows the refusals (tcp 198.51.100.7:80, dns other.test) with their rule" \
	'grep -q "^capsule net: refused tcp 198.51.100.7:80: ." "$out" && grep -q "^capsule net: refused dns other.test: ." "$out"'

c rm -f "$web" >"$out" 2>"$err"
sandboxes=
check "rm the sandbox" '[ ! -e "$CAPSULE_HOME/sandboxes/$web" ]'
wait_for '! ip netns pids "$capns" | xargs -r ps -o args= -p | grep -q "ram-holder"' 100
for p in $(ip netns pids "$capns"); do
	[ "$p" = "$holder" ] || echo "# left in CAPNS: $(ps -o pid=,args= -p "$p")"
done
check "nothing of ours is left running: no QEMU, nothing in CAPNS but the holder" \
	'[ "$(ours)" -eq 0 ] && [ "$(ip netns pids "$capns" | grep -vx "$holder" | wc -l)" -eq 0 ]'
elapsed "all done"
[ "$n" -eq "$plan" ] || echo "# plan says $plan, ran $n"
[ "$nfail" -eq 0 ] && [ "$n" -eq "$plan" ]
