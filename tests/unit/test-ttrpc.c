/* src/shim/ttrpc: the frame header's bytes, request and response frames
 * through the splitter and the decoders, and the frames the reader and
 * the splitter refuse: truncated, oversized (skipped, the stream kept in
 * step), of a type that is neither, a body that is no message; then one
 * call of the client against a server thread on a unix socket. */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "ttrpc.h"
#include "util.h"

static void header_bytes(void **state)
{
	(void)state;
	struct cap_ttrpc_header h = { .length = 0x01020304, .stream = 0x0a0b0c0d, .type = CAP_TTRPC_RESPONSE, .flags = 0 };
	uint8_t b[CAP_TTRPC_HEADER_LEN];
	cap_ttrpc_header_encode(b, &h);
	const uint8_t want[] = { 1, 2, 3, 4, 0x0a, 0x0b, 0x0c, 0x0d, 2, 0 };
	assert_memory_equal(b, want, sizeof(want));
	/* Over 4 MiB: refused, but the fields are there to answer it. */
	struct cap_ttrpc_header d;
	assert_int_equal(cap_ttrpc_header_decode(b, &d), -EMSGSIZE);
	assert_int_equal(d.length, 0x01020304);
	assert_int_equal(d.stream, 0x0a0b0c0d);
	h.length = CAP_TTRPC_MAX_BODY;
	cap_ttrpc_header_encode(b, &h);
	assert_int_equal(cap_ttrpc_header_decode(b, &d), 0);
	assert_int_equal(d.length, CAP_TTRPC_MAX_BODY);
	assert_int_equal(d.type, CAP_TTRPC_RESPONSE);
}

struct seen {
	int n;
	struct cap_ttrpc_header h[4];
	const uint8_t *body[4];
	int stop_after; /* 0: never */
};

static int on_frame(void *ud, const struct cap_ttrpc_header *h, const uint8_t *body)
{
	struct seen *s = ud;
	assert_true(s->n < 4);
	s->h[s->n] = *h;
	s->body[s->n] = body;
	s->n++;
	return s->stop_after && s->n >= s->stop_after;
}

static void request_round_trip(void **state)
{
	(void)state;
	const uint8_t payload[] = { 0x0a, 0x02, 'i', 'd', 0 };
	size_t len;
	uint8_t *f = cap_ttrpc_request_frame(7, "containerd.task.v2.Task", "State", payload, sizeof(payload),
					     5000000000LL, &len);
	assert_non_null(f);
	struct seen s = { 0 };
	assert_int_equal(cap_ttrpc_split(f, len, on_frame, &s), (long)len);
	assert_int_equal(s.n, 1);
	assert_int_equal(s.h[0].stream, 7);
	assert_int_equal(s.h[0].type, CAP_TTRPC_REQUEST);
	assert_int_equal(s.h[0].length, len - CAP_TTRPC_HEADER_LEN);
	assert_ptr_equal(s.body[0], f + CAP_TTRPC_HEADER_LEN);
	Ttrpc__Request *r = cap_ttrpc_request_decode(s.body[0], s.h[0].length);
	assert_non_null(r);
	assert_string_equal(r->service, "containerd.task.v2.Task");
	assert_string_equal(r->method, "State");
	assert_int_equal(r->payload.len, sizeof(payload));
	assert_memory_equal(r->payload.data, payload, sizeof(payload));
	assert_int_equal(r->timeout_nano, 5000000000LL);
	ttrpc__request__free_unpacked(r, NULL);
	free(f);
}

static void response_round_trip(void **state)
{
	(void)state;
	size_t len;
	uint8_t *f = cap_ttrpc_response_frame(9, CAP_GRPC_NOT_FOUND, "container x: not created", NULL, 0, &len);
	assert_non_null(f);
	struct cap_ttrpc_header h;
	assert_int_equal(cap_ttrpc_header_decode(f, &h), 0);
	assert_int_equal(h.type, CAP_TTRPC_RESPONSE);
	assert_int_equal(h.stream, 9);
	Ttrpc__Response *r = cap_ttrpc_response_decode(f + CAP_TTRPC_HEADER_LEN, h.length);
	assert_non_null(r);
	assert_non_null(r->status);
	assert_int_equal(r->status->code, CAP_GRPC_NOT_FOUND);
	assert_string_equal(r->status->message, "container x: not created");
	assert_int_equal(r->payload.len, 0);
	ttrpc__response__free_unpacked(r, NULL);
	free(f);

	/* An OK answer with a payload. */
	const uint8_t payload[] = { 8, 42 };
	f = cap_ttrpc_response_frame(11, CAP_GRPC_OK, NULL, payload, sizeof(payload), &len);
	assert_non_null(f);
	assert_int_equal(cap_ttrpc_header_decode(f, &h), 0);
	r = cap_ttrpc_response_decode(f + CAP_TTRPC_HEADER_LEN, h.length);
	assert_non_null(r);
	assert_int_equal(r->status ? r->status->code : 0, 0);
	assert_int_equal(r->payload.len, sizeof(payload));
	assert_memory_equal(r->payload.data, payload, sizeof(payload));
	ttrpc__response__free_unpacked(r, NULL);
	free(f);
}

/* Two frames back to back, and the callback that stops the walk. */
static void two_frames(void **state)
{
	(void)state;
	size_t l1, l2;
	uint8_t *a = cap_ttrpc_request_frame(1, "s", "A", NULL, 0, 0, &l1);
	uint8_t *b = cap_ttrpc_request_frame(3, "s", "B", NULL, 0, 0, &l2);
	uint8_t *buf = xmalloc(l1 + l2);
	memcpy(buf, a, l1);
	memcpy(buf + l1, b, l2);
	struct seen s = { 0 };
	assert_int_equal(cap_ttrpc_split(buf, l1 + l2, on_frame, &s), (long)(l1 + l2));
	assert_int_equal(s.n, 2);
	assert_int_equal(s.h[0].stream, 1);
	assert_int_equal(s.h[1].stream, 3);
	struct seen one = { .stop_after = 1 };
	assert_int_equal(cap_ttrpc_split(buf, l1 + l2, on_frame, &one), (long)l1);
	assert_int_equal(one.n, 1);
	free(a);
	free(b);
	free(buf);
}

/* A frame cut short: the splitter consumes only the whole ones before
 * it; the reader says -EPROTO in the middle of a frame and -EPIPE at a
 * clean end between frames. */
static void truncated(void **state)
{
	(void)state;
	size_t len;
	uint8_t *f = cap_ttrpc_request_frame(1, "containerd.task.v2.Task", "State", NULL, 0, 0, &len);
	struct seen s = { 0 };
	for (size_t cut = 0; cut < len; cut++)
		assert_int_equal(cap_ttrpc_split(f, cut, on_frame, &s), 0);
	assert_int_equal(s.n, 0);
	/* A whole frame then half a header. */
	uint8_t *g = xmalloc(len + 5);
	memcpy(g, f, len);
	memcpy(g + len, f, 5);
	assert_int_equal(cap_ttrpc_split(g, len + 5, on_frame, &s), (long)len);
	assert_int_equal(s.n, 1);
	free(g);

	int p[2];
	struct cap_ttrpc_header h;
	uint8_t *body;
	/* Half a body. */
	assert_int_equal(pipe(p), 0);
	assert_int_equal(cap_write_all(p[1], f, len - 3), 0);
	close(p[1]);
	assert_int_equal(cap_ttrpc_read_frame(p[0], &h, &body), -EPROTO);
	assert_null(body);
	close(p[0]);
	/* Half a header. */
	assert_int_equal(pipe(p), 0);
	assert_int_equal(cap_write_all(p[1], f, 4), 0);
	close(p[1]);
	assert_int_equal(cap_ttrpc_read_frame(p[0], &h, &body), -EPROTO);
	close(p[0]);
	/* A whole frame, then the end. */
	assert_int_equal(pipe(p), 0);
	assert_int_equal(cap_write_all(p[1], f, len), 0);
	close(p[1]);
	assert_int_equal(cap_ttrpc_read_frame(p[0], &h, &body), 0);
	assert_int_equal(h.length, len - CAP_TTRPC_HEADER_LEN);
	assert_memory_equal(body, f + CAP_TTRPC_HEADER_LEN, h.length);
	free(body);
	assert_int_equal(cap_ttrpc_read_frame(p[0], &h, &body), -EPIPE);
	close(p[0]);
	free(f);
}

/* Over 4 MiB: refused by the splitter; the reader skips the body and the
 * frame after it reads whole; the encoders make none. */
static void oversized(void **state)
{
	(void)state;
	struct cap_ttrpc_header big = { .length = CAP_TTRPC_MAX_BODY + 1, .stream = 5, .type = CAP_TTRPC_REQUEST };
	uint8_t hb[CAP_TTRPC_HEADER_LEN];
	cap_ttrpc_header_encode(hb, &big);
	struct seen s = { 0 };
	assert_int_equal(cap_ttrpc_split(hb, sizeof(hb), on_frame, &s), -EMSGSIZE);
	assert_int_equal(s.n, 0);

	size_t len;
	uint8_t *next = cap_ttrpc_request_frame(7, "s", "Next", NULL, 0, 0, &len);
	size_t total = sizeof(hb) + big.length + len;
	uint8_t *stream = xcalloc(1, total);
	memcpy(stream, hb, sizeof(hb));
	memcpy(stream + sizeof(hb) + big.length, next, len);
	char dir[] = "/tmp/test-ttrpc.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char *path = xasprintf("%s/stream", dir);
	FILE *w = fopen(path, "w");
	assert_non_null(w);
	assert_int_equal(fwrite(stream, 1, total, w), total);
	assert_int_equal(fclose(w), 0);
	FILE *rf = fopen(path, "r");
	assert_non_null(rf);
	int fd = fileno(rf);
	struct cap_ttrpc_header h;
	uint8_t *body;
	assert_int_equal(cap_ttrpc_read_frame(fd, &h, &body), -EMSGSIZE);
	assert_null(body);
	assert_int_equal(h.stream, 5); /* to answer it */
	assert_int_equal(cap_ttrpc_read_frame(fd, &h, &body), 0);
	assert_int_equal(h.stream, 7);
	Ttrpc__Request *r = cap_ttrpc_request_decode(body, h.length);
	assert_non_null(r);
	assert_string_equal(r->method, "Next");
	ttrpc__request__free_unpacked(r, NULL);
	free(body);
	fclose(rf);
	unlink(path);
	rmdir(dir);
	free(path);
	free(stream);
	free(next);

	/* A payload that would make the body too long: no frame. */
	uint8_t *huge = xcalloc(1, CAP_TTRPC_MAX_BODY);
	assert_null(cap_ttrpc_request_frame(1, "s", "m", huge, CAP_TTRPC_MAX_BODY, 0, &len));
	assert_null(cap_ttrpc_response_frame(1, 0, "", huge, CAP_TTRPC_MAX_BODY, &len));
	/* The decoders refuse a body over the limit without reading it. */
	assert_null(cap_ttrpc_request_decode(huge, (size_t)CAP_TTRPC_MAX_BODY + 1));
	assert_null(cap_ttrpc_response_decode(huge, (size_t)CAP_TTRPC_MAX_BODY + 1));
	free(huge);
}

/* A type that is neither request nor response. */
static void bad_type(void **state)
{
	(void)state;
	for (unsigned t = 0; t < 256; t++) {
		struct cap_ttrpc_header h = { .length = 0, .stream = 1, .type = (uint8_t)t };
		uint8_t b[CAP_TTRPC_HEADER_LEN];
		cap_ttrpc_header_encode(b, &h);
		struct cap_ttrpc_header d;
		int want = t == CAP_TTRPC_REQUEST || t == CAP_TTRPC_RESPONSE ? 0 : -EPROTO;
		assert_int_equal(cap_ttrpc_header_decode(b, &d), want);
		struct seen s = { 0 };
		assert_int_equal(cap_ttrpc_split(b, sizeof(b), on_frame, &s), want ? want : (long)sizeof(b));
	}
	int p[2];
	assert_int_equal(pipe(p), 0);
	const uint8_t b[CAP_TTRPC_HEADER_LEN] = { 0, 0, 0, 0, 0, 0, 0, 1, 7, 0 };
	assert_int_equal(cap_write_all(p[1], b, sizeof(b)), 0);
	close(p[1]);
	struct cap_ttrpc_header h;
	uint8_t *body;
	assert_int_equal(cap_ttrpc_read_frame(p[0], &h, &body), -EPROTO);
	assert_null(body);
	close(p[0]);
}

/* A body that is no message: a field cut short, a wrong wire type. */
static void bad_body(void **state)
{
	(void)state;
	const uint8_t cut[] = { 0x0a, 0x17, 'c', 'o', 'n' };       /* service: 23 bytes said, 3 there */
	const uint8_t wire[] = { 0x0d, 1, 2, 3 };                 /* service as a fixed32, cut */
	const uint8_t varint[] = { 0x20, 0xff, 0xff, 0xff, 0xff }; /* timeout_nano: a varint without end */
	assert_null(cap_ttrpc_request_decode(cut, sizeof(cut)));
	assert_null(cap_ttrpc_request_decode(wire, sizeof(wire)));
	assert_null(cap_ttrpc_request_decode(varint, sizeof(varint)));
	assert_null(cap_ttrpc_response_decode(cut, sizeof(cut)));
	/* Empty is a request with every field at its default. */
	Ttrpc__Request *r = cap_ttrpc_request_decode((const uint8_t *)"", 0);
	assert_non_null(r);
	assert_string_equal(r->service, "");
	ttrpc__request__free_unpacked(r, NULL);
}

/* The client against a server thread: the answer of another stream is
 * passed over, the call's own status and payload come back, and the
 * streams it opens are odd. */
struct server {
	int listener;
	uint32_t streams[2];
};

static void *serve_one(void *arg)
{
	struct server *sv = arg;
	int fd = accept(sv->listener, NULL, NULL);
	assert_true(fd >= 0);
	for (int i = 0; i < 2; i++) {
		struct cap_ttrpc_header h;
		uint8_t *body;
		assert_int_equal(cap_ttrpc_read_frame(fd, &h, &body), 0);
		assert_int_equal(h.type, CAP_TTRPC_REQUEST);
		sv->streams[i] = h.stream;
		Ttrpc__Request *r = cap_ttrpc_request_decode(body, h.length);
		assert_non_null(r);
		assert_string_equal(r->service, "test.Echo");
		size_t len;
		/* An answer to a stream nobody opened first. */
		uint8_t *stray = cap_ttrpc_response_frame(h.stream + 100, CAP_GRPC_INTERNAL, "stray", NULL, 0, &len);
		assert_int_equal(cap_write_all(fd, stray, len), 0);
		free(stray);
		uint8_t *f = strcmp(r->method, "Fail") == 0
				     ? cap_ttrpc_response_frame(h.stream, CAP_GRPC_NOT_FOUND, "no such thing", NULL, 0, &len)
				     : cap_ttrpc_response_frame(h.stream, CAP_GRPC_OK, "", r->payload.data, r->payload.len,
								&len);
		assert_int_equal(cap_write_all(fd, f, len), 0);
		free(f);
		ttrpc__request__free_unpacked(r, NULL);
		free(body);
	}
	close(fd);
	return NULL;
}

static void client_call(void **state)
{
	(void)state;
	char dir[] = "/tmp/test-ttrpc.XXXXXX";
	assert_non_null(mkdtemp(dir));
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/sock", dir);
	struct server sv = { .listener = socket(AF_UNIX, SOCK_STREAM, 0) };
	assert_true(sv.listener >= 0);
	assert_int_equal(bind(sv.listener, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(sv.listener, 1), 0);
	pthread_t t;
	assert_int_equal(pthread_create(&t, NULL, serve_one, &sv), 0);
	char *address = xasprintf("unix://%s", sa.sun_path);
	struct cap_ttrpc_client *c = cap_ttrpc_client_new(address);
	assert_non_null(c);
	uint8_t *out = NULL;
	size_t out_len = 0;
	char msg[64];
	assert_int_equal(cap_ttrpc_call(c, "test.Echo", "Echo", (const uint8_t *)"hello", 5, 5000, &out, &out_len, msg,
					sizeof(msg)),
			 0);
	assert_int_equal(out_len, 5);
	assert_memory_equal(out, "hello", 5);
	assert_string_equal(msg, "");
	free(out);
	assert_int_equal(cap_ttrpc_call(c, "test.Echo", "Fail", NULL, 0, 5000, &out, &out_len, msg, sizeof(msg)),
			 CAP_GRPC_NOT_FOUND);
	assert_string_equal(msg, "no such thing");
	assert_null(out);
	pthread_join(t, NULL);
	assert_int_equal(sv.streams[0], 1);
	assert_int_equal(sv.streams[1], 3);
	/* The server has gone: the next call fails, not hangs. */
	assert_true(cap_ttrpc_call(c, "test.Echo", "Echo", NULL, 0, 5000, NULL, NULL, NULL, 0) < 0);
	cap_ttrpc_client_free(c);
	close(sv.listener);
	unlink(sa.sun_path);
	rmdir(dir);
	free(address);
	/* Nobody listening: NULL, errno set. */
	errno = 0;
	assert_null(cap_ttrpc_client_new("unix:///nonexistent-test-ttrpc/sock"));
	assert_int_equal(errno, ENOENT);
}

int main(void)
{
	signal(SIGPIPE, SIG_IGN); /* a write to the server gone says EPIPE */
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(header_bytes),
		cmocka_unit_test(request_round_trip),
		cmocka_unit_test(response_round_trip),
		cmocka_unit_test(two_frames),
		cmocka_unit_test(truncated),
		cmocka_unit_test(oversized),
		cmocka_unit_test(bad_type),
		cmocka_unit_test(bad_body),
		cmocka_unit_test(client_call),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
