/* Cgroups: one per command (and streaming FILE operation) under
 * /sys/fs/cgroup with its pids.max, entered at fork (clone3
 * CLONE_INTO_CGROUP), killed whole when the command ends, removed once
 * empty (killed again meanwhile). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent-internal.h"
#include "proto.h"
#include "util.h"

ssize_t read_at(int dirfd, const char *name, char *buf, size_t len)
{
	int fd = openat(dirfd, name, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, len - 1);
	int e = errno;
	close(fd);
	if (n < 0)
		return -e;
	buf[n] = '\0';
	return n;
}

int write_at(int dirfd, const char *name, const char *text)
{
	int fd = openat(dirfd, name, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = cap_write_all(fd, text, strlen(text));
	close(fd);
	return r;
}

/* Enable the pids controller for the root's children. The agent stays in
 * the root cgroup, which is exempt from the no-internal-processes rule,
 * so it is never limited or killed with a command. Without it, commands
 * run uncontained (process groups only), which the log says. */
void setup_cgroups(void)
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
	/* A pod's containers' limits (agent-ctr.c): memory.max, cpu.max. */
	static const char *const more[] = { "+memory", "+cpu" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(more); i++)
		if ((r = write_at(fd, "cgroup.subtree_control", more[i])) < 0)
			agent_log("cannot enable the %s controller: %s; containers' limits on it will fail",
				  more[i] + 1, strerror(-r));
	A.cg_fd = fd;
}

/* Make a new cgroup for one command with its pids.max; its name goes to
 * name and an open directory fd (for the child to enter) to *dirfd. */
int cg_create(const char *parent, uint32_t pids_max, char *name, size_t len, int *dirfd)
{
	char num[16];
	int r;

	snprintf(name, len, "%s%scmd-%llu", parent, *parent ? "/" : "", (unsigned long long)++A.cg_seq);
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
void cg_kill(const char *name)
{
	char path[CG_NAME_MAX + 24];
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
pid_t fork_into(int cgfd, bool *placed)
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
int cg_remove(const char *name)
{
	if (unlinkat(A.cg_fd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* Remove it now if it is empty, else keep trying from the loop. */
void cg_dispose(const char *name)
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
void cg_sweep(int64_t now)
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

/* Send sig to every process in the cgroup name (its cgroup.procs). */
void cg_signal(const char *name, int sig)
{
	char path[CG_NAME_MAX + 24];
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
