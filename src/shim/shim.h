/* containerd-shim-capsule-v2: containerd's shim v2 over capsule-oci (or
 * any runc-compatible runtime), one shim per pod. Private to src/shim. */
#ifndef CAP_SHIM_H
#define CAP_SHIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "shim.pb-c.h"
#include "ttrpc.h"

/* containerd's shim logging, to the bundle's `log` FIFO (or stderr). */
__attribute__((format(printf, 2, 3))) void shim_log(const char *level, const char *fmt, ...);

/* What a handler answers: a grpc code and message on failure. */
struct shim_status {
	int code;
	char msg[1024];
};
__attribute__((format(printf, 3, 4))) int shim_fail(struct shim_status *st, int code, const char *fmt, ...);

enum proc_state { PROC_CREATED, PROC_RUNNING, PROC_PAUSED, PROC_STOPPED };

/* A copy from one fd to another in a thread: a container's stdio between
 * containerd's FIFOs and the runtime's pipes or console. */
struct shim_copy;

/* A process of a container: its init (exec_id "") or an exec. */
struct shim_proc {
	char *exec_id;
	char *stdin_path, *stdout_path, *stderr_path;
	bool terminal;
	char *spec_json; /* an exec's process spec (JSON), until it starts */
	size_t spec_len;
	pid_t pid;
	enum proc_state state;
	bool exited;
	int exit_status;
	struct timespec exited_at;
	int console;      /* the PTY master, -1 */
	int stdin_keep;   /* our writer on the stdin FIFO, until CloseIO; -1 */
	int waiters;      /* Waits on it */
	bool starting;    /* a Start is running: its exit event waits */
	bool exit_deferred;
	struct shim_copy *copies[3];
	struct shim_proc *next;
};

struct shim_container {
	char *id;
	char *bundle;
	char *runtime; /* the runtime binary */
	char *root;    /* its --root */
	bool no_pivot;
	bool mounted;  /* rootfs mounts made by us under bundle/rootfs */
	bool busy;     /* a create or delete running: not found */
	bool oom_sent; /* TaskOOM published */
	int refs;      /* handlers using it outside mu (Delete waits for them) */
	struct shim_proc init;
	struct shim_proc *execs;
	struct shim_container *next;
};

/* The shim's global state; mu guards it, cond is broadcast at each exit
 * and each change of a process. */
struct shim {
	pthread_mutex_t mu;
	pthread_cond_t cond;
	char *namespace_;
	char *address;       /* containerd's -address */
	char *ttrpc_address; /* TTRPC_ADDRESS: where events go */
	char *socket_path;   /* ours */
	struct shim_container *containers;
	bool shutdown;
};
extern struct shim shim;

/* shim-run.c: running the runtime; the reaper. */
/* The runtime for a new container: $CAPSULE_SHIM_RUNTIME, else the
 * options' binary name, else capsule-oci beside this binary, else on
 * PATH. A new string. */
char *shim_runtime_binary(const char *from_options);
/* The runtime's --root: the options' root, else $CAPSULE_SHIM_ROOT or
 * /run/containerd/capsule, then /NAMESPACE. A new string. */
char *shim_runtime_root(const char *from_options);
/* Run the runtime for container c with args (NULL-ended), after its
 * global flags. stdio: fds for its stdin/stdout/stderr, -1 for /dev/null
 * (stdin) or a capture (stdout/stderr, whose text, the log's last error
 * else, names a failure). input: bytes on stdin (when stdin_fd is -1).
 * Output captured in *out (new, NUL-ended) when out is given. 0 on exit
 * status 0, else fills st. */
int shim_runtime(const struct shim_container *c, const char *const *args, int stdin_fd, int stdout_fd,
		 int stderr_fd, const char *input, size_t input_len, char **out, struct shim_status *st);
/* Start the reaper thread (SIGCHLD must be blocked in every thread). */
void shim_reaper_start(void);
/* Claim pid for p: record the exit if the reaper has seen it. Under mu. */
void shim_claim_pid(struct shim_container *c, struct shim_proc *p, pid_t pid);
/* Publish p's TaskExit (under mu). */
void shim_publish_exit(struct shim_container *c, struct shim_proc *p);
/* Wait (under mu) until p has exited, at most timeout_ms (-1: for ever).
 * true when it has. */
bool shim_wait_exit(struct shim_proc *p, int timeout_ms);
/* Read a pid file: the pid or -errno. */
int shim_read_pid(const char *path);

/* shim-io.c: stdio. */
/* Set up p's stdio for a runtime call: *in, *out, *err are what the
 * runtime gets (the ends of pipes whose other ends copy to and from the
 * FIFOs; -1 for none). For a terminal, *console_sock is a new console
 * socket's path (its listener in *listener) instead. 0 or fills st. */
int shim_io_prepare(struct shim_proc *p, int fds[3], char **console_sock, int *listener, struct shim_status *st);
/* After the runtime call: close the runtime's ends; for a terminal,
 * receive the PTY master on the listener and copy it to and from the
 * FIFOs. 0 or fills st. */
int shim_io_started(struct shim_proc *p, int fds[3], const char *console_sock, int listener, bool ok,
		    struct shim_status *st);
/* Close p's stdio: CloseIO's stdin, or all at delete (ending the copies
 * after draining what is there). */
void shim_io_close_stdin(struct shim_proc *p);
/* p exited: a terminal's copies end after draining (no join). */
void shim_io_exited(struct shim_proc *p);
void shim_io_close(struct shim_proc *p);

/* shim-events.c: publishing to containerd. */
void shim_events_start(void);
/* Queue an event (packed message of descriptor d) for topic. */
void shim_publish(const char *topic, const ProtobufCMessage *m);
/* Wait until the queue is empty, at most timeout_ms. */
void shim_events_drain(int timeout_ms);

/* shim-task.c: the task service. */
/* Handle one request of containerd.task.v2.Task: method, its payload;
 * the answer's payload in *out (new; *out_len) or st. */
void shim_task_call(const char *method, const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len,
		    struct shim_status *st);

/* shim-stats.c: runc's `events --stats` JSON to cgroups v2 Metrics,
 * packed into a new buffer (*len). NULL with st filled on bad input. */
uint8_t *shim_stats_metrics(const char *json, size_t *len, struct shim_status *st);

/* shim-mount.c: the rootfs mounts containerd gives Create. */
int shim_mount_rootfs(const char *target, Containerd__Types__Mount **m, size_t n, struct shim_status *st);
void shim_unmount_all(const char *target);

/* Timestamps as gogo's non-nullable stdtime: a zero time is year 1. */
void shim_timestamp(Google__Protobuf__Timestamp *t, const struct timespec *ts);

#endif
