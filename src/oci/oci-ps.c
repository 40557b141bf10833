/* capsule-oci ps: the host processes standing for a container's. */
#include <getopt.h>
#include <jansson.h>
#include <pwd.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "oci-int.h"
#include "util.h"

/* One `ps` row of a host process from /proc, as ps -ef prints it. */
static void ps_row(pid_t pid)
{
	char path[64];
	_cleanup_free_ char *pstat = NULL, *cmd = NULL;
	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	if (cap_read_file(path, 4096, &pstat) < 0)
		return;
	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)pid);
	ssize_t n = cap_read_file(path, 4096, &cmd);
	for (ssize_t i = 0; i + 1 < n; i++)
		if (cmd[i] == '\0')
			cmd[i] = ' ';
	char *p = strrchr(pstat, ')');
	int ppid = 0;
	unsigned long long ut = 0, stt = 0;
	if (p)
		sscanf(p + 2, "%*c %d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ppid, &ut, &stt);
	struct stat sb;
	snprintf(path, sizeof(path), "/proc/%d", (int)pid);
	uid_t uid = stat(path, &sb) == 0 ? sb.st_uid : 0;
	struct passwd *pw = getpwuid(uid);
	long hz = sysconf(_SC_CLK_TCK);
	unsigned long long secs = (ut + stt) / (unsigned long long)(hz > 0 ? hz : 100);
	printf("%-8s %7d %7d  0 -        ?        %02llu:%02llu:%02llu %s\n", pw ? pw->pw_name : "?", (int)pid,
	       ppid, secs / 3600, secs / 60 % 60, secs % 60, n > 0 ? cmd : "?");
}

/* The container's processes as the host sees them: the monitor standing
 * for its process and one per live exec. These host pids are what the
 * engine signals and waits on; the guest's own processes are inside the
 * VM, where a host pid means nothing. */
int cap_oci_cmd_ps(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "format", required_argument, NULL, 'f' }, { "help", no_argument, NULL, 'h' }, { 0 },
	};
	static const char usage[] =
		"Usage: capsule-oci ps [--format table|json] ID\n\n"
		"The host processes standing for the container's processes: its monitor and\n"
		"one per running exec (the guest's processes run inside the VM).\n";
	const char *fmt[2] = { "table", NULL };
	int rc = cap_oci_parse(argc, argv, "+f:h", opts, usage, cap_oci_format_opt, fmt);
	if (rc >= 0)
		return rc;
	if (optind != argc - 1) {
		cap_oci_error("ps needs exactly one container id");
		return 1;
	}
	struct cap_oci_state st;
	struct cap_err err = { 0 };
	if (cap_oci_state_load(argv[optind], &st, &err) < 0)
		return cap_oci_fail(&err);
	pid_t pids[257];
	size_t n = 0;
	if (strcmp(st.status, "stopped") != 0)
		pids[n++] = st.pid;
	n += cap_oci_exec_monitors(st.dir, pids + n, NULL, 256);
	if (strcmp(fmt[0], "json") == 0) {
		json_t *a = json_array();
		for (size_t i = 0; i < n; i++)
			json_array_append_new(a, json_integer(pids[i]));
		rc = cap_oci_print_json(a, JSON_COMPACT);
	} else {
		printf("UID          PID    PPID  C STIME    TTY          TIME CMD\n");
		for (size_t i = 0; i < n; i++)
			ps_row(pids[i]);
		rc = 0;
	}
	cap_oci_state_fini(&st);
	return rc;
}
