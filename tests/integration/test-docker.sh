#!/bin/sh
# Docker inside a sandbox (issue 35, docs/coding-agents.md "Docker
# inside"), black-box through the CLI on a fake internet (DESIGN §9):
#
#   INET   tests/net/fakenet.py's servers: HTTP on allowed.test
#          (203.0.113.10) and other.test (203.0.113.11), their DNS.
#   CAPNS  capsule's place, linked to INET only, entered through a holder
#          process as in the network suite.
#
# The docker image (debootstrap with Debian's docker.io) is built first,
# outside the namespaces. A --root sandbox of it starts dockerd, loads an
# image from a `docker save` archive made here (a static busybox:
# tests/integration/docker-archive.py) and runs containers: one reaches
# allowed.test, the sandbox's only allowed host; one is refused
# other.test, and the refusal is in the sandbox's net.log. A sandbox
# without --root runs its commands as UID 1000, and capsule-dockerd says
# what to do. VMs: two named sandboxes.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
tests=$(cd "$(dirname "$0")/.." && pwd)
top=$(cd "$tests/.." && pwd)
. "$(dirname "$0")/lib.sh"
export CAPSULE_RAM_HOLDER_IDLE_S=1
. "$top/scripts/fake-internet.sh"

plan=16
suite="docker suite"
net_suite_start ip nsenter unshare

fakenet_suite cd 60
lines() { cat "$1" 2>/dev/null | wc -l; }

# --- the image and the archive, outside the fake internet -------------------
t0=$(date +%s)
# One a run shares (CAPSULE_TEST_SHARE, as the python image: verified at
# every start like any image), else one built here.
if [ -e "${CAPSULE_TEST_SHARE:-/nonexistent}/images/names/docker" ] && mkdir -p "$CAPSULE_HOME/images" &&
	cp -a "$CAPSULE_TEST_SHARE/images/." "$CAPSULE_HOME/images/" && "$capsule" image inspect docker >"$out" 2>"$err"; then
	how="shared"
	rc=0
else
	"$capsule" image build docker >"$out" 2>"$err"
	rc=$?
	how="debootstrap with docker.io"
	grep -q "^built docker" "$out" || rc=1
fi
check "image docker ($(($(date +%s) - t0)) s; $how, before the fake internet)" '[ "$rc" -eq 0 ]'
[ "$rc" -eq 0 ] || fail_all "the docker image could not be built (see above)"
"$capsule" image inspect docker >"$out" 2>"$err"
sed -n 's/^/# /p' "$out" | grep -i "size\|source" | head -3
$py "$tests/integration/docker-archive.py" /bin/busybox "$rt/mini.tar" capsule-test/mini:1 >"$out" 2>"$err"
check "a docker save archive of a one-layer busybox image is made here" '[ -s "$rt/mini.tar" ] && tar -tf "$rt/mini.tar" | grep -qx manifest.json'
elapsed "image and archive"

# --- the fake internet ----------------------------------------------------------
setup() {
	fake_internet_up "$inet" "$capns" 203.0.113.10 203.0.113.11 203.0.113.53 203.0.113.99 \
		198.51.100.7 10.1.2.3 169.254.169.254 || return 1
	fakenet_serve "$inet" "$capns" "$logs"
}
if ! setup >"$out" 2>"$err"; then
	not_ok "the fake internet is set up" "namespaces or the servers failed"
	fail_all "the fake internet could not be set up (see above)"
fi
ok "the fake internet is set up ($inet, $capns)"

# --- a --root sandbox of the docker image -----------------------------------------
sb=dk
sandboxes=$sb
dir="$CAPSULE_HOME/sandboxes/$sb"
netlog="$dir/net.log"
g() { c exec --timeout "${2:-120}" "$sb" -- sh -c "$1" >"$out" 2>"$err"; }

c create "$sb" --root --image docker --memory 1024 --work-size 2048 --allow-egress allowed.test:80 >"$out" 2>"$err"
rc=$?
check "create --root --image docker --allow-egress allowed.test:80 says commands run as root" \
	'[ "$rc" -eq 0 ] && grep -q "commands run as root in the guest: the VM is the only boundary" "$out"'
c inspect --json "$sb" >"$out" 2>"$err"
check "inspect --json: user root" '$py -c "import json,sys; sys.exit(json.load(open(sys.argv[1]))[\"user\"] != \"root\")" "$out"'
g 'id -u; echo "$USER $HOME"; unshare -n sh -c "tail -n +3 /proc/net/dev | wc -l"'
check "commands run as root with HOME /work, and may make a network namespace (unshare -n)" \
	'[ "$(sed -n 1p "$out")" = 0 ] && [ "$(sed -n 2p "$out")" = "root /work" ] && [ "$(sed -n 3p "$out")" = 1 ]'
c exec "$sb" -- sh -c 'cat >/work/mini.tar; wc -c </work/mini.tar' <"$rt/mini.tar" >"$out" 2>"$err"
check "the archive is copied in (exec with stdin)" '[ "$(cat "$out")" -eq "$(wc -c <"$rt/mini.tar")" ]'

t0=$(date +%s)
g 'capsule-dockerd && docker info --format "{{.Driver}} {{.CgroupVersion}} {{.DockerRootDir}}" && docker load -i /work/mini.tar' 300
check "capsule-dockerd starts dockerd ($(($(date +%s) - t0)) s): overlay2 on /work/.docker, cgroup v2; docker load reads the archive" \
	'grep -qx "overlay2 2 /work/.docker" "$out" && grep -q "^Loaded image: capsule-test/mini:1" "$out"'

# Each container asks with busybox nc (HTTP/1.0 by hand): its DNS goes to
# the guest's resolver through Docker's NAT, its connection leaves by the
# guest's eth0 to the policy process like the guest's own.
get() { printf 'printf "GET /%s HTTP/1.0\\r\\nHost: %s\\r\\n\\r\\n" | nc -w 10 %s 80; echo "nc=$?"' "$2" "$1" "$1"; }
a0=$(lines "$logs/http-203.0.113.10.log")
o0=$(lines "$logs/http-203.0.113.11.log")
m0=$(lines "$netlog")
g "capsule-dockerd && docker run --rm capsule-test/mini:1 sh -c '$(get allowed.test from-container)'; \
	docker run --rm capsule-test/mini:1 sh -c '$(get other.test denied)'; echo end" 300
sed 's/^/# guest: /' "$out" | head -20
check "docker run: a container reaches allowed.test (the sandbox's allowed host) and gets its answer" \
	'grep -q "^hello from 203.0.113.10" "$out" && tail -n +$((a0 + 1)) "$logs/http-203.0.113.10.log" | grep -q "^GET /from-container host=allowed.test"'
check "docker run: a container is refused other.test; the fake other.test got nothing" \
	'! grep -q "hello from 203.0.113.11" "$out" && [ "$(lines "$logs/http-203.0.113.11.log")" -eq "$o0" ] && grep -qx end "$out"'
check "... and the sandbox's net.log names the refusal" \
	'tail -n +$((m0 + 1)) "$netlog" | grep -q "refused.*\(203.0.113.11\|other.test\)"'
g 'capsule-dockerd && docker images --format "{{.Repository}}:{{.Tag}}"' 300
check "the loaded image stays on /work from one session to the next" 'grep -qx capsule-test/mini:1 "$out"'
c stop "$sb" >"$out" 2>"$err"
g 'capsule-dockerd && docker images --format "{{.Repository}}:{{.Tag}}" && id -u' 300
check "... and across a restart of the sandbox, which still runs its commands as root" \
	'grep -qx capsule-test/mini:1 "$out" && [ "$(tail -1 "$out")" = 0 ]'
elapsed "docker inside"

# --- without --root -------------------------------------------------------------------
c create nr --image docker >"$out" 2>"$err"
sandboxes="$sandboxes nr"
c exec nr -- sh -c 'id -u; capsule-dockerd; echo "rc=$?"' >"$out" 2>"$err"
check "without --root: commands run as UID 1000, and capsule-dockerd says to make the sandbox with --root" \
	'[ "$(head -1 "$out")" = 1000 ] && grep -qx "rc=1" "$out" && grep -q "make the sandbox with --root" "$err"'
c rm -f nr >"$out" 2>"$err"
c rm -f "$sb" >"$out" 2>"$err"
check "both sandboxes removed" '[ ! -d "$dir" ] && [ ! -d "$CAPSULE_HOME/sandboxes/nr" ]'
sandboxes=
wait_for '[ "$(ours)" -eq 0 ]' 100
clean_after "whole suite"
elapsed "done"
