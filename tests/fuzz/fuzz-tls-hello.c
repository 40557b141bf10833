/* Fuzz target for the ClientHello sniffer (cap_tls_sniff, src/net/sniff.c):
 * the input is the first bytes a guest sends on a TLS connection.
 * Checked: the answer is one of the enum's; a server name is 1 to
 * CAP_TLS_SNI_MAX bytes, NUL-terminated at its length; and reading in
 * parts decides the same: a prefix of the input is either still MORE or
 * already what the whole gives (with the same name), so a guest cannot
 * get two readings by how it cuts its bytes. */
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "sniff.h"

static enum cap_tls_sniff sniff(const uint8_t *p, size_t n, char *sni, size_t *len)
{
	memset(sni, 0x55, CAP_TLS_SNI_MAX + 1);
	*len = SIZE_MAX;
	enum cap_tls_sniff r = cap_tls_sniff(p, n, sni, len);
	FUZZ_CHECK(r == CAP_TLS_MORE || r == CAP_TLS_NOT_TLS || r == CAP_TLS_SNI || r == CAP_TLS_NO_SNI ||
		   r == CAP_TLS_MALFORMED, "answer %d", (int)r);
	if (r == CAP_TLS_SNI)
		FUZZ_CHECK(*len >= 1 && *len <= CAP_TLS_SNI_MAX && sni[*len] == '\0', "a name of %zu bytes", *len);
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char sni[CAP_TLS_SNI_MAX + 1], part[CAP_TLS_SNI_MAX + 1];
	size_t len, plen;
	enum cap_tls_sniff whole = sniff(data, size, sni, &len);
	size_t cuts[] = { size / 2, size > 5 ? 5 : 0, size ? size - 1 : 0 };
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		enum cap_tls_sniff r = sniff(data, cuts[i], part, &plen);
		if (r == CAP_TLS_MORE)
			continue;
		FUZZ_CHECK(r == whole, "the first %zu of %zu bytes read as %d, the whole as %d", cuts[i], size,
			   (int)r, (int)whole);
		if (r == CAP_TLS_SNI)
			FUZZ_CHECK(plen == len && memcmp(part, sni, len) == 0, "two names for one ClientHello");
	}
	return 0;
}
