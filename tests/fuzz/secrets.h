/* The secrets of the rewriter targets (fuzz-rewrite-req, -resp), known
 * to the oracles: values that no fixed text of rewrite.c contains, one
 * with bytes that a reason would have to escape. */
#ifndef CAP_FUZZ_SECRETS_H
#define CAP_FUZZ_SECRETS_H

#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "rewrite.h"
#include "sniff.h"

#define FZ_NSECRETS 4

static const struct cap_http_secret fz_secrets[FZ_NSECRETS] = {
	/* name, placeholder, value, length, body, applies */
	{ "TOKEN", "capsule-ph-0123456789abcdef0123456789abcdef01234567", "tok-REAL-VALUE-1", 16, false, true },
	{ "OTHER", "capsule-ph-ffffffffffffffffffffffffffffffffffffffff", "other-SECRET-two", 16, false, false },
	{ "BODYTOK", "capsule-ph-3333333333333333333333333333333333333333", "body secret 3", 13, true, true },
	{ "ODD", "capsule-ph-4444444444444444444444444444444444444444", "p\xc3\xa4ss\tW0rd", 11, true, true },
};

/* Whether text (n bytes) holds secret i's value as it is. */
__attribute__((unused)) static bool fz_has_value(const void *text, size_t n, unsigned i)
{
	const struct cap_http_secret *s = &fz_secrets[i];
	return n >= s->value_len && memmem(text, n, s->value, s->value_len);
}

/* Secret i's value as cap_sniff_quote writes it, without the quotes. */
static const char *fz_quoted(unsigned i, char q[64])
{
	const struct cap_http_secret *s = &fz_secrets[i];
	cap_sniff_quote(s->value, s->value_len, q, 64);
	size_t ql = strlen(q);
	memmove(q, q + 1, ql - 2);
	q[ql - 2] = '\0';
	return q;
}

/* Whether text (n bytes) shows secret i's value: as it is, or as
 * cap_sniff_quote writes it (a quoted reason). */
__attribute__((unused)) static bool fz_shows(const void *text, size_t n, unsigned i)
{
	char q[64];
	fz_quoted(i, q);
	return fz_has_value(text, n, i) || (n >= strlen(q) && memmem(text, n, q, strlen(q)));
}

static bool fz_subseq(const uint8_t *p, size_t n, const char *v, size_t m)
{
	size_t k = 0;
	for (size_t j = 0; j < n && k < m; j++)
		k += p[j] == (uint8_t)v[k];
	return k == m;
}

/* Whether the value of secret i is in p[0..n) as a subsequence, as it is
 * or as fz_shows finds it escaped: the input could have spelt it out in
 * pieces (chunks, a header the rewriter joins), so the guest knew it. */
__attribute__((unused)) static bool fz_spelt(const uint8_t *p, size_t n, unsigned i)
{
	const struct cap_http_secret *s = &fz_secrets[i];
	char q[64];
	fz_quoted(i, q);
	return fz_subseq(p, n, s->value, s->value_len) || fz_subseq(p, n, q, strlen(q));
}

/* Whether p[0..n) holds secret i's escaped text (cap_sniff_quote's) as
 * it is. */
__attribute__((unused)) static bool fz_has_quoted(const uint8_t *p, size_t n, unsigned i)
{
	char q[64];
	fz_quoted(i, q);
	return n >= strlen(q) && memmem(p, n, q, strlen(q));
}

#endif
