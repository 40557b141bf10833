/* NFLOG messages from the kernel (nflog.h). Netlink headers are in host
 * order, IP headers in network order; nothing here trusts a length it
 * has not checked against the bytes it holds. */
#include <errno.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/netlink.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "nflog.h"
#include "policy.h"

#define NLMSG_HDR 16u	/* struct nlmsghdr */
#define NFGEN_HDR 4u	/* struct nfgenmsg */
#define NLA_HDR 4u	/* struct nlattr */
#define ALIGN4(n) (((n) + 3u) & ~(size_t)3u)
/* The start of libslirp's stand-in for an echo request (slirp/src/ip_icmp.c). */
#define SLIRP_PING "This is a pseudo-PING"
#define ECHO_PORT 7

static uint16_t get16(const uint8_t *p)
{
	uint16_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint32_t get32(const uint8_t *p)
{
	uint32_t v;
	memcpy(&v, p, sizeof(v));
	return v;
}

static uint16_t be16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

static uint32_t be32(const uint8_t *p)
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* The IP header at the start of the copied packet into p: 0, or -EBADMSG
 * when it is no sound IPv4 or IPv6 header. */
static int decode_ip(const uint8_t *ip, size_t len, struct cap_nflog_pkt *p)
{
	if (len < 1)
		return -EBADMSG;
	unsigned version = ip[0] >> 4;
	if (version == 6) {
		if (len < 40)
			return -EBADMSG;
		p->version = 6;
		p->proto = ip[6];
		return 0;
	}
	if (version != 4 || len < 20)
		return -EBADMSG;
	size_t ihl = (size_t)(ip[0] & 0x0f) * 4;
	size_t total = be16(ip + 2);
	if (ihl < 20 || ihl > len || total < ihl)
		return -EBADMSG;
	p->version = 4;
	p->proto = ip[9];
	p->saddr = be32(ip + 12);
	p->daddr = be32(ip + 16);
	/* Only the first fragment carries the transport header. */
	if (be16(ip + 6) & 0x1fff)
		return 0;
	const uint8_t *l4 = ip + ihl;
	size_t l4len = (len < total ? len : total) - ihl;
	switch (p->proto) {
	case IPPROTO_TCP:
	case IPPROTO_UDP:
		if (l4len >= 4) {
			p->sport = be16(l4);
			p->dport = be16(l4 + 2);
		}
		p->slirp_ping = p->proto == IPPROTO_UDP && p->dport == ECHO_PORT &&
				l4len >= 8 + strlen(SLIRP_PING) &&
				memcmp(l4 + 8, SLIRP_PING, strlen(SLIRP_PING)) == 0;
		break;
	case IPPROTO_ICMP:
		if (l4len >= 1)
			p->icmp_type = l4[0];
		break;
	default:
		break;
	}
	return 0;
}

/* The prefix attribute (a NUL-terminated string, maybe not terminated
 * within its bytes), control characters replaced. */
static void copy_prefix(char out[64], const uint8_t *s, size_t len)
{
	size_t n = 0;
	while (n < len && n < 63 && s[n]) {
		out[n] = s[n] < 0x20 || s[n] == 0x7f ? '?' : (char)s[n];
		n++;
	}
	out[n] = '\0';
}

/* The attributes of one NFULNL_MSG_PACKET message (after its nfgenmsg):
 * 1 and *p filled when it holds a sound packet, -EBADMSG otherwise. */
static int packet(const uint8_t *a, size_t len, struct cap_nflog_pkt *p)
{
	const uint8_t *payload = NULL;
	size_t payload_len = 0;
	memset(p, 0, sizeof(*p));
	while (len >= NLA_HDR) {
		size_t alen = get16(a);
		unsigned type = get16(a + 2) & NLA_TYPE_MASK;
		if (alen < NLA_HDR || alen > len)
			return -EBADMSG;
		if (type == NFULA_PAYLOAD && !payload) {
			payload = a + NLA_HDR;
			payload_len = alen - NLA_HDR;
		} else if (type == NFULA_PREFIX) {
			copy_prefix(p->prefix, a + NLA_HDR, alen - NLA_HDR);
		}
		/* The last attribute may lack its padding. */
		size_t step = ALIGN4(alen);
		if (step >= len)
			break;
		a += step;
		len -= step;
	}
	if (!payload)
		return -EBADMSG;
	return decode_ip(payload, payload_len, p) < 0 ? -EBADMSG : 1;
}

int cap_nflog_parse(const uint8_t *buf, size_t len,
		    void (*cb)(void *ud, const struct cap_nflog_pkt *p), void *ud)
{
	int delivered = 0;
	bool bad = false;
	while (len > 0) {
		if (len < NLMSG_HDR)
			return -EBADMSG;
		size_t mlen = get32(buf);
		unsigned type = get16(buf + 4);
		if (mlen < NLMSG_HDR || mlen > len)
			return -EBADMSG;
		const uint8_t *body = buf + NLMSG_HDR;
		size_t blen = mlen - NLMSG_HDR;
		if (type == NLMSG_ERROR) {
			if (blen < sizeof(int32_t))
				return -EBADMSG;
			int32_t e = (int32_t)get32(body);
			if (e < 0)
				return e;	/* -errno as the kernel put it */
		} else if (type == (NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_PACKET)) {
			struct cap_nflog_pkt p;
			if (blen < NFGEN_HDR || packet(body + NFGEN_HDR, blen - NFGEN_HDR, &p) < 0) {
				bad = true;
			} else {
				cb(ud, &p);
				delivered++;
			}
		}
		size_t step = ALIGN4(mlen);
		if (step >= len)
			break;
		buf += step;
		len -= step;
	}
	return bad ? -EBADMSG : delivered;
}

const char *cap_nflog_describe(const struct cap_nflog_pkt *pkt, const struct cap_net_policy *policy,
			       const char *const *names, unsigned nnames, char *out, size_t size)
{
	char a[16], dns[16];
	if (size == 0)
		return out;
	if (pkt->version != 4) {
		snprintf(out, size, "dropped ipv6 packet (next header %u): IPv6 never leaves the sandbox",
			 pkt->proto);
		return out;
	}
	cap_net_addr_str(pkt->daddr, a);
	switch (pkt->proto) {
	case IPPROTO_TCP:
		if (strcmp(pkt->prefix, CAP_NFLOG_PREFIX_DROP) == 0) {
			snprintf(out, size, "dropped tcp %s:%u: not part of a connection the policy process accepted",
				 a, pkt->dport);
			return out;
		}
		/* As the policy process decides a connection: each name the
		 * address was given under, else the address alone. */
		struct cap_net_verdict v;
		bool allowed = false;
		for (unsigned i = 0; i < nnames && !allowed; i++) {
			cap_net_decide(policy, pkt->daddr, pkt->dport, names[i], &v);
			allowed = v.allow;
		}
		if (!allowed)
			cap_net_decide(policy, pkt->daddr, pkt->dport, nnames ? names[0] : NULL, &v);
		if (v.allow)	/* the kernel's ranges were those of the policy before a change */
			snprintf(out, size, "refused tcp %s:%u: its range was denied when it was sent "
				 "(the policy allows it now)", a, pkt->dport);
		else
			snprintf(out, size, "refused tcp %s:%u: %s", a, pkt->dport, v.rule);
		return out;
	case IPPROTO_UDP:
		if (pkt->slirp_ping) {
			snprintf(out, size, "dropped icmp %s (type 8, sent by QEMU as UDP to port %u): "
				 "ICMP never leaves the sandbox", a, ECHO_PORT);
			return out;
		}
		snprintf(out, size, "dropped udp %s:%u: only DNS to %s leaves the sandbox over UDP", a, pkt->dport,
			 cap_net_addr_str(CAP_NET_DNS, dns));
		return out;
	case IPPROTO_ICMP:
		snprintf(out, size, "dropped icmp %s (type %u): ICMP never leaves the sandbox", a, pkt->icmp_type);
		return out;
	default:
		snprintf(out, size, "dropped ip proto %u to %s: only TCP and DNS leave the sandbox", pkt->proto, a);
		return out;
	}
}
