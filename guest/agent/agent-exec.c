/* Commands: their environment (the defaults SETUP adds to), starting a
 * child in a slot (pipes or a PTY, its cgroup, the tool user or an
 * OCI process's user, failures reported on the stream), EXEC, signals,
 * and the end of each (reaped, drained, its cgroup emptied, EXIT once its
 * writes are durable). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-internal.h"
#include "layout.h"
#include "proto.h"
#include "util.h"

/* After a command's cgroup is killed, wait at most this long for it to
 * empty before sending EXIT (so the next command sees none of it); after
 * that EXIT goes anyway and the cgroup is removed later. */
#define CG_EMPTY_WAIT_MS 2000

static const char *const base_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=" CAP_GUEST_WORK, "USER=user", "LOGNAME=user", "SHELL=/bin/sh",
	"LANG=C.UTF-8",
};

/* --- output ---------------------------------------------------------- */

/* Send command output within the exec's cap; at the cap, append the
 * truncation marker once and drop the rest. */
void send_output(struct exec *x, enum cap_msg type, const uint8_t *p,
			size_t n)
{
	if (x->truncated)
		return;
	if (x->detached) {
		x->sent += n;	/* its host is gone */
		return;
	}
	if (x->cap && x->sent + n > x->cap) {
		size_t room = (size_t)(x->cap - x->sent);
		if (room)
			cap_proto_put(&A.out, type, x->id, p, room);
		char marker[96];
		int m = snprintf(marker, sizeof(marker), CAP_TRUNCATION_MARKER, x->cap);
		cap_proto_put(&A.out, type, x->id, marker, (size_t)m);
		x->sent = x->cap;
		x->truncated = true;
		return;
	}
	if (n)
		cap_proto_put(&A.out, type, x->id, p, n);
	x->sent += n;
}

/* --- the slots --------------------------------------------------------- */

struct exec *exec_find(uint32_t id)
{
	if (id == 0)
		return NULL;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id == id)
			return &A.execs[i];
	return NULL;
}

/* End a command: its whole cgroup, or its process group without one. */
void exec_kill(struct exec *x)
{
	if (x->cg[0]) {
		cg_kill(x->cg);
		x->cg_kill_ms = cap_now_ms();
	} else if (!x->exited)
		kill(-x->pid, SIGKILL);
}

/* A SIGNAL to a running command, to whom scope says: its process group
 * (SIGKILL: its whole cgroup, as when it ends), its process alone, or
 * every process in its cgroup (without cgroups, its group). */
void exec_signal(struct exec *x, int sig, uint32_t scope)
{
	if (scope == CAP_SIGNAL_PROCESS)
		kill(x->pid, sig);
	else if (sig == SIGKILL)
		exec_kill(x);
	else if (scope == CAP_SIGNAL_ALL && x->cg[0])
		cg_signal(x->cg, sig);
	else
		kill(-x->pid, sig);
}

void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

void exec_release(struct exec *x)
{
	close_fd(&x->out_fd);
	close_fd(&x->err_fd);
	close_fd(&x->in_fd);
	cap_buf_fini(&x->in_pending);
	memset(x, 0, sizeof(*x));
	x->out_fd = x->err_fd = x->in_fd = -1;
}

/* --- the commands' environment ------------------------------------------ */

/* The defaults every command gets (agent.h): owned "NAME=value" strings,
 * one per NAME. */
static struct {
	char **v;
	size_t n, cap;
} defaults;

/* The length of var's "NAME=" prefix. */
static size_t env_name_len(const char *var)
{
	const char *eq = strchr(var, '=');
	return eq ? (size_t)(eq - var) + 1 : 0;
}

void agent_env_put(const char *var)
{
	size_t nl = env_name_len(var);
	CAP_BUG_ON(nl < 2);
	for (size_t i = 0; i < defaults.n; i++) {
		if (strncmp(defaults.v[i], var, nl) == 0) {
			free(defaults.v[i]);
			defaults.v[i] = xstrdup(var);
			return;
		}
	}
	if (defaults.n == defaults.cap) {
		defaults.cap = defaults.cap ? 2 * defaults.cap : 32;
		defaults.v = xrealloc(defaults.v, defaults.cap * sizeof(char *));
	}
	defaults.v[defaults.n++] = xstrdup(var);
}

void agent_env_reset(void)
{
	for (size_t i = 0; i < defaults.n; i++)
		free(defaults.v[i]);
	defaults.n = 0;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(base_env); i++)
		agent_env_put(base_env[i]);
	if (A.cmd_uid == 0) {
		agent_env_put("USER=root");
		agent_env_put("LOGNAME=root");
	}
}

/* uid's home directory in the guest's /etc/passwd (a copy), or NULL. */
static char *passwd_home(uint32_t uid)
{
	char *s = NULL, *home = NULL;
	if (cap_read_file("/etc/passwd", 1u << 20, &s) < 0)
		return NULL;
	for (char *line = s, *next; line && *line && !home; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		/* name:password:uid:gid:gecos:home:shell */
		char *f[7];
		size_t k = 0;
		for (char *c = line; k < 7; k++) {
			f[k] = c;
			c = strchr(c, ':');
			if (!c)
				break;
			*c++ = '\0';
		}
		char *end;
		if (k < 5 || !*f[2])	/* f[5], the home, is there */
			continue;
		unsigned long u = strtoul(f[2], &end, 10);
		if (*end == '\0' && u == uid && *f[5])
			home = xstrdup(f[5]);
	}
	free(s);
	return home;
}

/* Build the command's environment. A CAP_EXEC_USER command gets exactly
 * the request's variables, with HOME added (uid's home in /etc/passwd,
 * else "/") when they have none; *owned is then that HOME string, for the
 * caller to free. Any other command: the defaults the request does not
 * set, then the request's own. The other strings are borrowed. */
static char **make_env(const struct cap_exec_req *req, char **owned)
{
	*owned = NULL;
	if (req->flags & CAP_EXEC_USER) {
		char **env = xcalloc(req->envc + 2, sizeof(char *));
		bool home = false;
		for (uint32_t j = 0; j < req->envc; j++) {
			env[j] = req->env[j];
			home = home || strncmp(req->env[j], "HOME=", 5) == 0;
		}
		if (!home) {
			char *dir = passwd_home(req->uid);
			*owned = xmalloc(strlen(dir ? dir : "/") + 6);
			sprintf(*owned, "HOME=%s", dir ? dir : "/");
			free(dir);
			env[req->envc] = *owned;
		}
		return env;
	}
	char **env = xcalloc(defaults.n + req->envc + 1, sizeof(char *));
	size_t k = 0;
	for (size_t i = 0; i < defaults.n; i++) {
		size_t nl = env_name_len(defaults.v[i]);
		bool overridden = false;
		for (uint32_t j = 0; j < req->envc && !overridden; j++)
			overridden = strncmp(req->env[j], defaults.v[i], nl) == 0;
		if (!overridden)
			env[k++] = defaults.v[i];
	}
	for (uint32_t j = 0; j < req->envc; j++)
		env[k++] = req->env[j];
	return env;
}


/* --- starting a child ------------------------------------------------- */

/* In the child, as root: take a CAP_EXEC_USER request's rlimits (first:
 * raising a hard limit needs root), its stdio pipes, groups, gid, uid and
 * umask. */
static int take_user(const struct cap_exec_req *req, struct start_failure *f)
{
	for (uint32_t i = 0; i < req->nrlimits; i++) {
		const struct cap_exec_rlimit *l = &req->rlimits[i];
		struct rlimit rl = { .rlim_cur = (rlim_t)l->soft, .rlim_max = (rlim_t)l->hard };
		if (setrlimit((int)l->resource, &rl) < 0) {
			*f = (struct start_failure){ .stage = 4, .errnum = errno };
			return -1;
		}
	}
	/* The stdio pipes become the user's, so that it can open them again
	 * as /dev/stdout or /proc/self/fd/N (runc's fixStdioPermissions). */
	for (int fd = 0; fd <= 2; fd++) {
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && fchown(fd, req->uid, req->gid) < 0) {
			*f = (struct start_failure){ .stage = 2, .errnum = errno };
			return -1;
		}
	}
	gid_t groups[CAP_EXEC_MAX_GROUPS];
	for (uint32_t i = 0; i < req->ngroups; i++)
		groups[i] = req->groups[i];
	if (setgroups(req->ngroups, groups) < 0 || setgid(req->gid) < 0 || setuid(req->uid) < 0) {
		*f = (struct start_failure){ .stage = 2, .errnum = errno };
		return -1;
	}
	umask(req->umask);
	return 0;
}

/* In the child: enter the cgroup (before anything can fork), become the
 * tool user (or a CAP_EXEC_USER request's user) in a new session and run
 * sp. Failures are reported through errfd and end the child with 127. */
__attribute__((noreturn)) static void child(const struct spawn *sp, int in, int out,
					     int err, int errfd, const char *pty, int cgfd)
{
	struct start_failure f = { .stage = 2 };
	sigset_t none;

	if (cgfd >= 0 && (f.errnum = -write_at(cgfd, "cgroup.procs", "0")) != 0) {
		f.stage = 3;
		goto fail;
	}
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	if (pty) {
		/* The session leader opening its terminal makes it the
		 * controlling one; the command's user owns it, as after
		 * login. */
		int t = open(pty, O_RDWR);
		uid_t owner = sp->user ? sp->user->uid : A.cmd_uid;
		if (t < 0 || ioctl(t, TIOCSCTTY, 0) < 0 || fchown(t, owner, 5) < 0) {
			f.errnum = errno;
			goto fail;
		}
		in = out = err = t;
	}
	dup2(in, 0);
	dup2(out, 1);
	dup2(err, 2);
	if (sp->ctr && ctr_enter(sp->ctr, sp->cwd, &f) < 0)
		goto fail;
	if (sp->user) {
		if (take_user(sp->user, &f) < 0)
			goto fail;
	} else if (setgroups(0, NULL) < 0 || setgid(A.cmd_gid) < 0 ||
		   setuid(A.cmd_uid) < 0) {
		f.errnum = errno;
		goto fail;
	}
	prctl(PR_SET_PDEATHSIG, 0);
	sp->run(sp->ud, errfd, &f);
fail:
	if (write(errfd, &f, sizeof(f)) < 0)
		_exit(126);
	_exit(127);
}

struct exec_job {
	const struct cap_exec_req *req;
	char **env;
};

/* A command's directory: the request's, else the tool user's home for it and
 * / for a CAP_EXEC_USER command. */
static const char *exec_cwd(const struct cap_exec_req *req)
{
	if (req->cwd && req->cwd[0])
		return req->cwd;
	return req->flags & CAP_EXEC_USER ? "/" : CAP_GUEST_WORK;
}

/* A command's run: its directory, its environment, exec. */
static void run_exec(const void *ud, int errfd, struct start_failure *f)
{
	const struct exec_job *j = ud;
	(void)errfd;	/* close-on-exec: a successful exec closes it */
	const char *cwd = exec_cwd(j->req);
	if (chdir(cwd) < 0) {
		*f = (struct start_failure){ .stage = 0, .errnum = errno };
		return;
	}
	environ = j->env;
	execvp(j->req->argv[0], j->req->argv);
	*f = (struct start_failure){ .stage = 1, .errnum = errno };
}

static void close_fds(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close_fd(&fds[i]);
}

/* Start sp in the free slot x as stream id: pipes, a cgroup, fork. The
 * slot then runs like any command (output frames, EXIT); a failure to
 * start is answered on the stream (ERROR, or STDERR and EXIT "could not
 * start") and leaves x free. */
void spawn(uint32_t id, struct exec *x, const struct spawn *sp)
{
	int in[2] = { -1, -1 }, out[2] = { -1, -1 }, er[2] = { -1, -1 }, ef[2] = { -1, -1 };
	char ptyname[64] = "";
	int ok;
	if (sp->pty) {
		/* out[0] reads the master, in[1] writes it; the child opens
		 * the slave by name. */
		out[0] = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
		struct winsize ws = { .ws_row = sp->rows ? sp->rows : 24, .ws_col = sp->cols ? sp->cols : 80 };
		ok = out[0] >= 0 && grantpt(out[0]) == 0 && unlockpt(out[0]) == 0 &&
		     ptsname_r(out[0], ptyname, sizeof(ptyname)) == 0 &&
		     ioctl(out[0], TIOCSWINSZ, &ws) == 0 &&
		     (in[1] = fcntl(out[0], F_DUPFD_CLOEXEC, 0)) >= 0 &&
		     pipe2(ef, O_CLOEXEC) == 0;
	} else {
		ok = (sp->stdin_pipe ? pipe2(in, O_CLOEXEC)
				     : (in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC))) >= 0 &&
		     pipe2(out, O_CLOEXEC) == 0 && pipe2(er, O_CLOEXEC) == 0 &&
		     pipe2(ef, O_CLOEXEC) == 0;
	}
	int fds[] = { in[0], in[1], out[0], out[1], er[0], er[1], ef[0], ef[1] };
	if (!ok) {
		send_error(id, errno, "cannot create pipes: %s", strerror(errno));
		close_fds(fds, CAP_ARRAY_SIZE(fds));
		return;
	}

	char cg[CG_NAME_MAX] = "";
	int cgfd = -1;
	if (A.cg_fd >= 0 && (ok = cg_create(sp->ctr ? sp->ctr->cg : "", sp->pids_max, cg, sizeof(cg), &cgfd)) < 0) {
		send_error(id, -ok, "cannot create the command's cgroup %s: %s", cg, strerror(-ok));
		close_fds(fds, CAP_ARRAY_SIZE(fds));
		return;
	}
	bool placed;
	pid_t pid = fork_into(cgfd, &placed);
	if (pid == 0)
		child(sp, in[0], out[1], er[1], ef[1], sp->pty ? ptyname : NULL, placed ? -1 : cgfd);
	int fork_errno = errno;
	close_fd(&cgfd);
	close_fd(&in[0]);
	close_fd(&out[1]);
	close_fd(&er[1]);
	close_fd(&ef[1]);

	struct start_failure f;
	ssize_t got = pid > 0 ? read(ef[0], &f, sizeof(f)) : -1;
	close_fd(&ef[0]);
	if (pid < 0 || got == (ssize_t)sizeof(f)) {
		int e = pid < 0 ? fork_errno : f.errnum;
		const char *what = pid < 0 ? "cannot fork" :
				   f.stage == 0 ? "cannot change to directory" :
				   f.stage == 1 ? "cannot run" :
				   f.stage == 3 ? "cannot enter the cgroup for" :
				   f.stage == 4 ? "cannot set the rlimits of" :
				   f.stage == 5 ? "cannot enter the container's root for" :
				   f.stage == 6 ? "cannot make a mount of the container for" :
				   sp->user ? "cannot take the requested uid, gid and groups for" :
				   "cannot switch to the tool user for";
		const char *arg = f.stage == 0 ? sp->cwd : sp->name;
		char msg[600];
		int m = snprintf(msg, sizeof(msg), "capsule: %s '%s'%s%.128s: %s\n", what,
				 pid < 0 ? "" : arg, f.stage == 6 && pid > 0 ? " at " : "",
				 f.stage == 6 && pid > 0 ? f.what : "", strerror(e));
		x->id = id;	/* borrow the slot to reuse send_output */
		x->cap = 0;
		send_output(x, CAP_MSG_STDERR, (const uint8_t *)msg, (size_t)CAP_MIN(m, (int)sizeof(msg) - 1));
		struct cap_exit ex = { .kind = CAP_EXIT_START_FAILED, .value = e };
		cap_proto_exit_encode(&A.out, id, &ex);
		close_fd(&in[1]);
		close_fd(&out[0]);
		close_fd(&er[0]);
		exec_release(x);
		if (cg[0]) {
			cg_kill(cg);
			cg_dispose(cg);
		}
		return;
	}

	*x = (struct exec){
		.id = id, .pid = pid, .out_fd = out[0], .err_fd = er[0],
		.in_fd = in[1], .start_ms = cap_now_ms(), .cap = sp->output_cap,
		.pty = sp->pty, .no_sync = sp->no_sync, .flush_seq = agent_durable_seq(),
	};
	memcpy(x->cg, cg, sizeof(cg));
	cap_buf_init(&x->in_pending);
	x->deadline_ms = sp->timeout_ms ? x->start_ms + sp->timeout_ms : 0;
	cap_set_nonblock(x->out_fd, 1);
	if (x->err_fd >= 0)
		cap_set_nonblock(x->err_fd, 1);
	if (x->in_fd >= 0)
		cap_set_nonblock(x->in_fd, 1);
}

/* A free exec slot, or NULL. */
struct exec *free_slot(void)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id == 0)
			return &A.execs[i];
	return NULL;
}

/* mkdir -p path, mode 0755; what fails shows at the chdir after. */
static void make_dirs(const char *path)
{
	struct stat st;
	if (stat(path, &st) == 0)
		return;
	int r = cap_mkdir_p(path, 0755);
	if (r < 0)
		agent_log("cannot make the command's directory %s: %s", path, strerror(-r));
}

void handle_exec(uint32_t id, const uint8_t *p, size_t n)
{
	struct cap_exec_req req;
	struct cap_err err = { 0 };
	struct exec *x;
	int ok;

	if (id == 0 || exec_find(id) || agent_durable_waiting(id)) {
		send_error(id, EINVAL, "stream id %u is zero or already in use", id);
		return;
	}
	if (!(x = free_slot())) {
		send_error(id, EBUSY, "too many commands running (%d)", CAP_PROTO_MAX_STREAMS);
		return;
	}
	if (cap_proto_exec_decode(p, n, &req, &err) < 0) {
		send_error(id, EBADMSG, "%s", err.msg);
		return;
	}
	bool user = req.flags & CAP_EXEC_USER;
	struct ctr_start cs;
	char cmsg[400];
	if ((req.flags & CAP_EXEC_CONTAINER) && (ok = ctr_prepare(&req, &cs, cmsg, sizeof(cmsg))) < 0) {
		send_error(id, -ok, "%s", cmsg);
		cap_exec_req_fini(&req);
		return;
	}
	bool own_root = (req.flags & CAP_EXEC_CONTAINER) && (req.ctr->options & (CAP_CTR_ROOT | CAP_CTR_JOIN));
	/* A container's directory is made when missing, as root, as runc
	 * does (in its own root: by the child, agent-ctr.c); a chdir failure
	 * is then reported as for any command. */
	if (user && !own_root && req.cwd && req.cwd[0])
		make_dirs(req.cwd);
	char *home;
	struct exec_job job = { &req, make_env(&req, &home) };
	struct spawn sp = {
		.stdin_pipe = req.flags & CAP_EXEC_STDIN, .pty = req.flags & CAP_EXEC_PTY,
		.rows = req.rows, .cols = req.cols, .pids_max = req.pids_max,
		.output_cap = req.output_cap, .timeout_ms = req.timeout_ms,
		.name = req.argv[0], .cwd = exec_cwd(&req), .user = user ? &req : NULL,
		.no_sync = req.flags & CAP_EXEC_NO_SYNC, .run = run_exec, .ud = &job,
		.ctr = (req.flags & CAP_EXEC_CONTAINER) ? &cs : NULL,
	};
	uint64_t oom = sp.ctr ? ctr_oom_kills(cs.slot) : 0;
	spawn(id, x, &sp);
	if (sp.ctr && x->id == id) {
		x->ctr = cs.slot;
		x->ctr_init = cs.init;
		x->oom_base = oom;
		ctr_started(&cs, x->pid);
	}
	free(job.env);
	free(home);
	cap_exec_req_fini(&req);
}

/* --- the end of a command -------------------------------------------- */

/* Whether a command or transfer other than except runs (or ends). */
bool others_running(const struct exec *except)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id && &A.execs[i] != except)
			return true;
	return false;
}

/* reading: its pipes were polled for reading in this round (no backlog
 * to the host stopped it). */
void finish_if_done(struct exec *x, int64_t now, bool reading)
{
	if (!x->exited)
		return;
	bool drained = x->out_fd < 0 && x->err_fd < 0;
	/* The grace is for children that keep the pipes open, not for the
	 * output still in them: while a slow host stops the reading, the
	 * pipes hold up to 64 KiB of the command's output, and that is read
	 * to EOF before the grace starts to run. */
	if (!drained && !reading)
		x->drain_ms = now;
	if (!drained && now - x->drain_ms < DRAIN_GRACE_MS)
		return;
	/* Its cgroup was killed when the leader exited: report the end once
	 * nothing of it runs, or after CG_EMPTY_WAIT_MS regardless. */
	if (x->cg[0]) {
		if (cg_remove(x->cg) == 0) {
			x->cg[0] = '\0';
		} else {
			if (now - x->cg_kill_ms >= CG_REKILL_MS)
				exec_kill(x);
			if (now - x->exit_ms < CG_EMPTY_WAIT_MS)
				return;
			cg_dispose(x->cg);
		}
	}
	struct cap_exit ex = { .duration_ms = (uint32_t)(x->exit_ms - x->start_ms) };
	if (WIFSIGNALED(x->wstatus)) {
		ex.kind = CAP_EXIT_SIGNAL;
		ex.value = WTERMSIG(x->wstatus);
	} else {
		ex.kind = CAP_EXIT_CODE;
		ex.value = WEXITSTATUS(x->wstatus);
	}
	if (x->timed_out)
		ex.flags |= CAP_EXIT_TIMED_OUT;
	if (x->truncated)
		ex.flags |= CAP_EXIT_TRUNCATED;
	/* Killed by the OOM killer of its container's memory.max. */
	if (x->ctr && ex.kind == CAP_EXIT_SIGNAL && ex.value == SIGKILL && ctr_oom_kills(x->ctr) > x->oom_base)
		ex.flags |= CAP_EXIT_OOM;
	/* What it wrote is on the host's disks before its end is told. */
	if (!x->detached)
		agent_durable_exit(&A.out, x->id, &ex, !x->no_sync, others_running(x), x->flush_seq);
	exec_release(x);
}

void kill_all_execs(void)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id)
			exec_kill(&A.execs[i]);
}

void detach_all_execs(void)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++) {
		struct exec *x = &A.execs[i];
		if (!x->id)
			continue;
		x->detached = true;
		x->id = CAP_DETACHED_ID + (uint32_t)i;
		/* What the old host sent is not the new one's to give. */
		cap_buf_fini(&x->in_pending);
		cap_buf_init(&x->in_pending);
	}
}

void reap(void)
{
	struct signalfd_siginfo si;
	while (read(A.sigfd, &si, sizeof(si)) > 0)
		;
	int status;
	pid_t pid;
	while ((pid = waitpid(-1, &status, WNOHANG)) > 0) {
		if (agent_publish_reaped(pid, status))
			continue;
		for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++) {
			struct exec *x = &A.execs[i];
			if (x->id && x->pid == pid && !x->exited) {
				x->exited = true;
				x->wstatus = status;
				x->exit_ms = x->drain_ms = cap_now_ms();
				if (x->ctr_init)
					ctr_ended(x->ctr, pid);
				/* Nothing it started outlives it. */
				exec_kill(x);
			}
		}
	}
}
