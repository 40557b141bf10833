/* The jail around each VM's process (jail.h; docs/architecture.md, "The jail"). */
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

/* One bind into the root: host path, path in the root, mount flags. */
struct bind {
	char *owned_host;
	char *owned_at;
	unsigned long flags;
};

struct cap_jail {
	bool confined;		/* namespaces + private root + own user */
	int slot;		/* -1: none */
	int lock_fd;		/* holds the slot */
	uid_t uid;
	gid_t gid;
	gid_t groups[CAP_JAIL_MAX_DEVICES];	/* of the devices: supplementary */
	unsigned ngroups;
	char *owned_cg[3];	/* cgroup folders, NULL when none */
	int cg_version;
	char *owned_exe;
	const char *name;	/* the program's base name, in owned_exe */
	struct bind *owned_binds;	/* the program, its files, the devices */
	unsigned nbinds;
	char *owned_rw_file, *owned_rw_at;
	char *owned_copy_file, *owned_copy_at;
	pid_t copier;		/* filling the jail's copy_at, or -1 */
	bool own_proc;		/* a proc for the program to open spec.sealed_fd, detached by cap_jail_ready */
	pid_t pid;		/* the program, once spawned; else -1 */
	int netns;		/* its network namespace (borrowed), or -1: a new one */
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
	unsigned long long mem = spec->memory_max;
	unsigned pids = spec->pids_max;
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
		snprintf(detail, len, "cgroup v2 %s/%.200s/vm-N: memory.max and pids.max as the engine sets them, swap 0, cpu.weight 100 per vCPU",
			 cg->root, cg->parent);
	else
		snprintf(detail, len, "cgroup v1 %s/{memory,pids,cpu}/%.200s/vm-N: memory limit and pids.max as the engine sets them, swap 0, cpu.shares 1024 per vCPU",
			 cg->root, cg->parent);
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
		c[1].active = true;
		snprintf(c[1].detail, sizeof(c[1].detail), "pivot_root into a tmpfs holding only the files the engine lists (its program, libraries, firmware, the guest's kernel and initramfs), /dev/null, /dev/urandom, its devices and the VM's RAM; disks and sockets passed as descriptors");
	}

	if (!c[0].active)
		snprintf(c[2].detail, sizeof(c[2].detail), "%s", c[0].detail);
	else if (geteuid() != 0)
		snprintf(c[2].detail, sizeof(c[2].detail), "capsule is not root: it cannot switch a VM's process to a user of its own");
	else {
		c[2].active = true;
		snprintf(c[2].detail, sizeof(c[2].detail), "UID and GID %u + slot, one per running VM (%d slots, locks in %s); a VM's helpers %u + slot",
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
		 ? "this kernel has seccomp filters; the VM's program installs its own (the engine's options deny all it can)"
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

static bool absolute(const char *path)
{
	return path && path[0] == '/' && strlen(path) < PATH_MAX - 64;
}

/* Whether spec can be confined as it says; -EINVAL with err if not. */
static int spec_check(const struct cap_jail_spec *spec, struct cap_err *err)
{
	if (!absolute(spec->exe))
		return cap_err_set(err, EINVAL, "a jail's program must be an absolute path, not %s",
				   spec->exe ? spec->exe : "(none)");
	for (unsigned i = 0; i < spec->nfiles; i++) {
		const struct cap_jail_file *f = &spec->files[i];
		if (!absolute(f->host) || (f->at && !absolute(f->at)))
			return cap_err_set(err, EINVAL, "a jail cannot hold %s%s%s: not an absolute path",
					   f->host ? f->host : "(none)", f->at ? " at " : "", f->at ? f->at : "");
	}
	if (spec->ndevices > CAP_JAIL_MAX_DEVICES)
		return cap_err_set(err, EINVAL, "a jail holds at most %d devices, not %u", CAP_JAIL_MAX_DEVICES,
				   spec->ndevices);
	for (unsigned i = 0; i < spec->ndevices; i++)
		if (!absolute(spec->devices[i]))
			return cap_err_set(err, EINVAL, "a jail cannot hold device %s: not an absolute path",
					   spec->devices[i] ? spec->devices[i] : "(none)");
	int mems = !!spec->rw_file + !!spec->copy_file + (spec->sealed_fd > 0);
	if (mems > 1)
		return cap_err_set(err, EINVAL, "a jail takes one memory file: rw_file, copy_file or sealed_fd");
	if (spec->rw_file && (!absolute(spec->rw_file) || !absolute(spec->rw_at)))
		return cap_err_set(err, EINVAL, "a jail's read-write file and its place must be absolute paths");
	const char *slash = spec->copy_at ? strrchr(spec->copy_at, '/') : NULL;
	if (spec->copy_file && (!absolute(spec->copy_file) || !absolute(spec->copy_at) ||
				slash == spec->copy_at || !slash[1]))
		return cap_err_set(err, EINVAL, "a jail's copied file must go to /dir/name, not %s",
				   spec->copy_at ? spec->copy_at : "(none)");
	return 0;
}

static void bind_add(struct cap_jail *j, const char *host, const char *at, unsigned long flags)
{
	for (unsigned i = 0; i < j->nbinds; i++)
		if (strcmp(j->owned_binds[i].owned_at, at) == 0)
			return;
	j->owned_binds = xrealloc(j->owned_binds, (j->nbinds + 1) * sizeof(*j->owned_binds));
	j->owned_binds[j->nbinds++] = (struct bind){ xstrdup(host), xstrdup(at), flags };
}

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

int cap_jail_new(const struct cap_jail_spec *spec, struct cap_jail **out,
		 struct cap_err *err)
{
	int r = spec_check(spec, err);
	if (r < 0)
		return r;
	struct cap_jail *j = xcalloc(1, sizeof(*j));
	j->slot = -1;
	j->lock_fd = -1;
	j->copier = -1;
	j->pid = -1;
	j->netns = -1;
	j->owned_exe = xstrdup(spec->exe);
	j->name = strrchr(j->owned_exe, '/') + 1;
	unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
	bind_add(j, spec->exe, spec->exe, ro);
	for (unsigned i = 0; i < spec->nfiles; i++) {
		const struct cap_jail_file *f = &spec->files[i];
		bind_add(j, f->host, f->at ? f->at : f->host, ro | (f->exec ? 0 : MS_NOEXEC));
	}
	for (unsigned i = 0; i < spec->ndevices; i++)
		bind_add(j, spec->devices[i], spec->devices[i], MS_NOSUID | MS_NOEXEC);
	j->owned_rw_file = dup_or_null(spec->rw_file);
	j->owned_rw_at = dup_or_null(spec->rw_at);
	j->owned_copy_file = dup_or_null(spec->copy_file);
	j->owned_copy_at = dup_or_null(spec->copy_at);

	if (env_is("CAPSULE_JAIL", "0"))
		note_missing(j, "the jail", "CAPSULE_JAIL=0, a debug setting");
	else if (!may_confine())
		note_missing(j, "namespaces, private root, unprivileged user, cgroup limits",
			     "capsule lacks CAP_SYS_ADMIN, CAP_SETUID or CAP_SETGID: the jail needs root");
	else
		j->confined = true;
	if (!j->confined)
		goto done;
	if (spec->sealed_fd > 0) {
		/* The one thing that keeps a compromised program from
		 * rewriting what every later VM starts from: looked at here. */
		int seals = fcntl(spec->sealed_fd, F_GET_SEALS);
		int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
		if (seals < 0 || (seals & need) != need) {
			r = cap_err_set(err, EPERM, "refusing to give %s a memory descriptor not sealed against writes (seals %#x)",
					j->name, seals < 0 ? 0 : seals);
			goto fail;
		}
		j->own_proc = true;
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
	/* Each device is the jail user's through its group. */
	for (unsigned i = 0; i < spec->ndevices; i++) {
		struct stat st;
		if (stat(spec->devices[i], &st) < 0)
			continue;
		bool have = false;
		for (unsigned k = 0; k < j->ngroups; k++)
			have |= j->groups[k] == st.st_gid;
		if (!have)
			j->groups[j->ngroups++] = st.st_gid;
	}
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
		r = cap_err_set(err, EPERM, "CAPSULE_REQUIRE_JAIL=1 and this host cannot confine %s fully: missing %s; `capsule doctor` lists each protection",
				j->name, j->note);
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
	if (j->confined && j->owned_rw_file && chown(j->owned_rw_file, 0, 0) < 0)
		errno = 0;
	if (j->lock_fd >= 0)
		close(j->lock_fd);
	for (unsigned i = 0; i < j->nbinds; i++) {
		free(j->owned_binds[i].owned_host);
		free(j->owned_binds[i].owned_at);
	}
	free(j->owned_binds);
	free(j->owned_exe);
	free(j->owned_rw_file);
	free(j->owned_rw_at);
	free(j->owned_copy_file);
	free(j->owned_copy_at);
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
	char *const *argv;
	int errfd, logfd, nullfd;
	int copyfd;		/* spec.copy_file, to size its tmpfs; or -1 */
	const int *fds;
	unsigned n;
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
	char opts[128];

	/* Nothing we mount here reaches the host, nothing of the host's
	 * later mounts reaches us. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		die(c, "making mounts private", errno);
	if (mount("capsule-jail", ROOT_MNT, "tmpfs", MS_NOSUID | MS_NODEV,
		  "size=1m,nr_inodes=1024,mode=0755") < 0)
		die(c, "mounting the jail's root", errno);
	for (unsigned i = 0; i < j->nbinds; i++)
		bind_file(c, j->owned_binds[i].owned_host, j->owned_binds[i].owned_at, j->owned_binds[i].flags);
	bind_file(c, "/dev/null", "/dev/null", MS_NOSUID | MS_NOEXEC);
	bind_file(c, "/dev/urandom", "/dev/urandom", MS_RDONLY | MS_NOSUID | MS_NOEXEC);

	if (j->own_proc) {
		/* The program opens its sealed memory as /proc/self/fd/N: a
		 * proc of its own PID namespace showing its processes only,
		 * gone again once it is open (cap_jail_ready). */
		if (mkdir(ROOT_MNT "/proc", 0555) < 0 ||
		    mount("proc", ROOT_MNT "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC,
			  "subset=pid,hidepid=invisible") < 0)
			die(c, "mounting a proc for the sealed memory", errno);
	}
	if (j->owned_rw_file) {
		int fd = open(j->owned_rw_file, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
		if (fd < 0 || fchown(fd, j->uid, j->gid) < 0)
			die(c, "preparing the read-write file", errno);
		close(fd);
		bind_file(c, j->owned_rw_file, j->owned_rw_at, MS_NOSUID | MS_NODEV | MS_NOEXEC);
	} else if (c->copyfd >= 0) {
		char dir[PATH_MAX], file[PATH_MAX];
		snprintf(file, sizeof(file), ROOT_MNT "%s", j->owned_copy_at);
		snprintf(dir, sizeof(dir), "%s", file);
		*strrchr(dir, '/') = '\0';
		struct stat st;
		if (fstat(c->copyfd, &st) < 0)
			die(c, "reading the file to copy", errno);
		snprintf(opts, sizeof(opts), "size=%lldk,nr_inodes=4,mode=0700,uid=%u,gid=%u",
			 (long long)(st.st_size + 1023) / 1024 + 4, (unsigned)j->uid, (unsigned)j->gid);
		int r = cap_mkdir_p(dir, 0700);
		if (r < 0)
			die(c, "creating the copy's tmpfs", -r);
		if (mount("capsule-ram", dir, "tmpfs", MS_NOSUID | MS_NODEV | MS_NOEXEC, opts) < 0)
			die(c, "mounting the copy's tmpfs", errno);
		/* Empty for now: the copier fills it while the program starts. */
		int fd = open(file, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		if (fd < 0 || ftruncate(fd, st.st_size) < 0 || fchown(fd, j->uid, j->gid) < 0)
			die(c, "creating the copy", errno);
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
		if (setgroups(j->ngroups, j->groups) < 0 ||
		    setresgid(j->gid, j->gid, j->gid) < 0 || setresuid(j->uid, j->uid, j->uid) < 0)
			die(c, "switching to the jail's user", errno);
		/* A change of credentials clears the parent-death signal. */
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		parent_alive(c);
	}
	/* Nothing it execs could gain privileges. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		die(c, "setting no_new_privs", errno);
	place_fds(c);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	char *envp[] = { NULL };
	execve(j->owned_exe, c->argv, envp);
	die(c, j->owned_exe, errno);
}

/* spec.copy_file goes into the jail's copy while the program starts (a
 * template's RAM: ~17 ms here, about as long as the program's start). A
 * process of ours in the VM's cgroup, so that the pages are charged to
 * the VM, writes through /proc/PID/root. cap_jail_ready waits for it. */
static int start_copier(struct cap_jail *j, pid_t prog, int copyfd, struct cap_err *err)
{
	char path[PATH_MAX + 32];
	snprintf(path, sizeof(path), "/proc/%d/root%s", (int)prog, j->owned_copy_at);
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
	_exit(copy_sparse(copyfd, fd) < 0 ? 12 : 0);
}

/* Detach the proc that the program opened its sealed memory through,
 * from a child of ours in its mount namespace. 0, or -errno with err. */
static int detach_proc(struct cap_jail *j, struct cap_err *err)
{
	j->own_proc = false;
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
	return cap_err_set(err, EPERM, "cannot detach the proc of %s's jail: %s failed", j->name,
			   WIFEXITED(st) && WEXITSTATUS(st) == 10 ? "joining its mount namespace" : "unmounting it");
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
		struct child c = { .j = j, .errfd = ep[1], .logfd = -1, .nullfd = -1, .copyfd = -1 };
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
	_cleanup_close_ int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	_cleanup_close_ int copyfd = -1;
	int ep[2] = { -1, -1 }, r;
	pid_t pid = -1;

	if (nullfd < 0)
		return cap_err_set(err, errno, "/dev/null: %s", strerror(errno));
	if (j->confined) {
		if ((r = cap_mkdir_p(ROOT_MNT, 0755)) < 0)
			return cap_err_set(err, -r, "cannot create %s: %s", ROOT_MNT, strerror(-r));
		if (j->owned_copy_file && (copyfd = open(j->owned_copy_file, O_RDONLY | O_CLOEXEC)) < 0)
			return cap_err_set(err, errno, "cannot open %s: %s", j->owned_copy_file, strerror(errno));
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
		r = cap_err_set(err, errno, "cannot start %s in its jail (clone3): %s", j->name, strerror(errno));
		goto out;
	}
	if (pid == 0) {
		close(ep[0]);
		struct child c = { j, argv, ep[1], logfd, nullfd, copyfd, fds, n };
		child_main(&c);
	}
	close(ep[1]);
	ep[1] = -1;
	/* The child reports a failed step on the pipe; end of file means
	 * the program is running. */
	char msg[512];
	size_t len = read_failure(ep[0], msg, sizeof(msg));
	if (len > 0) {
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		close(*pidfd);
		*pidfd = -1;
		r = cap_err_set(err, EPERM, "cannot confine %s: %s", j->name, msg);
		pid = -1;
		goto out;
	}
	j->pid = pid;
	if (copyfd >= 0 && (r = start_copier(j, pid, copyfd, err)) < 0) {
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
	return r < 0 ? r : pid;
}
