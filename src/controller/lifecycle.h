/* The idle lifecycle, capacity and warm-pool rules of DESIGN §5, as pure
 * functions of a state and a time, so that they are tested with an
 * injected clock and the controller only carries out what they decide. */
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
#define CAP_VM_NSTATES (CAP_VM_STOPPING + 1)

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

/* What the warm pool's decision needs to know: how many spares are
 * wanted (cfg warm_pool; 0: off) and there, the capacity they share, the
 * controller's preparation, and when a failed start allows the next try
 * (real clock ms; 0: at once). */
struct cap_pool_in {
	unsigned size;	/* spares wanted */
	unsigned members;	/* warm-pool sandboxes there, in any state */
	unsigned stopped;	/* of them: stopped with no job, to start again */
	unsigned resident;	/* resident VMs, the pool's and the identities' */
	unsigned capacity;
	bool shutting_down;
	bool prepared;	/* the controller's preparation succeeded */
	bool preparing;	/* a preparation runs */
	int64_t retry_at;
};

struct cap_pool_plan {
	bool prepare;	/* start the preparation (nothing else before it succeeded) */
	unsigned restart;	/* stopped members to start again */
	unsigned create;	/* new members to make and start */
};

/* What the warm pool does at now: nothing while shutting down, off, or
 * before retry_at; the preparation first (unless one runs); then its
 * stopped members started again and new ones made up to size, within
 * the room capacity leaves (restarts first). Spares are never stopped
 * here: they count as resident VMs, which cap_lc_make_room may evict. */
struct cap_pool_plan cap_pool_decide(const struct cap_pool_in *s, int64_t now);

#endif
