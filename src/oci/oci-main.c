/* The OCI runtime's command line (docs/oci.md): runc's global flags and
 * verbs as Podman (through conmon) and containerd (through its runc v2
 * shim) call them, with runc's exit codes and error words. One container
 * is one named sandbox plus a monitor process (oci-monitor.c); its state
 * lives in <root>/<id>/ (oci-int.h). Here: the global flags and the table
 * of verbs, each in a file of its own (oci-<verb>.c). */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "log.h"
#include "oci-int.h"
#include "util.h"

#define DEFAULT_ROOT "/run/capsule-oci"

/* runc's global flags. */
struct cap_oci_flags cap_oci_flags = { .root = DEFAULT_ROOT };

/* ---- the command line ------------------------------------------------- */

static const char usage[] =
	"Usage: capsule-oci [--root DIR] [--log FILE] [--log-format text|json]\n"
	"                   [--systemd-cgroup] [--debug] COMMAND [ARG...]\n"
	"\n"
	"capsule as an OCI runtime (runc's command line): each container runs in its\n"
	"own capsule VM. See docs/oci.md for Podman and containerd.\n"
	"\n"
	"Commands: create, start, state, kill, delete, exec, ps, pause, resume, list,\n"
	"features, update, events. Global flags:\n"
	"  --root DIR          where container state is kept (default " DEFAULT_ROOT ")\n"
	"  --log FILE          append errors to FILE too (runc's --log)\n"
	"  --log-format F      text (default) or json\n"
	"  --systemd-cgroup    cgroupsPath is systemd's slice:prefix:name\n"
	"  --rootless false    accepted (capsule-oci runs as root)\n"
	"  --debug             library notes to the log file too\n";

enum { G_ROOT = 0x200, G_LOG, G_LOG_FORMAT, G_SYSTEMD, G_DEBUG, G_ROOTLESS, G_CRIU };

int cap_cli_oci(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "root", required_argument, NULL, G_ROOT },
		{ "log", required_argument, NULL, G_LOG },
		{ "log-format", required_argument, NULL, G_LOG_FORMAT },
		{ "systemd-cgroup", no_argument, NULL, G_SYSTEMD },
		{ "debug", no_argument, NULL, G_DEBUG },
		{ "rootless", required_argument, NULL, G_ROOTLESS },
		{ "criu", required_argument, NULL, G_CRIU },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'v' },
		{ 0 },
	};
	int c;
	cap_log_set(cap_oci_log_sink, NULL);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+hv", opts, NULL)) != -1) {
		switch (c) {
		case G_ROOT: cap_oci_flags.root = optarg; break;
		case G_LOG: cap_oci_flags.log = optarg; break;
		case G_LOG_FORMAT:
			if (strcmp(optarg, "json") != 0 && strcmp(optarg, "text") != 0) {
				cap_oci_error("--log-format %s: text or json", optarg);
				return 1;
			}
			cap_oci_flags.log_json = strcmp(optarg, "json") == 0;
			break;
		case G_SYSTEMD: cap_oci_flags.systemd_cgroup = true; break;
		case G_DEBUG: cap_oci_flags.debug = true; break;
		case G_CRIU: break;
		case G_ROOTLESS:
			if (strcmp(optarg, "false") != 0 && strcmp(optarg, "auto") != 0) {
				cap_oci_error("--rootless %s: capsule-oci runs as root only (false or auto)", optarg);
				return 1;
			}
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		case 'v':
			printf("capsule-oci version %s\nspec: %s\n", CAPSULE_VERSION, CAP_OCI_VERSION);
			return 0;
		default:
			cap_oci_error("unknown or incomplete global option '%s'", argv[optind - 1]);
			return 1;
		}
	}
	if (optind >= argc) {
		fputs(usage, stderr);
		return 1;
	}
	/* The root's absolute path: a monitor's own later paths must not
	 * depend on where the engine ran us from. */
	static char root_abs[PATH_MAX];
	if (cap_oci_flags.root[0] != '/' && getcwd(root_abs, sizeof(root_abs) - strlen(cap_oci_flags.root) - 2)) {
		strcat(root_abs, "/");
		strcat(root_abs, cap_oci_flags.root);
		cap_oci_flags.root = root_abs;
	}
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} verbs[] = {
		{ "create", cap_oci_cmd_create }, { "start", cap_oci_cmd_start }, { "state", cap_oci_cmd_state },
		{ "kill", cap_oci_cmd_kill }, { "delete", cap_oci_cmd_delete }, { "exec", cap_oci_cmd_exec },
		{ "ps", cap_oci_cmd_ps }, { "pause", cap_oci_cmd_pause }, { "resume", cap_oci_cmd_resume },
		{ "list", cap_oci_cmd_list }, { "features", cap_oci_cmd_features },
		{ "update", cap_oci_cmd_update }, { "events", cap_oci_cmd_events },
	};
	const char *verb = argv[optind];
	for (size_t i = 0; i < CAP_ARRAY_SIZE(verbs); i++)
		if (strcmp(verb, verbs[i].name) == 0)
			return verbs[i].fn(argc - optind, argv + optind);
	if (strcmp(verb, "help") == 0) {
		fputs(usage, stdout);
		return 0;
	}
	cap_oci_error("unknown command '%s' (capsule-oci runs create, start, state, kill, delete, exec, "
		      "ps, pause, resume, list, features, update and events)", verb);
	return 1;
}
