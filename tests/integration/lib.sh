# Shared helpers for the black-box shell suites (TAP output). Source after
# setting $capsule. Each suite gets a private runtime directory (sockets of
# one-shot VMs) and a private CAPSULE_HOME, so it can tell its own QEMU
# processes and leftovers from anyone else's, and cleans both up on exit.
rt=$(mktemp -d /tmp/ct.XXXXXX)
export XDG_RUNTIME_DIR="$rt"
export CAPSULE_HOME="$rt/home"
# CAPSULE_TEST_TEMPLATES: a templates directory the suites share (the
# KVM suite's parts, where building one takes half a minute), in place
# of each home's own.
if [ -n "${CAPSULE_TEST_TEMPLATES:-}" ]; then
	mkdir -p "$CAPSULE_HOME" "$CAPSULE_TEST_TEMPLATES"
	ln -s "$CAPSULE_TEST_TEMPLATES" "$CAPSULE_HOME/templates"
fi
out="$rt/out"
err="$rt/err"
n=0
nfail=0	# checks that failed, for a suite another one judges by its exit status
cleanup() {
	for d in "$CAPSULE_HOME"/sandboxes/*/; do
		[ -f "$d/runtime.json" ] && pkill -KILL -f "$d" 2>/dev/null
	done
	pkill -KILL -f "$rt/" 2>/dev/null
	sleep 0.2
	rm -rf "$rt"
}
trap cleanup EXIT

ok() { n=$((n + 1)); echo "ok $n - $1"; }
not_ok() {
	n=$((n + 1))
	nfail=$((nfail + 1))
	echo "not ok $n - $1"
	shift
	for line in "$@"; do echo "# $line"; done
	[ -s "$out" ] && sed 's/^/# stdout: /' "$out" | head -10
	[ -s "$err" ] && sed 's/^/# stderr: /' "$err" | head -20
}
skip() { n=$((n + 1)); echo "ok $n - $1 # SKIP $2"; }
check() { # check NAME 'SHELL CONDITION'
	if eval "$2"; then ok "$1"; else not_ok "$1" "failed: $2"; fi
}
# QEMU processes started by this suite, and leftovers in its runtime dir.
ours() { pgrep -f "qemu-system.*$rt/" | wc -l; }
leftovers() { find "$rt" -mindepth 1 -maxdepth 1 -name 'capsule-*' | wc -l; }
clean_after() { # clean_after NAME: nothing of ours may remain
	if [ "$(ours)" -eq 0 ] && [ "$(leftovers)" -eq 0 ]; then ok "$1: no QEMU process or socket left"
	else not_ok "$1: no QEMU process or socket left" "qemu: $(ours), dirs: $(ls "$rt")"; fi
}
# For suites that set $plan and $suite ("network suite"): the seconds
# since $start at a milestone, and the rest of the plan skipped or
# failed at once when the suite cannot go on.
elapsed() { echo "# $1 after $(($(date +%s) - start)) s"; }
skip_all() {
	while [ "$n" -lt "$plan" ]; do skip "$suite" "$1"; done
	exit 0
}
fail_all() {
	while [ "$n" -lt "$plan" ]; do n=$((n + 1)); nfail=$((nfail + 1)); echo "not ok $n - $suite: $1"; done
	exit 1
}
# fakenet_suite PREFIX [RM_TIMEOUT]: a fake-internet suite's namespaces
# ($inet PREFIXinet-PID, $capns PREFIXns-PID; the suite builds them with
# scripts/fake-internet.sh), $logs, an empty $holder and $sandboxes, and
# the teardown on exit: the sandboxes removed from capsule's place
# (RM_TIMEOUT s each, default 30), everything in both namespaces killed,
# both gone with CAPNS's resolv.conf. cn runs a command in capsule's
# place (the holder's mount and network namespaces), c capsule there.
fakenet_suite() {
	inet=$1inet-$$
	capns=$1ns-$$
	fakenet_rm_timeout=${2:-30}
	logs="$rt/fakenet"
	mkdir -p "$logs"
	holder=
	sandboxes=
	trap 'fakenet_teardown; cleanup' EXIT
	trap 'exit 130' INT TERM HUP PIPE
}
fakenet_teardown() {
	[ -n "$holder" ] && for s in $sandboxes; do cn timeout "$fakenet_rm_timeout" "$capsule" rm -f "$s" >/dev/null 2>&1; done
	for ns in "$capns" "$inet"; do
		for p in $(ip netns pids "$ns" 2>/dev/null); do kill -KILL "$p" 2>/dev/null; done
	done
	[ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null
	fake_internet_down "$inet" "$capns"
	rm -rf "/etc/netns/$capns"
}
cn() { nsenter -t "$holder" -m -n -- "$@"; }
c() { cn "$capsule" "$@"; }
# net_suite_start TOOL...: the start of a suite on a fake internet, with
# $tests, $plan and $suite set: $fake and $py, none of the host's proxy
# settings (they must not reach the policy process), the plan printed
# and $start, and every check skipped unless root with each TOOL.
net_suite_start() {
	fake="$tests/net/fakenet.py"
	py=/usr/bin/python3
	[ -x "$py" ] || py=$(command -v python3)
	unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy ALL_PROXY all_proxy NO_PROXY no_proxy
	echo "1..$plan"
	start=$(date +%s)
	[ "$(id -u)" -eq 0 ] || skip_all "not root: network namespaces need CAP_SYS_ADMIN"
	for tool in "$@"; do
		command -v "$tool" >/dev/null || skip_all "$tool is not installed"
	done
}
# fakenet_serve INET CAPNS LOGS [CERTS]: tests/net/fakenet.py's servers
# in namespace INET (logging to LOGS; HTTPS APIs with CERTS), its DNS
# named in /etc/netns/CAPNS/resolv.conf, and $holder: a process in
# CAPNS's network namespace with that file over /etc/resolv.conf, which
# the suites enter to run capsule (nsenter -t "$holder" -m -n; not `ip
# netns exec`, which remounts /sys and the jail's cgroups with it). Needs
# $py and $fake.
fakenet_serve() {
	fs_logs=$3
	mkdir -p "/etc/netns/$2" && echo "nameserver 203.0.113.53" >"/etc/netns/$2/resolv.conf" || return 1
	ip netns exec "$1" "$py" "$fake" serve "$3" ${4:+"$4"} >"$3/serve.out" 2>&1 &
	wait_for '[ -s "$fs_logs/ready" ]' 100 || return 1
	nsenter --net="/run/netns/$2" unshare --mount --propagation slave \
		sh -c "mount --bind /etc/netns/$2/resolv.conf /etc/resolv.conf && exec sleep 100000" &
	holder=$!
	wait_for 'grep -q 203.0.113.53 "/proc/$holder/root/etc/resolv.conf" 2>/dev/null' 50
}
# wait_for 'CONDITION' [TENTHS]: poll until true, at most TENTHS/10 s.
wait_for() {
	i=0
	while ! eval "$1" && [ $i -lt "${2:-300}" ]; do sleep 0.1; i=$((i + 1)); done
	eval "$1"
}
# rtv DIR KEY: a value from the sandbox's runtime.json
rtv() { python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1/runtime.json" "$2" 2>/dev/null; }
# pause_vm CONTROL: ask the shim to pause its VM; prints the errno it answers
pause_vm() {
	python3 - "$1" <<'EOF'
import socket, struct, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(struct.pack("<IHHI", 0, 12, 0, 0))  # PAUSE, stream 0, empty
buf = b""
while len(buf) < 16:
    d = s.recv(4096)
    if not d:
        break
    buf += d
ok = len(buf) >= 16 and struct.unpack_from("<H", buf, 4)[0] == 12
print(struct.unpack_from("<i", buf, 12)[0] if ok else "no answer")
EOF
}
