/* serve's client side: one request and its answer over the socket, and
 * an answer read back into the core's typed result (the CLI verbs and
 * `capsule mcp` reaching a controller in another process). */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "controller.h"
#include "jsonrpc.h"
#include "layout.h"
#include "serve.h"
#include "util.h"

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

/* Everything a parsed answer points to beyond the answer itself, in one
 * allocation (freed with one free()). */
struct parsed {
	struct cap_ctl_import imp;
	struct cap_ctl_xfer_out xfer;
	/* then: the import's conflicts and refused, the transfer's refused
	 * (const char *), then the entries */
};

static size_t list_count(json_t *a)
{
	return json_is_array(a) ? json_array_size(a) : 0;
}

/* Point v[0..n) at the strings of a ("" for what is not one). */
static void list_fill(json_t *a, const char **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *s = json_string_value(json_array_get(a, i));
		v[i] = s ? s : "";
	}
}

static void counts_from(json_t *o, struct cap_ctl_xfer_out *x)
{
	x->files = (uint64_t)json_integer_value(json_object_get(o, "files"));
	x->dirs = (uint64_t)json_integer_value(json_object_get(o, "dirs"));
	x->links = (uint64_t)json_integer_value(json_object_get(o, "links"));
	x->bytes = (uint64_t)json_integer_value(json_object_get(o, "bytes"));
	x->durable = json_is_true(json_object_get(o, "durable"));
	x->sync_ms = (uint32_t)json_integer_value(json_object_get(o, "sync_ms"));
}

static uint16_t sync_ms_of(json_t *res)
{
	json_int_t v = json_integer_value(json_object_get(res, "sync_ms"));
	return (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
}

void cap_rpc_result_parse(json_t *answer, enum cap_ctl_kind kind, struct cap_ctl_result *out,
			  void **owned)
{
	json_t *error = json_object_get(answer, "error");
	json_t *res = json_object_get(answer, "result");
	json_t *data = json_object_get(error, "data");
	json_t *where = error ? data : res;	/* what carries import and counts */
	json_t *imp = json_object_get(where, "import");
	json_t *ic = json_object_get(imp, "conflicts"), *ir = json_object_get(imp, "refused");
	json_t *xr = json_object_get(where, "refused");
	json_t *entries = json_object_get(res, "entries");
	bool is_dir = !error && kind == CAP_CTL_FILE && json_is_object(res) &&
		      json_string_value(json_object_get(res, "kind")) &&
		      strcmp(json_string_value(json_object_get(res, "kind")), "directory") == 0;
	size_t nic = list_count(ic), nir = list_count(ir), nxr = list_count(xr);
	size_t ne = is_dir ? list_count(entries) : 0;
	memset(out, 0, sizeof(*out));
	struct parsed *p = xcalloc(1, sizeof(*p) + (nic + nir + nxr) * sizeof(char *) +
					  (ne + 1) * sizeof(struct cap_ctl_entry));
	const char **lists = (const char **)(p + 1);
	struct cap_ctl_entry *v = (struct cap_ctl_entry *)(lists + nic + nir + nxr);
	*owned = p;
	out->kind = kind;
	if (json_is_object(imp)) {
		list_fill(ic, lists, nic);
		list_fill(ir, lists + nic, nir);
		counts_from(imp, &p->imp.out);
		p->imp.out.conflicts = lists;
		p->imp.out.nconflicts = nic;
		p->imp.out.refused = lists + nic;
		p->imp.out.nrefused = nir;
		p->imp.from = json_string_value(json_object_get(imp, "from"));
		p->imp.msg = json_string_value(json_object_get(imp, "error"));
		p->imp.r = p->imp.msg ? -EIO : 0;
		out->import = &p->imp;
	}
	if (kind == CAP_CTL_XFER) {
		list_fill(xr, lists + nic + nir, nxr);
		counts_from(where, &p->xfer);
		p->xfer.refused = lists + nic + nir;
		p->xfer.nrefused = nxr;
		out->xfer = &p->xfer;
	}
	if (error || !json_is_object(res)) {
		const char *msg = json_string_value(json_object_get(error, "message"));
		out->code = code_from((int)json_integer_value(json_object_get(error, "code")));
		out->msg = msg ? msg : "the controller sent an answer without a result";
		out->errnum = (int)json_integer_value(json_object_get(data, "errno"));
		return;
	}
	out->sandbox = json_string_value(json_object_get(res, "sandbox"));
	out->state = json_string_value(json_object_get(res, "state"));
	json_t *prepared = json_object_get(res, "prepared"), *ph;
	size_t k;
	if (json_is_array(prepared))	/* a tool call that prepared first: its phases */
		json_array_foreach(prepared, k, ph)
			for (unsigned p = 0; p < CAP_PREP_NPHASES; p++)
				if (json_is_string(ph) && strcmp(json_string_value(ph), cap_prep_phase_name((enum cap_prep_phase)p)) == 0)
					out->prepared |= 1u << p;
	if (kind == CAP_CTL_EXEC) {
		json_t *ec = json_object_get(res, "exit_code");
		out->exit.kind = json_is_integer(ec) ? CAP_EXIT_CODE : CAP_EXIT_SIGNAL;
		out->exit.value = (int32_t)(json_is_integer(ec) ? json_integer_value(ec)
							       : json_integer_value(json_object_get(res, "signal")));
		out->exit.flags = (json_is_true(json_object_get(res, "timed_out")) ? CAP_EXIT_TIMED_OUT : 0) |
				  (json_is_true(json_object_get(res, "truncated")) ? CAP_EXIT_TRUNCATED : 0) |
				  (json_is_true(json_object_get(res, "durable")) ? CAP_EXIT_DURABLE : 0);
		out->exit.sync_ms = sync_ms_of(res);
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
	if (json_is_true(json_object_get(res, "durable")))	/* write_file */
		out->exit.flags |= CAP_EXIT_DURABLE;
	out->exit.sync_ms = sync_ms_of(res);
	if (is_dir) {
		for (size_t e = 0; e < ne; e++) {
			json_t *o = json_array_get(entries, e);
			const char *t = json_string_value(json_object_get(o, "type"));
			const char *name = json_string_value(json_object_get(o, "name"));
			v[e].type = !t ? 'o' : strcmp(t, "directory") == 0 ? 'd' : strcmp(t, "file") == 0 ? 'f' :
				    strcmp(t, "symlink") == 0 ? 'l' : 'o';
			v[e].name = name ? name : "";
			v[e].size = (uint64_t)json_integer_value(json_object_get(o, "size"));
		}
		out->is_dir = true;
		out->entries = v;
		out->nentries = ne;
		out->entries_truncated = json_is_true(json_object_get(res, "truncated"));
	} else {
		json_t *content = json_object_get(res, "content");
		out->content = (const uint8_t *)(json_string_value(content) ? json_string_value(content) : "");
		out->content_len = json_string_length(content);
	}
}

static json_t *identity_json(const char *agent, const char *peer)
{
	return json_pack("{s:s, s:s}", "agent", agent, "peer", peer);
}

json_t *cap_rpc_request_params(const char *agent, const char *peer, const struct cap_ctl_req *req,
			       const char **out_method)
{
	json_t *params;
	const char *method;
	if (req->kind == CAP_CTL_EXEC) {
		json_t *argv = json_array();
		for (uint32_t a = 0; a < req->exec->argc; a++)
			json_array_append_new(argv, json_string(req->exec->argv[a]));
		params = json_pack("{s:o, s:o, s:f}", "identity", identity_json(agent, peer), "argv", argv,
				   "timeout", req->exec->timeout_ms / 1000.0);
		if (req->exec->flags & CAP_EXEC_NO_SYNC)
			json_object_set_new(params, "durable", json_false());
		method = "exec";
	} else {
		params = json_pack("{s:o, s:s, s:s}", "identity", identity_json(agent, peer), "root",
				   strcmp(req->root, CAP_GUEST_WORK) == 0 ? "workspace" : "public", "path", req->path);
		if (req->op == CAP_FILE_WRITE) {
			json_object_set_new(params, "content", json_stringn(req->data, req->len));
			if (req->no_sync)
				json_object_set_new(params, "durable", json_false());
			method = "write_file";
		} else if (req->op == CAP_FILE_LIST) {
			method = "list_directory";
		} else {
			json_object_set_new(params, "max_bytes", json_integer(req->limit));
			method = "read_file";
		}
	}
	*out_method = method;
	return params;
}

int cap_rpc_call_notify(const char *socket_path, const char *method, json_t *params, int timeout_ms,
			cap_rpc_notify_fn notify, void *ud, json_t **result, json_t **error_data,
			struct cap_err *err)
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
	bool answered = false;
	while (r == 0 && !answered) {
		const uint8_t *nl = cap_buf_used(&in) ? memchr(cap_buf_head(&in), '\n', cap_buf_used(&in)) : NULL;
		if (nl) {
			size_t len = (size_t)(nl - cap_buf_head(&in));
			struct cap_rpc_msg m;
			json_t *bad;
			char msg[600];
			int pr = cap_rpc_parse((const char *)cap_buf_head(&in), len, &m, &bad, msg, sizeof(msg));
			if (pr == 0 && m.method && !m.id) {
				/* A notification (progress): the wait starts again. */
				if (notify)
					notify(ud, m.method, m.params);
				end = cap_now_ms() + timeout_ms;
			} else if (pr != 0 || m.method) {
				r = cap_err_set(err, EPROTO, "the controller at %s sent a malformed answer", socket_path);
			} else if (m.error) {
				const char *em = json_string_value(json_object_get(m.error, "message"));
				r = cap_err_set(err, EIO, "%s", em ? em : "the controller refused");
				if (error_data && json_object_get(m.error, "data"))
					*error_data = json_incref(json_object_get(m.error, "data"));
				answered = true;
			} else {
				*result = json_incref(m.result);
				answered = true;
			}
			cap_rpc_msg_fini(&m);
			cap_buf_consume(&in, len + 1);
			continue;
		}
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
	cap_buf_fini(&in);
	return r;
}

int cap_rpc_call(const char *socket_path, const char *method, json_t *params, int timeout_ms,
		 json_t **result, struct cap_err *err)
{
	return cap_rpc_call_notify(socket_path, method, params, timeout_ms, NULL, NULL, result, NULL, err);
}
