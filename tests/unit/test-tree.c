/* Manifests and merges: scanning host trees (and the strict rules), the
 * text form against hostile input, diffs, three-way plans, and applying
 * them beneath a directory without following planted links, across
 * crashes and in increments. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>
#include <cmocka.h>

#include "paths.h"
#include "tree.h"
#include "util.h"

static char top[] = "/tmp/capsule-tree-XXXXXX";

static char *at(const char *rel) { return xasprintf("%s/%s", top, rel); }

static void mkd(const char *rel)
{
	_cleanup_free_ char *p = at(rel);
	assert_int_equal(cap_mkdir_p(p, 0755), 0);
}

static void put_mode(const char *rel, const char *data, size_t len, mode_t mode)
{
	_cleanup_free_ char *p = at(rel);
	_cleanup_free_ char *d = xstrdup(p);
	*strrchr(d, '/') = '\0';
	assert_int_equal(cap_mkdir_p(d, 0755), 0);
	unlink(p);
	int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(cap_write_all(fd, data, len), 0);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

static void put(const char *rel, const char *text) { put_mode(rel, text, strlen(text), 0644); }

static void lnk(const char *rel, const char *target)
{
	_cleanup_free_ char *p = at(rel);
	unlink(p);
	assert_int_equal(symlink(target, p), 0);
}

static void rm(const char *rel)
{
	_cleanup_free_ char *p = at(rel);
	_cleanup_free_ char *cmd = xasprintf("chmod -R u+rwx '%s' 2>/dev/null; true", p);
	assert_int_equal(system(cmd), 0);
	assert_int_equal(cap_remove_tree(p), 0);
}

static char *slurp(const char *rel)
{
	_cleanup_free_ char *p = at(rel);
	char *s = NULL;
	assert_true(cap_read_file(p, 1 << 20, &s) >= 0);
	return s;
}

static void cp_tree(const char *from, const char *to)
{
	_cleanup_free_ char *cmd = xasprintf("chmod -R u+rwx '%s/%s' 2>/dev/null; rm -rf '%s/%s' && cp -a '%s/%s' '%s/%s'",
					     top, to, top, to, top, from, top, to);
	assert_int_equal(system(cmd), 0);
}

static int scan_opts(const char *rel, const struct cap_tree_scan_opts *o, struct cap_tree *t,
		     struct cap_err *err)
{
	_cleanup_free_ char *p = at(rel);
	return cap_tree_scan(p, o, t, err);
}

/* As a merge looks at the host (skipping its staging directory). */
static void scan(const char *rel, struct cap_tree *t)
{
	struct cap_tree_scan_opts o = { .skip_prefix = CAP_MERGE_STAGE_PREFIX };
	struct cap_err err = { 0 };
	int r = scan_opts(rel, &o, t, &err);
	if (r < 0)
		fail_msg("scan %s: %s", rel, err.msg);
}

/* As the guest sees its tree (what it sends as theirs). */
static void scan_all(const char *rel, struct cap_tree *t)
{
	struct cap_tree_scan_opts o = { 0 };
	struct cap_err err = { 0 };
	int r = scan_opts(rel, &o, t, &err);
	if (r < 0)
		fail_msg("scan %s: %s", rel, err.msg);
}

static void assert_trees_equal(const struct cap_tree *a, const struct cap_tree *b)
{
	for (size_t i = 0; i < CAP_MIN(a->n, b->n); i++) {
		const struct cap_tree_entry *x = &a->v[i], *y = &b->v[i];
		if (strcmp(x->path, y->path) != 0 || !cap_tree_entry_same(x, y) || x->size != y->size ||
		    (x->target == NULL) != (y->target == NULL) || (x->target && strcmp(x->target, y->target)))
			fail_msg("trees differ at %s (%c %o) / %s (%c %o)", x->path, x->type, x->mode,
				 y->path, y->type, y->mode);
	}
	assert_int_equal(a->n, b->n);
	assert_int_equal(a->bytes, b->bytes);
}

static int setup(void **state)
{
	(void)state;
	return mkdtemp(top) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	_cleanup_free_ char *cmd = xasprintf("chmod -R u+rwx '%s' 2>/dev/null", top);
	if (system(cmd) < 0)
		return -1;
	cap_remove_tree(top);
	strcpy(top, "/tmp/capsule-tree-XXXXXX");
	return 0;
}

/* --- scanning ------------------------------------------------------------- */

static void test_scan(void **state)
{
	(void)state;
	put("t/a.txt", "hi\n");
	put_mode("t/run.sh", "#!/bin/sh\n", 10, 0755);
	put("t/sub/deep/b.txt", "deep\n");
	put("t/a b", "space\n");	/* ' ' < '/': sorts between "a" and "a/..." */
	put("t/a-x/c", "c\n");
	mkd("t/a");
	put("t/a/z", "z\n");
	lnk("t/sub/up", "../a.txt");
	lnk("t/sub/deep/dot", "./b.txt");
	_cleanup_free_ char *h1 = at("t/a.txt"), *h2 = at("t/hard");
	assert_int_equal(link(h1, h2), 0);
	mkd("t/.capsule-merge.x");
	put("t/.capsule-merge.x/0", "staged\n");
	put("t/sub/.capsule-merge.y", "not at the top\n");

	struct cap_tree t;
	scan("t", &t);
	const char *sorted[] = { "a", "a b", "a-x", "a-x/c", "a.txt", "a/z", "hard", "run.sh", "sub",
				 "sub/.capsule-merge.y", "sub/deep", "sub/deep/b.txt", "sub/deep/dot", "sub/up" };
	assert_int_equal(t.n, CAP_ARRAY_SIZE(sorted));
	for (size_t i = 0; i < t.n; i++)
		assert_string_equal(t.v[i].path, sorted[i]);
	const struct cap_tree_entry *a = cap_tree_find(&t, "a.txt"), *h = cap_tree_find(&t, "hard");
	assert_non_null(a);
	assert_int_equal(a->type, CAP_TREE_FILE);
	assert_int_equal(a->size, 3);
	assert_int_equal(a->mode, 0644);
	/* sha256("hi\n") */
	static const uint8_t hi[4] = { 0x98, 0xea, 0x6e, 0x4f };
	assert_memory_equal(a->hash, hi, 4);
	assert_true(cap_tree_entry_same(a, h));
	assert_int_equal(cap_tree_find(&t, "run.sh")->mode, 0755);
	const struct cap_tree_entry *up = cap_tree_find(&t, "sub/up");
	assert_int_equal(up->type, CAP_TREE_LINK);
	assert_string_equal(up->target, "../a.txt");
	assert_int_equal(up->size, 8);
	assert_int_equal(cap_tree_find(&t, "sub")->type, CAP_TREE_DIR);
	assert_null(cap_tree_find(&t, "nope"));
	assert_int_equal(t.bytes, 3 + 10 + 5 + 6 + 2 + 2 + 3 + 15);
	cap_tree_fini(&t);
}

static void expect_refusal(const char *dir, bool strict, int code, const char *what, const char *path)
{
	struct cap_tree_scan_opts o = { .strict = strict };
	struct cap_err err = { 0 };
	struct cap_tree t = { .n = 42 };
	assert_int_equal(scan_opts(dir, &o, &t, &err), -code);
	assert_int_equal(t.n, 42);	/* untouched */
	if (!strstr(err.msg, what) || !strstr(err.msg, path))
		fail_msg("message \"%s\" lacks \"%s\" or \"%s\"", err.msg, what, path);
}

static void test_scan_strict(void **state)
{
	(void)state;
	put("abs/ok.txt", "ok\n");
	lnk("abs/etc", "/etc/passwd");
	expect_refusal("abs", true, EINVAL, "remove it or replace it", "abs/etc");
	put("esc/sub/f", "f\n");
	lnk("esc/sub/out", "../../x");
	expect_refusal("esc", true, EINVAL, "leaves the tree", "esc/sub/out");
	mkd("fifo/d");
	_cleanup_free_ char *fp = at("fifo/d/pipe");
	assert_int_equal(mkfifo(fp, 0644), 0);
	expect_refusal("fifo", true, EINVAL, "a FIFO", "fifo/d/pipe");
	mkd("sock");
	_cleanup_free_ char *sp = at("sock/s");
	int s = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_un sun = { .sun_family = AF_UNIX };
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", sp);
	assert_int_equal(bind(s, (struct sockaddr *)&sun, sizeof(sun)), 0);
	close(s);
	expect_refusal("sock", true, EINVAL, "a socket", "sock/s");

	/* Not strict: listed. */
	struct cap_tree t;
	scan("abs", &t);
	assert_string_equal(cap_tree_find(&t, "etc")->target, "/etc/passwd");
	cap_tree_fini(&t);
	scan("fifo", &t);
	assert_int_equal(cap_tree_find(&t, "d/pipe")->type, CAP_TREE_OTHER);
	cap_tree_fini(&t);

	/* Bounds, and the root itself. */
	struct cap_tree_scan_opts few = { .max_entries = 2 }, small = { .max_bytes = 4 };
	struct cap_err err = { 0 };
	put("big/a", "12");
	put("big/b", "345");
	put("big/c", "6");
	assert_int_equal(scan_opts("big", &few, &t, &err), -E2BIG);
	assert_non_null(strstr(err.msg, "big/c"));	/* walked in name order */
	assert_int_equal(scan_opts("big", &small, &t, &err), -EFBIG);
	assert_non_null(strstr(err.msg, "big/b"));
	assert_int_equal(scan_opts("missing", NULL, &t, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "missing"));
	assert_int_equal(scan_opts("big/a", NULL, &t, &err), -ENOTDIR);
	lnk("biglink", "big");
	assert_int_equal(scan_opts("biglink", NULL, &t, &err), -ELOOP);
}

static void test_link_inside(void **state)
{
	(void)state;
	assert_true(cap_tree_link_inside("a", "b"));
	assert_true(cap_tree_link_inside("d/a", "../b"));
	assert_true(cap_tree_link_inside("d/e/a", "../../b"));
	/* ".." after a descent is refused even when it stays inside on
	 * paper: "x" may be a link ("l -> ." and "m -> l/.." together
	 * reach the tree's parent). */
	assert_false(cap_tree_link_inside("a", "./x/../y"));
	assert_false(cap_tree_link_inside("m", "l/.."));
	assert_true(cap_tree_link_inside("l", "."));
	assert_true(cap_tree_link_inside("d/e/a", "./../b/c"));
	assert_true(cap_tree_link_inside("a", "x//y/"));
	assert_false(cap_tree_link_inside("a", "../x"));
	assert_false(cap_tree_link_inside("d/a", "../../x"));
	assert_false(cap_tree_link_inside("a", "/etc"));
	assert_false(cap_tree_link_inside("a", ""));
	assert_false(cap_tree_link_inside("a", "x/../../a"));	/* climbs out, then back */
	assert_false(cap_tree_link_inside("d/a", "x/../../../d"));
}

/* --- text form ------------------------------------------------------------ */

static void test_roundtrip(void **state)
{
	(void)state;
	put("rt/with space", "1\n");
	put("rt/new\nline", "2\n");
	put("rt/pct%41", "3\n");
	put("rt/\xc3\xbcnic\xc3\xb6" "de/\xe2\x9c\x93", "4\n");
	put("rt/tab\there/\x01\x7f", "");
	put_mode("rt/setgid", "x", 1, 02755);
	lnk("rt/l ink", "with space");
	lnk("rt/pl", "pct%41");
	struct cap_tree t, u;
	scan("rt", &t);
	struct cap_buf b;
	cap_buf_init(&b);
	cap_tree_format(&t, &b);
	const char *text = (const char *)cap_buf_head(&b);
	assert_non_null(strstr(text, "with%20space"));
	assert_non_null(strstr(text, "new%0Aline"));
	assert_non_null(strstr(text, "pct%2541"));
	assert_non_null(strstr(text, "tab%09here/%01%7F"));
	assert_non_null(strstr(text, "f 2755 1 "));
	assert_non_null(strstr(text, "d 0755 0 - tab%09here\n"));
	struct cap_err err = { 0 };
	int r = cap_tree_parse(text, cap_buf_used(&b), 0, &u, &err);
	if (r < 0)
		fail_msg("%s", err.msg);
	assert_trees_equal(&t, &u);
	assert_string_equal(cap_tree_find(&u, "l ink")->target, "with space");
	struct cap_buf b2;
	cap_buf_init(&b2);
	cap_tree_format(&u, &b2);
	assert_int_equal(cap_buf_used(&b), cap_buf_used(&b2));
	assert_memory_equal(cap_buf_head(&b), cap_buf_head(&b2), cap_buf_used(&b));

	/* Saved 0600 and loaded back. */
	_cleanup_free_ char *mf = at("manifest");
	assert_int_equal(cap_tree_save(mf, &u, &err), 0);
	struct stat st;
	assert_int_equal(stat(mf, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	struct cap_tree l;
	assert_int_equal(cap_tree_load(mf, &l, &err), 0);
	assert_trees_equal(&t, &l);
	_cleanup_free_ char *nomf = at("none");
	assert_int_equal(cap_tree_load(nomf, &l, &err), -ENOENT);
	assert_non_null(strstr(err.msg, nomf));
	cap_tree_fini(&l);
	cap_buf_fini(&b);
	cap_buf_fini(&b2);
	cap_tree_fini(&t);
	cap_tree_fini(&u);

	/* Empty text is an empty tree; the mode may be short. */
	assert_int_equal(cap_tree_parse("", 0, 0, &u, &err), 0);
	assert_int_equal(u.n, 0);
	const char *shortmode = "d 755 0 - a\n";
	assert_int_equal(cap_tree_parse(shortmode, strlen(shortmode), 0, &u, &err), 0);
	assert_int_equal(u.v[0].mode, 0755);
	cap_tree_fini(&u);
}

static void test_escape(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	cap_tree_escape("a b%\n\x7f\xc3\xa9", &b);
	assert_int_equal(cap_buf_used(&b), strlen("a%20b%25%0A%7F\xc3\xa9"));
	assert_memory_equal(cap_buf_head(&b), "a%20b%25%0A%7F\xc3\xa9", cap_buf_used(&b));
	cap_buf_fini(&b);
	char *s;
	assert_int_equal(cap_tree_unescape("a%20b%2fc", 9, &s), 0);
	assert_string_equal(s, "a b/c");
	free(s);
	assert_int_equal(cap_tree_unescape("%2", 2, &s), -EINVAL);
	assert_int_equal(cap_tree_unescape("%G0", 3, &s), -EINVAL);
	assert_int_equal(cap_tree_unescape("a b", 3, &s), -EINVAL);
	assert_int_equal(cap_tree_unescape("a\tb", 3, &s), -EINVAL);
}

#define HI "98ea6e4f216f2fb4b69fff9b3a44842c38686ca685f3f55dc48c5d3fb1107be4"	/* "hi\n" */

static void expect_bad(const char *text, size_t max, const char *line)
{
	struct cap_tree t = { .n = 7 };
	struct cap_err err = { 0 };
	int r = cap_tree_parse(text, strlen(text), max, &t, &err);
	if (r != -EBADMSG)
		fail_msg("parsed: %s", text);
	assert_int_equal(t.n, 7);
	if (!strstr(err.msg, line))
		fail_msg("message \"%s\" does not name %s", err.msg, line);
}

static void test_parse_refusals(void **state)
{
	(void)state;
	/* The hash of a link's target "x" is checked too. */
	char linkx[256];
	uint8_t h[32];
	int p[2];
	assert_int_equal(pipe(p), 0);
	assert_int_equal(write(p[1], "x", 1), 1);
	close(p[1]);
	uint64_t n;
	assert_int_equal(cap_tree_hash_fd(p[0], h, &n), 0);
	close(p[0]);
	struct cap_tree_entry e = { .path = "l", .target = "x", .type = 'l', .mode = 0777, .size = 1 };
	memcpy(e.hash, h, 32);
	struct cap_buf b;
	cap_buf_init(&b);
	cap_tree_format_entry(&e, &b);
	snprintf(linkx, sizeof(linkx), "%.*s", (int)cap_buf_used(&b), (const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	struct cap_tree t;
	struct cap_err err;
	assert_int_equal(cap_tree_parse(linkx, strlen(linkx), 0, &t, &err), 0);
	cap_tree_fini(&t);

	expect_bad("f 0644 3 " HI " b\nf 0644 3 " HI " a\n", 0, "line 2");	/* unsorted */
	expect_bad("f 0644 3 " HI " a\nf 0644 3 " HI " a\n", 0, "line 2");	/* duplicate */
	expect_bad("f 0644 3 " HI " d/a\n", 0, "line 1");	/* no parent */
	expect_bad("f 0644 3 " HI " d\nf 0644 3 " HI " d/a\n", 0, "line 2");	/* parent not a dir */
	expect_bad("d 0755 0 - d\nf 0644 3 " HI " d/%G0\n", 0, "line 2");	/* bad escape */
	expect_bad("f 0644 3 " HI " a%2\n", 0, "line 1");
	expect_bad("f 0644 3 98EA6E4F216F2FB4B69FFF9B3A44842C38686CA685F3F55DC48C5D3FB1107BE4 a\n", 0, "line 1");
	expect_bad("f 0644 3 " HI "0 a\n", 0, "line 1");	/* 65 digits */
	expect_bad("f 0644 3 - a\n", 0, "line 1");
	expect_bad("d 0755 0 " HI " a\n", 0, "line 1");
	expect_bad("d 0755 3 - a\n", 0, "line 1");
	expect_bad("f 10000 3 " HI " a\n", 0, "line 1");	/* mode over 07777 */
	expect_bad("f 0648 3 " HI " a\n", 0, "line 1");
	expect_bad("f 0644 03 " HI " a\n", 0, "line 1");
	expect_bad("f 0644 99999999999999999999 " HI " a\n", 0, "line 1");
	expect_bad("d 0755 0 - a\nd 0755 0 - b\n", 1, "line 2");	/* too many */
	expect_bad("d 0755 0 - a\nd 0755 0 - a/..\n", 0, "line 2");
	expect_bad("f 0644 3 " HI " ..\n", 0, "line 1");
	expect_bad("f 0644 3 " HI " /etc/passwd\n", 0, "line 1");
	expect_bad("f 0644 3 " HI " a%2Fb\n", 0, "line 1");	/* "a/b": parent a missing */
	expect_bad("f 0644 3 " HI " a%00b\n", 0, "line 1");
	expect_bad("d 0755 0 - a\nd 0755 0 - a//b\n", 0, "line 2");
	expect_bad("d 0755 0 - a\nf 0644 3 " HI " b", 0, "line 2");	/* no newline at the end */
	expect_bad("d 0755 0 - a\n\n", 0, "line 2");
	expect_bad("d 0755 0 - a b\n", 0, "line 1");	/* extra field */
	expect_bad("d  0755 0 - a\n", 0, "line 1");
	expect_bad("x 0755 0 - a\n", 0, "line 1");
	expect_bad("l 0777 1 " HI " l x\n", 0, "line 1");	/* wrong hash for "x" */
	expect_bad("l 0777 1 " HI " l\n", 0, "line 1");	/* no target */
	char wrong_size[256];
	snprintf(wrong_size, sizeof(wrong_size), "l 0777 2 %.64s l x\n", linkx + 9);
	expect_bad(wrong_size, 0, "line 1");
	const char nul[] = "d 0755 0 - a\0\n";
	assert_int_equal(cap_tree_parse(nul, sizeof(nul) - 1, 0, &t, &err), -EBADMSG);
}

/* Feed a manifest of a directory "d" and files below it whose paths
 * take n_full * 4096 + last bytes, line by line as a guest's arrives. */
static int feed_names(size_t n_full, size_t last, struct cap_tree *t, struct cap_err *err)
{
	struct cap_tree_parser *p = cap_tree_parser_new(0);
	int r = cap_tree_parser_feed(p, "d 0755 0 - d\n", 13, err);
	_cleanup_free_ char *path = xmalloc(CAP_TREE_MAX_PATH + 1);
	for (size_t i = 0; i <= n_full && r == 0; i++) {
		size_t len = i < n_full ? CAP_TREE_MAX_PATH : last;
		snprintf(path, CAP_TREE_MAX_PATH + 1, "d/%07zu", i);
		memset(path + 9, 'x', len - 9);
		path[len] = 0;
		_cleanup_free_ char *line = xasprintf("f 0644 3 " HI " %s\n", path);
		/* in two pieces, as a stream may cut it anywhere */
		size_t half = strlen(line) / 2;
		r = cap_tree_parser_feed(p, line, half, err);
		if (r == 0)
			r = cap_tree_parser_feed(p, line + half, strlen(line) - half, err);
	}
	if (r == 0)
		r = cap_tree_parser_finish(p, t, err);
	cap_tree_parser_free(p);
	return r;
}

/* The paths and targets of one manifest are bounded (CAP_TREE_MAX_NAMES):
 * a guest's largest accepted manifest costs the host a few hundred MiB,
 * not 2 GiB. Exactly at the bound is taken; a byte over is refused,
 * naming the line and the limit. */
static void test_parse_names_cap(void **state)
{
	(void)state;
	size_t n_full = (CAP_TREE_MAX_NAMES - 1) / CAP_TREE_MAX_PATH;	/* 1: "d" */
	size_t last = CAP_TREE_MAX_NAMES - 1 - n_full * CAP_TREE_MAX_PATH;
	assert_true(last >= 16 && last < CAP_TREE_MAX_PATH);
	struct cap_tree t;
	struct cap_err err = { 0 };
	if (feed_names(n_full, last, &t, &err) != 0)
		fail_msg("at the bound: %s", err.msg);
	assert_int_equal(t.n, n_full + 2);
	cap_tree_fini(&t);
	struct cap_tree u = { .n = 7 };
	assert_int_equal(feed_names(n_full, last + 1, &u, &err), -EBADMSG);
	assert_int_equal(u.n, 7);
	_cleanup_free_ char *line = xasprintf("manifest line %zu ", n_full + 2);
	if (!strstr(err.msg, line) || !strstr(err.msg, "256 MiB") || !strstr(err.msg, "too large"))
		fail_msg("message \"%s\" does not name the line and the limit", err.msg);
	/* A line cut short at the end, and one over any line's length. */
	struct cap_tree_parser *p = cap_tree_parser_new(0);
	assert_int_equal(cap_tree_parser_feed(p, "d 0755 0 - a\nd 07", 17, &err), 0);
	assert_int_equal(cap_tree_parser_finish(p, &u, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "line 2 does not end with a newline"));
	cap_tree_parser_free(p);
	p = cap_tree_parser_new(0);
	_cleanup_free_ char *junk = xmalloc(CAP_TREE_MAX_LINE + 2);
	memset(junk, 'a', CAP_TREE_MAX_LINE + 1);
	assert_int_equal(cap_tree_parser_feed(p, junk, 100, &err), 0);
	assert_int_equal(cap_tree_parser_feed(p, junk, CAP_TREE_MAX_LINE + 1 - 100, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "line 1 is too long"));
	assert_int_equal(cap_tree_parser_feed(p, "\n", 1, &err), -EBADMSG);	/* and stays refused */
	cap_tree_parser_free(p);
}

/* --- diff ----------------------------------------------------------------- */

static void test_diff(void **state)
{
	(void)state;
	put("d1/same", "s\n");
	put("d1/mod", "old\n");
	put("d1/del", "gone\n");
	put("d1/mode", "m\n");
	put("d1/type", "t\n");
	cp_tree("d1", "d2");
	put("d2/mod", "new\n");
	rm("d2/del");
	_cleanup_free_ char *mp = at("d2/mode");
	assert_int_equal(chmod(mp, 0755), 0);
	rm("d2/type");
	put("d2/type/x", "x\n");
	put("d2/add", "a\n");
	struct cap_tree a, b;
	scan("d1", &a);
	scan("d2", &b);
	struct cap_tree_change *c;
	size_t n;
	assert_int_equal(cap_tree_diff(&a, &b, &c, &n), 0);
	struct { const char *path; enum cap_tree_change_kind k; } want[] = {
		{ "add", CAP_TREE_ADDED }, { "del", CAP_TREE_DELETED }, { "mod", CAP_TREE_MODIFIED },
		{ "mode", CAP_TREE_MODE }, { "type", CAP_TREE_TYPE }, { "type/x", CAP_TREE_ADDED },
	};
	assert_int_equal(n, CAP_ARRAY_SIZE(want));
	for (size_t i = 0; i < n; i++) {
		const struct cap_tree_entry *e = c[i].to ? c[i].to : c[i].from;
		assert_string_equal(e->path, want[i].path);
		assert_int_equal(c[i].kind, want[i].k);
	}
	assert_null(c[0].from);
	assert_null(c[1].to);
	assert_string_equal(cap_tree_change_name(CAP_TREE_MODE), "mode");
	assert_string_equal(cap_tree_change_name(CAP_TREE_ADDED), "added");
	free(c);
	assert_int_equal(cap_tree_diff(&a, &a, &c, &n), 0);
	assert_int_equal(n, 0);
	free(c);
	cap_tree_fini(&a);
	cap_tree_fini(&b);
}

/* --- merges --------------------------------------------------------------- */

/* base, ours and theirs as scanned trees of the directories of these
 * names. */
struct three {
	struct cap_tree b, o, t;
	struct cap_merge_plan p;
};

static void plan(struct three *x, const char *base, const char *ours, const char *theirs,
		 enum cap_merge_pick pick)
{
	struct cap_err err = { 0 };
	scan_all(base, &x->b);
	scan(ours, &x->o);
	scan_all(theirs, &x->t);
	assert_int_equal(cap_merge_plan(&x->b, &x->o, &x->t, pick, &x->p, &err), 0);
}

static void three_fini(struct three *x)
{
	cap_merge_plan_fini(&x->p);
	cap_tree_fini(&x->b);
	cap_tree_fini(&x->o);
	cap_tree_fini(&x->t);
}

/* The plan's ops as "ACTION path" lines. */
static char *ops_text(const struct cap_merge_plan *p)
{
	static const char *names[] = { "write", "link", "mkdir", "chmod", "remove" };
	struct cap_buf b;
	cap_buf_init(&b);
	for (size_t i = 0; i < p->nops; i++) {
		_cleanup_free_ char *l = xasprintf("%s %s\n", names[p->ops[i].action], p->ops[i].path);
		cap_buf_append(&b, l, strlen(l));
	}
	cap_buf_append(&b, "", 1);
	char *s = xstrdup((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	return s;
}

static void expect_ops(const struct cap_merge_plan *p, const char *want)
{
	_cleanup_free_ char *got = ops_text(p);
	if (strcmp(got, want) != 0)
		fail_msg("ops:\n%s\nwanted:\n%s", got, want);
}

static void expect_conflicts(const struct cap_merge_plan *p, const char *path, const char *why)
{
	if (!path) {
		if (p->nconflicts)
			fail_msg("unexpected conflict %s: %s", p->conflicts[0].path, p->conflicts[0].why);
		return;
	}
	assert_int_equal(p->nconflicts, 1);
	assert_string_equal(p->conflicts[0].path, path);
	if (!strstr(p->conflicts[0].why, why))
		fail_msg("why \"%s\" lacks \"%s\"", p->conflicts[0].why, why);
}

/* Plan b, o and t with pick: these ops and this conflict (NULL: none). */
static void one_plan(enum cap_merge_pick pick, const char *ops, const char *cpath, const char *why)
{
	struct three x = { 0 };
	plan(&x, "b", "o", "t", pick);
	expect_ops(&x.p, ops);
	expect_conflicts(&x.p, cpath, why);
	three_fini(&x);
}

static void start3(void)
{
	rm("b");
	rm("o");
	rm("t");
	put("b/f", "base\n");
	put("b/keep", "keep\n");
	mkd("b/d");
	put("b/d/x", "x\n");
	cp_tree("b", "o");
	cp_tree("b", "t");
}

static void test_plan_rules(void **state)
{
	(void)state;
	start3();
	one_plan(CAP_MERGE_REFUSE, "", NULL, NULL);

	put("t/f", "theirs\n");	/* only theirs changed */
	one_plan(CAP_MERGE_REFUSE, "write f\n", NULL, NULL);
	put("o/f", "ours\n");	/* both, differently */
	one_plan(CAP_MERGE_REFUSE, "", "f", "changed on both sides");
	one_plan(CAP_MERGE_THEIRS, "write f\n", NULL, NULL);
	one_plan(CAP_MERGE_OURS, "", NULL, NULL);
	put("o/f", "theirs\n");	/* both, identically */
	one_plan(CAP_MERGE_REFUSE, "", NULL, NULL);

	start3();
	rm("t/keep");	/* theirs deleted, host untouched */
	one_plan(CAP_MERGE_REFUSE, "remove keep\n", NULL, NULL);
	put("o/keep", "host edit\n");
	one_plan(CAP_MERGE_REFUSE, "", "keep", "deleted in the sandbox, changed on the host");

	start3();
	rm("o/keep");	/* host deleted, theirs unchanged */
	one_plan(CAP_MERGE_REFUSE, "", NULL, NULL);
	put("t/keep", "edited\n");
	one_plan(CAP_MERGE_REFUSE, "", "keep", "changed in the sandbox, deleted on the host");

	/* Inside .git (at any depth) nothing is ever written, whatever the
	 * pick: a repository's config and hooks would run on the host. */
	start3();
	put("b/.git/config", "[core]\n");
	put("o/.git/config", "[core]\n");
	put("t/.git/config", "[core]\n\tfsmonitor = /work/evil\n");
	put("t/.git/hooks/pre-commit", "#!/bin/sh\n");
	put("t/sub/.git/HEAD", "ref\n");
	put("t/.gitignore", "x\n");	/* not inside .git: merged */
	put("t/f", "theirs\n");
	for (int k = 0; k < 3; k++) {
		enum cap_merge_pick picks[] = { CAP_MERGE_REFUSE, CAP_MERGE_THEIRS, CAP_MERGE_OURS };
		struct three x = { 0 };
		plan(&x, "b", "o", "t", picks[k]);
		expect_ops(&x.p, "mkdir sub\nwrite .gitignore\nwrite f\n");
		expect_conflicts(&x.p, NULL, NULL);
		assert_int_equal(x.p.ngit, 5);	/* config, hooks, hooks/pre-commit, sub/.git, sub/.git/HEAD */
		three_fini(&x);
	}

	start3();
	lnk("t/out", "../../etc");	/* a link leaving the tree */
	one_plan(CAP_MERGE_REFUSE, "", "out", "a link that leaves the tree");
	one_plan(CAP_MERGE_THEIRS, "", "out", "a link that leaves the tree");
	one_plan(CAP_MERGE_OURS, "", NULL, NULL);
	rm("t/out");
	lnk("t/in", "d/x");
	_cleanup_free_ char *tf = at("t/f");
	assert_int_equal(chmod(tf, 0700), 0);
	one_plan(CAP_MERGE_REFUSE, "chmod f\nlink in\n", NULL, NULL);

	start3();
	put("t/.capsule-merge.w", "x\n");
	one_plan(CAP_MERGE_REFUSE, "", ".capsule-merge.w", "staging");
}

/* The repositories the plan names as left out, "PATH (why)" lines. */
static char *repos_text(const struct cap_merge_plan *p)
{
	struct cap_buf b;
	cap_buf_init(&b);
	for (size_t i = 0; i < p->nrepos; i++) {
		_cleanup_free_ char *l = xasprintf("%s (%s)\n", p->repos[i].path, p->repos[i].why);
		cap_buf_append(&b, l, strlen(l));
	}
	cap_buf_append(&b, "", 1);
	char *s = xstrdup((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	return s;
}

/* A directory shaped like a bare repository (HEAD, objects, refs, and a
 * config git would honour) is left out as .git is, whatever the pick, on
 * either side, and named; so is a .git file, and everything when the top
 * itself takes that shape. */
static void test_plan_nested_repos(void **state)
{
	(void)state;
	enum cap_merge_pick picks[] = { CAP_MERGE_REFUSE, CAP_MERGE_THEIRS, CAP_MERGE_OURS };
	start3();
	put("t/evil/HEAD", "ref: refs/heads/main\n");
	put("t/evil/config", "[core]\n\tfsmonitor = /work/evil\n");
	mkd("t/evil/objects");
	mkd("t/evil/refs/heads");
	put("t/wt/HEAD", "ref: refs/heads/main\n");	/* a worktree's: commondir */
	put("t/wt/commondir", "../evil\n");
	put("t/wt/config", "x\n");
	put("t/sub/.git", "gitdir: ../evil\n");	/* a .git file */
	put("t/sub/code.c", "int x;\n");
	put("t/notrepo/HEAD", "just a file named HEAD\n");	/* no objects, refs */
	mkd("t/notrepo/objects");
	put("t/f", "theirs\n");
	for (int k = 0; k < 3; k++) {
		struct three x = { 0 };
		plan(&x, "b", "o", "t", picks[k]);
		expect_ops(&x.p, "mkdir notrepo\nmkdir notrepo/objects\nmkdir sub\nwrite f\nwrite notrepo/HEAD\nwrite sub/code.c\n");
		expect_conflicts(&x.p, NULL, NULL);
		/* evil and its 5 entries, sub/.git, wt and its 3 */
		assert_int_equal(x.p.ngit, 6 + 1 + 4);
		_cleanup_free_ char *got = repos_text(&x.p);
		assert_string_equal(got, "evil (shaped like a git repository (HEAD, objects, refs))\n"
					 "sub/.git (a .git)\n"
					 "wt (shaped like a git repository (HEAD, objects, refs))\n");
		for (size_t i = 0; i < x.p.nops; i++)
			assert_null(strstr(x.p.ops[i].path, "evil"));
		three_fini(&x);
	}

	/* The host's half of the shape counts: the sandbox adds HEAD and a
	 * config to a directory that has objects and refs on the host. */
	start3();
	mkd("o/half/objects");
	mkd("o/half/refs");
	mkd("t/half");
	put("t/half/HEAD", "ref: refs/heads/main\n");
	put("t/half/config", "[core]\n\thooksPath = /work\n");
	one_plan(CAP_MERGE_THEIRS, "", NULL, NULL);

	/* A repository on the host: the sandbox deleting it is left out. */
	start3();
	put("b/repo.git/HEAD", "ref: refs/heads/main\n");
	mkd("b/repo.git/objects");
	mkd("b/repo.git/refs");
	cp_tree("b", "o");
	cp_tree("b", "t");
	rm("t/repo.git");
	put("t/f", "theirs\n");
	one_plan(CAP_MERGE_REFUSE, "write f\n", NULL, NULL);

	/* The sandbox removes a directory holding the host's repository:
	 * whatever the pick, the repository and its directory stay. */
	start3();
	put("b/sub/.git/config", "[core]\n");
	put("b/sub/code.c", "x\n");
	cp_tree("b", "o");
	cp_tree("b", "t");
	rm("t/sub");
	for (int k = 0; k < 3; k++) {
		struct three y = { 0 };
		plan(&y, "b", "o", "t", picks[k]);
		expect_ops(&y.p, "remove sub/code.c\n");
		expect_conflicts(&y.p, NULL, NULL);
		three_fini(&y);
	}

	/* The same with a .git the host alone made (in neither base nor
	 * theirs): --theirs had removed it with the directory (found by
	 * fuzz-merge-plan). The conflict on the host's own file is settled;
	 * the repository and its directory stay. */
	start3();
	put("b/sub/code.c", "x\n");
	cp_tree("b", "o");
	cp_tree("b", "t");
	put("o/sub/.git/config", "[core]\n");
	rm("t/sub");
	one_plan(CAP_MERGE_THEIRS, "remove sub/code.c\n", NULL, NULL);

	/* The top of the sandbox's tree shaped like a bare repository:
	 * nothing of theirs is written. */
	start3();
	put("t/HEAD", "ref: refs/heads/main\n");
	mkd("t/objects");
	mkd("t/refs");
	put("t/config", "[core]\n\tfsmonitor = /work/evil\n");
	put("t/f", "theirs\n");
	struct three x = { 0 };
	plan(&x, "b", "o", "t", CAP_MERGE_THEIRS);
	expect_ops(&x.p, "");
	assert_int_equal(x.p.ngit, 5);
	_cleanup_free_ char *got = repos_text(&x.p);
	assert_string_equal(got, " (the top of the tree is shaped like a git repository (HEAD, objects, refs))\n");
	three_fini(&x);
}

static void test_plan_types(void **state)
{
	(void)state;
	/* Theirs: a file becomes a directory, a directory becomes a file. */
	start3();
	rm("t/f");
	put("t/f/new", "n\n");
	put("t/f/sub/deeper", "n\n");
	rm("t/d");
	put("t/d", "now a file\n");
	one_plan(CAP_MERGE_REFUSE, "remove d/x\nremove f\nremove d\nmkdir f\nmkdir f/sub\nwrite d\nwrite f/new\nwrite f/sub/deeper\n",
		 NULL, NULL);

	/* The host changed the file theirs made a directory: a conflict. */
	put("o/f", "host edit\n");
	one_plan(CAP_MERGE_REFUSE, "remove d/x\nremove d\nwrite d\n", "f", "changed on both sides");
	one_plan(CAP_MERGE_THEIRS, "remove d/x\nremove f\nremove d\nmkdir f\nmkdir f/sub\nwrite d\nwrite f/new\nwrite f/sub/deeper\n",
		 NULL, NULL);
	one_plan(CAP_MERGE_OURS, "remove d/x\nremove d\nwrite d\n", NULL, NULL);

	/* A directory theirs deleted where the host added a file stays. */
	start3();
	rm("t/d");
	put("o/d/hostnew", "h\n");
	one_plan(CAP_MERGE_REFUSE, "remove d/x\n", "d/hostnew", "directory the sandbox removed");
	one_plan(CAP_MERGE_OURS, "remove d/x\n", NULL, NULL);
	one_plan(CAP_MERGE_THEIRS, "remove d/hostnew\nremove d/x\nremove d\n", NULL, NULL);

	/* Theirs adds below a directory the host removed. */
	start3();
	rm("o/d");
	put("t/d/y", "y\n");
	one_plan(CAP_MERGE_REFUSE, "", "d/y", "directory the host removed");
	one_plan(CAP_MERGE_THEIRS, "mkdir d\nwrite d/y\n", NULL, NULL);
	one_plan(CAP_MERGE_OURS, "", NULL, NULL);

	/* The host deleted what theirs replaced by another type: theirs. */
	start3();
	rm("o/f");
	rm("t/f");
	mkd("t/f");
	one_plan(CAP_MERGE_REFUSE, "mkdir f\n", NULL, NULL);
}

/* --- applying ------------------------------------------------------------- */

/* Stage theirs' files for the plan's writes in ours/.capsule-merge.w. */
static int stage(const struct cap_merge_plan *p, int dirfd, const char *theirs)
{
	struct cap_err err = { 0 };
	int sfd = cap_merge_stage_open(dirfd, ".capsule-merge.w", &err);
	if (sfd < 0)
		fail_msg("%s", err.msg);
	for (size_t i = 0; i < p->nops; i++) {
		const struct cap_merge_op *op = &p->ops[i];
		if (op->action != CAP_MERGE_WRITE)
			continue;
		_cleanup_free_ char *from = xasprintf("%s/%s/%s", top, theirs, op->path);
		_cleanup_free_ char *data = NULL;
		ssize_t n = cap_read_file(from, 64 << 20, &data);
		assert_true(n >= 0);
		char name[24];
		cap_merge_stage_name(op->stage, name);
		int fd = openat(sfd, name, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
		assert_true(fd >= 0);
		assert_int_equal(cap_write_all(fd, data, (size_t)n), 0);
		close(fd);
		if (cap_merge_stage_verify(sfd, op, &err) < 0)
			fail_msg("%s", err.msg);
	}
	return sfd;
}

static int open_dir(const char *rel)
{
	_cleanup_free_ char *p = at(rel);
	int fd = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	assert_true(fd >= 0);
	return fd;
}

/* Run the first n ops of the plan (all: SIZE_MAX) into dir. */
static int apply_some(const struct cap_merge_plan *p, const char *dir, const char *theirs,
		      size_t n, struct cap_err *err)
{
	int dfd = open_dir(dir);
	int sfd = stage(p, dfd, theirs);
	struct cap_merge_plan part = *p;
	part.nops = CAP_MIN(n, p->nops);
	int r = cap_merge_apply(dfd, sfd, &part, err);
	close(sfd);
	if (r == 0 && n >= p->nops) {
		struct cap_err e2 = { 0 };
		assert_int_equal(cap_merge_stage_remove(dfd, ".capsule-merge.w", &e2), 0);
	}
	close(dfd);
	return r;
}

/* Merge theirs into ours against base, wholly; ours then equals theirs
 * when nothing conflicted on the host. */
static void merge(const char *base, const char *ours, const char *theirs, size_t cut)
{
	struct three x = { 0 };
	struct cap_err err = { 0 };
	plan(&x, base, ours, theirs, CAP_MERGE_REFUSE);
	expect_conflicts(&x.p, NULL, NULL);
	if (apply_some(&x.p, ours, theirs, cut, &err) < 0)
		fail_msg("%s", err.msg);
	three_fini(&x);
}

static void assert_dirs_equal(const char *a, const char *b)
{
	struct cap_tree x, y;
	scan(a, &x);
	scan(b, &y);
	assert_trees_equal(&x, &y);
	cap_tree_fini(&x);
	cap_tree_fini(&y);
}

/* A base and a theirs with every kind of change. */
static void start_apply(void)
{
	rm("b");
	rm("t");
	put("b/README.md", "hello\n");
	put("b/src/main.c", "int main(void) { return 0; }\n");
	put("b/src/old.c", "old\n");
	put_mode("b/run.sh", "#!/bin/sh\n", 10, 0644);
	put("b/doc/a.txt", "a\n");
	put("b/doc/deep/b.txt", "b\n");
	put("b/f2d", "file then dir\n");
	put("b/d2f/inner", "dir then file\n");
	put("b/modeonly", "m\n");
	lnk("b/link", "README.md");
	cp_tree("b", "t");
	put("t/README.md", "hello\nfix\n");
	rm("t/src/old.c");
	put("t/src/new dir/n e w.c", "new\n");
	char bin[4096];
	for (size_t i = 0; i < sizeof(bin); i++)
		bin[i] = (char)(i * 7 + 3);
	put_mode("t/bin/blob", bin, sizeof(bin), 0600);
	put_mode("t/empty", "", 0, 0444);
	_cleanup_free_ char *r = at("t/run.sh"), *m = at("t/modeonly");
	assert_int_equal(chmod(r, 0755), 0);
	assert_int_equal(chmod(m, 0600), 0);
	rm("t/doc");
	rm("t/f2d");
	put("t/f2d/x", "x\n");
	rm("t/d2f");
	put("t/d2f", "now a file\n");
	lnk("t/link", "src/main.c");
	lnk("t/src/new dir/up", "../../README.md");
	mkd("t/ro");
	put("t/ro/inside", "i\n");
	_cleanup_free_ char *ro = at("t/ro");
	assert_int_equal(chmod(ro, 0555), 0);
}

static void test_apply(void **state)
{
	(void)state;
	start_apply();
	cp_tree("b", "o");
	merge("b", "o", "t", SIZE_MAX);
	assert_dirs_equal("o", "t");
	_cleanup_free_ char *readme = slurp("o/README.md");
	assert_string_equal(readme, "hello\nfix\n");
	struct stat st;
	_cleanup_free_ char *link = at("o/link"), *stg = at("o/.capsule-merge.w");
	assert_int_equal(lstat(link, &st), 0);
	assert_true(S_ISLNK(st.st_mode));
	assert_int_equal(lstat(stg, &st), -1);	/* staging removed */

	/* Applying the same plan again (a re-run): nothing to do. */
	struct three x = { 0 };
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	assert_int_equal(x.p.nops, 0);
	three_fini(&x);
}

static void test_apply_rerun_same_plan(void **state)
{
	(void)state;
	start_apply();
	cp_tree("b", "o");
	struct three x = { 0 };
	struct cap_err err = { 0 };
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	int dfd = open_dir("o");
	int sfd = stage(&x.p, dfd, "t");
	assert_int_equal(cap_merge_apply(dfd, sfd, &x.p, &err), 0);
	/* The staged files are gone: a WRITE is done when the path holds
	 * theirs' content. */
	if (cap_merge_apply(dfd, sfd, &x.p, &err) < 0)
		fail_msg("%s", err.msg);
	close(sfd);
	assert_int_equal(cap_merge_stage_remove(dfd, ".capsule-merge.w", &err), 0);
	close(dfd);
	three_fini(&x);
	assert_dirs_equal("o", "t");
}

static void test_apply_planted_link(void **state)
{
	(void)state;
	start3();
	put("t/f", "theirs\n");
	put("t/d/new", "new\n");
	mkd("outside");
	struct three x = { 0 };
	struct cap_err err = { 0 };
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	expect_ops(&x.p, "write d/new\nwrite f\n");
	/* Planted after the merge looked. */
	rm("o/d");
	_cleanup_free_ char *out = at("outside");
	lnk("o/d", out);
	assert_int_equal(apply_some(&x.p, "o", "t", SIZE_MAX, &err), -ELOOP);
	assert_non_null(strstr(err.msg, "d/new"));
	assert_non_null(strstr(err.msg, "nothing was written"));
	_cleanup_free_ char *f = slurp("o/f");
	assert_string_equal(f, "base\n");	/* nothing written */
	struct cap_tree ot;
	scan("outside", &ot);
	assert_int_equal(ot.n, 0);	/* the target untouched */
	cap_tree_fini(&ot);
	three_fini(&x);

	/* Seen by the scan: a conflict, not a write through it. */
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	expect_conflicts(&x.p, "d/new", "directory the host removed or replaced");
	three_fini(&x);

	/* A link planted in place of a file after the plan: the host
	 * changed, so nothing is written (and the link is not followed). */
	start3();
	put("t/f", "theirs\n");
	put("outside/target", "keep\n");
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	_cleanup_free_ char *tgt = at("outside/target");
	lnk("o/f", tgt);
	assert_int_equal(apply_some(&x.p, "o", "t", SIZE_MAX, &err), -EAGAIN);
	assert_non_null(strstr(err.msg, "changed on the host"));
	_cleanup_free_ char *kept = slurp("outside/target");
	assert_string_equal(kept, "keep\n");
	three_fini(&x);
	/* Planned again it is a conflict; --theirs replaces the link itself. */
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	expect_conflicts(&x.p, "f", "both");
	three_fini(&x);
	plan(&x, "b", "o", "t", CAP_MERGE_THEIRS);
	assert_int_equal(apply_some(&x.p, "o", "t", SIZE_MAX, &err), 0);
	_cleanup_free_ char *kept2 = slurp("outside/target"), *nf = slurp("o/f");
	assert_string_equal(kept2, "keep\n");
	assert_string_equal(nf, "theirs\n");
	three_fini(&x);
}

/* A host file edited between the plan and the apply (while the merge
 * fetched the sandbox's copies): nothing is written, the edit is kept. */
static void test_apply_host_changed(void **state)
{
	(void)state;
	start3();
	put("t/f", "theirs\n");
	put("t/keep", "theirs keep\n");
	struct three x = { 0 };
	struct cap_err err = { 0 };
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	put("o/f", "edited on the host\n");
	assert_int_equal(apply_some(&x.p, "o", "t", SIZE_MAX, &err), -EAGAIN);
	assert_non_null(strstr(err.msg, "f: it changed on the host"));
	_cleanup_free_ char *f = slurp("o/f"), *k = slurp("o/keep");
	assert_string_equal(f, "edited on the host\n");
	assert_string_equal(k, "keep\n");	/* nothing else written either */
	three_fini(&x);
	/* A file added on the host where the plan adds one: the same. */
	start3();
	put("t/n", "theirs n\n");
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	put("o/n", "host n\n");
	assert_int_equal(apply_some(&x.p, "o", "t", SIZE_MAX, &err), -EAGAIN);
	_cleanup_free_ char *n = slurp("o/n");
	assert_string_equal(n, "host n\n");
	three_fini(&x);
}

static void test_crash(void **state)
{
	(void)state;
	start_apply();
	struct three x = { 0 };
	cp_tree("b", "o");
	plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
	size_t nops = x.p.nops;
	three_fini(&x);
	assert_true(nops > 10);
	/* Stop after every op in turn, then plan again from the same base
	 * and theirs with ours rescanned, and finish. */
	for (size_t cut = 0; cut <= nops; cut++) {
		struct cap_err err = { 0 };
		cp_tree("b", "o");
		plan(&x, "b", "o", "t", CAP_MERGE_REFUSE);
		if (apply_some(&x.p, "o", "t", cut, &err) < 0)
			fail_msg("cut %zu: %s", cut, err.msg);
		three_fini(&x);
		merge("b", "o", "t", SIZE_MAX);
		assert_dirs_equal("o", "t");
	}
}

static void test_second_merge(void **state)
{
	(void)state;
	start_apply();
	cp_tree("b", "o");
	merge("b", "o", "t", SIZE_MAX);
	/* The base is now theirs; the guest edits more, the host too. */
	cp_tree("t", "b2");
	put("t/README.md", "hello\nfix\nmore\n");
	put("t/src/another.c", "another\n");
	put("o/host-only.txt", "host\n");
	put("o/src/main.c", "int main(void) { return 1; }\n");
	struct three x = { 0 };
	plan(&x, "b2", "o", "t", CAP_MERGE_REFUSE);
	expect_ops(&x.p, "write README.md\nwrite src/another.c\n");
	expect_conflicts(&x.p, NULL, NULL);
	three_fini(&x);
	merge("b2", "o", "t", SIZE_MAX);
	_cleanup_free_ char *h = slurp("o/host-only.txt"), *m = slurp("o/src/main.c"), *r = slurp("o/README.md");
	assert_string_equal(h, "host\n");
	assert_string_equal(m, "int main(void) { return 1; }\n");
	assert_string_equal(r, "hello\nfix\nmore\n");
}

static void test_setid(void **state)
{
	(void)state;
	start3();
	put_mode("t/suid", "s\n", 2, 04755);
	cp_tree("o", "o0");
	merge("b", "o", "t", SIZE_MAX);
	struct stat st;
	_cleanup_free_ char *p = at("o/suid");
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755);	/* never set-id on the host */
	/* The next merge (base = theirs) sees no host change there. */
	struct three x = { 0 };
	plan(&x, "t", "o", "t", CAP_MERGE_REFUSE);
	assert_int_equal(x.p.nops, 0);
	three_fini(&x);
	cp_tree("t", "b2");
	put_mode("t/suid", "s2\n", 3, 04755);
	plan(&x, "b2", "o", "t", CAP_MERGE_REFUSE);
	expect_ops(&x.p, "write suid\n");
	expect_conflicts(&x.p, NULL, NULL);
	three_fini(&x);

	/* A plan with conflicts is not applied. */
	put("o0/suid", "host\n");
	plan(&x, "b", "o0", "t", CAP_MERGE_REFUSE);
	expect_conflicts(&x.p, "suid", "added on both sides");
	struct cap_err err = { 0 };
	int dfd = open_dir("o0");
	assert_int_equal(cap_merge_apply(dfd, dfd, &x.p, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "suid"));
	close(dfd);
	three_fini(&x);
}

static void test_stage(void **state)
{
	(void)state;
	mkd("s");
	int dfd = open_dir("s");
	struct cap_err err = { 0 };
	/* A stale staging directory a killed merge left is emptied. */
	put("s/.capsule-merge.w/0", "stale\n");
	put("s/.capsule-merge.w/17", "stale\n");
	lnk("s/.capsule-merge.w/l3", "x");
	int sfd = cap_merge_stage_open(dfd, ".capsule-merge.w", &err);
	assert_true(sfd >= 0);
	struct cap_tree t;
	scan("s/.capsule-merge.w", &t);
	assert_int_equal(t.n, 0);
	cap_tree_fini(&t);

	/* A staged file that is not what theirs' manifest says. */
	struct cap_tree_entry e = { .path = "p", .type = CAP_TREE_FILE, .mode = 0644, .size = 3 };
	memcpy(e.hash, (uint8_t[]){ 0x98, 0xea }, 2);
	struct cap_merge_op op = { .action = CAP_MERGE_WRITE, .path = "p", .theirs = &e };
	put("s/.capsule-merge.w/0", "hi\n");
	assert_int_equal(cap_merge_stage_verify(sfd, &op, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "p"));
	close(sfd);

	/* Anything else is refused by name. */
	put("s/.capsule-merge.w/junk", "mine\n");
	assert_int_equal(cap_merge_stage_open(dfd, ".capsule-merge.w", &err), -EEXIST);
	assert_non_null(strstr(err.msg, "junk"));
	assert_int_equal(cap_merge_stage_remove(dfd, ".capsule-merge.w", &err), -EEXIST);
	rm("s/.capsule-merge.w/junk");
	assert_int_equal(cap_merge_stage_remove(dfd, ".capsule-merge.w", &err), 0);
	assert_int_equal(cap_merge_stage_remove(dfd, ".capsule-merge.w", &err), 0);
	close(dfd);
}

int main(void)
{
	umask(022);
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_scan, setup, teardown),
		cmocka_unit_test_setup_teardown(test_scan_strict, setup, teardown),
		cmocka_unit_test(test_link_inside),
		cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
		cmocka_unit_test(test_escape),
		cmocka_unit_test(test_parse_refusals),
		cmocka_unit_test(test_parse_names_cap),
		cmocka_unit_test_setup_teardown(test_diff, setup, teardown),
		cmocka_unit_test_setup_teardown(test_plan_rules, setup, teardown),
		cmocka_unit_test_setup_teardown(test_plan_nested_repos, setup, teardown),
		cmocka_unit_test_setup_teardown(test_plan_types, setup, teardown),
		cmocka_unit_test_setup_teardown(test_apply, setup, teardown),
		cmocka_unit_test_setup_teardown(test_apply_rerun_same_plan, setup, teardown),
		cmocka_unit_test_setup_teardown(test_apply_planted_link, setup, teardown),
		cmocka_unit_test_setup_teardown(test_apply_host_changed, setup, teardown),
		cmocka_unit_test_setup_teardown(test_crash, setup, teardown),
		cmocka_unit_test_setup_teardown(test_second_merge, setup, teardown),
		cmocka_unit_test_setup_teardown(test_setid, setup, teardown),
		cmocka_unit_test_setup_teardown(test_stage, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
