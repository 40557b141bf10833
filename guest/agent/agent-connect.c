/* CONNECT (docs/protocol.md, "Connect"): a TCP connection the agent
 * opens to 127.0.0.1:PORT in the guest for the host, whose bytes travel
 * on the stream as STDIN (to the guest's server) and STDOUT (from it),
 * an empty frame a half-close each way. It is how a pod's PortForward
 * reaches a server of the guest, whatever address it listens on
 * (0.0.0.0 or 127.0.0.1 only): the host dials its pod namespace's
 * 127.0.0.1, the agent dials the guest's. */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "agent.h"
#include "util.h"

#define CONNECT_MAX 64
#define READ_CHUNK (32 * 1024)
/* Stop reading the host while this much waits for one guest socket. */
#define PENDING_HIGH (4u << 20)

struct fwd {
	uint32_t id;	/* 0: free slot */
	uint16_t port;
	int fd;
	bool connecting;	/* connect() in progress */
	struct cap_buf pending;	/* from the host, not yet written */
	bool in_close;	/* the host half-closed: shut our side once pending is written */
	bool wr_shut, rd_eof;
};

static struct fwd F[CONNECT_MAX];

static void release(struct fwd *c)
{
	if (c->fd >= 0)
		close(c->fd);
	cap_buf_fini(&c->pending);
	memset(c, 0, sizeof(*c));
	c->fd = -1;
}

static struct fwd *find(uint32_t id)
{
	for (size_t i = 0; id && i < CONNECT_MAX; i++)
		if (F[i].id == id)
			return &F[i];
	return NULL;
}

bool agent_connect_has(uint32_t id)
{
	return find(id) != NULL;
}

/* The connection failed or broke: ERROR on its stream, and it is gone. */
static void fail(struct fwd *c, int e, const char *what, struct cap_buf *out)
{
	char msg[160];
	snprintf(msg, sizeof(msg), "%s 127.0.0.1:%u in the guest: %s", what, c->port, strerror(e));
	cap_proto_error_encode(out, c->id, e, msg);
	release(c);
}

void agent_connect_open(uint32_t id, const uint8_t *p, size_t n, struct cap_buf *out)
{
	uint16_t port;
	if (cap_proto_connect_decode(p, n, &port) < 0) {
		cap_proto_error_encode(out, id, EBADMSG, "malformed CONNECT");
		return;
	}
	if (id == 0 || find(id)) {
		cap_proto_error_encode(out, id, EINVAL, "CONNECT on stream 0 or on a stream in use");
		return;
	}
	struct fwd *c = NULL;
	for (size_t i = 0; i < CONNECT_MAX && !c; i++)
		if (!F[i].id)
			c = &F[i];
	if (!c) {
		cap_proto_error_encode(out, id, EBUSY, "too many forwarded connections in the guest (64)");
		return;
	}
	*c = (struct fwd){ .id = id, .port = port, .fd = -1 };
	cap_buf_init(&c->pending);
	c->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (c->fd < 0) {
		fail(c, errno, "cannot connect to", out);
		return;
	}
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		if (errno != EINPROGRESS) {
			fail(c, errno, "cannot connect to", out);
			return;
		}
		c->connecting = true;
	}
}

bool agent_connect_stdin(uint32_t id, const uint8_t *p, size_t n)
{
	struct fwd *c = find(id);
	if (!c)
		return false;
	if (c->in_close)
		return true;	/* after the host's half-close: dropped */
	if (n == 0)
		c->in_close = true;
	else
		cap_buf_append(&c->pending, p, n);
	return true;
}

bool agent_connect_signal(uint32_t id, struct cap_buf *out)
{
	struct fwd *c = find(id);
	if (!c)
		return false;
	/* The host's side broke: the guest's server sees a reset. */
	struct linger l = { .l_onoff = 1, .l_linger = 0 };
	if (c->fd >= 0)
		setsockopt(c->fd, SOL_SOCKET, SO_LINGER, &l, sizeof(l));
	fail(c, ECONNABORTED, "the host reset its connection to", out);
	return true;
}

bool agent_connect_busy(void)
{
	for (size_t i = 0; i < CONNECT_MAX; i++)
		if (F[i].id && cap_buf_used(&F[i].pending) > PENDING_HIGH)
			return true;
	return false;
}

int agent_connect_poll(struct pollfd *pfd, uint32_t *ids, int max, bool backlog)
{
	int n = 0;
	for (size_t i = 0; i < CONNECT_MAX && n < max; i++) {
		struct fwd *c = &F[i];
		if (!c->id)
			continue;
		short ev = 0;
		if (c->connecting)
			ev = POLLOUT;
		else {
			if (!c->rd_eof && !backlog)
				ev |= POLLIN;
			if (cap_buf_used(&c->pending) || (c->in_close && !c->wr_shut))
				ev |= POLLOUT;
		}
		if (!ev)
			continue;
		ids[n] = c->id;
		pfd[n++] = (struct pollfd){ .fd = c->fd, .events = ev };
	}
	return n;
}

/* Both ways ended: EXIT code 0. */
static void maybe_done(struct fwd *c, struct cap_buf *out)
{
	if (!c->rd_eof || !c->wr_shut)
		return;
	struct cap_exit ex = { .kind = CAP_EXIT_CODE, .value = 0 };
	cap_proto_exit_encode(out, c->id, &ex);
	release(c);
}

static void on_event(struct fwd *c, short revents, struct cap_buf *out)
{
	if (c->connecting) {
		int e = 0;
		socklen_t len = sizeof(e);
		if (getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &e, &len) < 0)
			e = errno;
		if (e) {
			fail(c, e, "cannot connect to", out);
			return;
		}
		c->connecting = false;
		return;
	}
	if (revents & (POLLIN | POLLHUP | POLLERR)) {
		uint8_t buf[READ_CHUNK];
		ssize_t n = c->rd_eof ? 0 : read(c->fd, buf, sizeof(buf));
		if (n > 0)
			cap_proto_put(out, CAP_MSG_STDOUT, c->id, buf, (size_t)n);
		else if (n == 0 && !c->rd_eof) {
			c->rd_eof = true;
			cap_proto_put(out, CAP_MSG_STDOUT, c->id, NULL, 0);
		} else if (n < 0 && errno != EAGAIN && errno != EINTR) {
			fail(c, errno, "the connection broke to", out);
			return;
		}
	}
	while (cap_buf_used(&c->pending) > 0) {
		ssize_t n = send(c->fd, cap_buf_head(&c->pending), cap_buf_used(&c->pending), MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EAGAIN || errno == EINTR)
				break;
			fail(c, errno, "the connection broke to", out);
			return;
		}
		cap_buf_consume(&c->pending, (size_t)n);
	}
	if (c->in_close && !c->wr_shut && cap_buf_used(&c->pending) == 0) {
		shutdown(c->fd, SHUT_WR);
		c->wr_shut = true;
	}
	maybe_done(c, out);
}

void agent_connect_events(const struct pollfd *pfd, const uint32_t *ids, int n, struct cap_buf *out)
{
	for (int i = 0; i < n; i++) {
		struct fwd *c = find(ids[i]);
		if (c && pfd[i].revents)
			on_event(c, pfd[i].revents, out);
	}
}

void agent_connect_reset(void)
{
	for (size_t i = 0; i < CONNECT_MAX; i++)
		if (F[i].id)
			release(&F[i]);
}
