# Sourced by the demo, the benchmark and tests/integration/test-secret.sh
# (tests/integration/test-net.sh builds a richer one): a fake internet
# as DESIGN §9 asks, a namespace INET holding the given addresses on its
# lo, and a namespace CNS for capsule whose only link is a veth to INET,
# routed to those addresses' /24s and nowhere else.
#   fake_internet_up INET CNS ADDR...
#   fake_internet_down INET CNS
fake_internet_up() {
	fi_inet=$1 fi_cns=$2
	shift 2
	ip netns add "$fi_inet"
	ip netns add "$fi_cns"
	ip -n "$fi_inet" link set lo up
	ip -n "$fi_cns" link set lo up
	ip link add "fv$$" netns "$fi_cns" type veth peer name "fi$$" netns "$fi_inet"
	ip -n "$fi_cns" addr add 192.0.2.1/30 dev "fv$$"
	ip -n "$fi_inet" addr add 192.0.2.2/30 dev "fi$$"
	ip -n "$fi_cns" link set "fv$$" up
	ip -n "$fi_inet" link set "fi$$" up
	for fi_a in "$@"; do
		ip -n "$fi_inet" addr add "$fi_a/32" dev lo
		ip -n "$fi_cns" route replace "${fi_a%.*}.0/24" via 192.0.2.2
	done
}

fake_internet_down() {
	ip netns del "$2" 2>/dev/null || true
	ip netns del "$1" 2>/dev/null || true
}
