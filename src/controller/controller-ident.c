/* Identities (agent, peer): their sandbox's name, kept in memory while
 * they have a VM, work or a job, and what status and list report of them. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller-state.h"
#include "sha256.h"
#include "util.h"

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
	if (ctl_idrec_read(c->home, agent, peer, out) < 0)
		sandbox_name(agent, peer, out);
}

static struct ident *find(struct cap_ctl *c, const char *agent, const char *peer);

void ctl_ident_name(struct cap_ctl *c, const char *agent, const char *peer,
		    char out[CAP_NAME_MAX + 1])
{
	struct ident *i = find(c, agent, peer);
	if (i)
		snprintf(out, CAP_NAME_MAX + 1, "%s", i->name);
	else
		name_of(c, agent, peer, out);
}

static struct ident *find(struct cap_ctl *c, const char *agent, const char *peer)
{
	for (struct ident *i = c->idents; i; i = i->next)
		if (!i->pool && strcmp(i->agent, agent) == 0 && strcmp(i->peer, peer) == 0)
			return i;
	return NULL;
}

struct ident *ctl_ident_new(struct cap_ctl *c, const char *agent, const char *peer,
			    const char *name)
{
	struct ident *i = xcalloc(1, sizeof(*i));
	snprintf(i->agent, sizeof(i->agent), "%s", agent);
	snprintf(i->peer, sizeof(i->peer), "%s", peer);
	snprintf(i->name, sizeof(i->name), "%s", name);
	i->ctl = c;
	i->lc.state = CAP_VM_NONE;
	ctl_set_idle(c, &i->lc);
	i->source = -1;
	i->job_fd = -1;
	i->next = c->idents;
	c->idents = i;
	return i;
}

/* In memory while it has a VM, work or a job; otherwise only on disk. */
struct ident *ctl_ident_get(struct cap_ctl *c, const char *agent, const char *peer)
{
	struct ident *i = find(c, agent, peer);
	if (i)
		return i;
	char name[CAP_NAME_MAX + 1];
	enum cap_vm_state st;
	bool serving, has_source;
	name_of(c, agent, peer, name);
	i = ctl_ident_new(c, agent, peer, name);
	if (c->be->state(c->bud, name, &st, &serving, &has_source) == 0) {
		i->lc.state = CAP_VM_STOPPED;
		i->source = has_source;
		struct cap_err err = { 0 };
		/* Running though not ours yet (started by `capsule start`, or
		 * its attachment failed): take it over, never report it stopped. */
		if (st != CAP_VM_STOPPED && ctl_begin_job(c, i, CAP_CTL_JOB_WAIT, false, &err) == 0)
			i->lc.state = CAP_VM_STARTING;
	}
	return i;
}

void ctl_unlink_ident(struct cap_ctl *c, struct ident *x)
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
void ctl_idents_sweep(struct cap_ctl *c)
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

/* --- asking ----------------------------------------------------------------------- */

/* When the private import ran for an identity (0: not, or none set). */
static int64_t imported(struct cap_ctl *c, const char *agent, const char *peer)
{
	struct ctl_idrec_import note;
	if (!c->cfg.private_import || !agent[0] || ctl_idrec_read_import(c->home, agent, peer, &note) < 0)
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
	ctl_idrec_each(c->home, list_one, &l);
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
	ctl_idrec_each(c->home, owner_one, &o);
	return o.found ? 0 : -ENOENT;
}
