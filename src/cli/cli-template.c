/* capsule template: list, inspect, build and prune the snapshots new VMs
 * start from. */
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "jsonrpc.h"
#include "sandbox.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule template ls [--json] | inspect KEY [--json] | build [-q] | prune\n"
	"\n"
	"New VMs start by restoring a template snapshot (a VM booted once to the\n"
	"point where its agent is ready, nothing mounted) instead of booting. One\n"
	"template per kernel, initramfs, QEMU, accelerator, host (under KVM: its\n"
	"CPU, KVM and kernel), vCPUs, memory and device layout (image included);\n"
	"each is built on first use. A template made on another host, or before\n"
	"a change of CPU, kernel or QEMU, is never restored: ls shows what differs.\n"
	"\n"
	"  ls       List templates; HOST is \"same\" when this host matches the one\n"
	"           each was made on, else the fields that differ (--json: an array\n"
	"           of {\"key\", \"created\", \"state_bytes\", \"ram_bytes\", \"shape\",\n"
	"           \"directory\", \"engine\", \"accel\", \"host\", \"host_mismatch\"};\n"
	"           docs/cli.md)\n"
	"  inspect  One template (KEY or a unique start of it): the host it was made\n"
	"           on beside this one (--json: ls's object and \"this_host\")\n"
	"  build    Build the template of `capsule run` (default vCPUs and memory)\n"
	"  prune    Remove every template (they are rebuilt when needed)\n";

/* The recorded host fields as an object, or null when none were. */
static json_t *host_json(const struct cap_template_info *t, bool now)
{
	if (!t->host)
		return json_null();
	json_t *o = json_object();
	for (size_t i = 0; i < t->nhost; i++) {
		const char *v = now ? t->host[i].owned_now : t->host[i].owned_made;
		if (v)
			json_object_set_new(o, t->host[i].owned_name, cap_json_text(v));
	}
	return o;
}

static json_t *mismatch_json(const struct cap_template_info *t)
{
	if (!t->owned_mismatch)
		return json_null();
	json_t *a = json_array();
	for (size_t i = 0; i < t->nhost; i++)
		if (t->host[i].differs)
			json_array_append_new(a, cap_json_text(t->host[i].owned_name));
	return a;
}

static json_t *info_json(const struct cap_template_info *t)
{
	return json_pack("{s:s, s:I, s:I, s:I, s:o, s:o, s:o, s:o, s:o, s:o}", "key", t->key,
			 "created", (json_int_t)t->created, "state_bytes", (json_int_t)t->state_bytes,
			 "ram_bytes", (json_int_t)t->ram_bytes, "shape", cap_json_text(t->owned_desc),
			 "directory", cap_json_text(t->owned_dir),
			 "engine", *t->engine ? cap_json_text(t->engine) : json_null(),
			 "accel", *t->accel ? cap_json_text(t->accel) : json_null(),
			 "host", host_json(t, false), "host_mismatch", mismatch_json(t));
}

/* What ls's HOST column says. */
static const char *host_word(const struct cap_template_info *t)
{
	if (!t->owned_mismatch)
		return "unknown";
	return *t->owned_mismatch ? t->owned_mismatch : "same";
}

static void free_list(struct cap_template_info *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cap_template_info_fini(&v[i]);
	free(v);
}

static int ls(bool json)
{
	struct cap_template_info *v;
	size_t n;
	cap_template_list(&v, &n);
	if (json) {
		json_t *a = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, info_json(&v[i]));
		free_list(v, n);
		return cap_cli_json_out(a);
	}
	printf("%-18s %-20s %10s %10s  %-16s %s\n", "KEY", "CREATED", "STATE", "RAM", "HOST", "SHAPE");
	for (size_t i = 0; i < n; i++) {
		char when[32];
		time_t t = (time_t)v[i].created;
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&t));
		printf("%-18.16s %-20s %9.1fK %9.1fM  %-16s %s\n", v[i].key, when, v[i].state_bytes / 1024.0,
		       v[i].ram_bytes / 1048576.0, host_word(&v[i]), v[i].owned_desc);
	}
	free_list(v, n);
	return 0;
}

static int inspect(const char *prefix, bool json)
{
	struct cap_template_info *v;
	size_t n = 0, found = 0, at = 0;
	cap_template_list(&v, &n);
	size_t len = strlen(prefix);
	for (size_t i = 0; len && i < n; i++)
		if (strncmp(v[i].key, prefix, len) == 0)
			found++, at = i;
	if (found != 1) {
		if (found)
			cap_cli_error("template %s is ambiguous: %zu keys start with it; give more of it (capsule template ls)",
				      prefix, found);
		else
			cap_cli_error("no template %s (capsule template ls lists them)", prefix);
		free_list(v, n);
		return CAP_EXIT_FAILURE;
	}
	const struct cap_template_info *t = &v[at];
	if (json) {
		json_t *o = info_json(t);
		json_object_set_new(o, "this_host", host_json(t, true));
		free_list(v, n);
		return cap_cli_json_out(o);
	}
	char when[32];
	time_t c = (time_t)t->created;
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&c));
	printf("key:        %s\ncreated:    %s\nshape:      %s\ndirectory:  %s\n", t->key, when, t->owned_desc,
	       t->owned_dir);
	printf("state, RAM: %.1f KiB, %.1f MiB\n", t->state_bytes / 1024.0, t->ram_bytes / 1048576.0);
	if (!t->host) {
		printf("host:       not recorded (made by an older capsule; its key is not this version's: it is never restored)\n");
	} else {
		printf("engine:     %s, %s\nhost it was made on%s:\n", t->engine, t->accel,
		       *t->owned_mismatch ? " (a field marked * differs on this host)" : " (this host matches)");
		for (size_t i = 0; i < t->nhost; i++) {
			const struct cap_template_host_field *f = &t->host[i];
			printf("%c %-13s %s\n", f->differs ? '*' : ' ', f->owned_name, f->owned_made ? f->owned_made : "(not recorded)");
			if (f->differs)
				printf("  %-13s %s\n", "this host:", f->owned_now ? f->owned_now : "(none)");
		}
		if (*t->owned_mismatch)
			printf("This template is not restored here (a VM would start from another, built\n"
			       "on first use); `capsule template prune` removes every template.\n");
	}
	free_list(v, n);
	return 0;
}

int cap_cli_template(int argc, char **argv)
{
	struct cap_err err = { 0 };
	/* --help after a verb (template prune --help) is help, not a usage error. */
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			fputs(usage, stdout);
			return 0;
		}
	bool json = argc == 3 && strcmp(argv[2], "--json") == 0;
	bool quiet = argc == 3 && (strcmp(argv[2], "-q") == 0 || strcmp(argv[2], "--quiet") == 0);
	if ((argc == 2 || json) && strcmp(argv[1], "ls") == 0)
		return ls(json);
	if (argc >= 3 && argc <= 4 && strcmp(argv[1], "inspect") == 0) {
		bool ijson = argc == 4 && strcmp(argv[3], "--json") == 0;
		if (argc == 3 || ijson)
			return inspect(argv[2], ijson);
	}
	if ((argc == 2 || quiet) && strcmp(argv[1], "build") == 0) {
		struct cap_sandbox_opts o;
		char key[65];
		cap_cli_quiet = quiet;	/* it prints no progress today; -q stays accepted */
		cap_sandbox_opts_init(&o);
		if (cap_template_ensure(&o, key, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		printf("template %s ready\n", key);
		return 0;
	}
	if (argc == 2 && strcmp(argv[1], "prune") == 0) {
		size_t n;
		if (cap_template_prune(&n, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		printf("removed %zu template(s)\n", n);
		return 0;
	}
	fputs(usage, stderr);
	return 2;
}
