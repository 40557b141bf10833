/* `runtime events --stats ID` prints runc's stats event, {"type":
 * "stats", "id": ..., "data": {"cpu": {"usage": {"total", "kernel",
 * "user"} (ns), "throttling": {...}}, "memory": {"usage": {"usage",
 * "limit", ...}, "swap": {...}, "raw": {memory.stat's keys}}, "pids":
 * {"current", "limit"}}}; the task API's Stats answers cgroups v2
 * Metrics (what containerd's CRI reads for a container's usage). */
#include <string.h>

#include <jansson.h>

#include "metrics-v2.pb-c.h"
#include "shim.h"
#include "util.h"

static uint64_t u64(json_t *o, const char *path)
{
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", path);
	json_t *v = o;
	for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v; k = strtok_r(NULL, ".", &save))
		v = json_object_get(v, k);
	if (json_is_integer(v) && json_integer_value(v) >= 0)
		return (uint64_t)json_integer_value(v);
	if (json_is_real(v) && json_real_value(v) >= 0)
		return (uint64_t)json_real_value(v);
	return 0;
}

uint8_t *shim_stats_metrics(const char *json, size_t *len, struct shim_status *st)
{
	json_error_t je;
	json_t *root = json_loads(json, 0, &je);
	json_t *data = json_object_get(root, "data");
	if (!json_is_object(data)) {
		json_decref(root);
		shim_fail(st, CAP_GRPC_INTERNAL, "events --stats printed no stats event (a JSON object with \"data\"): %s",
			  root ? "no data object" : je.text);
		return NULL;
	}
	Io__Containerd__Cgroups__V2__Metrics m = IO__CONTAINERD__CGROUPS__V2__METRICS__INIT;
	Io__Containerd__Cgroups__V2__PidsStat pids = IO__CONTAINERD__CGROUPS__V2__PIDS_STAT__INIT;
	Io__Containerd__Cgroups__V2__CPUStat cpu = IO__CONTAINERD__CGROUPS__V2__CPUSTAT__INIT;
	Io__Containerd__Cgroups__V2__MemoryStat mem = IO__CONTAINERD__CGROUPS__V2__MEMORY_STAT__INIT;
	pids.current = u64(data, "pids.current");
	pids.limit = u64(data, "pids.limit");
	cpu.usage_usec = u64(data, "cpu.usage.total") / 1000;
	cpu.user_usec = u64(data, "cpu.usage.user") / 1000;
	cpu.system_usec = u64(data, "cpu.usage.kernel") / 1000;
	cpu.nr_periods = u64(data, "cpu.throttling.periods");
	cpu.nr_throttled = u64(data, "cpu.throttling.throttledPeriods");
	cpu.throttled_usec = u64(data, "cpu.throttling.throttledTime") / 1000;
	mem.usage = u64(data, "memory.usage.usage");
	mem.usage_limit = u64(data, "memory.usage.limit");
	mem.swap_usage = u64(data, "memory.swap.usage");
	mem.swap_limit = u64(data, "memory.swap.limit");
	static const struct {
		const char *key;
		size_t off;
	} raw[] = {
#define F(k) { #k, offsetof(Io__Containerd__Cgroups__V2__MemoryStat, k) }
		F(anon), F(file), F(kernel_stack), F(slab), F(sock), F(shmem), F(file_mapped), F(file_dirty),
		F(file_writeback), F(anon_thp), F(inactive_anon), F(active_anon), F(inactive_file), F(active_file),
		F(unevictable), F(slab_reclaimable), F(slab_unreclaimable), F(pgfault), F(pgmajfault),
		F(workingset_refault), F(workingset_activate), F(workingset_nodereclaim), F(pgrefill), F(pgscan),
		F(pgsteal), F(pgactivate), F(pgdeactivate), F(pglazyfree), F(pglazyfreed), F(thp_fault_alloc),
		F(thp_collapse_alloc),
#undef F
	};
	json_t *r = json_object_get(json_object_get(data, "memory"), "raw");
	for (size_t i = 0; i < CAP_ARRAY_SIZE(raw); i++) {
		json_t *v = json_object_get(r, raw[i].key);
		if (json_is_integer(v) && json_integer_value(v) >= 0)
			*(uint64_t *)((char *)&mem + raw[i].off) = (uint64_t)json_integer_value(v);
	}
	m.pids = &pids;
	m.cpu = &cpu;
	m.memory = &mem;
	*len = protobuf_c_message_get_packed_size(&m.base);
	uint8_t *out = xmalloc(*len + 1);
	protobuf_c_message_pack(&m.base, out);
	json_decref(root);
	return out;
}
