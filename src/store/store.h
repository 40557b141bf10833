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

/* One pull whose bytes gave an image (several references may give the
 * same erofs bytes); stored in the manifest's "origins". */
struct cap_image_origin {
	char *owned_reference;	/* normalized, as pulled */
	char *owned_oci_digest;	/* the platform's OCI manifest skopeo wrote */
	char *owned_registry_digest;	/* what the registry served for the reference (manifest or index) */
	char *owned_pinned_digest;	/* the digest the reference named, when not oci_digest; or NULL */
	/* the registry's manifest for the platform pulled: registry_digest
	 * itself, or the manifest an index named for the platform; NULL for
	 * pulls by a capsule that did not record it */
	char *owned_platform_digest;
	char *owned_platform;	/* "os/arch[/variant]" pulled for; NULL: not recorded (linux/amd64) */
	int64_t pulled;	/* Unix time of the last pull as this reference */
	bool current;	/* the reference's link still points at this image */
};

struct cap_image {
	char digest[72];	/* "sha256:<64 hex>" of rootfs.erofs */
	char *owned_name;	/* NULL when the image has no name */
	char *owned_path;	/* .../rootfs.erofs */
	char *owned_source;	/* where it came from, for inspect */
	uint64_t size;	/* bytes of rootfs.erofs */
	int64_t created;	/* Unix time */
	/* Pulled images (NULL otherwise): the normalized reference the
	 * image still answers to (NULL once that reference moved to other
	 * bytes), the digest of the OCI manifest it was made from, and the
	 * digest the pulled reference pinned when that was another one (an
	 * index, or a Docker manifest skopeo converted). */
	char *owned_reference;
	char *owned_oci_digest;
	char *owned_pinned_digest;
	char *owned_registry_digest;
	/* Those four are of one origin: the one looked up (by reference or
	 * REPO@digest), else a current one (a tag before a digest, the
	 * latest), else the latest. Every origin, oldest first: */
	struct cap_image_origin *owned_origins;
	size_t n_origins;
};
void cap_image_fini(struct cap_image *img);

/* A registry reference, normalized as Docker does: "python:3.12-slim" is
 * docker.io/library/python:3.12-slim, "org/img" docker.io/org/img:latest,
 * a first component with '.' or ':' or "localhost" is a registry host. */
struct cap_image_ref {
	char *owned_repo;	/* "HOST/PATH" */
	char *owned_tag;	/* NULL with a digest and no tag */
	char *owned_digest;	/* "sha256:<64 hex>" or NULL */
	char *owned_full;	/* repo[:tag][@digest], what the image answers to */
	char *owned_host;	/* HOST of repo, without a port */
};
void cap_image_ref_fini(struct cap_image_ref *ref);

/* Parse a reference (at most 255 bytes, and at most 255 once stored as a
 * link name, '/' written %2F). The host is DNS labels or an IPv4 address,
 * with an optional :port, lowercased ("LOCALHOST" is localhost); IPv6
 * literals are refused (skopeo cannot pull from them). -EINVAL with err
 * saying what is wrong; *out written only on success. */
int cap_store_ref_parse(const char *ref, struct cap_image_ref *out,
			struct cap_err *err);

/* Is host a loopback address (localhost, 127.0.0.0/8)? Those
 * registries are spoken to over HTTP without TLS verification. */
bool cap_store_ref_loopback(const char *host);

/* What an import left out of the tree: device nodes (character, block),
 * FIFOs and sockets. A root file system gets its devices from the
 * guest's devtmpfs; a device node in an image would give whoever can
 * open it the host kernel's view of that device class in the guest. */
struct cap_import_report {
	size_t dropped;
	char shown[200];	/* the first few paths, ", "-separated, "..." after */
};

/* How an import describes its image; every field may be NULL. */
struct cap_import_opts {
	const char *name;	/* point this name at the image */
	const char *source;	/* for inspect; NULL: said from the path */
	const char *reference;	/* normalized reference: point it at the image */
	const char *oci_digest;	/* recorded in the manifest (an origin) */
	const char *registry_digest;
	const char *pinned_digest;
	const char *platform_digest;
	const char *platform;	/* "os/arch[/variant]" of a pull */
	cap_progress_fn progress;
	void *ud;
};

/* An image name: 1 to 64 of [a-z0-9._-], starting with a letter or digit. */
bool cap_store_image_name_valid(const char *name);

/* Find an image by name, by "sha256:<hex>" (a unique prefix of at least
 * 12 hex digits is enough), by the reference it was pulled as
 * (normalized first: "py:1" finds docker.io/library/py:1) or by
 * REPO@sha256:<hex>, a registry, OCI manifest or pinned digest of one of
 * its origins pulled from REPO; "name:NAME" is the name only. A valid
 * name that is also a pulled reference of another image is refused
 * (-EINVAL naming both and how to pick). -ENOENT with a message listing
 * what to do. */
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
 * it. source describes the origin for inspect. Device nodes, FIFOs and
 * sockets in the tree are left out (said through progress). */
int cap_store_image_from_dir(const char *dir, const char *name,
			     const char *source, cap_progress_fn progress,
			     void *ud, struct cap_image *out,
			     struct cap_err *err);

/* The same with every option; o->reference is pointed at the image,
 * moved from any other, then the origin fields of o are added to the
 * manifest's origins (replacing the one of the same reference; also
 * when the same bytes were stored before). report may be NULL. */
int cap_store_image_from_tree(const char *dir, const struct cap_import_opts *o,
			      struct cap_image *out,
			      struct cap_import_report *report,
			      struct cap_err *err);

/* A container's root directory (an OCI bundle's rootfs) as an image,
 * cached by content: a fingerprint keys CAPSULE_HOME/images/rootfs/<fp>,
 * a link to the image's digest. For an overlay mount point (an engine's
 * container rootfs) it covers the lower layers by identity (real path,
 * device, inode, birth time), the mount options that change the merge
 * and the upper directory by content; for any other tree (or an overlay
 * whose layers cannot all be named) the whole tree by content: every
 * entry's path, type, mode, owner, device number, file bytes, link
 * target and extended attributes, never times. Nothing under the paths
 * in skip[0..nskip) (absolute in the container: mount points the runtime
 * fills, e.g. /etc/hosts, whose files an engine makes fresh for each
 * container) is keyed. A hit whose image is still in the store at its
 * recorded size is returned; otherwise the whole tree (what skip names
 * included, as the tree holds it) is imported as
 * cap_store_image_from_tree does, and the link written. *cached says
 * which happened. The image has no name; its source says "container
 * rootfs DIR". */
int cap_store_image_from_rootfs(const char *dir, const char *const *skip,
				size_t nskip, cap_progress_fn progress, void *ud,
				struct cap_image *out, bool *cached,
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

/* cap_store_image_import with every option; report (may be NULL) says
 * what was left out. */
int cap_store_image_import_with(const char *path,
				const struct cap_import_opts *o,
				struct cap_image *out,
				struct cap_import_report *report,
				struct cap_err *err);

struct cap_pull_opts {
	const char *name;	/* may be NULL */
	const char *platform;	/* "OS/ARCH[/VARIANT]"; NULL: linux/amd64 */
	bool insecure;	/* plain HTTP, no TLS verification, for any host */
	unsigned timeout_s;	/* the whole copy; 0: 1800 */
	cap_progress_fn progress;	/* skopeo's lines, then the import's */
	void *ud;
};

/* Pull ref from its registry with skopeo (its resolver, its auth files
 * and its digest checks) into a private directory under CAPSULE_HOME:
 * a tag is resolved first (`skopeo inspect --raw`), the digest of the
 * registry's bytes is what is copied, so the copy is what was resolved.
 * Import that OCI layout and record the reference, the registry digest
 * and the OCI manifest digest as an origin in the image's manifest. Registries on loopback hosts are spoken
 * to over HTTP. Errors carry skopeo's reason, cut to its last lines, and
 * what to do; -EBADMSG when the registry's bytes do not match a pinned
 * digest. report may be NULL. */
int cap_store_image_pull(const char *ref, const struct cap_pull_opts *o,
			 struct cap_image *out, struct cap_import_report *report,
			 struct cap_err *err);

/* --- a registry's documents (store-registry.c: pure decoders) ------------- */

#define CAP_REG_DOC_MAX (4 << 20)	/* bytes of a manifest, index or config (skopeo's limit) */
#define CAP_REG_LAYERS_MAX 1000
#define CAP_REG_ENTRIES_MAX 1000
#define CAP_REG_STRINGS_MAX 10000	/* of Entrypoint, Cmd, Env each */

struct cap_reg_layer {
	char digest[72];
	char *owned_media_type;
	uint64_t size;	/* compressed, as the manifest says */
};

/* An entry of an index: a manifest for a platform. */
struct cap_reg_entry {
	char digest[72];
	char *owned_media_type;
	uint64_t size;
	char *owned_os, *owned_arch, *owned_variant;	/* NULL when not said */
};

/* An image manifest (index false: config and layers) or an index (OCI
 * image index, Docker manifest list: entries). */
struct cap_reg_manifest {
	bool index;
	char *owned_media_type;	/* the document's, or the one its fields imply */
	char config_digest[72];
	uint64_t config_size;
	char *owned_config_media_type;
	struct cap_reg_layer *owned_layers;
	size_t n_layers;
	uint64_t layers_size;	/* the sum of the layers' sizes */
	struct cap_reg_entry *owned_entries;
	size_t n_entries;
};

/* Decode a manifest or an index (at most CAP_REG_DOC_MAX bytes, JSON,
 * schemaVersion 2, every descriptor with a media type, a sha256 digest
 * and a size of 0 to 2^53; at most CAP_REG_LAYERS_MAX layers or
 * CAP_REG_ENTRIES_MAX entries). A media type other than OCI's and
 * Docker v2 schema 2's manifest and index is -EMEDIUMTYPE naming it;
 * other faults -EBADMSG or -E2BIG naming the field. *out (freed with
 * cap_reg_manifest_fini) is written only on success. */
int cap_reg_manifest_parse(const void *data, size_t len, struct cap_reg_manifest *out,
			   struct cap_err *err);
void cap_reg_manifest_fini(struct cap_reg_manifest *m);
/* An image manifest's config and layer media types are a container
 * image's (not an artifact's): 0 or -EMEDIUMTYPE naming the one. */
int cap_reg_manifest_media_ok(const struct cap_reg_manifest *m, struct cap_err *err);
/* The entry of index m for os/arch (and variant when not NULL or ""):
 * the first image manifest listed for it. -ENOEXEC naming the
 * platforms the index offers when none is. */
int cap_reg_index_pick(const struct cap_reg_manifest *m, const char *os, const char *arch,
		       const char *variant, size_t *which, struct cap_err *err);

/* What an image config says that a check reports. */
struct cap_reg_config {
	char *owned_os, *owned_arch, *owned_variant;	/* variant may be NULL */
	bool has_entrypoint, has_cmd, has_env;	/* false: absent or null */
	char **owned_entrypoint, **owned_cmd, **owned_env;
	size_t n_entrypoint, n_cmd, n_env;
	char *owned_workdir, *owned_user;	/* NULL when absent or "" */
	size_t n_diff_ids;	/* rootfs.diff_ids: one per layer */
};

/* Decode an image config (at most CAP_REG_DOC_MAX bytes): os and
 * architecture required, config.Entrypoint, Cmd and Env arrays of
 * strings or null, rootfs.diff_ids an array. -EBADMSG or -E2BIG naming
 * the field; *out (cap_reg_config_fini) written only on success. */
int cap_reg_config_parse(const void *data, size_t len, struct cap_reg_config *out,
			 struct cap_err *err);
void cap_reg_config_fini(struct cap_reg_config *c);

/* --- checking references against their registry (store-check.c) ------ */

#define CAP_CHECK_TIMEOUT_S 10

struct cap_check_opts {
	const char *platform;	/* "OS/ARCH[/VARIANT]"; NULL: linux/amd64 */
	bool insecure;	/* as cap_pull_opts */
	unsigned timeout_s;	/* the whole check; 0: CAP_CHECK_TIMEOUT_S */
	int64_t deadline_ms;	/* cap_monotonic_ms() to end by; 0: from timeout_s */
};

/* What a registry says of a reference, without a layer downloaded. */
struct cap_image_check {
	char *owned_reference;	/* normalized */
	char registry_digest[72];	/* of what the reference names: a manifest or an index */
	char *owned_registry_media_type;
	bool index;	/* the reference names an index */
	size_t n_platforms;	/* an index's entries */
	char **owned_platforms;	/* each "os/arch[/variant]" (or "?"), in its order */
	char platform_digest[72];	/* the platform's manifest (registry_digest when no index) */
	char platform[100];	/* "os/arch[/variant]" asked for */
	struct cap_reg_manifest manifest;	/* the platform's */
	char config_digest[72];
	struct cap_reg_config config;
};
void cap_image_check_fini(struct cap_image_check *c);

/* Resolve ref with skopeo (`inspect --raw`), fetch the platform's
 * manifest (through an index: the one for the platform, by digest) and
 * its config (`inspect --raw --config`), each checked against its
 * digest and decoded; no layer is fetched. Within the timeout: skopeo
 * gets the time left and is killed at the end of it. -EINVAL a
 * malformed reference or platform; -ENOENT no such repository, tag or
 * digest; -EHOSTUNREACH unreachable; -ETIMEDOUT no answer in time;
 * -EACCES credentials wanted; -EMEDIUMTYPE a media type capsule does
 * not take (named); -ENOEXEC no manifest for the platform (the
 * platforms offered named), or a config for another; -EBADMSG bytes
 * that do not decode or match their digest. err names the reference
 * and what to do. *out written only on success. */
int cap_store_image_check(const char *ref, const struct cap_check_opts *o,
			  struct cap_image_check *out, struct cap_err *err);

/* A word for the kind of failure -errno of cap_store_image_check is,
 * for programs: "offline" (unreachable), "timeout", "auth", "not_found",
 * "media_type", "platform", "bad_reference", "invalid" (bytes), or
 * "error". Static. */
const char *cap_store_check_reason(int r);

enum cap_outdated_state { CAP_OUTDATED_UP_TO_DATE, CAP_OUTDATED_OUTDATED, CAP_OUTDATED_UNKNOWN };

/* One pulled tag of an image, compared with its registry. */
struct cap_outdated {
	char image[72];	/* erofs digest */
	char *owned_name;	/* the image's name, or NULL */
	char *owned_reference;	/* the tag as pulled */
	enum cap_outdated_state state;
	char *owned_recorded;	/* the platform digest recorded at pull, or NULL */
	char *owned_current;	/* the registry's now, or NULL when unknown */
	const char *reason;	/* UNKNOWN: cap_store_check_reason's word, or "not_recorded" */
	char *owned_message;	/* UNKNOWN: what happened, for people */
	char *owned_platform;	/* pulled for (compared for); NULL: linux/amd64 */
};
void cap_outdated_fini(struct cap_outdated *o);

/* For every tag (a reference without a digest) that still points at a
 * pulled image, or only image's when image is not NULL (found as
 * cap_store_image_find finds it; -ENOENT, -EINVAL as it), compare the
 * platform manifest digest recorded at pull with the registry's for that
 * tag and the platform pulled for (o->platform is not used) now: the checks run side by side and all end by one deadline (now
 * plus o->timeout_s), so an offline host answers UNKNOWN within the
 * timeout however many tags there are. A re-push of the same manifest
 * under another index is not outdated. *out is an array of n the caller
 * frees with cap_outdated_fini on each and free. */
int cap_store_image_outdated(const char *image, const struct cap_check_opts *o,
			     struct cap_outdated **out, size_t *n, struct cap_err *err);

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
			  struct cap_import_report *report,
			  struct cap_err *err);

/* Add path to what an import left out (report may be NULL). */
void cap_import_report_add(struct cap_import_report *report, const char *path);
/* "dropped N device nodes, FIFOs or sockets: PATHS" (singular for one):
 * the one wording of what an import left out. New string. */
char *cap_import_report_summary(const struct cap_import_report *report);

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
