/* The controller's preparation: one at a time, in a worker thread, with
 * every call that waits for it told its progress and its outcome (the
 * preparation itself: controller-prepare.c). */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include "controller-state.h"
#include "util.h"

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

void ctl_prep_free(struct prep_run *p)
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

void ctl_prep_unwait(struct cap_ctl *c, struct cap_ctl_call *k)
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
	c->n_prepares[p->r == 0 ? CAP_CTL_PREP_OK : p->cancel.cancelled ? CAP_CTL_PREP_CANCELLED : CAP_CTL_PREP_FAILED]++;
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
			ctl_deliver(c, k, &r);
		} else if (p->r == 0) {
			k->prep_built = p->out.built;	/* it goes on; its result says so */
		} else {
			ctl_unqueue(k->ident, k);
			ctl_deliver(c, k, &r);
		}
	}
	ctl_prep_free(p);
}

int ctl_prep_begin(struct cap_ctl *c, struct cap_err *err)
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
		ctl_prep_free(p);
		return cap_err_set(err, e, "cannot start the preparation's thread: %s", strerror(e));
	}
	c->prep = p;
	return 0;
}

/* k waits for the preparation: the one under way (k is told what it
 * said so far), or a new one. */
void ctl_prep_join(struct cap_ctl *c, struct cap_ctl_call *k)
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
	if (ctl_prep_begin(c, &err) == 0)
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
void ctl_prep_ready(struct cap_ctl *c)
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
	struct cap_ctl_call *k = ctl_call_new(&req, fe, tag);
	struct cap_ctl_call **q = &c->prep_queue;
	while (*q)
		q = &(*q)->next;
	*q = k;
	c->kick = true;
	return k;
}

/* PREPARE calls submitted since the last round: each waits for the
 * preparation (a new one, or the one under way). */
void ctl_prep_pump(struct cap_ctl *c)
{
	while (c->prep_queue) {
		struct cap_ctl_call *k = c->prep_queue;
		c->prep_queue = k->next;
		k->next = NULL;
		if (c->shutting_down) {
			ctl_fail(c, k, CAP_CTL_ESANDBOX, "the controller is shutting down", ESHUTDOWN);
		} else if (!c->be->prepare) {
			struct cap_prep_out none = { .template_on = true };
			struct cap_ctl_result r = { .prep = &none };
			ctl_deliver(c, k, &r);
		} else {
			ctl_prep_join(c, k);
		}
	}
}

bool cap_ctl_prepared(const struct cap_ctl *c)
{
	return c->prepared;
}
