/* A small tar codec, libc only: the guest agent's side of FILE TAR_OUT and
 * TAR_IN (docs/protocol.md). The host uses libarchive; this codec speaks
 * the subset both agree on.
 *
 * Writer: POSIX ustar headers; a name that does not fit ustar's name and
 * prefix fields, a link target over 100 bytes, a size of 8 GiB or more or
 * an mtime outside ustar's range goes in a pax 'x' extended header
 * (records path, linkpath, size, mtime) before the entry. A file with
 * holes may go in the pax sparse format 1.0 (GNU tar's and libarchive's:
 * records GNU.sparse.major=1, minor=0, name and realsize; the entry's
 * data is the map, "COUNT\n" then "OFFSET\nLENGTH\n" per extent in
 * decimal, padded to a block, then the extents' bytes), so that its holes
 * cross as holes. The reader below does not take that format (only the
 * host, with libarchive, reads what TAR_OUT sends).
 *
 * Reader: ustar and pre-POSIX ("old GNU") headers with their checksum
 * verified (unsigned or signed sum), numbers in octal or GNU base-256;
 * pax 'x' records path, linkpath, size and mtime applied to the next
 * entry (other keywords ignored), pax 'g' headers skipped, GNU 'L' and 'K'
 * long names applied. Every number and length is bounds-checked before
 * use: names at most CAP_TAR_PATH_MAX bytes, a pax header at most
 * CAP_TAR_PAX_MAX, sizes below 2^63. It reads a blocking fd in whole
 * blocks and never seeks, so it works on pipes. */
#ifndef CAP_TAR_H
#define CAP_TAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "buf.h"
#include "err.h"

#define CAP_TAR_BLOCK 512
/* The longest name or link target either side accepts, in bytes. */
#define CAP_TAR_PATH_MAX 4096
/* The largest pax extended header or GNU long name the reader takes. */
#define CAP_TAR_PAX_MAX (64 * 1024)

enum cap_tar_type {
	CAP_TAR_FILE = 'f',	/* '0', '\0' or '7' */
	CAP_TAR_DIR = 'd',	/* '5' */
	CAP_TAR_SYMLINK = 'l',	/* '2' */
	CAP_TAR_OTHER = 'o',	/* anything else (hard links, devices, FIFOs...): refuse by name */
};

/* A run of data in a sparse file: what is not in one is a hole. */
struct cap_tar_extent {
	uint64_t offset, length;
};

/* One entry. For the writer every pointer is borrowed. From the reader,
 * path and linkname point into the reader and stay valid until the next
 * cap_tar_next or cap_tar_reader_fini. */
struct cap_tar_entry {
	const char *path;	/* NUL-free, 1..CAP_TAR_PATH_MAX bytes; the reader strips trailing '/' */
	const char *linkname;	/* SYMLINK: the target; OTHER: the header's link name (a hard link's target, or ""); "" for FILE and DIR */
	enum cap_tar_type type;
	char typeflag;	/* the header's raw type byte (names an OTHER) */
	uint32_t mode;	/* permission bits, 07777 */
	uint64_t size;	/* the data bytes that follow: FILE's, an OTHER's (e.g.
			 * a sparse file); 0 for DIR and SYMLINK */
	int64_t mtime;	/* seconds since the epoch */
	uint32_t uid, gid;	/* written when they fit ustar's fields, else 0 */
	/* Writer, FILE: the data of a file with holes, sorted, apart, inside
	 * size (at most CAP_TAR_MAX_EXTENTS), or NULL for a plain file. */
	const struct cap_tar_extent *extents;
	size_t nextents;
};

/* Most extents a sparse entry is written with. */
#define CAP_TAR_MAX_EXTENTS 65536

/* --- writer ---------------------------------------------------------- */

/* Append the header block(s) of e to out: a pax 'x' header first when
 * needed, then the ustar header (a directory's name gets a trailing '/').
 * The caller then appends e->size data bytes and cap_tar_pad; for a FILE
 * with extents, the header is followed by its sparse map already, and the
 * caller appends each extent's bytes in order, then cap_tar_pad of their
 * sum (cap_tar_data_size gives what follows the header in all). -EINVAL for
 * extents that are not sorted, apart and inside size, or over
 * CAP_TAR_MAX_EXTENTS;
 * an empty path or link target of a SYMLINK, a type other than FILE, DIR
 * or SYMLINK, a FILE or SYMLINK path ending in '/', -ENAMETOOLONG for a name over CAP_TAR_PATH_MAX; out is
 * unchanged on failure. */
int cap_tar_header(struct cap_buf *out, const struct cap_tar_entry *e);
/* The data bytes the caller appends after cap_tar_header of e (its size,
 * or for a sparse FILE the sum of its extents). */
uint64_t cap_tar_data_size(const struct cap_tar_entry *e);
/* The zero bytes that pad size data bytes to a whole block. */
size_t cap_tar_padding(uint64_t size);
/* Append that padding to out. */
void cap_tar_pad(struct cap_buf *out, uint64_t size);
/* Append the end of the archive: two zero blocks. */
void cap_tar_end(struct cap_buf *out);

/* The same straight to a blocking fd: 0 or -errno (the write's, or the
 * header's as above). */
int cap_tar_write_header(int fd, const struct cap_tar_entry *e);
int cap_tar_write_padding(int fd, uint64_t size);
int cap_tar_write_end(int fd);

/* --- reader ---------------------------------------------------------- */

/* Reads one archive from a blocking fd (borrowed: not closed). */
struct cap_tar_reader {
	int fd;
	uint64_t left;	/* data bytes of the current entry not read yet */
	uint64_t pad;	/* padding after them */
	uint64_t offset;	/* bytes consumed from fd, for messages */
	bool done;	/* end of archive reached or an error seen */
	int status;	/* then: 0 at the end, -errno after an error */
	char path[CAP_TAR_PATH_MAX + 1];
	char linkname[CAP_TAR_PATH_MAX + 1];
};

void cap_tar_reader_init(struct cap_tar_reader *r, int fd);

/* Move to the next entry, skipping what is left of the current one's
 * data. 1 with *e filled, 0 at the end of the archive (a zero block; a
 * second one is read when present), -EBADMSG for a malformed archive
 * (checksum, number, length, pax record), -EPIPE when it ends early, or
 * the read's -errno; err says which and at what offset. After the end
 * every call returns 0, after an error the same -errno. */
int cap_tar_next(struct cap_tar_reader *r, struct cap_tar_entry *e, struct cap_err *err);

/* Read up to n bytes of the current entry's data into buf: the count
 * (0 once all is read), -EPIPE when the archive ends early or the read's
 * -errno, with err set. The padding is skipped by the next cap_tar_next. */
ssize_t cap_tar_read(struct cap_tar_reader *r, void *buf, size_t n, struct cap_err *err);

#endif
