/* The jail's cgroups: limits, joining, removal, the sweep of leftovers
 * (jail.h; docs/architecture.md, "The jail"). */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <linux/magic.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include "cgroup.h"
#include "jail-internal.h"
#include "paths.h"
#include "util.h"

static const char *const v1_controllers[] = { "memory", "pids", "cpu" };

struct cgroups {
	int version;		/* 1 or 2; 0: none usable */
	char root[160];		/* where the hierarchies are mounted */
	char parent[512];	/* our folder in each hierarchy: a relative path,
				 * "capsule" or CAPSULE_CGROUP_PARENT (an OCI
				 * container's cgroupsPath, docs/oci.md) */
	char why[480];		/* why none is usable */
};

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
int jail_cg_remove(const char *dir)
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
		jail_cg_remove(out[i]);	/* a leftover of this slot */
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

static int probe(const struct cgroups *cg, char *detail, size_t len)
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

/* Move the calling process, single-threaded, into the jail's cgroups.
 * On v1 through the per-thread file: moving only the current thread
 * skips the global lock (and its RCU grace period) that moving a whole
 * process takes. 0, or -errno with *failed the index that failed. */
int jail_cg_join(const struct cap_jail *j, int *failed)
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

void jail_cg_probe(struct cap_jail_check *c, bool off)
{
	struct cgroups cg;
	cg_detect(&cg);
	if (off)
		snprintf(c->detail, sizeof(c->detail), "the jail is off (CAPSULE_JAIL=0, a debug setting)");
	else if (geteuid() != 0)
		snprintf(c->detail, sizeof(c->detail), "capsule is not root: it cannot create cgroups");
	else
		c->active = probe(&cg, c->detail, sizeof(c->detail)) == 0;
}

void jail_cg_setup(struct cap_jail *j, const struct cap_jail_spec *spec)
{
	/* No usable cgroups: the VM runs without limits, and says so. */
	struct cgroups cg;
	cg_detect(&cg);
	j->cg_version = cg.version;
	if (cg.version == 0) {
		jail_note_missing(j, "cgroup limits", cg.why);
		return;
	}
	char name[32];
	struct cap_err cerr = { 0 };
	snprintf(name, sizeof(name), "vm-%d", j->slot);
	if (cg_create(&cg, name, spec, j->owned_cg, &cerr) < 0) {
		jail_note_missing(j, "cgroup limits", cerr.msg);
		for (int i = 0; i < 3; i++) {
			if (j->owned_cg[i])
				jail_cg_remove(j->owned_cg[i]);
			free(j->owned_cg[i]);
			j->owned_cg[i] = NULL;
		}
	}
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
		int fd = jail_user_slot_try(n);
		if (fd < 0)
			continue;	/* a live VM holds it */
		char *dirs[3] = { NULL, NULL, NULL };
		unsigned k = cg_dirs(&cg, e->d_name, dirs);
		int r = 0;
		for (unsigned i = 0; i < k; i++) {
			int q = jail_cg_remove(dirs[i]);
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
