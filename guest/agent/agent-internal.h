/* What the files of the agent's core share (agent.c the loop,
 * agent-boot.c, agent-cgroup.c, agent-exec.c, agent-setup.c,
 * agent-file.c): the state, the command slots and the functions that
 * cross between them. Private to those files; the agent's other parts
 * see agent.h only. */
#ifndef CAP_AGENT_INTERNAL_H
#define CAP_AGENT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "agent.h"
#include "buf.h"
#include "proto.h"

/* After a command's leader exits, wait this long for its pipes to close
 * (children it left behind may hold them open), counting only time in
 * which they were read (see finish_if_done). */
#define DRAIN_GRACE_MS 250
/* Cgroups killed but not yet removed, across all commands. */
#define CG_PENDING_MAX 256
/* Kill a cgroup that has not emptied again after this long. */
#define CG_REKILL_MS 200

struct exec {
	uint32_t id;	/* 0: free slot */
	pid_t pid;
	int out_fd, err_fd, in_fd;
	struct cap_buf in_pending;
	bool in_close;	/* host closed stdin: close once pending is written */
	int64_t start_ms, deadline_ms, exit_ms;
	int64_t drain_ms;	/* DRAIN_GRACE_MS runs from here */
	uint32_t cap;
	uint64_t sent;
	bool truncated, timed_out, exited;
	bool pty;	/* out_fd is a PTY master; in_fd a dup of it */
	bool no_sync;	/* report the end without flushing the disks */
	uint64_t flush_seq;	/* agent_durable_seq() when it started */
	int wstatus;
	char cg[24];	/* its cgroup under /sys/fs/cgroup, "" once removed */
	int64_t cg_kill_ms;	/* when it was last killed, 0: not yet */
};

/* The agent's state (agent.c). */
struct agent {
	int port;
	bool connected;
	struct cap_buf in, out;
	struct exec execs[CAP_PROTO_MAX_STREAMS];
	int sigfd;
	bool setup_done;
	int upper_fd;	/* O_PATH of the root's upper disk mount, -1 if none */
	int cg_fd;	/* /sys/fs/cgroup with +pids for children; -1: no containment */
	uint64_t cg_seq;	/* names cmd-<seq>, never reused in one boot */
	char cg_pending[CG_PENDING_MAX][24];	/* killed, to be removed */
	size_t cg_npending;
	int64_t cg_kill_ms;	/* last time the pending ones were killed again */
};
extern struct agent A;

struct start_failure {
	int stage;	/* 0 chdir, 1 exec, 2 credentials, 3 cgroup, 4 rlimits */
	int errnum;
};

/* How a child starts: what commands and the streaming FILE operations
 * share (pipes, cgroup, the tool user, the exec slot). */
struct spawn {
	bool stdin_pipe;	/* a pipe fed by STDIN frames, else /dev/null */
	bool pty;	/* on a pseudo-terminal of rows x cols */
	uint16_t rows, cols;
	uint32_t pids_max, output_cap, timeout_ms;
	const char *name;	/* named by a start failure: the command, the path */
	const char *cwd;	/* named by a chdir failure */
	bool no_sync;	/* its end is reported without a flush */
	/* A CAP_EXEC_USER command's request: its uid, gid, groups, rlimits
	 * and umask; NULL: the tool user. */
	const struct cap_exec_req *user;
	/* In the child, as its user in its cgroup with fds 0-2 set:
	 * exec or run. Returns only when that failed, with *f set; errfd
	 * (close-on-exec) reports that, or closes to say all went well. */
	void (*run)(const void *ud, int errfd, struct start_failure *f);
	const void *ud;
};

/* --- boot and power-off (agent-boot.c) --- */

__attribute__((noreturn)) void power_off(void);
void setup_system(void);
bool cmdline_has(const char *word);
int open_port(void);
void setup_priority(void);
void do_shutdown(void);

/* --- output to the host (agent.c) --- */

void send_error(uint32_t id, int errnum, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void flush_out_wait(int timeout_ms);

/* --- cgroups (agent-cgroup.c) --- */

int write_at(int dirfd, const char *name, const char *text);
void setup_cgroups(void);
int cg_create(uint32_t pids_max, char *name, size_t len, int *dirfd);
void cg_kill(const char *name);
pid_t fork_into(int cgfd, bool *placed);
int cg_remove(const char *name);
void cg_dispose(const char *name);
void cg_sweep(int64_t now);
void cg_signal(const char *name, int sig);

/* --- commands (agent-exec.c) --- */

void send_output(struct exec *x, enum cap_msg type, const uint8_t *p, size_t n);
struct exec *exec_find(uint32_t id);
void exec_kill(struct exec *x);
void exec_signal(struct exec *x, int sig, uint32_t scope);
void close_fd(int *fd);
void exec_release(struct exec *x);
void spawn(uint32_t id, struct exec *x, const struct spawn *sp);
struct exec *free_slot(void);
void handle_exec(uint32_t id, const uint8_t *p, size_t n);
bool others_running(const struct exec *except);
void finish_if_done(struct exec *x, int64_t now, bool reading);
void kill_all_execs(void);
void reap(void);

/* --- SETUP (agent-setup.c) --- */

void handle_setup(const uint8_t *p, size_t n);

/* --- FILE (agent-file.c) --- */

void handle_file(uint32_t id, const uint8_t *p, size_t n);

#endif
