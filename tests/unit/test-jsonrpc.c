/* src/common/jsonrpc: envelopes accepted and refused, the line limit of the
 * reader, and the shape of what the encoders write. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "controller.h"
#include "jsonrpc.h"
#include "serve.h"
#include "util.h"

static struct cap_rpc_msg m;
static json_t *bad;
static char msg[256];

/* Parse a NUL-terminated line into the globals; the caller finis m. */
static int parse(const char *line)
{
	memset(msg, 0, sizeof(msg));
	return cap_rpc_parse(line, strlen(line), &m, &bad, msg, sizeof(msg));
}

static void request_with_params(void **state)
{
	(void)state;
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"x\"}}"), 0);
	assert_string_equal(m.method, "tools/call");
	assert_true(json_is_integer(m.id));
	assert_int_equal(json_integer_value(m.id), 1);
	assert_true(json_is_object(m.params));
	assert_string_equal(json_string_value(json_object_get(m.params, "name")), "x");
	assert_null(m.result);
	assert_null(m.error);
	cap_rpc_msg_fini(&m);
	assert_null(m.owned_root);

	/* A string id, params absent. */
	assert_int_equal(parse("{\"method\":\"ping\",\"id\":\"a-1\",\"jsonrpc\":\"2.0\"}"), 0);
	assert_string_equal(json_string_value(m.id), "a-1");
	assert_null(m.params);
	cap_rpc_msg_fini(&m);
}

static void notification_has_no_id(void **state)
{
	(void)state;
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}"), 0);
	assert_string_equal(m.method, "notifications/initialized");
	assert_null(m.id);
	assert_null(m.params);
	cap_rpc_msg_fini(&m);
}

static void batch_refused(void **state)
{
	(void)state;
	assert_int_equal(parse("[{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\"},{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"b\"}]"),
			 CAP_RPC_INVALID);
	assert_non_null(strstr(msg, "batch"));
	assert_null(bad);
	cap_rpc_msg_fini(&m);
	assert_int_equal(parse("[]"), CAP_RPC_INVALID);
	assert_non_null(strstr(msg, "batch"));
	cap_rpc_msg_fini(&m);
}

static void params_must_be_an_object(void **state)
{
	(void)state;
	const char *v[] = { "[1,2]", "\"x\"", "null", "3", "true" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		char line[128];
		snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":5,\"method\":\"m\",\"params\":%s}", v[i]);
		assert_int_equal(parse(line), CAP_RPC_INVALID);
		assert_non_null(strstr(msg, "params"));
		/* The id was usable: the error goes back to it. */
		assert_non_null(bad);
		assert_int_equal(json_integer_value(bad), 5);
		cap_rpc_msg_fini(&m);
	}
}

static void id_must_be_string_or_integer(void **state)
{
	(void)state;
	const char *v[] = { "1.5", "1e3", "[1]", "{}", "{\"a\":1}", "true", "null" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		char line[128];
		snprintf(line, sizeof(line), "{\"jsonrpc\":\"2.0\",\"id\":%s,\"method\":\"m\"}", v[i]);
		assert_int_equal(parse(line), CAP_RPC_INVALID);
		assert_non_null(strstr(msg, "\"id\""));
		assert_null(bad);	/* not usable: the reply goes to id null */
		cap_rpc_msg_fini(&m);
	}
}

static void jsonrpc_must_be_2_0(void **state)
{
	(void)state;
	assert_int_equal(parse("{\"jsonrpc\":\"1.0\",\"id\":\"abc\",\"method\":\"m\"}"), CAP_RPC_INVALID);
	assert_non_null(strstr(msg, "2.0"));
	assert_true(json_is_string(bad));
	assert_string_equal(json_string_value(bad), "abc");
	cap_rpc_msg_fini(&m);

	assert_int_equal(parse("{\"id\":7,\"method\":\"m\"}"), CAP_RPC_INVALID);	/* absent */
	assert_int_equal(json_integer_value(bad), 7);
	cap_rpc_msg_fini(&m);
	assert_int_equal(parse("{\"jsonrpc\":2.0,\"id\":7,\"method\":\"m\"}"), CAP_RPC_INVALID);
	cap_rpc_msg_fini(&m);
}

static void invalid_json_is_a_parse_error(void **state)
{
	(void)state;
	const char *v[] = { "{", "{\"jsonrpc\":}", "", "   ", "nul", "{\"a\":1}}", "\xff", "{\"id\":1,}" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		assert_int_equal(parse(v[i]), CAP_RPC_PARSE);
		assert_memory_equal(msg, "parse error", 11);
		assert_null(bad);
		assert_null(m.owned_root);
		cap_rpc_msg_fini(&m);
	}
	/* A NUL escaped in a string (JSON_ALLOW_NUL is not given). */
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"a\\u0000b\"}"), CAP_RPC_PARSE);
	cap_rpc_msg_fini(&m);
}

static void duplicate_keys_are_a_parse_error(void **state)
{
	(void)state;
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"id\":2,\"method\":\"m\"}"), CAP_RPC_PARSE);
	assert_null(bad);
	cap_rpc_msg_fini(&m);
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"a\":1,\"a\":1}}"),
			 CAP_RPC_PARSE);
	cap_rpc_msg_fini(&m);
}

static void responses(void **state)
{
	(void)state;
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":{\"ok\":true}}"), 0);
	assert_null(m.method);
	assert_null(m.error);
	assert_true(json_is_true(json_object_get(m.result, "ok")));
	assert_int_equal(json_integer_value(m.id), 3);
	cap_rpc_msg_fini(&m);

	/* Any JSON value is a result, null included. */
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":4,\"result\":null}"), 0);
	assert_true(json_is_null(m.result));
	cap_rpc_msg_fini(&m);

	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":\"x\",\"error\":{\"code\":-32601,\"message\":\"no\"}}"), 0);
	assert_null(m.method);
	assert_null(m.result);
	assert_int_equal(json_integer_value(json_object_get(m.error, "code")), -32601);
	assert_string_equal(json_string_value(m.id), "x");
	cap_rpc_msg_fini(&m);

	/* An error to a request whose id could not be read. */
	assert_int_equal(parse("{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32700,\"message\":\"p\"}}"), 0);
	assert_true(json_is_null(m.id));
	cap_rpc_msg_fini(&m);
}

static void responses_refused(void **state)
{
	(void)state;
	const char *v[] = {
		"{\"jsonrpc\":\"2.0\",\"id\":3,\"result\":1,\"error\":{\"code\":1,\"message\":\"m\"}}",	/* both */
		"{\"jsonrpc\":\"2.0\",\"id\":3}",	/* neither */
		"{\"jsonrpc\":\"2.0\",\"result\":1}",	/* no id */
		"{\"jsonrpc\":\"2.0\",\"id\":3,\"error\":\"bad\"}",	/* error not an object */
		"{\"jsonrpc\":\"2.0\",\"id\":[3],\"result\":1}",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v); i++) {
		assert_int_equal(parse(v[i]), CAP_RPC_INVALID);
		assert_true(msg[0] != '\0');
		cap_rpc_msg_fini(&m);
	}
}

/* --- the line limit -------------------------------------------------------- */

struct seen {
	size_t lines, too_long, last_len;
	bool parsed_ok;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct seen *s = ud;
	struct cap_rpc_msg lm;
	json_t *lb;
	char lmsg[256];
	s->lines++;
	s->last_len = n;
	if (n == CAP_RPC_LINE_MAX) {
		s->parsed_ok = cap_rpc_parse(p, n, &lm, &lb, lmsg, sizeof(lmsg)) == 0;
		cap_rpc_msg_fini(&lm);
	}
}

static void on_too_long(void *ud) { ((struct seen *)ud)->too_long++; }

/* A request of exactly len bytes (blanks after the object), its newline,
 * then a short request. */
static char *stream(size_t len, size_t *n)
{
	static const char req[] = "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"big\"}";
	static const char next[] = "{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"next\"}\n";
	*n = len + 1 + sizeof(next) - 1;
	char *s = xmalloc(*n);
	memset(s, ' ', len);
	memcpy(s, req, sizeof(req) - 1);
	s[len] = '\n';
	memcpy(s + len + 1, next, sizeof(next) - 1);
	return s;
}

/* Feed s to a fresh reader in pieces of at most piece bytes, the first
 * piece first bytes long (0: piece). */
static struct seen feed(const char *s, size_t n, size_t first, size_t piece)
{
	struct seen seen = { 0 };
	struct cap_rpc_reader r;
	cap_rpc_reader_init(&r);
	for (size_t off = 0; off < n;) {
		size_t k = CAP_MIN(off == 0 && first ? first : piece, n - off);
		cap_rpc_feed(&r, s + off, k, on_line, on_too_long, &seen);
		off += k;
	}
	cap_rpc_reader_fini(&r);
	return seen;
}

static void line_limit(void **state)
{
	(void)state;
	size_t n;
	const size_t max = CAP_RPC_LINE_MAX;
	assert_int_equal(max, 4u << 20);

	/* Exactly at the limit: delivered whole and parsed, however cut. */
	_cleanup_free_ char *at = stream(max, &n);
	const size_t cuts[][2] = { { n, n }, { max, 65536 }, { max - 1, 1 }, { 1, 65536 }, { 0, 4096 } };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cuts); i++) {
		struct seen s = feed(at, n, cuts[i][0], cuts[i][1]);
		assert_int_equal(s.too_long, 0);
		assert_int_equal(s.lines, 2);
		assert_true(s.parsed_ok);
	}

	/* One byte over: refused once, and the next line still arrives. */
	_cleanup_free_ char *over = stream(max + 1, &n);
	const size_t cuts2[][2] = { { n, n }, { max, 65536 }, { max + 1, 65536 }, { max + 2, 65536 },
				    { 1, 65536 }, { 0, 4096 } };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cuts2); i++) {
		struct seen s = feed(over, n, cuts2[i][0], cuts2[i][1]);
		assert_int_equal(s.too_long, 1);
		assert_int_equal(s.lines, 1);
		assert_int_equal(s.last_len, strlen("{\"jsonrpc\":\"2.0\",\"id\":2,\"method\":\"next\"}"));
	}
}

/* --- the encoders ---------------------------------------------------------- */

/* out holds one line of JSON: return it parsed and empty out. */
static json_t *one_line(struct cap_buf *out)
{
	size_t n = cap_buf_used(out);
	const char *p = (const char *)cap_buf_head(out);
	assert_true(n > 1);
	assert_int_equal(p[n - 1], '\n');
	assert_null(memchr(p, '\n', n - 1));
	json_error_t je;
	json_t *j = json_loadb(p, n - 1, JSON_REJECT_DUPLICATES, &je);
	assert_non_null(j);
	assert_string_equal(json_string_value(json_object_get(j, "jsonrpc")), "2.0");
	cap_buf_consume(out, n);
	return j;
}

static void put_error_null_id(void **state)
{
	(void)state;
	struct cap_buf out;
	cap_buf_init(&out);
	cap_rpc_put_error(&out, NULL, CAP_RPC_PARSE, "parse error: x", NULL);
	assert_non_null(memmem(cap_buf_head(&out), cap_buf_used(&out), "\"id\":null", 9));
	json_t *j = one_line(&out);
	assert_true(json_is_null(json_object_get(j, "id")));
	json_t *e = json_object_get(j, "error");
	assert_int_equal(json_integer_value(json_object_get(e, "code")), CAP_RPC_PARSE);
	assert_string_equal(json_string_value(json_object_get(e, "message")), "parse error: x");
	assert_null(json_object_get(e, "data"));
	assert_null(json_object_get(j, "result"));
	json_decref(j);

	/* With an id and data (stolen). */
	json_t *id = json_string("r1");
	cap_rpc_put_error(&out, id, CAP_RPC_CAPACITY, "busy", json_pack("{s:i}", "retry_ms", 50));
	j = one_line(&out);
	assert_true(json_equal(json_object_get(j, "id"), id));
	assert_int_equal(json_integer_value(json_object_get(json_object_get(json_object_get(j, "error"), "data"), "retry_ms")), 50);
	json_decref(j);
	json_decref(id);
	cap_buf_fini(&out);
}

static void put_result_and_request(void **state)
{
	(void)state;
	struct cap_buf out;
	cap_buf_init(&out);
	cap_rpc_put_result(&out, NULL, json_object());	/* id null (a NULL result is a bug: CAP_BUG_ON) */
	json_t *j = one_line(&out);
	assert_true(json_is_null(json_object_get(j, "id")));
	assert_true(json_is_object(json_object_get(j, "result")));
	json_decref(j);

	cap_rpc_put_request(&out, 9, "tools/list", json_object());
	j = one_line(&out);
	assert_int_equal(json_integer_value(json_object_get(j, "id")), 9);
	assert_string_equal(json_string_value(json_object_get(j, "method")), "tools/list");
	json_decref(j);

	cap_rpc_put_request(&out, -1, "notifications/cancelled", NULL);	/* a notification */
	j = one_line(&out);
	assert_null(json_object_get(j, "id"));
	assert_null(json_object_get(j, "params"));
	json_decref(j);
	cap_buf_fini(&out);
}

/* Whether v is of the method table's type t ("string", "integer"|...). */
static bool of_type(json_t *v, const char *t)
{
	static const struct { const char *name; int type; } types[] = {
		{ "string", JSON_STRING }, { "integer", JSON_INTEGER },
		{ "object", JSON_OBJECT }, { "array", JSON_ARRAY },
	};
	for (const char *at = t; at; at = strchr(at, '|') ? strchr(at, '|') + 1 : NULL) {
		size_t n = strcspn(at, "|");
		if (strncmp(at, "number", n) == 0 && n == 6 && json_is_number(v))
			return true;
		if (strncmp(at, "boolean", n) == 0 && n == 7 && json_is_boolean(v))
			return true;
		for (size_t i = 0; i < CAP_ARRAY_SIZE(types); i++)
			if (strlen(types[i].name) == n && strncmp(at, types[i].name, n) == 0 &&
			    (int)json_typeof(v) == types[i].type)
				return true;
	}
	return false;
}

/* What the serve client's request encoder (capsule mcp's remote mode)
 * sends is what the method table declares: each member a declared
 * parameter of its type, each required one there. */
static void client_requests_follow_the_table(void **state)
{
	(void)state;
	json_t *schema = cap_serve_schema();
	json_t *methods = json_object_get(schema, "methods");
	const char *argv[] = { "/bin/sh", "-c", "true", NULL };
	char *env[] = { NULL };
	struct cap_exec_req x = { .argv = (char **)argv, .argc = 3, .env = env, .timeout_ms = 1500,
				  .flags = CAP_EXEC_NO_SYNC };
	const struct cap_ctl_req reqs[] = {
		{ .kind = CAP_CTL_EXEC, .exec = &x },
		{ .kind = CAP_CTL_FILE, .op = CAP_FILE_READ, .root = "/source", .path = "a", .limit = 10 },
		{ .kind = CAP_CTL_FILE, .op = CAP_FILE_LIST, .root = "/work", .path = "" },
		{ .kind = CAP_CTL_FILE, .op = CAP_FILE_WRITE, .root = "/work", .path = "b", .data = "hi", .len = 2,
		  .no_sync = true },
	};
	const char *want[] = { "exec", "read_file", "list_directory", "write_file" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(reqs); i++) {
		const char *method = NULL, *key;
		json_t *params = cap_rpc_request_params("agent", "peer", &reqs[i], &method), *v;
		json_t *decl = json_object_get(json_object_get(methods, method), "params");
		assert_string_equal(method, want[i]);
		assert_non_null(decl);
		json_object_foreach(params, key, v) {
			json_t *d = json_object_get(decl, key);
			if (!d || !of_type(v, json_string_value(json_object_get(d, "type"))))
				fail_msg("%s: params.%s is not declared, or not of its type", method, key);
		}
		json_object_foreach(decl, key, v)
			if (json_is_true(json_object_get(v, "required")) && !json_object_get(params, key))
				fail_msg("%s: params.%s is required and not sent", method, key);
		json_decref(params);
	}
	json_decref(schema);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(request_with_params),
		cmocka_unit_test(notification_has_no_id),
		cmocka_unit_test(batch_refused),
		cmocka_unit_test(params_must_be_an_object),
		cmocka_unit_test(id_must_be_string_or_integer),
		cmocka_unit_test(jsonrpc_must_be_2_0),
		cmocka_unit_test(invalid_json_is_a_parse_error),
		cmocka_unit_test(duplicate_keys_are_a_parse_error),
		cmocka_unit_test(responses),
		cmocka_unit_test(responses_refused),
		cmocka_unit_test(line_limit),
		cmocka_unit_test(put_error_null_id),
		cmocka_unit_test(put_result_and_request),
		cmocka_unit_test(client_requests_follow_the_table),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
