/* capsule-oci state: a container's state as runc prints it. */
#include <jansson.h>

#include "oci-int.h"

int cap_oci_cmd_state(int argc, char **argv)
{
	int rc;
	const char *id = cap_oci_one_id(argc, argv, "Usage: capsule-oci state ID\n\nPrint the container's state as JSON.\n", &rc);
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (!id)
		return rc;
	if (cap_oci_state_load(id, &st, &err) < 0)
		return cap_oci_fail(&err);
	rc = cap_oci_print_json(cap_oci_state_json(&st), JSON_INDENT(2));
	cap_oci_state_fini(&st);
	return rc;
}
