/* DNS messages as the policy process needs them (RFC 1035): the question
 * of a query, replies that carry only an error code, A queries, and the A
 * records of an answer. Pure functions over byte buffers: every offset is
 * checked against the message's length, compression pointers must point
 * backwards and are followed a bounded number of times. No I/O. */
#ifndef CAP_NET_DNS_H
#define CAP_NET_DNS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#define CAP_DNS_HEADER 12
#define CAP_DNS_TYPE_A 1
#define CAP_DNS_TYPE_CNAME 5
#define CAP_DNS_CLASS_IN 1

#define CAP_DNS_RCODE_FORMERR 1
#define CAP_DNS_RCODE_SERVFAIL 2
#define CAP_DNS_RCODE_NXDOMAIN 3
#define CAP_DNS_RCODE_NOTIMP 4
#define CAP_DNS_RCODE_REFUSED 5

/* A name in presentation form: at most 255 bytes on the wire, each byte
 * at most 4 characters ("\DDD"), and the NUL. */
#define CAP_DNS_NAME_SIZE 1024

/* A message's ID, flags and (first) question. */
struct cap_dns_question {
	uint16_t id;
	uint16_t flags;		/* the header's second word as received */
	unsigned opcode;	/* (flags >> 11) & 15 */
	unsigned rcode;		/* flags & 15 */
	/* Lowercase labels joined by dots, no trailing dot ("" for the
	 * root). Letters, digits, '-', '_' and '*' appear as they are; any
	 * other byte (a '.' inside a label included) as "\DDD" decimal, and
	 * then plain is false: such a name can never be valid for the
	 * policy. */
	char name[CAP_DNS_NAME_SIZE];
	bool plain;
	/* The question's name ends in a compression pointer (into the
	 * header or anywhere before it): legal on the wire, but a query
	 * built so can be read differently by different parsers. */
	bool compressed;
	uint16_t qtype, qclass;
	size_t end;		/* offset just past the question */
	/* The header's section counts as received. */
	uint16_t qdcount, ancount, nscount, arcount;
};

/* Parse a query: a header with QR clear and exactly one question.
 * 0, or -EINVAL when it is not such a message (then q is partly
 * written: q->id is valid whenever len >= CAP_DNS_HEADER). */
int cap_dns_parse_query(const uint8_t *msg, size_t len, struct cap_dns_question *q);

/* The reply to query (len bytes, already parsed into q) that carries
 * only rcode: the query's header with QR and RA set, its RD kept, and its
 * question echoed byte for byte (so its letter case too), no records.
 * With q NULL, the header only (QDCOUNT 0), for a query that could not be
 * parsed (len must still be >= CAP_DNS_HEADER). Written to out (cap
 * bytes); returns the length or -ENOSPC / -EINVAL. */
ssize_t cap_dns_build_reply(const uint8_t *query, size_t len,
			    const struct cap_dns_question *q, unsigned rcode,
			    uint8_t *out, size_t cap);

/* A recursive query (RD set) with ID id for name (dotted, an optional
 * trailing dot; labels of 1 to 63 bytes, at most 253 characters) and
 * qtype, class IN. Returns the length or -EINVAL (bad name) / -ENOSPC. */
ssize_t cap_dns_build_query(uint16_t id, const char *name, uint16_t qtype,
			    uint8_t *out, size_t cap);

#define CAP_DNS_MAX_ADDRS 32

/* The part of an answer the policy process keeps. */
struct cap_dns_answer {
	struct cap_dns_question q;	/* the reply's question */
	bool has_question;	/* QDCOUNT was 1 (some errors carry none) */
	bool truncated;		/* TC */
	/* A records (class IN) for the question's name or a name it is an
	 * alias of by the answer's CNAME records, in order; at most
	 * CAP_DNS_MAX_ADDRS (more are ignored). Host byte order. */
	uint32_t addr[CAP_DNS_MAX_ADDRS];
	uint32_t ttl[CAP_DNS_MAX_ADDRS];
	unsigned naddr;
};

/* Parse a reply: QR set, at most one question, the answer section's
 * records (the authority and additional sections are not read). 0, or
 * -EINVAL when the message is malformed anywhere it is read. */
int cap_dns_parse_answer(const uint8_t *msg, size_t len, struct cap_dns_answer *a);

#endif
