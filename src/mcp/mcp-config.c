/* capsule mcp's configuration: its defaults, the tools by name, and the
 * JSON file (docs/mcp.md). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <jansson.h>
#include <string.h>

#include "mcp.h"
#include "named.h"	/* the size bounds */
#include "policy.h"
#include "util.h"

static const char *const tool_names[CAP_TOOL_COUNT_] = {
	[CAP_TOOL_READ_FILE] = "read_file",
	[CAP_TOOL_LIST_DIRECTORY] = "list_directory",
	[CAP_TOOL_WRITE_FILE] = "write_file",
	[CAP_TOOL_RUN_COMMAND] = "run_command",
};

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
					   "tools", "limits", "lifecycle", "network", "size", "root", NULL };
	static const char *const lim[] = { "read_max_bytes", "read_max_chars", "read_max_lines", "run_timeout_s", NULL };
	static const char *const life[] = { "idle_pause_s", "idle_stop_s", "capacity", "warm_pool", NULL };
	int r = 0;
	uint64_t v;
	json_t *tools = json_object_get(j, "tools");
	json_t *limits = json_object_get(j, "limits");
	json_t *lc = json_object_get(j, "lifecycle");
	json_t *size = json_object_get(j, "size");
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
	json_t *root = json_object_get(j, "root");
	if (r == 0 && root && !json_is_boolean(root))
		r = cap_err_set(err, EINVAL, "\"root\" must be true or false (true: commands run as root in the guest)");
	if (r == 0 && root)
		c->ctl.tools_root = json_is_true(root);
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
	if (r == 0 && size) {
		/* Every sandbox's sizes (the bounds are checked with the flags',
		 * cap_ctl_size_cfg_check). */
		static const char *const sz[] = { "cpus", "memory_mib", "root_mib", "work_mib", NULL };
		unsigned *field[] = { &c->ctl.size.cpus, &c->ctl.size.memory_mib, &c->ctl.size.root_mib,
				      &c->ctl.size.work_mib };
		r = json_is_object(size) ? only_keys(size, "size", sz, err)
					 : cap_err_set(err, EINVAL, "\"size\" must be an object of cpus, memory_mib, root_mib and work_mib");
		for (size_t i = 0; r == 0 && sz[i]; i++) {
			v = *field[i];
			if ((r = cfg_uint(size, sz[i], "size", CAP_DISK_MAX_MIB, &v, err)) == 0)
				*field[i] = (unsigned)v;
		}
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
