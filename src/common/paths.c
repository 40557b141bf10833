#include "paths.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "util.h"

char *cap_cache_dir(void)
{
	const char *c = getenv("CAPSULE_CACHE");
	if (c && *c)
		return xstrdup(c);
	c = getenv("XDG_CACHE_HOME");
	if (c && *c == '/')
		return xasprintf("%s/capsule", c);
	const char *home = getenv("HOME");
	return xasprintf("%s/.cache/capsule", home && *home ? home : "/root");
}

char *cap_home_dir(void)
{
	const char *c = getenv("CAPSULE_HOME");
	if (c && *c)
		return xstrdup(c);
	c = getenv("XDG_DATA_HOME");
	if (c && *c == '/')
		return xasprintf("%s/capsule", c);
	const char *home = getenv("HOME");
	return xasprintf("%s/.local/share/capsule", home && *home ? home : "/root");
}

int cap_write_file_atomic(const char *path, const void *data, size_t len,
			  unsigned mode)
{
	_cleanup_free_ char *tmp = xasprintf("%s.tmp.%d", path, (int)getpid());
	int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	/* The mode asked for, whatever the umask: a shim runs under 077,
	 * and an initramfs it builds must stay readable by the jail. */
	int r = fchmod(fd, mode) < 0 ? -errno : 0;
	if (r == 0)
		r = cap_write_all(fd, data, len);
	if (r == 0 && fsync(fd) < 0)
		r = -errno;
	close(fd);
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		return r;
	}
	_cleanup_free_ char *dir = xstrdup(path);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = '\0';
		int dfd = open(*dir ? dir : "/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (dfd >= 0) {
			fsync(dfd);
			close(dfd);
		}
	}
	return 0;
}

/* Remove what the directory d holds; closes d. */
static int clear(DIR *d)
{
	int r = 0;
	struct dirent *e;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		int k = cap_remove_at(dirfd(d), e->d_name);
		if (k < 0 && r == 0)
			r = k;
	}
	closedir(d);
	return r;
}

int cap_remove_at(int dfd, const char *name)
{
	struct stat st;
	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return -errno;
	}
	int r = clear(d);
	if (unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT && r == 0)
		r = -errno;
	return r;
}

int cap_remove_tree(const char *path)
{
	return cap_remove_at(AT_FDCWD, path);
}

int cap_clear_dir(const char *path)
{
	DIR *d = opendir(path);
	return d ? clear(d) : -errno;
}

/* A base for run directories must be a real directory (not a symlink),
 * owned by us or root, and not writable by others unless sticky. */
static bool usable_base(const char *base)
{
	struct stat st;
	if (lstat(base, &st) < 0 || !S_ISDIR(st.st_mode))
		return false;
	if (st.st_uid != getuid() && st.st_uid != 0)
		return false;
	if ((st.st_mode & S_IWOTH) && !(st.st_mode & S_ISVTX))
		return false;
	return true;
}

int cap_make_run_dir(char **out, struct cap_err *err)
{
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	const char *base = xdg && *xdg == '/' && strlen(xdg) < 48 && usable_base(xdg) ? xdg : "/tmp";
	if (!usable_base(base))
		return cap_err_set(err, EPERM, "%s is not a safe place for sockets (not a directory we or root own, or writable by others without the sticky bit)", base);
	char *dir = xasprintf("%s/capsule-XXXXXX", base);
	if (!mkdtemp(dir)) {
		int e = errno;
		free(dir);
		return cap_err_set(err, e, "cannot create a directory under %s: %s", base, strerror(e));
	}
	*out = dir;
	return 0;
}

void cap_remove_run_dir(const char *dir)
{
	DIR *d = opendir(dir);
	if (d) {
		struct dirent *e;
		while ((e = readdir(d))) {
			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			unlinkat(dirfd(d), e->d_name, 0);
		}
		closedir(d);
	}
	rmdir(dir);
}

char *cap_exe_dir(void)
{
	char buf[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
	if (n <= 0)
		return xstrdup(".");
	buf[n] = '\0';
	char *slash = strrchr(buf, '/');
	if (slash)
		*slash = '\0';
	return xstrdup(buf[0] ? buf : "/");
}

char *cap_make_tmpdir(const char *prefix, struct cap_err *err)
{
	const char *t = getenv("TMPDIR");
	char *dir = xasprintf("%s/%s-XXXXXX", t && *t == '/' ? t : "/tmp", prefix);
	if (!mkdtemp(dir)) {
		cap_err_set(err, errno, "cannot create a temporary directory %s: %s", dir, strerror(errno));
		free(dir);
		return NULL;
	}
	return dir;
}

/* --- transfer directories ------------------------------------------------------- */

bool cap_path_within(const char *dir, const char *path)
{
	size_t n = strlen(dir);
	if (strcmp(dir, "/") == 0)
		return path[0] == '/';
	return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int cap_resolve_dir(const char *what, const char *path, char **out, struct cap_err *err)
{
	struct stat st;
	char *real = realpath(path, NULL);
	int e = real ? 0 : errno;
	if (real && (stat(real, &st) < 0 || !S_ISDIR(st.st_mode)))
		e = ENOTDIR;
	if (e) {
		free(real);
		return cap_err_set(err, e, "%s %s: %s (give an existing directory)", what, path, strerror(e));
	}
	*out = real;
	return 0;
}

void cap_transfer_dirs_free(char **dirs)
{
	for (size_t i = 0; dirs && dirs[i]; i++)
		free(dirs[i]);
	free(dirs);
}

int cap_transfer_dirs_resolve(const char *const *dirs, size_t n, char ***out,
			      struct cap_err *err)
{
	char **v = xcalloc(n + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++) {
		int r = cap_resolve_dir("--transfer-dir", dirs[i], &v[i], err);
		if (r < 0) {
			cap_transfer_dirs_free(v);
			return r;
		}
	}
	*out = v;
	return 0;
}

/* "DIR1, DIR2" or "none" into buf, for messages. */
static void dirs_list(const char *const *dirs, size_t n, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", dirs[i]);
	if (!n)
		snprintf(buf, len, "none");
}

static bool within_any(const char *const *dirs, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (cap_path_within(dirs[i], path))
			return true;
	return false;
}

/* The transfer directories as a list for messages into list; false with
 * err set when path is not absolute. */
static bool absolute_or_say(const char *const *dirs, size_t n, const char *path, char *list,
			    size_t len, struct cap_err *err)
{
	dirs_list(dirs, n, list, len);
	if (path[0] == '/')
		return true;
	cap_err_set(err, EINVAL, "%s is not an absolute path; give a host path inside a transfer directory (%s)",
		    path, list);
	return false;
}

int cap_transfer_source(const char *const *dirs, size_t n, const char *path, char **out,
			struct cap_err *err)
{
	char list[2048];
	if (!absolute_or_say(dirs, n, path, list, sizeof(list), err))
		return -EINVAL;
	char *real = realpath(path, NULL);
	if (!real)
		return cap_err_set(err, errno, "cannot resolve %s: %s", path, strerror(errno));
	if (!within_any(dirs, n, real)) {
		int r = strcmp(real, path) != 0
			? cap_err_set(err, EACCES, "%s resolves to %s, outside the transfer directories (%s); the server copies only from beneath a --transfer-dir",
				      path, real, list)
			: cap_err_set(err, EACCES, "%s is outside the transfer directories (%s); the server copies only from beneath a --transfer-dir",
				      path, list);
		free(real);
		return r;
	}
	*out = real;
	return 0;
}

int cap_transfer_dest(const char *const *dirs, size_t n, const char *path, char **out,
		      struct cap_err *err)
{
	char list[2048];
	if (!absolute_or_say(dirs, n, path, list, sizeof(list), err))
		return -EINVAL;
	_cleanup_free_ char *copy = xstrdup(path);
	size_t len = strlen(copy);
	while (len > 1 && copy[len - 1] == '/')
		copy[--len] = '\0';
	char *slash = strrchr(copy, '/');
	const char *name = slash + 1;
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return cap_err_set(err, EINVAL, "%s does not end in a name for the copy", path);
	struct stat st;
	if (lstat(copy, &st) == 0)
		return cap_err_set(err, EEXIST, "%s exists already; download to a new path", path);
	if (errno != ENOENT)
		return cap_err_set(err, errno, "cannot check %s: %s", path, strerror(errno));
	*slash = '\0';
	char *parent = realpath(slash == copy ? "/" : copy, NULL);
	if (!parent)
		return cap_err_set(err, errno, "the directory of %s cannot be resolved: %s (it must exist)", path,
				   strerror(errno));
	if (!within_any(dirs, n, parent)) {
		int r = cap_err_set(err, EACCES, "%s is outside the transfer directories (%s): its directory resolves to %s; the server writes only beneath a --transfer-dir",
				    path, list, parent);
		free(parent);
		return r;
	}
	*out = strcmp(parent, "/") == 0 ? xasprintf("/%s", name) : xasprintf("%s/%s", parent, name);
	free(parent);
	return 0;
}
