/* Small helpers shared by host and guest: allocation that aborts on OOM,
 * cleanup attributes, full reads and writes. Depends on nothing here. */
#ifndef CAP_UTIL_H
#define CAP_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#define CAP_ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))
#define CAP_MIN(a, b) ((a) < (b) ? (a) : (b))
#define CAP_MAX(a, b) ((a) > (b) ? (a) : (b))

/* Abort with file and line when an invariant is broken. */
#define CAP_BUG_ON(cond)                                                       \
	do {                                                                   \
		if (__builtin_expect(!!(cond), 0))                             \
			cap_bug(__FILE__, __LINE__, #cond);                    \
	} while (0)

__attribute__((noreturn)) void cap_bug(const char *file, int line,
				       const char *what);

/* Allocation: these never return NULL; out of memory aborts here. */
#define CAP_NONNULL_RESULT __attribute__((returns_nonnull))
CAP_NONNULL_RESULT void *xmalloc(size_t n);
CAP_NONNULL_RESULT void *xcalloc(size_t n, size_t size);
CAP_NONNULL_RESULT void *xrealloc(void *p, size_t n);
CAP_NONNULL_RESULT char *xstrdup(const char *s);
CAP_NONNULL_RESULT char *xstrndup(const char *s, size_t n);
/* Returns a new string the caller frees. */
CAP_NONNULL_RESULT __attribute__((format(printf, 1, 2))) char *xasprintf(const char *fmt, ...);
/* Free n strings and the array holding them (NULL is fine). */
void cap_strv_free(char **v, size_t n);
/* The names in the directory open at dfd (not "." or ".."), sorted with
 * strcmp, so that what a walk meets first does not depend on readdir's
 * order: *names is n new strings in a new array (cap_strv_free). dfd
 * stays open (its read position, shared, is rewound and moved). -errno,
 * nothing allocated, on failure. */
int cap_dir_names(int dfd, char ***names, size_t *n);
/* A path as an error message shows it: whole when at most 300 bytes,
 * else its first and last 100 bytes around the number left out (written
 * in buf, which needs 240 bytes). */
const char *cap_path_shown(const char *path, char *buf, size_t size);
/* The last component of path without its trailing slashes ("" for a
 * path of slashes or ""). New string. */
char *cap_path_last(const char *path);

static inline void cap_freep(void *p) { free(*(void **)p); }
static inline void cap_closep(int *fd)
{
	if (*fd >= 0)
		close(*fd);
}
#define _cleanup_free_ __attribute__((cleanup(cap_freep)))
#define _cleanup_close_ __attribute__((cleanup(cap_closep)))

/* Write all of buf, retrying on EINTR and short writes. 0 or -errno;
 * a socket whose peer has gone gives -EPIPE, never a SIGPIPE. */
int cap_write_all(int fd, const void *buf, size_t len);
/* Copy the data parts of in's first end bytes into out at the same
 * offsets (sendfile: once, in the kernel); holes stay holes. out's size
 * is the caller's to set. 0 or -errno. */
int cap_copy_sparse(int in, int out, off_t end);

/* A file's identity for a cache key, "REALPATH:SIZE:MTIME" into buf
 * (path as given, size 0, when it cannot be resolved or stat'ed). */
void cap_file_id(const char *path, char *buf, size_t len);

/* mkdir -p with mode for the components it creates. 0 or -errno. */
int cap_mkdir_p(const char *path, unsigned mode);
/* Read exactly len bytes. 0, -errno, or -EPIPE on early end of file. */
int cap_read_exact(int fd, void *buf, size_t len);
/* Read a whole small file (at most max bytes) into a new NUL-terminated
 * buffer the caller frees. Returns length or -errno (-EFBIG over max). */
ssize_t cap_read_file(const char *path, size_t max, char **out);
/* Whether s[0..len) is a shell variable name: [A-Za-z_][A-Za-z0-9_]*,
 * at least one byte. */
bool cap_env_name_ok(const char *s, size_t len);

int cap_set_nonblock(int fd, int on);
int cap_set_cloexec(int fd);

/* Block the n signals in sigs (their set is written to *set), ignore
 * SIGPIPE, and return a non-blocking close-on-exec signalfd for them, so
 * that a poll loop handles signals like any other event. -errno on error. */
int cap_signalfd(const int *sigs, size_t n, void *set);

/* Monotonic clock in milliseconds / nanoseconds. */
int64_t cap_now_ms(void);
int64_t cap_now_ns(void);

/* Little-endian encoding helpers for the wire protocol. */
static inline void cap_put_u16(uint8_t *p, uint16_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
}
static inline void cap_put_u32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}
static inline uint16_t cap_get_u16(const uint8_t *p)
{
	return (uint16_t)(p[0] | (p[1] << 8));
}
static inline uint32_t cap_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | ((uint32_t)p[1] << 8) |
	       ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

#endif
