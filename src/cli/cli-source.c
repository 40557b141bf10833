/* capsule source: check or build a public data projection by hand, as
 * `create --source` and `run --source` do. */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "store.h"

static const char usage[] =
	"Usage: capsule source check DIR\n"
	"       capsule source build DIR FILE\n"
	"\n"
	"check: validate DIR as public data (the rules of `capsule create --help`)\n"
	"       and print its entry count, size and fingerprint.\n"
	"build: validate DIR and copy it into the read-only image FILE (erofs).\n";

int cap_cli_source(int argc, char **argv)
{
	struct cap_projection_limits lim;
	struct cap_projection_info info;
	struct cap_err err = { 0 };
	int r;

	if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0)) {
		fputs(usage, stdout);
		return 0;
	}
	bool check = argc == 3 && strcmp(argv[1], "check") == 0;
	bool build = argc == 4 && strcmp(argv[1], "build") == 0;
	if (!check && !build) {
		fputs(usage, stderr);
		return 2;
	}
	if ((r = cap_projection_limits_init(&lim, &err)) == 0)
		r = check ? cap_projection_scan(argv[2], &lim, &info, &err)
			  : cap_projection_build(argv[2], &lim, argv[3], &info, &err);
	if (r < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	printf("%s: %" PRIu64 " entries, %" PRIu64 " bytes, fingerprint %s\n", argv[2],
	       info.entries, info.bytes, info.fingerprint);
	return 0;
}
