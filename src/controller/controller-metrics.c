/* The controller's figures (docs/serve.md, "Metrics"): counted where they
 * happen (the loop, the preparation, capacity), read here as plain
 * numbers; the front end formats them. */
#include <string.h>

#include "controller-state.h"
#include "util.h"

const char *cap_ctl_prep_outcome_name(enum cap_ctl_prep_outcome o)
{
	static const char *const names[] = {
		[CAP_CTL_PREP_OK] = "ok", [CAP_CTL_PREP_FAILED] = "failed", [CAP_CTL_PREP_CANCELLED] = "cancelled",
	};
	return (unsigned)o < CAP_ARRAY_SIZE(names) ? names[o] : "unknown";
}

const char *cap_ctl_evict_name(enum cap_ctl_evict e)
{
	static const char *const names[] = {
		[CAP_CTL_EVICT_IDLE_PAUSE] = "idle_pause", [CAP_CTL_EVICT_IDLE_STOP] = "idle_stop",
		[CAP_CTL_EVICT_CAPACITY] = "capacity", [CAP_CTL_EVICT_UNRESPONSIVE] = "unresponsive",
	};
	return (unsigned)e < CAP_ARRAY_SIZE(names) ? names[e] : "unknown";
}

/* What moved since the last look; a counter below it was set back to
 * zero by a start this controller did not see (a shim started by
 * another front end, or before this controller): all of it is new. */
static uint64_t moved(uint64_t now, uint64_t *seen)
{
	uint64_t d = now >= *seen ? now - *seen : now;
	*seen = now;
	return d;
}

/* i's usage now (zeroed when unknown), its net counters added to the
 * totals. */
static void take(struct cap_ctl *c, struct ident *i, struct cap_ctl_usage *u)
{
	memset(u, 0, sizeof(*u));
	if (!c->be->usage || !i->name[0] || c->be->usage(c->bud, i->name, u) < 0 || !u->net)
		return;
	c->n_net[0] += moved(u->net_refused, &i->net_seen[0]);
	c->n_net[1] += moved(u->net_bytes_out, &i->net_seen[1]);
	c->n_net[2] += moved(u->net_bytes_in, &i->net_seen[2]);
}

void ctl_usage_take(struct cap_ctl *c, struct ident *i)
{
	struct cap_ctl_usage u;
	take(c, i, &u);
}

void ctl_usage_baseline(struct cap_ctl *c, struct ident *i)
{
	struct cap_ctl_usage u;
	if (c->be->usage && c->be->usage(c->bud, i->name, &u) == 0 && u.net) {
		i->net_seen[0] = u.net_refused;
		i->net_seen[1] = u.net_bytes_out;
		i->net_seen[2] = u.net_bytes_in;
	}
}

static void count_one(void *ud, const struct cap_ctl_status *st)
{
	struct cap_ctl_metrics *out = ud;
	if ((unsigned)st->state < CAP_VM_NSTATES)
		out->sandboxes[st->state]++;
	out->identities++;
}

void cap_ctl_metrics(struct cap_ctl *c, struct cap_ctl_metrics *out)
{
	memset(out, 0, sizeof(*out));
	out->start_unix_ms = c->start_unix_ms;
	out->capacity = c->cfg.lc.capacity;
	/* The identities' sandboxes as list says them (a stopped one may
	 * be known from its record only), the warm pool's from memory. */
	cap_ctl_list(c, count_one, out, NULL);
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->pool && (unsigned)i->lc.state < CAP_VM_NSTATES)
			out->sandboxes[i->lc.state]++;
		if (i->pool && i->vm && !i->job && i->op == OP_NONE &&
		    (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED))
			out->pool_ready++;
		if (!cap_vm_state_resident(i->lc.state))
			continue;
		struct cap_ctl_usage u;
		take(c, i, &u);
		if (u.memory_bytes) {
			out->memory_bytes += u.memory_bytes;
			out->memory_sandboxes++;
		}
	}
	memcpy(out->prepares, c->n_prepares, sizeof(out->prepares));
	memcpy(out->evictions, c->n_evictions, sizeof(out->evictions));
	out->net_refused = c->n_net[0];
	out->net_bytes_out = c->n_net[1];
	out->net_bytes_in = c->n_net[2];
}
