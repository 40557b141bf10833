/* rewrite: see rewrite.h. Strict HTTP/1.1 framing (RFC 9112) for the
 * requests of a hostile guest and the responses of the servers it
 * reaches: whatever could be read two ways (by us and by the server
 * behind us) is refused, and what is forwarded is re-written in one
 * canonical form (one Content-Length, canonical chunks, no trailers). */
#include "rewrite.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "util.h"

#define CONN_OPTS_MAX 32	/* tokens named by Connection headers */
#define CHUNK_LINE_MAX 4096	/* a chunk-size line, extensions included */

/* ---- where bytes go ----------------------------------------------------- */

/* Where replaced bytes go: a cap_buf, a room sized beforehand, or a
 * count (what would be written). */
typedef void (*put_fn)(void *dst, const void *p, size_t n);

static void put_cap_buf(void *dst, const void *p, size_t n)
{
	cap_buf_append(dst, p, n);
}

/* dst: a size_t, the bytes put so far. */
static void put_count(void *dst, const void *p, size_t n)
{
	(void)p;
	*(size_t *)dst += n;
}

/* Reserved memory, filled from p up to end: the exact size is counted
 * first (put_count), so nothing that may hold a value is grown away from
 * and left behind. */
struct room {
	uint8_t *p, *end;
};

static void put_room(void *dst, const void *p, size_t n)
{
	struct room *r = dst;

	CAP_BUG_ON(n > (size_t)(r->end - r->p));
	if (n)
		memcpy(r->p, p, n);
	r->p += n;
}

static void put_str(put_fn put, void *dst, const char *s)
{
	put(dst, s, strlen(s));
}

/* Empty b, zeroing what it held, and keep it a wiping buffer (a value
 * may pass through it). */
static void buf_wipe(struct cap_buf *b)
{
	cap_buf_fini(b);
	b->wipe = true;
}

/* ---- replacing placeholders and values --------------------------------- */

enum direction {
	TO_VALUE,	/* placeholder -> value: requests */
	TO_PLACEHOLDER,	/* value -> placeholder: responses */
};

/* What is looked for going in direction d, and its length. */
static const char *from_of(const struct cap_http_secret *s, enum direction d, size_t *len)
{
	if (d == TO_VALUE) {
		*len = strlen(s->placeholder);
		return s->placeholder;
	}
	*len = s->value_len;
	return s->value;
}

/* What it is replaced with. */
static const char *to_of(const struct cap_http_secret *s, enum direction d, size_t *len)
{
	return from_of(s, d == TO_VALUE ? TO_PLACEHOLDER : TO_VALUE, len);
}

/* Which secret of mask starts at p[i] (the longest one fitting in n
 * bytes), or -1. */
static int match_at(const struct cap_http_secret *s, unsigned ns, uint32_t mask,
		    enum direction d, const uint8_t *p, size_t i, size_t n, size_t *mlen)
{
	int best = -1;

	*mlen = 0;
	for (unsigned k = 0; k < ns; k++) {
		/* The first byte first: this runs for every byte of a body. */
		const char *f = d == TO_VALUE ? s[k].placeholder : s[k].value;
		if (!(mask & (1u << k)) || p[i] != (uint8_t)f[0])
			continue;
		size_t l;
		from_of(&s[k], d, &l);
		if (l == 0 || l > n - i || l <= *mlen || memcmp(p + i, f, l))
			continue;
		best = (int)k;
		*mlen = l;
	}
	return best;
}

/* Copy p[0..n) through put (NULL: only look), every occurrence of a
 * secret of mask replaced, trying matches at the positions before limit
 * only (a match there may reach up to n). *stop (when not NULL) gets
 * where the copy ended (at least limit). Returns the secrets replaced.
 * A match is decided by the bytes from its start on alone, so feeding a
 * stream in pieces, with limit leaving the longest match minus one byte
 * for later, gives what one piece would. */
static uint32_t replace(const struct cap_http_secret *s, unsigned ns, uint32_t mask,
			enum direction d, const uint8_t *p, size_t n, size_t limit,
			size_t *stop, put_fn put, void *dst)
{
	uint32_t done = 0;
	size_t i = 0, start = 0;

	while (i < limit) {
		size_t ml;
		int k = match_at(s, ns, mask, d, p, i, n, &ml);
		if (k < 0) {
			i++;
			continue;
		}
		size_t tl;
		const char *t = to_of(&s[k], d, &tl);
		if (put) {
			put(dst, p + start, i - start);
			put(dst, t, tl);
		}
		done |= 1u << k;
		i += ml;
		start = i;
	}
	if (put)
		put(dst, p + start, i - start);
	if (stop)
		*stop = i;
	return done;
}

/* ---- heads: reading and lines ------------------------------------------ */

struct span {
	size_t off, len;
};

/* A head as it arrives: bytes up to and with the empty line, CR and LF
 * only as CRLF (checked as they come, so a bare LF is refused at once
 * rather than waited on up to the size limit). */
struct head {
	uint8_t buf[CAP_HTTP_HEAD_MAX];
	size_t len;
};

/* Take bytes of p into h until its end. 1: the head is whole (*used:
 * the bytes of p it took); 0: all of p taken, more needed; -EINVAL a bare
 * CR or LF (*why); -E2BIG over CAP_HTTP_HEAD_MAX. */
static int head_take(struct head *h, const uint8_t *p, size_t n, size_t *used,
		     const char **why)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t c = p[i], prev = h->len ? h->buf[h->len - 1] : 0;
		*used = i;
		if (h->len == sizeof(h->buf))
			return -E2BIG;
		if (c == '\n' && prev != '\r') {
			*why = "a line ended by a bare LF";
			return -EINVAL;
		}
		if (prev == '\r' && c != '\n') {
			*why = "a bare CR";
			return -EINVAL;
		}
		h->buf[h->len++] = c;
		if (h->len >= 4 && !memcmp(h->buf + h->len - 4, "\r\n\r\n", 4)) {
			*used = i + 1;
			return 1;
		}
	}
	*used = n;
	return 0;
}

static void head_reset(struct head *h)
{
	explicit_bzero(h->buf, h->len);
	h->len = 0;
}

/* The next line of a whole head from *pos, without its CRLF; false at
 * the empty line that ends it. head_take made every CR part of a CRLF. */
static bool next_line(const struct head *h, size_t *pos, struct span *line)
{
	const uint8_t *cr = memchr(h->buf + *pos, '\r', h->len - *pos);
	size_t end = (size_t)(cr - h->buf);

	if (end == *pos)
		return false;
	*line = (struct span){ *pos, end - *pos };
	*pos = end + 2;
	return true;
}

static bool tchar(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       (c && strchr("!#$%&'*+-.^_`|~", c));
}

static bool ows(uint8_t c)
{
	return c == ' ' || c == '\t';
}

/* A control character (tab aside) or DEL: never in a field value. */
static bool ctl(uint8_t c)
{
	return (c < 0x20 && c != '\t') || c == 0x7f;
}

static void trim(const uint8_t *b, struct span *s)
{
	while (s->len && ows(b[s->off])) {
		s->off++;
		s->len--;
	}
	while (s->len && ows(b[s->off + s->len - 1]))
		s->len--;
}

/* "NAME:VALUE" (RFC 9112 5): NAME a token right before the colon, VALUE
 * without control characters, its blanks trimmed. */
static int parse_field(const uint8_t *b, struct span line, struct span *name,
		       struct span *value, const char **why)
{
	size_t i = line.off, end = line.off + line.len;

	if (ows(b[i])) {
		*why = "obsolete line folding";
		return -EINVAL;
	}
	while (i < end && tchar(b[i]))
		i++;
	if (i < end && ows(b[i])) {
		*why = "whitespace before a header's colon";
		return -EINVAL;
	}
	if (i == line.off || i == end || b[i] != ':') {
		*why = "a header name that is not a token";
		return -EINVAL;
	}
	*name = (struct span){ line.off, i - line.off };
	*value = (struct span){ i + 1, end - i - 1 };
	for (size_t j = i + 1; j < end; j++)
		if (ctl(b[j])) {
			*why = "a control character in a header";
			return -EINVAL;
		}
	trim(b, value);
	return 0;
}

static bool span_is(const uint8_t *b, struct span s, const char *lower)
{
	size_t l = strlen(lower);
	return s.len == l && !strncasecmp((const char *)b + s.off, lower, l);
}

/* The next element of a comma-separated list value from *pos (within
 * v), blanks trimmed; false at its end. Empty elements are returned
 * (as empty spans): the callers decide. */
static bool next_element(const uint8_t *b, struct span v, size_t *pos, struct span *el)
{
	size_t end = v.off + v.len;

	if (*pos > end)
		return false;
	const uint8_t *comma = memchr(b + *pos, ',', end - *pos);
	size_t e = comma ? (size_t)(comma - b) : end;
	*el = (struct span){ *pos, e - *pos };
	trim(b, el);
	*pos = e + 1;
	return true;
}

static bool all_tchar(const uint8_t *b, struct span s)
{
	for (size_t i = 0; i < s.len; i++)
		if (!tchar(b[s.off + i]))
			return false;
	return s.len > 0;
}

/* ---- framing shared by requests and responses -------------------------- */

enum framing {
	FRAMING_NONE,	/* no body (requests), or until the end (responses) */
	FRAMING_LENGTH,
	FRAMING_CHUNKED,
};

/* What the header fields of a head say about the message, collected in
 * one pass. */
struct fields {
	enum framing framing;
	uint64_t length;
	bool has_length, has_te;
	bool te_other;		/* a transfer coding other than chunked */
	unsigned chunked;	/* how many times "chunked" is listed */
	unsigned hosts;
	struct span host;
	bool expect_continue;	/* an "Expect: 100-continue" */
	bool encoded;		/* a content coding other than identity */
	struct span coding;	/* the first one */
	struct span opts[CONN_OPTS_MAX];	/* named by Connection */
	unsigned nopts;
};

/* One Content-Length value, a list of equal decimal numbers. */
static int read_length(const uint8_t *b, struct span v, struct fields *f, const char **why)
{
	struct span el;
	size_t pos = v.off;

	while (next_element(b, v, &pos, &el)) {
		uint64_t n = 0;
		if (el.len == 0) {
			*why = "an empty Content-Length";
			return -EINVAL;
		}
		for (size_t i = 0; i < el.len; i++) {
			uint8_t c = b[el.off + i];
			if (c < '0' || c > '9' || n > (UINT64_MAX - 9) / 10) {
				*why = "a Content-Length that is not a number";
				return -EINVAL;
			}
			n = n * 10 + (uint64_t)(c - '0');
		}
		if (f->has_length && n != f->length) {
			*why = "differing Content-Lengths";
			return -EINVAL;
		}
		f->has_length = true;
		f->length = n;
	}
	return 0;
}

/* One Transfer-Encoding value: counted here, judged in framing_of. */
static int read_codings(const uint8_t *b, struct span v, struct fields *f, const char **why)
{
	struct span el;
	size_t pos = v.off;

	f->has_te = true;
	while (next_element(b, v, &pos, &el)) {
		if (el.len == 0) {
			*why = "an empty transfer coding";
			return -EINVAL;
		}
		if (span_is(b, el, "chunked")) {
			f->chunked++;
		} else {
			f->te_other = true;
		}
	}
	return 0;
}

/* One Connection value: its options, dropped from what is forwarded. */
static int read_options(const uint8_t *b, struct span v, struct fields *f, const char **why)
{
	struct span el;
	size_t pos = v.off;

	while (next_element(b, v, &pos, &el)) {
		if (el.len == 0)
			continue;	/* "a, , b": empty elements are allowed */
		if (!all_tchar(b, el)) {
			*why = "a Connection option that is not a token";
			return -EINVAL;
		}
		if (f->nopts == CONN_OPTS_MAX) {
			*why = "too many Connection options";
			return -EINVAL;
		}
		f->opts[f->nopts++] = el;
	}
	return 0;
}

/* One Content-Encoding value: its first coding other than identity. */
static void read_content_codings(const uint8_t *b, struct span v, struct fields *f)
{
	struct span el;
	size_t pos = v.off;

	while (!f->encoded && next_element(b, v, &pos, &el))
		if (el.len && !span_is(b, el, "identity")) {
			f->encoded = true;
			f->coding = el;
		}
}

/* Whether a field is "Expect: 100-continue" (the only expectation
 * there is, RFC 9110 10.1.1). */
static bool is_expect_continue(const uint8_t *b, struct span name, struct span value)
{
	return span_is(b, name, "expect") && span_is(b, value, "100-continue");
}

/* Read every field of a whole head from pos into f: syntax checked,
 * framing and Connection collected. */
static int read_fields(const struct head *h, size_t pos, struct fields *f, const char **why)
{
	const uint8_t *b = h->buf;
	struct span line, name, value;

	memset(f, 0, sizeof(*f));
	while (next_line(h, &pos, &line)) {
		if (parse_field(b, line, &name, &value, why) < 0)
			return -EINVAL;
		int rc = 0;
		if (span_is(b, name, "content-length"))
			rc = read_length(b, value, f, why);
		else if (span_is(b, name, "transfer-encoding"))
			rc = read_codings(b, value, f, why);
		else if (span_is(b, name, "connection"))
			rc = read_options(b, value, f, why);
		else if (span_is(b, name, "host")) {
			f->hosts++;
			f->host = value;
		} else if (is_expect_continue(b, name, value)) {
			f->expect_continue = true;
		} else if (span_is(b, name, "content-encoding")) {
			read_content_codings(b, value, f);
		}
		if (rc < 0)
			return rc;
	}
	return 0;
}

/* How the body is framed, from f (RFC 9112 6.3, refusing what a server
 * might read otherwise). 0, or -EINVAL (*why; *unsupported when the only
 * fault is a coding other than chunked). */
static int framing_of(struct fields *f, bool http10, bool *unsupported, const char **why)
{
	*unsupported = false;
	if (f->has_te && f->has_length) {
		*why = "both Content-Length and Transfer-Encoding";
		return -EINVAL;
	}
	if (f->has_te && http10) {
		*why = "Transfer-Encoding in HTTP/1.0";
		return -EINVAL;
	}
	if (f->te_other) {
		*unsupported = true;
		*why = "a transfer coding other than chunked";
		return -EINVAL;
	}
	if (f->chunked > 1) {
		*why = "chunked applied more than once";
		return -EINVAL;
	}
	f->framing = f->has_te ? FRAMING_CHUNKED : f->has_length ? FRAMING_LENGTH : FRAMING_NONE;
	return 0;
}

static bool framing_field(const uint8_t *b, struct span name)
{
	return span_is(b, name, "content-length") || span_is(b, name, "transfer-encoding");
}

/* Whether a field is one a proxy never passes on: Connection and the
 * like, and those the Connection headers named. */
static bool hop_by_hop(const uint8_t *b, struct span name, const struct fields *f)
{
	if (span_is(b, name, "connection") || span_is(b, name, "keep-alive") ||
	    span_is(b, name, "proxy-connection"))
		return true;
	/* Connection cannot take away what says where the message goes or
	 * where it ends. */
	if (span_is(b, name, "host") || framing_field(b, name))
		return false;
	for (unsigned i = 0; i < f->nopts; i++)
		if (name.len == f->opts[i].len &&
		    !strncasecmp((const char *)b + name.off, (const char *)b + f->opts[i].off,
				 name.len))
			return true;
	return false;
}

/* ---- chunked bodies ----------------------------------------------------- */

enum chunk_state {
	CK_SIZE,	/* hex digits */
	CK_BWS,		/* blanks after the size: an extension must follow */
	CK_EXT,		/* extensions: read and dropped */
	CK_SIZE_LF,
	CK_DATA,
	CK_DATA_CR,
	CK_DATA_LF,
	CK_TRAILER,	/* at the start of, or inside, a trailer line */
	CK_TRAILER_LF,
	CK_END_LF,	/* the CR of the empty line read */
	CK_END,
};

struct chunked {
	enum chunk_state state;
	uint64_t size;	/* the chunk's size, then what is left of it */
	unsigned digits;
	size_t line;	/* bytes of the size line, or of the trailer line */
	size_t trailers;	/* bytes of the trailer section */
};

enum {
	CHUNK_MORE,	/* all bytes taken */
	CHUNK_DATA,	/* data: the last *dlen bytes of the *used taken */
	CHUNK_END,	/* the last chunk and trailers read (*used) */
	CHUNK_BAD,	/* *why */
};

static int hexval(uint8_t c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	return -1;
}

/* One framing byte outside of data. 0, or -1 with *why. */
static int chunk_byte(struct chunked *c, uint8_t ch, const char **why)
{
	switch (c->state) {
	case CK_SIZE: {
		int d = hexval(ch);
		if (d >= 0) {
			if (c->size > (UINT64_MAX >> 4)) {
				*why = "a chunk size too large";
				return -1;
			}
			c->size = c->size << 4 | (uint64_t)d;
			c->digits++;
		} else if (c->digits == 0) {
			*why = "a chunk without a size";
			return -1;
		} else if (ch == ';') {
			c->state = CK_EXT;
		} else if (ows(ch)) {
			c->state = CK_BWS;
		} else if (ch == '\r') {
			c->state = CK_SIZE_LF;
		} else {
			*why = "a bad chunk size";
			return -1;
		}
		break;
	}
	case CK_BWS:
		if (ch == ';') {
			c->state = CK_EXT;
		} else if (!ows(ch)) {
			*why = "a bad chunk size";
			return -1;
		}
		break;
	case CK_EXT:
		if (ch == '\r') {
			c->state = CK_SIZE_LF;
		} else if (ctl(ch)) {
			*why = "a control character in a chunk extension";
			return -1;
		}
		break;
	case CK_SIZE_LF:
		if (ch != '\n') {
			*why = "a chunk size line not ended by CRLF";
			return -1;
		}
		c->state = c->size ? CK_DATA : CK_TRAILER;
		c->line = 0;
		return 0;
	case CK_DATA_CR:
	case CK_DATA_LF:
		if (ch != (c->state == CK_DATA_CR ? '\r' : '\n')) {
			*why = "chunk data not followed by CRLF";
			return -1;
		}
		if (c->state == CK_DATA_LF)
			*c = (struct chunked){ .state = CK_SIZE };
		else
			c->state = CK_DATA_LF;
		return 0;
	case CK_TRAILER:
		if (++c->trailers > CAP_HTTP_HEAD_MAX) {
			*why = "trailers too long";
			return -1;
		}
		if (ch == '\r') {
			c->state = c->line ? CK_TRAILER_LF : CK_END_LF;
		} else if (ctl(ch)) {
			*why = "a control character in a trailer";
			return -1;
		}
		c->line++;
		return 0;
	case CK_TRAILER_LF:
	case CK_END_LF:
		if (ch != '\n') {
			*why = "a trailer line not ended by CRLF";
			return -1;
		}
		c->state = c->state == CK_END_LF ? CK_END : CK_TRAILER;
		c->line = 0;
		return 0;
	case CK_DATA:
	case CK_END:
		CAP_BUG_ON(1);
	}
	if (++c->line > CHUNK_LINE_MAX) {
		*why = "a chunk size line too long";
		return -1;
	}
	return 0;
}

/* Read chunked framing from p[0..n) up to the next data, or the end. */
static int chunked_step(struct chunked *c, const uint8_t *p, size_t n, size_t *used,
			size_t *dlen, const char **why)
{
	*dlen = 0;
	for (size_t i = 0; i < n; i++) {
		if (c->state == CK_DATA) {
			size_t take = (size_t)CAP_MIN(c->size, (uint64_t)(n - i));
			c->size -= take;
			if (c->size == 0)
				c->state = CK_DATA_CR;
			*used = i + take;
			*dlen = take;
			return CHUNK_DATA;
		}
		if (chunk_byte(c, p[i], why) < 0) {
			*used = i;
			return CHUNK_BAD;
		}
		if (c->state == CK_END) {
			*used = i + 1;
			return CHUNK_END;
		}
	}
	*used = n;
	return CHUNK_MORE;
}

/* ---- requests ------------------------------------------------------------ */

enum req_state {
	REQ_HEAD,
	REQ_BODY_LENGTH,
	REQ_BODY_CHUNKED,
	REQ_DONE,
	REQ_FAILED,
};

struct cap_http_req {
	const struct cap_http_secret *s;
	unsigned ns;
	char host[256];
	uint16_t port;
	uint32_t head_mask;	/* secrets to put in the head: those that apply */
	uint32_t body_mask;	/* ... and in the body: those marked body too */
	uint32_t target_ok;	/* secrets whose value may go in a request target */
	uint32_t field_ok;	/* ... in a header value */

	enum req_state state;
	struct head head;
	struct span method, target, version;
	size_t fields;		/* offset of the first field line */
	struct fields f;
	bool hold;		/* the body is read whole and rewritten */
	bool continue_wanted;	/* hold, and an HTTP/1.1 guest waits for a 100 */
	uint64_t left;		/* Content-Length bytes still to come */
	struct chunked ck;
	struct cap_buf body;	/* hold: the body so far (wiping) */

	uint32_t substituted;
	char *owned_method, *owned_target;
	struct cap_http_refusal refusal;
};

/* Whether v can replace a placeholder without changing how its line is
 * read: no control character at all in a target, nor a blank. */
static bool fits(const char *v, size_t n, bool target)
{
	for (size_t i = 0; i < n; i++) {
		uint8_t c = (uint8_t)v[i];
		if (ctl(c) || (target && (c == ' ' || c == '\t')))
			return false;
	}
	return true;
}

struct cap_http_req *cap_http_req_new(const char *host, uint16_t port,
				      const struct cap_http_secret *s, unsigned n)
{
	struct cap_http_req *r = xcalloc(1, sizeof(*r));

	CAP_BUG_ON(n > CAP_HTTP_MAX_SECRETS || strlen(host) >= sizeof(r->host));
	snprintf(r->host, sizeof(r->host), "%s", host);
	r->port = port;
	r->s = s;
	r->ns = n;
	cap_buf_init(&r->body);
	r->body.wipe = true;
	for (unsigned i = 0; i < n; i++) {
		uint32_t bit = 1u << i;
		if (s[i].applies)
			r->head_mask |= bit;
		if (s[i].applies && s[i].body)
			r->body_mask |= bit;
		if (fits(s[i].value, s[i].value_len, true))
			r->target_ok |= bit;
		if (fits(s[i].value, s[i].value_len, false))
			r->field_ok |= bit;
	}
	return r;
}

void cap_http_req_free(struct cap_http_req *r)
{
	if (!r)
		return;
	cap_buf_fini(&r->body);
	free(r->owned_method);
	free(r->owned_target);
	explicit_bzero(r, sizeof(*r));
	free(r);
}

static int req_fail(struct cap_http_req *r, int status, const char *reason,
		    struct cap_http_refusal *why)
{
	r->state = REQ_FAILED;
	r->refusal.status = status;
	snprintf(r->refusal.reason, sizeof(r->refusal.reason), "%s", reason);
	*why = r->refusal;
	head_reset(&r->head);
	buf_wipe(&r->body);
	return -1;
}

/* Whether an authority (a Host value, or an absolute-form target's)
 * names the connection's host and port: the name in any case, with or
 * without the root's dot, the port omitted only when it is 443. */
static bool authority_matches(const struct cap_http_req *r, const uint8_t *a, size_t n)
{
	size_t hl = strlen(r->host);
	unsigned port = 0;

	if (n < hl || strncasecmp((const char *)a, r->host, hl))
		return false;
	if (n > hl && a[hl] == '.') {	/* "api.test." is api.test */
		a++;
		n--;
	}
	if (n == hl)
		return r->port == 443;
	if (a[hl] != ':' || n - hl - 1 == 0 || n - hl - 1 > 5)
		return false;
	for (size_t i = hl + 1; i < n; i++) {
		if (a[i] < '0' || a[i] > '9')
			return false;
		port = port * 10 + (unsigned)(a[i] - '0');
	}
	return port == r->port;
}

/* "METHOD SP TARGET SP HTTP/1.x" (RFC 9112 3). 0, or the status. */
static int parse_request_line(struct cap_http_req *r, struct span line, const char **why)
{
	const uint8_t *b = r->head.buf;
	const uint8_t *sp1 = memchr(b + line.off, ' ', line.len);
	const uint8_t *sp2 = memrchr(b + line.off, ' ', line.len);

	*why = "a malformed request line";
	if (!sp1 || sp1 == sp2)
		return 400;
	r->method = (struct span){ line.off, (size_t)(sp1 - b) - line.off };
	r->target = (struct span){ (size_t)(sp1 - b) + 1, (size_t)(sp2 - sp1) - 1 };
	r->version = (struct span){ (size_t)(sp2 - b) + 1, line.off + line.len - (size_t)(sp2 - b) - 1 };
	if (!all_tchar(b, r->method) || r->target.len == 0)
		return 400;
	for (size_t i = 0; i < r->target.len; i++) {
		uint8_t c = b[r->target.off + i];
		if (c <= ' ' || c == 0x7f) {
			*why = "a control character or blank in the request target";
			return 400;
		}
	}
	const uint8_t *v = b + r->version.off;
	if (r->version.len != 8 || memcmp(v, "HTTP/", 5) || v[6] != '.' ||
	    v[5] < '0' || v[5] > '9' || v[7] < '0' || v[7] > '9')
		return 400;
	if (v[5] != '1' || (v[7] != '0' && v[7] != '1')) {
		*why = "an HTTP version other than 1.0 and 1.1";
		return 505;
	}
	r->owned_method = xstrndup((const char *)b + r->method.off, r->method.len);
	r->owned_target = xstrndup((const char *)b + r->target.off, r->target.len);
	return 0;
}

/* The target's form (RFC 9112 3.2): a path, "*" for OPTIONS, or an
 * https:// URL naming the connection's authority. 0, or the status. */
static int check_target(const struct cap_http_req *r, const char **why)
{
	const uint8_t *t = r->head.buf + r->target.off;
	size_t n = r->target.len;
	static const char https[] = "https://";
	const size_t hl = sizeof(https) - 1;

	if (span_is(r->head.buf, r->method, "connect")) {
		*why = "CONNECT inside an intercepted connection";
		return 501;
	}
	if (t[0] == '/')
		return 0;
	if (n == 1 && t[0] == '*' && span_is(r->head.buf, r->method, "options"))
		return 0;
	if (n <= hl || strncasecmp((const char *)t, https, hl)) {
		*why = "a request target that is neither a path nor an https:// URL";
		return 400;
	}
	size_t e = hl;
	while (e < n && t[e] != '/' && t[e] != '?' && t[e] != '#')
		e++;
	if (memchr(t + hl, '@', e - hl)) {
		*why = "user information in the request target";
		return 400;
	}
	if (!authority_matches(r, t + hl, e - hl)) {
		*why = "a request target naming another host than the connection's";
		return 421;
	}
	return 0;
}

/* Check a whole request head and decide its body's fate. 0, or the
 * status with *why. */
static int check_request(struct cap_http_req *r, const char **why)
{
	const uint8_t *b = r->head.buf;
	struct span line;
	size_t pos = 0;
	bool unsupported;

	if (!next_line(&r->head, &pos, &line)) {
		*why = "an empty request line";
		return 400;
	}
	int status = parse_request_line(r, line, why);
	if (status)
		return status;
	r->fields = pos;
	if (read_fields(&r->head, pos, &r->f, why) < 0)
		return 400;
	if ((status = check_target(r, why)))
		return status;
	if (r->f.hosts != 1 || !authority_matches(r, b + r->f.host.off, r->f.host.len)) {
		*why = r->f.hosts == 0 ? "no Host header"
		       : r->f.hosts > 1 ? "more than one Host header"
					: "a Host header naming another host than the connection's";
		return 421;
	}
	bool http10 = b[r->version.off + 7] == '0';
	if (framing_of(&r->f, http10, &unsupported, why) < 0)
		return unsupported ? 501 : 400;
	r->hold = r->f.framing != FRAMING_NONE && r->body_mask;
	/* The server gets the head only with the body, so it cannot answer
	 * the expectation: the guest's 100 is ours to give (RFC 9110 10.1.1:
	 * not to HTTP/1.0). */
	r->continue_wanted = r->hold && r->f.expect_continue && !http10;
	if (r->hold && r->f.framing == FRAMING_LENGTH && r->f.length > CAP_HTTP_BODY_MAX) {
		*why = "a body to rewrite over the size limit";
		return 413;
	}
	return 0;
}

/* Whether a request field is passed on with placeholders replaced
 * (Host, checked as received, and the fields this code re-writes or
 * drops are not). */
static bool substitutable(const uint8_t *b, struct span name)
{
	return !span_is(b, name, "host") && !span_is(b, name, "accept-encoding");
}

static void write_head(const struct cap_http_req *r, int64_t length, put_fn put, void *dst);

/* Whether each value to put in the head fits where its placeholder is,
 * and the head as it goes upstream is within CAP_HTTP_HEAD_MAX: counted
 * as write_head writes it, with the values in (a value can be 160 times
 * its placeholder's length), the blank after each colon, the framing,
 * Accept-Encoding and Connection (a held body's Content-Length counted
 * at its longest, CAP_HTTP_BODY_MAX's digits). 0 with r->substituted set,
 * or the status with *why. Nothing is built before this says so. */
static int check_head_values(struct cap_http_req *r, const char **why)
{
	const uint8_t *b = r->head.buf;
	const struct cap_http_secret *s = r->s;
	struct span line, name, value;
	uint32_t in_target, in_fields = 0;
	size_t pos = r->fields, len = 0;

	in_target = replace(s, r->ns, r->head_mask, TO_VALUE, b + r->target.off, r->target.len,
			    r->target.len, NULL, NULL, NULL);
	while (next_line(&r->head, &pos, &line)) {
		parse_field(b, line, &name, &value, why);
		if (hop_by_hop(b, name, &r->f) || framing_field(b, name) || !substitutable(b, name))
			continue;
		in_fields |= replace(s, r->ns, r->head_mask, TO_VALUE, b + value.off, value.len,
				     value.len, NULL, NULL, NULL);
	}
	if ((in_target & ~r->target_ok) || (in_fields & ~r->field_ok)) {
		*why = "a secret's value that cannot go where its placeholder is";
		return 400;
	}
	write_head(r, r->hold ? (int64_t)CAP_HTTP_BODY_MAX : -1, put_count, &len);
	if (len > CAP_HTTP_HEAD_MAX) {
		*why = "a request head over the size limit as it would go upstream (the secrets' values "
		       "in, the fields the rewriting adds)";
		return 431;
	}
	r->substituted = in_target | in_fields;
	return 0;
}

/* The request head for upstream, through put: the request line and
 * fields with placeholders replaced, hop-by-hop fields and those
 * rewritten here dropped, then the framing (length: the held body's, or
 * -1 for chunked or none as received), then Accept-Encoding and
 * Connection. check_head_values said the values fit. */
static void write_head(const struct cap_http_req *r, int64_t length, put_fn put, void *dst)
{
	const uint8_t *b = r->head.buf;
	const struct cap_http_secret *s = r->s;
	struct span line, name, value;
	const char *ignored;
	size_t pos = r->fields;

	put(dst, b + r->method.off, r->method.len);
	put_str(put, dst, " ");
	replace(s, r->ns, r->head_mask, TO_VALUE, b + r->target.off, r->target.len,
		r->target.len, NULL, put, dst);
	put_str(put, dst, " ");
	put(dst, b + r->version.off, r->version.len);
	put_str(put, dst, "\r\n");
	while (next_line(&r->head, &pos, &line)) {
		parse_field(b, line, &name, &value, &ignored);
		if (hop_by_hop(b, name, &r->f) || framing_field(b, name) ||
		    span_is(b, name, "accept-encoding") ||
		    (r->hold && is_expect_continue(b, name, value)))
			continue;
		put(dst, b + name.off, name.len);
		put_str(put, dst, ": ");
		if (substitutable(b, name))
			replace(s, r->ns, r->head_mask, TO_VALUE, b + value.off, value.len,
				value.len, NULL, put, dst);
		else
			put(dst, b + value.off, value.len);
		put_str(put, dst, "\r\n");
	}
	char framing[64] = "";
	if (length >= 0)
		snprintf(framing, sizeof(framing), "Content-Length: %" PRId64 "\r\n", length);
	else if (r->f.framing == FRAMING_LENGTH)
		snprintf(framing, sizeof(framing), "Content-Length: %" PRIu64 "\r\n", r->f.length);
	else if (r->f.framing == FRAMING_CHUNKED)
		snprintf(framing, sizeof(framing), "Transfer-Encoding: chunked\r\n");
	put_str(put, dst, framing);
	put_str(put, dst, "Accept-Encoding: identity\r\n");
	put_str(put, dst, "Connection: close\r\n\r\n");
}

/* Append the head, and the held body with its values in (body_len bytes
 * then, as counted), to out in one piece: out grows once, to the exact
 * size, before any value is copied into it. */
static void emit(struct cap_http_req *r, struct cap_buf *out, size_t body_len)
{
	int64_t length = r->hold ? (int64_t)body_len : -1;
	size_t head_len = 0;

	write_head(r, length, put_count, &head_len);
	CAP_BUG_ON(head_len > CAP_HTTP_HEAD_MAX);	/* check_head_values counted it */
	struct room room;
	room.p = cap_buf_reserve(out, head_len + body_len);
	room.end = room.p + head_len + body_len;
	write_head(r, length, put_room, &room);
	if (r->hold && body_len)
		replace(r->s, r->ns, r->body_mask, TO_VALUE, cap_buf_head(&r->body),
			cap_buf_used(&r->body), cap_buf_used(&r->body), NULL, put_room, &room);
	CAP_BUG_ON(room.p != room.end);
	cap_buf_commit(out, head_len + body_len);
}

/* The body has all come: with a held one, write the head and the
 * rewritten body now (when within CAP_HTTP_BODY_MAX with its values in);
 * a streamed one is closed. */
static int req_finish(struct cap_http_req *r, struct cap_buf *out, struct cap_http_refusal *why)
{
	if (r->hold) {
		size_t body_len = 0;
		uint32_t done = 0;
		if (cap_buf_used(&r->body))
			done = replace(r->s, r->ns, r->body_mask, TO_VALUE, cap_buf_head(&r->body),
				       cap_buf_used(&r->body), cap_buf_used(&r->body), NULL, put_count,
				       &body_len);
		if (body_len > CAP_HTTP_BODY_MAX)
			return req_fail(r, 413,
					"a body to rewrite over the size limit once the secrets' values are in",
					why);
		r->substituted |= done;
		emit(r, out, body_len);
		buf_wipe(&r->body);
	} else if (r->f.framing == FRAMING_CHUNKED) {
		cap_buf_append(out, "0\r\n\r\n", 5);
	}
	head_reset(&r->head);
	r->state = REQ_DONE;
	return CAP_HTTP_DONE;
}

/* The head is whole: check it, write it (unless the body is held), and
 * go on to the body. */
static int req_head_done(struct cap_http_req *r, struct cap_buf *out,
			 struct cap_http_refusal *why)
{
	const char *reason;
	int status = check_request(r, &reason);

	if (!status)
		status = check_head_values(r, &reason);
	if (status)
		return req_fail(r, status, reason, why);
	if (!r->hold)
		emit(r, out, 0);
	switch (r->f.framing) {
	case FRAMING_NONE:
		return req_finish(r, out, why);
	case FRAMING_LENGTH:
		r->left = r->f.length;
		r->state = REQ_BODY_LENGTH;
		return r->left ? CAP_HTTP_MORE : req_finish(r, out, why);
	case FRAMING_CHUNKED:
		r->state = REQ_BODY_CHUNKED;
		return CAP_HTTP_MORE;
	}
	CAP_BUG_ON(1);
	return -1;
}

/* Body data: kept (held body, bounded) or passed on, as one chunk when
 * the request is chunked. */
static int req_data(struct cap_http_req *r, const uint8_t *p, size_t n, struct cap_buf *out,
		    struct cap_http_refusal *why)
{
	if (r->hold) {
		if (n > CAP_HTTP_BODY_MAX - cap_buf_used(&r->body))
			return req_fail(r, 413, "a body to rewrite over the size limit", why);
		cap_buf_append(&r->body, p, n);
	} else if (r->f.framing == FRAMING_CHUNKED) {
		char size[32];
		int l = snprintf(size, sizeof(size), "%zx\r\n", n);
		cap_buf_append(out, size, (size_t)l);
		cap_buf_append(out, p, n);
		cap_buf_append(out, "\r\n", 2);
	} else {
		cap_buf_append(out, p, n);
	}
	return CAP_HTTP_MORE;
}

int cap_http_req_feed(struct cap_http_req *r, const uint8_t *p, size_t n, size_t *used,
		      struct cap_buf *out, struct cap_http_refusal *why)
{
	size_t off = 0;
	int rc = CAP_HTTP_MORE;

	*used = 0;
	while (rc == CAP_HTTP_MORE && r->state < REQ_DONE && off < n) {
		size_t k = 0, dlen;
		const char *reason = NULL;
		switch (r->state) {
		case REQ_HEAD:
			rc = head_take(&r->head, p + off, n - off, &k, &reason);
			off += k;
			if (rc == -E2BIG)
				return req_fail(r, 431, "a request head over the size limit", why);
			if (rc < 0)
				return req_fail(r, 400, reason, why);
			rc = rc ? req_head_done(r, out, why) : CAP_HTTP_MORE;
			break;
		case REQ_BODY_LENGTH:
			k = (size_t)CAP_MIN(r->left, (uint64_t)(n - off));
			rc = req_data(r, p + off, k, out, why);
			off += k;
			r->left -= k;
			if (rc == CAP_HTTP_MORE && r->left == 0)
				rc = req_finish(r, out, why);
			break;
		case REQ_BODY_CHUNKED:
			rc = chunked_step(&r->ck, p + off, n - off, &k, &dlen, &reason);
			off += k;
			if (rc == CHUNK_BAD)
				return req_fail(r, 400, reason, why);
			if (rc == CHUNK_DATA)
				rc = req_data(r, p + off - dlen, dlen, out, why);
			else if (rc == CHUNK_END)
				rc = req_finish(r, out, why);
			else
				rc = CAP_HTTP_MORE;
			break;
		case REQ_DONE:
		case REQ_FAILED:
			CAP_BUG_ON(1);
		}
	}
	*used = off;
	if (r->state == REQ_FAILED) {
		*why = r->refusal;
		return -1;
	}
	return r->state == REQ_DONE ? CAP_HTTP_DONE : CAP_HTTP_MORE;
}

int cap_http_req_eof(struct cap_http_req *r, struct cap_http_refusal *why)
{
	if (r->state == REQ_DONE)
		return CAP_HTTP_DONE;
	if (r->state == REQ_FAILED) {
		*why = r->refusal;
		return -1;
	}
	return req_fail(r, 400, "the request ended early", why);
}

bool cap_http_req_continue(const struct cap_http_req *r)
{
	return r->continue_wanted && (r->state == REQ_BODY_LENGTH || r->state == REQ_BODY_CHUNKED);
}

bool cap_http_req_head_read(const struct cap_http_req *r)
{
	return r->state != REQ_HEAD;
}

uint32_t cap_http_req_substituted(const struct cap_http_req *r)
{
	return r->substituted;
}

const char *cap_http_req_method(const struct cap_http_req *r)
{
	return r->owned_method ? r->owned_method : "";
}

const char *cap_http_req_target(const struct cap_http_req *r)
{
	return r->owned_target ? r->owned_target : "";
}

/* ---- responses ----------------------------------------------------------- */

enum resp_state {
	RESP_HEAD,
	RESP_BODY_LENGTH,
	RESP_BODY_CHUNKED,
	RESP_BODY_EOF,		/* until upstream closes */
	RESP_DONE,
	RESP_FAILED,
};

struct cap_http_resp {
	const struct cap_http_secret *s;
	unsigned ns;
	uint32_t all;		/* every secret with a value */
	size_t keep;		/* the longest value minus one: held back */
	bool head_request;

	enum resp_state state;
	struct head head;
	uint64_t left;
	struct chunked ck;
	struct cap_buf pending;	/* body bytes not yet looked at in full (wiping) */

	uint32_t echoed;	/* the secrets whose value was replaced */
	int status;
	struct cap_http_refusal refusal;
};

struct cap_http_resp *cap_http_resp_new(const struct cap_http_secret *s, unsigned n,
					bool head_request)
{
	struct cap_http_resp *r = xcalloc(1, sizeof(*r));

	CAP_BUG_ON(n > CAP_HTTP_MAX_SECRETS);
	r->s = s;
	r->ns = n;
	r->head_request = head_request;
	cap_buf_init(&r->pending);
	r->pending.wipe = true;
	for (unsigned i = 0; i < n; i++) {
		if (s[i].value_len == 0)
			continue;
		r->all |= 1u << i;
		r->keep = CAP_MAX(r->keep, s[i].value_len - 1);
	}
	return r;
}

void cap_http_resp_free(struct cap_http_resp *r)
{
	if (!r)
		return;
	cap_buf_fini(&r->pending);
	explicit_bzero(r, sizeof(*r));
	free(r);
}

static int resp_fail(struct cap_http_resp *r, const char *reason, struct cap_http_refusal *why)
{
	r->state = RESP_FAILED;
	r->refusal.status = 502;
	snprintf(r->refusal.reason, sizeof(r->refusal.reason), "%s", reason);
	*why = r->refusal;
	head_reset(&r->head);
	buf_wipe(&r->pending);
	return -1;
}

/* The content codings of IANA's registry (RFC 9110 18.6) but identity,
 * as a refusal may name them: its own text, never the server's bytes. */
static const char *const registered_codings[] = {
	"aes128gcm", "br", "compress", "dcb", "dcz", "deflate", "exi", "gzip",
	"pack200-gzip", "x-compress", "x-gzip", "zstd",
};

/* A body in a content coding (gzip...): a value in it could not be seen,
 * so it is refused, naming the coding when it is a registered one. An
 * unregistered one is not quoted: the server's bytes may be anything,
 * a request's header with a secret's value in it reflected (issue 30). */
static int resp_fail_encoded(struct cap_http_resp *r, const struct fields *f,
			     struct cap_http_refusal *why)
{
	const char *name = "one not registered, not quoted";
	char reason[sizeof(r->refusal.reason)];

	for (size_t i = 0; i < CAP_ARRAY_SIZE(registered_codings); i++)
		if (span_is(r->head.buf, f->coding, registered_codings[i]))
			name = registered_codings[i];
	snprintf(reason, sizeof(reason),
		 "the server encoded its response (Content-Encoding: %s) despite Accept-Encoding: "
		 "identity: an echoed value could not be replaced", name);
	return resp_fail(r, reason, why);
}

/* Pass a head p[0..n) to out with every value replaced by its
 * placeholder (51 bytes, where a value may have 8), when it is
 * within CAP_HTTP_HEAD_MAX so: 0, or -1 (refused, nothing appended). */
static int scrub_head(struct cap_http_resp *r, const uint8_t *p, size_t n, struct cap_buf *out,
		      struct cap_http_refusal *why)
{
	size_t len = 0;

	replace(r->s, r->ns, r->all, TO_PLACEHOLDER, p, n, n, NULL, put_count, &len);
	if (len > CAP_HTTP_HEAD_MAX)
		return resp_fail(r, "a response head over the size limit as it would go to the guest "
				 "(the secrets' placeholders in, Connection added)", why);
	r->echoed |= replace(r->s, r->ns, r->all, TO_PLACEHOLDER, p, n, n, NULL, put_cap_buf, out);
	return 0;
}

/* Pass body bytes on, replaced, holding back the last r->keep bytes
 * (they could start a value the next bytes complete) unless final. */
static void scrub_body(struct cap_http_resp *r, const uint8_t *p, size_t n, bool final,
		       struct cap_buf *out)
{
	size_t stop, len;

	cap_buf_append(&r->pending, p, n);
	len = cap_buf_used(&r->pending);
	if (len == 0)
		return;
	size_t limit = final ? len : len > r->keep ? len - r->keep : 0;
	r->echoed |= replace(r->s, r->ns, r->all, TO_PLACEHOLDER, cap_buf_head(&r->pending), len,
			     limit, &stop, put_cap_buf, out);
	cap_buf_consume(&r->pending, stop);
}

static void resp_done(struct cap_http_resp *r, struct cap_buf *out)
{
	scrub_body(r, NULL, 0, true, out);
	buf_wipe(&r->pending);
	r->state = RESP_DONE;
}

/* "HTTP/1.x SP 3DIGIT [SP reason]" (RFC 9112 4; the SP before an empty
 * reason is often left out). The status, or -1. */
static int parse_status_line(const uint8_t *b, struct span line, bool *http10)
{
	const uint8_t *l = b + line.off;

	if (line.len < 12 || (memcmp(l, "HTTP/1.1 ", 9) && memcmp(l, "HTTP/1.0 ", 9)))
		return -1;
	*http10 = l[7] == '0';
	int status = 0;
	for (size_t i = 9; i < 12; i++) {
		if (l[i] < '0' || l[i] > '9')
			return -1;
		status = status * 10 + (l[i] - '0');
	}
	if (status < 100 || (line.len > 12 && l[12] != ' '))
		return -1;
	for (size_t i = 12; i < line.len; i++)
		if (ctl(l[i]))
			return -1;
	return status;
}

/* The final response's head for the guest: the status line and fields
 * but those of framing and connection, then "Connection: close". With
 * keep_length (a response to HEAD, a 304) one Content-Length stays: it is
 * the representation's, not this message's (RFC 9110 8.6), and no body
 * follows the head to be delimited by the connection's end. */
static int write_final_head(struct cap_http_resp *r, struct span status_line, size_t pos,
			    const struct fields *f, bool keep_length, struct cap_buf *out,
			    struct cap_http_refusal *why)
{
	const uint8_t *b = r->head.buf;
	struct span line, name, value;
	const char *ignored;
	struct cap_buf h;

	cap_buf_init(&h);
	h.wipe = true;
	cap_buf_append(&h, b + status_line.off, status_line.len);
	cap_buf_append(&h, "\r\n", 2);
	while (next_line(&r->head, &pos, &line)) {
		parse_field(b, line, &name, &value, &ignored);
		if (hop_by_hop(b, name, f) || framing_field(b, name))
			continue;
		cap_buf_append(&h, b + line.off, line.len);
		cap_buf_append(&h, "\r\n", 2);
	}
	if (keep_length && f->has_length) {
		char cl[64];
		snprintf(cl, sizeof(cl), "Content-Length: %" PRIu64 "\r\n", f->length);
		put_str(put_cap_buf, &h, cl);
	}
	put_str(put_cap_buf, &h, "Connection: close\r\n\r\n");
	int rc = scrub_head(r, cap_buf_head(&h), cap_buf_used(&h), out, why);
	cap_buf_fini(&h);
	return rc;
}

/* A whole response head: an interim one passes, the final one is
 * rewritten and says how its body comes. */
static int resp_head_done(struct cap_http_resp *r, struct cap_buf *out,
			  struct cap_http_refusal *why)
{
	struct span line;
	struct fields f;
	size_t pos = 0;
	bool http10, unsupported;
	const char *reason;

	if (!next_line(&r->head, &pos, &line))
		return resp_fail(r, "an empty status line", why);
	int status = parse_status_line(r->head.buf, line, &http10);
	if (status < 0)
		return resp_fail(r, "a malformed status line", why);
	if (read_fields(&r->head, pos, &f, &reason) < 0)
		return resp_fail(r, reason, why);
	if (status == 101)
		return resp_fail(r, "a protocol switch (101) that was not asked for", why);
	if (status < 200) {
		if (scrub_head(r, r->head.buf, r->head.len, out, why) < 0)
			return -1;
		head_reset(&r->head);
		return CAP_HTTP_MORE;
	}
	if (framing_of(&f, http10, &unsupported, &reason) < 0)
		return resp_fail(r, reason, why);
	bool bodiless = r->head_request || status == 204 || status == 304;
	if (f.encoded && !bodiless)
		return resp_fail_encoded(r, &f, why);
	if (write_final_head(r, line, pos, &f, r->head_request || status == 304, out, why) < 0)
		return -1;
	r->status = status;
	head_reset(&r->head);
	if (bodiless) {
		resp_done(r, out);
		return CAP_HTTP_DONE;
	}
	switch (f.framing) {
	case FRAMING_NONE:
		r->state = RESP_BODY_EOF;
		break;
	case FRAMING_LENGTH:
		r->left = f.length;
		r->state = RESP_BODY_LENGTH;
		if (r->left == 0) {
			resp_done(r, out);
			return CAP_HTTP_DONE;
		}
		break;
	case FRAMING_CHUNKED:
		r->state = RESP_BODY_CHUNKED;
		break;
	}
	return CAP_HTTP_MORE;
}

int cap_http_resp_feed(struct cap_http_resp *r, const uint8_t *p, size_t n,
		       struct cap_buf *out, struct cap_http_refusal *why)
{
	size_t off = 0;

	while (r->state < RESP_DONE && off < n) {
		size_t k = 0, dlen;
		const char *reason = NULL;
		int rc;
		switch (r->state) {
		case RESP_HEAD:
			rc = head_take(&r->head, p + off, n - off, &k, &reason);
			off += k;
			if (rc == -E2BIG)
				return resp_fail(r, "a response head over the size limit", why);
			if (rc < 0)
				return resp_fail(r, reason, why);
			if (rc && resp_head_done(r, out, why) < 0)
				return -1;
			break;
		case RESP_BODY_LENGTH:
			k = (size_t)CAP_MIN(r->left, (uint64_t)(n - off));
			scrub_body(r, p + off, k, false, out);
			off += k;
			r->left -= k;
			if (r->left == 0)
				resp_done(r, out);
			break;
		case RESP_BODY_CHUNKED:
			rc = chunked_step(&r->ck, p + off, n - off, &k, &dlen, &reason);
			off += k;
			if (rc == CHUNK_BAD)
				return resp_fail(r, reason, why);
			if (rc == CHUNK_DATA)
				scrub_body(r, p + off - dlen, dlen, false, out);
			else if (rc == CHUNK_END)
				resp_done(r, out);
			break;
		case RESP_BODY_EOF:
			scrub_body(r, p + off, n - off, false, out);
			off = n;
			break;
		case RESP_DONE:
		case RESP_FAILED:
			CAP_BUG_ON(1);
		}
	}
	if (r->state == RESP_FAILED) {
		*why = r->refusal;
		return -1;
	}
	return r->state == RESP_DONE ? CAP_HTTP_DONE : CAP_HTTP_MORE;
}

int cap_http_resp_eof(struct cap_http_resp *r, struct cap_buf *out,
		      struct cap_http_refusal *why)
{
	switch (r->state) {
	case RESP_DONE:
		return CAP_HTTP_DONE;
	case RESP_FAILED:
		*why = r->refusal;
		return -1;
	case RESP_BODY_EOF:
		resp_done(r, out);
		return CAP_HTTP_DONE;
	case RESP_HEAD:
		return resp_fail(r, "the response ended before its head did", why);
	case RESP_BODY_LENGTH:
	case RESP_BODY_CHUNKED:
		break;
	}
	/* What is held back may be the start of a value: it is dropped. */
	return resp_fail(r, "the response body ended early", why);
}

uint32_t cap_http_resp_echoed_mask(const struct cap_http_resp *r)
{
	return r->echoed;
}

int cap_http_resp_status(const struct cap_http_resp *r)
{
	return r->status;
}
