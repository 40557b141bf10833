/* Unit tests of the network policy (src/net/policy.c): the rule and
 * publish parsers, the classifier, cap_net_decide and its mirror in the
 * kernel, cap_net_denied_ranges. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "policy.h"
#include "util.h"
#include "net-fixtures.h"

#define A(a, b, c, d) ((uint32_t)(a) << 24 | (uint32_t)(b) << 16 | (uint32_t)(c) << 8 | (uint32_t)(d))


static bool allows(const struct cap_net_policy *p, uint32_t addr, uint16_t port,
		   const char *name)
{
	struct cap_net_verdict v;
	memset(&v, 0x55, sizeof(v));
	cap_net_decide(p, addr, port, name, &v);
	assert_non_null(memchr(v.rule, '\0', sizeof(v.rule)));
	assert_true(v.rule[0] != '\0');
	return v.allow;
}

static void expect_verdict(const struct cap_net_policy *p, uint32_t addr, uint16_t port,
			   const char *name, bool allow, const char *rule)
{
	struct cap_net_verdict v;
	cap_net_decide(p, addr, port, name, &v);
	if (v.allow != allow || strcmp(v.rule, rule))
		fail_msg("decide(%08x:%u, %s): got %s \"%s\", want %s \"%s\"", addr, port,
			 name ? name : "NULL", v.allow ? "allow" : "refuse", v.rule,
			 allow ? "allow" : "refuse", rule);
}

static void test_addr_parse(void **state)
{
	static const struct {
		const char *s;
		bool ok;
		uint32_t addr;
	} cases[] = {
		{ "0.0.0.0", true, 0 },
		{ "255.255.255.255", true, 0xffffffffu },
		{ "203.0.113.10", true, A(203, 0, 113, 10) },
		{ "10.0.2.2", true, CAP_NET_GATEWAY },
		{ "1.2.3", false, 0 },
		{ "1.2.3.4.5", false, 0 },
		{ "01.2.3.4", false, 0 },
		{ "1.2.3.04", false, 0 },
		{ "256.1.1.1", false, 0 },
		{ "1.2.3.1000", false, 0 },
		{ "1..3.4", false, 0 },
		{ ".1.2.3", false, 0 },
		{ "1.2.3.4.", false, 0 },
		{ "0x7f.0.0.1", false, 0 },
		{ "2130706433", false, 0 },
		{ " 1.2.3.4", false, 0 },
		{ "1.2.3.4 ", false, 0 },
		{ "+1.2.3.4", false, 0 },
		{ "", false, 0 },
	};
	char buf[16];
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint32_t a = 0x12345678u;
		bool ok = cap_net_addr_parse(cases[i].s, &a);
		if (ok != cases[i].ok)
			fail_msg("cap_net_addr_parse(\"%s\") = %d", cases[i].s, ok);
		assert_int_equal(a, ok ? cases[i].addr : 0x12345678u);
		if (ok)
			assert_string_equal(cap_net_addr_str(a, buf), cases[i].s);
	}
	uint32_t x;
	assert_false(cap_net_addr_parse(NULL, &x));
	assert_string_equal(cap_net_addr_str(0xffffffffu, buf), "255.255.255.255");
	assert_string_equal(cap_net_addr_str(CAP_NET_GUEST_ADDR, buf), "10.0.2.15");
	assert_string_equal(cap_net_addr_str(CAP_NET_DNS, buf), "10.0.2.3");
}

static void test_classify_edges(void **state)
{
	static const struct {
		uint32_t addr;
		enum cap_net_group g;
	} cases[] = {
		{ A(0, 0, 0, 0), CAP_NET_RESERVED },
		{ A(0, 255, 255, 255), CAP_NET_RESERVED },
		{ A(1, 0, 0, 0), CAP_NET_PUBLIC },
		{ A(9, 255, 255, 255), CAP_NET_PUBLIC },
		{ A(10, 0, 0, 0), CAP_NET_LAN },
		{ A(10, 255, 255, 255), CAP_NET_LAN },
		{ A(11, 0, 0, 0), CAP_NET_PUBLIC },
		{ A(100, 63, 255, 255), CAP_NET_PUBLIC },
		{ A(100, 64, 0, 0), CAP_NET_LAN },
		{ A(100, 127, 255, 255), CAP_NET_LAN },
		{ A(100, 128, 0, 0), CAP_NET_PUBLIC },
		{ A(126, 255, 255, 255), CAP_NET_PUBLIC },
		{ A(127, 0, 0, 0), CAP_NET_HOST },
		{ A(127, 0, 0, 1), CAP_NET_HOST },
		{ A(127, 255, 255, 255), CAP_NET_HOST },
		{ A(128, 0, 0, 0), CAP_NET_PUBLIC },
		{ A(169, 253, 255, 255), CAP_NET_PUBLIC },
		{ A(169, 254, 0, 0), CAP_NET_LINKLOCAL },
		{ A(169, 254, 169, 254), CAP_NET_LINKLOCAL },
		{ A(169, 254, 255, 255), CAP_NET_LINKLOCAL },
		{ A(169, 255, 0, 0), CAP_NET_PUBLIC },
		{ A(172, 15, 255, 255), CAP_NET_PUBLIC },
		{ A(172, 16, 0, 0), CAP_NET_LAN },
		{ A(172, 31, 255, 255), CAP_NET_LAN },
		{ A(172, 32, 0, 0), CAP_NET_PUBLIC },
		{ A(192, 0, 2, 1), CAP_NET_PUBLIC },
		{ A(198, 51, 100, 7), CAP_NET_PUBLIC },
		{ A(203, 0, 113, 10), CAP_NET_PUBLIC },
		{ A(192, 167, 255, 255), CAP_NET_PUBLIC },
		{ A(192, 168, 0, 0), CAP_NET_LAN },
		{ A(192, 168, 255, 255), CAP_NET_LAN },
		{ A(192, 169, 0, 0), CAP_NET_PUBLIC },
		{ A(223, 255, 255, 255), CAP_NET_PUBLIC },
		{ A(224, 0, 0, 0), CAP_NET_RESERVED },
		{ A(224, 0, 0, 1), CAP_NET_RESERVED },
		{ A(239, 255, 255, 255), CAP_NET_RESERVED },
		{ A(240, 0, 0, 0), CAP_NET_RESERVED },
		{ A(255, 255, 255, 255), CAP_NET_RESERVED },
	};
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		char buf[16];
		enum cap_net_group g = cap_net_classify(cases[i].addr);
		if (g != cases[i].g)
			fail_msg("%s: %s, want %s", cap_net_addr_str(cases[i].addr, buf),
				 cap_net_group_name(g), cap_net_group_name(cases[i].g));
	}
	assert_string_equal(cap_net_group_name(CAP_NET_PUBLIC), "public");
	assert_string_equal(cap_net_group_name(CAP_NET_LAN), "lan");
	assert_string_equal(cap_net_group_name(CAP_NET_HOST), "host");
	assert_string_equal(cap_net_group_name(CAP_NET_LINKLOCAL), "link-local");
	assert_string_equal(cap_net_group_name(CAP_NET_RESERVED), "reserved");
	assert_string_equal(cap_net_group_name((enum cap_net_group)99), "unknown");
}

static void test_rule_accept(void **state)
{
	static const struct {
		const char *text;
		enum cap_net_rule_kind kind;
		uint32_t addr;
		unsigned prefix;
		const char *name;
		uint16_t port;
	} cases[] = {
		{ "203.0.113.10", CAP_NET_RULE_CIDR, A(203, 0, 113, 10), 32, "", 0 },
		{ "203.0.113.10:443", CAP_NET_RULE_CIDR, A(203, 0, 113, 10), 32, "", 443 },
		{ "10.0.0.0/8", CAP_NET_RULE_CIDR, A(10, 0, 0, 0), 8, "", 0 },
		{ "203.0.113.0/24:443", CAP_NET_RULE_CIDR, A(203, 0, 113, 0), 24, "", 443 },
		{ "0.0.0.0/0", CAP_NET_RULE_CIDR, 0, 0, "", 0 },
		{ "0.0.0.0/0:22", CAP_NET_RULE_CIDR, 0, 0, "", 22 },
		{ "198.51.100.6/31", CAP_NET_RULE_CIDR, A(198, 51, 100, 6), 31, "", 0 },
		{ "198.51.100.7/32", CAP_NET_RULE_CIDR, A(198, 51, 100, 7), 32, "", 0 },
		{ "169.254.169.254", CAP_NET_RULE_CIDR, A(169, 254, 169, 254), 32, "", 0 },
		{ "169.254.169.254:80", CAP_NET_RULE_CIDR, A(169, 254, 169, 254), 32, "", 80 },
		{ "126.0.0.0/7", CAP_NET_RULE_CIDR, A(126, 0, 0, 0), 7, "", 0 },
		{ "1.2.3.4:1", CAP_NET_RULE_CIDR, A(1, 2, 3, 4), 32, "", 1 },
		{ "1.2.3.4:65535", CAP_NET_RULE_CIDR, A(1, 2, 3, 4), 32, "", 65535 },
		{ "example.com", CAP_NET_RULE_HOST, 0, 0, "example.com", 0 },
		{ "Example.COM.", CAP_NET_RULE_HOST, 0, 0, "example.com", 0 },
		{ "api.example.com:443", CAP_NET_RULE_HOST, 0, 0, "api.example.com", 443 },
		{ "localhost", CAP_NET_RULE_HOST, 0, 0, "localhost", 0 },
		{ "_srv.my-host.example", CAP_NET_RULE_HOST, 0, 0, "_srv.my-host.example", 0 },
		{ "xn--bcher-kva.example", CAP_NET_RULE_HOST, 0, 0, "xn--bcher-kva.example", 0 },
		{ "a1.2.3.4", CAP_NET_RULE_HOST, 0, 0, "a1.2.3.4", 0 },
		{ "*.example.com", CAP_NET_RULE_DOMAIN, 0, 0, "example.com", 0 },
		{ "*.Example.Com.:8443", CAP_NET_RULE_DOMAIN, 0, 0, "example.com", 8443 },
		{ "*.co.uk", CAP_NET_RULE_DOMAIN, 0, 0, "co.uk", 0 },
	};
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct cap_net_policy *p = new_policy();
		struct cap_err err = { 0 };
		int rc = cap_net_rule_add(p, cases[i].text, &err);
		if (rc != 0)
			fail_msg("\"%s\" refused: %s", cases[i].text, err.msg);
		assert_true(p->enabled);
		assert_int_equal(p->nrules, 1);
		const struct cap_net_rule *r = &p->rules[0];
		assert_int_equal(r->kind, cases[i].kind);
		assert_int_equal(r->addr, cases[i].addr);
		assert_int_equal(r->prefix, cases[i].prefix);
		assert_string_equal(r->name, cases[i].name);
		assert_int_equal(r->port, cases[i].port);
		assert_string_equal(r->text, cases[i].text);
		assert_int_equal(err.code, 0);
		free(p);
	}
}

static void test_rule_refuse(void **state)
{
	static const struct {
		const char *text;
		const char *why;
	} cases[] = {
		{ "", "needs a RULE" },
		{ "1.2.3", "not an IPv4 address" },
		{ "01.2.3.4", "not an IPv4 address" },
		{ "1.2.3.4.5", "not an IPv4 address" },
		{ "256.0.0.1", "not an IPv4 address" },
		{ "1.2.3.4/33", "prefix length" },
		{ "1.2.3.4/", "prefix length" },
		{ "1.2.3.4/08", "prefix length" },
		{ "1.2.3.4/a", "prefix length" },
		{ "example.com/8", "not an IPv4 address" },
		{ "10.1.2.3/8", "host bits are set; write the network address 10.0.0.0/8" },
		{ "203.0.113.10/24", "write the network address 203.0.113.0/24" },
		{ "198.51.100.7/31", "write the network address 198.51.100.6/31" },
		{ "1.0.0.0/0", "write the network address 0.0.0.0/0" },
		{ "host:0", "port must be a number from 1 to 65535" },
		{ "host:65536", "port must be a number from 1 to 65535" },
		{ "host:", "port must be a number" },
		{ "host:08", "port must be a number" },
		{ "host:http", "port must be a number" },
		{ ":443", "no address or name before the port" },
		{ "a..b", "empty label" },
		{ ".example.com", "empty label" },
		{ "example.com..", "empty label" },
		{ ".", "empty label" },
		{ "-a.com", "cannot begin or end with '-'" },
		{ "a-.com", "cannot begin or end with '-'" },
		{ "a.-b.com", "cannot begin or end with '-'" },
		{ "exa$mple.com", "letters, digits" },
		{ "exa/mple.com", "not an IPv4 address" },
		{ "*", "use --allow-public" },
		{ "*:443", "use --allow-public" },
		{ "*.com", "too broad" },
		{ "*.com.", "too broad" },
		{ "*.", "'*' may only be the whole first label" },
		{ "*example.com", "'*' may only be the whole first label" },
		{ "a.*.example.com", "'*' may only be the whole first label" },
		{ "*.*.example.com", "'*' may only be the whole first label" },
		{ "*.10.0.0", "needs a DNS name" },
		{ "*.-a.com", "cannot begin or end with '-'" },
		{ "example .com", "whitespace or a control character" },
		{ " example.com", "whitespace or a control character" },
		{ "example.com\t", "whitespace or a control character" },
		{ "example.com\r\n", "whitespace or a control character" },
		{ "exam\x7fple.com", "whitespace or a control character" },
		{ "b\xc3\xbc" "cher.example", "punycode" },
		{ "::1", "IPv6 is not supported" },
		{ "[::1]:443", "IPv6 is not supported" },
		{ "a:1:2", "IPv6 is not supported" },
		{ "127.0.0.1", "--allow-host opens it" },
		{ "127.0.0.0/8", "--allow-host opens it" },
		{ "224.0.0.1", "never reachable" },
		{ "240.0.0.0/4", "never reachable" },
		{ "255.255.255.255", "never reachable" },
		{ "0.0.0.0", "never reachable" },
		{ "0.0.0.0/8", "never reachable" },
		{ "host.capsule.internal", "--allow-host" },
		{ "Host.Capsule.Internal.:80", "--allow-host" },
	};
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct cap_net_policy *p = new_policy();
		struct cap_err err = { 0 };
		int rc = cap_net_rule_add(p, cases[i].text, &err);
		if (rc != -EINVAL)
			fail_msg("\"%s\": rc %d, want -EINVAL", cases[i].text, rc);
		assert_int_equal(err.code, EINVAL);
		if (!strstr(err.msg, cases[i].why))
			fail_msg("\"%s\": message \"%s\" lacks \"%s\"", cases[i].text, err.msg,
				 cases[i].why);
		/* The rule is named, quoted (non-printables escaped), and the
		 * message itself holds no control character. */
		if (cases[i].text[0] && !strchr(cases[i].text, '\x7f') &&
		    !strpbrk(cases[i].text, "\t\r\n\xc3")) {
			char q[400];
			snprintf(q, sizeof(q), "--allow-egress \"%s\"", cases[i].text);
			if (!strstr(err.msg, q))
				fail_msg("\"%s\": message \"%s\" does not name it", cases[i].text,
					 err.msg);
		}
		for (const char *c = err.msg; *c; c++)
			assert_true((unsigned char)*c >= 0x20 && (unsigned char)*c < 0x7f);
		assert_false(p->enabled);
		assert_int_equal(p->nrules, 0);
		free(p);
	}

	/* Escaped, not echoed raw: a log line cannot be split by a rule. */
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };
	assert_int_equal(cap_net_rule_add(p, "a\r\nb", &err), -EINVAL);
	assert_non_null(strstr(err.msg, "\"a\\x0d\\x0ab\""));
	assert_int_equal(cap_net_rule_add(p, NULL, &err), -EINVAL);
	assert_int_equal(cap_net_rule_add(p, NULL, NULL), -EINVAL);

	/* Length: the longest valid name is accepted, one more byte is not. */
	char name[300];
	memset(name, 0, sizeof(name));
	for (size_t i = 0; i < 253; i++)
		name[i] = (i % 64 == 63) ? '.' : 'a';
	assert_int_equal(cap_net_rule_add(p, name, &err), 0);
	name[253] = '.';
	assert_int_equal(cap_net_rule_add(p, name, &err), 0);
	name[253] = 'a';
	assert_int_equal(cap_net_rule_add(p, name, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "longer than 253"));
	memset(name, 'a', 64);
	name[64] = '\0';
	assert_int_equal(cap_net_rule_add(p, name, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "longer than 63"));
	char huge[sizeof(p->rules[0].text) + 1];
	memset(huge, 'a', sizeof(huge) - 1);
	huge[sizeof(huge) - 1] = '\0';
	assert_int_equal(cap_net_rule_add(p, huge, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "too long"));
	assert_int_equal(p->nrules, 2);
	free(p);
}

static void test_rule_limit(void **state)
{
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };
	char text[32];
	(void)state;

	for (unsigned i = 0; i < CAP_NET_MAX_RULES; i++) {
		snprintf(text, sizeof(text), "203.0.%u.%u", i / 256, i % 256);
		assert_int_equal(cap_net_rule_add(p, text, &err), 0);
	}
	assert_int_equal(cap_net_rule_add(p, "198.51.100.7", &err), -E2BIG);
	assert_int_equal(err.code, E2BIG);
	assert_non_null(strstr(err.msg, "rules"));
	assert_int_equal(p->nrules, CAP_NET_MAX_RULES);
	free(p);
}

static void test_valid_name(void **state)
{
	static const struct {
		const char *s;
		bool ok;
	} cases[] = {
		{ "example.com", true },
		{ "EXAMPLE.com", true },
		{ "example.com.", true },
		{ "a", true },
		{ "_dmarc.example", true },
		{ "-leading.example", true },
		{ "", false },
		{ ".", false },
		{ "..", false },
		{ "a..b", false },
		{ ".a", false },
		{ "a.b..", false },
		{ "a b", false },
		{ "a\rb", false },
		{ "a\nb", false },
		{ "a\tb", false },
		{ "a:80", false },
		{ "a/b", false },
		{ "a*b", false },
		{ "b\xc3\xbc" "cher", false },
	};
	char name[300];
	(void)state;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		if (cap_net_valid_name(cases[i].s, strlen(cases[i].s)) != cases[i].ok)
			fail_msg("cap_net_valid_name(\"%s\") != %d", cases[i].s, cases[i].ok);
	assert_false(cap_net_valid_name(NULL, 0));
	/* The length counts, not a NUL: an embedded NUL is refused. */
	assert_false(cap_net_valid_name("a\0b", 3));
	assert_true(cap_net_valid_name("example.com/evil", 11));

	memset(name, 'a', 63);
	assert_true(cap_net_valid_name(name, 63));
	memset(name, 'a', 64);
	assert_false(cap_net_valid_name(name, 64));
	for (size_t i = 0; i < sizeof(name); i++)
		name[i] = (i % 64 == 63) ? '.' : 'a';
	assert_true(cap_net_valid_name(name, 253));
	name[253] = '.';
	assert_true(cap_net_valid_name(name, 254));
	assert_false(cap_net_valid_name(name, 254 + 1));
	name[253] = 'a';
	assert_false(cap_net_valid_name(name, 254));
}

static void test_publish(void **state)
{
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };
	(void)state;

	assert_int_equal(cap_net_publish_add(p, "8080:80", &err), 0);
	assert_true(p->enabled);
	assert_int_equal(p->publish[0].bind, A(127, 0, 0, 1));
	assert_int_equal(p->publish[0].host_port, 8080);
	assert_int_equal(p->publish[0].guest_port, 80);
	assert_int_equal(cap_net_publish_add(p, "0.0.0.0:9090:90", &err), 0);
	assert_int_equal(p->publish[1].bind, 0);
	assert_int_equal(cap_net_publish_add(p, "192.168.1.5:65535:1", &err), 0);
	assert_int_equal(p->publish[2].bind, A(192, 168, 1, 5));
	assert_int_equal(p->publish[2].host_port, 65535);
	assert_int_equal(p->publish[2].guest_port, 1);
	/* The same guest port may be published twice on different host ports. */
	assert_int_equal(cap_net_publish_add(p, "8081:80", &err), 0);
	/* The same host port on another specific address is another socket. */
	assert_int_equal(cap_net_publish_add(p, "192.168.1.5:8080:81", &err), 0);
	assert_int_equal(p->npublish, 5);

	static const struct {
		const char *text;
		const char *why;
	} bad[] = {
		{ "", "needs a value" },
		{ "80", "[BIND:]HOST_PORT:GUEST_PORT" },
		{ "a:b", "ports are numbers" },
		{ "0:80", "ports are numbers" },
		{ "8080:0", "ports are numbers" },
		{ "65536:80", "ports are numbers" },
		{ "8080:", "ports are numbers" },
		{ ":80", "ports are numbers" },
		{ "080:80", "ports are numbers" },
		{ "localhost:8080:80", "BIND must be an IPv4 address" },
		{ "1.2.3:8080:80", "BIND must be an IPv4 address" },
		{ "::1:8080:80", "IPv6 is not supported" },
		{ "1:2:3:4", "IPv6 is not supported" },
		{ "8080 :80", "whitespace" },
		{ "8080:80\n", "whitespace" },
		{ "127.0.0.1:8080:80", "already published" },
		{ "8080:81", "127.0.0.1:8080 is already published (to guest port 80)" },
		{ "0.0.0.0:8080:81", "already published" },
		{ "10.0.0.1:9090:81", "0.0.0.0:9090 is already published" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		int rc = cap_net_publish_add(p, bad[i].text, &err);
		if (rc != -EINVAL || !strstr(err.msg, bad[i].why))
			fail_msg("--publish \"%s\": rc %d \"%s\", want \"%s\"", bad[i].text, rc,
				 err.msg, bad[i].why);
		if (bad[i].text[0] && !strpbrk(bad[i].text, "\n")) {
			char q[200];
			snprintf(q, sizeof(q), "--publish \"%s\"", bad[i].text);
			assert_non_null(strstr(err.msg, q));
		}
		assert_int_equal(p->npublish, 5);
	}
	assert_int_equal(cap_net_publish_add(p, NULL, &err), -EINVAL);

	struct cap_net_policy *q = new_policy();
	char text[32];
	for (unsigned i = 0; i < CAP_NET_MAX_PUBLISH; i++) {
		snprintf(text, sizeof(text), "%u:80", 10000 + i);
		assert_int_equal(cap_net_publish_add(q, text, &err), 0);
	}
	assert_int_equal(cap_net_publish_add(q, "20000:80", &err), -E2BIG);
	assert_int_equal(q->npublish, CAP_NET_MAX_PUBLISH);
	free(q);
	free(p);
}

static void test_apply(void **state)
{
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };
	(void)state;

	assert_false(p->enabled);
	assert_int_equal(cap_net_policy_apply(p, "allow-lan", NULL, &err), 0);
	assert_true(p->enabled && p->allow_lan);
	assert_false(p->allow_public || p->allow_host || p->auto_publish);
	assert_int_equal(cap_net_policy_apply(p, "allow-public", NULL, &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "allow-host", NULL, &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "auto-publish", NULL, &err), 0);
	assert_true(p->allow_public && p->allow_host && p->auto_publish);
	assert_int_equal(cap_net_policy_apply(p, "allow-egress", "10.0.0.0/8", &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "allow-egress=*.example.com:443", NULL, &err), 0);
	assert_int_equal(p->nrules, 2);
	assert_int_equal(p->rules[1].kind, CAP_NET_RULE_DOMAIN);
	assert_int_equal(p->rules[1].port, 443);
	assert_int_equal(cap_net_policy_apply(p, "publish", "8080:80", &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "publish=0.0.0.0:9000:90", NULL, &err), 0);
	assert_int_equal(p->npublish, 2);

	/* Each flag alone gives a NIC. */
	const char *flags[][2] = {
		{ "allow-public", NULL }, { "allow-lan", NULL }, { "allow-host", NULL },
		{ "auto-publish", NULL }, { "allow-egress", "203.0.113.10" },
		{ "publish", "8080:80" },
	};
	for (size_t i = 0; i < sizeof(flags) / sizeof(flags[0]); i++) {
		struct cap_net_policy *q = new_policy();
		assert_int_equal(cap_net_policy_apply(q, flags[i][0], flags[i][1], &err), 0);
		assert_true(q->enabled);
		free(q);
	}

	struct cap_net_policy *q = new_policy();
	assert_int_equal(cap_net_policy_apply(q, "allow-all", NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "unknown network flag \"allow-all\""));
	assert_int_equal(cap_net_policy_apply(q, "--allow-public", NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "\"--allow-public\""));
	assert_int_equal(cap_net_policy_apply(q, "", NULL, &err), -EINVAL);
	assert_int_equal(cap_net_policy_apply(q, NULL, NULL, &err), -EINVAL);
	assert_int_equal(cap_net_policy_apply(q, "bogus\nflag", NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "\"bogus\\x0aflag\""));
	char longflag[100];
	memset(longflag, 'x', sizeof(longflag) - 1);
	longflag[sizeof(longflag) - 1] = '\0';
	assert_int_equal(cap_net_policy_apply(q, longflag, NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "unknown network flag"));
	assert_int_equal(cap_net_policy_apply(q, "allow-public", "yes", &err), -EINVAL);
	assert_non_null(strstr(err.msg, "--allow-public takes no value"));
	assert_int_equal(cap_net_policy_apply(q, "allow-lan=", NULL, &err), -EINVAL);
	assert_int_equal(cap_net_policy_apply(q, "allow-egress", NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "--allow-egress needs a RULE"));
	assert_int_equal(cap_net_policy_apply(q, "publish", NULL, &err), -EINVAL);
	assert_int_equal(cap_net_policy_apply(q, "allow-egress", "1.2.3", &err), -EINVAL);
	assert_non_null(strstr(err.msg, "\"1.2.3\""));
	assert_int_equal(cap_net_policy_apply(q, "publish=99999:1", NULL, &err), -EINVAL);
	assert_false(q->enabled);
	assert_false(q->allow_public || q->allow_lan);
	free(q);
	free(p);
}

static void test_cidr_edges(void **state)
{
	struct cap_net_policy *p;
	(void)state;

	p = policy_of((const char *[]){ "allow-egress=203.0.113.0/24", NULL });
	assert_false(allows(p, A(203, 0, 112, 255), 80, NULL));
	assert_true(allows(p, A(203, 0, 113, 0), 80, NULL));
	assert_true(allows(p, A(203, 0, 113, 255), 80, NULL));
	assert_false(allows(p, A(203, 0, 114, 0), 80, NULL));
	expect_verdict(p, A(203, 0, 113, 10), 80, NULL, true, "--allow-egress 203.0.113.0/24");
	free(p);

	p = policy_of((const char *[]){ "allow-egress=198.51.100.7", NULL });
	assert_false(allows(p, A(198, 51, 100, 6), 80, NULL));
	assert_true(allows(p, A(198, 51, 100, 7), 80, NULL));
	assert_true(allows(p, A(198, 51, 100, 7), 1, NULL));
	assert_true(allows(p, A(198, 51, 100, 7), 65535, NULL));
	assert_false(allows(p, A(198, 51, 100, 8), 80, NULL));
	free(p);

	p = policy_of((const char *[]){ "allow-egress=198.51.100.6/31", NULL });
	assert_false(allows(p, A(198, 51, 100, 5), 80, NULL));
	assert_true(allows(p, A(198, 51, 100, 6), 80, NULL));
	assert_true(allows(p, A(198, 51, 100, 7), 80, NULL));
	assert_false(allows(p, A(198, 51, 100, 8), 80, NULL));
	free(p);

	/* /0: public and LAN, never reserved, host or link-local. */
	p = policy_of((const char *[]){ "allow-egress=0.0.0.0/0", NULL });
	assert_true(allows(p, A(1, 0, 0, 0), 80, NULL));
	assert_true(allows(p, A(203, 0, 113, 10), 443, NULL));
	assert_true(allows(p, A(223, 255, 255, 255), 80, NULL));
	assert_true(allows(p, A(10, 1, 2, 3), 80, NULL));
	assert_true(allows(p, A(192, 168, 0, 1), 80, NULL));
	assert_false(allows(p, A(0, 0, 0, 0), 80, NULL));
	assert_false(allows(p, A(0, 255, 255, 255), 80, NULL));
	assert_false(allows(p, A(127, 0, 0, 1), 80, NULL));
	assert_false(allows(p, A(169, 254, 169, 254), 80, NULL));
	assert_false(allows(p, A(169, 254, 0, 0), 80, NULL));
	assert_false(allows(p, A(224, 0, 0, 1), 80, NULL));
	assert_false(allows(p, A(255, 255, 255, 255), 80, NULL));
	expect_verdict(p, A(169, 254, 169, 254), 80, NULL, false,
		       "169.254.169.254 is link-local/cloud metadata: denied unless named "
		       "exactly by --allow-egress");
	expect_verdict(p, A(127, 0, 0, 1), 8080, NULL, false,
		       "the host (gateway) is closed: --allow-host opens the host's loopback "
		       "services");
	expect_verdict(p, A(10, 1, 2, 3), 80, NULL, true, "--allow-egress 0.0.0.0/0");
	free(p);

	/* A rule across the loopback range opens its neighbours only. */
	p = policy_of((const char *[]){ "allow-egress=126.0.0.0/7", NULL });
	assert_true(allows(p, A(126, 0, 0, 0), 80, NULL));
	assert_true(allows(p, A(126, 255, 255, 255), 80, NULL));
	assert_false(allows(p, A(127, 0, 0, 1), 80, NULL));
	assert_false(allows(p, A(128, 0, 0, 0), 80, NULL));
	free(p);
}

static void test_groups(void **state)
{
	static const struct {
		uint32_t addr;
		enum cap_net_group g;
	} edges[] = {
		{ A(9, 255, 255, 255), CAP_NET_PUBLIC },
		{ A(10, 0, 0, 0), CAP_NET_LAN },
		{ A(10, 255, 255, 255), CAP_NET_LAN },
		{ A(11, 0, 0, 0), CAP_NET_PUBLIC },
		{ A(172, 15, 255, 255), CAP_NET_PUBLIC },
		{ A(172, 16, 0, 0), CAP_NET_LAN },
		{ A(172, 31, 255, 255), CAP_NET_LAN },
		{ A(172, 32, 0, 0), CAP_NET_PUBLIC },
		{ A(100, 63, 255, 255), CAP_NET_PUBLIC },
		{ A(100, 64, 0, 0), CAP_NET_LAN },
		{ A(100, 127, 255, 255), CAP_NET_LAN },
		{ A(100, 128, 0, 0), CAP_NET_PUBLIC },
		{ A(192, 168, 0, 0), CAP_NET_LAN },
		{ A(192, 169, 0, 0), CAP_NET_PUBLIC },
		{ A(169, 254, 169, 254), CAP_NET_LINKLOCAL },
		{ A(127, 0, 0, 1), CAP_NET_HOST },
		{ A(127, 255, 255, 255), CAP_NET_HOST },
		{ A(224, 0, 0, 1), CAP_NET_RESERVED },
		{ A(255, 255, 255, 255), CAP_NET_RESERVED },
		{ A(0, 0, 0, 0), CAP_NET_RESERVED },
	};
	struct cap_net_policy *pub = policy_of((const char *[]){ "allow-public", NULL });
	struct cap_net_policy *lan = policy_of((const char *[]){ "allow-lan", NULL });
	struct cap_net_policy *host = policy_of((const char *[]){ "allow-host", NULL });
	struct cap_net_policy *all = policy_of(
		(const char *[]){ "allow-public", "allow-lan", "allow-host", NULL });
	struct cap_net_policy *none = policy_of((const char *[]){ "publish=8080:80", NULL });
	(void)state;

	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		uint32_t a = edges[i].addr;
		enum cap_net_group g = edges[i].g;
		assert_int_equal(cap_net_classify(a), g);
		for (uint16_t port = 1; port; port = port == 1 ? 443 : port == 443 ? 65535 : 0) {
			assert_int_equal(allows(pub, a, port, NULL), g == CAP_NET_PUBLIC);
			assert_int_equal(allows(lan, a, port, NULL), g == CAP_NET_LAN);
			assert_int_equal(allows(host, a, port, NULL), g == CAP_NET_HOST);
			assert_int_equal(allows(all, a, port, NULL),
					 g == CAP_NET_PUBLIC || g == CAP_NET_LAN || g == CAP_NET_HOST);
			assert_false(allows(none, a, port, NULL));
		}
	}
	expect_verdict(pub, A(203, 0, 113, 10), 80, NULL, true, "--allow-public");
	expect_verdict(lan, A(10, 0, 0, 0), 80, NULL, true, "--allow-lan");
	expect_verdict(host, A(127, 0, 0, 1), 8080, NULL, true, "--allow-host");
	expect_verdict(pub, A(10, 1, 2, 3), 80, NULL, false,
		       "10.1.2.3 is a LAN address: --allow-lan opens the private ranges");
	expect_verdict(all, A(224, 0, 0, 1), 80, NULL, false,
		       "224.0.0.1 is reserved/multicast: never reachable");
	expect_verdict(all, A(255, 255, 255, 255), 80, NULL, false,
		       "255.255.255.255 is reserved/multicast: never reachable");
	expect_verdict(none, A(198, 51, 100, 7), 80, NULL, false,
		       "no rule allows 198.51.100.7:80 (add --allow-egress 198.51.100.7 to open it)");
	free(pub);
	free(lan);
	free(host);
	free(all);
	free(none);
}

static void test_metadata(void **state)
{
	struct cap_net_policy *p;
	const uint32_t md = A(169, 254, 169, 254);
	(void)state;

	p = policy_of((const char *[]){ "allow-egress=0.0.0.0/0", "allow-public", "allow-lan",
					"allow-host", "allow-egress=*.example.com", NULL });
	assert_false(allows(p, md, 80, NULL));
	assert_false(allows(p, md, 80, "metadata.example.com"));
	expect_verdict(p, md, 80, "metadata.example.com", false,
		       "metadata.example.com resolves to 169.254.169.254 (link-local), which "
		       "the policy does not open (DNS rebinding guard)");
	free(p);

	p = policy_of((const char *[]){ "allow-egress=169.254.169.254", NULL });
	expect_verdict(p, md, 80, NULL, true, "--allow-egress 169.254.169.254");
	assert_false(allows(p, A(169, 254, 169, 253), 80, NULL));
	assert_false(allows(p, A(169, 254, 169, 255), 80, NULL));
	free(p);

	p = policy_of((const char *[]){ "allow-egress=169.254.169.254:80", NULL });
	assert_true(allows(p, md, 80, NULL));
	assert_false(allows(p, md, 443, NULL));
	free(p);

	p = policy_of((const char *[]){ "allow-egress=169.254.0.0/16", NULL });
	assert_true(allows(p, md, 80, NULL));
	assert_true(allows(p, A(169, 254, 0, 0), 80, NULL));
	assert_true(allows(p, A(169, 254, 255, 255), 80, NULL));
	assert_false(allows(p, A(169, 255, 0, 0), 80, NULL));
	free(p);

	/* Wider than link-local: not "named exactly". */
	p = policy_of((const char *[]){ "allow-egress=169.254.0.0/15", NULL });
	assert_false(allows(p, md, 80, NULL));
	assert_true(allows(p, A(169, 255, 0, 1), 80, NULL));
	free(p);
	p = policy_of((const char *[]){ "allow-egress=128.0.0.0/1", NULL });
	assert_false(allows(p, md, 80, NULL));
	free(p);
}

static void test_ports(void **state)
{
	struct cap_net_policy *p = policy_of((const char *[]){
		"allow-egress=203.0.113.0/24:443", "allow-egress=10.0.0.0/8:22",
		"allow-egress=api.example.com:443", "allow-egress=*.cdn.example:8443",
		"allow-lan", NULL });
	(void)state;

	expect_verdict(p, A(203, 0, 113, 9), 443, NULL, true,
		       "--allow-egress 203.0.113.0/24:443");
	assert_false(allows(p, A(203, 0, 113, 9), 80, NULL));
	assert_false(allows(p, A(203, 0, 113, 9), 444, NULL));
	assert_false(allows(p, A(203, 0, 113, 9), 0, NULL));
	/* The group flag allows every port, after the port-limited rule. */
	expect_verdict(p, A(10, 1, 2, 3), 22, NULL, true, "--allow-egress 10.0.0.0/8:22");
	expect_verdict(p, A(10, 1, 2, 3), 80, NULL, true, "--allow-lan");
	expect_verdict(p, A(198, 51, 100, 7), 443, "api.example.com", true,
		       "--allow-egress api.example.com:443 (name api.example.com)");
	expect_verdict(p, A(198, 51, 100, 7), 80, "api.example.com", false,
		       "no rule allows 198.51.100.7:80 (name api.example.com): --allow-egress "
		       "api.example.com:443 opens port 443 only");
	assert_true(allows(p, A(198, 51, 100, 7), 8443, "x.cdn.example"));
	assert_false(allows(p, A(198, 51, 100, 7), 443, "x.cdn.example"));
	free(p);
}

static void test_names(void **state)
{
	struct cap_net_policy *p = policy_of(
		(const char *[]){ "allow-egress=Example.COM", "allow-egress=*.Example.ORG.", NULL });
	const uint32_t a = A(198, 51, 100, 7);
	(void)state;

	assert_true(allows(p, a, 80, "example.com"));
	assert_true(allows(p, a, 80, "EXAMPLE.com"));
	assert_true(allows(p, a, 80, "example.com."));
	expect_verdict(p, a, 80, "EXAMPLE.com.", true,
		       "--allow-egress Example.COM (name example.com)");
	assert_false(allows(p, a, 80, "www.example.com"));
	assert_false(allows(p, a, 80, "example.com.evil"));
	assert_false(allows(p, a, 80, "xexample.com"));
	assert_false(allows(p, a, 80, "example.co"));
	assert_false(allows(p, a, 80, NULL));
	assert_false(allows(p, a, 80, ""));

	assert_true(allows(p, a, 80, "a.example.org"));
	assert_true(allows(p, a, 80, "a.b.example.org"));
	assert_true(allows(p, a, 80, "A.B.Example.Org."));
	expect_verdict(p, a, 443, "a.example.org", true,
		       "--allow-egress *.Example.ORG. (name a.example.org)");
	assert_false(allows(p, a, 80, "example.org"));
	assert_false(allows(p, a, 80, "example.org."));
	assert_false(allows(p, a, 80, "badexample.org"));
	assert_false(allows(p, a, 80, ".example.org"));
	assert_false(allows(p, a, 80, "a..example.org"));
	/* A name with control characters matches nothing and is not echoed. */
	struct cap_net_verdict v;
	cap_net_decide(p, a, 80, "a\r\n.example.org", &v);
	assert_false(v.allow);
	assert_null(strchr(v.rule, '\r'));
	assert_string_equal(v.rule,
			    "no rule allows 198.51.100.7:80 (add --allow-egress 198.51.100.7 to open it)");
	expect_verdict(p, a, 80, "other.example", false,
		       "no rule allows 198.51.100.7:80 (name other.example; add --allow-egress "
		       "other.example or 198.51.100.7 to open it)");
	/* A name rule does not open reserved addresses either. */
	expect_verdict(p, A(224, 0, 0, 1), 80, "example.com", false,
		       "224.0.0.1 is reserved/multicast: never reachable");

	/* A longest name and rule text fit the verdict, cut but terminated. */
	char name[260];
	for (size_t i = 0; i < 253; i++)
		name[i] = (i % 64 == 63 || i == 1) ? '.' : 'a';
	name[253] = '\0';
	struct cap_net_policy *q = new_policy();
	char rule[300];
	snprintf(rule, sizeof(rule), "*.%s:65535", name + 2);
	assert_int_equal(cap_net_rule_add(q, rule, NULL), 0);
	memset(&v, 0x55, sizeof(v));
	cap_net_decide(q, a, 65535, name, &v);
	assert_true(v.allow);
	assert_non_null(memchr(v.rule, '\0', sizeof(v.rule)));
	cap_net_decide(q, a, 1, name, &v);
	assert_false(v.allow);
	assert_non_null(memchr(v.rule, '\0', sizeof(v.rule)));
	free(q);
	free(p);
}

static void test_rebinding(void **state)
{
	struct cap_net_policy *p;
	(void)state;

	p = policy_of((const char *[]){ "allow-egress=*.example.com", NULL });
	assert_true(allows(p, A(203, 0, 113, 10), 80, "a.example.com"));
	expect_verdict(p, A(10, 1, 2, 3), 80, "a.example.com", false,
		       "a.example.com resolves to 10.1.2.3 (lan), which the policy does not "
		       "open (DNS rebinding guard)");
	expect_verdict(p, A(127, 0, 0, 1), 80, "a.example.com", false,
		       "a.example.com resolves to 127.0.0.1 (host), which the policy does not "
		       "open (DNS rebinding guard)");
	assert_false(allows(p, A(169, 254, 169, 254), 80, "a.example.com"));
	assert_false(allows(p, A(192, 168, 1, 1), 80, "a.example.com"));
	assert_false(allows(p, A(100, 64, 0, 1), 80, "a.example.com"));
	free(p);

	p = policy_of((const char *[]){ "allow-egress=*.example.com", "allow-lan", NULL });
	expect_verdict(p, A(10, 1, 2, 3), 80, "a.example.com", true, "--allow-lan");
	assert_false(allows(p, A(127, 0, 0, 1), 80, "a.example.com"));
	assert_false(allows(p, A(169, 254, 169, 254), 80, "a.example.com"));
	free(p);

	p = policy_of((const char *[]){ "allow-egress=intranet.example", "allow-host", NULL });
	assert_true(allows(p, A(127, 0, 0, 1), 80, "intranet.example"));
	assert_false(allows(p, A(10, 1, 2, 3), 80, "intranet.example"));
	free(p);
}

static void test_decide_name(void **state)
{
	struct cap_net_policy *p = policy_of((const char *[]){
		"allow-egress=203.0.113.10", "allow-egress=api.example.com:443",
		"allow-egress=*.pkg.example", "allow-lan", NULL });
	struct cap_net_verdict v;
	(void)state;

	cap_net_decide_name(p, "API.example.com.", &v);
	assert_true(v.allow);
	assert_string_equal(v.rule, "--allow-egress api.example.com:443");
	cap_net_decide_name(p, "a.b.pkg.example", &v);
	assert_true(v.allow);
	assert_string_equal(v.rule, "--allow-egress *.pkg.example");
	cap_net_decide_name(p, "pkg.example", &v);
	assert_false(v.allow);
	assert_string_equal(v.rule, "no rule names it (add --allow-egress pkg.example to open it)");
	cap_net_decide_name(p, "www.example.com", &v);
	assert_false(v.allow);
	cap_net_decide_name(p, "evil.example", &v);
	assert_false(v.allow);
	assert_non_null(strstr(v.rule, "no rule names it"));
	cap_net_decide_name(p, "a\nb", &v);
	assert_false(v.allow);
	assert_string_equal(v.rule, "not a valid DNS name");
	cap_net_decide_name(p, NULL, &v);
	assert_false(v.allow);
	cap_net_decide_name(p, "", &v);
	assert_false(v.allow);
	free(p);

	p = policy_of((const char *[]){ "allow-public", NULL });
	cap_net_decide_name(p, "anything.example", &v);
	assert_true(v.allow);
	assert_string_equal(v.rule, "--allow-public");
	cap_net_decide_name(p, "bad name", &v);
	assert_false(v.allow);
	free(p);
}

static void assert_same_policy(const struct cap_net_policy *a, const struct cap_net_policy *b)
{
	assert_int_equal(a->enabled, b->enabled);
	assert_int_equal(a->allow_public, b->allow_public);
	assert_int_equal(a->allow_lan, b->allow_lan);
	assert_int_equal(a->allow_host, b->allow_host);
	assert_int_equal(a->auto_publish, b->auto_publish);
	assert_int_equal(a->nrules, b->nrules);
	for (unsigned i = 0; i < a->nrules; i++) {
		assert_int_equal(a->rules[i].kind, b->rules[i].kind);
		assert_int_equal(a->rules[i].addr, b->rules[i].addr);
		assert_int_equal(a->rules[i].prefix, b->rules[i].prefix);
		assert_string_equal(a->rules[i].name, b->rules[i].name);
		assert_int_equal(a->rules[i].port, b->rules[i].port);
		assert_string_equal(a->rules[i].text, b->rules[i].text);
	}
	assert_int_equal(a->npublish, b->npublish);
	for (unsigned i = 0; i < a->npublish; i++) {
		assert_int_equal(a->publish[i].bind, b->publish[i].bind);
		assert_int_equal(a->publish[i].host_port, b->publish[i].host_port);
		assert_int_equal(a->publish[i].guest_port, b->publish[i].guest_port);
	}
	/* Both built from a zeroed policy the same way: byte-identical too. */
	assert_memory_equal(a, b, sizeof(*a));
}

static void round_trip(const struct cap_net_policy *p, const char *describe)
{
	char **w;
	size_t n;
	struct cap_net_policy *q = new_policy();
	struct cap_err err = { 0 };

	cap_net_policy_words(p, &w, &n);
	assert_non_null(w);
	for (size_t i = 0; i < n; i++) {
		if (cap_net_policy_apply(q, w[i], NULL, &err) < 0)
			fail_msg("word \"%s\": %s", w[i], err.msg);
		free(w[i]);
	}
	free(w);
	assert_same_policy(p, q);

	char *d = cap_net_policy_describe(p);
	assert_string_equal(d, describe);
	/* The line reads back too: "--flag [value]" pairs split on spaces. */
	struct cap_net_policy *r = new_policy();
	if (p->enabled) {
		char *save = NULL, *prev = NULL;
		for (char *t = strtok_r(d, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
			if (!strncmp(t, "--", 2)) {
				if (prev)
					assert_int_equal(cap_net_policy_apply(r, prev, NULL, &err), 0);
				prev = t + 2;
				continue;
			}
			assert_non_null(prev);
			assert_int_equal(cap_net_policy_apply(r, prev, t, &err), 0);
			prev = NULL;
		}
		if (prev)
			assert_int_equal(cap_net_policy_apply(r, prev, NULL, &err), 0);
		assert_same_policy(p, r);
	}
	free(r);
	free(d);
	free(q);
}

static void test_words(void **state)
{
	struct cap_net_policy *p = new_policy();
	(void)state;

	round_trip(p, "none (no network interface)");
	char **w;
	size_t n = 99;
	cap_net_policy_words(p, &w, &n);
	assert_int_equal(n, 0);
	assert_non_null(w);
	free(w);
	free(p);

	p = policy_of((const char *[]){ "allow-public", "allow-egress=10.0.0.0/8",
					"publish=8080:80", NULL });
	round_trip(p, "--allow-public --allow-egress 10.0.0.0/8 --publish 127.0.0.1:8080:80");
	cap_net_policy_words(p, &w, &n);
	assert_int_equal(n, 3);
	assert_string_equal(w[0], "allow-public");
	assert_string_equal(w[1], "allow-egress=10.0.0.0/8");
	assert_string_equal(w[2], "publish=127.0.0.1:8080:80");
	for (size_t i = 0; i < n; i++)
		free(w[i]);
	free(w);
	free(p);

	p = policy_of((const char *[]){
		"auto-publish", "allow-host", "allow-lan", "allow-egress=*.Example.com.:443",
		"allow-egress=api.example.net", "allow-egress=169.254.169.254:80",
		"allow-egress=0.0.0.0/0", "publish=0.0.0.0:9000:90",
		"publish=192.168.1.5:65535:1", NULL });
	round_trip(p, "--allow-lan --allow-host --auto-publish --allow-egress *.Example.com.:443 "
		      "--allow-egress api.example.net --allow-egress 169.254.169.254:80 "
		      "--allow-egress 0.0.0.0/0 --publish 0.0.0.0:9000:90 "
		      "--publish 192.168.1.5:65535:1");
	free(p);

	p = policy_of((const char *[]){ "auto-publish", NULL });
	round_trip(p, "--auto-publish");
	free(p);

	/* A full policy. */
	p = new_policy();
	char text[64];
	for (unsigned i = 0; i < CAP_NET_MAX_RULES; i++) {
		if (i % 2)
			snprintf(text, sizeof(text), "h%u.example:%u", i, i + 1);
		else
			snprintf(text, sizeof(text), "203.0.%u.0/24", i);
		assert_int_equal(cap_net_rule_add(p, text, NULL), 0);
	}
	for (unsigned i = 0; i < CAP_NET_MAX_PUBLISH; i++) {
		snprintf(text, sizeof(text), "%u:%u", 10000 + i, i + 1);
		assert_int_equal(cap_net_publish_add(p, text, NULL), 0);
	}
	p->allow_public = true;
	char *d = cap_net_policy_describe(p);
	free(d);
	cap_net_policy_words(p, &w, &n);
	assert_int_equal(n, 1 + CAP_NET_MAX_RULES + CAP_NET_MAX_PUBLISH);
	struct cap_net_policy *q = new_policy();
	for (size_t i = 0; i < n; i++) {
		assert_int_equal(cap_net_policy_apply(q, w[i], NULL, NULL), 0);
		free(w[i]);
	}
	free(w);
	assert_same_policy(p, q);
	free(q);

	/* A NIC with nothing allowed cannot come from flags, but says so. */
	cap_net_policy_init(p);
	p->enabled = true;
	d = cap_net_policy_describe(p);
	assert_string_equal(d, "a network interface with nothing allowed");
	free(d);
	free(p);
}

/* --- cap_net_denied_ranges against cap_net_decide --- */

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;

static uint32_t rnd(void)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state >> 16);
}

static bool in_ranges(uint32_t (*r)[2], size_t n, uint32_t a)
{
	for (size_t i = 0; i < n; i++)
		if (a >= r[i][0] && a <= r[i][1])
			return true;
	return false;
}

/* Whether cap_net_decide refuses a for every port and every name tried. */
static bool refused_always(const struct cap_net_policy *p, uint32_t a)
{
	uint16_t ports[4 + CAP_NET_MAX_RULES] = { 1, 80, 443, 65535 };
	size_t nports = 4;
	char names[2 + CAP_NET_MAX_RULES][260];
	size_t nnames = 0;

	strcpy(names[nnames++], "nomatch.invalid");
	for (unsigned i = 0; i < p->nrules; i++) {
		const struct cap_net_rule *r = &p->rules[i];
		if (r->port)
			ports[nports++] = r->port;
		if (r->kind == CAP_NET_RULE_HOST)
			snprintf(names[nnames++], sizeof(names[0]), "%s", r->name);
		else if (r->kind == CAP_NET_RULE_DOMAIN)
			snprintf(names[nnames++], sizeof(names[0]), "x.%s", r->name);
	}
	for (size_t i = 0; i < nports; i++) {
		if (allows(p, a, ports[i], NULL))
			return false;
		for (size_t j = 0; j < nnames; j++)
			if (allows(p, a, ports[i], names[j]))
				return false;
	}
	return true;
}

static void check_ranges(const struct cap_net_policy *p, const uint32_t *extra, size_t nextra)
{
	static const uint32_t edges[] = {
		A(0, 0, 0, 0), A(1, 0, 0, 0), A(10, 0, 0, 0), A(11, 0, 0, 0),
		A(100, 64, 0, 0), A(100, 128, 0, 0), A(127, 0, 0, 0), A(128, 0, 0, 0),
		A(169, 254, 0, 0), A(169, 255, 0, 0), A(172, 16, 0, 0), A(172, 32, 0, 0),
		A(192, 168, 0, 0), A(192, 169, 0, 0), A(224, 0, 0, 0), A(240, 0, 0, 0),
		A(169, 254, 169, 254), A(127, 0, 0, 1), 0xffffffffu,
	};
	size_t max = 2 * p->nrules + 16;
	uint32_t(*r)[2] = calloc(max + 1, sizeof(*r));
	assert_non_null(r);
	r[max][0] = 0xdeadbeefu;
	size_t n = cap_net_denied_ranges(p, r, max);
	assert_in_range(n, 1, max);
	assert_int_equal(r[max][0], 0xdeadbeefu);
	for (size_t i = 0; i < n; i++) {
		assert_true(r[i][0] <= r[i][1]);
		/* Sorted, disjoint and merged (a gap between neighbours). */
		if (i > 0)
			assert_true((uint64_t)r[i - 1][1] + 1 < r[i][0]);
	}

	uint32_t probe[3];
#define CHECK(addr)                                                                    \
	do {                                                                           \
		uint32_t a_ = (addr);                                                  \
		bool d_ = in_ranges(r, n, a_), f_ = refused_always(p, a_);             \
		if (d_ != f_) {                                                        \
			char b_[16];                                                   \
			fail_msg("%s: denied range %d, decide refuses always %d",      \
				 cap_net_addr_str(a_, b_), d_, f_);                    \
		}                                                                      \
	} while (0)
	for (size_t i = 0; i < sizeof(edges) / sizeof(edges[0]); i++) {
		probe[0] = edges[i] - 1, probe[1] = edges[i], probe[2] = edges[i] + 1;
		for (size_t k = 0; k < 3; k++)
			CHECK(probe[k]);
	}
	for (unsigned i = 0; i < p->nrules; i++) {
		const struct cap_net_rule *rule = &p->rules[i];
		if (rule->kind != CAP_NET_RULE_CIDR)
			continue;
		uint32_t hi = rule->addr | (rule->prefix ? ~(0xffffffffu << (32 - rule->prefix)) : 0xffffffffu);
		uint32_t e[] = { rule->addr - 1, rule->addr, rule->addr + 1, hi - 1, hi, hi + 1 };
		for (size_t k = 0; k < 6; k++)
			CHECK(e[k]);
	}
	for (size_t i = 0; i < n; i++) {
		uint32_t e[] = { r[i][0] - 1, r[i][0], r[i][0] + 1, r[i][1] - 1, r[i][1], r[i][1] + 1 };
		for (size_t k = 0; k < 6; k++)
			CHECK(e[k]);
	}
	for (size_t i = 0; i < nextra; i++)
		CHECK(extra[i]);
	for (int i = 0; i < 300; i++)
		CHECK(rnd());
#undef CHECK
	free(r);
}

static void expect_ranges(const struct cap_net_policy *p, const char *want)
{
	uint32_t r[64][2];
	char got[2048] = "", b1[16], b2[16];
	size_t n = cap_net_denied_ranges(p, r, 64);

	for (size_t i = 0; i < n; i++) {
		size_t l = strlen(got);
		snprintf(got + l, sizeof(got) - l, "%s%s-%s", i ? " " : "",
			 cap_net_addr_str(r[i][0], b1), cap_net_addr_str(r[i][1], b2));
	}
	assert_string_equal(got, want);
}

static void test_denied_ranges(void **state)
{
	struct cap_net_policy *p;
	(void)state;

	p = new_policy();
	expect_ranges(p, "0.0.0.0-255.255.255.255");
	check_ranges(p, NULL, 0);
	free(p);

	p = policy_of((const char *[]){ "allow-public", NULL });
	expect_ranges(p, "0.0.0.0-0.255.255.255 10.0.0.0-10.255.255.255 "
			 "100.64.0.0-100.127.255.255 127.0.0.0-127.255.255.255 "
			 "169.254.0.0-169.254.255.255 172.16.0.0-172.31.255.255 "
			 "192.168.0.0-192.168.255.255 224.0.0.0-255.255.255.255");
	check_ranges(p, NULL, 0);
	free(p);

	p = policy_of((const char *[]){ "allow-lan", "allow-host", NULL });
	expect_ranges(p, "0.0.0.0-9.255.255.255 11.0.0.0-100.63.255.255 "
			 "100.128.0.0-126.255.255.255 128.0.0.0-172.15.255.255 "
			 "172.32.0.0-192.167.255.255 192.169.0.0-255.255.255.255");
	check_ranges(p, NULL, 0);
	free(p);

	p = policy_of((const char *[]){ "allow-egress=0.0.0.0/0", NULL });
	expect_ranges(p, "0.0.0.0-0.255.255.255 127.0.0.0-127.255.255.255 "
			 "169.254.0.0-169.254.255.255 224.0.0.0-255.255.255.255");
	check_ranges(p, NULL, 0);
	free(p);

	/* A port-limited rule still opens its range in the kernel set. */
	p = policy_of((const char *[]){ "allow-egress=203.0.113.0/24:443",
					"allow-egress=169.254.169.254", NULL });
	expect_ranges(p, "0.0.0.0-169.254.169.253 169.254.169.255-203.0.112.255 "
			 "203.0.114.0-255.255.255.255");
	check_ranges(p, NULL, 0);
	free(p);

	/* A name rule opens every public address (names are checked later). */
	p = policy_of((const char *[]){ "allow-egress=*.example.com", NULL });
	struct cap_net_policy *q = policy_of((const char *[]){ "allow-public", NULL });
	uint32_t r1[32][2], r2[32][2];
	size_t n1 = cap_net_denied_ranges(p, r1, 32), n2 = cap_net_denied_ranges(q, r2, 32);
	assert_int_equal(n1, n2);
	assert_memory_equal(r1, r2, n1 * sizeof(r1[0]));
	check_ranges(p, NULL, 0);
	free(q);
	free(p);

	/* max bounds what is written. */
	p = policy_of((const char *[]){ "allow-public", NULL });
	uint32_t r3[3][2];
	assert_int_equal(cap_net_denied_ranges(p, r3, 2), 2);
	assert_int_equal(cap_net_denied_ranges(p, r3, 0), 0);
	free(p);

	/* Random policies. */
	static const char *const fixed[] = {
		"0.0.0.0/0", "169.254.169.254", "169.254.0.0/16", "169.254.0.0/15",
		"10.0.0.0/8", "126.0.0.0/7", "128.0.0.0/1", "100.64.0.0/10", "172.16.0.0/11",
		"192.168.1.0/24:80", "203.0.113.10:443", "a.example.com:443", "*.example.org",
	};
	for (int iter = 0; iter < 200; iter++) {
		p = new_policy();
		uint32_t flags = rnd();
		p->allow_public = (flags & 7) == 0;
		p->allow_lan = (flags & 24) == 0;
		p->allow_host = (flags & 96) == 0;
		p->enabled = true;
		unsigned nrules = rnd() % 12;
		uint32_t extra[64];
		size_t nextra = 0;
		for (unsigned i = 0; i < nrules; i++) {
			char text[64], b[16];
			uint32_t k = rnd() % 4;
			if (k == 0) {
				snprintf(text, sizeof(text), "%s",
					 fixed[rnd() % (sizeof(fixed) / sizeof(fixed[0]))]);
			} else {
				uint32_t addr = rnd();
				unsigned prefix = k == 1 ? 32 : rnd() % 33;
				addr &= prefix ? 0xffffffffu << (32 - prefix) : 0;
				if (rnd() % 2)
					snprintf(text, sizeof(text), "%s/%u",
						 cap_net_addr_str(addr, b), prefix);
				else
					snprintf(text, sizeof(text), "%s/%u:%u",
						 cap_net_addr_str(addr, b), prefix, 1 + rnd() % 65535);
				if (nextra < 64)
					extra[nextra++] = addr;
			}
			/* Reserved- and loopback-only rules are refused: skip them. */
			cap_net_rule_add(p, text, NULL);
		}
		check_ranges(p, extra, nextra);
		free(p);
	}
}

/* --secret: what parses, what is refused and why, the round trip. */
static void test_secret_parse(void **state)
{
	(void)state;
	struct cap_net_policy *p = xcalloc(1, sizeof(*p));
	struct cap_err err;
	char text[1200];

	cap_net_policy_init(p);
	assert_int_equal(cap_net_secret_add(p, "TOKEN=env:GH_TOKEN@api.github.com,*.githubusercontent.com", &err), 0);
	assert_true(p->enabled);
	assert_int_equal(p->nsecrets, 1);
	assert_string_equal(p->secrets[0].name, "TOKEN");
	assert_string_equal(p->secrets[0].source, "env:GH_TOKEN");
	assert_int_equal(p->secrets[0].nhosts, 2);
	assert_int_equal(p->secrets[0].hosts[0].kind, CAP_NET_SECRET_HOST);
	assert_string_equal(p->secrets[0].hosts[0].name, "api.github.com");
	assert_int_equal(p->secrets[0].hosts[1].kind, CAP_NET_SECRET_DOMAIN);
	assert_string_equal(p->secrets[0].hosts[1].name, "githubusercontent.com");
	assert_false(p->secrets[0].body);
	cap_net_secret_text(&p->secrets[0], text, sizeof(text));
	assert_string_equal(text, "TOKEN=env:GH_TOKEN@api.github.com,*.githubusercontent.com");

	/* A file source, '@' in its path (the last '@' splits), :body, case folded. */
	assert_int_equal(cap_net_policy_apply(p, "secret", "K=file:/run/a@b/key@API.Test.:body", &err), 0);
	assert_string_equal(p->secrets[1].source, "file:/run/a@b/key");
	assert_string_equal(p->secrets[1].hosts[0].name, "api.test");
	assert_true(p->secrets[1].body);
	cap_net_secret_text(&p->secrets[1], text, sizeof(text));
	assert_string_equal(text, "K=file:/run/a@b/key@api.test:body");

	static const struct {
		const char *text;
		int e;
		const char *says;
	} bad[] = {
		{ "", EINVAL, "needs" },
		{ "TOKEN", EINVAL, "write it as" },
		{ "TOKEN=env:T", EINVAL, "write it as" },
		{ "1TOKEN=env:T@a.test", EINVAL, "NAME is the guest's environment variable" },
		{ "TO-KEN=env:T@a.test", EINVAL, "NAME is the guest's environment variable" },
		{ "HTTPS_PROXY=env:T@a.test", EINVAL, "set by capsule" },
		{ "SSL_CERT_FILE=env:T@a.test", EINVAL, "set by capsule" },
		{ "T=T@a.test", EINVAL, "env:VAR" },
		{ "T=env:@a.test", EINVAL, "env:VAR" },
		{ "T=env:A-B@a.test", EINVAL, "env:VAR names an environment variable" },
		{ "T=file:key@a.test", EINVAL, "absolute path" },
		{ "T=env:T@", EINVAL, "no host after '@'" },
		{ "T=env:T@:body", EINVAL, "no host after '@'" },
		{ "T=env:T@a.test:443", EINVAL, "takes no port" },
		{ "T=env:T@203.0.113.7", EINVAL, "not an address" },
		{ "T=env:T@a.test,,b.test", EINVAL, "empty host" },
		{ "T=env:T@a*.test", EINVAL, "'*' only as a whole first label" },
		{ "T=env:T@*", EINVAL, "" },
		{ "T=env:T@a..test", EINVAL, "empty label" },
		{ "T=env:T@a test", EINVAL, "whitespace" },
		{ "T=env:T@a.test\r\nX: y", EINVAL, "control character" },
		{ "T=env:T@h1.t,h2.t,h3.t,h4.t,h5.t,h6.t,h7.t,h8.t,h9.t", E2BIG, "more than 8 hosts" },
		{ "TOKEN=env:OTHER@b.test", EEXIST, "declared twice" },
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		struct cap_net_policy *before = xmalloc(sizeof(*before));
		*before = *p;
		memset(&err, 0, sizeof(err));
		int r = cap_net_secret_add(p, bad[i].text, &err);
		if (r != -bad[i].e || !strstr(err.msg, bad[i].says))
			fail_msg("secret %s: got %d \"%s\", want -%d with \"%s\"", bad[i].text, r,
				 err.msg, bad[i].e, bad[i].says);
		assert_memory_equal(before, p, sizeof(*p));
		free(before);
	}

	/* The limit. */
	for (unsigned i = p->nsecrets; i < CAP_NET_MAX_SECRETS; i++) {
		char t[64];
		snprintf(t, sizeof(t), "S%u=env:S@s%u.test", i, i);
		assert_int_equal(cap_net_secret_add(p, t, &err), 0);
	}
	assert_int_equal(cap_net_secret_add(p, "LAST=env:S@last.test", &err), -E2BIG);
	free(p);
}

/* The words and the line carry secrets; describe names them, never more. */
static void test_secret_words(void **state)
{
	(void)state;
	struct cap_net_policy *p = xcalloc(1, sizeof(*p)), *q = xcalloc(1, sizeof(*q));
	struct cap_err err;

	cap_net_policy_init(p);
	assert_int_equal(cap_net_policy_apply(p, "allow-egress=other.test:443", NULL, &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "secret=TOKEN=env:TOKEN@api.test", NULL, &err), 0);
	assert_int_equal(cap_net_policy_apply(p, "secret=B=file:/k@*.b.test:body", NULL, &err), 0);
	char *line = cap_net_policy_line(p);
	assert_string_equal(line, "allow-egress=other.test:443 secret=TOKEN=env:TOKEN@api.test "
				  "secret=B=file:/k@*.b.test:body");
	assert_int_equal(cap_net_policy_parse_line(q, line, &err), 0);
	assert_memory_equal(p, q, sizeof(*p));
	char *d = cap_net_policy_describe(p);
	assert_string_equal(d, "--allow-egress other.test:443 --secret TOKEN=env:TOKEN@api.test "
			       "--secret B=file:/k@*.b.test:body");
	free(d);
	free(line);

	/* Only secrets: a NIC, and the line alone gives it back. */
	cap_net_policy_init(p);
	assert_int_equal(cap_net_policy_apply(p, "secret", "T=env:T@api.test", &err), 0);
	line = cap_net_policy_line(p);
	assert_int_equal(cap_net_policy_parse_line(q, line, &err), 0);
	assert_true(q->enabled);
	assert_int_equal(q->nsecrets, 1);
	free(line);
	free(p);
	free(q);
}

/* A secret's hosts are open on 443 by name, for public addresses only;
 * DNS answers them; the kernel does not refuse public addresses. */
static void test_secret_decide(void **state)
{
	(void)state;
	struct cap_net_policy *p = xcalloc(1, sizeof(*p));
	struct cap_net_verdict v;
	struct cap_err err;
	uint32_t deny[64][2];

	cap_net_policy_init(p);
	assert_int_equal(cap_net_secret_add(p, "TOKEN=env:T@api.test,*.git.test", &err), 0);
	expect_verdict(p, A(203, 0, 113, 10), 443, "api.test", true, "--secret TOKEN (its host api.test)");
	expect_verdict(p, A(203, 0, 113, 10), 443, "API.TEST.", true, "--secret TOKEN (its host api.test)");
	expect_verdict(p, A(203, 0, 113, 11), 443, "x.git.test", true, "--secret TOKEN (its host x.git.test)");
	assert_false(allows(p, A(203, 0, 113, 11), 443, "git.test"));
	assert_false(allows(p, A(203, 0, 113, 10), 443, "other.test"));
	assert_false(allows(p, A(203, 0, 113, 10), 443, NULL));
	expect_verdict(p, A(203, 0, 113, 10), 80, "api.test", false,
		       "no rule allows 203.0.113.10:80 (name api.test): --secret TOKEN opens port 443 "
		       "only (add --allow-egress api.test:80 to open this one)");
	/* DNS rebinding: the name of a secret does not open a LAN or host address. */
	expect_verdict(p, A(10, 1, 2, 3), 443, "api.test", false,
		       "api.test resolves to 10.1.2.3 (lan), which the policy does not open "
		       "(DNS rebinding guard)");
	assert_false(allows(p, 0x7f000001u, 443, "api.test"));
	assert_false(allows(p, A(169, 254, 169, 254), 443, "api.test"));

	cap_net_decide_name(p, "api.test", &v);
	assert_true(v.allow);
	assert_string_equal(v.rule, "--secret TOKEN");
	cap_net_decide_name(p, "a.git.test", &v);
	assert_true(v.allow);
	cap_net_decide_name(p, "other.test", &v);
	assert_false(v.allow);

	/* The kernel refuses what no name could open: LAN, host, metadata;
	 * not the public ranges a secret's host may resolve to. */
	size_t n = cap_net_denied_ranges(p, deny, 64);
	bool public_denied = false, lan_denied = false;
	for (size_t i = 0; i < n; i++) {
		public_denied |= deny[i][0] <= A(203, 0, 113, 10) && A(203, 0, 113, 10) <= deny[i][1];
		lan_denied |= deny[i][0] <= A(10, 1, 2, 3) && A(10, 1, 2, 3) <= deny[i][1];
	}
	assert_false(public_denied);
	assert_true(lan_denied);

	/* Host matching as the policy process uses it. */
	assert_true(cap_net_secret_host_match(&p->secrets[0], "api.test"));
	assert_true(cap_net_secret_host_match(&p->secrets[0], "Api.Test."));
	assert_true(cap_net_secret_host_match(&p->secrets[0], "a.b.git.test"));
	assert_false(cap_net_secret_host_match(&p->secrets[0], "git.test"));
	assert_false(cap_net_secret_host_match(&p->secrets[0], "xapi.test"));
	assert_false(cap_net_secret_host_match(&p->secrets[0], "api.test.evil"));
	assert_false(cap_net_secret_host_match(&p->secrets[0], "api.test\r\n"));
	assert_false(cap_net_secret_host_match(&p->secrets[0], NULL));
	free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_addr_parse),
		cmocka_unit_test(test_classify_edges),
		cmocka_unit_test(test_rule_accept),
		cmocka_unit_test(test_rule_refuse),
		cmocka_unit_test(test_rule_limit),
		cmocka_unit_test(test_valid_name),
		cmocka_unit_test(test_publish),
		cmocka_unit_test(test_apply),
		cmocka_unit_test(test_cidr_edges),
		cmocka_unit_test(test_groups),
		cmocka_unit_test(test_metadata),
		cmocka_unit_test(test_ports),
		cmocka_unit_test(test_names),
		cmocka_unit_test(test_rebinding),
		cmocka_unit_test(test_decide_name),
		cmocka_unit_test(test_words),
		cmocka_unit_test(test_denied_ranges),
		cmocka_unit_test(test_secret_parse),
		cmocka_unit_test(test_secret_words),
		cmocka_unit_test(test_secret_decide),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
