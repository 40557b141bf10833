/* capsule-agent: PID 1 of every capsule guest. It mounts the pseudo file
 * systems, finds the virtio-serial port "capsule.agent" and serves the
 * host over it (docs/protocol.md): runs commands as UID 1000 (a
 * container's, CAP_EXEC_USER, as the uid, groups and rlimits it asks
 * for), each in its own session and cgroup with a wall-clock timeout, a
 * pids.max and an output cap, streams their output back, kills whatever
 * a command left behind when it ends, and on SHUTDOWN syncs and powers
 * the VM off.
 * With a NIC it configures the guest's network (agent-net.c) and may
 * report and relay TCP listeners (agent-publish.c); with secrets it
 * installs the sandbox's CA (agent-net.c) and gives every command the
 * placeholders' variables.
 *
 * One thread, one poll loop. The host is the only peer; a host that goes
 * away ends the commands it started.
 *
 * This file is that loop: the frames from the host, the output queued to
 * it, the pipes of the running commands, and main. The rest of the core:
 * agent-boot.c (PID 1's start and power-off), agent-cgroup.c,
 * agent-exec.c (commands and their environment), agent-setup.c (SETUP),
 * agent-file.c (FILE); agent-internal.h is what they share. */
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/signalfd.h>
#include <time.h>
#include <unistd.h>

#include "agent-internal.h"
#include "proto.h"
#include "util.h"

#define AGENT_VERSION "capsule-agent " CAPSULE_VERSION
#define READ_CHUNK (32 * 1024)
/* Stop reading command output while this much waits for the host. */
#define OUT_HIGH_WATER (1024 * 1024)

struct agent A = { .port = -1, .sigfd = -1, .upper_fd = -1, .cg_fd = -1, .cmd_uid = TOOL_UID, .cmd_gid = TOOL_GID };

/* --- output to the host --------------------------------------------- */

void send_error(uint32_t id, int errnum, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_proto_error_encode(&A.out, id, errnum, msg);
}

static void flush_out(void)
{
	while (A.connected && cap_buf_used(&A.out) > 0) {
		ssize_t n = write(A.port, cap_buf_head(&A.out), cap_buf_used(&A.out));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				agent_log("write to host: %s", strerror(errno));
			return;
		}
		cap_buf_consume(&A.out, (size_t)n);
	}
}

/* Blocking flush, used before power-off. */
void flush_out_wait(int timeout_ms)
{
	int64_t end = cap_now_ms() + timeout_ms;
	while (A.connected && cap_buf_used(&A.out) > 0 && cap_now_ms() < end) {
		struct pollfd p = { .fd = A.port, .events = POLLOUT };
		poll(&p, 1, 50);
		flush_out();
	}
}

/* --- the loop --------------------------------------------------------- */

static void handle_frame(const struct cap_frame *f)
{
	struct exec *x;

	switch (f->type) {
	case CAP_MSG_HELLO: {
		/* A host opening a session; what an earlier one started ends
		 * (a VM restored from a template may not have seen it go),
		 * unless this host resumes a snapshot: a fork continues the
		 * parent's commands, detached. */
		uint32_t flags = 0;
		cap_proto_hello_flags(f->payload, f->len, &flags);
		if (flags & CAP_HELLO_KEEP)
			detach_all_execs();
		else
			kill_all_execs();
		agent_connect_reset();
		agent_durable_forget();
		A.out.off = A.out.len = 0;
		cap_proto_hello_encode(&A.out, AGENT_VERSION);
		agent_publish_resend();
		return;
	}
	case CAP_MSG_EXEC:
		handle_exec(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_FILE:
		handle_file(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_UPDATE:
		handle_update(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_STATS:
		handle_stats(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_CONNECT:
		if (exec_find(f->stream))
			send_error(f->stream, EINVAL, "CONNECT on a stream in use");
		else
			agent_connect_open(f->stream, f->payload, f->len, &A.out);
		return;
	case CAP_MSG_STDIN:
		if (agent_connect_stdin(f->stream, f->payload, f->len))
			return;
		x = exec_find(f->stream);
		if (!x || x->in_fd < 0 || x->in_close)
			return;	/* stdin already closed or command gone: drop */
		if (f->len == 0)
			x->in_close = true;
		else
			cap_buf_append(&x->in_pending, f->payload, f->len);
		return;
	case CAP_MSG_SIGNAL:
		x = exec_find(f->stream);
		if (f->len != 4 && f->len != 8) {
			send_error(0, EBADMSG, "malformed SIGNAL");
			return;
		}
		uint32_t sig = cap_get_u32(f->payload);
		if (agent_connect_signal(f->stream, &A.out))
			return;
		uint32_t scope = f->len == 8 ? cap_get_u32(f->payload + 4) : CAP_SIGNAL_GROUP;
		if (scope > CAP_SIGNAL_ALL) {
			send_error(0, EINVAL, "SIGNAL for stream %u has unknown scope %u (0 group, 1 process, 2 all)",
				   f->stream, scope);
			return;
		}
		if (x && !x->exited && sig >= 1 && sig <= 64)
			exec_signal(x, (int)sig, scope);
		return;
	case CAP_MSG_RESIZE:
		x = exec_find(f->stream);
		if (f->len != 4) {
			send_error(0, EBADMSG, "malformed RESIZE");
			return;
		}
		if (x && x->pty && x->out_fd >= 0) {
			struct winsize ws = { .ws_row = cap_get_u16(f->payload),
					      .ws_col = cap_get_u16(f->payload + 2) };
			ioctl(x->out_fd, TIOCSWINSZ, &ws);
		}
		return;
	case CAP_MSG_SETUP:
		handle_setup(f->payload, f->len);
		return;
	case CAP_MSG_SHUTDOWN:
		do_shutdown();
		return;
	case CAP_MSG_CLOCK: {
		/* After a resume: the clock stood still while the VM was paused. */
		int64_t ns;
		if (f->stream != 0 || cap_proto_clock_decode(f->payload, f->len, &ns) < 0) {
			send_error(0, EBADMSG, "malformed CLOCK");
			return;
		}
		struct timespec ts = { .tv_sec = ns / 1000000000, .tv_nsec = ns % 1000000000 };
		if (clock_settime(CLOCK_REALTIME, &ts) < 0)
			agent_log("cannot set the clock: %s", strerror(errno));
		return;
	}
	default:
		send_error(0, EPROTO, "host sent %s, which only the agent sends",
			   cap_msg_name(f->type));
		return;
	}
}

static void read_port(void)
{
	for (;;) {
		uint8_t *p = cap_buf_reserve(&A.in, READ_CHUNK);
		ssize_t n = read(A.port, p, READ_CHUNK);
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				agent_log("read from host: %s", strerror(errno));
			break;
		}
		if (n == 0)
			break;
		cap_buf_commit(&A.in, (size_t)n);
	}
	for (;;) {
		struct cap_frame f;
		int r = cap_proto_parse(cap_buf_head(&A.in), cap_buf_used(&A.in), &f);
		if (r == 0)
			return;
		if (r < 0) {
			send_error(0, EPROTO, "malformed frame from host (%s); input discarded",
				   strerror(-r));
			A.in.off = A.in.len = 0;
			return;
		}
		handle_frame(&f);
		cap_buf_consume(&A.in, (size_t)r);
	}
}

static void pump_output(struct exec *x, int *fd, enum cap_msg type)
{
	uint8_t buf[READ_CHUNK];
	ssize_t n = read(*fd, buf, sizeof(buf));
	if (n > 0)
		send_output(x, type, buf, (size_t)n);
	else if (n == 0 || (errno != EAGAIN && errno != EINTR))
		close_fd(fd);
}

static void pump_stdin(struct exec *x)
{
	while (cap_buf_used(&x->in_pending) > 0) {
		ssize_t n = write(x->in_fd, cap_buf_head(&x->in_pending),
				  cap_buf_used(&x->in_pending));
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			/* The command closed its stdin: drop the rest. */
			cap_buf_fini(&x->in_pending);
			close_fd(&x->in_fd);
			return;
		}
		cap_buf_consume(&x->in_pending, (size_t)n);
	}
	if (x->in_close)
		close_fd(&x->in_fd);
}

/* The host went away: end what it started and drop what it would read. */
static void host_gone(void)
{
	if (A.connected)
		agent_log("host disconnected; its commands go on, detached, until a host says HELLO");
	A.connected = false;
	/* A restored VM sees its channel close and open again: what ran
	 * in a snapshot must still be there for a fork's host (HELLO with
	 * CAP_HELLO_KEEP); any other host's HELLO ends it. */
	detach_all_execs();
	agent_connect_reset();
	agent_durable_forget();
	A.in.off = A.in.len = 0;
	A.out.off = A.out.len = 0;
}

static void serve(void)
{
	enum { MAXFD = 3 + 4 * CAP_PROTO_MAX_STREAMS };
	struct pollfd pfd[MAXFD];
	struct {
		struct exec *x;
		int which;
	} owner[MAXFD];

	for (;;) {
		int64_t now = cap_now_ms();
		int timeout = -1;
		int n = 0;

		pfd[n++] = (struct pollfd){ .fd = A.sigfd, .events = POLLIN };
		/* A guest server slower than the host's sender: the host waits
		 * (its frames stay in the channel) rather than the agent
		 * buffering without bound. */
		short pe = agent_connect_busy() ? 0 : POLLIN;
		if (cap_buf_used(&A.out) > 0)
			pe |= POLLOUT;
		pfd[n++] = (struct pollfd){ .fd = A.port, .events = pe };
		pfd[n++] = (struct pollfd){ .fd = agent_durable_fd(), .events = POLLIN };
		bool backlog = cap_buf_used(&A.out) > OUT_HIGH_WATER;

		for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++) {
			struct exec *x = &A.execs[i];
			if (!x->id)
				continue;
			if (x->deadline_ms && !x->exited) {
				if (now >= x->deadline_ms) {
					x->timed_out = true;
					x->deadline_ms = 0;
					exec_kill(x);
				} else {
					int64_t left = x->deadline_ms - now;
					if (timeout < 0 || left < timeout)
						timeout = (int)left;
				}
			}
			if (x->exited) {
				int64_t left = x->drain_ms + DRAIN_GRACE_MS - now;
				left = left < 0 ? 0 : left;
				if (x->cg[0])
					left = 10;	/* check again whether its cgroup emptied */
				if (timeout < 0 || left < timeout)
					timeout = (int)left;
			}
			int fds[3] = { x->out_fd, x->err_fd, x->in_fd };
			for (int k = 0; k < 3; k++) {
				if (fds[k] < 0)
					continue;
				short ev = k < 2 ? (backlog ? 0 : POLLIN)
						 : (cap_buf_used(&x->in_pending) || x->in_close ? POLLOUT : 0);
				if (!ev)
					continue;
				owner[n].x = x;
				owner[n].which = k;
				pfd[n++] = (struct pollfd){ .fd = fds[k], .events = ev };
			}
		}
		int conn0 = n;
		uint32_t conn_ids[MAXFD];
		n += agent_connect_poll(pfd + n, conn_ids, MAXFD - n, backlog);
		int nconn = n - conn0;
		/* While the host is not connected the port reports POLLHUP at
		 * once; poll it gently until the host arrives. */
		if (!A.connected && (timeout < 0 || timeout > 50))
			timeout = 50;
		if (A.cg_npending && (timeout < 0 || timeout > CG_REKILL_MS))
			timeout = CG_REKILL_MS;
		int pt = agent_publish_timeout(now);
		if (pt >= 0 && (timeout < 0 || pt < timeout))
			timeout = pt;

		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) {
			agent_log("poll: %s", strerror(errno));
			continue;
		}

		if (pfd[0].revents)
			reap();

		bool hup = pfd[1].revents & POLLHUP;
		if (hup && A.connected)
			host_gone();
		if (!hup && !A.connected)
			A.connected = true;	/* the host speaks first: HELLO */
		if (A.connected && (pfd[1].revents & POLLIN))
			read_port();

		if (pfd[2].revents)
			agent_durable_ready(&A.out);

		for (int i = 3; i < conn0; i++) {
			if (!pfd[i].revents)
				continue;
			struct exec *x = owner[i].x;
			if (!x->id)
				continue;
			if (owner[i].which == 0)
				pump_output(x, &x->out_fd, CAP_MSG_STDOUT);
			else if (owner[i].which == 1)
				pump_output(x, &x->err_fd, CAP_MSG_STDERR);
			else
				pump_stdin(x);
		}
		if (A.connected)
			agent_connect_events(pfd + conn0, conn_ids, nconn, &A.out);

		now = cap_now_ms();
		for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
			if (A.execs[i].id)
				finish_if_done(&A.execs[i], now, !backlog);
		if (A.cg_npending)
			cg_sweep(now);
		agent_publish_tick(now, &A.out);
		if (!A.connected) {
			A.out.off = A.out.len = 0;
			continue;
		}
		flush_out();
	}
}

int main(void)
{
	if (getpid() != 1) {
		fprintf(stderr, "capsule-agent: must run as PID 1 inside a capsule VM\n");
		return 1;
	}
	setup_system();
	if (cmdline_has("capsule.poweroff"))
		power_off();	/* raw boot benchmark: init reached, stop */
	setup_cgroups();
	setup_priority();
	agent_net_boot();
	agent_env_reset();

	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		A.execs[i].out_fd = A.execs[i].err_fd = A.execs[i].in_fd = -1;
	cap_buf_init(&A.in);
	cap_buf_init(&A.out);

	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	A.sigfd = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);

	A.port = open_port();
	if (A.port < 0) {
		agent_log("no virtio-serial port named capsule.agent: %s; powering off",
		          strerror(-A.port));
		power_off();
	}
	agent_log("ready (%s, protocol v%d)", AGENT_VERSION, CAP_PROTO_VERSION);
	serve();
	return 0;
}
