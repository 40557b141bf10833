/* The workspace of a named sandbox (docs/workspace.md): what its
 * /workspace changed since the base, a three-way merge of that into a
 * host directory, and its git commits fetched into a branch — what
 * `capsule diff` and `capsule merge` do, and serve's diff and merge.
 *
 * The guest is reached through a connection the caller attached (and
 * started the sandbox for); every call drives it to its end (src/sandbox/
 * xfer.h: the caller has no other stream of sb waiting). The caller holds
 * the sandbox's workspace lock around each call (cap_workspace_lock).
 * Nothing prints; errors name the path or value at fault. */
#ifndef CAP_WORKSPACE_H
#define CAP_WORKSPACE_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

#include "buf.h"
#include "err.h"
#include "named.h"
#include "sandbox.h"
#include "tree.h"
#include "workspace-types.h"

/* Hold the sandbox's workspace lock (workspace.lock in its directory) so
 * that two diffs or merges of one sandbox never run at once. wait: block
 * until the holder lets go; otherwise a lock held elsewhere is
 * -EWOULDBLOCK (err naming the sandbox). The descriptor (closing it lets
 * go), or -errno with err set. */
int cap_workspace_lock(const char *name, bool wait, struct cap_err *err);
/* Merges that write into one project directory run one at a time
 * (several sandboxes, servers or `capsule merge` runs merging into it):
 * an flock on the directory itself, held from the scan to the last
 * rename. The descriptor holding it; -EWOULDBLOCK (err set) when !wait
 * and another merge holds it. */
int cap_workspace_lock_dir(const char *dir, bool wait, struct cap_err *err);

/* What the sandbox's /workspace changed since its base: *base is the
 * base, *now the guest's manifest, *changes (n of them, sorted by path) a
 * new array (free it) whose pointers borrow from both. base and now are
 * the caller's: initialized (cap_tree_init) before the call and finished
 * (cap_tree_fini) after it, failed or not; *changes is written only on
 * success. -ENOENT when the sandbox has no workspace, -EBADMSG when the
 * guest's manifest is refused, other -errno from the agent channel. */
int cap_workspace_diff(const char *name, struct cap_sandbox *sb, struct cap_tree *base,
		       struct cap_tree *now, struct cap_tree_change **changes, size_t *n,
		       struct cap_err *err);

/* A merge of a sandbox's /workspace into a host directory: the three
 * sides and the plan that borrows from them. */
struct cap_workspace_merge {
	char dir[PATH_MAX];	/* the host directory merged into (as given) */
	struct cap_tree base;	/* what the sandbox and the project last agreed on */
	struct cap_tree ours;	/* dir now (scanned without the copy-in rules) */
	struct cap_tree theirs;	/* the guest's /workspace now */
	bool planned;	/* plan is filled */
	struct cap_merge_plan plan;	/* its conflicts say whether it may be applied */
};

/* Read the three sides (the base, dir scanned non-strict without its
 * staging directory, the guest's manifest) and plan the merge of theirs
 * into dir, conflicts settled by pick (src/tree/tree.h). dir is an
 * existing directory (the caller resolves it). *m is initialized here
 * and filled as far as the call got: cap_workspace_merge_fini it after
 * the call, failed or not. A plan with conflicts is a success (0, with
 * m->plan.nconflicts set): apply refuses it. */
int cap_workspace_plan(const char *name, struct cap_sandbox *sb, const char *dir,
		       enum cap_merge_pick pick, struct cap_workspace_merge *m,
		       struct cap_err *err);

/* Carry out a conflict-free plan: stage theirs' new files in
 * dir/.capsule-merge.NAME (fetched from the guest, each checked against
 * the manifest), put every path in place (cap_merge_apply), remove the
 * staging directory, then, when dir is the sandbox's own project (its
 * record's workspace), move the base to theirs: a merge into another
 * directory (--into) leaves the base, so that the changes still count
 * for the project. A plan without ops only moves the base. -EINVAL (nothing done) for a plan with
 * conflicts; -ESTALE or -EBADMSG (nothing written) when the sandbox
 * changed a file while it was read; after a failure in cap_merge_apply
 * the ops before the failing path are done and the base has not moved,
 * so a new plan finishes the merge. */
int cap_workspace_apply(const char *name, struct cap_sandbox *sb,
			const struct cap_workspace_merge *m, struct cap_err *err);

void cap_workspace_merge_fini(struct cap_workspace_merge *m);

/* A plan's ops counted by what they do (struct cap_workspace_counts). */
void cap_workspace_count(const struct cap_merge_plan *p, struct cap_workspace_counts *out);

/* merge --git: what was fetched. */
struct cap_workspace_git {
	char branch[CAP_NAME_MAX + 16];	/* "capsule/NAME" */
	char commit[65];	/* the branch's commit id (hex) */
	/* its subject, every control byte replaced by '?' (the guest's
	 * text); cut at the buffer's size */
	char subject[4096];
};

/* dir (a host git work tree: -EINVAL otherwise) gets the commits made in
 * the sandbox's /workspace: `git bundle create --all` runs in the guest
 * as the tool user (-ENOENT when the image has no git), the bundle is
 * copied out into a private temporary directory and removed from the
 * guest, and `git fetch` (transfer.fsckObjects: git checks every object)
 * puts its HEAD at refs/heads/capsule/NAME of dir, replacing the branch.
 * dir's files and the base are left alone. *out is written on success. */
int cap_workspace_git(const char *name, struct cap_sandbox *sb, const char *dir,
		      struct cap_workspace_git *out, struct cap_err *err);

/* --- helpers the front ends share ----------------------------------------- */

#endif
