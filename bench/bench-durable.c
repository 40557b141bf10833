/* What durable results cost: warm exec latency in a running named
 * sandbox (through its shim, as capsule exec goes) of a command that
 * writes nothing (`true`) and of one that writes 4 KiB under /work, each
 * with the default (the agent flushes the writable disks before EXIT when
 * something changed) and with CAP_EXEC_NO_SYNC, interleaved in one run.
 * Prints one line per kind for bench/run.sh:
 *   NAME p50_us p99_us flushed sync_ms_p50
 * with NAME true_durable, true_nosync, write_durable, write_nosync;
 * flushed: how many of the COUNT ends had a flush (SYNCING), sync_ms_p50:
 * the median of the EXIT's sync_ms. Fails when an EXIT's durable flag is
 * not what was asked for (an agent older than durable results). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "named.h"
#include "sandbox.h"
#include "util.h"

enum { TRUE_DURABLE, TRUE_NOSYNC, WRITE_DURABLE, WRITE_NOSYNC, NKINDS };
static const char *const names[NKINDS] = { "true_durable", "true_nosync", "write_durable", "write_nosync" };

/* One round's order. A no-sync write leaves changes that the next durable
 * call flushes, whatever it runs: so `true` (both kinds) runs after a
 * durable write and before the no-sync one, and measures a command that
 * finds nothing changed. The durable write flushes the previous round's
 * no-sync overwrite of the same file along with its own (a few blocks of
 * metadata: the truncate drops the old data). */
static const int order[NKINDS] = { WRITE_DURABLE, TRUE_DURABLE, TRUE_NOSYNC, WRITE_NOSYNC };

static int cmp(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
	return x < y ? -1 : x > y;
}

struct one {
	bool done, syncing;
	struct cap_exit ex;
	int errnum;
	char msg[160];
};

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int e, const char *m)
{
	struct one *o = ud;
	(void)id;
	o->done = true;
	if (ex)
		o->ex = *ex;
	o->errnum = e;
	snprintf(o->msg, sizeof(o->msg), "%s", m ? m : "");
}

static void on_syncing(void *ud, uint32_t id)
{
	(void)id;
	((struct one *)ud)->syncing = true;
}

int main(int argc, char **argv)
{
	int n = argc > 2 ? atoi(argv[2]) : 0;
	if (argc != 3 || n < 5 || n > 100000) {
		fprintf(stderr, "usage: bench-durable SANDBOX COUNT(5..100000)\n"
				"  SANDBOX: a running named sandbox in CAPSULE_HOME (capsule start)\n");
		return 2;
	}
	const char *name = argv[1];
	struct cap_err err = { 0 };
	struct cap_named_status st;
	struct cap_sandbox *sb;
	if (cap_named_status(name, &st, &err) < 0) {
		fprintf(stderr, "bench-durable: %s\n", err.msg);
		return 1;
	}
	if (st.state != CAP_NAMED_RUNNING) {
		fprintf(stderr, "bench-durable: sandbox %s is not running; start it first (capsule start %s)\n",
			name, name);
		return 1;
	}
	if (cap_sandbox_attach(st.control, &sb, &err) < 0) {
		fprintf(stderr, "bench-durable: %s\n", err.msg);
		return 1;
	}

	char *targv[] = { "true", NULL };
	char *wargv[] = { "sh", "-c", "head -c 4096 /dev/zero >/work/capsule-bench-durable", NULL };
	int64_t *ns[NKINDS], *sync_ms[NKINDS];
	int syncing[NKINDS] = { 0 };
	for (int k = 0; k < NKINDS; k++) {
		ns[k] = xcalloc((size_t)n, sizeof(int64_t));
		sync_ms[k] = xcalloc((size_t)n, sizeof(int64_t));
	}
	static const struct cap_exec_events ev = { NULL, on_done, on_syncing };
	/* One unmeasured round first: the first write makes the file, and
	 * the caches are warm for every kind. */
	for (int i = -1; i < n; i++) {
		for (int j = 0; j < NKINDS; j++) {
			int k = order[j];
			bool write = k == WRITE_DURABLE || k == WRITE_NOSYNC;
			struct cap_exec_req req = {
				.argv = write ? wargv : targv,
				.argc = write ? 3 : 1,
				.timeout_ms = 30000,
				.flags = (k == TRUE_NOSYNC || k == WRITE_NOSYNC) ? CAP_EXEC_NO_SYNC : 0,
			};
			struct one o = { 0 };
			uint32_t id;
			int64_t t = cap_now_ns();
			if (cap_sandbox_exec(sb, &req, &ev, &o, &id, &err) < 0 ||
			    cap_sandbox_wait(sb, 30000, &err) < 0 || !o.done) {
				fprintf(stderr, "bench-durable: %s: %s\n", names[k], err.msg);
				cap_sandbox_free(sb);
				return 1;
			}
			t = cap_now_ns() - t;
			if (o.errnum || cap_exit_status(&o.ex) != 0) {
				fprintf(stderr, "bench-durable: %s: %s (exit status %d)\n", names[k],
					o.errnum ? o.msg : "the command failed", cap_exit_status(&o.ex));
				cap_sandbox_free(sb);
				return 1;
			}
			bool want = !(req.flags & CAP_EXEC_NO_SYNC);
			if (((o.ex.flags & CAP_EXIT_DURABLE) != 0) != want) {
				fprintf(stderr, "bench-durable: %s: the EXIT %s the durable flag; is the agent "
						"(CAPSULE_AGENT) older than durable results?\n",
					names[k], want ? "lacks" : "has");
				cap_sandbox_free(sb);
				return 1;
			}
			if (i < 0)
				continue;
			ns[k][i] = t;
			sync_ms[k][i] = o.ex.sync_ms;
			syncing[k] += o.syncing;
		}
	}
	cap_sandbox_free(sb);

	int i99 = (int)(0.99 * (n - 1) + 0.5);
	for (int k = 0; k < NKINDS; k++) {
		qsort(ns[k], (size_t)n, sizeof(int64_t), cmp);
		qsort(sync_ms[k], (size_t)n, sizeof(int64_t), cmp);
		printf("%s %.1f %.1f %d %lld\n", names[k], ns[k][(n - 1) / 2] / 1000.0,
		       ns[k][i99] / 1000.0, syncing[k], (long long)sync_ms[k][(n - 1) / 2]);
		free(ns[k]);
		free(sync_ms[k]);
	}
	return 0;
}
