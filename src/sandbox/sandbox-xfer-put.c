/* Files into a running sandbox (cap_xfer_put): the host tree walked and
 * written as tar with libarchive to the FILE operation's STDIN; the
 * guest's conflicts and refusals collected. */
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

/* Bytes read from a host file at a time. */
#define XFER_CHUNK (256 * 1024)

/* --- put: a host tree into the guest ----------------------------------------- */

struct hent {
	char *rel;	/* below src, "" for src itself */
	char *target;	/* a link's */
	char type;	/* enum cap_tree_type */
	bool sent;
	uint64_t size;	/* a file's, as sent */
	uint32_t uid, gid;	/* with CAP_XFER_OWNERS */
	dev_t dev;	/* a file with more than one link: where the others point */
	ino_t ino;
	bool multi;
};

struct put {
	struct cap_xfer_op op;	/* first */
	const char *src;
	unsigned flags;
	struct cap_xfer_result *res;
	struct hent *v;
	size_t n, cap;
	size_t escaping;	/* links leaving the tree (refused, listed) */
	struct cap_err *err;
	int failed;	/* the write callback's pump error */
	struct cap_buf lines;	/* STDOUT, "conflict PATH" lines */
	struct cap_lines linest;
	bool bad_output;
	char bad_line[128];
};

static void add(struct put *p, const char *rel, char type, char *target)
{
	if (p->n == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 64;
		p->v = xrealloc(p->v, p->cap * sizeof(*p->v));
	}
	p->v[p->n++] = (struct hent){ .rel = xstrdup(rel), .target = target, .type = type };
}

/* With CAP_XFER_OWNERS: the last entry's owner and, for a file of more
 * than one link, its identity. */
static void add_meta(struct put *p, const struct stat *st)
{
	struct hent *h = &p->v[p->n - 1];
	h->uid = st->st_uid;
	h->gid = st->st_gid;
	if (S_ISREG(st->st_mode) && st->st_nlink > 1) {
		h->multi = true;
		h->dev = st->st_dev;
		h->ino = st->st_ino;
	}
}

static int cmp_name(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The host path of an entry, for messages. New string. */
static char *host_path(const struct put *p, const char *rel)
{
	return *rel ? xasprintf("%s/%s", p->src, rel) : xstrdup(p->src);
}

/* Walk the directory open as fd (rel below src), listing what put will
 * send, in name order, parents first. Links are checked here, before
 * anything is sent. Takes fd. */
static int walk(struct put *p, int fd, const char *rel, unsigned depth)
{
	DIR *d = fdopendir(fd);
	if (!d) {
		int e = errno;
		close(fd);
		_cleanup_free_ char *hp = host_path(p, rel);
		return cap_err_set(p->err, e, "cannot read the directory %s: %s", hp, strerror(e));
	}
	char **names = NULL;
	size_t nn = 0;
	int r = 0;
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			cap_xfer_push(&names, &nn, xstrdup(e->d_name));
		errno = 0;
	}
	if (errno) {
		int k = errno;
		_cleanup_free_ char *hp = host_path(p, rel);
		r = cap_err_set(p->err, k, "cannot read the directory %s: %s", hp, strerror(k));
		goto out;
	}
	if (nn)
		qsort(names, nn, sizeof(char *), cmp_name);
	for (size_t i = 0; i < nn && r == 0; i++) {
		_cleanup_free_ char *crel = *rel ? xasprintf("%s/%s", rel, names[i]) : xstrdup(names[i]);
		struct stat st;
		if (strlen(crel) > CAP_TREE_MAX_PATH || depth + 1 > CAP_TREE_MAX_DEPTH) {
			_cleanup_free_ char *hp = host_path(p, crel);
			r = cap_err_set(p->err, ENAMETOOLONG, "%s is more than %u bytes or %u directories deep below %s; it cannot be copied",
					hp, CAP_TREE_MAX_PATH, CAP_TREE_MAX_DEPTH, p->src);
			break;
		}
		if (p->n >= CAP_TREE_MAX_ENTRIES) {
			r = cap_err_set(p->err, E2BIG, "%s holds more than %u entries; copy it in parts",
					p->src, CAP_TREE_MAX_ENTRIES);
			break;
		}
		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0) {
			int k = errno;
			_cleanup_free_ char *hp = host_path(p, crel);
			r = cap_err_set(p->err, k, "cannot look at %s: %s", hp, strerror(k));
			break;
		}
		if (S_ISDIR(st.st_mode)) {
			add(p, crel, CAP_TREE_DIR, NULL);
			add_meta(p, &st);
			int cfd = openat(dirfd(d), names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (cfd < 0) {
				int k = errno;
				_cleanup_free_ char *hp = host_path(p, crel);
				r = cap_err_set(p->err, k, "cannot open the directory %s: %s", hp, strerror(k));
				break;
			}
			r = walk(p, cfd, crel, depth + 1);
		} else if (S_ISREG(st.st_mode)) {
			add(p, crel, CAP_TREE_FILE, NULL);
			add_meta(p, &st);
		} else if (S_ISLNK(st.st_mode)) {
			char target[CAP_TREE_MAX_PATH + 1];
			ssize_t k = readlinkat(dirfd(d), names[i], target, sizeof(target));
			_cleanup_free_ char *hp = host_path(p, crel);
			if (k < 0) {
				int x = errno;
				r = cap_err_set(p->err, x, "cannot read the symbolic link %s: %s", hp, strerror(x));
				break;
			}
			if ((size_t)k == sizeof(target)) {
				r = cap_err_set(p->err, ENAMETOOLONG, "the symbolic link %s has a target over %u bytes",
						hp, CAP_TREE_MAX_PATH);
				break;
			}
			target[k] = 0;
			if (p->flags & CAP_XFER_OWNERS) {
				/* Resolved in the container's root, where it
				 * cannot lead out. */
				add(p, crel, CAP_TREE_LINK, xstrdup(target));
				add_meta(p, &st);
			} else if (p->flags & CAP_XFER_NO_LINKS) {
				cap_xfer_refuse(p->res, "%s: a symbolic link (links are not copied)", hp);
			} else if (k == 0 || !cap_tree_link_inside(crel, target)) {
				cap_xfer_refuse(p->res, "%s: a symbolic link to %s, which leaves the copied tree", hp, target);
				p->escaping++;
			} else {
				add(p, crel, CAP_TREE_LINK, xstrdup(target));
			}
		} else {
			_cleanup_free_ char *hp = host_path(p, crel);
			cap_xfer_refuse(p->res, "%s: a %s, not copied (only files, directories and symbolic links are)", hp,
					S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
		}
	}
out:
	for (size_t i = 0; i < nn; i++)
		free(names[i]);
	free(names);
	closedir(d);
	return r;
}

static la_ssize_t put_write(struct archive *a, void *ud, const void *buf, size_t n)
{
	struct put *p = ud;
	if (p->failed < 0) {
		archive_set_error(a, -p->failed, "the transfer failed");
		return -1;
	}
	if (p->op.done) {
		archive_set_error(a, EPIPE, "the sandbox ended the transfer");
		return -1;
	}
	int r = cap_xfer_feed(&p->op, buf, n, p->err);
	if (r < 0) {
		p->failed = r;
		archive_set_error(a, -r, "%s", p->err->msg);
		return -1;
	}
	return (la_ssize_t)n;
}

static void on_conflict(void *ud, const char *s, size_t n)
{
	struct put *p = ud;
	static const char word[] = "conflict ";
	char *path = NULL;
	if (p->bad_output)
		return;
	if (n > sizeof(word) - 1 && memcmp(s, word, sizeof(word) - 1) == 0 &&
	    cap_tree_unescape(s + sizeof(word) - 1, n - (sizeof(word) - 1), &path) == 0 &&
	    cap_tree_path_ok(path) && p->res->nconflicts < p->n) {
		cap_xfer_push(&p->res->conflicts, &p->res->nconflicts, path);
		return;
	}
	free(path);
	p->bad_output = true;
	snprintf(p->bad_line, sizeof(p->bad_line), "%.*s", (int)CAP_MIN(n, (size_t)100), s);
	for (char *c = p->bad_line; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
}

static void on_conflict_long(void *ud)
{
	on_conflict(ud, "(a line over the limit)", 23);
}

static int put_out(struct cap_xfer_op *o, const uint8_t *b, size_t n)
{
	struct put *p = (struct put *)o;
	cap_buf_append(&p->lines, b, n);
	cap_buf_lines(&p->lines, CAP_XFER_LINE_MAX, &p->linest, on_conflict, on_conflict_long, p);
	return 0;
}

/* The entry's name in the stream. New string. */
static char *entry_name(const char *dest_name, const char *rel)
{
	if (!*dest_name)
		return xstrdup(rel);
	return *rel ? xasprintf("%s/%s", dest_name, rel) : xstrdup(dest_name);
}

/* Open an entry below the top again to send it, never through a link. */
static int open_entry(int topfd, const char *rel)
{
	struct open_how how = {
		.flags = O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	return (int)syscall(SYS_openat2, topfd, rel, &how, sizeof(how));
}

/* Write one entry (and a file's content) to the stream. 0, 1 when the
 * entry was skipped (listed in res), or -errno (the stream is over). */
static int put_entry(struct put *p, struct archive *a, struct archive_entry *ae, int topfd,
		     struct hent *h, const char *name, const struct stat *topst, const char *hardlink)
{
	_cleanup_free_ char *hp = host_path(p, h->rel);
	_cleanup_free_ uint8_t *buf = NULL;
	_cleanup_close_ int fd = -1;
	struct stat st;
	archive_entry_clear(ae);
	archive_entry_set_pathname(ae, name);
	if (p->flags & CAP_XFER_OWNERS) {
		archive_entry_set_uid(ae, h->uid);
		archive_entry_set_gid(ae, h->gid);
	}
	if (hardlink) {
		/* Another name of a file already sent. */
		archive_entry_set_filetype(ae, AE_IFREG);
		archive_entry_set_perm(ae, 0644);
		archive_entry_set_hardlink(ae, hardlink);
		archive_entry_set_size(ae, 0);
		if (archive_write_header(a, ae) < ARCHIVE_WARN)
			goto broken;
		h->sent = true;
		p->res->files++;
		return 0;
	}
	if (h->type == CAP_TREE_LINK) {
		archive_entry_set_filetype(ae, AE_IFLNK);
		archive_entry_set_perm(ae, 0777);
		archive_entry_set_symlink(ae, h->target);
	} else {
		if (!*h->rel && h->type == CAP_TREE_FILE)
			fd = open(p->src, O_RDONLY | O_NOFOLLOW | O_NOCTTY | O_NONBLOCK | O_CLOEXEC);
		else if (!*h->rel)
			fd = dup(topfd);
		else
			fd = open_entry(topfd, h->rel);
		if (fd < 0) {
			int e = errno;
			cap_xfer_refuse(p->res, "%s: cannot open it: %s", hp, strerror(e));
			return 1;
		}
		if (fstat(fd, &st) < 0) {
			int e = errno;
			cap_xfer_refuse(p->res, "%s: cannot look at it: %s", hp, strerror(e));
			return 1;
		}
		if ((h->type == CAP_TREE_FILE && !S_ISREG(st.st_mode)) ||
		    (h->type == CAP_TREE_DIR && !S_ISDIR(st.st_mode)) ||
		    (!*h->rel && (st.st_dev != topst->st_dev || st.st_ino != topst->st_ino))) {
			cap_xfer_refuse(p->res, "%s: it was replaced while being copied; copy it again", hp);
			return 1;
		}
		archive_entry_set_filetype(ae, h->type == CAP_TREE_DIR ? AE_IFDIR : AE_IFREG);
		archive_entry_set_perm(ae, st.st_mode & 07777);
		archive_entry_set_mtime(ae, st.st_mtim.tv_sec, 0);
		if (h->type == CAP_TREE_FILE)
			archive_entry_set_size(ae, st.st_size);
	}
	if (archive_write_header(a, ae) < ARCHIVE_WARN)
		goto broken;
	h->sent = true;
	if (h->type == CAP_TREE_DIR) {
		p->res->dirs++;
		return 0;
	}
	if (h->type == CAP_TREE_LINK) {
		p->res->links++;
		return 0;
	}
	uint64_t left = (uint64_t)st.st_size;
	buf = xmalloc(XFER_CHUNK);
	bool shrank = false;
	while (left > 0) {
		size_t want = (size_t)CAP_MIN(left, (uint64_t)XFER_CHUNK);
		ssize_t k = shrank ? 0 : read(fd, buf, want);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			/* The entry's size is promised: fill it, and say so. */
			int e = errno;
			cap_xfer_refuse(p->res, "%s: reading it failed (%s); its copy in the sandbox is cut short (filled with zeros)",
					hp, strerror(e));
			shrank = true;
			continue;
		}
		if (k == 0) {
			if (!shrank)
				cap_xfer_refuse(p->res, "%s: it shrank while being copied; its copy in the sandbox is cut short (filled with zeros)",
						hp);
			shrank = true;
			k = (ssize_t)want;
			memset(buf, 0, want);
		}
		if (archive_write_data(a, buf, (size_t)k) != k)
			goto broken;
		left -= (uint64_t)k;
	}
	h->size = (uint64_t)st.st_size;
	p->res->files++;
	p->res->bytes += h->size;
	return 0;
broken:
	if (p->failed < 0)
		return p->failed;
	if (p->op.done)
		return -EPIPE;	/* the guest ended it: its status says why */
	return cap_err_set(p->err, EIO, "writing the tar stream for %s: %s", hp, archive_error_string(a));
}

int cap_xfer_put(struct cap_sandbox *sb, const char *src, const char *root,
		 const char *dest_dir, const char *dest_name, unsigned flags,
		 struct cap_xfer_result *res, struct cap_err *err)
{
	if (!cap_proto_file_path_ok(dest_dir))
		return cap_err_set(err, EINVAL, "path '%s' is not allowed: it must be relative to %s, without '..'",
				   dest_dir, root);
	if (*dest_name && !cap_xfer_component_ok(dest_name))
		return cap_err_set(err, EINVAL, "'%s' is not a file name (one path component, not '.' or '..')",
				   dest_name);
	_cleanup_free_ char *shown = cap_xfer_shown_path(root, dest_dir);
	_cleanup_free_ char *what = xasprintf("copying %s to %s", src, shown);
	struct put p = { .src = src, .flags = flags, .res = res, .err = err };
	cap_xfer_op_init(&p.op, sb, put_out);
	cap_buf_init(&p.lines);
	int r;
	struct archive *a = NULL;
	struct archive_entry *ae = NULL;
	_cleanup_close_ int top = open(src, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	_cleanup_close_ int topdir = -1;
	struct stat st;
	if (top < 0 || fstat(top, &st) < 0) {
		int e = errno;
		r = cap_err_set(err, e, "cannot open %s: %s", src, strerror(e));
		goto out;
	}

	/* First the walk: a link that would leave the tree refuses the whole
	 * put before anything is sent. */
	if (S_ISDIR(st.st_mode)) {
		if (!(flags & CAP_XFER_RECURSIVE)) {
			r = cap_err_set(err, EISDIR, "%s is a directory; it is copied only recursively", src);
			goto out;
		}
		topdir = openat(top, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		int wfd = topdir < 0 ? -1 : dup(topdir);
		if (wfd < 0) {
			int e = errno;
			r = cap_err_set(err, e, "cannot open the directory %s: %s", src, strerror(e));
			goto out;
		}
		if (*dest_name)
			add(&p, "", CAP_TREE_DIR, NULL);
		if ((r = walk(&p, wfd, "", 1)) < 0)
			goto out;
	} else if (!*dest_name) {
		r = cap_err_set(err, ENOTDIR, "%s is not a directory (its contents were to be copied)", src);
		goto out;
	} else if (S_ISREG(st.st_mode)) {
		add(&p, "", CAP_TREE_FILE, NULL);
	} else if (S_ISLNK(st.st_mode)) {
		cap_xfer_refuse(res, "%s: a symbolic link (capsule cp copies what a link is in a tree, not what it points to; name its target)",
				src);
		if (!(flags & CAP_XFER_NO_LINKS))
			p.escaping++;
	} else {
		cap_xfer_refuse(res, "%s: a %s, not copied (only files, directories and symbolic links are)", src,
				S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
	}
	if (p.escaping) {
		r = cap_err_set(err, EPERM, "nothing was copied: %zu symbolic link%s in %s would lead outside what is copied (listed); remove %s, or copy what %s to",
				p.escaping, p.escaping == 1 ? "" : "s", src, p.escaping == 1 ? "it" : "them",
				p.escaping == 1 ? "it points" : "they point");
		goto out;
	}
	if (p.n == 0 && res->nrefused) {
		r = (flags & (CAP_XFER_NO_LINKS | CAP_XFER_OWNERS)) ? 0 : cap_err_set(err, EPERM, "nothing was copied from %s (listed)", src);
		goto out;
	}

	/* Then the stream. */
	if ((r = cap_xfer_op_start(&p.op, CAP_FILE_TAR_IN, root, dest_dir,
				   ((flags & CAP_XFER_NO_REPLACE) ? CAP_TAR_NO_REPLACE : 0) |
				   ((flags & CAP_XFER_OWNERS) ? CAP_TAR_OWNERS : 0) |
				  ((flags & CAP_XFER_NO_SYNC) ? CAP_FILE_NO_SYNC : 0),
			  err)) < 0)
		goto out;
	a = archive_write_new();
	ae = archive_entry_new();
	if (!a || !ae)
		abort();
	/* Names are bytes: written as they are (pax hdrcharset=BINARY when
	 * not ASCII), whatever this process's locale. */
	if (archive_write_set_format_pax_restricted(a) != ARCHIVE_OK ||
	    archive_write_set_format_option(a, "pax", "hdrcharset", "BINARY") != ARCHIVE_OK ||
	    archive_write_set_bytes_per_block(a, 64 * 1024) != ARCHIVE_OK ||
	    archive_write_set_bytes_in_last_block(a, 1) != ARCHIVE_OK ||
	    archive_write_open(a, &p, NULL, put_write, NULL) != ARCHIVE_OK) {
		r = cap_err_set(err, EIO, "cannot start a tar stream: %s", archive_error_string(a));
		goto out;
	}
	for (size_t i = 0; i < p.n && !p.op.done; i++) {
		_cleanup_free_ char *name = entry_name(dest_name, p.v[i].rel);
		_cleanup_free_ char *first = NULL;
		/* A file's other names are links to its first (a busybox
		 * image's applets: one binary, hundreds of names). */
		for (size_t j = 0; p.v[i].multi && j < i && !first; j++)
			if (p.v[j].multi && p.v[j].sent && p.v[j].dev == p.v[i].dev && p.v[j].ino == p.v[i].ino)
				first = entry_name(dest_name, p.v[j].rel);
		if ((r = put_entry(&p, a, ae, topdir >= 0 ? topdir : top, &p.v[i], name, &st, first)) < 0)
			break;
	}
	if (r >= 0 && !p.op.done && archive_write_close(a) != ARCHIVE_OK && p.failed == 0 && !p.op.done)
		r = cap_err_set(err, EIO, "ending the tar stream: %s", archive_error_string(a));
	if (r == -EPIPE && p.op.done)
		r = 0;	/* the guest stopped reading: its status below says why */
	if (r < 0)
		goto out;
	if (!p.op.done)
		cap_sandbox_stdin(sb, p.op.id, NULL, 0);
	if ((r = cap_xfer_pump(&p.op, true, err)) < 0)
		goto out;
	int st_guest = cap_xfer_op_status(&p.op, what, err);
	if (st_guest < 0) {
		r = st_guest;
		goto out;
	}
	res->durable = (p.op.ex.flags & CAP_EXIT_DURABLE) != 0;
	res->sync_ms = p.op.ex.sync_ms;
	if (p.bad_output) {
		r = cap_err_set(err, EBADMSG, "%s: the sandbox sent a line that is not \"conflict PATH\": '%s'",
				what, p.bad_line);
		goto out;
	}
	bool guest_refused = p.op.nmsgs > 0 || p.op.dropped > 0;
	cap_xfer_take_messages(&p.op, res);
	if (st_guest == 1 && !guest_refused && res->nconflicts == 0) {
		r = cap_err_set(err, EIO, "%s: the sandbox reported a failure without naming a path", what);
		goto out;
	}
	if (res->nconflicts) {
		/* What was kept in the guest was not written. */
		qsort(res->conflicts, res->nconflicts, sizeof(char *), cmp_name);
		for (size_t i = 0; i < p.n; i++) {
			_cleanup_free_ char *name = entry_name(dest_name, p.v[i].rel);
			const char *key = name;
			if (!p.v[i].sent || !bsearch(&key, res->conflicts, res->nconflicts, sizeof(char *), cmp_name))
				continue;
			if (p.v[i].type == CAP_TREE_DIR) {
				res->dirs--;
			} else if (p.v[i].type == CAP_TREE_LINK) {
				res->links--;
			} else {
				res->files--;
				res->bytes -= p.v[i].size;
			}
		}
	}
	if (res->nrefused && !(flags & (CAP_XFER_NO_LINKS | CAP_XFER_OWNERS)))
		r = cap_err_set(err, EPERM, "%s: %zu path%s not copied (listed)", what, res->nrefused,
				res->nrefused == 1 ? " was" : "s were");
	else
		r = 0;
out:
	if (a)
		archive_write_free(a);
	if (ae)
		archive_entry_free(ae);
	cap_xfer_op_abort(&p.op);
	cap_xfer_op_fini(&p.op);
	cap_buf_fini(&p.lines);
	for (size_t i = 0; i < p.n; i++) {
		free(p.v[i].rel);
		free(p.v[i].target);
	}
	free(p.v);
	return r;
}
