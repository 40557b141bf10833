/* netd: the interception of the TLS connections that carry secrets
 * (netd.h, netd-int.h). The guest's TLS ends here, against a certificate
 * minted for the connection's name and signed by the sandbox's CA; a
 * second TLS connection, verified against the trust store, goes to the
 * real server; between them one request goes through rewrite.h (the
 * placeholders of the secrets for that name become their values) and its
 * response comes back (any value becomes its placeholder again).
 *
 * Both TLS ends are memory BIOs: the loop reads and writes the sockets,
 * OpenSSL only ever sees bytes, so nothing blocks. Every buffer that may
 * hold a value (the plaintext read from the server, the request as it
 * goes upstream) is wiped before it is freed or reused, and no log line
 * holds one. */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>

#include "ca.h"
#include "netd-int.h"
#include "netd-tls.h"
#include "rewrite.h"
#include "sniff.h"
#include "util.h"

#define CHUNK 16384		/* plaintext moved at a time (one TLS record) */

/* Ours to send when the rewriter holds a body the guest would only send
 * after it (cap_http_req_continue). */
static const char continue_100[] = "HTTP/1.1 100 Continue\r\n\r\n";

/* One intercepted connection. The guest's TLS (g) reads c->up's bytes
 * and writes c->down's; the server's (u) reads b's and writes to_b. */
struct icpt {
	char name[254];
	SSL *g, *u;
	BIO *g_in, *g_out, *u_in, *u_out;	/* owned by g and u */
	struct nbuf to_b;
	struct cap_http_secret hs[CAP_HTTP_MAX_SECRETS];
	char *owned_values[CAP_HTTP_MAX_SECRETS];	/* hs[k].value */
	unsigned nhs;
	struct cap_http_req *req;
	struct cap_http_resp *resp;
	struct cap_buf req_out;		/* plaintext for the server: may hold values */
	struct cap_buf resp_out;	/* plaintext for the guest */
	bool g_done, u_done;		/* handshakes */
	bool u_gone;			/* b closed: nothing more to or from the server */
	bool got_request;		/* the guest sent some plaintext */
	bool req_done, resp_done;	/* nothing more is read from the guest, the server */
	bool whole;			/* the server's response ended as framed */
	bool began;			/* some of it was written to the guest's TLS */
	bool answered;			/* the guest has our answer, or is to get none */
	bool cut;			/* the response was cut short: reset the guest */
	int64_t head_deadline;		/* ms: the request's head must have come by then */
	bool waits;			/* an answer waits for the guest to read it */
	bool continued;			/* our 100 Continue was due (once) */
	size_t continue_left;		/* its bytes not yet written to the guest's TLS */
	bool notified;			/* close_notify queued for the guest */
	uint32_t echo_said;		/* the secrets logged as echoed (bit k for hs[k]) */
};

/* ---- small helpers ------------------------------------------------------------ */

static size_t q_used(const struct nbuf *b)
{
	return b->len - b->off;
}

/* Room at the end of b, compacting first. */
static size_t q_tail(struct nbuf *b)
{
	if (b->off) {
		memmove(b->owned_data, b->owned_data + b->off, b->len - b->off);
		b->len -= b->off;
		b->off = 0;
	}
	return NETD_BUF - b->len;
}

static size_t pending(BIO *b)
{
	return BIO_ctrl_pending(b);
}

/* Why OpenSSL failed, from its error queue (then emptied). */
static const char *ssl_why(char *buf, size_t len, const char *fallback)
{
	unsigned long e = ERR_peek_last_error();

	if (e) {
		const char *r = ERR_reason_error_string(e);
		if (r)
			snprintf(buf, len, "%s", r);
		else
			ERR_error_string_n(e, buf, len);
	} else {
		snprintf(buf, len, "%s", fallback);
	}
	ERR_clear_error();
	return buf;
}

/* ---- start-up ------------------------------------------------------------------- */

/* Seconds since the epoch of an ASN1_TIME; -1 when unreadable. */
static int64_t asn1_seconds(const ASN1_TIME *t)
{
	struct tm tm;

	if (!t || ASN1_TIME_to_tm(t, &tm) != 1)
		return -1;
	return (int64_t)timegm(&tm);
}

/* The CA's key and certificate; false with why. */
static bool load_ca(struct netd_tls *t, const struct cap_netd_config *cfg, char *why, size_t wl)
{
	char e[200];

	if (!cfg->ca_key_pem || !cfg->ca_cert_pem) {
		snprintf(why, wl, "no CA key or certificate given");
		return false;
	}
	if (!(t->ca_key = cap_net_pem_key(cfg->ca_key_pem))) {
		snprintf(why, wl, "the CA key cannot be read: %s", ssl_why(e, sizeof(e), "not a PEM key"));
		return false;
	}
	if (!(t->ca_cert = cap_net_pem_cert(cfg->ca_cert_pem))) {
		snprintf(why, wl, "the CA certificate cannot be read: %s",
			 ssl_why(e, sizeof(e), "not a PEM certificate"));
		return false;
	}
	if (X509_check_private_key(t->ca_cert, t->ca_key) != 1) {
		ERR_clear_error();
		snprintf(why, wl, "the CA key does not match the CA certificate");
		return false;
	}
	if (X509_check_ca(t->ca_cert) == 0) {
		snprintf(why, wl, "the CA certificate is not a CA's");
		return false;
	}
	t->ca_end = asn1_seconds(X509_get0_notAfter(t->ca_cert));
	if (t->ca_end <= time(NULL)) {
		snprintf(why, wl, "the CA certificate has expired (or its end cannot be read)");
		return false;
	}
	return true;
}

/* The trust store: every certificate of the PEM bundle. */
static X509_STORE *load_trust(const struct cap_netd_config *cfg, char *why, size_t wl)
{
	X509_STORE *store = X509_STORE_new();
	unsigned n = 0;

	if (!store) {
		snprintf(why, wl, "out of memory");
		return NULL;
	}
	if (cfg->trust_pem && cfg->trust_len)
		n = cap_net_pem_certs(cfg->trust_pem, cfg->trust_len, store);
	if (!n) {
		snprintf(why, wl, "no certificate in the trust store: no server could be verified");
		X509_STORE_free(store);
		return NULL;
	}
	return store;
}

static SSL_CTX *ctx_common(const SSL_METHOD *m)
{
	SSL_CTX *ctx = SSL_CTX_new(m);

	if (!ctx)
		return NULL;
	if (SSL_CTX_set_min_proto_version(ctx, TLS1_2_VERSION) != 1) {
		SSL_CTX_free(ctx);
		return NULL;
	}
	SSL_CTX_set_options(ctx, SSL_OP_NO_RENEGOTIATION | SSL_OP_NO_COMPRESSION);
	SSL_CTX_set_mode(ctx, SSL_MODE_ENABLE_PARTIAL_WRITE | SSL_MODE_RELEASE_BUFFERS);
	SSL_CTX_set_session_cache_mode(ctx, SSL_SESS_CACHE_OFF);
	return ctx;
}

int intercept_init(struct netd *d)
{
	const struct cap_netd_config *cfg = d->cfg;
	char why[300], e[200];

	d->owned_tls = NULL;
	if (!cfg->nsecrets)
		return 0;
	/* The process's root holds no openssl.cnf: none is read. */
	OPENSSL_init_ssl(OPENSSL_INIT_NO_LOAD_CONFIG, NULL);
	struct netd_tls *t = xcalloc(1, sizeof(*t));
	X509_STORE *store = NULL;
	d->owned_tls = t;
	if (!load_ca(t, cfg, why, sizeof(why)))
		goto fail;
	store = load_trust(cfg, why, sizeof(why));
	if (!store)
		goto fail;
	t->leaf_key = EVP_EC_gen("P-256");
	if (!t->leaf_key) {
		snprintf(why, sizeof(why), "cannot make a key: %s", ssl_why(e, sizeof(e), "EC P-256"));
		goto fail;
	}
	t->server = ctx_common(TLS_server_method());
	t->client = ctx_common(TLS_client_method());
	if (!t->server || !t->client) {
		snprintf(why, sizeof(why), "cannot make a TLS context: %s", ssl_why(e, sizeof(e), "?"));
		goto fail;
	}
	/* One TLS 1.3 ticket, as ordinary servers send: it goes right
	 * after the guest's Finished and carries the ACK its request waits
	 * for (a client with Nagle's algorithm holds a small request until
	 * its Finished is acknowledged; with nothing to send back, the
	 * kernel here delays that ACK by 40 ms: make bench's row (j) measured
	 * 48 ms a request without it, 7 ms with it). A ticket is only good
	 * here, for this process's life, and resuming changes nothing: the
	 * name, the upstream and the secrets come from the connection, not
	 * from the session. */
	SSL_CTX_set_num_tickets(t->server, 1);
	/* The guest's side at security level 0: busybox wget's TLS (the
	 * base image's only client) signs with SHA-1 only, which level 1
	 * refuses. This TLS runs between the guest and this process over
	 * the sandbox's own virtual link, where no one else can be; its
	 * strength protects nothing from the guest, the one party that
	 * could see it. The real server's side keeps OpenSSL's default level
	 * and full verification. */
	SSL_CTX_set_security_level(t->server, 0);
	SSL_CTX_set_verify(t->client, SSL_VERIFY_PEER, NULL);
	SSL_CTX_set_cert_store(t->client, store);	/* the context owns it */
	store = NULL;
	/* A server that ends without close_notify ends the response: the
	 * rewriter checks its framing. */
	SSL_CTX_set_options(t->client, SSL_OP_IGNORE_UNEXPECTED_EOF);
	static const unsigned char alpn[] = "\x08http/1.1";
	if (SSL_CTX_set_alpn_protos(t->client, alpn, sizeof(alpn) - 1) != 0) {
		snprintf(why, sizeof(why), "cannot set ALPN: %s", ssl_why(e, sizeof(e), "?"));
		goto fail;
	}
	if (cfg->verbose)
		netd_log(d, "tls interception ready for %u secret(s)", cfg->nsecrets);
	return 0;
fail:
	netd_log(d, "cannot intercept the secrets' connections: %s; the network of %s does not start",
		 why, cfg->name ? cfg->name : "this sandbox");
	X509_STORE_free(store);
	intercept_fini(d);
	return -1;
}

void intercept_fini(struct netd *d)
{
	struct netd_tls *t = d->owned_tls;

	if (!t)
		return;
	for (unsigned i = 0; i < NETD_LEAVES; i++)
		X509_free(t->leaves[i].cert);
	SSL_CTX_free(t->server);
	SSL_CTX_free(t->client);
	X509_free(t->ca_cert);
	EVP_PKEY_free(t->ca_key);
	EVP_PKEY_free(t->leaf_key);
	free(t);
	d->owned_tls = NULL;
}

bool intercept_wanted(const struct netd *d, const char *name)
{
	if (!d->owned_tls || !name || !*name)
		return false;
	for (unsigned i = 0; i < d->cfg->nsecrets; i++)
		if (cap_net_secret_host_match(d->cfg->secrets[i].decl, name))
			return true;
	return false;
}

/* ---- one connection ------------------------------------------------------------------ */

void intercept_free(struct conn *c)
{
	struct icpt *i = c->owned_icpt;

	if (!i)
		return;
	SSL_free(i->g);
	SSL_free(i->u);
	cap_http_req_free(i->req);
	cap_http_resp_free(i->resp);
	for (unsigned k = 0; k < i->nhs; k++)
		if (i->owned_values[k]) {
			explicit_bzero(i->owned_values[k], i->hs[k].value_len);
			free(i->owned_values[k]);
		}
	cap_buf_fini(&i->req_out);
	cap_buf_fini(&i->resp_out);
	free(i->to_b.owned_data);
	explicit_bzero(i, sizeof(*i));
	free(i);
	c->owned_icpt = NULL;
}

static SSL *ssl_new(SSL_CTX *ctx, BIO **in, BIO **out)
{
	SSL *s = SSL_new(ctx);
	BIO *r = BIO_new(BIO_s_mem()), *w = BIO_new(BIO_s_mem());

	if (!s || !r || !w) {
		SSL_free(s);
		BIO_free(r);
		BIO_free(w);
		return NULL;
	}
	/* Empty is "try again" until the socket's end is seen. */
	BIO_set_mem_eof_return(r, -1);
	SSL_set_bio(s, r, w);
	*in = r;
	*out = w;
	return s;
}

bool intercept_start(struct netd *d, struct conn *c, const char *name)
{
	struct netd_tls *t = d->owned_tls;
	const struct cap_netd_config *cfg = d->cfg;
	char e[200];

	CAP_BUG_ON(!t || c->owned_icpt);
	struct icpt *i = xcalloc(1, sizeof(*i));
	c->owned_icpt = i;
	snprintf(i->name, sizeof(i->name), "%s", name);
	cap_buf_init(&i->req_out);
	cap_buf_init(&i->resp_out);
	/* What goes to the server holds values; what comes back held them
	 * until the rewriter replaced them. */
	i->req_out.wipe = i->resp_out.wipe = true;
	i->to_b.owned_data = xmalloc(NETD_BUF);
	i->nhs = CAP_MIN(cfg->nsecrets, CAP_HTTP_MAX_SECRETS);
	for (unsigned k = 0; k < i->nhs; k++) {
		const struct cap_netd_secret *s = &cfg->secrets[k];
		/* The value as of now, the connection's own: a later "secret"
		 * line changes the next connection's, never this one's. */
		const char *v = d->owned_values[k] ? d->owned_values[k] : s->value;
		size_t vl = d->owned_values[k] ? d->value_lens[k] : s->value_len;
		i->owned_values[k] = xmalloc(vl + 1);
		memcpy(i->owned_values[k], v, vl);
		i->owned_values[k][vl] = '\0';
		i->hs[k] = (struct cap_http_secret){
			.name = s->decl->name, .placeholder = s->placeholder, .value = i->owned_values[k],
			.value_len = vl, .body = s->decl->body,
			.applies = cap_net_secret_host_match(s->decl, name),
		};
	}
	i->req = cap_http_req_new(name, c->port, i->hs, i->nhs);
	/* TLS records and a rewritten head go out in pieces: without this,
	 * Nagle's algorithm holds each second piece for the peer's delayed
	 * ACK (40 ms a time, measured by make bench's row (j) as 80 ms a
	 * request). */
	static const int one = 1;
	setsockopt(c->a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (c->b >= 0)
		setsockopt(c->b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));

	ERR_clear_error();
	X509 *leaf = leaf_for(t, name);
	if (!leaf) {
		netd_log(d, "refused tls %s:%u: cannot make its certificate: %s", name, c->port,
			 ssl_why(e, sizeof(e), "?"));
		goto fail;
	}
	i->g = ssl_new(t->server, &i->g_in, &i->g_out);
	i->u = ssl_new(t->client, &i->u_in, &i->u_out);
	if (!i->g || !i->u || SSL_use_certificate(i->g, leaf) != 1 ||
	    SSL_use_PrivateKey(i->g, t->leaf_key) != 1 || SSL_add1_chain_cert(i->g, t->ca_cert) != 1 ||
	    SSL_set_tlsext_host_name(i->u, name) != 1 || SSL_set1_host(i->u, name) != 1) {
		netd_log(d, "refused tls %s:%u: %s", name, c->port, ssl_why(e, sizeof(e), "out of memory"));
		goto fail;
	}
	SSL_set_hostflags(i->u, X509_CHECK_FLAG_NO_PARTIAL_WILDCARDS);
	SSL_set_accept_state(i->g);
	SSL_set_connect_state(i->u);

	/* The ClientHello, and anything after it, is the guest's TLS. */
	if (q_used(&c->up) &&
	    BIO_write(i->g_in, c->up.owned_data + c->up.off, (int)q_used(&c->up)) != (int)q_used(&c->up)) {
		netd_log(d, "refused tls %s:%u: out of memory", name, c->port);
		goto fail;
	}
	c->up.off = c->up.len = 0;
	if (c->a_eof)
		BIO_set_mem_eof_return(i->g_in, 0);
	c->sniff = false;
	c->state = ST_TLS;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
	if (cfg->verbose)
		netd_log(d, "intercepting tls %s:%u", name, c->port);
	unsigned slot = c->slot;
	uint64_t id = c->id;
	intercept_events(d, c, 0, 0);	/* may end c */
	return conn_find(d, slot, id) != NULL;
fail:
	conn_free(d, c, true);
	return false;
}

void intercept_poll_events(const struct conn *c, short *ea, short *eb)
{
	const struct icpt *i = c->owned_icpt;

	*ea = *eb = 0;
	if (!c->a_eof && pending(i->g_in) < NETD_BUF)
		*ea |= POLLIN;
	if (q_used(&c->down))
		*ea |= POLLOUT;
	if (!i->u_gone) {
		if (!c->b_eof && pending(i->u_in) < NETD_BUF)
			*eb |= POLLIN;
		if (q_used(&i->to_b))
			*eb |= POLLOUT;
	}
}

/* Read what fd has into the memory BIO (at most NETD_BUF waiting): 0, or
 * -1 on an error (the connection is to end). */
static int sock_to_bio(int fd, BIO *bio, bool *eof)
{
	uint8_t p[CHUNK];

	while (!*eof && pending(bio) < NETD_BUF) {
		ssize_t r = read(fd, p, sizeof(p));
		if (r < 0)
			return errno == EAGAIN || errno == EINTR ? 0 : -1;
		if (r == 0) {
			*eof = true;
			BIO_set_mem_eof_return(bio, 0);
			return 0;
		}
		if (BIO_write(bio, p, (int)r) != (int)r)
			return -1;
	}
	return 0;
}

/* Move what the BIO holds into q, as room allows. */
static void bio_to_queue(BIO *bio, struct nbuf *q)
{
	size_t n = CAP_MIN(pending(bio), q_tail(q));

	if (!n)
		return;
	int r = BIO_read(bio, q->owned_data + q->len, (int)n);
	if (r > 0)
		q->len += (size_t)r;
}

/* Write q to fd: the bytes written, or -1 when fd failed. */
static ssize_t queue_to_sock(int fd, struct nbuf *q)
{
	if (!q_used(q))
		return 0;
	ssize_t w = send(fd, q->owned_data + q->off, q_used(q), MSG_NOSIGNAL | MSG_DONTWAIT);
	if (w < 0)
		return errno == EAGAIN || errno == EINTR ? 0 : -1;
	q->off += (size_t)w;
	if (q->off == q->len)
		q->off = q->len = 0;
	return w;
}

/* No more to or from the server. */
static void drop_upstream(struct conn *c)
{
	struct icpt *i = c->owned_icpt;

	if (i->u_gone)
		return;
	i->u_gone = true;
	i->resp_done = true;
	if (c->b >= 0)
		close(c->b);
	c->b = -1;
	i->to_b.off = i->to_b.len = 0;
	/* What was to go there may hold a value. */
	if (i->req_out.owned_data)
		explicit_bzero(i->req_out.owned_data, i->req_out.cap);
	i->req_out.off = i->req_out.len = 0;
}

/* Answer the guest ourselves (status and a short text), over its TLS,
 * and end: nothing more goes to or comes from the server. What the
 * server sent that has not reached the guest yet is replaced; a whole
 * response is not. When part of an unfinished one has reached the guest,
 * it is cut short: the guest's connection is reset without close_notify
 * (c->owned_icpt->cut), as its response is delimited by the connection's
 * end: an orderly end would pass the part off as the whole. */
static void answer(struct netd *d, struct conn *c, int status, const char *text)
{
	struct icpt *i = c->owned_icpt;
	bool whole = i->whole;
	char head[600];

	drop_upstream(c);
	i->req_done = true;
	if (i->began && !whole) {
		netd_log(d, "the response of %s:%u was cut short: %s", i->name, c->port, text);
		i->cut = true;
		return;
	}
	if (i->answered || whole)
		return;
	int n = snprintf(head, sizeof(head),
			 "HTTP/1.1 %d %s\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n%s\n",
			 status, status_text(status), strlen(text) + 1, text);
	CAP_BUG_ON(n < 0 || (size_t)n >= sizeof(head));
	if (cap_buf_used(&i->resp_out))
		cap_buf_consume(&i->resp_out, cap_buf_used(&i->resp_out));
	cap_buf_append(&i->resp_out, head, (size_t)n);
	i->answered = true;
}

/* c's request for a log line: METHOD "TARGET" (the method a token, as
 * the rewriter checked; the target as the guest sent it, quoted), or ""
 * before its request line was read. Returns buf. */
static const char *request_text(const struct conn *c, char *buf, size_t len)
{
	const struct icpt *i = c->owned_icpt;
	const char *m = cap_http_req_method(i->req), *t = cap_http_req_target(i->req);
	char q[240];

	if (!*m)
		buf[0] = '\0';
	else
		snprintf(buf, len, "%.32s %s", m, cap_sniff_quote(t, strlen(t), q, sizeof(q)));
	return buf;
}

/* "NAME:PORT METHOD "TARGET"" of c's request, for a log line. */
static void log_request(const struct conn *c, char *line, size_t len)
{
	const struct icpt *i = c->owned_icpt;
	char rt[300];

	request_text(c, rt, sizeof(rt));
	snprintf(line, len, "%s:%u%s%s", i->name, c->port, *rt ? " " : "", rt);
}

static void req_refused(struct netd *d, struct conn *c, const struct cap_http_refusal *why)
{
	char what[640];

	log_request(c, what, sizeof(what));
	netd_log(d, "refused https %s: %s", what, why->reason);
	answer(d, c, why->status, why->reason);
}

/* The request ended: say which secrets it carried (verbose). */
static void req_ended(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	char rt[300];

	i->req_done = true;
	if (!d->cfg->verbose)
		return;
	uint32_t sub = cap_http_req_substituted(i->req);
	for (unsigned k = 0; k < i->nhs; k++)
		if (sub & (1u << k))
			netd_log(d, "secret %s sent to %s:%u (%s)", i->hs[k].name, i->name, c->port,
				 request_text(c, rt, sizeof(rt)));
}

/* The guest's plaintext into the rewriter, while its output has gone. */
static void from_guest(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	struct cap_http_refusal why;
	uint8_t p[CHUNK];

	while (i->g_done && !i->notified && cap_buf_used(&i->req_out) == 0) {
		ERR_clear_error();
		int n = SSL_read(i->g, p, sizeof(p));
		if (n <= 0) {
			int e = SSL_get_error(i->g, n);
			if (e == SSL_ERROR_WANT_READ)
				return;
			if (i->req_done) {
				/* The guest is gone or has ended its side after its
				 * request: its answer may still come. */
				ERR_clear_error();
				return;
			}
			if (i->got_request) {
				int r = cap_http_req_eof(i->req, &why);
				if (r < 0) {
					req_refused(d, c, &why);
					return;
				}
				req_ended(d, c);
				return;
			}
			/* Nothing asked: nothing to answer. */
			ERR_clear_error();
			drop_upstream(c);
			i->req_done = true;
			i->answered = true;
			return;
		}
		if (i->req_done || i->u_gone)
			continue;	/* after the one request (or the server): never forwarded */
		i->got_request = true;
		size_t off = 0;
		while (off < (size_t)n) {
			size_t used = 0;
			int r = cap_http_req_feed(i->req, p + off, (size_t)n - off, &used, &i->req_out,
						  &why);
			off += used;
			if (r < 0) {
				explicit_bzero(p, sizeof(p));
				req_refused(d, c, &why);
				return;
			}
			if (r == CAP_HTTP_DONE) {
				req_ended(d, c);
				break;
			}
			if (!i->continued && cap_http_req_continue(i->req)) {
				i->continued = true;
				i->continue_left = sizeof(continue_100) - 1;
			}
			if (used == 0)
				break;
		}
	}
}

/* The rewritten request to the server's TLS, wiping what was sent. */
static int to_server(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;

	while (i->u_done && !i->u_gone && cap_buf_used(&i->req_out) &&
	       pending(i->u_out) + q_used(&i->to_b) < NETD_BUF) {
		size_t n = CAP_MIN(cap_buf_used(&i->req_out), (size_t)CHUNK);
		uint8_t *p = i->req_out.owned_data + i->req_out.off;
		ERR_clear_error();
		int w = SSL_write(i->u, p, (int)n);
		if (w <= 0) {
			int e = SSL_get_error(i->u, w);
			if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
				return 0;
			return -1;
		}
		__atomic_fetch_add(&d->counters->bytes_out, (uint64_t)w, __ATOMIC_RELAXED);
		explicit_bzero(p, (size_t)w);
		cap_buf_consume(&i->req_out, (size_t)w);
	}
	return 0;
}

/* Name the secrets whose value the response held (replaced by their
 * placeholders) that were not named yet: each once per connection. */
static void echoed(struct netd *d, const struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	uint32_t fresh = cap_http_resp_echoed_mask(i->resp) & ~i->echo_said;

	i->echo_said |= fresh;
	for (unsigned k = 0; k < i->nhs; k++)
		if (fresh & (1u << k))
			netd_log(d, "the response of %s:%u held secret %s's value: replaced by its placeholder",
				 i->name, c->port, i->hs[k].name);
}

/* The server's response through the rewriter. */
static void from_server(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	struct cap_http_refusal why;
	uint8_t p[CHUNK];
	char what[640], e[200];

	while (i->u_done && !i->resp_done && cap_buf_used(&i->resp_out) < NETD_BUF) {
		ERR_clear_error();
		int n = SSL_read(i->u, p, sizeof(p));
		int r;
		if (!i->resp)
			i->resp = cap_http_resp_new(i->hs, i->nhs,
						    !strcmp(cap_http_req_method(i->req), "HEAD"));
		if (n > 0) {
			r = cap_http_resp_feed(i->resp, p, (size_t)n, &i->resp_out, &why);
			explicit_bzero(p, (size_t)n);
		} else {
			int err = SSL_get_error(i->u, n);
			if (err == SSL_ERROR_WANT_READ)
				return;
			if (err != SSL_ERROR_ZERO_RETURN) {
				/* Not an end (an unexpected EOF counts as one, the
				 * rewriter judging the framing): whatever the body's
				 * framing, the response is not whole. */
				log_request(c, what, sizeof(what));
				netd_log(d, "https %s: the server's TLS failed: %s", what,
					 ssl_why(e, sizeof(e), "?"));
				answer(d, c, 502, "the server's TLS failed");
				return;
			}
			r = cap_http_resp_eof(i->resp, &i->resp_out, &why);
		}
		echoed(d, c);
		if (r < 0) {
			log_request(c, what, sizeof(what));
			netd_log(d, "refused the response to https %s: %s", what, why.reason);
			answer(d, c, why.status ? why.status : 502, why.reason);
			return;
		}
		if (r == CAP_HTTP_DONE) {
			i->whole = true;
			drop_upstream(c);
		}
	}
}

/* Our 100 Continue, then the response as rewritten (or our answer), to
 * the guest's TLS; then close_notify. */
static int to_guest(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;

	while (i->g_done && i->continue_left && pending(i->g_out) < NETD_BUF) {
		const char *p = continue_100 + (sizeof(continue_100) - 1 - i->continue_left);
		ERR_clear_error();
		int w = SSL_write(i->g, p, (int)i->continue_left);
		if (w <= 0) {
			int e = SSL_get_error(i->g, w);
			if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
				return 0;
			return -1;
		}
		i->continue_left -= (size_t)w;
	}
	while (i->g_done && !i->continue_left && cap_buf_used(&i->resp_out) &&
	       pending(i->g_out) < NETD_BUF) {
		size_t n = CAP_MIN(cap_buf_used(&i->resp_out), (size_t)CHUNK);
		ERR_clear_error();
		int w = SSL_write(i->g, cap_buf_head(&i->resp_out), (int)n);
		if (w <= 0) {
			int e = SSL_get_error(i->g, w);
			if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE)
				return 0;
			return -1;
		}
		__atomic_fetch_add(&d->counters->bytes_in, (uint64_t)w, __ATOMIC_RELAXED);
		cap_buf_consume(&i->resp_out, (size_t)w);
		if (!i->answered)
			i->began = true;
	}
	if (i->g_done && i->resp_done && !i->continue_left && !cap_buf_used(&i->resp_out) &&
	    !i->notified) {
		ERR_clear_error();
		SSL_shutdown(i->g);
		ERR_clear_error();
		i->notified = true;
	}
	return 0;
}

static void handshakes(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	char e[200];

	if (!i->g_done) {
		ERR_clear_error();
		int r = SSL_do_handshake(i->g);
		if (r == 1) {
			i->g_done = true;
		} else if (SSL_get_error(i->g, r) != SSL_ERROR_WANT_READ) {
			netd_log(d, "refused tls %s:%u: the guest's TLS handshake failed: %s (does it trust the sandbox's CA?)",
				 i->name, c->port,
				 ssl_why(e, sizeof(e), c->a_eof ? "the guest closed the connection" : "?"));
			i->req_done = i->resp_done = i->answered = i->notified = true;
			drop_upstream(c);
			return;
		}
	}
	if (!i->u_done && !i->u_gone) {
		ERR_clear_error();
		int r = SSL_do_handshake(i->u);
		if (r == 1) {
			i->u_done = true;
		} else if (SSL_get_error(i->u, r) != SSL_ERROR_WANT_READ) {
			long v = SSL_get_verify_result(i->u);
			if (v != X509_V_OK) {
				ERR_clear_error();
				netd_log(d, "refused tls %s:%u: the server's certificate is not trusted: %s",
					 i->name, c->port, X509_verify_cert_error_string(v));
				answer(d, c, 502, "the server's certificate is not trusted");
			} else {
				netd_log(d, "cannot reach %s:%u over tls: %s", i->name, c->port,
					 ssl_why(e, sizeof(e),
						 c->b_eof ? "the server closed the connection" : "?"));
				answer(d, c, 502, "cannot reach the server over TLS");
			}
			if (!i->g_done)
				i->notified = true;	/* no TLS to answer over: just end */
		}
	}
	if (i->g_done && i->u_done && !i->head_deadline)
		i->head_deadline = cap_now_ms() + NETD_TIMEOUT_MS;
}

/* c's deadline once the handshakes are done (until then, theirs, set by
 * intercept_start): while an answer waits for the guest, NETD_TIMEOUT_MS
 * from when it began to wait or the guest last took some of it (took);
 * else, while the request's head has not all come, head_deadline
 * (NETD_TIMEOUT_MS after the handshakes); else none: the guest sends its
 * body or the server is at work, and the server's own limits apply. So a
 * guest cannot pin a connection to the server by holding back its head
 * or by never reading its answer. */
static void rearm(struct conn *c, bool took)
{
	struct icpt *i = c->owned_icpt;

	if (!i->g_done || (!i->u_done && !i->u_gone))
		return;
	bool waits = i->continue_left || cap_buf_used(&i->resp_out) || pending(i->g_out) ||
		     q_used(&c->down);
	if (waits) {
		if (!i->waits || took)
			c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
	} else if (!i->req_done && !cap_http_req_head_read(i->req)) {
		c->deadline = i->head_deadline;
	} else {
		c->deadline = 0;
	}
	i->waits = waits;
}

/* All said: the last of the guest's TLS goes out as ST_REPLY would send
 * an answer (then its side is shut and what it still sends is read). */
static void finish(struct conn *c)
{
	struct icpt *i = c->owned_icpt;

	bio_to_queue(i->g_out, &c->down);
	drop_upstream(c);
	intercept_free(c);
	c->up.off = c->up.len = 0;
	c->state = ST_REPLY;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
}

void intercept_events(struct netd *d, struct conn *c, short ra, short rb)
{
	struct icpt *i = c->owned_icpt;
	bool took = false;
	ssize_t w;

	if ((ra & (POLLIN | POLLHUP | POLLERR)) && sock_to_bio(c->a, i->g_in, &c->a_eof) < 0)
		goto abort;
	if (!i->u_gone && (rb & (POLLIN | POLLHUP | POLLERR)) &&
	    sock_to_bio(c->b, i->u_in, &c->b_eof) < 0) {
		netd_log(d, "cannot reach %s:%u: %s", i->name, c->port, strerror(errno));
		answer(d, c, 502, "the connection to the server failed");
	}
	if (i->cut)
		goto abort;
	/* Until nothing moves: each step may unblock another. */
	for (unsigned round = 0; round < 8; round++) {
		size_t before = q_used(&c->down) + q_used(&i->to_b) + pending(i->g_in) +
				pending(i->u_in) + cap_buf_used(&i->req_out) + cap_buf_used(&i->resp_out) +
				pending(i->g_out) + pending(i->u_out);
		unsigned flags = i->g_done + 2 * i->u_done + 4 * i->req_done + 8 * i->resp_done + 16 * i->notified;
		handshakes(d, c);
		from_guest(d, c);
		if (to_server(d, c) < 0) {
			char e[200];
			netd_log(d, "cannot reach %s:%u over tls: %s", i->name, c->port,
				 ssl_why(e, sizeof(e), "write failed"));
			answer(d, c, 502, "the connection to the server failed");
		}
		from_server(d, c);
		if (i->cut || to_guest(d, c) < 0)
			goto abort;
		bio_to_queue(i->g_out, &c->down);
		if (!i->u_gone)
			bio_to_queue(i->u_out, &i->to_b);
		if ((w = queue_to_sock(c->a, &c->down)) < 0)
			goto abort;
		took |= w > 0;
		if (!i->u_gone && queue_to_sock(c->b, &i->to_b) < 0) {
			netd_log(d, "cannot reach %s:%u: %s", i->name, c->port, strerror(errno));
			answer(d, c, 502, "the connection to the server failed");
		}
		if (i->cut)
			goto abort;
		if (i->notified && pending(i->g_out) <= q_tail(&c->down)) {
			finish(c);
			return;
		}
		size_t after = q_used(&c->down) + q_used(&i->to_b) + pending(i->g_in) +
			       pending(i->u_in) + cap_buf_used(&i->req_out) + cap_buf_used(&i->resp_out) +
			       pending(i->g_out) + pending(i->u_out);
		unsigned flags2 = i->g_done + 2 * i->u_done + 4 * i->req_done + 8 * i->resp_done + 16 * i->notified;
		if (after == before && flags == flags2)
			break;
	}
	rearm(c, took);
	return;
abort:
	conn_free(d, c, true);
}

void intercept_timeout(struct netd *d, struct conn *c)
{
	struct icpt *i = c->owned_icpt;
	const int s = NETD_TIMEOUT_MS / 1000;

	if (!i->g_done || (!i->u_done && !i->u_gone))
		netd_log(d, "refused tls %s:%u: %s within %d s", i->name, c->port,
			 !i->g_done ? "the guest's TLS handshake did not end"
				    : "the server's TLS handshake did not end", s);
	else
		netd_log(d, "ended https %s:%u: the guest did not %s within %d s", i->name, c->port,
			 i->waits ? "read its answer" : "send its request's head", s);
	conn_free(d, c, true);
}
