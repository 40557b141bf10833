/* Host-side protocol client: demultiplexing, and a hostile guest. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <cmocka.h>

#include "client.h"
#include "util.h"

struct seen {
	struct cap_buf out[3];
	int done;
	struct cap_exit ex;
	bool has_exit;
	int errnum;
	char msg[256];
	int syncing;
};

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)id;
	struct seen *s = ud;
	assert_true(fd == 1 || fd == 2);
	cap_buf_append(&s->out[fd], p, n);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex,
		    int errnum, const char *msg)
{
	(void)id;
	struct seen *s = ud;
	s->done++;
	s->has_exit = ex != NULL;
	if (ex)
		s->ex = *ex;
	s->errnum = errnum;
	if (msg)
		snprintf(s->msg, sizeof(s->msg), "%s", msg);
}

static void on_syncing(void *ud, uint32_t id)
{
	(void)id;
	struct seen *s = ud;
	assert_int_equal(s->done, 0);	/* always before the end */
	s->syncing++;
}

static const struct cap_exec_events ev = { on_output, on_done, on_syncing };

struct fixture {
	struct cap_client c;
	struct seen s;
	struct cap_buf g;	/* what the fake guest sends */
};

static int setup(void **state)
{
	struct fixture *fx = xcalloc(1, sizeof(*fx));
	cap_client_init(&fx->c);
	cap_buf_init(&fx->g);
	for (int i = 0; i < 3; i++)
		cap_buf_init(&fx->s.out[i]);
	*state = fx;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *fx = *state;
	cap_client_fini(&fx->c);
	cap_buf_fini(&fx->g);
	for (int i = 0; i < 3; i++)
		cap_buf_fini(&fx->s.out[i]);
	free(fx);
	return 0;
}

static int feed(struct fixture *fx, struct cap_err *err)
{
	int r = cap_client_feed(&fx->c, cap_buf_head(&fx->g), cap_buf_used(&fx->g), err);
	fx->g.off = fx->g.len = 0;
	return r;
}

static void hello(struct fixture *fx)
{
	cap_proto_hello_encode(&fx->g, "test-agent");
	assert_int_equal(feed(fx, NULL), 0);
	assert_true(fx->c.hello);
}

static uint32_t start(struct fixture *fx, uint32_t cap)
{
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .output_cap = cap };
	uint32_t id = 0;
	assert_int_equal(cap_client_exec(&fx->c, &req, &ev, &fx->s, &id, NULL), 0);
	assert_true(id > 0);
	return id;
}

static void separates_stdout_stderr_and_exit(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	/* The host spoke first (HELLO); then the EXEC frame it queued. */
	struct cap_frame f;
	int k = cap_proto_parse(cap_buf_head(&fx->c.out), cap_buf_used(&fx->c.out), &f);
	assert_true(k > 0);
	assert_int_equal(f.type, CAP_MSG_HELLO);
	assert_true(cap_proto_parse(cap_buf_head(&fx->c.out) + k, cap_buf_used(&fx->c.out) - k, &f) > 0);
	assert_int_equal(f.type, CAP_MSG_EXEC);
	assert_int_equal(f.stream, id);

	cap_proto_put(&fx->g, CAP_MSG_STDOUT, id, "out1 ", 5);
	cap_proto_put(&fx->g, CAP_MSG_STDERR, id, "err", 3);
	cap_proto_put(&fx->g, CAP_MSG_STDOUT, id, "out2", 4);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 3 };
	cap_proto_exit_encode(&fx->g, id, &ex);
	assert_int_equal(feed(fx, NULL), 0);
	assert_int_equal(cap_buf_used(&fx->s.out[1]), 9);
	assert_memory_equal(cap_buf_head(&fx->s.out[1]), "out1 out2", 9);
	assert_memory_equal(cap_buf_head(&fx->s.out[2]), "err", 3);
	assert_int_equal(fx->s.done, 1);
	assert_int_equal(fx->s.ex.value, 3);
	assert_int_equal(fx->c.nactive, 0);
}

static void byte_by_byte(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	cap_proto_put(&fx->g, CAP_MSG_STDOUT, id, "abc", 3);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
	cap_proto_exit_encode(&fx->g, id, &ex);
	struct cap_buf all = fx->g;
	for (size_t i = 0; i < cap_buf_used(&all); i++)
		assert_int_equal(cap_client_feed(&fx->c, all.owned_data + i, 1, NULL), 0);
	assert_int_equal(fx->s.done, 1);
	assert_memory_equal(cap_buf_head(&fx->s.out[1]), "abc", 3);
}

static void frame_before_hello(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	cap_proto_put(&fx->g, CAP_MSG_STDOUT, 1, "x", 1);
	assert_int_equal(feed(fx, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "before HELLO"));
}

static void version_mismatch(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	uint8_t p[8] = { 0 };
	cap_put_u32(p, 99);
	cap_proto_put(&fx->g, CAP_MSG_HELLO, 0, p, 8);
	assert_int_equal(feed(fx, &err), -EPROTONOSUPPORT);
	assert_non_null(strstr(err.msg, "v99"));
}

static void unknown_stream_id(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	cap_proto_put(&fx->g, CAP_MSG_STDOUT, 12345, "x", 1);
	assert_int_equal(feed(fx, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "stream 12345"));
}

static void exit_for_unknown_stream(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE };
	cap_proto_exit_encode(&fx->g, 77, &ex);
	assert_int_equal(feed(fx, &err), -EPROTO);
	assert_int_equal(fx->s.done, 0);
}

/* A hostile length is refused from the header alone: the client does
 * not wait for (or buffer) four gigabytes. */
static void oversized_length_refused_early(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	uint8_t h[CAP_PROTO_HEADER] = { 0 };
	cap_put_u32(h, 0xfffffff0u);
	cap_put_u16(h + 4, CAP_MSG_STDOUT);
	cap_put_u32(h + 8, 1);
	assert_int_equal(cap_client_feed(&fx->c, h, sizeof(h), &err), -EPROTO);
	assert_non_null(strstr(err.msg, "limit"));
	assert_true(fx->c.in.cap < 1024 * 1024);
}

static void unknown_type(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	uint8_t h[CAP_PROTO_HEADER] = { 0 };
	cap_put_u16(h + 4, 200);
	assert_int_equal(cap_client_feed(&fx->c, h, sizeof(h), &err), -EPROTO);
	assert_non_null(strstr(err.msg, "unknown type 200"));
}

static void host_only_message_from_guest(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	uint8_t sig[4] = { 9, 0, 0, 0 };
	cap_proto_put(&fx->g, CAP_MSG_SIGNAL, 1, sig, 4);
	assert_int_equal(feed(fx, &err), -EPROTO);
}

/* CLOCK goes to the guest only, and carries the host's time now. */
static void clock_queued_and_host_only(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	size_t before = cap_buf_used(&fx->c.out);
	struct timespec t0, t1;
	clock_gettime(CLOCK_REALTIME, &t0);
	cap_client_clock(&fx->c);
	clock_gettime(CLOCK_REALTIME, &t1);
	struct cap_frame f;
	assert_true(cap_proto_parse(cap_buf_head(&fx->c.out) + before, cap_buf_used(&fx->c.out) - before, &f) > 0);
	assert_int_equal(f.type, CAP_MSG_CLOCK);
	int64_t ns;
	assert_int_equal(cap_proto_clock_decode(f.payload, f.len, &ns), 0);
	assert_true(ns >= (int64_t)t0.tv_sec * 1000000000 + t0.tv_nsec);
	assert_true(ns <= (int64_t)t1.tv_sec * 1000000000 + t1.tv_nsec);
	cap_proto_clock_encode(&fx->g, ns);
	assert_int_equal(feed(fx, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "CLOCK"));
}

/* The host enforces the cap too: a guest that ignores it cannot flood. */
static void host_enforces_output_cap(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 1000);
	uint8_t chunk[4096];
	memset(chunk, 'y', sizeof(chunk));
	for (int i = 0; i < 50; i++) {
		cap_proto_put(&fx->g, CAP_MSG_STDOUT, id, chunk, sizeof(chunk));
		assert_int_equal(feed(fx, NULL), 0);
	}
	struct cap_exit ex = { .kind = CAP_EXIT_CODE };
	cap_proto_exit_encode(&fx->g, id, &ex);
	assert_int_equal(feed(fx, NULL), 0);
	assert_true(cap_buf_used(&fx->s.out[1]) <= 1000 + 128);
	assert_true(fx->s.ex.flags & CAP_EXIT_TRUNCATED);
}

static void rejected_exec(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	cap_proto_error_encode(&fx->g, id, EBUSY, "too many");
	assert_int_equal(feed(fx, NULL), 0);
	assert_int_equal(fx->s.done, 1);
	assert_false(fx->s.has_exit);
	assert_int_equal(fx->s.errnum, EBUSY);
	assert_string_equal(fx->s.msg, "too many");
}

static void too_many_streams(void **state)
{
	struct fixture *fx = *state;
	struct cap_err err = { 0 };
	hello(fx);
	for (int i = 0; i < CAP_PROTO_MAX_STREAMS; i++)
		start(fx, 0);
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1 };
	uint32_t id;
	assert_int_equal(cap_client_exec(&fx->c, &req, &ev, &fx->s, &id, &err), -EBUSY);
}

static void exec_before_hello(void **state)
{
	struct fixture *fx = *state;
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1 };
	uint32_t id;
	assert_int_equal(cap_client_exec(&fx->c, &req, &ev, &fx->s, &id, NULL), -ENOTCONN);
}

static void stdin_split_into_frames(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	fx->c.out.off = fx->c.out.len = 0;
	size_t n = CAP_PROTO_MAX_PAYLOAD * 2 + 10;
	uint8_t *data = xcalloc(1, n);
	assert_int_equal(cap_client_stdin(&fx->c, id, data, n), 0);
	assert_int_equal(cap_client_stdin(&fx->c, id, NULL, 0), 0);
	assert_int_equal(cap_client_stdin(&fx->c, 999, data, 1), -ENOENT);
	size_t frames = 0, bytes = 0;
	struct cap_frame f;
	int r;
	while ((r = cap_proto_parse(cap_buf_head(&fx->c.out), cap_buf_used(&fx->c.out), &f)) > 0) {
		assert_int_equal(f.type, CAP_MSG_STDIN);
		frames++;
		bytes += f.len;
		cap_buf_consume(&fx->c.out, (size_t)r);
	}
	assert_int_equal(frames, 4);	/* 3 data frames + the empty EOF frame */
	assert_int_equal(bytes, n);
	free(data);
}

/* SIGNAL: the default scope as the old 4-byte frame (older agents take
 * it), another scope as a second word; an unknown stream is refused. */
static void signal_scopes(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	fx->c.out.off = fx->c.out.len = 0;
	assert_int_equal(cap_client_signal(&fx->c, id, 15), 0);
	assert_int_equal(cap_client_signal_scope(&fx->c, id, 10, CAP_SIGNAL_GROUP), 0);
	assert_int_equal(cap_client_signal_scope(&fx->c, id, 10, CAP_SIGNAL_PROCESS), 0);
	assert_int_equal(cap_client_signal_scope(&fx->c, id, 9, CAP_SIGNAL_ALL), 0);
	assert_int_equal(cap_client_signal_scope(&fx->c, 999, 9, CAP_SIGNAL_ALL), -ENOENT);
	const struct { uint32_t len, sig, scope; } want[] = {
		{ 4, 15, 0 }, { 4, 10, 0 }, { 8, 10, CAP_SIGNAL_PROCESS }, { 8, 9, CAP_SIGNAL_ALL },
	};
	struct cap_frame f;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(want); i++) {
		int r = cap_proto_parse(cap_buf_head(&fx->c.out), cap_buf_used(&fx->c.out), &f);
		assert_true(r > 0);
		assert_int_equal(f.type, CAP_MSG_SIGNAL);
		assert_int_equal(f.stream, id);
		assert_int_equal(f.len, want[i].len);
		assert_int_equal(cap_get_u32(f.payload), want[i].sig);
		if (f.len == 8)
			assert_int_equal(cap_get_u32(f.payload + 4), want[i].scope);
		cap_buf_consume(&fx->c.out, (size_t)r);
	}
	assert_int_equal(cap_buf_used(&fx->c.out), 0);
}

static void listeners_replace_the_set(void **state)
{
	struct fixture *fx = *state;
	const uint16_t a[] = { 8000, 8080 }, b[] = { 3000 };
	hello(fx);
	assert_null(fx->c.listeners);
	assert_false(fx->c.listeners_changed);
	assert_int_equal(cap_proto_listeners_encode(&fx->g, NULL, 0), 0);
	assert_int_equal(feed(fx, NULL), 0);
	assert_true(fx->c.listeners_changed);
	assert_int_equal(fx->c.nlisteners, 0);
	fx->c.listeners_changed = false;
	assert_int_equal(cap_proto_listeners_encode(&fx->g, a, 2), 0);
	assert_int_equal(feed(fx, NULL), 0);
	assert_true(fx->c.listeners_changed);
	assert_int_equal(fx->c.nlisteners, 2);
	assert_memory_equal(fx->c.listeners, a, sizeof(a));
	/* Two sets in one read: the latest wins, the first is freed (ASan
	 * says if not). */
	fx->c.listeners_changed = false;
	assert_int_equal(cap_proto_listeners_encode(&fx->g, a, 1), 0);
	assert_int_equal(cap_proto_listeners_encode(&fx->g, b, 1), 0);
	assert_int_equal(feed(fx, NULL), 0);
	assert_true(fx->c.listeners_changed);
	assert_int_equal(fx->c.nlisteners, 1);
	assert_int_equal(fx->c.listeners[0], 3000);
	/* cap_client_fini (teardown) frees the last set. */
}

/* Send a raw LISTENERS frame: n, then k ports as given, on stream. */
static void raw_listeners(struct fixture *fx, uint32_t stream, uint32_t n,
			  const uint16_t *ports, uint32_t k)
{
	uint8_t p[64];
	assert_true(4 + 2 * (size_t)k <= sizeof(p));
	cap_put_u32(p, n);
	for (uint32_t i = 0; i < k; i++)
		cap_put_u16(p + 4 + 2 * i, ports[i]);
	cap_proto_put(&fx->g, CAP_MSG_LISTENERS, stream, p, 4 + 2 * (size_t)k);
}

static void listeners_malformed_is_a_protocol_error(void **state)
{
	const uint16_t ok[] = { 80, 443 }, unsorted[] = { 443, 80 }, dup[] = { 80, 80 },
		       zero[] = { 0 };
	struct {
		uint32_t stream, n;
		const uint16_t *ports;
		uint32_t k;
	} cases[] = {
		{ 1, 2, ok, 2 },	/* not stream 0 */
		{ 0, 3, ok, 2 },	/* count over the bytes */
		{ 0, 1, ok, 2 },	/* trailing bytes */
		{ 0, 2, unsorted, 2 },
		{ 0, 2, dup, 2 },
		{ 0, 1, zero, 1 },
		{ 0, 0xffffffffu, NULL, 0 },
	};
	(void)state;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cases); i++) {
		void *st;
		setup(&st);
		struct fixture *fx = st;
		hello(fx);
		raw_listeners(fx, cases[i].stream, cases[i].n, cases[i].ports, cases[i].k);
		struct cap_err err = { 0 };
		assert_int_equal(feed(fx, &err), -EPROTO);
		assert_non_null(strstr(err.msg, "LISTENERS"));
		assert_null(fx->c.listeners);
		assert_false(fx->c.listeners_changed);
		teardown(&st);
	}
	/* Shorter than the count itself. */
	void *st;
	setup(&st);
	struct fixture *fx = st;
	hello(fx);
	cap_proto_put(&fx->g, CAP_MSG_LISTENERS, 0, "\0\0", 2);
	assert_int_equal(feed(fx, NULL), -EPROTO);
	teardown(&st);
}

static void listeners_before_hello(void **state)
{
	struct fixture *fx = *state;
	assert_int_equal(cap_proto_listeners_encode(&fx->g, NULL, 0), 0);
	assert_int_equal(feed(fx, NULL), -EPROTO);
	assert_false(fx->c.listeners_changed);
}

/* SYNCING: the stream's process ended and its writes are being flushed;
 * the owner hears of it before the EXIT, which carries the durable flag
 * and the flush's time. */
static void syncing_then_durable_exit(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	cap_proto_put(&fx->g, CAP_MSG_SYNCING, id, NULL, 0);
	assert_int_equal(feed(fx, NULL), 0);
	assert_int_equal(fx->s.syncing, 1);
	assert_int_equal(fx->s.done, 0);
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .flags = CAP_EXIT_DURABLE, .sync_ms = 12 };
	cap_proto_exit_encode(&fx->g, id, &ex);
	assert_int_equal(feed(fx, NULL), 0);
	assert_int_equal(fx->s.done, 1);
	assert_true(fx->s.ex.flags & CAP_EXIT_DURABLE);
	assert_int_equal(fx->s.ex.sync_ms, 12);
}

/* SYNCING names an open stream and carries nothing; anything else ends
 * the connection. */
static void syncing_malformed_is_a_protocol_error(void **state)
{
	struct fixture *fx = *state;
	hello(fx);
	struct cap_err err = { 0 };
	cap_proto_put(&fx->g, CAP_MSG_SYNCING, 77, NULL, 0);
	assert_int_equal(feed(fx, &err), -EPROTO);
	assert_non_null(strstr(err.msg, "SYNCING for stream 77"));

	teardown(state);
	setup(state);
	fx = *state;
	hello(fx);
	uint32_t id = start(fx, 0);
	cap_proto_put(&fx->g, CAP_MSG_SYNCING, id, "x", 1);
	assert_int_equal(feed(fx, NULL), -EPROTO);
	assert_int_equal(fx->s.syncing, 0);
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(separates_stdout_stderr_and_exit),
		T(byte_by_byte),
		T(frame_before_hello),
		T(version_mismatch),
		T(unknown_stream_id),
		T(exit_for_unknown_stream),
		T(oversized_length_refused_early),
		T(unknown_type),
		T(host_only_message_from_guest),
		T(clock_queued_and_host_only),
		T(host_enforces_output_cap),
		T(rejected_exec),
		T(too_many_streams),
		T(exec_before_hello),
		T(stdin_split_into_frames),
		T(signal_scopes),
		T(listeners_replace_the_set),
		T(listeners_malformed_is_a_protocol_error),
		T(listeners_before_hello),
		T(syncing_then_durable_exit),
		T(syncing_malformed_is_a_protocol_error),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
