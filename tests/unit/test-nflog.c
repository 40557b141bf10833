/* Unit tests of the NFLOG parser (src/net/nflog.c): hand-built netlink
 * messages as the kernel sends them, and broken ones; the log lines of
 * the packets it finds. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <netinet/in.h>

#include "nflog.h"
#include "policy.h"

#define PKT_TYPE (NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET)

/* ---- building messages ---------------------------------------------- */

struct out {
	uint8_t b[4096];
	size_t n;
	size_t msg;	/* start of the message being built */
};

static void put(struct out *o, const void *p, size_t n)
{
	assert_true(o->n + n <= sizeof(o->b));
	memcpy(o->b + o->n, p, n);
	o->n += n;
}

static void pad(struct out *o)
{
	static const uint8_t z[4];
	put(o, z, (4 - o->n % 4) % 4);
}

static void msg_begin(struct out *o, uint16_t type)
{
	struct nlmsghdr h = { .nlmsg_type = type };
	o->msg = o->n;
	put(o, &h, sizeof(h));
}

/* Fix the message's length (without trailing padding), then pad. */
static void msg_end(struct out *o)
{
	uint32_t len = (uint32_t)(o->n - o->msg);
	memcpy(o->b + o->msg, &len, sizeof(len));
	pad(o);
}

static void nfgen(struct out *o)
{
	static const uint8_t g[4] = { AF_INET, NFNETLINK_V0, 0, 1 };
	put(o, g, sizeof(g));
}

static void attr(struct out *o, uint16_t type, const void *p, size_t n)
{
	uint16_t h[2] = { (uint16_t)(4 + n), type };
	put(o, h, sizeof(h));
	put(o, p, n);
	pad(o);
}

/* An IPv4 header (no options) and 8 bytes of transport header. */
static size_t ipv4(uint8_t *b, uint8_t proto, const uint8_t src[4], const uint8_t dst[4],
		   uint16_t sport, uint16_t dport)
{
	memset(b, 0, 28);
	b[0] = 0x45;
	b[2] = 0;
	b[3] = 60;	/* the whole packet was longer than the copy */
	b[6] = 0x40;	/* DF */
	b[8] = 64;
	b[9] = proto;
	memcpy(b + 12, src, 4);
	memcpy(b + 16, dst, 4);
	b[20] = (uint8_t)(sport >> 8);
	b[21] = (uint8_t)sport;
	b[22] = (uint8_t)(dport >> 8);
	b[23] = (uint8_t)dport;
	return 28;
}

static const uint8_t LOCAL[4] = { 10, 0, 2, 15 }, INET[4] = { 198, 51, 100, 7 };

/* A packet message with the payload (and prefix when not NULL). */
static void packet_msg(struct out *o, const uint8_t *ip, size_t n, const char *prefix)
{
	msg_begin(o, PKT_TYPE);
	nfgen(o);
	static const uint8_t hw[4] = { 0x08, 0x00, 3, 0 };	/* NFULA_PACKET_HDR: hw_protocol, hook */
	attr(o, NFULA_PACKET_HDR, hw, sizeof(hw));
	if (prefix)
		attr(o, NFULA_PREFIX, prefix, strlen(prefix) + 1);
	uint32_t uid = htonl(1000);
	attr(o, NFULA_UID, &uid, sizeof(uid));
	attr(o, NFULA_PAYLOAD, ip, n);
	msg_end(o);
}

static void tcp_msg(struct out *o, uint16_t dport, const char *prefix)
{
	uint8_t ip[28];
	packet_msg(o, ip, ipv4(ip, IPPROTO_TCP, LOCAL, INET, 40000, dport), prefix);
}

/* ---- collecting -------------------------------------------------------- */

struct got {
	struct cap_nflog_pkt p[16];
	int n;
};

static void collect(void *ud, const struct cap_nflog_pkt *p)
{
	struct got *g = ud;
	assert_true(g->n < 16);
	g->p[g->n++] = *p;
}

static int parse(const struct out *o, struct got *g)
{
	memset(g, 0, sizeof(*g));
	/* A copy of exactly the bytes given, so ASan sees any overread. */
	uint8_t *b = malloc(o->n ? o->n : 1);
	assert_non_null(b);
	memcpy(b, o->b, o->n);
	int r = cap_nflog_parse(b, o->n, collect, g);
	free(b);
	return r;
}

/* ---- tests ------------------------------------------------------------- */

static void test_tcp(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	tcp_msg(&o, 80, "capsule deny");
	assert_int_equal(parse(&o, &g), 1);
	assert_int_equal(g.p[0].version, 4);
	assert_int_equal(g.p[0].proto, IPPROTO_TCP);
	assert_int_equal(g.p[0].saddr, 0x0a00020fu);
	assert_int_equal(g.p[0].daddr, 0xc6336407u);
	assert_int_equal(g.p[0].sport, 40000);
	assert_int_equal(g.p[0].dport, 80);
	assert_int_equal(g.p[0].icmp_type, 0);
	assert_string_equal(g.p[0].prefix, "capsule deny");
}

/* A message as this kernel (6.18) sent it for QEMU's connection to a
 * denied 198.51.100.7:80 (engine-dev's capture): the SYN whole, shorter
 * than the copy range; the source is the destination, every address being
 * local in the VM's namespace. */
static void test_literal(void **state)
{
	(void)state;
	static const uint8_t m[] = {
		/* nlmsghdr: 136 bytes, ULOG PACKET */
		0x88, 0x00, 0x00, 0x00, 0x00, 0x04, 0x00, 0x00, 0x00, 0x00,
		0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
		/* nfgenmsg: AF_INET, v0, group 1 */
		0x02, 0x00, 0x00, 0x01,
		/* PACKET_HDR: 0x0800, hook 3 (output) */
		0x08, 0x00, 0x01, 0x00, 0x08, 0x00, 0x03, 0x00,
		/* PREFIX "capsule reset" */
		0x12, 0x00, 0x0a, 0x00, 0x63, 0x61, 0x70, 0x73, 0x75, 0x6c,
		0x65, 0x20, 0x72, 0x65, 0x73, 0x65, 0x74, 0x00, 0x00, 0x00,
		/* IFINDEX_OUTDEV 1 (lo) */
		0x08, 0x00, 0x05, 0x00, 0x00, 0x00, 0x00, 0x01,
		/* UID 1900000001 */
		0x08, 0x00, 0x0b, 0x00, 0x71, 0x3f, 0xb3, 0x01,
		/* GID 1900000001 */
		0x08, 0x00, 0x0e, 0x00, 0x71, 0x3f, 0xb3, 0x01,
		/* PAYLOAD, 60 bytes: */
		0x40, 0x00, 0x09, 0x00,
		/* IPv4, TCP, 198.51.100.7 > 198.51.100.7 */
		0x45, 0x00, 0x00, 0x3c, 0x78, 0x62, 0x40, 0x00, 0x40, 0x06,
		0x6d, 0xe4, 0xc6, 0x33, 0x64, 0x07, 0xc6, 0x33, 0x64, 0x07,
		/* TCP 57762 > 80, SYN */
		0xe1, 0xa2, 0x00, 0x50, 0xd0, 0xdf, 0xc2, 0x90, 0x00, 0x00,
		0x00, 0x00, 0xa0, 0x02, 0xff, 0xd7, 0x54, 0xa4, 0x00, 0x00,
		/* its options */
		0x02, 0x04, 0xff, 0xd7, 0x04, 0x02, 0x08, 0x0a, 0xde, 0xb0,
		0x95, 0xd7, 0x00, 0x00, 0x00, 0x00, 0x01, 0x03, 0x03, 0x0a,
	};
	struct got g = { .n = 0 };
	assert_int_equal(sizeof(m), 136);
	assert_int_equal(cap_nflog_parse(m, sizeof(m), collect, &g), 1);
	assert_int_equal(g.p[0].version, 4);
	assert_int_equal(g.p[0].proto, IPPROTO_TCP);
	assert_int_equal(g.p[0].saddr, 0xc6336407u);
	assert_int_equal(g.p[0].daddr, 0xc6336407u);
	assert_int_equal(g.p[0].sport, 57762);
	assert_int_equal(g.p[0].dport, 80);
	assert_string_equal(g.p[0].prefix, "capsule reset");
}

static void test_udp_icmp_other(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	uint8_t ip[28];
	packet_msg(&o, ip, ipv4(ip, IPPROTO_UDP, LOCAL, INET, 5353, 9999), NULL);
	size_t n = ipv4(ip, IPPROTO_ICMP, LOCAL, INET, 0, 0);
	ip[20] = 8;	/* echo request */
	packet_msg(&o, ip, n, NULL);
	packet_msg(&o, ip, ipv4(ip, 47 /* GRE */, LOCAL, INET, 1, 2), NULL);
	assert_int_equal(parse(&o, &g), 3);
	assert_int_equal(g.p[0].proto, IPPROTO_UDP);
	assert_int_equal(g.p[0].sport, 5353);
	assert_int_equal(g.p[0].dport, 9999);
	assert_int_equal(g.p[1].proto, IPPROTO_ICMP);
	assert_int_equal(g.p[1].icmp_type, 8);
	assert_int_equal(g.p[1].dport, 0);
	assert_int_equal(g.p[2].proto, 47);
	assert_int_equal(g.p[2].sport, 0);
	assert_int_equal(g.p[2].dport, 0);
	assert_int_equal(g.p[2].daddr, 0xc6336407u);
}

/* Several packets, an acknowledgement, a NOOP, another subsystem's message
 * and NLMSG_DONE in one buffer: only the packets count. */
static void test_multi(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	tcp_msg(&o, 80, NULL);
	msg_begin(&o, NLMSG_ERROR);
	int32_t ack[5] = { 0 };
	put(&o, ack, sizeof(ack));
	msg_end(&o);
	msg_begin(&o, NLMSG_NOOP);
	msg_end(&o);
	msg_begin(&o, NFNL_SUBSYS_QUEUE << 8 | 0);
	nfgen(&o);
	msg_end(&o);
	tcp_msg(&o, 443, "b");
	tcp_msg(&o, 22, "c");
	msg_begin(&o, NLMSG_DONE);
	int32_t zero = 0;
	put(&o, &zero, sizeof(zero));
	msg_end(&o);
	assert_int_equal(parse(&o, &g), 3);
	assert_int_equal(g.p[0].dport, 80);
	assert_int_equal(g.p[1].dport, 443);
	assert_string_equal(g.p[1].prefix, "b");
	assert_int_equal(g.p[2].dport, 22);
	assert_string_equal(g.p[2].prefix, "c");
}

static void test_empty(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	assert_int_equal(parse(&o, &g), 0);
	assert_int_equal(g.n, 0);
}

/* An NLMSG_ERROR with an error code: reported, after what came before. */
static void test_error(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	tcp_msg(&o, 80, NULL);
	msg_begin(&o, NLMSG_ERROR);
	int32_t e[5] = { -EPERM };
	put(&o, e, sizeof(e));
	msg_end(&o);
	tcp_msg(&o, 81, NULL);
	assert_int_equal(parse(&o, &g), -EPERM);
	assert_int_equal(g.n, 1);
	assert_int_equal(g.p[0].dport, 80);

	/* An error message too short for its code. */
	o.n = 0;
	msg_begin(&o, NLMSG_ERROR);
	put(&o, "\xff\xff", 2);
	msg_end(&o);
	assert_int_equal(parse(&o, &g), -EBADMSG);
}

/* Broken framing: the packets before are delivered, the rest skipped. */
static void test_framing(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	tcp_msg(&o, 80, NULL);
	size_t first = o.n;
	tcp_msg(&o, 81, NULL);

	/* Cut inside the second message's header and inside its body. */
	struct out cut = o;
	cut.n = first + 10;
	assert_int_equal(parse(&cut, &g), -EBADMSG);
	assert_int_equal(g.n, 1);
	cut.n = o.n - 8;
	assert_int_equal(parse(&cut, &g), -EBADMSG);
	assert_int_equal(g.n, 1);

	/* A length below the header's, and one past the buffer. */
	uint32_t bad = 8;
	cut = o;
	memcpy(cut.b + first, &bad, 4);
	assert_int_equal(parse(&cut, &g), -EBADMSG);
	assert_int_equal(g.n, 1);
	bad = 100000;
	memcpy(cut.b, &bad, 4);
	assert_int_equal(parse(&cut, &g), -EBADMSG);
	assert_int_equal(g.n, 0);

	/* Every truncation of a sound buffer: no overread (ASan), never more
	 * packets than whole messages, and an error unless the cut falls on a
	 * boundary. */
	for (size_t n = 0; n <= o.n; n++) {
		cut = o;
		cut.n = n;
		int r = parse(&cut, &g);
		if (n == 0 || n == first || n == o.n)
			assert_int_equal(r, n == 0 ? 0 : n == first ? 1 : 2);
		else
			assert_int_equal(r, -EBADMSG);
		assert_true(g.n <= (n >= o.n ? 2 : n >= first ? 1 : 0));
	}
}

/* A packet message whose attributes are broken is skipped (and reported);
 * the sound messages around it are still delivered. */
static void test_bad_attrs(void **state)
{
	(void)state;
	struct got g;
	for (int k = 0; k < 4; k++) {
		struct out o = { .n = 0 };
		tcp_msg(&o, 80, NULL);
		msg_begin(&o, PKT_TYPE);
		nfgen(&o);
		uint16_t h[2];
		switch (k) {
		case 0:	/* attribute length below its header */
			h[0] = 2;
			h[1] = NFULA_PAYLOAD;
			put(&o, h, sizeof(h));
			break;
		case 1:	/* attribute running past its message */
			h[0] = 200;
			h[1] = NFULA_PAYLOAD;
			put(&o, h, sizeof(h));
			put(&o, "\x45\0\0\x3c", 4);
			break;
		case 2:	/* no payload */
			attr(&o, NFULA_PREFIX, "x", 2);
			break;
		case 3:	/* no room for the nfgenmsg */
			o.n -= 4;
			break;
		}
		msg_end(&o);
		tcp_msg(&o, 82, NULL);
		assert_int_equal(parse(&o, &g), -EBADMSG);
		assert_int_equal(g.n, 2);
		assert_int_equal(g.p[0].dport, 80);
		assert_int_equal(g.p[1].dport, 82);
	}
}

static void test_bad_ip(void **state)
{
	(void)state;
	struct got g;
	uint8_t ip[28];
	for (int k = 0; k < 6; k++) {
		struct out o = { .n = 0 };
		size_t n = ipv4(ip, IPPROTO_TCP, LOCAL, INET, 1, 2);
		switch (k) {
		case 0: ip[0] = 0x55; break;	/* version 5 */
		case 1: ip[0] = 0x44; break;	/* IHL below 5 */
		case 2: ip[0] = 0x48; n = 28; break;	/* IHL 32 bytes, 28 copied */
		case 3: ip[3] = 16; break;	/* total length below the header */
		case 4: n = 19; break;	/* shorter than any IPv4 header */
		case 5: n = 0; break;	/* empty payload */
		}
		packet_msg(&o, ip, n, NULL);
		assert_int_equal(parse(&o, &g), -EBADMSG);
		assert_int_equal(g.n, 0);
	}
}

/* Options: the ports follow the whole header, when they were copied. */
static void test_options_and_fragments(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	uint8_t ip[CAP_NFLOG_COPY_RANGE];
	memset(ip, 1, sizeof(ip));	/* options: NOPs */
	ipv4(ip, IPPROTO_UDP, LOCAL, INET, 0, 0);
	ip[0] = 0x4f;	/* 60-byte header */
	ip[3] = 100;
	ip[60] = 0x12, ip[61] = 0x34, ip[62] = 0x27, ip[63] = 0x0f;
	packet_msg(&o, ip, sizeof(ip), NULL);
	packet_msg(&o, ip, 62, NULL);	/* copy cut in the ports */
	assert_int_equal(parse(&o, &g), 2);
	assert_int_equal(g.p[0].sport, 0x1234);
	assert_int_equal(g.p[0].dport, 9999);
	assert_int_equal(g.p[1].proto, IPPROTO_UDP);
	assert_int_equal(g.p[1].dport, 0);

	/* A later fragment carries no transport header; nor does a packet
	 * whose total length ends with its IP header. */
	o.n = 0;
	size_t n = ipv4(ip, IPPROTO_TCP, LOCAL, INET, 7, 8);
	ip[6] = 0x00, ip[7] = 0x10;
	packet_msg(&o, ip, n, NULL);
	n = ipv4(ip, IPPROTO_TCP, LOCAL, INET, 7, 8);
	ip[3] = 20;
	packet_msg(&o, ip, n, NULL);
	assert_int_equal(parse(&o, &g), 2);
	assert_int_equal(g.p[0].dport, 0);
	assert_int_equal(g.p[0].daddr, 0xc6336407u);
	assert_int_equal(g.p[1].dport, 0);
}

/* QEMU's stand-in for a guest's ping: UDP to port 7 with libslirp's text,
 * and only that (another port, other bytes, a copy cut short). */
static void test_slirp_ping(void **state)
{
	(void)state;
	static const char text[] = "This is a pseudo-PING packet used by Slirp to emulate ICMP ECHO-REQUEST packets.\n";
	uint8_t ip[CAP_NFLOG_COPY_RANGE];
	struct out o = { .n = 0 };
	struct got g;
	ipv4(ip, IPPROTO_UDP, LOCAL, INET, 40000, 7);
	ip[3] = (uint8_t)(28 + sizeof(text) - 1);
	memcpy(ip + 28, text, sizeof(ip) - 28);
	packet_msg(&o, ip, sizeof(ip), NULL);
	packet_msg(&o, ip, 28 + 20, NULL);	/* cut before the text's 21st byte */
	ip[23] = 9;
	packet_msg(&o, ip, sizeof(ip), NULL);	/* port 9 */
	ip[23] = 7;
	ip[30] = 'X';
	packet_msg(&o, ip, sizeof(ip), NULL);	/* other bytes */
	assert_int_equal(parse(&o, &g), 4);
	assert_true(g.p[0].slirp_ping);
	assert_false(g.p[1].slirp_ping);
	assert_false(g.p[2].slirp_ping);
	assert_false(g.p[3].slirp_ping);

	struct cap_net_policy pol;
	char line[256];
	cap_net_policy_init(&pol);
	assert_string_equal(cap_nflog_describe(&g.p[0], &pol, NULL, 0, line, sizeof(line)),
			    "dropped icmp 198.51.100.7 (type 8, sent by QEMU as UDP to port 7): ICMP never leaves the sandbox");
	assert_string_equal(cap_nflog_describe(&g.p[3], &pol, NULL, 0, line, sizeof(line)),
			    "dropped udp 198.51.100.7:7: only DNS to 10.0.2.3 leaves the sandbox over UDP");
}

static void test_ipv6(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	uint8_t ip[40] = { 0x60 };
	ip[6] = IPPROTO_UDP;
	packet_msg(&o, ip, sizeof(ip), NULL);
	packet_msg(&o, ip, 39, NULL);
	assert_int_equal(parse(&o, &g), -EBADMSG);
	assert_int_equal(g.n, 1);
	assert_int_equal(g.p[0].version, 6);
	assert_int_equal(g.p[0].proto, IPPROTO_UDP);
	assert_int_equal(g.p[0].daddr, 0);
}

/* Prefixes: unterminated, too long, with control characters, and an
 * attribute type carrying the byte-order flag. */
static void test_prefix(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	uint8_t ip[28];
	size_t n = ipv4(ip, IPPROTO_TCP, LOCAL, INET, 1, 2);

	msg_begin(&o, PKT_TYPE);
	nfgen(&o);
	attr(&o, NFULA_PREFIX, "abc", 3);	/* no NUL */
	attr(&o, NFULA_PAYLOAD | NLA_F_NET_BYTEORDER, ip, n);
	msg_end(&o);

	char longp[100];
	memset(longp, 'x', sizeof(longp) - 1);
	longp[sizeof(longp) - 1] = '\0';
	packet_msg(&o, ip, n, longp);
	packet_msg(&o, ip, n, "a\nb\x7f");
	assert_int_equal(parse(&o, &g), 3);
	assert_string_equal(g.p[0].prefix, "abc");
	assert_int_equal(g.p[0].dport, 2);
	assert_int_equal(strlen(g.p[1].prefix), 63);
	assert_string_equal(g.p[2].prefix, "a?b?");
}

/* The last message and its last attribute without trailing padding. */
static void test_unpadded_end(void **state)
{
	(void)state;
	struct out o = { .n = 0 };
	struct got g;
	uint8_t ip[28];
	size_t n = ipv4(ip, IPPROTO_UDP, LOCAL, INET, 1, 53);
	packet_msg(&o, ip, n - 1, NULL);	/* 27 bytes: one of padding follows */
	o.n--;
	uint32_t len = (uint32_t)(o.n - o.msg);
	memcpy(o.b + o.msg, &len, sizeof(len));
	assert_int_equal(parse(&o, &g), 1);
	assert_int_equal(g.p[0].dport, 53);
}

/* ---- the log lines ----------------------------------------------------- */

static struct cap_net_policy *policy_of(const char *flag, const char *value)
{
	struct cap_net_policy *p = malloc(sizeof(*p));
	struct cap_err err = { 0 };
	assert_non_null(p);
	cap_net_policy_init(p);
	if (flag && cap_net_policy_apply(p, flag, value, &err) < 0)
		fail_msg("%s %s: %s", flag, value ? value : "", err.msg);
	return p;
}

static struct cap_nflog_pkt pkt(uint8_t proto, uint32_t daddr, uint16_t dport, const char *prefix)
{
	struct cap_nflog_pkt p = { .version = 4, .proto = proto, .saddr = daddr, .daddr = daddr,
				   .sport = 40000, .dport = dport };
	snprintf(p.prefix, sizeof(p.prefix), "%s", prefix);
	return p;
}

static void test_describe(void **state)
{
	(void)state;
	struct cap_net_policy *pol = policy_of("allow-egress", "203.0.113.10");
	char line[512];
	struct cap_nflog_pkt p = pkt(IPPROTO_TCP, 0xc6336407u, 80, CAP_NFLOG_PREFIX_RESET);
	struct cap_net_verdict v;
	cap_net_decide(pol, 0xc6336407u, 80, NULL, &v);
	char want[600];
	snprintf(want, sizeof(want), "refused tcp 198.51.100.7:80: %s", v.rule);
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)), want);
	assert_false(v.allow);
	assert_true(strlen(v.rule) > 0);

	p = pkt(IPPROTO_UDP, 0xcb00710au, 9999, CAP_NFLOG_PREFIX_DROP);
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "dropped udp 203.0.113.10:9999: only DNS to 10.0.2.3 leaves the sandbox over UDP");
	p = pkt(IPPROTO_ICMP, 0xcb00710au, 0, CAP_NFLOG_PREFIX_DROP);
	p.icmp_type = 8;
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "dropped icmp 203.0.113.10 (type 8): ICMP never leaves the sandbox");
	p = pkt(47, 0xcb00710au, 0, CAP_NFLOG_PREFIX_DROP);
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "dropped ip proto 47 to 203.0.113.10: only TCP and DNS leave the sandbox");
	p = pkt(IPPROTO_TCP, 0xcb00710au, 443, CAP_NFLOG_PREFIX_DROP);
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "dropped tcp 203.0.113.10:443: not part of a connection the policy process accepted");
	p = (struct cap_nflog_pkt){ .version = 6, .proto = IPPROTO_UDP };
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "dropped ipv6 packet (next header 17): IPv6 never leaves the sandbox");

	/* Reset for an address the policy allows now: a change was racing. */
	p = pkt(IPPROTO_TCP, 0xcb00710au, 80, CAP_NFLOG_PREFIX_RESET);
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, sizeof(line)),
			    "refused tcp 203.0.113.10:80: its range was denied when it was sent (the policy allows it now)");

	/* Truncated to the buffer, NUL-terminated; nothing written at size 0. */
	p = pkt(IPPROTO_UDP, 0xcb00710au, 9999, "");
	assert_string_equal(cap_nflog_describe(&p, pol, NULL, 0, line, 12), "dropped udp");
	line[0] = 'x';
	cap_nflog_describe(&p, pol, NULL, 0, line, 0);
	assert_int_equal(line[0], 'x');
	free(pol);
}

/* The names the guest was answered the address with count, as for a
 * connection: a name rule refusing the address names it. */
static void test_describe_names(void **state)
{
	(void)state;
	struct cap_net_policy *pol = policy_of("allow-egress", "api.example.com:443");
	char line[512], want[600];
	const char *names[] = { "evil.example", "api.example.com" };
	struct cap_nflog_pkt p = pkt(IPPROTO_TCP, 0x0a010203u, 443, CAP_NFLOG_PREFIX_RESET);
	struct cap_net_verdict v;
	cap_net_decide(pol, 0x0a010203u, 443, "evil.example", &v);
	assert_false(v.allow);
	snprintf(want, sizeof(want), "refused tcp 10.1.2.3:443: %s", v.rule);
	assert_string_equal(cap_nflog_describe(&p, pol, names, 2, line, sizeof(line)), want);
	free(pol);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tcp),
		cmocka_unit_test(test_literal),
		cmocka_unit_test(test_udp_icmp_other),
		cmocka_unit_test(test_multi),
		cmocka_unit_test(test_empty),
		cmocka_unit_test(test_error),
		cmocka_unit_test(test_framing),
		cmocka_unit_test(test_bad_attrs),
		cmocka_unit_test(test_bad_ip),
		cmocka_unit_test(test_options_and_fragments),
		cmocka_unit_test(test_slirp_ping),
		cmocka_unit_test(test_ipv6),
		cmocka_unit_test(test_prefix),
		cmocka_unit_test(test_unpadded_end),
		cmocka_unit_test(test_describe),
		cmocka_unit_test(test_describe_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
