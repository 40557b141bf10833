/* Growable byte buffer with a read offset: bytes are appended at the end
 * and consumed from the front. */
#ifndef CAP_BUF_H
#define CAP_BUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct cap_buf {
	uint8_t *owned_data;
	size_t off;	/* first unconsumed byte */
	size_t len;	/* end of valid bytes */
	size_t cap;
	/* The bytes must not outlive their use (a secret's value): zeroed
	 * when consumed, moved, grown away from or freed. Set after init. */
	bool wipe;
};

void cap_buf_init(struct cap_buf *b);
void cap_buf_fini(struct cap_buf *b);
void cap_buf_append(struct cap_buf *b, const void *p, size_t n);
/* Make room for n more bytes and return where to write them (never NULL,
 * also for n = 0); commit with cap_buf_commit once written. */
uint8_t *cap_buf_reserve(struct cap_buf *b, size_t n);
void cap_buf_commit(struct cap_buf *b, size_t n);
void cap_buf_consume(struct cap_buf *b, size_t n);
static inline size_t cap_buf_used(const struct cap_buf *b)
{
	return b->len - b->off;
}
/* The unconsumed bytes; never NULL (a buffer without storage yet gives
 * an empty array: no arithmetic on a null pointer, which C leaves
 * undefined even for offset 0). */
extern const uint8_t cap_buf_no_data[];	/* its size is buf.c's: gcc's
						 * bounds checks must not see it */
static inline const uint8_t *cap_buf_head(const struct cap_buf *b)
{
	return b->owned_data ? b->owned_data + b->off : cap_buf_no_data;
}

/* Where cap_buf_lines is in a stream of lines, between calls. */
struct cap_lines {
	bool discarding;	/* skipping the rest of an oversized line */
	size_t scanned;	/* bytes at the head already known to hold no newline */
};

/* Take the complete lines off the front of b, calling line(ud, p, n) for
 * each non-empty one (without its newline). A line longer than max is
 * dropped up to its newline, with one call of too_long(ud). Bytes are
 * looked at once however the line arrives (st carries that). */
void cap_buf_lines(struct cap_buf *b, size_t max, struct cap_lines *st,
		   void (*line)(void *ud, const char *p, size_t n),
		   void (*too_long)(void *ud), void *ud);

/* b's bytes as a C string, trailing newlines (and carriage returns) cut;
 * a NUL inside ends it early. New string. */
char *cap_buf_text(const struct cap_buf *b);

#endif
