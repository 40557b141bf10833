/* Integration tests against one real VM (TCG here), shared by the tests
 * in this group because each checks a different property of the same
 * running agent. The group teardown checks that no QEMU is left. */
#include <errno.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "sandbox.h"
#include "util.h"

static struct cap_sandbox *sb;
static pid_t qemu_pid;

struct result {
	struct cap_buf out, err;
	bool done;
	struct cap_exit ex;
	int errnum;
};

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)id;
	struct result *r = ud;
	cap_buf_append(fd == 1 ? &r->out : &r->err, p, n);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex,
		    int errnum, const char *msg)
{
	(void)id;
	(void)msg;
	struct result *r = ud;
	r->done = true;
	if (ex)
		r->ex = *ex;
	r->errnum = errnum;
}

static const struct cap_exec_events ev = { on_output, on_done };

static void result_init(struct result *r)
{
	memset(r, 0, sizeof(*r));
	cap_buf_init(&r->out);
	cap_buf_init(&r->err);
	/* NUL-terminate lazily: keep one byte of room for string checks. */
}

static void result_fini(struct result *r)
{
	cap_buf_fini(&r->out);
	cap_buf_fini(&r->err);
}

static const char *text(struct cap_buf *b)
{
	cap_buf_append(b, "", 1);
	b->len--;
	return (const char *)cap_buf_head(b);
}

static uint32_t start(struct result *r, const char *script, uint32_t timeout_ms,
		      uint32_t cap, const char *cwd, char **env, uint32_t envc,
		      bool with_stdin)
{
	char *argv[] = { "sh", "-c", (char *)script, NULL };
	struct cap_exec_req req = {
		.argv = argv, .argc = 3, .env = env, .envc = envc, .cwd = (char *)cwd,
		.timeout_ms = timeout_ms, .output_cap = cap,
		.flags = with_stdin ? CAP_EXEC_STDIN : 0,
	};
	struct cap_err err = { 0 };
	uint32_t id = 0;
	result_init(r);
	int rc = cap_sandbox_exec(sb, &req, &ev, r, &id, &err);
	if (rc < 0)
		fail_msg("exec: %s", err.msg);
	return id;
}

static void wait_all(void)
{
	struct cap_err err = { 0 };
	int rc = cap_sandbox_wait(sb, 60000, &err);
	if (rc < 0)
		fail_msg("wait: %s", err.msg);
}

static void run(struct result *r, const char *script)
{
	start(r, script, 30000, 256 * 1024, NULL, NULL, 0, false);
	wait_all();
	assert_true(r->done);
}

static int group_setup(void **state)
{
	(void)state;
	struct cap_sandbox_opts o;
	struct cap_err err = { 0 };
	cap_sandbox_opts_init(&o);
	if (cap_sandbox_boot(&o, &sb, &err) < 0) {
		fprintf(stderr, "boot failed: %s\n", err.msg);
		return -1;
	}
	qemu_pid = cap_sandbox_vmm_pid(sb);
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	if (!sb)
		return -1;
	int rc = cap_sandbox_shutdown(sb, 5000, &err);
	cap_sandbox_free(sb);
	if (rc < 0) {
		fprintf(stderr, "shutdown was not clean: %s\n", err.msg);
		return -1;
	}
	return 0;
}

/* The suite runs twice: restored from a template, and cold-booted
 * (CAPSULE_TEMPLATES=0); every check below holds for both. */
static void started_as_asked(void **state)
{
	(void)state;
	const char *t = getenv("CAPSULE_TEMPLATES");
	bool want = !(t && strcmp(t, "0") == 0);
	if (cap_sandbox_restored(sb) != want)
		fail_msg("wanted %s, got: %s", want ? "a template restore" : "a cold boot",
			 cap_sandbox_boot_note(sb));
}

static void stdout_stderr_separated(void **state)
{
	(void)state;
	struct result r;
	run(&r, "echo to-out; echo to-err >&2; echo more-out");
	assert_string_equal(text(&r.out), "to-out\nmore-out\n");
	assert_string_equal(text(&r.err), "to-err\n");
	assert_int_equal(cap_exit_status(&r.ex), 0);
	result_fini(&r);
}

static void exit_code_propagated(void **state)
{
	(void)state;
	struct result r;
	run(&r, "exit 7");
	assert_int_equal(r.ex.kind, CAP_EXIT_CODE);
	assert_int_equal(cap_exit_status(&r.ex), 7);
	result_fini(&r);
}

static void signal_propagated(void **state)
{
	(void)state;
	struct result r;
	run(&r, "kill -TERM $$");
	assert_int_equal(r.ex.kind, CAP_EXIT_SIGNAL);
	assert_int_equal(r.ex.value, SIGTERM);
	assert_int_equal(cap_exit_status(&r.ex), 128 + SIGTERM);
	result_fini(&r);
}

static void runs_as_uid_1000(void **state)
{
	(void)state;
	struct result r;
	run(&r, "id -u; id -g");
	assert_string_equal(text(&r.out), "1000\n1000\n");
	result_fini(&r);
}

static void output_cut_at_cap_with_marker(void **state)
{
	(void)state;
	struct result r;
	run(&r, "head -c 1048576 /dev/zero | tr '\\0' y; echo never-seen >&2");
	char marker[96];
	int m = snprintf(marker, sizeof(marker), CAP_TRUNCATION_MARKER, 256 * 1024);
	assert_int_equal(cap_buf_used(&r.out), 256 * 1024 + (size_t)m);
	assert_memory_equal(cap_buf_head(&r.out) + 256 * 1024, marker, (size_t)m);
	assert_int_equal(cap_buf_used(&r.err), 0);	/* the cap spans both streams */
	assert_true(r.ex.flags & CAP_EXIT_TRUNCATED);
	assert_int_equal(cap_exit_status(&r.ex), 0);
	result_fini(&r);
}

static void timeout_kills_process_group(void **state)
{
	(void)state;
	struct result r, check;
	int64_t t0 = cap_now_ms();
	/* A background child in the same group must die too. */
	start(&r, "sleep 100 & sleep 100", 1000, 0, NULL, NULL, 0, false);
	wait_all();
	assert_true(r.ex.flags & CAP_EXIT_TIMED_OUT);
	assert_int_equal(cap_exit_status(&r.ex), 124);
	assert_true(cap_now_ms() - t0 < 20000);
	run(&check, "ps -o comm | grep -c '^sleep' || true");
	assert_string_equal(text(&check.out), "0\n");
	result_fini(&r);
	result_fini(&check);
}

/* Two commands that can only finish if they run at the same time: each
 * waits for a file the other creates. */
static void concurrent_execs(void **state)
{
	(void)state;
	struct result a, b, c;
	start(&a, "touch /tmp/a; while [ ! -e /tmp/b ]; do sleep 0.05; done; echo A", 20000, 0, NULL, NULL, 0, false);
	start(&b, "while [ ! -e /tmp/a ]; do sleep 0.05; done; touch /tmp/b; echo B", 20000, 0, NULL, NULL, 0, false);
	start(&c, "echo C", 20000, 0, NULL, NULL, 0, false);
	wait_all();
	assert_string_equal(text(&a.out), "A\n");
	assert_string_equal(text(&b.out), "B\n");
	assert_string_equal(text(&c.out), "C\n");
	assert_false(a.ex.flags & CAP_EXIT_TIMED_OUT);
	assert_false(b.ex.flags & CAP_EXIT_TIMED_OUT);
	result_fini(&a);
	result_fini(&b);
	result_fini(&c);
}

static void env_cwd_and_stdin(void **state)
{
	(void)state;
	struct result r;
	char *env[] = { "GREETING=hello there", "HOME=/tmp" };
	uint32_t id = start(&r, "cat; echo \"$GREETING|$HOME|$(pwd)|$PATH\"", 10000, 0, "/tmp", env, 2, true);
	assert_int_equal(cap_sandbox_stdin(sb, id, "from-stdin\n", 11), 0);
	assert_int_equal(cap_sandbox_stdin(sb, id, NULL, 0), 0);
	wait_all();
	assert_string_equal(text(&r.out),
			    "from-stdin\nhello there|/tmp|/tmp|/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\n");
	result_fini(&r);
}

static void missing_command_and_bad_cwd(void **state)
{
	(void)state;
	struct result r;
	char *argv[] = { "no-such-command", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .timeout_ms = 5000 };
	uint32_t id;
	result_init(&r);
	assert_int_equal(cap_sandbox_exec(sb, &req, &ev, &r, &id, NULL), 0);
	wait_all();
	assert_int_equal(cap_exit_status(&r.ex), 127);
	assert_non_null(strstr(text(&r.err), "no-such-command"));
	result_fini(&r);

	start(&r, "true", 5000, 0, "/no/such/dir", NULL, 0, false);
	wait_all();
	assert_int_equal(r.ex.kind, CAP_EXIT_START_FAILED);
	assert_non_null(strstr(text(&r.err), "/no/such/dir"));
	result_fini(&r);
}

static void signal_forwarded_to_group(void **state)
{
	(void)state;
	struct result r;
	uint32_t id = start(&r, "trap 'echo got-int; exit 3' INT; echo ready; while :; do sleep 0.1; done",
			    20000, 0, NULL, NULL, 0, false);
	struct cap_err err = { 0 };
	/* Wait for "ready" so the trap is installed. */
	while (!strstr(text(&r.out), "ready")) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(sb, pfd);
		poll(pfd, CAP_SANDBOX_NPOLL, 1000);
		assert_int_equal(cap_sandbox_dispatch(sb, pfd, &err), 0);
	}
	assert_int_equal(cap_sandbox_signal(sb, id, SIGINT), 0);
	wait_all();
	assert_non_null(strstr(text(&r.out), "got-int"));
	assert_int_equal(cap_exit_status(&r.ex), 3);
	result_fini(&r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(started_as_asked),
		cmocka_unit_test(stdout_stderr_separated),
		cmocka_unit_test(exit_code_propagated),
		cmocka_unit_test(signal_propagated),
		cmocka_unit_test(runs_as_uid_1000),
		cmocka_unit_test(output_cut_at_cap_with_marker),
		cmocka_unit_test(timeout_kills_process_group),
		cmocka_unit_test(concurrent_execs),
		cmocka_unit_test(env_cwd_and_stdin),
		cmocka_unit_test(missing_command_and_bad_cwd),
		cmocka_unit_test(signal_forwarded_to_group),
	};
	int failed = cmocka_run_group_tests_name("vm", tests, group_setup, group_teardown);
	/* The VM must be gone once the group is torn down. */
	if (qemu_pid > 0 && kill(qemu_pid, 0) == 0) {
		fprintf(stderr, "QEMU pid %d is still running after teardown\n", (int)qemu_pid);
		failed++;
	}
	return failed;
}
