/* Durable results: the end of a command, a FILE WRITE or a TAR_IN is
 * reported only once what was written to the writable disks (/work,
 * /workspace, the root's upper disk) is on the host's disk files.
 *
 * Whether anything changed is known from fanotify: one group with FID
 * reporting marks each writable ext4 file system for writes, closes
 * after writing, attribute changes and directory entries (create,
 * delete, move); a second, plain group marks the overlay root (whose
 * writes reach the upper disk through files fanotify does not see) and
 * the disks' device nodes (a root process writing a disk directly) for
 * writes and closes after writing. Every process of a command is gone
 * before its end is reported, so every change it made has queued its
 * event by then. No event since the last flush began: nothing to flush,
 * and the end goes out at once.
 *
 * Otherwise the stream gets SYNCING (its host allows the flush its own
 * time), a worker thread runs syncfs on each disk (ext4 commits its
 * journal and sends the device a flush; virtio-blk makes that QEMU's
 * fdatasync of the disk file), and the end goes out with
 * CAP_EXIT_DURABLE once a flush that began after it was asked for has
 * finished. Ends that arrive during a flush share the next one (a group
 * commit). The loop never blocks on a flush: other commands' output,
 * signals and stdin go on meanwhile. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/fanotify.h>
#include <sys/stat.h>
#include <unistd.h>

#include "agent.h"
#include "util.h"

#define DURABLE_MAX_FS 3
#define DURABLE_MAX_WAIT CAP_PROTO_MAX_STREAMS

struct waiter {
	uint32_t id;
	struct cap_exit ex;
	uint64_t need;	/* the flush that must have finished */
	int64_t since_ms;
};

struct flush_req {
	int fds[DURABLE_MAX_FS];
	size_t n;
};

struct flush_done {
	uint32_t failed;	/* bit i: syncfs of fds[i] failed */
	int err[DURABLE_MAX_FS];
};

static struct {
	int fan_fid, fan_plain;	/* the two fanotify groups, -1: none */
	bool blind;	/* a mark could not be placed: every end flushes */
	struct {
		int fd;	/* O_RDONLY directory of the mount, for syncfs */
		char where[32];
	} fs[DURABLE_MAX_FS];
	size_t nfs;
	int req[2], done[2];	/* to and from the flusher; -1 until it starts */
	bool running;
	bool changed;	/* a change seen since the last flush began */
	uint64_t started, finished;	/* flush sequence numbers */
	struct waiter wait[DURABLE_MAX_WAIT];
	size_t nwait;
} D = { .fan_fid = -1, .fan_plain = -1, .req = { -1, -1 }, .done = { -1, -1 } };

static int fan_open(unsigned int flags)
{
	int fd = fanotify_init(FAN_CLASS_NOTIF | FAN_CLOEXEC | FAN_NONBLOCK | flags,
			       O_RDONLY | O_CLOEXEC | O_LARGEFILE);
	if (fd < 0)
		agent_log("fanotify_init: %s; every command's end will flush the disks", strerror(errno));
	return fd;
}

static bool mark(int group, unsigned int how, uint64_t mask, const char *path)
{
	if (group < 0)
		return false;
	if (fanotify_mark(group, FAN_MARK_ADD | how, mask, AT_FDCWD, path) < 0) {
		agent_log("fanotify mark on %s: %s; every command's end will flush the disks",
			  path, strerror(errno));
		return false;
	}
	return true;
}

void agent_durable_add(const char *mnt, const char *dev)
{
	if (D.nfs == DURABLE_MAX_FS) {
		agent_log("durable: more than %d writable disks; %s is not flushed", DURABLE_MAX_FS, mnt);
		return;
	}
	int fd = open(mnt, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		agent_log("durable: cannot open %s: %s; it is not flushed", mnt, strerror(errno));
		return;
	}
	D.fs[D.nfs].fd = fd;
	snprintf(D.fs[D.nfs].where, sizeof(D.fs[D.nfs].where), "%s", mnt);
	D.nfs++;
	if (D.fan_fid < 0 && !D.blind && (D.fan_fid = fan_open(FAN_REPORT_FID)) < 0)
		D.blind = true;
	if (D.fan_plain < 0 && !D.blind && (D.fan_plain = fan_open(0)) < 0)
		D.blind = true;
	const uint64_t all = FAN_MODIFY | FAN_CLOSE_WRITE | FAN_ATTRIB | FAN_CREATE |
			     FAN_DELETE | FAN_MOVED_FROM | FAN_MOVED_TO | FAN_ONDIR;
	if (!mark(D.fan_fid, FAN_MARK_FILESYSTEM, all, mnt) ||
	    !mark(D.fan_plain, FAN_MARK_INODE, FAN_MODIFY | FAN_CLOSE_WRITE, dev))
		D.blind = true;
	/* The disks were just mounted: what happened so far is the
	 * mount's own, and the first end flushes nothing it did not do. */
}

void agent_durable_add_overlay(const char *mnt)
{
	if (!mark(D.fan_plain, FAN_MARK_FILESYSTEM, FAN_MODIFY | FAN_CLOSE_WRITE, mnt))
		D.blind = true;
}

/* Drain a group's queue; true when it held anything (an overflow is an
 * event too). */
static bool drain(int group)
{
	static char buf[8 * 1024] __attribute__((aligned(8)));
	bool any = false;
	if (group < 0)
		return false;
	for (;;) {
		ssize_t k = read(group, buf, sizeof(buf));
		if (k > 0) {
			any = true;
			continue;
		}
		if (k < 0 && errno == EINTR)
			continue;
		return any;	/* EAGAIN: empty */
	}
}

/* Whether the disks may hold anything not yet flushed: a change seen
 * since the last flush began. */
static bool changed(void)
{
	bool a = drain(D.fan_fid);
	bool b = drain(D.fan_plain);
	if (a || b || D.blind)
		D.changed = true;
	return D.changed;
}

static void *flusher(void *arg)
{
	(void)arg;
	for (;;) {
		struct flush_req r;
		ssize_t k = read(D.req[0], &r, sizeof(r));
		if (k < 0 && errno == EINTR)
			continue;
		if (k != (ssize_t)sizeof(r))
			return NULL;
		struct flush_done d = { 0 };
		for (size_t i = 0; i < r.n; i++)
			if (syncfs(r.fds[i]) < 0) {
				d.failed |= 1u << i;
				d.err[i] = errno;
			}
		while (write(D.done[1], &d, sizeof(d)) < 0 && errno == EINTR)
			;
	}
}

static int start_thread(void)
{
	if (D.req[0] >= 0)
		return 0;
	if (pipe2(D.req, O_CLOEXEC) < 0)
		return -errno;
	if (pipe2(D.done, O_CLOEXEC) < 0) {
		int e = errno;
		close(D.req[0]);
		close(D.req[1]);
		D.req[0] = D.req[1] = -1;
		return -e;
	}
	pthread_t t;
	pthread_attr_t at;
	pthread_attr_init(&at);
	pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
	pthread_attr_setstacksize(&at, 64 * 1024);
	int r = pthread_create(&t, &at, flusher, NULL);
	pthread_attr_destroy(&at);
	if (r != 0) {
		close(D.req[0]);
		close(D.req[1]);
		close(D.done[0]);
		close(D.done[1]);
		D.req[0] = D.req[1] = D.done[0] = D.done[1] = -1;
		return -r;
	}
	return 0;
}

/* Flush in this thread: the fallback when the flusher cannot run. */
static void flush_here(struct flush_done *d)
{
	memset(d, 0, sizeof(*d));
	for (size_t i = 0; i < D.nfs; i++)
		if (syncfs(D.fs[i].fd) < 0) {
			d->failed |= 1u << i;
			d->err[i] = errno;
		}
}

static void finish(struct cap_buf *out, const struct flush_done *d);

/* Begin the next flush if one is wanted and none runs. */
static void kick(struct cap_buf *out)
{
	if (D.running)
		return;
	bool wanted = false;
	for (size_t i = 0; i < D.nwait; i++)
		if (D.wait[i].need > D.finished)
			wanted = true;
	if (!wanted)
		return;
	D.started++;
	D.changed = false;	/* what comes after this point needs the next one */
	struct flush_req r = { .n = D.nfs };
	for (size_t i = 0; i < D.nfs; i++)
		r.fds[i] = D.fs[i].fd;
	int e = start_thread();
	if (e == 0 && write(D.req[1], &r, sizeof(r)) == (ssize_t)sizeof(r)) {
		D.running = true;
		return;
	}
	agent_log("durable: no flusher thread (%s); flushing in the loop", strerror(e ? -e : errno));
	struct flush_done d;
	flush_here(&d);
	finish(out, &d);
}

/* A flush ended: report every end it covers. */
static void finish(struct cap_buf *out, const struct flush_done *d)
{
	D.finished = D.started;
	D.running = false;
	char why[200] = "";
	for (size_t i = 0; i < D.nfs; i++)
		if (d->failed & (1u << i)) {
			snprintf(why, sizeof(why), "capsule: the writes could not be made durable: flushing %s: %s (is the host's disk full?)\n",
				 D.fs[i].where, strerror(d->err[i]));
			agent_log("%.*s", (int)strlen(why) - 1, why);
		}
	int64_t now = cap_now_ms();
	size_t k = 0;
	for (size_t i = 0; i < D.nwait; i++) {
		struct waiter *w = &D.wait[i];
		if (w->need > D.finished) {
			D.wait[k++] = *w;
			continue;
		}
		w->ex.sync_ms = (uint16_t)CAP_MIN(now - w->since_ms, (int64_t)UINT16_MAX);
		if (*why)
			cap_proto_put(out, CAP_MSG_STDERR, w->id, why, strlen(why));
		else
			w->ex.flags |= CAP_EXIT_DURABLE;
		cap_proto_exit_encode(out, w->id, &w->ex);
	}
	D.nwait = k;
	kick(out);
}

void agent_durable_exit(struct cap_buf *out, uint32_t id, struct cap_exit *ex, bool sync)
{
	ex->sync_ms = 0;
	if (!sync || D.nfs == 0) {
		/* Opted out, or nothing here outlives the VM. */
		cap_proto_exit_encode(out, id, ex);
		return;
	}
	uint64_t need;
	if (changed())
		need = D.started + 1;	/* a flush that begins after now */
	else if (D.running)
		need = D.started;	/* changes seen before it began are its */
	else
		need = 0;
	if (need <= D.finished) {
		ex->flags |= CAP_EXIT_DURABLE;
		cap_proto_exit_encode(out, id, ex);
		return;
	}
	if (D.nwait == DURABLE_MAX_WAIT) {
		/* Cannot happen with one waiter per stream; flush here. */
		struct flush_done d;
		flush_here(&d);
		ex->flags |= d.failed ? 0 : CAP_EXIT_DURABLE;
		cap_proto_exit_encode(out, id, ex);
		return;
	}
	cap_proto_put(out, CAP_MSG_SYNCING, id, NULL, 0);
	D.wait[D.nwait++] = (struct waiter){ .id = id, .ex = *ex, .need = need, .since_ms = cap_now_ms() };
	kick(out);
}

bool agent_durable_waiting(uint32_t id)
{
	for (size_t i = 0; i < D.nwait; i++)
		if (D.wait[i].id == id)
			return true;
	return false;
}

int agent_durable_fd(void)
{
	return D.running ? D.done[0] : -1;
}

void agent_durable_ready(struct cap_buf *out)
{
	struct flush_done d;
	ssize_t k = read(D.done[0], &d, sizeof(d));
	if (k != (ssize_t)sizeof(d))
		return;	/* EINTR or EAGAIN: poll again */
	finish(out, &d);
}

void agent_durable_synced(struct cap_buf *out)
{
	for (size_t i = 0; i < D.nwait; i++) {
		D.wait[i].ex.flags |= CAP_EXIT_DURABLE;
		cap_proto_exit_encode(out, D.wait[i].id, &D.wait[i].ex);
	}
	D.nwait = 0;
}

void agent_durable_forget(void)
{
	D.nwait = 0;
}
