#!/bin/sh
# Build the Debian package of capsule from a Meson build directory, with
# dpkg-deb alone (no debhelper, no debian/ directory in the tree).
#
#   scripts/make-deb.sh [BUILD [OUTDIR]]   (defaults: build, BUILD/dist)
#
# Writes OUTDIR/capsule_<version>_amd64.deb and prints its path on the
# last line. <version> is meson.build's project version, which the top
# entry of packaging/changelog must carry too (the package is native: its
# packaging lives in this tree; a packaging-only release is VERSION+N).
# The staging tree is a fresh OUTDIR/.stage.XXXXXX, removed on exit:
# nothing the user named is ever removed. What goes where:
# docs/packaging.md.
set -eu

top=$(cd "$(dirname "$0")/.." && pwd)
build=$(cd "${1:-build}" 2>/dev/null && pwd) ||
	{ echo "make-deb: ${1:-build} is not a directory; build first (make build)" >&2; exit 1; }
pkg="$top/packaging"

die() { printf 'make-deb: %s\n' "$*" >&2; exit 1; }
for tool in dpkg-deb dpkg-shlibdeps dpkg-parsechangelog python3 strip gzip; do
	command -v "$tool" >/dev/null 2>&1 || die "$tool is missing; run scripts/bootstrap.sh (packages dpkg-dev, binutils, python3)"
done
[ -x "$build/capsule" ] || die "$build/capsule is missing; build it first (make build)"
[ -x "$build/capsule-agent" ] ||
	die "$build/capsule-agent is missing (a sanitized build has no agent); use a plain build (make build)"

# Versions: meson.build's, the binary's (a stale build is refused) and
# the changelog's, which must be the same upstream version.
upstream=$(sed -n "s/^ *version *: *'\([^']*\)'.*/\1/p" "$top/meson.build" | head -1)
[ -n "$upstream" ] || die "no project version found in $top/meson.build"
built=$("$build/capsule" --version | awk '{ print $2 }')
[ "$built" = "$upstream" ] ||
	die "$build/capsule is version $built but meson.build says $upstream; rebuild (ninja -C $build)"
version=$(dpkg-parsechangelog -l "$pkg/changelog" -S Version)
case $version in
"$upstream" | "$upstream"+*) ;;
*) die "packaging/changelog's top entry is $version, not $upstream (meson.build's); add an entry for $upstream in the format of the others" ;;
esac
maintainer=$(dpkg-parsechangelog -l "$pkg/changelog" -S Maintainer)
# Reproducible: every file's time, the man pages' date and the archive's
# are the changelog entry's.
SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(dpkg-parsechangelog -l "$pkg/changelog" -S Timestamp)}
export SOURCE_DATE_EPOCH

dist=${2:-$build/dist}
mkdir -p "$dist" && dist=$(cd "$dist" && pwd)
umask 022
root=$(mktemp -d "$dist/.stage.XXXXXX") || die "cannot create a staging directory in $dist"
scratch=""
trap 'rm -rf "$root" ${scratch:+"$scratch"}' EXIT
trap 'exit 1' HUP INT TERM
chmod 0755 "$root"	# mktemp's 0700 would become the package's ./
mkdir -p "$root/DEBIAN"

# Files. Binaries are stripped as dh_strip does; the agent stays static.
install -d "$root/usr/bin" "$root/usr/lib/capsule" "$root/usr/share/capsule/guest" \
	"$root/usr/share/doc/capsule/docs" "$root/usr/share/man/man1" \
	"$root/usr/share/bash-completion/completions" "$root/usr/lib/systemd/user"
install -m 0755 "$build/capsule" "$root/usr/bin/capsule"
install -m 0755 "$build/capsule-agent" "$root/usr/lib/capsule/capsule-agent"
# The name Podman and containerd are given (docs/oci.md): the same binary
# (it acts as `capsule oci` when called capsule-oci); its man page is
# capsule-oci.1, the verb's.
ln -s capsule "$root/usr/bin/capsule-oci"
# containerd's shim v2 (docs/oci.md): containerd finds it on PATH by the
# runtime's name, io.containerd.capsule.v2.
install -m 0755 "$build/src/shim/containerd-shim-capsule-v2" "$root/usr/bin/containerd-shim-capsule-v2"
strip --remove-section=.comment --remove-section=.note --strip-unneeded \
	"$root/usr/bin/capsule" "$root/usr/lib/capsule/capsule-agent" "$root/usr/bin/containerd-shim-capsule-v2"
install -m 0755 "$top/guest/build-kernel.sh" "$root/usr/share/capsule/guest/build-kernel.sh"
install -m 0644 "$top/guest/kernel.config" "$root/usr/share/capsule/guest/kernel.config"
install -m 0644 "$pkg/bash-completion/capsule" "$root/usr/share/bash-completion/completions/capsule"
install -m 0644 "$pkg/systemd/capsule.service" "$pkg/systemd/capsule.socket" "$pkg/systemd/capsule-spares.service" "$root/usr/lib/systemd/user/"

# Documentation: README.md and docs/*.md. Debian compresses what is over
# 4 KiB (policy 12.3, as dh_compress does), so README.md's links to the
# larger docs/x.md name files installed as docs/x.md.gz (read with zless).
doc="$root/usr/share/doc/capsule"
install -m 0644 "$pkg/copyright" "$doc/copyright"
install -m 0644 "$top/README.md" "$doc/README.md"
install -m 0644 "$top"/docs/*.md "$doc/docs/"
gzip -9n -c "$pkg/changelog" >"$doc/changelog.gz"	# native: not changelog.Debian.gz
find "$doc" -name '*.md' -size +4k -exec gzip -9n {} +

# Man pages from the help texts.
"$top/scripts/gen-man.sh" "$build/capsule" "$root/usr/share/man/man1" >/dev/null
# The shim's (containerd runs it, it has no help text of its own).
install -m 0644 "$pkg/containerd-shim-capsule-v2.1" "$root/usr/share/man/man1/"
gzip -9n "$root"/usr/share/man/man1/*.1

# Maintainer script, and lintian's overrides (each with its reason).
install -m 0755 "$pkg/postinst" "$root/DEBIAN/postinst"
install -d "$root/usr/share/lintian/overrides"
install -m 0644 "$pkg/lintian-overrides" "$root/usr/share/lintian/overrides/capsule"

# Shared libraries the binary needs, as dpkg-shlibdeps computes them; it
# wants a debian/control, so it runs in a scratch directory with one.
scratch=$(mktemp -d)
mkdir -p "$scratch/debian"
printf 'Source: capsule\n\nPackage: capsule\nArchitecture: amd64\n' >"$scratch/debian/control"
shlibs=$(cd "$scratch" && dpkg-shlibdeps -O "$root/usr/bin/capsule" 2>"$scratch/err") ||
	{ cat "$scratch/err" >&2; die "dpkg-shlibdeps failed"; }
shlibs=${shlibs#shlibs:Depends=}
[ -n "$shlibs" ] || die "dpkg-shlibdeps found no shared libraries for usr/bin/capsule"
# The static agent embeds the C library: name the source it was built from.
built_using=$(dpkg-query -W -f='${source:Package} (= ${source:Version})' libc6-dev) ||
	die "cannot read the version of libc6-dev (the agent is linked statically against it)"

# Same times everywhere, then md5sums and control.
find "$root" -exec touch -h -d "@$SOURCE_DATE_EPOCH" {} +
(cd "$root" && find . -path ./DEBIAN -prune -o -type f -printf '%P\0' | LC_ALL=C sort -z |
	xargs -0 md5sum) >"$root/DEBIAN/md5sums"
chmod 0644 "$root/DEBIAN/md5sums"
size=$(du -k -s --apparent-size --exclude=DEBIAN "$root" | cut -f1)
sed -e "s|@VERSION@|$version|" -e "s|@MAINTAINER@|$maintainer|" \
	-e "s|@INSTALLED_SIZE@|$size|" -e "s|@SHLIBS@|$shlibs|" -e "s|@BUILT_USING@|$built_using|" \
	"$pkg/control.in" >"$root/DEBIAN/control"
if grep -q '@[A-Z_]*@' "$root/DEBIAN/control"; then
	die "packaging/control.in has a placeholder this script does not fill: $(grep -o '@[A-Z_]*@' "$root/DEBIAN/control" | head -1)"
fi
touch -h -d "@$SOURCE_DATE_EPOCH" "$root/DEBIAN" "$root/DEBIAN"/*

deb="$dist/capsule_${version}_amd64.deb"
rm -f "$deb"
dpkg-deb --root-owner-group -Zxz --build "$root" "$deb" >/dev/null
echo "$deb"
