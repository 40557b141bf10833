/* The controller core against a fake sandbox backend and two fake front
 * ends: lifecycle transitions, queueing, capacity and eviction, cancel,
 * pause and resume answered by the shim, shutdown, the home lock and
 * recovery. Nothing happens in the fake until a test says so (a job
 * reports, a command ends, the shim answers, a VM dies), and time moves
 * only through the manual clock, so every transition is driven, never
 * waited for. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base64.h"
#include "controller-internal.h"
#include "controller.h"
#include "paths.h"
#include "serve.h"
#include "util.h"
#include "xfer.h"

/* --- the fake backend ------------------------------------------------------------ */

#define MAX_SB 16
#define MAX_JOBS 32
#define MAX_STREAMS 16
#define MAX_STARTED 64

struct fvm;

/* A sandbox on the fake's "disk": what state() answers. */
struct fsb {
	char name[CAP_NAME_MAX + 1];
	bool exists;
	enum cap_vm_state st;	/* STOPPED, RUNNING or PAUSED */
	bool serving, has_source;
	bool start_unserved;	/* a START job succeeds, but no shim serves it */
	struct fvm *vm;	/* attached, or NULL */
};

struct fjob {
	enum cap_ctl_job kind;
	char name[CAP_NAME_MAX + 1];
	bool create;
	struct cap_ctl_size size;	/* what a START asked for */
	int rfd;	/* the core's: job_end closes it */
	int wfd;	/* the fake's, until the job reports */
	bool reported, ended;
	struct cap_ctl_job_out out;
};

/* An exec or file stream; dispatch ends it once the test scheduled it. */
struct fstream {
	uint32_t id;
	bool file;
	uint32_t op;	/* file */
	char what[64];	/* exec: argv[0]; file: path */
	const struct cap_exec_events *ev;
	void *ud;
	bool open;	/* done() not delivered yet */
	bool due;	/* deliver what follows at the next dispatch */
	char out[128], err[128];
	struct cap_exit exit;
	int signalled;	/* the last signal sent to it, 0 for none */
	char in[64];	/* stdin received */
	bool in_closed;
	uint32_t flags;	/* exec: the request's flags; file: its limit */
};

struct fvm {
	struct fake *f;
	struct fsb *sb;
	int efd;	/* readable: dispatch has something to deliver */
	struct fstream s[MAX_STREAMS];
	unsigned ns;
	uint32_t next_id;
	bool op_pending, op_pause;	/* asked, not answered */
	bool op_answered;	/* the answer is there for vm_op_done */
	int op_result;
	bool stopping, dead, lost;
};

/* Transfers: the backend's xfer runs in the controller's worker thread,
 * so what it shares with the test is behind a lock. */
struct fxfer {
	pthread_mutex_t lock;
	unsigned calls;
	bool hold;	/* block until the transfer is cancelled */
	bool holding;	/* blocked now */
	bool put;
	char root[16], path[64], dest_dir[64], dest_name[64], host[256];
	unsigned flags;
	char content[64];	/* put: what the host file held */
	unsigned mode;	/* and its permission bits */
	bool refuse_fifo;	/* list host/fifo as refused */
	/* diff and merge: what the op was asked, and the trees it gives:
	 * "path=C" files whose content hash starts with byte C. */
	unsigned ws_calls;
	bool ws_merge, ws_dry;
	int ws_pick;
	char ws_name[CAP_NAME_MAX + 1], ws_into[256];
	const char *ws_base[4], *ws_ours[4], *ws_theirs[4];
};

struct fake {
	struct fxfer x;
	struct fsb sb[MAX_SB];
	unsigned nsb;
	struct fjob jobs[MAX_JOBS];
	unsigned njobs;
	/* argv[0] (or path) of every call started, in order */
	char started[MAX_STARTED][64];
	unsigned nstarted;
	unsigned attaches, reaps, removes, kills, stops, pauses, resumes, signals;
	char reaped[CAP_NAME_MAX + 1], removed[CAP_NAME_MAX + 1];
	char stopped[MAX_SB][CAP_NAME_MAX + 1];	/* in the order stop() came */
	int exec_fails;	/* exec answers -exec_fails when set */
	int remove_busy;	/* remove answers -EBUSY this many times */
	bool die_on_stop;	/* a stopped VM is dead at once */
	struct cap_ctl_usage usage;	/* what usage() says of every sandbox */
	unsigned usages;	/* usage() calls */
	char bad[256];	/* a broken contract the fake saw */
};

static void bad(struct fake *f, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void bad(struct fake *f, const char *fmt, ...)
{
	va_list ap;
	if (f->bad[0])
		return;
	va_start(ap, fmt);
	vsnprintf(f->bad, sizeof(f->bad), fmt, ap);
	va_end(ap);
}

static struct fsb *sb_find(struct fake *f, const char *name)
{
	for (unsigned k = 0; k < f->nsb; k++)
		if (strcmp(f->sb[k].name, name) == 0)
			return &f->sb[k];
	return NULL;
}

static struct fsb *sb_get(struct fake *f, const char *name)
{
	struct fsb *s = sb_find(f, name);
	if (s)
		return s;
	if (f->nsb == MAX_SB) {
		bad(f, "too many fake sandboxes");
		return &f->sb[0];
	}
	s = &f->sb[f->nsb++];
	snprintf(s->name, sizeof(s->name), "%s", name);
	s->st = CAP_VM_STOPPED;
	return s;
}

static void vm_kick(struct fvm *v)
{
	uint64_t one = 1;
	if (write(v->efd, &one, sizeof(one)) != sizeof(one))
		bad(v->f, "eventfd write: %s", strerror(errno));
}

static void vm_die(struct fvm *v)
{
	v->dead = true;
	v->sb->st = CAP_VM_STOPPED;
	v->sb->serving = false;
	vm_kick(v);
}

/* The shim crashes: its connection breaks. */
static void vm_lose(struct fvm *v)
{
	v->lost = true;
	v->sb->st = CAP_VM_STOPPED;
	v->sb->serving = false;
	vm_kick(v);
}

static int f_job_begin(void *ud, const struct cap_ctl_job_req *j, int *fd, pid_t *pid,
		       struct cap_err *err)
{
	struct fake *f = ud;
	int p[2];
	if (f->njobs == MAX_JOBS)
		return cap_err_set(err, EAGAIN, "the fake ran out of jobs");
	if (pipe2(p, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	struct fjob *x = &f->jobs[f->njobs++];
	memset(x, 0, sizeof(*x));
	x->kind = j->kind;
	snprintf(x->name, sizeof(x->name), "%s", j->name);
	x->create = j->create;
	x->size = j->size;
	x->rfd = p[0];
	x->wfd = p[1];
	*fd = p[0];
	*pid = 0;	/* no child: nothing to reap */
	return 0;
}

static void f_job_end(void *ud, int fd, pid_t pid, struct cap_ctl_job_out *out)
{
	struct fake *f = ud;
	struct fjob *x = NULL;
	for (unsigned k = 0; k < f->njobs; k++)
		if (f->jobs[k].rfd == fd && !f->jobs[k].ended)
			x = &f->jobs[k];
	memset(out, 0, sizeof(*out));
	if (!x || !x->reported || pid != 0) {
		bad(f, "job_end(fd %d, pid %d) of no reported job", fd, (int)pid);
		out->r = -EIO;
		close(fd);
		return;
	}
	*out = x->out;
	x->ended = true;
	close(fd);
}

static int f_state(void *ud, const char *name, enum cap_vm_state *st, bool *serving,
		   bool *has_source)
{
	struct fsb *s = sb_find(ud, name);
	if (!s || !s->exists)
		return -ENOENT;
	*st = s->st;
	*serving = s->serving;
	*has_source = s->has_source;
	return 0;
}

static int f_attach(void *ud, const char *name, void **vm, bool *paused, struct cap_err *err)
{
	struct fake *f = ud;
	struct fsb *s = sb_find(f, name);
	f->attaches++;
	if (!s || !s->exists || !s->serving || s->st == CAP_VM_STOPPED)
		return cap_err_set(err, ECHILD, "sandbox %s has no serving shim (fake)", name);
	if (s->vm) {
		bad(f, "%s attached twice", name);
		return cap_err_set(err, EBUSY, "attached twice");
	}
	struct fvm *v = xcalloc(1, sizeof(*v));
	v->f = f;
	v->sb = s;
	v->next_id = 1;
	v->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	if (v->efd < 0) {
		free(v);
		return cap_err_set(err, errno, "eventfd: %s", strerror(errno));
	}
	s->vm = v;
	*vm = v;
	*paused = s->st == CAP_VM_PAUSED;
	return 0;
}

static void f_reap(void *ud, const char *name)
{
	struct fake *f = ud;
	f->reaps++;
	snprintf(f->reaped, sizeof(f->reaped), "%s", name);
}

static int f_remove(void *ud, const char *name, struct cap_err *err)
{
	struct fake *f = ud;
	struct fsb *s = sb_find(f, name);
	if (f->remove_busy > 0) {
		f->remove_busy--;
		return cap_err_set(err, EBUSY, "the shim of %s is still exiting (fake)", name);
	}
	f->removes++;
	snprintf(f->removed, sizeof(f->removed), "%s", name);
	if (!s || !s->exists)
		return cap_err_set(err, ENOENT, "no sandbox %s", name);
	if (s->vm || s->st != CAP_VM_STOPPED)
		bad(f, "remove of %s, which is not stopped", name);
	s->exists = false;
	return 0;
}

static void f_kill(void *ud, const char *name)
{
	struct fake *f = ud;
	struct fsb *s = sb_find(f, name);
	f->kills++;
	if (s && s->vm)
		vm_die(s->vm);
	if (s) {	/* the shim is gone, and its QEMU with it */
		s->st = CAP_VM_STOPPED;
		s->serving = false;
	}
}

static struct fstream *stream_new(struct fvm *v, bool file, const char *what,
				  const struct cap_exec_events *ev, void *ud, uint32_t *id)
{
	struct fake *f = v->f;
	if (v->ns == MAX_STREAMS || f->nstarted == MAX_STARTED) {
		bad(f, "too many streams");
		return NULL;
	}
	if (v->stopping || v->dead || v->op_pending || v->sb->st != CAP_VM_RUNNING)
		bad(f, "a call started on %s while it is %s%s", v->sb->name,
		    v->stopping ? "stopping" : cap_vm_state_name(v->sb->st),
		    v->op_pending ? " with a pause/resume unanswered" : "");
	struct fstream *s = &v->s[v->ns++];
	memset(s, 0, sizeof(*s));
	s->id = v->next_id++;
	s->file = file;
	snprintf(s->what, sizeof(s->what), "%s", what);
	s->ev = ev;
	s->ud = ud;
	s->open = true;
	snprintf(f->started[f->nstarted++], sizeof(f->started[0]), "%s", what);
	*id = s->id;
	return s;
}

static int f_exec(void *vm, const struct cap_exec_req *req, const struct cap_exec_events *ev,
		  void *ud, uint32_t *id, struct cap_err *err)
{
	struct fvm *v = vm;
	if (v->f->exec_fails)
		return cap_err_set(err, v->f->exec_fails, "the agent refused the command (fake)");
	struct fstream *s = stream_new(v, false, req->argc ? req->argv[0] : "", ev, ud, id);
	if (!s)
		return cap_err_set(err, EMFILE, "too many streams");
	s->flags = req->flags;
	return 0;
}

static int f_file(void *vm, const struct cap_file_req *req, uint32_t cap,
		  const struct cap_exec_events *ev, void *ud, uint32_t *id, struct cap_err *err)
{
	struct fvm *v = vm;
	(void)cap;
	struct fstream *s = stream_new(v, true, req->path, ev, ud, id);
	if (!s)
		return cap_err_set(err, EMFILE, "too many streams");
	s->op = req->op;
	s->flags = req->limit;
	return 0;
}

static struct fstream *stream_by_id(struct fvm *v, uint32_t id)
{
	for (unsigned k = 0; k < v->ns; k++)
		if (v->s[k].id == id && v->s[k].open)
			return &v->s[k];
	return NULL;
}

static int f_input(void *vm, uint32_t id, const void *p, size_t n)
{
	struct fvm *v = vm;
	struct fstream *s = stream_by_id(v, id);
	if (!s)
		return -ENOENT;
	if (n == 0)
		s->in_closed = true;
	else
		snprintf(s->in + strlen(s->in), sizeof(s->in) - strlen(s->in), "%.*s", (int)n,
			 (const char *)p);
	return 0;
}

static int f_signal(void *vm, uint32_t id, int sig)
{
	struct fvm *v = vm;
	struct fstream *s = stream_by_id(v, id);
	v->f->signals++;
	if (!s)
		return -ENOENT;
	s->signalled = sig;
	return 0;
}

static void f_vm_op(void *vm, bool pause)
{
	struct fvm *v = vm;
	if (v->op_pending)
		bad(v->f, "a second pause/resume of %s before the first was answered", v->sb->name);
	v->op_pending = true;
	v->op_pause = pause;
	if (pause)
		v->f->pauses++;
	else
		v->f->resumes++;
}

static bool f_vm_op_done(void *vm, int *result)
{
	struct fvm *v = vm;
	if (!v->op_answered)
		return false;
	*result = v->op_result;
	v->op_answered = false;
	v->op_pending = false;
	return true;
}

static void f_stop(void *vm)
{
	struct fvm *v = vm;
	struct fake *f = v->f;
	if (v->stopping)
		bad(f, "%s stopped twice", v->sb->name);
	v->stopping = true;
	if (f->stops < MAX_SB)
		snprintf(f->stopped[f->stops], sizeof(f->stopped[0]), "%s", v->sb->name);
	f->stops++;
	if (f->die_on_stop)
		vm_die(v);
}

static bool f_dead(void *vm)
{
	return ((struct fvm *)vm)->dead;
}

static void f_pollfds(void *vm, struct pollfd *pfd)
{
	struct fvm *v = vm;
	pfd[0] = (struct pollfd){ .fd = v->efd, .events = POLLIN };
	for (int k = 1; k < CAP_CTL_VM_NPOLL; k++)
		pfd[k] = (struct pollfd){ .fd = -1 };
}

/* Deliver what the test scheduled: output, then done(). */
static int f_dispatch(void *vm, const struct pollfd *pfd, struct cap_err *err)
{
	struct fvm *v = vm;
	uint64_t n;
	(void)pfd;
	if (read(v->efd, &n, sizeof(n)) < 0 && errno != EAGAIN)
		bad(v->f, "eventfd read: %s", strerror(errno));
	if (v->lost)
		return cap_err_set(err, EPIPE, "the shim of %s hung up (fake)", v->sb->name);
	for (unsigned k = 0; k < v->ns; k++) {
		struct fstream *s = &v->s[k];
		if (!s->open || !s->due)
			continue;
		s->open = s->due = false;
		if (s->out[0])
			s->ev->output(s->ud, s->id, 1, (const uint8_t *)s->out, strlen(s->out));
		if (s->err[0])
			s->ev->output(s->ud, s->id, 2, (const uint8_t *)s->err, strlen(s->err));
		s->ev->done(s->ud, s->id, &s->exit, 0, NULL);
	}
	return 0;
}

static void f_vm_free(void *vm)
{
	struct fvm *v = vm;
	if (v->sb->vm == v)
		v->sb->vm = NULL;
	close(v->efd);
	free(v);
}

/* In the worker thread: touches only f->x, under its lock. */
static int f_xfer(void *ud, const struct cap_ctl_xfer *x, struct cap_ctl_xfer_watch *w,
		  struct cap_xfer_result *res, struct cap_err *err)
{
	struct fxfer *fx = &((struct fake *)ud)->x;
	pthread_mutex_lock(&fx->lock);
	fx->calls++;
	fx->put = x->put;
	snprintf(fx->root, sizeof(fx->root), "%s", x->root);
	snprintf(fx->path, sizeof(fx->path), "%s", x->path ? x->path : "");
	snprintf(fx->dest_dir, sizeof(fx->dest_dir), "%s", x->dest_dir ? x->dest_dir : "");
	snprintf(fx->dest_name, sizeof(fx->dest_name), "%s", x->dest_name ? x->dest_name : "");
	snprintf(fx->host, sizeof(fx->host), "%s", x->host);
	fx->flags = x->flags;
	struct stat st;
	if (x->put && stat(x->host, &st) == 0 && S_ISREG(st.st_mode)) {
		fx->mode = st.st_mode & 07777;
		int fd = open(x->host, O_RDONLY | O_CLOEXEC);
		ssize_t n = fd >= 0 ? read(fd, fx->content, sizeof(fx->content) - 1) : -1;
		fx->content[n > 0 ? n : 0] = '\0';
		if (fd >= 0)
			close(fd);
	}
	bool hold = fx->hold, fifo = fx->refuse_fifo;
	pthread_mutex_unlock(&fx->lock);
	if (hold) {
		/* The connection a cancel shuts down. */
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			return cap_err_set(err, errno, "socketpair: %s", strerror(errno));
		int r = cap_ctl_xfer_watch_fd(w, sv[0]);
		if (r == 0) {
			pthread_mutex_lock(&fx->lock);
			fx->holding = true;
			pthread_mutex_unlock(&fx->lock);
			struct pollfd p = { .fd = sv[0], .events = POLLIN };
			poll(&p, 1, 20000);
			cap_ctl_xfer_unwatch(w);
			pthread_mutex_lock(&fx->lock);
			fx->holding = false;
			pthread_mutex_unlock(&fx->lock);
		}
		close(sv[0]);
		close(sv[1]);
		return cap_err_set(err, EPIPE, "the shim connection was shut down (fake)");
	}
	res->files = 1;
	res->bytes = 5;
	res->durable = !(x->flags & CAP_XFER_NO_SYNC);	/* as the agent answers */
	res->sync_ms = res->durable ? 3 : 0;
	if (fifo) {
		res->refused = xcalloc(1, sizeof(char *));
		res->refused[0] = xasprintf("%s/fifo: a FIFO, not copied", x->host);
		res->nrefused = 1;
	}
	return 0;
}

/* A tree of files from "path=C" specs (sorted, NULL-ended). */
static void fake_tree(struct cap_tree *t, const char *const *spec)
{
	size_t n = 0;
	while (n < 4 && spec[n])
		n++;
	cap_tree_init(t);
	t->v = xcalloc(n ? n : 1, sizeof(*t->v));
	for (size_t i = 0; i < n; i++) {
		const char *eq = strchr(spec[i], '=');
		t->v[i].path = xstrndup(spec[i], (size_t)(eq - spec[i]));
		t->v[i].type = CAP_TREE_FILE;
		t->v[i].mode = 0644;
		t->v[i].size = 1;
		t->v[i].hash[0] = (uint8_t)eq[1];
	}
	t->n = n;
}

/* In the worker thread: a diff or merge of the fake trees (touches only
 * f->x, under its lock, like f_xfer). */
static int f_workspace(void *ud, const struct cap_ctl_ws *ws, struct cap_ctl_xfer_watch *w,
		       struct cap_ctl_ws_out *out, struct cap_err *err)
{
	struct fxfer *fx = &((struct fake *)ud)->x;
	pthread_mutex_lock(&fx->lock);
	fx->ws_calls++;
	fx->ws_merge = ws->merge;
	fx->ws_dry = ws->dry_run;
	fx->ws_pick = (int)ws->pick;
	snprintf(fx->ws_name, sizeof(fx->ws_name), "%s", ws->name);
	snprintf(fx->ws_into, sizeof(fx->ws_into), "%s", ws->into ? ws->into : "");
	bool hold = fx->hold;
	pthread_mutex_unlock(&fx->lock);
	if (hold) {
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
			return cap_err_set(err, errno, "socketpair: %s", strerror(errno));
		if (cap_ctl_xfer_watch_fd(w, sv[0]) == 0) {
			pthread_mutex_lock(&fx->lock);
			fx->holding = true;
			pthread_mutex_unlock(&fx->lock);
			struct pollfd p = { .fd = sv[0], .events = POLLIN };
			poll(&p, 1, 20000);
			cap_ctl_xfer_unwatch(w);
			pthread_mutex_lock(&fx->lock);
			fx->holding = false;
			pthread_mutex_unlock(&fx->lock);
		}
		close(sv[0]);
		close(sv[1]);
		return cap_err_set(err, EPIPE, "the shim connection was shut down (fake)");
	}
	if (!ws->merge) {
		fake_tree(&out->base, fx->ws_base);
		fake_tree(&out->now, fx->ws_theirs);
		return cap_tree_diff(&out->base, &out->now, &out->changes, &out->nchanges);
	}
	struct cap_workspace_merge *m = &out->merge;
	snprintf(m->dir, sizeof(m->dir), "%s", ws->into);
	fake_tree(&m->base, fx->ws_base);
	fake_tree(&m->ours, fx->ws_ours);
	fake_tree(&m->theirs, fx->ws_theirs);
	int r = cap_merge_plan(&m->base, &m->ours, &m->theirs, ws->pick, &m->plan, err);
	m->planned = r == 0;
	return r;
}

static bool xfer_holding(struct fake *f)
{
	pthread_mutex_lock(&f->x.lock);
	bool h = f->x.holding;
	pthread_mutex_unlock(&f->x.lock);
	return h;
}

static unsigned xfer_calls(struct fake *f)
{
	pthread_mutex_lock(&f->x.lock);
	unsigned n = f->x.calls;
	pthread_mutex_unlock(&f->x.lock);
	return n;
}

static int f_usage(void *ud, const char *name, struct cap_ctl_usage *out)
{
	struct fake *f = ud;
	(void)name;
	f->usages++;
	*out = f->usage;
	return 0;
}

static const struct cap_ctl_backend fake_backend = {
	.job_begin = f_job_begin,
	.job_end = f_job_end,
	.state = f_state,
	.attach = f_attach,
	.reap = f_reap,
	.remove = f_remove,
	.kill = f_kill,
	.exec = f_exec,
	.file = f_file,
	.input = f_input,
	.signal = f_signal,
	.vm_op = f_vm_op,
	.vm_op_done = f_vm_op_done,
	.stop = f_stop,
	.dead = f_dead,
	.pollfds = f_pollfds,
	.dispatch = f_dispatch,
	.vm_free = f_vm_free,
	.xfer = f_xfer,
	.workspace = f_workspace,
	.usage = f_usage,
};

/* --- the fake front ends ------------------------------------------------------------ */

#define MAX_GOT 64

/* One done() as the front end saw it. */
struct got {
	intptr_t tag;
	enum cap_ctl_code code;
	enum cap_ctl_kind kind;
	int errnum;
	char msg[256];
	char state[16];
	char sandbox[64];
	struct cap_exit exit;
	char out[128], err[128];
	char content[128];
	bool is_dir;
	size_t nentries;
	char entries[128];	/* "f:name:size d:name " */
	uint64_t written;
	bool xfer;	/* XFER: counts given */
	uint64_t xfiles, xbytes;
	bool import;	/* a private import came with it */
	int import_r;
	uint64_t import_files;
	char import_refused[128];
	char changes[128];	/* DIFF: "kind:path " each */
	bool merge;	/* MERGE: counts given */
	bool dry_run;
	size_t mwritten, nconflicts;
	char into[64], conflict[64];	/* the first conflict: "path: why" */
	unsigned prepared;	/* a tool call's: the phases its preparation built */
	bool prep;	/* a preparation's outcome came with it */
	int prep_failed;	/* its failed phase (on failure) */
	unsigned prep_built;
};

struct ffe {
	int id;
	struct cap_ctl_fe *h;
	struct got got[MAX_GOT];
	unsigned ngot;
	unsigned shutdowns, flushes, readies;
	/* Its "socket": a byte on it makes ready() submit the inbox call,
	 * as a real front end submits what a client sent. */
	int pipe[2];
	struct {
		char agent[16], what[16];
		intptr_t tag;
	} inbox;
	char bad[256];
	/* progress() seen: how many, for which tag last, and whether done
	 * ever went down or phases out of order for a tag. */
	unsigned nprogress;
	intptr_t progress_tag;
	int last_done, last_phase;
	unsigned ready;
};

static struct cap_ctl_call *submit_exec(struct cap_ctl *c, struct ffe *e, const char *agent,
					const char *what, intptr_t tag)
{
	char *argv[] = { (char *)what, NULL };
	struct cap_exec_req x = { .argv = argv, .argc = 1 };
	struct cap_ctl_req r = { .kind = CAP_CTL_EXEC, .exec = &x };
	return cap_ctl_submit(c, e->h, agent, "p", &r, (void *)tag);
}

static void fe_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct ffe *e = fe;
	(void)c;
	cap_ctl_poll_add(p, e->pipe[0], POLLIN, &e->inbox);
}

static void fe_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct ffe *e = fe;
	char b;
	e->readies++;
	if (tag != &e->inbox || !(revents & POLLIN) || read(e->pipe[0], &b, 1) != 1) {
		snprintf(e->bad, sizeof(e->bad), "ready() with tag %p, revents %#x", tag, revents);
		return;
	}
	submit_exec(c, e, e->inbox.agent, e->inbox.what, e->inbox.tag);
}

static void fe_flush(void *fe, struct cap_ctl *c)
{
	(void)c;
	((struct ffe *)fe)->flushes++;
}

static void copy_bytes(char *dst, size_t cap, const void *p, size_t n)
{
	n = n < cap - 1 ? n : cap - 1;
	if (n)
		memcpy(dst, p, n);
	dst[n] = '\0';
}

static void fe_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	struct ffe *e = fe;
	(void)c;
	if (e->ngot == MAX_GOT) {
		snprintf(e->bad, sizeof(e->bad), "too many results");
		return;
	}
	struct got *g = &e->got[e->ngot++];
	memset(g, 0, sizeof(*g));
	g->tag = (intptr_t)tag;
	g->code = r->code;
	g->kind = r->kind;
	g->errnum = r->errnum;
	g->exit = r->exit;
	g->is_dir = r->is_dir;
	g->nentries = r->nentries;
	g->written = r->written;
	snprintf(g->msg, sizeof(g->msg), "%s", r->msg ? r->msg : "");
	snprintf(g->state, sizeof(g->state), "%s", r->state ? r->state : "");
	snprintf(g->sandbox, sizeof(g->sandbox), "%s", r->sandbox ? r->sandbox : "");
	copy_bytes(g->out, sizeof(g->out), r->out, r->out_len);
	copy_bytes(g->err, sizeof(g->err), r->err, r->err_len);
	copy_bytes(g->content, sizeof(g->content), r->content, r->content_len);
	if (r->xfer) {
		g->xfer = true;
		g->xfiles = r->xfer->files;
		g->xbytes = r->xfer->bytes;
	}
	if (r->import) {
		g->import = true;
		g->import_r = r->import->r;
		g->import_files = r->import->out.files;
		if (r->import->out.nrefused)
			snprintf(g->import_refused, sizeof(g->import_refused), "%s", r->import->out.refused[0]);
	}
	for (size_t k = 0; k < r->nchanges; k++) {
		size_t used = strlen(g->changes);
		const struct cap_tree_change *ch = &r->changes[k];
		snprintf(g->changes + used, sizeof(g->changes) - used, "%s:%s ", cap_tree_change_name(ch->kind),
			 (ch->to ? ch->to : ch->from)->path);
	}
	if (r->merge) {
		g->merge = true;
		g->dry_run = r->merge->dry_run;
		g->mwritten = r->merge->n.written;
		g->nconflicts = r->merge->nconflicts;
		snprintf(g->into, sizeof(g->into), "%s", r->merge->into);
		if (r->merge->nconflicts)
			snprintf(g->conflict, sizeof(g->conflict), "%s: %s", r->merge->conflicts[0].path,
				 r->merge->conflicts[0].why);
	}
	g->prepared = r->prepared;
	if (r->prep) {
		g->prep = true;
		g->prep_failed = (int)r->prep->failed;
		g->prep_built = r->prep->built;
	}
	for (size_t k = 0; k < r->nentries; k++) {
		size_t used = strlen(g->entries);
		snprintf(g->entries + used, sizeof(g->entries) - used, "%c:%s:%llu ", r->entries[k].type,
			 r->entries[k].name, (unsigned long long)r->entries[k].size);
	}
}

static void fe_shutdown(void *fe, struct cap_ctl *c)
{
	(void)c;
	((struct ffe *)fe)->shutdowns++;
}

static void fe_progress(void *fe, struct cap_ctl *c, void *tag, const struct cap_prep_event *ev)
{
	struct ffe *e = fe;
	(void)c;
	if (!e->nprogress || e->progress_tag != (intptr_t)tag) {
		e->last_done = 0;
		e->last_phase = 0;
		e->ready = 0;
	}
	e->nprogress++;
	e->progress_tag = (intptr_t)tag;
	if ((int)ev->done < e->last_done || (int)ev->phase < e->last_phase)
		snprintf(e->bad, sizeof(e->bad), "progress went back: phase %d done %u", ev->phase, ev->done);
	e->last_done = (int)ev->done;
	e->last_phase = (int)ev->phase;
	if (ev->status == CAP_PREP_READY)
		e->ready++;
}

static const struct cap_ctl_frontend_ops fe_ops = {
	.name = "test",
	.pollfds = fe_pollfds,
	.ready = fe_ready,
	.flush = fe_flush,
	.done = fe_done,
	.shutdown = fe_shutdown,
	.progress = fe_progress,
};

/* The one result with tag (NULL when none); a second one fails the test
 * at the caller's line. */
static const struct got *got_at(const struct ffe *e, intptr_t tag, const char *file, int line)
{
	const struct got *g = NULL;
	for (unsigned k = 0; k < e->ngot; k++) {
		if (e->got[k].tag != tag)
			continue;
		if (g) {
			print_error("front end %d: call %ld answered twice\n", e->id, (long)tag);
			_fail(file, line);
		}
		g = &e->got[k];
	}
	return g;
}

/* The result with tag, which must be there. */
static const struct got *must_get_at(const struct ffe *e, intptr_t tag, const char *file,
				     int line)
{
	const struct got *g = got_at(e, tag, file, line);
	if (!g) {
		print_error("front end %d: call %ld has no result\n", e->id, (long)tag);
		_fail(file, line);
	}
	return g;
}

#define got(e, tag) got_at(e, tag, __FILE__, __LINE__)
#define must_get(e, tag) must_get_at(e, tag, __FILE__, __LINE__)

/* --- the fixture ------------------------------------------------------------------- */

struct t {
	char home[64];
	struct fake f;
	struct ffe fe1, fe2;
	struct cap_controller_cfg cfg;
	struct cap_ctl *c;
	struct cap_rpc_server *srv;	/* a JSON-RPC front end, when a test makes one */
};

static char logbuf[16384];

static void log_sink(void *ud, enum cap_log_level level, const char *line)
{
	size_t used = strlen(logbuf);
	(void)ud, (void)level;
	if (getenv("CAP_TEST_LOG"))
		fprintf(stderr, "# log: %s\n", line);
	if (used + strlen(line) + 2 < sizeof(logbuf))
		snprintf(logbuf + used, sizeof(logbuf) - used, "%s\n", line);
}

static int setup(void **state)
{
	struct t *t = xcalloc(1, sizeof(*t));
	snprintf(t->home, sizeof(t->home), "/tmp/capsule-test-controller.XXXXXX");
	if (!mkdtemp(t->home)) {
		free(t);
		return -1;
	}
	setenv("CAPSULE_HOME", t->home, 1);
	logbuf[0] = '\0';
	cap_log_set(log_sink, NULL);
	cap_controller_cfg_init(&t->cfg);
	t->cfg.manual_clock = true;
	t->cfg.lc.idle_pause_ms = 1000;
	t->cfg.lc.idle_stop_ms = 60000;
	t->cfg.lc.capacity = 4;
	t->cfg.backend = &fake_backend;
	t->cfg.backend_ud = &t->f;
	t->fe1.id = 1;
	t->fe2.id = 2;
	pthread_mutex_init(&t->f.x.lock, NULL);
	if (pipe2(t->fe1.pipe, O_CLOEXEC) < 0 || pipe2(t->fe2.pipe, O_CLOEXEC) < 0)
		return -1;
	*state = t;
	return 0;
}

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
	(void)sb, (void)flag, (void)ftw;
	remove(path);
	return 0;
}

static int teardown(void **state)
{
	struct t *t = *state;
	cap_ctl_free(t->c);	/* frees every attached fake VM */
	cap_rpc_server_free(t->srv);	/* after its controller, as serve does */
	for (unsigned k = 0; k < t->f.njobs; k++)
		if (!t->f.jobs[k].reported)
			close(t->f.jobs[k].wfd);
	for (unsigned k = 0; k < t->f.nsb; k++)
		if (t->f.sb[k].vm)
			f_vm_free(t->f.sb[k].vm);
	close(t->fe1.pipe[0]);
	close(t->fe1.pipe[1]);
	close(t->fe2.pipe[0]);
	close(t->fe2.pipe[1]);
	nftw(t->home, rm_one, 16, FTW_DEPTH | FTW_PHYS);
	pthread_mutex_destroy(&t->f.x.lock);
	cap_log_set(NULL, NULL);
	unsetenv("CAPSULE_HOME");
	free(t);
	return 0;
}

/* Make the controller of t->cfg, with both front ends, and recover. */
static void open_ctl(struct t *t)
{
	struct cap_err err = { 0 };
	int r = cap_ctl_new(&t->cfg, &t->c, &err);
	if (r < 0)
		fail_msg("cap_ctl_new: %s", err.msg);
	t->fe1.h = cap_ctl_add_frontend(t->c, &fe_ops, &t->fe1);
	t->fe2.h = cap_ctl_add_frontend(t->c, &fe_ops, &t->fe2);
	cap_ctl_start(t->c);
}

/* One round of the loop, waiting at most wait_ms; 1 serving, 0 done. */
static int step_wait(struct t *t, int wait_ms)
{
	struct cap_err err = { 0 };
	int r = cap_ctl_step(t->c, wait_ms, &err);
	if (r < 0)
		fail_msg("cap_ctl_step: %s", err.msg);
	if (t->f.bad[0])
		fail_msg("fake backend: %s", t->f.bad);
	if (t->fe1.bad[0] || t->fe2.bad[0])
		fail_msg("fake front end: %s%s", t->fe1.bad, t->fe2.bad);
	return r;
}

static int step(struct t *t)
{
	return step_wait(t, 0);
}

/* Run rounds until cond holds, at most 100 (each waits at most wait_ms,
 * for the loop's own real-time timers). */
#define UNTIL_WAIT(t, wait_ms, cond)                                                            \
	do {                                                                                    \
		int n_ = 0;                                                                     \
		while (!(cond)) {                                                               \
			if (++n_ > 100)                                                         \
				fail_msg("%s:%d: never came true: %s", __FILE__, __LINE__, #cond); \
			step_wait(t, wait_ms);                                                  \
		}                                                                               \
	} while (0)
#define UNTIL(t, cond) UNTIL_WAIT(t, 0, cond)

/* A few rounds with nothing for the test to wait for: what must not
 * happen yet has its chance to happen. */
static void settle(struct t *t)
{
	for (int k = 0; k < 5; k++)
		step(t);
}

static void advance(struct t *t, int64_t ms)
{
	int64_t now;
	assert_int_equal(cap_ctl_advance(t->c, ms, &now), 0);
}

static struct cap_ctl_status status(struct t *t, const char *agent)
{
	struct cap_ctl_status s;
	cap_ctl_status(t->c, agent, "p", &s);
	return s;
}

static const char *state_of(struct t *t, const char *agent)
{
	return cap_vm_state_name(status(t, agent).state);
}

struct nm {
	char s[64];
};

/* The sandbox of an identity, which must have one. */
static struct nm sbname(struct t *t, const char *agent)
{
	struct nm n;
	struct cap_ctl_status s = status(t, agent);
	if (!s.sandbox[0])
		fail_msg("%s/p has no sandbox (state %s)", agent, cap_vm_state_name(s.state));
	snprintf(n.s, sizeof(n.s), "%s", s.sandbox);
	return n;
}

static struct fsb *sb_of(struct t *t, const char *agent)
{
	struct fsb *s = sb_find(&t->f, sbname(t, agent).s);
	if (!s)
		fail_msg("the fake has no sandbox for %s", agent);
	return s;
}

static struct fvm *vm_of(struct t *t, const char *agent)
{
	struct fvm *v = sb_of(t, agent)->vm;
	if (!v)
		fail_msg("%s/p has no attached VM", agent);
	return v;
}

/* A sandbox that exists already, mapped to agent/p by its record. */
static struct fsb *premade(struct t *t, const char *agent, const char *name,
			   enum cap_vm_state st, bool serving, bool has_source)
{
	struct cap_err err = { 0 };
	if (ctl_idrec_write(t->home, agent, "p", name, &err) < 0)
		fail_msg("ctl_idrec_write: %s", err.msg);
	struct fsb *s = sb_get(&t->f, name);
	s->exists = true;
	s->st = st;
	s->serving = serving;
	s->has_source = has_source;
	return s;
}

/* The job under way for agent's sandbox. */
static struct fjob *job_of(struct t *t, const char *agent)
{
	struct nm n = sbname(t, agent);
	for (unsigned k = t->f.njobs; k-- > 0;)
		if (strcmp(t->f.jobs[k].name, n.s) == 0 && !t->f.jobs[k].reported)
			return &t->f.jobs[k];
	fail_msg("no job under way for %s (%s)", agent, n.s);
	return NULL;
}

/* Job x reports r (and, for a successful START, its shim serves). */
static void report(struct t *t, struct fjob *x, int r, const char *msg, bool has_source,
		   bool changed)
{
	struct fsb *s = sb_get(&t->f, x->name);
	x->out.r = r;
	snprintf(x->out.msg, sizeof(x->out.msg), "%s", msg);
	x->out.has_source = has_source;
	x->out.changed = changed;
	if (r == 0) {
		s->has_source = has_source;
		if (x->kind == CAP_CTL_JOB_START || x->kind == CAP_CTL_JOB_WAIT) {
			s->exists = true;
			s->st = CAP_VM_RUNNING;
			s->serving = !s->start_unserved;
		} else if (changed) {
			/* The real job stops the VM to rebuild the public data:
			 * the shim hangs up. */
			s->st = CAP_VM_STOPPED;
			s->serving = false;
			if (s->vm) {
				s->vm->lost = true;
				vm_kick(s->vm);
			}
		}
	}
	assert_int_equal(write(x->wfd, "x", 1), 1);
	close(x->wfd);
	x->wfd = -1;
	x->reported = true;
}

static void job_report(struct t *t, const char *agent, int r, const char *msg, bool has_source,
		       bool changed)
{
	report(t, job_of(t, agent), r, msg, has_source, changed);
}

/* The open stream of agent's VM (exactly one). */
static struct fstream *stream_of(struct t *t, const char *agent)
{
	struct fvm *v = vm_of(t, agent);
	struct fstream *found = NULL;
	for (unsigned k = 0; k < v->ns; k++)
		if (v->s[k].open && !v->s[k].due) {
			if (found)
				fail_msg("%s has more than one call running", agent);
			found = &v->s[k];
		}
	if (!found)
		fail_msg("%s has no call running", agent);
	return found;
}

/* The running call of agent ends as ex, with stdout out and stderr errtext. */
static void finish_as(struct t *t, const char *agent, struct cap_exit ex, const char *out,
		      const char *errtext)
{
	struct fstream *s = stream_of(t, agent);
	s->exit = ex;
	snprintf(s->out, sizeof(s->out), "%s", out);
	snprintf(s->err, sizeof(s->err), "%s", errtext);
	s->due = true;
	vm_kick(vm_of(t, agent));
}

static void finish(struct t *t, const char *agent, int code, const char *out)
{
	finish_as(t, agent, (struct cap_exit){ .kind = CAP_EXIT_CODE, .value = code }, out, "");
}

/* The shim answers the pause or resume asked of agent's VM. */
static void answer(struct t *t, const char *agent, int result)
{
	struct fvm *v = vm_of(t, agent);
	if (!v->op_pending)
		fail_msg("no pause or resume was asked of %s", agent);
	v->op_answered = true;
	v->op_result = result;
	if (result == 0)
		v->sb->st = v->op_pause ? CAP_VM_PAUSED : CAP_VM_RUNNING;
	vm_kick(v);
}

/* agent gets a running VM and one finished call (tag): the common start. */
static void run_one(struct t *t, const char *agent, intptr_t tag)
{
	unsigned jobs = t->f.njobs;
	unsigned before = t->fe1.ngot;
	assert_non_null(submit_exec(t->c, &t->fe1, agent, agent, tag));
	UNTIL(t, t->f.njobs == jobs + 1 || status(t, agent).active == 1);
	if (t->f.njobs == jobs + 1) {
		job_report(t, agent, 0, "", false, false);
		/* a private import may run first, in a worker */
		UNTIL_WAIT(t, 50, status(t, agent).active == 1);
	}
	finish(t, agent, 0, "ok\n");
	UNTIL(t, t->fe1.ngot == before + 1);
	assert_int_equal(must_get(&t->fe1, tag)->code, CAP_CTL_OK);
}

/* --- 1. first call --------------------------------------------------------------- */

static void first_call_starts_the_sandbox(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "hello", 1));
	UNTIL(t, t->f.njobs == 1);
	struct fjob *j = &t->f.jobs[0];
	assert_int_equal(j->kind, CAP_CTL_JOB_START);
	assert_true(j->create);
	assert_string_equal(j->name, sbname(t, "a").s);
	assert_string_equal(state_of(t, "a"), "starting");
	assert_int_equal(status(t, "a").queued, 1);

	/* Nothing runs before the job reports. */
	settle(t);
	assert_int_equal(t->f.nstarted, 0);
	assert_int_equal(t->f.attaches, 0);
	assert_int_equal(t->fe1.ngot, 0);
	assert_string_equal(state_of(t, "a"), "starting");

	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 1);
	assert_int_equal(t->f.attaches, 1);
	assert_string_equal(t->f.started[0], "hello");
	assert_string_equal(state_of(t, "a"), "running");
	assert_int_equal(status(t, "a").active, 1);
	assert_int_equal(status(t, "a").queued, 0);
	assert_int_equal(t->f.njobs, 1);	/* no public data: no check */

	finish(t, "a", 3, "hi\n");
	UNTIL(t, t->fe1.ngot == 1);
	const struct got *g = must_get(&t->fe1, 1);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_int_equal(g->kind, CAP_CTL_EXEC);
	assert_int_equal(g->exit.kind, CAP_EXIT_CODE);
	assert_int_equal(g->exit.value, 3);
	assert_string_equal(g->out, "hi\n");
	assert_string_equal(g->sandbox, sbname(t, "a").s);
	assert_int_equal(t->fe2.ngot, 0);

	/* The mapping was written: the sandbox belongs to a/p. */
	char agent[65], peer[65];
	assert_int_equal(cap_ctl_identity_of(t->c, sbname(t, "a").s, agent, peer), 0);
	assert_string_equal(agent, "a");
	assert_string_equal(peer, "p");
	assert_string_equal(state_of(t, "a"), "running");
	assert_int_equal(status(t, "a").active, 0);
}

/* --- 2. queueing ------------------------------------------------------------------- */

static void one_identity_in_order_two_concurrently(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "a1", 1));
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "a2", 2));
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "a3", 3));
	assert_non_null(submit_exec(t->c, &t->fe2, "b", "b1", 11));
	UNTIL(t, t->f.njobs == 2);	/* one start each, side by side */
	assert_string_equal(state_of(t, "a"), "starting");
	assert_string_equal(state_of(t, "b"), "starting");
	job_report(t, "b", 0, "", false, false);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 2);
	settle(t);
	assert_int_equal(t->f.nstarted, 2);	/* a2 waits for a1 */
	assert_int_equal(status(t, "a").active, 1);
	assert_int_equal(status(t, "a").queued, 2);
	assert_int_equal(status(t, "b").active, 1);
	assert_string_equal(stream_of(t, "a")->what, "a1");
	assert_string_equal(stream_of(t, "b")->what, "b1");

	finish(t, "a", 0, "1");
	UNTIL(t, t->f.nstarted == 3);
	assert_string_equal(t->f.started[2], "a2");
	assert_non_null(must_get(&t->fe1, 1));
	assert_null(got(&t->fe1, 2));
	assert_null(got(&t->fe2, 11));	/* b1 still runs, beside a2 */
	assert_string_equal(stream_of(t, "b")->what, "b1");

	finish(t, "b", 0, "b");
	finish(t, "a", 0, "2");
	UNTIL(t, t->f.nstarted == 4);
	assert_string_equal(t->f.started[3], "a3");
	finish(t, "a", 0, "3");
	UNTIL(t, t->fe1.ngot == 3);
	for (intptr_t k = 1; k <= 3; k++) {
		const struct got *g = must_get(&t->fe1, k);
		char want[2] = { (char)('0' + k), '\0' };
		assert_int_equal(g->code, CAP_CTL_OK);
		assert_string_equal(g->out, want);
		assert_int_equal(t->fe1.got[k - 1].tag, k);	/* answered in order */
	}
	assert_int_equal(must_get(&t->fe2, 11)->code, CAP_CTL_OK);
	assert_int_equal(t->f.njobs, 2);
}

/* A call the shim refuses at once ends alone (ETOOL for a bad request,
 * ESANDBOX otherwise); the queue moves on. */
static void refused_call_ends_alone(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.exec_fails = EINVAL;
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "bad", 2));
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_ETOOL);
	t->f.exec_fails = EIO;
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "broken", 3));
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_ESANDBOX);
	assert_string_equal(must_get(&t->fe1, 3)->msg, "the agent refused the command (fake)");
	t->f.exec_fails = 0;
	char *argv[] = { "good", NULL };
	struct cap_exec_req x = { .argv = argv, .argc = 1 };
	struct cap_ctl_req r = { .kind = CAP_CTL_EXEC, .exec = &x, .stdin_data = "input", .stdin_len = 5 };
	assert_non_null(cap_ctl_submit(t->c, t->fe1.h, "a", "p", &r, (void *)4));
	UNTIL(t, status(t, "a").active == 1);
	assert_string_equal(stream_of(t, "a")->in, "input");	/* all of stdin, then closed */
	assert_true(stream_of(t, "a")->in_closed);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_OK);
}

/* --- 3, 4, 5. pause and resume, answered by the shim -------------------------------- */

static void idle_pause_waits_for_the_shim(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	advance(t, 999);
	settle(t);
	assert_int_equal(t->f.pauses, 0);
	advance(t, 1);
	UNTIL(t, t->f.pauses == 1);
	assert_true(vm_of(t, "a")->op_pause);
	settle(t);
	assert_string_equal(state_of(t, "a"), "running");	/* not before the shim says so */
	answer(t, "a", 0);
	UNTIL(t, status(t, "a").state == CAP_VM_PAUSED);
	assert_int_equal(t->f.pauses, 1);
	assert_int_equal(t->f.resumes, 0);
	assert_int_equal(status(t, "a").idle_ms, 1000);
	struct cap_ctl_metrics m;
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.evictions[CAP_CTL_EVICT_IDLE_PAUSE], 1);	/* asked once, counted once */
	assert_int_equal(m.evictions[CAP_CTL_EVICT_IDLE_STOP], 0);
	assert_int_equal(m.sandboxes[CAP_VM_PAUSED], 1);
	assert_int_equal(m.sandboxes[CAP_VM_RUNNING], 0);
	assert_int_equal(m.identities, 1);
}

static void pause_refused_stays_running(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	advance(t, 1000);
	UNTIL(t, t->f.pauses == 1);
	answer(t, "a", -EBUSY);
	UNTIL(t, !vm_of(t, "a")->op_pending);
	settle(t);
	assert_string_equal(state_of(t, "a"), "running");
	assert_int_equal(t->f.pauses, 1);	/* not asked again at once */
	/* Another idle period, another try. */
	advance(t, 999);
	settle(t);
	assert_int_equal(t->f.pauses, 1);
	advance(t, 1);
	UNTIL(t, t->f.pauses == 2);
	answer(t, "a", 0);
	UNTIL(t, status(t, "a").state == CAP_VM_PAUSED);
}

/* Idle a's VM until the shim has paused it. */
static void to_paused(struct t *t, const char *agent)
{
	unsigned pauses = t->f.pauses;
	advance(t, t->cfg.lc.idle_pause_ms);
	UNTIL(t, t->f.pauses == pauses + 1);
	answer(t, agent, 0);
	UNTIL(t, status(t, agent).state == CAP_VM_PAUSED);
}

static void call_to_paused_vm_resumes_first(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	to_paused(t, "a");
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "two", 2));
	UNTIL(t, t->f.resumes == 1);
	assert_false(vm_of(t, "a")->op_pause);
	settle(t);
	assert_int_equal(t->f.nstarted, 1);	/* waits for the shim */
	assert_string_equal(state_of(t, "a"), "paused");
	assert_int_equal(status(t, "a").queued, 1);
	answer(t, "a", 0);
	UNTIL(t, t->f.nstarted == 2);
	assert_string_equal(t->f.started[1], "two");
	assert_string_equal(state_of(t, "a"), "running");
	finish(t, "a", 0, "2");
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);

	/* A resume the shim refuses fails the call; the VM stays paused. */
	to_paused(t, "a");
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "three", 3));
	UNTIL(t, t->f.resumes == 2);
	answer(t, "a", -EIO);
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_ESANDBOX);
	assert_int_equal(must_get(&t->fe1, 3)->errnum, EIO);
	assert_int_equal(t->f.nstarted, 2);
	assert_string_equal(state_of(t, "a"), "paused");
}

/* --- 6. idle stop -------------------------------------------------------------------- */

static void idle_stop_frees_the_identity(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	to_paused(t, "a");
	struct nm name = sbname(t, "a");
	advance(t, t->cfg.lc.idle_stop_ms - t->cfg.lc.idle_pause_ms - 1);
	settle(t);
	assert_int_equal(t->f.stops, 0);
	advance(t, 1);
	UNTIL(t, t->f.stops == 1);
	assert_string_equal(t->f.stopped[0], name.s);
	assert_string_equal(state_of(t, "a"), "stopping");
	settle(t);
	assert_string_equal(state_of(t, "a"), "stopping");	/* until the VM is gone */
	vm_die(vm_of(t, "a"));
	/* Out of memory (idle_ms unknown): the state comes from the backend. */
	UNTIL(t, status(t, "a").idle_ms == -1);
	struct cap_ctl_status s = status(t, "a");
	assert_string_equal(cap_vm_state_name(s.state), "stopped");
	assert_string_equal(s.sandbox, name.s);
	assert_int_equal(s.active + s.queued, 0);
	assert_null(sb_find(&t->f, name.s)->vm);	/* detached, freed */
	assert_int_equal(t->f.kills, 0);

	/* A new call starts it again (the same sandbox). */
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "again", 2));
	UNTIL(t, t->f.njobs == 2);
	assert_string_equal(t->f.jobs[1].name, name.s);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);
}

/* --- 7. capacity --------------------------------------------------------------------- */

static void capacity_evicts_the_idle_longest(void **state)
{
	struct t *t = *state;
	t->cfg.lc.capacity = 2;
	open_ctl(t);
	run_one(t, "a", 1);
	advance(t, 10);
	run_one(t, "b", 2);
	advance(t, 10);
	struct nm a = sbname(t, "a");
	assert_non_null(submit_exec(t->c, &t->fe1, "c", "c1", 3));
	UNTIL(t, t->f.stops == 1);
	assert_string_equal(t->f.stopped[0], a.s);	/* a: idle 20 ms, b: 10 */
	assert_string_equal(state_of(t, "a"), "stopping");
	assert_string_equal(state_of(t, "b"), "running");
	assert_int_equal(status(t, "c").queued, 1);
	assert_int_equal(t->f.njobs, 2);	/* c waits for the slot */
	assert_non_null(strstr(logbuf, "at capacity (2); stopping"));
	vm_die(vm_of(t, "a"));
	UNTIL(t, t->f.njobs == 3);
	assert_string_equal(state_of(t, "c"), "starting");
	job_report(t, "c", 0, "", false, false);
	UNTIL(t, status(t, "c").active == 1);
	finish(t, "c", 0, "");
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_OK);
	assert_int_equal(t->f.stops, 1);
	assert_string_equal(state_of(t, "b"), "running");
	assert_string_equal(state_of(t, "a"), "stopped");
	struct cap_ctl_metrics m;
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.evictions[CAP_CTL_EVICT_CAPACITY], 1);
	assert_int_equal(m.evictions[CAP_CTL_EVICT_IDLE_STOP], 0);
	assert_int_equal(m.sandboxes[CAP_VM_RUNNING], 2);
	assert_int_equal(m.sandboxes[CAP_VM_STOPPED], 1);
	assert_int_equal(m.identities, 3);
	assert_int_equal(m.capacity, 2);
}

/* The figures add up what each sandbox's policy process counted: what
 * moved since the last look, and all of a counter that went back (its
 * VM started again unseen); memory is the resident ones' sum. */
static void metrics_add_up_usage(void **state)
{
	struct t *t = *state;
	struct cap_ctl_metrics m;
	open_ctl(t);
	run_one(t, "a", 1);
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.net_refused, 0);
	assert_int_equal(m.memory_bytes, 0);
	assert_int_equal(m.sandboxes[CAP_VM_RUNNING], 1);
	t->f.usage = (struct cap_ctl_usage){ .memory_bytes = 1000, .net = true, .net_refused = 3,
					     .net_bytes_out = 10, .net_bytes_in = 20 };
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.net_refused, 3);
	assert_int_equal(m.net_bytes_out, 10);
	assert_int_equal(m.net_bytes_in, 20);
	assert_int_equal(m.memory_bytes, 1000);
	assert_int_equal(m.memory_sandboxes, 1);
	t->f.usage.net_refused = 5;
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.net_refused, 5);	/* 3 + 2 */
	assert_int_equal(m.net_bytes_in, 20);	/* nothing moved */
	t->f.usage.net_refused = 2;	/* set back to zero since, then 2 */
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.net_refused, 7);
	t->f.usage.net = false;	/* unreadable now: nothing added, nothing lost */
	t->f.usage.net_refused = 100;
	cap_ctl_metrics(t->c, &m);
	assert_int_equal(m.net_refused, 7);
	assert_int_equal(m.prepares[CAP_CTL_PREP_OK] + m.prepares[CAP_CTL_PREP_FAILED], 0);	/* nothing to prepare */
	assert_true(m.start_unix_ms > 0);
	assert_string_equal(cap_ctl_evict_name(CAP_CTL_EVICT_UNRESPONSIVE), "unresponsive");
	assert_string_equal(cap_ctl_prep_outcome_name(CAP_CTL_PREP_CANCELLED), "cancelled");
}

/* While one eviction is under way, the loop moving on (the clock, other
 * calls) must not evict a second VM for the same newcomer. With a clock
 * that stands still, the VM whose last call ended first goes. */
static void one_eviction_per_newcomer(void **state)
{
	struct t *t = *state;
	t->cfg.lc.capacity = 2;
	open_ctl(t);
	run_one(t, "a", 1);
	run_one(t, "b", 2);
	struct nm a = sbname(t, "a");
	assert_int_equal(status(t, "a").idle_ms, status(t, "b").idle_ms);
	assert_non_null(submit_exec(t->c, &t->fe1, "c", "c1", 3));
	UNTIL(t, t->f.stops == 1);
	assert_string_equal(t->f.stopped[0], a.s);
	advance(t, 1);	/* the loop runs the queues again */
	settle(t);
	assert_int_equal(t->f.stops, 1);
	assert_string_equal(state_of(t, "b"), "running");
	vm_die(vm_of(t, "a"));
	UNTIL(t, t->f.njobs == 3);
	assert_string_equal(state_of(t, "b"), "running");
}

static void capacity_full_of_busy_fails_at_once(void **state)
{
	struct t *t = *state;
	t->cfg.lc.capacity = 2;
	open_ctl(t);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "a1", 1));
	assert_non_null(submit_exec(t->c, &t->fe1, "b", "b1", 2));
	UNTIL(t, t->f.njobs == 2);
	job_report(t, "a", 0, "", false, false);
	job_report(t, "b", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 2);
	assert_non_null(submit_exec(t->c, &t->fe1, "c", "c1", 3));
	step(t);	/* one round */
	const struct got *g = must_get(&t->fe1, 3);
	assert_int_equal(g->code, CAP_CTL_ECAPACITY);
	assert_int_equal(t->f.stops, 0);
	assert_int_equal(t->f.njobs, 2);
	assert_string_equal(state_of(t, "c"), "none");
	/* The busy ones are untouched. */
	finish(t, "a", 0, "");
	finish(t, "b", 0, "");
	UNTIL(t, t->fe1.ngot == 3);
	assert_int_equal(must_get(&t->fe1, 1)->code, CAP_CTL_OK);
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);
}

/* --- 8. cancel ----------------------------------------------------------------------- */

static void cancel_queued_and_running(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	struct cap_ctl_call *k1 = submit_exec(t->c, &t->fe1, "a", "one", 1);
	struct cap_ctl_call *k2 = submit_exec(t->c, &t->fe1, "a", "two", 2);
	struct cap_ctl_call *k3 = submit_exec(t->c, &t->fe1, "a", "three", 3);
	UNTIL(t, t->f.njobs == 1);
	/* Queued behind the start: ends at once, before cancel returns. */
	assert_true(cap_ctl_cancel(t->c, k3));
	assert_int_equal(t->fe1.ngot, 1);
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_ECANCELLED);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 1);
	/* Queued behind a running call. */
	assert_true(cap_ctl_cancel(t->c, k2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_ECANCELLED);
	assert_int_equal(status(t, "a").queued, 0);
	/* Running: killed, and it ends when the guest says so. */
	struct fstream *s = stream_of(t, "a");
	assert_true(cap_ctl_cancel(t->c, k1));
	assert_int_equal(s->signalled, SIGKILL);
	settle(t);
	assert_null(got(&t->fe1, 1));
	assert_int_equal(status(t, "a").active, 1);
	finish_as(t, "a", (struct cap_exit){ .kind = CAP_EXIT_SIGNAL, .value = SIGKILL }, "partial", "");
	UNTIL(t, got(&t->fe1, 1));
	assert_int_equal(must_get(&t->fe1, 1)->code, CAP_CTL_ECANCELLED);
	assert_int_equal(t->fe1.ngot, 3);
	assert_int_equal(t->f.nstarted, 1);	/* two and three never ran */
	assert_int_equal(status(t, "a").active, 0);

	/* A stop under way is not taken back. */
	struct cap_ctl_req r = { .kind = CAP_CTL_STOP };
	struct cap_ctl_call *ks = cap_ctl_submit(t->c, t->fe1.h, "a", "p", &r, (void *)4);
	UNTIL(t, t->f.stops == 1);
	assert_false(cap_ctl_cancel(t->c, ks));
	vm_die(vm_of(t, "a"));
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_OK);
	assert_string_equal(must_get(&t->fe1, 4)->state, "stopped");
}

/* --- 9. stop and remove of a stopped identity -------------------------------------- */

static struct cap_ctl_call *submit_kind(struct t *t, enum cap_ctl_kind kind, const char *agent,
					intptr_t tag)
{
	struct cap_ctl_req r = { .kind = kind };
	return cap_ctl_submit(t->c, t->fe1.h, agent, "p", &r, (void *)tag);
}

static void stop_and_remove_of_stopped(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	premade(t, "s1", "t-stopped-1", CAP_VM_STOPPED, false, false);
	premade(t, "s2", "t-stopped-2", CAP_VM_STOPPED, false, false);
	assert_string_equal(state_of(t, "s1"), "stopped");

	submit_kind(t, CAP_CTL_REMOVE, "s1", 1);
	UNTIL(t, got(&t->fe1, 1));
	const struct got *g = must_get(&t->fe1, 1);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_int_equal(g->kind, CAP_CTL_REMOVE);
	assert_string_equal(g->state, "removed");
	assert_int_equal(t->f.removes, 1);
	assert_string_equal(t->f.removed, "t-stopped-1");
	assert_false(sb_find(&t->f, "t-stopped-1")->exists);
	char agent[65], peer[65];
	assert_int_equal(cap_ctl_identity_of(t->c, "t-stopped-1", agent, peer), -ENOENT);
	assert_string_equal(state_of(t, "s1"), "none");

	submit_kind(t, CAP_CTL_STOP, "s2", 2);
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);
	assert_int_equal(must_get(&t->fe1, 2)->kind, CAP_CTL_STOP);
	assert_string_equal(must_get(&t->fe1, 2)->state, "stopped");
	assert_string_equal(state_of(t, "s2"), "stopped");

	/* An identity that never had a sandbox. */
	submit_kind(t, CAP_CTL_STOP, "nobody", 3);
	submit_kind(t, CAP_CTL_REMOVE, "nobody", 4);
	UNTIL(t, t->fe1.ngot == 4);
	assert_string_equal(must_get(&t->fe1, 3)->state, "none");
	assert_string_equal(must_get(&t->fe1, 4)->state, "none");

	/* Nothing was started or stopped for any of it. */
	assert_int_equal(t->f.njobs, 0);
	assert_int_equal(t->f.attaches, 0);
	assert_int_equal(t->f.stops, 0);
	assert_int_equal(t->f.removes, 1);
}

static void remove_of_a_running_identity(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	struct nm name = sbname(t, "a");
	t->f.remove_busy = 1;	/* the shim is still exiting at first */
	struct cap_ctl_call *k = submit_kind(t, CAP_CTL_REMOVE, "a", 2);
	UNTIL(t, t->f.stops == 1);
	assert_false(cap_ctl_cancel(t->c, k));	/* not taken back */
	vm_die(vm_of(t, "a"));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	assert_string_equal(must_get(&t->fe1, 2)->state, "removed");
	assert_int_equal(t->f.removes, 1);
	assert_false(sb_find(&t->f, name.s)->exists);
	assert_string_equal(state_of(t, "a"), "none");
}

/* A VM that is gone is stopped only once its shim has exited too. */
static void stopped_once_the_shim_has_exited(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	submit_kind(t, CAP_CTL_STOP, "a", 2);
	UNTIL(t, t->f.stops == 1);
	struct fsb *s = sb_of(t, "a");
	s->vm->dead = true;	/* QEMU is gone; the shim still runs */
	vm_kick(s->vm);
	UNTIL(t, s->vm == NULL);	/* let go of */
	settle(t);
	assert_string_equal(state_of(t, "a"), "stopping");
	assert_null(got(&t->fe1, 2));
	assert_int_equal(t->f.kills, 0);
	s->st = CAP_VM_STOPPED;	/* the shim exits */
	s->serving = false;
	UNTIL(t, got(&t->fe1, 2));
	assert_string_equal(must_get(&t->fe1, 2)->state, "stopped");
	assert_string_equal(state_of(t, "a"), "stopped");
}

/* --- 10. a start that fails ----------------------------------------------------------- */

static void failed_start_fails_the_queue(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	const char *why = "cannot create the disk: no space left on device; free some space";
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "one", 1));
	assert_non_null(submit_exec(t->c, &t->fe2, "a", "two", 2));
	UNTIL(t, t->f.njobs == 1);
	job_report(t, "a", -ENOSPC, why, false, false);
	UNTIL(t, t->fe1.ngot == 1 && t->fe2.ngot == 1);
	assert_int_equal(must_get(&t->fe1, 1)->code, CAP_CTL_ESANDBOX);
	assert_string_equal(must_get(&t->fe1, 1)->msg, why);
	assert_int_equal(must_get(&t->fe2, 2)->code, CAP_CTL_ESANDBOX);
	assert_string_equal(must_get(&t->fe2, 2)->msg, why);
	assert_int_equal(t->f.nstarted, 0);
	assert_int_equal(t->f.attaches, 0);
	assert_false(cap_vm_state_resident(status(t, "a").state));

	/* The job succeeds but the shim cannot be attached: the call fails,
	 * and the shim is stopped rather than left running unowned. */
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "three", 3));
	UNTIL(t, t->f.njobs == 2);
	sb_of(t, "a")->start_unserved = true;
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_ESANDBOX);
	assert_non_null(strstr(must_get(&t->fe1, 3)->msg, "no serving shim"));
	assert_int_equal(t->f.nstarted, 0);
	assert_int_equal(t->f.kills, 1);
	UNTIL(t, !cap_vm_state_resident(status(t, "a").state));
}

/* --- 11. public data checked before each call ---------------------------------------- */

static void changed_public_data_restarts_first(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	premade(t, "s", "t-src", CAP_VM_STOPPED, false, true);
	assert_non_null(submit_exec(t->c, &t->fe1, "s", "one", 1));
	UNTIL(t, t->f.njobs == 1);
	assert_int_equal(t->f.jobs[0].kind, CAP_CTL_JOB_START);
	job_report(t, "s", 0, "", true, false);
	/* The start refreshed the data: the first call needs no check. */
	UNTIL(t, t->f.nstarted == 1);
	assert_int_equal(t->f.njobs, 1);
	finish(t, "s", 0, "");
	UNTIL(t, got(&t->fe1, 1));

	/* Unchanged: the call runs after the check. */
	assert_non_null(submit_exec(t->c, &t->fe1, "s", "two", 2));
	UNTIL(t, t->f.njobs == 2);
	assert_int_equal(t->f.jobs[1].kind, CAP_CTL_JOB_CHECK);
	assert_false(t->f.jobs[1].create);
	assert_string_equal(t->f.jobs[1].name, "t-src");
	settle(t);
	assert_int_equal(t->f.nstarted, 1);
	job_report(t, "s", 0, "", true, false);
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "s", 0, "");
	UNTIL(t, got(&t->fe1, 2));

	/* Changed: the job stopped the VM; it starts again, then the call. */
	assert_non_null(submit_exec(t->c, &t->fe1, "s", "three", 3));
	UNTIL(t, t->f.njobs == 3);
	assert_int_equal(t->f.jobs[2].kind, CAP_CTL_JOB_CHECK);
	job_report(t, "s", 0, "", true, true);
	UNTIL(t, t->f.njobs == 4);
	assert_int_equal(t->f.jobs[3].kind, CAP_CTL_JOB_START);
	assert_string_equal(state_of(t, "s"), "starting");
	assert_null(sb_find(&t->f, "t-src")->vm);	/* detached */
	assert_int_equal(t->f.nstarted, 2);
	assert_null(strstr(logbuf, "went away"));	/* expected, not a warning */
	job_report(t, "s", 0, "", true, false);
	UNTIL(t, t->f.nstarted == 3);
	assert_int_equal(t->f.attaches, 2);
	assert_string_equal(t->f.started[2], "three");
	finish(t, "s", 0, "3");
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_OK);

	/* A check that fails fails that call only. */
	assert_non_null(submit_exec(t->c, &t->fe1, "s", "four", 4));
	UNTIL(t, t->f.njobs == 5);
	job_report(t, "s", -ELOOP, "the public data has a symlink loop at x/y", true, false);
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_ESANDBOX);
	assert_string_equal(must_get(&t->fe1, 4)->msg, "the public data has a symlink loop at x/y");
	assert_string_equal(state_of(t, "s"), "running");
}

/* --- 12. one controller per home ------------------------------------------------------ */

static void second_controller_is_refused(void **state)
{
	struct t *t = *state;
	t->cfg.socket_path = "/tmp/capsule-test.sock";
	open_ctl(t);
	struct cap_ctl *c2 = NULL;
	struct cap_err err = { 0 };
	assert_int_equal(cap_ctl_new(&t->cfg, &c2, &err), -EBUSY);
	assert_null(c2);
	assert_int_equal(err.code, EBUSY);
	char pid[32];
	snprintf(pid, sizeof(pid), "pid %d", (int)getpid());
	if (!strstr(err.msg, pid) || !strstr(err.msg, t->home))
		fail_msg("the refusal names neither the holder's %s nor the home: %s", pid, err.msg);

	struct cap_ctl_holder h;
	assert_int_equal(cap_ctl_holder(&h), 1);
	assert_int_equal(h.pid, getpid());
	assert_string_equal(h.frontend, "serve");
	assert_string_equal(h.socket, "/tmp/capsule-test.sock");

	cap_ctl_free(t->c);
	t->c = NULL;
	assert_int_equal(cap_ctl_holder(&h), 0);
	assert_int_equal(cap_ctl_new(&t->cfg, &t->c, &err), 0);
}

/* --- 13. shutdown ------------------------------------------------------------------------- */

static void shutdown_fails_queued_and_stops_vms(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);	/* a: running, idle */
	run_one(t, "b", 2);
	assert_non_null(submit_exec(t->c, &t->fe1, "b", "b-long", 3));	/* b: busy */
	assert_non_null(submit_exec(t->c, &t->fe1, "b", "b-queued", 4));
	UNTIL(t, status(t, "b").active == 1);
	assert_non_null(submit_exec(t->c, &t->fe2, "c", "c-queued", 5));	/* c: starting */
	UNTIL(t, t->f.njobs == 3);

	cap_ctl_shutdown(t->c, "test");
	assert_int_equal(t->fe1.shutdowns, 1);
	assert_int_equal(t->fe2.shutdowns, 1);
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_ESANDBOX);
	assert_int_equal(must_get(&t->fe2, 5)->code, CAP_CTL_ESANDBOX);
	assert_null(got(&t->fe1, 3));	/* ends with its VM */
	assert_int_equal(t->f.stops, 2);
	assert_string_equal(state_of(t, "a"), "stopping");
	assert_string_equal(state_of(t, "b"), "stopping");
	assert_string_equal(state_of(t, "c"), "starting");

	/* No new calls: refused by the loop, never from inside submit (the
	 * caller has not stored the handle yet). */
	assert_non_null(submit_exec(t->c, &t->fe1, "d", "late", 6));
	assert_null(got(&t->fe1, 6));
	assert_int_equal(step(t), 1);
	assert_int_equal(must_get(&t->fe1, 6)->code, CAP_CTL_ESANDBOX);
	assert_int_equal(must_get(&t->fe1, 6)->errnum, ESHUTDOWN);

	vm_die(vm_of(t, "a"));
	vm_die(vm_of(t, "b"));
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_ESANDBOX);
	settle(t);
	assert_int_equal(step(t), 1);	/* c still starting */
	t->f.die_on_stop = true;
	job_report(t, "c", 0, "", false, false);	/* started: stopped at once */
	UNTIL(t, t->f.stops == 3);
	UNTIL(t, step(t) == 0);
	assert_string_equal(state_of(t, "a"), "stopped");
	assert_string_equal(state_of(t, "b"), "stopped");
	assert_string_equal(state_of(t, "c"), "stopped");
	assert_int_equal(t->f.nstarted, 3);	/* a, b, b-long */
	assert_int_equal(t->fe1.ngot + t->fe2.ngot, 6);
}

/* SIGTERM (read on the controller's signalfd) shuts down like
 * cap_ctl_shutdown. */
static void sigterm_shuts_down(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.die_on_stop = true;
	assert_int_equal(raise(SIGTERM), 0);	/* blocked: it waits on the signalfd */
	UNTIL(t, t->fe1.shutdowns == 1);
	assert_int_equal(t->fe2.shutdowns, 1);
	assert_int_equal(t->f.stops, 1);
	UNTIL(t, step(t) == 0);
	assert_string_equal(state_of(t, "a"), "stopped");
}

/* A remove waiting for a shim to finish exiting is answered before the
 * loop says it is done. */
static void shutdown_waits_for_a_remove(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.remove_busy = 1;
	submit_kind(t, CAP_CTL_REMOVE, "a", 2);
	UNTIL(t, t->f.stops == 1);
	vm_die(vm_of(t, "a"));
	UNTIL(t, sb_of(t, "a")->vm == NULL);	/* stopped; the remove retries */
	cap_ctl_shutdown(t->c, "test");
	int n = 0;
	while (step_wait(t, 50) != 0 && ++n < 100)
		;
	const struct got *g = must_get(&t->fe1, 2);
	assert_string_equal(g->state, "removed");
}

/* A VM that goes away unasked fails its running call; the next call
 * starts it again. */
static void lost_vm_fails_the_running_call(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "two", 2));
	UNTIL(t, status(t, "a").active == 1);
	vm_lose(vm_of(t, "a"));
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_ESANDBOX);
	assert_non_null(strstr(must_get(&t->fe1, 2)->msg, "hung up"));
	assert_non_null(strstr(logbuf, "went away"));
	assert_string_equal(state_of(t, "a"), "stopped");
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "three", 3));
	UNTIL(t, t->f.njobs == 2);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 3);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_OK);
}

/* A call that comes while a pause is asked waits for the answer, then
 * resumes (the fake fails the test on a second request before the first
 * is answered, or on a call started on a VM that is not running). */
static void call_during_a_pause_waits_for_the_answer(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	advance(t, 1000);
	UNTIL(t, t->f.pauses == 1);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "two", 2));
	settle(t);
	assert_int_equal(t->f.nstarted, 1);
	assert_int_equal(t->f.resumes, 0);
	answer(t, "a", 0);
	UNTIL(t, t->f.resumes == 1);
	assert_int_equal(t->f.nstarted, 1);
	answer(t, "a", 0);
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);

	/* Refused instead: the call runs on the running VM. */
	advance(t, 1000);
	UNTIL(t, t->f.pauses == 2);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "three", 3));
	settle(t);
	answer(t, "a", -EBUSY);
	UNTIL(t, t->f.nstarted == 3);
	assert_int_equal(t->f.resumes, 1);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 3));
}

static void count_one(void *ud, const struct cap_ctl_status *s)
{
	(void)s;
	(*(unsigned *)ud)++;
}

static void warm_pool_hands_over_a_started_vm(void **state)
{
	struct t *t = *state;
	t->cfg.warm_pool = 1;
	open_ctl(t);
	UNTIL(t, t->f.njobs == 1);
	struct fjob *pool = &t->f.jobs[0];
	assert_int_equal(strncmp(pool->name, "pool-", 5), 0);
	assert_true(pool->create);
	struct cap_ctl_pool_info info;
	unsigned listed = 0;
	cap_ctl_list(t->c, count_one, &listed, &info);
	assert_int_equal(listed, 0);	/* pool VMs belong to no identity */
	assert_int_equal(info.members, 1);
	assert_int_equal(info.ready, 0);
	report(t, pool, 0, "", false, false);
	UNTIL(t, t->f.attaches == 1);
	cap_ctl_list(t->c, count_one, &listed, &info);
	assert_int_equal(info.ready, 1);
	char name[CAP_NAME_MAX + 1];
	snprintf(name, sizeof(name), "%s", pool->name);

	/* The new identity gets it: no start of its own, no second attach. */
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "one", 1));
	UNTIL(t, t->f.nstarted == 1);
	assert_string_equal(sbname(t, "a").s, name);
	assert_int_equal(t->f.attaches, 1);
	char agent[65], peer[65];
	assert_int_equal(cap_ctl_identity_of(t->c, name, agent, peer), 0);
	assert_string_equal(agent, "a");
	/* And the pool fills again. */
	UNTIL(t, t->f.njobs == 2);
	assert_int_equal(strncmp(t->f.jobs[1].name, "pool-", 5), 0);
	assert_string_not_equal(t->f.jobs[1].name, name);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 1));
	assert_int_equal(must_get(&t->fe1, 1)->code, CAP_CTL_OK);
}

/* Sizes per identity: a refused override keeps nothing; a good one is
 * kept in the identity's record before it has a sandbox, reaches its
 * start job over the server's defaults, and keeps it from the warm pool
 * (whose VM has the defaults' shape). */
static void sized_identity_starts_with_its_size(void **state)
{
	struct t *t = *state;
	struct cap_ctl_size_out out;
	struct cap_err err = { 0 };
	t->cfg.warm_pool = 1;
	t->cfg.size.memory_mib = 384;
	t->cfg.size_max.cpus = 4;
	open_ctl(t);
	UNTIL(t, t->f.njobs == 1);
	struct fjob *pool = &t->f.jobs[0];
	assert_int_equal(pool->size.memory_mib, 384);	/* the server's default */
	assert_int_equal(pool->size.cpus, 1);	/* the record's */
	report(t, pool, 0, "", false, false);
	UNTIL(t, t->f.attaches == 1);

	struct cap_ctl_size bad = { .cpus = 9 };
	assert_int_equal(cap_ctl_set_size(t->c, "a", "p", &bad, &out, &err), -ERANGE);
	assert_non_null(strstr(err.msg, "size.cpus 9"));
	assert_non_null(strstr(err.msg, "--max-cpus"));
	cap_ctl_size_of(t->c, "a", "p", &out);
	assert_int_equal(out.over.cpus, 0);
	assert_int_equal(out.size.memory_mib, 384);

	struct cap_ctl_size want = { .memory_mib = 256 };
	assert_int_equal(cap_ctl_set_size(t->c, "a", "p", &want, &out, &err), 0);
	assert_int_equal(out.size.memory_mib, 256);
	assert_int_equal(out.over.memory_mib, 256);
	assert_false(out.pending);
	_cleanup_free_ char *rec = xasprintf("%s/workspaces/a/p/record.json", t->home);
	assert_int_equal(access(rec, F_OK), 0);

	/* Not the warm VM: a start of its own, with its size. */
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "one", 1));
	UNTIL(t, t->f.njobs == 2);
	struct fjob *own = &t->f.jobs[1];
	assert_string_equal(own->name, sbname(t, "a").s);
	assert_int_not_equal(strncmp(own->name, "pool-", 5), 0);
	assert_int_equal(own->size.memory_mib, 256);
	assert_int_equal(own->size.work_mib, 512);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 1);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 1));
	assert_int_equal(must_get(&t->fe1, 1)->code, CAP_CTL_OK);
}

/* --- two front ends ---------------------------------------------------------------------- */

static void results_go_to_the_submitting_front_end(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "from-1", 1));
	/* fe2's client sends a call on its socket. */
	snprintf(t->fe2.inbox.agent, sizeof(t->fe2.inbox.agent), "a");
	snprintf(t->fe2.inbox.what, sizeof(t->fe2.inbox.what), "from-2");
	t->fe2.inbox.tag = 2;
	assert_int_equal(write(t->fe2.pipe[1], "r", 1), 1);
	UNTIL(t, t->fe2.readies == 1);
	assert_int_equal(t->fe1.readies, 0);
	assert_int_equal(status(t, "a").queued, 2);
	UNTIL(t, t->f.njobs == 1);
	job_report(t, "a", 0, "", false, false);
	UNTIL(t, t->f.nstarted == 1);
	finish(t, "a", 0, "one");
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "a", 0, "two");
	UNTIL(t, t->fe2.ngot == 1);
	assert_int_equal(t->fe1.ngot, 1);
	assert_string_equal(must_get(&t->fe1, 1)->out, "one");
	assert_string_equal(must_get(&t->fe2, 2)->out, "two");
	assert_null(got(&t->fe1, 2));
	assert_null(got(&t->fe2, 1));
	assert_true(t->fe1.flushes > 0 && t->fe2.flushes > 0);
}

/* --- file calls ------------------------------------------------------------------------- */

static struct cap_ctl_call *submit_file(struct t *t, enum cap_file_op op, const char *path,
					const char *data, intptr_t tag)
{
	struct cap_ctl_req r = {
		.kind = CAP_CTL_FILE, .op = op, .root = "/work", .path = path,
		.data = data, .len = data ? strlen(data) : 0,
	};
	return cap_ctl_submit(t->c, t->fe1.h, "a", "p", &r, (void *)tag);
}

static void file_calls_give_typed_results(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	submit_file(t, CAP_FILE_READ, "notes.txt", NULL, 2);
	UNTIL(t, status(t, "a").active == 1);
	assert_int_equal(stream_of(t, "a")->op, CAP_FILE_READ);
	finish(t, "a", 0, "file body");
	UNTIL(t, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->kind, CAP_CTL_FILE);
	assert_false(must_get(&t->fe1, 2)->is_dir);
	assert_string_equal(must_get(&t->fe1, 2)->content, "file body");

	submit_file(t, CAP_FILE_LIST, "", NULL, 3);
	UNTIL(t, status(t, "a").active == 1);
	finish(t, "a", 1, "d src\nf 12 a b.txt\nl link\n");
	UNTIL(t, got(&t->fe1, 3));
	assert_true(must_get(&t->fe1, 3)->is_dir);
	assert_int_equal(must_get(&t->fe1, 3)->nentries, 3);
	assert_string_equal(must_get(&t->fe1, 3)->entries, "d:src:0 f:a b.txt:12 l:link:0 ");

	submit_file(t, CAP_FILE_WRITE, "out.txt", "12345", 4);
	UNTIL(t, status(t, "a").active == 1);
	finish(t, "a", 0, "");
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->written, 5);

	submit_file(t, CAP_FILE_READ, "big", NULL, 5);
	UNTIL(t, status(t, "a").active == 1);
	finish_as(t, "a", (struct cap_exit){ .kind = CAP_EXIT_START_FAILED, .value = EFBIG }, "",
		  "big is larger than the limit; read less\n\n");
	UNTIL(t, got(&t->fe1, 5));
	assert_int_equal(must_get(&t->fe1, 5)->code, CAP_CTL_ETOOL);
	assert_string_equal(must_get(&t->fe1, 5)->msg, "big is larger than the limit; read less");
	assert_int_equal(must_get(&t->fe1, 5)->errnum, EFBIG);
}

/* --- serve's "durable" --------------------------------------------------------------------- */

static void rpc_send(int fd, int id, const char *method, const char *params)
{
	char line[1024];
	int n = snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":%d,\"method\":\"%s\",\"params\":%s}\n",
			 id, method, params);
	assert_int_equal(write(fd, line, (size_t)n), n);
}

/* Run the loop until the answer with id is there on fd (other lines are
 * dropped). A new reference. */
static json_t *rpc_wait(struct t *t, int fd, int id)
{
	static char buf[65536];
	static size_t used;
	for (int round = 0; round < 400; round++) {
		char *nl;
		while ((nl = memchr(buf, '\n', used))) {
			json_t *m = json_loadb(buf, (size_t)(nl - buf), 0, NULL);
			size_t len = (size_t)(nl - buf) + 1;
			memmove(buf, nl + 1, used - len);
			used -= len;
			if (m && json_integer_value(json_object_get(m, "id")) == id)
				return m;
			json_decref(m);
		}
		step_wait(t, 5);
		ssize_t k = read(fd, buf + used, sizeof(buf) - used);
		if (k > 0)
			used += (size_t)k;
	}
	fail_msg("no answer to request %d", id);
	return NULL;
}

/* Send a tool request for a/p, let its call start, note what the guest
 * was asked (exec flags, file limit), end it as ex; its answer. */
static json_t *rpc_tool(struct t *t, int fd, int id, const char *method, const char *params,
			struct cap_exit ex, uint32_t *asked)
{
	rpc_send(fd, id, method, params);
	UNTIL_WAIT(t, 5, status(t, "a").active == 1);
	*asked = stream_of(t, "a")->flags;
	finish_as(t, "a", ex, "", "");
	return rpc_wait(t, fd, id);
}

static bool is_true(json_t *m, const char *key)
{
	return json_is_true(json_object_get(json_object_get(m, "result"), key));
}

static bool is_false(json_t *m, const char *key)
{
	return json_is_false(json_object_get(json_object_get(m, "result"), key));
}

static json_int_t int_of(json_t *m, const char *key)
{
	json_t *v = json_object_get(json_object_get(m, "result"), key);
	return json_is_integer(v) ? json_integer_value(v) : -1;
}

#define WHO "\"identity\":{\"agent\":\"a\",\"peer\":\"p\"}"

/* serve's "durable": a non-boolean is a params error naming it; false
 * reaches the guest as CAP_EXEC_NO_SYNC, CAP_FILE_NO_SYNC and
 * CAP_XFER_NO_SYNC; the answers say "durable" and "sync_ms" as the guest
 * reported them, and read back (cap_rpc_result_parse) the same. */
static void serve_durable_param(void **state)
{
	struct t *t = *state;
	struct cap_err err = { 0 };
	open_ctl(t);
	run_one(t, "a", 1);
	_cleanup_free_ char *path = xasprintf("%s/serve.sock", t->home);
	if (cap_rpc_server_new(t->c, path, &t->srv, &err) < 0)
		fail_msg("cap_rpc_server_new: %s", err.msg);
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(fd >= 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(fcntl(fd, F_SETFL, O_NONBLOCK), 0);

	static const char *const bad[][2] = {
		{ "exec", "{" WHO ",\"argv\":[\"x\"],\"durable\":\"no\"}" },
		{ "write_file", "{" WHO ",\"path\":\"f\",\"content\":\"c\",\"durable\":1}" },
		{ "upload", "{" WHO ",\"path\":\"u\",\"content_base64\":\"aGk=\",\"durable\":null}" },
	};
	for (int i = 0; i < 3; i++) {
		rpc_send(fd, 10 + i, bad[i][0], bad[i][1]);
		json_t *m = rpc_wait(t, fd, 10 + i);
		json_t *e = json_object_get(m, "error");
		assert_int_equal(json_integer_value(json_object_get(e, "code")), -32602);
		assert_non_null(strstr(json_string_value(json_object_get(e, "message")), "params.durable must be true"));
		json_decref(m);
	}
	assert_int_equal(t->f.nstarted, 1);	/* none reached the guest */

	/* exec: false sets the flag, the answer says not durable; the
	 * default sends none and reports the guest's flush. */
	uint32_t asked;
	json_t *m = rpc_tool(t, fd, 20, "exec", "{" WHO ",\"argv\":[\"fast\"],\"durable\":false}",
			     (struct cap_exit){ .kind = CAP_EXIT_CODE }, &asked);
	assert_true(asked & CAP_EXEC_NO_SYNC);
	assert_true(is_false(m, "durable"));
	assert_int_equal(int_of(m, "sync_ms"), 0);
	json_decref(m);
	m = rpc_tool(t, fd, 21, "exec", "{" WHO ",\"argv\":[\"kept\"],\"durable\":true}",
		     (struct cap_exit){ .kind = CAP_EXIT_CODE, .flags = CAP_EXIT_DURABLE, .sync_ms = 12 }, &asked);
	assert_false(asked & CAP_EXEC_NO_SYNC);
	assert_true(is_true(m, "durable"));
	assert_int_equal(int_of(m, "sync_ms"), 12);
	struct cap_ctl_result r;
	void *owned;
	cap_rpc_result_parse(m, CAP_CTL_EXEC, &r, &owned);	/* what mcp reads from serve */
	assert_true(r.exit.flags & CAP_EXIT_DURABLE);
	assert_int_equal(r.exit.sync_ms, 12);
	free(owned);
	json_decref(m);

	/* write_file: CAP_FILE_NO_SYNC in the WRITE's limit. */
	m = rpc_tool(t, fd, 22, "write_file", "{" WHO ",\"path\":\"f\",\"content\":\"c\",\"durable\":false}",
		     (struct cap_exit){ .kind = CAP_EXIT_CODE }, &asked);
	assert_true(asked & CAP_FILE_NO_SYNC);
	assert_true(is_false(m, "durable"));
	json_decref(m);
	m = rpc_tool(t, fd, 23, "write_file", "{" WHO ",\"path\":\"f\",\"content\":\"c\"}",
		     (struct cap_exit){ .kind = CAP_EXIT_CODE, .flags = CAP_EXIT_DURABLE, .sync_ms = 4 }, &asked);
	assert_false(asked & CAP_FILE_NO_SYNC);
	assert_true(is_true(m, "durable"));
	assert_int_equal(int_of(m, "sync_ms"), 4);
	cap_rpc_result_parse(m, CAP_CTL_FILE, &r, &owned);
	assert_true(r.exit.flags & CAP_EXIT_DURABLE);
	free(owned);
	json_decref(m);

	/* upload: CAP_XFER_NO_SYNC to the transfer, its durable back. */
	rpc_send(fd, 24, "upload", "{" WHO ",\"path\":\"u\",\"content_base64\":\"aGk=\",\"durable\":false}");
	m = rpc_wait(t, fd, 24);
	assert_int_equal(t->f.x.flags, CAP_XFER_NO_SYNC);	/* one file, no flush */
	assert_true(is_false(m, "durable"));
	json_decref(m);
	rpc_send(fd, 25, "upload", "{" WHO ",\"path\":\"u\",\"content_base64\":\"aGk=\"}");
	m = rpc_wait(t, fd, 25);
	assert_int_equal(t->f.x.flags, 0);
	assert_true(is_true(m, "durable"));
	assert_int_equal(int_of(m, "sync_ms"), 3);
	cap_rpc_result_parse(m, CAP_CTL_XFER, &r, &owned);
	assert_true(r.xfer->durable);
	assert_int_equal(r.xfer->sync_ms, 3);
	free(owned);
	json_decref(m);
}

#undef WHO

/* --- recovery ----------------------------------------------------------------------------- */

static void recovery_reattaches_and_reaps(void **state)
{
	struct t *t = *state;
	premade(t, "live", "t-live", CAP_VM_RUNNING, true, false);
	premade(t, "dead", "t-dead", CAP_VM_STOPPED, false, false);
	premade(t, "boot", "t-boot", CAP_VM_RUNNING, false, false);	/* shim starting */
	open_ctl(t);
	assert_int_equal(t->f.attaches, 1);
	assert_int_equal(t->f.reaps, 1);
	assert_string_equal(t->f.reaped, "t-dead");
	assert_int_equal(t->f.njobs, 1);
	assert_string_equal(t->f.jobs[0].name, "t-boot");
	assert_int_equal(t->f.jobs[0].kind, CAP_CTL_JOB_WAIT);	/* waits, never starts */
	assert_false(t->f.jobs[0].create);
	assert_string_equal(state_of(t, "live"), "running");
	assert_true(status(t, "live").idle_ms >= 0);	/* in memory */
	assert_string_equal(state_of(t, "dead"), "stopped");
	assert_string_equal(state_of(t, "boot"), "starting");

	/* The reattached VM takes calls at once. */
	assert_non_null(submit_exec(t->c, &t->fe1, "live", "x", 1));
	UNTIL(t, t->f.nstarted == 1);
	assert_int_equal(t->f.njobs, 1);
	finish(t, "live", 0, "");
	UNTIL(t, got(&t->fe1, 1));
	job_report(t, "boot", 0, "", false, false);
	UNTIL(t, status(t, "boot").state == CAP_VM_RUNNING);
}

/* --- transfers ---------------------------------------------------------------------- */

static struct cap_ctl_call *submit_put(struct t *t, const char *agent, const char *path,
				       const char *data, unsigned mode, intptr_t tag)
{
	struct cap_ctl_req r = { .kind = CAP_CTL_XFER, .put = true, .root = "/work", .path = path,
				 .data = data, .len = strlen(data), .mode = mode };
	return cap_ctl_submit(t->c, t->fe1.h, agent, "p", &r, (void *)tag);
}

static struct cap_ctl_call *submit_get(struct t *t, const char *agent, const char *path,
				       const char *host, intptr_t tag)
{
	struct cap_ctl_req r = { .kind = CAP_CTL_XFER, .root = "/source", .path = path, .host = host };
	return cap_ctl_submit(t->c, t->fe1.h, agent, "p", &r, (void *)tag);
}

/* An upload of bytes: queued like any call, started with the VM, run by
 * the backend in a worker from a private temporary file with the mode
 * asked, named by the path's last component beneath its directory. */
static void upload_runs_in_a_worker(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	assert_non_null(submit_put(t, "a", "d/e/f.txt", "hello", 0750, 1));
	UNTIL(t, t->f.njobs == 1);
	assert_int_equal(xfer_calls(&t->f), 0);	/* the VM first */
	job_report(t, "a", 0, "", false, false);
	UNTIL_WAIT(t, 50, got(&t->fe1, 1));
	const struct got *g = must_get(&t->fe1, 1);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_int_equal(g->kind, CAP_CTL_XFER);
	assert_true(g->xfer);
	assert_int_equal(g->xfiles, 1);
	assert_int_equal(g->xbytes, 5);
	assert_false(g->import);
	assert_true(t->f.x.put);
	assert_string_equal(t->f.x.root, "/work");
	assert_string_equal(t->f.x.dest_dir, "d/e");
	assert_string_equal(t->f.x.dest_name, "f.txt");
	assert_string_equal(t->f.x.content, "hello");
	assert_int_equal(t->f.x.mode, 0750);
	assert_int_equal(t->f.x.flags, 0);	/* one file */
	struct stat st;
	assert_int_equal(stat(t->f.x.host, &st), -1);	/* the temporary copy is gone */
	assert_int_equal(status(t, "a").active, 0);

	/* A download names its host destination; a root-level upload has no
	 * directory part. */
	assert_non_null(submit_get(t, "a", "x/y", "/tmp/somewhere/new", 2));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_OK);
	assert_false(t->f.x.put);
	assert_string_equal(t->f.x.root, "/source");
	assert_string_equal(t->f.x.path, "x/y");
	assert_string_equal(t->f.x.host, "/tmp/somewhere/new");
	assert_int_equal(t->f.x.flags, CAP_XFER_RECURSIVE);
	assert_non_null(submit_put(t, "a", "top.txt", "hi", 0644, 3));
	UNTIL_WAIT(t, 50, got(&t->fe1, 3));
	assert_string_equal(t->f.x.dest_dir, "");
	assert_string_equal(t->f.x.dest_name, "top.txt");
	assert_int_equal(t->f.nstarted, 0);	/* no exec or FILE stream on the loop's connection */
}

/* A running transfer holds the identity's queue; cancel shuts its
 * connection down and answers it once the worker has let go; then the
 * queue moves on. */
static void cancel_ends_a_transfer(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.x.hold = true;
	struct cap_ctl_call *k = submit_get(t, "a", "big", "/tmp/x", 2);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "after", 3));
	UNTIL_WAIT(t, 50, xfer_holding(&t->f));
	settle(t);
	assert_null(got(&t->fe1, 2));
	assert_int_equal(t->f.nstarted, 1);	/* "after" waits */
	assert_int_equal(status(t, "a").active, 1);
	/* Idle transitions wait for it too. */
	advance(t, 120000);
	settle(t);
	assert_string_equal(state_of(t, "a"), "running");
	assert_true(cap_ctl_cancel(t->c, k));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_ECANCELLED);
	assert_false(xfer_holding(&t->f));
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "a", 0, "ok\n");
	UNTIL(t, got(&t->fe1, 3));
	assert_int_equal(must_get(&t->fe1, 3)->code, CAP_CTL_OK);
}

/* Shutdown ends a running transfer, and the loop returns only once its
 * worker is joined and the VM is down. */
static void shutdown_ends_a_transfer(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.x.hold = true;
	t->f.die_on_stop = true;
	assert_non_null(submit_get(t, "a", "big", "/tmp/x", 2));
	UNTIL_WAIT(t, 50, xfer_holding(&t->f));
	cap_ctl_shutdown(t->c, "test");
	UNTIL_WAIT(t, 50, step(t) == 0);
	assert_false(xfer_holding(&t->f));
	assert_int_equal(must_get(&t->fe1, 2)->code, CAP_CTL_ESANDBOX);
	assert_string_equal(state_of(t, "a"), "stopped");
}

/* The VM going away under a transfer fails it, once the worker let go. */
static void lost_vm_ends_a_transfer(void **state)
{
	struct t *t = *state;
	open_ctl(t);
	run_one(t, "a", 1);
	t->f.x.hold = true;
	assert_non_null(submit_get(t, "a", "big", "/tmp/x", 2));
	UNTIL_WAIT(t, 50, xfer_holding(&t->f));
	vm_lose(vm_of(t, "a"));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	const struct got *g = must_get(&t->fe1, 2);
	assert_int_equal(g->code, CAP_CTL_ESANDBOX);
	assert_non_null(strstr(g->msg, "hung up"));
	assert_string_equal(state_of(t, "a"), "stopped");
}

/* Private import: DIR/<agent>/<peer> goes into /work before the first
 * call of a new sandbox, links refused; the call carries the outcome
 * (refusals relative to the directory), the record notes it, and it
 * runs once. An identity without a directory is noted with nothing. */
static void private_import_runs_once(void **state)
{
	struct t *t = *state;
	char imp[128];
	snprintf(imp, sizeof(imp), "%s/imp", t->home);
	char *dir = xasprintf("%s/a/p", imp);
	assert_int_equal(cap_mkdir_p(dir, 0700), 0);
	t->cfg.private_import = imp;
	t->f.x.refuse_fifo = true;
	open_ctl(t);
	run_one(t, "a", 1);
	assert_int_equal(xfer_calls(&t->f), 1);
	assert_true(t->f.x.put);
	assert_string_equal(t->f.x.host, dir);
	assert_string_equal(t->f.x.root, "/work");
	assert_string_equal(t->f.x.dest_dir, "");
	assert_string_equal(t->f.x.dest_name, "");
	assert_int_equal(t->f.x.flags, CAP_XFER_RECURSIVE | CAP_XFER_NO_REPLACE | CAP_XFER_NO_LINKS);
	const struct got *g = must_get(&t->fe1, 1);
	assert_true(g->import);
	assert_int_equal(g->import_r, 0);
	assert_int_equal(g->import_files, 1);
	assert_string_equal(g->import_refused, "fifo: a FIFO, not copied");
	struct ctl_idrec_import note;
	assert_int_equal(ctl_idrec_read_import(t->home, "a", "p", &note), 0);
	assert_true(note.when > 0);
	assert_int_equal(note.refused, 1);
	assert_true(status(t, "a").imported > 0);
	run_one(t, "a", 2);
	assert_false(must_get(&t->fe1, 2)->import);
	assert_int_equal(xfer_calls(&t->f), 1);

	/* Stopped and started again: noted, so not again. */
	submit_kind(t, CAP_CTL_STOP, "a", 3);
	UNTIL(t, t->f.stops == 1);
	vm_die(vm_of(t, "a"));
	UNTIL(t, got(&t->fe1, 3));
	run_one(t, "a", 4);
	assert_int_equal(xfer_calls(&t->f), 1);
	assert_false(must_get(&t->fe1, 4)->import);

	/* No directory for b: nothing copied, nothing reported, noted. */
	run_one(t, "b", 5);
	assert_int_equal(xfer_calls(&t->f), 1);
	assert_false(must_get(&t->fe1, 5)->import);
	assert_int_equal(ctl_idrec_read_import(t->home, "b", "p", &note), 0);
	assert_true(note.when > 0 && note.absent);
	free(dir);
}

/* A failed import is reported with the call and not noted: it runs
 * again at the next start. A symbolic link on the way is refused. */
static void failed_import_runs_again(void **state)
{
	struct t *t = *state;
	char imp[128], link[200];
	snprintf(imp, sizeof(imp), "%s/imp", t->home);
	assert_int_equal(cap_mkdir_p(imp, 0700), 0);
	snprintf(link, sizeof(link), "%s/a", imp);
	assert_int_equal(symlink("/", link), 0);
	t->cfg.private_import = imp;
	open_ctl(t);
	run_one(t, "a", 1);
	const struct got *g = must_get(&t->fe1, 1);
	assert_true(g->import);
	assert_int_equal(g->import_r, -ELOOP);
	assert_int_equal(xfer_calls(&t->f), 0);	/* nothing was read through the link */
	struct ctl_idrec_import note;
	assert_int_equal(ctl_idrec_read_import(t->home, "a", "p", &note), 0);
	assert_int_equal(note.when, 0);
	run_one(t, "a", 2);	/* same start: tried once per start */
	assert_false(must_get(&t->fe1, 2)->import);
	submit_kind(t, CAP_CTL_STOP, "a", 3);
	UNTIL(t, t->f.stops == 1);
	vm_die(vm_of(t, "a"));
	UNTIL(t, got(&t->fe1, 3));
	run_one(t, "a", 4);
	assert_true(must_get(&t->fe1, 4)->import);
}

/* --- pure helpers: transfer directories, base64 ------------------------------------ */

static void path_within(void **state)
{
	(void)state;
	assert_true(cap_path_within("/a/b", "/a/b"));
	assert_true(cap_path_within("/a/b", "/a/b/c"));
	assert_false(cap_path_within("/a/b", "/a/bc"));
	assert_false(cap_path_within("/a/b", "/a"));
	assert_false(cap_path_within("/a/b", "/x/a/b"));
	assert_true(cap_path_within("/", "/anything"));
}

static void transfer_paths(void **state)
{
	struct t *t = *state;
	struct cap_err err = { 0 };
	char *in = xasprintf("%s/in", t->home), *out = xasprintf("%s/out", t->home);
	char *file = xasprintf("%s/in/f", t->home), *secret = xasprintf("%s/out/s", t->home);
	char *link = xasprintf("%s/in/l", t->home), *inner = xasprintf("%s/in/il", t->home);
	char *got = NULL, *p;
	assert_int_equal(cap_mkdir_p(in, 0700), 0);
	assert_int_equal(cap_mkdir_p(out, 0700), 0);
	assert_int_equal(cap_write_file_atomic(file, "x", 1, 0600), 0);
	assert_int_equal(cap_write_file_atomic(secret, "x", 1, 0600), 0);
	assert_int_equal(symlink(out, link), 0);	/* inside, pointing out */
	assert_int_equal(symlink("f", inner), 0);	/* inside, pointing inside */
	char **dirs;
	const char *given[] = { in };
	assert_int_equal(cap_transfer_dirs_resolve(given, 1, &dirs, &err), 0);
	const char *const *d = (const char *const *)dirs;
	const char *none[] = { file };
	char **bad;
	assert_int_equal(cap_transfer_dirs_resolve(none, 1, &bad, &err), -ENOTDIR);
	assert_non_null(strstr(err.msg, file));

	assert_int_equal(cap_transfer_source(d, 1, file, &got, &err), 0);
	assert_string_equal(got, file);
	free(got);
	assert_int_equal(cap_transfer_source(d, 1, inner, &got, &err), 0);
	assert_string_equal(got, file);	/* resolved */
	free(got);
	assert_int_equal(cap_transfer_source(d, 1, in, &got, &err), 0);	/* the directory itself */
	free(got);
	assert_int_equal(cap_transfer_source(d, 1, secret, &got, &err), -EACCES);
	p = xasprintf("%s/s", link);
	assert_int_equal(cap_transfer_source(d, 1, p, &got, &err), -EACCES);
	assert_non_null(strstr(err.msg, "resolves to"));
	free(p);
	p = xasprintf("%s/../out/s", in);
	assert_int_equal(cap_transfer_source(d, 1, p, &got, &err), -EACCES);
	free(p);
	assert_int_equal(cap_transfer_source(d, 1, "in/f", &got, &err), -EINVAL);
	assert_int_equal(cap_transfer_source(NULL, 0, file, &got, &err), -EACCES);

	p = xasprintf("%s/new", in);
	assert_int_equal(cap_transfer_dest(d, 1, p, &got, &err), 0);
	assert_string_equal(got, p);
	free(got);
	free(p);
	assert_int_equal(cap_transfer_dest(d, 1, file, &got, &err), -EEXIST);
	assert_int_equal(cap_transfer_dest(d, 1, inner, &got, &err), -EEXIST);	/* a link is there */
	p = xasprintf("%s/new", out);
	assert_int_equal(cap_transfer_dest(d, 1, p, &got, &err), -EACCES);
	free(p);
	p = xasprintf("%s/new", link);
	assert_int_equal(cap_transfer_dest(d, 1, p, &got, &err), -EACCES);
	free(p);
	p = xasprintf("%s/missing/new", in);
	assert_int_equal(cap_transfer_dest(d, 1, p, &got, &err), -ENOENT);
	free(p);
	p = xasprintf("%s/..", in);
	assert_int_equal(cap_transfer_dest(d, 1, p, &got, &err), -EINVAL);
	free(p);
	assert_int_equal(cap_transfer_dest(d, 1, "/", &got, &err), -EINVAL);
	assert_int_equal(cap_transfer_dest(d, 1, "rel", &got, &err), -EINVAL);
	cap_transfer_dirs_free(dirs);
	free(in);
	free(out);
	free(file);
	free(secret);
	free(link);
	free(inner);
}

static void base64_both_ways(void **state)
{
	(void)state;
	static const char *const vec[][2] = { { "", "" }, { "f", "Zg==" }, { "fo", "Zm8=" }, { "foo", "Zm9v" },
					      { "foob", "Zm9vYg==" }, { "fooba", "Zm9vYmE=" },
					      { "foobar", "Zm9vYmFy" } };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(vec); i++) {
		size_t n, bad;
		uint8_t *d;
		char *e = cap_base64_encode(vec[i][0], strlen(vec[i][0]), &n);
		assert_string_equal(e, vec[i][1]);
		assert_int_equal(cap_base64_decode(e, n, &d, &bad), (ssize_t)strlen(vec[i][0]));
		assert_memory_equal(d, vec[i][0], strlen(vec[i][0]));
		free(d);
		free(e);
	}
	uint8_t all[256], *d;
	size_t n, bad;
	for (int i = 0; i < 256; i++)
		all[i] = (uint8_t)i;
	char *e = cap_base64_encode(all, sizeof(all), &n);
	assert_int_equal(cap_base64_decode(e, n, &d, &bad), 256);
	assert_memory_equal(d, all, 256);
	free(d);
	free(e);
	static const char *const wrong[] = { "Zg=", "Zg=a", "Z===", "====", "Zm9v\n", "Zm 9", "Zg==Zg==", "Zm9-" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(wrong); i++)
		assert_int_equal(cap_base64_decode(wrong[i], strlen(wrong[i]), &d, &bad), -EINVAL);
	assert_int_equal(cap_base64_decode("Zm9-", 4, &d, &bad), -EINVAL);
	assert_int_equal(bad, 3);
}

/* --- diff and merge ---------------------------------------------------------------- */

static struct cap_ctl_call *submit_ws(struct t *t, enum cap_ctl_kind kind, const char *agent,
				      enum cap_merge_pick pick, bool dry, intptr_t tag)
{
	struct cap_ctl_req r = { .kind = kind, .pick = pick, .dry_run = dry };
	return cap_ctl_submit(t->c, t->fe1.h, agent, "p", &r, (void *)tag);
}

/* An identity with no sandbox gets none made for a diff or merge, and a
 * controller without a workspace directory refuses both. */
static void diff_and_merge_make_nothing(void **state)
{
	struct t *t = *state;
	t->cfg.workspace = "/tmp/capsule-test-project";
	open_ctl(t);
	assert_non_null(submit_ws(t, CAP_CTL_DIFF, "a", CAP_MERGE_REFUSE, false, 1));
	assert_non_null(submit_ws(t, CAP_CTL_MERGE, "a", CAP_MERGE_THEIRS, false, 2));
	UNTIL(t, got(&t->fe1, 1) && got(&t->fe1, 2));
	const struct got *g = must_get(&t->fe1, 1);
	assert_int_equal(g->code, CAP_CTL_ETOOL);
	assert_int_equal(g->kind, CAP_CTL_DIFF);
	assert_non_null(strstr(g->msg, "nothing to diff"));
	g = must_get(&t->fe1, 2);
	assert_int_equal(g->code, CAP_CTL_ETOOL);
	assert_non_null(strstr(g->msg, "nothing to merge"));
	settle(t);
	assert_int_equal(t->f.njobs, 0);	/* no sandbox made or started */
	assert_int_equal(xfer_calls(&t->f) + t->f.x.ws_calls, 0);
	assert_string_equal(state_of(t, "a"), "none");
	char rec[160];
	snprintf(rec, sizeof(rec), "%s/workspaces/a", t->home);
	assert_int_equal(access(rec, F_OK), -1);
	cap_ctl_free(t->c);

	/* Without cfg.workspace, even an identity with a sandbox. */
	t->cfg.workspace = NULL;
	open_ctl(t);
	run_one(t, "b", 3);
	assert_non_null(submit_ws(t, CAP_CTL_DIFF, "b", CAP_MERGE_REFUSE, false, 4));
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_ETOOL);
	assert_non_null(strstr(must_get(&t->fe1, 4)->msg, "--workspace"));
	assert_int_equal(t->f.x.ws_calls, 0);
}

/* A diff and a merge run in a worker like a transfer: typed changes, the
 * counts of a merge into cfg.workspace, conflicts refusing it (ETOOL,
 * listed), and a cancel while one runs. */
static void diff_and_merge_run_in_a_worker(void **state)
{
	struct t *t = *state;
	t->cfg.workspace = "/tmp/capsule-test-project";
	open_ctl(t);
	run_one(t, "a", 1);
	struct fxfer *fx = &t->f.x;
	fx->ws_base[0] = "a=1", fx->ws_base[1] = "b=1";
	fx->ws_ours[0] = "a=1", fx->ws_ours[1] = "b=2";
	fx->ws_theirs[0] = "a=3", fx->ws_theirs[1] = "b=3", fx->ws_theirs[2] = "c=3";
	assert_non_null(submit_ws(t, CAP_CTL_DIFF, "a", CAP_MERGE_REFUSE, false, 2));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	const struct got *g = must_get(&t->fe1, 2);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_int_equal(g->kind, CAP_CTL_DIFF);
	assert_string_equal(g->changes, "modified:a modified:b added:c ");
	assert_string_equal(fx->ws_name, sbname(t, "a").s);
	assert_false(fx->ws_merge);

	/* b changed on both sides: refused, listed, nothing written. */
	assert_non_null(submit_ws(t, CAP_CTL_MERGE, "a", CAP_MERGE_REFUSE, false, 3));
	UNTIL_WAIT(t, 50, got(&t->fe1, 3));
	g = must_get(&t->fe1, 3);
	assert_int_equal(g->code, CAP_CTL_ETOOL);
	assert_true(g->merge);
	assert_int_equal(g->nconflicts, 1);
	assert_string_equal(g->conflict, "b: changed on both sides");
	assert_non_null(strstr(g->msg, "nothing was written"));
	assert_non_null(strstr(g->msg, "pick"));
	assert_string_equal(fx->ws_into, "/tmp/capsule-test-project");
	assert_true(fx->ws_merge);

	/* pick theirs settles it: a, b and c written (a dry run says so). */
	assert_non_null(submit_ws(t, CAP_CTL_MERGE, "a", CAP_MERGE_THEIRS, true, 4));
	UNTIL_WAIT(t, 50, got(&t->fe1, 4));
	g = must_get(&t->fe1, 4);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_true(g->dry_run);
	assert_int_equal(g->mwritten, 3);
	assert_int_equal(g->nconflicts, 0);
	assert_string_equal(g->into, "/tmp/capsule-test-project");
	assert_int_equal(fx->ws_pick, CAP_MERGE_THEIRS);
	assert_true(fx->ws_dry);
	assert_int_equal(t->f.nstarted, 1);	/* only run_one's exec on the loop's connection */

	/* A running merge holds the queue; cancel ends it. */
	fx->hold = true;
	struct cap_ctl_call *k = submit_ws(t, CAP_CTL_MERGE, "a", CAP_MERGE_REFUSE, false, 5);
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "after", 6));
	UNTIL_WAIT(t, 50, xfer_holding(&t->f));
	settle(t);
	assert_int_equal(t->f.nstarted, 1);
	assert_true(cap_ctl_cancel(t->c, k));
	UNTIL_WAIT(t, 50, got(&t->fe1, 5));
	assert_int_equal(must_get(&t->fe1, 5)->code, CAP_CTL_ECANCELLED);
	UNTIL(t, t->f.nstarted == 2);
	finish(t, "a", 0, "ok\n");
	UNTIL(t, got(&t->fe1, 6));
}

/* --- preparation ----------------------------------------------------------------- */

static int prep_runs;
static bool prep_fail;
static int prep_hold;	/* while set, the fake preparation waits (atomics) */

/* A fake preparation in the worker: four phases, failing at the image
 * when prep_fail, else building the template. */
static int f_prepare(void *ud, const struct cap_prep_req *req, cap_prep_fn fn, void *fud,
		     struct cap_prep_cancel *cancel, struct cap_prep_out *out, struct cap_err *err)
{
	(void)ud, (void)req;
	__atomic_add_fetch(&prep_runs, 1, __ATOMIC_SEQ_CST);
	while (__atomic_load_n(&prep_hold, __ATOMIC_SEQ_CST)) {
		pthread_mutex_lock(&cancel->lock);
		bool gone = cancel->cancelled;
		pthread_mutex_unlock(&cancel->lock);
		if (gone)
			break;
		usleep(1000);
	}
	memset(out, 0, sizeof(*out));
	for (unsigned p = 0; p < CAP_PREP_NPHASES; p++) {
		struct cap_prep_event ev = { .phase = (enum cap_prep_phase)p, .status = CAP_PREP_BUILDING, .done = p,
					     .message = "" };
		fn(fud, &ev);
		if (prep_fail && p == CAP_PREP_IMAGE) {
			ev.status = CAP_PREP_FAILED;
			fn(fud, &ev);
			out->failed = CAP_PREP_IMAGE;
			return cap_err_set(err, ENOENT, "preparing the image: no image named 'x'");
		}
		ev.status = CAP_PREP_READY;
		ev.done = p + 1;
		fn(fud, &ev);
	}
	out->built = 1u << CAP_PREP_TEMPLATE;
	out->template_on = true;
	return 0;
}

/* The first tool call waits for the preparation (told its progress, no
 * sandbox started while it fails, the failure's phase in its result);
 * a PREPARE call after it retries and succeeds; then tool calls go
 * straight on. A fresh controller's first call carries what it built. */
static void first_call_prepares(void **state)
{
	struct t *t = *state;
	static struct cap_ctl_backend pb;
	pb = fake_backend;
	pb.prepare = f_prepare;
	t->cfg.backend = &pb;
	prep_runs = 0;
	prep_fail = true;
	open_ctl(t);
	assert_false(cap_ctl_prepared(t->c));
	assert_non_null(submit_exec(t->c, &t->fe1, "a", "hello", 1));
	UNTIL_WAIT(t, 50, got(&t->fe1, 1));
	const struct got *g = must_get(&t->fe1, 1);
	assert_int_equal(g->code, CAP_CTL_ESANDBOX);
	assert_true(g->prep);
	assert_int_equal(g->prep_failed, CAP_PREP_IMAGE);
	assert_non_null(strstr(g->msg, "image"));
	assert_int_equal(t->f.njobs, 0);	/* no sandbox made for it */
	assert_true(t->fe1.nprogress >= 6);
	assert_int_equal(t->fe1.progress_tag, 1);
	assert_false(cap_ctl_prepared(t->c));

	prep_fail = false;
	assert_non_null(cap_ctl_prepare_submit(t->c, t->fe1.h, (void *)2));
	UNTIL_WAIT(t, 50, got(&t->fe1, 2));
	g = must_get(&t->fe1, 2);
	assert_int_equal(g->code, CAP_CTL_OK);
	assert_int_equal(g->kind, CAP_CTL_PREPARE);
	assert_int_equal(g->prep_built, 1u << CAP_PREP_TEMPLATE);
	assert_int_equal(t->fe1.ready, 4);
	assert_true(cap_ctl_prepared(t->c));
	assert_int_equal(prep_runs, 2);

	run_one(t, "b", 3);	/* straight on: no preparation again */
	assert_int_equal(must_get(&t->fe1, 3)->prepared, 0);
	assert_int_equal(prep_runs, 2);
	cap_ctl_free(t->c);

	/* A fresh controller: its first call prepares and says what it built. */
	open_ctl(t);
	assert_non_null(submit_exec(t->c, &t->fe1, "c", "hello", 4));
	UNTIL_WAIT(t, 50, t->f.njobs >= 2 || status(t, "c").active == 1);
	if (status(t, "c").active != 1) {
		job_report(t, "c", 0, "", false, false);
		UNTIL_WAIT(t, 50, status(t, "c").active == 1);
	}
	finish(t, "c", 0, "ok\n");
	UNTIL(t, got(&t->fe1, 4));
	assert_int_equal(must_get(&t->fe1, 4)->code, CAP_CTL_OK);
	assert_int_equal(must_get(&t->fe1, 4)->prepared, 1u << CAP_PREP_TEMPLATE);
	assert_int_equal(prep_runs, 3);
}

/* A warm pool on an unprepared host: the controller prepares first and
 * starts no pool sandbox until that succeeded; then the pool fills. */
static void warm_pool_waits_for_the_preparation(void **state)
{
	struct t *t = *state;
	static struct cap_ctl_backend pb;
	pb = fake_backend;
	pb.prepare = f_prepare;
	t->cfg.backend = &pb;
	t->cfg.warm_pool = 1;
	prep_runs = 0;
	prep_fail = false;
	__atomic_store_n(&prep_hold, 1, __ATOMIC_SEQ_CST);
	open_ctl(t);
	UNTIL_WAIT(t, 10, __atomic_load_n(&prep_runs, __ATOMIC_SEQ_CST) == 1);
	settle(t);
	assert_int_equal(t->f.njobs, 0);	/* no pool sandbox while preparing */
	assert_false(cap_ctl_prepared(t->c));
	__atomic_store_n(&prep_hold, 0, __ATOMIC_SEQ_CST);
	UNTIL_WAIT(t, 50, cap_ctl_prepared(t->c));
	UNTIL(t, t->f.njobs == 1);
	assert_int_equal(strncmp(t->f.jobs[0].name, "pool-", 5), 0);
	assert_int_equal(prep_runs, 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(first_call_starts_the_sandbox, setup, teardown),
		cmocka_unit_test_setup_teardown(one_identity_in_order_two_concurrently, setup, teardown),
		cmocka_unit_test_setup_teardown(refused_call_ends_alone, setup, teardown),
		cmocka_unit_test_setup_teardown(idle_pause_waits_for_the_shim, setup, teardown),
		cmocka_unit_test_setup_teardown(pause_refused_stays_running, setup, teardown),
		cmocka_unit_test_setup_teardown(call_to_paused_vm_resumes_first, setup, teardown),
		cmocka_unit_test_setup_teardown(idle_stop_frees_the_identity, setup, teardown),
		cmocka_unit_test_setup_teardown(metrics_add_up_usage, setup, teardown),
		cmocka_unit_test_setup_teardown(capacity_evicts_the_idle_longest, setup, teardown),
		cmocka_unit_test_setup_teardown(one_eviction_per_newcomer, setup, teardown),
		cmocka_unit_test_setup_teardown(capacity_full_of_busy_fails_at_once, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_queued_and_running, setup, teardown),
		cmocka_unit_test_setup_teardown(stop_and_remove_of_stopped, setup, teardown),
		cmocka_unit_test_setup_teardown(remove_of_a_running_identity, setup, teardown),
		cmocka_unit_test_setup_teardown(stopped_once_the_shim_has_exited, setup, teardown),
		cmocka_unit_test_setup_teardown(failed_start_fails_the_queue, setup, teardown),
		cmocka_unit_test_setup_teardown(changed_public_data_restarts_first, setup, teardown),
		cmocka_unit_test_setup_teardown(second_controller_is_refused, setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_fails_queued_and_stops_vms, setup, teardown),
		cmocka_unit_test_setup_teardown(sigterm_shuts_down, setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_waits_for_a_remove, setup, teardown),
		cmocka_unit_test_setup_teardown(lost_vm_fails_the_running_call, setup, teardown),
		cmocka_unit_test_setup_teardown(call_during_a_pause_waits_for_the_answer, setup, teardown),
		cmocka_unit_test_setup_teardown(warm_pool_hands_over_a_started_vm, setup, teardown),
		cmocka_unit_test_setup_teardown(sized_identity_starts_with_its_size, setup, teardown),
		cmocka_unit_test_setup_teardown(results_go_to_the_submitting_front_end, setup, teardown),
		cmocka_unit_test_setup_teardown(file_calls_give_typed_results, setup, teardown),
		cmocka_unit_test_setup_teardown(serve_durable_param, setup, teardown),
		cmocka_unit_test_setup_teardown(recovery_reattaches_and_reaps, setup, teardown),
		cmocka_unit_test_setup_teardown(upload_runs_in_a_worker, setup, teardown),
		cmocka_unit_test_setup_teardown(cancel_ends_a_transfer, setup, teardown),
		cmocka_unit_test_setup_teardown(shutdown_ends_a_transfer, setup, teardown),
		cmocka_unit_test_setup_teardown(lost_vm_ends_a_transfer, setup, teardown),
		cmocka_unit_test_setup_teardown(private_import_runs_once, setup, teardown),
		cmocka_unit_test_setup_teardown(failed_import_runs_again, setup, teardown),
		cmocka_unit_test_setup_teardown(diff_and_merge_make_nothing, setup, teardown),
		cmocka_unit_test_setup_teardown(diff_and_merge_run_in_a_worker, setup, teardown),
		cmocka_unit_test(path_within),
		cmocka_unit_test_setup_teardown(transfer_paths, setup, teardown),
		cmocka_unit_test(base64_both_ways),
		cmocka_unit_test_setup_teardown(first_call_prepares, setup, teardown),
		cmocka_unit_test_setup_teardown(warm_pool_waits_for_the_preparation, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
