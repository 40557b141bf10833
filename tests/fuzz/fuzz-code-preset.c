/* Fuzz target for capsule code's preset reader (src/cli/cli-code-preset.c):
 * the input is a file a user put in ~/.config/capsule/agents. Its first
 * byte picks the preset's name from a few, good and bad; the rest is the
 * file. Checked for a preset accepted: its name is a good one; it has a
 * command of 1 to CAP_PRESET_ARGS_MAX non-empty strings, NULL-terminated;
 * every string (the description, arguments, hosts, environment) is
 * NUL-free, control-free but for tab, and within CAP_PRESET_STRING_MAX;
 * each allow rule is one the network policy takes as --allow-egress;
 * each env entry is NAME=value with NAME [A-Za-z_][A-Za-z0-9_]*; each
 * secret_files entry one --secret-file takes ("~/" as a home). A
 * refusal says why, and leaves the preset empty. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "code-preset.h"
#include "err.h"
#include "fuzz.h"
#include "policy.h"
#include "util.h"

static void check_text(const char *s, const char *what)
{
	size_t n = strlen(s);
	FUZZ_CHECK(n <= CAP_PRESET_STRING_MAX, "%s: %zu bytes", what, n);
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK((unsigned char)s[i] >= 0x20 || s[i] == '\t', "%s: control byte %#x", what, s[i]);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const names[] = { "claude", "my-agent_2", "", "-x", "UPPER", "a/b",
					     "123456789012345678901234567890123" };
	const char *name = names[size ? data[0] % CAP_ARRAY_SIZE(names) : 0];
	const char *text = size ? (const char *)data + 1 : "";
	size_t len = size ? size - 1 : 0;
	struct cap_code_preset p;
	struct cap_err err = { 0 };
	int r = cap_code_preset_parse(&p, name, "fuzz.json", text, len, &err);
	if (r < 0) {
		FUZZ_CHECK(err.msg[0], "refused (%d) without a message", r);
		FUZZ_CHECK(!p.owned_argv && !p.owned_allow && !p.owned_env && !p.argc, "a refused preset is not empty");
		return 0;
	}
	FUZZ_CHECK(cap_code_preset_name_ok(name) && strcmp(p.name, name) == 0, "name %s accepted", name);
	check_text(p.owned_description, "description");
	FUZZ_CHECK(p.argc >= 1 && p.argc <= CAP_PRESET_ARGS_MAX && p.owned_argv[p.argc] == NULL, "argc %zu", p.argc);
	for (size_t i = 0; i < p.argc; i++) {
		FUZZ_CHECK(p.owned_argv[i][0], "command[%zu] empty", i);
		check_text(p.owned_argv[i], "command");
	}
	FUZZ_CHECK(p.nallow <= CAP_PRESET_ALLOW_MAX, "%zu allow rules", p.nallow);
	struct cap_net_policy *scratch = xmalloc(sizeof(*scratch));
	cap_net_policy_init(scratch);
	for (size_t i = 0; i < p.nallow; i++) {
		check_text(p.owned_allow[i], "allow");
		struct cap_err e = { 0 };
		FUZZ_CHECK(cap_net_policy_apply(scratch, "allow-egress", p.owned_allow[i], &e) == 0,
			   "allow[%zu] %s not a rule: %s", i, p.owned_allow[i], e.msg);
	}
	free(scratch);
	FUZZ_CHECK(p.nenv <= CAP_PRESET_ENV_MAX && (!p.nenv || p.owned_env[p.nenv] == NULL), "%zu env", p.nenv);
	for (size_t i = 0; i < p.nenv; i++) {
		const char *e = p.owned_env[i], *eq = strchr(e, '=');
		FUZZ_CHECK(eq && eq > e && !(e[0] >= '0' && e[0] <= '9'), "env %s", e);
		for (const char *s = e; s < eq; s++)
			FUZZ_CHECK((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || (*s >= '0' && *s <= '9') || *s == '_',
				   "env name %.*s", (int)(eq - e), e);
		check_text(eq + 1, "env value");
	}
	FUZZ_CHECK(p.nsecret_files <= CAP_PRESET_SECRET_FILES_MAX, "%zu secret files", p.nsecret_files);
	struct cap_net_policy *files = xmalloc(sizeof(*files));
	cap_net_policy_init(files);
	for (size_t i = 0; i < p.nsecret_files; i++) {
		char *t = cap_code_preset_home(p.owned_secret_files[i], "/home/user");
		struct cap_err e = { 0 };
		FUZZ_CHECK(cap_net_secret_file_add(files, t, &e) == 0, "secret_files[%zu] %s not one: %s", i, t, e.msg);
		free(t);
	}
	free(files);
	cap_code_preset_fini(&p);
	return 0;
}
