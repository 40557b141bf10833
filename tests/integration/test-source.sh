#!/bin/sh
# Black-box tests of public data projected at /source: read-only and
# noexec in the guest, link attacks refused by name before boot,
# node_modules left out, caps, and refresh of a named sandbox. TAP output.
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
. "$(dirname "$0")/lib.sh"
c() { "$capsule" "$@"; }
pub="$rt/pub"
mkdir -p "$pub/sub/deep" "$pub/node_modules/x" "$pub/sub/Node_Modules/y"
echo hi >"$pub/a.txt"
echo deep >"$pub/sub/deep/b.txt"
printf '#!/bin/sh\necho ran\n' >"$pub/script.sh" && chmod 755 "$pub/script.sh"
echo js >"$pub/node_modules/x/index.js"
ln -s /etc/passwd "$pub/node_modules/evil"
mkfifo "$pub/node_modules/x/pipe"
mkdir "$pub/node_modules/locked" && chmod 000 "$pub/node_modules/locked"
echo y >"$pub/sub/Node_Modules/y/file"

echo "1..37"

c run -q --source "$pub" -- cat /source/a.txt /source/sub/deep/b.txt >"$out" 2>"$err"
check "the projection is readable at /source" '[ "$(cat "$out")" = "$(printf "hi\ndeep")" ]'
c run -q --source "$pub" -- sh -c 'ls -a /source /source/sub' >"$out" 2>"$err"
check "node_modules in any case is left out, links and special files in it ignored" '! grep -qi node_modules "$out" && grep -qx a.txt "$out"'
c run -q --source "$pub" -- sh -c 'grep " /source " /proc/mounts' >"$out" 2>"$err"
check "/source is mounted ro,nosuid,nodev,noexec" 'grep -q " ro," "$out" && grep -q nosuid "$out" && grep -q nodev "$out" && grep -q noexec "$out"'

# Every kind of mutation fails with EROFS; nothing runs from /source.
c run -q --source "$pub" -- sh -c 'exec 2>&1
	echo x > /source/a.txt || true
	rm /source/a.txt 2>&1 || true
	mv /source/a.txt /source/z 2>&1 || true
	chmod 777 /source/a.txt 2>&1 || true
	touch /source/a.txt 2>&1 || true
	mkdir /source/newdir 2>&1 || true
	/source/script.sh 2>&1 || echo "exec-status=$?"
	cat /source/a.txt' >"$out" 2>"$err"
for what in "can't create /source/a.txt" "rm: can't remove '/source/a.txt'" "mv: can't rename '/source/a.txt'" "chmod: /source/a.txt" "touch: /source/a.txt" "mkdir: can't create directory '/source/newdir'"; do
	check "$what: Read-only file system" 'grep "$what" "$out" | grep -q "Read-only file system"'
done
check "a script in /source cannot be executed (noexec)" 'grep -q "Permission denied" "$out" && grep -q "exec-status=126" "$out" && ! grep -qx ran "$out"'
check "the content is intact after the attempts" 'tail -1 "$out" | grep -qx hi'

# Link attacks, at the top and deep, refused by name before any VM starts.
attack() { # attack WHERE MAKE-COMMAND LABEL [OTHER-NAME]
	eval "$2"
	c run -q --source "$pub" -- true >"$out" 2>"$err"
	rc=$?
	rel=${1#$pub/}
	named="public data ($rel|${4:-$rel}) "
	check "$3 at $rel is refused before boot, named" '[ "$rc" -eq 125 ] && grep -Eq "$named" "$err" && [ "$(ours)" -eq 0 ]'
	rm -f "$1"
}
for where in "$pub/p" "$pub/sub/deep/p"; do
	attack "$where" 'ln -s /etc/passwd "$where"' "a symlink to /etc/passwd"
	attack "$where" 'ln -s "$where" "$where"' "a symlink loop"
	attack "$where" 'ln "$pub/a.txt" "$where"' "a hard link" a.txt
	attack "$where" 'mkfifo "$where"' "a FIFO"
done

# Caps: one entry over is refused, naming the cap and the size.
entries=$(find "$pub" -iname node_modules -prune -o -mindepth 1 -print | wc -l)
CAPSULE_SOURCE_MAX_ENTRIES=$((entries - 1)) c run -q --source "$pub" -- true >"$out" 2>"$err"
check "a tree one entry over the cap is refused, naming both" '[ $? -eq 125 ] && grep -q "has $entries entries, over the cap of $((entries - 1))" "$err"'
CAPSULE_SOURCE_MAX_ENTRIES=$entries c run -q --source "$pub" -- true >"$out" 2>"$err"
check "a tree exactly at the cap is accepted" '[ $? -eq 0 ]'

# What the erofs image builder cannot take is refused by `source check`
# (the walk the build uses), naming the path and the limit: names over 254
# bytes, paths over 3072 bytes, more than 128 levels. The limits
# themselves build. (A 256-byte name cannot exist on Linux: NAME_MAX.)
rep() { printf "%${2}s" "" | tr ' ' "$1"; }
longpath() { # longpath CHAR LEN: a relative path of exactly LEN bytes
	p="" left=$2
	while [ "$left" -gt 201 ]; do p="$p$(rep "$1" 200)/"; left=$((left - 201)); done
	echo "$p$(rep "$1" "$left")"
}
shape="$rt/shape"
shapecheck() { # shapecheck LABEL 'MAKE' 'MESSAGE'
	rm -rf "$shape" && mkdir -p "$shape" && (cd "$shape" && eval "$2")
	c source check "$shape" >"$out" 2>"$err"
	rc=$? want=$3
	check "$1 is refused by source check (exit $rc), naming the path and the limit" '[ "$rc" -eq 125 ] && grep -qF -- "$want" "$err"'
}
n255=$(rep n 255)
shapecheck "a 255-byte file name" 'mkdir sub && touch "sub/$n255"' "public data sub/$n255 has a name of 255 bytes, over the limit of 254 bytes"
shapecheck "a 255-byte directory name" 'mkdir -p "$n255/x"' "public data $n255 has a name of 255 bytes, over the limit of 254 bytes"
p3073=$(longpath p 3073)
shapecheck "a path of 3073 bytes" 'mkdir -p "${p3073%/*}" && touch "$p3073"' "is a path of 3073 bytes, over the limit of 3072 bytes"
check "the long path is shown shortened, its start and its end" 'grep -qF "public data $(rep p 100)[... 2873 bytes ...]" "$err" && grep -qF "$(echo "$p3073" | tail -c 101) is a path" "$err"'
d129=$(printf 'd/%.0s' $(seq 128))f
shapecheck "a file 129 levels deep" 'mkdir -p "${d129%/*}" && touch "$d129"' "is 129 levels deep, over the limit of 128 levels"

# The longest of each: a 254-byte name, a 3072-byte path, 128 levels.
p3072=$(longpath q 3072)
d128=$(printf 'e/%.0s' $(seq 127))f
rm -rf "$shape" && mkdir -p "$shape/${p3072%/*}" "$shape/${d128%/*}" && touch "$shape/$(rep n 254)" && echo longest >"$shape/$p3072" && touch "$shape/$d128"
c source check "$shape" >"$out" 2>"$err" && c source build "$shape" "$rt/shape.erofs" >>"$out" 2>>"$err"
rc=$?
check "the longest name, path and depth pass source check and build (exit $rc), the image 0600" '[ "$rc" -eq 0 ] && [ "$(stat -c %a "$rt/shape.erofs")" = 600 ]'
c run -q --source "$shape" -- cat "/source/$p3072" >"$out" 2>"$err"
check "the guest reads the file at the longest path, /source/<3072 bytes>" 'grep -qx longest "$out"'
rm -rf "$shape" "$rt/shape.erofs"

# A named sandbox: host changes show up on the next call, /work intact.
c image build base >/dev/null 2>&1
c create s --source "$pub" >"$out" 2>"$err"
check "create --source" 'grep -q "public data: $pub" "$out"'
modes() { (cd "$CAPSULE_HOME/sandboxes/s" && stat -c '%a %n' root-upper.ext4 private.ext4 source.erofs | tr '\n' ' '); }
m=$(modes)
check "its disk files are 0600 ($m)" '[ "$m" = "600 root-upper.ext4 600 private.ext4 600 source.erofs " ]'
c exec s -- sh -c 'cat /source/a.txt; echo mine > /work/w' >"$out" 2>"$err"
pid1=$(c inspect s | sed -n 's/^processes: .*qemu \([0-9]*\)/\1/p')
fp1=$(c inspect s | sed -n 's/^projection: .*fingerprint \([0-9a-f]*\)/\1/p')
c exec s -- true >/dev/null 2>&1
pid2=$(c inspect s | sed -n 's/^processes: .*qemu \([0-9]*\)/\1/p')
check "an unchanged tree does not restart the sandbox" '[ -n "$pid1" ] && [ "$pid1" = "$pid2" ]'
echo "hi again" >"$pub/a.txt"
c exec s -- sh -c 'cat /source/a.txt; cat /work/w' >"$out" 2>"$err"
check "a host change shows up on the next call, /work intact" '[ "$(cat "$out")" = "$(printf "hi again\nmine")" ]'
fp2=$(c inspect s | sed -n 's/^projection: .*fingerprint \([0-9a-f]*\)/\1/p')
check "inspect shows the new fingerprint" '[ -n "$fp1" ] && [ "$fp1" != "$fp2" ]'
m=$(modes)
check "the rebuilt source.erofs is 0600 too ($m)" '[ "$m" = "600 root-upper.ext4 600 private.ext4 600 source.erofs " ]'
ln -s /etc/passwd "$pub/sub/new-link"
c exec s -- true >"$out" 2>"$err"
check "a tree that breaks a rule fails the call, naming the path" '[ $? -ne 0 ] && grep -q "sub/new-link" "$err" && [ -f "$CAPSULE_HOME/sandboxes/s/private.ext4" ]'
rm "$pub/sub/new-link"
c exec s -- cat /work/w >"$out" 2>"$err"
check "after the fix the sandbox works, /work intact" 'grep -qx mine "$out"'
c rm --force s >/dev/null 2>&1
chmod 755 "$pub/node_modules/locked"
clean_after "source suite"
