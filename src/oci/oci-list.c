/* capsule-oci list: the containers under --root. */
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "oci-int.h"
#include "util.h"

int cap_oci_cmd_list(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' }, { "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' }, { 0 },
	};
	static const char usage[] = "Usage: capsule-oci list [--format table|json] [--quiet]\n\nList the containers under --root.\n";
	const char *fmt[2] = { "table", NULL };
	int rc = cap_oci_parse(argc, argv, "+f:qh", opts, usage, cap_oci_format_opt, fmt);
	if (rc >= 0)
		return rc;
	int dfd = open(cap_oci_flags.root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	char **names = NULL;
	size_t n = 0;
	if (dfd >= 0) {
		cap_dir_names(dfd, &names, &n);
		close(dfd);
	}
	json_t *a = json_array();
	bool json = strcmp(fmt[0], "json") == 0;
	if (!json && !fmt[1])
		printf("%-12s %-8s %-10s %-40s %-31s %s\n", "ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER");
	for (size_t i = 0; i < n; i++) {
		struct cap_oci_state st;
		struct cap_err err = { 0 };
		if (cap_oci_state_load(names[i], &st, &err) < 0)
			continue;
		if (json)
			json_array_append_new(a, cap_oci_state_json(&st));
		else if (fmt[1])
			printf("%s\n", st.id);
		else
			printf("%-12s %-8d %-10s %-40s %-31s %s\n", st.id,
			       strcmp(st.status, "stopped") == 0 ? 0 : (int)st.pid, st.status,
			       cap_oci_jstr(st.j, "bundle"), cap_oci_jstr(st.j, "created"), "root");
		cap_oci_state_fini(&st);
	}
	cap_strv_free(names, n);
	if (json)
		return cap_oci_print_json(a, JSON_COMPACT);
	json_decref(a);
	return 0;
}
