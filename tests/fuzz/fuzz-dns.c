/* Fuzz target for the DNS messages the policy process reads
 * (src/net/dns.c): the input is a query from the guest and, the same
 * bytes, an answer from the upstream resolver.
 * Checked for a query that parses: its name is NUL-terminated, lowercase
 * and plain when it has no escapes; unless the name is compressed (a
 * pointer into the header, whose flags a reply changes: netd answers
 * with the header only), the error reply built for it parses as an
 * answer with the same ID, name, type and no address; a plain
 * name's query built afresh parses back to the same name and type.
 * For an answer that parses: at most CAP_DNS_MAX_ADDRS addresses, its
 * question's name NUL-terminated. The header-only reply to any message
 * of at least a header parses as an answer without a question. */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "dns.h"
#include "fuzz.h"

static void check_name(const struct cap_dns_question *q)
{
	FUZZ_CHECK(fuzz_terminated(q->name, sizeof(q->name)), "a name without its NUL");
	for (const char *c = q->name; *c; c++) {
		FUZZ_CHECK(!(*c >= 'A' && *c <= 'Z'), "an uppercase name: %s", q->name);
		FUZZ_CHECK(!q->plain || *c != '\\', "a plain name with an escape: %s", q->name);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct cap_dns_question q;
	uint8_t out[600];
	if (cap_dns_parse_query(data, size, &q) == 0) {
		check_name(&q);
		FUZZ_CHECK(q.end <= size && q.end >= CAP_DNS_HEADER + 5, "question ends at %zu of %zu", q.end, size);
		FUZZ_CHECK(q.qdcount == 1 && !(q.flags & 0x8000), "a query with QDCOUNT %u, flags %#x", q.qdcount, q.flags);
		/* (A compressed name can point into the header, whose flags the
		 * reply changes: netd answers such a query with the header only.) */
		ssize_t n = cap_dns_build_reply(data, size, &q, CAP_DNS_RCODE_REFUSED, out, sizeof(out));
		FUZZ_CHECK(n > 0 || n == -ENOSPC, "the reply: %zd", n);
		if (n > 0 && !q.compressed) {
			struct cap_dns_answer a;
			FUZZ_CHECK(cap_dns_parse_answer(out, (size_t)n, &a) == 0, "our own reply does not parse");
			FUZZ_CHECK(a.has_question && a.q.id == q.id && a.q.qtype == q.qtype && a.naddr == 0 &&
					   a.q.rcode == CAP_DNS_RCODE_REFUSED && strcmp(a.q.name, q.name) == 0,
				   "our reply to %s reads otherwise: question %d, id %#x/%#x, type %u/%u, %u addresses, rcode %u, name %s",
				   q.name, a.has_question, a.q.id, q.id, a.q.qtype, q.qtype, a.naddr, a.q.rcode, a.q.name);
		}
		if (q.plain && q.name[0]) {
			n = cap_dns_build_query(q.id, q.name, q.qtype, out, sizeof(out));
			if (n > 0) {
				struct cap_dns_question again;
				FUZZ_CHECK(cap_dns_parse_query(out, (size_t)n, &again) == 0 && again.id == q.id &&
						   again.qtype == q.qtype && strcmp(again.name, q.name) == 0 && again.plain,
					   "a query for %s built afresh reads otherwise", q.name);
			}
		}
	}
	struct cap_dns_answer a;
	if (cap_dns_parse_answer(data, size, &a) == 0) {
		FUZZ_CHECK(a.naddr <= CAP_DNS_MAX_ADDRS, "%u addresses", a.naddr);
		check_name(&a.q);
		FUZZ_CHECK(!a.has_question || a.q.end <= size, "question ends at %zu of %zu", a.q.end, size);
	}
	if (size >= CAP_DNS_HEADER) {
		ssize_t n = cap_dns_build_reply(data, size, NULL, CAP_DNS_RCODE_FORMERR, out, sizeof(out));
		FUZZ_CHECK(n == CAP_DNS_HEADER, "a header-only reply of %zd bytes", n);
		FUZZ_CHECK(cap_dns_parse_answer(out, (size_t)n, &a) == 0 && !a.has_question && a.naddr == 0,
			   "our header-only reply reads otherwise");
	}
	return 0;
}
