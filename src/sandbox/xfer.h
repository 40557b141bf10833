/* Files in and out of a running sandbox (docs/workspace.md), streamed over
 * the agent channel as tar (docs/protocol.md, FILE TAR_IN / TAR_OUT /
 * MANIFEST): libarchive writes the stream from a host tree and reads the
 * guest's into one, with image import's safety flags. Binary-safe, any
 * size (flow-controlled: the host never holds more than a few frames).
 *
 * Every call blocks until the transfer ends, driving sb's agent channel
 * itself (cap_sandbox_pollfds/dispatch): the caller must not have other
 * streams of sb waiting on it. A caller with its own event loop (the
 * controller) runs them on a connection of its own to the sandbox's shim
 * (cap_sandbox_attach), in a thread. Nothing prints. */
#ifndef CAP_XFER_H
#define CAP_XFER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "err.h"
#include "sandbox.h"
#include "tree.h"

/* Flags of cap_xfer_put and cap_xfer_get. */
#define CAP_XFER_RECURSIVE 0x1u	/* a directory with everything below it */
/* put: a path that exists in the guest with other content is kept and
 * listed in the result's conflicts (TAR_IN's CAP_TAR_NO_REPLACE). */
#define CAP_XFER_NO_REPLACE 0x2u
/* put: refuse every symbolic link and special file in the host tree,
 * each named in the result's refused list, and copy the rest (private
 * import). Without it, links that stay inside the tree are copied and
 * others refuse the whole put before anything is sent. */
#define CAP_XFER_NO_LINKS 0x4u
/* put: the guest reports the end without flushing what it wrote
 * (TAR_IN's CAP_FILE_NO_SYNC): not durable until something else flushes
 * it (docs/cli.md, "Durable results"). */
#define CAP_XFER_NO_SYNC 0x8u
/* put: a container's root into CAP_GUEST_CONTAINERS (TAR_IN's
 * CAP_TAR_OWNERS): every entry keeps its owner and all of its mode
 * bits, every symbolic link is copied as it is (it is resolved in the
 * container's root, never on the host or in the VM's), hard links stay
 * links, and what cannot be copied (devices, FIFOs, sockets) is listed
 * in refused without failing the put. */
#define CAP_XFER_OWNERS 0x10u

struct cap_xfer_result {
	uint64_t files, dirs, links, bytes;	/* what was written */
	char **conflicts;	/* NO_REPLACE: guest paths kept as they were */
	size_t nconflicts;
	/* Paths not copied, each "PATH: why" (a link leaving the tree, a
	 * special file, what the guest refused); the call still fails with
	 * -EPERM when any (after copying the rest) unless it is put with
	 * NO_LINKS, where refusals are expected and reported only. */
	char **refused;
	size_t nrefused;
	/* put: what the guest wrote is on the host's disk files (it
	 * flushed them before it reported the end: CAP_EXIT_DURABLE), and
	 * how long that flush took. false with CAP_XFER_NO_SYNC, or from a
	 * guest that does not flush. */
	bool durable;
	uint32_t sync_ms;
};
void cap_xfer_result_fini(struct cap_xfer_result *r);

/* What is at root/path in the guest: 'd', 'f', 'l', 'o', or '-' when
 * nothing is there (0), or -errno with err set (outside the root...).
 * root is a FILE root of the guest's layout (layout.h). Asked with FILE
 * READ of 0 bytes and 0 entries, which resolves the path as FILE does: a
 * symbolic link that stays inside the root answers for what it leads to
 * (so 'l' is not given), one that leaves it is -EXDEV, a dangling one
 * '-'. */
int cap_xfer_kind(struct cap_sandbox *sb, const char *root, const char *path,
		  char *kind, struct cap_err *err);

/* Copy the host path src into the guest: the entries are named
 * dest_name, dest_name/... beneath root/dest_dir (which must exist and be
 * a directory), or, with dest_name "", src must be a directory and its
 * contents go directly beneath root/dest_dir. A directory src needs
 * CAP_XFER_RECURSIVE (-EISDIR otherwise). Modes are kept; the guest's
 * tool user owns what is written. 0, -EPERM when some paths were
 * refused (listed in res), other -errno with err naming the path. */
int cap_xfer_put(struct cap_sandbox *sb, const char *src, const char *root,
		 const char *dest_dir, const char *dest_name, unsigned flags,
		 struct cap_xfer_result *res, struct cap_err *err);

/* Copy root/path out of the guest to the host path dest, like cp: when
 * dest is an existing directory the copy goes inside it under the path's
 * last component, otherwise it is created as dest (its parent must
 * exist). A directory needs CAP_XFER_RECURSIVE. Extraction is libarchive's
 * with ARCHIVE_EXTRACT_SECURE_NODOTDOT, _SECURE_SYMLINKS and
 * _SECURE_NOABSOLUTEPATHS, never as another owner; a symbolic link whose
 * target leaves the copied tree is refused (listed in res, -EPERM after
 * the rest). */
int cap_xfer_get(struct cap_sandbox *sb, const char *root, const char *path,
		 const char *dest, unsigned flags, struct cap_xfer_result *res,
		 struct cap_err *err);

/* The manifest of root/path (path "" for the whole root), parsed and
 * checked (cap_tree_parse). */
int cap_xfer_manifest(struct cap_sandbox *sb, const char *root, const char *path,
		      struct cap_tree *out, struct cap_err *err);

/* What a fetch keeps free on its destination's file system by default. */
#define CAP_XFER_KEEP_FREE (256ull << 20)

/* What bounds a fetch. */
struct cap_xfer_fetch_opts {
	const char *where;	/* the destination directory, for messages */
	/* Each file cut to its first CAP_TAR_PREFIX_BYTES (CAP_TAR_PREFIX):
	 * enough to call it binary; sizes still give the whole sizes. */
	bool prefix;
	/* Most bytes the staged copies may take on disk in all (0: only the
	 * free space bounds them). */
	uint64_t max_bytes;
	/* Bytes to leave free on the destination's file system (0:
	 * CAP_XFER_KEEP_FREE). */
	uint64_t keep_free;
};

/* Fetch regular files root/paths[i] into dirfd as files named
 * cap_merge_stage_name(i) (mode 0600, created or replaced, fsync'd). A
 * path that is not a regular file in the guest any more, or (with sizes)
 * whose size is not sizes[i] (what its manifest said; with o->prefix, its
 * first CAP_TAR_PREFIX_BYTES), fails with -ESTALE naming it before any of
 * its bytes is written: a guest cannot make the host store more than the
 * manifest it sent. Holes stay holes: the guest sends a file's holes as
 * such (src/proto/tar.h, sparse) and every page of zeros is left a hole,
 * so what the copies take is their data. That is bounded by o: the free
 * space of dirfd's file system when the fetch starts, less o->keep_free,
 * and o->max_bytes; a file that would take more fails the fetch with
 * -ENOSPC naming it, the bound and what to do. */
int cap_xfer_fetch(struct cap_sandbox *sb, const char *root,
		   const char *const *paths, const uint64_t *sizes, size_t n,
		   int dirfd, const struct cap_xfer_fetch_opts *o, struct cap_err *err);

#endif
