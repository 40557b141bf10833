#include "buf.h"

#include <string.h>

#include "util.h"

/* What cap_buf_head gives for a buffer without storage. Declared in
 * buf.h without a size: a static array of one byte there made gcc's
 * -Warray-bounds (with -fsanitize) flag every read of a frame's header
 * through a buffer it could not prove had storage. */
const uint8_t cap_buf_no_data[8];

void cap_buf_init(struct cap_buf *b) { memset(b, 0, sizeof(*b)); }

void cap_buf_fini(struct cap_buf *b)
{
	if (b->wipe && b->owned_data)
		explicit_bzero(b->owned_data, b->cap);
	free(b->owned_data);
	memset(b, 0, sizeof(*b));
}

uint8_t *cap_buf_reserve(struct cap_buf *b, size_t n)
{
	if (b->off > 0 && b->off == b->len) {
		b->off = b->len = 0;
	}
	if (b->cap - b->len < n || !b->owned_data) {
		/* Compact first; grow only when that is not enough. */
		if (b->off > 0) {
			memmove(b->owned_data, b->owned_data + b->off,
				b->len - b->off);
			if (b->wipe)
				explicit_bzero(b->owned_data + b->len - b->off, b->off);
			b->len -= b->off;
			b->off = 0;
		}
		if (b->cap - b->len < n || !b->owned_data) {
			size_t want = b->cap ? b->cap : 4096;
			while (want - b->len < n)
				want *= 2;
			if (b->wipe) {
				/* Not realloc: it may leave the old copy behind. */
				uint8_t *d = xmalloc(want);
				if (b->owned_data) {
					memcpy(d, b->owned_data, b->len);
					explicit_bzero(b->owned_data, b->cap);
					free(b->owned_data);
				}
				b->owned_data = d;
			} else {
				b->owned_data = xrealloc(b->owned_data, want);
			}
			b->cap = want;
		}
	}
	return b->owned_data + b->len;
}

void cap_buf_commit(struct cap_buf *b, size_t n)
{
	CAP_BUG_ON(b->len + n > b->cap);
	b->len += n;
}

void cap_buf_append(struct cap_buf *b, const void *p, size_t n)
{
	if (n == 0)
		return;
	memcpy(cap_buf_reserve(b, n), p, n);
	cap_buf_commit(b, n);
}

void cap_buf_consume(struct cap_buf *b, size_t n)
{
	CAP_BUG_ON(n > b->len - b->off);
	if (b->wipe && n > 0)
		explicit_bzero(b->owned_data + b->off, n);
	b->off += n;
	if (b->off == b->len)
		b->off = b->len = 0;
}

void cap_buf_lines(struct cap_buf *b, size_t max, struct cap_lines *st,
		   void (*line)(void *ud, const char *p, size_t n),
		   void (*too_long)(void *ud), void *ud)
{
	for (;;) {
		size_t used = cap_buf_used(b);
		if (used == 0) {
			st->scanned = 0;
			return;
		}
		const char *head = (const char *)cap_buf_head(b);
		size_t from = CAP_MIN(st->scanned, used);
		const char *nl = memchr(head + from, '\n', used - from);
		if (!nl) {
			st->scanned = used;
			if (used > max) {
				if (!st->discarding)
					too_long(ud);
				st->discarding = true;
				cap_buf_consume(b, used);
				st->scanned = 0;
			}
			return;
		}
		size_t len = (size_t)(nl - head);
		st->scanned = 0;
		if (st->discarding)
			st->discarding = false;
		else if (len > max)	/* arrived whole, with its newline */
			too_long(ud);
		else if (len > 0 && !(len == 1 && head[0] == '\r'))
			line(ud, head, len);
		cap_buf_consume(b, len + 1);
	}
}

char *cap_buf_text(const struct cap_buf *b)
{
	size_t n = cap_buf_used(b);
	const char *p = (const char *)cap_buf_head(b);
	while (n && (p[n - 1] == '\n' || p[n - 1] == '\r'))
		n--;
	return xstrndup(n ? p : "", n);
}
