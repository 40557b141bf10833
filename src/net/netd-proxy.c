/* netd: the HTTP proxy the guest's tools are pointed at (gateway:3128):
 * one request per connection, CONNECT or an absolute-form request; and
 * the host's upstream proxy, which every allowed connection goes through
 * by CONNECT when one is configured and NO_PROXY does not exempt it. */
#include <errno.h>
#include <netdb.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include "netd-int.h"
#include "sniff.h"
#include "util.h"

#define DEFAULT_PROXY_PORT "1080"	/* curl's, for a proxy given without a port */

static const char *const hop_by_hop[] = {
	"connection", "keep-alive", "proxy-connection", "proxy-authorization", "host",
};

static bool span_is(const char *buf, struct cap_span s, const char *word)
{
	return s.len == strlen(word) && !strncasecmp(buf + s.off, word, s.len);
}

/* The next element of a comma-separated list at *p (spaces and tabs
 * around it trimmed) in *s, *l; false at the end. */
static bool next_listed(const char **p, const char **s, size_t *l)
{
	if (!*p || !**p)
		return false;
	size_t n = strcspn(*p, ",");
	*s = *p;
	*l = n;
	while (*l && (**s == ' ' || **s == '\t')) {
		(*s)++;
		(*l)--;
	}
	while (*l && ((*s)[*l - 1] == ' ' || (*s)[*l - 1] == '\t'))
		(*l)--;
	*p += n + ((*p)[n] == ',');
	return true;
}

/* Whether name (nl bytes) is one of list's comma-separated tokens. */
static bool listed(const char *list, const char *name, size_t nl)
{
	const char *s;
	size_t l;
	while (next_listed(&list, &s, &l))
		if (l == nl && !strncasecmp(s, name, nl))
			return true;
	return false;
}

/* Whether the field the request loses on its way: hop-by-hop ones, Host
 * (written anew), and those its Connection fields name (framing fields
 * excepted: the body is forwarded as it comes). */
static bool dropped(const char *buf, struct cap_span name, const char *conn_list)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(hop_by_hop); i++)
		if (span_is(buf, name, hop_by_hop[i]))
			return true;
	if (span_is(buf, name, "content-length") || span_is(buf, name, "transfer-encoding"))
		return false;
	return listed(conn_list, buf + name.off, name.len);
}

/* Replace c->up's head (an absolute-form request) by the origin-form
 * request to send: same method and version, the URL's path, Host from the
 * URL, hop-by-hop fields removed, one "Connection: close"; what followed
 * the head stays after it. */
static void rewrite_request(struct conn *c, const struct cap_http_head *h,
			    const struct cap_target *t, struct cap_span path)
{
	const char *buf = (const char *)c->up.owned_data + c->up.off;
	const char *target = buf + h->target.off;
	struct cap_buf out, list;
	struct cap_span name, value;
	size_t pos = h->fields;

	cap_buf_init(&out);
	cap_buf_init(&list);
	while (cap_http_field_next(buf, h, &pos, &name, &value)) {
		if (span_is(buf, name, "connection")) {
			cap_buf_append(&list, buf + value.off, value.len);
			cap_buf_append(&list, ",", 1);
		}
	}
	cap_buf_append(&list, "", 1);

	cap_buf_append(&out, buf + h->method.off, h->method.len);
	cap_buf_append(&out, " ", 1);
	if (!path.len || target[path.off] != '/')
		cap_buf_append(&out, "/", 1);
	cap_buf_append(&out, target + path.off, path.len);
	cap_buf_append(&out, " ", 1);
	cap_buf_append(&out, buf + h->version.off, h->version.len);
	char host[300];
	int n = t->port == 80 ? snprintf(host, sizeof(host), "\r\nHost: %s\r\n", t->host)
			      : snprintf(host, sizeof(host), "\r\nHost: %s:%u\r\n", t->host, t->port);
	cap_buf_append(&out, host, (size_t)n);
	for (pos = h->fields; cap_http_field_next(buf, h, &pos, &name, &value);) {
		if (dropped(buf, name, (const char *)cap_buf_head(&list)))
			continue;
		cap_buf_append(&out, buf + name.off, value.off + value.len - name.off);
		cap_buf_append(&out, "\r\n", 2);
	}
	cap_buf_append(&out, "Connection: close\r\n\r\n", 21);
	cap_buf_append(&out, buf + h->len, c->up.len - c->up.off - h->len);
	c->up.off = c->up.len = 0;
	nbuf_put(&c->up, cap_buf_head(&out), cap_buf_used(&out));
	cap_buf_fini(&out);
	cap_buf_fini(&list);
}

/* ---- the guest's proxy requests ---------------------------------------------- */

static bool is_host_name(const char *name)
{
	return !strcasecmp(name, CAP_NET_HOST_NAME);
}

void proxy_head(struct netd *d, struct conn *c)
{
	const char *buf = (const char *)c->up.owned_data + c->up.off;
	struct cap_http_head h;
	struct cap_target t;
	struct cap_span path = { 0, 0 };
	const char *why = NULL;
	char q[300];

	int r = cap_http_head_parse(buf, c->up.len - c->up.off, NETD_HEAD_MAX, &h);
	if (r == 0 && !c->a_eof)
		return;
	if (r == 0) {	/* the client gave up before its head was complete */
		conn_free(d, c, false);
		return;
	}
	if (r < 0) {
		netd_log(d, "refused proxy request: %s",
			 r == -E2BIG ? "request head over 16384 bytes" : "not an HTTP/1.x request head");
		conn_fail(d, c, 400, r == -E2BIG ? "request head too large" : "malformed request");
		return;
	}
	const char *method = buf + h.method.off;
	int ml = (int)CAP_MIN(h.method.len, 32);
	c->connect = span_is(buf, h.method, "CONNECT");
	r = c->connect ? cap_target_parse_authority(buf + h.target.off, h.target.len, &t, &why)
		       : cap_target_parse_url(buf + h.target.off, h.target.len, &t, &path, &why);
	if (r < 0) {
		netd_log(d, "refused proxy %.*s %s: %s", ml, method,
			 cap_sniff_quote(buf + h.target.off, h.target.len, q, sizeof(q)), why);
		conn_fail(d, c, 400, why);
		return;
	}
	c->port = t.port;
	snprintf(c->desc, sizeof(c->desc), "proxy %.*s %s:%u", ml, method, t.host, t.port);
	if (!c->connect)
		rewrite_request(c, &h, &t, path);
	else
		c->up.off += h.len;	/* what follows goes to the server */
	c->ncand = c->icand = 0;
	c->name[0] = '\0';
	/* The gateway by its name or its address in the guest is the host. */
	if (is_host_name(t.host) || (t.is_addr && t.addr == CAP_NET_GATEWAY)) {
		c->cand[c->ncand++] = 0x7f000001u;
		proxy_dial_next(d, c);
		return;
	}
	if (t.is_addr) {
		c->cand[c->ncand++] = t.addr;
		proxy_dial_next(d, c);
		return;
	}
	struct cap_net_verdict v;
	cap_net_decide_name(netd_policy(d), t.host, &v);
	if (!v.allow) {
		netd_log(d, "refused %s: %s", c->desc, v.rule);
		conn_fail(d, c, 403, v.rule);
		return;
	}
	snprintf(c->name, sizeof(c->name), "%s", t.host);
	r = dns_resolve(d, c, t.host);
	if (r < 0) {
		netd_log(d, "cannot resolve %s: %s", t.host,
			 r == -ENETUNREACH ? "no resolver" : r == -EBUSY ? "too many queries in flight"
								      : strerror(-r));
		conn_fail(d, c, 502, "cannot resolve the target's name");
		return;
	}
	c->state = ST_RESOLVE;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
}

void proxy_resolved(struct netd *d, struct conn *c, const uint32_t *addr, unsigned naddr,
		    unsigned rcode)
{
	if (!naddr) {
		const char *why = rcode == CAP_DNS_RCODE_NXDOMAIN ? "no such name"
				  : rcode == 0			  ? "no IPv4 address"
								  : "the resolver failed";
		netd_log(d, "cannot resolve %s: %s", c->name, why);
		conn_fail(d, c, 502, why);
		return;
	}
	naddr = CAP_MIN(naddr, CAP_DNS_MAX_ADDRS);
	memcpy(c->cand, addr, naddr * sizeof(*addr));
	c->ncand = naddr;
	c->icand = 0;
	proxy_dial_next(d, c);
}

void proxy_dial_next(struct netd *d, struct conn *c)
{
	struct cap_net_verdict v;

	while (c->icand < c->ncand) {
		uint32_t addr = c->cand[c->icand++];
		int r = conn_dial(d, c, addr, c->name[0] ? c->name : NULL, &v);
		if (r == 0)
			return;
		if (r == -EACCES) {
			snprintf(c->refusal, sizeof(c->refusal), "%s", v.rule);
			continue;
		}
		c->dial_error = -r;
		/* Through the upstream proxy, every address fails alike. */
		if (upstream_applies(d, addr, c->name))
			break;
	}
	if (c->dial_error) {
		conn_fail(d, c, c->dial_error == ETIMEDOUT ? 504 : 502,
			  c->via_upstream || d->proxy.set ? "cannot reach the target (upstream proxy)"
							  : strerror(c->dial_error));
		return;
	}
	netd_log(d, "refused %s: %s", c->desc, c->refusal);
	conn_fail(d, c, 403, c->refusal);
}

/* ---- the upstream proxy --------------------------------------------------------- */

int upstream_init(struct netd *d)
{
	const struct cap_netd_config *cfg = d->cfg;
	const char *v = cfg->https_proxy && *cfg->https_proxy ? cfg->https_proxy
			: cfg->all_proxy && *cfg->all_proxy   ? cfg->all_proxy
			: cfg->http_proxy && *cfg->http_proxy ? cfg->http_proxy
							      : NULL;
	struct upstream_proxy *p = &d->proxy;
	char q[300], hp[300];
	const char *why = NULL;
	struct cap_target t;

	if (cfg->no_proxy && *cfg->no_proxy)
		p->owned_no_proxy = xstrdup(cfg->no_proxy);
	if (!v)
		return 0;
	p->set = true;
	cap_sniff_quote(v, strlen(v), q, sizeof(q));
	snprintf(p->text, sizeof(p->text), "%s", q);
	const char *s = v;
	if (!strncasecmp(s, "http://", 7)) {
		s += 7;
	} else if (strstr(s, "://")) {
		netd_log(d, "upstream proxy %s: only http:// proxies are supported; every connection that would use it fails",
			 q);
		return 0;
	}
	size_t n = strcspn(s, "/");
	if (s[n] && strcmp(s + n, "/")) {
		netd_log(d, "upstream proxy %s: a path is not expected; every connection that would use it fails", q);
		return 0;
	}
	if (memchr(s, '@', n)) {
		netd_log(d, "upstream proxy %s: credentials are not supported; every connection that would use it fails",
			 q);
		return 0;
	}
	bool has_port = memchr(s, ':', n) != NULL;
	int hl = snprintf(hp, sizeof(hp), "%.*s%s", (int)n, s, has_port ? "" : ":" DEFAULT_PROXY_PORT);
	if (hl < 0 || (size_t)hl >= sizeof(hp) || cap_target_parse_authority(hp, (size_t)hl, &t, &why) < 0) {
		netd_log(d, "upstream proxy %s: %s; every connection that would use it fails", q,
			 why ? why : "too long");
		return 0;
	}
	snprintf(p->text, sizeof(p->text), "%s:%u", t.host, t.port);
	p->sa = (struct sockaddr_in){ .sin_family = AF_INET, .sin_port = htons(t.port),
				      .sin_addr.s_addr = htonl(t.addr) };
	if (!t.is_addr) {
		/* Start-up: the one place that may block. */
		struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
		int e = getaddrinfo(t.host, NULL, &hints, &res);
		if (e || !res) {
			netd_log(d, "upstream proxy %s: cannot resolve %s: %s; every connection that would use it fails",
				 p->text, t.host, e ? gai_strerror(e) : "no address");
			return 0;
		}
		p->sa.sin_addr = ((struct sockaddr_in *)res->ai_addr)->sin_addr;
		freeaddrinfo(res);
	}
	p->usable = true;
	if (cfg->verbose)
		netd_log(d, "upstream proxy %s%s%s", p->text, p->owned_no_proxy ? ", not for " : "",
			 p->owned_no_proxy ? p->owned_no_proxy : "");
	return 0;
}

/* One NO_PROXY entry (trimmed, e bytes) against addr and name. */
static bool no_proxy_entry(const char *e, size_t n, uint32_t addr, const char *name)
{
	char s[256];

	if (n == 0 || n >= sizeof(s))
		return false;
	memcpy(s, e, n);
	s[n] = '\0';
	if (!strcmp(s, "*"))
		return true;
	char *slash = strchr(s, '/');
	if (slash) {	/* a CIDR */
		char *end = NULL;
		*slash = '\0';
		unsigned long prefix = strtoul(slash + 1, &end, 10);
		uint32_t net;
		if (!cap_net_addr_parse(s, &net) || !*(slash + 1) || *end || prefix > 32)
			return false;
		uint32_t mask = prefix ? ~0u << (32 - prefix) : 0;
		return (addr & mask) == (net & mask);
	}
	uint32_t a;
	if (cap_net_addr_parse(s, &a))
		return a == addr;
	/* A domain: ".example.com", "*.example.com" and "example.com" all
	 * match example.com and the names under it. */
	const char *dom = s;
	if (!strncmp(dom, "*.", 2))
		dom += 2;
	else if (*dom == '.')
		dom++;
	size_t dl = strlen(dom), nl = strlen(name);
	if (dl && dom[dl - 1] == '.')
		dl--;
	if (!dl || !nl || nl < dl || strncasecmp(name + nl - dl, dom, dl))
		return false;
	return nl == dl || name[nl - dl - 1] == '.';
}

bool upstream_applies(const struct netd *d, uint32_t addr, const char *name)
{
	if (!d->proxy.set || cap_net_classify(addr) == CAP_NET_HOST)
		return false;
	const char *p = d->proxy.owned_no_proxy, *e;
	size_t l;
	while (next_listed(&p, &e, &l))
		if (no_proxy_entry(e, l, addr, name ? name : ""))
			return false;
	return true;
}

int upstream_answer(struct netd *d, struct conn *c)
{
	const char *buf = (const char *)c->down.owned_data + c->down.off;
	size_t n = c->down.len - c->down.off;
	char q[200];

	const char *end = memmem(buf, n, "\r\n\r\n", 4);
	if (!end) {
		if (!c->b_eof && n < NETD_HEAD_MAX)
			return 0;
		netd_log(d, "upstream proxy %s: %s (for %s)", d->proxy.text,
			 c->b_eof ? "closed the connection without answering CONNECT"
				  : "answer head over 16384 bytes",
			 c->desc);
		return -1;
	}
	size_t line = (size_t)((const char *)memchr(buf, '\r', n) - buf);
	if (line >= 12 && !strncmp(buf, "HTTP/1.", 7) && buf[8] == ' ' && buf[9] == '2' &&
	    buf[10] >= '0' && buf[10] <= '9' && buf[11] >= '0' && buf[11] <= '9' &&
	    (line == 12 || buf[12] == ' ')) {
		c->down.off += (size_t)(end - buf) + 4;
		return 1;
	}
	netd_log(d, "upstream proxy %s refused CONNECT for %s: %s", d->proxy.text, c->desc,
		 cap_sniff_quote(buf, CAP_MIN(line, 100), q, sizeof(q)));
	return -1;
}
