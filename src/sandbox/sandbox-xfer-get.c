/* Files out of a running sandbox (cap_xfer_get, cap_xfer_fetch): the
 * guest's tar read by a second thread that libarchive can block in, its
 * entries checked and written below a host directory or into a merge's
 * staging directory. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "buf.h"
#include "sandbox-internal.h"
#include "util.h"
#include "xfer.h"

/* --- reading the guest's tar in a second thread ---------------------------- */

/* Most bytes of the guest's STDOUT held between the transfer loop and the
 * reader: enough to ride out a reader that stalls a moment on a busy disk
 * (the shim drops a client that leaves 16 MiB unread), bounded so that a
 * stalled reader stops the loop instead. */
#define XFER_QUEUE_MAX (8u << 20)

/* libarchive pulls its input, so it runs in a thread reading from a
 * bounded queue that the transfer loop fills with the guest's STDOUT. A
 * reader that fails closes the queue: the loop's next write fails, and
 * the loop kills the stream and waits for its end. */
struct reader {
	struct cap_xfer_op op;	/* first */
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct cap_buf q;	/* under mu: bytes not read yet */
	bool eof;	/* under mu: the loop has no more */
	bool closed;	/* under mu: the reader stopped reading */
	uint8_t block[65536];	/* the reader's: what libarchive is given */
	int dirfd;	/* get: the thread's working directory; -1: none */
	int (*consume)(struct reader *r, struct archive *a);
	pthread_t thread;
	bool running;
	int rc;	/* the thread's result, err with it */
	struct cap_err err;
};

/* libarchive's read callback: wait for bytes, 0 at the end. */
static la_ssize_t queue_read(struct archive *a, void *ud, const void **buf)
{
	struct reader *r = ud;
	(void)a;
	pthread_mutex_lock(&r->mu);
	while (cap_buf_used(&r->q) == 0 && !r->eof)
		pthread_cond_wait(&r->cv, &r->mu);
	size_t n = CAP_MIN(cap_buf_used(&r->q), sizeof(r->block));
	memcpy(r->block, cap_buf_head(&r->q), n);
	cap_buf_consume(&r->q, n);
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	*buf = r->block;
	return (la_ssize_t)n;
}

/* The next header: libarchive warns (ARCHIVE_WARN) about a name it could
 * not convert to this process's locale and gives its bytes as they are,
 * which is what we want. False at the end or on an error (in *k). */
static bool next(struct archive *a, struct archive_entry **e, int *k)
{
	*k = archive_read_next_header(a, e);
	return *k == ARCHIVE_OK || *k == ARCHIVE_WARN;
}

static void *reader_main(void *arg)
{
	struct reader *r = arg;
	struct archive *a = NULL;
	/* The extraction's paths are relative to the destination: a working
	 * directory (and umask) of this thread's own (CLONE_FS), the
	 * process's stay as they are. */
	if (r->dirfd >= 0 && (unshare(CLONE_FS) < 0 || fchdir(r->dirfd) < 0)) {
		int e = errno;
		r->rc = cap_err_set(&r->err, e, "cannot enter the destination directory: %s", strerror(e));
		goto out;
	}
	a = archive_read_new();
	if (!a)
		abort();
	archive_read_support_format_tar(a);
	if (archive_read_open(a, r, NULL, queue_read, NULL) != ARCHIVE_OK) {
		r->rc = cap_err_set(&r->err, EBADMSG, "the sandbox's tar stream: %s", archive_error_string(a));
		goto out;
	}
	r->rc = r->consume(r, a);
	if (r->rc == 0) {	/* the stream's padding after its end */
		const void *b;
		while (queue_read(a, r, &b) > 0)
			;
	}
out:
	if (a)
		archive_read_free(a);
	pthread_mutex_lock(&r->mu);
	r->closed = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
	return NULL;
}

static int reader_out(struct cap_xfer_op *o, const uint8_t *p, size_t n)
{
	struct reader *r = (struct reader *)o;
	int rc = 0;
	pthread_mutex_lock(&r->mu);
	while (cap_buf_used(&r->q) >= XFER_QUEUE_MAX && !r->closed)
		pthread_cond_wait(&r->cv, &r->mu);
	if (r->closed) {
		rc = -EPIPE;
	} else {
		cap_buf_append(&r->q, p, n);
		pthread_cond_broadcast(&r->cv);
	}
	pthread_mutex_unlock(&r->mu);
	return rc;
}

/* No more input for the reader. */
static void reader_eof(struct reader *r)
{
	pthread_mutex_lock(&r->mu);
	r->eof = true;
	pthread_cond_broadcast(&r->cv);
	pthread_mutex_unlock(&r->mu);
}

static int reader_start(struct reader *r, struct cap_sandbox *sb, int dirfd,
			int (*consume)(struct reader *, struct archive *), struct cap_err *err)
{
	cap_xfer_op_init(&r->op, sb, reader_out);
	pthread_mutex_init(&r->mu, NULL);
	pthread_cond_init(&r->cv, NULL);
	cap_buf_init(&r->q);
	r->dirfd = dirfd;
	r->consume = consume;
	int e = pthread_create(&r->thread, NULL, reader_main, r);
	if (e)
		return cap_err_set(err, e, "cannot start a thread: %s", strerror(e));
	r->running = true;
	return 0;
}

/* Wait for the reader once its input has ended. */
static void reader_join(struct reader *r)
{
	reader_eof(r);
	if (r->running)
		pthread_join(r->thread, NULL);
	r->running = false;
}

/* End the stream (kill it if it still runs), end the reader's input, wait
 * for it and free what it used. */
static void reader_end(struct reader *r)
{
	cap_xfer_op_abort(&r->op);
	reader_join(r);
	cap_xfer_op_fini(&r->op);
	cap_buf_fini(&r->q);
	pthread_cond_destroy(&r->cv);
	pthread_mutex_destroy(&r->mu);
}

/* --- get: a guest path onto the host ------------------------------------------ */

struct get {
	struct reader rd;	/* first */
	const char *root, *path;
	const char *top;	/* the guest's name for the copied path */
	const char *name;	/* its name in the destination directory */
	bool recursive;
	struct cap_xfer_result *res;
};

/* The entry's path below the copied top ("" for the top), in buf; NULL
 * when it is not under it. */
static const char *below_top(const struct get *g, const char *p, char *buf, size_t len)
{
	size_t n = strlen(p);
	while (n > 1 && p[n - 1] == '/')
		n--;
	if (n >= len)
		return NULL;
	memcpy(buf, p, n);
	buf[n] = 0;
	size_t t = strlen(g->top);
	if (strcmp(g->top, ".") == 0) {	/* the root: "." and "./a", or "a" */
		if (strcmp(buf, ".") == 0)
			return "";
		return strncmp(buf, "./", 2) == 0 ? buf + 2 : buf;
	}
	if (strncmp(buf, g->top, t) != 0)
		return NULL;
	if (buf[t] == 0)
		return "";
	return buf[t] == '/' ? buf + t + 1 : NULL;
}

static int get_consume(struct reader *rd, struct archive *a)
{
	struct get *g = (struct get *)rd;
	struct archive_entry *e;
	int k, r = 0;
	struct archive *w = archive_write_disk_new();
	if (!w)
		abort();
	archive_write_disk_set_options(w, ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
					      ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS | ARCHIVE_EXTRACT_PERM |
					      ARCHIVE_EXTRACT_TIME);
	_cleanup_free_ char *relbuf = xmalloc(CAP_TREE_MAX_PATH + 2 * NAME_MAX + 8);
	while (next(a, &e, &k)) {
		const char *p = archive_entry_pathname(e);
		const char *rel = p ? below_top(g, p, relbuf, CAP_TREE_MAX_PATH + 2 * NAME_MAX + 8) : NULL;
		if (!rel || (*rel && !cap_tree_path_ok(rel))) {
			r = cap_err_set(&rd->err, EBADMSG, "the sandbox sent an entry named '%.200s', which is not below %s",
					p ? p : "(none)", g->top);
			break;
		}
		_cleanup_free_ char *gpath = *rel ? xasprintf("%s%s%s/%s", g->root, *g->path ? "/" : "", g->path, rel)
						  : cap_xfer_shown_path(g->root, g->path);
		mode_t type = archive_entry_filetype(e);
		if (type == AE_IFDIR && !*rel && !g->recursive) {
			r = cap_err_set(&rd->err, EISDIR, "%s is a directory; it is copied only recursively",
					gpath);
			break;
		}
		if (*rel && !g->recursive) {
			r = cap_err_set(&rd->err, EBADMSG, "the sandbox sent %s, below a file", gpath);
			break;
		}
		if (archive_entry_hardlink(e) || (type != AE_IFREG && type != AE_IFDIR && type != AE_IFLNK)) {
			cap_xfer_refuse(g->res, "%s: not a regular file, directory or symbolic link", gpath);
			continue;
		}
		if (type == AE_IFLNK) {
			const char *t = archive_entry_symlink(e);
			if (!*rel) {
				cap_xfer_refuse(g->res, "%s: a symbolic link (to %s); copy what it points to instead", gpath,
						t ? t : "nothing");
				continue;
			}
			if (!t || !*t || strlen(t) > CAP_TREE_MAX_PATH || !cap_tree_link_inside(rel, t)) {
				cap_xfer_refuse(g->res, "%s: a symbolic link to %.1024s, which leaves the copied tree", gpath,
						t ? t : "nothing");
				continue;
			}
		}
		_cleanup_free_ char *out = *rel ? xasprintf("%s/%s", g->name, rel) : xstrdup(g->name);
		archive_entry_set_pathname(e, out);
		archive_entry_set_perm(e, archive_entry_perm(e) & 01777);	/* never set-id */
		archive_entry_xattr_clear(e);
		archive_entry_acl_clear(e);
		archive_entry_set_fflags(e, 0, 0);
		int h = archive_write_header(w, e);
		if (h == ARCHIVE_FATAL) {
			r = cap_err_set(&rd->err, EIO, "cannot write %s: %s", out, archive_error_string(w));
			break;
		}
		if (h < ARCHIVE_WARN) {
			cap_xfer_refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
			continue;
		}
		if (type == AE_IFREG) {
			const void *buf;
			size_t size;
			la_int64_t off;
			bool failed = false;
			while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK) {
				if (!failed && archive_write_data_block(w, buf, size, off) < ARCHIVE_WARN) {
					cap_xfer_refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
					failed = true;
				}
			}
			if (k != ARCHIVE_EOF) {
				r = cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream broke in %s: %s", gpath,
						archive_error_string(a));
				break;
			}
			if (archive_write_finish_entry(w) < ARCHIVE_WARN && !failed) {
				cap_xfer_refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
				failed = true;
			}
			if (failed)
				continue;
			g->res->files++;
			g->res->bytes += (uint64_t)archive_entry_size(e);
			continue;
		}
		if (archive_write_finish_entry(w) < ARCHIVE_WARN) {
			cap_xfer_refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
			continue;
		}
		if (type == AE_IFDIR)
			g->res->dirs++;
		else
			g->res->links++;
	}
	if (r == 0 && k != ARCHIVE_EOF)
		r = cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream is malformed: %s", archive_error_string(a));
	/* Directories' modes and times are set last, as libarchive defers
	 * them (a read-only directory still gets its contents). */
	if (archive_write_close(w) != ARCHIVE_OK && r == 0)
		r = cap_err_set(&rd->err, EIO, "finishing %s: %s", g->name, archive_error_string(w));
	archive_write_free(w);
	return r;
}

/* The last component of a path without its trailing slashes, into buf
 * (a component longer than a name can be is cut, and then not found). */
static void last_component(const char *p, char *buf, size_t len)
{
	_cleanup_free_ char *s = cap_path_last(p);
	snprintf(buf, len, "%s", s);
}

int cap_xfer_get(struct cap_sandbox *sb, const char *root, const char *path,
		 const char *dest, unsigned flags, struct cap_xfer_result *res,
		 struct cap_err *err)
{
	_cleanup_free_ char *shown = cap_xfer_shown_path(root, path);
	char kind;
	int r = cap_xfer_kind(sb, root, path, &kind, err);
	if (r < 0)
		return r;
	if (kind == '-')
		return cap_err_set(err, ENOENT, "%s does not exist in the sandbox", shown);
	if (kind == 'o')
		return cap_err_set(err, EINVAL, "%s is not a regular file, directory or symbolic link", shown);
	if (kind == 'd' && !(flags & CAP_XFER_RECURSIVE))
		return cap_err_set(err, EISDIR, "%s is a directory; it is copied only recursively", shown);

	/* Where it goes: into dest when that is a directory, else as dest. */
	char top[NAME_MAX + 1], name[NAME_MAX + 1];
	last_component(*path ? path : root, name, sizeof(name));
	snprintf(top, sizeof(top), "%s", *path ? name : ".");
	_cleanup_close_ int dirfd = -1;
	struct stat st;
	size_t dlen = strlen(dest);
	bool slash = dlen > 0 && dest[dlen - 1] == '/';
	int sr = stat(dest, &st) == 0 ? 0 : -errno;
	if (sr == 0 && S_ISDIR(st.st_mode)) {
		dirfd = open(dest, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dirfd < 0)
			return cap_err_set(err, errno, "cannot open the directory %s: %s", dest, strerror(errno));
	} else if (sr < 0 && sr != -ENOENT) {
		return cap_err_set(err, -sr, "cannot look at %s: %s", dest, strerror(-sr));
	} else if (dlen == 0 || slash) {
		return cap_err_set(err, sr == 0 ? ENOTDIR : ENOENT, "the directory %s does not exist", dest);
	} else if (sr == 0 && kind == 'd') {
		return cap_err_set(err, ENOTDIR, "%s exists and is not a directory; %s is one", dest, shown);
	} else {
		last_component(dest, name, sizeof(name));
		if (!cap_xfer_component_ok(name))
			return cap_err_set(err, EINVAL, "%s does not name a file to create", dest);
		size_t plen = dlen - strlen(name);
		while (plen > 1 && dest[plen - 1] == '/')
			plen--;
		_cleanup_free_ char *parent = xstrndup(dest, plen);
		dirfd = open(*parent ? parent : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dirfd < 0) {
			int e = errno;
			if (e == ENOENT)
				return cap_err_set(err, e, "the directory %s (where %s would go) does not exist; create it first",
						   parent, dest);
			return cap_err_set(err, e, "cannot open the directory %s (where %s would go): %s",
					   *parent ? parent : ".", dest, strerror(e));
		}
	}

	struct get g = { .root = root, .path = path, .top = top, .name = name,
			 .recursive = flags & CAP_XFER_RECURSIVE, .res = res };
	if ((r = reader_start(&g.rd, sb, dirfd, get_consume, err)) < 0) {
		reader_end(&g.rd);
		return r;
	}
	_cleanup_free_ char *what = xasprintf("copying %s out of the sandbox", shown);
	if ((r = cap_xfer_op_start(&g.rd.op, CAP_FILE_TAR_OUT, root, path, 0, err)) < 0 ||
	    (r = cap_xfer_pump(&g.rd.op, true, err)) < 0) {
		reader_end(&g.rd);
		return r;
	}
	reader_join(&g.rd);
	/* The guest's own failure first: it explains an empty or cut stream. */
	int gs = cap_xfer_op_status(&g.rd.op, what, err);
	if (gs >= 0 && g.rd.rc < 0) {
		*err = g.rd.err;
		gs = g.rd.rc;
	}
	if (gs >= 0) {
		cap_xfer_take_messages(&g.rd.op, res);
		if (res->nrefused)
			gs = cap_err_set(err, EPERM, "%s: %zu path%s not copied (listed)", what, res->nrefused,
					 res->nrefused == 1 ? " was" : "s were");
		else if (gs == 1)
			gs = cap_err_set(err, EIO, "%s: the sandbox reported a failure without naming a path", what);
	}
	reader_end(&g.rd);
	return gs < 0 ? gs : 0;
}

/* --- fetch: files into a merge's staging directory ----------------------------- */

struct fetch {
	struct reader rd;	/* first */
	const char *root;
	const char *const *paths;
	const uint64_t *sizes;	/* NULL: any */
	size_t n, i;
	int stagefd;
	const struct cap_xfer_fetch_opts *o;
	uint64_t budget;	/* bytes the staged copies may still take */
	uint64_t bound;	/* ... in all, and why, for the message */
	const char *why;
};

/* Whether p[0..n) is all zero bytes. */
static bool zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

/* Write a block of the entry's data at off into fd, leaving runs of zeros
 * that fill whole pages as holes (as the guest's holes are: they never
 * cross), and count what was written against the budget. 0, -ENOSPC over
 * it, or the write's -errno. */
static int put_block(struct fetch *f, int fd, const uint8_t *p, size_t n, uint64_t off)
{
	const size_t page = 4096;
	size_t i = 0;
	while (i < n) {
		/* the page-aligned piece from here */
		size_t len = CAP_MIN(n - i, page - (size_t)((off + i) % page));
		if (len == page && zero(p + i, len)) {
			i += len;
			continue;
		}
		size_t j = i + len;	/* grow over what is not a zero page */
		while (j < n) {
			size_t l2 = CAP_MIN(n - j, page);
			if (l2 == page && zero(p + j, l2))
				break;
			j += l2;
		}
		if (j - i > f->budget)
			return -ENOSPC;
		f->budget -= j - i;
		for (size_t k = i; k < j;) {
			ssize_t w = pwrite(fd, p + k, j - k, (off_t)(off + k));
			if (w < 0 && errno == EINTR)
				continue;
			if (w < 0)
				return -errno;
			k += (size_t)w;
		}
		i = j;
	}
	return 0;
}

static int fetch_consume(struct reader *rd, struct archive *a)
{
	struct fetch *f = (struct fetch *)rd;
	struct archive_entry *e;
	int k;
	while (next(a, &e, &k)) {
		const char *p = archive_entry_pathname(e);
		if (f->i == f->n)
			return cap_err_set(&rd->err, EBADMSG, "the sandbox sent more files than the %zu asked for", f->n);
		const char *want = f->paths[f->i];
		if (!p || strcmp(p, want) != 0)
			return cap_err_set(&rd->err, ESTALE, "%s/%s is not in the sandbox any more (it changed during the merge; run it again)",
					   f->root, want);
		if (archive_entry_filetype(e) != AE_IFREG || archive_entry_hardlink(e))
			return cap_err_set(&rd->err, ESTALE, "%s/%s is not a regular file in the sandbox any more (it changed during the merge; run it again)",
					   f->root, want);
		uint64_t size = f->sizes ? f->sizes[f->i] : 0;
		if (f->sizes && f->o->prefix)
			size = CAP_MIN(size, (uint64_t)CAP_TAR_PREFIX_BYTES);
		la_int64_t esize = archive_entry_size(e);
		if (esize < 0 || (f->sizes && (uint64_t)esize != size) ||
		    (f->o->prefix && (uint64_t)esize > CAP_TAR_PREFIX_BYTES))
			return cap_err_set(&rd->err, ESTALE, "%s/%s is not the size its manifest said (it changed during the merge; run it again)",
					   f->root, want);
		char name[24];
		cap_merge_stage_name(f->i, name);
		_cleanup_close_ int fd = openat(f->stagefd, name, O_CREAT | O_TRUNC | O_WRONLY | O_NOFOLLOW | O_CLOEXEC,
						0600);
		if (fd < 0)
			return cap_err_set(&rd->err, errno, "cannot create the staged copy %s of %s/%s: %s", name,
					   f->root, want, strerror(errno));
		const void *buf;
		size_t got;
		la_int64_t off;
		while ((k = archive_read_data_block(a, &buf, &got, &off)) == ARCHIVE_OK) {
			if (off < 0 || (uint64_t)off > (uint64_t)esize || got > (uint64_t)esize - (uint64_t)off)
				return cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream puts data outside %s/%s",
						   f->root, want);
			int w = put_block(f, fd, buf, got, (uint64_t)off);
			if (w == -ENOSPC)
				return cap_err_set(&rd->err, ENOSPC, "%s/%s (%llu bytes) does not fit in the %llu MiB the copies from the sandbox may take in %s (%s); free space there, or remove or shrink the file in the sandbox",
						   f->root, want, (unsigned long long)esize,
						   (unsigned long long)(f->bound >> 20), f->o->where, f->why);
			if (w < 0)
				return cap_err_set(&rd->err, -w, "writing the staged copy %s of %s/%s: %s", name,
						   f->root, want, strerror(-w));
		}
		if (k != ARCHIVE_EOF)
			return cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream broke in %s/%s: %s", f->root,
					   want, archive_error_string(a));
		/* The holes at the end, and all of a file that is all zeros. */
		if (ftruncate(fd, (off_t)esize) < 0)
			return cap_err_set(&rd->err, errno, "writing the staged copy %s of %s/%s: %s", name,
					   f->root, want, strerror(errno));
		if (fsync(fd) < 0)
			return cap_err_set(&rd->err, errno, "fsync of the staged copy %s of %s/%s: %s", name, f->root,
					   want, strerror(errno));
		f->i++;
	}
	if (k != ARCHIVE_EOF)
		return cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream is malformed: %s", archive_error_string(a));
	if (f->i < f->n)
		return cap_err_set(&rd->err, ESTALE, "%s/%s is not in the sandbox any more (it changed during the merge; run it again)",
				   f->root, f->paths[f->i]);
	return 0;
}

int cap_xfer_fetch(struct cap_sandbox *sb, const char *root,
		   const char *const *paths, const uint64_t *sizes, size_t n,
		   int dirfd, const struct cap_xfer_fetch_opts *o, struct cap_err *err)
{
	for (size_t i = 0; i < n; i++)
		if (!cap_tree_path_ok(paths[i]) || !cap_proto_file_path_ok(paths[i]))
			return cap_err_set(err, EINVAL, "'%s' is not a path below %s that can be fetched", paths[i], root);
	if (n == 0)
		return 0;
	struct fetch f = { .root = root, .paths = paths, .sizes = sizes, .n = n, .stagefd = dirfd, .o = o };
	/* What the staged copies may take: the free space less what stays
	 * free, and the caller's limit. */
	struct statvfs vfs;
	if (fstatvfs(dirfd, &vfs) < 0)
		return cap_err_set(err, errno, "cannot tell the free space in %s: %s", o->where, strerror(errno));
	uint64_t avail = (uint64_t)vfs.f_bavail * vfs.f_frsize;
	uint64_t keep = o->keep_free ? o->keep_free : CAP_XFER_KEEP_FREE;
	f.bound = avail > keep ? avail - keep : 0;
	f.why = "its file system's free space, less what is kept free";
	if (o->max_bytes && o->max_bytes < f.bound) {
		f.bound = o->max_bytes;
		f.why = "the limit of this operation";
	}
	f.budget = f.bound;
	int r = reader_start(&f.rd, sb, -1, fetch_consume, err);
	if (r < 0) {
		reader_end(&f.rd);
		return r;
	}
	_cleanup_free_ char *what = xasprintf("fetching %zu file%s from %s", n, n == 1 ? "" : "s", root);
	if ((r = cap_xfer_op_start(&f.rd.op, CAP_FILE_TAR_OUT, root, "", CAP_TAR_PATHS_STDIN | (o->prefix ? CAP_TAR_PREFIX : 0),
				   err)) < 0)
		goto out;
	struct cap_buf batch;
	cap_buf_init(&batch);
	for (size_t i = 0; i < n && r == 0 && !f.rd.op.done; i++) {
		cap_buf_append(&batch, paths[i], strlen(paths[i]) + 1);
		if (cap_buf_used(&batch) >= 64 * 1024 || i + 1 == n) {
			r = cap_xfer_feed(&f.rd.op, cap_buf_head(&batch), cap_buf_used(&batch), err);
			cap_buf_consume(&batch, cap_buf_used(&batch));
		}
	}
	cap_buf_fini(&batch);
	if (r < 0)
		goto out;
	if (!f.rd.op.done)
		cap_sandbox_stdin(sb, f.rd.op.id, NULL, 0);
	if ((r = cap_xfer_pump(&f.rd.op, true, err)) < 0)
		goto out;
	reader_join(&f.rd);
	/* A path gone from the guest is the reader's -ESTALE naming it
	 * (the guest's exit 1 says less). */
	if (f.rd.rc == -ESTALE) {
		*err = f.rd.err;
		r = f.rd.rc;
		goto out;
	}
	r = cap_xfer_op_status(&f.rd.op, what, err);
	if (r >= 0 && f.rd.rc < 0) {
		*err = f.rd.err;
		r = f.rd.rc;
	} else if (r == 1) {
		char msg[700];
		cap_xfer_messages(&f.rd.op, msg, sizeof(msg));
		r = cap_err_set(err, ESTALE, "%s: %s", what, *msg ? msg : "the sandbox reported a failure without naming a path");
	}
out:
	reader_end(&f.rd);
	return r < 0 ? r : 0;
}
