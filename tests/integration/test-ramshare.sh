#!/bin/sh
# Shared template RAM (docs/architecture.md, "Shared template RAM"):
# restored jailed VMs map one sealed memfd per template, held by a
# `capsule ram-holder`. Its user cannot write it (tried as the jail's
# UID), a VM that writes its RAM does not change what the next restores,
# two VMs map the same pages and the VMs' cgroups hold no copy of them,
# CAPSULE_SHARED_RAM=0 gives the per-VM copy and says so, and the holder
# ends when its template goes or nothing uses it. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
# The holder ends 3 s after its last VM (10 minutes by default).
export CAPSULE_RAM_HOLDER_IDLE_S=3
c() { "$capsule" "$@"; }
say() { sed 's/^/#   /'; }
qemu_pid() { c inspect "$1" | sed -n 's/^processes: *shim [0-9]*, qemu \([0-9]*\)/\1/p'; }
holder() { pgrep -f "capsule ram-holder $CAPSULE_HOME/templates/" | head -1; }
# memfd_fd PID: a descriptor of PID's naming the template's memfd.
memfd_fd() { ls -l "/proc/$1/fd" 2>/dev/null | awk '/memfd:capsule-template-ram/ { print $9; exit }'; }
memfd_ino() { awk '/memfd:capsule-template-ram/ { print $5; exit }' "/proc/$1/maps" 2>/dev/null; }
v2=false
[ -f /sys/fs/cgroup/cgroup.controllers ] && v2=true
shmem_of() { # shmem_of PID: bytes of shmem charged to PID's memory cgroup
	if $v2; then d="/sys/fs/cgroup$(sed -n 's/^0:://p' "/proc/$1/cgroup")"
	else d="/sys/fs/cgroup/memory$(awk -F: '$2 ~ /(^|,)memory(,|$)/ { print $3 }' "/proc/$1/cgroup")"; fi
	awk '$1 == "shmem" { print $2 }' "$d/memory.stat"
}
mib() { echo $(($1 >> 20)); }

echo "1..15"
start=$(date +%s)

c doctor >"$out" 2>"$err"
grep '^shared RAM:' "$out" | say
check "doctor: shared template RAM is available" 'grep -q "^shared RAM: available: .*sealed memfd" "$out"'

c image build base >"$out" 2>"$err"
c create r1 >"$out" 2>"$err" && c exec r1 -- true >>"$out" 2>>"$err"
grep "restored from template" "$CAPSULE_HOME/sandboxes/r1/shim.log" | say
check "a restored sandbox says it maps the shared RAM" 'grep -q "restored from template [0-9a-f]* (shared RAM)" "$CAPSULE_HOME/sandboxes/r1/shim.log"'
q1=$(qemu_pid r1)
h=$(holder)
tdir=$(tr '\0' '\n' <"/proc/$h/cmdline" 2>/dev/null | tail -1)
qfd=$(memfd_fd "$q1")
hfd=$(memfd_fd "$h")
echo "# QEMU $q1 holds the memfd as fd $qfd; holder $h as fd $hfd; template $tdir"
check "QEMU holds the template's memfd and maps it privately (rw-p)" '[ -n "$qfd" ] && [ -n "$hfd" ] && grep -q "rw-p .*memfd:capsule-template-ram" "/proc/$q1/maps"'

# The proc the jail opened the memfd through is detached before QEMU
# runs, also when capsule itself runs in a chroot (its root then is not
# its mount namespace's first one, where joining that namespace lands).
procs_in() { grep -c ' - proc ' "/proc/$1/mountinfo" 2>/dev/null; }
check "QEMU's mount namespace holds no proc" '[ -n "$q1" ] && [ "$(procs_in "$q1")" -eq 0 ]'
mkdir -p "$rt/chroot"
unshare -m sh -c 'mount --rbind / "$1" && exec chroot "$1" "$2" run -q -v -- sleep 8' sh "$rt/chroot" "$capsule" >"$out" 2>"$err" &
cr=$!
wait_for 'grep -q "restored from template" "$err"' 300
qc=$(pgrep -n -f "qemu-system.*$rt/")
grep "restored from template" "$err" | say
echo "# QEMU $qc, run from a chroot: $(procs_in "$qc") proc mount(s) in its namespace"
check "run from a chroot: the VM maps the shared RAM and its namespace holds no proc" 'grep -q "restored from template [0-9a-f]* (shared RAM)" "$err" && [ -n "$qc" ] && [ "$qc" != "$q1" ] && [ "$(procs_in "$qc")" -eq 0 ]'
wait "$cr"
umount -R "$rt/chroot" 2>/dev/null

# (1) As the jail's user, with QEMU's own descriptor: every way of
# writing is refused, though reading works.
uid=$(awk '$1 == "Uid:" { print $2 }' "/proc/$q1/status")
cat >"$rt/write.py" <<'EOF'
import errno, mmap, os, sys
path = sys.argv[1]
def attempt(name, fn):
    try:
        fn()
        print("WROTE %s" % name)
    except OSError as e:
        print("refused %s: %s" % (name, errno.errorcode.get(e.errno, e.errno)))
fd = os.open(path, os.O_RDONLY)
print("read %d bytes" % len(os.pread(fd, 4096, 0)))
os.close(fd)
fd = os.open(path, os.O_RDWR)  # memfds reopen read-write: the seals are what hold
attempt("write", lambda: os.pwrite(fd, b"x" * 4096, 0))
attempt("mmap shared writable", lambda: mmap.mmap(fd, 4096, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE))
attempt("ftruncate shrink", lambda: os.ftruncate(fd, 4096))
attempt("ftruncate grow", lambda: os.ftruncate(fd, 1 << 40))
attempt("fallocate punch hole", lambda: os.posix_fallocate(fd, 0, 1 << 41))
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
def punch():
    if libc.fallocate(fd, 3, ctypes.c_long(0), ctypes.c_long(1 << 20)) != 0:
        raise OSError(ctypes.get_errno(), "fallocate")
attempt("fallocate(PUNCH_HOLE)", punch)
EOF
setpriv --reuid="$uid" --regid="$uid" --clear-groups /usr/bin/python3 - "/proc/$q1/fd/$qfd" <"$rt/write.py" >"$out" 2>"$err"
say <"$out"
check "as QEMU's user ($uid): the memfd reads, and write, shared writable mmap, ftruncate and fallocate are all refused" \
	'grep -q "^read 4096 bytes" "$out" && [ "$(grep -c "^refused .*EPERM" "$out")" -eq 6 ] && ! grep -q WROTE "$out"'

elapsed "r1 checked"
# (2) Two more VMs: all three map the same memfd, and their cgroups hold
# no copy of it (the per-VM copy was charged to each VM's cgroup).
c create r2 >"$out" 2>"$err" && c exec r2 -- true >>"$out" 2>>"$err"
c create r3 >>"$out" 2>>"$err" && c exec r3 -- true >>"$out" 2>>"$err"
q2=$(qemu_pid r2)
q3=$(qemu_pid r3)
i1=$(memfd_ino "$q1"); i2=$(memfd_ino "$q2"); i3=$(memfd_ino "$q3")
echo "# memfd inode mapped by QEMU $q1: $i1, $q2: $i2, $q3: $i3"
check "three QEMUs map the same memfd" '[ -n "$i1" ] && [ "$i1" = "$i2" ] && [ "$i2" = "$i3" ]'
copy=$(($(stat -c %b "$tdir/ram") * 512))
inmem=$(($(stat -L -c %b "/proc/$h/fd/$hfd") * 512))
s1=$(shmem_of "$q1"); s2=$(shmem_of "$q2"); s3=$(shmem_of "$q3")
held=$((inmem + s1 + s2 + s3))
echo "# one copy: $(mib "$copy") MiB (the template file's data); the memfd's pages $(mib "$inmem") MiB; shmem in the VMs' cgroups: $(mib "$s1"), $(mib "$s2"), $(mib "$s3") MiB"
check "three VMs hold less than 1.5 copies of the template's RAM ($(mib "$held") MiB)" '[ "$copy" -gt 0 ] && [ $((held * 2)) -lt $((copy * 3)) ]'

elapsed "sharing checked"
# (3) A VM that writes 32 MiB into its RAM changes nothing of the memfd
# (the next VM restored, below, starts from it); the pages it wrote
# first were holes of the memfd, which the kernel fills with zeroes.
sum_before=$(sha256sum <"/proc/$h/fd/$hfd" | cut -d' ' -f1)
sum_file=$(sha256sum <"$tdir/ram" | cut -d' ' -f1)
c exec r1 -- sh -c 'dd if=/dev/zero of=/dev/shm/fill bs=1048576 count=32 2>/dev/null && echo filled' >"$out" 2>"$err"
grown=$(($(stat -L -c %b "/proc/$h/fd/$hfd") * 512 - copy))
sum_after=$(sha256sum <"/proc/$h/fd/$hfd" | cut -d' ' -f1)
echo "# the memfd's pages grew by $(mib "$grown") MiB (holes the guest wrote first, filled with zeroes)"
echo "# memfd sha256 before $sum_before, after $sum_after; template file $sum_file"
check "a VM wrote 32 MiB into its RAM" 'grep -qx filled "$out"'
check "the memfd is unchanged by it and equals the template's RAM file" '[ "$sum_before" = "$sum_after" ] && [ "$sum_after" = "$sum_file" ]'

elapsed "fill checked"
# (4) CAPSULE_SHARED_RAM=0: the per-VM copy, in the VM's cgroup.
CAPSULE_SHARED_RAM=0 c run -v -- true >"$out" 2>"$err"
check "CAPSULE_SHARED_RAM=0: run -v says the RAM was copied and why" 'grep -q "restored from template [0-9a-f]* (RAM copied: CAPSULE_SHARED_RAM=0)$" "$err"'
CAPSULE_SHARED_RAM=0 c create r4 >"$out" 2>"$err" && CAPSULE_SHARED_RAM=0 c exec r4 -- true >>"$out" 2>>"$err"
q4=$(qemu_pid r4)
s4=$(shmem_of "$q4")
echo "# QEMU $q4 (per-VM copy): shmem in its cgroup $(mib "${s4:-0}") MiB, maps the memfd: $(memfd_ino "$q4" | grep -c .)"
check "CAPSULE_SHARED_RAM=0: the VM holds its own copy, not the memfd" '[ -z "$(memfd_ino "$q4")" ] && [ "${s4:-0}" -gt $((copy * 3 / 4)) ]'

elapsed "copy checked"
# The holder ends when its template goes; running VMs keep their RAM.
c template prune >"$out" 2>"$err"
wait_for '! kill -0 "$h" 2>/dev/null' 60
check "the holder ends when its template is removed" '! kill -0 "$h" 2>/dev/null'
c exec r1 -- echo still >"$out" 2>"$err"
check "a running VM keeps working without its holder" 'grep -qx still "$out"'

c stop r1 r2 r3 r4 >/dev/null 2>&1 || for s in r1 r2 r3 r4; do c stop "$s" >/dev/null 2>&1; done
c run -- true >/dev/null 2>&1	# a new template, a new holder, no VM left
h2=$(holder)
wait_for '[ -z "$(holder)" ]' 100
echo "# a new holder $h2 for the rebuilt template"
check "a new holder ends once no VM has used it for a while" '[ -n "$h2" ] && [ -z "$(holder)" ]'
elapsed "done"
