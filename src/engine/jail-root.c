/* The jail's private roots: the program's (its files, device nodes,
 * memory file, private proc) and its helpers', the copy of
 * spec.copy_file, the device probe (jail.h; docs/architecture.md, "The
 * jail"). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sched.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail-internal.h"
#include "paths.h"
#include "util.h"

/* Bind host file src at dst in the new root, read-only unless rw. */
static void bind_file(const struct child *c, const char *src, const char *dst,
		      unsigned long flags)
{
	char path[PATH_MAX + 64], what[PATH_MAX + 64];
	snprintf(path, sizeof(path), ROOT_MNT "%s", dst);
	char *slash = strrchr(path, '/');
	*slash = '\0';
	int r = cap_mkdir_p(path, 0755);
	*slash = '/';
	if (r < 0) {
		snprintf(what, sizeof(what), "creating %s in the jail", dst);
		jail_die(c, what, -r);
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
	if (fd >= 0)
		close(fd);
	if (mount(src, path, NULL, MS_BIND, NULL) < 0 ||
	    mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | flags, NULL) < 0) {
		snprintf(what, sizeof(what), "binding %s at %s in the jail", src, dst);
		jail_die(c, what, errno);
	}
}

int jail_root_node(const char *path, dev_t *rdev, struct cap_err *err)
{
	struct stat st;
	if (stat(path, &st) < 0)
		return cap_err_set(err, errno, "a jail cannot hold device %s: %s", path, strerror(errno));
	if (!S_ISCHR(st.st_mode))
		return cap_err_set(err, ENODEV, "a jail cannot hold device %s: it is not a character device (a jail makes character device nodes only)",
				   path);
	*rdev = st.st_rdev;
	return 0;
}

/* The device nodes of the root at ROOT_MNT (mounted, nodev): each made,
 * not bound from the host, so that the host node's owner, group and mode
 * do not matter (devtmpfs without udev makes /dev/kvm root's, 0600). The
 * root stays nodev: each node is made in a tmpfs of this child's own
 * mounted without nodev at DEV_MNT, outside the root, as the host's
 * major:minor, the user uid:gid's, 0600, then bound into the root at its
 * path like any other file (read-only, nosuid, noexec: a device node
 * opens read-write on a read-only mount), and that tmpfs detached. */
static void make_nodes(const struct child *c, const struct node *nodes, unsigned n, uid_t uid, gid_t gid)
{
	if (!n)
		return;
	if (mount("capsule-dev", DEV_MNT, "tmpfs", MS_NOSUID | MS_NOEXEC, "size=4k,nr_inodes=16,mode=0700") < 0)
		jail_die(c, "mounting the tmpfs of the jail's device nodes", errno);
	for (unsigned i = 0; i < n; i++) {
		char path[64], what[PATH_MAX + 64];
		snprintf(path, sizeof(path), DEV_MNT "/%u", i);
		snprintf(what, sizeof(what), "making the jail's node of %s (%u:%u)", nodes[i].owned_at,
			 major(nodes[i].rdev), minor(nodes[i].rdev));
		if (mknod(path, S_IFCHR | 0600, nodes[i].rdev) < 0 || chown(path, uid, gid) < 0 || chmod(path, 0600) < 0)
			jail_die(c, what, errno);
		bind_file(c, path, nodes[i].owned_at, MS_RDONLY | MS_NOSUID | MS_NOEXEC);
	}
	if (umount2(DEV_MNT, MNT_DETACH) < 0)
		jail_die(c, "detaching the tmpfs of the jail's device nodes", errno);
}

/* A sparse file copied whole, holes kept (cap_copy_sparse). */
static int copy_sparse(int in, int out)
{
	off_t end = lseek(in, 0, SEEK_END);
	if (end < 0 || ftruncate(out, end) < 0)
		return -errno;
	return cap_copy_sparse(in, out, end);
}

void jail_root_build(const struct child *c)
{
	const struct cap_jail *j = c->j;
	char opts[128];

	/* Nothing we mount here reaches the host, nothing of the host's
	 * later mounts reaches us. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		jail_die(c, "making mounts private", errno);
	if (mount("capsule-jail", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV,
		  "size=1m,nr_inodes=1024,mode=0755") < 0)
		jail_die(c, "mounting the jail's root", errno);
	for (unsigned i = 0; i < j->nbinds; i++)
		bind_file(c, j->owned_binds[i].owned_host, j->owned_binds[i].owned_at, j->owned_binds[i].flags);
	make_nodes(c, j->nodes, j->nnodes, j->uid, j->gid);
	bind_file(c, "/dev/null", "/dev/null", MS_NOSUID | MS_NOEXEC);
	bind_file(c, "/dev/urandom", "/dev/urandom", MS_RDONLY | MS_NOSUID | MS_NOEXEC);

	if (j->own_proc) {
		/* The program opens its sealed memory as /proc/self/fd/N: a
		 * proc of its own PID namespace showing its processes only,
		 * gone again once it is open (cap_jail_ready). */
		if (mkdir(ROOT_MNT "/proc", 0555) < 0 ||
		    mount("proc", ROOT_MNT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "subset=pid,hidepid=invisible") < 0)
			jail_die(c, "mounting a proc for the sealed memory", errno);
	}
	if (j->owned_rw_file) {
		int fd = open(j->owned_rw_file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || fchown(fd, j->uid, j->gid) < 0)
			jail_die(c, "preparing the read-write file", errno);
		close(fd);
		bind_file(c, j->owned_rw_file, j->owned_rw_at, MS_NOSUID | MS_NODEV | MS_NOEXEC);
	} else if (c->copyfd >= 0) {
		char dir[PATH_MAX], file[PATH_MAX];
		snprintf(file, sizeof(file), ROOT_MNT "%s", j->owned_copy_at);
		snprintf(dir, sizeof(dir), "%s", file);
		*strrchr(dir, '/') = '\0';
		struct stat st;
		if (fstat(c->copyfd, &st) < 0)
			jail_die(c, "reading the file to copy", errno);
		snprintf(opts, sizeof(opts), "size=%lldk,nr_inodes=4,mode=0700,uid=%u,gid=%u",
			 (long long)(st.st_size + 1023) / 1024 + 4, (unsigned)j->uid, (unsigned)j->gid);
		int r = cap_mkdir_p(dir, 0700);
		if (r < 0)
			jail_die(c, "creating the copy's tmpfs", -r);
		if (mount("capsule-ram", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
			jail_die(c, "mounting the copy's tmpfs", errno);
		/* Empty for now: the copier fills it while the program starts. */
		int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 || ftruncate(fd, st.st_size) < 0 || fchown(fd, j->uid, j->gid) < 0)
			jail_die(c, "creating the copy", errno);
		close(fd);
	}

	/* Given a network namespace, a program's DNS queries go to the
	 * first nameserver here: the policy process's socket in it. */
	if (j->netns >= 0) {
		static const char resolv[] = "nameserver 127.0.0.1\n";
		int fd = -1;
		if ((mkdir(ROOT_MNT "/etc", 0755) < 0 && errno != EEXIST) ||
		    (fd = open(ROOT_MNT "/etc/resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0 ||
		    cap_write_all(fd, resolv, sizeof(resolv) - 1) < 0)
			jail_die(c, "writing /etc/resolv.conf in the jail", errno);
		close(fd);
	}

	if (sethostname("capsule", 7) < 0)
		jail_die(c, "setting the host name", errno);
	if (chdir(ROOT_MNT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		jail_die(c, "pivot_root into the jail", errno);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
		jail_die(c, "making the jail's root read-only", errno);
}

int jail_root_open_copy(int rootfd, const char *at, uid_t uid)
{
	int dfd = -1, r = 0;
	const char *c = at;
	for (;;) {
		c += strspn(c, "/");
		size_t n = strcspn(c, "/");
		char name[NAME_MAX + 1];
		if (n == 0 || n > NAME_MAX || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.')) {
			r = -EINVAL;
			break;
		}
		memcpy(name, c, n);
		name[n] = '\0';
		c += n;
		bool last = c[strspn(c, "/")] == '\0';
		int base = dfd >= 0 ? dfd : rootfd;
		int fd = last ? openat(base, name, O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)
			      : openat(base, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		r = fd < 0 ? -errno : 0;
		if (dfd >= 0)
			close(dfd);
		dfd = fd;
		if (r < 0 || last)
			break;
	}
	if (r < 0) {
		if (dfd >= 0)
			close(dfd);
		return r;
	}
	struct stat st;
	if (fstat(dfd, &st) < 0)
		r = -errno;
	else if (!S_ISREG(st.st_mode))
		r = -EINVAL;
	else if (st.st_uid != uid || st.st_nlink != 1)
		r = -EPERM;
	if (r < 0) {
		close(dfd);
		return r;
	}
	return dfd;
}

/* spec.copy_file goes into the jail's copy while the program starts (a
 * template's RAM: ~17 ms here, about as long as the program's start). A
 * process of ours in the VM's cgroup, so that the pages are charged to
 * the VM, writes through /proc/PID/root. cap_jail_ready waits for it. */
int jail_root_start_copier(struct cap_jail *j, pid_t prog, int copyfd, struct cap_err *err)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/root", (int)prog);
	pid_t pid = fork();
	if (pid < 0)
		return cap_err_set(err, errno, "fork: %s", strerror(errno));
	if (pid > 0) {
		j->copier = pid;
		return 0;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	int failed = 0;
	if (jail_cg_join(j, &failed) < 0)
		_exit(10);
	int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	int fd = root < 0 ? -1 : jail_root_open_copy(root, j->owned_copy_at, j->uid);
	if (fd < 0)
		_exit(11);
	_exit(copy_sparse(copyfd, fd) < 0 ? 12 : 0);
}

/* Detach the proc that the program opened its sealed memory through,
 * from a child of ours in its mount namespace. Joining a mount namespace
 * puts the child at that namespace's first root, which is the program's
 * root only when capsule's own root is its namespace's: run from a
 * chroot it is not, so the child goes to the program's root by its
 * descriptor and unmounts "proc" from there. 0, or -errno with err. */
static int detach_proc(struct cap_jail *j, struct cap_err *err)
{
	j->own_proc = false;
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)j->pid);
	_cleanup_close_ int ns = open(path, O_RDONLY | O_CLOEXEC);
	if (ns < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	snprintf(path, sizeof(path), "/proc/%d/root", (int)j->pid);
	_cleanup_close_ int root = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (root < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		if (setns(ns, CLONE_NEWNS) < 0)
			_exit(10);
		if (fchdir(root) < 0)
			_exit(12);
		_exit(umount2("proc", MNT_DETACH) < 0 ? 11 : 0);
	}
	int e = errno, st = 0;
	if (pid < 0)
		return cap_err_set(err, e, "fork: %s", strerror(e));
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	int code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
	return cap_err_set(err, EPERM, "cannot detach the proc of %s's jail: %s failed", j->name,
			   code == 10 ? "joining its mount namespace" : code == 12 ? "entering its root" : "unmounting it");
}

int cap_jail_ready(struct cap_jail *j, struct cap_err *err)
{
	if (j->own_proc && j->pid > 0)
		return detach_proc(j, err);
	if (j->copier <= 0)
		return 0;
	int st = 0;
	pid_t r;
	while ((r = waitpid(j->copier, &st, 0)) < 0 && errno == EINTR)
		;
	j->copier = -1;
	if (r < 0)
		return cap_err_set(err, errno, "cannot wait for the copy of %s into the jail: %s",
				   j->owned_copy_file, strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	static const char *const what[] = { "joining the VM's cgroup", "opening the jail's copy", "copying" };
	int code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
	return cap_err_set(err, EIO, "cannot copy %s into the jail: %s failed", j->owned_copy_file,
			   code >= 10 && code <= 12 ? what[code - 10] : "the copier was killed; it");
}

/* A helper's own mount and IPC namespaces and its root: a small tmpfs
 * holding /dev/null and those of files[0..nfiles) that exist, bound
 * read-only at their own paths, then pivot_root and the root made
 * read-only. Nothing else of the host is reachable by path. */
void jail_root_helper(const struct child *c, const char *const *files, unsigned nfiles)
{
	if (unshare(CLONE_NEWNS | CLONE_NEWIPC) < 0)
		jail_die(c, "creating the helper's mount and IPC namespaces", errno);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		jail_die(c, "making mounts private", errno);
	if (mount("capsule-helper", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "size=16k,nr_inodes=64,mode=0755") < 0)
		jail_die(c, "mounting the helper's root", errno);
	umask(022);	/* the helper's user must traverse what we make (a shim's is 077) */
	bind_file(c, "/dev/null", "/dev/null", MS_NOSUID | MS_NOEXEC);
	for (unsigned i = 0; i < nfiles; i++) {
		struct stat st;
		/* A host without the file: the helper does without, as it
		 * would outside. A directory or device is not bound. */
		if (stat(files[i], &st) < 0 || !S_ISREG(st.st_mode))
			continue;
		bind_file(c, files[i], files[i], MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
	}
	if (chdir(ROOT_MNT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		jail_die(c, "pivot_root into the helper's root", errno);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		jail_die(c, "making the helper's root read-only", errno);
}

int cap_jail_ram_probe(char *detail, size_t len)
{
	int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
	int fd = (int)syscall(SYS_memfd_create, "capsule-probe", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0) {
		int e = errno;
		snprintf(detail, len, "memfd_create: %s", strerror(e));
		return -e;
	}
	int r = ftruncate(fd, 4096) < 0 || fcntl(fd, F_ADD_SEALS, need) < 0 ? -errno : 0;
	if (r == 0 && (fcntl(fd, F_GET_SEALS) & need) != need)
		r = -EPERM;
	if (r == 0 && write(fd, "x", 1) >= 0)
		r = -EPERM;	/* a seal that does not hold */
	close(fd);
	if (r < 0) {
		snprintf(detail, len, "this kernel cannot seal a memfd against writes: %s", strerror(-r));
		return r;
	}
	if (jail_env_is("CAPSULE_JAIL", "0") || !jail_user_may_confine()) {
		snprintf(detail, len, "no jail: an unconfined VM maps the template's RAM file privately");
		return -EPERM;
	}
	/* The jail's proc, tried in a throwaway child. */
	if ((r = cap_mkdir_p(ROOT_MNT, 0755)) < 0) {
		snprintf(detail, len, "cannot create %s: %s", ROOT_MNT, strerror(-r));
		return r;
	}
	struct clone_args ca = { .flags = CLONE_NEWNS | CLONE_NEWPID, .exit_signal = SIGCHLD };
	long pid = syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid == 0) {
		if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
			_exit(1);
		_exit(mount("proc", ROOT_MNT, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			    "subset=pid,hidepid=invisible") < 0 ? 2 : 0);
	}
	int st = 0;
	while (pid > 0 && waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR)
		;
	if (pid < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
		snprintf(detail, len, "a jail cannot mount a proc of its own (subset=pid, Linux >= 5.8)");
		return -ENOSYS;
	}
	snprintf(detail, len, "one sealed memfd per template (F_SEAL_WRITE, GROW, SHRINK, SEAL), mapped privately by each jailed VM%s",
		 getenv("CAPSULE_SHARED_RAM") && strcmp(getenv("CAPSULE_SHARED_RAM"), "0") == 0
		 ? "; but CAPSULE_SHARED_RAM=0 asks for a per-VM copy" : "");
	return 0;
}

int cap_jail_device_probe(const char *path, int (*use)(int fd), bool *confined, char *detail, size_t len)
{
	*confined = cap_jail_would_confine();
	if (!*confined) {
		/* Unconfined, the program opens the host's node as we are. */
		int fd = open(path, O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (fd < 0) {
			int e = errno;
			snprintf(detail, len, "opening %s as uid %u (no jail): %s", path, (unsigned)geteuid(), strerror(e));
			return -e;
		}
		int u = use ? use(fd) : 0;
		close(fd);
		if (u < 0) {
			snprintf(detail, len, "%s opens as uid %u (no jail) but does not answer as expected: %s", path,
				 (unsigned)geteuid(), strerror(-u));
			return u;
		}
		snprintf(detail, len, "%s opens read-write as uid %u (no jail: the VM's program runs as capsule's user)",
			 path, (unsigned)geteuid());
		return 0;
	}
	struct node n = { .owned_at = (char *)path };
	struct cap_err err = { 0 };
	int r = jail_root_node(path, &n.rdev, &err);
	if (r < 0) {
		snprintf(detail, len, "%s", err.msg);
		return r;
	}
	if ((r = cap_mkdir_p(ROOT_MNT, 0755)) < 0 || (r = cap_mkdir_p(DEV_MNT, 0700)) < 0) {
		snprintf(detail, len, "cannot create %s: %s", r == 0 ? DEV_MNT : ROOT_MNT, strerror(-r));
		return r;
	}
	int ep[2];
	if (pipe2(ep, O_CLOEXEC) < 0) {
		int e = errno;
		snprintf(detail, len, "pipe: %s", strerror(e));
		return -e;
	}
	uid_t uid = jail_user_probe_uid();
	/* What cap_jail_spawn does for the node, in a throwaway child: a
	 * mount namespace, a nodev root, the node made and bound, then the
	 * open as a jail's user without groups. */
	struct clone_args ca = { .flags = CLONE_NEWNS, .exit_signal = SIGCHLD };
	long pid = syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid == 0) {
		close(ep[0]);
		struct child c = { .errfd = ep[1], .logfd = -1, .nullfd = -1, .copyfd = -1 };
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		umask(022);
		if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
			jail_die(&c, "making mounts private", errno);
		if (mount("capsule-probe", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV, "size=16k,nr_inodes=64,mode=0755") < 0)
			jail_die(&c, "mounting a jail's root", errno);
		make_nodes(&c, &n, 1, uid, (gid_t)uid);
		/* From the root's descriptor, as the program finds it after
		 * pivot_root: the user need not search the host's directories
		 * above ROOT_MNT (a umask of 077 makes /run/capsule 0700). */
		int rootfd = open(ROOT_MNT, O_PATH | O_DIRECTORY | O_CLOEXEC);
		if (rootfd < 0)
			jail_die(&c, "opening the jail's root", errno);
		jail_user_become(&c, uid, (gid_t)uid, "a jail's user");
		char at[PATH_MAX + 64];
		int fd = openat(rootfd, path + strspn(path, "/"), O_RDWR | O_NOCTTY | O_CLOEXEC);
		if (fd < 0)
			jail_die(&c, "opening it as a jail's user", errno);
		int u = use ? use(fd) : 0;
		if (u < 0) {
			snprintf(at, sizeof(at), "the jail's node of %s opens, but does not answer as expected", path);
			jail_die(&c, at, -u);
		}
		_exit(0);
	}
	int e = errno;
	close(ep[1]);
	char msg[400] = "";
	size_t got = pid > 0 ? jail_read_failure(ep[0], msg, sizeof(msg)) : 0;
	close(ep[0]);
	int st = 0;
	while (pid > 0 && waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR)
		;
	if (pid < 0) {
		snprintf(detail, len, "cannot start a child in a mount namespace of its own (clone3): %s", strerror(e));
		return -e;
	}
	if (got == 0 && WIFEXITED(st) && WEXITSTATUS(st) == 0) {
		snprintf(detail, len, "the jail makes its own node of %s (%u:%u, its user's, 0600), which opens read-write as that user",
			 path, major(n.rdev), minor(n.rdev));
		return 0;
	}
	snprintf(detail, len, "%s", got ? msg : "the probe was killed");
	return WIFEXITED(st) && WEXITSTATUS(st) > 0 && WEXITSTATUS(st) < 127 ? -WEXITSTATUS(st) : -EPERM;
}

void jail_root_probe(struct cap_jail_check *c, const struct cap_jail_check *ns)
{
	int mk = ns->active ? cap_mkdir_p(ROOT_MNT, 0755) : 0;
	if (!ns->active) {
		snprintf(c->detail, sizeof(c->detail), "%s", ns->detail);
	} else if (mk < 0) {
		snprintf(c->detail, sizeof(c->detail), "cannot create %s: %s", ROOT_MNT, strerror(-mk));
	} else {
		c->active = true;
		snprintf(c->detail, sizeof(c->detail), "pivot_root into a tmpfs holding only the files the engine lists (its program, libraries, firmware, the guest's kernel and initramfs), /dev/null, /dev/urandom, device nodes of its own (its user's, 0600) and the VM's RAM; disks and sockets passed as descriptors");
	}
}
