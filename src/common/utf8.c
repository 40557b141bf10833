#include "utf8.h"

#include <stdio.h>
#include <string.h>

#include "util.h"

size_t cap_utf8_seq(const unsigned char *p, size_t n)
{
	if (n == 0)
		return 0;
	unsigned c = p[0];
	if (c < 0x80)
		return 1;
	size_t len;
	unsigned cp, min;
	if ((c & 0xe0) == 0xc0) {
		len = 2, cp = c & 0x1f, min = 0x80;
	} else if ((c & 0xf0) == 0xe0) {
		len = 3, cp = c & 0x0f, min = 0x800;
	} else if ((c & 0xf8) == 0xf0) {
		len = 4, cp = c & 0x07, min = 0x10000;
	} else {
		return 0;
	}
	if (n < len)
		return 0;
	for (size_t i = 1; i < len; i++) {
		if ((p[i] & 0xc0) != 0x80)
			return 0;
		cp = (cp << 6) | (p[i] & 0x3f);
	}
	if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
		return 0;
	return len;
}

bool cap_utf8_valid(const char *p, size_t n)
{
	const unsigned char *u = (const unsigned char *)p;
	for (size_t i = 0; i < n;) {
		size_t k = cap_utf8_seq(u + i, n - i);
		if (k == 0 || (k == 1 && u[i] == 0))
			return false;
		i += k;
	}
	return true;
}

char *cap_utf8_sanitize(const char *p, size_t n, size_t *out_len)
{
	const unsigned char *u = (const unsigned char *)p;
	char *o = xmalloc(3 * n + 1);
	size_t k = 0;
	for (size_t i = 0; i < n;) {
		size_t s = cap_utf8_seq(u + i, n - i);
		if (s == 0 || (s == 1 && u[i] == 0)) {
			memcpy(o + k, "\xef\xbf\xbd", 3);
			k += 3;
			i++;
		} else {
			memcpy(o + k, p + i, s);
			k += s;
			i += s;
		}
	}
	o[k] = '\0';
	*out_len = k;
	return o;
}

/* The code point of a valid sequence of len bytes. */
static unsigned decode(const unsigned char *p, size_t len)
{
	static const unsigned char first[] = { 0, 0x7f, 0x1f, 0x0f, 0x07 };
	unsigned cp = p[0] & first[len];
	for (size_t i = 1; i < len; i++)
		cp = (cp << 6) | (p[i] & 0x3f);
	return cp;
}

/* Code points a terminal acts on or that reorder what it shows: C1
 * controls (U+009B is CSI), and the bidirectional embeddings, overrides
 * and isolates ("Trojan Source"). */
static bool hidden_cp(unsigned cp)
{
	return (cp >= 0x80 && cp <= 0x9f) || (cp >= 0x202a && cp <= 0x202e) || (cp >= 0x2066 && cp <= 0x2069);
}

void cap_utf8_visible(const char *p, size_t n, struct cap_buf *out)
{
	const unsigned char *u = (const unsigned char *)p;
	char e[16];
	size_t i = 0, plain = 0;	/* u[plain..i) goes out as it is */
	while (i < n) {
		unsigned c = u[i];
		size_t k = c < 0x80 ? 1 : cap_utf8_seq(u + i, n - i);
		int m = 0;
		if (k == 1 && (c == '\n' || c == '\t')) {
			i++;
			continue;
		}
		if (k == 1 && (c < 0x20 || c == 0x7f))
			m = snprintf(e, sizeof(e), "^%c", c == 0x7f ? '?' : (char)(c + 0x40));
		else if (k == 0)
			m = snprintf(e, sizeof(e), "<%02X>", c);
		else if (k > 1 && hidden_cp(decode(u + i, k)))
			m = snprintf(e, sizeof(e), "<U+%04X>", decode(u + i, k));
		if (m == 0) {
			i += k;
			continue;
		}
		cap_buf_append(out, u + plain, i - plain);
		cap_buf_append(out, e, (size_t)m);
		i += k ? k : 1;
		plain = i;
	}
	cap_buf_append(out, u + plain, n - plain);
}
