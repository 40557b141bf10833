/* The guest's side of a NIC under a policy (docs/protocol.md, "Network"):
 * the interface set up over rtnetlink (no DHCP client, no external tool),
 * /etc/resolv.conf and /etc/hosts written as root's, and the proxy
 * variables every command gets. Nothing here depends on IPv6 or packet
 * sockets: the guest kernel has neither. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <net/if_arp.h>
#include <stdio.h>
#include <string.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include "agent.h"
#include "util.h"

/* --- rtnetlink ------------------------------------------------------- */

struct nl {
	int fd;
	uint32_t seq;
};

/* One request: the header, the family's fixed part and its attributes. */
struct nl_req {
	struct nlmsghdr h;
	union {
		struct ifinfomsg link;
		struct ifaddrmsg addr;
		struct rtmsg route;
	};
	uint8_t attrs[128];
};

static int nl_open(struct nl *nl)
{
	nl->seq = 0;
	nl->fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC, NETLINK_ROUTE);
	if (nl->fd < 0)
		return -errno;
	/* The kernel answers a route request while sending it; the timeout
	 * only bounds a kernel that would not. */
	struct timeval tv = { .tv_sec = 2 };
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	if (setsockopt(nl->fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)) < 0 ||
	    bind(nl->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		close(nl->fd);
		nl->fd = -1;
		return -e;
	}
	return 0;
}

static void nl_req_init(struct nl_req *r, uint16_t type, uint16_t flags, size_t fixed)
{
	memset(r, 0, sizeof(*r));
	r->h.nlmsg_len = (uint32_t)NLMSG_LENGTH(fixed);
	r->h.nlmsg_type = type;
	r->h.nlmsg_flags = (uint16_t)(NLM_F_REQUEST | flags);
}

static void nl_attr(struct nl_req *r, uint16_t type, const void *data, size_t len)
{
	size_t off = NLMSG_ALIGN(r->h.nlmsg_len);
	size_t alen = RTA_LENGTH(len);
	CAP_BUG_ON(off + RTA_ALIGN(alen) > sizeof(*r));
	struct rtattr *a = (struct rtattr *)((uint8_t *)r + off);
	a->rta_type = type;
	a->rta_len = (unsigned short)alen;
	memcpy(RTA_DATA(a), data, len);
	r->h.nlmsg_len = (uint32_t)(off + RTA_ALIGN(alen));
}

static int nl_send(struct nl *nl, struct nl_req *r)
{
	struct sockaddr_nl to = { .nl_family = AF_NETLINK };
	r->h.nlmsg_seq = ++nl->seq;
	for (;;) {
		ssize_t n = sendto(nl->fd, r, r->h.nlmsg_len, 0, (struct sockaddr *)&to, sizeof(to));
		if (n >= 0)
			return n == (ssize_t)r->h.nlmsg_len ? 0 : -EIO;
		if (errno != EINTR)
			return -errno;
	}
}

/* Receive the answers to the last request, calling each(ud, msg) for
 * every data message, until its ACK (0 or the kernel's -errno) or, for a
 * dump, NLMSG_DONE. */
static int nl_recv(struct nl *nl, void (*each)(void *ud, const struct nlmsghdr *h), void *ud)
{
	/* Large enough for a link message with every statistic. */
	static uint8_t buf[32768] __attribute__((aligned(NLMSG_ALIGNTO)));
	for (;;) {
		ssize_t n = recv(nl->fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
		if (n == 0)
			return -EIO;
		size_t left = (size_t)n;
		for (const struct nlmsghdr *h = (const struct nlmsghdr *)buf; NLMSG_OK(h, left);
		     h = NLMSG_NEXT(h, left)) {
			if (h->nlmsg_seq != nl->seq)
				continue;	/* an answer to nothing of ours */
			if (h->nlmsg_type == NLMSG_DONE)
				return 0;
			if (h->nlmsg_type == NLMSG_ERROR) {
				if (h->nlmsg_len < NLMSG_LENGTH(sizeof(struct nlmsgerr)))
					return -EIO;
				const struct nlmsgerr *e = NLMSG_DATA(h);
				return e->error;	/* 0: the ACK */
			}
			if (each)
				each(ud, h);
		}
	}
}

/* Send a change and wait for its ACK. */
static int nl_talk(struct nl *nl, struct nl_req *r)
{
	r->h.nlmsg_flags |= NLM_F_ACK;
	int e = nl_send(nl, r);
	return e < 0 ? e : nl_recv(nl, NULL, NULL);
}

struct links {
	int lo, eth, first_ether;
	char eth_name[IF_NAMESIZE], first_name[IF_NAMESIZE];
};

static void each_link(void *ud, const struct nlmsghdr *h)
{
	struct links *l = ud;
	if (h->nlmsg_type != RTM_NEWLINK || h->nlmsg_len < NLMSG_LENGTH(sizeof(struct ifinfomsg)))
		return;
	const struct ifinfomsg *ifi = NLMSG_DATA(h);
	char name[IF_NAMESIZE] = "";
	size_t alen = h->nlmsg_len - NLMSG_LENGTH(sizeof(*ifi));
	for (const struct rtattr *a = IFLA_RTA(ifi); RTA_OK(a, alen); a = RTA_NEXT(a, alen)) {
		if (a->rta_type == IFLA_IFNAME) {
			size_t k = CAP_MIN(RTA_PAYLOAD(a), sizeof(name) - 1);
			memcpy(name, RTA_DATA(a), k);
			name[k] = '\0';
		}
	}
	if (ifi->ifi_flags & IFF_LOOPBACK) {
		if (l->lo <= 0)
			l->lo = ifi->ifi_index;
		return;
	}
	if (strcmp(name, "eth0") == 0) {
		l->eth = ifi->ifi_index;
		snprintf(l->eth_name, sizeof(l->eth_name), "%s", name);
	} else if (ifi->ifi_type == ARPHRD_ETHER && l->first_ether <= 0) {
		l->first_ether = ifi->ifi_index;
		snprintf(l->first_name, sizeof(l->first_name), "%s", name);
	}
}

static int find_links(struct nl *nl, struct links *l)
{
	struct nl_req r;
	nl_req_init(&r, RTM_GETLINK, NLM_F_DUMP, sizeof(struct ifinfomsg));
	r.link.ifi_family = AF_UNSPEC;
	int e = nl_send(nl, &r);
	return e < 0 ? e : nl_recv(nl, each_link, l);
}

static int link_up(struct nl *nl, int ifindex)
{
	struct nl_req r;
	nl_req_init(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
	r.link = (struct ifinfomsg){ .ifi_family = AF_UNSPEC, .ifi_index = ifindex,
				     .ifi_flags = IFF_UP, .ifi_change = IFF_UP };
	return nl_talk(nl, &r);
}

static int add_address(struct nl *nl, int ifindex, uint32_t addr, uint8_t prefix)
{
	struct nl_req r;
	uint32_t be = htonl(addr);
	nl_req_init(&r, RTM_NEWADDR, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct ifaddrmsg));
	r.addr = (struct ifaddrmsg){ .ifa_family = AF_INET, .ifa_prefixlen = prefix,
				     .ifa_scope = RT_SCOPE_UNIVERSE, .ifa_index = (uint32_t)ifindex };
	nl_attr(&r, IFA_LOCAL, &be, sizeof(be));
	nl_attr(&r, IFA_ADDRESS, &be, sizeof(be));
	if (prefix < 31) {
		uint32_t bcast = htonl(addr | (prefix ? 0xffffffffu >> prefix : 0xffffffffu));
		nl_attr(&r, IFA_BROADCAST, &bcast, sizeof(bcast));
	}
	return nl_talk(nl, &r);
}

static int add_default_route(struct nl *nl, int ifindex, uint32_t gateway)
{
	struct nl_req r;
	uint32_t be = htonl(gateway), oif = (uint32_t)ifindex;
	nl_req_init(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct rtmsg));
	r.route = (struct rtmsg){ .rtm_family = AF_INET, .rtm_table = RT_TABLE_MAIN,
				  .rtm_protocol = RTPROT_BOOT, .rtm_scope = RT_SCOPE_UNIVERSE,
				  .rtm_type = RTN_UNICAST };
	nl_attr(&r, RTA_GATEWAY, &be, sizeof(be));
	nl_attr(&r, RTA_OIF, &oif, sizeof(oif));
	return nl_talk(nl, &r);
}

/* A pod's interface: its MAC and MTU (set while it is down). */
static int link_set(struct nl *nl, int ifindex, const uint8_t mac[6], uint32_t mtu)
{
	struct nl_req r;
	nl_req_init(&r, RTM_NEWLINK, 0, sizeof(struct ifinfomsg));
	r.link = (struct ifinfomsg){ .ifi_family = AF_UNSPEC, .ifi_index = ifindex };
	nl_attr(&r, IFLA_ADDRESS, mac, 6);
	nl_attr(&r, IFLA_MTU, &mtu, sizeof(mtu));
	return nl_talk(nl, &r);
}

/* A route to dst/len on ifindex: on-link when gateway is 0. */
static int add_route(struct nl *nl, int ifindex, uint32_t dst, uint8_t len, uint32_t gateway)
{
	struct nl_req r;
	uint32_t d = htonl(dst), g = htonl(gateway), oif = (uint32_t)ifindex;
	nl_req_init(&r, RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, sizeof(struct rtmsg));
	r.route = (struct rtmsg){ .rtm_family = AF_INET, .rtm_dst_len = len, .rtm_table = RT_TABLE_MAIN,
				  .rtm_protocol = RTPROT_BOOT,
				  .rtm_scope = gateway ? RT_SCOPE_UNIVERSE : RT_SCOPE_LINK,
				  .rtm_type = RTN_UNICAST };
	nl_attr(&r, RTA_DST, &d, sizeof(d));
	if (gateway)
		nl_attr(&r, RTA_GATEWAY, &g, sizeof(g));
	nl_attr(&r, RTA_OIF, &oif, sizeof(oif));
	return nl_talk(nl, &r);
}

static const char *ip(uint32_t addr, char *buf)
{
	struct in_addr a = { htonl(addr) };
	return inet_ntop(AF_INET, &a, buf, INET_ADDRSTRLEN);
}

/* The static network's routes, on-link ones first (a gateway must be
 * reachable before a route through it is added), then the default. */
static int add_static_routes(struct nl *nl, int eth, const char *name, const struct cap_setup *s,
			     char *msg, size_t mlen)
{
	char d[INET_ADDRSTRLEN], g[INET_ADDRSTRLEN];
	for (int pass = 0; pass < 2; pass++) {
		for (uint32_t i = 0; i < s->nroutes; i++) {
			const struct cap_setup_route *rt = &s->routes[i];
			if ((pass == 0) != (rt->gateway == 0))
				continue;
			int e = add_route(nl, eth, rt->dst, rt->dst_len, rt->gateway);
			if (e < 0) {
				snprintf(msg, mlen, "cannot add the route %s/%u%s%s on %s: %s", ip(rt->dst, d),
					 rt->dst_len, rt->gateway ? " via " : "", rt->gateway ? ip(rt->gateway, g) : "",
					 name, strerror(-e));
				return e;
			}
		}
	}
	return 0;
}

/* lo up; the Ethernet interface addressed (with a static network: its
 * MAC and MTU first, then its routes), up, and the default route. */
static int configure_links(const struct cap_setup *s, char *msg, size_t mlen)
{
	struct nl nl;
	struct links l = { 0 };
	char a[INET_ADDRSTRLEN], g[INET_ADDRSTRLEN];
	int e = nl_open(&nl);
	if (e < 0) {
		snprintf(msg, mlen, "cannot open a netlink socket: %s", strerror(-e));
		return e;
	}
	if ((e = find_links(&nl, &l)) < 0) {
		snprintf(msg, mlen, "cannot list the network interfaces: %s", strerror(-e));
		goto out;
	}
	int eth = l.eth > 0 ? l.eth : l.first_ether;
	const char *name = l.eth > 0 ? l.eth_name : l.first_name;
	if (eth <= 0) {
		e = -ENODEV;
		snprintf(msg, mlen, "no Ethernet interface in the guest (is the VM's NIC missing?)");
		goto out;
	}
	if (l.lo > 0 && (e = link_up(&nl, l.lo)) < 0) {
		snprintf(msg, mlen, "cannot bring lo up: %s", strerror(-e));
		goto out;
	}
	if (s->net_static && (e = link_set(&nl, eth, s->net_mac, s->net_mtu)) < 0) {
		snprintf(msg, mlen, "cannot give %s the pod's MAC %02x:%02x:%02x:%02x:%02x:%02x and MTU %u: %s",
			 name, s->net_mac[0], s->net_mac[1], s->net_mac[2], s->net_mac[3], s->net_mac[4],
			 s->net_mac[5], s->net_mtu, strerror(-e));
		goto out;
	}
	if ((e = add_address(&nl, eth, s->net_addr, s->net_prefix)) < 0) {
		snprintf(msg, mlen, "cannot add address %s/%u to %s: %s", ip(s->net_addr, a),
			 s->net_prefix, name, strerror(-e));
		goto out;
	}
	if ((e = link_up(&nl, eth)) < 0) {
		snprintf(msg, mlen, "cannot bring %s up: %s", name, strerror(-e));
		goto out;
	}
	if (s->net_static && (e = add_static_routes(&nl, eth, name, s, msg, mlen)) < 0)
		goto out;
	if (s->net_gateway && (e = add_default_route(&nl, eth, s->net_gateway)) < 0) {
		snprintf(msg, mlen, "cannot add the default route via %s on %s: %s",
			 ip(s->net_gateway, g), name, strerror(-e));
		goto out;
	}
	e = 0;
out:
	close(nl.fd);
	return e;
}

/* --- /etc ------------------------------------------------------------ */

/* Open the directory name under at (created 0755 when missing; never a
 * symbolic link), which must be root's and writable by root alone (fixed
 * if it is not: an image may come with anything). shown names it in
 * messages. */
static int open_root_dir_at(int at, const char *name, const char *shown, char *msg, size_t mlen)
{
	struct stat st;
	if (mkdirat(at, name, 0755) < 0 && errno != EEXIST) {
		int e = errno;
		snprintf(msg, mlen, "cannot create %s: %s", shown, strerror(e));
		return -e;
	}
	int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(msg, mlen, "cannot open %s: %s", shown,
			 e == ELOOP || e == ENOTDIR ? "not a directory" : strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0 || ((st.st_uid != 0 || st.st_gid != 0) && fchown(fd, 0, 0) < 0) ||
	    ((st.st_mode & 022) && fchmod(fd, st.st_mode & 07755) < 0)) {
		int e = errno;
		close(fd);
		snprintf(msg, mlen, "cannot make %s root's: %s", shown, strerror(e));
		return -e;
	}
	return fd;
}

static int open_root_dir(const char *path, char *msg, size_t mlen)
{
	return open_root_dir_at(AT_FDCWD, path, path, msg, mlen);
}

/* Replace dir/name with text[0..len), root's and 0644: a temporary file
 * renamed over it, so a symbolic link there is replaced, never followed. */
static int write_root_data(int dirfd, const char *shown, const char *name, const char *text,
			   size_t len, char *msg, size_t mlen)
{
	char tmp[64];
	CAP_BUG_ON(strlen(name) > sizeof(tmp) - 16);
	snprintf(tmp, sizeof(tmp), ".%s.capsule-new", name);
	unlinkat(dirfd, tmp, 0);
	int fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
	int e = fd < 0 ? -errno : cap_write_all(fd, text, len);
	if (e == 0 && (fchown(fd, 0, 0) < 0 || fchmod(fd, 0644) < 0))
		e = -errno;
	if (fd >= 0 && close(fd) < 0 && e == 0)
		e = -errno;
	if (e == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
		e = -errno;
	if (e < 0) {
		unlinkat(dirfd, tmp, 0);
		snprintf(msg, mlen, "cannot write %s: %s", shown, strerror(-e));
	}
	return e;
}

static int write_root_file(int dirfd, const char *shown, const char *name, const char *text,
			   char *msg, size_t mlen)
{
	return write_root_data(dirfd, shown, name, text, strlen(text), msg, mlen);
}

static int write_etc(const struct cap_setup *s, char *msg, size_t mlen)
{
	char a[INET_ADDRSTRLEN], g[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
	char host[65] = "capsule";
	char resolv[128], hosts[256];

	/* "/" too: whoever may write it could move /etc aside. */
	int rootfd = open_root_dir("/", msg, mlen);
	if (rootfd < 0)
		return rootfd;
	close(rootfd);
	int etc = open_root_dir("/etc", msg, mlen);
	if (etc < 0)
		return etc;
	if (gethostname(host, sizeof(host) - 1) < 0)
		snprintf(host, sizeof(host), "capsule");
	if (s->net_dns)
		snprintf(resolv, sizeof(resolv), "nameserver %s\n", ip(s->net_dns, d));
	else
		snprintf(resolv, sizeof(resolv), "# capsule: no name server\n");
	snprintf(hosts, sizeof(hosts),
		 "127.0.0.1\tlocalhost\n%s\thost.capsule.internal\n%s\t%s\n",
		 ip(s->net_gateway, g), ip(s->net_addr, a), host);
	int e = write_root_file(etc, "/etc/resolv.conf", "resolv.conf", resolv, msg, mlen);
	if (e == 0)
		e = write_root_file(etc, "/etc/hosts", "hosts", hosts, msg, mlen);
	close(etc);
	return e;
}

int agent_net_rename(const struct cap_setup *s, char *msg, size_t mlen)
{
	if (!s->net_addr || s->net_static)
		return 0;
	return write_etc(s, msg, mlen);
}

/* --- the commands' environment ----------------------------------------- */

/* The proxy variables among the commands' defaults (agent.h). */
static void set_proxy_env(const struct cap_setup *s)
{
	static const char *const names[] = { "HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
					     "https_proxy", "NO_PROXY", "no_proxy" };
	char g[INET_ADDRSTRLEN], var[64];
	if (!s->proxy_port)
		return;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(names); i++) {
		if (i < 4)
			snprintf(var, sizeof(var), "%s=http://%s:%u", names[i],
				 ip(s->net_gateway, g), s->proxy_port);
		else
			snprintf(var, sizeof(var), "%s=localhost,127.0.0.1,::1", names[i]);
		agent_env_put(var);
	}
}

/* The interface as agent_net_boot configured it from the kernel command
 * line (all 0: not configured). */
static struct { uint32_t addr, gateway; uint8_t prefix; } booted;

/* "capsule.net=A.B.C.D/N,G.H.I.J" on the kernel command line. */
static bool boot_config(struct cap_setup *out)
{
	char *s = NULL;
	bool ok = false;
	if (cap_read_file("/proc/cmdline", 4096, &s) < 0)
		return false;
	for (char *save = NULL, *tok = strtok_r(s, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
		char a[16], g[16];
		unsigned prefix;
		struct in_addr ia, ig;
		if (strncmp(tok, "capsule.net=", 12) != 0 ||
		    sscanf(tok + 12, "%15[0-9.]/%u,%15[0-9.]", a, &prefix, g) != 3 || prefix > 32 ||
		    inet_pton(AF_INET, a, &ia) != 1 || inet_pton(AF_INET, g, &ig) != 1)
			continue;
		out->net_addr = ntohl(ia.s_addr);
		out->net_gateway = ntohl(ig.s_addr);
		out->net_prefix = (uint8_t)prefix;
		ok = true;
	}
	free(s);
	return ok;
}

void agent_net_boot(void)
{
	/* The VM's shape says its NIC's address (the same in every sandbox
	 * of a template): configured here, the work (opening virtio-net
	 * fills its receive ring; the kernel's paths are cold under TCG:
	 * 25-35 ms) is in the template, not in each SETUP. */
	struct cap_setup s = { 0 };
	char msg[256];
	if (!boot_config(&s) || configure_links(&s, msg, sizeof(msg)) < 0)
		return;	/* SETUP does it, and says what fails */
	booted.addr = s.net_addr;
	booted.gateway = s.net_gateway;
	booted.prefix = s.net_prefix;
}

int agent_net_setup(const struct cap_setup *s, char *msg, size_t mlen)
{
	char a[INET_ADDRSTRLEN];
	/* A pod's network: the engine's /etc files, no proxy. */
	if (s->net_static)
		return configure_links(s, msg, mlen);
	if (!s->net_gateway) {
		snprintf(msg, mlen, "SETUP gives the address %s but no gateway", ip(s->net_addr, a));
		return -EINVAL;
	}
	bool done = booted.addr && booted.addr == s->net_addr && booted.gateway == s->net_gateway &&
		    booted.prefix == s->net_prefix;
	int e = done ? 0 : configure_links(s, msg, mlen);
	if (e == 0)
		e = write_etc(s, msg, mlen);
	if (e == 0)
		set_proxy_env(s);
	return e;
}

/* --- the sandbox's CA (secrets) ------------------------------------------ */

#define CA_NAME "capsule-ca.pem"	/* in /etc/ssl/certs */
#define BUNDLE_NAME "capsule-bundle.pem"	/* in /etc/ssl */
#define SYSTEM_NAME "ca-certificates.crt"	/* in /etc/ssl/certs, Debian's */
#define CA_PATH "/etc/ssl/certs/" CA_NAME
#define BUNDLE_PATH "/etc/ssl/" BUNDLE_NAME
#define SYSTEM_PATH "/etc/ssl/certs/" SYSTEM_NAME
/* The lines around the CA in the system bundle: what a later boot finds
 * and removes, so the file holds one CA of capsule's, the current one. */
#define BLOCK_BEGIN "# capsule sandbox CA (added at SETUP, replaced at each boot)"
#define BLOCK_END "# end of capsule sandbox CA"
/* Larger than any distribution's bundle (Debian's: about 220 KB). */
#define SYSTEM_MAX (8u << 20)

/* The line of s (from its start) that equals line exactly, or NULL. */
static const char *find_line(const char *s, const char *line)
{
	size_t n = strlen(line);
	for (const char *p = s; *p;) {
		if (strncmp(p, line, n) == 0 && (p[n] == '\n' || p[n] == '\0'))
			return p;
		const char *nl = strchr(p, '\n');
		if (!nl)
			break;
		p = nl + 1;
	}
	return NULL;
}

/* Past the end of the line at p (its '\n' included). */
static const char *line_end(const char *p)
{
	const char *nl = strchr(p, '\n');
	return nl ? nl + 1 : p + strlen(p);
}

/* Remove every block of ours from text (in place). A block whose end line
 * is missing (the file was edited) ends at its certificate's last line,
 * so that the image's certificates after it are kept. Returns whether
 * there was one. */
static bool strip_block(char *text)
{
	bool found = false;
	char *b;
	while ((b = (char *)find_line(text, BLOCK_BEGIN))) {
		const char *after = line_end(b);
		const char *e = find_line(after, BLOCK_END);
		if (!e)
			e = find_line(after, "-----END CERTIFICATE-----");
		const char *stop = e ? line_end(e) : after + strlen(after);
		memmove(b, stop, strlen(stop) + 1);
		found = true;
	}
	return found;
}

/* Read a bundle of the image, at/name, into a new string (*out NULL when
 * there is none). With follow, a symbolic link is read through, but only
 * to a regular file anyone may read (what the tool user could read
 * anyway: never root's secrets into a file of everyone's); *is_link says
 * name was one. */
static int read_bundle(int at, const char *name, const char *shown, bool follow, char **out,
		       bool *is_link, char *msg, size_t mlen)
{
	struct stat st;
	*out = NULL;
	*is_link = false;
	if (fstatat(at, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno == ENOENT)
			return 0;
		int e = errno;
		snprintf(msg, mlen, "cannot read %s: %s", shown, strerror(e));
		return -e;
	}
	*is_link = S_ISLNK(st.st_mode);
	if (*is_link && !follow) {
		snprintf(msg, mlen, "cannot read %s: a symbolic link", shown);
		return -ELOOP;
	}
	int fd = openat(at, name, O_RDONLY | O_CLOEXEC | (*is_link ? 0 : O_NOFOLLOW));
	if (fd < 0) {
		int e = errno;
		if (e == ENOENT && *is_link)
			return 0;	/* a dangling link: no bundle */
		snprintf(msg, mlen, "cannot read %s: %s", shown, strerror(e));
		return -e;
	}
	int e = 0;
	if (fstat(fd, &st) < 0) {
		e = -errno;
		snprintf(msg, mlen, "cannot read %s: %s", shown, strerror(-e));
	} else if (!S_ISREG(st.st_mode) || (*is_link && !(st.st_mode & S_IROTH))) {
		e = -EINVAL;
		snprintf(msg, mlen, "cannot read %s: not a regular file readable by all", shown);
	} else if ((uint64_t)st.st_size > SYSTEM_MAX) {
		e = -EFBIG;
		snprintf(msg, mlen, "cannot read %s: larger than %u bytes", shown, SYSTEM_MAX);
	}
	char *text = NULL;
	if (e == 0) {
		size_t n = (size_t)st.st_size;
		text = xmalloc(n + 1);
		e = cap_read_exact(fd, text, n);
		if (e < 0)
			snprintf(msg, mlen, "cannot read %s: %s", shown,
				 e == -EPIPE ? "it changed while read" : strerror(-e));
		else if (memchr(text, '\0', n)) {
			e = -EINVAL;
			snprintf(msg, mlen, "cannot read %s: not a text file", shown);
		}
		text[n] = '\0';
	}
	close(fd);
	if (e < 0) {
		free(text);
		return e;
	}
	*out = text;
	return 0;
}

/* The image's trust store as one bundle: Debian's (and Alpine's)
 * /etc/ssl/certs/ca-certificates.crt, else the first of the other
 * distributions' places. *ours says it is the first, the one the CA is
 * added to (unless it is a link: the distribution's own arrangement,
 * rebuilt elsewhere, read and never replaced). Without any, *out is NULL:
 * the bundle is the CA alone (the busybox initramfs has no store). */
static int read_system_bundle(int certs, char **out, bool *ours, char *msg, size_t mlen)
{
	static const char *const others[] = {
		"/etc/pki/tls/certs/ca-bundle.crt",	/* Fedora, RHEL */
		"/etc/pki/ca-trust/extracted/pem/tls-ca-bundle.pem",
		"/etc/ssl/ca-bundle.pem",	/* openSUSE */
		"/etc/ssl/cert.pem",	/* Alpine, the BSDs' layout */
	};
	bool is_link;
	int e = read_bundle(certs, SYSTEM_NAME, SYSTEM_PATH, true, out, &is_link, msg, mlen);
	*ours = !is_link;
	for (size_t i = 0; e == 0 && !*out && i < CAP_ARRAY_SIZE(others); i++) {
		e = read_bundle(AT_FDCWD, others[i], others[i], true, out, &is_link, msg, mlen);
		*ours = false;
	}
	return e;
}

/* Append text and a line end when text has none to b. */
static void put_lines(struct cap_buf *b, const char *text)
{
	size_t n = strlen(text);
	cap_buf_append(b, text, n);
	if (n && text[n - 1] != '\n')
		cap_buf_append(b, "\n", 1);
}

/* Install ca: the CA's file, the system bundle's block, our bundle. */
static int install_ca(int ssl, int certs, const char *ca, char *msg, size_t mlen)
{
	char *system = NULL;
	bool ours;
	struct cap_buf with_ca;
	int e = write_root_file(certs, CA_PATH, CA_NAME, ca, msg, mlen);
	if (e < 0)
		return e;
	if ((e = read_system_bundle(certs, &system, &ours, msg, mlen)) < 0)
		return e;
	cap_buf_init(&with_ca);
	if (system) {
		strip_block(system);
		put_lines(&with_ca, system);
	}
	cap_buf_append(&with_ca, BLOCK_BEGIN "\n", strlen(BLOCK_BEGIN) + 1);
	put_lines(&with_ca, ca);
	cap_buf_append(&with_ca, BLOCK_END "\n", strlen(BLOCK_END) + 1);
	if (system && ours)
		e = write_root_data(certs, SYSTEM_PATH, SYSTEM_NAME, (const char *)cap_buf_head(&with_ca),
				    cap_buf_used(&with_ca), msg, mlen);
	if (e == 0)
		e = write_root_data(ssl, BUNDLE_PATH, BUNDLE_NAME, (const char *)cap_buf_head(&with_ca),
				    cap_buf_used(&with_ca), msg, mlen);
	cap_buf_fini(&with_ca);
	free(system);
	return e;
}

/* No CA in this boot: remove what an earlier one installed. */
static int remove_ca(int ssl, int certs, char *msg, size_t mlen)
{
	char *system = NULL;
	bool is_link;
	struct stat st;
	int e = 0;
	/* A link is never written to (install_ca), so it holds no block. */
	if (fstatat(certs, SYSTEM_NAME, &st, AT_SYMLINK_NOFOLLOW) == 0 && !S_ISLNK(st.st_mode))
		e = read_bundle(certs, SYSTEM_NAME, SYSTEM_PATH, false, &system, &is_link, msg, mlen);
	if (e == 0 && system && strip_block(system))
		e = write_root_file(certs, SYSTEM_PATH, SYSTEM_NAME, system, msg, mlen);
	free(system);
	if (e < 0)
		return e;
	if (unlinkat(ssl, BUNDLE_NAME, 0) < 0 && errno != ENOENT) {
		e = -errno;
		snprintf(msg, mlen, "cannot remove %s: %s", BUNDLE_PATH, strerror(-e));
		return e;
	}
	/* Last: its presence is what says there is something to remove. */
	if (unlinkat(certs, CA_NAME, 0) < 0 && errno != ENOENT) {
		e = -errno;
		snprintf(msg, mlen, "cannot remove %s: %s", CA_PATH, strerror(-e));
		return e;
	}
	return 0;
}

/* /etc/ssl/certs: root's, made so when it is a directory; a symbolic link
 * (Fedora's, to /etc/pki/tls/certs) is followed only to a directory that
 * is root's and writable by root alone already. */
static int open_certs_dir(int ssl, char *msg, size_t mlen)
{
	struct stat st;
	if (fstatat(ssl, "certs", &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISLNK(st.st_mode))
		return open_root_dir_at(ssl, "certs", "/etc/ssl/certs", msg, mlen);
	int fd = openat(ssl, "certs", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		snprintf(msg, mlen, "cannot open /etc/ssl/certs (a symbolic link): %s", strerror(e));
		return -e;
	}
	if (fstat(fd, &st) < 0 || st.st_uid != 0 || (st.st_mode & 022)) {
		close(fd);
		snprintf(msg, mlen, "cannot use /etc/ssl/certs: a symbolic link to a directory "
			 "that others than root may change");
		return -EPERM;
	}
	return fd;
}

int agent_ca_setup(const struct cap_setup *s, char *msg, size_t mlen)
{
	struct stat st;
	const char *ca = s->ca_pem;
	if (!ca && fstatat(AT_FDCWD, CA_PATH, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return 0;	/* none now, none before: the usual boot */
	if (ca && (!find_line(ca, "-----BEGIN CERTIFICATE-----") ||
		   !find_line(ca, "-----END CERTIFICATE-----") || strstr(ca, "capsule sandbox CA"))) {
		snprintf(msg, mlen, "SETUP's CA is not a PEM certificate");
		return -EINVAL;
	}
	int e, root = -1, etc = -1, ssl = -1, certs = -1;
	if ((e = root = open_root_dir("/", msg, mlen)) < 0 ||
	    (e = etc = open_root_dir_at(root, "etc", "/etc", msg, mlen)) < 0 ||
	    (e = ssl = open_root_dir_at(etc, "ssl", "/etc/ssl", msg, mlen)) < 0 ||
	    (e = certs = open_certs_dir(ssl, msg, mlen)) < 0)
		goto out;
	if (ca) {
		e = install_ca(ssl, certs, ca, msg, mlen);
		if (e == 0) {
			agent_env_put("SSL_CERT_FILE=" BUNDLE_PATH);
			agent_env_put("REQUESTS_CA_BUNDLE=" BUNDLE_PATH);
			agent_env_put("GIT_SSL_CAINFO=" BUNDLE_PATH);
			agent_env_put("NODE_EXTRA_CA_CERTS=" CA_PATH);
		}
	} else {
		e = remove_ca(ssl, certs, msg, mlen);
	}
out:
	if (certs >= 0)
		close(certs);
	if (ssl >= 0)
		close(ssl);
	if (etc >= 0)
		close(etc);
	if (root >= 0)
		close(root);
	return e;
}
