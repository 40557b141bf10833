/* Manifests of directory trees: scanning a host tree, the text form
 * shared with the guest agent, and comparing two manifests. */
#include "tree.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"
#include "sha256.h"
#include "util.h"


void cap_tree_init(struct cap_tree *t)
{
	*t = (struct cap_tree){ 0 };
}

void cap_tree_fini(struct cap_tree *t)
{
	for (size_t i = 0; i < t->n; i++) {
		free(t->v[i].path);
		free(t->v[i].target);
	}
	free(t->v);
	cap_tree_init(t);
}

static int cmp_entry(const void *a, const void *b)
{
	return strcmp(((const struct cap_tree_entry *)a)->path,
		      ((const struct cap_tree_entry *)b)->path);
}

static int cmp_key(const void *key, const void *e)
{
	return strcmp(key, ((const struct cap_tree_entry *)e)->path);
}

const struct cap_tree_entry *cap_tree_find(const struct cap_tree *t, const char *path)
{
	if (!t->n)
		return NULL;
	return bsearch(path, t->v, t->n, sizeof(*t->v), cmp_key);
}

bool cap_tree_entry_same(const struct cap_tree_entry *a, const struct cap_tree_entry *b)
{
	return a->type == b->type && a->mode == b->mode &&
	       memcmp(a->hash, b->hash, sizeof(a->hash)) == 0;
}

static void hex_to_hash(const char hex[65], uint8_t out[32])
{
	for (int i = 0; i < 32; i++) {
		unsigned v;
		CAP_BUG_ON(sscanf(hex + 2 * i, "%2x", &v) != 1);
		out[i] = (uint8_t)v;
	}
}

static void hash_bytes(const void *p, size_t n, uint8_t out[32])
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, p, n);
	cap_sha256_final_hex(&h, hex);
	hex_to_hash(hex, out);
}

int cap_tree_hash_fd(int fd, uint8_t hash[32], uint64_t *size)
{
	struct cap_sha256 h;
	char hex[65];
	uint64_t total = 0;
	cap_sha256_init(&h);
	int r = cap_sha256_update_fd(&h, fd, &total);
	cap_sha256_final_hex(&h, hex);
	if (r < 0)
		return r;
	hex_to_hash(hex, hash);
	*size = total;
	return 0;
}

/* --- paths and links ------------------------------------------------------ */

bool cap_tree_path_ok(const char *path)
{
	size_t len = strlen(path), depth = 0;
	if (len == 0 || len > CAP_TREE_MAX_PATH)
		return false;
	const char *p = path;
	for (;;) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		if (++depth > CAP_TREE_MAX_DEPTH)
			return false;
		if (!slash)
			return true;
		p = slash + 1;
	}
}

bool cap_tree_link_inside(const char *path, const char *target)
{
	if (!*target || target[0] == '/')
		return false;
	long depth = 0;	/* of the link's directory below the root */
	for (const char *p = path; (p = strchr(p, '/')); p++)
		depth++;
	const char *p = target;
	bool descended = false;
	while (*p) {
		const char *slash = strchr(p, '/');
		size_t n = slash ? (size_t)(slash - p) : strlen(p);
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (descended || --depth < 0)
				return false;
		} else if (n > 0 && !(n == 1 && p[0] == '.')) {
			descended = true;
		}
		p += n + (slash ? 1 : 0);
	}
	return true;
}

/* --- scanning a host tree ------------------------------------------------- */

struct scan {
	const struct cap_tree_scan_opts *o;
	const char *dir;
	uint64_t max_entries, max_bytes;
	dev_t rootdev;
	struct cap_tree t;
	size_t cap;
	struct cap_err *err;
};

static const char *kind(mode_t m)
{
	switch (m & S_IFMT) {
	case S_IFCHR: return "a character device";
	case S_IFBLK: return "a block device";
	case S_IFIFO: return "a FIFO";
	case S_IFSOCK: return "a socket";
	default: return "of an unsupported type";
	}
}

static struct cap_tree_entry *add(struct scan *s, char *path, char type, mode_t mode)
{
	if (s->t.n == s->cap) {
		s->cap = s->cap ? s->cap * 2 : 256;
		s->t.v = xrealloc(s->t.v, s->cap * sizeof(*s->t.v));
	}
	struct cap_tree_entry *e = &s->t.v[s->t.n++];
	*e = (struct cap_tree_entry){ .path = path, .type = type, .mode = (uint32_t)mode & 07777 };
	return e;
}

static int scan_file(struct scan *s, int dfd, const char *name, const char *rel,
		     const struct stat *st, struct cap_tree_entry *e)
{
	char buf[256];
	if (st->st_size < 0 || (uint64_t)st->st_size > s->max_bytes - CAP_MIN(s->t.bytes, s->max_bytes))
		return cap_err_set(s->err, EFBIG, "%s/%s takes the tree over its limit of %" PRIu64 " bytes of files; remove large files or raise the limit",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)), s->max_bytes);
	_cleanup_close_ int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
	struct stat fst;
	if (fd < 0 || fstat(fd, &fst) < 0)
		return cap_err_set(s->err, errno, "cannot read %s/%s: %s", s->dir,
				   cap_path_shown(rel, buf, sizeof(buf)), strerror(errno));
	if (fst.st_ino != st->st_ino || fst.st_dev != st->st_dev || !S_ISREG(fst.st_mode))
		return cap_err_set(s->err, ESTALE, "%s/%s changed while it was read; try again",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)));
	int r = cap_tree_hash_fd(fd, e->hash, &e->size);
	if (r < 0)
		return cap_err_set(s->err, -r, "cannot read %s/%s: %s", s->dir,
				   cap_path_shown(rel, buf, sizeof(buf)), strerror(-r));
	if (e->size > s->max_bytes - s->t.bytes)
		return cap_err_set(s->err, EFBIG, "%s/%s takes the tree over its limit of %" PRIu64 " bytes of files; remove large files or raise the limit",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)), s->max_bytes);
	s->t.bytes += e->size;
	return 0;
}

static int scan_link(struct scan *s, int dfd, const char *name, const char *rel,
		     const struct stat *st, struct cap_tree_entry *e)
{
	char buf[256];
	if (st->st_size < 0 || (uint64_t)st->st_size > CAP_TREE_MAX_PATH)
		return cap_err_set(s->err, ENAMETOOLONG, "%s/%s is a symbolic link whose target is over %u bytes; remove it or replace it with a copy",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)), CAP_TREE_MAX_PATH);
	char *target = xmalloc(CAP_TREE_MAX_PATH + 2);
	ssize_t n = readlinkat(dfd, name, target, CAP_TREE_MAX_PATH + 1);
	if (n < 0 || n > (ssize_t)CAP_TREE_MAX_PATH) {
		int code = n < 0 ? errno : ENAMETOOLONG;
		free(target);
		return cap_err_set(s->err, code, "cannot read the symbolic link %s/%s: %s",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)), strerror(code));
	}
	target[n] = '\0';
	e->target = target;
	e->size = (uint64_t)n;
	hash_bytes(target, (size_t)n, e->hash);
	if (s->o->strict && !cap_tree_link_inside(rel, target))
		return cap_err_set(s->err, EINVAL, "%s/%s is a symbolic link to %s, which %s; links must stay inside the tree: remove it or replace it with a copy of what it points to",
				   s->dir, cap_path_shown(rel, buf, sizeof(buf)), target,
				   target[0] == '/' ? "is absolute" : "leaves the tree");
	return 0;
}

static int scan_dir(struct scan *s, int dfd, const char *rel, unsigned depth);

/* One entry of a directory: checked, listed and, for a directory, walked. */
static int scan_one(struct scan *s, int dfd, const char *name, char *path, unsigned depth)
{
	char buf[256];
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		int e = errno, r = 0;
		if (e != ENOENT)	/* else gone since the directory was listed */
			r = cap_err_set(s->err, e, "cannot read %s/%s: %s", s->dir,
					cap_path_shown(path, buf, sizeof(buf)), strerror(e));
		free(path);
		return r;
	}
	if (strlen(path) > CAP_TREE_MAX_PATH || depth > CAP_TREE_MAX_DEPTH) {
		int r = cap_err_set(s->err, ENAMETOOLONG, "%s/%s is a path over %u bytes or %u levels deep; shorten it",
				    s->dir, cap_path_shown(path, buf, sizeof(buf)), CAP_TREE_MAX_PATH, CAP_TREE_MAX_DEPTH);
		free(path);
		return r;
	}
	if (s->t.n >= s->max_entries) {
		int r = cap_err_set(s->err, E2BIG, "%s/%s takes the tree over its limit of %" PRIu64 " entries; remove files or raise the limit",
				    s->dir, cap_path_shown(path, buf, sizeof(buf)), s->max_entries);
		free(path);
		return r;
	}
	bool mount = S_ISDIR(st.st_mode) && st.st_dev != s->rootdev;
	if (S_ISREG(st.st_mode))
		return scan_file(s, dfd, name, path, &st, add(s, path, CAP_TREE_FILE, st.st_mode));
	if (S_ISLNK(st.st_mode))
		return scan_link(s, dfd, name, path, &st, add(s, path, CAP_TREE_LINK, st.st_mode));
	if (S_ISDIR(st.st_mode) && !mount) {
		add(s, path, CAP_TREE_DIR, st.st_mode);
		int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		struct stat cst;
		if (cfd < 0 || fstat(cfd, &cst) < 0 || cst.st_ino != st.st_ino || cst.st_dev != st.st_dev) {
			int e = cfd < 0 ? errno : ESTALE;
			if (cfd >= 0)
				close(cfd);
			return cap_err_set(s->err, e, "cannot read the directory %s/%s: %s", s->dir,
					   cap_path_shown(path, buf, sizeof(buf)), e == ESTALE ? "it changed while it was read" : strerror(e));
		}
		int r = scan_dir(s, cfd, path, depth);
		close(cfd);
		return r;
	}
	if (s->o->strict) {
		int r = mount ? cap_err_set(s->err, EINVAL, "%s/%s is the mount point of another file system; unmount it, or remove it or replace it with a copy",
					    s->dir, cap_path_shown(path, buf, sizeof(buf)))
			      : cap_err_set(s->err, EINVAL, "%s/%s is %s, which cannot be copied; remove it or move it out of the tree",
					    s->dir, cap_path_shown(path, buf, sizeof(buf)), kind(st.st_mode));
		free(path);
		return r;
	}
	add(s, path, CAP_TREE_OTHER, st.st_mode);
	return 0;
}

static bool skipped(const struct scan *s, const char *rel, const char *name)
{
	const char *pre = s->o->skip_prefix;
	return !*rel && pre && *pre && strncmp(name, pre, strlen(pre)) == 0;
}

static int scan_dir(struct scan *s, int dfd, const char *rel, unsigned depth)
{
	char **names = NULL;
	size_t n = 0;
	int r = cap_dir_names(dfd, &names, &n);
	if (r < 0) {
		char buf[256];
		return cap_err_set(s->err, -r, "cannot list the directory %s%s%s: %s", s->dir,
				   *rel ? "/" : "", cap_path_shown(rel, buf, sizeof(buf)), strerror(-r));
	}
	for (size_t i = 0; i < n && r == 0; i++) {
		if (skipped(s, rel, names[i]))
			continue;
		char *path = *rel ? xasprintf("%s/%s", rel, names[i]) : xstrdup(names[i]);
		r = scan_one(s, dfd, names[i], path, depth + 1);
	}
	cap_strv_free(names, n);
	return r;
}

static int open_root(const char *dir, struct cap_err *err)
{
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd >= 0)
		return fd;
	int e = errno;
	struct stat st;
	if (e == ELOOP || (e == ENOTDIR && lstat(dir, &st) == 0 && S_ISLNK(st.st_mode)))
		return cap_err_set(err, ELOOP, "%s is a symbolic link; give the directory it points to", dir);
	if (e == ENOTDIR)
		return cap_err_set(err, ENOTDIR, "%s is not a directory; give a directory", dir);
	if (e == ENOENT)
		return cap_err_set(err, ENOENT, "%s does not exist; give an existing directory", dir);
	return cap_err_set(err, e, "cannot open the directory %s: %s", dir, strerror(e));
}

int cap_tree_scan(const char *dir, const struct cap_tree_scan_opts *o,
		  struct cap_tree *out, struct cap_err *err)
{
	static const struct cap_tree_scan_opts none = { 0 };
	struct scan s = { .o = o ? o : &none, .dir = dir, .err = err };
	s.max_entries = s.o->max_entries ? s.o->max_entries : CAP_TREE_MAX_ENTRIES;
	s.max_entries = CAP_MIN(s.max_entries, (uint64_t)CAP_TREE_MAX_ENTRIES);
	s.max_bytes = s.o->max_bytes ? s.o->max_bytes : UINT64_MAX;
	int fd = open_root(dir, err);
	if (fd < 0)
		return fd;
	struct stat st;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return cap_err_set(err, e, "cannot read the directory %s: %s", dir, strerror(e));
	}
	s.rootdev = st.st_dev;
	int r = scan_dir(&s, fd, "", 0);
	close(fd);
	if (r < 0) {
		cap_tree_fini(&s.t);
		return r;
	}
	/* A directory's children are not contiguous in strcmp order when
	 * names hold bytes below '/': sort the whole list once. */
	if (s.t.n)
		qsort(s.t.v, s.t.n, sizeof(*s.t.v), cmp_entry);
	*out = s.t;
	return 0;
}

/* --- text form ------------------------------------------------------------ */

static bool needs_escape(unsigned char c)
{
	return c <= 0x20 || c == '%' || c == 0x7f;
}

void cap_tree_escape(const char *s, struct cap_buf *out)
{
	static const char hex[] = "0123456789ABCDEF";
	for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
		if (needs_escape(*p)) {
			char e[3] = { '%', hex[*p >> 4], hex[*p & 15] };
			cap_buf_append(out, e, 3);
		} else {
			cap_buf_append(out, p, 1);
		}
	}
}

static int hexval(char c)
{
	if (c >= '0' && c <= '9')
		return c - '0';
	if (c >= 'A' && c <= 'F')
		return c - 'A' + 10;
	if (c >= 'a' && c <= 'f')
		return c - 'a' + 10;
	return -1;
}

/* Undo cap_tree_escape on s[0..n): a new string and its length (it may
 * hold a NUL from "%00"). */
static int unescape(const char *s, size_t n, char **out, size_t *len)
{
	char *v = xmalloc(n + 1);
	size_t k = 0;
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)s[i];
		int hi = 0, lo = 0;
		if (c == '%' && (n - i < 3 || (hi = hexval(s[i + 1])) < 0 || (lo = hexval(s[i + 2])) < 0))
			goto bad;
		if (c != '%' && needs_escape(c))
			goto bad;
		if (c == '%') {
			c = (unsigned char)(hi << 4 | lo);
			i += 2;
		}
		v[k++] = (char)c;
	}
	v[k] = '\0';
	*out = v;
	*len = k;
	return 0;
bad:
	free(v);
	return -EINVAL;
}

int cap_tree_unescape(const char *s, size_t n, char **out)
{
	size_t len;
	return unescape(s, n, out, &len);
}

void cap_tree_format_entry(const struct cap_tree_entry *e, struct cap_buf *out)
{
	char head[128];
	int n = snprintf(head, sizeof(head), "%c %04o %" PRIu64 " ", e->type,
			 (unsigned)(e->mode & 07777), e->size);
	cap_buf_append(out, head, (size_t)n);
	if (e->type == CAP_TREE_FILE || e->type == CAP_TREE_LINK) {
		static const char hex[] = "0123456789abcdef";
		char h[64];
		for (int i = 0; i < 32; i++) {
			h[2 * i] = hex[e->hash[i] >> 4];
			h[2 * i + 1] = hex[e->hash[i] & 15];
		}
		cap_buf_append(out, h, sizeof(h));
	} else {
		cap_buf_append(out, "-", 1);
	}
	cap_buf_append(out, " ", 1);
	cap_tree_escape(e->path, out);
	if (e->type == CAP_TREE_LINK && e->target) {
		cap_buf_append(out, " ", 1);
		cap_tree_escape(e->target, out);
	}
	cap_buf_append(out, "\n", 1);
}

void cap_tree_format(const struct cap_tree *t, struct cap_buf *out)
{
	for (size_t i = 0; i < t->n; i++)
		cap_tree_format_entry(&t->v[i], out);
}

/* --- parsing (hostile text) ----------------------------------------------- */

struct parse {
	const char *p, *end;	/* the rest of the line being parsed */
	size_t line;
	struct cap_tree t;
	size_t cap, max;
	uint64_t names;	/* bytes of the paths and link targets so far */
	struct cap_err *err;
};

static int bad(struct parse *ps, const char *rule)
{
	return cap_err_set(ps->err, EBADMSG, "manifest line %zu %s", ps->line, rule);
}

/* The next field of the line: up to a space or the line's end. */
static size_t field(struct parse *ps, const char **start)
{
	*start = ps->p;
	while (ps->p < ps->end && *ps->p != ' ')
		ps->p++;
	return (size_t)(ps->p - *start);
}

/* Step over the one space after a field; false at the line's end. */
static bool space(struct parse *ps)
{
	if (ps->p == ps->end || *ps->p != ' ')
		return false;
	ps->p++;
	return true;
}

static bool parse_mode(const char *f, size_t n, uint32_t *mode)
{
	if (n < 1 || n > 4)
		return false;
	uint32_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (f[i] < '0' || f[i] > '7')
			return false;
		v = v * 8 + (uint32_t)(f[i] - '0');
	}
	*mode = v;
	return true;
}

static bool parse_size(const char *f, size_t n, uint64_t *size)
{
	if (n < 1 || n > 20 || (n > 1 && f[0] == '0'))
		return false;
	uint64_t v = 0;
	for (size_t i = 0; i < n; i++) {
		if (f[i] < '0' || f[i] > '9')
			return false;
		unsigned d = (unsigned)(f[i] - '0');
		if (v > (UINT64_MAX - d) / 10)
			return false;
		v = v * 10 + d;
	}
	*size = v;
	return true;
}

static bool parse_hash(const char *f, size_t n, uint8_t hash[32])
{
	if (n != 64)
		return false;
	for (size_t i = 0; i < 32; i++) {
		int hi = hexval(f[2 * i]), lo = hexval(f[2 * i + 1]);
		if (hi < 0 || lo < 0 || (f[2 * i] >= 'A' && f[2 * i] <= 'F') ||
		    (f[2 * i + 1] >= 'A' && f[2 * i + 1] <= 'F'))
			return false;
		hash[i] = (uint8_t)(hi << 4 | lo);
	}
	return true;
}

/* The head of a line: TYPE MODE SIZE HASH, each followed by a space. */
static int parse_head(struct parse *ps, struct cap_tree_entry *e)
{
	const char *f;
	size_t n = field(ps, &f);
	if (n != 1 || (f[0] != 'f' && f[0] != 'd' && f[0] != 'l' && f[0] != 'o'))
		return bad(ps, "has a bad type (f, d, l or o)");
	e->type = f[0];
	/* field() sets f: it is called before, never inside, the call that
	 * reads f (C leaves the order of arguments open; clang reads f first). */
	n = space(ps) ? field(ps, &f) : 0;
	if (!parse_mode(f, n, &e->mode))
		return bad(ps, "has a bad mode (1 to 4 octal digits)");
	n = space(ps) ? field(ps, &f) : 0;
	if (!parse_size(f, n, &e->size))
		return bad(ps, "has a bad size (a decimal number without leading zeros)");
	if (!space(ps))
		return bad(ps, "has no hash");
	n = field(ps, &f);
	bool plain = e->type == CAP_TREE_DIR || e->type == CAP_TREE_OTHER;
	if (plain ? (n != 1 || f[0] != '-') : !parse_hash(f, n, e->hash))
		return bad(ps, "has a bad hash (64 lower-case hex digits for f and l, - for d and o)");
	if (plain && e->size != 0)
		return bad(ps, "gives a directory or special file a size other than 0");
	if (!space(ps))
		return bad(ps, "has no path");
	return 0;
}

/* PATH and, for a link, TARGET, up to the line's end. */
static int parse_names(struct parse *ps, struct cap_tree_entry *e)
{
	const char *f;
	size_t n = field(ps, &f), len;
	if (unescape(f, n, &e->path, &len) < 0)
		return bad(ps, "has a bad escape in its path (%XX, and no raw byte <= 0x20 or 0x7f)");
	if (memchr(e->path, '\0', len) || !cap_tree_path_ok(e->path))
		return bad(ps, "has an invalid path (empty, absolute, with an empty, . or .. component, a NUL byte, over 4096 bytes or 256 levels)");
	if (e->type != CAP_TREE_LINK)
		return ps->p == ps->end ? 0 : bad(ps, "has more fields than its type takes");
	if (!space(ps))
		return bad(ps, "is a link without a target");
	n = field(ps, &f);
	if (ps->p != ps->end)
		return bad(ps, "has more fields than its type takes");
	if (unescape(f, n, &e->target, &len) < 0)
		return bad(ps, "has a bad escape in its link target");
	if (len == 0 || len > CAP_TREE_MAX_PATH || memchr(e->target, '\0', len))
		return bad(ps, "has an invalid link target (empty, with a NUL byte or over 4096 bytes)");
	uint8_t h[32];
	hash_bytes(e->target, len, h);
	if (e->size != len || memcmp(h, e->hash, 32) != 0)
		return bad(ps, "gives a link a size or hash other than its target's");
	return 0;
}

/* Where the entry stands against those before it: sorted, unique, its
 * parent listed as a directory. */
static int place(struct parse *ps, const struct cap_tree_entry *e)
{
	if (ps->t.n && strcmp(ps->t.v[ps->t.n - 1].path, e->path) >= 0)
		return bad(ps, "is not sorted after the line before it, or repeats its path");
	const char *slash = strrchr(e->path, '/');
	if (slash) {
		_cleanup_free_ char *parent = xstrndup(e->path, (size_t)(slash - e->path));
		const struct cap_tree_entry *d = cap_tree_find(&ps->t, parent);
		if (!d || d->type != CAP_TREE_DIR)
			return bad(ps, "names a path whose parent is not listed before it as a directory");
	}
	if (e->type == CAP_TREE_FILE && e->size > UINT64_MAX - ps->t.bytes)
		return bad(ps, "takes the sum of the sizes over 2^64 bytes");
	uint64_t names = strlen(e->path) + (e->target ? strlen(e->target) : 0);
	if (names > CAP_TREE_MAX_NAMES - ps->names)
		return cap_err_set(ps->err, EBADMSG, "manifest line %zu takes the paths and link targets over their limit of %u MiB in all (CAP_TREE_MAX_NAMES); the tree is too large to compare: remove files or shorten paths",
				   ps->line, CAP_TREE_MAX_NAMES >> 20);
	return 0;
}

static int parse_line(struct parse *ps)
{
	if (ps->t.n >= ps->max)
		return cap_err_set(ps->err, EBADMSG, "manifest line %zu is over the limit of %zu entries; the tree is too large to compare: remove files",
				   ps->line, ps->max);
	struct cap_tree_entry e = { 0 };
	int r = parse_head(ps, &e);
	if (r == 0)
		r = parse_names(ps, &e);
	if (r == 0)
		r = place(ps, &e);
	if (r < 0) {
		free(e.path);
		free(e.target);
		return r;
	}
	if (ps->t.n == ps->cap) {
		ps->cap = ps->cap ? ps->cap * 2 : 256;
		ps->t.v = xrealloc(ps->t.v, ps->cap * sizeof(*ps->t.v));
	}
	ps->t.v[ps->t.n++] = e;
	if (e.type == CAP_TREE_FILE)
		ps->t.bytes += e.size;
	ps->names += strlen(e.path) + (e.target ? strlen(e.target) : 0);
	return 0;
}

/* One whole line p[0..n), without its newline. */
static int take_line(struct parse *ps, const char *p, size_t n)
{
	ps->line++;
	if (memchr(p, '\0', n))
		return bad(ps, "holds a NUL byte");
	if (n == 0)
		return bad(ps, "is empty");
	ps->p = p;
	ps->end = p + n;
	return parse_line(ps);
}

struct cap_tree_parser {
	struct parse ps;
	struct cap_buf part;	/* the start of a line the next feed ends */
	int failed;	/* the first failure, returned again */
	struct cap_err err;	/* its message */
};

struct cap_tree_parser *cap_tree_parser_new(size_t max_entries)
{
	struct cap_tree_parser *p = xcalloc(1, sizeof(*p));
	p->ps.max = max_entries ? CAP_MIN(max_entries, (size_t)CAP_TREE_MAX_ENTRIES) : CAP_TREE_MAX_ENTRIES;
	p->ps.err = &p->err;
	cap_buf_init(&p->part);
	return p;
}

void cap_tree_parser_free(struct cap_tree_parser *p)
{
	if (!p)
		return;
	cap_tree_fini(&p->ps.t);
	cap_buf_fini(&p->part);
	free(p);
}

static int parser_failed(struct cap_tree_parser *p, int r, struct cap_err *err)
{
	if (!p->failed) {
		p->failed = r;
		cap_tree_fini(&p->ps.t);
		cap_tree_init(&p->ps.t);
		cap_buf_fini(&p->part);
		cap_buf_init(&p->part);
	}
	*err = p->err;
	return p->failed;
}

int cap_tree_parser_feed(struct cap_tree_parser *p, const char *text, size_t len, struct cap_err *err)
{
	if (p->failed)
		return parser_failed(p, p->failed, err);
	const char *end = text + len;
	int r = 0;
	if (cap_buf_used(&p->part)) {	/* finish the line begun before */
		const char *nl = memchr(text, '\n', len);
		size_t n = nl ? (size_t)(nl - text) : len;
		if (cap_buf_used(&p->part) + n > CAP_TREE_MAX_LINE) {
			p->ps.line++;
			return parser_failed(p, bad(&p->ps, "is too long (a path and a link target of at most 4096 bytes each)"), err);
		}
		cap_buf_append(&p->part, text, n);
		if (!nl)
			return 0;
		r = take_line(&p->ps, (const char *)cap_buf_head(&p->part), cap_buf_used(&p->part));
		cap_buf_consume(&p->part, cap_buf_used(&p->part));
		text = nl + 1;
	}
	while (r == 0 && text < end) {
		const char *nl = memchr(text, '\n', (size_t)(end - text));
		if (!nl) {
			if ((size_t)(end - text) > CAP_TREE_MAX_LINE) {
				p->ps.line++;
				r = bad(&p->ps, "is too long (a path and a link target of at most 4096 bytes each)");
				break;
			}
			cap_buf_append(&p->part, text, (size_t)(end - text));
			break;
		}
		r = take_line(&p->ps, text, (size_t)(nl - text));
		text = nl + 1;
	}
	return r < 0 ? parser_failed(p, r, err) : 0;
}

int cap_tree_parser_finish(struct cap_tree_parser *p, struct cap_tree *out, struct cap_err *err)
{
	if (p->failed)
		return parser_failed(p, p->failed, err);
	if (cap_buf_used(&p->part)) {
		p->ps.line++;
		return parser_failed(p, bad(&p->ps, "does not end with a newline (the manifest was cut short)"), err);
	}
	*out = p->ps.t;
	cap_tree_init(&p->ps.t);
	return 0;
}

int cap_tree_parse(const char *text, size_t len, size_t max_entries,
		   struct cap_tree *out, struct cap_err *err)
{
	struct cap_tree_parser *p = cap_tree_parser_new(max_entries);
	int r = cap_tree_parser_feed(p, text, len, err);
	if (r == 0)
		r = cap_tree_parser_finish(p, out, err);
	cap_tree_parser_free(p);
	return r;
}

/* --- files ---------------------------------------------------------------- */

int cap_tree_load(const char *path, struct cap_tree *out, struct cap_err *err)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot read the manifest %s: %s", path, strerror(errno));
	/* Read and parsed a block at a time: the text is never held whole. */
	struct cap_tree_parser *p = cap_tree_parser_new(0);
	_cleanup_free_ char *buf = xmalloc(65536);
	uint64_t total = 0;
	int r = 0;
	for (;;) {
		ssize_t n = read(fd, buf, 65536);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = cap_err_set(err, errno, "cannot read the manifest %s: %s", path, strerror(errno));
			break;
		}
		if (n == 0) {
			if ((r = cap_tree_parser_finish(p, out, err)) < 0)
				cap_err_prefix(err, "%s", path);
			break;
		}
		if ((total += (uint64_t)n) > CAP_TREE_MAX_TEXT) {
			r = cap_err_set(err, EFBIG, "the manifest %s is over %llu bytes", path,
					(unsigned long long)CAP_TREE_MAX_TEXT);
			break;
		}
		if ((r = cap_tree_parser_feed(p, buf, (size_t)n, err)) < 0) {
			cap_err_prefix(err, "%s", path);
			break;
		}
	}
	cap_tree_parser_free(p);
	return r;
}

int cap_tree_save(const char *path, const struct cap_tree *t, struct cap_err *err)
{
	struct cap_buf b;
	cap_buf_init(&b);
	cap_tree_format(t, &b);
	int r = cap_write_file_atomic(path, cap_buf_head(&b), cap_buf_used(&b), 0600);
	cap_buf_fini(&b);
	if (r < 0)
		return cap_err_set(err, -r, "cannot write the manifest %s: %s", path, strerror(-r));
	return 0;
}

/* --- comparing ------------------------------------------------------------ */

static bool change(const struct cap_tree_entry *a, const struct cap_tree_entry *b,
		   enum cap_tree_change_kind *k)
{
	if (a->type != b->type)
		*k = CAP_TREE_TYPE;
	else if (a->size != b->size || memcmp(a->hash, b->hash, sizeof(a->hash)) != 0)
		*k = CAP_TREE_MODIFIED;
	else if (a->mode != b->mode)
		*k = CAP_TREE_MODE;
	else
		return false;
	return true;
}

int cap_tree_diff(const struct cap_tree *base, const struct cap_tree *now,
		  struct cap_tree_change **out, size_t *n)
{
	struct cap_tree_change *v = xcalloc(base->n + now->n + 1, sizeof(*v));
	size_t i = 0, j = 0, k = 0;
	while (i < base->n || j < now->n) {
		int c = i == base->n ? 1 : j == now->n ? -1 : strcmp(base->v[i].path, now->v[j].path);
		enum cap_tree_change_kind kind;
		if (c < 0)
			v[k++] = (struct cap_tree_change){ CAP_TREE_DELETED, &base->v[i++], NULL };
		else if (c > 0)
			v[k++] = (struct cap_tree_change){ CAP_TREE_ADDED, NULL, &now->v[j++] };
		else if (change(&base->v[i], &now->v[j], &kind))
			v[k++] = (struct cap_tree_change){ kind, &base->v[i++], &now->v[j++] };
		else
			i++, j++;
	}
	*out = v;
	*n = k;
	return 0;
}

const char *cap_tree_change_name(enum cap_tree_change_kind k)
{
	switch (k) {
	case CAP_TREE_ADDED: return "added";
	case CAP_TREE_DELETED: return "deleted";
	case CAP_TREE_MODIFIED: return "modified";
	case CAP_TREE_MODE: return "mode";
	case CAP_TREE_TYPE: return "type";
	}
	return "?";
}
