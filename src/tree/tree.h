/* Directory trees as manifests, and what moves between a host project and
 * a sandbox's /workspace (docs/workspace.md): scanning a host tree,
 * the manifest's text form (shared with the guest agent, which writes it:
 * docs/protocol.md, MANIFEST), comparing two manifests, planning a
 * three-way merge, and applying one beneath a host directory without ever
 * following a symbolic link there.
 *
 * A manifest lists every entry below a root, sorted by path bytes; the
 * root itself is not listed. Entries are compared by type, permission
 * bits and content hash (a link's hash is that of its target text), never
 * by time or owner. Manifest text from a guest is untrusted: every line,
 * path and count is checked (cap_tree_parse). No I/O but the calls that
 * say so; nothing prints. */
#ifndef CAP_TREE_H
#define CAP_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "buf.h"
#include "err.h"

/* Bounds of one manifest: entries, the length of one path or link target
 * (bytes, before escaping), the depth of a path, and the bytes of all its
 * paths and link targets together (before escaping): 268 bytes per entry
 * at the most entries, far more than real trees use, so that a manifest
 * from a guest costs the host at most about 400 MiB parsed (its text is
 * parsed as it arrives, never held whole). */
#define CAP_TREE_MAX_ENTRIES 1000000u
#define CAP_TREE_MAX_PATH 4096u
#define CAP_TREE_MAX_DEPTH 256u
#define CAP_TREE_MAX_NAMES (256u << 20)
/* The longest line of the text form (both names escaped, %XX each byte),
 * and the most text a manifest within the bounds above can take. */
#define CAP_TREE_MAX_LINE (128u + 6u * CAP_TREE_MAX_PATH)
#define CAP_TREE_MAX_TEXT (128ull * CAP_TREE_MAX_ENTRIES + 3ull * CAP_TREE_MAX_NAMES)

enum cap_tree_type {
	CAP_TREE_FILE = 'f',
	CAP_TREE_DIR = 'd',
	CAP_TREE_LINK = 'l',
	CAP_TREE_OTHER = 'o',	/* device, FIFO, socket: never copied */
};

struct cap_tree_entry {
	char *path;	/* relative, '/'-separated, no "", "." or ".." component */
	char *target;	/* CAP_TREE_LINK: the link's text; else NULL */
	char type;	/* enum cap_tree_type */
	uint32_t mode;	/* permission bits, & 07777 */
	uint64_t size;	/* FILE: bytes; LINK: strlen(target); else 0 */
	uint8_t hash[32];	/* FILE: SHA-256 of the content; LINK: of target; else 0 */
};

struct cap_tree {
	struct cap_tree_entry *v;	/* sorted by strcmp of path, no duplicates */
	size_t n;
	uint64_t bytes;	/* sum of FILE sizes */
};

void cap_tree_init(struct cap_tree *t);
void cap_tree_fini(struct cap_tree *t);
/* The entry for path, or NULL (binary search). */
const struct cap_tree_entry *cap_tree_find(const struct cap_tree *t, const char *path);
/* Whether two entries are the same content: type, mode, and hash. */
bool cap_tree_entry_same(const struct cap_tree_entry *a, const struct cap_tree_entry *b);

/* --- host trees ----------------------------------------------------------- */

/* How cap_tree_scan treats what it finds. */
struct cap_tree_scan_opts {
	/* Refuse (-EINVAL, err naming the path and what it is) symbolic
	 * links that are absolute or climb out of the tree, devices, FIFOs
	 * and sockets: the rules for copying a project into a sandbox. When
	 * false they are listed (OTHER, or LINK with their target) — for a
	 * merge's look at the host side, which must see everything. */
	bool strict;
	/* Skip entries at the top of the tree whose name starts with this
	 * prefix (the merge's own staging directory), NULL: none. */
	const char *skip_prefix;
	/* Bounds (0: CAP_TREE_MAX_ENTRIES, and no byte limit). */
	uint64_t max_entries;
	uint64_t max_bytes;
};

/* Walk the host directory dir (never following a symbolic link, not
 * crossing into other file systems: a mount point below dir is refused by
 * name when strict and listed as OTHER otherwise), hashing every regular
 * file. Hard links are listed once per path. -ENOENT/-ENOTDIR naming dir
 * (-ELOOP when dir itself is a symbolic link), -EINVAL (strict rule
 * broken), -E2BIG over max_entries, -EFBIG over max_bytes, -ENAMETOOLONG
 * for a path or link target over CAP_TREE_MAX_PATH or a path deeper than
 * CAP_TREE_MAX_DEPTH, each with err naming the path. *out is new on
 * success (cap_tree_fini), untouched on failure. */
int cap_tree_scan(const char *dir, const struct cap_tree_scan_opts *o,
		  struct cap_tree *out, struct cap_err *err);

/* Hash what is left to read of fd (SHA-256) and count its bytes. 0 or
 * -errno. */
int cap_tree_hash_fd(int fd, uint8_t hash[32], uint64_t *size);

/* Whether a symbolic link at path (relative to a tree's root) with this
 * target stays inside the tree: relative, with ".." only as its leading
 * components and no more of them than the link's own depth. Checked on
 * the text alone, that still holds through other links of the tree:
 * the link's directory is a real one, the leading ".." climb real
 * directories, and what follows only descends (through links that each
 * obey the same rule), so no chain of links can leave the tree — which a
 * rule allowing "a/.." could not promise when "a" is a link. */
bool cap_tree_link_inside(const char *path, const char *target);

/* --- text form ------------------------------------------------------------ */

/* Append the manifest's text form (docs/protocol.md, MANIFEST). MODE is
 * written as 4 octal digits ("%04o"); the parser takes 1 to 4 digits.
 * SIZE is decimal without leading zeros. */
void cap_tree_format(const struct cap_tree *t, struct cap_buf *out);
/* Append one entry's line (what the agent writes per entry). */
void cap_tree_format_entry(const struct cap_tree_entry *e, struct cap_buf *out);
/* Parse manifest text (from a guest: hostile). Every line must be well
 * formed, paths valid (cap_tree_path_ok after unescaping), sorted, unique,
 * and every entry's parent directories listed as DIR before it; at most
 * max_entries (0: CAP_TREE_MAX_ENTRIES). A link's SIZE must be its
 * target's length and its HASH that of the target; d and o entries have
 * SIZE 0 and HASH "-". The text must end with a newline (empty text is an
 * empty tree); at most CAP_TREE_MAX_NAMES bytes of paths and targets. -EBADMSG with err naming the line number and the rule; *out
 * is new on success (cap_tree_fini), untouched on failure. */
int cap_tree_parse(const char *text, size_t len, size_t max_entries,
		   struct cap_tree *out, struct cap_err *err);
/* The same a piece at a time, for text that arrives in pieces (split
 * anywhere): only the unfinished line is kept between feeds, at most
 * CAP_TREE_MAX_LINE bytes. Over max_entries, or over CAP_TREE_MAX_NAMES
 * bytes of paths and targets, is -EBADMSG naming the line and the limit,
 * as is everything cap_tree_parse refuses. After a failure every call returns it again (err
 * filled each time). finish checks the text ended with a newline and
 * fills *out (new, cap_tree_fini; untouched on failure). The parser is
 * the caller's (cap_tree_parser_free). */
struct cap_tree_parser;
struct cap_tree_parser *cap_tree_parser_new(size_t max_entries);
int cap_tree_parser_feed(struct cap_tree_parser *p, const char *text, size_t len, struct cap_err *err);
int cap_tree_parser_finish(struct cap_tree_parser *p, struct cap_tree *out, struct cap_err *err);
void cap_tree_parser_free(struct cap_tree_parser *p);
/* A relative path as a manifest may hold one: not empty, no leading or
 * trailing '/', no empty, "." or ".." component, no NUL, at most
 * CAP_TREE_MAX_PATH bytes and CAP_TREE_MAX_DEPTH components. */
bool cap_tree_path_ok(const char *path);
/* Escape bytes <= 0x20, '%' and 0x7f as %XX (append to out), and undo it
 * (-EINVAL on a bad escape: '%' without two hex digits, or a raw byte
 * that must have been escaped). *out is a new NUL-terminated string (free
 * it); it may hold a NUL from "%00", which cap_tree_path_ok refuses. */
void cap_tree_escape(const char *s, struct cap_buf *out);
int cap_tree_unescape(const char *s, size_t n, char **out);

/* Read (at most CAP_TREE_MAX_TEXT bytes, parsed as it is read, as
 * cap_tree_parse does) and write a manifest file (0600, written
 * atomically). */
int cap_tree_load(const char *path, struct cap_tree *out, struct cap_err *err);
int cap_tree_save(const char *path, const struct cap_tree *t, struct cap_err *err);

/* --- comparing ------------------------------------------------------------ */

enum cap_tree_change_kind {
	CAP_TREE_ADDED,
	CAP_TREE_DELETED,
	CAP_TREE_MODIFIED,	/* same type, other content (or link target) */
	CAP_TREE_MODE,	/* same type and content, other permission bits */
	CAP_TREE_TYPE,	/* another kind of entry at the same path */
};

struct cap_tree_change {
	enum cap_tree_change_kind kind;
	const struct cap_tree_entry *from;	/* in base; NULL when ADDED */
	const struct cap_tree_entry *to;	/* in now; NULL when DELETED */
};

/* What changed from base to now, sorted by path; *out is new (free it;
 * its pointers borrow from the two trees). */
int cap_tree_diff(const struct cap_tree *base, const struct cap_tree *now,
		  struct cap_tree_change **out, size_t *n);
const char *cap_tree_change_name(enum cap_tree_change_kind k);	/* "added"... */

/* --- three-way merge ------------------------------------------------------ */

/* How a path changed on both sides (differently) is settled. */
enum cap_merge_pick {
	CAP_MERGE_REFUSE,	/* a conflict: the merge writes nothing */
	CAP_MERGE_THEIRS,	/* the sandbox's version wins */
	CAP_MERGE_OURS,	/* the host's version stays */
};

enum cap_merge_action {
	CAP_MERGE_WRITE,	/* a regular file with theirs' content and mode */
	CAP_MERGE_LINK,	/* a symbolic link with theirs' target */
	CAP_MERGE_MKDIR,	/* a directory (or chmod of an existing one) */
	CAP_MERGE_CHMOD,	/* a file that keeps its content, new mode */
	CAP_MERGE_REMOVE,	/* a file, link or (empty, after the others) directory */
};

struct cap_merge_op {
	enum cap_merge_action action;
	const char *path;	/* borrowed from the trees */
	const struct cap_tree_entry *theirs;	/* NULL for REMOVE */
	size_t stage;	/* WRITE: index of its staged file (cap_merge_stage_name) */
	bool dir;	/* REMOVE: the host's entry is a directory (a REMOVE
			 * leaves an entry of the other kind alone: what a
			 * later op of the plan made there) */
	/* The host's entry at path when the plan was made (NULL: none),
	 * which cap_merge_apply checks is still there before it writes. */
	const struct cap_tree_entry *ours;
};

struct cap_merge_conflict {
	const char *path;	/* borrowed */
	const char *why;	/* static text: "changed on both sides", ... */
};

/* A repository some change of theirs was left out of. */
struct cap_merge_repo {
	const char *path;	/* borrowed: the .git or the directory shaped like a
				 * repository's; "" for the top of the tree */
	const char *why;	/* static text: "a .git", "shaped like a git repository ..." */
};

struct cap_merge_plan {
	struct cap_merge_op *ops;	/* in the order apply runs them */
	size_t nops;
	size_t nwrites;	/* ops with action WRITE: staged files 0..nwrites-1 */
	struct cap_merge_conflict *conflicts;	/* sorted by path */
	size_t nconflicts;
	/* Changes of theirs inside a repository, which a merge never
	 * writes: a repository's config and hooks run code on the host the
	 * next time git looks at it, unseen in any diff of the project
	 * (merge --git brings commits back instead). A repository is an
	 * entry named .git at any depth (a directory, or a file "gitdir: X"
	 * sending git elsewhere) and everything below it, or a directory
	 * shaped like one, on the host or in the sandbox: holding HEAD, and
	 * objects and refs or commondir (what git's is_git_directory looks
	 * for), itself and everything below it; when the top of the tree
	 * is so shaped, every path. ngit counts the paths left out, repos
	 * names the outermost repositories they are in, sorted (the top,
	 * "", first). */
	size_t ngit;
	struct cap_merge_repo *repos;
	size_t nrepos;
};

void cap_merge_plan_fini(struct cap_merge_plan *p);
/* Plan the merge of theirs (the sandbox now) into ours (the host now),
 * both against base (what they last agreed on), path by path (entries
 * compared as cap_tree_entry_same does, but modes by their 0777 bits:
 * apply never sets set-id or sticky bits):
 * theirs == base: nothing; theirs != base and ours == base: take theirs;
 * ours == theirs: nothing; otherwise a conflict unless pick settles it.
 * A symbolic link of theirs that leaves the tree (cap_tree_link_inside),
 * and an OTHER entry of theirs, is always a conflict ("a link that leaves
 * the tree", "a special file"), which CAP_MERGE_OURS settles (the host's
 * version stays) and CAP_MERGE_THEIRS does not; so is a path of theirs
 * whose first component starts with CAP_MERGE_STAGE_PREFIX ("a name the
 * merge uses for its staging"). (A directory of theirs replacing a host
 * entry that changed is an ordinary conflict: CAP_MERGE_THEIRS takes the
 * directory, as it takes any version of theirs.) Changes of theirs
 * inside a repository (a .git, or a directory shaped like a
 * repository's: see ngit) are left out, counted in ngit, never written
 * whatever the pick. A directory theirs removed (or replaced) whose
 * host subtree changed stays: the changed paths are conflicts ("changed
 * on the host in a directory the sandbox removed"), and a path theirs
 * changed below a directory the host removed or replaced is one too.
 * When the sandbox replaced an entry with one of another type and the
 * host deleted it, theirs is taken (both agree the old entry goes; this is
 * also what a crash between the two steps of a type change leaves), and
 * a directory both sides made takes theirs' mode (also what a crash
 * before the last chmod of a new directory leaves).
 * Ops are ordered so that apply can run them one by one: removals of
 * files, links and special files, then of directories (deepest first, so
 * that a directory theirs replaced by a file is gone before the write),
 * then directories to create (parents first; created with at least u+rwx
 * so the writes below them work), writes, links and chmods, and last the
 * chmods of new directories whose mode lacks u+rwx (deepest first). A
 * plan with conflicts still lists the ops of the other paths; apply it
 * only when nconflicts is 0. The plan borrows from the three trees; *out
 * is filled on success (cap_merge_plan_fini).
 *
 * Pure (no I/O): it can be called on any trees cap_tree_parse accepted,
 * ours may be the same tree as base (a host that did not change), and
 * whatever the trees and the pick, every plan holds, for each op (what
 * the fuzz target checks):
 *  - its path has no component ".git", is not at or below a directory
 *    shaped like a repository's (see ngit) in ours or theirs, and is not
 *    below the top when the top is so shaped: a repository is neither
 *    written nor removed;
 *  - its path's first component does not start with
 *    CAP_MERGE_STAGE_PREFIX, unless the op is a REMOVE of the host's;
 *  - a LINK's target stays in the tree (cap_tree_link_inside), a WRITE's
 *    and CHMOD's theirs is a FILE, a MKDIR's a DIR: no special file and
 *    no escaping link is ever made;
 *  - stage is below nwrites and each staged file is used once. */
int cap_merge_plan(const struct cap_tree *base, const struct cap_tree *ours,
		   const struct cap_tree *theirs, enum cap_merge_pick pick,
		   struct cap_merge_plan *out, struct cap_err *err);

/* The name of staged file i in the staging directory ("0", "1", ...). */
void cap_merge_stage_name(size_t i, char buf[24]);
/* The staging directory's name at the top of the host tree, for a sandbox
 * name (".capsule-merge.NAME"); scans skip it (skip_prefix
 * CAP_MERGE_STAGE_PREFIX). */
#define CAP_MERGE_STAGE_PREFIX ".capsule-merge."
/* Open (creating, 0700) the staging directory under dirfd, after removing
 * a stale one a killed merge left: only regular files named by
 * cap_merge_stage_name are removed from it, anything else is refused
 * (-EEXIST naming it), except the symbolic links "l0", "l1"... apply
 * makes there before renaming them into the tree. Returns an O_DIRECTORY
 * fd or -errno with err set.
 * cap_merge_stage_remove empties and removes it the same way. */
int cap_merge_stage_open(int dirfd, const char *name, struct cap_err *err);
int cap_merge_stage_remove(int dirfd, const char *name, struct cap_err *err);
/* Check a staged file against its op's entry: a regular file of theirs'
 * size and hash. -EBADMSG naming the path when it differs (the sandbox
 * changed it while the merge read it). */
int cap_merge_stage_verify(int stagefd, const struct cap_merge_op *op,
			   struct cap_err *err);

/* Run the plan beneath dirfd (the host tree), every WRITE's content taken
 * from its staged file in stagefd (verified, same file system). Every path
 * is opened component by component beneath dirfd with
 * RESOLVE_NO_SYMLINKS | RESOLVE_BENEATH, so a symbolic link planted on the
 * host is never followed (-ELOOP naming it, before anything is written:
 * the plan's paths are checked first). A file or link is put in place by
 * rename(2) from the staging directory (a link is made there first), so
 * a crash leaves each path either old or new; modes are theirs' & 0777
 * (never set-id). Before anything is written, every path an op changes
 * is looked at again: it must still be what the plan saw on the host
 * (ops[i].ours: type, permission bits, content or target; or absent), or
 * already what the plan puts there; a file edited on the host while the
 * merge fetched the sandbox's copies fails the merge with -EAGAIN naming
 * it, nothing written (merging again then sees it as changed on the
 * host). The directories touched are fsync'd at the end. Running
 * the plan again after a crash, or planning again from scratch, finishes
 * it: every op is idempotent (a WRITE whose staged file is gone is done
 * when the path holds theirs' content). The caller verifies the staged
 * files first (cap_merge_stage_verify); apply checks their type and size.
 * 0, or -errno with err naming the path (ops before it are done); -EINVAL
 * and nothing done for a plan with conflicts. */
int cap_merge_apply(int dirfd, int stagefd, const struct cap_merge_plan *p,
		    struct cap_err *err);

#endif
