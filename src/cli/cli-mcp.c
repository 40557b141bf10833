/* capsule mcp: the MCP server on stdio. */
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "log.h"
#include "mcp.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule mcp --agent NAME [--peer PEER] [OPTIONS]\n"
	"\n"
	"Serve the Model Context Protocol on stdin/stdout (one JSON-RPC message per\n"
	"line; logs on stderr). Tools run in the sandbox of the identity (agent,\n"
	"peer): the peer is fixed with --peer, or set per request by the trusted\n"
	"orchestrator in params._meta[\"capsule/peer\"]; never by tool arguments.\n"
	"read_file is on; list_directory, write_file and run_command are off until\n"
	"enabled. See docs/mcp.md.\n"
	"\n"
	"Options:\n"
	"  --config FILE      JSON configuration (flags given here override it)\n"
	"  --agent NAME       Agent identity\n"
	"  --peer PEER        Serve one peer\n"
	"  --image IMAGE      Image of new sandboxes (default base)\n"
	"  --source DIR       Public data, read-only at /source\n"
	"  --workspace DIR    A private copy of DIR at /workspace in every new sandbox\n"
	"  --private-import DIR  Copy DIR/<agent>/<peer>/ into /work when an\n"
	"                     identity's sandbox first starts (once; see docs/serve.md)\n"
	"  --enable TOOL      Turn a tool on (repeatable)\n"
	"  --disable TOOL     Turn a tool off (repeatable)\n"
	"  --idle-pause S     Pause an idle VM after S seconds (default 30)\n"
	"  --idle-stop S      Stop it after S seconds (default 600)\n"
	"  --capacity N       Resident VMs (default 4)\n"
	"  --root             Commands run as root in the guest, not UID 1000 (config\n"
	"                     \"root\"; Docker inside: the VM is the only boundary)\n"
	"  --test-clock       Lifecycle time moves only by _test.advance (tests)\n"
	"  --cpus N --memory MIB --root-size MIB --work-size MIB\n"
	"                     Every sandbox's size (config \"size\"; default 1 vCPU,\n"
	"                     512 MiB, 256 MiB root, 512 MiB /work)\n"
	"\n"
	CAP_CLI_NET_HELP
	"  Flags replace the configuration's \"network\" as a whole. Refusals go to\n"
	"  each sandbox's net.log.\n";

int cap_cli_mcp(int argc, char **argv)
{
	enum { O_CONFIG = 400, O_AGENT, O_PEER, O_ENABLE, O_DISABLE, O_PAUSE, O_STOP, O_CAP, O_CLOCK,
	       O_WORKSPACE, O_IMPORT, O_ROOT };
	static const struct option opts[] = {
		{ "config", required_argument, NULL, O_CONFIG },
		{ "agent", required_argument, NULL, O_AGENT },
		{ "peer", required_argument, NULL, O_PEER },
		{ "image", required_argument, NULL, CAP_OPT_IMAGE },
		{ "source", required_argument, NULL, CAP_OPT_SOURCE },
		{ "workspace", required_argument, NULL, O_WORKSPACE },
		{ "private-import", required_argument, NULL, O_IMPORT },
		{ "enable", required_argument, NULL, O_ENABLE },
		{ "disable", required_argument, NULL, O_DISABLE },
		{ "idle-pause", required_argument, NULL, O_PAUSE },
		{ "idle-stop", required_argument, NULL, O_STOP },
		{ "capacity", required_argument, NULL, O_CAP },
		{ "test-clock", no_argument, NULL, O_CLOCK },
		{ "root", no_argument, NULL, O_ROOT },
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "root-size", required_argument, NULL, CAP_OPT_ROOT_SIZE },
		{ "work-size", required_argument, NULL, CAP_OPT_WORK_SIZE },
		CAP_CLI_NET_OPTS,
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct cap_mcp_cfg cfg;
	struct cap_err err = { 0 };
	struct cap_net_policy *net = xmalloc(sizeof(*net));
	bool net_flags = false;
	int c, k, rc = 2;

	cap_mcp_cfg_init(&cfg);
	/* The file first, so that flags override it. */
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage, stdout);
			rc = 0;
			goto out;
		}
		if (c == '?')
			goto usage;
		if (c == O_CONFIG && cap_mcp_cfg_load(&cfg, optarg, &err) < 0) {
			cap_cli_error("%s", err.msg);
			goto out;
		}
	}
	if (optind != argc)
		goto usage;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		enum cap_mcp_tool t;
		unsigned long v;
		char *end;
		double s;
		switch (c) {
		case O_AGENT: free(cfg.owned_agent); cfg.owned_agent = xstrdup(optarg); break;
		case O_PEER: free(cfg.owned_peer); cfg.owned_peer = xstrdup(optarg); break;
		case CAP_OPT_IMAGE: free(cfg.owned_image); cfg.owned_image = xstrdup(optarg); break;
		case CAP_OPT_SOURCE: free(cfg.owned_source); cfg.owned_source = xstrdup(optarg); break;
		case O_WORKSPACE: free(cfg.owned_workspace); cfg.owned_workspace = xstrdup(optarg); break;
		case O_IMPORT: free(cfg.owned_private_import); cfg.owned_private_import = xstrdup(optarg); break;
		case O_ENABLE:
		case O_DISABLE:
			if (cap_mcp_tool_parse(optarg, &t) < 0) {
				cap_cli_error("no tool '%s' (read_file, list_directory, write_file, run_command)", optarg);
				goto out;
			}
			cfg.tools[t] = c == O_ENABLE;
			break;
		case O_PAUSE:
		case O_STOP:
			s = strtod(optarg, &end);
			if (*end || s < 0) {
				cap_cli_error("'%s' is not a number of seconds", optarg);
				goto out;
			}
			*(c == O_PAUSE ? &cfg.ctl.lc.idle_pause_ms : &cfg.ctl.lc.idle_stop_ms) = (int64_t)(s * 1000);
			break;
		case O_CAP:
			if (cap_cli_parse_uint(optarg, 1, 256, &v) < 0) {
				cap_cli_error("--capacity '%s' is not a number from 1 to 256", optarg);
				goto out;
			}
			cfg.ctl.lc.capacity = (unsigned)v;
			break;
		case O_CLOCK: cfg.ctl.manual_clock = true; break;
		case O_ROOT: cfg.ctl.tools_root = true; break;
		case CAP_OPT_CPUS:
		case CAP_OPT_MEMORY:
		case CAP_OPT_ROOT_SIZE:
		case CAP_OPT_WORK_SIZE:
			/* The bounds are checked below, with the file's. */
			if (cap_cli_parse_uint(optarg, 1, UINT_MAX, &v) < 0) {
				cap_cli_error("'%s' is not a positive number (--cpus, --memory, --root-size, --work-size)", optarg);
				goto out;
			}
			*(c == CAP_OPT_CPUS ? &cfg.ctl.size.cpus : c == CAP_OPT_MEMORY ? &cfg.ctl.size.memory_mib
				: c == CAP_OPT_ROOT_SIZE ? &cfg.ctl.size.root_mib : &cfg.ctl.size.work_mib) = (unsigned)v;
			break;
		default:
			if (!net_flags)
				cap_net_policy_init(net);
			if ((k = cap_cli_net_opt(net, c, optarg)) < 0)
				goto out;
			net_flags |= k > 0;
			break;
		}
	}
	if (cap_ctl_size_cfg_check(&cfg.ctl, &err) < 0) {
		cap_cli_error("%s", err.msg);
		goto out;
	}
	if (net_flags) {
		free(cfg.owned_network);
		cfg.owned_network = net;
		net = NULL;
	}
	rc = 0;
	cap_log_set(cap_log_stderr, "mcp");
	if (cap_mcp_run(&cfg, &err) < 0) {
		cap_cli_error("%s", err.msg);
		rc = CAP_EXIT_FAILURE;
	}
	goto out;
usage:
	fputs(usage, stderr);
out:
	free(net);
	cap_mcp_cfg_fini(&cfg);
	return rc;
}
