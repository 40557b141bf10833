#!/bin/sh
# Black-box tests of `capsule cp` (files in and out of a named sandbox over
# its agent channel): a 50 MiB random binary both ways by checksum; a tree
# with nested directories, an executable bit, a relative link and a name
# with spaces and non-ASCII bytes both ways, modes and link kept; a
# directory without -r; an absolute link in the host tree refusing the
# whole copy; a link made in the guest that points out, left out and named
# while the rest comes out; a missing parent; paths outside the roots and
# writes to /source refused; a stopped sandbox started by cp. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
g() { c exec box -- "$@"; }	# a command in the sandbox
sum() { sha256sum "$1" | cut -d" " -f1; }

plan=22
suite="cp suite"
start=$(date +%s)
echo "1..$plan"

h="$rt/host"
mkdir -p "$h"
c image build base >"$out" 2>"$err" || fail_all "image build base failed (exit $?)"
c create box >"$out" 2>"$err" || fail_all "create box failed (exit $?)"
elapsed "sandbox made"

# --- a 50 MiB random binary, in and out ------------------------------------------
head -c 52428800 /dev/urandom >"$h/r.bin"
want=$(sum "$h/r.bin")
c cp "$h/r.bin" box:/work/ >"$out" 2>"$err"
rc=$?
check "cp of a 50 MiB file into the sandbox (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -qx "copied 1 file, 0 directories, 52428800 bytes" "$err"'
check "its checksum in the guest is the host's" \
	'[ "$(g sha256sum /work/r.bin 2>/dev/null | cut -d" " -f1)" = "$want" ]'
c cp box:/work/r.bin "$h/back.bin" >"$out" 2>"$err"
rc=$?
check "cp of it back out (exit $rc) round-trips by checksum" \
	'[ "$rc" -eq 0 ] && [ "$(sum "$h/back.bin")" = "$want" ]'
rm -f "$h/back.bin"
elapsed "50 MiB both ways"

# A copy in killed midway leaves the old file whole and no temporary file
# (the agent writes to an unnamed file and names it only once whole).
c cp "$h/r.bin" box:/work/r.bin >"$out" 2>"$err" &
pid=$!
sleep 1
kill -9 $pid 2>/dev/null
wait $pid 2>/dev/null
sleep 1
check "a copy in killed midway leaves the file whole and no temporary file in /work" \
	'[ "$(g sha256sum /work/r.bin 2>/dev/null | cut -d" " -f1)" = "$want" ] && [ -z "$(g ls -A /work | grep capsule-tmp)" ]'


# --- a tree -----------------------------------------------------------------------
uname="sp ace $(printf '\303\251t\303\251 \342\234\223').txt"
t="$h/t"
mkdir -p "$t/a/b" "$t/empty"
echo nested >"$t/a/b/f"
printf '#!/bin/sh\necho run\n' >"$t/x.sh"
chmod 755 "$t/x.sh"
chmod 750 "$t/a"
echo private >"$t/a/secret"
chmod 600 "$t/a/secret"
ln -s a/b/f "$t/l"
echo unicode >"$t/$uname"
c cp "$t" box:/work/ >"$out" 2>"$err"
rc=$?
check "a directory without -r is refused, nothing copied (exit $rc)" \
	'[ "$rc" -eq 1 ] && grep -q "is a directory; copy it with -r" "$err" && ! g test -e /work/t'
c cp -r "$t" box:/work/ >"$out" 2>"$err"
rc=$?
check "cp -r of a tree into the sandbox (exit $rc)" \
	'[ "$rc" -eq 0 ] && grep -qx "copied 4 files, 4 directories, 1 link, [0-9]* bytes" "$err"'
check "in the guest: nested file, modes 755/750/600, the relative link" \
	'[ "$(g cat /work/t/a/b/f)" = nested ] && [ "$(g stat -c %a /work/t/x.sh /work/t/a /work/t/a/secret | tr "\n" " ")" = "755 750 600 " ] && [ "$(g readlink /work/t/l)" = a/b/f ] && [ "$(g cat /work/t/l)" = nested ]'
check "the name with spaces and non-ASCII bytes arrives as it is" \
	'[ "$(g cat "/work/t/$uname")" = unicode ]'
check "what the guest holds belongs to its tool user" \
	'[ "$(g stat -c %u /work/t/x.sh)" = 1000 ]'
mkdir "$h/o"
c cp -r box:/work/t "$h/o" >"$out" 2>"$err"
rc=$?
check "cp -r of the tree back out into an existing directory (exit $rc)" \
	'[ "$rc" -eq 0 ] && diff -r "$t" "$h/o/t" >/dev/null'
check "out: modes 755/750/600 and the link (not a copy of its target) kept" \
	'[ "$(stat -c %a "$h/o/t/x.sh" "$h/o/t/a" "$h/o/t/a/secret" | tr "\n" " ")" = "755 750 600 " ] && [ -L "$h/o/t/l" ] && [ "$(readlink "$h/o/t/l")" = a/b/f ]'
c cp -r box:/work/t "$h/new" >"$out" 2>"$err"
check "to a path that does not exist the tree comes as that name" \
	'[ -x "$h/new/x.sh" ] && [ -d "$h/new/empty" ] && [ "$(cat "$h/new/$uname")" = unicode ]'
c cp "box:/work/t/$uname" "$h/u.txt" >"$out" 2>"$err" && c cp "$h/u.txt" "box:/work/t/a/$uname" >"$out" 2>"$err"
rc=$?
check "a single file named with spaces and unicode, out and back in (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ "$(cat "$h/u.txt")" = unicode ] && [ "$(g cat "/work/t/a/$uname")" = unicode ]'
elapsed "trees"

# --- links that leave the tree ------------------------------------------------------
mkdir -p "$h/t2/d"
echo keep >"$h/t2/d/keep"
ln -s /etc/passwd "$h/t2/d/abs"
ln -s ../../x "$h/t2/d/climb"
c cp -r "$h/t2" box:/work/ >"$out" 2>"$err"
rc=$?
check "an absolute and a climbing link in the host tree refuse the whole copy, each named (exit $rc)" \
	'[ "$rc" -eq 1 ] && grep -q "not copied: $h/t2/d/abs: a symbolic link to /etc/passwd" "$err" && grep -q "not copied: $h/t2/d/climb" "$err" && grep -q "nothing was copied" "$err" && ! g test -e /work/t2'
g ln -s /etc/passwd /work/t/esc
mkdir "$h/o2"
c cp -r box:/work/t "$h/o2" >"$out" 2>"$err"
rc=$?
check "a guest link pointing out is left out and named, the rest copied (exit $rc)" \
	'[ "$rc" -eq 1 ] && grep -q "^capsule: not copied: /work/t/esc: a symbolic link to /etc/passwd" "$err" && [ ! -e "$h/o2/t/esc" ] && [ ! -L "$h/o2/t/esc" ] && [ "$(cat "$h/o2/t/a/b/f")" = nested ] && [ -L "$h/o2/t/l" ]'

# --- refusals -----------------------------------------------------------------------
c cp "$h/r.bin" box:/work/nope/sub/x >"$out" 2>"$err"
rc=$?
check "copying into a missing parent fails and says so (exit $rc)" \
	'[ "$rc" -eq 1 ] && grep -q "box:/work/nope/sub, where box:/work/nope/sub/x would go, does not exist; create it first" "$err"'
c cp box:/work/r.bin "$h/nope/x" >"$out" 2>"$err"
rc=$?
check "copying out into a missing host directory fails and says so (exit $rc)" \
	'[ "$rc" -eq 1 ] && grep -q "the directory $h/nope (where $h/nope/x would go) does not exist" "$err"'
c cp box:/etc/passwd "$h/p" >"$out" 2>"$err"
rc=$?
check "a guest path outside /work, /workspace and /source is refused (exit $rc)" \
	'[ "$rc" -eq 2 ] && grep -q "only paths below /work, /workspace or /source" "$err" && [ ! -e "$h/p" ]'
c cp box:/work/../etc/passwd "$h/p" >"$out" 2>"$err"
rc=$?
check "a guest path with .. is refused (exit $rc)" '[ "$rc" -eq 2 ] && [ ! -e "$h/p" ]'
c cp "$h/u.txt" box:/source/ >"$out" 2>"$err"
rc=$?
check "copying into /source is refused (exit $rc)" '[ "$rc" -eq 1 ] && grep -q "/source is read-only" "$err"'

# --- a stopped sandbox ----------------------------------------------------------------
c stop box >"$out" 2>"$err"
c cp -q box:/work/t/x.sh "$h/x2.sh" >"$out" 2>"$err"
rc=$?
check "cp from a stopped sandbox starts it and copies (exit $rc, -q: no summary)" \
	'[ "$rc" -eq 0 ] && [ -x "$h/x2.sh" ] && [ ! -s "$err" ] && c ls 2>/dev/null | grep -q "^box .*running"'
elapsed "done"
c rm --force box >/dev/null 2>&1
check "the sandbox is removed, no QEMU left" '[ "$(ours)" -eq 0 ]'
