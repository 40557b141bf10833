#!/bin/sh
# capsule code (docs/coding-agents.md): a project's sandbox found again
# by the project's canonical path, the project copied to /workspace, the
# agent's state kept across launches, two launches at once sharing one
# VM, a PTY on a terminal and plain pipes otherwise, the changes listed
# or merged (--merge, refused on a conflict), presets built in and a
# user's own, and the refusals of bad input. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
start=$(date +%s)
export XDG_CONFIG_HOME="$rt/config"
# The cache (kernel, images) stays where it is when a case changes HOME.
export CAPSULE_CACHE="${CAPSULE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capsule}"
# Every entry of a tree but one, with its content's hash: what a merge
# must leave as it was.
tree() { (cd "$1" && find . -type f ! -name "${2:-.none}" -exec sha256sum {} + | LC_ALL=C sort -k2); }
codes() { c ls | awk '$1 ~ /^code-/' | wc -l; }

echo "1..33"

proj="$rt/my Project"
mkdir -p "$proj/src"
echo hello >"$proj/README.md"
echo 'int main(void) { return 0; }' >"$proj/src/main.c"
before=$(tree "$proj" README.md)

# --- the first launch creates the sandbox -----------------------------------------------
(cd "$proj" && c code -- sh -c 'echo fix >> README.md; pwd; id -u; echo "home=$HOME"') >"$out" 2>"$err"
rc=$?
name=$(sed -n 's/^capsule code: created sandbox \(code-[a-z0-9-]*\) for .*/\1/p' "$err")
check "the first launch creates the project's sandbox, names it and runs the command in /workspace as 1000 with HOME=/work" '[ "$rc" -eq 0 ] && [ -n "$name" ] && grep -q "created sandbox code-my-project-[0-9a-f]\{12\} for $proj (agent shell; network: none)" "$err" && grep -qx /workspace "$out" && grep -qx 1000 "$out" && grep -qx "home=/work" "$out"'
check "on exit it lists what changed, says the project is unchanged and how to take it" 'grep -qx "M README.md" "$err" && grep -q "1 change in /workspace" "$err" && grep -q "is unchanged; .capsule diff $name -p. shows the changes, .capsule code --merge -- true." "$err"'
check "the host project is untouched" '[ "$(cat "$proj/README.md")" = hello ] && [ "$(tree "$proj" README.md)" = "$before" ]'
check "the sandbox is an ordinary named one, with the project as its workspace" 'c inspect "$name" >"$out" 2>"$err" && grep -q "^workspace:  $proj" "$out" && [ "$(codes)" -eq 1 ]'

# --- state kept, exit codes, stdin ------------------------------------------------------
(cd "$proj" && c code -q -- sh -c 'echo launch1 >> ~/.agent-history; mkdir -p ~/.config/agent && echo token-ish > ~/.config/agent/settings') >"$out" 2>"$err"
c stop "$name" >/dev/null 2>&1
(cd "$proj" && c code -q -- sh -c 'echo launch2 >> ~/.agent-history; cat ~/.agent-history ~/.config/agent/settings; cat README.md') >"$out" 2>"$err"
rc=$?
check "the agent's home (/work) is kept across launches and a stop; so is /workspace" '[ "$rc" -eq 0 ] && [ "$(sed -n 1,3p "$out" | tr "\n" " ")" = "launch1 launch2 token-ish " ] && [ "$(sed -n 4,5p "$out" | tr "\n" " ")" = "hello fix " ]'
check "a launch in a known project creates nothing" '[ "$(codes)" -eq 1 ] && ! grep -q "created sandbox" "$err"'
(cd "$proj" && c code -q -- sh -c 'exit 7') >"$out" 2>"$err"
rc=$?
check "the command's exit code is the launch's" '[ "$rc" -eq 7 ]'
printf 'piped in\n' | (cd "$proj" && c code -q -- sh -c 'cat; test -t 0 || echo no-tty') >"$out" 2>"$err"
check "without a terminal the command gets plain pipes: stdin forwarded, no TTY" '[ "$(cat "$out")" = "$(printf "piped in\nno-tty")" ]'
script -qec "cd '$proj' && '$capsule' code -q -- sh -c 'tty; test -t 0 && test -t 1 && echo on-a-tty; echo TERM=\$TERM'" /dev/null >"$out" 2>"$err" </dev/null
check "on a terminal the command runs in a PTY with TERM" 'grep -q "^/dev/pts/" "$out" && grep -q "on-a-tty" "$out" && grep -q "^TERM=." "$out"'

# --- the same project by another path; another project ----------------------------------
ln -s "$proj" "$rt/link"
(cd "$rt/link" && c code -q -- sh -c 'cat README.md') >"$out" 2>"$err"
check "the project reached through a symlink is the same project (its canonical path)" '[ "$(cat "$out" | tr "\n" " ")" = "hello fix " ] && [ "$(codes)" -eq 1 ]'
c code -q "$proj/src" -- sh -c 'ls /workspace' >"$out" 2>"$err"
check "DIR names another project: a sandbox of its own, with that copy" 'grep -qx main.c "$out" && [ "$(codes)" -eq 2 ]'

# --- --merge ---------------------------------------------------------------------------
(cd "$proj" && c code --merge -- true) >"$out" 2>"$err"
rc=$?
check "--merge applies the launch's changes to the host project" '[ "$rc" -eq 0 ] && [ "$(cat "$proj/README.md" | tr "\n" " ")" = "hello fix " ] && grep -q "merged: 1 written" "$out"'
check "--merge changes README.md and nothing else" '[ "$(tree "$proj" README.md)" = "$before" ] && [ "$(cd "$proj" && find . | LC_ALL=C sort | tr "\n" " ")" = ". ./README.md ./src ./src/main.c " ]'
(cd "$proj" && c code -- true) >"$out" 2>"$err"
check "after a merge the next launch reports no changes" 'grep -q "no changes in /workspace" "$err" && ! grep -q "is unchanged;" "$err"'
# A conflict: both sides change README.md.
(cd "$proj" && c code -q -- sh -c 'echo guest-edit >> README.md') >/dev/null 2>&1
echo host-edit >>"$proj/README.md"
hostcopy=$(cat "$proj/README.md")
(cd "$proj" && c code --merge -- sh -c 'echo more > NEW.txt') >"$out" 2>"$err"
rc=$?
check "--merge refuses on a conflict, naming the path, and writes nothing" '[ "$rc" -eq 1 ] && grep -q "README.md" "$err" && grep -qi "conflict" "$err" && [ "$(cat "$proj/README.md")" = "$hostcopy" ] && [ ! -e "$proj/NEW.txt" ]'
(cd "$proj" && c code -- sh -c 'cat NEW.txt') >"$out" 2>"$err"
check "after a refused merge the guest's changes are still there" 'grep -qx more "$out" && grep -q "A NEW.txt" "$err"'

# --- two launches at once ---------------------------------------------------------------
proj2="$rt/two"
mkdir -p "$proj2"
echo two >"$proj2/file"
(cd "$proj2" && c code -q -- sh -c 'i=0; while [ $i -lt 40 ]; do echo a$i >> ~/shared.log; i=$((i+1)); done; echo first-done') >"$rt/o1" 2>"$rt/e1" &
p1=$!
(cd "$proj2" && c code -q -- sh -c 'i=0; while [ $i -lt 40 ]; do echo b$i >> ~/shared.log; i=$((i+1)); done; echo second-done') >"$rt/o2" 2>"$rt/e2" &
p2=$!
wait $p1; r1=$?
wait $p2; r2=$?
check "two launches at once in a new project both run, in one sandbox" '[ "$r1" -eq 0 ] && [ "$r2" -eq 0 ] && grep -qx first-done "$rt/o1" && grep -qx second-done "$rt/o2" && [ "$(codes)" -eq 3 ]'
(cd "$proj2" && c code -q -- sh -c 'wc -l < ~/shared.log; grep -c "^a" ~/shared.log; grep -c "^b" ~/shared.log') >"$out" 2>"$err"
check "their writes to the shared home are all there" '[ "$(cat "$out" | tr "\n" " ")" = "80 40 40 " ]'
# One launch holds a session open while another runs.
(cd "$proj2" && c code -q -- sh -c 'echo > ~/long.started; sleep 4; echo long-done') >"$rt/o1" 2>"$rt/e1" &
p1=$!
wait_for "[ -n \"\$(cd '$proj2' && '$capsule' code -q -- sh -c 'cat ~/long.started >/dev/null 2>&1 && echo seen' 2>/dev/null)\" ]" 100
(cd "$proj2" && c code -q -- sh -c 'echo second-session; test -e ~/long.started && echo sees-first') >"$out" 2>"$err"
r2=$?
wait $p1; r1=$?
check "a launch while another one's session is open gets a working shell of its own" '[ "$r2" -eq 0 ] && grep -qx second-session "$out" && grep -qx sees-first "$out" && [ "$r1" -eq 0 ] && grep -qx long-done "$rt/o1"'

# --- presets ---------------------------------------------------------------------------
c code --agents >"$out" 2>"$err"
check "--agents lists the built-in presets with their commands and hosts" 'grep -q "^claude  *built-in  claude; api.anthropic.com:443" "$out" && grep -q "^codex  *built-in  codex; api.openai.com:443" "$out" && grep -q "^shell  *built-in  /bin/sh; (no network)" "$out"'
mkdir -p "$XDG_CONFIG_HOME/capsule/agents"
cat >"$XDG_CONFIG_HOME/capsule/agents/mine.json" <<'EOF'
{ "description": "a test agent", "command": ["sh", "-c", "echo from-preset $MY_AGENT_MODE in $(pwd)"],
  "allow": ["api.agent.test:443", "*.cdn.agent.test"], "env": { "MY_AGENT_MODE": "careful" } }
EOF
(cd "$proj2" && c code --agent mine) >"$out" 2>"$err"
rc=$?
check "a user's preset runs its command with its environment" '[ "$rc" -eq 0 ] && grep -q "network is now: .*api.agent.test:443.*next start" "$err" && grep -qx "from-preset careful in /workspace" "$out"'
c net show "$(c ls | awk "\$1 ~ /^code-two-/ { print \$1 }")" >"$out" 2>"$err"
check "its hosts were added to the sandbox's policy, and nothing else" 'grep -q "api.agent.test:443" "$out" && grep -q "\*.cdn.agent.test" "$out" && ! grep -q "allow-public\|api.anthropic" "$out"'
c code --agents >"$out" 2>"$err"
check "--agents lists the user's preset as a file" 'grep -q "^mine  *file  *sh; api.agent.test:443 \*.cdn.agent.test" "$out"'
echo '{ "command": ["x"], "comand": ["y"] }' >"$XDG_CONFIG_HOME/capsule/agents/typo.json"
(cd "$proj2" && c code --agent typo) >"$out" 2>"$err"
rc=$?
check "a preset with an unknown member is refused, naming the file and the member (exit 2)" '[ "$rc" -eq 2 ] && grep -q "preset $XDG_CONFIG_HOME/capsule/agents/typo.json: unknown member \"comand\"" "$err"'
echo '{ "command": ["x"], "allow": ["bad host!"] }' >"$XDG_CONFIG_HOME/capsule/agents/badhost.json"
(cd "$proj2" && c code --agent badhost) >"$out" 2>"$err"
rc=$?
check "a preset with a bad host is refused before any VM starts, naming it (exit 2)" '[ "$rc" -eq 2 ] && grep -q "badhost.json: allow\[0\]" "$err"'
(cd "$proj2" && c code --agent nosuch) >"$out" 2>"$err"
rc=$?
check "an unknown agent is refused, listing the built-in ones and where a file would go (exit 2)" '[ "$rc" -eq 2 ] && grep -q "no agent preset .nosuch.: the built-in ones are claude, codex, gemini, shell; a file $XDG_CONFIG_HOME/capsule/agents/nosuch.json adds it" "$err"'

# A preset's credential file: given as a copy with placeholders when this
# host has it, a note when it does not.
REALTOK="realtok-$(od -An -tx1 -N12 /dev/urandom | tr -d ' \n')"
mkdir -p "$rt/fakehome/.agent"
printf '{"auth": {"token": "%s", "user": "me"}}\n' "$REALTOK" >"$rt/fakehome/.agent/auth.json"
cat >"$XDG_CONFIG_HOME/capsule/agents/withcred.json" <<'EOF'
{ "command": ["sh", "-c", "cat ~/.agent/auth.json"],
  "secret_files": ["~/.agent/auth.json=~/.agent/auth.json:auth.token@api.agent.test"] }
EOF
mkdir -p "$rt/three"
(cd "$rt/three" && HOME="$rt/fakehome" c code --agent withcred) >"$out" 2>"$err"
rc=$?
c net show "$(c ls | awk '$1 ~ /^code-three-/ { print $1 }')" >"$rt/net3" 2>&1
check "a preset's credential file reaches the guest as a copy with a placeholder, never the token" '[ "$rc" -eq 0 ] && grep -q "\"token\": \"capsule-ph-[0-9a-f]\{40\}\"" "$out" && grep -q "\"user\": \"me\"" "$out" && ! grep -qF "$REALTOK" "$out" && ! grep -qF "$REALTOK" "$err" && grep -q "secret-file /work/.agent/auth.json=$rt/fakehome/.agent/auth.json:auth.token@api.agent.test" "$rt/net3"'
mkdir -p "$rt/four"
(cd "$rt/four" && HOME="$rt/nohome" c code --agent withcred) >"$out" 2>"$err"
check "without the file on this host the launch says the agent logs in inside, and runs" 'grep -q "agent withcred: no $rt/nohome/.agent/auth.json on this host" "$err" && grep -q "No such file" "$err"'

# --- bad input ---------------------------------------------------------------------------
c code "$rt/nonexistent" -- true >"$out" 2>"$err"
rc=$?
check "a project that does not exist is refused by name (exit 2)" '[ "$rc" -eq 2 ] && grep -q "the project $rt/nonexistent: No such file or directory" "$err"'
c code "$proj/README.md" -- true >"$out" 2>"$err"
rc=$?
check "a project that is a file is refused (exit 2)" '[ "$rc" -eq 2 ] && grep -q "is not a directory" "$err"'
n_before=$(codes)
c code "$proj" "$proj2" >"$out" 2>"$err"
rc=$?
check "two directories are refused, saying a command goes after -- (exit 2), and nothing is made" '[ "$rc" -eq 2 ] && grep -q "a command goes after --" "$err" && [ "$(codes)" -eq "$n_before" ]'

for s in $(c ls | awk '$1 ~ /^code-/ { print $1 }'); do c rm --force "$s" >/dev/null 2>&1; done
check "rm removes the project sandboxes, never the projects" '[ "$(codes)" -eq 0 ] && [ -f "$proj/README.md" ] && [ -f "$proj2/file" ]'
elapsed "code suite"
clean_after "code suite"
