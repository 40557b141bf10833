/* capsule-oci start: open the gate of a created container's monitor. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "oci-int.h"

int cap_oci_cmd_start(int argc, char **argv)
{
	int rc;
	const char *id = cap_oci_one_id(argc, argv, "Usage: capsule-oci start ID\n\nStart the created container's process.\n", &rc);
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	char ans[600];
	if (!id)
		return rc;
	if (cap_oci_state_load(id, &st, &err) < 0)
		return cap_oci_fail(&err);
	if (strcmp(st.status, "stopped") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that has stopped");
	else if (strcmp(st.status, "creating") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that is still being created");
	else if (strcmp(st.status, "created") != 0)
		cap_err_set(&err, EINVAL, "cannot start an already running container");
	else
		cap_oci_call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, "start", ans, sizeof(ans), CAP_OCI_START_TIMEOUT_MS, &err);
	cap_oci_state_fini(&st);
	return err.code ? cap_oci_fail(&err) : 0;
}
