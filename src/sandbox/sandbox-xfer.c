/* Files in and out of a running sandbox over the agent channel
 * (xfer.h): the FILE streaming operations driven from one blocking loop,
 * tar written from a host tree with libarchive, and the guest's tar read
 * into one (or into a merge's staging directory) by a second thread that
 * libarchive can block in. Everything the guest sends is hostile: its tar
 * headers, names, link targets and lines are checked before use. */
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
#include "util.h"
#include "xfer.h"

/* Most bytes queued for the guest before the loop waits for them to go. */
#define XFER_BACKLOG (1u << 20)
/* Most manifest text accepted from a guest. */
#define XFER_MANIFEST_MAX CAP_TREE_MAX_TEXT
/* Longest line accepted from a guest: an escaped path and its reason. */
#define XFER_LINE_MAX (3 * CAP_TREE_MAX_PATH + 1024)
/* STDERR lines kept from one operation (the rest are counted). */
#define XFER_MAX_MESSAGES 10000
/* Bytes read from a host file at a time. */
#define XFER_CHUNK (256 * 1024)

void cap_xfer_result_fini(struct cap_xfer_result *r)
{
	for (size_t i = 0; i < r->nconflicts; i++)
		free(r->conflicts[i]);
	for (size_t i = 0; i < r->nrefused; i++)
		free(r->refused[i]);
	free(r->conflicts);
	free(r->refused);
	memset(r, 0, sizeof(*r));
}

static void push(char ***v, size_t *n, char *s)
{
	if ((*n & (*n - 1)) == 0)	/* 0, 1, 2, 4...: grow to the next power */
		*v = xrealloc(*v, (*n ? *n * 2 : 1) * sizeof(char *));
	(*v)[(*n)++] = s;
}

__attribute__((format(printf, 2, 3))) static void refuse(struct cap_xfer_result *res,
							  const char *fmt, ...)
{
	va_list ap;
	char *s;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		abort();
	va_end(ap);
	push(&res->refused, &res->nrefused, s);
}

/* "root/path", or root for the path "". New string. */
static char *shown_path(const char *root, const char *path)
{
	return *path ? xasprintf("%s/%s", root, path) : xstrdup(root);
}

/* --- one operation on the agent channel ------------------------------------ */

/* One FILE streaming operation: its stream, how it ended, its STDERR lines,
 * and where its STDOUT goes (out). */
struct op {
	struct cap_sandbox *sb;
	uint32_t id;
	bool started, done;
	struct cap_exit ex;
	bool rejected;	/* the agent or the shim refused the stream */
	int rej_errno;
	char rej_msg[512];
	/* Takes the STDOUT bytes; < 0 stops the transfer: the stream is
	 * killed, the error kept in sink_err. */
	int (*out)(struct op *o, const uint8_t *p, size_t n);
	int sink_err;
	struct cap_buf errbuf;
	struct cap_lines errst;
	char **msgs;	/* STDERR lines, "capsule: " taken off, sanitized */
	size_t nmsgs, dropped;
};

static void op_init(struct op *o, struct cap_sandbox *sb,
		    int (*out)(struct op *, const uint8_t *, size_t))
{
	memset(o, 0, sizeof(*o));
	o->sb = sb;
	o->out = out;
	cap_buf_init(&o->errbuf);
}

static void op_fini(struct op *o)
{
	for (size_t i = 0; i < o->nmsgs; i++)
		free(o->msgs[i]);
	free(o->msgs);
	cap_buf_fini(&o->errbuf);
}

static void on_errline(void *ud, const char *p, size_t n)
{
	struct op *o = ud;
	static const char prefix[] = "capsule: ";
	if (n >= sizeof(prefix) - 1 && memcmp(p, prefix, sizeof(prefix) - 1) == 0) {
		p += sizeof(prefix) - 1;
		n -= sizeof(prefix) - 1;
	}
	if (n == 0)
		return;
	if (o->nmsgs == XFER_MAX_MESSAGES) {
		o->dropped++;
		return;
	}
	char *s = xstrndup(p, n);
	for (char *c = s; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	push(&o->msgs, &o->nmsgs, s);
}

static void on_errlong(void *ud)
{
	on_errline(ud, "(a message over the line limit, dropped)", 40);
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct op *o = ud;
	(void)id;
	if (fd == 2) {
		cap_buf_append(&o->errbuf, p, n);
		cap_buf_lines(&o->errbuf, XFER_LINE_MAX, &o->errst, on_errline, on_errlong, o);
		return;
	}
	if (o->sink_err)
		return;
	int r = o->out ? o->out(o, p, n) : 0;
	if (r < 0) {
		o->sink_err = r;
		cap_sandbox_signal(o->sb, o->id, SIGKILL);
	}
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum,
		    const char *msg)
{
	struct op *o = ud;
	(void)id;
	o->done = true;
	if (ex) {
		o->ex = *ex;
	} else {
		o->rejected = true;
		o->rej_errno = errnum > 0 && errnum < 4096 ? errnum : EIO;
		snprintf(o->rej_msg, sizeof(o->rej_msg), "%s", msg ? msg : strerror(o->rej_errno));
	}
	/* A last line without its newline. */
	if (cap_buf_used(&o->errbuf) && !o->errst.discarding)
		on_errline(o, (const char *)cap_buf_head(&o->errbuf), cap_buf_used(&o->errbuf));
	cap_buf_consume(&o->errbuf, cap_buf_used(&o->errbuf));
}

static const struct cap_exec_events op_events = { on_output, on_done, NULL };

static int op_start(struct op *o, uint32_t file_op, const char *root, const char *path,
		    uint32_t limit, struct cap_err *err)
{
	struct cap_file_req req = { .op = file_op, .limit = limit, .root = root, .path = path };
	int r = cap_sandbox_file(o->sb, &req, 0, &op_events, o, &o->id, err);
	if (r < 0)
		return r;
	o->started = true;
	return 0;
}

/* The one loop every transfer runs in: drive the agent channel until the
 * operation ends or, unless until_done, until what is queued for the
 * guest is down to XFER_BACKLOG (the flow control of STDIN). */
static int pump(struct op *o, bool until_done, struct cap_err *err)
{
	while (!o->done && (until_done || cap_sandbox_backlog(o->sb) > XFER_BACKLOG)) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(o->sb, pfd);
		if (poll(pfd, CAP_SANDBOX_NPOLL, -1) < 0) {
			if (errno == EINTR)
				continue;
			return cap_err_set(err, errno, "poll: %s", strerror(errno));
		}
		int r = cap_sandbox_dispatch(o->sb, pfd, err);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Queue bytes for the operation's STDIN, keeping the backlog bounded;
 * once the operation has ended they are dropped (its status says why). */
static int feed(struct op *o, const void *p, size_t n, struct cap_err *err)
{
	if (o->done)
		return 0;
	if (cap_sandbox_stdin(o->sb, o->id, p, n) < 0)
		return 0;	/* the stream is gone; done() follows */
	return pump(o, false, err);
}

/* Up to a few of the guest's messages joined with "; " (for an error). */
static void messages(const struct op *o, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = 0;
	for (size_t i = 0; i < o->nmsgs && used + 1 < len; i++) {
		int k = snprintf(buf + used, len - used, "%s%s", i ? "; " : "", o->msgs[i]);
		if (k < 0)
			break;
		used += (size_t)k;
	}
	if (used >= len && len > 4)
		memcpy(buf + len - 4, "...", 4);
}

/* How the guest ended the operation: its exit code 0 or 1 (some paths
 * refused, in msgs), or -errno with err naming what (the path missing,
 * nothing could be done, a signal). */
static int op_status(const struct op *o, const char *what, struct cap_err *err)
{
	char msg[700];
	messages(o, msg, sizeof(msg));
	if (o->rejected)
		return cap_err_set(err, o->rej_errno, "%s: the sandbox refused it: %s", what, o->rej_msg);
	switch (o->ex.kind) {
	case CAP_EXIT_START_FAILED: {
		int e = o->ex.value > 0 && o->ex.value < 4096 ? o->ex.value : EIO;
		return cap_err_set(err, e, "%s: %s", what, *msg ? msg : strerror(e));
	}
	case CAP_EXIT_SIGNAL:
		return cap_err_set(err, EIO, "%s: the sandbox's transfer process was killed by signal %d%s%s", what,
				   o->ex.value, *msg ? ": " : "", msg);
	default:
		if (o->ex.value == 0 || o->ex.value == 1)
			return o->ex.value;
		return cap_err_set(err, EIO, "%s: nothing was done: %s", what,
				   *msg ? msg : "the sandbox gave no reason");
	}
}

/* Move the guest's messages into res->refused. */
static void take_messages(struct op *o, struct cap_xfer_result *res)
{
	for (size_t i = 0; i < o->nmsgs; i++)
		push(&res->refused, &res->nrefused, o->msgs[i]);
	o->nmsgs = 0;
	if (o->dropped)
		refuse(res, "(%zu more paths not copied, not listed)", o->dropped);
}

/* After an error of ours: make sure the operation is over (kill it if it
 * runs) so that the connection can serve the next call. */
static void op_abort(struct op *o)
{
	struct cap_err ignored = { 0 };
	if (!o->started || o->done)
		return;
	cap_sandbox_signal(o->sb, o->id, SIGKILL);
	pump(o, true, &ignored);
}

/* --- kind -------------------------------------------------------------------- */

/* READ with a limit of 0 bytes and 0 entries, whose answer says what the
 * path is without sending content: a directory lists (EXIT 1), a
 * non-empty file is over the limit (EFBIG), an empty one is read (EXIT
 * 0), another kind of file is refused (EINVAL), nothing there is ENOENT.
 * The agent resolves the path (a symbolic link that stays in the root is
 * followed), so the answer is what the path leads to. */
int cap_xfer_kind(struct cap_sandbox *sb, const char *root, const char *path,
		  char *kind, struct cap_err *err)
{
	if (!cap_proto_file_path_ok(path))
		return cap_err_set(err, EINVAL, "path '%s' is not allowed: it must be relative to %s, without '..'",
				   path, root);
	struct op o;
	op_init(&o, sb, NULL);
	_cleanup_free_ char *shown = shown_path(root, path);
	struct cap_file_req req = { .op = CAP_FILE_READ, .root = root, .path = path };
	int r = cap_sandbox_file(sb, &req, 0, &op_events, &o, &o.id, err);
	if (r < 0)
		goto out;
	o.started = true;
	if ((r = pump(&o, true, err)) < 0)
		goto out;
	if (o.rejected) {
		r = cap_err_set(err, o.rej_errno, "%s: the sandbox refused to look at it: %s", shown, o.rej_msg);
	} else if (o.ex.kind == CAP_EXIT_CODE && (o.ex.value == 0 || o.ex.value == 1)) {
		*kind = o.ex.value == 1 ? 'd' : 'f';
	} else if (o.ex.kind == CAP_EXIT_START_FAILED && o.ex.value == EFBIG) {
		*kind = 'f';
	} else if (o.ex.kind == CAP_EXIT_START_FAILED && o.ex.value == EINVAL) {
		*kind = 'o';
	} else if (o.ex.kind == CAP_EXIT_START_FAILED && o.ex.value == ENOENT) {
		*kind = '-';
	} else if (o.ex.kind == CAP_EXIT_START_FAILED && o.ex.value == EXDEV) {
		r = cap_err_set(err, EXDEV, "%s resolves outside %s (a symbolic link leaving it); paths must stay inside their root",
				shown, root);
	} else if (o.ex.kind == CAP_EXIT_START_FAILED && o.nmsgs) {
		/* The agent's line names the path and the rule. */
		r = cap_err_set(err, o.ex.value > 0 && o.ex.value < 4096 ? o.ex.value : EIO, "%s", o.msgs[0]);
	} else {
		r = op_status(&o, shown, err);
		if (r >= 0)	/* an exit code READ does not give */
			r = cap_err_set(err, EBADMSG, "%s: the sandbox answered with exit code %d", shown, o.ex.value);
	}
out:
	op_abort(&o);
	op_fini(&o);
	return r < 0 ? r : 0;
}

/* --- manifest ---------------------------------------------------------------- */

struct manifest_op {
	struct op op;	/* first: the sink finds us from it */
	struct cap_tree_parser *parser;	/* parses the text as it comes */
	uint64_t bytes;
	struct cap_err perr;	/* the parser's refusal */
};

static int manifest_out(struct op *o, const uint8_t *p, size_t n)
{
	struct manifest_op *m = (struct manifest_op *)o;
	if (n > XFER_MANIFEST_MAX - m->bytes)
		return -EFBIG;
	m->bytes += n;
	return cap_tree_parser_feed(m->parser, (const char *)p, n, &m->perr);
}

int cap_xfer_manifest(struct cap_sandbox *sb, const char *root, const char *path,
		      struct cap_tree *out, struct cap_err *err)
{
	struct manifest_op m = { .parser = cap_tree_parser_new(0) };
	op_init(&m.op, sb, manifest_out);
	_cleanup_free_ char *shown = shown_path(root, path);
	_cleanup_free_ char *what = xasprintf("the manifest of %s", shown);
	int r = op_start(&m.op, CAP_FILE_MANIFEST, root, path, 0, err);
	if (r < 0 || (r = pump(&m.op, true, err)) < 0)
		goto out;
	if (m.op.sink_err == -EFBIG) {
		r = cap_err_set(err, EFBIG, "%s is over %llu bytes; the sandbox's tree is too large to compare",
				what, (unsigned long long)XFER_MANIFEST_MAX);
		goto out;
	}
	if (m.op.sink_err < 0 && m.perr.msg[0]) {
		*err = m.perr;
		r = m.op.sink_err;
		cap_err_prefix(err, "%s from the sandbox: ", what);
		goto out;
	}
	if ((r = op_status(&m.op, what, err)) < 0)
		goto out;
	if (r == 1) {
		char msg[700];
		messages(&m.op, msg, sizeof(msg));
		r = cap_err_set(err, EIO, "%s is incomplete: the sandbox could not read every path (%s)", what,
				*msg ? msg : "no reason given");
		goto out;
	}
	r = cap_tree_parser_finish(m.parser, out, err);
	if (r < 0)
		cap_err_prefix(err, "%s from the sandbox: ", what);
out:
	op_abort(&m.op);
	op_fini(&m.op);
	cap_tree_parser_free(m.parser);
	return r < 0 ? r : 0;
}

/* --- put: a host tree into the guest ----------------------------------------- */

struct hent {
	char *rel;	/* below src, "" for src itself */
	char *target;	/* a link's */
	char type;	/* enum cap_tree_type */
	bool sent;
	uint64_t size;	/* a file's, as sent */
};

struct put {
	struct op op;	/* first */
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
			push(&names, &nn, xstrdup(e->d_name));
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
			if (p->flags & CAP_XFER_NO_LINKS) {
				refuse(p->res, "%s: a symbolic link (links are not copied)", hp);
			} else if (k == 0 || !cap_tree_link_inside(crel, target)) {
				refuse(p->res, "%s: a symbolic link to %s, which leaves the copied tree", hp, target);
				p->escaping++;
			} else {
				add(p, crel, CAP_TREE_LINK, xstrdup(target));
			}
		} else {
			_cleanup_free_ char *hp = host_path(p, crel);
			refuse(p->res, "%s: a %s, not copied (only files, directories and symbolic links are)", hp,
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
	int r = feed(&p->op, buf, n, p->err);
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
		push(&p->res->conflicts, &p->res->nconflicts, path);
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

static int put_out(struct op *o, const uint8_t *b, size_t n)
{
	struct put *p = (struct put *)o;
	cap_buf_append(&p->lines, b, n);
	cap_buf_lines(&p->lines, XFER_LINE_MAX, &p->linest, on_conflict, on_conflict_long, p);
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
		     struct hent *h, const char *name, const struct stat *topst)
{
	_cleanup_free_ char *hp = host_path(p, h->rel);
	_cleanup_free_ uint8_t *buf = NULL;
	_cleanup_close_ int fd = -1;
	struct stat st;
	archive_entry_clear(ae);
	archive_entry_set_pathname(ae, name);
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
			refuse(p->res, "%s: cannot open it: %s", hp, strerror(e));
			return 1;
		}
		if (fstat(fd, &st) < 0) {
			int e = errno;
			refuse(p->res, "%s: cannot look at it: %s", hp, strerror(e));
			return 1;
		}
		if ((h->type == CAP_TREE_FILE && !S_ISREG(st.st_mode)) ||
		    (h->type == CAP_TREE_DIR && !S_ISDIR(st.st_mode)) ||
		    (!*h->rel && (st.st_dev != topst->st_dev || st.st_ino != topst->st_ino))) {
			refuse(p->res, "%s: it was replaced while being copied; copy it again", hp);
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
			refuse(p->res, "%s: reading it failed (%s); its copy in the sandbox is cut short (filled with zeros)",
			       hp, strerror(e));
			shrank = true;
			continue;
		}
		if (k == 0) {
			if (!shrank)
				refuse(p->res, "%s: it shrank while being copied; its copy in the sandbox is cut short (filled with zeros)",
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

/* Whether name is one path component we may give an entry. */
static bool component_ok(const char *name)
{
	return *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
	       strlen(name) <= NAME_MAX;
}

int cap_xfer_put(struct cap_sandbox *sb, const char *src, const char *root,
		 const char *dest_dir, const char *dest_name, unsigned flags,
		 struct cap_xfer_result *res, struct cap_err *err)
{
	if (!cap_proto_file_path_ok(dest_dir))
		return cap_err_set(err, EINVAL, "path '%s' is not allowed: it must be relative to %s, without '..'",
				   dest_dir, root);
	if (*dest_name && !component_ok(dest_name))
		return cap_err_set(err, EINVAL, "'%s' is not a file name (one path component, not '.' or '..')",
				   dest_name);
	_cleanup_free_ char *shown = shown_path(root, dest_dir);
	_cleanup_free_ char *what = xasprintf("copying %s to %s", src, shown);
	struct put p = { .src = src, .flags = flags, .res = res, .err = err };
	op_init(&p.op, sb, put_out);
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
		refuse(res, "%s: a symbolic link (capsule cp copies what a link is in a tree, not what it points to; name its target)",
		       src);
		if (!(flags & CAP_XFER_NO_LINKS))
			p.escaping++;
	} else {
		refuse(res, "%s: a %s, not copied (only files, directories and symbolic links are)", src,
		       S_ISFIFO(st.st_mode) ? "FIFO" : S_ISSOCK(st.st_mode) ? "socket" : "device");
	}
	if (p.escaping) {
		r = cap_err_set(err, EPERM, "nothing was copied: %zu symbolic link%s in %s would lead outside what is copied (listed); remove %s, or copy what %s to",
				p.escaping, p.escaping == 1 ? "" : "s", src, p.escaping == 1 ? "it" : "them",
				p.escaping == 1 ? "it points" : "they point");
		goto out;
	}
	if (p.n == 0 && res->nrefused) {
		r = (flags & CAP_XFER_NO_LINKS) ? 0 : cap_err_set(err, EPERM, "nothing was copied from %s (listed)", src);
		goto out;
	}

	/* Then the stream. */
	if ((r = op_start(&p.op, CAP_FILE_TAR_IN, root, dest_dir,
			  ((flags & CAP_XFER_NO_REPLACE) ? CAP_TAR_NO_REPLACE : 0) |
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
		if ((r = put_entry(&p, a, ae, topdir >= 0 ? topdir : top, &p.v[i], name, &st)) < 0)
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
	if ((r = pump(&p.op, true, err)) < 0)
		goto out;
	int st_guest = op_status(&p.op, what, err);
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
	take_messages(&p.op, res);
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
	if (res->nrefused && !(flags & CAP_XFER_NO_LINKS))
		r = cap_err_set(err, EPERM, "%s: %zu path%s not copied (listed)", what, res->nrefused,
				res->nrefused == 1 ? " was" : "s were");
	else
		r = 0;
out:
	if (a)
		archive_write_free(a);
	if (ae)
		archive_entry_free(ae);
	op_abort(&p.op);
	op_fini(&p.op);
	cap_buf_fini(&p.lines);
	for (size_t i = 0; i < p.n; i++) {
		free(p.v[i].rel);
		free(p.v[i].target);
	}
	free(p.v);
	return r;
}

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
	struct op op;	/* first */
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

static int reader_out(struct op *o, const uint8_t *p, size_t n)
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
	op_init(&r->op, sb, reader_out);
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
	op_abort(&r->op);
	reader_join(r);
	op_fini(&r->op);
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
						  : shown_path(g->root, g->path);
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
			refuse(g->res, "%s: not a regular file, directory or symbolic link", gpath);
			continue;
		}
		if (type == AE_IFLNK) {
			const char *t = archive_entry_symlink(e);
			if (!*rel) {
				refuse(g->res, "%s: a symbolic link (to %s); copy what it points to instead", gpath,
				       t ? t : "nothing");
				continue;
			}
			if (!t || !*t || strlen(t) > CAP_TREE_MAX_PATH || !cap_tree_link_inside(rel, t)) {
				refuse(g->res, "%s: a symbolic link to %.1024s, which leaves the copied tree", gpath,
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
			refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
			continue;
		}
		if (type == AE_IFREG) {
			const void *buf;
			size_t size;
			la_int64_t off;
			bool failed = false;
			while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK) {
				if (!failed && archive_write_data_block(w, buf, size, off) < ARCHIVE_WARN) {
					refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
					failed = true;
				}
			}
			if (k != ARCHIVE_EOF) {
				r = cap_err_set(&rd->err, EBADMSG, "the sandbox's tar stream broke in %s: %s", gpath,
						archive_error_string(a));
				break;
			}
			if (archive_write_finish_entry(w) < ARCHIVE_WARN && !failed) {
				refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
				failed = true;
			}
			if (failed)
				continue;
			g->res->files++;
			g->res->bytes += (uint64_t)archive_entry_size(e);
			continue;
		}
		if (archive_write_finish_entry(w) < ARCHIVE_WARN) {
			refuse(g->res, "%s: cannot write it here: %s", gpath, archive_error_string(w));
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
	_cleanup_free_ char *shown = shown_path(root, path);
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
		if (!component_ok(name))
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
	if ((r = op_start(&g.rd.op, CAP_FILE_TAR_OUT, root, path, 0, err)) < 0 ||
	    (r = pump(&g.rd.op, true, err)) < 0) {
		reader_end(&g.rd);
		return r;
	}
	reader_join(&g.rd);
	/* The guest's own failure first: it explains an empty or cut stream. */
	int gs = op_status(&g.rd.op, what, err);
	if (gs >= 0 && g.rd.rc < 0) {
		*err = g.rd.err;
		gs = g.rd.rc;
	}
	if (gs >= 0) {
		take_messages(&g.rd.op, res);
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
	if ((r = op_start(&f.rd.op, CAP_FILE_TAR_OUT, root, "", CAP_TAR_PATHS_STDIN | (o->prefix ? CAP_TAR_PREFIX : 0),
			  err)) < 0)
		goto out;
	struct cap_buf batch;
	cap_buf_init(&batch);
	for (size_t i = 0; i < n && r == 0 && !f.rd.op.done; i++) {
		cap_buf_append(&batch, paths[i], strlen(paths[i]) + 1);
		if (cap_buf_used(&batch) >= 64 * 1024 || i + 1 == n) {
			r = feed(&f.rd.op, cap_buf_head(&batch), cap_buf_used(&batch), err);
			cap_buf_consume(&batch, cap_buf_used(&batch));
		}
	}
	cap_buf_fini(&batch);
	if (r < 0)
		goto out;
	if (!f.rd.op.done)
		cap_sandbox_stdin(sb, f.rd.op.id, NULL, 0);
	if ((r = pump(&f.rd.op, true, err)) < 0)
		goto out;
	reader_join(&f.rd);
	/* A path gone from the guest is the reader's -ESTALE naming it
	 * (the guest's exit 1 says less). */
	if (f.rd.rc == -ESTALE) {
		*err = f.rd.err;
		r = f.rd.rc;
		goto out;
	}
	r = op_status(&f.rd.op, what, err);
	if (r >= 0 && f.rd.rc < 0) {
		*err = f.rd.err;
		r = f.rd.rc;
	} else if (r == 1) {
		char msg[700];
		messages(&f.rd.op, msg, sizeof(msg));
		r = cap_err_set(err, ESTALE, "%s: %s", what, *msg ? msg : "the sandbox reported a failure without naming a path");
	}
out:
	reader_end(&f.rd);
	return r < 0 ? r : 0;
}
