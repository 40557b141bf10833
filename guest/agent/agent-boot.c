/* The agent's start and end as PID 1: the console log line, the pseudo
 * file systems and the initramfs root, the kernel command line, the
 * virtio-serial port to the host, real-time priority, and SHUTDOWN
 * (stop everything, unmount the disks, sync, power off). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent-internal.h"
#include "layout.h"
#include "proto.h"
#include "util.h"

void agent_log(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "capsule-agent: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
}

__attribute__((noreturn)) void power_off(void)
{
	sync();
	reboot(RB_AUTOBOOT);	/* with reboot=t and -no-reboot, QEMU exits */
	for (;;)
		pause();
}

/* The layout's CAP_GUEST_AT_BOOT mounts (the source is named as the
 * type), each on a directory made for it; an optional one's directory is
 * removed where the kernel lacks it. */
static void mount_boot(void)
{
	size_t n;
	const struct cap_guest_mount *m = cap_guest_mounts(&n);
	for (size_t i = 0; i < n; i++) {
		if (!(m[i].attr & CAP_GUEST_AT_BOOT))
			continue;
		mkdir(m[i].path, 0755);
		if (mount(m[i].fstype, m[i].path, m[i].fstype, m[i].flags, m[i].data) < 0 && errno != EBUSY) {
			bool absent = (m[i].attr & CAP_GUEST_OPTIONAL) && errno == ENODEV;
			if (!absent)
				agent_log("mount %s on %s: %s", m[i].fstype, m[i].path, strerror(errno));
			if (m[i].attr & CAP_GUEST_OPTIONAL)
				rmdir(m[i].path);
		}
	}
}

void setup_system(void)
{
	mount_boot();
	/* The links a container's /dev has (runc makes them too); devtmpfs
	 * has none of them. */
	static const char *const links[][2] = {
		{ "/proc/self/fd", "/dev/fd" }, { "/proc/self/fd/0", "/dev/stdin" },
		{ "/proc/self/fd/1", "/dev/stdout" }, { "/proc/self/fd/2", "/dev/stderr" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(links); i++)
		if (symlink(links[i][0], links[i][1]) < 0 && errno != EEXIST)
			agent_log("symlink %s: %s", links[i][1], strerror(errno));

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
	/* The tool user's home, until SETUP mounts its disk there. */
	mkdir(CAP_GUEST_WORK, 0755);
	if (chown(CAP_GUEST_WORK, TOOL_UID, TOOL_GID) < 0)
		agent_log("chown " CAP_GUEST_WORK ": %s", strerror(errno));
	if (sethostname("capsule", 7) < 0)
		agent_log("sethostname: %s", strerror(errno));
}

bool cmdline_has(const char *word)
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
int open_port(void)
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

/* Run the agent ahead of every command: a fork bomb's hundreds of
 * runnable processes otherwise starve its poll loop for many seconds (the
 * timeout fires late, EXIT and the next EXEC wait). Real-time priority 1
 * wakes it at once; it sleeps in poll between events, and the kernel's
 * real-time throttling keeps 5% of the CPU for others. Its children start
 * as ordinary processes (SCHED_RESET_ON_FORK). */
void setup_priority(void)
{
	struct sched_param sp = { .sched_priority = 1 };
	if (sched_setscheduler(0, SCHED_FIFO | SCHED_RESET_ON_FORK, &sp) < 0)
		agent_log("cannot take real-time priority: %s; a fork bomb may delay "
		          "timeouts", strerror(errno));
}

/* --- SHUTDOWN --------------------------------------------------------- */

void do_shutdown(void)
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
	/* The data disks; only a writable one's failure matters. */
	size_t n;
	const struct cap_guest_mount *m = cap_guest_mounts(&n);
	for (size_t i = 0; i < n; i++)
		if ((m[i].attr & CAP_GUEST_FILE_ROOT) && umount2(m[i].path, 0) < 0 &&
		    !(m[i].flags & MS_RDONLY) && errno != EINVAL && errno != ENOENT)
			agent_log("unmount %s: %s", m[i].path, strerror(errno));
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
