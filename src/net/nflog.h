/* The packets the kernel refuses in a VM's network namespace, as NFLOG
 * delivers them (engine.h, cap_vm_net_fds.nflog): a pure parser of what
 * one recv() on a NETLINK_NETFILTER socket returns, every length checked;
 * no I/O, no allocation. */
#ifndef CAP_NET_NFLOG_H
#define CAP_NET_NFLOG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* What the engine's rules log in a VM's namespace (engine-net.c): the
 * NFLOG group, the bytes of each packet the kernel copies (the largest
 * IPv4 header, 60 bytes, and the first 8 after it: TCP/UDP ports, the
 * ICMP type), and the prefix naming the rule that refused the packet. */
#define CAP_NFLOG_GROUP 1
#define CAP_NFLOG_COPY_RANGE 68
#define CAP_NFLOG_PREFIX_RESET "capsule reset"	/* TCP to a denied range, answered with a reset */
#define CAP_NFLOG_PREFIX_DROP "capsule drop"	/* anything else QEMU sent that no rule let through */

/* One refused packet. */
struct cap_nflog_pkt {
	/* 4: an IPv4 packet, every field below decoded; 6: an IPv6 packet,
	 * only proto (its first next header) decoded, addresses 0. */
	uint8_t version;
	uint8_t proto;		/* IPPROTO_TCP, IPPROTO_UDP, IPPROTO_ICMP, ... */
	uint32_t saddr, daddr;	/* host order */
	/* TCP/UDP; 0 for other protocols, for a fragment other than the
	 * first, or when the copy stopped before them. */
	uint16_t sport, dport;
	/* ICMP; 0 otherwise (check proto: 0 is also the echo reply). */
	uint8_t icmp_type;
	/* A UDP datagram to port 7 carrying libslirp's "This is a
	 * pseudo-PING" text: how QEMU's user-mode network sends a guest's
	 * ICMP echo request when it may not open an ICMP socket. */
	bool slirp_ping;
	char prefix[64];	/* the rule's "log prefix", "" without one; NUL-terminated */
};

/* Walk the netlink messages in buf (len bytes, one recv()) and call
 * cb(ud, p) for each NFLOG packet (NFNL_SUBSYS_ULOG / NFULNL_MSG_PACKET
 * with an IPv4 or IPv6 payload); p is valid only during the call. Other
 * messages (NLMSG_NOOP, NLMSG_DONE, acknowledgements, configuration
 * replies) are skipped.
 * Returns the number of packets passed to cb, or:
 *   -EBADMSG  a message is malformed (a length out of bounds, an attribute
 *             running past its message, a packet without a payload or
 *             whose payload is no sound IP header). The sound packets are
 *             still passed to cb; when the framing itself is broken the
 *             rest of the buffer is skipped (its boundaries are unknown);
 *   -errno    an NLMSG_ERROR message with that error (after the packets
 *             before it were passed to cb). */
int cap_nflog_parse(const uint8_t *buf, size_t len,
		    void (*cb)(void *ud, const struct cap_nflog_pkt *p), void *ud);

/* The policy process's log line (netd.h, without "capsule net: ") for a
 * packet the kernel refused, into out (size bytes, NUL-terminated,
 * truncated to fit); returns out. Addresses are as QEMU's sockets sent
 * them (the gateway is 127.0.0.1). TCP reset for a denied range names
 * the rule from cap_net_decide under policy, with each of names (the DNS
 * names the guest was answered daddr with, newest first; NULL when
 * nnames is 0) tried as cap_net_decide's name:
 *   "refused tcp 198.51.100.7:80: no rule allows 198.51.100.7:80"
 *   "dropped udp 203.0.113.10:9999: only DNS to 10.0.2.3 leaves the sandbox over UDP"
 *   "dropped icmp 203.0.113.10 (type 8): ICMP never leaves the sandbox"
 *   "dropped icmp 203.0.113.10 (type 8, sent by QEMU as UDP to port 7): ICMP never leaves the sandbox"
 *   "dropped ip proto 47 to 203.0.113.10: only TCP and DNS leave the sandbox" */
struct cap_net_policy;
const char *cap_nflog_describe(const struct cap_nflog_pkt *pkt, const struct cap_net_policy *policy,
			       const char *const *names, unsigned nnames, char *out, size_t size);

#endif
