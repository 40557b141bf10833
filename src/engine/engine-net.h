#ifndef CAP_ENGINE_NET_H
#define CAP_ENGINE_NET_H

#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "jail.h"

/* The network of a QEMU with a NIC (engine-net.c; docs/architecture.md,
 * "Network under a policy"), set up around its jail (jail.h): a network
 * namespace with loopback only (route "local 0.0.0.0/0 dev lo", ping
 * sockets closed to QEMU's group, every port bindable in it so that QEMU
 * can forward low guest ports) and the nftables rules of engine.h's
 * struct cap_vm_net matched on QEMU's UID; when cfg has a policy_main,
 * its listeners, the connector and the policy process. */
struct cap_vm_net;
struct cap_jail_net;

/* Set it all up for the VM jailed in j (which must be confined: a
 * network policy is enforced by the jail; -EPERM otherwise). cfg is
 * borrowed for the call. *out is owned by the caller: cap_jail_net_free
 * before cap_jail_free. The calling thread's own network namespace is
 * the same on return. */
int cap_jail_net_new(struct cap_jail *j, const struct cap_vm_net *cfg,
		     struct cap_jail_net **out, struct cap_err *err);
/* The namespace, for cap_jail_set_netns. Owned by n. */
int cap_jail_net_ns(const struct cap_jail_net *n);
/* The owner's end of the policy process's control socket, -1 without a
 * policy process; owned by n. */
int cap_jail_net_control_fd(const struct cap_jail_net *n);
/* The policy process, -1 without one. */
pid_t cap_jail_net_pid(const struct cap_jail_net *n);
/* Replace the ranges [lo, hi] (host order; any order, overlaps merged)
 * refused with a TCP reset, in one nftables transaction. */
int cap_jail_net_deny(struct cap_jail_net *n, const uint32_t (*deny)[2],
		      unsigned ndeny, struct cap_err *err);
/* SIGKILL the policy process and the connector and reap them. */
void cap_jail_net_stop(struct cap_jail_net *n);
/* Stop, then close everything. NULL is fine. */
void cap_jail_net_free(struct cap_jail_net *n);

#endif
