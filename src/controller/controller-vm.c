/* The VM of an identity: attaching, stopping, removing, losing it, and the
 * jobs (child processes of the backend) that create, start, check or wait
 * for its sandbox. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "controller-state.h"
#include "util.h"

/* --- the VM of an identity ----------------------------------------------------- */

void ctl_free_abandoned(struct ident *i)
{
	while (i->abandoned) {
		struct cap_ctl_call *k = i->abandoned;
		i->abandoned = k->next;
		ctl_call_free(k);
	}
}

void ctl_detach(struct cap_ctl *c, struct ident *i)
{
	if (i->vm)
		c->be->vm_free(i->vm);	/* no callback reaches a call after this */
	i->vm = NULL;
	i->op = OP_NONE;
	ctl_free_abandoned(i);
}

int ctl_attach(struct cap_ctl *c, struct ident *i, struct cap_err *err)
{
	bool paused;
	int r = c->be->attach(c->bud, i->name, &i->vm, &paused, err);
	if (r < 0)
		return r;
	i->lc.state = paused ? CAP_VM_PAUSED : CAP_VM_RUNNING;
	return 0;
}

void ctl_begin_stop(struct cap_ctl *c, struct ident *i)
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
	ctl_idrec_remove(c->home, i->agent, i->peer);
	i->lc.state = CAP_VM_NONE;
	/* An import report not handed out yet was about the sandbox gone;
	 * a new one imports again. */
	ctl_report_free(i->report);
	i->report = NULL;
	i->import_checked = false;
	cap_log(CAP_LOG_INFO, "removed %s (%s/%s) and its disks", i->name, i->agent, i->peer);
	return 0;
}

/* The active remove: delete the sandbox once its shim has exited (it
 * may still be closing up when its VM is already gone). */
void ctl_try_remove(struct cap_ctl *c, struct ident *i)
{
	struct cap_err err = { 0 };
	i->remove_retry_at = 0;
	int r = remove_sandbox(c, i, &err);
	if (r == -EBUSY && cap_now_ms() < i->remove_deadline) {
		i->remove_retry_at = cap_now_ms() + 20;
		return;
	}
	if (r < 0) {
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, err.msg, err.code);
		return;
	}
	struct cap_ctl_result res = { .state = "removed" };
	ctl_active_done(c, i, &res);
}

/* The VM of i is gone after a stop: finish a stop or remove under way. */
void ctl_stopped(struct cap_ctl *c, struct ident *i)
{
	ctl_detach(c, i);
	i->lc.state = CAP_VM_STOPPED;
	ctl_usage_take(c, i);	/* its last counts, before a start or a remove */
	ctl_set_idle(c, &i->lc);
	c->kick = true;
	struct cap_ctl_call *k = i->active;
	if (i->task) {
		/* A transfer, diff, merge or import ends with its connection;
		 * its call is answered when its worker has let go. */
		if (k && ctl_in_worker(k->kind) && !k->why[0])
			snprintf(k->why, sizeof(k->why), "the sandbox was stopped while the %s ran",
				 k->kind == CAP_CTL_XFER ? "transfer" : k->kind == CAP_CTL_DIFF ? "diff" : "merge");
		ctl_task_abort(i->task);
	} else if (k && (k->kind == CAP_CTL_EXEC || k->kind == CAP_CTL_FILE)) {
		if (k->cancelled)
			ctl_active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
		else
			ctl_active_fail(c, i, CAP_CTL_ESANDBOX, "the sandbox was stopped while the call ran", 0);
	} else if (k && k->kind == CAP_CTL_STOP) {
		struct cap_ctl_result r = { .state = "stopped" };
		ctl_active_done(c, i, &r);
	} else if (k && k->kind == CAP_CTL_REMOVE) {
		i->remove_deadline = cap_now_ms() + 10000;
		ctl_try_remove(c, i);
	}
}

/* A stopping VM is gone: its shim exits next (it reaps QEMU, then lets go
 * of its lock); stopped once it has, so that nothing sees a stopped
 * sandbox whose shim still runs. */
void ctl_vm_down(struct cap_ctl *c, struct ident *i)
{
	ctl_detach(c, i);
	i->exit_wait_until = cap_now_ms() + 10000;
	c->kick = true;
}

/* The VM went away unasked (crash, kill, a stop by the source check). */
void ctl_vm_lost(struct cap_ctl *c, struct ident *i, const char *why)
{
	bool expected = i->job && i->job_kind == CAP_CTL_JOB_CHECK;
	if (!expected)
		cap_log(CAP_LOG_WARN, "sandbox %s (%s/%s) went away: %s", i->name, i->agent, i->peer, why);
	ctl_detach(c, i);
	i->lc.state = CAP_VM_STOPPED;
	ctl_set_idle(c, &i->lc);
	if (i->task) {
		if (i->active && !i->active->why[0])
			snprintf(i->active->why, sizeof(i->active->why), "%s", why);
		ctl_task_abort(i->task);	/* answered when its worker ends */
	} else if (i->active && i->active->cancelled) {
		ctl_active_fail(c, i, CAP_CTL_ECANCELLED, "request cancelled", 0);
	} else if (i->active) {
		ctl_active_fail(c, i, CAP_CTL_ESANDBOX, why, 0);
	}
	c->kick = true;
}

/* --- jobs ----------------------------------------------------------------------------- */

int ctl_begin_job(struct cap_ctl *c, struct ident *i, enum cap_ctl_job kind, bool create,
		  struct cap_err *err)
{
	struct cap_ctl_job_req j = {
		.kind = kind, .name = i->name, .create = create,
		.image = c->cfg.image, .source = c->cfg.source, .network = c->cfg.network,
		.workspace = c->cfg.workspace, .tools_root = c->cfg.tools_root,
		.warm = i->pool,
	};
	ctl_size_want(c, i, &j.size);
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
int ctl_begin_start(struct cap_ctl *c, struct ident *i, struct cap_err *err)
{
	int r;
	if (i->lc.state == CAP_VM_NONE && !i->pool &&
	    (r = ctl_idrec_write(c->home, i->agent, i->peer, i->name, err)) < 0)
		return r;
	/* The start sets its policy process's counters back to zero; what
	 * they held was taken when it stopped (or was a predecessor's). */
	memset(i->net_seen, 0, sizeof(i->net_seen));
	if ((r = ctl_begin_job(c, i, CAP_CTL_JOB_START, true, err)) < 0)
		return r;
	i->lc.state = CAP_VM_STARTING;
	i->import_checked = false;	/* a crash before its note: it runs again */
	return 0;
}

static void start_done(struct cap_ctl *c, struct ident *i, const struct cap_ctl_job_out *out)
{
	struct cap_err err = { 0 };
	ctl_set_idle(c, &i->lc);
	if (out->r == 0)
		i->source = out->has_source;
	if (out->r == 0 && out->stopped) {
		/* Recovery waited for a shim that was exiting: it is gone. */
		i->lc.state = CAP_VM_STOPPED;
		i->stop_after_start = false;
		return;
	}
	if (out->r == 0 && ctl_attach(c, i, &err) < 0) {
		/* The shim runs and serves, but would not take us: never leave
		 * it running unowned. Stop it (its disks stay). */
		cap_log(CAP_LOG_WARN, "sandbox %s started but cannot be attached (%s); stopping its shim", i->name,
			err.msg);
		c->be->kill(c->bud, i->name);
		i->lc.state = CAP_VM_STOPPING;
		i->killed = true;
		i->exit_wait_until = cap_now_ms() + 10000;
		ctl_fail_queue(c, i, CAP_CTL_ESANDBOX, err.msg);
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
		ctl_fail_queue(c, i, CAP_CTL_ESANDBOX, why);
		return;
	}
	i->checked = true;	/* the start refreshed the public data */
	if (i->stop_after_start || c->shutting_down) {
		i->stop_after_start = false;
		ctl_begin_stop(c, i);
	}
}

static void check_done(struct cap_ctl *c, struct ident *i, const struct cap_ctl_job_out *out)
{
	if (out->r < 0) {
		/* The tree broke a rule (or vanished): the call fails, the
		 * sandbox and its disks are untouched. */
		i->checked = false;
		struct cap_ctl_call *k = i->queue;
		if (k && ctl_is_tool(k->kind)) {
			ctl_unqueue(i, k);
			ctl_fail(c, k, CAP_CTL_ESANDBOX, out->msg, -out->r);
		}
		return;
	}
	i->source = out->has_source;
	if (out->changed) {
		/* The job stopped the VM to rebuild its public data: start
		 * again with the same disks. */
		cap_log(CAP_LOG_INFO, "public data of %s changed: restarted with the new copy", i->name);
		ctl_detach(c, i);
		i->lc.state = CAP_VM_STOPPED;
		i->checked = false;
		return;
	}
	i->checked = true;
}

void ctl_job_finished(struct cap_ctl *c, struct ident *i)
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
