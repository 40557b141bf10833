/* Unix stream sockets for the control plane. */
#ifndef CAP_SOCK_H
#define CAP_SOCK_H

#include "err.h"

/* Listen on path (a stale socket file there is replaced) with mode 0600,
 * non-blocking and close-on-exec. Returns the descriptor or -errno with
 * err naming the path. */
int cap_unix_listen(const char *path, struct cap_err *err);

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

#endif
