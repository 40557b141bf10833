/* Snapshots of running named sandboxes, and sandboxes resumed from them
 * (docs/architecture.md, "Snapshots and forks"):
 *
 *   snapshots/<snap>/{record.json, meta.json}   the parent's record then, what it is
 *   snapshots/<snap>/{state, ram}               a template's form: device state, RAM
 *   snapshots/<snap>/{root-upper.ext4, private.ext4, workspace.ext4, source.erofs}
 *                                               the parent's disks at the same instant
 *   snapshots/.tmp-<snap>-<pid>/                one being made (flock held)
 *
 * A sandbox made from one (`create --from`, `fork`) has qcow2 overlays
 * over those disks, records the snapshot's name, and resumes from it at
 * its first start. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <linux/fs.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "named.h"
#include "paths.h"
#include "policy.h"
#include "sandbox-internal.h"
#include "sandbox.h"
#include "store.h"
#include "layout.h"
#include "util.h"

/* --- disks ---------------------------------------------------------------- */

/* A sandbox's own disks by serial, and their files in a sandbox's or a
 * snapshot's directory. */
static const struct {
	const char *serial, *file, *overlay;
} disk_files[] = {
	{ CAP_GUEST_SERIAL_UPPER, "root-upper.ext4", "root-upper.qcow2" },
	{ CAP_GUEST_SERIAL_WORK, "private.ext4", "private.qcow2" },
	{ CAP_GUEST_SERIAL_WORKSPACE, "workspace.ext4", "workspace.qcow2" },
	{ CAP_GUEST_SERIAL_SOURCE, "source.erofs", NULL },
};

const char *cap_snapshot_disk_file(const char *serial)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(disk_files); i++)
		if (strcmp(disk_files[i].serial, serial) == 0)
			return disk_files[i].file;
	return NULL;
}

char *cap_named_disk_path(const struct cap_record *rec, const char *file, char **backing)
{
	if (backing)
		*backing = NULL;
	for (size_t i = 0; rec->snapshot[0] && i < CAP_ARRAY_SIZE(disk_files); i++) {
		if (strcmp(disk_files[i].file, file) != 0 || !disk_files[i].overlay)
			continue;
		if (backing) {
			_cleanup_free_ char *sdir = cap_snapshot_dir(rec->snapshot);
			*backing = xasprintf("%s/%s", sdir, file);
		}
		return cap_named_path(rec->name, disk_files[i].overlay);
	}
	return cap_named_path(rec->name, file);
}

/* Copy src's data to dst (new, 0600): a reflink where the file system
 * makes one, else its data extents alone, so that the copy is as sparse
 * as the disk. */
static int copy_sparse(const char *src, const char *dst, struct cap_err *err)
{
	_cleanup_close_ int in = open(src, O_RDONLY | O_CLOEXEC);
	if (in < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", src, strerror(errno));
	_cleanup_close_ int out = open(dst, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (out < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", dst, strerror(errno));
	struct stat st;
	if (fstat(in, &st) < 0)
		return cap_err_set(err, errno, "cannot read %s: %s", src, strerror(errno));
	if (ioctl(out, FICLONE, in) == 0)
		return 0;
	if (ftruncate(out, st.st_size) < 0)
		return cap_err_set(err, errno, "cannot size %s: %s", dst, strerror(errno));
	off_t pos = 0;
	for (;;) {
		off_t data = lseek(in, pos, SEEK_DATA);
		if (data < 0)
			break;	/* ENXIO: no data past pos */
		off_t hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0)
			hole = st.st_size;
		off_t from = data, to = data;
		while (from < hole) {
			ssize_t n = copy_file_range(in, &from, out, &to, (size_t)(hole - from), 0);
			if (n < 0)
				return cap_err_set(err, errno, "cannot copy %s to %s: %s", src, dst, strerror(errno));
			if (n == 0)
				break;
		}
		pos = hole;
	}
	if (fsync(out) < 0)
		return cap_err_set(err, errno, "cannot write %s: %s", dst, strerror(errno));
	return 0;
}

int cap_snapshot_copy_disk(const char *src, bool qcow2, const char *dst, struct cap_err *err)
{
	int r;
	if (qcow2) {
		/* A fork's disk: the overlay and its base, flattened into
		 * one raw file (the running QEMU holds its lock: -U). */
		char *argv[] = { "qemu-img", "convert", "-U", "-q", "-f", "qcow2", "-O", "raw", "-S", "4k",
				 (char *)src, (char *)dst, NULL };
		r = cap_run(argv, NULL, NULL, err);
	} else {
		r = copy_sparse(src, dst, err);
	}
	if (r < 0)
		cap_err_prefix(err, "copying the disk %s", src);
	return r;
}

/* --- names and places ------------------------------------------------------- */

int cap_snapshot_check_name(const char *name, struct cap_err *err)
{
	struct cap_err e = { 0 };
	if (cap_named_check_name(name, &e) == 0)
		return 0;
	return cap_err_set(err, EINVAL, "'%s' is not a valid snapshot name: use 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit",
			   name, CAP_NAME_MAX);
}

char *cap_snapshot_root(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/snapshots", home);
}

char *cap_snapshot_dir(const char *snap)
{
	_cleanup_free_ char *root = cap_snapshot_root();
	return xasprintf("%s/%s", root, snap);
}

static bool exists(const char *path)
{
	return access(path, F_OK) == 0;
}

/* Remove what a snapshot killed while it was being made left: staging
 * directories whose lock is free. */
static void sweep_staging(const char *root)
{
	DIR *d = opendir(root);
	if (!d)
		return;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strncmp(e->d_name, ".tmp-", 5) != 0)
			continue;
		_cleanup_free_ char *p = xasprintf("%s/%s", root, e->d_name);
		_cleanup_close_ int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) == 0)
			cap_remove_tree(p);
	}
	closedir(d);
}

/* --- talking to a running sandbox's shim ------------------------------------ */

/* Wait for the shim's answers to what was queued on sb. */
static int vm_op_wait(struct cap_sandbox *sb, const char *name, const char *what, int timeout_ms,
		      struct cap_err *err)
{
	int64_t until = cap_now_ms() + timeout_ms;
	int r = 0;
	while (cap_sandbox_vm_op_pending(sb) > 0) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(sb, pfd);
		if (cap_now_ms() > until)
			return cap_err_set(err, ETIMEDOUT, "the sandbox %s did not answer %s within %d s", name, what,
					   timeout_ms / 1000);
		if (poll(pfd, CAP_SANDBOX_NPOLL, 1000) < 0 && errno != EINTR)
			return cap_err_set(err, errno, "poll: %s", strerror(errno));
		if ((r = cap_sandbox_dispatch(sb, pfd, err)) < 0)
			return r;
	}
	return cap_sandbox_vm_op_result(sb);
}

/* Attach to name's shim: -ESRCH (err) when it is stopped. */
static int attach(const char *name, struct cap_sandbox **sb, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ESRCH, "sandbox '%s' is stopped: `capsule start %s` first", name, name);
	return cap_sandbox_attach(st.control, sb, err);
}

int cap_named_pause(const char *name, bool pause, struct cap_err *err)
{
	struct cap_sandbox *sb = NULL;
	int r = attach(name, &sb, err);
	if (r < 0)
		return r;
	cap_sandbox_vm_op(sb, pause);
	r = vm_op_wait(sb, name, pause ? "pause" : "resume", 30000, err);
	if (r < 0 && !*err->msg)
		cap_err_set(err, -r, "cannot %s sandbox '%s': %s", pause ? "pause" : "resume", name, strerror(-r));
	cap_sandbox_free(sb);
	return r;
}

int cap_named_warm(const char *name, struct cap_err *err)
{
	struct cap_sandbox *sb = NULL;
	int r = attach(name, &sb, err);
	if (r < 0)
		return r;
	r = cap_sandbox_warm(sb, err);
	cap_sandbox_free(sb);
	return r;
}

/* --- making one ----------------------------------------------------------- */

static int write_meta(const char *dir, const char *parent, const struct cap_record *rec, int64_t ms,
		      struct cap_err *err)
{
	json_t *j = json_pack("{s:i, s:s, s:I, s:s, s:i, s:i, s:I}", "schema", 1, "parent", parent,
			      "created", (json_int_t)time(NULL), "image", rec->image, "cpus", rec->cpus,
			      "memory_mib", rec->memory_mib, "save_ms", (json_int_t)ms);
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	_cleanup_free_ char *path = xasprintf("%s/meta.json", dir);
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

/* Seal the snapshot staged in dir, of the sandbox rec was. */
static int seal(const struct cap_record *rec, const char *dir, struct cap_err *err)
{
	struct cap_image img = { 0 };
	int r;
	if ((r = cap_store_image_find(rec->image, &img, err)) < 0)
		return r;
	_cleanup_free_ char *upper = xasprintf("%s/root-upper.ext4", dir);
	_cleanup_free_ char *work = xasprintf("%s/private.ext4", dir);
	_cleanup_free_ char *source = xasprintf("%s/source.erofs", dir);
	_cleanup_free_ char *ws = xasprintf("%s/workspace.ext4", dir);
	struct cap_sandbox_spec *spec = xmalloc(sizeof(*spec));
	struct cap_net_policy *net = xmalloc(sizeof(*net));
	struct cap_sandbox_opts o;
	if ((r = cap_record_net(rec, net, err)) == 0) {
		cap_named_shape(rec, img.owned_path, upper, work, source, rec->workspace[0] ? ws : NULL, rec->name,
				net, spec, &o);
		r = cap_sandbox_seal(&o, dir, err);
	}
	free(spec);
	free(net);
	cap_image_fini(&img);
	return r;
}

int cap_named_snapshot(const char *name, const char *snap, bool leave_paused, struct cap_err *err)
{
	struct cap_record rec;
	struct cap_sandbox *sb = NULL;
	int r;
	if ((r = cap_snapshot_check_name(snap, err)) < 0 || (r = cap_named_load(name, &rec, err)) < 0)
		return r;
	if (rec.pod_netns[0])
		return cap_err_set(err, EOPNOTSUPP, "sandbox '%s' is a pod's: its network is the pod's, which a copy cannot have",
				   name);
	_cleanup_free_ char *root = cap_snapshot_root();
	_cleanup_free_ char *final = cap_snapshot_dir(snap);
	if ((r = cap_mkdir_p(root, 0700)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", root, strerror(-r));
	sweep_staging(root);
	if (exists(final))
		return cap_err_set(err, EEXIST, "a snapshot named '%s' exists (%s); pick another name or `capsule snapshot rm %s`",
				   snap, final, snap);
	_cleanup_free_ char *tmp = xasprintf("%s/.tmp-%s-%d", root, snap, (int)getpid());
	_cleanup_free_ char *rp = xasprintf("%s/record.json", tmp);
	_cleanup_free_ char *wb = cap_named_path(name, "workspace.base");
	_cleanup_free_ char *wbt = xasprintf("%s/workspace.base", tmp);
	if (mkdir(tmp, 0700) < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", tmp, strerror(errno));
	_cleanup_close_ int lock = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (lock < 0 || flock(lock, LOCK_EX) < 0) {
		r = cap_err_set(err, errno, "cannot lock %s: %s", tmp, strerror(errno));
		goto fail;
	}
	int64_t t0 = cap_now_ms();
	if ((r = attach(name, &sb, err)) < 0)
		goto fail;
	cap_sandbox_snapshot_op(sb, tmp, leave_paused);
	r = vm_op_wait(sb, name, "the snapshot", 300000, err);
	cap_sandbox_free(sb);
	if (r < 0) {
		if (!*err->msg)
			cap_err_set(err, -r, "%s", strerror(-r));
		cap_err_prefix(err, "cannot snapshot sandbox '%s'", name);
		goto fail;
	}
	int64_t saved = cap_now_ms() - t0;
	/* The record as it is now (a policy may have changed since the
	 * start), and the workspace's merge base. */
	if ((r = cap_named_load(name, &rec, err)) < 0 || (r = cap_record_write_file(&rec, rp, err)) < 0 ||
	    (exists(wb) && (r = copy_sparse(wb, wbt, err)) < 0) || (r = seal(&rec, tmp, err)) < 0 ||
	    (r = write_meta(tmp, name, &rec, saved, err)) < 0)
		goto fail;
	if (rename(tmp, final) < 0) {
		r = cap_err_set(err, errno, errno == ENOTEMPTY || errno == EEXIST ?
				"a snapshot named '%s' was made meanwhile" : "cannot store snapshot '%s': %s",
				snap, strerror(errno));
		goto fail;
	}
	return 0;
fail:
	cap_remove_tree(tmp);
	return r;
}

/* --- sandboxes made from one -------------------------------------------------- */

static int load_snapshot_record(const char *snap, struct cap_record *rec, struct cap_err *err)
{
	int r;
	if ((r = cap_snapshot_check_name(snap, err)) < 0)
		return r;
	_cleanup_free_ char *dir = cap_snapshot_dir(snap);
	_cleanup_free_ char *state = xasprintf("%s/state", dir);
	if (!exists(state))
		return cap_err_set(err, ENOENT, "no snapshot named '%s'; `capsule snapshot ls` lists them", snap);
	_cleanup_free_ char *rp = xasprintf("%s/record.json", dir);
	return cap_record_load_file(rp, NULL, rec, err);
}

int cap_named_create_from(const char *name, const char *snap, struct cap_err *err)
{
	struct cap_record rec;
	int r;
	if ((r = cap_named_check_name(name, err)) < 0 || (r = load_snapshot_record(snap, &rec, err)) < 0)
		return r;
	snprintf(rec.name, sizeof(rec.name), "%s", name);
	snprintf(rec.snapshot, sizeof(rec.snapshot), "%s", snap);
	/* Its own hostname: its name, or the end of a long one (a hostname
	 * is 20 characters at most; the end is what tells siblings apart). */
	rec.hostname[0] = '\0';
	size_t nl = strlen(name);
	if (nl >= sizeof(rec.hostname)) {
		const char *tail = name + nl - (sizeof(rec.hostname) - 1);
		while (*tail == '-' || *tail == '_')
			tail++;
		snprintf(rec.hostname, sizeof(rec.hostname), "%s", tail);
	}
	/* The parent's published host ports stay the parent's: two VMs
	 * cannot listen on one (the rest of the policy is the child's too). */
	char words[sizeof(rec.net)], *save = NULL;
	size_t used = 0;
	snprintf(words, sizeof(words), "%s", rec.net);
	rec.net[0] = '\0';
	for (char *w = strtok_r(words, " ", &save); w; w = strtok_r(NULL, " ", &save))
		if (strncmp(w, "publish=", 8) != 0)
			used += (size_t)snprintf(rec.net + used, sizeof(rec.net) - used, "%s%s", used ? " " : "", w);
	rec.resume = true;
	rec.created = time(NULL);

	_cleanup_free_ char *nroot = cap_named_root();
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *sdir = cap_snapshot_dir(snap);
	_cleanup_free_ char *wb = xasprintf("%s/workspace.base", sdir);
	_cleanup_free_ char *wbt = cap_named_path(name, "workspace.base");
	if ((r = cap_mkdir_p(nroot, 0700)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", nroot, strerror(-r));
	if (mkdir(dir, 0700) < 0)
		return cap_err_set(err, errno, errno == EEXIST ? "a sandbox named '%s' already exists; pick another name or `capsule rm %s`"
							     : "cannot create the sandbox '%s': %s",
				   name, errno == EEXIST ? name : strerror(errno));
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0 || flock(dfd, LOCK_EX) < 0) {
		r = cap_err_set(err, errno, "cannot lock %s: %s", dir, strerror(errno));
		goto fail;
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(disk_files); i++) {
		_cleanup_free_ char *base = xasprintf("%s/%s", sdir, disk_files[i].file);
		struct stat st;
		if (stat(base, &st) < 0)
			continue;	/* a disk the parent did not have (no workspace) */
		_cleanup_free_ char *backing = NULL;
		_cleanup_free_ char *path = cap_named_disk_path(&rec, disk_files[i].file, &backing);
		if (!backing) {
			/* Read-only (/source): the snapshot's file itself. */
			if (link(base, path) < 0 && (r = copy_sparse(base, path, err)) < 0)
				goto fail;
			continue;
		}
		char size[32];
		snprintf(size, sizeof(size), "%lld", (long long)st.st_size);
		char *argv[] = { "qemu-img", "create", "-q", "-f", "qcow2", "-F", "raw", "-b", backing, "-u",
				 path, size, NULL };
		if ((r = cap_run(argv, NULL, NULL, err)) < 0) {
			cap_err_prefix(err, "making the disk %s over %s", path, backing);
			goto fail;
		}
		chmod(path, 0600);
	}
	if ((exists(wb) && (r = copy_sparse(wb, wbt, err)) < 0) || (r = cap_named_write_record(&rec, err)) < 0)
		goto fail;
	return 0;
fail:
	cap_remove_tree(dir);
	return r;
}

/* A name of base + suffix + k for the first k from 1 that names no
 * snapshot (snapshots) or no sandbox, cut to fit. */
static void first_free(const char *base, const char *suffix, bool snapshots, char out[CAP_NAME_MAX + 1])
{
	for (unsigned k = 1;; k++) {
		char tail[24];
		snprintf(tail, sizeof(tail), "%s%u", suffix, k);
		snprintf(out, CAP_NAME_MAX + 1, "%.*s%s", (int)(CAP_NAME_MAX - strlen(tail)), base, tail);
		_cleanup_free_ char *p = snapshots ? cap_snapshot_dir(out) : cap_named_dir(out);
		if (!exists(p))
			return;
	}
}

void cap_snapshot_default_name(const char *parent, char out[CAP_NAME_MAX + 1])
{
	first_free(parent, "-snap", true, out);
}

/* A fork that failed part way is undone: the n children it made are
 * stopped and removed, then its snapshot (nothing else is made from it
 * yet), so that the caller is left with the parent as it was, not with
 * sandboxes it was never told of (serve's controller would not take
 * them over). What is undone, and what could not be, ends err's text. */
static void fork_undo(const char *parent, char (*children)[CAP_NAME_MAX + 1], unsigned n,
		      const char *snap, struct cap_err *err)
{
	char done[512] = "", left[768] = "";
	for (unsigned i = 0; i < n; i++) {
		struct cap_err e = { 0 };
		size_t u;
		if (cap_named_remove(children[i], true, &e) == 0) {
			u = strlen(done);
			snprintf(done + u, sizeof(done) - u, "%s%s", done[0] ? ", " : "", children[i]);
		} else {
			u = strlen(left);
			snprintf(left + u, sizeof(left) - u, "; %s was not removed (%.300s)", children[i], e.msg);
		}
	}
	struct cap_err e = { 0 };
	char fate[512];
	if (left[0])
		snprintf(fate, sizeof(fate), "kept: a child of it is left");
	else if (cap_snapshot_remove(snap, &e) == 0)
		snprintf(fate, sizeof(fate), "removed");
	else
		snprintf(fate, sizeof(fate), "kept (%.400s)", e.msg);
	size_t u = strlen(err->msg);
	snprintf(err->msg + u, sizeof(err->msg) - u,
		 "; the fork was undone (children removed: %s; its snapshot '%s' %s), '%s' is kept%s",
		 done[0] ? done : "none", snap, fate, parent, left);
}

int cap_named_fork(const char *name, unsigned count, const char *prefix, bool leave_paused,
		   char (*children)[CAP_NAME_MAX + 1], char snap[CAP_NAME_MAX + 1], struct cap_err *err)
{
	int r;
	if (count < 1 || count > CAP_FORK_MAX)
		return cap_err_set(err, ERANGE, "--count %u is out of range (1 to %d)", count, CAP_FORK_MAX);
	_cleanup_free_ char *pre = prefix ? xstrdup(prefix) : xasprintf("%s-", name);
	/* Every child's name is checked before anything is made: the next
	 * free numbers after the prefix. */
	unsigned k = 1;
	for (unsigned i = 0; i < count; i++, k++) {
		for (;; k++) {
			if (snprintf(children[i], CAP_NAME_MAX + 1, "%s%u", pre, k) > CAP_NAME_MAX)
				return cap_err_set(err, EINVAL, "--prefix '%s' leaves no room for a number", pre);
			_cleanup_free_ char *d = cap_named_dir(children[i]);
			if (!exists(d))
				break;
		}
		if ((r = cap_named_check_name(children[i], err)) < 0)
			return r;
	}
	first_free(name, "-fork", true, snap);
	if ((r = cap_named_snapshot(name, snap, leave_paused, err)) < 0)
		return r;
	for (unsigned i = 0; i < count; i++) {
		bool made = false;
		if ((r = cap_named_create_from(children[i], snap, err)) < 0 ||
		    ((made = true), (r = cap_named_start(children[i], err)) < 0)) {
			cap_err_prefix(err, "fork %u of %u (%s)", i + 1, count, children[i]);
			fork_undo(name, children, made ? i + 1 : i, snap, err);
			return r;
		}
	}
	return 0;
}

/* --- listing and removing ------------------------------------------------------ */

int cap_snapshot_list(char ***names, size_t *n)
{
	*names = NULL;
	*n = 0;
	_cleanup_free_ char *root = cap_snapshot_root();
	_cleanup_close_ int dfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char **all;
	size_t k;
	if (dfd < 0 || cap_dir_names(dfd, &all, &k) < 0)
		return 0;
	for (size_t i = 0; i < k; i++) {
		_cleanup_free_ char *state = xasprintf("%s/%s/state", root, all[i]);
		if (all[i][0] != '.' && cap_named_check_name(all[i], NULL) == 0 && exists(state)) {
			*names = xrealloc(*names, (*n + 1) * sizeof(char *));
			(*names)[(*n)++] = all[i];
		} else {
			free(all[i]);
		}
	}
	free(all);
	return 0;
}

static uint64_t allocated(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* The sandboxes made from each of v[0..n), from one read of the records. */
static void add_children(struct cap_snapshot_info *v, size_t n)
{
	char **names;
	size_t k;
	cap_named_list(&names, &k);
	for (size_t i = 0; i < k; i++) {
		struct cap_record c;
		struct cap_snapshot_info *to = NULL;
		if (cap_named_load(names[i], &c, NULL) == 0)
			for (size_t j = 0; j < n && !to && c.snapshot[0]; j++)
				if (strcmp(c.snapshot, v[j].name) == 0)
					to = &v[j];
		if (to) {
			to->children = xrealloc(to->children, (to->nchildren + 1) * sizeof(char *));
			to->children[to->nchildren++] = names[i];
		} else {
			free(names[i]);
		}
	}
	free(names);
}

/* What inspect shows but the children. */
static int inspect_one(const char *snap, struct cap_snapshot_info *out, struct cap_err *err)
{
	struct cap_record rec;
	int r;
	memset(out, 0, sizeof(*out));
	if ((r = load_snapshot_record(snap, &rec, err)) < 0)
		return r;
	_cleanup_free_ char *dir = cap_snapshot_dir(snap);
	_cleanup_free_ char *mp = xasprintf("%s/meta.json", dir);
	json_t *m = json_load_file(mp, 0, NULL);
	const char *parent = json_string_value(json_object_get(m, "parent"));
	snprintf(out->name, sizeof(out->name), "%s", snap);
	snprintf(out->parent, sizeof(out->parent), "%s", parent ? parent : rec.name);
	snprintf(out->image, sizeof(out->image), "%s", rec.image);
	out->created = json_integer_value(json_object_get(m, "created"));
	out->save_ms = json_integer_value(json_object_get(m, "save_ms"));
	json_decref(m);
	out->cpus = rec.cpus;
	out->memory_mib = rec.memory_mib;
	out->has_nic = rec.net[0] != '\0';
	_cleanup_free_ char *ram = xasprintf("%s/ram", dir);
	out->ram_bytes = allocated(ram);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(disk_files); i++) {
		_cleanup_free_ char *p = xasprintf("%s/%s", dir, disk_files[i].file);
		out->disk_bytes += allocated(p);
	}
	return 0;
}

int cap_snapshot_inspect(const char *snap, struct cap_snapshot_info *out, struct cap_err *err)
{
	int r = inspect_one(snap, out, err);
	if (r == 0)
		add_children(out, 1);
	return r;
}

int cap_snapshot_inspect_all(struct cap_snapshot_info **out, size_t *n)
{
	char **names;
	size_t k;
	cap_snapshot_list(&names, &k);
	*out = xcalloc(k ? k : 1, sizeof(**out));
	*n = 0;
	for (size_t i = 0; i < k; i++) {
		struct cap_err err = { 0 };
		struct cap_snapshot_info *o = &(*out)[(*n)++];
		if (inspect_one(names[i], o, &err) < 0) {
			memset(o, 0, sizeof(*o));
			snprintf(o->name, sizeof(o->name), "%s", names[i]);
			snprintf(o->error, sizeof(o->error), "%s", err.msg);
		}
		free(names[i]);
	}
	free(names);
	add_children(*out, *n);	/* every record read once for all of them */
	return 0;
}

void cap_snapshot_info_fini(struct cap_snapshot_info *i)
{
	for (size_t k = 0; k < i->nchildren; k++)
		free(i->children[k]);
	free(i->children);
	i->children = NULL;
	i->nchildren = 0;
}

int cap_snapshot_remove(const char *snap, struct cap_err *err)
{
	struct cap_snapshot_info info;
	int r = cap_snapshot_inspect(snap, &info, err);
	if (r < 0)
		return r;
	if (info.nchildren) {
		char list[512] = "";
		for (size_t k = 0; k < info.nchildren; k++) {
			size_t used = strlen(list);
			snprintf(list + used, sizeof(list) - used, "%s%s", k ? " " : "", info.children[k]);
		}
		r = cap_err_set(err, EBUSY, "snapshot '%s' has %zu sandbox%s made from it, whose disks are over its own: %s; remove %s first (`capsule rm NAME`)",
				snap, info.nchildren, info.nchildren == 1 ? "" : "es", list, info.nchildren == 1 ? "it" : "each");
		cap_snapshot_info_fini(&info);
		return r;
	}
	cap_snapshot_info_fini(&info);
	_cleanup_free_ char *dir = cap_snapshot_dir(snap);
	if ((r = cap_remove_tree(dir)) < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}
