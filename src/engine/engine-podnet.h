/* What engine-podnet.c builds and reads without a namespace or a socket:
 * the rtnetlink requests it sends and the routes it takes, for its unit
 * tests. Only src/engine and its unit tests include this. */
#ifndef CAP_ENGINE_PODNET_H
#define CAP_ENGINE_PODNET_H

#include <linux/netlink.h>
#include <stdbool.h>

#include "engine-types.h"

/* nlh made a request of sequence seq that the kernel answers: an ACK
 * (NLMSG_ERROR) for a change, NLMSG_DONE for a dump, whatever else its
 * flags say. */
void cap_podnet_request(struct nlmsghdr *nlh, unsigned seq);

/* In buf (MNL_SOCKET_BUFFER_SIZE bytes): adding (NLM_F_CREATE |
 * NLM_F_EXCL) or deleting the ingress qdisc (ffff:) of ifindex. */
struct nlmsghdr *cap_podnet_ingress_msg(void *buf, int ifindex, bool add);

/* In buf: a u32 filter on from's ingress matching every packet (one key,
 * mask 0) whose one action, mirred, redirects it to to's egress, as `tc
 * filter add dev FROM parent ffff: protocol all u32 match u8 0 0 action
 * mirred egress redirect dev TO` does. */
struct nlmsghdr *cap_podnet_redirect_msg(void *buf, int from, int to);

/* One RTM_NEWROUTE of a dump into p (whose ifindex, addr and prefix are
 * set): the default route's gateway, or one more of p->routes; routes
 * not IPv4 unicast of the main table, not on p's veth, or the kernel's
 * for the address's own subnet are left out. -E2BIG when p->routes is
 * full, else 0. */
int cap_podnet_route(struct cap_pod_net *p, const struct nlmsghdr *nlh);

#endif
