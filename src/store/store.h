/* The store: guest artefacts in the cache. Today the kernel (built by
 * guest/build-kernel.sh) and the initramfs (packed here). */
#ifndef CAP_STORE_H
#define CAP_STORE_H

#include <stdbool.h>

#include "err.h"

/* Where the guest kernel is: $CAPSULE_KERNEL, else <cache>/vmlinux (a
 * link guest/build-kernel.sh keeps pointing at the newest build). Returns
 * a new string the caller frees; *exists tells whether the file is there. */
char *cap_store_kernel_path(bool *exists);

/* Where the agent binary is: $CAPSULE_AGENT, else capsule-agent next to
 * the capsule executable, else ../lib/capsule/capsule-agent from it (an
 * installed package). New string; *exists as above. */
char *cap_store_agent_path(bool *exists);

/* The script that builds the guest kernel into the cache (the kernel is
 * minutes of compiling, so it is never built silently): $CAPSULE_KERNEL_BUILDER,
 * else ../guest/build-kernel.sh from the capsule executable (a build tree),
 * else ../share/capsule/guest/build-kernel.sh (an installed package).
 * New string; *exists as above. */
char *cap_store_kernel_builder(bool *exists);

/* The initramfs for (agent, busybox): <cache>/initramfs/<key>.cpio where
 * key hashes both binaries and the layout version. Packs it when missing.
 * Same inputs give the same bytes. *out is a new string the caller frees;
 * *built (may be NULL) says whether it was packed now. */
int cap_store_initramfs(const char *agent, const char *busybox, char **out,
			bool *built, struct cap_err *err);

/* The path cap_store_initramfs would use, without packing. New string. */
int cap_store_initramfs_path(const char *agent, const char *busybox,
			     char **out, struct cap_err *err);

/* Write the initramfs cpio (newc, uncompressed) to path. Exposed for the
 * reproducibility test. */
int cap_store_initramfs_write(const char *agent, const char *busybox,
			      const char *path, struct cap_err *err);

#define CAP_BUSYBOX "/bin/busybox"

/* --- images: CAPSULE_HOME/images/<hex>/{rootfs.erofs, manifest.json} -- */

#include <stddef.h>
#include <stdint.h>

#include "proc.h"

struct cap_image {
	char digest[72];	/* "sha256:<64 hex>" of rootfs.erofs */
	char *owned_name;	/* NULL when the image has no name */
	char *owned_path;	/* .../rootfs.erofs */
	char *owned_source;	/* where it came from, for inspect */
	uint64_t size;	/* bytes of rootfs.erofs */
	int64_t created;	/* Unix time */
};
void cap_image_fini(struct cap_image *img);

/* An image name: 1 to 64 of [a-z0-9._-], starting with a letter or digit. */
bool cap_store_image_name_valid(const char *name);

/* Find an image by name or by "sha256:<hex>" (a unique prefix of at least
 * 12 hex digits is enough). -ENOENT with a message listing what to do. */
int cap_store_image_find(const char *ref, struct cap_image *out,
			 struct cap_err *err);

/* Hash rootfs.erofs and compare with the digest it is stored under;
 * -EBADMSG naming both digests when they differ. */
int cap_store_image_verify(const struct cap_image *img, struct cap_err *err);

/* All images, sorted by name then digest. *out is an array of n images the
 * caller frees with cap_image_fini on each and free. */
int cap_store_image_list(struct cap_image **out, size_t *n,
			 struct cap_err *err);

/* Turn a directory tree into an image (mkfs.erofs), store it under its
 * digest, record its manifest and, if name is not NULL, point the name at
 * it. source describes the origin for inspect. */
int cap_store_image_from_dir(const char *dir, const char *name,
			     const char *source, cap_progress_fn progress,
			     void *ud, struct cap_image *out,
			     struct cap_err *err);

/* Build a named image: "base" (busybox) or "python" (debootstrap minbase
 * with python3-minimal from the machine's Debian mirror; needs root). */
int cap_store_image_build(const char *which, cap_progress_fn progress,
			  void *ud, struct cap_image *out, struct cap_err *err);

/* cap_store_image_find, and when ref is "base" and it is not there yet,
 * build it first (busybox, about a second), saying so through progress:
 * a fresh install needs no step before its first sandbox. Other images
 * are not built here (python needs root and the mirror): their -ENOENT
 * says how to get them. */
int cap_store_image_ensure(const char *ref, cap_progress_fn progress, void *ud,
			   struct cap_image *out, struct cap_err *err);

/* Import a directory, a tar archive (plain, gzip, zstd, ...), an OCI image
 * layout (directory or tar) or a `docker save` archive, applying layer
 * whiteouts. name may be NULL. */
int cap_store_image_import(const char *path, const char *name,
			   cap_progress_fn progress, void *ud,
			   struct cap_image *out, struct cap_err *err);

/* Callback telling whether an image digest is used by a sandbox. */
typedef bool (*cap_image_in_use_fn)(void *ud, const char *digest);

/* Remove an image (and names pointing at it). -EBUSY when in_use says a
 * sandbox uses it. */
int cap_store_image_remove(const char *ref, cap_image_in_use_fn in_use,
			   void *ud, struct cap_err *err);

/* Remove every image no sandbox uses; *removed counts them. */
int cap_store_image_prune(cap_image_in_use_fn in_use, void *ud,
			  size_t *removed, struct cap_err *err);

/* Apply one image layer (a tar stream libarchive can read) onto root:
 * whiteouts (.wh.NAME, .wh..wh..opq) first, then the entries. Exposed for
 * the import test. */
int cap_store_apply_layer(const char *root, const char *layer,
			  struct cap_err *err);

/* --- public data projections ------------------------------------------ */

/* Caps on a projected tree; every number is a setting. */
struct cap_projection_limits {
	uint64_t max_bytes;	/* file data, default 512 MiB */
	uint64_t max_entries;	/* files and directories, default 100000 */
};

/* Defaults, overridden by CAPSULE_SOURCE_MAX_BYTES / _MAX_ENTRIES. -EINVAL
 * (err names the variable) for a value that is not a number. */
int cap_projection_limits_init(struct cap_projection_limits *l,
			       struct cap_err *err);

/* The shape of a tree the erofs image builder (mkfs.erofs 1.5, Debian 12)
 * takes, measured: it cuts names to 254 bytes (a 255-byte name then fails
 * with "No such file or directory"); it aborts ("buffer overflow
 * detected") on a staged file whose real path is over 4095 bytes; it
 * recurses with about 4.3 KiB of stack per level (a segfault at ~1960
 * levels with 8 MiB of stack, ~470 with 2 MiB), and the copy holds two
 * descriptors per level. A path of at most 3072 bytes leaves 1022 for the
 * staging directory and keeps /source/PATH within PATH_MAX in the guest. */
#define CAP_PROJECTION_NAME_MAX 254	/* bytes of one name */
#define CAP_PROJECTION_PATH_MAX 3072	/* bytes of a path below the tree's top */
#define CAP_PROJECTION_DEPTH_MAX 128	/* names in a path */
#define CAP_PROJECTION_BUILD_PATH_MAX 4095	/* staging directory + "/" + path */

struct cap_projection_info {
	char fingerprint[65];	/* SHA-256 over every entry's path and metadata */
	uint64_t entries;
	uint64_t bytes;
};

/* Walk and validate the tree at dir without reading file contents: the
 * cheap check done before each call. Entries named node_modules (any
 * case) are skipped and never entered. Each entry, in walk order, is
 * checked first against the shape limits above (-ENAMETOOLONG, err naming
 * the path, shortened when long, the measure and the limit), then against
 * the rules: symlinks, hard-linked files, devices, FIFOs, sockets and
 * nested mount points fail with -EPERM, err naming the path and the rule.
 * A cap exceeded fails with -EFBIG naming the cap and the measured size.
 * A tree the scan passes builds, given a staging directory whose real
 * path is within 4095 - 1 - CAP_PROJECTION_PATH_MAX bytes. */
int cap_projection_scan(const char *dir, const struct cap_projection_limits *l,
			struct cap_projection_info *out, struct cap_err *err);

/* Validate, then copy the tree into a private staging directory next to
 * path (every entry opened relative to its already-opened parent with
 * O_NOFOLLOW, its fstat checked against what was validated), then make an
 * erofs image at path, mode 0600 (written to a temporary name and
 * renamed). -ESTALE when the tree changed under the copy; -ENAMETOOLONG
 * when the staging directory's real path and the tree's longest path are
 * more than CAP_PROJECTION_BUILD_PATH_MAX bytes together. */
int cap_projection_build(const char *dir, const struct cap_projection_limits *l,
			 const char *path, struct cap_projection_info *out,
			 struct cap_err *err);

#endif
