/* capsule wire protocol v1 between the host and the guest agent, framed
 * over the virtio-serial port "capsule.agent". docs/protocol.md is the
 * specification; this header is its C form. Shared by host and guest;
 * depends on src/common only.
 *
 * Every frame: a 12-byte little-endian header
 *     u32 len     payload length, at most CAP_PROTO_MAX_PAYLOAD
 *     u16 type    enum cap_msg
 *     u16 flags   must be 0 in v1
 *     u32 stream  0 for the connection, else an exec stream chosen by the host
 * followed by len payload bytes. */
#ifndef CAP_PROTO_H
#define CAP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "err.h"

#define CAP_PROTO_VERSION 1
#define CAP_PROTO_HEADER 12
#define CAP_PROTO_MAX_PAYLOAD (64 * 1024)
/* Limits of one exec request (also bounded by the payload size). */
#define CAP_PROTO_MAX_ARGS 4096
#define CAP_PROTO_MAX_STREAMS 64
#define CAP_PROTO_MAX_STRING 1024

/* Text appended to a stream's output when the output cap was reached. The
 * number is the cap in bytes. */
#define CAP_TRUNCATION_MARKER "\n[capsule: output truncated at %u bytes]\n"

enum cap_msg {
	CAP_MSG_HELLO = 1,	/* both ways, stream 0: u32 version, u32 flags (CAP_HELLO_*; 0 from the
			 * agent), version text; the host first */
	CAP_MSG_EXEC = 2,	/* h->g: start a process (struct cap_exec_req) */
	CAP_MSG_STDIN = 3,	/* h->g: bytes for stdin; empty payload closes it */
	CAP_MSG_STDOUT = 4,	/* g->h: bytes the process wrote to stdout */
	CAP_MSG_STDERR = 5,	/* g->h: bytes the process wrote to stderr */
	CAP_MSG_EXIT = 6,	/* g->h: struct cap_exit; the stream is then closed */
	CAP_MSG_SIGNAL = 7,	/* h->g: u32 signal[, u32 enum cap_signal_scope]; without a scope, the process group */
	CAP_MSG_SHUTDOWN = 8,	/* h->g stream 0: sync, unmount, power off; g->h: ack */
	CAP_MSG_ERROR = 9,	/* g->h: i32 errno, text; stream 0 or a rejected exec */
	CAP_MSG_SETUP = 10,	/* h->g stream 0: struct cap_setup; g->h: i32 errno, text */
	CAP_MSG_RESIZE = 11,	/* h->g: u16 rows, u16 cols of a PTY command */
	CAP_MSG_PAUSE = 12,	/* client->shim stream 0: freeze the VM; shim->client: i32 errno, text */
	CAP_MSG_RESUME = 13,	/* client->shim stream 0: continue it; same answer */
	CAP_MSG_FILE = 14,	/* h->g: a file operation (struct cap_file_req) on a new stream */
	CAP_MSG_LISTENERS = 15,	/* g->h stream 0: u32 n, n x u16 TCP ports listened on (auto-publish) */
	CAP_MSG_SYNCING = 16,	/* g->h, empty: the stream's process ended; its writes are being
				 * flushed, EXIT follows (the host's deadline allows for it) */
	CAP_MSG_CLOCK = 17,	/* h->g stream 0: u64 realtime_ns, the host's wall clock after a
				 * resume (a paused guest's clock stood still); no answer */
	CAP_MSG_UPDATE = 18,	/* h->g, a new stream: change a container of the VM (struct
				 * cap_update: its limits, or remove it); answered like a
				 * FILE op: EXIT 0, or a STDERR line and EXIT start-failed */
	CAP_MSG_STATS = 19,	/* h->g, a new stream: string name, a container or "" for the
				 * VM; answered with STDOUT (a stats record) and EXIT 0, or
				 * a STDERR line and EXIT start-failed */
	CAP_MSG_CONNECT = 20,	/* h->g: u16 port, on a new stream: a TCP connection to
				 * 127.0.0.1:port in the guest (PortForward); its bytes
				 * are STDIN (to the guest) and STDOUT (from it), an
				 * empty one a half-close each way; EXIT code 0 once both
				 * ways ended, ERROR (errno) when it failed or broke */
	CAP_MSG_SNAPSHOT = 21,	/* client->shim stream 0: u32 flags (CAP_SNAPSHOT_*), the path of
				 * a directory to save the VM into; shim->client: i32 errno, text */
	CAP_MSG_MAX_ = CAP_MSG_SNAPSHOT,
};

/* Whom a SIGNAL reaches: the command's process group (the default, and
 * what a SIGNAL without a scope means), the command's process only (a
 * container's init, as runc kill does), or every process in the
 * command's cgroup (runc kill --all). */
enum cap_signal_scope {
	CAP_SIGNAL_GROUP = 0,
	CAP_SIGNAL_PROCESS = 1,
	CAP_SIGNAL_ALL = 2,
};

/* One parsed frame; payload points into the parser's input. */
struct cap_frame {
	uint16_t type;
	uint16_t flags;
	uint32_t stream;
	uint32_t len;
	const uint8_t *payload;
};

/* Parse one frame from the front of buf[0..n). Returns the number of bytes
 * the frame occupies (> 0), 0 when more bytes are needed, or -EMSGSIZE for
 * a length over CAP_PROTO_MAX_PAYLOAD, -EBADMSG for an unknown type or
 * nonzero flags. Never allocates. */
int cap_proto_parse(const uint8_t *buf, size_t n, struct cap_frame *f);

/* Append a frame to out. CAP_BUG_ON a payload over the maximum: callers
 * split data themselves. */
void cap_proto_put(struct cap_buf *out, enum cap_msg type, uint32_t stream,
		   const void *payload, size_t len);

#define CAP_EXEC_STDIN 0x1u	/* the host will send STDIN frames */
#define CAP_EXEC_PTY 0x2u	/* run on a pseudo-terminal (stdout carries both) */
/* Run with the request's credentials (uid, gid, groups; root allowed: the
 * VM is the boundary), rlimits and umask, and exactly the request's
 * environment (plus HOME from the guest's /etc/passwd, else "/", when it
 * has none): a container's process (docs/oci.md). Without it a command
 * runs as the tool user (1000) with the agent's default environment. */
#define CAP_EXEC_USER 0x4u
/* Report the end without making the command's writes durable first: by
 * default the agent flushes the writable disks (/work, /workspace, the
 * root's upper disk) to the host's disk files before EXIT, when they
 * hold anything unflushed (docs/protocol.md, "Durable results"). */
#define CAP_EXEC_NO_SYNC 0x8u
/* With CAP_EXEC_USER: a container section follows the user section
 * (struct cap_exec_container): the process is a container's of a pod (or
 * the init of a plain OCI container), in that container's cgroup, and,
 * with CAP_CTR_ROOT, in its own mount namespace rooted at the
 * container's folder (docs/protocol.md, "Containers"). */
#define CAP_EXEC_CONTAINER 0x10u

#define CAP_EXEC_MAX_GROUPS 32
#define CAP_EXEC_MAX_RLIMITS 16
/* One setrlimit of a CAP_EXEC_USER command. */
struct cap_exec_rlimit {
	uint32_t resource;	/* RLIMIT_* number */
	uint64_t soft, hard;	/* RLIM_INFINITY is ~0 */
};

/* An exec request. For encoding, every pointer is borrowed from the
 * caller. After cap_proto_exec_decode, every pointer is owned by the
 * struct and released by cap_exec_req_fini. */
struct cap_exec_req {
	char **argv;	/* argc strings, NULL-terminated after decode */
	uint32_t argc;
	char **env;	/* "NAME=value" strings, NULL-terminated after decode */
	uint32_t envc;
	char *cwd;	/* NULL or "" for the agent's default */
	uint32_t timeout_ms;	/* 0: no timeout */
	uint32_t output_cap;	/* bytes over stdout+stderr; 0: no cap */
	uint32_t flags;	/* CAP_EXEC_* */
	uint16_t rows, cols;	/* initial PTY size with CAP_EXEC_PTY */
	uint32_t pids_max;	/* the command's cgroup pids.max; 0: the agent's
				 * default (CAP_EXEC_PIDS_MAX_DEFAULT). An
				 * optional trailing field: sent only when
				 * nonzero, so older agents still parse the
				 * requests of hosts that leave it 0. */
	/* With CAP_EXEC_USER only: an optional section after pids_max
	 * (which is then sent, 0 if need be), docs/protocol.md. Inline
	 * arrays: nothing to free. */
	uint32_t uid, gid;
	uint32_t groups[CAP_EXEC_MAX_GROUPS];
	uint32_t ngroups;
	struct cap_exec_rlimit rlimits[CAP_EXEC_MAX_RLIMITS];
	uint32_t nrlimits;
	uint32_t umask;
	/* With CAP_EXEC_CONTAINER only (then not NULL): borrowed for
	 * encoding, owned after decoding (freed by cap_exec_req_fini). */
	struct cap_exec_container *ctr;
};

/* --- containers of a pod (proto-pod.c; docs/protocol.md, "Containers") --- */

/* A container's name: its folder below CAP_GUEST_CONTAINERS and its
 * cgroup. 1 to 64 of [A-Za-z0-9_.+-], the first a letter or digit. */
#define CAP_CTR_NAME_MAX 64
bool cap_proto_ctr_name_ok(const char *s);

/* Which of a cap_limits' values are given (the others stay as they are;
 * at a container's start, the kernel's default, "max"). */
#define CAP_LIMIT_MEMORY 0x1u	/* memory.max */
#define CAP_LIMIT_CPU 0x2u	/* cpu.max: quota and period */
#define CAP_LIMIT_CPU_WEIGHT 0x4u	/* cpu.weight */
#define CAP_LIMIT_PIDS 0x8u	/* pids.max */
#define CAP_LIMIT_ALL 0xfu
/* A value meaning no limit ("max"). */
#define CAP_LIMIT_NONE UINT64_MAX
struct cap_limits {
	uint32_t set;	/* CAP_LIMIT_* */
	uint64_t memory_max;	/* bytes, at least 4096, or CAP_LIMIT_NONE */
	uint64_t cpu_quota;	/* microseconds per period, 1000 or more, or CAP_LIMIT_NONE */
	uint64_t cpu_period;	/* microseconds, 1000 to 1000000 */
	uint64_t cpu_weight;	/* 1 to 10000 */
	uint64_t pids_max;	/* 1 or more, or CAP_LIMIT_NONE */
};
/* Whether l is one the decoder takes: known bits, each set value in its
 * range. */
bool cap_proto_limits_ok(const struct cap_limits *l);

/* A mount of the container's root, made by the agent in the container's
 * mount namespace, in order, before it switches into the root. */
enum cap_ctr_mount_kind {
	CAP_CTR_PROC = 1,	/* proc */
	CAP_CTR_SYSFS = 2,	/* sysfs */
	CAP_CTR_TMPFS = 3,	/* tmpfs with data (at /dev: filled with the usual nodes) */
	CAP_CTR_DEVPTS = 4,	/* a new devpts instance with data */
	CAP_CTR_MQUEUE = 5,	/* mqueue (skipped when the kernel has none) */
	CAP_CTR_CGROUP = 6,	/* cgroup2, the container's own subtree */
	CAP_CTR_SHM = 7,	/* the pod's /dev/shm, shared by its containers */
	CAP_CTR_VOLUME = 8,	/* a directory of the pod (emptyDir): data is its name
				 * (cap_proto_ctr_name_ok), shared by the containers
				 * that name it, not with the host */
	CAP_CTR_MOUNT_MAX_ = CAP_CTR_VOLUME,
};
#define CAP_CTR_MAX_MOUNTS 32
struct cap_ctr_mount {
	uint32_t kind;	/* enum cap_ctr_mount_kind */
	char destination[256];	/* as a SETUP tmpfs's (cap_proto_setup_tmpfs_ok) */
	char data[256];	/* mount data, "" for none */
	uint32_t flags;	/* within CAP_SETUP_TMPFS_FLAGS */
};

/* options of a container section. */
#define CAP_CTR_ROOT 0x1u	/* its own root, CAP_GUEST_CONTAINERS/NAME, in a new
				 * mount namespace (pivot_root); else the VM's root */
#define CAP_CTR_READONLY 0x2u	/* with CAP_CTR_ROOT: that root read-only */
/* Not the container's first process: a process in the running
 * container (its mount namespace and cgroup); no limits, no mounts. */
#define CAP_CTR_JOIN 0x4u

/* An EXEC's container section. The first process of a name (without
 * CAP_CTR_JOIN) makes the container's cgroup, CAP_GUEST_CONTAINERS'
 * sibling in the agent's tree, with the limits; later ones join it. */
struct cap_exec_container {
	char name[CAP_CTR_NAME_MAX + 1];
	uint32_t options;	/* CAP_CTR_* */
	struct cap_limits limits;
	struct cap_ctr_mount mounts[CAP_CTR_MAX_MOUNTS];
	uint32_t nmounts;
};

/* UPDATE: change a container (proto.h's CAP_MSG_UPDATE). */
enum cap_update_op {
	CAP_UPDATE_LIMITS = 1,	/* write the limits given (a container's name; "" refused) */
	CAP_UPDATE_REMOVE = 2,	/* kill its processes, remove its cgroup and its folder */
};
struct cap_update {
	uint32_t op;	/* enum cap_update_op */
	char name[CAP_CTR_NAME_MAX + 1];
	struct cap_limits limits;	/* LIMITS only */
};
/* -EINVAL for an op, name or limits the decoder would refuse. */
int cap_proto_update_encode(struct cap_buf *out, uint32_t stream, const struct cap_update *u);
/* -EBADMSG when malformed. */
int cap_proto_update_decode(const uint8_t *p, size_t n, struct cap_update *out);

/* STATS: the request names a container, or "" for the whole VM. */
int cap_proto_stats_req_encode(struct cap_buf *out, uint32_t stream, const char *name);
/* name: at least CAP_CTR_NAME_MAX + 1 bytes. -EBADMSG when malformed. */
int cap_proto_stats_req_decode(const uint8_t *p, size_t n, char *name, size_t len);

/* The answer: counters of the container's cgroup as (key, value) pairs,
 * keys of 1 to 63 of [a-z0-9_.] ("cpu.usage_usec", "memory.current",
 * "memory.stat.anon", "pids.current"...), at most CAP_STATS_MAX, each
 * key once. */
#define CAP_STATS_MAX 128
#define CAP_STATS_KEY_MAX 63
struct cap_stat {
	char key[CAP_STATS_KEY_MAX + 1];
	uint64_t value;
};
struct cap_stats {
	struct cap_stat v[CAP_STATS_MAX];
	uint32_t n;
};
/* Add key = value (a key already there is replaced; past CAP_STATS_MAX
 * or with a bad key, dropped): whether it was kept. */
bool cap_stats_put(struct cap_stats *s, const char *key, uint64_t value);
/* The value of key, or NULL. */
const uint64_t *cap_stats_get(const struct cap_stats *s, const char *key);
/* The record's bytes (u32 n, then per pair a string and a u64) appended
 * to out, for a STDOUT payload. */
void cap_proto_stats_encode(struct cap_buf *out, const struct cap_stats *s);
/* -EBADMSG for a record that is not exactly that, a bad or repeated key,
 * or n over CAP_STATS_MAX. */
int cap_proto_stats_decode(const uint8_t *p, size_t n, struct cap_stats *out);

/* The agent's pids.max for a command whose request leaves pids_max 0. */
#define CAP_EXEC_PIDS_MAX_DEFAULT 1024u

/* Encode req as an EXEC frame for stream into out. -E2BIG when it does
 * not fit one frame, -EINVAL for a string with a NUL byte or too many
 * arguments. out is unchanged on failure. */
int cap_proto_exec_encode(struct cap_buf *out, uint32_t stream,
			  const struct cap_exec_req *req);
/* Decode an EXEC payload into out (owned; free with cap_exec_req_fini).
 * Every count is checked against the bytes present before any
 * allocation. -EBADMSG with a message in err on malformed input; out is
 * untouched on failure. */
int cap_proto_exec_decode(const uint8_t *p, size_t n,
			  struct cap_exec_req *out, struct cap_err *err);
void cap_exec_req_fini(struct cap_exec_req *req);

enum cap_exit_kind {
	CAP_EXIT_CODE = 0,	/* value: exit status 0..255 */
	CAP_EXIT_SIGNAL = 1,	/* value: signal number */
	CAP_EXIT_START_FAILED = 2,	/* value: errno of the failed start */
};
#define CAP_EXIT_TIMED_OUT 0x1u
#define CAP_EXIT_TRUNCATED 0x2u
/* Everything written before the end is on the host's disk files: the
 * agent flushed the writable disks (or found nothing to flush) before
 * this EXIT. Absent with CAP_EXEC_NO_SYNC / CAP_FILE_NO_SYNC. */
#define CAP_EXIT_DURABLE 0x4u
/* The process was killed by the kernel's OOM killer: its container's
 * memory.max was reached (memory.events oom_kill went up while it ran). */
#define CAP_EXIT_OOM 0x8u

struct cap_exit {
	uint8_t kind;	/* enum cap_exit_kind */
	uint8_t flags;	/* CAP_EXIT_* */
	int32_t value;
	uint32_t duration_ms;	/* the command's own run, without the flush */
	uint16_t sync_ms;	/* time spent making it durable (capped at
				 * 65535; 0 when nothing needed a flush) */
};

void cap_proto_exit_encode(struct cap_buf *out, uint32_t stream,
			   const struct cap_exit *ex);
/* -EBADMSG on a wrong size, unknown kind, or out-of-range value. */
int cap_proto_exit_decode(const uint8_t *p, size_t n, struct cap_exit *out);

/* Shell-style status: code, 128+signal, 124 for a timeout, 126/127 for a
 * start failure (permission / not found). */
int cap_exit_status(const struct cap_exit *ex);

/* HELLO: version and the sender's version text (copied, NUL-terminated, cut to
 * vlen-1 bytes). -EBADMSG when shorter than 8 bytes. */
void cap_proto_hello_encode(struct cap_buf *out, const char *agent_version);
/* The host's HELLO with flags: CAP_HELLO_KEEP, from a host resuming a
 * snapshot, asks the agent to keep the commands an earlier host started
 * running, detached (their output dropped, their ends untold), rather
 * than end them. */
#define CAP_HELLO_KEEP 0x1u
void cap_proto_hello_encode_flags(struct cap_buf *out, const char *version, uint32_t flags);
/* The flags of a HELLO (0 when it has none); -EBADMSG when too short. */
int cap_proto_hello_flags(const uint8_t *p, size_t n, uint32_t *flags);
/* SNAPSHOT's flags: leave the VM paused once saved (else it goes on as
 * it was). */
#define CAP_SNAPSHOT_PAUSED 0x1u
int cap_proto_hello_decode(const uint8_t *p, size_t n, uint32_t *version,
			   char *agent_version, size_t vlen);

/* CLOCK: the host's wall clock (CLOCK_REALTIME) in ns. -EBADMSG unless
 * the payload is 8 bytes and the time after 1970. */
void cap_proto_clock_encode(struct cap_buf *out, int64_t realtime_ns);
int cap_proto_clock_decode(const uint8_t *p, size_t n, int64_t *realtime_ns);

/* ERROR: errno and a message (copied, NUL-terminated, cut to mlen-1,
 * non-printable bytes replaced). */
void cap_proto_error_encode(struct cap_buf *out, uint32_t stream, int errnum,
			    const char *msg);
int cap_proto_error_decode(const uint8_t *p, size_t n, int *errnum,
			   char *msg, size_t mlen);

/* FILE: read, list or write one path inside /source, /work or
 * /workspace, resolved by the agent with openat2(RESOLVE_BENEATH) as the
 * tool user. The answer is STDOUT frames, then EXIT: code 0 for a file's
 * bytes, code 1 for a directory listing ("d NAME", "f SIZE NAME", "l NAME"
 * or "o NAME" lines, sorted; TRUNCATED when more than limit entries),
 * START_FAILED with an errno and a STDERR line naming the path and the
 * rule otherwise.
 *
 * The streaming operations (MANIFEST, TAR_OUT, TAR_IN) run in a child
 * process of the agent as the tool user (setuid, in its own cgroup, like
 * a command), with no timeout and no output cap; the host sends cap 0 for
 * them. Their STDERR carries "capsule: ..." lines naming each path that
 * failed and why; EXIT is code 0 when everything was done, 1 when some
 * paths were refused or failed (each named on STDERR, the rest done), 2
 * when nothing could be done (the path is missing, not a directory...).
 *
 * MANIFEST: STDOUT is the manifest of the tree at root/path (path "" for
 * the whole root), in the text form of src/tree/tree.h (one line per
 * entry below the path, sorted by path bytes; the path itself is not
 * listed):
 *     TYPE MODE SIZE HASH PATH[ TARGET]\n
 * TYPE f (regular file), d (directory), l (symbolic link), o (anything
 * else); MODE the permission bits in octal (07777 mask); SIZE in bytes
 * (f: the file's, l: the target's length, d/o: 0); HASH the SHA-256 of
 * the content (f) or of the target text (l) in 64 lower-case hex digits,
 * "-" for d and o; PATH relative to root/path and TARGET (l only) with
 * every byte <= 0x20, '%' and 0x7f written as %XX (upper-case hex).
 *
 * TAR_OUT: STDOUT is a tar stream (POSIX ustar, with pax 'x' extended
 * headers for names over ustar's fields and sizes of 8 GiB or more) of
 * root/path: a file is one entry, a directory is itself and everything
 * below it, entries named from the path's last component ("dir",
 * "dir/a"; the root itself, path "", is named "."). Symbolic links are
 * entries (never followed); anything else is skipped with a STDERR line.
 * With CAP_TAR_PATHS_STDIN in limit, the host instead sends on STDIN
 * NUL-terminated paths relative to root/path, and each one is one entry
 * named by that relative path, not recursed into. With CAP_TAR_PREFIX,
 * each regular file is sent cut to its first CAP_TAR_PREFIX_BYTES (the
 * entry's size is what was sent): what a review needs to tell a binary
 * file from text without taking the whole of it. A file with holes
 * (fewer blocks than its size) is sent in the pax sparse format 1.0
 * (src/proto/tar.h): its holes do not cross, and the host writes them
 * as holes.
 *
 * TAR_IN: STDIN is a tar stream (as above; types regular file, directory
 * and symbolic link, others refused by name), extracted beneath root/path,
 * which must be a directory. Files are created with the entry's
 * permission bits (07777 less set-id bits) owned by the tool user, and
 * replace what is at their path (a directory is not replaced by a file).
 * With CAP_TAR_NO_REPLACE in limit, an existing path whose content
 * differs is left alone and reported on STDOUT as a line "conflict
 * PATH\n" (escaped as in MANIFEST), an identical one is skipped, and EXIT
 * is then 1. Only the roots layout.h marks CAP_GUEST_WRITABLE (/work and
 * /workspace) accept TAR_IN, only its CAP_GUEST_HOME (/work) WRITE. */
enum cap_file_op {
	CAP_FILE_READ = 1,
	CAP_FILE_LIST = 2,
	CAP_FILE_WRITE = 3,
	CAP_FILE_MANIFEST = 4,
	CAP_FILE_TAR_OUT = 5,
	CAP_FILE_TAR_IN = 6,
};
/* limit flags of TAR_OUT and TAR_IN. */
#define CAP_TAR_PATHS_STDIN 0x1u	/* TAR_OUT: the paths come on STDIN */
#define CAP_TAR_PREFIX 0x2u	/* TAR_OUT: files cut to CAP_TAR_PREFIX_BYTES */
/* What a NUL is looked for in to call a file binary (git looks at 8000). */
#define CAP_TAR_PREFIX_BYTES 8192u
#define CAP_TAR_NO_REPLACE 0x1u	/* TAR_IN: keep differing paths, report them */
/* TAR_IN into a CAP_GUEST_ROOTS root (a pod container's root), and only
 * there: run as root, give each entry the header's uid, gid and all of
 * its mode bits, and make hard links ('1') within the stream. */
#define CAP_TAR_OWNERS 0x2u
/* limit flag of WRITE and TAR_IN: report without flushing (as
 * CAP_EXEC_NO_SYNC). */
#define CAP_FILE_NO_SYNC 0x80000000u
/* limit flag of WRITE: a private file (a credential file's copy,
 * --secret-file): the missing directories above it made (0700), the file
 * written beside it and renamed over it (never seen half-written), mode
 * 0600. */
#define CAP_FILE_PRIVATE 0x40000000u

struct cap_file_req {
	uint32_t op;	/* enum cap_file_op */
	uint32_t limit;	/* READ: largest file in bytes; LIST/READ of a dir: entries;
			 * TAR_OUT/TAR_IN: CAP_TAR_* flags; WRITE, TAR_IN:
			 * CAP_FILE_NO_SYNC */
	uint32_t limit_entries;
	const char *root;	/* a CAP_GUEST_FILE_ROOT of layout.h */
	const char *path;	/* relative, no ".." component; "" for the root */
	const uint8_t *data;	/* WRITE: the content */
	size_t len;
};

/* Encode a FILE frame; -E2BIG over one frame, -EINVAL for a bad root or
 * path. Decode points into p (nothing allocated); -EBADMSG when malformed. */
int cap_proto_file_encode(struct cap_buf *out, uint32_t stream,
			  const struct cap_file_req *req);
int cap_proto_file_decode(const uint8_t *p, size_t n, struct cap_file_req *out,
			  char *root, size_t rlen, char *path, size_t plen);
/* Whether a path is acceptable for FILE: relative, no NUL, no ".."
 * component, at most 4096 bytes. */
bool cap_proto_file_path_ok(const char *path);

/* SETUP's tmpfs list (struct cap_setup's tmpfs), at most this long. */
#define CAP_SETUP_MAX_TMPFS 16
/* Linux's MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC | MS_NOATIME: the
 * only mount flags a tmpfs entry may carry (the wire holds MS_ values). */
#define CAP_SETUP_TMPFS_FLAGS 0x40fu
/* One tmpfs mount: an absolute destination (no "." or ".." component, no
 * "//", at most 255 bytes) and tmpfs's mount data ("mode=1777,size=64m",
 * at most 255 bytes, "" for none). */
struct cap_setup_tmpfs {
	char destination[256];
	char data[256];
	uint32_t flags;	/* within CAP_SETUP_TMPFS_FLAGS */
};
/* Whether t is one the decoder takes (the destination's rules above, the
 * flags within CAP_SETUP_TMPFS_FLAGS). The agent refuses more (its own
 * mount points). */
bool cap_proto_setup_tmpfs_ok(const struct cap_setup_tmpfs *t);

/* SETUP: what the agent mounts before any command runs. Disks are named
 * by their virtio-blk serial; an empty string means "none". With a root
 * image the agent builds an overlay root (image lower, ext4 upper) and
 * moves into it. Strings are borrowed for encoding and owned after
 * decoding (cap_setup_fini). */
struct cap_setup {
	char *root_image;	/* erofs, read-only lower layer */
	char *root_upper;	/* ext4, writable upper layer */
	char *work;	/* ext4 mounted at /work, nosuid,nodev */
	char *source;	/* erofs mounted at /source, ro,noexec,nosuid,nodev */
	/* ext4 mounted at /workspace (nosuid,nodev), a copy of a host
	 * project (docs/workspace.md). Sent in an optional section after the
	 * secrets section (which is then sent, empty if need be), only when
	 * not empty. The agent makes the tool user own the whole tree the
	 * first time (when the disk's root is not the tool user's). */
	char *workspace;
	char *hostname;
	int64_t realtime_ns;	/* the host's wall clock, set in the guest */
	uint8_t seed[32];	/* fresh entropy, credited to the guest's pool */
	/* Network (docs/network.md), all 0 without a NIC: eth0 gets
	 * net_addr/net_prefix and a default route via net_gateway, set over
	 * netlink (no DHCP); /etc/resolv.conf names net_dns; /etc/hosts maps
	 * host.capsule.internal to the gateway (both root's, 0644). With
	 * proxy_port, every command's environment gets HTTP_PROXY,
	 * HTTPS_PROXY (and lowercase) = http://GATEWAY:PORT and NO_PROXY =
	 * localhost,127.0.0.1,::1 unless the request sets them. Addresses in host
	 * byte order. */
	uint32_t net_addr, net_gateway, net_dns;
	uint8_t net_prefix;
	uint16_t proxy_port;
	/* Report TCP listeners on 0.0.0.0 or 127.0.0.1 with
	 * CAP_MSG_LISTENERS whenever their set changes (the first time right
	 * after SETUP); a port listened on 127.0.0.1 only is relayed from
	 * net_addr so that QEMU's forward reaches it. */
	bool auto_publish;
	/* The sandbox's CA certificate (PEM, NULL: none), for secrets
	 * (docs/network.md): written to /etc/ssl/certs/capsule-ca.pem, added
	 * to /etc/ssl/certs/ca-certificates.crt when the image has one, and
	 * a bundle of both at /etc/ssl/capsule-bundle.pem (all root's,
	 * 0644); every command's environment gets SSL_CERT_FILE,
	 * REQUESTS_CA_BUNDLE and GIT_SSL_CAINFO = the bundle and
	 * NODE_EXTRA_CA_CERTS = the CA's file, unless the request sets them. */
	char *ca_pem;
	/* "NAME=value" strings every command's environment gets unless the
	 * request sets NAME (a secret's placeholder). At most
	 * CAP_SETUP_MAX_ENV. */
	char **env;
	uint32_t envc;
	/* Remount the overlay root read-only once everything is set up,
	 * its /etc files written (an OCI config's root.readonly); /dev,
	 * /proc, /sys, /tmp, /run, /work, /workspace and /source are mounts
	 * of their own and keep their modes. Only with a root image: the
	 * agent refuses it on the initramfs root (EINVAL). Sent in the options section (u32 flags, bit 0) after the
	 * workspace section (which is then sent, its serial empty if need
	 * be, and so is the secrets section), only when set: a SETUP without
	 * it is byte for byte what older agents take, and one with it is
	 * refused by them rather than half applied. */
	bool root_readonly;
	/* Commands and file operations run as root (UID 0, GID 0) rather
	 * than as the tool user (UID 1000): a sandbox made with --root
	 * (docs/coding-agents.md, "Docker inside"), where the VM is the only
	 * boundary. Sent in the options section (flags bit 3, no data) only
	 * when set, so older agents refuse it rather than run as 1000. */
	bool tools_root;
	/* The VM was restored from a running sandbox's snapshot (a fork, or
	 * `create --from`): it was set up already, and this SETUP is its
	 * re-identification. The agent takes its clock, entropy, hostname,
	 * CA and variables (a new sandbox's placeholders) and touches no
	 * mount; refused (EINVAL) by an agent not set up yet. Sent in the
	 * options section (flags bit 4, no data) only when set. */
	bool forked;
	/* tmpfs mounts of the container (an OCI config's "mounts" of type
	 * tmpfs), made in the final root in order, before the read-only
	 * remount: each destination is made (mkdir -p, 0755 root's) unless
	 * it is or passes through a symlink, and must not be /, /proc, /sys,
	 * /dev, /work, /source or /workspace; a failure fails SETUP naming
	 * the path. Sent in the options section (flags bit 1, then u32 n, 1
	 * to CAP_SETUP_MAX_TMPFS, then per mount two strings and u32 flags)
	 * only when ntmpfs > 0. Borrowed for encoding, owned after decoding. */
	struct cap_setup_tmpfs *tmpfs;
	uint32_t ntmpfs;
	/* A static network (a pod's, docs/oci.md): eth0 takes net_mac,
	 * net_mtu, net_addr/net_prefix, the routes in routes[] (each on-link
	 * first, then those via a gateway) and a default route via
	 * net_gateway when it is not 0; the agent writes neither
	 * /etc/resolv.conf nor /etc/hosts (the engine's files are the
	 * container's) and gives no proxy variables. Sent in the options
	 * section (flags bit 2, after a tmpfs list) only when set; then
	 * net_addr must be set and net_dns and proxy_port 0. Inline: nothing
	 * to free. */
	bool net_static;
	uint8_t net_mac[6];
	uint32_t net_mtu;	/* 68 to 65535 */
	struct cap_setup_route {
		uint32_t dst;	/* host order, its host bits 0 */
		uint8_t dst_len;	/* 1 to 32: the default route is net_gateway */
		uint32_t gateway;	/* 0: on-link */
	} routes[16];
	uint32_t nroutes;	/* at most CAP_SETUP_MAX_ROUTES */
};
#define CAP_SETUP_MAX_ROUTES 16
#define CAP_SETUP_MAX_ENV 64
#define CAP_SETUP_ROOT_READONLY 0x1u	/* options section: flags bit 0 */
#define CAP_SETUP_TMPFS 0x2u	/* options section: flags bit 1, a tmpfs list follows */
#define CAP_SETUP_STATIC_NET 0x4u	/* options section: flags bit 2, a static network follows */
#define CAP_SETUP_TOOLS_ROOT 0x8u	/* options section: flags bit 3, commands as root */
#define CAP_SETUP_FORKED 0x10u	/* options section: flags bit 4, a restored snapshot's re-identification */
/* Whether s's static network is one the decoder takes (the rules above
 * struct cap_setup's net_static). */
bool cap_proto_setup_static_ok(const struct cap_setup *s);
int cap_proto_setup_encode(struct cap_buf *out, const struct cap_setup *s);
int cap_proto_setup_decode(const uint8_t *p, size_t n, struct cap_setup *out);
void cap_setup_fini(struct cap_setup *s);

/* LISTENERS: at most this many ports, sorted, no duplicates. */
#define CAP_PROTO_MAX_LISTENERS 1024
int cap_proto_listeners_encode(struct cap_buf *out, const uint16_t *ports, uint32_t n);
/* *ports is new (free it); -EBADMSG when malformed or unsorted. */
int cap_proto_listeners_decode(const uint8_t *p, size_t n, uint16_t **ports, uint32_t *count);

/* CONNECT: the guest's TCP port (not 0). -EBADMSG unless 2 bytes and
 * a port. */
void cap_proto_connect_encode(struct cap_buf *out, uint32_t stream, uint16_t port);
int cap_proto_connect_decode(const uint8_t *p, size_t n, uint16_t *port);

/* A disk serial or hostname: 1 to 20 of [A-Za-z0-9._-]. */
bool cap_proto_valid_name(const char *s);

const char *cap_msg_name(unsigned type);

#endif
