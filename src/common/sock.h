/* Unix stream sockets for the control plane. */
#ifndef CAP_SOCK_H
#define CAP_SOCK_H

#include <sys/types.h>

#include "err.h"

/* Listen on path (a stale socket file there is replaced) with mode 0600,
 * non-blocking and close-on-exec. Returns the descriptor or -errno with
 * err naming the path. */
int cap_unix_listen(const char *path, struct cap_err *err);

/* A stream socket connected to the one listening at path, close-on-exec;
 * flags may add SOCK_NONBLOCK (then a full backlog is -EAGAIN). With
 * timeout_ms > 0 its sends and receives, and the connect itself, give
 * up after that long. Returns the descriptor or -errno (-ENAMETOOLONG
 * when path does not fit in sun_path); the caller words the error, it
 * knows what listens there. */
int cap_unix_connect(const char *path, int flags, int timeout_ms);

/* A listening socket handed over by a service manager (systemd's socket
 * activation, sd_listen_fds semantics without libsystemd): when
 * LISTEN_PID is this process and LISTEN_FDS is 1, descriptor 3 must be a
 * listening AF_UNIX stream socket bound to a path. LISTEN_PID,
 * LISTEN_FDS and LISTEN_FDNAMES are unset whenever LISTEN_PID is set
 * (children never see them). Returns descriptor 3 (made non-blocking
 * and close-on-exec) with *path its bound name (a new string), -ENOENT
 * when nothing was passed to this process, other -errno with err saying
 * what is wrong with what was passed. */
int cap_unix_activated(char **path, struct cap_err *err);

/* sendmsg of the len bytes at p with descriptor fd attached
 * (SCM_RIGHTS), retried on EINTR; flags as sendmsg's (MSG_NOSIGNAL is
 * added). The bytes sent (the descriptor went with the first), or
 * -errno. */
ssize_t cap_send_fd(int sock, int fd, const void *p, size_t len, int flags);

/* recvmsg of up to len bytes into p (MSG_WAITALL) and at most one
 * descriptor (*fd, close-on-exec; -1 when none came), retried on EINTR.
 * The bytes received, or -errno (-EPROTO when more than one descriptor
 * came; the kernel closes what it cannot deliver). */
ssize_t cap_recv_fd(int sock, void *p, size_t len, int *fd);

#endif
