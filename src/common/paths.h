/* Where capsule keeps things: the cache (kernels, initramfs) and short
 * private directories for sockets; and which host paths a transfer may
 * name (the --transfer-dir rules). */
#ifndef CAP_PATHS_H
#define CAP_PATHS_H

#include <stdbool.h>
#include <stddef.h>

#include "err.h"

/* $CAPSULE_CACHE, else ${XDG_CACHE_HOME:-$HOME/.cache}/capsule. Returns a
 * new string the caller frees. The directory is not created. */
char *cap_cache_dir(void);

/* $CAPSULE_HOME, else ${XDG_DATA_HOME:-$HOME/.local/share}/capsule: images,
 * sandboxes, records. New string; not created. */
char *cap_home_dir(void);

/* Write data to path atomically: a temporary file in the same directory,
 * fsync, rename, fsync of the directory. 0 or -errno. */
int cap_write_file_atomic(const char *path, const void *data, size_t len,
			  unsigned mode);

/* Remove path and everything under it without following symlinks. 0 or
 * -errno (ENOENT is success). */
int cap_remove_tree(const char *path);
/* Remove everything inside the directory path, keeping it. */
int cap_clear_dir(const char *path);
/* The same for name relative to the directory dfd. */
int cap_remove_at(int dfd, const char *name);

/* cap_mkdir_p is in util.h (the guest agent uses it too). */

/* Create a new private (0700) directory for one VM's sockets and logs,
 * short enough for unix socket paths (sun_path is 108 bytes): under
 * $XDG_RUNTIME_DIR when that is a directory we own, else under /tmp.
 * *out is a new string the caller frees. */
int cap_make_run_dir(char **out, struct cap_err *err);
/* A private temporary directory (0700) named PREFIX-XXXXXX under $TMPDIR
 * (when absolute) or /tmp, for files on their way in or out of a guest.
 * A new string (cap_remove_tree it, then free it), or NULL with err set. */
char *cap_make_tmpdir(const char *prefix, struct cap_err *err);

/* Remove a run directory made by cap_make_run_dir and the plain files
 * and sockets in it (not recursive beyond one level). */
void cap_remove_run_dir(const char *dir);

/* Directory of the running executable (from /proc/self/exe); new string. */
char *cap_exe_dir(void);

/* --- transfer directories ------------------------------------------------------- */

/* Resolve the directories given with --transfer-dir (realpath: each must
 * exist and be a directory). *out is a new NULL-terminated array of new
 * strings (cap_transfer_dirs_free). -errno with err naming the one
 * at fault. */
int cap_transfer_dirs_resolve(const char *const *dirs, size_t n, char ***out,
			      struct cap_err *err);
void cap_transfer_dirs_free(char **dirs);

/* A directory setting (what names it in messages: "--workspace"),
 * resolved with realpath; it must exist and be a directory. *out is a
 * new string. -errno with err naming it. */
int cap_resolve_dir(const char *what, const char *path, char **out, struct cap_err *err);

/* Whether path (absolute, resolved) is dir or beneath it (dir absolute,
 * resolved, without a trailing '/' unless it is "/"). Pure. */
bool cap_path_within(const char *dir, const char *path);

/* A host path an upload copies from: it must exist and resolve (every
 * symbolic link followed) inside one of dirs. *out: the resolved path, a
 * new string. -EACCES naming the path and the directories when it is
 * outside (or there are none), -errno when it cannot be resolved. */
int cap_transfer_source(const char *const *dirs, size_t n, const char *path,
			char **out, struct cap_err *err);
/* A host path a download writes to: it must not exist, and its parent
 * must resolve inside one of dirs; its last component must be a name
 * (not "." or ".."). *out: the resolved parent joined with that name, a
 * new string. -EEXIST, -EACCES, -errno with err set. */
int cap_transfer_dest(const char *const *dirs, size_t n, const char *path,
		      char **out, struct cap_err *err);

#endif
