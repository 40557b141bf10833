/* The controller core: identities, their queues of calls, the idle
 * lifecycle, capacity, shutdown and recovery. One thread, one poll loop
 * that never waits on one identity: slow work runs in jobs (child
 * processes of the backend) and everything else is a request whose
 * answer the loop picks up. Sandboxes are run by their shims, which
 * outlive the controller, so a new controller reattaches them. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "controller-internal.h"
#include "engine.h"
#include "paths.h"
#include "sha256.h"
#include "store.h"
#include "util.h"
#include "xfer.h"

void cap_controller_cfg_init(struct cap_controller_cfg *c)
{
	memset(c, 0, sizeof(*c));
	cap_lifecycle_cfg_init(&c->lc);
	c->image = "base";
	c->stop_grace_ms = 10000;
	c->frontend = "serve";
}

bool cap_controller_id_valid(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n > 64 || s[0] == '.')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = s[i];
		if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
		      strchr("._@+=:-", c)))
			return false;
	}
	return true;
}

/* --- state ------------------------------------------------------------------ */

/* Shared between the loop (which cancels) and a worker thread (whose
 * backend names the descriptor a cancel shuts down). */
struct cap_ctl_xfer_watch {
	pthread_mutex_t lock;
	int fd;	/* -1: none yet (or any more) */
	bool cancelled;
};

/* A transfer or a private import, run in a worker thread: the thread
 * reads the inputs, writes the outputs, then signals efd; the loop reads
 * the outputs only after it has joined the thread. Nothing else is
 * shared: the thread never touches the controller. */
struct task {
	pthread_t thread;
	int efd;
	struct cap_ctl_xfer_watch w;
	const struct cap_ctl_backend *be;
	void *bud;
	/* inputs */
	bool import;	/* a private import of host into /work */
	bool ws;	/* a diff (or merge: ws_req.merge) of the workspace */
	struct cap_ctl_ws ws_req;	/* name points into name, into into owned_host */
	char name[CAP_NAME_MAX + 1];
	bool put;
	char root[16];
	char *owned_path;	/* put: where (relative; "" for the root); get: what */
	char *owned_host;	/* NULL for a put of data */
	const uint8_t *data;	/* borrowed from the call, which outlives the task */
	size_t len;
	unsigned mode;
	bool no_sync;	/* put: CAP_XFER_NO_SYNC */
	/* outputs */
	int r;
	bool absent;	/* import: the host directory does not exist */
	struct cap_err err;
	struct cap_xfer_result res;
	struct cap_ctl_ws_out ws_out;
};

/* An import's outcome until the call it goes with ends. */
struct import_report {
	struct cap_ctl_import pub;	/* points into the fields below */
	char *owned_from, *owned_msg;
	struct cap_xfer_result res;
};

struct cap_ctl_fe {
	const struct cap_ctl_frontend_ops *ops;
	void *fe;
	struct cap_ctl_fe *next;
};

struct ident;

struct cap_ctl_call {
	enum cap_ctl_kind kind;
	struct cap_ctl_fe *fe;
	void *tag;
	struct ident *ident;
	struct cap_exec_req req;	/* owned strings */
	uint8_t *owned_stdin;
	size_t stdin_len;
	struct cap_file_req file;	/* root, path and data point into the fields below */
	char root[16];
	char *owned_path;
	uint8_t *owned_data;
	uint32_t stream;
	bool cancelled;
	/* XFER */
	bool put;
	char *owned_host;
	size_t len;
	unsigned mode;
	bool no_sync;	/* put: CAP_XFER_NO_SYNC */
	/* MERGE */
	enum cap_merge_pick pick;
	bool dry_run;
	char why[1024];	/* the sandbox went away under it: what to answer */
	/* Answered by the host's deadline while the guest still holds the
	 * stream: kept (on ident->abandoned) until the guest or its VM lets
	 * go of it, since the VM's callbacks still point here. */
	bool abandoned;
	int64_t deadline;	/* real ms: the timeout plus the grace; 0: none */
	int64_t sent_ms;	/* real ms: when the command was sent (with a deadline) */
	bool syncing;	/* the guest is flushing its writes (SYNCING) */
	struct cap_buf out, err;
	/* Waiting for the controller's preparation (on ctl->prep_waiters),
	 * and what it built, for the result. */
	bool prep_wait;
	unsigned prep_built;
	struct cap_ctl_call *prep_next;
	struct cap_ctl_call *next;
};

enum vm_op { OP_NONE, OP_PAUSE, OP_RESUME };

struct ident {
	struct cap_ctl *ctl;
	char agent[65], peer[65];
	char name[CAP_NAME_MAX + 1];
	struct cap_lc lc;
	void *vm;	/* attached while running, paused, stopping */
	bool pool;	/* a warm-pool VM: no identity yet (agent and peer empty) */
	int source;	/* whether it projects public data: -1 not known yet */
	bool checked;	/* its public data was checked for the call at the queue's head */
	bool job;	/* a job runs for it (job_kind, job_fd, job_pid) */
	enum cap_ctl_job job_kind;
	int job_fd;
	pid_t job_pid;
	enum vm_op op;	/* asked of the shim, not answered yet */
	bool stop_after_start;
	int64_t stop_deadline;	/* real ms */
	/* Stopping: the VM is gone, the shim is still exiting (real ms). */
	int64_t exit_wait_until;
	bool killed;	/* its shim was killed for not stopping in time */
	/* A remove waiting for the shim to finish exiting (real ms). */
	int64_t remove_retry_at, remove_deadline;
	struct cap_ctl_call *queue;
	struct cap_ctl_call *active;
	struct cap_ctl_call *abandoned;
	/* The worker thread of the active XFER call, or of the private
	 * import (with no active call). */
	struct task *task;
	/* Private import: whether the record was looked at (and the import
	 * run if due) since the sandbox last started; the outcome waiting
	 * for a call to carry it. */
	bool import_checked;
	struct import_report *report;
	struct ident *next;
};

enum slot_kind { SLOT_SIGNAL, SLOT_FE, SLOT_VM, SLOT_JOB, SLOT_TASK, SLOT_PREP };

/* A progress event on its way from the preparation's worker to the loop. */
struct prep_ev {
	struct cap_prep_event ev;	/* message points to owned_msg */
	char *owned_msg;
	struct prep_ev *next;
};

/* The preparation running in a worker thread. The thread appends events
 * (under lock) and signals efd, and sets finished last; the loop reads
 * r, err and out only after it has joined the thread. */
struct prep_run {
	pthread_t thread;
	int efd;
	pthread_mutex_t lock;
	struct prep_ev *head, **tail;	/* not taken by the loop yet */
	bool finished;
	const struct cap_ctl_backend *be;
	void *bud;
	char *owned_image;
	struct cap_prep_req req;
	struct cap_prep_cancel cancel;
	int r;
	struct cap_err err;
	struct cap_prep_out out;
	/* The loop's: events told so far (not the lines), replayed to a
	 * call that joins later, so that each sees every phase. */
	struct prep_ev *log, **log_tail;
};

struct slot {
	enum slot_kind kind;
	void *p;	/* SLOT_FE: the front end; else the identity */
	void *tag;
};

struct cap_ctl_poll {
	struct pollfd *pfd;
	struct slot *slot;
	size_t n, cap;
	struct cap_ctl_fe *fe;	/* whose descriptors are being added */
};

struct cap_ctl {
	struct cap_controller_cfg cfg;
	const struct cap_ctl_backend *be;
	void *bud;
	char *home;
	int lock_fd, signal_fd;
	int64_t manual_now;	/* the manual clock */
	bool shutting_down;
	bool kick;	/* some queue may move */
	int64_t pool_retry_at;	/* real ms: warm-pool starts failed, wait till then */
	uint64_t seq;	/* orders idle_since updates (cap_lc.seq) */
	struct cap_ctl_fe *fes;
	struct ident *idents;
	struct cap_ctl_poll poll;
	/* Preparation: done once it succeeded; the run under way and the
	 * calls waiting for it (PREPARE calls and tool calls, in order). */
	bool prepared;
	struct prep_run *prep;
	struct cap_ctl_call *prep_waiters;
	struct cap_ctl_call *prep_queue;	/* PREPARE calls not taken yet (by next) */
};

const struct cap_controller_cfg *cap_ctl_cfg(const struct cap_ctl *c)
{
	return &c->cfg;
}

const char *cap_ctl_home(const struct cap_ctl *c)
{
	return c->home;
}

int64_t cap_ctl_now(const struct cap_ctl *c)
{
	return c->cfg.manual_clock ? c->manual_now : cap_now_ms();
}

int cap_ctl_advance(struct cap_ctl *c, int64_t ms, int64_t *now)
{
	if (!c->cfg.manual_clock)
		return -EPERM;
	c->manual_now += ms;
	c->kick = true;
	*now = c->manual_now;
	return 0;
}

/* i is idle from now on. */
static void set_idle(struct cap_ctl *c, struct cap_lc *lc)
{
	lc->idle_since = cap_ctl_now(c);
	lc->seq = ++c->seq;
}

/* --- the home lock ------------------------------------------------------------- */

static char *lock_path(const char *home)
{
	return xasprintf("%s/controller.lock", home);
}

static void read_holder(int fd, struct cap_ctl_holder *out)
{
	char text[512];
	ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
	memset(out, 0, sizeof(*out));
	text[n > 0 ? n : 0] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
		if (strncmp(line, "pid ", 4) == 0)
			out->pid = (pid_t)strtol(line + 4, NULL, 10);
		else if (strncmp(line, "frontend ", 9) == 0)
			snprintf(out->frontend, sizeof(out->frontend), "%s", line + 9);
		else if (strncmp(line, "socket ", 7) == 0)
			snprintf(out->socket, sizeof(out->socket), "%s", line + 7);
	}
}

int cap_ctl_holder(struct cap_ctl_holder *out)
{
	_cleanup_free_ char *home = cap_home_dir();
	_cleanup_free_ char *path = lock_path(home);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (flock(fd, LOCK_SH | LOCK_NB) == 0)
		return 0;	/* nobody holds it (closing fd drops ours) */
	if (errno != EWOULDBLOCK)
		return -errno;
	/* The holder writes its details right after taking the lock. */
	for (int i = 0; i < 50; i++) {
		read_holder(fd, out);
		if (out->pid > 0)
			break;
		usleep(10000);
	}
	return 1;
}

/* What others read of the holder: pid, front end, socket. */
static int write_holder(struct cap_ctl *c, const char *socket, struct cap_err *err)
{
	char text[512];
	int n = snprintf(text, sizeof(text), "pid %d\nfrontend %s\nsocket %s\n", (int)getpid(),
			 c->cfg.frontend ? c->cfg.frontend : "serve", socket ? socket : "");
	if (ftruncate(c->lock_fd, 0) < 0 || pwrite(c->lock_fd, text, (size_t)n, 0) != n)
		return cap_err_set(err, errno, "cannot write %s/controller.lock: %s", c->home, strerror(errno));
	return 0;
}

static int take_lock(struct cap_ctl *c, struct cap_err *err)
{
	_cleanup_free_ char *path = lock_path(c->home);
	c->lock_fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (c->lock_fd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	if (flock(c->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		struct cap_ctl_holder h;
		read_holder(c->lock_fd, &h);
		return cap_err_set(err, EBUSY,
				   "another controller owns %s: capsule %s, pid %d%s%s. One controller per CAPSULE_HOME: use that one (capsule mcp becomes its client by itself), stop it, or give this one another CAPSULE_HOME",
				   c->home, h.frontend[0] ? h.frontend : "serve or mcp", (int)h.pid,
				   h.socket[0] ? ", socket " : "", h.socket);
	}
	return write_holder(c, c->cfg.socket_path, err);
}

int cap_ctl_set_socket(struct cap_ctl *c, const char *path, struct cap_err *err)
{
	return write_holder(c, path, err);
}

/* --- identities ---------------------------------------------------------------- */

/* The sandbox of an identity is named by a hash of it: stable, short, and
 * never derived from anything a model writes. */
static void sandbox_name(const char *agent, const char *peer, char out[CAP_NAME_MAX + 1])
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, agent, strlen(agent) + 1);
	cap_sha256_update(&h, peer, strlen(peer) + 1);
	cap_sha256_final_hex(&h, hex);
	snprintf(out, CAP_NAME_MAX + 1, "v-%.20s", hex);
}

/* The sandbox an identity has or will have: the recorded one (a warm-pool
 * VM it was given), else the name derived from it. */
static void name_of(struct cap_ctl *c, const char *agent, const char *peer,
		    char out[CAP_NAME_MAX + 1])
{
	if (ctl_ws_read(c->home, agent, peer, out) < 0)
		sandbox_name(agent, peer, out);
}

static struct ident *find(struct cap_ctl *c, const char *agent, const char *peer)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (!i->pool && strcmp(i->agent, agent) == 0 && strcmp(i->peer, peer) == 0)
			return i;
	return NULL;
}

static struct ident *ident_new(struct cap_ctl *c, const char *agent, const char *peer,
			       const char *name)
{
	struct ident *i = xcalloc(1, sizeof(*i));
	snprintf(i->agent, sizeof(i->agent), "%s", agent);
	snprintf(i->peer, sizeof(i->peer), "%s", peer);
	snprintf(i->name, sizeof(i->name), "%s", name);
	i->ctl = c;
	i->lc.state = CAP_VM_NONE;
	set_idle(c, &i->lc);
	i->source = -1;
	i->job_fd = -1;
	i->next = c->idents;
	c->idents = i;
	return i;
}

static int begin_job(struct cap_ctl *c, struct ident *i, enum cap_ctl_job kind, bool create,
		     struct cap_err *err);

/* In memory while it has a VM, work or a job; otherwise only on disk. */
static struct ident *ident_get(struct cap_ctl *c, const char *agent, const char *peer)
{
	struct ident *i = find(c, agent, peer);
	if (i)
		return i;
	char name[CAP_NAME_MAX + 1];
	enum cap_vm_state st;
	bool serving, has_source;
	name_of(c, agent, peer, name);
	i = ident_new(c, agent, peer, name);
	if (c->be->state(c->bud, name, &st, &serving, &has_source) == 0) {
		i->lc.state = CAP_VM_STOPPED;
		i->source = has_source;
		struct cap_err err = { 0 };
		/* Running though not ours yet (started by `capsule start`, or
		 * its attachment failed): take it over, never report it stopped. */
		if (st != CAP_VM_STOPPED && begin_job(c, i, CAP_CTL_JOB_WAIT, false, &err) == 0)
			i->lc.state = CAP_VM_STARTING;
	}
	return i;
}

static void unlink_ident(struct cap_ctl *c, struct ident *x)
{
	for (struct ident **p = &c->idents; *p; p = &(*p)->next)
		if (*p == x) {
			*p = x->next;
			return;
		}
}

static bool idle_and_down(const struct ident *i)
{
	return !i->pool && (i->lc.state == CAP_VM_NONE || i->lc.state == CAP_VM_STOPPED) &&
	       !i->queue && !i->active && !i->job && !i->vm && !i->remove_retry_at &&
	       !i->exit_wait_until && !i->task && !i->report;
}

/* Identities with nothing resident and nothing to do live on disk only. */
static void sweep(struct cap_ctl *c)
{
	for (struct ident **p = &c->idents; *p;) {
		struct ident *i = *p;
		if (idle_and_down(i)) {
			*p = i->next;
			free(i);
		} else {
			p = &i->next;
		}
	}
}

/* --- calls ------------------------------------------------------------------------ */

static void call_free(struct cap_ctl_call *k)
{
	if (!k)
		return;
	for (uint32_t a = 0; a < k->req.argc; a++)
		free(k->req.argv[a]);
	free(k->req.argv);
	for (uint32_t a = 0; a < k->req.envc; a++)
		free(k->req.env[a]);
	free(k->req.env);
	free(k->req.cwd);
	free(k->owned_stdin);
	free(k->owned_path);
	free(k->owned_data);
	free(k->owned_host);
	cap_buf_fini(&k->out);
	cap_buf_fini(&k->err);
	free(k);
}

static uint8_t *dup_bytes(const void *p, size_t n)
{
	uint8_t *d = xmalloc(n ? n : 1);
	if (n)
		memcpy(d, p, n);
	return d;
}

static struct cap_ctl_call *call_new(const struct cap_ctl_req *r, struct cap_ctl_fe *fe, void *tag)
{
	struct cap_ctl_call *k = xcalloc(1, sizeof(*k));
	k->kind = r->kind;
	k->fe = fe;
	k->tag = tag;
	cap_buf_init(&k->out);
	cap_buf_init(&k->err);
	if (r->kind == CAP_CTL_EXEC) {
		const struct cap_exec_req *e = r->exec;
		k->req = *e;
		k->req.argv = xcalloc(e->argc + 1, sizeof(char *));
		for (uint32_t a = 0; a < e->argc; a++)
			k->req.argv[a] = xstrdup(e->argv[a]);
		k->req.env = xcalloc(e->envc + 1, sizeof(char *));
		for (uint32_t a = 0; a < e->envc; a++)
			k->req.env[a] = xstrdup(e->env[a]);
		k->req.cwd = e->cwd ? xstrdup(e->cwd) : NULL;
		if (r->stdin_data) {
			k->owned_stdin = dup_bytes(r->stdin_data, r->stdin_len);
			k->stdin_len = r->stdin_len;
			k->req.flags |= CAP_EXEC_STDIN;
		}
	} else if (r->kind == CAP_CTL_FILE) {
		snprintf(k->root, sizeof(k->root), "%s", r->root);
		k->owned_path = xstrdup(r->path);
		k->owned_data = dup_bytes(r->data, r->len);
		k->file = (struct cap_file_req){
			.op = r->op, .limit = r->limit ? r->limit : CAP_CTL_READ_MAX,
			.limit_entries = CAP_CTL_LIST_MAX, .root = k->root, .path = k->owned_path,
			.data = k->owned_data, .len = r->len,
		};
		if (r->op == CAP_FILE_WRITE && r->no_sync)
			k->file.limit |= CAP_FILE_NO_SYNC;
	} else if (r->kind == CAP_CTL_XFER) {
		snprintf(k->root, sizeof(k->root), "%s", r->root);
		k->owned_path = xstrdup(r->path);
		k->put = r->put;
		k->no_sync = r->put && r->no_sync;
		k->owned_host = r->host ? xstrdup(r->host) : NULL;
		if (r->put && !r->host) {
			k->owned_data = dup_bytes(r->data, r->len);
			k->len = r->len;
			k->mode = r->mode & 07777;
		}
	} else if (r->kind == CAP_CTL_MERGE) {
		k->pick = r->pick;
		k->dry_run = r->dry_run;
	}
	return k;
}

static void report_free(struct import_report *p)
{
	if (!p)
		return;
	free(p->owned_from);
	free(p->owned_msg);
	cap_xfer_result_fini(&p->res);
	free(p);
}

static bool is_ws(enum cap_ctl_kind kind)
{
	return kind == CAP_CTL_DIFF || kind == CAP_CTL_MERGE;
}

/* A call that runs in a worker thread (struct task). */
static bool in_worker(enum cap_ctl_kind kind)
{
	return kind == CAP_CTL_XFER || is_ws(kind);
}

static bool is_tool(enum cap_ctl_kind kind)
{
	return kind == CAP_CTL_EXEC || kind == CAP_CTL_FILE || in_worker(kind);
}

/* Hand the result to the call's front end and free the call. */
static void prep_unwait(struct cap_ctl *c, struct cap_ctl_call *k);

static void deliver(struct cap_ctl *c, struct cap_ctl_call *k, struct cap_ctl_result *r)
{
	struct import_report *rep = NULL;
	if (k->prep_wait)
		prep_unwait(c, k);
	if (is_tool(k->kind) && !r->prepared)
		r->prepared = k->prep_built;
	r->kind = k->kind;
	if (k->ident && !r->sandbox)
		r->sandbox = k->ident->name;
	if (k->ident && k->ident->report && is_tool(k->kind)) {
		/* The import that ran for this sandbox goes with the first
		 * call to end after it: the one that made the sandbox. */
		rep = k->ident->report;
		k->ident->report = NULL;
		r->import = &rep->pub;
	}
	k->fe->ops->done(k->fe->fe, c, k->tag, r);
	call_free(k);
	report_free(rep);
}

static void fail(struct cap_ctl *c, struct cap_ctl_call *k, enum cap_ctl_code code,
		 const char *msg, int errnum)
{
	struct cap_ctl_result r = { .code = code, .msg = msg, .errnum = errnum };
	deliver(c, k, &r);
}

static void unqueue(struct ident *i, struct cap_ctl_call *k)
{
	for (struct cap_ctl_call **p = &i->queue; *p; p = &(*p)->next)
		if (*p == k) {
			*p = k->next;
			i->lc.queued--;
			return;
		}
}

/* Fail everything queued for i with msg. */
static void fail_queue(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code, const char *msg)
{
	while (i->queue) {
		struct cap_ctl_call *k = i->queue;
		unqueue(i, k);
		fail(c, k, code, msg, 0);
	}
}

/* The active call ended: answer it and move the queue on. */
static void active_done(struct cap_ctl *c, struct ident *i, struct cap_ctl_result *r)
{
	struct cap_ctl_call *k = i->active;
	i->active = NULL;
	i->lc.active = 0;
	set_idle(c, &i->lc);
	c->kick = true;
	if (k)
		deliver(c, k, r);
}

static void active_fail(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code,
			const char *msg, int errnum)
{
	struct cap_ctl_result r = { .code = code, .msg = msg, .errnum = errnum };
	active_done(c, i, &r);
}

/* What a buffer holds, "" when empty (its head is NULL then). */
static const uint8_t *bytes(const struct cap_buf *b)
{
	return cap_buf_used(b) ? cap_buf_head(b) : (const uint8_t *)"";
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct cap_ctl_call *k = ud;
	(void)id;
	if (!k->abandoned)
		cap_buf_append(fd == 1 ? &k->out : &k->err, p, n);
}

/* The agent's listing lines ("d name", "f SIZE name", "l name") into
 * entries pointing into the text (which is modified). */
static struct cap_ctl_entry *parse_listing(char *text, size_t len, size_t *n)
{
	size_t cap = 16, k = 0;
	struct cap_ctl_entry *v = xcalloc(cap, sizeof(*v));
	char *end = text + len;
	for (char *line = text; line < end;) {
		char *nl = memchr(line, '\n', (size_t)(end - line));
		if (nl)
			*nl = '\0';
		else
			end[0] = '\0';	/* text has room for it (cap_buf) */
		if (line[0] && line[1] == ' ') {
			struct cap_ctl_entry e = { .type = strchr("dfl", line[0]) ? line[0] : 'o', .name = line + 2 };
			bool ok = true;
			if (line[0] == 'f') {
				char *sp = strchr(line + 2, ' ');
				ok = sp != NULL;
				if (ok) {
					*sp = '\0';
					e.size = strtoull(line + 2, NULL, 10);
					e.name = sp + 1;
				}
			}
			if (ok) {
				if (k == cap)
					v = xrealloc(v, (cap *= 2) * sizeof(*v));
				v[k++] = e;
			}
		}
		if (!nl)
			break;
		line = nl + 1;
	}
	*n = k;
	return v;
}

static void file_done(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k,
		      const struct cap_exit *ex)
{
	struct cap_ctl_result r = { .exit = *ex };
	if (ex->kind != CAP_EXIT_CODE) {
		/* The agent's message, without trailing newlines. */
		size_t n = CAP_MIN(cap_buf_used(&k->err), (size_t)800);
		char why[801];
		memcpy(why, cap_buf_head(&k->err), n);
		while (n > 0 && why[n - 1] == '\n')
			n--;
		why[n] = '\0';
		active_fail(c, i, CAP_CTL_ETOOL, *why ? why : "the file operation failed", ex->value);
		return;
	}
	if (k->file.op == CAP_FILE_WRITE) {
		r.written = k->file.len;
		active_done(c, i, &r);
		return;
	}
	if (ex->value == 1) {	/* a directory */
		cap_buf_append(&k->out, "", 1);	/* room for a terminator */
		size_t len = cap_buf_used(&k->out) - 1;
		struct cap_ctl_entry *v = parse_listing((char *)cap_buf_head(&k->out), len, &r.nentries);
		r.is_dir = true;
		r.entries = v;
		r.entries_truncated = (ex->flags & CAP_EXIT_TRUNCATED) != 0;
		active_done(c, i, &r);
		free(v);
		return;
	}
	r.content = bytes(&k->out);
	r.content_len = cap_buf_used(&k->out);
	active_done(c, i, &r);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	struct cap_ctl_call *k = ud;
	struct ident *i = k->ident;
	struct cap_ctl *c = i->ctl;
	(void)id;
	if (k->abandoned) {	/* answered already: the guest let go at last */
		for (struct cap_ctl_call **p = &i->abandoned; *p; p = &(*p)->next)
			if (*p == k) {
				*p = k->next;
				break;
			}
		call_free(k);
		return;
	}
	if (k->cancelled) {
		active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
		return;
	}
	if (!ex) {
		active_fail(c, i, CAP_CTL_ESANDBOX, msg, errnum);
		return;
	}
	if (k->kind == CAP_CTL_FILE) {
		file_done(c, i, k, ex);
		return;
	}
	struct cap_ctl_result r = {
		.exit = *ex,
		.out = bytes(&k->out),
		.out_len = cap_buf_used(&k->out),
		.err = bytes(&k->err),
		.err_len = cap_buf_used(&k->err),
	};
	active_done(c, i, &r);
}

/* The command ended and the guest is flushing its writes: the deadline
 * gives the flush its own time, so a command that wrote up to its
 * timeout is not cut off in its flush (and lost with a killed VM). */
static void on_syncing(void *ud, uint32_t id)
{
	struct cap_ctl_call *k = ud;
	(void)id;
	k->syncing = true;
	if (k->deadline)
		k->deadline = CAP_MAX(k->deadline, cap_now_ms() + CAP_SANDBOX_SYNC_GRACE_MS);
}

static const struct cap_exec_events events = { on_output, on_done, on_syncing };

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
static void task_abort(struct task *t)
{
	pthread_mutex_lock(&t->w.lock);
	t->w.cancelled = true;
	if (t->w.fd >= 0)
		shutdown(t->w.fd, SHUT_RDWR);
	pthread_mutex_unlock(&t->w.lock);
}

static void task_free(struct task *t)
{
	if (!t)
		return;
	if (t->efd >= 0)
		close(t->efd);
	pthread_mutex_destroy(&t->w.lock);
	free(t->owned_path);
	free(t->owned_host);
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
		.name = t->name, .put = true, .root = "/work", .dest_dir = "", .dest_name = "",
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
static struct task *task_join(struct ident *i)
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
	active_done(c, i, &r);
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
		struct ctl_ws_import note = {
			.when = (int64_t)time(NULL), .files = t->res.files, .dirs = t->res.dirs,
			.bytes = t->res.bytes, .conflicts = t->res.nconflicts, .refused = t->res.nrefused,
			.absent = t->absent,
		};
		if (ctl_ws_note_import(c->home, i->agent, i->peer, &note, &err) < 0)
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
	report_free(i->report);
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
	active_done(c, i, &r);
}

static void task_finished(struct cap_ctl *c, struct ident *i)
{
	uint64_t n;
	if (read(i->task->efd, &n, sizeof(n)) != sizeof(n))
		return;	/* not yet (a spurious wakeup) */
	struct task *t = task_join(i);
	c->kick = true;
	if (t->import)
		import_done(c, i, t);
	else if (t->ws)
		ws_done(c, i, t);
	else
		xfer_done(c, i, t);
	task_free(t);
}

/* Start the active XFER call k in a worker. */
static void begin_xfer(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->put = k->put;
	snprintf(t->root, sizeof(t->root), "%s", k->root);
	t->owned_path = xstrdup(k->owned_path);
	t->owned_host = k->owned_host ? xstrdup(k->owned_host) : NULL;
	t->data = k->owned_data;
	t->len = k->len;
	t->mode = k->mode;
	t->no_sync = k->no_sync;
	if (task_begin(i, t, &err) < 0) {
		task_free(t);
		active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
	}
}

/* Start the active DIFF or MERGE call k in a worker. */
static void begin_ws(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->ws = true;
	t->owned_host = xstrdup(c->cfg.workspace);
	t->ws_req = (struct cap_ctl_ws){
		.name = t->name, .merge = k->kind == CAP_CTL_MERGE, .into = t->owned_host, .pick = k->pick,
		.dry_run = k->dry_run,
	};
	if (task_begin(i, t, &err) < 0) {
		task_free(t);
		active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
	}
}

/* Whether the private import is due before i's next tool call: it is
 * configured, and i's record does not note that it ran. */
static bool import_due(struct cap_ctl *c, struct ident *i)
{
	if (!c->cfg.private_import || i->pool || i->import_checked)
		return false;
	struct ctl_ws_import note;
	if (ctl_ws_read_import(c->home, i->agent, i->peer, &note) == 0 && note.when > 0) {
		i->import_checked = true;
		return false;
	}
	return true;
}

/* Run the private import of i (its VM runs) in a worker; the queue waits
 * for it. A worker that cannot start is reported like a failed import. */
static void begin_import(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	struct task *t = task_new(c, i);
	t->import = true;
	t->put = true;
	snprintf(t->root, sizeof(t->root), "/work");
	t->owned_host = xasprintf("%s/%s/%s", c->cfg.private_import, i->agent, i->peer);
	if (task_begin(i, t, &err) == 0)
		return;
	t->r = err.code ? -err.code : -EIO;
	t->err = err;
	import_done(c, i, t);
	task_free(t);
}

/* --- preparation, in a worker thread ------------------------------------------------- */

static void prep_ev_free(struct prep_ev *e)
{
	while (e) {
		struct prep_ev *next = e->next;
		free(e->owned_msg);
		free(e);
		e = next;
	}
}

/* In the worker: queue an event for the loop. */
static void prep_event(void *ud, const struct cap_prep_event *ev)
{
	struct prep_run *p = ud;
	struct prep_ev *e = xcalloc(1, sizeof(*e));
	e->ev = *ev;
	e->owned_msg = xstrdup(ev->message ? ev->message : "");
	e->ev.message = e->owned_msg;
	pthread_mutex_lock(&p->lock);
	*p->tail = e;
	p->tail = &e->next;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	CAP_BUG_ON(write(p->efd, &one, sizeof(one)) != sizeof(one));
}

static void *prep_main(void *arg)
{
	struct prep_run *p = arg;
	p->r = p->be->prepare(p->bud, &p->req, prep_event, p, &p->cancel, &p->out, &p->err);
	pthread_mutex_lock(&p->lock);
	p->finished = true;
	pthread_mutex_unlock(&p->lock);
	uint64_t one = 1;
	CAP_BUG_ON(write(p->efd, &one, sizeof(one)) != sizeof(one));
	return NULL;
}

static void prep_free(struct prep_run *p)
{
	if (!p)
		return;
	if (p->efd >= 0)
		close(p->efd);
	pthread_mutex_destroy(&p->lock);
	cap_prep_cancel_fini(&p->cancel);
	prep_ev_free(p->head);
	prep_ev_free(p->log);
	free(p->owned_image);
	cap_prep_out_fini(&p->out);
	free(p);
}

static void prep_tell(struct cap_ctl *c, struct cap_ctl_call *k, const struct cap_prep_event *ev)
{
	if (k->fe->ops->progress)
		k->fe->ops->progress(k->fe->fe, c, k->tag, ev);
}

static void prep_unwait(struct cap_ctl *c, struct cap_ctl_call *k)
{
	for (struct cap_ctl_call **q = &c->prep_waiters; *q; q = &(*q)->prep_next)
		if (*q == k) {
			*q = k->prep_next;
			break;
		}
	k->prep_wait = false;
	k->prep_next = NULL;
}

/* The preparation ended (p->r): answer every call that waited for it. */
static void prep_finish(struct cap_ctl *c, struct prep_run *p)
{
	struct cap_ctl_call *w = c->prep_waiters;
	c->prep_waiters = NULL;
	c->prep = NULL;
	c->kick = true;
	if (p->r == 0)
		c->prepared = true;
	else if (c->cfg.warm_pool)
		c->pool_retry_at = cap_now_ms() + 30000;	/* not at once again for the pool */
	while (w) {
		struct cap_ctl_call *k = w;
		w = k->prep_next;
		k->prep_next = NULL;
		k->prep_wait = false;
		struct cap_ctl_result r = { .prep = &p->out };
		if (p->r < 0) {
			r.code = CAP_CTL_ESANDBOX;
			r.msg = p->err.msg[0] ? p->err.msg : strerror(-p->r);
			r.errnum = -p->r;
		}
		if (k->kind == CAP_CTL_PREPARE) {
			deliver(c, k, &r);
		} else if (p->r == 0) {
			k->prep_built = p->out.built;	/* it goes on; its result says so */
		} else {
			unqueue(k->ident, k);
			deliver(c, k, &r);
		}
	}
	prep_free(p);
}

static int prep_begin(struct cap_ctl *c, struct cap_err *err)
{
	struct prep_run *p = xcalloc(1, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
	cap_prep_cancel_init(&p->cancel);
	p->tail = &p->head;
	p->log_tail = &p->log;
	p->be = c->be;
	p->bud = c->bud;
	p->owned_image = xstrdup(c->cfg.image ? c->cfg.image : "base");
	p->req = (struct cap_prep_req){
		.image = p->owned_image, .workspace = c->cfg.workspace != NULL, .network = c->cfg.network,
	};
	p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
	int e = p->efd < 0 ? errno : pthread_create(&p->thread, NULL, prep_main, p);
	if (e) {
		prep_free(p);
		return cap_err_set(err, e, "cannot start the preparation's thread: %s", strerror(e));
	}
	c->prep = p;
	return 0;
}

/* k waits for the preparation: the one under way (k is told what it
 * said so far), or a new one. */
static void prep_join(struct cap_ctl *c, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	struct cap_ctl_call **q = &c->prep_waiters;
	while (*q)
		q = &(*q)->prep_next;
	*q = k;
	k->prep_wait = true;
	if (c->prep) {
		for (struct prep_ev *e = c->prep->log; e; e = e->next)
			prep_tell(c, k, &e->ev);
		return;
	}
	if (prep_begin(c, &err) == 0)
		return;
	/* Answered as a failed preparation of its first phase. */
	struct prep_run *p = xcalloc(1, sizeof(*p));
	pthread_mutex_init(&p->lock, NULL);
	cap_prep_cancel_init(&p->cancel);
	p->efd = -1;
	p->r = -err.code;
	p->err = err;
	p->out.failed = CAP_PREP_KERNEL;
	prep_finish(c, p);
}

/* The worker said something: tell the waiting calls; once it ended,
 * answer them. */
static void prep_ready(struct cap_ctl *c)
{
	struct prep_run *p = c->prep;
	uint64_t n;
	if (read(p->efd, &n, sizeof(n)) != sizeof(n))
		return;
	pthread_mutex_lock(&p->lock);
	struct prep_ev *e = p->head;
	p->head = NULL;
	p->tail = &p->head;
	bool finished = p->finished;
	pthread_mutex_unlock(&p->lock);
	while (e) {
		struct prep_ev *next = e->next;
		e->next = NULL;
		for (struct cap_ctl_call *k = c->prep_waiters; k; k = k->prep_next)
			prep_tell(c, k, &e->ev);
		if (e->ev.status == CAP_PREP_LINE) {
			prep_ev_free(e);
		} else {
			*p->log_tail = e;
			p->log_tail = &e->next;
		}
		e = next;
	}
	if (!finished)
		return;
	pthread_join(p->thread, NULL);
	prep_finish(c, p);
}

struct cap_ctl_call *cap_ctl_prepare_submit(struct cap_ctl *c, struct cap_ctl_fe *fe, void *tag)
{
	/* Never answered from in here: the loop takes it (prep_pump). */
	struct cap_ctl_req req = { .kind = CAP_CTL_PREPARE };
	struct cap_ctl_call *k = call_new(&req, fe, tag);
	struct cap_ctl_call **q = &c->prep_queue;
	while (*q)
		q = &(*q)->next;
	*q = k;
	c->kick = true;
	return k;
}

/* PREPARE calls submitted since the last round: each waits for the
 * preparation (a new one, or the one under way). */
static void prep_pump(struct cap_ctl *c)
{
	while (c->prep_queue) {
		struct cap_ctl_call *k = c->prep_queue;
		c->prep_queue = k->next;
		k->next = NULL;
		if (c->shutting_down) {
			fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
		} else if (!c->be->prepare) {
			struct cap_prep_out none = { .template_on = true };
			struct cap_ctl_result r = { .prep = &none };
			deliver(c, k, &r);
		} else {
			prep_join(c, k);
		}
	}
}

bool cap_ctl_prepared(const struct cap_ctl *c)
{
	return c->prepared;
}

/* --- the VM of an identity ----------------------------------------------------- */

static void free_abandoned(struct ident *i)
{
	while (i->abandoned) {
		struct cap_ctl_call *k = i->abandoned;
		i->abandoned = k->next;
		call_free(k);
	}
}

static void detach(struct cap_ctl *c, struct ident *i)
{
	if (i->vm)
		c->be->vm_free(i->vm);	/* no callback reaches a call after this */
	i->vm = NULL;
	i->op = OP_NONE;
	free_abandoned(i);
}

static int attach(struct cap_ctl *c, struct ident *i, struct cap_err *err)
{
	bool paused;
	int r = c->be->attach(c->bud, i->name, &i->vm, &paused, err);
	if (r < 0)
		return r;
	i->lc.state = paused ? CAP_VM_PAUSED : CAP_VM_RUNNING;
	return 0;
}

static void begin_stop(struct cap_ctl *c, struct ident *i)
{
	switch (i->lc.state) {
	case CAP_VM_STARTING:
		i->stop_after_start = true;
		return;
	case CAP_VM_RUNNING:
	case CAP_VM_PAUSED:
		if (i->vm) {
			c->be->stop(i->vm);
			i->op = OP_NONE;	/* an answer to a pause no longer matters */
			i->lc.state = CAP_VM_STOPPING;
			i->stop_deadline = cap_now_ms() + c->cfg.stop_grace_ms + 5000;
			return;
		}
		i->lc.state = CAP_VM_STOPPED;
		return;
	default:
		return;
	}
}

/* Remove i's sandbox (stopped) and its mapping. */
static int remove_sandbox(struct cap_ctl *c, struct ident *i, struct cap_err *err)
{
	enum cap_vm_state st;
	bool serving, has_source;
	if (c->be->state(c->bud, i->name, &st, &serving, &has_source) == 0) {
		int r = c->be->remove(c->bud, i->name, err);
		if (r < 0)
			return r;
	}
	ctl_ws_remove(c->home, i->agent, i->peer);
	i->lc.state = CAP_VM_NONE;
	/* An import report not handed out yet was about the sandbox gone;
	 * a new one imports again. */
	report_free(i->report);
	i->report = NULL;
	i->import_checked = false;
	cap_log(CAP_LOG_INFO, "removed %s (%s/%s) and its disks", i->name, i->agent, i->peer);
	return 0;
}

/* The active remove: delete the sandbox once its shim has exited (it
 * may still be closing up when its VM is already gone). */
static void try_remove(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	i->remove_retry_at = 0;
	int r = remove_sandbox(c, i, &err);
	if (r == -EBUSY && cap_now_ms() < i->remove_deadline) {
		i->remove_retry_at = cap_now_ms() + 20;
		return;
	}
	if (r < 0) {
		active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
		return;
	}
	struct cap_ctl_result res = { .state = "removed" };
	active_done(c, i, &res);
}

/* The VM of i is gone after a stop: finish a stop or remove under way. */
static void stopped(struct cap_ctl *c, struct ident *i)
{
	detach(c, i);
	i->lc.state = CAP_VM_STOPPED;
	set_idle(c, &i->lc);
	c->kick = true;
	struct cap_ctl_call *k = i->active;
	if (i->task) {
		/* A transfer, diff, merge or import ends with its connection;
		 * its call is answered when its worker has let go. */
		if (k && in_worker(k->kind) && !k->why[0])
			snprintf(k->why, sizeof(k->why), "the sandbox was stopped while the %s ran",
				 k->kind == CAP_CTL_XFER ? "transfer" : k->kind == CAP_CTL_DIFF ? "diff" : "merge");
		task_abort(i->task);
	} else if (k && (k->kind == CAP_CTL_EXEC || k->kind == CAP_CTL_FILE)) {
		if (k->cancelled)
			active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
		else
			active_fail(c, i, CAP_CTL_ESANDBOX, "the sandbox was stopped while the call ran", 0);
	} else if (k && k->kind == CAP_CTL_STOP) {
		struct cap_ctl_result r = { .state = "stopped" };
		active_done(c, i, &r);
	} else if (k && k->kind == CAP_CTL_REMOVE) {
		i->remove_deadline = cap_now_ms() + 10000;
		try_remove(c, i);
	}
}

/* A stopping VM is gone: its shim exits next (it reaps QEMU, then lets go
 * of its lock); stopped once it has, so that nothing sees a stopped
 * sandbox whose shim still runs. */
static void vm_down(struct cap_ctl *c, struct ident *i)
{
	detach(c, i);
	i->exit_wait_until = cap_now_ms() + 10000;
	c->kick = true;
}

/* The VM went away unasked (crash, kill, a stop by the source check). */
static void vm_lost(struct cap_ctl *c, struct ident *i, const char *why)
{
	bool expected = i->job && i->job_kind == CAP_CTL_JOB_CHECK;
	if (!expected)
		cap_log(CAP_LOG_WARN, "sandbox %s (%s/%s) went away: %s", i->name, i->agent, i->peer, why);
	detach(c, i);
	i->lc.state = CAP_VM_STOPPED;
	set_idle(c, &i->lc);
	if (i->task) {
		if (i->active && !i->active->why[0])
			snprintf(i->active->why, sizeof(i->active->why), "%s", why);
		task_abort(i->task);	/* answered when its worker ends */
	} else if (i->active && i->active->cancelled) {
		active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
	} else if (i->active) {
		active_fail(c, i, CAP_CTL_ESANDBOX, why, 0);
	}
	c->kick = true;
}

/* --- jobs ----------------------------------------------------------------------------- */

static int begin_job(struct cap_ctl *c, struct ident *i, enum cap_ctl_job kind, bool create,
		     struct cap_err *err)
{
	struct cap_ctl_job_req j = {
		.kind = kind, .name = i->name, .create = create,
		.image = c->cfg.image, .source = c->cfg.source, .network = c->cfg.network,
		.workspace = c->cfg.workspace,
	};
	int r = c->be->job_begin(c->bud, &j, &i->job_fd, &i->job_pid, err);
	if (r < 0)
		return r;
	i->job = true;
	i->job_kind = kind;
	return 0;
}

/* Start i's sandbox: create it first when it has none (the mapping is
 * written first: a crash after it leaves a known sandbox, never an orphan
 * disk), refresh its public data, start its shim. */
static int begin_start(struct cap_ctl *c, struct ident *i, struct cap_err *err)
{
	int r;
	if (i->lc.state == CAP_VM_NONE && !i->pool &&
	    (r = ctl_ws_write(c->home, i->agent, i->peer, i->name, err)) < 0)
		return r;
	if ((r = begin_job(c, i, CAP_CTL_JOB_START, true, err)) < 0)
		return r;
	i->lc.state = CAP_VM_STARTING;
	i->import_checked = false;	/* a crash before its note: it runs again */
	return 0;
}

static void start_done(struct cap_ctl *c, struct ident *i, const struct cap_ctl_job_out *out)
{
	struct cap_err err = { 0 };
	set_idle(c, &i->lc);
	if (out->r == 0)
		i->source = out->has_source;
	if (out->r == 0 && out->stopped) {
		/* Recovery waited for a shim that was exiting: it is gone. */
		i->lc.state = CAP_VM_STOPPED;
		i->stop_after_start = false;
		return;
	}
	if (out->r == 0 && attach(c, i, &err) < 0) {
		/* The shim runs and serves, but would not take us: never leave
		 * it running unowned. Stop it (its disks stay). */
		cap_log(CAP_LOG_WARN, "sandbox %s started but cannot be attached (%s); stopping its shim", i->name,
			err.msg);
		c->be->kill(c->bud, i->name);
		i->lc.state = CAP_VM_STOPPING;
		i->killed = true;
		i->exit_wait_until = cap_now_ms() + 10000;
		fail_queue(c, i, CAP_CTL_ESANDBOX, err.msg);
		return;
	}
	if (out->r < 0) {
		const char *why = out->msg;
		i->lc.state = CAP_VM_STOPPED;
		i->stop_after_start = false;
		if (i->pool) {	/* do not retry in a tight loop */
			cap_log(CAP_LOG_WARN, "warm sandbox %s did not start: %s", i->name, why);
			c->pool_retry_at = cap_now_ms() + 30000;
		} else {
			cap_log(CAP_LOG_WARN, "sandbox %s (%s/%s) did not start: %s", i->name, i->agent, i->peer, why);
		}
		fail_queue(c, i, CAP_CTL_ESANDBOX, why);
		return;
	}
	i->checked = true;	/* the start refreshed the public data */
	if (i->stop_after_start || c->shutting_down) {
		i->stop_after_start = false;
		begin_stop(c, i);
	}
}

static void check_done(struct cap_ctl *c, struct ident *i, const struct cap_ctl_job_out *out)
{
	if (out->r < 0) {
		/* The tree broke a rule (or vanished): the call fails, the
		 * sandbox and its disks are untouched. */
		i->checked = false;
		struct cap_ctl_call *k = i->queue;
		if (k && is_tool(k->kind)) {
			unqueue(i, k);
			fail(c, k, CAP_CTL_ESANDBOX, out->msg, -out->r);
		}
		return;
	}
	i->source = out->has_source;
	if (out->changed) {
		/* The job stopped the VM to rebuild its public data: start
		 * again with the same disks. */
		cap_log(CAP_LOG_INFO, "public data of %s changed: restarted with the new copy", i->name);
		detach(c, i);
		i->lc.state = CAP_VM_STOPPED;
		i->checked = false;
		return;
	}
	i->checked = true;
}

static void job_finished(struct cap_ctl *c, struct ident *i)
{
	struct cap_ctl_job_out out;
	c->be->job_end(c->bud, i->job_fd, i->job_pid, &out);
	i->job = false;
	i->job_fd = -1;
	i->job_pid = 0;
	c->kick = true;
	if (i->job_kind == CAP_CTL_JOB_CHECK)
		check_done(c, i, &out);
	else
		start_done(c, i, &out);
}

/* --- capacity and the warm pool ---------------------------------------------------- */

static unsigned count_resident(struct cap_ctl *c)
{
	unsigned n = 0;
	for (struct ident *i = c->idents; i; i = i->next)
		n += cap_vm_state_resident(i->lc.state);
	return n;
}

/* -1 room, 0 waiting for an eviction, -2 full of busy VMs. */
static int make_room(struct cap_ctl *c)
{
	size_t n = 0, cap = 16;
	const struct cap_lc **v = xmalloc(cap * sizeof(*v));
	struct ident **who = xmalloc(cap * sizeof(*who));
	bool stopping = false;
	for (struct ident *i = c->idents; i; i = i->next) {
		if (n == cap) {
			cap *= 2;
			v = xrealloc(v, cap * sizeof(*v));
			who = xrealloc(who, cap * sizeof(*who));
		}
		who[n] = i;
		v[n++] = &i->lc;
		stopping |= i->lc.state == CAP_VM_STOPPING;
	}
	int k = cap_lc_make_room(v, n, &c->cfg.lc);
	int r = k;
	if (k >= 0 && stopping) {
		r = 0;	/* a slot is being freed already: wait for it */
	} else if (k >= 0) {
		cap_log(CAP_LOG_INFO, "at capacity (%u); stopping %s, idle the longest", c->cfg.lc.capacity,
			who[k]->name);
		begin_stop(c, who[k]);
		r = 0;
	} else if (k == -2 && stopping) {
		r = 0;	/* an eviction is under way: wait for it */
	}
	free(v);
	free(who);
	return r;
}

static struct ident *pool_ready(struct cap_ctl *c)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (i->pool && i->vm && !i->job && i->op == OP_NONE &&
		    (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED))
			return i;
	return NULL;
}

/* Give identity i (which has no sandbox) the ready pool VM p. */
static int take_from_pool(struct cap_ctl *c, struct ident *i, struct ident *p, struct cap_err *err)
{
	int r = ctl_ws_write(c->home, i->agent, i->peer, p->name, err);	/* the mapping is the assignment */
	if (r < 0)
		return r;
	snprintf(i->name, sizeof(i->name), "%s", p->name);
	i->vm = p->vm;
	i->lc.state = p->lc.state;
	set_idle(c, &i->lc);
	i->source = p->source;
	i->checked = true;
	unlink_ident(c, p);
	free(p);
	cap_log(CAP_LOG_INFO, "%s/%s gets warm sandbox %s", i->agent, i->peer, i->name);
	return 0;
}

/* Keep cfg.warm_pool sandboxes starting or ready, within capacity. */
static void pool_fill(struct cap_ctl *c)
{
	if (c->shutting_down || !c->cfg.warm_pool || cap_now_ms() < c->pool_retry_at)
		return;
	if (!c->prepared) {
		/* No warm sandbox before the kernel, image and template are
		 * there: prepare first (the pool fills once that succeeded;
		 * a failure waits like a failed start). */
		struct cap_err err = { 0 };
		if (!c->prep && prep_begin(c, &err) < 0) {
			cap_log(CAP_LOG_WARN, "cannot prepare for the warm pool: %s", err.msg);
			c->pool_retry_at = cap_now_ms() + 30000;
		}
		return;
	}
	unsigned members = 0;
	for (struct ident *i = c->idents; i; i = i->next) {
		if (!i->pool)
			continue;
		members++;
		if (i->lc.state == CAP_VM_STOPPED && !i->job && count_resident(c) < c->cfg.lc.capacity) {
			struct cap_err err = { 0 };
			if (begin_start(c, i, &err) < 0) {
				cap_log(CAP_LOG_WARN, "warm sandbox %s: %s", i->name, err.msg);
				c->pool_retry_at = cap_now_ms() + 30000;
				return;
			}
		}
	}
	while (members < c->cfg.warm_pool && count_resident(c) < c->cfg.lc.capacity) {
		uint8_t rnd[8];
		char name[CAP_NAME_MAX + 1];
		struct cap_err err = { 0 };
		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
			return;
		snprintf(name, sizeof(name), "pool-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
			 rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
		struct ident *i = ident_new(c, "", "", name);
		i->pool = true;
		if (begin_start(c, i, &err) < 0) {
			cap_log(CAP_LOG_WARN, "cannot prepare a warm sandbox: %s", err.msg);
			unlink_ident(c, i);
			free(i);
			c->pool_retry_at = cap_now_ms() + 30000;
			return;
		}
		members++;
	}
}

/* --- running the queue --------------------------------------------------------------- */

static void start_call(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	unqueue(i, k);
	i->active = k;
	i->lc.active = 1;
	i->checked = false;	/* the next call checks the public data again */
	if (k->kind == CAP_CTL_STOP || k->kind == CAP_CTL_REMOVE) {
		begin_stop(c, i);
		return;	/* finished when the VM is gone (stopped) */
	}
	if (k->kind == CAP_CTL_XFER) {
		begin_xfer(c, i, k);
		return;	/* finished when its worker ends (task_finished) */
	}
	if (is_ws(k->kind)) {
		begin_ws(c, i, k);
		return;	/* likewise */
	}
	if (k->kind == CAP_CTL_EXEC && k->req.timeout_ms) {
		k->sent_ms = cap_now_ms();
		k->deadline = k->sent_ms + k->req.timeout_ms + CAP_SANDBOX_EXEC_GRACE_MS;
	}
	int r = k->kind == CAP_CTL_FILE
			? c->be->file(i->vm, &k->file, (k->file.limit & ~CAP_FILE_NO_SYNC) + CAP_CTL_LIST_MAX * 700 + 4096, &events, k,
				      &k->stream, &err)
			: c->be->exec(i->vm, &k->req, &events, k, &k->stream, &err);
	if (r < 0) {
		active_fail(c, i, err.code == EINVAL ? CAP_CTL_ETOOL : CAP_CTL_ESANDBOX, err.msg, err.code);
		return;
	}
	if (k->owned_stdin && k->kind == CAP_CTL_EXEC) {
		c->be->input(i->vm, k->stream, k->owned_stdin, k->stdin_len);
		c->be->input(i->vm, k->stream, NULL, 0);
	}
}

/* A stop or remove of an identity whose VM is not resident ends at once
 * (a remove as soon as a shim that is still exiting is gone). */
static void end_down(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	c->kick = true;
	if (k->kind == CAP_CTL_REMOVE && i->lc.state != CAP_VM_NONE) {
		unqueue(i, k);
		i->active = k;
		i->lc.active = 1;
		i->remove_deadline = cap_now_ms() + 10000;
		try_remove(c, i);
		return;
	}
	unqueue(i, k);
	if (k->kind == CAP_CTL_REMOVE)
		ctl_ws_remove(c->home, i->agent, i->peer);
	struct cap_ctl_result r = { .state = i->lc.state == CAP_VM_NONE ? "none" : "stopped" };
	deliver(c, k, &r);
}

/* Move one identity's queue forward as far as its VM allows. */
static void pump(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	if (c->shutting_down) {
		/* Tool calls are refused at once, whatever the VM is doing. */
		for (struct cap_ctl_call *k = i->queue, *next; k; k = next) {
			next = k->next;
			if (is_tool(k->kind)) {
				unqueue(i, k);
				fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
			}
		}
	}
	if (i->active || !i->queue || i->job || i->op != OP_NONE || i->task)
		return;
	struct cap_ctl_call *k = i->queue;
	bool tool = is_tool(k->kind);
	if (is_ws(k->kind) && (!c->cfg.workspace || i->lc.state == CAP_VM_NONE)) {
		/* Never a sandbox (or a workspace) made for a diff or merge. */
		char msg[400];
		const char *what = k->kind == CAP_CTL_DIFF ? "diff" : "merge";
		if (!c->cfg.workspace)
			snprintf(msg, sizeof(msg), "this controller has no workspace directory, so nothing to %s: start capsule serve with --workspace DIR",
				 what);
		else
			snprintf(msg, sizeof(msg), "identity %s/%s has no sandbox yet, so nothing to %s: its first tool call makes one, with its own copy of %s at /workspace",
				 i->agent, i->peer, what, c->cfg.workspace);
		unqueue(i, k);
		fail(c, k, CAP_CTL_ETOOL, msg, ENOENT);
		c->kick = true;
		return;
	}
	if (tool && !c->prepared && !c->shutting_down) {
		/* The first tool calls wait for the controller's preparation
		 * (docs/serve.md); once it succeeded nothing is looked at
		 * again here. */
		if (!k->prep_wait)
			prep_join(c, k);
		return;
	}
	switch (i->lc.state) {
	case CAP_VM_RUNNING:
	case CAP_VM_PAUSED:
		if (tool && i->source != 0 && !i->checked) {
			/* Public data changed? Checked (and rebuilt) in a job. */
			if (begin_job(c, i, CAP_CTL_JOB_CHECK, false, &err) < 0) {
				unqueue(i, k);
				fail(c, k, CAP_CTL_ESANDBOX, err.msg, err.code);
				c->kick = true;
			}
			return;
		}
		if (tool && i->lc.state == CAP_VM_PAUSED) {
			c->be->vm_op(i->vm, false);	/* answered in step_vm */
			i->op = OP_RESUME;
			return;
		}
		if (tool && import_due(c, i)) {
			begin_import(c, i);	/* the call starts once it ended */
			c->kick = true;
			return;
		}
		start_call(c, i, k);
		return;
	case CAP_VM_NONE:
	case CAP_VM_STOPPED:
		if (!tool) {
			end_down(c, i, k);
			return;
		}
		if (c->shutting_down) {
			unqueue(i, k);
			fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
			return;
		}
		struct ident *warm;
		enum cap_vm_state st;
		bool serving, has_source;
		if (i->lc.state == CAP_VM_NONE && (warm = pool_ready(c)) &&
		    c->be->state(c->bud, i->name, &st, &serving, &has_source) == -ENOENT &&
		    take_from_pool(c, i, warm, &err) == 0) {
			c->kick = true;	/* running now: the call starts next round */
			return;
		}
		switch (make_room(c)) {
		case -1:
			break;
		case 0:
			return;	/* wait for the eviction */
		default:
			unqueue(i, k);
			fail(c, k, CAP_CTL_ECAPACITY, "every sandbox slot is busy with running calls; retry later", 0);
			c->kick = true;
			return;
		}
		if (begin_start(c, i, &err) < 0) {
			unqueue(i, k);
			fail(c, k, CAP_CTL_ESANDBOX, err.msg, err.code);
			c->kick = true;
		}
		return;
	default:
		return;	/* starting or stopping: wait */
	}
}

/* The shim answered a pause or resume. */
static void op_answered(struct cap_ctl *c, struct ident *i, int result)
{
	enum vm_op op = i->op;
	i->op = OP_NONE;
	c->kick = true;
	if (result == 0) {
		i->lc.state = op == OP_PAUSE ? CAP_VM_PAUSED : CAP_VM_RUNNING;
		return;
	}
	if (op == OP_PAUSE) {
		/* Refused (commands still run in it): try again after another
		 * idle period. */
		cap_log(CAP_LOG_INFO, "%s was not paused: %s", i->name, strerror(-result));
		set_idle(c, &i->lc);
		return;
	}
	cap_log(CAP_LOG_WARN, "%s could not be resumed: %s", i->name, strerror(-result));
	if (i->queue) {
		struct cap_ctl_call *k = i->queue;
		unqueue(i, k);
		fail(c, k, CAP_CTL_ESANDBOX, "the sandbox could not be resumed; see its shim.log", -result);
	}
}

/* --- submitting, cancelling, asking ------------------------------------------------ */

struct cap_ctl_call *cap_ctl_submit(struct cap_ctl *c, struct cap_ctl_fe *fe,
				    const char *agent, const char *peer,
				    const struct cap_ctl_req *req, void *tag)
{
	/* Never answered from in here: the caller stores the handle first.
	 * During a shutdown the loop fails it (pump). */
	struct cap_ctl_call *k = call_new(req, fe, tag);
	struct ident *i = ident_get(c, agent, peer);
	k->ident = i;
	struct cap_ctl_call **p = &i->queue;
	while (*p)
		p = &(*p)->next;
	*p = k;
	i->lc.queued++;
	c->kick = true;
	return k;
}

bool cap_ctl_cancel(struct cap_ctl *c, struct cap_ctl_call *k)
{
	struct ident *i = k->ident;
	if (k->kind == CAP_CTL_PREPARE) {
		/* The preparation goes on for the others (and the server). */
		for (struct cap_ctl_call **q = &c->prep_queue; *q; q = &(*q)->next)
			if (*q == k) {
				*q = k->next;
				break;
			}
		fail(c, k, CAP_CTL_ECANCELLED, "request cancelled", 0);
		return true;
	}
	if (i->active == k) {
		if (k->kind == CAP_CTL_STOP || k->kind == CAP_CTL_REMOVE)
			return false;	/* a stop is not taken back */
		k->cancelled = true;
		if (in_worker(k->kind) && i->task)
			task_abort(i->task);	/* answered once its worker ended */
		else if (i->vm)
			c->be->signal(i->vm, k->stream, SIGKILL);
		return true;
	}
	unqueue(i, k);
	fail(c, k, CAP_CTL_ECANCELLED, "request cancelled", 0);
	c->kick = true;
	return true;
}

/* When the private import ran for an identity (0: not, or none set). */
static int64_t imported(struct cap_ctl *c, const char *agent, const char *peer)
{
	struct ctl_ws_import note;
	if (!c->cfg.private_import || !agent[0] || ctl_ws_read_import(c->home, agent, peer, &note) < 0)
		return 0;
	return note.when;
}

static void fill_status(struct cap_ctl *c, const struct ident *i, struct cap_ctl_status *out)
{
	snprintf(out->agent, sizeof(out->agent), "%s", i->agent);
	snprintf(out->peer, sizeof(out->peer), "%s", i->peer);
	snprintf(out->sandbox, sizeof(out->sandbox), "%s", i->lc.state == CAP_VM_NONE ? "" : i->name);
	out->state = i->lc.state;
	out->active = i->lc.active;
	out->queued = i->lc.queued;
	out->idle_ms = i->lc.active ? 0 : cap_ctl_now(c) - i->lc.idle_since;
	out->imported = imported(c, i->agent, i->peer);
}

/* The state of a sandbox no identity in memory has: from its shim. */
static void disk_status(struct cap_ctl *c, const char *agent, const char *peer, const char *name,
			struct cap_ctl_status *out)
{
	bool serving, has_source;
	memset(out, 0, sizeof(*out));
	snprintf(out->agent, sizeof(out->agent), "%s", agent);
	snprintf(out->peer, sizeof(out->peer), "%s", peer);
	out->idle_ms = -1;
	if (c->be->state(c->bud, name, &out->state, &serving, &has_source) < 0) {
		out->state = CAP_VM_NONE;
		return;
	}
	snprintf(out->sandbox, sizeof(out->sandbox), "%s", name);
	out->imported = imported(c, agent, peer);
}

void cap_ctl_status(struct cap_ctl *c, const char *agent, const char *peer,
		    struct cap_ctl_status *out)
{
	struct ident *i = find(c, agent, peer);
	if (i) {
		fill_status(c, i, out);
		return;
	}
	char name[CAP_NAME_MAX + 1];
	name_of(c, agent, peer, name);
	disk_status(c, agent, peer, name, out);
}

struct list_ctx {
	struct cap_ctl *c;
	void (*each)(void *ud, const struct cap_ctl_status *s);
	void *ud;
};

static void list_one(void *ud, const char *agent, const char *peer, const char *sandbox)
{
	struct list_ctx *l = ud;
	struct cap_ctl_status s;
	if (find(l->c, agent, peer))
		return;	/* listed from memory */
	disk_status(l->c, agent, peer, sandbox, &s);
	if (s.state != CAP_VM_NONE)
		l->each(l->ud, &s);
}

void cap_ctl_list(struct cap_ctl *c, void (*each)(void *ud, const struct cap_ctl_status *s),
		  void *ud, struct cap_ctl_pool_info *pool)
{
	struct cap_ctl_pool_info p = { .size = c->cfg.warm_pool };
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->pool) {
			p.members++;
			p.ready += i->vm && (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED);
		} else if (i->lc.state != CAP_VM_NONE) {
			struct cap_ctl_status s;
			fill_status(c, i, &s);
			each(ud, &s);
		}
	}
	struct list_ctx l = { c, each, ud };
	ctl_ws_each(c->home, list_one, &l);
	if (pool)
		*pool = p;
}

struct owner_ctx {
	const char *sandbox;
	char *agent, *peer;
	bool found;
};

static void owner_one(void *ud, const char *agent, const char *peer, const char *sandbox)
{
	struct owner_ctx *o = ud;
	if (!o->found && strcmp(sandbox, o->sandbox) == 0) {
		snprintf(o->agent, 65, "%s", agent);
		snprintf(o->peer, 65, "%s", peer);
		o->found = true;
	}
}

int cap_ctl_identity_of(struct cap_ctl *c, const char *sandbox, char agent[65], char peer[65])
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (!i->pool && strcmp(i->name, sandbox) == 0 && i->lc.state != CAP_VM_NONE) {
			snprintf(agent, 65, "%s", i->agent);
			snprintf(peer, 65, "%s", i->peer);
			return 0;
		}
	struct owner_ctx o = { sandbox, agent, peer, false };
	ctl_ws_each(c->home, owner_one, &o);
	return o.found ? 0 : -ENOENT;
}

/* --- recovery -------------------------------------------------------------------------- */

/* Take back a sandbox a predecessor ran: a serving shim is reattached, a
 * starting one waited for (in a job), a dead one's leftovers cleaned. */
static void recover_one(struct cap_ctl *c, const char *agent, const char *peer, const char *name,
			bool pool)
{
	enum cap_vm_state st;
	bool serving, has_source;
	struct cap_err err = { 0 };
	if (c->be->state(c->bud, name, &st, &serving, &has_source) < 0)
		return;	/* a mapping whose sandbox was never made */
	if (st == CAP_VM_STOPPED) {
		c->be->reap(c->bud, name);
		if (!pool)
			return;	/* on disk only, until a call needs it */
	}
	struct ident *i = ident_new(c, agent, peer, name);
	i->pool = pool;
	i->source = has_source;
	i->lc.state = CAP_VM_STOPPED;
	if (st == CAP_VM_STOPPED)
		return;
	if (serving && attach(c, i, &err) == 0) {
		cap_log(CAP_LOG_INFO, "reattached %s (%s%s%s, %s)", name, pool ? "warm pool" : agent,
			pool ? "" : "/", peer, cap_vm_state_name(i->lc.state));
		return;
	}
	/* Its shim is starting (a controller died while starting it) or
	 * exiting (while stopping it): a job waits to see which; it never
	 * starts one again. */
	if (begin_job(c, i, CAP_CTL_JOB_WAIT, false, &err) < 0) {
		cap_log(CAP_LOG_WARN, "cannot take back %s: %s", name, err.msg);
		return;
	}
	i->lc.state = CAP_VM_STARTING;
	cap_log(CAP_LOG_INFO, "%s (%s/%s) is starting; waiting for it", name, agent, peer);
}

static void recover_ws(void *ud, const char *agent, const char *peer, const char *sandbox)
{
	recover_one(ud, agent, peer, sandbox, false);
}

static void jail_found(void *ud, const char *what)
{
	(void)ud;
	cap_log(CAP_LOG_INFO, "%s", what);
}

static void recover(struct cap_ctl *c)
{
	if (c->be == &ctl_named_backend)
		cap_jail_sweep(jail_found, NULL);
	ctl_ws_each(c->home, recover_ws, c);

	/* Warm-pool sandboxes nobody was given: members again. */
	char **names;
	size_t n;
	if (c->be != &ctl_named_backend)
		return;
	cap_named_list(&names, &n);
	for (size_t k = 0; k < n; k++) {
		bool taken = strncmp(names[k], "pool-", 5) != 0;
		char agent[65], peer[65];
		if (!taken)
			taken = cap_ctl_identity_of(c, names[k], agent, peer) == 0;
		if (!taken && c->cfg.warm_pool)
			recover_one(c, "", "", names[k], true);
		free(names[k]);
	}
	free(names);
}

/* --- the loop ------------------------------------------------------------------------------ */

/* Lifecycle transitions due now. */
static void lifecycle(struct cap_ctl *c)
{
	int64_t now = cap_ctl_now(c);
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->pool || i->job || i->op != OP_NONE || i->task)
			continue;	/* pool VMs are kept ready, not idle; a task
					 * (a private import whose call went away)
					 * is work, never paused under it */
		switch (cap_lc_due(&i->lc, &c->cfg.lc, now)) {
		case CAP_LC_PAUSE:
			if (i->vm && i->lc.state == CAP_VM_RUNNING) {
				c->be->vm_op(i->vm, true);	/* PAUSED once the shim says so */
				i->op = OP_PAUSE;
			}
			break;
		case CAP_LC_STOP:
			begin_stop(c, i);
			break;
		case CAP_LC_NONE:
			break;
		}
	}
}

/* A command the guest did not end within its timeout plus the grace:
 * answered now as timed out, and its sandbox stopped (the disks stay;
 * the next call starts it again). The guest is not trusted to end what
 * it was told to. */
static void deadlines(struct cap_ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next) {
		struct cap_ctl_call *k = i->active;
		if (!k || !k->deadline || real < k->deadline || k->abandoned)
			continue;
		char note[240];
		if (k->syncing)
			snprintf(note, sizeof(note),
				 "the guest did not finish flushing the command's writes within %d s; its VM was killed (disks kept, the latest writes may be lost) and starts again on the next call",
				 CAP_SANDBOX_SYNC_GRACE_MS / 1000);
		else
			snprintf(note, sizeof(note),
				 "the guest did not end the command within its timeout (%u s) and %d s more; its VM was killed (disks kept) and starts again on the next call",
				 k->req.timeout_ms / 1000, CAP_SANDBOX_EXEC_GRACE_MS / 1000);
		cap_log(CAP_LOG_WARN, "sandbox %s (%s/%s): %s", i->name, i->agent, i->peer, note);
		struct cap_ctl_result r = {
			.exit = { .kind = CAP_EXIT_SIGNAL, .value = SIGKILL, .flags = CAP_EXIT_TIMED_OUT,
				  .duration_ms = (uint32_t)(real - k->sent_ms) },
			.out = bytes(&k->out),
			.out_len = cap_buf_used(&k->out),
			.err = bytes(&k->err),
			.err_len = cap_buf_used(&k->err),
			.note = note,
			.kind = k->kind,
			.sandbox = i->name,
		};
		k->fe->ops->done(k->fe->fe, c, k->tag, &r);
		k->abandoned = true;
		k->next = i->abandoned;
		i->abandoned = k;
		i->active = NULL;
		i->lc.active = 0;
		set_idle(c, &i->lc);
		/* The guest no longer answers: asking it to stop would wait
		 * on it for nothing. Its shim is killed; its disks stay. */
		c->be->kill(c->bud, i->name);
		i->killed = true;
		i->lc.state = CAP_VM_STOPPING;
		vm_down(c, i);
	}
}

static void retry_removes(struct cap_ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next)
		if (i->remove_retry_at && real >= i->remove_retry_at)
			try_remove(c, i);
}

/* Stopping takes too long: kill the shim (its QEMU dies with it). */
static void stop_overdue(struct cap_ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->lc.state != CAP_VM_STOPPING || i->killed || i->exit_wait_until || real < i->stop_deadline)
			continue;
		cap_log(CAP_LOG_WARN, "%s did not stop in time; killing its shim", i->name);
		c->be->kill(c->bud, i->name);
		i->killed = true;
		vm_down(c, i);
	}
}

/* Stopping VMs whose shims are exiting: stopped once they are gone. */
static void check_exits(struct cap_ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next) {
		if (!i->exit_wait_until)
			continue;
		enum cap_vm_state st;
		bool serving, has_source;
		bool gone = c->be->state(c->bud, i->name, &st, &serving, &has_source) < 0 || st == CAP_VM_STOPPED;
		if (!gone && real < i->exit_wait_until)
			continue;
		if (!gone && !i->killed) {
			cap_log(CAP_LOG_WARN, "the shim of %s did not exit after stopping its VM; killing it", i->name);
			c->be->kill(c->bud, i->name);
			i->killed = true;
			i->exit_wait_until = real + 2000;
			continue;
		}
		if (!gone)
			cap_log(CAP_LOG_WARN, "the shim of %s is still there after SIGKILL; taken as stopped", i->name);
		i->exit_wait_until = 0;
		i->killed = false;
		stopped(c, i);
	}
}

static int next_timeout(struct cap_ctl *c)
{
	int64_t real = cap_now_ms(), next = INT64_MAX;
	for (struct ident *i = c->idents; i; i = i->next) {
		if (!c->cfg.manual_clock) {
			int64_t t = cap_lc_next(&i->lc, &c->cfg.lc);
			if (t != INT64_MAX && t < next)
				next = t;
		}
		if (i->lc.state == CAP_VM_STOPPING && i->stop_deadline < next)
			next = i->stop_deadline;
		if (i->remove_retry_at && i->remove_retry_at < next)
			next = i->remove_retry_at;
		if (i->exit_wait_until && real + 20 < next)
			next = real + 20;	/* look again soon */
		if (i->active && i->active->deadline && !i->active->abandoned && i->active->deadline < next)
			next = i->active->deadline;
	}
	if (c->cfg.warm_pool && c->pool_retry_at > real && c->pool_retry_at < next)
		next = c->pool_retry_at;
	if (next == INT64_MAX)
		return -1;
	return next <= real ? 0 : (int)CAP_MIN(next - real, (int64_t)60000);
}

static bool busy(struct cap_ctl *c)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (cap_vm_state_resident(i->lc.state) || i->job || i->remove_retry_at || i->queue || i->task)
			return true;
	return c->prep || c->prep_queue;
}

void cap_ctl_shutdown(struct cap_ctl *c, const char *why)
{
	if (c->shutting_down)
		return;
	cap_log(CAP_LOG_INFO, "%s: stopping every sandbox", why);
	c->shutting_down = true;
	for (struct cap_ctl_fe *f = c->fes; f; f = f->next)
		if (f->ops->shutdown)
			f->ops->shutdown(f->fe, c);
	if (c->prep)
		cap_prep_cancel_request(&c->prep->cancel);	/* its waiters are answered when it ends */
	for (struct ident *i = c->idents; i; i = i->next) {
		fail_queue(c, i, CAP_CTL_ESANDBOX, "the controller is shutting down");
		if (i->task)
			task_abort(i->task);	/* transfers end now, imports too */
		if (cap_vm_state_resident(i->lc.state))
			begin_stop(c, i);
	}
	c->kick = true;
}

void cap_ctl_poll_add(struct cap_ctl_poll *p, int fd, short events, void *tag)
{
	if (p->n == p->cap) {
		p->cap = p->cap ? p->cap * 2 : 64;
		p->pfd = xrealloc(p->pfd, p->cap * sizeof(*p->pfd));
		p->slot = xrealloc(p->slot, p->cap * sizeof(*p->slot));
	}
	p->pfd[p->n] = (struct pollfd){ .fd = fd, .events = events };
	p->slot[p->n] = (struct slot){ SLOT_FE, p->fe, tag };
	p->n++;
}

static void add_slot(struct cap_ctl_poll *p, int fd, short events, enum slot_kind kind, void *ptr)
{
	cap_ctl_poll_add(p, fd, events, NULL);
	p->slot[p->n - 1] = (struct slot){ kind, ptr, NULL };
}

static void step_vm(struct cap_ctl *c, struct ident *i, const struct pollfd *pfd)
{
	struct cap_err err = { 0 };
	if (!i->vm)
		return;
	int r = c->be->dispatch(i->vm, pfd, &err);
	if (i->lc.state == CAP_VM_STOPPING) {
		if (r < 0 || c->be->dead(i->vm))
			vm_down(c, i);
		return;
	}
	if (r < 0) {
		vm_lost(c, i, err.msg);
		return;
	}
	int result;
	if (i->op != OP_NONE && c->be->vm_op_done(i->vm, &result))
		op_answered(c, i, result);
}

void cap_ctl_start(struct cap_ctl *c)
{
	recover(c);
	cap_log(CAP_LOG_INFO, "ready (capacity %u, idle pause %lld ms, idle stop %lld ms%s)",
		c->cfg.lc.capacity, (long long)c->cfg.lc.idle_pause_ms, (long long)c->cfg.lc.idle_stop_ms,
		c->cfg.manual_clock ? ", manual clock" : "");
}

int cap_ctl_step(struct cap_ctl *c, int max_wait_ms, struct cap_err *err)
{
	struct cap_ctl_poll *p = &c->poll;
	for (;;) {
		while (c->kick) {
			c->kick = false;
			prep_pump(c);
			for (struct ident *i = c->idents; i; i = i->next)
				pump(c, i);
		}
		pool_fill(c);
		if (!c->shutting_down)
			lifecycle(c);
		deadlines(c);
		stop_overdue(c);
		check_exits(c);
		retry_removes(c);
		sweep(c);
		if (!c->kick)
			break;
	}
	if (c->shutting_down && !busy(c)) {
		for (struct cap_ctl_fe *f = c->fes; f; f = f->next)
			if (f->ops->flush)
				f->ops->flush(f->fe, c);
		return 0;
	}

	p->n = 0;
	add_slot(p, c->signal_fd, POLLIN, SLOT_SIGNAL, NULL);
	for (struct cap_ctl_fe *f = c->fes; f; f = f->next) {
		p->fe = f;
		f->ops->pollfds(f->fe, c, p);
	}
	if (c->prep)
		add_slot(p, c->prep->efd, POLLIN, SLOT_PREP, NULL);
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->job)
			add_slot(p, i->job_fd, POLLIN, SLOT_JOB, i);
		if (i->task)
			add_slot(p, i->task->efd, POLLIN, SLOT_TASK, i);
		if (i->vm) {
			struct pollfd v[CAP_CTL_VM_NPOLL];
			c->be->pollfds(i->vm, v);
			for (int k = 0; k < CAP_CTL_VM_NPOLL; k++)
				add_slot(p, v[k].fd, v[k].events, SLOT_VM, i);
		}
	}
	int timeout = next_timeout(c);
	if (max_wait_ms >= 0 && (timeout < 0 || timeout > max_wait_ms))
		timeout = max_wait_ms;
	if (poll(p->pfd, (nfds_t)p->n, timeout) < 0 && errno != EINTR)
		return cap_err_set(err, errno, "poll: %s", strerror(errno));
	for (size_t k = 0; k < p->n; k++) {
		struct slot *s = &p->slot[k];
		short rev = p->pfd[k].revents;
		if (s->kind == SLOT_VM) {
			/* Both of a VM's descriptors go to it at once. */
			struct ident *i = s->p;
			if (rev || p->pfd[k + 1].revents)
				step_vm(c, i, &p->pfd[k]);
			k += CAP_CTL_VM_NPOLL - 1;
			continue;
		}
		if (!rev)
			continue;
		if (s->kind == SLOT_SIGNAL) {
			struct signalfd_siginfo si;
			while (read(c->signal_fd, &si, sizeof(si)) == sizeof(si))
				cap_ctl_shutdown(c, strsignal((int)si.ssi_signo));
		} else if (s->kind == SLOT_FE) {
			struct cap_ctl_fe *f = s->p;
			f->ops->ready(f->fe, c, s->tag, rev);
		} else if (s->kind == SLOT_JOB) {
			job_finished(c, s->p);
		} else if (s->kind == SLOT_TASK) {
			struct ident *i = s->p;
			if (i->task)
				task_finished(c, i);
		} else if (s->kind == SLOT_PREP) {
			if (c->prep)
				prep_ready(c);
		}
	}
	for (struct cap_ctl_fe *f = c->fes; f; f = f->next)
		if (f->ops->flush)
			f->ops->flush(f->fe, c);
	return 1;
}

int cap_ctl_run(struct cap_ctl *c, struct cap_err *err)
{
	int r;
	cap_ctl_start(c);
	while ((r = cap_ctl_step(c, -1, err)) > 0)
		;
	if (r == 0)
		cap_log(CAP_LOG_INFO, "every sandbox stopped; bye");
	return r;
}

int cap_ctl_new(const struct cap_controller_cfg *cfg, struct cap_ctl **out, struct cap_err *err)
{
	struct cap_ctl *c = xcalloc(1, sizeof(*c));
	int r;
	c->cfg = *cfg;
	c->be = cfg->backend ? cfg->backend : &ctl_named_backend;
	c->bud = cfg->backend_ud;
	c->lock_fd = c->signal_fd = -1;
	c->manual_now = cap_now_ms();
	c->prepared = !c->be->prepare;
	c->home = cap_home_dir();
	if ((r = cap_mkdir_p(c->home, 0700)) < 0) {
		r = cap_err_set(err, -r, "cannot create %s: %s", c->home, strerror(-r));
		goto fail;
	}
	if ((r = take_lock(c, err)) < 0)
		goto fail;
	static const int stops[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t sigs;
	c->signal_fd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);
	if (c->signal_fd < 0) {
		r = cap_err_set(err, errno, "signalfd: %s", strerror(errno));
		goto fail;
	}
	*out = c;
	return 0;
fail:
	cap_ctl_free(c);
	return r;
}

struct cap_ctl_fe *cap_ctl_add_frontend(struct cap_ctl *c, const struct cap_ctl_frontend_ops *ops,
					void *fe)
{
	struct cap_ctl_fe *f = xcalloc(1, sizeof(*f));
	f->ops = ops;
	f->fe = fe;
	struct cap_ctl_fe **p = &c->fes;
	while (*p)
		p = &(*p)->next;
	*p = f;
	return f;
}

void cap_ctl_free(struct cap_ctl *c)
{
	if (!c)
		return;
	if (c->prep) {	/* only when the loop did not run to its end */
		cap_prep_cancel_request(&c->prep->cancel);
		pthread_join(c->prep->thread, NULL);
		prep_free(c->prep);
	}
	/* Waiting PREPARE calls are freed here; tool calls with their queue. */
	for (struct cap_ctl_call *k = c->prep_waiters, *next; k; k = next) {
		next = k->prep_next;
		if (k->kind == CAP_CTL_PREPARE)
			call_free(k);
	}
	while (c->prep_queue) {
		struct cap_ctl_call *k = c->prep_queue;
		c->prep_queue = k->next;
		call_free(k);
	}
	while (c->idents) {
		struct ident *i = c->idents;
		c->idents = i->next;
		if (i->task) {	/* only when the loop did not run to its end */
			task_abort(i->task);
			task_free(task_join(i));
		}
		report_free(i->report);
		detach(c, i);
		if (i->job)
			close(i->job_fd);	/* the child finishes on its own */
		while (i->queue) {
			struct cap_ctl_call *k = i->queue;
			i->queue = k->next;
			call_free(k);
		}
		call_free(i->active);
		free_abandoned(i);
		free(i);
	}
	while (c->fes) {
		struct cap_ctl_fe *f = c->fes;
		c->fes = f->next;
		free(f);
	}
	free(c->poll.pfd);
	free(c->poll.slot);
	if (c->signal_fd >= 0)
		close(c->signal_fd);
	if (c->lock_fd >= 0)
		close(c->lock_fd);
	free(c->home);
	free(c);
}

struct mapped_ctx {
	const char *sandbox;
	bool found;
};

static void mapped_one(void *ud, const char *agent, const char *peer, const char *sandbox)
{
	struct mapped_ctx *m = ud;
	(void)agent, (void)peer;
	m->found |= strcmp(sandbox, m->sandbox) == 0;
}

int cap_ctl_owner_of(const char *sandbox, struct cap_ctl_holder *out)
{
	int held = cap_ctl_holder(out);
	if (held <= 0)
		return held;
	_cleanup_free_ char *home = cap_home_dir();
	struct mapped_ctx m = { sandbox, false };
	ctl_ws_each(home, mapped_one, &m);
	return m.found;
}

static void image_progress(void *ud, const char *line)
{
	cap_log(CAP_LOG_INFO, "image %s: %s", (const char *)ud, line);
}

void cap_ctl_check_image(const struct cap_controller_cfg *cfg)
{
	const char *ref = cfg->image ? cfg->image : "base";
	struct cap_image img;
	struct cap_err err = { 0 };
	if (cap_store_image_ensure(ref, image_progress, (void *)ref, &img, &err) == 0) {
		cap_image_fini(&img);
		return;
	}
	cap_log(CAP_LOG_WARN, "%s; every call that creates a sandbox fails until it is there", err.msg);
}
