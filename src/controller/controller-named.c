/* The controller's real backend: named sandboxes run by their shims
 * (src/sandbox). Work that can take seconds (mke2fs, copying public data,
 * booting) runs in a child process so that the controller's loop never
 * waits on one identity; the child reports on a pipe and exits. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "controller-internal.h"
#include "engine.h"
#include "named.h"
#include "sandbox.h"
#include "util.h"
#include "xfer.h"

/* How long a start job waits for a shim that another process is starting
 * (or that a dead controller left starting). */
#define START_WAIT_MS 120000

/* What a sandbox's creation says it is doing (building the base image on
 * first use, copying a project), as log lines naming the sandbox. */
static void create_progress(void *ud, const char *line)
{
	cap_log(CAP_LOG_INFO, "sandbox %s: %s", (const char *)ud, line);
}

static void run_start(const struct cap_ctl_job_req *j, struct cap_ctl_job_out *out)
{
	struct cap_err err = { 0 };
	struct cap_record rec;
	int r = 0;
	if (j->create && cap_named_load(j->name, &rec, NULL) < 0) {
		cap_record_init(&rec);
		snprintf(rec.name, sizeof(rec.name), "%s", j->name);
		if (strlen(j->image) >= sizeof(rec.image_ref))
			r = cap_err_set(&err, ENAMETOOLONG, "the image reference %.40s... is too long", j->image);
		snprintf(rec.image_ref, sizeof(rec.image_ref), "%s", j->image);
		rec.cpus = j->size.cpus;
		rec.memory_mib = j->size.memory_mib;
		rec.root_size_mib = j->size.root_mib;
		rec.work_size_mib = j->size.work_mib;
		rec.tools_root = j->tools_root;
		if (j->source)
			snprintf(rec.source, sizeof(rec.source), "%s", j->source);
		if (j->workspace && strlen(j->workspace) >= sizeof(rec.workspace))
			r = cap_err_set(&err, ENAMETOOLONG, "the workspace path %s is too long", j->workspace);
		else if (j->workspace)
			snprintf(rec.workspace, sizeof(rec.workspace), "%s", j->workspace);
		if (r == 0)
			r = j->network ? cap_record_set_net(&rec, j->network, &err) : 0;
		if (r == 0)
			r = cap_named_create(&rec, create_progress, (void *)j->name, &err);
		/* Another process is making it (a job a dead controller left):
		 * wait for it to be complete. */
		int64_t end = cap_now_ms() + START_WAIT_MS;
		while (r == -EINPROGRESS && cap_now_ms() < end) {
			usleep(100000);
			r = cap_named_load(j->name, &rec, NULL) == 0 ? 0 : cap_named_create(&rec, NULL, NULL, &err);
		}
	}
	/* The server's policy is every sandbox's: one made under another
	 * follows it from this start on. */
	if (r == 0) {
		struct cap_record now;
		struct cap_record want;
		struct cap_net_policy *none = NULL;
		bool restart;
		const struct cap_net_policy *p = j->network;
		if (!p) {
			none = xmalloc(sizeof(*none));
			cap_net_policy_init(none);
			p = none;
		}
		cap_record_init(&want);
		r = cap_named_load(j->name, &now, &err);
		if (r == 0)
			r = cap_record_set_net(&want, p, &err);
		if (r == 0 && strcmp(now.net, want.net) != 0)
			r = cap_named_set_network(j->name, p, &restart, &err);
		/* Running (a controller's recovery) with or without a NIC it
		 * must not keep: the start below makes it right. */
		if (r == 0 && restart)
			r = cap_named_stop(j->name, 10000, &err);
		free(none);
	}
	/* The identity's vCPUs and memory as they are now (its disks keep
	 * the sizes they were made with). */
	if (r == 0) {
		r = cap_named_set_size(j->name, j->size.cpus, j->size.memory_mib, &err);
		if (r == -EBUSY) {	/* running already (a recovery): it keeps them */
			cap_log(CAP_LOG_INFO, "%s", err.msg);
			r = 0;
		}
	}
	/* Whom commands run as: the server's, as its network is. */
	if (r == 0 && (r = cap_named_set_tools_root(j->name, j->tools_root, &err)) == -EBUSY) {
		cap_log(CAP_LOG_INFO, "%s", err.msg);
		r = 0;
	}
	bool changed;
	if (r == 0)
		r = cap_named_refresh_source(j->name, &changed, &out->has_source, &err);
	int64_t end = cap_now_ms() + START_WAIT_MS;
	while (r == 0) {
		r = cap_named_start(j->name, &err);
		/* A shim starting or exiting: wait for it, within bounds. */
		if (r != -EBUSY || cap_now_ms() >= end)
			break;
		usleep(100000);
		r = 0;
	}
	/* A spare is warmed before it is ready: never worse than cold. */
	if (r == 0 && j->warm) {
		struct cap_err werr = { 0 };
		if (cap_named_warm(j->name, &werr) < 0)
			cap_log(CAP_LOG_WARN, "warming sandbox %s: %s", j->name, werr.msg);
	}
	out->r = r;
	if (r < 0)
		snprintf(out->msg, sizeof(out->msg), "%s", err.msg);
}

static void run_wait(const struct cap_ctl_job_req *j, struct cap_ctl_job_out *out)
{
	struct cap_named_status st;
	struct cap_err err = { 0 };
	int64_t end = cap_now_ms() + START_WAIT_MS;
	for (;;) {
		int r = cap_named_status(j->name, &st, &err);
		struct stat sb;
		if (r < 0 || st.state == CAP_NAMED_STOPPED) {
			out->stopped = true;	/* exited, or never got going */
			return;
		}
		if (st.control[0] && stat(st.control, &sb) == 0 && S_ISSOCK(sb.st_mode))
			return;	/* serving */
		if (cap_now_ms() >= end) {
			out->r = -ETIMEDOUT;
			snprintf(out->msg, sizeof(out->msg), "sandbox %s has been starting or stopping for %d s; see its shim.log",
				 j->name, START_WAIT_MS / 1000);
			return;
		}
		usleep(50000);
	}
}

static void run_check(const struct cap_ctl_job_req *j, struct cap_ctl_job_out *out)
{
	struct cap_err err = { 0 };
	out->r = cap_named_refresh_source(j->name, &out->changed, &out->has_source, &err);
	if (out->r < 0)
		snprintf(out->msg, sizeof(out->msg), "%s", err.msg);
}

/* A worker process for a job or a fork: 0 in the child, which keeps
 * nothing of the controller's (not its home lock, which a controller
 * started after this one dies must get; not the MCP client's stdio) but
 * the pipe's write end as descriptor 3, and has what the tools it runs
 * (mke2fs, mkfs.erofs, QEMU, shims) expect: no blocked signals, SIGPIPE
 * at its default (its log lines go to the controller's stderr, under the
 * same name); its pid in the parent, with *fd the read end; -errno. */
static pid_t worker_fork(int *fd, struct cap_err *err)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	pid_t child = fork();
	if (child < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return cap_err_set(err, e, "fork: %s", strerror(e));
	}
	if (child == 0) {
		cap_child_keep_fd3(p[1]);
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null >= 0) {
			dup2(null, 0);
			dup2(null, 1);
			close(null);
		}
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		return 0;
	}
	close(p[1]);
	*fd = p[0];
	return child;
}

/* Read a worker's report of len bytes from fd (closed), and reap it: the
 * bytes read. */
static size_t worker_end(int fd, pid_t pid, void *buf, size_t len, int *status)
{
	size_t got = 0;
	while (got < len) {
		ssize_t n = read(fd, (char *)buf + got, len - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	*status = 0;
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
	return got;
}

static int job_begin(void *ud, const struct cap_ctl_job_req *j, int *fd, pid_t *pid,
		     struct cap_err *err)
{
	(void)ud;
	pid_t child = worker_fork(fd, err);
	if (child < 0)
		return child;
	if (child == 0) {
		struct cap_ctl_job_out out = { 0 };
		if (j->kind == CAP_CTL_JOB_START)
			run_start(j, &out);
		else if (j->kind == CAP_CTL_JOB_WAIT)
			run_wait(j, &out);
		else
			run_check(j, &out);
		ssize_t n = write(3, &out, sizeof(out));
		_exit(n == (ssize_t)sizeof(out) ? 0 : 1);
	}
	*pid = child;
	return 0;
}

static void job_end(void *ud, int fd, pid_t pid, struct cap_ctl_job_out *out)
{
	(void)ud;
	int status;
	memset(out, 0, sizeof(*out));
	if (worker_end(fd, pid, out, sizeof(*out), &status) != sizeof(*out)) {
		memset(out, 0, sizeof(*out));
		out->r = -EIO;
		snprintf(out->msg, sizeof(out->msg), "the controller's worker process died (%s %d) before it reported",
			 WIFSIGNALED(status) ? "signal" : "status",
			 WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
	}
	out->msg[sizeof(out->msg) - 1] = '\0';
}

static int sizes(void *ud, const char *name, struct cap_ctl_size *out)
{
	(void)ud;
	struct cap_record *rec = xmalloc(sizeof(*rec));
	int r = cap_named_load(name, rec, NULL);
	if (r == 0)
		*out = (struct cap_ctl_size){ rec->cpus, rec->memory_mib, rec->root_size_mib,
					      rec->work_size_mib };
	free(rec);
	return r;
}

static int state(void *ud, const char *name, enum cap_vm_state *st, bool *serving,
		 bool *has_source)
{
	struct cap_named_status s;
	(void)ud;
	int r = cap_named_status(name, &s, NULL);
	if (r < 0)
		return r;
	*has_source = s.has_source;
	*serving = false;
	switch (s.state) {
	case CAP_NAMED_STOPPED:
		*st = CAP_VM_STOPPED;
		return 0;
	case CAP_NAMED_PAUSED:
		*st = CAP_VM_PAUSED;
		break;
	case CAP_NAMED_RUNNING:
		*st = CAP_VM_RUNNING;
		break;
	}
	struct stat sb;
	*serving = s.control[0] && stat(s.control, &sb) == 0 && S_ISSOCK(sb.st_mode);
	return 0;
}

/* What process pid holds of the host's memory, bytes: its proportional
 * share (Pss in smaps_rollup, shared pages split among their users),
 * else its resident set when smaps_rollup cannot be read; 0 when gone. */
static uint64_t held_by(pid_t pid)
{
	static const struct { const char *file, *key; } src[] = {
		{ "smaps_rollup", "\nPss:" }, { "status", "\nVmRSS:" },
	};
	if (pid <= 0)
		return 0;
	for (size_t k = 0; k < CAP_ARRAY_SIZE(src); k++) {
		char path[64], *text = NULL;
		snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, src[k].file);
		if (cap_read_file(path, 1 << 16, &text) < 0)
			continue;
		const char *at = strstr(text, src[k].key);
		unsigned long long kib;
		bool ok = at && sscanf(at + strlen(src[k].key), " %llu kB", &kib) == 1;
		free(text);
		if (ok)
			return (uint64_t)kib * 1024;
	}
	return 0;
}

static int usage(void *ud, const char *name, struct cap_ctl_usage *out)
{
	struct cap_named_status st;
	(void)ud;
	memset(out, 0, sizeof(*out));
	int r = cap_named_status(name, &st, NULL);
	if (r < 0)
		return r;
	if (st.state != CAP_NAMED_STOPPED)
		out->memory_bytes = held_by(st.shim_pid) + held_by(st.vmm_pid) + held_by(st.netd_pid);
	struct cap_named_net_counts n;
	if (cap_named_net_counts(name, &n) == 0) {
		out->net = true;
		out->net_refused = n.refused;
		out->net_bytes_out = n.bytes_out;
		out->net_bytes_in = n.bytes_in;
	}
	return 0;
}

static int attach(void *ud, const char *name, void **vm, bool *paused, struct cap_err *err)
{
	struct cap_named_status st;
	struct cap_sandbox *sb;
	(void)ud;
	int r = cap_named_status(name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED || !st.control[0])
		return cap_err_set(err, ECHILD, "sandbox %s has no serving shim (it stopped or is still starting); see its shim.log",
				   name);
	if ((r = cap_sandbox_attach(st.control, &sb, err)) < 0)
		return r;
	*vm = sb;
	*paused = st.state == CAP_NAMED_PAUSED;
	return 0;
}

static void reap(void *ud, const char *name)
{
	struct cap_err err = { 0 };
	(void)ud;
	if (cap_named_reap(name, &err) < 0 && err.code != EBUSY)
		cap_log(CAP_LOG_WARN, "cannot clean up after the dead shim of %s: %s", name, err.msg);
}

static int remove_(void *ud, const char *name, struct cap_err *err)
{
	(void)ud;
	return cap_named_remove(name, false, err);
}

static void kill_(void *ud, const char *name)
{
	struct cap_named_status st;
	(void)ud;
	if (cap_named_status(name, &st, NULL) == 0 && st.state != CAP_NAMED_STOPPED && st.shim_pid > 0)
		kill(st.shim_pid, SIGKILL);	/* its QEMU dies with it (PDEATHSIG) */
}

static int exec_(void *vm, const struct cap_exec_req *req, const struct cap_exec_events *ev,
		 void *ud, uint32_t *id, struct cap_err *err)
{
	return cap_sandbox_exec(vm, req, ev, ud, id, err);
}

static int file_(void *vm, const struct cap_file_req *req, uint32_t cap,
		 const struct cap_exec_events *ev, void *ud, uint32_t *id, struct cap_err *err)
{
	return cap_sandbox_file(vm, req, cap, ev, ud, id, err);
}

static int input(void *vm, uint32_t id, const void *p, size_t n)
{
	return cap_sandbox_stdin(vm, id, p, n);
}

static int signal_(void *vm, uint32_t id, int sig)
{
	return cap_sandbox_signal(vm, id, sig);
}

static void vm_op(void *vm, bool pause)
{
	cap_sandbox_vm_op(vm, pause);
}

static bool vm_op_done(void *vm, int *result)
{
	if (cap_sandbox_vm_op_pending(vm) > 0)
		return false;
	*result = cap_sandbox_vm_op_result(vm);
	return true;
}

static void stop(void *vm)
{
	cap_sandbox_stop_async(vm);
}

static bool dead(void *vm)
{
	return cap_sandbox_is_dead(vm);
}

static void pollfds(void *vm, struct pollfd *pfd)
{
	cap_sandbox_pollfds(vm, pfd);
}

static int dispatch(void *vm, const struct pollfd *pfd, struct cap_err *err)
{
	return cap_sandbox_dispatch(vm, pfd, err);
}

static void vm_free(void *vm)
{
	cap_sandbox_free(vm);
}

/* A transfer on a connection of its own to the sandbox's shim (the
 * controller's stays free for its other calls); in a worker thread. */
static int xfer_(void *ud, const struct cap_ctl_xfer *x, struct cap_ctl_xfer_watch *w,
		 struct cap_xfer_result *res, struct cap_err *err)
{
	struct cap_named_status st;
	struct cap_sandbox *sb;
	(void)ud;
	int r = cap_named_status(x->name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED || !st.control[0])
		return cap_err_set(err, ECHILD, "sandbox %s stopped before the transfer began; retry the call", x->name);
	if ((r = cap_sandbox_attach(st.control, &sb, err)) < 0)
		return r;
	struct pollfd pfd[CAP_SANDBOX_NPOLL];
	cap_sandbox_pollfds(sb, pfd);
	r = cap_ctl_xfer_watch_fd(w, pfd[0].fd);
	if (r < 0) {
		cap_sandbox_free(sb);
		return cap_err_set(err, ECANCELED, "the transfer was cancelled");
	}
	if (x->put)
		r = cap_xfer_put(sb, x->host, x->root, x->dest_dir, x->dest_name, x->flags, res, err);
	else
		r = cap_xfer_get(sb, x->root, x->path, x->host, x->flags, res, err);
	cap_ctl_xfer_unwatch(w);
	cap_sandbox_free(sb);
	return r;
}

/* Merges into one directory run one at a time (several identities of
 * this controller, or of another home, merging into the same project):
 * one merge's scan and its renames never interleave with another's, so
 * neither writes over what the other just merged without seeing it.
 * flock on the directory itself, waited for in steps while the call's
 * shim connection (cancel_fd) has not been shut down by a cancel. The
 * descriptor holding it, or -errno with err set. */
static int lock_dir(const char *dir, int cancel_fd, struct cap_err *err)
{
	int fd;
	while ((fd = cap_workspace_lock_dir(dir, false, err)) == -EWOULDBLOCK) {
		struct pollfd p = { .fd = cancel_fd, .events = POLLRDHUP };
		int n = poll(&p, 1, 50);
		if (n > 0 && (p.revents & (POLLHUP | POLLERR | POLLRDHUP)))
			return cap_err_set(err, ECANCELED, "the merge was cancelled while another merge into %s ran", dir);
		if (n > 0)
			usleep(50000);	/* the guest said something meanwhile: not ours to read */
	}
	return fd;
}

/* A diff or merge of the sandbox's workspace, on a connection of its own
 * to its shim and under its workspace lock (a merge that writes, also
 * under its directory's); in a worker thread. */
static int workspace_(void *ud, const struct cap_ctl_ws *ws, struct cap_ctl_xfer_watch *w,
		      struct cap_ctl_ws_out *out, struct cap_err *err)
{
	struct cap_named_status st;
	struct cap_sandbox *sb;
	(void)ud;
	int r = cap_named_status(ws->name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED || !st.control[0])
		return cap_err_set(err, ECHILD, "sandbox %s stopped before the %s began; retry the call", ws->name,
				   ws->merge ? "merge" : "diff");
	_cleanup_close_ int lock = cap_workspace_lock(ws->name, false, err);
	if (lock < 0)
		return lock;
	if ((r = cap_sandbox_attach(st.control, &sb, err)) < 0)
		return r;
	struct pollfd pfd[CAP_SANDBOX_NPOLL];
	cap_sandbox_pollfds(sb, pfd);
	if (cap_ctl_xfer_watch_fd(w, pfd[0].fd) < 0) {
		cap_sandbox_free(sb);
		return cap_err_set(err, ECANCELED, "the %s was cancelled", ws->merge ? "merge" : "diff");
	}
	int dir_lock = -1;
	if (!ws->merge) {
		r = cap_workspace_diff(ws->name, sb, &out->base, &out->now, &out->changes, &out->nchanges, err);
	} else {
		r = ws->dry_run ? 0 : (dir_lock = lock_dir(ws->into, pfd[0].fd, err));
		if (r >= 0)
			r = cap_workspace_plan(ws->name, sb, ws->into, ws->pick, &out->merge, err);
		if (r == 0 && !out->merge.plan.nconflicts && !ws->dry_run)
			r = cap_workspace_apply(ws->name, sb, &out->merge, err);
	}
	if (dir_lock >= 0)
		close(dir_lock);
	cap_ctl_xfer_unwatch(w);
	cap_sandbox_free(sb);
	return r;
}

_Static_assert(CAP_CTL_VM_NPOLL == CAP_SANDBOX_NPOLL, "one poll layout");

static int prepare_(void *ud, const struct cap_prep_req *req, cap_prep_fn fn, void *fud,
		    struct cap_prep_cancel *cancel, struct cap_prep_out *out, struct cap_err *err)
{
	(void)ud;
	return cap_ctl_prepare(req, fn, fud, cancel, out, err);
}

static void jail_found(void *ud, const char *what)
{
	(void)ud;
	cap_log(CAP_LOG_INFO, "%s", what);
}

static void sweep(void *ud)
{
	(void)ud;
	cap_jail_sweep(jail_found, NULL);
}

static int list(void *ud, char ***names, size_t *n)
{
	(void)ud;
	return cap_named_list(names, n);
}

/* What a fork's worker process reports. */
struct fork_out {
	int r;
	char msg[1024];
	char snap[CAP_NAME_MAX + 1];
	char children[CAP_FORK_MAX][CAP_NAME_MAX + 1];
};

/* In a worker thread: the snapshot, and a fork's children started, in a
 * process of its own as a START job's (it starts QEMU and shims: no
 * blocked signals, nothing of the controller's kept). */
static int fork_(void *ud, const char *name, unsigned count, char (*children)[CAP_NAME_MAX + 1],
		 char snap[CAP_NAME_MAX + 1], struct cap_err *err)
{
	(void)ud;
	int fd, status;
	if (count > CAP_FORK_MAX)
		return cap_err_set(err, ERANGE, "count %u is out of range (1 to %d)", count, CAP_FORK_MAX);
	pid_t child = worker_fork(&fd, err);
	if (child < 0)
		return child;
	if (child == 0) {
		static struct fork_out o;
		struct cap_err e = { 0 };
		snprintf(o.snap, sizeof(o.snap), "%s", snap);
		if (count == 0) {
			if (!o.snap[0])
				cap_snapshot_default_name(name, o.snap);
			o.r = cap_named_snapshot(name, o.snap, false, &e);
		} else {
			_cleanup_free_ char *prefix = xasprintf("%.40s-", name);
			o.r = cap_named_fork(name, count, prefix, false, o.children, o.snap, &e);
		}
		snprintf(o.msg, sizeof(o.msg), "%s", e.msg);
		ssize_t n = write(3, &o, sizeof(o));
		_exit(n == (ssize_t)sizeof(o) ? 0 : 1);
	}
	struct fork_out *o = xcalloc(1, sizeof(*o));
	int r = o->r;
	if (worker_end(fd, child, o, sizeof(*o), &status) != sizeof(*o)) {
		r = cap_err_set(err, EIO, "the fork's worker process died before it reported");
	} else {
		r = o->r;
		if (r < 0)
			cap_err_set(err, -r, "%s", o->msg);
		snprintf(snap, CAP_NAME_MAX + 1, "%s", o->snap);
		for (unsigned k = 0; k < count; k++)
			memcpy(children[k], o->children[k], CAP_NAME_MAX + 1);
	}
	free(o);
	return r;
}

const struct cap_ctl_backend ctl_named_backend = {
	.job_begin = job_begin,
	.job_end = job_end,
	.sizes = sizes,
	.state = state,
	.attach = attach,
	.reap = reap,
	.remove = remove_,
	.kill = kill_,
	.exec = exec_,
	.file = file_,
	.input = input,
	.signal = signal_,
	.vm_op = vm_op,
	.vm_op_done = vm_op_done,
	.stop = stop,
	.dead = dead,
	.pollfds = pollfds,
	.dispatch = dispatch,
	.vm_free = vm_free,
	.xfer = xfer_,
	.workspace = workspace_,
	.fork = fork_,
	.prepare = prepare_,
	.sweep = sweep,
	.list = list,
	.usage = usage,
};
