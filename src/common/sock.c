#include "sock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

int cap_unix_listen(const char *path, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "socket path %s is longer than %zu bytes",
				   path, sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, path);
	unlink(path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return cap_err_set(err, errno, "socket: %s", strerror(errno));
	/* Created 0600 from the start: no window in which others connect. */
	mode_t old = umask(077);
	int r = bind(fd, (struct sockaddr *)&sa, sizeof(sa));
	umask(old);
	if (r < 0 || chmod(path, 0600) < 0 || listen(fd, 64) < 0) {
		int e = errno;
		close(fd);
		return cap_err_set(err, e, "cannot listen on %s: %s", path, strerror(e));
	}
	return fd;
}

int cap_unix_connect(const char *path, int flags, int timeout_ms)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (flags & SOCK_NONBLOCK), 0);
	if (fd < 0)
		return -errno;
	if (timeout_ms > 0) {
		struct timeval tv = { timeout_ms / 1000, (timeout_ms % 1000) * 1000 };
		if (setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ||
		    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
			int e = errno;
			close(fd);
			return -e;
		}
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int cap_unix_activated(char **path, struct cap_err *err)
{
	const char *pid_s = getenv("LISTEN_PID"), *fds_s = getenv("LISTEN_FDS");
	if (!pid_s)
		return -ENOENT;
	char *end;
	long pid = strtol(pid_s, &end, 10);
	bool ours = *pid_s && !*end && pid == (long)getpid();
	long n = fds_s ? strtol(fds_s, &end, 10) : 0;
	bool n_ok = fds_s && *fds_s && !*end;
	unsetenv("LISTEN_PID");
	unsetenv("LISTEN_FDS");
	unsetenv("LISTEN_FDNAMES");
	if (!ours)
		return -ENOENT;	/* meant for another process */
	if (!n_ok || n < 1)
		return cap_err_set(err, EINVAL, "socket activation: LISTEN_FDS is '%s'; expected 1 (one listening unix socket)",
				   fds_s ? fds_s : "");
	if (n != 1)
		return cap_err_set(err, EINVAL, "socket activation: %ld sockets were passed; capsule serve takes exactly one (a ListenStream= unix socket)", n);
	const int fd = 3;
	int type = 0, listening = 0;
	socklen_t len = sizeof(type);
	if (getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len) < 0)
		return cap_err_set(err, errno, "socket activation: descriptor 3 is not a socket: %s", strerror(errno));
	len = sizeof(listening);
	if (type != SOCK_STREAM || getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) < 0 || !listening)
		return cap_err_set(err, EINVAL, "socket activation: descriptor 3 is not a listening stream socket (give the unit ListenStream=PATH)");
	struct sockaddr_un sa;
	len = sizeof(sa);
	memset(&sa, 0, sizeof(sa));
	if (getsockname(fd, (struct sockaddr *)&sa, &len) < 0)
		return cap_err_set(err, errno, "socket activation: getsockname on descriptor 3: %s", strerror(errno));
	if (sa.sun_family != AF_UNIX)
		return cap_err_set(err, EAFNOSUPPORT, "socket activation: descriptor 3 is not a unix socket; capsule serve listens on a unix socket only (ListenStream=/PATH)");
	size_t plen = len > offsetof(struct sockaddr_un, sun_path) ? len - offsetof(struct sockaddr_un, sun_path) : 0;
	if (plen == 0 || sa.sun_path[0] == '\0')
		return cap_err_set(err, EINVAL, "socket activation: the unix socket on descriptor 3 is unnamed or abstract; give it a path (ListenStream=/PATH)");
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0 || fcntl(fd, F_SETFD, FD_CLOEXEC) < 0)
		return cap_err_set(err, errno, "socket activation: cannot set up descriptor 3: %s", strerror(errno));
	*path = strndup(sa.sun_path, strnlen(sa.sun_path, plen < sizeof(sa.sun_path) ? plen : sizeof(sa.sun_path)));
	if (!*path)
		return cap_err_set(err, ENOMEM, "out of memory");
	return fd;
}

ssize_t cap_send_fd(int sock, int fd, const void *p, size_t len, int flags)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = { (void *)p, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	c->cmsg_level = SOL_SOCKET;
	c->cmsg_type = SCM_RIGHTS;
	c->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(c), &fd, sizeof(int));
	ssize_t n;
	while ((n = sendmsg(sock, &m, MSG_NOSIGNAL | flags)) < 0 && errno == EINTR)
		;
	return n < 0 ? -errno : n;
}

ssize_t cap_recv_fd(int sock, void *p, size_t len, int *fd)
{
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = { p, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	ssize_t n;
	*fd = -1;
	while ((n = recvmsg(sock, &m, MSG_CMSG_CLOEXEC | MSG_WAITALL)) < 0 && errno == EINTR)
		;
	if (n < 0)
		return -errno;
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
		memcpy(fd, CMSG_DATA(c), sizeof(int));
	else if (c && c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
		/* More than one: none is taken, none is left open. */
		size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int x;
			memcpy(&x, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			close(x);
		}
		return -EPROTO;
	}
	return n;
}
