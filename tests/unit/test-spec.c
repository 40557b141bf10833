/* Unit tests of the sandbox spec (src/sandbox/sandbox-spec.c): disks in
 * order with their serials, what SETUP says, the network part and the
 * shape a template key is derived from; and the record's network policy
 * (cap_record_set_net / cap_record_net in sandbox-named.c). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "ca.h"
#include "named.h"
#include "paths.h"
#include "policy.h"
#include "net-fixtures.h"
#include "sandbox-internal.h"
#include "sandbox.h"
#include "secret.h"
#include "tree.h"
#include "util.h"

static struct cap_sandbox_spec *new_spec(void)
{
	struct cap_sandbox_spec *s = malloc(sizeof(*s));
	assert_non_null(s);
	return s;
}


static void shape_of(const struct cap_sandbox_spec *s, char *buf, size_t len)
{
	cap_sandbox_spec_shape(s, buf, len);
	assert_true(strlen(buf) < len - 1);	/* not cut short */
}

static void test_init(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec();
	char shape[512];

	cap_sandbox_spec_init(s);
	assert_int_equal(s->ndisks, 0);
	assert_false(s->net.enabled);
	assert_string_equal(s->setup.root_image, "");
	assert_string_equal(s->setup.root_upper, "");
	assert_string_equal(s->setup.work, "");
	assert_string_equal(s->setup.source, "");
	assert_string_equal(s->setup.workspace, "");
	assert_ptr_equal(s->setup.hostname, s->hostname);
	assert_int_equal(s->setup.net_addr, 0);
	assert_int_equal(s->setup.proxy_port, 0);
	shape_of(s, shape, sizeof(shape));
	assert_string_equal(shape, "no-nic");
	free(s);
}

static void test_named(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec();
	static const struct { const char *path, *serial; bool ro, own; } want[] = {
		{ "/h/images/x.erofs", "capsule-root", true, false },
		{ "/h/sb/a/root-upper.ext4", "capsule-upper", false, true },
		{ "/h/sb/a/private.ext4", "capsule-work", false, true },
		{ "/h/sb/a/source.erofs", "capsule-source", true, true },
	};

	cap_sandbox_spec_named(s, want[0].path, want[1].path, want[2].path, want[3].path, NULL, "box-1");
	assert_int_equal(s->ndisks, 4);
	for (unsigned i = 0; i < 4; i++) {
		assert_string_equal(s->disks[i].path, want[i].path);
		assert_string_equal(s->disks[i].serial, want[i].serial);
		assert_int_equal(s->disks[i].readonly, want[i].ro);
		assert_int_equal(s->disks[i].per_sandbox, want[i].own);
	}
	/* SETUP names the disks by the serials the guest finds them by. */
	assert_string_equal(s->setup.root_image, "capsule-root");
	assert_string_equal(s->setup.root_upper, "capsule-upper");
	assert_string_equal(s->setup.work, "capsule-work");
	assert_string_equal(s->setup.source, "capsule-source");
	assert_string_equal(s->setup.workspace, "");
	assert_string_equal(s->setup.hostname, "box-1");
	assert_false(s->net.enabled);
	assert_int_equal(s->setup.net_addr, 0);

	/* A name that is not a valid host name is not used as one. */
	cap_sandbox_spec_named(s, "i", "u", "w", "s", NULL, "bad name!");
	assert_string_equal(s->setup.hostname, "capsule");
	cap_sandbox_spec_named(s, "i", "u", "w", "s", NULL, NULL);
	assert_string_equal(s->setup.hostname, "capsule");
	free(s);
}

static void test_oneshot(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec();

	cap_sandbox_spec_oneshot(s, NULL);
	assert_int_equal(s->ndisks, 0);
	assert_string_equal(s->setup.source, "");
	assert_string_equal(s->setup.root_image, "");
	assert_string_equal(s->setup.work, "");

	cap_sandbox_spec_oneshot(s, "/tmp/src.erofs");
	assert_int_equal(s->ndisks, 1);
	assert_string_equal(s->disks[0].path, "/tmp/src.erofs");
	assert_string_equal(s->disks[0].serial, "capsule-source");
	assert_true(s->disks[0].readonly);
	assert_true(s->disks[0].per_sandbox);
	assert_string_equal(s->setup.source, "capsule-source");
	assert_string_equal(s->setup.root_image, "");
	assert_false(s->net.enabled);
	free(s);
}

static void test_network(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec();
	static const char *const words[] = { "allow-egress=203.0.113.10", "allow-lan",
					     "publish=127.0.0.1:18080:80", NULL };
	struct cap_net_policy *p = policy_of(words);

	cap_sandbox_spec_oneshot(s, NULL);
	cap_sandbox_spec_network(s, p);
	assert_true(s->net.enabled);
	assert_true(s->net.allow_lan);
	assert_int_equal(s->net.nrules, 1);
	assert_string_equal(s->net.rules[0].text, "203.0.113.10");
	assert_int_equal(s->net.npublish, 1);
	assert_int_equal(s->net.publish[0].host_port, 18080);
	assert_int_equal(s->net.publish[0].guest_port, 80);
	assert_int_equal(s->setup.net_addr, 0x0a00020f);	/* 10.0.2.15 */
	assert_int_equal(s->setup.net_prefix, 24);
	assert_int_equal(s->setup.net_gateway, 0x0a000202);	/* 10.0.2.2 */
	assert_int_equal(s->setup.net_dns, 0x0a000203);	/* 10.0.2.3 */
	assert_int_equal(s->setup.proxy_port, 3128);
	assert_false(s->setup.auto_publish);
	/* The policy is copied: the caller's may go away. */
	p->allow_lan = false;
	assert_true(s->net.allow_lan);

	/* auto_publish mirrors the policy. */
	assert_int_equal(cap_net_policy_apply(p, "auto-publish", NULL, NULL), 0);
	cap_sandbox_spec_network(s, p);
	assert_true(s->setup.auto_publish);

	/* A policy without a NIC clears every network field again. */
	cap_net_policy_init(p);
	cap_sandbox_spec_network(s, p);
	assert_false(s->net.enabled);
	assert_int_equal(s->setup.net_addr, 0);
	assert_int_equal(s->setup.net_prefix, 0);
	assert_int_equal(s->setup.net_gateway, 0);
	assert_int_equal(s->setup.net_dns, 0);
	assert_int_equal(s->setup.proxy_port, 0);
	assert_false(s->setup.auto_publish);

	/* The network part leaves the disks and their SETUP names alone. */
	cap_sandbox_spec_named(s, "i", "u", "w", "s", NULL, "n");
	cap_net_policy_apply(p, "allow-public", NULL, NULL);
	cap_sandbox_spec_network(s, p);
	assert_int_equal(s->ndisks, 4);
	assert_string_equal(s->setup.work, "capsule-work");
	assert_string_equal(s->setup.hostname, "n");
	free(p);
	free(s);
}

static void test_shape(void **state)
{
	(void)state;
	struct cap_sandbox_spec *a = new_spec(), *b = new_spec();
	struct cap_net_policy *p = new_policy();
	char sa[512], sb[512];

	/* Different paths, same layout: the same shape, which names no path. */
	cap_sandbox_spec_named(a, "/h/images/one.erofs", "/h/a/u", "/h/a/w", "/h/a/s", NULL, "a");
	cap_sandbox_spec_named(b, "/h/images/two.erofs", "/h/b/u", "/h/b/w", "/h/b/s", NULL, "b");
	shape_of(a, sa, sizeof(sa));
	shape_of(b, sb, sizeof(sb));
	assert_string_equal(sa, sb);
	assert_null(strstr(sa, "/h/"));
	assert_string_equal(sa, "disk0=capsule-root:ro:shared disk1=capsule-upper:rw:own "
				"disk2=capsule-work:rw:own disk3=capsule-source:ro:own no-nic");

	/* A NIC is part of the shape; what the policy opens is not. */
	cap_net_policy_apply(p, "allow-lan", NULL, NULL);
	cap_sandbox_spec_network(a, p);
	shape_of(a, sa, sizeof(sa));
	assert_string_not_equal(sa, sb);
	assert_non_null(strstr(sa, " nic"));
	assert_null(strstr(sa, "no-nic"));
	cap_net_policy_init(p);
	cap_net_policy_apply(p, "allow-egress", "203.0.113.10:443", NULL);
	cap_net_policy_apply(p, "publish", "18080:80", NULL);
	cap_sandbox_spec_network(b, p);
	shape_of(b, sb, sizeof(sb));
	assert_string_equal(sa, sb);

	/* One-shot: with and without /source differ; paths do not matter. */
	cap_sandbox_spec_oneshot(a, NULL);
	cap_sandbox_spec_oneshot(b, "/tmp/one.erofs");
	shape_of(a, sa, sizeof(sa));
	shape_of(b, sb, sizeof(sb));
	assert_string_equal(sa, "no-nic");
	assert_string_equal(sb, "disk0=capsule-source:ro:own no-nic");
	cap_sandbox_spec_oneshot(a, "/tmp/two.erofs");
	shape_of(a, sa, sizeof(sa));
	assert_string_equal(sa, sb);
	cap_sandbox_spec_network(a, p);
	shape_of(a, sa, sizeof(sa));
	assert_string_equal(sa, "disk0=capsule-source:ro:own nic");

	/* A short buffer is cut, still terminated. */
	cap_sandbox_spec_named(a, "i", "u", "w", "s", NULL, "a");
	cap_sandbox_spec_shape(a, sa, 8);
	assert_int_equal(strlen(sa), 7);
	free(p);
	free(a);
	free(b);
}

static void test_disk_role(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec();

	assert_string_equal(cap_sandbox_disk_role("capsule-work"), "/work");
	assert_string_equal(cap_sandbox_disk_role("capsule-source"), "/source");
	assert_string_equal(cap_sandbox_disk_role("capsule-root"), "the image");
	assert_string_equal(cap_sandbox_disk_role("capsule-upper"),
			    "the root file system's writable layer");
	/* Unknown: the serial itself. */
	assert_string_equal(cap_sandbox_disk_role("other"), "other");
	/* Every disk a spec makes has a role of its own. */
	cap_sandbox_spec_named(s, "i", "u", "w", "s", NULL, "a");
	for (unsigned i = 0; i < s->ndisks; i++)
		assert_string_not_equal(cap_sandbox_disk_role(s->disks[i].serial), s->disks[i].serial);
	free(s);
}

static void test_record_net(void **state)
{
	(void)state;
	struct cap_record *r = malloc(sizeof(*r));
	struct cap_net_policy *back = new_policy();
	static const char *const words[] = { "allow-egress=203.0.113.10", "allow-egress=*.example.com:443",
					     "allow-lan", "publish=127.0.0.1:18080:80", "auto-publish",
					     NULL };
	struct cap_net_policy *p = policy_of(words);
	struct cap_err err = { 0 };
	assert_non_null(r);

	/* No policy: nothing recorded, and it reads back as no NIC. */
	cap_record_init(r);
	assert_string_equal(r->net, "");
	back->enabled = true;
	assert_int_equal(cap_record_net(r, back, &err), 0);
	assert_false(back->enabled);

	assert_int_equal(cap_record_set_net(r, p, &err), 0);
	assert_non_null(strstr(r->net, "allow-egress=203.0.113.10"));
	assert_non_null(strstr(r->net, "allow-egress=*.example.com:443"));
	assert_non_null(strstr(r->net, "allow-lan"));
	assert_non_null(strstr(r->net, "publish=127.0.0.1:18080:80"));
	assert_non_null(strstr(r->net, "auto-publish"));
	assert_int_equal(cap_record_net(r, back, &err), 0);
	assert_true(back->enabled);
	assert_true(back->allow_lan);
	assert_false(back->allow_public);
	assert_false(back->allow_host);
	assert_true(back->auto_publish);
	assert_int_equal(back->nrules, 2);
	assert_string_equal(back->rules[0].text, "203.0.113.10");
	assert_string_equal(back->rules[1].text, "*.example.com:443");
	assert_int_equal(back->rules[1].kind, CAP_NET_RULE_DOMAIN);
	assert_int_equal(back->rules[1].port, 443);
	assert_int_equal(back->npublish, 1);
	assert_int_equal(back->publish[0].bind, 0x7f000001);
	assert_int_equal(back->publish[0].host_port, 18080);
	assert_int_equal(back->publish[0].guest_port, 80);
	/* The description of both is the same line. */
	char *d1 = cap_net_policy_describe(p), *d2 = cap_net_policy_describe(back);
	assert_string_equal(d1, d2);
	free(d1);
	free(d2);

	/* Setting no NIC empties it again. */
	cap_net_policy_init(p);
	assert_int_equal(cap_record_set_net(r, p, &err), 0);
	assert_string_equal(r->net, "");
	free(p);
	free(back);
	free(r);
}

static void test_record_net_too_long(void **state)
{
	(void)state;
	struct cap_record *r = malloc(sizeof(*r));
	struct cap_net_policy *p = new_policy(), *back = new_policy();
	struct cap_err err = { 0 };
	char rule[300], label[64];
	assert_non_null(r);

	/* 64 rules of ~265 bytes each: over the record's room. */
	memset(label, 'a', 57);
	label[57] = '\0';
	for (unsigned i = 0; i < CAP_NET_MAX_RULES; i++) {
		snprintf(rule, sizeof(rule), "h%u.%s.%s.%s.%s.example.com:65535", i, label, label, label, label);
		if (cap_net_rule_add(p, rule, &err) < 0)
			fail_msg("adding %s: %s", rule, err.msg);
	}
	assert_true((size_t)CAP_NET_MAX_RULES * (strlen("allow-egress=") + strlen(rule) + 1) > sizeof(r->net));
	cap_record_init(r);
	snprintf(r->net, sizeof(r->net), "allow-lan");
	assert_int_equal(cap_record_set_net(r, p, &err), -E2BIG);
	assert_int_equal(err.code, E2BIG);
	assert_non_null(strstr(err.msg, "too long"));
	/* The record keeps what it had. */
	assert_string_equal(r->net, "allow-lan");

	/* Just what fits is kept whole. */
	cap_net_policy_init(p);
	for (unsigned i = 0; i < 12; i++) {
		snprintf(rule, sizeof(rule), "h%u.%s.%s.%s.example.com", i, label, label, label);
		assert_int_equal(cap_net_rule_add(p, rule, &err), 0);
	}
	assert_int_equal(cap_record_set_net(r, p, &err), 0);
	assert_int_equal(cap_record_net(r, back, &err), 0);
	assert_int_equal(back->nrules, 12);
	free(p);
	free(back);
	free(r);
}

static void test_record_net_bad_word(void **state)
{
	(void)state;
	struct cap_record *r = malloc(sizeof(*r));
	struct cap_net_policy *back = new_policy();
	struct cap_err err = { 0 };
	static const char *const bad[] = { "allow-egress=1.2.3.4/33", "bogus", "allow-egress",
					   "publish=99999:80", "allow-lan allow-egress=*" };
	assert_non_null(r);

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cap_record_init(r);
		snprintf(r->net, sizeof(r->net), "%s", bad[i]);
		memset(&err, 0, sizeof(err));
		assert_int_equal(cap_record_net(r, back, &err), -EBADMSG);
		assert_int_equal(err.code, EBADMSG);
		if (!strstr(err.msg, "recorded network flag"))
			fail_msg("%s: %s", bad[i], err.msg);
	}
	/* The message names the word at fault and why. */
	cap_record_init(r);
	snprintf(r->net, sizeof(r->net), "allow-lan allow-egress=1.2.3.4/33");
	assert_int_equal(cap_record_net(r, back, &err), -EBADMSG);
	if (!strstr(err.msg, "allow-egress") || !strstr(err.msg, "1.2.3.4/33"))
		fail_msg("does not name the word: %s", err.msg);
	free(back);
	free(r);
}

/* Secrets are not part of the spec's SETUP nor of the shape: a template
 * never holds a CA or a placeholder, and sandboxes with and without
 * secrets share templates. */
static void test_secrets_not_in_spec(void **state)
{
	(void)state;
	struct cap_sandbox_spec *a = new_spec(), *b = new_spec();
	struct cap_net_policy *p = new_policy();
	struct cap_err err = { 0 };
	char sa[512], sb[512];

	cap_sandbox_spec_named(a, "i", "u", "w", "s", NULL, "a");
	cap_sandbox_spec_named(b, "i", "u", "w", "s", NULL, "b");
	assert_int_equal(cap_net_secret_add(p, "TOKEN=env:CAPSULE_TEST_SPEC_TOKEN@api.test", &err), 0);
	cap_sandbox_spec_network(a, p);
	cap_net_policy_init(p);
	cap_net_policy_apply(p, "allow-egress", "api.test:443", NULL);
	cap_sandbox_spec_network(b, p);
	shape_of(a, sa, sizeof(sa));
	shape_of(b, sb, sizeof(sb));
	assert_string_equal(sa, sb);
	assert_int_equal(a->net.nsecrets, 1);
	assert_null(a->setup.ca_pem);
	assert_int_equal(a->setup.envc, 0);
	free(p);
	free(a);
	free(b);
}

struct owner {
	char dir[64];
	char trust[96];
	struct cap_sandbox_spec spec;
	struct cap_sandbox_opts o;
};

static int owner_setup(void **state)
{
	struct owner *t = calloc(1, sizeof(*t));
	struct cap_net_ca ca;
	struct cap_err err = { 0 };
	if (!t)
		return -1;
	snprintf(t->dir, sizeof(t->dir), "/tmp/capsule-test-spec-XXXXXX");
	if (!mkdtemp(t->dir))
		return -1;
	/* A trust store of its own: the test does not depend on the host's. */
	snprintf(t->trust, sizeof(t->trust), "%s/trust.pem", t->dir);
	if (cap_net_ca_ensure(NULL, "trust", &ca, &err) < 0 ||
	    cap_write_file_atomic(t->trust, ca.owned_cert_pem, strlen(ca.owned_cert_pem), 0644) < 0)
		return -1;
	cap_net_ca_fini(&ca);
	setenv("SSL_CERT_FILE", t->trust, 1);
	cap_sandbox_spec_oneshot(&t->spec, NULL);
	cap_sandbox_opts_init(&t->o);
	t->o.spec = &t->spec;
	t->o.name = "box";
	t->o.ca_dir = t->dir;
	*state = t;
	return 0;
}

static int owner_teardown(void **state)
{
	struct owner *t = *state;
	cap_remove_tree(t->dir);
	unsetenv("SSL_CERT_FILE");
	unsetenv("CAPSULE_TEST_SPEC_TOKEN");
	free(t);
	return 0;
}

/* The owner's start with secrets (sandbox-net.c): the CA in ca_dir, SETUP
 * with its certificate and NAME=<placeholder>, never the value. */
static void test_owner_secrets(void **state)
{
	struct owner *t = *state;
	struct cap_net_policy *p = new_policy();
	struct cap_sandbox_net *n = NULL;
	struct cap_err err = { 0 };
	char path[128], ph[CAP_NET_PLACEHOLDER_LEN + 1], want[128];
	char *env[CAP_SETUP_MAX_ENV];

	assert_int_equal(cap_net_secret_add(p, "TOKEN=env:CAPSULE_TEST_SPEC_TOKEN@api.test", &err), 0);
	cap_sandbox_spec_network(&t->spec, p);
	setenv("CAPSULE_TEST_SPEC_TOKEN", "the-real-token-value", 1);
	assert_int_equal(cap_sandbox_net_new(&t->o, &n, &err), 0);

	struct cap_setup s = t->spec.setup;
	assert_int_equal(cap_sandbox_net_setup(n, &s, env, &err), 0);
	assert_non_null(s.ca_pem);
	assert_non_null(strstr(s.ca_pem, "-----BEGIN CERTIFICATE-----"));
	assert_int_equal(s.envc, 1);
	/* The placeholder of this CA (the one now kept in ca_dir). */
	struct cap_net_ca ca;
	assert_int_equal(cap_net_ca_ensure(t->dir, "box", &ca, &err), 0);
	assert_string_equal(ca.owned_cert_pem, s.ca_pem);
	cap_net_secret_placeholder(ca.fp, "TOKEN", ph);
	snprintf(want, sizeof(want), "TOKEN=%s", ph);
	assert_string_equal(s.env[0], want);
	assert_null(strstr(s.ca_pem, "the-real-token-value"));
	cap_net_ca_fini(&ca);
	snprintf(path, sizeof(path), "%s/ca.key", t->dir);
	assert_int_equal(access(path, F_OK), 0);
	/* Until the VM runs, the owner keeps the env: source (a cold boot
	 * after a failed restore reads nothing again); once it runs, the
	 * policy process alone has the value: the variable is gone. */
	assert_non_null(getenv("CAPSULE_TEST_SPEC_TOKEN"));
	cap_sandbox_net_started(n);
	assert_null(getenv("CAPSULE_TEST_SPEC_TOKEN"));
	cap_sandbox_net_free(n);

	/* A second start: the same CA, the same placeholder. */
	setenv("CAPSULE_TEST_SPEC_TOKEN", "the-real-token-value", 1);
	assert_int_equal(cap_sandbox_net_new(&t->o, &n, &err), 0);
	s = t->spec.setup;
	assert_int_equal(cap_sandbox_net_setup(n, &s, env, &err), 0);
	assert_string_equal(s.env[0], want);
	cap_sandbox_net_free(n);

	/* The variable missing: the start fails, saying what to do. */
	unsetenv("CAPSULE_TEST_SPEC_TOKEN");
	n = NULL;
	assert_int_equal(cap_sandbox_net_new(&t->o, &n, &err), -ENOENT);
	assert_null(n);
	assert_string_equal(err.msg, "secret TOKEN: environment variable CAPSULE_TEST_SPEC_TOKEN is not set "
				     "(--secret TOKEN=env:CAPSULE_TEST_SPEC_TOKEN@api.test); set it in the "
				     "environment of the command that starts the sandbox");

	/* No trust store: the start fails naming it. */
	setenv("CAPSULE_TEST_SPEC_TOKEN", "the-real-token-value", 1);
	snprintf(path, sizeof(path), "%s/missing.pem", t->dir);
	setenv("SSL_CERT_FILE", path, 1);
	assert_true(cap_sandbox_net_new(&t->o, &n, &err) < 0);
	assert_non_null(strstr(err.msg, path));
	setenv("SSL_CERT_FILE", t->trust, 1);

	/* A one-shot run: a CA in memory, nothing written. */
	t->o.ca_dir = NULL;
	snprintf(path, sizeof(path), "%s/ca.key", t->dir);
	assert_int_equal(unlink(path), 0);
	assert_int_equal(cap_sandbox_net_new(&t->o, &n, &err), 0);
	s = t->spec.setup;
	assert_int_equal(cap_sandbox_net_setup(n, &s, env, &err), 0);
	assert_string_not_equal(s.env[0], want);
	assert_int_equal(access(path, F_OK), -1);
	cap_sandbox_net_free(n);

	/* Without secrets SETUP gains nothing. */
	cap_net_policy_init(p);
	cap_net_policy_apply(p, "allow-public", NULL, NULL);
	cap_sandbox_spec_network(&t->spec, p);
	assert_int_equal(cap_sandbox_net_new(&t->o, &n, &err), 0);
	s = t->spec.setup;
	assert_int_equal(cap_sandbox_net_setup(n, &s, env, &err), 0);
	assert_null(s.ca_pem);
	assert_int_equal(s.envc, 0);
	cap_sandbox_net_free(n);
	free(p);
}

/* A workspace is a fifth disk: its own, writable, found by a serial that
 * fits a virtio serial (20 bytes), named in SETUP; it changes the shape
 * (its own template) and nothing else of the layout. */
static void test_workspace(void **state)
{
	(void)state;
	struct cap_sandbox_spec *s = new_spec(), *plain = new_spec();
	char ss[512], sp[512];

	cap_sandbox_spec_named(s, "/h/images/x.erofs", "/h/sb/a/root-upper.ext4", "/h/sb/a/private.ext4",
			       "/h/sb/a/source.erofs", "/h/sb/a/workspace.ext4", "a");
	cap_sandbox_spec_named(plain, "/h/images/x.erofs", "/h/sb/a/root-upper.ext4", "/h/sb/a/private.ext4",
			       "/h/sb/a/source.erofs", NULL, "a");
	assert_int_equal(s->ndisks, 5);
	assert_int_equal(CAP_SPEC_MAX_DISKS, 5);
	assert_int_equal(plain->ndisks, 4);
	for (unsigned i = 0; i < 4; i++) {
		assert_string_equal(s->disks[i].path, plain->disks[i].path);
		assert_string_equal(s->disks[i].serial, plain->disks[i].serial);
	}
	assert_string_equal(s->disks[4].path, "/h/sb/a/workspace.ext4");
	assert_string_equal(s->disks[4].serial, "capsule-wspace");
	assert_true(strlen(s->disks[4].serial) <= 20);
	assert_false(s->disks[4].readonly);
	assert_true(s->disks[4].per_sandbox);
	assert_string_equal(s->setup.workspace, "capsule-wspace");
	assert_string_equal(plain->setup.workspace, "");
	assert_string_equal(cap_sandbox_disk_role("capsule-wspace"), "/workspace");

	shape_of(s, ss, sizeof(ss));
	shape_of(plain, sp, sizeof(sp));
	assert_string_not_equal(ss, sp);
	assert_string_equal(ss, "disk0=capsule-root:ro:shared disk1=capsule-upper:rw:own "
				"disk2=capsule-work:rw:own disk3=capsule-source:ro:own "
				"disk4=capsule-wspace:rw:own no-nic");
	/* Two sandboxes with workspaces share a shape whatever their paths. */
	cap_sandbox_spec_named(plain, "/h/images/y.erofs", "/h/sb/b/u", "/h/sb/b/w", "/h/sb/b/s",
			       "/h/sb/b/workspace.ext4", "b");
	shape_of(plain, sp, sizeof(sp));
	assert_string_equal(ss, sp);
	/* Every disk of it has a role of its own. */
	for (unsigned i = 0; i < s->ndisks; i++)
		assert_string_not_equal(cap_sandbox_disk_role(s->disks[i].serial), s->disks[i].serial);
	free(s);
	free(plain);
}

/* record.json: "workspace" and "workspace_size_mib" read back; a record
 * written before workspaces reads as none; a relative path is refused. */
static void test_record_workspace(void **state)
{
	(void)state;
	char home[64], path[160];
	struct cap_record *r = malloc(sizeof(*r));
	struct cap_err err = { 0 };
	assert_non_null(r);
	snprintf(home, sizeof(home), "/tmp/capsule-test-spec-XXXXXX");
	assert_non_null(mkdtemp(home));
	setenv("CAPSULE_HOME", home, 1);
	snprintf(path, sizeof(path), "%s/sandboxes/old", home);
	assert_int_equal(cap_mkdir_p(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/sandboxes/new", home);
	assert_int_equal(cap_mkdir_p(path, 0700), 0);
	snprintf(path, sizeof(path), "%s/sandboxes/bad", home);
	assert_int_equal(cap_mkdir_p(path, 0700), 0);
	static const char digest[] = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
	char text[1024];
	int n = snprintf(text, sizeof(text), "{\"schema\": 1, \"name\": \"old\", \"image\": \"%s\", \"image_ref\": \"base\", "
			 "\"cpus\": 1, \"memory_mib\": 512, \"root_size_mib\": 256, \"work_size_mib\": 512, \"created\": 1}",
			 digest);
	snprintf(path, sizeof(path), "%s/sandboxes/old/record.json", home);
	assert_int_equal(cap_write_file_atomic(path, text, (size_t)n, 0600), 0);
	n = snprintf(text, sizeof(text), "{\"schema\": 1, \"name\": \"new\", \"image\": \"%s\", \"image_ref\": \"base\", "
		     "\"cpus\": 1, \"memory_mib\": 512, \"root_size_mib\": 256, \"work_size_mib\": 512, \"created\": 1, "
		     "\"workspace\": \"/home/u/proj\", \"workspace_size_mib\": 640}", digest);
	snprintf(path, sizeof(path), "%s/sandboxes/new/record.json", home);
	assert_int_equal(cap_write_file_atomic(path, text, (size_t)n, 0600), 0);
	n = snprintf(text, sizeof(text), "{\"schema\": 1, \"name\": \"bad\", \"image\": \"%s\", \"image_ref\": \"base\", "
		     "\"cpus\": 1, \"memory_mib\": 512, \"root_size_mib\": 256, \"work_size_mib\": 512, \"created\": 1, "
		     "\"workspace\": \"proj\", \"workspace_size_mib\": 640}", digest);
	snprintf(path, sizeof(path), "%s/sandboxes/bad/record.json", home);
	assert_int_equal(cap_write_file_atomic(path, text, (size_t)n, 0600), 0);

	assert_int_equal(cap_named_load("old", r, &err), 0);
	assert_string_equal(r->workspace, "");
	assert_int_equal(r->workspace_size_mib, 0);
	/* No workspace, no base. */
	struct cap_tree t;
	cap_tree_init(&t);
	assert_int_equal(cap_named_workspace_base("old", &t, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "--workspace"));
	assert_int_equal(cap_named_load("new", r, &err), 0);
	assert_string_equal(r->workspace, "/home/u/proj");
	assert_int_equal(r->workspace_size_mib, 640);
	assert_int_equal(cap_named_load("bad", r, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "workspace"));

	/* The base moves: saved, loaded back the same. */
	struct cap_tree_entry e[2] = {
		{ .path = "README.md", .type = CAP_TREE_FILE, .mode = 0644, .size = 4 },
		{ .path = "sub", .type = CAP_TREE_DIR, .mode = 0755 },
	};
	memset(e[0].hash, 0xab, sizeof(e[0].hash));
	struct cap_tree want = { .v = e, .n = 2, .bytes = 4 };
	assert_int_equal(cap_named_workspace_set_base("new", &want, &err), 0);
	assert_int_equal(cap_named_workspace_base("new", &t, &err), 0);
	assert_int_equal(t.n, 2);
	assert_true(cap_tree_entry_same(&t.v[0], &e[0]));
	assert_true(cap_tree_entry_same(&t.v[1], &e[1]));
	cap_tree_fini(&t);
	assert_int_equal(cap_remove_tree(home), 0);
	unsetenv("CAPSULE_HOME");
	free(r);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_init),
		cmocka_unit_test(test_named),
		cmocka_unit_test(test_oneshot),
		cmocka_unit_test(test_network),
		cmocka_unit_test(test_shape),
		cmocka_unit_test(test_disk_role),
		cmocka_unit_test(test_workspace),
		cmocka_unit_test(test_record_workspace),
		cmocka_unit_test(test_record_net),
		cmocka_unit_test(test_record_net_too_long),
		cmocka_unit_test(test_record_net_bad_word),
		cmocka_unit_test(test_secrets_not_in_spec),
		cmocka_unit_test_setup_teardown(test_owner_secrets, owner_setup, owner_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
