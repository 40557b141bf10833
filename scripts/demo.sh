#!/bin/sh
# The main job, as a newcomer sees it: what capsule found on this host, then
# a command running in a fresh microVM with its output streamed back, and
# the VM gone afterwards.
set -eu
build=${1:-build}
capsule="$build/capsule"
. "$(dirname "$0")/fake-internet.sh"
# The demo's VMs keep their sockets in run directories under
# $XDG_RUNTIME_DIR, and QEMU is named after its directory (-name
# guest=DIR): a private one tells the demo's QEMU processes from anyone
# else's (tests running at the same time, other CAPSULE_HOMEs).
demo_rt=$(mktemp -d /tmp/capsule-demo.XXXXXX)
trap 'rm -rf "$demo_rt"' EXIT
export XDG_RUNTIME_DIR="$demo_rt"
ours() { pgrep "$@" -f "qemu-system-x86_64 -name guest=$demo_rt/"; }

echo "== capsule doctor"
"$capsule" doctor || true
echo
echo "== capsule run -- sh -c 'uname -a; id; ...'"
start=$(date +%s%N)
set +e
"$capsule" run -- sh -c 'uname -a; id; echo "hostname: $(hostname), cwd: $(pwd)"; echo "this line goes to stderr" >&2'
rc=$?
set -e
end=$(date +%s%N)
echo "(exit code $rc, $(( (end - start) / 1000000 )) ms including boot and teardown)"
echo
echo "== exit codes pass through: capsule run -- sh -c 'exit 7'"
set +e
"$capsule" run -q -- sh -c 'exit 7'
echo "exit code: $?"
set -e
echo
echo "== the jail: QEMU seen from the host while a command runs"
"$capsule" run -q -- sleep 3 &
bg=$!
qemu=""
i=0
while [ -z "$qemu" ] && [ $i -lt 100 ]; do
	qemu=$(ours | head -1)
	sleep 0.1
	i=$((i + 1))
done
if [ -n "$qemu" ] && [ -r "/proc/$qemu/status" ]; then
	awk '$1 ~ /^(Uid|NSpid|Seccomp|NoNewPrivs):$/ { printf "%s %s  ", $1, $NF } END { print "" }' "/proc/$qemu/status"
	echo "cgroup: $(grep -m1 ':memory:' "/proc/$qemu/cgroup" || grep -m1 '^0::' "/proc/$qemu/cgroup")"
	echo "its root: $(find "/proc/$qemu/root/" -mindepth 1 ! -type d 2>/dev/null | wc -l) files:" \
		"$(find "/proc/$qemu/root/" -mindepth 1 ! -type d ! -name '*.so*' 2>/dev/null | sed "s|^/proc/$qemu/root||" | sort | tr '\n' ' ')+ libraries"
fi
wait "$bg" || true
echo
echo "== no network unless a policy opens it: capsule run -- wget http://203.0.113.10/"
"$capsule" run -q -- wget -qO- http://203.0.113.10/ 2>&1 || true
echo
# A fake internet of the demo's own (DESIGN §9): 203.0.113.10 serves a
# page and 198.51.100.7 another, in a namespace linked only to the one
# capsule runs in; nothing else is reachable from there.
echo "== a policy: --allow-egress 203.0.113.10, on a fake internet in network namespaces"
inet=capdemo-i$$
cns=capdemo-c$$
net_down() {
	if [ -n "${srv:-}" ]; then
		kill "$srv" 2>/dev/null || true
		srv=
	fi
	fake_internet_down "$inet" "$cns"
}
trap 'net_down; rm -rf "$demo_rt"' EXIT
fake_internet_up "$inet" "$cns" 203.0.113.10 198.51.100.7
ip netns exec "$inet" python3 -c '
import http.server, socketserver, threading
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = ("hello from %s\n" % self.server.server_address[0]).encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a): pass
for a in ("203.0.113.10", "198.51.100.7"):
    s = socketserver.ThreadingTCPServer((a, 80), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()' &
srv=$!
sleep 0.5
echo "\$ capsule run --allow-egress 203.0.113.10 -- sh -c 'wget -qO- http://203.0.113.10/; wget -qO- http://198.51.100.7/'"
# nsenter, not `ip netns exec`: that remounts /sys, and the jail's cgroups with it.
nsenter --net="/run/netns/$cns" "$capsule" run -q --allow-egress 203.0.113.10 -- \
	sh -c 'wget -qO- http://203.0.113.10/; wget -qO- http://198.51.100.7/' 2>&1 || true
net_down
echo

# Secrets on a fake internet with HTTPS APIs (tests/net/fakenet.py: its
# own test CA, which capsule is told to trust through CAPSULE_CA_FILE, and
# a DNS server that capsule's namespace uses as its resolver).
echo "== secrets: the guest holds a placeholder, api.test receives the value"
fake=$(cd "$(dirname "$0")/.." && pwd)/tests/net/fakenet.py
demo_net=$demo_rt/net
mkdir -p "$demo_net/certs" "$demo_net/logs"
python3 "$fake" certs "$demo_net/certs" >/dev/null
fake_internet_up "$inet" "$cns" 203.0.113.10 203.0.113.11 203.0.113.20 203.0.113.21 \
	203.0.113.22 203.0.113.23 203.0.113.53 203.0.113.99 198.51.100.7 10.1.2.3 169.254.169.254
echo "nameserver 203.0.113.53" >"$demo_net/resolv.conf"
ip netns exec "$inet" python3 "$fake" serve "$demo_net/logs" "$demo_net/certs" >/dev/null 2>&1 &
srv=$!
i=0
while [ ! -s "$demo_net/logs/ready" ] && [ $i -lt 100 ]; do sleep 0.1; i=$((i + 1)); done
token="demo-token-$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')"
echo "\$ TOKEN=$token capsule run --secret TOKEN=env:TOKEN@api.test -- sh -c \\"
echo "    'echo \"in the guest: TOKEN=\$TOKEN\"; wget -Y off -qO- --header \"Authorization: Bearer \$TOKEN\" https://api.test/v1/me'"
# The resolver of capsule's namespace is the fake internet's DNS.
TOKEN=$token CAPSULE_CA_FILE="$demo_net/certs/ca.pem" \
	nsenter --net="/run/netns/$cns" unshare --mount --propagation private sh -c \
	'mount --bind "$1" /etc/resolv.conf && shift && exec "$@"' sh "$demo_net/resolv.conf" \
	"$capsule" run -q --secret TOKEN=env:TOKEN@api.test -- sh -c \
	'echo "in the guest: TOKEN=$TOKEN"; wget -Y off -qO- --header "Authorization: Bearer $TOKEN" https://api.test/v1/me' 2>&1 || true
auth=$(python3 -c 'import json, sys
for l in open(sys.argv[1]):
    r = json.loads(l)
    if r.get("event") == "request":
        print([v for k, v in r["headers"] if k.lower() == "authorization"][0])' "$demo_net/logs/https-api.test.log" 2>/dev/null | tail -1)
echo "api.test received: Authorization: ${auth:-nothing}"
[ "$auth" = "Bearer $token" ] && echo "(the real value, put in on the host; the guest never had it)"
net_down
echo

# A project in and out (docs/workspace.md), in a CAPSULE_HOME of the
# demo's own so that nothing is left in yours.
echo "== a project in a sandbox: create --workspace, an edit in the guest, diff, merge"
proj="$demo_rt/proj"
mkdir -p "$proj/src"
printf '# demo\n' >"$proj/README.md"
printf 'int main(void) { return 0; }\n' >"$proj/src/main.c"
(
	export CAPSULE_HOME="$demo_rt/home"
	"$capsule" image build base >/dev/null
	echo "\$ capsule create w --workspace $proj"
	"$capsule" create w --workspace "$proj"
	echo "\$ capsule exec w -- sh -c 'echo fix >> /workspace/README.md; echo new > /workspace/NOTES'"
	"$capsule" exec w -- sh -c 'echo fix >> /workspace/README.md; echo new > /workspace/NOTES'
	echo "\$ capsule diff w"
	"$capsule" diff w
	echo "\$ capsule diff w --patch"
	"$capsule" diff w --patch
	echo "\$ capsule merge w"
	"$capsule" merge w
	echo "\$ cat $proj/README.md"
	cat "$proj/README.md"
	"$capsule" rm --force w >/dev/null
)
echo

# Images by reference from a registry: Debian's docker-registry on a
# loopback port of the demo's own, fed with a small image through skopeo
# (tests/registry.sh); nothing leaves this host.
echo "== images by reference: image pull from a registry on 127.0.0.1, create --image REF, --json"
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export CAPSULE_REGISTRY_DIR="$demo_rt/registry"
reg_stop() { tests/registry.sh stop "$port" >/dev/null 2>&1 || true; rm -rf "$demo_rt"; }
trap reg_stop EXIT
tests/registry.sh start "$port" >/dev/null
img="$demo_rt/img"
mkdir -p "$img/bin" "$img/etc"
cp /bin/busybox "$img/bin/busybox"
ln -s busybox "$img/bin/sh"
echo "hello from an image pulled by reference" >"$img/etc/motd"
tests/registry.sh push-dir "$img" "127.0.0.1:$port/demo:1" >/dev/null
(
	export CAPSULE_HOME="$demo_rt/home"
	echo "\$ capsule image pull 127.0.0.1:$port/demo:1"
	"$capsule" image pull "127.0.0.1:$port/demo:1"
	echo "\$ capsule create d --image 127.0.0.1:$port/demo:1 -q && capsule exec d -- /bin/busybox cat /etc/motd"
	"$capsule" create d --image "127.0.0.1:$port/demo:1" -q
	"$capsule" exec d -- /bin/busybox cat /etc/motd
	echo "\$ capsule ls --json | python3 -c '...name, state, image of each'"
	"$capsule" ls --json | python3 -c 'import json, sys
for s in json.load(sys.stdin): print(s["name"], s["state"], s["image"]["ref"], s["image"]["digest"][:19])'
	"$capsule" rm --force d >/dev/null
)
echo
left=$(ours -c || true)
echo "== QEMU processes left running: $left"
