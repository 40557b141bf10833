/* capsule image: build, import, ls, inspect, rm, prune. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "named.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule image COMMAND\n"
	"\n"
	"  build base|python          Build a named image (python runs debootstrap\n"
	"                             from this machine's Debian mirror; needs root)\n"
	"  import PATH [--name NAME]  Import a directory, a tar archive (plain, gzip,\n"
	"                             zstd), an OCI image layout or a `docker save`\n"
	"                             archive; layer whiteouts are applied\n"
	"  ls                         List images\n"
	"  inspect IMAGE              Show an image's manifest and check its digest\n"
	"  rm IMAGE                   Remove an image no sandbox uses\n"
	"  prune                      Remove every image no sandbox uses\n"
	"\n"
	"IMAGE is a name or sha256:DIGEST (12 or more hex digits).\n";

static void print_image(const struct cap_image *img)
{
	char when[64];
	time_t t = (time_t)img->created;
	strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&t));
	printf("name:     %s\n", img->owned_name ? img->owned_name : "(none)");
	printf("digest:   %s\n", img->digest);
	printf("size:     %llu bytes\n", (unsigned long long)img->size);
	printf("created:  %s\n", when);
	printf("source:   %s\n", img->owned_source);
	printf("file:     %s\n", img->owned_path);
}

static int done(int r, struct cap_err *err, struct cap_image *img, const char *verb)
{
	cap_cli_progress_end();
	if (r < 0) {
		cap_cli_error("%s", err->msg);
		return CAP_EXIT_FAILURE;
	}
	printf("%s %s %s\n", verb, img->owned_name ? img->owned_name : "image", img->digest);
	cap_image_fini(img);
	return 0;
}

int cap_cli_image(int argc, char **argv)
{
	struct cap_err err = { 0 };
	struct cap_image img = { 0 };

	if (argc < 2 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
		fputs(usage, argc < 2 ? stderr : stdout);
		return argc < 2 ? 2 : 0;
	}
	const char *verb = argv[1];
	if (strcmp(verb, "build") == 0 && argc == 3) {
		int r = cap_store_image_build(argv[2], cap_cli_progress, "image build", &img, &err);
		return done(r, &err, &img, "built");
	}
	if (strcmp(verb, "import") == 0 && argc >= 3) {
		static const struct option opts[] = { { "name", required_argument, NULL, 'n' }, { 0 } };
		const char *name = NULL;
		int c;
		optind = 2;
		while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
			if (c != 'n') {
				fputs(usage, stderr);
				return 2;
			}
			name = optarg;
		}
		if (optind != argc - 1) {
			fputs(usage, stderr);
			return 2;
		}
		int r = cap_store_image_import(argv[optind], name, cap_cli_progress, "image import", &img, &err);
		return done(r, &err, &img, "imported");
	}
	if (strcmp(verb, "ls") == 0 && argc == 2) {
		struct cap_image *v;
		size_t n;
		cap_store_image_list(&v, &n, &err);
		printf("%-16s %-20s %10s  %s\n", "NAME", "DIGEST", "SIZE", "SOURCE");
		for (size_t i = 0; i < n; i++) {
			printf("%-16s %.19s %9.1fM  %s\n", v[i].owned_name ? v[i].owned_name : "-",
			       v[i].digest, v[i].size / 1048576.0, v[i].owned_source);
			cap_image_fini(&v[i]);
		}
		free(v);
		return 0;
	}
	if (strcmp(verb, "inspect") == 0 && argc == 3) {
		if (cap_store_image_find(argv[2], &img, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		print_image(&img);
		int r = cap_store_image_verify(&img, &err);
		printf("verified: %s\n", r == 0 ? "yes, the bytes match the digest" : "NO");
		cap_image_fini(&img);
		if (r < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		return 0;
	}
	if (strcmp(verb, "rm") == 0 && argc == 3) {
		if (cap_store_image_remove(argv[2], cap_named_uses_image, NULL, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		return 0;
	}
	if (strcmp(verb, "prune") == 0 && argc == 2) {
		size_t removed = 0;
		int r = cap_store_image_prune(cap_named_uses_image, NULL, &removed, &err);
		printf("removed %zu image(s)\n", removed);
		if (r < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		return 0;
	}
	fputs(usage, stderr);
	return 2;
}
