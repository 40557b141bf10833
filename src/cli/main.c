#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <unistd.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "cli.h"
#include "log.h"
#include "oci.h"

static const char usage[] =
	"Usage: capsule COMMAND [OPTIONS]\n"
	"\n"
	"Private microVMs for AI agents' tools.\n"
	"\n"
	"Commands:\n"
	"  run       Run a command in a fresh microVM, stream its output, remove the VM\n"
	"  create    Create a persistent named sandbox (its own root and /work disks)\n"
	"  start     Start a sandbox            stop      Stop a sandbox (disks kept)\n"
	"  exec      Run a command in a sandbox\n"
	"  shell     Open an interactive shell in a sandbox\n"
	"  ls        List sandboxes             inspect   Show a sandbox\n"
	"  logs      Print (or follow) a sandbox's console and shim logs\n"
	"  rm        Delete a sandbox and its disks\n"
	"  cp        Copy files and trees into and out of a sandbox\n"
	"  diff      What a sandbox changed in its /workspace (a copy of a project)\n"
	"  merge     Apply a sandbox's /workspace changes to the project, three-way\n"
	"  net       Show or change a sandbox's network policy, read its log\n"
	"  image     Build, import, list and remove images\n"
	"  template  List, inspect, build and prune the snapshots new VMs start from\n"
	"  source    Check or build a public data projection by hand\n"
	"  serve     Serve per-identity sandboxes over JSON-RPC on a unix socket\n"
	"  mcp       Model Context Protocol server on stdio (bounded file tools)\n"
	"  prepare   Make sure the kernel, initramfs, image and template are ready\n"
	"  oci       The OCI runtime (runc's command line) for Podman and containerd\n"
	"  doctor    Show what capsule found on this host: QEMU, acceleration, cache\n"
	"  version   Print the version\n"
	"\n"
	"Options:\n"
	"  -h, --help     Show this help (or `capsule COMMAND --help`)\n"
	"  -V, --version  Print the version\n"
	"\n"
	"Environment:\n"
	"  CAPSULE_ACCEL=auto|kvm|tcg  Acceleration when --accel is not given\n"
	"  CAPSULE_REQUIRE_KVM=1       Refuse to start VMs without KVM\n"
	"  CAPSULE_CACHE               Cache directory (default ~/.cache/capsule)\n"
	"  CAPSULE_HOME                Images and sandboxes (default ~/.local/share/capsule)\n"
	"  CAPSULE_KERNEL, CAPSULE_AGENT  Override the guest kernel / agent binary\n"
	"  CAPSULE_TEMPLATES=0         Always cold-boot (no template snapshots)\n"
	"\n"
	"Output: ls, inspect, template ls, doctor and diff take --json; exit codes\n"
	"and JSON shapes are in docs/cli.md. No colour is used.\n"
	"\n"
	"Durability: what exec, run and cp into a sandbox wrote is on the host's\n"
	"disk when they return; their --no-sync gives that up for a faster return.\n"
	"\n"
	"Example:\n"
	"  capsule run -- sh -c 'uname -a; id'\n";

void cap_cli_error(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("capsule: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

int cap_cli_parse_uint(const char *s, unsigned long min, unsigned long max,
		       unsigned long *out)
{
	char *end;
	if (!s || !*s || *s == '-' || *s == '+')
		return -EINVAL;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (errno || *end || v < min || v > max)
		return -EINVAL;
	*out = v;
	return 0;
}

int cap_cli_one_flag(int argc, char **argv, const char *usage, const char *flag,
		     char shortc, bool *set)
{
	const struct option opts[] = {
		{ flag, no_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	char shorts[4] = { 'h' };
	int c;
	if (shortc)
		shorts[1] = shortc;
	*set = false;
	optind = 1;
	while ((c = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
		if (c == 'F' || (shortc && c == shortc)) {
			*set = true;
		} else {
			fputs(usage, c == 'h' ? stdout : stderr);
			return c == 'h' ? 0 : CAP_EXIT_USAGE;
		}
	}
	return -1;
}

/* Descriptors 0-2 may be closed by whoever started us; make sure they are
 * not, so that no socket or signalfd opened later lands on them. */
static void guard_stdio(void)
{
	for (int fd = 0; fd < 3; fd++) {
		if (fcntl(fd, F_GETFD) >= 0 || errno != EBADF)
			continue;
		int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
		if (n >= 0 && n != fd) {
			dup2(n, fd);
			close(n);
		}
	}
}

/* capsule ram-holder TEMPLATE_DIR: hidden, started by a restore with its
 * listening socket as descriptor 3 (src/sandbox/sandbox-ramhold.c);
 * stderr is the template's ram-holder.log. */
static int ram_holder(int argc, char **argv)
{
	int on = 0;
	socklen_t len = sizeof(on);
	if (argc != 2 || getsockopt(3, SOL_SOCKET, SO_ACCEPTCONN, &on, &len) < 0 || !on) {
		cap_cli_error("ram-holder is internal: a restore starts it itself (docs/architecture.md, \"Shared template RAM\")");
		return 2;
	}
	cap_log_set(cap_log_stderr, "ram-holder");
	return cap_ramhold_serve(argv[1], 3);
}

int main(int argc, char **argv)
{
	guard_stdio();
	cap_log_set(cap_log_stderr, NULL);	/* front ends name themselves */
	/* Run as capsule-oci (the name an engine is given): the OCI runtime's
	 * command line, runc's global flags first. */
	const char *base = strrchr(argv[0], '/');
	if (strcmp(base ? base + 1 : argv[0], "capsule-oci") == 0)
		return cap_cli_oci(argc, argv);
	if (argc < 2) {
		fputs(usage, stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
		fputs(usage, stdout);
		return 0;
	}
	if (strcmp(cmd, "-V") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("capsule %s (protocol v1)\n", CAPSULE_VERSION);
		return 0;
	}
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} verbs[] = {
		{ "run", cap_cli_run }, { "doctor", cap_cli_doctor },
		{ "create", cap_cli_create }, { "start", cap_cli_start },
		{ "stop", cap_cli_stop }, { "exec", cap_cli_exec },
		{ "shell", cap_cli_shell }, { "inspect", cap_cli_inspect },
		{ "rm", cap_cli_rm }, { "ls", cap_cli_ls }, { "image", cap_cli_image },
		{ "source", cap_cli_source }, { "serve", cap_cli_serve },
		{ "shim", cap_cli_shim }, { "mcp", cap_cli_mcp },
		{ "template", cap_cli_template }, { "net", cap_cli_net },
		{ "cp", cap_cli_cp }, { "diff", cap_cli_diff }, { "merge", cap_cli_merge },
		{ "logs", cap_cli_logs }, { "prepare", cap_cli_prepare },
		{ "oci", cap_cli_oci }, { "ram-holder", ram_holder },
	};
	for (size_t i = 0; i < sizeof(verbs) / sizeof(verbs[0]); i++)
		if (strcmp(cmd, verbs[i].name) == 0)
			return verbs[i].fn(argc - 1, argv + 1);
	cap_cli_error("unknown command '%s'; see `capsule --help`", cmd);
	return 2;
}
