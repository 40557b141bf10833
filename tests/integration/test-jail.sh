#!/bin/sh
# The jail around every QEMU, checked from the host against running
# sandboxes: its user, namespaces, seccomp mode, root, descriptors and
# cgroup limits (each printed as a comment); a sandbox with a NIC (QEMU's
# namespace and rules, the policy process's confinement); a guest that runs out of
# memory; two sandboxes that cannot reach each other's disks; teardown and
# the recovery of leftover jails; a host that cannot give a protection.
# TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
sbdir() { echo "$CAPSULE_HOME/sandboxes/$1"; }
procs() { c inspect "$1" | sed -n 's/^processes: *shim \([0-9]*\), qemu \([0-9]*\)/\1 \2/p'; }
qemu_pid() { procs "$1" | cut -d' ' -f2; }
shim_pid() { procs "$1" | cut -d' ' -f1; }
status() { awk -v k="$1:" '$1 == k { print $2 }' "/proc/$2/status"; }
say() { sed 's/^/#   /'; }
v2=false
[ -f /sys/fs/cgroup/cgroup.controllers ] && v2=true
# cgdir PID CONTROLLER: the folder of PID's cgroup for that controller.
cgdir() {
	if $v2; then echo "/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$1/cgroup")"
	else echo "/sys/fs/cgroup/$2$(awk -F: -v c="$2" '$2 ~ "(^|,)" c "(,|$)" { print $3 }' "/proc/$1/cgroup")"; fi
}
cgread() { # cgread PID V1-CONTROLLER V1-FILE V2-FILE
	if $v2; then cat "$(cgdir "$1" memory)/$4"; else cat "$(cgdir "$1" "$2")/$3"; fi
}

echo "1..36"

c doctor >"$out" 2>"$err"
sed -n '/^jail:/,/^cache:/p' "$out" | sed '$d' | say
check "doctor lists six protections, each active here" '[ "$(grep -c "^  .* active: " "$out")" -eq 6 ] && ! grep -q MISSING "$out"'
accel=$(sed -n 's/^accel: *\([a-z]*\) .*/\1/p' "$out")

c image build base >"$out" 2>"$err"
c create --memory 256 j1 >"$out" 2>"$err" && c create j2 >>"$out" 2>>"$err"
c exec j1 -- true >"$out" 2>"$err" && c exec j2 -- true >>"$out" 2>>"$err"
p1=$(qemu_pid j1)
p2=$(qemu_pid j2)
check "two sandboxes run (QEMU $p1 and $p2)" '[ -n "$p1" ] && [ -n "$p2" ] && [ -d "/proc/$p1" ] && [ -d "/proc/$p2" ]'

u1=$(status Uid "$p1"); g1=$(status Gid "$p1"); u2=$(status Uid "$p2")
echo "# QEMU $p1: uid $u1 gid $g1; QEMU $p2: uid $u2"
check "QEMU runs as an unprivileged user of its own, not 0 (uid $u1, $u2)" '[ "$u1" -ne 0 ] && [ "$g1" -ne 0 ] && [ "$u2" -ne 0 ] && [ "$u1" != "$u2" ]'
c inspect j1 >"$out" 2>"$err"
check "inspect shows the jail's user and cgroup" 'grep -q "^jail: *uid $u1, cgroup .*capsule/vm-[0-9]*$" "$out"'

differ=0
for ns in mnt pid ipc uts net; do
	a=$(readlink "/proc/$p1/ns/$ns"); b=$(readlink "/proc/self/ns/$ns")
	echo "# namespace $ns: QEMU $a, host $b"
	[ -n "$a" ] && [ "$a" != "$b" ] && differ=$((differ + 1))
done
check "its mnt, pid, ipc, uts and net namespaces differ from the host's" '[ "$differ" -eq 5 ]'
nspid=$(awk '$1 == "NSpid:" { print $NF }' "/proc/$p1/status")
check "it is PID 1 of its own PID namespace" '[ "$nspid" = 1 ]'
ifaces=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' "/proc/$p1/net/dev" | tr '\n' ' ')
echo "# network interfaces: $ifaces"
check "its network namespace has loopback only" '[ "$ifaces" = "lo " ]'

echo "# Seccomp: $(status Seccomp "$p1"), NoNewPrivs: $(status NoNewPrivs "$p1")"
check "seccomp filter mode (2) and no_new_privs" '[ "$(status Seccomp "$p1")" = 2 ] && [ "$(status NoNewPrivs "$p1")" = 1 ]'
# No group but its own, for any device (the jail used to hand over
# /dev/kvm's group: gid 0 where devtmpfs makes it root's); under KVM its
# /dev/kvm is a node the jail made for its user (10:232 is a:e8 in hex).
groups=$(awk '$1 == "Groups:" { $1 = ""; print }' "/proc/$p1/status" | tr -d ' \t')
kvmnode=none
[ -e "/proc/$p1/root/dev/kvm" ] && kvmnode=$(stat -c '%u:%g %a %F %t:%T' "/proc/$p1/root/dev/kvm")
echo "# accel $accel; QEMU $p1: supplementary groups '$groups', /dev/kvm in its root: $kvmnode"
check "QEMU has no supplementary group; under KVM its /dev/kvm is its own (its uid:gid, 0600, 10:232)" '[ -z "$groups" ] && if [ "$accel" = kvm ]; then [ "$kvmnode" = "$u1:$g1 600 character special file a:e8" ]; else [ "$kvmnode" = none ]; fi'

find "/proc/$p1/root/" -mindepth 1 ! -type d | sed "s|^/proc/$p1/root||" | sort >"$rt/root-list"
echo "# root of QEMU $p1 ($(wc -l <"$rt/root-list") files):"
sed 's|/[^/]*\.so[.0-9]*$|/*.so|' "$rt/root-list" | uniq -c | say
stray=$(grep -Ev '^(/usr/bin/qemu-system-x86_64|/lib64/ld-linux-x86-64\.so\.2|/lib/x86_64-linux-gnu/[^/]+|/usr/lib/x86_64-linux-gnu/qemu/[^/]+\.so|/usr/share/qemu/[^/]+|/dev/(null|urandom|kvm)|/vm/(vmlinux|initrd)|/mem/ram)$' "$rt/root-list")
check "its root holds only QEMU, its libraries and firmware, /dev/null, /dev/urandom and its RAM (restored: no kernel, no initramfs)" 'grep -qx /usr/bin/qemu-system-x86_64 "$rt/root-list" && [ -z "$stray" ] && ! grep -q "^/vm/" "$rt/root-list"'
check "its root holds no sandbox's disks, no state directory, no home" '[ -d "/proc/$p1/root/dev" ] && ! grep -Eq "ext4|erofs|sandboxes|/home|/root" "$rt/root-list" && [ ! -e "/proc/$p1/root$CAPSULE_HOME" ] && [ ! -e "/proc/$p1/root$(sbdir j2)" ] && [ ! -e "/proc/$p1/root/etc" ]'
check "its root is read-only" '[ -d "/proc/$p1/root/dev" ] && ! touch "/proc/$p1/root/x" 2>/dev/null && ! mkdir "/proc/$p1/root/dev/x" 2>/dev/null'

ls -l "/proc/$p1/fd" | awk 'NR > 1 { print $NF }' | sort -u >"$rt/fds"
echo "# descriptors of QEMU $p1: $(grep -c . "$rt/fds") distinct targets"
grep '^/' "$rt/fds" | say
check "its descriptors reach its own files only: nothing of j2, nothing inherited" 'grep -qx "$(sbdir j1)/private.ext4" "$rt/fds" && ! grep -q "$(sbdir j2)" "$rt/fds" && [ -z "$(grep "^/" "$rt/fds" | grep -Ev "^($(sbdir j1)/|$CAPSULE_HOME/images/|/dev/(null|urandom|kvm)$|/mem/ram$|/run/capsule/jail/slot-)")" ]'

mem=$(cgread "$p1" memory memory.limit_in_bytes memory.max)
pids=$(cgread "$p1" pids pids.max pids.max)
cpu=$(cgread "$p1" cpu cpu.shares cpu.weight)
echo "# cgroup $(cgdir "$p1" memory): memory $mem, pids $pids, cpu $cpu"
# A VM restored from the template's shared RAM (a sealed memfd it maps)
# may also fill the memfd's holes, up to its RAM once more.
want=$(((256 + 256) * 1048576))
grep -q "/memfd:" "/proc/$p1/maps" && want=$(((2 * 256 + 256) * 1048576))
check "its cgroup caps memory at guest RAM + 256 MiB (+ RAM with shared template RAM: $want), PIDs at 130, and sets a CPU weight" '[ "$mem" = "$want" ] && [ "$pids" = 130 ] && [ -n "$cpu" ]'
check "another sandbox gets another cgroup" '[ "$(cgdir "$p1" memory)" != "$(cgdir "$p2" memory)" ]'

# Each QEMU's user may not open the other's disk, nor its own by path: it
# holds its own as descriptors, and the other's is not in its root.
setpriv --reuid="$u1" --regid="$g1" --clear-groups head -c 1 "$(sbdir j2)/private.ext4" >/dev/null 2>"$err"
r1=$?
setpriv --reuid="$u2" --regid="$u2" --clear-groups head -c 1 "$(sbdir j1)/private.ext4" >/dev/null 2>>"$err"
r2=$?
check "two sandboxes' QEMU users cannot open each other's disks" '[ "$r1" -ne 0 ] && [ "$r2" -ne 0 ] && [ "$(grep -c "Permission denied" "$err")" -eq 2 ]'

# A guest process allocating four times the guest's RAM.
c exec j1 -- sh -c 'x=$(head -c 1000000000 /dev/zero | tr "\0" x); echo survived ${#x}' >"$out" 2>"$err"
rc=$?
echo "# guest allocation of 1 GB in 256 MiB: exit $rc"
check "a guest process allocating far beyond its RAM is killed inside the guest" '[ "$rc" -ne 0 ] && [ "$rc" -ne 125 ] && ! grep -q survived "$out"'
c exec j1 -- echo alive >"$out" 2>"$err"
check "the same QEMU goes on serving it" '[ "$(qemu_pid j1)" = "$p1" ] && grep -qx alive "$out"'
peak=$(cgread "$p1" memory memory.max_usage_in_bytes memory.peak 2>/dev/null || echo 0)
echo "# QEMU $p1 peak memory $peak of $mem"
check "QEMU stayed under its ceiling and the other sandbox is unaffected" '[ "$peak" -le "$mem" ] && c exec j2 -- true'

cg1=$(cgdir "$p1" memory)
c stop j1 >"$out" 2>"$err"
check "stop removes the jail's cgroup and keeps the disks" '[ ! -d "$cg1" ] && [ -f "$(sbdir j1)/private.ext4" ] && [ -f "$(sbdir j1)/root-upper.ext4" ]'

# A sandbox with a NIC: QEMU's namespace keeps no uplink, nftables on
# QEMU's UID, and the policy process is jailed too. Checked from the host
# only, with nothing that would make the policy process dial out.
c create --allow-egress 203.0.113.10 n3 >"$out" 2>"$err" && c exec n3 -- true >>"$out" 2>>"$err"
p3=$(qemu_pid n3)
u3=$(status Uid "$p3")
pu=$((u3 + 1000000))
pol=; con=
for p in $(pgrep -U "$pu"); do
	if [ "$(readlink "/proc/$p/ns/net")" = "$(readlink "/proc/$p3/ns/net")" ]; then con=$p; else pol=$p; fi
done
echo "# QEMU $p3 (uid $u3), policy process $pol and connector $con (uid $pu)"
ifaces=$(awk -F: 'NR > 2 { gsub(/ /, "", $1); print $1 }' "/proc/$p3/net/dev" 2>/dev/null | tr '\n' ' ')
nsenter -t "$p3" -n nft list ruleset >"$rt/rules" 2>"$err"
sed 's/^/#   /' "$rt/rules"
check "with a NIC, QEMU's namespace has loopback only and nftables rules on its UID" '[ "$ifaces" = "lo " ] && grep -q "meta skuid != $u3 accept" "$rt/rules" && grep -q "reject with tcp reset" "$rt/rules" && grep -qx "[[:space:]]*drop" "$rt/rules"'
asq() { nsenter -t "$p3" -n setpriv --reuid="$u3" --regid="$u3" --clear-groups /usr/bin/python3 -c "import socket
try:
  $1
  print('open')
except Exception as e: print(type(e).__name__)" 2>&1; }
r1=$(asq 'socket.create_connection(("198.51.100.7", 80), 5)')
r2=$(asq 'socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("203.0.113.10", 9))')
r3=$(asq 'socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP)')
echo "# as QEMU's UID in its namespace: denied TCP $r1, UDP $r2, ping socket $r3; ping_group_range $(nsenter -t "$p3" -n cat /proc/sys/net/ipv4/ping_group_range)"
check "as QEMU's UID, a denied address is reset and other UDP and ICMP go nowhere" '[ "$r1" = ConnectionRefusedError ] && [ "$r2" = PermissionError ] && [ "$r3" = PermissionError ]'
ls -l "/proc/$pol/fd" 2>/dev/null | awk 'NR > 1 { print "#   fd " $(NF-2) " " $NF }'
check "the policy process runs as a user of its own, with no_new_privs, in QEMU's cgroup and the host's namespace" '[ -n "$pol" ] && [ "$pu" != "$u3" ] && [ "$(status NoNewPrivs "$pol")" = 1 ] && [ "$(cgdir "$pol" memory)" = "$(cgdir "$p3" memory)" ] && [ "$(readlink "/proc/$pol/ns/net")" = "$(readlink /proc/self/ns/net)" ]'
check "it holds no disk and no image" '[ -n "$pol" ] && ! ls -l "/proc/$pol/fd" | grep -Eq "\.(ext4|erofs)|/images/"'
check "its connector runs as the same user in QEMU's namespace" '[ -n "$con" ] && [ "$(status NoNewPrivs "$con")" = 1 ] && [ "$(cgdir "$con" memory)" = "$(cgdir "$p3" memory)" ]'
# Each helper: mount and IPC namespaces of its own, a read-only root
# holding /dev/null (and, for the policy process, the host's resolver).
tree() { (cd "/proc/$1/root" 2>/dev/null && find . -mindepth 1 -maxdepth 3 | sort | tr '\n' ' '); }
own_ns() { [ -n "$1" ] && [ "$(readlink "/proc/$1/ns/mnt")" != "$(readlink /proc/self/ns/mnt)" ] && [ "$(readlink "/proc/$1/ns/ipc")" != "$(readlink /proc/self/ns/ipc)" ] && awk '$5 == "/" { print $6 }' "/proc/$1/mountinfo" | grep -q "^ro,"; }
pt=$(tree "$pol"); ct=$(tree "$con")
echo "# policy process's root: $(echo "$pt" | cut -c1-300)"
echo "# connector's root: $(echo "$ct" | cut -c1-300)"
check "the policy process and the connector have mount and IPC namespaces of their own and read-only roots" 'own_ns "$pol" && own_ns "$con"'
check "holding /dev/null and the host's resolver files only, and /dev/null only" '[ -z "$(echo " $pt" | sed "s# \./dev/null##; s# \./dev##; s# \./etc/\(resolv.conf\|hosts\|nsswitch.conf\|host.conf\|gai.conf\)##g; s# \./etc##; s/ //g")" ] && cmp -s /etc/resolv.conf "/proc/$pol/root/etc/resolv.conf" && [ "$ct" = "./dev ./dev/null " ]'
# slirp sends the guest's DNS over TCP to 127.0.0.1:53 in QEMU's
# namespace, which the deny set covers: it must reach the policy process.
c exec n3 -- sh -c 'nc -w 3 10.0.2.3 53 </dev/null; echo rc=$?' >"$out" 2>&1
check "the guest's DNS over TCP reaches the policy process, not a reset" 'grep -q "^rc=0" "$out" && ! grep -qi refused "$out"'
cg3=$(cgdir "$p3" memory)
c stop n3 >"$out" 2>"$err"
check "stop ends QEMU, the policy process and the connector, and removes the cgroup" '[ ! -d "/proc/$p3" ] && [ ! -d "/proc/$pol" ] && [ ! -d "/proc/$con" ] && [ ! -d "$cg3" ]'

# A shim killed outright: its QEMU dies with it and the cgroup is left
# behind, until a controller starts and recovers.
cg2=$(cgdir "$p2" memory)
kill -KILL "$(shim_pid j2)"
wait_for '[ ! -d "/proc/$p2" ]' 100
check "a killed shim leaves its jail's cgroup behind" '[ ! -d "/proc/$p2" ] && [ -d "$cg2" ]'
c serve --socket "$rt/serve.sock" >"$rt/serve.out" 2>"$rt/serve.err" &
spid=$!
wait_for '[ ! -d "$cg2" ]' 100
kill -TERM "$spid"
wait "$spid"
sed 's/^/# serve: /' "$rt/serve.err"
check "capsule serve removes leftover jails when it starts, and says so" '[ ! -d "$cg2" ] && grep -q "leftover jail cgroups removed" "$rt/serve.err" && [ -f "$(sbdir j2)/private.ext4" ]'

# A host that cannot give a protection (here: no cgroup file system where
# capsule is told to look).
CAPSULE_CGROUP_ROOT="$rt" c doctor >"$out" 2>"$err"
rc=$?
check "doctor names a missing protection and why" '[ "$rc" -eq 0 ] && grep -q "cgroup limits .*MISSING: $rt is not a cgroup" "$out" && grep -q "WARNING: protections are missing" "$out"'
CAPSULE_CGROUP_ROOT="$rt" CAPSULE_REQUIRE_JAIL=1 c doctor >"$out" 2>"$err"
rc=$?
check "with CAPSULE_REQUIRE_JAIL=1, doctor says VMs are refused (exit $rc)" '[ "$rc" -eq 1 ] && grep -q "REFUSED" "$out"'
CAPSULE_CGROUP_ROOT="$rt" c run -q -- echo ran >"$out" 2>"$err"
check "a VM started without a protection says so on stderr" 'grep -qx ran "$out" && grep -q "warning: QEMU runs without: cgroup limits" "$err"'
CAPSULE_CGROUP_ROOT="$rt" CAPSULE_REQUIRE_JAIL=1 c run -q -- echo ran >"$out" 2>"$err"
rc=$?
check "with CAPSULE_REQUIRE_JAIL=1 it refuses to start instead (exit $rc)" '[ "$rc" -eq 125 ] && ! grep -q ran "$out" && grep -q "CAPSULE_REQUIRE_JAIL=1 .*cgroup limits" "$err"'

c rm --force j1 >/dev/null 2>&1
c rm --force j2 >/dev/null 2>&1
c rm --force n3 >/dev/null 2>&1
clean_after "whole suite"
