/* capsule image: build, pull, check, outdated, import, ls, inspect, rm, prune. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "jsonrpc.h"
#include "serve.h"
#include "named.h"
#include "store.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule image COMMAND\n"
	"\n"
	"  build base|python [-q]     Build a named image (python runs debootstrap\n"
	"                             from this machine's Debian mirror; needs root)\n"
	"  pull REF [--name NAME] [--platform OS/ARCH] [--insecure] [--timeout S] [-q]\n"
	"                             Pull an image from a registry through skopeo\n"
	"                             (its auth files; digests verified): REF is\n"
	"                             HOST/REPO:TAG, HOST/REPO@sha256:DIGEST or a\n"
	"                             Docker Hub name like python:3.12-slim.\n"
	"                             --platform defaults to linux/amd64; registries\n"
	"                             on localhost or 127.0.0.0/8 are spoken to over\n"
	"                             plain HTTP, others only with --insecure\n"
	"  import PATH [--name NAME] [-q]\n"
	"                             Import a directory, a tar archive (plain, gzip,\n"
	"                             zstd), an OCI image layout or a `docker save`\n"
	"                             archive; layer whiteouts are applied\n"
	"  check REF [--platform OS/ARCH] [--insecure] [--timeout S] [--json]\n"
	"                             Resolve REF and read its manifest and config\n"
	"                             from the registry without pulling a layer:\n"
	"                             platform (through an index), media types,\n"
	"                             layers and their size, entrypoint, cmd, env\n"
	"                             (--timeout defaults to 10 s)\n"
	"  outdated [IMAGE] [--insecure] [--timeout S] [--json]\n"
	"                             For each pulled tag (or IMAGE's), whether the\n"
	"                             registry's manifest for the platform moved on:\n"
	"                             up to date, outdated, or unknown and why; all\n"
	"                             within --timeout (default 10 s)\n"
	"  ls [--json]                List images\n"
	"  inspect IMAGE [--json]     Show an image's manifest and check its digest\n"
	"  rm IMAGE                   Remove an image no sandbox uses\n"
	"  prune                      Remove every image no sandbox uses\n"
	"\n"
	"IMAGE is a name (name:NAME when it is also a pulled reference),\n"
	"sha256:DIGEST (12 or more hex digits), a reference as pulled (REPO:TAG)\n"
	"or REPO@sha256:DIGEST with the registry or OCI manifest digest a pull\n"
	"recorded. Imports and pulls drop device nodes, FIFOs and sockets\n"
	"(listed in the summary). See docs/images.md.\n";

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
	if (img->owned_reference || img->owned_oci_digest) {
		printf("reference: %s\n", img->owned_reference ? img->owned_reference : "(none: moved to another image)");
		printf("oci digest: %s\n", img->owned_oci_digest ? img->owned_oci_digest : "(none)");
		if (img->owned_registry_digest)
			printf("registry digest: %s\n", img->owned_registry_digest);
	}
	if (img->owned_pinned_digest)
		printf("pinned digest: %s\n", img->owned_pinned_digest);
	printf("file:     %s\n", img->owned_path);
}

/* The JSON shape of an image (docs/images.md; fields are only added). */
static json_t *image_json(const struct cap_image *img)
{
	json_t *o = json_object();
	json_object_set_new(o, "name", img->owned_name ? json_string(img->owned_name) : json_null());
	json_object_set_new(o, "digest", json_string(img->digest));
	json_object_set_new(o, "size", json_integer((json_int_t)img->size));
	json_object_set_new(o, "created", json_integer((json_int_t)img->created));
	json_object_set_new(o, "source", json_string(img->owned_source ? img->owned_source : ""));
	json_object_set_new(o, "reference", img->owned_reference ? json_string(img->owned_reference) : json_null());
	json_object_set_new(o, "oci_digest", img->owned_oci_digest ? json_string(img->owned_oci_digest) : json_null());
	json_object_set_new(o, "pinned_digest", img->owned_pinned_digest ? json_string(img->owned_pinned_digest) : json_null());
	json_object_set_new(o, "file", json_string(img->owned_path));
	json_object_set_new(o, "registry_digest", img->owned_registry_digest ? json_string(img->owned_registry_digest) : json_null());
	json_t *origins = json_array();
	for (size_t i = 0; i < img->n_origins; i++) {
		const struct cap_image_origin *g = &img->owned_origins[i];
		json_t *x = json_object();
		json_object_set_new(x, "reference", json_string(g->owned_reference));
		json_object_set_new(x, "oci_digest", g->owned_oci_digest ? json_string(g->owned_oci_digest) : json_null());
		json_object_set_new(x, "registry_digest", g->owned_registry_digest ? json_string(g->owned_registry_digest) : json_null());
		json_object_set_new(x, "pinned_digest", g->owned_pinned_digest ? json_string(g->owned_pinned_digest) : json_null());
		json_object_set_new(x, "platform_digest", g->owned_platform_digest ? json_string(g->owned_platform_digest) : json_null());
		json_object_set_new(x, "platform", g->owned_platform ? cap_json_text(g->owned_platform) : json_null());
		json_object_set_new(x, "pulled", json_integer((json_int_t)g->pulled));
		json_object_set_new(x, "current", json_boolean(g->current));
		json_array_append_new(origins, x);
	}
	json_object_set_new(o, "origins", origins);
	return o;
}

static int done(int r, struct cap_err *err, struct cap_image *img, const char *verb,
		const struct cap_import_report *rep)
{
	cap_cli_progress_end();
	if (r < 0) {
		cap_cli_error("%s", err->msg);
		return CAP_EXIT_FAILURE;
	}
	printf("%s %s %s", verb, img->owned_name ? img->owned_name : img->owned_reference ? img->owned_reference : "image",
	       img->digest);
	if (rep && rep->dropped) {
		_cleanup_free_ char *sum = cap_import_report_summary(rep);
		printf(" (%s)", sum);
	}
	putchar('\n');
	if (img->owned_oci_digest && strcmp(verb, "pulled") == 0)
		printf("oci digest: %s\n", img->owned_oci_digest);
	if (img->owned_registry_digest && strcmp(verb, "pulled") == 0)
		printf("registry digest: %s\n", img->owned_registry_digest);
	cap_image_fini(img);
	return 0;
}

static bool wants_help(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--") == 0)
			break;
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0)
			return true;
	}
	return false;
}

static int bad_usage(void)
{
	fputs(usage, stderr);
	return CAP_EXIT_USAGE;
}

enum { OPT_PLATFORM = 300, OPT_INSECURE, OPT_TIMEOUT, OPT_JSON };

static int image_pull(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "name", required_argument, NULL, 'n' },
		{ "platform", required_argument, NULL, OPT_PLATFORM },
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "quiet", no_argument, NULL, 'q' },
		{ 0 },
	};
	struct cap_pull_opts po = { .progress = cap_cli_progress, .ud = "image pull" };
	struct cap_err err = { 0 };
	struct cap_image img = { 0 };
	struct cap_import_report rep = { 0 };
	unsigned long secs;
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "n:q", opts, NULL)) != -1) {
		switch (c) {
		case 'n': po.name = optarg; break;
		case 'q': cap_cli_quiet = true; break;
		case OPT_PLATFORM: po.platform = optarg; break;
		case OPT_INSECURE: po.insecure = true; break;
		case OPT_TIMEOUT:
			if (cap_cli_parse_uint(optarg, 1, 86400, &secs) < 0) {
				cap_cli_error("--timeout takes seconds, 1 to 86400, not '%s'", optarg);
				return CAP_EXIT_USAGE;
			}
			po.timeout_s = (unsigned)secs;
			break;
		default: return bad_usage();
		}
	}
	if (optind != argc - 1)
		return bad_usage();
	int r = cap_store_image_pull(argv[optind], &po, &img, &rep, &err);
	if (r == -EINVAL) {
		cap_cli_progress_end();
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_USAGE;
	}
	return done(r, &err, &img, "pulled", &rep);
}

/* "--timeout S": 1 to 3600 seconds; false with the error said. */
static bool timeout_arg(const char *arg, unsigned *out)
{
	unsigned long secs;
	if (cap_cli_parse_uint(arg, 1, 3600, &secs) < 0) {
		cap_cli_error("--timeout takes seconds, 1 to 3600, not '%s'", arg);
		return false;
	}
	*out = (unsigned)secs;
	return true;
}

static void print_list(const char *label, bool has, char *const *v, size_t n)
{
	printf("%-16s ", label);
	if (!has) {
		puts("(none)");
		return;
	}
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, cap_json_text(v[i]));
	char *t = json_dumps(a, JSON_COMPACT);
	puts(t ? t : "?");
	free(t);
	json_decref(a);
}

static void print_bytes(uint64_t b)
{
	if (b >= 1048576)
		printf("%.1f MiB (%llu bytes)", (double)b / 1048576.0, (unsigned long long)b);
	else
		printf("%llu bytes", (unsigned long long)b);
}

static void print_check(const struct cap_image_check *c)
{
	const struct cap_reg_manifest *m = &c->manifest;
	const struct cap_reg_config *g = &c->config;
	printf("%-16s %s\n", "reference:", c->owned_reference);
	printf("%-16s %s (%s)\n", "registry digest:", c->registry_digest, c->owned_registry_media_type);
	if (c->index) {
		printf("%-16s ", "platforms:");
		for (size_t i = 0; i < c->n_platforms; i++)
			printf("%s%s", i ? ", " : "", c->owned_platforms[i]);
		putchar('\n');
	}
	printf("%-16s %s\n", "platform:", c->platform);
	printf("%-16s %s (%s)\n", "manifest digest:", c->platform_digest, m->owned_media_type);
	printf("%-16s %s (%s)\n", "config digest:", c->config_digest, m->owned_config_media_type);
	printf("%-16s %s/%s%s%s\n", "os/arch:", g->owned_os, g->owned_arch, g->owned_variant ? "/" : "",
	       g->owned_variant ? g->owned_variant : "");
	printf("%-16s %zu, ", "layers:", m->n_layers);
	print_bytes(m->layers_size);
	puts(" compressed");
	print_list("entrypoint:", g->has_entrypoint, g->owned_entrypoint, g->n_entrypoint);
	print_list("cmd:", g->has_cmd, g->owned_cmd, g->n_cmd);
	printf("%-16s %s\n", "working dir:", g->owned_workdir ? g->owned_workdir : "(none)");
	printf("%-16s %s\n", "user:", g->owned_user ? g->owned_user : "(none)");
	if (g->n_env)
		puts("env:");
	else
		printf("%-16s (none)\n", "env:");
	for (size_t i = 0; i < g->n_env; i++)
		printf("  %s\n", g->owned_env[i]);
}

static int image_check(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "platform", required_argument, NULL, OPT_PLATFORM },
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "json", no_argument, NULL, OPT_JSON },
		{ 0 },
	};
	struct cap_check_opts co = { 0 };
	struct cap_image_check c;
	struct cap_err err = { 0 };
	bool json = false;
	int k;
	optind = 2;
	while ((k = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (k) {
		case OPT_PLATFORM: co.platform = optarg; break;
		case OPT_INSECURE: co.insecure = true; break;
		case OPT_JSON: json = true; break;
		case OPT_TIMEOUT:
			if (!timeout_arg(optarg, &co.timeout_s))
				return CAP_EXIT_USAGE;
			break;
		default: return bad_usage();
		}
	}
	if (optind != argc - 1)
		return bad_usage();
	int r = cap_store_image_check(argv[optind], &co, &c, &err);
	if (r < 0) {
		cap_cli_error("%s", err.msg);
		return r == -EINVAL ? CAP_EXIT_USAGE : CAP_EXIT_FAILURE;
	}
	if (json) {
		r = cap_cli_json_out(cap_rpc_image_check_json(&c));
	} else {
		print_check(&c);
		r = 0;
	}
	cap_image_check_fini(&c);
	return r;
}

static const char *state_word(enum cap_outdated_state s)
{
	return s == CAP_OUTDATED_UP_TO_DATE ? "up_to_date" : s == CAP_OUTDATED_OUTDATED ? "outdated" : "unknown";
}

static json_t *outdated_json(const struct cap_outdated *o)
{
	return json_pack("{s:o, s:s, s:o, s:s, s:o, s:o, s:o, s:o}", "reference", cap_json_text(o->owned_reference),
			 "image", o->image, "name", o->owned_name ? cap_json_text(o->owned_name) : json_null(),
			 "state", state_word(o->state),
			 "recorded_digest", o->owned_recorded ? json_string(o->owned_recorded) : json_null(),
			 "current_digest", o->owned_current ? json_string(o->owned_current) : json_null(),
			 "reason", o->reason ? json_string(o->reason) : json_null(),
			 "message", o->owned_message ? cap_json_text(o->owned_message) : json_null());
}

static void print_outdated(const struct cap_outdated *o)
{
	printf("%s: ", o->owned_reference);
	if (o->state == CAP_OUTDATED_UP_TO_DATE) {
		printf("up to date (%s)\n", o->owned_current);
	} else if (o->state == CAP_OUTDATED_OUTDATED) {
		printf("outdated: pulled %s, the registry now has %s; `capsule image pull %s` gets it\n",
		       o->owned_recorded, o->owned_current, o->owned_reference);
	} else if (strcmp(o->reason, "not_recorded") == 0) {
		puts("unknown (pulled before digests were recorded): pull it again to record one");
	} else {
		/* The first line of the reason: the rest is skopeo's. */
		const char *nl = strchr(o->owned_message, '\n');
		printf("unknown (%s): %.*s\n", o->reason, nl ? (int)(nl - o->owned_message) : (int)strlen(o->owned_message),
		       o->owned_message);
	}
}

static int image_outdated(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "insecure", no_argument, NULL, OPT_INSECURE },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "json", no_argument, NULL, OPT_JSON },
		{ 0 },
	};
	struct cap_check_opts co = { 0 };
	struct cap_err err = { 0 };
	bool json = false;
	int k;
	optind = 2;
	while ((k = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (k) {
		case OPT_INSECURE: co.insecure = true; break;
		case OPT_JSON: json = true; break;
		case OPT_TIMEOUT:
			if (!timeout_arg(optarg, &co.timeout_s))
				return CAP_EXIT_USAGE;
			break;
		default: return bad_usage();
		}
	}
	if (optind < argc - 1)
		return bad_usage();
	const char *image = optind == argc - 1 ? argv[optind] : NULL;
	struct cap_outdated *v;
	size_t n;
	if (cap_store_image_outdated(image, &co, &v, &n, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	json_t *arr = json ? json_array() : NULL;
	for (size_t i = 0; i < n; i++) {
		if (json)
			json_array_append_new(arr, outdated_json(&v[i]));
		else
			print_outdated(&v[i]);
		cap_outdated_fini(&v[i]);
	}
	free(v);
	if (n == 0 && !json && image)
		cap_cli_error("%s answers to no registry tag (pulled by digest, imported, built, or its tags moved to other images): nothing to compare", image);
	else if (n == 0 && !json)
		cap_cli_error("no image answers to a registry tag (none pulled by tag, or their tags moved to other images): nothing to compare");
	return json ? cap_cli_json_out(arr) : 0;
}

/* Parse "[--json] [-q]" and the given number of operands after the verb. */
static int verb_args(int argc, char **argv, int operands, bool *json)
{
	static const struct option opts[] = {
		{ "json", no_argument, NULL, OPT_JSON },
		{ "quiet", no_argument, NULL, 'q' },
		{ 0 },
	};
	int c;
	optind = 2;
	while ((c = getopt_long(argc, argv, "q", opts, NULL)) != -1) {
		if (c == OPT_JSON && json)
			*json = true;
		else if (c == 'q')
			cap_cli_quiet = true;
		else
			return -1;
	}
	return argc - optind == operands ? optind : -1;
}

int cap_cli_image(int argc, char **argv)
{
	struct cap_err err = { 0 };
	struct cap_image img = { 0 };
	struct cap_import_report rep = { 0 };
	bool json = false;
	int at;

	if (argc < 2)
		return bad_usage();
	if (wants_help(argc, argv)) {
		fputs(usage, stdout);
		return 0;
	}
	const char *verb = argv[1];
	if (strcmp(verb, "build") == 0) {
		if ((at = verb_args(argc, argv, 1, NULL)) < 0)
			return bad_usage();
		int r = cap_store_image_build(argv[at], cap_cli_progress, "image build", &img, &err);
		return done(r, &err, &img, "built", NULL);
	}
	if (strcmp(verb, "pull") == 0)
		return image_pull(argc, argv);
	if (strcmp(verb, "check") == 0)
		return image_check(argc, argv);
	if (strcmp(verb, "outdated") == 0)
		return image_outdated(argc, argv);
	if (strcmp(verb, "import") == 0 && argc >= 3) {
		static const struct option opts[] = {
			{ "name", required_argument, NULL, 'n' },
			{ "quiet", no_argument, NULL, 'q' },
			{ 0 },
		};
		struct cap_import_opts io = { .progress = cap_cli_progress, .ud = "image import" };
		int c;
		optind = 2;
		while ((c = getopt_long(argc, argv, "n:q", opts, NULL)) != -1) {
			if (c == 'n')
				io.name = optarg;
			else if (c == 'q')
				cap_cli_quiet = true;
			else
				return bad_usage();
		}
		if (optind != argc - 1)
			return bad_usage();
		int r = cap_store_image_import_with(argv[optind], &io, &img, &rep, &err);
		return done(r, &err, &img, "imported", &rep);
	}
	if (strcmp(verb, "ls") == 0) {
		if (verb_args(argc, argv, 0, &json) < 0)
			return bad_usage();
		struct cap_image *v;
		size_t n;
		cap_store_image_list(&v, &n, &err);
		json_t *arr = json ? json_array() : NULL;
		if (!json)
			printf("%-16s %-20s %10s  %s\n", "NAME/REFERENCE", "DIGEST", "SIZE", "SOURCE");
		for (size_t i = 0; i < n; i++) {
			if (json)
				json_array_append_new(arr, image_json(&v[i]));
			else
				printf("%-16s %.19s %9.1fM  %s\n",
				       v[i].owned_name ? v[i].owned_name : v[i].owned_reference ? v[i].owned_reference : "-",
				       v[i].digest, v[i].size / 1048576.0, v[i].owned_source);
			cap_image_fini(&v[i]);
		}
		free(v);
		return json ? cap_cli_json_out(arr) : 0;
	}
	if (strcmp(verb, "inspect") == 0) {
		if ((at = verb_args(argc, argv, 1, &json)) < 0)
			return bad_usage();
		if (cap_store_image_find(argv[at], &img, &err) < 0) {
			cap_cli_error("%s", err.msg);
			return CAP_EXIT_FAILURE;
		}
		int r = cap_store_image_verify(&img, &err);
		if (json) {
			json_t *o = image_json(&img);
			json_object_set_new(o, "verified", json_boolean(r == 0));
			int x = cap_cli_json_out(o);
			if (x == 0 && r < 0)
				cap_cli_error("%s", err.msg);
			cap_image_fini(&img);
			return x ? x : r < 0 ? CAP_EXIT_FAILURE : 0;
		}
		print_image(&img);
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
	return bad_usage();
}
