/* What the CLI prints besides errors: progress lines and JSON. */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <unistd.h>

#include "cli.h"

bool cap_cli_quiet;

static bool progress_open;

void cap_cli_progress(void *ud, const char *line)
{
	const char *label = ud ? ud : "capsule";
	if (cap_cli_quiet)
		return;
	if (isatty(2)) {
		/* One line, rewritten in place, cut to a terminal width. */
		fprintf(stderr, "\r\033[K%s: %.70s", label, line);
		progress_open = true;
	} else {
		fprintf(stderr, "%s: %s\n", label, line);
	}
}

void cap_cli_progress_end(void)
{
	if (progress_open)
		fputc('\n', stderr);
	progress_open = false;
}

int cap_cli_json_out(struct json_t *v)
{
	int r = json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(v);
	if (r < 0 || fputc('\n', stdout) == EOF || fflush(stdout) == EOF) {
		cap_cli_error("cannot write JSON to stdout");
		return CAP_EXIT_FAILURE;
	}
	return 0;
}
