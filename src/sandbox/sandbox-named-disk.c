/* A named sandbox's disks: size checks against the host, ext4 images,
 * /source's projection, and /workspace's disk made from the project
 * (docs/workspace.md). */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "named.h"
#include "sandbox-internal.h"
#include "policy.h"
#include "sandbox.h"
#include "paths.h"
#include "store.h"
#include "tree.h"
#include "util.h"

/* MiB free to an unprivileged user on the file system holding path, or
 * its nearest existing parent (CAPSULE_HOME may not exist yet). */
static int free_mib(const char *path, uint64_t *out)
{
	_cleanup_free_ char *p = xstrdup(path);
	struct statvfs vfs;
	while (statvfs(p, &vfs) < 0) {
		char *slash = strrchr(p, '/');
		if (errno != ENOENT || !slash || slash == p)
			return -errno;
		*slash = '\0';
	}
	*out = (uint64_t)vfs.f_bavail * vfs.f_frsize >> 20;
	return 0;
}

int cap_named_host_cpus(void)
{
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	return online > 0 ? (int)CAP_MIN(online, (long)INT32_MAX) : 0;
}

int cap_named_host_memory(uint64_t *most, uint64_t *total, uint64_t *reserve)
{
	struct sysinfo si;
	if (sysinfo(&si) < 0)
		return -errno;
	*total = (uint64_t)si.totalram * si.mem_unit >> 20;
	*reserve = CAP_MAX((uint64_t)CAP_MEMORY_RESERVE_MIB, *total / 10);
	*most = *total > *reserve ? *total - *reserve : 0;
	return 0;
}

int cap_named_host_disk(uint64_t *avail, char **home, struct cap_err *err)
{
	*home = cap_home_dir();
	int r = free_mib(*home, avail);
	if (r < 0)
		return cap_err_set(err, -r, "cannot tell the free space of %s: %s", *home, strerror(-r));
	return 0;
}

/* cap_named_check_size with the workspace's disk (ws_mib, 0: none)
 * counted in the host-space check with the other two. */
int cap_named_check_size_ws(unsigned cpus, unsigned memory_mib, unsigned root_mib,
			    unsigned work_mib, unsigned ws_mib, bool force, struct cap_err *err)
{
	if (cpus < 1 || cpus > CAP_CPUS_MAX)
		return cap_err_set(err, ERANGE, "--cpus %u is out of range: 1 to %d vCPUs", cpus, CAP_CPUS_MAX);
	int online = cap_named_host_cpus();
	if (!force && online > 0 && cpus > (unsigned)online)
		return cap_err_set(err, ERANGE, "--cpus %u is more than this host's %d online CPUs; ask for at most %d, or add --force-size to overcommit",
				   cpus, online, online);
	if (memory_mib < CAP_MEMORY_MIN_MIB || memory_mib > CAP_MEMORY_MAX_MIB)
		return cap_err_set(err, ERANGE, "--memory %u MiB is out of range: %d to %d MiB", memory_mib,
				   CAP_MEMORY_MIN_MIB, CAP_MEMORY_MAX_MIB);
	uint64_t most, total, reserve;
	if (!force && cap_named_host_memory(&most, &total, &reserve) == 0 && memory_mib > most)
		return cap_err_set(err, ERANGE, "--memory %u MiB is more than this host can give: at most %" PRIu64 " MiB (its %" PRIu64 " MiB less a reserve of %" PRIu64 " MiB, the larger of %d MiB and a tenth); ask for less, or add --force-size",
				   memory_mib, most, total, reserve, CAP_MEMORY_RESERVE_MIB);
	if (!root_mib && !work_mib)
		return 0;
	if (root_mib < CAP_DISK_MIN_MIB || root_mib > CAP_DISK_MAX_MIB)
		return cap_err_set(err, ERANGE, "--root-size %u MiB is out of range: %d to %d MiB", root_mib,
				   CAP_DISK_MIN_MIB, CAP_DISK_MAX_MIB);
	if (work_mib < CAP_DISK_MIN_MIB || work_mib > CAP_DISK_MAX_MIB)
		return cap_err_set(err, ERANGE, "--work-size %u MiB is out of range: %d to %d MiB", work_mib,
				   CAP_DISK_MIN_MIB, CAP_DISK_MAX_MIB);
	if (ws_mib && (ws_mib < CAP_DISK_MIN_MIB || ws_mib > CAP_DISK_MAX_MIB))
		return cap_err_set(err, ERANGE, "--workspace-size %u MiB is out of range: %d to %d MiB", ws_mib,
				   CAP_DISK_MIN_MIB, CAP_DISK_MAX_MIB);
	if (force)
		return 0;
	_cleanup_free_ char *home = NULL;
	uint64_t avail = 0;
	int r = cap_named_host_disk(&avail, &home, err);
	if (r < 0)
		return r;
	uint64_t want = (uint64_t)root_mib + work_mib + ws_mib;
	if (want > avail && ws_mib)
		return cap_err_set(err, ERANGE, "--root-size %u MiB, --work-size %u MiB and the workspace's %u MiB (%" PRIu64 " MiB together) are more than the %" PRIu64 " MiB free on the file system holding %s; the disks are sparse, but a guest that fills them would fill it: ask for less (--workspace-size), free space, or add --force-size",
				   root_mib, work_mib, ws_mib, want, avail, home);
	if (want > avail)
		return cap_err_set(err, ERANGE, "--root-size %u MiB and --work-size %u MiB (%" PRIu64 " MiB together) are more than the %" PRIu64 " MiB free on the file system holding %s; the disks are sparse, but a guest that fills them would fill it: ask for less, free space, or add --force-size",
				   root_mib, work_mib, want, avail, home);
	return 0;
}

int cap_named_check_size(unsigned cpus, unsigned memory_mib, unsigned root_mib,
			 unsigned work_mib, bool force, struct cap_err *err)
{
	return cap_named_check_size_ws(cpus, memory_mib, root_mib, work_mib, 0, force, err);
}

/* An ext4 disk of mib MiB at path (new, 0600): empty, or with a copy of
 * the host directory from (mke2fs -d: no root needed) and room for at
 * least inodes inodes (0: mke2fs's default). */
int cap_named_make_disk(const char *path, unsigned mib, bool tool_owned, const char *label,
			const char *from, uint64_t inodes, struct cap_err *err)
{
	char size[32], owner[64], ninodes[32];
	snprintf(size, sizeof(size), "%uM", mib);
	snprintf(owner, sizeof(owner), "root_owner=%d:%d", tool_owned ? 1000 : 0, tool_owned ? 1000 : 0);
	snprintf(ninodes, sizeof(ninodes), "%" PRIu64, inodes);
	/* Made 0600 first (mke2fs keeps the mode of a file it is given):
	 * only its owner reads a disk; the jail hands QEMU a descriptor. */
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot create disk %s: %s", path, strerror(errno));
	close(fd);
	/* No reserved blocks: the whole size is the sandbox's quota. */
	char *argv[20] = { "mke2fs", "-q", "-F", "-t", "ext4", "-m", "0", "-L", (char *)label,
			   "-E", owner };
	size_t k = 11;
	if (inodes) {
		argv[k++] = "-N";
		argv[k++] = ninodes;
	}
	if (from) {
		argv[k++] = "-d";
		argv[k++] = (char *)from;
	}
	argv[k++] = (char *)path;
	argv[k++] = size;
	argv[k] = NULL;
	CAP_BUG_ON(k >= CAP_ARRAY_SIZE(argv));
	int r = cap_run(argv, NULL, NULL, err);
	if (r < 0)
		cap_err_prefix(err, "creating disk %s", path);
	return r;
}

/* Build source.erofs from rec->source (or an empty tree, so that every
 * sandbox has the same devices) and note what it holds in rec. */
int cap_named_project(struct cap_record *rec, cap_progress_fn progress, void *ud,
		      struct cap_err *err)
{
	struct cap_projection_limits lim;
	struct cap_projection_info info;
	_cleanup_free_ char *img = cap_named_path(rec->name, "source.erofs");
	int r = cap_projection_limits_init(&lim, err);
	if (r < 0)
		return r;
	if (!rec->source[0]) {
		_cleanup_free_ char *empty = cap_named_path(rec->name, "empty-XXXXXX");
		if (!mkdtemp(empty))
			return cap_err_set(err, errno, "cannot create %s: %s", empty, strerror(errno));
		r = cap_projection_build(empty, &lim, img, &info, err);
		rmdir(empty);
		return r;
	}
	if (progress)
		progress(ud, "copying the public data into its read-only image");
	if ((r = cap_projection_build(rec->source, &lim, img, &info, err)) < 0)
		return r;
	snprintf(rec->source_fp, sizeof(rec->source_fp), "%s", info.fingerprint);
	rec->source_entries = info.entries;
	rec->source_bytes = info.bytes;
	return 0;
}

int cap_named_refresh_source(const char *name, bool *changed, bool *has_source,
			     struct cap_err *err)
{
	struct cap_record rec;
	struct cap_projection_limits lim;
	struct cap_projection_info info;
	int r;
	*changed = false;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		return r;
	_cleanup_free_ char *img = cap_named_path(name, "source.erofs");
	if (has_source)
		*has_source = rec.source[0] != '\0';
	if (!rec.source[0])	/* the empty projection, made if missing */
		return access(img, R_OK) == 0 ? 0 : cap_named_project(&rec, NULL, NULL, err);
	if ((r = cap_projection_limits_init(&lim, err)) < 0 ||
	    (r = cap_projection_scan(rec.source, &lim, &info, err)) < 0)
		return r;
	if (strcmp(info.fingerprint, rec.source_fp) == 0 && access(img, R_OK) == 0)
		return 0;
	/* Changed: the running VM has the old image open; stop it first. */
	if ((r = cap_named_stop(name, 10000, err)) < 0 || (r = cap_named_project(&rec, NULL, NULL, err)) < 0 ||
	    (r = cap_named_write_record(&rec, err)) < 0)
		return r;
	*changed = true;
	return 0;
}

/* --- the workspace (docs/workspace.md) ------------------------------------ */

/* What one entry of the project looked like on the host, to tell whether
 * it changed while it was being copied. */
struct cap_named_stamp {
	dev_t dev;
	ino_t ino;
	mode_t mode;	/* type and permission bits */
	off_t size;
	struct timespec mtime, ctime;
};

void cap_named_ws_fini(struct cap_named_ws *w)
{
	cap_tree_fini(&w->tree);
	free(w->st);
	w->st = NULL;
	if (w->dfd >= 0)
		close(w->dfd);
	w->dfd = -1;
}

static int take_stamp(int dfd, const char *path, struct cap_named_stamp *out)
{
	struct stat st;
	if (fstatat(dfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	*out = (struct cap_named_stamp){ st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtim, st.st_ctim };
	return 0;
}

static bool same_stamp(const struct cap_named_stamp *a, const struct cap_named_stamp *b)
{
	return a->dev == b->dev && a->ino == b->ino && a->mode == b->mode && a->size == b->size &&
	       a->mtime.tv_sec == b->mtime.tv_sec && a->mtime.tv_nsec == b->mtime.tv_nsec &&
	       a->ctime.tv_sec == b->ctime.tv_sec && a->ctime.tv_nsec == b->ctime.tv_nsec;
}

static bool ts_before(struct timespec a, struct timespec b)
{
	return a.tv_sec < b.tv_sec || (a.tv_sec == b.tv_sec && a.tv_nsec < b.tv_nsec);
}

static int changed_while_copied(const char *dir, const char *path, struct cap_err *err)
{
	return cap_err_set(err, EAGAIN, "%s changed while it was copied: %s; try again", dir, path);
}

/* Inodes the workspace's file system gets: mke2fs's default (one per
 * 16 KiB) or, for a project of many small files, twice its entries. */
static uint64_t ws_inodes(const struct cap_tree *t, uint64_t size_mib)
{
	return CAP_MAX(size_mib * 64, (uint64_t)t->n * 2 + 1024);
}

/* The journal mke2fs gives an ext4 file system of size_mib (4 KiB blocks;
 * ext2fs_default_journal_size). */
static uint64_t journal_mib(uint64_t size_mib)
{
	static const struct { uint64_t upto_mib, journal_mib; } j[] = {
		{ 128, 4 }, { 1024, 16 }, { 2048, 32 }, { 16384, 64 },
		{ 32768, 128 }, { 65536, 256 }, { 131072, 512 },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(j); i++)
		if (size_mib <= j[i].upto_mib)
			return j[i].journal_mib;
	return 1024;
}

/* The smallest disk of size_mib that holds t: each file's blocks, a
 * block per directory and per link too long to sit in its inode, the
 * inode table, the journal, and a sixteenth for ext4's own metadata. */
static uint64_t ws_need_mib(const struct cap_tree *t, uint64_t size_mib)
{
	uint64_t bytes = 0;
	for (size_t i = 0; i < t->n; i++) {
		const struct cap_tree_entry *e = &t->v[i];
		if (e->type == CAP_TREE_FILE)
			bytes += (e->size + 4095) / 4096 * 4096;
		else if (e->type == CAP_TREE_DIR || (e->type == CAP_TREE_LINK && e->size >= 60))
			bytes += 4096;
	}
	bytes += ws_inodes(t, size_mib) * 256;
	uint64_t mib = (bytes + (1u << 20) - 1) >> 20;
	return mib + mib / 16 + journal_mib(size_mib) + 16;
}

/* The smallest disk that holds t (need grows with the size it is for). */
static uint64_t ws_min_mib(const struct cap_tree *t)
{
	uint64_t size = CAP_DISK_MIN_MIB;
	for (int i = 0; i < 64 && ws_need_mib(t, size) > size; i++)
		size = ws_need_mib(t, size);
	return size;
}

static uint64_t round_up64(uint64_t mib)
{
	return (mib + 63) / 64 * 64;
}

/* rec->workspace made canonical and scanned by the copy-in rules, the
 * size of its disk chosen (or the one asked for checked), and every
 * entry stamped. */
int cap_named_ws_prepare(struct cap_record *rec, cap_progress_fn progress, void *ud,
			 struct cap_named_ws *w, struct cap_err *err)
{
	char real[4096];
	struct stat st;
	int r;
	if (rec->workspace[0] != '/')
		return cap_err_set(err, EINVAL, "--workspace %s is not an absolute path; give the project directory's full path",
				   rec->workspace);
	if (!realpath(rec->workspace, real))
		return cap_err_set(err, errno == ENOENT ? ENOENT : errno, "--workspace %s: %s", rec->workspace,
				   strerror(errno));
	if (stat(real, &st) < 0 || !S_ISDIR(st.st_mode))
		return cap_err_set(err, ENOTDIR, "--workspace %s is not a directory", rec->workspace);
	if (strlen(real) >= sizeof(rec->workspace))
		return cap_err_set(err, ENAMETOOLONG, "--workspace %s: the path is too long", real);
	snprintf(rec->workspace, sizeof(rec->workspace), "%s", real);
	/* The sandbox's own disks must not be part of what is copied. */
	_cleanup_free_ char *home = cap_home_dir();
	char home_real[4096];
	if (realpath(home, home_real)) {
		size_t n = strlen(real);
		if (strcmp(real, "/") == 0 ||
		    (strncmp(home_real, real, n) == 0 && (home_real[n] == '/' || home_real[n] == '\0')))
			return cap_err_set(err, EINVAL, "--workspace %s holds capsule's own data (%s); give the project's directory instead",
					   real, home_real);
	}

	if (progress)
		progress(ud, "reading the project for /workspace");
	struct timespec t0, t1;
	clock_gettime(CLOCK_REALTIME_COARSE, &t0);
	struct cap_tree_scan_opts o = { .strict = true };
	if ((r = cap_tree_scan(real, &o, &w->tree, err)) < 0) {
		cap_err_prefix(err, "--workspace");
		return r;
	}
	clock_gettime(CLOCK_REALTIME, &t1);
	t1.tv_sec += 1;
	if ((w->dfd = open(real, O_PATH | O_DIRECTORY | O_CLOEXEC)) < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", real, strerror(errno));
	w->st = xcalloc(w->tree.n + 1, sizeof(*w->st));
	/* Stamped now, compared after the copy. A change during the scan
	 * shows as a ctime after its start (one in the future, a skewed
	 * clock's, is not taken as one). */
	for (size_t i = 0; i <= w->tree.n; i++) {
		const struct cap_tree_entry *e = i < w->tree.n ? &w->tree.v[i] : NULL;
		const char *path = e ? e->path : ".";
		if (take_stamp(w->dfd, path, &w->st[i]) < 0)
			return changed_while_copied(real, path, err);
		mode_t type = w->st[i].mode & S_IFMT;
		bool same_kind = !e ? type == S_IFDIR :
				 e->type == CAP_TREE_FILE ? type == S_IFREG && (uint64_t)w->st[i].size == e->size :
				 e->type == CAP_TREE_DIR ? type == S_IFDIR :
				 e->type == CAP_TREE_LINK ? type == S_IFLNK : false;
		if (!same_kind || (!ts_before(w->st[i].ctime, t0) && ts_before(w->st[i].ctime, t1)))
			return changed_while_copied(real, path, err);
	}

	uint64_t size = rec->workspace_size_mib;
	if (size) {
		uint64_t need = ws_min_mib(&w->tree);
		if (size < need || size < ws_need_mib(&w->tree, size))
			return cap_err_set(err, ERANGE, "--workspace-size %u MiB is too small for %s (%zu entries, %" PRIu64 " bytes): it needs at least %" PRIu64 " MiB; ask for more, or leave --workspace-size out for the default",
					   rec->workspace_size_mib, real, w->tree.n, w->tree.bytes, need);
	} else {
		/* The rule of named.h, and never less than the project needs. */
		size = round_up64(CAP_MAX((uint64_t)CAP_WORKSPACE_MIN_DEFAULT_MIB,
					  2 * ((w->tree.bytes + (1u << 20) - 1) >> 20) + CAP_WORKSPACE_HEADROOM_MIB));
		for (int i = 0; i < 64 && ws_need_mib(&w->tree, size) > size; i++)
			size = round_up64(ws_need_mib(&w->tree, size));
		if (size > CAP_DISK_MAX_MIB)
			return cap_err_set(err, ERANGE, "%s (%" PRIu64 " bytes) needs a workspace disk of %" PRIu64 " MiB, more than the largest, %d MiB; copy a smaller tree",
					   real, w->tree.bytes, size, CAP_DISK_MAX_MIB);
	}
	rec->workspace_size_mib = (unsigned)size;
	w->inodes = ws_inodes(&w->tree, size);
	return 0;
}

/* Debugfs's complaint, if it printed one (it exits 0 either way). */
static void debugfs_line(void *ud, const char *line)
{
	char *out = ud;
	if (!out[0] && strncmp(line, "debugfs ", 8) != 0)
		snprintf(out, 256, "%s", line);
}

/* Make workspace.ext4 holding a copy of the project, check that the
 * project did not change meanwhile, and save the base manifest. */
int cap_named_ws_make(const struct cap_record *rec, struct cap_named_ws *w, cap_progress_fn progress,
		      void *ud, struct cap_err *err)
{
	_cleanup_free_ char *disk = cap_named_path(rec->name, "workspace.ext4");
	_cleanup_free_ char *base = cap_named_path(rec->name, "workspace.base");
	int r;
	if (progress) {
		char line[4200];
		snprintf(line, sizeof(line), "copying %s into /workspace (%zu entries, %" PRIu64 " bytes, a %u MiB disk)",
			 rec->workspace, w->tree.n, w->tree.bytes, rec->workspace_size_mib);
		progress(ud, line);
	}
	if ((r = cap_named_make_disk(disk, rec->workspace_size_mib, false, "workspace", rec->workspace, w->inodes,
				     err)) < 0) {
		cap_err_prefix(err, "copying %s (%u MiB; a larger --workspace-size may help)", rec->workspace,
			       rec->workspace_size_mib);
		return r;
	}
	for (size_t i = 0; i <= w->tree.n; i++) {
		const char *path = i < w->tree.n ? w->tree.v[i].path : ".";
		struct cap_named_stamp now;
		if (take_stamp(w->dfd, path, &now) < 0 || !same_stamp(&now, &w->st[i]))
			return changed_while_copied(rec->workspace, path, err);
	}
	/* mke2fs makes lost+found; /workspace holds the project only (a
	 * project's own lost+found was copied into it). */
	if (!cap_tree_find(&w->tree, "lost+found")) {
		char complaint[256] = "";
		char *argv[] = { "debugfs", "-w", "-R", "rmdir /lost+found", disk, NULL };
		if ((r = cap_run(argv, debugfs_line, complaint, err)) < 0)
			return r;
		if (complaint[0])
			return cap_err_set(err, EIO, "cannot remove lost+found from %s: %s", disk, complaint);
	}
	return cap_tree_save(base, &w->tree, err);
}

int cap_named_workspace_base(const char *name, struct cap_tree *out,
			     struct cap_err *err)
{
	struct cap_record rec;
	int r;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		return r;
	if (!rec.workspace[0])
		return cap_err_set(err, ENOENT, "sandbox '%s' has no workspace; `capsule create NAME --workspace DIR` makes one with it",
				   name);
	_cleanup_free_ char *base = cap_named_path(name, "workspace.base");
	return cap_tree_load(base, out, err);
}

int cap_named_workspace_set_base(const char *name, const struct cap_tree *t,
				 struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *base = cap_named_path(name, "workspace.base");
	return cap_tree_save(base, t, err);
}
