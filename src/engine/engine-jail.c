/* The jail around each QEMU (jail.h; docs/architecture.md, "The jail"). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <limits.h>
#include <linux/capability.h>
#include <linux/magic.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cgroup.h"
#include "jail.h"
#include "paths.h"
#include "proc.h"
#include "util.h"

#define RUN_DIR "/run/capsule/jail"
#define ROOT_MNT RUN_DIR "/root"
#define SLOTS 4096
#define UID_BASE 1900000000u
/* QEMU's own memory on top of the guest's: TCG's translation cache
 * (bounded by the engine), device state, page cache of the disks. */
#define OVERHEAD_MIB 256
#define NOFILE 4096
#define NPROC 256
#define HELPER_NPROC 16
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET)

static const char *const v1_controllers[] = { "memory", "pids", "cpu" };

struct cgroups {
	int version;		/* 1 or 2; 0: none usable */
	char root[160];		/* where the hierarchies are mounted */
	char parent[512];	/* our folder in each hierarchy: a relative path,
				 * "capsule" or CAPSULE_CGROUP_PARENT (an OCI
				 * container's cgroupsPath, docs/oci.md) */
	char why[480];		/* why none is usable */
};

struct cap_jail {
	bool confined;		/* namespaces + private root + own user */
	int slot;		/* -1: none */
	int lock_fd;		/* holds the slot */
	uid_t uid;
	gid_t gid;
	gid_t kvm_gid;		/* extra group for /dev/kvm, or (gid_t)-1 */
	char *owned_cg[3];	/* cgroup folders, NULL when none */
	int cg_version;
	char *owned_ram_bind;
	char *owned_ram_copy;
	char *owned_kernel;
	char *owned_initrd;
	pid_t copier;		/* filling the jail's RAM copy, or -1 */
	bool ram_proc;		/* a proc for QEMU to open spec.ram_fd, detached by cap_jail_ready */
	pid_t pid;		/* QEMU, once spawned; else -1 */
	int netns;		/* QEMU's network namespace (borrowed), or -1: a new one */
	bool kvm;
	char note[512];
};

static bool env_is(const char *name, const char *value)
{
	const char *v = getenv(name);
	return v && strcmp(v, value) == 0;
}

static uid_t uid_base(void)
{
	const char *v = getenv("CAPSULE_JAIL_UID_BASE");
	if (v && *v) {
		char *end;
		unsigned long b = strtoul(v, &end, 10);
		if (!*end && b >= 1000 && b <= 4000000000ul)
			return (uid_t)b;
	}
	return UID_BASE;
}

/* ---- cgroups ---------------------------------------------------------- */

static void cg_detect(struct cgroups *cg)
{
	const char *root = getenv("CAPSULE_CGROUP_ROOT");
	const char *parent = getenv("CAPSULE_CGROUP_PARENT");
	snprintf(cg->root, sizeof(cg->root), "%.159s", root && *root ? root : "/sys/fs/cgroup");
	/* A path below the hierarchies' roots, else the default. */
	const char *rel = parent ? cap_cgroup_rel_path(parent) : NULL;
	bool ok = rel && *rel && strlen(rel) < sizeof(cg->parent);
	snprintf(cg->parent, sizeof(cg->parent), "%s", ok ? rel : "capsule");
	cg->version = 0;
	struct statfs sf;
	if (statfs(cg->root, &sf) < 0) {
		snprintf(cg->why, sizeof(cg->why), "%s: %s", cg->root, strerror(errno));
		return;
	}
	if (sf.f_type == CGROUP2_SUPER_MAGIC) {
		char path[PATH_MAX + 32], *ctl = NULL;
		snprintf(path, sizeof(path), "%s/cgroup.controllers", cg->root);
		if (cap_read_file(path, 4096, &ctl) < 0 || !strstr(ctl, "memory") ||
		    !strstr(ctl, "pids") || !strstr(ctl, "cpu")) {
			snprintf(cg->why, sizeof(cg->why), "cgroup v2 at %s lacks the memory, pids or cpu controller", cg->root);
			free(ctl);
			return;
		}
		free(ctl);
		cg->version = 2;
		return;
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v1_controllers); i++) {
		char path[PATH_MAX + 32];
		snprintf(path, sizeof(path), "%s/%s", cg->root, v1_controllers[i]);
		if (statfs(path, &sf) < 0 || sf.f_type != CGROUP_SUPER_MAGIC) {
			snprintf(cg->why, sizeof(cg->why), "%s is not a cgroup v2 file system and %.200s is not a cgroup v1 hierarchy",
				 cg->root, path);
			return;
		}
	}
	cg->version = 1;
}

/* The folders of slot name ("vm-3") in each hierarchy; returns how many. */
static unsigned cg_dirs(const struct cgroups *cg, const char *name, char *out[3])
{
	if (cg->version == 2) {
		out[0] = xasprintf("%s/%s/%s", cg->root, cg->parent, name);
		return 1;
	}
	for (unsigned i = 0; i < 3; i++)
		out[i] = xasprintf("%s/%s/%s/%s", cg->root, v1_controllers[i], cg->parent, name);
	return 3;
}

/* Kill whatever is left in dir and remove it. 0, or -errno. */
static int cg_remove(const char *dir)
{
	char *procs = NULL;
	_cleanup_free_ char *path = xasprintf("%s/cgroup.procs", dir);
	if (cap_read_file(path, 1 << 20, &procs) < 0) {
		free(procs);
		return access(dir, F_OK) == 0 ? -EIO : 0;
	}
	for (char *p = procs; *p;) {
		long pid = strtol(p, &p, 10);
		if (pid > 0)
			kill((pid_t)pid, SIGKILL);
		while (*p == '\n')
			p++;
	}
	free(procs);
	for (int i = 0; i < 200; i++) {
		if (rmdir(dir) == 0 || errno == ENOENT)
			return 0;
		if (errno != EBUSY)
			return -errno;
		usleep(5000);
	}
	return -EBUSY;
}

/* Make sure the parent folders exist, every level of a nested parent
 * (and, on v2, hand the controllers down to them). */
static int cg_parents(const struct cgroups *cg, struct cap_err *err)
{
	if (cg->version == 2)
		return cap_cgroup_mkdir_p(cg->root, cg->parent, true, err);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v1_controllers); i++) {
		_cleanup_free_ char *base = xasprintf("%s/%s", cg->root, v1_controllers[i]);
		int r = cap_cgroup_mkdir_p(base, cg->parent, false, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static int cg_limit(const char *dir, const char *file, unsigned long long v,
		    bool optional, struct cap_err *err)
{
	char path[PATH_MAX + 64], val[32];
	snprintf(path, sizeof(path), "%s/%s", dir, file);
	snprintf(val, sizeof(val), "%llu", v);
	if (optional && access(path, F_OK) != 0)
		return 0;
	int r = cap_cgroup_write(path, val);
	if (r < 0)
		return cap_err_set(err, -r, "cannot set %s to %s: %s", path, val, strerror(-r));
	return 0;
}

static int cg_create(const struct cgroups *cg, const char *name,
		     const struct cap_jail_spec *spec, char *out[3],
		     struct cap_err *err)
{
	unsigned long long mem = ((unsigned long long)spec->memory_mib + OVERHEAD_MIB) << 20;
	/* A guest's first write to a page the template never touched
	 * fills that hole of the shared memfd with a zero page (shmem has
	 * no shared zero page), charged here, besides its private copy:
	 * up to guest RAM more, unreclaimable without swap. */
	if (spec->ram_fd > 0)
		mem += (unsigned long long)spec->memory_mib << 20;
	unsigned pids = 128 + 2 * spec->cpus;
	unsigned n = cg_dirs(cg, name, out), i;
	int r;
	if ((r = cg_parents(cg, err)) < 0)
		return r;
	for (i = 0; i < n; i++) {
		cg_remove(out[i]);	/* a leftover of this slot */
		if (mkdir(out[i], 0755) < 0)
			return cap_err_set(err, errno, "cannot create cgroup %s: %s", out[i], strerror(errno));
	}
	if (cg->version == 2) {
		if ((r = cg_limit(out[0], "memory.max", mem, false, err)) < 0 ||
		    (r = cg_limit(out[0], "memory.swap.max", 0, true, err)) < 0 ||
		    (r = cg_limit(out[0], "pids.max", pids, false, err)) < 0 ||
		    (r = cg_limit(out[0], "cpu.weight", CAP_MIN(100u * spec->cpus, 10000u), false, err)) < 0)
			return r;
		return 0;
	}
	if ((r = cg_limit(out[0], "memory.limit_in_bytes", mem, false, err)) < 0 ||
	    (r = cg_limit(out[0], "memory.memsw.limit_in_bytes", mem, true, err)) < 0 ||
	    (r = cg_limit(out[1], "pids.max", pids, false, err)) < 0 ||
	    (r = cg_limit(out[2], "cpu.shares", 1024ull * spec->cpus, false, err)) < 0)
		return r;
	return 0;
}

/* ---- what goes into the root ----------------------------------------- */

struct lines {
	char **v;
	size_t n;
};

static void lines_add(struct lines *l, const char *s)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i], s) == 0)
			return;
	l->v = xrealloc(l->v, (l->n + 1) * sizeof(char *));
	l->v[l->n++] = xstrdup(s);
}

static void lines_free(struct lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* ldd's answer, one path per line ("libz.so.1 => /lib/.../libz.so.1"). */
static void ldd_line(void *ud, const char *line)
{
	struct lines *l = ud;
	const char *p = strstr(line, "=> ");
	p = p ? p + 3 : line;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p != '/')
		return;
	size_t n = strcspn(p, " ");
	_cleanup_free_ char *path = xstrndup(p, n);
	lines_add(l, path);
}

/* QEMU's TCG accelerator is a loadable module in Debian's build. */
static const char *const modules[] = {
	"/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so",
};
/* The microvm machine's firmware (Debian names it qboot.rom) and the
 * option ROM that boots a PVH kernel. */
static const char *const firmware[] = {
	"/usr/share/qemu/bios-microvm.bin",
	"/usr/share/qemu/qboot.rom",
	"/usr/share/qemu/pvh.bin",
};

/* The files QEMU needs, as paths valid both on the host and in the jail:
 * the binary, its libraries and loader, its modules and firmware. ldd
 * costs ~35 ms, so the list is cached, keyed by the files it was made
 * from. */
static int qemu_files(const char *qemu, struct lines *out, struct cap_err *err)
{
	struct stat st;
	/* Bump with the lists above. */
	unsigned long long key = 1469598103934665603ull + 2;
	const char *keyed[1 + CAP_ARRAY_SIZE(modules)] = { qemu };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(modules); i++)
		keyed[i + 1] = modules[i];
	for (size_t i = 0; i < CAP_ARRAY_SIZE(keyed); i++) {
		if (stat(keyed[i], &st) < 0)
			continue;
		unsigned long long parts[] = { st.st_dev, st.st_ino, (unsigned long long)st.st_size,
					       (unsigned long long)st.st_mtim.tv_sec, (unsigned long long)st.st_mtim.tv_nsec };
		for (size_t k = 0; k < CAP_ARRAY_SIZE(parts); k++)
			key = (key ^ parts[k]) * 1099511628211ull;
	}
	_cleanup_free_ char *cache = cap_cache_dir();
	_cleanup_free_ char *dir = xasprintf("%s/jail", cache);
	_cleanup_free_ char *file = xasprintf("%s/qemu-files-%016llx", dir, key);
	char *text = NULL;
	if (cap_read_file(file, 1 << 20, &text) > 0) {
		char *save = NULL;
		bool stale = false;
		for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
			if (*l == '/') {
				lines_add(out, l);
				stale |= access(l, R_OK) != 0;	/* a library moved */
			}
		free(text);
		if (out->n > 1 && !stale)
			return 0;
		lines_free(out);
		text = NULL;
	}
	free(text);

	lines_add(out, qemu);
	char *argv[] = { "ldd", (char *)qemu, NULL };
	struct cap_err lerr = { 0 };
	if (cap_run(argv, ldd_line, out, &lerr) < 0) {
		lines_free(out);
		return cap_err_set(err, lerr.code ? lerr.code : EIO, "cannot list the libraries of %s: %s", qemu, lerr.msg);
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(modules); i++) {
		if (access(modules[i], R_OK) != 0)
			continue;
		lines_add(out, modules[i]);
		char *margv[] = { "ldd", (char *)modules[i], NULL };
		cap_run(margv, ldd_line, out, NULL);
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(firmware); i++)
		if (access(firmware[i], R_OK) == 0)
			lines_add(out, firmware[i]);
	size_t len = 0;
	for (size_t i = 0; i < out->n; i++)
		len += strlen(out->v[i]) + 1;
	_cleanup_free_ char *list = xmalloc(len + 1);
	char *p = list;
	for (size_t i = 0; i < out->n; i++)
		p += sprintf(p, "%s\n", out->v[i]);
	if (cap_mkdir_p(dir, 0755) == 0)
		cap_write_file_atomic(file, list, len, 0644);
	return 0;
}

/* ---- slots ------------------------------------------------------------ */

/* Try to hold slot n: an open descriptor holding its lock, or -1. */
static int slot_try(int n)
{
	char path[64];
	snprintf(path, sizeof(path), RUN_DIR "/slot-%d", n);
	int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* ---- probing ---------------------------------------------------------- */

static bool may_confine(void);

/* Can we make the namespaces? 0 or -errno. */
static int probe_namespaces(void)
{
	struct clone_args ca = { .flags = NS_FLAGS, .exit_signal = SIGCHLD };
	long pid = syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid < 0)
		return -errno;
	if (pid == 0)
		_exit(0);
	int st;
	while (waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

static int probe_cgroups(const struct cgroups *cg, char *detail, size_t len)
{
	if (cg->version == 0) {
		snprintf(detail, len, "%.300s", cg->why);
		return -ENODEV;
	}
	struct cap_err err = { 0 };
	char name[48];
	snprintf(name, sizeof(name), "probe-%d", (int)getpid());
	char *dirs[3] = { NULL, NULL, NULL };
	unsigned n = cg_dirs(cg, name, dirs);
	int r = cg_parents(cg, &err);
	for (unsigned i = 0; i < n; i++) {
		if (r == 0 && mkdir(dirs[i], 0755) < 0)
			r = cap_err_set(&err, errno, "cannot create cgroup %s: %s", dirs[i], strerror(errno));
		rmdir(dirs[i]);
		free(dirs[i]);
	}
	if (r < 0) {
		snprintf(detail, len, "%.300s", err.msg);
		return r;
	}
	if (cg->version == 2)
		snprintf(detail, len, "cgroup v2 %s/%.200s/vm-N: memory.max = guest RAM + %d MiB (twice the RAM with shared template RAM), pids.max = 128 + 2 per vCPU, cpu.weight 100 per vCPU",
			 cg->root, cg->parent, OVERHEAD_MIB);
	else
		snprintf(detail, len, "cgroup v1 %s/{memory,pids,cpu}/%.200s/vm-N: memory limit = guest RAM + %d MiB (twice the RAM with shared template RAM), pids.max = 128 + 2 per vCPU, cpu.shares 1024 per vCPU",
			 cg->root, cg->parent, OVERHEAD_MIB);
	return 0;
}

int cap_jail_probe(struct cap_jail_check c[CAP_JAIL_NCHECKS])
{
	static const char *const names[CAP_JAIL_NCHECKS] = {
		"namespaces", "private root", "unprivileged user", "cgroup limits", "seccomp", "no_new_privs, rlimits",
	};
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++) {
		c[i].name = names[i];
		c[i].active = false;
		c[i].detail[0] = '\0';
	}
	bool off = env_is("CAPSULE_JAIL", "0");
	int ns = off ? -EPERM : probe_namespaces();
	const char *why_off = "the jail is off (CAPSULE_JAIL=0, a debug setting)";
	char why_ns[200];
	snprintf(why_ns, sizeof(why_ns), "cannot create namespaces: %s (the jail needs capsule to run as root)", strerror(-ns));

	if (off)
		snprintf(c[0].detail, sizeof(c[0].detail), "%s", why_off);
	else if (ns < 0)
		snprintf(c[0].detail, sizeof(c[0].detail), "%s", why_ns);
	else {
		c[0].active = true;
		snprintf(c[0].detail, sizeof(c[0].detail), "new mount, PID, IPC, UTS and network namespaces (network: loopback only)");
	}

	int mk = c[0].active ? cap_mkdir_p(ROOT_MNT, 0755) : 0;
	if (!c[0].active) {
		snprintf(c[1].detail, sizeof(c[1].detail), "%s", c[0].detail);
	} else if (mk < 0) {
		snprintf(c[1].detail, sizeof(c[1].detail), "cannot create %s: %s", ROOT_MNT, strerror(-mk));
	} else {
		_cleanup_free_ char *qemu = cap_find_program("qemu-system-x86_64");
		struct lines files = { 0 };
		struct cap_err err = { 0 };
		if (!qemu)
			snprintf(c[1].detail, sizeof(c[1].detail), "qemu-system-x86_64 is not in PATH");
		else if (qemu_files(qemu, &files, &err) < 0)
			snprintf(c[1].detail, sizeof(c[1].detail), "%.300s", err.msg);
		else {
			c[1].active = true;
			snprintf(c[1].detail, sizeof(c[1].detail), "pivot_root into a tmpfs holding %zu QEMU files (binary, libraries, firmware), the kernel, the initramfs and the VM's RAM; disks and sockets passed as descriptors",
				 files.n);
		}
		lines_free(&files);
	}

	if (!c[0].active)
		snprintf(c[2].detail, sizeof(c[2].detail), "%s", c[0].detail);
	else if (geteuid() != 0)
		snprintf(c[2].detail, sizeof(c[2].detail), "capsule is not root: it cannot switch QEMU to a user of its own");
	else {
		c[2].active = true;
		snprintf(c[2].detail, sizeof(c[2].detail), "UID and GID %u + slot, one per running VM (%d slots, locks in %s); a VM's policy process %u + slot",
			 (unsigned)uid_base(), SLOTS, RUN_DIR, (unsigned)uid_base() + CAP_JAIL_HELPER_OFFSET);
	}

	struct cgroups cg;
	cg_detect(&cg);
	if (off)
		snprintf(c[3].detail, sizeof(c[3].detail), "%s", why_off);
	else if (geteuid() != 0)
		snprintf(c[3].detail, sizeof(c[3].detail), "capsule is not root: it cannot create cgroups");
	else
		c[3].active = probe_cgroups(&cg, c[3].detail, sizeof(c[3].detail)) == 0;

	c[4].active = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
	snprintf(c[4].detail, sizeof(c[4].detail), c[4].active
		 ? "QEMU -sandbox on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"
		 : "this kernel has no seccomp");
	c[5].active = true;
	snprintf(c[5].detail, sizeof(c[5].detail), "no_new_privs; RLIMIT_CORE 0, RLIMIT_NOFILE %d, RLIMIT_NPROC %d; every other descriptor closed",
		 NOFILE, NPROC);

	int missing = 0;
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++)
		missing += !c[i].active;
	return missing;
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
	if (env_is("CAPSULE_JAIL", "0") || !may_confine()) {
		snprintf(detail, len, "no jail: an unconfined QEMU maps the template's RAM file privately");
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
	snprintf(detail, len, "one sealed memfd per template (F_SEAL_WRITE, GROW, SHRINK, SEAL), mapped privately by each jailed QEMU%s",
		 getenv("CAPSULE_SHARED_RAM") && strcmp(getenv("CAPSULE_SHARED_RAM"), "0") == 0
		 ? "; but CAPSULE_SHARED_RAM=0 asks for a per-VM copy" : "");
	return 0;
}

/* ---- one jail --------------------------------------------------------- */

bool cap_jail_confined(const struct cap_jail *j) { return j->confined; }
const char *cap_jail_note(const struct cap_jail *j) { return j->note; }
uid_t cap_jail_uid(const struct cap_jail *j) { return j->uid; }
uid_t cap_jail_helper_uid(const struct cap_jail *j) { return j->uid + CAP_JAIL_HELPER_OFFSET; }

void cap_jail_set_netns(struct cap_jail *j, int netns)
{
	CAP_BUG_ON(!j->confined);
	j->netns = netns;
}

/* Whether this process may make namespaces and switch users: what the
 * jail needs (doctor's probe tries it for real; a VM start only asks). */
static bool may_confine(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		return false;
	const int need[] = { CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(need); i++)
		if (!(d[need[i] / 32].effective & (1u << (need[i] % 32))))
			return false;
	return true;
}

bool cap_jail_would_confine(void)
{
	return !env_is("CAPSULE_JAIL", "0") && may_confine();
}

static void note_missing(struct cap_jail *j, const char *what, const char *why)
{
	size_t used = strlen(j->note);
	snprintf(j->note + used, sizeof(j->note) - used, "%s%s (%s)", used ? "; " : "", what, why);
}

int cap_jail_new(const struct cap_jail_spec *spec, struct cap_jail **out,
		 struct cap_err *err)
{
	struct cap_jail *j = xcalloc(1, sizeof(*j));
	j->slot = -1;
	j->lock_fd = -1;
	j->copier = -1;
	j->pid = -1;
	j->netns = -1;
	j->kvm_gid = (gid_t)-1;
	j->kvm = spec->kvm;
	j->owned_kernel = xstrdup(spec->kernel);
	j->owned_initrd = xstrdup(spec->initrd);
	j->owned_ram_bind = spec->ram_bind ? xstrdup(spec->ram_bind) : NULL;
	j->owned_ram_copy = spec->ram_copy ? xstrdup(spec->ram_copy) : NULL;
	int r;

	if (env_is("CAPSULE_JAIL", "0"))
		note_missing(j, "the jail", "CAPSULE_JAIL=0, a debug setting");
	else if (!may_confine())
		note_missing(j, "namespaces, private root, unprivileged user, cgroup limits",
			     "capsule lacks CAP_SYS_ADMIN, CAP_SETUID or CAP_SETGID: the jail needs root");
	else
		j->confined = true;
	if (!j->confined)
		goto done;
	if (spec->ram_fd > 0) {
		/* The one thing that keeps a compromised QEMU from rewriting
		 * the RAM every later VM starts from: looked at here. */
		int seals = fcntl(spec->ram_fd, F_GET_SEALS);
		int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
		if (seals < 0 || (seals & need) != need) {
			r = cap_err_set(err, EPERM, "refusing to give QEMU a RAM descriptor not sealed against writes (seals %#x)",
					seals < 0 ? 0 : seals);
			goto fail;
		}
		j->ram_proc = true;
	}

	cap_jail_sweep(NULL, NULL);	/* cgroups of owners that died */
	for (int n = 0; n < SLOTS && j->lock_fd < 0; n++)
		if ((j->lock_fd = slot_try(n)) >= 0)
			j->slot = n;
	if (j->lock_fd < 0) {
		r = cap_err_set(err, EAGAIN, "all %d jail slots in %s are taken: too many VMs are running", SLOTS, RUN_DIR);
		goto fail;
	}
	j->uid = uid_base() + (uid_t)j->slot;
	j->gid = (gid_t)j->uid;
	struct stat st;
	if (spec->kvm && stat("/dev/kvm", &st) == 0)
		j->kvm_gid = st.st_gid;
	/* No usable cgroups: the VM runs without limits, and says so. */
	struct cgroups cg;
	cg_detect(&cg);
	j->cg_version = cg.version;
	if (cg.version == 0) {
		note_missing(j, "cgroup limits", cg.why);
	} else {
		char name[32];
		struct cap_err cerr = { 0 };
		snprintf(name, sizeof(name), "vm-%d", j->slot);
		if (cg_create(&cg, name, spec, j->owned_cg, &cerr) < 0) {
			note_missing(j, "cgroup limits", cerr.msg);
			for (int i = 0; i < 3; i++) {
				if (j->owned_cg[i])
					cg_remove(j->owned_cg[i]);
				free(j->owned_cg[i]);
				j->owned_cg[i] = NULL;
			}
		}
	}
done:
	if (*j->note && env_is("CAPSULE_REQUIRE_JAIL", "1")) {
		r = cap_err_set(err, EPERM, "CAPSULE_REQUIRE_JAIL=1 and this host cannot confine QEMU fully: missing %s; `capsule doctor` lists each protection",
				j->note);
		goto fail;
	}
	*out = j;
	return 0;
fail:
	cap_jail_free(j);
	return r;
}

void cap_jail_free(struct cap_jail *j)
{
	if (!j)
		return;
	if (j->copier > 0) {
		kill(j->copier, SIGKILL);
		cap_jail_ready(j, NULL);
	}
	for (int i = 0; i < 3; i++) {
		if (j->owned_cg[i])
			cg_remove(j->owned_cg[i]);
		free(j->owned_cg[i]);
	}
	/* A template's RAM goes back to root. Should that fail, the file
	 * stays in root's 0700 template folder, out of every jail. */
	if (j->confined && j->owned_ram_bind && chown(j->owned_ram_bind, 0, 0) < 0)
		errno = 0;
	if (j->lock_fd >= 0)
		close(j->lock_fd);
	free(j->owned_ram_bind);
	free(j->owned_ram_copy);
	free(j->owned_kernel);
	free(j->owned_initrd);
	free(j);
}

int cap_jail_sweep(void (*found)(void *ud, const char *what), void *ud)
{
	struct cgroups cg;
	cg_detect(&cg);
	if (cg.version == 0 || geteuid() != 0)
		return 0;
	if (cap_mkdir_p(RUN_DIR, 0755) < 0)
		return 0;
	_cleanup_free_ char *parent = cg.version == 2 ? xasprintf("%s/%s", cg.root, cg.parent)
						      : xasprintf("%s/memory/%s", cg.root, cg.parent);
	DIR *d = opendir(parent);
	if (!d)
		return 0;
	int removed = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		int n;
		char tail;
		if (sscanf(e->d_name, "vm-%d%c", &n, &tail) != 1 || n < 0 || n >= SLOTS)
			continue;
		int fd = slot_try(n);
		if (fd < 0)
			continue;	/* a live VM holds it */
		char *dirs[3] = { NULL, NULL, NULL };
		unsigned k = cg_dirs(&cg, e->d_name, dirs);
		int r = 0;
		for (unsigned i = 0; i < k; i++) {
			int q = cg_remove(dirs[i]);
			if (q < 0)
				r = q;
			free(dirs[i]);
		}
		close(fd);
		char what[160];
		snprintf(what, sizeof(what), "%.32s: leftover jail cgroups %s", e->d_name,
			 r == 0 ? "removed" : "could not be removed");
		if (found)
			found(ud, what);
		removed += r == 0;
	}
	closedir(d);
	return removed;
}

/* What a child wrote on its close-on-exec error pipe before exec or
 * exit, NUL-terminated; 0 bytes (end of file) means it got through. */
static size_t read_failure(int fd, char *msg, size_t size)
{
	size_t len = 0;
	while (len < size - 1) {
		ssize_t k = read(fd, msg + len, size - 1 - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	msg[len] = '\0';
	return len;
}

/* ---- the child -------------------------------------------------------- */

struct child {
	const struct cap_jail *j;
	const char *qemu;
	char *const *argv;
	int errfd, logfd, nullfd, ramfd;
	const int *fds;
	unsigned n;
	const struct lines *files;
};

__attribute__((noreturn)) static void die(const struct child *c, const char *what, int e)
{
	char msg[512];
	int len = snprintf(msg, sizeof(msg), "%s: %s", what, strerror(e));
	if (write(c->errfd, msg, (size_t)CAP_MIN(len, (int)sizeof(msg) - 1)) < 0)
		(void)0;
	_exit(127);
}

static void parent_alive(const struct child *c)
{
	struct pollfd p = { .fd = c->errfd, .events = POLLOUT };
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLERR))
		_exit(127);
}

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
		die(c, what, -r);
	}
	int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0444);
	if (fd >= 0)
		close(fd);
	if (mount(src, path, NULL, MS_BIND, NULL) < 0 ||
	    mount(NULL, path, NULL, MS_BIND | MS_REMOUNT | flags, NULL) < 0) {
		snprintf(what, sizeof(what), "binding %s at %s in the jail", src, dst);
		die(c, what, errno);
	}
}

/* A sparse file copied whole, holes kept (cap_copy_sparse). */
static int copy_sparse(int in, int out)
{
	off_t end = lseek(in, 0, SEEK_END);
	if (end < 0 || ftruncate(out, end) < 0)
		return -errno;
	return cap_copy_sparse(in, out, end);
}

static void build_root(const struct child *c)
{
	const struct cap_jail *j = c->j;
	unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
	char opts[128];

	/* Nothing we mount here reaches the host, nothing of the host's
	 * later mounts reaches us. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die(c, "making mounts private", errno);
	if (mount("capsule-jail", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV,
		  "size=1m,nr_inodes=1024,mode=0755") < 0)
		die(c, "mounting the jail's root", errno);
	for (size_t i = 0; i < c->files->n; i++)
		bind_file(c, c->files->v[i], c->files->v[i], ro);
	bind_file(c, j->owned_kernel, CAP_JAIL_KERNEL, ro | MS_NOEXEC);
	bind_file(c, j->owned_initrd, CAP_JAIL_INITRD, ro | MS_NOEXEC);
	bind_file(c, "/dev/null", "/dev/null", MS_NOSUID | MS_NOEXEC);
	bind_file(c, "/dev/urandom", "/dev/urandom", MS_RDONLY | MS_NOSUID | MS_NOEXEC);
	if (j->kvm)
		bind_file(c, "/dev/kvm", "/dev/kvm", MS_NOSUID | MS_NOEXEC);

	if (j->ram_proc) {
		/* QEMU opens its RAM as /proc/self/fd/N: a proc of its own
		 * PID namespace showing its processes only, gone again once
		 * the RAM is open (cap_jail_ready). */
		if (mkdir(ROOT_MNT "/proc", 0555) < 0 ||
		    mount("proc", ROOT_MNT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "subset=pid,hidepid=invisible") < 0)
			die(c, "mounting a proc for the shared RAM", errno);
	}
	if (j->owned_ram_bind) {
		int fd = open(j->owned_ram_bind, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || fchown(fd, j->uid, j->gid) < 0)
			die(c, "preparing the RAM file", errno);
		close(fd);
		bind_file(c, j->owned_ram_bind, CAP_JAIL_RAM, MS_NOSUID | MS_NODEV | MS_NOEXEC);
	} else if (c->ramfd >= 0) {
		char dir[PATH_MAX], file[PATH_MAX];
		snprintf(dir, sizeof(dir), ROOT_MNT "/mem");
		snprintf(file, sizeof(file), ROOT_MNT "%s", CAP_JAIL_RAM);
		struct stat st;
		if (fstat(c->ramfd, &st) < 0)
			die(c, "reading the template's RAM", errno);
		snprintf(opts, sizeof(opts), "size=%lldk,nr_inodes=4,mode=0700,uid=%u,gid=%u",
			 (long long)(st.st_size + 1023) / 1024 + 4, (unsigned)j->uid, (unsigned)j->gid);
		if (mkdir(dir, 0700) < 0 ||
		    mount("capsule-ram", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
			die(c, "mounting the RAM tmpfs", errno);
		/* Empty for now: the copier fills it while QEMU starts. */
		int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 || ftruncate(fd, st.st_size) < 0 || fchown(fd, j->uid, j->gid) < 0)
			die(c, "creating the RAM file", errno);
		close(fd);
	}

	/* QEMU's user networking sends the guest's DNS queries to the first
	 * nameserver here: the policy process's socket in the namespace. */
	if (j->netns >= 0) {
		static const char resolv[] = "nameserver 127.0.0.1\n";
		int fd = -1;
		if ((mkdir(ROOT_MNT "/etc", 0755) < 0 && errno != EEXIST) ||
		    (fd = open(ROOT_MNT "/etc/resolv.conf", O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0 ||
		    cap_write_all(fd, resolv, sizeof(resolv) - 1) < 0)
			die(c, "writing /etc/resolv.conf in the jail", errno);
		close(fd);
	}

	if (sethostname("capsule", 7) < 0)
		die(c, "setting the host name", errno);
	if (chdir(ROOT_MNT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 ||
	    umount2(".", MNT_DETACH) < 0 || chdir("/") < 0)
		die(c, "pivot_root into the jail", errno);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL) < 0)
		die(c, "making the jail's root read-only", errno);
}

/* Move fds[0..n) (and the slot lock after them) to 3, 4, ... and close
 * everything else but errfd. */
static void place_fds(struct child *c)
{
	int hi = 3 + (int)c->n + 64;
	int tmp[c->n + 1];
	unsigned total = c->n + (c->j->lock_fd >= 0 ? 1 : 0);
	for (unsigned i = 0; i < total; i++) {
		int src = i < c->n ? c->fds[i] : c->j->lock_fd;
		if ((tmp[i] = fcntl(src, F_DUPFD_CLOEXEC, hi)) < 0)
			die(c, "passing descriptors", errno);
	}
	int efd = fcntl(c->errfd, F_DUPFD_CLOEXEC, hi + 64);
	if (efd < 0)
		die(c, "passing descriptors", errno);
	c->errfd = efd;
	if (dup2(c->nullfd, 0) < 0 || dup2(c->logfd, 1) < 0 || dup2(c->logfd, 2) < 0)
		die(c, "setting up stdio", errno);
	for (unsigned i = 0; i < total; i++)
		if (dup2(tmp[i], 3 + (int)i) < 0)
			die(c, "passing descriptors", errno);
	syscall(SYS_close_range, 3U + total, (unsigned)efd - 1, 0U);
	syscall(SYS_close_range, (unsigned)efd + 1, ~0U, 0U);
}

/* Move the calling process, single-threaded, into the jail's cgroups.
 * On v1 through the per-thread file: moving only the current thread
 * skips the global lock (and its RCU grace period) that moving a whole
 * process takes. 0, or -errno with *failed the index that failed. */
static int join_cgroups(const struct cap_jail *j, int *failed)
{
	for (int i = 0; i < 3; i++) {
		char path[PATH_MAX + 32];
		if (!j->owned_cg[i])
			continue;
		snprintf(path, sizeof(path), "%s/%s", j->owned_cg[i], j->cg_version == 1 ? "tasks" : "cgroup.procs");
		int r = cap_cgroup_write(path, "0");
		if (r < 0) {
			*failed = i;
			return r;
		}
	}
	return 0;
}

__attribute__((noreturn)) static void child_main(struct child *c)
{
	const struct cap_jail *j = c->j;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	parent_alive(c);
	if (j->confined && j->netns >= 0 && setns(j->netns, CLONE_NEWNET) < 0)
		die(c, "joining the VM's network namespace", errno);
	int failed = 0, r = join_cgroups(j, &failed);
	if (r < 0) {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof(what), "joining cgroup %s", j->owned_cg[failed]);
		die(c, what, -r);
	}
	if (j->confined) {
		umask(022);	/* the jail's user must traverse what we make */
		build_root(c);
	}

	struct rlimit lim[][2] = {
		{ { RLIMIT_CORE, 0 }, { 0, 0 } },
		{ { RLIMIT_NOFILE, 0 }, { NOFILE, NOFILE } },
		{ { RLIMIT_NPROC, 0 }, { NPROC, NPROC } },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(lim); i++) {
		if (i == 2 && !j->confined)
			continue;	/* per user: only meaningful for a user of its own */
		if (setrlimit((int)lim[i][0].rlim_cur, &lim[i][1]) < 0)
			die(c, "setting rlimits", errno);
	}
	if (j->confined) {
		gid_t groups[1] = { j->kvm_gid };
		if (setgroups(j->kvm_gid != (gid_t)-1 ? 1 : 0, groups) < 0 ||
		    setresgid(j->gid, j->gid, j->gid) < 0 || setresuid(j->uid, j->uid, j->uid) < 0)
			die(c, "switching to the jail's user", errno);
		/* A change of credentials clears the parent-death signal. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		parent_alive(c);
	}
	/* Nothing QEMU execs could gain privileges. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die(c, "setting no_new_privs", errno);
	place_fds(c);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	char *envp[] = { NULL };
	execve(c->qemu, c->argv, envp);
	die(c, c->qemu, errno);
}

/* The template's RAM goes into the jail's copy while QEMU starts (the
 * copy takes ~17 ms here, about as long as QEMU's own start). A process
 * of ours in the VM's cgroup, so that the pages are charged to the VM,
 * writes through /proc/PID/root. cap_jail_ready waits for it. */
static int start_copier(struct cap_jail *j, pid_t qemu, int ramfd, struct cap_err *err)
{
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/root%s", (int)qemu, CAP_JAIL_RAM);
	pid_t pid = fork();
	if (pid < 0)
		return cap_err_set(err, errno, "fork: %s", strerror(errno));
	if (pid > 0) {
		j->copier = pid;
		return 0;
	}
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	int failed = 0;
	if (join_cgroups(j, &failed) < 0)
		_exit(10);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		_exit(11);
	_exit(copy_sparse(ramfd, fd) < 0 ? 12 : 0);
}

/* Detach the proc that QEMU opened its shared RAM through, from a child
 * of ours in QEMU's mount namespace. 0, or -errno with err set. */
static int detach_proc(struct cap_jail *j, struct cap_err *err)
{
	j->ram_proc = false;
	char path[64];
	snprintf(path, sizeof(path), "/proc/%d/ns/mnt", (int)j->pid);
	int ns = open(path, O_RDONLY | O_CLOEXEC);
	if (ns < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	pid_t pid = fork();
	if (pid == 0) {
		if (setns(ns, CLONE_NEWNS) < 0)
			_exit(10);
		_exit(umount2("/proc", MNT_DETACH) < 0 ? 11 : 0);
	}
	int e = errno, st = 0;
	close(ns);
	if (pid < 0)
		return cap_err_set(err, e, "fork: %s", strerror(e));
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	return cap_err_set(err, EPERM, "cannot detach the proc of QEMU's jail: %s failed",
			   WIFEXITED(st) && WEXITSTATUS(st) == 10 ? "joining its mount namespace" : "unmounting it");
}

int cap_jail_ready(struct cap_jail *j, struct cap_err *err)
{
	if (j->ram_proc && j->pid > 0)
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
				   j->owned_ram_copy, strerror(errno));
	if (WIFEXITED(st) && WEXITSTATUS(st) == 0)
		return 0;
	static const char *const what[] = { "joining the VM's cgroup", "opening the jail's RAM file", "copying" };
	int code = WIFEXITED(st) ? WEXITSTATUS(st) : 0;
	return cap_err_set(err, EIO, "cannot copy %s into the jail: %s failed", j->owned_ram_copy,
			   code >= 10 && code <= 12 ? what[code - 10] : "the copier was killed; it");
}

/* ---- helpers of a VM ------------------------------------------------ */

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Close every descriptor but the n in keep. */
static void keep_only(int *keep, unsigned n)
{
	qsort(keep, n, sizeof(int), cmp_int);
	unsigned from = 0;
	for (unsigned i = 0; i < n; i++) {
		if ((unsigned)keep[i] > from)
			syscall(SYS_close_range, from, (unsigned)keep[i] - 1, 0U);
		from = (unsigned)keep[i] + 1;
	}
	syscall(SYS_close_range, from, ~0U, 0U);
}

/* A helper's own mount and IPC namespaces and its root: a small tmpfs
 * holding /dev/null and those of files[0..nfiles) that exist, bound
 * read-only at their own paths, then pivot_root and the root made
 * read-only. Nothing else of the host is reachable by path. */
static void helper_root(const struct child *c, const char *const *files, unsigned nfiles)
{
	if (unshare(CLONE_NEWNS | CLONE_NEWIPC) < 0)
		die(c, "creating the helper's mount and IPC namespaces", errno);
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die(c, "making mounts private", errno);
	if (mount("capsule-helper", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC,
		  "size=16k,nr_inodes=64,mode=0755") < 0)
		die(c, "mounting the helper's root", errno);
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
		die(c, "pivot_root into the helper's root", errno);
	if (mount(NULL, "/", NULL, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0)
		die(c, "making the helper's root read-only", errno);
}

/* The helper's side: confine itself, report a failed step on c->errfd
 * (closing it means ready), then run fn. */
__attribute__((noreturn)) static void helper_main(struct child *c, int netns,
						  const char *const *files, unsigned nfiles,
						  const int *keep, unsigned nkeep,
						  int (*fn)(void *ud), void *ud)
{
	const struct cap_jail *j = c->j;
	uid_t uid = cap_jail_helper_uid(j);
	gid_t gid = (gid_t)uid;

	prctl(PR_SET_PDEATHSIG, SIGKILL);
	parent_alive(c);
	if (netns >= 0 && setns(netns, CLONE_NEWNET) < 0)
		die(c, "joining the VM's network namespace", errno);
	/* The cgroup files are reached by path: before the new root. */
	int failed = 0, r = join_cgroups(j, &failed);
	if (r < 0) {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof(what), "joining cgroup %s", j->owned_cg[failed]);
		die(c, what, -r);
	}
	helper_root(c, files, nfiles);
	struct rlimit lim[][2] = {
		{ { RLIMIT_CORE, 0 }, { 0, 0 } },
		{ { RLIMIT_NOFILE, 0 }, { NOFILE, NOFILE } },
		{ { RLIMIT_NPROC, 0 }, { HELPER_NPROC, HELPER_NPROC } },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(lim); i++)
		if (setrlimit((int)lim[i][0].rlim_cur, &lim[i][1]) < 0)
			die(c, "setting rlimits", errno);
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0)
		die(c, "switching to the jail's helper user", errno);
	/* A change of credentials clears the parent-death signal. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	parent_alive(c);
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die(c, "setting no_new_privs", errno);
	/* The owner's handlers and mask are its own business. */
	struct sigaction dfl = { .sa_handler = SIG_DFL }, ign = { .sa_handler = SIG_IGN };
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, sig == SIGPIPE ? &ign : &dfl, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	int kept[nkeep + 4];
	for (unsigned i = 0; i < nkeep; i++)
		kept[i] = keep[i];
	kept[nkeep] = 0;
	kept[nkeep + 1] = 1;
	kept[nkeep + 2] = 2;
	kept[nkeep + 3] = c->errfd;
	keep_only(kept, nkeep + 4);
	close(c->errfd);	/* ready */
	_exit(fn(ud));
}

pid_t cap_jail_helper(struct cap_jail *j, int netns, const char *const *files,
		      unsigned nfiles, const int *keep, unsigned nkeep,
		      int (*fn)(void *ud), void *ud, int *pidfd, struct cap_err *err)
{
	CAP_BUG_ON(!j->confined);
	int r = cap_mkdir_p(ROOT_MNT, 0755);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", ROOT_MNT, strerror(-r));
	for (unsigned i = 0; i < nfiles; i++)
		if (files[i][0] != '/' || strlen(files[i]) >= PATH_MAX)
			return cap_err_set(err, EINVAL, "a VM's helper cannot be given %s: not an absolute path", files[i]);
	if (nkeep > NOFILE)
		return cap_err_set(err, EINVAL, "a VM's helper cannot keep %u descriptors (at most %d)", nkeep, NOFILE);
	for (unsigned i = 0; i < nkeep; i++)
		if (keep[i] < 0 || fcntl(keep[i], F_GETFD) < 0)
			return cap_err_set(err, EBADF, "descriptor %d given to a VM's helper is not open", keep[i]);
	int ep[2];
	if (pipe2(ep, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(ep[0]);
		close(ep[1]);
		return cap_err_set(err, e, "cannot start a helper of the VM (fork): %s", strerror(e));
	}
	if (pid == 0) {
		close(ep[0]);
		struct child c = { .j = j, .errfd = ep[1], .logfd = -1, .nullfd = -1, .ramfd = -1 };
		helper_main(&c, netns, files, nfiles, keep, nkeep, fn, ud);
	}
	close(ep[1]);
	/* Our child, not reaped yet: its pid cannot have been reused. */
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	int e = pfd < 0 ? errno : 0;
	char msg[512] = "";
	size_t len = pfd >= 0 ? read_failure(ep[0], msg, sizeof(msg)) : 0;
	close(ep[0]);
	if (pfd < 0 || len > 0) {
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (pfd < 0)
			return cap_err_set(err, e, "pidfd_open: %s", strerror(e));
		close(pfd);
		return cap_err_set(err, EPERM, "cannot confine a helper of the VM: %s", msg);
	}
	*pidfd = pfd;
	return pid;
}

pid_t cap_jail_spawn(struct cap_jail *j, char *const argv[], int logfd,
		     const int *fds, unsigned n, int *pidfd,
		     struct cap_err *err)
{
	_cleanup_free_ char *qemu = cap_find_program(argv[0]);
	struct lines files = { 0 };
	_cleanup_close_ int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	_cleanup_close_ int ramfd = -1;
	int ep[2] = { -1, -1 }, r;
	pid_t pid = -1;

	if (!qemu)
		return cap_err_set(err, ENOENT, "%s is not installed (in PATH); run scripts/bootstrap.sh", argv[0]);
	if (nullfd < 0)
		return cap_err_set(err, errno, "/dev/null: %s", strerror(errno));
	if (j->confined) {
		if ((r = cap_mkdir_p(ROOT_MNT, 0755)) < 0)
			return cap_err_set(err, -r, "cannot create %s: %s", ROOT_MNT, strerror(-r));
		if ((r = qemu_files(qemu, &files, err)) < 0)
			return r;
		if (j->owned_ram_copy && (ramfd = open(j->owned_ram_copy, O_RDONLY | O_CLOEXEC)) < 0) {
			r = cap_err_set(err, errno, "cannot open %s: %s", j->owned_ram_copy, strerror(errno));
			goto out;
		}
	}
	if (pipe2(ep, O_CLOEXEC) < 0) {
		r = cap_err_set(err, errno, "pipe: %s", strerror(errno));
		goto out;
	}
	struct clone_args ca = {
		.flags = CLONE_PIDFD | (!j->confined ? 0 : j->netns >= 0 ? NS_FLAGS & ~CLONE_NEWNET : NS_FLAGS),
		.pidfd = (uint64_t)(uintptr_t)pidfd,
		.exit_signal = SIGCHLD,
	};
	pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid < 0) {
		r = cap_err_set(err, errno, "cannot start QEMU in its jail (clone3): %s", strerror(errno));
		goto out;
	}
	if (pid == 0) {
		close(ep[0]);
		struct child c = { j, qemu, argv, ep[1], logfd, nullfd, ramfd, fds, n, &files };
		child_main(&c);
	}
	close(ep[1]);
	ep[1] = -1;
	/* The child reports a failed step on the pipe; end of file means
	 * QEMU is running. */
	char msg[512];
	size_t len = read_failure(ep[0], msg, sizeof(msg));
	if (len > 0) {
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		close(*pidfd);
		*pidfd = -1;
		r = cap_err_set(err, EPERM, "cannot confine QEMU: %s", msg);
		pid = -1;
		goto out;
	}
	j->pid = pid;
	if (ramfd >= 0 && (r = start_copier(j, pid, ramfd, err)) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		close(*pidfd);
		*pidfd = -1;
		pid = -1;
		goto out;
	}
	r = 0;
out:
	if (ep[0] >= 0)
		close(ep[0]);
	if (ep[1] >= 0)
		close(ep[1]);
	lines_free(&files);
	return r < 0 ? r : pid;
}
