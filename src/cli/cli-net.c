/* The network flags shared by run, create, serve and mcp, and `capsule
 * net`: show or change a named sandbox's policy, read its log
 * (docs/network.md). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "controller.h"
#include "named.h"
#include "util.h"

/* NAME=file:REL@HOSTS with REL relative: the same with REL made absolute
 * against the working directory (not resolved: a symlink stays one);
 * NULL when there is nothing to change. */
static char *secret_abs_path(const char *arg)
{
	const char *eq = strchr(arg, '='), *at = strrchr(arg, '@');
	if (!eq || !at || at < eq || strncmp(eq + 1, "file:", 5) != 0 || eq[6] == '/' || eq + 6 >= at)
		return NULL;
	_cleanup_free_ char *cwd = getcwd(NULL, 0);
	if (!cwd)
		return NULL;	/* the parser then says a path must be absolute */
	return xasprintf("%.*s%s/%s", (int)(eq + 6 - arg), arg, cwd, eq + 6);
}

/* GUESTPATH=HOSTFILE...@HOSTS with HOSTFILE relative: the same with it
 * made absolute (a leading "~/" is $HOME's); NULL when it is not. */
static char *secret_file_abs_path(const char *arg)
{
	const char *eq = strchr(arg, '='), *at = strrchr(arg, '@');
	if (!eq || !at || at < eq || eq[1] == '/' || eq + 1 >= at)
		return NULL;
	const char *home = getenv("HOME");
	if (eq[1] == '~' && eq[2] == '/' && home && *home == '/')
		return xasprintf("%.*s%s/%s", (int)(eq + 1 - arg), arg, home, eq + 3);
	_cleanup_free_ char *cwd = getcwd(NULL, 0);
	if (!cwd)
		return NULL;
	return xasprintf("%.*s%s/%s", (int)(eq + 1 - arg), arg, cwd, eq + 1);
}

int cap_cli_net_opt(struct cap_net_policy *p, int c, const char *arg)
{
	static const struct { int opt; const char *flag; } flags[] = {
		{ CAP_OPT_ALLOW_EGRESS, "allow-egress" }, { CAP_OPT_ALLOW_PUBLIC, "allow-public" },
		{ CAP_OPT_ALLOW_LAN, "allow-lan" }, { CAP_OPT_ALLOW_HOST, "allow-host" },
		{ CAP_OPT_PUBLISH, "publish" }, { CAP_OPT_AUTO_PUBLISH, "auto-publish" },
		{ CAP_OPT_SECRET, "secret" }, { CAP_OPT_SECRET_FILE, "secret-file" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(flags); i++) {
		if (flags[i].opt != c)
			continue;
		struct cap_err err = { 0 };
		_cleanup_free_ char *abs = NULL;
		/* A secret's file is named as the user sees it from here: made
		 * absolute now, since the sandbox starts elsewhere, later. */
		if (c == CAP_OPT_SECRET && arg && (abs = secret_abs_path(arg)))
			arg = abs;
		if (c == CAP_OPT_SECRET_FILE && arg && (abs = secret_file_abs_path(arg)))
			arg = abs;
		/* The policy's messages quote the flag and its value. */
		if (cap_net_policy_apply(p, flags[i].flag, arg, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return -1;
		}
		return 1;
	}
	return 0;
}

const char *cap_cli_net_route(void)
{
	static char route[1024];
	static const char *const vars[] = { "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy",
					    "HTTP_PROXY", "http_proxy" };
	const char *proxy = NULL, *var = NULL;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(vars) && !proxy; i++) {
		const char *v = getenv(vars[i]);
		if (v && *v) {
			proxy = v;
			var = vars[i];
		}
	}
	if (!proxy)
		return "direct from this host (no HTTPS_PROXY, HTTP_PROXY or ALL_PROXY set)";
	const char *np = getenv("NO_PROXY") ? getenv("NO_PROXY") : getenv("no_proxy");
	snprintf(route, sizeof(route), "through the upstream proxy %.300s (%s) by CONNECT, never direct%s%.300s%s",
		 proxy, var, np && *np ? "; NO_PROXY bypass: " : "", np && *np ? np : "",
		 np && *np ? " (direct)" : "");
	return route;
}

static const char usage[] =
	"Usage: capsule net show NAME\n"
	"       capsule net set NAME [--none | NETWORK FLAGS...]\n"
	"       capsule net log NAME\n"
	"\n"
	"show  Print the sandbox's network policy and the route allowed traffic takes.\n"
	"set   Replace the policy with the flags given (--none: no network). A\n"
	"      running sandbox with a network interface applies it to its next\n"
	"      connections without a restart; giving a sandbox its first interface,\n"
	"      or taking it away, applies at its next start. Published ports and\n"
	"      --auto-publish also change only at the next start.\n"
	"log   Print the sandbox's network log: each refused connection or DNS\n"
	"      query with the rule that refused it (net.log in its directory).\n"
	"\n"
	CAP_CLI_NET_HELP;

static int show(const char *name)
{
	struct cap_record rec;
	struct cap_err err = { 0 };
	_cleanup_free_ struct cap_net_policy *p = xmalloc(sizeof(*p));
	if (cap_named_load(name, &rec, &err) < 0 || cap_record_net(&rec, p, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	_cleanup_free_ char *d = cap_net_policy_describe(p);
	printf("network: %s\n", d);
	if (p->enabled)
		printf("route:   %s\n", cap_cli_net_route());
	return 0;
}

static int set(const char *name, int argc, char **argv)
{
	static const struct option opts[] = {
		CAP_CLI_NET_OPTS,
		{ "none", no_argument, NULL, 'n' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	_cleanup_free_ struct cap_net_policy *p = xmalloc(sizeof(*p));
	struct cap_err err = { 0 };
	bool none = false, any = false, restart;
	int c, k;
	cap_net_policy_init(p);
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		if ((k = cap_cli_net_opt(p, c, optarg)) < 0)
			return CAP_EXIT_USAGE;
		if (k > 0) {
			any = true;
			continue;
		}
		if (c == 'n') {
			none = true;
			continue;
		}
		fputs(usage, c == 'h' ? stdout : stderr);
		return c == 'h' ? 0 : CAP_EXIT_USAGE;
	}
	if (optind != argc) {
		cap_cli_error("net set: unexpected argument '%s' (give NAME, then the flags)", argv[optind]);
		return CAP_EXIT_USAGE;
	}
	if (none == any) {
		cap_cli_error(none ? "net set: --none takes no other flag"
				   : "net set: give the new policy's flags, or --none for no network");
		return CAP_EXIT_USAGE;
	}
	/* A controller's sandboxes follow its one policy. */
	struct cap_ctl_holder h;
	int owned = cap_ctl_owner_of(name, &h);
	if (owned < 0) {
		cap_cli_error("cannot tell whether a capsule serve or mcp owns sandbox '%s': %s", name,
			      strerror(-owned));
		return CAP_EXIT_FAILURE;
	}
	if (owned > 0) {
		cap_cli_error("sandbox '%s' belongs to capsule %s (pid %d), whose network policy every sandbox it runs follows; change that server's --allow-*/--publish flags (or its configuration's \"network\") instead",
			      name, h.frontend, (int)h.pid);
		return CAP_EXIT_FAILURE;
	}
	if (cap_named_set_network(name, p, &restart, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	_cleanup_free_ char *d = cap_net_policy_describe(p);
	printf("network: %s\n", d);
	if (restart && p->enabled)
		printf("the running sandbox cannot take all of it now (it has no network interface, its policy process is gone, or its secrets changed: a policy process keeps the secrets it started with; see `capsule inspect %s`): it takes full effect at its next start (`capsule stop %s`, then use it again)\n",
		       name, name);
	else if (restart)
		printf("everything is refused now; the network interface goes at the next start (`capsule stop %s`)\n", name);
	return 0;
}

static int show_log(const char *name)
{
	struct cap_record rec;
	struct cap_err err = { 0 };
	if (cap_named_load(name, &rec, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *path = xasprintf("%s/net.log", dir);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;	/* nothing refused yet, or no network */
		cap_cli_error("cannot read %s: %s", path, strerror(errno));
		return CAP_EXIT_FAILURE;
	}
	char buf[65536];
	ssize_t n;
	while ((n = read(fd, buf, sizeof(buf))) > 0)
		if (fwrite(buf, 1, (size_t)n, stdout) != (size_t)n)
			break;
	int rerr = n < 0 ? errno : 0;
	close(fd);
	if (rerr) {
		cap_cli_error("cannot read %s: %s", path, strerror(rerr));
		return CAP_EXIT_FAILURE;
	}
	if (fflush(stdout) != 0 || ferror(stdout)) {
		cap_cli_error("cannot write the log of %s: %s", name, strerror(errno));
		return CAP_EXIT_FAILURE;
	}
	return 0;
}

int cap_cli_net(int argc, char **argv)
{
	if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc < 2) {
		fputs(usage, stderr);
		return CAP_EXIT_USAGE;
	}
	const char *what = argv[1];
	if (strcmp(what, "set") != 0 && strcmp(what, "show") != 0 && strcmp(what, "log") != 0) {
		cap_cli_error("net: unknown subcommand '%s' (show, set or log; capsule net --help)", what);
		return CAP_EXIT_USAGE;
	}
	if (argc >= 3 && (strcmp(argv[2], "-h") == 0 || strcmp(argv[2], "--help") == 0)) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc < 3 || argv[2][0] == '-') {
		cap_cli_error("net %s needs the sandbox's NAME first: capsule net %s NAME%s", what, what,
			      strcmp(what, "set") == 0 ? " [--none | NETWORK FLAGS...]" : "");
		return CAP_EXIT_USAGE;
	}
	const char *name = argv[2];
	if (strcmp(what, "set") == 0)
		return set(name, argc - 2, argv + 2);
	if (argc != 3) {
		cap_cli_error("net %s takes only NAME (got '%s' after it)", what, argv[3]);
		return CAP_EXIT_USAGE;
	}
	return strcmp(what, "show") == 0 ? show(name) : show_log(name);
}
