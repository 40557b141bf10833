/* JSON-RPC 2.0 for `capsule serve` and for any front end that shares a
 * controller: one message per line on a unix socket (0600). Tool methods
 * carry the identity {agent, peer} from the trusted caller; no parameter
 * of a tool method can name a sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "controller-internal.h"
#include "jsonrpc.h"
#include "policy.h"
#include "paths.h"
#include "serve.h"
#include "sock.h"
#include "utf8.h"
#include "util.h"

#define WRITE_MAX 60000	/* one FILE frame */
#define MAX_CONNS 512	/* connections at once; more are told so and closed */

struct conn;

/* A call submitted for a connection; the tag the core gives back. */
struct pending {
	struct conn *conn;	/* NULL once the client went away */
	json_t *id;	/* NULL for a notification: no answer */
	char path[4200];	/* FILE: as asked */
	enum cap_file_op op;
	struct cap_ctl_call *call;
	struct pending *next;	/* in conn->calls */
};

struct conn {
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
	bool stopped;	/* shutting down: no new connections or requests */
	int spare_fd;	/* held for refusing a connection when out of descriptors */
	struct conn *conns;
	int nconns;
};

static const struct cap_ctl_frontend_ops rpc_ops;

/* --- connections ------------------------------------------------------------- */

static void conn_free(struct cap_rpc_server *s, struct conn *k)
{
	/* Its calls are cancelled: queued ones end now (done() unlinks
	 * them), running ones when the guest says so, without an answer. */
	for (struct pending *p = k->calls; p; p = p->next)
		p->conn = NULL;
	struct pending *p = k->calls;
	k->calls = NULL;
	while (p) {
		struct pending *next = p->next;
		p->next = NULL;
		if (p->call)
			cap_ctl_cancel(s->ctl, p->call);
		p = next;
	}
	for (struct conn **q = &s->conns; *q; q = &(*q)->next)
		if (*q == k) {
			*q = k->next;
			break;
		}
	close(k->fd);
	cap_rpc_reader_fini(&k->rd);
	cap_buf_fini(&k->out);
	free(k);
	s->nconns--;
}

static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	if (!id)
		return;	/* a notification is never answered */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_rpc_put_error(&k->out, id, code, msg, NULL);
}

/* The answer to a request (none to a notification); result is stolen. */
static void result_to(struct conn *k, json_t *id, json_t *result)
{
	if (id)
		cap_rpc_put_result(&k->out, id, result);
	else
		json_decref(result);
}

/* --- results --------------------------------------------------------------------- */

static const char *type_name(char t)
{
	return t == 'd' ? "directory" : t == 'f' ? "file" : t == 'l' ? "symlink" : "other";
}

static int code_of(enum cap_ctl_code c)
{
	switch (c) {
	case CAP_CTL_ESANDBOX: return CAP_RPC_SANDBOX;
	case CAP_CTL_ECAPACITY: return CAP_RPC_CAPACITY;
	case CAP_CTL_ETOOL: return CAP_RPC_TOOL;
	case CAP_CTL_ECANCELLED: return CAP_RPC_CANCELLED;
	default: return CAP_RPC_INTERNAL;
	}
}

static void answer(struct cap_rpc_server *s, struct pending *p, const struct cap_ctl_result *r)
{
	struct conn *k = p->conn;
	if (!k || !p->id)
		return;
	if (r->code != CAP_CTL_OK) {
		json_t *data = NULL;
		if (r->code == CAP_CTL_ECAPACITY)
			data = json_pack("{s:b, s:i}", "retryable", 1, "capacity", cap_ctl_cfg(s->ctl)->lc.capacity);
		else if (r->errnum)
			data = json_pack("{s:i}", "errno", r->errnum);
		cap_rpc_put_error(&k->out, p->id, code_of(r->code), r->msg, data);
		return;
	}
	json_t *res;
	const struct cap_exit *ex = &r->exit;
	switch (r->kind) {
	case CAP_CTL_EXEC:
		res = json_pack("{s:s, s:o, s:o, s:b, s:b, s:o, s:o, s:i}", "sandbox", r->sandbox,
				"exit_code", ex->kind == CAP_EXIT_SIGNAL ? json_null() : json_integer(cap_exit_status(ex)),
				"signal", ex->kind == CAP_EXIT_SIGNAL ? json_integer(ex->value) : json_null(),
				"timed_out", (ex->flags & CAP_EXIT_TIMED_OUT) != 0,
				"truncated", (ex->flags & CAP_EXIT_TRUNCATED) != 0,
				"stdout", cap_json_textn(r->out, r->out_len), "stderr", cap_json_textn(r->err, r->err_len),
				"duration_ms", (int)ex->duration_ms);
		if (r->note)
			json_object_set_new(res, "note", cap_json_text(r->note));
		break;
	case CAP_CTL_FILE:
		if (p->op == CAP_FILE_WRITE) {
			res = json_pack("{s:s, s:s, s:I}", "sandbox", r->sandbox, "path", p->path,
					"bytes", (json_int_t)r->written);
		} else if (r->is_dir) {
			json_t *a = json_array();
			for (size_t e = 0; e < r->nentries; e++) {
				json_t *o = json_pack("{s:s, s:o}", "type", type_name(r->entries[e].type),
						      "name", cap_json_textn((const uint8_t *)r->entries[e].name,
									strlen(r->entries[e].name)));
				if (r->entries[e].type == 'f')
					json_object_set_new(o, "size", json_integer((json_int_t)r->entries[e].size));
				json_array_append_new(a, o);
			}
			res = json_pack("{s:s, s:s, s:o, s:b}", "sandbox", r->sandbox, "kind", "directory",
					"entries", a, "truncated", r->entries_truncated);
		} else if (p->op == CAP_FILE_LIST) {
			error_to(k, p->id, CAP_RPC_TOOL, "%s is not a directory", p->path);
			return;
		} else if (!cap_utf8_valid((const char *)r->content, r->content_len)) {
			error_to(k, p->id, CAP_RPC_TOOL, "the file is not UTF-8 text; read_file reads text only");
			return;
		} else {
			res = json_pack("{s:s, s:s, s:s%}", "sandbox", r->sandbox, "kind", "file", "content",
					(const char *)r->content, r->content_len);
		}
		break;
	default:
		res = json_pack("{s:s, s:s}", "sandbox", r->sandbox ? r->sandbox : "", "state", r->state);
		break;
	}
	result_to(k, p->id, res);
}

static void rpc_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	struct cap_rpc_server *s = fe;
	struct pending *p = tag;
	(void)c;
	answer(s, p, r);
	if (p->conn)
		for (struct pending **q = &p->conn->calls; *q; q = &(*q)->next)
			if (*q == p) {
				*q = p->next;
				break;
			}
	json_decref(p->id);
	free(p);
}

/* --- methods ------------------------------------------------------------------------ */

/* identity: {"agent": "...", "peer": "..."}, both valid; or an error sent. */
static bool identity(struct conn *k, json_t *id, json_t *params, const char **agent, const char **peer)
{
	json_t *who = json_object_get(params, "identity");
	*agent = json_string_value(json_object_get(who, "agent"));
	*peer = json_string_value(json_object_get(who, "peer"));
	if (!*agent || !*peer) {
		error_to(k, id, CAP_RPC_PARAMS, "params.identity must be {\"agent\": string, \"peer\": string}");
		return false;
	}
	if (!cap_controller_id_valid(*agent) || !cap_controller_id_valid(*peer)) {
		error_to(k, id, CAP_RPC_PARAMS, "identity parts must be 1 to 64 of A-Z a-z 0-9 . _ @ + = : - and not start with '.'");
		return false;
	}
	return true;
}

static void submit(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *agent,
		   const char *peer, const struct cap_ctl_req *req, const char *path)
{
	struct pending *p = xcalloc(1, sizeof(*p));
	p->conn = k;
	p->id = id ? json_incref(id) : NULL;
	p->op = req->op;
	if (path)
		snprintf(p->path, sizeof(p->path), "%s", path);
	p->next = k->calls;
	k->calls = p;
	p->call = cap_ctl_submit(s->ctl, s->fe, agent, peer, req, p);
}

static void m_exec(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *argv = json_object_get(params, "argv");
	json_t *env = json_object_get(params, "env");
	json_t *cwd = json_object_get(params, "cwd");
	json_t *timeout = json_object_get(params, "timeout");
	json_t *in = json_object_get(params, "stdin");
	json_t *pids = json_object_get(params, "pids_max");
	size_t n = json_array_size(argv);
	const char *agent, *peer;
	if (!json_is_array(argv) || n == 0 || n > CAP_PROTO_MAX_ARGS)
		return error_to(k, id, CAP_RPC_PARAMS, "params.argv must be a non-empty array of strings");
	if ((env && !json_is_object(env)) || (cwd && !json_is_string(cwd)) ||
	    (in && !json_is_string(in)) || (timeout && !json_is_number(timeout)))
		return error_to(k, id, CAP_RPC_PARAMS, "env must be an object of strings, cwd and stdin strings, timeout a number of seconds");
	if (pids && (!json_is_integer(pids) || json_integer_value(pids) < 1 || json_integer_value(pids) > (1 << 22)))
		return error_to(k, id, CAP_RPC_PARAMS, "pids_max must be an integer from 1 to %d", 1 << 22);
	double t = timeout ? json_number_value(timeout) : 30;
	if (t < 0 || t > 86400)
		return error_to(k, id, CAP_RPC_PARAMS, "timeout %g is out of range (0 to 86400 seconds)", t);
	for (size_t a = 0; a < n; a++)
		if (!json_is_string(json_array_get(argv, a)))
			return error_to(k, id, CAP_RPC_PARAMS, "params.argv[%zu] is not a string", a);
	const char *key;
	json_t *val;
	json_object_foreach(env, key, val)
		if (!json_is_string(val) || !*key || strchr(key, '='))
			return error_to(k, id, CAP_RPC_PARAMS, "env.%s must be a string value with a name without '='", key);
	if (!identity(k, id, params, &agent, &peer))
		return;

	size_t ne = json_object_size(env);
	const char **av = xcalloc(n + 1, sizeof(char *));
	char **ev = xcalloc(ne + 1, sizeof(char *));
	for (size_t a = 0; a < n; a++)
		av[a] = json_string_value(json_array_get(argv, a));
	uint32_t envc = 0;
	json_object_foreach(env, key, val)
		ev[envc++] = xasprintf("%s=%s", key, json_string_value(val));
	struct cap_exec_req x = {
		.argv = (char **)av, .argc = (uint32_t)n, .env = ev, .envc = envc,
		.cwd = cwd ? (char *)json_string_value(cwd) : NULL,
		.timeout_ms = (uint32_t)(t * 1000), .output_cap = 256 * 1024,
		.pids_max = pids ? (uint32_t)json_integer_value(pids) : 0,
	};
	struct cap_ctl_req req = { .kind = CAP_CTL_EXEC, .exec = &x };
	if (in) {
		req.stdin_data = json_string_value(in);
		req.stdin_len = json_string_length(in);
	}
	submit(s, k, id, agent, peer, &req, NULL);
	for (uint32_t e = 0; e < envc; e++)
		free(ev[e]);
	free(ev);
	free(av);
}

/* read_file, list_directory, write_file: a path relative to the public
 * data (/source) or the identity's /work, free of "..". */
static void m_file(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params,
		   enum cap_file_op op)
{
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *root = json_string_value(json_object_get(params, "root"));
	json_t *content = json_object_get(params, "content");
	json_t *max = json_object_get(params, "max_bytes");
	const char *agent, *peer;
	if (!root)
		root = op == CAP_FILE_WRITE ? "workspace" : "public";
	bool pub = strcmp(root, "public") == 0;
	if (!pub && strcmp(root, "workspace") != 0)
		return error_to(k, id, CAP_RPC_PARAMS, "root must be \"public\" or \"workspace\"");
	if (op == CAP_FILE_WRITE && pub)
		return error_to(k, id, CAP_RPC_PARAMS, "the public data is read-only; write_file writes to root \"workspace\" (/work)");
	if (!path && op == CAP_FILE_LIST)
		path = "";
	if (!path || (!*path && op != CAP_FILE_LIST) || strlen(path) > 4096)
		return error_to(k, id, CAP_RPC_PARAMS, "path must be a non-empty string of at most 4096 bytes");
	if (path[0] == '/')
		return error_to(k, id, CAP_RPC_PARAMS, "path %s is absolute; give it relative to the %s root", path, root);
	if (!cap_proto_file_path_ok(path))
		return error_to(k, id, CAP_RPC_PARAMS, "path %s climbs out of its root with '..'", path);
	if (op == CAP_FILE_WRITE && !json_is_string(content))
		return error_to(k, id, CAP_RPC_PARAMS, "write_file needs \"content\", a string");
	if (op == CAP_FILE_WRITE && json_string_length(content) > WRITE_MAX)
		return error_to(k, id, CAP_RPC_PARAMS, "content is %zu bytes; write_file takes at most %u bytes per call",
				json_string_length(content), WRITE_MAX);
	if (max && (!json_is_integer(max) || json_integer_value(max) < 1 || json_integer_value(max) > (64 << 20)))
		return error_to(k, id, CAP_RPC_PARAMS, "max_bytes must be an integer from 1 to %d", 64 << 20);
	if (!identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_req req = {
		.kind = CAP_CTL_FILE, .op = op, .root = pub ? "/source" : "/work", .path = path,
		.data = op == CAP_FILE_WRITE ? json_string_value(content) : NULL,
		.len = op == CAP_FILE_WRITE ? json_string_length(content) : 0,
		.limit = max ? (uint32_t)json_integer_value(max) : 0,
	};
	submit(s, k, id, agent, peer, &req, path);
}

static json_t *status_json(const struct cap_ctl_status *st)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i}", "agent", st->agent, "peer", st->peer,
			      "state", cap_vm_state_name(st->state), "active", (int)st->active,
			      "queued", (int)st->queued);
	json_object_set_new(j, "sandbox", st->sandbox[0] ? json_string(st->sandbox) : json_null());
	json_object_set_new(j, "idle_ms", st->idle_ms >= 0 ? json_integer(st->idle_ms) : json_null());
	return j;
}

static void m_status(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	struct cap_ctl_status st;
	if (!identity(k, id, params, &agent, &peer))
		return;
	cap_ctl_status(s->ctl, agent, peer, &st);	/* creates nothing */
	result_to(k, id, status_json(&st));
}

static void list_one(void *ud, const struct cap_ctl_status *st)
{
	json_array_append_new(ud, status_json(st));
}

static void m_list(struct cap_rpc_server *s, struct conn *k, json_t *id)
{
	json_t *a = json_array();
	struct cap_ctl_pool_info pool;
	cap_ctl_list(s->ctl, list_one, a, &pool);
	result_to(k, id, json_pack("{s:o, s:i, s:{s:i, s:i, s:i}}", "sandboxes", a,
						  "capacity", cap_ctl_cfg(s->ctl)->lc.capacity, "warm_pool",
						  "size", (int)pool.size, "members", (int)pool.members,
						  "ready", (int)pool.ready));
}

static void m_info(struct cap_rpc_server *s, struct conn *k, json_t *id)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:b}", "pid", (int)getpid(),
			      "frontend", cfg->frontend ? cfg->frontend : "serve", "home", cap_ctl_home(s->ctl),
			      "image", cfg->image, "capacity", cfg->lc.capacity,
			      "idle_pause_ms", (json_int_t)cfg->lc.idle_pause_ms,
			      "idle_stop_ms", (json_int_t)cfg->lc.idle_stop_ms, "warm_pool", (int)cfg->warm_pool,
			      "manual_clock", cfg->manual_clock);
	json_object_set_new(j, "source", cfg->source ? json_string(cfg->source) : json_null());
	json_t *net = json_array();
	if (cfg->network) {
		char **words = NULL;
		size_t n = 0;
		cap_net_policy_words(cfg->network, &words, &n);
		for (size_t i = 0; i < n; i++) {
			json_array_append_new(net, json_string(words[i]));
			free(words[i]);
		}
		free(words);
	}
	json_object_set_new(j, "network", net);
	result_to(k, id, j);
}

static void m_stop_remove(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params,
			  bool remove)
{
	const char *agent, *peer;
	char a[65], p[65];
	const char *name = json_string_value(json_object_get(params, "sandbox"));
	if (name) {
		/* The administrative form (`capsule rm --force`, `capsule stop
		 * --force` on a sandbox this controller owns). */
		if (json_object_get(params, "identity"))
			return error_to(k, id, CAP_RPC_PARAMS, "give either identity or sandbox, not both");
		if (cap_ctl_identity_of(s->ctl, name, a, p) < 0)
			return error_to(k, id, CAP_RPC_PARAMS, "sandbox '%s' belongs to no identity of this controller", name);
		agent = a;
		peer = p;
	} else if (!identity(k, id, params, &agent, &peer)) {
		return;
	}
	struct cap_ctl_req req = { .kind = remove ? CAP_CTL_REMOVE : CAP_CTL_STOP };
	submit(s, k, id, agent, peer, &req, NULL);
}

static void m_cancel(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *target = json_object_get(params, "id");
	bool done = false;
	if (!target || !(json_is_string(target) || json_is_integer(target)))
		return error_to(k, id, CAP_RPC_PARAMS, "params.id must be the id of one of your requests");
	for (struct pending *p = k->calls; p; p = p->next)
		if (p->id && p->call && json_equal(p->id, target)) {
			done = cap_ctl_cancel(s->ctl, p->call);	/* may free p */
			break;
		}
	result_to(k, id, json_pack("{s:b}", "cancelled", done));
}

static void handle(struct cap_rpc_server *s, struct conn *k, const char *line, size_t len)
{
	struct cap_rpc_msg m;
	json_t *bad_id;
	char msg[600];
	int code = cap_rpc_parse(line, len, &m, &bad_id, msg, sizeof(msg));
	if (code != 0 || !m.method) {
		if (code == 0)
			snprintf(msg, sizeof(msg), "this server takes requests only; it sent none that a response could answer");
		cap_rpc_put_error(&k->out, bad_id, code ? code : CAP_RPC_INVALID, msg, NULL);
		cap_rpc_msg_fini(&m);
		return;
	}
	/* A notification (no id) runs but is never answered, errors included. */
	json_t *id = m.id;
	json_t *empty = m.params ? NULL : json_object();
	json_t *params = m.params ? m.params : empty;
	const char *method = m.method;
	if (s->stopped)
		error_to(k, id, CAP_RPC_SANDBOX, "the controller is shutting down");
	else if (strcmp(method, "exec") == 0)
		m_exec(s, k, id, params);
	else if (strcmp(method, "read_file") == 0)
		m_file(s, k, id, params, CAP_FILE_READ);
	else if (strcmp(method, "list_directory") == 0)
		m_file(s, k, id, params, CAP_FILE_LIST);
	else if (strcmp(method, "write_file") == 0)
		m_file(s, k, id, params, CAP_FILE_WRITE);
	else if (strcmp(method, "status") == 0)
		m_status(s, k, id, params);
	else if (strcmp(method, "list") == 0)
		m_list(s, k, id);
	else if (strcmp(method, "info") == 0)
		m_info(s, k, id);
	else if (strcmp(method, "stop") == 0)
		m_stop_remove(s, k, id, params, false);
	else if (strcmp(method, "remove") == 0)
		m_stop_remove(s, k, id, params, true);
	else if (strcmp(method, "cancel") == 0)
		m_cancel(s, k, id, params);
	else if (strcmp(method, "_test.advance") == 0 && cap_ctl_cfg(s->ctl)->manual_clock) {
		json_t *ms = json_object_get(params, "ms");
		int64_t now;
		if (!json_is_integer(ms) || json_integer_value(ms) < 0)
			error_to(k, id, CAP_RPC_PARAMS, "params.ms must be a non-negative integer");
		else if (cap_ctl_advance(s->ctl, json_integer_value(ms), &now) == 0)
			result_to(k, id, json_pack("{s:I}", "now", (json_int_t)now));
	} else
		error_to(k, id, CAP_RPC_METHOD, "method '%s' not found", method);
	json_decref(empty);
	cap_rpc_msg_fini(&m);
}

/* --- the front end ------------------------------------------------------------------- */

struct line_ctx {
	struct cap_rpc_server *s;
	struct conn *k;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct line_ctx *lc = ud;
	if (!lc->k->closing)
		handle(lc->s, lc->k, p, n);
}

static void on_too_long(void *ud)
{
	struct line_ctx *lc = ud;
	char msg[100];
	snprintf(msg, sizeof(msg), "request line over %u bytes; it was dropped", CAP_RPC_LINE_MAX);
	cap_rpc_put_error(&lc->k->out, NULL, CAP_RPC_INVALID, msg, NULL);
}

static void rpc_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	if (!s->stopped)
		cap_ctl_poll_add(p, s->listen_fd, POLLIN, NULL);
	for (struct conn *k = s->conns; k; k = k->next)
		if (!k->closing)
			cap_ctl_poll_add(p, k->fd, (short)(POLLIN | (cap_buf_used(&k->out) ? POLLOUT : 0)), k);
}

static void rpc_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct cap_rpc_server *s = fe;
	struct conn *k = tag;
	(void)c;
	if (!k) {
		int fd;
		while ((fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
			if (s->nconns >= MAX_CONNS) {
				/* Said, not silently dropped: the client learns why. */
				struct cap_buf b;
				char msg[200];
				cap_buf_init(&b);
				snprintf(msg, sizeof(msg), "the controller serves at most %d connections at once; close one and retry",
					 MAX_CONNS);
				cap_rpc_put_error(&b, NULL, CAP_RPC_SANDBOX, msg, json_pack("{s:b}", "retryable", 1));
				cap_rpc_flush(&b, fd);
				cap_buf_fini(&b);
				close(fd);
				continue;
			}
			k = xcalloc(1, sizeof(*k));
			k->fd = fd;
			cap_rpc_reader_init(&k->rd);
			cap_buf_init(&k->out);
			k->next = s->conns;
			s->conns = k;
			s->nconns++;
		}
		if ((errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
			/* Out of descriptors: the pending connection would wake
			 * poll at once for ever. Take it with the spare
			 * descriptor and close it: the client sees it refused. */
			cap_log(CAP_LOG_WARN, "refused a connection: %s", strerror(errno));
			close(s->spare_fd);
			fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0)
				close(fd);
			s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		}
		return;
	}
	if (k->closing || !(revents & (POLLIN | POLLHUP | POLLERR)))
		return;
	struct line_ctx lc = { s, k };
	if (cap_rpc_read(&k->rd, k->fd, on_line, on_too_long, &lc) == 0)
		k->closing = true;	/* freed in flush: this round's slots name it */
}

static void rpc_flush(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	for (struct conn *k = s->conns, *next; k; k = next) {
		next = k->next;
		if (!k->closing && cap_rpc_flush(&k->out, k->fd) < 0)
			k->closing = true;
		if (k->closing)
			conn_free(s, k);
	}
}

static void rpc_shutdown(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	s->stopped = true;
}

static const struct cap_ctl_frontend_ops rpc_ops = {
	.name = "serve",
	.pollfds = rpc_pollfds,
	.ready = rpc_ready,
	.flush = rpc_flush,
	.done = rpc_done,
	.shutdown = rpc_shutdown,
};

int cap_rpc_server_new(struct cap_ctl *c, const char *path, struct cap_rpc_server **out,
		       struct cap_err *err)
{
	struct cap_rpc_server *s = xcalloc(1, sizeof(*s));
	_cleanup_free_ char *lockp = xasprintf("%s.lock", path);
	s->ctl = c;
	s->listen_fd = -1;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->path = xstrdup(path);
	/* One server per socket (two homes could name the same one). */
	s->lock_fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (s->lock_fd < 0 || flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0) {
		cap_rpc_server_free(s);
		return cap_err_set(err, EBUSY, "another capsule controller is using %s (%s is locked)", path, lockp);
	}
	s->listen_fd = cap_unix_listen(path, err);
	if (s->listen_fd < 0) {
		int r = s->listen_fd;
		cap_rpc_server_free(s);
		return r;
	}
	s->fe = cap_ctl_add_frontend(c, &rpc_ops, s);
	*out = s;
	return 0;
}

void cap_rpc_server_free(struct cap_rpc_server *s)
{
	if (!s)
		return;
	while (s->conns) {
		struct conn *k = s->conns;
		s->conns = k->next;
		for (struct pending *p = k->calls, *next; p; p = next) {
			next = p->next;	/* the core is gone: nothing will answer */
			json_decref(p->id);
			free(p);
		}
		close(k->fd);
		cap_rpc_reader_fini(&k->rd);
		cap_buf_fini(&k->out);
		free(k);
	}
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		unlink(s->path);
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	free(s->path);
	free(s);
}

int cap_serve_run(struct cap_controller_cfg *cfg, const char *socket_path, struct cap_err *err)
{
	struct cap_ctl *c = NULL;
	struct cap_rpc_server *s = NULL;
	_cleanup_free_ char *home = cap_home_dir();
	char cwd[4096];
	_cleanup_free_ char *path = !socket_path ? xasprintf("%s/serve.sock", home)
			: socket_path[0] == '/' || !getcwd(cwd, sizeof(cwd)) ? xstrdup(socket_path)
			: xasprintf("%s/%s", cwd, socket_path);	/* others find it by this name */
	cfg->frontend = "serve";
	cfg->socket_path = NULL;	/* named once it listens */
	int r = cap_ctl_new(cfg, &c, err);
	if (r == 0 && (r = cap_rpc_server_new(c, path, &s, err)) == 0 &&
	    (r = cap_ctl_set_socket(c, path, err)) == 0) {
		cap_log(CAP_LOG_INFO, "listening on %s", path);
		r = cap_ctl_run(c, err);
	}
	cap_ctl_free(c);
	cap_rpc_server_free(s);
	return r;
}

/* --- the client side ---------------------------------------------------------------------- */

static enum cap_ctl_code code_from(int code)
{
	switch (code) {
	case CAP_RPC_CAPACITY: return CAP_CTL_ECAPACITY;
	case CAP_RPC_TOOL: return CAP_CTL_ETOOL;
	case CAP_RPC_CANCELLED: return CAP_CTL_ECANCELLED;
	default: return CAP_CTL_ESANDBOX;
	}
}

void cap_rpc_result_parse(json_t *answer, enum cap_ctl_kind kind, struct cap_ctl_result *out,
			  void **owned)
{
	json_t *error = json_object_get(answer, "error");
	json_t *res = json_object_get(answer, "result");
	memset(out, 0, sizeof(*out));
	*owned = NULL;
	out->kind = kind;
	if (error || !json_is_object(res)) {
		const char *msg = json_string_value(json_object_get(error, "message"));
		out->code = code_from((int)json_integer_value(json_object_get(error, "code")));
		out->msg = msg ? msg : "the controller sent an answer without a result";
		out->errnum = (int)json_integer_value(json_object_get(json_object_get(error, "data"), "errno"));
		return;
	}
	out->sandbox = json_string_value(json_object_get(res, "sandbox"));
	out->state = json_string_value(json_object_get(res, "state"));
	if (kind == CAP_CTL_EXEC) {
		json_t *ec = json_object_get(res, "exit_code");
		out->exit.kind = json_is_integer(ec) ? CAP_EXIT_CODE : CAP_EXIT_SIGNAL;
		out->exit.value = (int32_t)(json_is_integer(ec) ? json_integer_value(ec)
							       : json_integer_value(json_object_get(res, "signal")));
		out->exit.flags = (json_is_true(json_object_get(res, "timed_out")) ? CAP_EXIT_TIMED_OUT : 0) |
				  (json_is_true(json_object_get(res, "truncated")) ? CAP_EXIT_TRUNCATED : 0);
		out->exit.duration_ms = (uint32_t)json_integer_value(json_object_get(res, "duration_ms"));
		out->note = json_string_value(json_object_get(res, "note"));
		out->out = (const uint8_t *)json_string_value(json_object_get(res, "stdout"));
		out->out_len = json_string_length(json_object_get(res, "stdout"));
		out->err = (const uint8_t *)json_string_value(json_object_get(res, "stderr"));
		out->err_len = json_string_length(json_object_get(res, "stderr"));
		if (!out->out)
			out->out = (const uint8_t *)"";
		if (!out->err)
			out->err = (const uint8_t *)"";
		return;
	}
	if (kind != CAP_CTL_FILE)
		return;
	out->written = (uint64_t)json_integer_value(json_object_get(res, "bytes"));
	const char *k = json_string_value(json_object_get(res, "kind"));
	if (k && strcmp(k, "directory") == 0) {
		json_t *a = json_object_get(res, "entries");
		size_t n = json_array_size(a);
		struct cap_ctl_entry *v = xcalloc(n + 1, sizeof(*v));
		for (size_t e = 0; e < n; e++) {
			json_t *o = json_array_get(a, e);
			const char *t = json_string_value(json_object_get(o, "type"));
			const char *name = json_string_value(json_object_get(o, "name"));
			v[e].type = !t ? 'o' : strcmp(t, "directory") == 0 ? 'd' : strcmp(t, "file") == 0 ? 'f' :
				    strcmp(t, "symlink") == 0 ? 'l' : 'o';
			v[e].name = name ? name : "";
			v[e].size = (uint64_t)json_integer_value(json_object_get(o, "size"));
		}
		out->is_dir = true;
		out->entries = v;
		out->nentries = n;
		out->entries_truncated = json_is_true(json_object_get(res, "truncated"));
		*owned = v;
	} else {
		json_t *content = json_object_get(res, "content");
		out->content = (const uint8_t *)(json_string_value(content) ? json_string_value(content) : "");
		out->content_len = json_string_length(content);
	}
}

int cap_rpc_call(const char *socket_path, const char *method, json_t *params, int timeout_ms,
		 json_t **result, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(socket_path) >= sizeof(sa.sun_path)) {
		json_decref(params);
		return cap_err_set(err, ENAMETOOLONG, "socket path %s is too long", socket_path);
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		json_decref(params);
		return cap_err_set(err, errno, "cannot connect to the controller at %s: %s", socket_path, strerror(errno));
	}
	struct cap_buf out;
	cap_buf_init(&out);
	cap_rpc_put_request(&out, 1, method, params);
	int r = 0;
	while (cap_buf_used(&out) > 0 && r == 0) {
		ssize_t n = send(fd, cap_buf_head(&out), cap_buf_used(&out), MSG_NOSIGNAL);
		if (n < 0 && errno != EINTR)
			r = cap_err_set(err, errno, "cannot write to %s: %s", socket_path, strerror(errno));
		else if (n > 0)
			cap_buf_consume(&out, (size_t)n);
	}
	cap_buf_fini(&out);
	struct cap_buf in;
	cap_buf_init(&in);
	int64_t end = cap_now_ms() + timeout_ms;
	const uint8_t *nl = NULL;
	while (r == 0 && !(cap_buf_used(&in) && (nl = memchr(cap_buf_head(&in), '\n', cap_buf_used(&in))))) {
		int64_t left = end - cap_now_ms();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&p, 1, (int)left) == 0) {
			r = cap_err_set(err, ETIMEDOUT, "the controller at %s did not answer %s in %d s", socket_path,
					method, timeout_ms / 1000);
			break;
		}
		uint8_t *w = cap_buf_reserve(&in, 65536);
		ssize_t n = read(fd, w, 65536);
		if (n == 0 || (n < 0 && errno != EINTR))
			r = cap_err_set(err, EPIPE, "the controller at %s closed the connection", socket_path);
		else if (n > 0)
			cap_buf_commit(&in, (size_t)n);
	}
	if (r == 0) {
		struct cap_rpc_msg m;
		json_t *bad;
		char msg[600];
		if (cap_rpc_parse((const char *)cap_buf_head(&in), (size_t)(nl - cap_buf_head(&in)), &m, &bad, msg,
				  sizeof(msg)) != 0 || m.method) {
			r = cap_err_set(err, EPROTO, "the controller at %s sent a malformed answer", socket_path);
		} else if (m.error) {
			const char *em = json_string_value(json_object_get(m.error, "message"));
			r = cap_err_set(err, EIO, "%s", em ? em : "the controller refused");
		} else {
			*result = json_incref(m.result);
		}
		cap_rpc_msg_fini(&m);
	}
	cap_buf_fini(&in);
	return r;
}
