/* Fuzz target for the request rewriter (src/net/rewrite.c): the input is
 * what the guest sends through the policy process to api.test:443 (after
 * a first byte giving the size of the pieces it arrives in), fed to a
 * rewriter that knows the secrets of secrets.h (TOKEN, BODYTOK and ODD
 * apply to the connection, OTHER does not).
 *
 * The oracle (issue 30): a secret's value goes upstream only where its
 * placeholder was, and never anywhere else the guest could read it.
 * Unless the guest's input already holds the value (as a subsequence:
 * a chunked body can spell it out in pieces):
 *  - a refusal's reason (the guest's error body, net.log's line) and the
 *    method and target kept for the log show no value, as it is or
 *    escaped;
 *  - what goes upstream holds an applying secret's value at most as
 *    many times as the input held its placeholder, in the body only for
 *    a secret marked body, and a secret that does not apply never.
 * Also: a refusal has a NUL-terminated, non-empty reason and one of the
 * documented statuses; after DONE or a refusal the same answer again;
 * *used never exceeds what was given. */
#include <stdint.h>
#include <string.h>

#include "buf.h"
#include "fuzz.h"
#include "rewrite.h"
#include "secrets.h"
#include "util.h"

static bool known[FZ_NSECRETS];

static void check_log(const char *what, const char *s)
{
	for (unsigned i = 0; i < FZ_NSECRETS; i++)
		FUZZ_CHECK(known[i] || !fz_shows(s, strlen(s), i),
			   "the value of secret %s is in %s: %.400s", fz_secrets[i].name, what, s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t piece = data[0] ? data[0] : size;	/* 0: all at once */
	data++;
	size--;
	for (unsigned i = 0; i < FZ_NSECRETS; i++)
		known[i] = fz_spelt(data, size, i);

	struct cap_http_req *r = cap_http_req_new("api.test", 443, fz_secrets, FZ_NSECRETS);
	struct cap_buf out;
	struct cap_http_refusal why;
	cap_buf_init(&out);
	int rc = CAP_HTTP_MORE;
	size_t off = 0;
	while (off < size && rc == CAP_HTTP_MORE) {
		size_t n = CAP_MIN(piece, size - off), used = SIZE_MAX;
		memset(&why, 0x55, sizeof(why));
		rc = cap_http_req_feed(r, data + off, n, &used, &out, &why);
		FUZZ_CHECK(rc == -1 || used <= n, "used %zu of %zu bytes", used, n);
		FUZZ_CHECK(rc != CAP_HTTP_MORE || used == n, "MORE after using %zu of %zu bytes", used, n);
		if (rc >= 0)
			off += used;
	}
	if (rc == CAP_HTTP_MORE) {
		memset(&why, 0x55, sizeof(why));
		rc = cap_http_req_eof(r, &why);
	}
	FUZZ_CHECK(rc == CAP_HTTP_DONE || rc == -1, "the rewriter answered %d", rc);
	if (rc < 0) {
		FUZZ_CHECK(fuzz_terminated(why.reason, sizeof(why.reason)) && why.reason[0],
			   "a refusal without a reason");
		static const int statuses[] = { 400, 413, 421, 431, 501, 505 };
		bool ok = false;
		for (size_t i = 0; i < CAP_ARRAY_SIZE(statuses); i++)
			ok |= why.status == statuses[i];
		FUZZ_CHECK(ok, "a request refused with %d: %s", why.status, why.reason);
		check_log("a refusal's reason", why.reason);
	}
	check_log("the method for the log", cap_http_req_method(r));
	check_log("the target for the log", cap_http_req_target(r));

	/* Upstream: each value only where its placeholder was. */
	const uint8_t *o = cap_buf_head(&out);
	size_t on = cap_buf_used(&out);
	const uint8_t *end = on >= 4 ? memmem(o, on, "\r\n\r\n", 4) : NULL;
	size_t head = end ? (size_t)(end - o) + 4 : on;
	for (unsigned i = 0; i < FZ_NSECRETS; i++) {
		const struct cap_http_secret *s = &fz_secrets[i];
		if (known[i])
			continue;
		size_t vals = fuzz_count(o, on, s->value, s->value_len);
		size_t phs = fuzz_count(data, size, s->placeholder, strlen(s->placeholder));
		FUZZ_CHECK(s->applies || vals == 0, "the value of %s, which does not apply, went upstream", s->name);
		FUZZ_CHECK(vals <= phs, "the value of %s went upstream %zu times for %zu placeholders",
			   s->name, vals, phs);
		FUZZ_CHECK(s->body || on == head || fuzz_count(o + head, on - head, s->value, s->value_len) == 0,
			   "the value of %s, not marked body, went upstream in the body", s->name);
		FUZZ_CHECK(vals == 0 || (cap_http_req_substituted(r) & (1u << i)),
			   "the value of %s went upstream, not counted as substituted", s->name);
	}

	/* Done is done. */
	size_t before = cap_buf_used(&out), used2 = 0;
	struct cap_http_refusal again;
	int rc2 = cap_http_req_feed(r, (const uint8_t *)"x", 1, &used2, &out, &again);
	FUZZ_CHECK(rc2 == rc && cap_buf_used(&out) == before, "after %d, a feed answered %d and sent %zu bytes",
		   rc, rc2, cap_buf_used(&out) - before);
	cap_buf_fini(&out);
	cap_http_req_free(r);
	return 0;
}
