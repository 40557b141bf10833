/* capsule mcp's tools: their definitions (tools/list), a tools/call
 * checked and made a request for the controller, and its result made
 * what the model reads (windows of lines, listings). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "jsonrpc.h"
#include "layout.h"
#include "mcp-server.h"
#include "mcp.h"
#include "utf8.h"
#include "util.h"

#define WRITE_MAX 60000	/* one FILE frame */
#define PEER_META "capsule/peer"

static json_t *text_result(const char *text, bool is_error)
{
	return json_pack("{s:[{s:s, s:o}], s:b}", "content", "type", "text", "text", cap_json_text(text),
			 "isError", is_error);
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
	mcp_result(m, id, text_result(msg, true));
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

static json_t *listing(const struct mcp_call *mc, const struct cap_ctl_entry *v, size_t total,
		       bool more)
{
	struct cap_buf b;
	cap_buf_init(&b);
	char line[700];
	int k = snprintf(line, sizeof(line), "%s is a directory:\n", mc->shown);
	cap_buf_append(&b, line, (size_t)k);
	size_t shown = 0;
	for (size_t i = mc->offset ? mc->offset - 1 : 0; i < total && shown < mc->limit; i++, shown++) {
		const struct cap_ctl_entry *e = &v[i];
		if (e->type == 'd')
			k = snprintf(line, sizeof(line), "%s/\n", e->name);
		else if (e->type == 'f')
			k = snprintf(line, sizeof(line), "%s\t%llu bytes\n", e->name, (unsigned long long)e->size);
		else
			k = snprintf(line, sizeof(line), "%s\t(%s)\n", e->name, e->type == 'l' ? "symlink" : "other");
		cap_buf_append(&b, line, (size_t)CAP_MIN(k, (int)sizeof(line) - 1));
	}
	if (more || (mc->offset ? mc->offset - 1 : 0) + shown < total) {
		k = snprintf(line, sizeof(line), "[capsule: truncated: %zu entries shown%s; the listing stops at %u entries]\n",
			     shown, more ? ", the directory has more" : "", CAP_CTL_LIST_MAX);
		cap_buf_append(&b, line, (size_t)k);
	}
	json_t *j = cap_json_textn(cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	return j;
}

void mcp_call_free(struct mcp_call *mc)
{
	json_decref(mc->id);
	json_decref(mc->progress_token);
	free(mc);
}

static void unlink_call(struct mcp *m, struct mcp_call *mc)
{
	for (struct mcp_call **p = &m->calls; *p; p = &(*p)->next)
		if (*p == mc) {
			*p = mc->next;
			return;
		}
}

/* The controller answered a tool call: make it an MCP tool result. */
/* A tool result (stolen), with the private import that ran before the
 * call when there was one: a line for the model in the content and the
 * whole outcome in _meta["capsule/import"] for the orchestrator. */
static void reply_to(struct mcp *m, json_t *id, json_t *res, const struct cap_ctl_import *imp,
		     unsigned prepared)
{
	if (prepared) {
		/* The first call prepared (docs/mcp.md): said to the
		 * orchestrator in _meta only; the content stays the tool's
		 * own (a file read is the file). */
		json_t *a = json_array();
		for (unsigned ph = 0; ph < CAP_PREP_NPHASES; ph++)
			if (prepared & (1u << ph))
				json_array_append_new(a, json_string(cap_prep_phase_name((enum cap_prep_phase)ph)));
		json_object_set_new(res, "_meta", json_pack("{s:o}", "capsule/prepared", a));
	}
	if (imp) {
		const struct cap_ctl_xfer_out *o = &imp->out;
		char line[600];
		if (imp->r < 0)
			snprintf(line, sizeof(line), "[capsule: the private import of your files into /work failed: %s; it is tried again when your sandbox next starts]",
				 imp->msg ? imp->msg : "unknown error");
		else
			snprintf(line, sizeof(line), "[capsule: your private files were imported into /work: %llu files, %llu bytes; %zu existing path%s kept as they were, %zu refused (links and special files)%s]",
				 (unsigned long long)o->files, (unsigned long long)o->bytes, o->nconflicts,
				 o->nconflicts == 1 ? "" : "s", o->nrefused,
				 o->nconflicts || o->nrefused ? "; the details are in the result's _meta" : "");
		json_array_append_new(json_object_get(res, "content"),
				      json_pack("{s:s, s:o}", "type", "text", "text", cap_json_text(line)));
		json_t *meta = json_object_get(res, "_meta");
		if (!meta)
			json_object_set_new(res, "_meta", meta = json_object());
		json_object_set_new(meta, "capsule/import", cap_rpc_import_json(imp));
	}
	mcp_result(m, id, res);
}

void mcp_tool_reply(struct mcp *m, struct mcp_call *mc, const struct cap_ctl_result *r)
{
	unlink_call(m, mc);
	if (mc->gone) {
		mcp_call_free(mc);
		return;
	}
	json_t *id = mc->id;
	if (r->code != CAP_CTL_OK) {
		char msg[1200];
		snprintf(msg, sizeof(msg), "%s%s", r->msg ? r->msg : "the tool failed",
			 r->code == CAP_CTL_ECAPACITY ? " (every sandbox is busy; try again shortly)" : "");
		reply_to(m, id, text_result(msg, true), r->import, r->prepared);
	} else if (mc->tool == CAP_TOOL_RUN_COMMAND) {
		const struct cap_exit *ex = &r->exit;
		bool timed = (ex->flags & CAP_EXIT_TIMED_OUT) != 0;
		bool code = ex->kind != CAP_EXIT_SIGNAL;
		int status = code ? cap_exit_status(ex) : 0;
		char head[200];
		if (timed)
			snprintf(head, sizeof(head), "timed out after %u s; the command was killed\n", mc->timeout_s);
		else if (code)
			snprintf(head, sizeof(head), "exit code %d\n", status);
		else
			snprintf(head, sizeof(head), "killed by signal %d\n", (int)ex->value);
		json_t *out = cap_json_textn(r->out, r->out_len), *err = cap_json_textn(r->err, r->err_len);
		char *text = xasprintf("%s--- stdout ---\n%s--- stderr ---\n%s%s%s%s%s", head, json_string_value(out),
				       json_string_value(err),
				       (ex->flags & CAP_EXIT_TRUNCATED) ? "[capsule: output truncated at 256 KiB]\n" : "",
				       r->note ? "[capsule: " : "", r->note ? r->note : "", r->note ? "]\n" : "");
		json_t *res = text_result(text, timed || !code || status != 0);
		free(text);
		json_object_set_new(res, "structuredContent", json_pack("{s:o, s:o, s:b, s:o, s:o, s:b}",
			"exit_code", code ? json_integer(status) : json_null(),
			"signal", code ? json_null() : json_integer(ex->value), "timed_out", timed,
			"stdout", out, "stderr", err, "durable", (ex->flags & CAP_EXIT_DURABLE) != 0));
		reply_to(m, id, res, r->import, r->prepared);
	} else if (mc->tool == CAP_TOOL_WRITE_FILE) {
		char text[4500];
		snprintf(text, sizeof(text), "wrote %llu bytes to %s", (unsigned long long)r->written, mc->shown);
		json_t *res = text_result(text, false);
		json_object_set_new(res, "structuredContent",
				    json_pack("{s:I, s:b}", "bytes", (json_int_t)r->written, "durable",
					      (r->exit.flags & CAP_EXIT_DURABLE) != 0));
		reply_to(m, id, res, r->import, r->prepared);
	} else {
		bool is_error = false;
		json_t *text;
		if (r->is_dir)
			text = listing(mc, r->entries, r->nentries, r->entries_truncated);
		else if (mc->tool == CAP_TOOL_LIST_DIRECTORY)
			text = json_string("not a directory"), is_error = true;
		else if (!cap_utf8_valid((const char *)r->content, r->content_len))
			text = json_string("the file is not UTF-8 text (a binary file); read_file reads text only"), is_error = true;
		else
			text = window(m, mc, (const char *)r->content, r->content_len, &is_error);
		reply_to(m, id, json_pack("{s:[{s:s, s:o}], s:b}", "content", "type", "text", "text", text,
					  "isError", is_error), r->import, r->prepared);
	}
	mcp_call_free(mc);
}

static json_t *schema_path(void)
{
	return json_pack("{s:s, s:s}", "type", "string", "description",
			 "Path relative to the root, without '..' (for example docs/readme.md)");
}

static json_t *schema_durable(void)
{
	return json_pack("{s:s, s:b, s:s}", "type", "boolean", "default", 1, "description",
			 "Default true: the call returns once what it wrote is on the host's disk. false returns sooner, but those writes may be lost if the sandbox's VM dies");
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
			 cfg->read_max_bytes, cfg->read_max_lines, cfg->read_max_chars, CAP_CTL_LIST_MAX);
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
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:o, s:{s:s, s:s}, s:o}, s:[s, s], s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "write_file", "title", "Write file",
			"description", "Create or replace a UTF-8 text file (up to 60000 bytes) in your private workspace /work.",
			"inputSchema", "type", "object", "properties", "path", schema_path(),
			"content", "type", "string", "description", "The whole new content",
			"durable", schema_durable(),
			"required", "path", "content", "additionalProperties", 0,
			"annotations", "readOnlyHint", 0, "destructiveHint", 1, "idempotentHint", 1, "openWorldHint", 0);
	case CAP_TOOL_RUN_COMMAND:
		json_decref(root);
		snprintf(desc, sizeof(desc),
			 "Run a shell command (sh -c) in your sandbox as an unprivileged user, %s; cwd /work. Output is capped at 256 KiB; default timeout %u s.",
			 cfg->has_network ? "with network access limited by a policy (refused connections fail)" : "with no network",
			 cfg->run_timeout_s);
		return json_pack("{s:s, s:s, s:s, s:{s:s, s:{s:{s:s, s:s}, s:{s:s, s:i, s:i, s:s}, s:o}, s:[s], s:b}, s:{s:b, s:b, s:b, s:b}}",
			"name", "run_command", "title", "Run command", "description", desc,
			"inputSchema", "type", "object", "properties", "command", "type", "string", "description", "The command line",
			"timeout", "type", "integer", "minimum", 1, "maximum", 3600, "description", "Seconds before the command is killed",
			"durable", schema_durable(),
			"required", "command", "additionalProperties", 0,
			"annotations", "readOnlyHint", 0, "destructiveHint", 1, "idempotentHint", 0, "openWorldHint", 0);
	default:
		json_decref(root);
		return NULL;
	}
}

void mcp_tools_list(struct mcp *m, json_t *id)
{
	json_t *a = json_array();
	for (int t = 0; t < CAP_TOOL_COUNT_; t++)
		if (m->cfg->tools[t])
			json_array_append_new(a, tool_def((enum cap_mcp_tool)t, m->cfg));
	mcp_result(m, id, json_pack("{s:o}", "tools", a));
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

void mcp_tools_call(struct mcp *m, json_t *id, json_t *params)
{
	const char *name = json_string_value(json_object_get(params, "name"));
	json_t *args = json_object_get(params, "arguments");
	enum cap_mcp_tool t;
	if (!name || cap_mcp_tool_parse(name, &t) < 0 || !m->cfg->tools[t])
		return mcp_error(m, id, CAP_RPC_PARAMS, "unknown tool '%s'; tools/list names the tools this server offers",
				name ? name : "(none)");
	if (args && !json_is_object(args))
		return mcp_error(m, id, CAP_RPC_PARAMS, "tools/call arguments must be an object");
	/* The peer: fixed by --peer, or set by the orchestrator in _meta;
	 * never taken from the arguments a model writes. */
	const char *peer = m->cfg->owned_peer;
	if (!peer)
		peer = json_string_value(json_object_get(json_object_get(params, "_meta"), PEER_META));
	if (!peer)
		return mcp_error(m, id, CAP_RPC_PARAMS, "no peer identity: start capsule mcp with --peer, or have the orchestrator set params._meta[\"%s\"]",
				PEER_META);
	if (!cap_controller_id_valid(peer))
		return mcp_error(m, id, CAP_RPC_PARAMS, "peer identity '%s' is not valid (1 to 64 of A-Z a-z 0-9 . _ @ + = : -)", peer);

	struct mcp_call *mc = xcalloc(1, sizeof(*mc));
	mc->tool = t;
	mc->offset = 1;
	mc->limit = m->cfg->read_max_lines;
	json_t *v;
	const char *path = json_string_value(json_object_get(args, "path"));
	const char *root = json_string_value(json_object_get(args, "root"));
	if (t == CAP_TOOL_WRITE_FILE && root && strcmp(root, "workspace") != 0) {
		free(mc);
		return mcp_error(m, id, CAP_RPC_PARAMS, "write_file writes to your workspace (/work) only; root \"%s\" cannot be written", root);
	}
	bool workspace = (root && strcmp(root, "workspace") == 0) || t == CAP_TOOL_WRITE_FILE;
	const char *problem = NULL;
	if (t != CAP_TOOL_RUN_COMMAND) {
		if (!path && t == CAP_TOOL_LIST_DIRECTORY)
			path = "";
		if (!path) {
			free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "%s needs a \"path\" string argument", name);
		}
		if (root && strcmp(root, "public") != 0 && strcmp(root, "workspace") != 0) {
			free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "root must be \"public\" or \"workspace\", not '%s'", root);
		}
		snprintf(mc->shown, sizeof(mc->shown), "%s/%s", workspace ? CAP_GUEST_WORK : CAP_GUEST_SOURCE, path);
		problem = path_problem(path);
	}
	if ((v = json_object_get(args, "offset"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1) {
			free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "offset must be an integer from 1");
		}
		mc->offset = (uint64_t)json_integer_value(v);
	}
	if ((v = json_object_get(args, "limit"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > (json_int_t)m->cfg->read_max_lines) {
			free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "limit must be an integer from 1 to %u", m->cfg->read_max_lines);
		}
		mc->limit = (uint32_t)json_integer_value(v);
	}
	bool no_sync = false;
	if ((v = json_object_get(args, "durable")) && t != CAP_TOOL_READ_FILE && t != CAP_TOOL_LIST_DIRECTORY) {
		if (!json_is_boolean(v)) {
			free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "durable must be true (the default) or false");
		}
		no_sync = json_is_false(v);
	}
	if (problem) {
		tool_error(m, id, "path '%s' %s", path, problem);
		free(mc);
		return;
	}
	mc->id = json_incref(id);
	json_t *token = json_object_get(json_object_get(params, "_meta"), "progressToken");
	if (json_is_string(token) || json_is_integer(token))
		mc->progress_token = json_incref(token);

	struct cap_ctl_req req = { .kind = CAP_CTL_FILE };
	if (t == CAP_TOOL_RUN_COMMAND) {
		const char *cmd = json_string_value(json_object_get(args, "command"));
		json_t *to = json_object_get(args, "timeout");
		if (!cmd || strlen(cmd) > (1u << 20) ||
		    (to && (!json_is_integer(to) || json_integer_value(to) < 1 || json_integer_value(to) > 3600))) {
			mcp_call_free(mc);
			return mcp_error(m, id, CAP_RPC_PARAMS, "run_command needs \"command\" (a string of at most 1 MiB) and an optional \"timeout\" from 1 to 3600");
		}
		mc->timeout_s = (uint32_t)(to ? json_integer_value(to) : m->cfg->run_timeout_s);
		const char *argv[] = { "/bin/sh", "-c", cmd, NULL };
		char *env[] = { NULL };
		struct cap_exec_req x = {
			.argv = (char **)argv, .argc = 3, .env = env,
			.timeout_ms = mc->timeout_s * 1000,
			.output_cap = 256 * 1024,
			.flags = no_sync ? CAP_EXEC_NO_SYNC : 0,
		};
		req = (struct cap_ctl_req){ .kind = CAP_CTL_EXEC, .exec = &x };
		mcp_submit(m, mc, m->cfg->owned_agent, peer, &req);
		return;
	}
	if (t == CAP_TOOL_WRITE_FILE) {
		json_t *content = json_object_get(args, "content");
		if (!json_is_string(content) || json_string_length(content) > WRITE_MAX) {
			if (!json_is_string(content))
				mcp_error(m, id, CAP_RPC_PARAMS, "write_file needs a \"content\" string");
			else
				tool_error(m, id, "content is %zu bytes; write_file takes at most %u bytes per call",
					   json_string_length(content), WRITE_MAX);
			mcp_call_free(mc);
			return;
		}
		req.op = CAP_FILE_WRITE;
		req.root = CAP_GUEST_WORK;
		req.no_sync = no_sync;
		req.data = json_string_value(content);
		req.len = json_string_length(content);
	} else {
		req.op = t == CAP_TOOL_LIST_DIRECTORY ? CAP_FILE_LIST : CAP_FILE_READ;
		req.root = workspace ? CAP_GUEST_WORK : CAP_GUEST_SOURCE;
		req.limit = m->cfg->read_max_bytes;
	}
	req.path = path;
	mcp_submit(m, mc, m->cfg->owned_agent, peer, &req);
}
