/* The jail's users: UID slots and their locks, rlimits, the change of
 * credentials (jail.h; docs/architecture.md, "The jail"). */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/capability.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "jail-internal.h"
#include "util.h"

static uid_t uid_base(void)
{
	const char *v = getenv("CAPSULE_JAIL_UID_BASE");
	if (v && *v) {
		char *end;
		unsigned long b = strtoul(v, &end, 10);
		if (!*end && b >= 1000 && b <= 4000000000ul)
			return (uid_t)b;
	}
	return UID_BASE;
}

/* Try to hold slot n: an open descriptor holding its lock, or -1. */
int jail_user_slot_try(int n)
{
	char path[64];
	snprintf(path, sizeof(path), RUN_DIR "/slot-%d", n);
	int fd = open(path, O_RDONLY | O_CREAT | O_CLOEXEC, 0600);
	if (fd < 0)
		return -1;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Whether this process may make namespaces and switch users: what the
 * jail needs (doctor's probe tries it for real; a VM start only asks). */
bool jail_user_may_confine(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	if (syscall(SYS_capget, &h, d) < 0)
		return false;
	const int need[] = { CAP_SYS_ADMIN, CAP_SETUID, CAP_SETGID };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(need); i++)
		if (!(d[need[i] / 32].effective & (1u << (need[i] % 32))))
			return false;
	return true;
}

int jail_user_take_slot(struct cap_jail *j, struct cap_err *err)
{
	for (int n = 0; n < SLOTS && j->lock_fd < 0; n++)
		if ((j->lock_fd = jail_user_slot_try(n)) >= 0)
			j->slot = n;
	if (j->lock_fd < 0)
		return cap_err_set(err, EAGAIN, "all %d jail slots in %s are taken: too many VMs are running", SLOTS, RUN_DIR);
	j->uid = uid_base() + (uid_t)j->slot;
	j->gid = (gid_t)j->uid;
	return 0;
}

uid_t jail_user_probe_uid(void)
{
	return uid_base() + SLOTS;
}

void jail_user_limit(const struct child *c, unsigned nproc)
{
	struct rlimit lim[][2] = {
		{ { RLIMIT_CORE, 0 }, { 0, 0 } },
		{ { RLIMIT_NOFILE, 0 }, { NOFILE, NOFILE } },
		{ { RLIMIT_NPROC, 0 }, { nproc, nproc } },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(lim); i++) {
		if (i == 2 && !nproc)
			continue;	/* per user: only meaningful for a user of its own */
		if (setrlimit((int)lim[i][0].rlim_cur, &lim[i][1]) < 0)
			jail_die(c, "setting rlimits", errno);
	}
}

void jail_user_become(const struct child *c, uid_t uid, gid_t gid, const char *who)
{
	/* No group but its own: a device is reached through a node the jail
	 * made for its user (jail-root.c), never through a group. */
	if (setgroups(0, NULL) < 0 || setresgid(gid, gid, gid) < 0 || setresuid(uid, uid, uid) < 0) {
		char what[64];
		snprintf(what, sizeof(what), "switching to %s", who);
		jail_die(c, what, errno);
	}
	/* A change of credentials clears the parent-death signal. */
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	jail_parent_alive(c);
}

void jail_user_probe(struct cap_jail_check *user, struct cap_jail_check *seccomp,
		     struct cap_jail_check *limits, const struct cap_jail_check *ns)
{
	if (!ns->active)
		snprintf(user->detail, sizeof(user->detail), "%s", ns->detail);
	else if (geteuid() != 0)
		snprintf(user->detail, sizeof(user->detail), "capsule is not root: it cannot switch a VM's process to a user of its own");
	else {
		user->active = true;
		snprintf(user->detail, sizeof(user->detail), "UID and GID %u + slot, one per running VM (%d slots, locks in %s); a VM's helpers %u + slot",
			 (unsigned)uid_base(), SLOTS, RUN_DIR, (unsigned)uid_base() + CAP_JAIL_HELPER_OFFSET);
	}
	seccomp->active = prctl(PR_GET_SECCOMP, 0, 0, 0, 0) >= 0;
	snprintf(seccomp->detail, sizeof(seccomp->detail), seccomp->active
		 ? "this kernel has seccomp filters; the VM's program installs its own (the engine's options deny all it can)"
		 : "this kernel has no seccomp");
	limits->active = true;
	snprintf(limits->detail, sizeof(limits->detail), "no_new_privs; RLIMIT_CORE 0, RLIMIT_NOFILE %d, RLIMIT_NPROC %d; every other descriptor closed",
		 NOFILE, NPROC);
}
