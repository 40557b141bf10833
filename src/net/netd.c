/* netd: see netd.h. The poll loop, the log, the control channel,
 * published ports and the connector; connections are in netd-conn.c and
 * netd-proxy.c, DNS in netd-dns.c. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "netd-int.h"
#include "nflog.h"
#include "sniff.h"
#include "util.h"

#define LOG_LINE_MAX 1024
#define CONTROL_LINE_MAX (1 << 20)
#define FD_RESERVE 64	/* descriptors kept for everything but connections */

/* Fixed entries of the poll set, before the listeners and connections. */
enum { P_CONTROL, P_TCP, P_DNS, P_RESOLVER, P_CONNECTOR, P_NFLOG, P_FIXED };

/* Write a line now or never: a line that does not fit now is dropped.
 * A pipe or terminal that polls writable takes a line this short (under
 * PIPE_BUF) whole; a socket is asked not to block. */
static void log_raw(const struct netd *d, const char *line, size_t len)
{
	int fd = d->cfg->log_fd;

	if (d->log.is_socket) {
		(void)!send(fd, line, len, MSG_DONTWAIT | MSG_NOSIGNAL);
		return;
	}
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLOUT))
		(void)!write(fd, line, len);
}

/* A line within the size cap: a regular file (net.log on the host's
 * disk) stops growing at NETD_LOG_SIZE_MAX, checked every
 * NETD_LOG_SIZE_EVERY lines (so it ends at most that many lines over). */
static void log_write(struct netd *d, const char *line, size_t len)
{
	static const char last[] = "capsule net: net.log reached 64 MiB; further lines are dropped "
				   "(refusals still apply)\n";
	struct netd_logger *l = &d->log;
	struct stat st;

	if (l->full)
		return;
	if (l->regular && l->since_check++ % NETD_LOG_SIZE_EVERY == 0 &&
	    fstat(d->cfg->log_fd, &st) == 0 && st.st_size >= NETD_LOG_SIZE_MAX) {
		l->full = true;
		log_raw(d, last, sizeof(last) - 1);
		return;
	}
	log_raw(d, line, len);
}

static void log_summary(struct netd *d, int64_t now)
{
	char line[128];
	int n = snprintf(line, sizeof(line), "capsule net: %llu more lines suppressed (rate limit)\n",
			 (unsigned long long)d->log.suppressed);

	d->log.suppressed = 0;
	d->log.summary_at = now;
	if (n > 0 && (size_t)n < sizeof(line))
		log_write(d, line, (size_t)n);
}

static void log_refill(struct netd_logger *l, int64_t now)
{
	if (now > l->refilled)
		l->tokens = CAP_MIN(l->tokens + (now - l->refilled) * NETD_LOG_RATE,
				    (int64_t)NETD_LOG_BURST * 1000);
	l->refilled = now;
}

void netd_log_init(struct netd *d, int64_t now)
{
	struct stat st;
	bool ok = fstat(d->cfg->log_fd, &st) == 0;

	d->log = (struct netd_logger){ .is_socket = ok && S_ISSOCK(st.st_mode),
				       .regular = ok && S_ISREG(st.st_mode),
				       .tokens = (int64_t)NETD_LOG_BURST * 1000, .refilled = now };
}

void netd_log_line(struct netd *d, int64_t now, const char *line, size_t len)
{
	struct netd_logger *l = &d->log;

	log_refill(l, now);
	if (l->tokens < 1000) {
		l->suppressed++;
		return;
	}
	l->tokens -= 1000;
	/* Not at every line that passes during a flood: once a second. */
	if (l->suppressed && now - l->summary_at >= 1000)
		log_summary(d, now);
	log_write(d, line, len);
}

void netd_log_tick(struct netd *d, int64_t now, int64_t *next)
{
	struct netd_logger *l = &d->log;

	if (!l->suppressed)
		return;
	int64_t due = l->summary_at + 1000;
	if (now >= due) {
		log_summary(d, now);
		return;
	}
	if (!*next || due < *next)
		*next = due;
}

void netd_log(struct netd *d, const char *fmt, ...)
{
	char line[LOG_LINE_MAX];
	int n = snprintf(line, sizeof(line), "capsule net: ");
	va_list ap;

	va_start(ap, fmt);
	int m = vsnprintf(line + n, sizeof(line) - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (m < 0)
		return;
	size_t len = CAP_MIN((size_t)n + (size_t)m, sizeof(line) - 2);
	line[len++] = '\n';
	/* Every refusal is one such line (netd.h): counted here, before
	 * the log's rate limit may suppress it. */
	if (!strncmp(line + n, "refused ", 8) || !strncmp(line + n, "dropped ", 8))
		__atomic_fetch_add(&d->counters->refused, 1, __ATOMIC_RELAXED);
	netd_log_line(d, cap_now_ms(), line, len);
}

const struct cap_net_policy *netd_policy(const struct netd *d)
{
	return d->owned_policy;
}

/* ---- the connector ------------------------------------------------------------ */

static void connector_gone(struct netd *d, const char *why)
{
	if (d->connector_dead)
		return;
	netd_log(d, "the connector is gone (%s): published ports cannot reach the guest", why);
	d->connector_dead = true;
	for (; d->cq_count; d->cq_count--, d->cq_head = (d->cq_head + 1) % NETD_MAX_CONNS) {
		struct conn *c = conn_find(d, d->cq[d->cq_head].slot, d->cq[d->cq_head].conn_id);
		if (c && c->state == ST_CONNECTOR)
			conn_free(d, c, true);
	}
	d->cq_out_len = 0;
}

static void connector_flush(struct netd *d)
{
	if (d->connector_dead || !d->cq_out_len)
		return;
	ssize_t w = send(d->cfg->connector, d->cq_out, d->cq_out_len, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (w < 0) {
		if (errno != EAGAIN && errno != EINTR)
			connector_gone(d, strerror(errno));
		return;
	}
	memmove(d->cq_out, d->cq_out + w, d->cq_out_len - (size_t)w);
	d->cq_out_len -= (size_t)w;
}

void netd_connector_request(struct netd *d, struct conn *c, uint16_t guest_port)
{
	c->port = guest_port;
	if (d->connector_dead || d->cq_count == NETD_MAX_CONNS) {
		netd_log(d, "cannot reach guest port %u: %s", guest_port,
			 d->connector_dead ? "the connector is gone" : "too many requests to the connector");
		conn_free(d, c, true);
		return;
	}
	cap_put_u16(d->cq_out + d->cq_out_len, guest_port);
	d->cq_out_len += 2;
	unsigned tail = (d->cq_head + d->cq_count++) % NETD_MAX_CONNS;
	d->cq[tail].conn_id = c->id;
	d->cq[tail].slot = c->slot;
	c->state = ST_CONNECTOR;
	c->deadline = cap_now_ms() + NETD_TIMEOUT_MS;
	connector_flush(d);
}

/* One answer: a status byte, with a socket when it is 0. */
static int connector_read_one(struct netd *d)
{
	uint8_t status;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { &status, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf,
			    .msg_controllen = sizeof(u.buf) };
	ssize_t n = recvmsg(d->cfg->connector, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);

	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		connector_gone(d, strerror(errno));
		return 0;
	}
	if (n == 0) {
		connector_gone(d, "it closed its socket");
		return 0;
	}
	int fd = -1;
	for (struct cmsghdr *h = CMSG_FIRSTHDR(&m); h; h = CMSG_NXTHDR(&m, h))
		if (h->cmsg_level == SOL_SOCKET && h->cmsg_type == SCM_RIGHTS &&
		    h->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&fd, CMSG_DATA(h), sizeof(int));
	if (!d->cq_count) {
		if (fd >= 0)
			close(fd);
		connector_gone(d, "it answered a request never made");
		return 0;
	}
	struct conn *c = conn_find(d, d->cq[d->cq_head].slot, d->cq[d->cq_head].conn_id);
	d->cq_head = (d->cq_head + 1) % NETD_MAX_CONNS;
	d->cq_count--;
	if (!c || c->state != ST_CONNECTOR) {	/* timed out meanwhile */
		if (fd >= 0)
			close(fd);
		return 1;
	}
	if (status || fd < 0) {
		netd_log(d, "cannot reach guest port %u: %s", c->port,
			 status ? strerror(status) : "the connector sent no socket");
		if (fd >= 0)
			close(fd);
		conn_free(d, c, true);
		return 1;
	}
	cap_set_nonblock(fd, 1);
	c->b = fd;
	conn_dialing(d, c);
	return 1;
}

static void connector_read(struct netd *d)
{
	for (unsigned i = 0; i < 64 && !d->connector_dead; i++)
		if (!connector_read_one(d))
			return;
}

/* ---- packets the kernel refused ---------------------------------------------------- */

static void nflog_packet(void *ud, const struct cap_nflog_pkt *p)
{
	struct netd *d = ud;
	const char *names[8];
	char line[LOG_LINE_MAX];
	unsigned n = p->version == 4 ? dns_names_for(d, p->daddr, names, 8) : 0;

	netd_log(d, "%s", cap_nflog_describe(p, netd_policy(d), n ? names : NULL, n, line,
					       sizeof(line)));
}

static void nflog_read(struct netd *d)
{
	for (unsigned i = 0; i < 64; i++) {
		ssize_t n = recv(d->cfg->nflog, d->owned_dgram, NETD_DGRAM_MAX, MSG_DONTWAIT);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			/* ENOBUFS: the socket's queue overflowed and the kernel
			 * dropped messages (the refusals still happened); the
			 * next ones come. Not without a trace. */
			if (errno == ENOBUFS) {
				netd_log(d, "some packets the kernel refused were not logged: too many at once");
				continue;
			}
			if (errno != EAGAIN)
				netd_log(d, "cannot read the kernel's refused packets: %s", strerror(errno));
			return;
		}
		int r = cap_nflog_parse(d->owned_dgram, (size_t)n, nflog_packet, d);
		if (r < 0)
			netd_log(d, "a message from NFLOG was skipped: %s", strerror(-r));
	}
}

/* ---- published ports ------------------------------------------------------------ */

static void publish_accept(struct netd *d, const struct listener *l)
{
	char a[16];

	for (unsigned i = 0; i < 64; i++) {
		int fd = accept4(l->fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == ECONNABORTED || errno == EINTR)
				continue;
			if (errno != EAGAIN)
				netd_log(d, "cannot accept on %s:%u: %s", cap_net_addr_str(l->bind, a),
					 l->host_port, strerror(errno));
			return;
		}
		struct conn *c = conn_new(d, CONN_PUBLISH, fd);
		if (!c) {
			netd_log(d, "refused a client of %s:%u: too many connections (%u open, none idle for %lld s)",
				 cap_net_addr_str(l->bind, a), l->host_port, d->max_conns,
				 (long long)(d->head_ms / 1000));
			struct linger lg = { 1, 0 };
			setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
			close(fd);
			continue;
		}
		snprintf(c->desc, sizeof(c->desc), "publish %s:%u to guest port %u",
			 cap_net_addr_str(l->bind, a), l->host_port, l->guest_port);
		netd_connector_request(d, c, l->guest_port);
	}
}

/* A host port to suggest instead of port: 80 -> 8080, 8099 -> 18099. */
static unsigned other_port(uint16_t port)
{
	if (port < 1024)
		return 8000u + port;
	return port <= 55535 ? port + 10000u : port - 10000u;
}

/* Why an automatic mirror failed, and what the user can do instead. */
static void publish_failed(struct netd *d, uint32_t bind_addr, uint16_t host_port,
			   uint16_t guest_port, int err)
{
	char a[16];
	const char *addr = cap_net_addr_str(bind_addr, a);

	if (err == EACCES || err == EPERM)
		netd_log(d, "guest port %u is not mirrored: the host's %s:%u cannot be bound by the policy "
			    "process (%s); publish it explicitly with --publish %u:%u",
			 guest_port, addr, host_port, strerror(err), other_port(host_port), guest_port);
	else if (err == EADDRINUSE)
		netd_log(d, "guest port %u is not mirrored: the host's %s:%u is taken on the host; "
			    "publish it explicitly on a free port, e.g. --publish %u:%u",
			 guest_port, addr, host_port, other_port(host_port), guest_port);
	else
		netd_log(d, "guest port %u is not mirrored: cannot listen on the host's %s:%u (%s)",
			 guest_port, addr, host_port, strerror(err));
}

static void publish(struct netd *d, uint32_t bind_addr, uint16_t host_port, uint16_t guest_port)
{
	char a[16];

	for (unsigned i = 0; i < d->nlisteners; i++) {
		struct listener *l = &d->listeners[i];
		if (l->bind == bind_addr && l->host_port == host_port) {
			l->guest_port = guest_port;
			return;
		}
	}
	if (d->nlisteners == NETD_MAX_LISTENERS) {
		netd_log(d, "cannot publish %s:%u: %u ports are published already",
			 cap_net_addr_str(bind_addr, a), host_port, NETD_MAX_LISTENERS);
		return;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(host_port),
				  .sin_addr.s_addr = htonl(bind_addr) };
	int one = 1;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		publish_failed(d, bind_addr, host_port, guest_port, errno);
		if (fd >= 0)
			close(fd);
		return;
	}
	d->listeners[d->nlisteners++] = (struct listener){ fd, bind_addr, host_port, guest_port };
	if (d->cfg->verbose)
		netd_log(d, "published %s:%u to guest port %u", cap_net_addr_str(bind_addr, a),
			 host_port, guest_port);
}

static void unpublish(struct netd *d, uint16_t host_port)
{
	bool found = false;

	for (unsigned i = 0; i < d->nlisteners;) {
		if (d->listeners[i].host_port != host_port) {
			i++;
			continue;
		}
		close(d->listeners[i].fd);
		d->listeners[i] = d->listeners[--d->nlisteners];
		found = true;
	}
	if (!found)
		netd_log(d, "unpublish %u: that port is not published; ignored", host_port);
}

/* ---- control lines ----------------------------------------------------------------- */

static bool parse_port(const char *s, uint16_t *out)
{
	char *end = NULL;

	if (*s < '0' || *s > '9')
		return false;
	unsigned long v = strtoul(s, &end, 10);
	if (*end || v == 0 || v > 65535)
		return false;
	*out = (uint16_t)v;
	return true;
}

static void control_policy(struct netd *d, char *words)
{
	struct cap_net_policy *p = xmalloc(sizeof(*p));
	struct cap_err err = { 0 };

	if (cap_net_policy_parse_line(p, words, &err) < 0) {
		netd_log(d, "control: policy not changed: %s", err.msg);
		free(p);
		return;
	}
	free(d->owned_policy);
	d->owned_policy = p;
	if (d->cfg->verbose) {
		char *text = cap_net_policy_describe(p);
		netd_log(d, "policy now: %s", text);
		free(text);
	}
}

static int unhex(char c)
{
	return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* "secret K HEX": secret K's value from now on (its credential file
 * changed on the host). Checked as at start; the log names the secret,
 * never the line. */
static void control_secret(struct netd *d, const char *arg)
{
	const struct cap_netd_config *cfg = d->cfg;
	char *end = NULL;
	unsigned long k = strtoul(arg, &end, 10);
	if (end == arg || *end != ' ' || k >= cfg->nsecrets || k >= CAP_NET_MAX_SECRETS) {
		netd_log(d, "control: a secret line for no secret of this sandbox; ignored");
		return;
	}
	const char *hex = end + 1;
	size_t hl = strlen(hex), n = hl / 2;
	const char *name = cfg->secrets[k].decl->name;
	if (hl % 2 || n < CAP_NET_SECRET_VALUE_MIN || n > CAP_NET_SECRET_VALUE_MAX) {
		netd_log(d, "control: secret %s: not a value of %d to %d bytes in hex; ignored", name,
			 CAP_NET_SECRET_VALUE_MIN, CAP_NET_SECRET_VALUE_MAX);
		return;
	}
	char *v = xmalloc(n + 1);
	for (size_t i = 0; i < n; i++) {
		int hi = unhex(hex[2 * i]), lo = unhex(hex[2 * i + 1]);
		unsigned char c = (unsigned char)(hi << 4 | lo);
		if (hi < 0 || lo < 0 || c < 0x20 || c == 0x7f) {
			explicit_bzero(v, n + 1);
			free(v);
			netd_log(d, "control: secret %s: not a value (hex digits of bytes 0x20 to 0x7e and beyond); ignored",
				 name);
			return;
		}
		v[i] = (char)c;
	}
	v[n] = '\0';
	if (d->owned_values[k]) {
		explicit_bzero(d->owned_values[k], d->value_lens[k]);
		free(d->owned_values[k]);
	}
	d->owned_values[k] = v;
	d->value_lens[k] = n;
	netd_log(d, "secret %s: a new value for the next connections", name);
}

static void control_line(void *ud, const char *p, size_t n)
{
	struct netd *d = ud;
	char *line = xstrndup(p, n);
	char q[200];

	if (n && line[n - 1] == '\r')
		line[--n] = '\0';
	char b[32], hp[16], gp[16], extra[2];
	uint32_t bind_addr;
	uint16_t host_port, guest_port;
	if (!strncmp(line, "secret ", 7)) {
		control_secret(d, line + 7);
	} else if (!strcmp(line, "policy") || !strncmp(line, "policy ", 7)) {
		control_policy(d, line + 6);
	} else if (!strncmp(line, "publish ", 8) &&
		   sscanf(line + 8, "%31s %15s %15s %1s", b, hp, gp, extra) == 3 &&
		   cap_net_addr_parse(b, &bind_addr) && parse_port(hp, &host_port) &&
		   parse_port(gp, &guest_port)) {
		publish(d, bind_addr, host_port, guest_port);
	} else if (!strncmp(line, "unpublish ", 10) && sscanf(line + 10, "%15s %1s", hp, extra) == 1 &&
		   parse_port(hp, &host_port)) {
		unpublish(d, host_port);
	} else {
		netd_log(d, "control: cannot apply %s; ignored", cap_sniff_quote(line, n, q, sizeof(q)));
	}
	explicit_bzero(line, n);
	free(line);
}

static void control_too_long(void *ud)
{
	netd_log(ud, "control: a line over %d bytes; ignored", CONTROL_LINE_MAX);
}

static void control_read(struct netd *d)
{
	uint8_t *p = cap_buf_reserve(&d->control, 65536);
	ssize_t n = read(d->cfg->control, p, 65536);

	if (n < 0) {
		if (errno == EAGAIN || errno == EINTR)
			return;
		netd_log(d, "control: %s; stopping", strerror(errno));
		d->stop = true;
		return;
	}
	if (n == 0) {
		d->stop = true;
		return;
	}
	cap_buf_commit(&d->control, (size_t)n);
	cap_buf_lines(&d->control, CONTROL_LINE_MAX, &d->control_lines, control_line,
		      control_too_long, d);
}

/* ---- the loop ----------------------------------------------------------------------- */

struct poll_ref {
	unsigned slot;
	uint64_t id;
	int ia, ib;	/* indexes in the poll set, -1: none */
};

struct loop {
	struct pollfd fds[P_FIXED + NETD_MAX_LISTENERS + 2 * NETD_MAX_CONNS];
	struct poll_ref refs[NETD_MAX_CONNS];
};

static int step(struct netd *d, struct loop *lp)
{
	const struct cap_netd_config *cfg = d->cfg;
	int64_t now = cap_now_ms(), next = 0;

	for (unsigned i = 0; i < NETD_MAX_CONNS; i++) {
		struct conn *c = d->conns[i];
		int64_t due = c ? conn_due(d, c) : 0;
		if (due && due <= now)
			conn_timeout(d, c);
	}
	dns_timeouts(d, now, &next);
	netd_log_tick(d, now, &next);
	/* After the timeouts, which may have set new deadlines. */
	for (unsigned i = 0; i < NETD_MAX_CONNS; i++) {
		struct conn *c = d->conns[i];
		int64_t due = c ? conn_due(d, c) : 0;
		if (due && (!next || due < next))
			next = due;
	}

	struct pollfd *f = lp->fds;
	f[P_CONTROL] = (struct pollfd){ .fd = cfg->control, .events = POLLIN };
	f[P_TCP] = (struct pollfd){ .fd = cfg->tcp_listen, .events = POLLIN };
	f[P_DNS] = (struct pollfd){ .fd = cfg->dns, .events = POLLIN };
	f[P_RESOLVER] = (struct pollfd){ .fd = d->resolver, .events = POLLIN };
	f[P_CONNECTOR] = (struct pollfd){ .fd = d->connector_dead ? -1 : cfg->connector,
					  .events = (short)(POLLIN | (d->cq_out_len ? POLLOUT : 0)) };
	f[P_NFLOG] = (struct pollfd){ .fd = cfg->nflog > STDERR_FILENO ? cfg->nflog : -1,
				      .events = POLLIN };
	unsigned n = P_FIXED;
	unsigned nl = d->nlisteners;
	for (unsigned i = 0; i < nl; i++)
		f[n++] = (struct pollfd){ .fd = d->listeners[i].fd, .events = POLLIN };
	unsigned nrefs = 0;
	for (unsigned i = 0; i < NETD_MAX_CONNS; i++) {
		struct conn *c = d->conns[i];
		if (!c)
			continue;
		short ea, eb;
		conn_poll_events(c, &ea, &eb);
		struct poll_ref *r = &lp->refs[nrefs++];
		*r = (struct poll_ref){ c->slot, c->id, -1, -1 };
		if (ea) {
			r->ia = (int)n;
			f[n++] = (struct pollfd){ .fd = c->a, .events = ea };
		}
		if (eb && c->b >= 0) {
			r->ib = (int)n;
			f[n++] = (struct pollfd){ .fd = c->b, .events = eb };
		}
	}

	int timeout = -1;
	if (next)
		timeout = (int)CAP_MIN(CAP_MAX(next - cap_now_ms(), 0), 60000);
	if (poll(f, n, timeout) < 0) {
		if (errno == EINTR)
			return 0;
		netd_log(d, "cannot poll: %s; the network of %s stops", strerror(errno), cfg->name);
		return -1;
	}

	for (unsigned i = 0; i < nrefs; i++) {
		struct poll_ref *r = &lp->refs[i];
		struct conn *c = conn_find(d, r->slot, r->id);
		short ra = r->ia >= 0 ? f[r->ia].revents : 0, rb = r->ib >= 0 ? f[r->ib].revents : 0;
		if (c && (ra || rb))
			conn_events(d, c, ra, rb);
	}
	/* Listeners by their descriptor: a control line may have changed
	 * the list since the poll set was built (it is read last). */
	for (unsigned i = 0; i < nl; i++)
		if (f[P_FIXED + i].revents)
			for (unsigned j = 0; j < d->nlisteners; j++)
				if (d->listeners[j].fd == f[P_FIXED + i].fd) {
					publish_accept(d, &d->listeners[j]);
					break;
				}
	if (f[P_TCP].revents)
		conn_accept_guest(d, cfg->tcp_listen);
	if (f[P_DNS].revents)
		dns_guest_query(d);
	if (f[P_RESOLVER].revents)
		dns_upstream_reply(d);
	if (f[P_CONNECTOR].revents & POLLOUT)
		connector_flush(d);
	if (f[P_CONNECTOR].revents & (POLLIN | POLLHUP | POLLERR))
		connector_read(d);
	if (f[P_NFLOG].revents)
		nflog_read(d);
	if (f[P_CONTROL].revents)
		control_read(d);
	return 0;
}

/* How many connections the descriptor limit allows (two each), at most
 * want (0: NETD_MAX_CONNS). */
static unsigned conn_limit(unsigned nlisteners, unsigned want)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 64;
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		if (setrlimit(RLIMIT_NOFILE, &rl) < 0)
			getrlimit(RLIMIT_NOFILE, &rl);
	}
	rlim_t spare = rl.rlim_cur > FD_RESERVE + nlisteners ? rl.rlim_cur - FD_RESERVE - nlisteners : 2;
	unsigned most = want && want < NETD_MAX_CONNS ? want : NETD_MAX_CONNS;
	return (unsigned)CAP_MAX(1, CAP_MIN(spare / 2, most));
}

static void netd_free(struct netd *d)
{
	for (unsigned i = 0; i < NETD_MAX_CONNS; i++)
		if (d->conns[i])
			conn_free(d, d->conns[i], false);
	for (unsigned i = 0; i < d->nlisteners; i++)
		close(d->listeners[i].fd);
	dns_fini(d);
	intercept_fini(d);
	cap_buf_fini(&d->control);
	for (unsigned k = 0; k < CAP_NET_MAX_SECRETS; k++)
		if (d->owned_values[k]) {
			explicit_bzero(d->owned_values[k], d->value_lens[k]);
			free(d->owned_values[k]);
		}
	free(d->proxy.owned_no_proxy);
	free(d->owned_policy);
	if (d->counters != &d->local_counters)
		munmap(d->counters, sizeof(*d->counters));
	free(d);
}

/* The shared counters file, mapped (before the system call filter),
 * else counters of its own. */
static void counters_map(struct netd *d)
{
	int fd = d->cfg->counters_fd;
	struct stat sb;
	void *p = MAP_FAILED;
	d->counters = &d->local_counters;
	if (fd <= STDERR_FILENO)
		return;
	if (fstat(fd, &sb) == 0 && (size_t)sb.st_size >= sizeof(*d->counters))
		p = mmap(NULL, sizeof(*d->counters), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		netd_log(d, "cannot map the counters file (descriptor %d): %s; capsule serve's network figures stay at 0",
			 fd, strerror(errno));
		return;
	}
	d->counters = p;
	memset(d->counters, 0, sizeof(*d->counters));
	__atomic_store_n(&d->counters->magic, CAP_NETD_COUNTERS_MAGIC, __ATOMIC_RELEASE);
}

int cap_netd_counters_read(const char *path, struct cap_netd_counters *out)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = pread(fd, out, sizeof(*out), 0);
	close(fd);
	if (n != (ssize_t)sizeof(*out) || out->magic != CAP_NETD_COUNTERS_MAGIC) {
		memset(out, 0, sizeof(*out));
		return -EBADMSG;
	}
	return 0;
}

int cap_netd_main(const struct cap_netd_config *cfg)
{
	struct netd *d = xcalloc(1, sizeof(*d));
	int rc = 0;

	d->cfg = cfg;
	d->counters = &d->local_counters;
	netd_log_init(d, cap_now_ms());
	counters_map(d);
	signal(SIGPIPE, SIG_IGN);
	/* It may hold secrets' values and a CA key: no core dump, and no
	 * other process of its user may read its memory or trace it. */
	if (cfg->nsecrets > 0)
		prctl(PR_SET_DUMPABLE, 0, 0, 0, 0);
	d->owned_policy = xmalloc(sizeof(*d->owned_policy));
	*d->owned_policy = *cfg->policy;
	cap_buf_init(&d->control);
	d->control.wipe = true;
	int fds[] = { cfg->control, cfg->dns, cfg->tcp_listen, cfg->connector,
		      cfg->nflog > STDERR_FILENO ? cfg->nflog : -1 };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(fds); i++)
		if (fds[i] >= 0)
			cap_set_nonblock(fds[i], 1);
	unsigned np = CAP_MIN(cfg->npublish, cfg->policy->npublish);
	if (cfg->npublish != cfg->policy->npublish)
		netd_log(d, "%u published ports' sockets for %u --publish: the extra ones are not served",
			 cfg->npublish, cfg->policy->npublish);
	for (unsigned i = 0; i < np && i < NETD_MAX_LISTENERS; i++) {
		const struct cap_net_publish *p = &cfg->policy->publish[i];
		cap_set_nonblock(cfg->publish_fds[i], 1);
		d->listeners[d->nlisteners++] =
			(struct listener){ cfg->publish_fds[i], p->bind, p->host_port, p->guest_port };
	}
	d->max_conns = conn_limit(d->nlisteners, cfg->max_conns);
	d->head_ms = cfg->head_timeout_ms ? cfg->head_timeout_ms : NETD_HEAD_MS;
	d->idle_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms : NETD_IDLE_MS;
	dns_init(d);
	upstream_init(d);
	if (intercept_init(d) < 0) {
		netd_free(d);
		return 1;
	}
	/* Last: every file it reads is read, every socket it starts with
	 * made, the TLS keys loaded. */
	if (cfg->seccomp) {
		int r = netd_seccomp();
		if (r == -ENOTSUP) {
			netd_log(d, "no system call filter on this architecture: the policy process runs without one");
		} else if (r < 0) {
			netd_log(d, "cannot install the policy process's system call filter: %s; the network of %s stops",
				 strerror(-r), cfg->name);
			netd_free(d);
			return 1;
		}
	}

	struct loop *lp = xmalloc(sizeof(*lp));
	while (!d->stop) {
		if (step(d, lp) < 0) {
			rc = 1;
			break;
		}
	}
	free(lp);
	netd_free(d);
	return rc;
}
