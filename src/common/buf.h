/* Growable byte buffer with a read offset: bytes are appended at the end
 * and consumed from the front. */
#ifndef CAP_BUF_H
#define CAP_BUF_H

#include <stddef.h>
#include <stdint.h>

struct cap_buf {
	uint8_t *owned_data;
	size_t off;	/* first unconsumed byte */
	size_t len;	/* end of valid bytes */
	size_t cap;
};

void cap_buf_init(struct cap_buf *b);
void cap_buf_fini(struct cap_buf *b);
void cap_buf_append(struct cap_buf *b, const void *p, size_t n);
/* Make room for n more bytes and return where to write them; commit with
 * cap_buf_commit once written. */
uint8_t *cap_buf_reserve(struct cap_buf *b, size_t n);
void cap_buf_commit(struct cap_buf *b, size_t n);
void cap_buf_consume(struct cap_buf *b, size_t n);
static inline size_t cap_buf_used(const struct cap_buf *b)
{
	return b->len - b->off;
}
static inline const uint8_t *cap_buf_head(const struct cap_buf *b)
{
	return b->owned_data + b->off;
}

#endif
