/* UTF-8 checks for text that crosses into JSON. */
#ifndef CAP_UTF8_H
#define CAP_UTF8_H

#include <stdbool.h>
#include <stddef.h>

#include "buf.h"

/* Length of the valid UTF-8 sequence at p (1 to 4), or 0 if invalid
 * (overlong forms, surrogates and code points over U+10FFFF included). */
size_t cap_utf8_seq(const unsigned char *p, size_t n);

/* Whether p[0..n) is entirely valid UTF-8. */
bool cap_utf8_valid(const char *p, size_t n);

/* A new NUL-terminated copy of p[0..n) with each invalid byte replaced by
 * U+FFFD; *out_len gets its length. */
char *cap_utf8_sanitize(const char *p, size_t n, size_t *out_len);

/* Append p[0..n) to out as a terminal may show it without being driven
 * by it, as less(1) shows control characters: newlines and tabs as they
 * are; other C0 controls and DEL in caret notation (ESC "^[", CR "^M",
 * NUL "^@", DEL "^?"); bytes that are not UTF-8 as "<XX>" (hex); C1
 * controls and the bidirectional overrides, embeddings and isolates as
 * "<U+XXXX>"; everything else, valid UTF-8 included, as it is. For text
 * from a sandbox shown on a terminal (a review that must not lie); what
 * goes to a pipe keeps its bytes. */
void cap_utf8_visible(const char *p, size_t n, struct cap_buf *out);

#endif
