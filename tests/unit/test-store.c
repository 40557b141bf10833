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
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"
#include "proc.h"
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
	char *home = xasprintf("%s/home", dir);
	setenv("CAPSULE_HOME", home, 1);
	free(home);
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

/* Write a tar with entries "path=content", "path->target" (symlink),
 * "path!c" (character device 1:3), "path!p" (FIFO) or "path/" (directory). */
static void make_tar(const char *path, const char *const *entries)
{
	struct archive *a = archive_write_new();
	archive_write_set_format_pax_restricted(a);
	assert_int_equal(archive_write_open_filename(a, path), ARCHIVE_OK);
	for (; *entries; entries++) {
		struct archive_entry *e = archive_entry_new();
		const char *eq = strchr(*entries, '='), *arrow = strstr(*entries, "->");
		const char *bang = strchr(*entries, '!');
		size_t n = strlen(*entries);
		char name[256];
		if (bang) {
			snprintf(name, sizeof(name), "%.*s", (int)(bang - *entries), *entries);
			archive_entry_set_filetype(e, bang[1] == 'c' ? AE_IFCHR : AE_IFIFO);
			archive_entry_set_rdevmajor(e, 1);
			archive_entry_set_rdevminor(e, 3);
		} else if (arrow) {
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
	assert_int_equal(cap_store_apply_layer(root, l1, NULL, NULL), 0);
	assert_int_equal(cap_store_apply_layer(root, l2, NULL, NULL), 0);
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
	assert_int_equal(cap_store_apply_layer(root, t1, NULL, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "a/../../escaped"));
	assert_false(exists(dir, "escaped"));

	/* A symlink cannot be used to write outside the root: libarchive
	 * replaces the symlink by a directory instead of following it. */
	_cleanup_free_ char *link = xasprintf("link->%s", outside);
	const char *const through[] = { link, "link/pwned=x", NULL };
	make_tar(t2, through);
	cap_store_apply_layer(root, t2, NULL, &err);
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
	cap_store_apply_layer(root3, t3, NULL, &err);
	assert_true(exists(outside, "victim"));
}

/* Item 7 of issue 17: a device node in an imported tar never reaches the
 * image; the import says what it left out. */
static void device_nodes_dropped(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_image img = { 0 };
	struct cap_import_report rep = { 0 };
	_cleanup_free_ char *t = in_dir("dev.tar"), *x = in_dir("x");
	const char *const entries[] = { "bin/", "bin/tool=tool", "dev/", "dev/kmem!c", "dev/mem!c", "run/", "run/fifo!p", NULL };
	make_tar(t, entries);
	struct cap_import_opts o = { .name = "devtest" };
	assert_int_equal(cap_store_image_import_with(t, &o, &img, &rep, &err), 0);
	assert_int_equal(rep.dropped, 3);
	assert_non_null(strstr(rep.shown, "/dev/kmem"));
	assert_non_null(strstr(rep.shown, "/run/fifo"));
	/* The image's tree: the file is there, the nodes are not. */
	mkdir(x, 0755);
	_cleanup_free_ char *arg = xasprintf("--extract=%s", x);
	char *argv[] = { "fsck.erofs", arg, img.owned_path, NULL };
	assert_int_equal(cap_run(argv, NULL, NULL, &err), 0);
	assert_true(exists(x, "bin/tool"));
	assert_true(exists(x, "dev"));
	assert_false(exists(x, "dev/kmem"));
	assert_false(exists(x, "dev/mem"));
	assert_false(exists(x, "run/fifo"));
	cap_image_fini(&img);

	/* A directory import leaves them out as well. */
	_cleanup_free_ char *tree = in_dir("tree"), *fifo = in_dir("tree/pipe"), *f = in_dir("tree/f");
	mkdir(tree, 0755);
	write_text(f, "f");
	assert_int_equal(mkfifo(fifo, 0644), 0);
	struct cap_import_report rep2 = { 0 };
	o.name = NULL;
	assert_int_equal(cap_store_image_import_with(tree, &o, &img, &rep2, &err), 0);
	assert_int_equal(rep2.dropped, 1);
	assert_string_equal(rep2.shown, "/pipe");
	cap_image_fini(&img);
}

static void references_normalized(void **state)
{
	(void)state;
	static const char *const cases[][2] = {
		{ "python:3.12-slim", "docker.io/library/python:3.12-slim" },
		{ "alpine", "docker.io/library/alpine:latest" },
		{ "org/img", "docker.io/org/img:latest" },
		{ "index.docker.io/library/busybox:1", "docker.io/library/busybox:1" },
		{ "127.0.0.1:5000/py:latest", "127.0.0.1:5000/py:latest" },
		{ "localhost/a/b", "localhost/a/b:latest" },
		{ "ghcr.io/org/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
		  "ghcr.io/org/img@sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef" },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cases); i++) {
		struct cap_image_ref r;
		assert_int_equal(cap_store_ref_parse(cases[i][0], &r, NULL), 0);
		assert_string_equal(r.owned_full, cases[i][1]);
		cap_image_ref_fini(&r);
	}
	static const char *const bad[] = { "", "UPPER/x", "a//b", "x:", "x@sha256:12", "a b", "-x" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		struct cap_image_ref r;
		struct cap_err err = { 0 };
		assert_int_equal(cap_store_ref_parse(bad[i], &r, &err), -EINVAL);
		assert_true(err.msg[0]);
	}
	struct cap_image_ref r;
	assert_int_equal(cap_store_ref_parse("[::1]:5000/x", &r, NULL), -EINVAL);
	assert_true(cap_store_ref_loopback("127.0.0.1"));
	assert_true(cap_store_ref_loopback("127.1.2.3"));
	assert_true(cap_store_ref_loopback("localhost"));
	assert_false(cap_store_ref_loopback("128.0.0.1"));
	assert_false(cap_store_ref_loopback("127.0.0.1.example.com"));
}

/* A reference finds its image, by tag and by REPO@OCI digest; pulled
 * again at other bytes it moves, and the old image keeps its digest. */
static void references_find_and_move(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_image a = { 0 }, b = { 0 }, f = { 0 };
	_cleanup_free_ char *t1 = in_dir("r1"), *t2 = in_dir("r2"), *f1 = in_dir("r1/one"), *f2 = in_dir("r2/two");
	mkdir(t1, 0755);
	mkdir(t2, 0755);
	write_text(f1, "1");
	write_text(f2, "2");
	const char *d1 = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
	const char *d2 = "sha256:2222222222222222222222222222222222222222222222222222222222222222";
	struct cap_import_opts o = { .reference = "127.0.0.1:5000/t:v", .oci_digest = d1 };
	assert_int_equal(cap_store_image_from_tree(t1, &o, &a, NULL, &err), 0);
	assert_string_equal(a.owned_reference, "127.0.0.1:5000/t:v");
	assert_string_equal(a.owned_oci_digest, d1);
	assert_int_equal(cap_store_image_find("127.0.0.1:5000/t:v", &f, &err), 0);
	assert_string_equal(f.digest, a.digest);
	cap_image_fini(&f);
	_cleanup_free_ char *pin1 = xasprintf("127.0.0.1:5000/t@%s", d1);
	assert_int_equal(cap_store_image_find(pin1, &f, &err), 0);
	assert_string_equal(f.digest, a.digest);
	cap_image_fini(&f);
	_cleanup_free_ char *other = xasprintf("127.0.0.1:5000/u@%s", d1);
	assert_int_equal(cap_store_image_find(other, &f, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "capsule image pull"));

	o.oci_digest = d2;
	assert_int_equal(cap_store_image_from_tree(t2, &o, &b, NULL, &err), 0);
	assert_string_not_equal(a.digest, b.digest);
	assert_int_equal(cap_store_image_find("127.0.0.1:5000/t:v", &f, &err), 0);
	assert_string_equal(f.digest, b.digest);	/* moved */
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find(a.digest, &f, &err), 0);
	assert_null(f.owned_reference);	/* no longer answers to the tag */
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find(pin1, &f, &err), 0);
	assert_string_equal(f.digest, a.digest);	/* the digest still pins */
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_remove("127.0.0.1:5000/t:v", NULL, NULL, &err), 0);
	assert_int_equal(cap_store_image_find("127.0.0.1:5000/t:v", &f, &err), -ENOENT);
	cap_image_fini(&a);
	cap_image_fini(&b);
}

/* A tar entry of any type for the tests below: link is a hard link's
 * target or a symlink's; data a regular file's bytes. */
static void put_entry(struct archive *a, const char *name, mode_t type,
		      const char *data, const char *link)
{
	struct archive_entry *e = archive_entry_new();
	archive_entry_set_pathname(e, name);
	archive_entry_set_filetype(e, type);
	archive_entry_set_perm(e, 0644);
	if (type == AE_IFREG && link)
		archive_entry_set_hardlink(e, link);
	else if (type == AE_IFLNK)
		archive_entry_set_symlink(e, link);
	if (type == AE_IFREG && !link)
		archive_entry_set_size(e, (la_int64_t)strlen(data));
	assert_true(archive_write_header(a, e) >= ARCHIVE_WARN);
	if (type == AE_IFREG && !link)
		archive_write_data(a, data, strlen(data));
	archive_entry_free(e);
}

static struct archive *tar_new(const char *path)
{
	struct archive *a = archive_write_new();
	archive_write_set_format_pax_restricted(a);
	assert_int_equal(archive_write_open_filename(a, path), ARCHIVE_OK);
	return a;
}

static void tar_done(struct archive *a)
{
	archive_write_close(a);
	archive_write_free(a);
}

/* A special file a layer leaves out takes with it what it replaced in the
 * layers below (a 0/0 character device is overlayfs's deletion mark), and
 * removing never follows a symlink. */
static void dropped_node_hides_lower(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_import_report rep = { 0 };
	_cleanup_free_ char *root = in_dir("root-dn"), *l1 = in_dir("dn1.tar"), *l2 = in_dir("dn2.tar"),
			   *out = in_dir("dn-outside"), *victim = in_dir("dn-outside/x");
	mkdir(root, 0755);
	mkdir(out, 0755);
	write_text(victim, "x");
	struct archive *a = tar_new(l1);
	put_entry(a, "etc", AE_IFDIR, NULL, NULL);
	put_entry(a, "etc/secret", AE_IFREG, "s", NULL);
	put_entry(a, "etc/keep", AE_IFREG, "k", NULL);
	put_entry(a, "var", AE_IFDIR, NULL, NULL);
	put_entry(a, "var/d", AE_IFDIR, NULL, NULL);
	put_entry(a, "var/d/f", AE_IFREG, "f", NULL);
	put_entry(a, "lnk", AE_IFLNK, NULL, out);
	tar_done(a);
	a = tar_new(l2);
	put_entry(a, "etc/secret", AE_IFCHR, NULL, NULL);	/* rdev 0/0 */
	put_entry(a, "var/d", AE_IFIFO, NULL, NULL);
	put_entry(a, "lnk/x", AE_IFCHR, NULL, NULL);
	tar_done(a);
	assert_int_equal(cap_store_apply_layer(root, l1, &rep, &err), 0);
	assert_int_equal(cap_store_apply_layer(root, l2, &rep, &err), 0);
	assert_false(exists(root, "etc/secret"));
	assert_false(exists(root, "var/d"));
	assert_true(exists(root, "etc/keep"));
	assert_true(exists(out, "x"));	/* not through the symlink */
	assert_int_equal(rep.dropped, 3);
}

/* A hard link to a node left out is left out and counted too, and a
 * chain of them; the import does not fail on the missing target. */
static void hard_link_to_dropped_node(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_import_report rep = { 0 };
	_cleanup_free_ char *root = in_dir("root-hl"), *l1 = in_dir("hl1.tar"), *l2 = in_dir("hl2.tar");
	mkdir(root, 0755);
	struct archive *a = tar_new(l1);
	put_entry(a, "etc", AE_IFDIR, NULL, NULL);
	put_entry(a, "etc/mem", AE_IFREG, "lower", NULL);
	tar_done(a);
	a = tar_new(l2);
	put_entry(a, "dev", AE_IFDIR, NULL, NULL);
	put_entry(a, "dev/mem", AE_IFCHR, NULL, NULL);
	put_entry(a, "etc/mem", AE_IFREG, NULL, "dev/mem");
	put_entry(a, "etc/mem2", AE_IFREG, NULL, "etc/mem");
	put_entry(a, "etc/real", AE_IFREG, "r", NULL);
	put_entry(a, "etc/real2", AE_IFREG, NULL, "etc/real");
	tar_done(a);
	assert_int_equal(cap_store_apply_layer(root, l1, &rep, &err), 0);
	assert_int_equal(cap_store_apply_layer(root, l2, &rep, &err), 0);
	assert_false(exists(root, "dev/mem"));
	assert_false(exists(root, "etc/mem"));	/* nor the lower layer's */
	assert_false(exists(root, "etc/mem2"));
	assert_true(exists(root, "etc/real2"));	/* other hard links work */
	assert_int_equal(rep.dropped, 3);
	assert_string_equal(rep.shown, "/dev/mem, /etc/mem, /etc/mem2");
}

/* Across layers too: a hard link in a later layer of a `docker save`
 * archive to a node an earlier layer left out is left out (the import
 * does not fail on the missing target). */
static void hard_link_to_node_dropped_below(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_import_report rep = { 0 };
	struct cap_image img;
	_cleanup_free_ char *ds = in_dir("ds"), *l1 = in_dir("ds/l1.tar"), *l2 = in_dir("ds/l2.tar"),
			   *man = in_dir("ds/manifest.json"), *arch = in_dir("ds.tar");
	mkdir(ds, 0755);
	struct archive *a = tar_new(l1);
	put_entry(a, "dev", AE_IFDIR, NULL, NULL);
	put_entry(a, "dev/mem", AE_IFCHR, NULL, NULL);
	put_entry(a, "etc", AE_IFDIR, NULL, NULL);
	put_entry(a, "etc/keep", AE_IFREG, "k", NULL);
	tar_done(a);
	a = tar_new(l2);
	put_entry(a, "etc/mem", AE_IFREG, NULL, "dev/mem");
	tar_done(a);
	write_text(man, "[{\"Config\": \"c.json\", \"RepoTags\": [], \"Layers\": [\"l1.tar\", \"l2.tar\"]}]");
	_cleanup_free_ char *cmd = xasprintf("tar -C '%s' -cf '%s' manifest.json l1.tar l2.tar", ds, arch);
	assert_int_equal(system(cmd), 0);
	struct cap_import_opts o = { .name = "hl-below" };
	assert_int_equal(cap_store_image_import_with(arch, &o, &img, &rep, &err), 0);
	assert_int_equal(rep.dropped, 2);
	assert_string_equal(rep.shown, "/dev/mem, /etc/mem");
	cap_image_fini(&img);
}

/* Names listed as left out reach a terminal: what it would act on is
 * escaped; UTF-8 text is kept. */
static void dropped_names_escaped(void **state)
{
	(void)state;
	struct cap_import_report rep = { 0 };
	cap_import_report_add(&rep, "/a\nb\x1b[2J");
	cap_import_report_add(&rep, "/c\xc2\x9b" "1m\\");
	cap_import_report_add(&rep, "/caf\xc3\xa9\xff\t");
	assert_string_equal(rep.shown, "/a\\nb\\x1b[2J, /c\\xc2\\x9b1m\\\\, /caf\xc3\xa9\\xff\\t");
	assert_int_equal(rep.dropped, 3);
}

/* Registry hosts are DNS names or IPv4 with a port, lowercased; IPv6
 * literals and over-long link names are refused before any pull. */
static void reference_hosts_and_length(void **state)
{
	(void)state;
	static const char *const bad[] = { "../x", ".hidden/x", "a..b/c", "-a.b/c", "a-.b/c",
					   "a.b:0/c", "a.b:99999/c", "a.b:/c", "a_b.c/d", "[::1]:5000/x" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		struct cap_image_ref r;
		struct cap_err err = { 0 };
		assert_int_equal(cap_store_ref_parse(bad[i], &r, &err), -EINVAL);
		assert_true(err.msg[0]);
	}
	struct cap_image_ref r;
	assert_int_equal(cap_store_ref_parse("LOCALHOST/a", &r, NULL), 0);
	assert_string_equal(r.owned_full, "localhost/a:latest");
	assert_true(cap_store_ref_loopback(r.owned_host));
	cap_image_ref_fini(&r);
	assert_int_equal(cap_store_ref_parse("Reg.Example.COM:443/x", &r, NULL), 0);
	assert_string_equal(r.owned_full, "reg.example.com:443/x:latest");
	assert_string_equal(r.owned_host, "reg.example.com");
	cap_image_ref_fini(&r);
	/* 120 bytes with 60 '/': 240 once encoded, plus the rest: over 255. */
	char longref[200] = "127.0.0.1:5000";
	for (int i = 0; i < 60; i++)
		strcat(longref, "/a");
	struct cap_err err = { 0 };
	assert_int_equal(cap_store_ref_parse(longref, &r, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "255"));
}

/* Two references giving the same bytes: each keeps its origin. */
static void origins_per_reference(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_image a = { 0 }, f = { 0 };
	_cleanup_free_ char *t = in_dir("o1"), *f1 = in_dir("o1/x");
	mkdir(t, 0755);
	write_text(f1, "same");
	const char *o1 = "sha256:3333333333333333333333333333333333333333333333333333333333333333";
	const char *r1 = "sha256:4444444444444444444444444444444444444444444444444444444444444444";
	const char *o2 = "sha256:5555555555555555555555555555555555555555555555555555555555555555";
	const char *r2 = "sha256:6666666666666666666666666666666666666666666666666666666666666666";
	struct cap_import_opts x = { .reference = "127.0.0.1:5000/x:1", .oci_digest = o1, .registry_digest = r1 };
	struct cap_import_opts v = { .reference = "127.0.0.1:5000/v2:1", .oci_digest = o2, .registry_digest = r2 };
	assert_int_equal(cap_store_image_from_tree(t, &x, &a, NULL, &err), 0);
	cap_image_fini(&a);
	assert_int_equal(cap_store_image_from_tree(t, &v, &a, NULL, &err), 0);
	assert_int_equal(a.n_origins, 2);
	assert_int_equal(cap_store_image_find("127.0.0.1:5000/x:1", &f, &err), 0);
	assert_string_equal(f.owned_reference, "127.0.0.1:5000/x:1");
	assert_string_equal(f.owned_registry_digest, r1);
	cap_image_fini(&f);
	_cleanup_free_ char *byreg = xasprintf("127.0.0.1:5000/x@%s", r1), *byoci = xasprintf("127.0.0.1:5000/x@%s", o1);
	_cleanup_free_ char *other = xasprintf("127.0.0.1:5000/x@%s", r2);
	assert_int_equal(cap_store_image_find(byreg, &f, &err), 0);
	assert_string_equal(f.digest, a.digest);
	assert_string_equal(f.owned_oci_digest, o1);
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find(byoci, &f, &err), 0);
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find(other, &f, &err), -ENOENT);
	/* Pulled again as x:1: replaced, not added. */
	assert_int_equal(cap_store_image_from_tree(t, &x, &f, NULL, &err), 0);
	assert_int_equal(f.n_origins, 2);
	cap_image_fini(&f);
	cap_image_fini(&a);
}

/* A valid name that is also another image's reference is refused. */
static void name_or_reference(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	struct cap_image a = { 0 }, b = { 0 }, f = { 0 };
	_cleanup_free_ char *t1 = in_dir("n1"), *t2 = in_dir("n2"), *f1 = in_dir("n1/a"), *f2 = in_dir("n2/b");
	mkdir(t1, 0755);
	mkdir(t2, 0755);
	write_text(f1, "named");
	write_text(f2, "pulled");
	struct cap_import_opts named = { .name = "pyth" };
	struct cap_import_opts pulled = { .reference = "docker.io/library/pyth:latest",
					  .oci_digest = "sha256:7777777777777777777777777777777777777777777777777777777777777777" };
	assert_int_equal(cap_store_image_from_tree(t1, &named, &a, NULL, &err), 0);
	assert_int_equal(cap_store_image_find("pyth", &f, &err), 0);	/* only a name yet */
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_from_tree(t2, &pulled, &b, NULL, &err), 0);
	assert_int_equal(cap_store_image_find("pyth", &f, &err), -EINVAL);
	assert_non_null(strstr(err.msg, "name:pyth"));
	assert_non_null(strstr(err.msg, "docker.io/library/pyth:latest"));
	assert_int_equal(cap_store_image_find("name:pyth", &f, &err), 0);
	assert_string_equal(f.digest, a.digest);
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find("docker.io/library/pyth:latest", &f, &err), 0);
	assert_string_equal(f.digest, b.digest);
	cap_image_fini(&f);
	assert_int_equal(cap_store_image_find("name:nosuch", &f, &err), -ENOENT);
	cap_image_fini(&a);
	cap_image_fini(&b);
}

/* Temporary directories of dead runs are swept by the next import. */
static void tmp_dirs_swept(void **state)
{
	(void)state;
	_cleanup_free_ char *images = xasprintf("%s/home/images", dir);
	_cleanup_free_ char *dead = xasprintf("%s/tmp-pull-dead", images), *old = xasprintf("%s/tmp-import-old", images);
	_cleanup_free_ char *live = xasprintf("%s/tmp-pull-live", images), *other = xasprintf("%s/tmp-other-x", images);
	_cleanup_free_ char *deadlock = xasprintf("%s/.lock", dead), *livelock = xasprintf("%s/.lock", live);
	const char *dirs[] = { dead, old, live, other };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(dirs); i++)
		assert_int_equal(cap_mkdir_p(dirs[i], 0755), 0);
	write_text(deadlock, "");
	write_text(livelock, "");
	int fd = open(livelock, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0 && flock(fd, LOCK_EX) == 0);
	struct timeval tv[2] = { { .tv_sec = time(NULL) - 120 }, { .tv_sec = time(NULL) - 120 } };
	assert_int_equal(utimes(old, tv), 0);
	assert_int_equal(utimes(other, tv), 0);
	_cleanup_free_ char *t = in_dir("s1"), *f1 = in_dir("s1/a");
	mkdir(t, 0755);
	write_text(f1, "s");
	struct cap_image img;
	struct cap_err err = { 0 };
	assert_int_equal(cap_store_image_import(t, NULL, NULL, NULL, &img, &err), 0);
	cap_image_fini(&img);
	assert_int_equal(access(dead, F_OK), -1);	/* its lock not held */
	assert_int_equal(access(old, F_OK), -1);	/* no lock, old */
	assert_int_equal(access(live, F_OK), 0);	/* at work */
	assert_int_equal(access(other, F_OK), 0);	/* not a kind the store makes */
	close(fd);
}

/* --- a registry's documents (store-registry.c) --- */

#define D64A "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa"
#define D64B "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb"

static int parse_text(const char *text, struct cap_reg_manifest *m, struct cap_err *err)
{
	memset(err, 0, sizeof(*err));
	return cap_reg_manifest_parse(text, strlen(text), m, err);
}

static void registry_manifests(void **state)
{
	(void)state;
	struct cap_reg_manifest m;
	struct cap_err err;
	/* An OCI manifest: sizes added up; its media types a container image's. */
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"mediaType\": \"application/vnd.oci.image.manifest.v1+json\", \"config\": {\"mediaType\": \"application/vnd.oci.image.config.v1+json\", \"digest\": \"" D64A "\", \"size\": 7}, \"layers\": [{\"mediaType\": \"application/vnd.oci.image.layer.v1.tar+gzip\", \"digest\": \"" D64B "\", \"size\": 100}, {\"mediaType\": \"application/vnd.oci.image.layer.v1.tar+zstd\", \"digest\": \"" D64A "\", \"size\": 23}]}",
				    &m, &err), 0);
	assert_false(m.index);
	assert_int_equal(m.n_layers, 2);
	assert_int_equal(m.layers_size, 123);
	assert_int_equal(m.config_size, 7);
	assert_string_equal(m.config_digest, D64A);
	assert_int_equal(cap_reg_manifest_media_ok(&m, &err), 0);
	cap_reg_manifest_fini(&m);
	/* Without a mediaType, a manifest by its fields. */
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"config\": {\"mediaType\": \"x\", \"digest\": \"" D64A "\", \"size\": 1}, \"layers\": []}", &m, &err), 0);
	assert_string_equal(m.owned_media_type, "application/vnd.oci.image.manifest.v1+json");
	/* An artifact's config is refused, named. */
	assert_int_equal(cap_reg_manifest_media_ok(&m, &err), -EMEDIUMTYPE);
	assert_non_null(strstr(err.msg, "config's media type is x"));
	cap_reg_manifest_fini(&m);
	/* Schema 1 and other media types are refused, named. */
	assert_int_equal(parse_text("{\"schemaVersion\": 1, \"name\": \"x\"}", &m, &err), -EMEDIUMTYPE);
	assert_non_null(strstr(err.msg, "application/vnd.docker.distribution.manifest.v1+json"));
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"mediaType\": \"text/plain\"}", &m, &err), -EMEDIUMTYPE);
	assert_non_null(strstr(err.msg, "text/plain"));
	/* Faults name the field. */
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"config\": {\"mediaType\": \"x\", \"digest\": \"sha256:AB\", \"size\": 1}, \"layers\": []}", &m, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "config's digest sha256:AB"));
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"config\": {\"mediaType\": \"x\", \"digest\": \"" D64A "\", \"size\": -1}, \"layers\": []}", &m, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "size"));
	assert_int_equal(parse_text("[1, 2", &m, &err), -EBADMSG);
	assert_int_equal(parse_text("{\"schemaVersion\": 3, \"manifests\": []}", &m, &err), -EBADMSG);
}

static void registry_index_pick(void **state)
{
	(void)state;
	struct cap_reg_manifest m;
	struct cap_err err;
	size_t w = 99;
	assert_int_equal(parse_text("{\"schemaVersion\": 2, \"mediaType\": \"application/vnd.docker.distribution.manifest.list.v2+json\", \"manifests\": ["
				    "{\"mediaType\": \"application/vnd.docker.distribution.manifest.v2+json\", \"digest\": \"" D64A "\", \"size\": 1, \"platform\": {\"os\": \"linux\", \"architecture\": \"arm64\", \"variant\": \"v8\"}},"
				    "{\"mediaType\": \"application/vnd.oci.image.index.v1+json\", \"digest\": \"" D64B "\", \"size\": 1, \"platform\": {\"os\": \"linux\", \"architecture\": \"amd64\"}},"
				    "{\"mediaType\": \"application/vnd.oci.image.manifest.v1+json\", \"digest\": \"" D64B "\", \"size\": 1, \"platform\": {\"os\": \"unknown\", \"architecture\": \"unknown\"}},"
				    "{\"mediaType\": \"application/vnd.oci.image.manifest.v1+json\", \"digest\": \"" D64B "\", \"size\": 1, \"platform\": {\"os\": \"linux\", \"architecture\": \"amd64\"}}]}",
				    &m, &err), 0);
	assert_true(m.index);
	assert_int_equal(m.n_entries, 4);
	/* The first image manifest for the platform: not a nested index. */
	assert_int_equal(cap_reg_index_pick(&m, "linux", "amd64", NULL, &w, &err), 0);
	assert_int_equal(w, 3);
	assert_int_equal(cap_reg_index_pick(&m, "linux", "arm64", "v8", &w, &err), 0);
	assert_int_equal(w, 0);
	/* None: the platforms offered named, attestations left out. */
	assert_int_equal(cap_reg_index_pick(&m, "linux", "s390x", NULL, &w, &err), -ENOEXEC);
	assert_non_null(strstr(err.msg, "it offers linux/arm64/v8, linux/amd64"));
	assert_null(strstr(err.msg, "unknown"));
	cap_reg_manifest_fini(&m);
}

static void registry_config(void **state)
{
	(void)state;
	struct cap_reg_config c;
	struct cap_err err = { 0 };
	const char *good = "{\"os\": \"linux\", \"architecture\": \"amd64\", \"config\": {\"Entrypoint\": null, \"Cmd\": [\"/bin/sh\", \"-c\"], \"Env\": [\"A=1\"], \"WorkingDir\": \"\", \"User\": \"1000\"}, \"rootfs\": {\"diff_ids\": [\"" D64A "\"]}}";
	assert_int_equal(cap_reg_config_parse(good, strlen(good), &c, &err), 0);
	assert_false(c.has_entrypoint);
	assert_true(c.has_cmd && c.n_cmd == 2);
	assert_string_equal(c.owned_cmd[1], "-c");
	assert_true(c.has_env && c.n_env == 1);
	assert_null(c.owned_workdir);
	assert_string_equal(c.owned_user, "1000");
	assert_int_equal(c.n_diff_ids, 1);
	cap_reg_config_fini(&c);
	const char *bad[] = {
		"{\"architecture\": \"amd64\", \"rootfs\": {\"diff_ids\": []}}",
		"{\"os\": \"linux\", \"architecture\": \"amd64\", \"config\": {\"Cmd\": [1]}, \"rootfs\": {\"diff_ids\": []}}",
		"{\"os\": \"linux\", \"architecture\": \"amd64\", \"config\": {}}",
		"{\"os\": \"linux\", \"os\": \"linux\", \"architecture\": \"amd64\", \"rootfs\": {\"diff_ids\": []}}",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		memset(&err, 0, sizeof(err));
		assert_int_equal(cap_reg_config_parse(bad[i], strlen(bad[i]), &c, &err), -EBADMSG);
		assert_true(err.msg[0]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(same_inputs_same_bytes),
		cmocka_unit_test(key_follows_inputs),
		cmocka_unit_test(missing_agent_named),
		cmocka_unit_test(layers_and_whiteouts),
		cmocka_unit_test(hostile_layers),
		cmocka_unit_test(device_nodes_dropped),
		cmocka_unit_test(references_normalized),
		cmocka_unit_test(references_find_and_move),
		cmocka_unit_test(reference_hosts_and_length),
		cmocka_unit_test(origins_per_reference),
		cmocka_unit_test(name_or_reference),
		cmocka_unit_test(tmp_dirs_swept),
		cmocka_unit_test(dropped_node_hides_lower),
		cmocka_unit_test(hard_link_to_dropped_node),
		cmocka_unit_test(hard_link_to_node_dropped_below),
		cmocka_unit_test(dropped_names_escaped),
		cmocka_unit_test(registry_manifests),
		cmocka_unit_test(registry_index_pick),
		cmocka_unit_test(registry_config),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
