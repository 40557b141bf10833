/* The guest's layout table (layout.h): each mount of the guest, in the
 * order the agent makes them, and the lookups over it. */
#include <string.h>
#include <sys/mount.h>

#include "layout.h"
#include "util.h"

#define NSX (MS_NOSUID | MS_NOEXEC | MS_NODEV)

static const struct cap_guest_mount mounts[] = {
	/* At boot, in the initramfs; the pseudo file systems. */
	{ "/proc", "proc", NSX, NULL, NULL, NULL, CAP_GUEST_AT_BOOT | CAP_GUEST_MOVED | CAP_GUEST_RESERVED },
	{ "/sys", "sysfs", NSX, NULL, NULL, NULL, CAP_GUEST_AT_BOOT | CAP_GUEST_MOVED | CAP_GUEST_RESERVED },
	{ "/dev", "devtmpfs", MS_NOSUID, "mode=0755", NULL, NULL,
	  CAP_GUEST_AT_BOOT | CAP_GUEST_MOVED | CAP_GUEST_RESERVED },
	{ "/dev/pts", "devpts", MS_NOSUID | MS_NOEXEC, "gid=5,mode=0620,ptmxmode=0666", NULL, NULL,
	  CAP_GUEST_AT_BOOT },
	{ "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", NULL, NULL, CAP_GUEST_AT_BOOT },
	/* POSIX message queues, which a container's root expects, when the
	 * kernel has them (CONFIG_POSIX_MQUEUE). */
	{ "/dev/mqueue", "mqueue", NSX, NULL, NULL, NULL, CAP_GUEST_AT_BOOT | CAP_GUEST_OPTIONAL },
	{ "/tmp", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777", NULL, NULL, CAP_GUEST_AT_BOOT | CAP_GUEST_MOVED },
	{ "/run", "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755", NULL, NULL, CAP_GUEST_AT_BOOT | CAP_GUEST_MOVED },
	{ "/sys/fs/cgroup", "cgroup2", NSX, NULL, NULL, NULL, CAP_GUEST_AT_BOOT },
	/* At SETUP, the overlay root's parts. nodev, nosuid as the data
	 * disks: an image's device nodes or setuid files are not a way to
	 * more privilege. The ext4 disks are mounted noinit_itable: the host
	 * made each one a new sparse file (mke2fs leaves the inode tables
	 * to the kernel's lazy init), whose unwritten blocks read as zeros
	 * already; the lazy init would write those zeros, allocating the
	 * file's holes on the host and flushing the disk in the background
	 * while commands that write nothing run. */
	{ CAP_GUEST_LOWER, "erofs", MS_RDONLY | MS_NODEV | MS_NOSUID, NULL, CAP_GUEST_SERIAL_ROOT,
	  "the image", 0 },
	{ CAP_GUEST_UPPER, "ext4", MS_NODEV | MS_NOSUID, "noinit_itable", CAP_GUEST_SERIAL_UPPER,
	  "the root file system's writable layer", 0 },
	{ CAP_GUEST_NEWROOT, "overlay", MS_NODEV | MS_NOSUID, NULL, NULL, NULL, 0 },
	/* At SETUP, the data disks, in the final root. */
	{ CAP_GUEST_WORK, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable", CAP_GUEST_SERIAL_WORK, CAP_GUEST_WORK,
	  CAP_GUEST_RESERVED | CAP_GUEST_FILE_ROOT | CAP_GUEST_WRITABLE | CAP_GUEST_HOME },
	/* A directory of the /work disk, made at SETUP: the roots of a pod's
	 * containers (nothing mounts it). */
	{ CAP_GUEST_CONTAINERS, NULL, 0, NULL, NULL, CAP_GUEST_CONTAINERS,
	  CAP_GUEST_FILE_ROOT | CAP_GUEST_WRITABLE | CAP_GUEST_ROOTS },
	{ CAP_GUEST_WORKSPACE, "ext4", MS_NOSUID | MS_NODEV, "noinit_itable", CAP_GUEST_SERIAL_WORKSPACE,
	  CAP_GUEST_WORKSPACE, CAP_GUEST_RESERVED | CAP_GUEST_FILE_ROOT | CAP_GUEST_WRITABLE },
	{ CAP_GUEST_SOURCE, "erofs", MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL,
	  CAP_GUEST_SERIAL_SOURCE, CAP_GUEST_SOURCE, CAP_GUEST_RESERVED | CAP_GUEST_FILE_ROOT },
};

const struct cap_guest_mount *cap_guest_mounts(size_t *n)
{
	*n = CAP_ARRAY_SIZE(mounts);
	return mounts;
}

const struct cap_guest_mount *cap_guest_mount_at(const char *path)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(mounts); i++)
		if (strcmp(path, mounts[i].path) == 0)
			return &mounts[i];
	return NULL;
}

const struct cap_guest_mount *cap_guest_mount_over(const char *path)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(mounts); i++) {
		if (!(mounts[i].attr & CAP_GUEST_RESERVED))
			continue;
		size_t n = strlen(mounts[i].path);
		if (strncmp(path, mounts[i].path, n) == 0 && (path[n] == '\0' || path[n] == '/'))
			return &mounts[i];
	}
	return NULL;
}

const struct cap_guest_mount *cap_guest_mount_by_serial(const char *serial)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(mounts); i++)
		if (mounts[i].serial && strcmp(serial, mounts[i].serial) == 0)
			return &mounts[i];
	return NULL;
}

const struct cap_guest_mount *cap_guest_file_root(const char *root)
{
	const struct cap_guest_mount *m = cap_guest_mount_at(root);
	return m && (m->attr & CAP_GUEST_FILE_ROOT) ? m : NULL;
}

bool cap_guest_path_reserved(const char *path)
{
	return strcmp(path, "/") == 0 || cap_guest_mount_over(path) != NULL;
}
