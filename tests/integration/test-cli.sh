#!/bin/sh
# Black-box tests of the capsule CLI against real VMs. TAP output.
# Each VM's sockets live under a private XDG_RUNTIME_DIR, so that the test
# can tell its own QEMU processes and leftovers from anyone else's.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"

echo "1..136"

"$capsule" --version >"$out" 2>"$err"
check "--version" 'grep -q '\''^capsule [0-9]'\'' "$out"'
"$capsule" --help >"$out" 2>"$err" && "$capsule" run --help >>"$out" 2>>"$err"
check "--help and run --help" 'grep -q -- '\''--timeout S'\'' "$out"'

"$capsule" run -q -- sh -c 'exit 7' >"$out" 2>"$err"
rc=$?
check "exit code 7 passes through" '[ "$rc" -eq 7 ]'

"$capsule" run -q -- sh -c 'echo to-out; echo to-err >&2' >"$out" 2>"$err"
check "stdout and stderr arrive separately" '[ "$(cat "$out")" = to-out ] && grep -qx to-err "$err"'

"$capsule" run -q -- sh -c 'yes | head -c 1000000' >"$out" 2>"$err"
size=$(wc -c <"$out")
marker_len=$(printf '\n[capsule: output truncated at 262144 bytes]\n' | wc -c)
check "1 MB of output is cut at 256 KiB plus the marker ($size bytes)" '[ "$size" -le $((262144 + marker_len)) ] && [ "$size" -gt 262144 ]'
check "the truncation marker is visible" 'tail -c 100 "$out" | grep -q "output truncated at 262144 bytes" && grep -q "output cap" "$err"'

start=$(date +%s)
"$capsule" run -q --timeout 2 -- sleep 100 >"$out" 2>"$err"
rc=$?
took=$(( $(date +%s) - start ))
check "--timeout 2 kills sleep 100 (exit $rc after ${took}s)" '[ "$rc" -eq 124 ] && [ "$took" -lt 20 ]'
check "the timeout is named in the message" 'grep -q '\''timed out after 2 s'\'' "$err"'

"$capsule" run -q -- sh -c 'kill -9 $$' >"$out" 2>"$err"
rc=$?
check "death by signal 9 gives 137" '[ "$rc" -eq 137 ]'

"$capsule" run -q -- no-such-command >"$out" 2>"$err"
rc=$?
check "a missing command gives 127 and names it" '[ "$rc" -eq 127 ] && grep -q "no-such-command" "$err"'

printf 'line1\nline2\n' | "$capsule" run -q -- sh -c 'wc -l' >"$out" 2>"$err"
check "piped stdin is forwarded" 'grep -qx 2 "$out"'

"$capsule" run -q -- sh -c 'id -u' >"$out" 2>"$err"
check "commands run as UID 1000" 'grep -qx 1000 "$out"'

# Ctrl-C: the command is interrupted and the VM removed.
: >"$out"	# not the "started" of a command before
"$capsule" run -q -- sh -c 'echo started; sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
kill -INT "$pid"
wait "$pid"
rc=$?
check "Ctrl-C stops the command (exit $rc)" '[ "$rc" -eq 130 ]'
clean_after "Ctrl-C"

# A guest that does not end a command on time (its QEMU frozen with
# SIGSTOP) is given up on at the timeout + 5 s and its VM destroyed.
# $out still says "started" from the Ctrl-C test: emptied first, or the
# wait below could end before this command's redirection (a run under
# load froze no QEMU that way).
: >"$out"
timeout -s KILL 30 "$capsule" run -q --timeout 2 -- sh -c 'echo started; exec sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
s0=$(date +%s%N)
kill -STOP $(pgrep -f "qemu-system.*$rt/capsule-")
wait "$pid"
rc=$?
ms=$((($(date +%s%N) - s0) / 1000000))
check "run: a frozen guest is given up on at the timeout + 5 s (exit $rc after $ms ms)" \
	'[ "$rc" -eq 124 ] && [ "$ms" -lt 8000 ] && grep -q "did not end it within 5 s more" "$err" && grep -q "destroying the VM" "$err"'
clean_after "a frozen guest"

# QEMU runs confined by what capsule sets before exec: seccomp filter
# mode, no new privileges, no core dumps.
: >"$out"	# not the "started" of a command before
"$capsule" run -q -- sh -c 'echo started; sleep 5' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
qpid=$(pgrep -f "qemu-system.*$rt/capsule-" | head -1)
status=$(cat /proc/"$qpid"/status 2>/dev/null)
limits=$(cat /proc/"$qpid"/limits 2>/dev/null)
check "QEMU runs with seccomp (mode 2) and no_new_privs" 'echo "$status" | grep -q "^Seccomp:[[:space:]]*2" && echo "$status" | grep -q "^NoNewPrivs:[[:space:]]*1"'
check "QEMU may not dump core" 'echo "$limits" | grep -q "^Max core file size *0 *0 "'
wait "$pid"

# SIGKILL of capsule itself: QEMU must not outlive it.
: >"$out"	# not the "started" of a command before
"$capsule" run -q -- sh -c 'echo started; sleep 100' >"$out" 2>"$err" &
pid=$!
wait_for 'grep -q started "$out" 2>/dev/null'
kill -KILL "$pid"
wait "$pid" 2>/dev/null
wait_for '[ "$(ours)" -eq 0 ]' 50
check "QEMU dies with a SIGKILLed capsule" '[ "$(ours)" -eq 0 ]'
rm -rf "$rt"/capsule-*	# a SIGKILLed process cannot clean its run dir

# A failed boot: a kernel that is not a kernel.
printf 'not a kernel' >"$rt/bad-vmlinux"
CAPSULE_KERNEL="$rt/bad-vmlinux" "$capsule" run -q -- true >"$out" 2>"$err"
rc=$?
check "a broken kernel fails with 125 and QEMU's words" '[ "$rc" -eq 125 ] && grep -q "QEMU exited while setting the machine up" "$err" && grep -q "^QEMU said:" "$err"'
check "QEMU's words are given once, not again for the template" '[ "$(grep -c "^qemu" "$err")" -eq 1 ] && ! grep -q "before it:" "$err"'
rm -f "$rt/bad-vmlinux"
clean_after "failed boot"

CAPSULE_KERNEL=/nonexistent/vmlinux "$capsule" run -q -- true >"$out" 2>"$err"
rc=$?
check "a missing kernel is named, with what to do" '[ "$rc" -eq 125 ] && grep -q "/nonexistent/vmlinux" "$err" && grep -q "make kernel" "$err"'

# Sizes: refused at request time with exit 2, naming the value and the
# bound, on run and create alike; --force-size lifts the host's bounds.
ncpu=$(getconf _NPROCESSORS_ONLN)
total=$(awk '/^MemTotal:/ { print int($2 / 1024) }' /proc/meminfo)
reserve=$((total / 10 > 512 ? total / 10 : 512))
most=$((total - reserve))
avail=$(df -Pm "$rt" | awk 'NR == 2 { print $4 }')
"$capsule" image build base >/dev/null 2>&1
refused() { # refused VERB 'OPTIONS' 'MESSAGE'
	if [ "$1" = run ]; then "$capsule" run -q $2 -- true >"$out" 2>"$err"
	else "$capsule" create sz $2 >"$out" 2>"$err"; fi
	rc=$? want=$3
	check "$1 $2 is refused with exit 2 ($rc), naming the value and the bound" '[ "$rc" -eq 2 ] && grep -qF -- "$want" "$err" && [ ! -e "$CAPSULE_HOME/sandboxes/sz" ]'
}
for verb in run create; do
	refused $verb "--cpus 0" "--cpus 0 is out of range: 1 to 16 vCPUs"
	refused $verb "--cpus 17" "--cpus 17 is out of range: 1 to 16 vCPUs"
	if [ "$ncpu" -lt 16 ]; then
		refused $verb "--cpus $((ncpu + 1))" "--cpus $((ncpu + 1)) is more than this host's $ncpu online CPUs"
	else
		skip "$verb --cpus above the host's CPUs is refused" "this host has 16 CPUs or more"
	fi
	refused $verb "--memory 127" "--memory 127 MiB is out of range: 128 to 1048576 MiB"
	refused $verb "--memory $((most + 1))" "--memory $((most + 1)) MiB is more than this host can give: at most $most MiB (its $total MiB less a reserve of $reserve MiB"
done
refused create "--root-size 15" "--root-size 15 MiB is out of range: 16 to 1048576 MiB"
refused create "--work-size 1048577" "--work-size 1048577 MiB is out of range: 16 to 1048576 MiB"
if [ "$avail" -lt $((1048576 - 1024)) ]; then
	refused create "--work-size $((avail + 1024))" "--work-size $((avail + 1024)) MiB ($((avail + 1024 + 256)) MiB together) are more than the"
else
	skip "create --work-size above the free space is refused" "more than 1 TiB free"
fi
"$capsule" create sz --memory "$most" >"$out" 2>"$err"
rc=$?
check "create --memory $most, the host's bound itself, is accepted" '[ "$rc" -eq 0 ]'
"$capsule" rm sz >/dev/null 2>&1
if [ "$ncpu" -lt 16 ]; then
	"$capsule" run -q --force-size --cpus $((ncpu + 1)) -- nproc >"$out" 2>"$err"
	check "run --force-size --cpus $((ncpu + 1)) boots a guest with $((ncpu + 1)) vCPUs" 'grep -qx $((ncpu + 1)) "$out"'
	"$capsule" create sz --force-size --cpus $((ncpu + 1)) >"$out" 2>"$err"
	check "create --force-size --cpus $((ncpu + 1)) is accepted" '[ $? -eq 0 ] && grep -q "created sandbox sz" "$out"'
else
	skip "run --force-size above the host's CPUs" "this host has 16 CPUs or more"
	"$capsule" create sz >"$out" 2>"$err"
	skip "create --force-size above the host's CPUs" "this host has 16 CPUs or more"
fi
# A sandbox's disks are its owner's only; QEMU gets descriptors from the jail.
modes=$(cd "$CAPSULE_HOME/sandboxes/sz" && stat -c '%a %n' root-upper.ext4 private.ext4 source.erofs | tr '\n' ' ')
check "a created sandbox's disk files are 0600 ($modes)" '[ "$modes" = "600 root-upper.ext4 600 private.ext4 600 source.erofs " ]'
"$capsule" exec sz -- true >"$out" 2>"$err"
check "a sandbox with 0600 disks starts and runs a command" '[ $? -eq 0 ]'
"$capsule" rm --force sz >/dev/null 2>&1

# rm and stop take several names: each is tried, a failure is told by
# name and does not stop the rest; the first failure's status is kept.
"$capsule" create ma >/dev/null 2>&1 && "$capsule" create mb >/dev/null 2>&1
"$capsule" stop ma mb >"$out" 2>"$err"
check "stop of two stopped sandboxes succeeds" '[ $? -eq 0 ]'
"$capsule" rm ma no-such-one mb >"$out" 2>"$err"
rc=$?
check "rm ma no-such-one mb: 125, naming the missing one (rc $rc)" '[ "$rc" -eq 125 ] && grep -q "no sandbox named '\''no-such-one'\''" "$err"'
check "... and both others are removed all the same" '[ ! -e "$CAPSULE_HOME/sandboxes/ma" ] && [ ! -e "$CAPSULE_HOME/sandboxes/mb" ]'
"$capsule" rm >"$out" 2>"$err"
check "rm with no name is a usage error (2)" '[ $? -eq 2 ] && grep -q "NAME\.\.\." "$err"'


# Network flags (docs/network.md): a bad value is refused when the flag is
# parsed, with exit 2 and a message quoting it, on every verb that takes
# them; serve and mcp exit before they listen. No VM boots here. The
# route printed is "direct" unless the environment names a proxy.
unset HTTPS_PROXY https_proxy HTTP_PROXY http_proxy ALL_PROXY all_proxy NO_PROXY no_proxy
"$capsule" create n0 >/dev/null 2>&1
rec0=$(cat "$CAPSULE_HOME/sandboxes/n0/record.json")
net_refused() { # net_refused VERB FLAG VALUE
	verb=$1 flag=$2 value=$3
	rm -f "$CAPSULE_HOME/serve.sock" "$rt/n.sock"
	case $verb in
	run) timeout 60 "$capsule" run -q "$flag" "$value" -- true ;;
	create) timeout 60 "$capsule" create nx "$flag" "$value" ;;
	net-set) timeout 60 "$capsule" net set n0 "$flag" "$value" ;;
	serve) timeout 20 "$capsule" serve --socket "$rt/n.sock" "$flag" "$value" ;;
	mcp) timeout 20 "$capsule" mcp --agent a "$flag" "$value" </dev/null ;;
	esac >"$out" 2>"$err"
	rc=$?
	check "$verb $flag '$value' is refused at parse time with exit 2 ($rc), quoting it" \
		'[ "$rc" -eq 2 ] && grep -qF -- "$flag \"$value\"" "$err" && [ "$(ours)" -eq 0 ] &&
		 [ ! -e "$CAPSULE_HOME/sandboxes/nx" ] && [ ! -e "$rt/n.sock" ] &&
		 [ ! -e "$CAPSULE_HOME/serve.sock" ] && [ ! -s "$out" ] &&
		 [ "$(cat "$CAPSULE_HOME/sandboxes/n0/record.json")" = "$rec0" ]'
}
for verb in run create net-set serve mcp; do
	net_refused $verb --allow-egress 'bad rule'
	net_refused $verb --allow-egress 1.2.3.4/33
	net_refused $verb --allow-egress '*'
	net_refused $verb --publish 99999:80
	net_refused $verb --publish 8080
done
check "the refusals say what to write instead" \
	'"$capsule" run --allow-egress "*" -- true 2>&1 | grep -q -- "--allow-public" &&
	 "$capsule" run --allow-egress 1.2.3.4/33 -- true 2>&1 | grep -q "0 to 32" &&
	 "$capsule" run --publish 8080 -- true 2>&1 | grep -q "HOST_PORT:GUEST_PORT"'
for verb in run create serve mcp net; do
	"$capsule" $verb --help >"$out" 2>"$err"
	rc=$?
	check "$verb --help lists the network flags" '[ "$rc" -eq 0 ] &&
		(for f in --allow-egress --allow-public --allow-lan --allow-host --publish --auto-publish; do
			grep -q -- "^ *$f" "$out" || exit 1
		done)'
done

# run -v says the policy and the route before it boots (a missing kernel
# stops it right after: no VM needed to see them).
CAPSULE_KERNEL=/nonexistent/vmlinux "$capsule" run -v --allow-egress 203.0.113.10 --allow-host -- true >"$out" 2>"$err"
check "run -v prints the policy and the route" \
	'grep -qx "capsule: network: --allow-host --allow-egress 203.0.113.10" "$err" &&
	 grep -q "^capsule: network route: direct" "$err"'
CAPSULE_KERNEL=/nonexistent/vmlinux "$capsule" run -v -- true >"$out" 2>"$err"
check "run -v without network flags says there is no network interface" \
	'grep -qx "capsule: network: none (no network interface)" "$err" && ! grep -q "network route" "$err"'

"$capsule" net >"$out" 2>"$err"
rc=$?
check "net without arguments prints its usage, exit 2 ($rc)" '[ "$rc" -eq 2 ] && grep -q "Usage: capsule net" "$err"'
"$capsule" net bogus x >"$out" 2>"$err"
rc=$?
check "net bogus x: exit 2 ($rc) naming the subcommand" '[ "$rc" -eq 2 ] && grep -q "bogus" "$err"'
"$capsule" net show nosuch >"$out" 2>"$err"
rc=$?
check "net show nosuch: exit 125 ($rc) naming the sandbox" '[ "$rc" -eq 125 ] && grep -q "nosuch" "$err"'
"$capsule" net log nosuch >"$out" 2>"$err"
rc=$?
check "net log nosuch: exit 125 ($rc) naming the sandbox" '[ "$rc" -eq 125 ] && grep -q "nosuch" "$err"'
"$capsule" net set n0 >"$out" 2>"$err"
rc=$?
check "net set without a flag is refused with exit 2 ($rc)" '[ "$rc" -eq 2 ] && grep -q -- "--none" "$err"'
"$capsule" net set --allow-lan >"$out" 2>"$err"
rc=$?
check "net set without NAME is refused with exit 2 ($rc), asking for it" '[ "$rc" -eq 2 ] && grep -q "NAME" "$err"'
"$capsule" net set n0 extra --allow-lan >"$out" 2>"$err"
rc=$?
check "net set with a stray argument is refused with exit 2 ($rc), naming it" '[ "$rc" -eq 2 ] && grep -q "extra" "$err"'

# The policy is recorded with a named sandbox: record.json, net show,
# inspect; net set replaces it; --none removes it.
record() { cat "$CAPSULE_HOME/sandboxes/$1/record.json"; }
# words NAME: the record's "network" list, one word a line ("-" when absent)
words() {
	python3 -c 'import json, sys
r = json.load(open(sys.argv[1]))
print("\n".join(r["network"]) if "network" in r else "-")' "$CAPSULE_HOME/sandboxes/$1/record.json"
}
"$capsule" create n1 --allow-egress 203.0.113.10 --allow-egress '*.example.com:443' --allow-lan \
	--publish 127.0.0.1:18080:80 >"$out" 2>"$err"
rc=$?
want1='allow-lan
allow-egress=203.0.113.10
allow-egress=*.example.com:443
publish=127.0.0.1:18080:80'
policy1='--allow-lan --allow-egress 203.0.113.10 --allow-egress *.example.com:443 --publish 127.0.0.1:18080:80'
check "create with network flags records them as words ($(words n1 | tr '\n' ' '))" \
	'[ "$rc" -eq 0 ] && [ "$(words n1)" = "$want1" ] && grep -qxF "network: $policy1" "$out"'
"$capsule" net show n1 >"$out" 2>"$err"
rc=$?
check "net show prints the policy and the route" \
	'[ "$rc" -eq 0 ] && grep -qxF "network: $policy1" "$out" && grep -q "^route: *direct" "$out"'
env HTTPS_PROXY=http://proxy.invalid:3128 NO_PROXY=.internal.example "$capsule" net show n1 >"$out" 2>"$err"
check "net show names the host's upstream proxy and NO_PROXY in the route" \
	'grep -q "^route: .*http://proxy.invalid:3128 (HTTPS_PROXY)" "$out" && grep -q "NO_PROXY bypass: .internal.example" "$out"'
"$capsule" inspect n1 >"$out" 2>"$err"
rc=$?
check "inspect prints the policy and the route" \
	'[ "$rc" -eq 0 ] && grep -qxF "network:    $policy1" "$out" && grep -q "^route: *direct" "$out"'
"$capsule" net set n1 --allow-public >"$out" 2>"$err"
rc=$?
check "net set --allow-public replaces the whole policy" \
	'[ "$rc" -eq 0 ] && [ "$(words n1)" = allow-public ] && grep -qx "network: --allow-public" "$out" &&
	 "$capsule" net show n1 | grep -qx "network: --allow-public"'
"$capsule" net set n1 --none --allow-lan >"$out" 2>"$err"
rc=$?
check "net set with both --none and a flag: exit 2 ($rc), record unchanged" \
	'[ "$rc" -eq 2 ] && grep -q -- "--none" "$err" && [ "$(words n1)" = allow-public ]'
"$capsule" net set n1 --none >"$out" 2>"$err"
rc=$?
check "net set --none removes the policy (no network key)" \
	'[ "$rc" -eq 0 ] && [ "$(words n1)" = - ] && ! record n1 | grep -q "\"network\"" &&
	 "$capsule" inspect n1 | grep -qx "network: *none (no network interface)" &&
	 ! "$capsule" inspect n1 | grep -q "^route:"'
"$capsule" net log n1 >"$out" 2>"$err"
rc=$?
check "net log on a sandbox with no log prints nothing, exit 0" '[ "$rc" -eq 0 ] && [ ! -s "$out" ] && [ ! -s "$err" ]'
check "a sandbox created without network flags records no network" \
	'[ "$(words n0)" = - ] && "$capsule" net show n0 | grep -qx "network: none (no network interface)"'
# A record edited by hand to hold a bad word: inspect fails naming the
# file and the word, and so does every verb that reads it.
f1=$CAPSULE_HOME/sandboxes/n1/record.json
python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); r["network"] = ["allow-lan", "allow-egress=1.2.3.4/33"]
json.dump(r, open(sys.argv[1], "w"))' "$f1"
"$capsule" inspect n1 >"$out" 2>"$err"
rc=$?
check "inspect of a record with a bad network word fails ($rc), naming the file and the word" \
	'[ "$rc" -eq 125 ] && grep -qF "$f1" "$err" && grep -qF "allow-egress" "$err" && grep -qF "1.2.3.4/33" "$err" &&
	 [ "$(grep -c "recorded network flag" "$err")" -eq 1 ]'
"$capsule" net show n1 >"$out" 2>"$err"
rc=$?
check "net show of it fails too ($rc), naming the file" '[ "$rc" -eq 125 ] && grep -qF "$f1" "$err"'
python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); r["network"] = ["allow-lan", "bogus"]
json.dump(r, open(sys.argv[1], "w"))' "$f1"
"$capsule" inspect n1 >"$out" 2>"$err"
rc=$?
check "an unknown recorded word fails ($rc), naming it" '[ "$rc" -eq 125 ] && grep -qF "$f1" "$err" && grep -q "bogus" "$err"'
python3 -c 'import json, sys
r = json.load(open(sys.argv[1])); r["network"] = "allow-lan"
json.dump(r, open(sys.argv[1], "w"))' "$f1"
"$capsule" inspect n1 >"$out" 2>"$err"
rc=$?
check "a recorded \"network\" that is not a list fails ($rc), naming the file" '[ "$rc" -eq 125 ] && grep -qF "$f1" "$err" && grep -q "network" "$err"'
"$capsule" rm n1 >/dev/null 2>&1
"$capsule" rm n0 >/dev/null 2>&1
check "the network checks booted no VM" '[ "$(ours)" -eq 0 ]'

"$capsule" run >"$out" 2>"$err"
rc=$?
check "run without a command is refused" '[ "$rc" -eq 2 ]'

"$capsule" doctor >"$out" 2>"$err"
if grep -qE '^flags.* (vmx|svm)' /proc/cpuinfo && [ -w /dev/kvm ]; then
	check "doctor names KVM on a host with hardware virtualization" 'grep -q '\''^accel: *kvm'\'' "$out"'
	skip "--accel kvm refuses without KVM" "this host has usable KVM"
else
	check "doctor names TCG and why KVM was not used" 'grep -q "^accel: *tcg (KVM not used: " "$out" && grep -q "WARNING" "$out"'
	"$capsule" run --accel kvm -- true >"$out" 2>"$err"
	rc=$?
	check "--accel kvm refuses to start without KVM" '[ "$rc" -eq 125 ] && grep -q "asks for KVM" "$err"'
fi

# A fresh install: the first create builds the base image, saying so.
CAPSULE_HOME="$rt/fresh" "$capsule" create f1 >"$out" 2>"$err"
rc=$?
check "on a fresh install, create builds the base image first and says so" '[ "$rc" -eq 0 ] && grep -q "the base image is not built yet; building it now" "$err" && [ -L "$rt/fresh/images/names/base" ] && grep -q "^created sandbox f1 (image base" "$out"'
CAPSULE_HOME="$rt/fresh" "$capsule" rm f1 >/dev/null 2>&1
# ... and capsule serve checks its image at start: the base is built then.
CAPSULE_HOME="$rt/fresh2" "$capsule" serve --socket "$rt/f.sock" >"$out" 2>"$err" &
spid=$!
i=0; while [ $i -lt 100 ] && [ ! -S "$rt/f.sock" ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
check "capsule serve on a fresh install builds the base image at start and says so" 'grep -q "image base: the base image is not built yet; building it now" "$err" && [ -L "$rt/fresh2/images/names/base" ]'
CAPSULE_HOME="$rt/fresh2" "$capsule" serve --image nosuch --socket "$rt/f.sock" >"$out" 2>"$err" &
spid=$!
i=0; while [ $i -lt 100 ] && [ ! -S "$rt/f.sock" ]; do sleep 0.1; i=$((i + 1)); done
kill -TERM $spid 2>/dev/null; wait $spid 2>/dev/null
check "capsule serve with an image that is not there says how to get it, and still starts" 'grep -q "no image named .nosuch.; see .capsule image ls." "$err" && grep -q "every call that creates a sandbox fails until it is there" "$err" && grep -q "ready" "$err"'

# --- Output for programs and people (issue 17): --json, exit codes,
# progress in a pipe, -q, logs, Docker's -v refused. One sandbox (j)
# serves every check that needs one.
"$capsule" --help >"$out" 2>"$err"
check "--help gives shell its own line and lists logs and prepare" \
	'grep -q "^  shell  *Open an interactive shell" "$out" && grep -q "^  logs  *" "$out" && grep -q "^  prepare  *" "$out" &&
	 ! grep -q "sandbox shell " "$out"'
vol_refused() { # vol_refused 'ARGS': exit 2, the message, no VM
	eval "\"\$capsule\" $1" >"$out" 2>"$err"
	rc=$?
	check "$1 is refused as a Docker volume (exit $rc)" \
		'[ "$rc" -eq 2 ] && grep -q "looks like a Docker volume" "$err" && grep -q "no bind mounts" "$err" &&
		 grep -q -- "--source DIR" "$err" && grep -q -- "--workspace DIR" "$err" && grep -q "capsule cp" "$err" &&
		 [ "$(ours)" -eq 0 ] && [ ! -e "$CAPSULE_HOME/sandboxes/vx" ]'
}
vol_refused "run -v /tmp:/x -- true"
vol_refused "run -q -- ./src:/src"
vol_refused "run --volume=data:/data -- true"
vol_refused "exec vx -- name:/path"
vol_refused "create vx -v /a:/b"
vol_refused "run -e X=Y -w /tmp -v /tmp:/x -- true"
"$capsule" run -q -- sh -c 'echo a:/b' >"$out" 2>"$err"
check "a command's own arguments that look like volumes are not refused" '[ "$(cat "$out")" = a:/b ]'

# Progress in a pipe: one line per phase, no \r, no escape sequence.
CAPSULE_HOME="$rt/pipe" "$capsule" create p1 2>&1 | cat >"$out"
lines=$(wc -l <"$out")
check "create's progress in a pipe is line-based ($lines lines, no \\r, no escape)" \
	'! grep -q "$(printf "\r")" "$out" && ! grep -q "$(printf "\033")" "$out" && [ "$lines" -ge 3 ] && [ "$lines" -le 8 ] &&
	 grep -q "^create: the base image is not built yet" "$out"'
CAPSULE_HOME="$rt/pipe" "$capsule" image build base 2>&1 | cat >"$out"
check "image build's progress in a pipe: one line per phase" \
	'! grep -q "$(printf "\r")" "$out" && ! grep -q "$(printf "\033")" "$out" && [ "$(wc -l <"$out")" -le 4 ]'
CAPSULE_HOME="$rt/quiet" "$capsule" create -q q1 >"$out" 2>"$err"
check "create -q prints no progress (even building the base image)" \
	'[ $? -eq 0 ] && [ ! -s "$err" ] && grep -q "^created sandbox q1" "$out"'
rm -rf "$rt/pipe" "$rt/quiet"

# --json: each parsed by python3 -m json.tool, then field by field.
jcheck() { # jcheck NAME 'PYTHON ASSERTIONS on d' [ARG]: d is $out parsed, ARG sys.argv[2]
	jpy="import json, sys
d = json.load(open(sys.argv[1]))
$2" jarg=${3:-}
	check "$1" 'python3 -m json.tool "$out" >/dev/null && python3 -c "$jpy" "$out" "$jarg"'
}
mkdir -p "$rt/pub" && echo hi >"$rt/pub/a.txt"
"$capsule" create j --source "$rt/pub" --cpus 1 --memory 256 --allow-egress 203.0.113.10 >/dev/null 2>&1
"$capsule" inspect --json j >"$out" 2>"$err"
jcheck "inspect --json of a stopped sandbox, field by field" '
assert d["name"] == "j" and d["state"] == "stopped", d
assert d["shim_pid"] is None and d["qemu_pid"] is None and d["jail"] is None
assert d["engine"] is None and d["vmm_pid"] is None
assert d["image"]["ref"] == "base" and d["image"]["digest"].startswith("sha256:") and len(d["image"]["digest"]) == 71
assert d["cpus"] == 1 and d["memory_mib"] == 256 and d["root_size_mib"] == 256 and d["work_size_mib"] == 512
assert isinstance(d["disk_bytes"], int) and d["disk_bytes"] > 0
s = d["source"]; assert s["path"].endswith("/pub") and s["entries"] >= 1 and s["bytes"] == 3 and len(s["fingerprint"]) == 64, s
assert d["workspace"] is None
n = d["network"]; assert n["enabled"] is True and n["flags"] == ["allow-egress=203.0.113.10"], n
assert n["policy"] == "--allow-egress 203.0.113.10" and n["route"].startswith("direct") and n["nic"] is None and n["state"] is None
assert d["directory"].endswith("/sandboxes/j") and isinstance(d["created"], int)
import time; assert abs(d["created"] - time.time()) < 600'
"$capsule" exec j -- true >/dev/null 2>&1
"$capsule" exec j grep -v x:/y /etc/hostname >"$out" 2>"$err"
rc=$?
check "exec j grep -v x:/y (no --): the command's -v is grep's, not a volume (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ -s "$out" ] && ! grep -q "Docker volume" "$err"'
# Durable results: -v says how long the flush took and whether the
# writes are durable; --no-sync gives it up (exec, run and cp).
check "exec, run and cp --help offer --no-sync and state the guarantee" \
	'"$capsule" exec --help | grep -q -- "--no-sync" && "$capsule" exec --help | grep -q "lost if QEMU or the host dies" &&
	 "$capsule" run --help | grep -q -- "--no-sync" && "$capsule" cp --help | grep -q -- "--no-sync"'
"$capsule" exec -v j -- sh -c 'echo kept >/work/d1' >"$out" 2>"$err"
rc=$?
check "exec -v: the command's run and flush times, durable (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -Eq "^capsule: the command ran [0-9]+ ms; flush [0-9]+ ms; durable: its writes are on the host" "$err"'
# run -v: where the time went, one line (issue 20): the start's phases,
# restored here, then the command and the teardown.
"$capsule" run -v -- true >"$out" 2>"$err"
rc=$?
check "run -v: the start's phases, the command and the teardown in one line (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -Eq "^capsule: start [0-9.]+ ms: prepare [0-9.]+, jail [0-9.]+, qemu [0-9.]+, restore [0-9.]+, agent [0-9.]+; command [0-9.]+ ms; teardown [0-9.]+ ms$" "$err"'
"$capsule" exec -v --no-sync j -- sh -c 'echo quick >/work/d2; cat /work/d1' >"$out" 2>"$err"
rc=$?
check "exec -v --no-sync: not flushed, not durable, said so (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -qx kept "$out" && grep -q "not flushed (--no-sync); not durable" "$err"'
echo copied >"$rt/cpfile"
"$capsule" cp --no-sync -q "$rt/cpfile" j:/work/ >"$out" 2>"$err" && "$capsule" exec j -- cat /work/cpfile /work/d2 >"$out" 2>"$err"
rc=$?
check "cp --no-sync into a sandbox copies (exit $rc)" '[ "$rc" -eq 0 ] && [ "$(cat "$out")" = "copied
quick" ]'
"$capsule" ls --json >"$out" 2>"$err"
jcheck "ls --json: an array of inspect's objects, running with its pids and jail; a broken one named" '
assert isinstance(d, list) and sorted(x["name"] for x in d) == ["j", "n1"], d
b = [x for x in d if x["name"] == "n1"][0]; assert b["state"] == "broken" and "record.json" in b["error"], b
x = [x for x in d if x["name"] == "j"][0]; assert x["state"] == "running" and x["shim_pid"] > 1 and x["qemu_pid"] > 1, x
assert x["engine"] == "qemu" and x["vmm_pid"] == x["qemu_pid"], x
assert x["jail"]["uid"].isdigit() and x["jail"]["cgroup"], x["jail"]
assert x["network"]["nic"] is True and x["network"]["policy_pid"] > 1 and x["network"]["state"].startswith("policy process pid")'
"$capsule" inspect --json j >"$rt/i.json" 2>"$err"
check "inspect --json and ls --json agree on a sandbox" \
	'python3 -c "import json, sys; a = json.load(open(sys.argv[1])); b = [x for x in json.load(open(sys.argv[2])) if x[\"name\"] == \"j\"][0]; a.pop(\"disk_bytes\"); b.pop(\"disk_bytes\"); assert a == b" "$rt/i.json" "$out"'
"$capsule" template ls --json >"$out" 2>"$err"
jcheck "template ls --json: key, created, sizes in bytes, shape" '
assert isinstance(d, list) and len(d) >= 1, d
for t in d:
    assert len(t["key"]) == 64 and isinstance(t["created"], int) and t["state_bytes"] > 0 and t["ram_bytes"] > 0, t
    assert "vCPU" in t["shape"] and t["directory"].endswith(t["key"])'
"$capsule" doctor --json >"$out" 2>"$err"
rc=$?
jcheck "doctor --json: every check a field, ok matching the exit code ($rc)" '
assert d["ok"] is (sys.argv[2] == "0") and d["problems"] == (0 if d["ok"] else d["problems"]), d["ok"]
assert d["qemu"]["ok"] and d["qemu"]["version"].startswith("QEMU")
assert d["engine"]["name"] == "qemu" and d["engine"]["version"] == d["qemu"]["version"]
assert d["accel"]["name"] in ("kvm", "tcg") and d["accel"]["reason"]
assert (d["isolation_warning"] is None) == (d["accel"]["name"] == "kvm")
assert set(d["kvm"]) == {"device", "present", "writable", "used"}
assert len(d["jail"]["checks"]) == 6 and all(set(c) == {"name", "active", "detail"} for c in d["jail"]["checks"])
assert d["cache_dir"] and d["kernel"]["exists"] is True and d["agent"]["exists"] is True and d["busybox"]["exists"]
assert d["initramfs"]["path"].endswith(".cpio") and d["images"]["count"] >= 1 and d["images"]["base"] is True' "$rc"
"$capsule" inspect --json nosuch >"$out" 2>"$err"
rc=$?
check "inspect --json nosuch: exit 125 ($rc) naming it, nothing on stdout" '[ "$rc" -eq 125 ] && grep -q nosuch "$err" && [ ! -s "$out" ]'
"$capsule" ls --bogus >"$out" 2>"$err"
rc=$?
check "ls --bogus: exit 2 ($rc)" '[ "$rc" -eq 2 ]'

# capsule logs: both logs headed, one alone, -n, -f bounded.
"$capsule" logs j >"$out" 2>"$err"
check "logs shows the console and shim logs, each headed" \
	'[ $? -eq 0 ] && grep -qx "==> $CAPSULE_HOME/sandboxes/j/console.log <==" "$out" &&
	 grep -qx "==> $CAPSULE_HOME/sandboxes/j/shim.log <==" "$out" && grep -q "capsule shim j: running" "$out"'
"$capsule" logs --shim -n 1 j >"$out" 2>"$err"
check "logs --shim -n 1: one line, no header" '[ "$(wc -l <"$out")" -eq 1 ] && ! grep -q "==>" "$out"'
"$capsule" logs nosuch >"$out" 2>"$err"
rc=$?
check "logs nosuch: exit 125 ($rc) naming it" '[ "$rc" -eq 125 ] && grep -q "no sandbox named .nosuch." "$err"'
"$capsule" logs -f --shim j >"$out" 2>"$err" &
lpid=$!
(sleep 20; kill -KILL $lpid 2>/dev/null) &
guard=$!
wait_for 'grep -q "running" "$out"' 50
"$capsule" stop j >/dev/null 2>&1
wait_for 'grep -q "stopped" "$out"' 50
kill -TERM $lpid
wait $lpid
rc=$?
kill $guard 2>/dev/null
check "logs -f follows the shim log (a stop shows) and ends on SIGTERM with 0 ($rc)" '[ "$rc" -eq 0 ] && grep -q "capsule shim j: stopped" "$out"'
# A reader that left before anything was written: quiet, exit 0.
(sleep 0.5; timeout 20 "$capsule" logs -f j 2>"$err"; echo $? >"$rt/lrc") | true
check "logs -f into a closed pipe ends quietly with 0 ($(cat "$rt/lrc"))" '[ "$(cat "$rt/lrc")" = 0 ] && [ ! -s "$err" ]'
timeout 20 "$capsule" logs -f j >"$out" 2>"$err" &
lpid=$!
sleep 0.3
"$capsule" rm j >/dev/null 2>&1
wait $lpid
rc=$?
check "logs -f ends when the sandbox is removed ($rc)" '[ "$rc" -eq 0 ] && grep -q "sandbox .j. was removed" "$err"'
clean_after "whole suite"
