#!/bin/sh
# /dev/kvm as devtmpfs makes it without udev (root:root 0600): as root
# the jail gives QEMU a node of its own and KVM runs, and doctor says so;
# a capsule that is not root (no jail: QEMU opens the host's node as that
# user) is told why and what to do, naming /dev/kvm, never with QEMU's
# bare "Could not access KVM kernel module". Run as root where /dev/kvm
# works (in L1); puts /dev/kvm's owner and mode back. Prints what it
# saw; exits 0 only when every step held.
#   tests/kvm/check-devkvm.sh BUILD/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
t=$(mktemp -d /tmp/devkvm.XXXXXX)
chmod 0755 "$t"
was=$(stat -c '%a %u:%g' /dev/kvm)
trap 'chown "${was#* }" /dev/kvm; chmod "${was%% *}" /dev/kvm; rm -rf "$t"' EXIT
bad=0
need() { # need WHAT 'CONDITION'
	if eval "$2"; then echo "ok: $1"; else echo "FAILED: $1 ($2)"; bad=$((bad + 1)); fi
}
chown 0:0 /dev/kvm && chmod 0600 /dev/kvm
echo "/dev/kvm: $(ls -l /dev/kvm)"

"$capsule" doctor >"$t/doc" 2>&1
accel=$(sed -n 's/^accel: *//p' "$t/doc")
echo "doctor as root: $accel"
need "as root, doctor picks KVM through the jail's own node" 'echo "$accel" | grep -q "^kvm (.*the jail makes its own node of /dev/kvm (10:232"'
"$capsule" doctor --json >"$t/json" 2>&1
need "doctor --json: kvm.writable (what a VM's QEMU can open) is true" 'python3 -c "import json, sys; d = json.load(open(sys.argv[1])); assert d[\"kvm\"][\"writable\"] and d[\"accel\"][\"name\"] == \"kvm\"" "$t/json"'
CAPSULE_REQUIRE_KVM=1 "$capsule" run -q -- uname -r >"$t/out" 2>"$t/err"
rc=$?
need "CAPSULE_REQUIRE_KVM=1 capsule run -- uname -r prints the capsule kernel ($rc)" '[ "$rc" -eq 0 ] && grep -q -- "-capsule$" "$t/out"'
[ "$rc" -eq 0 ] || sed 's/^/  stderr: /' "$t/err"

# Not root: no jail, so QEMU would open the host's 0600 node as uid 65534.
mkdir -p "$t/n" && chown 65534:65534 "$t/n"
nobody() { setpriv --reuid=65534 --regid=65534 --clear-groups env HOME="$t/n" CAPSULE_HOME="$t/n/home" XDG_RUNTIME_DIR="$t/n" "$@"; }
nobody "$capsule" doctor >"$t/doc" 2>&1
accel=$(sed -n 's/^accel: *//p' "$t/doc")
echo "doctor as uid 65534: $accel"
need "not root, doctor does not claim KVM: TCG, naming /dev/kvm, its mode and what to do" 'echo "$accel" | grep -q "^tcg (KVM not used: .*/dev/kvm (mode 0600, owner 0, group 0).*udev rule.*run capsule as root"'
nobody "$capsule" run --accel kvm -- true >"$t/out" 2>"$t/err"
rc=$?
echo "--accel kvm as uid 65534: exit $rc: $(cat "$t/err")"
need "not root, --accel kvm refuses (125) naming /dev/kvm and what to do, not in QEMU's words" '[ "$rc" -eq 125 ] && grep -q "/dev/kvm" "$t/err" && grep -q "run capsule as root" "$t/err" && ! grep -q "Could not access KVM kernel module" "$t/err"'
[ "$bad" -eq 0 ]
