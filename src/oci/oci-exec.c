/* capsule-oci exec: a process in a running container, from the command
 * line over the config's process; a monitor stands for it, this process
 * itself or, with --detach, a forked one. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "oci-int.h"
#include "paths.h"
#include "util.h"

struct exec_opts {
	const char *process, *pid_file, *console_socket, *cwd, *user;
	bool detach, tty;
	const char *env[256];
	size_t nenv;
	uint32_t gids[CAP_OCI_MAX_GROUPS];
	uint32_t ngids;
};

static int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long v = strtoul(s, &end, 10);
	if (!*s || *end || errno || v > UINT32_MAX)
		return -1;
	*out = (uint32_t)v;
	return 0;
}

static int exec_opt(void *ud, int c, const char *arg)
{
	struct exec_opts *o = ud;
	switch (c) {
	case 'p': case CAP_OCI_OPT_PROCESS: o->process = arg; return 0;
	case 'd': o->detach = true; return 0;
	case 't': o->tty = true; return 0;
	case CAP_OCI_OPT_PID_FILE: o->pid_file = arg; return 0;
	case CAP_OCI_OPT_CONSOLE: o->console_socket = arg; return 0;
	case CAP_OCI_OPT_CWD: o->cwd = arg; return 0;
	case 'u': o->user = arg; return 0;
	case 'e':
		if (!strchr(arg, '=')) {
			cap_oci_error("--env '%s' is not NAME=VALUE", arg);
			return 1;
		}
		if (o->nenv == CAP_ARRAY_SIZE(o->env)) {
			cap_oci_error("too many --env options");
			return 1;
		}
		o->env[o->nenv++] = arg;
		return 0;
	case 'g': case CAP_OCI_OPT_GIDS: {
		_cleanup_free_ char *copy = xstrdup(arg);
		char *save = NULL;
		for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
			if (o->ngids == CAP_OCI_MAX_GROUPS || parse_u32(t, &o->gids[o->ngids]) < 0) {
				cap_oci_error("--additional-gids '%s': numeric group ids, at most %d", arg,
					      CAP_OCI_MAX_GROUPS);
				return 1;
			}
			o->ngids++;
		}
		return 0;
	}
	case CAP_OCI_OPT_PRESERVE: return cap_oci_preserve_ok(arg);
	default: return 0;	/* --no-new-privs, --cap, --process-label, --apparmor: a VM's own */
	}
}

/* exec's process from its command line over the container's config
 * process, as runc builds it. */
static int exec_process(const struct exec_opts *o, char **args, size_t nargs, struct cap_oci_state *st,
			struct cap_oci_process *p, struct cap_err *err)
{
	if (o->process) {
		int r = cap_oci_process_load(o->process, p, err);
		if (r < 0)
			return r;
		p->terminal = p->terminal || o->tty;
		return 0;
	}
	if (nargs == 0)
		return cap_err_set(err, EINVAL, "exec needs a command after the container id, or --process FILE");
	struct cap_err e2 = { 0 };
	if (cap_oci_config_process(cap_oci_jstr(st->j, "bundle"), p, &e2) < 0) {
		memset(p, 0, sizeof(*p));
		p->env = xcalloc(2, sizeof(char *));
		p->env[p->nenv++] = xstrdup("PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
		p->cwd = xstrdup("/");
		p->umask = 022;
	}
	cap_strv_free(p->args, p->nargs);
	p->args = xcalloc(nargs + 1, sizeof(char *));
	for (size_t i = 0; i < nargs; i++)
		p->args[i] = xstrdup(args[i]);
	p->nargs = nargs;
	p->terminal = o->tty;
	p->rows = p->cols = 0;
	if (o->cwd) {
		free(p->cwd);
		p->cwd = xstrdup(o->cwd);
	}
	if (o->nenv) {
		p->env = xrealloc(p->env, (p->nenv + o->nenv + 1) * sizeof(char *));
		for (size_t i = 0; i < o->nenv; i++) {
			size_t k = (size_t)(strchr(o->env[i], '=') - o->env[i]) + 1, j;
			for (j = 0; j < p->nenv; j++)
				if (strncmp(p->env[j], o->env[i], k) == 0)
					break;
			if (j < p->nenv)
				free(p->env[j]);
			else
				p->nenv++;
			p->env[j] = xstrdup(o->env[i]);
		}
		p->env[p->nenv] = NULL;
	}
	if (o->user) {
		_cleanup_free_ char *u = xstrdup(o->user);
		char *colon = strchr(u, ':');
		if (colon)
			*colon = '\0';
		if (parse_u32(u, &p->uid) < 0 || (colon && parse_u32(colon + 1, &p->gid) < 0))
			return cap_err_set(err, EINVAL, "--user '%s': give UID[:GID] as numbers", o->user);
		if (!colon)
			p->gid = 0;
		p->ngroups = 0;
	}
	if (o->ngids) {
		memcpy(p->groups, o->gids, o->ngids * sizeof(o->gids[0]));
		p->ngroups = o->ngids;
	}
	return 0;
}

int cap_oci_cmd_exec(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "process", required_argument, NULL, 'p' },
		{ "detach", no_argument, NULL, 'd' },
		{ "pid-file", required_argument, NULL, CAP_OCI_OPT_PID_FILE },
		{ "tty", no_argument, NULL, 't' },
		{ "console-socket", required_argument, NULL, CAP_OCI_OPT_CONSOLE },
		{ "cwd", required_argument, NULL, CAP_OCI_OPT_CWD },
		{ "env", required_argument, NULL, 'e' },
		{ "user", required_argument, NULL, 'u' },
		{ "additional-gids", required_argument, NULL, 'g' },
		{ "no-new-privs", no_argument, NULL, CAP_OCI_OPT_NNP },
		{ "cap", required_argument, NULL, 'c' },
		{ "preserve-fds", required_argument, NULL, CAP_OCI_OPT_PRESERVE },
		{ "process-label", required_argument, NULL, CAP_OCI_OPT_LABEL },
		{ "apparmor", required_argument, NULL, CAP_OCI_OPT_APPARMOR },
		{ "ignore-paused", no_argument, NULL, CAP_OCI_OPT_IGNORE_PAUSED },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	static const char usage[] =
		"Usage: capsule-oci exec [--process FILE] [--detach] [--pid-file FILE] [--tty]\n"
		"                        [--console-socket SOCK] [--cwd DIR] [--env K=V]...\n"
		"                        [--user UID[:GID]] [--additional-gids G] ID [COMMAND...]\n"
		"\nRun a process in the running container ID. Detached, a monitor process stands\n"
		"for it (its pid goes to --pid-file); otherwise this process does and exits\n"
		"with the process's status.\n";
	struct exec_opts o = { 0 };
	int rc = cap_oci_parse(argc, argv, "+p:dte:u:g:c:h", opts, usage, exec_opt, &o);
	if (rc >= 0)
		return rc;
	if (optind >= argc) {
		cap_oci_error("exec needs a container id");
		return 1;
	}
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (cap_oci_state_load(argv[optind], &st, &err) < 0)
		return cap_oci_fail(&err);
	struct cap_oci_process p;
	memset(&p, 0, sizeof(p));
	rc = 1;
	if (strcmp(st.status, "stopped") == 0)
		cap_err_set(&err, EINVAL, "cannot exec in a stopped container");
	else if (strcmp(st.status, "created") == 0 || strcmp(st.status, "creating") == 0)
		cap_err_set(&err, EINVAL, "cannot exec in a container that has not started");
	else if (strcmp(st.status, "paused") == 0)
		cap_err_set(&err, EINVAL, "cannot exec in a paused container");
	else
		exec_process(&o, argv + optind + 1, (size_t)(argc - optind - 1), &st, &p, &err);
	if (err.code) {
		cap_oci_fail(&err);
		goto out;
	}
	/* In a pod's container: its namespace and cgroup in the pod's VM. */
	struct cap_exec_container join = { .options = CAP_CTR_JOIN };
	bool member = strcmp(cap_oci_jstr(st.j, "podRole"), "container") == 0;
	snprintf(join.name, sizeof(join.name), "%s", cap_oci_jstr(st.j, "ctrName"));
	struct cap_oci_monitor m = {
		.dir = st.dir, .sandbox = st.sandbox, .proc = &p, .pids_max = CAP_OCI_PIDS_MAX_DEFAULT,
		.console_socket = o.console_socket, .ready_fd = -1,
		.ctr = member ? &join : NULL, .pod_member = member,
	};
	if (!o.detach) {
		rc = cap_oci_monitor_run(&m);
		goto out;
	}
	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		cap_oci_error("pipe: %s", strerror(errno));
		goto out;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		cap_oci_error("fork: %s", strerror(errno));
		close(pipefd[0]);
		close(pipefd[1]);
		goto out;
	}
	if (pid == 0) {
		close(pipefd[0]);
		m.detached = true;
		m.ready_fd = pipefd[1];
		m.cgroups_path = cap_oci_jstr(st.j, "cgroupsPath");
		_exit(cap_oci_monitor_run(&m));
	}
	close(pipefd[1]);
	if (cap_oci_wait_ready(pipefd[0], pid, &err) < 0 || (o.pid_file && cap_oci_write_pid_file(o.pid_file, pid, &err) < 0)) {
		cap_oci_fail(&err);
		goto out;
	}
	rc = 0;
out:
	cap_oci_process_fini(&p);
	cap_oci_state_fini(&st);
	return rc;
}
