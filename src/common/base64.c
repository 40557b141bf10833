/* Base64 (RFC 4648, padded, no line breaks): serve's inline uploads and
 * downloads. */
#include "base64.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>

#include "util.h"

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *cap_base64_encode(const void *p, size_t n, size_t *len)
{
	const uint8_t *s = p;
	size_t out = 4 * ((n + 2) / 3), k = 0;
	char *d = xmalloc(out + 1);
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)s[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)s[i + 1] << 8;
		if (i + 2 < n)
			v |= s[i + 2];
		d[k++] = b64[(v >> 18) & 63];
		d[k++] = b64[(v >> 12) & 63];
		d[k++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
		d[k++] = i + 2 < n ? b64[v & 63] : '=';
	}
	d[k] = '\0';
	*len = k;
	return d;
}

static int b64_value(char c)
{
	const char *at = c ? strchr(b64, c) : NULL;
	return at ? (int)(at - b64) : -1;
}

ssize_t cap_base64_decode(const char *s, size_t n, uint8_t **out, size_t *bad)
{
	if (n % 4) {
		*bad = n;
		return -EINVAL;
	}
	uint8_t *d = xmalloc(n / 4 * 3 + 1);
	size_t k = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		bool last = i + 4 == n;
		for (int j = 0; j < 4; j++) {
			v[j] = b64_value(s[i + j]);
			/* '=' only as the last one or two characters */
			bool pad = s[i + j] == '=' && last && (j == 3 || (j == 2 && s[i + 3] == '='));
			if (v[j] < 0 && !pad) {
				*bad = i + (size_t)j;
				free(d);
				return -EINVAL;
			}
			if (pad)
				v[j] = -2;
		}
		if (v[0] < 0 || v[1] < 0) {
			*bad = i;
			free(d);
			return -EINVAL;
		}
		uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 |
			     (uint32_t)(v[3] < 0 ? 0 : v[3]);
		d[k++] = (uint8_t)(w >> 16);
		if (v[2] >= 0)
			d[k++] = (uint8_t)(w >> 8);
		if (v[3] >= 0)
			d[k++] = (uint8_t)w;
	}
	*out = d;
	return (ssize_t)k;
}
