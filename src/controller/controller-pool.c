/* Capacity (evicting the VM idle the longest) and the warm pool of started
 * sandboxes kept ready for identities that have none yet. */
#include <stdio.h>
#include <stdlib.h>
#include <sys/random.h>

#include "controller-state.h"
#include "util.h"

/* --- capacity and the warm pool ---------------------------------------------------- */

static unsigned count_resident(struct cap_ctl *c)
{
	unsigned n = 0;
	for (struct ident *i = c->idents; i; i = i->next)
		n += cap_vm_state_resident(i->lc.state);
	return n;
}

/* -1 room, 0 waiting for an eviction, -2 full of busy VMs. */
int ctl_make_room(struct cap_ctl *c)
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
		ctl_begin_stop(c, who[k]);
		c->n_evictions[CAP_CTL_EVICT_CAPACITY]++;
		r = 0;
	} else if (k == -2 && stopping) {
		r = 0;	/* an eviction is under way: wait for it */
	}
	free(v);
	free(who);
	return r;
}

struct ident *ctl_pool_ready(struct cap_ctl *c)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (i->pool && i->vm && !i->job && i->op == OP_NONE &&
		    (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED))
			return i;
	return NULL;
}

/* Give identity i (which has no sandbox) the ready pool VM p. */
int ctl_take_from_pool(struct cap_ctl *c, struct ident *i, struct ident *p, struct cap_err *err)
{
	int r = ctl_idrec_write(c->home, i->agent, i->peer, p->name, err);	/* the mapping is the assignment */
	if (r < 0)
		return r;
	snprintf(i->name, sizeof(i->name), "%s", p->name);
	i->vm = p->vm;
	i->lc.state = p->lc.state;
	ctl_set_idle(c, &i->lc);
	i->source = p->source;
	i->checked = true;
	ctl_unlink_ident(c, p);
	free(p);
	cap_log(CAP_LOG_INFO, "%s/%s gets warm sandbox %s", i->agent, i->peer, i->name);
	return 0;
}

/* Keep cfg.warm_pool sandboxes starting or ready, within capacity. */
void ctl_pool_fill(struct cap_ctl *c)
{
	struct cap_pool_in in = {
		.size = c->cfg.warm_pool, .resident = count_resident(c), .capacity = c->cfg.lc.capacity,
		.shutting_down = c->shutting_down, .prepared = c->prepared, .preparing = c->prep != NULL,
		.retry_at = c->pool_retry_at,
	};
	for (struct ident *i = c->idents; i; i = i->next) {
		in.members += i->pool;
		in.stopped += i->pool && i->lc.state == CAP_VM_STOPPED && !i->job;
	}
	struct cap_pool_plan plan = cap_pool_decide(&in, cap_now_ms());
	if (plan.prepare) {
		/* No warm sandbox before the kernel, image and template are
		 * there: prepare first (the pool fills once that succeeded;
		 * a failure waits like a failed start). */
		struct cap_err err = { 0 };
		if (ctl_prep_begin(c, &err) < 0) {
			cap_log(CAP_LOG_WARN, "cannot prepare for the warm pool: %s", err.msg);
			c->pool_retry_at = cap_now_ms() + 30000;
		}
		return;
	}
	for (struct ident *i = c->idents; i && plan.restart; i = i->next) {
		if (!i->pool || i->lc.state != CAP_VM_STOPPED || i->job)
			continue;
		struct cap_err err = { 0 };
		if (ctl_begin_start(c, i, &err) < 0) {
			cap_log(CAP_LOG_WARN, "warm sandbox %s: %s", i->name, err.msg);
			c->pool_retry_at = cap_now_ms() + 30000;
			return;
		}
		plan.restart--;
	}
	for (; plan.create; plan.create--) {
		uint8_t rnd[8];
		char name[CAP_NAME_MAX + 1];
		struct cap_err err = { 0 };
		if (getrandom(rnd, sizeof(rnd), 0) != sizeof(rnd))
			return;
		snprintf(name, sizeof(name), "pool-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2],
			 rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
		struct ident *i = ctl_ident_new(c, "", "", name);
		i->pool = true;
		if (ctl_begin_start(c, i, &err) < 0) {
			cap_log(CAP_LOG_WARN, "cannot prepare a warm sandbox: %s", err.msg);
			ctl_unlink_ident(c, i);
			free(i);
			c->pool_retry_at = cap_now_ms() + 30000;
			return;
		}
	}
}
