/* capsule doctor: what capsule found on this host, and what to do about
 * what is missing. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "engine-probe.h"
#include "jsonrpc.h"
#include "paths.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule doctor [--json]\n"
	"\n"
	"Print the QEMU version, the acceleration capsule would use and why, and\n"
	"each protection of the jail QEMU runs in (active, or missing and why),\n"
	"whether the guest kernel, agent and initramfs are ready, and how many\n"
	"images there are. Exits 1 when something needed to start a VM is missing.\n"
	"  --json  one JSON object with each check as a field and \"ok\"\n"
	"          (docs/cli.md, \"JSON output\"); the exit code is the same\n";

static json_t *str_or_null(const char *s)
{
	return s ? cap_json_text(s) : json_null();
}

int cap_cli_doctor(int argc, char **argv)
{
	bool json;
	int r = cap_cli_one_flag(argc, argv, usage, "json", 0, &json);
	if (r >= 0)
		return r;
	if (optind != argc) {
		cap_cli_error("doctor takes no arguments but --json; see `capsule doctor --help`");
		return CAP_EXIT_USAGE;
	}
	/* Each check goes into o; the text is printed as it is found. */
	FILE *t = json ? fopen("/dev/null", "w") : stdout;
	if (!t) {
		cap_cli_error("cannot open /dev/null: %s", strerror(errno));
		return CAP_EXIT_FAILURE;
	}
	json_t *o = json_object();
	int problems = 0;
	struct cap_err err = { 0 };
	_cleanup_free_ char *version = NULL;

	fprintf(t, "capsule %s (protocol v1)\n", CAPSULE_VERSION);
	json_object_set_new(o, "version", json_string(CAPSULE_VERSION));
	json_object_set_new(o, "protocol", json_integer(1));
	/* The engine (CAPSULE_ENGINE, else the default), under its own name
	 * too: "qemu" in the JSON, as before engines. */
	const struct cap_engine_ops *engine = NULL;
	if (cap_engine_get(NULL, &engine, &err) < 0) {
		fprintf(t, "engine:     REFUSED: %s\n", err.msg);
		json_object_set_new(o, "engine", json_pack("{s:n, s:b, s:n, s:o}", "name", "ok", 0, "version", "error",
							   cap_json_text(err.msg)));
		problems++;
	} else {
		const char *name = cap_engine_name(engine);
		char label[40];
		snprintf(label, sizeof(label), "%s:", name);
		json_t *e;
		if (cap_engine_version(engine, &version, &err) < 0) {
			fprintf(t, "%-11s MISSING: %s\n", label, err.msg);
			e = json_pack("{s:b, s:n, s:o}", "ok", 0, "version", "error", cap_json_text(err.msg));
			problems++;
		} else {
			fprintf(t, "%-11s %s\n", label, version);
			e = json_pack("{s:b, s:o, s:n}", "ok", 1, "version", cap_json_text(version), "error");
		}
		json_object_set(o, name, e);
		json_object_set_new(e, "name", json_string(name));
		json_object_set_new(o, "engine", e);
	}

	struct cap_accel_choice ac;
	const char *isolation = NULL;
	err = (struct cap_err){ 0 };
	if (cap_engine_accel_choose(CAP_ACCEL_AUTO, &ac, &err) < 0) {
		fprintf(t, "accel:      REFUSED: %s\n", err.msg);
		json_object_set_new(o, "accel", json_pack("{s:b, s:n, s:n, s:o}", "ok", 0, "name", "reason",
							  "error", cap_json_text(err.msg)));
		problems++;
	} else {
		fprintf(t, "accel:      %s (%s)\n", cap_engine_accel_name(ac.accel), ac.reason);
		json_object_set_new(o, "accel", json_pack("{s:b, s:s, s:o, s:n}", "ok", 1, "name",
							  cap_engine_accel_name(ac.accel), "reason", cap_json_text(ac.reason), "error"));
		if (ac.accel == CAP_ACCEL_TCG) {
			isolation = "under TCG, QEMU's security policy does not treat the guest as isolated "
				    "(docs/system/security.rst, \"Non-virtualization Use Case\"); fine for "
				    "development, on production hosts use KVM and set CAPSULE_REQUIRE_KVM=1";
			fprintf(t, "isolation:  WARNING: under TCG, QEMU's security policy does not treat the guest\n"
				   "            as isolated (docs/system/security.rst, \"Non-virtualization Use\n"
				   "            Case\"). Fine for development; on production hosts use KVM and set\n"
				   "            CAPSULE_REQUIRE_KVM=1 so that capsule refuses to start without it.\n");
		}
	}
	/* Under TCG, the guest's clock: the host's TSC, or jiffies. */
	if (err.code == 0 && ac.accel == CAP_ACCEL_TCG) {
		unsigned khz = cap_engine_tsc_khz();
		const char *env = getenv("CAPSULE_GUEST_TSC");
		if (khz)
			fprintf(t, "guest clock: the host's TSC at %u kHz (an idle guest's tick stops)\n", khz);
		else if (env && *env && strcmp(env, "1") != 0)
			fprintf(t, "guest clock: no TSC rate given (CAPSULE_GUEST_TSC=%s): under TCG the guest usually\n"
				   "            falls back to jiffies, whose tick never stops (about 5 %% of a core when idle)\n", env);
		else
			fprintf(t, "guest clock: no TSC rate given (this host's TSC is not constant and nonstop, or not\n"
				   "            its own clock): under TCG the guest usually falls back to jiffies, whose tick\n"
				   "            never stops (about 5 %% of a core when idle)\n");
		json_object_set_new(o, "guest_clock", json_pack("{s:s, s:i}", "source", khz ? "tsc" : "jiffies", "tsc_khz", (int)khz));
	}
	/* Writable for the VM's program, not for us: the jail's user on the
	 * node the jail makes, or this user without the jail. */
	bool kvm_dev = access("/dev/kvm", F_OK) == 0, kvm_confined = false;
	char kvm_detail[300];
	json_object_set_new(o, "kvm", json_pack("{s:s, s:b, s:b, s:b}", "device", "/dev/kvm", "present", kvm_dev,
						"writable", kvm_dev && cap_jail_device_probe("/dev/kvm", NULL, &kvm_confined, kvm_detail,
											   sizeof(kvm_detail)) == 0,
						"used", err.code == 0 && ac.accel == CAP_ACCEL_KVM));
	json_object_set_new(o, "isolation_warning", str_or_null(isolation));

	/* The jail: each protection, active or missing and why. */
	struct cap_jail_check jc[CAP_JAIL_NCHECKS];
	int missing = cap_jail_probe(jc);
	const char *req = getenv("CAPSULE_REQUIRE_JAIL");
	bool require = req && strcmp(req, "1") == 0;
	fprintf(t, "jail:       %s\n", missing == 0 ? "every QEMU runs confined (docs/architecture.md, \"The jail\")"
	       : require ? "REFUSED: CAPSULE_REQUIRE_JAIL=1 and protections are missing; no VM will start"
	       : "WARNING: protections are missing; VMs start without them (set CAPSULE_REQUIRE_JAIL=1 to refuse)");
	json_t *checks = json_array();
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++) {
		fprintf(t, "  %-22s %s: %s\n", jc[i].name, jc[i].active ? "active" : "MISSING", jc[i].detail);
		json_array_append_new(checks, json_pack("{s:s, s:b, s:o}", "name", jc[i].name, "active",
							jc[i].active, "detail", cap_json_text(jc[i].detail)));
	}
	json_object_set_new(o, "jail", json_pack("{s:b, s:b, s:o}", "ok", missing == 0 || !require, "required",
						 require, "checks", checks));
	if (missing && require)
		problems++;

	/* Shared template RAM: one sealed memfd per template, or a copy per
	 * VM (docs/architecture.md, "Shared template RAM"). Not a problem
	 * either way: the copy costs memory, not safety. */
	char ram[600];
	bool shared = cap_jail_ram_probe(ram, sizeof(ram)) == 0;
	const char *off = getenv("CAPSULE_SHARED_RAM");
	bool forced_copy = off && strcmp(off, "0") == 0;
	fprintf(t, "shared RAM: %s: %s\n", shared && !forced_copy ? "available" : "NOT USED, each restored VM copies its template's RAM",
		ram);
	json_object_set_new(o, "shared_ram", json_pack("{s:b, s:b, s:o}", "available", shared, "used", shared && !forced_copy,
						       "detail", cap_json_text(ram)));

	_cleanup_free_ char *cache = cap_cache_dir();
	fprintf(t, "cache:      %s\n", cache);
	json_object_set_new(o, "cache_dir", cap_json_text(cache));

	bool have;
	_cleanup_free_ char *kernel = cap_store_kernel_path(&have);
	char target[4096] = "";
	if (have) {
		ssize_t n = readlink(kernel, target, sizeof(target) - 1);
		target[n > 0 ? n : 0] = '\0';
		fprintf(t, "kernel:     cached: %s%s%s\n", kernel, *target ? " -> " : "", target);
	} else {
		fprintf(t, "kernel:     MISSING: %s; build it with `capsule prepare` (or `make kernel` in a source tree; about 3 to 6 minutes, once)\n", kernel);
		problems++;
	}
	json_object_set_new(o, "kernel", json_pack("{s:o, s:b, s:o}", "path", cap_json_text(kernel), "exists", have, "target",
						   str_or_null(*target ? target : NULL)));

	_cleanup_free_ char *agent = cap_store_agent_path(&have);
	bool have_agent = have;
	fprintf(t, "agent:      %s: %s%s\n", have ? "present" : "MISSING", agent, have ? "" : "; build it with `make`");
	json_object_set_new(o, "agent", json_pack("{s:o, s:b}", "path", cap_json_text(agent), "exists", have));
	problems += !have;

	bool have_bb = access(CAP_BUSYBOX, X_OK) == 0;
	fprintf(t, "busybox:    %s: %s%s\n", have_bb ? "present" : "MISSING", CAP_BUSYBOX,
		have_bb ? "" : "; install busybox-static (scripts/bootstrap.sh)");
	json_object_set_new(o, "busybox", json_pack("{s:s, s:b}", "path", CAP_BUSYBOX, "exists", have_bb));
	problems += !have_bb;

	json_t *ird = json_null();
	if (have_agent && have_bb) {
		_cleanup_free_ char *initrd = NULL;
		err = (struct cap_err){ 0 };
		if (cap_store_initramfs_path(agent, CAP_BUSYBOX, &initrd, &err) < 0) {
			fprintf(t, "initramfs:  ERROR: %s\n", err.msg);
			ird = json_pack("{s:n, s:b, s:o}", "path", "cached", 0, "error", cap_json_text(err.msg));
			problems++;
		} else {
			bool cached = access(initrd, R_OK) == 0;
			fprintf(t, "initramfs:  %s: %s\n",
				cached ? "cached" : "not packed yet (packed on the first run, under a second)", initrd);
			ird = json_pack("{s:o, s:b, s:n}", "path", cap_json_text(initrd), "cached", cached, "error");
		}
	}
	json_object_set_new(o, "initramfs", ird);

	/* Images: a count, and whether the base image new sandboxes use by
	 * default is there (it is built on first use when not). */
	struct cap_image *imgs = NULL, base;
	size_t nimg = 0;
	err = (struct cap_err){ 0 };
	if (cap_store_image_list(&imgs, &nimg, &err) < 0) {
		fprintf(t, "images:     ERROR: %s\n", err.msg);
		json_object_set_new(o, "images", json_pack("{s:n, s:n, s:o}", "count", "base", "error", cap_json_text(err.msg)));
	} else {
		bool have_base = cap_store_image_find("base", &base, NULL) == 0;
		if (have_base)
			cap_image_fini(&base);
		fprintf(t, "images:     %zu%s\n", nimg,
			have_base ? " (base included)" : " (no base image yet: it is built on first use, or `capsule image build base`)");
		json_object_set_new(o, "images", json_pack("{s:I, s:b, s:n}", "count", (json_int_t)nimg, "base",
							   have_base, "error"));
		for (size_t i = 0; i < nimg; i++)
			cap_image_fini(&imgs[i]);
		free(imgs);
	}

	fprintf(t, "%s\n", problems ? "status:     NOT READY (see MISSING above)" : "status:     ready");
	json_object_set_new(o, "problems", json_integer(problems));
	json_object_set_new(o, "ok", json_boolean(problems == 0));
	if (json) {
		fclose(t);
		int rc = cap_cli_json_out(o);
		return rc ? rc : problems ? 1 : 0;
	}
	json_decref(o);
	return problems ? 1 : 0;
}
