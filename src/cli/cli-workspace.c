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
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "cli.h"
#include "named.h"
#include "paths.h"
#include "tree.h"
#include "util.h"
#include "xfer.h"

extern char **environ;

static int fail(const struct cap_err *err)
{
	cap_cli_error("%s", err->msg);
	return CAP_EXIT_FAILURE;
}

/* --- shared -------------------------------------------------------------- */

/* Hold the sandbox's workspace lock (workspace.lock in its directory) so
 * that two diffs or merges of one sandbox never run at once; waits for
 * the other one. The descriptor (its close releases it), or -errno with
 * err set. */
static int lock_workspace(const char *name, struct cap_err *err)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *path = xasprintf("%s/workspace.lock", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		fprintf(stderr, "capsule: another diff or merge of sandbox '%s' is running; waiting for it\n", name);
		if (flock(fd, LOCK_EX) < 0) {
			int e = errno;
			close(fd);
			return cap_err_set(err, e, "cannot lock %s: %s", path, strerror(e));
		}
	}
	return fd;
}

/* The guest's /workspace manifest, starting the sandbox if needed. */
static int guest_manifest(const char *name, struct cap_sandbox **sb, struct cap_tree *out,
			  struct cap_err *err)
{
	int r;
	if (!*sb && (r = cap_cli_attach(name, sb, err)) < 0)
		return r;
	if ((r = cap_xfer_manifest(*sb, "/workspace", "", out, err)) < 0)
		cap_err_prefix(err, "reading sandbox '%s''s /workspace", name);
	return r;
}

/* A private temporary directory (0700) for files fetched from the guest.
 * New string, or NULL with err set. */
static char *private_tmp(struct cap_err *err)
{
	const char *t = getenv("TMPDIR");
	char *dir = xasprintf("%s/capsule-ws-XXXXXX", t && *t == '/' ? t : "/tmp");
	if (!mkdtemp(dir)) {
		cap_err_set(err, errno, "cannot create a temporary directory %s: %s", dir, strerror(errno));
		free(dir);
		return NULL;
	}
	return dir;
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

/* --- running host programs ------------------------------------------------ */

/* Run argv (looked up in PATH, never through a shell) with stdin from
 * /dev/null. Its stdout goes to ours when out is NULL, else into out (at
 * most max bytes kept); its stderr into errout (at most 64 KiB kept).
 * *status is its wait status. 0, or -errno with err set when it could not
 * be run. */
static int run_host(char *const argv[], struct cap_buf *out, size_t max, struct cap_buf *errout,
		    int *status, struct cap_err *err)
{
	int po[2] = { -1, -1 }, pe[2] = { -1, -1 };
	posix_spawn_file_actions_t fa;
	pid_t pid;
	int r;
	if ((out && pipe2(po, O_CLOEXEC) < 0) || pipe2(pe, O_CLOEXEC) < 0) {
		r = cap_err_set(err, errno, "pipe: %s", strerror(errno));
		goto close;
	}
	fflush(stdout);
	posix_spawn_file_actions_init(&fa);
	posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
	if (out)
		posix_spawn_file_actions_adddup2(&fa, po[1], 1);
	posix_spawn_file_actions_adddup2(&fa, pe[1], 2);
	r = posix_spawnp(&pid, argv[0], &fa, NULL, argv, environ);
	posix_spawn_file_actions_destroy(&fa);
	if (r != 0) {
		r = cap_err_set(err, r, "cannot run %s: %s", argv[0], strerror(r));
		goto close;
	}
	if (out) {
		close(po[1]);
		po[1] = -1;
	}
	close(pe[1]);
	pe[1] = -1;
	struct pollfd pfd[2] = { { .fd = pe[0], .events = POLLIN }, { .fd = out ? po[0] : -1, .events = POLLIN } };
	while (pfd[0].fd >= 0 || pfd[1].fd >= 0) {
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		for (int i = 0; i < 2; i++) {
			if (pfd[i].fd < 0 || !pfd[i].revents)
				continue;
			char buf[65536];
			ssize_t n = read(pfd[i].fd, buf, sizeof(buf));
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				pfd[i].fd = -1;
				continue;
			}
			struct cap_buf *b = i == 0 ? errout : out;
			size_t keep = i == 0 ? 65536 : max;
			if (b && cap_buf_used(b) < keep)
				cap_buf_append(b, buf, CAP_MIN((size_t)n, keep - cap_buf_used(b)));
		}
	}
	while (waitpid(pid, status, 0) < 0 && errno == EINTR)
		;
	r = 0;
close:
	for (int i = 0; i < 2; i++) {
		if (po[i] >= 0)
			close(po[i]);
		if (pe[i] >= 0)
			close(pe[i]);
	}
	return r;
}

/* A buffer's text as a C string (trailing newlines cut). New string. */
static char *buf_text(struct cap_buf *b)
{
	size_t n = cap_buf_used(b);
	const char *p = (const char *)cap_buf_head(b);
	while (n && (p[n - 1] == '\n' || p[n - 1] == '\r'))
		n--;
	return xstrndup(n ? p : "", n);
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

/* A path as a JSON string: as it is when it is UTF-8, else with every
 * byte over 0x7f, control byte and '%' as %XX (and *escaped set). */
static json_t *json_path(const char *p, bool *escaped)
{
	json_t *s = json_string(p);
	if (s)
		return s;
	struct cap_buf b;
	cap_buf_init(&b);
	for (const unsigned char *c = (const unsigned char *)p; *c; c++) {
		char e[4];
		int n = *c >= 0x80 || *c < 0x20 || *c == '%' || *c == 0x7f ? snprintf(e, sizeof(e), "%%%02X", *c)
									  : snprintf(e, sizeof(e), "%c", *c);
		cap_buf_append(&b, e, (size_t)n);
	}
	cap_buf_append(&b, "", 1);
	s = json_string((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	*escaped = true;
	return s;
}

static void hex(const uint8_t h[32], char out[65])
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", h[i]);
}

static json_t *json_mode(const struct cap_tree_entry *e)
{
	char m[8];
	if (!e)
		return json_null();
	snprintf(m, sizeof(m), "%04o", e->mode & 07777);
	return json_string(m);
}

static void print_json(const char *name, const struct cap_tree_change *ch, size_t n)
{
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++) {
		const struct cap_tree_entry *cur = ch[i].to ? ch[i].to : ch[i].from;
		bool escaped = false;
		json_t *o = json_object();
		json_object_set_new(o, "path", json_path(cur->path, &escaped));
		if (escaped)
			json_object_set_new(o, "path_escaped", json_true());
		json_object_set_new(o, "change", json_string(cap_tree_change_name(ch[i].kind)));
		json_object_set_new(o, "type", json_string(type_name(cur->type)));
		if (ch[i].kind == CAP_TREE_TYPE)
			json_object_set_new(o, "old_type", json_string(type_name(ch[i].from->type)));
		json_object_set_new(o, "mode", json_mode(ch[i].to));
		json_object_set_new(o, "old_mode", json_mode(ch[i].from));
		if (ch[i].to && (ch[i].to->type == CAP_TREE_FILE || ch[i].to->type == CAP_TREE_LINK)) {
			char h[65];
			hex(ch[i].to->hash, h);
			json_object_set_new(o, "size", json_integer((json_int_t)ch[i].to->size));
			json_object_set_new(o, "sha256", json_string(h));
		} else {
			json_object_set_new(o, "size", json_null());
			json_object_set_new(o, "sha256", json_null());
		}
		if (ch[i].to && ch[i].to->type == CAP_TREE_LINK)
			json_object_set_new(o, "target", json_path(ch[i].to->target, &escaped));
		json_array_append_new(arr, o);
	}
	json_t *j = json_pack("{s:s, s:o}", "sandbox", name, "changes", arr);
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	puts(text);
	free(text);
}

static void print_lines(const struct cap_tree_change *ch, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const struct cap_tree_entry *cur = ch[i].to ? ch[i].to : ch[i].from;
		_cleanup_free_ char *q = quote_path(cur->path);
		if (ch[i].kind == CAP_TREE_MODE)
			printf("m %s (%04o -> %04o)\n", q, ch[i].from->mode & 07777, ch[i].to->mode & 07777);
		else
			printf("%c %s\n", change_letter(ch[i].kind), q);
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

/* Copy what is left of fd into a new file name in dirfd (0600), and hash
 * the copy. 0 or -errno. */
static int copy_hash(int fd, int dirfd, const char *name, uint8_t hash[32], uint64_t *size)
{
	_cleanup_close_ int out = openat(dirfd, name, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (out < 0)
		return -errno;
	char buf[65536];
	for (;;) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			break;
		int r = cap_write_all(out, buf, (size_t)n);
		if (r < 0)
			return r;
	}
	if (lseek(out, 0, SEEK_SET) < 0)
		return -errno;
	return cap_tree_hash_fd(out, hash, size);
}

/* Whether the file at dirfd/name looks binary: a NUL byte in its first
 * 8 KiB (what git and diff look at). */
static bool looks_binary(int dirfd, const char *name)
{
	_cleanup_close_ int fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	char buf[8192];
	ssize_t n = fd >= 0 ? read(fd, buf, sizeof(buf)) : -1;
	return n > 0 && memchr(buf, 0, (size_t)n) != NULL;
}

struct patch_ctx {
	const char *name;
	const char *project;	/* the host project: where the base versions are read */
	int projfd;	/* -1 when it cannot be opened */
	const char *tmp;	/* private directory: fetched files "0".."n-1", base copies "b0"... */
	int tmpfd;
	size_t *fetched;	/* change i's fetched file index, or SIZE_MAX */
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

/* Run diff -u on two files (either may be /dev/null) with git's labels,
 * its output on our stdout. */
static int run_diff(const char *a, const char *b, const char *la, const char *lb, struct cap_err *err)
{
	char *argv[] = { "diff", "-u", "--label", (char *)la, "--label", (char *)lb, (char *)a, (char *)b, NULL };
	struct cap_buf e;
	int status = 0;
	cap_buf_init(&e);
	int r = run_host(argv, NULL, 0, &e, &status, err);
	if (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) <= 1)) {
		_cleanup_free_ char *msg = buf_text(&e);
		r = cap_err_set(err, EIO, "diff -u %s %s failed: %s", a, b, *msg ? msg : "no message");
	}
	cap_buf_fini(&e);
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
	char aname[32] = "", bname[32] = "";
	const char *why = NULL;
	if (file_a && base_version(c, from, i, aname, sizeof(aname), &why) != 0) {
		printf("%s\n", why);
		return 0;
	}
	if (file_b)
		cap_merge_stage_name(c->fetched[i], bname);
	if ((file_a && looks_binary(c->tmpfd, aname)) || (file_b && looks_binary(c->tmpfd, bname))) {
		printf("Binary files %s and %s differ\n", file_a ? la : "/dev/null", file_b ? lb : "/dev/null");
		return 0;
	}
	_cleanup_free_ char *pa = file_a ? xasprintf("%s/%s", c->tmp, aname) : xstrdup("/dev/null");
	_cleanup_free_ char *pb = file_b ? xasprintf("%s/%s", c->tmp, bname) : xstrdup("/dev/null");
	return run_diff(pa, pb, file_a ? la : "/dev/null", file_b ? lb : "/dev/null", err);
}

/* --patch: fetch the guest's versions of the changed files, then diff
 * each against its base version. */
static int print_patch(const char *name, const struct cap_record *rec, struct cap_sandbox *sb,
		       const struct cap_tree_change *ch, size_t n, struct cap_err *err)
{
	struct patch_ctx c = { .name = name, .project = rec->workspace, .projfd = -1, .tmpfd = -1 };
	_cleanup_free_ char *tmp = private_tmp(err);
	if (!tmp)
		return -err->code;
	c.tmp = tmp;
	c.fetched = xcalloc(n ? n : 1, sizeof(size_t));
	const char **paths = xcalloc(n ? n : 1, sizeof(char *));
	size_t nf = 0;
	int r = 0;
	for (size_t i = 0; i < n; i++) {
		c.fetched[i] = SIZE_MAX;
		if (ch[i].to && ch[i].to->type == CAP_TREE_FILE &&
		    !(ch[i].from && ch[i].from->type == CAP_TREE_FILE && memcmp(ch[i].from->hash, ch[i].to->hash, 32) == 0)) {
			c.fetched[i] = nf;
			paths[nf++] = ch[i].to->path;
		}
	}
	if ((c.tmpfd = open(tmp, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = cap_err_set(err, errno, "cannot open %s: %s", tmp, strerror(errno));
		goto out;
	}
	c.projfd = open(rec->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (nf && (r = cap_xfer_fetch(sb, "/workspace", paths, nf, c.tmpfd, err)) < 0) {
		if (r == -ESTALE)
			cap_err_prefix(err, "the sandbox changed /workspace while diff read it; run it again");
		goto out;
	}
	for (size_t i = 0; i < n; i++) {
		if (c.fetched[i] == SIZE_MAX)
			continue;
		struct cap_merge_op op = { .action = CAP_MERGE_WRITE, .path = ch[i].to->path, .theirs = ch[i].to,
					   .stage = c.fetched[i] };
		if ((r = cap_merge_stage_verify(c.tmpfd, &op, err)) < 0) {
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
	if (c.projfd >= 0)
		close(c.projfd);
	cap_remove_tree(tmp);
	free(c.fetched);
	free(paths);
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
	if (lock < 0 || cap_named_workspace_base(name, &base, &err) < 0 ||
	    guest_manifest(name, &sb, &now, &err) < 0)
		goto out;
	int r = cap_tree_diff(&base, &now, &ch, &n);
	if (r < 0) {
		cap_err_set(&err, -r, "comparing /workspace with its base: %s", strerror(-r));
		goto out;
	}
	if (json)
		print_json(name, ch, n);
	else if (patch && print_patch(name, &rec, sb, ch, n, &err) < 0)
		goto out;
	else if (!patch)
		print_lines(ch, n);
	print_summary(name, ch, n);
	rc = 0;
out:
	if (rc)
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

/* Stage theirs' new files under DIR, check them, put everything in place,
 * then move the base. */
static int apply_plan(const char *name, const char *dir, struct cap_sandbox *sb,
		      const struct cap_merge_plan *p, const struct cap_tree *theirs, struct cap_err *err)
{
	char stage_dir[CAP_NAME_MAX + 32];
	snprintf(stage_dir, sizeof(stage_dir), "%s%s", CAP_MERGE_STAGE_PREFIX, name);
	_cleanup_close_ int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", dir, strerror(errno));
	int sfd = cap_merge_stage_open(dfd, stage_dir, err);
	if (sfd < 0)
		return sfd;
	const char **paths = xcalloc(p->nwrites ? p->nwrites : 1, sizeof(char *));
	int r = 0;
	for (size_t i = 0; i < p->nops; i++)
		if (p->ops[i].action == CAP_MERGE_WRITE) {
			CAP_BUG_ON(p->ops[i].stage >= p->nwrites);
			paths[p->ops[i].stage] = p->ops[i].path;
		}
	if (p->nwrites && (r = cap_xfer_fetch(sb, "/workspace", paths, p->nwrites, sfd, err)) < 0) {
		if (r == -ESTALE)
			cap_err_prefix(err, "the sandbox changed /workspace during the merge; nothing was written; run it again");
		goto out;
	}
	for (size_t i = 0; i < p->nops; i++)
		if (p->ops[i].action == CAP_MERGE_WRITE && (r = cap_merge_stage_verify(sfd, &p->ops[i], err)) < 0) {
			cap_err_prefix(err, "the sandbox changed /workspace during the merge; nothing was written; run it again");
			goto out;
		}
	if ((r = cap_merge_apply(dfd, sfd, p, err)) < 0) {
		cap_err_prefix(err, "merging into %s (what was done before this path stays; run the merge again to finish)", dir);
		goto out;
	}
	close(sfd);
	sfd = -1;
	if ((r = cap_merge_stage_remove(dfd, stage_dir, err)) < 0)
		goto out;
	r = cap_named_workspace_set_base(name, theirs, err);
out:
	if (sfd >= 0) {
		/* Nothing staged is needed again: a new merge plans afresh. */
		close(sfd);
		struct cap_err ignore = { 0 };
		cap_merge_stage_remove(dfd, stage_dir, &ignore);
	}
	free(paths);
	return r;
}

static void print_merged(const char *dir, const struct cap_merge_plan *p)
{
	size_t count[5] = { 0 };
	for (size_t i = 0; i < p->nops; i++)
		count[p->ops[i].action]++;
	printf("merged: %zu written, %zu removed, %zu links, %zu directories made, %zu modes changed into %s\n",
	       count[CAP_MERGE_WRITE], count[CAP_MERGE_REMOVE], count[CAP_MERGE_LINK], count[CAP_MERGE_MKDIR],
	       count[CAP_MERGE_CHMOD], dir);
}

struct guest_cmd {
	struct cap_buf out, err;
	bool done;
	int status;
	int errnum;
	char msg[256];
};

static void gc_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)id;
	struct guest_cmd *g = ud;
	struct cap_buf *b = fd == 1 ? &g->out : &g->err;
	if (cap_buf_used(b) < 65536)
		cap_buf_append(b, p, CAP_MIN(n, 65536 - cap_buf_used(b)));
}

static void gc_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	(void)id;
	struct guest_cmd *g = ud;
	g->done = true;
	g->status = ex ? cap_exit_status(ex) : 127;
	g->errnum = ex ? 0 : errnum;
	snprintf(g->msg, sizeof(g->msg), "%s", msg ? msg : "");
	if (ex && ex->kind == CAP_EXIT_START_FAILED)
		g->errnum = ex->value;
}

/* Run argv in the guest as the tool user in cwd, its output kept (64 KiB
 * each). 0 with g filled, or -errno with err set. */
static int guest_run(struct cap_sandbox *sb, char **argv, const char *cwd, struct guest_cmd *g,
		     struct cap_err *err)
{
	static const struct cap_exec_events ev = { gc_output, gc_done };
	uint32_t argc = 0;
	while (argv[argc])
		argc++;
	struct cap_exec_req req = { .argv = argv, .argc = argc, .cwd = (char *)cwd, .timeout_ms = 600000 };
	uint32_t id;
	int r = cap_sandbox_exec(sb, &req, &ev, g, &id, err);
	if (r < 0)
		return r;
	while (!g->done)
		if ((r = cap_sandbox_wait(sb, -1, err)) < 0)
			return r;
	return 0;
}

/* Copy the guest's bundle (/work/rel) into tmp, remove it from the
 * guest, and fetch its HEAD into refs/heads/capsule/NAME of dir. */
static int fetch_bundle(const char *name, const char *dir, struct cap_sandbox *sb, const char *tmp,
			const char *rel, struct cap_err *err)
{
	_cleanup_free_ char *bundle = xasprintf("%s/capsule-merge.bundle", tmp);
	_cleanup_free_ char *guest_path = xasprintf("/work/%s", rel);
	struct cap_xfer_result res = { 0 };
	int r = cap_xfer_get(sb, "/work", rel, bundle, 0, &res, err);
	cap_xfer_result_fini(&res);
	char *rm_argv[] = { "rm", "-f", guest_path, NULL };
	struct guest_cmd rmc = { 0 };
	struct cap_err ignore = { 0 };
	cap_buf_init(&rmc.out);
	cap_buf_init(&rmc.err);
	guest_run(sb, rm_argv, "/work", &rmc, &ignore);
	cap_buf_fini(&rmc.out);
	cap_buf_fini(&rmc.err);
	if (r < 0) {
		cap_err_prefix(err, "--git: copying the bundle out of sandbox '%s'", name);
		return r;
	}

	_cleanup_free_ char *refspec = xasprintf("+HEAD:refs/heads/capsule/%s", name);
	_cleanup_free_ char *ref = xasprintf("refs/heads/capsule/%s", name);
	/* The bundle is the guest's: git checks every object it takes. */
	char *fetch[] = { "git", "-C", (char *)dir, "-c", "transfer.fsckObjects=true", "fetch", "--no-tags",
			  "--no-write-fetch-head", "--quiet", bundle, refspec, NULL };
	struct cap_buf out, eb;
	int status = 0;
	cap_buf_init(&eb);
	r = run_host(fetch, NULL, 0, &eb, &status, err);
	_cleanup_free_ char *ferr = buf_text(&eb);
	cap_buf_fini(&eb);
	if (r < 0)
		return r;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return cap_err_set(err, EIO, "--git: `git fetch` of the sandbox's bundle into %s failed: %s", dir,
				   *ferr ? ferr : "no message");
	char *show[] = { "git", "-C", (char *)dir, "log", "-1", "--format=%H %s", ref, "--", NULL };
	cap_buf_init(&out);
	cap_buf_init(&eb);
	r = run_host(show, &out, 4096, &eb, &status, err);
	_cleanup_free_ char *line = buf_text(&out);
	cap_buf_fini(&out);
	cap_buf_fini(&eb);
	/* The commit's subject is the guest's text: no control bytes out. */
	for (char *p = line; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f)
			*p = '?';
	if (r == 0)
		printf("fetched sandbox %s's HEAD into branch capsule/%s of %s: %s\n", name, name, dir, line);
	return r;
}

/* merge --git: bundle the guest repository's refs, copy the bundle out,
 * fetch its HEAD into refs/heads/capsule/NAME. */
static int merge_git(const char *name, const char *dir, struct cap_sandbox *sb, struct cap_err *err)
{
	struct cap_buf out, eb;
	int status = 0, r;
	cap_buf_init(&out);
	cap_buf_init(&eb);
	char *check[] = { "git", "-C", (char *)dir, "rev-parse", "--is-inside-work-tree", NULL };
	r = run_host(check, &out, 4096, &eb, &status, err);
	_cleanup_free_ char *answer = buf_text(&out);
	cap_buf_fini(&out);
	cap_buf_fini(&eb);
	if (r < 0)
		return r;
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || strcmp(answer, "true") != 0)
		return cap_err_set(err, EINVAL, "--git: %s is not a git work tree (`git -C %s rev-parse --is-inside-work-tree` says no)",
				   dir, dir);

	/* The bundle goes to /work, the guest's private disk: the file
	 * transfer reaches /work, /workspace and /source only, and it must
	 * not show in /workspace. */
	static const char bundle_rel[] = ".capsule-merge.bundle";
	char *bundle_argv[] = { "git", "bundle", "create", "/work/.capsule-merge.bundle", "--all", NULL };
	struct guest_cmd g = { 0 };
	cap_buf_init(&g.out);
	cap_buf_init(&g.err);
	r = guest_run(sb, bundle_argv, "/workspace", &g, err);
	_cleanup_free_ char *gerr = buf_text(&g.err);
	cap_buf_fini(&g.out);
	cap_buf_fini(&g.err);
	if (r < 0)
		return r;
	if (g.errnum == ENOENT || (g.status == 127 && !g.errnum))
		return cap_err_set(err, ENOENT, "--git: the image has no git (`git bundle create` could not run in sandbox '%s'); install git in its image, or merge the files without --git",
				   name);
	if (g.errnum)
		return cap_err_set(err, g.errnum, "--git: cannot run git in sandbox '%s': %s", name,
				   g.msg[0] ? g.msg : strerror(g.errnum));
	if (g.status != 0)
		return cap_err_set(err, EIO, "--git: `git bundle create --all` in sandbox '%s''s /workspace failed (exit %d): %s",
				   name, g.status, *gerr ? gerr : "no message");

	_cleanup_free_ char *tmp = private_tmp(err);
	if (!tmp)
		return -err->code;
	r = fetch_bundle(name, dir, sb, tmp, bundle_rel, err);
	cap_remove_tree(tmp);
	return r;
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
	if (git) {
		int r = cap_cli_attach(name, &sb, &err);
		if (r == 0)
			r = merge_git(name, dir, sb, &err);
		cap_sandbox_free(sb);
		return r < 0 ? fail(&err) : 0;
	}

	struct cap_tree base, ours, theirs;
	struct cap_merge_plan plan = { 0 };
	int rc = CAP_EXIT_FAILURE;
	bool planned = false;
	cap_tree_init(&base);
	cap_tree_init(&ours);
	cap_tree_init(&theirs);
	struct cap_tree_scan_opts so = { .strict = false, .skip_prefix = CAP_MERGE_STAGE_PREFIX };
	if (cap_named_workspace_base(name, &base, &err) < 0 || guest_manifest(name, &sb, &theirs, &err) < 0)
		goto out;
	if (cap_tree_scan(dir, &so, &ours, &err) < 0) {
		cap_err_prefix(&err, "reading %s", dir);
		goto out;
	}
	if (cap_merge_plan(&base, &ours, &theirs, pick, &plan, &err) < 0)
		goto out;
	planned = true;
	if (dry) {
		print_plan(&plan);
		if (plan.nconflicts) {
			print_conflicts(name, &plan, true);
			rc = 1;
		} else {
			fprintf(stderr, "dry run: %zu operation%s into %s, nothing written\n", plan.nops,
				plan.nops == 1 ? "" : "s", dir);
			rc = 0;
		}
		goto out;
	}
	if (plan.nconflicts) {
		print_conflicts(name, &plan, false);
		rc = 1;
		goto out;
	}
	if (!plan.nops) {
		/* Both sides agree already; the base still moves to theirs. */
		if (cap_named_workspace_set_base(name, &theirs, &err) < 0)
			goto out;
		printf("nothing to merge: %s has the sandbox's changes already\n", dir);
		rc = 0;
		goto out;
	}
	if (apply_plan(name, dir, sb, &plan, &theirs, &err) < 0)
		goto out;
	print_merged(dir, &plan);
	rc = 0;
out:
	if (rc == CAP_EXIT_FAILURE)
		cap_cli_error("%s", err.msg);
	if (planned)
		cap_merge_plan_fini(&plan);
	cap_tree_fini(&base);
	cap_tree_fini(&ours);
	cap_tree_fini(&theirs);
	cap_sandbox_free(sb);
	return rc;
}
