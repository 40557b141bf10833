/* The rootfs mounts containerd hands Create (a snapshotter's overlay or
 * bind mounts), mounted at the bundle's rootfs as the runc shim does
 * (containerd's mount.All), and unmounted at Delete. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>

#include "shim.h"
#include "util.h"

static const struct {
	const char *name;
	bool clear;
	unsigned long flag;
} flags[] = {
	{ "async", true, MS_SYNCHRONOUS },  { "atime", true, MS_NOATIME },	 { "bind", false, MS_BIND },
	{ "defaults", false, 0 },	    { "dev", true, MS_NODEV },		 { "diratime", true, MS_NODIRATIME },
	{ "dirsync", false, MS_DIRSYNC },   { "exec", true, MS_NOEXEC },	 { "mand", false, MS_MANDLOCK },
	{ "noatime", false, MS_NOATIME },   { "nodev", false, MS_NODEV },	 { "nodiratime", false, MS_NODIRATIME },
	{ "noexec", false, MS_NOEXEC },	    { "nomand", true, MS_MANDLOCK },	 { "norelatime", true, MS_RELATIME },
	{ "nostrictatime", true, MS_STRICTATIME }, { "nosuid", false, MS_NOSUID }, { "rbind", false, MS_BIND | MS_REC },
	{ "relatime", false, MS_RELATIME }, { "remount", false, MS_REMOUNT },	 { "ro", false, MS_RDONLY },
	{ "rw", true, MS_RDONLY },	    { "strictatime", false, MS_STRICTATIME }, { "suid", true, MS_NOSUID },
	{ "sync", false, MS_SYNCHRONOUS },
};

/* Options to flags and the rest to the data string (new). */
static char *parse(char **opts, size_t n, unsigned long *fl)
{
	size_t cap = 1;
	for (size_t i = 0; i < n; i++)
		cap += strlen(opts[i]) + 1;
	char *data = xcalloc(1, cap);
	*fl = 0;
	for (size_t i = 0; i < n; i++) {
		size_t k = 0;
		for (; k < CAP_ARRAY_SIZE(flags); k++)
			if (strcmp(flags[k].name, opts[i]) == 0)
				break;
		if (k < CAP_ARRAY_SIZE(flags)) {
			if (flags[k].clear)
				*fl &= ~flags[k].flag;
			else
				*fl |= flags[k].flag;
			continue;
		}
		if (*data)
			strcat(data, ",");
		strcat(data, opts[i]);
	}
	return data;
}

int shim_mount_rootfs(const char *target, Containerd__Types__Mount **m, size_t n, struct shim_status *st)
{
	for (size_t i = 0; i < n; i++) {
		unsigned long fl;
		char *data = parse(m[i]->options, m[i]->n_options, &fl);
		const char *type = m[i]->type;
		if (strcmp(type, "bind") == 0)
			fl |= MS_BIND;
		/* A bind mount takes its read-only flag at a remount. */
		unsigned long first = (fl & MS_BIND) ? fl & ~(unsigned long)MS_RDONLY : fl;
		int r = mount(m[i]->source, target, type, first, *data ? data : NULL);
		if (r == 0 && (fl & MS_BIND) && (fl & MS_RDONLY))
			r = mount("", target, "", fl | MS_REMOUNT, NULL);
		int e = errno;
		free(data);
		if (r < 0) {
			shim_unmount_all(target);
			return shim_fail(st, CAP_GRPC_INTERNAL, "cannot mount %s (%s) at %s: %s", m[i]->source, type, target,
					 strerror(e));
		}
	}
	return 0;
}

void shim_unmount_all(const char *target)
{
	for (int i = 0; i < 64; i++) {
		if (umount2(target, MNT_DETACH) < 0) {
			if (errno != EINVAL && errno != ENOENT)
				shim_log("warning", "cannot unmount %s: %s", target, strerror(errno));
			return;
		}
	}
}
