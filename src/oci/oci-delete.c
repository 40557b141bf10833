/* capsule-oci delete: end a container's monitors and remove its sandbox,
 * cgroups and state directory. */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "named.h"
#include "oci-int.h"
#include "paths.h"
#include "util.h"

/* Whether process pid (of that start time) is gone within ms. */
static bool gone_within(pid_t pid, unsigned long long start, int ms)
{
	int64_t until = cap_now_ms() + ms;
	while (cap_oci_proc_same(pid, start) && cap_now_ms() < until)
		usleep(10000);
	return !cap_oci_proc_same(pid, start);
}

/* Kill a monitor we may not wait for (the engine is its parent). */
static void end_process(pid_t pid, unsigned long long start, int grace_ms)
{
	if (!gone_within(pid, start, grace_ms)) {
		kill(pid, SIGKILL);
		gone_within(pid, start, 2000);
	}
}

static void cgroups_load(json_t *st, struct cap_oci_cgroups *cg)
{
	memset(cg, 0, sizeof(*cg));
	size_t i;
	json_t *e;
	json_array_foreach(json_object_get(st, "cgroups"), i, e) {
		if (cg->n == CAP_OCI_CGROUP_MAX || !*cap_oci_jstr(e, "dir"))
			break;
		struct cap_oci_cgroup *g = &cg->h[cg->n++];
		g->dir = xstrdup(cap_oci_jstr(e, "dir"));
		g->made = *cap_oci_jstr(e, "made") ? xstrdup(cap_oci_jstr(e, "made")) : NULL;
		g->ino = strtoull(cap_oci_jstr(e, "ino"), NULL, 10);
		g->made_ino = strtoull(cap_oci_jstr(e, "madeIno"), NULL, 10);
	}
}

int cap_oci_cmd_delete(int argc, char **argv)
{
	static const char usage[] =
		"Usage: capsule-oci delete [--force] ID\n\n"
		"Remove the container: its sandbox (VM and disks), cgroup and state. A running\n"
		"one only with --force (it is killed). A container already gone is no error.\n";
	bool force = false;
	int rc = cap_oci_flag_verb(argc, argv, "force", 'f', usage, &force);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1) {
		cap_oci_error("delete needs exactly one container id");
		return 1;
	}
	const char *id = argv[optind];
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (cap_oci_state_load(id, &st, &err) < 0) {
		/* A create that died before its state was written leaves a
		 * directory (and maybe a sandbox) nothing else knows. */
		_cleanup_free_ char *dir = cap_oci_dir(id);
		struct stat sb;
		if (cap_oci_id_ok(id) && stat(dir, &sb) == 0) {
			char name[CAP_NAME_MAX + 1];
			cap_oci_sandbox_name(id, name);
			if (cap_oci_destroy(dir, name, NULL, &err) < 0)
				return cap_oci_fail(&err);
		}
		return 0;
	}
	bool creating = strcmp(st.status, "creating") == 0;
	/* A pod's container: its VM is the pod's, which stays. */
	bool member = strcmp(cap_oci_jstr(st.j, "podRole"), "container") == 0;
	if (!force && (creating || strcmp(st.status, "running") == 0 || strcmp(st.status, "paused") == 0)) {
		cap_err_set(&err, EBUSY, "cannot delete container %s that is not stopped: %s", id, st.status);
		cap_oci_state_fini(&st);
		return cap_oci_fail(&err);
	}
	char ans[600];
	pid_t pids[256];
	unsigned long long starts[256];
	size_t n = cap_oci_exec_monitors(st.dir, pids, starts, 256);
	if (creating) {
		/* Its create is stopped where it is; what it made goes below. */
		pid_t creator = (pid_t)json_integer_value(json_object_get(st.j, "creator"));
		end_process(creator, strtoull(cap_oci_jstr(st.j, "creatorStart"), NULL, 10), 0);
		end_process(st.pid, st.start, 0);
	} else if (strcmp(st.status, "stopped") != 0) {
		struct cap_err e2 = { 0 };
		if (strcmp(st.status, "paused") == 0 && !member) {
			/* A frozen guest cannot die: the sandbox goes as a whole. */
			cap_named_kill(st.sandbox, &e2);
		} else if (cap_oci_call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, "signal 9 all", ans, sizeof(ans),
				CAP_OCI_DELETE_TIMEOUT_MS, &e2) < 0 &&
			   cap_oci_proc_same(st.pid, st.start)) {
			/* A monitor that does not answer (stopped, stuck) is not
			 * waited for: it and the sandbox it serves are killed. */
			kill(st.pid, SIGKILL);
			if (!member)
				cap_named_kill(st.sandbox, &e2);
		}
		end_process(st.pid, st.start, 3000);
	} else {
		/* Stopped: its monitor may still be stopping the VM (the exit
		 * is written) or be one whose create died (it is not). */
		end_process(st.pid, st.start, cap_oci_exists_at(st.dir, CAP_OCI_EXIT) ? 3000 : 0);
	}
	for (size_t i = 0; i < n; i++)
		end_process(pids[i], starts[i], 0);
	struct cap_oci_cgroups cg;
	cgroups_load(st.j, &cg);
	if (member) {
		/* Its processes, cgroup and root in the pod's VM, when that
		 * still runs (it went with them otherwise). */
		struct cap_err e3 = { 0 };
		if (cap_oci_pod_remove(st.sandbox, cap_oci_jstr(st.j, "ctrName"), &e3) < 0)
			cap_oci_log_only("warning", e3.msg);
	}
	rc = cap_oci_destroy(st.dir, member ? NULL : st.sandbox, &cg, &err) < 0 ? cap_oci_fail(&err) : 0;
	cap_oci_cgroups_fini(&cg);
	cap_oci_state_fini(&st);
	return rc;
}
