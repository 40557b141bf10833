/* Warm exec round trip: N `true` execs one after another in one VM,
 * against fork+exec of `true` on the host, in the same run. Prints
 * "name p50_us p99_us" lines for bench/run.sh. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sandbox.h"
#include "util.h"

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

static void report(const char *name, int64_t *ns, int n)
{
	qsort(ns, (size_t)n, sizeof(int64_t), cmp);
	int i99 = (int)(0.99 * (n - 1) + 0.5);
	printf("%s %.1f %.1f\n", name, ns[(n - 1) / 2] / 1000.0, ns[i99] / 1000.0);
}

static bool done;
static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int e, const char *m)
{
	(void)ud, (void)id, (void)ex, (void)e, (void)m;
	done = true;
}

int main(int argc, char **argv)
{
	int n = argc > 1 ? atoi(argv[1]) : 200;
	if (n < 5 || n > 100000) {
		fprintf(stderr, "usage: bench-exec [COUNT 5..100000]\n");
		return 2;
	}
	int64_t *ns = xcalloc((size_t)n, sizeof(int64_t));

	for (int i = 0; i < n; i++) {
		int64_t t = cap_now_ns();
		pid_t p = fork();
		if (p == 0) {
			execlp("true", "true", (char *)NULL);
			_exit(127);
		}
		waitpid(p, NULL, 0);
		ns[i] = cap_now_ns() - t;
	}
	report("host_fork_exec", ns, n);

	struct cap_sandbox_opts o;
	struct cap_sandbox *sb;
	struct cap_err err = { 0 };
	cap_sandbox_opts_init(&o);
	if (cap_sandbox_boot(&o, &sb, &err) < 0) {
		fprintf(stderr, "bench-exec: %s\n", err.msg);
		return 1;
	}
	static const struct cap_exec_events ev = { NULL, on_done, NULL };
	char *targv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = targv, .argc = 1, .timeout_ms = 30000 };
	for (int i = 0; i < n; i++) {
		uint32_t id;
		int64_t t = cap_now_ns();
		done = false;
		if (cap_sandbox_exec(sb, &req, &ev, NULL, &id, &err) < 0 ||
		    cap_sandbox_wait(sb, 30000, &err) < 0 || !done) {
			fprintf(stderr, "bench-exec: %s\n", err.msg);
			cap_sandbox_free(sb);
			return 1;
		}
		ns[i] = cap_now_ns() - t;
	}
	report("vm_exec", ns, n);
	cap_sandbox_shutdown(sb, 5000, &err);
	cap_sandbox_free(sb);
	free(ns);
	return 0;
}
