/* What the streaming FILE operations' files share (agent-xfer.c: output,
 * paths, the tree walk, MANIFEST and the operation; agent-xfer-tar.c:
 * TAR_OUT and TAR_IN). Private to them; the agent sees agent.h. */
#ifndef CAP_AGENT_XFER_H
#define CAP_AGENT_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "buf.h"

#define CHUNK (64 * 1024)
/* Manifest bounds, as src/tree/tree.h's parser takes them. */
#define MAX_ENTRIES 1000000u
#define MAX_PATH 4096u
#define MAX_DEPTH 256u

/* What the operation is working on, for messages; set once. */
struct xfer {
	const char *root;	/* a FILE root (layout.h) */
	char shown[MAX_PATH + 32];	/* root/path, the path messages start from */
	int status;	/* 0, or 1 once something was refused or failed */
	struct cap_buf out;	/* STDOUT, flushed at CHUNK */
	bool prefix;	/* TAR_OUT with CAP_TAR_PREFIX: files cut to their start */
};
extern struct xfer X;

/* A path refused or failed: named, the rest goes on, exit 1 at the end. */
#define refuse(rel, ...) (say(rel, __VA_ARGS__), X.status = 1)

/* --- output (agent-xfer.c) --- */

void escape(struct cap_buf *b, const char *s);
__attribute__((format(printf, 2, 3))) void say(const char *rel, const char *fmt, ...);
void flush(void);
void put(const void *p, size_t n);
extern void (*at_give_up)(void);
__attribute__((noreturn, format(printf, 2, 3))) void give_up(const char *rel, const char *fmt, ...);

/* --- paths (agent-xfer.c) --- */

int openat2_fd(int dirfd, const char *path, int flags, uint64_t resolve);
int open_dir_below(int dirfd, const char *rel);
const char *why_open(int e);
int norm_path(const char *in, char *out, size_t outlen);
const char *split_last(const char *rel, char *dir, size_t dlen);

/* --- the tree walk (agent-xfer.c) --- */

/* The walker's callbacks. visit is called for every entry below the top
 * with its directory's fd, its name, its path relative to the top and its
 * lstat; it returns true to descend into a directory. fail is told of
 * what could not be walked. */
struct walker {
	bool (*visit)(void *ud, int dirfd, const char *name, const char *rel, const struct stat *st);
	void (*fail)(void *ud, const char *rel, const char *why);
	void *ud;
};
void walk(int topfd, const struct walker *w);
/* A walker's fail that refuses the path. */
void walk_fail(void *ud, const char *rel, const char *why);

/* --- files (agent-xfer.c, MANIFEST) --- */

int open_file_at(int dirfd, const char *name, const struct stat *st);
char *read_link(int dirfd, const char *name);

/* --- TAR_OUT, TAR_IN (agent-xfer-tar.c) --- */

void tar_out_tree(int rootfd, const char *path);
void tar_out_paths(int topfd);
/* owners: CAP_TAR_OWNERS (the entries' uid, gid and set-id bits; hard
 * links), run as root. */
void tar_in(int topfd, bool no_replace, bool owners);

#endif
