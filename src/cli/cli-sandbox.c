/* Named sandboxes: create, start, stop, exec, shell, inspect, rm, ls. */
#include <errno.h>
#include <jansson.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "controller.h"
#include "jsonrpc.h"
#include "layout.h"
#include "named.h"
#include "serve.h"
#include "store.h"
#include "tree.h"
#include "util.h"

/* Parse "-h/--help" or complain about anything else, for verbs that take
 * only a name. Returns the name, or NULL after printing (*rc set). */
static const char *one_name(int argc, char **argv, const char *usage, int *rc)
{
	if (argc == 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage, stdout);
		*rc = 0;
		return NULL;
	}
	if (argc != 2 || argv[1][0] == '-') {
		fputs(usage, stderr);
		*rc = 2;
		return NULL;
	}
	return argv[1];
}

static int fail(const struct cap_err *err)
{
	cap_cli_error("%s", err->msg);
	return CAP_EXIT_FAILURE;
}

static const char create_usage[] =
	"Usage: capsule create NAME [--image IMAGE] [--source DIR] [--cpus N]\n"
	"                           [--memory MIB] [--root-size MIB] [--work-size MIB]\n"
	"                           [--workspace DIR [--workspace-size MIB]]\n"
	"                           [--force-size] [--root] [-q] [NETWORK FLAGS]\n"
	"       capsule create NAME --from SNAPSHOT\n"
	"\n"
	"Create a persistent sandbox: a writable root over IMAGE (a name or\n"
	"sha256:digest, default base) and a private /work disk that keeps its\n"
	"content until `capsule rm`. The sandbox starts on first use.\n"
	"With --source, a validated read-only copy of DIR is mounted at /source\n"
	"(ro,noexec,nosuid,nodev) and refreshed before each command when DIR\n"
	"changed. node_modules entries are left out; symlinks, hard links,\n"
	"devices, FIFOs, sockets and nested mounts are refused. Caps: 512 MiB and\n"
	"100000 entries (CAPSULE_SOURCE_MAX_BYTES, CAPSULE_SOURCE_MAX_ENTRIES).\n"
	"With --workspace, a private writable copy of the project DIR is made at\n"
	CAP_GUEST_WORKSPACE " (its own disk, owned by the tool user; docs/workspace.md):\n"
	"`capsule diff NAME` shows what the sandbox changed there and `capsule\n"
	"merge NAME` brings it back into DIR, three-way. Relative symlinks that\n"
	"stay inside DIR are kept; other links, devices, FIFOs, sockets and nested\n"
	"mounts are refused by name. --workspace-size: its disk in MiB (default:\n"
	"the project's bytes twice over plus 256 MiB, at least 512 MiB).\n"
	"Defaults: 1 vCPU, 512 MiB memory, 256 MiB root, 512 MiB /work.\n"
	"Bounds: 1 to 16 vCPUs and at most the host's online CPUs; 128 MiB of\n"
	"memory up to the host's less a reserve (the larger of 512 MiB and a\n"
	"tenth); disks of 16 MiB to 1 TiB, together at most the space free where\n"
	"CAPSULE_HOME is (they are sparse). --force-size lifts the host's bounds.\n"
	"A value out of bounds exits 2, naming the value and the bound.\n"
	"With --root, commands and file operations run as root in the guest,\n"
	"not as the tool user (UID 1000), so that a daemon such as dockerd can\n"
	"run there: the VM is then the only boundary (docs/coding-agents.md,\n"
	"\"Docker inside\"). It is the sandbox's for good: recreate it to change.\n"
	"The network policy is recorded; `capsule net set NAME` changes it.\n"
	"Progress (building the base image on first use, copying a project) goes\n"
	"to stderr: one updating line on a terminal, one line per phase elsewhere;\n"
	"-q, --quiet prints none. Docker's -v HOST:GUEST is refused: capsule has\n"
	"no bind mounts (use --source, --workspace or `capsule cp`).\n"
	"With --from, the sandbox is made from a snapshot (`capsule snapshot`):\n"
	"its settings, and its disks copy-on-write over the snapshot's; its first\n"
	"start resumes what ran in it, with its own hostname, clock and entropy\n"
	"(docs/cli.md, \"Snapshots and forks\"). It takes no other option.\n"
	"\n"
	CAP_CLI_NET_HELP;

/* Options of create only. */
enum { OPT_WORKSPACE = 0x1000, OPT_WORKSPACE_SIZE, OPT_FROM };

int cap_cli_create(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "workspace", required_argument, NULL, OPT_WORKSPACE },
		{ "workspace-size", required_argument, NULL, OPT_WORKSPACE_SIZE },
		{ "image", required_argument, NULL, CAP_OPT_IMAGE },
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "root-size", required_argument, NULL, CAP_OPT_ROOT_SIZE },
		{ "work-size", required_argument, NULL, CAP_OPT_WORK_SIZE },
		{ "source", required_argument, NULL, CAP_OPT_SOURCE },
		{ "force-size", no_argument, NULL, CAP_OPT_FORCE_SIZE },
		{ "root", no_argument, NULL, CAP_OPT_ROOT },
		{ "from", required_argument, NULL, OPT_FROM },
		CAP_CLI_NET_OPTS,
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *from = NULL;
	int others = 0;
	struct cap_record rec;
	struct cap_err err = { 0 };
	_cleanup_free_ struct cap_net_policy *net = xmalloc(sizeof(*net));
	unsigned long v;
	int c, k;

	cap_record_init(&rec);
	cap_net_policy_init(net);
	if (cap_cli_volume_flag(argc, argv))
		return CAP_EXIT_USAGE;
	optind = 1;
	while ((c = getopt_long(argc, argv, "hq", opts, NULL)) != -1) {
		const char *what = NULL;
		unsigned *field = NULL;
		if ((k = cap_cli_net_opt(net, c, optarg)) < 0)
			return CAP_EXIT_USAGE;
		others += c != OPT_FROM && c != 'q' && c != 'h';
		if (k > 0)
			continue;
		switch (c) {
		case OPT_FROM:
			from = optarg;
			continue;
		case CAP_OPT_IMAGE:
			if (strlen(optarg) >= sizeof(rec.image_ref)) {
				cap_cli_error("--image '%.40s...' is %zu bytes: a name, sha256:DIGEST or a reference of at most 255",
					      optarg, strlen(optarg));
				return CAP_EXIT_USAGE;
			}
			snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", optarg);
			continue;
		case CAP_OPT_SOURCE:
			if (strlen(optarg) >= sizeof(rec.source)) {
				cap_cli_error("--source path is too long");
				return 2;
			}
			snprintf(rec.source, sizeof(rec.source), "%s", optarg);
			continue;
		case OPT_WORKSPACE: {
			/* The library takes an absolute path: a relative one is
			 * the user's current directory's. */
			char real[PATH_MAX];
			if (!realpath(optarg, real)) {
				cap_cli_error("--workspace %s: %s", optarg, strerror(errno));
				return CAP_EXIT_USAGE;
			}
			if (strlen(real) >= sizeof(rec.workspace)) {
				cap_cli_error("--workspace path is too long");
				return CAP_EXIT_USAGE;
			}
			snprintf(rec.workspace, sizeof(rec.workspace), "%s", real);
			continue;
		}
		case CAP_OPT_FORCE_SIZE:
			rec.force_size = true;
			continue;
		case CAP_OPT_ROOT:
			rec.tools_root = true;
			continue;
		case 'q':
			cap_cli_quiet = true;
			continue;
		case OPT_WORKSPACE_SIZE: what = "--workspace-size"; field = &rec.workspace_size_mib; break;
		/* The bounds are the library's (cap_named_check_size). */
		case CAP_OPT_CPUS: what = "--cpus"; field = &rec.cpus; break;
		case CAP_OPT_MEMORY: what = "--memory"; field = &rec.memory_mib; break;
		case CAP_OPT_ROOT_SIZE: what = "--root-size"; field = &rec.root_size_mib; break;
		case CAP_OPT_WORK_SIZE: what = "--work-size"; field = &rec.work_size_mib; break;
		case 'h':
			fputs(create_usage, stdout);
			return 0;
		default:
			fputs(create_usage, stderr);
			return 2;
		}
		if (cap_cli_parse_uint(optarg, 0, UINT_MAX, &v) < 0) {
			cap_cli_error("%s '%s' is not a number", what, optarg);
			return CAP_EXIT_USAGE;
		}
		*field = (unsigned)v;
	}
	if (optind != argc - 1) {
		for (int i = optind; i < argc; i++)
			if (cap_cli_volume_refused(argv[i]))
				return CAP_EXIT_USAGE;
		fputs(create_usage, stderr);
		return 2;
	}
	if (from && others) {
		cap_cli_error("--from %s takes the snapshot's settings: it takes no other option but -q", from);
		return CAP_EXIT_USAGE;
	}
	if (from) {
		if (cap_named_create_from(argv[optind], from, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return err.code == EINVAL ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
		}
		if (!cap_cli_quiet)
			printf("created sandbox %s from snapshot %s (its first start resumes it)\n", argv[optind], from);
		return 0;
	}
	snprintf(rec.name, sizeof(rec.name), "%s", argv[optind]);
	if (cap_record_set_net(&rec, net, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_USAGE;
	}
	if (cap_named_check_name(argv[optind], &err) < 0 ||
	    cap_named_create(&rec, cap_cli_progress, "create", &err) < 0) {
		cap_cli_progress_end();
		cap_cli_error("%s", err.msg);
		return err.code == EINVAL || err.code == ERANGE ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
	}
	cap_cli_progress_end();
	printf("created sandbox %s (image %s, %s)\n", rec.name, rec.image_ref, rec.image);
	if (rec.workspace[0])
		printf("workspace: %s copied to /workspace (a %u MiB disk)\n", rec.workspace, rec.workspace_size_mib);
	if (rec.source[0])
		printf("public data: %s, %llu entries, %llu bytes\n", rec.source,
		       (unsigned long long)rec.source_entries, (unsigned long long)rec.source_bytes);
	if (net->enabled) {
		_cleanup_free_ char *d = cap_net_policy_describe(net);
		printf("network: %s\n", d);
	}
	if (rec.tools_root)
		printf("commands run as root in the guest: the VM is the only boundary\n");
	return 0;
}

static const char start_usage[] =
	"Usage: capsule start NAME\n\nBoot the sandbox NAME and leave it running.\n";

int cap_cli_start(int argc, char **argv)
{
	int rc;
	const char *name = one_name(argc, argv, start_usage, &rc);
	struct cap_err err = { 0 };
	bool changed;
	if (!name)
		return rc;
	if (cap_named_refresh_source(name, &changed, NULL, &err) < 0 || cap_named_start(name, &err) < 0)
		return fail(&err);
	return 0;
}

/* A sandbox a running controller owns (capsule serve's or mcp's) is
 * changed only through it, so that its view stays true: refused without
 * --force, sent to it with. 1 when handled (rc set), 0 when no controller
 * owns name. */
static int through_owner(const char *name, const char *cmd, const char *verb, const char *method,
			 bool force, int *rc)
{
	struct cap_ctl_holder h;
	struct cap_err err = { 0 };
	int owned = cap_ctl_owner_of(name, &h);
	if (owned <= 0)
		return 0;
	if (!force) {
		cap_cli_error("sandbox '%s' belongs to capsule %s (pid %d%s%s), which runs it for an identity; "
			      "`capsule %s --force %s` asks that controller to %s it (or use its %s method)",
			      name, h.frontend, (int)h.pid, h.socket[0] ? ", socket " : "", h.socket, cmd, name,
			      verb, method);
		*rc = CAP_EXIT_FAILURE;
		return 1;
	}
	json_t *res = NULL;
	if (!h.socket[0])
		cap_err_set(&err, ENOTCONN, "capsule %s (pid %d) owns sandbox '%s' and listens on no socket; stop that controller first",
			    h.frontend, (int)h.pid, name);
	else
		cap_rpc_call(h.socket, method, json_pack("{s:s}", "sandbox", name), 120000, &res, &err);
	json_decref(res);
	*rc = err.code ? fail(&err) : 0;
	return 1;
}

static const char stop_usage[] =
	"Usage: capsule stop [--force] NAME...\n\n"
	"Stop each sandbox NAME: its commands end, the guest syncs and powers off\n"
	"(QEMU is stopped only after a grace period of 10 s). Disks are kept.\n"
	"A sandbox that a running controller (capsule serve or mcp) owns is\n"
	"stopped only with --force, through that controller. With several names\n"
	"each is tried in turn; the exit status is the first failure's.\n";

/* Parse "[--FLAG] NAME" (and -h): the name, or NULL after printing
 * with *rc set. */
static const char *flag_name(int argc, char **argv, const char *usage, const char *flag,
			     char shortc, bool *set, int *rc)
{
	int r = cap_cli_one_flag(argc, argv, usage, flag, shortc, set);
	*rc = 0;
	if (r >= 0) {
		*rc = r;
		return NULL;
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		*rc = CAP_EXIT_USAGE;
		return NULL;
	}
	return argv[optind];
}

/* Parse "[--FLAG] NAME..." (and -h): the index of the first name, or -1
 * after printing with *rc set. */
static int flag_names(int argc, char **argv, const char *usage, const char *flag, char shortc,
		      bool *set, int *rc)
{
	int r = cap_cli_one_flag(argc, argv, usage, flag, shortc, set);
	*rc = 0;
	if (r >= 0) {
		*rc = r;
		return -1;
	}
	if (optind >= argc) {
		fputs(usage, stderr);
		*rc = CAP_EXIT_USAGE;
		return -1;
	}
	return optind;
}

/* stop and rm of several names: each in turn, whatever the ones before
 * did (as docker's do), each failure told by name; the first failure's
 * status is the exit status. */
static int each_name(int argc, char **argv, const char *usage, const char *cmd, const char *verb,
		     int (*one)(const char *name, bool force, struct cap_err *err))
{
	bool force;
	int rc, first = flag_names(argc, argv, usage, "force", 'f', &force, &rc);
	if (first < 0)
		return rc;
	int worst = 0;
	for (int i = first; i < argc; i++) {
		const char *name = argv[i];
		struct cap_err err = { 0 };
		if (through_owner(name, cmd, verb, verb, force, &rc))
			;
		else if (one(name, force, &err) < 0)
			rc = fail(&err);
		else
			rc = 0;
		if (rc && !worst)
			worst = rc;
	}
	return worst;
}

static int stop_one(const char *name, bool force, struct cap_err *err)
{
	(void)force;
	return cap_named_stop(name, 10000, err);
}

int cap_cli_stop(int argc, char **argv)
{
	return each_name(argc, argv, stop_usage, "stop", "stop", stop_one);
}

/* Before a call: refresh the public data if it changed, start the
 * sandbox if needed, and attach to it. */
int cap_cli_attach(const char *name, struct cap_sandbox **sb, struct cap_err *err)
{
	struct cap_named_status st;
	bool changed;
	int r;
	if ((r = cap_named_refresh_source(name, &changed, NULL, err)) < 0 ||
	    (r = cap_named_start(name, err)) < 0 || (r = cap_named_status(name, &st, err)) < 0)
		return r;
	return cap_sandbox_attach(st.control, sb, err);
}

static const char exec_usage[] =
	"Usage: capsule exec [OPTIONS] NAME -- COMMAND [ARG...]\n"
	"\n"
	"Run COMMAND in the sandbox NAME (starting it first if it is stopped),\n"
	"streaming its output; exits with its exit code as `capsule run` does.\n"
	"\n"
	"Options: --timeout S, --output-cap BYTES, --pids-max N, -e NAME=VAL, -w DIR, -i, -q\n"
	"(see `capsule run --help`), and:\n"
	"  --no-sync      Return without flushing the command's writes (below)\n"
	"  -v, --verbose  At the end, say how long the command ran, how long the\n"
	"                 flush of its writes took, and whether they are durable\n"
	"\n"
	CAP_CLI_DURABLE_HELP;

static int exec_or_shell(int argc, char **argv, bool shell)
{
	static const struct option opts[] = {
		{ "timeout", required_argument, NULL, CAP_OPT_TIMEOUT },
		{ "output-cap", required_argument, NULL, CAP_OPT_OUTPUT_CAP },
		{ "pids-max", required_argument, NULL, CAP_OPT_PIDS_MAX },
		{ "no-sync", no_argument, NULL, CAP_OPT_NO_SYNC },
		{ "env", required_argument, NULL, 'e' },
		{ "workdir", required_argument, NULL, 'w' },
		{ "interactive", no_argument, NULL, 'i' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "verbose", no_argument, NULL, 'v' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const char shell_usage[] =
		"Usage: capsule shell NAME\n\n"
		"Open an interactive shell (a PTY) in the sandbox NAME, starting it if\n"
		"needed. The shell's exit code is returned.\n";
	const char *usage = shell ? shell_usage : exec_usage;
	struct cap_cli_exec x;
	struct cap_err err = { 0 };
	int c, k;

	cap_cli_exec_init(&x);
	if (!shell && cap_cli_volume_flag(argc, argv))
		return CAP_EXIT_USAGE;
	optind = 1;
	while ((c = getopt_long(argc, argv, shell ? "+h" : "+e:w:iqvh", opts, NULL)) != -1) {
		if (!shell && (k = cap_cli_exec_opt(&x, c, optarg)) != 0) {
			if (k < 0)
				return 2;
			continue;
		}
		if (c == 'h') {
			fputs(usage, stdout);
			return 0;
		}
		if (c == 'v' && !shell) {
			x.verbose = true;
			continue;
		}
		fputs(usage, stderr);
		return 2;
	}
	if (optind >= argc || (shell && optind != argc - 1) || (!shell && optind + 1 >= argc)) {
		fputs(usage, stderr);
		return 2;
	}
	const char *name = argv[optind];
	static char *shell_argv[] = { "/bin/sh", "-c", "if command -v bash >/dev/null; then exec bash -l; else exec sh -l; fi", NULL };
	if (shell) {
		x.req.argv = shell_argv;
		x.req.argc = 3;
		x.req.timeout_ms = 0;
		x.req.output_cap = 0;
		x.pty = true;
		const char *term = getenv("TERM");
		static char termvar[128];
		snprintf(termvar, sizeof(termvar), "TERM=%s", term && *term ? term : "xterm");
		x.envv[x.req.envc++] = termvar;
	} else {
		int first = optind + 1;
		if (strcmp(argv[first], "--") == 0)
			first++;
		if (first >= argc) {
			cap_cli_error("exec needs a command: capsule exec NAME -- COMMAND [ARG...]");
			return 2;
		}
		if (cap_cli_volume_refused(argv[first]))
			return CAP_EXIT_USAGE;
		x.req.argv = argv + first;
		x.req.argc = (uint32_t)(argc - first);
	}
	struct cap_sandbox *sb = NULL;
	if (cap_cli_attach(name, &sb, &err) < 0)
		return fail(&err);
	int status = cap_cli_stream(sb, &x);
	cap_sandbox_free(sb);
	if (x.gave_up) {
		/* Its guest no longer answers: a stop would wait on it for
		 * nothing. Its VM is killed; its disks stay. */
		cap_cli_error("stopping sandbox '%s' (its VM is killed, its disks stay); the next command starts it again",
			      name);
		if (cap_named_kill(name, &err) < 0)
			cap_cli_error("%s", err.msg);
	}
	return status;
}

int cap_cli_exec(int argc, char **argv) { return exec_or_shell(argc, argv, false); }
int cap_cli_shell(int argc, char **argv) { return exec_or_shell(argc, argv, true); }

/* Where a running VM's hypervisor process is confined, read from /proc:
 * its user and its memory cgroup. false when it cannot tell. */
static bool read_jail(pid_t vmm, char *uid, size_t ulen, char *cgroup, size_t clen)
{
	char path[64];
	_cleanup_free_ char *status = NULL, *cg = NULL;
	snprintf(path, sizeof(path), "/proc/%d/status", (int)vmm);
	if (cap_read_file(path, 1 << 16, &status) < 0)
		return false;
	snprintf(path, sizeof(path), "/proc/%d/cgroup", (int)vmm);
	if (cap_read_file(path, 1 << 16, &cg) < 0) {
		free(cg);
		cg = xstrdup("");
	}
	const char *u = strstr(status, "\nUid:\t");
	const char *mem = strstr(cg, ":memory:");
	if (!mem)
		mem = strstr(cg, "0::");
	if (!u)
		return false;
	snprintf(uid, ulen, "%.*s", (int)strcspn(u + 6, "\t\n"), u + 6);
	snprintf(cgroup, clen, "%.*s", mem ? (int)strcspn(mem + 1, "\n") : 1, mem ? mem + 1 : "-");
	return true;
}

static const char *state_name(enum cap_named_state s)
{
	return s == CAP_NAMED_RUNNING ? "running" : s == CAP_NAMED_PAUSED ? "paused" : "stopped";
}

/* What inspect shows of one sandbox, gathered once for its text and its
 * JSON. */
struct shown {
	struct cap_record rec;
	struct cap_named_status st;
	struct cap_net_policy *owned_net;
	char *owned_policy;	/* cap_net_policy_describe */
	char *owned_dir;
	bool jail;
	char uid[64], cgroup[512];
	bool ws_base;	/* the workspace's base manifest was read */
	size_t ws_entries;
	uint64_t ws_bytes;
	char ws_error[1100];
	const char *net_state;	/* NULL, or the "net state:" line */
	char net_state_buf[256];
};

static void shown_fini(struct shown *s)
{
	free(s->owned_net);
	free(s->owned_policy);
	free(s->owned_dir);
}

static int shown_load(const char *name, struct shown *s, struct cap_err *err)
{
	memset(s, 0, sizeof(*s));
	if (cap_named_load(name, &s->rec, err) < 0 || cap_named_status(name, &s->st, err) < 0)
		return -1;
	s->owned_net = xmalloc(sizeof(*s->owned_net));
	if (cap_record_net(&s->rec, s->owned_net, err) < 0)
		return -1;
	s->owned_policy = cap_net_policy_describe(s->owned_net);
	s->owned_dir = cap_named_dir(name);
	if (s->st.state != CAP_NAMED_STOPPED)
		s->jail = read_jail(s->st.vmm_pid, s->uid, sizeof(s->uid), s->cgroup, sizeof(s->cgroup));
	if (s->rec.workspace[0]) {
		struct cap_tree base;
		struct cap_err e = { 0 };
		if (cap_named_workspace_base(name, &base, &e) == 0) {
			s->ws_base = true;
			s->ws_entries = base.n;
			s->ws_bytes = base.bytes;
			cap_tree_fini(&base);
		} else {
			snprintf(s->ws_error, sizeof(s->ws_error), "%s", e.msg);
		}
	}
	const struct cap_named_status *st = &s->st;
	if (st->state != CAP_NAMED_STOPPED && st->network_error[0])
		s->net_state = st->network_error;
	else if (st->state != CAP_NAMED_STOPPED && st->nic != s->owned_net->enabled)
		snprintf(s->net_state_buf, sizeof(s->net_state_buf),
			 "the running VM %s; the policy above applies at its next start",
			 st->nic ? "keeps its network interface, refusing everything" : "has no network interface");
	else if (st->state != CAP_NAMED_STOPPED && st->nic)
		snprintf(s->net_state_buf, sizeof(s->net_state_buf), "policy process pid %d", (int)st->netd_pid);
	if (s->net_state_buf[0])
		s->net_state = s->net_state_buf;
	return 0;
}

static json_t *jstr_or_null(const char *s)
{
	return s && *s ? cap_json_text(s) : json_null();
}

/* The JSON of one sandbox (docs/cli.md, "capsule inspect --json"). */
static json_t *shown_json(const struct shown *s)
{
	const struct cap_record *r = &s->rec;
	const struct cap_named_status *st = &s->st;
	bool up = st->state != CAP_NAMED_STOPPED;
	json_t *o = json_object();
	json_object_set_new(o, "name", cap_json_text(r->name));
	json_object_set_new(o, "state", json_string(state_name(st->state)));
	json_object_set_new(o, "shim_pid", up ? json_integer(st->shim_pid) : json_null());
	json_object_set_new(o, "engine", up && st->engine[0] ? json_string(st->engine) : json_null());
	json_object_set_new(o, "vmm_pid", up ? json_integer(st->vmm_pid) : json_null());
	/* vmm_pid's older name, kept for scripts (docs/cli.md). */
	json_object_set_new(o, "qemu_pid", up ? json_integer(st->vmm_pid) : json_null());
	json_object_set_new(o, "jail", s->jail ? json_pack("{s:s, s:o}", "uid", s->uid, "cgroup", cap_json_text(s->cgroup))
					       : json_null());
	json_object_set_new(o, "image", json_pack("{s:o, s:s}", "ref", cap_json_text(r->image_ref), "digest", r->image));
	json_object_set_new(o, "cpus", json_integer(r->cpus));
	json_object_set_new(o, "memory_mib", json_integer(r->memory_mib));
	json_object_set_new(o, "root_size_mib", json_integer(r->root_size_mib));
	json_object_set_new(o, "work_size_mib", json_integer(r->work_size_mib));
	json_object_set_new(o, "user", json_string(r->tools_root ? "root" : "user"));
	json_object_set_new(o, "disk_bytes", json_integer((json_int_t)st->disk_bytes));
	json_object_set_new(o, "source", r->source[0] ? json_pack("{s:o, s:I, s:I, s:s}", "path", cap_json_text(r->source),
			    "entries", (json_int_t)r->source_entries, "bytes", (json_int_t)r->source_bytes,
			    "fingerprint", r->source_fp) : json_null());
	if (r->workspace[0]) {
		json_t *ws = json_pack("{s:o, s:I}", "path", cap_json_text(r->workspace), "size_mib", (json_int_t)r->workspace_size_mib);
		json_object_set_new(ws, "base", s->ws_base ? json_pack("{s:I, s:I}", "entries", (json_int_t)s->ws_entries,
						"bytes", (json_int_t)s->ws_bytes) : json_null());
		json_object_set_new(ws, "base_error", jstr_or_null(s->ws_error));
		json_object_set_new(o, "workspace", ws);
	} else {
		json_object_set_new(o, "workspace", json_null());
	}
	char **words;
	size_t nw;
	cap_net_policy_words(s->owned_net, &words, &nw);
	json_t *flags = json_array();
	for (size_t i = 0; i < nw; i++) {
		json_array_append_new(flags, cap_json_text(words[i]));
		free(words[i]);
	}
	free(words);
	json_t *net = json_object();
	json_object_set_new(net, "enabled", json_boolean(s->owned_net->enabled));
	json_object_set_new(net, "policy", cap_json_text(s->owned_policy));
	json_object_set_new(net, "flags", flags);
	json_object_set_new(net, "route", s->owned_net->enabled ? cap_json_text(cap_cli_net_route()) : json_null());
	json_object_set_new(net, "nic", up ? json_boolean(st->nic) : json_null());
	json_object_set_new(net, "policy_pid", up && st->nic && st->netd_pid > 0 ? json_integer(st->netd_pid)
										: json_null());
	json_object_set_new(net, "error", up ? jstr_or_null(st->network_error) : json_null());
	json_object_set_new(net, "state", jstr_or_null(s->net_state));
	json_object_set_new(o, "network", net);
	json_object_set_new(o, "directory", cap_json_text(s->owned_dir));
	json_object_set_new(o, "created", json_integer(r->created));
	return o;
}

static const char inspect_usage[] =
	"Usage: capsule inspect [--json] NAME\n\n"
	"Show the sandbox's settings, state, image and disks.\n"
	"  --json  one JSON object (docs/cli.md, \"JSON output\")\n";

int cap_cli_inspect(int argc, char **argv)
{
	int rc;
	bool json;
	const char *name = flag_name(argc, argv, inspect_usage, "json", 0, &json, &rc);
	struct cap_err err = { 0 };
	struct shown s;
	if (!name)
		return rc;
	if (shown_load(name, &s, &err) < 0) {
		shown_fini(&s);
		return fail(&err);
	}
	if (json) {
		rc = cap_cli_json_out(shown_json(&s));
		shown_fini(&s);
		return rc;
	}
	const struct cap_record *r = &s.rec;
	char used[32];
	cap_cli_human(s.st.disk_bytes, used, sizeof(used));
	printf("name:       %s\n", r->name);
	printf("state:      %s\n", state_name(s.st.state));
	if (s.st.state != CAP_NAMED_STOPPED) {
		printf("processes:  shim %d, %s %d\n", (int)s.st.shim_pid, s.st.engine, (int)s.st.vmm_pid);
		if (s.jail)
			printf("jail:       uid %s, cgroup %s\n", s.uid, s.cgroup);
	}
	printf("image:      %s (%s)\n", r->image_ref, r->image);
	printf("cpus:       %u\n", r->cpus);
	printf("memory:     %u MiB\n", r->memory_mib);
	printf("root disk:  %u MiB (writable layer over the image)\n", r->root_size_mib);
	printf("work disk:  %u MiB (/work)\n", r->work_size_mib);
	printf("user:       %s\n", r->tools_root ? "root (--root: the VM is the only boundary)" : "user (UID 1000)");
	printf("disk use:   %s on the host\n", used);
	if (r->source[0]) {
		printf("source:     %s\n", r->source);
		printf("projection: %llu entries, %llu bytes, fingerprint %s\n",
		       (unsigned long long)r->source_entries, (unsigned long long)r->source_bytes, r->source_fp);
	} else {
		printf("source:     none (/source is empty)\n");
	}
	if (r->workspace[0]) {
		printf("workspace:  %s (merge target)\n", r->workspace);
		printf("ws disk:    %u MiB (/workspace)\n", r->workspace_size_mib);
		if (s.ws_base)
			printf("ws base:    %zu entries, %llu bytes (what /workspace and the project last agreed on)\n",
			       s.ws_entries, (unsigned long long)s.ws_bytes);
		else
			printf("ws base:    unreadable: %s\n", s.ws_error);
	} else {
		printf("workspace:  none\n");
	}
	printf("network:    %s\n", s.owned_policy);
	if (s.owned_net->enabled)
		printf("route:      %s\n", cap_cli_net_route());
	if (s.net_state)
		printf("net state:  %s\n", s.net_state);
	printf("directory:  %s\n", s.owned_dir);
	time_t t = (time_t)r->created;
	char when[64];
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S %Z", localtime(&t));
	printf("created:    %s\n", when);
	shown_fini(&s);
	return 0;
}

static const char rm_usage[] =
	"Usage: capsule rm [--force] NAME...\n\n"
	"Delete each sandbox NAME and its disks. A running sandbox is refused\n"
	"unless --force, which stops it first. This is the only command that\n"
	"deletes a sandbox's disks. A sandbox that a running controller (capsule\n"
	"serve or mcp) owns is removed only with --force, through that controller.\n"
	"With several names each is tried in turn (`capsule rm p-1 p-2 p-3` after\n"
	"a fork); the exit status is the first failure's.\n";

int cap_cli_rm(int argc, char **argv)
{
	return each_name(argc, argv, rm_usage, "rm", "remove", cap_named_remove);
}

static const char ls_usage[] =
	"Usage: capsule ls [--json]\n\n"
	"List sandboxes: name, image, state, disk use, age.\n"
	"  --json  an array of the objects `capsule inspect --json` prints, and\n"
	"          {\"name\", \"state\": \"broken\", \"error\"} for a sandbox that\n"
	"          cannot be read (docs/cli.md, \"JSON output\")\n";

int cap_cli_ls(int argc, char **argv)
{
	bool json;
	int r = cap_cli_one_flag(argc, argv, ls_usage, "json", 0, &json);
	if (r >= 0)
		return r;
	if (optind != argc) {
		cap_cli_error("ls takes no arguments but --json; see `capsule ls --help`");
		return CAP_EXIT_USAGE;
	}
	char **names;
	size_t n;
	cap_named_list(&names, &n);
	json_t *all = json ? json_array() : NULL;
	if (!json)
		printf("%-24s %-16s %-8s %8s %6s\n", "NAME", "IMAGE", "STATE", "DISK", "AGE");
	for (size_t i = 0; i < n; i++) {
		struct shown s;
		struct cap_err err = { 0 };
		if (shown_load(names[i], &s, &err) == 0) {
			if (json) {
				json_array_append_new(all, shown_json(&s));
			} else {
				char used[32], a[32];
				cap_cli_human(s.st.disk_bytes, used, sizeof(used));
				cap_cli_age(s.rec.created, a, sizeof(a));
				printf("%-24s %-16s %-8s %8s %6s\n", s.rec.name, s.rec.image_ref, state_name(s.st.state),
				       used, a);
			}
		} else if (json) {
			json_array_append_new(all, json_pack("{s:o, s:s, s:o}", "name", cap_json_text(names[i]),
							     "state", "broken", "error", cap_json_text(err.msg)));
		} else {
			printf("%-24s %-16s %-8s %8s %6s\n", names[i], "?", "broken", "-", "-");
		}
		shown_fini(&s);
		free(names[i]);
	}
	free(names);
	return json ? cap_cli_json_out(all) : 0;
}

/* capsule shim --ready-fd=N NAME: internal, started by `start` (and by the
 * controller) to own one running sandbox. Not for people. */
int cap_cli_shim(int argc, char **argv)
{
	unsigned long fd;
	if (argc != 3 || strncmp(argv[1], "--ready-fd=", 11) != 0 ||
	    cap_cli_parse_uint(argv[1] + 11, 3, 1024, &fd) < 0) {
		cap_cli_error("shim is internal: capsule starts it itself (see `capsule start`)");
		return 2;
	}
	/* shim.log reads "capsule shim NAME: ..."; the sink keeps who. */
	static char who[sizeof("shim ") + CAP_NAME_MAX];
	snprintf(who, sizeof(who), "shim %s", argv[2]);
	cap_log_set(cap_log_stderr, who);
	struct cap_err err = { 0 };
	if (cap_named_shim(argv[2], (int)fd, &err) < 0) {
		fprintf(stderr, "capsule shim %s: %s\n", argv[2], err.msg);
		return 1;
	}
	return 0;
}
