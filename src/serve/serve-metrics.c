/* serve's figures and the Prometheus text exposition format (version
 * 0.0.4) of them and of the controller's (serve-metrics.h). */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonrpc.h"
#include "serve-metrics.h"
#include "util.h"

#define MS 1000000LL
const int64_t serve_bucket_ns[SERVE_NBUCKETS] = {
	1 * MS, 5 * MS, 10 * MS, 25 * MS, 50 * MS, 100 * MS, 250 * MS, 500 * MS,
	1000 * MS, 2500 * MS, 5000 * MS, 10000 * MS, 30000 * MS, 60000 * MS, 300000 * MS,
};
/* The same, as the le label says them. */
static const char *const bucket_le[SERVE_NBUCKETS] = {
	"0.001", "0.005", "0.01", "0.025", "0.05", "0.1", "0.25", "0.5",
	"1", "2.5", "5", "10", "30", "60", "300",
};

static const struct {
	int code;
	const char *name;
} outcomes[SERVE_NOUTCOMES] = {
	{ 0, "ok" },
	{ CAP_RPC_PARSE, "parse_error" },
	{ CAP_RPC_INVALID, "invalid_request" },
	{ CAP_RPC_METHOD, "method_not_found" },
	{ CAP_RPC_PARAMS, "invalid_params" },
	{ CAP_RPC_INTERNAL, "internal_error" },
	{ CAP_RPC_SANDBOX, "sandbox_error" },
	{ CAP_RPC_CAPACITY, "capacity" },
	{ CAP_RPC_TOOL, "tool_error" },
	{ CAP_RPC_CANCELLED, "cancelled" },
};

unsigned serve_outcome(int code)
{
	for (unsigned i = 0; i < SERVE_NOUTCOMES; i++)
		if (outcomes[i].code == code)
			return i;
	return serve_outcome(CAP_RPC_INTERNAL);
}

const char *serve_outcome_name(unsigned outcome)
{
	return outcome < SERVE_NOUTCOMES ? outcomes[outcome].name : "unknown";
}

void serve_stats_init(struct serve_stats *st, size_t nmethods)
{
	memset(st, 0, sizeof(*st));
	st->owned_methods = xcalloc(nmethods, sizeof(*st->owned_methods));
	st->nmethods = nmethods;
}

void serve_stats_fini(struct serve_stats *st)
{
	free(st->owned_methods);
	st->owned_methods = NULL;
}

void serve_stats_note(struct serve_stats *st, size_t method, int code, int64_t ns)
{
	if (method >= st->nmethods)
		return;
	struct serve_method_stats *m = &st->owned_methods[method];
	if (ns < 0)
		ns = 0;
	m->outcomes[serve_outcome(code)]++;
	m->count++;
	m->sum_ns += ns;
	for (size_t b = 0; b < SERVE_NBUCKETS; b++)
		if (ns <= serve_bucket_ns[b]) {
			m->buckets[b]++;
			break;
		}
}

/* --- the text format ------------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static void put(struct cap_buf *out, const char *fmt, ...)
{
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	if (n > 0)
		cap_buf_append(out, line, (size_t)n < sizeof(line) ? (size_t)n : sizeof(line) - 1);
}

/* A label value, escaped as the format wants: \\, \" and \n. */
static void put_value(struct cap_buf *out, const char *v)
{
	for (; *v; v++) {
		if (*v == '\\' || *v == '"')
			cap_buf_append(out, "\\", 1);
		if (*v == '\n')
			cap_buf_append(out, "\\n", 2);
		else
			cap_buf_append(out, v, 1);
	}
}

/* The HELP and TYPE lines of a metric (help holds no \\ or newline). */
static void family(struct cap_buf *out, const char *name, const char *type, const char *help)
{
	put(out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* name{label="value"} n */
static void sample1(struct cap_buf *out, const char *name, const char *label, const char *value, uint64_t n)
{
	put(out, "%s{%s=\"", name, label);
	put_value(out, value);
	put(out, "\"} %" PRIu64 "\n", n);
}

static void gauge(struct cap_buf *out, const char *name, const char *help, double v)
{
	family(out, name, "gauge", help);
	put(out, "%s %.15g\n", name, v);
}

static void counter(struct cap_buf *out, const char *name, const char *help, double v)
{
	family(out, name, "counter", help);
	put(out, "%s %.15g\n", name, v);
}

static void calls(struct cap_buf *out, const struct serve_metrics_in *in)
{
	const struct serve_stats *st = in->st;
	family(out, "capsule_calls_total", "counter",
	       "JSON-RPC requests answered (notifications included), by method and outcome (ok or the error's name); a method's series appear with its first call.");
	for (size_t m = 0; m < st->nmethods; m++) {
		const struct serve_method_stats *s = &st->owned_methods[m];
		if (!in->method_names[m] || !s->count)
			continue;
		for (unsigned o = 0; o < SERVE_NOUTCOMES; o++) {
			if (!s->outcomes[o] && o != 0)
				continue;
			put(out, "capsule_calls_total{method=\"");
			put_value(out, in->method_names[m]);
			put(out, "\",outcome=\"%s\"} %" PRIu64 "\n", outcomes[o].name, s->outcomes[o]);
		}
	}
	family(out, "capsule_call_duration_seconds", "histogram",
	       "Time from a request's arrival to its answer, by method.");
	for (size_t m = 0; m < st->nmethods; m++) {
		const struct serve_method_stats *s = &st->owned_methods[m];
		if (!in->method_names[m] || !s->count)
			continue;
		uint64_t cum = 0;
		for (size_t b = 0; b <= SERVE_NBUCKETS; b++) {
			cum += b < SERVE_NBUCKETS ? s->buckets[b] : 0;
			put(out, "capsule_call_duration_seconds_bucket{method=\"");
			put_value(out, in->method_names[m]);
			put(out, "\",le=\"%s\"} %" PRIu64 "\n", b < SERVE_NBUCKETS ? bucket_le[b] : "+Inf",
			    b < SERVE_NBUCKETS ? cum : s->count);
		}
		put(out, "capsule_call_duration_seconds_sum{method=\"");
		put_value(out, in->method_names[m]);
		put(out, "\"} %.9f\n", (double)s->sum_ns / 1e9);
		put(out, "capsule_call_duration_seconds_count{method=\"");
		put_value(out, in->method_names[m]);
		put(out, "\"} %" PRIu64 "\n", s->count);
	}
	static const char *const reasons[SERVE_NREJECT] = {
		[SERVE_REJECT_PARSE] = "parse_error", [SERVE_REJECT_INVALID] = "invalid_request",
		[SERVE_REJECT_METHOD] = "method_not_found", [SERVE_REJECT_SHUTDOWN] = "shutting_down",
	};
	family(out, "capsule_rpc_rejected_total", "counter",
	       "JSON-RPC messages that reached no method: not JSON, not a request, an unknown method, or sent while shutting down.");
	for (size_t r = 0; r < SERVE_NREJECT; r++)
		sample1(out, "capsule_rpc_rejected_total", "reason", reasons[r], st->rejected[r]);
	gauge(out, "capsule_rpc_connections", "JSON-RPC connections open.", st->connections);
}

static void controller(struct cap_buf *out, const struct cap_ctl_metrics *c)
{
	family(out, "capsule_sandboxes", "gauge", "Sandboxes this controller holds (identities' and the warm pool's), by lifecycle state.");
	for (unsigned s = CAP_VM_STOPPED; s < CAP_VM_NSTATES; s++)
		sample1(out, "capsule_sandboxes", "state", cap_vm_state_name((enum cap_vm_state)s), c->sandboxes[s]);
	gauge(out, "capsule_identities", "Identities with a sandbox (in any state) in this controller's home.", c->identities);
	gauge(out, "capsule_capacity", "Resident VMs allowed at once (--capacity).", c->capacity);
	gauge(out, "capsule_warm_pool_ready", "Warm-pool sandboxes started and ready to be given to an identity.", c->pool_ready);
	family(out, "capsule_prepares_total", "counter", "Preparation runs (kernel, initramfs, image, template), by outcome.");
	for (unsigned o = 0; o < CAP_CTL_PREP_NOUTCOMES; o++)
		sample1(out, "capsule_prepares_total", "outcome", cap_ctl_prep_outcome_name((enum cap_ctl_prep_outcome)o),
			c->prepares[o]);
	family(out, "capsule_evictions_total", "counter",
	       "VMs the controller paused or stopped on its own: idle_pause, idle_stop, capacity (stopped to make room), unresponsive (killed for not ending a command in time).");
	for (unsigned e = 0; e < CAP_CTL_NEVICT; e++)
		sample1(out, "capsule_evictions_total", "reason", cap_ctl_evict_name((enum cap_ctl_evict)e), c->evictions[e]);
	counter(out, "capsule_network_refusals_total",
		"Connections, DNS queries and packets the sandboxes' policy processes refused (each also a line of the sandbox's net.log).",
		(double)c->net_refused);
	family(out, "capsule_network_bytes_total", "counter",
	       "Bytes through the sandboxes' policy processes: out (guest to outside), in (outside to guest).");
	sample1(out, "capsule_network_bytes_total", "direction", "in", c->net_bytes_in);
	sample1(out, "capsule_network_bytes_total", "direction", "out", c->net_bytes_out);
	gauge(out, "capsule_memory_held_bytes",
	      "Host memory the resident sandboxes hold: the proportional set size (PSS) of each one's shim, hypervisor and policy process, summed.",
	      (double)c->memory_bytes);
	gauge(out, "capsule_memory_held_sandboxes", "Resident sandboxes capsule_memory_held_bytes was read for.",
	      c->memory_sandboxes);
}

void serve_metrics_text(const struct serve_metrics_in *in, struct cap_buf *out)
{
	family(out, "capsule_build_info", "gauge", "Always 1; the version label says which capsule serves.");
	sample1(out, "capsule_build_info", "version", in->version, 1);
	gauge(out, "capsule_start_time_seconds", "When this controller started, Unix time.",
	      (double)in->ctl->start_unix_ms / 1000);
	gauge(out, "capsule_uptime_seconds", "Seconds since this controller started.",
	      (double)(in->now_unix_ms - in->ctl->start_unix_ms) / 1000);
	calls(out, in);
	controller(out, in->ctl);
	if (in->cpu_seconds >= 0)
		counter(out, "process_cpu_seconds_total", "User and system CPU time of this process.", in->cpu_seconds);
	if (in->resident_bytes >= 0)
		gauge(out, "process_resident_memory_bytes", "Resident memory of this process (not of its sandboxes).",
		      (double)in->resident_bytes);
	if (in->open_fds >= 0)
		gauge(out, "process_open_fds", "Open file descriptors of this process.", (double)in->open_fds);
	if (in->max_fds >= 0)
		gauge(out, "process_max_fds", "This process's limit of open file descriptors.", (double)in->max_fds);
	gauge(out, "process_start_time_seconds", "When this process started, Unix time.",
	      (double)in->ctl->start_unix_ms / 1000);
}
