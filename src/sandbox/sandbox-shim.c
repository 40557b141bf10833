/* The shim: one process per running named sandbox. It owns QEMU and the
 * agent channel and serves the control socket, where clients speak the
 * same framed protocol as the agent does (docs/protocol.md): the shim
 * says HELLO, maps each client's stream ids onto the agent's, and relays.
 * A client that disconnects has its commands killed. SHUTDOWN (or
 * SIGTERM) stops the VM cleanly and ends the shim. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "log.h"
#include "named.h"
#include "paths.h"
#include "sandbox.h"
#include "sock.h"
#include "store.h"
#include "util.h"

#define MAX_CONNS 32
#define CONN_OUT_LIMIT (16u << 20)

struct conn {
	int fd;	/* -1: free */
	struct cap_buf in, out;
};

struct route {
	struct conn *conn;	/* NULL once the client went away */
	uint32_t cid;	/* the client's stream id */
	uint32_t aid;	/* the agent's stream id, 0 while unused */
	bool used;
};

struct shim {
	struct cap_sandbox *sb;
	bool paused;
	const char *dir;	/* sandbox directory, for runtime.json */
	const char *control;
	struct conn conns[MAX_CONNS];
	struct route routes[CAP_PROTO_MAX_STREAMS];
	bool stop;
	struct conn *stop_requester;
};

static struct route *route_by_client(struct shim *s, struct conn *c, uint32_t cid)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(s->routes); i++)
		if (s->routes[i].used && s->routes[i].conn == c && s->routes[i].cid == cid)
			return &s->routes[i];
	return NULL;
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct route *r = ud;
	(void)id;
	if (!r->conn)
		return;
	cap_proto_put(&r->conn->out, fd == 1 ? CAP_MSG_STDOUT : CAP_MSG_STDERR, r->cid, p, n);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum,
		    const char *msg)
{
	struct route *r = ud;
	(void)id;
	if (r->conn) {
		if (ex)
			cap_proto_exit_encode(&r->conn->out, r->cid, ex);
		else
			cap_proto_error_encode(&r->conn->out, r->cid, errnum, msg);
	}
	memset(r, 0, sizeof(*r));
}

static const struct cap_exec_events events = { on_output, on_done };

static void conn_close(struct shim *s, struct conn *c)
{
	/* Commands of a client that went away are cancelled. */
	for (size_t i = 0; i < CAP_ARRAY_SIZE(s->routes); i++) {
		struct route *r = &s->routes[i];
		if (r->used && r->conn == c) {
			r->conn = NULL;
			cap_sandbox_signal(s->sb, r->aid, SIGKILL);
		}
	}
	if (s->stop_requester == c)
		s->stop_requester = NULL;
	close(c->fd);
	cap_buf_fini(&c->in);
	cap_buf_fini(&c->out);
	c->fd = -1;
}

static int write_runtime(const char *dir, const char *control, pid_t qemu,
			 bool paused, struct cap_err *err);

/* Freeze or continue the VM and record it; 0 or -errno with err. */
static int set_paused(struct shim *s, bool pause, struct cap_err *err)
{
	if (s->paused == pause)
		return 0;
	if (pause && cap_sandbox_running(s->sb) > 0)
		return cap_err_set(err, EBUSY, "commands are running; a busy sandbox is not paused");
	int r = cap_sandbox_pause(s->sb, pause, err);
	if (r < 0)
		return r;
	s->paused = pause;
	write_runtime(s->dir, s->control, cap_sandbox_vmm_pid(s->sb), pause, NULL);
	return 0;
}

static void vm_op(struct shim *s, struct conn *c, enum cap_msg op)
{
	struct cap_err err = { 0 };
	int r = set_paused(s, op == CAP_MSG_PAUSE, &err);
	uint8_t buf[4 + 256];
	size_t mn = r < 0 ? CAP_MIN(strlen(err.msg), (size_t)256) : 0;
	cap_put_u32(buf, (uint32_t)(r < 0 ? -r : 0));
	memcpy(buf + 4, err.msg, mn);
	cap_proto_put(&c->out, op, 0, buf, 4 + mn);
}

/* Check a client's new stream id, wake a paused VM and take a route for
 * the stream; NULL, with the error already sent to the client, when any
 * of that fails. */
static struct route *route_open(struct shim *s, struct conn *c, uint32_t cid)
{
	struct cap_err err = { 0 };
	if (cid == 0 || route_by_client(s, c, cid)) {
		cap_proto_error_encode(&c->out, cid, EINVAL, "stream id is zero or already in use");
		return NULL;
	}
	/* Work for a paused VM wakes it. */
	if (s->paused && set_paused(s, false, &err) < 0) {
		cap_proto_error_encode(&c->out, cid, err.code ? err.code : EIO, err.msg);
		return NULL;
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(s->routes); i++) {
		struct route *r = &s->routes[i];
		if (!r->used) {
			*r = (struct route){ .conn = c, .cid = cid, .used = true };
			return r;
		}
	}
	cap_proto_error_encode(&c->out, cid, EBUSY, "too many commands running in this sandbox");
	return NULL;
}

/* The agent refused or could not take the stream: release the route. */
static void route_failed(struct conn *c, struct route *r, const struct cap_err *err)
{
	cap_proto_error_encode(&c->out, r->cid, err->code ? err->code : EIO, err->msg);
	memset(r, 0, sizeof(*r));
}

static void client_exec(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct cap_exec_req req;
	struct cap_err err = { 0 };
	struct route *r = route_open(s, c, f->stream);
	if (!r)
		return;
	if (cap_proto_exec_decode(f->payload, f->len, &req, &err) < 0) {
		err.code = EBADMSG;
		route_failed(c, r, &err);
		return;
	}
	if (cap_sandbox_exec(s->sb, &req, &events, r, &r->aid, &err) < 0)
		route_failed(c, r, &err);
	cap_exec_req_fini(&req);
}

static void client_file(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct cap_file_req req;
	struct cap_err err = { .code = EBADMSG, .msg = "malformed FILE request" };
	char root[16], path[4100];
	struct route *r = route_open(s, c, f->stream);
	if (!r)
		return;
	if (cap_proto_file_decode(f->payload, f->len, &req, root, sizeof(root), path, sizeof(path)) < 0) {
		route_failed(c, r, &err);
		return;
	}
	/* What the agent may send back: the file, or a listing (a line of at
	 * most ~600 bytes per entry). */
	uint64_t cap = CAP_MAX((uint64_t)req.limit, (uint64_t)req.limit_entries * 700) + 4096;
	if (cap_sandbox_file(s->sb, &req, (uint32_t)CAP_MIN(cap, (uint64_t)UINT32_MAX), &events, r, &r->aid, &err) < 0)
		route_failed(c, r, &err);
}

/* Handle one frame from a client; false when the client broke the
 * protocol and must be dropped. */
static bool client_frame(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct route *r;
	switch (f->type) {
	case CAP_MSG_HELLO:
		cap_proto_hello_encode(&c->out, cap_sandbox_agent_version(s->sb));
		return true;
	case CAP_MSG_EXEC:
		client_exec(s, c, f);
		return true;
	case CAP_MSG_FILE:
		client_file(s, c, f);
		return true;
	case CAP_MSG_STDIN:
		if ((r = route_by_client(s, c, f->stream)))
			cap_sandbox_stdin(s->sb, r->aid, f->len ? f->payload : NULL, f->len);
		return true;
	case CAP_MSG_SIGNAL:
		if (f->len != 4)
			return false;
		if ((r = route_by_client(s, c, f->stream)))
			cap_sandbox_signal(s->sb, r->aid, (int)cap_get_u32(f->payload));
		return true;
	case CAP_MSG_RESIZE:
		if (f->len != 4)
			return false;
		if ((r = route_by_client(s, c, f->stream)))
			cap_sandbox_resize(s->sb, r->aid, cap_get_u16(f->payload), cap_get_u16(f->payload + 2));
		return true;
	case CAP_MSG_PAUSE:
	case CAP_MSG_RESUME:
		if (f->stream != 0 || f->len != 0)
			return false;
		vm_op(s, c, (enum cap_msg)f->type);
		return true;
	case CAP_MSG_SHUTDOWN:
		s->stop = true;
		s->stop_requester = c;
		return true;
	default:
		cap_proto_error_encode(&c->out, 0, EPROTO, "unexpected message on the control socket");
		return false;
	}
}

static void client_read(struct shim *s, struct conn *c)
{
	uint8_t *p = cap_buf_reserve(&c->in, 65536);
	ssize_t n = read(c->fd, p, 65536);
	if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
		conn_close(s, c);
		return;
	}
	if (n < 0)
		return;
	cap_buf_commit(&c->in, (size_t)n);
	for (;;) {
		struct cap_frame f;
		int k = cap_proto_parse(cap_buf_head(&c->in), cap_buf_used(&c->in), &f);
		if (k == 0)
			return;
		if (k < 0 || !client_frame(s, c, &f)) {
			conn_close(s, c);
			return;
		}
		cap_buf_consume(&c->in, (size_t)k);
	}
}

static void client_flush(struct shim *s, struct conn *c)
{
	while (cap_buf_used(&c->out) > 0) {
		ssize_t n = send(c->fd, cap_buf_head(&c->out), cap_buf_used(&c->out), MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno != EAGAIN)
				conn_close(s, c);
			return;
		}
		cap_buf_consume(&c->out, (size_t)n);
	}
}

static void report_ready(int *fd, const char *msg)
{
	if (*fd < 0)
		return;
	cap_write_all(*fd, msg, strlen(msg));
	close(*fd);
	*fd = -1;
}

static void serve(struct shim *s, int lfd, int sfd)
{
	enum { FIXED = CAP_SANDBOX_NPOLL + 2 };
	struct pollfd pfd[FIXED + MAX_CONNS];
	struct conn *owner[FIXED + MAX_CONNS];
	struct cap_err err = { 0 };

	while (!s->stop) {
		cap_sandbox_pollfds(s->sb, pfd);
		int n = CAP_SANDBOX_NPOLL;
		pfd[n++] = (struct pollfd){ .fd = sfd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &s->conns[i];
			if (c->fd < 0)
				continue;
			owner[n] = c;
			pfd[n++] = (struct pollfd){ .fd = c->fd, .events = (short)(POLLIN | (cap_buf_used(&c->out) ? POLLOUT : 0)) };
		}
		if (poll(pfd, (nfds_t)n, -1) < 0 && errno != EINTR)
			break;
		if (cap_sandbox_dispatch(s->sb, pfd, &err) < 0) {
			cap_log(CAP_LOG_ERROR, "%s", err.msg);
			return;
		}
		if (pfd[CAP_SANDBOX_NPOLL].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si))
				s->stop = true;
		}
		if (pfd[CAP_SANDBOX_NPOLL + 1].revents & POLLIN) {
			int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
			struct conn *c = NULL;
			for (int i = 0; cfd >= 0 && i < MAX_CONNS && !c; i++)
				if (s->conns[i].fd < 0)
					c = &s->conns[i];
			if (c) {
				c->fd = cfd;
				cap_buf_init(&c->in);
				cap_buf_init(&c->out);
			} else if (cfd >= 0) {
				close(cfd);	/* full: the client sees EOF */
			}
		}
		for (int i = FIXED; i < n; i++) {
			struct conn *c = owner[i];
			if (c->fd < 0 || !pfd[i].revents)
				continue;
			if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
				client_read(s, c);
		}
		for (int i = 0; i < MAX_CONNS; i++) {
			struct conn *c = &s->conns[i];
			if (c->fd < 0)
				continue;
			client_flush(s, c);
			if (c->fd >= 0 && cap_buf_used(&c->out) > CONN_OUT_LIMIT)
				conn_close(s, c);	/* not reading: cut it loose */
		}
	}
}

static int write_runtime(const char *dir, const char *control, pid_t qemu,
			 bool paused, struct cap_err *err)
{
	json_t *j = json_pack("{s:i, s:i, s:s, s:b}", "shim_pid", (int)getpid(),
			      "qemu_pid", (int)qemu, "control", control, "paused", paused);
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	_cleanup_free_ char *path = xasprintf("%s/runtime.json", dir);
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

int cap_named_shim(const char *name, int ready_fd, struct cap_err *err)
{
	struct cap_record rec;
	struct cap_image img = { 0 };
	struct shim s = { 0 };
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *lockp = xasprintf("%s/shim.lock", dir);
	_cleanup_free_ char *runtime = xasprintf("%s/runtime.json", dir);
	_cleanup_free_ char *console = xasprintf("%s/console.log", dir);
	_cleanup_free_ char *qemu_log = xasprintf("%s/qemu.log", dir);
	_cleanup_free_ char *upper = xasprintf("%s/root-upper.ext4", dir);
	_cleanup_free_ char *work = xasprintf("%s/private.ext4", dir);
	_cleanup_free_ char *source = xasprintf("%s/source.erofs", dir);
	_cleanup_free_ char *rundir = NULL, *control = NULL;
	int lock = -1, lfd = -1, sfd = -1, r;
	bool owner = false;

	for (int i = 0; i < MAX_CONNS; i++)
		s.conns[i].fd = -1;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		goto out;
	lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	/* cap_named_reap holds the lock for a moment while it cleans up
	 * after a dead shim: retry briefly before giving up. */
	bool locked = false;
	for (int i = 0; lock >= 0 && i < 50; i++) {
		if ((locked = flock(lock, LOCK_EX | LOCK_NB) == 0))
			break;
		usleep(2000);
	}
	if (!locked) {
		/* Another start won the race; its caller and ours both wait
		 * for that shim. */
		report_ready(&ready_fd, "busy\n");
		r = 0;
		goto out;
	}
	owner = true;
	if ((r = cap_store_image_find(rec.image, &img, err)) < 0 ||
	    (r = cap_store_image_verify(&img, err)) < 0)
		goto out;

	/* Sockets next to the disks when the path fits sun_path, else in a
	 * private short directory (docs/architecture.md, "Storage"). */
	const char *sockdir = dir;
	if (strlen(dir) + sizeof("/control.sock") > 100) {
		if ((r = cap_make_run_dir(&rundir, err)) < 0)
			goto out;
		sockdir = rundir;
	}
	control = xasprintf("%s/control.sock", sockdir);

	struct cap_vm_disk disks[] = {
		{ img.owned_path, "capsule-root", true, false },
		{ upper, "capsule-upper", false, true },
		{ work, "capsule-work", false, true },
		{ source, "capsule-source", true, true },
	};
	char host[21];
	snprintf(host, sizeof(host), "%s", name);
	struct cap_setup setup = {
		.root_image = "capsule-root", .root_upper = "capsule-upper",
		.work = "capsule-work", .source = "capsule-source",
		.hostname = cap_proto_valid_name(host) ? host : "capsule",
	};
	struct cap_sandbox_opts o;
	cap_sandbox_opts_init(&o);
	o.cpus = rec.cpus;
	o.memory_mib = rec.memory_mib;
	/* Both logs next to the disks, kept after stop, wherever the
	 * sockets are. */
	o.console_log = console;
	o.qemu_log = qemu_log;
	o.dir = sockdir;
	o.disks = disks;
	o.ndisks = CAP_ARRAY_SIZE(disks);
	o.setup = &setup;

	static const int stops[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t sigs;
	sfd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);

	if ((r = cap_sandbox_boot(&o, &s.sb, err)) < 0)
		goto out;
	if ((lfd = cap_unix_listen(control, err)) < 0) {
		r = lfd;
		goto out;
	}
	s.dir = dir;
	s.control = control;
	if ((r = write_runtime(dir, control, cap_sandbox_vmm_pid(s.sb), false, err)) < 0)
		goto out;
	cap_log(CAP_LOG_INFO, "running (QEMU pid %d, %s; %s)", (int)cap_sandbox_vmm_pid(s.sb),
		control, cap_sandbox_boot_note(s.sb));
	report_ready(&ready_fd, "ok\n");

	serve(&s, lfd, sfd);

	/* Stop: refuse new clients, stop the VM, then confirm to whoever
	 * asked once QEMU is gone. */
	close(lfd);
	lfd = -1;
	unlink(control);
	struct cap_err serr = { 0 };
	if (s.paused)
		set_paused(&s, false, &serr);	/* the agent must run to sync */
	if (cap_sandbox_shutdown(s.sb, 10000, &serr) < 0)
		cap_log(CAP_LOG_WARN, "%s", serr.msg);
	if (s.stop_requester && s.stop_requester->fd >= 0) {
		cap_proto_put(&s.stop_requester->out, CAP_MSG_SHUTDOWN, 0, NULL, 0);
		cap_set_nonblock(s.stop_requester->fd, 0);
		client_flush(&s, s.stop_requester);
	}
	cap_log(CAP_LOG_INFO, "stopped");
	r = 0;
out:
	if (r < 0) {
		char msg[sizeof(err->msg) + 2];
		snprintf(msg, sizeof(msg), "%s\n", err->msg);
		report_ready(&ready_fd, msg);
	}
	for (int i = 0; i < MAX_CONNS; i++)
		if (s.conns[i].fd >= 0)
			conn_close(&s, &s.conns[i]);
	cap_sandbox_free(s.sb);
	if (lfd >= 0) {
		close(lfd);
		unlink(control);
	}
	if (sfd >= 0)
		close(sfd);
	if (owner)	/* only the lock holder's files are ours to remove */
		unlink(runtime);
	if (rundir)
		cap_remove_run_dir(rundir);
	cap_image_fini(&img);
	if (lock >= 0)
		close(lock);	/* releases the lock last */
	return r;
}
