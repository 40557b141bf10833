/* The metrics endpoint's request decoder (serve-http.h). */
#include <errno.h>
#include <string.h>
#include <strings.h>

#include "serve-http.h"
#include "sniff.h"

static int answer(struct serve_http_req *out, int status, const char *why)
{
	out->status = status;
	out->why = why;
	return 1;
}

static bool is(const char *buf, const struct cap_span *s, const char *word)
{
	size_t n = strlen(word);
	return s->len == n && strncasecmp(buf + s->off, word, n) == 0;
}

/* A body is not taken: a Content-Length other than 0 (or not a number)
 * or any Transfer-Encoding. NULL when there is none. */
static const char *body_problem(const char *buf, const struct cap_http_head *h)
{
	size_t pos = h->fields;
	struct cap_span name, value;
	while (cap_http_field_next(buf, h, &pos, &name, &value)) {
		if (is(buf, &name, "transfer-encoding"))
			return "a request body (Transfer-Encoding) is not taken";
		if (!is(buf, &name, "content-length"))
			continue;
		if (value.len == 0 || strspn(buf + value.off, "0123456789") < value.len)
			return "Content-Length is not a number";
		if (strspn(buf + value.off, "0") < value.len)
			return "a request body is not taken";
	}
	return NULL;
}

/* The path of the target (without its query): origin form "/p?q", or
 * absolute form "http://host[:port]/p?q". False when it is neither. */
static bool target_path(const char *buf, const struct cap_span *t, struct cap_span *path)
{
	const char *s = buf + t->off;
	if (s[0] == '/') {
		*path = *t;
	} else {
		struct cap_target host;
		struct cap_span p;
		const char *why;
		if (cap_target_parse_url(s, t->len, &host, &p, &why) < 0)
			return false;
		*path = (struct cap_span){ t->off + p.off, p.len };	/* "http://host": empty */
	}
	const char *q = memchr(buf + path->off, '?', path->len);
	if (q)
		path->len = (size_t)(q - (buf + path->off));
	return true;
}

int serve_http_parse(const char *buf, size_t len, struct serve_http_req *out)
{
	struct cap_http_head h;
	memset(out, 0, sizeof(*out));
	/* A bare LF would wait for a CRLF CRLF that never comes: refused
	 * now rather than at the timeout (in the head only: what follows
	 * it is not read). */
	size_t n = len < SERVE_HTTP_MAX ? len : SERVE_HTTP_MAX;
	const char *end = memmem(buf, n, "\r\n\r\n", 4);
	if (end)
		n = (size_t)(end - buf) + 4;
	for (size_t i = 0; i < n; i++)
		if (buf[i] == '\n' && (i == 0 || buf[i - 1] != '\r'))
			return answer(out, 400, "request lines end in CRLF, not a bare LF");
	int r = cap_http_head_parse(buf, len, SERVE_HTTP_MAX, &h);
	if (r == 0)
		return 0;
	if (r == -E2BIG)
		return answer(out, 431, "the request head is over 8192 bytes");
	if (r < 0)
		return answer(out, 400, "the request head is not HTTP/1.0 or HTTP/1.1 (request line, fields, CRLF line ends)");
	out->len = h.len;
	/* The head parser takes HTTP/1.0 and HTTP/1.1 only (others are
	 * malformed to it). */
	if (buf[h.version.off + 7] == '1' && !h.has_host)
		return answer(out, 400, "an HTTP/1.1 request needs a Host field");
	const char *body = body_problem(buf, &h);
	if (body)
		return answer(out, 400, body);
	struct cap_span path;
	if (!target_path(buf, &h.target, &path))
		return answer(out, 400, "the target is neither a path nor an http:// URL");
	if (path.len != 8 || memcmp(buf + path.off, "/metrics", 8) != 0)
		return answer(out, 404, "only /metrics is served here");
	bool get = h.method.len == 3 && memcmp(buf + h.method.off, "GET", 3) == 0;
	out->head = h.method.len == 4 && memcmp(buf + h.method.off, "HEAD", 4) == 0;
	if (!get && !out->head)
		return answer(out, 405, "/metrics takes GET and HEAD");
	out->status = 200;
	return 1;
}
