/* capsule code: one sandbox per project for a coding agent
 * (docs/coding-agents.md). The project's canonical path names its
 * sandbox; the first launch creates it with the project copied to
 * /workspace; every launch runs the agent (or a command) in /workspace,
 * then says what changed there and how to take it, or merges it.
 *
 * Two launches in one project at once share the one VM, each with its
 * own session: the sandbox is created and started under a lock, so the
 * second waits for the first's creation rather than racing it, and the
 * agent's state (its home, /work, on the sandbox's private disk) has one
 * copy, written by the guest's own file system. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "code-preset.h"
#include "layout.h"
#include "named.h"
#include "paths.h"
#include "policy.h"
#include "sha256.h"
#include "util.h"

static const char code_usage[] =
	"Usage: capsule code [DIR] [--agent NAME] [--merge] [-q] [--image IMAGE]\n"
	"                    [--cpus N] [--memory MIB] [--work-size MIB]\n"
	"                    [--workspace-size MIB] [--root] [NETWORK FLAGS] [-- COMMAND [ARG...]]\n"
	"       capsule code --agents\n"
	"\n"
	"A sandbox for the project DIR (default: the current directory), found\n"
	"again by DIR's canonical path at every launch and created at the first,\n"
	"with DIR copied to /workspace. Runs the agent's command (--agent, default\n"
	"shell), or COMMAND, in /workspace: on a terminal in a PTY, otherwise\n"
	"with plain pipes (stdin forwarded), so that scripts can drive it. The\n"
	"agent's home (/work: its settings, history and logins) is the sandbox's\n"
	"private disk and stays from one launch to the next. When the command\n"
	"ends, what changed in /workspace is listed on stderr with how to take\n"
	"it; DIR itself is never written until a merge.\n"
	"  --agent NAME  a preset: the agent's command, the hosts its API needs\n"
	"                (opened for the sandbox, nothing else) and its\n"
	"                environment; `capsule code --agents` lists them. A file\n"
	"                $XDG_CONFIG_HOME/capsule/agents/NAME.json (default\n"
	"                ~/.config/capsule/agents) adds one or takes a built-in's\n"
	"                place (docs/coding-agents.md)\n"
	"  --merge       after the command, merge /workspace into DIR as `capsule\n"
	"                merge` does: a path changed on both sides refuses the\n"
	"                whole merge, naming it (exit 1), and nothing is written\n"
	"  --image, --cpus, --memory, --work-size, --workspace-size, --root: as\n"
	"                on `capsule create`, when the sandbox is created (--root:\n"
	"                commands as root in the guest, for Docker inside)\n"
	"Network flags (see `capsule create --help`) and a preset's hosts are\n"
	"added to the sandbox's policy at each launch; none is ever removed\n"
	"(`capsule net set NAME` replaces it). Two launches in one project at\n"
	"once share its VM, each with its own session.\n"
	"The sandbox is an ordinary named one: `capsule ls`, `diff`, `merge`,\n"
	"`stop` and `rm` take its name (printed at its creation).\n"
	"Exits with the command's exit code, or merge's when --merge fails.\n";

/* --- presets ----------------------------------------------------------------- */

static char *user_preset_dir(void)
{
	const char *x = getenv("XDG_CONFIG_HOME");
	if (x && *x == '/')
		return xasprintf("%s/capsule/agents", x);
	const char *home = getenv("HOME");
	return xasprintf("%s/.config/capsule/agents", home && *home ? home : "/root");
}

/* The preset name: the user's file when there is one, else the
 * built-in. 0, -ENOENT (err naming both places and the presets there
 * are), or -EINVAL (err). */
static int preset_load(const char *name, struct cap_code_preset *p, struct cap_err *err)
{
	if (!cap_code_preset_name_ok(name))
		return cap_err_set(err, EINVAL, "--agent '%.64s' is not a preset name: 1 to %d of a-z, 0-9, - and _ (`capsule code --agents` lists them)",
				   name, CAP_PRESET_NAME_MAX);
	_cleanup_free_ char *dir = user_preset_dir();
	_cleanup_free_ char *path = xasprintf("%s/%s.json", dir, name);
	_cleanup_free_ char *text = NULL;
	ssize_t n = cap_read_file(path, CAP_PRESET_FILE_MAX, &text);
	if (n >= 0)
		return cap_code_preset_parse(p, name, path, text, (size_t)n, err);
	if (n == -EFBIG)
		return cap_err_set(err, EINVAL, "preset %s: over the limit of %u bytes", path, CAP_PRESET_FILE_MAX);
	if (n != -ENOENT)
		return cap_err_set(err, (int)-n, "preset %s: %s", path, strerror((int)-n));
	for (size_t i = 0; i < cap_code_nbuiltins; i++)
		if (strcmp(cap_code_builtins[i].name, name) == 0)
			return cap_code_preset_parse(p, name, "built-in", cap_code_builtins[i].json,
						     strlen(cap_code_builtins[i].json), err);
	char known[512] = "";
	for (size_t i = 0; i < cap_code_nbuiltins; i++)
		snprintf(known + strlen(known), sizeof(known) - strlen(known), "%s%s", i ? ", " : "",
			 cap_code_builtins[i].name);
	return cap_err_set(err, ENOENT, "no agent preset '%s': the built-in ones are %s; a file %s adds it", name, known, path);
}

/* One line of `capsule code --agents`. */
static void list_one(const char *name, const char *from)
{
	struct cap_code_preset p;
	struct cap_err err = { 0 };
	if (preset_load(name, &p, &err) < 0) {
		printf("%-12s %-9s (refused: %s)\n", name, from, err.msg);
		return;
	}
	printf("%-12s %-9s %s;", name, from, p.owned_argv[0]);
	for (size_t k = 0; k < p.nallow; k++)
		printf(" %s", p.owned_allow[k]);
	printf("%s\n", p.nallow ? "" : " (no network)");
	cap_code_preset_fini(&p);
}

static int list_presets(void)
{
	_cleanup_free_ char *dir = user_preset_dir();
	printf("%-12s %-9s %s\n", "AGENT", "FROM", "COMMAND; HOSTS");
	for (size_t i = 0; i < cap_code_nbuiltins; i++) {
		/* A built-in a user's file replaces is listed as the file. */
		_cleanup_free_ char *own = xasprintf("%s/%s.json", dir, cap_code_builtins[i].name);
		if (access(own, F_OK) != 0)
			list_one(cap_code_builtins[i].name, "built-in");
	}
	DIR *d = opendir(dir);
	for (struct dirent *e; d && (e = readdir(d));) {
		char name[CAP_PRESET_NAME_MAX + 1];
		size_t len = strlen(e->d_name);
		if (len <= 5 || len - 5 > CAP_PRESET_NAME_MAX || strcmp(e->d_name + len - 5, ".json") != 0)
			continue;
		snprintf(name, sizeof(name), "%.*s", (int)(len - 5), e->d_name);
		if (cap_code_preset_name_ok(name))
			list_one(name, "file");
	}
	if (d)
		closedir(d);
	printf("user presets: %s/NAME.json\n", dir);
	return 0;
}

/* --- the project's sandbox ------------------------------------------------------ */

/* code-BASE-HASH: BASE the directory's name (lowercased, other than
 * [a-z0-9] as '-', at most 24), HASH 12 hex digits of SHA-256 over the
 * canonical path: one name per directory, readable in `capsule ls`. */
static void sandbox_name(const char *real, char out[CAP_NAME_MAX + 1])
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, real, strlen(real));
	cap_sha256_final_hex(&h, hex);
	const char *base = strrchr(real, '/');
	base = base && base[1] ? base + 1 : "root";
	char b[25];
	size_t n = 0;
	for (const char *s = base; *s && n < sizeof(b) - 1; s++) {
		char c = *s >= 'A' && *s <= 'Z' ? (char)(*s - 'A' + 'a') : *s;
		bool ok = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
		if (ok || (n && b[n - 1] != '-'))
			b[n++] = ok ? c : '-';
	}
	while (n && b[n - 1] == '-')
		n--;
	b[n] = '\0';
	snprintf(out, CAP_NAME_MAX + 1, "code-%s%s%.12s", b, n ? "-" : "", hex);
}

/* Add to p each word of add that p lacks (the policy's own words, as
 * `capsule net` stores them): a preset's hosts and the launch's flags
 * open more at every launch and never close what was opened. *changed
 * says whether p grew. */
static int policy_add(struct cap_net_policy *p, const struct cap_net_policy *add, bool *changed,
		      struct cap_err *err)
{
	char **have = NULL, **want = NULL;
	size_t nhave = 0, nwant = 0;
	int r = 0;
	cap_net_policy_words(p, &have, &nhave);
	cap_net_policy_words(add, &want, &nwant);
	for (size_t i = 0; i < nwant && r == 0; i++) {
		bool there = false;
		for (size_t k = 0; k < nhave && !there; k++)
			there = strcmp(have[k], want[i]) == 0;
		if (there)
			continue;
		char *eq = strchr(want[i], '=');
		if (eq)
			*eq = '\0';
		r = cap_net_policy_apply(p, want[i], eq ? eq + 1 : NULL, err);
		*changed = *changed || r == 0;
	}
	for (size_t i = 0; i < nhave; i++)
		free(have[i]);
	for (size_t i = 0; i < nwant; i++)
		free(want[i]);
	free(have);
	free(want);
	return r;
}

struct launch {
	char real[PATH_MAX];
	char name[CAP_NAME_MAX + 1];
	struct cap_code_preset preset;
	struct cap_net_policy *flags;	/* the launch's own network flags */
	struct cap_record rec;	/* what a creation takes (image, sizes) */
	bool sized;		/* a creation flag was given */
};

/* Hold $CAPSULE_HOME/code.lock while a project's sandbox is looked up,
 * created and started: a second launch waits for the first. */
static int code_lock(struct cap_err *err)
{
	_cleanup_free_ char *home = cap_home_dir();
	if (cap_mkdir_p(home, 0700) < 0)
		return cap_err_set(err, errno, "cannot make %s: %s", home, strerror(errno));
	_cleanup_free_ char *path = xasprintf("%s/code.lock", home);
	int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK || (cap_cli_quiet ? 0 : fprintf(stderr, "capsule code: another launch is setting up a sandbox; waiting for it\n"),
					     flock(fd, LOCK_EX) < 0)) {
			int e = errno;
			close(fd);
			return cap_err_set(err, e, "cannot lock %s: %s", path, strerror(e));
		}
	}
	return fd;
}

/* The project's sandbox, created (first launch) or found with its
 * policy grown by the preset and the flags; then started and attached. */
static int project_sandbox(struct launch *l, struct cap_sandbox **sb, struct cap_err *err)
{
	_cleanup_free_ struct cap_net_policy *want = xmalloc(sizeof(*want));
	_cleanup_free_ struct cap_net_policy *net = xmalloc(sizeof(*net));
	bool grew = false;
	cap_net_policy_init(want);
	for (size_t i = 0; i < l->preset.nallow; i++)
		if (cap_net_policy_apply(want, "allow-egress", l->preset.owned_allow[i], err) < 0)
			return -EINVAL;
	/* The agent's credential files that this host has: given as
	 * placeholders (docs/coding-agents.md); without one, the agent logs
	 * in inside and its login stays in /work. */
	const char *home = getenv("HOME");
	for (size_t i = 0; i < l->preset.nsecret_files; i++) {
		_cleanup_free_ char *t = cap_code_preset_home(l->preset.owned_secret_files[i], home && *home == '/' ? home : "/root");
		/* Its HOSTFILE as the policy's reader finds it. */
		_cleanup_free_ struct cap_net_policy *one = xmalloc(sizeof(*one));
		cap_net_policy_init(one);
		if (cap_net_policy_apply(one, "secret-file", t, err) < 0)
			return -EINVAL;
		const char *file = one->secret_files[0].host;
		if (access(file, R_OK) != 0) {
			if (!cap_cli_quiet)
				fprintf(stderr, "capsule code: agent %s: no %s on this host (%s): the agent logs in inside the sandbox, and its login stays there\n",
					l->preset.name, file, strerror(errno));
			continue;
		}
		if (cap_net_policy_apply(want, "secret-file", t, err) < 0)
			return -EINVAL;
	}
	if (policy_add(want, l->flags, &grew, err) < 0)
		return -EINVAL;
	_cleanup_close_ int lock = code_lock(err);
	if (lock < 0)
		return lock;
	struct cap_record rec;
	int r = cap_named_load(l->name, &rec, err);
	if (r == -ENOENT) {
		memset(err, 0, sizeof(*err));
		rec = l->rec;
		snprintf(rec.name, sizeof(rec.name), "%s", l->name);
		snprintf(rec.workspace, sizeof(rec.workspace), "%s", l->real);
		if (cap_record_set_net(&rec, want, err) < 0)
			return -EINVAL;
		if ((r = cap_named_create(&rec, cap_cli_progress, "code", err)) < 0) {
			cap_cli_progress_end();
			return r;
		}
		cap_cli_progress_end();
		if (!cap_cli_quiet) {
			_cleanup_free_ char *d = want->enabled ? cap_net_policy_describe(want) : xstrdup("none");
			fprintf(stderr, "capsule code: created sandbox %s for %s (agent %s; network: %s)\n", l->name,
				l->real, l->preset.name, d);
		}
	} else if (r < 0) {
		return r;
	} else {
		if (strcmp(rec.workspace, l->real) != 0)
			return cap_err_set(err, EEXIST, "sandbox %s is not this project's (its workspace is %s, not %s): `capsule rm %s` if it is not wanted",
					   l->name, rec.workspace[0] ? rec.workspace : "none", l->real, l->name);
		if (l->rec.tools_root && !rec.tools_root)
			return cap_err_set(err, EEXIST, "sandbox %s was made without --root, and a sandbox keeps whom its commands run as: `capsule rm %s` to make it again with --root (its /work goes with it)",
					   l->name, l->name);
		if (l->sized && !cap_cli_quiet)
			fprintf(stderr, "capsule code: sandbox %s exists: --image and the sizes apply only when it is created (`capsule rm %s` to start over)\n",
				l->name, l->name);
		cap_net_policy_init(net);
		if (cap_record_net(&rec, net, err) < 0)
			return -EBADMSG;
		grew = false;
		if (policy_add(net, want, &grew, err) < 0)
			return -EINVAL;
		bool restart = false;
		if (grew && cap_named_set_network(l->name, net, &restart, err) < 0)
			return -EIO;
		if (grew && !cap_cli_quiet) {
			_cleanup_free_ char *d = cap_net_policy_describe(net);
			fprintf(stderr, "capsule code: sandbox %s's network is now: %s%s\n", l->name, d,
				restart ? " (a secret or a new interface takes effect at its next start: `capsule stop` it)" : "");
		}
	}
	return cap_cli_attach(l->name, sb, err);
}

/* --- the verb ---------------------------------------------------------------------- */

int cap_cli_code(int argc, char **argv)
{
	enum { OPT_AGENT = 0x1100, OPT_MERGE, OPT_AGENTS, OPT_WS_SIZE };
	static const struct option opts[] = {
		{ "agent", required_argument, NULL, OPT_AGENT },
		{ "agents", no_argument, NULL, OPT_AGENTS },
		{ "merge", no_argument, NULL, OPT_MERGE },
		{ "image", required_argument, NULL, CAP_OPT_IMAGE },
		{ "cpus", required_argument, NULL, CAP_OPT_CPUS },
		{ "memory", required_argument, NULL, CAP_OPT_MEMORY },
		{ "work-size", required_argument, NULL, CAP_OPT_WORK_SIZE },
		{ "workspace-size", required_argument, NULL, OPT_WS_SIZE },
		{ "root", no_argument, NULL, CAP_OPT_ROOT },
		CAP_CLI_NET_OPTS,
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	_cleanup_free_ struct launch *l = xcalloc(1, sizeof(*l));
	_cleanup_free_ struct cap_net_policy *flags = xmalloc(sizeof(*flags));
	const char *agent = "shell";
	bool merge = false;
	struct cap_err err = { 0 };
	unsigned long v;
	int c, k;

	cap_net_policy_init(flags);
	l->flags = flags;
	cap_record_init(&l->rec);
	/* Options come before "--"; what follows it is the command. */
	int dd = argc;
	for (int i = 1; i < argc; i++)
		if (strcmp(argv[i], "--") == 0) {
			dd = i;
			break;
		}
	optind = 1;
	while ((c = getopt_long(dd, argv, "hq", opts, NULL)) != -1) {
		unsigned *field = NULL;
		const char *what = NULL;
		if ((k = cap_cli_net_opt(flags, c, optarg)) < 0)
			return CAP_EXIT_USAGE;
		if (k > 0)
			continue;
		switch (c) {
		case OPT_AGENT: agent = optarg; continue;
		case OPT_AGENTS: return list_presets();
		case OPT_MERGE: merge = true; continue;
		case CAP_OPT_ROOT: l->rec.tools_root = true; continue;
		case 'q': cap_cli_quiet = true; continue;
		case 'h': fputs(code_usage, stdout); return 0;
		case CAP_OPT_IMAGE:
			if (strlen(optarg) >= sizeof(l->rec.image_ref)) {
				cap_cli_error("--image '%.40s...' is too long: a name, sha256:DIGEST or a reference of at most 255",
					      optarg);
				return CAP_EXIT_USAGE;
			}
			snprintf(l->rec.image_ref, sizeof(l->rec.image_ref), "%s", optarg);
			l->sized = true;
			continue;
		case CAP_OPT_CPUS: what = "--cpus"; field = &l->rec.cpus; break;
		case CAP_OPT_MEMORY: what = "--memory"; field = &l->rec.memory_mib; break;
		case CAP_OPT_WORK_SIZE: what = "--work-size"; field = &l->rec.work_size_mib; break;
		case OPT_WS_SIZE: what = "--workspace-size"; field = &l->rec.workspace_size_mib; break;
		default: fputs(code_usage, stderr); return CAP_EXIT_USAGE;
		}
		if (cap_cli_parse_uint(optarg, 0, UINT_MAX, &v) < 0) {
			cap_cli_error("%s '%s' is not a number", what, optarg);
			return CAP_EXIT_USAGE;
		}
		*field = (unsigned)v;
		l->sized = true;
	}
	if (dd - optind > 1) {
		cap_cli_error("code: one project directory at most ('%s', then '%s'); a command goes after --", argv[optind],
			      argv[optind + 1]);
		return CAP_EXIT_USAGE;
	}
	const char *dir = optind < dd ? argv[optind] : ".";
	struct stat st;
	if (!realpath(dir, l->real) || stat(l->real, &st) < 0) {
		cap_cli_error("code: the project %s: %s", dir, strerror(errno));
		return CAP_EXIT_USAGE;
	}
	if (!S_ISDIR(st.st_mode)) {
		cap_cli_error("code: the project %s is not a directory", dir);
		return CAP_EXIT_USAGE;
	}
	if (preset_load(agent, &l->preset, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_USAGE;
	}
	sandbox_name(l->real, l->name);

	struct cap_cli_exec x;
	struct cap_sandbox *sb = NULL;
	int status;
	cap_cli_exec_init(&x);
	if (dd < argc - 1) {
		x.req.argv = argv + dd + 1;
		x.req.argc = (uint32_t)(argc - dd - 1);
	} else {
		x.req.argv = l->preset.owned_argv;
		x.req.argc = (uint32_t)l->preset.argc;
	}
	x.req.cwd = (char *)CAP_GUEST_WORKSPACE;
	x.req.timeout_ms = 0;
	x.req.output_cap = 0;
	x.pty = isatty(STDIN_FILENO) && isatty(STDOUT_FILENO);
	for (size_t i = 0; i < l->preset.nenv && x.req.envc < CAP_PROTO_MAX_ARGS - 1; i++)
		x.envv[x.req.envc++] = l->preset.owned_env[i];
	static char termvar[128];
	if (x.pty) {
		const char *term = getenv("TERM");
		snprintf(termvar, sizeof(termvar), "TERM=%s", term && *term ? term : "xterm");
		x.envv[x.req.envc++] = termvar;
	}
	if (project_sandbox(l, &sb, &err) < 0) {
		cap_cli_error("%s", err.msg);
		cap_code_preset_fini(&l->preset);
		return err.code == EINVAL || err.code == ERANGE ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
	}
	status = cap_cli_stream(sb, &x);
	if (x.gave_up) {
		cap_sandbox_free(sb);
		cap_cli_error("stopping sandbox '%s' (its VM is killed, its disks stay); the next launch starts it again",
			      l->name);
		if (cap_named_kill(l->name, &err) < 0)
			cap_cli_error("%s", err.msg);
		cap_code_preset_fini(&l->preset);
		return status;
	}
	if (merge) {
		cap_sandbox_free(sb);
		char *margv[] = { (char *)"merge", l->name, NULL };
		int m = cap_cli_merge(2, margv);
		cap_code_preset_fini(&l->preset);
		return m != 0 ? m : status;
	}
	int n = cap_cli_quiet ? 0 : cap_cli_workspace_report(l->name, sb, 20);
	cap_sandbox_free(sb);
	if (n > 0)
		fprintf(stderr, "capsule code: %s is unchanged; `capsule diff %s -p` shows the changes, `capsule code --merge -- true` (or `capsule merge %s`) applies them\n",
			l->real, l->name, l->name);
	cap_code_preset_fini(&l->preset);
	return status;
}
