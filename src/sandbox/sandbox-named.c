/* Named sandboxes on disk: records, disks, state, start/stop/remove. */
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
#include "policy.h"
#include "sandbox.h"
#include "paths.h"
#include "store.h"
#include "tree.h"
#include "util.h"

void cap_record_init(struct cap_record *r)
{
	*r = (struct cap_record){
		.cpus = 1, .memory_mib = 512, .root_size_mib = 256, .work_size_mib = 512,
	};
	snprintf(r->image_ref, sizeof(r->image_ref), "base");
}

int cap_named_check_name(const char *name, struct cap_err *err)
{
	size_t n = strlen(name);
	bool ok = n >= 1 && n <= CAP_NAME_MAX &&
		  (islower((unsigned char)name[0]) || isdigit((unsigned char)name[0]));
	for (size_t i = 0; ok && i < n; i++)
		ok = islower((unsigned char)name[i]) || isdigit((unsigned char)name[i]) ||
		     name[i] == '-' || name[i] == '_';
	if (!ok)
		return cap_err_set(err, EINVAL, "'%s' is not a valid sandbox name: use 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit",
				   name, CAP_NAME_MAX);
	return 0;
}

char *cap_named_root(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/sandboxes", home);
}

char *cap_named_dir(const char *name)
{
	_cleanup_free_ char *root = cap_named_root();
	return xasprintf("%s/%s", root, name);
}

static char *in_dir(const char *name, const char *file)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	return xasprintf("%s/%s", dir, file);
}

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

/* cap_named_check_size with the workspace's disk (ws_mib, 0: none)
 * counted in the host-space check with the other two. */
static int check_size(unsigned cpus, unsigned memory_mib, unsigned root_mib,
		      unsigned work_mib, unsigned ws_mib, bool force, struct cap_err *err)
{
	if (cpus < 1 || cpus > CAP_CPUS_MAX)
		return cap_err_set(err, ERANGE, "--cpus %u is out of range: 1 to %d vCPUs", cpus, CAP_CPUS_MAX);
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	if (!force && online > 0 && cpus > (unsigned long)online)
		return cap_err_set(err, ERANGE, "--cpus %u is more than this host's %ld online CPUs; ask for at most %ld, or add --force-size to overcommit",
				   cpus, online, online);
	if (memory_mib < CAP_MEMORY_MIN_MIB || memory_mib > CAP_MEMORY_MAX_MIB)
		return cap_err_set(err, ERANGE, "--memory %u MiB is out of range: %d to %d MiB", memory_mib,
				   CAP_MEMORY_MIN_MIB, CAP_MEMORY_MAX_MIB);
	struct sysinfo si;
	if (!force && sysinfo(&si) == 0) {
		uint64_t total = (uint64_t)si.totalram * si.mem_unit >> 20;
		uint64_t reserve = CAP_MAX((uint64_t)CAP_MEMORY_RESERVE_MIB, total / 10);
		uint64_t most = total > reserve ? total - reserve : 0;
		if (memory_mib > most)
			return cap_err_set(err, ERANGE, "--memory %u MiB is more than this host can give: at most %" PRIu64 " MiB (its %" PRIu64 " MiB less a reserve of %" PRIu64 " MiB, the larger of %d MiB and a tenth); ask for less, or add --force-size",
					   memory_mib, most, total, reserve, CAP_MEMORY_RESERVE_MIB);
	}
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
	_cleanup_free_ char *home = cap_home_dir();
	uint64_t avail = 0;
	int r = free_mib(home, &avail);
	if (r < 0)
		return cap_err_set(err, -r, "cannot tell the free space of %s: %s", home, strerror(-r));
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
	return check_size(cpus, memory_mib, root_mib, work_mib, 0, force, err);
}

/* An ext4 disk of mib MiB at path (new, 0600): empty, or with a copy of
 * the host directory from (mke2fs -d: no root needed) and room for at
 * least inodes inodes (0: mke2fs's default). */
static int make_disk(const char *path, unsigned mib, bool tool_owned, const char *label,
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

/* What SETUP takes of a tmpfs mount, for create and load alike. */
static int tmpfs_check(const struct cap_setup_tmpfs *t, const char *where, size_t i, int code,
		       struct cap_err *err)
{
	if (cap_proto_setup_tmpfs_ok(t))
		return 0;
	return cap_err_set(err, code, "%s: tmpfs[%zu] (%.255s): not an absolute clean path of at most 255 bytes, or flags other than nosuid, nodev, noexec, ro and noatime",
			   where, i, t->destination);
}

/* The root's upper disk as mke2fs -d takes it: the overlay's upper
 * directory is data/ on that disk (the agent's layout, docs/protocol.md
 * SETUP), so the seed's tree is copied to <dir>/.seed/data. *out is the
 * new .seed directory, removed by the caller. */
static int seed_upper(const struct cap_record *rec, char **out, struct cap_err *err)
{
	_cleanup_free_ char *top = in_dir(rec->name, ".seed");
	_cleanup_free_ char *data = xasprintf("%s/data", top);
	struct stat st;
	if (stat(rec->root_seed, &st) < 0 || !S_ISDIR(st.st_mode))
		return cap_err_set(err, ENOTDIR, "the root's seed %s is not a directory", rec->root_seed);
	if (mkdir(top, 0700) < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", top, strerror(errno));
	_cleanup_free_ char *from = xasprintf("%s/.", rec->root_seed);
	char *argv[] = { "cp", "-a", "--", from, data, NULL };
	int r = cap_run(argv, NULL, NULL, err);
	/* data/ is the overlay's upper root: its mode and owner are those of
	 * the guest's /, root's 0755 as the agent makes it without a seed,
	 * whatever the seed directory's own were. */
	if (r == 0 && ((geteuid() == 0 && chown(data, 0, 0) < 0) || chmod(data, 0755) < 0))
		r = cap_err_set(err, errno, "cannot set the mode of %s: %s", data, strerror(errno));
	if (r < 0) {
		cap_err_prefix(err, "copying %s into the root's upper disk", rec->root_seed);
		cap_remove_tree(top);
		return r;
	}
	*out = top;
	top = NULL;
	return 0;
}

static int write_record(const struct cap_record *rec, struct cap_err *err)
{
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:I}",
			      "schema", 1, "name", rec->name, "image", rec->image,
			      "image_ref", rec->image_ref, "cpus", rec->cpus,
			      "memory_mib", rec->memory_mib, "root_size_mib", rec->root_size_mib,
			      "work_size_mib", rec->work_size_mib, "created", (json_int_t)rec->created);
	if (rec->source[0])
		json_object_set_new(j, "source", json_pack("{s:s, s:s, s:I, s:I}", "path", rec->source,
							    "fingerprint", rec->source_fp,
							    "entries", (json_int_t)rec->source_entries,
							    "bytes", (json_int_t)rec->source_bytes));
	if (rec->hostname[0])
		json_object_set_new(j, "hostname", json_string(rec->hostname));
	if (rec->root_readonly)
		json_object_set_new(j, "root_readonly", json_true());
	if (rec->ntmpfs) {
		json_t *list = json_array();
		for (uint32_t i = 0; i < rec->ntmpfs && i < CAP_SETUP_MAX_TMPFS; i++)
			json_array_append_new(list, json_pack("{s:s, s:s, s:I}",
							      "destination", rec->tmpfs[i].destination,
							      "data", rec->tmpfs[i].data,
							      "flags", (json_int_t)rec->tmpfs[i].flags));
		json_object_set_new(j, "tmpfs", list);
	}
	if (rec->workspace[0]) {
		json_object_set_new(j, "workspace", json_string(rec->workspace));
		json_object_set_new(j, "workspace_size_mib", json_integer(rec->workspace_size_mib));
	}
	if (rec->net[0]) {
		json_t *words = json_array();
		char buf[sizeof(rec->net)], *save = NULL;
		snprintf(buf, sizeof(buf), "%s", rec->net);
		for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
			json_array_append_new(words, json_string(w));
		json_object_set_new(j, "network", words);
	}
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	_cleanup_free_ char *path = in_dir(rec->name, "record.json");
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	if (r < 0)
		return cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r));
	return 0;
}

/* Build source.erofs from rec->source (or an empty tree, so that every
 * sandbox has the same devices) and note what it holds in rec. */
static int project(struct cap_record *rec, cap_progress_fn progress, void *ud,
		   struct cap_err *err)
{
	struct cap_projection_limits lim;
	struct cap_projection_info info;
	_cleanup_free_ char *img = in_dir(rec->name, "source.erofs");
	int r = cap_projection_limits_init(&lim, err);
	if (r < 0)
		return r;
	if (!rec->source[0]) {
		_cleanup_free_ char *empty = in_dir(rec->name, "empty-XXXXXX");
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
	_cleanup_free_ char *img = in_dir(name, "source.erofs");
	if (has_source)
		*has_source = rec.source[0] != '\0';
	if (!rec.source[0])	/* the empty projection, made if missing */
		return access(img, R_OK) == 0 ? 0 : project(&rec, NULL, NULL, err);
	if ((r = cap_projection_limits_init(&lim, err)) < 0 ||
	    (r = cap_projection_scan(rec.source, &lim, &info, err)) < 0)
		return r;
	if (strcmp(info.fingerprint, rec.source_fp) == 0 && access(img, R_OK) == 0)
		return 0;
	/* Changed: the running VM has the old image open; stop it first. */
	if ((r = cap_named_stop(name, 10000, err)) < 0 || (r = project(&rec, NULL, NULL, err)) < 0 ||
	    (r = write_record(&rec, err)) < 0)
		return r;
	*changed = true;
	return 0;
}

/* --- the workspace (docs/workspace.md) ------------------------------------ */

/* What one entry of the project looked like on the host, to tell whether
 * it changed while it was being copied. */
struct stamp {
	dev_t dev;
	ino_t ino;
	mode_t mode;	/* type and permission bits */
	off_t size;
	struct timespec mtime, ctime;
};

/* A new sandbox's workspace, prepared before anything is made. */
struct ws_prep {
	struct cap_tree tree;	/* the base manifest */
	struct stamp *st;	/* st[i] for tree.v[i], st[tree.n] for the root */
	uint64_t inodes;	/* for mke2fs -N */
	int dfd;	/* the project directory, O_PATH */
};

static void ws_prep_fini(struct ws_prep *w)
{
	cap_tree_fini(&w->tree);
	free(w->st);
	w->st = NULL;
	if (w->dfd >= 0)
		close(w->dfd);
	w->dfd = -1;
}

static int take_stamp(int dfd, const char *path, struct stamp *out)
{
	struct stat st;
	if (fstatat(dfd, path, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	*out = (struct stamp){ st.st_dev, st.st_ino, st.st_mode, st.st_size, st.st_mtim, st.st_ctim };
	return 0;
}

static bool same_stamp(const struct stamp *a, const struct stamp *b)
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
static int ws_prepare(struct cap_record *rec, cap_progress_fn progress, void *ud,
		      struct ws_prep *w, struct cap_err *err)
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
static int ws_make(const struct cap_record *rec, struct ws_prep *w, cap_progress_fn progress,
		   void *ud, struct cap_err *err)
{
	_cleanup_free_ char *disk = in_dir(rec->name, "workspace.ext4");
	_cleanup_free_ char *base = in_dir(rec->name, "workspace.base");
	int r;
	if (progress) {
		char line[4200];
		snprintf(line, sizeof(line), "copying %s into /workspace (%zu entries, %" PRIu64 " bytes, a %u MiB disk)",
			 rec->workspace, w->tree.n, w->tree.bytes, rec->workspace_size_mib);
		progress(ud, line);
	}
	if ((r = make_disk(disk, rec->workspace_size_mib, false, "workspace", rec->workspace, w->inodes,
			   err)) < 0) {
		cap_err_prefix(err, "copying %s (%u MiB; a larger --workspace-size may help)", rec->workspace,
			       rec->workspace_size_mib);
		return r;
	}
	for (size_t i = 0; i <= w->tree.n; i++) {
		const char *path = i < w->tree.n ? w->tree.v[i].path : ".";
		struct stamp now;
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
	_cleanup_free_ char *base = in_dir(name, "workspace.base");
	return cap_tree_load(base, out, err);
}

int cap_named_workspace_set_base(const char *name, const struct cap_tree *t,
				 struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *base = in_dir(name, "workspace.base");
	return cap_tree_save(base, t, err);
}

int cap_named_create(struct cap_record *rec, cap_progress_fn progress,
		     void *ud, struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(rec->name, err)) < 0)
		return r;
	if ((r = cap_named_check_size(rec->cpus, rec->memory_mib, rec->root_size_mib,
				      rec->work_size_mib, rec->force_size, err)) < 0)
		return r;
	if (!rec->workspace[0] && rec->workspace_size_mib)
		return cap_err_set(err, EINVAL, "--workspace-size needs --workspace DIR");
	if (rec->ntmpfs > CAP_SETUP_MAX_TMPFS)
		return cap_err_set(err, EINVAL, "%u tmpfs mounts: a sandbox takes at most %d", rec->ntmpfs,
				   CAP_SETUP_MAX_TMPFS);
	for (uint32_t i = 0; i < rec->ntmpfs; i++)
		if ((r = tmpfs_check(&rec->tmpfs[i], "a new sandbox", i, EINVAL, err)) < 0)
			return r;
	struct ws_prep ws __attribute__((cleanup(ws_prep_fini))) = { .dfd = -1 };
	cap_tree_init(&ws.tree);
	if (rec->workspace[0] &&
	    ((r = ws_prepare(rec, progress, ud, &ws, err)) < 0 ||
	     (r = check_size(rec->cpus, rec->memory_mib, rec->root_size_mib, rec->work_size_mib,
			     rec->workspace_size_mib, rec->force_size, err)) < 0))
		return r;

	if (rec->source[0]) {
		char real[4096];
		struct stat sst;
		if (!realpath(rec->source, real) || stat(real, &sst) < 0 || !S_ISDIR(sst.st_mode))
			return cap_err_set(err, ENOTDIR, "--source %s is not a directory", rec->source);
		snprintf(rec->source, sizeof(rec->source), "%s", real);
	}
	struct cap_image img;
	if ((r = cap_store_image_ensure(rec->image_ref, progress, ud, &img, err)) < 0)
		return r;
	r = cap_store_image_verify(&img, err);
	snprintf(rec->image, sizeof(rec->image), "%s", img.digest);
	cap_image_fini(&img);
	if (r < 0)
		return r;

	_cleanup_free_ char *root = cap_named_root();
	_cleanup_free_ char *dir = cap_named_dir(rec->name);
	if ((r = cap_mkdir_p(root, 0700)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", root, strerror(-r));
	_cleanup_free_ char *recp = in_dir(rec->name, "record.json");
	bool made = mkdir(dir, 0700) == 0;
	if (!made && errno != EEXIST)
		return cap_err_set(err, errno, "cannot create %s: %s", dir, strerror(errno));
	/* The directory's lock is held while it is being made: record.json,
	 * written last, says it is complete. */
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", dir, strerror(errno));
	if (flock(dfd, LOCK_EX | (made ? 0 : LOCK_NB)) < 0)
		return cap_err_set(err, EINPROGRESS, "sandbox '%s' is being created by another process; try again in a moment",
				   rec->name);
	/* Complete, even if this call made the directory: another creator
	 * may have taken it over between our mkdir and our lock. */
	if (access(recp, F_OK) == 0)
		return cap_err_set(err, EEXIST, "a sandbox named '%s' already exists (%s); pick another name or `capsule rm %s`",
				   rec->name, dir, rec->name);
	if (!made) {
		/* Never complete, never used by a guest: what a creation that
		 * was killed left. Made again from scratch. */
		cap_log(CAP_LOG_WARN, "%s holds the remains of an interrupted creation (no record.json); making it again",
			dir);
		if ((r = cap_clear_dir(dir)) < 0)
			return cap_err_set(err, -r, "cannot clear %s: %s", dir, strerror(-r));
	}
	_cleanup_free_ char *upper = in_dir(rec->name, "root-upper.ext4");
	_cleanup_free_ char *work = in_dir(rec->name, "private.ext4");
	rec->created = time(NULL);
	if (progress && rec->workspace[0])	/* a step worth naming beside the copy's */
		progress(ud, "creating the root and /work disks");
	_cleanup_free_ char *seed = NULL;
	if (rec->root_seed && (r = seed_upper(rec, &seed, err)) < 0) {
		cap_remove_tree(dir);
		return r;
	}
	r = make_disk(upper, rec->root_size_mib, false, "root-upper", seed, 0, err);
	if (seed)
		cap_remove_tree(seed);
	if (r < 0 ||
	    (r = make_disk(work, rec->work_size_mib, true, "work", NULL, 0, err)) < 0 ||
	    (r = project(rec, progress, ud, err)) < 0 ||
	    (rec->workspace[0] && (r = ws_make(rec, &ws, progress, ud, err)) < 0) ||
	    (r = write_record(rec, err)) < 0) {
		cap_remove_tree(dir);	/* only what this call just made */
		return r;
	}
	return 0;
}

/* A record's "tmpfs" list (none in records from before it). */
static int load_tmpfs(json_t *list, const char *path, struct cap_record *out, struct cap_err *err)
{
	size_t i;
	json_t *m;
	if (!list)
		return 0;
	if (!json_is_array(list) || json_array_size(list) > CAP_SETUP_MAX_TMPFS)
		return cap_err_set(err, EBADMSG, "%s: \"tmpfs\" must be a list of at most %d mounts",
				   path, CAP_SETUP_MAX_TMPFS);
	json_array_foreach(list, i, m) {
		struct cap_setup_tmpfs *t = &out->tmpfs[i];
		const char *d = json_string_value(json_object_get(m, "destination"));
		const char *data = json_string_value(json_object_get(m, "data"));
		json_t *fl = json_object_get(m, "flags");
		if (!d || !data || !json_is_integer(fl) || json_integer_value(fl) < 0 ||
		    json_integer_value(fl) > UINT32_MAX || strlen(d) >= sizeof(t->destination) ||
		    strlen(data) >= sizeof(t->data))
			return cap_err_set(err, EBADMSG, "%s: tmpfs[%zu] must be {\"destination\", \"data\", \"flags\"}",
					   path, i);
		snprintf(t->destination, sizeof(t->destination), "%s", d);
		snprintf(t->data, sizeof(t->data), "%s", data);
		t->flags = (uint32_t)json_integer_value(fl);
		int r = tmpfs_check(t, path, i, EBADMSG, err);
		if (r < 0)
			return r;
	}
	out->ntmpfs = (uint32_t)json_array_size(list);
	return 0;
}

int cap_named_load(const char *name, struct cap_record *out,
		   struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *path = in_dir(name, "record.json");
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	if (!j) {
		if (access(path, F_OK) != 0)
			return cap_err_set(err, ENOENT, "no sandbox named '%s'; `capsule ls` lists them, `capsule create %s` makes it",
					   name, name);
		return cap_err_set(err, EBADMSG, "%s is unreadable: %s", path, je.text);
	}
	cap_record_init(out);
	const char *s;
	snprintf(out->name, sizeof(out->name), "%s", name);
	if ((s = json_string_value(json_object_get(j, "image"))))
		snprintf(out->image, sizeof(out->image), "%s", s);
	if ((s = json_string_value(json_object_get(j, "image_ref"))))
		snprintf(out->image_ref, sizeof(out->image_ref), "%s", s);
	out->cpus = (unsigned)json_integer_value(json_object_get(j, "cpus"));
	out->memory_mib = (unsigned)json_integer_value(json_object_get(j, "memory_mib"));
	out->root_size_mib = (unsigned)json_integer_value(json_object_get(j, "root_size_mib"));
	out->work_size_mib = (unsigned)json_integer_value(json_object_get(j, "work_size_mib"));
	out->created = json_integer_value(json_object_get(j, "created"));
	json_t *src = json_object_get(j, "source");
	if (json_is_object(src)) {
		if ((s = json_string_value(json_object_get(src, "path"))))
			snprintf(out->source, sizeof(out->source), "%s", s);
		if ((s = json_string_value(json_object_get(src, "fingerprint"))))
			snprintf(out->source_fp, sizeof(out->source_fp), "%s", s);
		out->source_entries = (uint64_t)json_integer_value(json_object_get(src, "entries"));
		out->source_bytes = (uint64_t)json_integer_value(json_object_get(src, "bytes"));
	}
	/* Records from before workspaces have none. */
	if ((s = json_string_value(json_object_get(j, "hostname"))) && cap_proto_valid_name(s))
		snprintf(out->hostname, sizeof(out->hostname), "%s", s);
	/* Records from before it have none: a writable root. */
	json_t *ro = json_object_get(j, "root_readonly");
	if (ro && !json_is_boolean(ro)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"root_readonly\" must be true or false", path);
	}
	out->root_readonly = json_is_true(ro);
	if ((r = load_tmpfs(json_object_get(j, "tmpfs"), path, out, err)) < 0) {
		json_decref(j);
		return r;
	}
	if ((s = json_string_value(json_object_get(j, "workspace")))) {
		if (s[0] != '/' || strlen(s) >= sizeof(out->workspace)) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"workspace\" must be an absolute path", path);
		}
		snprintf(out->workspace, sizeof(out->workspace), "%s", s);
		out->workspace_size_mib = (unsigned)json_integer_value(json_object_get(j, "workspace_size_mib"));
	}
	json_t *net = json_object_get(j, "network");
	size_t i, used = 0;
	json_t *w;
	if (net && !json_is_array(net)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"network\" must be a list of flags (docs/network.md)", path);
	}
	json_array_foreach(net, i, w) {
		const char *word = json_string_value(w);
		if (!word || strchr(word, ' ') ||
		    used + strlen(word) + 2 > sizeof(out->net)) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"network\" must be a list of flags without spaces", path);
		}
		used += (size_t)snprintf(out->net + used, sizeof(out->net) - used, "%s%s", used ? " " : "", word);
	}
	json_decref(j);
	if (strncmp(out->image, "sha256:", 7) != 0 || out->cpus < 1 || out->memory_mib < 64)
		return cap_err_set(err, EBADMSG, "%s lacks a valid image digest, cpus or memory", path);
	struct cap_net_policy *check = xmalloc(sizeof(*check));
	r = cap_record_net(out, check, err);
	free(check);
	if (r < 0)
		cap_err_prefix(err, "%s", path);
	return r;
}

int cap_record_net(const struct cap_record *r, struct cap_net_policy *out,
		   struct cap_err *err)
{
	cap_net_policy_init(out);
	if (cap_net_policy_parse_line(out, r->net, err) < 0) {
		char why[sizeof(err->msg)];
		snprintf(why, sizeof(why), "%s", err->msg);
		return cap_err_set(err, EBADMSG, "recorded network flag %s", why);
	}
	return 0;
}

int cap_record_set_net(struct cap_record *r, const struct cap_net_policy *p,
		       struct cap_err *err)
{
	_cleanup_free_ char *line = cap_net_policy_line(p);
	if (strlen(line) >= sizeof(r->net))
		return cap_err_set(err, E2BIG, "the network policy is too long to record (over %zu bytes): use fewer rules, a CIDR for neighbouring addresses or *.DOMAIN for names under one domain", sizeof(r->net) - 1);
	snprintf(r->net, sizeof(r->net), "%s", line);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int cap_named_list(char ***names, size_t *n)
{
	_cleanup_free_ char *root = cap_named_root();
	DIR *d = opendir(root);
	size_t cap = 8, k = 0;
	char **v = xcalloc(cap, sizeof(char *));
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (cap_named_check_name(e->d_name, NULL) < 0)
			continue;
		if (k == cap)
			v = xrealloc(v, (cap *= 2) * sizeof(char *));
		v[k++] = xstrdup(e->d_name);
	}
	if (d)
		closedir(d);
	qsort(v, k, sizeof(char *), cmp_str);
	*names = v;
	*n = k;
	return 0;
}

static uint64_t used_bytes(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* The VM's engine and hypervisor process as the shim recorded them in
 * runtime.json j ("engine", "vmm_pid"); a file from before engines has
 * only "qemu_pid", of the one engine there was. */
static void runtime_vmm(json_t *j, char *engine, size_t len, pid_t *pid)
{
	const char *e = json_string_value(json_object_get(j, "engine"));
	json_t *p = json_object_get(j, "vmm_pid");
	if (!e) {
		e = "qemu";
		p = json_object_get(j, "qemu_pid");
	}
	snprintf(engine, len, "%s", e);
	*pid = (pid_t)json_integer_value(p);
}

int cap_named_status(const char *name, struct cap_named_status *out,
		     struct cap_err *err)
{
	struct cap_record rec;
	int r = cap_named_load(name, &rec, err);
	if (r < 0)
		return r;
	memset(out, 0, sizeof(*out));
	_cleanup_free_ char *upper = in_dir(name, "root-upper.ext4");
	_cleanup_free_ char *work = in_dir(name, "private.ext4");
	_cleanup_free_ char *ws = in_dir(name, "workspace.ext4");
	out->disk_bytes = used_bytes(upper) + used_bytes(work) + used_bytes(ws);
	out->has_source = rec.source[0] != '\0';

	/* The shim holds shim.lock for its whole life: a lock we cannot take
	 * means a live shim, whatever files a crash may have left. */
	_cleanup_free_ char *lock = in_dir(name, "shim.lock");
	_cleanup_close_ int fd = open(lock, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || flock(fd, LOCK_SH | LOCK_NB) == 0) {
		out->state = CAP_NAMED_STOPPED;
		return 0;
	}
	out->state = CAP_NAMED_RUNNING;
	_cleanup_free_ char *rt = in_dir(name, "runtime.json");
	json_t *j = json_load_file(rt, 0, NULL);
	if (j) {
		if (json_is_true(json_object_get(j, "paused")))
			out->state = CAP_NAMED_PAUSED;
		out->shim_pid = (pid_t)json_integer_value(json_object_get(j, "shim_pid"));
		runtime_vmm(j, out->engine, sizeof(out->engine), &out->vmm_pid);
		const char *c = json_string_value(json_object_get(j, "control"));
		snprintf(out->control, sizeof(out->control), "%s", c ? c : "");
		const char *net = json_string_value(json_object_get(j, "network"));
		const char *nerr = json_string_value(json_object_get(j, "network_error"));
		out->netd_pid = (pid_t)json_integer_value(json_object_get(j, "netd_pid"));
		out->nic = net || nerr;
		snprintf(out->network_error, sizeof(out->network_error), "%s", nerr ? nerr : "");
		json_decref(j);
	}
	return 0;
}

/* Take the lock a shim holds for its whole life, retrying for a moment
 * (cap_named_status holds it shared for an instant). The descriptor, or
 * -1 when a shim (or another reaper) has it. */
static int lock_shim(const char *lockp)
{
	int fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	for (int i = 0; fd >= 0 && i < 50; i++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return fd;
		usleep(2000);
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

/* The directory a dead shim's control socket was in, when it is one we
 * may clean: the sandbox directory, or a run directory made by
 * cap_make_run_dir (<base>/capsule-XXXXXX, a real 0700 directory of
 * ours). New string, or NULL. */
static char *control_dir(const char *control, const char *dir, bool *run_dir)
{
	struct stat st;
	char *d = xstrdup(control);
	char *slash = strrchr(d, '/');
	*run_dir = false;
	if (d[0] != '/' || !slash || slash == d || strcmp(slash, "/control.sock") != 0)
		goto no;
	*slash = '\0';
	if (strcmp(d, dir) == 0)
		return d;
	const char *base = strrchr(d, '/') + 1;
	if (strncmp(base, "capsule-", 8) != 0 || strlen(base) != 14 ||
	    lstat(d, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 07777) != 0700)
		goto no;
	*run_dir = true;
	return d;
no:
	free(d);
	return NULL;
}

/* Remove file from the sandbox directory; when it was there, add its
 * name to the list (for the log). */
static void unlink_noted(const char *name, const char *file, char *list, size_t size)
{
	_cleanup_free_ char *p = in_dir(name, file);
	size_t used = strlen(list);
	if (unlink(p) == 0)
		snprintf(list + used, size - used, "%s%s", used ? ", " : "", file);
}

int cap_named_reap(const char *name, struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *lockp = in_dir(name, "shim.lock");
	_cleanup_free_ char *rt = in_dir(name, "runtime.json");
	if (access(dir, F_OK) != 0)
		return 0;	/* no sandbox, nothing left */
	/* Holding the shim's lock, we know no shim runs, and none can start
	 * and write its files while we remove the old ones. */
	_cleanup_close_ int lock = lock_shim(lockp);
	if (lock < 0)
		return cap_err_set(err, EBUSY, "sandbox '%s' is running or starting (its shim holds %s); stop it first (`capsule stop %s`)",
				   name, lockp, name);

	pid_t vmm = 0;
	char ename[32] = "";
	_cleanup_free_ char *sockdir = NULL;
	bool run_dir = false;
	json_t *j = json_load_file(rt, 0, NULL);
	if (j) {
		runtime_vmm(j, ename, sizeof(ename), &vmm);
		const char *c = json_string_value(json_object_get(j, "control"));
		if (c && (sockdir = control_dir(c, dir, &run_dir)) && run_dir)
			unlink(c);
		json_decref(j);
	}
	/* The sockets first (whoever looks meanwhile finds none to try),
	 * runtime.json once its VM is surely gone. */
	char removed[256] = "";
	unlink_noted(name, "control.sock", removed, sizeof(removed));
	/* The VM, if it outlived its shim (it has PDEATHSIG, so only if that
	 * failed), is named by the directory of its sockets: its engine ends
	 * it and removes what else it left there. */
	const struct cap_engine_ops *engine = cap_engine_default();
	if (*ename && (r = cap_engine_get(ename, &engine, err)) < 0) {
		cap_err_prefix(err, "sandbox '%s': %s names its VM's engine", name, rt);
		return r;
	}
	r = cap_engine_end_leftover(engine, sockdir ? sockdir : dir, vmm);
	if (r > 0)
		cap_log(CAP_LOG_INFO, "sandbox %s: killed VM process %d left running by its dead shim", name, (int)vmm);
	if (r >= 0)
		unlink_noted(name, "runtime.json", removed, sizeof(removed));
	if (*removed)
		cap_log(CAP_LOG_INFO, "sandbox %s: removed %s left by its dead shim", name, removed);
	if (r < 0)
		return cap_err_set(err, -r, "the VM process %d of sandbox '%s' outlived its shim and could not be killed: %s",
				   (int)vmm, name, strerror(-r));
	if (run_dir) {
		cap_remove_run_dir(sockdir);
		cap_log(CAP_LOG_INFO, "sandbox %s: removed its dead shim's run directory %s", name, sockdir);
	}
	return 0;
}

/* The capsule executable that runs shims: $CAPSULE_BIN, else capsule next
 * to the running executable, else the running executable itself. */
static char *shim_exe(void)
{
	const char *env = getenv("CAPSULE_BIN");
	if (env && *env)
		return xstrdup(env);
	_cleanup_free_ char *dir = cap_exe_dir();
	char *p = xasprintf("%s/capsule", dir);
	if (access(p, X_OK) == 0)
		return p;
	free(p);
	return xstrdup("/proc/self/exe");
}

/* Another process started the shim: wait until it serves (runtime.json
 * names its control socket) or gives up (its lock goes away). */
static int wait_serving(const char *name, struct cap_err *err)
{
	struct cap_named_status st;
	int64_t end = cap_now_ms() + 120000;
	while (cap_now_ms() < end) {
		int r = cap_named_status(name, &st, err);
		if (r < 0)
			return r;
		if (st.state == CAP_NAMED_STOPPED) {
			_cleanup_free_ char *dir = cap_named_dir(name);
			return cap_err_set(err, EIO, "sandbox '%s' was being started by another process, which failed; see %s/shim.log",
					   name, dir);
		}
		if (st.control[0])
			return 0;
		usleep(20000);
	}
	return cap_err_set(err, ETIMEDOUT, "sandbox '%s' is starting but did not become ready in 120 s", name);
}

int cap_named_start(const char *name, struct cap_err *err)
{
	int fd;
	int r = cap_named_start_begin(name, &fd, err);
	if (r < 0)
		return r;
	if (fd < 0)
		return wait_serving(name, err);
	return cap_named_start_end(name, fd, err);
}

/* Whether a running sandbox's shim is serving: between taking its lock
 * and listening, or from its stop (the socket goes first) to its exit, a
 * shim holds the lock but cannot be attached to. */
static bool serving(const struct cap_named_status *st)
{
	struct stat sb;
	return st->control[0] && stat(st->control, &sb) == 0 && S_ISSOCK(sb.st_mode);
}

int cap_named_start_begin(const char *name, int *fd, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	*fd = -1;
	if (r < 0)
		return r;
	/* A shim starting or exiting: wait until it serves or is gone. Once
	 * stopped, clean up what a dead shim left; a shim that takes the lock
	 * meanwhile (a concurrent start) makes that fail with EBUSY, and we
	 * wait for it instead. */
	for (int i = 0;; i++) {
		if (st.state != CAP_NAMED_STOPPED && serving(&st))
			return 0;
		struct cap_err rerr = { 0 };
		if (st.state == CAP_NAMED_STOPPED) {
			if ((r = cap_named_reap(name, &rerr)) == 0)
				break;
			if (r != -EBUSY)
				return cap_err_set(err, rerr.code, "%s", rerr.msg);
		}
		if (i == 1000)
			return cap_err_set(err, EBUSY, "sandbox '%s' has been starting or stopping for 10 s (see its shim.log); try again",
					   name);
		usleep(10000);
		if ((r = cap_named_status(name, &st, err)) < 0)
			return r;
	}

	int ready[2];
	if (pipe2(ready, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	_cleanup_free_ char *log = in_dir(name, "shim.log");
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(ready[0]);
		close(ready[1]);
		return cap_err_set(err, e, "fork: %s", strerror(e));
	}
	if (pid == 0) {
		/* Detach twice so that the shim belongs to no terminal and
		 * no caller, then run it with only its own descriptors. */
		setsid();
		if (fork() != 0)
			_exit(0);
		close(ready[0]);
		/* Keep only the ready pipe (as fd 3) of what the caller had. */
		cap_child_keep_fd3(ready[1]);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (int s = 1; s < NSIG; s++)
			signal(s, SIG_DFL);
		umask(077);
		int null = open("/dev/null", O_RDWR);
		int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (null >= 0 && out >= 0) {
			dup2(null, 0);
			dup2(out, 1);
			dup2(out, 2);
		}
		if (null > 3)
			close(null);
		if (out > 3)
			close(out);
		/* A fresh process image: the shim carries nothing of its
		 * caller (a controller's memory holds other identities). */
		_cleanup_free_ char *exe = shim_exe();
		execl(exe, "capsule", "shim", "--ready-fd=3", name, (char *)NULL);
		dprintf(3, "cannot run the shim %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(ready[1]);
	waitpid(pid, NULL, 0);	/* the first child exits at once */
	*fd = ready[0];
	return 0;
}

int cap_named_start_end(const char *name, int fd, struct cap_err *err)
{
	_cleanup_free_ char *log = in_dir(name, "shim.log");
	char msg[sizeof(err->msg)];
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(msg) - 1 && (n = read(fd, msg + len, sizeof(msg) - 1 - len)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		len += (size_t)n;
	}
	msg[len] = '\0';
	close(fd);
	if (strcmp(msg, "ok\n") == 0)
		return 0;
	if (strcmp(msg, "busy\n") == 0)
		return wait_serving(name, err);	/* lost a race with another start */
	if (len == 0)
		return cap_err_set(err, EIO, "sandbox '%s' did not start and said nothing; see %s", name, log);
	while (len > 0 && msg[len - 1] == '\n')
		msg[--len] = '\0';
	return cap_err_set(err, EIO, "sandbox '%s' did not start: %s", name, msg);
}

/* For stop and remove: a shim that had to be killed (or crashed) leaves
 * files and maybe its VM. One that started again meanwhile is not ours
 * to judge (0). */
static int reap_stopped(const char *name, struct cap_err *err)
{
	struct cap_err rerr = { 0 };
	int r = cap_named_reap(name, &rerr);
	if (r < 0 && r != -EBUSY)
		return cap_err_set(err, rerr.code, "%s", rerr.msg);
	return 0;
}

int cap_named_stop(const char *name, int grace_ms, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return reap_stopped(name, err);
	struct cap_sandbox *sb = NULL;
	struct cap_err aerr = { 0 };
	if (*st.control && cap_sandbox_attach(st.control, &sb, &aerr) == 0) {
		cap_sandbox_shutdown(sb, grace_ms, &aerr);
		cap_sandbox_free(sb);
	}
	/* Wait for the shim to go (its lock is released when it exits,
	 * zombie or not); if it does not, kill it (its QEMU dies with it).
	 * Disks are never touched here. */
	int64_t end = cap_now_ms() + grace_ms + 5000;
	while (cap_now_ms() < end && cap_named_status(name, &st, NULL) == 0 &&
	       st.state != CAP_NAMED_STOPPED)
		usleep(10000);
	if (st.state != CAP_NAMED_STOPPED && st.shim_pid > 0) {
		kill(st.shim_pid, SIGKILL);
		for (int i = 0; i < 100 && cap_named_status(name, &st, NULL) == 0 &&
				st.state != CAP_NAMED_STOPPED; i++)
			usleep(10000);
	}
	if (cap_named_status(name, &st, err) == 0 && st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s' is still running (shim pid %d) after being stopped", name, (int)st.shim_pid);
	return reap_stopped(name, err);
}

void cap_named_shape(const struct cap_record *rec, const char *image, const char *upper,
		     const char *work, const char *source, const char *workspace,
		     const char *name, const struct cap_net_policy *p,
		     struct cap_sandbox_spec *spec, struct cap_sandbox_opts *o)
{
	cap_sandbox_spec_named(spec, image, upper, work, source, workspace,
			       rec->hostname[0] ? rec->hostname : name);
	cap_sandbox_spec_root_readonly(spec, rec->root_readonly);
	cap_sandbox_spec_tmpfs(spec, rec->tmpfs, rec->ntmpfs);
	cap_sandbox_spec_network(spec, p);
	cap_sandbox_opts_init(o);
	o->cpus = rec->cpus;
	o->memory_mib = rec->memory_mib;
	o->spec = spec;
}

/* A sandbox whose record cannot be read: removed only with force, and
 * only when no shim holds it (its lock is free). */
static int remove_broken(const char *name, bool force, struct cap_err *err)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	if (!force) {
		_cleanup_free_ char *why = xstrdup(err->msg);
		return cap_err_set(err, EBADMSG, "%s; `capsule rm --force %s` removes the sandbox and its disks (%s) anyway",
				   why, name, dir);
	}
	_cleanup_free_ char *lockp = in_dir(name, "shim.lock");
	_cleanup_close_ int fd = lock_shim(lockp);
	if (fd < 0)
		return cap_err_set(err, EBUSY, "sandbox '%s' has an unreadable record and its shim still runs (%s is locked); kill it first",
				   name, lockp);
	int r = cap_remove_tree(dir);
	if (r < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}

int cap_named_remove(const char *name, bool force, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r == -EBADMSG)
		return remove_broken(name, force, err);
	if (r < 0)
		return r;
	/* Paused is running too: its QEMU has the disks open. */
	if (st.state != CAP_NAMED_STOPPED) {
		if (!force)
			return cap_err_set(err, EBUSY, "sandbox '%s' is %s; stop it first (`capsule stop %s`) or use `capsule rm --force %s`",
					   name, st.state == CAP_NAMED_PAUSED ? "paused (its VM still runs)" : "running",
					   name, name);
		if ((r = cap_named_stop(name, 5000, err)) < 0)
			return r;
	} else if ((r = cap_named_reap(name, err)) < 0) {
		return r;	/* a shim started meanwhile, or a VM outlived its shim */
	}
	_cleanup_free_ char *dir = cap_named_dir(name);
	if ((r = cap_remove_tree(dir)) < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}

bool cap_named_uses_image(void *ud, const char *digest)
{
	(void)ud;
	char **names;
	size_t n;
	bool used = false;
	cap_named_list(&names, &n);
	for (size_t i = 0; i < n; i++) {
		struct cap_record rec;
		if (!used && cap_named_load(names[i], &rec, NULL) == 0 && strcmp(rec.image, digest) == 0)
			used = true;
		free(names[i]);
	}
	free(names);
	return used;
}

int cap_named_kill(const char *name, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r < 0 || st.state == CAP_NAMED_STOPPED)
		return r;
	if (st.shim_pid > 0)
		kill(st.shim_pid, SIGKILL);
	for (int i = 0; i < 200 && cap_named_status(name, &st, NULL) == 0 && st.state != CAP_NAMED_STOPPED; i++)
		usleep(10000);
	if (st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s': its shim (pid %d) is still there after SIGKILL", name,
				   (int)st.shim_pid);
	return cap_named_reap(name, err);
}

/* runtime.json's "network": the policy a running shim has in force
 * (NULL when it runs without a NIC, or its policy process died), and
 * whether its "secrets" (those its policy process started with) are
 * secrets. */
static bool shim_network(const char *name, const char *words, bool *has_nic,
			 const char *secrets, bool *same_secrets)
{
	_cleanup_free_ char *rt = in_dir(name, "runtime.json");
	json_t *j = json_load_file(rt, 0, NULL);
	const char *s = j ? json_string_value(json_object_get(j, "network")) : NULL;
	const char *sec = j ? json_string_value(json_object_get(j, "secrets")) : NULL;
	bool same = s && strcmp(s, words) == 0;
	if (has_nic)
		*has_nic = s != NULL;
	if (same_secrets)
		*same_secrets = sec && secrets && strcmp(sec, secrets) == 0;
	json_decref(j);
	return same;
}

int cap_named_set_network(const char *name, const struct cap_net_policy *p,
			  bool *restart_needed, struct cap_err *err)
{
	struct cap_record rec;
	struct cap_named_status st;
	int r;
	*restart_needed = false;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		return r;
	if ((r = cap_record_set_net(&rec, p, err)) < 0 || (r = write_record(&rec, err)) < 0)
		return r;
	if ((r = cap_named_status(name, &st, err)) < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return 0;
	/* What the running VM has, not what the record said. A VM without
	 * a NIC gets one at its next start; one with a NIC follows the new
	 * policy now, and with none refuses everything until it restarts. */
	bool has_nic, same_secrets;
	_cleanup_free_ char *secrets = cap_net_policy_secrets_line(p);
	shim_network(name, "", &has_nic, secrets, &same_secrets);
	/* Its policy process keeps the secrets it started with. */
	*restart_needed = !has_nic ? p->enabled : !p->enabled || !same_secrets;
	if (!has_nic)
		return 0;
	if (kill(st.shim_pid, SIGUSR1) < 0)
		return cap_err_set(err, errno, "cannot reach sandbox '%s''s shim (pid %d): %s; the new policy applies at its next start",
				   name, (int)st.shim_pid, strerror(errno));
	for (int i = 0; i < 250; i++) {
		if (shim_network(name, rec.net, NULL, NULL, NULL))
			return 0;
		usleep(20000);
	}
	return cap_err_set(err, ETIMEDOUT, "sandbox '%s' did not confirm its new network policy within 5 s; see shim.log in its directory",
			   name);
}
