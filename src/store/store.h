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
 * the capsule executable. New string; *exists as above. */
char *cap_store_agent_path(bool *exists);

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

#endif
