/* The guest's layout: every file system the agent mounts, where, how, from
 * which disk, and what the host may do there. One table (proto-layout.c),
 * read by the agent (its mounts at boot and at SETUP, its shutdown, its
 * checks of FILE roots and of a container's tmpfs), by the host's disk
 * layout (sandbox-spec.c: the disks' serials and what messages call
 * them), by the FILE codec (which roots a request may name) and by the
 * OCI config mapping (which destinations are the guest's own).
 *
 * Two ways to name a path, both from here:
 * - In code that decides, look the entry up (cap_guest_mount_at,
 *   cap_guest_mount_over, cap_guest_file_root, ...) and test its attr
 *   bits, so that a new mount or a new rule is one row of the table.
 * - In a string built at compile time (a help text, a message, a
 *   default), use the path macros below, which are plain string literals
 *   and concatenate: "HOME=" CAP_GUEST_WORK, CAP_GUEST_WORK "/%s",
 *   "only " CAP_GUEST_WORK " can be written". The table's rows use the
 *   same macros, so the two cannot disagree.
 * No other file spells these paths. */
#ifndef CAP_LAYOUT_H
#define CAP_LAYOUT_H

#include <stdbool.h>
#include <stddef.h>

/* The data disks' mount points: the FILE roots. */
#define CAP_GUEST_WORK "/work"	/* the tool user's home and private disk */
#define CAP_GUEST_WORKSPACE "/workspace"	/* the host's project, diffed and merged back */
#define CAP_GUEST_SOURCE "/source"	/* a source image, read-only */
/* A pod's containers (docs/oci.md, "Pods"): CAP_GUEST_CONTAINERS/NAME is
 * the root of the pod's container NAME, copied in by the host (FILE
 * TAR_IN with CAP_TAR_OWNERS, the one root that keeps the entries'
 * owners), on the /work disk; its emptyDir volumes are directories of
 * CAP_GUEST_VOLUMES, shared by the containers that name them. Made by
 * the agent at SETUP when there is a /work disk, root's, 0700. */
#define CAP_GUEST_CONTAINERS CAP_GUEST_WORK "/.containers"
#define CAP_GUEST_VOLUMES CAP_GUEST_WORK "/.volumes"
/* Where the overlay root is put together at SETUP before the guest moves
 * into it (the image below, the upper disk above). */
#define CAP_GUEST_LOWER "/.capsule/lower"
#define CAP_GUEST_UPPER "/.capsule/upper"
#define CAP_GUEST_NEWROOT "/.capsule/root"
/* The overlay's upperdir and workdir on the upper disk. */
#define CAP_GUEST_UPPER_DATA CAP_GUEST_UPPER "/data"
#define CAP_GUEST_UPPER_WORK CAP_GUEST_UPPER "/work"

/* The disks' virtio-blk serials (at most 20 bytes each), by which the
 * agent finds each disk's /dev/vdX. */
#define CAP_GUEST_SERIAL_ROOT "capsule-root"
#define CAP_GUEST_SERIAL_UPPER "capsule-upper"
#define CAP_GUEST_SERIAL_WORK "capsule-work"
#define CAP_GUEST_SERIAL_SOURCE "capsule-source"
#define CAP_GUEST_SERIAL_WORKSPACE "capsule-wspace"

/* attr bits of a mount. */
#define CAP_GUEST_AT_BOOT 0x01u	/* mounted by the agent at boot, in table order */
#define CAP_GUEST_OPTIONAL 0x02u	/* at boot: a kernel without it leaves no directory */
#define CAP_GUEST_MOVED 0x04u	/* moved into the overlay root at SETUP (with what is below) */
/* The path and everything below it are the guest's own: a container's
 * tmpfs may not be mounted there. */
#define CAP_GUEST_RESERVED 0x08u
#define CAP_GUEST_FILE_ROOT 0x10u	/* a root FILE requests may name */
#define CAP_GUEST_WRITABLE 0x20u	/* a FILE root that TAR_IN writes to */
/* The tool user's home: its HOME, a command's default directory, and the
 * one FILE root that WRITE writes to. */
#define CAP_GUEST_HOME 0x40u
/* A FILE root whose TAR_IN runs as root and may keep the entries' owners
 * (CAP_TAR_OWNERS): the containers' roots. Not a mount of its own. */
#define CAP_GUEST_ROOTS 0x80u

struct cap_guest_mount {
	const char *path;	/* absolute, in the final root */
	const char *fstype;
	unsigned long flags;	/* MS_* */
	const char *data;	/* mount data, NULL: none */
	const char *serial;	/* its disk's serial, NULL: not a disk */
	const char *role;	/* what messages call it (a disk's path, "the image") */
	unsigned attr;	/* CAP_GUEST_* */
};

/* The table, in the order the agent mounts; n entries to *n. Static
 * storage: never freed. */
const struct cap_guest_mount *cap_guest_mounts(size_t *n);
/* The entry mounted exactly at path, or NULL. */
const struct cap_guest_mount *cap_guest_mount_at(const char *path);
/* The CAP_GUEST_RESERVED entry that path (absolute, without "//" or a
 * trailing '/') is at or below, or NULL. */
const struct cap_guest_mount *cap_guest_mount_over(const char *path);
/* The entry of the disk with this serial, or NULL. */
const struct cap_guest_mount *cap_guest_mount_by_serial(const char *serial);
/* The CAP_GUEST_FILE_ROOT entry named exactly root, or NULL. */
const struct cap_guest_mount *cap_guest_file_root(const char *root);
/* Whether a user's mount may not target path: the root itself, or at or
 * below a CAP_GUEST_RESERVED entry. */
bool cap_guest_path_reserved(const char *path);

#endif
