/* capsule-oci events --stats ID: the container's cgroup in the guest
 * (STATS) as runc's stats event, one JSON line: a pod's container's
 * cgroup, a plain container's process's, or for a pod's sandbox the
 * whole VM. Without --stats: runc streams events; capsule-oci does not
 * (refused, naming --stats). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>

#include "oci-int.h"
#include "util.h"

static json_t *u64(uint64_t v) { return json_integer((json_int_t)(v > (uint64_t)INT64_MAX ? (uint64_t)INT64_MAX : v)); }

static uint64_t get(const struct cap_stats *s, const char *k)
{
	const uint64_t *v = cap_stats_get(s, k);
	return v ? *v : 0;
}

/* runc's events.Stats of the guest's counters. */
json_t *cap_oci_stats_json(const struct cap_stats *s)
{
	json_t *cpu = json_pack("{s:{s:o,s:o,s:o},s:{s:o,s:o,s:o}}", "usage", "total",
				u64(get(s, "cpu.usage_usec") * 1000), "kernel", u64(get(s, "cpu.system_usec") * 1000),
				"user", u64(get(s, "cpu.user_usec") * 1000), "throttling", "periods",
				u64(get(s, "cpu.nr_periods")), "throttledPeriods", u64(get(s, "cpu.nr_throttled")),
				"throttledTime", u64(get(s, "cpu.throttled_usec") * 1000));
	uint64_t limit = cap_stats_get(s, "memory.max") ? get(s, "memory.max") : CAP_LIMIT_NONE;
	json_t *raw = json_object();
	for (uint32_t i = 0; i < s->n; i++)
		if (strncmp(s->v[i].key, "memory.stat.", 12) == 0)
			json_object_set_new(raw, s->v[i].key + 12, u64(s->v[i].value));
	json_t *mem = json_pack("{s:o,s:{s:o,s:o,s:o,s:o},s:o}", "cache", u64(get(s, "memory.stat.file")), "usage",
				"limit", u64(limit), "usage", u64(get(s, "memory.current")), "max",
				u64(get(s, "memory.peak")), "failcnt", u64(get(s, "memory.events.max")), "raw", raw);
	json_t *pids = json_pack("{s:o}", "current", u64(get(s, "pids.current")));
	if (cap_stats_get(s, "pids.max") && get(s, "pids.max") != CAP_LIMIT_NONE)
		json_object_set_new(pids, "limit", u64(get(s, "pids.max")));
	return json_pack("{s:o,s:o,s:o,s:{},s:{}}", "cpu", cpu, "memory", mem, "pids", pids, "blkio", "hugetlb");
}

int cap_oci_cmd_events(int argc, char **argv)
{
	static const char usage[] =
		"Usage: capsule-oci events --stats ID\n\n"
		"Print the container's counters once, as runc's stats event: CPU time, memory\n"
		"in use and its limit, processes, from its cgroup in the VM (a pod's sandbox:\n"
		"the whole VM).\n";
	bool stats = false;
	int rc = cap_oci_flag_verb(argc, argv, "stats", 's', usage, &stats);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1) {
		cap_oci_error("events needs exactly one container id");
		return 1;
	}
	if (!stats) {
		cap_oci_error("events: only --stats is supported (one stats event); capsule-oci does not stream events");
		return 1;
	}
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (cap_oci_state_load(argv[optind], &st, &err) < 0)
		return cap_oci_fail(&err);
	static struct cap_stats s;
	memset(&s, 0, sizeof(s));
	rc = cap_oci_guest_stats(&st, &s, &err) < 0 ? cap_oci_fail(&err)
						  : cap_oci_print_json(json_pack("{s:s,s:s,s:o}", "type", "stats", "id", st.id,
										 "data", cap_oci_stats_json(&s)),
								       JSON_COMPACT);
	cap_oci_state_fini(&st);
	return rc;
}
