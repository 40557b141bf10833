/* capsule-oci update --resources FILE|- ID: runc's linux.resources JSON
 * (memory.limit, cpu.quota/period/shares, pids.limit) written to the
 * container's cgroup in the guest (UPDATE): a pod's container's, or a
 * plain container's process's. A pod's sandbox container is the pod's
 * VM, sized at its create: refused. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "named.h"
#include "oci-int.h"
#include "sandbox.h"
#include "util.h"

/* Attach to the running VM of st: 0, or -errno with err set. */
static int attach(struct cap_oci_state *st, struct cap_sandbox **sb, struct cap_err *err)
{
	struct cap_named_status ns;
	int r = cap_named_status(st->sandbox, &ns, err);
	if (r < 0)
		return r;
	if (ns.state != CAP_NAMED_RUNNING || strcmp(st->status, "stopped") == 0)
		return cap_err_set(err, ESRCH, "container %s is not running (its VM, sandbox %s, is %s)", st->id,
				   st->sandbox, ns.state == CAP_NAMED_PAUSED ? "paused" : strcmp(st->status, "stopped") == 0 ? "stopped with it" : "stopped");
	return cap_sandbox_attach(ns.control, sb, err);
}

/* The guest's name of the container st, "" for the pod's VM (its
 * sandbox container). */
const char *cap_oci_guest_name(struct cap_oci_state *st)
{
	if (strcmp(cap_oci_jstr(st->j, "podRole"), "sandbox") == 0)
		return "";
	return cap_oci_jstr(st->j, "ctrName");
}

int cap_oci_guest_stats(struct cap_oci_state *st, struct cap_stats *out, struct cap_err *err)
{
	struct cap_sandbox *sb = NULL;
	int r = attach(st, &sb, err);
	if (r == 0)
		r = cap_sandbox_stats_wait(sb, cap_oci_guest_name(st), out, 30000, err);
	cap_sandbox_free(sb);
	return r;
}

struct update_opts {
	const char *resources;
};

static int update_opt(void *ud, int c, const char *arg)
{
	struct update_opts *o = ud;
	if (c == 'r') {
		o->resources = arg;
		return 0;
	}
	cap_oci_error("update: only --resources FILE|- is supported (runc's JSON of linux.resources)");
	return 1;
}

int cap_oci_cmd_update(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "resources", required_argument, NULL, 'r' },
		{ "memory", required_argument, NULL, 'm' }, { "cpu-quota", required_argument, NULL, 'q' },
		{ "cpu-period", required_argument, NULL, 'p' }, { "pids-limit", required_argument, NULL, 'P' },
		{ "help", no_argument, NULL, 'h' }, { 0 },
	};
	static const char usage[] =
		"Usage: capsule-oci update --resources FILE|- ID\n\n"
		"Change the container's limits in its VM: runc's JSON of linux.resources\n"
		"(memory.limit, cpu.quota, cpu.period, cpu.shares, pids.limit), from FILE or\n"
		"stdin, written to the container's cgroup in the guest.\n";
	struct update_opts o = { 0 };
	int rc = cap_oci_parse(argc, argv, "+r:h", opts, usage, update_opt, &o);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1 || !o.resources) {
		cap_oci_error("update needs --resources FILE|- and exactly one container id");
		return 1;
	}
	struct cap_err err = { 0 };
	json_error_t je;
	const char *shown = strcmp(o.resources, "-") == 0 ? "the resources on stdin" : o.resources;
	json_t *j = strcmp(o.resources, "-") == 0 ? json_loadf(stdin, JSON_DECODE_INT_AS_REAL, &je)
						   : json_load_file(o.resources, JSON_DECODE_INT_AS_REAL, &je);
	if (!j) {
		cap_oci_error("%s: not JSON: %s", shown, je.text);
		return 1;
	}
	struct cap_update u = { .op = CAP_UPDATE_LIMITS };
	int r = cap_oci_limits_json(j, shown, &u.limits, &err);
	json_decref(j);
	if (r < 0)
		return cap_oci_fail(&err);
	struct cap_oci_state st;
	if (cap_oci_state_load(argv[optind], &st, &err) < 0)
		return cap_oci_fail(&err);
	const char *name = cap_oci_guest_name(&st);
	struct cap_sandbox *sb = NULL;
	if (!*name)
		r = cap_err_set(&err, EINVAL, "container %s is a pod's sandbox: the pod's VM is sized when it is created; update the pod's containers",
				st.id);
	else if (!u.limits.set)
		r = 0;
	else if ((r = attach(&st, &sb, &err)) == 0) {
		snprintf(u.name, sizeof(u.name), "%s", name);
		r = cap_sandbox_update_wait(sb, &u, 30000, &err);
	}
	cap_sandbox_free(sb);
	cap_oci_state_fini(&st);
	return r < 0 ? cap_oci_fail(&err) : 0;
}
