/* Creating a named sandbox: its directory, disks and record in one step,
 * removed again on failure; and what its VM is made of (cap_named_shape). */
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

/* The root's upper disk as mke2fs -d takes it: the overlay's upper
 * directory is data/ on that disk (the agent's layout, docs/protocol.md
 * SETUP), so the seed's tree is copied to <dir>/.seed/data. *out is the
 * new .seed directory, removed by the caller. */
static int seed_upper(const struct cap_record *rec, char **out, struct cap_err *err)
{
	_cleanup_free_ char *top = cap_named_path(rec->name, ".seed");
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
		if ((r = cap_named_tmpfs_check(&rec->tmpfs[i], "a new sandbox", i, EINVAL, err)) < 0)
			return r;
	struct cap_named_ws ws __attribute__((cleanup(cap_named_ws_fini))) = { .dfd = -1 };
	cap_tree_init(&ws.tree);
	if (rec->workspace[0] &&
	    ((r = cap_named_ws_prepare(rec, progress, ud, &ws, err)) < 0 ||
	     (r = cap_named_check_size_ws(rec->cpus, rec->memory_mib, rec->root_size_mib, rec->work_size_mib,
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
	_cleanup_free_ char *recp = cap_named_path(rec->name, "record.json");
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
	_cleanup_free_ char *upper = cap_named_path(rec->name, "root-upper.ext4");
	_cleanup_free_ char *work = cap_named_path(rec->name, "private.ext4");
	rec->created = time(NULL);
	if (progress && rec->workspace[0])	/* a step worth naming beside the copy's */
		progress(ud, "creating the root and /work disks");
	_cleanup_free_ char *seed = NULL;
	if (rec->root_seed && (r = seed_upper(rec, &seed, err)) < 0) {
		cap_remove_tree(dir);
		return r;
	}
	r = cap_named_make_disk(upper, rec->root_size_mib, false, "root-upper", seed, 0, err);
	if (seed)
		cap_remove_tree(seed);
	if (r < 0 ||
	    (r = cap_named_make_disk(work, rec->work_size_mib, true, "work", NULL, 0, err)) < 0 ||
	    (r = cap_named_project(rec, progress, ud, err)) < 0 ||
	    (rec->workspace[0] && (r = cap_named_ws_make(rec, &ws, progress, ud, err)) < 0) ||
	    (r = cap_named_write_record(rec, err)) < 0) {
		cap_remove_tree(dir);	/* only what this call just made */
		return r;
	}
	return 0;
}

void cap_named_shape(const struct cap_record *rec, const char *image, const char *upper,
		     const char *work, const char *source, const char *workspace,
		     const char *name, const struct cap_net_policy *p,
		     struct cap_sandbox_spec *spec, struct cap_sandbox_opts *o)
{
	cap_sandbox_spec_named(spec, image, upper, work, source, workspace,
			       rec->hostname[0] ? rec->hostname : name);
	cap_sandbox_spec_root_readonly(spec, rec->root_readonly);
	cap_sandbox_spec_tools_root(spec, rec->tools_root);
	cap_sandbox_spec_tmpfs(spec, rec->tmpfs, rec->ntmpfs);
	cap_sandbox_spec_network(spec, p);
	cap_sandbox_opts_init(o);
	o->cpus = rec->cpus;
	o->memory_mib = rec->memory_mib;
	o->spec = spec;
}
