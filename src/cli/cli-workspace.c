/* capsule diff and capsule merge: what a sandbox changed in its
 * /workspace against the base (the state it and the host project last
 * agreed on), and bringing that back into the project three-way, or its
 * git commits into a branch (docs/workspace.md). */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "cli.h"
#include "layout.h"
#include "named.h"
#include "paths.h"
#include "proto.h"
#include "serve.h"
#include "tree.h"
#include "utf8.h"
#include "util.h"
#include "workspace.h"
#include "xfer.h"

static int fail(const struct cap_err *err)
{
	cap_cli_error("%s", err->msg);
	return CAP_EXIT_FAILURE;
}

/* --- shared -------------------------------------------------------------- */

/* Hold the sandbox's workspace lock, waiting (and saying so) while
 * another diff or merge of it runs. The descriptor, or -errno with err
 * set. */
static int lock_workspace(const char *name, struct cap_err *err)
{
	int fd = cap_workspace_lock(name, false, err);
	if (fd != -EWOULDBLOCK)
		return fd;
	fprintf(stderr, "capsule: another diff or merge of sandbox '%s' is running; waiting for it\n", name);
	return cap_workspace_lock(name, true, err);
}

/* Open path beneath dirfd for reading without following any symbolic
 * link on the way. A descriptor or -errno. */
static int open_beneath(int dirfd, const char *path)
{
	struct open_how how = {
		.flags = O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK,
		.resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
	return fd < 0 ? -errno : (int)fd;
}

/* Path as printed in a line of text: as it is, or C-quoted as git does
 * when it holds a control byte, a quote or a backslash. New string. */
static char *quote_path(const char *p)
{
	bool plain = true;
	for (const unsigned char *c = (const unsigned char *)p; *c && plain; c++)
		plain = *c >= 0x20 && *c != 0x7f && *c != '"' && *c != '\\';
	if (plain)
		return xstrdup(p);
	struct cap_buf b;
	cap_buf_init(&b);
	cap_buf_append(&b, "\"", 1);
	for (const unsigned char *c = (const unsigned char *)p; *c; c++) {
		char e[8];
		int n;
		switch (*c) {
		case '\n': n = snprintf(e, sizeof(e), "\\n"); break;
		case '\t': n = snprintf(e, sizeof(e), "\\t"); break;
		case '"': n = snprintf(e, sizeof(e), "\\\""); break;
		case '\\': n = snprintf(e, sizeof(e), "\\\\"); break;
		default:
			n = *c < 0x20 || *c == 0x7f ? snprintf(e, sizeof(e), "\\%03o", *c)
						   : snprintf(e, sizeof(e), "%c", *c);
		}
		cap_buf_append(&b, e, (size_t)n);
	}
	cap_buf_append(&b, "\"\0", 2);	/* and the string's end */
	char *s = xstrdup((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	return s;
}

static const char *type_name(char t)
{
	switch (t) {
	case CAP_TREE_FILE: return "file";
	case CAP_TREE_DIR: return "dir";
	case CAP_TREE_LINK: return "link";
	default: return "other";
	}
}

/* --- capsule diff -------------------------------------------------------- */

static const char diff_usage[] =
	"Usage: capsule diff NAME [--patch] [--json]\n"
	"\n"
	"List what the sandbox NAME changed in /workspace since the base (the\n"
	"copy made at create, or the last merge), one line per path, sorted:\n"
	"  A PATH  added             D PATH  deleted\n"
	"  M PATH  content changed   T PATH  another type (file, dir, link)\n"
	"  m PATH (0644 -> 0755)     only the permission bits changed\n"
	"A summary goes to stderr. The sandbox is started if it is stopped.\n"
	"  --patch  a unified diff (diff -u) of the changed text files instead;\n"
	"           the base side is read from the host project while it still\n"
	"           holds the base's content\n"
	"  --json   {\"sandbox\": NAME, \"changes\": [{\"path\", \"change\", \"type\",\n"
	"           \"mode\", \"old_mode\", \"size\", \"sha256\"}...]} (docs/workspace.md)\n"
	"Exits 0 whether or not anything changed, 125 when it cannot tell.\n";

static char change_letter(enum cap_tree_change_kind k)
{
	switch (k) {
	case CAP_TREE_ADDED: return 'A';
	case CAP_TREE_DELETED: return 'D';
	case CAP_TREE_MODIFIED: return 'M';
	case CAP_TREE_MODE: return 'm';
	default: return 'T';
	}
}

static int print_json(const char *name, const struct cap_tree_change *ch, size_t n)
{
	return cap_cli_json_out(cap_rpc_diff_json(name, ch, n));
}

static void print_lines(FILE *to, const struct cap_tree_change *ch, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct cap_tree_entry *cur = ch[i].to ? ch[i].to : ch[i].from;
		_cleanup_free_ char *q = quote_path(cur->path);
		if (ch[i].kind == CAP_TREE_MODE)
			fprintf(to, "m %s (%04o -> %04o)\n", q, ch[i].from->mode & 07777, ch[i].to->mode & 07777);
		else
			fprintf(to, "%c %s\n", change_letter(ch[i].kind), q);
	}
}

static void print_summary(const char *name, const struct cap_tree_change *ch, size_t n)
{
	size_t count[5] = { 0 };
	for (size_t i = 0; i < n; i++)
		count[ch[i].kind]++;
	if (!n) {
		fprintf(stderr, "sandbox %s: no changes in /workspace since the base\n", name);
		return;
	}
	fprintf(stderr, "sandbox %s: %zu change%s in /workspace: %zu added, %zu modified, %zu deleted, %zu mode, %zu type\n",
		name, n, n == 1 ? "" : "s", count[CAP_TREE_ADDED], count[CAP_TREE_MODIFIED], count[CAP_TREE_DELETED],
		count[CAP_TREE_MODE], count[CAP_TREE_TYPE]);
}

int cap_cli_workspace_report(const char *name, struct cap_sandbox *sb, size_t most)
{
	struct cap_err err = { 0 };
	struct cap_tree base, now;
	struct cap_tree_change *ch = NULL;
	size_t n = 0;
	int r;
	cap_tree_init(&base);
	cap_tree_init(&now);
	_cleanup_close_ int lock = lock_workspace(name, &err);
	if (lock < 0 || (r = cap_workspace_diff(name, sb, &base, &now, &ch, &n, &err)) < 0) {
		cap_cli_error("%s", err.msg);
		r = -1;
	} else {
		print_lines(stderr, ch, n < most ? n : most);
		if (n > most)
			fprintf(stderr, "... and %zu more (`capsule diff %s` lists them all)\n", n - most, name);
		print_summary(name, ch, n);
		r = n > INT_MAX ? INT_MAX : (int)n;
	}
	free(ch);
	cap_tree_fini(&base);
	cap_tree_fini(&now);
	return r;
}

/* A patch shows a file's text up to this size (each side), and fetches
 * at most this much from the guest in all; beyond, a file's first
 * CAP_TAR_PREFIX_BYTES decide whether it is called binary or too large
 * to show. The review reads only what it shows. */
#define PATCH_FILE_MAX (1u << 20)
#define PATCH_FETCH_MAX (64ull << 20)
/* Most diff output taken from one file pair (two files of PATCH_FILE_MAX
 * of empty lines make 4 MiB). */
#define PATCH_DIFF_MAX (16u << 20)

/* Copy what is left of fd (at most PATCH_FILE_MAX bytes) into a new file
 * name in dirfd (0600), and hash the copy. 0 or -errno (-EFBIG over). */
static int copy_hash(int fd, int dirfd, const char *name, uint8_t hash[32], uint64_t *size)
{
	_cleanup_close_ int out = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	char buf[65536];
	uint64_t total = 0;
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		if ((total += (uint64_t)n) > PATCH_FILE_MAX)
			return -EFBIG;
		int r = cap_write_all(out, buf, (size_t)n);
		if (r < 0)
			return r;
	}
	if (lseek(out, 0, SEEK_SET) < 0)
		return -errno;
	return cap_tree_hash_fd(out, hash, size);
}

/* Whether what fd reads first looks binary: a NUL byte in its first
 * CAP_TAR_PREFIX_BYTES (git looks at 8000). */
static bool fd_binary(int fd)
{
	char buf[CAP_TAR_PREFIX_BYTES];
	ssize_t n = fd >= 0 ? pread(fd, buf, sizeof(buf), 0) : -1;
	return n > 0 && memchr(buf, 0, (size_t)n) != NULL;
}

static bool looks_binary(int dirfd, const char *name)
{
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	return fd_binary(fd);
}

struct patch_ctx {
	const char *name;
	const char *project;	/* the host project: where the base versions are read */
	int projfd;	/* -1 when it cannot be opened */
	const char *tmp;	/* private directory: base copies "b0"...; fetched files
			 * "w/0".. (whole), "p/0".. (their first CAP_TAR_PREFIX_BYTES) */
	int tmpfd, wholefd, prefixfd;
	size_t *fetched;	/* change i's fetched file index, or SIZE_MAX */
	bool *prefix;	/* ... and whether only its start was fetched */
	bool tty;	/* stdout is a terminal: file content shown visibly */
};

/* The base version of a changed path into tmp/bI, from the host project
 * while it still holds the base's content. 0, or 1 when it does not
 * (*why says so). */
static int base_version(struct patch_ctx *c, const struct cap_tree_entry *from, size_t i, char *name,
			size_t len, const char **why)
{
	uint8_t h[32];
	uint64_t size;
	snprintf(name, len, "b%zu", i);
	if (c->projfd < 0) {
		*why = "base version not available: the host project cannot be opened";
		return 1;
	}
	_cleanup_close_ int fd = open_beneath(c->projfd, from->path);
	struct stat st;
	if (fd < 0 || fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || copy_hash(fd, c->tmpfd, name, h, &size) < 0 ||
	    size != from->size || memcmp(h, from->hash, 32) != 0) {
		*why = "base version not available: the host file changed since the base";
		return 1;
	}
	return 0;
}

/* Write diff's output to stdout: on a terminal with what the terminal
 * would act on shown visibly (a file of the sandbox's must not rewrite
 * the review: ESC as ^[, CR as ^M...), to a pipe as it is (a patch that
 * still applies). */
static void show(const struct patch_ctx *c, const struct cap_buf *out)
{
	if (!c->tty) {
		fwrite(cap_buf_head(out), 1, cap_buf_used(out), stdout);
		return;
	}
	struct cap_buf v;
	cap_buf_init(&v);
	cap_utf8_visible((const char *)cap_buf_head(out), cap_buf_used(out), &v);
	fwrite(cap_buf_head(&v), 1, cap_buf_used(&v), stdout);
	cap_buf_fini(&v);
}

/* Run diff -u on two files (either may be /dev/null) with git's labels,
 * its output shown (show). */
static int run_diff(const struct patch_ctx *c, const char *a, const char *b, const char *la, const char *lb,
		    struct cap_err *err)
{
	char *argv[] = { "diff", "-u", "--label", (char *)la, "--label", (char *)lb, (char *)a, (char *)b, NULL };
	struct cap_buf e, out;
	int status = 0;
	cap_buf_init(&e);
	cap_buf_init(&out);
	int r = cap_run_capture(argv, &out, PATCH_DIFF_MAX, &e, &status, err);
	if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) <= 1)) {
		_cleanup_free_ char *msg = cap_buf_text(&e);
		r = cap_err_set(err, EIO, "diff -u %s %s failed: %s", a, b, *msg ? msg : "no message");
	}
	if (r == 0)
		show(c, &out);
	cap_buf_fini(&e);
	cap_buf_fini(&out);
	return r;
}

static int patch_one(struct patch_ctx *c, const struct cap_tree_change *ch, size_t i, struct cap_err *err)
{
	const struct cap_tree_entry *from = ch->from, *to = ch->to, *cur = to ? to : from;
	_cleanup_free_ char *q = quote_path(cur->path);
	/* The guest names the paths: quoted wherever they reach the terminal. */
	_cleanup_free_ char *ra = xasprintf("a/%s", cur->path);
	_cleanup_free_ char *rb = xasprintf("b/%s", cur->path);
	_cleanup_free_ char *la = quote_path(ra);
	_cleanup_free_ char *lb = quote_path(rb);
	printf("diff a/%s b/%s\n", q, q);
	if (from && to && from->type != to->type)
		printf("type change: %s -> %s\n", type_name(from->type), type_name(to->type));
	else if (!from)
		printf("new %s mode %04o\n", type_name(to->type), to->mode & 07777);
	else if (!to)
		printf("deleted %s mode %04o\n", type_name(from->type), from->mode & 07777);
	else if (from->mode != to->mode)
		printf("old mode %04o\nnew mode %04o\n", from->mode & 07777, to->mode & 07777);
	if (from && from->type == CAP_TREE_LINK) {
		_cleanup_free_ char *t = quote_path(from->target);
		printf("link a/%s -> %s\n", q, t);
	}
	if (to && to->type == CAP_TREE_LINK) {
		_cleanup_free_ char *t = quote_path(to->target);
		printf("link b/%s -> %s\n", q, t);
	}
	bool file_a = from && from->type == CAP_TREE_FILE;
	bool file_b = to && to->type == CAP_TREE_FILE;
	if (!file_a && !file_b)
		return 0;
	if (file_a && file_b && memcmp(from->hash, to->hash, 32) == 0)
		return 0;	/* a mode change only */
	const char *sa = file_a ? la : "/dev/null", *sb = file_b ? lb : "/dev/null";
	char aname[32] = "", bname[32] = "";
	if (file_b)
		cap_merge_stage_name(c->fetched[i], bname);
	int bfd = file_b ? (c->prefix[i] ? c->prefixfd : c->wholefd) : -1;
	bool big_a = file_a && from->size > PATCH_FILE_MAX, big_b = file_b && c->prefix[i];
	if (big_a || big_b) {
		/* Only the start of each side is read: enough to call it binary. */
		_cleanup_close_ int afd = file_a && c->projfd >= 0 ? open_beneath(c->projfd, from->path) : -1;
		if ((file_a && fd_binary(afd)) || (file_b && looks_binary(bfd, bname))) {
			printf("Binary files %s and %s differ\n", sa, sb);
		} else if (big_b && to->size <= PATCH_FILE_MAX && !big_a) {
			printf("%s: not shown: the patch has shown %llu MiB of the sandbox's files already (run `capsule diff %s --patch` on fewer changes, or `capsule cp %s:/workspace/PATH FILE`)\n",
			       sb, PATCH_FETCH_MAX >> 20, c->name, c->name);
		} else {
			printf("%s and %s: too large to show (%llu and %llu bytes; a patch shows files up to %u KiB): `capsule cp %s:/workspace/PATH FILE` copies it out\n",
			       sa, sb, file_a ? (unsigned long long)from->size : 0ull,
			       file_b ? (unsigned long long)to->size : 0ull, PATCH_FILE_MAX >> 10, c->name);
		}
		return 0;
	}
	const char *why = NULL;
	if (file_a && base_version(c, from, i, aname, sizeof(aname), &why) != 0) {
		printf("%s\n", why);
		unlinkat(c->tmpfd, aname, 0);
		return 0;
	}
	int r = 0;
	if ((file_a && looks_binary(c->tmpfd, aname)) || (file_b && looks_binary(bfd, bname))) {
		printf("Binary files %s and %s differ\n", sa, sb);
	} else {
		_cleanup_free_ char *pa = file_a ? xasprintf("%s/%s", c->tmp, aname) : xstrdup("/dev/null");
		_cleanup_free_ char *pb = file_b ? xasprintf("%s/w/%s", c->tmp, bname) : xstrdup("/dev/null");
		fflush(stdout);
		r = run_diff(c, pa, pb, sa, sb, err);
	}
	/* What was shown is not kept: the copies never add up. */
	if (file_a)
		unlinkat(c->tmpfd, aname, 0);
	if (file_b)
		unlinkat(bfd, bname, 0);
	return r;
}

/* Fetch paths[0..n) (whole, or their starts) into the subdirectory sub
 * of the review's directory; its fd in *fd. */
static int fetch_into(struct patch_ctx *c, struct cap_sandbox *sb, const char *sub, int *fd, const char **paths,
		      const uint64_t *sizes, size_t n, bool prefix, struct cap_err *err)
{
	if (mkdirat(c->tmpfd, sub, 0700) < 0 || (*fd = openat(c->tmpfd, sub, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return cap_err_set(err, errno, "cannot make %s/%s: %s", c->tmp, sub, strerror(errno));
	_cleanup_free_ char *where = xasprintf("%s/%s", c->tmp, sub);
	struct cap_xfer_fetch_opts fo = { .where = where, .prefix = prefix,
					  .max_bytes = prefix ? (uint64_t)n * CAP_TAR_PREFIX_BYTES : PATCH_FETCH_MAX };
	int r = n ? cap_xfer_fetch(sb, CAP_GUEST_WORKSPACE, paths, sizes, n, *fd, &fo, err) : 0;
	if (r == -ESTALE)
		cap_err_prefix(err, "the sandbox changed /workspace while diff read it; run it again");
	return r;
}

/* --patch: fetch the guest's versions of the changed files that are
 * shown (the starts of the others), then diff each against its base
 * version. */
static int print_patch(const char *name, const struct cap_record *rec, struct cap_sandbox *sb,
		       const struct cap_tree_change *ch, size_t n, struct cap_err *err)
{
	struct patch_ctx c = { .name = name, .project = rec->workspace, .projfd = -1, .tmpfd = -1, .wholefd = -1,
			       .prefixfd = -1, .tty = isatty(STDOUT_FILENO) };
	_cleanup_free_ char *tmp = cap_make_tmpdir("capsule-ws", err);
	if (!tmp)
		return -err->code;
	c.tmp = tmp;
	c.fetched = xcalloc(n ? n : 1, sizeof(size_t));
	c.prefix = xcalloc(n ? n : 1, sizeof(bool));
	const char **wp = xcalloc(n ? n : 1, sizeof(char *)), **pp = xcalloc(n ? n : 1, sizeof(char *));
	uint64_t *ws = xcalloc(n ? n : 1, sizeof(uint64_t)), *ps = xcalloc(n ? n : 1, sizeof(uint64_t));
	size_t nw = 0, np = 0;
	uint64_t whole = 0;
	int r = 0;
	for (size_t i = 0; i < n; i++) {
		c.fetched[i] = SIZE_MAX;
		const struct cap_tree_entry *from = ch[i].from, *to = ch[i].to;
		if (!to || to->type != CAP_TREE_FILE ||
		    (from && from->type == CAP_TREE_FILE && memcmp(from->hash, to->hash, 32) == 0))
			continue;
		bool shown = to->size <= PATCH_FILE_MAX && to->size <= PATCH_FETCH_MAX - whole &&
			     !(from && from->type == CAP_TREE_FILE && from->size > PATCH_FILE_MAX);
		c.prefix[i] = !shown;
		if (shown) {
			whole += to->size;
			c.fetched[i] = nw;
			ws[nw] = to->size;
			wp[nw++] = to->path;
		} else {
			c.fetched[i] = np;
			ps[np] = to->size;
			pp[np++] = to->path;
		}
	}
	if ((c.tmpfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = cap_err_set(err, errno, "cannot open %s: %s", tmp, strerror(errno));
		goto out;
	}
	c.projfd = open(rec->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if ((r = fetch_into(&c, sb, "w", &c.wholefd, wp, ws, nw, false, err)) < 0 ||
	    (r = fetch_into(&c, sb, "p", &c.prefixfd, pp, ps, np, true, err)) < 0)
		goto out;
	for (size_t i = 0; i < n; i++) {
		if (c.fetched[i] == SIZE_MAX || c.prefix[i])
			continue;
		struct cap_merge_op op = { .action = CAP_MERGE_WRITE, .path = ch[i].to->path, .theirs = ch[i].to,
					   .stage = c.fetched[i] };
		if ((r = cap_merge_stage_verify(c.wholefd, &op, err)) < 0) {
			cap_err_prefix(err, "the sandbox changed /workspace while diff read it; run it again");
			goto out;
		}
	}
	for (size_t i = 0; i < n && r == 0; i++)
		r = patch_one(&c, &ch[i], i, err);
	fflush(stdout);
out:
	if (c.tmpfd >= 0)
		close(c.tmpfd);
	if (c.wholefd >= 0)
		close(c.wholefd);
	if (c.prefixfd >= 0)
		close(c.prefixfd);
	if (c.projfd >= 0)
		close(c.projfd);
	cap_remove_tree(tmp);
	free(c.fetched);
	free(c.prefix);
	free(wp);
	free(pp);
	free(ws);
	free(ps);
	return r;
}

int cap_cli_diff(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "patch", no_argument, NULL, 'p' },
		{ "json", no_argument, NULL, 'j' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool patch = false, json = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "ph", opts, NULL)) != -1) {
		switch (c) {
		case 'p': patch = true; break;
		case 'j': json = true; break;
		case 'h': fputs(diff_usage, stdout); return 0;
		default: fputs(diff_usage, stderr); return CAP_EXIT_USAGE;
		}
	}
	if (optind != argc - 1 || (patch && json)) {
		if (patch && json)
			cap_cli_error("diff: --patch and --json do not go together");
		fputs(diff_usage, stderr);
		return CAP_EXIT_USAGE;
	}
	const char *name = argv[optind];
	struct cap_err err = { 0 };
	struct cap_record rec;
	struct cap_tree base, now;
	struct cap_sandbox *sb = NULL;
	struct cap_tree_change *ch = NULL;
	size_t n = 0;
	int rc = CAP_EXIT_FAILURE;
	cap_tree_init(&base);
	cap_tree_init(&now);
	if (cap_named_load(name, &rec, &err) < 0)
		return fail(&err);
	_cleanup_close_ int lock = lock_workspace(name, &err);
	if (lock < 0)
		goto out;
	if (!rec.workspace[0]) {
		/* Said before the sandbox is started for nothing. */
		cap_err_set(&err, ENOENT, "sandbox '%s' has no workspace; `capsule create NAME --workspace DIR` makes one with it",
			    name);
		goto out;
	}
	if (cap_cli_attach(name, &sb, &err) < 0 || cap_workspace_diff(name, sb, &base, &now, &ch, &n, &err) < 0)
		goto out;
	if (json) {
		if (print_json(name, ch, n) != 0)
			goto out;	/* said by cap_cli_json_out; err stays empty */
	} else if (patch && print_patch(name, &rec, sb, ch, n, &err) < 0) {
		goto out;
	} else if (!patch) {
		print_lines(stdout, ch, n);
	}
	print_summary(name, ch, n);
	rc = 0;
out:
	if (rc && err.msg[0])
		cap_cli_error("%s", err.msg);
	free(ch);
	cap_tree_fini(&base);
	cap_tree_fini(&now);
	cap_sandbox_free(sb);
	return rc;
}

/* --- capsule merge ------------------------------------------------------- */

static const char merge_usage[] =
	"Usage: capsule merge NAME [--into DIR] [--theirs | --ours] [--dry-run]\n"
	"       capsule merge NAME --git [--into DIR]\n"
	"\n"
	"Apply what the sandbox NAME changed in /workspace to the host project\n"
	"(DIR, default the directory it was created from), three-way against the\n"
	"base: a path the host did not change since takes the sandbox's version;\n"
	"a path both changed differently is a conflict, and then nothing is\n"
	"written: every conflicting path is named and merge exits 1.\n"
	"  --theirs   settle conflicts with the sandbox's version\n"
	"  --ours     settle conflicts by keeping the host's version\n"
	"  --dry-run  print what would be done, change nothing\n"
	"Files are staged in DIR/.capsule-merge.NAME, checked, then renamed into\n"
	"place, never through a symbolic link: a merge that is killed leaves each\n"
	"file old or new, and running it again finishes it. Afterwards the base\n"
	"is the sandbox's state, so the next merge brings only newer changes.\n"
	"  --git      DIR is a git work tree: fetch the commits made in the\n"
	"             sandbox's /workspace (its HEAD) into the branch capsule/NAME\n"
	"             of DIR's repository, leaving DIR's files and the base alone\n"
	"             (the image needs git)\n"
	"Exits 0 when merged, 1 on conflicts, 125 when it could not merge.\n";

static const char *action_name(enum cap_merge_action a)
{
	switch (a) {
	case CAP_MERGE_WRITE: return "write";
	case CAP_MERGE_LINK: return "link";
	case CAP_MERGE_MKDIR: return "mkdir";
	case CAP_MERGE_CHMOD: return "chmod";
	default: return "remove";
	}
}

static void print_plan(const struct cap_merge_plan *p)
{
	for (size_t i = 0; i < p->nops; i++) {
		const struct cap_merge_op *op = &p->ops[i];
		_cleanup_free_ char *q = quote_path(op->path);
		if (op->action == CAP_MERGE_LINK) {
			_cleanup_free_ char *t = quote_path(op->theirs->target);
			printf("link   %s -> %s\n", q, t);
		}
		else if (op->action == CAP_MERGE_REMOVE)
			printf("remove %s\n", q);
		else
			printf("%-6s %s (%04o)\n", action_name(op->action), q, op->theirs->mode & 0777);
	}
}

static void print_conflicts(const char *name, const struct cap_merge_plan *p, bool dry)
{
	for (size_t i = 0; i < p->nconflicts; i++) {
		_cleanup_free_ char *q = quote_path(p->conflicts[i].path);
		fprintf(stderr, "conflict: %s: %s\n", q, p->conflicts[i].why);
	}
	fprintf(stderr, "capsule: %zu conflict%s; %s. Settle them with `capsule merge %s --theirs` (the sandbox's version) or `--ours` (keep the host's), or make both sides agree\n",
		p->nconflicts, p->nconflicts == 1 ? "" : "s", dry ? "a merge would write nothing" : "nothing was written",
		name);
}

static void print_merged(const char *dir, const struct cap_merge_plan *p)
{
	struct cap_workspace_counts n;
	cap_workspace_count(p, &n);
	printf("merged: %zu written, %zu removed, %zu links, %zu directories made, %zu modes changed into %s\n",
	       n.written, n.removed, n.links, n.created, n.chmod, dir);
}

/* Changes inside repositories are never merged: say so, and which, when
 * there were any. */
static void print_git_left_out(const char *name, const struct cap_merge_plan *p)
{
	if (!p->ngit)
		return;
	fprintf(stderr, "capsule: left out %zu change%s inside .git or other git repositories (a repository's own files are never merged: its config and hooks would run here):",
		p->ngit, p->ngit == 1 ? "" : "s");
	for (size_t i = 0; i < p->nrepos; i++) {
		_cleanup_free_ char *q = quote_path(*p->repos[i].path ? p->repos[i].path : ".");
		fprintf(stderr, "%s %s (%s)", i ? "," : "", q, p->repos[i].why);
	}
	fprintf(stderr, "; `capsule merge %s --git` brings the sandbox's commits back\n", name);
}

int cap_cli_merge(int argc, char **argv)
{
	enum { OPT_INTO = 0x1000, OPT_THEIRS, OPT_OURS, OPT_DRY, OPT_GIT };
	static const struct option opts[] = {
		{ "into", required_argument, NULL, OPT_INTO },
		{ "theirs", no_argument, NULL, OPT_THEIRS },
		{ "ours", no_argument, NULL, OPT_OURS },
		{ "dry-run", no_argument, NULL, OPT_DRY },
		{ "git", no_argument, NULL, OPT_GIT },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	enum cap_merge_pick pick = CAP_MERGE_REFUSE;
	const char *into = NULL;
	bool dry = false, git = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "h", opts, NULL)) != -1) {
		switch (c) {
		case OPT_INTO: into = optarg; break;
		case OPT_THEIRS:
		case OPT_OURS:
			if (pick != CAP_MERGE_REFUSE) {
				cap_cli_error("merge: --theirs and --ours do not go together");
				return CAP_EXIT_USAGE;
			}
			pick = c == OPT_THEIRS ? CAP_MERGE_THEIRS : CAP_MERGE_OURS;
			break;
		case OPT_DRY: dry = true; break;
		case OPT_GIT: git = true; break;
		case 'h': fputs(merge_usage, stdout); return 0;
		default: fputs(merge_usage, stderr); return CAP_EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		fputs(merge_usage, stderr);
		return CAP_EXIT_USAGE;
	}
	if (git && (pick != CAP_MERGE_REFUSE || dry)) {
		cap_cli_error("merge: --git takes no --theirs, --ours or --dry-run (it only adds a branch)");
		return CAP_EXIT_USAGE;
	}
	const char *name = argv[optind];
	struct cap_err err = { 0 };
	struct cap_record rec;
	if (cap_named_load(name, &rec, &err) < 0)
		return fail(&err);
	if (!rec.workspace[0]) {
		cap_cli_error("sandbox '%s' has no workspace to merge; `capsule create NAME --workspace DIR` makes one with it",
			      name);
		return CAP_EXIT_FAILURE;
	}
	char dir[PATH_MAX];
	if (!realpath(into ? into : rec.workspace, dir)) {
		cap_cli_error("merge: %s: %s", into ? into : rec.workspace, strerror(errno));
		return CAP_EXIT_FAILURE;
	}
	struct stat st;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		cap_cli_error("merge: %s is not a directory", dir);
		return CAP_EXIT_FAILURE;
	}
	_cleanup_close_ int lock = lock_workspace(name, &err);
	if (lock < 0)
		return fail(&err);
	struct cap_sandbox *sb = NULL;
	if (cap_cli_attach(name, &sb, &err) < 0) {
		cap_sandbox_free(sb);
		return fail(&err);
	}
	if (git) {
		struct cap_workspace_git got;
		int r = cap_workspace_git(name, sb, dir, &got, &err);
		cap_sandbox_free(sb);
		if (r < 0)
			return fail(&err);
		printf("fetched sandbox %s's HEAD into branch %s of %s: %s %s\n", name, got.branch, dir, got.commit,
		       got.subject);
		return 0;
	}

	struct cap_workspace_merge m;
	int rc = CAP_EXIT_FAILURE;
	_cleanup_close_ int dir_lock = -1;
	if (!dry && (dir_lock = cap_workspace_lock_dir(dir, false, &err)) == -EWOULDBLOCK) {
		fprintf(stderr, "capsule: another merge into %s is running; waiting for it\n", dir);
		dir_lock = cap_workspace_lock_dir(dir, true, &err);
	}
	if (!dry && dir_lock < 0) {
		cap_sandbox_free(sb);
		return fail(&err);
	}
	if (cap_workspace_plan(name, sb, dir, pick, &m, &err) < 0)
		goto out;
	const struct cap_merge_plan *plan = &m.plan;
	print_git_left_out(name, plan);
	if (dry) {
		print_plan(plan);
		if (plan->nconflicts) {
			print_conflicts(name, plan, true);
			rc = 1;
		} else {
			fprintf(stderr, "dry run: %zu operation%s into %s, nothing written\n", plan->nops,
				plan->nops == 1 ? "" : "s", dir);
			rc = 0;
		}
		goto out;
	}
	if (plan->nconflicts) {
		print_conflicts(name, plan, false);
		rc = 1;
		goto out;
	}
	/* Without ops both sides agree already; the base still moves. */
	if (cap_workspace_apply(name, sb, &m, &err) < 0)
		goto out;
	if (plan->nops)
		print_merged(dir, plan);
	else
		printf("nothing to merge: %s has the sandbox's changes already\n", dir);
	rc = 0;
out:
	if (rc == CAP_EXIT_FAILURE)
		cap_cli_error("%s", err.msg);
	cap_workspace_merge_fini(&m);
	cap_sandbox_free(sb);
	return rc;
}
