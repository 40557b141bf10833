/* Base64 for the transfers serve carries inline. */
#ifndef CAP_BASE64_H
#define CAP_BASE64_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Base64 (RFC 4648, padded, no line breaks). Encode: a new
 * NUL-terminated string of *len characters. Decode: the byte count with
 * *out a new buffer, or -EINVAL with *bad the offset of the first
 * character (or the length) at fault. */
char *cap_base64_encode(const void *p, size_t n, size_t *len);
ssize_t cap_base64_decode(const char *s, size_t n, uint8_t **out, size_t *bad);

#endif
