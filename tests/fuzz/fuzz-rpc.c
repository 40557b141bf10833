/* Fuzz target for the JSON-RPC envelope layer (src/common/jsonrpc.c): a
 * byte stream fed in random chunks through the line reader, every line
 * through cap_rpc_parse, and a reply to it through the encoders.
 *
 * Checked for every input:
 * - the reader hands out exactly the lines a one-pass model of the whole
 *   stream finds (non-empty, not a lone "\r", at most the limit), and one
 *   too_long() per longer line, however the stream is cut; once with
 *   CAP_RPC_LINE_MAX through cap_rpc_feed, once with a small limit
 *   through cap_buf_lines (the same code at a size a fuzzer reaches);
 * - cap_rpc_parse returns what the contract in jsonrpc.h says for that
 *   line, fills exactly one of the request / result / error shapes on
 *   success with an id that is a string or an integer (or null for a
 *   response), and on failure leaves a non-empty NUL-terminated message
 *   in the caller's buffer (whatever its size) and the id, if usable, in
 *   bad_id;
 * - each reply written by cap_rpc_put_result / _error / _request is one
 *   line of JSON ending in "\n" that cap_rpc_parse accepts back with the
 *   same id.
 * Before the random part (standalone only), fixed streams check the limit
 * itself: a line of exactly CAP_RPC_LINE_MAX bytes is delivered, one of
 * CAP_RPC_LINE_MAX + 1 bytes is refused once and the next line still
 * arrives, whole, in pieces cut at the edges, and through cap_rpc_read on
 * a socket.
 *
 * Built three ways, as fuzz-proto is: as a libFuzzer target and as a
 * replay driver of the files given (a failed check aborts in both), and
 * with -DCAP_FUZZ_MUTATE as a standalone driver run under ASan+UBSan in
 * `make test`:
 *   mutate-rpc [ITERATIONS [SEED]]
 * which prints TAP and exits non-zero at the first failed check. */
#include <errno.h>
#include <inttypes.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "jsonrpc.h"
#include "utf8.h"
#include "util.h"

#define MAX CAP_RPC_LINE_MAX

/* --- failures ------------------------------------------------------------ */

static const char *test_name = "setup";
static int test_no = 0;
static const uint8_t *cur_in;	/* the stream being checked, for the report */
static size_t cur_n;
static const char *cur_line;	/* the line being parsed */
static size_t cur_line_n;
static __attribute__((unused)) char again[128];	/* the command that replays a standalone run */

static void show(const char *what, const void *p, size_t n)
{
	const uint8_t *s = p;
	printf("# %s (%zu bytes): \"", what, n);
	for (size_t i = 0; i < n && i < 400; i++) {
		if (s[i] == '"' || s[i] == '\\')
			printf("\\%c", s[i]);
		else if (s[i] >= 0x20 && s[i] < 0x7f)
			putchar(s[i]);
		else
			printf("\\x%02x", s[i]);
	}
	printf("\"%s\n", n > 400 ? "..." : "");
}

/* A check failed: say what and on which input, then stop. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
	va_list ap;
	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (cur_line)
		show("line", cur_line, cur_line_n);
	if (cur_in)
		show("input stream", cur_in, cur_n);
#ifndef CAP_FUZZ_MUTATE
	printf("# in: %s\n", test_no ? test_name : "LLVMFuzzerTestOneInput");
	fflush(stdout);
	abort();
#else
	printf("# again: %s\nnot ok %d - %s\n", again, test_no, test_name);
	fflush(stdout);
	_exit(1);	/* no leak report for what the failed round held */
#endif
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond))                                                   \
			fail(__VA_ARGS__);                                     \
	} while (0)

/* --- randomness ---------------------------------------------------------- */

/* Chunk sizes and message buffer sizes, reseeded from each input so that
 * an input is replayed identically. */
static uint64_t cut = 1;

static uint32_t step(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return (uint32_t)(*s >> 11);
}

static uint32_t cut_below(uint32_t n) { return n ? step(&cut) % n : 0; }

/* --- the model of the reader --------------------------------------------- */

/* Events as the reader reports them, encoded for comparison: 'L', an
 * 8-byte length and the line, or 'T' for a line over the limit. */
static void ev_line(struct cap_buf *ev, const char *p, size_t n)
{
	uint8_t hdr[9] = { 'L' };
	uint64_t v = n;
	memcpy(hdr + 1, &v, 8);
	cap_buf_append(ev, hdr, sizeof(hdr));
	cap_buf_append(ev, p, n);
}

static void ev_long(struct cap_buf *ev) { cap_buf_append(ev, "T", 1); }

/* What a reader with limit max must report for the whole of s, however it
 * arrives: each line up to "\n" that is not empty nor a lone "\r" and not
 * over max; too_long for each longer one, including an unfinished last
 * line already over max. */
static void model(const uint8_t *s, size_t n, size_t max, struct cap_buf *ev)
{
	size_t start = 0;
	for (size_t i = 0; i <= n; i++) {
		if (i < n && s[i] != '\n')
			continue;
		size_t len = i - start;
		if (len > max)
			ev_long(ev);
		else if (i < n && len > 0 && !(len == 1 && s[start] == '\r'))
			ev_line(ev, (const char *)s + start, len);
		start = i + 1;
	}
}

static size_t ev_count(const struct cap_buf *ev, char kind)
{
	size_t k = 0, i = 0, n = cap_buf_used(ev);
	const uint8_t *p = cap_buf_head(ev);
	while (i < n) {
		if (p[i] == kind)
			k++;
		if (p[i] == 'T') {
			i++;
		} else {
			uint64_t len;
			memcpy(&len, p + i + 1, 8);
			i += 9 + len;
		}
	}
	return k;
}

static void same_events(const struct cap_buf *got, const struct cap_buf *want,
			const char *how)
{
	size_t gn = cap_buf_used(got), wn = cap_buf_used(want);
	if (gn == wn && (gn == 0 || memcmp(cap_buf_head(got), cap_buf_head(want), gn) == 0))
		return;
	size_t d = 0;
	while (d < gn && d < wn && cap_buf_head(got)[d] == cap_buf_head(want)[d])
		d++;
	fail("%s: the reader reported %zu line(s) and %zu too_long(), the model %zu and %zu (first difference at byte %zu of the event log)",
	     how, ev_count(got, 'L'), ev_count(got, 'T'), ev_count(want, 'L'),
	     ev_count(want, 'T'), d);
}

/* --- checks on one line -------------------------------------------------- */

static bool id_ok(const json_t *id) { return json_is_string(id) || json_is_integer(id); }

/* The contract of cap_rpc_parse (jsonrpc.h), evaluated independently:
 * the expected code, and the id that must come back in bad_id. */
static int expected(json_t *root, json_t **want_bad)
{
	*want_bad = NULL;
	if (!root)
		return CAP_RPC_PARSE;
	if (!json_is_object(root))
		return CAP_RPC_INVALID;
	json_t *id = json_object_get(root, "id");
	if (id_ok(id))
		*want_bad = id;
	const char *v = json_string_value(json_object_get(root, "jsonrpc"));
	if (!v || strcmp(v, "2.0") != 0)
		return CAP_RPC_INVALID;
	json_t *method = json_object_get(root, "method");
	if (!method) {
		json_t *res = json_object_get(root, "result"), *err = json_object_get(root, "error");
		if (!id || !(id_ok(id) || json_is_null(id)))
			return CAP_RPC_INVALID;
		if ((res != NULL) == (err != NULL) || (err && !json_is_object(err)))
			return CAP_RPC_INVALID;
		return 0;
	}
	if (!json_is_string(method) || (id && !id_ok(id)))
		return CAP_RPC_INVALID;
	json_t *params = json_object_get(root, "params");
	if (params && !json_is_object(params))
		return CAP_RPC_INVALID;
	return 0;
}

/* out holds exactly one reply: one line of JSON ending in "\n", which
 * cap_rpc_parse accepts into *back (the caller finis it) with an id equal
 * to want_id (NULL: null), or with none when absent is true. */
static void one_reply(struct cap_buf *out, const char *what, const json_t *want_id,
		      bool absent, struct cap_rpc_msg *back)
{
	size_t n = cap_buf_used(out);
	const char *p = (const char *)cap_buf_head(out);
	CHECK(n > 0, "%s wrote nothing", what);
	if (p[n - 1] != '\n' || memchr(p, '\n', n - 1)) {
		show("reply", p, n);
		fail("%s did not write exactly one line ending in \"\\n\"", what);
	}
	json_t *bad;
	char msg[256];
	int rc = cap_rpc_parse(p, n - 1, back, &bad, msg, sizeof(msg));
	if (rc != 0) {
		show("reply", p, n);
		show("message", msg, strlen(msg));
		fail("%s wrote a line its own parser refuses (%d)", what, rc);
	}
	if (absent) {
		CHECK(!back->id, "%s: an id where none was given", what);
	} else {
		json_t *id = back->id;
		bool ok = want_id ? json_equal(id, (json_t *)want_id) : json_is_null(id);
		if (!ok) {
			show("reply", p, n);
			fail("%s: the reply does not carry the request's id", what);
		}
	}
	cap_buf_consume(out, n);
}

/* Reply to m (or to the failed line with bad_id) through the encoders. */
static void reencode(const struct cap_rpc_msg *m, int rc, json_t *bad_id, const char *msg)
{
	struct cap_buf out;
	struct cap_rpc_msg back;
	cap_buf_init(&out);
	if (rc != 0) {
		cap_rpc_put_error(&out, bad_id, rc, msg, cut_below(2) ? json_string("detail") : NULL);
		if (cap_buf_used(&out) == 0) {
			show("message", msg, strlen(msg));
			fail("cap_rpc_put_error wrote nothing for code %d and the message above", rc);
		}
		one_reply(&out, "cap_rpc_put_error (to a refused line)", bad_id, false, &back);
		CHECK(json_is_object(back.error), "the error reply has no error object");
		CHECK(json_integer_value(json_object_get(back.error, "code")) == rc,
		      "the error reply does not carry code %d", rc);
		const char *text = json_string_value(json_object_get(back.error, "message"));
		/* Word for word when the message is text; repaired if not. */
		if (!text || (strcmp(text, msg) != 0 && (cap_utf8_valid(msg, strlen(msg)) || !*text))) {
			show("message", msg, strlen(msg));
			fail("the error reply does not carry the message");
		}
		cap_rpc_msg_fini(&back);
	} else if (m->method) {
		json_t *id = m->id;
		cap_rpc_put_result(&out, id, cut_below(2) ? json_string(m->method) : json_object());
		one_reply(&out, "cap_rpc_put_result", id, false, &back);
		CHECK(back.result && !back.error, "the result reply has no result");
		cap_rpc_msg_fini(&back);

		cap_rpc_put_error(&out, id, CAP_RPC_METHOD, m->method, json_pack("{s:i}", "n", 1));
		one_reply(&out, "cap_rpc_put_error", id, false, &back);
		const char *text = json_string_value(json_object_get(back.error, "message"));
		CHECK(text && strcmp(text, m->method) == 0, "the error reply lost the message");
		cap_rpc_msg_fini(&back);

		/* The request itself, as a client would send it on. */
		long long nid = json_is_integer(id) && json_integer_value(id) >= 0 ? json_integer_value(id)
			      : (cut_below(2) ? -1 : (long long)cut_below(1000));
		json_t *params = m->params ? json_deep_copy(m->params) : NULL;
		json_t *want = nid >= 0 ? json_integer(nid) : NULL;
		cap_rpc_put_request(&out, nid, m->method, params);
		one_reply(&out, "cap_rpc_put_request", want, nid < 0, &back);
		CHECK(back.method && strcmp(back.method, m->method) == 0, "the request lost its method");
		CHECK(m->params ? json_equal(back.params, m->params) : !back.params,
		      "the request lost its params");
		json_decref(want);
		cap_rpc_msg_fini(&back);
	} else {
		/* A response: the encoders take its id as it is (null too). */
		json_t *id = json_is_null(m->id) ? NULL : m->id;
		cap_rpc_put_error(&out, id, CAP_RPC_INVALID, "unexpected response", NULL);
		one_reply(&out, "cap_rpc_put_error (to a response)", id, false, &back);
		cap_rpc_msg_fini(&back);
	}
	CHECK(cap_buf_used(&out) == 0, "an encoder wrote more than one line");
	cap_buf_fini(&out);
}

static size_t lines_parsed;

/* Parse one line the reader delivered and check the result against the
 * contract; then reply to it. */
static void check_line(const char *p, size_t n)
{
	/* Usually a roomy buffer, sometimes a tiny one: the message must be
	 * cut, not overflowed (ASan watches the end of the allocation). */
	size_t msgsz = cut_below(4) ? 256 : 2 + cut_below(40);
	char *msg = xmalloc(msgsz);
	memset(msg, 0x5a, msgsz);
	struct cap_rpc_msg m;
	json_t *bad = (json_t *)&m;	/* must be overwritten */
	int rc = cap_rpc_parse(p, n, &m, &bad, msg, msgsz);
	lines_parsed++;
	cur_line = p;
	cur_line_n = n;

	json_error_t je;
	/* A NUL byte anywhere makes the line a parse error (jansson would
	 * skip it between tokens). */
	json_t *root = memchr(p, '\0', n) ? NULL : json_loadb(p, n, JSON_REJECT_DUPLICATES, &je);
	json_t *want_bad;
	int want = expected(root, &want_bad);
	if (rc != want) {
		if (rc != 0 && memchr(msg, '\0', msgsz))
			show("message", msg, strlen(msg));
		fail("cap_rpc_parse returned %d, the contract says %d", rc, want);
	}
	if (rc != 0) {
		CHECK(memchr(msg, '\0', msgsz), "the error message is not NUL-terminated within its %zu-byte buffer", msgsz);
		CHECK(msg[0] != '\0', "the error message is empty (code %d)", rc);
		if (json_is_array(root) && msgsz >= 64 && !strstr(msg, "batch")) {
			show("message", msg, strlen(msg));
			fail("a batch was refused without saying so");
		}
		if (rc == CAP_RPC_PARSE)
			CHECK(!bad && !m.owned_root, "a parse error left an id or a root behind");
		else if (want_bad)
			CHECK(bad && json_equal(bad, want_bad) && bad == json_object_get(m.owned_root, "id"),
			      "the usable id of a refused line is not in bad_id");
		else
			CHECK(!bad, "bad_id set for a line without a usable id");
	} else {
		int shapes = !!m.method + !!m.result + !!m.error;
		CHECK(shapes == 1, "%d of method / result / error are set", shapes);
		CHECK(m.owned_root && json_is_object(m.owned_root), "no root object kept");
		json_t *rid = json_object_get(m.owned_root, "id");
		CHECK(m.id == rid, "m.id is not the line's id");
		if (m.method) {
			CHECK(!m.id || id_ok(m.id), "a request id that is neither a string nor an integer");
			CHECK(strcmp(m.method, json_string_value(json_object_get(root, "method"))) == 0,
			      "the method is not the line's");
			CHECK(!m.params || json_is_object(m.params), "params that are not an object");
		} else {
			CHECK(m.id && (id_ok(m.id) || json_is_null(m.id)), "a response without a usable id");
			CHECK(!m.params, "params set on a response");
			CHECK(!m.error || json_is_object(m.error), "an error that is not an object");
		}
	}
	reencode(&m, rc, bad, msg);
	json_decref(root);
	cap_rpc_msg_fini(&m);
	free(msg);
	cur_line = NULL;
}

/* --- one stream ---------------------------------------------------------- */

struct sink {
	struct cap_buf ev;
	bool parse;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct sink *s = ud;
	CHECK(n > 0, "line() called with an empty line");
	ev_line(&s->ev, p, n);
	if (s->parse)
		check_line(p, n);
}

static void on_too_long(void *ud) { ev_long(&((struct sink *)ud)->ev); }

/* The next chunk size: mostly small, sometimes big, sometimes the rest;
 * never small for a long stream (the reader rescans what it holds on
 * every call, so 1-byte pieces of 4 MiB would take minutes). */
static size_t chunk(size_t left, size_t total)
{
	size_t floor = total > 65536 ? 4096 : 1;
	size_t c;
	switch (cut_below(6)) {
	case 0: c = 1; break;
	case 1: c = 1 + cut_below(16); break;
	case 2: c = 1 + cut_below(4096); break;
	case 3: c = 1 + cut_below(1 << 20); break;
	case 4: c = 65536; break;	/* what cap_rpc_read takes at once */
	default: c = left; break;
	}
	return CAP_MIN(CAP_MAX(c, floor), left);
}

static bool parse_lines = true;	/* off: only the reader is checked */

/* Feed s in the given pieces (or random ones when cuts is NULL) to a
 * reader with limit max (CAP_RPC_LINE_MAX: through cap_rpc_feed and the
 * parser) and compare what it reports with the model. */
static void run(const uint8_t *s, size_t n, size_t max, const size_t *cuts,
		size_t ncuts, const char *how)
{
	struct sink k = { .parse = max == MAX && parse_lines };
	struct cap_buf want;
	cap_buf_init(&k.ev);
	cap_buf_init(&want);
	model(s, n, max, &want);

	struct cap_rpc_reader r;
	struct cap_buf b;
	struct cap_lines st = { 0 };
	cap_rpc_reader_init(&r);
	cap_buf_init(&b);
	size_t off = 0, i = 0;
	while (off < n || (cuts && i < ncuts)) {
		size_t c = cuts ? (i < ncuts ? cuts[i++] : n - off) : chunk(n - off, n);
		CHECK(c <= n - off, "bad cut list in %s", how);
		if (max == MAX)
			cap_rpc_feed(&r, s + off, c, on_line, on_too_long, &k);
		else {
			cap_buf_append(&b, s + off, c);
			cap_buf_lines(&b, max, &st, on_line, on_too_long, &k);
		}
		off += c;
	}
	same_events(&k.ev, &want, how);
	/* Nothing complete may be left behind, and nothing over the limit. */
	size_t held = max == MAX ? cap_buf_used(&r.in) : cap_buf_used(&b);
	const uint8_t *h = max == MAX ? cap_buf_head(&r.in) : cap_buf_head(&b);
	CHECK(held <= max && (held == 0 || !memchr(h, '\n', held)), "%s: %zu bytes held back after the last piece", how, held);
	cap_rpc_reader_fini(&r);
	cap_buf_fini(&b);
	cap_buf_fini(&k.ev);
	cap_buf_fini(&want);
}

/* Hash of the input, to seed the cuts from it. */
static uint64_t fnv(const uint8_t *p, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull;
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h | 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	cur_in = data;
	cur_n = size;
	cut = fnv(data, size);
	run(data, size, MAX, NULL, 0, "cap_rpc_feed");
	size_t small = 1 + cut_below(64);
	run(data, size, small, NULL, 0, "cap_buf_lines with a small limit");
	cur_in = NULL;
	return 0;
}

#ifdef CAP_FUZZ_MUTATE
/* --- the standalone driver ------------------------------------------------ */

/* What the driver generates comes from its own seeded sequence. */
static uint64_t gen = 0x9e3779b97f4a7c15ull;
static uint32_t below(uint32_t n) { return n ? step(&gen) % n : 0; }

static void cat(struct cap_buf *b, const char *s) { cap_buf_append(b, s, strlen(s)); }

static const char *pick(const char *const *v, size_t n) { return v[below((uint32_t)n)]; }
#define PICK(v) pick(v, CAP_ARRAY_SIZE(v))

static void ws(struct cap_buf *b)
{
	static const char *const w[] = { "", "", "", "", " ", "\t", "\r", "  \r\t" };
	cat(b, PICK(w));
}

static void gen_int(struct cap_buf *b)
{
	static const char *const v[] = { "0", "-1", "1", "42", "2147483647", "-2147483648",
					 "9223372036854775807", "-9223372036854775808",
					 "9223372036854775808", "99999999999999999999999999", "-0",
					 "007", "1 2", "+1", "0x10" };
	if (below(2))
		cat(b, PICK(v));
	else {
		char s[24];
		snprintf(s, sizeof(s), "%" PRId32, (int32_t)step(&gen));
		cat(b, s);
	}
}

static void gen_string(struct cap_buf *b)
{
	static const char *const piece[] = { "a", "tools/call", "x y", "\\n", "\\\"", "\\\\", "\\/",
					     "\\u00e9", "\\u0000", "\\ud800", "\\udc00", "\\ud83d\\ude00",
					     "\xc3\xa9", "\xe2\x82\xac", "\xf0\x9f\x98\x80", "\xff", "\xc3",
					     "\xed\xa0\x80", "\x01", "\t", "\\x", "\\u12", "\"" };
	cat(b, "\"");
	for (int k = (int)below(6); k > 0; k--)
		cat(b, below(3) ? "m" : PICK(piece));
	cat(b, "\"");
}

static void gen_value(struct cap_buf *b, int depth);

static void gen_object(struct cap_buf *b, int depth)
{
	cat(b, "{");
	for (int k = (int)below(4), i = 0; i < k; i++) {
		if (i)
			cat(b, ",");
		ws(b);
		if (below(8))
			cat(b, below(2) ? "\"k\"" : "\"n\"");
		else
			gen_string(b);
		cat(b, ":");
		gen_value(b, depth + 1);
	}
	cat(b, "}");
}

static void gen_value(struct cap_buf *b, int depth)
{
	static const char *const lit[] = { "null", "true", "false", "1.5", "1e400", "-1e-400",
					   "0.0", "1E2", "2.", ".5", "NaN", "Infinity", "nul", "[", "}" };
	switch (below(depth > 3 ? 4 : 6)) {
	case 0: cat(b, PICK(lit)); break;
	case 1: gen_int(b); break;
	case 2: gen_string(b); break;
	case 3: cat(b, below(2) ? "{}" : "[]"); break;
	case 4:
		cat(b, "[");
		for (int k = (int)below(4), i = 0; i < k; i++) {
			if (i)
				cat(b, ",");
			gen_value(b, depth + 1);
		}
		cat(b, "]");
		break;
	default: gen_object(b, depth); break;
	}
}

static void gen_id(struct cap_buf *b)
{
	static const char *const odd[] = { "null", "1.0", "1e3", "-2.5", "[1]", "{}", "{\"a\":1}", "true", "\"\"" };
	switch (below(4)) {
	case 0: gen_int(b); break;
	case 1: gen_string(b); break;
	case 2: cat(b, PICK(odd)); break;
	default: {
		char s[16];
		snprintf(s, sizeof(s), "%u", below(1000));
		cat(b, s);
	}
	}
}

/* A message-shaped object: the members of a request, a notification or a
 * response, each sometimes missing, of the wrong type or duplicated, in
 * any order. */
static void gen_message(struct cap_buf *b)
{
	struct cap_buf mem[8];
	size_t k = 0;
	int kind = (int)below(4);	/* request, notification, result, error */
	static const char *const rpc[] = { "\"1.0\"", "2.0", "\"2.0 \"", "null", "\"2.00\"", "\"\"", "[\"2.0\"]" };
	static const char *const method[] = { "1", "null", "[]", "{}", "true", "\"\"" };
	static const char *const params[] = { "[]", "[1,2]", "\"p\"", "null", "3", "true" };

	for (size_t i = 0; i < CAP_ARRAY_SIZE(mem); i++)
		cap_buf_init(&mem[i]);
	if (below(10)) {
		cat(&mem[k], "\"jsonrpc\":");
		ws(&mem[k]);
		cat(&mem[k++], below(8) ? "\"2.0\"" : PICK(rpc));
	}
	if ((kind != 1 && below(10)) || (kind == 1 && !below(10))) {
		cat(&mem[k], "\"id\":");
		gen_id(&mem[k++]);
	}
	if (kind <= 1 || !below(10)) {
		cat(&mem[k], "\"method\":");
		if (below(8))
			gen_string(&mem[k++]);
		else
			cat(&mem[k++], PICK(method));
	}
	if ((kind <= 1 && below(3)) || !below(20)) {
		cat(&mem[k], "\"params\":");
		if (below(6))
			gen_object(&mem[k++], 1);
		else
			cat(&mem[k++], PICK(params));
	}
	if ((kind == 2 && below(10)) || !below(20)) {
		cat(&mem[k], "\"result\":");
		gen_value(&mem[k++], 1);
	}
	if ((kind == 3 && below(10)) || !below(20)) {
		cat(&mem[k], "\"error\":");
		if (below(6)) {
			cat(&mem[k], "{\"code\":");
			gen_int(&mem[k]);
			cat(&mem[k], ",\"message\":");
			gen_string(&mem[k]);
			cat(&mem[k++], "}");
		} else
			gen_value(&mem[k++], 1);
	}
	if (!below(10)) {
		cat(&mem[k], "\"extra\":");
		gen_value(&mem[k++], 1);
	}
	if (k > 0 && k < CAP_ARRAY_SIZE(mem) && !below(15)) {	/* a duplicate key */
		struct cap_buf *d = &mem[below((uint32_t)k)];
		cap_buf_append(&mem[k++], cap_buf_head(d), cap_buf_used(d));
	}
	for (size_t i = k; i > 1; i--) {	/* shuffle */
		size_t j = below((uint32_t)i);
		struct cap_buf t = mem[i - 1];
		mem[i - 1] = mem[j];
		mem[j] = t;
	}
	cat(b, "{");
	for (size_t i = 0; i < k; i++) {
		if (i)
			cat(b, ",");
		ws(b);
		cap_buf_append(b, cap_buf_head(&mem[i]), cap_buf_used(&mem[i]));
		ws(b);
	}
	cat(b, "}");
	for (size_t i = 0; i < CAP_ARRAY_SIZE(mem); i++)
		cap_buf_fini(&mem[i]);
}

/* Flip, insert, delete or cut bytes in b from offset from on. */
static void mutate(struct cap_buf *b, size_t from)
{
	static const char *const tok[] = { "\"id\":", "\"method\":", "{", "}", "[", "]", ",", ":",
					   "\"", "\\", "\n", "\r\n", "null", "\"2.0\"" };
	for (int k = 1 + (int)below(4); k > 0; k--) {
		size_t n = cap_buf_used(b) - from;
		uint8_t *p = b->owned_data + b->off + from;
		if (n == 0)
			return;
		size_t at = below((uint32_t)n);
		switch (below(5)) {
		case 0: p[at] = (uint8_t)step(&gen); break;
		case 1: p[at] ^= (uint8_t)(1u << below(8)); break;
		case 2: p[at] = below(2) ? '\0' : '\n'; break;
		case 3: b->len = b->off + from + at; break;	/* cut */
		default: {
			const char *t = PICK(tok);
			size_t tl = strlen(t);
			cap_buf_reserve(b, tl);
			p = b->owned_data + b->off + from;
			memmove(p + at + tl, p + at, n - at);
			memcpy(p + at, t, tl);
			b->len += tl;
		}
		}
	}
}

/* One line's worth of input (it may itself hold newlines). */
static void gen_line(struct cap_buf *b)
{
	size_t from = cap_buf_used(b);
	switch (below(16)) {
	case 8:	/* a batch */
		cat(b, "[");
		for (int k = (int)below(3), i = 0; i < k; i++) {
			if (i)
				cat(b, ",");
			gen_message(b);
		}
		cat(b, "]");
		break;
	case 9:
		gen_value(b, 0);
		break;
	case 10:	/* garbage, NULs included */
		for (int k = (int)below(64); k > 0; k--) {
			uint8_t c = (uint8_t)step(&gen);
			cap_buf_append(b, &c, 1);
		}
		break;
	case 11: {	/* deep nesting, past jansson's depth cap sometimes */
		size_t d = 1 + below(below(4) ? 100 : 3000);
		bool obj = below(2), inside = below(2);
		if (inside)
			cat(b, "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"m\",\"params\":{\"p\":");
		for (size_t i = 0; i < d; i++)
			cat(b, obj ? "{\"a\":" : "[");
		cat(b, "0");
		size_t close = below(8) ? d : below((uint32_t)d + 1);
		for (size_t i = 0; i < close; i++)
			cat(b, obj ? "}" : "]");
		if (inside)
			cat(b, "}}");
		break;
	}
	case 12: {
		static const char *const blank[] = { "", "\r", " ", "\r\r", "\t\r" };
		cat(b, PICK(blank));
		break;
	}
	case 13:
		gen_message(b);
		b->len = b->off + from + below((uint32_t)(cap_buf_used(b) - from) + 1);
		break;
	case 14:
	case 15:
		gen_message(b);
		mutate(b, from);
		break;
	default:
		gen_message(b);
	}
}

/* A line of exactly len bytes: a request padded to size inside a string
 * (kind 0) or with trailing blanks (1), both valid JSON, or brackets (2);
 * kind -1 picks one. */
static void big_line(struct cap_buf *b, size_t len, int kind)
{
	static const char head[] = "{\"jsonrpc\":\"2.0\",\"id\":7,\"method\":\"big\",\"params\":{\"s\":\"";
	static const char tail[] = "\"}}";
	size_t fixed = sizeof(head) - 1 + sizeof(tail) - 1;
	uint8_t *p = cap_buf_reserve(b, len);
	switch (kind < 0 ? (int)below(3) : kind) {
	case 0:
		memcpy(p, head, sizeof(head) - 1);
		memset(p + sizeof(head) - 1, 'x', len - fixed);
		memcpy(p + len - (sizeof(tail) - 1), tail, sizeof(tail) - 1);
		break;
	case 1:
		memcpy(p, head, sizeof(head) - 1);
		memcpy(p + sizeof(head) - 1, tail, sizeof(tail) - 1);
		memset(p + fixed, ' ', len - fixed);
		if (below(2))
			p[len - 1] = '\r';
		break;
	default:
		memset(p, '[', len);
	}
	cap_buf_commit(b, len);
}

/* Fixed streams around the limit, each cut several ways. */
static void prologue(void)
{
	static const char next[] = "{\"jsonrpc\":\"2.0\",\"id\":\"next\",\"method\":\"ping\"}\n";
	size_t nl = sizeof(next) - 1;
	for (size_t over = 0; over <= 2; over++) {
		size_t len = MAX + over;
		struct cap_buf s, want;
		cap_buf_init(&s);
		cap_buf_init(&want);
		big_line(&s, len, 0);
		cat(&s, "\n");
		cat(&s, next);
		size_t n = cap_buf_used(&s);
		cur_in = cap_buf_head(&s);
		cur_n = n;

		/* The model agrees with the rule, stated directly. */
		model(cap_buf_head(&s), n, MAX, &want);
		CHECK(ev_count(&want, 'T') == (over > 0) && ev_count(&want, 'L') == 1 + (over == 0),
		      "the model itself is wrong about a %zu-byte line", len);

		char name[96];
		const size_t cuts[][4] = {
			{ n },	/* whole */
			{ len, 1, nl },	/* the line, its newline, the next */
			{ len - 1, 1, 1 + nl },	/* the last byte with the newline */
			{ 1, len - 1, 1 + nl },
			{ MAX, n - MAX },	/* cut exactly at the limit */
			{ MAX + 1, n - MAX - 1 },
			{ len, 1 + nl },
			{ len + 1 + nl / 2, nl - nl / 2 },	/* the next line in two */
		};
		for (size_t c = 0; c < CAP_ARRAY_SIZE(cuts); c++) {
			size_t k = 0, sum = 0;
			while (k < 4 && cuts[c][k])
				sum += cuts[c][k++];
			if (sum != n)
				continue;	/* a cut that does not fit this length */
			snprintf(name, sizeof(name), "a %zu-byte line cut %s (way %zu)", len,
				 k == 1 ? "nowhere" : "in pieces", c);
			/* Parsing 4 MiB is slow under ASan: once per length. */
			parse_lines = c == 0;
			run(cap_buf_head(&s), n, MAX, cuts[c], k, name);
		}
		parse_lines = false;
		for (int i = 0; i < 4; i++) {
			cut = 0x5151 + (uint64_t)i;
			snprintf(name, sizeof(name), "a %zu-byte line in random pieces", len);
			run(cap_buf_head(&s), n, MAX, NULL, 0, name);
		}
		cap_buf_fini(&s);
		cap_buf_fini(&want);
	}
	parse_lines = true;

	/* Through cap_rpc_read on a socket: MAX, then MAX + 1, then a line. */
	struct cap_buf s, want;
	struct sink k = { .parse = true };
	cap_buf_init(&s);
	cap_buf_init(&want);
	cap_buf_init(&k.ev);
	big_line(&s, MAX, 1);
	cat(&s, "\n");
	big_line(&s, MAX + 1, 2);
	cat(&s, "\n");
	cat(&s, next);
	cur_in = cap_buf_head(&s);
	cur_n = cap_buf_used(&s);
	model(cap_buf_head(&s), cap_buf_used(&s), MAX, &want);
	int sv[2];
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0, "socketpair: %s", strerror(errno));
	pid_t pid = fork();
	CHECK(pid >= 0, "fork: %s", strerror(errno));
	if (pid == 0) {
		close(sv[0]);
		_exit(cap_write_all(sv[1], cap_buf_head(&s), cap_buf_used(&s)) < 0);
	}
	close(sv[1]);
	struct cap_rpc_reader r;
	cap_rpc_reader_init(&r);
	int rc;
	while ((rc = cap_rpc_read(&r, sv[0], on_line, on_too_long, &k)) == 1)
		;
	int st;
	waitpid(pid, &st, 0);
	CHECK(rc == 0, "cap_rpc_read returned %d at the end of the stream", rc);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "the writer failed");
	same_events(&k.ev, &want, "cap_rpc_read on a socket");
	CHECK(ev_count(&k.ev, 'L') == 2 && ev_count(&k.ev, 'T') == 1, "cap_rpc_read: wrong events");
	cap_rpc_reader_fini(&r);
	close(sv[0]);
	cap_buf_fini(&s);
	cap_buf_fini(&want);
	cap_buf_fini(&k.ev);
	cur_in = NULL;
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 8000;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : 0x9e3779b97f4a7c15ull;
	setvbuf(stdout, NULL, _IOLBF, 0);
	snprintf(again, sizeof(again), "%s %ld %#" PRIx64, argv[0], iters, seed);
	printf("1..2\n");

	test_no = 1;
	test_name = "the line limit: a line of CAP_RPC_LINE_MAX bytes is delivered, one byte more is refused once and the next line still arrives";
	prologue();
	printf("ok 1 - %s (whole, in pieces, through a socket)\n", test_name);

	test_no = 2;
	test_name = "generated streams through the reader, the parser and the encoders";
	gen = seed ? seed : 1;
	struct cap_buf s;
	cap_buf_init(&s);
	size_t big = 0;
	for (long i = 0; i < iters; i++) {
		cap_buf_consume(&s, cap_buf_used(&s));
		for (int k = 1 + (int)below(8); k > 0; k--) {
			/* Rarely a line at the limit: 4 MiB to parse. */
			if (!below(3000)) {
				big_line(&s, MAX - 1 + below(3), -1);
				big++;
			} else {
				gen_line(&s);
			}
			cat(&s, below(6) ? "\n" : below(2) ? "\r\n" : "\n\n");
		}
		if (!below(4))
			mutate(&s, 0);
		if (!below(10))	/* an unfinished last line */
			gen_line(&s);
		LLVMFuzzerTestOneInput(cap_buf_head(&s), cap_buf_used(&s));
	}
	cap_buf_fini(&s);
	printf("ok 2 - %ld streams from seed %#" PRIx64 ", %zu lines parsed and answered, %zu near the limit\n",
	       iters, seed, lines_parsed, big);
	return 0;
}
#endif
