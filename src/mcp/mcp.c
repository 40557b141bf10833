/* The MCP front end: JSON-RPC 2.0 on stdin/stdout, one message per line.
 * stdout carries protocol messages only; logs go to stderr. Tools run in
 * the sandbox of the identity (configured agent, peer from --peer or from
 * the orchestrator's _meta). One controller owns a home: when one runs
 * (capsule serve, or another capsule mcp), this is its client over its
 * socket; otherwise this process runs it, and listens on the home's
 * socket so that other front ends can join. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "policy.h"
#include "log.h"
#include "mcp.h"
#include "paths.h"
#include "serve.h"
#include "utf8.h"
#include "util.h"

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
	c->read_max_bytes = CAP_CTL_READ_MAX;
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
	free(c->owned_workspace);
	free(c->owned_private_import);
	free(c->owned_network);
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

/* "network": {"allow_egress": [RULE...], "allow_public": bool,
 * "allow_lan": bool, "allow_host": bool, "publish": ["[BIND:]H:G"...],
 * "auto_publish": bool, "secrets": ["NAME=SOURCE@HOST,..."...]}
 * (docs/network.md). */
static int cfg_network(struct cap_mcp_cfg *c, json_t *o, struct cap_err *err)
{
	static const char *const keys[] = { "allow_egress", "allow_public", "allow_lan", "allow_host",
					    "publish", "auto_publish", "secrets", NULL };
	if (!json_is_object(o))
		return cap_err_set(err, EINVAL, "\"network\" must be an object (docs/network.md)");
	int r = only_keys(o, "network", keys, err);
	struct cap_net_policy *p = xmalloc(sizeof(*p));
	cap_net_policy_init(p);
	for (size_t i = 0; r == 0 && keys[i]; i++) {
		json_t *v = json_object_get(o, keys[i]);
		bool list = strcmp(keys[i], "allow_egress") == 0 || strcmp(keys[i], "publish") == 0 ||
			    strcmp(keys[i], "secrets") == 0;
		char flag[32];
		/* The flag's name: "secrets" is a list of --secret. */
		snprintf(flag, sizeof(flag), "%s", strcmp(keys[i], "secrets") ? keys[i] : "secret");
		for (char *q = flag; *q; q++)
			if (*q == '_')
				*q = '-';
		if (!v)
			continue;
		if (list != json_is_array(v) || (!list && !json_is_boolean(v))) {
			r = cap_err_set(err, EINVAL, "network.%s must be %s", keys[i],
					list ? "a list of strings" : "true or false");
			break;
		}
		if (!list) {
			if (json_is_true(v))
				r = cap_net_policy_apply(p, flag, NULL, err);
			continue;
		}
		size_t k;
		json_t *e;
		json_array_foreach(v, k, e) {
			if (!json_is_string(e))
				r = cap_err_set(err, EINVAL, "network.%s[%zu] must be a string", keys[i], k);
			else if ((r = cap_net_policy_apply(p, flag, json_string_value(e), err)) < 0)
				cap_err_prefix(err, "network.%s[%zu]", keys[i], k);
			if (r < 0)
				break;
		}
	}
	if (r < 0) {
		free(p);
		return r;
	}
	free(c->owned_network);
	c->owned_network = p;
	return 0;
}

int cap_mcp_cfg_load(struct cap_mcp_cfg *c, const char *path, struct cap_err *err)
{
	json_error_t je;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return cap_err_set(err, EINVAL, "%s: %s (line %d)", path, je.text, je.line);
	static const char *const top[] = { "agent", "peer", "image", "source", "workspace", "private_import",
					   "tools", "limits", "lifecycle", "network", NULL };
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
	if (r == 0)
		r = cfg_str(j, "workspace", &c->owned_workspace, err);
	if (r == 0)
		r = cfg_str(j, "private_import", &c->owned_private_import, err);
	if (r == 0 && json_object_get(j, "network"))
		r = cfg_network(c, json_object_get(j, "network"), err);
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

struct mcp_call;

struct mcp {
	struct cap_mcp_cfg *cfg;
	struct cap_rpc_reader in;	/* stdin */
	struct cap_buf out;	/* stdout */
	bool initialized;
	bool eof;
	struct mcp_call *calls;	/* tool calls not answered yet */
	/* Local: this process runs the controller. */
	struct cap_ctl *ctl;
	struct cap_ctl_fe *fe;
	/* Remote: the home's controller runs in another process (capsule
	 * serve, or another capsule mcp); this one is its client. */
	int srv_fd;
	struct cap_ctl_holder holder;
	struct cap_rpc_reader srv_in;
	struct cap_buf srv_out;
	long long next_rid;
	bool srv_broken;	/* an answer was lost: give up on the server */
	bool said_preparing;	/* the preparation's line on stderr is out */
};

/* What a tool call needs to turn the controller's answer into a result. */
struct mcp_call {
	json_t *id;	/* the MCP request's */
	bool gone;	/* cancelled by the client: no answer */
	enum cap_mcp_tool tool;
	enum cap_ctl_kind kind;
	uint64_t offset;	/* first line or entry, 1-based */
	uint32_t limit;	/* lines or entries */
	uint32_t timeout_s;	/* run_command */
	char shown[4300];	/* the path as the model sees it, /source/... */
	struct cap_ctl_call *call;	/* local */
	long long rid;	/* remote: the request's id on the server's socket */
	json_t *progress_token;	/* params._meta.progressToken, or NULL */
	double progress;	/* the last progress sent (it must grow) */
	int64_t line_at;	/* when a build line was last sent (ms) */
	struct mcp_call *next;
};

static void result_to(struct mcp *m, json_t *id, json_t *result)
{
	cap_rpc_put_result(&m->out, id, result);
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
	cap_rpc_put_error(&m->out, id, code, msg, NULL);
}

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

static void call_free(struct mcp_call *mc)
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
	result_to(m, id, res);
}

static void tool_reply(struct mcp *m, struct mcp_call *mc, const struct cap_ctl_result *r)
{
	unlink_call(m, mc);
	if (mc->gone) {
		call_free(mc);
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
	call_free(mc);
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

/* --- reaching the controller ---------------------------------------------------- */

static void remote_send(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
			const struct cap_ctl_req *req);

/* Hand a tool call to the controller: this process's, or the home's
 * controller over its socket. mc is on m->calls until tool_reply. */
static void submit(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
		   const struct cap_ctl_req *req)
{
	mc->kind = req->kind;
	mc->next = m->calls;
	m->calls = mc;
	if (m->ctl)
		mc->call = cap_ctl_submit(m->ctl, m->fe, agent, peer, req, mc);
	else
		remote_send(m, mc, agent, peer, req);
}

static void cancel(struct mcp *m, json_t *request_id)
{
	for (struct mcp_call *mc = m->calls; mc; mc = mc->next) {
		if (mc->gone || !json_equal(mc->id, request_id))
			continue;
		mc->gone = true;
		if (m->ctl && mc->call)
			cap_ctl_cancel(m->ctl, mc->call);	/* may free mc */
		else if (!m->ctl)
			cap_rpc_put_request(&m->srv_out, m->next_rid++, "cancel",
					    json_pack("{s:I}", "id", (json_int_t)mc->rid));
		return;
	}
}

/* The preparation's progress for a tool call waiting for it (phase and
 * status by name: the controller's, here or over its socket). stderr
 * gets one line that the first call prepares; a call that sent
 * _meta.progressToken gets notifications/progress: progress grows with
 * each one (the MCP rule), done phases of total 4, a fraction while a
 * phase works; a build's lines at most one a second. */
static void progress_to(struct mcp *m, struct mcp_call *mc, const char *phase, const char *status,
			unsigned done, const char *message)
{
	if (!m->said_preparing) {
		cap_log(CAP_LOG_INFO, "the first tool call prepares the guest kernel, the initramfs, the image and the template before it runs (minutes when the kernel is built)");
		m->said_preparing = true;
	}
	if (mc->gone || !mc->progress_token || done > CAP_PREP_NPHASES)
		return;
	double v;
	int64_t now = cap_now_ms();
	if (strcmp(status, "ready") == 0) {
		v = done;
	} else if (strcmp(status, "building") == 0) {
		v = done + 0.1;
	} else if (strcmp(status, "line") == 0) {
		if (now - mc->line_at < 1000)
			return;
		/* Closer to the phase's end with each, never reaching it. */
		double base = mc->progress > done ? mc->progress : done;
		v = base + (done + 0.9 - base) / 8;
	} else {
		return;	/* failed: the result says it */
	}
	if (v <= mc->progress)
		return;
	if (strcmp(status, "line") == 0)
		mc->line_at = now;
	mc->progress = v;
	char text[1400];
	snprintf(text, sizeof(text), "preparing: %s %s: %s", phase, status, message ? message : "");
	cap_rpc_put_request(&m->out, -1, "notifications/progress",
			    json_pack("{s:O, s:f, s:i, s:o}", "progressToken", mc->progress_token, "progress", v,
				      "total", CAP_PREP_NPHASES, "message", cap_json_text(text)));
}

/* --- MCP --------------------------------------------------------------------------- */

static void tools_call(struct mcp *m, json_t *id, json_t *params)
{
	const char *name = json_string_value(json_object_get(params, "name"));
	json_t *args = json_object_get(params, "arguments");
	enum cap_mcp_tool t;
	if (!name || cap_mcp_tool_parse(name, &t) < 0 || !m->cfg->tools[t])
		return error_to(m, id, CAP_RPC_PARAMS, "unknown tool '%s'; tools/list names the tools this server offers",
				name ? name : "(none)");
	if (args && !json_is_object(args))
		return error_to(m, id, CAP_RPC_PARAMS, "tools/call arguments must be an object");
	/* The peer: fixed by --peer, or set by the orchestrator in _meta;
	 * never taken from the arguments a model writes. */
	const char *peer = m->cfg->owned_peer;
	if (!peer)
		peer = json_string_value(json_object_get(json_object_get(params, "_meta"), PEER_META));
	if (!peer)
		return error_to(m, id, CAP_RPC_PARAMS, "no peer identity: start capsule mcp with --peer, or have the orchestrator set params._meta[\"%s\"]",
				PEER_META);
	if (!cap_controller_id_valid(peer))
		return error_to(m, id, CAP_RPC_PARAMS, "peer identity '%s' is not valid (1 to 64 of A-Z a-z 0-9 . _ @ + = : -)", peer);

	struct mcp_call *mc = xcalloc(1, sizeof(*mc));
	mc->tool = t;
	mc->offset = 1;
	mc->limit = m->cfg->read_max_lines;
	json_t *v;
	const char *path = json_string_value(json_object_get(args, "path"));
	const char *root = json_string_value(json_object_get(args, "root"));
	if (t == CAP_TOOL_WRITE_FILE && root && strcmp(root, "workspace") != 0) {
		free(mc);
		return error_to(m, id, CAP_RPC_PARAMS, "write_file writes to your workspace (/work) only; root \"%s\" cannot be written", root);
	}
	bool workspace = (root && strcmp(root, "workspace") == 0) || t == CAP_TOOL_WRITE_FILE;
	const char *problem = NULL;
	if (t != CAP_TOOL_RUN_COMMAND) {
		if (!path && t == CAP_TOOL_LIST_DIRECTORY)
			path = "";
		if (!path) {
			free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "%s needs a \"path\" string argument", name);
		}
		if (root && strcmp(root, "public") != 0 && strcmp(root, "workspace") != 0) {
			free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "root must be \"public\" or \"workspace\", not '%s'", root);
		}
		snprintf(mc->shown, sizeof(mc->shown), "%s/%s", workspace ? "/work" : "/source", path);
		problem = path_problem(path);
	}
	if ((v = json_object_get(args, "offset"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1) {
			free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "offset must be an integer from 1");
		}
		mc->offset = (uint64_t)json_integer_value(v);
	}
	if ((v = json_object_get(args, "limit"))) {
		if (!json_is_integer(v) || json_integer_value(v) < 1 ||
		    json_integer_value(v) > (json_int_t)m->cfg->read_max_lines) {
			free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "limit must be an integer from 1 to %u", m->cfg->read_max_lines);
		}
		mc->limit = (uint32_t)json_integer_value(v);
	}
	bool no_sync = false;
	if ((v = json_object_get(args, "durable")) && t != CAP_TOOL_READ_FILE && t != CAP_TOOL_LIST_DIRECTORY) {
		if (!json_is_boolean(v)) {
			free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "durable must be true (the default) or false");
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
			call_free(mc);
			return error_to(m, id, CAP_RPC_PARAMS, "run_command needs \"command\" (a string of at most 1 MiB) and an optional \"timeout\" from 1 to 3600");
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
		submit(m, mc, m->cfg->owned_agent, peer, &req);
		return;
	}
	if (t == CAP_TOOL_WRITE_FILE) {
		json_t *content = json_object_get(args, "content");
		if (!json_is_string(content) || json_string_length(content) > WRITE_MAX) {
			if (!json_is_string(content))
				error_to(m, id, CAP_RPC_PARAMS, "write_file needs a \"content\" string");
			else
				tool_error(m, id, "content is %zu bytes; write_file takes at most %u bytes per call",
					   json_string_length(content), WRITE_MAX);
			call_free(mc);
			return;
		}
		req.op = CAP_FILE_WRITE;
		req.root = "/work";
		req.no_sync = no_sync;
		req.data = json_string_value(content);
		req.len = json_string_length(content);
	} else {
		req.op = t == CAP_TOOL_LIST_DIRECTORY ? CAP_FILE_LIST : CAP_FILE_READ;
		req.root = workspace ? "/work" : "/source";
		req.limit = m->cfg->read_max_bytes;
	}
	req.path = path;
	submit(m, mc, m->cfg->owned_agent, peer, &req);
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

static void handle(struct mcp *m, const char *line, size_t len)
{
	struct cap_rpc_msg msg;
	json_t *bad_id;
	char text[600];
	int code = cap_rpc_parse(line, len, &msg, &bad_id, text, sizeof(text));
	if (code != 0) {
		error_to(m, bad_id, code, "%s", text);
		cap_rpc_msg_fini(&msg);
		return;
	}
	const char *method = msg.method;
	json_t *id = msg.id;
	json_t *params = msg.params;
	if (!method) {	/* a response to us: we send no requests; ignore */
	} else if (!id) {	/* notifications */
		if (strcmp(method, "notifications/cancelled") == 0)
			cancel(m, json_object_get(params, "requestId"));
	} else if (strcmp(method, "initialize") == 0) {
		initialize(m, id, params);
	} else if (strcmp(method, "ping") == 0) {
		result_to(m, id, json_object());
	} else if (!m->initialized) {
		error_to(m, id, CAP_RPC_INVALID, "the server is not initialized: send initialize first");
	} else if (strcmp(method, "tools/list") == 0) {
		tools_list(m, id);
	} else if (strcmp(method, "tools/call") == 0) {
		tools_call(m, id, params);
	} else {
		error_to(m, id, CAP_RPC_METHOD, "method '%s' not found", method);
	}
	cap_rpc_msg_fini(&msg);
}

static void on_line(void *ud, const char *p, size_t n)
{
	handle(ud, p, n);
}

static void on_too_long(void *ud)
{
	error_to(ud, NULL, CAP_RPC_INVALID, "message line over %u bytes; it was dropped", CAP_RPC_LINE_MAX);
}

/* Read stdin; false at its end. */
static bool read_stdin(struct mcp *m)
{
	if (cap_rpc_read(&m->in, 0, on_line, on_too_long, m) == 0)
		m->eof = true;
	return !m->eof;
}

/* Write stdout; false when nobody reads it any more. */
static bool write_stdout(struct mcp *m)
{
	if (cap_rpc_flush(&m->out, 1) < 0) {
		m->out.off = m->out.len = 0;
		return false;
	}
	return true;
}

/* --- local: this process runs the controller ------------------------------------------ */

static void fe_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct mcp *m = fe;
	(void)c;
	if (!m->eof)
		cap_ctl_poll_add(p, 0, POLLIN, NULL);
	if (cap_buf_used(&m->out))
		cap_ctl_poll_add(p, 1, POLLOUT, NULL);
}

static void fe_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct mcp *m = fe;
	(void)tag;
	if (!(revents & (POLLIN | POLLHUP | POLLERR)) || m->eof)
		return;
	if (!read_stdin(m))
		cap_ctl_shutdown(c, "the MCP client closed stdin");
}

static void fe_flush(void *fe, struct cap_ctl *c)
{
	struct mcp *m = fe;
	if (!write_stdout(m) && !m->eof) {
		m->eof = true;
		cap_ctl_shutdown(c, "the MCP client stopped reading");
	}
}

static void fe_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	(void)c;
	tool_reply(fe, tag, r);
}

static void fe_progress(void *fe, struct cap_ctl *c, void *tag, const struct cap_prep_event *ev)
{
	(void)c;
	progress_to(fe, tag, cap_prep_phase_name(ev->phase), cap_prep_status_name(ev->status), ev->done,
		    ev->message);
}

static const struct cap_ctl_frontend_ops mcp_ops = {
	.name = "mcp",
	.pollfds = fe_pollfds,
	.ready = fe_ready,
	.flush = fe_flush,
	.done = fe_done,
	.progress = fe_progress,
};

static int run_local(struct mcp *m, struct cap_err *err)
{
	struct cap_rpc_server *srv = NULL;
	_cleanup_free_ char *home = cap_home_dir();
	_cleanup_free_ char *sock = xasprintf("%s/serve.sock", home);
	struct cap_controller_cfg *cfg = &m->cfg->ctl;
	cfg->frontend = "mcp";
	cfg->socket_path = NULL;
	cap_ctl_check_image(cfg);
	int r = cap_ctl_new(cfg, &m->ctl, err);
	if (r < 0)
		return r;
	m->fe = cap_ctl_add_frontend(m->ctl, &mcp_ops, m);
	/* Other front ends (another capsule mcp, the CLI) reach this
	 * controller through the home's socket. */
	struct cap_err serr = { 0 };
	if (strlen(sock) >= 100)
		cap_log(CAP_LOG_WARN, "other front ends cannot join this controller: %s is too long for a socket", sock);
	else if (cap_rpc_server_new(m->ctl, sock, &srv, &serr) < 0 || cap_ctl_set_socket(m->ctl, sock, &serr) < 0)
		cap_log(CAP_LOG_WARN, "other front ends cannot join this controller: %s", serr.msg);
	r = cap_ctl_run(m->ctl, err);
	cap_ctl_free(m->ctl);
	m->ctl = NULL;
	cap_rpc_server_free(srv);
	return r;
}

/* --- remote: the home's controller runs elsewhere ---------------------------------------- */

static void remote_send(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
			const struct cap_ctl_req *req)
{
	const char *method;
	json_t *params = cap_rpc_request_params(agent, peer, req, &method);
	mc->rid = m->next_rid++;
	cap_rpc_put_request(&m->srv_out, mc->rid, method, params);
}

static void on_answer(void *ud, const char *p, size_t n)
{
	struct mcp *m = ud;
	struct cap_rpc_msg msg;
	json_t *bad;
	char text[600];
	int code = cap_rpc_parse(p, n, &msg, &bad, text, sizeof(text));
	if (code == 0 && !msg.method && json_is_null(msg.id)) {
		/* The server refused a line of ours it could not read: which
		 * call it was is unknown, so none can be trusted to end. */
		cap_log(CAP_LOG_WARN, "the controller refused a request: %s",
			json_string_value(json_object_get(msg.error, "message")));
		m->srv_broken = true;
	}
	if (code == 0 && msg.method && strcmp(msg.method, "progress") == 0) {
		/* The controller's preparation, for one of our calls. */
		json_t *req = json_object_get(msg.params, "request");
		const char *ph = json_string_value(json_object_get(msg.params, "phase"));
		const char *st = json_string_value(json_object_get(msg.params, "status"));
		for (struct mcp_call *mc = m->calls; json_is_integer(req) && ph && st && mc; mc = mc->next)
			if (mc->rid == json_integer_value(req)) {
				progress_to(m, mc, ph, st, (unsigned)json_integer_value(json_object_get(msg.params, "done")),
					    json_string_value(json_object_get(msg.params, "message")));
				break;
			}
	}
	if (code != 0 || msg.method || !json_is_integer(msg.id)) {
		cap_rpc_msg_fini(&msg);
		return;	/* answers to cancels, or nothing of ours */
	}
	long long rid = json_integer_value(msg.id);
	for (struct mcp_call *mc = m->calls; mc; mc = mc->next) {
		if (mc->rid != rid)
			continue;
		struct cap_ctl_result r;
		void *owned;
		cap_rpc_result_parse(msg.owned_root, mc->kind, &r, &owned);
		tool_reply(m, mc, &r);
		free(owned);
		break;
	}
	cap_rpc_msg_fini(&msg);
}

static void on_answer_too_long(void *ud)
{
	struct mcp *m = ud;
	cap_log(CAP_LOG_WARN, "the controller sent an answer over %zu bytes", m->srv_in.max);
	m->srv_broken = true;	/* an answer lost: its call would never end */
}

static int connect_to(const char *path, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "the controller's socket path %s is too long", path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return cap_err_set(err, e, "cannot connect to the controller's socket %s: %s", path, strerror(e));
	}
	return fd;
}

/* The server decides image, public data and lifecycle: refuse settings
 * that it would silently override. */
/* Whether the server's "network" words (info) are this policy's; no
 * policy asked for here takes the server's, as --source does. */
static bool same_network(const struct cap_net_policy *p, json_t *theirs)
{
	char **words = NULL;
	size_t n = 0;
	if (!p || !p->enabled)
		return true;
	cap_net_policy_words(p, &words, &n);
	bool same = json_is_array(theirs) && json_array_size(theirs) == n;
	for (size_t i = 0; i < n; i++) {
		const char *s = json_string_value(json_array_get(theirs, i));
		same = same && s && strcmp(s, words[i]) == 0;
		free(words[i]);
	}
	free(words);
	return same || !json_is_array(theirs);	/* an older server says nothing */
}

/* A directory setting of the server's (info), "none" when it has none. */
static const char *setting(json_t *info, const char *key)
{
	const char *v = json_string_value(json_object_get(info, key));
	return v ? v : "nothing";
}

/* Whether the server has this directory setting (ours resolved by
 * cap_mcp_run); none asked for here takes the server's. */
static bool same_dir(const char *ours, json_t *info, const char *key)
{
	const char *theirs = json_string_value(json_object_get(info, key));
	return !ours || (theirs && strcmp(ours, theirs) == 0);
}

static int check_server(struct mcp *m, struct cap_err *err)
{
	json_t *info = NULL;
	int r = cap_rpc_call(m->holder.socket, "info", NULL, 10000, &info, err);
	if (r < 0)
		return r;
	const char *source = json_string_value(json_object_get(info, "source"));
	const char *image = json_string_value(json_object_get(info, "image"));
	/* Its sandboxes are ours: run_command says what they have. */
	m->cfg->has_network = json_array_size(json_object_get(info, "network")) > 0;
	char want[4096] = "";
	if (m->cfg->owned_source && !realpath(m->cfg->owned_source, want))
		snprintf(want, sizeof(want), "%s", m->cfg->owned_source);
	if (m->cfg->owned_source && (!source || strcmp(source, want) != 0))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and serves %s%s; capsule mcp --source %s cannot change that. Start it without --source, give that server --source, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, source ? "the public data " : "no public data",
				source ? source : "", m->cfg->owned_source);
	else if (!same_network(m->cfg->owned_network, json_object_get(info, "network")))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME with another network policy than this capsule mcp's; its sandboxes follow the server's. Give both the same network flags, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid);
	else if (!same_dir(m->cfg->owned_workspace, info, "workspace"))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and copies %s to new sandboxes' /workspace; capsule mcp's \"workspace\" %s cannot change that. Give both the same, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, setting(info, "workspace"), m->cfg->owned_workspace);
	else if (!same_dir(m->cfg->owned_private_import, info, "private_import"))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME with private import from %s; capsule mcp's \"private_import\" %s cannot change that. Give both the same, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, setting(info, "private_import"),
				m->cfg->owned_private_import);
	else if (m->cfg->owned_image && image && strcmp(image, m->cfg->owned_image) != 0)
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and makes sandboxes from image %s; capsule mcp --image %s cannot change that",
				m->holder.frontend, (int)m->holder.pid, image, m->cfg->owned_image);
	json_decref(info);
	return r;
}

static int run_remote(struct mcp *m, struct cap_err *err)
{
	int r = check_server(m, err);
	if (r < 0)
		return r;
	if ((m->srv_fd = connect_to(m->holder.socket, err)) < 0)
		return m->srv_fd;
	cap_set_nonblock(m->srv_fd, 1);
	cap_log(CAP_LOG_INFO, "using the controller of capsule %s (pid %d) at %s", m->holder.frontend,
		(int)m->holder.pid, m->holder.socket);
	static const int stops[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t sigs;
	int sfd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);
	bool lost = false;
	while (!m->eof && !lost) {
		struct pollfd p[4] = {
			{ .fd = 0, .events = POLLIN },
			{ .fd = m->srv_fd, .events = (short)(POLLIN | (cap_buf_used(&m->srv_out) ? POLLOUT : 0)) },
			{ .fd = cap_buf_used(&m->out) ? 1 : -1, .events = POLLOUT },
			{ .fd = sfd, .events = POLLIN },
		};
		if (poll(p, 4, -1) < 0 && errno != EINTR)
			break;
		if (p[3].revents)
			break;
		if (p[0].revents)
			read_stdin(m);
		if (p[1].revents & (POLLIN | POLLHUP | POLLERR))
			lost = cap_rpc_read(&m->srv_in, m->srv_fd, on_answer, on_answer_too_long, m) == 0 ||
			       m->srv_broken;
		if (cap_rpc_flush(&m->srv_out, m->srv_fd) < 0)
			lost = true;
		if (!write_stdout(m))
			break;
	}
	if (lost) {
		cap_log(CAP_LOG_WARN, "the controller (capsule %s, pid %d) went away", m->holder.frontend,
			(int)m->holder.pid);
		struct cap_ctl_result res = { .code = CAP_CTL_ESANDBOX,
					      .msg = "the capsule controller this server used went away; restart capsule mcp" };
		while (m->calls)
			tool_reply(m, m->calls, &res);
		cap_set_nonblock(1, 0);
		write_stdout(m);
		r = cap_err_set(err, EPIPE, "the controller (capsule %s, pid %d) went away", m->holder.frontend,
				(int)m->holder.pid);
	}
	/* Calls still running stay with the server: their sandboxes are its. */
	if (sfd >= 0)
		close(sfd);
	return r;
}

int cap_mcp_run(struct cap_mcp_cfg *cfg, struct cap_err *err)
{
	if (!cfg->owned_agent || !cap_controller_id_valid(cfg->owned_agent))
		return cap_err_set(err, EINVAL, "an agent identity is required (--agent NAME or \"agent\" in the configuration file; 1 to 64 of A-Z a-z 0-9 . _ @ + = : -)");
	if (cfg->owned_peer && !cap_controller_id_valid(cfg->owned_peer))
		return cap_err_set(err, EINVAL, "--peer '%s' is not a valid identity part", cfg->owned_peer);
	/* Directory settings, resolved: compared with a running server's,
	 * and recorded in each new sandbox. */
	char **dirs[] = { &cfg->owned_workspace, &cfg->owned_private_import };
	const char *names[] = { "workspace", "private_import" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(dirs); i++) {
		char *real;
		int r;
		if (!*dirs[i])
			continue;
		if ((r = cap_ctl_resolve_dir(names[i], *dirs[i], &real, err)) < 0)
			return r;
		free(*dirs[i]);
		*dirs[i] = real;
	}
	struct mcp m = { .cfg = cfg, .srv_fd = -1, .next_rid = 1 };
	cap_rpc_reader_init(&m.in);
	cap_rpc_reader_init(&m.srv_in);
	/* The server's answers: a 64 MiB read, every byte escaped (6x). */
	m.srv_in.max = (size_t)6 * (64u << 20) + (1u << 20);
	cap_buf_init(&m.out);
	cap_buf_init(&m.srv_out);
	if (cfg->owned_image)
		cfg->ctl.image = cfg->owned_image;
	if (cfg->owned_source)
		cfg->ctl.source = cfg->owned_source;
	cfg->ctl.workspace = cfg->owned_workspace;
	cfg->ctl.private_import = cfg->owned_private_import;
	if (cfg->owned_network && cfg->owned_network->enabled)
		cfg->ctl.network = cfg->owned_network;
	cfg->has_network = cfg->ctl.network != NULL;
	cap_set_nonblock(0, 1);
	cap_set_nonblock(1, 1);
	/* One controller per home: join the one that runs, else be it. */
	int r = -EBUSY;
	for (int tries = 0; tries < 3 && r == -EBUSY; tries++) {
		int held = cap_ctl_holder(&m.holder);
		if (held < 0) {
			r = cap_err_set(err, -held, "cannot read the home's controller lock: %s", strerror(-held));
		} else if (held == 1 && m.holder.socket[0]) {
			r = run_remote(&m, err);
		} else if (held == 1) {
			r = cap_err_set(err, EBUSY, "capsule %s (pid %d) owns this CAPSULE_HOME and listens on no socket; stop it or use another CAPSULE_HOME",
					m.holder.frontend, (int)m.holder.pid);
		} else {
			r = run_local(&m, err);	/* -EBUSY: lost a race to another controller */
		}
	}
	cap_set_nonblock(1, 0);
	write_stdout(&m);
	while (m.calls) {
		struct mcp_call *mc = m.calls;
		m.calls = mc->next;
		call_free(mc);
	}
	if (m.srv_fd >= 0)
		close(m.srv_fd);
	cap_rpc_reader_fini(&m.in);
	cap_rpc_reader_fini(&m.srv_in);
	cap_buf_fini(&m.out);
	cap_buf_fini(&m.srv_out);
	return r;
}
