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
/* A cgroup's name below /sys/fs/cgroup: "cmd-N", or "ctr-NAME/cmd-N" for
 * a command of a container (NAME: CAP_CTR_NAME_MAX bytes). */
#define CG_NAME_MAX (CAP_CTR_NAME_MAX + 32)

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
	char cg[CG_NAME_MAX];	/* its cgroup under /sys/fs/cgroup, "" once removed */
	int ctr;	/* the container it runs in (agent-ctr.c's slot + 1), 0: none */
	bool ctr_init;	/* it is that container's first process */
	uint64_t oom_base;	/* the container's oom_kill count when it started */
	int64_t cg_kill_ms;	/* when it was last killed, 0: not yet */
	/* Started by a host before a snapshot was restored (HELLO's
	 * CAP_HELLO_KEEP): it runs on, its output is read and dropped, its
	 * end is told to nobody; id is then CAP_DETACHED_ID + its slot,
	 * never a host's. */
	bool detached;
};
#define CAP_DETACHED_ID 0x80000000u

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
	char cg_pending[CG_PENDING_MAX][CG_NAME_MAX];	/* killed, to be removed */
	size_t cg_npending;
	int64_t cg_kill_ms;	/* last time the pending ones were killed again */
	/* Whom commands and file operations run as: the tool user, or root
	 * in a sandbox made with --root (SETUP's tools_root). */
	uid_t cmd_uid;
	gid_t cmd_gid;
};
extern struct agent A;

struct start_failure {
	int stage;	/* 0 chdir, 1 exec, 2 credentials, 3 cgroup, 4 rlimits,
			 * 5 the container's root, 6 a mount of the container */
	int errnum;
	char what[128];	/* stage 6: the mount's destination */
};

/* A command of a container, as ctr_prepare sets it up for spawn. */
struct ctr_start {
	const struct cap_exec_container *ctr;	/* the request's section, borrowed */
	int nsfd;	/* CAP_CTR_JOIN: the namespace to enter, -1: none */
	char cg[CAP_CTR_NAME_MAX + 8];	/* its cgroup, ctr-NAME: the command's goes below */
	int slot;	/* agent-ctr.c's slot + 1 */
	bool init;	/* the container's first process */
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
	/* A container's command (agent-ctr.c), NULL: none. */
	const struct ctr_start *ctr;
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
/* One read of a small file at dirfd into buf (len bytes with its NUL):
 * the bytes read, or -errno. */
ssize_t read_at(int dirfd, const char *name, char *buf, size_t len);
void setup_cgroups(void);
/* parent: "" for /sys/fs/cgroup itself, else a cgroup below it. */
int cg_create(const char *parent, uint32_t pids_max, char *name, size_t len, int *dirfd);
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
/* A restored snapshot's new host (HELLO's CAP_HELLO_KEEP): every command
 * goes on, detached. */
void detach_all_execs(void);
void reap(void);

/* --- a pod's containers (agent-ctr.c) --- */

/* Before spawn of an EXEC with a container section: its container made
 * (the first process: cgroup and limits) or found (CAP_CTR_JOIN). 0, or
 * -errno with msg saying why. */
int ctr_prepare(const struct cap_exec_req *req, struct ctr_start *cs, char *msg, size_t mlen);
/* The first process of cs's container started as pid. */
void ctr_started(const struct ctr_start *cs, pid_t pid);
/* A process of container slot (struct exec's ctr) ended. */
void ctr_ended(int slot, pid_t pid);
/* The container's memory.events oom_kill count (0 when unknown). */
uint64_t ctr_oom_kills(int slot);
/* In the child, as root, before it takes its user: the container's
 * namespace (a new one rooted at its folder, or the one it joins) and
 * cwd made in it. 0, or -1 with *f set. */
int ctr_enter(const struct ctr_start *cs, const char *cwd, struct start_failure *f);
void handle_update(uint32_t id, const uint8_t *p, size_t n);
void handle_stats(uint32_t id, const uint8_t *p, size_t n);

/* --- SETUP (agent-setup.c) --- */

void handle_setup(const uint8_t *p, size_t n);

/* --- FILE (agent-file.c) --- */

void handle_file(uint32_t id, const uint8_t *p, size_t n);

#endif
