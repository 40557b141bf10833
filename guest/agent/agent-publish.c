/* Auto-publish in the guest (docs/protocol.md, "Listeners"): about once a
 * second, from the agent's own poll loop, read /proc/net/tcp, tell the
 * host the set of TCP ports listened on when it changes, and relay the
 * ports listened on 127.0.0.1 only from the guest's address, where the
 * host's forward arrives.
 *
 * Each relay is a child process of its own, forked by the agent with its
 * listening socket already bound (so any port works), which drops to
 * RELAY_UID with no privileges and copies bytes between each accepted
 * connection and 127.0.0.1:PORT. The agent only forks and kills them: a
 * relay that fails or dies cannot hurt the agent's loop. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "agent.h"
#include "util.h"

#define SCAN_INTERVAL_MS 1000
/* Lines of /proc/net/tcp read in one scan (every socket has one). */
#define SCAN_MAX_LINES 65536
#define RELAY_MAX 64
/* Connections one relay carries at once; more wait in its backlog. */
#define RELAY_CONNS 64
#define RELAY_BUF (16 * 1024)

enum relay_state {
	RELAY_RUNNING,	/* pid is its process */
	RELAY_FAILED,	/* could not start; tried again at each scan */
	RELAY_DEAD,	/* exited by itself; not restarted for this listener */
};

struct relay {
	uint16_t port;
	enum relay_state state;
	pid_t pid;
};

/* Per port, what a scan saw listening on it. */
#define SEEN_ANY 0x1	/* 0.0.0.0 */
#define SEEN_LOOPBACK 0x2	/* 127.0.0.1 */
#define SEEN_ADDR 0x4	/* the guest's own address */

static struct {
	bool on;
	uint32_t addr;	/* host order */
	int64_t next_ms;	/* next scan */
	bool force;	/* send the set at the next scan, changed or not */
	bool sent_once;
	uint16_t sent[CAP_PROTO_MAX_LISTENERS];
	uint32_t nsent;
	struct relay relays[RELAY_MAX];
	size_t nrelays;
	bool full_logged;	/* "too many relays" said once per episode */
	uint8_t seen[65536];
} P;

void agent_publish_start(uint32_t addr)
{
	P.on = true;
	P.addr = addr;
	P.next_ms = 0;
	P.force = true;
}

int agent_publish_timeout(int64_t now)
{
	if (!P.on)
		return -1;
	return P.next_ms <= now ? 0 : (int)CAP_MIN(P.next_ms - now, (int64_t)SCAN_INTERVAL_MS);
}

void agent_publish_resend(void)
{
	if (!P.on)
		return;
	P.force = true;
	P.next_ms = 0;
}

/* Fill P.seen from /proc/net/tcp (IPv4 only: the guest has no IPv6). */
static int scan(void)
{
	FILE *f = fopen("/proc/net/tcp", "re");
	if (!f)
		return -errno;
	memset(P.seen, 0, sizeof(P.seen));
	char line[512];
	for (int i = 0; i < SCAN_MAX_LINES && fgets(line, sizeof(line), f); i++) {
		unsigned addr, port, state;
		/* "  sl  local_address rem_address   st ...": the local
		 * address is the kernel's __be32 printed as a native
		 * integer, the port in host order. */
		if (sscanf(line, " %*u: %8x:%4x %*8x:%*4x %2x", &addr, &port, &state) != 3 ||
		    state != 0x0a || port == 0 || port > 0xffff)
			continue;
		uint32_t a = ntohl((uint32_t)addr);
		if (a == INADDR_ANY)
			P.seen[port] |= SEEN_ANY;
		else if (a == INADDR_LOOPBACK)
			P.seen[port] |= SEEN_LOOPBACK;
		else if (a == P.addr)
			P.seen[port] |= SEEN_ADDR;
	}
	fclose(f);
	return 0;
}

static struct relay *relay_find(uint16_t port)
{
	for (size_t i = 0; i < P.nrelays; i++)
		if (P.relays[i].port == port)
			return &P.relays[i];
	return NULL;
}

/* --- a relay's own process -------------------------------------------- */

struct dir {
	size_t off, len;	/* bytes in buf not yet written */
	bool eof;	/* the source said end of stream */
	bool shut;	/* and it was passed on (shutdown SHUT_WR) */
	uint8_t buf[RELAY_BUF];
};

struct conn {
	int fd[2];	/* 0: accepted, 1: to 127.0.0.1:PORT */
	bool connecting;
	struct dir d[2];	/* d[i]: from fd[i] to fd[1 - i] */
};

/* End a connection; reset what is still open after an error, so the
 * other side sees a failure, not a clean end. */
static void conn_close(struct conn **cp, bool reset)
{
	struct conn *c = *cp;
	for (int i = 0; i < 2; i++) {
		if (c->fd[i] < 0)
			continue;
		if (reset) {
			struct linger l = { .l_onoff = 1, .l_linger = 0 };
			setsockopt(c->fd[i], SOL_SOCKET, SO_LINGER, &l, sizeof(l));
		}
		close(c->fd[i]);
	}
	free(c);
	*cp = NULL;
}

/* Move what can move without blocking; false when the connection ended. */
static bool conn_pump(struct conn *c, bool *reset)
{
	if (c->connecting) {
		int err = 0;
		socklen_t len = sizeof(err);
		if (getsockopt(c->fd[1], SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err == EINPROGRESS || err == EALREADY)
			return true;
		if (err) {
			*reset = true;
			return false;
		}
		struct pollfd p = { .fd = c->fd[1], .events = POLLOUT };
		if (poll(&p, 1, 0) <= 0)
			return true;	/* still connecting */
		c->connecting = false;
	}
	for (int i = 0; i < 2; i++) {
		struct dir *d = &c->d[i];
		int from = c->fd[i], to = c->fd[1 - i];
		if (d->len == 0 && !d->eof) {
			ssize_t n = recv(from, d->buf, sizeof(d->buf), MSG_DONTWAIT);
			if (n > 0) {
				d->off = 0;
				d->len = (size_t)n;
			} else if (n == 0) {
				d->eof = true;
			} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
				*reset = true;
				return false;
			}
		}
		while (d->len > d->off) {
			ssize_t n = send(to, d->buf + d->off, d->len - d->off, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n < 0) {
				if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)
					break;
				*reset = true;
				return false;
			}
			d->off += (size_t)n;
		}
		if (d->off == d->len)
			d->off = d->len = 0;
		if (d->eof && d->len == 0 && !d->shut) {
			shutdown(to, SHUT_WR);	/* pass the half-close on */
			d->shut = true;
		}
	}
	return !(c->d[0].shut && c->d[1].shut);
}

/* Accept one connection and start its connect to 127.0.0.1:port. */
static void relay_accept(int lfd, uint16_t port, struct conn **slot)
{
	int a = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (a < 0) {
		/* Out of descriptors or memory: the connection stays in the
		 * backlog and the socket readable; wait instead of spinning. */
		if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM)
			usleep(100 * 1000);
		return;
	}
	struct conn *c = xcalloc(1, sizeof(*c));
	c->fd[0] = a;
	c->fd[1] = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_in to = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (c->fd[1] < 0 ||
	    (connect(c->fd[1], (struct sockaddr *)&to, sizeof(to)) < 0 && errno != EINPROGRESS)) {
		conn_close(&c, true);	/* refused: the client sees a reset */
		return;
	}
	c->connecting = true;
	*slot = c;
}

/* The events fd needs for conn c; 0 when it waits for nothing (then it
 * is left out of poll, so a hang-up it reports cannot spin the loop). */
static short conn_events(const struct conn *c, int i)
{
	if (c->connecting)
		return i == 1 ? POLLOUT : 0;
	short ev = 0;
	if (c->d[i].len == 0 && !c->d[i].eof)
		ev |= POLLIN;
	if (c->d[1 - i].len > 0)
		ev |= POLLOUT;
	return ev;
}

__attribute__((noreturn)) static void relay_main(int lfd, uint16_t port)
{
	static struct conn *conns[RELAY_CONNS];
	struct pollfd pfd[1 + 2 * RELAY_CONNS];
	int owner[1 + 2 * RELAY_CONNS];

	for (;;) {
		nfds_t n = 0;
		size_t nconns = 0;
		for (size_t i = 0; i < RELAY_CONNS; i++)
			nconns += conns[i] != NULL;
		if (nconns < RELAY_CONNS) {
			owner[n] = -1;
			pfd[n++] = (struct pollfd){ .fd = lfd, .events = POLLIN };
		}
		for (size_t i = 0; i < RELAY_CONNS; i++) {
			for (int k = 0; conns[i] && k < 2; k++) {
				short ev = conn_events(conns[i], k);
				if (!ev)
					continue;
				owner[n] = (int)i;
				pfd[n++] = (struct pollfd){ .fd = conns[i]->fd[k], .events = ev };
			}
		}
		if (poll(pfd, n, -1) < 0) {
			if (errno == EINTR)
				continue;
			_exit(1);
		}
		for (nfds_t j = 0; j < n; j++) {
			if (!pfd[j].revents)
				continue;
			if (owner[j] < 0) {
				if (pfd[j].revents & (POLLERR | POLLNVAL))
					_exit(1);
				for (size_t i = 0; i < RELAY_CONNS; i++)
					if (!conns[i]) {
						relay_accept(lfd, port, &conns[i]);
						break;
					}
				continue;
			}
			struct conn **c = &conns[owner[j]];
			bool reset = false;
			if (*c && !conn_pump(*c, &reset))
				conn_close(c, reset);
		}
	}
}

/* In the forked child: keep only the listening socket (as fd 3) and the
 * console, become RELAY_UID without privileges, and serve. */
__attribute__((noreturn)) static void relay_child(int lfd, uint16_t port)
{
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGCHLD, SIG_DFL);
	signal(SIGPIPE, SIG_IGN);
	if (lfd != 3 && (dup2(lfd, 3) < 0 || close(lfd) < 0))
		_exit(1);
	/* The agent's descriptors (the host's port, commands' pipes) are
	 * close-on-exec, but a relay does not exec. */
	if (syscall(SYS_close_range, 4u, ~0u, 0u) < 0)
		for (int fd = 4; fd < 4096; fd++)
			close(fd);
	struct rlimit nofile = { 8 + 2 * RELAY_CONNS, 8 + 2 * RELAY_CONNS };
	if (setrlimit(RLIMIT_NOFILE, &nofile) < 0 || setgroups(0, NULL) < 0 ||
	    setgid(RELAY_GID) < 0 || setuid(RELAY_UID) < 0 ||
	    prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		_exit(1);
	relay_main(3, port);
}

static int relay_start(struct relay *r)
{
	int one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(r->port),
				  .sin_addr.s_addr = htonl(P.addr) };
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 128) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	pid_t pid = fork();
	if (pid == 0)
		relay_child(fd, r->port);
	int e = errno;
	close(fd);
	if (pid < 0)
		return -e;
	r->pid = pid;
	return 0;
}

static void relay_want(uint16_t port)
{
	struct relay *r = relay_find(port);
	if (r && r->state != RELAY_FAILED)
		return;
	if (!r) {
		if (P.nrelays == RELAY_MAX) {
			if (!P.full_logged)
				agent_log("%d ports are relayed already; port %u, listened on "
					  "127.0.0.1 only, is not reachable from the host", RELAY_MAX, port);
			P.full_logged = true;
			return;
		}
		r = &P.relays[P.nrelays++];
		*r = (struct relay){ .port = port, .state = RELAY_FAILED, .pid = -1 };
		int e = relay_start(r);
		if (e < 0)
			agent_log("cannot relay port %u from the guest's address to 127.0.0.1: %s; "
				  "trying again while it is listened on", port, strerror(-e));
		else
			r->state = RELAY_RUNNING;
		return;
	}
	if (relay_start(r) == 0)	/* failed before: quietly again */
		r->state = RELAY_RUNNING;
}

static void relay_drop(size_t i)
{
	struct relay *r = &P.relays[i];
	if (r->state == RELAY_RUNNING)
		kill(r->pid, SIGKILL);	/* reaped by the agent's loop */
	P.relays[i] = P.relays[--P.nrelays];
	P.full_logged = false;
}

bool agent_publish_reaped(pid_t pid, int status)
{
	for (size_t i = 0; i < P.nrelays; i++) {
		struct relay *r = &P.relays[i];
		if (r->state != RELAY_RUNNING || r->pid != pid)
			continue;
		r->state = RELAY_DEAD;
		agent_log("the relay of port %u ended (%s %d); the port is not relayed until "
			  "it is listened on again", r->port,
			  WIFSIGNALED(status) ? "signal" : "status",
			  WIFSIGNALED(status) ? WTERMSIG(status) : WEXITSTATUS(status));
		return true;
	}
	return false;
}

void agent_publish_tick(int64_t now, struct cap_buf *out)
{
	if (!P.on || now < P.next_ms)
		return;
	P.next_ms = now + SCAN_INTERVAL_MS;
	int e = scan();
	if (e < 0) {
		agent_log("cannot read /proc/net/tcp: %s", strerror(-e));
		return;
	}

	/* A relay's own socket (on the guest's address) is not a listener
	 * of the guest's; any other socket there is. */
	for (size_t i = 0; i < P.nrelays; i++)
		if (P.relays[i].state == RELAY_RUNNING)
			P.seen[P.relays[i].port] &= (uint8_t)~SEEN_ADDR;
	for (size_t i = 0; i < P.nrelays;) {
		if (P.seen[P.relays[i].port] == SEEN_LOOPBACK)
			i++;
		else
			relay_drop(i);
	}

	uint16_t ports[CAP_PROTO_MAX_LISTENERS];
	uint32_t n = 0;
	for (uint32_t port = 1; port <= 0xffff; port++) {
		if (!P.seen[port])
			continue;
		/* Address 0 (a pod's static network): no relay; the host
		 * reaches loopback-only servers with CONNECT instead, and a
		 * relay would open them to the pod's network. */
		if (P.seen[port] == SEEN_LOOPBACK && P.addr)
			relay_want((uint16_t)port);
		if (n < CAP_ARRAY_SIZE(ports))
			ports[n++] = (uint16_t)port;
	}
	if (!P.force && P.sent_once && n == P.nsent && memcmp(ports, P.sent, n * sizeof(ports[0])) == 0)
		return;
	CAP_BUG_ON(cap_proto_listeners_encode(out, ports, n) < 0);
	memcpy(P.sent, ports, n * sizeof(ports[0]));
	P.nsent = n;
	P.sent_once = true;
	P.force = false;
}
