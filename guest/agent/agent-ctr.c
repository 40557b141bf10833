/* A pod's containers in the guest (docs/protocol.md, "Containers"): each
 * a cgroup of its own, /sys/fs/cgroup/ctr-NAME, with the limits of its
 * config (memory.max, cpu.max, cpu.weight, pids.max) and its commands'
 * cgroups below it; with CAP_CTR_ROOT, a mount namespace of its own
 * rooted at CAP_GUEST_CONTAINERS/NAME (the copy of its image the host
 * made), with /proc, /sys, /dev and the config's mounts. The VM's
 * network, IPC and UTS namespaces are the pod's: every container shares
 * them. UPDATE changes a container's limits or removes it; STATS reads
 * its cgroup (or the whole VM's). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <net/if.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include "agent-internal.h"
#include "layout.h"
#include "proto.h"
#include "util.h"

struct ctr {
	char name[CAP_CTR_NAME_MAX + 1];	/* "": a free slot */
	char cg[CAP_CTR_NAME_MAX + 8];	/* "ctr-NAME", relative to /sys/fs/cgroup */
	int nsfd;	/* its first process's mount namespace, -1: none (ended, or no root) */
	pid_t init;	/* its first process while it runs, else 0 */
	bool root;	/* CAP_CTR_ROOT */
};

static struct ctr ctrs[CAP_PROTO_MAX_STREAMS];

static struct ctr *ctr_find(const char *name)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(ctrs); i++)
		if (ctrs[i].name[0] && strcmp(ctrs[i].name, name) == 0)
			return &ctrs[i];
	return NULL;
}

/* --- limits ------------------------------------------------------------- */

static void num_or_max(char *buf, size_t len, uint64_t v)
{
	if (v == CAP_LIMIT_NONE)
		snprintf(buf, len, "max");
	else
		snprintf(buf, len, "%llu", (unsigned long long)v);
}

/* Write the limits l sets into the cgroup cg (relative to the agent's
 * tree): 0, or -errno with msg naming the file. */
static int write_limits(const char *cg, const struct cap_limits *l, char *msg, size_t mlen)
{
	struct {
		uint32_t bit;
		const char *file;
	} files[] = {
		{ CAP_LIMIT_MEMORY, "memory.max" }, { CAP_LIMIT_CPU, "cpu.max" },
		{ CAP_LIMIT_CPU_WEIGHT, "cpu.weight" }, { CAP_LIMIT_PIDS, "pids.max" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(files); i++) {
		if (!(l->set & files[i].bit))
			continue;
		char v[64], path[CAP_CTR_NAME_MAX + 32];
		if (files[i].bit == CAP_LIMIT_MEMORY)
			num_or_max(v, sizeof(v), l->memory_max);
		else if (files[i].bit == CAP_LIMIT_PIDS)
			num_or_max(v, sizeof(v), l->pids_max);
		else if (files[i].bit == CAP_LIMIT_CPU_WEIGHT)
			snprintf(v, sizeof(v), "%llu", (unsigned long long)l->cpu_weight);
		else {
			num_or_max(v, sizeof(v) - 24, l->cpu_quota);
			snprintf(v + strlen(v), 24, " %llu", (unsigned long long)l->cpu_period);
		}
		snprintf(path, sizeof(path), "%s/%s", cg, files[i].file);
		int r = write_at(A.cg_fd, path, v);
		if (r < 0) {
			snprintf(msg, mlen, "cannot write %s to /sys/fs/cgroup/%s: %s%s", v, path, strerror(-r),
				 r == -ENOENT ? " (this guest kernel lacks that cgroup controller)" : "");
			return r;
		}
	}
	return 0;
}

/* --- the first process and the ones that join ------------------------------ */

/* The pod's loopback, up: its containers talk over 127.0.0.1 (a VM
 * without a NIC has it down). */
static void loopback_up(void)
{
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	struct ifreq ifr = { 0 };
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "lo");
	if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0 ||
	    (!(ifr.ifr_flags & IFF_UP) && (ifr.ifr_flags |= IFF_UP, ioctl(s, SIOCSIFFLAGS, &ifr) < 0)))
		agent_log("cannot bring lo up for the pod's containers: %s", strerror(errno));
	if (s >= 0)
		close(s);
}

int ctr_prepare(const struct cap_exec_req *req, struct ctr_start *cs, char *msg, size_t mlen)
{
	const struct cap_exec_container *c = req->ctr;
	memset(cs, 0, sizeof(*cs));
	cs->nsfd = -1;
	if (A.cg_fd < 0) {
		snprintf(msg, mlen, "container %s: this guest has no cgroups", c->name);
		return -EOPNOTSUPP;
	}
	struct ctr *k = ctr_find(c->name);
	if (c->options & CAP_CTR_JOIN) {
		if (!k || !k->init || (k->root && k->nsfd < 0)) {
			snprintf(msg, mlen, "container %s is not running in this VM", c->name);
			return -ESRCH;
		}
		cs->ctr = c;
		cs->nsfd = k->nsfd;
		snprintf(cs->cg, sizeof(cs->cg), "%s", k->cg);
		cs->slot = (int)(k - ctrs) + 1;
		return 0;
	}
	if (k && k->init) {
		snprintf(msg, mlen, "container %s already runs in this VM", c->name);
		return -EBUSY;
	}
	if (!k) {
		for (size_t i = 0; i < CAP_ARRAY_SIZE(ctrs) && !k; i++)
			if (!ctrs[i].name[0])
				k = &ctrs[i];
		if (!k) {
			snprintf(msg, mlen, "too many containers in this VM (%zu)", CAP_ARRAY_SIZE(ctrs));
			return -EBUSY;
		}
		memset(k, 0, sizeof(*k));
		k->nsfd = -1;
		snprintf(k->name, sizeof(k->name), "%s", c->name);
		snprintf(k->cg, sizeof(k->cg), "ctr-%s", c->name);
		if (mkdirat(A.cg_fd, k->cg, 0755) < 0 && errno != EEXIST) {
			int e = errno;
			snprintf(msg, mlen, "cannot make the cgroup /sys/fs/cgroup/%s: %s", k->cg, strerror(e));
			k->name[0] = '\0';
			return -e;
		}
		char path[CAP_CTR_NAME_MAX + 48];
		/* Its commands get their own pids.max below it; the whole
		 * container goes when the OOM killer takes one of them, as
		 * the kubelet asks of cgroup v2. */
		snprintf(path, sizeof(path), "%s/cgroup.subtree_control", k->cg);
		write_at(A.cg_fd, path, "+pids");
		snprintf(path, sizeof(path), "%s/memory.oom.group", k->cg);
		write_at(A.cg_fd, path, "1");
	}
	k->root = c->options & CAP_CTR_ROOT;
	loopback_up();
	int r = write_limits(k->cg, &c->limits, msg, mlen);
	if (r < 0)
		return r;
	cs->ctr = c;
	snprintf(cs->cg, sizeof(cs->cg), "%s", k->cg);
	cs->slot = (int)(k - ctrs) + 1;
	cs->init = true;
	return 0;
}

void ctr_started(const struct ctr_start *cs, pid_t pid)
{
	if (!cs->init || cs->slot <= 0)
		return;
	struct ctr *k = &ctrs[cs->slot - 1];
	k->init = pid;
	if (k->nsfd >= 0)
		close(k->nsfd);
	k->nsfd = -1;
	if (k->root) {
		/* The child has exec'd the container's program (its error
		 * pipe closed), so it is in its namespace: kept for the
		 * processes that join it. */
		char path[64];
		snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)pid);
		k->nsfd = open(path, O_RDONLY | O_CLOEXEC);
	}
}

void ctr_ended(int slot, pid_t pid)
{
	if (slot <= 0)
		return;
	struct ctr *k = &ctrs[slot - 1];
	if (k->init != pid)
		return;
	k->init = 0;
	if (k->nsfd >= 0)
		close(k->nsfd);
	k->nsfd = -1;
}

uint64_t ctr_oom_kills(int slot)
{
	if (slot <= 0 || !ctrs[slot - 1].name[0])
		return 0;
	char path[CAP_CTR_NAME_MAX + 32], *s = NULL;
	snprintf(path, sizeof(path), "%s/memory.events", ctrs[slot - 1].cg);
	char buf[512];
	if (read_at(A.cg_fd, path, buf, sizeof(buf)) <= 0)
		return 0;
	s = strstr(buf, "oom_kill ");
	return s ? strtoull(s + 9, NULL, 10) : 0;
}

/* --- in the child: the container's root ------------------------------------ */

/* Open path (absolute, in the container) beneath rootfd, resolved as if
 * rootfd were /, the missing directories made (root's, 0755). */
static int open_in_root(int rootfd, const char *path, bool dir)
{
	struct open_how how = { .flags = O_PATH | O_CLOEXEC | (dir ? O_DIRECTORY : 0),
				.resolve = RESOLVE_IN_ROOT | RESOLVE_NO_MAGICLINKS };
	int fd = (int)syscall(SYS_openat2, rootfd, path, &how, sizeof(how));
	if (fd >= 0 || errno != ENOENT)
		return fd;
	/* Make it one component at a time, each resolved in the root. */
	char part[256];
	snprintf(part, sizeof(part), "%s", path);
	for (char *c = part + 1;; c++) {
		if (*c != '/' && *c != '\0')
			continue;
		char save = *c;
		*c = '\0';
		how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
		int p = (int)syscall(SYS_openat2, rootfd, part, &how, sizeof(how));
		if (p < 0 && errno == ENOENT) {
			char *slash = strrchr(part, '/');
			*slash = '\0';
			int parent = (int)syscall(SYS_openat2, rootfd, *part ? part : "/", &how, sizeof(how));
			*slash = '/';
			if (parent < 0)
				return -1;
			int mk = save == '\0' && !dir ? openat(parent, slash + 1, O_CREAT | O_WRONLY | O_CLOEXEC | O_NOFOLLOW, 0644)
						    : mkdirat(parent, slash + 1, 0755);
			int e = errno;
			if (save == '\0' && !dir && mk >= 0)
				close(mk);
			close(parent);
			if (mk < 0 && e != EEXIST) {
				errno = e;
				return -1;
			}
		} else if (p >= 0) {
			close(p);
		} else {
			return -1;
		}
		*c = save;
		if (!save)
			break;
	}
	how.flags = O_PATH | O_CLOEXEC | (dir ? O_DIRECTORY : 0);
	return (int)syscall(SYS_openat2, rootfd, path, &how, sizeof(how));
}

/* Mount on the directory fd (its /proc/self/fd path, as runc does). */
static int mount_on(int fd, const char *src, const char *type, unsigned long flags, const char *data)
{
	char target[64];
	snprintf(target, sizeof(target), "/proc/self/fd/%d", fd);
	return mount(src, target, type, flags, data && *data ? data : NULL);
}

/* The usual nodes of a container's /dev (a tmpfs), as runc makes them. */
static void fill_dev(int devfd)
{
	static const struct {
		const char *name;
		unsigned maj, min;
	} nodes[] = {
		{ "null", 1, 3 }, { "zero", 1, 5 }, { "full", 1, 7 }, { "random", 1, 8 },
		{ "urandom", 1, 9 }, { "tty", 5, 0 },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(nodes); i++) {
		if (mknodat(devfd, nodes[i].name, S_IFCHR | 0666, makedev(nodes[i].maj, nodes[i].min)) == 0)
			fchmodat(devfd, nodes[i].name, 0666, 0);
	}
	static const char *const links[][2] = {
		{ "fd", "/proc/self/fd" }, { "stdin", "/proc/self/fd/0" }, { "stdout", "/proc/self/fd/1" },
		{ "stderr", "/proc/self/fd/2" }, { "ptmx", "pts/ptmx" }, { "core", "/proc/kcore" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(links); i++)
		symlinkat(links[i][1], devfd, links[i][0]);
	mkdirat(devfd, "pts", 0755);
	mkdirat(devfd, "shm", 01777);
}

static int fail_at(struct start_failure *f, int stage)
{
	f->stage = stage;	/* f->what kept: the mount's destination */
	f->errnum = errno ? errno : EIO;
	return -1;
}

/* One mount of the config in the container's namespace; cg is the
 * container's cgroup (relative to the agent's, A.cg_fd). */
static int one_mount(int rootfd, const struct cap_ctr_mount *m, const char *cg, bool *dev_done)
{
	static const char *const types[] = {
		[CAP_CTR_PROC] = "proc", [CAP_CTR_SYSFS] = "sysfs", [CAP_CTR_TMPFS] = "tmpfs",
		[CAP_CTR_DEVPTS] = "devpts", [CAP_CTR_MQUEUE] = "mqueue",
	};
	int fd = open_in_root(rootfd, m->destination, true);
	if (fd < 0)
		return -1;
	int r;
	if (m->kind == CAP_CTR_SHM) {
		r = mount_on(fd, "/dev/shm", NULL, MS_BIND, NULL);
	} else if (m->kind == CAP_CTR_CGROUP) {
		/* The container's own cgroup at its root, as runc's cgroup
		 * namespace shows it: its memory.max, cpu.max, pids.max and
		 * the cgroups of its processes below. By path: a bind's
		 * source must be a mount of this namespace, which A.cg_fd's
		 * (opened before the unshare) is not. */
		char src[CAP_CTR_NAME_MAX + 64];
		snprintf(src, sizeof(src), "/sys/fs/cgroup/%s", cg);
		r = mount_on(fd, src, NULL, MS_BIND, NULL);
	} else if (m->kind == CAP_CTR_VOLUME) {
		char src[300];
		snprintf(src, sizeof(src), CAP_GUEST_VOLUMES "/%s", m->data);
		mkdir(src, 0777);
		chmod(src, 0777);
		r = mount_on(fd, src, NULL, MS_BIND, NULL);
	} else {
		r = mount_on(fd, types[m->kind], types[m->kind], m->flags, m->data);
		if (r < 0 && m->kind == CAP_CTR_MQUEUE && errno == ENODEV)
			r = 0;	/* a kernel without POSIX message queues (docs/oci.md) */
	}
	if (r == 0 && strcmp(m->destination, "/dev") == 0 && m->kind == CAP_CTR_TMPFS) {
		close(fd);
		fd = open_in_root(rootfd, "/dev", true);
		if (fd >= 0) {
			char p[64];
			snprintf(p, sizeof(p), "/proc/self/fd/%d", fd);
			int dfd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
			if (dfd >= 0) {
				fill_dev(dfd);
				close(dfd);
			}
			*dev_done = true;
		}
	}
	/* A bind keeps its source's flags; read-only asks for a remount, of
	 * the new mount (fd is the directory under it). */
	if (r == 0 && (m->kind == CAP_CTR_VOLUME || m->kind == CAP_CTR_SHM || m->kind == CAP_CTR_CGROUP) &&
	    (m->flags & MS_RDONLY)) {
		close(fd);
		fd = open_in_root(rootfd, m->destination, true);
		r = fd < 0 ? -1 : mount_on(fd, NULL, NULL, MS_REMOUNT | MS_BIND | (m->flags & CAP_SETUP_TMPFS_FLAGS), NULL);
	}
	int e = errno;
	if (fd >= 0)
		close(fd);
	errno = e;
	return r;
}

int ctr_enter(const struct ctr_start *cs, const char *cwd, struct start_failure *f)
{
	const struct cap_exec_container *c = cs->ctr;
	if (c->options & CAP_CTR_JOIN) {
		if (cs->nsfd >= 0 && setns(cs->nsfd, CLONE_NEWNS) < 0)
			return fail_at(f, 5);
		return 0;
	}
	if (!(c->options & CAP_CTR_ROOT))
		return 0;
	char root[CAP_CTR_NAME_MAX + 64];
	snprintf(root, sizeof(root), CAP_GUEST_CONTAINERS "/%s", c->name);
	/* A namespace of its own in which nothing propagates back, and its
	 * root a mount of its own (pivot_root wants one). */
	if (unshare(CLONE_NEWNS) < 0 || mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0 ||
	    mount(root, root, NULL, MS_BIND | MS_REC, NULL) < 0)
		return fail_at(f, 5);
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return fail_at(f, 5);
	bool dev_done = false, have_dev = false;
	for (uint32_t i = 0; i < c->nmounts; i++)
		have_dev |= strcmp(c->mounts[i].destination, "/dev") == 0;
	if (!have_dev) {
		/* A container's /dev is always a tmpfs of its own (its root is
		 * on a nodev disk): the usual nodes, nothing of the VM's. */
		struct cap_ctr_mount dev = { .kind = CAP_CTR_TMPFS, .destination = "/dev",
					     .data = "mode=755,size=65536k", .flags = MS_NOSUID };
		if (one_mount(rootfd, &dev, cs->cg, &dev_done) < 0)
			return fail_at(f, 6);
	}
	for (uint32_t i = 0; i < c->nmounts; i++) {
		if (one_mount(rootfd, &c->mounts[i], cs->cg, &dev_done) < 0) {
			int e = errno;
			/* The failing mount's destination, for the message. */
			snprintf(f->what, sizeof(f->what), "%s", c->mounts[i].destination);
			errno = e;
			return fail_at(f, 6);
		}
	}
	if (c->options & CAP_CTR_READONLY &&
	    mount(NULL, root, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
		return fail_at(f, 5);
	if (chdir(root) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
	    chdir("/") < 0)
		return fail_at(f, 5);
	close(rootfd);
	/* The working directory, as runc makes it (a read-only root: the
	 * chdir then fails and says so). */
	if (cwd && *cwd) {
		struct stat st;
		if (stat(cwd, &st) < 0)
			cap_mkdir_p(cwd, 0755);
	}
	return 0;
}

/* --- UPDATE ------------------------------------------------------------------ */

/* Answer a stream as a FILE op is answered: EXIT 0, or a STDERR line and
 * EXIT start-failed. */
static void answer(uint32_t id, int e, const char *msg)
{
	if (e) {
		char line[600];
		int m = snprintf(line, sizeof(line), "capsule: %s\n", msg);
		cap_proto_put(&A.out, CAP_MSG_STDERR, id, line, (size_t)CAP_MIN(m, (int)sizeof(line) - 1));
	}
	struct cap_exit ex = { .kind = e ? CAP_EXIT_START_FAILED : CAP_EXIT_CODE, .value = e > 0 && e < 4096 ? e : 0 };
	if (e && !ex.value)
		ex.value = EIO;
	cap_proto_exit_encode(&A.out, id, &ex);
}

/* Remove what the directory fd holds (never through a link), then close
 * it: 0 or the first -errno. */
static int empty_dir(int fd, int depth)
{
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int r = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (unlinkat(dirfd(d), e->d_name, 0) == 0)
			continue;
		if (errno != EISDIR && errno != EPERM) {
			r = r ? r : -errno;
			continue;
		}
		int sub = depth < 4096 ? openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
		int k = sub < 0 ? -errno : empty_dir(sub, depth + 1);
		if (k == 0 && unlinkat(dirfd(d), e->d_name, AT_REMOVEDIR) < 0)
			k = -errno;
		r = r ? r : k;
	}
	closedir(d);
	return r;
}

/* The removal of a container's folder, in a child (it may be large). */
static void run_remove(const void *ud, int errfd, struct start_failure *f)
{
	const char *path = ud;
	(void)f;
	close(errfd);
	int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	int r = fd < 0 ? -errno : empty_dir(fd, 0);
	if (r == 0 && rmdir(path) < 0)
		r = -errno;
	if (r < 0 && r != -ENOENT) {
		fprintf(stderr, "capsule: cannot remove %s: %s\n", path, strerror(-r));
		_exit(1);
	}
	_exit(0);
}

void handle_update(uint32_t id, const uint8_t *p, size_t n)
{
	struct cap_update u;
	char msg[400] = "";
	if (id == 0 || exec_find(id) || agent_durable_waiting(id)) {
		send_error(id, EINVAL, "stream id %u is zero or already in use", id);
		return;
	}
	if (cap_proto_update_decode(p, n, &u) < 0) {
		answer(id, EBADMSG, "malformed UPDATE");
		return;
	}
	struct ctr *k = ctr_find(u.name);
	if (u.op == CAP_UPDATE_LIMITS) {
		if (!k) {
			snprintf(msg, sizeof(msg), "container %s is not in this VM", u.name);
			answer(id, ESRCH, msg);
			return;
		}
		int r = write_limits(k->cg, &u.limits, msg, sizeof(msg));
		answer(id, r < 0 ? -r : 0, msg);
		return;
	}
	/* REMOVE: every process of it, its cgroup (once its commands' are
	 * gone) and its folder. */
	if (k) {
		cg_kill(k->cg);
		for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
			if (A.execs[i].id && A.execs[i].ctr == (int)(k - ctrs) + 1)
				exec_kill(&A.execs[i]);
		cg_dispose(k->cg);
		if (k->nsfd >= 0)
			close(k->nsfd);
		memset(k, 0, sizeof(*k));
		k->nsfd = -1;
	}
	struct exec *x = free_slot();
	if (!x) {
		answer(id, EBUSY, "too many commands running");
		return;
	}
	static char path[CAP_CTR_NAME_MAX + 64];
	snprintf(path, sizeof(path), CAP_GUEST_CONTAINERS "/%s", u.name);
	static const struct cap_exec_req root_user = { .flags = CAP_EXEC_USER };
	struct spawn sp = { .name = path, .cwd = "/", .user = &root_user, .run = run_remove, .ud = path };
	spawn(id, x, &sp);
}

/* --- STATS ------------------------------------------------------------------- */

/* "key value" lines of a cgroup file (cpu.stat, memory.stat,
 * memory.events) into s as PREFIX.key. */
static void put_kv_file(struct cap_stats *s, int dirfd, const char *file, const char *prefix)
{
	char buf[8192];
	if (read_at(dirfd, file, buf, sizeof(buf)) <= 0)
		return;
	for (char *line = buf, *next; *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = '\0';
		else
			next = line + strlen(line);
		char *sp = strchr(line, ' ');
		if (!sp)
			continue;
		*sp = '\0';
		char key[CAP_STATS_KEY_MAX + 1];
		if ((size_t)snprintf(key, sizeof(key), "%s%s", prefix, line) < sizeof(key))
			cap_stats_put(s, key, strtoull(sp + 1, NULL, 10));
	}
}

/* A one-value cgroup file ("max" is CAP_LIMIT_NONE) as key. */
static void put_value_file(struct cap_stats *s, int dirfd, const char *file)
{
	char buf[64];
	if (read_at(dirfd, file, buf, sizeof(buf)) <= 0)
		return;
	cap_stats_put(s, file, strncmp(buf, "max", 3) == 0 ? CAP_LIMIT_NONE : strtoull(buf, NULL, 10));
}

/* The whole VM: the root cgroup's cpu.stat and memory.stat where the
 * kernel has them, the memory in use and the RAM from /proc/meminfo, the
 * tasks from /proc/loadavg. */
static void vm_stats(struct cap_stats *s)
{
	put_kv_file(s, A.cg_fd, "cpu.stat", "cpu.");
	put_kv_file(s, A.cg_fd, "memory.stat", "memory.stat.");
	char *mi = NULL;
	if (cap_read_file("/proc/meminfo", 1 << 16, &mi) >= 0) {
		char *t = strstr(mi, "MemTotal:"), *a = strstr(mi, "MemAvailable:");
		uint64_t total = t ? strtoull(t + 9, NULL, 10) << 10 : 0;
		uint64_t avail = a ? strtoull(a + 13, NULL, 10) << 10 : 0;
		cap_stats_put(s, "memory.current", total - CAP_MIN(avail, total));
		cap_stats_put(s, "memory.max", total);
		free(mi);
	}
	char *la = NULL;
	if (cap_read_file("/proc/loadavg", 256, &la) >= 0) {
		char *slash = strchr(la, '/');
		if (slash)
			cap_stats_put(s, "pids.current", strtoull(slash + 1, NULL, 10));
		free(la);
	}
}

void handle_stats(uint32_t id, const uint8_t *p, size_t n)
{
	char name[CAP_CTR_NAME_MAX + 1], msg[200];
	if (id == 0 || exec_find(id) || agent_durable_waiting(id)) {
		send_error(id, EINVAL, "stream id %u is zero or already in use", id);
		return;
	}
	if (cap_proto_stats_req_decode(p, n, name, sizeof(name)) < 0) {
		answer(id, EBADMSG, "malformed STATS");
		return;
	}
	static struct cap_stats s;
	memset(&s, 0, sizeof(s));
	if (A.cg_fd < 0) {
		answer(id, EOPNOTSUPP, "this guest has no cgroups");
		return;
	}
	if (!*name) {
		vm_stats(&s);
	} else {
		struct ctr *k = ctr_find(name);
		int fd = k ? openat(A.cg_fd, k->cg, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
		if (fd < 0) {
			snprintf(msg, sizeof(msg), "container %s is not in this VM", name);
			answer(id, ESRCH, msg);
			return;
		}
		put_kv_file(&s, fd, "cpu.stat", "cpu.");
		put_value_file(&s, fd, "memory.current");
		put_value_file(&s, fd, "memory.max");
		put_kv_file(&s, fd, "memory.stat", "memory.stat.");
		put_kv_file(&s, fd, "memory.events", "memory.events.");
		put_value_file(&s, fd, "pids.current");
		put_value_file(&s, fd, "pids.max");
		close(fd);
	}
	struct cap_buf b;
	cap_buf_init(&b);
	cap_proto_stats_encode(&b, &s);
	cap_proto_put(&A.out, CAP_MSG_STDOUT, id, cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	answer(id, 0, NULL);
}
