/* capsule code's agent presets (docs/coding-agents.md): what an agent
 * is to capsule — its command, the hosts it needs, its environment —
 * as data: the built-in ones (share/agents/NAME.json, compiled in) and a
 * user's own ($XDG_CONFIG_HOME/capsule/agents/NAME.json, which wins).
 * The reader is pure (a text in, a preset or a reason out), fuzzed as
 * code-preset. */
#ifndef CAP_CODE_PRESET_H
#define CAP_CODE_PRESET_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

#define CAP_PRESET_NAME_MAX 32
#define CAP_PRESET_FILE_MAX (64u << 10)
#define CAP_PRESET_ARGS_MAX 64
#define CAP_PRESET_ALLOW_MAX 32
#define CAP_PRESET_ENV_MAX 64
#define CAP_PRESET_STRING_MAX 4096
#define CAP_PRESET_SECRET_FILES_MAX 4

struct cap_code_preset {
	char name[CAP_PRESET_NAME_MAX + 1];
	char *owned_description;	/* "" when none */
	char **owned_argv;	/* argc strings, NULL-terminated */
	size_t argc;
	/* --allow-egress rules, each checked by the network policy's own
	 * reader: HOST, *.DOMAIN or an address, optionally :PORT. */
	char **owned_allow;
	size_t nallow;
	char **owned_env;	/* "NAME=value", NULL-terminated */
	size_t nenv;
	/* The agent's credential files, each as --secret-file reads it
	 * (GUESTPATH=HOSTFILE[:FIELD,...]@HOST,...), HOSTFILE absolute or
	 * "~/..." (the user's home); checked by the policy's own reader. */
	char **owned_secret_files;
	size_t nsecret_files;
};

/* The compiled-in presets (code-presets.c, generated from share/agents). */
struct cap_code_builtin {
	const char *name;
	const char *json;
};
extern const struct cap_code_builtin cap_code_builtins[];
extern const size_t cap_code_nbuiltins;

/* A preset's name: 1 to 32 of [a-z0-9_-], starting with a letter or
 * digit (a file name too). */
bool cap_code_preset_name_ok(const char *name);

/* Read the preset name from text (len bytes; `where` names it in
 * messages: a file's path, or "built-in"). 0, or -EINVAL with err
 * naming where, the member and what is wrong; p is then empty. */
int cap_code_preset_parse(struct cap_code_preset *p, const char *name, const char *where,
			  const char *text, size_t len, struct cap_err *err);
void cap_code_preset_fini(struct cap_code_preset *p);
/* A secret_files entry with its HOSTFILE's leading "~/" as home's: new. */
char *cap_code_preset_home(const char *decl, const char *home);

#endif
