/* Shared between controller.c (identities, lifecycle) and controller-rpc.c
 * (JSON-RPC connections and methods). */
#ifndef CAP_CONTROLLER_INTERNAL_H
#define CAP_CONTROLLER_INTERNAL_H

#include <jansson.h>
#include <poll.h>

#include "buf.h"
#include "controller.h"
#include "named.h"
#include "sandbox.h"

/* JSON-RPC error codes (docs/serve.md). */
enum {
	RPC_PARSE = -32700,
	RPC_INVALID = -32600,
	RPC_METHOD = -32601,
	RPC_PARAMS = -32602,
	RPC_INTERNAL = -32603,
	RPC_SANDBOX = -32000,	/* the sandbox failed: message says why */
	RPC_CAPACITY = -32001,	/* every slot busy: retryable */
	RPC_TOOL = -32002,	/* the tool refused (file too big, not text...) */
	RPC_CANCELLED = -32800,
};

#define READ_MAX (2u << 20)
#define LIST_MAX 500
#define RPC_LINE_MAX (4u << 20)

struct conn {
	int fd;
	struct cap_buf in, out;
	bool discarding;	/* skipping the rest of an oversized line */
	bool closing;
	struct conn *next;
};

enum call_kind { CALL_EXEC, CALL_FILE, CALL_STOP, CALL_REMOVE };

struct ident;
struct ctl;

struct call {
	enum call_kind kind;
	json_t *id;	/* owned; NULL for a notification */
	struct conn *conn;	/* NULL once the client went away */
	struct ident *ident;
	struct cap_exec_req req;	/* owned strings */
	char *stdin_data;
	size_t stdin_len;
	/* CALL_FILE: the operation (root and path point into the fields
	 * below, data into stdin_data). */
	struct cap_file_req file;
	char root[16];
	char path[4200];
	/* How the answer is sent: NULL for a JSON-RPC reply on conn; a front
	 * end may turn results into its own form (MCP tool results). */
	void (*reply)(struct ctl *c, struct call *k, json_t *result, int code,
		      const char *msg, json_t *data);
	void *front;	/* the front end's own state for this call */
	uint32_t stream;
	bool cancelled;
	struct cap_buf out, err;
	int64_t start_ms;
	struct call *next;
};

struct ident {
	struct ctl *ctl;
	char agent[65], peer[65];
	char name[CAP_NAME_MAX + 1];
	struct cap_lc lc;
	struct cap_sandbox *sb;	/* attached while running, paused, stopping */
	bool pool;	/* a warm-pool VM: no identity yet (agent and peer empty) */
	bool no_source;	/* its sandbox projects no public data: nothing to refresh */
	int ready_fd;	/* while starting */
	pid_t shim_pid;
	bool stop_after_start;
	int64_t stop_deadline;	/* real ms */
	struct call *queue;
	struct call *active;
	struct ident *next;
};

/* A front end: how requests come in and answers go out. */
struct ctl_frontend {
	const char *name;	/* "serve", "mcp": for log lines */
	int (*setup)(struct ctl *c, struct cap_err *err);
	/* Add its descriptors from pfd[n], at most up to max; returns the new n. */
	int (*pollfds)(struct ctl *c, struct pollfd *pfd, void **owner, int n, int max);
	void (*step)(struct ctl *c, struct pollfd *pfd, void **owner, int from, int to);
	void (*flush)(struct ctl *c);
	void (*shutdown)(struct ctl *c);	/* stop taking requests */
	void (*teardown)(struct ctl *c);	/* release everything */
};

extern const struct ctl_frontend ctl_rpc_frontend;

struct ctl {
	struct cap_controller_cfg cfg;
	const struct ctl_frontend *fe;
	void *fe_state;
	bool frontend_done;	/* the front end has no more clients (MCP: stdin closed) */
	char *home;
	char *socket_path;
	int listen_fd, signal_fd, lock_fd;
	int64_t clock_offset;	/* manual clock: added to the real one */
	bool shutting_down;
	bool kick;	/* some queue may move */
	int64_t pool_retry_at;	/* real ms: warm-pool starts failed, wait till then */
	struct conn *conns;
	struct ident *idents;
};

int64_t ctl_now(const struct ctl *c);
struct ident *ctl_find(struct ctl *c, const char *agent, const char *peer);
struct ident *ctl_ident(struct ctl *c, const char *agent, const char *peer);
void ctl_enqueue(struct ctl *c, struct ident *i, struct call *k);
struct call *ctl_find_call(struct ctl *c, struct conn *conn, json_t *id);
/* Cancel a queued or running call; reply=false when its client is gone. */
bool ctl_cancel(struct ctl *c, struct call *k, bool reply);
void ctl_conn_gone(struct ctl *c, struct conn *conn);
void ctl_begin_stop(struct ctl *c, struct ident *i);
void call_free(struct call *k);
struct call *ctl_new_call(enum call_kind kind, struct conn *conn, json_t *id);
/* Make k a FILE operation (strings and data are copied into k). */
void ctl_file_call(struct call *k, enum cap_file_op op, const char *root,
		   const char *path, const void *data, size_t len);

/* Run the controller with a front end until shutdown. */
int ctl_run(const struct cap_controller_cfg *cfg, const struct ctl_frontend *fe,
	    void *fe_state, struct cap_err *err);
/* Send a result (code 0) or an error; takes ownership of result and data. */
void rpc_reply(struct ctl *c, struct conn *conn, json_t *id, json_t *result,
	       int code, const char *msg, json_t *data);

#endif
