/* The guest's tar codec (src/proto/tar.c) against libarchive, the host's:
 * what one writes the other reads back the same (names, types, modes,
 * sizes, content, link targets, times), both ways; and every malformed
 * stream gives a clean error, never a crash or an allocation of a size
 * the stream claims. Also the agent's own SHA-256, which hashes what the
 * streaming operations list, against OpenSSL's. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include <archive.h>
#include <archive_entry.h>
#include <openssl/sha.h>

#include "tar.h"
#include "util.h"
/* The agent's SHA-256 is guest code (libc only, not in any host
 * library): compiled in here to be checked. */
#include "../../guest/agent/agent-sha256.c"

/* One entry of a test tree: what is written and what must come back. */
struct ent {
	char path[4200];
	enum cap_tar_type type;
	uint32_t mode;
	char link[4200];
	uint8_t *data;
	size_t size;
	int64_t mtime;
};

struct tree {
	struct ent e[16];
	size_t n;
};

static struct ent *add(struct tree *t, const char *path, enum cap_tar_type type, uint32_t mode)
{
	assert_true(t->n < CAP_ARRAY_SIZE(t->e));
	struct ent *e = &t->e[t->n++];
	memset(e, 0, sizeof(*e));
	snprintf(e->path, sizeof(e->path), "%s", path);
	e->type = type;
	e->mode = mode;
	e->mtime = 1700000000 + (int64_t)t->n;
	return e;
}

/* A path of exactly n bytes: components of 9 bytes and a last one. */
static void long_path(char *out, size_t n, char fill)
{
	for (size_t i = 0; i < n; i++)
		out[i] = (i % 10 == 9) ? '/' : fill;
	if (out[n - 1] == '/')
		out[n - 1] = fill;
	out[n] = '\0';
}

static void tree_free(struct tree *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->e[i].data);
}

/* The tree every round trip carries. */
static void make_tree(struct tree *t)
{
	char p[4200];
	memset(t, 0, sizeof(*t));
	add(t, "top", CAP_TAR_DIR, 0755);
	struct ent *e = add(t, "top/hello.txt", CAP_TAR_FILE, 0644);
	e->data = (uint8_t *)xstrdup("hello, world\n");
	e->size = strlen((char *)e->data);
	add(t, "top/empty", CAP_TAR_FILE, 0600);
	e = add(t, "top/bin", CAP_TAR_FILE, 0755);
	e->size = 70001;	/* not a whole number of blocks */
	e->data = xmalloc(e->size);
	for (size_t i = 0; i < e->size; i++)
		e->data[i] = (uint8_t)((i * 2654435761u) >> 13);
	e->data[0] = 0;
	long_path(p, 150, 'a');	/* fits ustar's prefix + name */
	memcpy(p, "top/", 4);
	e = add(t, p, CAP_TAR_FILE, 0640);
	e->data = (uint8_t *)xstrdup("one hundred fifty");
	e->size = strlen((char *)e->data);
	long_path(p, 300, 'b');	/* needs a pax path */
	memcpy(p, "top/", 4);
	e = add(t, p, CAP_TAR_FILE, 0700);
	e->data = (uint8_t *)xstrdup("three hundred");
	e->size = strlen((char *)e->data);
	long_path(p, 120, 'c');	/* a directory name over 100 bytes */
	memcpy(p, "top/", 4);
	add(t, p, CAP_TAR_DIR, 0700);
	e = add(t, "top/link", CAP_TAR_SYMLINK, 0777);
	snprintf(e->link, sizeof(e->link), "hello.txt");
	e = add(t, "top/longlink", CAP_TAR_SYMLINK, 0777);
	long_path(e->link, 180, 'd');	/* a pax linkpath */
	add(t, "top/caf\xc3\xa9", CAP_TAR_DIR, 0750);
	e = add(t, "top/sticky", CAP_TAR_FILE, 01644);
	e->data = (uint8_t *)xstrdup("s");
	e->size = 1;
	e->mtime = 0;
	e = add(t, "top/future", CAP_TAR_FILE, 0644);
	e->mtime = (int64_t)1 << 34;	/* past ustar's 11 octal digits: pax mtime */
}

static void write_cap(const struct tree *t, struct cap_buf *out)
{
	for (size_t i = 0; i < t->n; i++) {
		const struct ent *e = &t->e[i];
		struct cap_tar_entry te = { .path = e->path, .linkname = e->link, .type = e->type,
					    .mode = e->mode, .size = e->size, .mtime = e->mtime,
					    .uid = 1000, .gid = 1000 };
		assert_int_equal(cap_tar_header(out, &te), 0);
		if (e->size)
			cap_buf_append(out, e->data, e->size);
		cap_tar_pad(out, e->size);
		assert_int_equal(cap_buf_used(out) % CAP_TAR_BLOCK, 0);
	}
	cap_tar_end(out);
}

/* Compare what libarchive read (entry e, data) with the tree's entry. */
static void check_archive_entry(struct archive *a, struct archive_entry *ae, const struct ent *e)
{
	const char *path = archive_entry_pathname(ae);
	assert_non_null(path);
	char want[4300];
	snprintf(want, sizeof(want), "%s%s", e->path, e->type == CAP_TAR_DIR ? "/" : "");
	assert_string_equal(path, want);
	assert_int_equal(archive_entry_perm(ae), e->mode);
	assert_int_equal(archive_entry_mtime(ae), e->mtime);
	switch (e->type) {
	case CAP_TAR_DIR:
		assert_int_equal(archive_entry_filetype(ae), AE_IFDIR);
		break;
	case CAP_TAR_SYMLINK:
		assert_int_equal(archive_entry_filetype(ae), AE_IFLNK);
		assert_string_equal(archive_entry_symlink(ae), e->link);
		break;
	default: {
		assert_int_equal(archive_entry_filetype(ae), AE_IFREG);
		assert_int_equal(archive_entry_size(ae), e->size);
		uint8_t *buf = xmalloc(e->size + 1);
		size_t got = 0;
		ssize_t k;
		while ((k = archive_read_data(a, buf + got, e->size + 1 - got)) > 0)
			got += (size_t)k;
		assert_int_equal(k, 0);
		assert_int_equal(got, e->size);
		if (e->size)
			assert_memory_equal(buf, e->data, e->size);
		free(buf);
	}
	}
}

static void cap_to_libarchive(void **state)
{
	(void)state;
	struct tree t;
	struct cap_buf b;
	make_tree(&t);
	cap_buf_init(&b);
	write_cap(&t, &b);

	struct archive *a = archive_read_new();
	archive_read_support_format_tar(a);
	assert_int_equal(archive_read_open_memory(a, cap_buf_head(&b), cap_buf_used(&b)), ARCHIVE_OK);
	struct archive_entry *ae;
	size_t i = 0;
	int r;
	while ((r = archive_read_next_header(a, &ae)) == ARCHIVE_OK) {
		assert_true(i < t.n);
		check_archive_entry(a, ae, &t.e[i++]);
	}
	assert_int_equal(r, ARCHIVE_EOF);
	assert_int_equal(i, t.n);
	archive_read_free(a);
	cap_buf_fini(&b);
	tree_free(&t);
}

/* An fd holding bytes p[0..n): a memfd, or with chunk > 0 a pipe fed by
 * a child in chunk-byte writes (short reads for the reader). */
static int bytes_fd(const uint8_t *p, size_t n, size_t chunk, pid_t *child)
{
	*child = -1;
	if (!chunk) {
		int fd = memfd_create("tar", MFD_CLOEXEC);
		assert_true(fd >= 0);
		assert_int_equal(cap_write_all(fd, p, n), 0);
		assert_int_equal(lseek(fd, 0, SEEK_SET), 0);
		return fd;
	}
	int pfd[2];
	assert_int_equal(pipe(pfd), 0);
	*child = fork();
	assert_true(*child >= 0);
	if (*child == 0) {
		close(pfd[0]);
		for (size_t off = 0; off < n; off += chunk)
			if (cap_write_all(pfd[1], p + off, CAP_MIN(chunk, n - off)) < 0)
				_exit(1);
		_exit(0);
	}
	close(pfd[1]);
	return pfd[0];
}

static void reap(pid_t child, int fd)
{
	close(fd);
	if (child > 0)
		waitpid(child, NULL, 0);
}

/* Read every entry with cap_tar from p[0..n) and compare with t. */
static void read_cap_and_check(const uint8_t *p, size_t n, size_t chunk, const struct tree *t)
{
	pid_t child;
	int fd = bytes_fd(p, n, chunk, &child);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	struct cap_err err = { 0 };
	cap_tar_reader_init(&r, fd);
	size_t i = 0;
	int k;
	while ((k = cap_tar_next(&r, &e, &err)) == 1) {
		assert_true(i < t->n);
		const struct ent *w = &t->e[i++];
		assert_string_equal(e.path, w->path);
		assert_int_equal(e.type, w->type);
		assert_int_equal(e.mode, w->mode);
		assert_int_equal(e.mtime, w->mtime);
		if (w->type == CAP_TAR_SYMLINK)
			assert_string_equal(e.linkname, w->link);
		else
			assert_string_equal(e.linkname, "");
		if (w->type != CAP_TAR_FILE) {
			assert_int_equal(e.size, 0);
			continue;
		}
		assert_int_equal(e.size, w->size);
		/* Read the data in odd chunks; a file's last entry is read
		 * only partly, so that next() must skip the rest. */
		uint8_t *buf = xmalloc(w->size + 1);
		size_t got = 0, want = i == 4 && w->size > 3 ? w->size - 3 : w->size;
		while (got < want) {
			ssize_t m = cap_tar_read(&r, buf + got, CAP_MIN((size_t)777, want - got), &err);
			assert_true(m > 0);
			got += (size_t)m;
		}
		if (want == w->size)
			assert_int_equal(cap_tar_read(&r, buf, 1, &err), 0);
		if (got)
			assert_memory_equal(buf, w->data, got);
		free(buf);
	}
	if (k < 0)
		fail_msg("cap_tar_next: %s", err.msg);
	assert_int_equal(k, 0);
	assert_int_equal(i, t->n);
	assert_int_equal(cap_tar_next(&r, &e, &err), 0);	/* stays at the end */
	reap(child, fd);
}

static void cap_to_cap(void **state)
{
	(void)state;
	struct tree t;
	struct cap_buf b;
	make_tree(&t);
	cap_buf_init(&b);
	write_cap(&t, &b);
	read_cap_and_check(cap_buf_head(&b), cap_buf_used(&b), 0, &t);
	read_cap_and_check(cap_buf_head(&b), cap_buf_used(&b), 1000, &t);
	read_cap_and_check(cap_buf_head(&b), cap_buf_used(&b), 1, &t);
	cap_buf_fini(&b);
	tree_free(&t);
}

static la_ssize_t buf_write(struct archive *a, void *ud, const void *p, size_t n)
{
	(void)a;
	cap_buf_append(ud, p, n);
	return (la_ssize_t)n;
}

/* Take what libarchive writes up to the first call with 'stop' set. */
struct capped {
	struct cap_buf b;
	bool stop;
};

static la_ssize_t capped_write(struct archive *a, void *ud, const void *p, size_t n)
{
	struct capped *c = ud;
	if (c->stop) {
		archive_set_error(a, EIO, "enough");
		return -1;
	}
	cap_buf_append(&c->b, p, n);
	return (la_ssize_t)n;
}

/* Write t with libarchive in format fmt, plus a hard link and a FIFO
 * (which cap_tar must give as OTHER) at the end when extra. */
static void write_libarchive(const struct tree *t, int fmt, bool extra, struct cap_buf *out)
{
	struct archive *a = archive_write_new();
	assert_int_equal(archive_write_set_format(a, fmt), ARCHIVE_OK);
	assert_int_equal(archive_write_open(a, out, NULL, buf_write, NULL), ARCHIVE_OK);
	struct archive_entry *ae = archive_entry_new();
	for (size_t i = 0; i < t->n; i++) {
		const struct ent *e = &t->e[i];
		archive_entry_clear(ae);
		archive_entry_copy_pathname(ae, e->path);
		archive_entry_set_perm(ae, e->mode);
		archive_entry_set_mtime(ae, e->mtime, 0);
		archive_entry_set_uid(ae, 1000);
		archive_entry_set_gid(ae, 1000);
		if (e->type == CAP_TAR_DIR) {
			archive_entry_set_filetype(ae, AE_IFDIR);
		} else if (e->type == CAP_TAR_SYMLINK) {
			archive_entry_set_filetype(ae, AE_IFLNK);
			archive_entry_copy_symlink(ae, e->link);
		} else {
			archive_entry_set_filetype(ae, AE_IFREG);
			archive_entry_set_size(ae, (la_int64_t)e->size);
		}
		/* A name that is not ASCII gets a warning in the C locale (it
		 * goes out as raw bytes, hdrcharset=BINARY), and only it. */
		int r = archive_write_header(a, ae);
		if (r != ARCHIVE_OK && !(r == ARCHIVE_WARN && strstr(e->path, "\xc3")))
			fail_msg("libarchive refused %s: %s", e->path, archive_error_string(a));
		if (e->size)
			assert_int_equal(archive_write_data(a, e->data, e->size), (la_ssize_t)e->size);
	}
	if (extra) {
		archive_entry_clear(ae);
		archive_entry_copy_pathname(ae, "top/hard");
		archive_entry_copy_hardlink(ae, "top/hello.txt");
		archive_entry_set_perm(ae, 0644);
		assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
		archive_entry_clear(ae);
		archive_entry_copy_pathname(ae, "top/fifo");
		archive_entry_set_filetype(ae, AE_IFIFO);
		archive_entry_set_perm(ae, 0644);
		assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
	}
	archive_entry_free(ae);
	assert_int_equal(archive_write_close(a), ARCHIVE_OK);
	archive_write_free(a);
}

static void libarchive_to_cap(void **state)
{
	(void)state;
	struct tree t;
	struct cap_buf b;
	make_tree(&t);
	int fmts[] = { ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, ARCHIVE_FORMAT_TAR_PAX_INTERCHANGE,
		       ARCHIVE_FORMAT_TAR_GNUTAR };
	for (size_t f = 0; f < CAP_ARRAY_SIZE(fmts); f++) {
		cap_buf_init(&b);
		write_libarchive(&t, fmts[f], false, &b);
		/* libarchive's GNU writer clamps a time past 11 octal digits. */
		int64_t future = t.e[t.n - 1].mtime;
		if (fmts[f] == ARCHIVE_FORMAT_TAR_GNUTAR)
			t.e[t.n - 1].mtime = 077777777777;
		read_cap_and_check(cap_buf_head(&b), cap_buf_used(&b), 0, &t);
		read_cap_and_check(cap_buf_head(&b), cap_buf_used(&b), 333, &t);
		t.e[t.n - 1].mtime = future;
		cap_buf_fini(&b);
	}

	/* A hard link and a FIFO come as OTHER, named, with their type byte. */
	cap_buf_init(&b);
	write_libarchive(&t, ARCHIVE_FORMAT_TAR_PAX_RESTRICTED, true, &b);
	pid_t child;
	int fd = bytes_fd(cap_buf_head(&b), cap_buf_used(&b), 0, &child);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	struct cap_err err = { 0 };
	cap_tar_reader_init(&r, fd);
	for (size_t i = 0; i < t.n; i++)
		assert_int_equal(cap_tar_next(&r, &e, &err), 1);
	assert_int_equal(cap_tar_next(&r, &e, &err), 1);
	assert_string_equal(e.path, "top/hard");
	assert_int_equal(e.type, CAP_TAR_OTHER);
	assert_int_equal(e.typeflag, '1');
	assert_int_equal(e.size, 0);
	assert_int_equal(cap_tar_next(&r, &e, &err), 1);
	assert_string_equal(e.path, "top/fifo");
	assert_int_equal(e.type, CAP_TAR_OTHER);
	assert_int_equal(e.typeflag, '6');
	assert_int_equal(cap_tar_next(&r, &e, &err), 0);
	reap(child, fd);
	cap_buf_fini(&b);
	tree_free(&t);
}

/* Sizes of 8 GiB and more: a pax size both ways (headers only). */
static void huge_size_header(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	uint64_t size = (9ULL << 30) + 5;
	struct cap_tar_entry te = { .path = "big", .type = CAP_TAR_FILE, .mode = 0644,
				    .size = size, .mtime = 1 };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	assert_int_equal(cap_buf_used(&b), 3 * CAP_TAR_BLOCK);	/* pax header, its data, the entry */
	uint8_t data[CAP_TAR_BLOCK] = { 1, 2, 3 };
	cap_buf_append(&b, data, sizeof(data));

	struct archive *a = archive_read_new();
	archive_read_support_format_tar(a);
	assert_int_equal(archive_read_open_memory(a, cap_buf_head(&b), cap_buf_used(&b)), ARCHIVE_OK);
	struct archive_entry *ae;
	assert_int_equal(archive_read_next_header(a, &ae), ARCHIVE_OK);
	assert_int_equal(archive_entry_size(ae), (la_int64_t)size);
	archive_read_free(a);

	pid_t child;
	int fd = bytes_fd(cap_buf_head(&b), cap_buf_used(&b), 0, &child);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	struct cap_err err = { 0 };
	cap_tar_reader_init(&r, fd);
	assert_int_equal(cap_tar_next(&r, &e, &err), 1);
	assert_int_equal(e.size, size);
	uint8_t buf[4096];
	assert_int_equal(cap_tar_read(&r, buf, sizeof(buf), &err), CAP_TAR_BLOCK);
	assert_int_equal(cap_tar_read(&r, buf, sizeof(buf), &err), -EPIPE);
	assert_non_null(strstr(err.msg, "big"));
	assert_int_equal(cap_tar_next(&r, &e, &err), -EPIPE);	/* stays failed */
	reap(child, fd);

	/* libarchive's own way for a big size, read by cap_tar. Its
	 * padding of the missing data is refused (it would be 9 GiB). */
	struct capped lb = { .stop = false };
	cap_buf_init(&lb.b);
	a = archive_write_new();
	archive_write_set_format(a, ARCHIVE_FORMAT_TAR_PAX_RESTRICTED);
	archive_write_set_bytes_per_block(a, 0);	/* the header reaches lb at once */
	archive_write_open(a, &lb, NULL, capped_write, NULL);
	ae = archive_entry_new();
	archive_entry_copy_pathname(ae, "big");
	archive_entry_set_filetype(ae, AE_IFREG);
	archive_entry_set_perm(ae, 0644);
	archive_entry_set_size(ae, (la_int64_t)size);
	assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
	archive_entry_free(ae);
	lb.stop = true;
	archive_write_free(a);
	fd = bytes_fd(cap_buf_head(&lb.b), cap_buf_used(&lb.b), 0, &child);
	cap_tar_reader_init(&r, fd);
	assert_int_equal(cap_tar_next(&r, &e, &err), 1);
	assert_int_equal(e.size, size);
	reap(child, fd);
	cap_buf_fini(&lb.b);
	cap_buf_fini(&b);
}

static void writer_refuses(void **state)
{
	(void)state;
	struct cap_buf b;
	cap_buf_init(&b);
	char p[CAP_TAR_PATH_MAX + 2];
	memset(p, 'x', sizeof(p) - 1);
	p[sizeof(p) - 1] = '\0';
	struct cap_tar_entry te = { .path = p, .type = CAP_TAR_FILE, .mode = 0644 };
	assert_int_equal(cap_tar_header(&b, &te), -ENAMETOOLONG);
	p[CAP_TAR_PATH_MAX] = '\0';
	assert_int_equal(cap_tar_header(&b, &te), 0);	/* 4096 is fine */
	b.off = b.len = 0;
	te.path = "";
	assert_int_equal(cap_tar_header(&b, &te), -EINVAL);
	te.path = "l";
	te.type = CAP_TAR_SYMLINK;
	te.linkname = "";
	assert_int_equal(cap_tar_header(&b, &te), -EINVAL);
	te.linkname = NULL;
	assert_int_equal(cap_tar_header(&b, &te), -EINVAL);
	te.type = CAP_TAR_OTHER;
	assert_int_equal(cap_tar_header(&b, &te), -EINVAL);
	te = (struct cap_tar_entry){ .path = "f/", .type = CAP_TAR_FILE, .mode = 0644 };
	assert_int_equal(cap_tar_header(&b, &te), -EINVAL);
	assert_int_equal(cap_buf_used(&b), 0);	/* nothing written on failure */
	/* ustar's prefix takes a 150-byte name; 300 bytes need pax. */
	long_path(p, 150, 'a');
	te = (struct cap_tar_entry){ .path = p, .type = CAP_TAR_FILE, .mode = 0644 };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	assert_int_equal(cap_buf_used(&b), CAP_TAR_BLOCK);
	b.off = b.len = 0;
	long_path(p, 300, 'a');
	assert_int_equal(cap_tar_header(&b, &te), 0);
	assert_int_equal(cap_buf_used(&b), 3 * CAP_TAR_BLOCK);
	assert_int_equal(b.owned_data[156], 'x');
	b.off = b.len = 0;
	assert_int_equal(cap_tar_padding(0), 0);
	assert_int_equal(cap_tar_padding(1), 511);
	assert_int_equal(cap_tar_padding(512), 0);
	assert_int_equal(cap_tar_padding(513), 511);
	cap_buf_fini(&b);
}

/* --- malformed streams ------------------------------------------------- */

/* Read all of p[0..n) with cap_tar, data included: the final result (0 at
 * the end, -errno) and its message. */
static int read_all(const uint8_t *p, size_t n, struct cap_err *err)
{
	pid_t child;
	int fd = bytes_fd(p, n, 0, &child);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	cap_tar_reader_init(&r, fd);
	int k;
	uint8_t buf[1000];
	while ((k = cap_tar_next(&r, &e, err)) == 1) {
		ssize_t m;
		while ((m = cap_tar_read(&r, buf, sizeof(buf), err)) > 0)
			;
		if (m < 0) {
			k = (int)m;
			break;
		}
	}
	reap(child, fd);
	return k;
}

static void set_checksum(uint8_t *h)
{
	unsigned sum = 0;
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < CAP_TAR_BLOCK; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	h[155] = ' ';
}

static void corrupted_checksum(void **state)
{
	(void)state;
	struct cap_buf b;
	struct cap_err err = { 0 };
	cap_buf_init(&b);
	struct cap_tar_entry te = { .path = "f", .type = CAP_TAR_FILE, .mode = 0644, .size = 2 };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	cap_buf_append(&b, "hi", 2);
	cap_tar_pad(&b, 2);
	cap_tar_end(&b);
	uint8_t *h = b.owned_data + b.off;
	assert_int_equal(read_all(h, cap_buf_used(&b), &err), 0);
	h[0] = 'g';	/* the name changed, the checksum not */
	assert_int_equal(read_all(h, cap_buf_used(&b), &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "checksum"));
	set_checksum(h);
	assert_int_equal(read_all(h, cap_buf_used(&b), &err), 0);
	/* Every single-byte change of the header is caught, or harmless. */
	for (size_t i = 0; i < CAP_TAR_BLOCK; i++) {
		uint8_t old = h[i];
		h[i] ^= 0x01;
		int k = read_all(h, cap_buf_used(&b), &err);
		assert_true(k == -EBADMSG || (i >= 148 && i < 156 && k == 0));
		h[i] = old;
	}
	/* Random bytes are not a tar stream. */
	uint8_t junk[CAP_TAR_BLOCK * 2];
	for (size_t i = 0; i < sizeof(junk); i++)
		junk[i] = (uint8_t)(i * 7 + 1);
	assert_int_equal(read_all(junk, sizeof(junk), &err), -EBADMSG);
	cap_buf_fini(&b);
}

static void truncated_archive(void **state)
{
	(void)state;
	struct tree t;
	struct cap_buf b;
	struct cap_err err = { 0 };
	make_tree(&t);
	cap_buf_init(&b);
	write_cap(&t, &b);
	size_t n = cap_buf_used(&b);
	/* Cut at every block and inside a few: an error unless at least the
	 * first zero block is there. */
	for (size_t cut = 0; cut < n; cut += (cut % CAP_TAR_BLOCK) ? CAP_TAR_BLOCK - 17 : 17) {
		int k = read_all(cap_buf_head(&b), cut, &err);
		if (cut >= n - CAP_TAR_BLOCK)
			assert_int_equal(k, 0);
		else
			assert_int_equal(k, -EPIPE);
	}
	assert_int_equal(read_all(cap_buf_head(&b), 0, &err), -EPIPE);
	assert_non_null(strstr(err.msg, "end-of-archive"));
	cap_buf_fini(&b);
	tree_free(&t);
}

/* A header for a file named name with the size field replaced by the
 * raw bytes sz (12 bytes), checksum fixed. */
static void header_with_size(uint8_t *h, const uint8_t *sz)
{
	struct cap_buf b;
	cap_buf_init(&b);
	struct cap_tar_entry te = { .path = "f", .type = CAP_TAR_FILE, .mode = 0644, .size = 1 };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	memcpy(h, cap_buf_head(&b), CAP_TAR_BLOCK);
	memcpy(h + 124, sz, 12);
	set_checksum(h);
	cap_buf_fini(&b);
}

static void absurd_numbers(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	uint8_t a[CAP_TAR_BLOCK * 4] = { 0 };

	/* The largest octal size: fine as a header, then the data is missing. */
	header_with_size(a, (const uint8_t *)"77777777777");
	assert_int_equal(read_all(a, sizeof(a), &err), -EPIPE);
	/* Not octal. */
	header_with_size(a, (const uint8_t *)"00000000008");
	assert_int_equal(read_all(a, sizeof(a), &err), -EBADMSG);
	header_with_size(a, (const uint8_t *)"0000000 001");
	assert_int_equal(read_all(a, sizeof(a), &err), -EBADMSG);
	/* Base-256: negative, and over 2^63. */
	uint8_t neg[12] = { 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	header_with_size(a, neg);
	assert_int_equal(read_all(a, sizeof(a), &err), -EBADMSG);
	uint8_t huge[12] = { 0x80, 0, 0, 0, 0x80, 0, 0, 0, 0, 0, 0, 0 };
	header_with_size(a, huge);
	assert_int_equal(read_all(a, sizeof(a), &err), -EBADMSG);
	uint8_t ok[12] = { 0x80, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 1 };
	header_with_size(a, ok);
	a[CAP_TAR_BLOCK] = 'z';
	assert_int_equal(read_all(a, sizeof(a), &err), 0);
}

/* A stream: a pax 'x' header with the given records, then a file "f". */
static size_t pax_stream(uint8_t *out, size_t cap, const char *records, size_t rlen, char type)
{
	struct cap_buf b;
	cap_buf_init(&b);
	struct cap_tar_entry te = { .path = "PaxHeader/f", .type = CAP_TAR_FILE, .mode = 0644,
				    .size = rlen };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	b.owned_data[b.off + 156] = (uint8_t)type;
	set_checksum(b.owned_data + b.off);
	cap_buf_append(&b, records, rlen);
	cap_tar_pad(&b, rlen);
	te = (struct cap_tar_entry){ .path = "f", .type = CAP_TAR_FILE, .mode = 0644 };
	assert_int_equal(cap_tar_header(&b, &te), 0);
	cap_tar_end(&b);
	size_t n = cap_buf_used(&b);
	assert_true(n <= cap);
	memcpy(out, cap_buf_head(&b), n);
	cap_buf_fini(&b);
	return n;
}

/* The first entry's path after the pax header, or NULL with *rc. */
static int pax_first(const char *records, size_t rlen, char type, char *path, size_t plen,
		     uint64_t *size, struct cap_err *err)
{
	static uint8_t buf[200 * 1024];
	size_t n = pax_stream(buf, sizeof(buf), records, rlen, type);
	pid_t child;
	int fd = bytes_fd(buf, n, 0, &child);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	cap_tar_reader_init(&r, fd);
	int k = cap_tar_next(&r, &e, err);
	if (k == 1) {
		snprintf(path, plen, "%s", e.path);
		*size = e.size;
	}
	reap(child, fd);
	return k;
}

static void pax_records(void **state)
{
	(void)state;
	struct cap_err err = { 0 };
	char path[5000];
	uint64_t size;
#define PAX(s) s, sizeof(s) - 1

	assert_int_equal(pax_first(PAX("12 path=abc\n"), 'x', path, sizeof(path), &size, &err), 1);
	assert_string_equal(path, "abc");
	/* Unknown keywords are ignored; an empty value keeps the header's. */
	assert_int_equal(pax_first(PAX("16 SCHILY.x=abc\n8 path=\n"), 'x', path, sizeof(path), &size, &err), 1);
	assert_string_equal(path, "f");
	/* A global header is skipped, not applied. */
	assert_int_equal(pax_first(PAX("12 path=abc\n"), 'g', path, sizeof(path), &size, &err), 1);
	assert_string_equal(path, "f");
	/* Bad lengths. */
	static const char *const bad[] = {
		"99 path=abc\n", "11 path=abc\n", "13 path=abc\n", "0 path=abc\n", "x path=abc\n",
		"12path=abcd\n", "5 a=b\n", "12 =abcdefg\n", "12 pathxabc\n", "12 path=abc\nzz",
		"11 size=-1\n", "11 size=1x\n", "32 size=99999999999999999999999\n",
		"11 mtime=x\n", "999999999999 path=a\n", "12 path=abc",
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(bad); i++) {
		int k = pax_first(bad[i], strlen(bad[i]), 'x', path, sizeof(path), &size, &err);
		if (k != -EBADMSG)
			fail_msg("pax record %zu (%s) gave %d", i, bad[i], k);
	}
	/* A NUL inside a path. */
	assert_int_equal(pax_first(PAX("12 path=a\0c\n"), 'x', path, sizeof(path), &size, &err), -EBADMSG);
	/* Trailing NULs after the records are tolerated. */
	assert_int_equal(pax_first(PAX("12 path=abc\n\0\0\0"), 'x', path, sizeof(path), &size, &err), 1);
	/* A path of 4096 bytes passes, 4097 does not. */
	char *rec = xmalloc(5000);
	char *p = xmalloc(4100);
	memset(p, 'p', 4097);
	p[4096] = '\0';
	int m = snprintf(rec, 5000, "4107 path=%s\n", p);
	assert_int_equal(pax_first(rec, (size_t)m, 'x', path, sizeof(path), &size, &err), 1);
	assert_int_equal(strlen(path), 4096);
	p[4096] = 'p';
	p[4097] = '\0';
	m = snprintf(rec, 5000, "4108 path=%s\n", p);
	assert_int_equal(pax_first(rec, (size_t)m, 'x', path, sizeof(path), &size, &err), -EBADMSG);
	free(rec);
	free(p);
	/* A pax header over 64 KiB is refused before it is read. */
	char *big = xmalloc(70000);
	memset(big, '\n', 70000);
	assert_int_equal(pax_first(big, 70000, 'x', path, sizeof(path), &size, &err), -EBADMSG);
	assert_non_null(strstr(err.msg, "oversized"));
	/* A GNU long name over 4097 bytes too; one of 4096 passes. */
	memset(big, 'n', 4200);
	assert_int_equal(pax_first(big, 4098, 'L', path, sizeof(path), &size, &err), -EBADMSG);
	big[4096] = '\0';
	assert_int_equal(pax_first(big, 4097, 'L', path, sizeof(path), &size, &err), 1);
	assert_int_equal(strlen(path), 4096);
	big[0] = '\0';	/* empty */
	assert_int_equal(pax_first(big, 10, 'L', path, sizeof(path), &size, &err), -EBADMSG);
	free(big);
	/* A pax size applies to the entry. */
	assert_int_equal(pax_first(PAX("9 size=0\n"), 'x', path, sizeof(path), &size, &err), 1);
	assert_int_equal(size, 0);
#undef PAX
}

static void agent_sha256_matches_openssl(void **state)
{
	(void)state;
	assert_true(agent_sha256_selftest());
	static uint8_t data[5000];
	for (size_t i = 0; i < sizeof(data); i++)
		data[i] = (uint8_t)((i * 2654435761u) >> 11);
	/* Every length around the block and padding boundaries, and some
	 * more, each fed in uneven pieces. */
	for (size_t n = 0; n < sizeof(data); n += n < 200 ? 1 : 97) {
		uint8_t want[32], got[32];
		SHA256(data, n, want);
		struct agent_sha256 c;
		agent_sha256_init(&c);
		size_t step = 1 + n % 70;
		for (size_t off = 0; off < n; off += step)
			agent_sha256_update(&c, data + off, CAP_MIN(step, n - off));
		agent_sha256_final(&c, got);
		if (memcmp(want, got, 32) != 0)
			fail_msg("SHA-256 of %zu bytes differs from OpenSSL's", n);
	}
}

/* A file with holes, written as a pax sparse 1.0 entry, is read by
 * libarchive (the host's reader) under its real name and size, with only
 * its data extents given (at their offsets); a long non-ASCII name, an
 * all-hole file and a trailing hole are kept; bad extents are refused. */
static void sparse_entries(void **state)
{
	(void)state;
	char longname[300];
	long_path(longname, 250, 'q');
	memcpy(longname + 240, "\xc3\xa9.bin", 7);
	struct cap_tar_extent ext[] = { { 4096, 10 }, { 1 << 20, 3 } };
	struct cap_tar_entry e = { .path = longname, .type = CAP_TAR_FILE, .mode = 0640, .size = 1ull << 30,
				   .mtime = 1700000000, .extents = ext, .nextents = 2 };
	struct cap_tar_entry hole = { .path = "empty/all-hole", .type = CAP_TAR_FILE, .mode = 0600, .size = 5000,
				      .mtime = 1700000000, .extents = ext, .nextents = 0 };
	struct cap_buf b;
	cap_buf_init(&b);
	assert_int_equal(cap_tar_header(&b, &e), 0);
	assert_int_equal(cap_tar_data_size(&e), 13);
	cap_buf_append(&b, "0123456789abc", 13);
	cap_tar_pad(&b, cap_tar_data_size(&e));
	assert_int_equal(cap_tar_header(&b, &hole), 0);
	assert_int_equal(cap_tar_data_size(&hole), 0);
	cap_tar_end(&b);
	assert_true(cap_buf_used(&b) < 8192);	/* 1 GiB in a few blocks */

	struct archive *a = archive_read_new();
	archive_read_support_format_tar(a);
	assert_int_equal(archive_read_open_memory(a, cap_buf_head(&b), cap_buf_used(&b)), ARCHIVE_OK);
	struct archive_entry *ae;
	int k = archive_read_next_header(a, &ae);
	assert_true(k == ARCHIVE_OK || k == ARCHIVE_WARN);
	assert_string_equal(archive_entry_pathname(ae), longname);
	assert_int_equal(archive_entry_size(ae), 1ll << 30);
	assert_int_equal(archive_entry_perm(ae), 0640);
	const void *buf;
	size_t size;
	la_int64_t off;
	char got[64] = "";
	size_t nblocks = 0;
	while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK) {
		if (!size)
			continue;
		char line[64];
		snprintf(line, sizeof(line), "%lld:%.*s;", (long long)off, (int)size, (const char *)buf);
		strncat(got, line, sizeof(got) - strlen(got) - 1);
		nblocks++;
	}
	assert_int_equal(k, ARCHIVE_EOF);
	assert_string_equal(got, "4096:0123456789;1048576:abc;");
	k = archive_read_next_header(a, &ae);
	assert_true(k == ARCHIVE_OK || k == ARCHIVE_WARN);
	assert_string_equal(archive_entry_pathname(ae), "empty/all-hole");
	assert_int_equal(archive_entry_size(ae), 5000);
	while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK)
		assert_int_equal(size, 0);
	assert_int_equal(k, ARCHIVE_EOF);
	assert_int_equal(archive_read_next_header(a, &ae), ARCHIVE_EOF);
	archive_read_free(a);
	cap_buf_fini(&b);

	/* Extents out of order, overlapping, or past the end are refused. */
	struct cap_tar_extent bad1[] = { { 100, 10 }, { 50, 10 } }, bad2[] = { { 0, 10 }, { 5, 10 } },
			      bad3[] = { { 4990, 20 } };
	struct cap_tar_extent *bads[] = { bad1, bad2, bad3 };
	size_t nb[] = { 2, 2, 1 };
	for (size_t i = 0; i < 3; i++) {
		struct cap_tar_entry x = hole;
		x.extents = bads[i];
		x.nextents = nb[i];
		cap_buf_init(&b);
		assert_int_equal(cap_tar_header(&b, &x), -EINVAL);
		assert_int_equal(cap_buf_used(&b), 0);
		cap_buf_fini(&b);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(cap_to_libarchive),
		cmocka_unit_test(cap_to_cap),
		cmocka_unit_test(libarchive_to_cap),
		cmocka_unit_test(huge_size_header),
		cmocka_unit_test(writer_refuses),
		cmocka_unit_test(corrupted_checksum),
		cmocka_unit_test(truncated_archive),
		cmocka_unit_test(absurd_numbers),
		cmocka_unit_test(pax_records),
		cmocka_unit_test(sparse_entries),
		cmocka_unit_test(agent_sha256_matches_openssl),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
