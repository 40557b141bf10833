/* serve's methods: each request's parameters decoded and checked, then
 * submitted to the core as a typed request (or answered from its
 * state). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base64.h"
#include "controller.h"
#include "jsonrpc.h"
#include "layout.h"
#include "paths.h"
#include "policy.h"
#include "serve-conn.h"
#include "serve.h"
#include "util.h"

/* --- methods ------------------------------------------------------------------------ */

/* identity: {"agent": "...", "peer": "..."}, both valid; or an error sent. */
static bool identity(struct conn *k, json_t *id, json_t *params, const char **agent, const char **peer)
{
	json_t *who = json_object_get(params, "identity");
	*agent = json_string_value(json_object_get(who, "agent"));
	*peer = json_string_value(json_object_get(who, "peer"));
	if (!*agent || !*peer) {
		serve_error(k, id, CAP_RPC_PARAMS, "params.identity must be {\"agent\": string, \"peer\": string}");
		return false;
	}
	if (!cap_controller_id_valid(*agent) || !cap_controller_id_valid(*peer)) {
		serve_error(k, id, CAP_RPC_PARAMS, "identity parts must be 1 to 64 of A-Z a-z 0-9 . _ @ + = : - and not start with '.'");
		return false;
	}
	return true;
}

/* Queue req for the identity; owned_to (a download's resolved
 * destination, or NULL) is stolen. */
static struct pending *submit_as(struct cap_rpc_server *s, struct conn *k, json_t *id,
				  const char *agent, const char *peer, const struct cap_ctl_req *req,
				  const char *path, enum method method, char *owned_to)
{
	struct pending *p = xcalloc(1, sizeof(*p));
	p->conn = k;
	p->id = id ? json_incref(id) : NULL;
	p->op = req->op;
	p->method = method;
	p->owned_to = owned_to;
	if (path)
		snprintf(p->path, sizeof(p->path), "%s", path);
	p->next = k->calls;
	k->calls = p;
	serve_pending_begin(s, p);
	p->call = cap_ctl_submit(s->ctl, s->fe, agent, peer, req, p);
	return p;
}

static struct pending *submit(struct cap_rpc_server *s, struct conn *k, json_t *id,
			      const char *agent, const char *peer, const struct cap_ctl_req *req,
			      const char *path)
{
	return submit_as(s, k, id, agent, peer, req, path, M_TOOL, NULL);
}

/* params.durable: absent or true, the call returns once what it wrote is
 * on the host's disk files; false gives that up (*no_sync). False with an
 * error sent when it is not a boolean. */
static bool durable_param(struct conn *k, json_t *id, json_t *params, bool *no_sync)
{
	json_t *v = json_object_get(params, "durable");
	if (v && !json_is_boolean(v)) {
		serve_error(k, id, CAP_RPC_PARAMS,
			 "params.durable must be true (the default: the call returns once its writes are on the host's disk) or false (sooner, and they may be lost if the VM dies)");
		return false;
	}
	*no_sync = json_is_false(v);
	return true;
}

/* params.size: absent (*given false), or {cpus, memory_mib, root_mib,
 * work_mib}, each a positive integer and at least one; false with an
 * error sent otherwise. The bounds are the controller's (set_size). */
static bool size_param(struct conn *k, json_t *id, json_t *params, struct cap_ctl_size *out,
		       bool *given)
{
	json_t *v = json_object_get(params, "size");
	memset(out, 0, sizeof(*out));
	*given = v != NULL;
	if (!v)
		return true;
	const struct {
		const char *key;
		unsigned *field;
	} f[] = { { "cpus", &out->cpus }, { "memory_mib", &out->memory_mib }, { "root_mib", &out->root_mib },
		  { "work_mib", &out->work_mib } };
	const char *key;
	json_t *val;
	if (!json_is_object(v) || json_object_size(v) == 0)
		goto bad;
	json_object_foreach(v, key, val) {
		size_t i;
		for (i = 0; i < CAP_ARRAY_SIZE(f) && strcmp(f[i].key, key) != 0; i++)
			;
		if (i == CAP_ARRAY_SIZE(f)) {
			serve_error(k, id, CAP_RPC_PARAMS, "params.size.%s is not a size: give cpus, memory_mib, root_mib or work_mib", key);
			return false;
		}
		if (!json_is_integer(val) || json_integer_value(val) < 1 || json_integer_value(val) > (1 << 30)) {
			serve_error(k, id, CAP_RPC_PARAMS, "params.size.%s must be a positive integer", key);
			return false;
		}
		*f[i].field = (unsigned)json_integer_value(val);
	}
	return true;
bad:
	serve_error(k, id, CAP_RPC_PARAMS, "params.size must be an object of cpus, memory_mib, root_mib and work_mib (positive integers; at least one)");
	return false;
}

/* The identity's sizes set from params.size, when given: *out the
 * answer's "size" (NULL when not given). False with the refusal sent. */
static bool apply_size(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params,
		       const char *agent, const char *peer, json_t **out)
{
	struct cap_ctl_size want;
	struct cap_ctl_size_out got;
	struct cap_err err = { 0 };
	bool given;
	*out = NULL;
	if (!size_param(k, id, params, &want, &given))
		return false;
	if (!given)
		return true;
	if (cap_ctl_set_size(s->ctl, agent, peer, &want, &got, &err) < 0) {
		serve_error(k, id, CAP_RPC_PARAMS, "%s", err.msg);
		return false;
	}
	*out = serve_size_json(&got);
	return true;
}

/* set_size: an identity's own sizes, checked now, applied at its next
 * start (docs/serve.md, "Sizes"). */
static void m_set_size(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	json_t *size;
	if (!json_object_get(params, "size"))
		return serve_error(k, id, CAP_RPC_PARAMS, "set_size needs params.size: {cpus, memory_mib, root_mib, work_mib}, at least one");
	if (!identity(k, id, params, &agent, &peer) || !apply_size(s, k, id, params, agent, peer, &size))
		return;
	serve_result(k, id, json_pack("{s:s, s:s, s:o}", "agent", agent, "peer", peer, "size", size));
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
	bool no_sync;
	if (!json_is_array(argv) || n == 0 || n > CAP_PROTO_MAX_ARGS)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.argv must be a non-empty array of strings");
	if ((env && !json_is_object(env)) || (cwd && !json_is_string(cwd)) ||
	    (in && !json_is_string(in)) || (timeout && !json_is_number(timeout)))
		return serve_error(k, id, CAP_RPC_PARAMS, "env must be an object of strings, cwd and stdin strings, timeout a number of seconds");
	if (pids && (!json_is_integer(pids) || json_integer_value(pids) < 1 || json_integer_value(pids) > (1 << 22)))
		return serve_error(k, id, CAP_RPC_PARAMS, "pids_max must be an integer from 1 to %d", 1 << 22);
	double t = timeout ? json_number_value(timeout) : 30;
	if (t < 0 || t > 86400)
		return serve_error(k, id, CAP_RPC_PARAMS, "timeout %g is out of range (0 to 86400 seconds)", t);
	for (size_t a = 0; a < n; a++)
		if (!json_is_string(json_array_get(argv, a)))
			return serve_error(k, id, CAP_RPC_PARAMS, "params.argv[%zu] is not a string", a);
	const char *key;
	json_t *val;
	json_object_foreach(env, key, val)
		if (!json_is_string(val) || !*key || strchr(key, '='))
			return serve_error(k, id, CAP_RPC_PARAMS, "env.%s must be a string value with a name without '='", key);
	json_t *size;
	if (!durable_param(k, id, params, &no_sync) || !identity(k, id, params, &agent, &peer) ||
	    !apply_size(s, k, id, params, agent, peer, &size))
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
		.flags = no_sync ? CAP_EXEC_NO_SYNC : 0,
	};
	struct cap_ctl_req req = { .kind = CAP_CTL_EXEC, .exec = &x };
	if (in) {
		req.stdin_data = json_string_value(in);
		req.stdin_len = json_string_length(in);
	}
	submit(s, k, id, agent, peer, &req, NULL)->size = size;
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
	json_t *content = json_object_get(params, "content");	/* write_file's */
	json_t *max = json_object_get(params, "max_bytes");
	const char *agent, *peer;
	if (!root)
		root = op == CAP_FILE_WRITE ? "workspace" : "public";
	bool pub = strcmp(root, "public") == 0;
	if (!pub && strcmp(root, "workspace") != 0)
		return serve_error(k, id, CAP_RPC_PARAMS, "root must be \"public\" or \"workspace\"");
	if (op == CAP_FILE_WRITE && pub)
		return serve_error(k, id, CAP_RPC_PARAMS, "the public data is read-only; write_file writes to root \"workspace\" (/work)");
	if (!path && op == CAP_FILE_LIST)
		path = "";
	if (!path || (!*path && op != CAP_FILE_LIST) || strlen(path) > 4096)
		return serve_error(k, id, CAP_RPC_PARAMS, "path must be a non-empty string of at most 4096 bytes");
	if (path[0] == '/')
		return serve_error(k, id, CAP_RPC_PARAMS, "path %s is absolute; give it relative to the %s root", path, root);
	if (!cap_proto_file_path_ok(path))
		return serve_error(k, id, CAP_RPC_PARAMS, "path %s climbs out of its root with '..'", path);
	if (op == CAP_FILE_WRITE && !json_is_string(content))
		return serve_error(k, id, CAP_RPC_PARAMS, "write_file needs \"content\", a string");
	if (op == CAP_FILE_WRITE && json_string_length(content) > WRITE_MAX)
		return serve_error(k, id, CAP_RPC_PARAMS, "content is %zu bytes; write_file takes at most %u bytes per call",
				json_string_length(content), WRITE_MAX);
	if (max && (!json_is_integer(max) || json_integer_value(max) < 1 || json_integer_value(max) > (64 << 20)))
		return serve_error(k, id, CAP_RPC_PARAMS, "max_bytes must be an integer from 1 to %d", 64 << 20);
	bool no_sync = false;
	if ((op == CAP_FILE_WRITE && !durable_param(k, id, params, &no_sync)) ||
	    !identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_req req = {
		.kind = CAP_CTL_FILE, .op = op, .root = pub ? CAP_GUEST_SOURCE : CAP_GUEST_WORK, .path = path,
		.data = op == CAP_FILE_WRITE ? json_string_value(content) : NULL,
		.len = op == CAP_FILE_WRITE ? json_string_length(content) : 0,
		.limit = max ? (uint32_t)json_integer_value(max) : 0,
		.no_sync = no_sync,
	};
	submit(s, k, id, agent, peer, &req, path);
}

/* The guest root a transfer names: "workspace" (/work, the default),
 * "project" (/workspace) and, for a download, "public" (/source). NULL
 * with an error sent. */
static const char *xfer_root(struct conn *k, json_t *id, json_t *params, bool download)
{
	json_t *v = json_object_get(params, "root");
	const char *root = v ? json_string_value(v) : "workspace";
	if (root && strcmp(root, "workspace") == 0)
		return CAP_GUEST_WORK;
	if (root && strcmp(root, "project") == 0)
		return CAP_GUEST_WORKSPACE;
	if (root && strcmp(root, "public") == 0 && download)
		return CAP_GUEST_SOURCE;
	if (root && strcmp(root, "public") == 0)
		serve_error(k, id, CAP_RPC_PARAMS, "params.root: the public data is read-only; upload writes to root \"workspace\" (/work) or \"project\" (/workspace)");
	else
		serve_error(k, id, CAP_RPC_PARAMS, "params.root must be %s", download ? "\"workspace\" (/work), \"project\" (/workspace) or \"public\" (/source)"
									       : "\"workspace\" (/work) or \"project\" (/workspace)");
	return NULL;
}

/* A transfer's guest path: relative, each component a name (no "", "."
 * or ".."); "" only when allowed. False with an error sent. */
static bool xfer_path(struct conn *k, json_t *id, const char *path, bool empty_ok)
{
	if (!path || strlen(path) > 4096)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.path must be a string of at most 4096 bytes"), false;
	if (!*path && !empty_ok)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.path must name a file (a relative path)"), false;
	if (path[0] == '/')
		return serve_error(k, id, CAP_RPC_PARAMS, "params.path %s is absolute; give it relative to its root", path), false;
	for (const char *c = path; *path; c++) {
		const char *end = strchr(c, '/');
		size_t n = end ? (size_t)(end - c) : strlen(c);
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return serve_error(k, id, CAP_RPC_PARAMS, "params.path %s: every component must be a name (no empty, '.' or '..' component)",
					path), false;
		if (!end)
			break;
		c = end;
	}
	return true;
}

/* A --transfer-dir path check that failed: the path is refused (named
 * in data.refused) with the directories the server allows. */
static void refuse_host(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *field,
			const char *path, const struct cap_err *err)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	char msg[1200];
	snprintf(msg, sizeof(msg), "params.%s: %s", field, err->msg);
	serve_noted(s, CAP_RPC_PARAMS);
	if (id)
		cap_rpc_put_error(&k->out, id, CAP_RPC_PARAMS, msg,
				  json_pack("{s:[o], s:o, s:i}", "refused", cap_json_text(path), "transfer_dirs",
					    serve_strings(cfg->transfer_dirs, cfg->ntransfer_dirs), "errno", err->code));
}

static bool have_transfer_dirs(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *field)
{
	if (cap_ctl_cfg(s->ctl)->ntransfer_dirs)
		return true;
	serve_error(k, id, CAP_RPC_PARAMS, "params.%s names a host path, and this server was given no directory for transfers: start capsule serve with --transfer-dir DIR (repeatable)",
		 field);
	return false;
}

/* upload: {identity, path, root, content_base64 [, mode] | from} into the
 * identity's /work (or /workspace). */
static void m_upload(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *content = json_object_get(params, "content_base64");
	json_t *from = json_object_get(params, "from");
	json_t *mode = json_object_get(params, "mode");
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *agent, *peer;
	const char *root = xfer_root(k, id, params, false);
	if (!root)
		return;
	if (!content == !from)
		return serve_error(k, id, CAP_RPC_PARAMS, "upload needs exactly one of params.content_base64 (a file's bytes) and params.from (a host path in a --transfer-dir)");
	if ((content && !json_is_string(content)) || (from && !json_is_string(from)))
		return serve_error(k, id, CAP_RPC_PARAMS, "params.%s must be a string", content ? "content_base64" : "from");
	if (!xfer_path(k, id, path, from != NULL))
		return;
	bool no_sync;
	if (!durable_param(k, id, params, &no_sync))
		return;
	unsigned bits = 0644;
	if (mode && from)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.mode applies to content_base64 only; an upload from the host keeps the host's modes");
	if (mode && json_is_integer(mode) && json_integer_value(mode) >= 0 && json_integer_value(mode) <= 07777) {
		bits = (unsigned)json_integer_value(mode);
	} else if (mode) {
		const char *m = json_string_value(mode);
		char *end = NULL;
		unsigned long v = m && *m ? strtoul(m, &end, 8) : 0;
		if (!m || !*m || *end || v > 07777 || strspn(m, "01234567") != strlen(m))
			return serve_error(k, id, CAP_RPC_PARAMS, "params.mode must be permission bits: an octal string such as \"0755\" or a number from 0 to 4095");
		bits = (unsigned)v;
	}
	struct cap_ctl_req req = { .kind = CAP_CTL_XFER, .put = true, .root = root, .path = path, .mode = bits,
				   .no_sync = no_sync };
	uint8_t *bytes = NULL;
	char *host = NULL;
	if (content) {
		size_t n = json_string_length(content), bad = 0;
		if (n > 4 * (((size_t)CAP_CTL_INLINE_MAX + 2) / 3))
			return serve_error(k, id, CAP_RPC_PARAMS, "params.content_base64 holds more than %u bytes (16 MiB), the cap of an inline upload; put the file in a --transfer-dir and upload it with \"from\"",
					CAP_CTL_INLINE_MAX);
		ssize_t len = cap_base64_decode(json_string_value(content), n, &bytes, &bad);
		if (len < 0)
			return serve_error(k, id, CAP_RPC_PARAMS, "params.content_base64 is not base64 (RFC 4648, with padding, no line breaks): bad character or length at offset %zu",
					bad);
		if ((size_t)len > CAP_CTL_INLINE_MAX) {
			free(bytes);
			return serve_error(k, id, CAP_RPC_PARAMS, "params.content_base64 holds %zd bytes, over the %u-byte (16 MiB) cap of an inline upload; put the file in a --transfer-dir and upload it with \"from\"",
					len, CAP_CTL_INLINE_MAX);
		}
		req.data = bytes;
		req.len = (size_t)len;
	} else {
		struct cap_err err = { 0 };
		if (!have_transfer_dirs(s, k, id, "from"))
			return;
		if (cap_transfer_source(cfg->transfer_dirs, cfg->ntransfer_dirs, json_string_value(from), &host,
					    &err) < 0)
			return refuse_host(s, k, id, "from", json_string_value(from), &err);
		req.host = host;
	}
	if (identity(k, id, params, &agent, &peer))
		submit_as(s, k, id, agent, peer, &req, path, M_UPLOAD, NULL);
	free(bytes);
	free(host);
}

/* download: {identity, path, root [, to]}: one file inline (base64), or
 * a file or tree written to a new host path in a --transfer-dir. */
static void m_download(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *to = json_object_get(params, "to");
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *agent, *peer;
	const char *root = xfer_root(k, id, params, true);
	if (!root)
		return;
	if (to && !json_is_string(to))
		return serve_error(k, id, CAP_RPC_PARAMS, "params.to must be a string: a new host path in a --transfer-dir");
	if (!xfer_path(k, id, path, to != NULL))
		return;
	if (!to) {
		if (!identity(k, id, params, &agent, &peer))
			return;
		struct cap_ctl_req req = { .kind = CAP_CTL_FILE, .op = CAP_FILE_READ, .root = root, .path = path,
					   .limit = CAP_CTL_INLINE_MAX };
		submit_as(s, k, id, agent, peer, &req, path, M_DOWNLOAD, NULL);
		return;
	}
	struct cap_err err = { 0 };
	char *dest = NULL;
	if (!have_transfer_dirs(s, k, id, "to"))
		return;
	if (cap_transfer_dest(cfg->transfer_dirs, cfg->ntransfer_dirs, json_string_value(to), &dest, &err) < 0)
		return refuse_host(s, k, id, "to", json_string_value(to), &err);
	if (!identity(k, id, params, &agent, &peer)) {
		free(dest);
		return;
	}
	struct cap_ctl_req req = { .kind = CAP_CTL_XFER, .put = false, .root = root, .path = path, .host = dest };
	submit_as(s, k, id, agent, peer, &req, path, M_DOWNLOAD, xstrdup(dest));
	free(dest);
}

/* diff and merge need the server's --workspace DIR; false with an error
 * sent. */
static bool have_workspace(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *method)
{
	if (cap_ctl_cfg(s->ctl)->workspace)
		return true;
	serve_error(k, id, CAP_RPC_PARAMS, "%s needs a project: this server was started without --workspace DIR (start capsule serve with --workspace DIR; each identity's sandbox then gets a copy of it at /workspace)",
		 method);
	return false;
}

/* diff: {identity}: what the identity's sandbox changed in /workspace
 * since its base, as `capsule diff --json` says it. */
static void m_diff(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	if (!have_workspace(s, k, id, "diff") || !identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_req req = { .kind = CAP_CTL_DIFF };
	submit(s, k, id, agent, peer, &req, NULL);
}

/* merge: {identity [, pick] [, dry_run]}: the identity's sandbox's
 * changes into the server's --workspace DIR, three-way against the
 * sandbox's own base. */
static void m_merge(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	json_t *pick = json_object_get(params, "pick");
	json_t *dry = json_object_get(params, "dry_run");
	struct cap_ctl_req req = { .kind = CAP_CTL_MERGE, .pick = CAP_MERGE_REFUSE };
	if (!have_workspace(s, k, id, "merge"))
		return;
	if (pick) {
		const char *v = json_string_value(pick);
		if (v && strcmp(v, "theirs") == 0)
			req.pick = CAP_MERGE_THEIRS;
		else if (v && strcmp(v, "ours") == 0)
			req.pick = CAP_MERGE_OURS;
		else if (!v || strcmp(v, "refuse") != 0)
			return serve_error(k, id, CAP_RPC_PARAMS, "params.pick must be \"refuse\" (conflicts refuse the merge; the default), \"theirs\" (the sandbox's version wins) or \"ours\" (the host's version stays)");
	}
	if (dry && !json_is_boolean(dry))
		return serve_error(k, id, CAP_RPC_PARAMS, "params.dry_run must be true or false");
	req.dry_run = json_is_true(dry);
	if (!identity(k, id, params, &agent, &peer))
		return;
	submit(s, k, id, agent, peer, &req, NULL);
}

/* snapshot: {identity [, name]}: the identity's sandbox saved, running
 * (docs/serve.md, "Snapshots and forks"); after its earlier calls. */
static void m_snapshot(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	if (!identity(k, id, params, &agent, &peer))
		return;
	const char *name = json_string_value(json_object_get(params, "name"));
	struct cap_err err = { 0 };
	if (name && cap_snapshot_check_name(name, &err) < 0)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.name: %s", err.msg);
	struct cap_ctl_req req = { .kind = CAP_CTL_SNAPSHOT, .snapshot = name };
	submit(s, k, id, agent, peer, &req, NULL);
}

/* fork: {identity [, count] [, peers]}: count new identities of the same
 * agent (peers as given, else "<peer>-N"), each with a sandbox that goes
 * on from the identity's, running processes included. */
static void m_fork(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	if (!identity(k, id, params, &agent, &peer))
		return;
	json_t *count = json_object_get(params, "count"), *peers = json_object_get(params, "peers");
	json_int_t n = count ? json_integer_value(count) : peers ? (json_int_t)json_array_size(peers) : 1;
	if (n < 1 || n > CAP_FORK_MAX)
		return serve_error(k, id, CAP_RPC_PARAMS, "params.count must be 1 to %d", CAP_FORK_MAX);
	const char *list[CAP_FORK_MAX];
	if (peers) {
		if ((json_int_t)json_array_size(peers) != n)
			return serve_error(k, id, CAP_RPC_PARAMS, "params.peers must hold params.count names");
		for (json_int_t i = 0; i < n; i++) {
			list[i] = json_string_value(json_array_get(peers, (size_t)i));
			if (!list[i] || !cap_controller_id_valid(list[i]))
				return serve_error(k, id, CAP_RPC_PARAMS, "params.peers[%d]: identity parts must be 1 to 64 of A-Z a-z 0-9 . _ @ + = : - and not start with '.'",
						   (int)i);
			for (json_int_t j = 0; j < i; j++)
				if (strcmp(list[j], list[i]) == 0)
					return serve_error(k, id, CAP_RPC_PARAMS, "params.peers names '%s' twice", list[i]);
		}
	}
	struct cap_ctl_req req = { .kind = CAP_CTL_FORK, .count = (unsigned)n, .peers = peers ? list : NULL };
	submit(s, k, id, agent, peer, &req, NULL);
}

static void m_status(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	struct cap_ctl_status st;
	if (!identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_size_out size;
	cap_ctl_status(s->ctl, agent, peer, &st);	/* creates nothing */
	cap_ctl_size_of(s->ctl, agent, peer, &size);
	json_t *j = serve_status_json(&st);
	json_object_set_new(j, "size", serve_size_json(&size));
	serve_result(k, id, j);
}

static void list_one(void *ud, const struct cap_ctl_status *st)
{
	json_array_append_new(ud, serve_status_json(st));
}

static void m_list(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	(void)params;
	json_t *a = json_array();
	struct cap_ctl_pool_info pool;
	cap_ctl_list(s->ctl, list_one, a, &pool);
	serve_result(k, id, json_pack("{s:o, s:i, s:{s:i, s:i, s:i}}", "sandboxes", a,
						  "capacity", cap_ctl_cfg(s->ctl)->lc.capacity, "warm_pool",
						  "size", (int)pool.size, "members", (int)pool.members,
						  "ready", (int)pool.ready));
}

static void m_info(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	(void)params;
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:b}", "pid", (int)getpid(),
			      "frontend", cfg->frontend ? cfg->frontend : "serve", "home", cap_ctl_home(s->ctl),
			      "image", cfg->image, "capacity", cfg->lc.capacity,
			      "idle_pause_ms", (json_int_t)cfg->lc.idle_pause_ms,
			      "idle_stop_ms", (json_int_t)cfg->lc.idle_stop_ms, "warm_pool", (int)cfg->warm_pool,
			      "manual_clock", cfg->manual_clock);
	json_object_set_new(j, "source", cfg->source ? json_string(cfg->source) : json_null());
	json_object_set_new(j, "workspace", cfg->workspace ? cap_json_text(cfg->workspace) : json_null());
	json_object_set_new(j, "private_import", cfg->private_import ? cap_json_text(cfg->private_import) : json_null());
	json_object_set_new(j, "transfer_dirs", serve_strings(cfg->transfer_dirs, cfg->ntransfer_dirs));
	json_object_set_new(j, "inline_max", json_integer(CAP_CTL_INLINE_MAX));
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
	serve_result(k, id, j);
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
			return serve_error(k, id, CAP_RPC_PARAMS, "give either identity or sandbox, not both");
		if (cap_ctl_identity_of(s->ctl, name, a, p) < 0)
			return serve_error(k, id, CAP_RPC_PARAMS, "sandbox '%s' belongs to no identity of this controller", name);
		agent = a;
		peer = p;
	} else if (!identity(k, id, params, &agent, &peer)) {
		return;
	}
	struct cap_ctl_req req = { .kind = remove ? CAP_CTL_REMOVE : CAP_CTL_STOP };
	submit(s, k, id, agent, peer, &req, NULL);
}

/* prepare: {} (params may be omitted): kernel, initramfs, image and
 * template made sure of, with progress notifications on this connection. */
static void m_prepare(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	(void)params;
	struct pending *p = xcalloc(1, sizeof(*p));
	p->conn = k;
	p->id = id ? json_incref(id) : NULL;
	p->method = M_PREPARE;
	p->next = k->calls;
	k->calls = p;
	serve_pending_begin(s, p);
	p->call = cap_ctl_prepare_submit(s->ctl, s->fe, p);
}

static void m_cancel(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *target = json_object_get(params, "id");
	bool done = false;
	if (!target || !(json_is_string(target) || json_is_integer(target)))
		return serve_error(k, id, CAP_RPC_PARAMS, "params.id must be the id of one of your requests");
	for (struct pending *p = k->calls; p; p = p->next)
		if (p->id && p->call && json_equal(p->id, target)) {
			done = cap_ctl_cancel(s->ctl, p->call);	/* may free p */
			break;
		}
	serve_result(k, id, json_pack("{s:b}", "cancelled", done));
}

static void m_read_file(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	m_file(s, k, id, params, CAP_FILE_READ);
}

static void m_list_directory(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	m_file(s, k, id, params, CAP_FILE_LIST);
}

static void m_write_file(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	m_file(s, k, id, params, CAP_FILE_WRITE);
}

static void m_stop(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	m_stop_remove(s, k, id, params, false);
}

static void m_remove(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	m_stop_remove(s, k, id, params, true);
}

/* _test.advance: {ms}: the manual clock (--test-clock) moved on. */
static void m_advance(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *ms = json_object_get(params, "ms");
	int64_t now;
	if (!json_is_integer(ms) || json_integer_value(ms) < 0)
		serve_error(k, id, CAP_RPC_PARAMS, "params.ms must be a non-negative integer");
	else if (cap_ctl_advance(s->ctl, json_integer_value(ms), &now) == 0)
		serve_result(k, id, json_pack("{s:I}", "now", (json_int_t)now));
}

/* --- the method table ------------------------------------------------------------------ */

/* One parameter of a method: its name, its JSON type ("string",
 * "integer", "number", "boolean", "object", "array", or two of them
 * joined by '|'), whether the method refuses a request without it, and
 * whether it only tolerates it (read and checked, but of no use to a
 * client: a client need not offer it). */
struct param_def {
	const char *name;
	const char *type;
	bool required;
	bool tolerated;
};

/* A method: its name, what runs it, and its parameters, the only members
 * of a request's params that reach it. one_of: two parameters of which a
 * request gives exactly one ("a|b"), or NULL. */
struct method_def {
	const char *name;
	void (*run)(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params);
	bool test_only;	/* served only under --test-clock */
	const char *one_of;
	struct param_def params[10];	/* up to the first without a name */
};

#define P_IDENTITY { "identity", "object", true, false }	/* {"agent", "peer"} */
#define P_DURABLE { "durable", "boolean", false, false }
#define P_SIZE { "size", "object", false, false }	/* {cpus, memory_mib, root_mib, work_mib} */

/* The serve protocol's methods, written once: serve_handle dispatches by
 * it, and `capsule serve --schema` prints it (cap_serve_schema), which
 * the Python client's methods are checked against
 * (tests/integration/test-serve-schema.py). */
static const struct method_def methods[] = {
	{ .name = "exec", .run = m_exec,
	  .params = { P_IDENTITY, { "argv", "array", true, false }, { "env", "object", false, false },
		      { "cwd", "string", false, false }, { "timeout", "number", false, false },
		      { "stdin", "string", false, false }, { "pids_max", "integer", false, false }, P_DURABLE,
		      P_SIZE } },
	{ .name = "read_file", .run = m_read_file,
	  .params = { P_IDENTITY, { "path", "string", true, false }, { "root", "string", false, false },
		      { "max_bytes", "integer", false, false } } },
	{ .name = "list_directory", .run = m_list_directory,
	  .params = { P_IDENTITY, { "path", "string", false, false }, { "root", "string", false, false },
		      { "max_bytes", "integer", false, true } } },
	{ .name = "write_file", .run = m_write_file,
	  .params = { P_IDENTITY, { "path", "string", true, false }, { "content", "string", true, false }, P_DURABLE,
		      { "root", "string", false, true }, { "max_bytes", "integer", false, true } } },
	{ .name = "upload", .run = m_upload, .one_of = "content_base64|from",
	  .params = { P_IDENTITY, { "path", "string", true, false }, { "root", "string", false, false },
		      { "content_base64", "string", false, false }, { "mode", "string|integer", false, false },
		      { "from", "string", false, false }, P_DURABLE } },
	{ .name = "download", .run = m_download,
	  .params = { P_IDENTITY, { "path", "string", true, false }, { "root", "string", false, false },
		      { "to", "string", false, false } } },
	{ .name = "diff", .run = m_diff, .params = { P_IDENTITY } },
	{ .name = "merge", .run = m_merge,
	  .params = { P_IDENTITY, { "pick", "string", false, false }, { "dry_run", "boolean", false, false } } },
	{ .name = "status", .run = m_status, .params = { P_IDENTITY } },
	{ .name = "snapshot", .run = m_snapshot, .params = { P_IDENTITY, { "name", "string", false, false } } },
	{ .name = "fork", .run = m_fork,
	  .params = { P_IDENTITY, { "count", "integer", false, false }, { "peers", "array", false, false } } },
	{ .name = "set_size", .run = m_set_size, .params = { P_IDENTITY, { "size", "object", true, false } } },
	{ .name = "list", .run = m_list },
	{ .name = "info", .run = m_info },
	{ .name = "stop", .run = m_stop, .one_of = "identity|sandbox",
	  .params = { { "identity", "object", false, false }, { "sandbox", "string", false, false } } },
	{ .name = "remove", .run = m_remove, .one_of = "identity|sandbox",
	  .params = { { "identity", "object", false, false }, { "sandbox", "string", false, false } } },
	{ .name = "cancel", .run = m_cancel, .params = { { "id", "string|integer", true, false } } },
	{ .name = "prepare", .run = m_prepare },
	{ .name = "image_check", .run = serve_image_check,
	  .params = { { "ref", "string", true, false }, { "timeout", "number", false, false } } },
	{ .name = "_test.advance", .run = m_advance, .test_only = true,
	  .params = { { "ms", "integer", true, false } } },
};

/* The method named name that this server serves, or NULL. */
static const struct method_def *method_find(const struct cap_rpc_server *s, const char *name)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(methods); i++)
		if (strcmp(methods[i].name, name) == 0)
			return methods[i].test_only && !cap_ctl_cfg(s->ctl)->manual_clock ? NULL : &methods[i];
	return NULL;
}

/* The members of params that m declares (a new object; params may be
 * anything): a parameter a method reads is one its table entry names. */
static json_t *declared(const struct method_def *m, json_t *params)
{
	json_t *o = json_object();
	for (const struct param_def *p = m->params; p->name; p++) {
		json_t *v = json_object_get(params, p->name);
		if (v)
			json_object_set(o, p->name, v);
	}
	return o;
}

json_t *cap_serve_schema(void)
{
	json_t *all = json_object();
	for (size_t i = 0; i < CAP_ARRAY_SIZE(methods); i++) {
		const struct method_def *m = &methods[i];
		json_t *params = json_object();
		for (const struct param_def *p = m->params; p->name; p++) {
			json_t *o = json_pack("{s:s, s:b}", "type", p->type, "required", p->required);
			if (p->tolerated)
				json_object_set_new(o, "tolerated", json_true());
			json_object_set_new(params, p->name, o);
		}
		json_t *j = json_pack("{s:o}", "params", params);
		if (m->one_of) {
			const char *bar = strchr(m->one_of, '|');
			json_object_set_new(j, "one_of", json_pack("[s%, s]", m->one_of, (size_t)(bar - m->one_of), bar + 1));
		}
		if (m->test_only)
			json_object_set_new(j, "test_only", json_true());
		json_object_set_new(all, m->name, j);
	}
	return json_pack("{s:s, s:o}", "protocol", "JSON-RPC 2.0, one message per line (docs/serve.md)", "methods", all);
}

size_t serve_method_count(void)
{
	return CAP_ARRAY_SIZE(methods);
}

size_t serve_method_names(const struct cap_rpc_server *s, const char ***names)
{
	*names = xcalloc(CAP_ARRAY_SIZE(methods), sizeof(**names));
	for (size_t i = 0; i < CAP_ARRAY_SIZE(methods); i++)
		(*names)[i] = method_find(s, methods[i].name) ? methods[i].name : NULL;
	return CAP_ARRAY_SIZE(methods);
}

void serve_handle(struct cap_rpc_server *s, struct conn *k, const char *line, size_t len)
{
	int64_t start_ns = cap_now_ns();
	struct cap_rpc_msg m;
	json_t *bad_id;
	char msg[600];
	int code = cap_rpc_parse(line, len, &m, &bad_id, msg, sizeof(msg));
	if (code != 0 || !m.method) {
		if (code == 0)
			snprintf(msg, sizeof(msg), "this server takes requests only; it sent none that a response could answer");
		s->stats.rejected[code == CAP_RPC_PARSE ? SERVE_REJECT_PARSE : SERVE_REJECT_INVALID]++;
		cap_rpc_put_error(&k->out, bad_id, code ? code : CAP_RPC_INVALID, msg, NULL);
		cap_rpc_msg_fini(&m);
		return;
	}
	/* A notification (no id) runs but is never answered, errors included. */
	json_t *id = m.id;
	const struct method_def *e = s->stopped ? NULL : method_find(s, m.method);
	if (s->stopped) {
		s->stats.rejected[SERVE_REJECT_SHUTDOWN]++;
		serve_error(k, id, CAP_RPC_SANDBOX, "the controller is shutting down");
	} else if (!e) {
		s->stats.rejected[SERVE_REJECT_METHOD]++;
		serve_error(k, id, CAP_RPC_METHOD, "method '%s' not found", m.method);
	} else {
		json_t *params = declared(e, m.params);
		s->cur.open = true;
		s->cur.mi = (size_t)(e - methods);
		s->cur.start_ns = start_ns;
		e->run(s, k, id, params);
		s->cur.open = false;	/* answered, submitted, or neither (nothing to count) */
		json_decref(params);
	}
	cap_rpc_msg_fini(&m);
}
