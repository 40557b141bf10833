/* A pod's network from the sandbox's side (docs/oci.md, "The pod's
 * network"): what the pod's namespace holds, and PortForward — the
 * shim listens on 127.0.0.1:PORT inside the pod's namespace for each TCP
 * port the guest listens on (LISTENERS), and relays each connection to
 * the guest's 127.0.0.1:PORT over the agent channel (CONNECT), which is
 * where containerd's CRI dials (it enters the pod's namespace and
 * connects to localhost). */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "log.h"
#include "sandbox-internal.h"
#include "util.h"

#define MAX_LISTENERS 256
#define MAX_CONNS 1024
#define READ_CHUNK (64 * 1024)
/* Stop reading the guest while a connection has this much unsent. */
#define OUT_HIGH (4u << 20)

int cap_sandbox_pod_net_read(const char *path, struct cap_pod_net *out, struct cap_err *err)
{
	int ns = open(path, O_RDONLY | O_CLOEXEC);
	if (ns < 0)
		return cap_err_set(err, errno, "the pod's network namespace %s: %s", path, strerror(errno));
	int r = cap_pod_net_read(ns, path, out, err);
	close(ns);
	return r;
}

/* ---- PortForward ------------------------------------------------------ */

struct pf_conn {
	struct cap_portfwd *pf;
	int fd;	/* the accepted connection, -1 once closed */
	uint16_t port;
	uint32_t aid;	/* the agent's stream, 0 once it ended */
	struct cap_buf out;	/* from the guest, not yet sent */
	bool rd_eof;	/* the host's client half-closed (sent on) */
	bool guest_eof;	/* the guest's side half-closed: shut ours once out is sent */
	bool wr_shut;
};

struct pf_listener {
	uint16_t port;
	int fd;
};

struct cap_portfwd {
	struct pf_listener l[MAX_LISTENERS];
	unsigned nl;
	struct pf_conn **c;
	size_t nc, cap;
	struct cap_sandbox *sb;
};

struct cap_portfwd *cap_portfwd_new(void)
{
	return xcalloc(1, sizeof(struct cap_portfwd));
}

/* A socket made in the pod's namespace (bound and listened on outside
 * it: a socket stays in the namespace it was made in). */
static int listen_in(int netns, uint16_t port, struct cap_err *err)
{
	int saved = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
	if (saved < 0)
		return cap_err_set(err, errno, "cannot open /proc/thread-self/ns/net: %s", strerror(errno));
	if (setns(netns, CLONE_NEWNET) < 0) {
		int e = errno;
		close(saved);
		return cap_err_set(err, e, "cannot enter the pod's network namespace: %s", strerror(e));
	}
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int e = errno;
	int back = setns(saved, CLONE_NEWNET);
	CAP_BUG_ON(back < 0);
	close(saved);
	if (fd < 0)
		return cap_err_set(err, e, "socket: %s", strerror(e));
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		e = errno;
		close(fd);
		return cap_err_set(err, e, "cannot listen on 127.0.0.1:%u in the pod's network namespace: %s%s", port,
				   strerror(e), e == EADDRNOTAVAIL ? " (its lo is down: CNI's loopback plugin, "
				   "which containerd's CRI runs for every pod, brings it up)" : "");
	}
	return fd;
}

static bool has(const uint16_t *v, uint32_t n, uint16_t port)
{
	for (uint32_t i = 0; i < n; i++)
		if (v[i] == port)
			return true;
	return false;
}

void cap_portfwd_listeners(struct cap_portfwd *pf, struct cap_sandbox *sb, const uint16_t *ports,
			   uint32_t n)
{
	int netns = cap_sandbox_pod_netns(sb);
	pf->sb = sb;
	if (netns < 0)
		return;
	/* Gone first; the connections they accepted go on. */
	for (unsigned i = 0; i < pf->nl;) {
		if (has(ports, n, pf->l[i].port)) {
			i++;
			continue;
		}
		cap_log(CAP_LOG_INFO, "port-forward: the guest no longer listens on port %u; 127.0.0.1:%u in the pod's namespace closed",
			pf->l[i].port, pf->l[i].port);
		close(pf->l[i].fd);
		pf->l[i] = pf->l[--pf->nl];
	}
	for (uint32_t i = 0; i < n; i++) {
		bool known = false;
		for (unsigned k = 0; k < pf->nl; k++)
			known |= pf->l[k].port == ports[i];
		if (known)
			continue;
		if (pf->nl == MAX_LISTENERS) {
			cap_log(CAP_LOG_WARN, "port-forward: %d ports forwarded already; port %u is not", MAX_LISTENERS, ports[i]);
			continue;
		}
		struct cap_err err = { 0 };
		int fd = listen_in(netns, ports[i], &err);
		if (fd < 0) {
			cap_log(CAP_LOG_WARN, "port-forward: %s; the guest's port %u is not forwarded", err.msg, ports[i]);
			continue;
		}
		cap_log(CAP_LOG_INFO, "port-forward: 127.0.0.1:%u in the pod's namespace reaches the guest's port %u",
			ports[i], ports[i]);
		pf->l[pf->nl++] = (struct pf_listener){ ports[i], fd };
	}
}

/* Close the host's side: with a reset when the guest's broke. */
static void conn_close_fd(struct pf_conn *c, bool reset)
{
	if (c->fd < 0)
		return;
	if (reset) {
		struct linger l = { .l_onoff = 1, .l_linger = 0 };
		setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	}
	close(c->fd);
	c->fd = -1;
}

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct pf_conn *c = ud;
	(void)id;
	(void)fd;
	if (c->fd < 0)
		return;
	if (n == 0)
		c->guest_eof = true;
	else
		cap_buf_append(&c->out, p, n);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	struct pf_conn *c = ud;
	(void)id;
	c->aid = 0;
	if (!ex) {
		/* Refused (nothing listens on the guest's 127.0.0.1:PORT any
		 * more) or broken: the client sees its connection reset. */
		if (errnum != ECONNABORTED)
			cap_log(CAP_LOG_INFO, "port-forward: %s", msg ? msg : strerror(errnum));
		conn_close_fd(c, true);
	}
	/* Else both ways ended: closed once what is left is sent. */
}

static const struct cap_exec_events conn_events = { on_output, on_done, NULL };

static void accept_on(struct cap_portfwd *pf, struct pf_listener *l)
{
	for (;;) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (fd < 0)
			return;
		if (pf->nc >= MAX_CONNS) {
			cap_log(CAP_LOG_WARN, "port-forward: %d connections already; one to port %u refused", MAX_CONNS, l->port);
			close(fd);
			continue;
		}
		struct pf_conn *c = xcalloc(1, sizeof(*c));
		*c = (struct pf_conn){ .pf = pf, .fd = fd, .port = l->port };
		cap_buf_init(&c->out);
		struct cap_err err = { 0 };
		if (cap_sandbox_connect(pf->sb, l->port, &conn_events, c, &c->aid, &err) < 0) {
			cap_log(CAP_LOG_WARN, "port-forward: port %u: %s", l->port, err.msg);
			conn_close_fd(c, true);
			cap_buf_fini(&c->out);
			free(c);
			continue;
		}
		if (pf->nc == pf->cap) {
			pf->cap = pf->cap ? 2 * pf->cap : 16;
			pf->c = xrealloc(pf->c, pf->cap * sizeof(*pf->c));
		}
		pf->c[pf->nc++] = c;
	}
}

size_t cap_portfwd_npoll(const struct cap_portfwd *pf)
{
	return pf->nl + pf->nc;
}

bool cap_portfwd_full(const struct cap_portfwd *pf)
{
	for (size_t i = 0; i < pf->nc; i++)
		if (cap_buf_used(&pf->c[i]->out) > OUT_HIGH)
			return true;
	return false;
}

void cap_portfwd_pollfds(const struct cap_portfwd *pf, struct pollfd *pfd, bool read_ok)
{
	size_t k = 0;
	for (unsigned i = 0; i < pf->nl; i++)
		pfd[k++] = (struct pollfd){ .fd = pf->l[i].fd, .events = POLLIN };
	for (size_t i = 0; i < pf->nc; i++) {
		const struct pf_conn *c = pf->c[i];
		short ev = 0;
		if (c->fd >= 0 && c->aid && !c->rd_eof && read_ok)
			ev |= POLLIN;
		if (c->fd >= 0 && (cap_buf_used(&c->out) || (c->guest_eof && !c->wr_shut)))
			ev |= POLLOUT;
		pfd[k++] = (struct pollfd){ .fd = ev ? c->fd : -1, .events = ev };
	}
}

static void conn_read(struct cap_portfwd *pf, struct pf_conn *c)
{
	uint8_t buf[READ_CHUNK];
	ssize_t n = read(c->fd, buf, sizeof(buf));
	if (n > 0) {
		cap_sandbox_stdin(pf->sb, c->aid, buf, (size_t)n);
	} else if (n == 0) {
		c->rd_eof = true;
		cap_sandbox_stdin(pf->sb, c->aid, NULL, 0);
	} else if (errno != EAGAIN && errno != EINTR) {
		/* The client's side broke: the guest's server sees a reset. */
		cap_sandbox_signal(pf->sb, c->aid, SIGKILL);
		conn_close_fd(c, true);
	}
}

static void conn_write(struct pf_conn *c)
{
	while (cap_buf_used(&c->out) > 0) {
		ssize_t n = send(c->fd, cap_buf_head(&c->out), cap_buf_used(&c->out), MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				return;
			if (c->aid)
				cap_sandbox_signal(c->pf->sb, c->aid, SIGKILL);
			conn_close_fd(c, true);
			return;
		}
		cap_buf_consume(&c->out, (size_t)n);
	}
	if (c->guest_eof && !c->wr_shut) {
		shutdown(c->fd, SHUT_WR);
		c->wr_shut = true;
	}
}

void cap_portfwd_dispatch(struct cap_portfwd *pf, const struct pollfd *pfd)
{
	size_t k = 0;
	unsigned nl = pf->nl;
	size_t nc = pf->nc;
	for (unsigned i = 0; i < nl; i++, k++)
		if (pfd[k].revents & POLLIN)
			accept_on(pf, &pf->l[i]);
	for (size_t i = 0; i < nc; i++, k++) {
		struct pf_conn *c = pf->c[i];
		if (c->fd < 0 || !pfd[k].revents)
			continue;
		if (pfd[k].revents & POLLOUT)
			conn_write(c);
		if (c->fd >= 0 && c->aid && !c->rd_eof && (pfd[k].revents & (POLLIN | POLLHUP | POLLERR)))
			conn_read(pf, c);
	}
	/* Ended both ways and sent, or closed and its stream over: gone. */
	size_t w = 0;
	for (size_t i = 0; i < pf->nc; i++) {
		struct pf_conn *c = pf->c[i];
		if (c->fd >= 0 && !c->aid && !cap_buf_used(&c->out))
			conn_close_fd(c, false);
		if (c->fd < 0 && !c->aid) {
			cap_buf_fini(&c->out);
			free(c);
			continue;
		}
		pf->c[w++] = c;
	}
	pf->nc = w;
}

void cap_portfwd_reset(struct cap_portfwd *pf)
{
	for (unsigned i = 0; i < pf->nl; i++)
		close(pf->l[i].fd);
	pf->nl = 0;
	for (size_t i = 0; i < pf->nc; i++) {
		conn_close_fd(pf->c[i], true);
		cap_buf_fini(&pf->c[i]->out);
		free(pf->c[i]);
	}
	pf->nc = 0;
}

void cap_portfwd_free(struct cap_portfwd *pf)
{
	if (!pf)
		return;
	cap_portfwd_reset(pf);
	free(pf->c);
	free(pf);
}
