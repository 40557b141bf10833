/* The controller's sandboxes, behind a table (struct cap_ctl_backend):
 * the real one drives named sandboxes and their shims
 * (controller-named.c); unit tests give a fake. Front ends never see it. */
#ifndef CAP_CONTROLLER_BACKEND_H
#define CAP_CONTROLLER_BACKEND_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "controller.h"
#include "workspace.h"	/* diff and merge of a sandbox's /workspace */

struct cap_xfer_result;	/* src/sandbox/xfer.h */

/* --- sandboxes, behind a table (the real one drives named sandboxes;
 * unit tests give a fake) ----------------------------------------------------- */

/* A job runs in a child process (the real backend forks): make the
 * sandbox if it does not exist, bring its public data up to date, start
 * its shim; or only check whether the public data changed (a changed one
 * stops the VM and is rebuilt). */
enum cap_ctl_job {
	CAP_CTL_JOB_START,
	CAP_CTL_JOB_CHECK,
	/* Wait for a shim that is starting or exiting to serve or go
	 * (recovery); never starts one. */
	CAP_CTL_JOB_WAIT,
};

struct cap_ctl_job_req {
	enum cap_ctl_job kind;
	const char *name;
	bool create;	/* START: create it first when missing */
	const char *image, *source;	/* of a new sandbox */
	const char *workspace;	/* of a new sandbox: its /workspace, or NULL */
	const struct cap_net_policy *network;	/* of every sandbox, NULL: none */
	bool tools_root;	/* every sandbox's commands as root (serve --root) */
	/* START of a warm-pool VM: once started, one command (`true`) runs
	 * in it, so that what a first command goes through is done before
	 * an identity's (TCG translates it once: cap_named_warm). */
	bool warm;
	/* START: the sizes of a new sandbox; for one that exists, the vCPUs
	 * and memory it starts with from now on (its record changed first).
	 * Every field set. */
	struct cap_ctl_size size;
};

struct cap_ctl_job_out {
	int r;	/* 0 or -errno, with msg */
	char msg[1024];
	bool changed;	/* CHECK: the public data changed (the VM was stopped) */
	bool stopped;	/* WAIT: the shim went away instead of serving */
	bool has_source;	/* whether the sandbox projects public data */
};

#define CAP_CTL_VM_NPOLL 3

/* One transfer, as the backend's xfer gets it (everything borrowed for
 * the call). put: host (a file or directory) goes to root/dest_dir as
 * dest_name ("" with a directory: its contents go directly there); get:
 * root/path goes to host. flags: CAP_XFER_* (src/sandbox/xfer.h). */
struct cap_ctl_xfer {
	const char *name;	/* the sandbox, running */
	bool put;
	const char *root;
	const char *path;	/* get */
	const char *dest_dir, *dest_name;	/* put */
	const char *host;
	unsigned flags;
};

/* A running transfer's link to cancellation: the backend names the
 * descriptor that carries it (the shim connection) once it has one, and
 * a cancel (or the controller's shutdown) shuts that descriptor down
 * (shutdown(2), from the loop's thread), which ends the transfer with an
 * error. */
struct cap_ctl_xfer_watch;
/* 0, or -ECANCELED when it was cancelled already (end the transfer). */
int cap_ctl_xfer_watch_fd(struct cap_ctl_xfer_watch *w, int fd);
/* Before the descriptor is closed. */
void cap_ctl_xfer_unwatch(struct cap_ctl_xfer_watch *w);

/* One diff or merge of a sandbox's workspace, as the backend's
 * workspace op gets it (borrowed for the call). */
struct cap_ctl_ws {
	const char *name;	/* the sandbox, running */
	bool merge;
	const char *into;	/* MERGE: the host directory (resolved) */
	enum cap_merge_pick pick;
	bool dry_run;
};

/* What it came to, filled by the op (the caller zeroes it first and
 * finishes it with cap_ctl_ws_out_fini, also after a failure). */
struct cap_ctl_ws_out {
	/* DIFF: the base, the guest's manifest and the changes between them
	 * (pointing into both). */
	struct cap_tree base, now;
	struct cap_tree_change *changes;
	size_t nchanges;
	/* MERGE: the three sides and the plan (merge.planned); applied when
	 * it had no conflicts and !dry_run. */
	struct cap_workspace_merge merge;
};
void cap_ctl_ws_out_fini(struct cap_ctl_ws_out *o);

struct cap_ctl_backend {
	int (*job_begin)(void *ud, const struct cap_ctl_job_req *j, int *fd,
			 pid_t *pid, struct cap_err *err);
	/* fd became readable: collect the outcome, close fd, reap pid. */
	void (*job_end)(void *ud, int fd, pid_t pid, struct cap_ctl_job_out *out);
	/* The sizes a sandbox's record holds (those of its last start):
	 * -ENOENT when it does not exist. NULL: not known. */
	int (*sizes)(void *ud, const char *name, struct cap_ctl_size *out);
	/* What the sandbox is doing: -ENOENT when it does not exist. */
	int (*state)(void *ud, const char *name, enum cap_vm_state *st,
		     bool *serving, bool *has_source);
	/* Attach to a serving shim; *vm is owned by the caller (vm_free). */
	int (*attach)(void *ud, const char *name, void **vm, bool *paused,
		      struct cap_err *err);
	/* Leftovers of a dead shim: cleaned; disks stay. */
	void (*reap)(void *ud, const char *name);
	/* Delete a stopped sandbox and its disks. */
	int (*remove)(void *ud, const char *name, struct cap_err *err);
	/* Kill the shim of a sandbox that would not stop. */
	void (*kill)(void *ud, const char *name);

	int (*exec)(void *vm, const struct cap_exec_req *req,
		    const struct cap_exec_events *ev, void *ud, uint32_t *id,
		    struct cap_err *err);
	int (*file)(void *vm, const struct cap_file_req *req, uint32_t cap,
		    const struct cap_exec_events *ev, void *ud, uint32_t *id,
		    struct cap_err *err);
	int (*input)(void *vm, uint32_t id, const void *p, size_t n);
	int (*signal)(void *vm, uint32_t id, int sig);
	/* Ask to pause or resume; vm_op_done says when the shim answered. */
	void (*vm_op)(void *vm, bool pause);
	bool (*vm_op_done)(void *vm, int *result);
	void (*stop)(void *vm);
	bool (*dead)(void *vm);
	void (*pollfds)(void *vm, struct pollfd *pfd);	/* CAP_CTL_VM_NPOLL */
	int (*dispatch)(void *vm, const struct pollfd *pfd, struct cap_err *err);
	void (*vm_free)(void *vm);
	/* Run a transfer to its end: called in a worker thread, it must
	 * touch nothing but its arguments (and what the sandbox layer
	 * does). *res (zeroed by the caller, who finishes it with
	 * cap_xfer_result_fini) may be filled on failure too. 0, -EPERM
	 * when some paths were refused (listed; the rest copied), other
	 * -errno with err set. NULL: transfers are refused. */
	int (*xfer)(void *ud, const struct cap_ctl_xfer *x, struct cap_ctl_xfer_watch *w,
		    struct cap_xfer_result *res, struct cap_err *err);
	/* Run a diff or merge (holding the sandbox's workspace lock; one
	 * held elsewhere is -EWOULDBLOCK), in a worker thread like xfer.
	 * 0 also for a merge its conflicts refused (out says so, nothing
	 * written); -errno with err set. NULL: both are refused. */
	int (*workspace)(void *ud, const struct cap_ctl_ws *ws, struct cap_ctl_xfer_watch *w,
			 struct cap_ctl_ws_out *out, struct cap_err *err);
	/* Snapshot running sandbox name as snap (filled in when "": the
	 * default), and with count > 0 start count children of it named
	 * children[0..count) (filled in), in a worker thread like xfer.
	 * NULL: refused. */
	int (*fork)(void *ud, const char *name, unsigned count, char (*children)[CAP_NAME_MAX + 1],
		    char snap[CAP_NAME_MAX + 1], struct cap_err *err);
	/* Prepare (cap_ctl_prepare for the real one), in a worker thread
	 * like xfer. NULL: nothing to prepare (the controller starts
	 * prepared; a PREPARE call answers at once). */
	int (*prepare)(void *ud, const struct cap_prep_req *req, cap_prep_fn fn, void *fud,
		       struct cap_prep_cancel *cancel, struct cap_prep_out *out, struct cap_err *err);
	/* Recovery, before the records are read: clean what dead sandboxes
	 * left behind (the real one sweeps the jails' leftovers, saying what
	 * it found through cap_log). NULL: nothing to clean. */
	void (*sweep)(void *ud);
	/* Recovery: every sandbox there is, so that warm-pool ones nobody was
	 * given become members again. *names is a new array of n new
	 * strings (the caller frees each and it). 0 or -errno. NULL: none
	 * are listed (no warm-pool sandbox is recovered). */
	int (*list)(void *ud, char ***names, size_t *n);
	/* What the host holds for the sandbox and its policy process's
	 * counters (since its VM last started), for cap_ctl_metrics; from
	 * the loop, so quick (no waiting on the sandbox). 0 or -errno
	 * (*out zeroed). NULL: none known. */
	int (*usage)(void *ud, const char *name, struct cap_ctl_usage *out);
};

#endif
