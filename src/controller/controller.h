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
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "lifecycle.h"
#include "named.h"	/* CAP_NAME_MAX, CAP_FORK_MAX */
#include "client.h"
#include "controller-prepare.h"
#include "tree.h"	/* enum cap_merge_pick */
#include "workspace-types.h"

struct cap_ctl_backend;	/* controller-backend.h */

struct cap_net_policy;

/* A sandbox's sizes (DESIGN §5): vCPUs, memory, and its two disks (the
 * root's writable layer and /work). A field 0 is not given: the next
 * level's value holds (an identity's override, then the server's
 * default, then the record's default, cap_record_init). */
struct cap_ctl_size {
	unsigned cpus, memory_mib, root_mib, work_mib;
};

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
	 * name (absolute, resolved: cap_transfer_dirs_resolve, paths.h); none:
	 * both are refused. Borrowed. */
	const char *const *transfer_dirs;
	size_t ntransfer_dirs;
	/* The size of every identity's sandbox that sets none of its own,
	 * and the most an identity may ask for (a field 0: the record's
	 * default; no bound but the host's). */
	struct cap_ctl_size size, size_max;
	/* Every sandbox's commands run as root in its guest (`capsule serve
	 * --root`, `capsule mcp --root`: Docker inside); the operator's choice,
	 * never an identity's. Recorded when a sandbox is made, and again at a
	 * start when its record says otherwise. */
	bool tools_root;
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
	/* SNAPSHOT: the identity's running sandbox saved (cap_named_snapshot);
	 * FORK: that, and count new identities (the same agent) given a
	 * sandbox each that goes on from it (cap_named_fork). Both in a
	 * worker, after the identity's earlier calls: what they answered is
	 * in the snapshot. */
	CAP_CTL_SNAPSHOT, CAP_CTL_FORK,
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
	const char *root;	/* a FILE root (layout.h): CAP_GUEST_SOURCE or CAP_GUEST_WORK */
	const char *path;	/* relative, checked by the front end */
	const void *data;	/* WRITE; XFER put without host: the file's bytes */
	size_t len;
	uint32_t limit;	/* READ: most bytes (0: CAP_CTL_READ_MAX) */
	/* XFER: put copies host (or data) to root/path, get copies
	 * root/path to host. root is a FILE root (layout.h): a writable one
	 * for put, any for get; path is relative ("" only for a put of a
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
	/* FORK: how many (1 to CAP_FORK_MAX), and their peers (count of
	 * them), or NULL for "<peer>-<k>", the first k from 1 that names no
	 * identity with a sandbox. SNAPSHOT: its name, or NULL for the
	 * default (cap_snapshot_default_name). */
	unsigned count;
	const char *const *peers;
	const char *snapshot;
};

/* A fork's child: its identity and sandbox. */
struct cap_ctl_child {
	char agent[65], peer[65];
	char sandbox[CAP_NAME_MAX + 1];
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
	/* SNAPSHOT, FORK: the snapshot taken; FORK: the children. */
	const char *snapshot;
	const struct cap_ctl_child *children;
	size_t nchildren;
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

/* What an identity's size is (cap_ctl_set_size, cap_ctl_size_of). */
struct cap_ctl_size_out {
	struct cap_ctl_size size;	/* what its next start gets (every field set) */
	struct cap_ctl_size over;	/* its own override (fields 0: none) */
	/* The VM that runs now, when one does (cpus 0: none or unknown):
	 * its sizes differ from size only until its next start. */
	struct cap_ctl_size running;
	bool pending;	/* running differs from size in vCPUs or memory */
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

/* Give (agent, peer) an override of its sizes: want's fields that are
 * not 0 replace the recorded override's. It is checked now, against the
 * server's bounds (cfg.size_max) and the host's — -ERANGE with err naming
 * the field, the value and the bound, and nothing recorded — then kept
 * with the identity (its record, also before it has a sandbox) and
 * applied at its sandbox's next start: a running VM is not resized.
 * Disks are made once, at the sandbox's creation: a disk size other than
 * an existing sandbox's is refused (-EEXIST, naming both). out: what the
 * identity is now. No sandbox is created. */
int cap_ctl_set_size(struct cap_ctl *c, const char *agent, const char *peer,
		     const struct cap_ctl_size *want, struct cap_ctl_size_out *out,
		     struct cap_err *err);
/* An identity's sizes, as cap_ctl_set_size reports them; creates nothing. */
void cap_ctl_size_of(struct cap_ctl *c, const char *agent, const char *peer,
		     struct cap_ctl_size_out *out);
/* Check server defaults and bounds (capsule serve's --cpus, --max-cpus...):
 * within the host's fixed bounds, defaults within the maxima. -ERANGE
 * with err naming the option. */
int cap_ctl_size_cfg_check(const struct cap_controller_cfg *cfg, struct cap_err *err);

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
/* --- figures (docs/serve.md, "Metrics") ------------------------------------------ */

/* How a preparation run ended. */
enum cap_ctl_prep_outcome { CAP_CTL_PREP_OK, CAP_CTL_PREP_FAILED, CAP_CTL_PREP_CANCELLED };
#define CAP_CTL_PREP_NOUTCOMES 3
const char *cap_ctl_prep_outcome_name(enum cap_ctl_prep_outcome o);	/* "ok", "failed", "cancelled" */

/* Why the controller took a VM out of running on its own: idle for
 * idle_pause_ms (paused) or idle_stop_ms (stopped), stopped to make
 * room at capacity, killed for not ending a command in time. */
enum cap_ctl_evict {
	CAP_CTL_EVICT_IDLE_PAUSE, CAP_CTL_EVICT_IDLE_STOP, CAP_CTL_EVICT_CAPACITY,
	CAP_CTL_EVICT_UNRESPONSIVE,
};
#define CAP_CTL_NEVICT 4
/* "idle_pause", "idle_stop", "capacity", "unresponsive". */
const char *cap_ctl_evict_name(enum cap_ctl_evict e);

/* What the host holds for one sandbox and what its policy process saw
 * (the backend's usage; zero when it has none). Counters are since the
 * sandbox's VM last started. */
struct cap_ctl_usage {
	uint64_t memory_bytes;	/* PSS of its shim, hypervisor and policy process */
	bool net;	/* it has a policy process whose counters were read */
	uint64_t net_refused;	/* connections, queries and packets refused */
	uint64_t net_bytes_out;	/* from the guest to the outside */
	uint64_t net_bytes_in;	/* from the outside to the guest */
};

/* The controller's figures as plain numbers (the front end formats
 * them). Counters count from the controller's start; the net counters
 * add up each sandbox's across its restarts. */
struct cap_ctl_metrics {
	int64_t start_unix_ms;	/* when the controller started */
	/* Identities' sandboxes (as cap_ctl_list says them: from memory
	 * and records) and warm-pool ones, by state (NONE: unused). */
	unsigned sandboxes[CAP_VM_NSTATES];
	unsigned identities;	/* identities with a sandbox */
	unsigned pool_ready;	/* warm-pool sandboxes ready to be given */
	unsigned capacity;
	uint64_t prepares[CAP_CTL_PREP_NOUTCOMES];	/* preparation runs, by outcome */
	uint64_t evictions[CAP_CTL_NEVICT];
	uint64_t memory_bytes;	/* resident sandboxes' usage summed */
	unsigned memory_sandboxes;	/* how many of them it was read for */
	uint64_t net_refused, net_bytes_out, net_bytes_in;
};

/* Fill *out, reading each resident sandbox's usage now and every
 * identity's record (a few /proc and state files per sandbox: meant for
 * a scrape, not for every round). */
void cap_ctl_metrics(struct cap_ctl *c, struct cap_ctl_metrics *out);

/* The manual clock: move it by ms. -EPERM without manual_clock. */
int cap_ctl_advance(struct cap_ctl *c, int64_t ms, int64_t *now);
/* The lifecycle clock (ms). */
int64_t cap_ctl_now(const struct cap_ctl *c);


#endif
