/* The OCI runtime's command line (docs/oci.md): runc's global flags and
 * verbs as Podman (through conmon) and containerd (through its runc v2
 * shim) call them, with runc's exit codes and error words. One container
 * is one named sandbox plus a monitor process (oci-monitor.c); its state
 * lives in <root>/<id>/ (oci-int.h). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <inttypes.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "log.h"
#include "named.h"
#include "oci-int.h"
#include "paths.h"
#include "sandbox.h"
#include "sha256.h"
#include "store.h"
#include "util.h"

#define DEFAULT_ROOT "/run/capsule-oci"
/* The guest cgroup's pids.max of a container without a pids limit. */
#define PIDS_MAX_DEFAULT 32768
/* How long a monitor may take to answer: it serves its socket at all
 * times (its output held for a slow reader) but in its last seconds,
 * while it stops the VM; delete --force ends one that does not. */
#define START_TIMEOUT_MS 30000
#define KILL_TIMEOUT_MS 5000
#define DELETE_TIMEOUT_MS 3000

/* runc's global flags. */
static struct {
	const char *root;
	const char *log;
	bool log_json;
	bool systemd_cgroup;
	bool debug;
} g = { .root = DEFAULT_ROOT };

/* "2006-01-02T15:04:05Z" (nanos: with .NNNNNNNNN trimmed as Go's
 * RFC3339Nano does). */
static void rfc3339(char *buf, size_t len, bool nanos)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	if (nanos && ts.tv_nsec) {
		char frac[16];
		snprintf(frac, sizeof(frac), ".%09ld", ts.tv_nsec);
		size_t k = strlen(frac);
		while (frac[k - 1] == '0')
			frac[--k] = '\0';
		snprintf(buf + n, len - n, "%sZ", frac);
	} else {
		snprintf(buf + n, len - n, "Z");
	}
}

void cap_oci_log_only(const char *level, const char *msg)
{
	if (!g.log)
		return;
	char now[40];
	rfc3339(now, sizeof(now), false);
	char *line;
	if (g.log_json) {
		json_t *o = json_pack("{s:s,s:s,s:s}", "level", level, "msg", msg, "time", now);
		char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
		json_decref(o);
		line = xasprintf("%s\n", s ? s : "{}");
		free(s);
	} else {
		/* logrus's text form: msg quoted with " and \ escaped. */
		size_t n = strlen(msg);
		char *q = xmalloc(2 * n + 1), *p = q;
		for (size_t i = 0; i < n; i++) {
			if (msg[i] == '"' || msg[i] == '\\')
				*p++ = '\\';
			*p++ = msg[i] == '\n' ? ' ' : msg[i];
		}
		*p = '\0';
		line = xasprintf("time=\"%s\" level=%s msg=\"%s\"\n", now, level, q);
		free(q);
	}
	int fd = open(g.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		cap_write_all(fd, line, strlen(line));
		close(fd);
	}
	free(line);
}

void cap_oci_error(const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "capsule-oci: %s\n", msg);
	fflush(stderr);
	cap_oci_log_only("error", msg);
}

/* The library's lines go to the log file only: our stderr is often the
 * container's (a monitor's), and runc prints nothing but errors. */
static void log_sink(void *ud, enum cap_log_level level, const char *line)
{
	(void)ud;
	if (level == CAP_LOG_INFO && !g.debug)
		return;
	cap_oci_log_only(level == CAP_LOG_ERROR ? "error" : level == CAP_LOG_WARN ? "warning" : "info", line);
}

static int fail(const struct cap_err *err)
{
	cap_oci_error("%s", err->msg);
	return 1;
}

/* runc's rule for ids: [A-Za-z0-9_+.-]+, not "." or "..". */
static bool id_ok(const char *id)
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
static void sandbox_name(const char *id, char out[CAP_NAME_MAX + 1])
{
	char real[PATH_MAX], hex[65];
	const char *root = realpath(g.root, real) ? real : g.root;
	struct cap_sha256 h;
	cap_sha256_init(&h);
	cap_sha256_update(&h, root, strlen(root) + 1);
	cap_sha256_update(&h, id, strlen(id));
	cap_sha256_final_hex(&h, hex);
	snprintf(out, CAP_NAME_MAX + 1, "oci-%.40s", hex);
}

static char *cdir(const char *id) { return xasprintf("%s/%s", g.root, id); }

/* ---- state ------------------------------------------------------------ */

struct ostate {
	char id[1100];
	char *dir;
	json_t *j;	/* state.json */
	pid_t pid;
	unsigned long long start;
	char sandbox[CAP_NAME_MAX + 1];
	const char *status;
};

static const char *jstr(json_t *o, const char *k)
{
	const char *s = json_string_value(json_object_get(o, k));
	return s ? s : "";
}

static void ostate_fini(struct ostate *st)
{
	free(st->dir);
	json_decref(st->j);
	memset(st, 0, sizeof(*st));
}

static bool exists_at(const char *dir, const char *name)
{
	_cleanup_free_ char *p = xasprintf("%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* creating, created, running, paused or stopped, as runc says. */
static const char *compute_status(struct ostate *st)
{
	/* A create still under way, or one that died half-way: what it made
	 * is in state.json already, for delete to remove. */
	pid_t creator = (pid_t)json_integer_value(json_object_get(st->j, "creator"));
	if (creator)
		return cap_oci_proc_same(creator, strtoull(jstr(st->j, "creatorStart"), NULL, 10)) ? "creating"
														     : "stopped";
	if (!st->pid || exists_at(st->dir, CAP_OCI_EXIT) || !cap_oci_proc_same(st->pid, st->start))
		return "stopped";
	if (!exists_at(st->dir, CAP_OCI_STARTED))
		return "created";
	struct cap_named_status ns;
	struct cap_err err = { 0 };
	if (cap_named_status(st->sandbox, &ns, &err) == 0 && ns.state == CAP_NAMED_PAUSED)
		return "paused";
	return "running";
}

/* Load a container's state: -ENOENT when there is none. */
static int state_load(const char *id, struct ostate *st, struct cap_err *err)
{
	memset(st, 0, sizeof(*st));
	if (!id_ok(id))
		return cap_err_set(err, ENOENT, "container does not exist");
	snprintf(st->id, sizeof(st->id), "%s", id);
	st->dir = cdir(id);
	_cleanup_free_ char *path = xasprintf("%s/state.json", st->dir);
	json_error_t je;
	st->j = json_load_file(path, 0, &je);
	if (!st->j) {
		ostate_fini(st);
		return cap_err_set(err, ENOENT, "container does not exist");
	}
	st->pid = (pid_t)json_integer_value(json_object_get(st->j, "pid"));
	st->start = strtoull(jstr(st->j, "pidStart"), NULL, 10);
	snprintf(st->sandbox, sizeof(st->sandbox), "%s", jstr(st->j, "sandbox"));
	/* The capsule home the container was made in, whatever environment
	 * this verb runs with (Podman runs create through conmon, with
	 * conmon_env_vars, and delete itself, with its own). */
	if (*jstr(st->j, "capsuleHome"))
		setenv("CAPSULE_HOME", jstr(st->j, "capsuleHome"), 1);
	st->status = compute_status(st);
	return 0;
}

static int state_write(const char *dir, json_t *j, struct cap_err *err)
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
static json_t *state_json(struct ostate *st)
{
	bool stopped = strcmp(st->status, "stopped") == 0 || strcmp(st->status, "creating") == 0;
	json_t *o = json_pack("{s:s,s:s,s:I,s:s,s:s,s:s,s:s}", "ociVersion", CAP_OCI_VERSION, "id", st->id,
			      "pid", (json_int_t)(stopped ? 0 : st->pid), "status", st->status, "bundle",
			      jstr(st->j, "bundle"), "rootfs", jstr(st->j, "rootfs"), "created",
			      jstr(st->j, "created"));
	json_t *ann = json_object_get(st->j, "annotations");
	if (json_object_size(ann))
		json_object_set(o, "annotations", ann);
	json_object_set_new(o, "owner", json_string(""));
	return o;
}

static int print_json(json_t *v, size_t flags)
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
static int call(const char *dir, const char *sub, const char *name, const char *line,
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

/* ---- verbs ------------------------------------------------------------ */

/* Parse a verb's options with table opts and short string shorts (with
 * '+': options before the operands). Returns -1 to go on, else the exit
 * code (usage printed). cb handles each option: 0 ok, else exit code. */
typedef int (*opt_fn)(void *ud, int c, const char *arg);
static int parse(int argc, char **argv, const char *shorts, const struct option *opts,
		 const char *usage, opt_fn cb, void *ud)
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

/* Write a pid file as runc does: a temporary file, then rename. */
static int write_pid_file(const char *path, pid_t pid, struct cap_err *err)
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
static int wait_ready(int fd, pid_t pid, struct cap_err *err)
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

/* Whether process pid (of that start time) is gone within ms. */
static bool gone_within(pid_t pid, unsigned long long start, int ms)
{
	int64_t until = cap_now_ms() + ms;
	while (cap_oci_proc_same(pid, start) && cap_now_ms() < until)
		usleep(10000);
	return !cap_oci_proc_same(pid, start);
}

/* Kill a monitor we may not wait for (the engine is its parent). */
static void end_process(pid_t pid, unsigned long long start, int grace_ms)
{
	if (!gone_within(pid, start, grace_ms)) {
		kill(pid, SIGKILL);
		gone_within(pid, start, 2000);
	}
}

/* The cgroups of a container as its state.json records them ("cgroups":
 * [{"dir", "ino", "made", "madeIno"}], inodes as decimal strings). */
static json_t *cgroups_json(const struct cap_oci_cgroups *cg)
{
	json_t *a = json_array();
	for (size_t i = 0; i < cg->n; i++) {
		char ino[24], made_ino[24];
		snprintf(ino, sizeof(ino), "%" PRIu64, cg->h[i].ino);
		snprintf(made_ino, sizeof(made_ino), "%" PRIu64, cg->h[i].made_ino);
		json_array_append_new(a, json_pack("{s:s,s:s,s:s,s:s}", "dir", cg->h[i].dir, "ino", ino,
						   "made", cg->h[i].made ? cg->h[i].made : "", "madeIno", made_ino));
	}
	return a;
}

static void cgroups_load(json_t *st, struct cap_oci_cgroups *cg)
{
	memset(cg, 0, sizeof(*cg));
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(st, "cgroups"), i, e) {
		if (cg->n == CAP_OCI_CGROUP_MAX || !*jstr(e, "dir"))
			break;
		struct cap_oci_cgroup *g = &cg->h[cg->n++];
		g->dir = xstrdup(jstr(e, "dir"));
		g->made = *jstr(e, "made") ? xstrdup(jstr(e, "made")) : NULL;
		g->ino = strtoull(jstr(e, "ino"), NULL, 10);
		g->made_ino = strtoull(jstr(e, "madeIno"), NULL, 10);
	}
}

/* Remove everything of a container: its sandbox, cgroups (only those
 * its create made or took, cg; NULL: none) and directory. */
static int destroy(const char *dir, const char *sandbox, const struct cap_oci_cgroups *cg, struct cap_err *err)
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

/* -- create -- */

struct create_opts {
	const char *bundle, *pid_file, *console_socket;
};

enum { O_BUNDLE = 0x100, O_PID_FILE, O_CONSOLE, O_NO_PIVOT, O_NO_KEYRING, O_PRESERVE, O_DETACH,
       O_PROCESS, O_CWD, O_GIDS, O_NNP, O_CAP, O_LABEL, O_APPARMOR, O_FORMAT, O_IGNORE_PAUSED };

static int preserve_ok(const char *arg)
{
	if (strcmp(arg, "0") != 0) {
		cap_oci_error("--preserve-fds %s: capsule-oci passes no descriptors into a VM; only 0 is supported", arg);
		return 1;
	}
	return 0;
}

static int create_opt(void *ud, int c, const char *arg)
{
	struct create_opts *o = ud;
	switch (c) {
	case 'b': case O_BUNDLE: o->bundle = arg; return 0;
	case O_PID_FILE: o->pid_file = arg; return 0;
	case O_CONSOLE: o->console_socket = arg; return 0;
	case O_PRESERVE: return preserve_ok(arg);
	default: return 0;	/* --no-pivot, --no-new-keyring, --detach: nothing to do in a VM */
	}
}

/* mkdir -p of dest's parents below seed, each with the mode and owner
 * of the same directory in the rootfs (else root's 0755), so that the
 * seeded upper layer does not change them. */
static int seed_parents(const char *seed, const char *rootfs, const char *dest, struct cap_err *err)
{
	char rel[PATH_MAX];
	snprintf(rel, sizeof(rel), "%s", dest);
	for (char *p = strchr(rel + 1, '/'); p; p = strchr(p + 1, '/')) {
		*p = '\0';
		_cleanup_free_ char *in = xasprintf("%s%s", seed, rel);
		_cleanup_free_ char *src = xasprintf("%s%s", rootfs, rel);
		struct stat st;
		mode_t mode = 0755;
		uid_t uid = 0;
		gid_t gid = 0;
		if (lstat(src, &st) == 0 && S_ISDIR(st.st_mode)) {
			mode = st.st_mode & 07777;
			uid = st.st_uid;
			gid = st.st_gid;
		}
		if (mkdir(in, mode) == 0) {
			if (chown(in, uid, gid) < 0 || chmod(in, mode) < 0)
				return cap_err_set(err, errno, "%s: %s", in, strerror(errno));
		} else if (errno != EEXIST) {
			return cap_err_set(err, errno, "mkdir %s: %s", in, strerror(errno));
		}
		*p = '/';
	}
	return 0;
}

/* A read-only root's working directory, when the rootfs lacks it: made
 * in the seed (root's, 0755), as runc makes it before the root turns
 * read-only; the agent could not make it at EXEC any more. Not when a
 * component that exists in the rootfs is a symbolic link or not a
 * directory (a directory above it would hide it): EXEC then says so. */
static int seed_cwd(const char *seed, const char *rootfs, const char *cwd, struct cap_err *err)
{
	char rel[PATH_MAX];
	if (snprintf(rel, sizeof(rel), "%s/", cwd) >= (int)sizeof(rel) || strcmp(rel, "//") == 0 ||
	    strstr(rel, "/./") || strstr(rel, "/../"))
		return 0;	/* never outside the seed: the guest resolves it */
	rel[strlen(rel) - 1] = '\0';
	char *end = rel + strlen(rel);
	for (char *p = rel + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		_cleanup_free_ char *src = xasprintf("%s%s", rootfs, rel);
		struct stat st;
		if (lstat(src, &st) < 0) {
			if (errno != ENOENT)
				return cap_err_set(err, errno, "working directory %s: %s: %s", cwd, src, strerror(errno));
			*p = c;
			break;	/* missing from here on */
		}
		*p = c;
		if (!S_ISDIR(st.st_mode))
			return 0;
		if (p == end)
			return 0;	/* the image has it */
	}
	int r = seed_parents(seed, rootfs, cwd, err);
	if (r < 0)
		return r;
	_cleanup_free_ char *in = xasprintf("%s%s", seed, cwd);
	if (mkdir(in, 0755) < 0 && errno != EEXIST)
		return cap_err_set(err, errno, "mkdir %s: %s", in, strerror(errno));
	if (chown(in, 0, 0) < 0 || chmod(in, 0755) < 0)
		return cap_err_set(err, errno, "%s: %s", in, strerror(errno));
	return 0;
}

/* The bind-mounted files, copied into a seed tree for the root's upper
 * layer: their content and mode, owned by root; with a read-only root,
 * the working directory the rootfs lacks. */
static int make_seed(const struct cap_oci_config *cfg, const char *seed, struct cap_err *err)
{
	if (mkdir(seed, 0755) < 0)
		return cap_err_set(err, errno, "mkdir %s: %s", seed, strerror(errno));
	int r;
	if (cfg->root_readonly && cfg->process.cwd &&
	    (r = seed_cwd(seed, cfg->rootfs, cfg->process.cwd, err)) < 0)
		return r;
	for (size_t i = 0; i < cfg->nfiles; i++) {
		const struct cap_oci_file *f = &cfg->files[i];
		struct stat st;
		_cleanup_free_ char *data = NULL;
		if (stat(f->source, &st) < 0)
			return cap_err_set(err, errno, "mount source %s (for %s): %s", f->source, f->dest, strerror(errno));
		ssize_t n = cap_read_file(f->source, CAP_OCI_FILE_MAX, &data);
		if (n < 0)
			return cap_err_set(err, (int)-n, "mount source %s (for %s): %s", f->source, f->dest,
					   n == -EFBIG ? "over 1 MiB: only small files are copied in" : strerror((int)-n));
		r = seed_parents(seed, cfg->rootfs, f->dest, err);
		if (r < 0)
			return r;
		_cleanup_free_ char *to = xasprintf("%s%s", seed, f->dest);
		int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return cap_err_set(err, errno, "%s: %s", to, strerror(errno));
		r = cap_write_all(fd, data, (size_t)n);
		if (r == 0 && (fchown(fd, 0, 0) < 0 || fchmod(fd, st.st_mode & 07777) < 0))
			r = -errno;
		close(fd);
		if (r < 0)
			return cap_err_set(err, -r, "%s: %s", to, strerror(-r));
	}
	return 0;
}

static const char create_usage[] =
	"Usage: capsule-oci create [--bundle DIR] [--pid-file FILE] [--console-socket SOCK] ID\n"
	"\nCreate the container ID from the bundle DIR (default .): its rootfs becomes a\n"
	"sandbox's root image and a monitor process, held until `start`, stands for its\n"
	"process (its pid goes to --pid-file).\n";

static int oci_create(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "bundle", required_argument, NULL, 'b' },
		{ "pid-file", required_argument, NULL, O_PID_FILE },
		{ "console-socket", required_argument, NULL, O_CONSOLE },
		{ "no-pivot", no_argument, NULL, O_NO_PIVOT },
		{ "no-new-keyring", no_argument, NULL, O_NO_KEYRING },
		{ "preserve-fds", required_argument, NULL, O_PRESERVE },
		{ "detach", no_argument, NULL, 'd' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct create_opts o = { .bundle = "." };
	int r = parse(argc, argv, "+b:dh", opts, create_usage, create_opt, &o);
	if (r >= 0)
		return r;
	if (optind != argc - 1) {
		cap_oci_error("create needs exactly one container id");
		return 1;
	}
	const char *id = argv[optind];
	struct cap_err err = { 0 };
	if (!id_ok(id)) {
		cap_oci_error("invalid container id '%s': use letters, digits, '_', '+', '-' and '.'", id);
		return 1;
	}
	char bundle[PATH_MAX];
	if (!realpath(o.bundle, bundle)) {
		cap_oci_error("bundle %s: %s", o.bundle, strerror(errno));
		return 1;
	}
	struct cap_oci_config cfg;
	memset(&cfg, 0, sizeof(cfg));
	if (cap_oci_config_load(bundle, g.systemd_cgroup, &cfg, &err) < 0)
		return fail(&err);
	int rc = 1;
	bool made_dir = false;
	char name[CAP_NAME_MAX + 1];
	struct cap_image img;
	memset(&img, 0, sizeof(img));
	_cleanup_free_ char *dir = cdir(id);
	_cleanup_free_ char *seed = xasprintf("%s/seed", dir);
	_cleanup_free_ char *home = NULL;
	char home_real[PATH_MAX];
	const char **skip = NULL;
	json_t *st = NULL;
	struct cap_oci_cgroups cg = { 0 };

	if ((r = cap_mkdir_p(g.root, 0711)) < 0) {
		cap_err_set(&err, -r, "--root %s: %s", g.root, strerror(-r));
		goto out;
	}
	if (mkdir(dir, 0711) < 0) {
		if (errno == EEXIST)
			cap_err_set(&err, EEXIST, "container with id exists: %s", id);
		else
			cap_err_set(&err, errno, "mkdir %s: %s", dir, strerror(errno));
		goto out;
	}
	made_dir = true;
	sandbox_name(id, name);
	/* The cgroups it will make or take, or a refusal of a cgroup that
	 * holds someone else's processes, before anything is made. */
	if (cap_oci_cgroup_plan(cfg.cgroups_path, &cg, &err) < 0)
		goto out;

	/* state.json before anything is made, naming what will be (the
	 * sandbox, the cgroup) and who makes it: a create that dies half-way
	 * leaves a container that state and list call stopped and delete
	 * removes whole. */
	char created[64], cstart[32];
	rfc3339(created, sizeof(created), true);
	snprintf(cstart, sizeof(cstart), "%llu", cap_oci_proc_start(getpid()));
	home = cap_home_dir();
	st = json_pack("{s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:s,s:I,s:s,s:I,s:s}", "ociVersion", CAP_OCI_VERSION,
		       "id", id, "bundle", bundle, "rootfs", cfg.rootfs, "created", created, "sandbox", name,
		       "capsuleHome", realpath(home, home_real) ? home_real : home,
		       "cgroupsPath", cfg.cgroups_path ? cfg.cgroups_path : "", "pid", (json_int_t)0,
		       "pidStart", "0", "creator", (json_int_t)getpid(), "creatorStart", cstart);
	json_t *ann = json_object();
	for (size_t i = 0; i < cfg.nann; i++)
		json_object_set_new(ann, cfg.ann_keys[i], json_string(cfg.ann_values[i]));
	json_object_set_new(st, "annotations", ann);
	json_object_set_new(st, "cgroups", cgroups_json(&cg));
	if (state_write(dir, st, &err) < 0)
		goto out;

	/* The rootfs as an image, without what the engine mounts over it. */
	size_t nskip = 0;
	skip = xcalloc(cfg.nfiles + cfg.nguest_mounts + 1, sizeof(*skip));
	for (size_t i = 0; i < cfg.nfiles; i++)
		skip[nskip++] = cfg.files[i].dest;
	for (size_t i = 0; i < cfg.nguest_mounts; i++)
		skip[nskip++] = cfg.guest_mounts[i];
	bool cached;
	if (cap_store_image_from_rootfs(cfg.rootfs, skip, nskip, NULL, NULL, &img, &cached, &err) < 0)
		goto out;
	if (make_seed(&cfg, seed, &err) < 0)
		goto out;

	struct cap_record rec;
	cap_record_init(&rec);
	snprintf(rec.name, sizeof(rec.name), "%s", name);
	snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", img.digest);
	rec.cpus = cfg.cpus ? cfg.cpus : rec.cpus;
	rec.memory_mib = cfg.memory_mib ? cfg.memory_mib : CAP_OCI_MEMORY_DEFAULT_MIB;
	/* The upper disk (sparse) takes the container's writes: room for a
	 * copy-up of the whole image and half as much again. */
	unsigned img_mib = (unsigned)((img.size + (1u << 20) - 1) >> 20);
	unsigned want = (img_mib + img_mib / 2 + 63) / 64 * 64;
	if (want > rec.root_size_mib)
		rec.root_size_mib = want;
	if (cfg.hostname)
		snprintf(rec.hostname, sizeof(rec.hostname), "%s", cfg.hostname);
	rec.root_readonly = cfg.root_readonly;
	memcpy(rec.tmpfs, cfg.tmpfs, cfg.ntmpfs * sizeof(cfg.tmpfs[0]));
	rec.ntmpfs = cfg.ntmpfs;
	rec.root_seed = seed;
	if ((r = cap_named_create(&rec, NULL, NULL, &err)) == -EEXIST) {
		/* Left by a create of the same id that died half-way (its state
		 * directory is gone, so nothing else knows it): replace it. */
		struct cap_err e2 = { 0 };
		memset(&err, 0, sizeof(err));
		if (cap_named_remove(name, true, &e2) == 0)
			r = cap_named_create(&rec, NULL, NULL, &err);
	}
	if (r < 0)
		goto out;
	cap_remove_tree(seed);
	r = cap_oci_cgroup_create(&cfg, &cg, &err);
	/* What it made, with the inodes that tell it from a folder made
	 * again by someone else, before any process joins it. */
	json_object_set_new(st, "cgroups", cgroups_json(&cg));
	if (r < 0 || (cg.n && state_write(dir, st, &err) < 0))
		goto out;

	int pipefd[2];
	if (pipe2(pipefd, O_CLOEXEC) < 0) {
		cap_err_set(&err, errno, "pipe: %s", strerror(errno));
		goto out;
	}
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0) {
		cap_err_set(&err, errno, "fork: %s", strerror(errno));
		close(pipefd[0]);
		close(pipefd[1]);
		goto out;
	}
	if (pid == 0) {
		close(pipefd[0]);
		struct cap_oci_monitor m = {
			.dir = dir, .sandbox = name, .cgroups_path = cfg.cgroups_path, .proc = &cfg.process,
			.pids_max = cfg.pids_limit > 0 ? (uint32_t)CAP_MIN(cfg.pids_limit, 1 << 22) : PIDS_MAX_DEFAULT,
			.gate = true, .detached = true, .console_socket = o.console_socket, .ready_fd = pipefd[1],
		};
		_exit(cap_oci_monitor_run(&m));
	}
	close(pipefd[1]);
	/* The monitor, for delete to end should we die before it is ready. */
	char startbuf[32];
	snprintf(startbuf, sizeof(startbuf), "%llu", cap_oci_proc_start(pid));
	json_object_set_new(st, "pid", json_integer(pid));
	json_object_set_new(st, "pidStart", json_string(startbuf));
	if (state_write(dir, st, &err) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	if (wait_ready(pipefd[0], pid, &err) < 0)
		goto out;
	json_object_del(st, "creator");
	json_object_del(st, "creatorStart");
	if (state_write(dir, st, &err) < 0 || (o.pid_file && write_pid_file(o.pid_file, pid, &err) < 0)) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		goto out;
	}
	rc = 0;
out:
	if (rc) {
		cap_oci_error("%s", err.msg);
		if (made_dir) {
			struct cap_err e2 = { 0 };
			destroy(dir, name, &cg, &e2);
		}
	}
	cap_oci_cgroups_fini(&cg);
	json_decref(st);
	free(skip);
	cap_image_fini(&img);
	cap_oci_config_fini(&cfg);
	return rc;
}

/* -- start, state, kill, delete, pause, resume -- */

static int no_opt(void *ud, int c, const char *arg)
{
	(void)ud;
	(void)c;
	(void)arg;
	return 0;
}

/* The one operand of a verb without options but --help. */
static const char *one_id(int argc, char **argv, const char *usage, int *rc)
{
	static const struct option opts[] = { { "help", no_argument, NULL, 'h' }, { 0 } };
	*rc = parse(argc, argv, "+h", opts, usage, no_opt, NULL);
	if (*rc >= 0)
		return NULL;
	if (optind != argc - 1) {
		cap_oci_error("%s needs exactly one container id", argv[0]);
		*rc = 1;
		return NULL;
	}
	return argv[optind];
}

static int oci_start(int argc, char **argv)
{
	int rc;
	const char *id = one_id(argc, argv, "Usage: capsule-oci start ID\n\nStart the created container's process.\n", &rc);
	struct ostate st;
	struct cap_err err = { 0 };
	char ans[600];
	if (!id)
		return rc;
	if (state_load(id, &st, &err) < 0)
		return fail(&err);
	if (strcmp(st.status, "stopped") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that has stopped");
	else if (strcmp(st.status, "creating") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that is still being created");
	else if (strcmp(st.status, "created") != 0)
		cap_err_set(&err, EINVAL, "cannot start an already running container");
	else
		call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, "start", ans, sizeof(ans), START_TIMEOUT_MS, &err);
	ostate_fini(&st);
	return err.code ? fail(&err) : 0;
}

static int oci_state(int argc, char **argv)
{
	int rc;
	const char *id = one_id(argc, argv, "Usage: capsule-oci state ID\n\nPrint the container's state as JSON.\n", &rc);
	struct ostate st;
	struct cap_err err = { 0 };
	if (!id)
		return rc;
	if (state_load(id, &st, &err) < 0)
		return fail(&err);
	rc = print_json(state_json(&st), JSON_INDENT(2));
	ostate_fini(&st);
	return rc;
}

static int flag_opt(void *ud, int c, const char *arg)
{
	(void)c;
	(void)arg;
	*(bool *)ud = true;
	return 0;
}

/* Parse the options of a verb whose one flag is --FLAG/-SHORTC (kill's
 * --all, delete's --force): like parse, *set says whether it was given. */
static int flag_verb(int argc, char **argv, const char *flag, char shortc, const char *usage,
		     bool *set)
{
	const struct option opts[] = {
		{ flag, no_argument, NULL, shortc }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	char shorts[] = { '+', shortc, 'h', '\0' };
	*set = false;
	return parse(argc, argv, shorts, opts, usage, flag_opt, set);
}

static int vm_op(const char *sandbox, bool pause, struct cap_err *err);

static int oci_kill(int argc, char **argv)
{
	static const char usage[] =
		"Usage: capsule-oci kill [--all] ID [SIGNAL]\n\n"
		"Send SIGNAL (default SIGTERM; a number or a name) to the container's process,\n"
		"or with --all to every process of the container.\n";
	bool all = false;
	int rc = flag_verb(argc, argv, "all", 'a', usage, &all);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1 && optind != argc - 2) {
		cap_oci_error("kill needs a container id and at most one signal");
		return 1;
	}
	struct cap_err err = { 0 };
	int sig = cap_oci_signal_parse(optind + 1 < argc ? argv[optind + 1] : "SIGTERM", &err);
	if (sig < 0)
		return fail(&err);
	struct ostate st;
	if (state_load(argv[optind], &st, &err) < 0)
		return fail(&err);
	char line[64], ans[600];
	snprintf(line, sizeof(line), "signal %d %s", sig, all ? "all" : "process");
	if (strcmp(st.status, "creating") == 0) {
		cap_err_set(&err, EINVAL, "cannot signal a container that is still being created");
		goto out;
	}
	if (strcmp(st.status, "stopped") == 0) {
		/* Its monitor is gone; a sandbox left running is stopped by
		 * SIGKILL (its VM must not outlive the container). */
		struct cap_named_status ns;
		if (sig == SIGKILL && cap_named_status(st.sandbox, &ns, &err) == 0 &&
		    ns.state != CAP_NAMED_STOPPED && !exists_at(st.dir, CAP_OCI_EXIT))
			cap_named_kill(st.sandbox, &err);
		else
			cap_err_set(&err, ESRCH, "container not running");
		goto out;
	}
	bool paused = strcmp(st.status, "paused") == 0;
	int r = call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, line, ans, sizeof(ans), KILL_TIMEOUT_MS, &err);
	if (r < 0 && err.code != EINVAL) {
		/* "not running" (runc's words) only when the monitor is gone;
		 * one that is there and does not answer is its own error. */
		if (r == -ENOENT || r == -ECONNREFUSED || !cap_oci_proc_same(st.pid, st.start) ||
		    exists_at(st.dir, CAP_OCI_EXIT))
			cap_err_set(&err, ESRCH, "container not running");
		else
			cap_err_prefix(&err, "cannot signal the container (its monitor is process %d)", (int)st.pid);
		goto out;
	}
	if (r < 0)
		goto out;
	if (all) {
		pid_t pids[256];
		unsigned long long starts[256];
		size_t n = cap_oci_exec_monitors(st.dir, pids, starts, 256);
		for (size_t i = 0; i < n; i++) {
			struct cap_err e2 = { 0 };
			char sock[64];
			snprintf(sock, sizeof(sock), CAP_OCI_EXEC_SOCK_FMT, (int)pids[i], starts[i]);
			call(st.dir, CAP_OCI_EXEC_DIR, sock, line, ans, sizeof(ans), KILL_TIMEOUT_MS, &e2);
		}
	}
	/* A signal to a paused container waits for resume, as in runc's
	 * frozen cgroup; SIGKILL does not (runc thaws for it): the VM goes on
	 * so that the process dies and its status comes back. */
	if (paused && sig == SIGKILL) {
		struct cap_err e2 = { 0 };
		if (vm_op(st.sandbox, false, &e2) < 0 && cap_named_kill(st.sandbox, &err) < 0)
			cap_err_prefix(&err, "cannot resume the paused container for SIGKILL (%.200s), nor stop "
				       "its sandbox", e2.msg);
	}
out:
	ostate_fini(&st);
	return err.code ? fail(&err) : 0;
}

static int oci_delete(int argc, char **argv)
{
	static const char usage[] =
		"Usage: capsule-oci delete [--force] ID\n\n"
		"Remove the container: its sandbox (VM and disks), cgroup and state. A running\n"
		"one only with --force (it is killed). A container already gone is no error.\n";
	bool force = false;
	int rc = flag_verb(argc, argv, "force", 'f', usage, &force);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1) {
		cap_oci_error("delete needs exactly one container id");
		return 1;
	}
	const char *id = argv[optind];
	struct ostate st;
	struct cap_err err = { 0 };
	if (state_load(id, &st, &err) < 0) {
		/* A create that died before its state was written leaves a
		 * directory (and maybe a sandbox) nothing else knows. */
		_cleanup_free_ char *dir = cdir(id);
		struct stat sb;
		if (id_ok(id) && stat(dir, &sb) == 0) {
			char name[CAP_NAME_MAX + 1];
			sandbox_name(id, name);
			if (destroy(dir, name, NULL, &err) < 0)
				return fail(&err);
		}
		return 0;
	}
	bool creating = strcmp(st.status, "creating") == 0;
	if (!force && (creating || strcmp(st.status, "running") == 0 || strcmp(st.status, "paused") == 0)) {
		cap_err_set(&err, EBUSY, "cannot delete container %s that is not stopped: %s", id, st.status);
		ostate_fini(&st);
		return fail(&err);
	}
	char ans[600];
	pid_t pids[256];
	unsigned long long starts[256];
	size_t n = cap_oci_exec_monitors(st.dir, pids, starts, 256);
	if (creating) {
		/* Its create is stopped where it is; what it made goes below. */
		pid_t creator = (pid_t)json_integer_value(json_object_get(st.j, "creator"));
		end_process(creator, strtoull(jstr(st.j, "creatorStart"), NULL, 10), 0);
		end_process(st.pid, st.start, 0);
	} else if (strcmp(st.status, "stopped") != 0) {
		struct cap_err e2 = { 0 };
		if (strcmp(st.status, "paused") == 0) {
			/* A frozen guest cannot die: the sandbox goes as a whole. */
			cap_named_kill(st.sandbox, &e2);
		} else if (call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, "signal 9 all", ans, sizeof(ans),
				DELETE_TIMEOUT_MS, &e2) < 0 &&
			   cap_oci_proc_same(st.pid, st.start)) {
			/* A monitor that does not answer (stopped, stuck) is not
			 * waited for: it and the sandbox it serves are killed. */
			kill(st.pid, SIGKILL);
			cap_named_kill(st.sandbox, &e2);
		}
		end_process(st.pid, st.start, 3000);
	} else {
		/* Stopped: its monitor may still be stopping the VM (the exit
		 * is written) or be one whose create died (it is not). */
		end_process(st.pid, st.start, exists_at(st.dir, CAP_OCI_EXIT) ? 3000 : 0);
	}
	for (size_t i = 0; i < n; i++)
		end_process(pids[i], starts[i], 0);
	struct cap_oci_cgroups cg;
	cgroups_load(st.j, &cg);
	rc = destroy(st.dir, st.sandbox, &cg, &err) < 0 ? fail(&err) : 0;
	cap_oci_cgroups_fini(&cg);
	ostate_fini(&st);
	return rc;
}

/* Pause or resume the sandbox through its shim. */
static int vm_op(const char *sandbox, bool pause, struct cap_err *err)
{
	struct cap_named_status ns;
	struct cap_sandbox *sb = NULL;
	int r;
	if ((r = cap_named_status(sandbox, &ns, err)) < 0)
		return r;
	if (ns.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ESRCH, "container not running");
	if ((r = cap_sandbox_attach(ns.control, &sb, err)) < 0)
		return r;
	cap_sandbox_vm_op(sb, pause);
	int64_t until = cap_now_ms() + 30000;
	while (cap_sandbox_vm_op_pending(sb) > 0) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(sb, pfd);
		if (cap_now_ms() > until) {
			r = cap_err_set(err, ETIMEDOUT, "the sandbox %s did not answer %s within 30 s", sandbox,
					pause ? "pause" : "resume");
			break;
		}
		if (poll(pfd, CAP_SANDBOX_NPOLL, 1000) < 0 && errno != EINTR) {
			r = cap_err_set(err, errno, "poll: %s", strerror(errno));
			break;
		}
		if ((r = cap_sandbox_dispatch(sb, pfd, err)) < 0)
			break;
	}
	if (r >= 0 && (r = cap_sandbox_vm_op_result(sb)) < 0)
		cap_err_set(err, -r, "cannot %s the container's sandbox %s: %s", pause ? "pause" : "resume",
			    sandbox, strerror(-r));
	cap_sandbox_free(sb);
	return r;
}

static int pause_resume(int argc, char **argv, bool pause)
{
	int rc;
	const char *id = one_id(argc, argv,
				pause ? "Usage: capsule-oci pause ID\n\nFreeze the container's VM.\n"
				      : "Usage: capsule-oci resume ID\n\nContinue the container's frozen VM.\n",
				&rc);
	struct ostate st;
	struct cap_err err = { 0 };
	if (!id)
		return rc;
	if (state_load(id, &st, &err) < 0)
		return fail(&err);
	if (pause && strcmp(st.status, "running") != 0)
		cap_err_set(&err, EINVAL, strcmp(st.status, "paused") == 0 ? "container already paused" : "container not running");
	else if (!pause && strcmp(st.status, "paused") != 0)
		cap_err_set(&err, EINVAL, "container not paused");
	else
		vm_op(st.sandbox, pause, &err);
	ostate_fini(&st);
	return err.code ? fail(&err) : 0;
}

static int oci_pause(int argc, char **argv) { return pause_resume(argc, argv, true); }
static int oci_resume(int argc, char **argv) { return pause_resume(argc, argv, false); }

/* -- exec -- */

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
	case 'p': case O_PROCESS: o->process = arg; return 0;
	case 'd': o->detach = true; return 0;
	case 't': o->tty = true; return 0;
	case O_PID_FILE: o->pid_file = arg; return 0;
	case O_CONSOLE: o->console_socket = arg; return 0;
	case O_CWD: o->cwd = arg; return 0;
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
	case 'g': case O_GIDS: {
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
	case O_PRESERVE: return preserve_ok(arg);
	default: return 0;	/* --no-new-privs, --cap, --process-label, --apparmor: a VM's own */
	}
}

/* exec's process from its command line over the container's config
 * process, as runc builds it. */
static int exec_process(const struct exec_opts *o, char **args, size_t nargs, struct ostate *st,
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
	if (cap_oci_config_process(jstr(st->j, "bundle"), p, &e2) < 0) {
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

static int oci_exec(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "process", required_argument, NULL, 'p' },
		{ "detach", no_argument, NULL, 'd' },
		{ "pid-file", required_argument, NULL, O_PID_FILE },
		{ "tty", no_argument, NULL, 't' },
		{ "console-socket", required_argument, NULL, O_CONSOLE },
		{ "cwd", required_argument, NULL, O_CWD },
		{ "env", required_argument, NULL, 'e' },
		{ "user", required_argument, NULL, 'u' },
		{ "additional-gids", required_argument, NULL, 'g' },
		{ "no-new-privs", no_argument, NULL, O_NNP },
		{ "cap", required_argument, NULL, 'c' },
		{ "preserve-fds", required_argument, NULL, O_PRESERVE },
		{ "process-label", required_argument, NULL, O_LABEL },
		{ "apparmor", required_argument, NULL, O_APPARMOR },
		{ "ignore-paused", no_argument, NULL, O_IGNORE_PAUSED },
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
	int rc = parse(argc, argv, "+p:dte:u:g:c:h", opts, usage, exec_opt, &o);
	if (rc >= 0)
		return rc;
	if (optind >= argc) {
		cap_oci_error("exec needs a container id");
		return 1;
	}
	struct ostate st;
	struct cap_err err = { 0 };
	if (state_load(argv[optind], &st, &err) < 0)
		return fail(&err);
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
		fail(&err);
		goto out;
	}
	struct cap_oci_monitor m = {
		.dir = st.dir, .sandbox = st.sandbox, .proc = &p, .pids_max = PIDS_MAX_DEFAULT,
		.console_socket = o.console_socket, .ready_fd = -1,
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
		m.cgroups_path = jstr(st.j, "cgroupsPath");
		_exit(cap_oci_monitor_run(&m));
	}
	close(pipefd[1]);
	if (wait_ready(pipefd[0], pid, &err) < 0 || (o.pid_file && write_pid_file(o.pid_file, pid, &err) < 0)) {
		fail(&err);
		goto out;
	}
	rc = 0;
out:
	cap_oci_process_fini(&p);
	ostate_fini(&st);
	return rc;
}

/* -- ps, list -- */

static int format_opt(void *ud, int c, const char *arg)
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

/* One `ps` row of a host process from /proc, as ps -ef prints it. */
static void ps_row(pid_t pid)
{
	char path[64];
	_cleanup_free_ char *pstat = NULL, *cmd = NULL;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (cap_read_file(path, 4096, &pstat) < 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	ssize_t n = cap_read_file(path, 4096, &cmd);
	for (ssize_t i = 0; i + 1 < n; i++)
		if (cmd[i] == '\0')
			cmd[i] = ' ';
	char *p = strrchr(pstat, ')');
	int ppid = 0;
	unsigned long long ut = 0, stt = 0;
	if (p)
		sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ppid, &ut, &stt);
	struct stat sb;
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	uid_t uid = stat(path, &sb) == 0 ? sb.st_uid : 0;
	struct passwd *pw = getpwuid(uid);
	long hz = sysconf(_SC_CLK_TCK);
	unsigned long long secs = (ut + stt) / (unsigned long long)(hz > 0 ? hz : 100);
	printf("%-8s %7d %7d  0 -        ?        %02llu:%02llu:%02llu %s\n", pw ? pw->pw_name : "?", (int)pid,
	       ppid, secs / 3600, secs / 60 % 60, secs % 60, n > 0 ? cmd : "?");
}

/* The container's processes as the host sees them: the monitor standing
 * for its process and one per live exec. These host pids are what the
 * engine signals and waits on; the guest's own processes are inside the
 * VM, where a host pid means nothing. */
static int oci_ps(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	static const char usage[] =
		"Usage: capsule-oci ps [--format table|json] ID\n\n"
		"The host processes standing for the container's processes: its monitor and\n"
		"one per running exec (the guest's processes run inside the VM).\n";
	const char *fmt[2] = { "table", NULL };
	int rc = parse(argc, argv, "+f:h", opts, usage, format_opt, fmt);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1) {
		cap_oci_error("ps needs exactly one container id");
		return 1;
	}
	struct ostate st;
	struct cap_err err = { 0 };
	if (state_load(argv[optind], &st, &err) < 0)
		return fail(&err);
	pid_t pids[257];
	size_t n = 0;
	if (strcmp(st.status, "stopped") != 0)
		pids[n++] = st.pid;
	n += cap_oci_exec_monitors(st.dir, pids + n, NULL, 256);
	if (strcmp(fmt[0], "json") == 0) {
		json_t *a = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer(pids[i]));
		rc = print_json(a, JSON_COMPACT);
	} else {
		printf("UID          PID    PPID  C STIME    TTY          TIME CMD\n");
		for (size_t i = 0; i < n; i++)
			ps_row(pids[i]);
		rc = 0;
	}
	ostate_fini(&st);
	return rc;
}

static int oci_list(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' }, { "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' }, { 0 },
	};
	static const char usage[] = "Usage: capsule-oci list [--format table|json] [--quiet]\n\nList the containers under --root.\n";
	const char *fmt[2] = { "table", NULL };
	int rc = parse(argc, argv, "+f:qh", opts, usage, format_opt, fmt);
	if (rc >= 0)
		return rc;
	int dfd = open(g.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char **names = NULL;
	size_t n = 0;
	if (dfd >= 0) {
		cap_dir_names(dfd, &names, &n);
		close(dfd);
	}
	json_t *a = json_array();
	bool json = strcmp(fmt[0], "json") == 0;
	if (!json && !fmt[1])
		printf("%-12s %-8s %-10s %-40s %-31s %s\n", "ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER");
	for (size_t i = 0; i < n; i++) {
		struct ostate st;
		struct cap_err err = { 0 };
		if (state_load(names[i], &st, &err) < 0)
			continue;
		if (json)
			json_array_append_new(a, state_json(&st));
		else if (fmt[1])
			printf("%s\n", st.id);
		else
			printf("%-12s %-8d %-10s %-40s %-31s %s\n", st.id,
			       strcmp(st.status, "stopped") == 0 ? 0 : (int)st.pid, st.status,
			       jstr(st.j, "bundle"), jstr(st.j, "created"), "root");
		ostate_fini(&st);
	}
	cap_strv_free(names, n);
	if (json)
		return print_json(a, JSON_COMPACT);
	json_decref(a);
	return 0;
}

/* -- features -- */

static int oci_features(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	/* What this runtime honours, not what runc does: no hooks, no
	 * seccomp/AppArmor/SELinux on the host side (the VM is the
	 * boundary), mounts of the guest's kinds and small files only. */
	json_t *f = json_pack(
		"{s:s,s:s,s:[],s:[ssssssssssss],"
		"s:{s:[ssssss],s:[],s:{s:b,s:b,s:b,s:b},s:{s:b},s:{s:b},s:{s:b}},"
		"s:{s:s}}",
		"ociVersionMin", "1.0.0", "ociVersionMax", CAP_OCI_VERSION, "hooks", "mountOptions", "bind",
		"rbind", "ro", "rw", "nosuid", "nodev", "noexec", "relatime", "private", "rprivate", "mode",
		"size", "linux", "namespaces", "cgroup", "ipc", "mount", "network", "pid", "uts",
		"capabilities", "cgroup", "v1", true, "v2", true, "systemd", false, "systemdUser", false,
		"seccomp", "enabled", false, "apparmor", "enabled", false, "selinux", "enabled", false,
		"annotations", "io.capsule.runtime", "vm");
	return print_json(f, JSON_INDENT(4));
}

/* ---- the command line ------------------------------------------------- */

static const char usage[] =
	"Usage: capsule-oci [--root DIR] [--log FILE] [--log-format text|json]\n"
	"                   [--systemd-cgroup] [--debug] COMMAND [ARG...]\n"
	"\n"
	"capsule as an OCI runtime (runc's command line): each container runs in its\n"
	"own capsule VM. See docs/oci.md for Podman and containerd.\n"
	"\n"
	"Commands: create, start, state, kill, delete, exec, ps, pause, resume, list,\n"
	"features. Global flags:\n"
	"  --root DIR          where container state is kept (default " DEFAULT_ROOT ")\n"
	"  --log FILE          append errors to FILE too (runc's --log)\n"
	"  --log-format F      text (default) or json\n"
	"  --systemd-cgroup    cgroupsPath is systemd's slice:prefix:name\n"
	"  --rootless false    accepted (capsule-oci runs as root)\n"
	"  --debug             library notes to the log file too\n";

enum { G_ROOT = 0x200, G_LOG, G_LOG_FORMAT, G_SYSTEMD, G_DEBUG, G_ROOTLESS, G_CRIU };

int cap_cli_oci(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "root", required_argument, NULL, G_ROOT },
		{ "log", required_argument, NULL, G_LOG },
		{ "log-format", required_argument, NULL, G_LOG_FORMAT },
		{ "systemd-cgroup", no_argument, NULL, G_SYSTEMD },
		{ "debug", no_argument, NULL, G_DEBUG },
		{ "rootless", required_argument, NULL, G_ROOTLESS },
		{ "criu", required_argument, NULL, G_CRIU },
		{ "help", no_argument, NULL, 'h' },
		{ "version", no_argument, NULL, 'v' },
		{ 0 },
	};
	int c;
	cap_log_set(log_sink, NULL);
	optind = 1;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+hv", opts, NULL)) != -1) {
		switch (c) {
		case G_ROOT: g.root = optarg; break;
		case G_LOG: g.log = optarg; break;
		case G_LOG_FORMAT:
			if (strcmp(optarg, "json") != 0 && strcmp(optarg, "text") != 0) {
				cap_oci_error("--log-format %s: text or json", optarg);
				return 1;
			}
			g.log_json = strcmp(optarg, "json") == 0;
			break;
		case G_SYSTEMD: g.systemd_cgroup = true; break;
		case G_DEBUG: g.debug = true; break;
		case G_CRIU: break;
		case G_ROOTLESS:
			if (strcmp(optarg, "false") != 0 && strcmp(optarg, "auto") != 0) {
				cap_oci_error("--rootless %s: capsule-oci runs as root only (false or auto)", optarg);
				return 1;
			}
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		case 'v':
			printf("capsule-oci version %s\nspec: %s\n", CAPSULE_VERSION, CAP_OCI_VERSION);
			return 0;
		default:
			cap_oci_error("unknown or incomplete global option '%s'", argv[optind - 1]);
			return 1;
		}
	}
	if (optind >= argc) {
		fputs(usage, stderr);
		return 1;
	}
	/* The root's absolute path: a monitor's own later paths must not
	 * depend on where the engine ran us from. */
	static char root_abs[PATH_MAX];
	if (g.root[0] != '/' && getcwd(root_abs, sizeof(root_abs) - strlen(g.root) - 2)) {
		strcat(root_abs, "/");
		strcat(root_abs, g.root);
		g.root = root_abs;
	}
	static const struct {
		const char *name;
		int (*fn)(int, char **);
	} verbs[] = {
		{ "create", oci_create }, { "start", oci_start }, { "state", oci_state },
		{ "kill", oci_kill }, { "delete", oci_delete }, { "exec", oci_exec },
		{ "ps", oci_ps }, { "pause", oci_pause }, { "resume", oci_resume },
		{ "list", oci_list }, { "features", oci_features },
	};
	const char *verb = argv[optind];
	for (size_t i = 0; i < CAP_ARRAY_SIZE(verbs); i++)
		if (strcmp(verb, verbs[i].name) == 0)
			return verbs[i].fn(argc - optind, argv + optind);
	if (strcmp(verb, "help") == 0) {
		fputs(usage, stdout);
		return 0;
	}
	cap_oci_error("unknown command '%s' (capsule-oci runs create, start, state, kill, delete, exec, "
		      "ps, pause, resume, list and features)", verb);
	return 1;
}
