/* Fuzz target for the three-way merge plan (cap_merge_plan,
 * src/tree/tree-merge.c): the input describes three trees, base, ours
 * (the host) and theirs (the sandbox: hostile), over a small universe of
 * paths made of names that matter (.git, HEAD, objects, refs, config,
 * the staging prefix, plain names), each path in each tree absent or a
 * file, a directory, a link (targets inside and out) or a special file;
 * then the pick. The trees are made valid (sorted, parents as
 * directories), formatted and parsed back (so the parser sees links with
 * their true hashes too), and planned.
 *
 * The oracle, for every plan, whatever the pick and whether or not it
 * has conflicts (apply runs only without, but the ops are listed):
 * - no op touches a path with a ".git" component;
 * - no op touches a path whose first component starts with
 *   CAP_MERGE_STAGE_PREFIX;
 * - a LINK op's target does not leave the tree, by a textual walk of
 *   its own (absolute, or ".." climbing above the root from the link's
 *   directory);
 * - every op's entry of theirs is of the op's kind (WRITE a file, LINK a
 *   link, MKDIR a directory, CHMOD a file or directory), never a special
 *   file;
 * - NESTED REPOSITORIES: see nested_repo() below;
 * - nwrites counts the WRITE ops, their stage indices are 0..nwrites-1
 *   once each; conflicts are sorted, each with its reason. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "err.h"
#include "fuzz.h"
#include "sha256.h"
#include "tree.h"
#include "util.h"

static const char *const names[] = { "a", "b", ".git", "HEAD", "objects", "refs", "config",
				     ".capsule-merge.x", "c", "hooks", ".GIT", "x.git", ".gitx", "node_modules" };
static const char *const targets[] = { "a", "../a", "../../a", "/etc/passwd", "..", ".", "b/../..",
				       "../../../x", "a/b", ".git/config", "../.git", "./../b" };

#define PATHS_MAX 24

struct src {
	const uint8_t *p;
	size_t n, i;
};
static unsigned take(struct src *s) { return s->i < s->n ? s->p[s->i++] : 0; }

/* --- the oracle's own rules ----------------------------------------------- */

static bool git_component(const char *path)
{
	for (const char *p = path;;) {
		size_t k = strcspn(p, "/");
		if (k == 4 && strncmp(p, ".git", 4) == 0)
			return true;
		if (!p[k])
			return false;
		p += k + 1;
	}
}

static bool staging_name(const char *path)
{
	return strncmp(path, CAP_MERGE_STAGE_PREFIX, strlen(CAP_MERGE_STAGE_PREFIX)) == 0;
}

/* Whether a link at path with this target points outside the tree, by
 * walking the text from the link's directory. */
static bool escapes(const char *path, const char *target)
{
	if (target[0] == '/')
		return true;
	long depth = 0;
	for (const char *p = path; (p = strchr(p, '/')); p++)
		depth++;
	for (const char *p = target;;) {
		size_t k = strcspn(p, "/");
		if (k == 2 && strncmp(p, "..", 2) == 0) {
			if (--depth < 0)
				return true;
		} else if (k && !(k == 1 && *p == '.')) {
			depth++;
		}
		if (!p[k])
			return false;
		p += k + 1;
	}
}

/* NESTED REPOSITORIES (tree.h, struct cap_merge_plan's ngit): git takes
 * a directory for a repository when it holds HEAD, and objects and refs
 * or commondir (setup.c, is_git_directory), of any type; a merge must
 * neither write nor remove anything at or below such a directory of the
 * host's (ours) or the sandbox's (theirs), nor anything at all when the
 * top is one. Written here from that rule, not from tree-merge.c's. */
static bool has(const struct cap_tree *a, const struct cap_tree *b, const char *dir, const char *name)
{
	char p[CAP_TREE_MAX_PATH + 16];
	snprintf(p, sizeof(p), "%s%s%s", dir, *dir ? "/" : "", name);
	return cap_tree_find(a, p) || cap_tree_find(b, p);
}

static bool shaped(const struct cap_tree *ours, const struct cap_tree *theirs, const char *dir)
{
	return has(ours, theirs, dir, "HEAD") &&
	       ((has(ours, theirs, dir, "objects") && has(ours, theirs, dir, "refs")) ||
		has(ours, theirs, dir, "commondir"));
}

static bool nested_repo(const struct cap_tree *ours, const struct cap_tree *theirs, const char *path)
{
	if (shaped(ours, theirs, ""))
		return true;
	char dir[CAP_TREE_MAX_PATH + 1];
	snprintf(dir, sizeof(dir), "%s", path);
	for (;;) {
		if (shaped(ours, theirs, dir))
			return true;
		char *slash = strrchr(dir, '/');
		if (!slash)
			return false;
		*slash = '\0';
	}
}

/* --- making the trees ----------------------------------------------------- */

static void set_hash_of(struct cap_tree_entry *e, const char *text)
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, text, strlen(text));
	cap_sha256_final_hex(&h, hex);
	for (int i = 0; i < 32; i++) {
		unsigned v;
		sscanf(hex + 2 * i, "%2x", &v);
		e->hash[i] = (uint8_t)v;
	}
}

static int by_path(const void *a, const void *b)
{
	return strcmp(((const struct cap_tree_entry *)a)->path, ((const struct cap_tree_entry *)b)->path);
}

/* What path is in one tree: 0 absent, else an entry kind. */
struct pick {
	char type;
	uint32_t mode;
	uint8_t content;
	const char *target;
};

static void make_tree(struct cap_tree *t, char *const *paths, size_t np, struct pick (*pk)[3], int which)
{
	cap_tree_init(t);
	t->v = xcalloc(np, sizeof(*t->v));
	for (size_t i = 0; i < np; i++) {
		const struct pick *k = &pk[i][which];
		/* The host's side is a scan, which skips the staging names
		 * (skip_prefix CAP_MERGE_STAGE_PREFIX): never in ours. */
		if (!k->type || (which == 1 && staging_name(paths[i])))
			continue;
		struct cap_tree_entry *e = &t->v[t->n++];
		e->path = xstrdup(paths[i]);
		e->type = k->type;
		e->mode = k->mode;
		if (k->type == CAP_TREE_FILE) {
			e->size = k->content;
			e->hash[0] = k->content;
			t->bytes += e->size;
		} else if (k->type == CAP_TREE_LINK) {
			e->target = xstrdup(k->target);
			e->size = strlen(k->target);
			set_hash_of(e, k->target);
		}
	}
	qsort(t->v, t->n, sizeof(*t->v), by_path);
}

/* The tree through its text form and back: the parser's view. */
static void reparse(struct cap_tree *t)
{
	struct cap_buf text;
	struct cap_tree back;
	struct cap_err err;
	cap_buf_init(&text);
	cap_tree_format(t, &text);
	cap_tree_init(&back);
	int r = cap_tree_parse((const char *)cap_buf_head(&text), cap_buf_used(&text), 0, &back, &err);
	FUZZ_CHECK(r == 0, "a valid tree's manifest does not parse: %s\n%.*s", err.msg, (int)cap_buf_used(&text), (const char *)cap_buf_head(&text));
	FUZZ_CHECK(back.n == t->n, "a manifest of %zu entries parses as %zu", t->n, back.n);
	cap_tree_fini(t);
	*t = back;
	cap_buf_fini(&text);
}

static void check_plan(const struct cap_merge_plan *p, const struct cap_tree *ours, const struct cap_tree *theirs)
{
	size_t writes = 0;
	bool *staged = xcalloc(p->nwrites + 1, 1);
	for (size_t i = 0; i < p->nops; i++) {
		const struct cap_merge_op *op = &p->ops[i];
		const struct cap_tree_entry *t = op->theirs;
		FUZZ_CHECK(!git_component(op->path), "op %zu (action %d) touches %s, inside .git", i, (int)op->action, op->path);
		FUZZ_CHECK(!nested_repo(ours, theirs, op->path), "op %zu (action %d) touches %s, in a nested repository", i,
			   (int)op->action, op->path);
		FUZZ_CHECK(!staging_name(op->path), "op %zu (action %d) touches %s, a staging name", i, (int)op->action,
			   op->path);
		switch (op->action) {
		case CAP_MERGE_WRITE:
			FUZZ_CHECK(t && t->type == CAP_TREE_FILE, "a WRITE of %s that is not a file of theirs", op->path);
			FUZZ_CHECK(op->stage < p->nwrites && !staged[op->stage], "WRITE %s: stage %zu of %zu", op->path,
				   op->stage, p->nwrites);
			staged[op->stage] = true;
			writes++;
			break;
		case CAP_MERGE_LINK:
			FUZZ_CHECK(t && t->type == CAP_TREE_LINK && t->target, "a LINK of %s that is not a link of theirs", op->path);
			FUZZ_CHECK(!escapes(op->path, t->target), "a LINK %s -> %s, out of the tree", op->path, t->target);
			break;
		case CAP_MERGE_MKDIR:
			FUZZ_CHECK(t && t->type == CAP_TREE_DIR, "a MKDIR of %s that is not a directory of theirs", op->path);
			break;
		case CAP_MERGE_CHMOD:
			FUZZ_CHECK(t && (t->type == CAP_TREE_FILE || t->type == CAP_TREE_DIR),
				   "a CHMOD of %s that is not a file or directory of theirs", op->path);
			break;
		case CAP_MERGE_REMOVE:
			break;
		default:
			fuzz_fail("op %zu: action %d", i, (int)op->action);
		}
		FUZZ_CHECK(!t || t->type != CAP_TREE_OTHER, "op %zu puts the special file %s", i, op->path);
		FUZZ_CHECK(!t || strcmp(t->path, op->path) == 0, "op %zu at %s takes theirs of %s", i, op->path, t->path);
	}
	FUZZ_CHECK(writes == p->nwrites, "%zu WRITE ops, nwrites %zu", writes, p->nwrites);
	for (size_t i = 0; i < p->nconflicts; i++) {
		FUZZ_CHECK(p->conflicts[i].why && *p->conflicts[i].why, "conflict %s without a reason", p->conflicts[i].path);
		FUZZ_CHECK(i == 0 || strcmp(p->conflicts[i - 1].path, p->conflicts[i].path) < 0, "conflicts out of order");
	}
	free(staged);
}

static void show(const struct cap_tree *t, const struct cap_merge_plan *p, enum cap_merge_pick pick)
{
	static const char *const tree_names[] = { "base", "ours", "theirs" };
	for (int w = 0; w < 3; w++) {
		struct cap_buf text;
		cap_buf_init(&text);
		cap_tree_format(&t[w], &text);
		fprintf(stderr, "--- %s\n%.*s", tree_names[w], (int)cap_buf_used(&text), (const char *)cap_buf_head(&text));
		cap_buf_fini(&text);
	}
	fprintf(stderr, "--- plan (pick %d): %zu ops, %zu conflicts, %zu in .git\n", (int)pick, p->nops, p->nconflicts, p->ngit);
	for (size_t i = 0; i < p->nops; i++)
		fprintf(stderr, "op %zu: action %d %s%s\n", i, (int)p->ops[i].action, p->ops[i].path, p->ops[i].dir ? " (dir)" : "");
	for (size_t i = 0; i < p->nconflicts; i++)
		fprintf(stderr, "conflict: %s: %s\n", p->conflicts[i].path, p->conflicts[i].why);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct src s = { data, size, 0 };
	enum cap_merge_pick pick = (enum cap_merge_pick)(take(&s) % 3);
	char *paths[3 * PATHS_MAX];	/* PATHS_MAX made, and their parents */
	struct pick pk[3 * PATHS_MAX][3];
	size_t np = 0;
	while (np < PATHS_MAX && s.i < s.n) {
		char path[128] = "";
		unsigned depth = 1 + take(&s) % 3;
		for (unsigned d = 0; d < depth; d++) {
			size_t l = strlen(path);
			snprintf(path + l, sizeof(path) - l, "%s%s", d ? "/" : "", names[take(&s) % CAP_ARRAY_SIZE(names)]);
		}
		bool dup = false;
		for (size_t i = 0; i < np; i++)
			dup |= strcmp(paths[i], path) == 0;
		for (int w = 0; w < 3; w++) {
			unsigned b = take(&s);
			struct pick *k = &pk[np][w];
			static const char types[] = { 0, 0, CAP_TREE_FILE, CAP_TREE_FILE, CAP_TREE_DIR, CAP_TREE_LINK, CAP_TREE_OTHER, 0 };
			static const uint32_t modes[] = { 0644, 0755, 0600, 04755 };
			k->type = types[b % 8];
			k->mode = k->type == CAP_TREE_LINK ? 0777 : modes[(b >> 3) % 4];
			k->content = (uint8_t)(b >> 5);
			k->target = targets[(b >> 3) % CAP_ARRAY_SIZE(targets)];
			if (k->type == CAP_TREE_OTHER)
				k->mode &= 0777;
		}
		if (dup)
			continue;
		paths[np++] = xstrdup(path);
	}
	/* Add every parent of a path as a path of its own; a tree that has
	 * an entry has its parents as directories. */
	for (size_t i = 0; i < np; i++) {
		for (char *sl = strrchr(paths[i], '/'); sl; sl = NULL) {
			*sl = '\0';
			size_t j = 0;
			while (j < np && (j == i || strcmp(paths[j], paths[i]) != 0))
				j++;
			if (j == np) {	/* not listed: add it, absent everywhere for now */
				paths[np] = xstrdup(paths[i]);
				memset(pk[np], 0, sizeof(pk[np]));
				np++;
			}
			*sl = '/';
		}
	}
	/* Until nothing changes, make each present entry's parent a
	 * directory. */
	for (bool changed = true; changed;) {
		changed = false;
		for (size_t i = 0; i < np; i++) {
			char *sl = strrchr(paths[i], '/');
			if (!sl)
				continue;
			*sl = '\0';
			size_t j = 0;
			while (j < np && (j == i || strcmp(paths[j], paths[i]) != 0))
				j++;
			*sl = '/';
			for (int w = 0; w < 3; w++) {
				if (!pk[i][w].type)
					continue;
				if (pk[j][w].type != CAP_TREE_DIR) {
					pk[j][w] = (struct pick){ CAP_TREE_DIR, 0755, 0, NULL };
					changed = true;
				}
			}
		}
	}
	struct cap_tree t[3];
	for (int w = 0; w < 3; w++) {
		make_tree(&t[w], paths, np, pk, w);
		reparse(&t[w]);
	}
	struct cap_merge_plan plan;
	struct cap_err err;
	memset(&plan, 0, sizeof(plan));
	int r = cap_merge_plan(&t[0], &t[1], &t[2], pick, &plan, &err);
	FUZZ_CHECK(r == 0, "no plan: %s", err.msg);
	if (getenv("FUZZ_SHOW"))	/* to see what a failing input makes */
		show(t, &plan, pick);
	check_plan(&plan, &t[1], &t[2]);
	cap_merge_plan_fini(&plan);
	for (int w = 0; w < 3; w++)
		cap_tree_fini(&t[w]);
	for (size_t i = 0; i < np; i++)
		free(paths[i]);
	return 0;
}
