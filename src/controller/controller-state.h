/* The controller core's state (the controller, its identities, calls,
 * worker-thread tasks and preparation, the loop's descriptors) and the
 * functions its files share. Only the files of the core include it. */
#ifndef CAP_CONTROLLER_STATE_H
#define CAP_CONTROLLER_STATE_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "controller-internal.h"
#include "xfer.h"

/* --- state ------------------------------------------------------------------ */

/* Shared between the loop (which cancels) and a worker thread (whose
 * backend names the descriptor a cancel shuts down). */
struct cap_ctl_xfer_watch {
	pthread_mutex_t lock;
	int fd;	/* -1: none yet (or any more) */
	bool cancelled;
};

/* A transfer or a private import, run in a worker thread: the thread
 * reads the inputs, writes the outputs, then signals efd; the loop reads
 * the outputs only after it has joined the thread. Nothing else is
 * shared: the thread never touches the controller. */
struct task {
	pthread_t thread;
	int efd;
	struct cap_ctl_xfer_watch w;
	const struct cap_ctl_backend *be;
	void *bud;
	/* inputs */
	bool import;	/* a private import of host into /work */
	bool ws;	/* a diff (or merge: ws_req.merge) of the workspace */
	struct cap_ctl_ws ws_req;	/* name points into name, into into owned_host */
	char name[CAP_NAME_MAX + 1];
	bool put;
	char root[16];
	char *owned_path;	/* put: where (relative; "" for the root); get: what */
	char *owned_host;	/* NULL for a put of data */
	const uint8_t *data;	/* borrowed from the call, which outlives the task */
	size_t len;
	unsigned mode;
	bool no_sync;	/* put: CAP_XFER_NO_SYNC */
	bool fork;	/* SNAPSHOT (count 0) or FORK */
	unsigned count;
	char snap[CAP_NAME_MAX + 1];	/* in: as asked ("": default); out: taken */
	char (*children)[CAP_NAME_MAX + 1];	/* out, count of them; borrowed from the call */
	/* outputs */
	int r;
	bool absent;	/* import: the host directory does not exist */
	struct cap_err err;
	struct cap_xfer_result res;
	struct cap_ctl_ws_out ws_out;
};

/* An import's outcome until the call it goes with ends. */
struct import_report {
	struct cap_ctl_import pub;	/* points into the fields below */
	char *owned_from, *owned_msg;
	struct cap_xfer_result res;
};

struct cap_ctl_fe {
	const struct cap_ctl_frontend_ops *ops;
	void *fe;
	struct cap_ctl_fe *next;
};

struct ident;

/* SNAPSHOT and FORK: the snapshot's name ("" for the default), and a
 * fork's children (their peers chosen when it starts). */
struct ctl_fork_call {
	char snap[CAP_NAME_MAX + 1];
	unsigned count;
	char (*owned_peers)[65];	/* as asked, or NULL */
	struct cap_ctl_child *owned_children;	/* count of them, once started */
};

/* What a call of each kind keeps of its request (struct cap_ctl_call's
 * union, chosen by its kind; STOP, REMOVE, DIFF and PREPARE keep none). */
struct ctl_exec_call {
	struct cap_exec_req req;	/* owned strings */
	uint8_t *owned_stdin;
	size_t stdin_len;
};

struct ctl_file_call {
	struct cap_file_req req;	/* root, path and data point into the fields below */
	char root[16];
	char *owned_path;
	uint8_t *owned_data;
};

struct ctl_xfer_call {
	bool put;
	char root[16];
	char *owned_path;
	char *owned_host;
	uint8_t *owned_data;	/* a put of data */
	size_t len;
	unsigned mode;
	bool no_sync;	/* put: CAP_XFER_NO_SYNC */
};

struct ctl_merge_call {
	enum cap_merge_pick pick;
	bool dry_run;
};

struct cap_ctl_call {
	enum cap_ctl_kind kind;
	struct cap_ctl_fe *fe;
	void *tag;
	struct ident *ident;
	union {	/* by kind */
		struct ctl_exec_call exec;	/* EXEC */
		struct ctl_file_call file;	/* FILE */
		struct ctl_xfer_call xfer;	/* XFER */
		struct ctl_merge_call merge;	/* MERGE (a DIFF's stays zero) */
		struct ctl_fork_call fork;	/* SNAPSHOT, FORK */
	};
	/* EXEC and FILE: the guest's stream */
	uint32_t stream;
	bool cancelled;
	char why[1024];	/* the sandbox went away under it: what to answer */
	/* Answered by the host's deadline while the guest still holds the
	 * stream: kept (on ident->abandoned) until the guest or its VM lets
	 * go of it, since the VM's callbacks still point here. */
	bool abandoned;
	int64_t deadline;	/* real ms: the timeout plus the grace; 0: none */
	int64_t sent_ms;	/* real ms: when the command was sent (with a deadline) */
	bool syncing;	/* the guest is flushing its writes (SYNCING) */
	struct cap_buf out, err;
	/* Waiting for the controller's preparation (on ctl->prep_waiters),
	 * and what it built, for the result. */
	bool prep_wait;
	unsigned prep_built;
	struct cap_ctl_call *prep_next;
	struct cap_ctl_call *next;
};

enum vm_op { OP_NONE, OP_PAUSE, OP_RESUME };

struct ident {
	struct cap_ctl *ctl;
	char agent[65], peer[65];
	char name[CAP_NAME_MAX + 1];
	struct cap_lc lc;
	void *vm;	/* attached while running, paused, stopping */
	bool pool;	/* a warm-pool VM: no identity yet (agent and peer empty) */
	int source;	/* whether it projects public data: -1 not known yet */
	bool checked;	/* its public data was checked for the call at the queue's head */
	bool job;	/* a job runs for it (job_kind, job_fd, job_pid) */
	enum cap_ctl_job job_kind;
	int job_fd;
	pid_t job_pid;
	enum vm_op op;	/* asked of the shim, not answered yet */
	bool stop_after_start;
	int64_t stop_deadline;	/* real ms */
	/* Stopping: the VM is gone, the shim is still exiting (real ms). */
	int64_t exit_wait_until;
	bool killed;	/* its shim was killed for not stopping in time */
	/* A remove waiting for the shim to finish exiting (real ms). */
	int64_t remove_retry_at, remove_deadline;
	struct cap_ctl_call *queue;
	struct cap_ctl_call *active;
	struct cap_ctl_call *abandoned;
	/* The worker thread of the active XFER call, or of the private
	 * import (with no active call). */
	struct task *task;
	/* Private import: whether the record was looked at (and the import
	 * run if due) since the sandbox last started; the outcome waiting
	 * for a call to carry it. */
	bool import_checked;
	struct import_report *report;
	/* The policy process's counters as last read (cap_ctl_metrics),
	 * to add what moved since to the controller's totals. */
	uint64_t net_seen[3];
	struct ident *next;
};

enum slot_kind { SLOT_SIGNAL, SLOT_FE, SLOT_VM, SLOT_JOB, SLOT_TASK, SLOT_PREP };

/* A progress event on its way from the preparation's worker to the loop. */
struct prep_ev {
	struct cap_prep_event ev;	/* message points to owned_msg */
	char *owned_msg;
	struct prep_ev *next;
};

/* The preparation running in a worker thread. The thread appends events
 * (under lock) and signals efd, and sets finished last; the loop reads
 * r, err and out only after it has joined the thread. */
struct prep_run {
	pthread_t thread;
	int efd;
	pthread_mutex_t lock;
	struct prep_ev *head, **tail;	/* not taken by the loop yet */
	bool finished;
	const struct cap_ctl_backend *be;
	void *bud;
	char *owned_image;
	struct cap_prep_req req;
	struct cap_prep_cancel cancel;
	int r;
	struct cap_err err;
	struct cap_prep_out out;
	/* The loop's: events told so far (not the lines), replayed to a
	 * call that joins later, so that each sees every phase. */
	struct prep_ev *log, **log_tail;
};

struct slot {
	enum slot_kind kind;
	void *p;	/* SLOT_FE: the front end; else the identity */
	void *tag;
};

struct cap_ctl_poll {
	struct pollfd *pfd;
	struct slot *slot;
	size_t n, cap;
	struct cap_ctl_fe *fe;	/* whose descriptors are being added */
};

struct cap_ctl {
	struct cap_controller_cfg cfg;
	const struct cap_ctl_backend *be;
	void *bud;
	char *home;
	int lock_fd, signal_fd;
	int64_t manual_now;	/* the manual clock */
	bool shutting_down;
	bool kick;	/* some queue may move */
	int64_t pool_retry_at;	/* real ms: warm-pool starts failed, wait till then */
	uint64_t seq;	/* orders idle_since updates (cap_lc.seq) */
	struct cap_ctl_fe *fes;
	struct ident *idents;
	struct cap_ctl_poll poll;
	/* Preparation: done once it succeeded; the run under way and the
	 * calls waiting for it (PREPARE calls and tool calls, in order). */
	bool prepared;
	struct prep_run *prep;
	struct cap_ctl_call *prep_waiters;
	struct cap_ctl_call *prep_queue;	/* PREPARE calls not taken yet (by next) */
	/* Figures (cap_ctl_metrics): counted where they happen. */
	int64_t start_unix_ms;
	uint64_t n_prepares[CAP_CTL_PREP_NOUTCOMES];
	uint64_t n_evictions[CAP_CTL_NEVICT];
	uint64_t n_net[3];	/* refused, bytes out, bytes in */
};

/* controller.c: the loop */
void ctl_set_idle(struct cap_ctl *c, struct cap_lc *lc);

/* controller-lock.c: the home lock */
int ctl_take_lock(struct cap_ctl *c, struct cap_err *err);

/* controller-ident.c: identities */
struct ident *ctl_ident_new(struct cap_ctl *c, const char *agent, const char *peer,
			    const char *name);
struct ident *ctl_ident_get(struct cap_ctl *c, const char *agent, const char *peer);
void ctl_unlink_ident(struct cap_ctl *c, struct ident *x);
void ctl_idents_sweep(struct cap_ctl *c);
/* The sandbox an identity has or will have. */
void ctl_ident_name(struct cap_ctl *c, const char *agent, const char *peer,
		    char out[CAP_NAME_MAX + 1]);

/* controller-size.c: sizes */
/* What i's sandbox starts with: the defaults under its override. */
void ctl_size_want(struct cap_ctl *c, const struct ident *i, struct cap_ctl_size *out);
/* Whether that is the defaults (a warm-pool VM is the defaults' shape). */
bool ctl_size_is_default(struct cap_ctl *c, const struct ident *i);

/* controller-call.c: calls and their queues */
void ctl_call_free(struct cap_ctl_call *k);
struct cap_ctl_call *ctl_call_new(const struct cap_ctl_req *r, struct cap_ctl_fe *fe, void *tag);
void ctl_report_free(struct import_report *p);
bool ctl_in_worker(enum cap_ctl_kind kind);
bool ctl_is_tool(enum cap_ctl_kind kind);
void ctl_deliver(struct cap_ctl *c, struct cap_ctl_call *k, struct cap_ctl_result *r);
void ctl_fail(struct cap_ctl *c, struct cap_ctl_call *k, enum cap_ctl_code code,
	      const char *msg, int errnum);
void ctl_unqueue(struct ident *i, struct cap_ctl_call *k);
void ctl_fail_queue(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code, const char *msg);
void ctl_active_done(struct cap_ctl *c, struct ident *i, struct cap_ctl_result *r);
/* Start the active SNAPSHOT or FORK call k in a worker (controller-task.c). */
void ctl_begin_fork(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k);
void ctl_active_fail(struct cap_ctl *c, struct ident *i, enum cap_ctl_code code,
		     const char *msg, int errnum);
const uint8_t *ctl_bytes(const struct cap_buf *b);
void ctl_pump(struct cap_ctl *c, struct ident *i);
void ctl_op_answered(struct cap_ctl *c, struct ident *i, int result);

/* controller-task.c: worker-thread tasks */
void ctl_task_abort(struct task *t);
void ctl_task_free(struct task *t);
struct task *ctl_task_join(struct ident *i);
void ctl_task_finished(struct cap_ctl *c, struct ident *i);
void ctl_begin_xfer(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k);
void ctl_begin_ws(struct cap_ctl *c, struct ident *i, struct cap_ctl_call *k);
bool ctl_import_due(struct cap_ctl *c, struct ident *i);
void ctl_begin_import(struct cap_ctl *c, struct ident *i);

/* controller-prep.c: the preparation */
void ctl_prep_free(struct prep_run *p);
void ctl_prep_unwait(struct cap_ctl *c, struct cap_ctl_call *k);
int ctl_prep_begin(struct cap_ctl *c, struct cap_err *err);
void ctl_prep_join(struct cap_ctl *c, struct cap_ctl_call *k);
void ctl_prep_ready(struct cap_ctl *c);
void ctl_prep_pump(struct cap_ctl *c);

/* controller-vm.c: the VM of an identity and its jobs */
void ctl_free_abandoned(struct ident *i);
void ctl_detach(struct cap_ctl *c, struct ident *i);
int ctl_attach(struct cap_ctl *c, struct ident *i, struct cap_err *err);
void ctl_begin_stop(struct cap_ctl *c, struct ident *i);
void ctl_try_remove(struct cap_ctl *c, struct ident *i);
void ctl_stopped(struct cap_ctl *c, struct ident *i);
void ctl_vm_down(struct cap_ctl *c, struct ident *i);
void ctl_vm_lost(struct cap_ctl *c, struct ident *i, const char *why);
int ctl_begin_job(struct cap_ctl *c, struct ident *i, enum cap_ctl_job kind, bool create,
		  struct cap_err *err);
int ctl_begin_start(struct cap_ctl *c, struct ident *i, struct cap_err *err);
void ctl_job_finished(struct cap_ctl *c, struct ident *i);

/* controller-pool.c: capacity and the warm pool */
int ctl_make_room(struct cap_ctl *c);
struct ident *ctl_pool_ready(struct cap_ctl *c);
int ctl_take_from_pool(struct cap_ctl *c, struct ident *i, struct ident *p, struct cap_err *err);
void ctl_pool_fill(struct cap_ctl *c);

/* controller-metrics.c: figures */
/* Add what i's policy process counted since the last look to the
 * totals (at each scrape, and once its VM stopped). */
void ctl_usage_take(struct cap_ctl *c, struct ident *i);
/* The counters of a sandbox a predecessor started, taken as the point
 * this controller counts from. */
void ctl_usage_baseline(struct cap_ctl *c, struct ident *i);

/* controller-recover.c: recovery */
void ctl_recover(struct cap_ctl *c);

#endif
