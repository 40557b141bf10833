#include "tar.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "util.h"

/* ustar header fields: offset and length. */
#define F_NAME 0, 100
#define F_MODE 100, 8
#define F_UID 108, 8
#define F_GID 116, 8
#define F_SIZE 124, 12
#define F_MTIME 136, 12
#define F_CHKSUM 148, 8
#define O_TYPE 156
#define F_LINK 157, 100
#define F_MAGIC 257, 6
#define F_VERSION 263, 2
#define F_PREFIX 345, 155

/* The largest value of an 11-digit octal field (size, mtime). */
#define OCTAL11_MAX 077777777777LL
#define OCTAL7_MAX 07777777u

static const uint8_t zeros[CAP_TAR_BLOCK];

/* --- writer ---------------------------------------------------------- */

static void put_octal(uint8_t *h, size_t off, size_t len, uint64_t v)
{
	/* len-1 digits and a NUL; the caller made sure v fits. */
	char tmp[24];
	snprintf(tmp, sizeof(tmp), "%0*llo", (int)(len - 1), (unsigned long long)v);
	memcpy(h + off, tmp, len - 1);
	h[off + len - 1] = '\0';
}

/* GNU base-256: the top bit of the first byte set, big-endian value. */
static void put_base256(uint8_t *h, size_t off, size_t len, uint64_t v)
{
	for (size_t i = len; i-- > 1;) {
		h[off + i] = (uint8_t)(v & 0xff);
		v >>= 8;
	}
	h[off] = 0x80;
}

static void put_field(uint8_t *h, size_t off, size_t len, const char *s, size_t n)
{
	CAP_BUG_ON(n > len);
	memcpy(h + off, s, n);
}

static void put_checksum(uint8_t *h)
{
	unsigned sum = 0;
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < CAP_TAR_BLOCK; i++)
		sum += h[i];
	char tmp[8];
	snprintf(tmp, sizeof(tmp), "%06o", sum);
	memcpy(h + 148, tmp, 6);
	h[154] = '\0';
	h[155] = ' ';
}

/* Fill a header block (zeroed by the caller) but for the checksum. */
static void fill_header(uint8_t *h, const char *name, size_t nlen, const char *prefix,
			size_t plen, char type, uint32_t mode, uint64_t size, int64_t mtime,
			uint32_t uid, uint32_t gid, const char *link, size_t llen)
{
	put_field(h, F_NAME, name, nlen);
	put_octal(h, F_MODE, mode & 07777);
	put_octal(h, F_UID, uid <= OCTAL7_MAX ? uid : 0);
	put_octal(h, F_GID, gid <= OCTAL7_MAX ? gid : 0);
	if (size <= (uint64_t)OCTAL11_MAX)
		put_octal(h, F_SIZE, size);
	else
		put_base256(h, F_SIZE, size);
	put_octal(h, F_MTIME, mtime < 0 ? 0 : mtime > OCTAL11_MAX ? (uint64_t)OCTAL11_MAX : (uint64_t)mtime);
	h[O_TYPE] = (uint8_t)type;
	put_field(h, F_LINK, link, llen);
	memcpy(h + 257, "ustar", 6);	/* with its NUL */
	memcpy(h + 263, "00", 2);
	put_field(h, F_PREFIX, prefix, plen);
}

static size_t digits(size_t v)
{
	size_t d = 1;
	while (v >= 10) {
		v /= 10;
		d++;
	}
	return d;
}

/* Append one pax record "LEN key=value\n", LEN counting itself. */
static void pax_record(struct cap_buf *b, const char *key, const char *val, size_t vlen)
{
	size_t body = 1 + strlen(key) + 1 + vlen + 1;	/* " key=value\n" */
	size_t len = body + digits(body);
	if (digits(len) != digits(body))
		len = body + digits(len);
	char head[32];
	int m = snprintf(head, sizeof(head), "%zu %s=", len, key);
	cap_buf_append(b, head, (size_t)m);
	cap_buf_append(b, val, vlen);
	cap_buf_append(b, "\n", 1);
}

static bool ascii(const char *s, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)s[i] >= 0x80)
			return false;
	return true;
}

/* Where to split a name of n bytes between prefix and name: the index of
 * the '/' that separates them, or 0 when it cannot be split. */
static size_t ustar_split(const char *s, size_t n)
{
	size_t lo = n > 101 ? n - 101 : 1;
	for (size_t i = lo; i <= 155 && i + 1 < n; i++)
		if (s[i] == '/')
			return i;
	return 0;
}

uint64_t cap_tar_data_size(const struct cap_tar_entry *e)
{
	if (e->type != CAP_TAR_FILE)
		return 0;
	if (!e->extents)
		return e->size;
	uint64_t sum = 0;
	for (size_t i = 0; i < e->nextents; i++)
		sum += e->extents[i].length;
	return sum;
}

/* Whether a FILE's extents are sorted, apart and inside its size. */
static bool extents_ok(const struct cap_tar_entry *e)
{
	if (e->nextents > CAP_TAR_MAX_EXTENTS)
		return false;
	uint64_t end = 0;
	for (size_t i = 0; i < e->nextents; i++) {
		const struct cap_tar_extent *x = &e->extents[i];
		if (x->offset < end || x->length > e->size || x->offset > e->size - x->length)
			return false;
		end = x->offset + x->length;
	}
	return true;
}

/* The sparse map of a FILE with extents, padded to a block: the extents
 * and a last one of length 0 at the file's end (what GNU tar writes, so
 * that a trailing hole is kept by every reader). */
static void sparse_map(struct cap_buf *b, const struct cap_tar_entry *e)
{
	char num[48];
	int m = snprintf(num, sizeof(num), "%zu\n", e->nextents + 1);
	cap_buf_append(b, num, (size_t)m);
	for (size_t i = 0; i <= e->nextents; i++) {
		uint64_t off = i < e->nextents ? e->extents[i].offset : e->size;
		uint64_t len = i < e->nextents ? e->extents[i].length : 0;
		m = snprintf(num, sizeof(num), "%llu\n%llu\n", (unsigned long long)off, (unsigned long long)len);
		cap_buf_append(b, num, (size_t)m);
	}
	cap_tar_pad(b, cap_buf_used(b));
}

int cap_tar_header(struct cap_buf *out, const struct cap_tar_entry *e)
{
	if (!e->path || !*e->path)
		return -EINVAL;
	if (e->type != CAP_TAR_FILE && e->type != CAP_TAR_DIR && e->type != CAP_TAR_SYMLINK)
		return -EINVAL;
	const char *link = e->type == CAP_TAR_SYMLINK ? e->linkname : "";
	if (!link || (e->type == CAP_TAR_SYMLINK && !*link))
		return -EINVAL;
	size_t plen = strlen(e->path), llen = strlen(link);
	if (plen > CAP_TAR_PATH_MAX || llen > CAP_TAR_PATH_MAX)
		return -ENAMETOOLONG;
	if (e->type != CAP_TAR_DIR && e->path[plen - 1] == '/')
		return -EINVAL;	/* readers would take it for a directory */

	char full[CAP_TAR_PATH_MAX + 2];
	memcpy(full, e->path, plen);
	if (e->type == CAP_TAR_DIR && full[plen - 1] != '/')
		full[plen++] = '/';
	full[plen] = '\0';
	uint64_t size = e->type == CAP_TAR_FILE ? e->size : 0;
	if (size > (uint64_t)INT64_MAX)
		return -EFBIG;
	bool sparse = e->type == CAP_TAR_FILE && e->extents;
	struct cap_buf map;
	cap_buf_init(&map);
	if (sparse) {
		if (!extents_ok(e)) {
			cap_buf_fini(&map);
			return -EINVAL;
		}
		sparse_map(&map, e);
		size = cap_buf_used(&map) + cap_tar_data_size(e);	/* what follows the header */
	}

	const char *name = full, *prefix = "";
	size_t nlen = plen, pfx = 0;
	bool pax_path = false;
	char sname[101];
	if (sparse) {
		/* The real name is GNU.sparse.name; the header's is GNU tar's
		 * placeholder, for readers without the format. */
		const char *base = strrchr(e->path, '/');
		base = base ? base + 1 : e->path;
		nlen = (size_t)snprintf(sname, sizeof(sname), "GNUSparseFile.0/%.80s", base);
		name = sname;
	} else if (plen > 100) {
		size_t cut = ustar_split(full, plen);
		if (cut) {
			prefix = full;
			pfx = cut;
			name = full + cut + 1;
			nlen = plen - cut - 1;
		} else {
			pax_path = true;
			nlen = 100;	/* the start of it, for readers without pax */
		}
	}
	bool pax_link = llen > 100;
	bool pax_size = size > (uint64_t)OCTAL11_MAX;
	bool pax_mtime = e->mtime < 0 || e->mtime > OCTAL11_MAX;
	bool pax = pax_path || pax_link || pax_size || pax_mtime || sparse;

	if (pax) {
		struct cap_buf rec;
		cap_buf_init(&rec);
		if (((pax_path || sparse) && !ascii(full, plen)) || (pax_link && !ascii(link, llen)))
			pax_record(&rec, "hdrcharset", "BINARY", 6);
		if (pax_path)
			pax_record(&rec, "path", full, plen);
		if (sparse) {
			char num[32];
			int m = snprintf(num, sizeof(num), "%llu", (unsigned long long)e->size);
			pax_record(&rec, "GNU.sparse.major", "1", 1);
			pax_record(&rec, "GNU.sparse.minor", "0", 1);
			pax_record(&rec, "GNU.sparse.name", full, plen);
			pax_record(&rec, "GNU.sparse.realsize", num, (size_t)m);
		}
		if (pax_link)
			pax_record(&rec, "linkpath", link, llen);
		if (pax_size || pax_mtime) {
			char num[32];
			if (pax_size) {
				int m = snprintf(num, sizeof(num), "%llu", (unsigned long long)size);
				pax_record(&rec, "size", num, (size_t)m);
			}
			if (pax_mtime) {
				int m = snprintf(num, sizeof(num), "%lld", (long long)e->mtime);
				pax_record(&rec, "mtime", num, (size_t)m);
			}
		}
		/* Its own name: "PaxHeader/" and the entry's last component. */
		char xname[101];
		const char *base = e->path + plen;
		size_t blen = 0;
		while (base > e->path && base[-1] == '/')
			base--;
		const char *end = base;
		while (base > e->path && base[-1] != '/')
			base--;
		blen = CAP_MIN((size_t)(end - base), (size_t)90);
		int xn = snprintf(xname, sizeof(xname), "PaxHeader/%.*s", (int)blen, base);
		uint8_t *h = cap_buf_reserve(out, CAP_TAR_BLOCK);
		memset(h, 0, CAP_TAR_BLOCK);
		fill_header(h, xname, (size_t)xn, "", 0, 'x', 0644, cap_buf_used(&rec), e->mtime,
			    0, 0, "", 0);
		put_checksum(h);
		cap_buf_commit(out, CAP_TAR_BLOCK);
		cap_buf_append(out, cap_buf_head(&rec), cap_buf_used(&rec));
		cap_tar_pad(out, cap_buf_used(&rec));
		cap_buf_fini(&rec);
	}
	static const char types[] = { [CAP_TAR_FILE] = '0', [CAP_TAR_DIR] = '5', [CAP_TAR_SYMLINK] = '2' };
	uint8_t *h = cap_buf_reserve(out, CAP_TAR_BLOCK);
	memset(h, 0, CAP_TAR_BLOCK);
	fill_header(h, name, nlen, prefix, pfx, types[e->type], e->mode, size, e->mtime, e->uid,
		    e->gid, link, CAP_MIN(llen, (size_t)100));
	put_checksum(h);
	cap_buf_commit(out, CAP_TAR_BLOCK);
	if (sparse)
		cap_buf_append(out, cap_buf_head(&map), cap_buf_used(&map));
	cap_buf_fini(&map);
	return 0;
}

size_t cap_tar_padding(uint64_t size)
{
	return (size_t)((CAP_TAR_BLOCK - size % CAP_TAR_BLOCK) % CAP_TAR_BLOCK);
}

void cap_tar_pad(struct cap_buf *out, uint64_t size)
{
	size_t n = cap_tar_padding(size);
	if (n)
		cap_buf_append(out, zeros, n);
}

void cap_tar_end(struct cap_buf *out)
{
	cap_buf_append(out, zeros, CAP_TAR_BLOCK);
	cap_buf_append(out, zeros, CAP_TAR_BLOCK);
}

int cap_tar_write_header(int fd, const struct cap_tar_entry *e)
{
	struct cap_buf b;
	cap_buf_init(&b);
	int r = cap_tar_header(&b, e);
	if (r == 0)
		r = cap_write_all(fd, cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
	return r;
}

int cap_tar_write_padding(int fd, uint64_t size)
{
	size_t n = cap_tar_padding(size);
	return n ? cap_write_all(fd, zeros, n) : 0;
}

int cap_tar_write_end(int fd)
{
	int r = cap_write_all(fd, zeros, CAP_TAR_BLOCK);
	return r < 0 ? r : cap_write_all(fd, zeros, CAP_TAR_BLOCK);
}

/* --- reader ---------------------------------------------------------- */

void cap_tar_reader_init(struct cap_tar_reader *r, int fd)
{
	memset(r, 0, sizeof(*r));
	r->fd = fd;
}

/* Read up to n bytes, looping over short reads and EINTR: the count (less
 * than n only at the end of the file) or -errno. */
static ssize_t read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;
	while (got < n) {
		ssize_t k = read(fd, (uint8_t *)buf + got, n - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		got += (size_t)k;
	}
	return (ssize_t)got;
}

/* Fail the reader: every later call gives the same code. */
static int fail(struct cap_tar_reader *r, struct cap_err *err, int code, const char *msg,
		const char *what)
{
	r->done = true;
	r->status = -code;
	r->left = r->pad = 0;
	return cap_err_set(err, code, "tar stream at byte %llu: %s%s",
			   (unsigned long long)r->offset, msg, what ? what : "");
}

/* Read exactly n bytes of the archive; -EPIPE at an early end. */
static int take(struct cap_tar_reader *r, void *buf, size_t n, struct cap_err *err)
{
	ssize_t k = read_full(r->fd, buf, n);
	if (k < 0)
		return fail(r, err, (int)-k, "cannot read: ", strerror((int)-k));
	r->offset += (uint64_t)k;
	if ((size_t)k < n)
		return fail(r, err, EPIPE, "the archive ends in the middle of an entry", NULL);
	return 0;
}

/* Read and drop n bytes. */
static int skip(struct cap_tar_reader *r, uint64_t n, struct cap_err *err)
{
	uint8_t buf[16 * 1024];
	while (n > 0) {
		size_t k = (size_t)CAP_MIN(n, (uint64_t)sizeof(buf));
		int e = take(r, buf, k, err);
		if (e < 0)
			return e;
		n -= k;
	}
	return 0;
}

/* A numeric field: octal digits (leading spaces, then a space or NUL
 * ends them; only spaces and NULs may follow) or GNU base-256 (the top
 * bit of the first byte; negative values refused). Empty is 0. */
static bool get_number(const uint8_t *h, size_t off, size_t len, uint64_t max, uint64_t *out)
{
	const uint8_t *p = h + off;
	uint64_t v = 0;
	if (p[0] & 0x80) {
		if (p[0] & 0x40)
			return false;	/* negative */
		v = p[0] & 0x3f;
		for (size_t i = 1; i < len; i++) {
			if (v > (UINT64_MAX >> 8))
				return false;
			v = (v << 8) | p[i];
		}
		if (v > max)
			return false;
		*out = v;
		return true;
	}
	size_t i = 0;
	while (i < len && p[i] == ' ')
		i++;
	for (; i < len && p[i] >= '0' && p[i] <= '7'; i++) {
		if (v > (max >> 3))
			return false;
		v = (v << 3) | (uint64_t)(p[i] - '0');
		if (v > max)
			return false;
	}
	for (; i < len; i++)
		if (p[i] != ' ' && p[i] != '\0')
			return false;
	*out = v;
	return true;
}

static bool checksum_ok(const uint8_t *h)
{
	uint64_t want;
	if (!get_number(h, F_CHKSUM, 0777777, &want))
		return false;
	unsigned long usum = 0;
	long ssum = 0;
	for (size_t i = 0; i < CAP_TAR_BLOCK; i++) {
		uint8_t c = i >= 148 && i < 156 ? ' ' : h[i];
		usum += c;
		ssum += (signed char)c;
	}
	return want == usum || (ssum >= 0 && want == (unsigned long)ssum);
}

static bool zero_block(const uint8_t *h)
{
	return memcmp(h, zeros, CAP_TAR_BLOCK) == 0;
}

/* What a pax 'x' header or GNU long names set for the next entry. */
struct pending {
	bool path, link, size, mtime;
	uint64_t size_v;
	int64_t mtime_v;
};

/* A pax decimal: digits only, at most max. */
static bool pax_decimal(const char *s, size_t n, uint64_t max, uint64_t *out)
{
	uint64_t v = 0;
	if (n == 0)
		return false;
	for (size_t i = 0; i < n; i++) {
		if (s[i] < '0' || s[i] > '9' || v > (max - (uint64_t)(s[i] - '0')) / 10)
			return false;
		v = v * 10 + (uint64_t)(s[i] - '0');
	}
	*out = v;
	return true;
}

/* Copy a name (path or link target) from a record into dst: 1 to
 * CAP_TAR_PATH_MAX bytes without NUL. */
static bool set_name(char *dst, const char *s, size_t n)
{
	if (n == 0 || n > CAP_TAR_PATH_MAX || memchr(s, '\0', n))
		return false;
	memcpy(dst, s, n);
	dst[n] = '\0';
	return true;
}

/* Apply the records of a pax extended header p[0..n). */
static int parse_pax(struct cap_tar_reader *r, const char *p, size_t n, struct pending *pd,
		     struct cap_err *err)
{
	size_t pos = 0;
	while (pos < n) {
		if (p[pos] == '\0') {	/* padding some writers leave: only NULs to the end */
			for (; pos < n; pos++)
				if (p[pos] != '\0')
					return fail(r, err, EBADMSG, "a pax header has bytes after a NUL", NULL);
			break;
		}
		size_t len = 0, i = pos;
		for (; i < n && p[i] >= '0' && p[i] <= '9' && i - pos < 7; i++)
			len = len * 10 + (size_t)(p[i] - '0');
		if (i == pos || i >= n || p[i] != ' ' || len <= i - pos + 1 || len > n - pos ||
		    p[pos + len - 1] != '\n')
			return fail(r, err, EBADMSG, "a pax record has a bad length", NULL);
		const char *kv = p + i + 1, *end = p + pos + len - 1;
		const char *eq = memchr(kv, '=', (size_t)(end - kv));
		if (!eq || eq == kv)
			return fail(r, err, EBADMSG, "a pax record has no keyword", NULL);
		size_t klen = (size_t)(eq - kv), vlen = (size_t)(end - eq - 1);
		const char *v = eq + 1;
		/* An empty value removes the keyword: the header's field stands. */
		if (klen == 4 && memcmp(kv, "path", 4) == 0) {
			if (vlen == 0)
				pd->path = false;
			else if (!(pd->path = set_name(r->path, v, vlen)))
				return fail(r, err, EBADMSG, "a pax path is over 4096 bytes or holds a NUL", NULL);
		} else if (klen == 8 && memcmp(kv, "linkpath", 8) == 0) {
			if (vlen == 0)
				pd->link = false;
			else if (!(pd->link = set_name(r->linkname, v, vlen)))
				return fail(r, err, EBADMSG, "a pax linkpath is over 4096 bytes or holds a NUL", NULL);
		} else if (klen == 4 && memcmp(kv, "size", 4) == 0) {
			if (vlen == 0)
				pd->size = false;
			else if (!(pd->size = pax_decimal(v, vlen, INT64_MAX, &pd->size_v)))
				return fail(r, err, EBADMSG, "a pax size is not a number below 2^63", NULL);
		} else if (klen == 5 && memcmp(kv, "mtime", 5) == 0) {
			/* [-]SECONDS[.FRACTION]: the seconds are kept. */
			bool neg = vlen > 0 && v[0] == '-';
			const char *d = v + neg;
			size_t dl = vlen - neg, sec = 0;
			while (sec < dl && d[sec] != '.')
				sec++;
			for (size_t k = sec + 1; k < dl; k++)
				if (d[k] < '0' || d[k] > '9')
					sec = 0;	/* refused below */
			uint64_t t;
			if (vlen == 0) {
				pd->mtime = false;
			} else if (!pax_decimal(d, sec, INT64_MAX, &t)) {
				return fail(r, err, EBADMSG, "a pax mtime is not a number", NULL);
			} else {
				pd->mtime = true;
				pd->mtime_v = neg ? -(int64_t)t : (int64_t)t;
			}
		}
		pos += len;
	}
	return 0;
}

/* Read a meta entry's data (pax header or GNU long name) of size bytes,
 * at most max, into a new buffer with a NUL after it. */
static int take_meta(struct cap_tar_reader *r, uint64_t size, uint64_t max, const char *what,
		     char **out, struct cap_err *err)
{
	if (size > max)
		return fail(r, err, EBADMSG, "an oversized ", what);
	char *buf = xmalloc((size_t)size + 1);
	int e = take(r, buf, (size_t)size, err);
	if (e == 0)
		e = skip(r, cap_tar_padding(size), err);
	if (e < 0) {
		free(buf);
		return e;
	}
	buf[size] = '\0';
	*out = buf;
	return 0;
}

int cap_tar_next(struct cap_tar_reader *r, struct cap_tar_entry *e, struct cap_err *err)
{
	struct pending pd = { 0 };
	uint8_t h[CAP_TAR_BLOCK];
	int rc;

	if (r->done)
		return r->status < 0 ? cap_err_set(err, -r->status, "tar stream: read on after an error")
				     : 0;
	if ((rc = skip(r, r->left + r->pad, err)) < 0)
		return rc;
	r->left = r->pad = 0;
	for (;;) {
		ssize_t k = read_full(r->fd, h, sizeof(h));
		if (k < 0)
			return fail(r, err, (int)-k, "cannot read: ", strerror((int)-k));
		r->offset += (uint64_t)k;
		if (k == 0)
			return fail(r, err, EPIPE, "the archive ends without its end-of-archive blocks", NULL);
		if (k < (ssize_t)sizeof(h))
			return fail(r, err, EPIPE, "the archive ends in the middle of a header", NULL);
		if (zero_block(h)) {
			if (pd.path || pd.link || pd.size || pd.mtime)
				return fail(r, err, EBADMSG, "the archive ends after a pax header or long name", NULL);
			/* The second zero block, when there is one. */
			k = read_full(r->fd, h, sizeof(h));
			if (k > 0)
				r->offset += (uint64_t)k;
			r->done = true;
			return 0;
		}
		if (!checksum_ok(h))
			return fail(r, err, EBADMSG, "a header's checksum does not match (not a tar stream, or corrupted)", NULL);
		uint64_t size, mode, mtime;
		if (!get_number(h, F_SIZE, INT64_MAX, &size))
			return fail(r, err, EBADMSG, "a header's size is not a number below 2^63", NULL);
		if (!get_number(h, F_MODE, UINT64_MAX, &mode) || !get_number(h, F_MTIME, INT64_MAX, &mtime))
			return fail(r, err, EBADMSG, "a header's mode or mtime is not a number", NULL);
		char type = (char)h[O_TYPE];
		char *meta = NULL;
		switch (type) {
		case 'x':
			if ((rc = take_meta(r, size, CAP_TAR_PAX_MAX, "pax header", &meta, err)) < 0)
				return rc;
			rc = parse_pax(r, meta, (size_t)size, &pd, err);
			free(meta);
			if (rc < 0)
				return rc;
			continue;
		case 'g':
			if (size > CAP_TAR_PAX_MAX)
				return fail(r, err, EBADMSG, "an oversized pax global header", NULL);
			if ((rc = skip(r, size + cap_tar_padding(size), err)) < 0)
				return rc;
			continue;
		case 'L':
		case 'K':
			if ((rc = take_meta(r, size, CAP_TAR_PATH_MAX + 1, "GNU long name", &meta, err)) < 0)
				return rc;
			/* The name ends at its first NUL (GNU counts one in the size). */
			if (!set_name(type == 'L' ? r->path : r->linkname, meta, strlen(meta))) {
				free(meta);
				return fail(r, err, EBADMSG, "an empty GNU long name", NULL);
			}
			free(meta);
			if (type == 'L')
				pd.path = true;
			else
				pd.link = true;
			continue;
		default:
			break;
		}

		if (!pd.path) {
			/* POSIX ustar has a prefix; old GNU uses that space otherwise. */
			bool posix = memcmp(h + 257, "ustar", 6) == 0;
			size_t plen = posix ? strnlen((const char *)h + 345, 155) : 0;
			size_t nlen = strnlen((const char *)h, 100);
			size_t n = 0;
			if (plen) {
				memcpy(r->path, h + 345, plen);
				r->path[plen] = '/';
				n = plen + 1;
			}
			memcpy(r->path + n, h, nlen);
			r->path[n + nlen] = '\0';
		}
		if (!pd.link) {
			size_t llen = strnlen((const char *)h + 157, 100);
			memcpy(r->linkname, h + 157, llen);
			r->linkname[llen] = '\0';
		}
		size_t plen = strlen(r->path);
		while (plen > 1 && r->path[plen - 1] == '/')
			r->path[--plen] = '\0';
		if (plen == 0)
			return fail(r, err, EBADMSG, "an entry has no name", NULL);
		if (pd.size)
			size = pd.size_v;
		if (pd.mtime)
			mtime = (uint64_t)pd.mtime_v;

		enum cap_tar_type t;
		switch (type) {
		case '0':
		case '\0':
		case '7':
			t = CAP_TAR_FILE;
			break;
		case '5':
			t = CAP_TAR_DIR;
			break;
		case '2':
			t = CAP_TAR_SYMLINK;
			break;
		default:
			t = CAP_TAR_OTHER;
			break;
		}
		/* Links, devices, FIFOs and directories carry no data,
		 * whatever their size field says. */
		bool data = t == CAP_TAR_FILE || (t == CAP_TAR_OTHER && !strchr("13456", type));
		if (!data)
			size = 0;
		if (t == CAP_TAR_SYMLINK && !*r->linkname)
			return fail(r, err, EBADMSG, "a symbolic link without a target: ", r->path);
		if (t != CAP_TAR_SYMLINK && t != CAP_TAR_OTHER)
			r->linkname[0] = '\0';
		r->left = size;
		r->pad = cap_tar_padding(size);
		*e = (struct cap_tar_entry){
			.path = r->path, .linkname = r->linkname, .type = t, .typeflag = type,
			.mode = (uint32_t)(mode & 07777), .size = size, .mtime = (int64_t)mtime,
		};
		uint64_t id;
		if (get_number(h, F_UID, UINT32_MAX, &id))
			e->uid = (uint32_t)id;
		if (get_number(h, F_GID, UINT32_MAX, &id))
			e->gid = (uint32_t)id;
		return 1;
	}
}

ssize_t cap_tar_read(struct cap_tar_reader *r, void *buf, size_t n, struct cap_err *err)
{
	if (r->left == 0 || n == 0)
		return 0;
	size_t want = (size_t)CAP_MIN((uint64_t)n, r->left);
	ssize_t k;
	do
		k = read(r->fd, buf, want);
	while (k < 0 && errno == EINTR);
	if (k < 0) {
		int e = errno;
		return fail(r, err, e, "cannot read: ", strerror(e));
	}
	if (k == 0)
		return fail(r, err, EPIPE, "the archive ends in the middle of the data of ", r->path);
	r->offset += (uint64_t)k;
	r->left -= (uint64_t)k;
	return k;
}
