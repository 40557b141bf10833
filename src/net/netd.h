/* The policy process of one sandbox with a network (DESIGN §9,
 * docs/network.md). The engine forks it once the VM's network namespace
 * and its nftables rules exist, confines it (its own unprivileged user,
 * the VM's cgroup, no_new_privs, rlimits, only the descriptors below) and
 * calls cap_netd_main through the sandbox layer. It lives in the
 * namespace capsule runs in: every connection it dials out starts there.
 *
 * It serves, until its control descriptor closes:
 *  - TCP connections of the guest, redirected by nftables to tcp_listen:
 *    the original destination (SO_ORIGINAL_DST) decides (cap_net_decide,
 *    with the name this process answered for that address over DNS);
 *    127.0.0.1:CAP_NET_PROXY_PORT is the HTTP proxy (CONNECT and
 *    absolute-form requests, one request per connection, targets with
 *    control characters or whitespace refused); every other 127.0.0.0/8
 *    destination is the host (the gateway). A TLS ClientHello whose SNI
 *    holds control characters or whitespace ends the connection before
 *    anything is forwarded. It dials out itself (nonblocking), re-checking
 *    every address it dials; through the host's proxy by CONNECT when one
 *    is configured and NO_PROXY does not exempt the target, never
 *    falling back to a direct dial.
 *  - DNS queries on dns: names outside the policy get NXDOMAIN; allowed
 *    ones are forwarded to the host's resolver (the first nameserver of
 *    resolv_conf), and the A records of the answer are remembered
 *    (address → name, until their TTL, at least 60 s) for later decisions.
 *    A TCP connection to 127.0.0.1:53 (the guest's DNS address or the
 *    gateway, port 53) is not dialed out: it is DNS over TCP, answered
 *    here under the same policy.
 *  - Published ports: connections accepted on publish_fds (and on the
 *    listeners that "publish" control lines add) are joined to the guest
 *    through the connector.
 *
 * Every refused connection or query is one line on log_fd, with the rule
 * that refused it, always in this form:
 *   "capsule net: refused tcp 198.51.100.7:80: no rule allows 198.51.100.7:80"
 *   "capsule net: refused dns evil.example: no rule names it"
 *   "capsule net: refused proxy CONNECT \"a\r\nb:80\": control character in the target"
 * Errors dialing out ("capsule net: cannot reach 203.0.113.10:80:
 * Connection refused", "capsule net: upstream proxy 10.9.9.9:3128
 * unreachable: ...") are logged too. Nothing allowed is logged unless
 * verbose. So is every packet the kernel refused in the VM's namespace
 * (nflog, as cap_nflog_describe words it):
 *   "capsule net: refused tcp 198.51.100.7:80: no rule allows 198.51.100.7:80 ..."
 *   "capsule net: dropped udp 203.0.113.10:9999: only DNS to 10.0.2.3 leaves the sandbox over UDP"
 *   "capsule net: dropped icmp 203.0.113.10 (type 8): ICMP never leaves the sandbox" */
#ifndef CAP_NET_NETD_H
#define CAP_NET_NETD_H

#include <stdbool.h>
#include <stdint.h>

#include "policy.h"
#include "secret.h"

struct cap_netd_config {
	const char *name;	/* the sandbox's, for log lines */
	const struct cap_net_policy *policy;	/* initial policy (copied) */
	int tcp_listen;	/* listening, in the VM's namespace, nonblocking */
	int dns;	/* UDP bound to 127.0.0.1:53 in the VM's namespace */
	/* Unix stream socket to the connector, a helper inside the VM's
	 * namespace: write a u16 port (little-endian); it answers one byte
	 * (0 or an errno) with, on 0, a socket connected to 127.0.0.2:port
	 * (QEMU's forward of that guest port) as SCM_RIGHTS. */
	int connector;
	/* From the sandbox's owner, one line per change; end of file: exit.
	 *   "policy WORD WORD ...\n"  replace the policy (cap_net_policy_words
	 *                             form, space-separated; "policy\n" for an
	 *                             empty one); applies to new connections
	 *   "publish BIND HOST_PORT GUEST_PORT\n"  listen on BIND:HOST_PORT
	 *                             (auto-publish) and join it to GUEST_PORT
	 *   "unpublish HOST_PORT\n"   stop listening there
	 * A line it cannot apply is logged and ignored. */
	int control;
	/* Listening sockets on the host, one per policy->publish entry in
	 * order (bound by the owner, who may bind privileged ports). */
	const int *publish_fds;
	unsigned npublish;
	/* The engine's NFLOG socket (engine.h, cap_vm_net_fds.nflog): the
	 * packets the VM's rules reset or dropped. -1 when none (so is 0-2,
	 * the standard streams, as a config leaving it unset has it). */
	int nflog;
	int log_fd;
	/* A file of at least sizeof(struct cap_netd_counters) bytes, open
	 * read-write, that the process maps shared and counts in (above);
	 * -1 (or 0-2, unset): counted in memory only. */
	int counters_fd;
	bool verbose;	/* also log each allowed connection and its route */
	const char *resolv_conf;	/* NULL: /etc/resolv.conf */
	/* The host's proxy settings (the owner's environment), NULL when unset. */
	const char *https_proxy, *http_proxy, *all_proxy, *no_proxy;

	/* Timeouts, ms (0: the default). A connection still in its head
	 * phase (a proxy request's head, an incomplete TLS ClientHello, a
	 * connection over which no byte has moved either way yet) ends
	 * head_timeout_ms after it began (10 s); one over which bytes have
	 * moved ends once none has moved either way for idle_timeout_ms (300
	 * s). Both end with a reset and a log line ("capsule net: closed tcp
	 * 203.0.113.10:443: idle (no byte either way) for 300 s"). */
	unsigned head_timeout_ms, idle_timeout_ms;
	/* At most this many connections at once (0: 1024, fewer when the
	 * descriptor limit says so). When all are taken, a new one takes
	 * the slot of the connection idle the longest, if that one has been
	 * idle head_timeout_ms or more; else it is refused (logged). */
	unsigned max_conns;
	/* Once set up, confine the process's system calls to what serving
	 * needs (netd-seccomp.c; a filter of its own, with no_new_privs),
	 * for good. The engine's policy process sets it; tests running
	 * netd in a thread of theirs do not. */
	bool seccomp;

	/* Secrets (docs/network.md, rewrite.h), fixed for the process's
	 * life (a "policy" line changes what may be reached, never these):
	 * a TLS connection whose name (the CONNECT host, or the SNI of a
	 * direct connection, which must agree with the name the address was
	 * resolved as when there is one) is one of some secret's hosts is
	 * intercepted: the guest is answered with a certificate for that
	 * name signed by ca_key_pem/ca_cert_pem, the real server is dialed
	 * with TLS, SNI the name, verified against trust_pem (chain and name;
	 * a failure ends the guest's connection and is logged), and the
	 * connection's one request goes through rewrite.h (then the
	 * connection ends). Every other TLS connection passes
	 * through untouched. nsecrets 0: nothing is intercepted (the other
	 * fields unused). */
	const struct cap_netd_secret *secrets;
	unsigned nsecrets;
	const char *ca_key_pem, *ca_cert_pem;
	const char *trust_pem;
	size_t trust_len;
};

/* What the policy process counts, in a shared file its owner reads
 * (cap_netd_config.counters_fd): from the process's start, each field
 * written by it alone with relaxed atomic adds. */
#define CAP_NETD_COUNTERS_MAGIC 0x31746e63706163ull	/* "capcnt1" */
struct cap_netd_counters {
	uint64_t magic;	/* CAP_NETD_COUNTERS_MAGIC once the process has it mapped */
	uint64_t refused;	/* every "refused" or "dropped" log line, suppressed ones too */
	uint64_t bytes_out;	/* TCP bytes from the guest (a published port's: to its client) */
	uint64_t bytes_in;	/* TCP bytes to the guest */
};

/* Read the counters a policy process keeps in the file at path. 0,
 * -ENOENT (none there), -EBADMSG (not, or not yet, a counters file). */
int cap_netd_counters_read(const char *path, struct cap_netd_counters *out);

struct cap_netd_secret {
	const struct cap_net_secret *decl;	/* name, hosts, body */
	char placeholder[CAP_NET_PLACEHOLDER_LEN + 1];
	const char *value;	/* value_len bytes, never logged */
	size_t value_len;
};

/* Serve until control closes. Returns the exit code for the process: 0
 * after a clean end, 1 after a fatal error (logged). */
int cap_netd_main(const struct cap_netd_config *c);

#endif
