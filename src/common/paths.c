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
