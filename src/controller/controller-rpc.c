/* JSON-RPC 2.0 for `capsule serve`: one message per line on a unix socket
 * (0600), methods exec, read_file, status, list, stop, remove, cancel.
 * Every tool method carries the identity {agent, peer} from the trusted
 * caller; nothing in the parameters can name a sandbox directly. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "controller-internal.h"
#include "sock.h"
#include "util.h"

static int rpc_listen(struct ctl *c, const char *path, struct cap_err *err)
{
	int fd = cap_unix_listen(path, err);	/* we hold the lock: a socket file there is stale */
	if (fd < 0)
		return fd;
	c->listen_fd = fd;
	c->socket_path = xstrdup(path);
	return 0;
}

static void rpc_accept(struct ctl *c)
{
	for (;;) {
		int fd = accept4(c->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		struct conn *k = xcalloc(1, sizeof(*k));
		k->fd = fd;
		cap_buf_init(&k->in);
		cap_buf_init(&k->out);
		k->next = c->conns;
		c->conns = k;
	}
}

static void conn_free(struct ctl *c, struct conn *k)
{
	ctl_conn_gone(c, k);
	for (struct conn **p = &c->conns; *p; p = &(*p)->next)
		if (*p == k) {
			*p = k->next;
			break;
		}
	close(k->fd);
	cap_buf_fini(&k->in);
	cap_buf_fini(&k->out);
	free(k);
}

static void rpc_close_all(struct ctl *c)
{
	while (c->conns)
		conn_free(c, c->conns);
}

static void send_json(struct conn *k, json_t *msg)
{
	char *text = json_dumps(msg, JSON_COMPACT);
	if (text) {
		cap_buf_append(&k->out, text, strlen(text));
		cap_buf_append(&k->out, "\n", 1);
		free(text);
	}
	json_decref(msg);
}

void rpc_reply(struct ctl *c, struct conn *conn, json_t *id, json_t *result,
	       int code, const char *msg, json_t *data)
{
	(void)c;
	json_t *m = json_pack("{s:s, s:O}", "jsonrpc", "2.0", "id", id ? id : json_null());
	if (code == 0) {
		json_object_set_new(m, "result", result ? result : json_object());
		json_decref(data);
	} else {
		json_t *e = json_pack("{s:i, s:s}", "code", code, "message", msg ? msg : "error");
		if (data)
			json_object_set_new(e, "data", data);
		json_object_set_new(m, "error", e);
		json_decref(result);
	}
	send_json(conn, m);
}

static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
{
	char msg[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	json_t *m = json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(),
			      "error", "code", code, "message", msg);
	send_json(k, m);
}

/* identity: {"agent": "...", "peer": "..."}, both valid. */
static struct ident *identity(struct ctl *c, struct conn *k, json_t *id, json_t *params,
			      bool create)
{
	json_t *who = json_object_get(params, "identity");
	const char *agent = json_string_value(json_object_get(who, "agent"));
	const char *peer = json_string_value(json_object_get(who, "peer"));
	if (!agent || !peer) {
		error_to(k, id, RPC_PARAMS, "params.identity must be {\"agent\": string, \"peer\": string}");
		return NULL;
	}
	if (!cap_controller_id_valid(agent) || !cap_controller_id_valid(peer)) {
		error_to(k, id, RPC_PARAMS, "identity parts must be 1 to 64 of A-Z a-z 0-9 . _ @ + = : - and not start with '.'");
		return NULL;
	}
	struct ident *i = create ? ctl_ident(c, agent, peer) : ctl_find(c, agent, peer);
	if (!i && !create)
		error_to(k, id, RPC_PARAMS, "unknown identity %s/%s", agent, peer);
	return i;
}

static void m_exec(struct ctl *c, struct conn *k, json_t *id, json_t *params)
{
	json_t *argv = json_object_get(params, "argv");
	json_t *env = json_object_get(params, "env");
	json_t *cwd = json_object_get(params, "cwd");
	json_t *timeout = json_object_get(params, "timeout");
	json_t *in = json_object_get(params, "stdin");
	size_t n = json_array_size(argv);
	if (!json_is_array(argv) || n == 0 || n > CAP_PROTO_MAX_ARGS)
		return error_to(k, id, RPC_PARAMS, "params.argv must be a non-empty array of strings");
	if ((env && !json_is_object(env)) || (cwd && !json_is_string(cwd)) ||
	    (in && !json_is_string(in)) || (timeout && !json_is_number(timeout)))
		return error_to(k, id, RPC_PARAMS, "env must be an object of strings, cwd and stdin strings, timeout a number of seconds");
	double t = timeout ? json_number_value(timeout) : 30;
	if (t < 0 || t > 86400)
		return error_to(k, id, RPC_PARAMS, "timeout %g is out of range (0 to 86400 seconds)", t);
	for (size_t a = 0; a < n; a++)
		if (!json_is_string(json_array_get(argv, a)))
			return error_to(k, id, RPC_PARAMS, "params.argv[%zu] is not a string", a);
	struct ident *i = identity(c, k, id, params, true);
	if (!i)
		return;

	struct call *call = ctl_new_call(CALL_EXEC, k, id);
	call->req.argv = xcalloc(n + 1, sizeof(char *));
	for (size_t a = 0; a < n; a++)
		call->req.argv[a] = xstrdup(json_string_value(json_array_get(argv, a)));
	call->req.argc = (uint32_t)n;
	size_t ne = json_object_size(env);
	call->req.env = xcalloc(ne + 1, sizeof(char *));
	const char *key;
	json_t *val;
	json_object_foreach(env, key, val) {
		if (!json_is_string(val) || !*key || strchr(key, '=')) {
			call_free(call);
			return error_to(k, id, RPC_PARAMS, "env.%s must be a string value with a name without '='", key);
		}
		call->req.env[call->req.envc++] = xasprintf("%s=%s", key, json_string_value(val));
	}
	call->req.cwd = cwd ? xstrdup(json_string_value(cwd)) : NULL;
	call->req.timeout_ms = (uint32_t)(t * 1000);
	call->req.output_cap = 256 * 1024;
	if (in) {
		call->stdin_len = json_string_length(in);
		call->stdin_data = xmalloc(call->stdin_len + 1);
		memcpy(call->stdin_data, json_string_value(in), call->stdin_len);
		call->req.flags |= CAP_EXEC_STDIN;
	}
	ctl_enqueue(c, i, call);
}

/* read_file: the file's text from the public projection or the
 * identity's /work. The path stays relative and free of "..". */
static void m_read_file(struct ctl *c, struct conn *k, json_t *id, json_t *params)
{
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *root = json_string_value(json_object_get(params, "root"));
	if (!root)
		root = "public";
	bool pub = strcmp(root, "public") == 0;
	if (!pub && strcmp(root, "workspace") != 0)
		return error_to(k, id, RPC_PARAMS, "root must be \"public\" or \"workspace\"");
	if (!path || !*path || strlen(path) > 4096)
		return error_to(k, id, RPC_PARAMS, "path must be a non-empty string of at most 4096 bytes");
	if (path[0] == '/')
		return error_to(k, id, RPC_PARAMS, "path %s is absolute; give it relative to the %s root", path, root);
	for (const char *p = path; *p;) {
		size_t len = strcspn(p, "/");
		if (len == 2 && p[0] == '.' && p[1] == '.')
			return error_to(k, id, RPC_PARAMS, "path %s climbs out of its root with '..'", path);
		p += len;
		if (*p == '/')
			p++;
	}
	struct ident *i = identity(c, k, id, params, true);
	if (!i)
		return;
	struct call *call = ctl_new_call(CALL_FILE, k, id);
	ctl_file_call(call, CAP_FILE_READ, pub ? "/source" : "/work", path, NULL, 0);
	ctl_enqueue(c, i, call);
}

static json_t *describe(struct ident *i, int64_t now)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:i, s:i, s:I}", "agent", i->agent, "peer", i->peer,
			 "sandbox", i->name, "state", cap_vm_state_name(i->lc.state),
			 "active", (int)i->lc.active, "queued", (int)i->lc.queued,
			 "idle_ms", (json_int_t)(i->lc.active ? 0 : now - i->lc.idle_since));
}

static void m_status(struct ctl *c, struct conn *k, json_t *id, json_t *params)
{
	json_t *who = json_object_get(params, "identity");
	const char *agent = json_string_value(json_object_get(who, "agent"));
	const char *peer = json_string_value(json_object_get(who, "peer"));
	if (!agent || !peer)
		return error_to(k, id, RPC_PARAMS, "params.identity must be {\"agent\": string, \"peer\": string}");
	struct ident *i = ctl_find(c, agent, peer);
	if (!i || i->lc.state == CAP_VM_NONE)	/* status creates nothing */
		return rpc_reply(c, k, id, json_pack("{s:s, s:s, s:s, s:n}", "agent", agent, "peer", peer,
						     "state", "none", "sandbox"), 0, NULL, NULL);
	rpc_reply(c, k, id, describe(i, ctl_now(c)), 0, NULL, NULL);
}

static void m_list(struct ctl *c, struct conn *k, json_t *id)
{
	json_t *a = json_array();
	int ready = 0, members = 0;
	for (struct ident *i = c->idents; i; i = i->next) {
		if (i->pool) {
			members++;
			ready += i->sb && (i->lc.state == CAP_VM_RUNNING || i->lc.state == CAP_VM_PAUSED);
		} else if (i->lc.state != CAP_VM_NONE) {
			json_array_append_new(a, describe(i, ctl_now(c)));
		}
	}
	rpc_reply(c, k, id, json_pack("{s:o, s:i, s:{s:i, s:i, s:i}}", "sandboxes", a, "capacity", c->cfg.lc.capacity,
				      "warm_pool", "size", (int)c->cfg.warm_pool, "members", members, "ready", ready),
		  0, NULL, NULL);
}

static void m_stop_remove(struct ctl *c, struct conn *k, json_t *id, json_t *params, bool remove)
{
	struct ident *i = identity(c, k, id, params, true);
	if (!i)
		return;
	if (i->lc.state == CAP_VM_NONE)
		return rpc_reply(c, k, id, json_pack("{s:s, s:s}", "sandbox", i->name, "state", "none"), 0, NULL, NULL);
	ctl_enqueue(c, i, ctl_new_call(remove ? CALL_REMOVE : CALL_STOP, k, id));
}

static void m_cancel(struct ctl *c, struct conn *k, json_t *id, json_t *params)
{
	json_t *target = json_object_get(params, "id");
	if (!target || !(json_is_string(target) || json_is_integer(target)))
		return error_to(k, id, RPC_PARAMS, "params.id must be the id of one of your requests");
	struct call *call = ctl_find_call(c, k, target);
	bool done = call && ctl_cancel(c, call, true);
	rpc_reply(c, k, id, json_pack("{s:b}", "cancelled", done), 0, NULL, NULL);
}

static void handle(struct ctl *c, struct conn *k, const char *line, size_t len)
{
	json_error_t je;
	json_t *m = json_loadb(line, len, 0, &je);
	if (!m)
		return error_to(k, NULL, RPC_PARSE, "parse error: %s (column %d)", je.text, je.column);
	json_t *id = json_object_get(m, "id");
	const char *method = json_string_value(json_object_get(m, "method"));
	json_t *params = json_object_get(m, "params");
	if (!json_is_object(m) || !json_is_string(json_object_get(m, "jsonrpc")) ||
	    strcmp(json_string_value(json_object_get(m, "jsonrpc")), "2.0") != 0 || !method ||
	    (id && !json_is_string(id) && !json_is_integer(id) && !json_is_null(id)) ||
	    (params && !json_is_object(params))) {
		error_to(k, json_is_object(m) ? id : NULL, RPC_INVALID,
			 json_is_array(m) ? "batches are not supported; send one request per line"
					  : "not a JSON-RPC 2.0 request (jsonrpc \"2.0\", method, object params)");
		json_decref(m);
		return;
	}
	if (!params)
		params = json_object();
	else
		json_incref(params);
	if (strcmp(method, "exec") == 0)
		m_exec(c, k, id, params);
	else if (strcmp(method, "read_file") == 0)
		m_read_file(c, k, id, params);
	else if (strcmp(method, "status") == 0)
		m_status(c, k, id, params);
	else if (strcmp(method, "list") == 0)
		m_list(c, k, id);
	else if (strcmp(method, "stop") == 0)
		m_stop_remove(c, k, id, params, false);
	else if (strcmp(method, "remove") == 0)
		m_stop_remove(c, k, id, params, true);
	else if (strcmp(method, "cancel") == 0)
		m_cancel(c, k, id, params);
	else if (strcmp(method, "_test.advance") == 0 && c->cfg.manual_clock) {
		json_t *ms = json_object_get(params, "ms");
		c->clock_offset += json_integer_value(ms);
		rpc_reply(c, k, id, json_pack("{s:I}", "now", (json_int_t)ctl_now(c)), 0, NULL, NULL);
	} else
		error_to(k, id, RPC_METHOD, "method '%s' not found", method);
	json_decref(params);
	json_decref(m);
}

struct line_ctx {
	struct ctl *c;
	struct conn *k;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct line_ctx *lc = ud;
	handle(lc->c, lc->k, p, n);
}

static void on_too_long(void *ud)
{
	struct line_ctx *lc = ud;
	error_to(lc->k, NULL, RPC_INVALID, "request line over %u bytes", RPC_LINE_MAX);
}

static void conn_read(struct ctl *c, struct conn *k)
{
	uint8_t *p = cap_buf_reserve(&k->in, 65536);
	ssize_t n = read(k->fd, p, 65536);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		k->closing = true;
		return;
	}
	if (n < 0)
		return;
	cap_buf_commit(&k->in, (size_t)n);
	struct line_ctx lc = { c, k };
	cap_buf_lines(&k->in, RPC_LINE_MAX, &k->discarding, on_line, on_too_long, &lc);
}

static int rpc_pollfds(struct ctl *c, struct pollfd *pfd, void **owner, int n, int max)
{
	owner[n] = NULL;	/* the listening socket */
	pfd[n++] = (struct pollfd){ .fd = c->shutting_down ? -1 : c->listen_fd, .events = POLLIN };
	for (struct conn *k = c->conns; k && n < max; k = k->next) {
		owner[n] = k;
		pfd[n++] = (struct pollfd){ .fd = k->fd, .events = (short)(POLLIN | (cap_buf_used(&k->out) ? POLLOUT : 0)) };
	}
	return n;
}

static void rpc_step(struct ctl *c, struct pollfd *pfd, void **owner, int from, int to)
{
	for (int i = from; i < to; i++) {
		struct conn *k = owner[i];
		if (!k) {
			if (pfd[i].revents)
				rpc_accept(c);
			continue;
		}
		if (!k->closing && (pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
			conn_read(c, k);
	}
}

static void rpc_flush(struct ctl *c)
{
	struct conn *k = c->conns, *next;
	for (; k; k = next) {
		next = k->next;
		while (!k->closing && cap_buf_used(&k->out) > 0) {
			ssize_t n = send(k->fd, cap_buf_head(&k->out), cap_buf_used(&k->out), MSG_NOSIGNAL);
			if (n < 0) {
				if (errno != EAGAIN && errno != EINTR)
					k->closing = true;
				break;
			}
			cap_buf_consume(&k->out, (size_t)n);
		}
		if (k->closing)
			conn_free(c, k);
	}
}

static int rpc_setup(struct ctl *c, struct cap_err *err)
{
	_cleanup_free_ char *path = c->cfg.socket_path ? xstrdup(c->cfg.socket_path)
						       : xasprintf("%s/serve.sock", c->home);
	_cleanup_free_ char *lockp = xasprintf("%s.lock", path);
	/* One server per socket: the lock, not the socket file, says so. */
	c->lock_fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (c->lock_fd < 0 || flock(c->lock_fd, LOCK_EX | LOCK_NB) < 0)
		return cap_err_set(err, EBUSY, "another capsule serve is using %s (%s is locked)", path, lockp);
	int r = rpc_listen(c, path, err);
	if (r == 0)
		fprintf(stderr, "capsule serve: listening on %s\n", path);
	return r;
}

static void rpc_shutdown(struct ctl *c)
{
	/* Closed at the end of this round: the poll set still points at them. */
	for (struct conn *k = c->conns; k; k = k->next)
		k->closing = true;
}

static void rpc_teardown(struct ctl *c)
{
	rpc_close_all(c);
	if (c->listen_fd >= 0) {
		close(c->listen_fd);
		unlink(c->socket_path);
	}
	free(c->socket_path);
	c->socket_path = NULL;
}

const struct ctl_frontend ctl_rpc_frontend = {
	.name = "serve",
	.setup = rpc_setup,
	.pollfds = rpc_pollfds,
	.step = rpc_step,
	.flush = rpc_flush,
	.shutdown = rpc_shutdown,
	.teardown = rpc_teardown,
};

int cap_controller_run(const struct cap_controller_cfg *cfg, struct cap_err *err)
{
	return ctl_run(cfg, &ctl_rpc_frontend, NULL, err);
}
