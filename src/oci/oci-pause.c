/* capsule-oci pause and resume: freeze or continue the container's VM. */
#include <errno.h>
#include <string.h>

#include "oci-int.h"

static int pause_resume(int argc, char **argv, bool pause)
{
	int rc;
	const char *id = cap_oci_one_id(argc, argv,
				pause ? "Usage: capsule-oci pause ID\n\nFreeze the container's VM.\n"
				      : "Usage: capsule-oci resume ID\n\nContinue the container's frozen VM.\n",
				&rc);
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (!id)
		return rc;
	if (cap_oci_state_load(id, &st, &err) < 0)
		return cap_oci_fail(&err);
	if (strcmp(cap_oci_jstr(st.j, "podRole"), "container") == 0)
		cap_err_set(&err, EOPNOTSUPP, "container %s is a pod's: its VM is the pod's, paused and resumed only as a whole (pause the pod's sandbox container)", id);
	else if (pause && strcmp(st.status, "running") != 0)
		cap_err_set(&err, EINVAL, strcmp(st.status, "paused") == 0 ? "container already paused" : "container not running");
	else if (!pause && strcmp(st.status, "paused") != 0)
		cap_err_set(&err, EINVAL, "container not paused");
	else
		cap_oci_vm_op(st.sandbox, pause, &err);
	cap_oci_state_fini(&st);
	return err.code ? cap_oci_fail(&err) : 0;
}

int cap_oci_cmd_pause(int argc, char **argv) { return pause_resume(argc, argv, true); }
int cap_oci_cmd_resume(int argc, char **argv) { return pause_resume(argc, argv, false); }
