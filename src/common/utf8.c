#include "utf8.h"

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
