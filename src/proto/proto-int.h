/* What the codec's files share (proto-codec.c, proto-pod.c): the EXEC
 * container section's bytes, and the readers and writers of integers
 * and strings. Private to src/proto. */
#ifndef CAP_PROTO_INT_H
#define CAP_PROTO_INT_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "err.h"
#include "proto.h"
#include "util.h"

/* The section's size in bytes, 0 when c breaks a rule (not encodable). */
size_t cap_proto_ctr_size(const struct cap_exec_container *c);
/* Write it at p (cap_proto_ctr_size bytes); returns the end. */
uint8_t *cap_proto_ctr_put(uint8_t *p, const struct cap_exec_container *c);
/* Read one from p[0..n) into out, its length to *used: 0, or -EBADMSG
 * with err set. */
int cap_proto_ctr_read(const uint8_t *p, size_t n, struct cap_exec_container *out, size_t *used,
		       struct cap_err *err);

/* The codec's readers and writers of its integers and strings
 * (little-endian u32 and u64, a string as u32 length and bytes). */
struct reader {
	const uint8_t *p;
	size_t left;
};

static inline int rd_u32(struct reader *r, uint32_t *v)
{
	if (r->left < 4)
		return -EBADMSG;
	*v = cap_get_u32(r->p);
	r->p += 4;
	r->left -= 4;
	return 0;
}

static inline int rd_u64(struct reader *r, uint64_t *v)
{
	uint32_t lo, hi;
	if (r->left < 8)
		return -EBADMSG;
	rd_u32(r, &lo);
	rd_u32(r, &hi);
	*v = ((uint64_t)hi << 32) | lo;
	return 0;
}

/* A string into buf (len bytes with its NUL): -EBADMSG when it does not
 * fit, holds a NUL or overruns the bytes left. */
static inline int rd_str_into(struct reader *r, char *buf, size_t len)
{
	uint32_t n;
	if (rd_u32(r, &n) < 0 || n > r->left || n >= len || memchr(r->p, '\0', n))
		return -EBADMSG;
	memcpy(buf, r->p, n);
	buf[n] = '\0';
	r->p += n;
	r->left -= n;
	return 0;
}

static inline size_t str_size(const char *s) { return 4 + (s ? strlen(s) : 0); }

static inline uint8_t *put_str(uint8_t *p, const char *s)
{
	size_t n = s ? strlen(s) : 0;
	cap_put_u32(p, (uint32_t)n);
	if (n)
		memcpy(p + 4, s, n);
	return p + 4 + n;
}

static inline uint8_t *put_u64(uint8_t *p, uint64_t v)
{
	cap_put_u32(p, (uint32_t)(v & 0xffffffffu));
	cap_put_u32(p + 4, (uint32_t)(v >> 32));
	return p + 8;
}

#endif
