/* The controller behind `capsule serve`: maps identities (agent, peer) to
 * named sandboxes, creates them lazily, runs each identity's calls one at a
 * time in arrival order, keeps the idle lifecycle and the capacity of
 * DESIGN §5, and recovers what a crashed predecessor left. Its front end
 * is JSON-RPC 2.0 over a unix socket (docs/serve.md). */
#ifndef CAP_CONTROLLER_H
#define CAP_CONTROLLER_H

#include <stdbool.h>

#include "err.h"
#include "lifecycle.h"

struct cap_controller_cfg {
	struct cap_lifecycle_cfg lc;
	const char *socket_path;	/* NULL: CAPSULE_HOME/serve.sock */
	const char *image;	/* image of new sandboxes, default "base" */
	const char *source;	/* public data for new sandboxes, or NULL */
	int stop_grace_ms;	/* default 10000 */
	/* A clock that moves only through the `_test.advance` method, so
	 * that tests drive real transitions without waiting. */
	bool manual_clock;
	/* Warm pool: this many started sandboxes kept ready for identities
	 * that have none yet; they count against capacity. 0: off. */
	unsigned warm_pool;
	/* Take back only this agent's sandboxes at start (NULL: all). */
	const char *recover_agent;
};

void cap_controller_cfg_init(struct cap_controller_cfg *c);

/* Serve until SIGTERM or SIGINT, then stop every VM and return 0. Fails
 * before serving (bad socket path, another server on it) with err set. */
int cap_controller_run(const struct cap_controller_cfg *cfg, struct cap_err *err);

/* Whether an identity part is acceptable: 1 to 64 of [A-Za-z0-9._@+=:-],
 * not starting with '.'. */
bool cap_controller_id_valid(const char *s);

#endif
