/* The policy process's parts (netd.h): the loop, the control channel,
 * published ports and the log (netd.c); TCP connections, the HTTP proxy
 * and the upstream proxy (netd-conn.c, netd-proxy.c); DNS (netd-dns.c);
 * the interception of secrets' TLS connections (netd-tls.c).
 * One thread, one poll loop; nothing here blocks after start-up. */
#ifndef CAP_NET_NETD_INT_H
#define CAP_NET_NETD_INT_H

#include <netinet/in.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "buf.h"
#include "dns.h"
#include "netd.h"
#include "policy.h"

#define NETD_BUF 65536		/* each way, per connection */
#define NETD_MAX_CONNS 1024
#define NETD_HEAD_MAX 16384	/* a proxy request head, an upstream proxy's reply head */
#define NETD_TIMEOUT_MS 10000	/* dial, upstream proxy, connector, an intercepted
				   request's head, an unread answer */
#define NETD_HEAD_MS 10000	/* default head phase (cap_netd_config.head_timeout_ms) */
#define NETD_IDLE_MS 300000	/* default idle limit (cap_netd_config.idle_timeout_ms) */
#define NETD_LINGER_MS 2000	/* reading what a refused client still sends */
#define NETD_DNS_TRY_MS 2000	/* one try of an upstream query (two tries) */
#define NETD_DNS_PENDING 256
#define NETD_DNS_QUERY_MAX 1500	/* a guest's query */
#define NETD_DNS_GUEST_Q (12 + 255 + 4)	/* a header and one uncompressed question */
#define NETD_NAMES 4096		/* address -> name entries */
#define NETD_NAME_TTL_MIN 60
#define NETD_NAME_TTL_MAX 86400
#define NETD_MAX_LISTENERS 512	/* published ports */
#define NETD_DGRAM_MAX 65536	/* one datagram or netlink read at a time */

struct icpt;		/* netd-tls.c */
struct netd_tls;	/* netd-tls.c */

/* A byte queue of NETD_BUF bytes: data[off, len). */
struct nbuf {
	uint8_t *owned_data;
	size_t off, len;
};

enum conn_kind {
	CONN_DIRECT,	/* the guest to an address of the outside */
	CONN_HOST,	/* the guest to the gateway (127.0.0.0/8 here) */
	CONN_PROXY,	/* the guest to the HTTP proxy (gateway:3128) */
	CONN_PUBLISH,	/* a client of a published port to the guest */
	CONN_DNS,	/* the guest's DNS over TCP (to 10.0.2.3:53, here 127.0.0.1:53) */
};

enum conn_state {
	ST_HEAD,	/* proxy: reading the request head */
	ST_RESOLVE,	/* proxy: the target's name is being resolved */
	ST_CONNECTOR,	/* publish: waiting for the connector's socket */
	ST_DIAL,	/* b is connecting */
	ST_UPSTREAM,	/* b is the upstream proxy: CONNECT sent, its answer awaited */
	ST_SPLICE,	/* bytes flow both ways */
	ST_REPLY,	/* an error answer to the guest, then close */
	ST_DNS,		/* DNS over TCP: one query at a time */
	ST_TLS,		/* intercepted: TLS with the guest and with the server (netd-tls.c) */
};

struct conn {
	uint64_t id;		/* unique for the process's life */
	unsigned slot;
	enum conn_kind kind;
	enum conn_state state;
	int a;			/* accepted: the guest, or a published port's client */
	int b;			/* dialed (or from the connector), -1 before */
	int64_t deadline;	/* ms, 0: none (ST_SPLICE, ST_TLS: the idle limits apply) */
	int64_t active;		/* ms: the last byte either way, or its start */
	bool moved;		/* a byte moved either way (ST_SPLICE, ST_TLS) */

	/* Where b goes: the destination's address, port and the name it is
	 * known by ("" for none), the route. */
	uint32_t addr;
	uint16_t port;
	char name[254];
	bool via_upstream;
	char desc[300];		/* "tcp A:P" or "proxy CONNECT host:port", for the log */

	/* Proxy: a CONNECT (answered 200 once through) or a forwarded
	 * request; the candidate addresses of the target's name. */
	bool connect;
	uint32_t cand[CAP_DNS_MAX_ADDRS];
	unsigned ncand, icand;
	char refusal[400];	/* the last candidate's refusal, for the 403 */
	int dial_error;		/* the last candidate's dial error */

	/* The upstream proxy's CONNECT request, sent before up. */
	char pre[600];
	size_t pre_off, pre_len;

	struct nbuf up;		/* a -> b */
	struct nbuf down;	/* b -> a */
	bool a_eof, b_eof;	/* read end of file */
	bool a_shut, b_shut;	/* shutdown(SHUT_WR) done */
	bool sniff;		/* up's first bytes are to be checked (TLS SNI) */
	bool dns_waiting;	/* DNS over TCP: a query is being answered */
	struct icpt *owned_icpt;	/* ST_TLS: the interception (netd-tls.c), else NULL */
};

struct listener {
	int fd;
	uint32_t bind;
	uint16_t host_port, guest_port;
};

/* Where a guest's DNS query came from, for its answer. */
struct dns_client {
	bool tcp;
	struct sockaddr_in udp;	/* !tcp: the datagram's source */
	uint64_t conn_id;	/* tcp: its connection */
	unsigned conn_slot;
};

struct dns_pending {
	bool used;
	uint16_t up_id;		/* the ID sent upstream */
	int64_t deadline;
	unsigned tries;
	bool for_conn;		/* a proxy target's resolution, else a guest's query */
	uint64_t conn_id;	/* for_conn */
	unsigned conn_slot;
	struct dns_client client;	/* !for_conn: where the query came from */
	uint16_t guest_id;
	char name[CAP_DNS_NAME_SIZE];	/* the question, for matching the reply */
	uint16_t qtype;
	uint8_t msg[NETD_DNS_QUERY_MAX];	/* as sent upstream (built here) */
	size_t len;
	/* The guest's header and question as it sent them, echoed in the
	 * answer it gets (its ID, its letter case). */
	uint8_t guest_q[NETD_DNS_GUEST_Q];
	size_t guest_len;
};

struct dns_name {
	uint32_t addr;
	int64_t expires;	/* ms; 0: free */
	uint64_t seq;		/* insertion order: the oldest goes first */
	char name[254];
};

struct upstream_proxy {
	bool set;		/* one of the variables is set */
	bool usable;		/* parsed and its address known; else every dial fails */
	char text[300];		/* host:port as configured, for the log */
	struct sockaddr_in sa;
	char *owned_no_proxy;	/* NULL: none */
};

/* The log's limits (netd_log): a token bucket for lines, counting what
 * it suppressed, and a size cap when the log is a regular file. */
struct netd_logger {
	bool is_socket;		/* asked not to block by MSG_DONTWAIT */
	bool regular;		/* a regular file: its size is capped */
	bool full;		/* the cap was reached: nothing more is written */
	unsigned since_check;	/* lines since the last fstat */
	int64_t tokens;		/* thousandths of a line */
	int64_t refilled;	/* ms of the last refill */
	uint64_t suppressed;	/* lines dropped since the last summary */
	int64_t summary_at;	/* ms of the last summary (at most one a second) */
};

struct netd {
	const struct cap_netd_config *cfg;
	struct netd_logger log;
	/* The counters: the shared file's mapping, else local. */
	struct cap_netd_counters *counters;
	struct cap_netd_counters local_counters;
	struct cap_net_policy *owned_policy;	/* in force */

	struct conn *conns[NETD_MAX_CONNS];
	unsigned nconns, max_conns;
	int64_t head_ms, idle_ms;	/* cfg's timeouts, or the defaults */
	uint64_t next_id;

	struct listener listeners[NETD_MAX_LISTENERS];
	unsigned nlisteners;

	/* The connector: requests written in order, answered in order. */
	bool connector_dead;
	uint8_t cq_out[2 * NETD_MAX_CONNS];
	size_t cq_out_len;
	struct {
		uint64_t conn_id;
		unsigned slot;
	} cq[NETD_MAX_CONNS];
	unsigned cq_head, cq_count;

	/* DNS */
	int resolver;		/* UDP connected to the host's resolver, -1: none */
	char resolver_text[32];
	/* Why there is no resolver, said once: at the first query that
	 * needs one (a sandbox that never resolves a name is not told). */
	char resolver_problem[200];
	bool resolver_problem_said;
	struct dns_pending pending[NETD_DNS_PENDING];
	struct dns_name names[NETD_NAMES];
	uint64_t name_seq;
	uint8_t *owned_dgram;	/* NETD_DGRAM_MAX bytes, for each read of DNS or NFLOG */

	struct upstream_proxy proxy;
	struct netd_tls *owned_tls;	/* with secrets: what interception needs, else NULL */

	/* Secrets' values given since the start by "secret K HEX" control
	 * lines (a credential file changed on the host), in place of cfg's;
	 * NULL: cfg's. Each intercepted connection takes a copy. */
	char *owned_values[CAP_NET_MAX_SECRETS];
	size_t value_lens[CAP_NET_MAX_SECRETS];

	/* Control lines (wiped: a "secret" line holds a value). */
	struct cap_buf control;
	struct cap_lines control_lines;
	bool stop;
};

/* netd.c */
/* One line on cfg->log_fd, never blocking, within the limits below. */
__attribute__((format(printf, 2, 3))) void netd_log(struct netd *d, const char *fmt, ...);
#define NETD_LOG_RATE 20	/* lines per second, */
#define NETD_LOG_BURST 100	/* after a burst of this many */
#define NETD_LOG_SIZE_MAX ((int64_t)64 << 20)	/* a regular file's size cap */
#define NETD_LOG_SIZE_EVERY 100	/* lines between two checks of the size */
/* Start the log's limits for cfg->log_fd (a full bucket). */
void netd_log_init(struct netd *d, int64_t now);
/* One formatted line (len bytes, ending in '\n') at time now: written,
 * or counted as suppressed. A summary of the suppressed lines comes
 * before the next line that flows again, at most once a second. */
void netd_log_line(struct netd *d, int64_t now, const char *line, size_t len);
/* From the loop: the summary of lines suppressed a second ago or more
 * once the flood is over; *next (0: none) lowered to when it is due. */
void netd_log_tick(struct netd *d, int64_t now, int64_t *next);
const struct cap_net_policy *netd_policy(const struct netd *d);
/* The connection's socket to guest port, through the connector. */
void netd_connector_request(struct netd *d, struct conn *c, uint16_t guest_port);

/* netd-conn.c */
/* A connection in a free slot; when every slot is taken, the connection
 * idle the longest is closed for it if it has been idle head_ms or more
 * (logged); NULL when none has (the caller refuses fd and logs it). */
struct conn *conn_new(struct netd *d, enum conn_kind kind, int fd);
void conn_free(struct netd *d, struct conn *c, bool reset);
struct conn *conn_find(struct netd *d, unsigned slot, uint64_t id);
void conn_accept_guest(struct netd *d, int listen_fd);
void conn_events(struct netd *d, struct conn *c, short ra, short rb);
void conn_poll_events(const struct conn *c, short *ea, short *eb);
void conn_timeout(struct netd *d, struct conn *c);
/* When c's phase ends, ms (0: never): its deadline, else, spliced or
 * intercepted, head_ms after its start while no byte has moved either
 * way, idle_ms after the last byte once one has. */
int64_t conn_due(const struct netd *d, const struct conn *c);
/* b is set (dialing or connected): go on as ST_DIAL. */
void conn_dialing(struct netd *d, struct conn *c);
/* Dial c->addr-or-candidate: decide, choose the route, connect. 0 (in
 * progress), -EACCES (refused, rule in v), or -errno. */
int conn_dial(struct netd *d, struct conn *c, uint32_t addr, const char *name,
	      struct cap_net_verdict *v);
/* The reason phrase of an HTTP status netd answers with (400, 403, 413,
 * 421, 431, 501, 502, 504, 505; any other is "Bad Gateway"). Static. */
const char *status_text(int status);
/* Fail c: an HTTP status to a proxy client, a reset to others. */
void conn_fail(struct netd *d, struct conn *c, int status, const char *body);
/* The socket to the destination is up (and through the upstream proxy). */
void conn_established(struct netd *d, struct conn *c);
void nbuf_put(struct nbuf *b, const void *p, size_t n);
/* The answer (len bytes; NULL: none, end the connection) to the query a
 * DNS-over-TCP connection is waiting for. */
void conn_dns_reply(struct netd *d, struct conn *c, const uint8_t *m, size_t len);

/* netd-proxy.c */
void proxy_head(struct netd *d, struct conn *c);
/* The target's name resolved: naddr addresses (0 when it failed, rcode). */
void proxy_resolved(struct netd *d, struct conn *c, const uint32_t *addr, unsigned naddr,
		    unsigned rcode);
/* Try the next candidate address of a proxy request. */
void proxy_dial_next(struct netd *d, struct conn *c);
int upstream_init(struct netd *d);
/* Whether a connection to addr (known by name, or "") goes through the
 * upstream proxy. */
bool upstream_applies(const struct netd *d, uint32_t addr, const char *name);
/* Read the upstream proxy's answer in c->down: 1 through, 0 more, -1 failed (logged). */
int upstream_answer(struct netd *d, struct conn *c);

/* netd-dns.c */
int dns_init(struct netd *d);
void dns_fini(struct netd *d);
void dns_guest_query(struct netd *d);
/* One query (len bytes) read from a DNS-over-TCP connection: answered
 * through conn_dns_reply, now or later, exactly once. */
void dns_tcp_query(struct netd *d, struct conn *c, const uint8_t *msg, size_t len);
void dns_upstream_reply(struct netd *d);
void dns_timeouts(struct netd *d, int64_t now, int64_t *next);
/* Resolve name (A) for connection c: 0, and proxy_resolved follows
 * (from the loop, never from within this call); -errno when no query
 * could be sent (-ENETUNREACH: no resolver; -EBUSY: too many). */
int dns_resolve(struct netd *d, struct conn *c, const char *name);
/* The names the guest was answered addr with, newest first (at most max);
 * returns how many. */
unsigned dns_names_for(struct netd *d, uint32_t addr, const char **out, unsigned max);

/* netd-seccomp.c: no_new_privs and the policy process's syscall filter
 * for the calling thread, for good (netd.h, cap_netd_config.seccomp). 0,
 * -ENOTSUP on an architecture it has no filter for, or -errno. */
int netd_seccomp(void);

/* netd-tls.c: a TLS connection whose name is one of some secret's hosts
 * (netd.h) is intercepted once its ClientHello is read and the server's
 * socket is up: netd answers the guest's handshake with a certificate for
 * the name (minted, signed by the sandbox's CA, cached), makes its own to
 * the server (SNI the name, verified against the trust store), passes
 * ONE request through rewrite.h and its response back, then ends the
 * guest's connection (close_notify, then ST_REPLY's linger; a reset
 * without close_notify when the server failed after part of its response
 * went to the guest, logged "the response of HOST:PORT was cut short").
 * Both sides
 * are memory BIOs pumped from the loop: nothing blocks. */
#define NETD_LEAVES 256		/* minted certificates kept, the least recently used evicted */
#define NETD_LEAF_DAYS 30	/* at most; never past the CA's own end */

/* With cfg->nsecrets: the CA's key and certificate, the trust store, a
 * new leaf key and both contexts. -1 when one cannot be made (logged: the
 * process must not start); 0, d->owned_tls set (NULL without secrets). */
int intercept_init(struct netd *d);
void intercept_fini(struct netd *d);
/* Whether connections to name (lowercase, no trailing dot) are
 * intercepted: one of some secret's hosts. */
bool intercept_wanted(const struct netd *d, const char *name);
/* Intercept c for name: c is ST_SPLICE with the guest's ClientHello (and
 * whatever followed it) in up, b connected to the server (or through
 * the upstream proxy). c becomes ST_TLS; false when c was ended (logged). */
bool intercept_start(struct netd *d, struct conn *c, const char *name);
void intercept_poll_events(const struct conn *c, short *ea, short *eb);
void intercept_events(struct netd *d, struct conn *c, short ra, short rb);
/* c's deadline passed: the handshakes did not end in time, or the guest
 * did not send its request's head within NETD_TIMEOUT_MS of them, or did
 * not read its waiting answer for NETD_TIMEOUT_MS (logged; c ends with a
 * reset). */
void intercept_timeout(struct netd *d, struct conn *c);
/* Free c->owned_icpt, wiping every buffer that may have held a value. */
void intercept_free(struct conn *c);

#endif
