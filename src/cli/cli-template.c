/* capsule template: list, build and prune the snapshots new VMs start from. */
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
	"Usage: capsule template ls [--json] | build [-q] | prune\n"
	"\n"
	"New VMs start by restoring a template snapshot (a VM booted once to the\n"
	"point where its agent is ready, nothing mounted) instead of booting. One\n"
	"template per kernel, initramfs, QEMU, accelerator, vCPUs, memory and device\n"
	"layout (image included); each is built on first use.\n"
	"\n"
	"  ls      List templates (--json: an array of {\"key\", \"created\",\n"
	"          \"state_bytes\", \"ram_bytes\", \"shape\", \"directory\"}; docs/cli.md)\n"
	"  build   Build the template of `capsule run` (default vCPUs and memory)\n"
	"  prune   Remove every template (they are rebuilt when needed)\n";

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
	if ((argc == 2 || json) && strcmp(argv[1], "ls") == 0) {
		struct cap_template_info *v;
		size_t n;
		cap_template_list(&v, &n);
		if (json) {
			json_t *a = json_array();
			for (size_t i = 0; i < n; i++) {
				json_array_append_new(a, json_pack("{s:s, s:I, s:I, s:I, s:o, s:o}", "key", v[i].key,
								   "created", (json_int_t)v[i].created, "state_bytes",
								   (json_int_t)v[i].state_bytes, "ram_bytes",
								   (json_int_t)v[i].ram_bytes, "shape", cap_json_text(v[i].owned_desc),
								   "directory", cap_json_text(v[i].owned_dir)));
				cap_template_info_fini(&v[i]);
			}
			free(v);
			return cap_cli_json_out(a);
		}
		printf("%-18s %-20s %10s %10s  %s\n", "KEY", "CREATED", "STATE", "RAM", "SHAPE");
		for (size_t i = 0; i < n; i++) {
			char when[32];
			time_t t = (time_t)v[i].created;
			strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&t));
			printf("%-18.16s %-20s %9.1fK %9.1fM  %s\n", v[i].key, when, v[i].state_bytes / 1024.0,
			       v[i].ram_bytes / 1048576.0, v[i].owned_desc);
			cap_template_info_fini(&v[i]);
		}
		free(v);
		return 0;
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
