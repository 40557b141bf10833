/* TAR_OUT and TAR_IN (docs/protocol.md), run by agent_xfer_run in the
 * streaming child: a tar stream of a tree or of named paths out on fd 1,
 * a tar stream from fd 0 written beneath the root (never through a link,
 * each file named only once it is whole). */
#include <errno.h>
#include <fcntl.h>
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

/* --- TAR_OUT --------------------------------------------------------- */

struct tar_out {
	const char *prefix;	/* entry names: PREFIX/REL; "" for REL alone */
	bool recurse;
};

/* The data extents of the first size bytes of fd (SEEK_DATA, SEEK_HOLE),
 * into *v (new, free it), when it has holes: their count, 0 when it has
 * none or the file system cannot say, or when there are too many to send
 * as a map (then it is sent whole). */
static size_t data_extents(int fd, uint64_t size, struct cap_tar_extent **v)
{
	struct cap_tar_extent *x = NULL;
	size_t n = 0, cap = 0;
	uint64_t sum = 0;
	off_t off = 0;
	*v = NULL;
	while ((uint64_t)off < size) {
		off_t data = lseek(fd, off, SEEK_DATA);
		if (data < 0 && errno == ENXIO)
			break;	/* a hole up to the end */
		off_t hole = data < 0 ? -1 : lseek(fd, data, SEEK_HOLE);
		if (data < 0 || hole < 0 || hole <= data || n == CAP_TAR_MAX_EXTENTS) {
			free(x);
			return 0;
		}
		if ((uint64_t)data >= size)
			break;
		uint64_t end = CAP_MIN((uint64_t)hole, size);
		if (n == cap)
			x = xrealloc(x, (cap = cap ? 2 * cap : 16) * sizeof(*x));
		x[n++] = (struct cap_tar_extent){ (uint64_t)data, end - (uint64_t)data };
		sum += end - (uint64_t)data;
		off = hole;
	}
	if (sum == size) {	/* no hole: a plain entry */
		free(x);
		return 0;
	}
	lseek(fd, 0, SEEK_SET);
	if (n == 0)
		x = xmalloc(sizeof(*x));	/* all a hole: a map without data */
	*v = x;
	return n;
}

/* Send len bytes of fd from off (the announced size is the size at open:
 * a file that shrinks is padded with zeros, one that grows is cut).
 * Whether it could all be read. */
static bool send_data(int fd, uint64_t off, uint64_t len, const char *rel, bool short_read)
{
	while (len > 0) {
		size_t want = (size_t)CAP_MIN(len, (uint64_t)CHUNK);
		uint8_t *p = cap_buf_reserve(&X.out, want);
		ssize_t k = short_read ? 0 : pread(fd, p, want, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			if (!short_read)
				refuse(rel, k < 0 ? "a read failed (%s); the rest of it is sent as zeros"
						  : "it shrank while being read; the rest of it is sent as zeros%s",
				       k < 0 ? strerror(errno) : "");
			short_read = true;
			memset(p, 0, want);
			k = (ssize_t)want;
		}
		cap_buf_commit(&X.out, (size_t)k);
		len -= (uint64_t)k;
		off += (uint64_t)k;
		if (cap_buf_used(&X.out) >= CHUNK)
			flush();
	}
	return !short_read;
}

/* Send one entry: name is its name in the stream, rel names it in
 * messages. Returns whether it is a directory to descend into. A file
 * with holes goes as a sparse entry (its holes are not sent), and with
 * X.prefix a file goes cut to its first CAP_TAR_PREFIX_BYTES. */
static bool send_entry(int dirfd, const char *name, const char *entry, const char *rel,
		       const struct stat *st)
{
	struct cap_tar_entry te = { .path = entry, .mode = st->st_mode & 07777,
				    .mtime = st->st_mtim.tv_sec, .uid = st->st_uid, .gid = st->st_gid };
	char *target = NULL;
	struct cap_tar_extent *ext = NULL;
	int fd = -1, r;
	if (strlen(entry) > CAP_TAR_PATH_MAX) {
		refuse(rel, "its name is over 4096 bytes; not copied");
		return false;
	}
	if (S_ISDIR(st->st_mode)) {
		te.type = CAP_TAR_DIR;
	} else if (S_ISLNK(st->st_mode)) {
		if (!(target = read_link(dirfd, name))) {
			refuse(rel, "cannot read the symbolic link: %s", strerror(errno));
			return false;
		}
		te.type = CAP_TAR_SYMLINK;
		te.linkname = target;
	} else if (S_ISREG(st->st_mode)) {
		if ((fd = open_file_at(dirfd, name, st)) < 0) {
			refuse(rel, "cannot read it: %s",
			       fd == -ESTALE ? "it changed while being looked at" : strerror(-fd));
			return false;
		}
		struct stat now;
		if (fstat(fd, &now) < 0) {
			refuse(rel, "cannot read it: %s", strerror(errno));
			close(fd);
			return false;
		}
		te.type = CAP_TAR_FILE;
		te.size = (uint64_t)now.st_size;
		if (X.prefix)
			te.size = CAP_MIN(te.size, (uint64_t)CAP_TAR_PREFIX_BYTES);
		/* Blocks fewer than the size says: there are holes. */
		if ((uint64_t)now.st_blocks * 512 < te.size) {
			te.nextents = data_extents(fd, te.size, &ext);
			te.extents = ext;
		}
	} else {
		refuse(rel, "not a regular file, directory or symbolic link; skipped");
		return false;
	}
	r = cap_tar_header(&X.out, &te);
	free(target);
	if (r < 0) {
		if (fd >= 0)
			close(fd);
		free(ext);
		refuse(rel, "cannot be put in a tar stream: %s", strerror(-r));
		return false;
	}
	if (fd >= 0) {
		bool ok = true;
		if (ext) {
			for (size_t i = 0; i < te.nextents; i++)
				ok = send_data(fd, ext[i].offset, ext[i].length, rel, !ok) && ok;
		} else {
			ok = send_data(fd, 0, te.size, rel, false);
		}
		(void)ok;
		close(fd);
		cap_tar_pad(&X.out, cap_tar_data_size(&te));
		free(ext);
		if (cap_buf_used(&X.out) >= CHUNK)
			flush();
	}
	return te.type == CAP_TAR_DIR;
}

static bool tar_out_visit(void *ud, int dirfd, const char *name, const char *rel,
			  const struct stat *st)
{
	struct tar_out *t = ud;
	char entry[CAP_TAR_PATH_MAX + 16];
	if ((size_t)snprintf(entry, sizeof(entry), "%s/%s", t->prefix, rel) >= sizeof(entry)) {
		refuse(rel, "its name is over 4096 bytes; not copied");
		return false;
	}
	return send_entry(dirfd, name, entry, rel, st) && t->recurse;
}

/* TAR_OUT of the top (rootfd's path): itself and, a directory, all below. */
void tar_out_tree(int rootfd, const char *path)
{
	char dir[MAX_PATH + 1];
	const char *base = *path ? split_last(path, dir, sizeof(dir)) : ".";
	int parent = *path ? openat2_fd(rootfd, *dir ? dir : ".", O_RDONLY | O_DIRECTORY,
					RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)
			   : openat2_fd(rootfd, ".", O_RDONLY | O_DIRECTORY, RESOLVE_BENEATH);
	if (parent < 0)
		give_up("", "cannot open it: %s", why_open(-parent));
	struct stat st;
	if (fstatat(parent, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
		give_up("", "%s", strerror(errno));
	if (!send_entry(parent, base, base, "", &st)) {
		close(parent);
		flush();
		if (X.status)
			_exit(2);	/* the path itself could not be sent: nothing was */
		return;
	}
	int top = openat(parent, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	close(parent);
	if (top < 0)
		give_up("", "cannot open the directory: %s", strerror(errno));
	struct tar_out t = { .prefix = base, .recurse = true };
	struct walker w = { tar_out_visit, walk_fail, &t };
	walk(top, &w);
	close(top);
}

/* TAR_OUT with CAP_TAR_PATHS_STDIN: one entry per NUL-terminated path on
 * fd 0, named by it, relative to topfd. */
void tar_out_paths(int topfd)
{
	static char buf[CHUNK];
	char path[MAX_PATH + 2], rel[MAX_PATH + 1], dir[MAX_PATH + 1];
	size_t have = 0;
	bool eof = false;
	for (;;) {
		char *nul = memchr(buf, '\0', have);
		if (!nul) {
			if (have > MAX_PATH)
				give_up("", "a path on stdin is over 4096 bytes");
			if (eof) {
				if (have)
					give_up("", "stdin ends in the middle of a path");
				return;
			}
			ssize_t k = read(0, buf + have, sizeof(buf) - have);
			if (k < 0 && errno == EINTR)
				continue;
			if (k < 0)
				give_up("", "cannot read the paths: %s", strerror(errno));
			eof = k == 0;
			have += (size_t)k;
			continue;
		}
		size_t n = (size_t)(nul - buf);
		memcpy(path, buf, CAP_MIN(n, (size_t)MAX_PATH) + 1);
		path[CAP_MIN(n, (size_t)MAX_PATH)] = '\0';
		memmove(buf, nul + 1, have - n - 1);
		have -= n + 1;
		int r = n > MAX_PATH ? -ENAMETOOLONG : norm_path(path, rel, sizeof(rel));
		if (r < 0 || !*rel) {
			refuse("", "the path '%.200s%s' is not one below it (%s)", path,
			       strlen(path) > 200 ? "..." : "",
			       r == -ENAMETOOLONG ? "too long or too deep" : r < 0 ? "absolute or with '..'" : "empty");
			continue;
		}
		const char *base = split_last(rel, dir, sizeof(dir));
		int parent = open_dir_below(topfd, dir);
		struct stat st;
		if (parent < 0) {
			refuse(rel, "cannot open its directory: %s", why_open(-parent));
			continue;
		}
		if (fstatat(parent, base, &st, AT_SYMLINK_NOFOLLOW) < 0)
			refuse(rel, "%s", strerror(errno));
		else
			send_entry(parent, base, rel, rel, &st);
		close(parent);
	}
}

/* --- TAR_IN ---------------------------------------------------------- */

/* A directory whose mode and time are set at the end (so that a 0555
 * directory can still be filled first). */
struct dir_fix {
	char *rel;
	uint32_t mode;
	int64_t mtime;
	uint32_t uid, gid;
};

struct tar_in {
	int topfd;
	bool no_replace;
	bool owners;	/* CAP_TAR_OWNERS: the entries' owners and set-id bits; hard links */
	struct cap_tar_reader rd;
	/* The last parent directory opened, kept for the next entry. */
	char last_dir[MAX_PATH + 1];
	int last_fd;
	struct dir_fix *fix;
	size_t nfix, capfix;
	unsigned seq;	/* temporary names */
};

static void conflict(const char *rel)
{
	cap_buf_append(&X.out, "conflict ", 9);
	escape(&X.out, rel);
	put("\n", 1);
	X.status = 1;
}

/* Skip the rest of the current entry's data. */
static void drain(struct tar_in *t)
{
	static uint8_t buf[CHUNK];
	struct cap_err err = { 0 };
	ssize_t k;
	while ((k = cap_tar_read(&t->rd, buf, sizeof(buf), &err)) > 0)
		;
	if (k < 0)
		give_up("", "%s", err.msg);
}

/* The directory dir (relative to the top) for an entry, made as needed
 * (0755) and never through a symbolic link: an fd owned by t, or -errno
 * with *why saying what is wrong. */
static int parent_dir(struct tar_in *t, const char *dir, const char **why)
{
	if (t->last_fd >= 0 && strcmp(dir, t->last_dir) == 0)
		return t->last_fd;
	if (t->last_fd >= 0)
		close(t->last_fd);
	t->last_fd = -1;
	int fd = open_dir_below(t->topfd, dir);
	if (fd == -ENOENT) {
		/* Make what is missing, one component at a time. */
		char part[MAX_PATH + 1];
		int cur = fcntl(t->topfd, F_DUPFD_CLOEXEC, 0);
		if (cur < 0) {
			int e = errno;
			*why = strerror(e);
			return -e;
		}
		snprintf(part, sizeof(part), "%s", dir);
		for (char *c = part; *c;) {
			size_t k = strcspn(c, "/");
			char save = c[k];
			c[k] = '\0';
			if (mkdirat(cur, c, 0755) < 0 && errno != EEXIST) {
				int e = errno;
				close(cur);
				*why = strerror(e);
				return -e;
			}
			int next = openat2_fd(cur, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW,
					      RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS);
			close(cur);
			if (next < 0) {
				*why = next == -ENOTDIR || next == -ELOOP
					       ? "a file or a symbolic link is where a directory of its path would be"
					       : strerror(-next);
				return next;
			}
			cur = next;
			c[k] = save;
			c += k;
			if (*c == '/')
				c++;
		}
		fd = cur;
	} else if (fd < 0) {
		*why = fd == -ENOTDIR || fd == -ELOOP
			       ? "a file or a symbolic link is where a directory of its path would be"
			       : why_open(-fd);
		return fd;
	}
	snprintf(t->last_dir, sizeof(t->last_dir), "%s", dir);
	t->last_fd = fd;
	return fd;
}

/* A fresh temporary name in a directory for an entry's new content. */
static void tmp_name(struct tar_in *t, char *out, size_t len)
{
	snprintf(out, len, ".capsule-tmp.%d.%u", (int)getpid(), ++t->seq);
}

/* Whether the open file fd holds exactly the entry's data (read from the
 * stream, all of it). */
static bool same_content(struct tar_in *t, int fd, uint64_t size)
{
	static uint8_t a[CHUNK], b[CHUNK];
	struct cap_err err = { 0 };
	bool same = true;
	uint64_t left = size;
	while (left > 0) {
		ssize_t k = cap_tar_read(&t->rd, a, sizeof(a), &err);
		if (k < 0)
			give_up("", "%s", err.msg);
		if (k == 0)
			break;
		left -= (uint64_t)k;
		if (same && cap_read_exact(fd, b, (size_t)k) < 0)
			same = false;
		if (same && memcmp(a, b, (size_t)k) != 0)
			same = false;
	}
	char extra;
	if (same && read(fd, &extra, 1) != 0)
		same = false;	/* longer than the entry */
	return same;
}

/* The entry's modification time on an open file, or on a link by name. */
static void set_time_fd(int fd, int64_t mtime)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { .tv_sec = mtime } };
	futimens(fd, ts);
}

static void set_time_at(int dirfd, const char *name, int64_t mtime)
{
	struct timespec ts[2] = { { .tv_nsec = UTIME_OMIT }, { .tv_sec = mtime } };
	utimensat(dirfd, name, ts, AT_SYMLINK_NOFOLLOW);
}

/* Give the unnamed file fd (O_TMPFILE) the name tmp in dirfd. */
static int link_tmpfile(struct tar_in *t, int fd, int dirfd, char *tmp, size_t len)
{
	char proc[64];
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	for (int tries = 0; tries < 100; tries++) {
		tmp_name(t, tmp, len);
		if (linkat(AT_FDCWD, proc, dirfd, tmp, AT_SYMLINK_FOLLOW) == 0)
			return 0;
		if (errno != EEXIST)
			break;
	}
	int e = errno;
	tmp[0] = '\0';	/* no name of ours to remove */
	return -e;
}

/* Write a regular file's data, then rename it over base: a reader sees
 * the old file or the new, never half of one. The data goes to an
 * unnamed file (O_TMPFILE), named only once it is whole, so a transfer
 * killed midway leaves nothing behind; a file system without O_TMPFILE
 * gets a temporary name from the start. */
static void put_file(struct tar_in *t, int dirfd, const char *base, const char *rel,
		     const struct cap_tar_entry *e)
{
	static uint8_t buf[CHUNK];
	char tmp[64] = "";
	struct cap_err err = { 0 };
	int fd = openat(dirfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
	bool unnamed = fd >= 0;
	for (int tries = 0; tries < 100 && fd < 0; tries++) {
		tmp_name(t, tmp, sizeof(tmp));
		fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST)
			break;
	}
	if (fd < 0) {
		refuse(rel, "cannot create it: %s", strerror(errno));
		drain(t);
		return;
	}
	int werr = 0;
	ssize_t k;
	while ((k = cap_tar_read(&t->rd, buf, sizeof(buf), &err)) > 0) {
		if (!werr)
			werr = -cap_write_all(fd, buf, (size_t)k);
	}
	if (k < 0) {
		close(fd);
		if (!unnamed)
			unlinkat(dirfd, tmp, 0);
		give_up("", "%s", err.msg);
	}
	/* The owner first: a chown clears the set-id bits. */
	if (!werr && t->owners && fchown(fd, e->uid, e->gid) < 0)
		werr = errno;
	if (!werr && fchmod(fd, e->mode & (t->owners ? 07777 : 01777)) < 0)
		werr = errno;
	if (!werr)
		set_time_fd(fd, e->mtime);
	if (!werr && unnamed)
		werr = -link_tmpfile(t, fd, dirfd, tmp, sizeof(tmp));
	if (close(fd) < 0 && !werr)
		werr = errno;
	if (!werr && renameat(dirfd, tmp, dirfd, base) < 0)
		werr = errno;
	if (werr) {
		if (*tmp)
			unlinkat(dirfd, tmp, 0);
		refuse(rel, "cannot write it: %s", strerror(werr));
	}
}

static void put_symlink(struct tar_in *t, int dirfd, const char *base, const char *rel,
			const struct cap_tar_entry *e)
{
	char tmp[64];
	int r = -1;
	for (int tries = 0; tries < 100 && r < 0; tries++) {
		tmp_name(t, tmp, sizeof(tmp));
		r = symlinkat(e->linkname, dirfd, tmp);
		if (r < 0 && errno != EEXIST)
			break;
	}
	if (r < 0) {
		refuse(rel, "cannot create the symbolic link: %s", strerror(errno));
		return;
	}
	set_time_at(dirfd, tmp, e->mtime);
	if (t->owners)
		fchownat(dirfd, tmp, e->uid, e->gid, AT_SYMLINK_NOFOLLOW);
	if (renameat(dirfd, tmp, dirfd, base) < 0) {
		int en = errno;
		unlinkat(dirfd, tmp, 0);
		refuse(rel, "cannot create the symbolic link: %s", strerror(en));
	}
}

static void add_fix(struct tar_in *t, const char *rel, uint32_t mode, int64_t mtime, uint32_t uid,
		    uint32_t gid)
{
	if (t->nfix == t->capfix)
		t->fix = xrealloc(t->fix, (t->capfix = t->capfix ? 2 * t->capfix : 64) * sizeof(*t->fix));
	t->fix[t->nfix++] = (struct dir_fix){ xstrdup(rel), mode, mtime, uid, gid };
}

/* A hard link ('1', CAP_TAR_OWNERS only) to an entry of the stream
 * already written: linked under a temporary name, then renamed over
 * base. Neither end is reached through a symbolic link. */
static void put_hardlink(struct tar_in *t, int dirfd, const char *base, const char *rel,
			 const struct cap_tar_entry *e)
{
	char trel[MAX_PATH + 1], tdir[MAX_PATH + 1], tmp[64];
	if (norm_path(e->linkname, trel, sizeof(trel)) < 0 || !*trel) {
		refuse(rel, "a hard link to '%.200s', which is not a path below the target; skipped", e->linkname);
		return;
	}
	const char *tbase = split_last(trel, tdir, sizeof(tdir));
	int tfd = *tdir ? open_dir_below(t->topfd, tdir) : fcntl(t->topfd, F_DUPFD_CLOEXEC, 0);
	if (tfd < 0) {
		refuse(rel, "a hard link to %.200s, whose directory cannot be opened: %s", trel, why_open(-tfd));
		return;
	}
	int r = -1;
	for (int tries = 0; tries < 100 && r < 0; tries++) {
		tmp_name(t, tmp, sizeof(tmp));
		r = linkat(tfd, tbase, dirfd, tmp, 0);
		if (r < 0 && errno != EEXIST)
			break;
	}
	int en = errno;
	close(tfd);
	if (r < 0) {
		refuse(rel, "cannot make the hard link to %.200s: %s", trel, strerror(en));
		return;
	}
	if (renameat(dirfd, tmp, dirfd, base) < 0) {
		en = errno;
		unlinkat(dirfd, tmp, 0);
		refuse(rel, "cannot make the hard link to %.200s: %s", trel, strerror(en));
	}
}

static const char *kind_of(char typeflag)
{
	switch (typeflag) {
	case '1':
		return "a hard link";
	case '3':
		return "a character device";
	case '4':
		return "a block device";
	case '6':
		return "a FIFO";
	case 'S':
		return "a sparse file";
	default:
		return "an entry of an unsupported type";
	}
}

static void tar_in_entry(struct tar_in *t, const struct cap_tar_entry *e)
{
	char rel[MAX_PATH + 1], dir[MAX_PATH + 1];
	int r = norm_path(e->path, rel, sizeof(rel));
	if (r < 0) {
		refuse("", "the entry '%.200s%s' is not a path below it (%s); skipped", e->path,
		       strlen(e->path) > 200 ? "..." : "",
		       r == -ENAMETOOLONG ? "too long or too deep" : "absolute or with '..'");
		drain(t);
		return;
	}
	if (e->type == CAP_TAR_OTHER && !(t->owners && e->typeflag == '1')) {
		refuse(rel, "%s (tar type '%c'); only files, directories and symbolic links are copied",
		       kind_of(e->typeflag), e->typeflag >= 0x21 && e->typeflag < 0x7f ? e->typeflag : '?');
		drain(t);
		return;
	}
	if (!*rel) {
		/* "." : the target directory itself, which is kept as it is. */
		if (e->type != CAP_TAR_DIR)
			refuse(".", "an entry named '.' that is not a directory; skipped");
		drain(t);
		return;
	}
	const char *base = split_last(rel, dir, sizeof(dir));
	const char *why = NULL;
	int dirfd = parent_dir(t, dir, &why);
	if (dirfd < 0) {
		refuse(rel, "%s; skipped", why);
		drain(t);
		return;
	}
	struct stat st;
	bool exists = fstatat(dirfd, base, &st, AT_SYMLINK_NOFOLLOW) == 0;
	if (!exists && errno != ENOENT) {
		refuse(rel, "%s", strerror(errno));
		drain(t);
		return;
	}
	switch (e->type) {
	case CAP_TAR_DIR:
		if (exists && !S_ISDIR(st.st_mode)) {
			if (t->no_replace)
				conflict(rel);
			else
				refuse(rel, "a file or a symbolic link is where the directory would be; skipped");
			return;
		}
		if (!exists && mkdirat(dirfd, base, 0700) < 0) {
			refuse(rel, "cannot make the directory: %s", strerror(errno));
			return;
		}
		/* An existing directory keeps its mode with NO_REPLACE. */
		if (!exists || !t->no_replace)
			add_fix(t, rel, e->mode & (t->owners ? 07777 : 01777), e->mtime, e->uid, e->gid);
		return;
	case CAP_TAR_FILE:
		if (exists && S_ISDIR(st.st_mode)) {
			if (t->no_replace)
				conflict(rel);
			else
				refuse(rel, "a directory is where the file would be; it is not replaced");
			drain(t);
			return;
		}
		if (exists && t->no_replace) {
			bool same = false;
			if (S_ISREG(st.st_mode) && (uint64_t)st.st_size == e->size) {
				int fd = open_file_at(dirfd, base, &st);
				if (fd >= 0) {
					same = same_content(t, fd, e->size);
					close(fd);
				}
			}
			if (!same)
				conflict(rel);
			drain(t);
			return;
		}
		put_file(t, dirfd, base, rel, e);
		return;
	case CAP_TAR_SYMLINK:
		if (exists && S_ISDIR(st.st_mode)) {
			if (t->no_replace)
				conflict(rel);
			else
				refuse(rel, "a directory is where the symbolic link would be; it is not replaced");
			return;
		}
		if (exists && t->no_replace) {
			char *target = S_ISLNK(st.st_mode) ? read_link(dirfd, base) : NULL;
			if (!target || strcmp(target, e->linkname) != 0)
				conflict(rel);
			free(target);
			return;
		}
		put_symlink(t, dirfd, base, rel, e);
		return;
	case CAP_TAR_OTHER:	/* a hard link, with CAP_TAR_OWNERS */
		if (exists && S_ISDIR(st.st_mode)) {
			refuse(rel, "a directory is where the hard link would be; it is not replaced");
			return;
		}
		put_hardlink(t, dirfd, base, rel, e);
		drain(t);
		return;
	default:
		CAP_BUG_ON(1);
	}
}

static struct tar_in *tar_in_now;

/* Directories' modes and times last, deepest first (a child's creation
 * would change its parent's time), also when the stream broke. */
static void fix_dirs(void)
{
	struct tar_in *t = tar_in_now;
	for (size_t i = t->nfix; i-- > 0;) {
		struct dir_fix *f = &t->fix[i];
		int fd = open_dir_below(t->topfd, f->rel);
		if (fd >= 0 && t->owners && fchown(fd, f->uid, f->gid) < 0)
			refuse(f->rel, "cannot give the directory its owner: %s", strerror(errno));
		if (fd < 0 || fchmod(fd, f->mode) < 0)
			refuse(f->rel, "cannot set the directory's mode: %s",
			       fd < 0 ? why_open(-fd) : strerror(errno));
		else
			set_time_fd(fd, f->mtime);
		if (fd >= 0)
			close(fd);
		free(f->rel);
	}
	t->nfix = 0;
}

void tar_in(int topfd, bool no_replace, bool owners)
{
	struct tar_in t = { .topfd = topfd, .no_replace = no_replace, .owners = owners, .last_fd = -1 };
	struct cap_tar_entry e;
	struct cap_err err = { 0 };
	int r;
	cap_tar_reader_init(&t.rd, 0);
	tar_in_now = &t;
	at_give_up = fix_dirs;
	while ((r = cap_tar_next(&t.rd, &e, &err)) == 1)
		tar_in_entry(&t, &e);
	if (t.last_fd >= 0)
		close(t.last_fd);
	t.last_fd = -1;
	if (r < 0)
		give_up("", "%s", err.msg);
	at_give_up = NULL;
	fix_dirs();
	free(t.fix);
	flush();
}

