/* netd: DNS. The guest's queries arrive on cfg->dns; names the policy
 * allows go to the host's resolver (the first IPv4 nameserver of
 * resolv.conf) under an ID of ours, with one retry; the A records of the
 * answers are remembered (address -> name) for the decisions on later
 * connections. The HTTP proxy resolves its targets' names here too. */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netd-int.h"
#include "sniff.h"
#include "util.h"

#define GUEST_BATCH 64	/* datagrams read per wake-up, for fairness */

/* The first "nameserver A.B.C.D" of the file at path. */
static int read_resolv_conf(const char *path, uint32_t *out)
{
	char *text = NULL;
	ssize_t n = cap_read_file(path, 1 << 16, &text);

	if (n < 0)
		return (int)n;
	int r = -ENOENT;
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
	     line = strtok_r(NULL, "\n", &save)) {
		char key[16], val[64];
		if (sscanf(line, " %15s %63s", key, val) == 2 && !strcmp(key, "nameserver") &&
		    cap_net_addr_parse(val, out)) {
			r = 0;
			break;
		}
	}
	free(text);
	return r;
}

int dns_init(struct netd *d)
{
	const char *path = d->cfg->resolv_conf ? d->cfg->resolv_conf : "/etc/resolv.conf";
	uint32_t ns;

	d->resolver = -1;
	d->owned_dgram = xmalloc(NETD_DGRAM_MAX);
	int r = read_resolv_conf(path, &ns);
	if (r < 0) {
		snprintf(d->resolver_problem, sizeof(d->resolver_problem), "no IPv4 nameserver in %s (%s)",
			 path, r == -ENOENT ? "none listed" : strerror(-r));
		return 0;
	}
	char a[16];
	snprintf(d->resolver_text, sizeof(d->resolver_text), "%s:53", cap_net_addr_str(ns, a));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(53),
				  .sin_addr.s_addr = htonl(ns) };
	int fd = socket(AF_INET, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		snprintf(d->resolver_problem, sizeof(d->resolver_problem), "cannot use the resolver %s: %s",
			 d->resolver_text, strerror(errno));
		if (fd >= 0)
			close(fd);
		return 0;
	}
	d->resolver = fd;
	return 0;
}

/* A query needs the resolver and there is none: say why, once. */
static void resolver_missing(struct netd *d)
{
	if (d->resolver_problem_said)
		return;
	d->resolver_problem_said = true;
	netd_log(d, "%s: every allowed DNS query is answered SERVFAIL", d->resolver_problem);
}

void dns_fini(struct netd *d)
{
	if (d->resolver >= 0)
		close(d->resolver);
	d->resolver = -1;
	free(d->owned_dgram);
	d->owned_dgram = NULL;
}

/* ---- address -> name --------------------------------------------------- */

static void remember(struct netd *d, uint32_t addr, const char *name, uint32_t ttl)
{
	int64_t now = cap_now_ms();
	struct dns_name *slot = NULL;

	ttl = CAP_MAX(ttl, NETD_NAME_TTL_MIN);
	ttl = CAP_MIN(ttl, NETD_NAME_TTL_MAX);
	for (unsigned i = 0; i < NETD_NAMES; i++) {
		struct dns_name *e = &d->names[i];
		bool live = e->expires > now;
		if (live && e->addr == addr && !strcmp(e->name, name)) {
			slot = e;
			break;
		}
		if (!live) {
			if (!slot || slot->expires > now)
				slot = e;
		} else if (!slot || (slot->expires > now && e->seq < slot->seq)) {
			slot = e;
		}
	}
	slot->addr = addr;
	slot->expires = now + (int64_t)ttl * 1000;
	slot->seq = ++d->name_seq;
	size_t l = strnlen(name, sizeof(slot->name) - 1);
	memcpy(slot->name, name, l);
	slot->name[l] = '\0';
}

unsigned dns_names_for(struct netd *d, uint32_t addr, const char **out, unsigned max)
{
	int64_t now = cap_now_ms();
	const struct dns_name *found[8];
	unsigned n = 0;

	max = CAP_MIN(max, CAP_ARRAY_SIZE(found));
	if (!max)
		return 0;
	for (unsigned i = 0; i < NETD_NAMES; i++) {
		const struct dns_name *e = &d->names[i];
		if (e->expires <= now || e->addr != addr)
			continue;
		/* Keep the newest max, newest first. */
		unsigned j = n < max ? n++ : max;
		if (j == max && e->seq < found[max - 1]->seq)
			continue;
		if (j == max)
			j = max - 1;
		while (j > 0 && found[j - 1]->seq < e->seq) {
			found[j] = found[j - 1];
			j--;
		}
		found[j] = e;
	}
	for (unsigned i = 0; i < n; i++)
		out[i] = found[i]->name;
	return n;
}

/* ---- upstream queries ---------------------------------------------------- */

static uint16_t random_id(void)
{
	static uint32_t x;
	uint16_t id;

	if (getrandom(&id, sizeof(id), GRND_NONBLOCK) == sizeof(id))
		return id;
	/* No entropy call (a seccomp filter): xorshift from the clock. */
	if (!x)
		x = (uint32_t)cap_now_ns() | 1;
	x ^= x << 13;
	x ^= x >> 17;
	x ^= x << 5;
	return (uint16_t)x;
}

static struct dns_pending *pending_new(struct netd *d)
{
	struct dns_pending *free_slot = NULL;
	uint16_t id;

	for (unsigned i = 0; i < NETD_DNS_PENDING && !free_slot; i++)
		if (!d->pending[i].used)
			free_slot = &d->pending[i];
	if (!free_slot)
		return NULL;
	/* An ID no other query in flight has. */
	for (bool taken = true; taken;) {
		id = random_id();
		taken = false;
		for (unsigned i = 0; i < NETD_DNS_PENDING; i++)
			if (d->pending[i].used && d->pending[i].up_id == id)
				taken = true;
	}
	memset(free_slot, 0, offsetof(struct dns_pending, msg));
	free_slot->used = true;
	free_slot->up_id = id;
	return free_slot;
}

static void pending_send(struct netd *d, struct dns_pending *p)
{
	p->tries++;
	p->deadline = cap_now_ms() + NETD_DNS_TRY_MS;
	/* A failure here (buffer full, ICMP error pending) is a lost datagram:
	 * the retry or the timeout handles it. */
	if (send(d->resolver, p->msg, p->len, MSG_DONTWAIT) < 0 && errno != EAGAIN &&
	    errno != ECONNREFUSED && errno != EINTR)
		netd_log(d, "cannot query the resolver %s: %s", d->resolver_text, strerror(errno));
}

/* A reply to the guest: a datagram back to its sender, or one message on
 * its TCP connection. */
static void client_send(struct netd *d, const struct dns_client *to, const uint8_t *m,
			size_t len)
{
	if (!to->tcp) {
		sendto(d->cfg->dns, m, len, MSG_DONTWAIT, (const struct sockaddr *)&to->udp,
		       sizeof(to->udp));
		return;
	}
	struct conn *c = conn_find(d, to->conn_slot, to->conn_id);
	if (c && c->kind == CONN_DNS)
		conn_dns_reply(d, c, m, len);
}

/* No answer for this query: over TCP the connection waits for one, so
 * it ends (after what it was sent already); a datagram is just dropped. */
static void client_drop(struct netd *d, const struct dns_client *to)
{
	if (!to->tcp)
		return;
	struct conn *c = conn_find(d, to->conn_slot, to->conn_id);
	if (c && c->kind == CONN_DNS)
		conn_dns_reply(d, c, NULL, 0);
}

/* Answer a guest's query with rcode only. */
static void reply_rcode(struct netd *d, const uint8_t *query, size_t len,
			const struct cap_dns_question *q, unsigned rcode,
			const struct dns_client *to)
{
	uint8_t out[NETD_DNS_QUERY_MAX];
	ssize_t n = cap_dns_build_reply(query, len, q, rcode, out, sizeof(out));

	if (n > 0)
		client_send(d, to, out, (size_t)n);
	else
		client_drop(d, to);
}

/* Why a query is refused as malformed (FORMERR), or NULL. The upstream
 * query is built anew from the parsed question, so what netd reads is
 * what the resolver reads; a question written with a compression pointer
 * (into the header, whose ID netd rewrites) or sections a query never
 * carries are refused rather than read one way here and another there. */
static const char *query_shape_problem(const struct cap_dns_question *q)
{
	if (q->compressed)
		return "its question's name uses compression";
	if (q->ancount || q->nscount)
		return "it carries answer or authority records";
	if (q->arcount > 1)
		return "it carries more than one additional record";
	return NULL;
}

static void guest_query(struct netd *d, const uint8_t *msg, size_t len,
			const struct dns_client *from)
{
	struct cap_dns_question q;
	struct cap_net_verdict v;
	char quoted[300];
	const char *why;

	if (len > NETD_DNS_QUERY_MAX) {
		netd_log(d, "refused dns query: %zu bytes, over %d", len, NETD_DNS_QUERY_MAX);
		reply_rcode(d, msg, len, NULL, CAP_DNS_RCODE_FORMERR, from);
		return;
	}
	if (cap_dns_parse_query(msg, len, &q) < 0) {
		/* Never answer what claims to be an answer: no loops. */
		if (q.flags & 0x8000) {
			client_drop(d, from);
			return;
		}
		netd_log(d, "refused dns query: not a query with exactly one well-formed question");
		reply_rcode(d, msg, len, NULL, CAP_DNS_RCODE_FORMERR, from);
		return;
	}
	if ((why = query_shape_problem(&q)) != NULL || q.end > NETD_DNS_GUEST_Q) {
		netd_log(d, "refused dns %s: %s",
			 cap_sniff_quote(q.name, strlen(q.name), quoted, sizeof(quoted)),
			 why ? why : "its question is too long");
		reply_rcode(d, msg, len, NULL, CAP_DNS_RCODE_FORMERR, from);
		return;
	}
	if (q.opcode != 0 || q.qclass != CAP_DNS_CLASS_IN) {
		reply_rcode(d, msg, len, &q, CAP_DNS_RCODE_NOTIMP, from);
		return;
	}
	if (!q.plain || !cap_net_valid_name(q.name, strlen(q.name))) {
		netd_log(d, "refused dns %s: not a valid name",
			 cap_sniff_quote(q.name, strlen(q.name), quoted, sizeof(quoted)));
		reply_rcode(d, msg, len, &q, CAP_DNS_RCODE_NXDOMAIN, from);
		return;
	}
	cap_net_decide_name(netd_policy(d), q.name, &v);
	if (!v.allow) {
		netd_log(d, "refused dns %s: %s", q.name, v.rule);
		reply_rcode(d, msg, len, &q, CAP_DNS_RCODE_NXDOMAIN, from);
		return;
	}
	if (d->cfg->verbose)
		netd_log(d, "allowed dns %s by %s", q.name, v.rule);
	struct dns_pending *p = d->resolver >= 0 ? pending_new(d) : NULL;
	if (!p) {
		if (d->resolver >= 0)
			netd_log(d, "dns %s: %u queries in flight already; answered SERVFAIL", q.name,
				 NETD_DNS_PENDING);
		else
			resolver_missing(d);
		reply_rcode(d, msg, len, &q, CAP_DNS_RCODE_SERVFAIL, from);
		return;
	}
	/* Never the guest's bytes: the question as parsed, RD set, no
	 * EDNS (the resolver then answers within 512 bytes, TC beyond). */
	ssize_t n = cap_dns_build_query(p->up_id, q.name, q.qtype, p->msg, sizeof(p->msg));
	if (n < 0) {
		p->used = false;
		netd_log(d, "refused dns %s: %s", q.name, strerror((int)-n));
		reply_rcode(d, msg, len, &q, CAP_DNS_RCODE_FORMERR, from);
		return;
	}
	p->len = (size_t)n;
	p->client = *from;
	p->guest_id = q.id;
	snprintf(p->name, sizeof(p->name), "%s", q.name);
	p->qtype = q.qtype;
	memcpy(p->guest_q, msg, q.end);
	p->guest_len = q.end;
	pending_send(d, p);
}

void dns_guest_query(struct netd *d)
{
	for (unsigned i = 0; i < GUEST_BATCH; i++) {
		struct sockaddr_in from;
		socklen_t fl = sizeof(from);
		ssize_t n = recvfrom(d->cfg->dns, d->owned_dgram, NETD_DGRAM_MAX, MSG_DONTWAIT | MSG_TRUNC,
				     (struct sockaddr *)&from, &fl);
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR)
				netd_log(d, "cannot read a DNS query: %s", strerror(errno));
			return;
		}
		if (from.sin_family != AF_INET || (size_t)n < CAP_DNS_HEADER)
			continue;
		struct dns_client to = { .udp = from };
		guest_query(d, d->owned_dgram, CAP_MIN((size_t)n, NETD_DGRAM_MAX), &to);
	}
}

void dns_tcp_query(struct netd *d, struct conn *c, const uint8_t *msg, size_t len)
{
	struct dns_client to = { .tcp = true, .conn_id = c->id, .conn_slot = c->slot };

	if (len < CAP_DNS_HEADER) {
		conn_dns_reply(d, c, NULL, 0);
		return;
	}
	guest_query(d, msg, len, &to);
}

int dns_resolve(struct netd *d, struct conn *c, const char *name)
{
	struct dns_pending *p = d->resolver >= 0 ? pending_new(d) : NULL;

	if (!p && d->resolver < 0)
		resolver_missing(d);
	if (!p)
		return d->resolver >= 0 ? -EBUSY : -ENETUNREACH;
	ssize_t n = cap_dns_build_query(p->up_id, name, CAP_DNS_TYPE_A, p->msg, sizeof(p->msg));
	if (n < 0) {
		p->used = false;
		return (int)n;
	}
	p->len = (size_t)n;
	p->for_conn = true;
	p->conn_id = c->id;
	p->conn_slot = c->slot;
	snprintf(p->name, sizeof(p->name), "%s", name);
	p->qtype = CAP_DNS_TYPE_A;
	pending_send(d, p);
	return 0;
}

/* The query p failed (rcode) or was answered (a). */
static void finish(struct netd *d, struct dns_pending *p, const struct cap_dns_answer *a,
		   const uint8_t *reply, size_t len, unsigned rcode)
{
	p->used = false;
	if (p->for_conn) {
		struct conn *c = conn_find(d, p->conn_slot, p->conn_id);
		if (c && c->state == ST_RESOLVE)
			proxy_resolved(d, c, a ? a->addr : NULL, a ? a->naddr : 0, rcode);
		return;
	}
	struct cap_dns_question q;
	bool parsed = cap_dns_parse_query(p->guest_q, p->guest_len, &q) == 0;
	/* The resolver's question is the one sent, same name and so same
	 * length when uncompressed: the guest's own bytes take its place. */
	if (a && !a->has_question) {	/* an error without the question */
		rcode = a->q.rcode;
		a = NULL;
	} else if (a && (!parsed || a->q.compressed || a->q.end != q.end)) {
		netd_log(d, "dns %s: the resolver %s answered with its question rewritten; answered SERVFAIL",
			 p->name, d->resolver_text);
		a = NULL;
		rcode = CAP_DNS_RCODE_SERVFAIL;
	}
	if (!a) {
		reply_rcode(d, p->guest_q, p->guest_len, parsed ? &q : NULL, rcode, &p->client);
		return;
	}
	if (a->q.rcode == 0 && p->qtype == CAP_DNS_TYPE_A)
		for (unsigned i = 0; i < a->naddr; i++)
			remember(d, a->addr[i], p->name, a->ttl[i]);
	/* The answer as the resolver gave it, under the guest's ID and
	 * with the guest's question. */
	uint8_t *m = (uint8_t *)reply;
	m[0] = (uint8_t)(p->guest_id >> 8);
	m[1] = (uint8_t)p->guest_id;
	memcpy(m + CAP_DNS_HEADER, p->guest_q + CAP_DNS_HEADER, q.end - CAP_DNS_HEADER);
	client_send(d, &p->client, m, len);
}

void dns_upstream_reply(struct netd *d)
{
	static struct cap_dns_answer a;	/* large; one process, one thread */

	for (unsigned i = 0; i < GUEST_BATCH; i++) {
		ssize_t n = recv(d->resolver, d->owned_dgram, NETD_DGRAM_MAX, MSG_DONTWAIT);
		if (n < 0) {
			if (errno != EAGAIN && errno != EINTR && errno != ECONNREFUSED)
				netd_log(d, "cannot read from the resolver %s: %s", d->resolver_text,
					 strerror(errno));
			if (errno != ECONNREFUSED)
				return;
			continue;
		}
		/* A reply that does not parse is ignored like a forgery: the
		 * query's timeout answers for it. */
		if (cap_dns_parse_answer(d->owned_dgram, (size_t)n, &a) < 0)
			continue;
		struct dns_pending *p = NULL;
		for (unsigned j = 0; j < NETD_DNS_PENDING && !p; j++)
			if (d->pending[j].used && d->pending[j].up_id == a.q.id)
				p = &d->pending[j];
		if (!p)
			continue;
		if (a.has_question ? (strcmp(a.q.name, p->name) || a.q.qtype != p->qtype)
				   : a.q.rcode == 0)
			continue;
		finish(d, p, &a, d->owned_dgram, (size_t)n, a.q.rcode);
	}
}

void dns_timeouts(struct netd *d, int64_t now, int64_t *next)
{
	for (unsigned i = 0; i < NETD_DNS_PENDING; i++) {
		struct dns_pending *p = &d->pending[i];
		if (!p->used)
			continue;
		if (p->deadline <= now) {
			if (p->tries < 2) {
				pending_send(d, p);
			} else {
				if (!p->for_conn)
					netd_log(d, "dns %s: no answer from the resolver %s; answered SERVFAIL",
						 p->name, d->resolver_text);
				finish(d, p, NULL, NULL, 0, CAP_DNS_RCODE_SERVFAIL);
				continue;
			}
		}
		if (!*next || p->deadline < *next)
			*next = p->deadline;
	}
}
