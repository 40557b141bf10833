/* Network namespace and nftables of a jailed VM (engine.h, struct
 * cap_vm_net; jail.h, cap_jail_net_*; DESIGN §9). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libmnl/libmnl.h>
#include <linux/netfilter/nfnetlink.h>
#include <linux/netfilter/nfnetlink_log.h>
#include <linux/rtnetlink.h>
#include <net/if.h>
#include <netinet/in.h>
#include <nftables/libnftables.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "engine.h"
#include "engine-net.h"
#include "jail.h"
#include "nflog.h"
#include "util.h"

/* The connector's dial to QEMU's forward, in its own namespace. */
#define CONNECT_TIMEOUT_MS 5000
#define LISTEN_BACKLOG 1024
#define DNS_PORT 53
/* NFLOG: each refusing rule logs at most this many packets a second
 * (bursts of twice that), so that a flood cannot swamp the host's log. */
#define NFLOG_RATE 20
#define NFLOG_ACK_TIMEOUT_MS 1000
#define TABLE "inet capsule"
/* waitid on a pidfd (linux/wait.h; glibc 2.36 does not name it). */
#define IDTYPE_PIDFD ((idtype_t)3)

struct helper {
	pid_t pid;	/* -1: none */
	int pidfd;
};

struct cap_jail_net {
	int netns;
	int control;	/* the owner's end, or -1 */
	struct helper policy, connector;
};

int cap_jail_net_ns(const struct cap_jail_net *n) { return n->netns; }
int cap_jail_net_control_fd(const struct cap_jail_net *n) { return n->control; }
pid_t cap_jail_net_pid(const struct cap_jail_net *n) { return n->policy.pid; }

/* ---- being in the namespace -------------------------------------------- */

/* The calling thread's network namespace, to come back to. */
static int ns_save(struct cap_err *err)
{
	int fd = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open /proc/thread-self/ns/net: %s", strerror(errno));
	return fd;
}

/* Back to the namespace saved (always possible for root: a thread left in
 * a VM's namespace would cut its process off from the host). */
static void ns_restore(int saved)
{
	int r = setns(saved, CLONE_NEWNET);
	CAP_BUG_ON(r < 0);
	close(saved);
}

/* ---- loopback and its route (rtnetlink) -------------------------------- */

/* Send one request and wait for its acknowledgement. 0 or -errno. */
static int rtnl_talk(struct mnl_socket *nl, struct nlmsghdr *nlh, unsigned seq)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	nlh->nlmsg_seq = seq;
	if (mnl_socket_sendto(nl, nlh, nlh->nlmsg_len) < 0)
		return -errno;
	for (;;) {
		ssize_t n = mnl_socket_recvfrom(nl, buf, sizeof(buf));
		if (n < 0)
			return errno == EINTR ? -EINTR : -errno;
		int r = mnl_cb_run(buf, (size_t)n, seq, mnl_socket_get_portid(nl), NULL, NULL);
		if (r < 0)
			return -errno;
		if (r == MNL_CB_STOP)
			return 0;
	}
}

/* lo up, and every IPv4 address local on it: without that route slirp's
 * connect() to any outside address fails with ENETUNREACH before the NAT
 * hook can redirect it. */
static int loopback(struct cap_err *err)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct mnl_socket *nl = mnl_socket_open2(NETLINK_ROUTE, SOCK_CLOEXEC);
	int r;
	if (!nl)
		return cap_err_set(err, errno, "cannot open a netlink socket: %s", strerror(errno));
	if (mnl_socket_bind(nl, 0, MNL_SOCKET_AUTOPID) < 0) {
		r = cap_err_set(err, errno, "cannot bind a netlink socket: %s", strerror(errno));
		goto out;
	}
	unsigned lo = if_nametoindex("lo");
	if (lo == 0) {
		r = cap_err_set(err, errno ? errno : ENODEV, "the VM's network namespace has no lo");
		goto out;
	}

	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_NEWLINK;
	nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	struct ifinfomsg *ifm = mnl_nlmsg_put_extra_header(nlh, sizeof(*ifm));
	ifm->ifi_family = AF_UNSPEC;
	ifm->ifi_index = (int)lo;
	ifm->ifi_flags = IFF_UP;
	ifm->ifi_change = IFF_UP;
	if ((r = rtnl_talk(nl, nlh, 1)) < 0) {
		r = cap_err_set(err, -r, "cannot bring lo up in the VM's network namespace: %s", strerror(-r));
		goto out;
	}

	nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = RTM_NEWROUTE;
	nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK | NLM_F_CREATE | NLM_F_EXCL;
	struct rtmsg *rtm = mnl_nlmsg_put_extra_header(nlh, sizeof(*rtm));
	rtm->rtm_family = AF_INET;
	rtm->rtm_dst_len = 0;
	rtm->rtm_table = RT_TABLE_LOCAL;
	rtm->rtm_protocol = RTPROT_BOOT;
	rtm->rtm_scope = RT_SCOPE_HOST;
	rtm->rtm_type = RTN_LOCAL;
	mnl_attr_put_u32(nlh, RTA_OIF, lo);
	if ((r = rtnl_talk(nl, nlh, 2)) < 0) {
		r = cap_err_set(err, -r, "cannot add the route \"local 0.0.0.0/0 dev lo\" in the VM's network namespace: %s",
				strerror(-r));
		goto out;
	}
	r = 0;
out:
	mnl_socket_close(nl);
	return r;
}

/* Write a sysctl of the calling thread's namespace and read it back. */
static int sysctl_set(const char *name, const char *value, const char *expect,
		      struct cap_err *err)
{
	char path[128];
	snprintf(path, sizeof(path), "/proc/sys/net/ipv4/%s", name);
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int r = fd < 0 ? -errno : cap_write_all(fd, value, strlen(value));
	if (fd >= 0)
		close(fd);
	if (r < 0)
		return cap_err_set(err, -r, "cannot set %s to \"%s\" in the VM's network namespace: %s",
				   path, value, strerror(-r));
	char *got = NULL;
	ssize_t n = cap_read_file(path, 64, &got);
	bool ok = n > 0 && strcmp(got, expect) == 0;
	free(got);
	if (!ok)
		return cap_err_set(err, EIO, "%s in the VM's network namespace did not take \"%s\"", path, value);
	return 0;
}

/* ---- sockets of the policy process --------------------------------------- */

/* Send one NFLOG configuration request and wait for its acknowledgement.
 * 0 or -errno (the kernel's refusal, or -ETIMEDOUT). */
static int nflog_talk(int fd, struct nlmsghdr *nlh, unsigned seq, uint32_t portid)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	struct sockaddr_nl kernel = { .nl_family = AF_NETLINK };
	nlh->nlmsg_seq = seq;
	if (sendto(fd, nlh, nlh->nlmsg_len, 0, (struct sockaddr *)&kernel, sizeof(kernel)) < 0)
		return -errno;
	int64_t end = cap_now_ms() + NFLOG_ACK_TIMEOUT_MS;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof(buf), 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN) {
			/* The kernel answers within sendto; this is only a guard. */
			struct pollfd p = { .fd = fd, .events = POLLIN };
			int left = (int)(end - cap_now_ms());
			if (left <= 0)
				return -ETIMEDOUT;
			if (poll(&p, 1, left) < 0 && errno != EINTR)
				return -errno;
			continue;
		}
		if (n < 0)
			return -errno;
		int r = mnl_cb_run(buf, (size_t)n, seq, portid, NULL, NULL);
		if (r < 0)
			return -errno;
		if (r == MNL_CB_STOP)
			return 0;
	}
}

/* A NFLOG configuration message for the group, with nothing after its
 * header yet. */
static struct nlmsghdr *nflog_msg(char *buf)
{
	struct nlmsghdr *nlh = mnl_nlmsg_put_header(buf);
	nlh->nlmsg_type = NFNL_SUBSYS_ULOG << 8 | NFULNL_MSG_CONFIG;
	nlh->nlmsg_flags = NLM_F_REQUEST | NLM_F_ACK;
	struct nfgenmsg *g = mnl_nlmsg_put_extra_header(nlh, sizeof(*g));
	g->nfgen_family = AF_UNSPEC;
	g->version = NFNETLINK_V0;
	g->res_id = htons(CAP_NFLOG_GROUP);
	return nlh;
}

/* The policy process's NFLOG socket, in the calling thread's namespace:
 * bound to CAP_NFLOG_GROUP, copying CAP_NFLOG_COPY_RANGE bytes of each
 * packet, delivering each packet at once. Needs CAP_NET_ADMIN there.
 * (The per-family NFULNL_CFG_CMD_PF_BIND is a no-op since Linux 3.17:
 * the loggers are bound to every family.) */
static int nflog_socket(struct cap_err *err)
{
	char buf[MNL_SOCKET_BUFFER_SIZE];
	int fd = socket(AF_NETLINK, SOCK_RAW | SOCK_CLOEXEC | SOCK_NONBLOCK, NETLINK_NETFILTER);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot create the policy process's NFLOG socket: %s", strerror(errno));
	struct sockaddr_nl sa = { .nl_family = AF_NETLINK };
	socklen_t len = sizeof(sa);
	int r;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		r = cap_err_set(err, errno, "cannot bind the policy process's NFLOG socket: %s", strerror(errno));
		goto fail;
	}

	struct nlmsghdr *nlh = nflog_msg(buf);
	struct nfulnl_msg_config_cmd cmd = { .command = NFULNL_CFG_CMD_BIND };
	mnl_attr_put(nlh, NFULA_CFG_CMD, sizeof(cmd), &cmd);
	if ((r = nflog_talk(fd, nlh, 1, sa.nl_pid)) < 0) {
		r = cap_err_set(err, -r, "cannot bind NFLOG group %d in the VM's network namespace: %s",
				CAP_NFLOG_GROUP, strerror(-r));
		goto fail;
	}

	nlh = nflog_msg(buf);
	struct nfulnl_msg_config_mode mode = { .copy_range = htonl(CAP_NFLOG_COPY_RANGE),
					       .copy_mode = NFULNL_COPY_PACKET };
	mnl_attr_put(nlh, NFULA_CFG_MODE, sizeof(mode), &mode);
	/* One packet per message, sent at once (the timeout, in hundredths
	 * of a second, only bounds a partial batch). */
	mnl_attr_put_u32(nlh, NFULA_CFG_QTHRESH, htonl(1));
	mnl_attr_put_u32(nlh, NFULA_CFG_TIMEOUT, htonl(1));
	mnl_attr_put_u16(nlh, NFULA_CFG_FLAGS, htons(0));
	if ((r = nflog_talk(fd, nlh, 2, sa.nl_pid)) < 0) {
		r = cap_err_set(err, -r, "cannot configure NFLOG group %d in the VM's network namespace: %s",
				CAP_NFLOG_GROUP, strerror(-r));
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return r;
}

static int bound_socket(int type, uint16_t port, uint16_t *got, struct cap_err *err)
{
	const char *what = type == SOCK_STREAM ? "TCP" : "UDP";
	int fd = socket(AF_INET, type | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot create the policy process's %s socket: %s", what, strerror(errno));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	socklen_t len = sizeof(sa);
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 ||
	    (type == SOCK_STREAM && listen(fd, LISTEN_BACKLOG) < 0) ||
	    getsockname(fd, (struct sockaddr *)&sa, &len) < 0) {
		int e = errno;
		close(fd);
		return cap_err_set(err, e, "cannot set up the policy process's %s socket on 127.0.0.1:%u: %s",
				   what, port, strerror(e));
	}
	if (got)
		*got = ntohs(sa.sin_port);
	return fd;
}

/* ---- nftables --------------------------------------------------------- */

__attribute__((format(printf, 2, 3))) static void bprintf(struct cap_buf *b, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	CAP_BUG_ON(n < 0);
	char *w = (char *)cap_buf_reserve(b, (size_t)n + 1);
	va_start(ap, fmt);
	vsnprintf(w, (size_t)n + 1, fmt, ap);
	va_end(ap);
	cap_buf_commit(b, (size_t)n);
}

static int cmp_range(const void *a, const void *b)
{
	const uint32_t *x = a, *y = b;
	return (x[0] > y[0]) - (x[0] < y[0]);
}

/* The ranges as nftables set elements ("a.b.c.d-e.f.g.h, ..."), sorted
 * and merged (an interval set refuses overlaps). Nothing when n is 0. */
static int deny_elements(struct cap_buf *b, const uint32_t (*deny)[2], unsigned n,
			 struct cap_err *err)
{
	if (n == 0)
		return 0;
	uint32_t (*v)[2] = xmalloc(n * sizeof(*v));
	for (unsigned i = 0; i < n; i++) {
		if (deny[i][0] > deny[i][1]) {
			free(v);
			return cap_err_set(err, EINVAL, "denied range %u is empty (its start is above its end)", i);
		}
		v[i][0] = deny[i][0];
		v[i][1] = deny[i][1];
	}
	qsort(v, n, sizeof(*v), cmp_range);
	unsigned k = 0;
	for (unsigned i = 1; i < n; i++) {
		if (v[k][1] == UINT32_MAX || v[i][0] <= v[k][1] + 1) {
			v[k][1] = CAP_MAX(v[k][1], v[i][1]);
			continue;
		}
		k++;
		v[k][0] = v[i][0];
		v[k][1] = v[i][1];
	}
	for (unsigned i = 0; i <= k; i++) {
		char lo[INET_ADDRSTRLEN], hi[INET_ADDRSTRLEN];
		struct in_addr a = { htonl(v[i][0]) }, z = { htonl(v[i][1]) };
		inet_ntop(AF_INET, &a, lo, sizeof(lo));
		inet_ntop(AF_INET, &z, hi, sizeof(hi));
		if (v[i][0] == v[i][1])
			bprintf(b, "%s%s", i ? ", " : "", lo);
		else
			bprintf(b, "%s%s-%s", i ? ", " : "", lo, hi);
	}
	free(v);
	return 0;
}

/* Run nftables commands in the calling thread's network namespace (the
 * context's netlink socket belongs to the namespace it is made in). */
static int nft_run(const char *cmds, const char *what, struct cap_err *err)
{
	struct nft_ctx *ctx = nft_ctx_new(NFT_CTX_DEFAULT);
	if (!ctx)
		return cap_err_set(err, ENOMEM, "cannot %s: libnftables failed to start", what);
	nft_ctx_buffer_output(ctx);
	nft_ctx_buffer_error(ctx);
	int r = 0;
	if (nft_run_cmd_from_buffer(ctx, cmds) != 0) {
		const char *msg = nft_ctx_get_error_buffer(ctx);
		char first[400];
		snprintf(first, sizeof(first), "%s", msg && *msg ? msg : "nftables refused the rules");
		first[strcspn(first, "\n")] = '\0';
		r = cap_err_set(err, EIO, "cannot %s: %s", what, first);
	}
	nft_ctx_free(ctx);
	return r;
}

/* The ruleset of engine.h's struct cap_vm_net for QEMU's uid. lport 0:
 * no policy process, so nothing is redirected or let through. */
static int ruleset(struct cap_buf *b, uid_t uid, uint16_t lport, uint16_t proxy_port,
		   const struct cap_vm_net *cfg, struct cap_err *err)
{
	bprintf(b, "table " TABLE " {\n"
		   "  set deny {\n    type ipv4_addr\n    flags interval\n");
	if (cfg->ndeny) {
		bprintf(b, "    elements = { ");
		int r = deny_elements(b, cfg->deny, cfg->ndeny, err);
		if (r < 0)
			return r;
		bprintf(b, " }\n");
	}
	bprintf(b, "  }\n");
	if (lport) {
		bprintf(b, "  chain nat_out {\n"
			   "    type nat hook output priority -100; policy accept;\n"
			   "    meta skuid != %u accept\n", (unsigned)uid);
		/* The proxy lives at the gateway even when the host is denied,
		 * and so does DNS over TCP: slirp sends the guest's TCP to
		 * 10.0.2.3:53 to the jail's nameserver, 127.0.0.1:53, which
		 * the policy process answers (SO_ORIGINAL_DST 127.0.0.1:53). */
		if (proxy_port)
			bprintf(b, "    ip daddr 127.0.0.1 tcp dport %u redirect to :%u\n", proxy_port, lport);
		bprintf(b, "    ip daddr 127.0.0.1 tcp dport %u redirect to :%u\n", DNS_PORT, lport);
		bprintf(b, "    ip daddr @deny return\n"
			   "    meta l4proto tcp redirect to :%u\n"
			   "  }\n", lport);
	}
	bprintf(b, "  chain filter_out {\n"
		   "    type filter hook output priority 0; policy accept;\n"
		   "    meta skuid != %u accept\n"
		   "    ct state established,related accept\n", (unsigned)uid);
	/* Only what the NAT chain redirected reaches the listener: 127.0.0.0/8
	 * may be denied, and a direct connection to it is then refused. */
	if (lport)
		bprintf(b, "    ct status dnat ip daddr 127.0.0.1 tcp dport %u accept\n", lport);
	/* With a policy process, what is refused is logged first for it. A
	 * rule of its own: over the rate, "limit" stops the logging rule
	 * only, never the refusal. */
	if (lport)
		bprintf(b, "    ip daddr @deny meta l4proto tcp limit rate %u/second burst %u packets "
			   "log prefix \"%s\" group %d\n",
			NFLOG_RATE, 2 * NFLOG_RATE, CAP_NFLOG_PREFIX_RESET, CAP_NFLOG_GROUP);
	bprintf(b, "    ip daddr @deny meta l4proto tcp reject with tcp reset\n");
	if (lport)
		bprintf(b, "    ip daddr 127.0.0.1 udp dport %u accept\n"
			   "    limit rate %u/second burst %u packets log prefix \"%s\" group %d\n",
			DNS_PORT, NFLOG_RATE, 2 * NFLOG_RATE, CAP_NFLOG_PREFIX_DROP, CAP_NFLOG_GROUP);
	bprintf(b, "    drop\n  }\n}\n");
	return 0;
}

/* ---- the connector ------------------------------------------------------ */

/* Connect to QEMU's forward 127.0.0.2:port: 0 and *out, or an errno. */
static int dial(uint16_t port, int *out)
{
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return errno;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(0x7f000002u) };
	int e = 0;
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		e = errno;
		if (e == EINPROGRESS) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			int64_t end = cap_now_ms() + CONNECT_TIMEOUT_MS;
			int r, left;
			while ((left = (int)(end - cap_now_ms())) > 0 &&
			       (r = poll(&p, 1, left)) < 0 && errno == EINTR)
				;
			socklen_t len = sizeof(e);
			if (!(p.revents & (POLLOUT | POLLERR | POLLHUP)))
				e = ETIMEDOUT;
			else if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
				e = errno;
		}
	}
	if (e) {
		close(fd);
		return e;
	}
	*out = fd;
	return 0;
}

/* One status byte, with the connected socket when it is 0. */
static int answer(int fd, int status, int sock)
{
	uint8_t st = (uint8_t)(status > 0 && status < 256 ? status : status ? EIO : 0);
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	memset(&u, 0, sizeof(u));
	struct iovec iov = { &st, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (st == 0) {
		m.msg_control = u.buf;
		m.msg_controllen = sizeof(u.buf);
		struct cmsghdr *c = CMSG_FIRSTHDR(&m);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &sock, sizeof(int));
	}
	ssize_t n;
	while ((n = sendmsg(fd, &m, MSG_NOSIGNAL)) < 0 && errno == EINTR)
		;
	return n == 1 ? 0 : -EPIPE;
}

/* The connector (netd.h, cap_netd_config.connector), inside the VM's
 * namespace: one request at a time until the policy process goes. */
struct connector_run {
	int fd;
	const struct cap_vm_net *cfg;
};

static int connector_main(void *ud)
{
	const struct connector_run *run = ud;
	int fd = run->fd;
	if (run->cfg->helper_scrub)
		run->cfg->helper_scrub(run->cfg->policy_ud);
	for (;;) {
		uint8_t req[2];
		int r = cap_read_exact(fd, req, sizeof(req));
		if (r < 0)
			return r == -EPIPE ? 0 : 1;
		uint16_t port = cap_get_u16(req);
		int sock = -1;
		int e = port ? dial(port, &sock) : EINVAL;
		r = answer(fd, e, sock);
		if (sock >= 0)
			close(sock);
		if (r < 0)
			return 0;
	}
}

/* ---- the policy process ---------------------------------------------- */

struct policy_run {
	const struct cap_vm_net *cfg;
	struct cap_vm_net_fds fds;
};

static int run_policy(void *ud)
{
	const struct policy_run *p = ud;
	return p->cfg->policy_main(p->cfg->policy_ud, &p->fds);
}

static void helper_stop(struct helper *h)
{
	if (h->pid <= 0)
		return;
	syscall(SYS_pidfd_send_signal, h->pidfd, SIGKILL, NULL, 0);
	siginfo_t info;
	/* ECHILD: someone else reaped it; the pidfd kept its pid from reuse
	 * until then. */
	while (waitid(IDTYPE_PIDFD, (id_t)h->pidfd, &info, WEXITED) < 0 && errno == EINTR)
		;
	close(h->pidfd);
	h->pidfd = -1;
	h->pid = -1;
}

void cap_jail_net_stop(struct cap_jail_net *n)
{
	helper_stop(&n->policy);
	helper_stop(&n->connector);
}

void cap_jail_net_free(struct cap_jail_net *n)
{
	if (!n)
		return;
	cap_jail_net_stop(n);
	if (n->control >= 0)
		close(n->control);
	if (n->netns >= 0)
		close(n->netns);
	free(n);
}

static void close_all(int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0) {
			close(fds[i]);
			fds[i] = -1;
		}
}

/* Inside the new namespace, as root: loopback, sysctls, the policy
 * process's sockets (when it has one) and the rules. */
static int setup(struct cap_jail *j, const struct cap_vm_net *cfg, int *tcp, int *dns,
		 int *nflog, struct cap_err *err)
{
	int r;
	uint16_t lport = 0;
	if ((r = loopback(err)) < 0)
		return r;
	/* Ping sockets stay closed to QEMU's group (slirp forwards ICMP
	 * through them otherwise); every port is QEMU's to bind here, so
	 * that it can forward a guest's low port from 127.0.0.2. */
	if ((r = sysctl_set("ping_group_range", "1 0", "1\t0\n", err)) < 0 ||
	    (r = sysctl_set("ip_unprivileged_port_start", "0", "0\n", err)) < 0)
		return r;
	if (cfg->policy_main) {
		if ((*tcp = bound_socket(SOCK_STREAM, 0, &lport, err)) < 0)
			return *tcp;
		if ((*dns = bound_socket(SOCK_DGRAM, DNS_PORT, NULL, err)) < 0)
			return *dns;
		/* Bound before the rules that log to it exist. */
		if ((*nflog = nflog_socket(err)) < 0)
			return *nflog;
	}
	struct cap_buf b;
	cap_buf_init(&b);
	r = ruleset(&b, cap_jail_uid(j), lport, cfg->proxy_port, cfg, err);
	if (r == 0) {
		cap_buf_append(&b, "", 1);
		r = nft_run((const char *)cap_buf_head(&b), "install the VM's nftables rules", err);
	}
	cap_buf_fini(&b);
	return r;
}

/* What the policy process may read in its root: the host's resolver (its
 * DNS reads the first nameserver of resolv.conf when it starts, and an
 * upstream proxy given by name is resolved with getaddrinfo then, through
 * hosts, nsswitch.conf, host.conf and gai.conf; glibc's files and dns
 * sources are part of libc, other NSS modules are not there and are
 * skipped). */
static const char *const resolver_files[] = {
	"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/host.conf", "/etc/gai.conf",
};

int cap_jail_net_new(struct cap_jail *j, const struct cap_vm_net *cfg,
		     struct cap_jail_net **out, struct cap_err *err)
{
	if (!cap_jail_confined(j))
		return cap_err_set(err, EPERM,
				   "a network policy needs the jail (capsule running as root, CAPSULE_JAIL not 0), which this VM lacks: %s; "
				   "without it QEMU's network would not be filtered, so the VM is not started",
				   *cap_jail_note(j) ? cap_jail_note(j) : "not confined");
	struct cap_jail_net *n = xcalloc(1, sizeof(*n));
	n->netns = n->control = -1;
	n->policy = n->connector = (struct helper){ -1, -1 };
	/* tcp, dns, control pair, connector pair, nflog */
	int fds[7] = { -1, -1, -1, -1, -1, -1, -1 };
	int *keep = NULL;
	int r;

	int saved = ns_save(err);
	if (saved < 0) {
		r = saved;
		goto fail;
	}
	/* Only this thread moves: the rest of the process stays where it is. */
	if (unshare(CLONE_NEWNET) < 0) {
		r = cap_err_set(err, errno, "cannot create the VM's network namespace: %s", strerror(errno));
		close(saved);
		goto fail;
	}
	n->netns = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (n->netns < 0)
		r = cap_err_set(err, errno, "cannot open the VM's network namespace: %s", strerror(errno));
	else
		r = setup(j, cfg, &fds[0], &fds[1], &fds[6], err);
	ns_restore(saved);
	if (r < 0)
		goto fail;
	if (!cfg->policy_main) {
		*out = n;
		return 0;
	}

	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, &fds[2]) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, &fds[4]) < 0) {
		r = cap_err_set(err, errno, "socketpair: %s", strerror(errno));
		goto fail;
	}
	struct policy_run run = {
		.cfg = cfg,
		.fds = { .tcp_listen = fds[0], .dns = fds[1], .connector = fds[4], .control = fds[3],
			 .nflog = fds[6] },
	};
	keep = xmalloc((5 + (size_t)cfg->nkeep) * sizeof(int));
	keep[0] = fds[0];
	keep[1] = fds[1];
	keep[2] = fds[4];
	keep[3] = fds[3];
	keep[4] = fds[6];
	for (unsigned i = 0; i < cfg->nkeep; i++)
		keep[5 + i] = cfg->keep[i];
	pid_t pid = cap_jail_helper(j, -1, resolver_files, CAP_ARRAY_SIZE(resolver_files), keep,
				    5 + cfg->nkeep, run_policy, &run, &n->policy.pidfd, err);
	if (pid < 0) {
		r = pid;
		cap_err_prefix(err, "starting the VM's policy process: ");
		goto fail;
	}
	n->policy.pid = pid;
	struct connector_run crun = { .fd = fds[5], .cfg = cfg };
	pid = cap_jail_helper(j, n->netns, NULL, 0, &fds[5], 1, connector_main, &crun,
			      &n->connector.pidfd, err);
	if (pid < 0) {
		r = pid;
		cap_err_prefix(err, "starting the VM's connector: ");
		goto fail;
	}
	n->connector.pid = pid;
	n->control = fds[2];
	fds[2] = -1;
	close_all(fds, CAP_ARRAY_SIZE(fds));
	free(keep);
	*out = n;
	return 0;
fail:
	close_all(fds, CAP_ARRAY_SIZE(fds));
	free(keep);
	cap_jail_net_free(n);
	return r;
}

int cap_jail_net_deny(struct cap_jail_net *n, const uint32_t (*deny)[2],
		      unsigned ndeny, struct cap_err *err)
{
	struct cap_buf b;
	cap_buf_init(&b);
	/* One transaction: no moment without the set. */
	bprintf(&b, "flush set " TABLE " deny\n");
	int r = 0;
	if (ndeny) {
		bprintf(&b, "add element " TABLE " deny { ");
		r = deny_elements(&b, deny, ndeny, err);
		bprintf(&b, " }\n");
	}
	cap_buf_append(&b, "", 1);
	int saved = r < 0 ? -1 : ns_save(err);
	if (r == 0 && saved < 0)
		r = saved;
	if (r == 0) {
		if (setns(n->netns, CLONE_NEWNET) < 0) {
			r = cap_err_set(err, errno, "cannot enter the VM's network namespace: %s", strerror(errno));
			close(saved);
		} else {
			r = nft_run((const char *)cap_buf_head(&b), "update the VM's denied ranges", err);
			ns_restore(saved);
		}
	}
	cap_buf_fini(&b);
	return r;
}
