#!/bin/sh
# A project in a sandbox (docs/workspace.md): the copy at /workspace
# (owner, modes, links; refusals by name), capsule diff (lines, --json,
# --patch against diff -u), capsule merge (byte for byte, conflicts,
# --theirs, incremental, planted symlinks, kill -9 midway), --git, and
# the acceptance run of issue 16. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
sbdir() { echo "$CAPSULE_HOME/sandboxes/$1"; }
state() { c ls | awk -v n="$1" '$1 == n { print $3 }'; }
tcount() { c template ls | tail -n +2 | wc -l; }
start=$(date +%s)

# A tree's listing, the same on the host and in the guest (busybox): one
# line per entry, sorted: type, permission bits, path, and the content's
# SHA-256 or the link's target. The merge's staging directory is left out.
LIST='cd "$1" || exit 1
find . -mindepth 1 ! -path "./.capsule-merge.*" | LC_ALL=C sort | while IFS= read -r p; do
	if [ -L "$p" ]; then echo "l $p -> $(readlink "$p")"
	elif [ -d "$p" ]; then echo "d $(stat -c %a "$p") $p"
	else echo "f $(stat -c %a "$p") $p $(sha256sum <"$p" | cut -c1-64)"; fi
done'
hlist() { sh -c "$LIST" sh "$1"; }
glist() { c exec "$1" -- sh -c "$LIST" sh /workspace; }
# same_tree SANDBOX DIR: whether the guest's /workspace and DIR list the
# same; their differences go to $err (shown when a check fails).
same_tree() {
	glist "$1" >"$rt/g.list" 2>"$err" && hlist "$2" >"$rt/h.list" &&
		diff "$rt/g.list" "$rt/h.list" >"$err"
}
# Files only, in one process per side (for the 1000-file tree).
FLIST='cd "$1" && find . -type f ! -path "./.capsule-merge.*" -exec sha256sum {} + | LC_ALL=C sort -k2'
hflist() { sh -c "$FLIST" sh "$1"; }
gflist() { c exec "$1" -- sh -c "$FLIST" sh /workspace; }

echo "1..50"

# --- the project ------------------------------------------------------------
proj="$rt/proj"
mkdir -p "$proj/sub/deep" "$proj/empty"
echo readme >"$proj/README.md"
i=1; while [ $i -le 20 ]; do echo "line $i" >>"$proj/notes.txt"; i=$((i + 1)); done
printf '#!/bin/sh\necho ran\n' >"$proj/run.sh" && chmod 755 "$proj/run.sh"
echo secret >"$proj/private.txt" && chmod 600 "$proj/private.txt"
echo a >"$proj/sub/a.txt"
echo b >"$proj/sub/deep/b.txt"
echo g >"$proj/g.txt"
echo h >"$proj/h.txt"
ln -s ../README.md "$proj/sub/link"
ln -s deep "$proj/sub/dl"
printf 'bin\000ary\001' >"$proj/bin.dat"
outside="$rt/outside"
mkdir -p "$outside"

c image build base >"$out" 2>"$err"
check "image build base" 'grep -q "^built base" "$out"'

c create w --workspace "$proj" >"$out" 2>"$err"
check "create --workspace copies the project, saying where and how big" 'grep -q "created sandbox w" "$out" && grep -q "^workspace: $proj copied to /workspace (a 512 MiB disk)" "$out" && [ -f "$(sbdir w)/workspace.ext4" ] && [ -f "$(sbdir w)/workspace.base" ]'
c inspect w >"$out" 2>"$err"
check "inspect shows the workspace, its disk and its base" 'grep -q "^workspace:  $proj" "$out" && grep -q "^ws disk:    512 MiB" "$out" && grep -q "^ws base:    14 entries" "$out"'
modes=$(stat -c '%a' "$(sbdir w)/workspace.ext4" "$(sbdir w)/workspace.base" | tr '\n' ' ')
check "the workspace disk and base are 0600 ($modes)" '[ "$modes" = "600 600 " ]'

c exec w -- sh -c 'cd /workspace && stat -c "%u:%g %a %n" README.md run.sh private.txt sub sub/deep/b.txt empty . && readlink sub/link && readlink sub/dl && cat sub/link sub/dl/b.txt && ls -a' >"$out" 2>"$err"
check "in the guest: nested dirs, modes and relative links are kept, all owned by 1000" 'grep -qx "1000:1000 644 README.md" "$out" && grep -qx "1000:1000 755 run.sh" "$out" && grep -qx "1000:1000 600 private.txt" "$out" && grep -qx "1000:1000 755 sub" "$out" && grep -qx "1000:1000 644 sub/deep/b.txt" "$out" && grep -qx "1000:1000 755 empty" "$out" && grep -q "^1000:1000 [0-7]* \.$" "$out" && grep -qx "../README.md" "$out" && grep -qx deep "$out" && grep -qx readme "$out" && grep -qx b "$out" && ! grep -q lost+found "$out"'
c exec w -- sh -c 'grep " /workspace " /proc/mounts; /workspace/run.sh' >"$out" 2>"$err"
check "/workspace is its own ext4, nosuid,nodev, and runs the project's scripts" 'grep -q "ext4" "$out" && grep -q nosuid "$out" && grep -q nodev "$out" && grep -qx ran "$out"'
check "a sandbox with a workspace starts from a template of its own shape" 'grep -q "restored from template" "$(sbdir w)/shim.log" && [ "$(tcount)" -eq 1 ]'
check "the guest's copy is the project, entry for entry" 'same_tree w "$proj"'

# --- refusals -----------------------------------------------------------------
mkdir -p "$rt/bad1/x" "$rt/bad2/y"
echo ok >"$rt/bad1/fine"
ln -s /etc/passwd "$rt/bad1/x/abs"
mkfifo "$rt/bad2/y/fifo"
c create b1 --workspace "$rt/bad1" >"$out" 2>"$err"
rc=$?
check "an absolute link is refused by name, nothing is left" '[ "$rc" -ne 0 ] && grep -q "x/abs is a symbolic link to /etc/passwd" "$err" && [ ! -e "$(sbdir b1)" ] && ! c ls | grep -q "^b1 "'
c create b2 --workspace "$rt/bad2" >"$out" 2>"$err"
rc=$?
check "a FIFO is refused by name, nothing is left" '[ "$rc" -ne 0 ] && grep -q "y/fifo is a FIFO" "$err" && [ ! -e "$(sbdir b2)" ] && ! c ls | grep -q "^b2 "'
c create b3 --workspace "$proj" --workspace-size 16 >"$out" 2>"$err"
rc=$?
check "a --workspace-size too small is refused naming both" '[ "$rc" -eq 2 ] && grep -q -- "--workspace-size 16 MiB is too small for $proj" "$err" && grep -q "at least [0-9]* MiB" "$err" && [ ! -e "$(sbdir b3)" ]'

# --- the acceptance run of issue 16 ------------------------------------------
before=$(hlist "$proj")
c exec w -- sh -c 'echo fix >> /workspace/README.md' >"$out" 2>"$err" &&
	c diff w >"$out" 2>"$err"
check "acceptance: diff shows README.md modified and nothing else" '[ "$(cat "$out")" = "M README.md" ] && grep -q "1 change in /workspace: 0 added, 1 modified" "$err"'
c merge w >"$out" 2>"$err"
rc=$?
after=$(hlist "$proj")
changed=$(printf '%s\n' "$before" "$after" | sort | uniq -u | awk '{ print $3 }' | sort -u)
check "acceptance: merge changes README.md and nothing else" '[ "$rc" -eq 0 ] && [ "$changed" = ./README.md ] && [ "$(cat "$proj/README.md")" = "$(printf "readme\nfix")" ] && grep -q "^merged: 1 written, 0 removed" "$out"'
c diff w >"$out" 2>"$err"
check "after a merge the base is the sandbox's state: no changes" '[ ! -s "$out" ] && grep -q "no changes in /workspace" "$err"'

# --- diff -------------------------------------------------------------------------
c exec w -- sh -c 'cd /workspace && sed -i "s/^line 5$/line five/" notes.txt && echo "line 21" >> notes.txt &&
	echo new > new.txt && mkdir sub/newdir && echo n > sub/newdir/n.txt && rm sub/a.txt &&
	chmod 700 run.sh && printf "bin\000ARY" > bin.dat' >"$out" 2>"$err"
c diff w >"$out" 2>"$err"
rc=$?
want='M bin.dat
A new.txt
M notes.txt
m run.sh (0755 -> 0700)
D sub/a.txt
A sub/newdir
A sub/newdir/n.txt'
check "edit + add + delete + chmod: diff lists exactly those, sorted" '[ "$rc" -eq 0 ] && [ "$(cat "$out")" = "$want" ] && grep -q "7 changes in /workspace: 3 added, 2 modified, 1 deleted, 1 mode, 0 type" "$err"'
c diff w --json >"$out" 2>"$err"
check "--json: every change with its kind, type, modes, size and hash" 'python3 - "$out" <<EOF
import hashlib, json, sys
j = json.load(open(sys.argv[1]))
ch = {c["path"]: c for c in j["changes"]}
assert j["sandbox"] == "w"
assert sorted(ch) == ["bin.dat", "new.txt", "notes.txt", "run.sh", "sub/a.txt", "sub/newdir", "sub/newdir/n.txt"], sorted(ch)
assert ch["new.txt"]["change"] == "added" and ch["new.txt"]["type"] == "file" and ch["new.txt"]["old_mode"] is None
assert ch["new.txt"]["size"] == 4 and ch["new.txt"]["sha256"] == hashlib.sha256(b"new\n").hexdigest()
assert ch["run.sh"]["change"] == "mode" and ch["run.sh"]["mode"] == "0700" and ch["run.sh"]["old_mode"] == "0755"
assert ch["sub/a.txt"]["change"] == "deleted" and ch["sub/a.txt"]["mode"] is None and ch["sub/a.txt"]["sha256"] is None
assert ch["sub/newdir"]["type"] == "dir" and ch["sub/newdir"]["size"] is None
assert ch["notes.txt"]["change"] == "modified"
EOF'
c diff w --patch >"$out" 2>"$err"
rc=$?
cp "$proj/notes.txt" "$rt/notes.base"
c exec w -- cat /workspace/notes.txt >"$rt/notes.guest"
diff -u --label a/notes.txt --label b/notes.txt "$rt/notes.base" "$rt/notes.guest" | sed -n '/^@@/,$p' >"$rt/want.hunks"
awk '/^diff a\/notes.txt b\/notes.txt$/ { on = 1; next } /^diff / { on = 0 } on && /^@@/ { h = 1 } on && h' "$out" >"$rt/got.hunks"
check "--patch: the hunks of a modified file are diff -u's" '[ "$rc" -eq 0 ] && [ -s "$rt/want.hunks" ] && cmp -s "$rt/want.hunks" "$rt/got.hunks" && grep -q "^--- a/notes.txt$" "$out" && grep -q "^+++ b/notes.txt$" "$out"'
check "--patch: added files against /dev/null, deleted ones to it, binaries named, modes shown" 'grep -q "^+++ b/new.txt$" "$out" && grep -q "^+new$" "$out" && grep -A3 "^diff a/sub/a.txt" "$out" | grep -q "^+++ /dev/null" && grep -q "^Binary files a/bin.dat and b/bin.dat differ$" "$out" && grep -q "^old mode 0755$" "$out" && grep -q "^new mode 0700$" "$out"'
echo "host edit" >>"$proj/notes.txt"
c diff w --patch >"$out" 2>"$err"
check "--patch: a host file changed since the base has no base version, said so" 'grep -A2 "^diff a/notes.txt" "$out" | grep -q "base version not available: the host file changed since the base"'
cp "$rt/notes.base" "$proj/notes.txt"

# --- merge ----------------------------------------------------------------------
c merge w --dry-run >"$out" 2>"$err"
rc=$?
check "--dry-run prints the plan and writes nothing" '[ "$rc" -eq 0 ] && grep -q "^write  new.txt" "$out" && grep -q "^remove sub/a.txt" "$out" && grep -q "^mkdir  sub/newdir" "$out" && [ ! -e "$proj/new.txt" ] && [ -e "$proj/sub/a.txt" ]'
c merge w >"$out" 2>"$err"
rc=$?
check "merge into the untouched project: 0, with its summary" '[ "$rc" -eq 0 ] && grep -q "^merged: 4 written, 1 removed, 0 links, 1 directories made, 1 modes changed into $proj" "$out"'
check "the project is now the guest's /workspace, byte for byte, modes and links too" 'same_tree w "$proj" && [ ! -e "$proj/.capsule-merge.w" ]'

# Both sides change one file: a conflict, nothing written.
c exec w -- sh -c 'echo guest >> /workspace/notes.txt && echo other > /workspace/other.txt' >/dev/null 2>&1
echo host >>"$proj/notes.txt"
before=$(hlist "$proj")
c merge w --dry-run >"$out" 2>"$err"
rc1=$?
c merge w >"$out" 2>"$err"
rc=$?
check "both changed notes.txt: exit 1, the path named, nothing written" '[ "$rc1" -eq 1 ] && [ "$rc" -eq 1 ] && grep -q "^conflict: notes.txt: " "$err" && grep -q "nothing was written" "$err" && grep -q -- "--theirs" "$err" && [ "$(hlist "$proj")" = "$before" ] && [ ! -e "$proj/other.txt" ] && [ ! -e "$proj/.capsule-merge.w" ]'
c merge w --theirs >"$out" 2>"$err"
rc=$?
check "--theirs settles it with the sandbox's version" '[ "$rc" -eq 0 ] && [ "$(tail -1 "$proj/notes.txt")" = guest ] && [ "$(cat "$proj/other.txt")" = other ]'

# The next merge brings only what changed since; a host-only change stays.
c exec w -- sh -c 'echo g2 >> /workspace/g.txt' >/dev/null 2>&1
echo "h host" >>"$proj/h.txt"
c merge w >"$out" 2>"$err"
rc=$?
check "a second merge writes only the new change and keeps the host-only one" '[ "$rc" -eq 0 ] && grep -q "^merged: 1 written, 0 removed, 0 links, 0 directories made, 0 modes" "$out" && [ "$(cat "$proj/g.txt")" = "$(printf "g\ng2")" ] && [ "$(cat "$proj/h.txt")" = "$(printf "h\nh host")" ]'
c exec w -- sh -c 'echo h3 >> /workspace/README.md' >/dev/null 2>&1
c merge w >"$out" 2>"$err"
check "a host-only change is not undone by a later merge" '[ "$(cat "$proj/h.txt")" = "$(printf "h\nh host")" ] && [ "$(tail -1 "$proj/README.md")" = h3 ]'

# A symbolic link planted where the merge writes is never followed: the
# host's sub (a directory in the base) becomes a link to a directory
# outside the project, and the guest adds a file below sub.
c exec w -- sh -c 'echo new > /workspace/sub/planted.txt' >/dev/null 2>&1
mv "$proj/sub" "$rt/sub.real" && ln -s "$outside" "$proj/sub"
c merge w >"$out" 2>"$err"
rc=$?
check "a planted symlink: a conflict naming the path, nothing written, the outside dir untouched" '[ "$rc" -eq 1 ] && grep -q "^conflict: sub/planted.txt: " "$err" && [ -z "$(ls -A "$outside")" ] && [ -L "$proj/sub" ] && [ "$(readlink "$proj/sub")" = "$outside" ]'
c merge w --theirs >"$out" 2>"$err"
rc=$?
check "--theirs replaces the link itself with the sandbox's directory, never writing through it" '[ "$rc" -eq 0 ] && [ -z "$(ls -A "$outside")" ] && [ ! -L "$proj/sub" ] && [ -d "$proj/sub" ] && [ "$(cat "$proj/sub/planted.txt")" = new ]'
cp -a "$rt/sub.real/." "$proj/sub/" && rm -rf "$rt/sub.real"
echo h >"$proj/h.txt"	# the host-only change of above, undone
check "with the directory's files back, the project is the guest's again" 'same_tree w "$proj"'

# Two diffs or merges of one sandbox never run at once: the second waits.
flock "$(sbdir w)/workspace.lock" sleep 3 &
holder=$!
sleep 0.5
t0=$(date +%s)
c diff w >"$out" 2>"$err"
rc=$?
t1=$(date +%s)
wait $holder
check "a diff waits for another diff or merge of the sandbox, and says so" '[ "$rc" -eq 0 ] && grep -q "another diff or merge of sandbox .w. is running; waiting" "$err" && [ $((t1 - t0)) -ge 2 ]'
# Two merges into one project never interleave: the second waits for the
# project directory's lock (another sandbox's, or a server's, merge).
c exec w -- sh -c 'echo locked >> /workspace/README.md' >/dev/null 2>&1
flock "$proj" sleep 3 &
holder=$!
sleep 0.5
t0=$(date +%s)
c merge w >"$out" 2>"$err"
rc=$?
t1=$(date +%s)
wait $holder
check "a merge waits for another merge into the project, and says so" '[ "$rc" -eq 0 ] && grep -q "another merge into $proj is running; waiting" "$err" && [ $((t1 - t0)) -ge 2 ] && [ "$(tail -1 "$proj/README.md")" = locked ]'

# diff and merge on a stopped sandbox start it.
c exec w -- sh -c 'echo stopped > /workspace/stopped.txt' >/dev/null 2>&1
c stop w
st=$(state w)
c diff w >"$out" 2>"$err"
check "diff of a stopped sandbox starts it and answers" '[ "$st" = stopped ] && [ "$(cat "$out")" = "A stopped.txt" ] && [ "$(state w)" = running ]'
c merge w --git >"$out" 2>"$err"
rc=$?
check "merge --git refuses a project that is not a git work tree" '[ "$rc" -ne 0 ] && grep -q "not a git work tree" "$err"'
elapsed "diff and merge done"

# --- what a review reads, what a merge writes (issue 30) -------------------------
# A 1 GiB sparse file of the guest's (a few KiB of data): --patch reads
# only its start and says binary, writing next to nothing into TMPDIR
# (sampled while it runs: capsule removes its directory at the end); a
# file of text with terminal controls shows them visibly on a terminal
# and as they are to a pipe; a directory shaped like a bare repository
# is left out of the merge, named; the merge keeps the holes.
c exec w -- sh -c 'cd /workspace && truncate -s 1G sparse.bin && printf "data\000" | dd of=sparse.bin bs=4096 seek=16 conv=notrunc 2>/dev/null &&
	printf "run_evil();\033[2K\r// harmless\n" > evil.c &&
	mkdir -p vendor/evil/objects vendor/evil/refs/heads && echo "ref: refs/heads/main" > vendor/evil/HEAD &&
	printf "[core]\n\tfsmonitor = /tmp/evil-ran\n" > vendor/evil/config && echo ok > vendor/plain.txt' >"$out" 2>"$err"
ptmp="$rt/ptmp"
mkdir -p "$ptmp"
t0=$(date +%s)
c diff w >/dev/null 2>&1
t1=$(date +%s)
TMPDIR="$ptmp" "$capsule" diff w --patch >"$out" 2>"$err" &
pid=$!
peak=0
while kill -0 $pid 2>/dev/null; do
	k=$(du -sk "$ptmp" 2>/dev/null | cut -f1)
	[ "${k:-0}" -gt $peak ] && peak=$k
	sleep 0.2
done
wait $pid
rc=$?
t2=$(date +%s)
echo "# diff $((t1 - t0)) s, diff --patch $((t2 - t1)) s, TMPDIR peak $peak KiB"
# Both take the guest's manifest, which hashes the 1 GiB (a minute or
# more under TCG, varying with load): the bound on time is loose, the
# one on TMPDIR is what tells (the review wrote 1 GiB there before).
check "--patch of a 1 GiB sparse file: binary, TMPDIR never over 4 MiB ($peak KiB), in $((t2 - t1)) s (diff: $((t1 - t0)) s)" '[ "$rc" -eq 0 ] && grep -qx "Binary files /dev/null and b/sparse.bin differ" "$out" && [ "$peak" -lt 4096 ] && [ $((t2 - t1)) -le $((2 * (t1 - t0) + 30)) ]'
check "--patch to a pipe keeps a file's bytes (the patch still applies)" 'grep -qF "$(printf "+run_evil();\033[2K\r// harmless")" "$out"'
script -qec "\"$capsule\" diff w --patch" /dev/null >"$rt/tty.out" 2>&1
check "--patch on a terminal shows ESC and CR visibly" 'grep -qF "+run_evil();^[[2K^M// harmless" "$rt/tty.out" && ! grep -qF "$(printf "\033[2K")" "$rt/tty.out"'
c merge w >"$out" 2>"$err"
rc=$?
used=$(du -k "$proj/sparse.bin" 2>/dev/null | cut -f1)
size=$(stat -c %s "$proj/sparse.bin" 2>/dev/null)
# The same file made on the host (hashing 1 GiB in a TCG guest outlasts
# exec's timeout; the merge checked the staged copy against the guest's
# hash already).
truncate -s 1G "$rt/sparse.want" && printf 'data\000' | dd of="$rt/sparse.want" bs=4096 seek=16 conv=notrunc 2>/dev/null
check "merge keeps the holes: 1 GiB of size, $used KiB on disk" '[ "$rc" -eq 0 ] && [ "$size" = 1073741824 ] && [ "$used" -lt 4096 ] && cmp -s "$rt/sparse.want" "$proj/sparse.bin"'
check "a directory shaped like a bare repository is left out of the merge, named; the rest merged" '[ ! -e "$proj/vendor/evil" ] && [ "$(cat "$proj/vendor/plain.txt")" = ok ] && grep -q "left out [0-9]* changes inside .git or other git repositories" "$err" && grep -q "vendor/evil (shaped like a git repository" "$err"'
c exec w -- sh -c 'rm -rf /workspace/vendor/evil /workspace/sparse.bin /workspace/evil.c' >/dev/null 2>&1
c merge w >/dev/null 2>&1
rm -f "$rt/sparse.want"

# --- kill -9 during a merge of 1000 files --------------------------------------
big="$rt/big"
mkdir -p "$big"
i=0; while [ $i -lt 10 ]; do mkdir "$big/d$i"; j=0; while [ $j -lt 100 ]; do
	head -c 2000 /dev/zero | tr '\0' o >"$big/d$i/f$j"; j=$((j + 1)); done; i=$((i + 1)); done
c create k --workspace "$big" >"$out" 2>"$err"
# The generation of every file's content: old (o...) or a new one (g1...).
WRITE='gen=$1; for d in /workspace/d*; do for f in $d/f*; do head -c 8000 /dev/zero | tr "\0" "$gen" > $f.tmp && mv $f.tmp $f; done; done'
# gens: the content kinds of the host tree ("o 1000", "1 600\no 400"...);
# torn: the files that are neither wholly old (2000 x o) nor wholly one
# new generation (8000 x the digit).
gens() { tree_py gens; }
torn() { tree_py torn; }
tree_py() {
	python3 - "$1" "$big" <<'EOF'
import collections, glob, sys
kinds, torn = collections.Counter(), []
for f in sorted(glob.glob(sys.argv[2] + "/d*/f*")):
    b = open(f, "rb").read()
    ch = b[:1].decode() if b else "?"
    kinds[ch] += 1
    if not b or b.count(b[:1]) != len(b) or len(b) != (2000 if ch == "o" else 8000):
        torn.append(f)
if sys.argv[1] == "gens":
    print("\n".join("%s %d" % kv for kv in sorted(kinds.items())))
else:
    print("\n".join(torn), end="")
EOF
}
c exec k -- sh -c "$WRITE" sh 1 >"$out" 2>"$err"
# Kill it at a moment found by bisection (tenths of a second) until the
# host tree holds both generations: killed while renaming.
delay=5 lo=0 hi=0
midway=no attempt=1 bad="" old=o gen=1
has() { echo "$g" | grep -q "^$1 "; }
while [ $attempt -le 8 ] && [ $midway = no ]; do
	"$capsule" merge k >"$rt/kill.out" 2>"$rt/kill.err" &
	pid=$!
	sleep "$(awk -v d="$delay" 'BEGIN { print d / 10 }')"
	kill -9 $pid 2>/dev/null
	wait $pid 2>/dev/null
	bad="$bad$(torn)"
	g=$(gens)
	echo "# kill -9 after $delay/10 s: $(echo "$g" | tr '\n' ' ')"
	if has "$old" && has "$gen"; then
		midway=yes
	elif has "$old"; then	# killed before any rename
		lo=$delay
		if [ $hi -gt 0 ]; then delay=$(((lo + hi) / 2)); else delay=$((delay * 2)); fi
	else	# finished: settle it, then a newer generation in the guest
		hi=$delay
		delay=$(((lo + hi) / 2))
		c merge k >/dev/null 2>&1
		old=$gen gen=$((gen + 1))
		c exec k -- sh -c "$WRITE" sh $gen >/dev/null 2>&1
	fi
	[ $delay -ge 1 ] || delay=1
	attempt=$((attempt + 1))
done
echo "# midway reached: $midway"
check "kill -9 during a merge of 1000 files leaves every file old or new, never torn" '[ -z "$bad" ]'
c merge k >"$out" 2>"$err"
rc=$?
check "merging again finishes it: the project is the guest's, file for file" '[ "$rc" -eq 0 ] && [ "$(gflist k)" = "$(hflist "$big")" ] && [ ! -e "$big/.capsule-merge.k" ]'
check "a second sandbox with a workspace restores the same template" 'grep -q "restored from template" "$(sbdir k)/shim.log" && [ "$(tcount)" -eq 1 ]'
c rm --force k >/dev/null 2>&1
elapsed "kill test done"

# --- --git --------------------------------------------------------------------
# An image with git, built from this host's files: busybox, git and the
# libraries it links.
gi="$rt/gitimg"
mkdir -p "$gi/bin" "$gi/usr/bin" "$gi/usr/lib/git-core" "$gi/etc" "$gi/tmp" "$gi/work" "$gi/workspace" "$gi/source" "$gi/proc" "$gi/sys" "$gi/dev" "$gi/root" "$gi/run"
chmod 1777 "$gi/tmp"
cp /bin/busybox "$gi/bin/busybox"
for a in $(/bin/busybox --list); do [ -e "$gi/bin/$a" ] || ln -s busybox "$gi/bin/$a"; done
gitbin=$(command -v git)
cp "$gitbin" "$gi/usr/bin/git"
cp "$gitbin" "$gi/usr/lib/git-core/git"
for lib in $(ldd "$gitbin" | awk '/=> \// { print $3 } /^\t\/lib/ { print $1 }'); do
	mkdir -p "$gi$(dirname "$lib")" && cp -L "$lib" "$gi$lib"
done
printf 'root:x:0:0:root:/root:/bin/sh\nuser:x:1000:1000:user:/work:/bin/sh\n' >"$gi/etc/passwd"
printf 'root:x:0:\nuser:x:1000:\n' >"$gi/etc/group"
c image import "$gi" --name gitimg >"$out" 2>"$err"
check "an image with git imports" 'grep -q "^imported gitimg" "$out"'
repo="$rt/repo"
mkdir -p "$repo"
git -C "$repo" init -q && echo one >"$repo/file.txt" && git -C "$repo" add file.txt &&
	git -C "$repo" -c user.name=h -c user.email=h@h commit -q -m first
head_before=$(git -C "$repo" rev-parse HEAD)
c create g --image gitimg --workspace "$repo" >"$out" 2>"$err"
c exec g -- sh -c 'cd /workspace && echo two >> file.txt && git -c user.name=a -c user.email=a@b commit -q -am "made in the guest" && git log --format=%s -1' >"$out" 2>"$err"
check "a commit is made in the guest's /workspace" 'grep -qx "made in the guest" "$out"'
rbefore=$(hlist "$repo")
c merge g --git >"$out" 2>"$err"
rc=$?
check "--git fetches the guest's commit into capsule/g, naming it" '[ "$rc" -eq 0 ] && [ "$(git -C "$repo" log --format=%s -1 capsule/g)" = "made in the guest" ] && [ "$(git -C "$repo" rev-parse capsule/g~1)" = "$head_before" ] && grep -q "capsule/g" "$out" && grep -q "$(git -C "$repo" rev-parse capsule/g)" "$out"'
check "--git leaves the host working tree, HEAD and the base alone" '[ "$(hlist "$repo" | grep -v "^. [0-7]* ./.git")" = "$(echo "$rbefore" | grep -v "^. [0-7]* ./.git")" ] && [ "$(git -C "$repo" rev-parse HEAD)" = "$head_before" ] && [ "$(cat "$repo/file.txt")" = one ] && c diff g 2>/dev/null | grep -qx "M file.txt"'
c merge w --git --into "$repo" >"$out" 2>"$err"
rc=$?
check "--git with an image without git says so" '[ "$rc" -ne 0 ] && grep -q "the image has no git" "$err"'
# A plain merge never writes inside .git: the guest's config (which could
# name a program for the host's git to run) and hooks stay in the guest.
gitcfg=$(sha256sum <"$repo/.git/config")
c exec g -- sh -c 'cd /workspace && printf "[core]\n\tfsmonitor = /tmp/evil\n" >> .git/config && printf "#!/bin/sh\n" > .git/hooks/pre-commit && chmod 755 .git/hooks/pre-commit' >/dev/null 2>&1
c merge g >"$out" 2>"$err"
rc=$?
check "a plain merge leaves out every change inside .git, says so, and merges the rest" '[ "$rc" -eq 0 ] && [ "$(sha256sum <"$repo/.git/config")" = "$gitcfg" ] && [ ! -e "$repo/.git/hooks/pre-commit" ] && [ "$(cat "$repo/file.txt")" = "$(printf "one\ntwo")" ] && grep -q "left out [0-9]* changes inside .git" "$err"'
# --into another directory leaves the base: the changes still reach the
# project afterwards.
c exec w -- sh -c 'echo review >> /workspace/README.md' >/dev/null 2>&1
mkdir -p "$rt/review" && cp -a "$proj/." "$rt/review/"
c merge w --into "$rt/review" >"$out" 2>"$err"
rc1=$?
c merge w >"$out" 2>"$err"
rc=$?
check "merge --into another directory leaves the base: the project still gets the change" '[ "$rc1" -eq 0 ] && [ "$rc" -eq 0 ] && [ "$(tail -1 "$rt/review/README.md")" = review ] && [ "$(tail -1 "$proj/README.md")" = review ]'

for s in w g; do c rm --force $s >/dev/null 2>&1; done
check "rm removes the workspace disk and base, never the project" '[ ! -e "$(sbdir w)" ] && [ -f "$proj/README.md" ] && [ -d "$repo/.git" ]'
elapsed "workspace suite"
clean_after "workspace suite"
