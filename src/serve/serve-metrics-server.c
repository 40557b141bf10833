/* serve's metrics endpoint: GET /metrics over HTTP/1.x on a TCP address
 * or a unix socket, served from the controller's loop as a front end of
 * its own. Each connection gets one answer and is closed; a client gets
 * HEAD_TIMEOUT_MS to send its request head and WRITE_TIMEOUT_MS to take
 * the answer, so a slow one costs a descriptor for a while and never
 * the loop. */
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "serve-conn.h"
#include "serve-http.h"
#include "serve-metrics.h"
#include "sock.h"
#include "util.h"

#define MAX_SCRAPERS 16	/* connections at once; more are answered 503 and closed */
#define HEAD_TIMEOUT_MS 5000	/* from the connection to the end of its request head */
#define WRITE_TIMEOUT_MS 10000	/* to take the whole answer */
#define LINGER_MS 1000	/* reading what the client still sends, after the answer */

enum mstate { M_READ, M_WRITE, M_LINGER, M_DONE };

struct mconn {
	int fd;
	enum mstate st;
	char in[SERVE_HTTP_MAX];
	size_t len;
	struct cap_buf out;
	int64_t deadline;	/* cap_now_ms */
	struct mconn *next;
};

struct serve_metrics {
	struct cap_ctl *ctl;
	struct cap_rpc_server *rpc;
	struct cap_ctl_fe *fe;
	int listen_fd, timer_fd;
	int64_t armed;	/* the deadline timer_fd is set to, 0: none */
	char *owned_addr;
	char *owned_unlink;
	bool stopped;
	struct mconn *conns;
	unsigned nconns;
};

/* --- the address ------------------------------------------------------------------ */

static const char forms[] = "give 127.0.0.1:PORT (this host only), [::1]:PORT, HOST:PORT or a unix socket path (holding a '/', e.g. ./metrics.sock)";

static int listen_unix(const char *addr, char **bound, char **unlink_path, struct cap_err *err)
{
	char cwd[4096];
	_cleanup_free_ char *path = addr[0] == '/' || !getcwd(cwd, sizeof(cwd)) ? xstrdup(addr)
				    : xasprintf("%s/%s", cwd, addr);
	struct stat sb;
	if (lstat(path, &sb) == 0 && !S_ISSOCK(sb.st_mode))
		return cap_err_set(err, EEXIST, "--metrics %s: the path exists and is not a socket; give a new path", addr);
	if (lstat(path, &sb) == 0) {
		/* A socket someone still listens on is in use, not stale. */
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
		bool live = probe >= 0 && strlen(path) < sizeof(sa.sun_path) &&
			    connect(probe, (struct sockaddr *)&sa, sizeof(sa)) == 0;
		if (probe >= 0)
			close(probe);
		if (live)
			return cap_err_set(err, EADDRINUSE, "--metrics %s: the address is in use (a program listens on that socket); stop it or give another path",
					   addr);
	}
	int fd = cap_unix_listen(path, err);
	if (fd < 0)
		return cap_err_set(err, -fd, "--metrics %s: %s", addr, err->msg);
	*bound = xstrdup(path);
	*unlink_path = xstrdup(path);
	return fd;
}

/* "HOST:PORT" or "[V6]:PORT" into host and port; false when it is not
 * one of them. */
static bool split_host_port(const char *addr, char *host, size_t hostsz, char port[8])
{
	const char *colon, *h = addr;
	size_t hl;
	if (addr[0] == '[') {
		const char *end = strchr(addr, ']');
		if (!end || end[1] != ':')
			return false;
		h = addr + 1;
		hl = (size_t)(end - h);
		colon = end + 1;
	} else {
		colon = strrchr(addr, ':');
		if (!colon || memchr(addr, ':', (size_t)(colon - addr)))
			return false;	/* none, or an IPv6 address without brackets */
		hl = (size_t)(colon - addr);
	}
	const char *p = colon + 1;
	size_t pl = strlen(p);
	if (hl == 0 || hl >= hostsz || pl == 0 || pl > 5 || strspn(p, "0123456789") != pl || atoi(p) > 65535)
		return false;
	memcpy(host, h, hl);
	host[hl] = '\0';
	memcpy(port, p, pl + 1);
	return true;
}

static char *sockname(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof(ss);
	char h[INET6_ADDRSTRLEN] = "?";
	if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0)
		return xstrdup("?");
	if (ss.ss_family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		inet_ntop(AF_INET6, &a->sin6_addr, h, sizeof(h));
		return xasprintf("[%s]:%u", h, ntohs(a->sin6_port));
	}
	struct sockaddr_in *a = (struct sockaddr_in *)&ss;
	inet_ntop(AF_INET, &a->sin_addr, h, sizeof(h));
	return xasprintf("%s:%u", h, ntohs(a->sin_port));
}

int serve_metrics_listen(const char *addr, char **bound, char **unlink_path, struct cap_err *err)
{
	char host[256], port[8];
	*bound = *unlink_path = NULL;
	if (!*addr)
		return cap_err_set(err, EINVAL, "--metrics is empty; %s", forms);
	if (strchr(addr, '/'))
		return listen_unix(addr, bound, unlink_path, err);
	if (!split_host_port(addr, host, sizeof(host), port))
		return cap_err_set(err, EINVAL, "--metrics '%s' is not an address; %s (a port from 0 to 65535; 0 picks a free one)",
				   addr, forms);
	struct addrinfo hints = { .ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM,
				  .ai_flags = AI_PASSIVE | AI_NUMERICSERV }, *res = NULL;
	int g = getaddrinfo(host, port, &hints, &res);
	if (g != 0)
		return cap_err_set(err, EINVAL, "--metrics %s: host %s does not resolve (%s); %s", addr, host,
				   gai_strerror(g), forms);
	int fd = socket(res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	int one = 1, e = 0;
	if (fd < 0 || setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
	    (res->ai_family == AF_INET6 && setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one)) < 0) ||
	    bind(fd, res->ai_addr, res->ai_addrlen) < 0 || listen(fd, 64) < 0)
		e = errno;
	freeaddrinfo(res);
	if (e) {
		if (fd >= 0)
			close(fd);
		if (e == EADDRINUSE)
			return cap_err_set(err, e, "--metrics %s: the address is in use (another program listens there); stop it or pick another port",
					   addr);
		return cap_err_set(err, e, "--metrics %s: cannot listen there: %s", addr, strerror(e));
	}
	*bound = sockname(fd);
	return fd;
}

/* --- answers ------------------------------------------------------------------------ */

static const char *reason(int status)
{
	switch (status) {
	case 200: return "OK";
	case 400: return "Bad Request";
	case 404: return "Not Found";
	case 405: return "Method Not Allowed";
	case 408: return "Request Timeout";
	case 431: return "Request Header Fields Too Large";
	case 503: return "Service Unavailable";
	default: return "Error";
	}
}

static void put_answer(struct cap_buf *out, int status, const char *type, const struct cap_buf *body,
		       bool head)
{
	char h[400];
	int n = snprintf(h, sizeof(h),
			 "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n%sConnection: close\r\n\r\n",
			 status, reason(status), type, cap_buf_used(body), status == 405 ? "Allow: GET, HEAD\r\n" : "");
	cap_buf_append(out, h, (size_t)n);
	if (!head)
		cap_buf_append(out, cap_buf_head(body), cap_buf_used(body));
}

static void put_error(struct cap_buf *out, int status, const char *why)
{
	struct cap_buf body;
	cap_buf_init(&body);
	cap_buf_append(&body, why, strlen(why));
	cap_buf_append(&body, "\n", 1);
	put_answer(out, status, "text/plain; charset=utf-8", &body, false);
	cap_buf_fini(&body);
}

static int64_t count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	int64_t n = 0;
	if (!d)
		return -1;
	while (readdir(d))
		n++;
	closedir(d);
	return n - 3;	/* ".", ".." and the directory's own */
}

static int64_t resident(void)
{
	char *text = NULL;
	unsigned long long kib;
	if (cap_read_file("/proc/self/status", 1 << 16, &text) < 0)
		return -1;
	const char *at = strstr(text, "\nVmRSS:");
	int64_t r = at && sscanf(at + 7, " %llu kB", &kib) == 1 ? (int64_t)kib * 1024 : -1;
	free(text);
	return r;
}

static void put_metrics(struct serve_metrics *m, struct cap_buf *out, bool head)
{
	struct cap_ctl_metrics cm;
	const char **names = NULL;
	size_t n = serve_method_names(m->rpc, &names);
	struct timespec ts;
	struct rusage ru;
	struct rlimit rl;
	cap_ctl_metrics(m->ctl, &cm);
	clock_gettime(CLOCK_REALTIME, &ts);
	struct serve_metrics_in in = {
		.ctl = &cm, .st = serve_stats_of(m->rpc), .method_names = names, .version = CAPSULE_VERSION,
		.now_unix_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000,
		.cpu_seconds = getrusage(RUSAGE_SELF, &ru) == 0
				       ? (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
						 (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e6
				       : -1,
		.resident_bytes = resident(), .open_fds = count_fds(),
		.max_fds = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY ? (int64_t)rl.rlim_cur : -1,
	};
	CAP_BUG_ON(n != in.st->nmethods);
	struct cap_buf body;
	cap_buf_init(&body);
	serve_metrics_text(&in, &body);
	put_answer(out, 200, "text/plain; version=0.0.4; charset=utf-8", &body, head);
	cap_buf_fini(&body);
	free(names);
}

/* --- connections --------------------------------------------------------------------- */

static void conn_close(struct serve_metrics *m, struct mconn *k)
{
	for (struct mconn **q = &m->conns; *q; q = &(*q)->next)
		if (*q == k) {
			*q = k->next;
			break;
		}
	close(k->fd);
	cap_buf_fini(&k->out);
	free(k);
	m->nconns--;
}

/* Write what is queued; once all of it is out, linger. */
static void conn_write(struct mconn *k)
{
	if (cap_rpc_flush(&k->out, k->fd) < 0) {
		k->st = M_DONE;
		return;
	}
	if (cap_buf_used(&k->out))
		return;
	/* Closing with the client's bytes unread would reset the
	 * connection, and the client might lose the answer: end our side,
	 * read until it ends its own (or LINGER_MS). */
	shutdown(k->fd, SHUT_WR);
	k->st = M_LINGER;
	k->deadline = cap_now_ms() + LINGER_MS;
}

static void conn_answer(struct serve_metrics *m, struct mconn *k, const struct serve_http_req *q)
{
	if (q->status == 200)
		put_metrics(m, &k->out, q->head);
	else
		put_error(&k->out, q->status, q->why);
	k->st = M_WRITE;
	k->deadline = cap_now_ms() + WRITE_TIMEOUT_MS;
	conn_write(k);
}

static void conn_read(struct serve_metrics *m, struct mconn *k)
{
	for (;;) {
		char junk[4096];
		bool reading = k->st == M_READ;
		char *at = reading ? k->in + k->len : junk;
		size_t room = reading ? sizeof(k->in) - k->len : sizeof(junk);
		ssize_t n = read(k->fd, at, room);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (n <= 0) {
			/* Gone, or done sending: a head that never ended gets nothing. */
			k->st = M_DONE;
			return;
		}
		if (!reading)
			continue;
		k->len += (size_t)n;
		struct serve_http_req q;
		if (serve_http_parse(k->in, k->len, &q) == 1) {
			conn_answer(m, k, &q);
			return;
		}
	}
}

static void accept_all(struct serve_metrics *m)
{
	int fd;
	while ((fd = accept4(m->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
		if (m->nconns >= MAX_SCRAPERS) {
			struct cap_buf b;
			cap_buf_init(&b);
			put_error(&b, 503, "too many metrics connections at once; retry");
			cap_rpc_flush(&b, fd);
			cap_buf_fini(&b);
			close(fd);
			continue;
		}
		struct mconn *k = xcalloc(1, sizeof(*k));
		k->fd = fd;
		k->st = M_READ;
		k->deadline = cap_now_ms() + HEAD_TIMEOUT_MS;
		cap_buf_init(&k->out);
		k->next = m->conns;
		m->conns = k;
		m->nconns++;
	}
	if (errno == EMFILE || errno == ENFILE)
		cap_log(CAP_LOG_WARN, "metrics: cannot take a connection: %s", strerror(errno));
}

/* Connections past their deadline: a head that did not come in time is
 * answered 408 (if the client takes it now), the others are closed. */
static void expire(struct serve_metrics *m)
{
	int64_t now = cap_now_ms();
	for (struct mconn *k = m->conns; k; k = k->next) {
		if (k->st == M_DONE || now < k->deadline)
			continue;
		if (k->st == M_READ) {
			put_error(&k->out, 408, "no whole request head within 5 s");
			cap_rpc_flush(&k->out, k->fd);
		}
		k->st = M_DONE;
	}
}

/* --- the front end ---------------------------------------------------------------------- */

static void m_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct serve_metrics *m = fe;
	(void)c;
	int64_t next = 0;
	if (!m->stopped)
		cap_ctl_poll_add(p, m->listen_fd, POLLIN, NULL);
	for (struct mconn *k = m->conns; k; k = k->next) {
		if (k->st == M_DONE)
			continue;
		cap_ctl_poll_add(p, k->fd, k->st == M_WRITE ? POLLOUT : POLLIN, k);
		if (!next || k->deadline < next)
			next = k->deadline;
	}
	/* The loop's own timeout knows nothing of these deadlines: a timer
	 * wakes it for them. */
	if (next != m->armed) {
		struct itimerspec its = { 0 };
		if (next) {
			int64_t ms = next - cap_now_ms();
			if (ms < 1)
				ms = 1;
			its.it_value.tv_sec = ms / 1000;
			its.it_value.tv_nsec = (ms % 1000) * 1000000;
		}
		timerfd_settime(m->timer_fd, 0, &its, NULL);
		m->armed = next;
	}
	if (next)
		cap_ctl_poll_add(p, m->timer_fd, POLLIN, &m->timer_fd);
}

static void m_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct serve_metrics *m = fe;
	(void)c;
	if (!tag) {
		accept_all(m);
		return;
	}
	if (tag == &m->timer_fd) {
		uint64_t n;
		if (read(m->timer_fd, &n, sizeof(n)) < 0) {
			/* nothing: expire() looks at the clock */
		}
		m->armed = 0;
		expire(m);
		return;
	}
	struct mconn *k = tag;
	if (k->st == M_WRITE && (revents & (POLLOUT | POLLERR | POLLHUP)))
		conn_write(k);
	else if (k->st != M_DONE && (revents & (POLLIN | POLLERR | POLLHUP)))
		conn_read(m, k);
}

static void m_flush(void *fe, struct cap_ctl *c)
{
	struct serve_metrics *m = fe;
	(void)c;
	expire(m);
	for (struct mconn *k = m->conns, *next; k; k = next) {
		next = k->next;
		if (k->st == M_DONE)
			conn_close(m, k);
	}
}

static void m_shutdown(void *fe, struct cap_ctl *c)
{
	struct serve_metrics *m = fe;
	(void)c;
	m->stopped = true;
}

static void m_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	(void)fe, (void)c, (void)tag, (void)r;	/* it submits no calls */
}

static const struct cap_ctl_frontend_ops metrics_ops = {
	.name = "metrics",
	.pollfds = m_pollfds,
	.ready = m_ready,
	.flush = m_flush,
	.done = m_done,
	.shutdown = m_shutdown,
};

int serve_metrics_new(struct cap_ctl *c, struct cap_rpc_server *s, int fd, char *bound,
		      char *unlink_path, struct serve_metrics **out, struct cap_err *err)
{
	int tfd = timerfd_create(CLOCK_MONOTONIC, TFD_NONBLOCK | TFD_CLOEXEC);
	if (tfd < 0) {
		int e = errno;
		close(fd);
		if (unlink_path)
			unlink(unlink_path);
		free(bound);
		free(unlink_path);
		return cap_err_set(err, e, "metrics: timerfd_create: %s", strerror(e));
	}
	struct serve_metrics *m = xcalloc(1, sizeof(*m));
	m->ctl = c;
	m->rpc = s;
	m->listen_fd = fd;
	m->owned_addr = bound;
	m->owned_unlink = unlink_path;
	m->timer_fd = tfd;
	m->fe = cap_ctl_add_frontend(c, &metrics_ops, m);
	*out = m;
	return 0;
}

const char *serve_metrics_addr(const struct serve_metrics *m)
{
	return m ? m->owned_addr : NULL;
}

void serve_metrics_free(struct serve_metrics *m)
{
	if (!m)
		return;
	while (m->conns)
		conn_close(m, m->conns);
	close(m->listen_fd);
	close(m->timer_fd);
	if (m->owned_unlink)
		unlink(m->owned_unlink);
	free(m->owned_unlink);
	free(m->owned_addr);
	free(m);
}
