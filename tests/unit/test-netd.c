/* Unit tests of the policy process's parsers: DNS messages (dns.h), TLS
 * ClientHello SNI, HTTP request heads and proxy targets (sniff.h). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <unistd.h>

#include "dns.h"
#include "netd-int.h"
#include "util.h"
#include "policy.h"
#include "sniff.h"

/* ---- DNS ---------------------------------------------------------------- */

/* A query as dig sends it: ID 0x1234, RD and AD, one question
 * "Example.COM" A IN, and an EDNS OPT record. */
static const uint8_t dig_query[] = {
	0x12, 0x34, 0x01, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
	7, 'E', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'C', 'O', 'M', 0,
	0x00, 0x01, 0x00, 0x01,
	/* OPT */
	0x00, 0x00, 0x29, 0x10, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
};

static void test_dns_query_parse(void **state)
{
	struct cap_dns_question q;

	(void)state;
	assert_int_equal(cap_dns_parse_query(dig_query, sizeof(dig_query), &q), 0);
	assert_int_equal(q.id, 0x1234);
	assert_int_equal(q.opcode, 0);
	assert_string_equal(q.name, "example.com");
	assert_true(q.plain);
	assert_int_equal(q.qtype, CAP_DNS_TYPE_A);
	assert_int_equal(q.qclass, CAP_DNS_CLASS_IN);
	assert_int_equal(q.end, 12 + 13 + 4);

	/* Every truncation of the question fails, none reads past the end. */
	for (size_t n = 0; n < 12 + 13 + 4; n++) {
		uint8_t *copy = malloc(n ? n : 1);
		memcpy(copy, dig_query, n);
		assert_int_equal(cap_dns_parse_query(copy, n, &q), -EINVAL);
		free(copy);
	}
}

static void test_dns_query_refused_shapes(void **state)
{
	struct cap_dns_question q;
	uint8_t m[sizeof(dig_query)];

	(void)state;
	memcpy(m, dig_query, sizeof(m));
	m[2] |= 0x80;	/* QR: a reply */
	assert_int_equal(cap_dns_parse_query(m, sizeof(m), &q), -EINVAL);

	memcpy(m, dig_query, sizeof(m));
	m[5] = 2;	/* two questions */
	assert_int_equal(cap_dns_parse_query(m, sizeof(m), &q), -EINVAL);

	memcpy(m, dig_query, sizeof(m));
	m[12] = 0x47;	/* an extended label type (0x40) */
	assert_int_equal(cap_dns_parse_query(m, sizeof(m), &q), -EINVAL);

	/* The name a pointer to itself, to the header, and forwards. */
	static const uint8_t self[] = { 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
					0xc0, 12, 0, 1, 0, 1 };
	assert_int_equal(cap_dns_parse_query(self, sizeof(self), &q), -EINVAL);
	static const uint8_t fwd[] = { 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
				       0xc0, 18, 0, 1, 0, 1, 1, 'a', 0 };
	assert_int_equal(cap_dns_parse_query(fwd, sizeof(fwd), &q), -EINVAL);

	/* A '.' and a control byte inside a label: escaped, not plain. */
	static const uint8_t odd[] = { 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0,
				       4, 'a', '.', 'b', '\n', 3, 'c', 'o', 'm', 0, 0, 1, 0, 1 };
	assert_int_equal(cap_dns_parse_query(odd, sizeof(odd), &q), 0);
	assert_string_equal(q.name, "a\\046b\\010.com");
	assert_false(q.plain);
	assert_false(cap_net_valid_name(q.name, strlen(q.name)));

	/* The root. */
	static const uint8_t root[] = { 0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 2, 0, 1 };
	assert_int_equal(cap_dns_parse_query(root, sizeof(root), &q), 0);
	assert_string_equal(q.name, "");
	assert_int_equal(q.qtype, 2);

	/* A name longer than 255 bytes on the wire. */
	uint8_t big[12 + 5 * 64 + 1 + 4] = { 0, 1, 0, 0, 0, 1 };
	size_t o = 12;
	for (int i = 0; i < 5; i++) {
		big[o++] = 63;
		memset(big + o, 'a', 63);
		o += 63;
	}
	big[o++] = 0;
	big[o + 1] = 1;
	big[o + 3] = 1;
	assert_int_equal(cap_dns_parse_query(big, sizeof(big), &q), -EINVAL);
}

/* What netd needs to refuse a query it could read differently from the
 * resolver: a question compressed into the header, and the counts. */
static void test_dns_query_shape(void **state)
{
	struct cap_dns_question q;

	(void)state;
	assert_int_equal(cap_dns_parse_query(dig_query, sizeof(dig_query), &q), 0);
	assert_false(q.compressed);
	assert_int_equal(q.qdcount, 1);
	assert_int_equal(q.ancount, 0);
	assert_int_equal(q.nscount, 0);
	assert_int_equal(q.arcount, 1);	/* dig's OPT */

	/* The name is a pointer to offset 0: with ID 0x0161 it reads
	 * "a.\000"; rewriting the ID would change it. */
	static const uint8_t ptr[] = { 0x01, 0x61, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
				       0xc0, 0x00, 0, 1, 0, 1 };
	assert_int_equal(cap_dns_parse_query(ptr, sizeof(ptr), &q), 0);
	assert_true(q.compressed);
	assert_string_equal(q.name, "a.\\000");
	assert_int_equal(q.end, sizeof(ptr));

	/* A label, then a pointer into the header. */
	static const uint8_t tail[] = { 0x00, 0x00, 0x01, 0x00, 0, 1, 0, 2, 0, 3, 0, 4,
					1, 'b', 0xc0, 0x03, 0, 1, 0, 1 };
	assert_int_equal(cap_dns_parse_query(tail, sizeof(tail), &q), 0);
	assert_true(q.compressed);
	assert_int_equal(q.ancount, 2);
	assert_int_equal(q.nscount, 3);
	assert_int_equal(q.arcount, 4);
}

static void test_dns_reply_build(void **state)
{
	struct cap_dns_question q;
	uint8_t out[512];

	(void)state;
	assert_int_equal(cap_dns_parse_query(dig_query, sizeof(dig_query), &q), 0);
	ssize_t n = cap_dns_build_reply(dig_query, sizeof(dig_query), &q,
					CAP_DNS_RCODE_NXDOMAIN, out, sizeof(out));
	assert_int_equal(n, (ssize_t)q.end);
	assert_int_equal(out[0], 0x12);
	assert_int_equal(out[1], 0x34);
	assert_int_equal(out[2], 0x81);	/* QR, RD */
	assert_int_equal(out[3], 0x83);	/* RA, NXDOMAIN */
	static const uint8_t counts[] = { 0, 1, 0, 0, 0, 0, 0, 0 };
	assert_memory_equal(out + 4, counts, 8);
	/* The question echoed as asked, letter case included. */
	assert_memory_equal(out + 12, dig_query + 12, q.end - 12);

	struct cap_dns_answer a;
	assert_int_equal(cap_dns_parse_answer(out, (size_t)n, &a), 0);
	assert_int_equal(a.q.rcode, CAP_DNS_RCODE_NXDOMAIN);
	assert_int_equal(a.naddr, 0);

	n = cap_dns_build_reply(dig_query, sizeof(dig_query), &q, CAP_DNS_RCODE_SERVFAIL,
				out, sizeof(out));
	assert_int_equal(out[3], 0x82);
	n = cap_dns_build_reply(dig_query, sizeof(dig_query), NULL, CAP_DNS_RCODE_FORMERR,
				out, sizeof(out));
	assert_int_equal(n, 12);
	assert_int_equal(out[3], 0x81);
	assert_int_equal(out[5], 0);
	assert_int_equal(cap_dns_build_reply(dig_query, sizeof(dig_query), &q, 3, out, 20),
			 -ENOSPC);
	assert_int_equal(cap_dns_build_reply(dig_query, 11, NULL, 3, out, sizeof(out)), -EINVAL);
}

static void test_dns_query_build(void **state)
{
	uint8_t out[512];
	struct cap_dns_question q;
	char name[300];

	(void)state;
	ssize_t n = cap_dns_build_query(0xbeef, "pypi.org.", CAP_DNS_TYPE_A, out, sizeof(out));
	static const uint8_t want[] = { 0xbe, 0xef, 0x01, 0x00, 0, 1, 0, 0, 0, 0, 0, 0,
					4, 'p', 'y', 'p', 'i', 3, 'o', 'r', 'g', 0, 0, 1, 0, 1 };
	assert_int_equal(n, sizeof(want));
	assert_memory_equal(out, want, sizeof(want));
	assert_int_equal(cap_dns_parse_query(out, (size_t)n, &q), 0);
	assert_string_equal(q.name, "pypi.org");

	assert_int_equal(cap_dns_build_query(1, "", 1, out, sizeof(out)), -EINVAL);
	assert_int_equal(cap_dns_build_query(1, ".", 1, out, sizeof(out)), -EINVAL);
	assert_int_equal(cap_dns_build_query(1, "a..b", 1, out, sizeof(out)), -EINVAL);
	assert_int_equal(cap_dns_build_query(1, ".a", 1, out, sizeof(out)), -EINVAL);
	memset(name, 'a', 64);
	name[64] = '\0';
	assert_int_equal(cap_dns_build_query(1, name, 1, out, sizeof(out)), -EINVAL);
	name[63] = '\0';
	assert_true(cap_dns_build_query(1, name, 1, out, sizeof(out)) > 0);
	memset(name, 'a', 254);
	for (int i = 50; i < 254; i += 50)
		name[i] = '.';
	name[254] = '\0';
	assert_int_equal(cap_dns_build_query(1, name, 1, out, sizeof(out)), -EINVAL);
	assert_int_equal(cap_dns_build_query(1, "pypi.org", 1, out, 20), -ENOSPC);
}

/* An answer for "example.com" A: a CNAME to www.cdn.net (compressed
 * owner), its A record (owner compressed to the CNAME's target), and an
 * unrelated A record that must be ignored. */
static const uint8_t answer[] = {
	0xab, 0xcd, 0x81, 0x80, 0x00, 0x01, 0x00, 0x03, 0x00, 0x00, 0x00, 0x00,
	/* 12: question */
	7, 'e', 'x', 'a', 'm', 'p', 'l', 'e', 3, 'c', 'o', 'm', 0, 0x00, 0x01, 0x00, 0x01,
	/* 29: example.com CNAME www.cdn.net, TTL 60 */
	0xc0, 12, 0x00, 0x05, 0x00, 0x01, 0x00, 0x00, 0x00, 0x3c, 0x00, 13,
	/* 41: rdata */
	3, 'w', 'w', 'w', 3, 'c', 'd', 'n', 3, 'n', 'e', 't', 0,
	/* 54: www.cdn.net A 203.0.113.10, TTL 300 */
	0xc0, 41, 0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x01, 0x2c, 0x00, 4,
	203, 0, 113, 10,
	/* 70: other.org A 6.6.6.6 */
	5, 'o', 't', 'h', 'e', 'r', 3, 'o', 'r', 'g', 0,
	0x00, 0x01, 0x00, 0x01, 0x00, 0x00, 0x00, 0x10, 0x00, 4, 6, 6, 6, 6,
};

static void test_dns_answer_parse(void **state)
{
	struct cap_dns_answer a;

	(void)state;
	assert_int_equal(cap_dns_parse_answer(answer, sizeof(answer), &a), 0);
	assert_int_equal(a.q.id, 0xabcd);
	assert_true(a.has_question);
	assert_false(a.truncated);
	assert_string_equal(a.q.name, "example.com");
	assert_int_equal(a.naddr, 1);
	assert_int_equal(a.addr[0], 0xcb00710a);
	assert_int_equal(a.ttl[0], 300);

	/* Every truncation fails without reading past the end. */
	for (size_t n = 0; n < sizeof(answer); n++) {
		uint8_t *copy = malloc(n ? n : 1);
		memcpy(copy, answer, n);
		assert_int_equal(cap_dns_parse_answer(copy, n, &a), -EINVAL);
		free(copy);
	}

	/* A query is not an answer. */
	assert_int_equal(cap_dns_parse_answer(dig_query, sizeof(dig_query), &a), -EINVAL);
}

static void test_dns_answer_alias_order(void **state)
{
	/* The A record before the CNAME that leads to it. */
	static const uint8_t m[] = {
		0, 7, 0x81, 0x80, 0, 1, 0, 2, 0, 0, 0, 0,
		1, 'a', 2, 'e', 'x', 0, 0, 1, 0, 1,
		/* 22: b.ex A 198.51.100.1 TTL 2^31 (treated as 0) */
		1, 'b', 0xc0, 14, 0, 1, 0, 1, 0x80, 0, 0, 0, 0, 4, 198, 51, 100, 1,
		/* a.ex CNAME b.ex */
		0xc0, 12, 0, 5, 0, 1, 0, 0, 0, 9, 0, 2, 0xc0, 22,
	};
	struct cap_dns_answer a;

	(void)state;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), 0);
	assert_int_equal(a.naddr, 1);
	assert_int_equal(a.addr[0], 0xc6336401);
	assert_int_equal(a.ttl[0], 0);
}

static void test_dns_answer_malformed(void **state)
{
	struct cap_dns_answer a;
	uint8_t m[sizeof(answer)];

	(void)state;
	/* The A record's owner pointing at itself. */
	memcpy(m, answer, sizeof(m));
	m[55] = 54;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), -EINVAL);
	/* Two pointers in a loop: the CNAME's rdata ends with a pointer to
	 * the A record's owner, which points back at the rdata. */
	memcpy(m, answer, sizeof(m));
	m[49] = 0xc0;
	m[50] = 54;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), -EINVAL);
	/* An A record of 5 bytes. */
	memcpy(m, answer, sizeof(m));
	m[65] = 5;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), -EINVAL);
	/* More answers counted than present. */
	memcpy(m, answer, sizeof(m));
	m[7] = 4;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), -EINVAL);
	/* Two questions. */
	memcpy(m, answer, sizeof(m));
	m[5] = 2;
	assert_int_equal(cap_dns_parse_answer(m, sizeof(m), &a), -EINVAL);

	/* A SERVFAIL without a question is an answer, with no addresses. */
	static const uint8_t bare[] = { 0xab, 0xcd, 0x81, 0x82, 0, 0, 0, 0, 0, 0, 0, 0 };
	assert_int_equal(cap_dns_parse_answer(bare, sizeof(bare), &a), 0);
	assert_false(a.has_question);
	assert_int_equal(a.q.rcode, CAP_DNS_RCODE_SERVFAIL);
}

static void test_dns_answer_many(void **state)
{
	uint8_t m[12 + 7 + 40 * 16];
	struct cap_dns_answer a;
	size_t o = 12;

	(void)state;
	memset(m, 0, sizeof(m));
	m[2] = 0x81;
	m[5] = 1;
	m[7] = 40;
	static const uint8_t q[] = { 1, 'x', 0, 0, 1, 0, 1 };
	memcpy(m + o, q, sizeof(q));
	o += sizeof(q);
	for (int i = 0; i < 40; i++) {
		const uint8_t rr[] = { 0xc0, 12, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 0, 0, (uint8_t)i };
		memcpy(m + o, rr, sizeof(rr));
		o += sizeof(rr);
	}
	assert_int_equal(cap_dns_parse_answer(m, o, &a), 0);
	assert_int_equal(a.naddr, CAP_DNS_MAX_ADDRS);
	assert_int_equal(a.addr[31], 0x0a00001f);
}

/* ---- TLS ---------------------------------------------------------------- */

/* A ClientHello from Python's ssl (OpenSSL 3) for "example.com". */
static const char hello_hex[] =
	"1603010200010001fc0303e1af0dadefb7c2c3cfc6385957e06a547782bf692bfd7a2783"
	"3cf8a4220dc44d202eb5b9396ee9c591af8195a86f80a56b237231589a6fa3c6469a5b3c"
	"9b86f6040024130213031301c02cc030c02bc02fcca9cca8c024c028c023c027009f009e"
	"006b006700ff0100018f00000010000e00000b6578616d706c652e636f6d000b00040300"
	"0102000a00160014001d0017001e0019001801000101010201030104002300000016000000"
	"170000000d002a0028040305030603080708080809080a080b0804080508060401050106"
	"01030303010302040205020602002b00050403040303002d00020101003300260024001d"
	"002002781d256537de1d9da7bf47ab3efdf829887b5412b4ef627912107cd2bae4490015"
	"00e2";

#define HELLO_LEN 517
#define SNI_OFF 127	/* where "example.com" lies in the record */

static void hello(uint8_t *out)
{
	size_t n = strlen(hello_hex) / 2;

	memset(out, 0, HELLO_LEN);	/* the padding extension's zeros */
	for (size_t i = 0; i < n; i++)
		sscanf(hello_hex + 2 * i, "%2hhx", &out[i]);
}

static void test_tls_sni(void **state)
{
	uint8_t h[HELLO_LEN];
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0;

	(void)state;
	hello(h);
	assert_memory_equal(h + SNI_OFF, "example.com", 11);
	assert_int_equal(cap_tls_sniff(h, sizeof(h), sni, &sl), CAP_TLS_SNI);
	assert_int_equal(sl, 11);
	assert_string_equal(sni, "example.com");
	/* More bytes after the hello (early data) change nothing. */
	uint8_t more[HELLO_LEN + 10];
	memcpy(more, h, sizeof(h));
	memset(more + sizeof(h), 0x17, 10);
	assert_int_equal(cap_tls_sniff(more, sizeof(more), sni, &sl), CAP_TLS_SNI);
	/* Each prefix asks for more. */
	for (size_t n = 0; n < sizeof(h); n++) {
		uint8_t *copy = malloc(n ? n : 1);
		memcpy(copy, h, n);
		assert_int_equal(cap_tls_sniff(copy, n, sni, &sl), CAP_TLS_MORE);
		free(copy);
	}
}

static void test_tls_sni_control(void **state)
{
	uint8_t h[HELLO_LEN];
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0;

	(void)state;
	hello(h);
	memcpy(h + SNI_OFF, "ex\r\nple.com", 11);
	assert_int_equal(cap_tls_sniff(h, sizeof(h), sni, &sl), CAP_TLS_SNI);
	assert_int_equal(sl, 11);
	assert_memory_equal(sni, "ex\r\nple.com", 11);
	assert_false(cap_net_valid_name(sni, sl));
	memcpy(h + SNI_OFF, "exa\0ple.com", 11);
	assert_int_equal(cap_tls_sniff(h, sizeof(h), sni, &sl), CAP_TLS_SNI);
	assert_false(cap_net_valid_name(sni, sl));
	memcpy(h + SNI_OFF, "exa ple.com", 11);
	assert_int_equal(cap_tls_sniff(h, sizeof(h), sni, &sl), CAP_TLS_SNI);
	assert_false(cap_net_valid_name(sni, sl));
}

/* The same hello spread over two records, split after `at` bytes of the
 * handshake message. */
static size_t split(const uint8_t *h, size_t at, uint8_t *out)
{
	size_t body = HELLO_LEN - 5;

	memcpy(out, h, 5);
	out[3] = (uint8_t)(at >> 8);
	out[4] = (uint8_t)at;
	memcpy(out + 5, h + 5, at);
	memcpy(out + 5 + at, h, 5);
	out[5 + at + 3] = (uint8_t)((body - at) >> 8);
	out[5 + at + 4] = (uint8_t)(body - at);
	memcpy(out + 10 + at, h + 5 + at, body - at);
	return HELLO_LEN + 5;
}

static void test_tls_records(void **state)
{
	uint8_t h[HELLO_LEN], s[HELLO_LEN + 5];
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0;

	(void)state;
	hello(h);
	size_t cuts[] = { 1, 3, 4, 100, 125, 300, HELLO_LEN - 6 };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cuts); i++) {
		size_t n = split(h, cuts[i], s);
		assert_int_equal(cap_tls_sniff(s, n, sni, &sl), CAP_TLS_SNI);
		assert_string_equal(sni, "example.com");
		assert_int_equal(cap_tls_sniff(s, n - 1, sni, &sl), CAP_TLS_MORE);
		assert_int_equal(cap_tls_sniff(s, 5 + cuts[i] + 3, sni, &sl), CAP_TLS_MORE);
	}
	/* An alert record where the hello's rest should be. */
	size_t n = split(h, 100, s);
	s[105] = 21;
	assert_int_equal(cap_tls_sniff(s, n, sni, &sl), CAP_TLS_MALFORMED);
}

static void test_tls_not_tls(void **state)
{
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0;

	(void)state;
	assert_int_equal(cap_tls_sniff((const uint8_t *)"GET / HTTP/1.1\r\n", 16, sni, &sl),
			 CAP_TLS_NOT_TLS);
	assert_int_equal(cap_tls_sniff((const uint8_t *)"SSH-2.0-x", 9, sni, &sl),
			 CAP_TLS_NOT_TLS);
	assert_int_equal(cap_tls_sniff((const uint8_t *)"\x16\x01", 2, sni, &sl),
			 CAP_TLS_NOT_TLS);
	assert_int_equal(cap_tls_sniff((const uint8_t *)"\x16", 1, sni, &sl), CAP_TLS_MORE);
}

static void test_tls_malformed(void **state)
{
	uint8_t h[HELLO_LEN], m[HELLO_LEN];
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0;

	(void)state;
	hello(h);
	memcpy(m, h, sizeof(m));
	m[5] = 2;	/* a ServerHello */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[3] = m[4] = 0;	/* an empty record */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[3] = 0x41;	/* a record over 2^14 */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[6] = 0x01;	/* a hello longer than CAP_TLS_HELLO_MAX */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[SNI_OFF - 1]++;	/* the name's length past its list */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[SNI_OFF - 1] = 0;	/* an empty name */
	m[SNI_OFF - 3] = 0;
	m[SNI_OFF - 4] = 3;
	m[SNI_OFF - 6] = 5;
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[77] = 0x25;	/* odd cipher suites' length */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	memcpy(m, h, sizeof(m));
	m[117]++;	/* the extensions' total past the hello */
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
	/* A second server_name extension: turn the next one (ec_point_formats,
	 * 4 bytes of data) into one. */
	memcpy(m, h, sizeof(m));
	size_t next = SNI_OFF + 11;
	assert_int_equal(m[next + 1], 0x0b);
	m[next + 1] = 0;
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_MALFORMED);
}

static void test_tls_no_sni(void **state)
{
	/* A minimal TLS 1.2 hello without extensions. */
	uint8_t m[5 + 4 + 2 + 32 + 1 + 4 + 2] = { 22, 3, 1, 0, 45, 1, 0, 0, 41, 3, 3 };
	char sni[CAP_TLS_SNI_MAX + 1];
	size_t sl = 0, o = 5 + 4 + 2 + 32;

	(void)state;
	m[o++] = 0;
	m[o++] = 0;
	m[o++] = 2;
	m[o++] = 0x00;
	m[o++] = 0x2f;
	m[o++] = 1;
	m[o++] = 0;
	assert_int_equal(o, sizeof(m));
	assert_int_equal(cap_tls_sniff(m, sizeof(m), sni, &sl), CAP_TLS_NO_SNI);
}

/* ---- HTTP --------------------------------------------------------------- */

static int head(const char *s, struct cap_http_head *h)
{
	return cap_http_head_parse(s, strlen(s), 16384, h);
}

static void assert_span(const char *buf, struct cap_span s, const char *want)
{
	assert_int_equal(s.len, strlen(want));
	assert_memory_equal(buf + s.off, want, s.len);
}

static void test_http_connect(void **state)
{
	const char *r = "CONNECT example.com:443 HTTP/1.1\r\nHost: example.com:443 \r\n"
			"User-Agent: curl/8\r\n\r\nrest";
	struct cap_http_head h;
	struct cap_span name, value;

	(void)state;
	assert_int_equal(head(r, &h), 1);
	assert_span(r, h.method, "CONNECT");
	assert_span(r, h.target, "example.com:443");
	assert_span(r, h.version, "HTTP/1.1");
	assert_true(h.has_host);
	assert_span(r, h.host, "example.com:443");
	assert_int_equal(h.len, strlen(r) - 4);

	size_t pos = h.fields;
	assert_true(cap_http_field_next(r, &h, &pos, &name, &value));
	assert_span(r, name, "Host");
	assert_true(cap_http_field_next(r, &h, &pos, &name, &value));
	assert_span(r, name, "User-Agent");
	assert_span(r, value, "curl/8");
	assert_false(cap_http_field_next(r, &h, &pos, &name, &value));

	for (size_t n = 0; n < h.len; n++)
		assert_int_equal(cap_http_head_parse(r, n, 16384, &h), 0);
	assert_int_equal(cap_http_head_parse(r, 30, 30, &h), -E2BIG);
}

static void test_http_head_malformed(void **state)
{
	struct cap_http_head h;

	(void)state;
	assert_int_equal(head("GET / HTTP/1.1\r\nA: b\r\n c\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nA: b\nC: d\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nA: b\rC: d\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nHost : a\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nA: \x01\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET / HTTP/1.1\r\nno colon\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head("GET HTTP/1.1\r\n\r\n", &h), -EINVAL);
	assert_int_equal(head(" GET / HTTP/1.1\r\n\r\n", &h), -EINVAL);
	assert_int_equal(cap_http_head_parse("\x16\x03\x01", 3, 16384, &h), -EINVAL);
	/* No field lines at all is a head. */
	assert_int_equal(head("GET http://a/ HTTP/1.0\r\n\r\n", &h), 1);
	assert_false(h.has_host);
}

static void test_http_target_smuggled(void **state)
{
	const char *r = "CONNECT a\r\nb:80 HTTP/1.1\r\nHost: x\r\n\r\n";
	struct cap_http_head h;
	struct cap_target t;
	const char *why = NULL;
	char q[64];

	(void)state;
	assert_int_equal(head(r, &h), 1);
	assert_span(r, h.target, "a\r\nb:80");
	assert_int_equal(cap_target_parse_authority(r + h.target.off, h.target.len, &t, &why),
			 -EINVAL);
	assert_string_equal(why, "control character in the target");
	assert_string_equal(cap_sniff_quote(r + h.target.off, h.target.len, q, sizeof(q)),
			    "\"a\\r\\nb:80\"");
	r = "CONNECT a b:80 HTTP/1.1\r\n\r\n";
	assert_int_equal(head(r, &h), 1);
	assert_int_equal(cap_target_parse_authority(r + h.target.off, h.target.len, &t, &why),
			 -EINVAL);
	assert_string_equal(why, "whitespace in the target");
}

static int authority(const char *s, struct cap_target *t, const char **why)
{
	return cap_target_parse_authority(s, strlen(s), t, why);
}

static void test_target_authority(void **state)
{
	struct cap_target t;
	const char *why = NULL;

	(void)state;
	assert_int_equal(authority("Example.COM.:443", &t, &why), 0);
	assert_string_equal(t.host, "example.com");
	assert_int_equal(t.port, 443);
	assert_false(t.is_addr);
	assert_int_equal(authority("203.0.113.10:80", &t, &why), 0);
	assert_true(t.is_addr);
	assert_int_equal(t.addr, 0xcb00710a);
	assert_int_equal(authority("a_b.example:65535", &t, &why), 0);

	struct {
		const char *s, *why;
	} bad[] = {
		{ "", "empty host" },
		{ ":80", "empty host" },
		{ "example.com", "no port" },
		{ "example.com:", "no port" },
		{ "example.com:0", "bad port" },
		{ "example.com:65536", "bad port" },
		{ "example.com:+80", "bad port" },
		{ "example.com:123456", "bad port" },
		{ "a\tb:80", "control character in the target" },
		{ "a\x7f:80", "control character in the target" },
		{ "a b:80", "whitespace in the target" },
		{ "1.2.3:80", "not a valid IPv4 address" },
		{ "010.0.0.1:80", "not a valid IPv4 address" },
		{ "999.1.1.1:80", "not a valid IPv4 address" },
		{ "[::1]:443", "not a valid host name" },
		{ "a..b:80", "not a valid host name" },
		{ "caf\xc3\xa9.fr:80", "not a valid host name" },
		{ "x:y:80", "not a valid host name" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		why = NULL;
		assert_int_equal(authority(bad[i].s, &t, &why), -EINVAL);
		assert_non_null(why);
		assert_string_equal(why, bad[i].why);
	}
}

static void test_target_url(void **state)
{
	struct cap_target t;
	struct cap_span path;
	const char *why = NULL;
	const char *u = "HTTP://Example.com:8080/a/b?c=d";

	(void)state;
	assert_int_equal(cap_target_parse_url(u, strlen(u), &t, &path, &why), 0);
	assert_string_equal(t.host, "example.com");
	assert_int_equal(t.port, 8080);
	assert_span(u, path, "/a/b?c=d");
	u = "http://203.0.113.10";
	assert_int_equal(cap_target_parse_url(u, strlen(u), &t, &path, &why), 0);
	assert_int_equal(t.port, 80);
	assert_true(t.is_addr);
	assert_int_equal(path.len, 0);
	u = "http://example.com?x";
	assert_int_equal(cap_target_parse_url(u, strlen(u), &t, &path, &why), 0);
	assert_span(u, path, "?x");

	struct {
		const char *s, *why;
	} bad[] = {
		{ "https://example.com/", "not an http:// URL" },
		{ "/index.html", "not an http:// URL" },
		{ "http://user:pw@example.com/", "user information in the URL" },
		{ "http://example.com:x/", "bad port" },
		{ "http://example.com:/", "bad port" },
		{ "http:///", "empty host" },
		{ "http://a\r\nb/", "control character in the target" },
		{ "http://a b/", "whitespace in the target" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		why = NULL;
		assert_int_equal(cap_target_parse_url(bad[i].s, strlen(bad[i].s), &t, &path, &why),
				 -EINVAL);
		assert_string_equal(why, bad[i].why);
	}
}

static void test_quote(void **state)
{
	char q[16];
	char big[64];

	(void)state;
	assert_string_equal(cap_sniff_quote("a\"\\\x01", 4, big, sizeof(big)),
			    "\"a\\\"\\\\\\x01\"");
	assert_string_equal(cap_sniff_quote("abcdefghijklmnopqrstuvwxyz", 26, q, sizeof(q)),
			    "\"abcdefghij...\"");
	assert_true(strlen(q) < sizeof(q));
	assert_string_equal(cap_sniff_quote("", 0, q, sizeof(q)), "\"\"");
}

/* ---- the log's limits ---------------------------------------------------- */

struct log_fixture {
	char path[64];
	int fd;
	struct cap_netd_config cfg;
	struct netd *d;
};

static void log_open(struct log_fixture *f, off_t size)
{
	snprintf(f->path, sizeof(f->path), "/tmp/test-netd-log.XXXXXX");
	f->fd = mkstemp(f->path);
	assert_true(f->fd >= 0);
	assert_int_equal(ftruncate(f->fd, size), 0);
	assert_true(lseek(f->fd, 0, SEEK_END) == size);
	memset(&f->cfg, 0, sizeof(f->cfg));
	f->cfg.log_fd = f->fd;
	f->d = calloc(1, sizeof(*f->d));
	assert_non_null(f->d);
	f->d->cfg = &f->cfg;
	netd_log_init(f->d, 1000);
}

/* What was written after offset from (NUL-terminated; the caller frees). */
static char *log_text(struct log_fixture *f, off_t from)
{
	off_t end = lseek(f->fd, 0, SEEK_END);
	size_t n = (size_t)(end - from);
	char *t = calloc(1, n + 1);

	assert_non_null(t);
	assert_true(pread(f->fd, t, n, from) == (ssize_t)n);
	return t;
}

static void log_close(struct log_fixture *f)
{
	close(f->fd);
	unlink(f->path);
	free(f->d);
}

static unsigned count(const char *text, const char *what)
{
	unsigned n = 0;

	for (const char *p = text; (p = strstr(p, what)) != NULL; p += strlen(what))
		n++;
	return n;
}

static void log_n(struct log_fixture *f, int64_t now, unsigned n)
{
	static const char line[] = "capsule net: refused dns evil.test: no rule names it\n";

	for (unsigned i = 0; i < n; i++)
		netd_log_line(f->d, now, line, sizeof(line) - 1);
}

static void test_log_rate_limit(void **state)
{
	struct log_fixture f;

	(void)state;
	log_open(&f, 0);
	/* A burst of 100 goes through, the rest is counted. */
	log_n(&f, 1000, 150);
	char *t = log_text(&f, 0);
	assert_int_equal(count(t, "refused dns"), NETD_LOG_BURST);
	assert_int_equal(count(t, "suppressed"), 0);
	free(t);
	/* Lines flow again after 500 ms (10 tokens): the count first. */
	off_t at = lseek(f.fd, 0, SEEK_END);
	log_n(&f, 1500, 12);
	t = log_text(&f, at);
	assert_non_null(strstr(t, "capsule net: 50 more lines suppressed (rate limit)\n"
				  "capsule net: refused dns"));
	assert_int_equal(count(t, "refused dns"), 10);
	free(t);
	/* A flood that ends: its count once a second, from the loop. */
	at = lseek(f.fd, 0, SEEK_END);
	log_n(&f, 1500, 5);	/* 2 pending from above, 7 in all */
	int64_t next = 0;
	netd_log_tick(f.d, 2000, &next);
	assert_int_equal(next, 2500);
	t = log_text(&f, at);
	assert_string_equal(t, "");
	free(t);
	netd_log_tick(f.d, 2500, &next);
	t = log_text(&f, at);
	assert_string_equal(t, "capsule net: 7 more lines suppressed (rate limit)\n");
	free(t);
	next = 0;
	netd_log_tick(f.d, 9000, &next);
	assert_int_equal(next, 0);
	/* A flood that lasts: a count at most once a second. */
	at = lseek(f.fd, 0, SEEK_END);
	for (int64_t ms = 100000; ms < 105000; ms += 10)
		log_n(&f, ms, 10);
	t = log_text(&f, at);
	assert_true(count(t, "more lines suppressed") >= 4 && count(t, "more lines suppressed") <= 6);
	assert_true(count(t, "refused dns") <= NETD_LOG_BURST + 5 * NETD_LOG_RATE + 1);
	free(t);
	log_close(&f);
}

static void test_log_size_cap(void **state)
{
	struct log_fixture f;
	off_t full = (off_t)NETD_LOG_SIZE_MAX;

	(void)state;
	log_open(&f, full - 10);
	log_n(&f, 1000, 1);	/* under the cap: written */
	char *t = log_text(&f, full - 10);
	assert_int_equal(count(t, "refused dns"), 1);
	free(t);
	/* Over it at the next check, 100 lines on: one last line, then nothing. */
	for (int64_t ms = 10000; ms < 20000; ms += 1000)
		log_n(&f, ms, 20);
	t = log_text(&f, full - 10);
	assert_int_equal(count(t, "refused dns"), NETD_LOG_SIZE_EVERY);
	assert_int_equal(count(t, "capsule net: net.log reached 64 MiB; further lines are dropped "
				  "(refusals still apply)\n"), 1);
	assert_non_null(strstr(t, "(refusals still apply)\n") );
	assert_true(strstr(t, "(refusals still apply)\n")[sizeof("(refusals still apply)\n") - 1] == '\0');
	free(t);
	log_close(&f);

	/* A log over the cap already at start: only the last line. */
	log_open(&f, full + 5);
	log_n(&f, 1000, 50);
	t = log_text(&f, full + 5);
	assert_string_equal(t, "capsule net: net.log reached 64 MiB; further lines are dropped "
			       "(refusals still apply)\n");
	free(t);
	log_close(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_dns_query_parse),
		cmocka_unit_test(test_dns_query_refused_shapes),
		cmocka_unit_test(test_dns_query_shape),
		cmocka_unit_test(test_dns_reply_build),
		cmocka_unit_test(test_dns_query_build),
		cmocka_unit_test(test_dns_answer_parse),
		cmocka_unit_test(test_dns_answer_alias_order),
		cmocka_unit_test(test_dns_answer_malformed),
		cmocka_unit_test(test_dns_answer_many),
		cmocka_unit_test(test_tls_sni),
		cmocka_unit_test(test_tls_sni_control),
		cmocka_unit_test(test_tls_records),
		cmocka_unit_test(test_tls_not_tls),
		cmocka_unit_test(test_tls_malformed),
		cmocka_unit_test(test_tls_no_sni),
		cmocka_unit_test(test_http_connect),
		cmocka_unit_test(test_http_head_malformed),
		cmocka_unit_test(test_http_target_smuggled),
		cmocka_unit_test(test_target_authority),
		cmocka_unit_test(test_target_url),
		cmocka_unit_test(test_quote),
		cmocka_unit_test(test_log_rate_limit),
		cmocka_unit_test(test_log_size_cap),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
