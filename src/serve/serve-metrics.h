/* Inside src/serve: serve's own figures (calls by method and outcome,
 * their latencies), the Prometheus text that shows them with the
 * controller's (serve-metrics.c), and the HTTP endpoint that serves it
 * (serve-metrics-server.c). docs/serve.md, "Metrics". */
#ifndef CAP_SERVE_METRICS_H
#define CAP_SERVE_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "controller.h"
#include "err.h"

/* capsule_call_duration_seconds's upper bounds, ns (the +Inf bucket is
 * the count). */
#define SERVE_NBUCKETS 15
extern const int64_t serve_bucket_ns[SERVE_NBUCKETS];

/* A call's outcome: 0 "ok", then one per JSON-RPC error code of
 * docs/serve.md ("invalid_params", "sandbox_error", ...). */
#define SERVE_NOUTCOMES 10
unsigned serve_outcome(int code);	/* code 0: ok; an unknown code: "internal_error" */
const char *serve_outcome_name(unsigned outcome);

/* Requests that reached no method. */
enum serve_reject { SERVE_REJECT_PARSE, SERVE_REJECT_INVALID, SERVE_REJECT_METHOD, SERVE_REJECT_SHUTDOWN };
#define SERVE_NREJECT 4

struct serve_method_stats {
	uint64_t outcomes[SERVE_NOUTCOMES];
	uint64_t buckets[SERVE_NBUCKETS];	/* each bucket's own calls, not cumulative */
	uint64_t count;
	int64_t sum_ns;
};

struct serve_stats {
	struct serve_method_stats *owned_methods;	/* one per entry of the method table */
	size_t nmethods;
	uint64_t rejected[SERVE_NREJECT];
	unsigned connections;	/* JSON-RPC connections open */
};

void serve_stats_init(struct serve_stats *st, size_t nmethods);
void serve_stats_fini(struct serve_stats *st);
/* One answered call of method (an index of the table): its JSON-RPC
 * error code (0: a result) and how long it took. */
void serve_stats_note(struct serve_stats *st, size_t method, int code, int64_t ns);

/* Everything one scrape shows; borrowed. */
struct serve_metrics_in {
	const struct cap_ctl_metrics *ctl;
	const struct serve_stats *st;
	const char *const *method_names;	/* st->nmethods of them; NULL: a method not served */
	const char *version;
	int64_t now_unix_ms;
	/* The process's own (process_*: the client libraries' names); < 0
	 * when unknown. */
	double cpu_seconds;
	int64_t resident_bytes, open_fds, max_fds;
};

/* The Prometheus text exposition format, version 0.0.4: a HELP and a TYPE
 * line for each metric, then its samples; appended to out. */
void serve_metrics_text(const struct serve_metrics_in *in, struct cap_buf *out);

/* The listening socket for --metrics ADDR: "HOST:PORT" (an IPv4 address
 * or a name), "[IPv6]:PORT", or a unix socket path (one holding a '/';
 * a stale socket there is replaced, mode 0600). fd, or -errno with err
 * naming addr and what is accepted (or that it is in use). *bound (a new
 * string) says where it listens: the port chosen for port 0, a path
 * made absolute; *unlink_path (a new string, or NULL) the socket file to
 * remove at the end. */
int serve_metrics_listen(const char *addr, char **bound, char **unlink_path, struct cap_err *err);

struct cap_rpc_server;
struct serve_metrics;
/* Serve GET /metrics on fd from c's loop, with s's figures; *out is
 * owned by the caller (serve_metrics_free, after c's loop). fd, bound
 * and unlink_path are stolen, also on failure (-errno, err set). */
int serve_metrics_new(struct cap_ctl *c, struct cap_rpc_server *s, int fd, char *bound,
		      char *unlink_path, struct serve_metrics **out, struct cap_err *err);
const char *serve_metrics_addr(const struct serve_metrics *m);
void serve_metrics_free(struct serve_metrics *m);

#endif
