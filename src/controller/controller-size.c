/* An identity's sizes: the server's defaults under its own override,
 * checked when the override is given (never at a start), kept in its
 * record and applied at its sandbox's next start. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "controller-state.h"
#include "util.h"

/* --- composing --------------------------------------------------------------------- */

/* over's given fields replace base's. */
static void overlay(struct cap_ctl_size *base, const struct cap_ctl_size *over)
{
	if (over->cpus)
		base->cpus = over->cpus;
	if (over->memory_mib)
		base->memory_mib = over->memory_mib;
	if (over->root_mib)
		base->root_mib = over->root_mib;
	if (over->work_mib)
		base->work_mib = over->work_mib;
}

/* What a sandbox gets with no override: the server's, else the record's. */
static void defaults(const struct cap_controller_cfg *cfg, struct cap_ctl_size *out)
{
	struct cap_record *r = xmalloc(sizeof(*r));
	cap_record_init(r);
	*out = (struct cap_ctl_size){ r->cpus, r->memory_mib, r->root_size_mib, r->work_size_mib };
	free(r);
	overlay(out, &cfg->size);
}

void ctl_size_want(struct cap_ctl *c, const struct ident *i, struct cap_ctl_size *out)
{
	struct cap_ctl_size over = { 0 };
	defaults(&c->cfg, out);
	if (!i->pool && ctl_idrec_read_size(c->home, i->agent, i->peer, &over) == 0)
		overlay(out, &over);
}

bool ctl_size_is_default(struct cap_ctl *c, const struct ident *i)
{
	struct cap_ctl_size want, def;
	ctl_size_want(c, i, &want);
	defaults(&c->cfg, &def);
	return memcmp(&want, &def, sizeof(want)) == 0;
}

/* --- checking -------------------------------------------------------------------- */

/* One field of a size: within the fixed range, the server's bound (max
 * 0: none; opt names its option) and the host's (host 0: unknown). */
static int check_field(const char *field, unsigned v, unsigned lo, unsigned hi, const char *unit,
		       unsigned max, const char *opt, uint64_t host, const char *host_what,
		       struct cap_err *err)
{
	if (v < lo || v > hi)
		return cap_err_set(err, ERANGE, "%s %u is out of range: %u to %u %s", field, v, lo, hi, unit);
	if (max && v > max)
		return cap_err_set(err, ERANGE, "%s %u is above this server's bound of %u %s (capsule serve %s); ask for at most %u",
				   field, v, max, unit, opt, max);
	if (host && v > host)
		return cap_err_set(err, ERANGE, "%s %u is more than %s: at most %" PRIu64 " %s", field, v,
				   host_what, host, unit);
	return 0;
}

/* What messages call a size's fields: a request's, the server's options. */
static const char *const api_names[4] = { "size.cpus", "size.memory_mib", "size.root_mib", "size.work_mib" };
static const char *const opt_names[4] = { "--cpus", "--memory", "--root-size", "--work-size" };
static const char *const max_names[4] = { "--max-cpus", "--max-memory", "--max-root-size", "--max-work-size" };

/* A size's given fields against every bound; exists: the identity's
 * sandbox's disks (NULL: it has none, and new disks must fit the host). */
static int check_size(const struct cap_controller_cfg *cfg, const struct cap_ctl_size *s,
		      const char *const names[4], bool host, const struct cap_ctl_size *exists,
		      const char *who, struct cap_err *err)
{
	int r;
	const struct cap_ctl_size *max = &cfg->size_max;
	if (s->cpus) {
		if ((r = check_field(names[0], s->cpus, 1, CAP_CPUS_MAX, "vCPUs", max->cpus, "--max-cpus",
				     host ? (uint64_t)cap_named_host_cpus() : 0, "this host's online CPUs", err)) < 0)
			return r;
	}
	if (s->memory_mib) {
		uint64_t most = 0, total, reserve;
		char what[160];
		if (!host || cap_named_host_memory(&most, &total, &reserve) < 0)
			most = total = reserve = 0;
		snprintf(what, sizeof(what), "this host can give (its %" PRIu64 " MiB less a reserve of %" PRIu64 " MiB)",
			 total, reserve);
		if ((r = check_field(names[1], s->memory_mib, CAP_MEMORY_MIN_MIB, CAP_MEMORY_MAX_MIB, "MiB",
				     max->memory_mib, "--max-memory", most, what, err)) < 0)
			return r;
	}
	const struct {
		const char *name, *opt, *what;
		unsigned v, max, had;
	} disks[] = {
		{ names[2], "--max-root-size", "root disk (the root file system's writable layer)", s->root_mib,
		  max->root_mib, exists ? exists->root_mib : 0 },
		{ names[3], "--max-work-size", "/work disk", s->work_mib, max->work_mib,
		  exists ? exists->work_mib : 0 },
	};
	uint64_t new_mib = 0;
	for (size_t d = 0; d < CAP_ARRAY_SIZE(disks); d++) {
		if (!disks[d].v)
			continue;
		if ((r = check_field(disks[d].name, disks[d].v, CAP_DISK_MIN_MIB, CAP_DISK_MAX_MIB, "MiB", disks[d].max,
				     disks[d].opt, 0, NULL, err)) < 0)
			return r;
		if (exists && disks[d].had && disks[d].v != disks[d].had)
			return cap_err_set(err, EEXIST, "%s %u: the sandbox of %s has its %s of %u MiB, made when it was created, and a disk is sized once; remove the sandbox (method remove: its disks go) to have it made anew with %u MiB",
					   disks[d].name, disks[d].v, who, disks[d].what, disks[d].had, disks[d].v);
		if (!exists)
			new_mib += disks[d].v;
	}
	if (new_mib) {
		_cleanup_free_ char *home = NULL;
		uint64_t avail = 0;
		if ((r = cap_named_host_disk(&avail, &home, err)) < 0)
			return r;
		if (new_mib > avail)
			return cap_err_set(err, ERANGE, "%s and %s ask for %" PRIu64 " MiB of disk, more than the %" PRIu64 " MiB free on the file system holding %s (the disks are sparse, but a guest that fills them would fill it); ask for less",
					   names[2], names[3], new_mib, avail, home);
	}
	return 0;
}

int cap_ctl_size_cfg_check(const struct cap_controller_cfg *cfg, struct cap_err *err)
{
	const struct cap_ctl_size *ds = &cfg->size, *ms = &cfg->size_max;
	const unsigned d[4] = { ds->cpus, ds->memory_mib, ds->root_mib, ds->work_mib };
	const unsigned m[4] = { ms->cpus, ms->memory_mib, ms->root_mib, ms->work_mib };
	struct cap_controller_cfg open = *cfg;
	memset(&open.size_max, 0, sizeof(open.size_max));
	/* The maxima within the fixed ranges, the defaults also within the
	 * host (the operator's own choice, checked once here rather than at
	 * each identity's start) and the maxima. A maximum above the host is
	 * no error: the host's bound holds as well. */
	int r = check_size(&open, &cfg->size_max, max_names, false, &cfg->size_max, "", err);
	if (r == 0)
		r = check_size(&open, &cfg->size, opt_names, true, &cfg->size, "", err);
	if (r < 0)
		return r;
	for (size_t k = 0; k < 4; k++)
		if (d[k] && m[k] && d[k] > m[k])
			return cap_err_set(err, ERANGE, "%s %u is above %s %u: the default must be within the bound",
					   opt_names[k], d[k], max_names[k], m[k]);
	return 0;
}

/* --- asking and setting ------------------------------------------------------------------ */

static void report(struct cap_ctl *c, const char *agent, const char *peer, const char *name,
		   struct cap_ctl_size_out *out)
{
	struct cap_ctl_status st;
	memset(out, 0, sizeof(*out));
	defaults(&c->cfg, &out->size);
	if (ctl_idrec_read_size(c->home, agent, peer, &out->over) == 0)
		overlay(&out->size, &out->over);
	cap_ctl_status(c, agent, peer, &st);
	/* A sandbox's record holds the sizes of its last start: those of the
	 * VM that runs. */
	if ((st.state == CAP_VM_RUNNING || st.state == CAP_VM_PAUSED) && c->be->sizes &&
	    c->be->sizes(c->bud, name, &out->running) < 0)
		memset(&out->running, 0, sizeof(out->running));
	out->pending = out->running.cpus && (out->running.cpus != out->size.cpus ||
					     out->running.memory_mib != out->size.memory_mib);
}

void cap_ctl_size_of(struct cap_ctl *c, const char *agent, const char *peer,
		     struct cap_ctl_size_out *out)
{
	char name[CAP_NAME_MAX + 1];
	ctl_ident_name(c, agent, peer, name);
	report(c, agent, peer, name, out);
}

int cap_ctl_set_size(struct cap_ctl *c, const char *agent, const char *peer,
		     const struct cap_ctl_size *want, struct cap_ctl_size_out *out,
		     struct cap_err *err)
{
	char name[CAP_NAME_MAX + 1], who[140];
	struct cap_ctl_size had = { 0 }, over = { 0 };
	ctl_ident_name(c, agent, peer, name);
	snprintf(who, sizeof(who), "%s/%s", agent, peer);
	bool exists = c->be->sizes && c->be->sizes(c->bud, name, &had) == 0;
	int r = check_size(&c->cfg, want, api_names, true, exists ? &had : NULL, who, err);
	if (r < 0)
		return r;
	ctl_idrec_read_size(c->home, agent, peer, &over);
	struct cap_ctl_size next = over;
	overlay(&next, want);
	if (memcmp(&next, &over, sizeof(next)) != 0 &&
	    (r = ctl_idrec_set_size(c->home, agent, peer, name, &next, err)) < 0)
		return r;
	report(c, agent, peer, name, out);
	return 0;
}
