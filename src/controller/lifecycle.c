#include "lifecycle.h"

void cap_lifecycle_cfg_init(struct cap_lifecycle_cfg *c)
{
	c->idle_pause_ms = 30 * 1000;
	c->idle_stop_ms = 10 * 60 * 1000;
	c->capacity = 4;
}

const char *cap_vm_state_name(enum cap_vm_state s)
{
	static const char *const names[] = {
		[CAP_VM_NONE] = "none", [CAP_VM_STOPPED] = "stopped",
		[CAP_VM_STARTING] = "starting", [CAP_VM_RUNNING] = "running",
		[CAP_VM_PAUSED] = "paused", [CAP_VM_STOPPING] = "stopping",
	};
	return (unsigned)s < sizeof(names) / sizeof(names[0]) ? names[s] : "unknown";
}

bool cap_vm_state_resident(enum cap_vm_state s)
{
	return s == CAP_VM_STARTING || s == CAP_VM_RUNNING || s == CAP_VM_PAUSED ||
	       s == CAP_VM_STOPPING;
}

static bool busy(const struct cap_lc *s)
{
	return s->active > 0 || s->queued > 0;
}

enum cap_lc_action cap_lc_due(const struct cap_lc *s,
			      const struct cap_lifecycle_cfg *c, int64_t now)
{
	if (busy(s) || (s->state != CAP_VM_RUNNING && s->state != CAP_VM_PAUSED))
		return CAP_LC_NONE;
	int64_t idle = now - s->idle_since;
	if (idle >= c->idle_stop_ms)
		return CAP_LC_STOP;
	if (s->state == CAP_VM_RUNNING && idle >= c->idle_pause_ms)
		return CAP_LC_PAUSE;
	return CAP_LC_NONE;
}

int64_t cap_lc_next(const struct cap_lc *s, const struct cap_lifecycle_cfg *c)
{
	if (busy(s))
		return INT64_MAX;
	if (s->state == CAP_VM_RUNNING && c->idle_pause_ms < c->idle_stop_ms)
		return s->idle_since + c->idle_pause_ms;
	if (s->state == CAP_VM_RUNNING || s->state == CAP_VM_PAUSED)
		return s->idle_since + c->idle_stop_ms;
	return INT64_MAX;
}

int cap_lc_make_room(const struct cap_lc *const *v, size_t n,
		     const struct cap_lifecycle_cfg *c)
{
	size_t resident = 0;
	int victim = -1;
	for (size_t i = 0; i < n; i++) {
		if (!cap_vm_state_resident(v[i]->state))
			continue;
		resident++;
		if (busy(v[i]) || v[i]->state == CAP_VM_STARTING || v[i]->state == CAP_VM_STOPPING)
			continue;
		if (victim < 0 || v[i]->idle_since < v[victim]->idle_since ||
		    (v[i]->idle_since == v[victim]->idle_since && v[i]->seq < v[victim]->seq))
			victim = (int)i;
	}
	if (resident < c->capacity)
		return -1;
	return victim >= 0 ? victim : -2;
}

struct cap_pool_plan cap_pool_decide(const struct cap_pool_in *s, int64_t now)
{
	struct cap_pool_plan p = { 0 };
	if (s->shutting_down || !s->size || now < s->retry_at)
		return p;
	if (!s->prepared) {
		p.prepare = !s->preparing;
		return p;
	}
	unsigned room = s->capacity > s->resident ? s->capacity - s->resident : 0;
	p.restart = s->stopped < room ? s->stopped : room;
	room -= p.restart;
	unsigned want = s->size > s->members ? s->size - s->members : 0;
	p.create = want < room ? want : room;
	return p;
}
