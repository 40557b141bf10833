/* pause, resume, snapshot (take, ls, inspect, rm) and fork of named
 * sandboxes (docs/cli.md, "Snapshots and forks"). */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "controller.h"
#include "jsonrpc.h"
#include "named.h"
#include "util.h"

static int fail(const struct cap_err *err)
{
	cap_cli_error("%s", err->msg);
	return err->code == EINVAL || err->code == ERANGE ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
}

/* A sandbox a running controller owns is paused and resumed by it
 * (its idle lifecycle): refused here. */
static bool owned(const char *name, const char *verb)
{
	struct cap_ctl_holder h;
	if (cap_ctl_owner_of(name, &h) <= 0)
		return false;
	cap_cli_error("sandbox '%s' belongs to capsule %s (pid %d), which pauses and resumes it for an identity; it cannot be %s from here",
		      name, h.frontend, (int)h.pid, verb);
	return true;
}

static const char pause_usage[] =
	"Usage: capsule pause NAME\n\n"
	"Freeze the running sandbox NAME: its vCPUs stop, its memory and every\n"
	"process are kept, and it uses no CPU. `capsule resume NAME` continues it;\n"
	"so does its next command (exec, shell, cp), as a paused sandbox of\n"
	"`capsule serve` wakes. The guest's clock is set again on resume.\n";

static const char resume_usage[] =
	"Usage: capsule resume NAME\n\n"
	"Continue the sandbox NAME that `capsule pause` froze.\n";

static int pause_or_resume(int argc, char **argv, bool pause)
{
	const char *usage = pause ? pause_usage : resume_usage;
	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc != 2 || argv[1][0] == '-') {
		fputs(usage, stderr);
		return CAP_EXIT_USAGE;
	}
	const char *name = argv[1];
	struct cap_err err = { 0 };
	if (owned(name, pause ? "paused" : "resumed"))
		return CAP_EXIT_FAILURE;
	if (cap_named_pause(name, pause, &err) < 0)
		return fail(&err);
	return 0;
}

int cap_cli_pause(int argc, char **argv) { return pause_or_resume(argc, argv, true); }
int cap_cli_resume(int argc, char **argv) { return pause_or_resume(argc, argv, false); }

static const char snapshot_usage[] =
	"Usage: capsule snapshot [take] NAME [SNAPSHOT] [--paused]\n"
	"       capsule snapshot ls [--json]\n"
	"       capsule snapshot inspect SNAPSHOT [--json]\n"
	"       capsule snapshot rm SNAPSHOT\n"
	"\n"
	"Save the running sandbox NAME as SNAPSHOT (default NAME-snapN): its\n"
	"memory, device state and disks at one instant. The VM is paused only\n"
	"for the save (and stays paused with --paused, or when it was), then\n"
	"goes on. `capsule create NEW --from SNAPSHOT` makes a sandbox that\n"
	"resumes it, running processes included; `capsule fork` does both.\n"
	"Children share the snapshot's memory and disks copy-on-write. A sandbox\n"
	"named ls, inspect, rm or take is snapshotted with `snapshot take NAME`.\n"
	"ls lists snapshots; inspect shows one with the sandboxes made from it;\n"
	"rm removes one, refused while sandboxes made from it exist.\n";

static json_t *info_json(const struct cap_snapshot_info *i)
{
	json_t *kids = json_array();
	for (size_t k = 0; k < i->nchildren; k++)
		json_array_append_new(kids, cap_json_text(i->children[k]));
	return json_pack("{s:o, s:o, s:o, s:I, s:i, s:i, s:b, s:I, s:I, s:I, s:o}", "name", cap_json_text(i->name),
			 "parent", cap_json_text(i->parent), "image", cap_json_text(i->image), "created",
			 (json_int_t)i->created, "cpus", i->cpus, "memory_mib", i->memory_mib, "nic", i->has_nic,
			 "ram_bytes", (json_int_t)i->ram_bytes, "disk_bytes", (json_int_t)i->disk_bytes, "save_ms",
			 (json_int_t)i->save_ms, "children", kids);
}

static int snapshot_ls(bool json)
{
	struct cap_snapshot_info *v;
	size_t n;
	cap_snapshot_inspect_all(&v, &n);
	json_t *all = json ? json_array() : NULL;
	if (!json)
		printf("%-24s %-24s %8s %8s %6s %s\n", "SNAPSHOT", "PARENT", "RAM", "DISKS", "AGE", "CHILDREN");
	for (size_t i = 0; i < n; i++) {
		const struct cap_snapshot_info *info = &v[i];
		if (info->error[0] && json) {
			json_array_append_new(all, json_pack("{s:o, s:o}", "name", cap_json_text(info->name), "error",
							     cap_json_text(info->error)));
		} else if (info->error[0]) {
			printf("%-24s %s\n", info->name, info->error);
		} else if (json) {
			json_array_append_new(all, info_json(info));
		} else {
			char ram[32], disks[32], a[32];
			cap_cli_human(info->ram_bytes, ram, sizeof(ram));
			cap_cli_human(info->disk_bytes, disks, sizeof(disks));
			cap_cli_age(info->created, a, sizeof(a));
			printf("%-24s %-24s %8s %8s %6s %zu\n", info->name, info->parent, ram, disks, a, info->nchildren);
		}
		cap_snapshot_info_fini(&v[i]);
	}
	free(v);
	return json ? cap_cli_json_out(all) : 0;
}

static int snapshot_inspect(const char *snap, bool json)
{
	struct cap_snapshot_info info;
	struct cap_err err = { 0 };
	if (cap_snapshot_inspect(snap, &info, &err) < 0)
		return fail(&err);
	if (json) {
		int rc = cap_cli_json_out(info_json(&info));
		cap_snapshot_info_fini(&info);
		return rc;
	}
	char ram[32], disks[32], when[64];
	time_t t = (time_t)info.created;
	struct tm tm;
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime_r(&t, &tm));
	cap_cli_human(info.ram_bytes, ram, sizeof(ram));
	cap_cli_human(info.disk_bytes, disks, sizeof(disks));
	printf("snapshot: %s\nparent:   %s\nimage:    %s\ncreated:  %s\nshape:    %u vCPU, %u MiB%s\n"
	       "ram:      %s on the host\ndisks:    %s on the host\nsave:     %lld ms\nchildren:", info.name,
	       info.parent, info.image, when, info.cpus, info.memory_mib, info.has_nic ? ", NIC" : "", ram, disks,
	       (long long)info.save_ms);
	for (size_t k = 0; k < info.nchildren; k++)
		printf(" %s", info.children[k]);
	printf("%s\n", info.nchildren ? "" : " none");
	cap_snapshot_info_fini(&info);
	return 0;
}

int cap_cli_snapshot(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, 'j' },
		{ "paused", no_argument, NULL, 'p' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool json = false, paused = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case 'j': json = true; break;
		case 'p': paused = true; break;
		case 'h': fputs(snapshot_usage, stdout); return 0;
		default: fputs(snapshot_usage, stderr); return CAP_EXIT_USAGE;
		}
	}
	int n = argc - optind;
	char **a = argv + optind;
	const char *sub = n > 0 ? a[0] : NULL;
	struct cap_err err = { 0 };
	bool listing = sub && (strcmp(sub, "ls") == 0 || strcmp(sub, "inspect") == 0 || strcmp(sub, "rm") == 0);
	if ((json && !listing) || (paused && listing) || (sub && strcmp(sub, "rm") == 0 && json)) {
		cap_cli_error("%s is not an option of `capsule snapshot %s`; see `capsule snapshot --help`",
			      json ? "--json" : "--paused", sub ? sub : "");
		return CAP_EXIT_USAGE;
	}
	if (sub && strcmp(sub, "ls") == 0 && n == 1)
		return snapshot_ls(json);
	if (sub && strcmp(sub, "inspect") == 0 && n == 2)
		return snapshot_inspect(a[1], json);
	if (sub && strcmp(sub, "rm") == 0 && n >= 2) {
		int rc = 0;
		for (int i = 1; i < n; i++) {
			struct cap_err e = { 0 };
			if (cap_snapshot_remove(a[i], &e) < 0)
				rc = fail(&e);
		}
		return rc;
	}
	if (sub && strcmp(sub, "take") == 0) {
		a++;
		n--;
	} else if (listing) {
		fputs(snapshot_usage, stderr);
		return CAP_EXIT_USAGE;
	}
	if (n < 1 || n > 2) {
		fputs(snapshot_usage, stderr);
		return CAP_EXIT_USAGE;
	}
	char snap[CAP_NAME_MAX + 1];
	if (n == 2)
		snprintf(snap, sizeof(snap), "%s", a[1]);
	else
		cap_snapshot_default_name(a[0], snap);
	if (cap_named_snapshot(a[0], snap, paused, &err) < 0)
		return fail(&err);
	if (!cap_cli_quiet)
		printf("%s\n", snap);
	return 0;
}

static const char fork_usage[] =
	"Usage: capsule fork NAME [--count N] [--prefix P] [--paused] [--json]\n\n"
	"Branch the running sandbox NAME N ways (default 1, at most 64): a\n"
	"snapshot of it (NAME-forkK), then N new sandboxes started from it,\n"
	"named P1, P2, ... (default prefix \"NAME-\", the first free numbers).\n"
	"Each child goes on from the parent's instant, its processes included,\n"
	"as a machine of its own: its hostname is its name, its clock the host's,\n"
	"its entropy fresh, its network policy process and secrets' placeholders\n"
	"its own. Its disks are copy-on-write over the snapshot's: what a child\n"
	"writes, no other sandbox sees. The parent goes on (stays paused with\n"
	"--paused). Prints the children's names, one a line (--json: {\"snapshot\",\n"
	"\"children\"}). `capsule rm` removes a child; `capsule snapshot rm` the\n"
	"snapshot once no child is left.\n";

int cap_cli_fork(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'n' },
		{ "prefix", required_argument, NULL, 'P' },
		{ "paused", no_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	unsigned long count = 1;
	const char *prefix = NULL;
	bool paused = false, json = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "hn:", opts, NULL)) != -1) {
		switch (c) {
		case 'n':
			if (cap_cli_parse_uint(optarg, 1, CAP_FORK_MAX, &count) < 0) {
				cap_cli_error("--count '%s' is not a number from 1 to %d", optarg, CAP_FORK_MAX);
				return CAP_EXIT_USAGE;
			}
			break;
		case 'P': prefix = optarg; break;
		case 'p': paused = true; break;
		case 'j': json = true; break;
		case 'h': fputs(fork_usage, stdout); return 0;
		default: fputs(fork_usage, stderr); return CAP_EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		fputs(fork_usage, stderr);
		return CAP_EXIT_USAGE;
	}
	char children[CAP_FORK_MAX][CAP_NAME_MAX + 1];
	char snap[CAP_NAME_MAX + 1] = "";
	struct cap_err err = { 0 };
	if (cap_named_fork(argv[optind], (unsigned)count, prefix, paused, children, snap, &err) < 0)
		return fail(&err);
	if (json) {
		json_t *kids = json_array();
		for (unsigned long i = 0; i < count; i++)
			json_array_append_new(kids, cap_json_text(children[i]));
		return cap_cli_json_out(json_pack("{s:o, s:o}", "snapshot", cap_json_text(snap), "children", kids));
	}
	for (unsigned long i = 0; i < count; i++)
		printf("%s\n", children[i]);
	return 0;
}
