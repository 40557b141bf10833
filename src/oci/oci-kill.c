/* capsule-oci kill: a signal to the container's process through its
 * monitor, with --all to its execs' too. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "named.h"
#include "oci-int.h"

int cap_oci_cmd_kill(int argc, char **argv)
{
	static const char usage[] =
		"Usage: capsule-oci kill [--all] ID [SIGNAL]\n\n"
		"Send SIGNAL (default SIGTERM; a number or a name) to the container's process,\n"
		"or with --all to every process of the container.\n";
	bool all = false;
	int rc = cap_oci_flag_verb(argc, argv, "all", 'a', usage, &all);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1 && optind != argc - 2) {
		cap_oci_error("kill needs a container id and at most one signal");
		return 1;
	}
	struct cap_err err = { 0 };
	int sig = cap_oci_signal_parse(optind + 1 < argc ? argv[optind + 1] : "SIGTERM", &err);
	if (sig < 0)
		return cap_oci_fail(&err);
	struct cap_oci_state st;
	if (cap_oci_state_load(argv[optind], &st, &err) < 0)
		return cap_oci_fail(&err);
	char line[64], ans[600];
	snprintf(line, sizeof(line), "signal %d %s", sig, all ? "all" : "process");
	if (strcmp(st.status, "creating") == 0) {
		cap_err_set(&err, EINVAL, "cannot signal a container that is still being created");
		goto out;
	}
	if (strcmp(st.status, "stopped") == 0) {
		/* Its monitor is gone; a sandbox left running is stopped by
		 * SIGKILL (its VM must not outlive the container). */
		struct cap_named_status ns;
		bool member = strcmp(cap_oci_jstr(st.j, "podRole"), "container") == 0;
		if (sig == SIGKILL && !member && cap_named_status(st.sandbox, &ns, &err) == 0 &&
		    ns.state != CAP_NAMED_STOPPED && !cap_oci_exists_at(st.dir, CAP_OCI_EXIT))
			cap_named_kill(st.sandbox, &err);
		else
			cap_err_set(&err, ESRCH, "container not running");
		goto out;
	}
	bool paused = strcmp(st.status, "paused") == 0;
	int r = cap_oci_call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, line, ans, sizeof(ans), CAP_OCI_KILL_TIMEOUT_MS, &err);
	if (r < 0 && err.code != EINVAL) {
		/* "not running" (runc's words) only when the monitor is gone;
		 * one that is there and does not answer is its own error. */
		if (r == -ENOENT || r == -ECONNREFUSED || !cap_oci_proc_same(st.pid, st.start) ||
		    cap_oci_exists_at(st.dir, CAP_OCI_EXIT))
			cap_err_set(&err, ESRCH, "container not running");
		else
			cap_err_prefix(&err, "cannot signal the container (its monitor is process %d)", (int)st.pid);
		goto out;
	}
	if (r < 0)
		goto out;
	if (all) {
		pid_t pids[256];
		unsigned long long starts[256];
		size_t n = cap_oci_exec_monitors(st.dir, pids, starts, 256);
		for (size_t i = 0; i < n; i++) {
			struct cap_err e2 = { 0 };
			char sock[64];
			snprintf(sock, sizeof(sock), CAP_OCI_EXEC_SOCK_FMT, (int)pids[i], starts[i]);
			cap_oci_call(st.dir, CAP_OCI_EXEC_DIR, sock, line, ans, sizeof(ans), CAP_OCI_KILL_TIMEOUT_MS, &e2);
		}
	}
	/* A signal to a paused container waits for resume, as in runc's
	 * frozen cgroup; SIGKILL does not (runc thaws for it): the VM goes on
	 * so that the process dies and its status comes back. */
	if (paused && sig == SIGKILL) {
		struct cap_err e2 = { 0 };
		if (cap_oci_vm_op(st.sandbox, false, &e2) < 0 &&
		    strcmp(cap_oci_jstr(st.j, "podRole"), "container") != 0 && cap_named_kill(st.sandbox, &err) < 0)
			cap_err_prefix(&err, "cannot resume the paused container for SIGKILL (%.200s), nor stop "
				       "its sandbox", e2.msg);
	}
out:
	cap_oci_state_fini(&st);
	return err.code ? cap_oci_fail(&err) : 0;
}
