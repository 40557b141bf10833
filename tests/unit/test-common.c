/* src/common: buffers, errors, small-file reads. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <stdlib.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "buf.h"
#include "err.h"
#include "sha256.h"
#include "sock.h"
#include "utf8.h"
#include "util.h"

/* A wiping buffer leaves no byte it no longer holds: consumed bytes are
 * zero, and so is the tail a compaction moved away from. */
static void buf_wipe(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	b.wipe = true;
	cap_buf_append(&b, "secret-value-1234", 17);
	cap_buf_consume(&b, 7);
	for (size_t i = 0; i < 7; i++)
		assert_int_equal(b.owned_data[i], 0);
	assert_memory_equal(cap_buf_head(&b), "value-1234", 10);
	/* Fill to capacity so the next reserve compacts (and grows). */
	size_t room = b.cap - b.len;
	uint8_t *p = cap_buf_reserve(&b, room);
	memset(p, 'x', room);
	cap_buf_commit(&b, room);
	cap_buf_consume(&b, 10);
	(void)cap_buf_reserve(&b, 10);	/* compacts: 10 bytes freed at the front */
	assert_int_equal(b.off, 0);
	for (size_t i = b.len; i < b.cap; i++)
		assert_int_equal(b.owned_data[i], 0);
	assert_null(memmem(b.owned_data, b.cap, "value-1234", 10));
	(void)cap_buf_reserve(&b, b.cap * 3);	/* grows */
	assert_null(memmem(b.owned_data, b.cap, "value-1234", 10));
	cap_buf_fini(&b);
}

static void buf_append_consume_compact(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	for (int i = 0; i < 10000; i++)
		cap_buf_append(&b, "abcd", 4);
	assert_int_equal(cap_buf_used(&b), 40000);
	cap_buf_consume(&b, 39998);
	assert_memory_equal(cap_buf_head(&b), "cd", 2);
	size_t cap = b.cap;
	/* Reserving less than the free space after compaction must not grow. */
	cap_buf_reserve(&b, cap - 2);
	assert_int_equal(b.cap, cap);
	assert_memory_equal(cap_buf_head(&b), "cd", 2);
	cap_buf_consume(&b, 2);
	assert_int_equal(cap_buf_used(&b), 0);
	cap_buf_fini(&b);
}

static void never_called(void *ud, const char *p, size_t n)
{
	(void)ud;
	(void)p;
	(void)n;
	fail_msg("a line in an empty buffer");
}

static void never_too_long(void *ud)
{
	(void)ud;
	fail_msg("too long in an empty buffer");
}

/* A buffer that never held a byte (no storage yet): its head, text and
 * lines, a reserve of nothing and a consume of nothing do no arithmetic
 * on a null pointer (UBSan: "applying zero offset to null pointer"). */
static void buf_empty(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	b.wipe = true;
	assert_int_equal(cap_buf_used(&b), 0);
	const uint8_t *h = cap_buf_head(&b);
	assert_non_null(h);
	char out[1] = { 'x' };
	memcpy(out, h, cap_buf_used(&b));
	assert_int_equal(out[0], 'x');
	char *t = cap_buf_text(&b);
	assert_string_equal(t, "");
	free(t);
	struct cap_lines st = { 0 };
	cap_buf_lines(&b, 16, &st, never_called, never_too_long, NULL);
	cap_buf_consume(&b, 0);
	uint8_t *w = cap_buf_reserve(&b, 0);
	assert_non_null(w);
	cap_buf_commit(&b, 0);
	cap_buf_append(&b, "", 0);
	assert_int_equal(cap_buf_used(&b), 0);
	cap_buf_fini(&b);
}

static void err_set_and_prefix(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	assert_int_equal(cap_err_set(&err, ENOENT, "file %s is missing", "/x"), -ENOENT);
	assert_int_equal(err.code, ENOENT);
	cap_err_prefix(&err, "starting %d", 1);
	assert_string_equal(err.msg, "starting 1: file /x is missing");
	assert_int_equal(cap_err_set(NULL, -EINVAL, "ignored"), -EINVAL);

	/* A long message stays NUL-terminated when prefixed. */
	char longmsg[2000];
	memset(longmsg, 'm', sizeof(longmsg) - 1);
	longmsg[sizeof(longmsg) - 1] = '\0';
	cap_err_set(&err, EIO, "%s", longmsg);
	cap_err_prefix(&err, "ctx");
	assert_int_equal(strlen(err.msg), sizeof(err.msg) - 1);
	assert_memory_equal(err.msg, "ctx: mmm", 8);
}

static void read_file_limits(void **state)
{
	(void)state;
	char path[] = "/tmp/capsule-test-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	char data[10000];
	memset(data, 'z', sizeof(data));
	assert_int_equal(cap_write_all(fd, data, sizeof(data)), 0);
	close(fd);
	char *s = NULL;
	assert_int_equal(cap_read_file(path, sizeof(data), &s), (ssize_t)sizeof(data));
	assert_int_equal(s[sizeof(data)], '\0');
	free(s);
	s = NULL;
	assert_int_equal(cap_read_file(path, 100, &s), -EFBIG);
	assert_null(s);
	unlink(path);
	assert_int_equal(cap_read_file(path, 100, &s), -ENOENT);
}

/* A write to a socket whose peer has gone (QEMU's QMP after QEMU died
 * under a boot that failed) is -EPIPE for the caller, not a SIGPIPE
 * that kills it: the child keeps SIGPIPE at its default. */
static void write_all_closed_socket(void **state)
{
	(void)state;
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		signal(SIGPIPE, SIG_DFL);
		int sv[2];
		if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) < 0)
			_exit(3);
		close(sv[1]);
		_exit(cap_write_all(sv[0], "x", 1) == -EPIPE ? 0 : 4);
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_false(WIFSIGNALED(st));
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void sha256_known_vector(void **state)
{
	(void)state;
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, "abc", 3);
	cap_sha256_final_hex(&h, hex);
	assert_string_equal(hex, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

static void dir_names_sorted(void **state)
{
	(void)state;
	char dir[] = "/tmp/capsule-test-names.XXXXXX";
	assert_non_null(mkdtemp(dir));
	const char *made[] = { "b", "a-b", "a", "A", "a.b" };
	for (size_t i = 0; i < 5; i++) {
		_cleanup_free_ char *p = xasprintf("%s/%s", dir, made[i]);
		assert_int_equal(mkdir(p, 0700), 0);
	}
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	char **v;
	size_t n;
	for (int round = 0; round < 2; round++) {	/* dfd's position does not matter */
		assert_int_equal(cap_dir_names(dfd, &v, &n), 0);
		assert_int_equal(n, 5);
		const char *want[] = { "A", "a", "a-b", "a.b", "b" };
		for (size_t i = 0; i < n; i++)
			assert_string_equal(v[i], want[i]);
		cap_strv_free(v, n);
	}
	close(dfd);
	assert_int_equal(cap_dir_names(-1, &v, &n), -EBADF);
	for (size_t i = 0; i < 5; i++) {
		_cleanup_free_ char *p = xasprintf("%s/%s", dir, made[i]);
		rmdir(p);
	}
	rmdir(dir);
}

static void path_last(void **state)
{
	(void)state;
	const char *cases[][2] = { { "a/b/c", "c" }, { "a/b/", "b" }, { "c", "c" }, { "/", "" },
				   { "///", "" }, { "", "" }, { "/x//", "x" } };
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		_cleanup_free_ char *s = cap_path_last(cases[i][0]);
		assert_string_equal(s, cases[i][1]);
	}
}

static char *visible(const char *p, size_t n)
{
	struct cap_buf b;
	cap_buf_init(&b);
	cap_utf8_visible(p, n, &b);
	cap_buf_append(&b, "", 1);
	char *s = xstrdup((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	return s;
}

/* Review output shown on a terminal: what the terminal would act on is
 * shown instead, so "run_evil();" cannot be erased by ESC [2K and CR. */
static void utf8_visible(void **state)
{
	(void)state;
	static const struct { const char *in; size_t n; const char *want; } cases[] = {
		{ "+run_evil();\033[2K\r// harmless\n", 0, "+run_evil();^[[2K^M// harmless\n" },
		{ "tab\tand\nnewline kept", 0, "tab\tand\nnewline kept" },
		{ "nul\0del\177bs\b", 11, "nul^@del^?bs^H" },
		{ "\x01\x1f", 0, "^A^_" },
		{ "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82", 0, "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x99\x82" },
		{ "bad \xff\xc3( \xed\xa0\x80", 0, "bad <FF><C3>( <ED><A0><80>" },	/* not UTF-8, a surrogate */
		{ "csi \xc2\x9b" "2J", 0, "csi <U+009B>2J" },	/* a C1 control */
		{ "if (admin \xe2\x80\xae{ \xe2\x81\xa6x", 0, "if (admin <U+202E>{ <U+2066>x" },	/* bidi */
		{ "cut \xe2\x82", 0, "cut <E2><82>" },	/* a sequence cut at the end */
		{ "", 0, "" },
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		size_t n = cases[i].n ? cases[i].n : strlen(cases[i].in);
		_cleanup_free_ char *got = visible(cases[i].in, n);
		if (strcmp(got, cases[i].want) != 0)
			fail_msg("case %zu: got \"%s\", wanted \"%s\"", i, got, cases[i].want);
	}
}

/* cap_recv_fd: one descriptor taken; none, the bytes alone; two
 * refused with -EPROTO and neither left open in the receiver. */
static void recv_fd_one_none_two(void **state)
{
	(void)state;
	int sp[2], pipefd[2], fd = -2;
	char buf[8];
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sp), 0);
	assert_int_equal(pipe(pipefd), 0);
	assert_int_equal(cap_send_fd(sp[0], pipefd[1], "one", 3, 0), 3);
	assert_int_equal(cap_recv_fd(sp[1], buf, 3, &fd), 3);
	assert_true(fd >= 0 && fd != pipefd[1]);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	close(fd);
	assert_int_equal(send(sp[0], "two", 3, 0), 3);
	assert_int_equal(cap_recv_fd(sp[1], buf, 3, &fd), 3);
	assert_int_equal(fd, -1);
	/* Two descriptors in one message. */
	union {
		struct cmsghdr h;
		char b[CMSG_SPACE(2 * sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = { "xyz", 3 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.b, .msg_controllen = sizeof(u.b) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(2 * sizeof(int));
	memcpy(CMSG_DATA(c), pipefd, 2 * sizeof(int));
	assert_int_equal(sendmsg(sp[0], &m, 0), 3);
	int before = open("/dev/null", O_RDONLY);
	close(before);
	assert_int_equal(cap_recv_fd(sp[1], buf, 3, &fd), -EPROTO);
	assert_int_equal(fd, -1);
	int after = open("/dev/null", O_RDONLY);
	assert_int_equal(after, before);	/* the lowest free descriptor did not move: none kept */
	close(after);
	close(pipefd[0]);
	close(pipefd[1]);
	close(sp[0]);
	close(sp[1]);
}

/* cap_unix_connect: a listener reached (non-blocking when asked, with
 * its timeouts set); no listener -ECONNREFUSED, no file -ENOENT, a
 * path longer than sun_path -ENAMETOOLONG; nothing left open on error. */
static void unix_connect_cases(void **state)
{
	(void)state;
	char dir[] = "/tmp/capsule-test-XXXXXX";
	assert_non_null(mkdtemp(dir));
	char path[64];
	snprintf(path, sizeof(path), "%s/s.sock", dir);
	struct cap_err err = { 0 };
	int l = cap_unix_listen(path, &err);
	assert_true(l >= 0);
	int fd = cap_unix_connect(path, SOCK_NONBLOCK, 1500);
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
	struct timeval tv;
	socklen_t tl = sizeof(tv);
	assert_int_equal(getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &tl), 0);
	assert_true(tv.tv_sec == 1 && tv.tv_usec == 500000);
	close(fd);
	fd = cap_unix_connect(path, 0, 0);
	assert_true(fd >= 0);
	assert_false(fcntl(fd, F_GETFL) & O_NONBLOCK);
	close(fd);
	close(l);
	int before = open("/dev/null", O_RDONLY);
	close(before);
	assert_int_equal(cap_unix_connect(path, 0, 0), -ECONNREFUSED);
	unlink(path);
	assert_int_equal(cap_unix_connect(path, 0, 0), -ENOENT);
	char longp[200];
	memset(longp, 'a', sizeof(longp) - 1);
	longp[0] = '/';
	longp[sizeof(longp) - 1] = '\0';
	assert_int_equal(cap_unix_connect(longp, 0, 0), -ENAMETOOLONG);
	int after = open("/dev/null", O_RDONLY);
	assert_int_equal(after, before);	/* no socket left open by a failure */
	close(after);
	rmdir(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(buf_append_consume_compact),
		cmocka_unit_test(buf_wipe),
		cmocka_unit_test(buf_empty),
		cmocka_unit_test(err_set_and_prefix),
		cmocka_unit_test(read_file_limits),
		cmocka_unit_test(write_all_closed_socket),
		cmocka_unit_test(sha256_known_vector),
		cmocka_unit_test(dir_names_sorted),
		cmocka_unit_test(path_last),
		cmocka_unit_test(utf8_visible),
		cmocka_unit_test(recv_fd_one_none_two),
		cmocka_unit_test(unix_connect_cases),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
