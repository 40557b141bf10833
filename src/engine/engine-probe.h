/* What a front end may ask the engine and the jail without starting a
 * VM (`capsule doctor`, --accel): the accelerator's names and the choice
 * of one, the engines' names and versions, the TSC rate a guest would
 * get, and the jail's checks of this host. Declared here, apart from
 * engine.h and jail.h, so that a front end never includes those (the
 * header fence, tests/check-fence.sh); defined in src/engine. */
#ifndef CAP_ENGINE_PROBE_H
#define CAP_ENGINE_PROBE_H

#include <stdbool.h>
#include <stddef.h>

#include "engine-types.h"
#include "err.h"

/* Parse "auto", "kvm" or "tcg". -EINVAL otherwise. */
int cap_engine_accel_parse(const char *s, enum cap_accel *out);
const char *cap_engine_accel_name(enum cap_accel a);


/* Resolve want (AUTO, or KVM/TCG) against this host, per
 * docs/architecture.md "Acceleration". CAPSULE_ACCEL overrides AUTO;
 * CAPSULE_REQUIRE_KVM=1 turns AUTO into KVM. KVM is usable when the CPU
 * has hardware virtualization and a VM's program could open /dev/kvm
 * (tried for real: the jail's user on the node the jail makes, or this
 * user without the jail). Asking for KVM on a host without usable KVM
 * fails with -ENODEV and the reason and what to do in err; nothing ever
 * falls back to running on the host. */
int cap_engine_accel_choose(enum cap_accel want, struct cap_accel_choice *out,
			    struct cap_err *err);


/* An engine (engine-ops.h); opaque here. */
struct cap_engine_ops;

/* The engine called name; NULL: $CAPSULE_ENGINE, else the default
 * ("qemu"). -ENOENT with err listing the engines there are when none has
 * that name. The table is static: nothing to free. */
int cap_engine_get(const char *name, const struct cap_engine_ops **out,
		   struct cap_err *err);
/* The default engine, whatever CAPSULE_ENGINE says (what a VM recorded
 * by an older version, without an engine's name, ran on). */
const struct cap_engine_ops *cap_engine_default(void);
/* Its name ("qemu"), as CAPSULE_ENGINE and runtime.json's "engine" give it. */
const char *cap_engine_name(const struct cap_engine_ops *e);


/* The host's TSC rate in kHz, which a guest under TCG reads as its own
 * (QEMU's rdtsc is the host's counter): given to the guest kernel
 * (tsc_early_khz, tsc=reliable), whose calibration fails under TCG and
 * leaves it on the jiffies clock, whose tick never stops (about 5 % of a
 * core per idle VM). Measured against CLOCK_MONOTONIC_RAW once per host
 * boot (kept in the cache directory, keyed by the boot id). 0 when the
 * TSC is not constant and nonstop (constant_tsc, nonstop_tsc) or not the
 * host's own clock, or when CAPSULE_GUEST_TSC is set to anything but 1
 * ("0": no rate; "unstable": the guest is told its TSC is unstable, the
 * jiffies clock of before, to measure). Thread-safe. */
unsigned cap_engine_tsc_khz(void);


/* The engine's own version line ("QEMU emulator version 7.2.22 ..."), new
 * string; or -errno with err saying what to install. */
int cap_engine_version(const struct cap_engine_ops *e, char **out, struct cap_err *err);


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

/* Whether a jailed restore can map one shared template RAM (spec.sealed_fd):
 * a memfd can be sealed against writes and a jail can mount a proc of its
 * own (subset=pid). 0 with what it is in detail, or -errno with why not. */
int cap_jail_ram_probe(char *detail, size_t len);

/* Whether the program of a jail made now could open device path (a host
 * path, as in spec.devices) read-write and use it, tried for real. When
 * the jail would confine (*confined true): a throwaway child in a mount
 * namespace of its own makes the node as cap_jail_spawn does and opens it
 * as a jail's UID without groups (in this process's cgroups, not a VM's).
 * Else this process opens the host's node, as the unconfined program
 * would. use, when not NULL, is then called with the descriptor (in the
 * child, as that user) and says whether the device answers as the
 * program needs: 0, or -errno. 0 with what was found in detail, or -errno
 * with the step that failed and why (-ENODEV: not a character device). */
int cap_jail_device_probe(const char *path, int (*use)(int fd), bool *confined, char *detail, size_t len);


#endif
