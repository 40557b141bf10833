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
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "engine.h"
#include "log.h"
#include "named.h"
#include "netd.h"
#include "paths.h"
#include "sandbox-internal.h"
#include "sandbox.h"
#include "secret.h"
#include "sock.h"
#include "store.h"
#include "util.h"

/* Clients served at once; the next one is told "too many clients (N)".
 * Within it, the only bound is the shim's descriptors (RLIMIT_NOFILE,
 * raised to its hard limit at start). */
#define MAX_CLIENTS 4096
/* Flow control, both ways, so that a transfer of any size (capsule cp)
 * holds a few MiB here at most: clients that send stdin are not read
 * while more than AGENT_BACKLOG_MAX waits to go to the guest (the others
 * are: a PAUSE, RESUME or SHUTDOWN still gets through to a guest that is
 * paused or stuck), and the guest is not read
 * while a client has more than CONN_OUT_HIGH waiting to be read; a
 * client that stays over it for CONN_STALL_MS without reading is cut
 * loose (it would hold up every other client's output). */
#define AGENT_BACKLOG_MAX (1u << 20)
#define CONN_OUT_HIGH (4u << 20)
#define CONN_STALL_MS 30000
/* Free space on the host's file system of a disk that failed to write,
 * below which the VM is not restarted to recover it. */
#define RECOVER_FREE_MIB 16

struct conn {
	int fd;	/* -1: closed, freed at the end of the loop's round */
	struct cap_buf in, out;
	int64_t full_since;	/* when out went over CONN_OUT_HIGH, 0: it is not */
	bool feeds;	/* it has sent stdin: held back while the guest's queue is full */
};

struct shim;

struct route {
	struct shim *shim;
	struct conn *conn;	/* NULL once the client went away */
	uint32_t cid;	/* the client's stream id */
	uint32_t aid;	/* the agent's stream id, 0 while unused */
	uint64_t io_seen;	/* the shim's io_count when the stream opened */
	bool tell_io;	/* its stderr ends with the latest I/O error anyway */
	bool timed;	/* a command with a timeout: its caller keeps a deadline */
	bool used;
};

/* The latest disk I/O error QEMU passed to the guest. */
struct io_note {
	struct cap_vm_io_error e;
	time_t time;
	char what[768];	/* one sentence naming the disk and the cause */
};

struct shim {
	struct cap_sandbox *sb;
	const struct cap_sandbox_opts *opts;	/* what sb was booted with */
	bool paused;
	const char *dir;	/* sandbox directory, for runtime.json */
	const char *control;
	const struct cap_vm_disk *disks;	/* the VM's, by device index */
	unsigned ndisks;
	struct conn **conns;	/* owned, each and the array */
	size_t nconns, conns_cap;
	int spare_fd;	/* given up to refuse a client when out of descriptors */
	struct route routes[CAP_PROTO_MAX_STREAMS];
	bool stop;
	struct conn *stop_requester;
	uint64_t io_count;	/* disk I/O errors seen since start */
	struct io_note io;	/* the latest, when io_count > 0 */
	/* A write to a writable disk failed: the guest's file system on it
	 * may have aborted its journal and be read-only until remounted. */
	bool disk_failed;
	uint64_t io_logged;	/* io_count at the last line in shim.log */
	int64_t io_log_ms;	/* when that line was written */
	bool runtime_stale;	/* runtime.json lacks the latest (its disk was full) */
	int64_t runtime_try_ms;
	uint64_t refused;	/* clients refused since the last line about it */
	int64_t refused_log_ms;
	const char *name;
	struct cap_sandbox_spec *spec;	/* what sb was booted with (a restart reuses it) */
	/* The secrets sb's policy process holds (fixed from its start: a
	 * new policy changes what may be reached, not them), for runtime.json. */
	char *owned_secrets;
	int netd_fd;	/* pidfd of the policy process, -1: none or gone */
	bool netd_dead;
	struct cap_portfwd *pf;	/* a pod's NIC: PortForward, else NULL */
};

/* waitid on a pidfd (linux/wait.h; glibc 2.36 does not name it). */
#define IDTYPE_PIDFD ((idtype_t)3)

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
	if (r->conn && (r->shim->io_count != r->io_seen || r->tell_io)) {
		/* The command may have got ENOSPC or EIO from a disk of ours:
		 * its stderr says which and why, the last line it gets. */
		_cleanup_free_ char *line = xasprintf("capsule: %s\n", r->shim->io.what);
		cap_proto_put(&r->conn->out, CAP_MSG_STDERR, r->cid, line,
			      CAP_MIN(strlen(line), (size_t)CAP_PROTO_MAX_PAYLOAD));
	}
	if (r->conn) {
		if (ex)
			cap_proto_exit_encode(&r->conn->out, r->cid, ex);
		else
			cap_proto_error_encode(&r->conn->out, r->cid, errnum, msg);
	}
	memset(r, 0, sizeof(*r));
}

/* The guest is flushing what the command wrote: its caller's deadline
 * allows for it (CAP_SANDBOX_SYNC_GRACE_MS). */
static void on_syncing(void *ud, uint32_t id)
{
	struct route *r = ud;
	(void)id;
	if (r->conn)
		cap_proto_put(&r->conn->out, CAP_MSG_SYNCING, r->cid, NULL, 0);
}

static const struct cap_exec_events events = { on_output, on_done, on_syncing };

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

/* Free the closed connections (not during a round of the loop, which
 * may still name them). */
static void conns_sweep(struct shim *s)
{
	size_t k = 0;
	for (size_t i = 0; i < s->nconns; i++) {
		if (s->conns[i]->fd >= 0)
			s->conns[k++] = s->conns[i];
		else
			free(s->conns[i]);
	}
	s->nconns = k;
}

static int write_runtime(const struct shim *s, struct cap_err *err);

/* Freeze or continue the VM and record it; 0 or -errno with err. */
static int set_paused(struct shim *s, bool pause, struct cap_err *err)
{
	if (s->paused == pause)
		return 0;
	/* A command with a timeout has a caller keeping a deadline that a
	 * frozen guest would miss; one without (an OCI container's process)
	 * is paused with its VM, as runc pauses a container's processes. */
	for (size_t i = 0; pause && i < CAP_ARRAY_SIZE(s->routes); i++)
		if (s->routes[i].used && s->routes[i].aid && s->routes[i].timed)
			return cap_err_set(err, EBUSY, "commands with a timeout are running; a busy sandbox is not paused");
	int r = cap_sandbox_pause(s->sb, pause, err);
	if (r < 0)
		return r;
	s->paused = pause;
	write_runtime(s, NULL);
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

/* Save the VM into the staging directory a client named (under the
 * snapshots' folder): paused for the save and the disks' copies, then
 * going on as it was unless asked to stay paused. */
static void snapshot_op(struct shim *s, struct conn *c, const uint8_t *p, size_t n)
{
	struct cap_err err = { 0 };
	int r = 0;
	uint32_t flags = cap_get_u32(p);
	_cleanup_free_ char *dir = xstrndup((const char *)p + 4, n - 4);
	_cleanup_free_ char *root = cap_snapshot_root();
	size_t rl = strlen(root);
	if (strlen(dir) != n - 4 || strncmp(dir, root, rl) != 0 || strncmp(dir + rl, "/.tmp-", 6) != 0 ||
	    strstr(dir + rl, "/.."))
		r = cap_err_set(&err, EINVAL, "a snapshot goes into a staging directory under %s", root);
	else if (s->spec->has_pod)
		r = cap_err_set(&err, EOPNOTSUPP, "a pod's sandbox is not snapshotted");
	bool was_paused = s->paused;
	int64_t t0 = cap_now_ms();
	if (r == 0 && (r = cap_sandbox_snapshot(s->sb, s->spec, dir, &err)) == 0) {
		if (flags & CAP_SNAPSHOT_PAUSED) {
			s->paused = true;
		} else if (!was_paused) {
			struct cap_err rerr = { 0 };
			if (cap_sandbox_pause(s->sb, false, &rerr) < 0)
				cap_log(CAP_LOG_ERROR, "after the snapshot: %s", rerr.msg);
		}
		write_runtime(s, NULL);
		cap_log(CAP_LOG_INFO, "snapshot saved in %s (paused %lld ms)", dir, (long long)(cap_now_ms() - t0));
	} else if (!was_paused) {
		struct cap_err rerr = { 0 };
		cap_sandbox_pause(s->sb, false, &rerr);	/* a failed save stopped it too */
	}
	if (r < 0)
		cap_log(CAP_LOG_WARN, "snapshot into %s failed: %s", dir, err.msg);
	uint8_t buf[4 + 256];
	size_t mn = r < 0 ? CAP_MIN(strlen(err.msg), (size_t)256) : 0;
	cap_put_u32(buf, (uint32_t)(r < 0 ? -r : 0));
	memcpy(buf + 4, err.msg, mn);
	cap_proto_put(&c->out, CAP_MSG_SNAPSHOT, 0, buf, 4 + mn);
}

static void write_runtime_log(struct shim *s);

/* Whether policy p is the one recorded as line. */
static bool same_line(const struct cap_net_policy *p, const char *line)
{
	_cleanup_free_ char *mine = cap_net_policy_line(p);
	return strcmp(mine, line) == 0;
}

/* SIGUSR1 (cap_named_set_network): the record's network policy applies
 * to new connections now; runtime.json says which one is in force. A
 * policy without a NIC refuses everything until the next start takes the
 * NIC away. A VM restarted later (after disk errors) gets it too. */
static void reload_network(struct shim *s)
{
	struct cap_record rec;
	struct cap_err err = { 0 };
	struct cap_net_policy *p = xmalloc(sizeof(*p));
	struct cap_net_policy *in_vm = xmalloc(sizeof(*in_vm));
	if (cap_named_load(s->name, &rec, &err) < 0 || cap_record_net(&rec, p, &err) < 0) {
		cap_log(CAP_LOG_WARN, "network policy not changed: %s", err.msg);
	} else if (same_line(&s->spec->net, rec.net)) {
		write_runtime_log(s);
	} else {
		*in_vm = *p;
		if (!in_vm->enabled) {
			cap_net_policy_init(in_vm);
			in_vm->enabled = true;	/* nothing opened */
		}
		if (cap_sandbox_set_network(s->sb, in_vm, &err) < 0) {
			cap_log(CAP_LOG_WARN, "network policy not changed: %s", err.msg);
		} else {
			cap_sandbox_spec_network(s->spec, p);
			_cleanup_free_ char *d = cap_net_policy_describe(p);
			cap_log(CAP_LOG_INFO, "network policy now: %s%s", d,
				p->enabled ? "" : "; everything is refused until the next start removes the interface");
			write_runtime_log(s);
		}
	}
	free(in_vm);
	free(p);
}

/* Watch the VM's policy process (a child of ours, not reaped: its pid
 * is its own until it is reaped, by netd_died or the engine's stop). */
static void watch_netd(struct shim *s)
{
	if (s->netd_fd >= 0)
		close(s->netd_fd);
	s->netd_fd = -1;
	s->netd_dead = false;
	pid_t pid = s->sb ? cap_sandbox_net_pid(s->sb) : -1;
	if (pid > 0 && (s->netd_fd = (int)syscall(SYS_pidfd_open, pid, 0)) < 0)
		cap_log(CAP_LOG_WARN, "cannot watch the policy process (pid %d): %s; its death would go unnoticed here",
			(int)pid, strerror(errno));
}

/* The policy process is gone: nothing leaves the sandbox any more (there
 * is no other path), which the owner must be told. */
static void netd_died(struct shim *s)
{
	siginfo_t info;

	/* Reaped now, not at the VM's end: a zombie would stay for the
	 * sandbox's life. (The engine's stop then finds it gone, ECHILD.) */
	while (waitid(IDTYPE_PIDFD, (id_t)s->netd_fd, &info, WEXITED | WNOHANG) < 0 && errno == EINTR)
		;
	close(s->netd_fd);
	s->netd_fd = -1;
	s->netd_dead = true;
	cap_log(CAP_LOG_ERROR, "the sandbox's policy process (pid %d) died: its network connections fail until the sandbox restarts (`capsule stop %s`)",
		(int)cap_sandbox_net_pid(s->sb), s->name);
	write_runtime_log(s);
}

/* Whether a secret's value comes from this process's environment. */
static bool env_secrets(const struct cap_net_policy *p)
{
	for (unsigned i = 0; i < p->nsecrets; i++)
		if (!strncmp(p->secrets[i].source, "env:", 4))
			return true;
	return false;
}

/* After a failed write the guest's file system may be read-only (ext4
 * aborts its journal): before the next command of an idle sandbox, once
 * the host has space again, restart the VM with the same disks, which
 * mounts them afresh. false when it stays as it is (a command runs,
 * space is still short: that command is told). A VM that fails to boot
 * again ends the shim: the sandbox is stopped, and the next start tries
 * again. */
static bool recover_disks(struct shim *s)
{
	if (!s->disk_failed || cap_sandbox_running(s->sb) > 0)
		return false;
	const struct cap_vm_disk *d = &s->disks[CAP_MIN(s->io.e.disk, s->ndisks - 1)];
	struct statvfs sv;
	uint64_t free_mib = statvfs(d->path, &sv) == 0 ? (uint64_t)sv.f_bavail * sv.f_frsize >> 20 : 0;
	if (free_mib < RECOVER_FREE_MIB) {
		cap_log(CAP_LOG_WARN, "not restarting the VM after its I/O errors: the host's disk holding %s has %llu MiB free (%d needed)",
			d->path, (unsigned long long)free_mib, RECOVER_FREE_MIB);
		return false;
	}
	cap_log(CAP_LOG_INFO, "restarting the VM to remount its disks after I/O errors (%llu MiB free again on the host's disk holding %s)",
		(unsigned long long)free_mib, d->path);
	struct cap_err err = { 0 };
	if (cap_sandbox_shutdown(s->sb, 10000, &err) < 0)
		cap_log(CAP_LOG_WARN, "%s", err.msg);
	if (s->pf)
		cap_portfwd_reset(s->pf);
	cap_sandbox_free(s->sb);
	s->sb = NULL;
	s->disk_failed = false;
	watch_netd(s);
	if (cap_sandbox_boot(s->opts, &s->sb, &err) < 0) {
		cap_log(CAP_LOG_ERROR, "the VM did not start again: %s%s", err.msg,
			env_secrets(&s->spec->net) ? " (the shim wiped the values of env: secrets once the VM had them; "
						     "the next start reads them from the environment of its command)" : "");
		s->stop = true;
		return false;
	}
	free(s->owned_secrets);
	s->owned_secrets = cap_net_policy_secrets_line(&s->spec->net);
	cap_log(CAP_LOG_INFO, "running again (%s pid %d; %s)", cap_sandbox_engine(s->sb),
		(int)cap_sandbox_vmm_pid(s->sb), cap_sandbox_boot_note(s->sb));
	write_runtime_log(s);
	return true;
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
	if (s->disk_failed && !recover_disks(s) && !s->sb) {
		cap_proto_error_encode(&c->out, cid, EIO, "the sandbox's VM could not be restarted after I/O errors on its disks; see shim.log");
		return NULL;
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(s->routes); i++) {
		struct route *r = &s->routes[i];
		if (!r->used) {
			*r = (struct route){ .shim = s, .conn = c, .cid = cid, .io_seen = s->io_count,
					     .tell_io = s->disk_failed, .used = true };
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
	r->timed = req.timeout_ms != 0;
	if (cap_sandbox_exec(s->sb, &req, &events, r, &r->aid, &err) < 0)
		route_failed(c, r, &err);
	cap_exec_req_fini(&req);
}

static void client_file(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct cap_file_req req;
	struct cap_err err = { .code = EBADMSG, .msg = "malformed FILE request" };
	char root[32], path[4100];
	struct route *r = route_open(s, c, f->stream);
	if (!r)
		return;
	if (cap_proto_file_decode(f->payload, f->len, &req, root, sizeof(root), path, sizeof(path)) < 0) {
		route_failed(c, r, &err);
		return;
	}
	/* What the agent may send back: the file, or a listing (a line of at
	 * most ~600 bytes per entry); the streaming operations are bounded by
	 * the disk, not by a cap (docs/protocol.md). */
	uint64_t cap = CAP_MAX((uint64_t)req.limit, (uint64_t)req.limit_entries * 700) + 4096;
	if (req.op == CAP_FILE_MANIFEST || req.op == CAP_FILE_TAR_OUT || req.op == CAP_FILE_TAR_IN)
		cap = 0;
	if (cap_sandbox_file(s->sb, &req, (uint32_t)CAP_MIN(cap, (uint64_t)UINT32_MAX), &events, r, &r->aid, &err) < 0)
		route_failed(c, r, &err);
}

/* UPDATE and STATS of a pod's containers: checked, then relayed like a
 * FILE op (their answer is output and an end). */
static void client_ctl(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct cap_err err = { .code = EBADMSG };
	struct route *r = route_open(s, c, f->stream);
	if (!r)
		return;
	if (f->type == CAP_MSG_UPDATE) {
		struct cap_update u;
		if (cap_proto_update_decode(f->payload, f->len, &u) < 0) {
			snprintf(err.msg, sizeof(err.msg), "malformed UPDATE");
			route_failed(c, r, &err);
			return;
		}
		if (cap_sandbox_update(s->sb, &u, &events, r, &r->aid, &err) < 0)
			route_failed(c, r, &err);
		return;
	}
	char name[CAP_CTR_NAME_MAX + 1];
	if (cap_proto_stats_req_decode(f->payload, f->len, name, sizeof(name)) < 0) {
		snprintf(err.msg, sizeof(err.msg), "malformed STATS");
		route_failed(c, r, &err);
		return;
	}
	if (cap_sandbox_stats(s->sb, name, &events, r, &r->aid, &err) < 0)
		route_failed(c, r, &err);
}

/* Handle one frame from a client; false when the client broke the
 * protocol and must be dropped. */
static bool client_frame(struct shim *s, struct conn *c, const struct cap_frame *f)
{
	struct route *r;
	if (!s->sb)
		return false;	/* its VM did not start again: the shim ends */
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
	case CAP_MSG_UPDATE:
	case CAP_MSG_STATS:
		client_ctl(s, c, f);
		return true;
	case CAP_MSG_STDIN:
		if ((r = route_by_client(s, c, f->stream)))
			cap_sandbox_stdin(s->sb, r->aid, f->len ? f->payload : NULL, f->len);
		c->feeds = c->feeds || f->len > 0;
		return true;
	case CAP_MSG_SIGNAL:
		if (f->len != 4 && f->len != 8)
			return false;
		if ((r = route_by_client(s, c, f->stream)))
			cap_sandbox_signal_scope(s->sb, r->aid, (int)cap_get_u32(f->payload),
						 f->len == 8 ? (enum cap_signal_scope)cap_get_u32(f->payload + 4)
							     : CAP_SIGNAL_GROUP);
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
	case CAP_MSG_SNAPSHOT:
		if (f->stream != 0 || f->len < 5)
			return false;
		snapshot_op(s, c, f->payload, f->len);
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

/* Take the disk I/O errors QEMU reported: keep the latest for runtime.json
 * and for the stderr of the commands that were running, and say it in
 * shim.log (at once for a new episode, then at most every 5 s, counted). */
static void take_io_errors(struct shim *s)
{
	struct cap_vm_io_error e;
	int n = cap_sandbox_io_errors(s->sb, &e);
	if (n <= 0)
		return;
	const struct cap_vm_disk *d = e.disk < s->ndisks ? &s->disks[e.disk] : NULL;
	const char *serial = d ? d->serial : "unknown";
	const char *path = d ? d->path : "?";
	bool same = s->io_count > 0 && s->io.e.disk == e.disk && s->io.e.nospace == e.nospace;
	s->io_count += (uint64_t)n;
	s->io.e = e;
	s->io.time = time(NULL);
	if (e.nospace)
		snprintf(s->io.what, sizeof(s->io.what),
			 "I/O error on %s (disk %s): no space left on the host's disk holding %s; "
			 "the guest got ENOSPC/EIO. Free space there, then retry",
			 cap_sandbox_disk_role(serial), serial, path);
	else
		snprintf(s->io.what, sizeof(s->io.what), "I/O error on %s (disk %s): the host failed to %s %s: %s",
			 cap_sandbox_disk_role(serial), serial, e.write ? "write" : "read", path, e.reason);
	s->runtime_stale = true;
	if (e.write && d && !d->readonly)
		s->disk_failed = true;
	int64_t now = cap_now_ms();
	if (!same || now - s->io_log_ms >= 5000) {
		cap_log(CAP_LOG_WARN, "%s (%llu I/O error(s) since the last report)", s->io.what,
			(unsigned long long)(s->io_count - s->io_logged));
		s->io_logged = s->io_count;
		s->io_log_ms = now;
	}
}

/* runtime.json carries the latest I/O error: written when it happens, and
 * again (at most once a second) while that fails, as it does when the
 * full disk is the one holding the sandbox's directory. */
static void update_runtime(struct shim *s)
{
	int64_t now = cap_now_ms();
	if (!s->runtime_stale || now - s->runtime_try_ms < 1000)
		return;
	s->runtime_try_ms = now;
	if (write_runtime(s, NULL) == 0)
		s->runtime_stale = false;
}

/* Refuse a client, saying why in an ERROR on stream 0 (what
 * cap_sandbox_attach reports), and log it at most once a second. */
static void refuse(struct shim *s, int fd, int errnum, const char *why)
{
	struct cap_buf b;
	char msg[256];
	snprintf(msg, sizeof(msg), "too many clients (%zu): %s", s->nconns, why);
	cap_buf_init(&b);
	cap_proto_error_encode(&b, 0, errnum, msg);
	/* A new socket's buffer is empty: this small frame fits. */
	(void)send(fd, cap_buf_head(&b), cap_buf_used(&b), MSG_NOSIGNAL | MSG_DONTWAIT);
	cap_buf_fini(&b);
	close(fd);
	s->refused++;
	int64_t now = cap_now_ms();
	if (now - s->refused_log_ms >= 1000) {
		cap_log(CAP_LOG_WARN, "refused %llu client(s): %s", (unsigned long long)s->refused, msg);
		s->refused = 0;
		s->refused_log_ms = now;
	}
}

/* Take the pending connections: each becomes a client, or is refused with
 * the reason when the shim is at MAX_CLIENTS or out of descriptors. */
static void accept_clients(struct shim *s, int lfd)
{
	for (;;) {
		int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (cfd < 0) {
			if ((errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
				/* Out of descriptors, the pending client would wake
				 * poll for ever: take it with the spare one to say
				 * so, then hold a spare again. */
				int e = errno;
				close(s->spare_fd);
				s->spare_fd = -1;
				cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
				if (cfd >= 0) {
					char why[160];
					snprintf(why, sizeof(why), "the shim is out of file descriptors (%s); retry when some have finished",
						 strerror(e));
					refuse(s, cfd, e, why);
				}
				s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
			}
			return;
		}
		if (s->nconns >= MAX_CLIENTS) {
			char why[160];
			snprintf(why, sizeof(why), "a sandbox serves at most %d at once; retry when some have finished",
				 MAX_CLIENTS);
			refuse(s, cfd, EUSERS, why);
			continue;
		}
		if (s->nconns == s->conns_cap) {
			s->conns_cap = s->conns_cap ? 2 * s->conns_cap : 16;
			s->conns = xrealloc(s->conns, s->conns_cap * sizeof(*s->conns));
		}
		struct conn *c = xcalloc(1, sizeof(*c));
		c->fd = cfd;
		cap_buf_init(&c->in);
		cap_buf_init(&c->out);
		s->conns[s->nconns++] = c;
	}
}

static void serve(struct shim *s, int lfd, int sfd)
{
	enum { SIG = CAP_SANDBOX_NPOLL, LISTEN, EVENTS, NETD, FIXED };
	struct pollfd *pfd = NULL;
	struct conn **owner = NULL;
	size_t cap = 0;
	struct cap_err err = { 0 };

	while (!s->stop) {
		size_t npf = s->pf ? cap_portfwd_npoll(s->pf) : 0;
		if (cap < FIXED + s->nconns + npf) {
			cap = FIXED + s->nconns + npf + 16;
			pfd = xrealloc(pfd, cap * sizeof(*pfd));
			owner = xrealloc(owner, cap * sizeof(*owner));
		}
		cap_sandbox_pollfds(s->sb, pfd);
		bool clients_in = cap_sandbox_backlog(s->sb) <= AGENT_BACKLOG_MAX;
		bool full = false;
		for (size_t i = 0; i < s->nconns; i++)
			full |= s->conns[i]->full_since != 0;
		full |= s->pf && cap_portfwd_full(s->pf);
		if (full)
			pfd[0].events &= (short)~POLLIN;	/* the agent channel */
		pfd[SIG] = (struct pollfd){ .fd = sfd, .events = POLLIN };
		pfd[LISTEN] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		pfd[EVENTS] = (struct pollfd){ .fd = cap_sandbox_event_fd(s->sb), .events = POLLIN };
		pfd[NETD] = (struct pollfd){ .fd = s->netd_fd, .events = POLLIN };
		size_t n = FIXED;
		for (size_t i = 0; i < s->nconns; i++) {
			struct conn *c = s->conns[i];
			owner[n] = c;
			pfd[n++] = (struct pollfd){ .fd = c->fd, .events = (short)((clients_in || !c->feeds ? POLLIN : 0) |
									(cap_buf_used(&c->out) ? POLLOUT : 0)) };
		}
		size_t pf0 = n;
		if (s->pf) {
			cap_portfwd_pollfds(s->pf, pfd + n, clients_in);
			n += npf;
		}
		if (poll(pfd, (nfds_t)n, s->runtime_stale || full ? 1000 : -1) < 0 && errno != EINTR)
			break;
		/* Before the agent's news: QEMU reported an I/O error before
		 * the guest saw it, so a command's end finds it recorded. */
		take_io_errors(s);
		if (cap_sandbox_dispatch(s->sb, pfd, &err) < 0) {
			cap_log(CAP_LOG_ERROR, "%s", err.msg);
			break;
		}

		if (pfd[SIG].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				if (si.ssi_signo == SIGUSR1)
					reload_network(s);
				else
					s->stop = true;
			}
		}
		if (pfd[NETD].revents)
			netd_died(s);
		if (pfd[LISTEN].revents & POLLIN)
			accept_clients(s, lfd);
		if (s->pf) {
			const uint16_t *lports;
			uint32_t nlports;
			cap_portfwd_dispatch(s->pf, pfd + pf0);
			/* After its pollfds' round: the set of listeners may change. */
			if (cap_sandbox_take_listeners(s->sb, &lports, &nlports))
				cap_portfwd_listeners(s->pf, s->sb, lports, nlports);
		}
		for (size_t i = FIXED; i < pf0; i++) {
			struct conn *c = owner[i];
			if (c->fd < 0 || !pfd[i].revents)
				continue;
			if (pfd[i].revents & (POLLIN | POLLHUP | POLLERR))
				client_read(s, c);
		}
		if (!s->sb)
			break;
		/* Events that came in during a pause or resume of this round. */
		take_io_errors(s);
		for (size_t i = 0; i < s->nconns; i++) {
			struct conn *c = s->conns[i];
			if (c->fd < 0)
				continue;
			client_flush(s, c);
			if (c->fd < 0)
				continue;
			int64_t now = cap_now_ms();
			if (cap_buf_used(&c->out) <= CONN_OUT_HIGH)
				c->full_since = 0;
			else if (!c->full_since)
				c->full_since = now;
			else if (now - c->full_since > CONN_STALL_MS)
				conn_close(s, c);	/* not reading: cut it loose */
		}
		conns_sweep(s);
		update_runtime(s);
	}
	free(pfd);
	free(owner);
}

static void write_runtime_log(struct shim *s)
{
	struct cap_err err = { 0 };
	if (write_runtime(s, &err) < 0) {
		cap_log(CAP_LOG_WARN, "%s", err.msg);
		s->runtime_stale = true;
	}
}

static int write_runtime(const struct shim *s, struct cap_err *err)
{
	json_t *j = json_pack("{s:i, s:i, s:s, s:b}", "shim_pid", (int)getpid(),
			      "vmm_pid", s->sb ? (int)cap_sandbox_vmm_pid(s->sb) : -1, "control", s->control,
			      "paused", s->paused);
	const char *engine = s->sb ? cap_sandbox_engine(s->sb) : NULL;
	if (engine) {
		json_object_set_new(j, "engine", json_string(engine));
		/* The older name ("qemu_pid"), still read by scripts. */
		_cleanup_free_ char *alias = xasprintf("%s_pid", engine);
		json_object_set_new(j, alias, json_integer(cap_sandbox_vmm_pid(s->sb)));
	}
	pid_t netd = s->sb ? cap_sandbox_net_pid(s->sb) : -1;
	if (netd > 0 && !s->netd_dead) {
		json_object_set_new(j, "netd_pid", json_integer(netd));
		char *line = cap_net_policy_line(&s->spec->net);
		json_object_set_new(j, "network", json_string(line));
		free(line);
		json_object_set_new(j, "secrets", json_string(s->owned_secrets ? s->owned_secrets : ""));
	} else if (netd > 0) {
		json_object_set_new(j, "network_error", json_string("the policy process died: network connections fail until the sandbox restarts"));
	}
	if (s->io_count > 0) {
		const struct cap_vm_io_error *e = &s->io.e;
		const struct cap_vm_disk *d = e->disk < s->ndisks ? &s->disks[e->disk] : NULL;
		json_object_set_new(j, "io_error", json_pack("{s:s, s:s, s:s, s:s, s:b, s:s, s:s, s:I, s:I}",
			"disk", d ? cap_sandbox_disk_role(d->serial) : "unknown", "serial", d ? d->serial : "unknown",
			"path", d ? d->path : "", "operation", e->write ? "write" : "read",
			"nospace", e->nospace, "reason", e->reason, "message", s->io.what,
			"time", (json_int_t)s->io.time, "count", (json_int_t)s->io_count));
	}
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	_cleanup_free_ char *path = xasprintf("%s/runtime.json", s->dir);
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

/* As many clients as descriptors allow: the soft limit up to the hard. */
static void raise_nofile(void)
{
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
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
	_cleanup_free_ char *vmm_log = NULL;
	_cleanup_free_ char *upper = NULL, *work = NULL, *workspace = NULL;
	_cleanup_free_ char *upper_base = NULL, *work_base = NULL, *workspace_base = NULL;
	_cleanup_free_ char *source = xasprintf("%s/source.erofs", dir);
	_cleanup_free_ char *resume = NULL;
	_cleanup_free_ char *netlog_path = xasprintf("%s/net.log", dir);
	_cleanup_free_ char *counters_path = xasprintf("%s/net.counters", dir);
	_cleanup_free_ char *rundir = NULL, *control = NULL;
	_cleanup_free_ struct cap_sandbox_spec *spec = NULL;
	_cleanup_free_ struct cap_net_policy *net = NULL;
	int lock = -1, lfd = -1, sfd = -1, netlog = -1, counters = -1, r;
	bool owner = false;

	s.spare_fd = -1;
	s.netd_fd = -1;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		goto out;
	/* One made from a snapshot has overlays over the snapshot's disks. */
	upper = cap_named_disk_path(&rec, "root-upper.ext4", &upper_base);
	work = cap_named_disk_path(&rec, "private.ext4", &work_base);
	workspace = cap_named_disk_path(&rec, "workspace.ext4", &workspace_base);
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

	/* The spec is large: on the heap. */
	spec = xmalloc(sizeof(*spec));
	net = xmalloc(sizeof(*net));
	if ((r = cap_record_net(&rec, net, err)) < 0)
		goto out;
	struct cap_sandbox_opts o;
	cap_named_shape(&rec, img.owned_path, upper, work, source, rec.workspace[0] ? workspace : NULL,
			name, net, spec, &o);
	for (unsigned i = 0; i < spec->ndisks; i++) {
		struct cap_vm_disk *d = &spec->disks[i];
		d->backing = d->path == upper ? upper_base : d->path == work ? work_base
			   : d->path == workspace ? workspace_base : NULL;
	}
	/* Its first start goes on from the snapshot. */
	if (rec.resume) {
		resume = cap_snapshot_dir(rec.snapshot);
		o.resume_dir = resume;
	}
	s.spec = spec;
	/* A pod's NIC: what its namespace holds now (CNI made it before the
	 * sandbox container's create). */
	struct cap_pod_net pod;
	if (rec.pod_netns[0]) {
		if (net->enabled) {
			r = cap_err_set(err, EINVAL, "sandbox '%s' has both a pod's network and a network policy", name);
			goto out;
		}
		if ((r = cap_sandbox_pod_net_read(rec.pod_netns, &pod, err)) < 0)
			goto out;
		cap_sandbox_spec_pod(spec, rec.pod_netns, &pod);
	}
	if (net->enabled && (netlog = open(netlog_path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600)) < 0) {
		r = cap_err_set(err, errno, "cannot open %s: %s", netlog_path, strerror(errno));
		goto out;
	}
	/* The policy process's counters, from zero at each start (the
	 * controller adds them up across starts: cap_ctl_metrics). */
	if (net->enabled && ((counters = open(counters_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 ||
			     ftruncate(counters, sizeof(struct cap_netd_counters)) < 0)) {
		r = cap_err_set(err, errno, "cannot make %s: %s", counters_path, strerror(errno));
		goto out;
	}
	o.net_counters_fd = counters;
	/* Both logs next to the disks, kept after stop, wherever the
	 * sockets are. */
	o.console_log = console;
	/* The hypervisor's log, named after its engine: qemu.log. */
	const struct cap_engine_ops *engine;
	if ((r = cap_engine_get(NULL, &engine, err)) < 0)
		goto out;
	vmm_log = xasprintf("%s/%s.log", dir, cap_engine_name(engine));
	o.vmm_log = vmm_log;
	o.dir = sockdir;
	o.name = name;
	o.net_log_fd = netlog;
	/* The sandbox's CA lives with it (and goes with `capsule rm`). */
	o.ca_dir = dir;

	static const int stops[] = { SIGTERM, SIGINT, SIGHUP, SIGUSR1 };
	sigset_t sigs;
	sfd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);

	if ((r = cap_sandbox_boot(&o, &s.sb, err)) < 0)
		goto out;
	if (rec.resume) {
		/* Resumed once: from now on its disks are its own state. */
		struct cap_record cur;
		struct cap_err rerr = { 0 };
		o.resume_dir = NULL;
		if (cap_named_load(name, &cur, &rerr) < 0 || (cur.resume = false, cap_named_write_record(&cur, &rerr)) < 0)
			cap_log(CAP_LOG_WARN, "%s", rerr.msg);
	}
	s.owned_secrets = cap_net_policy_secrets_line(&spec->net);
	if ((lfd = cap_unix_listen(control, err)) < 0) {
		r = lfd;
		goto out;
	}
	s.dir = dir;
	s.control = control;
	s.opts = &o;
	s.name = name;
	watch_netd(&s);
	s.disks = spec->disks;
	s.ndisks = spec->ndisks;
	if (spec->has_pod)
		s.pf = cap_portfwd_new();
	raise_nofile();
	s.spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if ((r = write_runtime(&s, err)) < 0)
		goto out;
	cap_log(CAP_LOG_INFO, "running (%s pid %d, %s; %s)", cap_sandbox_engine(s.sb),
		(int)cap_sandbox_vmm_pid(s.sb), control, cap_sandbox_boot_note(s.sb));
	report_ready(&ready_fd, "ok\n");

	serve(&s, lfd, sfd);

	/* Stop: refuse new clients, stop the VM, then confirm to whoever
	 * asked once QEMU is gone. */
	close(lfd);
	lfd = -1;
	unlink(control);
	struct cap_err serr = { 0 };
	if (s.sb && s.paused)
		set_paused(&s, false, &serr);	/* the agent must run to sync */
	if (s.sb && cap_sandbox_shutdown(s.sb, 10000, &serr) < 0)
		cap_log(CAP_LOG_WARN, "%s", serr.msg);
	for (size_t i = 0; i < s.nconns; i++)
		if (s.conns[i]->fd >= 0)
			client_flush(&s, s.conns[i]);	/* answers of the last round */
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
	for (size_t i = 0; i < s.nconns; i++)
		if (s.conns[i]->fd >= 0)
			conn_close(&s, s.conns[i]);
	conns_sweep(&s);
	free(s.conns);
	cap_portfwd_free(s.pf);
	free(s.owned_secrets);
	if (s.spare_fd >= 0)
		close(s.spare_fd);
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
	if (netlog >= 0)
		close(netlog);
	if (counters >= 0)
		close(counters);
	if (s.netd_fd >= 0)
		close(s.netd_fd);
	cap_image_fini(&img);
	if (lock >= 0)
		close(lock);	/* releases the lock last */
	return r;
}
