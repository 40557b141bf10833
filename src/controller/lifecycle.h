/* The idle lifecycle and capacity rules of DESIGN §5, as pure functions
 * of a state and a time, so that they are tested with an injected clock
 * and the controller only carries out what they decide. */
#ifndef CAP_LIFECYCLE_H
#define CAP_LIFECYCLE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum cap_vm_state {
	CAP_VM_NONE,	/* no sandbox yet for this identity */
	CAP_VM_STOPPED,
	CAP_VM_STARTING,
	CAP_VM_RUNNING,
	CAP_VM_PAUSED,
	CAP_VM_STOPPING,
};

const char *cap_vm_state_name(enum cap_vm_state s);

/* Resident VMs count against capacity: starting, running, paused, and
 * stopping (until it is gone). */
bool cap_vm_state_resident(enum cap_vm_state s);

struct cap_lifecycle_cfg {
	int64_t idle_pause_ms;	/* default 30 s */
	int64_t idle_stop_ms;	/* default 10 min */
	unsigned capacity;	/* resident VMs, default 4 */
};

void cap_lifecycle_cfg_init(struct cap_lifecycle_cfg *c);

/* What the lifecycle needs to know of one identity's VM. */
struct cap_lc {
	enum cap_vm_state state;
	unsigned active;	/* calls running */
	unsigned queued;	/* calls waiting */
	int64_t idle_since;	/* when the last call finished (clock ms) */
	/* Order of that event among equal idle_since values (a clock that
	 * stands still, as under --test-clock): larger is later. */
	uint64_t seq;
};

enum cap_lc_action { CAP_LC_NONE, CAP_LC_PAUSE, CAP_LC_STOP };

/* The transition due at now, if any: active or queued work prevents both;
 * a running VM idle for idle_pause_ms pauses; a running or paused VM idle
 * for idle_stop_ms stops. */
enum cap_lc_action cap_lc_due(const struct cap_lc *s,
			      const struct cap_lifecycle_cfg *c, int64_t now);

/* When the next transition of s falls due (clock ms), or INT64_MAX. */
int64_t cap_lc_next(const struct cap_lc *s, const struct cap_lifecycle_cfg *c);

/* Make room for one more resident VM among v[0..n): returns -1 when
 * there is room; otherwise the index of the idle resident VM idle the
 * longest (ties: the one whose last call ended first) (to stop early), or -2 when every resident VM is busy (or
 * already stopping), which the caller reports as a retryable error. */
int cap_lc_make_room(const struct cap_lc *const *v, size_t n,
		     const struct cap_lifecycle_cfg *c);

#endif
