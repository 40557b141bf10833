/* Fuzz target for the proxy-head sniffer (src/net/sniff.c): the input is
 * what a guest sends to the HTTP proxy port, after a first byte that
 * picks the limit. The head parser, its field iterator, the CONNECT and
 * absolute-form target parsers and the log quoting see it.
 * Checked: a parsed head's spans lie inside it (the method, target and
 * version not empty; the version HTTP/1.x), each field's name is a token
 * and no value holds CR or LF; at most one Host; the head parses the same
 * from its own bytes alone (what follows it changes nothing); a target
 * that parses is a lowercase name without a trailing dot or a dotted
 * IPv4 address, and a URL's path is the rest of the target from its
 * '/' or '?' on; cap_sniff_quote's text fits its buffer, NUL-terminated,
 * printable ASCII only, in quotes. */
#include <ctype.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "fuzz.h"
#include "sniff.h"

static bool tchar(char c)
{
	return isalnum((unsigned char)c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

static void check_span(const struct cap_span *s, size_t len, const char *what)
{
	FUZZ_CHECK(s->off <= len && s->len <= len - s->off, "%s at %zu+%zu outside %zu bytes", what, s->off, s->len, len);
}

static void check_target(const struct cap_target *t)
{
	size_t n = strnlen(t->host, sizeof(t->host));
	FUZZ_CHECK(n > 0 && n < sizeof(t->host), "a host of %zu bytes", n);
	FUZZ_CHECK(t->host[n - 1] != '.', "a trailing dot: %s", t->host);
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(!isupper((unsigned char)t->host[i]) && t->host[i] > 0x20 && t->host[i] < 0x7f,
			   "host %s", t->host);
	if (t->is_addr) {
		char a[16];
		snprintf(a, sizeof(a), "%u.%u.%u.%u", t->addr >> 24, (t->addr >> 16) & 255, (t->addr >> 8) & 255,
			 t->addr & 255);
		FUZZ_CHECK(strcmp(a, t->host) == 0, "address %s read as %s", t->host, a);
	}
}

static void check_quote(const char *s, size_t len, size_t size)
{
	char out[300];
	memset(out, 0x55, sizeof(out));
	const char *q = cap_sniff_quote(s, len, out, size);
	FUZZ_CHECK(q == out && memchr(out, '\0', size), "quote: not terminated in %zu bytes", size);
	size_t n = strlen(out);
	FUZZ_CHECK(n >= 2 && out[0] == '"', "quote: %s", out);
	for (size_t i = 0; i < n; i++)
		FUZZ_CHECK(out[i] >= 0x20 && out[i] < 0x7f, "quote: byte %#x at %zu", (unsigned char)out[i], i);
	for (size_t i = size; i < sizeof(out); i++)
		FUZZ_CHECK(out[i] == 0x55, "quote wrote past %zu bytes", size);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	size_t max = 16 + (size_t)data[0] * 64;
	const char *buf = (const char *)data + 1;
	size_t len = size - 1;
	check_quote(buf, len, 16 + data[0] % 200);

	struct cap_http_head h;
	int r = cap_http_head_parse(buf, len, max, &h);
	FUZZ_CHECK(r == 1 || r == 0 || r == -EINVAL || r == -E2BIG, "answer %d", r);
	FUZZ_CHECK(r != 0 || len < max, "MORE with %zu bytes for a limit of %zu", len, max);
	if (r != 1)
		return 0;
	FUZZ_CHECK(h.len >= 4 && h.len <= len && h.len <= max && memcmp(buf + h.len - 4, "\r\n\r\n", 4) == 0,
		   "a head of %zu bytes", h.len);
	check_span(&h.method, h.len, "the method");
	check_span(&h.target, h.len, "the target");
	check_span(&h.version, h.len, "the version");
	FUZZ_CHECK(h.method.len && h.target.len && h.version.len == 8 && memcmp(buf + h.version.off, "HTTP/1.", 7) == 0,
		   "request line");
	if (h.has_host)
		check_span(&h.host, h.len, "the host");
	FUZZ_CHECK(h.fields <= h.len, "fields at %zu", h.fields);

	size_t pos = h.fields, hosts = 0, nfields = 0;
	struct cap_span name, value;
	while (cap_http_field_next(buf, &h, &pos, &name, &value)) {
		FUZZ_CHECK(++nfields <= h.len, "fields without end");
		check_span(&name, h.len, "a field name");
		check_span(&value, h.len, "a field value");
		FUZZ_CHECK(name.len > 0, "an empty field name");
		for (size_t i = 0; i < name.len; i++)
			FUZZ_CHECK(tchar(buf[name.off + i]), "field name byte %#x", (unsigned char)buf[name.off + i]);
		FUZZ_CHECK(!memchr(buf + value.off, '\r', value.len) && !memchr(buf + value.off, '\n', value.len),
			   "a field value with CR or LF");
		hosts += name.len == 4 && strncasecmp(buf + name.off, "host", 4) == 0;
	}
	FUZZ_CHECK(hosts == (h.has_host ? 1u : 0u), "%zu Host fields, has_host %d", hosts, h.has_host);

	struct cap_http_head again;
	FUZZ_CHECK(cap_http_head_parse(buf, h.len, max, &again) == 1 && again.len == h.len &&
			   again.target.off == h.target.off && again.target.len == h.target.len &&
			   again.fields == h.fields && again.has_host == h.has_host,
		   "the head alone reads otherwise");

	struct cap_target t;
	struct cap_span path;
	const char *why = NULL;
	if (cap_target_parse_authority(buf + h.target.off, h.target.len, &t, &why) == 0)
		check_target(&t);
	else
		FUZZ_CHECK(why && *why, "a refused authority without a reason");
	why = NULL;
	if (cap_target_parse_url(buf + h.target.off, h.target.len, &t, &path, &why) == 0) {
		check_target(&t);
		FUZZ_CHECK(path.off <= h.target.len && path.len == h.target.len - path.off,
			   "a path at %zu+%zu in a target of %zu bytes", path.off, path.len, h.target.len);
		FUZZ_CHECK(path.len == 0 || buf[h.target.off + path.off] == '/' || buf[h.target.off + path.off] == '?',
			   "a path starting with %#x", (unsigned char)buf[h.target.off + path.off]);
	} else
		FUZZ_CHECK(why && *why, "a refused URL without a reason");
	if (h.has_host)
		check_quote(buf + h.host.off, h.host.len, sizeof(char[64]));
	return 0;
}
