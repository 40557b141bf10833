/* A pod's network namespace, the host side (engine.h, cap_pod_net_*;
 * docs/oci.md, "The pod's network"): what CNI put there read over
 * rtnetlink, a tap made beside the veth and joined to it with tc (an
 * ingress qdisc on each, a u32 match-all filter on each redirecting to
 * the other's egress: Kata's "tcfilter" model), all through libmnl. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/if.h>
#include <linux/if_ether.h>
#include <linux/if_link.h>
#include <linux/if_tun.h>
#include <linux/pkt_cls.h>
#include <linux/pkt_sched.h>
#include <linux/rtnetlink.h>
#include <linux/tc_act/tc_mirred.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "engine-podnet.h"
#include "engine.h"
#include "util.h"

/* The filters' priority (tc's "pref"); any will do, one per device. */
#define FILTER_PRIO 49152u

/* ---- being in the namespace -------------------------------------------- */

/* Enter netns from the calling thread: the descriptor of where it was,
 * to come back to (ns_leave), or -errno with err set. */
static int ns_enter(int netns, struct cap_err *err)
{
	int saved = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (saved < 0)
		return cap_err_set(err, errno, "cannot open /proc/thread-self/ns/net: %s", strerror(errno));
	if (setns(netns, CLONE_NEWNET) < 0) {
		int e = errno;
		close(saved);
		return cap_err_set(err, e, "cannot enter the pod's network namespace: %s", strerror(e));
	}
	return saved;
}

static void ns_leave(int saved)
{
	int r = setns(saved, CLONE_NEWNET);
	CAP_BUG_ON(r < 0);	/* a thread left in the pod's namespace would cut us off */
	close(saved);
}

/* ---- rtnetlink ---------------------------------------------------------- */

/* How long the kernel has to answer one request. */
#define RTNL_TIMEOUT_S 5
#define RTNL_STR_(x) #x
#define RTNL_STR(x) RTNL_STR_(x)

struct rtnl {
	struct mnl_socket *nl;
	unsigned seq;
};

static int rtnl_open(struct rtnl *r, struct cap_err *err)
{
	r->seq = 0;
	r->nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
	if (!r->nl)
		return cap_err_set(err, errno, "cannot open a netlink socket: %s", strerror(errno));
	if (mnl_socket_bind(r->nl, 0, MNL_SOCKET_AUTOPID) < 0) {
		int e = errno;
		mnl_socket_close(r->nl);
		r->nl = NULL;
		return cap_err_set(err, e, "cannot bind a netlink socket: %s", strerror(e));
	}
	/* A request the kernel never answers becomes ETIMEDOUT (rtnl_talk),
	 * not a sandbox that hangs before its VM starts. */
	struct timeval tv = { .tv_sec = RTNL_TIMEOUT_S };
	if (setsockopt(mnl_socket_get_fd(r->nl), SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0) {
		int e = errno;
		mnl_socket_close(r->nl);
		r->nl = NULL;
		return cap_err_set(err, e, "cannot set a receive timeout on a netlink socket: %s", strerror(e));
	}
	return 0;
}

static void rtnl_close(struct rtnl *r)
{
	if (r->nl)
		mnl_socket_close(r->nl);
	r->nl = NULL;
}

void cap_podnet_request(struct nlmsghdr *nlh, unsigned seq)
{
	nlh->nlmsg_seq = seq;
	/* Asked of every request, not only of those without NLM_F_DUMP's
	 * bits: NLM_F_EXCL is NLM_F_MATCH's bit and NLM_F_REPLACE
	 * NLM_F_ROOT's, so a NEW with NLM_F_EXCL looked like a dump and went
	 * unanswered. A dump is never ACKed (the kernel ends it with
	 * NLMSG_DONE whatever the flags). */
	nlh->nlmsg_flags |= NLM_F_REQUEST | NLM_F_ACK;
}

/* rtnl_talk's -errno e for a message: a timeout says what it means. */
static const char *rtnl_why(int e)
{
	return e == -ETIMEDOUT ? "the kernel did not answer within " RTNL_STR(RTNL_TIMEOUT_S) " s" : strerror(-e);
}

/* Send nlh and run cb on every answer until the ACK or the dump's end:
 * 0 or -errno (the kernel's refusal; -ETIMEDOUT when no answer came in
 * RTNL_TIMEOUT_S). */
static int rtnl_talk(struct rtnl *r, struct nlmsghdr *nlh, mnl_cb_t cb, void *ud)
{
	static char buf[32768];
	cap_podnet_request(nlh, ++r->seq);
	if (mnl_socket_sendto(r->nl, nlh, nlh->nlmsg_len) < 0)
		return -errno;
	for (;;) {
		ssize_t n = mnl_socket_recvfrom(r->nl, buf, sizeof(buf));
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
		int k = mnl_cb_run(buf, (size_t)n, r->seq, mnl_socket_get_portid(r->nl), cb, ud);
		if (k < 0)
			return -errno;
		if (k == MNL_CB_STOP)
			return 0;
	}
}

/* ---- reading the namespace ------------------------------------------- */

struct links {
	struct cap_pod_net *p;
	char others[256];	/* what else is there, for the refusal */
	unsigned n;
	bool veth;
};

static int each_link(const struct nlmsghdr *nlh, void *ud)
{
	struct links *l = ud;
	struct ifinfomsg *ifi = mnl_nlmsg_get_payload(nlh);
	const char *name = "", *kind = "";
	const uint8_t *mac = NULL;
	unsigned mtu = 0;
	struct nlattr *a;
	mnl_attr_for_each(a, nlh, sizeof(*ifi)) {
		switch (mnl_attr_get_type(a)) {
		case IFLA_IFNAME:
			name = mnl_attr_get_str(a);
			break;
		case IFLA_ADDRESS:
			if (mnl_attr_get_payload_len(a) == 6)
				mac = mnl_attr_get_payload(a);
			break;
		case IFLA_MTU:
			mtu = mnl_attr_get_u32(a);
			break;
		case IFLA_LINKINFO: {
			struct nlattr *i;
			mnl_attr_for_each_nested(i, a)
				if (mnl_attr_get_type(i) == IFLA_INFO_KIND)
					kind = mnl_attr_get_str(i);
			break;
		}
		}
	}
	if (ifi->ifi_flags & IFF_LOOPBACK)
		return MNL_CB_OK;
	/* Ours, left by a VM whose owner was killed: its descriptor is
	 * closed, so it is going away; never the pod's. */
	if (strcmp(name, CAP_POD_TAP_NAME) == 0)
		return MNL_CB_OK;
	size_t used = strlen(l->others);
	snprintf(l->others + used, sizeof(l->others) - used, "%s%s (%s)", used ? ", " : "", name,
		 *kind ? kind : "no kind");
	if (l->n++ == 0) {
		snprintf(l->p->ifname, sizeof(l->p->ifname), "%s", name);
		l->p->ifindex = ifi->ifi_index;
		l->p->mtu = mtu;
		if (mac)
			memcpy(l->p->mac, mac, 6);
		l->veth = strcmp(kind, "veth") == 0 && mac;
	}
	return MNL_CB_OK;
}

struct addrs {
	int ifindex;
	unsigned n4, n6;
	uint32_t addr;
	uint8_t prefix;
};

static int each_addr(const struct nlmsghdr *nlh, void *ud)
{
	struct addrs *x = ud;
	struct ifaddrmsg *ifa = mnl_nlmsg_get_payload(nlh);
	if ((int)ifa->ifa_index != x->ifindex)
		return MNL_CB_OK;
	if (ifa->ifa_family == AF_INET6) {
		if (ifa->ifa_scope != RT_SCOPE_LINK)
			x->n6++;
		return MNL_CB_OK;
	}
	if (ifa->ifa_family != AF_INET)
		return MNL_CB_OK;
	struct nlattr *a;
	mnl_attr_for_each(a, nlh, sizeof(*ifa)) {
		if (mnl_attr_get_type(a) == IFA_LOCAL && mnl_attr_get_payload_len(a) == 4) {
			x->addr = ntohl(mnl_attr_get_u32(a));
			x->prefix = ifa->ifa_prefixlen;
			x->n4++;
		}
	}
	return MNL_CB_OK;
}

struct routes {
	struct cap_pod_net *p;
	int e;	/* -E2BIG: too many */
};

int cap_podnet_route(struct cap_pod_net *p, const struct nlmsghdr *nlh)
{
	const struct rtmsg *rtm = mnl_nlmsg_get_payload(nlh);
	if (rtm->rtm_family != AF_INET || rtm->rtm_table != RT_TABLE_MAIN || rtm->rtm_type != RTN_UNICAST)
		return 0;
	uint32_t dst = 0, gw = 0;
	int oif = 0;
	struct nlattr *a;
	mnl_attr_for_each(a, nlh, sizeof(*rtm)) {
		switch (mnl_attr_get_type(a)) {
		case RTA_DST:
			dst = ntohl(mnl_attr_get_u32(a));
			break;
		case RTA_GATEWAY:
			gw = ntohl(mnl_attr_get_u32(a));
			break;
		case RTA_OIF:
			oif = (int)mnl_attr_get_u32(a);
			break;
		}
	}
	if (oif != p->ifindex)
		return 0;
	if (rtm->rtm_dst_len == 0) {
		p->gateway = gw;
		return 0;
	}
	/* The address's own subnet: the guest's kernel makes it. */
	uint32_t mask = p->prefix ? ~(0xffffffffu >> p->prefix) : 0;
	if (rtm->rtm_protocol == RTPROT_KERNEL && rtm->rtm_dst_len == p->prefix &&
	    dst == (p->addr & mask) && !gw)
		return 0;
	if (p->nroutes >= CAP_POD_MAX_ROUTES)
		return -E2BIG;
	p->routes[p->nroutes++] = (struct cap_pod_route){ dst, rtm->rtm_dst_len, gw };
	return 0;
}

static int each_route(const struct nlmsghdr *nlh, void *ud)
{
	struct routes *x = ud;
	if (cap_podnet_route(x->p, nlh) < 0)
		x->e = -E2BIG;
	return MNL_CB_OK;
}

static struct nlmsghdr *dump_req(char *buf, uint16_t type, uint8_t family, size_t fixed)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = type;
	nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
	uint8_t *f = mnl_nlmsg_put_extra_header(nlh, fixed);
	f[0] = family;	/* every one of these starts with its family */
	return nlh;
}

/* In the namespace: its links, the veth's addresses and routes. */
static int read_here(const char *shown, struct cap_pod_net *p, struct cap_err *err)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct rtnl r;
	int e;
	if ((e = rtnl_open(&r, err)) < 0)
		return e;
	struct links l = { .p = p };
	if ((e = rtnl_talk(&r, dump_req(buf, RTM_GETLINK, AF_UNSPEC, sizeof(struct ifinfomsg)), each_link, &l)) < 0) {
		e = cap_err_set(err, -e, "cannot list the interfaces of the network namespace %s: %s", shown, rtnl_why(e));
		goto out;
	}
	if (l.n == 0) {
		e = cap_err_set(err, EINVAL, "the network namespace %s holds no interface but lo: a pod's namespace "
				"holds the veth its CNI plugin made (the bridge plugin's eth0); check the CNI configuration", shown);
		goto out;
	}
	if (l.n > 1 || !l.veth) {
		e = cap_err_set(err, EINVAL, "the network namespace %s holds %s besides lo: capsule carries a pod's network "
				"into its VM only from one veth (what CNI's bridge or ptp plugin makes)", shown, l.others);
		goto out;
	}
	struct addrs x = { .ifindex = p->ifindex };
	if ((e = rtnl_talk(&r, dump_req(buf, RTM_GETADDR, AF_UNSPEC, sizeof(struct ifaddrmsg)), each_addr, &x)) < 0) {
		e = cap_err_set(err, -e, "cannot list the addresses of %s in the network namespace %s: %s", p->ifname,
				shown, rtnl_why(e));
		goto out;
	}
	if (x.n4 != 1) {
		e = cap_err_set(err, EINVAL, "%s in the network namespace %s has %u IPv4 addresses%s: capsule's guest "
				"takes exactly one IPv4 address (it has no IPv6)", p->ifname, shown, x.n4,
				x.n4 == 0 && x.n6 ? " (IPv6 only)" : "");
		goto out;
	}
	if (x.prefix == 0 || x.prefix > 32) {
		e = cap_err_set(err, EINVAL, "%s in the network namespace %s has a /%u address", p->ifname, shown, x.prefix);
		goto out;
	}
	p->addr = x.addr;
	p->prefix = x.prefix;
	struct routes rt = { .p = p };
	if ((e = rtnl_talk(&r, dump_req(buf, RTM_GETROUTE, AF_INET, sizeof(struct rtmsg)), each_route, &rt)) < 0) {
		e = cap_err_set(err, -e, "cannot list the routes of the network namespace %s: %s", shown, rtnl_why(e));
		goto out;
	}
	if (rt.e < 0) {
		e = cap_err_set(err, E2BIG, "the network namespace %s has more than %d IPv4 routes on %s", shown,
				CAP_POD_MAX_ROUTES, p->ifname);
		goto out;
	}
	if (p->mtu < 68 || p->mtu > 65535) {
		e = cap_err_set(err, EINVAL, "%s in the network namespace %s has an MTU of %u", p->ifname, shown, p->mtu);
		goto out;
	}
	e = 0;
out:
	rtnl_close(&r);
	return e;
}

int cap_pod_net_read(int netns, const char *shown, struct cap_pod_net *out, struct cap_err *err)
{
	struct cap_pod_net p;
	memset(&p, 0, sizeof(p));
	int saved = ns_enter(netns, err);
	if (saved < 0)
		return saved;
	int r = read_here(shown, &p, err);
	ns_leave(saved);
	if (r == 0)
		*out = p;
	return r;
}

/* ---- the tap and tc ------------------------------------------------------ */

static int link_up_mtu(struct rtnl *r, int ifindex, unsigned mtu)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_NEWLINK;
	nlh->nlmsg_flags = NLM_F_REQUEST;
	struct ifinfomsg *ifi = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifi));
	ifi->ifi_family = AF_UNSPEC;
	ifi->ifi_index = ifindex;
	ifi->ifi_flags = IFF_UP;
	ifi->ifi_change = IFF_UP;
	mnl_attr_put_u32(nlh, IFLA_MTU, mtu);
	return rtnl_talk(r, nlh, NULL, NULL);
}

struct nlmsghdr *cap_podnet_ingress_msg(void *buf, int ifindex, bool add)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = add ? RTM_NEWQDISC : RTM_DELQDISC;
	nlh->nlmsg_flags = NLM_F_REQUEST | (add ? NLM_F_CREATE | NLM_F_EXCL : 0);
	struct tcmsg *t = mnl_nlmsg_put_extra_header(nlh, sizeof(*t));
	t->tcm_family = AF_UNSPEC;
	t->tcm_ifindex = ifindex;
	t->tcm_parent = TC_H_INGRESS;
	t->tcm_handle = TC_H_MAKE(TC_H_INGRESS, 0);	/* ffff: */
	mnl_attr_put_strz(nlh, TCA_KIND, "ingress");
	return nlh;
}

/* The ingress qdisc of ifindex: added (add) or deleted. */
static int ingress(struct rtnl *r, int ifindex, bool add)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	return rtnl_talk(r, cap_podnet_ingress_msg(buf, ifindex, add), NULL, NULL);
}

struct nlmsghdr *cap_podnet_redirect_msg(void *buf, int from, int to)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_NEWTFILTER;
	nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_CREATE | NLM_F_EXCL;
	struct tcmsg *t = mnl_nlmsg_put_extra_header(nlh, sizeof(*t));
	t->tcm_family = AF_UNSPEC;
	t->tcm_ifindex = from;
	t->tcm_parent = TC_H_MAKE(TC_H_INGRESS, 0);
	t->tcm_info = TC_H_MAKE(FILTER_PRIO << 16, htons(ETH_P_ALL));
	mnl_attr_put_strz(nlh, TCA_KIND, "u32");
	struct nlattr *opts = mnl_attr_nest_start(nlh, TCA_OPTIONS);
	/* The selector and its one key (keys[] is a flexible array). */
	_Alignas(struct tc_u32_sel) uint8_t selbuf[sizeof(struct tc_u32_sel) + sizeof(struct tc_u32_key)];
	memset(selbuf, 0, sizeof(selbuf));
	struct tc_u32_sel *sel = (struct tc_u32_sel *)selbuf;
	sel->flags = TC_U32_TERMINAL;
	sel->nkeys = 1;	/* mask 0, value 0 at offset 0: anything */
	mnl_attr_put(nlh, TCA_U32_SEL, sizeof(selbuf), selbuf);
	struct nlattr *acts = mnl_attr_nest_start(nlh, TCA_U32_ACT);
	struct nlattr *act = mnl_attr_nest_start(nlh, 1);
	mnl_attr_put_strz(nlh, TCA_ACT_KIND, "mirred");
	struct nlattr *aopts = mnl_attr_nest_start(nlh, TCA_ACT_OPTIONS);
	struct tc_mirred m;
	memset(&m, 0, sizeof(m));
	m.action = TC_ACT_STOLEN;
	m.eaction = TCA_EGRESS_REDIR;
	m.ifindex = (uint32_t)to;
	mnl_attr_put(nlh, TCA_MIRRED_PARMS, sizeof(m), &m);
	mnl_attr_nest_end(nlh, aopts);
	mnl_attr_nest_end(nlh, act);
	mnl_attr_nest_end(nlh, acts);
	mnl_attr_nest_end(nlh, opts);
	return nlh;
}

/* On from's ingress: everything to to's egress (cap_podnet_redirect_msg). */
static int redirect(struct rtnl *r, int from, int to)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	return rtnl_talk(r, cap_podnet_redirect_msg(buf, from, to), NULL, NULL);
}

/* In the namespace: the tap, its MTU and state, and the filters. */
static int tap_here(const struct cap_pod_net *p, int *tap_fd, struct cap_err *err)
{
	struct rtnl r = { 0 };
	int e;
	int fd = open("/dev/net/tun", O_RDWR | O_CLOEXEC);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open /dev/net/tun for the pod's tap: %s%s", strerror(errno),
				   errno == ENOENT ? " (load the tun module: modprobe tun)" : "");
	struct ifreq ifr;
	memset(&ifr, 0, sizeof(ifr));
	ifr.ifr_flags = IFF_TAP | IFF_NO_PI | IFF_VNET_HDR;
	snprintf(ifr.ifr_name, sizeof(ifr.ifr_name), "%s", CAP_POD_TAP_NAME);
	if (ioctl(fd, TUNSETIFF, &ifr) < 0) {
		e = cap_err_set(err, errno, "cannot create the tap %s in the pod's network namespace: %s%s",
				CAP_POD_TAP_NAME, strerror(errno),
				errno == EBUSY ? " (another VM of this pod's namespace has it)" : "");
		goto fail;
	}
	int tap = -1, sk = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (sk >= 0 && ioctl(sk, SIOCGIFINDEX, &ifr) == 0)
		tap = ifr.ifr_ifindex;
	if (sk >= 0)
		close(sk);
	if (tap <= 0) {
		e = cap_err_set(err, ENODEV, "the tap %s vanished from the pod's network namespace", CAP_POD_TAP_NAME);
		goto fail;
	}
	if ((e = rtnl_open(&r, err)) < 0)
		goto fail;
	if ((e = link_up_mtu(&r, tap, p->mtu)) < 0) {
		e = cap_err_set(err, -e, "cannot bring the tap %s up with MTU %u: %s", CAP_POD_TAP_NAME, p->mtu, rtnl_why(e));
		goto fail;
	}
	/* A qdisc left by an owner that was killed goes first (its filter
	 * names a tap that is gone). */
	ingress(&r, p->ifindex, false);
	const char *on = p->ifname;
	if ((e = ingress(&r, p->ifindex, true)) < 0 || (on = CAP_POD_TAP_NAME, e = ingress(&r, tap, true)) < 0) {
		e = cap_err_set(err, -e, "cannot add an ingress qdisc to %s in the pod's network namespace: %s%s", on,
				rtnl_why(e),
				e == -ENOENT || e == -EOPNOTSUPP ? " (the host kernel needs sch_ingress, cls_u32 and act_mirred)" : "");
		ingress(&r, p->ifindex, false);	/* when the tap's failed */
		goto fail;
	}
	const char *to = CAP_POD_TAP_NAME;
	on = p->ifname;
	if ((e = redirect(&r, p->ifindex, tap)) < 0 ||
	    (on = CAP_POD_TAP_NAME, to = p->ifname, e = redirect(&r, tap, p->ifindex)) < 0) {
		e = cap_err_set(err, -e, "cannot redirect %s's ingress to %s with tc (u32 and mirred) in the pod's network "
				"namespace: %s%s", on, to, rtnl_why(e),
				e == -ENOENT || e == -EOPNOTSUPP ? " (the host kernel needs cls_u32 and act_mirred)" : "");
		ingress(&r, p->ifindex, false);
		goto fail;
	}
	rtnl_close(&r);
	*tap_fd = fd;
	return 0;
fail:
	rtnl_close(&r);
	close(fd);
	return e;
}

int cap_pod_net_tap(int netns, const struct cap_pod_net *p, int *tap_fd, struct cap_err *err)
{
	int saved = ns_enter(netns, err);
	if (saved < 0)
		return saved;
	int r = tap_here(p, tap_fd, err);
	ns_leave(saved);
	return r;
}

void cap_pod_net_untap(int netns, const struct cap_pod_net *p)
{
	struct cap_err err = { 0 };
	int saved = ns_enter(netns, &err);
	if (saved < 0)
		return;
	struct rtnl r;
	if (rtnl_open(&r, &err) == 0) {
		ingress(&r, p->ifindex, false);
		rtnl_close(&r);
	}
	ns_leave(saved);
}
