/* The controller core's loop: one thread, one poll that never waits on
 * one identity: slow work runs in jobs (child processes of the backend),
 * transfers and the preparation in worker threads, and everything else
 * is a request whose answer the loop picks up. Sandboxes are run by their
 * shims, which outlive the controller, so a new controller reattaches
 * them. Also the controller's set-up, its clock and its shutdown. */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "controller-state.h"
#include "paths.h"
#include "store.h"
#include "util.h"

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
void ctl_set_idle(struct cap_ctl *c, struct cap_lc *lc)
{
	lc->idle_since = cap_ctl_now(c);
	lc->seq = ++c->seq;
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
				c->n_evictions[CAP_CTL_EVICT_IDLE_PAUSE]++;
			}
			break;
		case CAP_LC_STOP:
			if (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED)
				c->n_evictions[CAP_CTL_EVICT_IDLE_STOP]++;
			ctl_begin_stop(c, i);
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
				 k->exec.req.timeout_ms / 1000, CAP_SANDBOX_EXEC_GRACE_MS / 1000);
		cap_log(CAP_LOG_WARN, "sandbox %s (%s/%s): %s", i->name, i->agent, i->peer, note);
		struct cap_ctl_result r = {
			.exit = { .kind = CAP_EXIT_SIGNAL, .value = SIGKILL, .flags = CAP_EXIT_TIMED_OUT,
				  .duration_ms = (uint32_t)(real - k->sent_ms) },
			.out = ctl_bytes(&k->out),
			.out_len = cap_buf_used(&k->out),
			.err = ctl_bytes(&k->err),
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
		ctl_set_idle(c, &i->lc);
		/* The guest no longer answers: asking it to stop would wait
		 * on it for nothing. Its shim is killed; its disks stay. */
		c->be->kill(c->bud, i->name);
		c->n_evictions[CAP_CTL_EVICT_UNRESPONSIVE]++;
		i->killed = true;
		i->lc.state = CAP_VM_STOPPING;
		ctl_vm_down(c, i);
	}
}

static void retry_removes(struct cap_ctl *c)
{
	int64_t real = cap_now_ms();
	for (struct ident *i = c->idents; i; i = i->next)
		if (i->remove_retry_at && real >= i->remove_retry_at)
			ctl_try_remove(c, i);
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
		ctl_vm_down(c, i);
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
		ctl_stopped(c, i);
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
		ctl_fail_queue(c, i, CAP_CTL_ESANDBOX, "the controller is shutting down");
		if (i->task)
			ctl_task_abort(i->task);	/* transfers end now, imports too */
		if (cap_vm_state_resident(i->lc.state))
			ctl_begin_stop(c, i);
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
			ctl_vm_down(c, i);
		return;
	}
	if (r < 0) {
		ctl_vm_lost(c, i, err.msg);
		return;
	}
	int result;
	if (i->op != OP_NONE && c->be->vm_op_done(i->vm, &result))
		ctl_op_answered(c, i, result);
}

void cap_ctl_start(struct cap_ctl *c)
{
	ctl_recover(c);
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
			ctl_prep_pump(c);
			for (struct ident *i = c->idents; i; i = i->next)
				ctl_pump(c, i);
		}
		ctl_pool_fill(c);
		if (!c->shutting_down)
			lifecycle(c);
		deadlines(c);
		stop_overdue(c);
		check_exits(c);
		retry_removes(c);
		ctl_idents_sweep(c);
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
			/* All of a VM's descriptors go to it at once. */
			struct ident *i = s->p;
			for (int j = 1; j < CAP_CTL_VM_NPOLL; j++)
				rev |= p->pfd[k + (size_t)j].revents;
			if (rev)
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
			ctl_job_finished(c, s->p);
		} else if (s->kind == SLOT_TASK) {
			struct ident *i = s->p;
			if (i->task)
				ctl_task_finished(c, i);
		} else if (s->kind == SLOT_PREP) {
			if (c->prep)
				ctl_prep_ready(c);
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

static int64_t unix_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
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
	c->start_unix_ms = unix_ms();
	c->prepared = !c->be->prepare;
	c->home = cap_home_dir();
	if ((r = cap_mkdir_p(c->home, 0700)) < 0) {
		r = cap_err_set(err, -r, "cannot create %s: %s", c->home, strerror(-r));
		goto fail;
	}
	if ((r = ctl_take_lock(c, err)) < 0)
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
		ctl_prep_free(c->prep);
	}
	/* Waiting PREPARE calls are freed here; tool calls with their queue. */
	for (struct cap_ctl_call *k = c->prep_waiters, *next; k; k = next) {
		next = k->prep_next;
		if (k->kind == CAP_CTL_PREPARE)
			ctl_call_free(k);
	}
	while (c->prep_queue) {
		struct cap_ctl_call *k = c->prep_queue;
		c->prep_queue = k->next;
		ctl_call_free(k);
	}
	while (c->idents) {
		struct ident *i = c->idents;
		c->idents = i->next;
		if (i->task) {	/* only when the loop did not run to its end */
			ctl_task_abort(i->task);
			ctl_task_free(ctl_task_join(i));
		}
		ctl_report_free(i->report);
		ctl_detach(c, i);
		if (i->job)
			close(i->job_fd);	/* the child finishes on its own */
		while (i->queue) {
			struct cap_ctl_call *k = i->queue;
			i->queue = k->next;
			ctl_call_free(k);
		}
		ctl_call_free(i->active);
		ctl_free_abandoned(i);
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
