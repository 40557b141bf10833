/* The MCP front end of the controller: JSON-RPC 2.0 on stdin/stdout, one
 * message per line. stdout carries protocol messages only; logs go to
 * stderr. Tools run in the sandbox of the identity (configured agent,
 * peer from --peer or from the orchestrator's _meta), through the same
 * calls as `capsule serve`. */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "controller-internal.h"
#include "mcp.h"
#include "utf8.h"
#include "util.h"

#define LINE_MAX_BYTES (4u << 20)
#define WRITE_MAX 60000	/* one FILE frame */
#define PEER_META "capsule/peer"

static const char *const tool_names[CAP_TOOL_COUNT_] = {
	[CAP_TOOL_READ_FILE] = "read_file",
	[CAP_TOOL_LIST_DIRECTORY] = "list_directory",
	[CAP_TOOL_WRITE_FILE] = "write_file",
	[CAP_TOOL_RUN_COMMAND] = "run_command",
};

static const char *const versions[] = { "2025-11-25", "2025-06-18" };

const char *cap_mcp_tool_name(enum cap_mcp_tool t) { return tool_names[t]; }

int cap_mcp_tool_parse(const char *name, enum cap_mcp_tool *out)
{
	for (int t = 0; t < CAP_TOOL_COUNT_; t++)
		if (strcmp(name, tool_names[t]) == 0) {
			*out = (enum cap_mcp_tool)t;
			return 0;
		}
	return -EINVAL;
}

void cap_mcp_cfg_init(struct cap_mcp_cfg *c)
{
	memset(c, 0, sizeof(*c));
	cap_controller_cfg_init(&c->ctl);
	c->tools[CAP_TOOL_READ_FILE] = true;
	c->read_max_bytes = READ_MAX;
	c->read_max_chars = 32000;
	c->read_max_lines = 500;
	c->run_timeout_s = 30;
}

void cap_mcp_cfg_fini(struct cap_mcp_cfg *c)
{
	free(c->owned_agent);
	free(c->owned_peer);
	free(c->owned_image);
	free(c->owned_source);
	memset(c, 0, sizeof(*c));
}

/* --- configuration file --------------------------------------------------------- */

static int cfg_uint(json_t *o, const char *key, const char *where, uint64_t max, uint64_t *out,
		    struct cap_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || (uint64_t)json_integer_value(v) > max)
		return cap_err_set(err, EINVAL, "%s.%s must be an integer from 0 to %llu", where, key,
				   (unsigned long long)max);
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int cfg_str(json_t *o, const char *key, char **out, struct cap_err *err)
{
	json_t *v = json_object_get(o, key);
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return cap_err_set(err, EINVAL, "\"%s\" must be a string", key);
	free(*out);
	*out = xstrdup(json_string_value(v));
	return 0;
}

static int only_keys(json_t *o, const char *where, const char *const *keys, struct cap_err *err)
{
	const char *k;
	json_t *v;
	json_object_foreach(o, k, v) {
		bool known = false;
		for (size_t i = 0; keys[i]; i++)
			known |= strcmp(k, keys[i]) == 0;
		if (!known)
			return cap_err_set(err, EINVAL, "unknown setting %s.%s", where, k);
	}
	return 0;
}

int cap_mcp_cfg_load(struct cap_mcp_cfg *c, const char *path, struct cap_err *err)
{
	json_error_t je;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return cap_err_set(err, EINVAL, "%s: %s (line %d)", path, je.text, je.line);
	static const char *const top[] = { "agent", "peer", "image", "source", "tools", "limits", "lifecycle", NULL };
	static const char *const lim[] = { "read_max_bytes", "read_max_chars", "read_max_lines", "run_timeout_s", NULL };
	static const char *const life[] = { "idle_pause_s", "idle_stop_s", "capacity", "warm_pool", NULL };
	int r = 0;
	uint64_t v;
	json_t *tools = json_object_get(j, "tools");
	json_t *limits = json_object_get(j, "limits");
	json_t *lc = json_object_get(j, "lifecycle");
	if (!json_is_object(j))
		r = cap_err_set(err, EINVAL, "%s: the configuration must be a JSON object", path);
	if (r == 0)
		r = only_keys(j, "config", top, err);
	if (r == 0)
		r = cfg_str(j, "agent", &c->owned_agent, err);
	if (r == 0)
		r = cfg_str(j, "peer", &c->owned_peer, err);
	if (r == 0)
		r = cfg_str(j, "image", &c->owned_image, err);
	if (r == 0)
		r = cfg_str(j, "source", &c->owned_source, err);
	if (r == 0 && tools) {
		const char *k;
		json_t *val;
		if (!json_is_object(tools))
			r = cap_err_set(err, EINVAL, "\"tools\" must be an object of tool names to true/false");
		json_object_foreach(tools, k, val) {
			enum cap_mcp_tool t;
			if (r < 0)
				break;
			if (cap_mcp_tool_parse(k, &t) < 0)
				r = cap_err_set(err, EINVAL, "tools.%s: no such tool (read_file, list_directory, write_file, run_command)", k);
			else if (!json_is_boolean(val))
				r = cap_err_set(err, EINVAL, "tools.%s must be true or false", k);
			else
				c->tools[t] = json_is_true(val);
		}
	}
	if (r == 0 && limits) {
		r = json_is_object(limits) ? only_keys(limits, "limits", lim, err)
					   : cap_err_set(err, EINVAL, "\"limits\" must be an object");
		v = c->read_max_bytes;
		if (r == 0 && (r = cfg_uint(limits, "read_max_bytes", "limits", 64u << 20, &v, err)) == 0)
			c->read_max_bytes = (uint32_t)v;
		v = c->read_max_chars;
		if (r == 0 && (r = cfg_uint(limits, "read_max_chars", "limits", 1u << 24, &v, err)) == 0)
			c->read_max_chars = (uint32_t)v;
		v = c->read_max_lines;
		if (r == 0 && (r = cfg_uint(limits, "read_max_lines", "limits", 100000, &v, err)) == 0)
			c->read_max_lines = (uint32_t)v;
		v = c->run_timeout_s;
		if (r == 0 && (r = cfg_uint(limits, "run_timeout_s", "limits", 86400, &v, err)) == 0)
			c->run_timeout_s = (uint32_t)v;
	}
	if (r == 0 && lc) {
		r = json_is_object(lc) ? only_keys(lc, "lifecycle", life, err)
				       : cap_err_set(err, EINVAL, "\"lifecycle\" must be an object");
		v = (uint64_t)(c->ctl.lc.idle_pause_ms / 1000);
		if (r == 0 && (r = cfg_uint(lc, "idle_pause_s", "lifecycle", 86400 * 365, &v, err)) == 0)
			c->ctl.lc.idle_pause_ms = (int64_t)v * 1000;
		v = (uint64_t)(c->ctl.lc.idle_stop_ms / 1000);
		if (r == 0 && (r = cfg_uint(lc, "idle_stop_s", "lifecycle", 86400 * 365, &v, err)) == 0)
			c->ctl.lc.idle_stop_ms = (int64_t)v * 1000;
		v = c->ctl.lc.capacity;
		if (r == 0 && (r = cfg_uint(lc, "capacity", "lifecycle", 256, &v, err)) == 0)
			c->ctl.lc.capacity = (unsigned)(v ? v : 1);
		v = c->ctl.warm_pool;
		if (r == 0 && (r = cfg_uint(lc, "warm_pool", "lifecycle", 64, &v, err)) == 0)
			c->ctl.warm_pool = (unsigned)v;
	}
	json_decref(j);
	if (r < 0)
		cap_err_prefix(err, "%s", path);
	return r;
}

/* --- the server ------------------------------------------------------------------ */

struct mcp {
	struct cap_mcp_cfg *cfg;
	struct cap_buf in, out;
	struct conn stdio;	/* stands for the one client of the calls */
	bool initialized;
	bool discarding;
	bool eof;
};

/* What a tool call needs to turn the controller's answer into a result. */
struct mcp_call {
	enum cap_mcp_tool tool;
	uint64_t offset;	/* first line or entry, 1-based */
	uint32_t limit;	/* lines or entries */
	char shown[4300];	/* the path as the model sees it, /source/... */
};

static void send_msg(struct mcp *m, json_t *msg)
{
	char *text = json_dumps(msg, JSON_COMPACT);
	if (text) {
		cap_buf_append(&m->out, text, strlen(text));
		cap_buf_append(&m->out, "\n", 1);
		free(text);
	}
	json_decref(msg);
}

static void result_to(struct mcp *m, json_t *id, json_t *result)
{
	send_msg(m, json_pack("{s:s, s:O, s:o}", "jsonrpc", "2.0", "id", id, "result", result));
}

static void error_to(struct mcp *m, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void error_to(struct mcp *m, json_t *id, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	send_msg(m, json_pack("{s:s, s:O, s:{s:i, s:s}}", "jsonrpc", "2.0", "id", id ? id : json_null(),
			      "error", "code", code, "message", msg));
}

static json_t *text_result(const char *text, bool is_error)
{
	return json_pack("{s:[{s:s, s:s}], s:b}", "content", "type", "text", "text", text, "isError", is_error);
}

static void tool_error(struct mcp *m, json_t *id, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void tool_error(struct mcp *m, json_t *id, const char *fmt, ...)
{
	char msg[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	result_to(m, id, text_result(msg, true));
}

/* The number of UTF-8 characters in p[0..n). */
static size_t chars(const char *p, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < n; i++)
		k += ((unsigned char)p[i] & 0xc0) != 0x80;
	return k;
}

/* The byte length of the first max characters of p[0..n). */
static size_t prefix_of_chars(const char *p, size_t n, size_t max)
{
	size_t k = 0, i = 0;
	for (; i < n; i++) {
		if (((unsigned char)p[i] & 0xc0) != 0x80) {
			if (k == max)
				break;
			k++;
		}
	}
	return i;
}

/* A window of at most max_lines lines and max_chars characters from line
 * `offset` (1-based), with a note saying how to go on when cut. */
static json_t *window(struct mcp *m, const struct mcp_call *mc, const char *s, size_t n,
		      bool *is_error)
{
	uint64_t total = 0;
	for (size_t i = 0; i < n; i++)
		total += s[i] == '\n';
	if (n > 0 && s[n - 1] != '\n')
		total++;
	*is_error = false;
	if (n == 0)
		return json_string("");
	if (mc->offset > total) {
		*is_error = true;
		char msg[4500];
		snprintf(msg, sizeof(msg), "offset %llu is past the end of %s, which has %llu lines",
			 (unsigned long long)mc->offset, mc->shown, (unsigned long long)total);
		return json_string(msg);
	}
	size_t start = 0;
	for (uint64_t line = 1; line < mc->offset; line++)
		start = (size_t)((const char *)memchr(s + start, '\n', n - start) - s) + 1;
	size_t end = start, used = 0;
	uint64_t lines = 0;
	bool cut_line = false;
	while (end < n && lines < mc->limit) {
		const char *nl = memchr(s + end, '\n', n - end);
		size_t next = nl ? (size_t)(nl - s) + 1 : n;
		size_t c = chars(s + end, next - end);
		if (used + c > m->cfg->read_max_chars) {
			if (lines == 0) {	/* one line longer than the whole budget */
				end += prefix_of_chars(s + end, next - end, m->cfg->read_max_chars);
				cut_line = true;
			}
			break;
		}
		used += c;
		end = next;
		lines++;
	}
	struct cap_buf b;
	cap_buf_init(&b);
	cap_buf_append(&b, s + start, end - start);
	uint64_t last = mc->offset + lines - (lines ? 1 : 0);
	char note[4600] = "";
	if (cut_line)
		snprintf(note, sizeof(note), "\n[capsule: line %llu of %s is longer than %u characters; only its start is shown]\n",
			 (unsigned long long)mc->offset, mc->shown, m->cfg->read_max_chars);
	else if (end < n)
		snprintf(note, sizeof(note), "\n[capsule: truncated: lines %llu-%llu of %llu shown; read_file with offset=%llu for more]\n",
			 (unsigned long long)mc->offset, (unsigned long long)last, (unsigned long long)total,
			 (unsigned long long)last + 1);
	cap_buf_append(&b, note, strlen(note));
	json_t *j = json_stringn((const char *)cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	return j;
}

static json_t *listing(const struct mcp_call *mc, json_t *entries, bool more)
{
	size_t total = json_array_size(entries);
	struct cap_buf b;
	cap_buf_init(&b);
	char line[700];
	int k = snprintf(line, sizeof(line), "%s is a directory:\n", mc->shown);
	cap_buf_append(&b, line, (size_t)k);
	size_t shown = 0;
	for (size_t i = mc->offset ? mc->offset - 1 : 0; i < total && shown < mc->limit; i++, shown++) {
		json_t *e = json_array_get(entries, i);
		const char *name = json_string_value(json_object_get(e, "name"));
		const char *type = json_string_value(json_object_get(e, "type"));
		if (strcmp(type, "directory") == 0)
			k = snprintf(line, sizeof(line), "%s/\n", name);
		else if (strcmp(type, "file") == 0)
			k = snprintf(line, sizeof(line), "%s\t%lld bytes\n", name,
				     (long long)json_integer_value(json_object_get(e, "size")));
		else
			k = snprintf(line, sizeof(line), "%s\t(%s)\n", name, type);
		cap_buf_append(&b, line, (size_t)CAP_MIN(k, (int)sizeof(line) - 1));
	}
	if (more || (mc->offset ? mc->offset - 1 : 0) + shown < total) {
		k = snprintf(line, sizeof(line), "[capsule: truncated: %zu entries shown%s; the listing stops at %u entries]\n",
			     shown, more ? ", the directory has more" : "", LIST_MAX);
		cap_buf_append(&b, line, (size_t)k);
	}
	json_t *j = json_stringn((const char *)cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	return j;
}

/* The controller answered a tool call: make it an MCP tool result. */
static void tool_reply(struct ctl *c, struct call *k, json_t *result, int code,
		       const char *msg, json_t *data)
{
	struct mcp *m = c->fe_state;
	struct mcp_call *mc = k->front;
	json_decref(data);
	if (!k->conn || !k->id) {	/* cancelled by the client: no answer */
		json_decref(result);
		free(mc);
		k->front = NULL;
		return;
	}
	if (code != 0) {
		tool_error(m, k->id, "%s%s", msg ? msg : "the tool failed",
			   code == RPC_CAPACITY ? " (every sandbox is busy; try again shortly)" : "");
	} else if (mc->tool == CAP_TOOL_RUN_COMMAND) {
		json_t *ec = json_object_get(result, "exit_code");
		bool timed = json_is_true(json_object_get(result, "timed_out"));
		char head[200];
		if (timed)
			snprintf(head, sizeof(head), "timed out after %u s; the command was killed\n", m->cfg->run_timeout_s);
		else if (json_is_integer(ec))
			snprintf(head, sizeof(head), "exit code %lld\n", (long long)json_integer_value(ec));
		else
			snprintf(head, sizeof(head), "killed by signal %lld\n",
				 (long long)json_integer_value(json_object_get(result, "signal")));
		char *text = xasprintf("%s--- stdout ---\n%s--- stderr ---\n%s%s", head,
				       json_string_value(json_object_get(result, "stdout")),
				       json_string_value(json_object_get(result, "stderr")),
				       json_is_true(json_object_get(result, "truncated")) ? "[capsule: output truncated at 256 KiB]\n" : "");
		json_t *r = text_result(text, timed || !json_is_integer(ec) || json_integer_value(ec) != 0);
		free(text);
		json_object_set_new(r, "structuredContent", json_pack("{s:O, s:O, s:O, s:O, s:O}",
			"exit_code", ec, "signal", json_object_get(result, "signal"),
			"timed_out", json_object_get(result, "timed_out"),
			"stdout", json_object_get(result, "stdout"), "stderr", json_object_get(result, "stderr")));
		result_to(m, k->id, r);
	} else if (mc->tool == CAP_TOOL_WRITE_FILE) {
		char text[4500];
		snprintf(text, sizeof(text), "wrote %lld bytes to %s",
			 (long long)json_integer_value(json_object_get(result, "bytes")), mc->shown);
		result_to(m, k->id, text_result(text, false));
	} else {
		const char *kind = json_string_value(json_object_get(result, "kind"));
		bool is_error = false;
		json_t *text;
		if (kind && strcmp(kind, "directory") == 0)
			text = listing(mc, json_object_get(result, "entries"),
				       json_is_true(json_object_get(result, "truncated")));
		else if (mc->tool == CAP_TOOL_LIST_DIRECTORY)
			text = json_string("not a directory"), is_error = true;
		else
			text = window(m, mc, json_string_value(json_object_get(result, "content")),
				      json_string_length(json_object_get(result, "content")), &is_error);
		result_to(m, k->id, json_pack("{s:[{s:s, s:o}], s:b}", "content", "type", "text", "text", text,
					       "isError", is_error));
	}
	json_decref(result);
	free(mc);
	k->front = NULL;
}

static json_t *schema_path(void)
{
	return json_pack("{s:s, s:s}", "type", "string", "description",
			 "Path relative to the root, without '..' (for example docs/readme.md)");
}

static json_t *tool_def(enum cap_mcp_tool t, const struct cap_mcp_cfg *cfg)
{
	json_t *root = json_pack("{s:s, s:[s, s], s:s, s:s}", "type", "string", "enum", "public", "workspace",
				 "default", "public", "description",
				 "public: the read-only public data at /source; workspace: your private /work");
	char desc[600];
	switch (t) {
	case CAP_TOOL_READ_FILE:
		snprintf(desc, sizeof(desc),
			 "Read a UTF-8 text file (at most %u bytes) from the public data or your workspace. Returns at most %u lines and %u characters per call; when truncated, the text ends with a note giving the offset to continue from. On a directory, lists up to %u entries.",
			 cfg->read_max_bytes, cfg->read_max_lines, cfg->read_max_chars, LIST_MAX);
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:o, s:o, s:{s:s, s:i, s:s}, s:{s:s, s:i, s:i, s:s}}, s:[s], s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "read_file", "title", "Read file", "description", desc,
			"inputSchema", "type", "object", "properties", "path", schema_path(), "root", root,
			"offset", "type", "integer", "minimum", 1, "description", "First line to return (1-based, default 1)",
			"limit", "type", "integer", "minimum", 1, "maximum", (int)cfg->read_max_lines,
			"description", "Most lines to return",
			"required", "path", "additionalProperties", 0,
			"annotations", "readOnlyHint", 1, "destructiveHint", 0, "idempotentHint", 1, "openWorldHint", 0);
	case CAP_TOOL_LIST_DIRECTORY:
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:o, s:o}, s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "list_directory", "title", "List directory",
			"description", "List a directory of the public data or your workspace (up to 500 entries; directories end with /).",
			"inputSchema", "type", "object", "properties", "path", schema_path(), "root", root,
			"additionalProperties", 0,
			"annotations", "readOnlyHint", 1, "destructiveHint", 0, "idempotentHint", 1, "openWorldHint", 0);
	case CAP_TOOL_WRITE_FILE:
		json_decref(root);
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:o, s:{s:s, s:s}}, s:[s, s], s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "write_file", "title", "Write file",
			"description", "Create or replace a UTF-8 text file (up to 60000 bytes) in your private workspace /work.",
			"inputSchema", "type", "object", "properties", "path", schema_path(),
			"content", "type", "string", "description", "The whole new content",
			"required", "path", "content", "additionalProperties", 0,
			"annotations", "readOnlyHint", 0, "destructiveHint", 1, "idempotentHint", 1, "openWorldHint", 0);
	case CAP_TOOL_RUN_COMMAND:
		json_decref(root);
		snprintf(desc, sizeof(desc),
			 "Run a shell command (sh -c) in your sandbox as an unprivileged user, with no network; cwd /work. Output is capped at 256 KiB; default timeout %u s.",
			 cfg->run_timeout_s);
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:i, s:i, s:s}}, s:[s], s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "run_command", "title", "Run command", "description", desc,
			"inputSchema", "type", "object", "properties", "command", "type", "string", "description", "The command line",
			"timeout", "type", "integer", "minimum", 1, "maximum", 3600, "description", "Seconds before the command is killed",
			"required", "command", "additionalProperties", 0,
			"annotations", "readOnlyHint", 0, "destructiveHint", 1, "idempotentHint", 0, "openWorldHint", 0);
	default:
		json_decref(root);
		return NULL;
	}
}

static void tools_list(struct mcp *m, json_t *id)
{
	json_t *a = json_array();
	for (int t = 0; t < CAP_TOOL_COUNT_; t++)
		if (m->cfg->tools[t])
			json_array_append_new(a, tool_def((enum cap_mcp_tool)t, m->cfg));
	result_to(m, id, json_pack("{s:o}", "tools", a));
}

/* A model-supplied path: relative to its root and free of "..". Returns a
 * tool error message, or NULL when fine. */
static const char *path_problem(const char *path)
{
	if (strlen(path) > 4096)
		return "is longer than 4096 bytes";
	if (path[0] == '/')
		return "is absolute; give paths relative to the root (public: /source, workspace: /work), e.g. docs/a.txt";
	if (!cap_proto_file_path_ok(path))
		return "climbs out of its root with '..'; paths must stay inside /source or /work";
	return NULL;
}

static void tools_call(struct ctl *c, struct mcp *m, json_t *id, json_t *params)
{
	const char *name = json_string_value(json_object_get(params, "name"));
	json_t *args = json_object_get(params, "arguments");
	enum cap_mcp_tool t;
	if (!name || cap_mcp_tool_parse(name, &t) < 0 || !m->cfg->tools[t])
		return error_to(m, id, RPC_PARAMS, "unknown tool '%s'; tools/list names the tools this server offers",
				name ? name : "(none)");
	if (args && !json_is_object(args))
		return error_to(m, id, RPC_PARAMS, "tools/call arguments must be an object");
	/* The peer: fixed by --peer, or set by the orchestrator in _meta;
	 * never taken from the arguments a model writes. */
	const char *peer = m->cfg->owned_peer;
	if (!peer)
		peer = json_string_value(json_object_get(json_object_get(params, "_meta"), PEER_META));
	if (!peer)
		return error_to(m, id, RPC_PARAMS, "no peer identity: start capsule mcp with --peer, or have the orchestrator set params._meta[\"%s\"]",
				PEER_META);
	if (!cap_controller_id_valid(peer))
		return error_to(m, id, RPC_PARAMS, "peer identity '%s' is not valid (1 to 64 of A-Z a-z 0-9 . _ @ + = : -)", peer);

	struct mcp_call *mc = xcalloc(1, sizeof(*mc));
	mc->tool = t;
	mc->offset = 1;
	mc->limit = m->cfg->read_max_lines;
	json_t *v;
	const char *path = json_string_value(json_object_get(args, "path"));
	const char *root = json_string_value(json_object_get(args, "root"));
	bool workspace = (root && strcmp(root, "workspace") == 0) || t == CAP_TOOL_WRITE_FILE;
	const char *problem = NULL;
	if (t != CAP_TOOL_RUN_COMMAND) {
		if (!path && t == CAP_TOOL_LIST_DIRECTORY)
			path = "";
		if (!path) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "%s needs a \"path\" string argument", name);
		}
		if (root && strcmp(root, "public") != 0 && strcmp(root, "workspace") != 0) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "root must be \"public\" or \"workspace\", not '%s'", root);
		}
		snprintf(mc->shown, sizeof(mc->shown), "%s/%s", workspace ? "/work" : "/source", path);
		problem = path_problem(path);
	}
	if ((v = json_object_get(args, "offset"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "offset must be an integer from 1");
		}
		mc->offset = (uint64_t)json_integer_value(v);
	}
	if ((v = json_object_get(args, "limit"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > (json_int_t)m->cfg->read_max_lines) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "limit must be an integer from 1 to %u", m->cfg->read_max_lines);
		}
		mc->limit = (uint32_t)json_integer_value(v);
	}
	if (problem) {
		tool_error(m, id, "path '%s' %s", path, problem);
		free(mc);
		return;
	}

	struct call *k;
	if (t == CAP_TOOL_RUN_COMMAND) {
		const char *cmd = json_string_value(json_object_get(args, "command"));
		json_t *to = json_object_get(args, "timeout");
		if (!cmd || (to && (!json_is_integer(to) || json_integer_value(to) < 1 || json_integer_value(to) > 3600))) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "run_command needs \"command\" (a string) and an optional \"timeout\" from 1 to 3600");
		}
		k = ctl_new_call(CALL_EXEC, &m->stdio, id);
		k->req.argv = xcalloc(4, sizeof(char *));
		k->req.argv[0] = xstrdup("/bin/sh");
		k->req.argv[1] = xstrdup("-c");
		k->req.argv[2] = xstrdup(cmd);
		k->req.argc = 3;
		k->req.env = xcalloc(1, sizeof(char *));
		k->req.timeout_ms = (uint32_t)(to ? json_integer_value(to) : m->cfg->run_timeout_s) * 1000;
		k->req.output_cap = 256 * 1024;
	} else if (t == CAP_TOOL_WRITE_FILE) {
		json_t *content = json_object_get(args, "content");
		if (!json_is_string(content)) {
			free(mc);
			return error_to(m, id, RPC_PARAMS, "write_file needs a \"content\" string");
		}
		if (json_string_length(content) > WRITE_MAX) {
			tool_error(m, id, "content is %zu bytes; write_file takes at most %u bytes per call",
				   json_string_length(content), WRITE_MAX);
			free(mc);
			return;
		}
		k = ctl_new_call(CALL_FILE, &m->stdio, id);
		ctl_file_call(k, CAP_FILE_WRITE, "/work", path, json_string_value(content), json_string_length(content));
	} else {
		k = ctl_new_call(CALL_FILE, &m->stdio, id);
		ctl_file_call(k, t == CAP_TOOL_LIST_DIRECTORY ? CAP_FILE_LIST : CAP_FILE_READ,
			      workspace ? "/work" : "/source", path, NULL, 0);
		k->file.limit = m->cfg->read_max_bytes;
	}
	k->reply = tool_reply;
	k->front = mc;
	ctl_enqueue(c, ctl_ident(c, m->cfg->owned_agent, peer), k);
}

static void initialize(struct mcp *m, json_t *id, json_t *params)
{
	const char *want = json_string_value(json_object_get(params, "protocolVersion"));
	const char *use = versions[0];
	for (size_t i = 0; want && i < CAP_ARRAY_SIZE(versions); i++)
		if (strcmp(want, versions[i]) == 0)
			use = versions[i];
	m->initialized = true;
	result_to(m, id, json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}",
		"protocolVersion", use, "capabilities", "tools", "listChanged", 0,
		"serverInfo", "name", "capsule", "title", "capsule sandboxes", "version", CAPSULE_VERSION,
		"instructions",
		"Tools run in your private sandbox (a microVM). Paths are relative: root \"public\" is the read-only public data (/source), root \"workspace\" your private /work."));
}

static void handle(struct ctl *c, struct mcp *m, const char *line, size_t len)
{
	json_error_t je;
	json_t *msg = json_loadb(line, len, 0, &je);
	if (!msg)
		return error_to(m, NULL, RPC_PARSE, "parse error: %s (column %d)", je.text, je.column);
	json_t *id = json_object_get(msg, "id");
	const char *method = json_string_value(json_object_get(msg, "method"));
	json_t *params = json_object_get(msg, "params");
	if (!json_is_object(msg) || !json_is_string(json_object_get(msg, "jsonrpc")) ||
	    strcmp(json_string_value(json_object_get(msg, "jsonrpc")), "2.0") != 0 ||
	    (id && !json_is_string(id) && !json_is_integer(id)) || (params && !json_is_object(params))) {
		error_to(m, json_is_object(msg) && (json_is_string(id) || json_is_integer(id)) ? id : NULL, RPC_INVALID,
			 "not a JSON-RPC 2.0 message (one object per line, jsonrpc \"2.0\")");
		json_decref(msg);
		return;
	}
	if (!method) {	/* a response to us: we send no requests; ignore */
		json_decref(msg);
		return;
	}
	if (!id) {	/* notifications */
		if (strcmp(method, "notifications/cancelled") == 0) {
			struct call *k = ctl_find_call(c, &m->stdio, json_object_get(params, "requestId"));
			if (k)
				ctl_cancel(c, k, false);
		}
		json_decref(msg);
		return;
	}
	if (strcmp(method, "initialize") == 0)
		initialize(m, id, params);
	else if (strcmp(method, "ping") == 0)
		result_to(m, id, json_object());
	else if (!m->initialized)
		error_to(m, id, RPC_INVALID, "the server is not initialized: send initialize first");
	else if (strcmp(method, "tools/list") == 0)
		tools_list(m, id);
	else if (strcmp(method, "tools/call") == 0)
		tools_call(c, m, id, params);
	else
		error_to(m, id, RPC_METHOD, "method '%s' not found", method);
	json_decref(msg);
}

static int mcp_setup(struct ctl *c, struct cap_err *err)
{
	(void)err;
	struct mcp *m = c->fe_state;
	cap_set_nonblock(0, 1);
	cap_set_nonblock(1, 1);
	m->stdio.fd = -1;
	return 0;
}

static int mcp_pollfds(struct ctl *c, struct pollfd *pfd, void **owner, int n, int max)
{
	struct mcp *m = c->fe_state;
	(void)max;
	owner[n] = NULL;
	pfd[n++] = (struct pollfd){ .fd = m->eof || c->shutting_down ? -1 : 0, .events = POLLIN };
	owner[n] = NULL;
	pfd[n++] = (struct pollfd){ .fd = cap_buf_used(&m->out) ? 1 : -1, .events = POLLOUT };
	return n;
}

struct line_ctx {
	struct ctl *c;
	struct mcp *m;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct line_ctx *lc = ud;
	handle(lc->c, lc->m, p, n);
}

static void on_too_long(void *ud)
{
	struct line_ctx *lc = ud;
	error_to(lc->m, NULL, RPC_INVALID, "message line over %u bytes; it was dropped", LINE_MAX_BYTES);
}

static void mcp_step(struct ctl *c, struct pollfd *pfd, void **owner, int from, int to)
{
	struct mcp *m = c->fe_state;
	(void)owner, (void)to;
	if (!pfd[from].revents)
		return;
	uint8_t *p = cap_buf_reserve(&m->in, 65536);
	ssize_t n = read(0, p, 65536);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		m->eof = true;
		c->frontend_done = true;
		return;
	}
	if (n < 0)
		return;
	cap_buf_commit(&m->in, (size_t)n);
	struct line_ctx lc = { c, m };
	cap_buf_lines(&m->in, LINE_MAX_BYTES, &m->discarding, on_line, on_too_long, &lc);
}

static void mcp_flush(struct ctl *c)
{
	struct mcp *m = c->fe_state;
	while (cap_buf_used(&m->out) > 0) {
		ssize_t n = write(1, cap_buf_head(&m->out), cap_buf_used(&m->out));
		if (n < 0) {
			if (errno == EPIPE) {	/* nobody reads: we are done */
				m->out.off = m->out.len = 0;
				c->frontend_done = true;
			}
			return;
		}
		cap_buf_consume(&m->out, (size_t)n);
	}
}

static void mcp_shutdown(struct ctl *c)
{
	(void)c;
}

static void mcp_teardown(struct ctl *c)
{
	cap_set_nonblock(1, 0);
	mcp_flush(c);
}

static const struct ctl_frontend mcp_frontend = {
	.name = "mcp",
	.setup = mcp_setup,
	.pollfds = mcp_pollfds,
	.step = mcp_step,
	.flush = mcp_flush,
	.shutdown = mcp_shutdown,
	.teardown = mcp_teardown,
};

int cap_mcp_run(struct cap_mcp_cfg *cfg, struct cap_err *err)
{
	if (!cfg->owned_agent || !cap_controller_id_valid(cfg->owned_agent))
		return cap_err_set(err, EINVAL, "an agent identity is required (--agent NAME or \"agent\" in the configuration file; 1 to 64 of A-Z a-z 0-9 . _ @ + = : -)");
	if (cfg->owned_peer && !cap_controller_id_valid(cfg->owned_peer))
		return cap_err_set(err, EINVAL, "--peer '%s' is not a valid identity part", cfg->owned_peer);
	struct mcp m = { .cfg = cfg };
	cap_buf_init(&m.in);
	cap_buf_init(&m.out);
	cfg->ctl.recover_agent = cfg->owned_agent;
	if (cfg->owned_image)
		cfg->ctl.image = cfg->owned_image;
	if (cfg->owned_source)
		cfg->ctl.source = cfg->owned_source;
	int r = ctl_run(&cfg->ctl, &mcp_frontend, &m, err);
	cap_buf_fini(&m.in);
	cap_buf_fini(&m.out);
	return r;
}
