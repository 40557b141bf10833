/* Fuzz target for the projection walker (src/store/store-projection.c):
 * the input bytes describe a small directory tree (regular files of
 * varied sizes, nested and empty directories, names with odd bytes and up
 * to 255 bytes, node_modules in any letter case at any depth, symlinks
 * relative, absolute and dangling, hard links, FIFOs, sockets, devices
 * when allowed), which is made in a fresh temporary directory and
 * scanned. A model of the tree says what the walk must find.
 *
 * Checked for every tree:
 * - cap_projection_scan returns what the model expects: -EPERM naming the
 *   first forbidden entry in walk order (a symlink, a hard-linked file, a
 *   FIFO, a socket or a device outside node_modules), else -EFBIG naming
 *   the cap when one is exceeded, else 0 with the entry and byte counts of
 *   everything outside node_modules;
 * - a second scan of the same tree gives the same result and fingerprint;
 *   anything added inside node_modules (even a symlink) changes nothing;
 *   a file outside it growing by one byte changes the fingerprint;
 * - every Nth tree (and in a libFuzzer run, 1 in 16) also goes through
 *   cap_projection_build when mkfs.erofs is installed: same verdict, same
 *   fingerprint, no staging left behind, and the image, extracted with
 *   fsck.erofs, holds exactly the files and directories of the model with
 *   their contents. What the image cannot hold (a name over 254 bytes, a
 *   path over 3072, more than 128 levels) is refused by the scan itself.
 * Trees are made under $TMPDIR, else /dev/shm, else /tmp, and removed.
 *
 * Built three ways, as fuzz-proto is: as a libFuzzer target and as a
 * replay driver of the files given (a failed check aborts in both), and
 * with -DCAP_FUZZ_MUTATE as a standalone driver run under ASan+UBSan in
 * `make test`:
 *   mutate-projection [ITERATIONS [SEED [BUILD_EVERY]]]
 * which prints TAP and exits non-zero at the first failed check (leaving
 * the failing tree in place when FUZZ_KEEP is set). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>

#include "err.h"
#include "paths.h"
#include "store.h"
#include "util.h"

/* --- the model ------------------------------------------------------------ */

enum kind { K_DIR, K_REG, K_HARD, K_SYM, K_FIFO, K_SOCK, K_CHR };
static const char *const kind_name[] = { "dir", "file", "hard link", "symlink", "fifo", "socket", "device" };

struct node {
	char *name;	/* owned; "" for the root */
	char *rel;	/* owned; path from the root */
	enum kind kind;
	int parent;
	int file;	/* K_REG / K_HARD: index of the file's first name */
	uint64_t size;
	uint8_t fill;	/* content: byte j is fill + 131 * j */
};

#define NODES_MAX 64
#define BYTES_MAX (2u << 20)

struct tree {
	struct node n[NODES_MAX];
	int count;
	int fd[NODES_MAX];	/* open directories while the tree is made */
	uint64_t bytes;
	char *top;	/* owned: the temporary directory */
	char *root;	/* owned: top/t, the tree */
};

static struct tree *cur;	/* for the failure report */
static const char *test_name = "setup";
static int test_no = 0;
static __attribute__((unused)) char again[160];	/* the command that replays a standalone run */

static bool excluded_name(const char *name) { return strcasecmp(name, "node_modules") == 0; }

/* s with control and non-ASCII bytes escaped, for a report (the buffer
 * is reused by the next call but one). */
static const char *esc(const char *s)
{
	static char buf[2][4200];
	static int k;
	char *o = buf[k ^= 1];
	size_t j = 0;
	for (; *s && j < sizeof(buf[0]) - 5; s++) {
		unsigned char c = (unsigned char)*s;
		if (c >= 0x20 && c < 0x7f && c != '\\')
			o[j++] = (char)c;
		else
			j += (size_t)snprintf(o + j, 5, "\\x%02x", c);
	}
	o[j] = '\0';
	return o;
}

/* A check failed: say what, list the tree, clean up, stop. */
__attribute__((format(printf, 1, 2), noreturn)) static void fail(const char *fmt, ...)
{
	va_list ap;
	printf("# ");
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf("\n");
	if (cur) {
		printf("# the tree at %s:\n", cur->root);
		for (int i = 1; i < cur->count; i++) {
			const struct node *x = &cur->n[i];
			printf("#   %-9s %8" PRIu64 "  %.160s%s\n", kind_name[x->kind], x->size, esc(x->rel),
			       strlen(x->rel) > 160 ? "..." : "");
		}
		if (getenv("FUZZ_KEEP"))
			printf("# kept for FUZZ_KEEP\n");
		else
			cap_remove_tree(cur->top);
	}
#ifndef CAP_FUZZ_MUTATE
	printf("# in: %s\n", test_no ? test_name : "LLVMFuzzerTestOneInput");
	fflush(stdout);
	abort();
#else
	printf("# again: %s\nnot ok %d - %s\n", again, test_no, test_name);
	fflush(stdout);
	_exit(1);	/* no leak report for what the failed round held */
#endif
}

#define CHECK(cond, ...)                                                       \
	do {                                                                   \
		if (!(cond))                                                   \
			fail(__VA_ARGS__);                                     \
	} while (0)

/* The input, read a byte at a time; zeros once it runs out. */
struct src {
	const uint8_t *p;
	size_t n, i;
};

static unsigned take(struct src *s) { return s->i < s->n ? s->p[s->i++] : 0; }
static unsigned take_below(struct src *s, unsigned k) { return take(s) % k; }

static int links_of(const struct tree *t, int file)
{
	int k = 0;
	for (int i = 1; i < t->count; i++)
		k += (t->n[i].kind == K_REG || t->n[i].kind == K_HARD) && t->n[i].file == file;
	return k;
}

/* Inside node_modules (or named so): never looked at by the walk. */
static bool hidden(const struct tree *t, int i)
{
	for (; i > 0; i = t->n[i].parent)
		if (excluded_name(t->n[i].name))
			return true;
	return false;
}

/* A name for a new entry of parent: short, odd bytes, up to 255 bytes, or
 * node_modules in some spelling. NULL when it is taken. */
static char *gen_name(struct tree *t, int parent, struct src *s)
{
	static const char *const plain[] = { "a", "b", "A", "B", "x.txt", "1", "-", "_", ".hidden",
					     "a b", "\xc3\xa9t\xc3\xa9", "~", "*", "a\\b", "|", "\n", " " };
	static const char *const nm[] = { "node_modules", "Node_Modules", "NODE_MODULES", "nOdE_mOdUlEs",
					  "node_modules ", "node_module", "node_modules2", ".node_modules",
					  "node-modules", "node_modules~" };
	char buf[256];
	size_t len;
	switch (take_below(s, 16)) {
	case 0: case 1: case 2: case 3: case 4: case 5:
		len = (size_t)snprintf(buf, sizeof(buf), "%s%u", plain[take_below(s, CAP_ARRAY_SIZE(plain))],
				       take_below(s, 4));
		break;
	case 6: case 7: case 8:
		len = (size_t)snprintf(buf, sizeof(buf), "%s", nm[take_below(s, CAP_ARRAY_SIZE(nm))]);
		break;
	case 9: case 10:	/* any bytes but NUL and "/" */
		len = 1 + take_below(s, 32);
		for (size_t i = 0; i < len; i++) {
			unsigned c = take(s);
			buf[i] = (char)(c == 0 || c == '/' ? 0x80 + (c & 0x3f) : c);
		}
		break;
	case 11: {	/* long: up to NAME_MAX */
		len = 200 + take_below(s, 56);
		unsigned c = 1 + take_below(s, 254);
		memset(buf, c == '/' ? 'L' : (int)c, len);
		buf[0] = 'L';
		break;
	}
	default:
		len = (size_t)snprintf(buf, sizeof(buf), "f%u", take(s));
	}
	buf[len] = '\0';
	if (strcmp(buf, ".") == 0 || strcmp(buf, "..") == 0)
		return NULL;
	for (int i = 1; i < t->count; i++)
		if (t->n[i].parent == parent && strcmp(t->n[i].name, buf) == 0)
			return NULL;
	return xstrdup(buf);
}

static bool forbidden(const struct tree *t, int i)
{
	const struct node *x = &t->n[i];
	if (x->kind == K_REG || x->kind == K_HARD)
		return links_of(t, x->file) > 1;
	return x->kind != K_DIR;
}

/* Write size bytes of the node's pattern to fd. */
static void fill_file(int fd, const struct node *x)
{
	uint8_t buf[4096];
	for (uint64_t off = 0; off < x->size;) {
		size_t k = (size_t)CAP_MIN((uint64_t)sizeof(buf), x->size - off);
		for (size_t j = 0; j < k; j++)
			buf[j] = (uint8_t)(x->fill + 131 * (off + j));
		CHECK(cap_write_all(fd, buf, k) == 0, "cannot write %s: %s", esc(x->rel), strerror(errno));
		off += k;
	}
}

/* Whether every name of the file is in node_modules. */
static bool all_hidden(const struct tree *t, int file)
{
	for (int j = 1; j < t->count; j++)
		if ((t->n[j].kind == K_REG || t->n[j].kind == K_HARD) && t->n[j].file == file && !hidden(t, j))
			return false;
	return true;
}

/* Add one entry under parent to the model and make it on disk. In a
 * clean tree, what the walk refuses is only made where it is not looked
 * at (in node_modules); elsewhere it becomes a plain file. */
static void add(struct tree *t, int parent, char *name, enum kind kind, bool clean, struct src *s)
{
	static const char *const targets[] = { "a0", "../a0", "/etc/passwd", "/", "dangling/nowhere",
					       ".", "..", "node_modules", "/nonexistent" };
	static const mode_t modes[] = { 0644, 0755, 0600, 0700, 04755, 0640 };
	int i = t->count++;
	struct node *x = &t->n[i];
	int pfd = t->fd[parent];
	*x = (struct node){ .name = name, .kind = kind, .parent = parent, .file = i };
	x->rel = *t->n[parent].rel ? xasprintf("%s/%s", t->n[parent].rel, name) : xstrdup(name);
	t->fd[i] = -1;
	bool hid = hidden(t, i);
	if (x->kind == K_HARD) {
		/* In a clean tree, only between names the walk never sees. */
		int cand[NODES_MAX], k = 0;
		for (int j = 1; j < i; j++)
			if (t->n[j].kind == K_REG && (!clean || (hid && all_hidden(t, j))))
				cand[k++] = j;
		if (k == 0) {
			x->kind = K_REG;
		} else {
			const struct node *f = &t->n[cand[take_below(s, (unsigned)k)]];
			x->file = f->file;
			x->size = f->size;
			x->fill = f->fill;
			if (linkat(t->fd[f->parent], f->name, pfd, name, 0) < 0)
				fail("cannot link %s: %s", esc(x->rel), strerror(errno));
			return;
		}
	}
	if (clean && !hid && x->kind != K_DIR)
		x->kind = K_REG;
	switch (x->kind) {
	case K_DIR:
		if (mkdirat(pfd, name, 0755) < 0 ||
		    (t->fd[i] = openat(pfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
			fail("cannot make directory %s: %s", esc(x->rel), strerror(errno));
		break;
	case K_REG: {
		switch (take_below(s, 8)) {
		case 0: x->size = 0; break;
		case 5: case 6: x->size = take(s) * take(s); break;
		case 7: x->size = (uint64_t)take(s) << 10; break;
		default: x->size = take(s);
		}
		x->size = CAP_MIN(x->size, BYTES_MAX - t->bytes);
		t->bytes += x->size;
		x->fill = (uint8_t)take(s);
		mode_t mode = modes[take_below(s, CAP_ARRAY_SIZE(modes))];
		int fd = openat(pfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0)
			fail("cannot make %s: %s", esc(x->rel), strerror(errno));
		fill_file(fd, x);
		if (fchmod(fd, mode) < 0)
			fail("cannot chmod %s: %s", esc(x->rel), strerror(errno));
		close(fd);
		break;
	}
	case K_SYM: {
		unsigned k = take_below(s, CAP_ARRAY_SIZE(targets) + 1);
		const char *to = k < CAP_ARRAY_SIZE(targets) ? targets[k] : name;	/* or a loop */
		if (symlinkat(to, pfd, name) < 0)
			fail("cannot make symlink %s: %s", esc(x->rel), strerror(errno));
		break;
	}
	case K_CHR:
		if (mknodat(pfd, name, S_IFCHR | 0600, makedev(1, 3)) == 0)
			break;
		CHECK(errno == EPERM, "cannot make device %s: %s", esc(x->rel), strerror(errno));
		x->kind = K_FIFO;	/* not allowed here: a FIFO instead */
		__attribute__((fallthrough));	/* clang takes no comment for it */
	case K_FIFO:
		if (mkfifoat(pfd, name, 0600) < 0)
			fail("cannot make FIFO %s: %s", esc(x->rel), strerror(errno));
		break;
	case K_SOCK:
		if (mknodat(pfd, name, S_IFSOCK | 0600, 0) < 0)
			fail("cannot make socket %s: %s", esc(x->rel), strerror(errno));
		break;
	case K_HARD:
		break;
	}
}

/* Make a tree from the input. A long chain of directories with names of
 * 240+ bytes sometimes takes paths past PATH_MAX. */
static void make_tree(struct tree *t, struct src *s)
{
	unsigned flags = take(s);
	bool clean = flags % 3 != 0, deep = flags / 3 % 16 == 0;
	t->n[0] = (struct node){ .name = xstrdup(""), .rel = xstrdup(""), .kind = K_DIR };
	t->count = 1;
	t->fd[0] = open(t->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(t->fd[0] >= 0, "cannot open %s: %s", t->root, strerror(errno));
	if (deep) {
		int at = 0;
		for (int k = 0, n = 14 + (int)take_below(s, 8); k < n; k++) {
			char name[256];
			size_t len = 240 + take_below(s, 16);
			memset(name, 'a' + k % 26, len);
			name[len] = '\0';
			add(t, at, xstrdup(name), K_DIR, clean, s);
			at = t->count - 1;
		}
	}
	static const enum kind kinds[] = { K_REG, K_REG, K_REG, K_REG, K_REG, K_REG, K_REG, K_REG,
					   K_DIR, K_DIR, K_DIR, K_DIR, K_DIR, K_DIR, K_HARD, K_HARD,
					   K_SYM, K_SYM, K_FIFO, K_SOCK, K_CHR };
	for (int k = 1 + (int)take_below(s, 48); k > 0 && t->count < NODES_MAX && s->i < s->n; k--) {
		int dirs[NODES_MAX], nd = 0;
		for (int i = 0; i < t->count; i++)
			if (t->n[i].kind == K_DIR)
				dirs[nd++] = i;
		int parent = dirs[take_below(s, (unsigned)nd)];
		char *name = gen_name(t, parent, s);
		enum kind kind = kinds[take_below(s, CAP_ARRAY_SIZE(kinds))];
		if (name)
			add(t, parent, name, kind, clean, s);
	}
}

/* --- what the walk must find --------------------------------------------- */

struct verdict {
	int first_bad;	/* index of the first forbidden entry in walk order, or -1 */
	bool too_long;	/* refused for its name, path or depth, not its type */
	uint64_t entries, bytes;
};

static const struct tree *sort_tree;

static int by_name(const void *a, const void *b)
{
	return strcmp(sort_tree->n[*(const int *)a].name, sort_tree->n[*(const int *)b].name);
}

/* The children of dir that the walk looks at, in its order. */
static int children(const struct tree *t, int dir, int *kids)
{
	int k = 0;
	for (int i = 1; i < t->count; i++)
		if (t->n[i].parent == dir && !excluded_name(t->n[i].name))
			kids[k++] = i;
	sort_tree = t;
	qsort(kids, (size_t)k, sizeof(int), by_name);
	return k;
}

static bool walk(const struct tree *t, int dir, struct verdict *v)
{
	int kids[NODES_MAX];
	int k = children(t, dir, kids);
	for (int c = 0; c < k; c++) {
		const struct node *x = &t->n[kids[c]];
		/* What the image cannot hold comes before the type rules. */
		int depth = 0;
		for (int p = kids[c]; p > 0; p = t->n[p].parent)
			depth++;
		if (strlen(x->name) > CAP_PROJECTION_NAME_MAX || strlen(x->rel) > CAP_PROJECTION_PATH_MAX ||
		    depth > CAP_PROJECTION_DEPTH_MAX) {
			v->first_bad = kids[c];
			v->too_long = true;
			return false;
		}
		if (forbidden(t, kids[c])) {
			v->first_bad = kids[c];
			return false;
		}
		v->entries++;
		if (x->kind != K_DIR)
			v->bytes += x->size;
		else if (!walk(t, kids[c], v))
			return false;
	}
	return true;
}

static int expect(const struct tree *t, const struct cap_projection_limits *l, struct verdict *v)
{
	*v = (struct verdict){ .first_bad = -1 };
	if (!walk(t, 0, v))
		return v->too_long ? -ENAMETOOLONG : -EPERM;
	if (v->entries > l->max_entries || v->bytes > l->max_bytes)
		return -EFBIG;
	return 0;
}

/* --- checks --------------------------------------------------------------- */

static const char *rule(enum kind k)
{
	switch (k) {
	case K_SYM: return "a symbolic link";
	case K_FIFO: return "a FIFO";
	case K_SOCK: return "a socket";
	case K_CHR: return "a character device";
	default: return "hard-linked";
	}
}

/* One result of a scan or a build against the model. */
static void check_result(const struct tree *t, const struct cap_projection_limits *l,
			 const char *what, int rc, const struct cap_projection_info *info,
			 const struct cap_err *err)
{
	struct verdict v;
	int want = expect(t, l, &v);
	if (rc != want)
		fail("%s returned %d, the model says %d (%s)", what, rc, want, rc < 0 ? esc(err->msg) : "accepted");
	CHECK(strlen(info->fingerprint) == 64 && strspn(info->fingerprint, "0123456789abcdef") == 64,
	      "%s: the fingerprint is not 64 hex digits", what);
	if (rc != -EPERM && rc != -ENAMETOOLONG) {
		CHECK(info->entries == v.entries && info->bytes == v.bytes,
		      "%s counted %" PRIu64 " entries and %" PRIu64 " bytes, the model %" PRIu64 " and %" PRIu64,
		      what, info->entries, info->bytes, v.entries, v.bytes);
	}
	if (rc == 0)
		return;
	CHECK(err->code == -rc && err->msg[0], "%s: error code %d or an empty message", what, err->code);
	if (rc == -EFBIG) {
		const char *cap = v.entries > l->max_entries ? "CAPSULE_SOURCE_MAX_ENTRIES" : "CAPSULE_SOURCE_MAX_BYTES";
		CHECK(strstr(err->msg, t->root) && strstr(err->msg, cap), "%s: \"%s\" does not name %s and %s",
		      what, esc(err->msg), t->root, cap);
		return;
	}
	if (rc == -ENAMETOOLONG) {
		/* The entry (its path shortened when long) and the limit. */
		CHECK(strncmp(err->msg, "public data ", 12) == 0 && strstr(err->msg, "over the limit of"),
		      "%s: \"%s\" does not name the entry and the limit it is over", what, esc(err->msg));
		return;
	}
	/* Refused: the message names the entry at fault, by its path in the
	 * tree, and the rule (unless the path fills the message). */
	const struct node *bad = &t->n[v.first_bad];
	char *want_msg = xasprintf("public data %s ", bad->rel);
	size_t cmp = CAP_MIN(strlen(want_msg), sizeof(err->msg) - 1);
	if (strncmp(err->msg, want_msg, cmp) != 0) {
		fail("%s: \"%s\" does not name the %s %s, first in walk order", what, esc(err->msg),
		     kind_name[bad->kind], esc(bad->rel));
	}
	if (strlen(err->msg) < sizeof(err->msg) - 1)
		CHECK(strstr(err->msg + cmp, rule(bad->kind)), "%s: \"%s\" does not say \"%s\"", what,
		      esc(err->msg), rule(bad->kind));
	free(want_msg);
	/* And that path is there, in the tree (when the kernel can take it). */
	char *full = xasprintf("%s/%s", t->root, bad->rel);
	struct stat st;
	if (strlen(full) < 4096)
		CHECK(lstat(full, &st) == 0 && !S_ISDIR(st.st_mode), "%s: the refused path %s is not in the tree",
		      what, esc(full));
	free(full);
}

static void read_same(int fd, const struct node *x)
{
	uint8_t buf[4096];
	uint64_t off = 0;
	ssize_t k;
	while ((k = read(fd, buf, sizeof(buf))) > 0) {
		for (ssize_t j = 0; j < k; j++)
			CHECK(buf[j] == (uint8_t)(x->fill + 131 * (off + (uint64_t)j)),
			      "the image's copy of %s differs at byte %" PRIu64, esc(x->rel), off + (uint64_t)j);
		off += (uint64_t)k;
	}
	CHECK(k == 0 && off == x->size, "the image's copy of %s has %" PRIu64 " bytes, not %" PRIu64, esc(x->rel),
	      off, x->size);
}

/* The extracted image at fd holds exactly what the model has under dir. */
static void same_tree(const struct tree *t, int dir, int fd)
{
	int kids[NODES_MAX];
	int k = children(t, dir, kids);
	for (int c = 0; c < k; c++) {
		const struct node *x = &t->n[kids[c]];
		struct stat st;
		CHECK(fstatat(fd, x->name, &st, AT_SYMLINK_NOFOLLOW) == 0, "%s is missing from the image: %s",
		      esc(x->rel), strerror(errno));
		CHECK(x->kind == K_DIR ? S_ISDIR(st.st_mode) : S_ISREG(st.st_mode),
		      "%s has the wrong type in the image", esc(x->rel));
		int cfd = openat(fd, x->name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (x->kind == K_DIR ? O_DIRECTORY : 0));
		CHECK(cfd >= 0, "cannot open the image's %s: %s", esc(x->rel), strerror(errno));
		if (x->kind == K_DIR)
			same_tree(t, kids[c], cfd);
		else
			read_same(cfd, x);
		close(cfd);
	}
	int dfd = dup(fd);
	DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
	CHECK(d, "cannot list the image: %s", strerror(errno));
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0;
	closedir(d);
	CHECK(n == k, "the image has %d entries in %s, the model %d (node_modules must not be copied)", n,
	      *t->n[dir].rel ? t->n[dir].rel : ".", k);
}

static int spawn(char *const argv[])
{
	pid_t pid = fork();
	if (pid == 0) {
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	int st;
	if (pid < 0 || waitpid(pid, &st, 0) < 0)
		return -1;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Entries of top other than the tree and the image: staging left behind. */
static void no_leftovers(const struct tree *t, const char *what)
{
	DIR *d = opendir(t->top);
	CHECK(d, "cannot list %s: %s", t->top, strerror(errno));
	struct dirent *e;
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		if (strcmp(n, ".") && strcmp(n, "..") && strcmp(n, "t") && strcmp(n, "img.erofs") && strcmp(n, "x"))
			fail("%s left %s/%s behind", what, t->top, n);
	}
	closedir(d);
}

static bool have_erofs(void)
{
	static int have = -1;
	if (have < 0) {
		char *mk[] = { "mkfs.erofs", "--help", NULL }, *ck[] = { "fsck.erofs", "--help", NULL };
		have = spawn(mk) != 127 && spawn(ck) != 127;
	}
	return have;
}

static struct {
	long trees, refused, capped, accepted, built, long_paths;
} stats;

/* Build the image and check it against the scan and the model. */
static void build(const struct tree *t, const struct cap_projection_limits *l,
		  const struct cap_projection_info *scanned)
{
	_cleanup_free_ char *img = xasprintf("%s/img.erofs", t->top);
	_cleanup_free_ char *x = xasprintf("%s/x", t->top);
	struct cap_projection_info info;
	struct cap_err err = { 0 };
	int rc = cap_projection_build(t->root, l, img, &info, &err);
	check_result(t, l, "cap_projection_build", rc, &info, &err);
	no_leftovers(t, "cap_projection_build");
	struct stat st;
	if (rc < 0) {
		CHECK(lstat(img, &st) < 0, "a refused build left an image");
		return;
	}
	stats.built++;
	CHECK(strcmp(info.fingerprint, scanned->fingerprint) == 0, "the build's fingerprint is not the scan's");
	CHECK(lstat(img, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0, "no image at %s", img);
	char *argv[] = { "fsck.erofs", xasprintf("--extract=%s", x), img, NULL };
	int ex = spawn(argv);
	free(argv[1]);
	CHECK(ex == 0, "fsck.erofs --extract failed on the image (exit %d)", ex);
	int fd = open(x, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	CHECK(fd >= 0, "no extracted tree at %s", x);
	same_tree(t, 0, fd);
	close(fd);
}

/* The whole round for one input. */
static void one_tree(const uint8_t *data, size_t size, bool with_build)
{
	struct tree t;
	struct src s = { data, size, 0 };
	/* tmpfs when there is one: on a busy disk the tree is most of the time. */
	const char *tmp = getenv("TMPDIR");
	if (!tmp || !*tmp)
		tmp = access("/dev/shm", W_OK | X_OK) == 0 ? "/dev/shm" : "/tmp";
	memset(&t, 0, sizeof(t));
	t.top = xasprintf("%s/capsule-fuzz-proj-XXXXXX", tmp);
	CHECK(mkdtemp(t.top), "mkdtemp: %s", strerror(errno));
	t.root = xasprintf("%s/t", t.top);
	CHECK(mkdir(t.root, 0755) == 0, "mkdir %s: %s", t.root, strerror(errno));
	cur = &t;
	make_tree(&t, &s);

	struct cap_projection_limits l;
	struct cap_err err = { 0 };
	CHECK(cap_projection_limits_init(&l, &err) == 0, "cap_projection_limits_init: %s", err.msg);
	struct verdict v;
	expect(&t, &l, &v);
	switch (take_below(&s, 8)) {	/* a cap right at the tree's size */
	case 0: l.max_entries = v.entries + take_below(&s, 3) - (v.entries > 0); break;
	case 1: l.max_bytes = v.bytes + take_below(&s, 3) - (v.bytes > 0); break;
	}
	for (int i = 0; i < t.count; i++)
		stats.long_paths += strlen(t.n[i].rel) + strlen(t.root) >= 4096;

	struct cap_projection_info a, b;
	struct cap_err ea = { 0 }, eb = { 0 };
	int ra = cap_projection_scan(t.root, &l, &a, &ea);
	check_result(&t, &l, "cap_projection_scan", ra, &a, &ea);
	int rb = cap_projection_scan(t.root, &l, &b, &eb);
	CHECK(rb == ra && strcmp(a.fingerprint, b.fingerprint) == 0 &&
	      (ra == -EPERM || ra == -ENAMETOOLONG || (a.entries == b.entries && a.bytes == b.bytes)),
	      "a second scan of the same tree differs (%d, %s) from the first (%d, %s)", rb, b.fingerprint, ra,
	      a.fingerprint);
	stats.trees++;
	stats.refused += ra == -EPERM || ra == -ENAMETOOLONG;
	stats.capped += ra == -EFBIG;
	stats.accepted += ra == 0;

	/* Whatever is added inside node_modules is not looked at. */
	for (int i = 1; i < t.count; i++) {
		if (t.n[i].kind != K_DIR || !hidden(&t, i))
			continue;
		int fd = t.fd[i];
		CHECK(symlinkat("/etc/passwd", fd, "zz-added-link") == 0 || errno == EEXIST, "symlinkat: %s", strerror(errno));
		CHECK(mkfifoat(fd, "zz-added-fifo", 0600) == 0 || errno == EEXIST, "mkfifoat: %s", strerror(errno));
		int f = openat(fd, "zz-added-file", O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
		CHECK(f >= 0 && write(f, "new", 3) == 3, "cannot add a file: %s", strerror(errno));
		close(f);
		int rc = cap_projection_scan(t.root, &l, &b, &eb);
		CHECK(rc == ra && strcmp(a.fingerprint, b.fingerprint) == 0,
		      "adding to %s (in node_modules) changed the scan: %d, %s", esc(t.n[i].rel), rc,
		      rc < 0 ? esc(eb.msg) : b.fingerprint);
		break;
	}

	if (with_build && have_erofs())
		build(&t, &l, &a);

	/* A file the walk sees grows by one byte: the fingerprint moves. */
	for (int i = 1; ra != -EPERM && ra != -ENAMETOOLONG && i < t.count; i++) {
		struct node *x = &t.n[i];
		if (x->kind != K_REG || hidden(&t, i) || links_of(&t, i) != 1)
			continue;
		int f = openat(t.fd[x->parent], x->name, O_WRONLY | O_APPEND | O_NOFOLLOW | O_CLOEXEC);
		uint8_t c = (uint8_t)(x->fill + 131 * x->size);
		CHECK(f >= 0 && write(f, &c, 1) == 1, "cannot append to %s: %s", esc(x->rel), strerror(errno));
		close(f);
		x->size++;
		struct cap_err ec = { 0 };
		int rc = cap_projection_scan(t.root, &l, &b, &ec);
		check_result(&t, &l, "cap_projection_scan after a change", rc, &b, &ec);
		CHECK(strcmp(a.fingerprint, b.fingerprint) != 0, "%s grew and the fingerprint stayed %s", esc(x->rel),
		      a.fingerprint);
		break;
	}

	for (int i = 0; i < t.count; i++) {
		if (t.fd[i] >= 0)
			close(t.fd[i]);
		free(t.n[i].name);
		free(t.n[i].rel);
	}
	cur = NULL;
	int r = cap_remove_tree(t.top);
	CHECK(r == 0 && access(t.top, F_OK) < 0, "cannot remove %s: %s", t.top, strerror(-r));
	free(t.top);
	free(t.root);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	one_tree(data, size, size > 0 && data[0] % 16 == 0);
	return 0;
}

#ifdef CAP_FUZZ_MUTATE
/* Standalone driver: random inputs from a fixed seed. */
static uint64_t rng = 0x9e3779b97f4a7c15ull;
static uint32_t next(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return (uint32_t)(rng >> 11);
}

int main(int argc, char **argv)
{
	long iters = argc > 1 ? atol(argv[1]) : 1000;
	uint64_t seed = argc > 2 ? strtoull(argv[2], NULL, 0) : rng;
	long every = argc > 3 ? atol(argv[3]) : 10;
	setvbuf(stdout, NULL, _IOLBF, 0);
	snprintf(again, sizeof(again), "%s %ld %#" PRIx64 " %ld", argv[0], iters, seed, every);
	rng = seed ? seed : 1;
	printf("1..1\n");
	test_no = 1;
	test_name = "generated trees through cap_projection_scan and cap_projection_build";
	if (!have_erofs())
		printf("# mkfs.erofs or fsck.erofs not found: cap_projection_build is not exercised\n");
	uint8_t buf[1024];
	for (long i = 0; i < iters; i++) {
		size_t n = 8 + next() % (sizeof(buf) - 8);
		for (size_t j = 0; j < n; j++)
			buf[j] = (uint8_t)next();
		one_tree(buf, n, every > 0 && i % every == 0);
	}
	printf("ok 1 - %ld trees from seed %#" PRIx64 ": %ld refused, %ld over a cap, %ld accepted, %ld built and extracted; %ld paths past PATH_MAX\n",
	       stats.trees, seed, stats.refused, stats.capped, stats.accepted, stats.built, stats.long_paths);
	return 0;
}
#endif
