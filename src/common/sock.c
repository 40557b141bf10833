#include "sock.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
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
