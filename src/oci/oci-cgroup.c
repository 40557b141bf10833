/* An OCI container's cgroupsPath (docs/oci.md): made in every hierarchy
 * capsule limits or reports through, limited as linux.resources says,
 * joined by the monitor (its leaf "capsule"), removed with whatever is
 * left in it. The host's cgroups are found as the jail finds them
 * (jail-cgroup.c): CAPSULE_CGROUP_ROOT, else /sys/fs/cgroup, v2 when
 * that is a cgroup2 file system, else v1 hierarchies below it.
 *
 * The path is taken below each hierarchy's root whether or not it starts
 * with '/' (runc takes a relative one below its own cgroup), the way the
 * jail takes CAPSULE_CGROUP_PARENT, so that the monitor's leaf and the
 * jail's vm-N folders are siblings. Podman and containerd give absolute
 * paths.
 *
 * cpuset is left alone: a new v1 cpuset cgroup starts with empty
 * cpuset.cpus and cpuset.mems, so joining it fails until both are copied
 * from the parent, and the VM's vCPU count (linux.resources.cpu) is
 * already the container's CPU bound. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "cgroup.h"
#include "oci.h"
#include "util.h"

#ifndef CGROUP_SUPER_MAGIC
#define CGROUP_SUPER_MAGIC 0x27e0eb
#endif
#ifndef CGROUP2_SUPER_MAGIC
#define CGROUP2_SUPER_MAGIC 0x63677270
#endif

#define LEAF "capsule"

static const char *const v1_controllers[] = { "memory", "pids", "cpu", "cpuacct", "blkio", "freezer" };

/* The hierarchies' folders of one cgroupsPath. */
struct hier {
	int version;	/* 1 or 2 */
	char *dirs[CAP_ARRAY_SIZE(v1_controllers)];	/* <hierarchy>/<path>, owned */
	const char *ctl[CAP_ARRAY_SIZE(v1_controllers)];	/* v1: the controller; v2: NULL */
	char *roots[CAP_ARRAY_SIZE(v1_controllers)];	/* the hierarchies' roots, owned */
	size_t n;
};

static void hier_fini(struct hier *h)
{
	for (size_t i = 0; i < h->n; i++) {
		free(h->dirs[i]);
		free(h->roots[i]);
	}
	h->n = 0;
}

/* Find the hierarchies and the path's folder in each. 0, or -errno with
 * err set. */
static int hier_find(const char *cgroups_path, struct hier *h, struct cap_err *err)
{
	*h = (struct hier){ 0 };
	const char *path = cap_cgroup_rel_path(cgroups_path);
	if (!path || !*path)
		return cap_err_set(err, EINVAL, "cgroupsPath \"%s\" is not a path below the cgroup root (no \".\" or \"..\" components)", cgroups_path);
	const char *env = getenv("CAPSULE_CGROUP_ROOT");
	const char *root = env && *env ? env : "/sys/fs/cgroup";
	struct statfs sf;
	if (statfs(root, &sf) < 0)
		return cap_err_set(err, errno, "cannot find the host's cgroups at %s: %s", root, strerror(errno));
	if (sf.f_type == CGROUP2_SUPER_MAGIC) {
		h->version = 2;
		h->roots[0] = xstrdup(root);
		h->dirs[0] = xasprintf("%s/%s", root, path);
		h->n = 1;
		return 0;
	}
	h->version = 1;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(v1_controllers); i++) {
		_cleanup_free_ char *p = xasprintf("%s/%s", root, v1_controllers[i]);
		if (statfs(p, &sf) < 0 || sf.f_type != CGROUP_SUPER_MAGIC)
			continue;
		/* Co-mounted controllers (cpu -> cpu,cpuacct) once. */
		char *real = realpath(p, NULL);
		if (!real)
			continue;
		bool seen = false;
		for (size_t k = 0; k < h->n; k++)
			seen |= strcmp(h->roots[k], real) == 0;
		if (seen) {
			free(real);
			continue;
		}
		h->roots[h->n] = real;
		h->ctl[h->n] = v1_controllers[i];
		h->dirs[h->n] = xasprintf("%s/%s", real, path);
		h->n++;
	}
	if (h->n == 0)
		return cap_err_set(err, ENOENT, "%s is neither a cgroup v2 file system nor holds cgroup v1 hierarchies (memory, pids, cpu...); mount the cgroups or give no cgroupsPath", root);
	return 0;
}

static int set(const char *dir, const char *file, const char *val, struct cap_err *err)
{
	_cleanup_free_ char *path = xasprintf("%s/%s", dir, file);
	int r = cap_cgroup_write(path, val);
	if (r < 0)
		return cap_err_set(err, -r, "cannot set %s to %s: %s", path, val, strerror(-r));
	return 0;
}

/* mkdir -p of dir below root, handing the v2 controllers down every
 * level, and its leaf. */
static int make_levels(const struct hier *h, size_t i, struct cap_err *err)
{
	const char *root = h->roots[i], *dir = h->dirs[i];
	int r = cap_cgroup_mkdir_p(root, dir + strlen(root) + 1, h->version == 2, err);
	if (r < 0)
		return r;
	_cleanup_free_ char *leaf = xasprintf("%s/" LEAF, dir);
	if (mkdir(leaf, 0755) < 0 && errno != EEXIST)
		return cap_err_set(err, errno, "cannot create cgroup %s: %s", leaf, strerror(errno));
	return 0;
}

static int limit_v1(const struct cap_oci_config *c, const char *ctl, const char *dir,
		    struct cap_err *err)
{
	char v[64];
	int r = 0;
	if (strcmp(ctl, "memory") == 0 && c->memory_limit) {
		snprintf(v, sizeof(v), "%" PRIu64, c->memory_limit);
		r = set(dir, "memory.limit_in_bytes", v, err);
	} else if (strcmp(ctl, "pids") == 0 && c->pids_limit > 0) {
		snprintf(v, sizeof(v), "%" PRId64, c->pids_limit);
		r = set(dir, "pids.max", v, err);
	} else if (strcmp(ctl, "cpu") == 0) {
		if (c->cpu_shares) {
			snprintf(v, sizeof(v), "%" PRIu64, c->cpu_shares);
			r = set(dir, "cpu.shares", v, err);
		}
		if (r == 0 && c->cpu_quota > 0) {
			snprintf(v, sizeof(v), "%" PRIu64, c->cpu_period ? c->cpu_period : 100000);
			if ((r = set(dir, "cpu.cfs_period_us", v, err)) == 0) {
				snprintf(v, sizeof(v), "%" PRId64, c->cpu_quota);
				r = set(dir, "cpu.cfs_quota_us", v, err);
			}
		}
	}
	return r;
}

static int limit_v2(const struct cap_oci_config *c, const char *dir, struct cap_err *err)
{
	char v[64];
	int r = 0;
	if (c->memory_limit) {
		snprintf(v, sizeof(v), "%" PRIu64, c->memory_limit);
		r = set(dir, "memory.max", v, err);
	}
	if (r == 0 && c->pids_limit > 0) {
		snprintf(v, sizeof(v), "%" PRId64, c->pids_limit);
		r = set(dir, "pids.max", v, err);
	}
	if (r == 0 && c->cpu_shares) {
		/* runc's ConvertCPUSharesToCgroupV2Value: [2, 262144] onto [1, 10000]. */
		uint64_t s = CAP_MIN(CAP_MAX(c->cpu_shares, 2u), 262144u);
		snprintf(v, sizeof(v), "%" PRIu64, 1 + ((s - 2) * 9999) / 262142);
		r = set(dir, "cpu.weight", v, err);
	}
	if (r == 0 && c->cpu_quota > 0) {
		snprintf(v, sizeof(v), "%" PRId64 " %" PRIu64, c->cpu_quota, c->cpu_period ? c->cpu_period : 100000);
		r = set(dir, "cpu.max", v, err);
	}
	return r;
}

int cap_oci_cgroup_create(const struct cap_oci_config *c, struct cap_err *err)
{
	if (!c->cgroups_path || !*c->cgroups_path)
		return 0;
	struct hier h;
	int r = hier_find(c->cgroups_path, &h, err);
	for (size_t i = 0; r == 0 && i < h.n; i++) {
		if ((r = make_levels(&h, i, err)) < 0)
			break;
		r = h.version == 2 ? limit_v2(c, h.dirs[i], err) : limit_v1(c, h.ctl[i], h.dirs[i], err);
	}
	hier_fini(&h);
	return r;
}

int cap_oci_cgroup_join(const char *cgroups_path, struct cap_err *err)
{
	if (!cgroups_path || !*cgroups_path)
		return 0;
	struct hier h;
	int r = hier_find(cgroups_path, &h, err);
	char pid[24];
	snprintf(pid, sizeof(pid), "%d", (int)getpid());
	for (size_t i = 0; r == 0 && i < h.n; i++) {
		_cleanup_free_ char *leaf = xasprintf("%s/" LEAF, h.dirs[i]);
		r = set(leaf, "cgroup.procs", pid, err);
	}
	hier_fini(&h);
	return r;
}

/* Kill every process in dir and the folders below it (deepest first),
 * thawing a v1 freezer first: a frozen process does not die. */
static void kill_tree(const char *dir, int depth)
{
	if (depth > 64)
		return;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *sub = xasprintf("%s/%s", dir, e->d_name);
		kill_tree(sub, depth + 1);
	}
	if (d)
		closedir(d);
	_cleanup_free_ char *fz = xasprintf("%s/freezer.state", dir);
	if (access(fz, F_OK) == 0)
		cap_cgroup_write(fz, "THAWED");
	_cleanup_free_ char *procs = xasprintf("%s/cgroup.procs", dir);
	char *text = NULL;
	if (cap_read_file(procs, 1 << 20, &text) >= 0) {
		for (char *p = text; *p;) {
			char *end;
			long pid = strtol(p, &end, 10);
			if (end == p)
				break;
			if (pid > 0 && pid != getpid())
				kill((pid_t)pid, SIGKILL);
			p = end + strspn(end, "\n");
		}
	}
	free(text);
}

/* Remove dir's folders, deepest first, then dir; 0 or -errno (EBUSY
 * while a killed process is still on its way out). */
static int rm_tree(const char *dir, int depth)
{
	if (depth > 64)
		return -ELOOP;
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *e;
	int r = 0;
	while ((e = readdir(d))) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *sub = xasprintf("%s/%s", dir, e->d_name);
		int k = rm_tree(sub, depth + 1);
		if (k < 0 && r == 0)
			r = k;
	}
	closedir(d);
	if (r < 0)
		return r;
	if (rmdir(dir) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int cap_oci_cgroup_remove(const char *cgroups_path, struct cap_err *err)
{
	if (!cgroups_path || !*cgroups_path)
		return 0;
	struct hier h;
	int r = hier_find(cgroups_path, &h, err);
	if (r < 0)
		return r;
	for (size_t i = 0; i < h.n; i++) {
		kill_tree(h.dirs[i], 0);
		/* Killed processes leave their cgroups within milliseconds;
		 * a QEMU with a big RAM takes longer to unmap it. 2 s. */
		int k = 0;
		for (int t = 0; t < 400; t++) {
			if ((k = rm_tree(h.dirs[i], 0)) != -EBUSY)
				break;
			if (t % 20 == 19)
				kill_tree(h.dirs[i], 0);	/* one that forked meanwhile */
			usleep(5000);
		}
		if (k < 0 && r == 0)
			r = cap_err_set(err, -k, "cannot remove cgroup %s: %s%s", h.dirs[i], strerror(-k),
					k == -EBUSY ? " (processes still in it after SIGKILL; try again)" : "");
	}
	hier_fini(&h);
	return r;
}
