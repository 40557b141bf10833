/* The jail every VM's process runs in (docs/architecture.md, "The
 * jail"): new mount, PID, IPC, UTS and network namespaces, a private root
 * holding only the files the caller lists, an unprivileged UID/GID of its
 * own, a cgroup with a memory ceiling, a PID limit and a CPU weight,
 * rlimits, no_new_privs, and no descriptor but the ones passed on. It
 * takes an executable, a file list, devices, limits and descriptors, and
 * knows nothing of the program it runs: the engine (engine-qemu.c) says
 * what QEMU needs. Used only by the engine. In parts: jail.c (a jail,
 * spawning, helpers, probe), jail-cgroup.c, jail-root.c, jail-user.c.
 *
 * A VM's helpers (cap_jail_helper: the policy process, which parses what
 * the guest sends, and the connector) are forked by the VM's owner as
 * root and confined in this order before running as the helper user:
 * setns into the VM's network namespace (the connector; the policy process
 * keeps the owner's), join the VM's cgroups, unshare a mount and an IPC
 * namespace, make every mount private, mount a 16 KiB tmpfs, bind
 * /dev/null and the files asked for (read-only, nosuid, nodev, noexec:
 * the host's /etc/resolv.conf, hosts, nsswitch.conf, host.conf and
 * gai.conf for the policy process, nothing for the connector),
 * pivot_root, detach the old root, remount the root read-only; then
 * rlimits, setgroups(0) + setresgid + setresuid, no_new_privs, signals,
 * descriptors. They keep the owner's PID and UTS namespaces. About
 * 0.5 ms per helper on top of the fork. */
#ifndef CAP_JAIL_H
#define CAP_JAIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine-probe.h"	/* the jail's host checks: struct cap_jail_check */
#include "err.h"

/* A file bound read-only (nosuid, nodev) into a jail's root. */
struct cap_jail_file {
	const char *host;	/* absolute host path */
	const char *at;		/* absolute path in the root; NULL: host's */
	bool exec;		/* may be run or mapped executable; else noexec */
};

#define CAP_JAIL_MAX_DEVICES 4

/* What one jail runs and holds. The caller (the engine) decides all of
 * it: the jail knows nothing of the program it confines. Pointers are
 * borrowed for cap_jail_new, which copies what it keeps. */
struct cap_jail_spec {
	/* The program: a host path, bound at the same path in the root
	 * (exec) and run by cap_jail_spawn. Messages name its base name. */
	const char *exe;
	/* Everything else it opens by path (its libraries, its data): each
	 * file bound where it says; one that does not exist fails the
	 * spawn. */
	const struct cap_jail_file *files;
	unsigned nfiles;
	/* Character devices (host paths, e.g. /dev/kvm): the jail makes a
	 * node of its own for each at the same path in the root, the host
	 * node's major:minor, owned by the jail's user, 0600, whatever the
	 * host node's owner, group and mode; its user gets no group for it
	 * (it has none but its own). Anything but a character device is
	 * refused by cap_jail_new. Every jail has /dev/null and /dev/urandom
	 * (bound from the host) besides. */
	const char *const *devices;
	unsigned ndevices;	/* at most CAP_JAIL_MAX_DEVICES */
	/* Its cgroup: memory ceiling in bytes (swap 0), PID limit, and a
	 * CPU weight of 100 (v1: 1024 shares) per cpu. */
	unsigned long long memory_max;
	unsigned pids_max;
	unsigned cpus;
	/* At most one memory file:
	 * - rw_file, bound read-write at rw_at and owned by the jail's user
	 *   while it runs (given back to root by cap_jail_free);
	 * - copy_file, copied into a tmpfs of the jail's own mounted at the
	 *   folder of copy_at ("/dir/name", dir not "/" and holding nothing
	 *   else), owned by the jail's user, sized to the file: the copy
	 *   is made while the program starts, charged to the jail's cgroup,
	 *   and complete once cap_jail_ready returns;
	 * - sealed_fd, when > 0: a memfd sealed against writes
	 *   (F_SEAL_WRITE, F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL: checked
	 *   here, anything less is refused) that the caller passes among
	 *   cap_jail_spawn's descriptors, for a program that opens its
	 *   memory by path only: the jail mounts a proc of the program's
	 *   own PID namespace (subset=pid, hidepid=invisible: its own
	 *   /proc/PID and /proc/self, nothing of the host's) at /proc for
	 *   it to open /proc/self/fd/N, and detaches that proc in
	 *   cap_jail_ready, once the program has opened it. */
	const char *rw_file;
	const char *rw_at;
	const char *copy_file;
	const char *copy_at;
	int sealed_fd;
};

struct cap_jail;

/* Reserve a jail for one VM: a UID slot (held until cap_jail_free) and its
 * cgroups, limits written. Protections this host cannot give are listed
 * in cap_jail_note; with CAPSULE_REQUIRE_JAIL=1 any missing one fails
 * here instead (-EPERM, err naming each). CAPSULE_JAIL=0 (debug) turns
 * the whole jail off. *out is owned by the caller: cap_jail_free. */
int cap_jail_new(const struct cap_jail_spec *spec, struct cap_jail **out,
		 struct cap_err *err);

/* Whether a jail made now would confine its process (what cap_jail_new
 * decides, without making one). */
bool cap_jail_would_confine(void);

/* True when the program runs in a private root: paths in its arguments
 * must be those inside the root (cap_jail_file.at, spec.rw_at, ...). */
bool cap_jail_confined(const struct cap_jail *j);
/* The protections missing for this VM, "" when none. Borrowed. */
const char *cap_jail_note(const struct cap_jail *j);

/* Start spec.exe with argv (argv[0] is only its name) and an empty
 * environment in the jail, with stdin from /dev/null, stdout and stderr
 * to logfd, and fds[0..n) as descriptors 3, 4, ... (the slot's lock
 * after them). Every other descriptor is closed. It gets SIGKILL if this
 * process dies. Returns its pid (in our namespace) and a pidfd in
 * *pidfd, or -errno with err saying which step failed and why. Once. */
pid_t cap_jail_spawn(struct cap_jail *j, char *const argv[], int logfd,
		     const int *fds, unsigned n, int *pidfd,
		     struct cap_err *err);

/* The jail's users. The program runs as UID = GID = base + slot (base
 * 1900000000, or CAPSULE_JAIL_UID_BASE; slots 0-4095); the VM's helpers
 * (its policy process and connector) as base + CAP_JAIL_HELPER_OFFSET +
 * slot, a range no program's UID ever falls in, so that nftables rules
 * matching the program's UID never match them. Meaningful only when confined. */
#define CAP_JAIL_HELPER_OFFSET 1000000u
uid_t cap_jail_uid(const struct cap_jail *j);
uid_t cap_jail_helper_uid(const struct cap_jail *j);

/* Have cap_jail_spawn put the program in network namespace netns (prepared by
 * cap_jail_net_new) instead of a new empty one, with an /etc/resolv.conf
 * naming 127.0.0.1 in its root. netns is borrowed: it must stay open
 * until cap_jail_spawn has returned. A confined jail only. */
void cap_jail_set_netns(struct cap_jail *j, int netns);

/* Fork a helper of this VM: in the caller's PID, UTS and user
 * namespaces and, when netns >= 0, in network namespace netns (else the
 * caller's); in the jail's cgroups (it counts against the VM's budget);
 * in a mount and an IPC namespace of its own, with a root of its own (a
 * 16 KiB tmpfs, pivot_root, the old root detached, remounted read-only,
 * nosuid, nodev, noexec) holding only /dev/null and those of
 * files[0..nfiles) (absolute host paths, borrowed for the call) that
 * exist as regular files, each bound read-only at its own path when the
 * helper starts; as the jail's helper user (setgroups 0); with
 * no_new_privs, RLIMIT_CORE 0, RLIMIT_NOFILE 4096, RLIMIT_NPROC 16,
 * SIGKILL when this thread dies, signals at their defaults (SIGPIPE
 * ignored) and none blocked; holding only descriptors 0-2 and
 * keep[0..nkeep), each under its own number. Every namespace and mount
 * step is done as root, before the change of user. It then exits with
 * the value of fn(ud) (_exit: nothing of the caller runs after it), so
 * fn opens no path but those (it has its descriptors; a name it
 * resolves with getaddrinfo needs the resolver's files in the list).
 * Returns its pid, with a pidfd for it in *pidfd (the caller closes it
 * and reaps the child), or -errno with err saying which step failed. */
pid_t cap_jail_helper(struct cap_jail *j, int netns, const char *const *files,
		      unsigned nfiles, const int *keep, unsigned nkeep,
		      int (*fn)(void *ud), void *ud, int *pidfd, struct cap_err *err);

/* Wait until the jail's copy (spec.copy_file) is complete: the program
 * must not read it before; with spec.sealed_fd, detach the proc mounted
 * for the program to open it (call once it has: for QEMU, once it
 * answers QMP). 0, or -errno with err saying what failed.
 * Nothing to do: 0. */
int cap_jail_ready(struct cap_jail *j, struct cap_err *err);

/* Remove the jail once its process has been reaped: cgroups removed,
 * spec.rw_file given back to root, the slot released. NULL is fine. */
void cap_jail_free(struct cap_jail *j);

/* Remove jails left by VMs whose owner died (a crashed controller or
 * shim): cgroups of free slots, processes in them killed. Calls found for
 * each one removed ("vm-3: cgroups removed"). Returns how many. */
int cap_jail_sweep(void (*found)(void *ud, const char *what), void *ud);

#endif
