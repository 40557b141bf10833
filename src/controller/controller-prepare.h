/* Preparation (docs/serve.md, "prepare"): the kernel, initramfs, image
 * and template a first sandbox needs, made sure of in that order with
 * their progress told. controller-prepare.c does it; the controller runs
 * it in a worker thread for its calls, `capsule prepare` directly. */
#ifndef CAP_CONTROLLER_PREPARE_H
#define CAP_CONTROLLER_PREPARE_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"

struct cap_net_policy;

/* The four things a first sandbox needs, made sure of in this order.
 * CAP_PREP_LOCK is no phase of those: taking the cache's lock before
 * them, named only when that fails ("lock"; the wait for another
 * process's preparation is a line of the kernel phase). */
enum cap_prep_phase {
	CAP_PREP_KERNEL, CAP_PREP_INITRAMFS, CAP_PREP_IMAGE, CAP_PREP_TEMPLATE,
	CAP_PREP_LOCK,
};
#define CAP_PREP_NPHASES 4

enum cap_prep_status {
	CAP_PREP_BUILDING,	/* work on the phase started */
	CAP_PREP_LINE,	/* a line of the phase's build, in message */
	CAP_PREP_READY,	/* the phase is there (message: built now or already there) */
	CAP_PREP_FAILED,
};

/* One progress event; message borrowed for the callback. done: phases
 * ready so far (never goes down), of CAP_PREP_NPHASES. */
struct cap_prep_event {
	enum cap_prep_phase phase;
	enum cap_prep_status status;
	unsigned done;
	const char *message;
};
typedef void (*cap_prep_fn)(void *ud, const struct cap_prep_event *ev);

/* "kernel"... ("lock" for CAP_PREP_LOCK); "building"... */
const char *cap_prep_phase_name(enum cap_prep_phase p);
const char *cap_prep_status_name(enum cap_prep_status s);

/* What to prepare for: the image and the shape of new sandboxes (the
 * template's key depends on it). Borrowed for the call. */
struct cap_prep_req {
	const char *image;	/* NULL: "base" */
	bool workspace;	/* sandboxes carry a /workspace disk */
	const struct cap_net_policy *network;	/* NULL: no NIC */
};

/* What a preparation found or made (also filled as far as it got when
 * it failed). Finish with cap_prep_out_fini. */
struct cap_prep_out {
	unsigned built;	/* bit (1u << phase) for each phase built by this call */
	char *owned_kernel, *owned_initramfs;
	char *owned_image_name;	/* NULL: the image has no name */
	char image_digest[72];	/* "" until the image phase is ready */
	bool template_on;	/* false: templates are off (CAPSULE_TEMPLATES=0) */
	int64_t duration_ms;
	enum cap_prep_phase failed;	/* on failure: the phase that failed (or CAP_PREP_LOCK) */
};
void cap_prep_out_fini(struct cap_prep_out *o);

/* A preparation's link to cancellation, shared between the thread that
 * runs it and the one that cancels it (cap_prep_cancel_init first). */
struct cap_prep_cancel {
	pthread_mutex_t lock;
	bool cancelled;
	pid_t pid;	/* the kernel builder running (its process group), or 0 */
};
void cap_prep_cancel_init(struct cap_prep_cancel *x);
void cap_prep_cancel_fini(struct cap_prep_cancel *x);
/* Ask it to end: the kernel builder's process group gets SIGTERM (and
 * SIGKILL 5 s later if it is still there), no further phase starts. */
void cap_prep_cancel_request(struct cap_prep_cancel *x);

/* Make sure of kernel, initramfs, image and template, building what is
 * missing, in that order, reporting each step through fn (may be NULL;
 * called from this thread). The kernel is built by the script
 * cap_store_kernel_builder names (its output as CAP_PREP_LINE events);
 * every builder writes its result atomically, so a failed or cancelled
 * run leaves nothing taken for made and a new run retries from the
 * phase that failed. One preparation at a time per cache (a lock in
 * it: a second caller waits). cancel may be NULL. 0, or -errno with err
 * saying what failed and what to do, and out->failed naming the phase. */
int cap_ctl_prepare(const struct cap_prep_req *req, cap_prep_fn fn, void *ud,
		    struct cap_prep_cancel *cancel, struct cap_prep_out *out,
		    struct cap_err *err);

#endif
