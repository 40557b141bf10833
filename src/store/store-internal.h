/* Shared inside src/store only. */
#ifndef CAP_STORE_INTERNAL_H
#define CAP_STORE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "err.h"

/* busybox --list-full output in a new NUL-terminated string. */
int cap_store_busybox_applets(const char *busybox, char **out,
			      struct cap_err *err);

/* /etc/passwd and /etc/group of the busybox roots (initramfs, base). */
extern const char cap_store_passwd[];
extern const char cap_store_group[];

/* The path of blob digest ("sha256:<64 hex>") in the OCI layout dir,
 * its bytes checked against the digest: a new string, or NULL with err
 * set (-EINVAL malformed digest, ENOENT missing, EBADMSG not matching). */
char *cap_store_oci_blob(const char *dir, const char *digest, struct cap_err *err);

/* CAPSULE_HOME/images, new string. */
char *cap_store_images_dir(void);

/* Make a private temporary directory images/<prefix>-XXXXXX (prefix
 * starts with "tmp-") holding a lock file, .lock, flocked for as long as
 * the returned descriptor is open: the caller closes it after removing
 * (or renaming) the directory. Sweeps first (cap_store_tmp_sweep). *path
 * is a new string. The descriptor (>= 0), or -errno with err set. */
int cap_store_tmpdir(const char *images, const char *prefix, char **path,
		     struct cap_err *err);

/* Remove the images/tmp-* directories nobody works in: whose .lock is
 * not flocked (the process that made it died: killed, SIGINT), or that
 * have no .lock and are over a minute old (made before locks were). */
void cap_store_tmp_sweep(const char *images);

/* The store's links (images/names, images/refs, images/rootfs): a
 * symbolic link ../<hex> in dir. _set replaces link atomically (readers
 * see the old link or the new), creating dir; -errno. _hex reads the hex
 * digest a link points at; false when it is missing or not one. */
int cap_store_link_set(const char *dir, const char *link, const char *hex);
bool cap_store_link_hex(const char *link, char hex[65]);

struct cap_projection_limits;
struct cap_projection_info;
/* cap_projection_build with a call between validation and copy, so that
 * tests can change the tree exactly there. */
int cap_projection_build_hook(const char *dir,
			      const struct cap_projection_limits *l,
			      const char *path, struct cap_projection_info *out,
			      void (*after_scan)(void *ud), void *ud,
			      struct cap_err *err);

/* What an image's JSON leads to, for tests/fuzz/fuzz-image.c (the
 * readers of import and pull, store-layers.c and store-pull.c):
 * the layers of an unpacked OCI layout (index.json, through an index or
 * not, to a manifest) or `docker save` directory (manifest.json), each a
 * new path of a file inside dir (an OCI blob checked against its
 * digest); *layers is allocated (n entries, some NULL after a failure:
 * free each and it) whenever *n is set. And the digest of the image
 * manifest of a layout skopeo wrote, its config checked to be for os and
 * arch (*out new). 0 or -errno with err set. */
int cap_store_oci_layers(const char *dir, char ***layers, size_t *n, struct cap_err *err);
int cap_store_docker_layers(const char *dir, char ***layers, size_t *n, struct cap_err *err);
int cap_store_layout_manifest(const char *layout, const char *os, const char *arch, char **out,
			      struct cap_err *err);

/* skopeo inspect --raw (with config, --config) of src ("docker://...")
 * for the reference pr: its stdout into out (at most CAP_REG_DOC_MAX
 * bytes: more is -E2BIG). plain: --tls-verify=false. skopeo gets
 * timeout_s, or with deadline_ms (cap_monotonic_ms) the time left, and
 * is killed just after it. A failure is -errno with err "WHAT: what to
 * do" and skopeo's last lines (-ETIMEDOUT, -EHOSTUNREACH, -ENOENT,
 * -EACCES, -EPROTO, -EIO as its reason says). */
struct cap_buf;
struct cap_image_ref;
int cap_store_skopeo_raw(const struct cap_image_ref *pr, const char *src, bool config, bool plain,
			 bool insecure, unsigned timeout_s, int64_t deadline_ms, const char *what,
			 struct cap_buf *out, struct cap_err *err);
/* "sha256:<hex>" of b's bytes (new string); whether it is digest. */
char *cap_store_bytes_digest(const struct cap_buf *b);
bool cap_store_bytes_match(const struct cap_buf *b, const char *digest);

#endif
