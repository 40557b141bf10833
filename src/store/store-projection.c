/* Public data projections: a validated, read-only copy of a host tree as
 * an erofs image, mounted at /source in the guest. The host directory is
 * never shared with the guest.
 *
 * Two walks. The scan validates every entry (lstat only) and yields the
 * fingerprint that decides, before each call, whether anything changed.
 * The copy walks again, opening each entry relative to its already-opened
 * parent with O_NOFOLLOW and comparing the opened object's fstat with what
 * the scan saw, so that a file swapped for a symlink (or anything else)
 * between the two walks is refused, never followed. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"
#include "proc.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define DEFAULT_MAX_BYTES (512ull << 20)
#define DEFAULT_MAX_ENTRIES 100000ull

static int env_u64(const char *name, uint64_t *v, struct cap_err *err)
{
	const char *s = getenv(name);
	if (!s || !*s)
		return 0;
	char *end;
	errno = 0;
	unsigned long long x = strtoull(s, &end, 10);
	if (errno || *end || *s == '-')
		return cap_err_set(err, EINVAL, "%s=%s is not a number", name, s);
	*v = x;
	return 0;
}

int cap_projection_limits_init(struct cap_projection_limits *l,
			       struct cap_err *err)
{
	l->max_bytes = DEFAULT_MAX_BYTES;
	l->max_entries = DEFAULT_MAX_ENTRIES;
	int r = env_u64("CAPSULE_SOURCE_MAX_BYTES", &l->max_bytes, err);
	return r < 0 ? r : env_u64("CAPSULE_SOURCE_MAX_ENTRIES", &l->max_entries, err);
}

/* What the scan saw of one entry, in walk order. */
struct seen {
	char *rel;
	mode_t mode;
	dev_t dev;
	ino_t ino;
	off_t size;
	struct timespec mtime;
};

struct walk {
	const struct cap_projection_limits *lim;
	struct cap_sha256 hash;
	uint64_t entries, bytes;
	size_t longest;	/* bytes of the longest path seen */
	dev_t rootdev;
	bool keep;	/* record entries for a copy */
	struct seen *v;
	size_t n, cap;
	/* copy pass */
	size_t next;	/* index of the next expected entry */
	int stage_root;
	struct cap_err *err;
};

static bool excluded(const char *name)
{
	return strcasecmp(name, "node_modules") == 0;
}

static const char *kind(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFLNK: return "a symbolic link";
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFIFO: return "a FIFO";
	case S_IFSOCK: return "a socket";
	default: return "of an unsupported type";
	}
}

/* The shape limits of the image builder (store.h): a name, a path, a
 * depth it cannot take is refused here, so that what the scan passes
 * builds. */
static int shape(struct walk *w, const char *rel, size_t name_len, unsigned depth)
{
	char buf[256];
	size_t len = strlen(rel);
	if (name_len > CAP_PROJECTION_NAME_MAX)
		return cap_err_set(w->err, ENAMETOOLONG, "public data %s has a name of %zu bytes, over the limit of %d bytes (the erofs image builder cuts longer names); rename it",
				   cap_path_shown(rel, buf, sizeof(buf)), name_len, CAP_PROJECTION_NAME_MAX);
	if (len > CAP_PROJECTION_PATH_MAX)
		return cap_err_set(w->err, ENAMETOOLONG, "public data %s is a path of %zu bytes, over the limit of %d bytes (the erofs image builder cannot take longer ones); shorten it",
				   cap_path_shown(rel, buf, sizeof(buf)), len, CAP_PROJECTION_PATH_MAX);
	if (depth > CAP_PROJECTION_DEPTH_MAX)
		return cap_err_set(w->err, ENAMETOOLONG, "public data %s is %u levels deep, over the limit of %d levels; flatten the tree",
				   cap_path_shown(rel, buf, sizeof(buf)), depth, CAP_PROJECTION_DEPTH_MAX);
	w->longest = CAP_MAX(w->longest, len);
	return 0;
}

/* Check one entry against the rules; count it and feed the fingerprint. */
static int admit(struct walk *w, const char *rel, size_t name_len, unsigned depth,
		 const struct stat *st)
{
	int r = shape(w, rel, name_len, depth);
	if (r < 0)
		return r;
	if (S_ISREG(st->st_mode)) {
		if (st->st_nlink > 1)
			return cap_err_set(w->err, EPERM, "public data %s is a hard-linked file (%ju links); hard links are not allowed in public data: copy the file instead",
					   rel, (uintmax_t)st->st_nlink);
		w->bytes += (uint64_t)st->st_size;
	} else if (S_ISDIR(st->st_mode)) {
		if (st->st_dev != w->rootdev)
			return cap_err_set(w->err, EPERM, "public data %s is a mount point of another file system; nested mounts are not allowed in public data",
					   rel);
	} else {
		return cap_err_set(w->err, EPERM, "public data %s is %s; only regular files and directories are allowed in public data (symlinks, hard links, devices, FIFOs and sockets are refused)",
				   rel, kind(st->st_mode));
	}
	w->entries++;
	char meta[256];
	int m = snprintf(meta, sizeof(meta), "|%o|%jd|%jd.%09ld|%jd.%09ld|%ju\n", (unsigned)st->st_mode,
			 (intmax_t)st->st_size, (intmax_t)st->st_mtim.tv_sec, st->st_mtim.tv_nsec,
			 (intmax_t)st->st_ctim.tv_sec, st->st_ctim.tv_nsec, (uintmax_t)st->st_ino);
	cap_sha256_update(&w->hash, rel, strlen(rel));
	cap_sha256_update(&w->hash, meta, (size_t)m);
	if (w->keep && w->entries <= w->lim->max_entries) {
		if (w->n == w->cap)
			w->v = xrealloc(w->v, (w->cap = w->cap ? w->cap * 2 : 256) * sizeof(*w->v));
		w->v[w->n++] = (struct seen){ xstrdup(rel), st->st_mode, st->st_dev, st->st_ino,
					      st->st_size, st->st_mtim };
	}
	return 0;
}

static char *join(const char *rel, const char *name)
{
	return *rel ? xasprintf("%s/%s", rel, name) : xstrdup(name);
}

static int scan_dir(struct walk *w, int dfd, const char *rel, unsigned depth)
{
	char **names;
	size_t n;
	int r = cap_dir_names(dfd, &names, &n);
	if (r < 0)
		return cap_err_set(w->err, -r, "cannot list public data directory %s: %s", *rel ? rel : ".", strerror(-r));
	for (size_t i = 0; i < n && r == 0; i++) {
		if (excluded(names[i]))
			continue;	/* not even looked at */
		_cleanup_free_ char *path = join(rel, names[i]);
		struct stat st;
		if (fstatat(dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = cap_err_set(w->err, errno, "cannot read public data %s: %s", path, strerror(errno));
			break;
		}
		if ((r = admit(w, path, strlen(names[i]), depth + 1, &st)) < 0)
			break;
		if (!S_ISDIR(st.st_mode))
			continue;
		int cfd = openat(dfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		struct stat cst;
		if (cfd < 0 || fstat(cfd, &cst) < 0 || cst.st_ino != st.st_ino || cst.st_dev != st.st_dev) {
			r = cap_err_set(w->err, cfd < 0 ? errno : ESTALE, "public data %s changed while it was read%s%s",
					path, cfd < 0 ? ": " : "", cfd < 0 ? strerror(errno) : "");
			if (cfd >= 0)
				close(cfd);
			break;
		}
		r = scan_dir(w, cfd, path, depth + 1);
		close(cfd);
	}
	cap_strv_free(names, n);
	return r;
}

static int open_root(const char *dir, struct walk *w, struct cap_err *err)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return cap_err_set(err, e, "public data directory %s: %s", dir, strerror(e));
	}
	w->rootdev = st.st_dev;
	return fd;
}

static int scan(const char *dir, struct walk *w, struct cap_projection_info *out)
{
	int fd = open_root(dir, w, w->err);
	if (fd < 0)
		return fd;
	cap_sha256_init(&w->hash);
	int r = scan_dir(w, fd, "", 0);
	close(fd);
	cap_sha256_final_hex(&w->hash, out->fingerprint);
	if (r < 0)
		return r;
	out->entries = w->entries;
	out->bytes = w->bytes;
	if (w->entries > w->lim->max_entries)
		return cap_err_set(w->err, EFBIG, "public data %s has %" PRIu64 " entries, over the cap of %" PRIu64 " (CAPSULE_SOURCE_MAX_ENTRIES); node_modules directories are not counted",
				   dir, w->entries, w->lim->max_entries);
	if (w->bytes > w->lim->max_bytes)
		return cap_err_set(w->err, EFBIG, "public data %s holds %" PRIu64 " bytes of files, over the cap of %" PRIu64 " (CAPSULE_SOURCE_MAX_BYTES)",
				   dir, w->bytes, w->lim->max_bytes);
	return 0;
}

int cap_projection_scan(const char *dir, const struct cap_projection_limits *l,
			struct cap_projection_info *out, struct cap_err *err)
{
	struct walk w = { .lim = l, .err = err };
	return scan(dir, &w, out);
}

/* --- the copy ------------------------------------------------------------- */

static int changed(struct walk *w, const char *rel, const char *how)
{
	return cap_err_set(w->err, ESTALE, "public data %s changed while it was copied (%s); nothing was used, try again",
			   rel, how);
}

/* Does the opened object still match what the scan recorded? */
static bool same(const struct seen *s, const struct stat *st)
{
	return s->dev == st->st_dev && s->ino == st->st_ino &&
	       (s->mode & S_IFMT) == (st->st_mode & S_IFMT) &&
	       (!S_ISREG(st->st_mode) || (s->size == st->st_size && st->st_nlink == 1 &&
					  s->mtime.tv_sec == st->st_mtim.tv_sec &&
					  s->mtime.tv_nsec == st->st_mtim.tv_nsec));
}

static int copy_file(struct walk *w, int fd, int sdfd, const char *name,
		     const struct seen *s)
{
	/* Public data is readable by the tool user; execute bits are kept
	 * for fidelity (the mount is noexec anyway). */
	mode_t mode = (s->mode & 0111) ? 0755 : 0644;
	_cleanup_close_ int out = openat(sdfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode);
	if (out < 0)
		return cap_err_set(w->err, errno, "cannot write the copy of %s: %s", s->rel, strerror(errno));
	uint64_t left = (uint64_t)s->size;
	char buf[1 << 16];
	while (left > 0) {
		ssize_t n = read(fd, buf, CAP_MIN(sizeof(buf), left));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return cap_err_set(w->err, errno, "cannot read public data %s: %s", s->rel, strerror(errno));
		if (n == 0)
			return changed(w, s->rel, "it became shorter");
		int r = cap_write_all(out, buf, (size_t)n);
		if (r < 0)
			return cap_err_set(w->err, -r, "cannot write the copy of %s: %s", s->rel, strerror(-r));
		left -= (uint64_t)n;
	}
	if (read(fd, buf, 1) > 0)
		return changed(w, s->rel, "it became longer");
	return fchmod(out, mode) < 0 ? -errno : 0;
}

static int copy_dir(struct walk *w, int dfd, int sdfd, const char *rel)
{
	char **names;
	size_t n;
	int r = cap_dir_names(dfd, &names, &n);
	if (r < 0)
		return cap_err_set(w->err, -r, "cannot list public data directory %s: %s", *rel ? rel : ".", strerror(-r));
	for (size_t i = 0; i < n && r == 0; i++) {
		if (excluded(names[i]))
			continue;
		_cleanup_free_ char *path = join(rel, names[i]);
		if (w->next >= w->n || strcmp(w->v[w->next].rel, path) != 0) {
			r = changed(w, path, "it appeared after validation");
			break;
		}
		const struct seen *s = &w->v[w->next++];
		/* O_NOFOLLOW: a symlink swapped in since the scan fails here
		 * (ELOOP) instead of being followed; O_NONBLOCK: a FIFO
		 * swapped in cannot block us. */
		int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | (S_ISDIR(s->mode) ? O_DIRECTORY : 0);
		int fd = openat(dfd, names[i], flags);
		struct stat st;
		if (fd < 0) {
			r = changed(w, path, errno == ELOOP ? "it is now a symbolic link" : strerror(errno));
			break;
		}
		if (fstat(fd, &st) < 0 || !same(s, &st)) {
			close(fd);
			r = changed(w, path, "its type, identity, size or time differ from what was validated");
			break;
		}
		if (S_ISREG(st.st_mode)) {
			r = copy_file(w, fd, sdfd, names[i], s);
		} else {
			if (mkdirat(sdfd, names[i], 0755) < 0) {
				r = cap_err_set(w->err, errno, "cannot create the copy of %s: %s", path, strerror(errno));
			} else {
				int cs = openat(sdfd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
				r = cs < 0 ? cap_err_set(w->err, errno, "cannot open the copy of %s: %s", path, strerror(errno))
					   : copy_dir(w, fd, cs, path);
				if (cs >= 0)
					close(cs);
			}
		}
		close(fd);
	}
	cap_strv_free(names, n);
	return r;
}

int cap_projection_build(const char *dir, const struct cap_projection_limits *l,
			 const char *path, struct cap_projection_info *out,
			 struct cap_err *err)
{
	return cap_projection_build_hook(dir, l, path, out, NULL, NULL, err);
}

int cap_projection_build_hook(const char *dir, const struct cap_projection_limits *l,
			      const char *path, struct cap_projection_info *out,
			      void (*after_scan)(void *ud), void *ud,
			      struct cap_err *err)
{
	struct walk w = { .lim = l, .err = err, .keep = true };
	_cleanup_free_ char *stage = xasprintf("%s.stage-XXXXXX", path);
	_cleanup_free_ char *tmp = xasprintf("%s.tmp", path);
	int r = scan(dir, &w, out);
	int rootfd = -1, sfd = -1;
	bool staged = false;

	if (r < 0)
		goto out;
	if (after_scan)
		after_scan(ud);
	if (!mkdtemp(stage)) {
		r = cap_err_set(err, errno, "cannot create a staging directory next to %s: %s", path, strerror(errno));
		goto out;
	}
	staged = true;
	chmod(stage, 0755);
	/* mkfs.erofs takes the staged copy by its real path, which with the
	 * longest path in the tree must stay within 4095 bytes. */
	char real[PATH_MAX];
	size_t slen = realpath(stage, real) ? strlen(real) : PATH_MAX;
	if (slen + 1 + w.longest > CAP_PROJECTION_BUILD_PATH_MAX) {
		char buf[256];
		r = cap_err_set(err, ENAMETOOLONG, "cannot make the public data image: its staging directory's real path (%zu bytes) and the longest path in the public data (%zu bytes) are more than the %d bytes the erofs image builder takes; use a shorter CAPSULE_HOME or destination (within %d bytes every tree that passes the check fits): %s",
				slen, w.longest, CAP_PROJECTION_BUILD_PATH_MAX,
				CAP_PROJECTION_BUILD_PATH_MAX - 1 - CAP_PROJECTION_PATH_MAX, cap_path_shown(stage, buf, sizeof(buf)));
		goto out;
	}
	sfd = open(stage, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if ((rootfd = open_root(dir, &w, err)) < 0) {
		r = rootfd;
		goto out;
	}
	if (sfd < 0) {
		r = cap_err_set(err, errno, "cannot open %s: %s", stage, strerror(errno));
		goto out;
	}
	if ((r = copy_dir(&w, rootfd, sfd, "")) < 0)
		goto out;
	if (w.next != w.n) {
		r = changed(&w, w.v[w.next].rel, "it disappeared after validation");
		goto out;
	}
	/* Made 0600 before mkfs.erofs writes it (it keeps the mode): like
	 * every disk of a sandbox, readable by its owner only. */
	int tfd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (tfd < 0 || fchmod(tfd, 0600) < 0) {
		r = cap_err_set(err, errno, "cannot create %s: %s", tmp, strerror(errno));
		if (tfd >= 0)
			close(tfd);
		goto out;
	}
	close(tfd);
	char *argv[] = { "mkfs.erofs", "--quiet", "-T0", "-U00000000-0000-0000-0000-000000000000",
			 "--all-root", "-x-1", tmp, stage, NULL };
	if ((r = cap_run(argv, NULL, NULL, err)) < 0) {
		cap_err_prefix(err, "making the public data image");
		goto out;
	}
	if (rename(tmp, path) < 0)
		r = cap_err_set(err, errno, "cannot move %s into place: %s", path, strerror(errno));
out:
	if (rootfd >= 0)
		close(rootfd);
	if (sfd >= 0)
		close(sfd);
	if (staged)
		cap_remove_tree(stage);
	unlink(tmp);
	for (size_t i = 0; i < w.n; i++)
		free(w.v[i].rel);
	free(w.v);
	return r;
}
