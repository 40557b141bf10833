#!/bin/sh
# Build the guest vmlinux from Debian's linux-source-6.1 with
# guest/kernel.config into the cache, keyed by the source package version
# and the hash of the config fragment and this script. Prints the path of
# the cached vmlinux on the last line of stdout.
set -eu

here=$(cd "$(dirname "$0")" && pwd)
frag="$here/kernel.config"
cache="${CAPSULE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/capsule}"
jobs=$(nproc 2>/dev/null || echo 2)
tarball=/usr/src/linux-source-6.1.tar.xz

say() { printf 'kernel: %s\n' "$*" >&2; }
die() { printf 'kernel: error: %s\n' "$*" >&2; exit 1; }

[ -r "$tarball" ] || die "$tarball is missing; run scripts/bootstrap.sh (package linux-source-6.1)"
version=$(dpkg-query -W -f='${Version}' linux-source-6.1 2>/dev/null) ||
	die "cannot read the version of package linux-source-6.1; run scripts/bootstrap.sh"
cfghash=$(cat "$frag" "$0" | sha256sum | cut -c1-16)
key="$version-$cfghash"
out="$cache/kernel/$key"

publish() {
	ln -sfn "kernel/$key/vmlinux" "$cache/vmlinux.tmp"
	mv -T "$cache/vmlinux.tmp" "$cache/vmlinux"
	echo "$out/vmlinux"
}

if [ -f "$out/vmlinux" ]; then
	publish
	exit 0
fi

mkdir -p "$cache/kernel"
src="$cache/kernel/src-$version"
if [ ! -f "$src/.capsule-extracted" ]; then
	say "extracting $tarball (once per source version)"
	rm -rf "$src"
	mkdir -p "$src"
	tar -xJf "$tarball" -C "$src" --strip-components=1
	touch "$src/.capsule-extracted"
fi

build="$cache/kernel/build-$key"
rm -rf "$build"
mkdir -p "$build"
log="$build/build.log"
kmake() { make -C "$src" O="$build" ARCH=x86_64 "$@"; }

say "configuring $key (allnoconfig + guest/kernel.config)"
kmake KCONFIG_ALLCONFIG="$frag" allnoconfig >"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "allnoconfig failed; full log: $log"; }
kmake olddefconfig >>"$log" 2>&1 ||
	{ tail -20 "$log" >&2; die "olddefconfig failed; full log: $log"; }

# Every option the fragment asks for must have survived olddefconfig.
missing=0
while IFS= read -r line; do
	case "$line" in
	CONFIG_*=*)
		if ! grep -qxF "$line" "$build/.config"; then
			name=${line%%=*}
			got=$(grep -E "^(# )?$name[= ]" "$build/.config" || echo "absent")
			say "option $line was asked for but the config has: $got"
			missing=$((missing + 1))
		fi
		;;
	"# CONFIG_"*" is not set")
		name=${line#\# }
		name=${name%% *}
		if grep -qE "^$name=" "$build/.config"; then
			say "option $name was asked to be off but is $(grep -E "^$name=" "$build/.config")"
			missing=$((missing + 1))
		fi
		;;
	esac
done <"$frag"
[ "$missing" -eq 0 ] ||
	die "$missing option(s) of guest/kernel.config did not survive olddefconfig (a missing dependency?); fix the fragment"

say "building vmlinux with $jobs jobs (about 6 minutes on 2 cores; log: $log)"
start=$(date +%s)
if [ -t 2 ]; then tty=1; else tty=0; fi
status=0
{ kmake -j"$jobs" vmlinux 2>&1 || echo "CAPSULE-BUILD-FAILED"; } | tee -a "$log" |
	awk -v tty="$tty" -v start="$start" '
	/^  (CC|AS|LD|AR)/ { n++ }
	/CAPSULE-BUILD-FAILED/ { failed = 1 }
	{
		now = systime()
		if (tty) {
			if (now != last) { printf "\rkernel: %d objects built, %ds elapsed ", n, now - start > "/dev/stderr"; last = now }
		} else if (now - last >= 30) {
			printf "kernel: %d objects built, %ds elapsed\n", n, now - start > "/dev/stderr"; last = now
		}
	}
	END {
		if (tty) printf "\n" > "/dev/stderr"
		exit failed
	}' || status=1
[ "$status" -eq 0 ] && [ -f "$build/vmlinux" ] ||
	{ tail -30 "$log" >&2; die "vmlinux build failed; full log: $log"; }

mkdir -p "$out"
cp "$build/vmlinux" "$out/vmlinux.tmp"
cp "$build/.config" "$out/config"
mv "$out/vmlinux.tmp" "$out/vmlinux"
say "built $out/vmlinux in $(( $(date +%s) - start ))s"
publish
