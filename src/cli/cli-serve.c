/* capsule serve: the controller behind a JSON-RPC 2.0 unix socket. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "paths.h"
#include "serve.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule serve [OPTIONS]\n"
	"\n"
	"Serve JSON-RPC 2.0 (one message per line) on a unix socket for a trusted\n"
	"orchestrator: every call names an identity {agent, peer}; each identity\n"
	"gets its own sandbox, created on its first tool call, paused when idle,\n"
	"stopped later, restarted with its disks on the next call. See docs/serve.md.\n"
	"The first tool call prepares what sandboxes need (kernel, initramfs, image,\n"
	"template) with progress notifications; the prepare method does it at will.\n"
	"A socket passed by a service manager (LISTEN_PID, LISTEN_FDS=1: systemd\n"
	"socket activation) is used instead of --socket.\n"
	"SIGTERM or SIGINT stops every VM and exits.\n"
	"\n"
	"Options:\n"
	"  --socket PATH       Socket (default $CAPSULE_HOME/serve.sock), mode 0600\n"
	"  --image IMAGE       Image of new sandboxes (default base)\n"
	"  --source DIR        Public data projected at /source in every sandbox\n"
	"  --workspace DIR     A private copy of DIR at /workspace in every new\n"
	"                      sandbox (made when the identity's sandbox is created)\n"
	"  --private-import DIR  Copy DIR/<agent>/<peer>/ into /work when an\n"
	"                      identity's sandbox first starts (once; links and\n"
	"                      special files refused, existing files kept)\n"
	"  --transfer-dir DIR  Host directory upload's \"from\" and download's \"to\"\n"
	"                      may name (repeatable; none: only inline base64)\n"
	"  --idle-pause S      Pause a VM S seconds after its last call (default 30)\n"
	"  --idle-stop S       Stop it S seconds after its last call (default 600)\n"
	"  --capacity N        Resident VMs, paused ones included (default 4)\n"
	"  --stop-grace S      Seconds a stopping guest gets to sync (default 10)\n"
	"  --warm-pool N       Keep N started sandboxes ready for new identities,\n"
	"                      each warmed by one command (they count against\n"
	"                      --capacity; default 0, off); --spares N is the same\n"
	"  --metrics ADDR      Serve Prometheus metrics (GET /metrics) on ADDR:\n"
	"                      127.0.0.1:PORT, [::1]:PORT, HOST:PORT, or a unix\n"
	"                      socket path holding a '/' (mode 0600)\n"
	"  --root              Every sandbox's commands run as root in its guest, not\n"
	"                      as UID 1000 (Docker inside; the VM is then the only\n"
	"                      boundary): the server's choice, never an identity's\n"
	"  --test-clock        Lifecycle time moves only by the _test.advance method\n"
	"\n"
	"Sizes (docs/serve.md, \"Sizes\"): every identity's sandbox gets\n"
	"  --cpus N --memory MIB --root-size MIB --work-size MIB\n"
	"                      unless it was given its own (set_size, or exec's\n"
	"                      size); defaults 1 vCPU, 512 MiB, 256 MiB root, 512 MiB\n"
	"                      /work\n"
	"  --max-cpus N --max-memory MIB --max-root-size MIB --max-work-size MIB\n"
	"                      The most an identity may ask for (default: what the\n"
	"                      host has); a size beyond is refused at that call\n"
	"\n"
	CAP_CLI_NET_HELP
	"  The policy is every sandbox's: one made under another follows it from\n"
	"  its next start. Refusals go to each sandbox's net.log.\n";

/* An existing directory given by option opt, resolved (a new string). */
static char *existing_dir(const char *opt, const char *arg)
{
	struct cap_err err = { 0 };
	char *real;
	if (cap_resolve_dir(opt, arg, &real, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return NULL;
	}
	return real;
}

static int seconds(const char *opt, const char *arg, double *out)
{
	char *end;
	double v = strtod(arg, &end);
	if (*end || v < 0 || v > 86400 * 365) {
		cap_cli_error("%s '%s' is not a number of seconds", opt, arg);
		return -1;
	}
	*out = v;
	return 0;
}

int cap_cli_serve(int argc, char **argv)
{
	enum { O_SOCKET = 300, O_PAUSE, O_STOP, O_CAP, O_GRACE, O_CLOCK, O_POOL, O_WORKSPACE, O_IMPORT,
	       O_TRANSFER, O_SCHEMA, O_MAX_CPUS, O_MAX_MEMORY, O_MAX_ROOT, O_MAX_WORK, O_METRICS, O_ROOT };
	static const struct option opts[] = {
		{ "socket", required_argument, NULL, O_SOCKET },
		{ "image", required_argument, NULL, CAP_OPT_IMAGE },
		{ "source", required_argument, NULL, CAP_OPT_SOURCE },
		{ "idle-pause", required_argument, NULL, O_PAUSE },
		{ "idle-stop", required_argument, NULL, O_STOP },
		{ "capacity", required_argument, NULL, O_CAP },
		{ "stop-grace", required_argument, NULL, O_GRACE },
		{ "test-clock", no_argument, NULL, O_CLOCK },
		{ "warm-pool", required_argument, NULL, O_POOL },
		{ "spares", required_argument, NULL, O_POOL },
		{ "workspace", required_argument, NULL, O_WORKSPACE },
		{ "private-import", required_argument, NULL, O_IMPORT },
		{ "transfer-dir", required_argument, NULL, O_TRANSFER },
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "root-size", required_argument, NULL, CAP_OPT_ROOT_SIZE },
		{ "work-size", required_argument, NULL, CAP_OPT_WORK_SIZE },
		{ "max-cpus", required_argument, NULL, O_MAX_CPUS },
		{ "max-memory", required_argument, NULL, O_MAX_MEMORY },
		{ "max-root-size", required_argument, NULL, O_MAX_ROOT },
		{ "max-work-size", required_argument, NULL, O_MAX_WORK },
		{ "metrics", required_argument, NULL, O_METRICS },
		{ "root", no_argument, NULL, O_ROOT },
		{ "schema", no_argument, NULL, O_SCHEMA },	/* not in usage: for clients' checks */
		CAP_CLI_NET_OPTS,
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct cap_controller_cfg cfg;
	const char *socket_path = NULL, *metrics = NULL;
	struct cap_err err = { 0 };
	_cleanup_free_ struct cap_net_policy *net = xmalloc(sizeof(*net));
	_cleanup_free_ char *workspace = NULL, *import = NULL;
	_cleanup_free_ const char **given = xcalloc((size_t)argc + 1, sizeof(char *));
	size_t ngiven = 0;
	char **transfer = NULL;
	unsigned long v;
	double s;
	int c, k, rc = 2;
	/* The size options: which option sets which field. */
	const struct {
		int opt;
		const char *name;
		unsigned *field;
	} sizes[] = {
		{ CAP_OPT_CPUS, "--cpus", &cfg.size.cpus },
		{ CAP_OPT_MEMORY, "--memory", &cfg.size.memory_mib },
		{ CAP_OPT_ROOT_SIZE, "--root-size", &cfg.size.root_mib },
		{ CAP_OPT_WORK_SIZE, "--work-size", &cfg.size.work_mib },
		{ O_MAX_CPUS, "--max-cpus", &cfg.size_max.cpus },
		{ O_MAX_MEMORY, "--max-memory", &cfg.size_max.memory_mib },
		{ O_MAX_ROOT, "--max-root-size", &cfg.size_max.root_mib },
		{ O_MAX_WORK, "--max-work-size", &cfg.size_max.work_mib },
	};

	cap_controller_cfg_init(&cfg);
	cap_net_policy_init(net);
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if ((k = cap_cli_net_opt(net, c, optarg)) < 0)
			return 2;
		if (k > 0)
			continue;
		for (k = 0; k < (int)CAP_ARRAY_SIZE(sizes) && sizes[k].opt != c; k++)
			;
		if (k < (int)CAP_ARRAY_SIZE(sizes)) {
			/* The bounds are checked below, all together. */
			if (cap_cli_parse_uint(optarg, 1, UINT_MAX, &v) < 0) {
				cap_cli_error("%s '%s' is not a positive number", sizes[k].name, optarg);
				return 2;
			}
			*sizes[k].field = (unsigned)v;
			continue;
		}
		switch (c) {
		case O_SOCKET: socket_path = optarg; break;
		case O_METRICS: metrics = optarg; break;
		case O_ROOT: cfg.tools_root = true; break;
		case O_WORKSPACE:
			free(workspace);
			if (!(workspace = existing_dir("--workspace", optarg)))
				return 2;
			break;
		case O_IMPORT:
			free(import);
			if (!(import = existing_dir("--private-import", optarg)))
				return 2;
			break;
		case O_TRANSFER: given[ngiven++] = optarg; break;
		case CAP_OPT_IMAGE: cfg.image = optarg; break;
		case CAP_OPT_SOURCE: cfg.source = optarg; break;
		case O_PAUSE:
			if (seconds("--idle-pause", optarg, &s) < 0)
				return 2;
			cfg.lc.idle_pause_ms = (int64_t)(s * 1000);
			break;
		case O_STOP:
			if (seconds("--idle-stop", optarg, &s) < 0)
				return 2;
			cfg.lc.idle_stop_ms = (int64_t)(s * 1000);
			break;
		case O_GRACE:
			if (seconds("--stop-grace", optarg, &s) < 0)
				return 2;
			cfg.stop_grace_ms = (int)(s * 1000);
			break;
		case O_CAP:
			if (cap_cli_parse_uint(optarg, 1, 256, &v) < 0) {
				cap_cli_error("--capacity '%s' is not a number from 1 to 256", optarg);
				return 2;
			}
			cfg.lc.capacity = (unsigned)v;
			break;
		case O_CLOCK: cfg.manual_clock = true; break;
		case O_POOL:
			if (cap_cli_parse_uint(optarg, 0, 64, &v) < 0) {
				cap_cli_error("--warm-pool '%s' is not a number from 0 to 64", optarg);
				return 2;
			}
			cfg.warm_pool = (unsigned)v;
			break;
		case O_SCHEMA: {
			/* The method table as JSON (docs/serve.md), the clients'
			 * tests check themselves against it. */
			json_t *j = cap_serve_schema();
			json_dumpf(j, stdout, JSON_INDENT(2));
			fputc('\n', stdout);
			json_decref(j);
			return 0;
		}
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind != argc) {
		fputs(usage, stderr);
		return 2;
	}
	if (cap_ctl_size_cfg_check(&cfg, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return 2;
	}
	if (net->enabled)
		cfg.network = net;
	if (cap_transfer_dirs_resolve(given, ngiven, &transfer, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return rc;
	}
	cfg.workspace = workspace;
	cfg.private_import = import;
	cfg.transfer_dirs = (const char *const *)transfer;
	cfg.ntransfer_dirs = ngiven;
	cap_log_set(cap_log_stderr, "serve");
	rc = 0;
	if (cap_serve_run(&cfg, socket_path, metrics, &err) < 0) {
		cap_cli_error("%s", err.msg);
		rc = CAP_EXIT_FAILURE;
	}
	cap_transfer_dirs_free(transfer);
	return rc;
}
