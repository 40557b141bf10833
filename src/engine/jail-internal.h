/* What the parts of the jail share (jail.h is the interface): jail.c (a
 * jail, spawning, helpers, probe), jail-cgroup.c (cgroups: limits, join,
 * sweep), jail-root.c (private roots, the copied file, the private proc)
 * and jail-user.c (UID slots, rlimits, credentials). Internal functions
 * are jail_<part>_<verb>. */
#ifndef CAP_JAIL_INTERNAL_H
#define CAP_JAIL_INTERNAL_H

#include <stdbool.h>
#include <sys/types.h>

#include "jail.h"

#define RUN_DIR "/run/capsule/jail"
#define ROOT_MNT RUN_DIR "/root"
/* Where a child mounts the tmpfs it makes its device nodes in (its own
 * mount namespace; outside the root, detached before the program runs). */
#define DEV_MNT RUN_DIR "/dev"
#define SLOTS 4096
#define UID_BASE 1900000000u
#define NOFILE 4096
#define NPROC 256
#define HELPER_NPROC 16
#define NS_FLAGS (CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET)

/* One bind into the root: host path, path in the root, mount flags. */
struct bind {
	char *owned_host;
	char *owned_at;
	unsigned long flags;
};

/* A device node the jail makes in its root: where, and the host's
 * character device's number. */
struct node {
	char *owned_at;
	dev_t rdev;
};

struct cap_jail {
	bool confined;		/* namespaces + private root + own user */
	int slot;		/* -1: none */
	int lock_fd;		/* holds the slot */
	uid_t uid;
	gid_t gid;
	char *owned_cg[3];	/* cgroup folders, NULL when none */
	int cg_version;
	char *owned_exe;
	const char *name;	/* the program's base name, in owned_exe */
	struct bind *owned_binds;	/* the program and its files */
	unsigned nbinds;
	struct node nodes[CAP_JAIL_MAX_DEVICES];	/* spec.devices */
	unsigned nnodes;
	char *owned_rw_file, *owned_rw_at;
	char *owned_copy_file, *owned_copy_at;
	pid_t copier;		/* filling the jail's copy_at, or -1 */
	bool own_proc;		/* a proc for the program to open spec.sealed_fd, detached by cap_jail_ready */
	pid_t pid;		/* the program, once spawned; else -1 */
	int netns;		/* its network namespace (borrowed), or -1: a new one */
	char note[512];
};

/* A child being confined (the program or a helper), until it execs or
 * runs its function: failures go to errfd (close-on-exec). */
struct child {
	const struct cap_jail *j;
	char *const *argv;
	int errfd, logfd, nullfd;
	int copyfd;		/* spec.copy_file, to size its tmpfs; or -1 */
	const int *fds;
	unsigned n;
};

/* ---- jail.c ----------------------------------------------------------- */

/* Whether environment variable name is set to value. */
bool jail_env_is(const char *name, const char *value);
/* Add "what (why)" to the protections j lacks. */
void jail_note_missing(struct cap_jail *j, const char *what, const char *why);
/* In a child: report "what: strerror(e)" on c->errfd and exit with e
 * (127 when e is not within 1-126). */
__attribute__((noreturn)) void jail_die(const struct child *c, const char *what, int e);
/* What a child wrote on its close-on-exec error pipe fd before exec or
 * exit, NUL-terminated in msg; 0 bytes (end of file): it got through. */
size_t jail_read_failure(int fd, char *msg, size_t size);
/* In a child: exit if the parent is gone (its end of c->errfd closed). */
void jail_parent_alive(const struct child *c);

/* ---- jail-cgroup.c ---------------------------------------------------- */

/* Create j's cgroups (vm-<slot>) with spec's limits; without usable
 * cgroups, or when that fails, j runs without and its note says so. */
void jail_cg_setup(struct cap_jail *j, const struct cap_jail_spec *spec);
/* Kill whatever is left in cgroup folder dir and remove it. 0, or -errno. */
int jail_cg_remove(const char *dir);
/* Move the calling process, single-threaded, into j's cgroups. 0, or
 * -errno with *failed the index that failed. */
int jail_cg_join(const struct cap_jail *j, int *failed);
/* Fill check with the cgroup protection's state on this host. */
void jail_cg_probe(struct cap_jail_check *check, bool off);

/* ---- jail-root.c ------------------------------------------------------ */

/* The node a jail makes for host device path: 0 with its number in *rdev,
 * or -errno with err naming path (-ENODEV: not a character device). */
int jail_root_node(const char *path, dev_t *rdev, struct cap_err *err);

/* In the child, as root: the program's private root at ROOT_MNT (its
 * binds, its device nodes, /dev/null, /dev/urandom, the memory file, the
 * private proc, resolv.conf with a network namespace), then pivot_root
 * into it. */
void jail_root_build(const struct child *c);
/* In a helper, as root: its own mount and IPC namespaces and a root of
 * its own holding /dev/null and those of files[0..nfiles) that exist. */
void jail_root_helper(const struct child *c, const char *const *files, unsigned nfiles);
/* Open the jail's copy at `at` ("/dir/name", spec.copy_at) below the
 * root rootfd for writing, each level without following a link (the
 * program owns the copy's folder and could plant one there, and the
 * copier is root): a descriptor of a regular file owned by uid with one
 * link, or -ELOOP (a link), -ENOTDIR, -EINVAL (not a regular file, or
 * "", "." or ".." in at), -EPERM (another owner, more links). */
int jail_root_open_copy(int rootfd, const char *at, uid_t uid);
/* Start copying copyfd into the jail's copy of program prog. 0, or -errno. */
int jail_root_start_copier(struct cap_jail *j, pid_t prog, int copyfd, struct cap_err *err);
/* Fill check with the private root's state, given the namespaces'. */
void jail_root_probe(struct cap_jail_check *check, const struct cap_jail_check *ns);

/* ---- jail-user.c ------------------------------------------------------ */

/* Whether this process may make namespaces and switch users. */
bool jail_user_may_confine(void);
/* Take a free slot for j: its lock, UID and GID. 0, or -EAGAIN with err
 * when all are taken. */
int jail_user_take_slot(struct cap_jail *j, struct cap_err *err);
/* The UID and GID cap_jail_device_probe opens a node as: base + SLOTS,
 * one no program or helper of a VM runs as. */
uid_t jail_user_probe_uid(void);
/* Hold slot n: an open descriptor holding its lock, or -1. */
int jail_user_slot_try(int n);
/* In a child: RLIMIT_CORE 0, RLIMIT_NOFILE NOFILE and, when nproc,
 * RLIMIT_NPROC nproc. */
void jail_user_limit(const struct child *c, unsigned nproc);
/* In a child: become uid/gid with no supplementary group (who names
 * that user in a failure), keeping the parent-death signal. */
void jail_user_become(const struct child *c, uid_t uid, gid_t gid, const char *who);
/* Fill the user, seccomp and limits checks, given the namespaces'. */
void jail_user_probe(struct cap_jail_check *user, struct cap_jail_check *seccomp,
		     struct cap_jail_check *limits, const struct cap_jail_check *ns);

#endif
