/* capsule code's presets, read (code-preset.h). A preset is JSON:
 *
 *   {"description": "...", "command": ["claude"],
 *    "allow": ["api.anthropic.com:443"], "env": {"NAME": "value"},
 *    "secret_files": ["~/.x/auth.json=~/.x/auth.json:token@api.x.com"]}
 *
 * "command" is required; every other member is optional; any member not
 * named here is refused, so that a misspelt one is not silently ignored. */
#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "code-preset.h"
#include "policy.h"
#include "util.h"

bool cap_code_preset_name_ok(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > CAP_PRESET_NAME_MAX || name[0] == '-' || name[0] == '_')
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
			return false;
	}
	return true;
}

static bool env_name_ok(const char *s)
{
	if (!*s || (*s >= '0' && *s <= '9'))
		return false;
	for (; *s; s++)
		if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_'))
			return false;
	return true;
}

/* A string member's value: valid UTF-8 (jansson's), no NUL, no control
 * character but tab, at most CAP_PRESET_STRING_MAX bytes. */
static const char *text_of(json_t *v, const char *where, const char *what, struct cap_err *err)
{
	if (!json_is_string(v)) {
		cap_err_set(err, EINVAL, "preset %s: %s must be a string", where, what);
		return NULL;
	}
	const char *s = json_string_value(v);
	size_t n = json_string_length(v);
	if (n != strlen(s) || n > CAP_PRESET_STRING_MAX) {
		cap_err_set(err, EINVAL, "preset %s: %s %s", where, what,
			    n > CAP_PRESET_STRING_MAX ? "is too long (at most 4096 bytes)" : "holds a NUL byte");
		return NULL;
	}
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] < 0x20 && s[i] != '\t') {
			cap_err_set(err, EINVAL, "preset %s: %s holds a control character", where, what);
			return NULL;
		}
	return s;
}

/* A non-empty (or, with may_be_empty, any) array of at most max strings
 * into a new NULL-terminated array. */
static int strings_of(json_t *v, const char *where, const char *what, size_t max, bool may_be_empty,
		      char ***out, size_t *n, struct cap_err *err)
{
	if (!json_is_array(v) || (!may_be_empty && json_array_size(v) == 0) || json_array_size(v) > max)
		return cap_err_set(err, EINVAL, "preset %s: %s must be an array of %s%zu strings", where, what,
				   may_be_empty ? "at most " : "1 to ", max);
	size_t k = json_array_size(v);
	char **a = xcalloc(k + 1, sizeof(*a));
	for (size_t i = 0; i < k; i++) {
		char label[64];
		snprintf(label, sizeof(label), "%s[%zu]", what, i);
		const char *s = text_of(json_array_get(v, i), where, label, err);
		if (!s || (!*s && !may_be_empty)) {
			if (s)
				cap_err_set(err, EINVAL, "preset %s: %s is empty", where, label);
			for (size_t j = 0; j < i; j++)
				free(a[j]);
			free(a);
			return -EINVAL;
		}
		a[i] = xstrdup(s);
	}
	*out = a;
	*n = k;
	return 0;
}

char *cap_code_preset_home(const char *decl, const char *home)
{
	const char *eq = strchr(decl, '=');
	if (eq && eq[1] == '~' && eq[2] == '/')
		return xasprintf("%.*s%s/%s", (int)(eq + 1 - decl), decl, home, eq + 3);
	return xstrdup(decl);
}

void cap_code_preset_fini(struct cap_code_preset *p)
{
	free(p->owned_description);
	for (size_t i = 0; i < p->argc; i++)
		free(p->owned_argv[i]);
	free(p->owned_argv);
	for (size_t i = 0; i < p->nallow; i++)
		free(p->owned_allow[i]);
	free(p->owned_allow);
	for (size_t i = 0; i < p->nenv; i++)
		free(p->owned_env[i]);
	free(p->owned_env);
	for (size_t i = 0; i < p->nsecret_files; i++)
		free(p->owned_secret_files[i]);
	free(p->owned_secret_files);
	memset(p, 0, sizeof(*p));
}

static int parse(struct cap_code_preset *p, json_t *j, const char *where, struct cap_err *err)
{
	static const char *const members[] = { "description", "command", "allow", "env", "secret_files" };
	const char *key;
	json_t *v;
	if (!json_is_object(j))
		return cap_err_set(err, EINVAL, "preset %s: not a JSON object", where);
	json_object_foreach(j, key, v) {
		bool known = false;
		for (size_t i = 0; i < CAP_ARRAY_SIZE(members); i++)
			known = known || strcmp(key, members[i]) == 0;
		if (!known)
			return cap_err_set(err, EINVAL, "preset %s: unknown member \"%.64s\" (a preset has description, command, allow, env and secret_files)",
					   where, key);
	}
	json_t *d = json_object_get(j, "description");
	const char *desc = d ? text_of(d, where, "description", err) : "";
	if (!desc)
		return -EINVAL;
	p->owned_description = xstrdup(desc);
	json_t *cmd = json_object_get(j, "command");
	if (!cmd)
		return cap_err_set(err, EINVAL, "preset %s: no command (an array such as [\"claude\"])", where);
	if (strings_of(cmd, where, "command", CAP_PRESET_ARGS_MAX, false, &p->owned_argv, &p->argc, err) < 0)
		return -EINVAL;
	json_t *allow = json_object_get(j, "allow");
	if (allow) {
		if (strings_of(allow, where, "allow", CAP_PRESET_ALLOW_MAX, true, &p->owned_allow, &p->nallow, err) < 0)
			return -EINVAL;
		/* Each rule as --allow-egress reads it, so that a bad one is
		 * refused here, naming the preset, not at the sandbox's start. */
		_cleanup_free_ struct cap_net_policy *scratch = xmalloc(sizeof(*scratch));
		cap_net_policy_init(scratch);
		for (size_t i = 0; i < p->nallow; i++) {
			struct cap_err e = { 0 };
			if (cap_net_policy_apply(scratch, "allow-egress", p->owned_allow[i], &e) < 0)
				return cap_err_set(err, EINVAL, "preset %s: allow[%zu]: %s", where, i, e.msg);
		}
	}
	json_t *sf = json_object_get(j, "secret_files");
	if (sf) {
		if (strings_of(sf, where, "secret_files", CAP_PRESET_SECRET_FILES_MAX, true, &p->owned_secret_files,
			       &p->nsecret_files, err) < 0)
			return -EINVAL;
		/* As --secret-file reads it, "~/" as a home would be. */
		_cleanup_free_ struct cap_net_policy *scratch = xmalloc(sizeof(*scratch));
		cap_net_policy_init(scratch);
		for (size_t i = 0; i < p->nsecret_files; i++) {
			struct cap_err e = { 0 };
			_cleanup_free_ char *t = cap_code_preset_home(p->owned_secret_files[i], "/home/user");
			if (cap_net_secret_file_add(scratch, t, &e) < 0)
				return cap_err_set(err, EINVAL, "preset %s: secret_files[%zu]: %s", where, i, e.msg);
		}
	}
	json_t *env = json_object_get(j, "env");
	if (env) {
		if (!json_is_object(env) || json_object_size(env) > CAP_PRESET_ENV_MAX)
			return cap_err_set(err, EINVAL, "preset %s: env must be an object of at most %d NAME: \"value\" members",
					   where, CAP_PRESET_ENV_MAX);
		p->owned_env = xcalloc(json_object_size(env) + 1, sizeof(*p->owned_env));
		json_object_foreach(env, key, v) {
			char label[96];
			snprintf(label, sizeof(label), "env.%.64s", key);
			if (!env_name_ok(key) || strlen(key) > 64)
				return cap_err_set(err, EINVAL, "preset %s: env name \"%.64s\" is not [A-Za-z_][A-Za-z0-9_]* of at most 64",
						   where, key);
			const char *s = text_of(v, where, label, err);
			if (!s)
				return -EINVAL;
			p->owned_env[p->nenv++] = xasprintf("%s=%s", key, s);
		}
	}
	return 0;
}

int cap_code_preset_parse(struct cap_code_preset *p, const char *name, const char *where,
			  const char *text, size_t len, struct cap_err *err)
{
	memset(p, 0, sizeof(*p));
	if (!cap_code_preset_name_ok(name))
		return cap_err_set(err, EINVAL, "'%.64s' is not a preset name: 1 to %d of a-z, 0-9, - and _", name,
				   CAP_PRESET_NAME_MAX);
	if (len > CAP_PRESET_FILE_MAX)
		return cap_err_set(err, EINVAL, "preset %s: %zu bytes, over the limit of %u", where, len,
				   CAP_PRESET_FILE_MAX);
	json_error_t je;
	json_t *j = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return cap_err_set(err, EINVAL, "preset %s: line %d: %s", where, je.line, je.text);
	snprintf(p->name, sizeof(p->name), "%s", name);
	int r = parse(p, j, where, err);
	json_decref(j);
	if (r < 0)
		cap_code_preset_fini(p);
	return r;
}
