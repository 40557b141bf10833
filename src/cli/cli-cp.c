/* Being written (issue 16). */
#include "cli.h"

int cap_cli_cp(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	cap_cli_error("cp: not built yet");
	return 1;
}
