#include "util.h"

#include <errno.h>
#include <dirent.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/sendfile.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>

void cap_bug(const char *file, int line, const char *what)
{
	fprintf(stderr, "capsule: internal error at %s:%d: %s\n", file, line,
		what);
	abort();
}

static void *oom(size_t n)
{
	fprintf(stderr, "capsule: out of memory allocating %zu bytes\n", n);
	abort();
}

void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	return p ? p : oom(n);
}

void *xcalloc(size_t n, size_t size)
{
	void *p = calloc(n ? n : 1, size ? size : 1);
	return p ? p : oom(n * size);
}

void *xrealloc(void *p, size_t n)
{
	void *q = realloc(p, n ? n : 1);
	return q ? q : oom(n);
}

char *xstrdup(const char *s)
{
	char *p = strdup(s);
	return p ? p : oom(strlen(s) + 1);
}

char *xstrndup(const char *s, size_t n)
{
	char *p = strndup(s, n);
	return p ? p : oom(n + 1);
}

char *xasprintf(const char *fmt, ...)
{
	va_list ap;
	char *s = NULL;

	va_start(ap, fmt);
	int r = vasprintf(&s, fmt, ap);
	va_end(ap);
	if (r < 0)
		oom(strlen(fmt));
	return s;
}

void cap_file_id(const char *path, char *buf, size_t len)
{
	char real[PATH_MAX];
	struct stat st = { 0 };
	if (!realpath(path, real))
		snprintf(real, sizeof(real), "%s", path);
	stat(real, &st);
	snprintf(buf, len, "%s:%lld:%lld.%09ld", real, (long long)st.st_size, (long long)st.st_mtim.tv_sec,
		 st.st_mtim.tv_nsec);
}

int cap_copy_sparse(int in, int out, off_t end)
{
	for (off_t off = 0; off < end;) {
		off_t data = lseek(in, off, SEEK_DATA);
		if (data < 0)
			return errno == ENXIO ? 0 : -errno;
		off_t hole = lseek(in, data, SEEK_HOLE);
		if (hole < 0 || lseek(out, data, SEEK_SET) < 0)
			return -errno;
		for (off = data; off < hole;) {
			ssize_t k = sendfile(out, in, &off, (size_t)(hole - off));
			if (k < 0 && errno == EINTR)
				continue;
			if (k <= 0)
				return k < 0 ? -errno : -EIO;
		}
	}
	return 0;
}

int cap_write_all(int fd, const void *buf, size_t len)
{
	const char *p = buf;
	bool sock = true;	/* until send says otherwise */

	while (len > 0) {
		/* A socket whose peer is gone (QEMU's QMP after QEMU died)
		 * answers EPIPE here, not a SIGPIPE that kills the caller. */
		ssize_t n = sock ? send(fd, p, len, MSG_NOSIGNAL) : write(fd, p, len);
		if (n < 0 && sock && errno == ENOTSOCK) {
			sock = false;
			continue;
		}
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

int cap_read_exact(int fd, void *buf, size_t len)
{
	char *p = buf;

	while (len > 0) {
		ssize_t n = read(fd, p, len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (n == 0)
			return -EPIPE;
		p += n;
		len -= (size_t)n;
	}
	return 0;
}

bool cap_env_name_ok(const char *s, size_t len)
{
	if (len == 0 || (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (size_t i = 0; i < len; i++) {
		char c = s[i];
		if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') ||
		      (c >= '0' && c <= '9') || c == '_'))
			return false;
	}
	return true;
}

ssize_t cap_read_file(const char *path, size_t max, char **out)
{
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;

	size_t cap = 4096, len = 0;
	char *buf = xmalloc(cap + 1);
	for (;;) {
		if (len > max) {
			free(buf);
			return -EFBIG;
		}
		if (len == cap) {
			/* One byte past max tells a file of exactly max bytes
			 * from a longer one. */
			cap = CAP_MIN(cap * 2, max + 1);
			buf = xrealloc(buf, cap + 1);
		}
		ssize_t n = read(fd, buf + len, cap - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			int e = errno;
			free(buf);
			return -e;
		}
		if (n == 0)
			break;
		len += (size_t)n;
	}
	if (len > max) {
		free(buf);
		return -EFBIG;
	}
	buf[len] = '\0';
	*out = buf;
	return (ssize_t)len;
}

int cap_set_nonblock(int fd, int on)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	fl = on ? (fl | O_NONBLOCK) : (fl & ~O_NONBLOCK);
	return fcntl(fd, F_SETFL, fl) < 0 ? -errno : 0;
}

int cap_set_cloexec(int fd)
{
	int fl = fcntl(fd, F_GETFD);
	if (fl < 0)
		return -errno;
	return fcntl(fd, F_SETFD, fl | FD_CLOEXEC) < 0 ? -errno : 0;
}

int cap_signalfd(const int *sigs, size_t n, void *set)
{
	sigset_t *s = set;
	sigemptyset(s);
	for (size_t i = 0; i < n; i++)
		sigaddset(s, sigs[i]);
	sigprocmask(SIG_BLOCK, s, NULL);
	signal(SIGPIPE, SIG_IGN);
	int fd = signalfd(-1, s, SFD_CLOEXEC | SFD_NONBLOCK);
	return fd < 0 ? -errno : fd;
}

int64_t cap_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

int64_t cap_now_ms(void) { return cap_now_ns() / 1000000; }

void cap_strv_free(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		free(v[i]);
	free(v);
}

static int cmp_cstr(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int cap_dir_names(int dfd, char ***names, size_t *n)
{
	int fd = fcntl(dfd, F_DUPFD_CLOEXEC, 0);
	DIR *d = fd >= 0 ? fdopendir(fd) : NULL;
	if (!d) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return -e;
	}
	rewinddir(d);	/* the duplicate shares dfd's position */
	size_t cap = 16, k = 0;
	char **v = xmalloc(cap * sizeof(char *));
	struct dirent *e;
	errno = 0;
	while ((e = readdir(d))) {
		if (strcmp(e->d_name, ".") != 0 && strcmp(e->d_name, "..") != 0) {
			if (k == cap)
				v = xrealloc(v, (cap *= 2) * sizeof(char *));
			v[k++] = xstrdup(e->d_name);
		}
		errno = 0;
	}
	int r = errno ? -errno : 0;
	closedir(d);
	if (r < 0) {
		cap_strv_free(v, k);
		return r;
	}
	qsort(v, k, sizeof(char *), cmp_cstr);
	*names = v;
	*n = k;
	return 0;
}

char *cap_path_last(const char *path)
{
	size_t n = strlen(path);
	while (n > 1 && path[n - 1] == '/')
		n--;
	size_t s = n;
	while (s > 0 && path[s - 1] != '/')
		s--;
	return xstrndup(path + s, n - s);
}

const char *cap_path_shown(const char *path, char *buf, size_t size)
{
	size_t n = strlen(path);
	if (n <= 300)
		return path;
	snprintf(buf, size, "%.100s[... %zu bytes ...]%s", path, n - 200, path + n - 100);
	return buf;
}

int cap_mkdir_p(const char *path, unsigned mode)
{
	_cleanup_free_ char *p = xstrdup(path);
	for (char *s = p + 1; *s; s++) {
		if (*s != '/')
			continue;
		*s = '\0';
		if (mkdir(p, mode) < 0 && errno != EEXIST)
			return -errno;
		*s = '/';
	}
	if (mkdir(p, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}
