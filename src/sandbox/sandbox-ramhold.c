/* The RAM holder of a template (docs/architecture.md, "Shared template
 * RAM"): one long-lived process per template keeps the template's RAM in
 * a sealed memfd (no write, no grow, no shrink, no more seals) and hands a
 * duplicate of it to every restore over a unix socket in the template's
 * directory. Jailed QEMUs map it privately: the guest's writes are
 * copy-on-write and the pages every VM only reads are held once.
 *
 * Files in the template's directory (root's, 0700): ram.sock (the
 * holder's socket, 0600), ram.lock (serialises starting and ending a
 * holder), ram-holder.log (its log).
 *
 * A client keeps its connection open while its VM runs: the holder
 * counts open connections, and ends once none has been open for
 * IDLE_S seconds, or as soon as its template is removed or replaced.
 * Running VMs keep their mappings either way. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sandbox-internal.h"
#include "sock.h"
#include "util.h"

#define IDLE_S 60
#define CHECK_MS 2000
#define RECV_TIMEOUT_S 10
#define MAGIC 0x6361707372616d31ull	/* "capsram1" */
#define SEALS (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL)
#define MAX_CLIENTS 3800

/* What the holder sends with the descriptor: the RAM file it copied. */
struct hello {
	uint64_t magic;
	uint64_t dev, ino, size;
};

/* "/proc/self/fd/N/name": a socket path of any directory that fits in
 * sun_path, however long the directory's own path is. */
static int sock_addr(int dirfd, const char *name, struct sockaddr_un *sa)
{
	*sa = (struct sockaddr_un){ .sun_family = AF_UNIX };
	int n = snprintf(sa->sun_path, sizeof(sa->sun_path), "/proc/self/fd/%d/%s", dirfd, name);
	return n > 0 && (size_t)n < sizeof(sa->sun_path) ? 0 : -ENAMETOOLONG;
}

static int try_connect(int dirfd)
{
	struct sockaddr_un sa;
	if (sock_addr(dirfd, "ram.sock", &sa) < 0)
		return -ENAMETOOLONG;
	return cap_unix_connect(sa.sun_path, 0, 0);
}

/* The template's RAM in a new sealed memfd; *id says which file it was. */
static int make_memfd(const char *tdir, struct hello *id, struct cap_err *err)
{
	_cleanup_free_ char *path = xasprintf("%s/ram", tdir);
	_cleanup_close_ int in = open(path, O_RDONLY | O_CLOEXEC);
	struct stat st;
	if (in < 0 || fstat(in, &st) < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", path, strerror(errno));
	int fd = (int)syscall(SYS_memfd_create, "capsule-template-ram", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return cap_err_set(err, errno, "memfd_create: %s", strerror(errno));
	int r = ftruncate(fd, st.st_size) < 0 ? -errno : cap_copy_sparse(in, fd, st.st_size);
	if (r < 0) {
		close(fd);
		return cap_err_set(err, -r, "cannot copy %s into a memfd: %s", path, strerror(-r));
	}
	struct stat ms;
	if (fcntl(fd, F_ADD_SEALS, SEALS) < 0 || fcntl(fd, F_GET_SEALS) != SEALS ||
	    fstat(fd, &ms) < 0 || ms.st_size != st.st_size) {
		int e = errno ? errno : EIO;
		close(fd);
		return cap_err_set(err, e, "cannot seal the memfd holding %s: %s", path, strerror(e));
	}
	*id = (struct hello){ MAGIC, (uint64_t)st.st_dev, (uint64_t)st.st_ino, (uint64_t)st.st_size };
	return fd;
}

static int send_fd(int sock, const struct hello *id, int fd)
{
	return cap_send_fd(sock, fd, id, sizeof(*id), MSG_DONTWAIT) == (ssize_t)sizeof(*id) ? 0 : -EIO;
}

/* Whether tdir still holds the RAM file the memfd was made from and
 * our socket (a template removed or rebuilt in place: end). */
static bool still_ours(int dirfd, const struct hello *id, const struct stat *sock)
{
	struct stat st;
	return fstatat(dirfd, "ram", &st, 0) == 0 && (uint64_t)st.st_dev == id->dev &&
	       (uint64_t)st.st_ino == id->ino && fstatat(dirfd, "ram.sock", &st, 0) == 0 &&
	       st.st_dev == sock->st_dev && st.st_ino == sock->st_ino;
}

static long idle_s(void)
{
	const char *v = getenv("CAPSULE_RAM_HOLDER_IDLE_S");
	long s = v && *v ? strtol(v, NULL, 10) : IDLE_S;
	return s > 0 && s <= 86400 ? s : IDLE_S;
}

int cap_ramhold_serve(const char *tdir, int lfd)
{
	struct hello id;
	struct cap_err err = { 0 };
	struct stat sock;
	_cleanup_close_ int dirfd = open(tdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0 || fstatat(dirfd, "ram.sock", &sock, 0) < 0) {
		cap_log(CAP_LOG_ERROR, "%s: %s", tdir, strerror(errno));
		return 1;
	}
	int mfd = make_memfd(tdir, &id, &err);
	if (mfd < 0) {
		cap_log(CAP_LOG_ERROR, "%s", err.msg);
		return 1;	/* clients read end of file: they copy */
	}
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	cap_log(CAP_LOG_INFO, "holding %s/ram (%llu MiB) sealed in a memfd", tdir,
		(unsigned long long)(id.size >> 20));
	cap_set_nonblock(lfd, 1);
	struct pollfd *p = xcalloc(MAX_CLIENTS + 1, sizeof(*p));
	unsigned n = 1;
	p[0] = (struct pollfd){ .fd = lfd, .events = POLLIN };
	int64_t idle_since = cap_now_ms(), last_check = cap_now_ms();
	long idle_ms = idle_s() * 1000;
	const char *why = "";
	for (;;) {
		int64_t now = cap_now_ms();
		if (now - last_check >= CHECK_MS) {
			last_check = now;
			if (!still_ours(dirfd, &id, &sock)) {
				why = "its template was removed or replaced";
				break;
			}
		}
		if (n == 1 && now - idle_since >= idle_ms) {
			why = "no VM has used it for a while";
			break;
		}
		int r = poll(p, n, CHECK_MS);
		if (r < 0 && errno != EINTR)
			break;
		/* A client's end: EOF, an error, or anything it sends. */
		for (unsigned i = 1; r > 0 && i < n;) {
			if (p[i].revents) {
				char junk[64];
				(void)!read(p[i].fd, junk, sizeof(junk));
				close(p[i].fd);
				p[i] = p[--n];
				if (n == 1)
					idle_since = cap_now_ms();
				continue;
			}
			i++;
		}
		if (r > 0 && (p[0].revents & POLLIN)) {
			int c;
			while (n <= MAX_CLIENTS && (c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
				if (send_fd(c, &id, mfd) < 0) {
					close(c);
					continue;
				}
				p[n++] = (struct pollfd){ .fd = c, .events = POLLIN };
			}
		}
	}
	/* End under the lock, so that no client connects to a socket that
	 * is about to go: one that finds none starts a new holder. */
	_cleanup_close_ int lock = openat(dirfd, "ram.lock", O_RDWR | O_CLOEXEC);
	if (lock >= 0)
		flock(lock, LOCK_EX);
	struct stat st;
	if (fstatat(dirfd, "ram.sock", &st, 0) == 0 && st.st_ino == sock.st_ino && st.st_dev == sock.st_dev)
		unlinkat(dirfd, "ram.sock", 0);
	int c;
	while ((c = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) >= 0) {
		send_fd(c, &id, mfd);
		close(c);
	}
	cap_log(CAP_LOG_INFO, "ends: %s", why);
	for (unsigned i = 1; i < n; i++)
		close(p[i].fd);
	free(p);
	close(mfd);
	return 0;
}

/* The capsule executable to run the holder as, or NULL: $CAPSULE_BIN,
 * capsule next to the running executable or one folder up (a build
 * tree's bench/ and tests/). New string. */
static char *holder_exe(void)
{
	const char *env = getenv("CAPSULE_BIN");
	if (env && *env)
		return access(env, X_OK) == 0 ? xstrdup(env) : NULL;
	_cleanup_free_ char *dir = cap_exe_dir();
	const char *try[] = { "%s/capsule", "%s/../capsule" };
	for (size_t i = 0; dir && i < CAP_ARRAY_SIZE(try); i++) {
		char *p = xasprintf(try[i], dir);
		struct stat st;
		if (stat(p, &st) == 0 && S_ISREG(st.st_mode) && access(p, X_OK) == 0)
			return p;
		free(p);
	}
	return NULL;
}

/* Start a holder serving listening socket lfd: double-forked, in a
 * session of its own, stdin and stdout on /dev/null, stderr on
 * ram-holder.log. It runs `capsule ram-holder TDIR` (a small process of
 * its own) or, without a capsule executable at hand, the same code in
 * the forked child. */
static int spawn_holder(const char *tdir, int dirfd, int lfd, struct cap_err *err)
{
	_cleanup_free_ char *exe = holder_exe();
	int logfd = openat(dirfd, "ram-holder.log", O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		if (logfd >= 0)
			close(logfd);
		return cap_err_set(err, e, "cannot start the RAM holder of %s (fork): %s", tdir, strerror(e));
	}
	if (pid == 0) {
		setsid();
		if (fork() != 0)
			_exit(0);
		int null = open("/dev/null", O_RDWR | O_CLOEXEC);
		if (null < 0 || dup2(null, 0) < 0 || dup2(null, 1) < 0 ||
		    dup2(logfd >= 0 ? logfd : null, 2) < 0 || dup2(lfd, 3) < 0)
			_exit(1);
		syscall(SYS_close_range, 4U, ~0U, 0U);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (int sig = 1; sig < NSIG; sig++)
			if (sig != SIGKILL && sig != SIGSTOP)
				signal(sig, SIG_DFL);
		if (exe) {
			char *argv[] = { "capsule", "ram-holder", (char *)tdir, NULL };
			execv(exe, argv);
		}
		cap_log_set(cap_log_stderr, "ram-holder");
		_exit(cap_ramhold_serve(tdir, 3));
	}
	if (logfd >= 0)
		close(logfd);
	int st;
	while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
		;
	return 0;
}

/* Connected to the holder of tdir, started now if there is none. */
static int connect_or_start(const char *tdir, int dirfd, struct cap_err *err)
{
	int fd = try_connect(dirfd);
	if (fd >= 0)
		return fd;
	_cleanup_close_ int lock = openat(dirfd, "ram.lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock < 0 || flock(lock, LOCK_EX) < 0)
		return cap_err_set(err, errno, "cannot lock %s/ram.lock: %s", tdir, strerror(errno));
	if ((fd = try_connect(dirfd)) >= 0)
		return fd;
	/* None: ours listens before the lock goes, so that the next
	 * restore connects to it (and waits for its memfd). */
	struct sockaddr_un sa;
	if (sock_addr(dirfd, "ram.sock", &sa) < 0)
		return cap_err_set(err, ENAMETOOLONG, "socket path of %s is too long", tdir);
	unlinkat(dirfd, "ram.sock", 0);
	_cleanup_close_ int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	mode_t old = umask(077);
	int r = lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 64) < 0 ? -errno : 0;
	umask(old);
	if (r < 0)
		return cap_err_set(err, -r, "cannot listen on %s/ram.sock: %s", tdir, strerror(-r));
	if ((r = spawn_holder(tdir, dirfd, lfd, err)) < 0) {
		unlinkat(dirfd, "ram.sock", 0);
		return r;
	}
	if ((fd = try_connect(dirfd)) < 0)
		return cap_err_set(err, -fd, "cannot connect to the RAM holder at %s/ram.sock: %s", tdir, strerror(-fd));
	return fd;
}

int cap_ramhold_get(const char *tdir, int *conn, struct cap_err *err)
{
	_cleanup_close_ int dirfd = open(tdir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	if (dirfd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", tdir, strerror(errno));
	_cleanup_close_ int c = connect_or_start(tdir, dirfd, err);
	if (c < 0)
		return c;
	struct timeval tv = { RECV_TIMEOUT_S, 0 };
	setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	struct hello id = { 0 };
	int fd = -1;
	ssize_t n = cap_recv_fd(c, &id, sizeof(id), &fd);
	if (n != (ssize_t)sizeof(id) || fd < 0 || id.magic != MAGIC) {
		if (fd >= 0)
			close(fd);
		return cap_err_set(err, n < 0 ? (int)-n : EIO, "the RAM holder of %s gave no memfd (%s; see %s/ram-holder.log)",
				   tdir, n < 0 ? strerror((int)-n) : "it ended", tdir);
	}
	/* Never trust a descriptor to be read-only without looking: all
	 * four seals, the size and the file it was made from. */
	struct stat ram, ms;
	_cleanup_free_ char *path = xasprintf("%s/ram", tdir);
	const char *bad = NULL;
	if (fcntl(fd, F_GET_SEALS) != SEALS)
		bad = "it is not sealed against writes";
	else if (fstat(fd, &ms) < 0 || stat(path, &ram) < 0 || (uint64_t)ms.st_size != id.size ||
		 (uint64_t)ram.st_size != id.size || (uint64_t)ram.st_dev != id.dev || (uint64_t)ram.st_ino != id.ino)
		bad = "it holds another file than this template's RAM";
	if (bad) {
		close(fd);
		return cap_err_set(err, EPERM, "the RAM holder of %s gave a descriptor capsule will not use: %s", tdir, bad);
	}
	*conn = c;
	c = -1;
	return fd;
}

bool cap_ramhold_enabled(void)
{
	const char *v = getenv("CAPSULE_SHARED_RAM");
	return !(v && strcmp(v, "0") == 0);
}
