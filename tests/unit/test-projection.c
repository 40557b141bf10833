/* Public data projections: the rules, the caps, the fingerprint, and the
 * copy's refusal to follow anything swapped in after validation. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <cmocka.h>

#include "paths.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

static char top[] = "/tmp/capsule-proj-XXXXXX";
static struct cap_projection_limits lim = { 1u << 20, 100 };

static char *at(const char *rel) { return xasprintf("%s/%s", top, rel); }

static void put(const char *rel, const char *text)
{
	_cleanup_free_ char *p = at(rel);
	_cleanup_free_ char *d = xstrdup(p);
	*strrchr(d, '/') = '\0';
	assert_int_equal(cap_mkdir_p(d, 0755), 0);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* A fresh tree: pub/{a.txt, sub/deep/b.txt, node_modules/x} */
static int setup(void **state)
{
	(void)state;
	if (!mkdtemp(top))
		return -1;
	put("pub/a.txt", "hi\n");
	put("pub/sub/deep/b.txt", "deep\n");
	put("pub/node_modules/x/index.js", "js\n");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	cap_remove_tree(top);
	strcpy(top, "/tmp/capsule-proj-XXXXXX");
	return 0;
}

static int scan(struct cap_projection_info *info, struct cap_err *err)
{
	_cleanup_free_ char *pub = at("pub");
	return cap_projection_scan(pub, &lim, info, err);
}

static void counts_and_excludes_node_modules(void **state)
{
	(void)state;
	struct cap_projection_info info;
	put("pub/sub/Node_Modules/y", "y\n");	/* any letter case */
	_cleanup_free_ char *evil = at("pub/node_modules/evil");
	assert_int_equal(symlink("/etc/passwd", evil), 0);	/* never looked at */
	_cleanup_free_ char *fifo = at("pub/node_modules/x/pipe");
	assert_int_equal(mkfifo(fifo, 0600), 0);
	_cleanup_free_ char *nm2 = at("pub/sub/deep/NODE_MODULES");
	assert_int_equal(symlink("/etc", nm2), 0);	/* nor its links */
	assert_int_equal(scan(&info, NULL), 0);
	assert_int_equal(info.entries, 4);	/* a.txt sub sub/deep sub/deep/b.txt */
	assert_int_equal(info.bytes, 8);
}

/* Each forbidden kind, at the top and deep, is refused by name. */
static void refuses_links_and_special_files(void **state)
{
	(void)state;
	static const char *const places[] = { "pub/bad", "pub/sub/deep/bad" };
	for (size_t i = 0; i < 2; i++) {
		_cleanup_free_ char *p = at(places[i]);
		const char *rel = places[i] + 4;
		struct cap_projection_info info;
		struct cap_err err = { 0 };

		assert_int_equal(symlink("/etc/passwd", p), 0);
		assert_int_equal(scan(&info, &err), -EPERM);
		assert_non_null(strstr(err.msg, rel));
		assert_non_null(strstr(err.msg, "symbolic link"));
		unlink(p);

		assert_int_equal(symlink(p, p), 0);	/* a loop */
		assert_int_equal(scan(&info, &err), -EPERM);
		assert_non_null(strstr(err.msg, rel));
		unlink(p);

		_cleanup_free_ char *a = at("pub/a.txt");
		assert_int_equal(link(a, p), 0);
		assert_int_equal(scan(&info, &err), -EPERM);
		assert_non_null(strstr(err.msg, "hard-linked"));
		unlink(p);

		assert_int_equal(mkfifo(p, 0600), 0);
		assert_int_equal(scan(&info, &err), -EPERM);
		assert_non_null(strstr(err.msg, rel));
		assert_non_null(strstr(err.msg, "FIFO"));
		unlink(p);
	}
}

static void caps_name_the_cap_and_the_size(void **state)
{
	(void)state;
	struct cap_projection_info info;
	struct cap_err err = { 0 };
	struct cap_projection_limits saved = lim;
	lim.max_entries = 4;	/* exactly the tree: fine */
	assert_int_equal(scan(&info, &err), 0);
	put("pub/one-more", "");
	assert_int_equal(scan(&info, &err), -EFBIG);
	assert_non_null(strstr(err.msg, "5 entries"));
	assert_non_null(strstr(err.msg, "cap of 4"));
	lim = saved;
	lim.max_bytes = 7;
	assert_int_equal(scan(&info, &err), -EFBIG);
	assert_non_null(strstr(err.msg, "8 bytes"));
	assert_non_null(strstr(err.msg, "cap of 7"));
	lim = saved;
}

static void fingerprint_follows_changes_only(void **state)
{
	(void)state;
	struct cap_projection_info a, b, c;
	assert_int_equal(scan(&a, NULL), 0);
	assert_int_equal(scan(&b, NULL), 0);
	assert_string_equal(a.fingerprint, b.fingerprint);
	put("pub/node_modules/x/new.js", "ignored\n");	/* excluded: no change */
	assert_int_equal(scan(&b, NULL), 0);
	assert_string_equal(a.fingerprint, b.fingerprint);
	put("pub/a.txt", "ho\n");	/* same size, new content */
	assert_int_equal(scan(&c, NULL), 0);
	assert_string_not_equal(a.fingerprint, c.fingerprint);
}

static void build_makes_an_image(void **state)
{
	(void)state;
	struct cap_projection_info info;
	_cleanup_free_ char *pub = at("pub"), *img = at("out.erofs");
	assert_int_equal(cap_projection_build(pub, &lim, img, &info, NULL), 0);
	struct stat st;
	assert_int_equal(stat(img, &st), 0);
	assert_true(st.st_size > 0);
	assert_int_equal(info.entries, 4);
}

/* A relative path of exactly len bytes made of names of at most comp
 * bytes (letters from first on), under pub/; its last name becomes a
 * file. New string. */
static char *long_path(size_t len, size_t comp, char first)
{
	char *rel = xmalloc(len + 1);
	size_t at = 0;
	for (int k = 0; at < len; k++) {
		size_t n = CAP_MIN(comp, len - at);
		if (len - at - n == 1)	/* no room for "/" and a name */
			n--;
		memset(rel + at, first + k % 20, n);
		at += n;
		if (at < len)
			rel[at++] = '/';
	}
	rel[len] = '\0';
	_cleanup_free_ char *in = xasprintf("pub/%s", rel);
	put(in, "x");
	return rel;
}

static void remove_under_pub(const char *rel)
{
	_cleanup_free_ char *first = xstrndup(rel, strcspn(rel, "/"));
	_cleanup_free_ char *p = xasprintf("%s/pub/%s", top, first);
	assert_int_equal(cap_remove_tree(p), 0);
}

/* What mkfs.erofs cannot take is refused by the scan, naming the path
 * and the limit; the limit itself passes. */
static void scan_refuses_what_the_image_cannot_hold(void **state)
{
	(void)state;
	struct cap_projection_info info;
	struct cap_err err = { 0 };
	struct cap_projection_limits saved = lim;
	lim.max_entries = 1000;	/* the deep trees below */
	char name[256];
	memset(name, 'n', 255);
	name[255] = '\0';
	_cleanup_free_ char *file255 = xasprintf("pub/sub/%s", name);
	put(file255, "x");
	assert_int_equal(scan(&info, &err), -ENAMETOOLONG);
	assert_non_null(strstr(err.msg, file255 + 4));
	assert_non_null(strstr(err.msg, "a name of 255 bytes, over the limit of 254 bytes"));
	_cleanup_free_ char *p = at(file255);
	unlink(p);
	name[254] = '\0';
	_cleanup_free_ char *dir254 = xasprintf("pub/%s/x", name);
	put(dir254, "x");
	assert_int_equal(scan(&info, &err), 0);
	remove_under_pub(name);

	_cleanup_free_ char *longest = long_path(CAP_PROJECTION_PATH_MAX, 200, 'a');
	assert_int_equal(scan(&info, &err), 0);
	remove_under_pub(longest);
	_cleanup_free_ char *over = long_path(CAP_PROJECTION_PATH_MAX + 1, 200, 'a');
	assert_int_equal(scan(&info, &err), -ENAMETOOLONG);
	assert_non_null(strstr(err.msg, "a path of 3073 bytes, over the limit of 3072 bytes"));
	assert_non_null(strstr(err.msg, "[... "));	/* shortened */
	assert_true(strncmp(err.msg, "public data aaaa", 16) == 0);
	remove_under_pub(over);

	_cleanup_free_ char *deepest = long_path(2 * CAP_PROJECTION_DEPTH_MAX - 1, 1, 'a');
	assert_int_equal(scan(&info, &err), 0);
	remove_under_pub(deepest);
	_cleanup_free_ char *deeper = long_path(2 * CAP_PROJECTION_DEPTH_MAX + 1, 1, 'a');
	(void)deeper;	/* made for the scan; freed at the end */
	assert_int_equal(scan(&info, &err), -ENAMETOOLONG);
	assert_non_null(strstr(err.msg, "is 129 levels deep, over the limit of 128 levels"));
	lim = saved;
}

/* The longest name and path the scan passes build; the image is 0600; a
 * staging directory too long for the tree is named before mkfs.erofs. */
static void build_takes_what_the_scan_passes(void **state)
{
	(void)state;
	struct cap_projection_info info;
	struct cap_err err = { 0 };
	char name[255];
	memset(name, 'n', 254);
	name[254] = '\0';
	_cleanup_free_ char *file254 = xasprintf("pub/%s", name);
	put(file254, "x");
	_cleanup_free_ char *longest = long_path(CAP_PROJECTION_PATH_MAX, 200, 'a');
	(void)longest;	/* made for the build; freed at the end */
	_cleanup_free_ char *pub = at("pub"), *img = at("out.erofs");
	mode_t old = umask(022);
	int r = cap_projection_build(pub, &lim, img, &info, &err);
	umask(old);
	assert_int_equal(r, 0);
	struct stat st;
	assert_int_equal(stat(img, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);

	/* Destination deep enough that its staging path and the tree's
	 * longest path are over 4095 bytes together. */
	_cleanup_free_ char *deep = long_path(1100, 200, 'D');
	remove_under_pub(deep);
	_cleanup_free_ char *dest = xasprintf("%s/dest/%s", top, deep);
	assert_int_equal(cap_mkdir_p(dest, 0755), 0);
	_cleanup_free_ char *img2 = xasprintf("%s/out.erofs", dest);
	assert_int_equal(cap_projection_build(pub, &lim, img2, &info, &err), -ENAMETOOLONG);
	assert_non_null(strstr(err.msg, "the erofs image builder takes"));
	assert_int_equal(access(img2, F_OK), -1);
}

/* Swaps done between validation and copy. */
static void swap_file_for_symlink(void *ud)
{
	(void)ud;
	_cleanup_free_ char *p = at("pub/sub/deep/b.txt");
	unlink(p);
	assert_int_equal(symlink("/etc/passwd", p), 0);
}

static void swap_dir_for_symlink(void *ud)
{
	(void)ud;
	_cleanup_free_ char *d = at("pub/sub/deep"), *moved = at("elsewhere");
	assert_int_equal(rename(d, moved), 0);
	assert_int_equal(symlink(moved, d), 0);
}

static void grow_file(void *ud)
{
	(void)ud;
	put("pub/a.txt", "hi and more\n");
}

static void copy_refuses_what_changed_after_validation(void **state)
{
	(void)state;
	void (*swaps[])(void *) = { swap_file_for_symlink, swap_dir_for_symlink, grow_file };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(swaps); i++) {
		teardown(NULL);
		setup(NULL);
		struct cap_projection_info info;
		struct cap_err err = { 0 };
		_cleanup_free_ char *pub = at("pub"), *img = at("out.erofs");
		assert_int_equal(cap_projection_build_hook(pub, &lim, img, &info, swaps[i], NULL, &err), -ESTALE);
		assert_non_null(strstr(err.msg, "changed while it was copied"));
		assert_int_equal(access(img, F_OK), -1);	/* nothing produced */
	}
}

#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)

int main(void)
{
	const struct CMUnitTest tests[] = {
		T(counts_and_excludes_node_modules),
		T(refuses_links_and_special_files),
		T(caps_name_the_cap_and_the_size),
		T(fingerprint_follows_changes_only),
		T(build_makes_an_image),
		T(scan_refuses_what_the_image_cannot_hold),
		T(build_takes_what_the_scan_passes),
		T(copy_refuses_what_changed_after_validation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
