/* Recovery: taking back what a predecessor left (serving shims
 * reattached, starting ones waited for, dead ones' leftovers cleaned,
 * unassigned warm-pool sandboxes made members again). */
#include <stdlib.h>
#include <string.h>

#include "controller-state.h"

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
	struct ident *i = ctl_ident_new(c, agent, peer, name);
	i->pool = pool;
	i->source = has_source;
	i->lc.state = CAP_VM_STOPPED;
	if (st == CAP_VM_STOPPED)
		return;
	ctl_usage_baseline(c, i);	/* what it counted before us is not ours */
	if (serving && ctl_attach(c, i, &err) == 0) {
		cap_log(CAP_LOG_INFO, "reattached %s (%s%s%s, %s)", name, pool ? "warm pool" : agent,
			pool ? "" : "/", peer, cap_vm_state_name(i->lc.state));
		return;
	}
	/* Its shim is starting (a controller died while starting it) or
	 * exiting (while stopping it): a job waits to see which; it never
	 * starts one again. */
	if (ctl_begin_job(c, i, CAP_CTL_JOB_WAIT, false, &err) < 0) {
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

void ctl_recover(struct cap_ctl *c)
{
	if (c->be->sweep)
		c->be->sweep(c->bud);
	ctl_idrec_each(c->home, recover_ws, c);

	/* Warm-pool sandboxes nobody was given: members again. */
	char **names;
	size_t n;
	if (!c->be->list || c->be->list(c->bud, &names, &n) < 0)
		return;
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
