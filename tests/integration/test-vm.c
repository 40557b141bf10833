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
#include <poll.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <jansson.h>

#include "named.h"
#include "paths.h"
#include "sandbox.h"
#include "store.h"
#include "tar.h"
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

static const struct cap_exec_events ev = { on_output, on_done, NULL };

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

/* Write what is queued for the guest without reading anything from it. */
static void send_only(void)
{
	struct pollfd pfd[CAP_SANDBOX_NPOLL];
	struct cap_err err = { 0 };
	cap_sandbox_pollfds(sb, pfd);
	for (int i = 0; i < CAP_SANDBOX_NPOLL; i++)
		pfd[i].revents = 0;
	for (int i = 0; i < 100 && cap_sandbox_backlog(sb) > 0; i++) {
		if (cap_sandbox_dispatch(sb, pfd, &err) < 0)
			fail_msg("dispatch: %s", err.msg);
		usleep(1000);
	}
	assert_int_equal(cap_sandbox_backlog(sb), 0);
}

/* A host that reads slowly makes the agent stop reading every command's
 * pipes (its queue to the host is full). A command that ends meanwhile
 * with its output still in its pipe loses none of it: "big" fills the
 * agent's queue while the host reads nothing; "small" waits until big
 * makes no progress (it stops switching context: the agent has stopped
 * reading), then writes into its pipe and ends, well before the host
 * reads again. */
static void slow_host_gets_all_output(void **state)
{
	(void)state;
	struct result big, small;
	start(&big, "exec head -c 8388608 /dev/zero", 30000, 0, NULL, NULL, 0, false);
	start(&small,
	      "while ! p=$(pidof head); do sleep 0.05; done; a=; i=0;"
	      "while b=$(grep ctxt /proc/$p/status) && [ \"$a\" != \"$b\" ]; do"
	      "  a=$b; i=$((i+1)); [ $i -lt 50 ] || exit 9; sleep 0.2;"
	      " done; [ -n \"$b\" ] || exit 8;"
	      " head -c 60000 /dev/zero | tr '\\0' a",
	      30000, 0, NULL, NULL, 0, false);
	send_only();
	int64_t t0 = cap_now_ms();
	usleep(2200 * 1000);	/* read nothing meanwhile */
	wait_all();
	assert_true(small.done);
	assert_int_equal(cap_exit_status(&small.ex), 0);
	assert_int_equal(cap_buf_used(&small.out), 60000);
	assert_int_equal(strspn(text(&small.out), "a"), 60000);
	assert_true(big.done);
	assert_int_equal(cap_exit_status(&big.ex), 0);
	assert_int_equal(cap_buf_used(&big.out), 8388608);
	fprintf(stderr, "# slow host check: %lld ms\n", (long long)(cap_now_ms() - t0));
	result_fini(&small);
	result_fini(&big);
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

/* --- CAP_EXEC_USER: a container's process ------------------------------- */

/* Start req (argv, env, credentials filled by the caller) into r. */
static uint32_t start_req(struct result *r, struct cap_exec_req *req)
{
	struct cap_err err = { 0 };
	uint32_t id = 0;
	if (!req->timeout_ms)
		req->timeout_ms = 20000;
	result_init(r);
	if (cap_sandbox_exec(sb, req, &ev, r, &id, &err) < 0)
		fail_msg("exec: %s", err.msg);
	return id;
}

/* Dispatch the sandbox's events until r's stdout holds needle (true) or
 * ms pass (false). */
static bool wait_text(struct result *r, const char *needle, int ms)
{
	int64_t end = cap_now_ms() + ms;
	struct cap_err err = { 0 };
	while (!strstr(text(&r->out), needle)) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			return false;
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(sb, pfd);
		poll(pfd, CAP_SANDBOX_NPOLL, (int)CAP_MIN(left, 100));
		if (cap_sandbox_dispatch(sb, pfd, &err) < 0)
			fail_msg("dispatch: %s", err.msg);
	}
	return true;
}

/* Root with supplementary groups, a lowered rlimit, a umask, a directory
 * the agent makes, exactly the request's environment (HOME from the
 * guest's /etc/passwd when the request has none). */
static void user_root_as_asked(void **state)
{
	(void)state;
	struct result a, b;
	char *argv[] = { "sh", "-c", "id -u; id -G; ulimit -n; umask; pwd; echo $HOME;"
		         "stat -c '%a %u' /made/by; touch f; stat -c %a f", NULL };
	char *env[] = { "PATH=/usr/bin:/bin", "HOME=/given" };
	struct cap_exec_req req = {
		.argv = argv, .argc = 3, .env = env, .envc = 2, .cwd = "/made/by/agent",
		.flags = CAP_EXEC_USER, .uid = 0, .gid = 0, .groups = { 10, 1234 }, .ngroups = 2,
		.rlimits = { { RLIMIT_NOFILE, 77, 77 } }, .nrlimits = 1, .umask = 027,
	};
	start_req(&a, &req);
	/* env run directly (no shell adding PWD or SHLVL), found through
	 * the request's PATH */
	char *argv2[] = { "env", NULL };
	char *env2[] = { "PATH=/nowhere:/usr/bin:/bin", "FOO=bar baz" };
	struct cap_exec_req req2 = { .argv = argv2, .argc = 1, .env = env2, .envc = 2,
				     .flags = CAP_EXEC_USER };
	start_req(&b, &req2);
	wait_all();
	assert_string_equal(text(&a.err), "");
	assert_string_equal(text(&a.out), "0\n0 10 1234\n77\n0027\n/made/by/agent\n/given\n755 0\n640\n");
	assert_int_equal(cap_exit_status(&a.ex), 0);
	assert_string_equal(text(&b.out), "PATH=/nowhere:/usr/bin:/bin\nFOO=bar baz\nHOME=/root\n");
	assert_int_equal(cap_exit_status(&b.ex), 0);
	result_fini(&a);
	result_fini(&b);
}

/* Another user, with a hard limit raised over the agent's (it must be set
 * before the uid is dropped), HOME "/" for a uid /etc/passwd does not
 * know, "/" as the default directory, /dev/stdout and /dev/fd; a command the request's PATH does
 * not find is "not found" (127), though the agent's PATH has it. */
static void user_other_as_asked(void **state)
{
	(void)state;
	struct result a, b;
	char *argv[] = { "sh", "-c", "id -u; id -g; id -G; echo $HOME; pwd; ulimit -n; ulimit -Hn;"
		         "echo via-dev-stdout >/dev/stdout; ls /dev/fd/ >/dev/null && echo dev-fd", NULL };
	char *env[] = { "PATH=/usr/bin:/bin" };
	struct cap_exec_req req = {
		.argv = argv, .argc = 3, .env = env, .envc = 1, .flags = CAP_EXEC_USER,
		.uid = 1234, .gid = 1234, .rlimits = { { RLIMIT_NOFILE, 5000, 9000 } }, .nrlimits = 1,
		.umask = 022,
	};
	start_req(&a, &req);
	char *argv2[] = { "id", NULL };
	char *env2[] = { "PATH=/nowhere" };
	struct cap_exec_req req2 = { .argv = argv2, .argc = 1, .env = env2, .envc = 1,
				     .flags = CAP_EXEC_USER };
	start_req(&b, &req2);
	wait_all();
	assert_string_equal(text(&a.err), "");
	assert_string_equal(text(&a.out), "1234\n1234\n1234\n/\n/\n5000\n9000\nvia-dev-stdout\ndev-fd\n");
	assert_int_equal(b.ex.kind, CAP_EXIT_START_FAILED);
	assert_int_equal(b.ex.value, ENOENT);
	assert_int_equal(cap_exit_status(&b.ex), 127);
	assert_non_null(strstr(text(&b.err), "'id'"));
	result_fini(&a);
	result_fini(&b);
}

/* Root on a PTY: the slave is the controlling terminal, owned by the
 * command's uid, of the requested size, and a resize arrives as
 * SIGWINCH with the new size. */
static void user_root_pty(void **state)
{
	(void)state;
	struct result r;
	char *argv[] = { "sh", "-c", "trap 'echo winch $(stty size); exit 4' WINCH;"
		         "[ -t 0 ] && echo is-tty; echo size $(stty size); echo owner $(stat -c %u $(tty));"
		         "echo ready; while :; do sleep 0.1; done", NULL };
	char *env[] = { "PATH=/usr/bin:/bin" };
	struct cap_exec_req req = {
		.argv = argv, .argc = 3, .env = env, .envc = 1, .rows = 30, .cols = 100,
		.flags = CAP_EXEC_USER | CAP_EXEC_PTY | CAP_EXEC_STDIN, .uid = 0, .gid = 0,
	};
	uint32_t id = start_req(&r, &req);
	assert_true(wait_text(&r, "ready", 10000));
	assert_int_equal(cap_sandbox_resize(sb, id, 40, 120), 0);
	wait_all();
	const char *out = text(&r.out);
	assert_non_null(strstr(out, "is-tty"));
	assert_non_null(strstr(out, "size 30 100"));
	assert_non_null(strstr(out, "owner 0"));
	assert_non_null(strstr(out, "winch 40 120"));
	assert_int_equal(cap_exit_status(&r.ex), 4);
	result_fini(&r);
}

/* SIGNAL scopes in one command: a shell, a child in its process group and
 * a process that left it (setsid). TERM to the PROCESS reaches the shell
 * only, to the GROUP the child too; USR1 to the GROUP misses the escaped
 * process, to ALL (its cgroup) reaches it; SIGKILL ends everything. */
static void signal_scopes(void **state)
{
	(void)state;
	struct result r;
	char *argv[] = { "sh", "-c",
		         "trap 'echo parent-term' TERM; trap 'echo parent-usr1' USR1;"
		         "(trap 'echo child-term' TERM; echo child-ready; while :; do sleep 0.1; done) &"
		         "setsid sh -c 'trap \"echo escaped-usr1\" USR1; echo escaped-ready;"
		         " while :; do sleep 0.1; done' &"
		         "while :; do sleep 0.1; done", NULL };
	char *env[] = { "PATH=/usr/bin:/bin" };
	struct cap_exec_req req = { .argv = argv, .argc = 3, .env = env, .envc = 1,
				    .flags = CAP_EXEC_USER };
	uint32_t id = start_req(&r, &req);
	assert_true(wait_text(&r, "child-ready", 10000));
	assert_true(wait_text(&r, "escaped-ready", 10000));

	assert_int_equal(cap_sandbox_signal_scope(sb, id, SIGTERM, CAP_SIGNAL_PROCESS), 0);
	assert_true(wait_text(&r, "parent-term", 10000));
	assert_false(wait_text(&r, "child-term", 400));
	assert_int_equal(cap_sandbox_signal_scope(sb, id, SIGTERM, CAP_SIGNAL_GROUP), 0);
	assert_true(wait_text(&r, "child-term", 10000));

	assert_int_equal(cap_sandbox_signal_scope(sb, id, SIGUSR1, CAP_SIGNAL_GROUP), 0);
	assert_true(wait_text(&r, "parent-usr1", 10000));
	assert_false(wait_text(&r, "escaped-usr1", 400));
	assert_int_equal(cap_sandbox_signal_scope(sb, id, SIGUSR1, CAP_SIGNAL_ALL), 0);
	assert_true(wait_text(&r, "escaped-usr1", 10000));

	assert_int_equal(cap_sandbox_signal(sb, id, SIGKILL), 0);
	wait_all();
	assert_int_equal(cap_exit_status(&r.ex), 128 + SIGKILL);
	result_fini(&r);
}

/* --- streaming FILE operations (MANIFEST, TAR_OUT, TAR_IN) ------------ */

/* Start a FILE operation on /work; with stdin, send it and close it. */
static void file_op(struct result *r, uint32_t op, const char *path, uint32_t limit,
		    const void *in, size_t n)
{
	struct cap_file_req req = { .op = op, .limit = limit, .root = "/work", .path = path };
	struct cap_err err = { 0 };
	uint32_t id = 0;
	result_init(r);
	if (cap_sandbox_file(sb, &req, 0, &ev, r, &id, &err) < 0)
		fail_msg("file: %s", err.msg);
	if (in) {
		for (size_t off = 0; off < n; off += 32 * 1024)
			assert_int_equal(cap_sandbox_stdin(sb, id, (const uint8_t *)in + off,
							   CAP_MIN((size_t)32 * 1024, n - off)), 0);
		assert_int_equal(cap_sandbox_stdin(sb, id, NULL, 0), 0);
	}
	wait_all();
	assert_true(r->done);
}

/* The manifest lists what a command wrote, sorted by whole paths ("a-b"
 * before "a/b"), names escaped, hashes those of sha256sum. */
static void manifest_of_written_tree(void **state)
{
	(void)state;
	struct result w, m;
	run(&w, "set -e; rm -rf /work/m; mkdir -p /work/m/a /work/m/a-b; cd /work/m;"
		"printf 'hello\\n' > a/b; : > a-b/empty; ln -s b a/link; printf x > 'sp ace%';"
		"chmod 0750 a; chmod 0600 a/b; mkfifo fifo; echo ok");
	assert_string_equal(text(&w.out), "ok\n");
	file_op(&m, CAP_FILE_MANIFEST, "m", 0, NULL, 0);
	assert_int_equal(m.ex.kind, CAP_EXIT_CODE);
	assert_int_equal(m.ex.value, 0);
	assert_string_equal(text(&m.out),
		"d 0750 0 - a\n"
		"d 0755 0 - a-b\n"
		"f 0644 0 e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855 a-b/empty\n"
		"f 0600 6 5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03 a/b\n"
		"l 0777 1 3e23e8160039594a33894f6564e1b1348bbd7a0088d42c4acb73eeaed59c009d a/link b\n"
		"o 0644 0 - fifo\n"
		"f 0644 1 2d711642b726b04401627ca9fbac32f5c8530fb1903cc4db02258717921a4881 sp%20ace%25\n");
	assert_int_equal(cap_buf_used(&m.err), 0);
	result_fini(&m);
	/* Not a directory, missing: exit 2, named. */
	file_op(&m, CAP_FILE_MANIFEST, "m/a/b", 0, NULL, 0);
	assert_int_equal(m.ex.value, 2);
	assert_non_null(strstr(text(&m.err), "capsule: /work/m/a/b: not a directory"));
	result_fini(&m);
	file_op(&m, CAP_FILE_MANIFEST, "nothing-here", 0, NULL, 0);
	assert_int_equal(m.ex.value, 2);
	assert_non_null(strstr(text(&m.err), "/work/nothing-here"));
	result_fini(&m);
	result_fini(&w);
}

struct want {
	const char *path;
	char type;	/* f d l */
	unsigned mode;
	const char *data;	/* f: content; l: target */
};

/* A tar stream of the entries, written by the guest's codec. */
static void make_tar(const struct want *v, size_t n, struct cap_buf *out)
{
	for (size_t i = 0; i < n; i++) {
		struct cap_tar_entry e = {
			.path = v[i].path, .mode = v[i].mode, .mtime = 1600000000,
			.type = v[i].type == 'f' ? CAP_TAR_FILE : v[i].type == 'd' ? CAP_TAR_DIR : CAP_TAR_SYMLINK,
			.linkname = v[i].type == 'l' ? v[i].data : NULL,
			.size = v[i].type == 'f' ? strlen(v[i].data) : 0,
		};
		assert_int_equal(cap_tar_header(out, &e), 0);
		cap_buf_append(out, v[i].data, (size_t)e.size);
		cap_tar_pad(out, e.size);
	}
	cap_tar_end(out);
}

/* Read a tar stream with libarchive and compare it with v (in order). */
static void check_tar(const uint8_t *p, size_t len, const struct want *v, size_t n)
{
	struct archive *a = archive_read_new();
	archive_read_support_format_tar(a);
	assert_int_equal(archive_read_open_memory(a, p, len), ARCHIVE_OK);
	struct archive_entry *ae;
	size_t i = 0;
	while (archive_read_next_header(a, &ae) == ARCHIVE_OK) {
		assert_true(i < n);
		char name[5000];
		snprintf(name, sizeof(name), "%s", archive_entry_pathname(ae));
		size_t k = strlen(name);
		if (k > 1 && name[k - 1] == '/')
			name[k - 1] = '\0';
		assert_string_equal(name, v[i].path);
		assert_int_equal(archive_entry_perm(ae), v[i].mode);
		if (v[i].type == 'l') {
			assert_int_equal(archive_entry_filetype(ae), AE_IFLNK);
			assert_string_equal(archive_entry_symlink(ae), v[i].data);
		} else if (v[i].type == 'd') {
			assert_int_equal(archive_entry_filetype(ae), AE_IFDIR);
		} else {
			char buf[256];
			assert_int_equal(archive_entry_filetype(ae), AE_IFREG);
			la_ssize_t got = archive_read_data(a, buf, sizeof(buf));
			assert_int_equal(got, (la_ssize_t)strlen(v[i].data));
			assert_memory_equal(buf, v[i].data, (size_t)got);
		}
		i++;
	}
	assert_int_equal(i, n);
	archive_read_free(a);
}

/* A tree in with TAR_IN, back out with TAR_OUT: a 300-byte path (pax), a
 * link, an empty file, modes; set-id bits dropped, a 0500 directory still
 * filled. Then with the paths on stdin. */
static void tar_in_and_out(void **state)
{
	(void)state;
	static char deep[400];
	for (size_t i = 0; i < 300; i++)
		deep[i] = i % 10 == 9 ? '/' : 'p';
	memcpy(deep, "t/", 2);
	deep[299] = 'f';
	deep[300] = '\0';
	struct want in[] = {
		{ "t", 'd', 0755, NULL },
		{ "t/exe", 'f', 04755, "#!/bin/sh\necho run\n" },
		{ "t/empty", 'f', 0600, "" },
		{ "t/link", 'l', 0777, "exe" },
		{ "t/ro", 'd', 0500, NULL },
		{ "t/ro/inside", 'f', 0644, "in a read-only directory\n" },
		{ deep, 'f', 0640, "deep\n" },
	};
	struct cap_buf tar;
	struct result r, c;
	cap_buf_init(&tar);
	make_tar(in, CAP_ARRAY_SIZE(in), &tar);
	run(&c, "chmod -R u+w /work/x 2>/dev/null; rm -rf /work/x; mkdir /work/x");
	result_fini(&c);
	file_op(&r, CAP_FILE_TAR_IN, "x", 0, cap_buf_head(&tar), cap_buf_used(&tar));
	assert_string_equal(text(&r.err), "");
	assert_int_equal(r.ex.kind, CAP_EXIT_CODE);
	assert_int_equal(r.ex.value, 0);
	result_fini(&r);
	run(&c, "cd /work/x/t; ./exe; stat -c '%a %u %s %Y' exe empty; stat -c '%a %u %Y' ro;"
		"readlink link; cat ro/inside; ls -a . | tr '\\n' ' '");
	assert_string_equal(text(&c.out), "run\n755 1000 19 1600000000\n600 1000 0 1600000000\n"
					  "500 1000 1600000000\nexe\nin a read-only directory\n"
					  ". .. empty exe link ppppppp ro ");
	result_fini(&c);

	/* Out again: the directory and all below it, named from "t". */
	file_op(&r, CAP_FILE_TAR_OUT, "x/t", 0, NULL, 0);
	assert_int_equal(r.ex.value, 0);
	struct want out[] = {
		{ "t", 'd', 0755, NULL },
		{ "t/empty", 'f', 0600, "" },
		{ "t/exe", 'f', 0755, "#!/bin/sh\necho run\n" },
		{ "t/link", 'l', 0777, "exe" },
	};
	/* The deep path's directories come between; compare the first ones
	 * and find the deep file by name. */
	struct archive *a = archive_read_new();
	archive_read_support_format_tar(a);
	assert_int_equal(archive_read_open_memory(a, cap_buf_head(&r.out), cap_buf_used(&r.out)), ARCHIVE_OK);
	struct archive_entry *ae;
	size_t seen = 0, total = 0;
	bool deep_seen = false;
	while (archive_read_next_header(a, &ae) == ARCHIVE_OK) {
		const char *name = archive_entry_pathname(ae);
		total++;
		if (seen < CAP_ARRAY_SIZE(out) && strncmp(name, out[seen].path, strlen(out[seen].path)) == 0 &&
		    (name[strlen(out[seen].path)] == '\0' || name[strlen(out[seen].path)] == '/'))
			seen++;
		if (strcmp(name, deep) == 0) {
			char buf[16];
			assert_int_equal(archive_read_data(a, buf, sizeof(buf)), 5);
			assert_memory_equal(buf, "deep\n", 5);
			deep_seen = true;
		}
	}
	archive_read_free(a);
	assert_int_equal(seen, CAP_ARRAY_SIZE(out));
	assert_true(deep_seen);
	assert_int_equal(total, 6 + 29 + 1);	/* the six above, deep's 29 directories and file */
	result_fini(&r);

	/* The paths on stdin: one entry each, by that name; a missing one named. */
	static const char paths[] = "t/exe\0t/link\0t/nope\0../etc\0t/ro\0";
	file_op(&r, CAP_FILE_TAR_OUT, "x", CAP_TAR_PATHS_STDIN, paths, sizeof(paths) - 1);
	struct want some[] = {
		{ "t/exe", 'f', 0755, "#!/bin/sh\necho run\n" },
		{ "t/link", 'l', 0777, "exe" },
		{ "t/ro", 'd', 0500, NULL },
	};
	check_tar(cap_buf_head(&r.out), cap_buf_used(&r.out), some, CAP_ARRAY_SIZE(some));
	assert_int_equal(r.ex.value, 1);
	assert_non_null(strstr(text(&r.err), "capsule: /work/x/t/nope: No such file or directory\n"));
	assert_non_null(strstr(text(&r.err), "'../etc' is not one below it"));
	result_fini(&r);
	cap_buf_fini(&tar);
}

/* TAR_IN's refusals: a link in the way is never followed, '..' and hard
 * links are named and skipped, NO_REPLACE reports conflicts and skips
 * identical files, /source takes nothing, a broken stream is exit 2. */
static void tar_in_refusals(void **state)
{
	(void)state;
	struct result r, c;
	struct cap_buf tar;
	run(&c, "rm -rf /work/y /tmp/out; mkdir -p /work/y/d /tmp/out; ln -s /tmp/out /work/y/evil;"
		"echo old > /work/y/same; echo old > /work/y/differs");
	result_fini(&c);
	struct want in[] = {
		{ "evil/planted", 'f', 0644, "x\n" },
		{ "../escape", 'f', 0644, "x\n" },
		{ "d", 'f', 0644, "a file where a directory is\n" },
		{ "same", 'f', 0644, "old\n" },
		{ "differs", 'f', 0644, "new\n" },
		{ "fresh", 'f', 0644, "fresh\n" },
	};
	cap_buf_init(&tar);
	make_tar(in, CAP_ARRAY_SIZE(in), &tar);
	/* A hard link entry, patched in before the end blocks. */
	struct cap_buf hl;
	cap_buf_init(&hl);
	struct cap_tar_entry e = { .path = "hard", .type = CAP_TAR_FILE, .mode = 0644 };
	assert_int_equal(cap_tar_header(&hl, &e), 0);
	uint8_t *h = hl.owned_data + hl.off;
	h[156] = '1';
	memcpy(h + 157, "fresh", 5);
	memset(h + 148, ' ', 8);
	unsigned sum = 0;
	for (size_t i = 0; i < CAP_TAR_BLOCK; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	tar.len -= 2 * CAP_TAR_BLOCK;
	cap_buf_append(&tar, h, CAP_TAR_BLOCK);
	cap_tar_end(&tar);
	cap_buf_fini(&hl);

	file_op(&r, CAP_FILE_TAR_IN, "y", CAP_TAR_NO_REPLACE, cap_buf_head(&tar), cap_buf_used(&tar));
	assert_int_equal(r.ex.value, 1);
	assert_string_equal(text(&r.out), "conflict d\nconflict differs\n");
	const char *err = text(&r.err);
	assert_non_null(strstr(err, "capsule: /work/y/evil/planted: a file or a symbolic link is where a directory"));
	assert_non_null(strstr(err, "'../escape' is not a path below it"));
	assert_non_null(strstr(err, "capsule: /work/y/hard: a hard link (tar type '1')"));
	result_fini(&r);
	run(&c, "ls /tmp/out | wc -l; cat /work/y/differs /work/y/fresh; ls -a /work/y | grep -c capsule-tmp");
	assert_string_equal(text(&c.out), "0\nold\nfresh\n0\n");
	result_fini(&c);

	/* Without NO_REPLACE the differing file is replaced, the directory is not. */
	file_op(&r, CAP_FILE_TAR_IN, "y", 0, cap_buf_head(&tar), cap_buf_used(&tar));
	assert_int_equal(r.ex.value, 1);
	assert_string_equal(text(&r.out), "");
	assert_non_null(strstr(text(&r.err), "capsule: /work/y/d: a directory is where the file would be"));
	result_fini(&r);
	run(&c, "cat /work/y/differs; test -d /work/y/d && echo dir");
	assert_string_equal(text(&c.out), "new\ndir\n");
	result_fini(&c);

	/* A stream cut in a file's data: exit 2, no temporary file left. */
	file_op(&r, CAP_FILE_TAR_IN, "y", 0, cap_buf_head(&tar), 7 * CAP_TAR_BLOCK + 2);
	assert_int_equal(r.ex.value, 2);
	assert_non_null(strstr(text(&r.err), "tar stream at byte"));
	result_fini(&r);
	run(&c, "ls -a /work/y | grep -c capsule-tmp");
	assert_string_equal(text(&c.out), "0\n");
	result_fini(&c);

	/* /source is read-only: refused before anything runs. */
	struct cap_file_req req = { .op = CAP_FILE_TAR_IN, .root = "/source", .path = "" };
	uint32_t id;
	result_init(&r);
	assert_int_equal(cap_sandbox_file(sb, &req, 0, &ev, &r, &id, NULL), 0);
	assert_int_equal(cap_sandbox_stdin(sb, id, NULL, 0), 0);
	wait_all();
	assert_int_equal(r.ex.kind, CAP_EXIT_START_FAILED);
	assert_int_equal(r.ex.value, EROFS);
	result_fini(&r);
	cap_buf_fini(&tar);
}

/* --- a read-only root (SETUP's root_readonly) --------------------------- */

/* Only an image root can be read-only, and the bare VM above has none: a
 * named sandbox of the base image (busybox, built in the test's home)
 * whose record asks for it, with /etc/hosts and /etc/hostname seeded into
 * its upper layer as capsule-oci seeds them. It goes the whole way: the
 * record, the shim's load of it, the spec's SETUP (after a template's
 * restore in the first run), the agent's remount. */
#define RO_NAME "ro-root-test"
#define RO_HOSTS "192.0.2.7 seeded-host\n"

static int ro_group_setup(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	/* The shim is `capsule shim`: this build's binary, beside tests/
	 * (else the library would run this program as the shim). */
	if (!getenv("CAPSULE_BIN")) {
		char *dir = cap_exe_dir();
		char bin[4200];
		snprintf(bin, sizeof(bin), "%s/../capsule", dir);
		free(dir);
		setenv("CAPSULE_BIN", bin, 1);
	}
	struct cap_image img;
	memset(&img, 0, sizeof(img));
	if (cap_store_image_ensure("base", NULL, NULL, &img, &err) < 0) {
		fprintf(stderr, "base image: %s\n", err.msg);
		return -1;
	}
	cap_image_fini(&img);
	char seed[] = "/tmp/cap-ro-seed.XXXXXX";
	if (!mkdtemp(seed))
		return -1;
	char etc[64], hosts[80], hostname[80];
	snprintf(etc, sizeof(etc), "%s/etc", seed);
	snprintf(hosts, sizeof(hosts), "%s/hosts", etc);
	snprintf(hostname, sizeof(hostname), "%s/hostname", etc);
	struct cap_record rec;
	cap_record_init(&rec);
	snprintf(rec.name, sizeof(rec.name), RO_NAME);
	snprintf(rec.image_ref, sizeof(rec.image_ref), "base");
	snprintf(rec.hostname, sizeof(rec.hostname), "ro-box");
	rec.root_readonly = true;
	rec.root_seed = seed;
	/* Podman's --read-only /var/tmp and a --tmpfs at a path the image
	 * lacks, two levels deep. */
	rec.tmpfs[0] = (struct cap_setup_tmpfs){ "/var/tmp", "mode=1777", MS_NOSUID | MS_NODEV };
	rec.tmpfs[1] = (struct cap_setup_tmpfs){ "/cache/deep", "size=1m", MS_NOSUID | MS_NODEV | MS_NOEXEC };
	/* Through a symbolic link, as Debian's /var/run -> /run: followed in
	 * the guest's root, the tmpfs lands at /srv/data/pg. */
	rec.tmpfs[2] = (struct cap_setup_tmpfs){ "/lnk/pg", "size=2m", MS_NOSUID | MS_NODEV };
	rec.ntmpfs = 3;
	cap_named_remove(RO_NAME, true, &(struct cap_err){ 0 });	/* a killed run's */
	int r = -1;
	/* mkdtemp made the seed 0700: the guest's / must still be root's
	 * 0755, whatever the seed directory's own mode. */
	char srv[80], lnk[80];
	snprintf(srv, sizeof(srv), "%s/srv/data", seed);
	snprintf(lnk, sizeof(lnk), "%s/lnk", seed);
	if (cap_mkdir_p(srv, 0755) == 0 && symlink("/srv/data", lnk) == 0 && mkdir(etc, 0755) == 0 &&
	    cap_write_file_atomic(hosts, RO_HOSTS, strlen(RO_HOSTS), 0644) == 0 &&
	    cap_write_file_atomic(hostname, "ro-box\n", 7, 0644) == 0 &&
	    cap_named_create(&rec, NULL, NULL, &err) == 0)
		r = 0;
	cap_remove_tree(seed);
	struct cap_named_status st;
	if (r < 0 || cap_named_start(RO_NAME, &err) < 0 ||
	    cap_named_status(RO_NAME, &st, &err) < 0 ||
	    cap_sandbox_attach(st.control, &sb, &err) < 0) {
		fprintf(stderr, "sandbox %s: %s\n", RO_NAME, err.msg);
		char *dir = cap_named_dir(RO_NAME);
		char cmd[4200];
		snprintf(cmd, sizeof(cmd), "tail -n 20 %s/shim.log >&2", dir);
		free(dir);
		if (system(cmd) != 0)
			fprintf(stderr, "no shim log\n");
		cap_named_remove(RO_NAME, true, &(struct cap_err){ 0 });
		return -1;
	}
	qemu_pid = st.vmm_pid;
	return 0;
}

static int ro_group_teardown(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	if (sb)
		cap_sandbox_free(sb);
	sb = NULL;
	int rc = cap_named_stop(RO_NAME, 5000, &err);
	if (rc < 0)
		fprintf(stderr, "stop %s: %s\n", RO_NAME, err.msg);
	if (cap_named_remove(RO_NAME, false, &err) < 0) {
		fprintf(stderr, "remove %s: %s\n", RO_NAME, err.msg);
		rc = -1;
	}
	return rc < 0 ? -1 : 0;
}

/* The record holds it ("root_readonly": true) and loads it back; it is
 * not part of the shape, so that templates are shared with writable
 * roots (SETUP comes after the restore). */
static void ro_root_recorded(void **state)
{
	(void)state;
	struct cap_record rec;
	struct cap_err err = { 0 };
	assert_int_equal(cap_named_load(RO_NAME, &rec, &err), 0);
	assert_true(rec.root_readonly);
	char *dir = cap_named_dir(RO_NAME);
	char path[4200];
	snprintf(path, sizeof(path), "%s/record.json", dir);
	free(dir);
	json_t *j = json_load_file(path, 0, NULL);
	assert_non_null(j);
	assert_true(json_is_true(json_object_get(j, "root_readonly")));
	json_t *tl = json_object_get(j, "tmpfs");
	assert_int_equal(json_array_size(tl), 3);
	assert_string_equal(json_string_value(json_object_get(json_array_get(tl, 1), "destination")),
			    "/cache/deep");
	assert_string_equal(json_string_value(json_object_get(json_array_get(tl, 1), "data")), "size=1m");
	assert_int_equal(json_integer_value(json_object_get(json_array_get(tl, 1), "flags")),
			 MS_NOSUID | MS_NODEV | MS_NOEXEC);
	json_decref(j);
	assert_int_equal(rec.ntmpfs, 3);
	assert_string_equal(rec.tmpfs[0].destination, "/var/tmp");
	assert_string_equal(rec.tmpfs[0].data, "mode=1777");
	assert_int_equal(rec.tmpfs[0].flags, MS_NOSUID | MS_NODEV);

	struct cap_sandbox_spec a, b;
	char sa[512], sb_[512];
	cap_sandbox_spec_named(&a, "i", "u", "w", "s", NULL, "a");
	cap_sandbox_spec_named(&b, "i", "u", "w", "s", NULL, "a");
	cap_sandbox_spec_root_readonly(&b, true);
	cap_sandbox_spec_tmpfs(&b, rec.tmpfs, rec.ntmpfs);
	assert_int_equal(b.setup.ntmpfs, 3);
	assert_string_equal(b.setup.tmpfs[1].destination, "/cache/deep");
	assert_true(b.setup.root_readonly);
	assert_false(a.setup.root_readonly);
	cap_sandbox_spec_shape(&a, sa, sizeof(sa));
	cap_sandbox_spec_shape(&b, sb_, sizeof(sb_));
	assert_string_equal(sa, sb_);
}

/* As root (a container's process), writes to the root fail with EROFS,
 * in the image's files and in the seeded ones, which are there; the
 * guest's own mounts and /work take them. The root keeps nodev,nosuid. */
static void ro_root_refuses_writes(void **state)
{
	(void)state;
	struct result r, u;
	char *argv[] = { "sh", "-c",
		         "touch /bin/x; echo bin=$?; echo y >> /etc/hosts; echo hosts=$?;"
		         "mkdir /newdir; echo mkdir=$?;"
		         "for d in /tmp /run /dev/shm /work; do touch $d/x && echo ok $d; done;"
		         "stat -c 'root %a %u' /;"
		         "cat /etc/hosts /etc/hostname; hostname;"
		         "awk '$2 == \"/\" { o = $4 } END { print o }' /proc/mounts", NULL };
	char *env[] = { "PATH=/usr/bin:/bin:/usr/sbin:/sbin" };
	struct cap_exec_req req = { .argv = argv, .argc = 3, .env = env, .envc = 1,
				    .flags = CAP_EXEC_USER, .uid = 0, .gid = 0 };
	start_req(&r, &req);
	wait_all();
	const char *out = text(&r.out), *err = text(&r.err);
	assert_int_equal(cap_exit_status(&r.ex), 0);
	assert_non_null(strstr(err, "/bin/x: Read-only file system"));
	assert_non_null(strstr(err, "/etc/hosts: Read-only file system"));
	assert_non_null(strstr(out, "bin=1\nhosts=1\nmkdir=1\n"));
	assert_non_null(strstr(out, "ok /tmp\nok /run\nok /dev/shm\nok /work\n"));
	assert_non_null(strstr(out, "root 755 0\n"));
	assert_non_null(strstr(out, RO_HOSTS "ro-box\nro-box\n"));
	const char *opts = strstr(out, "ro-box\nro-box\n") + strlen("ro-box\nro-box\n");
	assert_true(strncmp(opts, "ro,", 3) == 0);
	assert_non_null(strstr(opts, "nosuid"));
	assert_non_null(strstr(opts, "nodev"));
	result_fini(&r);

	/* The tool user's /work and /tmp as ever. */
	run(&u, "touch /work/u /tmp/u && echo ok");
	assert_string_equal(text(&u.err), "");
	assert_string_equal(text(&u.out), "ok\n");
	assert_int_equal(cap_exit_status(&u.ex), 0);
	result_fini(&u);
}

/* The record's tmpfs mounts are there, made before the remount (their
 * directories too, which the image lacks), with their data and flags:
 * writes go there, the root still refuses them. */
static void ro_root_tmpfs_mounts(void **state)
{
	(void)state;
	struct result r, u;
	char *argv[] = { "sh", "-c",
		         "echo x > /var/tmp/a && echo y > /cache/deep/b && cat /var/tmp/a /cache/deep/b;"
		         "grep -E ' /(var/tmp|cache/deep|srv/data/pg) ' /proc/mounts;"
		         "echo w > /lnk/pg/f && cat /srv/data/pg/f;"
		         "df -k /cache/deep | awk 'NR == 2 { print \"df\", $2 }';"
		         "stat -c '%a %u' /var/tmp /cache;"
		         "touch /bin/y; echo bin=$?; touch /cache/c; echo cache=$?", NULL };
	char *env[] = { "PATH=/usr/bin:/bin:/usr/sbin:/sbin" };
	struct cap_exec_req req = { .argv = argv, .argc = 3, .env = env, .envc = 1,
				    .flags = CAP_EXEC_USER, .uid = 0, .gid = 0 };
	start_req(&r, &req);
	wait_all();
	const char *out = text(&r.out);
	assert_int_equal(cap_exit_status(&r.ex), 0);
	assert_non_null(strstr(out, "x\ny\n"));
	const char *vt = strstr(out, "tmpfs /var/tmp tmpfs rw,nosuid,nodev");
	const char *cd = strstr(out, "tmpfs /cache/deep tmpfs rw,nosuid,nodev,noexec");
	assert_non_null(vt);
	assert_non_null(cd);
	assert_non_null(strstr(cd, "size=1024k"));
	const char *pg = strstr(out, "tmpfs /srv/data/pg tmpfs rw,nosuid,nodev");
	assert_non_null(pg);
	assert_non_null(strstr(pg, "size=2048k"));
	assert_non_null(strstr(out, "\nw\n"));
	assert_non_null(strstr(out, "df 1024\n"));
	assert_non_null(strstr(out, "1777 0\n755 0\n"));
	assert_non_null(strstr(out, "bin=1\ncache=1\n"));
	assert_non_null(strstr(text(&r.err), "/bin/y: Read-only file system"));
	result_fini(&r);
	/* The tool user writes in /var/tmp (1777) too. */
	run(&u, "echo z > /var/tmp/u && cat /var/tmp/u");
	assert_string_equal(text(&u.out), "z\n");
	assert_int_equal(cap_exit_status(&u.ex), 0);
	result_fini(&u);
}

int main(int argc, char **argv)
{
	if (argc > 1) {
		fprintf(stderr, "test-vm takes no arguments (run as `%s %s`?)\n", argv[0], argv[1]);
		return 2;
	}
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(started_as_asked),
		cmocka_unit_test(stdout_stderr_separated),
		cmocka_unit_test(exit_code_propagated),
		cmocka_unit_test(signal_propagated),
		cmocka_unit_test(runs_as_uid_1000),
		cmocka_unit_test(output_cut_at_cap_with_marker),
		cmocka_unit_test(slow_host_gets_all_output),
		cmocka_unit_test(timeout_kills_process_group),
		cmocka_unit_test(concurrent_execs),
		cmocka_unit_test(env_cwd_and_stdin),
		cmocka_unit_test(missing_command_and_bad_cwd),
		cmocka_unit_test(signal_forwarded_to_group),
		cmocka_unit_test(user_root_as_asked),
		cmocka_unit_test(user_other_as_asked),
		cmocka_unit_test(user_root_pty),
		cmocka_unit_test(signal_scopes),
		cmocka_unit_test(manifest_of_written_tree),
		cmocka_unit_test(tar_in_and_out),
		cmocka_unit_test(tar_in_refusals),
	};
	int failed = cmocka_run_group_tests_name("vm", tests, group_setup, group_teardown);
	/* The VM must be gone once the group is torn down. */
	if (qemu_pid > 0 && kill(qemu_pid, 0) == 0) {
		fprintf(stderr, "QEMU pid %d is still running after teardown\n", (int)qemu_pid);
		failed++;
	}
	sb = NULL;
	qemu_pid = 0;
	const struct CMUnitTest ro_tests[] = {
		cmocka_unit_test(ro_root_recorded),
		cmocka_unit_test(ro_root_refuses_writes),
		cmocka_unit_test(ro_root_tmpfs_mounts),
	};
	failed += cmocka_run_group_tests_name("vm-readonly-root", ro_tests, ro_group_setup,
					      ro_group_teardown);
	if (qemu_pid > 0 && kill(qemu_pid, 0) == 0) {
		fprintf(stderr, "QEMU pid %d of %s is still running after teardown\n", (int)qemu_pid, RO_NAME);
		failed++;
	}
	return failed;
}
