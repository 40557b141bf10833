/* Inside src/serve: a connection, the calls it has submitted and the
 * server they belong to, shared by its files (serve.c: connections and
 * start-up; serve-methods.c: the methods; serve-json.c: results to
 * JSON). */
#ifndef CAP_SERVE_CONN_H
#define CAP_SERVE_CONN_H

#include <jansson.h>
#include <stdbool.h>

#include "controller.h"
#include "jsonrpc.h"
#include "serve-metrics.h"
#include "serve.h"

#define WRITE_MAX 60000	/* one FILE frame */
#define MAX_CONNS 512	/* connections at once; more are told so and closed */
/* A request line: room for an inline upload's base64 (4 bytes per 3)
 * and the rest of the message (a path of 4 KiB escaped 6 times over). */
#define REQUEST_MAX ((size_t)24 << 20)
_Static_assert(REQUEST_MAX >= 4 * (((size_t)CAP_CTL_INLINE_MAX + 2) / 3) + (1u << 20),
	       "an inline upload fits in a request line");

struct conn;

enum method { M_TOOL, M_UPLOAD, M_DOWNLOAD, M_PREPARE };

/* A call submitted for a connection; the tag the core gives back. */
struct pending {
	struct conn *conn;	/* NULL once the client went away */
	json_t *id;	/* NULL for a notification: no answer */
	char path[4200];	/* FILE, XFER: as asked */
	enum method method;
	char *owned_to;	/* download: where the copy went (resolved) */
	json_t *size;	/* exec given a size: what it came to, for the answer */
	enum cap_file_op op;
	struct cap_ctl_call *call;
	size_t mi;	/* the method's index in the table, for the figures */
	int64_t start_ns;	/* when its request arrived (cap_now_ns) */
	struct pending *next;	/* in conn->calls */
};

struct conn {
	struct cap_rpc_server *srv;
	int fd;
	struct cap_rpc_reader rd;
	struct cap_buf out;
	bool closing;
	struct pending *calls;
	struct conn *next;
};

struct cap_rpc_server {
	struct cap_ctl *ctl;
	struct cap_ctl_fe *fe;
	char *path;
	int listen_fd, lock_fd;
	bool adopted;	/* handed over (socket activation): never unlinked here */
	bool stopped;	/* shutting down: no new connections or requests */
	int spare_fd;	/* held for refusing a connection when out of descriptors */
	struct conn *conns;
	int nconns;
	struct check_job *checks;	/* image_check calls under way (serve-image.c) */
	int check_efd;	/* their threads say they are done here; -1 */
	/* Figures (serve-metrics.h), and the request being run: its answer,
	 * given while it runs, is counted for it; a call it submits takes
	 * it over (serve_pending_begin). */
	struct serve_stats stats;
	struct {
		bool open;
		size_t mi;
		int64_t start_ns;
	} cur;
	struct serve_metrics *metrics;	/* --metrics, or NULL */
};

struct check_job;
/* serve-image.c: image_check, in a thread; its answer once the loop sees
 * check_efd ready (serve_checks_ready); a connection's checks forgotten
 * when it closes (answered to no one); every one waited for at the end. */
void serve_image_check(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params);
void serve_checks_ready(struct cap_rpc_server *s);
void serve_checks_forget(struct cap_rpc_server *s, struct conn *k);
void serve_checks_fini(struct cap_rpc_server *s);

/* The request being run answered with code (0: a result). */
void serve_noted(struct cap_rpc_server *s, int code);
/* p is the call the request being run submitted: it is counted when it
 * is answered. */
void serve_pending_begin(struct cap_rpc_server *s, struct pending *p);
/* The method table's names for the figures: *names (a new array, free
 * it; the strings static) with NULL for a method this server does not
 * serve; returns how many. */
size_t serve_method_names(const struct cap_rpc_server *s, const char ***names);
size_t serve_method_count(void);
static inline const struct serve_stats *serve_stats_of(const struct cap_rpc_server *s)
{
	return &s->stats;
}

/* An error answer to request id (none to a notification). */
void serve_error(struct conn *k, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* The answer to a request (none to a notification); result is stolen. */
void serve_result(struct conn *k, json_t *id, json_t *result);

/* serve-methods.c: one request line of connection k, decoded and run. */
void serve_handle(struct cap_rpc_server *s, struct conn *k, const char *line, size_t len);

/* serve-json.c: the answer to p's tool method, r its result; returns its
 * JSON-RPC error code (0: a result), also when none was sent (a
 * notification, a client gone). */
int serve_answer(struct cap_rpc_server *s, struct pending *p, const struct cap_ctl_result *r);
/* v[0..n) as a JSON array of strings. A new reference. */
json_t *serve_strings(const char *const *v, size_t n);
/* An identity's sizes as set_size, exec and status answer them. A new
 * reference. */
json_t *serve_size_json(const struct cap_ctl_size_out *o);
/* One identity's status as status and list answer it. A new reference. */
json_t *serve_status_json(const struct cap_ctl_status *st);

#endif
