/* Being written (issue 16). */
#include "cli.h"

int cap_cli_diff(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	cap_cli_error("diff: not built yet");
	return 1;
}

int cap_cli_merge(int argc, char **argv)
{
	(void)argc;
	(void)argv;
	cap_cli_error("merge: not built yet");
	return 1;
}
