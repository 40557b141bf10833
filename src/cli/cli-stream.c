/* Running one command in a sandbox from the terminal: the options shared
 * by run, exec and shell, and the loop that streams output, forwards
 * stdin, signals and window size, and reports how the command ended. */
#include <ctype.h>
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <termios.h>
#include <unistd.h>

#include "cli.h"
#include "util.h"

/* Whether s reads as a Docker volume, HOST:GUEST with an absolute GUEST:
 * "/a:/b", "./x:/y", "~/x:/y", "name:/path" (not "http://host"). */
static bool volume_like(const char *s)
{
	const char *colon = strchr(s, ':');
	if (!colon || colon == s || colon[1] != '/' || colon[2] == '/')
		return false;
	if (s[0] == '/' || s[0] == '.' || s[0] == '~')
		return true;
	for (const char *p = s; p < colon; p++)
		if (!(isalnum((unsigned char)*p) || *p == '_' || *p == '-' || *p == '.'))
			return false;
	return true;
}

#define NO_MOUNTS \
	"capsule has no bind mounts: a guest never sees a host directory. Instead: --source DIR " \
	"for read-only public data at /source, --workspace DIR (capsule create) for a private copy " \
	"of a project at /workspace that `capsule diff` and `capsule merge` bring back, or " \
	"`capsule cp` to copy files in and out"

bool cap_cli_volume_refused(const char *arg)
{
	if (!arg || !volume_like(arg))
		return false;
	cap_cli_error("'%s' looks like a Docker volume (-v HOST:GUEST); " NO_MOUNTS, arg);
	return true;
}

/* The long options of run, exec and create that take a value (the next
 * argument when not given with '='). */
static const char *const valued[] = {
	"cpus", "memory", "timeout", "output-cap", "pids-max", "accel", "console-log", "source", "env",
	"workdir", "workspace", "workspace-size", "image", "root-size", "work-size", "allow-egress",
	"publish", "secret",
};

/* Whether the option argument a (after its dashes; "--name" or a short
 * cluster "-qe") takes the next argument as its value. */
static bool takes_next(const char *a)
{
	if (a[1] == '-') {
		const char *name = a + 2;
		if (strchr(name, '='))
			return false;
		size_t n = strlen(name), hits = 0;
		for (size_t i = 0; i < CAP_ARRAY_SIZE(valued); i++) {
			if (strcmp(name, valued[i]) == 0)
				return true;
			hits += n && strncmp(name, valued[i], n) == 0;	/* getopt's abbreviations */
		}
		return hits == 1;
	}
	for (const char *p = a + 1; *p; p++)
		if (*p == 'e' || *p == 'w')	/* -e NAME=VALUE, -w DIR: the rest, or the next */
			return p[1] == '\0';
	return false;
}

bool cap_cli_volume_flag(int argc, char **argv)
{
	/* create takes its options anywhere (getopt permutes); run and exec
	 * stop at their first operand (exec's NAME, run's command): what
	 * follows is the command's, "-v" there is grep's. */
	bool anywhere = argc > 0 && strcmp(argv[0], "create") == 0;
	for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++) {
		const char *a = argv[i], *next = i + 1 < argc ? argv[i + 1] : NULL;
		const char *eq = strchr(a, '=');
		if (a[0] != '-' || !a[1]) {
			if (!anywhere)
				return false;
			continue;
		}
		if (strcmp(a, "--volume") == 0 || strcmp(a, "--mount") == 0 ||
		    strncmp(a, "--volume=", 9) == 0 || strncmp(a, "--mount=", 8) == 0) {
			if (!cap_cli_volume_refused(eq ? eq + 1 : next))
				cap_cli_error("%s: " NO_MOUNTS, a);
			return true;
		}
		if (strcmp(a, "-v") == 0 && cap_cli_volume_refused(next))
			return true;
		if (strncmp(a, "-v", 2) == 0 && a[2] && cap_cli_volume_refused(a + 2))
			return true;
		if (takes_next(a))
			i++;
	}
	return false;
}

void cap_cli_exec_init(struct cap_cli_exec *x)
{
	memset(x, 0, sizeof(*x));
	x->req.timeout_ms = 30000;
	x->req.output_cap = 256 * 1024;
	x->req.env = x->envv;
}

int cap_cli_exec_opt(struct cap_cli_exec *x, int c, const char *arg)
{
	unsigned long v;
	switch (c) {
	case CAP_OPT_TIMEOUT:
		if (cap_cli_parse_uint(arg, 0, 86400, &v) < 0) {
			cap_cli_error("--timeout '%s' is not a number of seconds from 0 to 86400", arg);
			return -1;
		}
		x->req.timeout_ms = (uint32_t)(v * 1000);
		return 1;
	case CAP_OPT_PIDS_MAX:
		if (cap_cli_parse_uint(arg, 1, 1u << 22, &v) < 0) {
			cap_cli_error("--pids-max '%s' is not a number of processes from 1 to 4194304", arg);
			return -1;
		}
		x->req.pids_max = (uint32_t)v;
		return 1;
	case CAP_OPT_OUTPUT_CAP:
		if (cap_cli_parse_uint(arg, 0, 1u << 30, &v) < 0) {
			cap_cli_error("--output-cap '%s' is not a number of bytes up to 1073741824", arg);
			return -1;
		}
		x->req.output_cap = (uint32_t)v;
		return 1;
	case 'e':
		if (!strchr(arg, '=') || arg[0] == '=') {
			cap_cli_error("--env '%s' is not NAME=VALUE", arg);
			return -1;
		}
		if (x->req.envc == CAP_ARRAY_SIZE(x->envv) - 1) {
			cap_cli_error("too many --env options (at most %zu)", CAP_ARRAY_SIZE(x->envv) - 1);
			return -1;
		}
		x->envv[x->req.envc++] = (char *)arg;
		return 1;
	case 'w':
		x->req.cwd = (char *)arg;
		return 1;
	case 'i':
		x->interactive = true;
		return 1;
	case 'q':
		x->quiet = true;
		return 1;
	case CAP_OPT_NO_SYNC:
		x->req.flags |= CAP_EXEC_NO_SYNC;
		return 1;
	default:
		return 0;
	}
}

struct stream {
	struct cap_sandbox *sb;
	uint32_t id;
	bool done;
	struct cap_exit ex;
	bool rejected;
	char reject_msg[300];
	bool stdout_broken;
	int64_t syncing_ms;	/* when the guest said it is flushing; 0: not yet */
};

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct stream *r = ud;
	if (fd == 1 && r->stdout_broken)
		return;
	if (cap_write_all(fd, p, n) == -EPIPE && fd == 1) {
		/* The reader of our stdout went away (`| head`): tell the
		 * command the same way a pipe would. */
		r->stdout_broken = true;
		cap_sandbox_signal(r->sb, id, SIGPIPE);
	}
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex,
		    int errnum, const char *msg)
{
	struct stream *r = ud;
	(void)id;
	r->done = true;
	if (ex) {
		r->ex = *ex;
	} else {
		r->rejected = true;
		snprintf(r->reject_msg, sizeof(r->reject_msg), "%s (%s)", msg, strerror(errnum));
	}
}

static void on_syncing(void *ud, uint32_t id)
{
	struct stream *r = ud;
	(void)id;
	r->syncing_ms = cap_now_ms();
}

static const struct cap_exec_events events = { on_output, on_done, on_syncing };

/* Explain how the command ended, where the exit code alone would not. */
static void report(const struct stream *r, const struct cap_exec_req *req)
{
	if (r->ex.flags & CAP_EXIT_TRUNCATED)
		cap_cli_error("output truncated at %u bytes (the output cap; change it with --output-cap)",
			      req->output_cap);
	if (r->ex.flags & CAP_EXIT_TIMED_OUT)
		cap_cli_error("the command timed out after %u s (--timeout) and was killed with its process group",
			      req->timeout_ms / 1000);
	else if (r->ex.kind == CAP_EXIT_SIGNAL && r->ex.value != SIGPIPE && r->ex.value != SIGINT)
		cap_cli_error("the command was killed by signal %d (%s)", r->ex.value, strsignal(r->ex.value));
}

/* -v: how long the command ran and its flush took, and whether what it
 * wrote is on the host's disk (EXIT's CAP_EXIT_DURABLE). */
static void timing(const struct stream *r, const struct cap_cli_exec *x)
{
	const struct cap_exec_req *req = &x->req;
	if (x->ephemeral && !(r->ex.flags & CAP_EXIT_DURABLE))
		cap_cli_error("the command ran %u ms; no flush: nothing it wrote outlives this VM",
			      r->ex.duration_ms);
	else if (r->ex.flags & CAP_EXIT_DURABLE)
		cap_cli_error("the command ran %u ms; flush %u ms; durable: its writes are on the host's disk",
			      r->ex.duration_ms, r->ex.sync_ms);
	else if (req->flags & CAP_EXEC_NO_SYNC)
		cap_cli_error("the command ran %u ms; not flushed (--no-sync); not durable: writes not yet flushed are lost if the VM or the host dies",
			      r->ex.duration_ms);
	else
		cap_cli_error("the command ran %u ms; not durable: the guest did not flush its writes (an agent older than this capsule?)",
			      r->ex.duration_ms);
}

/* The terminal's mode before raw mode, restored on every way out. */
static struct termios saved_tty;
static bool tty_raw;

static void restore_tty(void)
{
	if (tty_raw) {
		tcsetattr(0, TCSAFLUSH, &saved_tty);
		tty_raw = false;
	}
}

static int make_raw(void)
{
	struct termios t;
	if (tcgetattr(0, &saved_tty) < 0)
		return -errno;
	t = saved_tty;
	cfmakeraw(&t);
	if (tcsetattr(0, TCSAFLUSH, &t) < 0)
		return -errno;
	tty_raw = true;
	static bool registered;
	if (!registered) {
		atexit(restore_tty);
		registered = true;
	}
	return 0;
}

int cap_cli_stream(struct cap_sandbox *sb, struct cap_cli_exec *x)
{
	struct cap_exec_req *req = &x->req;
	bool forward_stdin = x->interactive || x->pty || !isatty(0);
	if (forward_stdin)
		req->flags |= CAP_EXEC_STDIN;
	if (x->pty) {
		struct winsize ws;
		req->flags |= CAP_EXEC_PTY;
		if (ioctl(0, TIOCGWINSZ, &ws) == 0) {
			req->rows = ws.ws_row;
			req->cols = ws.ws_col;
		}
	}

	/* Signals arrive through a descriptor so that every path, Ctrl-C
	 * included, goes through the same teardown. */
	static const int handled[] = { SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGWINCH };
	sigset_t sigs;
	int sfd = cap_signalfd(handled, CAP_ARRAY_SIZE(handled), &sigs);

	struct stream r = { .sb = sb };
	struct cap_err err = { 0 };
	int status = CAP_EXIT_FAILURE;
	if (cap_sandbox_exec(sb, req, &events, &r, &r.id, &err) < 0) {
		cap_cli_error("%s", err.msg);
		goto out;
	}
	if (x->pty && isatty(0) && make_raw() < 0)
		cap_cli_error("warning: cannot put the terminal in raw mode: %s", strerror(errno));

	int interrupts = 0;
	int64_t give_up = 0;
	/* The host's own deadline: the guest is not trusted to end what it
	 * was told to end. */
	int64_t deadline = req->timeout_ms ? cap_now_ms() + req->timeout_ms + CAP_SANDBOX_EXEC_GRACE_MS : 0;
	bool stdin_open = forward_stdin;
	while (!r.done) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL + 2];
		cap_sandbox_pollfds(sb, pfd);
		int n = CAP_SANDBOX_NPOLL;
		pfd[n++] = (struct pollfd){ .fd = sfd, .events = POLLIN };
		int in_slot = -1;
		if (stdin_open && cap_sandbox_backlog(sb) < (1u << 20)) {
			in_slot = n;
			pfd[n++] = (struct pollfd){ .fd = 0, .events = POLLIN };
		}
		int64_t wake = give_up && (!deadline || give_up < deadline) ? give_up : deadline;
		int timeout = wake ? (int)CAP_MAX(wake - cap_now_ms(), 0) : -1;
		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) {
			cap_cli_error("poll: %s", strerror(errno));
			goto out;
		}
		if (pfd[CAP_SANDBOX_NPOLL].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGWINCH) {
					struct winsize ws;
					if (x->pty && ioctl(0, TIOCGWINSZ, &ws) == 0)
						cap_sandbox_resize(sb, r.id, ws.ws_row, ws.ws_col);
					continue;
				}
				if (++interrupts > 1) {
					cap_cli_error("interrupted again; stopping now");
					status = 128 + (int)si.ssi_signo;
					goto out;
				}
				cap_cli_error("%s: stopping the command (again to stop at once)",
					      strsignal((int)si.ssi_signo));
				cap_sandbox_signal(sb, r.id, (int)si.ssi_signo);
				give_up = cap_now_ms() + 3000;
			}
		}
		if (in_slot >= 0 && pfd[in_slot].revents) {
			char buf[65536];
			ssize_t k = read(0, buf, sizeof(buf));
			if (k > 0) {
				cap_sandbox_stdin(sb, r.id, buf, (size_t)k);
			} else if (k == 0 || errno != EINTR) {
				cap_sandbox_stdin(sb, r.id, NULL, 0);
				stdin_open = false;
			}
		}
		if (cap_sandbox_dispatch(sb, pfd, &err) < 0) {
			restore_tty();
			cap_cli_error("%s", err.msg);
			goto out;
		}
		/* The deadlines after what the guest sent is read: its end, or
		 * SYNCING, which gives the flush its own time. */
		if (r.done)
			break;
		if (r.syncing_ms) {
			if (deadline)
				deadline = CAP_MAX(deadline, r.syncing_ms + CAP_SANDBOX_SYNC_GRACE_MS);
			if (give_up)
				give_up = CAP_MAX(give_up, r.syncing_ms + CAP_SANDBOX_SYNC_GRACE_MS);
		}
		int64_t now = cap_now_ms();
		if (deadline && now >= deadline) {
			restore_tty();
			if (r.syncing_ms)
				cap_cli_error("the guest did not finish flushing the command's writes within %d s; giving up on this VM (its latest writes may be lost)",
					      CAP_SANDBOX_SYNC_GRACE_MS / 1000);
			else
				cap_cli_error("the command timed out after %u s (--timeout) and the guest did not end it within %d s more; giving up on this VM",
					      req->timeout_ms / 1000, CAP_SANDBOX_EXEC_GRACE_MS / 1000);
			x->gave_up = true;
			status = 124;
			goto out;
		}
		if (give_up && now >= give_up) {
			restore_tty();
			cap_cli_error(r.syncing_ms ? "the guest did not finish flushing the command's writes; giving up on it"
						   : "the command did not stop; giving up on it");
			status = 128 + SIGINT;
			goto out;
		}
	}
	restore_tty();
	if (r.rejected) {
		cap_cli_error("the guest refused the command: %s", r.reject_msg);
		goto out;
	}
	report(&r, req);
	if (x->verbose)
		timing(&r, x);
	status = cap_exit_status(&r.ex);
out:
	restore_tty();
	if (sfd >= 0)
		close(sfd);
	sigprocmask(SIG_UNBLOCK, &sigs, NULL);
	return status;
}
