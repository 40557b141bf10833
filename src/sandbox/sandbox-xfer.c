/* Files in and out of a running sandbox over the agent channel
 * (xfer.h), in parts: here the FILE operation every transfer runs (one
 * blocking loop), what a path is (kind) and the manifest; tar written
 * from a host tree (sandbox-xfer-put.c); the guest's tar read into a
 * tree or a merge's staging directory (sandbox-xfer-get.c). Everything
 * the guest sends is hostile: its tar headers, names, link targets and
 * lines are checked before use. */
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

/* Most bytes queued for the guest before the loop waits for them to go. */
#define XFER_BACKLOG (1u << 20)

/* Most manifest text accepted from a guest. */
#define XFER_MANIFEST_MAX CAP_TREE_MAX_TEXT


/* STDERR lines kept from one operation (the rest are counted). */
#define XFER_MAX_MESSAGES 10000

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

void cap_xfer_push(char ***v, size_t *n, char *s)
{
	if ((*n & (*n - 1)) == 0)	/* 0, 1, 2, 4...: grow to the next power */
		*v = xrealloc(*v, (*n ? *n * 2 : 1) * sizeof(char *));
	(*v)[(*n)++] = s;
}

__attribute__((format(printf, 2, 3))) void cap_xfer_refuse(struct cap_xfer_result *res,
							   const char *fmt, ...)
{
	va_list ap;
	char *s;
	va_start(ap, fmt);
	if (vasprintf(&s, fmt, ap) < 0)
		abort();
	va_end(ap);
	cap_xfer_push(&res->refused, &res->nrefused, s);
}

/* "root/path", or root for the path "". New string. */
char *cap_xfer_shown_path(const char *root, const char *path)
{
	return *path ? xasprintf("%s/%s", root, path) : xstrdup(root);
}

/* Whether name is one path component we may give an entry. */
bool cap_xfer_component_ok(const char *name)
{
	return *name && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
	       strlen(name) <= NAME_MAX;
}

/* --- one operation on the agent channel ------------------------------------ */

void cap_xfer_op_init(struct cap_xfer_op *o, struct cap_sandbox *sb,
		      int (*out)(struct cap_xfer_op *, const uint8_t *, size_t))
{
	memset(o, 0, sizeof(*o));
	o->sb = sb;
	o->out = out;
	cap_buf_init(&o->errbuf);
}

void cap_xfer_op_fini(struct cap_xfer_op *o)
{
	for (size_t i = 0; i < o->nmsgs; i++)
		free(o->msgs[i]);
	free(o->msgs);
	cap_buf_fini(&o->errbuf);
}

static void on_errline(void *ud, const char *p, size_t n)
{
	struct cap_xfer_op *o = ud;
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
	cap_xfer_push(&o->msgs, &o->nmsgs, s);
}

static void on_errlong(void *ud)
{
	on_errline(ud, "(a message over the line limit, dropped)", 40);
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct cap_xfer_op *o = ud;
	(void)id;
	if (fd == 2) {
		cap_buf_append(&o->errbuf, p, n);
		cap_buf_lines(&o->errbuf, CAP_XFER_LINE_MAX, &o->errst, on_errline, on_errlong, o);
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
	struct cap_xfer_op *o = ud;
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

int cap_xfer_op_start(struct cap_xfer_op *o, uint32_t file_op, const char *root, const char *path,
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
int cap_xfer_pump(struct cap_xfer_op *o, bool until_done, struct cap_err *err)
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
int cap_xfer_feed(struct cap_xfer_op *o, const void *p, size_t n, struct cap_err *err)
{
	if (o->done)
		return 0;
	if (cap_sandbox_stdin(o->sb, o->id, p, n) < 0)
		return 0;	/* the stream is gone; done() follows */
	return cap_xfer_pump(o, false, err);
}

/* Up to a few of the guest's messages joined with "; " (for an error). */
void cap_xfer_messages(const struct cap_xfer_op *o, char *buf, size_t len)
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
int cap_xfer_op_status(const struct cap_xfer_op *o, const char *what, struct cap_err *err)
{
	char msg[700];
	cap_xfer_messages(o, msg, sizeof(msg));
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
void cap_xfer_take_messages(struct cap_xfer_op *o, struct cap_xfer_result *res)
{
	for (size_t i = 0; i < o->nmsgs; i++)
		cap_xfer_push(&res->refused, &res->nrefused, o->msgs[i]);
	o->nmsgs = 0;
	if (o->dropped)
		cap_xfer_refuse(res, "(%zu more paths not copied, not listed)", o->dropped);
}

/* After an error of ours: make sure the operation is over (kill it if it
 * runs) so that the connection can serve the next call. */
void cap_xfer_op_abort(struct cap_xfer_op *o)
{
	struct cap_err ignored = { 0 };
	if (!o->started || o->done)
		return;
	cap_sandbox_signal(o->sb, o->id, SIGKILL);
	cap_xfer_pump(o, true, &ignored);
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
	struct cap_xfer_op o;
	cap_xfer_op_init(&o, sb, NULL);
	_cleanup_free_ char *shown = cap_xfer_shown_path(root, path);
	struct cap_file_req req = { .op = CAP_FILE_READ, .root = root, .path = path };
	int r = cap_sandbox_file(sb, &req, 0, &op_events, &o, &o.id, err);
	if (r < 0)
		goto out;
	o.started = true;
	if ((r = cap_xfer_pump(&o, true, err)) < 0)
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
		r = cap_xfer_op_status(&o, shown, err);
		if (r >= 0)	/* an exit code READ does not give */
			r = cap_err_set(err, EBADMSG, "%s: the sandbox answered with exit code %d", shown, o.ex.value);
	}
out:
	cap_xfer_op_abort(&o);
	cap_xfer_op_fini(&o);
	return r < 0 ? r : 0;
}

/* --- manifest ---------------------------------------------------------------- */

struct manifest_op {
	struct cap_xfer_op op;	/* first: the sink finds us from it */
	struct cap_tree_parser *parser;	/* parses the text as it comes */
	uint64_t bytes;
	struct cap_err perr;	/* the parser's refusal */
};

static int manifest_out(struct cap_xfer_op *o, const uint8_t *p, size_t n)
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
	cap_xfer_op_init(&m.op, sb, manifest_out);
	_cleanup_free_ char *shown = cap_xfer_shown_path(root, path);
	_cleanup_free_ char *what = xasprintf("the manifest of %s", shown);
	int r = cap_xfer_op_start(&m.op, CAP_FILE_MANIFEST, root, path, 0, err);
	if (r < 0 || (r = cap_xfer_pump(&m.op, true, err)) < 0)
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
	if ((r = cap_xfer_op_status(&m.op, what, err)) < 0)
		goto out;
	if (r == 1) {
		char msg[700];
		cap_xfer_messages(&m.op, msg, sizeof(msg));
		r = cap_err_set(err, EIO, "%s is incomplete: the sandbox could not read every path (%s)", what,
				*msg ? msg : "no reason given");
		goto out;
	}
	r = cap_tree_parser_finish(m.parser, out, err);
	if (r < 0)
		cap_err_prefix(err, "%s from the sandbox: ", what);
out:
	cap_xfer_op_abort(&m.op);
	cap_xfer_op_fini(&m.op);
	cap_tree_parser_free(m.parser);
	return r < 0 ? r : 0;
}
