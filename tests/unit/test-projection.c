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
		T(copy_refuses_what_changed_after_validation),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
