/* Transfers, workspace diffs and merges and the private import, each in a
 * worker thread (struct task) that touches nothing but its task; the loop
 * turns what it did into the call's result. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "controller-state.h"
#include "layout.h"
#include "paths.h"
#include "util.h"
#include "xfer.h"

/* --- transfers, in worker threads ----------------------------------------------------- */

int cap_ctl_xfer_watch_fd(struct cap_ctl_xfer_watch *w, int fd)
{
	pthread_mutex_lock(&w->lock);
	bool cancelled = w->cancelled;
	if (!cancelled)
		w->fd = fd;
	pthread_mutex_unlock(&w->lock);
	return cancelled ? -ECANCELED : 0;
}

void cap_ctl_xfer_unwatch(struct cap_ctl_xfer_watch *w)
{
	pthread_mutex_lock(&w->lock);
	w->fd = -1;
	pthread_mutex_unlock(&w->lock);
}

/* End a running task: its connection is shut down (the descriptor stays
 * the thread's to close), or it ends as soon as it has one. */
void ctl_task_abort(struct task *t)
{
	pthread_mutex_lock(&t->w.lock);
	t->w.cancelled = true;
	if (t->w.fd >= 0)
		shutdown(t->w.fd, SHUT_RDWR);
	pthread_mutex_unlock(&t->w.lock);
}

void ctl_task_free(struct task *t)
{
	if (!t)
		return;
	if (t->efd >= 0)
		close(t->efd);
	pthread_mutex_destroy(&t->w.lock);
	free(t->owned_path);
	free(t->owned_host);
	free(t->children);
	cap_xfer_result_fini(&t->res);
	cap_ctl_ws_out_fini(&t->ws_out);
	free(t);
}

static struct task *task_new(struct cap_ctl *c, const struct ident *i)
{
	struct task *t = xcalloc(1, sizeof(*t));
	t->efd = -1;
	t->w.fd = -1;
	pthread_mutex_init(&t->w.lock, NULL);
	t->be = c->be;
	t->bud = c->bud;
	snprintf(t->name, sizeof(t->name), "%s", i->name);
	return t;
}

/* Write an upload's bytes to a private temporary file (in a directory of
 * its own, 0700) with the asked mode: put copies it from there like any
 * host file. *dir and *file are new strings. */
static int write_temp(const struct task *t, char **dir, char **file, struct cap_err *err)
{
	char *d = cap_make_tmpdir("capsule-upload", err);
	if (!d)
		return -err->code;
	char *f = xasprintf("%s/content", d);
	int fd = open(f, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0600);
	int r = fd < 0 ? -errno : cap_write_all(fd, t->data, t->len);
	if (r == 0 && fchmod(fd, t->mode) < 0)
		r = -errno;
	if (fd >= 0 && close(fd) < 0 && r == 0)
		r = -errno;
	if (r < 0) {
		cap_err_set(err, -r, "cannot write the upload to %s: %s", f, strerror(-r));
		unlink(f);
		rmdir(d);
		free(f);
		free(d);
		return r;
	}
	*dir = d;
	*file = f;
	return 0;
}

/* In the worker: an upload or download. */
static int run_xfer(struct task *t)
{
	struct cap_ctl_xfer x = {
		.name = t->name, .put = t->put, .root = t->root, .host = t->owned_host,
		.flags = CAP_XFER_RECURSIVE | (t->no_sync ? CAP_XFER_NO_SYNC : 0),
	};
	if (!t->put) {
		x.path = t->owned_path;
		return t->be->xfer(t->bud, &x, &t->w, &t->res, &t->err);
	}
	/* root/a/b/name: name beneath a/b. */
	_cleanup_free_ char *dir = xstrdup(t->owned_path);
	char *slash = strrchr(dir, '/');
	x.dest_dir = slash ? dir : "";
	x.dest_name = slash ? slash + 1 : dir;
	if (slash)
		*slash = '\0';
	if (t->owned_host)
		return t->be->xfer(t->bud, &x, &t->w, &t->res, &t->err);
	char *tdir = NULL, *tfile = NULL;
	int r = write_temp(t, &tdir, &tfile, &t->err);
	if (r < 0)
		return r;
	x.host = tfile;
	x.flags &= ~CAP_XFER_RECURSIVE;	/* one file */
	r = t->be->xfer(t->bud, &x, &t->w, &t->res, &t->err);
	unlink(tfile);
	rmdir(tdir);
	free(tfile);
	free(tdir);
	return r;
}

/* Whether a component of the import's path is a real directory: not a
 * symbolic link (the import's tree must not lead elsewhere), not a file.
 * 1 yes, 0 absent, -errno (err set) otherwise. */
static int import_dir_ok(const char *path, struct cap_err *err)
{
	struct stat st;
	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : cap_err_set(err, errno, "private import: cannot read %s: %s", path, strerror(errno));
	if (S_ISLNK(st.st_mode))
		return cap_err_set(err, ELOOP, "private import: %s is a symbolic link; it is not followed (make it a directory)", path);
	if (!S_ISDIR(st.st_mode))
		return cap_err_set(err, ENOTDIR, "private import: %s is not a directory", path);
	return 1;
}

/* In the worker: the private import of host (DIR/<agent>/<peer>) into
 * /work: every link and special file refused, differing existing paths
 * kept (a re-run after a crash copies nothing twice). */
static int run_import(struct task *t)
{
	_cleanup_free_ char *parent = xstrdup(t->owned_host);
	*strrchr(parent, '/') = '\0';	/* DIR/<agent> */
	int r = import_dir_ok(parent, &t->err);
	if (r == 1)
		r = import_dir_ok(t->owned_host, &t->err);
	if (r <= 0) {
		t->absent = r == 0;
		return r;
	}
	struct cap_ctl_xfer x = {
		.name = t->name, .put = true, .root = CAP_GUEST_WORK, .dest_dir = "", .dest_name = "",
		.host = t->owned_host,
		.flags = CAP_XFER_RECURSIVE | CAP_XFER_NO_REPLACE | CAP_XFER_NO_LINKS,
	};
	return t->be->xfer(t->bud, &x, &t->w, &t->res, &t->err);
}

void cap_ctl_ws_out_fini(struct cap_ctl_ws_out *o)
{
	free(o->changes);
	o->changes = NULL;
	o->nchanges = 0;
	cap_tree_fini(&o->base);
	cap_tree_fini(&o->now);
	cap_workspace_merge_fini(&o->merge);
}

static void *task_main(void *arg)
{
	struct task *t = arg;
	if (t->ws && !t->be->workspace)
		t->r = cap_err_set(&t->err, ENOTSUP, "this controller's sandboxes have no workspace diff or merge");
	else if (t->ws)
		t->r = t->be->workspace(t->bud, &t->ws_req, &t->w, &t->ws_out, &t->err);
	else if (t->fork && !t->be->fork)
		t->r = cap_err_set(&t->err, ENOTSUP, "this controller's sandboxes are not snapshotted");
	else if (t->fork)
		t->r = t->be->fork(t->bud, t->name, t->count, t->children, t->snap, &t->err);
	else if (!t->be->xfer)
		t->r = cap_err_set(&t->err, ENOTSUP, "this controller's sandboxes take no transfers");
	else
		t->r = t->import ? run_import(t) : run_xfer(t);
	uint64_t one = 1;
	/* An eventfd takes this write unless its counter would overflow. */
	CAP_BUG_ON(write(t->efd, &one, sizeof(one)) != sizeof(one));
	return NULL;
}

static int task_begin(struct ident *i, struct task *t, struct cap_err *err)
{
	t->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (t->efd < 0)
		return cap_err_set(err, errno, "eventfd: %s", strerror(errno));
	/* The thread inherits the loop's blocked signals (signalfd's). */
	int e = pthread_create(&t->thread, NULL, task_main, t);
	if (e)
		return cap_err_set(err, e, "cannot start a transfer thread: %s", strerror(e));
	i->task = t;
	return 0;
}

/* Wait for i's task to end (it was aborted, or is ending) and take it. */
struct task *ctl_task_join(struct ident *i)
{
	struct task *t = i->task;
	i->task = NULL;
	pthread_join(t->thread, NULL);
	return t;
}

static void xfer_out(const struct cap_xfer_result *res, struct cap_ctl_xfer_out *out)
{
	*out = (struct cap_ctl_xfer_out){
		.files = res->files, .dirs = res->dirs, .links = res->links, .bytes = res->bytes,
		.conflicts = (const char *const *)res->conflicts, .nconflicts = res->nconflicts,
		.refused = (const char *const *)res->refused, .nrefused = res->nrefused,
		.durable = res->durable, .sync_ms = res->sync_ms,
	};
}

/* Whether an error of a transfer is the sandbox's (its shim or agent
 * went away or broke the protocol) rather than a refusal of the path. */
static bool sandbox_errno(int e)
{
	return e == EPIPE || e == ECONNRESET || e == ECONNREFUSED || e == ECHILD || e == ETIMEDOUT ||
	       e == EPROTO || e == EBADMSG || e == ENOTCONN || e == ESHUTDOWN || e == ENOTSUP;
}

/* The active XFER call's task ended. */
static void xfer_done(struct cap_ctl *c, struct ident *i, struct task *t)
{
	struct cap_ctl_call *k = i->active;
	struct cap_ctl_xfer_out out;
	xfer_out(&t->res, &out);
	struct cap_ctl_result r = { .xfer = &out };
	char msg[1200];
	if (k->cancelled) {
		r.code = CAP_CTL_ECANCELLED;
		r.msg = "request cancelled";
	} else if (k->why[0] && t->r < 0) {
		r.code = CAP_CTL_ESANDBOX;
		r.msg = k->why;
	} else if (t->r == -EPERM && t->res.nrefused) {
		snprintf(msg, sizeof(msg), "%zu path%s refused (listed in data.refused); the rest was copied%s%s",
			 t->res.nrefused, t->res.nrefused == 1 ? " was" : "s were", t->err.msg[0] ? ": " : "",
			 t->err.msg);
		r.code = CAP_CTL_ETOOL;
		r.msg = msg;
		r.errnum = EPERM;
	} else if (t->r < 0) {
		r.code = sandbox_errno(-t->r) ? CAP_CTL_ESANDBOX : CAP_CTL_ETOOL;
		r.msg = t->err.msg[0] ? t->err.msg : strerror(-t->r);
		r.errnum = -t->r;
	}
	ctl_active_done(c, i, &r);
}

/* The private import's task ended: note it in the identity's record (so
 * that it runs once) and keep the outcome for the next call's answer. A
 * failure is reported and not noted: it runs again at the next start. */
static void import_done(struct cap_ctl *c, struct ident *i, struct task *t)
{
	i->import_checked = true;
	int r = t->r == -EPERM ? 0 : t->r;
	struct cap_err err = { 0 };
	if (r == 0) {
		struct ctl_idrec_import note = {
			.when = (int64_t)time(NULL), .files = t->res.files, .dirs = t->res.dirs,
			.bytes = t->res.bytes, .conflicts = t->res.nconflicts, .refused = t->res.nrefused,
			.absent = t->absent,
		};
		if (ctl_idrec_note_import(c->home, i->agent, i->peer, &note, &err) < 0)
			cap_log(CAP_LOG_WARN, "%s/%s: the private import is not noted (it runs again at the next start, keeping what it copied): %s",
				i->agent, i->peer, err.msg);
	}
	if (t->absent) {
		cap_log(CAP_LOG_INFO, "%s/%s: nothing to import privately (%s does not exist)", i->agent, i->peer,
			t->owned_host);
		return;
	}
	if (r == 0)
		cap_log(CAP_LOG_INFO, "%s/%s: privately imported %llu files (%llu bytes) from %s into %s's /work; %zu kept (conflicts), %zu refused",
			i->agent, i->peer, (unsigned long long)t->res.files, (unsigned long long)t->res.bytes,
			t->owned_host, i->name, t->res.nconflicts, t->res.nrefused);
	else
		cap_log(CAP_LOG_WARN, "%s/%s: the private import from %s failed (it runs again at the next start): %s",
			i->agent, i->peer, t->owned_host, t->err.msg);
	struct import_report *p = xcalloc(1, sizeof(*p));
	p->owned_from = xstrdup(t->owned_host);
	p->owned_msg = r < 0 ? xstrdup(t->err.msg[0] ? t->err.msg : strerror(-r)) : NULL;
	p->res = t->res;
	memset(&t->res, 0, sizeof(t->res));	/* the report owns the lists now */
	/* Refusals name host paths: relative to the import's directory
	 * ("from" names it), as conflicts name guest paths. */
	size_t base = strlen(p->owned_from);
	for (size_t k = 0; k < p->res.nrefused; k++) {
		char *x = p->res.refused[k];
		if (strncmp(x, p->owned_from, base) == 0 && x[base] == '/')
			memmove(x, x + base + 1, strlen(x + base + 1) + 1);
	}
	p->pub.from = p->owned_from;
	p->pub.r = r;
	p->pub.msg = p->owned_msg;
	xfer_out(&p->res, &p->pub.out);
	ctl_report_free(i->report);
	i->report = p;
}

/* The active DIFF or MERGE call's task ended. A merge that finished is
 * answered as done even when it was cancelled meanwhile: the directory
 * has changed. */
static void ws_done(struct cap_ctl *c, struct ident *i, struct task *t)
{
	struct cap_ctl_call *k = i->active;
	const struct cap_workspace_merge *m = &t->ws_out.merge;
	struct cap_ctl_merge_out mo = { .into = t->owned_host, .dry_run = t->ws_req.dry_run };
	struct cap_ctl_result r = { 0 };
	char msg[1400];
	if (t->r == 0 && !t->ws_req.merge) {
		r.changes = t->ws_out.changes;
		r.nchanges = t->ws_out.nchanges;
	} else if (t->r == 0) {
		cap_workspace_count(&m->plan, &mo.n);
		mo.conflicts = m->plan.conflicts;
		mo.nconflicts = m->plan.nconflicts;
		r.merge = &mo;
		if (mo.nconflicts) {
			snprintf(msg, sizeof(msg), "%zu conflict%s merging sandbox %s into %s (listed in data.conflicts); %s. Settle them with pick \"theirs\" (the sandbox's version) or \"ours\" (keep the host's), or make both sides agree",
				 mo.nconflicts, mo.nconflicts == 1 ? "" : "s", i->name, t->owned_host,
				 t->ws_req.dry_run ? "a merge would write nothing" : "nothing was written");
			r.code = CAP_CTL_ETOOL;
			r.msg = msg;
		}
	} else if (k->cancelled) {
		r.code = CAP_CTL_ECANCELLED;
		r.msg = "request cancelled";
	} else if (k->why[0]) {
		r.code = CAP_CTL_ESANDBOX;
		r.msg = k->why;
	} else {
		if (t->r == -EWOULDBLOCK) {
			snprintf(msg, sizeof(msg), "%s (a `capsule diff` or `capsule merge` of it on the host); retry when it is done",
				 t->err.msg);
			r.msg = msg;
		} else {
			r.msg = t->err.msg[0] ? t->err.msg : strerror(-t->r);
		}
		r.code = sandbox_errno(-t->r) ? CAP_CTL_ESANDBOX : CAP_CTL_ETOOL;
		r.errnum = -t->r;
	}
	ctl_active_done(c, i, &r);
}

/* The active SNAPSHOT or FORK call's task ended: each child's identity
 * is recorded with its sandbox and taken over (its shim serves already:
 * a WAIT job attaches it), then the call is answered. */
static void fork_done(struct cap_ctl *c, struct ident *i, struct task *t)
{
	struct cap_ctl_call *k = i->active;
	struct cap_ctl_result r = { .snapshot = t->snap, .sandbox = i->name };
	struct cap_ctl_child *kids = k->fork.owned_children;
	char msg[1200];
	for (unsigned n = 0; t->r == 0 && n < k->fork.count; n++) {
		snprintf(kids[n].sandbox, sizeof(kids[n].sandbox), "%s", t->children[n]);
		struct cap_err err = { 0 };
		if (ctl_idrec_write(c->home, kids[n].agent, kids[n].peer, kids[n].sandbox, &err) < 0) {
			t->r = -err.code;
			snprintf(t->err.msg, sizeof(t->err.msg), "%s", err.msg);
			break;
		}
		ctl_ident_get(c, kids[n].agent, kids[n].peer);
	}
	if (t->r == 0) {
		r.children = kids;
		r.nchildren = k->fork.count;
	} else if (k->cancelled) {
		r.code = CAP_CTL_ECANCELLED;
		r.msg = "request cancelled";
	} else {
		snprintf(msg, sizeof(msg), "%s", t->err.msg[0] ? t->err.msg : strerror(-t->r));
		r.code = sandbox_errno(-t->r) ? CAP_CTL_ESANDBOX : CAP_CTL_ETOOL;
		r.msg = msg;
		r.errnum = -t->r;
	}
	ctl_active_done(c, i, &r);
}

/* Whether an identity of agent called peer has or had a sandbox. */
static bool peer_taken(struct cap_ctl *c, const char *agent, const char *peer)
{
	char name[CAP_NAME_MAX + 1];
	for (struct ident *j = c->idents; j; j = j->next)
		if (!j->pool && strcmp(j->agent, agent) == 0 && strcmp(j->peer, peer) == 0)
			return true;
	return ctl_idrec_read(c->home, agent, peer, name) == 0;
}

void ctl_begin_fork(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	unsigned count = k->fork.count;
	k->fork.owned_children = xcalloc(count ? count : 1, sizeof(*k->fork.owned_children));
	/* The children's identities, chosen here (the loop's thread owns
	 * the identities): as asked, else "<peer>-<k>" for the first free k. */
	unsigned next = 1;
	for (unsigned n = 0; n < count; n++) {
		struct cap_ctl_child *ch = &k->fork.owned_children[n];
		snprintf(ch->agent, sizeof(ch->agent), "%s", i->agent);
		if (k->fork.owned_peers) {
			snprintf(ch->peer, sizeof(ch->peer), "%s", k->fork.owned_peers[n]);
			if (peer_taken(c, ch->agent, ch->peer)) {
				char msg[300];
				snprintf(msg, sizeof(msg), "identity %s/%s exists already: a fork's child is a new identity",
					 ch->agent, ch->peer);
				ctl_active_fail(c, i, CAP_CTL_ETOOL, msg, EEXIST);
				return;
			}
			continue;
		}
		for (;; next++) {
			char tail[16];
			int tl = snprintf(tail, sizeof(tail), "-%u", next);
			snprintf(ch->peer, sizeof(ch->peer), "%.*s%s", 64 - tl, i->peer, tail);
			if (!peer_taken(c, ch->agent, ch->peer))
				break;
		}
		next++;
	}
	struct task *t = task_new(c, i);
	t->fork = true;
	t->count = count;
	snprintf(t->snap, sizeof(t->snap), "%s", k->fork.snap);
	t->children = xcalloc(count ? count : 1, sizeof(*t->children));
	if (task_begin(i, t, &err) < 0) {
		ctl_task_free(t);
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
	}
}

void ctl_task_finished(struct cap_ctl *c, struct ident *i)
{
	uint64_t n;
	if (read(i->task->efd, &n, sizeof(n)) != sizeof(n))
		return;	/* not yet (a spurious wakeup) */
	struct task *t = ctl_task_join(i);
	c->kick = true;
	if (t->import)
		import_done(c, i, t);
	else if (t->ws)
		ws_done(c, i, t);
	else if (t->fork)
		fork_done(c, i, t);
	else
		xfer_done(c, i, t);
	ctl_task_free(t);
}

/* Start the active XFER call k in a worker. */
void ctl_begin_xfer(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->put = k->xfer.put;
	snprintf(t->root, sizeof(t->root), "%s", k->xfer.root);
	t->owned_path = xstrdup(k->xfer.owned_path);
	t->owned_host = k->xfer.owned_host ? xstrdup(k->xfer.owned_host) : NULL;
	t->data = k->xfer.owned_data;
	t->len = k->xfer.len;
	t->mode = k->xfer.mode;
	t->no_sync = k->xfer.no_sync;
	if (task_begin(i, t, &err) < 0) {
		ctl_task_free(t);
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
	}
}

/* Start the active DIFF or MERGE call k in a worker. */
void ctl_begin_ws(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->ws = true;
	t->owned_host = xstrdup(c->cfg.workspace);
	t->ws_req = (struct cap_ctl_ws){
		.name = t->name, .merge = k->kind == CAP_CTL_MERGE, .into = t->owned_host, .pick = k->merge.pick,
		.dry_run = k->merge.dry_run,
	};
	if (task_begin(i, t, &err) < 0) {
		ctl_task_free(t);
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
	}
}

/* Whether the private import is due before i's next tool call: it is
 * configured, and i's record does not note that it ran. */
bool ctl_import_due(struct cap_ctl *c, struct ident *i)
{
	if (!c->cfg.private_import || i->pool || i->import_checked)
		return false;
	struct ctl_idrec_import note;
	if (ctl_idrec_read_import(c->home, i->agent, i->peer, &note) == 0 && note.when > 0) {
		i->import_checked = true;
		return false;
	}
	return true;
}

/* Run the private import of i (its VM runs) in a worker; the queue waits
 * for it. A worker that cannot start is reported like a failed import. */
void ctl_begin_import(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->import = true;
	t->put = true;
	snprintf(t->root, sizeof(t->root), CAP_GUEST_WORK);
	t->owned_host = xasprintf("%s/%s/%s", c->cfg.private_import, i->agent, i->peer);
	if (task_begin(i, t, &err) == 0)
		return;
	t->r = err.code ? -err.code : -EIO;
	t->err = err;
	import_done(c, i, t);
	ctl_task_free(t);
}
