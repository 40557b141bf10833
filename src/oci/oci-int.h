/* What the OCI runtime's command line (oci-main.c) and its monitor
 * processes (oci-monitor.c) share: the state directory's layout, the
 * monitor's control socket and the error channel. Front-end code only. */
#ifndef CAP_OCI_INT_H
#define CAP_OCI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "oci.h"

/* Files in <root>/<id>/ besides state.json:
 *   monitor.sock   the container monitor's control socket (0600)
 *   started        written by the monitor once the process's EXEC went out
 *   exit           the process's exit status, written when it ended
 *   exec/<pid>-<start>.sock   one per exec monitor (kill --all, ps) */
#define CAP_OCI_MONITOR_SOCK "monitor.sock"
#define CAP_OCI_STARTED "started"
#define CAP_OCI_EXIT "exit"
#define CAP_OCI_EXEC_DIR "exec"

/* Report an error as runc does: "capsule-oci: MSG" on stderr and, with
 * --log, a line in the log file in its --log-format. */
__attribute__((format(printf, 1, 2))) void cap_oci_error(const char *fmt, ...);
/* The same, to the log file only (library warnings in a monitor, whose
 * stderr is the container's). */
void cap_oci_log_only(const char *level, const char *msg);

/* The start time of process pid (field 22 of /proc/PID/stat, clock
 * ticks since boot), 0 when it does not exist. With it, a recorded pid
 * is known to be the same process and not a reuse of its number. */
unsigned long long cap_oci_proc_start(pid_t pid);
/* Whether pid is alive and started at start. */
bool cap_oci_proc_same(pid_t pid, unsigned long long start);

/* A unix socket path in the directory dirfd, short enough for sun_path
 * however deep the directory is: "/proc/self/fd/DIRFD/NAME". */
void cap_oci_sock_path(int dirfd, const char *name, char *buf, size_t len);

/* Send one command line to the monitor listening at path (see
 * cap_oci_sock_path) and read its answer line (without "\n") into
 * answer: "ok[ ...]" or "error TEXT". 0, or -errno with err set:
 * -ENOENT or -ECONNREFUSED when nothing listens there (the monitor is
 * gone), -ETIMEDOUT when it did not answer within timeout_ms (it is
 * stopped or stuck), -EPIPE when it closed the connection unanswered. */
int cap_oci_monitor_call(const char *path, const char *line, char *answer,
			 size_t len, int timeout_ms, struct cap_err *err);

/* An exec monitor's socket in the container's exec directory, named by
 * its pid and start time. */
#define CAP_OCI_EXEC_SOCK_FMT "%d-%llu.sock"
/* The live exec monitors of the container in dir (exec/<pid>-<start>.sock
 * whose process is alive): their pids and, when starts is not NULL, their
 * start times (cap_oci_proc_start); at most max. */
size_t cap_oci_exec_monitors(const char *dir, pid_t *pids, unsigned long long *starts, size_t max);

/* One container process's monitor: create's (gate: held until "start")
 * or an exec's (started at once). Borrowed strings. */
struct cap_oci_monitor {
	const char *dir;	/* <root>/<id>, absolute */
	const char *sandbox;	/* the named sandbox */
	const char *cgroups_path;	/* joined when not NULL or "" */
	const struct cap_oci_process *proc;
	uint32_t pids_max;	/* the guest cgroup's pids.max, 0: the agent's */
	bool gate;	/* create's monitor: wait for "start" on monitor.sock */
	/* A monitor forked away from its caller (create, exec --detach):
	 * every descriptor but 0-2 and ready_fd closed, its own session. */
	bool detached;
	/* With proc->terminal: a new PTY whose master goes to this socket
	 * (SCM_RIGHTS); NULL: the caller's own terminal on fd 0 (exec -t),
	 * put in raw mode while the process runs. */
	const char *console_socket;
	/* "ok\n" or the error is written here once the monitor is ready (the
	 * gate listens, or the exec went out); closed then. -1: none. */
	int ready_fd;
};

/* Run a monitor until its process ends; returns the exit status to exit
 * with (the process's, 128+N for signal N, 127 when not found; 137 when
 * the sandbox died under it), or 1 when it never got ready (the error
 * then went to ready_fd, else to cap_oci_error). */
int cap_oci_monitor_run(const struct cap_oci_monitor *m);

#endif
