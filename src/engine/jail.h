/* The jail every QEMU runs in (docs/architecture.md, "The jail"): new
 * mount, PID, IPC, UTS and network namespaces, a private root holding only
 * what this VM needs, an unprivileged UID/GID of its own, a cgroup with a
 * memory ceiling, a PID limit and a CPU weight, rlimits, no_new_privs, and
 * no descriptor but the ones passed on. Used only by the engine.
 *
 * A VM's helpers (cap_jail_helper: the policy process, which parses what
 * the guest sends, and the connector) are forked by the VM's owner as
 * root and confined in this order before running as the helper user:
 * setns into QEMU's network namespace (the connector; the policy process
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

#include "err.h"

/* Where things are inside a jail's root. */
#define CAP_JAIL_KERNEL "/vm/vmlinux"
#define CAP_JAIL_INITRD "/vm/initrd"
#define CAP_JAIL_RAM "/mem/ram"

/* What one VM's jail holds. Host paths, borrowed for the call. */
struct cap_jail_spec {
	const char *kernel;	/* bound read-only at CAP_JAIL_KERNEL */
	const char *initrd;	/* bound read-only at CAP_JAIL_INITRD */
	bool kvm;		/* /dev/kvm too */
	unsigned memory_mib;	/* guest RAM; the ceiling adds QEMU's overhead */
	unsigned cpus;
	/* Guest RAM file: ram_bind is bound read-write at CAP_JAIL_RAM and
	 * handed to the jail's user while it runs (a template being built);
	 * ram_copy is copied into a tmpfs of the jail's own at CAP_JAIL_RAM
	 * (a restore: QEMU 7.2 opens its RAM file read-write, so it never
	 * gets the template's). At most one; neither: QEMU uses a memfd. */
	const char *ram_bind;
	const char *ram_copy;
	/* Or, when > 0, a memfd sealed against writes (F_SEAL_WRITE,
	 * F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL: checked here, anything
	 * less is refused) that the caller passes among cap_jail_spawn's
	 * descriptors: QEMU 7.2 opens its RAM by path only, so the jail
	 * mounts a proc of QEMU's own PID namespace (subset=pid,
	 * hidepid=invisible: its own /proc/PID and /proc/self, nothing of
	 * the host's) for it to open /proc/self/fd/N, and detaches that proc
	 * in cap_jail_ready, once QEMU has its RAM. Borrowed for
	 * cap_jail_new. */
	int ram_fd;
};

/* One protection and whether this host gives it. */
struct cap_jail_check {
	const char *name;	/* static */
	bool active;
	char detail[600];	/* what it is, or why it is missing */
};

#define CAP_JAIL_NCHECKS 6

/* Fill checks with each protection's state on this host, as a VM started
 * now would get it. Probes for real (a throwaway child in new namespaces,
 * a throwaway cgroup). Returns how many are missing. */
int cap_jail_probe(struct cap_jail_check checks[CAP_JAIL_NCHECKS]);

/* Whether a jailed restore can map one shared template RAM (spec.ram_fd):
 * a memfd can be sealed against writes and a jail can mount a proc of its
 * own (subset=pid). 0 with what it is in detail, or -errno with why not. */
int cap_jail_ram_probe(char *detail, size_t len);

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

/* True when QEMU runs in a private root: paths in its arguments must be
 * the CAP_JAIL_* ones. */
bool cap_jail_confined(const struct cap_jail *j);
/* The protections missing for this VM, "" when none. Borrowed. */
const char *cap_jail_note(const struct cap_jail *j);

/* Start argv[0] (looked up in PATH) in the jail with stdin from
 * /dev/null, stdout and stderr to logfd, and fds[0..n) as descriptors 3,
 * 4, ... Every other descriptor is closed. It gets SIGKILL if this
 * process dies. Returns its pid (in our namespace) and a pidfd in
 * *pidfd, or -errno with err saying which step failed and why. */
pid_t cap_jail_spawn(struct cap_jail *j, char *const argv[], int logfd,
		     const int *fds, unsigned n, int *pidfd,
		     struct cap_err *err);

/* The jail's users. QEMU runs as UID = GID = base + slot (base
 * 1900000000, or CAPSULE_JAIL_UID_BASE; slots 0-4095); the VM's helpers
 * (its policy process and connector) as base + CAP_JAIL_HELPER_OFFSET +
 * slot, a range no QEMU's UID ever falls in, so that nftables rules
 * matching QEMU's UID never match them. Meaningful only when confined. */
#define CAP_JAIL_HELPER_OFFSET 1000000u
uid_t cap_jail_uid(const struct cap_jail *j);
uid_t cap_jail_helper_uid(const struct cap_jail *j);

/* Have cap_jail_spawn put QEMU in network namespace netns (prepared by
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

/* Wait until the jail's RAM copy (spec.ram_copy) is complete: QEMU must
 * not read guest RAM before (a restore's device state does); with
 * spec.ram_fd, detach the proc mounted for QEMU to open it (QEMU has
 * opened its RAM once it answers QMP). 0, or -errno with err saying what
 * failed. Nothing to do: 0. */
int cap_jail_ready(struct cap_jail *j, struct cap_err *err);

/* Remove the jail once its process has been reaped: cgroups removed, a
 * bound RAM file given back to root, the slot released. NULL is fine. */
void cap_jail_free(struct cap_jail *j);

/* ---- the network of a VM with a NIC (engine-net.c) -------------------
 * A network namespace with loopback only (route "local 0.0.0.0/0 dev
 * lo", ping sockets closed to QEMU's group, every port bindable in it so
 * that QEMU can forward low guest ports) and the nftables rules of
 * engine.h's struct cap_vm_net matched on QEMU's UID; when cfg has a
 * policy_main, its listeners, the connector and the policy process. */
struct cap_vm_net;
struct cap_jail_net;

/* Set it all up for the VM jailed in j (which must be confined: a
 * network policy is enforced by the jail; -EPERM otherwise). cfg is
 * borrowed for the call. *out is owned by the caller: cap_jail_net_free
 * before cap_jail_free. The calling thread's own network namespace is
 * the same on return. */
int cap_jail_net_new(struct cap_jail *j, const struct cap_vm_net *cfg,
		     struct cap_jail_net **out, struct cap_err *err);
/* The namespace, for cap_jail_set_netns. Owned by n. */
int cap_jail_net_ns(const struct cap_jail_net *n);
/* The owner's end of the policy process's control socket, -1 without a
 * policy process; owned by n. */
int cap_jail_net_control_fd(const struct cap_jail_net *n);
/* The policy process, -1 without one. */
pid_t cap_jail_net_pid(const struct cap_jail_net *n);
/* Replace the ranges [lo, hi] (host order; any order, overlaps merged)
 * refused with a TCP reset, in one nftables transaction. */
int cap_jail_net_deny(struct cap_jail_net *n, const uint32_t (*deny)[2],
		      unsigned ndeny, struct cap_err *err);
/* SIGKILL the policy process and the connector and reap them. */
void cap_jail_net_stop(struct cap_jail_net *n);
/* Stop, then close everything. NULL is fine. */
void cap_jail_net_free(struct cap_jail_net *n);

/* Remove jails left by VMs whose owner died (a crashed controller or
 * shim): cgroups of free slots, processes in them killed. Calls found for
 * each one removed ("vm-3: cgroups removed"). Returns how many. */
int cap_jail_sweep(void (*found)(void *ud, const char *what), void *ud);

#endif
