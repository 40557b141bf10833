/* New sandbox to first exec result: template restore against cold boot,
 * in one process, medians of N; each also with the jail off. Prints
 * "restore MS", "cold MS", "restore_nojail MS", "cold_nojail MS", then
 * the idle host memory (PSS of QEMU) of each: "pss_restore KIB",
 * "pss_cold KIB". */
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

/* One start to first result; the sandbox is left running in *keep when
 * keep is not NULL. */
static int64_t one(bool template, struct cap_sandbox **keep)
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
	if (cap_sandbox_boot(&o, &sb, &err) < 0 || cap_sandbox_exec(sb, &req, &ev, NULL, &id, &err) < 0 ||
	    cap_sandbox_wait(sb, 30000, &err) < 0 || !done) {
		fprintf(stderr, "bench-start: %s\n", err.msg);
		exit(1);
	}
	t = cap_now_ns() - t;
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
	one(true, NULL);	/* builds the template if needed */
	for (int i = 0; i < n; i++) {
		for (int k = 0; k < 4; k++) {
			if (k >= 2)
				setenv("CAPSULE_JAIL", "0", 1);
			t[k][i] = one(k % 2 == 0, NULL);
			unsetenv("CAPSULE_JAIL");
		}
	}
	for (int k = 0; k < 4; k++) {
		qsort(t[k], (size_t)n, sizeof(int64_t), cmp);
		printf("%s %.1f\n", names[k], t[k][(n - 1) / 2] / 1e6);
	}

	struct cap_sandbox *r, *c;
	struct cap_err err;
	one(true, &r);
	one(false, &c);
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
