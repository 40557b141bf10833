/* dns: see dns.h. */
#include "dns.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#define FLAG_QR 0x8000u
#define FLAG_TC 0x0200u
#define FLAG_RD 0x0100u
#define FLAG_RA 0x0080u
#define OPCODE_MASK 0x7800u

#define NAME_WIRE_MAX 255	/* RFC 1035 3.1 */
#define LABEL_MAX 63
#define MAX_JUMPS 64
#define MAX_ALIASES 9	/* the question's name and up to 8 CNAME targets */

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t get32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static void put16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)(v >> 8);
	p[1] = (uint8_t)v;
}

static bool plain_char(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' ||
	       c == '_' || c == '*';
}

/* Read the name stored at *off into out (presentation form, see
 * cap_dns_question.name) and move *off past it as stored there (a
 * pointer ends it). Each pointer must go strictly below the previous one
 * (or below the name's start): that is how compression is written, and it
 * makes loops impossible; jumps are bounded besides. */
static int read_name(const uint8_t *msg, size_t len, size_t *off, char *out,
		     bool *plain, bool *compressed)
{
	size_t pos = *off, limit = *off, next = 0, o = 0, wire = 1;
	unsigned jumps = 0;

	*plain = true;
	for (;;) {
		if (pos >= len)
			return -EINVAL;
		uint8_t l = msg[pos];
		if ((l & 0xc0) == 0xc0) {
			if (pos + 1 >= len || ++jumps > MAX_JUMPS)
				return -EINVAL;
			size_t target = (size_t)(l & 0x3f) << 8 | msg[pos + 1];
			if (target >= limit)
				return -EINVAL;
			if (!next)
				next = pos + 2;
			limit = target;
			pos = target;
			continue;
		}
		if (l & 0xc0)	/* extended label types (RFC 6891): never valid here */
			return -EINVAL;
		if (l == 0) {
			pos++;
			break;
		}
		wire += (size_t)l + 1;
		if (wire > NAME_WIRE_MAX || pos + 1 + l > len)
			return -EINVAL;
		if (o)
			out[o++] = '.';
		for (size_t i = pos + 1; i <= pos + l; i++) {
			uint8_t c = msg[i];
			if (c >= 'A' && c <= 'Z')
				c = (uint8_t)(c - 'A' + 'a');
			if (plain_char(c)) {
				out[o++] = (char)c;
			} else {
				o += (size_t)snprintf(out + o, CAP_DNS_NAME_SIZE - o, "\\%03u", c);
				*plain = false;
			}
		}
		pos += 1 + (size_t)l;
	}
	out[o] = '\0';
	*off = next ? next : pos;
	if (compressed)
		*compressed = jumps > 0;
	return 0;
}

/* The header and the question (when qdcount is 1) into q. */
static int read_question(const uint8_t *msg, size_t len, struct cap_dns_question *q)
{
	size_t off = CAP_DNS_HEADER;

	if (read_name(msg, len, &off, q->name, &q->plain, &q->compressed) < 0 || off + 4 > len)
		return -EINVAL;
	q->qtype = get16(msg + off);
	q->qclass = get16(msg + off + 2);
	q->end = off + 4;
	return 0;
}

static int read_header(const uint8_t *msg, size_t len, struct cap_dns_question *q)
{
	memset(q, 0, sizeof(*q));
	if (!msg || len < CAP_DNS_HEADER)
		return -EINVAL;
	q->id = get16(msg);
	q->flags = get16(msg + 2);
	q->opcode = (q->flags & OPCODE_MASK) >> 11;
	q->rcode = q->flags & 15;
	q->qdcount = get16(msg + 4);
	q->ancount = get16(msg + 6);
	q->nscount = get16(msg + 8);
	q->arcount = get16(msg + 10);
	return 0;
}

int cap_dns_parse_query(const uint8_t *msg, size_t len, struct cap_dns_question *q)
{
	if (read_header(msg, len, q) < 0)
		return -EINVAL;
	if ((q->flags & FLAG_QR) || get16(msg + 4) != 1)
		return -EINVAL;
	return read_question(msg, len, q);
}

ssize_t cap_dns_build_reply(const uint8_t *query, size_t len,
			    const struct cap_dns_question *q, unsigned rcode,
			    uint8_t *out, size_t cap)
{
	size_t n = q ? q->end : CAP_DNS_HEADER;

	if (!query || len < CAP_DNS_HEADER || n > len || n < CAP_DNS_HEADER || rcode > 15)
		return -EINVAL;
	if (n > cap)
		return -ENOSPC;
	memcpy(out, query, n);
	uint16_t flags = get16(query + 2);
	flags = (uint16_t)(FLAG_QR | (flags & (OPCODE_MASK | FLAG_RD)) | FLAG_RA | rcode);
	put16(out + 2, flags);
	put16(out + 4, q ? 1 : 0);
	memset(out + 6, 0, 6);
	return (ssize_t)n;
}

ssize_t cap_dns_build_query(uint16_t id, const char *name, uint16_t qtype,
			    uint8_t *out, size_t cap)
{
	size_t n = name ? strlen(name) : 0, o = CAP_DNS_HEADER;

	if (n > 0 && name[n - 1] == '.')
		n--;
	if (n == 0 || n > 253)
		return -EINVAL;
	if (cap < CAP_DNS_HEADER + n + 2 + 4)
		return -ENOSPC;
	memset(out, 0, CAP_DNS_HEADER);
	put16(out, id);
	put16(out + 2, FLAG_RD);
	put16(out + 4, 1);
	for (size_t start = 0; start <= n;) {
		const char *dot = memchr(name + start, '.', n - start);
		size_t l = (dot ? (size_t)(dot - name) : n) - start;
		if (l == 0 || l > LABEL_MAX)
			return -EINVAL;
		out[o++] = (uint8_t)l;
		memcpy(out + o, name + start, l);
		o += l;
		start += l + 1;
	}
	out[o++] = 0;
	put16(out + o, qtype);
	put16(out + o + 2, CAP_DNS_CLASS_IN);
	return (ssize_t)(o + 4);
}

/* One resource record at *off: its owner, type, class, TTL and where its
 * data lies (inside the message). */
struct rr {
	char owner[CAP_DNS_NAME_SIZE];
	uint16_t type, class;
	uint32_t ttl;
	size_t rdata, rdlen;
};

static int read_rr(const uint8_t *msg, size_t len, size_t *off, struct rr *r)
{
	bool plain;

	if (read_name(msg, len, off, r->owner, &plain, NULL) < 0 || *off + 10 > len)
		return -EINVAL;
	const uint8_t *p = msg + *off;
	r->type = get16(p);
	r->class = get16(p + 2);
	r->ttl = get32(p + 4);
	if (r->ttl > 0x7fffffffu)	/* RFC 2181 8: treated as zero */
		r->ttl = 0;
	r->rdlen = get16(p + 8);
	r->rdata = *off + 10;
	if (r->rdata + r->rdlen > len)
		return -EINVAL;
	*off = r->rdata + r->rdlen;
	return 0;
}

static bool in_names(char (*names)[CAP_DNS_NAME_SIZE], unsigned n, const char *name)
{
	for (unsigned i = 0; i < n; i++)
		if (!strcmp(names[i], name))
			return true;
	return false;
}

/* Walk the answer section: with want_a false, add to names the targets
 * of CNAMEs whose owner is in names (returns whether any was added); with
 * want_a true, collect the A records of those names into a. */
static int walk_answers(const uint8_t *msg, size_t len, size_t start, unsigned count,
			char (*names)[CAP_DNS_NAME_SIZE], unsigned *nnames,
			bool want_a, struct cap_dns_answer *a, bool *added)
{
	struct rr r;
	size_t off = start;

	for (unsigned i = 0; i < count; i++) {
		if (read_rr(msg, len, &off, &r) < 0)
			return -EINVAL;
		if (r.class != CAP_DNS_CLASS_IN || !in_names(names, *nnames, r.owner))
			continue;
		if (want_a && r.type == CAP_DNS_TYPE_A) {
			if (r.rdlen != 4)
				return -EINVAL;
			if (a->naddr < CAP_DNS_MAX_ADDRS) {
				a->addr[a->naddr] = get32(msg + r.rdata);
				a->ttl[a->naddr] = r.ttl;
				a->naddr++;
			}
		} else if (!want_a && r.type == CAP_DNS_TYPE_CNAME) {
			char target[CAP_DNS_NAME_SIZE];
			size_t t = r.rdata;
			bool plain;
			if (read_name(msg, len, &t, target, &plain, NULL) < 0 ||
			    t != r.rdata + r.rdlen)
				return -EINVAL;
			if (*nnames < MAX_ALIASES && !in_names(names, *nnames, target)) {
				memcpy(names[(*nnames)++], target, sizeof(target));
				*added = true;
			}
		}
	}
	return 0;
}

int cap_dns_parse_answer(const uint8_t *msg, size_t len, struct cap_dns_answer *a)
{
	char names[MAX_ALIASES][CAP_DNS_NAME_SIZE];
	unsigned nnames = 0;
	size_t start = CAP_DNS_HEADER;

	memset(a, 0, sizeof(*a));
	if (read_header(msg, len, &a->q) < 0 || !(a->q.flags & FLAG_QR))
		return -EINVAL;
	unsigned qd = get16(msg + 4), an = get16(msg + 6);
	a->truncated = a->q.flags & FLAG_TC;
	if (qd > 1)
		return -EINVAL;
	if (qd == 0)
		return an ? -EINVAL : 0;
	if (read_question(msg, len, &a->q) < 0)
		return -EINVAL;
	a->has_question = true;
	start = a->q.end;
	memcpy(names[nnames++], a->q.name, sizeof(a->q.name));
	/* A chain of aliases needs one pass per link, whatever their order. */
	for (unsigned pass = 0; pass < MAX_ALIASES; pass++) {
		bool added = false;
		if (walk_answers(msg, len, start, an, names, &nnames, false, a, &added) < 0)
			return -EINVAL;
		if (!added)
			break;
	}
	return walk_answers(msg, len, start, an, names, &nnames, true, a, NULL);
}
