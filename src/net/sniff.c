/* sniff: see sniff.h. */
#include "sniff.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "policy.h"

#define TLS_HANDSHAKE 22
#define TLS_CLIENT_HELLO 1
#define TLS_RECORD_MAX 16384	/* TLSPlaintext.length <= 2^14 */
#define TLS_EXT_SERVER_NAME 0
#define TLS_NAME_HOST 0

static uint16_t get16(const uint8_t *p)
{
	return (uint16_t)(p[0] << 8 | p[1]);
}

/* The server_name extension's data (RFC 6066 3): the list must fill it
 * exactly and hold at most one host_name. */
static enum cap_tls_sniff read_server_name(const uint8_t *p, size_t n, char *sni,
					   size_t *sni_len, bool *found)
{
	if (n < 2 || get16(p) != n - 2 || n == 2)
		return CAP_TLS_MALFORMED;
	for (size_t off = 2; off < n;) {
		if (off + 3 > n)
			return CAP_TLS_MALFORMED;
		uint8_t type = p[off];
		size_t l = get16(p + off + 1);
		off += 3;
		if (off + l > n)
			return CAP_TLS_MALFORMED;
		if (type == TLS_NAME_HOST) {
			if (*found || l == 0 || l > CAP_TLS_SNI_MAX)
				return CAP_TLS_MALFORMED;
			memcpy(sni, p + off, l);
			sni[l] = '\0';
			*sni_len = l;
			*found = true;
		}
		off += l;
	}
	return CAP_TLS_SNI;
}

/* The body of a ClientHello (RFC 8446 4.1.2; older versions have the same
 * layout, extensions optional). */
static enum cap_tls_sniff read_hello(const uint8_t *p, size_t n, char *sni, size_t *sni_len)
{
	size_t off = 2 + 32;	/* legacy_version, random */
	bool found = false, seen = false;

	if (off + 1 > n || p[off] > 32)
		return CAP_TLS_MALFORMED;
	off += 1 + p[off];	/* legacy_session_id */
	if (off + 2 > n)
		return CAP_TLS_MALFORMED;
	size_t l = get16(p + off);
	if (l < 2 || l % 2 || off + 2 + l > n)
		return CAP_TLS_MALFORMED;
	off += 2 + l;		/* cipher_suites */
	if (off + 1 > n || p[off] < 1 || off + 1 + p[off] > n)
		return CAP_TLS_MALFORMED;
	off += 1 + p[off];	/* legacy_compression_methods */
	if (off == n)
		return CAP_TLS_NO_SNI;
	if (off + 2 > n || off + 2 + get16(p + off) != n)
		return CAP_TLS_MALFORMED;
	for (off += 2; off < n;) {
		if (off + 4 > n)
			return CAP_TLS_MALFORMED;
		uint16_t type = get16(p + off);
		size_t el = get16(p + off + 2);
		off += 4;
		if (off + el > n)
			return CAP_TLS_MALFORMED;
		if (type == TLS_EXT_SERVER_NAME) {
			if (seen || read_server_name(p + off, el, sni, sni_len, &found) != CAP_TLS_SNI)
				return CAP_TLS_MALFORMED;
			seen = true;
		}
		off += el;
	}
	return found ? CAP_TLS_SNI : CAP_TLS_NO_SNI;
}

enum cap_tls_sniff cap_tls_sniff(const uint8_t *buf, size_t len,
				 char sni[CAP_TLS_SNI_MAX + 1], size_t *sni_len)
{
	uint8_t hello[4 + CAP_TLS_HELLO_MAX];
	size_t have = 0, need = 4, pos = 0;

	if (len == 0)
		return CAP_TLS_MORE;
	if (buf[0] != TLS_HANDSHAKE || (len > 1 && buf[1] != 3))
		return CAP_TLS_NOT_TLS;
	/* The handshake message may be spread over several records. */
	while (have < need) {
		if (pos + 5 > len)
			return CAP_TLS_MORE;
		size_t rlen = get16(buf + pos + 3);
		if (buf[pos] != TLS_HANDSHAKE || buf[pos + 1] != 3 || rlen == 0 ||
		    rlen > TLS_RECORD_MAX)
			return CAP_TLS_MALFORMED;
		size_t end = pos + 5 + rlen;
		for (size_t i = pos + 5; i < end && i < len && have < need; i++) {
			hello[have++] = buf[i];
			if (have != 4)
				continue;
			if (hello[0] != TLS_CLIENT_HELLO)
				return CAP_TLS_MALFORMED;
			need = 4 + ((size_t)hello[1] << 16 | (size_t)hello[2] << 8 | hello[3]);
			if (need > sizeof(hello))
				return CAP_TLS_MALFORMED;
		}
		if (have >= need)
			break;
		if (end > len)
			return CAP_TLS_MORE;
		pos = end;
	}
	return read_hello(hello + 4, need - 4, sni, sni_len);
}

static bool tchar(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* The request line's end: the first " HTTP/1.0\r\n" or " HTTP/1.1\r\n"
 * (the target before it may hold any byte, CR and LF included, so that a
 * target smuggling a line break is reported as such). */
static const char *version_at(const char *buf, size_t len)
{
	static const char v[] = " HTTP/1.";

	for (const char *p = buf; (p = memmem(p, len - (size_t)(p - buf), v, 8));
	     p++) {
		size_t left = len - (size_t)(p - buf);
		if (left >= 11 && (p[8] == '0' || p[8] == '1') && p[9] == '\r' && p[10] == '\n')
			return p;
	}
	return NULL;
}

static bool field_value_char(unsigned char c)
{
	return c == '\t' || (c >= 0x20 && c != 0x7f);
}

static void trim(const char *buf, struct cap_span *s)
{
	while (s->len && (buf[s->off] == ' ' || buf[s->off] == '\t')) {
		s->off++;
		s->len--;
	}
	while (s->len && (buf[s->off + s->len - 1] == ' ' || buf[s->off + s->len - 1] == '\t'))
		s->len--;
}

/* One field line [off, end): "NAME: VALUE" (no CR, LF or other control
 * character but tab, no blank before the colon, no folding). */
static int read_field(const char *buf, size_t off, size_t end, struct cap_span *name,
		      struct cap_span *value)
{
	size_t i = off;

	while (i < end && tchar((unsigned char)buf[i]))
		i++;
	if (i == off || i == end || buf[i] != ':')
		return -EINVAL;
	*name = (struct cap_span){ off, i - off };
	*value = (struct cap_span){ i + 1, end - i - 1 };
	for (size_t j = i + 1; j < end; j++)
		if (!field_value_char((unsigned char)buf[j]))
			return -EINVAL;
	trim(buf, value);
	return 0;
}

int cap_http_head_parse(const char *buf, size_t len, size_t max, struct cap_http_head *h)
{
	size_t n = len < max ? len : max, m = 0;

	memset(h, 0, sizeof(*h));
	while (m < n && tchar((unsigned char)buf[m]))
		m++;
	if (m < n && (m == 0 || buf[m] != ' '))
		return -EINVAL;
	const char *v = version_at(buf, n);
	if (!v) {
		if (memmem(buf, n, "\r\n\r\n", 4))
			return -EINVAL;
		return len >= max ? -E2BIG : 0;
	}
	size_t vo = (size_t)(v - buf);
	if (vo <= m + 1)
		return -EINVAL;
	const char *e = memmem(v + 9, n - vo - 9, "\r\n\r\n", 4);
	if (!e)
		return len >= max ? -E2BIG : 0;
	h->method = (struct cap_span){ 0, m };
	h->target = (struct cap_span){ m + 1, vo - m - 1 };
	h->version = (struct cap_span){ vo + 1, 8 };
	h->fields = vo + 11;
	h->len = (size_t)(e - buf) + 4;
	for (size_t off = h->fields; off < h->len - 2;) {
		const char *crlf = memmem(buf + off, h->len - off, "\r\n", 2);
		size_t end = (size_t)(crlf - buf);
		struct cap_span name, value;
		if (memchr(buf + off, '\r', end - off) || memchr(buf + off, '\n', end - off) ||
		    read_field(buf, off, end, &name, &value) < 0)
			return -EINVAL;
		if (name.len == 4 && !strncasecmp(buf + name.off, "host", 4)) {
			if (h->has_host)
				return -EINVAL;
			h->has_host = true;
			h->host = value;
		}
		off = end + 2;
	}
	return 1;
}

bool cap_http_field_next(const char *buf, const struct cap_http_head *h, size_t *pos,
			 struct cap_span *name, struct cap_span *value)
{
	if (*pos < h->fields || *pos + 2 >= h->len)
		return false;
	const char *crlf = memmem(buf + *pos, h->len - *pos, "\r\n", 2);
	size_t end = (size_t)(crlf - buf);
	if (read_field(buf, *pos, end, name, value) < 0)
		return false;
	*pos = end + 2;
	return true;
}

/* Control characters, then whitespace, anywhere in a target. */
static int check_chars(const char *s, size_t len, const char **why)
{
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		if (c < 0x20 || c == 0x7f) {
			*why = "control character in the target";
			return -EINVAL;
		}
	}
	if (memchr(s, ' ', len)) {
		*why = "whitespace in the target";
		return -EINVAL;
	}
	return 0;
}

static int parse_port(const char *s, size_t len, uint16_t *port, const char **why)
{
	unsigned v = 0;

	if (len == 0 || len > 5) {
		*why = len ? "bad port" : "no port";
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9') {
			*why = "bad port";
			return -EINVAL;
		}
		v = v * 10 + (unsigned)(s[i] - '0');
	}
	if (v == 0 || v > 65535) {
		*why = "bad port";
		return -EINVAL;
	}
	*port = (uint16_t)v;
	return 0;
}

static int parse_host(const char *s, size_t len, struct cap_target *t, const char **why)
{
	/* One trailing dot (the root) is dropped; "name.." is an empty label,
	 * not a name with its root spelled twice. */
	if (len > 1 && s[len - 1] == '.')
		len--;
	if (len > 0 && s[len - 1] == '.') {
		*why = "not a valid host name";
		return -EINVAL;
	}
	if (len == 0) {
		*why = "empty host";
		return -EINVAL;
	}
	if (len >= sizeof(t->host)) {
		*why = "not a valid host name";
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		t->host[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
	}
	t->host[len] = '\0';
	t->is_addr = cap_net_addr_parse(t->host, &t->addr);
	if (t->is_addr)
		return 0;
	const char *last = memrchr(t->host, '.', len);
	last = last ? last + 1 : t->host;
	if (*last && strspn(last, "0123456789") == strlen(last)) {
		*why = "not a valid IPv4 address";
		return -EINVAL;
	}
	if (!cap_net_valid_name(t->host, len)) {
		*why = "not a valid host name";
		return -EINVAL;
	}
	return 0;
}

int cap_target_parse_authority(const char *s, size_t len, struct cap_target *t,
			       const char **why)
{
	memset(t, 0, sizeof(*t));
	if (check_chars(s, len, why) < 0)
		return -EINVAL;
	if (len == 0) {
		*why = "empty host";
		return -EINVAL;
	}
	const char *colon = memrchr(s, ':', len);
	if (!colon) {
		*why = "no port";
		return -EINVAL;
	}
	size_t hl = (size_t)(colon - s);
	if (parse_port(colon + 1, len - hl - 1, &t->port, why) < 0)
		return -EINVAL;
	return parse_host(s, hl, t, why);
}

int cap_target_parse_url(const char *s, size_t len, struct cap_target *t,
			 struct cap_span *path, const char **why)
{
	static const char scheme[] = "http://";
	const size_t sl = sizeof(scheme) - 1;

	memset(t, 0, sizeof(*t));
	if (check_chars(s, len, why) < 0)
		return -EINVAL;
	if (len >= 8 && !strncasecmp(s, "https://", 8)) {
		*why = "an https:// URL asked of the proxy in the clear: the client must use CONNECT "
		       "(busybox wget does not: give it -Y off to connect directly)";
		return -EINVAL;
	}
	if (len < sl || strncasecmp(s, scheme, sl)) {
		*why = "not an http:// URL";
		return -EINVAL;
	}
	size_t a = sl, e = a;
	while (e < len && s[e] != '/' && s[e] != '?')
		e++;
	*path = (struct cap_span){ e, len - e };
	if (memchr(s + a, '@', e - a)) {
		*why = "user information in the URL";
		return -EINVAL;
	}
	const char *colon = memrchr(s + a, ':', e - a);
	size_t hl = colon ? (size_t)(colon - s) - a : e - a;
	t->port = 80;
	if (colon && parse_port(colon + 1, e - (size_t)(colon - s) - 1, &t->port, why) < 0) {
		*why = "bad port";
		return -EINVAL;
	}
	return parse_host(s + a, hl, t, why);
}

const char *cap_sniff_quote(const char *s, size_t len, char *out, size_t size)
{
	size_t o = 0;

	if (size < 16) {
		if (size)
			out[0] = '\0';
		return out;
	}
	out[o++] = '"';
	for (size_t i = 0; i < len; i++) {
		unsigned char c = (unsigned char)s[i];
		char esc[5];
		if (c == '\r')
			memcpy(esc, "\\r", 3);
		else if (c == '\n')
			memcpy(esc, "\\n", 3);
		else if (c == '\t')
			memcpy(esc, "\\t", 3);
		else if (c == '"' || c == '\\')
			snprintf(esc, sizeof(esc), "\\%c", c);
		else if (c < 0x20 || c >= 0x7f)
			snprintf(esc, sizeof(esc), "\\x%02x", c);
		else
			snprintf(esc, sizeof(esc), "%c", c);
		size_t el = strlen(esc);
		/* Room for this, then '"', "..." and the NUL. */
		if (o + el + 5 > size) {
			memcpy(out + o, "...", 3);
			o += 3;
			break;
		}
		memcpy(out + o, esc, el);
		o += el;
	}
	out[o++] = '"';
	out[o] = '\0';
	return out;
}
