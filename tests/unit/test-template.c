/* Unit tests of the template cache's key and records
 * (src/sandbox/sandbox-template.c): the key follows the engine's identity
 * (another CPU, KVM or kernel under KVM is another key) and the
 * accelerator, and a template records the host it was made on, which
 * `template ls` compares with this host's. No VM starts. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>
#include <jansson.h>

#include "engine-ops.h"
#include "paths.h"
#include "sandbox-internal.h"
#include "util.h"

/* An engine whose identity a test sets. */
static const char *fake_id = "qemu=x\naccel=kvm\ncpu=A\n";
static char *fake_identity(enum cap_accel accel)
{
	(void)accel;
	return xstrdup(fake_id);
}
static const struct cap_engine_ops fake = { .name = "fake", .identity = fake_identity };

static char dir[64];

static int setup(void **state)
{
	(void)state;
	snprintf(dir, sizeof(dir), "/tmp/test-template.XXXXXX");
	assert_non_null(mkdtemp(dir));
	char *home = xasprintf("%s/home", dir), *cache = xasprintf("%s/cache", dir);
	setenv("CAPSULE_HOME", home, 1);
	setenv("CAPSULE_CACHE", cache, 1);
	free(home);
	free(cache);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unsetenv("CAPSULE_HOME");
	unsetenv("CAPSULE_CACHE");
	return cap_remove_tree(dir);
}

static struct cap_vm_config config(const struct cap_engine_ops *e, enum cap_accel accel)
{
	return (struct cap_vm_config){ .kernel = "/nonexistent/vmlinux", .initrd = "/nonexistent/initrd",
				       .cpus = 1, .memory_mib = 512, .accel = accel, .engine = e };
}

static void key_of(const struct cap_vm_config *cfg, char key[65])
{
	struct cap_sandbox_opts o;
	cap_sandbox_opts_init(&o);
	cap_template_key(&o, cfg, key);
}

/* The same identity, the same key; another CPU, KVM API or kernel in
 * the identity, another key: a template made on one host is never
 * restored on another. */
static void key_follows_the_engine_identity(void **state)
{
	(void)state;
	struct cap_vm_config cfg = config(&fake, CAP_ACCEL_KVM);
	char a[65], b[65];
	fake_id = "qemu=x\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 1\ncpuid=kvm:11\nkvm_api=12\nkernel=6.1 #1\n";
	key_of(&cfg, a);
	key_of(&cfg, b);
	assert_string_equal(a, b);
	const char *others[] = {
		"qemu=x\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 2\ncpuid=kvm:11\nkvm_api=12\nkernel=6.1 #1\n",
		"qemu=x\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 1\ncpuid=kvm:12\nkvm_api=12\nkernel=6.1 #1\n",
		"qemu=x\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 1\ncpuid=kvm:11\nkvm_api=13\nkernel=6.1 #1\n",
		"qemu=x\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 1\ncpuid=kvm:11\nkvm_api=12\nkernel=6.1 #2\n",
		"qemu=y\naccel=kvm\ncpu=AuthenticAMD family 25 model 1 stepping 1\ncpuid=kvm:11\nkvm_api=12\nkernel=6.1 #1\n",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(others); i++) {
		fake_id = others[i];
		key_of(&cfg, b);
		assert_string_not_equal(a, b);
	}
}

/* QEMU's real identity: a TCG template is never a KVM one, and the
 * reverse (here KVM's part is /proc/cpuinfo's, /dev/kvm being absent;
 * the key is computed all the same). */
static void key_differs_between_accelerators(void **state)
{
	(void)state;
	const struct cap_engine_ops *qemu;
	assert_int_equal(cap_engine_get("qemu", &qemu, NULL), 0);
	struct cap_vm_config tcg = config(qemu, CAP_ACCEL_TCG), kvm = config(qemu, CAP_ACCEL_KVM);
	char a[65], b[65], c[65];
	key_of(&tcg, a);
	key_of(&kvm, b);
	assert_string_not_equal(a, b);
	key_of(&kvm, c);
	assert_string_equal(b, c);
	/* Even with an identity that did not name its accelerator. */
	fake_id = "qemu=x\n";
	tcg = config(&fake, CAP_ACCEL_TCG);
	kvm = config(&fake, CAP_ACCEL_KVM);
	key_of(&tcg, a);
	key_of(&kvm, b);
	assert_string_not_equal(a, b);
}

/* A staged template with its two files. */
static char *staged(void)
{
	char *home = cap_home_dir();
	char *tmp = xasprintf("%s/templates/tmp-test", home);
	free(home);
	assert_int_equal(cap_mkdir_p(tmp, 0700), 0);
	for (int i = 0; i < 2; i++) {
		char *f = xasprintf("%s/%s", tmp, i ? "ram" : "state");
		FILE *fp = fopen(f, "w");
		assert_non_null(fp);
		fputs("x", fp);
		fclose(fp);
		free(f);
	}
	return tmp;
}

static const struct cap_template_info *find(const struct cap_template_info *v, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].key, key) == 0)
			return &v[i];
	fail_msg("template %s not listed", key);
	return NULL;
}

static const struct cap_template_host_field *field(const struct cap_template_info *t, const char *name)
{
	for (size_t i = 0; i < t->nhost; i++)
		if (strcmp(t->host[i].owned_name, name) == 0)
			return &t->host[i];
	return NULL;
}

static void free_list(struct cap_template_info *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		cap_template_info_fini(&v[i]);
	free(v);
}

/* Change one field of the host recorded in key's meta.json. */
static void rewrite_host(const char *key, const char *name, const char *value)
{
	char *home = cap_home_dir();
	char *meta = xasprintf("%s/templates/%s/meta.json", home, key);
	json_t *j = json_load_file(meta, 0, NULL);
	assert_non_null(j);
	if (value)
		json_object_set_new(json_object_get(j, "host"), name, json_string(value));
	else
		json_object_del(json_object_get(j, "host"), name);
	assert_int_equal(json_dump_file(j, meta, 0), 0);
	json_decref(j);
	free(meta);
	free(home);
}

/* A template records its engine, accelerator and the host's identity;
 * listed here it matches; a recorded CPU or kernel of another host shows
 * as the fields that differ, with both values; a template of before
 * records none. */
static void list_compares_the_recorded_host(void **state)
{
	(void)state;
	const struct cap_engine_ops *qemu;
	assert_int_equal(cap_engine_get("qemu", &qemu, NULL), 0);
	const char *keys[2] = { "1111111111111111111111111111111111111111111111111111111111111111",
				"2222222222222222222222222222222222222222222222222222222222222222" };
	enum cap_accel accels[2] = { CAP_ACCEL_KVM, CAP_ACCEL_TCG };
	for (int i = 0; i < 2; i++) {
		struct cap_vm_config cfg = config(qemu, accels[i]);
		struct cap_err err = { 0 };
		char *tmp = staged(), *out = NULL;
		assert_int_equal(cap_template_store(tmp, keys[i], "1 vCPU", &cfg, &out, &err), 0);
		free(out);
		free(tmp);
	}
	struct cap_template_info *v;
	size_t n;
	assert_int_equal(cap_template_list(&v, &n), 0);
	assert_int_equal(n, 2);
	const struct cap_template_info *k = find(v, n, keys[0]), *t = find(v, n, keys[1]);
	assert_string_equal(k->engine, "qemu");
	assert_string_equal(k->accel, "kvm");
	assert_string_equal(t->accel, "tcg");
	assert_string_equal(k->owned_mismatch, "");
	assert_string_equal(t->owned_mismatch, "");
	assert_non_null(field(k, "cpu"));
	assert_non_null(field(k, "kernel"));
	assert_null(field(t, "cpu"));
	assert_non_null(field(t, "tsc_mhz"));
	/* In the engine's order. */
	assert_string_equal(k->host[0].owned_name, "qemu");
	assert_string_equal(k->host[1].owned_name, "qemu_version");
	free_list(v, n);

	rewrite_host(keys[0], "cpu", "GenuineIntel family 6 model 85 stepping 7");
	rewrite_host(keys[0], "kernel", "5.10.0-28-amd64 #1 SMP Debian 5.10.209-2");
	rewrite_host(keys[1], "tsc_mhz", "1");
	assert_int_equal(cap_template_list(&v, &n), 0);
	k = find(v, n, keys[0]);
	t = find(v, n, keys[1]);
	assert_string_equal(k->owned_mismatch, "cpu, kernel");
	const struct cap_template_host_field *f = field(k, "cpu");
	assert_string_equal(f->owned_made, "GenuineIntel family 6 model 85 stepping 7");
	assert_non_null(f->owned_now);
	assert_string_not_equal(f->owned_made, f->owned_now);
	assert_true(f->differs);
	assert_false(field(k, "qemu")->differs);
	assert_string_equal(t->owned_mismatch, "tsc_mhz");
	free_list(v, n);

	/* A field this host has and the template does not: it differs too. */
	rewrite_host(keys[1], "clock", NULL);
	assert_int_equal(cap_template_list(&v, &n), 0);
	t = find(v, n, keys[1]);
	assert_string_equal(t->owned_mismatch, "tsc_mhz, clock");
	f = field(t, "clock");
	assert_null(f->owned_made);
	assert_non_null(f->owned_now);
	assert_true(f->differs);
	free_list(v, n);

	/* Made before templates recorded their host: nothing to compare. */
	char *home = cap_home_dir();
	char *meta = xasprintf("%s/templates/%s/meta.json", home, keys[1]);
	const char *old = "{\"schema\": 1, \"key\": \"k\", \"desc\": \"old\", \"created\": 1}";
	assert_int_equal(cap_write_file_atomic(meta, old, strlen(old), 0600), 0);
	assert_int_equal(cap_template_list(&v, &n), 0);
	t = find(v, n, keys[1]);
	assert_null(t->host);
	assert_null(t->owned_mismatch);
	assert_string_equal(t->accel, "");
	free_list(v, n);
	free(meta);
	free(home);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(key_follows_the_engine_identity),
		cmocka_unit_test(key_differs_between_accelerators),
		cmocka_unit_test(list_compares_the_recorded_host),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
