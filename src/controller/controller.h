/* The controller core: maps identities (agent, peer) to named sandboxes,
 * creates them lazily, runs each identity's calls one at a time in arrival
 * order, keeps the idle lifecycle and the capacity of DESIGN §5, and
 * recovers what a crashed predecessor left. One per CAPSULE_HOME, held by
 * a lock for its whole life.
 *
 * The core speaks no JSON: front ends (the JSON-RPC socket of `capsule
 * serve`, MCP on stdio) submit typed requests and get typed results back
 * through their ops; each builds its own wire format. The core never
 * blocks its loop on one identity's work: creating a sandbox, checking
 * and rebuilding its public data and starting its shim run in a child
 * process (a job); stops and pause/resume are requests answered later. */
#ifndef CAP_CONTROLLER_H
#define CAP_CONTROLLER_H

#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "lifecycle.h"
#include "client.h"
#include "workspace.h"	/* diff and merge of a sandbox's /workspace */

struct cap_ctl_backend;

struct cap_net_policy;
struct cap_xfer_result;	/* src/sandbox/xfer.h */

struct cap_controller_cfg {
	struct cap_lifecycle_cfg lc;
	const char *image;	/* image of new sandboxes, default "base" */
	const char *source;	/* public data for new sandboxes, or NULL */
	/* The network policy of every sandbox (docs/network.md), or NULL
	 * for none: recorded when a sandbox is made, and again at a start
	 * when the sandbox's record says otherwise. Borrowed. */
	const struct cap_net_policy *network;
	int stop_grace_ms;	/* default 10000 */
	/* A clock that moves only through cap_ctl_advance, so that tests
	 * drive real transitions without waiting. */
	bool manual_clock;
	/* Warm pool: this many started sandboxes kept ready for identities
	 * that have none yet; they count against capacity. 0: off. */
	unsigned warm_pool;
	/* What the lock file says of the holder (for other front ends and
	 * the CLI): its front end's name and socket (NULL: none). */
	const char *frontend;
	const char *socket_path;
	/* Sandboxes: NULL for the real ones (named sandboxes and their
	 * shims); tests give a fake. Borrowed for the controller's life. */
	const struct cap_ctl_backend *backend;
	void *backend_ud;
	/* The host project copied to /workspace of every new sandbox (one
	 * copy per identity, made when its sandbox is created), absolute;
	 * NULL: none. Borrowed. */
	const char *workspace;
	/* Private import (docs/serve.md): when an identity's sandbox is
	 * first made, DIR/<agent>/<peer>/ is copied into its /work, links
	 * and special files refused, existing different content kept; the
	 * identity's record notes it so that it runs once. Absolute; NULL:
	 * off. Borrowed. */
	const char *private_import;
	/* Host directories that upload's `from` and download's `to` may
	 * name (absolute, resolved: cap_ctl_transfer_dirs_resolve); none:
	 * both are refused. Borrowed. */
	const char *const *transfer_dirs;
	size_t ntransfer_dirs;
};

void cap_controller_cfg_init(struct cap_controller_cfg *c);

/* Whether an identity part is acceptable: 1 to 64 of [A-Za-z0-9._@+=:-],
 * not starting with '.'. */
bool cap_controller_id_valid(const char *s);

/* --- the owner of a home ------------------------------------------------ */

struct cap_ctl_holder {
	pid_t pid;
	char frontend[32];	/* "serve", "mcp" */
	char socket[256];	/* "" when it listens on none */
};

/* Whether a controller holds CAPSULE_HOME's lock: 1 with *out filled, 0
 * when none does, -errno on an unreadable home. */
int cap_ctl_holder(struct cap_ctl_holder *out);

/* Whether a running controller owns the sandbox (an identity's or a warm
 * pool's): 1 with *out naming it, 0 when none does, -errno. */
int cap_ctl_owner_of(const char *sandbox, struct cap_ctl_holder *out);

/* --- requests and results ------------------------------------------------ */

/* XFER: an upload or download (docs/serve.md); DIFF and MERGE: what the
 * identity's sandbox changed in /workspace since its base, and the
 * three-way merge of that into the controller's workspace directory
 * (docs/workspace.md). Each runs in a worker thread on a connection of
 * its own to the sandbox's shim, serialized with the identity's other
 * calls. DIFF and MERGE need cfg.workspace and an identity whose sandbox
 * exists: they never create one (ETOOL "nothing to diff/merge"). */
enum cap_ctl_kind {
	CAP_CTL_EXEC, CAP_CTL_FILE, CAP_CTL_STOP, CAP_CTL_REMOVE, CAP_CTL_XFER,
	CAP_CTL_DIFF, CAP_CTL_MERGE,
	CAP_CTL_PREPARE,	/* cap_ctl_prepare_submit: no identity */
};

enum cap_ctl_code {
	CAP_CTL_OK,
	CAP_CTL_ESANDBOX,	/* the sandbox failed (could not start, died) */
	CAP_CTL_ECAPACITY,	/* every slot busy with running calls: retry */
	CAP_CTL_ETOOL,	/* the tool refused (file too big, unreadable...) */
	CAP_CTL_ECANCELLED,
};

#define CAP_CTL_READ_MAX (2u << 20)
#define CAP_CTL_LIST_MAX 500
/* The largest file an upload or download carries inline (base64). */
#define CAP_CTL_INLINE_MAX (16u << 20)

/* A request; everything is borrowed for the call of cap_ctl_submit, which
 * copies what it keeps. */
struct cap_ctl_req {
	enum cap_ctl_kind kind;
	const struct cap_exec_req *exec;	/* EXEC */
	const void *stdin_data;	/* EXEC: all of stdin, or NULL */
	size_t stdin_len;
	enum cap_file_op op;	/* FILE */
	const char *root;	/* "/source" or "/work" */
	const char *path;	/* relative, checked by the front end */
	const void *data;	/* WRITE; XFER put without host: the file's bytes */
	size_t len;
	uint32_t limit;	/* READ: most bytes (0: CAP_CTL_READ_MAX) */
	/* XFER: put copies host (or data) to root/path, get copies
	 * root/path to host. root is "/work" or "/workspace" for put, and
	 * "/source" too for get; path is relative ("" only for a put of a
	 * directory: its contents go directly beneath root). */
	bool put;
	/* XFER: put: the host file or directory (resolved, inside a
	 * transfer directory), or NULL to write data as one file; get:
	 * where the copy goes (must not exist; its parent must). */
	const char *host;
	unsigned mode;	/* XFER put of data: permission bits (07777) */
	/* MERGE: how conflicts are settled (CAP_MERGE_REFUSE: not; the
	 * merge writes nothing then), and whether to plan only. */
	enum cap_merge_pick pick;
	bool dry_run;
	/* FILE WRITE, XFER put: report without flushing what was written
	 * (CAP_FILE_NO_SYNC; an EXEC says it with CAP_EXEC_NO_SYNC in
	 * exec->flags): the result is then not durable. */
	bool no_sync;
};

/* What a transfer copied (also when it failed part way): counts and the
 * paths kept or refused, each list borrowed with the result. */
struct cap_ctl_xfer_out {
	uint64_t files, dirs, links, bytes;
	const char *const *conflicts;	/* kept as they were in the guest */
	size_t nconflicts;
	const char *const *refused;	/* "PATH: why" */
	size_t nrefused;
	/* put: what was written is on the host's disk files (the guest
	 * flushed it before it reported), and how long the flush took. */
	bool durable;
	uint32_t sync_ms;
};

/* The private import of an identity, reported with the first call that
 * ends after it ran (the call that made the sandbox). */
struct cap_ctl_import {
	const char *from;	/* the host directory */
	/* 0: done (out says what was copied, kept and refused); -errno:
	 * it failed (msg), nothing is noted and it runs again at the next
	 * start of the sandbox. */
	int r;
	const char *msg;
	struct cap_ctl_xfer_out out;
};

/* What a merge did (dry_run: would do), or the conflicts that refused
 * it; borrowed with the result. */
struct cap_ctl_merge_out {
	const char *into;	/* the directory merged into */
	bool dry_run;
	struct cap_workspace_counts n;	/* ops by what they do */
	const struct cap_merge_conflict *conflicts;	/* sorted by path; then nothing was written */
	size_t nconflicts;
};

struct cap_ctl_entry {
	char type;	/* 'd' directory, 'f' file, 'l' symlink, 'o' other */
	uint64_t size;	/* files */
	const char *name;
};

/* --- preparation (docs/serve.md, "prepare") --------------------------------- */

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

/* What a call came to; borrowed for the done() call only. */
struct cap_ctl_result {
	enum cap_ctl_code code;
	const char *msg;	/* on error: what happened and what to do */
	int errnum;	/* on error, when one applies; else 0 */
	const char *sandbox;	/* the identity's sandbox, when known */
	enum cap_ctl_kind kind;
	/* EXEC (and the answer of a failed FILE: its exit) */
	struct cap_exit exit;
	const uint8_t *out, *err;	/* raw bytes, not sanitized */
	size_t out_len, err_len;
	/* FILE */
	bool is_dir;
	const uint8_t *content;	/* READ of a file: raw bytes */
	size_t content_len;
	const struct cap_ctl_entry *entries;	/* READ/LIST of a directory */
	size_t nentries;
	bool entries_truncated;
	uint64_t written;	/* WRITE */
	/* STOP, REMOVE: "stopped", "removed", "none" */
	const char *state;
	/* What the host did beyond the guest's answer (a command the guest
	 * did not end in time), or NULL. */
	const char *note;
	/* XFER: what was copied; also on a failure that came after some
	 * of it (refused paths), else NULL. */
	const struct cap_ctl_xfer_out *xfer;
	/* DIFF: the changes since the base, sorted by path (their entries
	 * borrowed with the result). */
	const struct cap_tree_change *changes;
	size_t nchanges;
	/* MERGE: on success, and with ETOOL when conflicts refused it. */
	const struct cap_ctl_merge_out *merge;
	/* A tool call's (EXEC, FILE, XFER): the private import that ran
	 * before it, when it is the first call to end after one; NULL. */
	const struct cap_ctl_import *import;
	/* A tool call that waited for the controller's preparation: the
	 * phases it built (bits 1u << phase; 0: none, or it did not wait). */
	unsigned prepared;
	/* PREPARE: what the preparation found or made (also on failure:
	 * prep->failed names the phase). A tool call that failed because
	 * the preparation did: the same. NULL otherwise. */
	const struct cap_prep_out *prep;
};

struct cap_ctl_status {
	char agent[65], peer[65];
	char sandbox[64];	/* "" for none */
	enum cap_vm_state state;
	unsigned active, queued;
	int64_t idle_ms;	/* -1 when unknown (not resident) */
	/* With private import: when it ran for this identity (Unix time),
	 * 0 when it has not (yet). */
	int64_t imported;
};

struct cap_ctl_pool_info {
	unsigned size, members, ready;
};

/* --- front ends -------------------------------------------------------------- */

struct cap_ctl;
struct cap_ctl_fe;	/* a registered front end */
struct cap_ctl_call;	/* a submitted call, until its done() */
struct cap_ctl_poll;	/* the descriptors of one round of the loop */

/* Watch fd this round; tag comes back to ready(). */
void cap_ctl_poll_add(struct cap_ctl_poll *p, int fd, short events, void *tag);

struct cap_ctl_frontend_ops {
	const char *name;	/* "serve", "mcp": for log lines */
	/* Add this round's descriptors. */
	void (*pollfds)(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p);
	void (*ready)(void *fe, struct cap_ctl *c, void *tag, short revents);
	/* End of a round: write what is queued. */
	void (*flush)(void *fe, struct cap_ctl *c);
	/* Every submitted call ends here exactly once, cancelled or not. r
	 * and what it points to are borrowed for the call. */
	void (*done)(void *fe, struct cap_ctl *c, void *tag,
		     const struct cap_ctl_result *r);
	/* The controller is shutting down: take no new requests. */
	void (*shutdown)(void *fe, struct cap_ctl *c);
	/* A preparation's progress, for a call (tag) waiting for it: a
	 * PREPARE call, or a tool call that found the controller
	 * unprepared. ev is borrowed for the call. NULL: not told. */
	void (*progress)(void *fe, struct cap_ctl *c, void *tag,
			 const struct cap_prep_event *ev);
};

/* Take CAPSULE_HOME's lock and set up; -EBUSY naming the holder when
 * another controller has it. *out is owned by the caller (cap_ctl_free). */
int cap_ctl_new(const struct cap_controller_cfg *cfg, struct cap_ctl **out,
		struct cap_err *err);
/* Name the socket other front ends reach this controller by (NULL: none)
 * in the home's lock file. */
int cap_ctl_set_socket(struct cap_ctl *c, const char *path, struct cap_err *err);
/* Register a front end; ops and fe are borrowed for the controller's life. */
struct cap_ctl_fe *cap_ctl_add_frontend(struct cap_ctl *c,
					const struct cap_ctl_frontend_ops *ops,
					void *fe);
/* Recover what a predecessor left, then serve until SIGTERM, SIGINT or
 * cap_ctl_shutdown; then stop every VM and return 0. */
int cap_ctl_run(struct cap_ctl *c, struct cap_err *err);
/* cap_ctl_run in parts, for callers that drive the loop themselves (unit
 * tests): _start recovers; _step runs one round, waiting at most
 * max_wait_ms (-1: until something happens), and returns 1 while serving,
 * 0 once shut down with every VM stopped, -errno on a poll failure. */
void cap_ctl_start(struct cap_ctl *c);
/* For a front end about to serve: make sure the image of new sandboxes
 * is there (the base image is built now when missing, saying so), else
 * say how to get it, through cap_log; the front end still starts (each
 * call that creates a sandbox then fails with the same reason). */
void cap_ctl_check_image(const struct cap_controller_cfg *cfg);
int cap_ctl_step(struct cap_ctl *c, int max_wait_ms, struct cap_err *err);
/* Ask the loop to stop every VM and return (a front end lost its client). */
void cap_ctl_shutdown(struct cap_ctl *c, const char *why);
/* Release the lock and everything; NULL is ok. */
void cap_ctl_free(struct cap_ctl *c);

const struct cap_controller_cfg *cap_ctl_cfg(const struct cap_ctl *c);
const char *cap_ctl_home(const struct cap_ctl *c);

/* Queue a call for (agent, peer), both valid (the front end checks).
 * The result reaches fe's done() with tag, always later (never from
 * inside this call). The handle is valid until then. */
struct cap_ctl_call *cap_ctl_submit(struct cap_ctl *c, struct cap_ctl_fe *fe,
				    const char *agent, const char *peer,
				    const struct cap_ctl_req *req, void *tag);
/* Queue a preparation (cap_ctl_prepare for this controller's image and
 * sandbox shape): one runs at a time, in a worker thread, and every call
 * that arrives while it runs waits for it and gets its outcome; its
 * progress reaches fe's progress() with tag, its result done() (kind
 * CAP_CTL_PREPARE, r->prep). Tool calls wait for the same preparation
 * until one has succeeded (then the controller is prepared; a kernel or
 * image removed later fails the call that needs it, as before). */
struct cap_ctl_call *cap_ctl_prepare_submit(struct cap_ctl *c, struct cap_ctl_fe *fe, void *tag);
/* Whether a preparation has succeeded in this controller. */
bool cap_ctl_prepared(const struct cap_ctl *c);

/* Cancel a call: a queued one ends at once, a running one's process group
 * is killed and it ends when the guest says so (ECANCELLED either way). A
 * stop or remove under way is not taken back: false. */
bool cap_ctl_cancel(struct cap_ctl *c, struct cap_ctl_call *k);

/* The state of an identity; creates nothing. */
void cap_ctl_status(struct cap_ctl *c, const char *agent, const char *peer,
		    struct cap_ctl_status *out);
/* Every identity with a sandbox, resident or not; pool may be NULL. */
void cap_ctl_list(struct cap_ctl *c,
		  void (*each)(void *ud, const struct cap_ctl_status *s),
		  void *ud, struct cap_ctl_pool_info *pool);
/* The identity a sandbox belongs to: 0, -ENOENT (none: unknown sandbox or
 * an unassigned warm-pool one). */
int cap_ctl_identity_of(struct cap_ctl *c, const char *sandbox,
			char agent[65], char peer[65]);
/* The manual clock: move it by ms. -EPERM without manual_clock. */
int cap_ctl_advance(struct cap_ctl *c, int64_t ms, int64_t *now);
/* The lifecycle clock (ms). */
int64_t cap_ctl_now(const struct cap_ctl *c);

/* --- transfer directories ------------------------------------------------------- */

/* Resolve the directories given with --transfer-dir (realpath: each must
 * exist and be a directory). *out is a new NULL-terminated array of new
 * strings (cap_ctl_transfer_dirs_free). -errno with err naming the one
 * at fault. */
int cap_ctl_transfer_dirs_resolve(const char *const *dirs, size_t n, char ***out,
				  struct cap_err *err);
void cap_ctl_transfer_dirs_free(char **dirs);

/* A directory setting (what names it in messages: "--workspace"),
 * resolved with realpath; it must exist and be a directory. *out is a
 * new string. -errno with err naming it. */
int cap_ctl_resolve_dir(const char *what, const char *path, char **out, struct cap_err *err);

/* Whether path (absolute, resolved) is dir or beneath it (dir absolute,
 * resolved, without a trailing '/' unless it is "/"). Pure. */
bool cap_ctl_path_within(const char *dir, const char *path);

/* A host path an upload copies from: it must exist and resolve (every
 * symbolic link followed) inside one of dirs. *out: the resolved path, a
 * new string. -EACCES naming the path and the directories when it is
 * outside (or there are none), -errno when it cannot be resolved. */
int cap_ctl_transfer_source(const char *const *dirs, size_t n, const char *path,
			    char **out, struct cap_err *err);
/* A host path a download writes to: it must not exist, and its parent
 * must resolve inside one of dirs; its last component must be a name
 * (not "." or ".."). *out: the resolved parent joined with that name, a
 * new string. -EEXIST, -EACCES, -errno with err set. */
int cap_ctl_transfer_dest(const char *const *dirs, size_t n, const char *path,
			  char **out, struct cap_err *err);

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
};

struct cap_ctl_job_out {
	int r;	/* 0 or -errno, with msg */
	char msg[1024];
	bool changed;	/* CHECK: the public data changed (the VM was stopped) */
	bool stopped;	/* WAIT: the shim went away instead of serving */
	bool has_source;	/* whether the sandbox projects public data */
};

#define CAP_CTL_VM_NPOLL 2

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
};

#endif
