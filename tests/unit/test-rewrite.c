/* Unit tests of the HTTP rewriter (rewrite.h): what an intercepted
 * request becomes upstream, what its response becomes for the guest. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "rewrite.h"
#include "util.h"

#define PH1 "capsule-ph-0123456789abcdef0123456789abcdef01234567"
#define VAL1 "tok-REAL-VALUE-1"
#define PH2 "capsule-ph-ffffffffffffffffffffffffffffffffffffffff"
#define VAL2 "other-SECRET-two"
#define PH3 "capsule-ph-3333333333333333333333333333333333333333"
#define VAL3 "body secret 3"	/* a blank: fine in a header, not in a target */

/* TOKEN applies (head only), OTHER does not (its host is elsewhere),
 * BODYTOK applies in the body too. */
static struct cap_http_secret secrets[3];

static int setup(void **state)
{
	(void)state;
	secrets[0] = (struct cap_http_secret){ "TOKEN", PH1, VAL1, strlen(VAL1), false, true };
	secrets[1] = (struct cap_http_secret){ "OTHER", PH2, VAL2, strlen(VAL2), false, false };
	secrets[2] = (struct cap_http_secret){ "BODYTOK", PH3, VAL3, strlen(VAL3), true, true };
	return 0;
}

/* ---- driving a request --------------------------------------------------- */

struct run {
	int rc;
	size_t used;	/* bytes of the input taken in all */
	char *out;	/* what went upstream, NUL added */
	size_t out_len;
	struct cap_http_refusal why;
	uint32_t substituted;
	char method[64], target[256];
};

static void run_free(struct run *x)
{
	free(x->out);
	x->out = NULL;
}

static char *take_out(struct cap_buf *b, size_t *len)
{
	*len = cap_buf_used(b);
	char *s = xmalloc(*len + 1);
	if (*len)
		memcpy(s, cap_buf_head(b), *len);
	s[*len] = '\0';
	return s;
}

/* Feed in[0..n) in pieces: cuts[] (ncuts offsets, ascending) where one
 * piece ends and the next begins; stop at the first answer that is not
 * MORE. */
static struct run feed_req_cuts(const char *host, uint16_t port, const struct cap_http_secret *s,
				unsigned ns, const char *in, size_t n, const size_t *cuts,
				size_t ncuts)
{
	struct run x = { 0 };
	struct cap_buf out;
	struct cap_http_req *r = cap_http_req_new(host, port, s, ns);
	size_t from = 0;

	cap_buf_init(&out);
	x.rc = CAP_HTTP_MORE;
	for (size_t c = 0; c <= ncuts && x.rc == CAP_HTTP_MORE; c++) {
		size_t to = c < ncuts ? cuts[c] : n, used = 0;
		x.rc = cap_http_req_feed(r, (const uint8_t *)in + from, to - from, &used, &out,
					 &x.why);
		if (x.rc == CAP_HTTP_MORE)
			assert_int_equal(used, to - from);
		else
			assert_true(used <= to - from);
		x.used += used;
		from = to;
	}
	x.out = take_out(&out, &x.out_len);
	x.substituted = cap_http_req_substituted(r);
	snprintf(x.method, sizeof(x.method), "%s", cap_http_req_method(r));
	snprintf(x.target, sizeof(x.target), "%s", cap_http_req_target(r));
	cap_buf_fini(&out);
	cap_http_req_free(r);
	return x;
}

/* The whole input at once, to api.test:443 with all three secrets. */
static struct run feed_req(const char *in)
{
	return feed_req_cuts("api.test", 443, secrets, 3, in, strlen(in), NULL, 0);
}

/* The input one byte per call. */
static struct run feed_req_bytes(const char *in)
{
	size_t n = strlen(in);
	size_t *cuts = xmalloc((n ? n : 1) * sizeof(*cuts));
	for (size_t i = 0; i < n; i++)
		cuts[i] = i + 1;
	struct run x = feed_req_cuts("api.test", 443, secrets, 3, in, n, cuts, n ? n - 1 : 0);
	free(cuts);
	return x;
}

/* The request is refused with status, for a reason saying why (when
 * given: words of it), and nothing went upstream. */
static void assert_refused_why(const char *in, int status, const char *why)
{
	struct run x = feed_req(in);
	if (x.rc != -1 || x.why.status != status)
		fail_msg("%s: rc %d status %d (%s), wanted %d", in, x.rc, x.why.status,
			 x.why.reason, status);
	assert_true(x.why.reason[0] != '\0');
	if (why && !strstr(x.why.reason, why))
		fail_msg("%s: reason \"%s\", wanted \"%s\"", in, x.why.reason, why);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
}

static void assert_refused(const char *in, int status)
{
	assert_refused_why(in, status, NULL);
}

static void assert_done(struct run *x, const char *want)
{
	if (x->rc != CAP_HTTP_DONE)
		fail_msg("rc %d status %d: %s", x->rc, x->why.status, x->why.reason);
	assert_string_equal(x->out, want);
}

/* ---- requests: substitution ---------------------------------------------- */

static void test_req_substitutes_line_and_header(void **state)
{
	(void)state;
	const char *in = "GET /v1/items?key=" PH1 "&x=1 HTTP/1.1\r\n"
			 "Host: api.test\r\n"
			 "Authorization: Bearer " PH1 "\r\n"
			 "User-Agent:curl/8.5.0   \r\n"
			 "\r\n";
	struct run x = feed_req(in);

	assert_done(&x, "GET /v1/items?key=" VAL1 "&x=1 HTTP/1.1\r\n"
			"Host: api.test\r\n"
			"Authorization: Bearer " VAL1 "\r\n"
			"User-Agent: curl/8.5.0\r\n"
			"Accept-Encoding: identity\r\n"
			"Connection: close\r\n\r\n");
	assert_int_equal(x.used, strlen(in));
	assert_int_equal(x.substituted, 1u << 0);
	/* The log sees what the guest sent, placeholders and all. */
	assert_string_equal(x.method, "GET");
	assert_string_equal(x.target, "/v1/items?key=" PH1 "&x=1");
	run_free(&x);
}

static void test_req_no_substitution_when_not_applying(void **state)
{
	(void)state;
	/* OTHER's host is not this connection's: its placeholder goes out as
	 * it came, wherever it is. */
	struct run x = feed_req("GET /?k=" PH2 " HTTP/1.1\r\n"
				"Host: api.test\r\n"
				"Authorization: Bearer " PH2 "\r\n"
				"Accept-Encoding: gzip, br\r\n"
				"\r\n");

	assert_done(&x, "GET /?k=" PH2 " HTTP/1.1\r\n"
			"Host: api.test\r\n"
			"Authorization: Bearer " PH2 "\r\n"
			"Accept-Encoding: identity\r\n"
			"Connection: close\r\n\r\n");
	assert_int_equal(x.substituted, 0);
	assert_null(strstr(x.out, VAL2));
	run_free(&x);

	/* The same request where nothing applies at all (TOKEN's placeholder
	 * to a connection none of its hosts is). */
	struct cap_http_secret s = secrets[0];
	s.applies = false;
	const char *in = "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: " PH1 "\r\n\r\n";
	x = feed_req_cuts("api.test", 443, &s, 1, in, strlen(in), NULL, 0);
	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\nAuthorization: " PH1
			"\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);
}

static void test_req_accept_encoding_identity(void **state)
{
	(void)state;
	/* Every Accept-Encoding becomes one "identity" when a value went in. */
	struct run x = feed_req("GET / HTTP/1.1\r\nAccept-Encoding: gzip\r\nHost: api.test\r\n"
				"X-Key: " PH1 "\r\naccept-encoding: br\r\n\r\n");
	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\nX-Key: " VAL1 "\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);

	/* Without any substitution too: a value stored by one request could
	 * come back compressed in another that carries no placeholder. */
	x = feed_req("GET / HTTP/1.1\r\nAccept-Encoding: gzip\r\nHost: api.test\r\n\r\n");
	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);
	/* Named by Connection, or absent: still exactly one. */
	x = feed_req("GET / HTTP/1.1\r\nConnection: accept-encoding\r\nHost: api.test\r\n"
		     "Accept-Encoding: br\r\n\r\n");
	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);
}

static void test_req_body_untouched_without_body(void **state)
{
	(void)state;
	/* TOKEN applies but not to bodies: the body streams as it came. */
	const char *in = "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: 55\r\n\r\n"
			 "t=" PH1 "&z";
	struct run x = feed_req(in);

	assert_done(&x, "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: 55\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\nt=" PH1 "&z");
	assert_int_equal(x.used, strlen(in));
	assert_int_equal(x.substituted, 0);
	run_free(&x);
}

static void test_req_body_substituted_length(void **state)
{
	(void)state;
	/* BODYTOK (body) is put in, TOKEN (head only) is not; the head waits
	 * for the body and gets its new length. */
	const char *body = "a=" PH3 "&b=" PH1;
	char in[512];
	snprintf(in, sizeof(in),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n"
		 "Accept-Encoding: gzip\r\n\r\n%s", strlen(body), body);
	const char *want_body = "a=" VAL3 "&b=" PH1;
	char want[512];
	snprintf(want, sizeof(want),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n"
		 "Accept-Encoding: identity\r\nConnection: close\r\n\r\n%s",
		 strlen(want_body), want_body);

	struct run x = feed_req(in);
	assert_done(&x, want);
	assert_int_equal(x.substituted, 1u << 2);
	run_free(&x);

	/* Nothing goes upstream before the whole body is in. */
	x = feed_req_cuts("api.test", 443, secrets, 3, in, strlen(in) - 1, NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_MORE);
	assert_int_equal(x.out_len, 0);
	run_free(&x);

	x = feed_req_bytes(in);
	assert_done(&x, want);
	run_free(&x);
}

static void test_req_body_substituted_chunked(void **state)
{
	(void)state;
	/* The placeholder split across two chunks (one with an extension),
	 * trailers after the last chunk: de-chunked, replaced, one length. */
	const char *in = "POST /p HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
			 "a\r\nx=capsule-\r\n"
			 "2B;ext=\"1\"\r\nph-3333333333333333333333333333333333333333\r\n"
			 "3\r\n&y=\r\n"
			 "0\r\nX-Trailer: " PH3 "\r\n\r\n";
	const char *want_body = "x=" VAL3 "&y=";
	char want[512];
	snprintf(want, sizeof(want),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n"
		 "Accept-Encoding: identity\r\nConnection: close\r\n\r\n%s",
		 strlen(want_body), want_body);

	struct run x = feed_req(in);
	assert_done(&x, want);
	assert_int_equal(x.used, strlen(in));
	assert_int_equal(x.substituted, 1u << 2);
	run_free(&x);

	x = feed_req_bytes(in);
	assert_done(&x, want);
	run_free(&x);
}

static void test_req_chunked_streams(void **state)
{
	(void)state;
	/* No body secret applies: chunks pass as canonical chunks (extension
	 * and trailers dropped), the placeholder in them untouched. */
	struct cap_http_secret s = secrets[0];
	const char *in = "POST /p HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: Chunked\r\n\r\n"
			 "5;a=b\r\nhello\r\n"
			 "0000006\r\n world\r\n"
			 "0\r\nX-T: 1\r\n\r\n";
	struct run x = feed_req_cuts("api.test", 443, &s, 1, in, strlen(in), NULL, 0);

	assert_done(&x, "POST /p HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n5\r\nhello\r\n6\r\n world\r\n0\r\n\r\n");
	run_free(&x);
}

/* ---- requests: splitting ---------------------------------------------- */

static const char *split_cases[] = {
	"GET /a?k=" PH1 " HTTP/1.1\r\nHost: api.test\r\nConnection: keep-alive\r\n"
	"Authorization: Bearer " PH1 "\r\n\r\n",
	"POST /b HTTP/1.1\r\nHost: api.test:443\r\nContent-Length: 107\r\n\r\n"
	"q=" PH3 "&r=" PH2,
	"PUT /c HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
	"4\r\nabcd\r\n33\r\n" PH3 "\r\n0\r\n\r\n",
};

static void test_req_split_bytewise(void **state)
{
	(void)state;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(split_cases); i++) {
		struct run whole = feed_req(split_cases[i]);
		struct run bytes = feed_req_bytes(split_cases[i]);
		if (whole.rc != CAP_HTTP_DONE)
			fail_msg("case %zu: %d %s", i, whole.rc, whole.why.reason);
		assert_int_equal(bytes.rc, CAP_HTTP_DONE);
		assert_int_equal(whole.used, strlen(split_cases[i]));
		assert_int_equal(bytes.used, whole.used);
		assert_int_equal(bytes.out_len, whole.out_len);
		assert_memory_equal(bytes.out, whole.out, whole.out_len);
		assert_int_equal(bytes.substituted, whole.substituted);
		run_free(&whole);
		run_free(&bytes);
	}
}

static void test_req_split_random(void **state)
{
	(void)state;
	srand(15);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(split_cases); i++) {
		const char *in = split_cases[i];
		size_t n = strlen(in);
		struct run whole = feed_req(in);
		for (int round = 0; round < 300; round++) {
			size_t cuts[8], ncuts = (size_t)(rand() % 8);
			for (size_t c = 0; c < ncuts; c++)
				cuts[c] = (size_t)rand() % (n + 1);
			/* ascending */
			for (size_t a = 0; a < ncuts; a++)
				for (size_t b = a + 1; b < ncuts; b++)
					if (cuts[b] < cuts[a]) {
						size_t t = cuts[a];
						cuts[a] = cuts[b];
						cuts[b] = t;
					}
			struct run x = feed_req_cuts("api.test", 443, secrets, 3, in, n, cuts, ncuts);
			assert_int_equal(x.rc, CAP_HTTP_DONE);
			assert_int_equal(x.used, n);
			assert_int_equal(x.out_len, whole.out_len);
			assert_memory_equal(x.out, whole.out, whole.out_len);
			run_free(&x);
		}
		run_free(&whole);
	}
}

/* ---- requests: connection headers and pipelining ----------------------- */

static size_t count(const char *hay, const char *needle)
{
	size_t n = 0;
	for (const char *p = hay; (p = strstr(p, needle)); p++)
		n++;
	return n;
}

static void test_req_connection_stripped(void **state)
{
	(void)state;
	struct run x = feed_req("GET / HTTP/1.1\r\n"
				"Connection: keep-alive, X-Hop\r\n"
				"Host: api.test\r\n"
				"connection: Upgrade\r\n"
				"Keep-Alive: timeout=5\r\n"
				"Proxy-Connection: keep-alive\r\n"
				"x-hop: 1\r\n"
				"Upgrade: h2c\r\n"
				"X-Kept: 2\r\n"
				"CONNECTION: close\r\n"
				"\r\n");

	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\nX-Kept: 2\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	assert_int_equal(count(x.out, "onnection"), 1);
	run_free(&x);

	/* Connection cannot take away Host or the framing. */
	x = feed_req("POST / HTTP/1.1\r\nHost: api.test\r\nConnection: Host, Content-Length\r\n"
		     "Content-Length: 2\r\n\r\nhi");
	assert_done(&x, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\nhi");
	run_free(&x);

	/* HTTP/1.0 too gets its one Connection: close. */
	x = feed_req("GET / HTTP/1.0\r\nHost: api.test\r\nConnection: keep-alive\r\n\r\n");
	assert_done(&x, "GET / HTTP/1.0\r\nHost: api.test\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);
}

static void test_req_pipelined_not_consumed(void **state)
{
	(void)state;
	const char *first = "GET /one HTTP/1.1\r\nHost: api.test\r\n\r\n";
	const char *second = "GET /two?k=" PH1 " HTTP/1.1\r\nHost: evil.test\r\n\r\n";
	char in[512];
	snprintf(in, sizeof(in), "%s%s", first, second);

	struct run x = feed_req(in);
	assert_done(&x, "GET /one HTTP/1.1\r\nHost: api.test\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\n");
	assert_int_equal(x.used, strlen(first));
	run_free(&x);

	/* With a body: it ends where its length says. */
	const char *post = "POST /one HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n\r\nabc";
	snprintf(in, sizeof(in), "%s%s", post, second);
	x = feed_req(in);
	assert_done(&x, "POST /one HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\nabc");
	assert_int_equal(x.used, strlen(post));
	run_free(&x);

	/* Chunked: it ends after the last chunk's empty line. */
	const char *chunked = "POST /one HTTP/1.1\r\nHost: api.test\r\n"
			      "Transfer-Encoding: chunked\r\n\r\n1\r\nz\r\n0\r\n\r\n";
	snprintf(in, sizeof(in), "%s%s", chunked, second);
	x = feed_req(in);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	assert_int_equal(x.used, strlen(chunked));
	assert_null(strstr(x.out, "/two"));
	run_free(&x);

	/* And later calls say DONE, taking nothing. */
	struct cap_http_req *r = cap_http_req_new("api.test", 443, secrets, 3);
	struct cap_buf out;
	struct cap_http_refusal why;
	size_t used;
	cap_buf_init(&out);
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)first, strlen(first), &used, &out,
					   &why), CAP_HTTP_DONE);
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)second, strlen(second), &used,
					   &out, &why), CAP_HTTP_DONE);
	assert_int_equal(used, 0);
	assert_int_equal(cap_http_req_eof(r, &why), CAP_HTTP_DONE);
	cap_buf_fini(&out);
	cap_http_req_free(r);
}

/* ---- requests: refusals -------------------------------------------------- */

/* A big input: prefix, then 'a' up to total bytes, then tail (which
 * ends within total), NUL added. Static: one at a time. */
static char *big_input(const char *prefix, size_t total, const char *tail)
{
	static char buf[CAP_HTTP_HEAD_MAX + 256];
	size_t p = strlen(prefix), t = strlen(tail);

	CAP_BUG_ON(total + 1 > sizeof(buf) || p + t > total);
	memcpy(buf, prefix, p);
	memset(buf + p, 'a', total - p - t);
	memcpy(buf + total - t, tail, t + 1);
	return buf;
}

static void test_req_head_too_large(void **state)
{
	(void)state;
	const char *in = big_input("GET / HTTP/1.1\r\nHost: api.test\r\nX-Big: ",
				   CAP_HTTP_HEAD_MAX + 100, "");
	assert_refused(in, 431);

	/* The same, byte by byte: refused at the limit, not later. */
	struct run x = feed_req_bytes(in);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 431);
	assert_int_equal(x.used, CAP_HTTP_HEAD_MAX);
	assert_int_equal(x.out_len, 0);
	run_free(&x);

	/* A head of exactly the limit is fine. */
	in = big_input("GET / HTTP/1.1\r\nHost: api.test\r\nX-Big: ", CAP_HTTP_HEAD_MAX,
		       "\r\n\r\n");
	x = feed_req(in);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	run_free(&x);
}

static void test_req_host(void **state)
{
	(void)state;
	assert_refused("GET / HTTP/1.1\r\nHost: evil.test\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test.evil\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nX-Host: api.test\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\nHost: api.test\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test:8443\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test:\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test:44x\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: \r\n\r\n", 421);
	assert_refused("GET https://evil.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 421);
	assert_refused("GET https://api.test:80/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 421);
	assert_refused("GET https://u@api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET http://api.test/ HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("CONNECT api.test:443 HTTP/1.1\r\nHost: api.test:443\r\n\r\n", 501);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test..\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: .api.test\r\n\r\n", 421);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test.:\r\n\r\n", 421);

	const char *ok[] = {
		"GET / HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: API.Test:443\r\n\r\n",
		"GET / HTTP/1.1\r\nhost:\tapi.test \r\n\r\n",
		"GET HTTPS://api.test/x?y HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"GET https://api.test HTTP/1.1\r\nHost: api.test\r\n\r\n",
		"OPTIONS * HTTP/1.1\r\nHost: api.test\r\n\r\n",
		/* The root's dot: the same name. */
		"GET / HTTP/1.1\r\nHost: api.test.\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: api.test.:443\r\n\r\n",
		"GET https://api.test./x HTTP/1.1\r\nHost: api.test\r\n\r\n",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(ok); i++) {
		struct run x = feed_req(ok[i]);
		if (x.rc != CAP_HTTP_DONE)
			fail_msg("%s: %d %s", ok[i], x.rc, x.why.reason);
		run_free(&x);
	}

	/* Another port: it must be named. */
	const char *in = "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n";
	struct run x = feed_req_cuts("api.test", 8443, secrets, 3, in, strlen(in), NULL, 0);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 421);
	run_free(&x);
	in = "GET / HTTP/1.1\r\nHost: api.test:8443\r\n\r\n";
	x = feed_req_cuts("api.test", 8443, secrets, 3, in, strlen(in), NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	run_free(&x);
}

static void test_req_framing_refused(void **state)
{
	(void)state;
	/* Smuggling shapes. */
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n"
		       "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n"
		       "Content-Length: 3\r\n\r\n0\r\n\r\n", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n"
		       "Content-Length: 4\r\n\r\nabcd", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3, 4\r\n\r\nabcd",
		       400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: +3\r\n\r\nabc", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: \r\n\r\n", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\n"
		       "Content-Length: 99999999999999999999\r\n\r\n", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked, chunked"
		       "\r\n\r\n0\r\n\r\n", 400);
	assert_refused("POST / HTTP/1.0\r\nHost: api.test\r\nTransfer-Encoding: chunked"
		       "\r\n\r\n0\r\n\r\n", 400);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip\r\n\r\n", 501);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: gzip, chunked"
		       "\r\n\r\n", 501);
	assert_refused("POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n"
		       "Transfer-Encoding: identity\r\n\r\n", 501);

	/* Equal lengths repeated are one length. */
	struct run x = feed_req("POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3, 3\r\n"
				"content-length: 3\r\n\r\nabc");
	assert_done(&x, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 3\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\nabc");
	run_free(&x);
}

/* A chunked body that goes wrong after its head went upstream: -1, and
 * what went up stops at the last good chunk. */
static void assert_bad_chunks(const char *chunks)
{
	char in[512];
	snprintf(in, sizeof(in), "POST / HTTP/1.1\r\nHost: api.test\r\n"
		 "Transfer-Encoding: chunked\r\n\r\n%s", chunks);
	struct run x = feed_req(in);
	if (x.rc != -1 || x.why.status != 400)
		fail_msg("%s: rc %d status %d", chunks, x.rc, x.why.status);
	assert_null(strstr(x.out, "0\r\n\r\n"));
	run_free(&x);

	/* Held (a body secret applies): nothing at all went up. */
	struct cap_http_secret s = secrets[2];
	x = feed_req_cuts("api.test", 443, &s, 1, in, strlen(in), NULL, 0);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 400);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
}

static void test_req_bad_chunks(void **state)
{
	(void)state;
	assert_bad_chunks("zz\r\nab\r\n0\r\n\r\n");
	assert_bad_chunks("\r\n");
	assert_bad_chunks("-1\r\nab\r\n0\r\n\r\n");
	assert_bad_chunks("0x2\r\nab\r\n0\r\n\r\n");
	assert_bad_chunks("2 \r\nab\r\n0\r\n\r\n");
	assert_bad_chunks("2\nab\r\n0\r\n\r\n");
	assert_bad_chunks("2\r\nabc\r\n0\r\n\r\n");
	assert_bad_chunks("2\r\nabXY0\r\n\r\n");
	assert_bad_chunks("2\r\nab\n0\r\n\r\n");
	assert_bad_chunks("2;a\x01\r\nab\r\n0\r\n\r\n");
	assert_bad_chunks("2\r\nab\r\n0\r\n\n");
	assert_bad_chunks("2\r\nab\r\n0\r\nX: 1\n\r\n");
	assert_bad_chunks("2\r\nab\r\n0\r\nX: \x7f\r\n\r\n");
	/* 17 hex digits: over 64 bits. */
	assert_bad_chunks("fffffffffffffffff\r\nab\r\n0\r\n\r\n");
	/* 16 are not an overflow but a size the guest will never send
	 * (streamed: no body secret). */
	struct cap_http_secret s = secrets[0];
	const char *in = "POST / HTTP/1.1\r\nHost: api.test\r\n"
			 "Transfer-Encoding: chunked\r\n\r\nffffffffffffffff\r\nab";
	struct run x = feed_req_cuts("api.test", 443, &s, 1, in, strlen(in), NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_MORE);
	assert_non_null(strstr(x.out, "\r\n\r\n2\r\nab\r\n"));
	run_free(&x);
}

static void test_req_malformed(void **state)
{
	(void)state;
	assert_refused("GET / HTTP/1.1\nHost: api.test\n\n", 400);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\n\r\n", 400);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\rX: 1\r\n\r\n", 400);
	assert_refused_why("GET / HTTP/1.1\r\nHost: api.test\r\nX-A: 1\r\n continued\r\n\r\n",
			   400, "folding");
	assert_refused_why("GET / HTTP/1.1\r\nHost: api.test\r\nX-A: 1\r\n\tcontinued\r\n\r\n",
			   400, "folding");
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\nX-A: a\x01" "b\r\n\r\n", 400);
	assert_refused_why("GET / HTTP/1.1\r\nHost: api.test\r\nX-A : 1\r\n\r\n", 400, "colon");
	assert_refused_why("GET / HTTP/1.1\r\nHost : api.test\r\n\r\n", 400, "colon");
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\nX(A): 1\r\n\r\n", 400);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\nNoColon\r\n\r\n", 400);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\n: empty\r\n\r\n", 400);
	assert_refused("GET / HTTP/1.1\r\nHost: api.test\r\nConnection: a b\r\n\r\n", 400);
	assert_refused("GET /a b HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET  / HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET /\x7f HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("G(T / HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET / HTTP/1.1 \r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET / http/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET /\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET x HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("\r\nGET / HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
	assert_refused("GET / HTTP/2.0\r\nHost: api.test\r\n\r\n", 505);
	assert_refused("GET / HTTP/1.2\r\nHost: api.test\r\n\r\n", 505);

	/* A NUL in a header (the input has a length, not a terminator). */
	const char in[] = "GET / HTTP/1.1\r\nHost: api.test\r\nX: a\0b\r\n\r\n";
	struct run x = feed_req_cuts("api.test", 443, secrets, 3, in, sizeof(in) - 1, NULL, 0);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 400);
	assert_int_equal(x.out_len, 0);
	run_free(&x);

	/* A bare LF is refused when it comes, not once the head is complete. */
	struct cap_http_req *r = cap_http_req_new("api.test", 443, secrets, 3);
	struct cap_buf out;
	struct cap_http_refusal why = { 0 };
	size_t used;
	cap_buf_init(&out);
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)"GET / HTTP/1.1\n", 15, &used,
					   &out, &why), -1);
	assert_int_equal(why.status, 400);
	/* And it stays refused. */
	memset(&why, 0, sizeof(why));
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)"\r\n", 2, &used, &out, &why), -1);
	assert_int_equal(why.status, 400);
	assert_int_equal(cap_http_req_eof(r, &why), -1);
	assert_int_equal(cap_buf_used(&out), 0);
	cap_buf_fini(&out);
	cap_http_req_free(r);
}

static void test_req_eof(void **state)
{
	(void)state;
	const char *parts[] = {
		"GET / HTTP/1.1\r\nHost: api.test\r\n",
		"POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n\r\nabc",
		"POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n",
		"",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(parts); i++) {
		struct cap_http_req *r = cap_http_req_new("api.test", 443, secrets, 3);
		struct cap_buf out;
		struct cap_http_refusal why = { 0 };
		size_t used;
		cap_buf_init(&out);
		assert_int_equal(cap_http_req_feed(r, (const uint8_t *)parts[i], strlen(parts[i]),
						   &used, &out, &why), CAP_HTTP_MORE);
		assert_int_equal(cap_http_req_eof(r, &why), -1);
		assert_int_equal(why.status, 400);
		cap_buf_fini(&out);
		cap_http_req_free(r);
	}
	cap_http_req_free(NULL);
}

/* Whether the head is still being read, for the caller's time limit. */
static void test_req_head_read(void **state)
{
	(void)state;
	struct cap_http_req *r = cap_http_req_new("api.test", 443, secrets, 3);
	struct cap_http_refusal why;
	struct cap_buf out;
	size_t used;
	const char *a = "POST / HTTP/1.1\r\nHost: api.test\r\n", *b = "Content-Length: 5\r\n\r\nab";

	cap_buf_init(&out);
	assert_false(cap_http_req_head_read(r));
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)a, strlen(a), &used, &out, &why),
			 CAP_HTTP_MORE);
	assert_false(cap_http_req_head_read(r));
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)b, strlen(b), &used, &out, &why),
			 CAP_HTTP_MORE);
	assert_true(cap_http_req_head_read(r));	/* the body is still to come */
	cap_buf_fini(&out);
	cap_http_req_free(r);

	/* Refused before its end: not read any more either. */
	r = cap_http_req_new("api.test", 443, secrets, 3);
	cap_buf_init(&out);
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)"GET / HTTP/1.1\n", 15, &used, &out,
					   &why), -1);
	assert_true(cap_http_req_head_read(r));
	cap_buf_fini(&out);
	cap_http_req_free(r);
}

static void test_req_body_too_large(void **state)
{
	(void)state;
	/* Stated up front: refused at once. */
	char in[256];
	snprintf(in, sizeof(in), "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n\r\n",
		 CAP_HTTP_BODY_MAX + 1);
	assert_refused(in, 413);

	/* Streamed (no body secret), the same length is fine. */
	struct cap_http_secret s = secrets[0];
	struct run x = feed_req_cuts("api.test", 443, &s, 1, in, strlen(in), NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_MORE);
	run_free(&x);

	/* Chunked: refused when the held body passes the limit. */
	struct cap_http_req *r = cap_http_req_new("api.test", 443, secrets, 3);
	struct cap_buf out;
	struct cap_http_refusal why;
	size_t used, sent = 0;
	const char *head = "POST / HTTP/1.1\r\nHost: api.test\r\nTransfer-Encoding: chunked\r\n\r\n"
			   "fffffff\r\n";
	cap_buf_init(&out);
	assert_int_equal(cap_http_req_feed(r, (const uint8_t *)head, strlen(head), &used, &out,
					   &why), CAP_HTTP_MORE);
	uint8_t *block = xcalloc(1, 65536);
	int rc;
	while ((rc = cap_http_req_feed(r, block, 65536, &used, &out, &why)) == CAP_HTTP_MORE)
		sent += 65536;
	assert_int_equal(rc, -1);
	assert_int_equal(why.status, 413);
	assert_true(sent <= CAP_HTTP_BODY_MAX && sent + 65536 > CAP_HTTP_BODY_MAX);
	assert_int_equal(cap_buf_used(&out), 0);
	free(block);
	cap_buf_fini(&out);
	cap_http_req_free(r);
}

/* A placeholder (51 bytes) may stand for a value of up to 8192: what is
 * built upstream is bounded as what the guest sends is, before anything
 * is built. */
static void test_req_output_bounded(void **state)
{
	(void)state;
	char *big = xmalloc(8193);
	memset(big, 'v', 8192);
	big[8192] = '\0';
	struct cap_http_secret s = { "BIG", PH1, big, 8192, true, true };
	const size_t ph = strlen(PH1);

	/* A head of 5 placeholders: 40 KiB with the values in, 431. */
	char head[1024];
	snprintf(head, sizeof(head), "GET / HTTP/1.1\r\nHost: api.test\r\nX-K: %s %s %s %s %s\r\n\r\n",
		 PH1, PH1, PH1, PH1, PH1);
	struct run x = feed_req_cuts("api.test", 443, &s, 1, head, strlen(head), NULL, 0);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 431);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
	/* Three fit (24 KiB). */
	snprintf(head, sizeof(head), "GET / HTTP/1.1\r\nHost: api.test\r\nX-K: %s %s %s\r\n\r\n",
		 PH1, PH1, PH1);
	x = feed_req_cuts("api.test", 443, &s, 1, head, strlen(head), NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	assert_true(x.out_len > 3 * 8192);
	run_free(&x);

	/* A held body of 1100 placeholders (56 KiB sent) would be 8.6 MiB:
	 * 413, nothing built. */
	size_t n = 1100, blen = n * ph;
	char *in = xmalloc(blen + 256);
	int hl = snprintf(in, 256, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n\r\n",
			  blen);
	for (size_t i = 0; i < n; i++)
		memcpy(in + (size_t)hl + i * ph, PH1, ph);
	x = feed_req_cuts("api.test", 443, &s, 1, in, (size_t)hl + blen, NULL, 0);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 413);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
	/* 1000 of them (7.8 MiB with the values in) go. */
	n = 1000;
	blen = n * ph;
	hl = snprintf(in, 256, "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n\r\n",
		      blen);
	for (size_t i = 0; i < n; i++)
		memcpy(in + (size_t)hl + i * ph, PH1, ph);
	x = feed_req_cuts("api.test", 443, &s, 1, in, (size_t)hl + blen, NULL, 0);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	assert_true(x.out_len > n * 8192 && x.out_len < n * 8192 + 200);
	run_free(&x);
	free(in);
	free(big);
}

static void test_req_value_must_fit(void **state)
{
	(void)state;
	/* VAL3 has a blank: fine in a header, never in the request line. */
	struct run x = feed_req("GET / HTTP/1.1\r\nHost: api.test\r\nX-K: " PH3 "\r\n\r\n");
	assert_done(&x, "GET / HTTP/1.1\r\nHost: api.test\r\nX-K: " VAL3 "\r\n"
			"Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	run_free(&x);
	assert_refused("GET /?k=" PH3 " HTTP/1.1\r\nHost: api.test\r\n\r\n", 400);
}

/* ---- requests: Expect: 100-continue --------------------------------------- */

/* One request fed in parts (NULL-terminated) to api.test with secrets
 * s[0..ns): after each part, the feed's result and whether the guest is
 * owed a 100 are checked against rcs[] and conts[]; what went upstream
 * is returned (the caller frees). */
static char *feed_continue(const struct cap_http_secret *s, unsigned ns, const char *const *parts,
			   const int *rcs, const bool *conts)
{
	struct cap_http_req *r = cap_http_req_new("api.test", 443, s, ns);
	struct cap_buf out;
	struct cap_http_refusal why;
	size_t len;

	cap_buf_init(&out);
	assert_false(cap_http_req_continue(r));
	for (size_t i = 0; parts[i]; i++) {
		size_t used;
		int rc = cap_http_req_feed(r, (const uint8_t *)parts[i], strlen(parts[i]), &used,
					   &out, &why);
		if (rc != rcs[i] || cap_http_req_continue(r) != conts[i])
			fail_msg("part %zu: rc %d (%s), continue %d; wanted rc %d, continue %d", i,
				 rc, rc < 0 ? why.reason : "", cap_http_req_continue(r), rcs[i],
				 conts[i]);
	}
	char *o = take_out(&out, &len);
	cap_buf_fini(&out);
	cap_http_req_free(r);
	return o;
}

static void test_req_expect_continue_held(void **state)
{
	(void)state;
	/* BODYTOK applies to the body: the head is held with it, so the 100
	 * is owed once the head is in and until the body is; Expect does
	 * not go upstream (the server sees head and body at once). */
	const char *body = "a=" PH3;
	char head[256], want[512];
	snprintf(head, sizeof(head),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		 "Content-Length: %zu\r\n\r", strlen(body));
	snprintf(want, sizeof(want),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: %zu\r\n"
		 "Accept-Encoding: identity\r\nConnection: close\r\n\r\na=" VAL3,
		 strlen("a=" VAL3));
	const char *parts[] = { head, "\n", "a=", body + 2, NULL };
	const int rcs[] = { CAP_HTTP_MORE, CAP_HTTP_MORE, CAP_HTTP_MORE, CAP_HTTP_DONE };
	const bool conts[] = { false, true, true, false };
	char *o = feed_continue(secrets, 3, parts, rcs, conts);
	assert_string_equal(o, want);
	free(o);

	/* Chunked, the expectation in another case: owed until the last chunk. */
	const char *cparts[] = {
		"POST /p HTTP/1.1\r\nHost: api.test\r\nEXPECT:  100-Continue \r\n"
		"Transfer-Encoding: chunked\r\n\r\n",
		"2\r\nab\r\n", "0\r\n\r\n", NULL
	};
	const int crcs[] = { CAP_HTTP_MORE, CAP_HTTP_MORE, CAP_HTTP_DONE };
	const bool cconts[] = { true, true, false };
	o = feed_continue(secrets, 3, cparts, crcs, cconts);
	assert_string_equal(o, "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: 2\r\n"
			       "Accept-Encoding: identity\r\nConnection: close\r\n\r\nab");
	free(o);

	/* The head and the whole body in one feed: nothing is owed any more. */
	snprintf(head, sizeof(head),
		 "POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		 "Content-Length: 2\r\n\r\nab");
	const char *oparts[] = { head, NULL };
	const int orcs[] = { CAP_HTTP_DONE };
	const bool oconts[] = { false };
	o = feed_continue(secrets, 3, oparts, orcs, oconts);
	assert_null(strcasestr(o, "expect"));
	free(o);

	/* An empty body: no body to wait for. */
	const char *eparts[] = {
		"POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		"Content-Length: 0\r\n\r\n", NULL
	};
	o = feed_continue(secrets, 3, eparts, orcs, oconts);
	assert_string_equal(o, "POST /p HTTP/1.1\r\nHost: api.test\r\nContent-Length: 0\r\n"
			       "Accept-Encoding: identity\r\nConnection: close\r\n\r\n");
	free(o);

	/* HTTP/1.0: no 100 is owed to it (RFC 9110 10.1.1); Expect still
	 * does not go on with a held body. */
	const char *tparts[] = {
		"POST /p HTTP/1.0\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		"Content-Length: 2\r\n\r\n", "ab", NULL
	};
	const int trcs[] = { CAP_HTTP_MORE, CAP_HTTP_DONE };
	const bool tconts[] = { false, false };
	o = feed_continue(secrets, 3, tparts, trcs, tconts);
	assert_string_equal(o, "POST /p HTTP/1.0\r\nHost: api.test\r\nContent-Length: 2\r\n"
			       "Accept-Encoding: identity\r\nConnection: close\r\n\r\nab");
	free(o);

	/* Refused after its head: nothing owed. */
	const char *rparts[] = {
		"POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		"Transfer-Encoding: chunked\r\n\r\n", "zz\r\n", NULL
	};
	const int rrcs[] = { CAP_HTTP_MORE, -1 };
	const bool rconts[] = { true, false };
	o = feed_continue(secrets, 3, rparts, rrcs, rconts);
	assert_string_equal(o, "");
	free(o);

	/* An expectation that is not 100-continue goes on (the server may
	 * refuse it with 417), and owes nothing. */
	const char *xparts[] = {
		"POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: something-else\r\n"
		"Content-Length: 2\r\n\r\n", "ab", NULL
	};
	const bool xconts[] = { false, false };
	o = feed_continue(secrets, 3, xparts, trcs, xconts);
	assert_string_equal(o, "POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: something-else\r\n"
			       "Content-Length: 2\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\nab");
	free(o);
}

static struct run feed_resp(const char *in, bool eof);

static void test_req_expect_continue_streamed(void **state)
{
	(void)state;
	/* No body secret: the head goes at once with its Expect, the server
	 * answers the expectation itself, nothing is owed by the caller. */
	struct cap_http_secret s = secrets[0];
	const char *parts[] = {
		"POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
		"Content-Length: 2\r\n\r\n", "ab", NULL
	};
	const int rcs[] = { CAP_HTTP_MORE, CAP_HTTP_DONE };
	const bool conts[] = { false, false };
	char *o = feed_continue(&s, 1, parts, rcs, conts);
	assert_string_equal(o, "POST /p HTTP/1.1\r\nHost: api.test\r\nExpect: 100-continue\r\n"
			       "Content-Length: 2\r\nAccept-Encoding: identity\r\nConnection: close\r\n\r\nab");
	free(o);

	/* The server's 100 reaches the guest before the final response. */
	struct run x = feed_resp("HTTP/1.1 100 Continue\r\n\r\n"
				 "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok", false);
	assert_done(&x, "HTTP/1.1 100 Continue\r\n\r\n"
			"HTTP/1.1 201 Created\r\nConnection: close\r\n\r\nok");
	run_free(&x);
}

/* ---- responses ------------------------------------------------------------ */

static struct run feed_resp_cuts(const char *in, size_t n, const size_t *cuts, size_t ncuts,
				 bool head_request, bool eof)
{
	struct run x = { 0 };
	struct cap_buf out;
	struct cap_http_resp *r = cap_http_resp_new(secrets, 3, head_request);
	size_t from = 0;

	cap_buf_init(&out);
	x.rc = CAP_HTTP_MORE;
	for (size_t c = 0; c <= ncuts && x.rc == CAP_HTTP_MORE; c++) {
		size_t to = c < ncuts ? cuts[c] : n;
		x.rc = cap_http_resp_feed(r, (const uint8_t *)in + from, to - from, &out, &x.why);
		from = to;
	}
	if (eof && x.rc == CAP_HTTP_MORE)
		x.rc = cap_http_resp_eof(r, &out, &x.why);
	x.out = take_out(&out, &x.out_len);
	x.substituted = cap_http_resp_echoed_mask(r);
	x.used = (size_t)cap_http_resp_status(r);	/* the status, here */
	cap_buf_fini(&out);
	cap_http_resp_free(r);
	return x;
}

static struct run feed_resp(const char *in, bool eof)
{
	return feed_resp_cuts(in, strlen(in), NULL, 0, false, eof);
}

static struct run feed_resp_bytes(const char *in, bool eof)
{
	size_t n = strlen(in);
	size_t *cuts = xmalloc((n ? n : 1) * sizeof(*cuts));
	for (size_t i = 0; i < n; i++)
		cuts[i] = i + 1;
	struct run x = feed_resp_cuts(in, n, cuts, n ? n - 1 : 0, false, eof);
	free(cuts);
	return x;
}

static void test_resp_echo_replaced(void **state)
{
	(void)state;
	/* Every secret's value, whichever its host, in head and body. */
	const char *in = "HTTP/1.1 200 OK\r\n"
			 "X-Echo: Bearer " VAL1 "\r\n"
			 "Content-Length: 47\r\n"
			 "Connection: keep-alive\r\n"
			 "Keep-Alive: timeout=5\r\n"
			 "\r\n"
			 "{\"a\":\"" VAL1 "\",\"b\":\"" VAL2 "\"}";
	const char *want = "HTTP/1.1 200 OK\r\n"
			   "X-Echo: Bearer " PH1 "\r\n"
			   "Connection: close\r\n\r\n"
			   "{\"a\":\"" PH1 "\",\"b\":\"" PH2 "\"}";
	struct run x = feed_resp(in, false);

	assert_int_equal(strlen("{\"a\":\"" VAL1 "\",\"b\":\"" VAL2 "\"}"), 47);
	assert_done(&x, want);
	assert_int_equal(x.substituted, 1u << 0 | 1u << 1);
	assert_int_equal(x.used, 200);
	run_free(&x);

	x = feed_resp_bytes(in, false);
	assert_done(&x, want);
	run_free(&x);

	/* No echo: nothing replaced, no secret named. */
	x = feed_resp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok", false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nok");
	assert_int_equal(x.substituted, 0);
	run_free(&x);
}

static void test_resp_echo_split(void **state)
{
	(void)state;
	/* The value cut at every place between two feeds. */
	const char *head = "HTTP/1.1 200 OK\r\n\r\n";
	char in[256], want[256];
	snprintf(in, sizeof(in), "%sx=%s;y=%s", head, VAL1, VAL1);
	snprintf(want, sizeof(want), "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nx=%s;y=%s",
		 PH1, PH1);
	for (size_t cut = strlen(head); cut <= strlen(in); cut++) {
		struct run x = feed_resp_cuts(in, strlen(in), &cut, 1, false, true);
		assert_done(&x, want);
		run_free(&x);
	}

	/* What could still become a value is held back until it cannot. */
	struct cap_http_resp *r = cap_http_resp_new(secrets, 3, false);
	struct cap_buf out;
	struct cap_http_refusal why;
	cap_buf_init(&out);
	snprintf(in, sizeof(in), "%sabc%.8s", head, VAL1);
	assert_int_equal(cap_http_resp_feed(r, (const uint8_t *)in, strlen(in), &out, &why),
			 CAP_HTTP_MORE);
	/* None of the 8 bytes held back is out yet, nor any byte of them:
	 * what is out is a prefix of the head and "abc". */
	const char *sofar = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc";
	assert_true(cap_buf_used(&out) <= strlen(sofar));
	assert_memory_equal(cap_buf_head(&out), sofar, cap_buf_used(&out));
	const char *rest = &VAL1[8];
	assert_int_equal(cap_http_resp_feed(r, (const uint8_t *)rest, strlen(rest), &out, &why),
			 CAP_HTTP_MORE);
	assert_int_equal(cap_http_resp_eof(r, &out, &why), CAP_HTTP_DONE);
	size_t len;
	char *s = take_out(&out, &len);
	assert_string_equal(s, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc" PH1);
	free(s);
	cap_buf_fini(&out);
	cap_http_resp_free(r);
}

static void test_resp_echoed_mask(void **state)
{
	(void)state;
	/* Exactly the secrets whose value was replaced: not those whose
	 * placeholder the response holds as it is, whichever host a secret
	 * is for (OTHER does not apply here, its value is still scrubbed). */
	struct run x = feed_resp("HTTP/1.1 200 OK\r\nX-A: " PH1 "\r\nContent-Length: 16\r\n\r\n"
				 VAL2, false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nX-A: " PH1 "\r\nConnection: close\r\n\r\n" PH2);
	assert_int_equal(x.substituted, 1u << 1);
	run_free(&x);

	/* In the head only; in an interim response's head. */
	x = feed_resp("HTTP/1.1 200 OK\r\nX-B: " VAL3 "\r\nContent-Length: 0\r\n\r\n", false);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	assert_int_equal(x.substituted, 1u << 2);
	run_free(&x);
	x = feed_resp("HTTP/1.1 103 Early Hints\r\nLink: " VAL1 "\r\n\r\n"
		      "HTTP/1.1 204 No Content\r\n\r\n", false);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	assert_int_equal(x.substituted, 1u << 0);
	run_free(&x);

	/* Gathered over feeds: one byte at a time, a body that ends with the
	 * connection, the last value right at its end. */
	const char *in = "HTTP/1.1 200 OK\r\n\r\n" VAL3 " then " VAL1;
	x = feed_resp_bytes(in, true);
	assert_done(&x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n" PH3 " then " PH1);
	assert_int_equal(x.substituted, 1u << 0 | 1u << 2);
	run_free(&x);

	/* What is seen after the first feed adds to what was: the mask only
	 * grows, and is there before the end. */
	struct cap_http_resp *r = cap_http_resp_new(secrets, 3, false);
	struct cap_buf out;
	struct cap_http_refusal why;
	cap_buf_init(&out);
	assert_int_equal(cap_http_resp_echoed_mask(r), 0);
	const char *a = "HTTP/1.1 200 OK\r\nX: " VAL2 "\r\n\r\n";
	assert_int_equal(cap_http_resp_feed(r, (const uint8_t *)a, strlen(a), &out, &why),
			 CAP_HTTP_MORE);
	assert_int_equal(cap_http_resp_echoed_mask(r), 1u << 1);
	const char *b = VAL1 "..............................................................";
	assert_int_equal(cap_http_resp_feed(r, (const uint8_t *)b, strlen(b), &out, &why),
			 CAP_HTTP_MORE);
	assert_int_equal(cap_http_resp_echoed_mask(r), 1u << 0 | 1u << 1);
	assert_int_equal(cap_http_resp_eof(r, &out, &why), CAP_HTTP_DONE);
	assert_int_equal(cap_http_resp_echoed_mask(r), 1u << 0 | 1u << 1);
	cap_buf_fini(&out);
	cap_http_resp_free(r);
}

static void test_resp_chunked(void **state)
{
	(void)state;
	/* The value cut across two chunks, then trailers: de-chunked, the
	 * end of the body is the end of the connection. */
	const char *in = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
			 "7\r\nv=tok-R\r\n"
			 "b;x=y\r\nEAL-VALUE-1\r\n"
			 "2\r\n!!\r\n"
			 "0\r\nX-T: " VAL1 "\r\n\r\n"
			 "ignored after the end";
	const char *want = "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nv=" PH1 "!!";
	struct run x = feed_resp(in, false);
	assert_done(&x, want);
	assert_int_equal(x.substituted, 1u << 0);
	run_free(&x);
	x = feed_resp_bytes(in, false);
	assert_done(&x, want);
	run_free(&x);

	/* A bad chunk: 502. */
	x = feed_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nq\r\n", false);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	run_free(&x);

	/* Cut short: 502 at the end, and the held tail never goes. */
	x = feed_resp("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
		      "6\r\ntok-RE\r\n", true);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_null(strstr(x.out, "tok-"));
	run_free(&x);
}

static void test_resp_interim(void **state)
{
	(void)state;
	const char *in = "HTTP/1.1 100 Continue\r\n\r\n"
			 "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
			 "HTTP/1.1 201 Created\r\nContent-Length: 2\r\n\r\nok";
	const char *want = "HTTP/1.1 100 Continue\r\n\r\n"
			   "HTTP/1.1 103 Early Hints\r\nLink: </s.css>\r\n\r\n"
			   "HTTP/1.1 201 Created\r\nConnection: close\r\n\r\nok";
	struct run x = feed_resp(in, false);
	assert_done(&x, want);
	assert_int_equal(x.used, 201);
	run_free(&x);
	x = feed_resp_bytes(in, false);
	assert_done(&x, want);
	run_free(&x);

	/* Only the interim so far: it has gone, the status is not known. */
	x = feed_resp("HTTP/1.1 100 Continue\r\n\r\n", false);
	assert_int_equal(x.rc, CAP_HTTP_MORE);
	assert_string_equal(x.out, "HTTP/1.1 100 Continue\r\n\r\n");
	assert_int_equal(x.used, 0);
	run_free(&x);

	/* 101 was never asked for. */
	x = feed_resp("HTTP/1.1 101 Switching Protocols\r\nUpgrade: h2c\r\n\r\n", false);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
}

static void test_resp_bodiless(void **state)
{
	(void)state;
	/* HEAD and 304 keep their Content-Length: it is the representation's
	 * (no body follows, so nothing is close-delimited). */
	const char *in = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789";
	struct run x = feed_resp_cuts(in, strlen(in), NULL, 0, true, false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nContent-Length: 10\r\nConnection: close\r\n\r\n");
	run_free(&x);
	in = "HTTP/1.1 200 OK\r\nContent-Length: 7, 7\r\nX-A: b\r\n\r\n";
	x = feed_resp_cuts(in, strlen(in), NULL, 0, true, false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nX-A: b\r\nContent-Length: 7\r\nConnection: close\r\n\r\n");
	run_free(&x);
	in = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n";
	x = feed_resp_cuts(in, strlen(in), NULL, 0, true, false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
	run_free(&x);
	x = feed_resp("HTTP/1.1 304 Not Modified\r\nContent-Length: 42\r\n\r\n", false);
	assert_done(&x, "HTTP/1.1 304 Not Modified\r\nContent-Length: 42\r\nConnection: close\r\n\r\n");
	run_free(&x);
	/* A 204 has none (RFC 9110 8.6). */
	x = feed_resp("HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", false);
	assert_done(&x, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
	run_free(&x);

	x = feed_resp("HTTP/1.1 204 No Content\r\n\r\nstray", false);
	assert_done(&x, "HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n");
	run_free(&x);

	x = feed_resp("HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\n\r\n", false);
	assert_done(&x, "HTTP/1.1 304 Not Modified\r\nETag: \"x\"\r\nConnection: close\r\n\r\n");
	run_free(&x);

	x = feed_resp("HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n", false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n");
	run_free(&x);
}

static void test_resp_length_and_eof(void **state)
{
	(void)state;
	/* Cut short of its length: -1 at the end, the held tail dropped. */
	struct run x = feed_resp("HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nabc tok-RE", true);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_null(strstr(x.out, "tok-"));
	run_free(&x);

	/* No length: the body ends with the connection, the tail flushed. */
	x = feed_resp("HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nall of it", false);
	assert_int_equal(x.rc, CAP_HTTP_MORE);
	run_free(&x);
	x = feed_resp("HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nall of it", true);
	assert_done(&x, "HTTP/1.0 200 OK\r\nConnection: close\r\n\r\nall of it");
	run_free(&x);

	/* Bytes after the length are not the response's. */
	x = feed_resp("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\nabcHTTP/1.1 200 OK\r\n", false);
	assert_done(&x, "HTTP/1.1 200 OK\r\nConnection: close\r\n\r\nabc");
	run_free(&x);

	/* No head at all. */
	x = feed_resp("HTTP/1.1 200 OK\r\n", true);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_int_equal(x.out_len, 0);
	run_free(&x);
}

/* An encoded body could hide an echoed value: refused, whatever the
 * request said (it asked for identity). */
static void test_resp_content_encoding(void **state)
{
	(void)state;
	struct run x = feed_resp("HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
				 "Content-Length: 3\r\n\r\nabc", false);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_string_equal(x.why.reason, "the server encoded its response (Content-Encoding: gzip) "
					  "despite Accept-Encoding: identity: an echoed value could "
					  "not be replaced");
	assert_int_equal(x.out_len, 0);
	run_free(&x);

	x = feed_resp("HTTP/1.1 200 OK\r\ncontent-encoding: identity, BR\r\n\r\nabc", true);
	assert_int_equal(x.rc, -1);
	assert_non_null(strstr(x.why.reason, "(Content-Encoding: BR)"));
	run_free(&x);
	x = feed_resp("HTTP/1.1 200 OK\r\nContent-Encoding: identity\r\n"
		      "Content-Encoding: x\"y\r\n\r\nabc", true);
	assert_int_equal(x.rc, -1);
	assert_non_null(strstr(x.why.reason, "(Content-Encoding: \"x\\\"y\")"));
	run_free(&x);

	/* identity is no encoding; an interim response's fields do not count. */
	x = feed_resp("HTTP/1.1 103 Early Hints\r\nContent-Encoding: gzip\r\n\r\n"
		      "HTTP/1.1 200 OK\r\nContent-Encoding: Identity\r\nContent-Length: 3\r\n\r\nabc",
		      false);
	assert_done(&x, "HTTP/1.1 103 Early Hints\r\nContent-Encoding: gzip\r\n\r\n"
			"HTTP/1.1 200 OK\r\nContent-Encoding: Identity\r\nConnection: close\r\n\r\nabc");
	run_free(&x);
	/* Nothing encoded reaches the guest without a body. */
	x = feed_resp("HTTP/1.1 304 Not Modified\r\nContent-Encoding: gzip\r\n\r\n", false);
	assert_int_equal(x.rc, CAP_HTTP_DONE);
	run_free(&x);
}

static void test_resp_malformed(void **state)
{
	(void)state;
	const char *bad[] = {
		"HTTP/1.1 200 OK\nContent-Length: 0\n\n",
		"HTTP/2 200 OK\r\n\r\n",
		"HTTP/1.1 20 OK\r\n\r\n",
		"HTTP/1.1 099 Low\r\n\r\n",
		"HTTP/1.1 200OK\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX : 1\r\n\r\n",
		"HTTP/1.1 200 OK\r\nX: 1\r\n folded\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
		"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
		"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		struct run x = feed_resp(bad[i], false);
		if (x.rc != -1 || x.why.status != 502)
			fail_msg("%s: rc %d status %d", bad[i], x.rc, x.why.status);
		assert_int_equal(x.out_len, 0);
		run_free(&x);
	}

	/* An oversized head. */
	const char *in = big_input("HTTP/1.1 200 OK\r\nX: ", CAP_HTTP_HEAD_MAX + 63, "");
	struct run x = feed_resp(in, false);
	assert_int_equal(x.rc, -1);
	assert_int_equal(x.why.status, 502);
	assert_int_equal(x.out_len, 0);
	run_free(&x);

	/* "HTTP/1.1 200" without a reason is common and fine. */
	x = feed_resp("HTTP/1.1 200\r\nContent-Length: 0\r\n\r\n", false);
	assert_done(&x, "HTTP/1.1 200\r\nConnection: close\r\n\r\n");
	run_free(&x);
	cap_http_resp_free(NULL);
}

static void test_resp_split_random(void **state)
{
	(void)state;
	const char *in = "HTTP/1.1 100 Continue\r\n\r\n"
			 "HTTP/1.1 200 OK\r\nSet-Cookie: t=" VAL2 "\r\nTransfer-Encoding: chunked\r\n\r\n"
			 "5\r\nother\r\n"
			 "1c\r\n-SECRET-two " VAL1 "\r\n"
			 "3\r\ntok\r\n"
			 "0\r\n\r\n";
	size_t n = strlen(in);
	struct run whole = feed_resp(in, false);
	assert_done(&whole, "HTTP/1.1 100 Continue\r\n\r\n"
			    "HTTP/1.1 200 OK\r\nSet-Cookie: t=" PH2 "\r\nConnection: close\r\n\r\n"
			    PH2 " " PH1 "tok");

	srand(3);
	for (int round = 0; round < 500; round++) {
		size_t cuts[10], ncuts = (size_t)(rand() % 10);
		for (size_t c = 0; c < ncuts; c++)
			cuts[c] = (size_t)rand() % (n + 1);
		for (size_t a = 0; a < ncuts; a++)
			for (size_t b = a + 1; b < ncuts; b++)
				if (cuts[b] < cuts[a]) {
					size_t t = cuts[a];
					cuts[a] = cuts[b];
					cuts[b] = t;
				}
		struct run x = feed_resp_cuts(in, n, cuts, ncuts, false, false);
		assert_int_equal(x.rc, CAP_HTTP_DONE);
		assert_int_equal(x.out_len, whole.out_len);
		assert_memory_equal(x.out, whole.out, whole.out_len);
		run_free(&x);
	}
	run_free(&whole);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_req_substitutes_line_and_header),
		cmocka_unit_test(test_req_no_substitution_when_not_applying),
		cmocka_unit_test(test_req_accept_encoding_identity),
		cmocka_unit_test(test_req_body_untouched_without_body),
		cmocka_unit_test(test_req_body_substituted_length),
		cmocka_unit_test(test_req_body_substituted_chunked),
		cmocka_unit_test(test_req_chunked_streams),
		cmocka_unit_test(test_req_split_bytewise),
		cmocka_unit_test(test_req_split_random),
		cmocka_unit_test(test_req_connection_stripped),
		cmocka_unit_test(test_req_pipelined_not_consumed),
		cmocka_unit_test(test_req_head_too_large),
		cmocka_unit_test(test_req_host),
		cmocka_unit_test(test_req_framing_refused),
		cmocka_unit_test(test_req_bad_chunks),
		cmocka_unit_test(test_req_malformed),
		cmocka_unit_test(test_req_eof),
		cmocka_unit_test(test_req_head_read),
		cmocka_unit_test(test_req_body_too_large),
		cmocka_unit_test(test_req_output_bounded),
		cmocka_unit_test(test_req_value_must_fit),
		cmocka_unit_test(test_req_expect_continue_held),
		cmocka_unit_test(test_req_expect_continue_streamed),
		cmocka_unit_test(test_resp_echo_replaced),
		cmocka_unit_test(test_resp_echo_split),
		cmocka_unit_test(test_resp_echoed_mask),
		cmocka_unit_test(test_resp_chunked),
		cmocka_unit_test(test_resp_interim),
		cmocka_unit_test(test_resp_bodiless),
		cmocka_unit_test(test_resp_length_and_eof),
		cmocka_unit_test(test_resp_content_encoding),
		cmocka_unit_test(test_resp_malformed),
		cmocka_unit_test(test_resp_split_random),
	};
	return cmocka_run_group_tests(tests, setup, NULL);
}
