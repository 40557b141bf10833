/* What the fuzz targets of tests/fuzz share: a failed check says what
 * and aborts (libFuzzer keeps the input as crash-*; the replay driver has
 * named it), and byte-string searches for the oracles. */
#ifndef CAP_FUZZ_H
#define CAP_FUZZ_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

__attribute__((format(printf, 1, 2), noreturn, unused)) static void fuzz_fail(const char *fmt, ...)
{
	va_list ap;
	fprintf(stderr, "fuzz check failed: ");
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\n");
	fflush(stderr);
	abort();
}

#define FUZZ_CHECK(cond, ...)                                                  \
	do {                                                                   \
		if (!(cond))                                                   \
			fuzz_fail(__VA_ARGS__);                                \
	} while (0)

/* Occurrences of needle (m bytes, m > 0) in hay (n bytes), overlapping. */
__attribute__((unused)) static size_t fuzz_count(const void *hay, size_t n, const void *needle, size_t m)
{
	size_t k = 0;
	if (n < m || m == 0)
		return 0;
	const uint8_t *h = hay, *end = h + n;
	while ((size_t)(end - h) >= m) {
		const uint8_t *f = memmem(h, (size_t)(end - h), needle, m);
		if (!f)
			break;
		k++;
		h = f + 1;
	}
	return k;
}

__attribute__((unused)) static bool fuzz_has(const void *hay, size_t n, const char *needle)
{
	return n && memmem(hay, n, needle, strlen(needle)) != NULL;
}

/* Whether s[0..n) is NUL-terminated within its buffer of size bytes. */
__attribute__((unused)) static bool fuzz_terminated(const char *s, size_t size)
{
	return memchr(s, '\0', size) != NULL;
}

#endif
