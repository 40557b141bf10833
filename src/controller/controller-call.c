/* Calls and their queues: a call's copy of its request, its answer to the
 * front end, the guest's events for EXEC and FILE, submitting and
 * cancelling, and moving each identity's queue forward. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller-state.h"
#include "util.h"
#include "xfer.h"

/* --- calls ------------------------------------------------------------------------ */

void ctl_call_free(struct cap_ctl_call *k)
{
	if (!k)
		return;
	switch (k->kind) {
	case CAP_CTL_EXEC:
		for (uint32_t a = 0; a < k->exec.req.argc; a++)
			free(k->exec.req.argv[a]);
		free(k->exec.req.argv);
		for (uint32_t a = 0; a < k->exec.req.envc; a++)
			free(k->exec.req.env[a]);
		free(k->exec.req.env);
		free(k->exec.req.cwd);
		free(k->exec.owned_stdin);
		break;
	case CAP_CTL_FILE:
		free(k->file.owned_path);
		free(k->file.owned_data);
		break;
	case CAP_CTL_XFER:
		free(k->xfer.owned_path);
		free(k->xfer.owned_data);
		free(k->xfer.owned_host);
		break;
	case CAP_CTL_SNAPSHOT:
	case CAP_CTL_FORK:
		free(k->fork.owned_peers);
		free(k->fork.owned_children);
		break;
	default:
		break;
	}
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

struct cap_ctl_call *ctl_call_new(const struct cap_ctl_req *r, struct cap_ctl_fe *fe, void *tag)
{
	struct cap_ctl_call *k = xcalloc(1, sizeof(*k));
	k->kind = r->kind;
	k->fe = fe;
	k->tag = tag;
	cap_buf_init(&k->out);
	cap_buf_init(&k->err);
	if (r->kind == CAP_CTL_EXEC) {
		const struct cap_exec_req *e = r->exec;
		k->exec.req = *e;
		k->exec.req.argv = xcalloc(e->argc + 1, sizeof(char *));
		for (uint32_t a = 0; a < e->argc; a++)
			k->exec.req.argv[a] = xstrdup(e->argv[a]);
		k->exec.req.env = xcalloc(e->envc + 1, sizeof(char *));
		for (uint32_t a = 0; a < e->envc; a++)
			k->exec.req.env[a] = xstrdup(e->env[a]);
		k->exec.req.cwd = e->cwd ? xstrdup(e->cwd) : NULL;
		if (r->stdin_data) {
			k->exec.owned_stdin = dup_bytes(r->stdin_data, r->stdin_len);
			k->exec.stdin_len = r->stdin_len;
			k->exec.req.flags |= CAP_EXEC_STDIN;
		}
	} else if (r->kind == CAP_CTL_FILE) {
		snprintf(k->file.root, sizeof(k->file.root), "%s", r->root);
		k->file.owned_path = xstrdup(r->path);
		k->file.owned_data = dup_bytes(r->data, r->len);
		k->file.req = (struct cap_file_req){
			.op = r->op, .limit = r->limit ? r->limit : CAP_CTL_READ_MAX,
			.limit_entries = CAP_CTL_LIST_MAX, .root = k->file.root, .path = k->file.owned_path,
			.data = k->file.owned_data, .len = r->len,
		};
		if (r->op == CAP_FILE_WRITE && r->no_sync)
			k->file.req.limit |= CAP_FILE_NO_SYNC;
	} else if (r->kind == CAP_CTL_XFER) {
		snprintf(k->xfer.root, sizeof(k->xfer.root), "%s", r->root);
		k->xfer.owned_path = xstrdup(r->path);
		k->xfer.put = r->put;
		k->xfer.no_sync = r->put && r->no_sync;
		k->xfer.owned_host = r->host ? xstrdup(r->host) : NULL;
		if (r->put && !r->host) {
			k->xfer.owned_data = dup_bytes(r->data, r->len);
			k->xfer.len = r->len;
			k->xfer.mode = r->mode & 07777;
		}
	} else if (r->kind == CAP_CTL_MERGE) {
		k->merge.pick = r->pick;
		k->merge.dry_run = r->dry_run;
	} else if (r->kind == CAP_CTL_SNAPSHOT || r->kind == CAP_CTL_FORK) {
		snprintf(k->fork.snap, sizeof(k->fork.snap), "%s", r->snapshot ? r->snapshot : "");
		k->fork.count = r->kind == CAP_CTL_FORK ? r->count : 0;
		if (r->peers) {
			k->fork.owned_peers = xcalloc(r->count, sizeof(*k->fork.owned_peers));
			for (unsigned a = 0; a < r->count; a++)
				snprintf(k->fork.owned_peers[a], sizeof(k->fork.owned_peers[a]), "%s", r->peers[a]);
		}
	}
	return k;
}

void ctl_report_free(struct import_report *p)
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
bool ctl_in_worker(enum cap_ctl_kind kind)
{
	return kind == CAP_CTL_XFER || is_ws(kind) || kind == CAP_CTL_SNAPSHOT || kind == CAP_CTL_FORK;
}

bool ctl_is_tool(enum cap_ctl_kind kind)
{
	return kind == CAP_CTL_EXEC || kind == CAP_CTL_FILE || ctl_in_worker(kind);
}

/* Hand the result to the call's front end and free the call. */
void ctl_deliver(struct cap_ctl *c, struct cap_ctl_call *k, struct cap_ctl_result *r)
{
	struct import_report *rep = NULL;
	if (k->prep_wait)
		ctl_prep_unwait(c, k);
	if (ctl_is_tool(k->kind) && !r->prepared)
		r->prepared = k->prep_built;
	r->kind = k->kind;
	if (k->ident && !r->sandbox)
		r->sandbox = k->ident->name;
	if (k->ident && k->ident->report && ctl_is_tool(k->kind)) {
		/* The import that ran for this sandbox goes with the first
		 * call to end after it: the one that made the sandbox. */
		rep = k->ident->report;
		k->ident->report = NULL;
		r->import = &rep->pub;
	}
	k->fe->ops->done(k->fe->fe, c, k->tag, r);
	ctl_call_free(k);
	ctl_report_free(rep);
}

void ctl_fail(struct cap_ctl *c, struct cap_ctl_call *k, enum cap_ctl_code code,
	      const char *msg, int errnum)
{
	struct cap_ctl_result r = { .code = code, .msg = msg, .errnum = errnum };
	ctl_deliver(c, k, &r);
}

void ctl_unqueue(struct ident *i, struct cap_ctl_call *k)
{
	for (struct cap_ctl_call **p = &i->queue; *p; p = &(*p)->next)
		if (*p == k) {
			*p = k->next;
			i->lc.queued--;
			return;
		}
}

/* Fail everything queued for i with msg. */
void ctl_fail_queue(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code, const char *msg)
{
	while (i->queue) {
		struct cap_ctl_call *k = i->queue;
		ctl_unqueue(i, k);
		ctl_fail(c, k, code, msg, 0);
	}
}

/* The active call ended: answer it and move the queue on. */
void ctl_active_done(struct cap_ctl *c, struct ident *i, struct cap_ctl_result *r)
{
	struct cap_ctl_call *k = i->active;
	i->active = NULL;
	i->lc.active = 0;
	ctl_set_idle(c, &i->lc);
	c->kick = true;
	if (k)
		ctl_deliver(c, k, r);
}

void ctl_active_fail(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code,
		     const char *msg, int errnum)
{
	struct cap_ctl_result r = { .code = code, .msg = msg, .errnum = errnum };
	ctl_active_done(c, i, &r);
}

/* What a buffer holds, "" when empty (its head is NULL then). */
const uint8_t *ctl_bytes(const struct cap_buf *b)
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
		ctl_active_fail(c, i, CAP_CTL_ETOOL, *why ? why : "the file operation failed", ex->value);
		return;
	}
	if (k->file.req.op == CAP_FILE_WRITE) {
		r.written = k->file.req.len;
		ctl_active_done(c, i, &r);
		return;
	}
	if (ex->value == 1) {	/* a directory */
		cap_buf_append(&k->out, "", 1);	/* room for a terminator */
		size_t len = cap_buf_used(&k->out) - 1;
		struct cap_ctl_entry *v = parse_listing((char *)cap_buf_head(&k->out), len, &r.nentries);
		r.is_dir = true;
		r.entries = v;
		r.entries_truncated = (ex->flags & CAP_EXIT_TRUNCATED) != 0;
		ctl_active_done(c, i, &r);
		free(v);
		return;
	}
	r.content = ctl_bytes(&k->out);
	r.content_len = cap_buf_used(&k->out);
	ctl_active_done(c, i, &r);
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
		ctl_call_free(k);
		return;
	}
	if (k->cancelled) {
		ctl_active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
		return;
	}
	if (!ex) {
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, msg, errnum);
		return;
	}
	if (k->kind == CAP_CTL_FILE) {
		file_done(c, i, k, ex);
		return;
	}
	struct cap_ctl_result r = {
		.exit = *ex,
		.out = ctl_bytes(&k->out),
		.out_len = cap_buf_used(&k->out),
		.err = ctl_bytes(&k->err),
		.err_len = cap_buf_used(&k->err),
	};
	ctl_active_done(c, i, &r);
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

/* --- running the queue --------------------------------------------------------------- */

static void start_call(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	struct cap_err err = { 0 };
	ctl_unqueue(i, k);
	i->active = k;
	i->lc.active = 1;
	i->checked = false;	/* the next call checks the public data again */
	if (k->kind == CAP_CTL_STOP || k->kind == CAP_CTL_REMOVE) {
		ctl_begin_stop(c, i);
		return;	/* finished when the VM is gone (stopped) */
	}
	if (k->kind == CAP_CTL_XFER) {
		ctl_begin_xfer(c, i, k);
		return;	/* finished when its worker ends (task_finished) */
	}
	if (is_ws(k->kind)) {
		ctl_begin_ws(c, i, k);
		return;	/* likewise */
	}
	if (k->kind == CAP_CTL_SNAPSHOT || k->kind == CAP_CTL_FORK) {
		ctl_begin_fork(c, i, k);
		return;	/* likewise */
	}
	if (k->kind == CAP_CTL_EXEC && k->exec.req.timeout_ms) {
		k->sent_ms = cap_now_ms();
		k->deadline = k->sent_ms + k->exec.req.timeout_ms + CAP_SANDBOX_EXEC_GRACE_MS;
	}
	int r = k->kind == CAP_CTL_FILE
			? c->be->file(i->vm, &k->file.req, (k->file.req.limit & ~CAP_FILE_NO_SYNC) + CAP_CTL_LIST_MAX * 700 + 4096, &events, k,
				      &k->stream, &err)
			: c->be->exec(i->vm, &k->exec.req, &events, k, &k->stream, &err);
	if (r < 0) {
		ctl_active_fail(c, i, err.code == EINVAL ? CAP_CTL_ETOOL : CAP_CTL_ESANDBOX, err.msg, err.code);
		return;
	}
	if (k->kind == CAP_CTL_EXEC && k->exec.owned_stdin) {
		c->be->input(i->vm, k->stream, k->exec.owned_stdin, k->exec.stdin_len);
		c->be->input(i->vm, k->stream, NULL, 0);
	}
}

/* A stop or remove of an identity whose VM is not resident ends at once
 * (a remove as soon as a shim that is still exiting is gone). */
static void end_down(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k)
{
	c->kick = true;
	if (k->kind == CAP_CTL_REMOVE && i->lc.state != CAP_VM_NONE) {
		ctl_unqueue(i, k);
		i->active = k;
		i->lc.active = 1;
		i->remove_deadline = cap_now_ms() + 10000;
		ctl_try_remove(c, i);
		return;
	}
	ctl_unqueue(i, k);
	if (k->kind == CAP_CTL_REMOVE)
		ctl_idrec_remove(c->home, i->agent, i->peer);
	struct cap_ctl_result r = { .state = i->lc.state == CAP_VM_NONE ? "none" : "stopped" };
	ctl_deliver(c, k, &r);
}

/* Move one identity's queue forward as far as its VM allows. */
void ctl_pump(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	if (c->shutting_down) {
		/* Tool calls are refused at once, whatever the VM is doing. */
		for (struct cap_ctl_call *k = i->queue, *next; k; k = next) {
			next = k->next;
			if (ctl_is_tool(k->kind)) {
				ctl_unqueue(i, k);
				ctl_fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
			}
		}
	}
	if (i->active || !i->queue || i->job || i->op != OP_NONE || i->task)
		return;
	struct cap_ctl_call *k = i->queue;
	bool tool = ctl_is_tool(k->kind);
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
		ctl_unqueue(i, k);
		ctl_fail(c, k, CAP_CTL_ETOOL, msg, ENOENT);
		c->kick = true;
		return;
	}
	if (tool && !c->prepared && !c->shutting_down) {
		/* The first tool calls wait for the controller's preparation
		 * (docs/serve.md); once it succeeded nothing is looked at
		 * again here. */
		if (!k->prep_wait)
			ctl_prep_join(c, k);
		return;
	}
	switch (i->lc.state) {
	case CAP_VM_RUNNING:
	case CAP_VM_PAUSED:
		if (tool && i->source != 0 && !i->checked) {
			/* Public data changed? Checked (and rebuilt) in a job. */
			if (ctl_begin_job(c, i, CAP_CTL_JOB_CHECK, false, &err) < 0) {
				ctl_unqueue(i, k);
				ctl_fail(c, k, CAP_CTL_ESANDBOX, err.msg, err.code);
				c->kick = true;
			}
			return;
		}
		if (tool && i->lc.state == CAP_VM_PAUSED) {
			c->be->vm_op(i->vm, false);	/* answered in step_vm */
			i->op = OP_RESUME;
			return;
		}
		if (tool && ctl_import_due(c, i)) {
			ctl_begin_import(c, i);	/* the call starts once it ended */
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
			ctl_unqueue(i, k);
			ctl_fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
			return;
		}
		struct ident *warm;
		enum cap_vm_state st;
		bool serving, has_source;
		/* A warm VM has the defaults' sizes: not one for an
		 * identity that asked for others. */
		if (i->lc.state == CAP_VM_NONE && ctl_size_is_default(c, i) && (warm = ctl_pool_ready(c)) &&
		    c->be->state(c->bud, i->name, &st, &serving, &has_source) == -ENOENT &&
		    ctl_take_from_pool(c, i, warm, &err) == 0) {
			c->kick = true;	/* running now: the call starts next round */
			return;
		}
		switch (ctl_make_room(c)) {
		case -1:
			break;
		case 0:
			return;	/* wait for the eviction */
		default:
			ctl_unqueue(i, k);
			ctl_fail(c, k, CAP_CTL_ECAPACITY, "every sandbox slot is busy with running calls; retry later", 0);
			c->kick = true;
			return;
		}
		if (ctl_begin_start(c, i, &err) < 0) {
			ctl_unqueue(i, k);
			ctl_fail(c, k, CAP_CTL_ESANDBOX, err.msg, err.code);
			c->kick = true;
		}
		return;
	default:
		return;	/* starting or stopping: wait */
	}
}

/* The shim answered a pause or resume. */
void ctl_op_answered(struct cap_ctl *c, struct ident *i, int result)
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
		ctl_set_idle(c, &i->lc);
		return;
	}
	cap_log(CAP_LOG_WARN, "%s could not be resumed: %s", i->name, strerror(-result));
	if (i->queue) {
		struct cap_ctl_call *k = i->queue;
		ctl_unqueue(i, k);
		ctl_fail(c, k, CAP_CTL_ESANDBOX, "the sandbox could not be resumed; see its shim.log", -result);
	}
}

/* --- submitting, cancelling ------------------------------------------------------ */

struct cap_ctl_call *cap_ctl_submit(struct cap_ctl *c, struct cap_ctl_fe *fe,
				    const char *agent, const char *peer,
				    const struct cap_ctl_req *req, void *tag)
{
	/* Never answered from in here: the caller stores the handle first.
	 * During a shutdown the loop fails it (pump). */
	struct cap_ctl_call *k = ctl_call_new(req, fe, tag);
	struct ident *i = ctl_ident_get(c, agent, peer);
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
		ctl_fail(c, k, CAP_CTL_ECANCELLED, "request cancelled", 0);
		return true;
	}
	if (i->active == k) {
		if (k->kind == CAP_CTL_STOP || k->kind == CAP_CTL_REMOVE)
			return false;	/* a stop is not taken back */
		k->cancelled = true;
		if (ctl_in_worker(k->kind) && i->task)
			ctl_task_abort(i->task);	/* answered once its worker ended */
		else if (i->vm)
			c->be->signal(i->vm, k->stream, SIGKILL);
		return true;
	}
	ctl_unqueue(i, k);
	ctl_fail(c, k, CAP_CTL_ECANCELLED, "request cancelled", 0);
	c->kick = true;
	return true;
}
