/* An OCI container's cgroupsPath (docs/oci.md): made in every hierarchy
 * capsule limits or reports through (or taken when it is there and
 * empty; refused when it holds someone else's process), limited as
 * linux.resources says, joined by the monitor (its leaf "capsule"); at
 * delete the processes of the leaf and the jail's vm-N folders are
 * killed and what create made is removed, nothing else. The host's cgroups are found as the jail finds them
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

_Static_assert(CAP_OCI_CGROUP_MAX == 6, "CAP_OCI_CGROUP_MAX is the v1 controllers' count");

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

/* The pids in dir's cgroup.procs, stored from pids[n] while below max;
 * the new count (it goes on counting past max). */
static size_t procs_of(const char *dir, long *pids, size_t max, size_t n)
{
	_cleanup_free_ char *procs = xasprintf("%s/cgroup.procs", dir);
	_cleanup_free_ char *text = NULL;
	if (cap_read_file(procs, 1 << 20, &text) < 0)
		return n;
	for (char *p = text; *p;) {
		char *end;
		long pid = strtol(p, &end, 10);
		if (end == p)
			break;
		if (pid > 0 && n < max)
			pids[n] = pid;
		n += pid > 0;
		p = end + strspn(end, "\n");
	}
	return n;
}

/* The pids in dir's cgroup.procs and those of the folders below it
 * (at most max kept in pids, all counted), the way runc's GetAllPids
 * looks: a cgroup found with any is not the container's to take. */
static size_t tree_pids(const char *dir, int depth, long *pids, size_t max, size_t n)
{
	if (depth > 64)
		return n;
	DIR *d = opendir(dir);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_type != DT_DIR || e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *sub = xasprintf("%s/%s", dir, e->d_name);
		n = tree_pids(sub, depth + 1, pids, max, n);
	}
	if (d)
		closedir(d);
	return procs_of(dir, pids, max, n);
}

/* Whether the existing cgroup dir is frozen (v1 freezer.state, v2
 * cgroup.freeze): runc refuses one, whose processes would never start. */
static bool frozen(const char *dir)
{
	_cleanup_free_ char *v1 = xasprintf("%s/freezer.state", dir);
	_cleanup_free_ char *v2 = xasprintf("%s/cgroup.freeze", dir);
	char *s = NULL;
	bool f = false;
	if (cap_read_file(v1, 64, &s) >= 0)
		f = strncmp(s, "THAWED", 6) != 0;
	free(s);
	s = NULL;
	if (!f && cap_read_file(v2, 64, &s) >= 0)
		f = s[0] == '1';
	free(s);
	return f;
}

static uint64_t ino_of(const char *path)
{
	struct stat sb;
	return lstat(path, &sb) == 0 && S_ISDIR(sb.st_mode) ? (uint64_t)sb.st_ino : 0;
}

void cap_oci_cgroups_fini(struct cap_oci_cgroups *cg)
{
	for (size_t i = 0; i < cg->n; i++) {
		free(cg->h[i].dir);
		free(cg->h[i].made);
	}
	memset(cg, 0, sizeof(*cg));
}

int cap_oci_cgroup_plan(const char *cgroups_path, struct cap_oci_cgroups *out, struct cap_err *err)
{
	memset(out, 0, sizeof(*out));
	if (!cgroups_path || !*cgroups_path)
		return 0;
	struct hier h;
	int r = hier_find(cgroups_path, &h, err);
	if (r < 0)
		return r;
	struct cap_oci_cgroups cg = { 0 };
	for (size_t i = 0; i < h.n; i++) {
		struct cap_oci_cgroup *c = &cg.h[cg.n++];
		c->dir = xstrdup(h.dirs[i]);
		struct stat sb;
		if (stat(c->dir, &sb) == 0) {
			long pids[4];
			size_t n = tree_pids(c->dir, 0, pids, CAP_ARRAY_SIZE(pids), 0);
			if (n) {
				char list[64] = "";
				for (size_t k = 0; k < CAP_MIN(n, CAP_ARRAY_SIZE(pids)); k++) {
					size_t len = strlen(list);
					snprintf(list + len, sizeof(list) - len, "%s%ld", k ? ", " : "", pids[k]);
				}
				r = cap_err_set(err, EBUSY, "cgroupsPath %s: the cgroup %s exists and holds %zu process(es) (pid %s%s) "
						"that are not this container's: capsule-oci takes only a new or empty cgroup (as runc does), "
						"and never limits, signals or removes processes it did not start; give the container a cgroupsPath of its own",
						cgroups_path, c->dir, n, list, n > CAP_ARRAY_SIZE(pids) ? ", ..." : "");
				break;
			}
			if (frozen(c->dir)) {
				r = cap_err_set(err, EBUSY, "cgroupsPath %s: the cgroup %s exists and is frozen: its processes would never run; thaw it or give the container a cgroupsPath of its own",
						cgroups_path, c->dir);
				break;
			}
			c->ino = (uint64_t)sb.st_ino;
			continue;	/* there, empty: used, never removed */
		}
		/* The topmost level that is not there: create makes it and what
		 * is below it, and delete removes just that. */
		const char *root = h.roots[i], *rel = c->dir + strlen(root) + 1;
		for (const char *s = rel;; s++) {
			if (*s && *s != '/')
				continue;
			_cleanup_free_ char *p = xasprintf("%s/%.*s", root, (int)(s - rel), rel);
			if (stat(p, &sb) < 0) {
				c->made = xstrdup(p);
				break;
			}
			if (!*s)
				break;
		}
		if (!c->made)	/* appeared meanwhile */
			c->made = xstrdup(c->dir);
	}
	hier_fini(&h);
	if (r < 0) {
		cap_oci_cgroups_fini(&cg);
		return r;
	}
	*out = cg;
	return 0;
}

int cap_oci_cgroup_create(const struct cap_oci_config *c, struct cap_oci_cgroups *cg, struct cap_err *err)
{
	if (!c->cgroups_path || !*c->cgroups_path || cg->n == 0)
		return 0;
	struct hier h;
	int r = hier_find(c->cgroups_path, &h, err);
	for (size_t i = 0; r == 0 && i < h.n; i++) {
		struct cap_oci_cgroup *g = i < cg->n && strcmp(cg->h[i].dir, h.dirs[i]) == 0 ? &cg->h[i] : NULL;
		if (!g) {
			r = cap_err_set(err, ESTALE, "the host's cgroups changed while the container was made (%s); try again", h.dirs[i]);
			break;
		}
		/* The first level made here with mkdir itself: one that
		 * someone else made since the plan is not taken for ours. */
		if (g->made && mkdir(g->made, 0755) < 0) {
			r = cap_err_set(err, errno, "cannot create cgroup %s: %s%s", g->made, strerror(errno),
					errno == EEXIST ? " (made by someone else meanwhile; try again)" : "");
			free(g->made);
			g->made = NULL;	/* not ours */
			break;
		}
		if (g->made)
			g->made_ino = ino_of(g->made);
		if ((r = make_levels(&h, i, err)) < 0)
			break;
		g->ino = ino_of(g->dir);
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
	long pids[4096];
	size_t n = procs_of(dir, pids, CAP_ARRAY_SIZE(pids), 0);
	for (size_t i = 0; i < n && i < CAP_ARRAY_SIZE(pids); i++)
		if (pids[i] != getpid())
			kill((pid_t)pids[i], SIGKILL);
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

static bool is_cgroup(const char *dir)
{
	struct statfs sf;
	return statfs(dir, &sf) == 0 && (sf.f_type == CGROUP_SUPER_MAGIC || sf.f_type == CGROUP2_SUPER_MAGIC);
}

/* Whether name is one of the folders the container's processes live in:
 * the leaf (the monitor, the shim, exec monitors) or a jail's vm-N
 * (QEMU). */
static bool ours_name(const char *name)
{
	unsigned n;
	char tail;
	return strcmp(name, LEAF) == 0 || sscanf(name, "vm-%u%c", &n, &tail) == 1;
}

/* Kill the container's processes in dir (those of its leaf and vm-N
 * folders, and below them) or remove those folders (rm); nothing else of
 * dir is touched. 0 or the first -errno of a removal. */
static int each_ours(const char *dir, bool rm)
{
	DIR *d = opendir(dir);
	if (!d)
		return errno == ENOENT ? 0 : -errno;
	struct dirent *e;
	int r = 0;
	while ((e = readdir(d))) {
		if (e->d_type != DT_DIR || !ours_name(e->d_name))
			continue;
		_cleanup_free_ char *sub = xasprintf("%s/%s", dir, e->d_name);
		if (!rm) {
			kill_tree(sub, 0);
			continue;
		}
		int k = rm_tree(sub, 0);
		if (k < 0 && r == 0)
			r = k;
	}
	closedir(d);
	return r;
}

/* rmdir the levels above dir up to made (made is dir or an ancestor),
 * while they are empty: another container's path may share them. */
static void rm_levels(const char *dir, const char *made)
{
	size_t stop = strlen(made);
	_cleanup_free_ char *p = xstrdup(dir);
	for (char *s; (s = strrchr(p, '/')) && (size_t)(s - p) >= stop;) {
		*s = '\0';
		if (rmdir(p) < 0)
			break;
	}
}

int cap_oci_cgroup_remove(const struct cap_oci_cgroups *cg, struct cap_err *err)
{
	int r = 0;
	for (size_t i = 0; i < cg->n; i++) {
		const struct cap_oci_cgroup *g = &cg->h[i];
		/* The container's cgroup is the folder create found or made,
		 * known by its inode: one removed and made again since (by
		 * someone else) is not it. A create that died before it
		 * recorded the inodes had started no process: what it made
		 * goes only if it is empty. */
		bool ours = g->ino && is_cgroup(g->dir) && ino_of(g->dir) == g->ino;
		bool made = g->made && (ours || (!g->ino && is_cgroup(g->made) &&
						 (!g->made_ino || ino_of(g->made) == g->made_ino)));
		if (!ours && !made)
			continue;
		if (ours)
			each_ours(g->dir, false);
		/* Killed processes leave their cgroups within milliseconds;
		 * a QEMU with a big RAM takes longer to unmap it. 2 s. */
		int k = 0;
		for (int t = 0; t < 400; t++) {
			k = made ? rm_tree(g->dir, 0) : each_ours(g->dir, true);
			if (k != -EBUSY)
				break;
			if (ours && t % 20 == 19)
				each_ours(g->dir, false);	/* one that forked meanwhile */
			usleep(5000);
		}
		if (k == 0 && made)
			rm_levels(g->dir, g->made);
		if (k < 0 && r == 0)
			r = cap_err_set(err, -k, "cannot remove cgroup %s: %s%s", g->dir, strerror(-k),
					k == -EBUSY ? " (processes are still in it: the container's after SIGKILL, or others, which capsule-oci "
						      "does not signal; it is left in place)" : "");
	}
	return r;
}
