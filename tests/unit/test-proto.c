/* Protocol codec: framing, exec requests, exits, hello and error. Every
 * malformed input must give a clean error, never a crash or an allocation
 * of a size the input claims. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <cmocka.h>

#include "layout.h"
#include "proto.h"
#include "util.h"

static void frame_roundtrip(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	cap_buf_init(&b);
	cap_proto_put(&b, CAP_MSG_STDOUT, 7, "hello", 5);
	assert_int_equal(cap_buf_used(&b), CAP_PROTO_HEADER + 5);
	assert_int_equal(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f),
			 CAP_PROTO_HEADER + 5);
	assert_int_equal(f.type, CAP_MSG_STDOUT);
	assert_int_equal(f.stream, 7);
	assert_int_equal(f.len, 5);
	assert_memory_equal(f.payload, "hello", 5);
	cap_buf_fini(&b);
}

static void frame_truncated_needs_more(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	cap_buf_init(&b);
	cap_proto_put(&b, CAP_MSG_STDERR, 1, "0123456789", 10);
	for (size_t n = 0; n < cap_buf_used(&b); n++)
		assert_int_equal(cap_proto_parse(cap_buf_head(&b), n, &f), 0);
	cap_buf_fini(&b);
}

static void frame_oversized_length(void **state)
{
	(void)state;
	uint8_t h[CAP_PROTO_HEADER] = { 0 };
	struct cap_frame f;
	cap_put_u32(h, CAP_PROTO_MAX_PAYLOAD + 1);
	cap_put_u16(h + 4, CAP_MSG_STDOUT);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EMSGSIZE);
	cap_put_u32(h, 0xffffffffu);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EMSGSIZE);
	/* Exactly the maximum is fine, and waits for its payload. */
	cap_put_u32(h, CAP_PROTO_MAX_PAYLOAD);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), 0);
}

static void frame_unknown_type_and_flags(void **state)
{
	(void)state;
	uint8_t h[CAP_PROTO_HEADER] = { 0 };
	struct cap_frame f;
	cap_put_u16(h + 4, 0);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EBADMSG);
	cap_put_u16(h + 4, CAP_MSG_MAX_ + 1);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EBADMSG);
	cap_put_u16(h + 4, 0xffff);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EBADMSG);
	cap_put_u16(h + 4, CAP_MSG_STDOUT);
	cap_put_u16(h + 6, 1);
	assert_int_equal(cap_proto_parse(h, sizeof(h), &f), -EBADMSG);
}

static struct cap_buf encode_sample(void)
{
	char *argv[] = { "sh", "-c", "echo hi", NULL };
	char *env[] = { "A=1", "EMPTY=", NULL };
	struct cap_exec_req req = {
		.argv = argv, .argc = 3, .env = env, .envc = 2, .cwd = "/tmp",
		.timeout_ms = 1500, .output_cap = 4096, .flags = CAP_EXEC_STDIN,
		.rows = 24, .cols = 80,
	};
	struct cap_buf b;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_exec_encode(&b, 3, &req), 0);
	return b;
}

static void exec_roundtrip(void **state)
{
	(void)state;
	struct cap_buf b = encode_sample();
	struct cap_frame f;
	struct cap_exec_req out;
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(f.type, CAP_MSG_EXEC);
	assert_int_equal(f.stream, 3);
	assert_int_equal(cap_proto_exec_decode(f.payload, f.len, &out, NULL), 0);
	assert_int_equal(out.argc, 3);
	assert_string_equal(out.argv[2], "echo hi");
	assert_null(out.argv[3]);
	assert_int_equal(out.envc, 2);
	assert_string_equal(out.env[1], "EMPTY=");
	assert_string_equal(out.cwd, "/tmp");
	assert_int_equal(out.timeout_ms, 1500);
	assert_int_equal(out.output_cap, 4096);
	assert_int_equal(out.flags, CAP_EXEC_STDIN);
	assert_int_equal(out.rows, 24);
	assert_int_equal(out.cols, 80);
	cap_exec_req_fini(&out);
	cap_buf_fini(&b);
}

/* pids_max is an optional trailing u32: absent when 0 (what older agents
 * parse), present otherwise; any other number of trailing bytes is
 * refused. */
static void exec_pids_max_optional(void **state)
{
	(void)state;
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .pids_max = 77 };
	struct cap_buf b0 = encode_sample(), b;
	struct cap_frame f0, f;
	struct cap_exec_req out;
	struct cap_err err = { 0 };
	cap_buf_init(&b);
	assert_int_equal(cap_proto_exec_encode(&b, 1, &req), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_exec_decode(f.payload, f.len, &out, NULL), 0);
	assert_int_equal(out.pids_max, 77);
	cap_exec_req_fini(&out);
	for (size_t cut = 1; cut < 4; cut++)
		assert_int_equal(cap_proto_exec_decode(f.payload, f.len - cut, &out, &err), -EBADMSG);
	assert_int_equal(cap_proto_exec_decode(f.payload, f.len - 4, &out, NULL), 0);
	assert_int_equal(out.pids_max, 0);
	cap_exec_req_fini(&out);
	assert_true(cap_proto_parse(cap_buf_head(&b0), cap_buf_used(&b0), &f0) > 0);
	assert_int_equal(cap_proto_exec_decode(f0.payload, f0.len, &out, NULL), 0);
	assert_int_equal(out.pids_max, 0);
	cap_exec_req_fini(&out);
	cap_buf_fini(&b);
	cap_buf_fini(&b0);
}

/* Every prefix of a valid payload is refused cleanly. */
static void exec_truncated_everywhere(void **state)
{
	(void)state;
	struct cap_buf b = encode_sample();
	const uint8_t *p = cap_buf_head(&b) + CAP_PROTO_HEADER;
	size_t n = cap_buf_used(&b) - CAP_PROTO_HEADER;
	for (size_t k = 0; k < n; k++) {
		struct cap_exec_req out;
		struct cap_err err = { 0 };
		assert_int_equal(cap_proto_exec_decode(p, k, &out, &err), -EBADMSG);
		assert_true(err.msg[0] != '\0');
	}
	cap_buf_fini(&b);
}

static void exec_hostile_counts(void **state)
{
	(void)state;
	uint8_t p[64] = { 0 };
	struct cap_exec_req out;
	struct cap_err err = { 0 };
	/* argc claims four billion strings in a 64-byte payload. */
	cap_put_u32(p + 16, 0xffffffffu);
	assert_int_equal(cap_proto_exec_decode(p, sizeof(p), &out, &err), -EBADMSG);
	/* argc plausible, but a string length runs past the end. */
	cap_put_u32(p + 16, 1);
	cap_put_u32(p + 20, 0x7fffffffu);
	assert_int_equal(cap_proto_exec_decode(p, sizeof(p), &out, &err), -EBADMSG);
	/* argc of zero: no command. */
	cap_put_u32(p + 16, 0);
	assert_int_equal(cap_proto_exec_decode(p, 28, &out, &err), -EBADMSG);
	/* unknown flag bits */
	cap_put_u32(p + 8, 0x80);
	assert_int_equal(cap_proto_exec_decode(p, sizeof(p), &out, &err), -EBADMSG);
}

static void exec_rejects_nul_env_and_trailing(void **state)
{
	(void)state;
	struct cap_buf b = encode_sample();
	uint8_t *p = b.owned_data + CAP_PROTO_HEADER;
	size_t n = cap_buf_used(&b) - CAP_PROTO_HEADER;
	struct cap_exec_req out;
	struct cap_err err = { 0 };

	/* "sh" -> "s\0": a NUL inside a string */
	p[20 + 4 + 1] = '\0';
	assert_int_equal(cap_proto_exec_decode(p, n, &out, &err), -EBADMSG);
	p[20 + 4 + 1] = 'h';
	assert_int_equal(cap_proto_exec_decode(p, n, &out, NULL), 0);
	cap_exec_req_fini(&out);

	/* trailing garbage after the cwd */
	uint8_t *q = xmalloc(n + 1);
	memcpy(q, p, n);
	q[n] = 'x';
	assert_int_equal(cap_proto_exec_decode(q, n + 1, &out, &err), -EBADMSG);
	free(q);

	/* an environment entry without '=' */
	char *argv[] = { "true", NULL };
	char *env[] = { "NOEQUALS", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .env = env, .envc = 1 };
	struct cap_buf b2;
	struct cap_frame f;
	cap_buf_init(&b2);
	assert_int_equal(cap_proto_exec_encode(&b2, 1, &req), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b2), cap_buf_used(&b2), &f) > 0);
	assert_int_equal(cap_proto_exec_decode(f.payload, f.len, &out, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "NAME=value"));
	cap_buf_fini(&b2);
	cap_buf_fini(&b);
}

static void exec_encode_too_big(void **state)
{
	(void)state;
	char *big = xmalloc(CAP_PROTO_MAX_PAYLOAD + 1);
	memset(big, 'a', CAP_PROTO_MAX_PAYLOAD);
	big[CAP_PROTO_MAX_PAYLOAD] = '\0';
	char *argv[] = { "echo", big, NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 2 };
	struct cap_buf b;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_exec_encode(&b, 1, &req), -E2BIG);
	assert_int_equal(cap_buf_used(&b), 0);
	req.argc = 0;
	assert_int_equal(cap_proto_exec_encode(&b, 1, &req), -EINVAL);
	cap_buf_fini(&b);
	free(big);
}

/* --- CAP_EXEC_USER: the user section ------------------------------------ */

/* A CAP_EXEC_USER request with ng groups and nr rlimits, encoded into b;
 * its payload and length through p and n. */
static void encode_user(struct cap_buf *b, uint32_t ng, uint32_t nr, const uint8_t **p,
			size_t *n)
{
	char *argv[] = { "id", "-u", NULL };
	char *env[] = { "PATH=/bin", NULL };
	struct cap_exec_req req = {
		.argv = argv, .argc = 2, .env = env, .envc = 1, .cwd = "/made",
		.flags = CAP_EXEC_USER | CAP_EXEC_PTY, .rows = 30, .cols = 100,
		.uid = 0, .gid = 1234, .ngroups = ng, .nrlimits = nr, .umask = 027,
	};
	for (uint32_t i = 0; i < ng; i++)
		req.groups[i] = 100 + i;
	for (uint32_t i = 0; i < nr; i++)
		req.rlimits[i] = (struct cap_exec_rlimit){ i % RLIMIT_NLIMITS, 77 + i,
							   i == 0 ? ~(uint64_t)0 : 77 + 2 * i };
	cap_buf_init(b);
	assert_int_equal(cap_proto_exec_encode(b, 5, &req), 0);
	struct cap_frame f;
	assert_true(cap_proto_parse(cap_buf_head(b), cap_buf_used(b), &f) > 0);
	*p = f.payload;
	*n = f.len;
}

/* Round trips with none, one and the most groups and rlimits; pids_max
 * is sent even when 0, so the section's place is fixed. */
static void exec_user_roundtrip(void **state)
{
	(void)state;
	const uint32_t counts[][2] = { { 0, 0 }, { 1, 1 }, { 0, 1 }, { 1, 0 },
				       { CAP_EXEC_MAX_GROUPS, CAP_EXEC_MAX_RLIMITS } };
	for (size_t k = 0; k < CAP_ARRAY_SIZE(counts); k++) {
		uint32_t ng = counts[k][0], nr = counts[k][1];
		struct cap_buf b;
		const uint8_t *p;
		size_t n;
		struct cap_exec_req out;
		struct cap_err err = { 0 };
		encode_user(&b, ng, nr, &p, &n);
		/* fixed 20 (argc last) + argv (4+2+4+2) + env (4+4+9) +
		 * cwd (4+5) + pids_max + the section */
		assert_int_equal(n, 20 + 12 + 17 + 9 + 4 + 12 + 4 * ng + 4 + 20 * nr + 4);
		assert_int_equal(cap_proto_exec_decode(p, n, &out, &err), 0);
		assert_int_equal(out.flags, CAP_EXEC_USER | CAP_EXEC_PTY);
		assert_int_equal(out.pids_max, 0);
		assert_int_equal(out.uid, 0);
		assert_int_equal(out.gid, 1234);
		assert_int_equal(out.ngroups, ng);
		for (uint32_t i = 0; i < ng; i++)
			assert_int_equal(out.groups[i], 100 + i);
		assert_int_equal(out.nrlimits, nr);
		for (uint32_t i = 0; i < nr; i++) {
			assert_int_equal(out.rlimits[i].resource, i % RLIMIT_NLIMITS);
			assert_true(out.rlimits[i].soft == 77 + i);
			assert_true(out.rlimits[i].hard == (i == 0 ? ~(uint64_t)0 : 77 + 2 * i));
		}
		assert_int_equal(out.umask, 027);
		assert_string_equal(out.cwd, "/made");
		assert_string_equal(out.env[0], "PATH=/bin");
		cap_exec_req_fini(&out);
		/* every prefix is refused with a message */
		for (size_t cut = 0; cut < n; cut++) {
			memset(&err, 0, sizeof(err));
			assert_int_equal(cap_proto_exec_decode(p, cut, &out, &err), -EBADMSG);
			assert_true(err.msg[0] != '\0');
		}
		cap_buf_fini(&b);
	}
}

/* Decode a copy of p with the u32 at off set to v (or, with wide, the
 * u64); the result and the message. */
static int decode_patched(const uint8_t *p, size_t n, size_t off, uint64_t v, bool wide,
			  struct cap_err *err)
{
	uint8_t *q = xmalloc(n);
	memcpy(q, p, n);
	cap_put_u32(q + off, (uint32_t)(v & 0xffffffffu));
	if (wide)
		cap_put_u32(q + off + 4, (uint32_t)(v >> 32));
	struct cap_exec_req out;
	memset(err, 0, sizeof(*err));
	int r = cap_proto_exec_decode(q, n, &out, err);
	if (r == 0)
		cap_exec_req_fini(&out);
	free(q);
	return r;
}

/* Each malformed user section is refused, naming what is wrong. */
static void exec_user_refused(void **state)
{
	(void)state;
	struct cap_buf b;
	const uint8_t *p;
	size_t n;
	struct cap_err err;
	encode_user(&b, 1, 1, &p, &n);
	size_t s = n - 44;	/* uid, gid, ngroups, 1 group, nrlimits, 1 rlimit, umask */
	/* the unpatched copy decodes (the offsets are right) */
	assert_int_equal(decode_patched(p, n, s + 4, 1234, false, &err), 0);
	assert_int_equal(decode_patched(p, n, s + 8, CAP_EXEC_MAX_GROUPS + 1, false, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "supplementary groups"));
	assert_int_equal(decode_patched(p, n, s + 8, 0xffffffffu, false, &err), -EBADMSG);
	/* more groups than the bytes hold (within the bound) */
	assert_int_equal(decode_patched(p, n, s + 8, 9, false, &err), -EBADMSG);
	/* two groups: the rest is read shifted and ends short or wrong */
	assert_int_equal(decode_patched(p, n, s + 8, 2, false, &err), -EBADMSG);
	assert_int_equal(decode_patched(p, n, s + 16, CAP_EXEC_MAX_RLIMITS + 1, false, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "rlimits"));
	assert_int_equal(decode_patched(p, n, s + 16, 2, false, &err), -EBADMSG);
	assert_int_equal(decode_patched(p, n, s + 16, 0xffffffffu, false, &err), -EBADMSG);
	assert_int_equal(decode_patched(p, n, s + 20, RLIMIT_NLIMITS, false, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "resource"));
	assert_int_equal(decode_patched(p, n, s + 20, RLIMIT_NLIMITS - 1, false, &err), 0);
	/* soft over hard (the sample's hard is infinity: lower it) */
	assert_int_equal(decode_patched(p, n, s + 32, 76, true, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "soft"));
	assert_int_equal(decode_patched(p, n, s + 32, 77, true, &err), 0);
	assert_int_equal(decode_patched(p, n, s + 40, 01000, false, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "umask"));
	assert_int_equal(decode_patched(p, n, s + 40, 0777, false, &err), 0);

	/* a trailing byte */
	uint8_t *q = xmalloc(n + 1);
	memcpy(q, p, n);
	q[n] = 0;
	struct cap_exec_req out;
	assert_int_equal(cap_proto_exec_decode(q, n + 1, &out, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "trailing"));
	free(q);
	/* the flag without the section: an old request with the bit set,
	 * with and without its optional pids_max */
	struct cap_buf b0 = encode_sample();
	uint8_t *o = b0.owned_data + CAP_PROTO_HEADER;
	size_t on = cap_buf_used(&b0) - CAP_PROTO_HEADER;
	cap_put_u32(o + 8, CAP_EXEC_USER);
	assert_int_equal(cap_proto_exec_decode(o, on, &out, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "pids_max"));
	q = xmalloc(on + 4);
	memcpy(q, o, on);
	cap_put_u32(q + on, 64);
	assert_int_equal(cap_proto_exec_decode(q, on + 4, &out, &err), -EBADMSG);
	cap_put_u32(q + 8, 0);	/* without the flag it is an old request */
	assert_int_equal(cap_proto_exec_decode(q, on + 4, &out, NULL), 0);
	assert_int_equal(out.pids_max, 64);
	cap_exec_req_fini(&out);
	free(q);
	cap_buf_fini(&b0);
	cap_buf_fini(&b);

	/* the encoder refuses what the decoder would */
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .flags = CAP_EXEC_USER };
	struct cap_buf e;
	cap_buf_init(&e);
	req.ngroups = CAP_EXEC_MAX_GROUPS + 1;
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), -EINVAL);
	req.ngroups = 0;
	req.nrlimits = CAP_EXEC_MAX_RLIMITS + 1;
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), -EINVAL);
	req.nrlimits = 1;
	req.rlimits[0] = (struct cap_exec_rlimit){ RLIMIT_NLIMITS, 1, 1 };
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), -EINVAL);
	req.rlimits[0] = (struct cap_exec_rlimit){ RLIMIT_NOFILE, 2, 1 };
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), -EINVAL);
	req.rlimits[0] = (struct cap_exec_rlimit){ RLIMIT_NOFILE, 1, 2 };
	req.umask = 01000;
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), -EINVAL);
	assert_int_equal(cap_buf_used(&e), 0);
	req.umask = 022;
	assert_int_equal(cap_proto_exec_encode(&e, 1, &req), 0);
	cap_buf_fini(&e);
}

/* Without the flag the user fields are not sent: the bytes are the old
 * encoding's, whatever they hold. */
static void exec_user_fields_ignored_without_flag(void **state)
{
	(void)state;
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .pids_max = 0 };
	struct cap_buf a, b;
	cap_buf_init(&a);
	cap_buf_init(&b);
	assert_int_equal(cap_proto_exec_encode(&a, 1, &req), 0);
	req.uid = 7;
	req.gid = 8;
	req.ngroups = CAP_EXEC_MAX_GROUPS + 5;	/* not looked at */
	req.nrlimits = 3;
	req.umask = 077;
	assert_int_equal(cap_proto_exec_encode(&b, 1, &req), 0);
	assert_int_equal(cap_buf_used(&a), cap_buf_used(&b));
	assert_memory_equal(cap_buf_head(&a), cap_buf_head(&b), cap_buf_used(&a));
	/* 20 fixed + argv (4+4+4) + envc + cwd: no pids_max, no section */
	assert_int_equal(cap_buf_used(&a), CAP_PROTO_HEADER + 20 + 8 + 4 + 4);
	cap_buf_fini(&a);
	cap_buf_fini(&b);
}

static void exit_codec(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_exit ex = { .kind = CAP_EXIT_SIGNAL, .value = 9, .flags = CAP_EXIT_TIMED_OUT, .duration_ms = 42 };
	struct cap_exit out;
	cap_buf_init(&b);
	cap_proto_exit_encode(&b, 5, &ex);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_exit_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.kind, CAP_EXIT_SIGNAL);
	assert_int_equal(out.value, 9);
	assert_int_equal(out.duration_ms, 42);
	assert_int_equal(cap_exit_status(&out), 124);
	assert_int_equal(out.sync_ms, 0);
	assert_false(out.flags & CAP_EXIT_DURABLE);

	/* A durable end carries the flush's time in the old reserved u16. */
	ex = (struct cap_exit){ .kind = CAP_EXIT_CODE, .value = 3, .flags = CAP_EXIT_DURABLE,
				.duration_ms = 7, .sync_ms = 65535 };
	cap_buf_consume(&b, cap_buf_used(&b));
	cap_proto_exit_encode(&b, 6, &ex);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_exit_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.flags, CAP_EXIT_DURABLE);
	assert_int_equal(out.sync_ms, 65535);
	assert_int_equal(out.duration_ms, 7);
	assert_int_equal(cap_exit_status(&out), 3);

	uint8_t bad[12] = { 0 };
	assert_int_equal(cap_proto_exit_decode(bad, 11, &out), -EBADMSG);
	bad[0] = 9;	/* unknown kind */
	assert_int_equal(cap_proto_exit_decode(bad, 12, &out), -EBADMSG);
	bad[0] = CAP_EXIT_CODE;
	cap_put_u32(bad + 4, 256);	/* exit code out of range */
	assert_int_equal(cap_proto_exit_decode(bad, 12, &out), -EBADMSG);
	bad[0] = CAP_EXIT_SIGNAL;
	cap_put_u32(bad + 4, 0);
	assert_int_equal(cap_proto_exit_decode(bad, 12, &out), -EBADMSG);
	bad[0] = CAP_EXIT_CODE;
	bad[1] = 0x80;	/* unknown flag */
	assert_int_equal(cap_proto_exit_decode(bad, 12, &out), -EBADMSG);
	cap_buf_fini(&b);
}

static void exit_status_mapping(void **state)
{
	(void)state;
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 7 };
	assert_int_equal(cap_exit_status(&ex), 7);
	ex = (struct cap_exit){ .kind = CAP_EXIT_SIGNAL, .value = 15 };
	assert_int_equal(cap_exit_status(&ex), 143);
	ex = (struct cap_exit){ .kind = CAP_EXIT_START_FAILED, .value = ENOENT };
	assert_int_equal(cap_exit_status(&ex), 127);
	ex = (struct cap_exit){ .kind = CAP_EXIT_START_FAILED, .value = EACCES };
	assert_int_equal(cap_exit_status(&ex), 126);
}

static void hello_and_error_text_sanitized(void **state)
{
	(void)state;
	uint8_t p[32] = { 0 };
	char v[8];
	uint32_t ver;
	int errnum;
	cap_put_u32(p, 1);
	memcpy(p + 8, "ab\x1b[2Jcdefgh", 12);
	assert_int_equal(cap_proto_hello_decode(p, 20, &ver, v, sizeof(v)), 0);
	assert_int_equal(ver, 1);
	assert_string_equal(v, "ab?[2Jc");	/* escape replaced, cut to fit */
	assert_int_equal(cap_proto_hello_decode(p, 7, &ver, v, sizeof(v)), -EBADMSG);
	assert_int_equal(cap_proto_error_decode(p, 3, &errnum, v, sizeof(v)), -EBADMSG);
}

static void setup_codec(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_setup in = { .root_image = "capsule-root", .root_upper = "capsule-upper",
				.work = "capsule-work", .source = "", .hostname = "box-1" };
	struct cap_setup out;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_setup_encode(&b, &in), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(f.type, CAP_MSG_SETUP);
	assert_int_equal(cap_proto_setup_decode(f.payload, f.len, &out), 0);
	assert_string_equal(out.work, "capsule-work");
	assert_string_equal(out.source, "");
	assert_string_equal(out.hostname, "box-1");
	for (uint32_t k = 0; k < f.len; k++)
		assert_int_equal(cap_proto_setup_decode(f.payload, k, &out), -EBADMSG);
	cap_setup_fini(&out);
	/* Names that could become paths are refused on both sides. */
	in.work = "../../dev/sda";
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	cap_buf_fini(&b);
}

static void setup_network_fields(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_setup in = { .root_image = "", .root_upper = "", .work = "", .source = "",
				.hostname = "", .net_addr = 0x0a00020f, .net_gateway = 0x0a000202,
				.net_dns = 0x0a000203, .net_prefix = 24, .proxy_port = 3128,
				.auto_publish = true };
	struct cap_setup out;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_setup_encode(&b, &in), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_setup_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.net_addr, 0x0a00020f);
	assert_int_equal(out.net_gateway, 0x0a000202);
	assert_int_equal(out.net_dns, 0x0a000203);
	assert_int_equal(out.net_prefix, 24);
	assert_int_equal(out.proxy_port, 3128);
	assert_true(out.auto_publish);
	cap_setup_fini(&out);

	/* The fields sit at the end: ..., u8 prefix, u16 proxy_port, u8
	 * auto_publish. Bad values are refused, each alone. */
	uint8_t buf[256];
	size_t n = f.len;
	assert_true(n <= sizeof(buf));
	memcpy(buf, f.payload, n);
	assert_int_equal(buf[n - 4], 24);
	assert_int_equal(cap_get_u16(buf + n - 3), 3128);
	assert_int_equal(buf[n - 1], 1);
	buf[n - 4] = 32;
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	assert_int_equal(out.net_prefix, 32);
	cap_setup_fini(&out);
	buf[n - 4] = 33;
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	buf[n - 4] = 0xff;
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	buf[n - 4] = 24;
	buf[n - 1] = 2;
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	buf[n - 1] = 0;
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	assert_false(out.auto_publish);
	cap_setup_fini(&out);
	/* Exact length: one byte more or less is refused. */
	buf[n] = 0;
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	assert_int_equal(cap_proto_setup_decode(buf, n - 1, &out), -EBADMSG);
	/* Without a network every field is 0. */
	struct cap_setup none = { .hostname = "h" };
	b.off = b.len = 0;
	assert_int_equal(cap_proto_setup_encode(&b, &none), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_setup_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.net_addr | out.net_gateway | out.net_dns | out.net_prefix | out.proxy_port, 0);
	assert_false(out.auto_publish);
	cap_setup_fini(&out);
	/* The encoder refuses a prefix the decoder would refuse. */
	in.net_prefix = 33;
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	cap_buf_fini(&b);
}

#define TEST_CA "-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----\n"

/* Encode s and decode the frame back into out; the encoder's result. */
static int setup_roundtrip(const struct cap_setup *s, struct cap_buf *b, struct cap_frame *f,
			   struct cap_setup *out)
{
	b->off = b->len = 0;
	int r = cap_proto_setup_encode(b, s);
	if (r < 0)
		return r;
	assert_true(cap_proto_parse(cap_buf_head(b), cap_buf_used(b), f) > 0);
	assert_int_equal(cap_proto_setup_decode(f->payload, f->len, out), 0);
	return 0;
}

static void setup_secrets_roundtrip(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f, plain;
	char *env[] = { "TOKEN=cap_ph_0123456789abcdef", "_X1=", "GIT_TOKEN=a=b=c" };
	struct cap_setup in = { .root_image = "", .root_upper = "", .work = "w", .source = "",
				.hostname = "h", .net_addr = 0x0a00020f, .net_gateway = 0x0a000202,
				.net_prefix = 24, .proxy_port = 3128, .ca_pem = TEST_CA,
				.env = env, .envc = 3 };
	struct cap_setup out;
	cap_buf_init(&b);

	/* Without secrets: no section, nothing decoded. */
	struct cap_setup none = in;
	none.ca_pem = NULL;
	none.env = NULL;
	none.envc = 0;
	assert_int_equal(setup_roundtrip(&none, &b, &plain, &out), 0);
	assert_null(out.ca_pem);
	assert_null(out.env);
	assert_int_equal(out.envc, 0);
	cap_setup_fini(&out);
	size_t plain_len = plain.len;
	none.ca_pem = "";	/* "" is none too */
	assert_int_equal(setup_roundtrip(&none, &b, &plain, &out), 0);
	assert_int_equal(plain.len, plain_len);
	assert_null(out.ca_pem);
	cap_setup_fini(&out);

	/* Both fields. */
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	assert_string_equal(out.ca_pem, TEST_CA);
	assert_int_equal(out.envc, 3);
	for (uint32_t i = 0; i < 3; i++)
		assert_string_equal(out.env[i], env[i]);
	assert_null(out.env[3]);
	assert_string_equal(out.work, "w");
	assert_int_equal(out.proxy_port, 3128);
	cap_setup_fini(&out);
	assert_null(out.ca_pem);
	assert_null(out.env);
	/* Cut anywhere, refused, but at the end of the fields before the
	 * section (that is a SETUP without secrets). */
	for (uint32_t k = 0; k < f.len; k++) {
		int r = cap_proto_setup_decode(f.payload, k, &out);
		if (k == plain_len) {
			assert_int_equal(r, 0);
			assert_null(out.ca_pem);
			cap_setup_fini(&out);
		} else {
			assert_int_equal(r, -EBADMSG);
		}
	}

	/* The CA alone, the environment alone. */
	struct cap_setup one = in;
	one.env = NULL;
	one.envc = 0;
	assert_int_equal(setup_roundtrip(&one, &b, &f, &out), 0);
	assert_string_equal(out.ca_pem, TEST_CA);
	assert_int_equal(out.envc, 0);
	cap_setup_fini(&out);
	one = in;
	one.ca_pem = NULL;
	assert_int_equal(setup_roundtrip(&one, &b, &f, &out), 0);
	assert_null(out.ca_pem);
	assert_int_equal(out.envc, 3);
	assert_string_equal(out.env[0], env[0]);
	cap_setup_fini(&out);
	cap_buf_fini(&b);
}

static void setup_secrets_refused(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_setup out;
	char *env[CAP_SETUP_MAX_ENV + 1];
	struct cap_setup in = { .hostname = "h", .env = env, .envc = 1 };
	cap_buf_init(&b);

	/* Names: a shell variable name, then '='. */
	static const char *const bad[] = { "NOEQUALS", "=x", "1A=x", "A-B=x", "A B=x", "Ä=x", "" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		env[0] = (char *)bad[i];
		assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	}
	assert_int_equal(cap_buf_used(&b), 0);	/* out unchanged on failure */
	env[0] = NULL;
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	in.env = NULL;
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	in.env = env;

	/* A string of 8 KiB passes, one byte more does not. */
	char *big = xmalloc(8 * 1024 + 2);
	memset(big, 'v', 8 * 1024 + 1);
	memcpy(big, "BIG=", 4);
	big[8 * 1024] = '\0';
	env[0] = big;
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	assert_int_equal(strlen(out.env[0]), 8 * 1024);
	cap_setup_fini(&out);
	big[8 * 1024] = 'v';
	big[8 * 1024 + 1] = '\0';
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);

	/* At most CAP_SETUP_MAX_ENV strings. */
	for (size_t i = 0; i <= CAP_SETUP_MAX_ENV; i++)
		env[i] = "A=1";
	in.envc = CAP_SETUP_MAX_ENV;
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	assert_int_equal(out.envc, CAP_SETUP_MAX_ENV);
	cap_setup_fini(&out);
	in.envc = CAP_SETUP_MAX_ENV + 1;
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);

	/* Each within bounds, together over one frame. */
	big[8 * 1024] = '\0';
	for (size_t i = 0; i < 8; i++)
		env[i] = big;
	in.envc = 8;
	assert_int_equal(cap_proto_setup_encode(&b, &in), -E2BIG);
	in.envc = 0;

	/* The CA: 16 KiB of text at most. */
	char *pem = xmalloc(16 * 1024 + 2);
	memset(pem, 'A', 16 * 1024 + 1);
	pem[16 * 1024] = '\0';
	in.ca_pem = pem;
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	assert_int_equal(strlen(out.ca_pem), 16 * 1024);
	cap_setup_fini(&out);
	pem[16 * 1024] = 'A';
	pem[16 * 1024 + 1] = '\0';
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	in.ca_pem = "-----BEGIN CERTIFICATE-----\n\x1b[2J\n";
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	in.ca_pem = "caf\xc3\xa9";
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);

	/* The decoder refuses what the encoder would not send: patch a
	 * valid frame. Its section: u32 len, the CA, u32 1, u32 len, "A=1". */
	in.ca_pem = "CA";
	env[0] = "A=1";
	in.envc = 1;
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	cap_setup_fini(&out);
	uint8_t buf[512];
	size_t n = f.len;
	assert_true(n + 8 <= sizeof(buf));
	memcpy(buf, f.payload, n);
	uint8_t *name = buf + n - 3;
	assert_memory_equal(name, "A=1", 3);
	name[0] = '1';	/* a bad name */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	name[0] = 'A';
	name[1] = 'x';	/* no '=' */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	name[1] = '=';
	name[2] = '\0';	/* a NUL inside */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	name[2] = '1';
	uint8_t *ca = buf + n - 3 - 4 - 4 - 2;
	assert_memory_equal(ca, "CA", 2);
	ca[1] = '\n';
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	cap_setup_fini(&out);
	ca[1] = '\x07';	/* a control byte in the CA */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	ca[1] = 'A';
	cap_put_u32(ca + 2, CAP_SETUP_MAX_ENV + 1);	/* a hostile count */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(ca + 2, 2);	/* more strings than bytes */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(ca + 2, 1);
	buf[n] = 0;	/* a trailing byte */
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	cap_setup_fini(&out);
	/* An empty section (no CA, no strings) is never sent: refused. */
	size_t base = n - (4 + 2 + 4 + 4 + 3);
	cap_put_u32(buf + base, 0);
	cap_put_u32(buf + base + 4, 0);
	assert_int_equal(cap_proto_setup_decode(buf, base + 8, &out), -EBADMSG);
	free(big);
	free(pem);
	cap_buf_fini(&b);
}

static void setup_workspace_section(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f, plain;
	struct cap_setup out;
	struct cap_setup in = { .root_image = "", .root_upper = "", .work = "w", .source = "",
				.hostname = "h", .workspace = "capsule-ws" };
	cap_buf_init(&b);

	/* Without a workspace (NULL or ""): no section, "" decoded. */
	struct cap_setup none = in;
	none.workspace = NULL;
	assert_int_equal(setup_roundtrip(&none, &b, &plain, &out), 0);
	assert_string_equal(out.workspace, "");
	cap_setup_fini(&out);
	size_t plain_len = plain.len;
	none.workspace = "";
	assert_int_equal(setup_roundtrip(&none, &b, &plain, &out), 0);
	assert_int_equal(plain.len, plain_len);
	cap_setup_fini(&out);

	/* A workspace alone: an empty secrets section, then the serial. */
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	assert_int_equal(f.len, plain_len + 8 + 4 + strlen("capsule-ws"));
	assert_string_equal(out.workspace, "capsule-ws");
	assert_null(out.ca_pem);
	assert_null(out.env);
	assert_string_equal(out.work, "w");
	cap_setup_fini(&out);
	assert_null(out.workspace);
	/* Cut anywhere, refused, but right before the sections. */
	for (uint32_t k = 0; k < f.len; k++) {
		int r = cap_proto_setup_decode(f.payload, k, &out);
		if (k == plain_len) {
			assert_int_equal(r, 0);
			assert_string_equal(out.workspace, "");
			cap_setup_fini(&out);
		} else {
			assert_int_equal(r, -EBADMSG);
		}
	}

	/* With secrets too. */
	char *env[] = { "TOKEN=x" };
	struct cap_setup both = in;
	both.ca_pem = TEST_CA;
	both.env = env;
	both.envc = 1;
	assert_int_equal(setup_roundtrip(&both, &b, &f, &out), 0);
	assert_string_equal(out.workspace, "capsule-ws");
	assert_string_equal(out.ca_pem, TEST_CA);
	assert_int_equal(out.envc, 1);
	assert_string_equal(out.env[0], "TOKEN=x");
	cap_setup_fini(&out);

	/* A serial that could be a path is refused on both sides. */
	in.workspace = "../vda";
	assert_int_equal(cap_proto_setup_encode(&b, &in), -EINVAL);
	in.workspace = "capsule-ws";
	assert_int_equal(setup_roundtrip(&in, &b, &f, &out), 0);
	cap_setup_fini(&out);
	uint8_t buf[256];
	size_t n = f.len;
	assert_true(n + 8 <= sizeof(buf));
	memcpy(buf, f.payload, n);
	uint8_t *serial = buf + n - strlen("capsule-ws");
	assert_memory_equal(serial, "capsule-ws", 10);
	serial[0] = '/';
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	serial[0] = 'c';
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	cap_setup_fini(&out);
	/* A trailing byte or a second string after the workspace. */
	buf[n] = 0;
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	memset(buf + n, 0, 4);
	assert_int_equal(cap_proto_setup_decode(buf, n + 4, &out), -EBADMSG);
	/* An empty workspace string is never sent. */
	cap_put_u32(buf + plain_len + 8, 0);
	assert_int_equal(cap_proto_setup_decode(buf, plain_len + 12, &out), -EBADMSG);
	/* A serial over 20 bytes. */
	cap_put_u32(buf + plain_len + 8, 21);
	memset(buf + plain_len + 12, 'a', 21);
	assert_int_equal(cap_proto_setup_decode(buf, plain_len + 12 + 21, &out), -EBADMSG);
	cap_put_u32(buf + plain_len + 8, 20);
	assert_int_equal(cap_proto_setup_decode(buf, plain_len + 12 + 20, &out), 0);
	assert_int_equal(strlen(out.workspace), 20);
	cap_setup_fini(&out);
	/* The empty secrets section alone is still refused. */
	assert_int_equal(cap_proto_setup_decode(buf, plain_len + 8, &out), -EBADMSG);
	cap_buf_fini(&b);
}

/* tools_root: flags bit 3 of the options section, no data; with
 * root_readonly both bits; never sent when unset. */
static void setup_tools_root(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f, plain;
	struct cap_setup out;
	struct cap_setup in = { .root_image = "capsule-root", .root_upper = "capsule-upper",
				.work = "w", .source = "", .hostname = "h" };
	cap_buf_init(&b);
	assert_int_equal(setup_roundtrip(&in, &b, &plain, &out), 0);
	assert_false(out.tools_root);
	cap_setup_fini(&out);
	size_t plain_len = plain.len;

	struct cap_setup root = in;
	root.tools_root = true;
	assert_int_equal(setup_roundtrip(&root, &b, &f, &out), 0);
	assert_int_equal(f.len, plain_len + 8 + 4 + 4);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12), CAP_SETUP_TOOLS_ROOT);
	assert_true(out.tools_root);
	assert_false(out.root_readonly);
	cap_setup_fini(&out);

	root.root_readonly = true;
	assert_int_equal(setup_roundtrip(&root, &b, &f, &out), 0);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12),
			 CAP_SETUP_TOOLS_ROOT | CAP_SETUP_ROOT_READONLY);
	assert_true(out.tools_root);
	assert_true(out.root_readonly);
	cap_setup_fini(&out);
	/* A fork's re-identification is bit 4; the next bit is still
	 * unknown, and refused. */
	root.forked = true;
	assert_int_equal(setup_roundtrip(&root, &b, &f, &out), 0);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12),
			 CAP_SETUP_TOOLS_ROOT | CAP_SETUP_ROOT_READONLY | CAP_SETUP_FORKED);
	assert_true(out.forked);
	cap_setup_fini(&out);
	root.forked = root.tools_root = root.root_readonly = false;
	assert_int_equal(setup_roundtrip(&root, &b, &f, &out), 0);
	assert_false(out.forked);
	cap_setup_fini(&out);
	root.forked = true;
	assert_int_equal(setup_roundtrip(&root, &b, &f, &out), 0);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12), CAP_SETUP_FORKED);
	assert_true(out.forked && !out.tools_root);
	cap_setup_fini(&out);
	uint8_t buf[256];
	assert_true(f.len <= sizeof(buf));
	memcpy(buf, f.payload, f.len);
	cap_put_u32(buf + f.len - 4, CAP_SETUP_FORKED << 1);
	assert_int_equal(cap_proto_setup_decode(buf, f.len, &out), -EBADMSG);
	cap_buf_fini(&b);
}

/* HELLO's second word: the host's flags (CAP_HELLO_KEEP from a host
 * resuming a snapshot), 0 in a plain HELLO, and the SNAPSHOT request's
 * name. */
static void hello_flags(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	uint32_t flags = 7, ver;
	char v[64];
	cap_buf_init(&b);
	cap_proto_hello_encode(&b, "host 1");
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_hello_flags(f.payload, f.len, &flags), 0);
	assert_int_equal(flags, 0);
	cap_buf_consume(&b, cap_buf_used(&b));
	cap_proto_hello_encode_flags(&b, "host 1", CAP_HELLO_KEEP);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_hello_flags(f.payload, f.len, &flags), 0);
	assert_int_equal(flags, CAP_HELLO_KEEP);
	assert_int_equal(cap_proto_hello_decode(f.payload, f.len, &ver, v, sizeof(v)), 0);
	assert_string_equal(v, "host 1");
	assert_int_equal(cap_proto_hello_flags(f.payload, 7, &flags), -EBADMSG);
	assert_string_equal(cap_msg_name(CAP_MSG_SNAPSHOT), "SNAPSHOT");
	cap_buf_fini(&b);
}

/* root_readonly: the options section (u32 flags) after the workspace
 * section, sent only when set; older encodings unchanged without it. */
static void setup_root_readonly(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f, plain;
	struct cap_setup out;
	struct cap_setup in = { .root_image = "capsule-root", .root_upper = "capsule-upper",
				.work = "w", .source = "", .hostname = "h" };
	cap_buf_init(&b);

	/* Not set: byte for byte the SETUP without sections, false decoded. */
	assert_int_equal(setup_roundtrip(&in, &b, &plain, &out), 0);
	assert_false(out.root_readonly);
	cap_setup_fini(&out);
	size_t plain_len = plain.len;
	uint8_t old[256];
	assert_true(plain_len <= sizeof(old));
	memcpy(old, plain.payload, plain_len);

	/* Alone: an empty secrets section, an empty workspace serial, then
	 * flags 1; everything before the sections as without it. */
	struct cap_setup ro = in;
	ro.root_readonly = true;
	assert_int_equal(setup_roundtrip(&ro, &b, &f, &out), 0);
	assert_int_equal(f.len, plain_len + 8 + 4 + 4);
	assert_memory_equal(f.payload, old, plain_len);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12), CAP_SETUP_ROOT_READONLY);
	assert_true(out.root_readonly);
	assert_string_equal(out.workspace, "");
	assert_null(out.ca_pem);
	assert_null(out.env);
	assert_string_equal(out.root_image, "capsule-root");
	cap_setup_fini(&out);
	/* Cut anywhere, refused, but right before the sections (a SETUP
	 * without it: what an older host sends). */
	for (uint32_t k = 0; k < f.len; k++) {
		int r = cap_proto_setup_decode(f.payload, k, &out);
		if (k == plain_len) {
			assert_int_equal(r, 0);
			assert_false(out.root_readonly);
			cap_setup_fini(&out);
		} else {
			assert_int_equal(r, -EBADMSG);
		}
	}

	/* With a workspace and secrets: each section kept. */
	char *env[] = { "TOKEN=x" };
	struct cap_setup all = ro;
	all.workspace = "capsule-ws";
	all.ca_pem = TEST_CA;
	all.env = env;
	all.envc = 1;
	assert_int_equal(setup_roundtrip(&all, &b, &f, &out), 0);
	assert_true(out.root_readonly);
	assert_string_equal(out.workspace, "capsule-ws");
	assert_string_equal(out.ca_pem, TEST_CA);
	assert_int_equal(out.envc, 1);
	cap_setup_fini(&out);
	/* A workspace without it: no options section (as before). */
	all.root_readonly = false;
	struct cap_frame g;
	assert_int_equal(setup_roundtrip(&all, &b, &g, &out), 0);
	assert_false(out.root_readonly);
	assert_int_equal(g.len + 4, f.len);
	cap_setup_fini(&out);

	/* Malformed options: flags 0, an unknown bit, a short or long
	 * section, an empty workspace serial without options. */
	assert_int_equal(setup_roundtrip(&ro, &b, &f, &out), 0);
	cap_setup_fini(&out);
	uint8_t buf[256];
	size_t n = f.len;
	assert_true(n + 8 <= sizeof(buf));
	memcpy(buf, f.payload, n);
	cap_put_u32(buf + n - 4, 0);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + n - 4, 2);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + n - 4, 0x80000001u);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + n - 4, CAP_SETUP_ROOT_READONLY);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	assert_true(out.root_readonly);
	cap_setup_fini(&out);
	assert_int_equal(cap_proto_setup_decode(buf, n - 1, &out), -EBADMSG);
	buf[n] = 0;
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	memset(buf + n, 0, 4);
	assert_int_equal(cap_proto_setup_decode(buf, n + 4, &out), -EBADMSG);
	assert_int_equal(cap_proto_setup_decode(buf, n - 4, &out), -EBADMSG);	/* "" alone */
	/* A bad workspace serial before it is still refused. */
	cap_put_u32(buf + n - 8, 1);
	buf[n - 4] = '/';
	cap_put_u32(buf + n - 3, CAP_SETUP_ROOT_READONLY);
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	buf[n - 4] = 'x';
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), 0);
	assert_string_equal(out.workspace, "x");
	assert_true(out.root_readonly);
	cap_setup_fini(&out);
	cap_buf_fini(&b);
}

static void file_ops_and_roots(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_file_req out;
	char root[16], path[4100];
	cap_buf_init(&b);

	static const char *const roots[] = { "/source", "/work", "/workspace" };
	for (uint32_t op = CAP_FILE_READ; op <= CAP_FILE_TAR_IN; op++) {
		for (size_t i = 0; i < CAP_ARRAY_SIZE(roots); i++) {
			struct cap_file_req req = { .op = op, .limit = CAP_TAR_PATHS_STDIN,
						    .limit_entries = 7, .root = roots[i],
						    .path = "a/b c", .data = (const uint8_t *)"xy",
						    .len = 2 };
			b.off = b.len = 0;
			assert_int_equal(cap_proto_file_encode(&b, 9, &req), 0);
			assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
			assert_int_equal(f.type, CAP_MSG_FILE);
			assert_int_equal(f.stream, 9);
			assert_int_equal(cap_proto_file_decode(f.payload, f.len, &out, root, sizeof(root),
							       path, sizeof(path)), 0);
			assert_int_equal(out.op, op);
			assert_int_equal(out.limit, CAP_TAR_PATHS_STDIN);
			assert_int_equal(out.limit_entries, 7);
			assert_string_equal(out.root, roots[i]);
			assert_string_equal(out.path, "a/b c");
			assert_int_equal(out.len, 2);
			assert_memory_equal(out.data, "xy", 2);
			/* Cut in the fixed part or the strings: refused. */
			for (uint32_t k = 0; k < f.len - 2; k++)
				assert_int_equal(cap_proto_file_decode(f.payload, k, &out, root,
								       sizeof(root), path, sizeof(path)),
						 -EBADMSG);
		}
	}

	/* Unknown ops and roots, escaping paths: refused on both sides. */
	struct cap_file_req req = { .op = CAP_FILE_TAR_IN + 1, .root = "/work", .path = "" };
	assert_int_equal(cap_proto_file_encode(&b, 1, &req), -EINVAL);
	req.op = 0;
	assert_int_equal(cap_proto_file_encode(&b, 1, &req), -EINVAL);
	req.op = CAP_FILE_MANIFEST;
	static const char *const bad_roots[] = { "/workspaces", "/", "/etc", "workspace", "/work/" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad_roots); i++) {
		req.root = bad_roots[i];
		assert_int_equal(cap_proto_file_encode(&b, 1, &req), -EINVAL);
	}
	req.root = "/workspace";
	req.path = "a/../../etc";
	assert_int_equal(cap_proto_file_encode(&b, 1, &req), -EINVAL);
	req.path = "/etc";
	assert_int_equal(cap_proto_file_encode(&b, 1, &req), -EINVAL);

	/* The decoder on patched frames: op, root. */
	req.path = "";
	b.off = b.len = 0;
	assert_int_equal(cap_proto_file_encode(&b, 1, &req), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	uint8_t buf[64];
	size_t n = f.len;
	assert_true(n <= sizeof(buf));
	memcpy(buf, f.payload, n);
	cap_put_u32(buf, CAP_FILE_TAR_IN + 1);
	assert_int_equal(cap_proto_file_decode(buf, n, &out, root, sizeof(root), path, sizeof(path)),
			 -EBADMSG);
	cap_put_u32(buf, CAP_FILE_TAR_OUT);
	assert_int_equal(cap_proto_file_decode(buf, n, &out, root, sizeof(root), path, sizeof(path)),
			 0);
	assert_string_equal(root, "/workspace");
	buf[12 + 4 + 4] = 'x';	/* "/workxpace" */
	assert_int_equal(cap_proto_file_decode(buf, n, &out, root, sizeof(root), path, sizeof(path)),
			 -EBADMSG);
	/* A root longer than the caller's buffer. */
	buf[12 + 4 + 4] = 's';
	assert_int_equal(cap_proto_file_decode(buf, n, &out, root, 10, path, sizeof(path)), -EBADMSG);
	cap_buf_fini(&b);
}

static size_t listeners_frame(uint8_t *buf, uint32_t n, const uint16_t *ports, uint32_t k)
{
	cap_put_u32(buf, n);
	for (uint32_t i = 0; i < k; i++)
		cap_put_u16(buf + 4 + 2 * i, ports[i]);
	return 4 + 2 * (size_t)k;
}

/* CLOCK: 8 bytes, the ns since 1970, little-endian; nothing else. */
static void clock_codec(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	int64_t ns;
	const int64_t t = INT64_C(1764633600123456789);	/* 2025-12-02, past 2^32 s of ns */
	cap_buf_init(&b);
	cap_proto_clock_encode(&b, t);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(f.type, CAP_MSG_CLOCK);
	assert_int_equal(f.stream, 0);
	assert_int_equal(f.len, 8);
	assert_int_equal(cap_get_u32(f.payload), (uint32_t)((uint64_t)t & 0xffffffffu));
	assert_int_equal(cap_proto_clock_decode(f.payload, f.len, &ns), 0);
	assert_true(ns == t);
	for (uint32_t k = 0; k < 12; k++)
		if (k != 8)
			assert_int_equal(cap_proto_clock_decode(f.payload, k, &ns), -EBADMSG);
	uint8_t bad[8] = { 0 };
	assert_int_equal(cap_proto_clock_decode(bad, 8, &ns), -EBADMSG);	/* 1970 */
	memset(bad, 0xff, sizeof(bad));
	assert_int_equal(cap_proto_clock_decode(bad, 8, &ns), -EBADMSG);	/* before it */
	assert_string_equal(cap_msg_name(CAP_MSG_CLOCK), "CLOCK");
	cap_buf_fini(&b);
}

static void listeners_codec(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	uint16_t *got;
	uint32_t n;
	const uint16_t ports[] = { 22, 3000, 8080, 65535 };
	cap_buf_init(&b);
	assert_int_equal(cap_proto_listeners_encode(&b, ports, 4), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(f.type, CAP_MSG_LISTENERS);
	assert_int_equal(f.stream, 0);
	assert_int_equal(f.len, 4 + 2 * 4);
	assert_int_equal(cap_proto_listeners_decode(f.payload, f.len, &got, &n), 0);
	assert_int_equal(n, 4);
	assert_memory_equal(got, ports, sizeof(ports));
	free(got);
	for (uint32_t k = 0; k < f.len; k++)
		assert_int_equal(cap_proto_listeners_decode(f.payload, k, &got, &n), -EBADMSG);

	/* The empty set. */
	b.off = b.len = 0;
	assert_int_equal(cap_proto_listeners_encode(&b, NULL, 0), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_listeners_decode(f.payload, f.len, &got, &n), 0);
	assert_int_equal(n, 0);
	assert_non_null(got);
	free(got);

	/* The largest set. */
	uint16_t many[CAP_PROTO_MAX_LISTENERS + 1];
	for (uint32_t i = 0; i < CAP_ARRAY_SIZE(many); i++)
		many[i] = (uint16_t)(1 + i);
	b.off = b.len = 0;
	assert_int_equal(cap_proto_listeners_encode(&b, many, CAP_PROTO_MAX_LISTENERS), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_listeners_decode(f.payload, f.len, &got, &n), 0);
	assert_int_equal(n, CAP_PROTO_MAX_LISTENERS);
	free(got);
	assert_int_equal(cap_proto_listeners_encode(&b, many, CAP_PROTO_MAX_LISTENERS + 1), -EINVAL);
	cap_buf_fini(&b);

	/* Malformed payloads. */
	uint8_t buf[4 + 2 * (CAP_PROTO_MAX_LISTENERS + 1) + 2];
	size_t len = listeners_frame(buf, CAP_PROTO_MAX_LISTENERS + 1, many, CAP_PROTO_MAX_LISTENERS + 1);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);	/* too many */
	len = listeners_frame(buf, 0xffffffffu, NULL, 0);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);	/* hostile count */
	len = listeners_frame(buf, 3, ports, 2);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);	/* short */
	len = listeners_frame(buf, 2, ports, 3);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);	/* trailing */
	assert_int_equal(cap_proto_listeners_decode(buf, len - 1, &got, &n), -EBADMSG);	/* odd */
	const uint16_t unsorted[] = { 80, 22 }, dup[] = { 80, 80 }, zero[] = { 0, 80 };
	len = listeners_frame(buf, 2, unsorted, 2);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);
	len = listeners_frame(buf, 2, dup, 2);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);
	len = listeners_frame(buf, 2, zero, 2);
	assert_int_equal(cap_proto_listeners_decode(buf, len, &got, &n), -EBADMSG);
	/* The encoder refuses what the decoder would. */
	cap_buf_init(&b);
	assert_int_equal(cap_proto_listeners_encode(&b, unsorted, 2), -EINVAL);
	assert_int_equal(cap_proto_listeners_encode(&b, dup, 2), -EINVAL);
	assert_int_equal(cap_proto_listeners_encode(&b, zero, 2), -EINVAL);
	assert_int_equal(cap_buf_used(&b), 0);
	cap_buf_fini(&b);
	assert_string_equal(cap_msg_name(CAP_MSG_LISTENERS), "LISTENERS");
}

/* The tmpfs list: options bit 1, then u32 n and per mount destination,
 * data and flags; sent only when not empty, with or without a read-only
 * root; decoded strictly. */
static void setup_tmpfs(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f, plain;
	struct cap_setup out;
	struct cap_setup in = { .root_image = "capsule-root", .root_upper = "capsule-upper",
				.work = "w", .source = "", .hostname = "h" };
	cap_buf_init(&b);
	assert_int_equal(setup_roundtrip(&in, &b, &plain, &out), 0);
	assert_int_equal(out.ntmpfs, 0);
	assert_null(out.tmpfs);
	cap_setup_fini(&out);
	size_t plain_len = plain.len;
	uint8_t old[256];
	memcpy(old, plain.payload, plain_len);

	struct cap_setup_tmpfs t[CAP_SETUP_MAX_TMPFS + 1] = {
		{ "/var/tmp", "mode=1777", 0x2 | 0x4 },
		{ "/cache/deep", "", 0x40f },
	};
	struct cap_setup tm = in;
	tm.tmpfs = t;
	tm.ntmpfs = 2;
	assert_int_equal(setup_roundtrip(&tm, &b, &f, &out), 0);
	/* secrets "" + 0, workspace "", flags, n, the two mounts */
	size_t list = 4 + (4 + 8 + 4 + 9 + 4) + (4 + 11 + 4 + 0 + 4);
	assert_int_equal(f.len, plain_len + 8 + 4 + 4 + list);
	assert_memory_equal(f.payload, old, plain_len);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12), CAP_SETUP_TMPFS);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 16), 2);
	assert_false(out.root_readonly);
	assert_int_equal(out.ntmpfs, 2);
	assert_string_equal(out.tmpfs[0].destination, "/var/tmp");
	assert_string_equal(out.tmpfs[0].data, "mode=1777");
	assert_int_equal(out.tmpfs[0].flags, 0x6);
	assert_string_equal(out.tmpfs[1].destination, "/cache/deep");
	assert_string_equal(out.tmpfs[1].data, "");
	assert_int_equal(out.tmpfs[1].flags, CAP_SETUP_TMPFS_FLAGS);
	cap_setup_fini(&out);
	/* Cut anywhere, refused, but right before the sections. */
	for (uint32_t k = 0; k < f.len; k++) {
		int r = cap_proto_setup_decode(f.payload, k, &out);
		if (k == plain_len) {
			assert_int_equal(r, 0);
			assert_int_equal(out.ntmpfs, 0);
			cap_setup_fini(&out);
		} else {
			assert_int_equal(r, -EBADMSG);
		}
	}
	/* With a read-only root: both bits, one list. */
	tm.root_readonly = true;
	assert_int_equal(setup_roundtrip(&tm, &b, &f, &out), 0);
	assert_int_equal(cap_get_u32(f.payload + plain_len + 12),
			 CAP_SETUP_ROOT_READONLY | CAP_SETUP_TMPFS);
	assert_true(out.root_readonly);
	assert_int_equal(out.ntmpfs, 2);
	cap_setup_fini(&out);
	tm.root_readonly = false;

	/* The encoder refuses what the decoder would. */
	static const char *const bad_dest[] = { "", "var/tmp", "/a/../b", "/a/./b", "/a//b",
						"/a/", "/..", "/." };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad_dest); i++) {
		snprintf(t[0].destination, sizeof(t[0].destination), "%s", bad_dest[i]);
		assert_false(cap_proto_setup_tmpfs_ok(&t[0]));
		assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);
	}
	memset(t[0].destination, 'a', sizeof(t[0].destination));
	t[0].destination[0] = '/';
	assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);	/* 256 bytes */
	t[0].destination[255] = '\0';
	assert_true(cap_proto_setup_tmpfs_ok(&t[0]));	/* 255 */
	snprintf(t[0].destination, sizeof(t[0].destination), "/var/tmp");
	memset(t[0].data, 'd', sizeof(t[0].data));
	assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);
	snprintf(t[0].data, sizeof(t[0].data), "mode=1777");
	t[0].flags = 0x1000;	/* MS_BIND */
	assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);
	t[0].flags = 0x6;
	for (uint32_t i = 2; i <= CAP_SETUP_MAX_TMPFS; i++)
		t[i] = t[0];
	tm.ntmpfs = CAP_SETUP_MAX_TMPFS + 1;
	assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);
	tm.ntmpfs = CAP_SETUP_MAX_TMPFS;
	assert_int_equal(setup_roundtrip(&tm, &b, &f, &out), 0);
	assert_int_equal(out.ntmpfs, CAP_SETUP_MAX_TMPFS);
	cap_setup_fini(&out);
	tm.tmpfs = NULL;
	assert_int_equal(cap_proto_setup_encode(&b, &tm), -EINVAL);

	/* The decoder: one mount "/x", "" and flags, then edits. */
	tm.tmpfs = t;
	tm.ntmpfs = 1;
	snprintf(t[0].destination, sizeof(t[0].destination), "/x");
	t[0].data[0] = '\0';
	t[0].flags = 0;
	assert_int_equal(setup_roundtrip(&tm, &b, &f, &out), 0);
	cap_setup_fini(&out);
	uint8_t buf[512];
	size_t n = f.len, at = plain_len + 16;	/* n */
	memcpy(buf, f.payload, n);
	assert_int_equal(n, at + 4 + 4 + 2 + 4 + 4);
	cap_put_u32(buf + at, 0);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + at, CAP_SETUP_MAX_TMPFS + 1);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + at, 2);	/* a second one missing */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + at, 1);
	cap_put_u32(buf + n - 4, 0x10);	/* MS_SYNCHRONOUS */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + n - 4, 0x400);	/* MS_NOATIME */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	assert_int_equal(out.tmpfs[0].flags, 0x400);
	cap_setup_fini(&out);
	buf[at + 9] = '.';	/* "/." */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	buf[at + 9] = '\0';	/* a NUL in it */
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	buf[at + 9] = 'x';
	buf[n] = 0;	/* a byte left over */
	assert_int_equal(cap_proto_setup_decode(buf, n + 1, &out), -EBADMSG);
	/* The list's bit without a list; a list without its bit. */
	cap_put_u32(buf + plain_len + 12, CAP_SETUP_ROOT_READONLY);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), -EBADMSG);
	cap_put_u32(buf + plain_len + 12, CAP_SETUP_TMPFS);
	assert_int_equal(cap_proto_setup_decode(buf, plain_len + 16, &out), -EBADMSG);
	assert_int_equal(cap_proto_setup_decode(buf, n, &out), 0);
	assert_string_equal(out.tmpfs[0].destination, "/x");
	cap_setup_fini(&out);
	/* A 256-byte data string is refused, 255 taken. */
	struct cap_setup_tmpfs big = { "/big", "", 0 };
	uint8_t *p = buf + at + 4;
	cap_put_u32(p, 4);
	memcpy(p + 4, big.destination, 4);
	cap_put_u32(p + 8, 256);
	memset(p + 12, 'd', 256);
	cap_put_u32(p + 12 + 256, 0);
	assert_true(at + 4 + 12 + 256 + 4 <= sizeof(buf));
	assert_int_equal(cap_proto_setup_decode(buf, at + 4 + 12 + 256 + 4, &out), -EBADMSG);
	cap_put_u32(p + 8, 255);
	cap_put_u32(p + 12 + 255, 0);
	assert_int_equal(cap_proto_setup_decode(buf, at + 4 + 12 + 255 + 4, &out), 0);
	assert_int_equal(strlen(out.tmpfs[0].data), 255);
	cap_setup_fini(&out);
	cap_buf_fini(&b);
}

/* The guest's layout table: what each lookup finds, and the rules the
 * agent, the FILE codec and the OCI mapping read from it. */
static void guest_layout(void **state)
{
	(void)state;
	const struct cap_guest_mount *m;

	/* The data disks: path, file system, flags, serial, role. */
	assert_non_null(m = cap_guest_mount_at("/work"));
	assert_string_equal(m->fstype, "ext4");
	assert_int_equal(m->flags, MS_NOSUID | MS_NODEV);
	assert_string_equal(m->serial, "capsule-work");
	assert_string_equal(m->role, "/work");
	assert_int_equal(m->attr, CAP_GUEST_RESERVED | CAP_GUEST_FILE_ROOT | CAP_GUEST_WRITABLE | CAP_GUEST_HOME);
	assert_non_null(m = cap_guest_mount_at("/workspace"));
	assert_string_equal(m->fstype, "ext4");
	assert_string_equal(m->serial, "capsule-wspace");
	assert_true(m->attr & CAP_GUEST_WRITABLE);
	assert_false(m->attr & CAP_GUEST_HOME);
	assert_non_null(m = cap_guest_mount_at("/source"));
	assert_string_equal(m->fstype, "erofs");
	assert_int_equal(m->flags, MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC);
	assert_string_equal(m->serial, "capsule-source");
	assert_false(m->attr & CAP_GUEST_WRITABLE);
	assert_null(cap_guest_mount_at("/work/"));
	assert_null(cap_guest_mount_at("/nope"));

	/* Every serial is found, fits virtio-blk's 20 bytes, and is one
	 * disk's. */
	static const char *const serials[] = { "capsule-root", "capsule-upper", "capsule-work",
						"capsule-source", "capsule-wspace" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(serials); i++) {
		assert_non_null(m = cap_guest_mount_by_serial(serials[i]));
		assert_string_equal(m->serial, serials[i]);
		assert_true(strlen(m->serial) <= 20);
		assert_non_null(m->role);
	}
	assert_string_equal(cap_guest_mount_by_serial("capsule-root")->role, "the image");
	assert_string_equal(cap_guest_mount_by_serial("capsule-root")->path, "/.capsule/lower");
	assert_null(cap_guest_mount_by_serial("capsule-other"));

	/* FILE roots: exactly the three data disks. */
	assert_non_null(cap_guest_file_root("/work"));
	assert_non_null(cap_guest_file_root("/workspace"));
	assert_non_null(cap_guest_file_root("/source"));
	assert_null(cap_guest_file_root("/proc"));
	assert_null(cap_guest_file_root("/work/a"));
	assert_null(cap_guest_file_root("/"));
	assert_null(cap_guest_file_root(""));

	/* Reserved: the root, the data disks and /dev, /proc, /sys with
	 * what is below them; not /tmp, /run or a name that only starts
	 * like one. */
	static const char *const reserved[] = { "/", "/work", "/work/a/b", "/workspace", "/source/x",
						 "/dev", "/dev/shm", "/proc/1", "/sys/fs/cgroup" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(reserved); i++)
		assert_true(cap_guest_path_reserved(reserved[i]));
	static const char *const free_paths[] = { "/tmp", "/run", "/run/lock", "/var/tmp", "/workx",
						   "/sources", "/devices", "/home" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(free_paths); i++)
		assert_false(cap_guest_path_reserved(free_paths[i]));
	assert_string_equal(cap_guest_mount_over("/dev/pts/0")->path, "/dev");
	assert_string_equal(cap_guest_mount_over("/workspace/x")->path, "/workspace");
	assert_null(cap_guest_mount_over("/tmp"));

	/* The boot mounts and what moves into the final root. */
	size_t n, boot = 0;
	const struct cap_guest_mount *all = cap_guest_mounts(&n);
	char moved[128] = "";
	for (size_t i = 0; i < n; i++) {
		assert_true(all[i].path[0] == '/');
		boot += !!(all[i].attr & CAP_GUEST_AT_BOOT);
		assert_false((all[i].attr & CAP_GUEST_AT_BOOT) && all[i].serial);
		if (all[i].attr & CAP_GUEST_MOVED)
			snprintf(moved + strlen(moved), sizeof(moved) - strlen(moved), "%s ", all[i].path);
	}
	assert_int_equal(boot, 9);
	assert_string_equal(moved, "/proc /sys /dev /tmp /run ");
	assert_true(cap_guest_mount_at("/dev/mqueue")->attr & CAP_GUEST_OPTIONAL);

	/* The macros are the table's paths. */
	assert_string_equal(CAP_GUEST_WORK, "/work");
	assert_string_equal(CAP_GUEST_WORKSPACE, "/workspace");
	assert_string_equal(CAP_GUEST_SOURCE, "/source");
	assert_string_equal(CAP_GUEST_UPPER_WORK, "/.capsule/upper/work");
}

/* --- a pod's containers: the container section, UPDATE, STATS ----------- */

/* A CAP_EXEC_USER request with c as its container section (c NULL: no
 * section, no CAP_EXEC_CONTAINER), encoded into b; its payload through
 * p and n. Returns the encoder's result. */
static int encode_ctr(struct cap_buf *b, struct cap_exec_container *c, const uint8_t **p, size_t *n)
{
	char *argv[] = { "/pause", NULL };
	struct cap_exec_req req = {
		.argv = argv, .argc = 1, .cwd = "/",
		.flags = CAP_EXEC_USER | (c ? CAP_EXEC_CONTAINER : 0), .gid = 5, .umask = 022,
		.ctr = c,
	};
	cap_buf_init(b);
	int r = cap_proto_exec_encode(b, 3, &req);
	if (r == 0) {
		struct cap_frame f;
		assert_true(cap_proto_parse(cap_buf_head(b), cap_buf_used(b), &f) > 0);
		*p = f.payload;
		*n = f.len;
	}
	return r;
}

/* The section's bytes written by hand, as docs/protocol.md spells them. */
struct wr {
	uint8_t b[4096];
	size_t n;
};
static void w32(struct wr *w, uint32_t v)
{
	cap_put_u32(w->b + w->n, v);
	w->n += 4;
}
static void w64(struct wr *w, uint64_t v)
{
	w32(w, (uint32_t)v);
	w32(w, (uint32_t)(v >> 32));
}
static void wstr(struct wr *w, const char *s)
{
	w32(w, (uint32_t)strlen(s));
	memcpy(w->b + w->n, s, strlen(s));
	w->n += strlen(s);
}
/* name, options, limits (set and the five values), nm mounts each a
 * proc at /proc (mount kind, destination and data taken from kinds). */
struct hand_ctr {
	const char *name;
	uint32_t options, set;
	uint64_t v[5];	/* memory_max, cpu_quota, cpu_period, cpu_weight, pids_max */
	uint32_t nmounts;	/* the count sent */
	uint32_t nwritten;	/* the mounts written (<= nmounts, or more) */
	uint32_t kind;
	const char *dest, *data;
	uint32_t flags;
};
static void wctr(struct wr *w, const struct hand_ctr *h)
{
	wstr(w, h->name);
	w32(w, h->options);
	w32(w, h->set);
	for (int i = 0; i < 5; i++)
		w64(w, h->v[i]);
	w32(w, h->nmounts);
	for (uint32_t i = 0; i < h->nwritten; i++) {
		w32(w, h->kind);
		wstr(w, h->dest);
		wstr(w, h->data);
		w32(w, h->flags);
	}
}

/* Decode the user request of encode_ctr(NULL) with the section h
 * appended and CAP_EXEC_CONTAINER set. */
static int decode_hand(const struct hand_ctr *h, struct cap_exec_req *out, struct cap_err *err)
{
	struct cap_buf b;
	const uint8_t *p;
	size_t n;
	assert_int_equal(encode_ctr(&b, NULL, &p, &n), 0);
	static struct wr w;
	memset(&w, 0, sizeof(w));
	memcpy(w.b, p, n);
	w.n = n;
	cap_put_u32(w.b + 8, CAP_EXEC_USER | CAP_EXEC_CONTAINER);
	wctr(&w, h);
	cap_buf_fini(&b);
	memset(err, 0, sizeof(*err));
	int r = cap_proto_exec_decode(w.b, w.n, out, err);
	if (r < 0)
		assert_true(err->msg[0] != '\0');
	return r;
}

/* A section that decodes: ROOT, memory and pids set, one volume. */
static struct hand_ctr good_hand(void)
{
	return (struct hand_ctr){
		.name = "web-1", .options = CAP_CTR_ROOT, .set = CAP_LIMIT_MEMORY | CAP_LIMIT_PIDS,
		.v = { 1 << 20, 0, 0, 0, 64 }, .nmounts = 1, .nwritten = 1,
		.kind = CAP_CTR_VOLUME, .dest = "/data", .data = "vabc", .flags = MS_NOSUID,
	};
}

static void ctr_roundtrip(void **state)
{
	(void)state;
	struct cap_exec_container c = {
		.name = "app.v2+x_y-z",
		.options = CAP_CTR_ROOT | CAP_CTR_READONLY,
		.limits = { .set = CAP_LIMIT_ALL, .memory_max = 64 << 20, .cpu_quota = 50000,
			    .cpu_period = 100000, .cpu_weight = 100, .pids_max = CAP_LIMIT_NONE },
		.nmounts = 3,
	};
	c.mounts[0] = (struct cap_ctr_mount){ .kind = CAP_CTR_PROC, .destination = "/proc",
					      .flags = MS_NOSUID | MS_NODEV | MS_NOEXEC };
	c.mounts[1] = (struct cap_ctr_mount){ .kind = CAP_CTR_TMPFS, .destination = "/dev",
					      .data = "mode=755,size=65536k", .flags = MS_NOSUID };
	c.mounts[2] = (struct cap_ctr_mount){ .kind = CAP_CTR_VOLUME, .destination = "/cache",
					      .data = "v0123abcd", .flags = MS_RDONLY };
	struct cap_buf b, plain;
	const uint8_t *p, *q;
	size_t n, m;
	assert_int_equal(encode_ctr(&plain, NULL, &q, &m), 0);
	assert_int_equal(encode_ctr(&b, &c, &p, &n), 0);
	/* name, options, limits (4 + 5 x 8), nmounts, each mount */
	size_t section = 4 + strlen(c.name) + 4 + 44 + 4 + (4 + 4 + 5 + 4 + 0 + 4) +
			 (4 + 4 + 4 + 4 + 20 + 4) + (4 + 4 + 6 + 4 + 9 + 4);
	assert_int_equal(n, m + section);
	/* the section follows the user section, byte for byte the plain request */
	assert_memory_equal(p + 12, q + 12, m - 12);
	const uint8_t *s = p + m;
	assert_int_equal(s[0], strlen(c.name));
	assert_memory_equal(s + 4, c.name, strlen(c.name));
	s += 4 + strlen(c.name);
	assert_int_equal(s[0], CAP_CTR_ROOT | CAP_CTR_READONLY);
	assert_int_equal(s[4], CAP_LIMIT_ALL);
	/* pids_max "max" is ~0, low word first */
	assert_memory_equal(s + 8 + 32, "\xff\xff\xff\xff\xff\xff\xff\xff", 8);
	assert_int_equal(s[48], 3);

	struct cap_exec_req out;
	struct cap_err err = { 0 };
	assert_int_equal(cap_proto_exec_decode(p, n, &out, &err), 0);
	assert_non_null(out.ctr);
	assert_int_equal(out.flags, CAP_EXEC_USER | CAP_EXEC_CONTAINER);
	assert_string_equal(out.ctr->name, c.name);
	assert_int_equal(out.ctr->options, c.options);
	assert_memory_equal(&out.ctr->limits, &c.limits, sizeof(c.limits));
	assert_int_equal(out.ctr->nmounts, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(out.ctr->mounts[i].kind, c.mounts[i].kind);
		assert_string_equal(out.ctr->mounts[i].destination, c.mounts[i].destination);
		assert_string_equal(out.ctr->mounts[i].data, c.mounts[i].data);
		assert_int_equal(out.ctr->mounts[i].flags, c.mounts[i].flags);
	}
	cap_exec_req_fini(&out);
	/* every prefix is refused with a message, and so is a trailing byte */
	for (size_t cut = m; cut < n; cut++) {
		memset(&err, 0, sizeof(err));
		assert_int_equal(cap_proto_exec_decode(p, cut, &out, &err), -EBADMSG);
		assert_true(err.msg[0] != '\0');
	}
	uint8_t longer[1024];
	memcpy(longer, p, n);
	longer[n] = 0;
	assert_int_equal(cap_proto_exec_decode(longer, n + 1, &out, &err), -EBADMSG);
	cap_buf_fini(&b);
	cap_buf_fini(&plain);

	/* a limit not set goes as 0 whatever the struct holds, and comes back 0 */
	struct cap_exec_container j = { .name = "web", .options = CAP_CTR_ROOT,
					.limits = { .set = CAP_LIMIT_PIDS, .memory_max = 12345, .pids_max = 9 } };
	assert_int_equal(encode_ctr(&b, &j, &p, &n), 0);
	assert_int_equal(cap_proto_exec_decode(p, n, &out, &err), 0);
	assert_int_equal(out.ctr->limits.set, CAP_LIMIT_PIDS);
	assert_true(out.ctr->limits.memory_max == 0);
	assert_true(out.ctr->limits.pids_max == 9);
	assert_int_equal(out.ctr->nmounts, 0);
	cap_exec_req_fini(&out);
	cap_buf_fini(&b);

	/* a process joining a running container: no limits, no mounts */
	struct cap_exec_container k = { .name = "web", .options = CAP_CTR_JOIN | CAP_CTR_ROOT };
	assert_int_equal(encode_ctr(&b, &k, &p, &n), 0);
	assert_int_equal(cap_proto_exec_decode(p, n, &out, &err), 0);
	assert_int_equal(out.ctr->options, CAP_CTR_JOIN | CAP_CTR_ROOT);
	cap_exec_req_fini(&out);
	cap_buf_fini(&b);
}

/* What the encoder refuses (-EINVAL, nothing written). */
static void ctr_encode_refused(void **state)
{
	(void)state;
	struct cap_buf b;
	const uint8_t *p;
	size_t n;
	struct cap_exec_container ok = { .name = "web", .options = CAP_CTR_ROOT };
	assert_int_equal(encode_ctr(&b, &ok, &p, &n), 0);
	cap_buf_fini(&b);
	struct cap_exec_container c;
#define REFUSED(...)                                                   \
	do {                                                           \
		c = ok;                                                \
		__VA_ARGS__;                                           \
		assert_int_equal(encode_ctr(&b, &c, &p, &n), -EINVAL); \
		assert_int_equal(cap_buf_used(&b), 0);                 \
		cap_buf_fini(&b);                                      \
	} while (0)
	REFUSED(c.name[0] = '\0');
	REFUSED(snprintf(c.name, sizeof(c.name), "-web"));
	REFUSED(c.options |= 0x8);
	REFUSED(c.options = CAP_CTR_READONLY);
	REFUSED(c.options |= CAP_CTR_JOIN; c.limits = (struct cap_limits){ .set = CAP_LIMIT_PIDS, .pids_max = 5 });
	REFUSED(c.limits = (struct cap_limits){ .set = CAP_LIMIT_MEMORY, .memory_max = 4095 });
	REFUSED(c.nmounts = CAP_CTR_MAX_MOUNTS + 1);
	REFUSED(c.nmounts = 1; c.mounts[0] = (struct cap_ctr_mount){ .kind = CAP_CTR_VOLUME, .destination = "/v",
								     .data = "../x" });
#undef REFUSED
	/* a container section without CAP_EXEC_USER */
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .flags = CAP_EXEC_CONTAINER, .ctr = &ok };
	cap_buf_init(&b);
	assert_int_equal(cap_proto_exec_encode(&b, 3, &req), -EINVAL);
	cap_buf_fini(&b);
}

/* What the decoder refuses, in bytes written by hand. */
static void ctr_decode_refused(void **state)
{
	(void)state;
	struct cap_exec_req out;
	struct cap_err err;
	struct hand_ctr h = good_hand();
	/* the unchanged section decodes: the cases below fail for their change */
	assert_int_equal(decode_hand(&h, &out, &err), 0);
	assert_string_equal(out.ctr->name, "web-1");
	assert_string_equal(out.ctr->mounts[0].data, "vabc");
	assert_true(out.ctr->limits.memory_max == 1 << 20);
	cap_exec_req_fini(&out);
	char long_name[CAP_CTR_NAME_MAX + 2];
	memset(long_name, 'a', sizeof(long_name) - 1);
	long_name[CAP_CTR_NAME_MAX + 1] = '\0';
	long_name[CAP_CTR_NAME_MAX] = '\0';
	h.name = long_name;	/* 64 bytes: the longest taken */
	assert_int_equal(decode_hand(&h, &out, &err), 0);
	cap_exec_req_fini(&out);
#define REFUSED(...)                                                    \
	do {                                                            \
		h = good_hand();                                        \
		__VA_ARGS__;                                            \
		assert_int_equal(decode_hand(&h, &out, &err), -EBADMSG); \
	} while (0)
	/* names */
	REFUSED(h.name = "");
	REFUSED(h.name = ".web");
	REFUSED(h.name = "a/b");
	REFUSED(h.name = "we b");
	REFUSED(long_name[CAP_CTR_NAME_MAX] = 'a'; h.name = long_name);	/* 65 bytes */
	/* options */
	REFUSED(h.options |= 0x8);
	REFUSED(h.options = CAP_CTR_READONLY; h.nmounts = h.nwritten = 0);	/* READONLY without ROOT */
	REFUSED(h.options = 0);	/* mounts without ROOT */
	REFUSED(h.options |= CAP_CTR_JOIN; h.nmounts = h.nwritten = 0);	/* JOIN with limits */
	REFUSED(h.options |= CAP_CTR_JOIN; h.set = 0; memset(h.v, 0, sizeof(h.v)));	/* JOIN with mounts */
	REFUSED(h.options |= CAP_CTR_JOIN | CAP_CTR_READONLY; h.set = 0; memset(h.v, 0, sizeof(h.v));
		h.nmounts = h.nwritten = 0);
	/* limits */
	REFUSED(h.set |= 0x10);	/* an unknown limit bit */
	REFUSED(h.v[0] = 4095);	/* memory below a page */
	REFUSED(h.v[0] = 0);
	REFUSED(h.set |= CAP_LIMIT_CPU; h.v[1] = 50000; h.v[2] = 999);	/* period out of range */
	REFUSED(h.set |= CAP_LIMIT_CPU; h.v[1] = 50000; h.v[2] = 1000001);
	REFUSED(h.set |= CAP_LIMIT_CPU; h.v[1] = 999; h.v[2] = 100000);	/* quota under 1000 */
	REFUSED(h.set |= CAP_LIMIT_CPU_WEIGHT; h.v[3] = 0);
	REFUSED(h.set |= CAP_LIMIT_CPU_WEIGHT; h.v[3] = 10001);
	REFUSED(h.v[4] = 0);	/* pids_max 0 */
	/* a nonzero value for a limit not set: one spelling per value */
	REFUSED(h.v[1] = 50000);
	REFUSED(h.v[2] = 100000);
	REFUSED(h.v[3] = 100);
	REFUSED(h.set = CAP_LIMIT_PIDS);	/* memory_max is still 1 MiB */
	REFUSED(h.set = CAP_LIMIT_MEMORY);	/* pids_max is still 64 */
	/* mounts */
	REFUSED(h.nmounts = h.nwritten = CAP_CTR_MAX_MOUNTS + 1);	/* too many */
	REFUSED(h.nmounts = 0xffffffffu);	/* far more than the bytes */
	REFUSED(h.nmounts = 2);	/* one more than written */
	REFUSED(h.kind = 0);
	REFUSED(h.kind = CAP_CTR_MOUNT_MAX_ + 1);
	REFUSED(h.data = "../v");	/* a volume with a bad name */
	REFUSED(h.data = "");
	REFUSED(h.dest = "/");
	REFUSED(h.dest = "data");
	REFUSED(h.dest = "/a/../b");
	REFUSED(h.flags = MS_BIND);
#undef REFUSED
	/* the most mounts are taken */
	h = good_hand();
	h.nmounts = h.nwritten = CAP_CTR_MAX_MOUNTS;
	assert_int_equal(decode_hand(&h, &out, &err), 0);
	assert_int_equal(out.ctr->nmounts, CAP_CTR_MAX_MOUNTS);
	cap_exec_req_fini(&out);
}

static void update_codec(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_frame f;
	struct cap_update u = { .op = CAP_UPDATE_LIMITS, .name = "web",
				.limits = { .set = CAP_LIMIT_MEMORY | CAP_LIMIT_CPU, .memory_max = CAP_LIMIT_NONE,
					    .cpu_quota = 20000, .cpu_period = 100000 } }, out;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_update_encode(&b, 9, &u), 0);
	assert_int_equal(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f), (int)cap_buf_used(&b));
	assert_int_equal(f.type, CAP_MSG_UPDATE);
	assert_int_equal(f.stream, 9);
	/* u32 op, string name, limits */
	assert_int_equal(f.len, 4 + 4 + 3 + 44);
	assert_int_equal(f.payload[0], CAP_UPDATE_LIMITS);
	assert_memory_equal(f.payload + 8, "web", 3);
	assert_int_equal(cap_proto_update_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.op, CAP_UPDATE_LIMITS);
	assert_string_equal(out.name, "web");
	assert_memory_equal(&out.limits, &u.limits, sizeof(u.limits));
	for (size_t cut = 0; cut < f.len; cut++)
		assert_int_equal(cap_proto_update_decode(f.payload, cut, &out), -EBADMSG);
	uint8_t p[256];
	size_t n = f.len;
	memcpy(p, f.payload, n);
	p[n] = 0;
	assert_int_equal(cap_proto_update_decode(p, n + 1, &out), -EBADMSG);	/* a trailing byte */
	p[0] = 3;	/* an unknown op */
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[0] = 0;
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[0] = CAP_UPDATE_REMOVE;	/* REMOVE with limits */
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[0] = CAP_UPDATE_LIMITS;
	p[8] = '/';	/* a bad name */
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[8] = 'w';
	p[11] = 0x10;	/* an unknown limit bit */
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[11] = CAP_LIMIT_MEMORY;	/* cpu values sent for cpu not set */
	assert_int_equal(cap_proto_update_decode(p, n, &out), -EBADMSG);
	p[11] = CAP_LIMIT_MEMORY | CAP_LIMIT_CPU;
	assert_int_equal(cap_proto_update_decode(p, n, &out), 0);	/* patched back: taken */
	cap_buf_fini(&b);

	/* REMOVE: a name and no limits */
	struct cap_update rm = { .op = CAP_UPDATE_REMOVE, .name = "web" };
	cap_buf_init(&b);
	assert_int_equal(cap_proto_update_encode(&b, 2, &rm), 0);
	assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
	assert_int_equal(cap_proto_update_decode(f.payload, f.len, &out), 0);
	assert_int_equal(out.op, CAP_UPDATE_REMOVE);
	assert_int_equal(out.limits.set, 0);
	cap_buf_fini(&b);

	/* the encoder refuses what the decoder would */
	struct cap_update bad[] = {
		{ .op = 3, .name = "web" },
		{ .op = CAP_UPDATE_LIMITS, .name = "" },
		{ .op = CAP_UPDATE_LIMITS, .name = "a b" },
		{ .op = CAP_UPDATE_REMOVE, .name = "web", .limits = { .set = CAP_LIMIT_PIDS, .pids_max = 3 } },
		{ .op = CAP_UPDATE_LIMITS, .name = "web", .limits = { .set = CAP_LIMIT_MEMORY, .memory_max = 100 } },
		{ .op = CAP_UPDATE_LIMITS, .name = "web",
		  .limits = { .set = CAP_LIMIT_CPU, .cpu_quota = 5000, .cpu_period = 2000000 } },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		cap_buf_init(&b);
		assert_int_equal(cap_proto_update_encode(&b, 2, &bad[i]), -EINVAL);
		assert_int_equal(cap_buf_used(&b), 0);
		cap_buf_fini(&b);
	}
}

static void stats_request_codec(void **state)
{
	(void)state;
	const char *names[] = { "", "web", "c0123456789" };
	char name[CAP_CTR_NAME_MAX + 1];
	for (size_t i = 0; i < CAP_ARRAY_SIZE(names); i++) {
		struct cap_buf b;
		struct cap_frame f;
		cap_buf_init(&b);
		assert_int_equal(cap_proto_stats_req_encode(&b, 4, names[i]), 0);
		assert_true(cap_proto_parse(cap_buf_head(&b), cap_buf_used(&b), &f) > 0);
		assert_int_equal(f.type, CAP_MSG_STATS);
		assert_int_equal(f.len, 4 + strlen(names[i]));
		memset(name, 'x', sizeof(name));
		assert_int_equal(cap_proto_stats_req_decode(f.payload, f.len, name, sizeof(name)), 0);
		assert_string_equal(name, names[i]);
		/* too small a buffer, a trailing byte, a prefix */
		assert_int_equal(cap_proto_stats_req_decode(f.payload, f.len, name, CAP_CTR_NAME_MAX), -EBADMSG);
		uint8_t p[128];
		memcpy(p, f.payload, f.len);
		p[f.len] = 'a';
		assert_int_equal(cap_proto_stats_req_decode(p, f.len + 1, name, sizeof(name)), -EBADMSG);
		assert_int_equal(cap_proto_stats_req_decode(p, f.len - 1, name, sizeof(name)), -EBADMSG);
		cap_buf_fini(&b);
	}
	struct cap_buf b;
	cap_buf_init(&b);
	assert_int_equal(cap_proto_stats_req_encode(&b, 4, "-web"), -EINVAL);
	assert_int_equal(cap_proto_stats_req_encode(&b, 4, "a/b"), -EINVAL);
	assert_int_equal(cap_buf_used(&b), 0);
	cap_buf_fini(&b);
	/* a bad name in the bytes */
	uint8_t p[] = { 3, 0, 0, 0, 'a', '/', 'b' };
	assert_int_equal(cap_proto_stats_req_decode(p, sizeof(p), name, sizeof(name)), -EBADMSG);
	p[5] = '-';
	assert_int_equal(cap_proto_stats_req_decode(p, sizeof(p), name, sizeof(name)), 0);
}

static void stats_put_get(void **state)
{
	(void)state;
	static struct cap_stats s;
	memset(&s, 0, sizeof(s));
	assert_null(cap_stats_get(&s, "memory.current"));
	assert_true(cap_stats_put(&s, "memory.current", 4096));
	assert_true(cap_stats_put(&s, "cpu.usage_usec", 17));
	assert_int_equal(s.n, 2);
	assert_true(*cap_stats_get(&s, "memory.current") == 4096);
	/* the same key replaces its value */
	assert_true(cap_stats_put(&s, "memory.current", 8192));
	assert_int_equal(s.n, 2);
	assert_true(*cap_stats_get(&s, "memory.current") == 8192);
	assert_true(*cap_stats_get(&s, "cpu.usage_usec") == 17);
	/* bad keys are dropped */
	char k64[CAP_STATS_KEY_MAX + 2];
	memset(k64, 'k', sizeof(k64) - 1);
	k64[sizeof(k64) - 1] = '\0';
	const char *bad[] = { "", "Memory", "memory-current", "a b", k64 };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++)
		assert_false(cap_stats_put(&s, bad[i], 1));
	assert_int_equal(s.n, 2);
	k64[CAP_STATS_KEY_MAX] = '\0';	/* 63 bytes: taken */
	assert_true(cap_stats_put(&s, k64, 63));
	assert_int_equal(s.n, 3);
	/* fill it up: past CAP_STATS_MAX a new key is dropped, an old one still replaced */
	for (uint32_t i = 0; s.n < CAP_STATS_MAX; i++) {
		char k[32];
		snprintf(k, sizeof(k), "memory.stat.k%u", i);
		assert_true(cap_stats_put(&s, k, i));
	}
	assert_false(cap_stats_put(&s, "pids.current", 3));
	assert_null(cap_stats_get(&s, "pids.current"));
	assert_int_equal(s.n, CAP_STATS_MAX);
	assert_true(cap_stats_put(&s, "cpu.usage_usec", 18));
	assert_true(*cap_stats_get(&s, "cpu.usage_usec") == 18);
}

static void stats_record_codec(void **state)
{
	(void)state;
	static struct cap_stats s, out;
	memset(&s, 0, sizeof(s));
	assert_true(cap_stats_put(&s, "memory.current", 1ull << 40));
	assert_true(cap_stats_put(&s, "pids.current", 3));
	assert_true(cap_stats_put(&s, "memory.events.oom_kill", 0));
	struct cap_buf b;
	cap_buf_init(&b);
	cap_proto_stats_encode(&b, &s);
	const uint8_t *p = cap_buf_head(&b);
	size_t n = cap_buf_used(&b);
	/* u32 n, then per pair a string and a u64 */
	assert_int_equal(n, 4 + (4 + 14 + 8) + (4 + 12 + 8) + (4 + 22 + 8));
	assert_int_equal(p[0], 3);
	assert_memory_equal(p + 8, "memory.current", 14);
	assert_int_equal(p[8 + 14 + 5], 1);	/* 2^40: byte 5 of the low-first u64 */
	assert_int_equal(cap_proto_stats_decode(p, n, &out), 0);
	assert_int_equal(out.n, 3);
	for (uint32_t i = 0; i < s.n; i++) {
		assert_string_equal(out.v[i].key, s.v[i].key);
		assert_true(out.v[i].value == s.v[i].value);
	}
	for (size_t cut = 0; cut < n; cut++)
		assert_int_equal(cap_proto_stats_decode(p, cut, &out), -EBADMSG);
	uint8_t q[256];
	memcpy(q, p, n);
	q[n] = 0;
	assert_int_equal(cap_proto_stats_decode(q, n + 1, &out), -EBADMSG);	/* a trailing byte */
	q[8] = 'M';	/* a bad key */
	assert_int_equal(cap_proto_stats_decode(q, n, &out), -EBADMSG);
	q[8] = 'm';
	assert_int_equal(cap_proto_stats_decode(q, n, &out), 0);
	cap_buf_fini(&b);

	/* a repeated key */
	uint8_t rep[] = { 2, 0, 0, 0, 1, 0, 0, 0, 'a', 1, 0, 0, 0, 0, 0, 0, 0,
			  1, 0, 0, 0, 'a', 2, 0, 0, 0, 0, 0, 0, 0 };
	assert_int_equal(cap_proto_stats_decode(rep, sizeof(rep), &out), -EBADMSG);
	rep[21] = 'b';
	assert_int_equal(cap_proto_stats_decode(rep, sizeof(rep), &out), 0);
	assert_int_equal(out.n, 2);
	/* n over CAP_STATS_MAX, and n more than the bytes hold */
	uint8_t big[4 + 13 * (CAP_STATS_MAX + 1)];
	memset(big, 0, sizeof(big));
	cap_put_u32(big, CAP_STATS_MAX + 1);
	assert_int_equal(cap_proto_stats_decode(big, sizeof(big), &out), -EBADMSG);
	cap_put_u32(big, 0xffffffffu);
	assert_int_equal(cap_proto_stats_decode(big, 4, &out), -EBADMSG);
	/* an empty record */
	uint8_t empty[4] = { 0 };
	assert_int_equal(cap_proto_stats_decode(empty, 4, &out), 0);
	assert_int_equal(out.n, 0);
	/* the fullest record round-trips */
	memset(&s, 0, sizeof(s));
	for (uint32_t i = 0; i < CAP_STATS_MAX; i++) {
		char k[32];
		snprintf(k, sizeof(k), "k%u", i);
		assert_true(cap_stats_put(&s, k, i));
	}
	cap_buf_init(&b);
	cap_proto_stats_encode(&b, &s);
	assert_int_equal(cap_proto_stats_decode(cap_buf_head(&b), cap_buf_used(&b), &out), 0);
	assert_int_equal(out.n, CAP_STATS_MAX);
	assert_true(*cap_stats_get(&out, "k127") == 127);
	cap_buf_fini(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(frame_roundtrip),
		cmocka_unit_test(frame_truncated_needs_more),
		cmocka_unit_test(frame_oversized_length),
		cmocka_unit_test(frame_unknown_type_and_flags),
		cmocka_unit_test(exec_roundtrip),
		cmocka_unit_test(exec_truncated_everywhere),
		cmocka_unit_test(exec_hostile_counts),
		cmocka_unit_test(exec_rejects_nul_env_and_trailing),
		cmocka_unit_test(exec_encode_too_big),
		cmocka_unit_test(exec_pids_max_optional),
		cmocka_unit_test(exec_user_roundtrip),
		cmocka_unit_test(exec_user_refused),
		cmocka_unit_test(exec_user_fields_ignored_without_flag),
		cmocka_unit_test(exit_codec),
		cmocka_unit_test(exit_status_mapping),
		cmocka_unit_test(hello_and_error_text_sanitized),
		cmocka_unit_test(setup_codec),
		cmocka_unit_test(setup_network_fields),
		cmocka_unit_test(setup_secrets_roundtrip),
		cmocka_unit_test(setup_secrets_refused),
		cmocka_unit_test(setup_workspace_section),
		cmocka_unit_test(setup_root_readonly),
		cmocka_unit_test(setup_tools_root),
		cmocka_unit_test(hello_flags),
		cmocka_unit_test(setup_tmpfs),
		cmocka_unit_test(file_ops_and_roots),
		cmocka_unit_test(listeners_codec),
		cmocka_unit_test(clock_codec),
		cmocka_unit_test(guest_layout),
		cmocka_unit_test(ctr_roundtrip),
		cmocka_unit_test(ctr_encode_refused),
		cmocka_unit_test(ctr_decode_refused),
		cmocka_unit_test(update_codec),
		cmocka_unit_test(stats_request_codec),
		cmocka_unit_test(stats_put_get),
		cmocka_unit_test(stats_record_codec),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
