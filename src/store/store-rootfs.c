/* A container's root directory (an OCI bundle's rootfs) as a cached
 * image: a fingerprint keys CAPSULE_HOME/images/rootfs/<fingerprint>, a
 * symlink ../<hex> to the image it gave, written like images/names
 * (temporary name + rename). The fingerprint stands for what the
 * container would read, never for metadata alone: a key of paths, sizes
 * and times gave one image's files to another whose build pins file
 * times (SOURCE_DATE_EPOCH, Bazel, Nix, ko), and would let an image that
 * copies a public image's metadata poison the cache. Two kinds of key:
 *
 * - Layers. When dir is an overlay mount point (the engines' case:
 *   Podman and containerd mount a container's rootfs as overlay in the
 *   host's mount namespace) — the topmost mount at realpath(dir) in
 *   /proc/self/mountinfo, of dir's device, with nothing mounted below it
 *   since — whose lower directories are all an engine's committed image
 *   layers (containers/storage's overlay/<id>/diff, containerd's
 *   snapshots/<n>/fs: committed_layer), which it never writes: each is
 *   keyed by identity, in mount
 *   order: real path, device, inode and birth time (statx; the change
 *   time where the file system keeps none), so that a layer deleted and
 *   made again on a reused inode is another layer. So are the mount
 *   options that change how layers merge (all but the directories and
 *   SELinux labels). The upper directory, the container's own layer
 *   (mount points and /etc/mtab the engine made there, copied-up
 *   parents, whiteouts, opaque markers), is walked by content as below.
 *   A second container of an image hits although its engine made its
 *   files at another time, and the image's bytes are not read.
 * - Content. Any other directory (runc bundles, the vfs driver, tests),
 *   or an overlay whose layers cannot all be named (a lower that is not
 *   a committed layer, as podman run --rootfs DIR:O makes; relative paths, as
 *   containers/storage gives when the list outgrows a page; a lower that
 *   cannot be stat'ed; a mount inside it), is walked whole. Each entry
 *   gives its path, type, mode, owner, device number (a whiteout is a
 *   0:0 character device), a regular file's sha256, a symlink's target
 *   and every extended attribute's name and value (trusted.overlay.*,
 *   security.capability, user.*), never a time nor which files are hard
 *   links of each other: a hit gives the image of the first tree of those
 *   bytes, with its times. It reads every byte: a copy of python3.11's
 *   library (52 MB, 1,501 entries) is keyed in ~80 ms warm here (the
 *   metadata-only key of capsule-rootfs-1 took a few ms), where its
 *   erofs build takes ~450 ms more.
 *
 * The skip paths (mount points the engine fills for each container:
 * /etc/hosts, /etc/resolv.conf...) are left out of the walks, but not out
 * of the image: cap_store_image_from_tree takes a directory and has no
 * exclusion hook, and copying a whole root file system to leave out a
 * few files would cost more than the erofs build itself. So the image
 * keeps what the tree holds there (an empty file Podman made as a mount
 * point, or the image's own file), which the container never sees: the
 * runtime seeds those paths in the root's upper layer. Since the
 * fingerprint ignores them too, a container whose engine wrote other
 * contents at those paths still hits the cache.
 *
 * One build per key at a time, under <key>.lock, which the builder
 * removes while it still holds it: a waiter that then gets the lock of
 * the removed file sees that the path names another file (or none) and
 * opens it again, so no two processes ever hold a key's lock at once
 * and no lock file outlives its build. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define ROOTFS_DEPTH_MAX 256
/* Bump when what the fingerprint covers changes: old links then miss. */
#define FINGERPRINT_VERSION "capsule-rootfs-2"

struct walk {
	struct cap_sha256 h;
	const char *const *skip;	/* relative to the top, no leading '/' */
	size_t nskip;
	uint64_t entries, bytes;
	bool upper;			/* an overlay's upper layer */
};

static bool skipped(const struct walk *w, const char *rel)
{
	for (size_t i = 0; i < w->nskip; i++)
		if (strcmp(rel, w->skip[i]) == 0)
			return true;
	return false;
}

static char type_of(mode_t m)
{
	return S_ISREG(m) ? 'f' : S_ISDIR(m) ? 'd' : S_ISLNK(m) ? 'l' : S_ISCHR(m) ? 'c' :
	       S_ISBLK(m) ? 'b' : S_ISFIFO(m) ? 'p' : S_ISSOCK(m) ? 's' : '?';
}

/* The sha256 of regular file name in dfd, as hex. */
static int content_hex(struct walk *w, int dfd, const char *name, char hex[65])
{
	/* O_NONBLOCK: should a FIFO replace the file since it was stat'ed,
	 * open does not wait for a writer (and fstat refuses it). */
	_cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -EAGAIN;
	struct cap_sha256 h;
	cap_sha256_init(&h);
	int r = cap_sha256_update_fd(&h, fd, &w->bytes);
	cap_sha256_final_hex(&h, hex);
	return r;
}

/* s after prefix p, or NULL when it does not start so. */
static const char *after(const char *s, const char *p)
{
	size_t n = strlen(p);
	return strncmp(s, p, n) == 0 ? s + n : NULL;
}

/* Whether xattr name is overlay bookkeeping that the merged view does
 * not show: a random per-upper uuid (uuid=on, set at the first mount),
 * and what the kernel sets lazily on lookup and copy-up for inode
 * numbers and link counts (origin, impure, nlink). Hashing those, a
 * container's upper would never match another's, nor itself once read. */
static bool bookkeeping(const char *name)
{
	const char *o = after(name, "trusted.overlay.");
	if (!o)
		o = after(name, "user.overlay.");
	return o && (strcmp(o, "uuid") == 0 || strcmp(o, "origin") == 0 || strcmp(o, "impure") == 0 ||
		     strcmp(o, "nlink") == 0);
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* Hash the extended attributes of name in dfd (not following a symlink):
 * their count, then each name and value, by name. */
static int hash_xattrs(struct walk *w, int dfd, const char *name)
{
	char path[64 + NAME_MAX];
	snprintf(path, sizeof(path), "/proc/self/fd/%d/%s", dfd, name);
	_cleanup_free_ char *list = NULL;
	ssize_t n;
	/* The list may grow between the two calls: ERANGE, ask again. */
	for (int tries = 0;; tries++) {
		n = llistxattr(path, NULL, 0);
		if (n < 0)
			return errno == ENOTSUP ? 0 : -errno;
		free(list);
		list = xmalloc((size_t)n + 1);
		if (n == 0 || (n = llistxattr(path, list, (size_t)n)) >= 0)
			break;
		if (errno != ERANGE || tries == 8)
			return -errno;
	}
	size_t count = 0;
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(list + i) + 1)
		count++;
	char **names = xcalloc(count + 1, sizeof(char *));
	count = 0;
	for (ssize_t i = 0; i < n; i += (ssize_t)strlen(list + i) + 1)
		if (!w->upper || !bookkeeping(list + i))
			names[count++] = list + i;
	qsort(names, count, sizeof(char *), cmp_str);
	char head[32];
	int k = snprintf(head, sizeof(head), "x%zu", count);
	cap_sha256_update(&w->h, head, (size_t)k + 1);
	int r = 0;
	char *value = NULL;
	for (size_t i = 0; r == 0 && i < count; i++) {
		ssize_t len;
		for (int tries = 0;; tries++) {
			len = lgetxattr(path, names[i], NULL, 0);
			if (len < 0)
				break;
			free(value);
			value = xmalloc((size_t)len + 1);
			if (len == 0 || (len = lgetxattr(path, names[i], value, (size_t)len)) >= 0 ||
			    errno != ERANGE || tries == 8)
				break;
		}
		if (len < 0) {
			r = -errno;
			break;
		}
		k = snprintf(head, sizeof(head), "%zd", len);
		cap_sha256_update(&w->h, names[i], strlen(names[i]) + 1);
		cap_sha256_update(&w->h, head, (size_t)k + 1);
		cap_sha256_update(&w->h, value, (size_t)len);
	}
	free(value);
	free(names);
	return r;
}

/* Hash one entry: "path\0type\0mode\0uid\0gid\0rdev\0payload\0" (a
 * regular file's sha256, a symlink's target, else nothing) and its
 * extended attributes. No times: pinned or not, they say nothing of the
 * bytes; a directory's size depends on the file system's history. */
static int hash_entry(struct walk *w, int dfd, const char *name, const char *rel,
		      const struct stat *st)
{
	char payload[PATH_MAX + 1] = "";
	int r;
	if (S_ISLNK(st->st_mode)) {
		ssize_t n = readlinkat(dfd, name, payload, sizeof(payload) - 1);
		if (n < 0)
			return -errno;
		payload[n] = '\0';
	} else if (S_ISREG(st->st_mode) && (r = content_hex(w, dfd, name, payload)) < 0) {
		return r;
	}
	uint64_t rdev = S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? (uint64_t)st->st_rdev : 0;
	char meta[128];
	int n = snprintf(meta, sizeof(meta), "%c%c%o%c%u%c%u%c%" PRIu64 "%c",
			 type_of(st->st_mode), 0, (unsigned)(st->st_mode & 07777), 0,
			 (unsigned)st->st_uid, 0, (unsigned)st->st_gid, 0, rdev, 0);
	cap_sha256_update(&w->h, rel, strlen(rel) + 1);
	cap_sha256_update(&w->h, meta, (size_t)n);
	cap_sha256_update(&w->h, payload, strlen(payload) + 1);
	w->entries++;
	return hash_xattrs(w, dfd, name);
}

/* Walk the directory open at dfd (taken) in sorted order, without
 * following symlinks or entering what skip names. */
static int walk_dir(struct walk *w, int dfd, const char *rel, int depth)
{
	if (depth > ROOTFS_DEPTH_MAX) {
		close(dfd);
		return -ELOOP;
	}
	char **names;
	size_t n;
	int r = cap_dir_names(dfd, &names, &n);
	if (r < 0) {
		close(dfd);
		return r;
	}
	for (size_t i = 0; r == 0 && i < n; i++) {
		_cleanup_free_ char *path = *rel ? xasprintf("%s/%s", rel, names[i]) : xstrdup(names[i]);
		if (skipped(w, path))
			continue;
		struct stat st;
		if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if ((r = hash_entry(w, dfd, names[i], path, &st)) < 0)
			break;
		if (S_ISDIR(st.st_mode)) {
			int sub = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			r = sub < 0 ? -errno : walk_dir(w, sub, path, depth + 1);
		}
	}
	cap_strv_free(names, n);
	close(dfd);
	return r;
}

/* Hash the tree at top (its own entry as "", then all below) by content. */
static int walk_tree(struct walk *w, const char *top)
{
	int fd = open(top, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return -errno;
	int r = fstat(fd, &st) < 0 ? -errno : hash_entry(w, fd, ".", "", &st);
	if (r < 0) {
		close(fd);
		return r;
	}
	return walk_dir(w, fd, "", 0);
}

/* mountinfo's octal escapes (\040 for a space...) undone in place. */
static void unescape(char *s)
{
	char *o = s;
	for (const char *p = s; *p;) {
		if (p[0] == '\\' && p[1] >= '0' && p[1] <= '3' && p[2] >= '0' && p[2] <= '7' &&
		    p[3] >= '0' && p[3] <= '7') {
			*o++ = (char)((p[1] - '0') << 6 | (p[2] - '0') << 3 | (p[3] - '0'));
			p += 4;
		} else {
			*o++ = *p++;
		}
	}
	*o = '\0';
}

/* The super options (new string, still escaped) of the overlay mounted
 * on top at real, on device dev, with nothing mounted inside it since:
 * 1; 0 with *why saying what else is there; -errno when mountinfo
 * cannot be read. */
static int overlay_at(const char *real, dev_t dev, char **opts, const char **why)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	if (!f)
		return -errno;
	char *line = NULL, *top = NULL;
	size_t cap = 0, rl = strlen(real);
	bool ovl = false, inside = false;
	unsigned maj = 0, min = 0;
	while (getline(&line, &cap, f) > 0) {
		line[strcspn(line, "\n")] = '\0';
		/* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - TYPE SOURCE SUPER */
		char *save = NULL, *tok[5], *t;
		int k = 0;
		for (t = strtok_r(line, " ", &save); t && k < 5; t = strtok_r(NULL, " ", &save))
			tok[k++] = t;
		if (k < 5)
			continue;
		unescape(tok[4]);
		if (strcmp(tok[4], real) != 0) {
			if (top && strncmp(tok[4], real, rl) == 0 && (tok[4][rl] == '/' || rl == 1))
				inside = true;
			continue;
		}
		while (t && strcmp(t, "-") != 0)
			t = strtok_r(NULL, " ", &save);
		char *type = t ? strtok_r(NULL, " ", &save) : NULL;
		char *source = type ? strtok_r(NULL, " ", &save) : NULL;
		char *super = source ? strtok_r(NULL, " ", &save) : NULL;
		free(top);
		top = xstrdup(super ? super : "");
		ovl = type && super && strcmp(type, "overlay") == 0 &&
		      sscanf(tok[2], "%u:%u", &maj, &min) == 2;
		inside = false;
	}
	int e = ferror(f) ? -EIO : 0;
	free(line);
	fclose(f);
	if (e < 0 || !top || !ovl || inside || makedev(maj, min) != dev) {
		*why = e < 0 ? "mountinfo cannot be read" : !top ? "not a mount point" : !ovl ? "not an overlay"
		     : inside ? "something is mounted inside it" : "its device is not the mount's";
		free(top);
		return e;
	}
	*opts = top;
	return 1;
}

/* Whether real (a real path) is an engine's committed image layer, which
 * the engine never writes: containers/storage's <store>/overlay/<64 hex
 * id>/diff or containerd's overlayfs snapshotter's
 * <root>/io.containerd.snapshotter.v1.overlayfs/snapshots/<n>/fs. Any
 * other lower (podman run --rootfs DIR:O lays an overlay over the user's
 * own directory, which the user edits) is keyed by content. */
static bool committed_layer(const char *real)
{
	size_t n = strlen(real);
	if (n > 5 && strcmp(real + n - 5, "/diff") == 0) {
		const char *id = real + n - 5 - 64;
		return id - real >= 9 && strncmp(id - 9, "/overlay/", 9) == 0 &&
		       strspn(id, "0123456789abcdef") == 64;
	}
	static const char snaps[] = "/io.containerd.snapshotter.v1.overlayfs/snapshots/";
	if (n > 3 && strcmp(real + n - 3, "/fs") == 0) {
		const char *num = real + n - 3;
		while (num > real && num[-1] >= '0' && num[-1] <= '9')
			num--;
		size_t sl = sizeof(snaps) - 1;
		return num < real + n - 3 && (size_t)(num - real) >= sl &&
		       strncmp(num - sl, snaps, sl) == 0;
	}
	return false;
}

/* Hash the identity of layer path (real path, device, inode, birth
 * time), tag saying lower or data-only. */
static int hash_layer(struct walk *w, char tag, const char *path, const char **why)
{
	if (path[0] != '/') {
		*why = "a layer's path is relative";
		return -EINVAL;
	}
	_cleanup_free_ char *real = realpath(path, NULL);
	if (real && !committed_layer(real)) {
		*why = "a lower layer is not an engine's committed layer (containers/storage's overlay/ID/diff, containerd's snapshots/N/fs)";
		return -EINVAL;
	}
	struct statx sx;
	if (!real || statx(AT_FDCWD, real, 0, STATX_TYPE | STATX_INO | STATX_BTIME | STATX_CTIME, &sx) < 0) {
		*why = "a layer cannot be stat'ed";
		return -errno;
	}
	if (!S_ISDIR(sx.stx_mode)) {
		*why = "a layer is not a directory";
		return -ENOTDIR;
	}
	bool born = sx.stx_mask & STATX_BTIME;
	struct statx_timestamp ts = born ? sx.stx_btime : sx.stx_ctime;
	char id[96];
	int n = snprintf(id, sizeof(id), "%c%u:%u:%llu:%c%lld.%09u", tag, sx.stx_dev_major, sx.stx_dev_minor,
			 (unsigned long long)sx.stx_ino, born ? 'b' : 'c', (long long)ts.tv_sec, ts.tv_nsec);
	cap_sha256_update(&w->h, real, strlen(real) + 1);
	cap_sha256_update(&w->h, id, (size_t)n + 1);
	return 0;
}

/* Whether overlay option o (not a layer) may change what the merged
 * view shows: not the work directory, SELinux labels, nor what only
 * changes inode numbers, file handles, syncing or the per-upper uuid
 * (shown as uuid=on at an upper's first mount, not at later ones). */
static bool merges(const char *o)
{
	static const char *const no[] = { "workdir=", "uuid=", "xino=", "index=", "nfs_export=", "fsync=" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(no); i++)
		if (after(o, no[i]))
			return false;
	return !strstr(o, "context=") && strcmp(o, "seclabel") != 0 && strcmp(o, "volatile") != 0 &&
	       strcmp(o, "rw") != 0 && strcmp(o, "ro") != 0;
}

/* Hash the overlay whose super options are opts (taken, escaped): its
 * merge options, its lower layers by identity, its upper by content.
 * -errno with *why when a layer cannot be named: w is spoilt then. */
static int hash_overlay(struct walk *w, char *opts, size_t *nlayers, const char **why)
{
	char **layers = NULL, *tags = NULL, *upper = NULL;
	size_t n = 0, cap = 0;
	int r = 0;
	char *save = NULL;
	for (char *o = strtok_r(opts, ",", &save); o; o = strtok_r(NULL, ",", &save)) {
		unescape(o);
		const char *v;
		if ((v = after(o, "lowerdir=")) || (v = after(o, "lowerdir+=")) ||
		    (v = after(o, "datadir+="))) {
			/* lowerdir=A:B::D (data-only layers after "::"; "\:"
			 * is a colon in a name); the + forms, one each. */
			bool list = after(o, "lowerdir=") != NULL, data = o[0] == 'd';
			char *cur = xstrdup(v), *out = cur;
			for (const char *p = v;; p++) {
				if (list && *p == '\\' && p[1]) {
					*out++ = *++p;
					continue;
				}
				if (*p && (!list || *p != ':')) {
					*out++ = *p;
					continue;
				}
				*out = '\0';
				if (*cur) {
					if (n == cap) {
						cap = cap ? 2 * cap : 8;
						layers = xrealloc(layers, cap * sizeof(char *));
						tags = xrealloc(tags, cap);
					}
					layers[n] = xstrdup(cur);
					tags[n++] = data ? 'D' : 'L';
				} else if (*p == ':') {
					data = true;
				}
				out = cur;
				if (!*p)
					break;
			}
			free(cur);
		} else if ((v = after(o, "upperdir="))) {
			free(upper);
			upper = xstrdup(v);
		} else if (merges(o)) {
			cap_sha256_update(&w->h, o, strlen(o) + 1);
		}
	}
	if (n == 0) {
		*why = "no lower layer in its options";
		r = -EINVAL;
	}
	for (size_t i = 0; r == 0 && i < n; i++)
		r = hash_layer(w, tags[i], layers[i], why);
	if (r == 0 && upper && upper[0] != '/') {
		*why = "its upper layer's path is relative";
		r = -EINVAL;
	}
	cap_sha256_update(&w->h, upper ? "upper" : "no upper", upper ? 6 : 9);
	w->upper = true;
	if (r == 0 && upper && (r = walk_tree(w, upper)) < 0)
		*why = "its upper layer cannot be read";
	*nlayers = n;
	cap_strv_free(layers, n);
	free(tags);
	free(upper);
	free(opts);
	return r;
}

/* The fingerprint of the tree at dir without the skip paths, and how it
 * was keyed (a new string, for progress). */
static int fingerprint(const char *dir, const char *const *skip, size_t nskip,
		       char hex[65], char **how, struct cap_err *err)
{
	/* skip[] made relative to the top: "/etc/hosts" -> "etc/hosts". */
	const char **rel = xcalloc(nskip + 1, sizeof(char *));
	size_t k = 0;
	for (size_t i = 0; i < nskip; i++) {
		const char *s = skip[i];
		while (*s == '/')
			s++;
		if (*s)
			rel[k++] = s;
	}
	_cleanup_free_ char *real = realpath(dir, NULL);
	struct stat st;
	int e = !real || stat(real, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
	if (e) {
		free(rel);
		return cap_err_set(err, e, "cannot open the container rootfs %s: %s; the bundle's root.path must be a directory", dir, strerror(e));
	}
	/* The import maps owners only as root (mkfs.erofs -x2, else
	 * --all-root): the same tree gives another image otherwise. */
	const char *version = geteuid() == 0 ? FINGERPRINT_VERSION " owners" : FINGERPRINT_VERSION " all-root";
	struct walk w = { .skip = rel, .nskip = k };
	const char *why = NULL;
	_cleanup_free_ char *fallback = NULL;
	char *opts = NULL;
	size_t nlayers = 0;
	int r = overlay_at(real, st.st_dev, &opts, &why);
	if (r > 0) {
		cap_sha256_init(&w.h);
		cap_sha256_update(&w.h, version, strlen(version) + 1);
		cap_sha256_update(&w.h, "overlay", 8);
		if ((r = hash_overlay(&w, opts, &nlayers, &why)) == 0) {
			cap_sha256_final_hex(&w.h, hex);
			*how = xasprintf("keyed by its %zu overlay layer%s and the content of its upper layer (%" PRIu64 " entries, %" PRIu64 " bytes)",
					 nlayers, nlayers == 1 ? "" : "s", w.entries, w.bytes);
			goto out;
		}
		/* Never a key of less: the whole tree by content. */
		cap_sha256_final_hex(&w.h, hex);
		w.entries = w.bytes = 0;
		w.upper = false;
		why = fallback = xasprintf("an overlay, but %s", why);
	}
	cap_sha256_init(&w.h);
	cap_sha256_update(&w.h, version, strlen(version) + 1);
	cap_sha256_update(&w.h, "tree", 5);
	r = walk_tree(&w, real);
	cap_sha256_final_hex(&w.h, hex);
	if (r == 0)
		*how = xasprintf("keyed by content (%s%s%" PRIu64 " entries, %" PRIu64 " bytes)",
				 why ? why : "", why ? "; " : "", w.entries, w.bytes);
out:
	free(rel);
	if (r < 0)
		return cap_err_set(err, -r, "cannot read the container rootfs %s: %s", dir, strerror(-r));
	return 0;
}

/* The manifest's recorded size of image hex, or -1. */
static int64_t recorded_size(const char *images, const char *hex)
{
	_cleanup_free_ char *mpath = xasprintf("%s/%s/manifest.json", images, hex);
	json_t *m = json_load_file(mpath, 0, NULL);
	json_t *v = json_object_get(m, "size");
	int64_t size = json_is_integer(v) ? (int64_t)json_integer_value(v) : -1;
	json_decref(m);
	return size;
}

/* The image a cache link names, when it is still there whole. Not
 * cap_store_image_verify: rehashing a 40 MB image costs ~65 ms here
 * (openssl), more than the walk; an erofs file whose size is what its
 * manifest recorded is taken as intact, as sandboxes created from it
 * take it (the store is written by rename, never in place). */
static bool cache_hit(const char *images, const char *link, struct cap_image *out)
{
	char h[65];
	if (!cap_store_link_hex(link, h))
		return false;
	_cleanup_free_ char *digest = xasprintf("sha256:%s", h);
	struct cap_err ignored;
	if (cap_store_image_find(digest, out, &ignored) < 0)
		return false;
	if (recorded_size(images, h) != (int64_t)out->size) {
		cap_log(CAP_LOG_WARN, "image %s does not have the size its manifest records; building the rootfs again", digest);
		cap_image_fini(out);
		return false;
	}
	return true;
}

__attribute__((format(printf, 3, 4)))
static void say(cap_progress_fn progress, void *ud, const char *fmt, ...)
{
	if (!progress)
		return;
	va_list ap;
	va_start(ap, fmt);
	char *line = NULL;
	if (vasprintf(&line, fmt, ap) >= 0)
		progress(ud, line);
	va_end(ap);
	free(line);
}

/* Take the build lock of a key: lockf opened, locked, and still the file
 * at that path (a builder removes it while holding it, after which a
 * waiter that got it must open the path again). The fd or -errno. */
static int lock_key(const char *lockf)
{
	for (;;) {
		int fd = open(lockf, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
		if (fd < 0)
			return -errno;
		struct stat held, named;
		int r;
		while ((r = flock(fd, LOCK_EX)) < 0 && errno == EINTR)
			;
		if (r < 0 || fstat(fd, &held) < 0) {
			r = -errno;
			close(fd);
			return r;
		}
		if (lstat(lockf, &named) < 0) {
			r = errno;
			close(fd);
			if (r != ENOENT)
				return -r;
		} else if (named.st_dev == held.st_dev && named.st_ino == held.st_ino) {
			return fd;
		} else {
			close(fd);
		}
	}
}

/* Remove the lock file while still holding it, then let it go. */
static void unlock_key(const char *lockf, int fd)
{
	unlink(lockf);
	close(fd);
}

int cap_store_image_from_rootfs(const char *dir, const char *const *skip,
				size_t nskip, cap_progress_fn progress, void *ud,
				struct cap_image *out, bool *cached,
				struct cap_err *err)
{
	char fp[65];
	_cleanup_free_ char *how = NULL;
	int r = fingerprint(dir, skip, nskip, fp, &how, err);
	if (r < 0)
		return r;
	_cleanup_free_ char *images = cap_store_images_dir();
	_cleanup_free_ char *cache = xasprintf("%s/rootfs", images);
	_cleanup_free_ char *link = xasprintf("%s/%s", cache, fp);
	if (cache_hit(images, link, out)) {
		say(progress, ud, "container rootfs %s: %s: cached as image %s", dir, how, out->digest);
		*cached = true;
		return 0;
	}
	if ((r = cap_mkdir_p(cache, 0755)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", cache, strerror(-r));
	/* One build per fingerprint at a time: a second container created
	 * from the same rootfs meanwhile waits, then finds the link. */
	_cleanup_free_ char *lockf = xasprintf("%s/%s.lock", cache, fp);
	int lock = lock_key(lockf);
	if (lock < 0)
		return cap_err_set(err, -lock, "cannot lock %s: %s", lockf, strerror(-lock));
	if (cache_hit(images, link, out)) {
		unlock_key(lockf, lock);
		say(progress, ud, "container rootfs %s: %s: cached as image %s (built meanwhile)", dir, how, out->digest);
		*cached = true;
		return 0;
	}
	say(progress, ud, "container rootfs %s: %s: not cached, making an image of it", dir, how);
	_cleanup_free_ char *source = xasprintf("container rootfs %s", dir);
	struct cap_import_opts o = { .source = source, .progress = progress, .ud = ud };
	struct cap_image img;
	if ((r = cap_store_image_from_tree(dir, &o, &img, NULL, err)) < 0) {
		unlock_key(lockf, lock);
		cap_err_prefix(err, "making an image of the container rootfs %s", dir);
		return r;
	}
	r = cap_store_link_set(cache, link, img.digest + 7);
	unlock_key(lockf, lock);
	if (r < 0) {
		cap_image_fini(&img);
		return cap_err_set(err, -r, "cannot write the rootfs cache link %s: %s", link, strerror(-r));
	}
	say(progress, ud, "container rootfs %s: image %s", dir, img.digest);
	*out = img;
	*cached = false;
	return 0;
}
