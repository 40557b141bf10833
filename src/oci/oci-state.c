/* capsule-oci state: a container's state as runc prints it. */
#include <jansson.h>

#include "oci-int.h"

int oci_state(int argc, char **argv)
{
	int rc;
	const char *id = one_id(argc, argv, "Usage: capsule-oci state ID\n\nPrint the container's state as JSON.\n", &rc);
	struct ostate st;
	struct cap_err err = { 0 };
	if (!id)
		return rc;
	if (state_load(id, &st, &err) < 0)
		return fail(&err);
	rc = print_json(state_json(&st), JSON_INDENT(2));
	ostate_fini(&st);
	return rc;
}
