/* capsule cp: files and trees into and out of a named sandbox, as tar
 * streams over its agent channel (xfer.h). */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "layout.h"
#include "named.h"
#include "util.h"
#include "xfer.h"

static const char usage[] =
	"Usage: capsule cp [-r] [-q] SRC DST\n"
	"\n"
	"Copy a file or, with -r, a directory tree between the host and a named\n"
	"sandbox, in either direction: exactly one of SRC and DST is NAME:/PATH,\n"
	"a path in the sandbox NAME below /work or /workspace (or /source, for\n"
	"reading); the other is a path on the host. Binary-safe, any size up to\n"
	"the disk, streamed over the sandbox's agent channel. The sandbox is\n"
	"started if it is stopped.\n"
	"\n"
	"Like cp -r: when DST is an existing directory the copy goes inside it\n"
	"under SRC's name, otherwise it is created as DST (whose parent must\n"
	"exist); an existing file is replaced. Permission bits are kept (never\n"
	"set-user/group-ID bits), what lands in the sandbox belongs to its tool\n"
	"user and what lands on the host to you. Symbolic links are copied as\n"
	"links, never followed: links that stay inside the copied tree are kept;\n"
	"copying in, an absolute link or one that climbs out of the tree refuses\n"
	"the whole copy (nothing is sent); copying out, such a link is left out\n"
	"and named, and the rest is copied. FIFOs, sockets and devices are never\n"
	"copied. Every path not copied is printed (\"capsule: not copied: PATH:\n"
	"why\") and the exit code is then 1.\n"
	"\n"
	"Copying into a sandbox, what was written is on the host's disk when cp\n"
	"returns (the guest flushes it); --no-sync gives that up for a faster\n"
	"return: what was not flushed yet is lost if QEMU or the host dies.\n"
	"\n"
	"A host path that contains a colon is written with a slash before it\n"
	"(./a:b), so as not to read as NAME:PATH.\n"
	"\n"
	"Options:\n"
	"  -r, --recursive  Copy a directory and everything below it\n"
	"  -q, --quiet      No summary line on stderr\n"
	"  --no-sync        Into a sandbox: return without flushing the copy\n"
	"  -h, --help       Show this help\n"
	"\n"
	"Examples:\n"
	"  capsule cp data.bin box:/work/              # into /work as data.bin\n"
	"  capsule cp -r ./src box:/work/proj          # /work/proj, a copy of ./src\n"
	"  capsule cp box:/work/out.tar.gz .           # out of the sandbox\n"
	"  capsule cp -r box:/workspace/build ./build  # a tree out\n"
	"\n"
	"Exit codes: 0 everything was copied, 1 something was not (each path\n"
	"named) or the copy failed, 2 a usage error, 125 the sandbox could not be\n"
	"reached.\n";

/* One side of the copy: a host path, or a path in a sandbox. */
struct side {
	bool guest;
	const char *host;	/* !guest: the argument */
	char name[64];	/* guest: the sandbox */
	const char *root;	/* guest: a FILE root (layout.h) */
	char *owned_rel;	/* guest: below root, "" for root itself */
	bool slash;	/* guest: written with a trailing '/' */
};

/* Whether arg reads as NAME:/PATH with a valid sandbox name. */
static bool is_guest(const char *arg, size_t *colon)
{
	const char *c = strchr(arg, ':');
	if (!c || c == arg || c[1] != '/' || (size_t)(c - arg) > 48)
		return false;
	for (const char *p = arg; p < c; p++)
		if (!((*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '-' || *p == '_'))
			return false;
	*colon = (size_t)(c - arg);
	return true;
}

/* Parse arg into s; prints and returns -1 on a bad guest path. */
static int parse_side(const char *arg, struct side *s)
{
	size_t colon;
	memset(s, 0, sizeof(*s));
	if (!is_guest(arg, &colon)) {
		s->host = arg;
		if (!*arg) {
			cap_cli_error("an empty path is not a file");
			return -1;
		}
		return 0;
	}
	s->guest = true;
	snprintf(s->name, sizeof(s->name), "%.*s", (int)colon, arg);
	const char *path = arg + colon + 1;
	size_t plen = strlen(path);
	s->slash = plen > 1 && path[plen - 1] == '/';
	/* Components: empty and "." ones dropped, ".." refused. */
	struct cap_buf rel;
	cap_buf_init(&rel);
	const char *first = NULL;
	size_t firstlen = 0;
	for (const char *p = path; *p;) {
		while (*p == '/')
			p++;
		const char *e = p;
		while (*e && *e != '/')
			e++;
		size_t n = (size_t)(e - p);
		if (n == 2 && memcmp(p, "..", 2) == 0) {
			cap_buf_fini(&rel);
			cap_cli_error("%s: a path in a sandbox may not contain '..'", arg);
			return -1;
		}
		if (n > 0 && !(n == 1 && *p == '.')) {
			if (!first) {
				first = p;
				firstlen = n;
			} else {
				if (cap_buf_used(&rel))
					cap_buf_append(&rel, "/", 1);
				cap_buf_append(&rel, p, n);
			}
		}
		p = e;
	}
	size_t nm;
	const struct cap_guest_mount *gm = cap_guest_mounts(&nm);
	for (size_t i = 0; first && i < nm; i++)
		if ((gm[i].attr & CAP_GUEST_FILE_ROOT) && strlen(gm[i].path + 1) == firstlen &&
		    memcmp(gm[i].path + 1, first, firstlen) == 0)
			s->root = gm[i].path;
	if (!s->root) {
		cap_buf_fini(&rel);
		cap_cli_error("%s: only paths below /work, /workspace or /source (for reading) can be copied", arg);
		return -1;
	}
	s->owned_rel = xstrndup((const char *)cap_buf_head(&rel), cap_buf_used(&rel));
	cap_buf_fini(&rel);
	return 0;
}

/* "NAME:/root/rel" for messages. New string. */
static char *guest_shown(const struct side *s)
{
	return *s->owned_rel ? xasprintf("%s:%s/%s", s->name, s->root, s->owned_rel)
			     : xasprintf("%s:%s", s->name, s->root);
}

/* Where a host source goes in the guest: dest_dir and dest_name for
 * cap_xfer_put, as cp would choose them. 0, or an exit code after
 * printing. */
static int put_target(struct cap_sandbox *sb, const char *src, bool src_dir, const struct side *d,
		      char **dest_dir, char **dest_name)
{
	struct cap_err err = { 0 };
	_cleanup_free_ char *shown = guest_shown(d);
	_cleanup_free_ char *sname = cap_path_last(src);
	char kind = 'd';
	if (strcmp(sname, "..") == 0 || strcmp(sname, "/") == 0) {
		char *real = realpath(src, NULL);
		free(sname);
		sname = real ? cap_path_last(real) : xstrdup("/");
		free(real);
		if (strcmp(sname, "/") == 0) {
			cap_cli_error("cp: copying the host's root directory is not supported; name a directory below it");
			return 1;
		}
	}
	if (*d->owned_rel && cap_xfer_kind(sb, d->root, d->owned_rel, &kind, &err) < 0) {
		cap_cli_error("cp: %s", err.msg);
		return 1;
	}
	if (kind == 'd') {
		/* Into it, under the source's name ("DIR/." : its contents). */
		*dest_dir = xstrdup(d->owned_rel);
		*dest_name = xstrdup(strcmp(sname, ".") == 0 ? "" : sname);
		return 0;
	}
	if (d->slash) {
		cap_cli_error("cp: %s is not a directory%s", shown, kind == '-' ? " (it does not exist)" : "");
		return 1;
	}
	if (kind == 'o') {
		cap_cli_error("cp: %s is a special file; it is not replaced", shown);
		return 1;
	}
	if (kind == 'f' && src_dir) {
		cap_cli_error("cp: cannot replace the file %s with the directory %s", shown, src);
		return 1;
	}
	/* Created (or, a file, replaced) as DST: its parent must be a
	 * directory. */
	_cleanup_free_ char *parent = xstrdup(d->owned_rel);
	char *slash = strrchr(parent, '/');
	const char *last = slash ? slash + 1 : d->owned_rel;
	if (slash)
		*slash = 0;
	else
		parent[0] = 0;
	char pkind = 'd';
	if (*parent && cap_xfer_kind(sb, d->root, parent, &pkind, &err) < 0) {
		cap_cli_error("cp: %s", err.msg);
		return 1;
	}
	if (pkind != 'd') {
		cap_cli_error("cp: %s:%s/%s, where %s would go, %s; create it first (capsule exec %s -- mkdir -p %s/%s)",
			      d->name, d->root, parent, shown, pkind == '-' ? "does not exist" : "is not a directory",
			      d->name, d->root, parent);
		return 1;
	}
	*dest_dir = xstrdup(parent);
	*dest_name = xstrdup(last);
	return 0;
}

static void plural(char *buf, size_t len, uint64_t n, const char *one, const char *many)
{
	snprintf(buf, len, "%llu %s", (unsigned long long)n, n == 1 ? one : many);
}

static void summary(const struct cap_xfer_result *res)
{
	char f[48], d[48], l[48];
	plural(f, sizeof(f), res->files, "file", "files");
	plural(d, sizeof(d), res->dirs, "directory", "directories");
	plural(l, sizeof(l), res->links, "link", "links");
	fprintf(stderr, "copied %s, %s, %s%s%llu bytes\n", f, d, res->links ? l : "", res->links ? ", " : "",
		(unsigned long long)res->bytes);
}

int cap_cli_cp(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "recursive", no_argument, NULL, 'r' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "no-sync", no_argument, NULL, CAP_OPT_NO_SYNC },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool recursive = false, quiet = false, no_sync = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "rRqh", opts, NULL)) != -1) {
		if (c == 'r' || c == 'R') {
			recursive = true;
		} else if (c == 'q') {
			quiet = true;
		} else if (c == CAP_OPT_NO_SYNC) {
			no_sync = true;
		} else {
			fputs(usage, c == 'h' ? stdout : stderr);
			return c == 'h' ? 0 : CAP_EXIT_USAGE;
		}
	}
	if (argc - optind != 2) {
		fputs(usage, stderr);
		return CAP_EXIT_USAGE;
	}
	struct side src, dst;
	if (parse_side(argv[optind], &src) < 0 || parse_side(argv[optind + 1], &dst) < 0) {
		free(src.owned_rel);
		return CAP_EXIT_USAGE;
	}
	int rc = 0;
	struct cap_err err = { 0 };
	struct cap_sandbox *sb = NULL;
	struct cap_xfer_result res = { 0 };
	char *dest_dir = NULL, *dest_name = NULL;
	unsigned flags = (recursive ? CAP_XFER_RECURSIVE : 0) | (no_sync ? CAP_XFER_NO_SYNC : 0);
	if (src.guest == dst.guest) {
		cap_cli_error(src.guest ? "cp: both paths are in sandboxes; one must be a host path"
					: "cp: neither path is in a sandbox (NAME:/work/...); use cp for host copies");
		rc = CAP_EXIT_USAGE;
		goto out;
	}
	const struct side *g = src.guest ? &src : &dst;
	struct stat st;
	if (dst.guest) {
		if (!(cap_guest_file_root(dst.root)->attr & CAP_GUEST_WRITABLE)) {
			cap_cli_error("cp: /source is read-only in the sandbox (the public data projection); copy into /work or /workspace");
			rc = 1;
			goto out;
		}
		/* Look at the host side before starting anything. */
		if (lstat(src.host, &st) < 0) {
			cap_cli_error("cp: cannot copy %s: %s", src.host, strerror(errno));
			rc = 1;
			goto out;
		}
		if (S_ISDIR(st.st_mode) && !recursive) {
			cap_cli_error("cp: %s is a directory; copy it with -r", src.host);
			rc = 1;
			goto out;
		}
	}
	if (cap_named_check_name(g->name, &err) < 0) {
		cap_cli_error("cp: %s", err.msg);
		rc = CAP_EXIT_USAGE;
		goto out;
	}
	if (cap_cli_attach(g->name, &sb, &err) < 0) {
		cap_cli_error("cp: %s", err.msg);
		rc = CAP_EXIT_FAILURE;
		goto out;
	}
	int r;
	if (dst.guest) {
		if ((rc = put_target(sb, src.host, S_ISDIR(st.st_mode), &dst, &dest_dir, &dest_name)) != 0)
			goto out;
		r = cap_xfer_put(sb, src.host, dst.root, dest_dir, dest_name, flags, &res, &err);
	} else {
		if (src.slash && !recursive) {
			/* NAME:/work/dir/ names a directory: it needs -r like one. */
			char kind;
			if (cap_xfer_kind(sb, src.root, src.owned_rel, &kind, &err) == 0 && kind != 'd') {
				_cleanup_free_ char *shown = guest_shown(&src);
				cap_cli_error("cp: %s is not a directory", shown);
				rc = 1;
				goto out;
			}
		}
		r = cap_xfer_get(sb, src.root, src.owned_rel, dst.host, flags, &res, &err);
	}
	for (size_t i = 0; i < res.nrefused; i++)
		cap_cli_error("not copied: %s", res.refused[i]);
	if (r == -EISDIR) {
		_cleanup_free_ char *shown = src.guest ? guest_shown(&src) : xstrdup(src.host);
		cap_cli_error("cp: %s is a directory; copy it with -r", shown);
	} else if (r < 0) {
		cap_cli_error("cp: %s", err.msg);
	}
	if (!quiet && (r == 0 || res.files || res.dirs || res.links))
		summary(&res);
	rc = r < 0 ? 1 : 0;
out:
	cap_xfer_result_fini(&res);
	cap_sandbox_free(sb);
	free(dest_dir);
	free(dest_name);
	free(src.owned_rel);
	free(dst.owned_rel);
	return rc;
}
