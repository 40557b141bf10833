/* The monitor processes of OCI containers (docs/oci.md). An engine waits
 * on and signals the pid runc writes to --pid-file; here that pid is a
 * host process, the monitor, standing for the container's process in
 * the guest: it holds the stdio it was given (pipes, or the PTY whose
 * master went to the console socket), runs the process in the sandbox
 * through the shim's control socket, pumps its stdio, forwards every
 * catchable signal it receives to it, and exits with its status.
 * create's monitor is held at a gate until `start`; an exec's starts at
 * once. Each listens on a unix socket for the runtime's other verbs. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pty.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "buf.h"
#include "named.h"
#include "oci-int.h"
#include "paths.h"
#include "proc.h"
#include "sandbox.h"
#include "sock.h"
#include "util.h"

unsigned long long cap_oci_proc_start(pid_t pid)
{
	char path[64];
	_cleanup_free_ char *s = NULL;
	if (pid <= 0)
		return 0;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (cap_read_file(path, 4096, &s) < 0)
		return 0;
	/* The command name (field 2) may hold spaces and parentheses: count
	 * from its last ')'. Field 3 is the state, 22 the start time. */
	char *p = strrchr(s, ')');
	if (!p || p[1] != ' ' || p[2] == 'Z' || p[2] == 'X')
		return 0;
	int field = 2;
	for (char *t = p + 1; *t; t++)
		if (*t == ' ' && ++field == 22)
			return strtoull(t + 1, NULL, 10);
	return 0;
}

bool cap_oci_proc_same(pid_t pid, unsigned long long start)
{
	return start && cap_oci_proc_start(pid) == start;
}

void cap_oci_sock_path(int dirfd, const char *name, char *buf, size_t len)
{
	snprintf(buf, len, "/proc/self/fd/%d/%s", dirfd, name);
}

/* Wait until fd is ready for events or the deadline passes. */
static int wait_fd(int fd, short events, int64_t deadline, const char *line, int timeout_ms,
		   struct cap_err *err)
{
	for (;;) {
		int64_t left = deadline - cap_now_ms();
		if (left <= 0)
			return cap_err_set(err, ETIMEDOUT, "the container's monitor did not answer '%s' within %d ms",
					   line, timeout_ms);
		struct pollfd pfd = { .fd = fd, .events = events };
		int k = poll(&pfd, 1, (int)left);
		if (k > 0)
			return 0;
		if (k < 0 && errno != EINTR)
			return cap_err_set(err, errno, "poll: %s", strerror(errno));
	}
}

int cap_oci_monitor_call(const char *path, const char *line, char *answer,
			 size_t len, int timeout_ms, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "socket path %s is too long", path);
	strcpy(sa.sun_path, path);
	/* Non-blocking throughout: a monitor that is stopped, stuck or
	 * flooded must not hold the caller past its deadline. */
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return cap_err_set(err, errno, "socket: %s", strerror(errno));
	int64_t deadline = cap_now_ms() + timeout_ms;
	while (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		/* EAGAIN: its backlog is full (it does not accept). */
		if (errno == EINTR || (errno == EAGAIN && cap_now_ms() < deadline)) {
			if (errno == EAGAIN)
				usleep(10000);
			continue;
		}
		if (errno == EAGAIN)
			return cap_err_set(err, ETIMEDOUT, "the container's monitor did not accept '%s' within %d ms",
					   line, timeout_ms);
		return cap_err_set(err, errno, "the container's monitor does not answer (%s)", strerror(errno));
	}
	_cleanup_free_ char *msg = xasprintf("%s\n", line);
	size_t off = 0, mlen = strlen(msg);
	while (off < mlen) {
		ssize_t k = send(fd, msg + off, mlen - off, MSG_NOSIGNAL);
		if (k > 0) {
			off += (size_t)k;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN)
			return cap_err_set(err, EPIPE, "the container's monitor closed its socket (%s)", strerror(errno));
		int r = wait_fd(fd, POLLOUT, deadline, line, timeout_ms, err);
		if (r < 0)
			return r;
	}
	size_t n = 0;
	while (n + 1 < len) {
		ssize_t k = read(fd, answer + n, len - 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN) {
			int r = wait_fd(fd, POLLIN, deadline, line, timeout_ms, err);
			if (r < 0)
				return r;
			continue;
		}
		if (k <= 0)
			break;
		n += (size_t)k;
		if (memchr(answer, '\n', n))
			break;
	}
	answer[n] = '\0';
	answer[strcspn(answer, "\n")] = '\0';
	if (n == 0)
		return cap_err_set(err, EPIPE, "the container's monitor closed its socket without an answer");
	return 0;
}

size_t cap_oci_exec_monitors(const char *dir, pid_t *pids, unsigned long long *starts, size_t max)
{
	_cleanup_free_ char *edir = xasprintf("%s/" CAP_OCI_EXEC_DIR, dir);
	DIR *d = opendir(edir);
	size_t n = 0;
	struct dirent *e;
	while (d && n < max && (e = readdir(d))) {
		int pid;
		unsigned long long start;
		if (sscanf(e->d_name, CAP_OCI_EXEC_SOCK_FMT, &pid, &start) != 2 || !cap_oci_proc_same(pid, start))
			continue;
		pids[n] = pid;
		if (starts)
			starts[n] = start;
		n++;
	}
	if (d)
		closedir(d);
	return n;
}

#define MAX_CONNS 8
/* The process's output waiting for a slow reader of our stdout or
 * stderr, per stream. Over it, the shim's socket is not read, so that
 * the guest's writes wait as they would on a full pipe under runc; our
 * signals and socket are served all the while. */
#define OUT_CAP (256u << 10)
/* How long a process killed by SIGKILL waits for the reader of its last
 * output: the engine waits for our exit to see the container stopped. */
#define KILL_DRAIN_MS 2000

struct conn {
	int fd;	/* -1: free */
	char buf[256];
	size_t n;
};

struct mon {
	const struct cap_oci_monitor *m;
	struct cap_sandbox *sb;
	int dirfd;	/* the directory of our socket */
	char sock_name[64];
	int sfd, lfd;
	struct conn conns[MAX_CONNS];
	bool started, done, rejected;
	uint32_t id;
	struct cap_exit ex;
	int rej_errno;
	char rej_msg[300];
	bool stdin_open;
	int tty_fd;	/* where the window size is read, -1 without a terminal */
	/* Without a controlling terminal (a non-detached exec that cannot
	 * take one) no SIGWINCH comes: the size is looked at every so often. */
	bool poll_winsz;
	uint16_t rows, cols;	/* the size last sent */
	struct cap_buf out[3];	/* [1] stdout, [2] stderr, not yet written */
	bool out_broken[3];
	int out_flags[3];	/* fds 1 and 2's file status flags to restore, -1: none */
	/* The output over OUT_CAP is dropped instead of held (after SIGKILL:
	 * the process's exit must get through to us), or all output left is
	 * (a terminating signal while draining it after the exit). */
	bool drop_over_cap, give_up;
	bool vm_gone;	/* the sandbox ended under the process */
	int end_sig;	/* a signal that ended the gate before start */
	/* After SIGKILL: give up on the guest then, or, once the process
	 * ended, on the reader of its output (KILL_DRAIN_MS at most). */
	int64_t kill_deadline;
	int ready_fd;
	bool raw;
	struct termios saved;
};

/* Say "ok" or the error to whoever waits for us to be ready. */
static void ready(struct mon *s, const char *err)
{
	if (s->ready_fd < 0)
		return;
	char buf[1100];
	snprintf(buf, sizeof(buf), "%s\n", err ? err : "ok");
	cap_write_all(s->ready_fd, buf, strlen(buf));
	close(s->ready_fd);
	s->ready_fd = -1;
}

/* Write what stream fd holds as far as its reader takes it now (fds 1
 * and 2 are non-blocking while we run). */
static void flush_out(struct mon *s, int fd)
{
	struct cap_buf *b = &s->out[fd];
	while (cap_buf_used(b) && !s->out_broken[fd]) {
		ssize_t k = write(fd, cap_buf_head(b), cap_buf_used(b));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno == EAGAIN)
			return;
		if (k <= 0) {
			/* A reader gone (EPIPE) drops the rest of that stream
			 * only: the process goes on, as it would writing into a
			 * closed log. */
			s->out_broken[fd] = true;
			break;
		}
		cap_buf_consume(b, (size_t)k);
	}
	if (s->out_broken[fd])
		cap_buf_consume(b, cap_buf_used(b));
}

static size_t out_pending(const struct mon *s)
{
	return cap_buf_used(&s->out[1]) + cap_buf_used(&s->out[2]);
}

static bool out_full(const struct mon *s)
{
	return cap_buf_used(&s->out[1]) > OUT_CAP || cap_buf_used(&s->out[2]) > OUT_CAP;
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct mon *s = ud;
	(void)id;
	if (fd < 1 || fd > 2 || s->out_broken[fd] || s->give_up)
		return;
	if (s->drop_over_cap && cap_buf_used(&s->out[fd]) > OUT_CAP)
		return;
	cap_buf_append(&s->out[fd], p, n);
	flush_out(s, fd);
}

/* Our stdout and stderr non-blocking, so that a reader that stalls holds
 * the process's output, not us. O_NONBLOCK belongs to the file
 * description, which our caller shares (a terminal, conmon's pipe, a
 * FIFO; fds 1 and 2 often the same one): each fd gets a description of
 * our own instead, opened anew through /proc, so that the caller's never
 * changes, even if we are killed. A socket cannot be opened so (ENXIO):
 * its shared description is made non-blocking and its flags restored at
 * exit. Regular files and block devices never wait for a reader: as is. */
static void out_nonblock(struct mon *s)
{
	for (int fd = 1; fd <= 2; fd++) {
		struct stat st;
		int fl = fcntl(fd, F_GETFL);
		if (fl < 0 || (fl & O_NONBLOCK) || fstat(fd, &st) < 0 || S_ISREG(st.st_mode) ||
		    S_ISBLK(st.st_mode))
			continue;
		char path[32];
		snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
		int nfd = open(path, O_WRONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC | (fl & O_APPEND));
		if (nfd >= 0) {
			dup2(nfd, fd);	/* without O_CLOEXEC, as fd was */
			close(nfd);
			continue;
		}
		s->out_flags[fd] = fl;
		fcntl(fd, F_SETFL, fl | O_NONBLOCK);
	}
}

/* The shared descriptions' flags as they were, fd 2's first: when fds 1
 * and 2 share one, fd 2's saved flags are fd 1's made non-blocking. */
static void out_restore(struct mon *s)
{
	for (int fd = 2; fd >= 1; fd--)
		if (s->out_flags[fd] >= 0) {
			fcntl(fd, F_SETFL, s->out_flags[fd]);
			s->out_flags[fd] = -1;
		}
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum,
		    const char *msg)
{
	struct mon *s = ud;
	(void)id;
	s->done = true;
	if (ex) {
		s->ex = *ex;
	} else {
		s->rejected = true;
		s->rej_errno = errnum;
		snprintf(s->rej_msg, sizeof(s->rej_msg), "%s", msg ? msg : strerror(errnum));
	}
}

static const struct cap_exec_events events = { on_output, on_done, NULL };

/* Whether a signal's default action ends a process. */
static bool terminates(int sig)
{
	switch (sig) {
	case SIGCHLD: case SIGCONT: case SIGSTOP: case SIGTSTP: case SIGTTIN:
	case SIGTTOU: case SIGURG: case SIGWINCH:
		return false;
	default:
		return true;
	}
}

/* Whether fd 0 is /dev/null: then the process gets no stdin at all. */
static bool stdin_is_null(void)
{
	struct stat st, null;
	return fstat(0, &st) == 0 && S_ISCHR(st.st_mode) && stat("/dev/null", &null) == 0 &&
	       st.st_rdev == null.st_rdev;
}

static void touch_at(struct mon *s, const char *name, const char *content)
{
	_cleanup_free_ char *path = xasprintf("%s/%s", s->m->dir, name);
	cap_write_file_atomic(path, content, strlen(content), 0644);
}

/* Send the EXEC of the container's process. */
static int start_process(struct mon *s, struct cap_err *err)
{
	const struct cap_oci_process *p = s->m->proc;
	struct cap_exec_req req = { 0 };
	req.argv = p->args;
	req.argc = (uint32_t)p->nargs;
	req.env = p->env;
	req.envc = (uint32_t)p->nenv;
	req.cwd = p->cwd;
	req.flags = CAP_EXEC_USER;
	req.pids_max = s->m->pids_max;
	req.uid = p->uid;
	req.gid = p->gid;
	req.ngroups = CAP_MIN(p->ngroups, (uint32_t)CAP_EXEC_MAX_GROUPS);
	memcpy(req.groups, p->groups, req.ngroups * sizeof(req.groups[0]));
	req.nrlimits = CAP_MIN(p->nrlimits, (uint32_t)CAP_EXEC_MAX_RLIMITS);
	memcpy(req.rlimits, p->rlimits, req.nrlimits * sizeof(req.rlimits[0]));
	req.umask = p->umask;
	if (s->m->ctr) {
		req.flags |= CAP_EXEC_CONTAINER;
		req.ctr = (struct cap_exec_container *)s->m->ctr;
	}
	if (p->terminal || !stdin_is_null())
		req.flags |= CAP_EXEC_STDIN;
	if (p->terminal) {
		struct winsize ws = { 0 };
		req.flags |= CAP_EXEC_PTY;
		if (s->tty_fd >= 0 && ioctl(s->tty_fd, TIOCGWINSZ, &ws) == 0 && ws.ws_row && ws.ws_col) {
			req.rows = ws.ws_row;
			req.cols = ws.ws_col;
		} else {
			req.rows = p->rows ? p->rows : 24;
			req.cols = p->cols ? p->cols : 80;
		}
		s->rows = req.rows;
		s->cols = req.cols;
	}
	int r = cap_sandbox_exec(s->sb, &req, &events, s, &s->id, err);
	if (r < 0)
		return r;
	s->started = true;
	s->stdin_open = req.flags & CAP_EXEC_STDIN;
	if (s->m->gate)
		touch_at(s, CAP_OCI_STARTED, "1\n");
	return 0;
}

static void forward(struct mon *s, int sig, enum cap_signal_scope scope)
{
	cap_sandbox_signal_scope(s->sb, s->id, sig, scope);
	/* A guest that does not end its process on SIGKILL is not waited
	 * for long: the engine's kill must end the container. */
	if (sig == SIGKILL && !s->kill_deadline) {
		s->kill_deadline = cap_now_ms() + 10000;
		s->drop_over_cap = true;
	}
}

/* Send the terminal's size when it changed. */
static void check_winsz(struct mon *s)
{
	struct winsize ws;
	if (!s->started || s->done || !s->m->proc->terminal || s->tty_fd < 0 ||
	    ioctl(s->tty_fd, TIOCGWINSZ, &ws) < 0 || !ws.ws_row || !ws.ws_col)
		return;
	if (ws.ws_row == s->rows && ws.ws_col == s->cols)
		return;
	s->rows = ws.ws_row;
	s->cols = ws.ws_col;
	cap_sandbox_resize(s->sb, s->id, ws.ws_row, ws.ws_col);
}

/* A signal for the container's process, from our signalfd or from
 * `kill` through the socket. */
static void deliver(struct mon *s, int sig, enum cap_signal_scope scope)
{
	if (s->done) {
		/* The process ended; its output waits for a reader. A signal
		 * that would end us ends that wait. */
		if (terminates(sig))
			s->give_up = true;
		return;
	}
	if (!s->started) {
		/* runc's init, held before start, dies of it the same way. */
		if (terminates(sig) && !s->end_sig)
			s->end_sig = sig;
		return;
	}
	forward(s, sig, scope);
}

static void on_signal(struct mon *s, int sig)
{
	if (sig == SIGCHLD) {
		while (waitpid(-1, NULL, WNOHANG) > 0)
			;
		return;
	}
	if (sig == SIGWINCH) {
		check_winsz(s);
		return;
	}
	deliver(s, sig, CAP_SIGNAL_PROCESS);
}

static void answer(struct conn *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void answer(struct conn *c, const char *fmt, ...)
{
	char buf[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf) - 1, fmt, ap);
	va_end(ap);
	strcat(buf, "\n");
	cap_set_nonblock(c->fd, 0);
	cap_write_all(c->fd, buf, strlen(buf));
	close(c->fd);
	c->fd = -1;
}

/* One command line on our socket: "ping", "start", "signal N SCOPE". */
static void command(struct mon *s, struct conn *c, char *line)
{
	struct cap_err err = { 0 };
	if (strcmp(line, "ping") == 0) {
		answer(c, "ok %s", s->done ? "stopped" : s->started ? "running" : "created");
	} else if (strcmp(line, "start") == 0) {
		if (s->started || !s->m->gate)
			answer(c, "error cannot start an already running container");
		else if (s->end_sig)
			answer(c, "error cannot start a container that has stopped");
		else if (start_process(s, &err) < 0)
			answer(c, "error %s", err.msg);
		else
			answer(c, "ok");
	} else if (strncmp(line, "signal ", 7) == 0) {
		char scope[16] = "";
		int sig = 0;
		if (sscanf(line + 7, "%d %15s", &sig, scope) < 1 || sig <= 0 || sig >= NSIG) {
			answer(c, "error bad signal command '%s'", line);
			return;
		}
		deliver(s, sig, strcmp(scope, "all") == 0 ? CAP_SIGNAL_ALL : CAP_SIGNAL_PROCESS);
		answer(c, "ok");
	} else {
		answer(c, "error unknown command '%.100s'", line);
	}
}

static void conn_read(struct mon *s, struct conn *c)
{
	ssize_t k = read(c->fd, c->buf + c->n, sizeof(c->buf) - 1 - c->n);
	if (k < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (k <= 0) {
		close(c->fd);
		c->fd = -1;
		return;
	}
	c->n += (size_t)k;
	c->buf[c->n] = '\0';
	char *nl = strchr(c->buf, '\n');
	if (!nl) {
		if (c->n == sizeof(c->buf) - 1)
			answer(c, "error line too long");
		return;
	}
	*nl = '\0';
	command(s, c, c->buf);
}

static void conn_accept(struct mon *s)
{
	int fd = accept4(s->lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
	if (fd < 0)
		return;
	for (size_t i = 0; i < MAX_CONNS; i++)
		if (s->conns[i].fd < 0) {
			s->conns[i] = (struct conn){ .fd = fd };
			return;
		}
	close(fd);	/* busy: the caller retries or reports */
}

/* Send the PTY master to the console socket as runc does: one
 * descriptor by SCM_RIGHTS with a short name as the payload. */
static int send_master(const char *path, int master, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "--console-socket %s is too long", path);
	strcpy(sa.sun_path, path);
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		return cap_err_set(err, errno, "--console-socket %s: %s", path, strerror(errno));
	static const char name[] = "/dev/ptmx";
	ssize_t n = cap_send_fd(fd, master, name, sizeof(name) - 1, 0);
	if (n < 0)
		return cap_err_set(err, (int)-n, "sending the terminal to --console-socket %s: %s", path,
				   strerror((int)-n));
	return 0;
}

/* The process's terminal: a new PTY (its master to the console socket,
 * its slave our stdio and controlling terminal), or ours in raw mode. */
static int setup_tty(struct mon *s, struct cap_err *err)
{
	const struct cap_oci_process *p = s->m->proc;
	if (!s->m->console_socket) {
		if (isatty(0)) {
			s->tty_fd = 0;
			struct termios t;
			if (tcgetattr(0, &s->saved) == 0) {
				t = s->saved;
				cfmakeraw(&t);
				s->raw = tcsetattr(0, TCSAFLUSH, &t) == 0;
			}
		}
		return 0;
	}
	int master, slave;
	if (openpty(&master, &slave, NULL, NULL, NULL) < 0)
		return cap_err_set(err, errno, "openpty: %s", strerror(errno));
	/* The guest's PTY does the line discipline: this one passes bytes. */
	struct termios t;
	if (tcgetattr(slave, &t) == 0) {
		cfmakeraw(&t);
		tcsetattr(slave, TCSANOW, &t);
	}
	if (p->rows && p->cols) {
		struct winsize ws = { .ws_row = p->rows, .ws_col = p->cols };
		ioctl(slave, TIOCSWINSZ, &ws);
	}
	int r = send_master(s->m->console_socket, master, err);
	close(master);
	if (r < 0) {
		close(slave);
		return r;
	}
	/* Our controlling terminal, so that a resize of the master by the
	 * engine reaches us as SIGWINCH. A non-detached exec takes a session
	 * of its own for it (its stdio is this PTY now, not its caller's
	 * terminal); a process group leader cannot, and looks at the size
	 * every so often instead. */
	if (!s->m->detached)
		setsid();
	if (ioctl(slave, TIOCSCTTY, 0) < 0)
		s->poll_winsz = true;
	for (int fd = 0; fd < 3; fd++)
		dup2(slave, fd);
	if (slave > 2)
		close(slave);
	s->tty_fd = 0;
	return 0;
}

static void restore_tty(struct mon *s)
{
	if (s->raw) {
		tcsetattr(0, TCSAFLUSH, &s->saved);
		s->raw = false;
	}
}

/* Every catchable signal but SIGPIPE (ignored) goes to the signalfd. */
static int block_signals(void)
{
	int sigs[NSIG];
	size_t n = 0;
	for (int sig = 1; sig < NSIG; sig++) {
		if (sig == SIGKILL || sig == SIGSTOP || sig == SIGPIPE)
			continue;
		if (sig >= 32 && sig < SIGRTMIN)	/* glibc's own */
			continue;
		sigs[n++] = sig;
	}
	sigset_t set;
	return cap_signalfd(sigs, n, &set);
}

/* Stop the VM without waiting for it (the shim does the rest), once the
 * request has gone out. */
static void stop_sandbox(struct mon *s)
{
	cap_sandbox_stop_async(s->sb);
	int64_t until = cap_now_ms() + 2000;
	while (cap_sandbox_backlog(s->sb) > 0 && !cap_sandbox_is_dead(s->sb) && cap_now_ms() < until) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		struct cap_err err = { 0 };
		cap_sandbox_pollfds(s->sb, pfd);
		if (poll(pfd, CAP_SANDBOX_NPOLL, 100) < 0 && errno != EINTR)
			break;
		if (cap_sandbox_dispatch(s->sb, pfd, &err) < 0)
			break;
	}
}

/* The exec monitors of the container in dir end before its monitor
 * does, as runc's execs die before the engine sees its init's exit
 * (Podman refuses to clean up a stopped container with a live exec):
 * they end by themselves once the VM is stopped; one that has not
 * within 3 s is killed. */
static void end_execs(const char *dir)
{
	pid_t pids[256];
	int64_t until = cap_now_ms() + 3000;
	size_t n;
	while ((n = cap_oci_exec_monitors(dir, pids, NULL, 256)) > 0 && cap_now_ms() < until)
		usleep(20000);
	for (size_t i = 0; i < n; i++)
		kill(pids[i], SIGKILL);
}

/* Set up: cgroup, sandbox, attachment, terminal, socket. 0 or -errno. */
static int setup(struct mon *s, struct cap_err *err)
{
	const struct cap_oci_monitor *m = s->m;
	int r;
	if (m->cgroups_path && *m->cgroups_path) {
		/* The jail nests each VM's cgroup below this path. */
		setenv("CAPSULE_CGROUP_PARENT", m->cgroups_path, 1);
		if ((r = cap_oci_cgroup_join(m->cgroups_path, err)) < 0)
			return r;
	}
	if (m->gate && !m->pod_member && (r = cap_named_start(m->sandbox, err)) < 0)
		return r;
	struct cap_named_status st;
	if ((r = cap_named_status(m->sandbox, &st, err)) < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ESRCH, "container not running (its %s %s is stopped)",
				   m->pod_member ? "pod's VM, sandbox" : "sandbox", m->sandbox);
	if ((r = cap_sandbox_attach(st.control, &s->sb, err)) < 0)
		return r;
	if (m->proc->terminal && (r = setup_tty(s, err)) < 0)
		return r;
	/* Our socket. */
	_cleanup_free_ char *sdir = m->gate ? xstrdup(m->dir) : xasprintf("%s/" CAP_OCI_EXEC_DIR, m->dir);
	if (!m->gate && mkdir(sdir, 0700) < 0 && errno != EEXIST)
		return cap_err_set(err, errno, "mkdir %s: %s", sdir, strerror(errno));
	s->dirfd = open(sdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (s->dirfd < 0)
		return cap_err_set(err, errno, "%s: %s", sdir, strerror(errno));
	if (m->gate)
		snprintf(s->sock_name, sizeof(s->sock_name), "%s", CAP_OCI_MONITOR_SOCK);
	else
		snprintf(s->sock_name, sizeof(s->sock_name), CAP_OCI_EXEC_SOCK_FMT, (int)getpid(),
			 cap_oci_proc_start(getpid()));
	char path[128];
	cap_oci_sock_path(s->dirfd, s->sock_name, path, sizeof(path));
	if ((s->lfd = cap_unix_listen(path, err)) < 0)
		return s->lfd;
	return 0;
}

/* The status to exit with once the process ended. */
static int end_status(struct mon *s)
{
	if (!s->rejected)
		return cap_exit_status(&s->ex);
	cap_oci_error("the guest refused the process %s: %s", s->m->proc->args[0], s->rej_msg);
	return s->rej_errno == ENOENT ? 127 : s->rej_errno == EACCES ? 126 : 1;
}

static void mon_free(struct mon *s)
{
	out_restore(s);
	cap_buf_fini(&s->out[1]);
	cap_buf_fini(&s->out[2]);
	cap_sandbox_free(s->sb);
	free(s);
}

int cap_oci_monitor_run(const struct cap_oci_monitor *m)
{
	struct mon *s = xcalloc(1, sizeof(*s));
	struct cap_err err = { 0 };
	int status = 1;
	s->m = m;
	s->ready_fd = m->ready_fd;
	s->dirfd = s->lfd = s->sfd = s->tty_fd = -1;
	s->out_flags[1] = s->out_flags[2] = -1;
	cap_buf_init(&s->out[1]);
	cap_buf_init(&s->out[2]);
	for (size_t i = 0; i < MAX_CONNS; i++)
		s->conns[i].fd = -1;
	if (m->detached) {
		/* Nothing of the engine's but our stdio (conmon's sync pipes
		 * must see their end when the runtime exits). */
		if (s->ready_fd >= 0) {
			cap_child_keep_fd3(s->ready_fd);
			s->ready_fd = 3;
		} else {
			syscall(SYS_close_range, 3U, ~0U, 0U);
		}
		setsid();
	}
	if ((s->sfd = block_signals()) < 0) {
		cap_err_set(&err, -s->sfd, "signalfd: %s", strerror(-s->sfd));
		goto fail;
	}
	if (setup(s, &err) < 0)
		goto fail;
	out_nonblock(s);
	if (!m->gate && start_process(s, &err) < 0)
		goto fail;
	if (m->gate)
		ready(s, NULL);

	/* Until the process ends, then until its output is written (or a
	 * terminating signal says not to wait for the reader). */
	while (!s->done || (out_pending(s) && !s->give_up)) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL + 5 + MAX_CONNS];
		int slot[MAX_CONNS];
		if (s->done && s->kill_deadline)
			s->kill_deadline = CAP_MIN(s->kill_deadline, cap_now_ms() + KILL_DRAIN_MS);
		cap_sandbox_pollfds(s->sb, pfd);
		if (s->done) {
			for (int i = 0; i < CAP_SANDBOX_NPOLL; i++)
				pfd[i].fd = -1;
		} else if (out_full(s) && !s->drop_over_cap) {
			/* Backpressure: the guest's writes wait in the shim and
			 * the guest, as on a full pipe. */
			pfd[0].events &= (short)~POLLIN;
		}
		int n = CAP_SANDBOX_NPOLL;
		int sig_slot = n;
		pfd[n++] = (struct pollfd){ .fd = s->sfd, .events = POLLIN };
		int lslot = n;
		pfd[n++] = (struct pollfd){ .fd = s->lfd, .events = POLLIN };
		int in_slot = -1;
		if (s->stdin_open && !s->done && cap_sandbox_backlog(s->sb) < (1u << 20)) {
			in_slot = n;
			pfd[n++] = (struct pollfd){ .fd = 0, .events = POLLIN };
		}
		int out_slot[3] = { -1, -1, -1 };
		for (int fd = 1; fd <= 2; fd++)
			if (cap_buf_used(&s->out[fd])) {
				out_slot[fd] = n;
				pfd[n++] = (struct pollfd){ .fd = fd, .events = POLLOUT };
			}
		for (size_t i = 0; i < MAX_CONNS; i++) {
			slot[i] = -1;
			if (s->conns[i].fd >= 0) {
				slot[i] = n;
				pfd[n++] = (struct pollfd){ .fd = s->conns[i].fd, .events = POLLIN };
			}
		}
		int timeout = -1;
		if (s->kill_deadline)
			timeout = (int)CAP_MAX(s->kill_deadline - cap_now_ms(), 0);
		if (s->poll_winsz && s->started && !s->done)
			timeout = timeout < 0 ? 500 : CAP_MIN(timeout, 500);
		if (s->ready_fd >= 0)
			timeout = 20;	/* until the EXEC has gone out */
		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) {
			cap_err_set(&err, errno, "poll: %s", strerror(errno));
			goto fail;
		}
		if (pfd[sig_slot].revents) {
			struct signalfd_siginfo si;
			while (read(s->sfd, &si, sizeof(si)) == sizeof(si))
				on_signal(s, (int)si.ssi_signo);
		}
		if (pfd[lslot].revents)
			conn_accept(s);
		for (size_t i = 0; i < MAX_CONNS; i++)
			if (slot[i] >= 0 && pfd[slot[i]].revents && s->conns[i].fd >= 0)
				conn_read(s, &s->conns[i]);
		for (int fd = 1; fd <= 2; fd++)
			if (out_slot[fd] >= 0 && pfd[out_slot[fd]].revents)
				flush_out(s, fd);
		if (s->poll_winsz)
			check_winsz(s);
		if (s->done) {
			/* Killed, ended, and its reader stalls: what is left of
			 * its output is dropped. */
			if (s->kill_deadline && cap_now_ms() >= s->kill_deadline)
				s->give_up = true;
			continue;
		}
		if (in_slot >= 0 && pfd[in_slot].revents) {
			char buf[65536];
			ssize_t k = read(0, buf, sizeof(buf));
			if (k > 0) {
				cap_sandbox_stdin(s->sb, s->id, buf, (size_t)k);
			} else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
				cap_sandbox_stdin(s->sb, s->id, NULL, 0);
				s->stdin_open = false;
			}
		}
		if (cap_sandbox_dispatch(s->sb, pfd, &err) < 0) {
			restore_tty(s);
			/* An exec ends with its container's VM, as runc's execs die
			 * with their container's init: no error then. */
			_cleanup_free_ char *exitf = xasprintf("%s/" CAP_OCI_EXIT, m->dir);
			if (m->gate || access(exitf, F_OK) < 0)
				cap_oci_error("the container's sandbox %s ended under its process: %s", m->sandbox,
					      err.msg);
			ready(s, NULL);
			/* What it wrote before still goes out. */
			s->vm_gone = s->done = true;
			continue;
		}
		if (s->ready_fd >= 0 && s->started && (cap_sandbox_backlog(s->sb) == 0 || s->done))
			ready(s, NULL);
		if (s->end_sig) {
			status = 128 + s->end_sig;
			goto out;
		}
		if (s->kill_deadline && cap_now_ms() >= s->kill_deadline && !s->done) {
			restore_tty(s);
			cap_oci_error("the process did not end within 10 s of SIGKILL; stopping its sandbox %s",
				      m->sandbox);
			if (m->gate && !m->pod_member && cap_named_kill(m->sandbox, &err) < 0)
				cap_oci_log_only("error", err.msg);
			status = 137;
			goto out;
		}
	}
	restore_tty(s);
	/* Given up on the reader: what it takes without waiting still goes. */
	flush_out(s, 1);
	flush_out(s, 2);
	status = s->vm_gone ? 137 : end_status(s);
out:
	restore_tty(s);
	out_restore(s);
	if (m->gate) {
		char buf[16];
		/* The guest's OOM killer: said before the exit, which the
		 * engine waits for. */
		if (s->done && !s->rejected && (s->ex.flags & CAP_EXIT_OOM))
			touch_at(s, CAP_OCI_OOM, "1\n");
		snprintf(buf, sizeof(buf), "%d\n", status);
		touch_at(s, CAP_OCI_EXIT, buf);
		/* The VM does not outlive its container (a pod's outlives each
		 * of its containers but the sandbox). */
		if (s->sb && !cap_sandbox_is_dead(s->sb) && !m->pod_member)
			stop_sandbox(s);
		end_execs(m->dir);
	} else if (s->dirfd >= 0) {
		unlinkat(s->dirfd, s->sock_name, 0);
	}
	mon_free(s);
	return status;
fail:
	restore_tty(s);
	out_restore(s);
	if (s->ready_fd >= 0)
		ready(s, err.msg);
	else
		cap_oci_error("%s", err.msg);
	if (!m->gate && s->dirfd >= 0 && s->sock_name[0])
		unlinkat(s->dirfd, s->sock_name, 0);
	if (m->gate && s->sb && !m->pod_member)
		stop_sandbox(s);
	mon_free(s);
	return 1;
}
