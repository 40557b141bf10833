/* capsule logs: being written this session (issue 17); refuses until then. */
#include "cli.h"

int cap_cli_logs(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	cap_cli_error("'logs' is not built yet");
	return CAP_EXIT_FAILURE;
}
