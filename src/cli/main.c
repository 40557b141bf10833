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

/* The help, in two parts around its "Output:" paragraph, which
 * print_usage makes from the verb table. */
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
	"  code      A project's sandbox for a coding agent: its copy, its state kept\n"
	"  pause     Freeze a running sandbox   resume    Continue a paused one\n"
	"  snapshot  Save a running sandbox (memory, processes, disks); list, remove\n"
	"  fork      Branch a running sandbox N ways, processes and all\n"
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
	"  spares    Keep VMs restored and warmed for capsule run to start at once\n"
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
	"\n";
static const char usage_tail[] =
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

/* The verbs, in the order of the help's "Commands:". json says which
 * take --json: "" the verb itself, else those of its sub-verbs that do,
 * separated by spaces; NULL none. The help's "Output:" paragraph is made
 * from it; tests/integration/test-cli-json.py checks it against each
 * verb's --help, what the verb accepts, docs/cli.md and the man pages. */
static const struct {
	const char *name;
	int (*fn)(int, char **);
	const char *json;
} verbs[] = {
	{ "run", cap_cli_run, NULL }, { "create", cap_cli_create, NULL },
	{ "start", cap_cli_start, NULL }, { "stop", cap_cli_stop, NULL },
	{ "exec", cap_cli_exec, NULL }, { "shell", cap_cli_shell, NULL },
	{ "code", cap_cli_code, NULL },
	{ "pause", cap_cli_pause, NULL }, { "resume", cap_cli_resume, NULL },
	{ "snapshot", cap_cli_snapshot, "ls inspect" }, { "fork", cap_cli_fork, "" },
	{ "ls", cap_cli_ls, "" }, { "inspect", cap_cli_inspect, "" },
	{ "logs", cap_cli_logs, NULL }, { "rm", cap_cli_rm, NULL },
	{ "cp", cap_cli_cp, NULL }, { "diff", cap_cli_diff, "" },
	{ "merge", cap_cli_merge, NULL }, { "net", cap_cli_net, NULL },
	{ "image", cap_cli_image, "check outdated ls inspect" },
	{ "template", cap_cli_template, "ls inspect" },
	{ "source", cap_cli_source, NULL }, { "serve", cap_cli_serve, NULL },
	{ "spares", cap_cli_spares, NULL }, { "mcp", cap_cli_mcp, NULL }, { "prepare", cap_cli_prepare, "" },
	{ "oci", cap_cli_oci, NULL }, { "doctor", cap_cli_doctor, "" },
	/* Internal: not in the help. */
	{ "shim", cap_cli_shim, NULL }, { "ram-holder", ram_holder, NULL },
};
#define NVERBS (sizeof(verbs) / sizeof(verbs[0]))

/* Append word (of len bytes) to the paragraph being printed on f, at
 * column *col, breaking the line before it would pass 75 columns. */
static void wrap_word(FILE *f, int *col, const char *word, int len)
{
	if (*col > 0 && *col + 1 + len > 75) {
		fputc('\n', f);
		*col = 0;
	} else if (*col > 0) {
		fputc(' ', f);
		(*col)++;
	}
	fprintf(f, "%.*s", len, word);
	*col += len;
}

static void wrap_text(FILE *f, int *col, const char *text)
{
	for (const char *p = text; *p;) {
		size_t n = strcspn(p, " ");
		if (n)
			wrap_word(f, col, p, (int)n);
		p += n + strspn(p + n, " ");
	}
}

/* The help: the "Output:" paragraph names every verb of the table that
 * takes --json ("image ls" for a sub-verb), so that it cannot drift. */
static void print_usage(FILE *f)
{
	const char *names[2 * NVERBS];
	char owned[2 * NVERBS][64];
	size_t n = 0;
	for (size_t i = 0; i < NVERBS && n < 2 * NVERBS; i++) {
		const char *j = verbs[i].json;
		if (!j)
			continue;
		if (!*j) {
			names[n++] = verbs[i].name;
			continue;
		}
		while (*j && n < 2 * NVERBS) {
			size_t len = strcspn(j, " ");
			snprintf(owned[n], sizeof(owned[n]), "%s %.*s", verbs[i].name, (int)len, j);
			names[n] = owned[n];
			n++;
			j += len + strspn(j + len, " ");
		}
	}
	fputs(usage, f);
	int col = 0;
	wrap_text(f, &col, "Output:");
	for (size_t i = 0; i < n; i++) {
		/* "a, b and c", a sub-verb's two words kept on one line. */
		char item[80];
		if (i + 1 == n && n > 1)
			wrap_word(f, &col, "and", 3);
		int len = snprintf(item, sizeof(item), "%s%s", names[i], i + 2 < n ? "," : "");
		wrap_word(f, &col, item, len);
	}
	wrap_text(f, &col, "take --json; exit codes and JSON shapes are in docs/cli.md. No colour is used.");
	fputc('\n', f);
	fputs(usage_tail, f);
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
		print_usage(stderr);
		return 2;
	}
	const char *cmd = argv[1];
	if (strcmp(cmd, "-h") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "help") == 0) {
		print_usage(stdout);
		return 0;
	}
	if (strcmp(cmd, "-V") == 0 || strcmp(cmd, "--version") == 0 || strcmp(cmd, "version") == 0) {
		printf("capsule %s (protocol v1)\n", CAPSULE_VERSION);
		return 0;
	}
	for (size_t i = 0; i < NVERBS; i++)
		if (strcmp(cmd, verbs[i].name) == 0)
			return verbs[i].fn(argc - 1, argv + 1);
	cap_cli_error("unknown command '%s'; see `capsule --help`", cmd);
	return 2;
}
