/* capsule-oci start: open the gate of a created container's monitor. */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "oci-int.h"

int oci_start(int argc, char **argv)
{
	int rc;
	const char *id = one_id(argc, argv, "Usage: capsule-oci start ID\n\nStart the created container's process.\n", &rc);
	struct ostate st;
	struct cap_err err = { 0 };
	char ans[600];
	if (!id)
		return rc;
	if (state_load(id, &st, &err) < 0)
		return fail(&err);
	if (strcmp(st.status, "stopped") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that has stopped");
	else if (strcmp(st.status, "creating") == 0)
		cap_err_set(&err, EINVAL, "cannot start a container that is still being created");
	else if (strcmp(st.status, "created") != 0)
		cap_err_set(&err, EINVAL, "cannot start an already running container");
	else
		call(st.dir, NULL, CAP_OCI_MONITOR_SOCK, "start", ans, sizeof(ans), START_TIMEOUT_MS, &err);
	ostate_fini(&st);
	return err.code ? fail(&err) : 0;
}
