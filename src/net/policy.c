/* A sandbox's network policy: the flag parsers, the address classifier
 * and the per-connection decision (policy.h). Pure: no I/O. */
#include "policy.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "layout.h"
#include "util.h"

/* The address space in order, one group per span (policy.h). */
static const struct span {
	uint32_t lo, hi;
	enum cap_net_group g;
} spans[] = {
	{ 0x00000000u, 0x00ffffffu, CAP_NET_RESERVED },	/* 0.0.0.0/8 */
	{ 0x01000000u, 0x09ffffffu, CAP_NET_PUBLIC },
	{ 0x0a000000u, 0x0affffffu, CAP_NET_LAN },		/* 10.0.0.0/8 */
	{ 0x0b000000u, 0x643fffffu, CAP_NET_PUBLIC },
	{ 0x64400000u, 0x647fffffu, CAP_NET_LAN },		/* 100.64.0.0/10 */
	{ 0x64800000u, 0x7effffffu, CAP_NET_PUBLIC },
	{ 0x7f000000u, 0x7fffffffu, CAP_NET_HOST },		/* 127.0.0.0/8 */
	{ 0x80000000u, 0xa9fdffffu, CAP_NET_PUBLIC },
	{ 0xa9fe0000u, 0xa9feffffu, CAP_NET_LINKLOCAL },	/* 169.254.0.0/16 */
	{ 0xa9ff0000u, 0xac0fffffu, CAP_NET_PUBLIC },
	{ 0xac100000u, 0xac1fffffu, CAP_NET_LAN },		/* 172.16.0.0/12 */
	{ 0xac200000u, 0xc0a7ffffu, CAP_NET_PUBLIC },
	{ 0xc0a80000u, 0xc0a8ffffu, CAP_NET_LAN },		/* 192.168.0.0/16 */
	{ 0xc0a90000u, 0xdfffffffu, CAP_NET_PUBLIC },
	{ 0xe0000000u, 0xffffffffu, CAP_NET_RESERVED },	/* 224/4, 240/4 */
};

#define LINKLOCAL_LO 0xa9fe0000u
#define LINKLOCAL_HI 0xa9feffffu
#define LOOPBACK 0x7f000001u
#define ANY_ADDR 0x00000000u

/* A DNS name without its trailing dot, and one label (RFC 1035). */
#define NAME_MAX_LEN 253
#define LABEL_MAX_LEN 63

void cap_net_policy_init(struct cap_net_policy *p)
{
	memset(p, 0, sizeof(*p));
}

enum cap_net_group cap_net_classify(uint32_t addr)
{
	for (size_t i = 0; i < CAP_ARRAY_SIZE(spans); i++)
		if (addr <= spans[i].hi)
			return spans[i].g;
	CAP_BUG_ON(1);
	return CAP_NET_RESERVED;
}

const char *cap_net_group_name(enum cap_net_group g)
{
	static const char *const names[] = {
		[CAP_NET_PUBLIC] = "public", [CAP_NET_LAN] = "lan",
		[CAP_NET_HOST] = "host", [CAP_NET_LINKLOCAL] = "link-local",
		[CAP_NET_RESERVED] = "reserved",
	};
	return (unsigned)g < CAP_ARRAY_SIZE(names) ? names[g] : "unknown";
}

const char *cap_net_addr_str(uint32_t addr, char buf[16])
{
	snprintf(buf, 16, "%u.%u.%u.%u", addr >> 24, (addr >> 16) & 0xff,
		 (addr >> 8) & 0xff, addr & 0xff);
	return buf;
}

/* A decimal number of 1 to maxdigits digits without a leading zero
 * (except "0" itself) in s[0..len), at most max. */
static bool parse_num(const char *s, size_t len, size_t maxdigits, uint32_t max,
		      uint32_t *out)
{
	uint32_t v = 0;

	if (len == 0 || len > maxdigits || (len > 1 && s[0] == '0'))
		return false;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return false;
		v = v * 10 + (uint32_t)(s[i] - '0');
	}
	if (v > max)
		return false;
	*out = v;
	return true;
}

/* Strict dotted quad in s[0..len). */
static bool parse_addr(const char *s, size_t len, uint32_t *out)
{
	uint32_t a = 0;
	size_t start = 0;
	unsigned parts = 0;

	for (size_t i = 0; i <= len; i++) {
		if (i < len && s[i] != '.')
			continue;
		uint32_t octet;
		if (parts == 4 || !parse_num(s + start, i - start, 3, 255, &octet))
			return false;
		a = a << 8 | octet;
		parts++;
		start = i + 1;
	}
	if (parts != 4)
		return false;
	*out = a;
	return true;
}

bool cap_net_addr_parse(const char *s, uint32_t *out)
{
	return s && parse_addr(s, strlen(s), out);
}

static bool parse_port(const char *s, size_t len, uint16_t *out)
{
	uint32_t v;

	if (!parse_num(s, len, 5, 65535, &v) || v == 0)
		return false;
	*out = (uint16_t)v;
	return true;
}

static bool name_char(unsigned char c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
	       (c >= '0' && c <= '9') || c == '-' || c == '_' || c == '.';
}

/* One trailing dot (the root) is accepted: "example.com." is a name. */
bool cap_net_valid_name(const char *name, size_t len)
{
	size_t label = 0;

	if (!name)
		return false;
	if (len > 1 && name[len - 1] == '.')
		len--;
	if (len == 0 || len > NAME_MAX_LEN)
		return false;
	for (size_t i = 0; i < len; i++) {
		if (!name_char((unsigned char)name[i]))
			return false;
		if (name[i] != '.') {
			if (++label > LABEL_MAX_LEN)
				return false;
			continue;
		}
		if (label == 0)
			return false;
		label = 0;
	}
	return label > 0;
}

/* name lowercased and without its trailing dot into out, if valid. */
static bool norm_name(const char *name, char out[NAME_MAX_LEN + 1])
{
	size_t len = strnlen(name, NAME_MAX_LEN + 2);

	if (!cap_net_valid_name(name, len))
		return false;
	if (name[len - 1] == '.')
		len--;
	for (size_t i = 0; i < len; i++) {
		char c = name[i];
		out[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
	}
	out[len] = '\0';
	return true;
}

/* s for an error message: quoted, non-printable bytes as \xNN, long
 * ones cut with "...". */
static const char *quote(const char *s, char *buf, size_t size)
{
	size_t o = 0;

	CAP_BUG_ON(size < 16);
	buf[o++] = '"';
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (o + 8 >= size) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
			o += (size_t)snprintf(buf + o, size - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

/* What is wrong with the bytes of a flag's value, or NULL. */
static const char *bad_bytes(const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (c <= 0x20 || c == 0x7f)
			return "it contains whitespace or a control character; write it without them";
		if (c >= 0x80)
			return "it contains non-ASCII characters; write an international name in its "
			       "xn-- (punycode) form";
	}
	return NULL;
}

static uint32_t prefix_mask(unsigned prefix)
{
	return prefix == 0 ? 0 : 0xffffffffu << (32 - prefix);
}

static uint32_t rule_hi(const struct cap_net_rule *r)
{
	return r->addr | ~prefix_mask(r->prefix);
}

static bool inside(uint32_t lo, uint32_t hi, uint32_t span_lo, uint32_t span_hi)
{
	return lo >= span_lo && hi <= span_hi;
}

/* Validate and fold a DNS name of a rule (s[0..len), no "*.") into out;
 * on failure a reason in *why. */
static bool rule_name(const char *s, size_t len, char out[NAME_MAX_LEN + 1],
		      const char **why)
{
	size_t start = 0;

	if (len > 1 && s[len - 1] == '.')
		len--;
	if (len > NAME_MAX_LEN) {
		*why = "the name is longer than 253 characters";
		return false;
	}
	for (size_t i = 0; i <= len; i++) {
		if (i < len && s[i] != '.') {
			if (!name_char((unsigned char)s[i])) {
				*why = "a DNS name holds only letters, digits, '-', '_' and '.'";
				return false;
			}
			continue;
		}
		size_t l = i - start;
		if (l == 0) {
			*why = "it has an empty label (\"..\", or a dot at the start); "
			       "write the name as example.com";
			return false;
		}
		if (l > LABEL_MAX_LEN) {
			*why = "a label is longer than 63 characters";
			return false;
		}
		if (s[start] == '-' || s[i - 1] == '-') {
			*why = "a label cannot begin or end with '-'";
			return false;
		}
		start = i + 1;
	}
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		out[i] = (c >= 'A' && c <= 'Z') ? (char)(c - 'A' + 'a') : c;
	}
	out[len] = '\0';
	return true;
}

/* Digits and dots with at least one digit: meant as an address. */
static bool all_digits_dots(const char *s, size_t len)
{
	bool digit = false;

	for (size_t i = 0; i < len; i++) {
		if (s[i] >= '0' && s[i] <= '9')
			digit = true;
		else if (s[i] != '.')
			return false;
	}
	return digit;
}

static int parse_rule(const char *text, struct cap_net_rule *r, struct cap_err *err)
{
	char q[160], net[16];
	const char *why, *colon, *slash;
	size_t len, hlen;

	if (!text || !*text)
		return cap_err_set(err, EINVAL,
				   "--allow-egress needs a RULE: an IPv4 address, A.B.C.D/N, "
				   "HOST or *.DOMAIN, each optionally :PORT");
	quote(text, q, sizeof(q));
	len = strlen(text);
	if (len >= sizeof(r->text))
		return cap_err_set(err, EINVAL,
				   "--allow-egress %s: too long (a name is at most 253 characters)", q);
	if ((why = bad_bytes(text)))
		return cap_err_set(err, EINVAL, "--allow-egress %s: %s", q, why);
	if (text[0] == '[' || (strchr(text, ':') && strchr(text, ':') != strrchr(text, ':')))
		return cap_err_set(err, EINVAL,
				   "--allow-egress %s: IPv6 is not supported (the sandbox's network "
				   "is IPv4 only); write an IPv4 address or a name", q);

	memcpy(r->text, text, len + 1);
	hlen = len;
	colon = strchr(text, ':');
	if (colon) {
		hlen = (size_t)(colon - text);
		if (!parse_port(colon + 1, strlen(colon + 1), &r->port))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: the port must be a number from 1 to "
					   "65535 without leading zeros (like example.com:443)", q);
		if (hlen == 0)
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: no address or name before the port "
					   "(like 203.0.113.10%s)", q, colon);
	}

	if (hlen == 1 && text[0] == '*')
		return cap_err_set(err, EINVAL,
				   "--allow-egress %s: a wildcard over every name; use "
				   "--allow-public to open every public address", q);
	if (hlen > 2 && text[0] == '*' && text[1] == '.') {
		r->kind = CAP_NET_RULE_DOMAIN;
		if (memchr(text + 2, '*', hlen - 2))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: '*' may only be the whole first label "
					   "(like *.example.com)", q);
		if (all_digits_dots(text + 2, hlen - 2))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: a wildcard needs a DNS name after \"*.\"; "
					   "for addresses write a CIDR like 10.0.0.0/8", q);
		if (!rule_name(text + 2, hlen - 2, r->name, &why))
			return cap_err_set(err, EINVAL, "--allow-egress %s: %s", q, why);
		if (!strchr(r->name, '.'))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: too broad (a wildcard over a whole "
					   "top-level domain); use --allow-public to open every public "
					   "address, or name a domain like *.example.com", q);
		return 0;
	}
	if (memchr(text, '*', hlen))
		return cap_err_set(err, EINVAL,
				   "--allow-egress %s: '*' may only be the whole first label "
				   "(like *.example.com)", q);

	slash = memchr(text, '/', hlen);
	if (slash || all_digits_dots(text, hlen)) {
		size_t alen = slash ? (size_t)(slash - text) : hlen;
		uint32_t prefix = 32;
		r->kind = CAP_NET_RULE_CIDR;
		if (!parse_addr(text, alen, &r->addr))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: not an IPv4 address (write four numbers "
					   "0-255 without leading zeros, like 203.0.113.10 or "
					   "10.0.0.0/8)", q);
		if (slash && !parse_num(slash + 1, hlen - alen - 1, 2, 32, &prefix))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: the prefix length after '/' must be a "
					   "number from 0 to 32 (like 10.0.0.0/8)", q);
		r->prefix = prefix;
		if (r->addr & ~prefix_mask(r->prefix))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: host bits are set; write the network "
					   "address %s/%u",
					   q, cap_net_addr_str(r->addr & prefix_mask(r->prefix), net),
					   r->prefix);
		uint32_t hi = rule_hi(r);
		if (inside(r->addr, hi, 0x00000000u, 0x00ffffffu) ||
		    inside(r->addr, hi, 0xe0000000u, 0xffffffffu))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: reserved (0.0.0.0/8, multicast "
					   "224.0.0.0/4, 240.0.0.0/4): never reachable", q);
		if (inside(r->addr, hi, 0x7f000000u, 0x7fffffffu))
			return cap_err_set(err, EINVAL,
					   "--allow-egress %s: 127.0.0.0/8 is the host's loopback; "
					   "--allow-host opens it (through the gateway 10.0.2.2, "
					   CAP_NET_HOST_NAME ")", q);
		return 0;
	}

	r->kind = CAP_NET_RULE_HOST;
	if (!rule_name(text, hlen, r->name, &why))
		return cap_err_set(err, EINVAL, "--allow-egress %s: %s", q, why);
	if (!strcmp(r->name, CAP_NET_HOST_NAME))
		return cap_err_set(err, EINVAL,
				   "--allow-egress %s: the host is opened by --allow-host", q);
	return 0;
}

int cap_net_rule_add(struct cap_net_policy *p, const char *text, struct cap_err *err)
{
	struct cap_net_rule r;
	int rc;

	memset(&r, 0, sizeof(r));
	rc = parse_rule(text, &r, err);
	if (rc < 0)
		return rc;
	if (p->nrules >= CAP_NET_MAX_RULES)
		return cap_err_set(err, E2BIG,
				   "--allow-egress: more than %d rules; cover several with a "
				   "CIDR or *.DOMAIN", CAP_NET_MAX_RULES);
	p->rules[p->nrules++] = r;
	p->enabled = true;
	return 0;
}

int cap_net_publish_add(struct cap_net_policy *p, const char *text, struct cap_err *err)
{
	static const char form[] =
		"write [BIND:]HOST_PORT:GUEST_PORT, like 8080:80 or 0.0.0.0:8080:80";
	struct cap_net_publish pub = { .bind = LOOPBACK };
	const char *part[3], *why;
	size_t plen[3], n = 0;
	char q[160], b[16];

	if (!text || !*text)
		return cap_err_set(err, EINVAL, "--publish needs a value: %s", form);
	quote(text, q, sizeof(q));
	if ((why = bad_bytes(text)))
		return cap_err_set(err, EINVAL, "--publish %s: %s", q, why);
	for (const char *s = text;; n++) {
		const char *c = strchr(s, ':');
		if (n == 3)
			return cap_err_set(err, EINVAL, "--publish %s: %s (IPv6 is not supported)",
					   q, form);
		part[n] = s;
		plen[n] = c ? (size_t)(c - s) : strlen(s);
		if (!c) {
			n++;
			break;
		}
		s = c + 1;
	}
	if (n < 2)
		return cap_err_set(err, EINVAL, "--publish %s: %s", q, form);
	if (n == 3 && !parse_addr(part[0], plen[0], &pub.bind))
		return cap_err_set(err, EINVAL,
				   "--publish %s: BIND must be an IPv4 address like 127.0.0.1 or "
				   "0.0.0.0; %s", q, form);
	if (!parse_port(part[n - 2], plen[n - 2], &pub.host_port) ||
	    !parse_port(part[n - 1], plen[n - 1], &pub.guest_port))
		return cap_err_set(err, EINVAL,
				   "--publish %s: ports are numbers from 1 to 65535 without "
				   "leading zeros; %s", q, form);
	for (unsigned i = 0; i < p->npublish; i++) {
		const struct cap_net_publish *o = &p->publish[i];
		if (o->host_port != pub.host_port ||
		    (o->bind != pub.bind && o->bind != ANY_ADDR && pub.bind != ANY_ADDR))
			continue;
		return cap_err_set(err, EINVAL,
				   "--publish %s: host port %s:%u is already published (to guest "
				   "port %u); choose another HOST_PORT",
				   q, cap_net_addr_str(o->bind, b), o->host_port, o->guest_port);
	}
	if (p->npublish >= CAP_NET_MAX_PUBLISH)
		return cap_err_set(err, E2BIG, "--publish: more than %d published ports",
				   CAP_NET_MAX_PUBLISH);
	p->publish[p->npublish++] = pub;
	p->enabled = true;
	return 0;
}

/* --- secrets ----------------------------------------------------------- */

#define SECRET_FORM "--secret NAME=SOURCE@HOST[,HOST...][:body], SOURCE env:VAR or file:/PATH"

/* What capsule itself puts in every command's environment: a secret
 * cannot take these names. */
static const char *const reserved_env[] = {
	"HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "NO_PROXY", "no_proxy",
	"ALL_PROXY", "all_proxy", "SSL_CERT_FILE", "REQUESTS_CA_BUNDLE",
	"NODE_EXTRA_CA_CERTS", "GIT_SSL_CAINFO", "PATH", "HOME", "USER", "TERM",
};

/* A variable name of 1 to max bytes. */
static bool env_name(const char *s, size_t len, size_t max)
{
	return len <= max && cap_env_name_ok(s, len);
}

static int secret_source(const char *src, size_t len, struct cap_net_secret *s,
			 const char *q, struct cap_err *err)
{
	if (len >= sizeof(s->source))
		return cap_err_set(err, EINVAL, "--secret %s: the source is longer than %zu characters",
				   q, sizeof(s->source) - 1);
	if (len > 4 && !strncmp(src, "env:", 4)) {
		if (!env_name(src + 4, len - 4, 255))
			return cap_err_set(err, EINVAL,
					   "--secret %s: env:VAR names an environment variable "
					   "(letters, digits and '_', not starting with a digit)", q);
	} else if (len > 5 && !strncmp(src, "file:", 5)) {
		if (src[5] != '/')
			return cap_err_set(err, EINVAL,
					   "--secret %s: file:PATH needs an absolute path here "
					   "(the command line makes a relative one absolute)", q);
	} else {
		return cap_err_set(err, EINVAL,
				   "--secret %s: the source before '@' is env:VAR (an environment "
				   "variable of the command that starts the sandbox) or file:PATH "
				   "(a file on the host), read at each start", q);
	}
	memcpy(s->source, src, len);
	s->source[len] = '\0';
	return 0;
}

static int secret_hosts(const char *h, struct cap_net_secret *s, const char *q,
			struct cap_err *err)
{
	size_t len = strlen(h);

	if (len >= 5 && !strcmp(h + len - 5, ":body")) {
		s->body = true;
		len -= 5;
	}
	if (len == 0)
		return cap_err_set(err, EINVAL,
				   "--secret %s: no host after '@': name the hosts the secret is "
				   "sent to (HOST or *.DOMAIN, comma-separated)", q);
	for (size_t at = 0; at <= len;) {
		const char *e = memchr(h + at, ',', len - at), *why = NULL;
		size_t end = e ? (size_t)(e - h) : len, hl = end - at;
		const char *host = h + at;
		bool domain = hl > 2 && host[0] == '*' && host[1] == '.';

		if (s->nhosts >= CAP_NET_SECRET_MAX_HOSTS)
			return cap_err_set(err, E2BIG, "--secret %s: more than %d hosts", q,
					   CAP_NET_SECRET_MAX_HOSTS);
		if (domain) {
			host += 2;
			hl -= 2;
		}
		if (hl == 0)
			return cap_err_set(err, EINVAL, "--secret %s: an empty host in the list", q);
		if (memchr(host, ':', hl))
			return cap_err_set(err, EINVAL,
					   "--secret %s: a secret's host takes no port (it is "
					   "allowed on %d and intercepted on any port); the only "
					   "suffix is \":body\"", q, CAP_NET_SECRET_PORT);
		if (all_digits_dots(host, hl))
			return cap_err_set(err, EINVAL,
					   "--secret %s: name the host, not an address: the value is "
					   "only sent to a server proving that name", q);
		if (memchr(host, '*', hl))
			return cap_err_set(err, EINVAL,
					   "--secret %s: '*' only as a whole first label (*.example.com)", q);
		if (!rule_name(host, hl, s->hosts[s->nhosts].name, &why))
			return cap_err_set(err, EINVAL, "--secret %s: %s", q, why);
		s->hosts[s->nhosts++].kind = domain ? CAP_NET_SECRET_DOMAIN : CAP_NET_SECRET_HOST;
		at = end + 1;
	}
	return 0;
}

int cap_net_secret_add(struct cap_net_policy *p, const char *text, struct cap_err *err)
{
	struct cap_net_secret *s;
	const char *eq, *at, *why;
	char q[160];
	int r;

	if (!text || !*text)
		return cap_err_set(err, EINVAL, "--secret needs %s", SECRET_FORM);
	quote(text, q, sizeof(q));
	if ((why = bad_bytes(text)))
		return cap_err_set(err, EINVAL, "--secret %s: %s", q, why);
	eq = strchr(text, '=');
	at = strrchr(text, '@');
	if (!eq || !at || at < eq)
		return cap_err_set(err, EINVAL, "--secret %s: write it as %s", q, SECRET_FORM);
	if (!env_name(text, (size_t)(eq - text), sizeof(s->name) - 1))
		return cap_err_set(err, EINVAL,
				   "--secret %s: NAME is the guest's environment variable: letters, "
				   "digits and '_', not starting with a digit, at most %zu", q,
				   sizeof(s->name) - 1);
	for (size_t i = 0; i < CAP_ARRAY_SIZE(reserved_env); i++)
		if (strlen(reserved_env[i]) == (size_t)(eq - text) &&
		    !strncmp(text, reserved_env[i], (size_t)(eq - text)))
			return cap_err_set(err, EINVAL,
					   "--secret %s: %s is set by capsule in every command; "
					   "choose another NAME", q, reserved_env[i]);
	for (unsigned i = 0; i < p->nsecrets; i++)
		if (strlen(p->secrets[i].name) == (size_t)(eq - text) &&
		    !strncmp(text, p->secrets[i].name, (size_t)(eq - text)))
			return cap_err_set(err, EEXIST, "--secret %s: %s is declared twice", q,
					   p->secrets[i].name);
	if (p->nsecrets >= CAP_NET_MAX_SECRETS)
		return cap_err_set(err, E2BIG, "--secret: more than %d secrets", CAP_NET_MAX_SECRETS);

	s = xcalloc(1, sizeof(*s));
	memcpy(s->name, text, (size_t)(eq - text));
	r = secret_source(eq + 1, (size_t)(at - eq - 1), s, q, err);
	if (r == 0)
		r = secret_hosts(at + 1, s, q, err);
	if (r == 0) {
		p->secrets[p->nsecrets++] = *s;
		p->enabled = true;
	}
	free(s);
	return r < 0 ? r : 0;
}

void cap_net_secret_text(const struct cap_net_secret *s, char *buf, size_t len)
{
	size_t o = 0;

	o += (size_t)snprintf(buf, len, "%s=%s@", s->name, s->source);
	for (unsigned i = 0; i < s->nhosts && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%s%s%s", i ? "," : "",
				      s->hosts[i].kind == CAP_NET_SECRET_DOMAIN ? "*." : "",
				      s->hosts[i].name);
	if (s->body && o < len)
		snprintf(buf + o, len - o, ":body");
}

/* --- credential files ------------------------------------------------------------ */

#define SECRET_FILE_FORM "--secret-file GUESTPATH=HOSTFILE[:FIELD,...]@HOST[,HOST...]"

/* GUESTPATH as the guest sees it: absolute under /work, "~/x" or "x"
 * relative to it; no "." or ".." component, no empty one, not /work. */
static bool guest_file_path(const char *s, size_t len, char out[256])
{
	static const char home[] = CAP_GUEST_WORK "/";
	size_t o = 0;
	if (len >= 2 && s[0] == '~' && s[1] == '/') {
		s += 2;
		len -= 2;
	} else if (len >= sizeof(home) - 1 && !strncmp(s, home, sizeof(home) - 1)) {
		s += sizeof(home) - 1;
		len -= sizeof(home) - 1;
	} else if (len && s[0] == '/') {
		return false;
	}
	if (len == 0 || len + sizeof(home) > 256)
		return false;
	memcpy(out, home, sizeof(home) - 1);
	o = sizeof(home) - 1;
	for (size_t at = 0; at < len;) {
		const char *e = memchr(s + at, '/', len - at);
		size_t end = e ? (size_t)(e - s) : len, cl = end - at;
		if (cl == 0 || (cl == 1 && s[at] == '.') || (cl == 2 && s[at] == '.' && s[at + 1] == '.'))
			return false;
		if (o > sizeof(home) - 1)
			out[o++] = '/';
		memcpy(out + o, s + at, cl);
		o += cl;
		at = end + 1;
		if (e && at == len)
			return false;	/* a trailing '/' */
	}
	out[o] = '\0';
	return true;
}

/* A FIELD: dotted names of [A-Za-z0-9_-], none empty. */
static bool field_path(const char *s, size_t len)
{
	if (len == 0 || len >= sizeof(((struct cap_net_secret_file *)0)->fields[0]) || s[0] == '.' ||
	    s[len - 1] == '.')
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (c == '.' ? s[i + 1] == '.' :
		    !((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_' || c == '-'))
			return false;
	}
	return true;
}

int cap_net_secret_file_add(struct cap_net_policy *p, const char *text, struct cap_err *err)
{
	const char *eq, *at, *why;
	char q[160];

	if (!text || !*text)
		return cap_err_set(err, EINVAL, "--secret-file needs %s", SECRET_FILE_FORM);
	quote(text, q, sizeof(q));
	if ((why = bad_bytes(text)))
		return cap_err_set(err, EINVAL, "--secret-file %s: %s", q, why);
	eq = strchr(text, '=');
	at = strrchr(text, '@');
	if (!eq || !at || at < eq)
		return cap_err_set(err, EINVAL, "--secret-file %s: write it as %s", q, SECRET_FILE_FORM);
	struct cap_net_secret_file *f = xcalloc(1, sizeof(*f));
	int r = 0;
	if (!guest_file_path(text, (size_t)(eq - text), f->guest)) {
		r = cap_err_set(err, EINVAL,
				"--secret-file %s: GUESTPATH is a file under " CAP_GUEST_WORK
				" (the tool user's home): " CAP_GUEST_WORK "/PATH, ~/PATH or PATH, no '.' or '..' component, at most 250 characters", q);
		goto out;
	}
	/* HOSTFILE[:FIELDS]: the fields after the last ':' that is followed
	 * by no '/', so that a host path may hold a ':'. */
	const char *host = eq + 1, *colon = NULL;
	for (const char *c = host; c < at; c++)
		if (*c == ':')
			colon = c;
	if (colon && memchr(colon, '/', (size_t)(at - colon)))
		colon = NULL;
	const char *hend = colon ? colon : at;
	if (hend == host || host[0] != '/') {
		r = cap_err_set(err, EINVAL,
				"--secret-file %s: HOSTFILE needs an absolute path here (the command line makes a relative one absolute)", q);
		goto out;
	}
	if ((size_t)(hend - host) >= sizeof(f->host)) {
		r = cap_err_set(err, EINVAL, "--secret-file %s: HOSTFILE is longer than %zu characters", q,
				sizeof(f->host) - 1);
		goto out;
	}
	memcpy(f->host, host, (size_t)(hend - host));
	for (const char *c = colon ? colon + 1 : at; c < at;) {
		const char *e = memchr(c, ',', (size_t)(at - c));
		size_t fl = (size_t)((e ? e : at) - c);
		if (!field_path(c, fl)) {
			r = cap_err_set(err, EINVAL,
					"--secret-file %s: a FIELD is a dotted path of JSON member names (letters, digits, '_' and '-', such as claudeAiOauth.accessToken), at most 127 characters",
					q);
			goto out;
		}
		if (f->nfields >= CAP_NET_SECRET_FILE_FIELDS) {
			r = cap_err_set(err, E2BIG, "--secret-file %s: more than %d fields", q, CAP_NET_SECRET_FILE_FIELDS);
			goto out;
		}
		memcpy(f->fields[f->nfields++], c, fl);
		c += fl + 1;
		if (e && c == at) {
			r = cap_err_set(err, EINVAL, "--secret-file %s: an empty FIELD in the list", q);
			goto out;
		}
	}
	if (colon && f->nfields == 0) {
		r = cap_err_set(err, EINVAL, "--secret-file %s: an empty FIELD list after ':'", q);
		goto out;
	}
	if ((r = secret_hosts(at + 1, &f->hosts, q, err)) < 0) {
		/* Its messages say --secret: this flag's name instead. */
		char msg[sizeof(err->msg)];
		snprintf(msg, sizeof(msg), "%s", err->msg);
		if (!strncmp(msg, "--secret ", 9))
			cap_err_set(err, -r, "--secret-file %s", msg + 9);
		goto out;
	}
	if (f->hosts.body) {
		r = cap_err_set(err, EINVAL,
				"--secret-file %s: a credential file's values go in request headers only (no :body: a refresh token sent in a body would mint tokens the guest could read)", q);
		goto out;
	}
	for (unsigned i = 0; i < p->nsecret_files; i++)
		if (!strcmp(p->secret_files[i].guest, f->guest)) {
			r = cap_err_set(err, EEXIST, "--secret-file %s: %s is given twice", q, f->guest);
			goto out;
		}
	if (p->nsecret_files >= CAP_NET_MAX_SECRET_FILES) {
		r = cap_err_set(err, E2BIG, "--secret-file: more than %d credential files", CAP_NET_MAX_SECRET_FILES);
		goto out;
	}
	p->secret_files[p->nsecret_files++] = *f;
	p->enabled = true;
out:
	free(f);
	return r < 0 ? r : 0;
}

void cap_net_secret_file_text(const struct cap_net_secret_file *f, char *buf, size_t len)
{
	size_t o = (size_t)snprintf(buf, len, "%s=%s", f->guest, f->host);
	for (unsigned i = 0; i < f->nfields && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%c%s", i ? ',' : ':', f->fields[i]);
	for (unsigned i = 0; i < f->hosts.nhosts && o < len; i++)
		o += (size_t)snprintf(buf + o, len - o, "%c%s%s", i ? ',' : '@',
				      f->hosts.hosts[i].kind == CAP_NET_SECRET_DOMAIN ? "*." : "",
				      f->hosts.hosts[i].name);
}

/* Whether one of s's hosts is name (folded). */
static bool secret_matches(const struct cap_net_secret *s, const char *name)
{
	size_t nl = strlen(name);

	for (unsigned i = 0; i < s->nhosts; i++) {
		const char *h = s->hosts[i].name;
		size_t hl = strlen(h);
		if (s->hosts[i].kind == CAP_NET_SECRET_HOST ? !strcmp(h, name) :
		    nl > hl + 1 && name[nl - hl - 1] == '.' && !strcmp(name + nl - hl, h))
			return true;
	}
	return false;
}

bool cap_net_secret_host_match(const struct cap_net_secret *s, const char *name)
{
	char n[NAME_MAX_LEN + 1];

	return name && norm_name(name, n) && secret_matches(s, n);
}

int cap_net_policy_apply(struct cap_net_policy *p, const char *flag,
			 const char *value, struct cap_err *err)
{
	static const char known[] = "known: allow-egress, allow-public, allow-lan, "
				    "allow-host, publish, auto-publish, secret, secret-file";
	char name[32], q[160];
	const char *eq;
	size_t len;

	if (!flag)
		return cap_err_set(err, EINVAL, "no network flag given");
	/* The words form "allow-egress=RULE" arrives as one string. */
	eq = value ? NULL : strchr(flag, '=');
	len = eq ? (size_t)(eq - flag) : strlen(flag);
	if (len >= sizeof(name))
		return cap_err_set(err, EINVAL, "unknown network flag %s (%s)",
				   quote(flag, q, sizeof(q)), known);
	memcpy(name, flag, len);
	name[len] = '\0';
	if (eq)
		value = eq + 1;

	if (!strcmp(name, "allow-egress")) {
		if (!value)
			return cap_err_set(err, EINVAL,
					   "--allow-egress needs a RULE: an IPv4 address, A.B.C.D/N, "
					   "HOST or *.DOMAIN, each optionally :PORT");
		return cap_net_rule_add(p, value, err);
	}
	if (!strcmp(name, "publish")) {
		if (!value)
			return cap_err_set(err, EINVAL,
					   "--publish needs [BIND:]HOST_PORT:GUEST_PORT");
		return cap_net_publish_add(p, value, err);
	}
	if (!strcmp(name, "secret")) {
		if (!value)
			return cap_err_set(err, EINVAL, "--secret needs %s", SECRET_FORM);
		return cap_net_secret_add(p, value, err);
	}
	if (!strcmp(name, "secret-file")) {
		if (!value)
			return cap_err_set(err, EINVAL, "--secret-file needs %s", SECRET_FILE_FORM);
		return cap_net_secret_file_add(p, value, err);
	}
	bool *on = !strcmp(name, "allow-public") ? &p->allow_public :
		   !strcmp(name, "allow-lan")    ? &p->allow_lan :
		   !strcmp(name, "allow-host")   ? &p->allow_host :
		   !strcmp(name, "auto-publish") ? &p->auto_publish :
		                                   NULL;
	if (on && value)
		return cap_err_set(err, EINVAL, "--%s takes no value (got %s)", name,
				   quote(value, q, sizeof(q)));
	if (on) {
		*on = true;
		p->enabled = true;
		return 0;
	}
	return cap_err_set(err, EINVAL, "unknown network flag %s (%s)",
			   quote(name, q, sizeof(q)), known);
}

void cap_net_policy_words(const struct cap_net_policy *p, char ***v, size_t *n)
{
	size_t k = 0, max = 4 + p->nrules + p->npublish + p->nsecrets + p->nsecret_files;
	char **w = xcalloc(max, sizeof(*w));
	char b[16], s[sizeof(p->secret_files[0]) + CAP_NET_SECRET_MAX_HOSTS * 256 + 80];

	if (p->enabled) {
		if (p->allow_public)
			w[k++] = xstrdup("allow-public");
		if (p->allow_lan)
			w[k++] = xstrdup("allow-lan");
		if (p->allow_host)
			w[k++] = xstrdup("allow-host");
		if (p->auto_publish)
			w[k++] = xstrdup("auto-publish");
		for (unsigned i = 0; i < p->nrules; i++)
			w[k++] = xasprintf("allow-egress=%s", p->rules[i].text);
		for (unsigned i = 0; i < p->npublish; i++)
			w[k++] = xasprintf("publish=%s:%u:%u",
					   cap_net_addr_str(p->publish[i].bind, b),
					   p->publish[i].host_port, p->publish[i].guest_port);
		for (unsigned i = 0; i < p->nsecrets; i++) {
			if (p->secrets[i].from_file)
				continue;	/* a start's own, from a secret-file */
			cap_net_secret_text(&p->secrets[i], s, sizeof(s));
			w[k++] = xasprintf("secret=%s", s);
		}
		for (unsigned i = 0; i < p->nsecret_files; i++) {
			cap_net_secret_file_text(&p->secret_files[i], s, sizeof(s));
			w[k++] = xasprintf("secret-file=%s", s);
		}
	}
	*v = w;
	*n = k;
}

char *cap_net_policy_line(const struct cap_net_policy *p)
{
	char **w;
	size_t n, len = 1;
	cap_net_policy_words(p, &w, &n);
	for (size_t i = 0; i < n; i++)
		len += strlen(w[i]) + 1;
	char *out = xmalloc(len), *o = out;
	*o = '\0';
	for (size_t i = 0; i < n; i++) {
		o += sprintf(o, "%s%s", i ? " " : "", w[i]);
		free(w[i]);
	}
	free(w);
	return out;
}

char *cap_net_policy_secrets_line(const struct cap_net_policy *p)
{
	struct cap_net_policy *only = xmalloc(sizeof(*only));
	cap_net_policy_init(only);
	only->enabled = p->enabled;
	only->nsecrets = p->nsecrets;
	memcpy(only->secrets, p->secrets, p->nsecrets * sizeof(p->secrets[0]));
	only->nsecret_files = p->nsecret_files;
	memcpy(only->secret_files, p->secret_files, p->nsecret_files * sizeof(p->secret_files[0]));
	char *line = cap_net_policy_line(only);
	free(only);
	return line;
}

int cap_net_policy_parse_line(struct cap_net_policy *p, const char *line,
			      struct cap_err *err)
{
	struct cap_net_policy *tmp = xmalloc(sizeof(*tmp));
	char *copy = xstrdup(line), *save = NULL;
	int r = 0;
	cap_net_policy_init(tmp);
	for (char *w = strtok_r(copy, " ", &save); w && r == 0; w = strtok_r(NULL, " ", &save)) {
		if ((r = cap_net_policy_apply(tmp, w, NULL, err)) < 0) {
			char why[sizeof(err->msg)];
			snprintf(why, sizeof(why), "%s", err->msg);
			cap_err_set(err, -r, "'%s' is not valid: %s", w, why);
		}
	}
	if (r == 0)
		*p = *tmp;
	free(copy);
	free(tmp);
	return r;
}

char *cap_net_policy_describe(const struct cap_net_policy *p)
{
	char **w;
	size_t n, len = 1;
	char *out, *o;

	if (!p->enabled)
		return xstrdup("none (no network interface)");
	cap_net_policy_words(p, &w, &n);
	if (n == 0) {
		free(w);
		return xstrdup("a network interface with nothing allowed");
	}
	for (size_t i = 0; i < n; i++)
		len += strlen(w[i]) + 3;
	out = o = xmalloc(len);
	for (size_t i = 0; i < n; i++) {
		char *eq = strchr(w[i], '=');
		if (eq)
			*eq = ' ';
		o += sprintf(o, "%s--%s", i ? " " : "", w[i]);
		free(w[i]);
	}
	free(w);
	return out;
}

static bool group_open(const struct cap_net_policy *p, enum cap_net_group g)
{
	switch (g) {
	case CAP_NET_PUBLIC:
		return p->allow_public;
	case CAP_NET_LAN:
		return p->allow_lan;
	case CAP_NET_HOST:
		return p->allow_host;
	case CAP_NET_LINKLOCAL:
	case CAP_NET_RESERVED:
		break;
	}
	return false;
}

static const char *group_flag(enum cap_net_group g)
{
	return g == CAP_NET_PUBLIC ? "--allow-public" :
	       g == CAP_NET_LAN    ? "--allow-lan" :
				     "--allow-host";
}

static bool is_name_rule(const struct cap_net_rule *r)
{
	return r->kind == CAP_NET_RULE_HOST || r->kind == CAP_NET_RULE_DOMAIN;
}

/* Whether CIDR rule r opens addr, of group g, on some port: link-local
 * only when the rule lies inside 169.254.0.0/16, the host and reserved
 * ranges never. */
static bool cidr_opens(const struct cap_net_rule *r, uint32_t addr, enum cap_net_group g)
{
	if (r->kind != CAP_NET_RULE_CIDR || (addr & prefix_mask(r->prefix)) != r->addr)
		return false;
	switch (g) {
	case CAP_NET_PUBLIC:
	case CAP_NET_LAN:
		return true;
	case CAP_NET_LINKLOCAL:
		return inside(r->addr, rule_hi(r), LINKLOCAL_LO, LINKLOCAL_HI);
	case CAP_NET_HOST:
	case CAP_NET_RESERVED:
		break;
	}
	return false;
}

/* Whether name rule r matches the folded name. */
static bool name_matches(const struct cap_net_rule *r, const char *name)
{
	size_t nl, rl;

	if (r->kind == CAP_NET_RULE_HOST)
		return !strcmp(r->name, name);
	if (r->kind != CAP_NET_RULE_DOMAIN)
		return false;
	nl = strlen(name);
	rl = strlen(r->name);
	return nl > rl + 1 && name[nl - rl - 1] == '.' && !strcmp(name + nl - rl, r->name);
}

static bool port_ok(const struct cap_net_rule *r, uint16_t port)
{
	return r->port == 0 || r->port == port;
}

__attribute__((format(printf, 3, 4))) static void
verdict(struct cap_net_verdict *v, bool allow, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(v->rule, sizeof(v->rule), fmt, ap);
	va_end(ap);
	v->allow = allow;
}

void cap_net_decide(const struct cap_net_policy *p, uint32_t addr, uint16_t port,
		    const char *name, struct cap_net_verdict *v)
{
	enum cap_net_group g = cap_net_classify(addr);
	const struct cap_net_rule *named = NULL, *other_port = NULL;
	const struct cap_net_secret *secret = NULL, *secret_other_port = NULL;
	char a[16], n[NAME_MAX_LEN + 1];
	bool have_name = name && norm_name(name, n);

	cap_net_addr_str(addr, a);
	if (g == CAP_NET_RESERVED) {
		verdict(v, false, "%s is reserved/multicast: never reachable", a);
		return;
	}
	for (unsigned i = 0; i < p->nrules; i++) {
		const struct cap_net_rule *r = &p->rules[i];
		if (port_ok(r, port) && cidr_opens(r, addr, g)) {
			verdict(v, true, "--allow-egress %s", r->text);
			return;
		}
	}
	if (group_open(p, g)) {
		verdict(v, true, "%s", group_flag(g));
		return;
	}
	for (unsigned i = 0; have_name && i < p->nrules; i++) {
		const struct cap_net_rule *r = &p->rules[i];
		if (!is_name_rule(r) || !name_matches(r, n))
			continue;
		if (port_ok(r, port)) {
			named = r;
			break;
		}
		other_port = other_port ? other_port : r;
	}
	/* A secret's hosts are open on its port as if named by a rule. */
	for (unsigned i = 0; have_name && !named && i < p->nsecrets; i++) {
		if (!secret_matches(&p->secrets[i], n))
			continue;
		if (port == CAP_NET_SECRET_PORT) {
			secret = &p->secrets[i];
			break;
		}
		secret_other_port = secret_other_port ? secret_other_port : &p->secrets[i];
	}
	const struct cap_net_secret_file *sfile = NULL, *sfile_other_port = NULL;
	for (unsigned i = 0; have_name && !named && !secret && i < p->nsecret_files; i++) {
		if (!secret_matches(&p->secret_files[i].hosts, n))
			continue;
		if (port == CAP_NET_SECRET_PORT) {
			sfile = &p->secret_files[i];
			break;
		}
		sfile_other_port = sfile_other_port ? sfile_other_port : &p->secret_files[i];
	}
	if (named && g == CAP_NET_PUBLIC) {
		verdict(v, true, "--allow-egress %s (name %s)", named->text, n);
		return;
	}
	if (secret && g == CAP_NET_PUBLIC) {
		verdict(v, true, "--secret %s (its host %s)", secret->name, n);
		return;
	}
	if (sfile && g == CAP_NET_PUBLIC) {
		verdict(v, true, "--secret-file %s (its host %s)", sfile->guest, n);
		return;
	}
	if (named || secret || sfile) {
		verdict(v, false,
			"%s resolves to %s (%s), which the policy does not open "
			"(DNS rebinding guard)", n, a, cap_net_group_name(g));
		return;
	}
	switch (g) {
	case CAP_NET_LINKLOCAL:
		verdict(v, false,
			"%s is link-local/cloud metadata: denied unless named exactly "
			"by --allow-egress", a);
		return;
	case CAP_NET_HOST:
		verdict(v, false,
			"the host (gateway) is closed: --allow-host opens the host's "
			"loopback services");
		return;
	case CAP_NET_LAN:
		verdict(v, false,
			"%s is a LAN address: --allow-lan opens the private ranges", a);
		return;
	case CAP_NET_PUBLIC:
	case CAP_NET_RESERVED:
		break;
	}
	if (other_port)
		verdict(v, false,
			"no rule allows %s:%u (name %s): --allow-egress %s opens port "
			"%u only", a, port, n, other_port->text, other_port->port);
	else if (secret_other_port)
		verdict(v, false,
			"no rule allows %s:%u (name %s): --secret %s opens port %d only "
			"(add --allow-egress %s:%u to open this one)", a, port, n,
			secret_other_port->name, CAP_NET_SECRET_PORT, n, port);
	else if (sfile_other_port)
		verdict(v, false,
			"no rule allows %s:%u (name %s): --secret-file %s opens port %d only "
			"(add --allow-egress %s:%u to open this one)", a, port, n,
			sfile_other_port->guest, CAP_NET_SECRET_PORT, n, port);
	else if (have_name)
		verdict(v, false,
			"no rule allows %s:%u (name %s; add --allow-egress %s or %s "
			"to open it)", a, port, n, n, a);
	else
		verdict(v, false,
			"no rule allows %s:%u (add --allow-egress %s to open it)", a,
			port, a);
}

void cap_net_decide_name(const struct cap_net_policy *p, const char *name,
			 struct cap_net_verdict *v)
{
	char n[NAME_MAX_LEN + 1];

	if (!name || !norm_name(name, n)) {
		verdict(v, false, "not a valid DNS name");
		return;
	}
	if (p->allow_public) {
		verdict(v, true, "--allow-public");
		return;
	}
	for (unsigned i = 0; i < p->nrules; i++) {
		if (name_matches(&p->rules[i], n)) {
			verdict(v, true, "--allow-egress %s", p->rules[i].text);
			return;
		}
	}
	for (unsigned i = 0; i < p->nsecrets; i++) {
		if (secret_matches(&p->secrets[i], n)) {
			verdict(v, true, "--secret %s", p->secrets[i].name);
			return;
		}
	}
	for (unsigned i = 0; i < p->nsecret_files; i++) {
		if (secret_matches(&p->secret_files[i].hosts, n)) {
			verdict(v, true, "--secret-file %s", p->secret_files[i].guest);
			return;
		}
	}
	verdict(v, false, "no rule names it (add --allow-egress %s to open it)", n);
}

/* Whether some port and name would make cap_net_decide allow addr: the
 * same steps, with the port and name chosen to suit. */
static bool openable(const struct cap_net_policy *p, uint32_t addr)
{
	enum cap_net_group g = cap_net_classify(addr);

	if (g == CAP_NET_RESERVED)
		return false;
	if (group_open(p, g))
		return true;
	if (g == CAP_NET_PUBLIC && (p->nsecrets > 0 || p->nsecret_files > 0))
		return true;
	for (unsigned i = 0; i < p->nrules; i++) {
		if (cidr_opens(&p->rules[i], addr, g))
			return true;
		if (g == CAP_NET_PUBLIC && is_name_rule(&p->rules[i]))
			return true;
	}
	return false;
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

/* Every span and rule boundary cuts the address space into pieces on
 * which openable() is constant, so testing one address per piece is exact. */
size_t cap_net_denied_ranges(const struct cap_net_policy *p, uint32_t (*out)[2], size_t max)
{
	uint64_t cut[CAP_ARRAY_SIZE(spans) + 2 * CAP_NET_MAX_RULES + 1];
	size_t ncut = 0, nout = 0, u = 0;
	bool in_deny = false;
	uint32_t deny_lo = 0;

	for (size_t i = 0; i < CAP_ARRAY_SIZE(spans); i++)
		cut[ncut++] = spans[i].lo;
	for (unsigned i = 0; i < p->nrules && i < CAP_NET_MAX_RULES; i++) {
		if (p->rules[i].kind != CAP_NET_RULE_CIDR)
			continue;
		cut[ncut++] = p->rules[i].addr;
		cut[ncut++] = (uint64_t)rule_hi(&p->rules[i]) + 1;
	}
	qsort(cut, ncut, sizeof(cut[0]), cmp_u64);
	for (size_t i = 0; i < ncut; i++)
		if ((u == 0 || cut[i] != cut[u - 1]) && cut[i] <= 0xffffffffu)
			cut[u++] = cut[i];
	cut[u] = 1ull << 32;

	for (size_t i = 0; i < u; i++) {
		bool deny = !openable(p, (uint32_t)cut[i]);
		if (deny && !in_deny)
			deny_lo = (uint32_t)cut[i];
		if (!deny && in_deny && nout < max) {
			out[nout][0] = deny_lo;
			out[nout++][1] = (uint32_t)(cut[i] - 1);
		}
		in_deny = deny;
	}
	if (in_deny && nout < max) {
		out[nout][0] = deny_lo;
		out[nout++][1] = 0xffffffffu;
	}
	return nout;
}
