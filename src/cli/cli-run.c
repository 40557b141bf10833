/* capsule run: one command in a fresh microVM, output streamed live, the
 * VM removed on every path (normal end, failure, Ctrl-C, SIGTERM). */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine-probe.h"
#include "log.h"
#include "named.h"
#include "paths.h"
#include "policy.h"
#include "sandbox.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule run [OPTIONS] -- COMMAND [ARG...]\n"
	"\n"
	"Boot a fresh microVM, run COMMAND in it as UID 1000, stream its stdout and\n"
	"stderr as they are produced, then stop and remove the VM. Exits with the\n"
	"command's exit code (128+N when killed by signal N, 124 on timeout, 125 when\n"
	"capsule itself fails, 126/127 when the command cannot run or is not found,\n"
	"2 for a usage error such as a size out of bounds).\n"
	"Standard input is forwarded when it is not a terminal, or with -i.\n"
	"A VM kept ready by `capsule spares` is taken when it has this run's shape\n"
	"(-v says so; CAPSULE_SPARES=0: never).\n"
	"\n"
	"Options:\n"
	"  --cpus N            Virtual CPUs, 1 to 16 and at most the host's online\n"
	"                      CPUs (default 1)\n"
	"  --memory MIB        Guest memory in MiB, 128 up to the host's less a reserve\n"
	"                      (the larger of 512 MiB and a tenth; default 512)\n"
	"  --force-size        Allow more vCPUs or memory than the host has\n"
	"  --root              Run COMMAND as root in the guest, not UID 1000 (the VM\n"
	"                      is then the only boundary)\n"
	"  --timeout S         Wall-clock limit in seconds, 0 for none (default 30);\n"
	"                      the whole process group is killed when it expires\n"
	"  --output-cap BYTES  Limit on stdout+stderr (default 262144); the rest is\n"
	"                      dropped after a truncation marker\n"
	"  --pids-max N        Processes the command and what it starts may have at\n"
	"                      once (its cgroup's pids.max; default 1024)\n"
	"  --accel MODE        auto, kvm or tcg (default auto; see `capsule doctor`)\n"
	"  -e, --env NAME=VAL  Set an environment variable (repeatable)\n"
	"  -w, --workdir DIR   Working directory in the guest (default /work)\n"
	"  -i, --interactive   Forward standard input even from a terminal\n"
	"  --no-sync           Accepted as on exec; changes nothing here: a run VM\n"
	"                      has no disk that outlives it, so nothing is flushed\n"
	"  --source DIR        Mount a validated read-only copy of DIR at /source\n"
	"                      (see `capsule create --help` for the rules)\n"
	"  --console-log FILE  Keep the guest's serial console in FILE\n"
	"  -q, --quiet         Do not print the acceleration note\n"
	"  -v, --verbose       Say how the VM started (template restore or cold boot),\n"
	"                      its network policy and route, each connection, and\n"
	"                      at the end how long the command ran, and where the\n"
	"                      time went: the start's phases, the command as the\n"
	"                      host saw it, the teardown.\n"
	"                      Docker's -v HOST:GUEST is refused: capsule has no bind\n"
	"                      mounts (use --source DIR, or a named sandbox with\n"
	"                      --workspace DIR or `capsule cp`)\n"
	"  -h, --help          Show this help\n"
	"\n"
	CAP_CLI_NET_HELP
	"  Refused connections are logged on stderr (\"capsule net: refused ...\").\n";

/* -v: where the time of the run went, in one line (ms). */
static void timings(const struct cap_sandbox_times *t, int64_t command_ns,
		    int64_t teardown_ns)
{
	if (t->spare) {
		cap_cli_error("start %.1f ms: prepare %.1f, spare %.1f; command %.1f ms; teardown %.1f ms", t->total / 1e3,
			      t->prepare / 1e3, t->spare / 1e3, command_ns / 1e6, teardown_ns / 1e6);
		return;
	}
	char restore[32] = "";
	if (t->restore)
		snprintf(restore, sizeof(restore), ", restore %.1f", t->restore / 1e3);
	cap_cli_error("start %.1f ms: prepare %.1f, jail %.1f, qemu %.1f%s, %s %.1f; command %.1f ms; teardown %.1f ms",
		      t->total / 1e3, t->prepare / 1e3, t->jail / 1e3, t->qemu / 1e3, restore,
		      t->restore ? "agent" : "boot", t->agent / 1e3, command_ns / 1e6, teardown_ns / 1e6);
}

int cap_cli_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "timeout", required_argument, NULL, CAP_OPT_TIMEOUT },
		{ "output-cap", required_argument, NULL, CAP_OPT_OUTPUT_CAP },
		{ "pids-max", required_argument, NULL, CAP_OPT_PIDS_MAX },
		{ "accel", required_argument, NULL, CAP_OPT_ACCEL },
		{ "console-log", required_argument, NULL, CAP_OPT_CONSOLE },
		{ "source", required_argument, NULL, CAP_OPT_SOURCE },
		{ "force-size", no_argument, NULL, CAP_OPT_FORCE_SIZE },
		{ "root", no_argument, NULL, CAP_OPT_ROOT },
		{ "no-sync", no_argument, NULL, CAP_OPT_NO_SYNC },
		CAP_CLI_NET_OPTS,
		{ "env", required_argument, NULL, 'e' },
		{ "workdir", required_argument, NULL, 'w' },
		{ "interactive", no_argument, NULL, 'i' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct cap_sandbox_opts so;
	struct cap_cli_exec x;
	static struct cap_sandbox_spec spec;	/* large: not on the stack */
	struct cap_net_policy *net = xmalloc(sizeof(*net));
	const char *source = NULL;
	bool verbose = false, force_size = false, root = false;
	unsigned long v;
	int c, k;

	cap_sandbox_opts_init(&so);
	cap_cli_exec_init(&x);
	x.ephemeral = true;
	cap_net_policy_init(net);
	if (cap_cli_volume_flag(argc, argv)) {
		free(net);
		return CAP_EXIT_USAGE;
	}
	optind = 1;
	while ((c = getopt_long(argc, argv, "+e:w:iqvh", opts, NULL)) != -1) {
		if ((k = cap_cli_exec_opt(&x, c, optarg)) < 0 || (k == 0 && (k = cap_cli_net_opt(net, c, optarg)) < 0)) {
			free(net);
			return 2;
		}
		if (k > 0)
			continue;
		switch (c) {
		/* The bounds are the library's (cap_named_check_size). */
		case CAP_OPT_CPUS:
			if (cap_cli_parse_uint(optarg, 0, UINT_MAX, &v) < 0) {
				cap_cli_error("--cpus '%s' is not a number", optarg);
				return CAP_EXIT_USAGE;
			}
			so.cpus = (unsigned)v;
			break;
		case CAP_OPT_MEMORY:
			if (cap_cli_parse_uint(optarg, 0, UINT_MAX, &v) < 0) {
				cap_cli_error("--memory '%s' is not a size in MiB", optarg);
				return CAP_EXIT_USAGE;
			}
			so.memory_mib = (unsigned)v;
			break;
		case CAP_OPT_FORCE_SIZE:
			force_size = true;
			break;
		case CAP_OPT_ROOT:
			root = true;
			break;
		case CAP_OPT_ACCEL:
			if (cap_engine_accel_parse(optarg, &so.accel) < 0) {
				cap_cli_error("--accel '%s' is not one of auto, kvm, tcg", optarg);
				return 2;
			}
			break;
		case CAP_OPT_CONSOLE:
			so.console_log = optarg;
			break;
		case CAP_OPT_SOURCE:
			source = optarg;
			break;
		case 'v':
			verbose = x.verbose = true;
			break;
		case 'h':
			free(net);
			fputs(usage, stdout);
			return 0;
		default:
			free(net);
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		free(net);
		cap_cli_error("run needs a command: capsule run [OPTIONS] -- COMMAND [ARG...]");
		return 2;
	}
	if (cap_cli_volume_refused(argv[optind])) {
		free(net);
		return CAP_EXIT_USAGE;
	}
	x.req.argv = argv + optind;
	x.req.argc = (uint32_t)(argc - optind);

	struct cap_sandbox *sb = NULL;
	struct cap_err err = { 0 };
	if (cap_named_check_size(so.cpus, so.memory_mib, 0, 0, force_size, &err) < 0) {
		free(net);
		cap_cli_error("%s", err.msg);
		return err.code == ERANGE ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
	}
	_cleanup_free_ char *projdir = NULL, *projimg = NULL;
	if (source) {
		/* The projection lives only until QEMU has opened it. */
		struct cap_projection_limits lim;
		struct cap_projection_info info;
		_cleanup_free_ char *cache = cap_cache_dir();
		_cleanup_free_ char *tmp = xasprintf("%s/tmp", cache);
		projdir = xasprintf("%s/run-XXXXXX", tmp);
		if (cap_mkdir_p(tmp, 0700) < 0 || !mkdtemp(projdir)) {
			cap_cli_error("cannot create a directory under %s: %s", tmp, strerror(errno));
			return CAP_EXIT_FAILURE;
		}
		projimg = xasprintf("%s/source.erofs", projdir);
		if (cap_projection_limits_init(&lim, &err) < 0 ||
		    cap_projection_build(source, &lim, projimg, &info, &err) < 0) {
			cap_remove_tree(projdir);
			free(net);
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
	}
	cap_sandbox_spec_oneshot(&spec, projimg);
	cap_sandbox_spec_tools_root(&spec, root);
	cap_sandbox_spec_network(&spec, net);
	free(net);
	so.spec = &spec;
	so.net_verbose = verbose;
	so.use_spare = true;	/* when `capsule spares` keeps one of this shape */
	/* A one-shot VM keeps nothing: its CA, for secrets, is made in
	 * memory for this run (so its placeholders are this run's). */
	so.ca_dir = NULL;
	if (verbose) {
		_cleanup_free_ char *d = cap_net_policy_describe(&spec.net);
		cap_cli_error("network: %s", d);
		if (spec.net.enabled)
			cap_cli_error("network route: %s", cap_cli_net_route());
	}
	int booted = cap_sandbox_boot(&so, &sb, &err);
	if (projdir)
		cap_remove_tree(projdir);
	if (booted < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	/* A template that could not be used is worth one line: the run goes
	 * on, cold-booted. */
	if (verbose || strncmp(cap_sandbox_boot_note(sb), "cold boot (", 11) == 0)
		cap_cli_error("%s", cap_sandbox_boot_note(sb));
	/* A jail this host cannot give in full is never silent. */
	if (*cap_sandbox_jail_note(sb))
		cap_cli_error("warning: QEMU runs without: %s; set CAPSULE_REQUIRE_JAIL=1 to refuse instead",
			      cap_sandbox_jail_note(sb));
	const struct cap_accel_choice *ac = cap_sandbox_accel(sb);
	if (!x.quiet && ac->accel == CAP_ACCEL_TCG)
		cap_cli_error("using TCG software emulation (%s); not a security boundary, see `capsule doctor`",
			      ac->reason);
	int64_t t_cmd = cap_now_ns();
	int status = cap_cli_stream(sb, &x);
	int64_t t_down = cap_now_ns();
	/* A one-shot VM keeps nothing: no disk of it outlives it, so there
	 * is nothing for a clean shutdown to flush, and the teardown is a
	 * kill (cap_sandbox_free), not a wait for the guest to power off. */
	if (x.gave_up)
		cap_cli_error("destroying the VM (a one-shot VM keeps nothing)");
	struct cap_sandbox_times st = *cap_sandbox_times(sb);
	cap_sandbox_free(sb);
	if (verbose)
		timings(&st, t_down - t_cmd, cap_now_ns() - t_down);
	return status;
}

static const char spares_usage[] =
	"Usage: capsule spares [--count K] [--cpus N] [--memory MIB] [--accel MODE]\n"
	"\n"
	"Keep K VMs ready for `capsule run`, each restored from its template and\n"
	"warmed by one `true`, so that a run's command starts at once. A run takes\n"
	"a spare when it needs nothing a spare lacks: no --source, no network, not\n"
	"--root, no --console-log, and the --cpus, --memory and --accel given here.\n"
	"Each spare serves one run, then its VM goes and another is started.\n"
	"Runs in the foreground until SIGINT or SIGTERM, then ends every spare's\n"
	"VM (those in use too). One per CAPSULE_HOME (its spares/ directory holds\n"
	"the socket runs ask). What it does is logged on stderr.\n"
	"\n"
	"Options:\n"
	"  --count K      Spares kept ready, 1 to 64 (default 1); each holds what an\n"
	"                 idle VM holds (`make bench` row (p))\n"
	"  --cpus N       vCPUs of the spares (default 1, as capsule run's)\n"
	"  --memory MIB   Memory of the spares (default 512, as capsule run's)\n"
	"  --accel MODE   auto, kvm or tcg (default auto)\n"
	"  -h, --help     Show this help\n"
	"\n"
	"Environment: CAPSULE_SPARES=0 makes capsule run never take one.\n";

int cap_cli_spares(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "count", required_argument, NULL, 'k' },
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "accel", required_argument, NULL, CAP_OPT_ACCEL },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct cap_sandbox_opts so;
	unsigned long v, count = 1;
	int c;
	cap_sandbox_opts_init(&so);
	optind = 1;
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'k':
			if (cap_cli_parse_uint(optarg, 1, 64, &count) < 0) {
				cap_cli_error("--count '%s' is not a number from 1 to 64", optarg);
				return CAP_EXIT_USAGE;
			}
			break;
		case CAP_OPT_CPUS:
		case CAP_OPT_MEMORY:
			if (cap_cli_parse_uint(optarg, 0, UINT_MAX, &v) < 0) {
				cap_cli_error("--%s '%s' is not a number", c == CAP_OPT_CPUS ? "cpus" : "memory", optarg);
				return CAP_EXIT_USAGE;
			}
			*(c == CAP_OPT_CPUS ? &so.cpus : &so.memory_mib) = (unsigned)v;
			break;
		case CAP_OPT_ACCEL:
			if (cap_engine_accel_parse(optarg, &so.accel) < 0) {
				cap_cli_error("--accel '%s' is not one of auto, kvm, tcg", optarg);
				return CAP_EXIT_USAGE;
			}
			break;
		case 'h':
			fputs(spares_usage, stdout);
			return 0;
		default:
			fputs(spares_usage, stderr);
			return CAP_EXIT_USAGE;
		}
	}
	if (optind < argc) {
		cap_cli_error("spares takes no arguments ('%s'): capsule spares [--count K]", argv[optind]);
		return CAP_EXIT_USAGE;
	}
	struct cap_err err = { 0 };
	if (cap_named_check_size(so.cpus, so.memory_mib, 0, 0, false, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return err.code == ERANGE ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
	}
	const char *templates = getenv("CAPSULE_TEMPLATES");
	if (templates && strcmp(templates, "0") == 0) {
		cap_cli_error("spares are restored from templates, and CAPSULE_TEMPLATES=0 turns them off: unset it");
		return CAP_EXIT_USAGE;
	}
	/* The shape capsule run has without options (cap_cli_run). */
	static struct cap_sandbox_spec spec;
	cap_sandbox_spec_oneshot(&spec, NULL);
	so.spec = &spec;
	so.ca_dir = NULL;
	static const int handled[] = { SIGINT, SIGTERM, SIGHUP };
	sigset_t sigs;
	int sfd = cap_signalfd(handled, CAP_ARRAY_SIZE(handled), &sigs);
	if (sfd < 0) {
		sigprocmask(SIG_UNBLOCK, &sigs, NULL);
		cap_cli_error("spares: signalfd: %s", strerror(-sfd));
		return CAP_EXIT_FAILURE;
	}
	cap_log_set(cap_log_stderr, "spares");
	int r = cap_spare_serve(&so, (unsigned)count, sfd, &err);
	close(sfd);
	if (r < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	return 0;
}
