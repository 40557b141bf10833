/* A sandbox's workspace (workspace.h): diff against the base, three-way
 * merge into a host directory, and --git, over an attached connection.
 * Everything from the guest (manifests, file contents, git's bundle and
 * the subject of its commit) is hostile: checked before use. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layout.h"
#include "named.h"
#include "paths.h"
#include "util.h"
#include "workspace.h"
#include "xfer.h"

extern char **environ;

/* Take an exclusive flock on fd (just opened from path, -errno if that
 * failed), waiting or not. fd, or -errno with err set (busy: what holds
 * it, for -EWOULDBLOCK); fd is closed on failure. */
static int lock_fd(int fd, const char *path, bool wait, const char *busy, struct cap_err *err)
{
	if (fd < 0)
		return cap_err_set(err, -fd, "cannot open %s: %s", path, strerror(-fd));
	int r;
	while ((r = flock(fd, LOCK_EX | (wait ? 0 : LOCK_NB))) < 0 && errno == EINTR)
		;
	if (r == 0)
		return fd;
	int e = errno;
	close(fd);
	if (e == EWOULDBLOCK)
		return cap_err_set(err, EWOULDBLOCK, "%s", busy);
	return cap_err_set(err, e, "cannot lock %s: %s", path, strerror(e));
}

int cap_workspace_lock(const char *name, bool wait, struct cap_err *err)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *path = xasprintf("%s/workspace.lock", dir);
	_cleanup_free_ char *busy = xasprintf("another diff or merge of sandbox '%s' is running", name);
	int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	return lock_fd(fd < 0 ? -errno : fd, path, wait, busy, err);
}

int cap_workspace_lock_dir(const char *dir, bool wait, struct cap_err *err)
{
	_cleanup_free_ char *busy = xasprintf("another merge into %s is running", dir);
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return lock_fd(fd < 0 ? -errno : fd, dir, wait, busy, err);
}

/* The guest's /workspace manifest. */
static int guest_manifest(const char *name, struct cap_sandbox *sb, struct cap_tree *out,
			  struct cap_err *err)
{
	int r = cap_xfer_manifest(sb, CAP_GUEST_WORKSPACE, "", out, err);
	if (r < 0)
		cap_err_prefix(err, "reading sandbox '%s''s /workspace", name);
	return r;
}

int cap_workspace_diff(const char *name, struct cap_sandbox *sb, struct cap_tree *base,
		       struct cap_tree *now, struct cap_tree_change **changes, size_t *n,
		       struct cap_err *err)
{
	int r;
	if ((r = cap_named_workspace_base(name, base, err)) < 0 || (r = guest_manifest(name, sb, now, err)) < 0)
		return r;
	if ((r = cap_tree_diff(base, now, changes, n)) < 0)
		return cap_err_set(err, -r, "comparing /workspace with its base: %s", strerror(-r));
	return 0;
}

/* --- merge ------------------------------------------------------------------- */

int cap_workspace_plan(const char *name, struct cap_sandbox *sb, const char *dir,
		       enum cap_merge_pick pick, struct cap_workspace_merge *m,
		       struct cap_err *err)
{
	memset(m, 0, sizeof(*m));
	cap_tree_init(&m->base);
	cap_tree_init(&m->ours);
	cap_tree_init(&m->theirs);
	if (strlen(dir) >= sizeof(m->dir))
		return cap_err_set(err, ENAMETOOLONG, "merge: %s: the path is too long", dir);
	snprintf(m->dir, sizeof(m->dir), "%s", dir);
	struct cap_tree_scan_opts so = { .strict = false, .skip_prefix = CAP_MERGE_STAGE_PREFIX };
	int r;
	if ((r = cap_named_workspace_base(name, &m->base, err)) < 0 ||
	    (r = guest_manifest(name, sb, &m->theirs, err)) < 0)
		return r;
	if ((r = cap_tree_scan(dir, &so, &m->ours, err)) < 0) {
		cap_err_prefix(err, "reading %s", dir);
		return r;
	}
	if ((r = cap_merge_plan(&m->base, &m->ours, &m->theirs, pick, &m->plan, err)) < 0)
		return r;
	m->planned = true;
	return 0;
}

void cap_workspace_merge_fini(struct cap_workspace_merge *m)
{
	if (m->planned)
		cap_merge_plan_fini(&m->plan);
	m->planned = false;
	cap_tree_fini(&m->base);
	cap_tree_fini(&m->ours);
	cap_tree_fini(&m->theirs);
}

void cap_workspace_count(const struct cap_merge_plan *p, struct cap_workspace_counts *out)
{
	memset(out, 0, sizeof(*out));
	out->git = p->ngit;
	for (size_t i = 0; i < p->nops; i++) {
		switch (p->ops[i].action) {
		case CAP_MERGE_WRITE: out->written++; break;
		case CAP_MERGE_REMOVE: out->removed++; break;
		case CAP_MERGE_LINK: out->links++; break;
		case CAP_MERGE_MKDIR: out->created++; break;
		case CAP_MERGE_CHMOD: out->chmod++; break;
		}
	}
}

/* Stage theirs' new files under dir, check them, put everything in
 * place. */
static int apply_ops(const char *name, struct cap_sandbox *sb, const struct cap_workspace_merge *m,
		     struct cap_err *err)
{
	const struct cap_merge_plan *p = &m->plan;
	char stage_dir[CAP_NAME_MAX + 32];
	snprintf(stage_dir, sizeof(stage_dir), "%s%s", CAP_MERGE_STAGE_PREFIX, name);
	_cleanup_close_ int dfd = open(m->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", m->dir, strerror(errno));
	int sfd = cap_merge_stage_open(dfd, stage_dir, err);
	if (sfd < 0)
		return sfd;
	const char **paths = xcalloc(p->nwrites ? p->nwrites : 1, sizeof(char *));
	uint64_t *sizes = xcalloc(p->nwrites ? p->nwrites : 1, sizeof(uint64_t));
	int r = 0;
	for (size_t i = 0; i < p->nops; i++)
		if (p->ops[i].action == CAP_MERGE_WRITE) {
			CAP_BUG_ON(p->ops[i].stage >= p->nwrites);
			paths[p->ops[i].stage] = p->ops[i].path;
			sizes[p->ops[i].stage] = p->ops[i].theirs->size;
		}
	/* Bounded by the project's free space (holes stay holes). */
	struct cap_xfer_fetch_opts fo = { .where = m->dir };
	if (p->nwrites && (r = cap_xfer_fetch(sb, CAP_GUEST_WORKSPACE, paths, sizes, p->nwrites, sfd, &fo, err)) < 0) {
		if (r == -ESTALE)
			cap_err_prefix(err, "the sandbox changed /workspace during the merge; nothing was written; run it again");
		goto out;
	}
	for (size_t i = 0; i < p->nops; i++)
		if (p->ops[i].action == CAP_MERGE_WRITE && (r = cap_merge_stage_verify(sfd, &p->ops[i], err)) < 0) {
			cap_err_prefix(err, "the sandbox changed /workspace during the merge; nothing was written; run it again");
			goto out;
		}
	if ((r = cap_merge_apply(dfd, sfd, p, err)) < 0) {
		/* apply's message says whether anything was written. */
		cap_err_prefix(err, "merging into %s (merging again finishes or redoes it)", m->dir);
		goto out;
	}
	close(sfd);
	sfd = -1;
	r = cap_merge_stage_remove(dfd, stage_dir, err);
out:
	if (sfd >= 0) {
		/* Nothing staged is needed again: a new merge plans afresh. */
		close(sfd);
		struct cap_err ignore = { 0 };
		cap_merge_stage_remove(dfd, stage_dir, &ignore);
	}
	free(paths);
	free(sizes);
	return r;
}

int cap_workspace_apply(const char *name, struct cap_sandbox *sb,
			const struct cap_workspace_merge *m, struct cap_err *err)
{
	int r;
	if (!m->planned)
		return cap_err_set(err, EINVAL, "merge of sandbox '%s': nothing was planned", name);
	if (m->plan.nconflicts)
		return cap_err_set(err, EINVAL, "merge of sandbox '%s' into %s: %zu conflict%s; nothing was written",
				   name, m->dir, m->plan.nconflicts, m->plan.nconflicts == 1 ? "" : "s");
	/* Without ops both sides agree already; the base still moves. */
	if (m->plan.nops && (r = apply_ops(name, sb, m, err)) < 0)
		return r;
	/* The base is what the sandbox and its own project agreed on: a
	 * merge into another directory leaves it, so the sandbox's changes
	 * still reach the project later. */
	struct cap_record rec;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		return r;
	char real[PATH_MAX];
	if (!realpath(rec.workspace, real) || strcmp(real, m->dir) != 0)
		return 0;
	return cap_named_workspace_set_base(name, &m->theirs, err);
}

/* --- host programs ------------------------------------------------------------ */

/* --- --git -------------------------------------------------------------------- */

struct guest_cmd {
	struct cap_buf out, err;
	bool done;
	int status;
	int errnum;
	char msg[256];
};

static void gc_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)id;
	struct guest_cmd *g = ud;
	struct cap_buf *b = fd == 1 ? &g->out : &g->err;
	if (cap_buf_used(b) < 65536)
		cap_buf_append(b, p, CAP_MIN(n, 65536 - cap_buf_used(b)));
}

static void gc_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	(void)id;
	struct guest_cmd *g = ud;
	g->done = true;
	g->status = ex ? cap_exit_status(ex) : 127;
	g->errnum = ex ? 0 : errnum;
	snprintf(g->msg, sizeof(g->msg), "%s", msg ? msg : "");
	if (ex && ex->kind == CAP_EXIT_START_FAILED)
		g->errnum = ex->value;
}

/* Run argv in the guest as the tool user in cwd, its output kept (64 KiB
 * each). 0 with g filled, or -errno with err set. */
static int guest_run(struct cap_sandbox *sb, char **argv, const char *cwd, struct guest_cmd *g,
		     struct cap_err *err)
{
	static const struct cap_exec_events ev = { gc_output, gc_done, NULL };
	uint32_t argc = 0;
	while (argv[argc])
		argc++;
	struct cap_exec_req req = { .argv = argv, .argc = argc, .cwd = (char *)cwd, .timeout_ms = 600000 };
	uint32_t id;
	int r = cap_sandbox_exec(sb, &req, &ev, g, &id, err);
	if (r < 0)
		return r;
	while (!g->done)
		if ((r = cap_sandbox_wait(sb, -1, err)) < 0)
			return r;
	return 0;
}

/* Whether s is a commit id: hex digits, 40 (SHA-1) or 64 (SHA-256). */
static bool commit_id(const char *s, size_t n)
{
	if (n != 40 && n != 64)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= '0' && s[i] <= '9') || (s[i] >= 'a' && s[i] <= 'f')))
			return false;
	return true;
}

/* Copy the guest's bundle (/work/rel) into tmp, remove it from the
 * guest, and fetch its HEAD into refs/heads/capsule/NAME of dir. */
static int fetch_bundle(const char *name, const char *dir, struct cap_sandbox *sb, const char *tmp,
			const char *rel, struct cap_workspace_git *out, struct cap_err *err)
{
	_cleanup_free_ char *bundle = xasprintf("%s/capsule-merge.bundle", tmp);
	_cleanup_free_ char *guest_path = xasprintf(CAP_GUEST_WORK "/%s", rel);
	struct cap_xfer_result res = { 0 };
	int r = cap_xfer_get(sb, CAP_GUEST_WORK, rel, bundle, 0, &res, err);
	cap_xfer_result_fini(&res);
	char *rm_argv[] = { "rm", "-f", guest_path, NULL };
	struct guest_cmd rmc = { 0 };
	struct cap_err ignore = { 0 };
	cap_buf_init(&rmc.out);
	cap_buf_init(&rmc.err);
	guest_run(sb, rm_argv, CAP_GUEST_WORK, &rmc, &ignore);
	cap_buf_fini(&rmc.out);
	cap_buf_fini(&rmc.err);
	if (r < 0) {
		cap_err_prefix(err, "--git: copying the bundle out of sandbox '%s'", name);
		return r;
	}

	_cleanup_free_ char *refspec = xasprintf("+HEAD:refs/heads/capsule/%s", name);
	_cleanup_free_ char *ref = xasprintf("refs/heads/capsule/%s", name);
	/* The bundle is the guest's: git checks every object it takes. Its
	 * stdout is taken too (--quiet: nothing), never the caller's. */
	char *fetch[] = { "git", "-C", (char *)dir, "-c", "transfer.fsckObjects=true", "fetch", "--no-tags",
			  "--no-write-fetch-head", "--quiet", bundle, refspec, NULL };
	struct cap_buf outb, eb;
	int status = 0;
	cap_buf_init(&outb);
	cap_buf_init(&eb);
	r = cap_run_capture(fetch, &outb, 0, &eb, &status, err);
	_cleanup_free_ char *ferr = cap_buf_text(&eb);
	cap_buf_fini(&outb);
	cap_buf_fini(&eb);
	if (r < 0)
		return r;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return cap_err_set(err, EIO, "--git: `git fetch` of the sandbox's bundle into %s failed: %s", dir,
				   *ferr ? ferr : "no message");
	char *show[] = { "git", "-C", (char *)dir, "log", "-1", "--format=%H %s", ref, "--", NULL };
	cap_buf_init(&outb);
	cap_buf_init(&eb);
	r = cap_run_capture(show, &outb, 4096, &eb, &status, err);
	_cleanup_free_ char *line = cap_buf_text(&outb);
	_cleanup_free_ char *lerr = cap_buf_text(&eb);
	cap_buf_fini(&outb);
	cap_buf_fini(&eb);
	if (r < 0)
		return r;
	const char *sp = strchr(line, ' ');
	size_t idlen = sp ? (size_t)(sp - line) : strlen(line);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !commit_id(line, idlen))
		return cap_err_set(err, EIO, "--git: the branch capsule/%s was fetched into %s, but `git log -1 capsule/%s` cannot show it: %s",
				   name, dir, name, *lerr ? lerr : "no commit id");
	snprintf(out->branch, sizeof(out->branch), "capsule/%s", name);
	snprintf(out->commit, sizeof(out->commit), "%.*s", (int)idlen, line);
	/* The commit's subject is the guest's text: no control bytes out. */
	snprintf(out->subject, sizeof(out->subject), "%s", sp ? sp + 1 : "");
	for (char *p = out->subject; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	return 0;
}

int cap_workspace_git(const char *name, struct cap_sandbox *sb, const char *dir,
		      struct cap_workspace_git *out, struct cap_err *err)
{
	struct cap_buf ob, eb;
	int status = 0, r;
	cap_buf_init(&ob);
	cap_buf_init(&eb);
	char *check[] = { "git", "-C", (char *)dir, "rev-parse", "--is-inside-work-tree", NULL };
	r = cap_run_capture(check, &ob, 4096, &eb, &status, err);
	_cleanup_free_ char *answer = cap_buf_text(&ob);
	cap_buf_fini(&ob);
	cap_buf_fini(&eb);
	if (r < 0)
		return r;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || strcmp(answer, "true") != 0)
		return cap_err_set(err, EINVAL, "--git: %s is not a git work tree (`git -C %s rev-parse --is-inside-work-tree` says no)",
				   dir, dir);

	/* The bundle goes to /work, the guest's private disk: the file
	 * transfer reaches /work, /workspace and /source only, and it must
	 * not show in /workspace. */
	static const char bundle_rel[] = ".capsule-merge.bundle";
	char *bundle_argv[] = { "git", "bundle", "create", CAP_GUEST_WORK "/.capsule-merge.bundle", "--all", NULL };
	struct guest_cmd g = { 0 };
	cap_buf_init(&g.out);
	cap_buf_init(&g.err);
	r = guest_run(sb, bundle_argv, CAP_GUEST_WORKSPACE, &g, err);
	_cleanup_free_ char *gerr = cap_buf_text(&g.err);
	cap_buf_fini(&g.out);
	cap_buf_fini(&g.err);
	if (r < 0)
		return r;
	if (g.errnum == ENOENT || (g.status == 127 && !g.errnum))
		return cap_err_set(err, ENOENT, "--git: the image has no git (`git bundle create` could not run in sandbox '%s'); install git in its image, or merge the files without --git",
				   name);
	if (g.errnum)
		return cap_err_set(err, g.errnum, "--git: cannot run git in sandbox '%s': %s", name,
				   g.msg[0] ? g.msg : strerror(g.errnum));
	if (g.status != 0)
		return cap_err_set(err, EIO, "--git: `git bundle create --all` in sandbox '%s''s /workspace failed (exit %d): %s",
				   name, g.status, *gerr ? gerr : "no message");

	_cleanup_free_ char *tmp = cap_make_tmpdir("capsule-ws", err);
	if (!tmp)
		return -err->code;
	struct cap_workspace_git got = { 0 };
	r = fetch_bundle(name, dir, sb, tmp, bundle_rel, &got, err);
	cap_remove_tree(tmp);
	if (r == 0)
		*out = got;
	return r;
}
