/* Fuzz target for the tar reader (src/proto/tar.c, what the agent reads
 * from the host and the host from the agent): the input is the stream,
 * read through a memfd as the reader reads an fd, every entry and all
 * its data, until the end or an error.
 * Checked for every entry: a path of 1 to CAP_TAR_PATH_MAX bytes without
 * a trailing '/', a symbolic link with a target and no data, a
 * directory with no data, a target only for a link (or an OTHER: a hard
 * link's), permission bits only, a size that fits; the data read is
 * exactly the size; written back with cap_tar_header, a file, directory
 * or link reads back the same (path, type, mode, size, target); an error
 * leaves a message. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "buf.h"
#include "err.h"
#include "fuzz.h"
#include "tar.h"
#include "util.h"

static int mem(const void *p, size_t n)
{
	int fd = memfd_create("fuzz-tar", MFD_CLOEXEC);
	FUZZ_CHECK(fd >= 0, "memfd_create");
	FUZZ_CHECK(n == 0 || pwrite(fd, p, n, 0) == (ssize_t)n, "pwrite");
	return fd;
}

/* The entry written alone, read back. */
static void round_trip(const struct cap_tar_entry *e)
{
	struct cap_buf b;
	cap_buf_init(&b);
	if (cap_tar_header(&b, e) < 0) {
		cap_buf_fini(&b);
		return;	/* not every entry read can be written: fine */
	}
	for (uint64_t i = 0; i < CAP_MIN(e->size, (uint64_t)1 << 16); i++)
		cap_buf_append(&b, "d", 1);
	if (e->size > (uint64_t)1 << 16) {
		cap_buf_fini(&b);
		return;
	}
	cap_tar_pad(&b, e->size);
	cap_tar_end(&b);
	int fd = mem(cap_buf_head(&b), cap_buf_used(&b));
	struct cap_tar_reader r;
	struct cap_tar_entry x;
	struct cap_err err;
	cap_tar_reader_init(&r, fd);
	int k = cap_tar_next(&r, &x, &err);
	FUZZ_CHECK(k == 1, "an entry written back (%s) does not read: %s", e->path, err.msg);
	FUZZ_CHECK(strcmp(x.path, e->path) == 0 && x.type == e->type && x.mode == e->mode && x.size == e->size &&
			   strcmp(x.linkname, e->linkname) == 0,
		   "%s written back reads as %s (type %d/%d, mode %o/%o, size %llu/%llu)", e->path, x.path,
		   (int)e->type, (int)x.type, e->mode, x.mode, (unsigned long long)e->size,
		   (unsigned long long)x.size);
	close(fd);
	cap_buf_fini(&b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	int fd = mem(data, size);
	struct cap_tar_reader r;
	struct cap_tar_entry e;
	struct cap_err err;
	uint8_t buf[4096];
	cap_tar_reader_init(&r, fd);
	int k;
	memset(&err, 0, sizeof(err));
	while ((k = cap_tar_next(&r, &e, &err)) == 1) {
		size_t plen = strlen(e.path);
		FUZZ_CHECK(plen >= 1 && plen <= CAP_TAR_PATH_MAX && (plen == 1 || e.path[plen - 1] != '/'),
			   "a path of %zu bytes: %.200s", plen, e.path);
		FUZZ_CHECK(strlen(e.linkname) <= CAP_TAR_PATH_MAX, "a long target");
		FUZZ_CHECK(e.type != CAP_TAR_SYMLINK || *e.linkname, "a link without a target");
		/* (An OTHER keeps its header's link name: a hard link's.) */
		FUZZ_CHECK(e.type == CAP_TAR_SYMLINK || e.type == CAP_TAR_OTHER || !*e.linkname, "a target for a %c", (char)e.type);
		FUZZ_CHECK(e.mode <= 07777, "mode %o", e.mode);
		FUZZ_CHECK(e.size <= (uint64_t)INT64_MAX, "size %llu", (unsigned long long)e.size);
		FUZZ_CHECK((e.type != CAP_TAR_DIR && e.type != CAP_TAR_SYMLINK) || e.size == 0, "data for a %d", (int)e.type);
		struct cap_tar_entry copy = e;
		char path[CAP_TAR_PATH_MAX + 1], link[CAP_TAR_PATH_MAX + 1];
		snprintf(path, sizeof(path), "%s", e.path);
		snprintf(link, sizeof(link), "%s", e.linkname);
		copy.path = path;
		copy.linkname = link;
		uint64_t got = 0;
		ssize_t m;
		while ((m = cap_tar_read(&r, buf, sizeof(buf), &err)) > 0)
			got += (uint64_t)m;
		if (m < 0) {
			FUZZ_CHECK(err.msg[0], "a read error without a message");
			break;
		}
		FUZZ_CHECK(got == e.size, "%llu data bytes read of %llu", (unsigned long long)got,
			   (unsigned long long)e.size);
		if (e.type != CAP_TAR_OTHER)
			round_trip(&copy);
	}
	FUZZ_CHECK(k == 0 || k == 1 || (k < 0 && err.msg[0]), "cap_tar_next answered %d without a message", k);
	close(fd);
	return 0;
}
