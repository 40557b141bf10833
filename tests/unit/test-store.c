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

#include <archive.h>
#include <archive_entry.h>
#include <sys/stat.h>

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

/* Write a tar with entries "path=content", "path->target" (symlink) or
 * "path/" (directory). */
static void make_tar(const char *path, const char *const *entries)
{
	struct archive *a = archive_write_new();
	archive_write_set_format_pax_restricted(a);
	assert_int_equal(archive_write_open_filename(a, path), ARCHIVE_OK);
	for (; *entries; entries++) {
		struct archive_entry *e = archive_entry_new();
		const char *eq = strchr(*entries, '='), *arrow = strstr(*entries, "->");
		size_t n = strlen(*entries);
		char name[256];
		if (arrow) {
			snprintf(name, sizeof(name), "%.*s", (int)(arrow - *entries), *entries);
			archive_entry_set_filetype(e, AE_IFLNK);
			archive_entry_set_symlink(e, arrow + 2);
		} else if (eq) {
			snprintf(name, sizeof(name), "%.*s", (int)(eq - *entries), *entries);
			archive_entry_set_filetype(e, AE_IFREG);
			archive_entry_set_size(e, (la_int64_t)strlen(eq + 1));
		} else {
			snprintf(name, sizeof(name), "%.*s", (int)(n - 1), *entries);
			archive_entry_set_filetype(e, AE_IFDIR);
		}
		archive_entry_set_pathname(e, name);
		archive_entry_set_perm(e, 0755);
		archive_write_header(a, e);
		if (eq && !arrow)
			archive_write_data(a, eq + 1, strlen(eq + 1));
		archive_entry_free(e);
	}
	archive_write_close(a);
	archive_write_free(a);
}

static bool exists(const char *root, const char *rel)
{
	_cleanup_free_ char *p = xasprintf("%s/%s", root, rel);
	struct stat st;
	return lstat(p, &st) == 0;
}

static void layers_and_whiteouts(void **state)
{
	(void)state;
	_cleanup_free_ char *root = in_dir("root"), *l1 = in_dir("l1.tar"), *l2 = in_dir("l2.tar");
	mkdir(root, 0755);
	const char *const one[] = { "a/", "a/keep=k", "a/gone=g", "b/", "b/x/", "b/x/1=1", "c=c", NULL };
	const char *const two[] = { "a/.wh.gone=", "b/.wh..wh..opq=", "b/new=n", ".wh.c=", NULL };
	make_tar(l1, one);
	make_tar(l2, two);
	assert_int_equal(cap_store_apply_layer(root, l1, NULL), 0);
	assert_int_equal(cap_store_apply_layer(root, l2, NULL), 0);
	assert_true(exists(root, "a/keep"));
	assert_false(exists(root, "a/gone"));
	assert_false(exists(root, "a/.wh.gone"));	/* markers are not content */
	assert_false(exists(root, "b/x"));	/* opaque: lower content hidden */
	assert_true(exists(root, "b/new"));	/* ...but this layer's own stays */
	assert_false(exists(root, "c"));
}

static void hostile_layers(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	_cleanup_free_ char *root = in_dir("root2"), *t1 = in_dir("t1.tar"), *t2 = in_dir("t2.tar"),
			   *t3 = in_dir("t3.tar"), *outside = in_dir("outside");
	mkdir(root, 0755);
	mkdir(outside, 0755);

	/* ".." in a path is refused by name, before anything is written. */
	const char *const dotdot[] = { "ok=1", "a/../../escaped=x", NULL };
	make_tar(t1, dotdot);
	assert_int_equal(cap_store_apply_layer(root, t1, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "a/../../escaped"));
	assert_false(exists(dir, "escaped"));

	/* A symlink cannot be used to write outside the root: libarchive
	 * replaces the symlink by a directory instead of following it. */
	_cleanup_free_ char *link = xasprintf("link->%s", outside);
	const char *const through[] = { link, "link/pwned=x", NULL };
	make_tar(t2, through);
	cap_store_apply_layer(root, t2, &err);
	assert_false(exists(outside, "pwned"));

	/* A whiteout cannot delete through a symlink either. */
	_cleanup_free_ char *victim = in_dir("outside/victim");
	FILE *f = fopen(victim, "w");
	fclose(f);
	_cleanup_free_ char *root3 = in_dir("root3");
	mkdir(root3, 0755);
	_cleanup_free_ char *l = xasprintf("%s/link", root3);
	assert_int_equal(symlink(outside, l), 0);
	const char *const wh[] = { "link/.wh.victim=", NULL };
	make_tar(t3, wh);
	cap_store_apply_layer(root3, t3, &err);
	assert_true(exists(outside, "victim"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(same_inputs_same_bytes),
		cmocka_unit_test(key_follows_inputs),
		cmocka_unit_test(missing_agent_named),
		cmocka_unit_test(layers_and_whiteouts),
		cmocka_unit_test(hostile_layers),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
