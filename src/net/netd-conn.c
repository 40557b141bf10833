/* netd: TCP connections. Each joins a (the guest, or a client of a
 * published port) to b (what this process dialed, or the connector's
 * socket into the guest) through two bounded buffers, with backpressure
 * and half-closes carried across; the guest's first bytes are checked
 * for a TLS ClientHello with a bad server name before any is forwarded. */
#include <arpa/inet.h>
#include <errno.h>
#include <limits.h>
#include <linux/netfilter_ipv4.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netd-int.h"
#include "sniff.h"
#include "util.h"

#define ACCEPT_BATCH 64
#define PROXY_HOST 0x7f000001u	/* the gateway, as seen here */
#define DNS_PORT 53	/* QEMU sends the guest's TCP to 10.0.2.3:53 to 127.0.0.1:53 */

/* ---- buffers --------------------------------------------------------------- */

static size_t used(const struct nbuf *b)
{
	return b->len - b->off;
}

static size_t room(const struct nbuf *b)
{
	return NETD_BUF - used(b);
}

static void compact(struct nbuf *b)
{
	if (b->off == 0)
		return;
	memmove(b->owned_data, b->owned_data + b->off, used(b));
	b->len -= b->off;
	b->off = 0;
}

void nbuf_put(struct nbuf *b, const void *p, size_t n)
{
	compact(b);
	CAP_BUG_ON(n > NETD_BUF - b->len);
	memcpy(b->owned_data + b->len, p, n);
	b->len += n;
}

/* Read at most max bytes from fd: the count, 0 at end of file, -errno. */
static ssize_t nbuf_read(int fd, struct nbuf *b, size_t max)
{
	compact(b);
	size_t n = CAP_MIN(max, NETD_BUF - b->len);
	if (n == 0)
		return -EAGAIN;
	ssize_t r = read(fd, b->owned_data + b->len, n);
	if (r < 0)
		return errno == EINTR ? -EAGAIN : -errno;
	b->len += (size_t)r;
	return r;
}

/* Write what b holds to fd: how many bytes were written (0 when it
 * would block), or -errno. */
static ssize_t nbuf_write(int fd, struct nbuf *b)
{
	if (!used(b))
		return 0;
	ssize_t r = send(fd, b->owned_data + b->off, used(b), MSG_NOSIGNAL | MSG_DONTWAIT);
	if (r < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -errno;
	b->off += (size_t)r;
	if (b->off == b->len)
		b->off = b->len = 0;
	return r;
}

/* ---- life ------------------------------------------------------------------ */

/* Whether c may give its slot up to a new connection: spliced or
 * intercepted, and idle for head_ms or more. */
static bool evictable(const struct netd *d, const struct conn *c, int64_t now)
{
	return (c->state == ST_SPLICE || c->state == ST_TLS) && now - c->active >= d->head_ms;
}

/* Every slot is taken: close the connection idle the longest, if it may
 * give its slot up. Whether one was closed. */
static bool evict(struct netd *d, int64_t now)
{
	struct conn *old = NULL;

	for (unsigned i = 0; i < NETD_MAX_CONNS; i++) {
		struct conn *c = d->conns[i];
		if (c && evictable(d, c, now) && (!old || c->active < old->active))
			old = c;
	}
	if (!old)
		return false;
	netd_log(d, "closed %s to make room for a new connection: %u connections are open, and it was idle for %lld s",
		 old->desc, d->max_conns, (long long)((now - old->active) / 1000));
	conn_free(d, old, true);
	return true;
}

struct conn *conn_new(struct netd *d, enum conn_kind kind, int fd)
{
	int64_t now = cap_now_ms();

	if (d->nconns >= d->max_conns && !evict(d, now))
		return NULL;
	unsigned slot = 0;
	while (d->conns[slot])
		slot++;
	struct conn *c = xcalloc(1, sizeof(*c));
	c->id = ++d->next_id;
	c->slot = slot;
	c->kind = kind;
	c->a = fd;
	c->b = -1;
	c->active = now;
	c->up.owned_data = xmalloc(NETD_BUF);
	c->down.owned_data = xmalloc(NETD_BUF);
	d->conns[slot] = c;
	d->nconns++;
	return c;
}

/* Close fd so that its peer sees a reset, not an orderly end. */
static void close_reset(int fd)
{
	struct linger l = { .l_onoff = 1, .l_linger = 0 };

	if (fd < 0)
		return;
	setsockopt(fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	close(fd);
}

void conn_free(struct netd *d, struct conn *c, bool reset)
{
	intercept_free(c);
	if (reset) {
		close_reset(c->a);
		close_reset(c->b);
	} else {
		close(c->a);
		if (c->b >= 0)
			close(c->b);
	}
	d->conns[c->slot] = NULL;
	d->nconns--;
	free(c->up.owned_data);
	free(c->down.owned_data);
	free(c);
}

struct conn *conn_find(struct netd *d, unsigned slot, uint64_t id)
{
	struct conn *c = slot < NETD_MAX_CONNS ? d->conns[slot] : NULL;

	return c && c->id == id ? c : NULL;
}

const char *status_text(int status)
{
	switch (status) {
	case 400: return "Bad Request";
	case 403: return "Forbidden";
	case 413: return "Content Too Large";
	case 421: return "Misdirected Request";
	case 431: return "Request Header Fields Too Large";
	case 501: return "Not Implemented";
	case 504: return "Gateway Timeout";
	case 505: return "HTTP Version Not Supported";
	default: return "Bad Gateway";
	}
}

void conn_fail(struct netd *d, struct conn *c, int status, const char *body)
{
	if (c->kind != CONN_PROXY || c->state == ST_SPLICE || c->state == ST_REPLY ||
	    c->state == ST_TLS) {
		conn_free(d, c, true);
		return;
	}
	char head[1024];
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n%s\n",
			 status, status_text(status), strlen(body) + 1, body);
	if (n < 0 || (size_t)n >= sizeof(head))
		n = snprintf(head, sizeof(head), "HTTP/1.1 %d %s\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
			     status, status_text(status));
	close_reset(c->b);
	c->b = -1;
	c->down.off = c->down.len = 0;
	nbuf_put(&c->down, head, (size_t)n);
	c->state = ST_REPLY;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
}

/* ---- dialing ----------------------------------------------------------------- */

int conn_dial(struct netd *d, struct conn *c, uint32_t addr, const char *name,
	      struct cap_net_verdict *v)
{
	char a[16];

	/* Decided here, right before the connect, with the policy in force
	 * now: it may have changed since the connection arrived. */
	cap_net_decide(netd_policy(d), addr, c->port, name, v);
	if (!v->allow)
		return -EACCES;
	bool host = cap_net_classify(addr) == CAP_NET_HOST;
	bool via = !host && upstream_applies(d, addr, name ? name : "");
	if (via && !d->proxy.usable) {
		netd_log(d, "upstream proxy %s unusable (see above): %s refused", d->proxy.text, c->desc);
		return -ENETUNREACH;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(c->port),
				  .sin_addr.s_addr = htonl(host ? PROXY_HOST : addr) };
	if (via)
		sa = d->proxy.sa;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno != EINPROGRESS) {
		int e = errno;
		close(fd);
		if (via)
			netd_log(d, "upstream proxy %s unreachable: %s (for %s)", d->proxy.text, strerror(e),
				 c->desc);
		else
			netd_log(d, "cannot reach %s:%u: %s", cap_net_addr_str(addr, a), c->port,
				 strerror(e));
		return -e;
	}
	c->b = fd;
	c->addr = addr;
	c->via_upstream = via;
	if (name && name != c->name)
		snprintf(c->name, sizeof(c->name), "%s", name);
	if (via) {
		/* The address just checked, never the name: the upstream proxy
		 * would resolve a name again and could reach an address the
		 * policy refuses (DNS rebinding behind it). The name, when
		 * known, is only in Host, for the proxy's logs. */
		const char *literal = cap_net_addr_str(addr, a);
		const char *host_name = c->name[0] ? c->name : literal;
		int n = snprintf(c->pre, sizeof(c->pre), "CONNECT %s:%u HTTP/1.1\r\nHost: %s:%u\r\n\r\n",
				 literal, c->port, host_name, c->port);
		CAP_BUG_ON(n < 0 || (size_t)n >= sizeof(c->pre));
		c->pre_off = 0;
		c->pre_len = (size_t)n;
	}
	if (d->cfg->verbose) {
		char nm[300] = "";
		if (c->name[0])
			snprintf(nm, sizeof(nm), " (%s)", c->name);
		netd_log(d, "allowed tcp %s:%u%s by %s, %s%s", cap_net_addr_str(addr, a), c->port, nm,
			 v->rule, via ? "via upstream proxy " : "direct", via ? d->proxy.text : "");
	}
	conn_dialing(d, c);
	return 0;
}

void conn_dialing(struct netd *d, struct conn *c)
{
	(void)d;
	c->state = ST_DIAL;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
}

void conn_established(struct netd *d, struct conn *c)
{
	(void)d;
	c->state = ST_SPLICE;
	c->deadline = 0;
	/* The head phase again, from now: nothing has moved through yet
	 * (what a proxy client sent before was its request's head). */
	c->active = cap_now_ms();
	c->moved = false;
	c->sniff = c->kind != CONN_PUBLISH && (c->kind != CONN_PROXY || c->connect);
	if (c->kind == CONN_PROXY && c->connect) {
		static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";
		/* Before what the server may have sent already. */
		compact(&c->down);
		CAP_BUG_ON(c->down.len + sizeof(ok) - 1 > NETD_BUF);
		memmove(c->down.owned_data + sizeof(ok) - 1, c->down.owned_data, c->down.len);
		memcpy(c->down.owned_data, ok, sizeof(ok) - 1);
		c->down.len += sizeof(ok) - 1;
	}
}

/* b's connect failed with err. */
static void dial_failed(struct netd *d, struct conn *c, int err)
{
	char a[16];

	if (c->via_upstream)
		netd_log(d, "upstream proxy %s unreachable: %s (for %s)", d->proxy.text, strerror(err),
			 c->desc);
	else if (c->kind == CONN_PUBLISH)
		netd_log(d, "cannot reach guest port %u: %s", c->port, strerror(err));
	else
		netd_log(d, "cannot reach %s:%u: %s", cap_net_addr_str(c->addr, a), c->port,
			 strerror(err));
	close(c->b);
	c->b = -1;
	if (c->kind == CONN_PROXY && !c->via_upstream) {
		c->dial_error = err;
		proxy_dial_next(d, c);
		return;
	}
	conn_fail(d, c, err == ETIMEDOUT ? 504 : 502, c->via_upstream ? "upstream proxy unreachable"
								 : strerror(err));
}

/* ---- the guest's connections ------------------------------------------------ */

/* Whether the guest was answered addr for name (lowercase, no root dot),
 * and that answer is still remembered: however many other names the
 * address has (a CDN's can have hundreds). */
static bool resolved_as(const struct netd *d, uint32_t addr, const char *name)
{
	int64_t now = cap_now_ms();

	for (unsigned i = 0; i < NETD_NAMES; i++) {
		const struct dns_name *e = &d->names[i];
		if (e->expires > now && e->addr == addr && !strcmp(e->name, name))
			return true;
	}
	return false;
}

/* The verdict for a connection to c->addr:c->port and the name it goes
 * by: of the names the guest was answered this address with (all of
 * them), the newest that the policy allows; when none does, the newest
 * decides (for the refusal's words); without one, the address alone. */
static const char *decide_direct(struct netd *d, struct conn *c, struct cap_net_verdict *v)
{
	const struct dns_name *newest = NULL, *allowed = NULL;
	struct cap_net_verdict tried;
	int64_t now = cap_now_ms();

	for (unsigned i = 0; c->kind == CONN_DIRECT && i < NETD_NAMES; i++) {
		const struct dns_name *e = &d->names[i];
		if (e->expires <= now || e->addr != c->addr)
			continue;
		if (!newest || e->seq > newest->seq)
			newest = e;
		if (allowed && e->seq < allowed->seq)
			continue;
		cap_net_decide(netd_policy(d), c->addr, c->port, e->name, &tried);
		if (tried.allow) {
			allowed = e;
			*v = tried;
		}
	}
	if (allowed)
		return allowed->name;
	cap_net_decide(netd_policy(d), c->addr, c->port, newest ? newest->name : NULL, v);
	return newest ? newest->name : NULL;
}

static void accept_one(struct netd *d, int fd)
{
	struct sockaddr_in dst;
	socklen_t dl = sizeof(dst);
	char a[16];

	if (getsockopt(fd, SOL_IP, SO_ORIGINAL_DST, &dst, &dl) < 0 || dst.sin_family != AF_INET) {
		netd_log(d, "refused a connection without an original destination: %s",
			 strerror(errno));
		close_reset(fd);
		return;
	}
	uint32_t addr = ntohl(dst.sin_addr.s_addr);
	uint16_t port = ntohs(dst.sin_port);
	enum conn_kind kind = addr == PROXY_HOST && port == CAP_NET_PROXY_PORT ? CONN_PROXY
			      : addr == PROXY_HOST && port == DNS_PORT		  ? CONN_DNS
			      : cap_net_classify(addr) == CAP_NET_HOST		  ? CONN_HOST
										  : CONN_DIRECT;
	struct conn *c = conn_new(d, kind, fd);
	if (!c) {
		netd_log(d, "refused tcp %s:%u: too many connections (%u open, none idle for %lld s)",
			 cap_net_addr_str(addr, a), port, d->max_conns, (long long)(d->head_ms / 1000));
		close_reset(fd);
		return;
	}
	c->addr = addr;
	c->port = port;
	snprintf(c->desc, sizeof(c->desc), "tcp %s:%u", cap_net_addr_str(addr, a), port);
	if (kind == CONN_PROXY || kind == CONN_DNS) {
		c->state = kind == CONN_PROXY ? ST_HEAD : ST_DNS;
		c->deadline = cap_now_ms() + (kind == CONN_PROXY ? d->head_ms : NETD_TIMEOUT_MS);
		return;
	}
	struct cap_net_verdict v;
	const char *name = decide_direct(d, c, &v);
	if (!v.allow) {
		netd_log(d, "refused %s: %s", c->desc, v.rule);
		conn_free(d, c, true);
		return;
	}
	int r = conn_dial(d, c, addr, name, &v);
	if (r == -EACCES)
		netd_log(d, "refused %s: %s", c->desc, v.rule);
	if (r < 0)
		conn_free(d, c, true);
}

void conn_accept_guest(struct netd *d, int listen_fd)
{
	for (unsigned i = 0; i < ACCEPT_BATCH; i++) {
		int fd = accept4(listen_fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
				netd_log(d, "cannot accept a connection: %s", strerror(errno));
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			return;
		}
		accept_one(d, fd);
	}
}

/* ---- events --------------------------------------------------------------------- */

void conn_poll_events(const struct conn *c, short *ea, short *eb)
{
	*ea = *eb = 0;
	switch (c->state) {
	case ST_HEAD:
		*ea = POLLIN;
		break;
	case ST_RESOLVE:
	case ST_CONNECTOR:
		break;
	case ST_DIAL:
		*eb = POLLOUT;
		break;
	case ST_UPSTREAM:
		*eb = POLLIN | (c->pre_off < c->pre_len ? POLLOUT : 0);
		break;
	case ST_SPLICE:
		if (!c->a_eof && room(&c->up))
			*ea |= POLLIN;
		if (used(&c->down))
			*ea |= POLLOUT;
		if (!c->b_eof && room(&c->down))
			*eb |= POLLIN;
		if (used(&c->up) && !c->sniff)
			*eb |= POLLOUT;
		break;
	case ST_REPLY:
		*ea = used(&c->down) ? POLLOUT : POLLIN;
		break;
	case ST_DNS:
		if (!c->a_eof && room(&c->up))
			*ea |= POLLIN;
		if (used(&c->down))
			*ea |= POLLOUT;
		break;
	case ST_TLS:
		intercept_poll_events(c, ea, eb);
		break;
	}
}

/* A ClientHello passed the checks: pass the connection through, or
 * intercept it when its name is a secret's host (netd.h). sni is the
 * server name (lowercase, no trailing dot), NULL for none. False when c
 * was ended or is no longer spliced. */
static bool pass_or_intercept(struct netd *d, struct conn *c, const char *sni)
{
	char q[300];

	c->sniff = false;
	c->deadline = 0;
	if (c->kind == CONN_PROXY && c->connect && intercept_wanted(d, c->name)) {
		/* The name is the CONNECT's: a ClientHello naming another
		 * would get a certificate for a name it did not ask. */
		if (sni && strcmp(sni, c->name)) {
			netd_log(d, "refused %s: TLS server name %s is not the CONNECT's host", c->desc,
				 cap_sniff_quote(sni, strlen(sni), q, sizeof(q)));
			conn_free(d, c, true);
			return false;
		}
		intercept_start(d, c, c->name);
		return false;
	}
	if (c->kind == CONN_DIRECT && sni && intercept_wanted(d, sni)) {
		/* Intercepted under that name only if the guest was given this
		 * address for it: else any address could be reached under a
		 * secret's host's name, and given its value. */
		if (resolved_as(d, c->addr, sni)) {
			intercept_start(d, c, sni);
			return false;
		}
		netd_log(d, "refused %s: TLS server name %s is a secret's host, and this address was not resolved as that name",
			 c->desc, sni);
		conn_free(d, c, true);
		return false;
	}
	return true;
}

/* Check the guest's first bytes (c->sniff): false when c was ended or
 * is no longer spliced (intercepted). */
static bool sniff(struct netd *d, struct conn *c)
{
	char sni[CAP_TLS_SNI_MAX + 1], q[300];
	size_t sl = 0;
	enum cap_tls_sniff r = cap_tls_sniff(c->up.owned_data + c->up.off, used(&c->up), sni, &sl);

	switch (r) {
	case CAP_TLS_MORE:
		if (!used(&c->up) && c->a_eof) {
			c->sniff = false;
			return true;
		}
		if (!c->a_eof && room(&c->up)) {
			if (used(&c->up) && !c->deadline)
				c->deadline = cap_now_ms() + d->head_ms;
			return true;
		}
		netd_log(d, "refused %s: incomplete TLS ClientHello", c->desc);
		break;
	case CAP_TLS_NOT_TLS:
		c->sniff = false;
		c->deadline = 0;
		return true;
	case CAP_TLS_NO_SNI:
		return pass_or_intercept(d, c, NULL);
	case CAP_TLS_SNI:
		if (cap_net_valid_name(sni, sl)) {
			/* As names are compared: lowercase, no root dot. */
			if (sl > 1 && sni[sl - 1] == '.')
				sni[--sl] = '\0';
			for (size_t i = 0; i < sl; i++)
				if (sni[i] >= 'A' && sni[i] <= 'Z')
					sni[i] = (char)(sni[i] - 'A' + 'a');
			return pass_or_intercept(d, c, sni);
		}
		netd_log(d, "refused %s: TLS server name %s has control characters or whitespace",
			 c->desc, cap_sniff_quote(sni, sl, q, sizeof(q)));
		break;
	case CAP_TLS_MALFORMED:
		netd_log(d, "refused %s: malformed TLS ClientHello", c->desc);
		break;
	}
	conn_free(d, c, true);
	return false;
}

/* r bytes moved (read or written) on c: its idle time starts again. */
static void moved(struct conn *c, ssize_t r)
{
	if (r > 0) {
		c->active = cap_now_ms();
		c->moved = true;
	}
}

/* n bytes forwarded a to b (up) or b to a, counted by their direction
 * for the guest: a is the guest, but a published port's client. */
static void forwarded(struct netd *d, const struct conn *c, bool up, ssize_t n)
{
	if (n <= 0)
		return;
	bool out = up != (c->kind == CONN_PUBLISH);
	__atomic_fetch_add(out ? &d->counters->bytes_out : &d->counters->bytes_in, (uint64_t)n, __ATOMIC_RELAXED);
}

static void splice(struct netd *d, struct conn *c, short ra, short rb)
{
	ssize_t r;

	if ((ra & (POLLIN | POLLHUP | POLLERR)) && !c->a_eof) {
		r = nbuf_read(c->a, &c->up, SIZE_MAX);
		if (r == 0)
			c->a_eof = true;
		else if (r < 0 && r != -EAGAIN)
			goto abort;
		moved(c, r);
	}
	if (c->sniff && !sniff(d, c))
		return;
	if ((rb & (POLLIN | POLLHUP | POLLERR)) && !c->b_eof) {
		r = nbuf_read(c->b, &c->down, SIZE_MAX);
		if (r == 0)
			c->b_eof = true;
		else if (r < 0 && r != -EAGAIN)
			goto abort;
		moved(c, r);
	}
	if (!c->sniff) {
		if ((r = nbuf_write(c->b, &c->up)) < 0)
			goto abort;
		moved(c, r);
		forwarded(d, c, true, r);
	}
	if ((r = nbuf_write(c->a, &c->down)) < 0)
		goto abort;
	moved(c, r);
	forwarded(d, c, false, r);
	if (c->a_eof && !used(&c->up) && !c->sniff && !c->b_shut) {
		shutdown(c->b, SHUT_WR);
		c->b_shut = true;
	}
	if (c->b_eof && !used(&c->down) && !c->a_shut) {
		shutdown(c->a, SHUT_WR);
		c->a_shut = true;
	}
	if (c->a_shut && c->b_shut)
		conn_free(d, c, false);
	return;
abort:
	/* One side failed: the other sees a reset too. */
	conn_free(d, c, true);
}

static void head_events(struct netd *d, struct conn *c, short ra)
{
	if (!(ra & (POLLIN | POLLHUP | POLLERR)))
		return;
	ssize_t r = nbuf_read(c->a, &c->up, NETD_HEAD_MAX - CAP_MIN(used(&c->up), NETD_HEAD_MAX));
	if (r == 0)
		c->a_eof = true;
	else if (r < 0 && r != -EAGAIN) {
		conn_free(d, c, true);
		return;
	}
	proxy_head(d, c);
}

static void dial_events(struct netd *d, struct conn *c, short rb)
{
	int err = 0;
	socklen_t el = sizeof(err);

	if (!(rb & (POLLOUT | POLLERR | POLLHUP)))
		return;
	if (getsockopt(c->b, SOL_SOCKET, SO_ERROR, &err, &el) < 0)
		err = errno;
	if (!err && !(rb & POLLOUT))
		err = ECONNRESET;
	if (err) {
		dial_failed(d, c, err);
		return;
	}
	if (c->via_upstream) {
		c->state = ST_UPSTREAM;
		c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
		return;
	}
	conn_established(d, c);
}

static void upstream_events(struct netd *d, struct conn *c, short rb)
{
	if ((rb & POLLOUT) && c->pre_off < c->pre_len) {
		ssize_t w = send(c->b, c->pre + c->pre_off, c->pre_len - c->pre_off,
				 MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0)
			c->pre_off += (size_t)w;
		else if (w < 0 && errno != EAGAIN && errno != EINTR) {
			netd_log(d, "upstream proxy %s: %s (for %s)", d->proxy.text, strerror(errno), c->desc);
			conn_fail(d, c, 502, "upstream proxy failed");
			return;
		}
	}
	if (rb & (POLLIN | POLLHUP | POLLERR)) {
		ssize_t r = nbuf_read(c->b, &c->down, NETD_HEAD_MAX - CAP_MIN(used(&c->down), NETD_HEAD_MAX));
		if (r == 0)
			c->b_eof = true;
		else if (r < 0 && r != -EAGAIN) {
			netd_log(d, "upstream proxy %s: %s (for %s)", d->proxy.text, strerror((int)-r), c->desc);
			conn_fail(d, c, 502, "upstream proxy failed");
			return;
		}
	}
	int r = upstream_answer(d, c);
	if (r > 0)
		conn_established(d, c);
	else if (r < 0)
		conn_fail(d, c, 502, "upstream proxy refused the connection");
}

static void reply_events(struct netd *d, struct conn *c, short ra)
{
	if (nbuf_write(c->a, &c->down) < 0) {
		conn_free(d, c, true);
		return;
	}
	if (used(&c->down))
		return;
	if (!c->a_shut) {
		shutdown(c->a, SHUT_WR);
		c->a_shut = true;
		c->deadline = CAP_MIN(c->deadline, cap_now_ms() + NETD_LINGER_MS);
	}
	/* Read what the client still sends, so that closing does not reset
	 * the connection before it has read the answer. */
	if (ra & (POLLIN | POLLHUP | POLLERR)) {
		c->up.off = c->up.len = 0;
		ssize_t r = nbuf_read(c->a, &c->up, SIZE_MAX);
		if (r == 0 || (r < 0 && r != -EAGAIN))
			conn_free(d, c, false);
	}
}

void conn_dns_reply(struct netd *d, struct conn *c, const uint8_t *m, size_t len)
{
	(void)d;
	c->dns_waiting = false;
	/* An answer always fits: queries are taken only with down empty. */
	if (!m || len > 0xffff || len + 2 > room(&c->down)) {
		c->a_eof = true;	/* no more queries; ends once down is sent */
		return;
	}
	uint8_t n[2] = { (uint8_t)(len >> 8), (uint8_t)len };
	nbuf_put(&c->down, n, 2);
	nbuf_put(&c->down, m, len);
}

/* Whether up holds a whole DNS-over-TCP message (2-byte length first). */
static bool dns_query_ready(const struct conn *c)
{
	const uint8_t *p = c->up.owned_data + c->up.off;

	return used(&c->up) >= 2 && used(&c->up) >= 2 + ((size_t)p[0] << 8 | p[1]);
}

/* DNS over TCP: messages with a 2-byte length, one query answered at a
 * time (a client may send more: they wait in up). */
static void dns_events(struct netd *d, struct conn *c, short ra)
{
	if ((ra & (POLLIN | POLLHUP | POLLERR)) && !c->a_eof) {
		ssize_t r = nbuf_read(c->a, &c->up, SIZE_MAX);
		if (r == 0)
			c->a_eof = true;
		else if (r < 0 && r != -EAGAIN) {
			conn_free(d, c, true);
			return;
		}
	}
	if (used(&c->up) >= 2 &&
	    2 + ((size_t)c->up.owned_data[c->up.off] << 8 | c->up.owned_data[c->up.off + 1]) > NETD_BUF) {
		conn_free(d, c, true);	/* a message that can never fit */
		return;
	}
	/* Answer, send, and take the next query while answers go out at once. */
	for (;;) {
		if (nbuf_write(c->a, &c->down) < 0) {
			conn_free(d, c, true);
			return;
		}
		if (c->dns_waiting || used(&c->down) || !dns_query_ready(c))
			break;
		const uint8_t *p = c->up.owned_data + c->up.off;
		size_t len = (size_t)p[0] << 8 | p[1];
		c->up.off += 2 + len;
		c->dns_waiting = true;
		c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
		dns_tcp_query(d, c, p + 2, len);
	}
	if (c->a_eof && !c->dns_waiting && !used(&c->down))
		conn_free(d, c, false);
}

void conn_events(struct netd *d, struct conn *c, short ra, short rb)
{
	switch (c->state) {
	case ST_HEAD:
		head_events(d, c, ra);
		break;
	case ST_RESOLVE:
	case ST_CONNECTOR:
		break;
	case ST_DIAL:
		dial_events(d, c, rb);
		break;
	case ST_UPSTREAM:
		upstream_events(d, c, rb);
		break;
	case ST_SPLICE:
		splice(d, c, ra, rb);
		break;
	case ST_REPLY:
		reply_events(d, c, ra);
		break;
	case ST_DNS:
		dns_events(d, c, ra);
		break;
	case ST_TLS:
		/* What arrives on either socket is read by the interception:
		 * as near to "a byte moved" as this side sees. */
		if ((ra | rb) & POLLIN)
			moved(c, 1);
		intercept_events(d, c, ra, rb);
		break;
	}
}

int64_t conn_due(const struct netd *d, const struct conn *c)
{
	if (c->deadline || (c->state != ST_SPLICE && c->state != ST_TLS))
		return c->deadline;
	return c->active + (c->moved ? d->idle_ms : d->head_ms);
}

/* A spliced or intercepted connection without a deadline of its own
 * passed its idle limit. */
static void idle_timeout(struct netd *d, struct conn *c)
{
	if (c->moved)
		netd_log(d, "closed %s: idle (no byte either way) for %lld s", c->desc,
			 (long long)(d->idle_ms / 1000));
	else
		netd_log(d, "closed %s: nothing sent either way within %lld s of its start", c->desc,
			 (long long)(d->head_ms / 1000));
	conn_free(d, c, true);
}

void conn_timeout(struct netd *d, struct conn *c)
{
	switch (c->state) {
	case ST_HEAD:
		netd_log(d, "refused proxy request: no complete request head within %lld s",
			 (long long)(d->head_ms / 1000));
		conn_fail(d, c, 400, "no complete request head in time");
		break;
	case ST_RESOLVE:
		netd_log(d, "cannot resolve %s: no answer in time", c->name);
		conn_fail(d, c, 504, "cannot resolve the target's name in time");
		break;
	case ST_CONNECTOR:
		netd_log(d, "cannot reach guest port %u: no socket from the connector within %d s",
			 c->port, NETD_TIMEOUT_MS / 1000);
		conn_free(d, c, true);
		break;
	case ST_DIAL:
		dial_failed(d, c, ETIMEDOUT);
		break;
	case ST_UPSTREAM:
		netd_log(d, "upstream proxy %s did not answer CONNECT within %d s (for %s)",
			 d->proxy.text, NETD_TIMEOUT_MS / 1000, c->desc);
		conn_fail(d, c, 504, "upstream proxy timed out");
		break;
	case ST_SPLICE:
		if (!c->deadline) {
			idle_timeout(d, c);
			break;
		}
		netd_log(d, "refused %s: no complete TLS ClientHello within %lld s", c->desc,
			 (long long)(d->head_ms / 1000));
		conn_free(d, c, true);
		break;
	case ST_REPLY:
		conn_free(d, c, false);
		break;
	case ST_DNS:
		/* Idle since its last query, or a query never answered: the
		 * resolver's own timeout (two tries) answers well before this
		 * one, so a query still waiting here never will be, and the
		 * connection would hold its slot forever. */
		if (c->dns_waiting)
			netd_log(d, "dns over tcp: a query unanswered within %d s; connection closed",
				 NETD_TIMEOUT_MS / 1000);
		conn_free(d, c, false);
		break;
	case ST_TLS:
		if (!c->deadline)
			idle_timeout(d, c);
		else
			intercept_timeout(d, c);
		break;
	}
}
