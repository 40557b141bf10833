#!/bin/sh
# Raw protocol abuse of `capsule mcp` from the shell: each misuse gets the
# right JSON-RPC error and the server stays up; initialize + tools/list
# start no VM; stdout carries protocol messages only. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
mkdir -p "$rt/pub"
echo hi >"$rt/pub/a.txt"

init='{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"sh","version":"1"}}}'
ping() { printf '{"jsonrpc":"2.0","id":%s,"method":"ping"}\n' "$1"; }
# resp ID: the response line with that id
resp() { grep "\"id\":$1[,}]" "$out"; }
mcp() { "$capsule" mcp --agent a --peer p1 --source "$rt/pub" 2>"$err" >"$out"; }

echo "1..34"

{ printf '%s\n' '{"jsonrpc":"2.0","id":7,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"a.txt"}}}'; ping 8; } | mcp
check "a call before initialize is refused, ping still answered" 'resp 7 | grep -q "\"code\":-32600" && resp 7 | grep -q "not initialized" && resp 8 | grep -q "\"result\":{}"'

{ echo "$init"; printf '{"jsonrpc": "2.0", "id": 2, "method": \n'; ping 3; } | mcp
check "malformed JSON gets -32700 and the server stays up" 'grep -q "\"code\":-32700" "$out" && resp 3 | grep -q "\"result\":{}"'

{ echo "$init"; head -c 10485760 /dev/zero | tr '\0' 'x'; echo; ping 4; } | mcp
check "a 10 MiB line gets -32600 and the server stays up" 'grep -q "\"code\":-32600" "$out" && grep -q "over 4194304 bytes" "$out" && resp 4 | grep -q "\"result\":{}"'

{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","id":5,"method":"resources/list"}'; ping 6; } | mcp
check "an unknown method gets -32601" 'resp 5 | grep -q "\"code\":-32601" && resp 6 | grep -q "\"result\":{}"'

{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","id":9,"method":"tools/call","params":{"name":"nope","arguments":{}}}' \
	'{"jsonrpc":"2.0","id":10,"method":"tools/call","params":{"name":"read_file","arguments":{}}}'; } | mcp
check "an unknown tool and missing arguments get -32602" 'resp 9 | grep -q "\"code\":-32602" && resp 10 | grep -q "\"code\":-32602"'

{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' '{"jsonrpc":"2.0","id":2,"method":"tools/list"}'; } | mcp
check "initialize negotiates the version the client asked for" 'resp 1 | grep -q "\"protocolVersion\":\"2025-06-18\""'
check "tools/list lists read_file with its schema and annotations" 'resp 2 | grep -q "\"name\":\"read_file\"" && resp 2 | grep -q "\"inputSchema\"" && resp 2 | grep -q "\"readOnlyHint\":true"'
check "initialize and tools/list start no VM" '[ "$(ours)" -eq 0 ] && [ ! -d "$CAPSULE_HOME/sandboxes" ]'

printf '%s\n' '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"old","version":"1"}}}' | mcp
check "an unsupported version is answered with the server's own" 'resp 1 | grep -q "\"protocolVersion\":\"2025-11-25\""'

{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","id":11,"method":"tools/call","params":{"name":"read_file","arguments":{"path":"../../etc/passwd"}}}'; } | mcp
check "read_file ../../etc/passwd is a tool error naming the rule" 'resp 11 | grep -q "\"isError\":true" && resp 11 | grep -q "climbs out of its root"'
check "stdout holds only JSON-RPC messages, one per line" 'python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$out"'

# Alone on its home (no capsule serve), mcp runs its own VM, and stops it
# when stdin closes. stdin stays open until the answer is there.
printf '%s\n' '{"tools": {"run_command": true}}' >"$rt/run.json"
"$capsule" image build base >/dev/null 2>&1
{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
	'{"jsonrpc":"2.0","id":12,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"echo standalone; cat /source/a.txt"}}}'
	wait_for 'resp 12 >/dev/null' 900; } |
	"$capsule" mcp --agent a --peer p1 --source "$rt/pub" --config "$rt/run.json" 2>"$err" >"$out"
check "without a capsule serve, mcp runs its own VM and stops it when stdin closes" \
	'resp 12 | grep -q "standalone\\\\nhi\\\\n" && [ "$(ours)" -eq 0 ]'

# The configuration's "size" is every sandbox's (docs/mcp.md); out of
# bounds, it is refused before anything runs.
printf '%s\n' '{"tools": {"run_command": true}, "size": {"cpus": 2, "memory_mib": 640}}' >"$rt/size.json"
{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
	'{"jsonrpc":"2.0","id":21,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"echo cpus=$(nproc) mem=$(awk \"/^MemTotal:/ { print int(\\$2 / 1024) }\" /proc/meminfo)"}}}'
	wait_for 'resp 21 >/dev/null' 900; } |
	"$capsule" mcp --agent a --peer p3 --config "$rt/size.json" 2>"$err" >"$out"
got=$(resp 21 | grep -o 'cpus=[0-9]* mem=[0-9]*' | head -1)
check "config size cpus 2, memory_mib 640: the sandbox has 2 vCPUs and ~640 MiB ($got)" \
	'[ "${got%% *}" = cpus=2 ] && m=${got#*mem=} && [ "$m" -gt 512 ] && [ "$m" -le 640 ]'
printf '%s\n' '{"size": {"cpus": 99}}' >"$rt/bigsize.json"
"$capsule" mcp --agent a --peer p3 --config "$rt/bigsize.json" </dev/null 2>"$err" >"$out"
rc=$?
check "config size cpus 99 exits 2 naming the bound, nothing on stdout (exit $rc: $(head -c 200 "$err"))" \
	'[ "$rc" -eq 2 ] && grep -q "cpus 99 is out of range: 1 to 16" "$err" && [ ! -s "$out" ]'

# A run_command's own timeout is the one reported; write_file refuses the
# read-only public root instead of writing to /work.
printf '%s\n' '{"tools": {"run_command": true, "write_file": true}}' >"$rt/rw.json"
{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
	'{"jsonrpc":"2.0","id":13,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"w.txt","root":"public","content":"x"}}}' \
	'{"jsonrpc":"2.0","id":14,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"sleep 20","timeout":1}}}'
	wait_for 'resp 14 >/dev/null' 900
	printf '%s\n' '{"jsonrpc":"2.0","id":15,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"f(){ f|f& }; f 2>/dev/null; sleep 100","timeout":3}}}'
	wait_for 'resp 15 >/dev/null' 300
	printf '%s\n' '{"jsonrpc":"2.0","id":17,"method":"tools/list"}' \
		'{"jsonrpc":"2.0","id":18,"method":"tools/call","params":{"name":"write_file","arguments":{"path":"d.txt","content":"quick","durable":false}}}' \
		'{"jsonrpc":"2.0","id":19,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"cat d.txt; echo kept > k.txt","durable":true}}}' \
		'{"jsonrpc":"2.0","id":20,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"true","durable":"yes"}}}'
	wait_for 'resp 19 >/dev/null && resp 20 >/dev/null' 300; } |
	"$capsule" mcp --agent a --peer p1 --source "$rt/pub" --config "$rt/rw.json" 2>"$err" >"$out"
check "write_file with root public is refused, naming the rule" \
	'resp 13 | grep -q "\"code\":-32602" && resp 13 | grep -q "workspace (/work) only"'
check "run_command with timeout 1 says it timed out after 1 s" \
	'resp 14 | grep -q "timed out after 1 s" && resp 14 | grep -q "\"timed_out\":true"'
check "a fork bomb in run_command with timeout 3 ends on time" \
	'resp 15 | grep -q "timed out after 3 s" && resp 15 | grep -q "\"timed_out\":true"'
check "tools/list: run_command and write_file take a boolean \"durable\", default true" \
	'resp 17 | python3 -c "
import json, sys
tools = {t[\"name\"]: t for t in json.load(sys.stdin)[\"result\"][\"tools\"]}
for n in (\"run_command\", \"write_file\"):
    d = tools[n][\"inputSchema\"][\"properties\"][\"durable\"]
    assert d[\"type\"] == \"boolean\" and d[\"default\"] is True and \"lost\" in d[\"description\"], d
"'
check "write_file with durable false answers durable false; run_command (durable) reads it, answers durable true" \
	'resp 18 | grep -q "\"durable\":false" && resp 19 | grep -q "quick" && resp 19 | grep -q "\"durable\":true"'
check "a durable that is not a boolean gets -32602 naming it" \
	'resp 20 | grep -q "\"code\":-32602" && resp 20 | grep -q "durable must be true"'

# The first call of an unprepared server prepares; one that sent
# _meta.progressToken gets notifications/progress (growing, total 4)
# before its result, which says what was built. The kernel is "built" by
# a fake builder linking the real one.
kmiss="$rt/kprog/vmlinux"
mkdir -p "$rt/kprog"
kreal=$(readlink -f "${CAPSULE_KERNEL:-${CAPSULE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capsule}/vmlinux}")
printf '#!/bin/sh\necho "kernel: configuring"\nsleep 1.2\necho "kernel: compiling"\nln -s "%s" "%s"\n' "$kreal" "$kmiss" >"$rt/kb.sh"
chmod +x "$rt/kb.sh"
{ echo "$init"; printf '%s\n' '{"jsonrpc":"2.0","method":"notifications/initialized"}' \
	'{"jsonrpc":"2.0","id":16,"method":"tools/call","params":{"name":"run_command","arguments":{"command":"echo after-prepare"},"_meta":{"progressToken":"tok-16"}}}'
	wait_for 'resp 16 >/dev/null' 900; } |
	CAPSULE_KERNEL="$kmiss" CAPSULE_KERNEL_BUILDER="$rt/kb.sh" CAPSULE_TEMPLATES=0 \
	"$capsule" mcp --agent a --peer p2 --source "$rt/pub" --config "$rt/run.json" 2>"$err" >"$out"
check "a first call with a progressToken gets notifications/progress before its result, growing to 4 of 4" \
	'python3 -c "
import json, sys
msgs = [json.loads(l) for l in open(sys.argv[1])]
i = [k for k, m in enumerate(msgs) if m.get(\"id\") == 16][0]
notes = [m[\"params\"] for m in msgs[:i] if m.get(\"method\") == \"notifications/progress\"]
assert notes and all(p[\"progressToken\"] == \"tok-16\" and p[\"total\"] == 4 for p in notes), notes
v = [p[\"progress\"] for p in notes]
assert v == sorted(set(v)) and v[-1] == 4, v
assert any(\"kernel\" in p[\"message\"] for p in notes) and any(\"compiling\" in p[\"message\"] or \"configuring\" in p[\"message\"] for p in notes), notes
" "$out"'
check "its result runs the command (its content only the command's), says it prepared (kernel) in _meta; stderr says it prepares" \
	'resp 16 | grep -q "after-prepare" && ! resp 16 | grep -q "prepared the sandboxes" &&
	 resp 16 | grep -q "\"capsule/prepared\":\[\"kernel\"\]" && grep -q "the first tool call prepares" "$err"'

"$capsule" mcp --peer p1 </dev/null >"$out" 2>"$err"
check "no agent identity: refused with a message, nothing on stdout" '[ $? -ne 0 ] && grep -q "agent identity is required" "$err" && [ ! -s "$out" ]'

# The network policy (docs/network.md): "network" in --config, flags
# replacing it as a whole. Alone on its home, mcp runs the controller and
# listens on the home's socket, whose "info" reports the policy: no VM.
# The Python client's command line (clients/python): prints the result.
pyclient=$(cd "$(dirname "$0")/../.." && pwd)/clients/python/src
# mcp_info ARGS...: start mcp with ARGS, print the home controller's info
# "network" as one line of JSON (or "none: WHY"), then close its stdin.
mcp_info() {
	rm -f "$rt/in" "$CAPSULE_HOME/serve.sock"
	mkfifo "$rt/in"
	"$capsule" mcp --agent a "$@" <"$rt/in" >"$out" 2>"$err" &
	mpid=$!
	exec 3>"$rt/in"
	if wait_for '[ -S "$CAPSULE_HOME/serve.sock" ]' 100; then
		PYTHONPATH="$pyclient" timeout 20 python3 -m capsule_client "$CAPSULE_HOME/serve.sock" info |
			python3 -c 'import json, sys; print(json.dumps(json.load(sys.stdin)["network"]))' 2>&1
	else
		echo "none: no socket"
	fi
	exec 3>&-
	wait "$mpid"
}
nsb() { ls "$CAPSULE_HOME/sandboxes" 2>/dev/null | wc -l; }
sb_before=$(nsb)
printf '%s\n' '{"network": {"allow_egress": ["203.0.113.10"], "allow_lan": true}}' >"$rt/net.json"
got=$(mcp_info --config "$rt/net.json")
check "--config \"network\" is accepted and is the controller's policy ($got)" \
	'[ "$got" = "[\"allow-lan\", \"allow-egress=203.0.113.10\"]" ]'
got=$(mcp_info --config "$rt/net.json" --allow-public)
check "a network flag replaces the configuration's \"network\" as a whole ($got)" '[ "$got" = "[\"allow-public\"]" ]'
got=$(mcp_info)
check "without a policy the controller reports none ($got)" '[ "$got" = "[]" ]'
printf '%s\n' '{"network": {"allow_public": false}}' >"$rt/off.json"
got=$(mcp_info --config "$rt/off.json")
check "a \"network\" that opens nothing is no network ($got)" '[ "$got" = "[]" ]'
check "reading the policy booted no VM and made no sandbox" '[ "$(ours)" -eq 0 ] && [ "$(nsb)" -eq "$sb_before" ]'

# bad_config 'JSON' 'MESSAGE': refused at start with exit 2, naming the key.
bad_config() {
	printf '%s\n' "$1" >"$rt/bad.json"
	rm -f "$CAPSULE_HOME/serve.sock"
	timeout 20 "$capsule" mcp --agent a --config "$rt/bad.json" </dev/null >"$out" 2>"$err"
	rc=$? want=$2
	check "--config $1 is refused (exit $rc) naming it" \
		'[ "$rc" -eq 2 ] && grep -qF -- "$want" "$err" && grep -qF "$rt/bad.json" "$err" && [ ! -s "$out" ] &&
		 [ ! -e "$CAPSULE_HOME/serve.sock" ]'
}
bad_config '{"network": {"allow_egress": "x"}}' 'network.allow_egress must be a list of strings'
bad_config '{"network": {"allow_lan": "yes"}}' 'network.allow_lan must be true or false'
bad_config '{"network": {"publish": [1]}}' 'network.publish[0] must be a string'
bad_config '{"network": {"bogus": 1}}' 'network.bogus'
bad_config '{"network": {"allow_egress": ["203.0.113.10", "1.2.3.4/33"]}}' 'network.allow_egress[1]: --allow-egress "1.2.3.4/33"'
bad_config '{"network": ["allow-lan"]}' '"network" must be an object'
