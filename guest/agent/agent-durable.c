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
 * before its end is reported (unless its cgroup would not empty within
 * 2 s), so every change it made has queued its event by then. One write
 * raises none: through a shared mapping of a root file (overlay maps the
 * upper file, opened without notification), after its last close; so
 * with an image root, once a root file was written, dirty pages in
 * /proc/meminfo count as a change to the upper disk too, until an end
 * finds no other command running (no process is left that could write
 * through such a mapping). No change since the last flush began: nothing
 * to flush, and the end goes out at once.
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
#include <sys/statfs.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "agent.h"
#include "util.h"

#define DURABLE_MAX_FS 3
/* An end waits after its slot is freed, and write_file takes none: room
 * for every stream id twice over. */
#define DURABLE_MAX_WAIT (2 * CAP_PROTO_MAX_STREAMS)

struct waiter {
	uint32_t id;
	struct cap_exit ex;
	uint64_t need;	/* the flush that must have finished */
	uint64_t since;	/* flushes finished before the call began */
	int64_t since_ms;
};

struct flush_req {
	int fds[DURABLE_MAX_FS];
	int idx[DURABLE_MAX_FS];	/* which D.fs each is */
	size_t n;
};

struct flush_done {
	uint32_t failed;	/* bit i: syncfs of D.fs[i] failed */
	int err[DURABLE_MAX_FS];
};

static struct {
	int fan_fid, fan_plain;	/* the two fanotify groups, -1: none */
	bool blind;	/* a mark could not be placed: every end flushes all */
	struct {
		int fd;	/* O_RDONLY directory of the mount, for syncfs */
		char mnt[40];	/* where the agent mounted it */
		char where[40];	/* what a command calls it */
		fsid_t fsid;	/* what the FID group's events name it by */
		dev_t rdev;	/* its device node's */
		char stat[48];	/* /sys/block/DEV/stat */
	} fs[DURABLE_MAX_FS];
	size_t nfs;
	int upper;	/* the disk under the overlay root, -1: none */
	bool armed;	/* a root file was written: a mapping may write unseen */
	/* The upper disk's completed writes when a flush of it last ended:
	 * pages a mapping dirtied may be written back, unflushed, before an
	 * end looks at the dirty counters. */
	uint64_t upper_writes;
	uint32_t inflight;	/* the disks the running flush covers */
	/* The last flush that failed (0: none) and why: every call under
	 * way when it ran may have lost writes, whatever later flushes say
	 * (a writeback error is reported once). */
	uint64_t failed_seq;
	char fail_msg[200];
	int refresh_fd;	/* /proc/sys/vm/stat_refresh, -1: not open */
	int req[2], done[2];	/* to and from the flusher; -1 until it starts */
	bool running;
	uint32_t changed;	/* bit i: fs[i] changed since the last flush began */
	uint64_t started, finished;	/* flush sequence numbers */
	struct waiter wait[DURABLE_MAX_WAIT];
	size_t nwait;
} D = { .fan_fid = -1, .fan_plain = -1, .upper = -1, .refresh_fd = -1,
	.req = { -1, -1 }, .done = { -1, -1 } };

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

void agent_durable_add(const char *mnt, const char *dev, const char *shown)
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
	struct statfs sf;
	struct stat st;
	if (fstatfs(fd, &sf) < 0 || stat(dev, &st) < 0) {
		agent_log("durable: cannot stat %s or %s: %s; every end will flush", mnt, dev, strerror(errno));
		D.blind = true;
	} else {
		D.fs[D.nfs].fsid = sf.f_fsid;
		D.fs[D.nfs].rdev = st.st_rdev;
	}
	const char *base = strrchr(dev, '/');
	snprintf(D.fs[D.nfs].stat, sizeof(D.fs[D.nfs].stat), "/sys/block/%s/stat", base ? base + 1 : dev);
	D.fs[D.nfs].fd = fd;
	snprintf(D.fs[D.nfs].mnt, sizeof(D.fs[D.nfs].mnt), "%s", mnt);
	snprintf(D.fs[D.nfs].where, sizeof(D.fs[D.nfs].where), "%s", shown);
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
	/* SETUP's own writes after this point (the tool user, /etc, the
	 * disks' owners) are changes too: the first end flushes them. */
}

/* A disk's completed writes (field 5 of its stat), 0 when unreadable. */
static uint64_t disk_writes(int i)
{
	char buf[256];
	int fd = open(D.fs[i].stat, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return 0;
	ssize_t k = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	unsigned long long v[5];
	if (k <= 0)
		return 0;
	buf[k] = '\0';
	if (sscanf(buf, "%llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4]) != 5)
		return 0;
	return v[4];
}

void agent_durable_add_overlay(const char *mnt, const char *upper)
{
	for (size_t i = 0; i < D.nfs; i++)
		if (strcmp(D.fs[i].mnt, upper) == 0)
			D.upper = (int)i;
	if (D.upper < 0 || !mark(D.fan_plain, FAN_MARK_FILESYSTEM, FAN_MODIFY | FAN_CLOSE_WRITE, mnt))
		D.blind = true;
	if (D.upper >= 0)
		D.upper_writes = disk_writes(D.upper);
	D.refresh_fd = open("/proc/sys/vm/stat_refresh", O_WRONLY | O_CLOEXEC);
}

void agent_durable_close(void)
{
	for (size_t i = 0; i < D.nfs; i++)
		close(D.fs[i].fd);
	int *fds[] = { &D.fan_fid, &D.fan_plain, &D.refresh_fd };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(fds); i++)
		if (*fds[i] >= 0) {
			close(*fds[i]);
			*fds[i] = -1;
		}
	D.nfs = 0;
	D.upper = -1;
	D.armed = false;
	D.blind = false;
	D.changed = 0;
}

static uint32_t all_disks(void)
{
	return (1u << D.nfs) - 1;
}

/* Which disk an event is about: the FID group's by the file system id
 * of its first FID record; the plain group's by its descriptor (closed
 * here): a device node is its disk, anything else is the overlay's
 * file, so the upper disk. Unknown: all of them. */
static uint32_t event_disks(const struct fanotify_event_metadata *m)
{
	if (m->mask & FAN_Q_OVERFLOW) {
		D.armed = true;	/* a root file's event may be the one lost */
		return all_disks();
	}
	if (m->fd >= 0) {
		struct stat st;
		uint32_t r = D.upper >= 0 ? 1u << D.upper : all_disks();
		if (fstat(m->fd, &st) == 0 && S_ISBLK(st.st_mode)) {
			r = all_disks();
			for (size_t i = 0; i < D.nfs; i++)
				if (D.fs[i].rdev == st.st_rdev)
					r = 1u << i;
		} else {
			D.armed = true;
		}
		close(m->fd);
		return r;
	}
	if (m->event_len >= m->metadata_len + sizeof(struct fanotify_event_info_fid)) {
		const struct fanotify_event_info_fid *fid =
			(const void *)((const char *)m + m->metadata_len);
		for (size_t i = 0; i < D.nfs; i++)
			if (memcmp(&fid->fsid, &D.fs[i].fsid, sizeof(fid->fsid)) == 0)
				return 1u << i;
	}
	return all_disks();
}

/* Drain a group's queue into D.changed. */
static void drain(int group)
{
	static char buf[8 * 1024] __attribute__((aligned(8)));
	if (group < 0)
		return;
	for (;;) {
		ssize_t k = read(group, buf, sizeof(buf));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0 && errno != EAGAIN) {
			/* The kernel could not hand over an event (the
			 * plain group opens a file for each: EMFILE, ENOMEM)
			 * and has dropped it: any disk may have changed. */
			D.changed = all_disks();
			D.armed = true;
			return;
		}
		if (k <= 0)
			return;	/* EAGAIN: empty */
		const struct fanotify_event_metadata *m = (const void *)buf;
		for (; FAN_EVENT_OK(m, k); m = FAN_EVENT_NEXT(m, k))
			D.changed |= event_disks(m);
	}
}

/* Whether the guest's page cache holds dirty or in-flight pages, with
 * the per-CPU counters folded in first (stat_refresh) so that a few
 * pages are not missed. */
static bool pages_dirty(void)
{
	if (D.refresh_fd >= 0 && pwrite(D.refresh_fd, "1", 1, 0) < 0) {
		close(D.refresh_fd);
		D.refresh_fd = -1;
	}
	FILE *f = fopen("/proc/meminfo", "re");
	if (!f)
		return true;
	char line[128];
	unsigned long long kb, sum = 0;
	int seen = 0;
	while (seen < 2 && fgets(line, sizeof(line), f))
		if (sscanf(line, "Dirty: %llu", &kb) == 1 || sscanf(line, "Writeback: %llu", &kb) == 1) {
			sum += kb;
			seen++;
		}
	fclose(f);
	return seen < 2 || sum > 0;
}

/* Which disks may hold anything not yet flushed: those changed since
 * the last flush began. others: commands other than the one ending are
 * running. */
static uint32_t changed(bool others)
{
	drain(D.fan_fid);
	drain(D.fan_plain);
	if (D.blind)
		D.changed = all_disks();
	/* A shared mapping of a root file writes unseen (above). With the
	 * upper disk to be flushed anyway, or pages found dirty, the flush
	 * takes all such writes so far; with no other command running, no
	 * process is left to make more. */
	if (D.armed && D.upper >= 0) {
		if (!(D.changed & (1u << D.upper)) &&
		    (pages_dirty() || disk_writes(D.upper) != D.upper_writes))
			D.changed |= 1u << D.upper;
		if (!others)
			D.armed = false;
	}
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
				d.failed |= 1u << r.idx[i];
				d.err[r.idx[i]] = errno;
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
	/* The disks changed so far; what changes after this point needs
	 * the next flush. A waiter's disks are among them: its changes
	 * were seen before (need > finished means it asked for this one). */
	struct flush_req r = { .n = 0 };
	for (size_t i = 0; i < D.nfs; i++)
		if (D.changed & (1u << i)) {
			r.idx[r.n] = (int)i;
			r.fds[r.n++] = D.fs[i].fd;
		}
	D.inflight = D.changed;
	D.changed = 0;
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

/* Send a finished call's EXIT: durable unless a flush that may have
 * held its writes failed, which its STDERR then says. */
static void send_exit(struct cap_buf *out, uint32_t id, struct cap_exit *ex, uint64_t since)
{
	if (D.failed_seq > since)
		cap_proto_put(out, CAP_MSG_STDERR, id, D.fail_msg, strlen(D.fail_msg));
	else
		ex->flags |= CAP_EXIT_DURABLE;
	cap_proto_exit_encode(out, id, ex);
}

/* A flush ended: remember a failure, report every end it covers. */
static void finish(struct cap_buf *out, const struct flush_done *d)
{
	D.finished = D.started;
	D.running = false;
	for (size_t i = 0; i < D.nfs; i++)
		if (d->failed & (1u << i)) {
			D.failed_seq = D.finished;
			snprintf(D.fail_msg, sizeof(D.fail_msg),
				 "capsule: the writes could not be made durable: flushing %s: %s (is the host's disk full?)\n",
				 D.fs[i].where, strerror(d->err[i]));
			agent_log("%.*s", (int)strlen(D.fail_msg) - 1, D.fail_msg);
		}
	if (D.upper >= 0 && (D.inflight & (1u << D.upper)))
		D.upper_writes = disk_writes(D.upper);
	D.inflight = 0;
	int64_t now = cap_now_ms();
	size_t k = 0;
	for (size_t i = 0; i < D.nwait; i++) {
		struct waiter *w = &D.wait[i];
		if (w->need > D.finished) {
			D.wait[k++] = *w;
			continue;
		}
		w->ex.sync_ms = (uint16_t)CAP_MIN(now - w->since_ms, (int64_t)UINT16_MAX);
		send_exit(out, w->id, &w->ex, w->since);
	}
	D.nwait = k;
	kick(out);
}

uint64_t agent_durable_seq(void)
{
	/* Flushes finished so far: one that is running now may write back a
	 * page this call dirties and take its error with it (a writeback
	 * error is reported once), so it counts as after the call. */
	return D.finished;
}

void agent_durable_exit(struct cap_buf *out, uint32_t id, struct cap_exit *ex, bool sync,
			bool others, uint64_t since)
{
	ex->sync_ms = 0;
	if (!sync || D.nfs == 0) {
		/* Opted out, or nothing here outlives the VM. */
		cap_proto_exit_encode(out, id, ex);
		return;
	}
	uint64_t need;
	if (changed(others))
		need = D.started + 1;	/* a flush that begins after now */
	else if (D.running)
		need = D.started;	/* changes seen before it began are its */
	else
		need = 0;
	if (need <= D.finished) {
		send_exit(out, id, ex, since);
		return;
	}
	if (D.nwait == DURABLE_MAX_WAIT) {
		/* More waiting ends than streams twice over (the host is not
		 * keeping to its limits): this one is not made to wait. */
		static const char msg[] = "capsule: too many calls are waiting for a flush; this one's writes are not durable yet\n";
		cap_proto_put(out, CAP_MSG_STDERR, id, msg, sizeof(msg) - 1);
		cap_proto_exit_encode(out, id, ex);
		return;
	}
	cap_proto_put(out, CAP_MSG_SYNCING, id, NULL, 0);
	D.wait[D.nwait++] = (struct waiter){ .id = id, .ex = *ex, .need = need, .since = since,
					     .since_ms = cap_now_ms() };
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

void agent_durable_shutdown(struct cap_buf *out)
{
	struct flush_done d;
	/* The thread's flush first: a failure it saw is reported once. */
	while (D.running) {
		ssize_t k = read(D.done[0], &d, sizeof(d));
		if (k == (ssize_t)sizeof(d))
			finish(out, &d);
		else if (k >= 0 || errno != EINTR)
			break;
	}
	flush_here(&d);
	if (d.failed) {
		D.failed_seq = D.finished = ++D.started;
		snprintf(D.fail_msg, sizeof(D.fail_msg),
			 "capsule: the writes could not be made durable: a disk's flush at shutdown failed\n");
	}
	for (size_t i = 0; i < D.nwait; i++)
		send_exit(out, D.wait[i].id, &D.wait[i].ex, D.wait[i].since);
	D.nwait = 0;
	agent_durable_close();
}

void agent_durable_forget(void)
{
	D.nwait = 0;
}
