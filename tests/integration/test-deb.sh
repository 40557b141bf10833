#!/bin/sh
# The Debian package (make deb, docs/packaging.md): built from the given
# build directory into a scratch directory, its files and control fields
# checked, installed into a throwaway root with dpkg --root (this
# machine's dpkg database is left alone, and checked to be), and the
# installed tree used: capsule finds its agent and kernel builder through
# paths relative to itself, doctor says what is missing, a VM runs from
# it, the man pages render without a warning, the bash completion
# completes, lintian finds nothing at its default level. TAP output.
#
#   tests/integration/test-deb.sh build/capsule
set -u
capsule=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
build=$(dirname "$capsule")
top=$(cd "$(dirname "$0")/../.." && pwd)
. "$(dirname "$0")/lib.sh"
start=$(date +%s)

echo "1..33"

dist="$rt/dist"
root="$rt/root"
status_before=$(md5sum /var/lib/dpkg/status)

# --- the package -------------------------------------------------------------
# What OUTDIR holds is the user's: a root/ there (as in OUTDIR=/) is kept.
mkdir -p "$dist/root" && : >"$dist/root/keep"
"$top/scripts/make-deb.sh" "$build" "$dist" >"$out" 2>"$err"
rc=$?
deb=$(tail -1 "$out")
version=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$top/meson.build" | head -1)
check "make-deb.sh builds capsule_${version}_amd64.deb (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ "$deb" = "$dist/capsule_${version}_amd64.deb" ] && [ -s "$deb" ]'
check "make-deb.sh leaves OUTDIR/root alone and no staging tree behind ($(ls -A "$dist" | tr '\n' ' '))" \
	'[ -e "$dist/root/keep" ] && [ "$(ls -A "$dist" | sort | tr "\n" " ")" = "capsule_${version}_amd64.deb root " ]'
elapsed "built"

# The verbs capsule --help lists: each has a man page (and a completion).
verbs=$("$capsule" --help | awk '
	/^[^ ].*:$/ { section = $0; next }
	section == "Commands:" && /^ / {
		n = split($0, cell, /  +/)
		for (i = 2; i < n; i += 2)
			if (cell[i] ~ /^[a-z][a-z-]*$/ && cell[i] != "version" && cell[i] != "help") print cell[i]
	}' | sort)
# A link's line ends "PATH -> TARGET": the path is the field before the arrow.
dpkg-deb -c "$deb" | sed 's/ -> .*//' | awk '{ print $NF }' | sed 's|^\./||' >"$rt/list"
missing=""
for f in usr/bin/capsule usr/lib/capsule/capsule-agent \
	usr/share/capsule/guest/build-kernel.sh usr/share/capsule/guest/kernel.config \
	usr/share/doc/capsule/copyright usr/share/doc/capsule/changelog.gz \
	usr/share/man/man1/capsule.1.gz usr/share/bash-completion/completions/capsule \
	usr/lib/systemd/user/capsule.service usr/lib/systemd/user/capsule.socket usr/lib/systemd/user/capsule-spares.service \
	usr/share/lintian/overrides/capsule; do
	grep -qx "$f" "$rt/list" || missing="$missing $f"
done
check "dpkg-deb -c lists the binary, the agent, the kernel builder, the docs, the units, the completion${missing:+ (missing:$missing)}" '[ -z "$missing" ]'
grep -qE '^usr/share/doc/capsule/README\.md(\.gz)?$' "$rt/list" &&
	[ "$(grep -cE '^usr/share/doc/capsule/docs/[a-z-]+\.md(\.gz)?$' "$rt/list")" -eq "$(ls "$top"/docs/*.md | wc -l)" ]
check "README.md and every docs/*.md are in /usr/share/doc/capsule" '[ $? -eq 0 ]'
nopage=""
for v in $verbs; do grep -qx "usr/share/man/man1/capsule-$v.1.gz" "$rt/list" || nopage="$nopage $v"; done
check "a man page for each of the $(echo $verbs | wc -w) verbs of capsule --help${nopage:+ (none for:$nopage)}" \
	'[ -n "$verbs" ] && [ -z "$nopage" ]'
check "nothing outside /usr, no build or VCS debris" \
	'! grep -vE "^(usr/.*|)$" "$rt/list" | grep -q . && ! grep -qE "\.git|/dist/|\.o$" "$rt/list"'

field() { dpkg-deb -f "$deb" "$1"; }
check "control: Package capsule, Version $version, Architecture amd64" \
	'[ "$(field Package)" = capsule ] && [ "$(field Version)" = "$version" ] && [ "$(field Architecture)" = amd64 ]'
deps=$(field Depends)
check "Depends: the shared libraries (dpkg-shlibdeps) and the host tools" \
	'for p in libc6 libjansson4 libarchive13 libssl3 libnftables1 libmnl0 qemu-system-x86 busybox-static e2fsprogs erofs-utils; do
		echo "$deps" | grep -qE "(^|, )$p( |,|$)" || { echo "# Depends lacks $p: $deps"; exit 1; }; done'
check "Recommends: linux-source-6.1 and its build tools; Built-Using: glibc (the static agent)" \
	'field Recommends | grep -q "linux-source-6.1" && field Recommends | grep -q bison && field Built-Using | grep -q "^glibc (= "'
mkdir -p "$rt/ctl"
dpkg-deb -e "$deb" "$rt/ctl"
dpkg-deb -x "$deb" "$rt/x"
(cd "$rt/x" && md5sum --quiet -c "$rt/ctl/md5sums") >"$out" 2>&1
rc=$?
check "md5sums covers every file and matches (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ "$(wc -l <"$rt/ctl/md5sums")" -eq "$(find "$rt/x" -type f | wc -l)" ]'
file "$rt/x/usr/lib/capsule/capsule-agent" >"$out"
check "the agent is static, the binaries stripped" \
	'grep -q "statically linked" "$out" && file "$rt/x/usr/bin/capsule" "$rt/x/usr/lib/capsule/capsule-agent" | grep -c ", stripped" | grep -qx 2'

# --- a throwaway root ----------------------------------------------------------
mkdir -p "$root/var/lib/dpkg/info" "$root/var/lib/dpkg/updates" "$root/var/lib/dpkg/triggers"
: >"$root/var/lib/dpkg/status"
dpkg --root="$root" --log=/dev/null --force-depends --force-not-root --force-script-chrootless \
	-i "$deb" >"$out" 2>"$err"
rc=$?
check "dpkg --root installs it (exit $rc) and the postinst says how to build the kernel, not building it" \
	'[ "$rc" -eq 0 ] && grep -q "capsule prepare" "$out" && grep -q "build-kernel.sh" "$out"'
check "this machine's dpkg database is untouched" '[ "$(md5sum /var/lib/dpkg/status)" = "$status_before" ]'
ic="$root/usr/bin/capsule"
"$ic" --version >"$out" 2>"$err"
check "the installed capsule --version says $version" 'grep -qx "capsule $version .*" "$out"'
check "capsule-oci is installed as a link to capsule ($(readlink "$root/usr/bin/capsule-oci"))" \
	'[ "$(readlink "$root/usr/bin/capsule-oci")" = capsule ] && [ -x "$root/usr/bin/capsule-oci" ]'
check "containerd-shim-capsule-v2 is installed in /usr/bin" '[ -x "$root/usr/bin/containerd-shim-capsule-v2" ]'

export CAPSULE_CACHE="$rt/cache"
# The installed binary finds its own agent: make test points CAPSULE_AGENT
# and CAPSULE_KERNEL_BUILDER at the build tree's.
unset CAPSULE_AGENT CAPSULE_KERNEL_BUILDER CAPSULE_KERNEL
"$ic" doctor >"$out" 2>"$err"
rc=$?
check "doctor finds the agent at <root>/usr/lib/capsule/capsule-agent, beside the binary" \
	'grep -E "^agent: +present: " "$out" | grep -q "$root/usr/lib/capsule/capsule-agent"'
check "doctor (exit $rc, empty cache) says the kernel is missing and how an installed capsule builds it" \
	'[ "$rc" -eq 1 ] && grep -E "^kernel: +MISSING" "$out" | grep -qE "capsule prepare|/usr/share/capsule/guest/build-kernel.sh"'

# The installed kernel builder computes the key of the kernel the tree's
# script built (same script, its kernel.config beside it): given a cache
# holding that kernel, it finds it at once instead of compiling.
kernel=$(readlink -f "$HOME/.cache/capsule/vmlinux" 2>/dev/null)
if [ -f "$kernel" ]; then
	key=$(basename "$(dirname "$kernel")")
	mkdir -p "$rt/kcache/kernel"
	ln -s "$(dirname "$kernel")" "$rt/kcache/kernel/$key"
	CAPSULE_CACHE="$rt/kcache" timeout 20 "$root/usr/share/capsule/guest/build-kernel.sh" >"$out" 2>"$err"
	rc=$?
	check "the installed build-kernel.sh finds the cached kernel of the same config (exit $rc)" \
		'[ "$rc" -eq 0 ] && [ "$(tail -1 "$out")" = "$rt/kcache/kernel/$key/vmlinux" ]'
	CAPSULE_KERNEL="$kernel" CAPSULE_TEMPLATES=0 "$ic" run -q -- sh -c 'echo ran; uname -r' >"$out" 2>"$err"
	rc=$?
	check "a VM runs from the installed tree (its agent in the initramfs; exit $rc)" \
		'[ "$rc" -eq 0 ] && head -1 "$out" | grep -qx ran'
else
	not_ok "the installed build-kernel.sh finds the cached kernel" "no kernel in ~/.cache/capsule: run make kernel"
	not_ok "a VM runs from the installed tree" "no kernel in ~/.cache/capsule: run make kernel"
fi
elapsed "installed"

# --- man pages -----------------------------------------------------------------
bad=""
for page in "$root"/usr/share/man/man1/*.1.gz; do
	LC_ALL=C.UTF-8 MANROFFSEQ='' MANWIDTH=80 man --warnings -E UTF-8 -l -Tutf8 -Z "$page" \
		>/dev/null 2>"$err" || bad="$bad $(basename "$page")"
	[ -s "$err" ] && bad="$bad $(basename "$page"):$(head -1 "$err")"
done
check "every man page renders with man --warnings and no warning${bad:+ (bad:$bad)}" '[ -z "$bad" ]'
MANWIDTH=80 man -l "$root/usr/share/man/man1/capsule-run.1.gz" 2>/dev/null >"$out"
check "capsule-run(1) has NAME, SYNOPSIS and the --timeout option from run --help" \
	'grep -qE "capsule-run +- run a command" "$out" && grep -q "capsule run \[OPTIONS\]" "$out" && grep -q -- "--timeout S" "$out"'
bad=""
for sub in ls build prune; do
	"$ic" template $sub --help >"$out" 2>"$err" && head -1 "$out" | grep -q "^Usage: capsule template" &&
		[ ! -s "$err" ] || bad="$bad $sub"
done
check "capsule template ls|build|prune --help prints the usage and exits 0${bad:+ (not:$bad)}" '[ -z "$bad" ]'

# --- bash completion -----------------------------------------------------------
comp="$root/usr/share/bash-completion/completions/capsule"
"$ic" create box >"$out" 2>"$err"
rc=$?
cat >"$rt/comp.bash" <<EOF
. "$comp"
t() { COMP_WORDS=("\$@"); COMP_CWORD=\$((\$# - 1)); COMPREPLY=(); _capsule; printf '%s\n' "\${COMPREPLY[@]}" | sort; }
EOF
compl() { bash -c ". '$rt/comp.bash'; t $*" 2>"$err"; }
check "bash -n accepts the completion" 'bash -n "$comp"'
check "capsule <TAB> completes every verb of capsule --help" \
	'[ "$(compl "$ic" "\"\"" | grep -vE "^(-|help|version)" | sort)" = "$verbs" ] && [ ! -s "$err" ]'
check "capsule run --cp<TAB> gives --cpus (flags from run --help)" '[ "$(compl "$ic" run --cp)" = "--cpus" ]'
check "capsule start <TAB> gives the sandbox made (create exit $rc), --image <TAB> its image" \
	'[ "$(compl "$ic" start "\"\"")" = box ] && compl "$ic" create x --image "\"\"" | grep -qx base'
check "with no CAPSULE_HOME yet, capsule stop <TAB> is empty and quiet" \
	'[ -z "$(CAPSULE_HOME="$rt/none" compl "$ic" stop "\"\"")" ] && [ ! -s "$err" ] && [ ! -e "$rt/none" ]'
# A verb word that is not a verb (a glob that matches files here, a typo)
# is never passed to capsule: a capsule that records its argv is asked
# --help alone, and run --help for the real verb.
mkdir -p "$rt/globdir" && : >"$rt/globdir/run" && : >"$rt/globdir/rx"
cat >"$rt/fakecap" <<EOF
#!/bin/sh
printf '%s\n' "\$*" >>"$rt/argv.log"
[ "\$*" = --help ] && exec "$ic" --help
exit 0
EOF
chmod +x "$rt/fakecap"
: >"$rt/argv.log"
(cd "$rt/globdir" && compl "$rt/fakecap" "'r*'" --x && compl "$rt/fakecap" nosuchverb --x &&
	compl "$rt/fakecap" run --x) >/dev/null
check "completing flags after r* or an unknown verb runs nothing but capsule --help ($(sort -u "$rt/argv.log" | tr '\n' ';'))" \
	'! grep -vxE -- "--help|run --help" "$rt/argv.log" && grep -qx -- "run --help" "$rt/argv.log"'

# --- the systemd user units ----------------------------------------------------
# No user manager runs here: systemd-analyze checks the units (ExecStart
# pointed at the installed binary), systemd-socket-activate does what
# capsule.socket does: listen, and hand the socket to capsule serve as
# descriptor 3 on the first connection.
mkdir -p "$rt/units" "$rt/run/capsule"
sed "s|/usr/bin/capsule|$ic|" "$root/usr/lib/systemd/user/capsule.service" >"$rt/units/capsule.service"
sed "s|/usr/bin/capsule|$ic|" "$root/usr/lib/systemd/user/capsule-spares.service" >"$rt/units/capsule-spares.service"
cp "$root/usr/lib/systemd/user/capsule.socket" "$rt/units/"
systemd-analyze --user verify --man=no "$rt/units/capsule.socket" "$rt/units/capsule.service" "$rt/units/capsule-spares.service" >"$out" 2>"$err"
rc=$?
check "systemd-analyze --user verify: the units are clean (exit $rc)" '[ "$rc" -eq 0 ] && [ ! -s "$err" ]'
sock="$rt/run/capsule/serve.sock"
systemd-socket-activate -l "$sock" -E CAPSULE_HOME -E CAPSULE_CACHE -E XDG_RUNTIME_DIR -E HOME -E PATH \
	"$ic" serve >"$rt/serve.log" 2>&1 &
activated=$!
wait_for '[ -S "$sock" ]' 50
timeout 30 python3 - "$sock" >"$out" 2>"$err" <<'PY'
import json, socket, sys
s = socket.socket(socket.AF_UNIX)
s.settimeout(25)
s.connect(sys.argv[1])
s.sendall(b'{"jsonrpc": "2.0", "id": 1, "method": "info"}\n')
f = s.makefile("rb")
while True:
    msg = json.loads(f.readline())
    if msg.get("id") == 1:
        print(msg["result"]["home"])
        break
PY
check "a socket passed as systemd does starts the installed capsule serve, which answers on it" \
	'[ "$(cat "$out")" = "$CAPSULE_HOME" ] && grep -q "^socket $sock\$" "$CAPSULE_HOME/controller.lock"'
kill -TERM "$activated" 2>/dev/null
wait "$activated" 2>/dev/null
elapsed "units"

# --- lintian -------------------------------------------------------------------
lstart=$(date +%s)
lintian --tag-display-limit 0 "$deb" >"$out" 2>"$err"
rc=$?
check "lintian: no error or warning (exit $rc, $(($(date +%s) - lstart)) s)" \
	'[ "$rc" -eq 0 ] && ! grep -qE "^[EW]: " "$out"'

dpkg --root="$root" --log=/dev/null --force-not-root --force-script-chrootless -r capsule >"$out" 2>"$err"
rc=$?
check "dpkg --root -r removes it from the throwaway root (exit $rc)" \
	'[ "$rc" -eq 0 ] && [ ! -e "$ic" ] && [ ! -e "$comp" ] && [ "$(md5sum /var/lib/dpkg/status)" = "$status_before" ]'
elapsed "done"
