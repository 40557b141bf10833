/* Three-way merges of manifests, and applying a merge beneath a host
 * directory: plan path by path, stage theirs' files, then put each in
 * place with a rename, opening every parent directory beneath the tree
 * with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS so a symbolic link planted
 * on the host is never followed. */
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "util.h"

/* --- planning ------------------------------------------------------------- */

enum decision { KEEP, TAKE, CONFLICT };

/* One path of the union of the three trees. */
struct node {
	const char *path;
	const struct cap_tree_entry *b, *o, *t;
	size_t parent;	/* index of the parent's node; SIZE_MAX at the top */
	enum decision d;
	const char *why;	/* CONFLICT */
	bool forced;	/* a conflict CAP_MERGE_THEIRS cannot settle */
	bool ours;	/* KEEP because CAP_MERGE_OURS settled a conflict */
	bool settled;	/* KEEP because a directory above is a conflict or ours */
	bool gone;	/* the host's directory here goes (TAKE of a non-dir) */
	bool stays;	/* ... but something below it stays, so it does too */
	bool git;	/* KEEP: a change of theirs inside a repository, left out */
	bool shaped;	/* a directory shaped like a repository's (repo_shape) */
	bool listed;	/* a repository (repo == self) some change was left out of */
	size_t repo;	/* the repository it is in (its .git or shaped directory,
			 * the outermost), ROOT_REPO, or NO_REPO */
};

#define NO_REPO SIZE_MAX
#define ROOT_REPO (SIZE_MAX - 1)

struct plan {
	struct node *v;
	size_t n;
	enum cap_merge_pick pick;
	bool root_shaped;	/* the tree's top is shaped like a repository */
	bool root_listed;
};

/* Entries as the merge sees them: modes by their 0777 bits only, the
 * merge never setting set-id or sticky bits (so a host copy of a 04755
 * file of theirs is the same as theirs). */
static bool same(const struct cap_tree_entry *a, const struct cap_tree_entry *b)
{
	if (!a || !b)
		return !a && !b;
	return a->type == b->type && (a->mode & 0777) == (b->mode & 0777) &&
	       memcmp(a->hash, b->hash, sizeof(a->hash)) == 0;
}

static bool is_dir(const struct cap_tree_entry *e)
{
	return e && e->type == CAP_TREE_DIR;
}

static const char *min_path(const char *a, const char *b)
{
	return !a ? b : !b ? a : strcmp(a, b) <= 0 ? a : b;
}

static const struct cap_tree_entry *take_if(const struct cap_tree *t, size_t *i, const char *path)
{
	if (*i < t->n && strcmp(t->v[*i].path, path) == 0)
		return &t->v[(*i)++];
	return NULL;
}

static int cmp_node(const void *key, const void *n)
{
	return strcmp(key, ((const struct node *)n)->path);
}

/* The union of the three sorted trees, sorted, each node knowing its parent
 * (always in the union: every tree lists the parents of its paths). */
static void build_union(struct plan *pl, const struct cap_tree *b,
			const struct cap_tree *o, const struct cap_tree *t)
{
	size_t i = 0, j = 0, k = 0;
	pl->v = xcalloc(b->n + o->n + t->n + 1, sizeof(*pl->v));
	while (i < b->n || j < o->n || k < t->n) {
		const char *p = min_path(min_path(i < b->n ? b->v[i].path : NULL,
						  j < o->n ? o->v[j].path : NULL),
					 k < t->n ? t->v[k].path : NULL);
		struct node *nd = &pl->v[pl->n++];
		nd->path = p;
		nd->b = take_if(b, &i, p);
		nd->o = take_if(o, &j, p);
		nd->t = take_if(t, &k, p);
	}
	for (size_t x = 0; x < pl->n; x++) {
		const char *slash = strrchr(pl->v[x].path, '/');
		pl->v[x].parent = SIZE_MAX;
		if (!slash)
			continue;
		_cleanup_free_ char *parent = xstrndup(pl->v[x].path, (size_t)(slash - pl->v[x].path));
		const struct node *q = bsearch(parent, pl->v, x, sizeof(*pl->v), cmp_node);
		CAP_BUG_ON(!q);
		pl->v[x].parent = (size_t)(q - pl->v);
	}
}

static void conflict(struct plan *pl, struct node *nd, const char *why, bool forced)
{
	nd->d = CONFLICT;
	nd->why = why;
	nd->forced = forced;
	if (pl->pick == CAP_MERGE_OURS) {
		nd->d = KEEP;
		nd->ours = true;
	} else if (pl->pick == CAP_MERGE_THEIRS && !forced) {
		nd->d = TAKE;
	}
}

static const char *why_both(const struct node *nd)
{
	if (!nd->o)
		return "changed in the sandbox, deleted on the host";
	if (!nd->t)
		return "deleted in the sandbox, changed on the host";
	return nd->b ? "changed on both sides" : "added on both sides";
}

static bool reserved(const char *path)
{
	return strncmp(path, CAP_MERGE_STAGE_PREFIX, strlen(CAP_MERGE_STAGE_PREFIX)) == 0;
}

/* An entry that is there on the host or in the sandbox. */
static const struct cap_tree_entry *either(const struct node *nd)
{
	return nd->t ? nd->t : nd->o;
}

static const struct node *sibling(const struct plan *pl, const char *dir, const char *name)
{
	_cleanup_free_ char *p = *dir ? xasprintf("%s/%s", dir, name) : xstrdup(name);
	return bsearch(p, pl->v, pl->n, sizeof(*pl->v), cmp_node);
}

/* Whether the directory dir ("" for the top) holds what makes git take
 * a directory for a repository's (setup.c, is_git_directory): HEAD, and
 * objects and refs or a commondir naming where they are, each on the
 * host or in the sandbox (a merge must not complete one either side
 * began). Types are not asked: git follows links, and a file where git
 * expects a directory is as suspect. */
static bool repo_shape(const struct plan *pl, const char *dir)
{
	const struct node *head = sibling(pl, dir, "HEAD");
	if (!head || !either(head))
		return false;
	const struct node *objects = sibling(pl, dir, "objects"), *refs = sibling(pl, dir, "refs");
	const struct node *common = sibling(pl, dir, "commondir");
	return (objects && either(objects) && refs && either(refs)) || (common && either(common));
}

static const char *last_name(const char *path)
{
	const char *slash = strrchr(path, '/');
	return slash ? slash + 1 : path;
}

/* Which repository each path is in: below a ".git" (a directory, or a
 * file "gitdir: ..." pointing at one) or a directory shaped like a
 * repository's, the outermost; everything when the top is shaped like
 * one. A repository's own files are never merged: its config and hooks
 * run code on the host the next time git looks at it. */
static void find_repos(struct plan *pl)
{
	pl->root_shaped = repo_shape(pl, "");
	for (size_t i = 0; i < pl->n; i++) {
		struct node *nd = &pl->v[i];
		const struct cap_tree_entry *e = either(nd);
		nd->shaped = e && e->type == CAP_TREE_DIR && repo_shape(pl, nd->path);
		nd->repo = nd->parent != SIZE_MAX ? pl->v[nd->parent].repo : pl->root_shaped ? ROOT_REPO : NO_REPO;
		if (nd->repo == NO_REPO && (strcmp(last_name(nd->path), ".git") == 0 || nd->shaped))
			nd->repo = i;
	}
}

/* The path on its own: the rules of cap_merge_plan. */
static void decide(struct plan *pl, struct node *nd)
{
	const struct cap_tree_entry *b = nd->b, *o = nd->o, *t = nd->t;
	if (same(t, b) || same(o, t))
		nd->d = KEEP;
	else if (same(o, b) || (!o && b && t && b->type != t->type))
		nd->d = TAKE;
	else if (is_dir(o) && is_dir(t) && !is_dir(b))
		nd->d = TAKE;	/* a directory both made: theirs' mode */
	else
		nd->d = CONFLICT;
	if (nd->d != KEEP && nd->repo != NO_REPO) {
		nd->d = KEEP;	/* never written: counted in the plan's ngit */
		nd->git = true;
		if (nd->repo == ROOT_REPO)
			pl->root_listed = true;
		else
			pl->v[nd->repo].listed = true;
		return;
	}
	if (nd->d == KEEP || !t) {
		if (nd->d == CONFLICT)
			conflict(pl, nd, why_both(nd), false);
		return;
	}
	if (reserved(t->path))
		conflict(pl, nd, "a name the merge uses for its staging", true);
	else if (t->type == CAP_TREE_LINK && !cap_tree_link_inside(t->path, t->target))
		conflict(pl, nd, "a link that leaves the tree", true);
	else if (t->type == CAP_TREE_OTHER)
		conflict(pl, nd, "a special file", true);
	else if (nd->d == CONFLICT)
		conflict(pl, nd, why_both(nd), false);
}

/* What the host will have at a node once the plan ran. */
static const struct cap_tree_entry *result(const struct node *nd)
{
	return nd->d == TAKE && !nd->stays ? nd->t : nd->o;
}

/* The host's entry below a directory that goes stays: so do the
 * directories above it that were to go. */
static void keep_above(struct plan *pl, size_t q)
{
	for (; q != SIZE_MAX && pl->v[q].gone && !pl->v[q].stays; q = pl->v[q].parent)
		pl->v[q].stays = true;
}

/* A directory of theirs the host removed or replaced: made again,
 * parents first. */
static void make_above(struct plan *pl, size_t q)
{
	for (; q != SIZE_MAX && !is_dir(result(&pl->v[q])); q = pl->v[q].parent) {
		CAP_BUG_ON(!is_dir(pl->v[q].t));
		pl->v[q].d = TAKE;
		pl->v[q].stays = false;
	}
}

/* A path against its parent's outcome (decided before it: a parent sorts
 * before its children). */
static void fit(struct plan *pl, size_t i)
{
	struct node *nd = &pl->v[i];
	const struct node *q = nd->parent == SIZE_MAX ? NULL : &pl->v[nd->parent];
	if (q && q->gone && nd->o && nd->repo != NO_REPO) {
		/* A repository is never touched, not even to go with the
		 * directory theirs removed: that directory stays for it. This
		 * asks where the path is, not whether theirs changed it (git):
		 * a .git the host alone made is changed on neither side. */
		keep_above(pl, nd->parent);
	} else if (q && q->gone && nd->o) {
		/* The host's entry must go with the directory theirs removed. */
		if (nd->d == KEEP && !nd->ours)
			conflict(pl, nd, "changed on the host in a directory the sandbox removed", false);
		if (nd->d != TAKE)
			keep_above(pl, nd->parent);
	}
	if (q && nd->d == TAKE && nd->t && !is_dir(result(q))) {
		if (q->d == CONFLICT || q->ours || q->settled) {
			nd->d = KEEP;	/* its directory's conflict settles it */
			nd->settled = true;
		} else {
			conflict(pl, nd, "changed in the sandbox below a directory the host removed or replaced", false);
			if (nd->d == TAKE)
				make_above(pl, nd->parent);
		}
	}
	nd->gone = nd->d == TAKE && is_dir(nd->o) && !is_dir(nd->t);
}

/* --- ops ------------------------------------------------------------------ */

/* The ops of the plan, in phases: 0 removals of non-directories, 1 of
 * directories (deepest first), 2 directories to create, 3 writes, links
 * and chmods of files, 4 chmods of directories (deepest first). */
struct phases {
	struct cap_merge_op *v[5];
	size_t n[5], cap[5];
};

static void push(struct phases *ph, int k, enum cap_merge_action a, const struct node *nd)
{
	if (ph->n[k] == ph->cap[k]) {
		ph->cap[k] = ph->cap[k] ? ph->cap[k] * 2 : 64;
		ph->v[k] = xrealloc(ph->v[k], ph->cap[k] * sizeof(*ph->v[k]));
	}
	ph->v[k][ph->n[k]++] = (struct cap_merge_op){ a, nd->path, a == CAP_MERGE_REMOVE ? NULL : nd->t, 0,
						      a == CAP_MERGE_REMOVE && is_dir(nd->o), nd->o };
}

static void ops_of(struct phases *ph, const struct node *nd)
{
	const struct cap_tree_entry *o = nd->o, *t = nd->t;
	if (o && (!t || is_dir(o) != is_dir(t)))
		push(ph, is_dir(o) ? 1 : 0, CAP_MERGE_REMOVE, nd);
	if (!t)
		return;
	if (t->type == CAP_TREE_DIR) {
		push(ph, 2, CAP_MERGE_MKDIR, nd);
		if ((t->mode & 0700) != 0700)
			push(ph, 4, CAP_MERGE_CHMOD, nd);
	} else if (t->type == CAP_TREE_LINK) {
		push(ph, 3, CAP_MERGE_LINK, nd);
	} else if (o && o->type == CAP_TREE_FILE && o->size == t->size &&
		   memcmp(o->hash, t->hash, sizeof(o->hash)) == 0) {
		push(ph, 3, CAP_MERGE_CHMOD, nd);
	} else {
		push(ph, 3, CAP_MERGE_WRITE, nd);
	}
}

static void reverse(struct cap_merge_op *v, size_t n)
{
	for (size_t i = 0; i < n / 2; i++) {
		struct cap_merge_op x = v[i];
		v[i] = v[n - 1 - i];
		v[n - 1 - i] = x;
	}
}

static void fill(struct cap_merge_plan *out, const struct plan *pl)
{
	struct phases ph = { 0 };
	size_t nc = 0, nr = pl->root_listed;
	for (size_t i = 0; i < pl->n; i++) {
		if (pl->v[i].d == TAKE && !pl->v[i].stays)
			ops_of(&ph, &pl->v[i]);
		nc += pl->v[i].d == CONFLICT;
		out->ngit += pl->v[i].git;
		nr += pl->v[i].listed;
	}
	out->repos = xcalloc(nr + 1, sizeof(*out->repos));
	if (pl->root_listed)
		out->repos[out->nrepos++] = (struct cap_merge_repo){ "", "the top of the tree is shaped like a git repository (HEAD, objects, refs)" };
	for (size_t i = 0; i < pl->n; i++)
		if (pl->v[i].listed)
			out->repos[out->nrepos++] = (struct cap_merge_repo){
				pl->v[i].path, pl->v[i].shaped ? "shaped like a git repository (HEAD, objects, refs)"
							       : "a .git" };
	reverse(ph.v[1], ph.n[1]);
	reverse(ph.v[4], ph.n[4]);
	size_t total = 0;
	for (int k = 0; k < 5; k++)
		total += ph.n[k];
	out->ops = xcalloc(total + 1, sizeof(*out->ops));
	for (int k = 0; k < 5; k++) {
		for (size_t i = 0; i < ph.n[k]; i++) {
			struct cap_merge_op *op = &out->ops[out->nops++];
			*op = ph.v[k][i];
			if (op->action == CAP_MERGE_WRITE)
				op->stage = out->nwrites++;
		}
		free(ph.v[k]);
	}
	out->conflicts = xcalloc(nc + 1, sizeof(*out->conflicts));
	for (size_t i = 0; i < pl->n; i++)
		if (pl->v[i].d == CONFLICT)
			out->conflicts[out->nconflicts++] = (struct cap_merge_conflict){ pl->v[i].path, pl->v[i].why };
}

void cap_merge_plan_fini(struct cap_merge_plan *p)
{
	free(p->ops);
	free(p->conflicts);
	free(p->repos);
	*p = (struct cap_merge_plan){ 0 };
}

int cap_merge_plan(const struct cap_tree *base, const struct cap_tree *ours,
		   const struct cap_tree *theirs, enum cap_merge_pick pick,
		   struct cap_merge_plan *out, struct cap_err *err)
{
	if (pick != CAP_MERGE_REFUSE && pick != CAP_MERGE_THEIRS && pick != CAP_MERGE_OURS)
		return cap_err_set(err, EINVAL, "unknown merge pick %d", (int)pick);
	struct plan pl = { .pick = pick };
	build_union(&pl, base, ours, theirs);
	find_repos(&pl);
	for (size_t i = 0; i < pl.n; i++) {
		decide(&pl, &pl.v[i]);
		fit(&pl, i);
	}
	*out = (struct cap_merge_plan){ 0 };
	fill(out, &pl);
	free(pl.v);
	return 0;
}

/* --- staging -------------------------------------------------------------- */

void cap_merge_stage_name(size_t i, char buf[24])
{
	snprintf(buf, 24, "%zu", i);
}

/* Whether name is one apply leaves in the staging directory: a staged
 * file ("0", "1"...) or a link made before its rename ("l0"...). */
static bool stage_entry(const char *name, bool *link)
{
	*link = name[0] == 'l';
	const char *d = name + *link;
	if (!*d || (d[0] == '0' && d[1]) || strlen(d) > 20)
		return false;
	return strspn(d, "0123456789") == strlen(d);
}

static bool stage_name_ok(const char *name)
{
	return *name && !strchr(name, '/') && strcmp(name, ".") != 0 && strcmp(name, "..") != 0;
}

/* Empty the staging directory fd of what a merge left there. */
static int stage_clear(int fd, const char *name, struct cap_err *err)
{
	int dfd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	if (!d) {
		int e = errno;
		if (dfd >= 0)
			close(dfd);
		return cap_err_set(err, e, "cannot list the staging directory %s: %s", name, strerror(e));
	}
	int r = 0;
	struct dirent *de;
	while (r == 0 && (errno = 0, de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		struct stat st;
		bool link;
		if (fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			r = errno == ENOENT ? 0 : cap_err_set(err, errno, "cannot read %s/%s: %s", name, de->d_name, strerror(errno));
		else if (!stage_entry(de->d_name, &link) || (link ? !S_ISLNK(st.st_mode) : !S_ISREG(st.st_mode)))
			r = cap_err_set(err, EEXIST, "the staging directory %s holds %s, which no merge put there; remove it (or the whole directory) and merge again",
					name, de->d_name);
		else if (unlinkat(fd, de->d_name, 0) < 0 && errno != ENOENT)
			r = cap_err_set(err, errno, "cannot remove %s/%s: %s", name, de->d_name, strerror(errno));
	}
	if (r == 0 && errno)
		r = cap_err_set(err, errno, "cannot list the staging directory %s: %s", name, strerror(errno));
	closedir(d);
	return r;
}

static int stage_open_dir(int dirfd, const char *name, struct cap_err *err)
{
	int fd = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0 && (errno == ENOTDIR || errno == ELOOP))
		return cap_err_set(err, EEXIST, "%s is in the way of the merge's staging directory (it is not a directory); remove it and merge again",
				   name);
	if (fd < 0)
		return errno == ENOENT ? -ENOENT : cap_err_set(err, errno, "cannot open the staging directory %s: %s", name, strerror(errno));
	return fd;
}

int cap_merge_stage_open(int dirfd, const char *name, struct cap_err *err)
{
	if (!stage_name_ok(name))
		return cap_err_set(err, EINVAL, "bad staging directory name \"%s\"", name);
	if (mkdirat(dirfd, name, 0700) < 0 && errno != EEXIST)
		return cap_err_set(err, errno, "cannot create the staging directory %s: %s", name, strerror(errno));
	int fd = stage_open_dir(dirfd, name, err);
	if (fd == -ENOENT)
		return cap_err_set(err, ENOENT, "the staging directory %s disappeared while it was made; merge again", name);
	if (fd < 0)
		return fd;
	int r = stage_clear(fd, name, err);
	if (r == 0 && fchmod(fd, 0700) < 0)
		r = cap_err_set(err, errno, "cannot make the staging directory %s private: %s", name, strerror(errno));
	if (r < 0) {
		close(fd);
		return r;
	}
	return fd;
}

int cap_merge_stage_remove(int dirfd, const char *name, struct cap_err *err)
{
	if (!stage_name_ok(name))
		return cap_err_set(err, EINVAL, "bad staging directory name \"%s\"", name);
	int fd = stage_open_dir(dirfd, name, err);
	if (fd == -ENOENT)
		return 0;
	if (fd < 0)
		return fd;
	int r = stage_clear(fd, name, err);
	close(fd);
	if (r == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		r = cap_err_set(err, errno, "cannot remove the staging directory %s: %s", name, strerror(errno));
	return r;
}

/* Whether the open file fd holds the entry's content (and its size). */
static int holds(int fd, const struct cap_tree_entry *t, bool *yes)
{
	struct stat st;
	uint8_t h[32];
	uint64_t size;
	*yes = false;
	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != t->size)
		return 0;
	int r = cap_tree_hash_fd(fd, h, &size);
	if (r < 0)
		return r;
	*yes = size == t->size && memcmp(h, t->hash, sizeof(h)) == 0;
	return 0;
}

int cap_merge_stage_verify(int stagefd, const struct cap_merge_op *op,
			   struct cap_err *err)
{
	char name[24];
	cap_merge_stage_name(op->stage, name);
	CAP_BUG_ON(op->action != CAP_MERGE_WRITE || !op->theirs);
	_cleanup_close_ int fd = openat(stagefd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return cap_err_set(err, errno == ELOOP ? EBADMSG : errno, "cannot read the staged copy of %s: %s",
				   op->path, strerror(errno));
	bool yes;
	int r = holds(fd, op->theirs, &yes);
	if (r < 0)
		return cap_err_set(err, -r, "cannot read the staged copy of %s: %s", op->path, strerror(-r));
	if (!yes)
		return cap_err_set(err, EBADMSG, "the copy of %s fetched from the sandbox is not what its manifest said (it changed while the merge read it); nothing was written, merge again",
				   op->path);
	return 0;
}

/* --- applying ------------------------------------------------------------- */

/* Open the directory rel ("." for the top) beneath dirfd, following no
 * symbolic link and never leaving it. */
static int open_beneath(int dirfd, const char *rel)
{
	struct open_how how = {
		.flags = O_RDONLY | O_DIRECTORY | O_CLOEXEC,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
	if (fd >= 0)
		return (int)fd;
	if (errno == EAGAIN || errno == EINTR)
		fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof(how));
	return fd >= 0 ? (int)fd : -errno;
}

struct apply {
	int dirfd, stagefd;
	const struct cap_merge_plan *p;
	struct cap_err *err;
	char *cur;	/* the parent directory open in curfd */
	int curfd;
	char **touched;	/* parents to fsync at the end */
	size_t ntouched, cap;
};

/* The parent directory of path ("." at the top) and its last component. */
static char *split(const char *path, const char **base)
{
	const char *slash = strrchr(path, '/');
	*base = slash ? slash + 1 : path;
	return slash ? xstrndup(path, (size_t)(slash - path)) : xstrdup(".");
}

static int cmp_op_path(const void *key, const void *op)
{
	return strcmp(key, (*(const struct cap_merge_op *const *)op)->path);
}

/* Whether an op before op i makes the directory dir. */
static bool made_before(struct cap_merge_op **mk, size_t nmk, const struct cap_merge_op *ops,
			size_t i, const char *dir)
{
	struct cap_merge_op **m = nmk ? bsearch(dir, mk, nmk, sizeof(*mk), cmp_op_path) : NULL;
	return m && *m < ops + i;
}

/* The parent directory dir of path cannot be opened (error r). */
static int in_the_way(struct apply *a, const char *path, const char *dir, int r, bool started)
{
	const char *done = started ? "the paths before it were merged" : "nothing was written";
	if (r == -ELOOP || r == -EXDEV)
		return cap_err_set(a->err, ELOOP, "cannot merge %s: %s on the host is, or lies below, a symbolic link (or leaves the tree); %s: remove the link and merge again",
				   path, dir, done);
	if (r == -ENOTDIR || r == -ENOENT)
		return cap_err_set(a->err, -r, "cannot merge %s: %s on the host is not a directory (it changed since the merge looked); %s: merge again",
				   path, dir, done);
	return cap_err_set(a->err, -r, "cannot merge %s: cannot open %s: %s; %s", path, dir, strerror(-r), done);
}

static int cmp_op_ptr(const void *x, const void *y)
{
	const struct cap_merge_op *a = *(const struct cap_merge_op *const *)x;
	const struct cap_merge_op *b = *(const struct cap_merge_op *const *)y;
	int c = strcmp(a->path, b->path);
	return c ? c : (a < b ? -1 : a > b);
}

/* The first of the ops sorted by path (all) whose path is path, or NULL. */
static struct cap_merge_op **by_path(struct cap_merge_op **all, size_t n, const char *path)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (strcmp(all[mid]->path, path) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < n && strcmp(all[lo]->path, path) == 0 ? &all[lo] : NULL;
}

/* Whether the host entry base in pfd is e (NULL: nothing there): type,
 * permission bits, content or target. */
static int unchanged(int pfd, const char *base, const struct cap_tree_entry *e, bool *yes)
{
	struct stat st;
	*yes = false;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		*yes = errno == ENOENT && !e;
		return errno == ENOENT ? 0 : -errno;
	}
	if (!e || (e->type != CAP_TREE_LINK && (st.st_mode & 0777) != (e->mode & 0777)))
		return 0;
	switch (e->type) {
	case CAP_TREE_DIR:
		*yes = S_ISDIR(st.st_mode);
		return 0;
	case CAP_TREE_OTHER:
		*yes = !S_ISDIR(st.st_mode) && !S_ISREG(st.st_mode) && !S_ISLNK(st.st_mode);
		return 0;
	case CAP_TREE_LINK: {
		char t[CAP_TREE_MAX_PATH + 1];
		ssize_t n = S_ISLNK(st.st_mode) ? readlinkat(pfd, base, t, sizeof(t)) : -1;
		*yes = n >= 0 && (size_t)n == e->size && memcmp(t, e->target, (size_t)n) == 0;
		return 0;
	}
	case CAP_TREE_FILE: {
		if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->size)
			return 0;
		_cleanup_close_ int fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
		return fd < 0 ? -errno : holds(fd, e, yes);
	}
	}
	return 0;
}

/* Every op's parent directory resolves beneath the tree without a
 * symbolic link, or an earlier MKDIR makes it; and every path an op
 * changes is still what the plan saw on the host there, or already what
 * some op of the plan puts there (the same plan run again after a
 * crash). */
static int check(struct apply *a)
{
	const struct cap_merge_plan *p = a->p;
	struct cap_merge_op **mk = xcalloc(p->nops + 1, sizeof(*mk));
	struct cap_merge_op **all = xcalloc(p->nops + 1, sizeof(*all));
	size_t nmk = 0;
	for (size_t i = 0; i < p->nops; i++) {
		all[i] = &p->ops[i];
		if (p->ops[i].action == CAP_MERGE_MKDIR)
			mk[nmk++] = &p->ops[i];
	}
	qsort(all, p->nops, sizeof(*all), cmp_op_ptr);
	int r = 0;
	for (size_t i = 0; i < p->nops && r == 0; i++) {
		const struct cap_merge_op *op = &p->ops[i];
		const char *base;
		_cleanup_free_ char *dir = split(op->path, &base);
		int fd = open_beneath(a->dirfd, dir);
		if (fd >= 0) {
			bool same_entry;
			int u = unchanged(fd, base, op->ours, &same_entry);
			for (struct cap_merge_op **q = by_path(all, p->nops, op->path);
			     u == 0 && !same_entry && q && q < all + p->nops && strcmp((*q)->path, op->path) == 0; q++)
				u = (*q)->action == CAP_MERGE_REMOVE ? unchanged(fd, base, NULL, &same_entry)
								     : unchanged(fd, base, (*q)->theirs, &same_entry);
			close(fd);
			if (u < 0)
				r = cap_err_set(a->err, -u, "cannot merge %s: cannot read it on the host: %s; nothing was written",
						op->path, strerror(-u));
			else if (!same_entry)
				r = cap_err_set(a->err, EAGAIN, "cannot merge %s: it changed on the host while the merge ran; nothing was written: merge again (the host's change is then kept, or a conflict)",
						op->path);
			continue;
		}
		if ((fd == -ENOENT || fd == -ENOTDIR) && op->action == CAP_MERGE_REMOVE)
			continue;	/* nothing there to remove */
		if ((fd == -ENOENT || fd == -ENOTDIR || fd == -ELOOP) && made_before(mk, nmk, p->ops, i, dir))
			continue;
		r = in_the_way(a, op->path, dir, fd, false);
	}
	free(mk);
	free(all);
	return r;
}

/* The parent directory of path, open in a->curfd (*base its last
 * component); -ENOENT with err not set when it is missing (or not a
 * directory) and that is fine (missing_ok). */
static int parent(struct apply *a, const char *path, const char **base, bool missing_ok)
{
	char *dir = split(path, base);
	if (a->cur && strcmp(a->cur, dir) == 0) {
		free(dir);
		return a->curfd;
	}
	if (a->curfd >= 0)
		close(a->curfd);
	free(a->cur);
	a->cur = NULL;
	a->curfd = open_beneath(a->dirfd, dir);
	if (a->curfd < 0) {
		int r = a->curfd;
		if (r == -ENOTDIR && missing_ok)
			r = -ENOENT;
		if (r != -ENOENT || !missing_ok)
			r = in_the_way(a, path, dir, r, true);
		free(dir);
		return r;
	}
	a->cur = dir;
	if (a->ntouched == a->cap)
		a->touched = xrealloc(a->touched, (a->cap = a->cap ? a->cap * 2 : 16) * sizeof(char *));
	a->touched[a->ntouched++] = xstrdup(dir);
	return a->curfd;
}

static int failed(struct apply *a, const struct cap_merge_op *op, const char *what, int e)
{
	return cap_err_set(a->err, e, "cannot merge %s: %s: %s", op->path, what, strerror(e));
}

/* A WRITE whose staged file is gone: done when the path holds theirs'. */
static int written_before(struct apply *a, const struct cap_merge_op *op, int pfd, const char *base)
{
	_cleanup_close_ int fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	bool yes = false;
	if (fd >= 0 && holds(fd, op->theirs, &yes) == 0 && yes)
		return fchmod(fd, op->theirs->mode & 0777) < 0 ? failed(a, op, "setting its mode", errno) : 0;
	return cap_err_set(a->err, ENOENT, "cannot merge %s: its staged copy is missing; merge again (the merge fetches it anew)",
			   op->path);
}

static int do_write(struct apply *a, const struct cap_merge_op *op, int pfd, const char *base)
{
	char name[24];
	cap_merge_stage_name(op->stage, name);
	_cleanup_close_ int fd = openat(a->stagefd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat st;
	if (fd < 0 && errno == ENOENT)
		return written_before(a, op, pfd, base);
	if (fd < 0 || fstat(fd, &st) < 0)
		return failed(a, op, "reading its staged copy", errno);
	if (!S_ISREG(st.st_mode) || (uint64_t)st.st_size != op->theirs->size)
		return cap_err_set(a->err, EBADMSG, "cannot merge %s: its staged copy is not the file its manifest gives; merge again",
				   op->path);
	if (fchmod(fd, op->theirs->mode & 0777) < 0)
		return failed(a, op, "setting the mode of its staged copy", errno);
	if (fsync(fd) < 0)
		return failed(a, op, "syncing its staged copy", errno);
	if (renameat(a->stagefd, name, pfd, base) < 0)
		return failed(a, op, "moving its staged copy into place", errno);
	return 0;
}

static int do_link(struct apply *a, const struct cap_merge_op *op, size_t i, int pfd, const char *base)
{
	char name[24];
	snprintf(name, sizeof(name), "l%zu", i);
	if (unlinkat(a->stagefd, name, 0) < 0 && errno != ENOENT)
		return failed(a, op, "clearing the staging directory", errno);
	if (symlinkat(op->theirs->target, a->stagefd, name) < 0)
		return failed(a, op, "making the link in the staging directory", errno);
	if (renameat(a->stagefd, name, pfd, base) < 0) {
		int e = errno;
		unlinkat(a->stagefd, name, 0);
		return failed(a, op, "moving the link into place", e);
	}
	return 0;
}

/* Set the mode of the entry base in pfd, which must be of theirs' type,
 * without following a link. */
static int set_mode(struct apply *a, const struct cap_merge_op *op, int pfd, const char *base,
		    mode_t mode)
{
	_cleanup_close_ int fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0 && errno == EACCES)	/* mode 0: a path fd, chmod through /proc */
		fd = openat(pfd, base, O_PATH | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0)
		return failed(a, op, "opening it", errno);
	bool dir = op->theirs->type == CAP_TREE_DIR;
	if (dir ? !S_ISDIR(st.st_mode) : !S_ISREG(st.st_mode))
		return cap_err_set(a->err, EEXIST, "cannot merge %s: it is no longer a %s on the host (it changed since the merge looked); merge again",
				   op->path, dir ? "directory" : "regular file");
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	int r = fchmod(fd, mode);
	if (r < 0 && errno == EBADF)
		r = chmod(proc, mode);
	return r < 0 ? failed(a, op, "setting its mode", errno) : 0;
}

static int do_mkdir(struct apply *a, const struct cap_merge_op *op, int pfd, const char *base)
{
	if (mkdirat(pfd, base, 0700) < 0 && errno != EEXIST)
		return failed(a, op, "creating the directory", errno);
	/* At least u+rwx until the end, for what goes below it. */
	return set_mode(a, op, pfd, base, (op->theirs->mode & 0777) | 0700);
}

static int do_remove(struct apply *a, const struct cap_merge_op *op, int pfd, const char *base)
{
	struct stat st;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : failed(a, op, "reading it", errno);
	if (!S_ISDIR(st.st_mode) != !op->dir)
		return 0;	/* made by a later op of this plan run before */
	if (unlinkat(pfd, base, op->dir ? AT_REMOVEDIR : 0) == 0 || errno == ENOENT)
		return 0;
	if (errno == ENOTEMPTY || errno == EEXIST)
		return cap_err_set(a->err, ENOTEMPTY, "cannot merge %s: the directory holds entries added on the host since the merge looked; merge again",
				   op->path);
	return failed(a, op, "removing it", errno);
}

static int run(struct apply *a, size_t i)
{
	const struct cap_merge_op *op = &a->p->ops[i];
	const char *base;
	bool remove = op->action == CAP_MERGE_REMOVE;
	int pfd = parent(a, op->path, &base, remove);
	if (pfd == -ENOENT && remove)
		return 0;
	if (pfd < 0)
		return pfd;
	switch (op->action) {
	case CAP_MERGE_WRITE: return do_write(a, op, pfd, base);
	case CAP_MERGE_LINK: return do_link(a, op, i, pfd, base);
	case CAP_MERGE_MKDIR: return do_mkdir(a, op, pfd, base);
	case CAP_MERGE_CHMOD: return set_mode(a, op, pfd, base, op->theirs->mode & 0777);
	case CAP_MERGE_REMOVE: return do_remove(a, op, pfd, base);
	}
	CAP_BUG_ON(true);
	return -EINVAL;
}

static int cmp_str(const void *x, const void *y)
{
	return strcmp(*(char *const *)x, *(char *const *)y);
}

/* fsync every directory the ops touched, once each. */
static int sync_touched(struct apply *a)
{
	int r = 0;
	if (a->ntouched)
		qsort(a->touched, a->ntouched, sizeof(char *), cmp_str);
	for (size_t i = 0; i < a->ntouched; i++) {
		if (r < 0 || (i && strcmp(a->touched[i], a->touched[i - 1]) == 0))
			continue;
		int fd = open_beneath(a->dirfd, a->touched[i]);
		if (fd == -ENOENT || fd == -ENOTDIR)
			continue;	/* removed or replaced by a later op */
		if (fd < 0 || fsync(fd) < 0)
			r = cap_err_set(a->err, fd < 0 ? -fd : errno, "cannot sync the directory %s after the merge: %s",
					a->touched[i], strerror(fd < 0 ? -fd : errno));
		if (fd >= 0)
			close(fd);
	}
	if (r == 0 && fsync(a->stagefd) < 0 && errno != EINVAL)
		r = cap_err_set(a->err, errno, "cannot sync the staging directory: %s", strerror(errno));
	return r;
}

int cap_merge_apply(int dirfd, int stagefd, const struct cap_merge_plan *p,
		    struct cap_err *err)
{
	struct apply a = { .dirfd = dirfd, .stagefd = stagefd, .p = p, .err = err, .curfd = -1 };
	if (p->nconflicts)
		return cap_err_set(err, EINVAL, "the merge has %zu conflicts (the first: %s, %s); nothing was written",
				   p->nconflicts, p->conflicts[0].path, p->conflicts[0].why);
	int r = check(&a);
	for (size_t i = 0; i < p->nops && r == 0; i++)
		r = run(&a, i);
	if (a.curfd >= 0)
		close(a.curfd);
	free(a.cur);
	int s = sync_touched(&a);
	for (size_t i = 0; i < a.ntouched; i++)
		free(a.touched[i]);
	free(a.touched);
	return r < 0 ? r : s;
}
