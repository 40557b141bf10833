/* The initramfs packer: reproducible bytes, a well-formed archive, and
 * errors that name the missing input. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "store.h"
#include "util.h"

static char dir[] = "/tmp/capsule-store-XXXXXX";

static char *in_dir(const char *name) { return xasprintf("%s/%s", dir, name); }

static void write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	if (!mkdtemp(dir))
		return -1;
	setenv("CAPSULE_CACHE", dir, 1);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	char *cmd = xasprintf("rm -rf '%s'", dir);
	int r = system(cmd);
	free(cmd);
	return r == 0 ? 0 : -1;
}

static void same_inputs_same_bytes(void **state)
{
	(void)state;
	_cleanup_free_ char *agent = in_dir("agent"), *a = in_dir("a.cpio"), *b = in_dir("b.cpio");
	write_text(agent, "#!/bin/sh\necho fake agent\n");
	assert_int_equal(cap_store_initramfs_write(agent, CAP_BUSYBOX, a, NULL), 0);
	assert_int_equal(cap_store_initramfs_write(agent, CAP_BUSYBOX, b, NULL), 0);
	char *x = NULL, *y = NULL;
	ssize_t nx = cap_read_file(a, 64u << 20, &x);
	ssize_t ny = cap_read_file(b, 64u << 20, &y);
	assert_true(nx > 1000);
	assert_int_equal(nx, ny);
	assert_memory_equal(x, y, (size_t)nx);
	/* newc magic first, trailer last, 4-byte aligned */
	assert_memory_equal(x, "070701", 6);
	assert_non_null(memmem(x, (size_t)nx, "TRAILER!!!", 10));
	assert_non_null(memmem(x, (size_t)nx, "init", 5));
	assert_int_equal(nx % 4, 0);
	free(x);
	free(y);
}

static void key_follows_inputs(void **state)
{
	(void)state;
	_cleanup_free_ char *agent = in_dir("agent2");
	char *p1 = NULL, *p2 = NULL, *p3 = NULL;
	bool built;
	write_text(agent, "one");
	assert_int_equal(cap_store_initramfs(agent, CAP_BUSYBOX, &p1, &built, NULL), 0);
	assert_true(built);
	assert_int_equal(cap_store_initramfs(agent, CAP_BUSYBOX, &p2, &built, NULL), 0);
	assert_false(built);	/* cached */
	assert_string_equal(p1, p2);
	write_text(agent, "two");
	assert_int_equal(cap_store_initramfs(agent, CAP_BUSYBOX, &p3, &built, NULL), 0);
	assert_true(built);
	assert_string_not_equal(p1, p3);
	free(p1);
	free(p2);
	free(p3);
}

static void missing_agent_named(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	char *p = NULL;
	_cleanup_free_ char *agent = in_dir("no-such-agent");
	assert_int_equal(cap_store_initramfs(agent, CAP_BUSYBOX, &p, NULL, &err), -ENOENT);
	assert_non_null(strstr(err.msg, agent));
	assert_null(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(same_inputs_same_bytes),
		cmocka_unit_test(key_follows_inputs),
		cmocka_unit_test(missing_agent_named),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
