#include "jsonrpc.h"
#include "utf8.h"
#include "util.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

static bool id_ok(json_t *id)
{
	return json_is_string(id) || json_is_integer(id);
}

int cap_rpc_parse(const char *line, size_t n, struct cap_rpc_msg *m,
		  json_t **bad_id, char *msg, size_t msgsz)
{
	json_error_t je;
	memset(m, 0, sizeof(*m));
	*bad_id = NULL;
	if (memchr(line, '\0', n)) {	/* jansson would skip it between tokens */
		snprintf(msg, msgsz, "parse error: the line holds a NUL byte");
		return CAP_RPC_PARSE;
	}
	json_t *root = json_loadb(line, n, JSON_REJECT_DUPLICATES, &je);
	if (!root) {
		snprintf(msg, msgsz, "parse error: %s (column %d)", je.text, je.column);
		return CAP_RPC_PARSE;
	}
	m->owned_root = root;
	if (json_is_array(root)) {
		snprintf(msg, msgsz, "batches are not supported; send one request per line");
		return CAP_RPC_INVALID;
	}
	if (!json_is_object(root)) {
		snprintf(msg, msgsz, "not a JSON-RPC 2.0 message: a line must hold one JSON object");
		return CAP_RPC_INVALID;
	}
	json_t *id = json_object_get(root, "id");
	if (id_ok(id))
		*bad_id = id;
	const char *v = json_string_value(json_object_get(root, "jsonrpc"));
	if (!v || strcmp(v, "2.0") != 0) {
		snprintf(msg, msgsz, "not a JSON-RPC 2.0 message: \"jsonrpc\" must be \"2.0\"");
		return CAP_RPC_INVALID;
	}
	json_t *method = json_object_get(root, "method");
	if (!method) {	/* a response */
		json_t *result = json_object_get(root, "result");
		json_t *error = json_object_get(root, "error");
		if (!id || (!id_ok(id) && !json_is_null(id)) || !result == !error ||
		    (error && !json_is_object(error))) {
			snprintf(msg, msgsz, "not a JSON-RPC 2.0 message: a request needs \"method\", a response an \"id\" and one of \"result\" and \"error\"");
			return CAP_RPC_INVALID;
		}
		m->id = id;
		m->result = result;
		m->error = error;
		return 0;
	}
	if (!json_is_string(method)) {
		snprintf(msg, msgsz, "\"method\" must be a string");
		return CAP_RPC_INVALID;
	}
	if (id && !id_ok(id)) {
		snprintf(msg, msgsz, "\"id\" must be a string or an integer");
		return CAP_RPC_INVALID;
	}
	json_t *params = json_object_get(root, "params");
	if (params && !json_is_object(params)) {
		snprintf(msg, msgsz, "\"params\" must be an object (by-name parameters)");
		return CAP_RPC_INVALID;
	}
	m->method = json_string_value(method);
	m->id = id;
	m->params = params;
	return 0;
}

void cap_rpc_msg_fini(struct cap_rpc_msg *m)
{
	json_decref(m->owned_root);
	memset(m, 0, sizeof(*m));
}

json_t *cap_json_textn(const void *p, size_t n)
{
	size_t len;
	char *clean = cap_utf8_sanitize(p, n, &len);
	json_t *j = json_stringn(clean, len);
	free(clean);
	return j;
}

json_t *cap_json_text(const char *s)
{
	return cap_json_textn(s, strlen(s));
}

static void put(struct cap_buf *out, json_t *msg)
{
	/* Every string in it is valid UTF-8: a message that could not be
	 * built is a bug, never a silent non-answer. */
	CAP_BUG_ON(!msg);
	char *text = json_dumps(msg, JSON_COMPACT);
	CAP_BUG_ON(!text);
	cap_buf_append(out, text, strlen(text));
	cap_buf_append(out, "\n", 1);
	free(text);
	json_decref(msg);
}

void cap_rpc_put_result(struct cap_buf *out, json_t *id, json_t *result)
{
	CAP_BUG_ON(!result);	/* a result that could not be built */
	put(out, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(),
			   "result", result));
}

void cap_rpc_put_error(struct cap_buf *out, json_t *id, int code,
		       const char *msg, json_t *data)
{
	json_t *e = json_pack("{s:i, s:o}", "code", code, "message", cap_json_text(msg ? msg : "error"));
	if (data)
		json_object_set_new(e, "data", data);
	put(out, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id ? id : json_null(), "error", e));
}

void cap_rpc_put_request(struct cap_buf *out, long long id, const char *method,
			 json_t *params)
{
	json_t *m = json_pack("{s:s, s:s}", "jsonrpc", "2.0", "method", method);
	if (id >= 0)
		json_object_set_new(m, "id", json_integer(id));
	if (params)
		json_object_set_new(m, "params", params);
	put(out, m);
}

void cap_rpc_reader_init(struct cap_rpc_reader *r)
{
	cap_buf_init(&r->in);
	r->st = (struct cap_lines){ 0 };
	r->max = 0;
}

void cap_rpc_reader_fini(struct cap_rpc_reader *r)
{
	cap_buf_fini(&r->in);
}

void cap_rpc_feed(struct cap_rpc_reader *r, const void *p, size_t n,
		  void (*line)(void *ud, const char *p, size_t n),
		  void (*too_long)(void *ud), void *ud)
{
	if (n == 0)
		return;
	cap_buf_append(&r->in, p, n);
	cap_buf_lines(&r->in, r->max ? r->max : CAP_RPC_LINE_MAX, &r->st, line, too_long, ud);
}

int cap_rpc_read(struct cap_rpc_reader *r, int fd,
		 void (*line)(void *ud, const char *p, size_t n),
		 void (*too_long)(void *ud), void *ud)
{
	uint8_t *p = cap_buf_reserve(&r->in, 65536);
	ssize_t n = read(fd, p, 65536);
	if (n == 0)
		return 0;
	if (n < 0)
		return errno == EAGAIN || errno == EINTR ? -EAGAIN : 0;
	cap_buf_commit(&r->in, (size_t)n);
	cap_buf_lines(&r->in, r->max ? r->max : CAP_RPC_LINE_MAX, &r->st, line, too_long, ud);
	return 1;
}

int cap_rpc_flush(struct cap_buf *out, int fd)
{
	struct stat st;
	bool sock = fstat(fd, &st) == 0 && S_ISSOCK(st.st_mode);
	while (cap_buf_used(out) > 0) {
		ssize_t n = sock ? send(fd, cap_buf_head(out), cap_buf_used(out), MSG_NOSIGNAL)
				 : write(fd, cap_buf_head(out), cap_buf_used(out));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return 0;
			return -errno;
		}
		cap_buf_consume(out, (size_t)n);
	}
	return 0;
}
