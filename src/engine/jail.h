/* The jail every QEMU runs in (docs/architecture.md, "The jail"): new
 * mount, PID, IPC, UTS and network namespaces, a private root holding only
 * what this VM needs, an unprivileged UID/GID of its own, a cgroup with a
 * memory ceiling, a PID limit and a CPU weight, rlimits, no_new_privs, and
 * no descriptor but the ones passed on. Used only by the engine. */
#ifndef CAP_JAIL_H
#define CAP_JAIL_H

#include <stdbool.h>
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

struct cap_jail;

/* Reserve a jail for one VM: a UID slot (held until cap_jail_free) and its
 * cgroups, limits written. Protections this host cannot give are listed
 * in cap_jail_note; with CAPSULE_REQUIRE_JAIL=1 any missing one fails
 * here instead (-EPERM, err naming each). CAPSULE_JAIL=0 (debug) turns
 * the whole jail off. *out is owned by the caller: cap_jail_free. */
int cap_jail_new(const struct cap_jail_spec *spec, struct cap_jail **out,
		 struct cap_err *err);

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

/* Wait until the jail's RAM copy (spec.ram_copy) is complete: QEMU must
 * not read guest RAM before (a restore's device state does). 0, or
 * -errno with err saying what failed. Nothing to wait for: 0. */
int cap_jail_ready(struct cap_jail *j, struct cap_err *err);

/* Remove the jail once its process has been reaped: cgroups removed, a
 * bound RAM file given back to root, the slot released. NULL is fine. */
void cap_jail_free(struct cap_jail *j);

/* Remove jails left by VMs whose owner died (a crashed controller or
 * shim): cgroups of free slots, processes in them killed. Calls found for
 * each one removed ("vm-3: cgroups removed"). Returns how many. */
int cap_jail_sweep(void (*found)(void *ud, const char *what), void *ud);

#endif
