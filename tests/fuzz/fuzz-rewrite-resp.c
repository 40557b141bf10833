/* Fuzz target for the response rewriter (src/net/rewrite.c): the input
 * is what an upstream server sends (after a first byte of flags: the
 * request was HEAD, and the size of the pieces it arrives in), fed to a
 * rewriter that knows the secrets of secrets.h.
 *
 * The oracle (issue 30): no secret's value, whichever its host, reaches
 * what the guest receives: neither the bytes appended to out (the head
 * and body that go to the guest, also those sent before a refusal) nor
 * a refusal's reason (the guest's 502 body and net.log's line), as it is
 * or escaped (unless the server sent the escape's text), whatever the
 * server sent: a server may echo the guest's
 * requests, so the input holding the value is exactly the case to scrub.
 * Also: a refusal is a 502 with a NUL-terminated, non-empty reason, and
 * after DONE or a refusal the rewriter answers the same again. */
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "fuzz.h"
#include "rewrite.h"
#include "secrets.h"
#include "util.h"

/* In what goes to the guest, a value never; in a reason, not escaped
 * either, unless the server sent that text (the escape's characters). */
static void check_text(const char *what, const void *p, size_t n, bool reason, const uint8_t *in, size_t in_n)
{
	for (unsigned i = 0; i < FZ_NSECRETS; i++) {
		bool shown = fz_has_value(p, n, i) || (reason && fz_shows(p, n, i) && !fz_has_quoted(in, in_n, i));
		FUZZ_CHECK(!shown, "the value of secret %s reaches the guest in %s: %.*s",
			   fz_secrets[i].name, what, (int)CAP_MIN(n, (size_t)400), (const char *)p);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 2)
		return 0;
	bool head_request = data[0] & 1;
	size_t piece = data[1] ? data[1] : size;	/* 0: all at once */
	data += 2;
	size -= 2;

	struct cap_http_resp *r = cap_http_resp_new(fz_secrets, FZ_NSECRETS, head_request);
	struct cap_buf out;
	struct cap_http_refusal why;
	cap_buf_init(&out);
	int rc = CAP_HTTP_MORE;
	for (size_t off = 0; off < size && rc == CAP_HTTP_MORE; off += piece) {
		memset(&why, 0x55, sizeof(why));
		rc = cap_http_resp_feed(r, data + off, CAP_MIN(piece, size - off), &out, &why);
	}
	if (rc == CAP_HTTP_MORE) {
		memset(&why, 0x55, sizeof(why));
		rc = cap_http_resp_eof(r, &out, &why);
	}
	FUZZ_CHECK(rc == CAP_HTTP_DONE || rc == -1, "the rewriter answered %d", rc);
	if (rc < 0) {
		FUZZ_CHECK(fuzz_terminated(why.reason, sizeof(why.reason)) && why.reason[0],
			   "a refusal without a reason");
		FUZZ_CHECK(why.status == 502, "a response refused with %d, not 502: %s", why.status, why.reason);
		check_text("a refusal's reason", why.reason, strlen(why.reason), true, data, size);
	}
	check_text("the bytes sent to it", cap_buf_head(&out), cap_buf_used(&out), false, data, size);

	/* Done is done: more bytes change nothing. */
	size_t before = cap_buf_used(&out);
	struct cap_http_refusal again;
	int rc2 = cap_http_resp_feed(r, (const uint8_t *)"x", 1, &out, &again);
	FUZZ_CHECK(rc2 == rc && cap_buf_used(&out) == before, "after %d, a feed answered %d and sent %zu bytes",
		   rc, rc2, cap_buf_used(&out) - before);
	int st = cap_http_resp_status(r);
	FUZZ_CHECK(st == 0 || (st >= 100 && st <= 999), "status %d", st);
	cap_buf_fini(&out);
	cap_http_resp_free(r);
	return 0;
}
