/* What the OCI runtime's command line (oci-main.c), its verbs (one file
 * each, oci-<verb>.c, over oci-common.c) and its monitor processes
 * (oci-monitor.c) share: the state directory's layout, the monitor's
 * control socket and the error channel (oci-error.c). Front-end code
 * only. */
#ifndef CAP_OCI_INT_H
#define CAP_OCI_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <jansson.h>

#include "err.h"
#include "log.h"
#include "named.h"
#include "oci.h"

struct option;

/* runc's global flags (oci-main.c). */
struct cap_oci_flags {
	const char *root;
	const char *log;
	bool log_json;
	bool systemd_cgroup;
	bool debug;
};
extern struct cap_oci_flags cap_oci_flags;

/* The guest cgroup's pids.max of a container without a pids limit. */
#define CAP_OCI_PIDS_MAX_DEFAULT 32768
/* How long a monitor may take to answer: it serves its socket at all
 * times (its output held for a slow reader) but in its last seconds,
 * while it stops the VM; delete --force ends one that does not. */
#define CAP_OCI_START_TIMEOUT_MS 30000
#define CAP_OCI_KILL_TIMEOUT_MS 5000
#define CAP_OCI_DELETE_TIMEOUT_MS 3000

/* Files in <root>/<id>/ besides state.json:
 *   monitor.sock   the container monitor's control socket (0600)
 *   started        written by the monitor once the process's EXEC went out
 *   exit           the process's exit status, written when it ended
 *   exec/<pid>-<start>.sock   one per exec monitor (kill --all, ps) */
#define CAP_OCI_MONITOR_SOCK "monitor.sock"
#define CAP_OCI_STARTED "started"
#define CAP_OCI_EXIT "exit"
#define CAP_OCI_EXEC_DIR "exec"
/* Written by a container's monitor when the guest's OOM killer ended its
 * process (its exit status is then 137): "1\n". */
#define CAP_OCI_OOM "oom"

/* Report an error as runc does: "capsule-oci: MSG" on stderr and, with
 * --log, a line in the log file in its --log-format. */
__attribute__((format(printf, 1, 2))) void cap_oci_error(const char *fmt, ...);
/* cap_oci_error of err's message; returns the exit code 1. */
int cap_oci_fail(const struct cap_err *err);
/* The same, to the log file only (library warnings in a monitor, whose
 * stderr is the container's). */
void cap_oci_log_only(const char *level, const char *msg);
/* The sink cap_cli_oci installs for the library's lines (cap_log_set). */
void cap_oci_log_sink(void *ud, enum cap_log_level level, const char *line);
/* The time now in RFC 3339, as runc writes it (oci-error.c). */
void cap_oci_rfc3339(char *buf, size_t len, bool nanos);

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
	/* The EXEC's container section (the container's name and cgroup; a
	 * pod's container: its root, mounts and limits; an exec: JOIN),
	 * NULL: none. Borrowed. */
	const struct cap_exec_container *ctr;
	/* A container of a pod: the VM is the pod's (its sandbox
	 * container's), never started or stopped by this monitor. */
	bool pod_member;
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

/* ---- pods (oci-pod.c; docs/oci.md, "Pods") ---------------------------- */

enum cap_oci_pod_role { CAP_OCI_POD_NONE, CAP_OCI_POD_SANDBOX, CAP_OCI_POD_CONTAINER };
/* What config.json's CRI annotations make of a container. */
struct cap_oci_pod {
	enum cap_oci_pod_role role;
	char sandbox_id[1100];	/* io.kubernetes.cri.sandbox-id */
	char pod[300];	/* "namespace/name", for messages ("" when not given) */
	/* The guest's container: its name (always); for a pod's container
	 * its root, mounts and limits. */
	struct cap_exec_container ctr;
	/* A pod's container's bind-mounted files, copied in; owned. */
	struct cap_oci_file *files;
	size_t nfiles;
};
/* Read BUNDLE/config.json's role (container id, for the guest's name);
 * for a pod's container also its mounts (refusing a directory volume
 * other than emptyDir and a device) and its limits. 0 or -errno. */
int cap_oci_pod_load(const char *bundle, const char *id, struct cap_oci_pod *out, struct cap_err *err);
void cap_oci_pod_fini(struct cap_oci_pod *p);
/* The guest's name of container id: id itself when it is one
 * (cap_proto_ctr_name_ok), else "c" and 40 hex digits of its hash. */
void cap_oci_ctr_name(const char *id, char out[CAP_CTR_NAME_MAX + 1]);
/* runc's linux.resources JSON (config.json's, or update --resources)
 * into guest limits: memory.limit, cpu.quota/period/shares, pids.limit. */
int cap_oci_limits_json(json_t *res, const char *file, struct cap_limits *out, struct cap_err *err);
/* Copy a pod's container's rootfs, then its bind-mounted files (through
 * a tree at seed, made here), into the running pod VM sandbox. */
int cap_oci_pod_copy_in(const char *sandbox, const struct cap_oci_pod *p, const char *rootfs,
			const char *seed, struct cap_err *err);
/* Remove container name (its processes, cgroup and folder) from the pod
 * VM sandbox; nothing to do when that VM is not running. */
int cap_oci_pod_remove(const char *sandbox, const char *name, struct cap_err *err);

/* The guest's name of container st: "" for a pod's sandbox (its VM). */
struct cap_oci_state;
const char *cap_oci_guest_name(struct cap_oci_state *st);
/* STATS of st's cgroup in its running VM (oci-update.c). */
int cap_oci_guest_stats(struct cap_oci_state *st, struct cap_stats *out, struct cap_err *err);
/* runc's events.Stats object of them, a new reference (oci-events.c). */
json_t *cap_oci_stats_json(const struct cap_stats *s);

/* ---- the verbs (oci-common.c) ----------------------------------------- */

/* A container's state directory and its state.json, loaded
 * (cap_oci_state_load); its dir and j are freed by cap_oci_state_fini. */
struct cap_oci_state {
	char id[1100];
	char *dir;	/* owned: <root>/<id> */
	json_t *j;	/* owned: state.json */
	pid_t pid;	/* the monitor standing for the process */
	unsigned long long start;	/* its start time (cap_oci_proc_start) */
	char sandbox[CAP_NAME_MAX + 1];
	const char *status;	/* static: creating, created, running, paused, stopped */
};

/* runc's rule for container ids. */
bool cap_oci_id_ok(const char *id);
/* The named sandbox of container id under --root, into out. */
void cap_oci_sandbox_name(const char *id, char out[CAP_NAME_MAX + 1]);
/* <root>/<id>, the caller's to free. */
char *cap_oci_dir(const char *id);
/* The string member k of o, borrowed from o; "" when there is none. */
const char *cap_oci_jstr(json_t *o, const char *k);
/* Whether dir/name exists. */
bool cap_oci_exists_at(const char *dir, const char *name);
/* Load container id's state into st (the caller's; its fields freed by
 * cap_oci_state_fini, also after a failure): 0, or -ENOENT with err set
 * when it has none. Sets CAPSULE_HOME to the home it was made in. */
int cap_oci_state_load(const char *id, struct cap_oci_state *st, struct cap_err *err);
void cap_oci_state_fini(struct cap_oci_state *st);
/* Write j (borrowed) as dir/state.json, atomically: 0 or -errno. */
int cap_oci_state_write(const char *dir, json_t *j, struct cap_err *err);
/* runc's state object of st, a new reference. */
json_t *cap_oci_state_json(struct cap_oci_state *st);
/* Print v (stolen: released here) as one JSON text: the exit code. */
int cap_oci_print_json(json_t *v, size_t flags);
/* Send line to the monitor socket name in dir (or dir/sub) and read its
 * answer into ans: 0 for "ok[ ...]"; -EINVAL with the monitor's error
 * text in err, or cap_oci_monitor_call's -errno. */
int cap_oci_call(const char *dir, const char *sub, const char *name, const char *line,
		 char *ans, size_t len, int timeout_ms, struct cap_err *err);
/* Write pid to path as runc does (--pid-file): 0 or -errno. */
int cap_oci_write_pid_file(const char *path, pid_t pid, struct cap_err *err);
/* Wait for the forked monitor pid's word on fd (closed here): 0 for
 * "ok", else negative with its error in err (pid reaped then). */
int cap_oci_wait_ready(int fd, pid_t pid, struct cap_err *err);
/* Remove a container's sandbox (sandbox, NULL or "": none), the cgroups
 * in cg (NULL: none) and its directory dir: 0, or the first error. */
int cap_oci_destroy(const char *dir, const char *sandbox, const struct cap_oci_cgroups *cg, struct cap_err *err);
/* Pause (pause) or resume the sandbox through its shim: 0 or -errno. */
int cap_oci_vm_op(const char *sandbox, bool pause, struct cap_err *err);

/* The verbs' long options without a short one. */
enum {
	CAP_OCI_OPT_BUNDLE = 0x100, CAP_OCI_OPT_PID_FILE, CAP_OCI_OPT_CONSOLE, CAP_OCI_OPT_NO_PIVOT,
	CAP_OCI_OPT_NO_KEYRING, CAP_OCI_OPT_PRESERVE, CAP_OCI_OPT_DETACH, CAP_OCI_OPT_PROCESS,
	CAP_OCI_OPT_CWD, CAP_OCI_OPT_GIDS, CAP_OCI_OPT_NNP, CAP_OCI_OPT_CAP, CAP_OCI_OPT_LABEL,
	CAP_OCI_OPT_APPARMOR, CAP_OCI_OPT_FORMAT, CAP_OCI_OPT_IGNORE_PAUSED,
};

/* One option c (with its argument arg, or NULL) of a verb: 0 to go on,
 * else the exit code. */
typedef int (*cap_oci_opt_fn)(void *ud, int c, const char *arg);
/* Parse a verb's options (getopt_long with shorts and opts, each given
 * to cb; --help prints usage): -1 to go on with the operands at optind,
 * else the exit code. */
int cap_oci_parse(int argc, char **argv, const char *shorts, const struct option *opts,
		  const char *usage, cap_oci_opt_fn cb, void *ud);
/* The one operand of a verb with only --help (argv, borrowed), or NULL
 * with the exit code in *rc. */
const char *cap_oci_one_id(int argc, char **argv, const char *usage, int *rc);
/* cap_oci_parse of a verb whose one option is the flag --FLAG/-SHORTC,
 * *set saying whether it was given. */
int cap_oci_flag_verb(int argc, char **argv, const char *flag, char shortc, const char *usage,
		      bool *set);
/* --preserve-fds ARG: 0 for "0", else 1 (the exit code) with the error
 * reported. */
int cap_oci_preserve_ok(const char *arg);
/* The cap_oci_opt_fn of --format (table or json) into ud[0] and --quiet
 * into ud[1] (ud: const char *[2]). */
int cap_oci_format_opt(void *ud, int c, const char *arg);

/* The verbs, argv[0] the verb's name: the exit code. */
int cap_oci_cmd_create(int argc, char **argv);
int cap_oci_cmd_start(int argc, char **argv);
int cap_oci_cmd_state(int argc, char **argv);
int cap_oci_cmd_kill(int argc, char **argv);
int cap_oci_cmd_delete(int argc, char **argv);
int cap_oci_cmd_pause(int argc, char **argv);
int cap_oci_cmd_resume(int argc, char **argv);
int cap_oci_cmd_exec(int argc, char **argv);
int cap_oci_cmd_ps(int argc, char **argv);
int cap_oci_cmd_list(int argc, char **argv);
int cap_oci_cmd_features(int argc, char **argv);
int cap_oci_cmd_update(int argc, char **argv);
int cap_oci_cmd_events(int argc, char **argv);

#endif
