/* What the parts of capsule-agent (PID 1 of the guest) share. agent.c is
 * the loop and the core around it (agent-internal.h: boot, cgroups,
 * commands, SETUP, FILE); agent-net.c configures a NIC under a policy
 * and installs the sandbox's CA; agent-publish.c reports listeners and
 * relays loopback-only ones; agent-xfer.c runs the streaming FILE
 * operations (manifests and tar streams, with agent-sha256.c). */
#ifndef CAP_AGENT_H
#define CAP_AGENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <poll.h>
#include <sys/types.h>

#include "buf.h"
#include "proto.h"

#define TOOL_UID 1000
#define TOOL_GID 1000
/* The relays' user: not the tool user, whose commands could otherwise
 * signal or trace them (`kill -9 -1`). */
#define RELAY_UID 65534
#define RELAY_GID 65534

/* A line on the console, "capsule-agent: " first. */
void agent_log(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* --- the commands' environment (agent-exec.c) --- */

/* Every command's environment is one list of defaults, each replaced by a
 * request's variable of the same name. The list starts as the agent's
 * base (PATH, HOME, ...); SETUP adds to it. */
/* Back to the base alone (before a SETUP, and after a failed one). */
void agent_env_reset(void);
/* Add "NAME=value" to the defaults (copied), replacing a default of the
 * same NAME. CAP_BUG_ON a string without '=' or with an empty NAME. */
void agent_env_put(const char *var);

/* --- agent-durable.c: a call's end only once its writes are durable --- */

/* A writable disk mounted at mnt from the device node dev, called
 * shown in messages: flushed before each end reported after a change
 * to it. */
void agent_durable_add(const char *mnt, const char *dev, const char *shown);
/* The overlay root at mnt over the disk added at upper: its writes
 * count as changes to that disk (they reach it unseen). */
void agent_durable_add_overlay(const char *mnt, const char *upper);
/* Close what the disks are watched and flushed through (they can then be
 * unmounted) and forget them. */
void agent_durable_close(void);
/* Queue stream id's EXIT on out (others: whether commands other than
 * the one ending still run): at once when sync is false (no
 * CAP_EXIT_DURABLE), when there is no writable disk, or when nothing
 * changed since the last flush began (CAP_EXIT_DURABLE); otherwise
 * SYNCING now and the EXIT, with CAP_EXIT_DURABLE and sync_ms, once a
 * flush begun after this call has finished. */
void agent_durable_exit(struct cap_buf *out, uint32_t id, struct cap_exit *ex, bool sync,
			bool others, uint64_t since);
/* What a call records when it begins, for agent_durable_exit's since: a
 * flush that ends after it began and fails makes its end not durable
 * (with a STDERR line saying why). */
uint64_t agent_durable_seq(void);
/* Whether stream id's EXIT waits for a flush (the id is still in use). */
bool agent_durable_waiting(uint32_t id);
/* The descriptor to poll for a flush's end, -1 when none runs; on
 * POLLIN call agent_durable_ready. */
int agent_durable_fd(void);
void agent_durable_ready(struct cap_buf *out);
/* Shutting down, after a full sync(): flush the disks once more to learn
 * whether it worked, send every waiting EXIT (durable when it did), and
 * close as agent_durable_close. */
void agent_durable_shutdown(struct cap_buf *out);
/* A new host session: the waiting EXITs were the old one's. */
void agent_durable_forget(void);

/* --- agent-net.c --- */

/* Configure the guest's side of the NIC that SETUP describes (s->net_addr
 * != 0): lo and the Ethernet interface over rtnetlink, a default route,
 * /etc/resolv.conf and /etc/hosts, and the proxy variables commands get;
 * with a static network (a pod's) the MAC, MTU and routes, and no /etc
 * file or variable.
 * Run in the final root. On failure returns -errno with msg naming the
 * step. */
int agent_net_setup(const struct cap_setup *s, char *msg, size_t mlen);
/* A fork's new hostname in /etc/hosts (with a NIC not a pod's). */
int agent_net_rename(const struct cap_setup *s, char *msg, size_t mlen);
/* At boot, before HELLO: configure the NIC from "capsule.net=ADDR/N,GW"
 * on the kernel command line (the host puts it there for a VM with a
 * NIC), so that a template holds it ready and a SETUP with the same
 * values only writes /etc. Failures are left for SETUP to report. */
void agent_net_boot(void);
/* The sandbox's CA (SETUP's ca_pem) in the guest's trust store: with one,
 * /etc/ssl/certs/capsule-ca.pem, /etc/ssl/capsule-bundle.pem (the image's
 * bundle + the CA) and a marked block in the image's
 * /etc/ssl/certs/ca-certificates.crt (an older block replaced), and the
 * CA's variables (SSL_CERT_FILE, ...) among the commands' defaults;
 * without one, what an earlier boot left is removed. Run in the final
 * root. On failure returns -errno with msg naming the file. */
int agent_ca_setup(const struct cap_setup *s, char *msg, size_t mlen);

/* --- agent-publish.c --- */

/* Start reporting the guest's TCP listeners (auto-publish) and relaying
 * loopback-only ones from addr (host order; 0: no relays, a pod's static
 * network, whose host uses CONNECT); the first set goes out at the next
 * agent_publish_tick. */
void agent_publish_start(uint32_t addr);
/* Milliseconds until agent_publish_tick has work, -1 when not publishing
 * (the loop must not wake for it). */
int agent_publish_timeout(int64_t now);
/* When a scan is due: read /proc/net/tcp, start and stop relays, and
 * queue LISTENERS on out when the set differs from the last one sent. */
void agent_publish_tick(int64_t now, struct cap_buf *out);
/* A new host session: send the current set at once, changed or not. */
void agent_publish_resend(void);
/* A child was reaped; true when it was a relay. */
bool agent_publish_reaped(pid_t pid, int status);

/* --- agent-connect.c: CONNECT, the host's TCP streams to the guest's
 * 127.0.0.1 (PortForward) --- */

/* Open stream id's connection to 127.0.0.1:PORT (the CONNECT payload p);
 * a refusal or a failure goes out as ERROR on out. */
void agent_connect_open(uint32_t id, const uint8_t *p, size_t n, struct cap_buf *out);
/* Whether stream id is a connection. */
bool agent_connect_has(uint32_t id);
/* STDIN for stream id: true when it is a connection's (n 0: the host's
 * half-close). */
bool agent_connect_stdin(uint32_t id, const uint8_t *p, size_t n);
/* SIGNAL for stream id: true when it is a connection's, which is then
 * reset (ERROR ECONNABORTED on out). */
bool agent_connect_signal(uint32_t id, struct cap_buf *out);
/* Whether a connection holds so much from the host that the loop should
 * stop reading the host for now. */
bool agent_connect_busy(void);
/* The connections' descriptors to poll, at most max, with their stream
 * ids in ids; backlog: do not read the guest's sockets now. */
int agent_connect_poll(struct pollfd *pfd, uint32_t *ids, int max, bool backlog);
/* Handle the revents of those n pollfds, output on out. */
void agent_connect_events(const struct pollfd *pfd, const uint32_t *ids, int n, struct cap_buf *out);
/* A new host session, or the host gone: every connection closed. */
void agent_connect_reset(void);

/* --- agent-xfer.c: FILE MANIFEST, TAR_OUT, TAR_IN; the workspace --- */

/* In the child the agent forks for a streaming FILE operation, once it
 * is the tool user in its own cgroup with the pipes on fds 0-2 (fd 3 and
 * up are closed here): run req's operation (proto.h is the contract:
 * STDOUT on fd 1, "capsule: PATH: why" lines on fd 2, tar or paths on fd
 * 0) and _exit with 0, 1 or 2. req's strings are the child's copies. */
__attribute__((noreturn)) void agent_xfer_run(const struct cap_file_req *req);
/* At SETUP, as root, when the workspace disk's root directory dir is not
 * the tool user's: lchown every entry below it to TOOL_UID:TOOL_GID
 * (links not followed), then dir itself last, so that a boot cut short
 * does it again. Logs how many entries and what failed. */
void agent_workspace_own(const char *dir);

/* --- agent-sha256.c: SHA-256, FIPS 180-4 --- */

struct agent_sha256 {
	uint32_t h[8];
	uint64_t len;	/* bytes hashed */
	uint8_t buf[64];
	size_t n;	/* bytes waiting in buf */
};
void agent_sha256_init(struct agent_sha256 *c);
void agent_sha256_update(struct agent_sha256 *c, const void *p, size_t n);
void agent_sha256_final(struct agent_sha256 *c, uint8_t out[32]);
/* Whether the code gives the standard's digests for known vectors. */
bool agent_sha256_selftest(void);

#endif
