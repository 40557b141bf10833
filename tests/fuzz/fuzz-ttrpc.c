/* Fuzz target for the shim's ttrpc decoder (src/shim/ttrpc.c): what
 * reaches the shim's socket and what the events client reads back are
 * untrusted bytes. The input is a byte stream cut into frames by
 * cap_ttrpc_split; each body decoded as a Request (and as a Response).
 * Checked: a split consumes whole frames only, never past the input;
 * each frame's header re-encodes to the bytes it came from; a decoded
 * request re-packs and decodes to the same service and method. */
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "ttrpc.h"

struct walk {
	const uint8_t *start;
	size_t size;
	size_t seen;
};

static int frame(void *ud, const struct cap_ttrpc_header *h, const uint8_t *body)
{
	struct walk *w = ud;
	const uint8_t *hdr = body - CAP_TTRPC_HEADER_LEN;
	FUZZ_CHECK(hdr >= w->start && body + h->length <= w->start + w->size, "a frame outside the input");
	uint8_t again[CAP_TTRPC_HEADER_LEN];
	cap_ttrpc_header_encode(again, h);
	FUZZ_CHECK(memcmp(again, hdr, sizeof(again)) == 0, "a header that does not re-encode to its bytes");
	w->seen += CAP_TTRPC_HEADER_LEN + h->length;
	Ttrpc__Request *r = cap_ttrpc_request_decode(body, h->length);
	if (r) {
		size_t n;
		uint8_t *f = cap_ttrpc_request_frame(1, r->service, r->method, r->payload.data, r->payload.len,
						     r->timeout_nano, &n);
		if (f) {
			Ttrpc__Request *r2 = cap_ttrpc_request_decode(f + CAP_TTRPC_HEADER_LEN, n - CAP_TTRPC_HEADER_LEN);
			FUZZ_CHECK(r2 && strcmp(r2->service, r->service) == 0 && strcmp(r2->method, r->method) == 0,
				   "a request that does not survive re-packing");
			ttrpc__request__free_unpacked(r2, NULL);
			free(f);
		}
		ttrpc__request__free_unpacked(r, NULL);
	}
	Ttrpc__Response *resp = cap_ttrpc_response_decode(body, h->length);
	if (resp)
		ttrpc__response__free_unpacked(resp, NULL);
	return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct walk w = { .start = data, .size = size };
	long used = cap_ttrpc_split(data, size, frame, &w);
	if (used >= 0)
		FUZZ_CHECK((size_t)used == w.seen && (size_t)used <= size, "split consumed %ld of %zu", used, size);
	return 0;
}
