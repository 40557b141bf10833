/* Fuzz target for the metrics endpoint's request decoder
 * (src/serve/serve-http.c): the input is what a client sends to
 * `capsule serve --metrics ADDR`.
 * Checked: the answer is "read more" only below the bound, else one of
 * 200, 400, 404, 405, 431; an error says why (one printable line); a 200
 * is a GET or HEAD of /metrics whose head ends in CRLF CRLF within the
 * input and the bound; the head alone decodes the same (what follows it
 * changes nothing); a 431 comes only at the bound. */
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "serve-http.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const char *buf = (const char *)data;
	struct serve_http_req q;
	int r = serve_http_parse(buf, size, &q);
	FUZZ_CHECK(r == 0 || r == 1, "answer %d", r);
	if (r == 0) {
		FUZZ_CHECK(size < SERVE_HTTP_MAX, "MORE with %zu bytes", size);
		return 0;
	}
	FUZZ_CHECK(q.status == 200 || q.status == 400 || q.status == 404 || q.status == 405 || q.status == 431,
		   "status %d", q.status);
	if (q.status != 200) {
		FUZZ_CHECK(q.why && *q.why, "status %d without a reason", q.status);
		for (const char *c = q.why; *c; c++)
			FUZZ_CHECK(*c >= 0x20 && *c < 0x7f, "a reason with byte %#x", (unsigned char)*c);
	} else {
		FUZZ_CHECK(!q.why, "a 200 with a reason");
		FUZZ_CHECK(size >= 4 && memmem(buf, size, "/metrics", 8), "a 200 without /metrics");
		FUZZ_CHECK((q.head && !memcmp(buf, "HEAD ", 5)) || (!q.head && !memcmp(buf, "GET ", 4)),
			   "a 200 for another method");
	}
	if (q.status == 431)
		FUZZ_CHECK(size >= SERVE_HTTP_MAX && q.len == 0, "431 with %zu bytes", size);
	if (q.len) {
		FUZZ_CHECK(q.len >= 4 && q.len <= size && q.len <= SERVE_HTTP_MAX &&
				   !memcmp(buf + q.len - 4, "\r\n\r\n", 4),
			   "a head of %zu bytes", q.len);
		struct serve_http_req again;
		FUZZ_CHECK(serve_http_parse(buf, q.len, &again) == 1 && again.status == q.status &&
				   again.head == q.head && again.len == q.len,
			   "the head alone answers %d, with what follows %d", again.status, q.status);
	}
	return 0;
}
