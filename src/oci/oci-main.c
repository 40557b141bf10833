/* The OCI runtime's command line (docs/oci.md). Being written. */
#include <stdio.h>

#include "cli.h"
#include "oci.h"

int cap_cli_oci(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	fputs("capsule oci: not built yet\n", stderr);
	return 1;
}
