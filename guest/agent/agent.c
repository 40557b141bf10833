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
 * away ends the commands it started. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/fs.h>
#include <linux/openat2.h>
#include <linux/random.h>
#include <sys/fsuid.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/reboot.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "proto.h"
#include "util.h"

#define AGENT_VERSION "capsule-agent " CAPSULE_VERSION
#define READ_CHUNK (32 * 1024)
/* Stop reading command output while this much waits for the host. */
#define OUT_HIGH_WATER (1024 * 1024)
/* After a command's leader exits, wait this long for its pipes to close
 * (children it left behind may hold them open), counting only time in
 * which they were read (see finish_if_done). */
#define DRAIN_GRACE_MS 250
/* After a command's cgroup is killed, wait at most this long for it to
 * empty before sending EXIT (so the next command sees none of it); after
 * that EXIT goes anyway and the cgroup is removed later. */
#define CG_EMPTY_WAIT_MS 2000
/* Cgroups killed but not yet removed, across all commands. */
#define CG_PENDING_MAX 256
/* Kill a cgroup that has not emptied again after this long. */
#define CG_REKILL_MS 200

static const char *const base_env[] = {
	"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
	"HOME=/work", "USER=user", "LOGNAME=user", "SHELL=/bin/sh",
	"LANG=C.UTF-8",
};

struct exec {
	uint32_t id;	/* 0: free slot */
	pid_t pid;
	int out_fd, err_fd, in_fd;
	struct cap_buf in_pending;
	bool in_close;	/* host closed stdin: close once pending is written */
	int64_t start_ms, deadline_ms, exit_ms;
	int64_t drain_ms;	/* DRAIN_GRACE_MS runs from here */
	uint32_t cap;
	uint64_t sent;
	bool truncated, timed_out, exited;
	bool pty;	/* out_fd is a PTY master; in_fd a dup of it */
	bool no_sync;	/* report the end without flushing the disks */
	uint64_t flush_seq;	/* agent_durable_seq() when it started */
	int wstatus;
	char cg[24];	/* its cgroup under /sys/fs/cgroup, "" once removed */
	int64_t cg_kill_ms;	/* when it was last killed, 0: not yet */
};

static struct {
	int port;
	bool connected;
	struct cap_buf in, out;
	struct exec execs[CAP_PROTO_MAX_STREAMS];
	int sigfd;
	bool setup_done;
	int upper_fd;	/* O_PATH of the root's upper disk mount, -1 if none */
	int cg_fd;	/* /sys/fs/cgroup with +pids for children; -1: no containment */
	uint64_t cg_seq;	/* names cmd-<seq>, never reused in one boot */
	char cg_pending[CG_PENDING_MAX][24];	/* killed, to be removed */
	size_t cg_npending;
	int64_t cg_kill_ms;	/* last time the pending ones were killed again */
} A = { .port = -1, .sigfd = -1, .upper_fd = -1, .cg_fd = -1 };

void agent_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "capsule-agent: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

__attribute__((noreturn)) static void power_off(void)
{
	sync();
	reboot(RB_AUTOBOOT);	/* with reboot=t and -no-reboot, QEMU exits */
	for (;;)
		pause();
}

static void mount_one(const char *src, const char *dst, const char *type,
		      unsigned long flags, const char *data)
{
	mkdir(dst, 0755);
	if (mount(src, dst, type, flags, data) < 0 && errno != EBUSY)
		agent_log("mount %s on %s: %s", type, dst, strerror(errno));
}

static void setup_system(void)
{
	const unsigned long nsx = MS_NOSUID | MS_NOEXEC | MS_NODEV;

	mount_one("proc", "/proc", "proc", nsx, NULL);
	mount_one("sysfs", "/sys", "sysfs", nsx, NULL);
	mount_one("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755");
	mount_one("devpts", "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC,
		  "gid=5,mode=0620,ptmxmode=0666");
	mount_one("tmpfs", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	/* The links a container's /dev has (runc makes them too); devtmpfs
	 * has none of them. */
	static const char *const links[][2] = {
		{ "/proc/self/fd", "/dev/fd" }, { "/proc/self/fd/0", "/dev/stdin" },
		{ "/proc/self/fd/1", "/dev/stdout" }, { "/proc/self/fd/2", "/dev/stderr" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(links); i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			agent_log("symlink %s: %s", links[i][1], strerror(errno));
	/* POSIX message queues, which a container's root expects, when the
	 * kernel has them (CONFIG_POSIX_MQUEUE); without, no directory. */
	mkdir("/dev/mqueue", 0755);
	if (mount("mqueue", "/dev/mqueue", "mqueue", nsx, NULL) < 0 && errno != EBUSY) {
		if (errno != ENODEV)
			agent_log("mount mqueue on /dev/mqueue: %s", strerror(errno));
		rmdir("/dev/mqueue");
	}
	mount_one("tmpfs", "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");
	mount_one("tmpfs", "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755");
	mount_one("cgroup2", "/sys/fs/cgroup", "cgroup2", nsx, NULL);

	/* The kernel gave us /dev/console as 0-2 if the initramfs had it;
	 * make sure they are open either way. */
	if (fcntl(2, F_GETFD) < 0) {
		int fd = open("/dev/console", O_RDWR);
		if (fd >= 0) {
			dup2(fd, 0);
			dup2(fd, 1);
			dup2(fd, 2);
			if (fd > 2)
				close(fd);
		}
	}
	setvbuf(stderr, NULL, _IONBF, 0);

	/* The initramfs root comes up world-writable; it is not the tool
	 * user's to write. */
	chmod("/", 0755);
	/* Tool user's home; /work becomes a private disk in later versions. */
	mkdir("/work", 0755);
	if (chown("/work", TOOL_UID, TOOL_GID) < 0)
		agent_log("chown /work: %s", strerror(errno));
	if (sethostname("capsule", 7) < 0)
		agent_log("sethostname: %s", strerror(errno));
}

static bool cmdline_has(const char *word)
{
	char *s = NULL;
	if (cap_read_file("/proc/cmdline", 4096, &s) < 0)
		return false;
	bool found = false;
	for (char *tok = strtok(s, " \n"); tok; tok = strtok(NULL, " \n"))
		if (strcmp(tok, word) == 0)
			found = true;
	free(s);
	return found;
}

/* Find /dev/vportNpM whose name is "capsule.agent" (the number moves with
 * the device order, the name does not). */
static int open_port(void)
{
	for (int attempt = 0; attempt < 500; attempt++) {
		DIR *d = opendir("/sys/class/virtio-ports");
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (e->d_name[0] == '.')
				continue;
			char path[300], *name = NULL;
			snprintf(path, sizeof(path), "/sys/class/virtio-ports/%s/name", e->d_name);
			if (cap_read_file(path, 256, &name) < 0)
				continue;
			bool match = strcmp(name, "capsule.agent\n") == 0 ||
				     strcmp(name, "capsule.agent") == 0;
			free(name);
			if (!match)
				continue;
			snprintf(path, sizeof(path), "/dev/%s", e->d_name);
			int fd = open(path, O_RDWR | O_NONBLOCK | O_CLOEXEC);
			if (fd < 0)
				agent_log("open %s: %s", path, strerror(errno));
			closedir(d);
			return fd < 0 ? -errno : fd;
		}
		if (d)
			closedir(d);
		usleep(10000);
	}
	return -ENOENT;
}

/* --- output to the host --------------------------------------------- */

static void send_error(uint32_t id, int errnum, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_proto_error_encode(&A.out, id, errnum, msg);
}

/* Send command output within the exec's cap; at the cap, append the
 * truncation marker once and drop the rest. */
static void send_output(struct exec *x, enum cap_msg type, const uint8_t *p,
			size_t n)
{
	if (x->truncated)
		return;
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
static void flush_out_wait(int timeout_ms)
{
	int64_t end = cap_now_ms() + timeout_ms;
	while (A.connected && cap_buf_used(&A.out) > 0 && cap_now_ms() < end) {
		struct pollfd p = { .fd = A.port, .events = POLLOUT };
		poll(&p, 1, 50);
		flush_out();
	}
}

/* --- cgroups: one per command ----------------------------------------- */

static int write_at(int dirfd, const char *name, const char *text)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = cap_write_all(fd, text, strlen(text));
	close(fd);
	return r;
}

/* Run the agent ahead of every command: a fork bomb's hundreds of
 * runnable processes otherwise starve its poll loop for many seconds (the
 * timeout fires late, EXIT and the next EXEC wait). Real-time priority 1
 * wakes it at once; it sleeps in poll between events, and the kernel's
 * real-time throttling keeps 5% of the CPU for others. Its children start
 * as ordinary processes (SCHED_RESET_ON_FORK). */
static void setup_priority(void)
{
	struct sched_param sp = { .sched_priority = 1 };
	if (sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) < 0)
		agent_log("cannot take real-time priority: %s; a fork bomb may delay "
		          "timeouts", strerror(errno));
}

/* Enable the pids controller for the root's children. The agent stays in
 * the root cgroup, which is exempt from the no-internal-processes rule,
 * so it is never limited or killed with a command. Without it, commands
 * run uncontained (process groups only), which the log says. */
static void setup_cgroups(void)
{
	int fd = open("/sys/fs/cgroup", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	int r = fd < 0 ? -errno : write_at(fd, "cgroup.subtree_control", "+pids");
	if (r < 0) {
		agent_log("cannot enable the pids controller in /sys/fs/cgroup: %s; "
		          "commands will not be contained", strerror(-r));
		if (fd >= 0)
			close(fd);
		return;
	}
	A.cg_fd = fd;
}

/* Make a new cgroup for one command with its pids.max; its name goes to
 * name and an open directory fd (for the child to enter) to *dirfd. */
static int cg_create(uint32_t pids_max, char *name, size_t len, int *dirfd)
{
	char num[16];
	int r;

	snprintf(name, len, "cmd-%llu", (unsigned long long)++A.cg_seq);
	if (mkdirat(A.cg_fd, name, 0755) < 0)
		return -errno;
	int fd = openat(A.cg_fd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	snprintf(num, sizeof(num), "%u", pids_max ? pids_max : CAP_EXEC_PIDS_MAX_DEFAULT);
	r = fd < 0 ? -errno : write_at(fd, "pids.max", num);
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		unlinkat(A.cg_fd, name, AT_REMOVEDIR);
		return r;
	}
	*dirfd = fd;
	return 0;
}

/* SIGKILL every process in the cgroup. A process in the middle of fork
 * can still slip through (its child joins the cgroup after the walk), so
 * a cgroup that does not empty is killed again (CG_REKILL_MS). */
static void cg_kill(const char *name)
{
	char path[48];
	snprintf(path, sizeof(path), "%s/cgroup.kill", name);
	int r = write_at(A.cg_fd, path, "1");
	if (r < 0 && r != -ENOENT)
		agent_log("cannot kill cgroup %s: %s", name, strerror(-r));
}

/* fork() straight into the cgroup cgfd (clone3 CLONE_INTO_CGROUP, Linux
 * 5.7): moving a process in afterwards by cgroup.procs waits for an RCU
 * grace period, milliseconds on every command. *placed says whether it
 * happened; on an older kernel it is a plain fork and the child moves
 * itself. The agent has one thread, so a raw clone3 is as safe as fork. */
static pid_t fork_into(int cgfd, bool *placed)
{
	struct {
		uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls,
			set_tid, set_tid_size, cgroup;
	} args = { .flags = 0x200000000ULL /* CLONE_INTO_CGROUP */, .exit_signal = SIGCHLD,
		   .cgroup = (uint64_t)cgfd };
	*placed = false;
	if (cgfd >= 0) {
		long r = syscall(SYS_clone3, &args, sizeof(args));
		if (r >= 0) {
			*placed = true;
			return (pid_t)r;
		}
		if (errno != ENOSYS && errno != E2BIG && errno != EINVAL)
			return -1;
	}
	return fork();
}

/* Remove a killed cgroup: 0 when gone, -EBUSY while processes remain. */
static int cg_remove(const char *name)
{
	if (unlinkat(A.cg_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* Remove it now if it is empty, else keep trying from the loop. */
static void cg_dispose(const char *name)
{
	if (cg_remove(name) == 0)
		return;
	if (A.cg_npending == CG_PENDING_MAX) {
		agent_log("too many cgroups waiting to be removed; leaving %s", name);
		return;
	}
	snprintf(A.cg_pending[A.cg_npending++], sizeof(A.cg_pending[0]), "%s", name);
}

/* Retry the removal of killed cgroups, killing them again meanwhile. */
static void cg_sweep(int64_t now)
{
	bool rekill = now - A.cg_kill_ms >= CG_REKILL_MS;
	if (rekill)
		A.cg_kill_ms = now;
	for (size_t i = 0; i < A.cg_npending;) {
		if (cg_remove(A.cg_pending[i]) == 0) {
			memmove(A.cg_pending[i], A.cg_pending[--A.cg_npending], sizeof(A.cg_pending[0]));
			continue;
		}
		if (rekill)
			cg_kill(A.cg_pending[i]);
		i++;
	}
}

/* --- commands --------------------------------------------------------- */

static struct exec *exec_find(uint32_t id)
{
	if (id == 0)
		return NULL;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id == id)
			return &A.execs[i];
	return NULL;
}

/* End a command: its whole cgroup, or its process group without one. */
static void exec_kill(struct exec *x)
{
	if (x->cg[0]) {
		cg_kill(x->cg);
		x->cg_kill_ms = cap_now_ms();
	} else if (!x->exited)
		kill(-x->pid, SIGKILL);
}

/* Send sig to every process in the cgroup name (its cgroup.procs). */
static void cg_signal(const char *name, int sig)
{
	char path[48];
	snprintf(path, sizeof(path), "%s/cgroup.procs", name);
	int fd = openat(A.cg_fd, path, O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		agent_log("cannot read %s: %s", path, strerror(errno));
		return;
	}
	FILE *f = fdopen(fd, "r");
	long pid;
	while (f && fscanf(f, "%ld", &pid) == 1)
		if (pid > 1)
			kill((pid_t)pid, sig);
	if (f)
		fclose(f);
	else
		close(fd);
}

/* A SIGNAL to a running command, to whom scope says: its process group
 * (SIGKILL: its whole cgroup, as when it ends), its process alone, or
 * every process in its cgroup (without cgroups, its group). */
static void exec_signal(struct exec *x, int sig, uint32_t scope)
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

static void close_fd(int *fd)
{
	if (*fd >= 0)
		close(*fd);
	*fd = -1;
}

static void exec_release(struct exec *x)
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

struct start_failure {
	int stage;	/* 0 chdir, 1 exec, 2 credentials, 3 cgroup, 4 rlimits */
	int errnum;
};

/* How a child starts: what commands and the streaming FILE operations
 * share (pipes, cgroup, the tool user, the exec slot). */
struct spawn {
	bool stdin_pipe;	/* a pipe fed by STDIN frames, else /dev/null */
	bool pty;	/* on a pseudo-terminal of rows x cols */
	uint16_t rows, cols;
	uint32_t pids_max, output_cap, timeout_ms;
	const char *name;	/* named by a start failure: the command, the path */
	const char *cwd;	/* named by a chdir failure */
	bool no_sync;	/* its end is reported without a flush */
	/* A CAP_EXEC_USER command's request: its uid, gid, groups, rlimits
	 * and umask; NULL: the tool user. */
	const struct cap_exec_req *user;
	/* In the child, as its user in its cgroup with fds 0-2 set:
	 * exec or run. Returns only when that failed, with *f set; errfd
	 * (close-on-exec) reports that, or closes to say all went well. */
	void (*run)(const void *ud, int errfd, struct start_failure *f);
	const void *ud;
};

/* In the child, as root: take a CAP_EXEC_USER request's rlimits (first:
 * raising a hard limit needs root), its stdio pipes, groups, gid, uid and
 * umask. */
static int take_user(const struct cap_exec_req *req, struct start_failure *f)
{
	for (uint32_t i = 0; i < req->nrlimits; i++) {
		const struct cap_exec_rlimit *l = &req->rlimits[i];
		struct rlimit rl = { .rlim_cur = (rlim_t)l->soft, .rlim_max = (rlim_t)l->hard };
		if (setrlimit((int)l->resource, &rl) < 0) {
			*f = (struct start_failure){ 4, errno };
			return -1;
		}
	}
	/* The stdio pipes become the user's, so that it can open them again
	 * as /dev/stdout or /proc/self/fd/N (runc's fixStdioPermissions). */
	for (int fd = 0; fd <= 2; fd++) {
		struct stat st;
		if (fstat(fd, &st) == 0 && S_ISFIFO(st.st_mode) && fchown(fd, req->uid, req->gid) < 0) {
			*f = (struct start_failure){ 2, errno };
			return -1;
		}
	}
	gid_t groups[CAP_EXEC_MAX_GROUPS];
	for (uint32_t i = 0; i < req->ngroups; i++)
		groups[i] = req->groups[i];
	if (setgroups(req->ngroups, groups) < 0 || setgid(req->gid) < 0 || setuid(req->uid) < 0) {
		*f = (struct start_failure){ 2, errno };
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
	struct start_failure f = { 2, 0 };
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
		uid_t owner = sp->user ? sp->user->uid : TOOL_UID;
		if (t < 0 || ioctl(t, TIOCSCTTY, 0) < 0 || fchown(t, owner, 5) < 0) {
			f.errnum = errno;
			goto fail;
		}
		in = out = err = t;
	}
	dup2(in, 0);
	dup2(out, 1);
	dup2(err, 2);
	if (sp->user) {
		if (take_user(sp->user, &f) < 0)
			goto fail;
	} else if (setgroups(0, NULL) < 0 || setgid(TOOL_GID) < 0 ||
		   setuid(TOOL_UID) < 0) {
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

/* A command's directory: the request's, else /work for the tool user and
 * / for a CAP_EXEC_USER command. */
static const char *exec_cwd(const struct cap_exec_req *req)
{
	if (req->cwd && req->cwd[0])
		return req->cwd;
	return req->flags & CAP_EXEC_USER ? "/" : "/work";
}

/* A command's run: its directory, its environment, exec. */
static void run_exec(const void *ud, int errfd, struct start_failure *f)
{
	const struct exec_job *j = ud;
	(void)errfd;	/* close-on-exec: a successful exec closes it */
	const char *cwd = exec_cwd(j->req);
	if (chdir(cwd) < 0) {
		*f = (struct start_failure){ 0, errno };
		return;
	}
	environ = j->env;
	execvp(j->req->argv[0], j->req->argv);
	*f = (struct start_failure){ 1, errno };
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
static void spawn(uint32_t id, struct exec *x, const struct spawn *sp)
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

	char cg[24] = "";
	int cgfd = -1;
	if (A.cg_fd >= 0 && (ok = cg_create(sp->pids_max, cg, sizeof(cg), &cgfd)) < 0) {
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
				   sp->user ? "cannot take the requested uid, gid and groups for" :
				   "cannot switch to the tool user for";
		const char *arg = f.stage == 0 ? sp->cwd : sp->name;
		char msg[600];
		int m = snprintf(msg, sizeof(msg), "capsule: %s '%s': %s\n", what,
				 pid < 0 ? "" : arg, strerror(e));
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
static struct exec *free_slot(void)
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

static void handle_exec(uint32_t id, const uint8_t *p, size_t n)
{
	struct cap_exec_req req;
	struct cap_err err = { 0 };
	struct exec *x;

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
	/* A container's directory is made when missing, as root, as runc
	 * does; a chdir failure is then reported as for any command. */
	if (user && req.cwd && req.cwd[0])
		make_dirs(req.cwd);
	char *home;
	struct exec_job job = { &req, make_env(&req, &home) };
	struct spawn sp = {
		.stdin_pipe = req.flags & CAP_EXEC_STDIN, .pty = req.flags & CAP_EXEC_PTY,
		.rows = req.rows, .cols = req.cols, .pids_max = req.pids_max,
		.output_cap = req.output_cap, .timeout_ms = req.timeout_ms,
		.name = req.argv[0], .cwd = exec_cwd(&req), .user = user ? &req : NULL,
		.no_sync = req.flags & CAP_EXEC_NO_SYNC, .run = run_exec, .ud = &job,
	};
	spawn(id, x, &sp);
	free(job.env);
	free(home);
	cap_exec_req_fini(&req);
}

/* Whether a command or transfer other than except runs (or ends). */
static bool others_running(const struct exec *except)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id && &A.execs[i] != except)
			return true;
	return false;
}

/* reading: its pipes were polled for reading in this round (no backlog
 * to the host stopped it). */
static void finish_if_done(struct exec *x, int64_t now, bool reading)
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
	/* What it wrote is on the host's disks before its end is told. */
	agent_durable_exit(&A.out, x->id, &ex, !x->no_sync, others_running(x), x->flush_seq);
	exec_release(x);
}

static void kill_all_execs(void)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(A.execs); i++)
		if (A.execs[i].id)
			exec_kill(&A.execs[i]);
}

static void reap(void)
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
				/* Nothing it started outlives it. */
				exec_kill(x);
			}
		}
	}
}

static void do_shutdown(void)
{
	agent_log("shutdown requested: stopping commands and syncing");
	kill_all_execs();
	kill(-1, SIGKILL);
	/* Let the killed processes go, so that no file stays open for
	 * writing, then unmount the private disks cleanly. */
	for (int i = 0; i < 50 && waitpid(-1, NULL, WNOHANG) >= 0; i++)
		usleep(2000);
	sync();
	/* The disks' watches hold them open: closed before the unmount. */
	agent_durable_shutdown(&A.out);
	umount2("/source", 0);
	static const char *const disks[] = { "/work", "/workspace" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(disks); i++)
		if (umount2(disks[i], 0) < 0 && errno != EINVAL && errno != ENOENT)
			agent_log("unmount %s: %s", disks[i], strerror(errno));
	if (A.upper_fd >= 0) {
		char p[64];
		snprintf(p, sizeof(p), "/proc/self/fd/%d", A.upper_fd);
		if (mount(NULL, p, NULL, MS_REMOUNT | MS_RDONLY, NULL) < 0)
			agent_log("remount the root's upper disk read-only: %s", strerror(errno));
	}
	sync();
	cap_proto_put(&A.out, CAP_MSG_SHUTDOWN, 0, NULL, 0);
	flush_out_wait(2000);
	power_off();
}

/* --- SETUP: disks and the root file system ---------------------------- */

/* Find /dev/vdX whose virtio-blk serial is serial. */
static int find_disk(const char *serial, char *dev, size_t len)
{
	DIR *d = opendir("/sys/block");
	struct dirent *e;
	int r = -ENOENT;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "vd", 2) != 0 || strlen(e->d_name) > 16)
			continue;
		char path[300], *s = NULL;
		snprintf(path, sizeof(path), "/sys/block/%s/serial", e->d_name);
		if (cap_read_file(path, 256, &s) < 0)
			continue;
		s[strcspn(s, "\n")] = '\0';
		bool match = strcmp(s, serial) == 0;
		free(s);
		if (match) {
			snprintf(dev, len, "/dev/%.16s", e->d_name);
			r = 0;
			break;
		}
	}
	if (d)
		closedir(d);
	return r;
}

/* Drop cached blocks of a disk: a restored guest may have read the
 * template's placeholder at the same place. */
static void flush_disk(const char *dev)
{
	int fd = open(dev, O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ioctl(fd, BLKFLSBUF, 0);
		close(fd);
	}
}

/* shown: what commands call a writable disk (its end flushes it). */
static int mount_disk(const char *serial, const char *dst, const char *type,
		      unsigned long flags, const char *shown, char *msg, size_t mlen)
{
	char dev[64];
	if (find_disk(serial, dev, sizeof(dev)) < 0) {
		snprintf(msg, mlen, "no disk with serial %s", serial);
		return -ENOENT;
	}
	mkdir(dst, 0755);
	flush_disk(dev);
	if (mount(dev, dst, type, flags, NULL) < 0) {
		int e = errno;
		snprintf(msg, mlen, "cannot mount %s (%s, serial %s) on %s: %s",
			 dev, type, serial, dst, strerror(e));
		return -e;
	}
	if (!(flags & MS_RDONLY))
		agent_durable_add(dst, dev, shown);
	return 0;
}

/* One of SETUP's tmpfs mounts, in the final root: its destination
 * resolved in that root and made (mkdir -p, 0755 root's) where missing,
 * refused where it resolves to a guest's own mount point or is not a
 * directory (nothing else runs in the guest yet, so what is checked is
 * what is mounted on), then the tmpfs with its data and flags. */
static int mount_tmpfs(const struct cap_setup_tmpfs *t, char *msg, size_t mlen)
{
	/* Symbolic links on the way are followed as runc follows them in the
	 * container's root (Debian's /var/run -> /run): the agent is chrooted
	 * into the final root, so a link cannot lead out of it; where it leads
	 * is checked below. The deepest part of the destination that exists is
	 * resolved; the rest is made, directory by directory. */
	char path[sizeof(t->destination)], real[PATH_MAX];
	snprintf(path, sizeof(path), "%s", t->destination);
	size_t keep = strlen(path);
	char rest[sizeof(t->destination)] = "";
	for (;;) {
		if (realpath(keep ? path : "/", real))
			break;
		if (errno != ENOENT || keep <= 1) {
			int r = -errno;
			snprintf(msg, mlen, "tmpfs at %.120s: cannot resolve %.120s: %s", t->destination, path, strerror(-r));
			return r;
		}
		char *slash = strrchr(path, '/');
		snprintf(rest, sizeof(rest), "%s%s", slash, t->destination + keep);
		*slash = '\0';
		keep = strlen(path);
	}
	char target[PATH_MAX + sizeof(t->destination)];
	snprintf(target, sizeof(target), "%s%s", strcmp(real, "/") == 0 ? "" : real, rest);
	if (!target[0])
		snprintf(target, sizeof(target), "/");
	static const char *const own[] = { "/proc", "/sys", "/dev", "/work", "/source", "/workspace" };
	bool reserved = strcmp(target, "/") == 0;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(own) && !reserved; i++) {
		size_t n = strlen(own[i]);
		reserved = strncmp(target, own[i], n) == 0 && (target[n] == '\0' || target[n] == '/');
	}
	if (reserved) {
		snprintf(msg, mlen, "tmpfs at %.120s (%.120s): the guest's own mount point, which a container's tmpfs cannot replace",
			 t->destination, target);
		return -EINVAL;
	}
	/* Make what is missing (a name that exists now is a dangling link or
	 * not a directory: refused below). */
	int r = cap_mkdir_p(target, 0755);
	if (r < 0) {
		snprintf(msg, mlen, "tmpfs at %.120s: cannot make %.120s: %s", t->destination, target, strerror(-r));
		return r;
	}
	struct stat st;
	if (lstat(target, &st) < 0 || !S_ISDIR(st.st_mode)) {
		snprintf(msg, mlen, "tmpfs at %.120s: %.120s is not a directory; give the container a destination that is one",
			 t->destination, target);
		return -ENOTDIR;
	}
	if (mount("tmpfs", target, "tmpfs", t->flags, t->data[0] ? t->data : NULL) < 0) {
		int r = -errno;
		snprintf(msg, mlen, "cannot mount a tmpfs at %s (%.100s): %s", t->destination,
			 t->data[0] ? t->data : "no options", strerror(-r));
		return r;
	}
	return 0;
}

/* Copy the image's tree at src (its /run: a container's files such as
 * /run/.containerenv, seeded into the upper layer) into the tmpfs about
 * to cover it: directories, symbolic links and regular files up to 1 MiB,
 * with their modes and owners. Best effort, depth-bounded; what cannot be
 * copied is logged. */
static void copy_small_tree(int src, int dst, int depth)
{
	DIR *d = fdopendir(src);
	if (!d) {
		close(src);
		return;
	}
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		if (S_ISDIR(st.st_mode) && depth < 8) {
			mkdirat(dst, e->d_name, st.st_mode & 07777);
			int s2 = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			int d2 = openat(dst, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (s2 >= 0 && d2 >= 0)
				copy_small_tree(s2, d2, depth + 1);
			else if (s2 >= 0)
				close(s2);
			if (d2 >= 0) {
				fchownat(dst, e->d_name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
				fchmodat(dst, e->d_name, st.st_mode & 07777, 0);
				close(d2);
			}
		} else if (S_ISLNK(st.st_mode)) {
			char t[4096];
			ssize_t n = readlinkat(dirfd(d), e->d_name, t, sizeof(t) - 1);
			if (n > 0) {
				t[n] = '\0';
				if (symlinkat(t, dst, e->d_name) == 0)
					fchownat(dst, e->d_name, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW);
			}
		} else if (S_ISREG(st.st_mode) && st.st_size <= (1 << 20)) {
			int in = openat(dirfd(d), e->d_name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			int out = openat(dst, e->d_name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
					 st.st_mode & 07777);
			char buf[16384];
			ssize_t n = 0;
			while (in >= 0 && out >= 0 && (n = read(in, buf, sizeof(buf))) > 0)
				if (write(out, buf, (size_t)n) != n)
					break;
			if (out >= 0) {
				fchown(out, st.st_uid, st.st_gid);
				fchmod(out, st.st_mode & 07777);
				close(out);
			}
			if (in >= 0)
				close(in);
		} else {
			agent_log("the image's /run/%s is not copied into the guest's /run", e->d_name);
		}
	}
	closedir(d);
}

/* Make sure the tool user has a name in the image's /etc/passwd (the
 * write lands in the upper layer). */
static void ensure_tool_user(void)
{
	char *s = NULL;
	if (cap_read_file("/etc/passwd", 1u << 20, &s) < 0)
		return;
	bool have = strstr(s, ":x:1000:") != NULL;
	free(s);
	if (have)
		return;
	FILE *f = fopen("/etc/passwd", "a");
	if (f) {
		fputs("user:x:1000:1000:user:/work:/bin/sh\n", f);
		fclose(f);
	}
	f = fopen("/etc/group", "a");
	if (f) {
		fputs("user:x:1000:\n", f);
		fclose(f);
	}
}

/* A VM restored from a template shares its random state and its clock
 * with every other clone: take the host's. */
static void fresh_start(const struct cap_setup *s)
{
	struct timespec ts = { .tv_sec = s->realtime_ns / 1000000000, .tv_nsec = s->realtime_ns % 1000000000 };
	if (s->realtime_ns > 0 && clock_settime(CLOCK_REALTIME, &ts) < 0)
		agent_log("cannot set the clock: %s", strerror(errno));
	struct {
		int entropy_count;
		int buf_size;
		uint8_t buf[sizeof(s->seed)];
	} e = { (int)sizeof(s->seed) * 8, (int)sizeof(s->seed), { 0 } };
	memcpy(e.buf, s->seed, sizeof(s->seed));
	int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC);
	if (fd < 0 || ioctl(fd, RNDADDENTROPY, &e) < 0 || ioctl(fd, RNDRESEEDCRNG) < 0)
		agent_log("cannot seed the random pool: %s", strerror(errno));
	if (fd >= 0)
		close(fd);
}

static int do_setup(const struct cap_setup *s, char *msg, size_t mlen)
{
	const char *root = "/";
	int r;

	fresh_start(s);
	agent_env_reset();
	agent_durable_close();	/* a SETUP tried again starts over */
	if (s->root_readonly && !*s->root_image) {
		snprintf(msg, mlen, "a read-only root needs a root image; this SETUP names none");
		return -EINVAL;
	}
	if (*s->root_image) {
		/* Overlay root: the image read-only below, an ext4 disk
		 * above; then move into it, taking the pseudo file systems
		 * along. */
		mkdir("/.capsule", 0700);
		/* nodev, nosuid as /work: an image's device nodes or setuid
		 * files are not a way to more privilege (imports drop device
		 * nodes too; /dev is the devtmpfs moved in below). */
		if ((r = mount_disk(s->root_image, "/.capsule/lower", "erofs",
				    MS_RDONLY | MS_NODEV | MS_NOSUID, NULL, msg, mlen)) < 0)
			return r;
		const char *opts = "lowerdir=/.capsule/lower";
		char buf[256];
		if (*s->root_upper) {
			if ((r = mount_disk(s->root_upper, "/.capsule/upper", "ext4",
					    MS_NODEV | MS_NOSUID, "the root's upper disk", msg, mlen)) < 0)
				return r;
			mkdir("/.capsule/upper/data", 0755);
			mkdir("/.capsule/upper/work", 0755);
			A.upper_fd = open("/.capsule/upper", O_PATH | O_CLOEXEC);
			snprintf(buf, sizeof(buf), "lowerdir=/.capsule/lower,upperdir=/.capsule/upper/data,workdir=/.capsule/upper/work");
			opts = buf;
		}
		mkdir("/.capsule/root", 0755);
		if (mount("overlay", "/.capsule/root", "overlay", MS_NODEV | MS_NOSUID, opts) < 0) {
			r = -errno;
			snprintf(msg, mlen, "cannot mount the overlay root: %s", strerror(-r));
			return r;
		}
		if (*s->root_upper)
			agent_durable_add_overlay("/.capsule/root", "/.capsule/upper");
		root = "/.capsule/root";
	}

	char path[256];
	if (*s->work) {
		snprintf(path, sizeof(path), "%s/work", root);
		if ((r = mount_disk(s->work, path, "ext4", MS_NOSUID | MS_NODEV, "/work", msg, mlen)) < 0)
			return r;
	}
	if (s->workspace && *s->workspace) {
		snprintf(path, sizeof(path), "%s/workspace", root);
		if ((r = mount_disk(s->workspace, path, "ext4", MS_NOSUID | MS_NODEV, "/workspace", msg, mlen)) < 0)
			return r;
	}
	if (*s->source) {
		snprintf(path, sizeof(path), "%s/source", root);
		if ((r = mount_disk(s->source, path, "erofs",
				    MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL, msg, mlen)) < 0)
			return r;
	}
	if (*s->hostname && sethostname(s->hostname, strlen(s->hostname)) < 0)
		agent_log("sethostname %s: %s", s->hostname, strerror(errno));

	if (strcmp(root, "/") != 0) {
		static const char *const moved[] = { "/dev", "/proc", "/sys", "/tmp", "/run" };
		/* The tmpfs /run covers the image's: what the image (or its
		 * seeded upper layer) holds there is copied in first. */
		snprintf(path, sizeof(path), "%s/run", root);
		int rsrc = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		int rdst = open("/run", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rsrc >= 0 && rdst >= 0)
			copy_small_tree(rsrc, rdst, 0);
		else if (rsrc >= 0)
			close(rsrc);
		if (rdst >= 0)
			close(rdst);
		for (size_t i = 0; i < CAP_ARRAY_SIZE(moved); i++) {
			snprintf(path, sizeof(path), "%s%s", root, moved[i]);
			mkdir(path, 0755);
			if (mount(moved[i], path, NULL, MS_MOVE, NULL) < 0) {
				r = -errno;
				snprintf(msg, mlen, "cannot move %s into the new root: %s", moved[i], strerror(-r));
				return r;
			}
		}
		if (chdir(root) < 0 || mount(".", "/", NULL, MS_MOVE, NULL) < 0 ||
		    chroot(".") < 0 || chdir("/") < 0) {
			r = -errno;
			snprintf(msg, mlen, "cannot switch to the new root: %s", strerror(-r));
			return r;
		}
		ensure_tool_user();
	}
	if (*s->work && chown("/work", TOOL_UID, TOOL_GID) < 0)
		agent_log("chown /work: %s", strerror(errno));
	/* A new workspace disk holds the host user's files: the tool user's
	 * from now on, once (its root directory says whether it is done). */
	struct stat st;
	if (s->workspace && *s->workspace && lstat("/workspace", &st) == 0 && st.st_uid != TOOL_UID)
		agent_workspace_own("/workspace");
	/* In the final root, so that /etc's files are the ones commands see. */
	if (s->net_addr && (r = agent_net_setup(s, msg, mlen)) < 0)
		return r;
	if ((r = agent_ca_setup(s, msg, mlen)) < 0)
		return r;
	/* Last: the host's own variables win over the agent's defaults. */
	for (uint32_t i = 0; i < s->envc; i++)
		agent_env_put(s->env[i]);
	/* The container's tmpfs mounts, over what the root holds there
	 * (never copied in: no tmpcopyup), while the root is still writable
	 * for their directories. */
	for (uint32_t i = 0; i < s->ntmpfs; i++)
		if ((r = mount_tmpfs(&s->tmpfs[i], msg, mlen)) < 0)
			return r;
	/* A read-only root (an OCI config's root.readonly) once everything
	 * in it is written (/etc/passwd, the network's and the CA's files):
	 * only the overlay's own mount turns read-only; /dev, /proc, /sys,
	 * /tmp, /run, /work, /workspace and /source are mounts of their own
	 * and keep their modes. A bind remount replaces the mount's flags,
	 * so the overlay's nodev,nosuid are given again. */
	if (s->root_readonly &&
	    mount(NULL, "/", NULL, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NODEV | MS_NOSUID, NULL) < 0) {
		r = -errno;
		snprintf(msg, mlen, "cannot make the root file system read-only: %s", strerror(-r));
		return r;
	}
	return 0;
}

static void handle_setup(const uint8_t *p, size_t n)
{
	struct cap_setup s;
	char msg[512] = "";
	int r;

	if (A.setup_done) {
		r = -EALREADY;
		snprintf(msg, sizeof(msg), "SETUP was already done in this VM");
	} else if (cap_proto_setup_decode(p, n, &s) < 0) {
		r = -EBADMSG;
		snprintf(msg, sizeof(msg), "malformed SETUP");
	} else {
		r = do_setup(&s, msg, sizeof(msg));
		A.setup_done = r == 0;
		if (r < 0)
			agent_env_reset();	/* nothing half set up */
		if (r == 0 && s.net_addr && s.auto_publish)
			agent_publish_start(s.net_addr);
		cap_setup_fini(&s);
	}
	if (r < 0)
		agent_log("setup failed: %s", msg);
	uint8_t buf[4 + 512];
	size_t mn = strlen(msg);
	cap_put_u32(buf, (uint32_t)-r);
	memcpy(buf + 4, msg, mn);
	cap_proto_put(&A.out, CAP_MSG_SETUP, 0, buf, 4 + mn);
}

/* --- FILE: one path inside /source, /work or /workspace ------------------ */

/* Fail a FILE stream: a line on STDERR naming the path and the rule, then
 * EXIT "could not start" with the errno. */
static void file_fail(uint32_t id, int e, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	int m = vsnprintf(msg, sizeof(msg) - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		m = 0;
	if ((size_t)m > sizeof(msg) - 2)
		m = sizeof(msg) - 2;
	msg[m++] = '\n';
	cap_proto_put(&A.out, CAP_MSG_STDERR, id, msg, (size_t)m);
	struct cap_exit ex = { .kind = CAP_EXIT_START_FAILED, .value = e > 0 && e < 4096 ? e : EIO };
	cap_proto_exit_encode(&A.out, id, &ex);
}

static void put_chunked(uint32_t id, const uint8_t *p, size_t n)
{
	while (n > 0) {
		size_t k = CAP_MIN(n, (size_t)(32 * 1024));
		cap_proto_put(&A.out, CAP_MSG_STDOUT, id, p, k);
		p += k;
		n -= k;
	}
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static void file_list(uint32_t id, int fd, const char *shown, uint32_t max)
{
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		file_fail(id, errno, "cannot list %s: %s", shown, strerror(errno));
		return;
	}
	size_t n = 0, cap = 64;
	char **names = xmalloc(cap * sizeof(char *));
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		if (n == cap)
			names = xrealloc(names, (cap *= 2) * sizeof(char *));
		names[n++] = xstrdup(e->d_name);
	}
	qsort(names, n, sizeof(char *), cmp_cstr);
	struct cap_buf b;
	cap_buf_init(&b);
	for (size_t i = 0; i < n && i < max; i++) {
		struct stat st;
		char line[600];
		int m;
		for (char *c = names[i]; *c; c++)
			if (*c == '\n')
				*c = '?';
		if (fstatat(dirfd(d), names[i], &st, AT_SYMLINK_NOFOLLOW) < 0)
			m = snprintf(line, sizeof(line), "o %s\n", names[i]);
		else if (S_ISDIR(st.st_mode))
			m = snprintf(line, sizeof(line), "d %s\n", names[i]);
		else if (S_ISREG(st.st_mode))
			m = snprintf(line, sizeof(line), "f %lld %s\n", (long long)st.st_size, names[i]);
		else if (S_ISLNK(st.st_mode))
			m = snprintf(line, sizeof(line), "l %s\n", names[i]);
		else
			m = snprintf(line, sizeof(line), "o %s\n", names[i]);
		cap_buf_append(&b, line, (size_t)CAP_MIN(m, (int)sizeof(line) - 1));
	}
	closedir(d);
	put_chunked(id, cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 1, .flags = n > max ? CAP_EXIT_TRUNCATED : 0 };
	cap_proto_exit_encode(&A.out, id, &ex);
	for (size_t i = 0; i < n; i++)
		free(names[i]);
	free(names);
}

static void file_read(uint32_t id, int fd, const char *shown, uint32_t limit)
{
	struct stat st;
	if (fstat(fd, &st) < 0) {
		file_fail(id, errno, "cannot read %s: %s", shown, strerror(errno));
		return;
	}
	if ((uint64_t)st.st_size > limit) {
		file_fail(id, EFBIG, "%s is %lld bytes, over the %u-byte limit for reading a file",
			  shown, (long long)st.st_size, limit);
		return;
	}
	uint8_t *buf = xmalloc((size_t)limit + 1);
	size_t len = 0;
	for (;;) {
		ssize_t k = read(fd, buf + len, (size_t)limit + 1 - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			free(buf);
			file_fail(id, errno, "cannot read %s: %s", shown, strerror(errno));
			return;
		}
		if (k == 0 || (len += (size_t)k) > limit)
			break;
	}
	if (len > limit) {	/* it grew while we read it */
		free(buf);
		file_fail(id, EFBIG, "%s is over the %u-byte limit for reading a file", shown, limit);
		return;
	}
	put_chunked(id, buf, len);
	free(buf);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
	cap_proto_exit_encode(&A.out, id, &ex);
}

/* A streaming operation's run in the child: say it started, do it. */
static void run_xfer(const void *ud, int errfd, struct start_failure *f)
{
	(void)f;
	close(errfd);
	agent_xfer_run(ud);
}

/* MANIFEST, TAR_OUT, TAR_IN: a child as the tool user in its own cgroup,
 * answered like a command (no timeout, no output cap). */
static void file_stream(uint32_t id, const struct cap_file_req *req, const char *shown)
{
	uint32_t known = req->op == CAP_FILE_TAR_OUT ? CAP_TAR_PATHS_STDIN | CAP_TAR_PREFIX :
			 req->op == CAP_FILE_TAR_IN ? CAP_TAR_NO_REPLACE | CAP_FILE_NO_SYNC : 0;
	if (req->limit & ~known) {
		file_fail(id, EINVAL, "%s: unknown flags 0x%x for this file operation", shown, req->limit);
		return;
	}
	if (req->op == CAP_FILE_TAR_IN && strcmp(req->root, "/source") == 0) {
		file_fail(id, EROFS, "%s: only /work and /workspace can be written", shown);
		return;
	}
	struct exec *x = free_slot();
	if (!x) {
		file_fail(id, EBUSY, "%s: too many commands and transfers running (%d)", shown,
			  CAP_PROTO_MAX_STREAMS);
		return;
	}
	struct spawn sp = {
		.stdin_pipe = req->op == CAP_FILE_TAR_IN ||
			      (req->op == CAP_FILE_TAR_OUT && (req->limit & CAP_TAR_PATHS_STDIN)),
		.name = shown, .cwd = "/", .run = run_xfer, .ud = req,
		/* Only an upload writes: the reads report at once. */
		.no_sync = req->op != CAP_FILE_TAR_IN || (req->limit & CAP_FILE_NO_SYNC),
	};
	spawn(id, x, &sp);
}

static void handle_file(uint32_t id, const uint8_t *p, size_t n)
{
	struct cap_file_req req;
	char root[16], path[4100], shown[4200];
	if (id == 0 || exec_find(id) || agent_durable_waiting(id)) {
		send_error(id, EINVAL, "stream id %u is zero or already in use", id);
		return;
	}
	if (cap_proto_file_decode(p, n, &req, root, sizeof(root), path, sizeof(path)) < 0) {
		send_error(id, EBADMSG, "malformed FILE request (the root must be /source, /work or /workspace, the path relative without '..')");
		return;
	}
	snprintf(shown, sizeof(shown), "%s/%s", root, path);
	if (req.op >= CAP_FILE_MANIFEST) {
		snprintf(shown, sizeof(shown), "%s%s%s", root, *path ? "/" : "", path);
		file_stream(id, &req, shown);
		return;
	}
	if (req.op == CAP_FILE_WRITE && strcmp(root, "/work") != 0) {
		file_fail(id, EROFS, "%s: only /work can be written", shown);
		return;
	}
	int rootfd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0) {
		file_fail(id, errno, "%s is not available in this sandbox: %s", root, strerror(errno));
		return;
	}
	uint64_t since = agent_durable_seq();	/* a WRITE's writes come after this */
	/* Resolve beneath the root, as the tool user: no "..", no absolute
	 * or out-of-root symlink, no magic links, the user's permissions. */
	struct open_how how = {
		.flags = req.op == CAP_FILE_WRITE ? O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC
						 : O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC,
		.mode = req.op == CAP_FILE_WRITE ? 0644 : 0,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS,
	};
	setfsgid(TOOL_GID);
	setfsuid(TOOL_UID);
	int fd = (int)syscall(SYS_openat2, rootfd, *path ? path : ".", &how, sizeof(how));
	int e = errno;
	setfsuid(0);
	setfsgid(0);
	close(rootfd);
	if (fd < 0) {
		if (e == EXDEV)
			file_fail(id, e, "%s resolves outside %s (through '..' or a symbolic link); paths must stay inside their root",
				  shown, root);
		else
			file_fail(id, e, "cannot open %s: %s", shown, strerror(e));
		return;
	}
	struct stat st;
	if (fstat(fd, &st) < 0) {
		e = errno;
		close(fd);
		file_fail(id, e, "cannot stat %s: %s", shown, strerror(e));
		return;
	}
	if (req.op == CAP_FILE_WRITE) {
		int r = S_ISREG(st.st_mode) ? cap_write_all(fd, req.data, req.len) : -EINVAL;
		close(fd);
		if (r < 0) {
			file_fail(id, -r, "cannot write %s: %s", shown, strerror(-r));
			return;
		}
		struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
		agent_durable_exit(&A.out, id, &ex, !(req.limit & CAP_FILE_NO_SYNC), others_running(NULL),
				   since);
		return;
	}
	if (S_ISDIR(st.st_mode)) {
		file_list(id, fd, shown, req.limit_entries);
		return;
	}
	if (req.op == CAP_FILE_LIST) {
		close(fd);
		file_fail(id, ENOTDIR, "%s is not a directory", shown);
		return;
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		file_fail(id, EINVAL, "%s is not a regular file or a directory", shown);
		return;
	}
	file_read(id, fd, shown, req.limit);
	close(fd);
}

static void handle_frame(const struct cap_frame *f)
{
	struct exec *x;

	switch (f->type) {
	case CAP_MSG_HELLO:
		/* A host opening a session; what an earlier one started ends
		 * (a VM restored from a template may not have seen it go). */
		kill_all_execs();
		agent_durable_forget();
		A.out.off = A.out.len = 0;
		cap_proto_hello_encode(&A.out, AGENT_VERSION);
		agent_publish_resend();
		return;
	case CAP_MSG_EXEC:
		handle_exec(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_FILE:
		handle_file(f->stream, f->payload, f->len);
		return;
	case CAP_MSG_STDIN:
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
		agent_log("host disconnected; ending its commands");
	A.connected = false;
	kill_all_execs();
	agent_durable_forget();
	A.in.off = A.in.len = 0;
	A.out.off = A.out.len = 0;
}

static void serve(void)
{
	enum { MAXFD = 3 + 3 * CAP_PROTO_MAX_STREAMS };
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
		short pe = POLLIN;
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

		for (int i = 3; i < n; i++) {
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
