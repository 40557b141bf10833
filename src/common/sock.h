/* Unix stream sockets for the control plane. */
#ifndef CAP_SOCK_H
#define CAP_SOCK_H

#include "err.h"

/* Listen on path (a stale socket file there is replaced) with mode 0600,
 * non-blocking and close-on-exec. Returns the descriptor or -errno with
 * err naming the path. */
int cap_unix_listen(const char *path, struct cap_err *err);

#endif
