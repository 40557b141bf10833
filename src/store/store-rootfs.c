/* A container's root directory (an OCI bundle's rootfs) as a cached
 * image: a fingerprint of the tree's metadata keys
 * CAPSULE_HOME/images/rootfs/<fingerprint>, a symlink ../<hex> to the
 * image it gave, written like images/names (temporary name + rename).
 *
 * The skip paths (mount points the engine fills for each container:
 * /etc/hosts, /etc/resolv.conf...) are left out of the fingerprint, but
 * not out of the image: cap_store_image_from_tree takes a directory and
 * has no exclusion hook, and copying a whole root file system to leave
 * out a few files would cost more than the erofs build itself. So the
 * image keeps what the tree holds there (an empty file Podman made as a
 * mount point, or the image's own file), which the container never sees:
 * the runtime seeds those paths in the root's upper layer. Since the
 * fingerprint ignores them too, a container whose engine wrote other
 * contents at those paths still hits the cache. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define ROOTFS_DEPTH_MAX 256
/* Bump when what the fingerprint covers changes: old links then miss. */
#define FINGERPRINT_VERSION "capsule-rootfs-1"

struct walk {
	struct cap_sha256 h;
	const char *const *skip;	/* relative to the top, no leading '/' */
	size_t nskip;
	uint64_t entries;
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

/* Hash one entry: "path\0type\0mode\0uid\0gid\0size\0mtime_ns\0target\0".
 * A directory's time and size are left out: its time changes whenever
 * an entry is added or removed (those are hashed as entries), and its
 * size depends on the file system's history. */
static int hash_entry(struct walk *w, int dfd, const char *name, const char *rel,
		      const struct stat *st)
{
	char target[4097] = "";
	if (S_ISLNK(st->st_mode)) {
		ssize_t n = readlinkat(dfd, name, target, sizeof(target) - 1);
		if (n < 0)
			return -errno;
		target[n] = '\0';
	}
	bool dir = S_ISDIR(st->st_mode);
	uint64_t size = S_ISCHR(st->st_mode) || S_ISBLK(st->st_mode) ? (uint64_t)st->st_rdev
		      : dir ? 0 : (uint64_t)st->st_size;
	int64_t mtime = dir ? 0 : (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	char meta[160];
	int n = snprintf(meta, sizeof(meta), "%c%c%o%c%u%c%u%c%" PRIu64 "%c%" PRId64 "%c",
			 type_of(st->st_mode), 0, (unsigned)(st->st_mode & 07777), 0,
			 (unsigned)st->st_uid, 0, (unsigned)st->st_gid, 0, size, 0, mtime, 0);
	cap_sha256_update(&w->h, rel, strlen(rel) + 1);
	cap_sha256_update(&w->h, meta, (size_t)n);
	cap_sha256_update(&w->h, target, strlen(target) + 1);
	w->entries++;
	return 0;
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

/* The fingerprint of the tree at dir without the skip paths. */
static int fingerprint(const char *dir, const char *const *skip, size_t nskip,
		       char hex[65], uint64_t *entries, struct cap_err *err)
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
	int top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (top < 0) {
		int e = errno;
		free(rel);
		return cap_err_set(err, e, "cannot open the container rootfs %s: %s; the bundle's root.path must be a directory", dir, strerror(e));
	}
	struct walk w = { .skip = rel, .nskip = k };
	cap_sha256_init(&w.h);
	/* The import maps owners only as root (mkfs.erofs -x2, else
	 * --all-root): the same tree gives another image otherwise. */
	const char *version = geteuid() == 0 ? FINGERPRINT_VERSION " owners" : FINGERPRINT_VERSION " all-root";
	cap_sha256_update(&w.h, version, strlen(version) + 1);
	struct stat st;
	int r = fstat(top, &st) < 0 ? -errno : hash_entry(&w, top, ".", "", &st);
	if (r == 0)
		r = walk_dir(&w, top, "", 0);
	else
		close(top);
	cap_sha256_final_hex(&w.h, hex);
	free(rel);
	if (r < 0)
		return cap_err_set(err, -r, "cannot read the container rootfs %s: %s", dir, strerror(-r));
	*entries = w.entries;
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

int cap_store_image_from_rootfs(const char *dir, const char *const *skip,
				size_t nskip, cap_progress_fn progress, void *ud,
				struct cap_image *out, bool *cached,
				struct cap_err *err)
{
	char fp[65];
	uint64_t entries = 0;
	int r = fingerprint(dir, skip, nskip, fp, &entries, err);
	if (r < 0)
		return r;
	_cleanup_free_ char *images = cap_store_images_dir();
	_cleanup_free_ char *cache = xasprintf("%s/rootfs", images);
	_cleanup_free_ char *link = xasprintf("%s/%s", cache, fp);
	if (cache_hit(images, link, out)) {
		say(progress, ud, "container rootfs %s: cached as image %s", dir, out->digest);
		*cached = true;
		return 0;
	}
	if ((r = cap_mkdir_p(cache, 0755)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", cache, strerror(-r));
	/* One build per fingerprint at a time: a second container created
	 * from the same rootfs meanwhile waits, then finds the link. */
	_cleanup_free_ char *lockf = xasprintf("%s/%s.lock", cache, fp);
	_cleanup_close_ int lock = open(lockf, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
	if (lock < 0 || flock(lock, LOCK_EX) < 0)
		return cap_err_set(err, errno, "cannot lock %s: %s", lockf, strerror(errno));
	if (cache_hit(images, link, out)) {
		say(progress, ud, "container rootfs %s: cached as image %s (built meanwhile)", dir, out->digest);
		*cached = true;
		return 0;
	}
	say(progress, ud, "container rootfs %s: not cached (%" PRIu64 " entries), making an image of it", dir, entries);
	_cleanup_free_ char *source = xasprintf("container rootfs %s", dir);
	struct cap_import_opts o = { .source = source, .progress = progress, .ud = ud };
	struct cap_image img;
	if ((r = cap_store_image_from_tree(dir, &o, &img, NULL, err)) < 0) {
		cap_err_prefix(err, "making an image of the container rootfs %s", dir);
		return r;
	}
	if ((r = cap_store_link_set(cache, link, img.digest + 7)) < 0) {
		cap_image_fini(&img);
		return cap_err_set(err, -r, "cannot write the rootfs cache link %s: %s", link, strerror(-r));
	}
	say(progress, ud, "container rootfs %s: image %s", dir, img.digest);
	*out = img;
	*cached = false;
	return 0;
}
