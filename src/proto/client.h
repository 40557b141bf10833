/* Host side of the agent protocol, without I/O: it turns requests into
 * frames in an output buffer and bytes received from the guest into
 * callbacks. Everything the guest sends is treated as hostile: lengths,
 * types, stream ids and counts are checked and a violation ends the
 * connection with a message. */
#ifndef CAP_PROTO_CLIENT_H
#define CAP_PROTO_CLIENT_H

#include "proto.h"

/* After a command's timeout, how long the host waits for the guest to
 * report its end before it gives up on the guest (and on its VM). */
#define CAP_SANDBOX_EXEC_GRACE_MS 5000
/* Once the guest says a command's writes are being flushed (SYNCING),
 * how long from then the host waits for its EXIT, whatever the command's
 * timeout had left: a flush of what a command wrote just before its
 * timeout must not be cut by the host stopping the VM. */
#define CAP_SANDBOX_SYNC_GRACE_MS 120000

struct cap_exec_events {
	/* Output of stream id; fd is 1 (stdout) or 2 (stderr). p is borrowed
	 * for the duration of the call. */
	void (*output)(void *ud, uint32_t id, int fd, const uint8_t *p,
		       size_t n);
	/* Called once per started exec when it ends. On a normal end ex is
	 * set and msg is NULL; when the agent rejected the request ex is
	 * NULL and errnum/msg say why. */
	void (*done)(void *ud, uint32_t id, const struct cap_exit *ex,
		     int errnum, const char *msg);
	/* Optional: the process of stream id has ended and the guest is
	 * flushing its writes; done() follows. An owner keeping a deadline
	 * moves it to at least CAP_SANDBOX_SYNC_GRACE_MS from now. */
	void (*syncing)(void *ud, uint32_t id);
};

struct cap_client_stream {
	uint32_t id;	/* 0: free slot */
	uint32_t cap;	/* output cap asked for, 0 for none */
	uint64_t out_bytes;
	bool truncated;	/* the host dropped bytes over the cap */
	bool connect;	/* a CONNECT stream: an empty STDOUT reaches output (n 0) */
	const struct cap_exec_events *ev;
	void *ud;
};

struct cap_client {
	struct cap_buf in;	/* bytes received, not yet a whole frame */
	struct cap_buf out;	/* frames to send to the guest */
	bool hello;
	uint32_t version;
	char agent_version[128];
	bool shutdown_acked;
	enum { CAP_SETUP_NONE, CAP_SETUP_PENDING, CAP_SETUP_DONE } setup_state;
	int setup_errno;	/* with CAP_SETUP_DONE: 0 or why it failed */
	char setup_msg[256];
	/* The guest's TCP listeners (LISTENERS, auto-publish): the latest
	 * set, and whether it changed since the owner last looked (the owner
	 * clears the flag). */
	uint16_t *listeners;
	uint32_t nlisteners;
	bool listeners_changed;
	/* PAUSE/RESUME sent to a shim and not answered yet, and the answer. */
	unsigned vm_ops_pending;
	int vm_op_errno;
	uint32_t next_id;
	unsigned nactive;
	struct cap_client_stream streams[CAP_PROTO_MAX_STREAMS];
};

void cap_client_init(struct cap_client *c);
void cap_client_fini(struct cap_client *c);
/* c (initialised) becomes the client of a channel another client took
 * past HELLO and SETUP (a spare of `capsule spares`): nothing queued,
 * the agent's version as that HELLO gave it, stream ids from next_id. */
void cap_client_adopt(struct cap_client *c, uint32_t version, const char *agent_version, uint32_t next_id);

/* Feed bytes received from the guest; complete frames are dispatched to
 * the callbacks of their streams. Returns 0, or a negative errno with err
 * set when the guest broke the protocol: the caller must then drop the
 * connection (the client is left in a state where only _fini is valid). */
int cap_client_feed(struct cap_client *c, const void *data, size_t n,
		    struct cap_err *err);

/* Queue an exec. ev and ud are borrowed until done() is called. On
 * success *id is the new stream id. -EBUSY when CAP_PROTO_MAX_STREAMS
 * execs are running, -ENOTCONN before HELLO, -E2BIG/-EINVAL for a request
 * that cannot be encoded. */
int cap_client_exec(struct cap_client *c, const struct cap_exec_req *req,
		    const struct cap_exec_events *ev, void *ud, uint32_t *id,
		    struct cap_err *err);
/* Queue a FILE operation; like cap_client_exec (the answer arrives as
 * output and done). cap bounds what the host accepts back. */
int cap_client_file(struct cap_client *c, const struct cap_file_req *req,
		    uint32_t cap, const struct cap_exec_events *ev, void *ud,
		    uint32_t *id, struct cap_err *err);
/* Queue an UPDATE (a container's limits, or its removal) or a STATS
 * request (a container, or "" for the VM); answered like a FILE op
 * (STATS: its record on STDOUT, cap_proto_stats_decode). */
int cap_client_update(struct cap_client *c, const struct cap_update *u,
		      const struct cap_exec_events *ev, void *ud, uint32_t *id,
		      struct cap_err *err);
int cap_client_stats(struct cap_client *c, const char *name,
		     const struct cap_exec_events *ev, void *ud, uint32_t *id,
		     struct cap_err *err);
/* Queue a CONNECT to the guest's 127.0.0.1:port (docs/protocol.md):
 * the guest's bytes arrive through ev->output (fd 1; n 0 once the guest
 * side has half-closed), the end through ev->done (an EXIT of code 0
 * once both ways ended, else errnum: the connection was refused or
 * broke); bytes for the guest go with cap_client_stdin (n 0: half-close)
 * and cap_client_signal aborts it (reset). Like cap_client_exec
 * otherwise. */
int cap_client_connect(struct cap_client *c, uint16_t port, const struct cap_exec_events *ev,
		       void *ud, uint32_t *id, struct cap_err *err);
/* Queue stdin bytes for a stream (split into frames); n == 0 closes its
 * stdin. -ENOENT for a stream that is not open. */
int cap_client_stdin(struct cap_client *c, uint32_t id, const void *p,
		     size_t n);
/* Queue a signal for a stream's process group. */
int cap_client_signal(struct cap_client *c, uint32_t id, int sig);
/* Queue a signal for whom scope says (CAP_SIGNAL_GROUP is the call
 * above). */
int cap_client_signal_scope(struct cap_client *c, uint32_t id, int sig,
			    enum cap_signal_scope scope);
/* Queue a PTY window size change for a stream. */
int cap_client_resize(struct cap_client *c, uint32_t id, uint16_t rows,
		      uint16_t cols);
/* Queue SETUP (mounts); setup_state becomes DONE when the guest answers,
 * with setup_errno/setup_msg saying whether it worked. -EINVAL for a
 * disk name the protocol does not allow. */
int cap_client_setup(struct cap_client *c, const struct cap_setup *s);
/* Queue CLOCK: the host's wall clock now, for the guest to take. */
void cap_client_clock(struct cap_client *c);
/* Queue PAUSE or RESUME (control socket of a shim only); vm_ops_pending
 * counts them until the shim answers. */
void cap_client_vm_op(struct cap_client *c, enum cap_msg op);
/* Queue SNAPSHOT (control socket of a shim only): save the VM into the
 * directory dir (flags CAP_SNAPSHOT_*); counted in vm_ops_pending, its
 * answer in vm_op_errno like PAUSE's. */
void cap_client_snapshot(struct cap_client *c, const char *dir, uint32_t flags);
/* Right after cap_client_init, before anything else is queued: the
 * HELLO asks the agent to keep what runs (CAP_HELLO_KEEP: a restored
 * snapshot). */
void cap_client_keep(struct cap_client *c);
/* Queue the shutdown request; shutdown_acked becomes true when the guest
 * confirms that its file systems are synced. */
void cap_client_shutdown(struct cap_client *c);

#endif
