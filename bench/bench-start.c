/* New sandbox to first exec result: template restore against cold boot,
 * in one process, medians of N; each also with the jail off. Prints
 * "restore MS", "cold MS", "restore_nojail MS", "cold_nojail MS", then
 * the idle host memory (PSS of QEMU) of each: "pss_restore KIB",
 * "pss_cold KIB"; and where a restore's time went, medians in ms of the
 * phases of cap_sandbox_times and the first exec: "phases_restore
 * prepare MS jail MS qemu MS restore MS agent MS exec MS". */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sandbox.h"
#include "util.h"

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static bool done;
static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int e, const char *m)
{
	(void)ud, (void)id, (void)ex, (void)e, (void)m;
	done = true;
}

/* Pss of a process from /proc/PID/smaps_rollup, in KiB. */
static long pss(pid_t pid)
{
	char path[64], *s = NULL;
	snprintf(path, sizeof(path), "/proc/%d/smaps_rollup", (int)pid);
	if (cap_read_file(path, 1 << 20, &s) < 0)
		return -1;
	char *p = strstr(s, "\nPss:");
	long kb = p ? strtol(p + 5, NULL, 10) : -1;
	free(s);
	return kb;
}

enum { P_PREPARE, P_JAIL, P_QEMU, P_RESTORE, P_AGENT, P_EXEC, NPHASES };
static const char *const phase_names[NPHASES] = { "prepare", "jail", "qemu", "restore", "agent", "exec" };

/* One start to first result; the sandbox is left running in *keep when
 * keep is not NULL; its phases (ns) in phases when not NULL. */
static int64_t one(bool template, struct cap_sandbox **keep, int64_t *phases)
{
	struct cap_sandbox_opts o;
	struct cap_sandbox *sb;
	struct cap_err err = { 0 };
	static const struct cap_exec_events ev = { NULL, on_done, NULL };
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .timeout_ms = 30000 };
	uint32_t id;

	cap_sandbox_opts_init(&o);
	o.use_template = template;
	int64_t t = cap_now_ns();
	done = false;
	if (cap_sandbox_boot(&o, &sb, &err) < 0) {
		fprintf(stderr, "bench-start: %s\n", err.msg);
		exit(1);
	}
	int64_t booted = cap_now_ns();
	if (cap_sandbox_exec(sb, &req, &ev, NULL, &id, &err) < 0 ||
	    cap_sandbox_wait(sb, 30000, &err) < 0 || !done) {
		fprintf(stderr, "bench-start: %s\n", err.msg);
		exit(1);
	}
	int64_t end = cap_now_ns();
	if (phases) {
		const struct cap_sandbox_times *st = cap_sandbox_times(sb);
		int64_t us[NPHASES] = { st->prepare, st->jail, st->qemu, st->restore, st->agent, 0 };
		for (int k = 0; k < P_EXEC; k++)
			phases[k] = us[k] * 1000;
		phases[P_EXEC] = end - booted;
	}
	t = end - t;
	if (template != cap_sandbox_restored(sb)) {
		fprintf(stderr, "bench-start: %s\n", cap_sandbox_boot_note(sb));
		exit(1);
	}
	if (keep) {
		*keep = sb;
	} else {
		cap_sandbox_shutdown(sb, 5000, &err);
		cap_sandbox_free(sb);
	}
	return t;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 10;
	if (n < 1 || n > 1000)
		return 2;
	/* Restore and cold boot, each with the jail and without it
	 * (CAPSULE_JAIL=0), interleaved so that no side gets a warmer host. */
	static const char *const names[] = { "restore", "cold", "restore_nojail", "cold_nojail" };
	int64_t *t[4];
	for (int k = 0; k < 4; k++)
		t[k] = xcalloc((size_t)n, sizeof(int64_t));
	int64_t *ph[NPHASES], cur[NPHASES];
	for (int p = 0; p < NPHASES; p++)
		ph[p] = xcalloc((size_t)n, sizeof(int64_t));
	one(true, NULL, NULL);	/* builds the template if needed */
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < 4; k++) {
			if (k >= 2)
				setenv("CAPSULE_JAIL", "0", 1);
			t[k][i] = one(k % 2 == 0, NULL, k == 0 ? cur : NULL);
			unsetenv("CAPSULE_JAIL");
			for (int p = 0; k == 0 && p < NPHASES; p++)
				ph[p][i] = cur[p];
		}
	}
	for (int k = 0; k < 4; k++) {
		qsort(t[k], (size_t)n, sizeof(int64_t), cmp);
		printf("%s %.1f\n", names[k], t[k][(n - 1) / 2] / 1e6);
	}
	printf("phases_restore");
	for (int p = 0; p < NPHASES; p++) {
		qsort(ph[p], (size_t)n, sizeof(int64_t), cmp);
		printf(" %s %.1f", phase_names[p], ph[p][(n - 1) / 2] / 1e6);
		free(ph[p]);
	}
	printf("\n");

	struct cap_sandbox *r, *c;
	struct cap_err err;
	one(true, &r, NULL);
	one(false, &c, NULL);
	sleep(2);	/* idle at the agent prompt */
	printf("pss_restore %ld\npss_cold %ld\n", pss(cap_sandbox_vmm_pid(r)), pss(cap_sandbox_vmm_pid(c)));
	cap_sandbox_shutdown(r, 5000, &err);
	cap_sandbox_shutdown(c, 5000, &err);
	cap_sandbox_free(r);
	cap_sandbox_free(c);
	for (int k = 0; k < 4; k++)
		free(t[k]);
	return 0;
}
