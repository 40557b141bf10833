/* capsule doctor: what capsule found on this host, and what to do about
 * what is missing. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine.h"
#include "paths.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule doctor\n"
	"\n"
	"Print the QEMU version, the acceleration capsule would use and why, and\n"
	"each protection of the jail QEMU runs in (active, or missing and why),\n"
	"and whether the guest kernel, agent and initramfs are ready. Exits 1\n"
	"when something needed to start a VM is missing.\n";

int cap_cli_doctor(int argc, char **argv)
{
	if (argc > 1 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage, stdout);
		return 0;
	}
	if (argc > 1) {
		cap_cli_error("doctor takes no arguments; see `capsule doctor --help`");
		return 2;
	}
	int problems = 0;
	struct cap_err err = { 0 };
	_cleanup_free_ char *qemu = NULL;

	printf("capsule %s (protocol v1)\n", CAPSULE_VERSION);
	if (cap_engine_version(&qemu, &err) < 0) {
		printf("qemu:       MISSING: %s\n", err.msg);
		problems++;
	} else {
		printf("qemu:       %s\n", qemu);
	}

	struct cap_accel_choice ac;
	if (cap_engine_accel_choose(CAP_ACCEL_AUTO, &ac, &err) < 0) {
		printf("accel:      REFUSED: %s\n", err.msg);
		problems++;
	} else {
		printf("accel:      %s (%s)\n", cap_engine_accel_name(ac.accel), ac.reason);
		if (ac.accel == CAP_ACCEL_TCG)
			printf("isolation:  WARNING: under TCG, QEMU's security policy does not treat the guest\n"
			       "            as isolated (docs/system/security.rst, \"Non-virtualization Use\n"
			       "            Case\"). Fine for development; on production hosts use KVM and set\n"
			       "            CAPSULE_REQUIRE_KVM=1 so that capsule refuses to start without it.\n");
	}

	/* The jail: each protection, active or missing and why. */
	struct cap_jail_check jc[CAP_JAIL_NCHECKS];
	int missing = cap_jail_probe(jc);
	const char *req = getenv("CAPSULE_REQUIRE_JAIL");
	bool require = req && strcmp(req, "1") == 0;
	printf("jail:       %s\n", missing == 0 ? "every QEMU runs confined (docs/architecture.md, \"The jail\")"
	       : require ? "REFUSED: CAPSULE_REQUIRE_JAIL=1 and protections are missing; no VM will start"
	       : "WARNING: protections are missing; VMs start without them (set CAPSULE_REQUIRE_JAIL=1 to refuse)");
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++)
		printf("  %-22s %s: %s\n", jc[i].name, jc[i].active ? "active" : "MISSING", jc[i].detail);
	if (missing && require)
		problems++;

	_cleanup_free_ char *cache = cap_cache_dir();
	printf("cache:      %s\n", cache);

	bool have;
	_cleanup_free_ char *kernel = cap_store_kernel_path(&have);
	if (have) {
		char target[4096];
		ssize_t n = readlink(kernel, target, sizeof(target) - 1);
		if (n > 0)
			target[n] = '\0';
		printf("kernel:     cached: %s%s%s\n", kernel, n > 0 ? " -> " : "", n > 0 ? target : "");
	} else {
		printf("kernel:     MISSING: %s; build it with `make kernel` (about 3 to 6 minutes, once)\n", kernel);
		problems++;
	}

	_cleanup_free_ char *agent = cap_store_agent_path(&have);
	bool have_agent = have;
	printf("agent:      %s: %s%s\n", have ? "present" : "MISSING", agent,
	       have ? "" : "; build it with `make`");
	problems += !have;

	bool have_bb = access(CAP_BUSYBOX, X_OK) == 0;
	printf("busybox:    %s: %s%s\n", have_bb ? "present" : "MISSING", CAP_BUSYBOX,
	       have_bb ? "" : "; install busybox-static (scripts/bootstrap.sh)");
	problems += !have_bb;

	if (have_agent && have_bb) {
		_cleanup_free_ char *initrd = NULL;
		if (cap_store_initramfs_path(agent, CAP_BUSYBOX, &initrd, &err) < 0) {
			printf("initramfs:  ERROR: %s\n", err.msg);
			problems++;
		} else {
			printf("initramfs:  %s: %s\n",
			       access(initrd, R_OK) == 0 ? "cached" : "not packed yet (packed on the first run, under a second)",
			       initrd);
		}
	}
	printf("%s\n", problems ? "status:     NOT READY (see MISSING above)" : "status:     ready");
	return problems ? 1 : 0;
}
