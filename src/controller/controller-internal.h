/* Inside the controller: the real backend and the workspace records. */
#ifndef CAP_CONTROLLER_INTERNAL_H
#define CAP_CONTROLLER_INTERNAL_H

#include "controller.h"
#include "err.h"
#include "log.h"
#include "named.h"

extern const struct cap_ctl_backend ctl_named_backend;

/* workspaces/<agent>/<peer>/record.json: identity → sandbox name. */
int ctl_ws_write(const char *home, const char *agent, const char *peer,
		 const char *sandbox, struct cap_err *err);
int ctl_ws_read(const char *home, const char *agent, const char *peer,
		char name[CAP_NAME_MAX + 1]);
void ctl_ws_remove(const char *home, const char *agent, const char *peer);
void ctl_ws_each(const char *home,
		 void (*fn)(void *ud, const char *agent, const char *peer, const char *sandbox),
		 void *ud);

#endif
