/* The streaming FILE operations (docs/protocol.md): MANIFEST here,
 * TAR_OUT and TAR_IN in agent-xfer-tar.c, each run by agent_xfer_run in
 * a child of the agent that is already the tool user in its own cgroup,
 * its fd 0-2 pipes to the agent (which relays them as STDIN, STDOUT and
 * STDERR frames). Every path is resolved beneath its root with openat2
 * and never through a symbolic link below it; every name is checked
 * before use. And, at SETUP, the workspace's one-time change of owner
 * (agent_workspace_own). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "agent.h"
#include "agent-xfer.h"
#include "tar.h"
#include "util.h"

struct xfer X;

/* --- output ---------------------------------------------------------- */

/* A byte as MANIFEST escapes it (<= 0x20, '%', 0x7f as %XX). */
void escape(struct cap_buf *b, const char *s)
{
	static const char hex[] = "0123456789ABCDEF";
	for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
		if (*c <= 0x20 || *c == '%' || *c == 0x7f) {
			char e[3] = { '%', hex[*c >> 4], hex[*c & 15] };
			cap_buf_append(b, e, 3);
		} else {
			cap_buf_append(b, c, 1);
		}
	}
}

/* One "capsule: SHOWN/REL: why" line on fd 2 (rel may be ""). */
__attribute__((format(printf, 2, 3))) void say(const char *rel, const char *fmt, ...)
{
	struct cap_buf b;
	char why[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	cap_buf_init(&b);
	cap_buf_append(&b, "capsule: ", 9);
	escape(&b, X.shown);
	if (rel && *rel) {
		cap_buf_append(&b, "/", 1);
		escape(&b, rel);
	}
	cap_buf_append(&b, ": ", 2);
	for (char *c = why; *c; c++)
		if ((unsigned char)*c < 0x20 || *c == 0x7f)
			*c = '?';
	cap_buf_append(&b, why, strlen(why));
	cap_buf_append(&b, "\n", 1);
	(void)cap_write_all(2, cap_buf_head(&b), cap_buf_used(&b));
	cap_buf_fini(&b);
}


void flush(void)
{
	if (cap_buf_used(&X.out) == 0)
		return;
	if (cap_write_all(1, cap_buf_head(&X.out), cap_buf_used(&X.out)) < 0)
		_exit(2);	/* the host went away: nobody to tell */
	cap_buf_consume(&X.out, cap_buf_used(&X.out));
}

void put(const void *p, size_t n)
{
	cap_buf_append(&X.out, p, n);
	if (cap_buf_used(&X.out) >= CHUNK)
		flush();
}

/* Run before give_up exits (TAR_IN: the directories' modes). */
void (*at_give_up)(void);

/* Nothing (more) can be done: name why, exit 2. */
__attribute__((noreturn, format(printf, 2, 3))) void give_up(const char *rel, const char *fmt, ...)
{
	char why[600];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	flush();
	say(rel, "%s", why);
	if (at_give_up) {
		void (*f)(void) = at_give_up;
		at_give_up = NULL;
		f();
	}
	_exit(2);
}

/* --- paths ----------------------------------------------------------- */

int openat2_fd(int dirfd, const char *path, int flags, uint64_t resolve)
{
	struct open_how how = { .flags = (uint64_t)(flags | O_CLOEXEC), .resolve = resolve };
	int fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	return fd < 0 ? -errno : fd;
}

/* Open a directory below dirfd, never through a symbolic link. */
int open_dir_below(int dirfd, const char *rel)
{
	return openat2_fd(dirfd, *rel ? rel : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
			  RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
}

const char *why_open(int e)
{
	switch (e) {
	case EXDEV:
		return "it resolves outside its root (through '..' or a symbolic link)";
	case ELOOP:
		return "a symbolic link is in the way";
	default:
		return strerror(e);
	}
}

/* Normalize a relative path from the host into out: components split on
 * '/', empty and "." ones dropped. -EINVAL for an absolute path or a ".."
 * component, -ENAMETOOLONG over MAX_PATH bytes or MAX_DEPTH components.
 * out may become "" (the top itself). */
int norm_path(const char *in, char *out, size_t outlen)
{
	size_t n = 0, depth = 0;
	if (in[0] == '/')
		return -EINVAL;
	for (const char *c = in; *c;) {
		size_t k = strcspn(c, "/");
		if (k == 2 && c[0] == '.' && c[1] == '.')
			return -EINVAL;
		if (k && !(k == 1 && c[0] == '.')) {
			if (n + (n ? 1 : 0) + k >= outlen || n + k >= MAX_PATH || ++depth > MAX_DEPTH)
				return -ENAMETOOLONG;
			if (n)
				out[n++] = '/';
			memcpy(out + n, c, k);
			n += k;
		}
		c += k;
		while (*c == '/')
			c++;
	}
	out[n] = '\0';
	return 0;
}

/* Split rel at its last '/': dir gets what is before it ("" for none),
 * the result points at the last component. */
const char *split_last(const char *rel, char *dir, size_t dlen)
{
	const char *slash = strrchr(rel, '/');
	size_t k = slash ? (size_t)(slash - rel) : 0;
	CAP_BUG_ON(k >= dlen);
	memcpy(dir, rel, k);
	dir[k] = '\0';
	return slash ? slash + 1 : rel;
}

/* --- a tree walk ------------------------------------------------------ */

static int cmp_names(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The names in a directory (not "." and ".."), sorted by bytes. fd stays
 * open and owned by the caller. -errno on failure. */
static int read_names(int fd, char ***names, size_t *count)
{
	int dup_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
	DIR *d = dup_fd < 0 ? NULL : fdopendir(dup_fd);
	if (!d) {
		int e = errno;
		if (dup_fd >= 0)
			close(dup_fd);
		return -e;
	}
	size_t n = 0, cap = 16;
	char **v = xmalloc(cap * sizeof(char *));
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if (n == cap)
			v = xrealloc(v, (cap *= 2) * sizeof(char *));
		v[n++] = xstrdup(de->d_name);
		errno = 0;
	}
	int e = errno;
	closedir(d);
	if (e) {
		for (size_t i = 0; i < n; i++)
			free(v[i]);
		free(v);
		return -e;
	}
	qsort(v, n, sizeof(char *), cmp_names);
	*names = v;
	*count = n;
	return 0;
}


struct frame {
	int fd;
	char **names;
	size_t n, i;
	size_t rel_len;	/* of this directory's path in rel */
};

static void frame_free(struct frame *f)
{
	if (f->fd >= 0)
		close(f->fd);
	for (size_t i = 0; i < f->n; i++)
		free(f->names[i]);
	free(f->names);
}

/* Walk the tree below the directory topfd (borrowed) depth-first, each
 * directory's names in byte order, a directory before what it holds.
 * Links are never followed; paths stay within MAX_PATH bytes and
 * MAX_DEPTH levels (what is beyond is reported through fail). */
void walk(int topfd, const struct walker *w)
{
	static char rel[MAX_PATH + 1];
	struct frame *stack = xcalloc(MAX_DEPTH + 1, sizeof(struct frame));
	size_t depth = 0;
	int fd = fcntl(topfd, F_DUPFD_CLOEXEC, 0);
	int r = fd < 0 ? -errno : read_names(fd, &stack[0].names, &stack[0].n);
	rel[0] = '\0';
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		w->fail(w->ud, "", strerror(-r));
		free(stack);
		return;
	}
	stack[0].fd = fd;
	depth = 1;
	while (depth > 0) {
		struct frame *f = &stack[depth - 1];
		if (f->i == f->n) {
			frame_free(f);
			memset(f, 0, sizeof(*f));
			if (--depth > 0)
				rel[stack[depth - 1].rel_len] = '\0';
			continue;
		}
		const char *name = f->names[f->i++];
		size_t base = f->rel_len, nl = strlen(name);
		rel[base] = '\0';
		if (base + (base ? 1 : 0) + nl > MAX_PATH) {
			char shown[120];
			snprintf(shown, sizeof(shown), "%.100s...", rel);
			w->fail(w->ud, shown, "a path below it is over 4096 bytes; not copied");
			continue;
		}
		size_t len = base;
		if (base)
			rel[len++] = '/';
		memcpy(rel + len, name, nl + 1);
		len += nl;
		struct stat st;
		if (fstatat(f->fd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			w->fail(w->ud, rel, strerror(errno));
			continue;
		}
		if (!w->visit(w->ud, f->fd, name, rel, &st) || !S_ISDIR(st.st_mode))
			continue;
		if (depth > MAX_DEPTH - 1) {
			w->fail(w->ud, rel, "more than 256 directory levels below the top; its contents are left out");
			continue;
		}
		struct frame *c = &stack[depth];
		c->fd = openat(f->fd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		r = c->fd < 0 ? -errno : read_names(c->fd, &c->names, &c->n);
		if (r < 0) {
			if (c->fd >= 0)
				close(c->fd);
			memset(c, 0, sizeof(*c));
			w->fail(w->ud, rel, strerror(-r));
			continue;
		}
		c->i = 0;
		c->rel_len = len;
		depth++;
	}
	free(stack);
}

/* --- MANIFEST -------------------------------------------------------- */

struct mentry {
	char *path;
	char *target;	/* l */
	uint64_t size;
	uint8_t hash[32];
	uint16_t mode;
	char type;
};

struct manifest {
	struct mentry *v;
	size_t n, cap;
};

static int cmp_mentry(const void *a, const void *b)
{
	return strcmp(((const struct mentry *)a)->path, ((const struct mentry *)b)->path);
}

static void hash_bytes(const void *p, size_t n, uint8_t out[32])
{
	struct agent_sha256 c;
	agent_sha256_init(&c);
	agent_sha256_update(&c, p, n);
	agent_sha256_final(&c, out);
}

/* Open a regular file below dirfd for reading, never through a link, and
 * check it is still the file st describes. */
int open_file_at(int dirfd, const char *name, const struct stat *st)
{
	int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	struct stat now;
	if (fstat(fd, &now) < 0 || !S_ISREG(now.st_mode) || now.st_ino != st->st_ino ||
	    now.st_dev != st->st_dev) {
		close(fd);
		return -ESTALE;
	}
	return fd;
}

/* Hash a file's content: 0 with the digest and the bytes read, or -errno. */
static int hash_file(int fd, uint8_t out[32], uint64_t *size)
{
	static uint8_t buf[CHUNK];
	struct agent_sha256 c;
	agent_sha256_init(&c);
	*size = 0;
	for (;;) {
		ssize_t k = read(fd, buf, sizeof(buf));
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			break;
		agent_sha256_update(&c, buf, (size_t)k);
		*size += (uint64_t)k;
	}
	agent_sha256_final(&c, out);
	return 0;
}

/* The target of a link below dirfd, new string; NULL with errno. */
char *read_link(int dirfd, const char *name)
{
	char buf[MAX_PATH + 1];
	ssize_t k = readlinkat(dirfd, name, buf, sizeof(buf));
	if (k < 0)
		return NULL;
	if ((size_t)k >= sizeof(buf) || k == 0) {
		errno = k ? ENAMETOOLONG : EINVAL;
		return NULL;
	}
	return xstrndup(buf, (size_t)k);
}

static bool manifest_visit(void *ud, int dirfd, const char *name, const char *rel,
			   const struct stat *st)
{
	struct manifest *m = ud;
	struct mentry e = { .mode = (uint16_t)(st->st_mode & 07777) };
	if (S_ISREG(st->st_mode)) {
		int fd = open_file_at(dirfd, name, st);
		int r = fd < 0 ? fd : hash_file(fd, e.hash, &e.size);
		if (fd >= 0)
			close(fd);
		if (r < 0) {
			refuse(rel, "cannot read it to hash it: %s",
			       r == -ESTALE ? "it changed while being looked at" : strerror(-r));
			return false;
		}
		e.type = 'f';
	} else if (S_ISLNK(st->st_mode)) {
		if (!(e.target = read_link(dirfd, name))) {
			refuse(rel, "cannot read the symbolic link: %s", strerror(errno));
			return false;
		}
		e.size = strlen(e.target);
		hash_bytes(e.target, e.size, e.hash);
		e.type = 'l';
	} else {
		e.type = S_ISDIR(st->st_mode) ? 'd' : 'o';
	}
	if (m->n == MAX_ENTRIES)
		give_up("", "more than %u entries; a manifest holds at most that many", MAX_ENTRIES);
	if (m->n == m->cap)
		m->v = xrealloc(m->v, (m->cap = m->cap ? 2 * m->cap : 1024) * sizeof(*m->v));
	e.path = xstrdup(rel);
	m->v[m->n++] = e;
	return e.type == 'd';
}

void walk_fail(void *ud, const char *rel, const char *why)
{
	(void)ud;
	refuse(rel, "%s", why);
}

static void do_manifest(int topfd)
{
	if (!agent_sha256_selftest())
		give_up("", "the agent's SHA-256 gives wrong digests; rebuild the agent");
	struct manifest m = { 0 };
	struct walker w = { manifest_visit, walk_fail, &m };
	walk(topfd, &w);
	/* Sorted by the whole path (a-b before a/b), not per directory. */
	qsort(m.v, m.n, sizeof(*m.v), cmp_mentry);
	static const char hex[] = "0123456789abcdef";
	for (size_t i = 0; i < m.n; i++) {
		struct mentry *e = &m.v[i];
		char head[64];
		int k = snprintf(head, sizeof(head), "%c %04o %llu ", e->type, e->mode,
				 (unsigned long long)e->size);
		cap_buf_append(&X.out, head, (size_t)k);
		if (e->type == 'f' || e->type == 'l') {
			char h[64];
			for (int j = 0; j < 32; j++) {
				h[2 * j] = hex[e->hash[j] >> 4];
				h[2 * j + 1] = hex[e->hash[j] & 15];
			}
			cap_buf_append(&X.out, h, sizeof(h));
		} else {
			cap_buf_append(&X.out, "-", 1);
		}
		cap_buf_append(&X.out, " ", 1);
		escape(&X.out, e->path);
		if (e->type == 'l') {
			cap_buf_append(&X.out, " ", 1);
			escape(&X.out, e->target);
		}
		put("\n", 1);
		free(e->path);
		free(e->target);
	}
	free(m.v);
	flush();
}

/* --- the operation ---------------------------------------------------- */

static void close_from(int lowfd)
{
	if (syscall(SYS_close_range, (unsigned)lowfd, ~0u, 0) == 0)
		return;
	long max = sysconf(_SC_OPEN_MAX);
	for (int fd = lowfd; fd < (max > 0 ? max : 1024); fd++)
		close(fd);
}

void agent_xfer_run(const struct cap_file_req *req)
{
	/* Nothing of the agent's (the host port, other commands' pipes)
	 * stays open here. */
	close_from(3);
	umask(0);
	cap_buf_init(&X.out);
	X.root = req->root;
	X.prefix = req->op == CAP_FILE_TAR_OUT && (req->limit & CAP_TAR_PREFIX);
	snprintf(X.shown, sizeof(X.shown), "%s%s%s", req->root, *req->path ? "/" : "", req->path);

	int rootfd = open(req->root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		give_up("", "%s is not available in this sandbox: %s", req->root, strerror(errno));
	char path[MAX_PATH + 1];
	if (norm_path(req->path, path, sizeof(path)) < 0)
		give_up("", "not a path inside %s", req->root);

	if (req->op == CAP_FILE_TAR_OUT && !(req->limit & CAP_TAR_PATHS_STDIN)) {
		tar_out_tree(rootfd, path);
		cap_tar_end(&X.out);
		flush();
		_exit(X.status);
	}
	/* The others work on a directory. */
	int top = openat2_fd(rootfd, *path ? path : ".", O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
			     RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS);
	if (top < 0)
		give_up("", "%s", top == -ENOTDIR || top == -ELOOP ? "not a directory" : why_open(-top));
	close(rootfd);
	switch (req->op) {
	case CAP_FILE_MANIFEST:
		do_manifest(top);
		break;
	case CAP_FILE_TAR_OUT:
		tar_out_paths(top);
		cap_tar_end(&X.out);
		flush();
		break;
	case CAP_FILE_TAR_IN:
		tar_in(top, req->limit & CAP_TAR_NO_REPLACE, req->limit & CAP_TAR_OWNERS);
		break;
	default:
		give_up("", "not a streaming file operation (%u)", req->op);
	}
	_exit(X.status);
}

/* --- the workspace's owner -------------------------------------------- */

struct own {
	uint64_t done, failed;
	char first[200];	/* the first failure */
};

static bool own_visit(void *ud, int dirfd, const char *name, const char *rel, const struct stat *st)
{
	struct own *o = ud;
	if (st->st_uid == TOOL_UID && st->st_gid == TOOL_GID) {
		o->done++;
		return true;
	}
	if (fchownat(dirfd, name, TOOL_UID, TOOL_GID, AT_SYMLINK_NOFOLLOW) < 0) {
		if (!o->failed++)
			snprintf(o->first, sizeof(o->first), "%.120s: %s", rel, strerror(errno));
		return true;
	}
	o->done++;
	return true;
}

static void own_fail(void *ud, const char *rel, const char *why)
{
	struct own *o = ud;
	if (!o->failed++)
		snprintf(o->first, sizeof(o->first), "%.120s: %s", rel, why);
}

void agent_workspace_own(const char *dir)
{
	int64_t t0 = cap_now_ms();
	int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		agent_log("workspace: cannot open %s to give it to the tool user: %s", dir, strerror(errno));
		return;
	}
	struct own o = { 0 };
	struct walker w = { own_visit, own_fail, &o };
	walk(fd, &w);
	/* The root last: until it is the tool user's, the next boot walks
	 * again. */
	if (fchown(fd, TOOL_UID, TOOL_GID) < 0 && !o.failed++)
		snprintf(o.first, sizeof(o.first), "%s: %s", dir, strerror(errno));
	close(fd);
	agent_log("workspace: %llu entries of %s made the tool user's in %lld ms",
		  (unsigned long long)o.done, dir, (long long)(cap_now_ms() - t0));
	if (o.failed)
		agent_log("workspace: %llu entries could not be given to the tool user (first: %s)",
			  (unsigned long long)o.failed, o.first);
}
