/* What the OCI verbs share: a container's state directory (<root>/<id>/,
 * state.json and the status runc reports), calls to its monitors, the
 * verbs' option parsing, and removal of everything a container made. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "named.h"
#include "oci-int.h"
#include "paths.h"
#include "sandbox.h"
#include "sha256.h"
#include "util.h"

/* runc's rule for ids: [A-Za-z0-9_+.-]+, not "." or "..". */
bool cap_oci_id_ok(const char *id)
{
	if (!*id || strcmp(id, ".") == 0 || strcmp(id, "..") == 0 || strlen(id) > 1024)
		return false;
	for (const char *p = id; *p; p++)
		if (!isalnum((unsigned char)*p) && !strchr("_+.-", *p))
			return false;
	return true;
}

/* The sandbox of a container: oci-<40 hex of sha256(root "\0" id)>,
 * so that two roots (Podman's, containerd's) never share one. */
void cap_oci_sandbox_name(const char *id, char out[CAP_NAME_MAX + 1])
{
	char real[PATH_MAX], hex[65];
	const char *root = realpath(cap_oci_flags.root, real) ? real : cap_oci_flags.root;
	struct cap_sha256 h;
	cap_sha256_init(&h);
	cap_sha256_update(&h, root, strlen(root) + 1);
	cap_sha256_update(&h, id, strlen(id));
	cap_sha256_final_hex(&h, hex);
	snprintf(out, CAP_NAME_MAX + 1, "oci-%.40s", hex);
}

char *cap_oci_dir(const char *id) { return xasprintf("%s/%s", cap_oci_flags.root, id); }

/* ---- state ------------------------------------------------------------ */

const char *cap_oci_jstr(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "";
}

void cap_oci_state_fini(struct cap_oci_state *st)
{
	free(st->dir);
	json_decref(st->j);
	memset(st, 0, sizeof(*st));
}

bool cap_oci_exists_at(const char *dir, const char *name)
{
	_cleanup_free_ char *p = xasprintf("%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* creating, created, running, paused or stopped, as runc says. */
static const char *compute_status(struct cap_oci_state *st)
{
	/* A create still under way, or one that died half-way: what it made
	 * is in state.json already, for delete to remove. */
	pid_t creator = (pid_t)json_integer_value(json_object_get(st->j, "creator"));
	if (creator)
		return cap_oci_proc_same(creator, strtoull(cap_oci_jstr(st->j, "creatorStart"), NULL, 10)) ? "creating"
														     : "stopped";
	if (!st->pid || cap_oci_exists_at(st->dir, CAP_OCI_EXIT) || !cap_oci_proc_same(st->pid, st->start))
		return "stopped";
	if (!cap_oci_exists_at(st->dir, CAP_OCI_STARTED))
		return "created";
	struct cap_named_status ns;
	struct cap_err err = { 0 };
	if (cap_named_status(st->sandbox, &ns, &err) == 0 && ns.state == CAP_NAMED_PAUSED)
		return "paused";
	return "running";
}

/* Load a container's state: -ENOENT when there is none. */
int cap_oci_state_load(const char *id, struct cap_oci_state *st, struct cap_err *err)
{
	memset(st, 0, sizeof(*st));
	if (!cap_oci_id_ok(id))
		return cap_err_set(err, ENOENT, "container does not exist");
	snprintf(st->id, sizeof(st->id), "%s", id);
	st->dir = cap_oci_dir(id);
	_cleanup_free_ char *path = xasprintf("%s/state.json", st->dir);
	json_error_t je;
	st->j = json_load_file(path, 0, &je);
	if (!st->j) {
		cap_oci_state_fini(st);
		return cap_err_set(err, ENOENT, "container does not exist");
	}
	st->pid = (pid_t)json_integer_value(json_object_get(st->j, "pid"));
	st->start = strtoull(cap_oci_jstr(st->j, "pidStart"), NULL, 10);
	snprintf(st->sandbox, sizeof(st->sandbox), "%s", cap_oci_jstr(st->j, "sandbox"));
	/* The capsule home the container was made in, whatever environment
	 * this verb runs with (Podman runs create through conmon, with
	 * conmon_env_vars, and delete itself, with its own). */
	if (*cap_oci_jstr(st->j, "capsuleHome"))
		setenv("CAPSULE_HOME", cap_oci_jstr(st->j, "capsuleHome"), 1);
	st->status = compute_status(st);
	return 0;
}

int cap_oci_state_write(const char *dir, json_t *j, struct cap_err *err)
{
	_cleanup_free_ char *path = xasprintf("%s/state.json", dir);
	char *s = json_dumps(j, JSON_COMPACT | JSON_PRESERVE_ORDER);
	int r = cap_write_file_atomic(path, s, strlen(s), 0600);
	free(s);
	if (r < 0)
		return cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r));
	return 0;
}

/* runc's state object. */
json_t *cap_oci_state_json(struct cap_oci_state *st)
{
	bool stopped = strcmp(st->status, "stopped") == 0 || strcmp(st->status, "creating") == 0;
	json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "ociVersion", CAP_OCI_VERSION, "id", st->id,
			      "pid", (json_int_t)(stopped ? 0 : st->pid), "status", st->status, "bundle",
			      cap_oci_jstr(st->j, "bundle"), "rootfs", cap_oci_jstr(st->j, "rootfs"), "created",
			      cap_oci_jstr(st->j, "created"));
	json_t *ann = json_object_get(st->j, "annotations");
	if (json_object_size(ann))
		json_object_set(o, "annotations", ann);
	json_object_set_new(o, "owner", json_string(""));
	return o;
}

int cap_oci_print_json(json_t *v, size_t flags)
{
	char *s = json_dumps(v, flags | JSON_PRESERVE_ORDER | JSON_ENCODE_ANY);
	json_decref(v);
	if (!s)
		return 1;
	printf("%s\n", s);
	free(s);
	return fflush(stdout) == 0 ? 0 : 1;
}

/* Call the monitor socket name in dir (or its exec/ subdirectory). */
int cap_oci_call(const char *dir, const char *sub, const char *name, const char *line,
		 char *ans, size_t len, int timeout_ms, struct cap_err *err)
{
	_cleanup_free_ char *d = sub ? xasprintf("%s/%s", dir, sub) : xstrdup(dir);
	_cleanup_close_ int dfd = open(d, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return cap_err_set(err, errno, "%s: %s", d, strerror(errno));
	char path[128];
	cap_oci_sock_path(dfd, name, path, sizeof(path));
	int r = cap_oci_monitor_call(path, line, ans, len, timeout_ms, err);
	if (r == 0 && strncmp(ans, "ok", 2) != 0)
		return cap_err_set(err, EINVAL, "%s", strncmp(ans, "error ", 6) == 0 ? ans + 6 : ans);
	return r;
}

/* ---- options ---------------------------------------------------------- */

/* Parse a verb's options with table opts and short string shorts (with
 * '+': options before the operands). Returns -1 to go on, else the exit
 * code (usage printed). cb handles each option: 0 ok, else exit code. */
int cap_oci_parse(int argc, char **argv, const char *shorts, const struct option *opts,
		  const char *usage, cap_oci_opt_fn cb, void *ud)
{
	int c;
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, shorts, opts, NULL)) != -1) {
		if (c == 'h') {
			fputs(usage, stdout);
			return 0;
		}
		if (c == '?' || c == ':') {
			cap_oci_error("%s: unknown or incomplete option '%s'", argv[0], argv[optind - 1]);
			fputs(usage, stderr);
			return 1;
		}
		int r = cb(ud, c, optarg);
		if (r)
			return r;
	}
	return -1;
}

static int no_opt(void *ud, int c, const char *arg)
{
	(void)ud;
	(void)c;
	(void)arg;
	return 0;
}

/* The one operand of a verb without options but --help. */
const char *cap_oci_one_id(int argc, char **argv, const char *usage, int *rc)
{
	static const struct option opts[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
	*rc = cap_oci_parse(argc, argv, "+h", opts, usage, no_opt, NULL);
	if (*rc >= 0)
		return NULL;
	if (optind != argc - 1) {
		cap_oci_error("%s needs exactly one container id", argv[0]);
		*rc = 1;
		return NULL;
	}
	return argv[optind];
}

static int flag_opt(void *ud, int c, const char *arg)
{
	(void)c;
	(void)arg;
	*(bool *)ud = true;
	return 0;
}

/* Parse the options of a verb whose one flag is --FLAG/-SHORTC (kill's
 * --all, delete's --force): like cap_oci_parse, *set says whether it was
 * given. */
int cap_oci_flag_verb(int argc, char **argv, const char *flag, char shortc, const char *usage,
		      bool *set)
{
	const struct option opts[] = {
		{ flag, no_argument, NULL, shortc }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	char shorts[] = { '+', shortc, 'h', '\0' };
	*set = false;
	return cap_oci_parse(argc, argv, shorts, opts, usage, flag_opt, set);
}

int cap_oci_preserve_ok(const char *arg)
{
	if (strcmp(arg, "0") != 0) {
		cap_oci_error("--preserve-fds %s: capsule-oci passes no descriptors into a VM; only 0 is supported", arg);
		return 1;
	}
	return 0;
}

int cap_oci_format_opt(void *ud, int c, const char *arg)
{
	const char **fmt = ud;
	if (c == 'f') {
		if (strcmp(arg, "table") != 0 && strcmp(arg, "json") != 0) {
			cap_oci_error("--format %s: table or json", arg);
			return 1;
		}
		*fmt = arg;
	} else if (c == 'q') {
		fmt[1] = "quiet";
	}
	return 0;
}

/* ---- processes -------------------------------------------------------- */

/* Write a pid file as runc does: a temporary file, then rename. */
int cap_oci_write_pid_file(const char *path, pid_t pid, struct cap_err *err)
{
	char buf[32];
	int n = snprintf(buf, sizeof(buf), "%d", (int)pid);
	int r = cap_write_file_atomic(path, buf, (size_t)n, 0644);
	if (r < 0)
		return cap_err_set(err, -r, "--pid-file %s: %s", path, strerror(-r));
	return 0;
}

/* Read what a forked monitor says once ready: 0 for "ok", else -1 with
 * its error in err. */
int cap_oci_wait_ready(int fd, pid_t pid, struct cap_err *err)
{
	char buf[2048];
	size_t n = 0;
	for (;;) {
		ssize_t k = read(fd, buf + n, sizeof(buf) - 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		n += (size_t)k;
		if (n == sizeof(buf) - 1)
			break;
	}
	close(fd);
	buf[n] = '\0';
	while (n && buf[n - 1] == '\n')
		buf[--n] = '\0';
	if (strcmp(buf, "ok") == 0)
		return 0;
	waitpid(pid, NULL, 0);
	if (!n)
		return cap_err_set(err, EPIPE, "the container's monitor process ended before it was ready");
	return cap_err_set(err, EIO, "%s", buf);
}

/* Remove everything of a container: its sandbox, cgroups (only those
 * its create made or took, cg; NULL: none) and directory. */
int cap_oci_destroy(const char *dir, const char *sandbox, const struct cap_oci_cgroups *cg, struct cap_err *err)
{
	struct cap_err e2 = { 0 };
	int r = 0;
	/* A VM still running here (a create that died, a monitor killed) is
	 * not asked to shut down: its disks go next. */
	if (sandbox && *sandbox)
		cap_named_kill(sandbox, NULL);
	if (sandbox && *sandbox && cap_named_remove(sandbox, true, &e2) < 0 && e2.code != ENOENT) {
		r = cap_err_set(err, e2.code, "%s", e2.msg);
		e2.code = 0;
	}
	if (cg && cap_oci_cgroup_remove(cg, &e2) < 0 && !r)
		r = cap_err_set(err, e2.code, "%s", e2.msg);
	int k = cap_remove_tree(dir);
	if (k < 0 && !r)
		r = cap_err_set(err, -k, "cannot remove %s: %s", dir, strerror(-k));
	return r;
}

/* Pause or resume the sandbox through its shim. */
int cap_oci_vm_op(const char *sandbox, bool pause, struct cap_err *err)
{
	struct cap_named_status ns;
	int r;
	if ((r = cap_named_status(sandbox, &ns, err)) < 0)
		return r;
	if (ns.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ESRCH, "container not running");
	if ((r = cap_named_pause(sandbox, pause, err)) < 0)
		cap_err_prefix(err, "cannot %s the container's sandbox %s", pause ? "pause" : "resume", sandbox);
	return r;
}
