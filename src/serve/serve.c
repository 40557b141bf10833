/* JSON-RPC 2.0 for `capsule serve` and for any front end that shares a
 * controller: one message per line on a unix socket (0600). Tool methods
 * carry the identity {agent, peer} from the trusted caller; no parameter
 * of a tool method can name a sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <unistd.h>

#include "controller.h"
#include "jsonrpc.h"
#include "log.h"
#include "paths.h"
#include "serve-conn.h"
#include "serve.h"
#include "sock.h"
#include "util.h"

static const struct cap_ctl_frontend_ops rpc_ops;

/* --- connections ------------------------------------------------------------- */

static void conn_free(struct cap_rpc_server *s, struct conn *k)
{
	/* Its calls are cancelled: queued ones end now (done() unlinks
	 * them), running ones when the guest says so, without an answer. */
	for (struct pending *p = k->calls; p; p = p->next)
		p->conn = NULL;
	serve_checks_forget(s, k);
	struct pending *p = k->calls;
	k->calls = NULL;
	while (p) {
		struct pending *next = p->next;
		p->next = NULL;
		if (p->call)
			cap_ctl_cancel(s->ctl, p->call);
		p = next;
	}
	for (struct conn **q = &s->conns; *q; q = &(*q)->next)
		if (*q == k) {
			*q = k->next;
			break;
		}
	close(k->fd);
	cap_rpc_reader_fini(&k->rd);
	cap_buf_fini(&k->out);
	free(k);
	s->nconns--;
	s->stats.connections = (unsigned)s->nconns;
}

void serve_noted(struct cap_rpc_server *s, int code)
{
	if (!s->cur.open)
		return;
	s->cur.open = false;
	serve_stats_note(&s->stats, s->cur.mi, code, cap_now_ns() - s->cur.start_ns);
}

void serve_pending_begin(struct cap_rpc_server *s, struct pending *p)
{
	p->mi = s->cur.open ? s->cur.mi : SIZE_MAX;	/* SIZE_MAX: not counted */
	p->start_ns = s->cur.start_ns;
	s->cur.open = false;
}

void serve_error(struct conn *k, json_t *id, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	serve_noted(k->srv, code);
	if (!id)
		return;	/* a notification is never answered */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_rpc_put_error(&k->out, id, code, msg, NULL);
}

/* The answer to a request (none to a notification); result is stolen. */
void serve_result(struct conn *k, json_t *id, json_t *result)
{
	serve_noted(k->srv, 0);
	if (id)
		cap_rpc_put_result(&k->out, id, result);
	else
		json_decref(result);
}

static void rpc_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	struct cap_rpc_server *s = fe;
	struct pending *p = tag;
	(void)c;
	/* Counted for p's method, not for a request being run (a cancel
	 * that ended p at once). */
	bool open = s->cur.open;
	s->cur.open = false;
	int code = serve_answer(s, p, r);
	s->cur.open = open;
	serve_stats_note(&s->stats, p->mi, code, cap_now_ns() - p->start_ns);
	if (p->conn)
		for (struct pending **q = &p->conn->calls; *q; q = &(*q)->next)
			if (*q == p) {
				*q = p->next;
				break;
			}
	json_decref(p->id);
	free(p->owned_to);
	json_decref(p->size);
	free(p);
}

/* A notification to the caller of a request waiting for the
 * preparation (none for a notification of its own: nothing to name). */
static void rpc_progress(void *fe, struct cap_ctl *c, void *tag, const struct cap_prep_event *ev)
{
	struct pending *p = tag;
	(void)fe, (void)c;
	if (!p->conn || !p->id || p->conn->closing)
		return;
	cap_rpc_put_request(&p->conn->out, -1, "progress",
			    json_pack("{s:O, s:s, s:s, s:i, s:i, s:o}", "request", p->id,
				      "phase", cap_prep_phase_name(ev->phase), "status", cap_prep_status_name(ev->status),
				      "done", (int)ev->done, "total", CAP_PREP_NPHASES,
				      "message", cap_json_text(ev->message ? ev->message : "")));
}

/* --- the front end ------------------------------------------------------------------- */

struct line_ctx {
	struct cap_rpc_server *s;
	struct conn *k;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct line_ctx *lc = ud;
	if (!lc->k->closing)
		serve_handle(lc->s, lc->k, p, n);
}

static void on_too_long(void *ud)
{
	struct line_ctx *lc = ud;
	char msg[100];
	snprintf(msg, sizeof(msg), "request line over %zu bytes; it was dropped", REQUEST_MAX);
	cap_rpc_put_error(&lc->k->out, NULL, CAP_RPC_INVALID, msg, NULL);
}

static void rpc_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	if (!s->stopped)
		cap_ctl_poll_add(p, s->listen_fd, POLLIN, NULL);
	if (s->check_efd >= 0)
		cap_ctl_poll_add(p, s->check_efd, POLLIN, &s->check_efd);
	for (struct conn *k = s->conns; k; k = k->next)
		if (!k->closing)
			cap_ctl_poll_add(p, k->fd, (short)(POLLIN | (cap_buf_used(&k->out) ? POLLOUT : 0)), k);
}

static void rpc_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct cap_rpc_server *s = fe;
	struct conn *k = tag;
	(void)c;
	if (tag == &s->check_efd) {
		serve_checks_ready(s);
		return;
	}
	if (!k) {
		int fd;
		while ((fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
			if (s->nconns >= MAX_CONNS) {
				/* Said, not silently dropped: the client learns why. */
				struct cap_buf b;
				char msg[200];
				cap_buf_init(&b);
				snprintf(msg, sizeof(msg), "the controller serves at most %d connections at once; close one and retry",
					 MAX_CONNS);
				cap_rpc_put_error(&b, NULL, CAP_RPC_SANDBOX, msg, json_pack("{s:b}", "retryable", 1));
				cap_rpc_flush(&b, fd);
				cap_buf_fini(&b);
				close(fd);
				continue;
			}
			k = xcalloc(1, sizeof(*k));
			k->srv = s;
			k->fd = fd;
			cap_rpc_reader_init(&k->rd);
			k->rd.max = REQUEST_MAX;	/* an inline upload */
			cap_buf_init(&k->out);
			k->next = s->conns;
			s->conns = k;
			s->nconns++;
			s->stats.connections = (unsigned)s->nconns;
		}
		if ((errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
			/* Out of descriptors: the pending connection would wake
			 * poll at once for ever. Take it with the spare
			 * descriptor and close it: the client sees it refused. */
			cap_log(CAP_LOG_WARN, "refused a connection: %s", strerror(errno));
			close(s->spare_fd);
			fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0)
				close(fd);
			s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		}
		return;
	}
	if (k->closing || !(revents & (POLLIN | POLLHUP | POLLERR)))
		return;
	struct line_ctx lc = { s, k };
	if (cap_rpc_read(&k->rd, k->fd, on_line, on_too_long, &lc) == 0)
		k->closing = true;	/* freed in flush: this round's slots name it */
}

static void rpc_flush(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	for (struct conn *k = s->conns, *next; k; k = next) {
		next = k->next;
		if (!k->closing && cap_rpc_flush(&k->out, k->fd) < 0)
			k->closing = true;
		if (k->closing)
			conn_free(s, k);
	}
}

static void rpc_shutdown(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	s->stopped = true;
}

static const struct cap_ctl_frontend_ops rpc_ops = {
	.name = "serve",
	.pollfds = rpc_pollfds,
	.ready = rpc_ready,
	.flush = rpc_flush,
	.done = rpc_done,
	.shutdown = rpc_shutdown,
	.progress = rpc_progress,
};

static int server_new(struct cap_ctl *c, const char *path, int fd, struct cap_rpc_server **out,
		      struct cap_err *err)
{
	struct cap_rpc_server *s = xcalloc(1, sizeof(*s));
	_cleanup_free_ char *lockp = xasprintf("%s.lock", path);
	s->ctl = c;
	s->listen_fd = fd;
	s->adopted = fd >= 0;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->check_efd = -1;
	s->path = xstrdup(path);
	serve_stats_init(&s->stats, serve_method_count());
	/* One server per socket (two homes could name the same one). A
	 * service manager that hands the socket over makes sure of that
	 * itself: a lock that cannot be made beside it is not needed. */
	s->lock_fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if ((s->lock_fd < 0 && !s->adopted) || (s->lock_fd >= 0 && flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0)) {
		cap_rpc_server_free(s);
		return cap_err_set(err, EBUSY, "another capsule controller is using %s (%s is locked)", path, lockp);
	}
	if (!s->adopted)
		s->listen_fd = cap_unix_listen(path, err);
	if (s->listen_fd < 0) {
		int r = s->listen_fd;
		cap_rpc_server_free(s);
		return r;
	}
	s->fe = cap_ctl_add_frontend(c, &rpc_ops, s);
	*out = s;
	return 0;
}

int cap_rpc_server_new(struct cap_ctl *c, const char *path, struct cap_rpc_server **out,
		       struct cap_err *err)
{
	return server_new(c, path, -1, out, err);
}

int cap_rpc_server_adopt(struct cap_ctl *c, int fd, const char *path, struct cap_rpc_server **out,
			 struct cap_err *err)
{
	return server_new(c, path, fd, out, err);
}

void cap_rpc_server_free(struct cap_rpc_server *s)
{
	if (!s)
		return;
	serve_checks_fini(s);
	while (s->conns) {
		struct conn *k = s->conns;
		s->conns = k->next;
		for (struct pending *p = k->calls, *next; p; p = next) {
			next = p->next;	/* the core is gone: nothing will answer */
			json_decref(p->id);
			free(p->owned_to);
			json_decref(p->size);
	json_decref(p->size);
			free(p);
		}
		close(k->fd);
		cap_rpc_reader_fini(&k->rd);
		cap_buf_fini(&k->out);
		free(k);
	}
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		if (!s->adopted)
			unlink(s->path);	/* a handed-over socket stays its manager's */
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	serve_metrics_free(s->metrics);
	serve_stats_fini(&s->stats);
	free(s->path);
	free(s);
}

int cap_serve_run(struct cap_controller_cfg *cfg, const char *socket_path, const char *metrics_addr,
		  struct cap_err *err)
{
	struct cap_ctl *c = NULL;
	struct cap_rpc_server *s = NULL;
	_cleanup_free_ char *home = cap_home_dir();
	char cwd[4096];
	_cleanup_free_ char *path = !socket_path ? xasprintf("%s/serve.sock", home)
			: socket_path[0] == '/' || !getcwd(cwd, sizeof(cwd)) ? xstrdup(socket_path)
			: xasprintf("%s/%s", cwd, socket_path);	/* others find it by this name */
	cfg->frontend = "serve";
	cfg->socket_path = NULL;	/* named once it listens */
	/* Socket activation: the service manager's socket, whatever
	 * --socket says. */
	char *apath = NULL;
	int afd = cap_unix_activated(&apath, err);
	if (afd < 0 && afd != -ENOENT)
		return afd;
	if (afd >= 0) {
		if (socket_path && strcmp(socket_path, apath) != 0)
			cap_log(CAP_LOG_WARN, "--socket %s is not used: the service manager passed %s", socket_path, apath);
		free(path);
		path = apath;
	}
	/* The metrics address before anything slow: a bad one fails now. */
	char *bound = NULL, *unlink_path = NULL;
	int mfd = -1, r = 0;
	if (metrics_addr) {
		_cleanup_free_ char *mpath = metrics_addr[0] == '/' || !getcwd(cwd, sizeof(cwd))
						     ? xstrdup(metrics_addr)
						     : xasprintf("%s/%s", cwd, metrics_addr);
		if (strchr(metrics_addr, '/') && strcmp(mpath, path) == 0)
			mfd = cap_err_set(err, EINVAL, "--metrics %s is the JSON-RPC socket; give the metrics a path of their own",
					  metrics_addr);
		else
			mfd = serve_metrics_listen(metrics_addr, &bound, &unlink_path, err);
		if (mfd < 0) {
			if (afd >= 0)
				close(afd);
			return mfd;
		}
	}
	cap_ctl_check_image(cfg);
	r = cap_ctl_new(cfg, &c, err);
	if (r < 0 && afd >= 0)
		close(afd);
	if (r == 0)
		r = afd >= 0 ? cap_rpc_server_adopt(c, afd, path, &s, err) : cap_rpc_server_new(c, path, &s, err);
	if (mfd >= 0 && r < 0) {
		close(mfd);
		if (unlink_path)
			unlink(unlink_path);
		free(bound);
		free(unlink_path);
	} else if (mfd >= 0) {
		r = serve_metrics_new(c, s, mfd, bound, unlink_path, &s->metrics, err);
	}
	if (r == 0 && (r = cap_ctl_set_socket(c, path, err)) == 0) {
		cap_log(CAP_LOG_INFO, "listening on %s%s", path, afd >= 0 ? " (passed by the service manager)" : "");
		if (s->metrics)
			cap_log(CAP_LOG_INFO, "metrics on %s (GET /metrics)", serve_metrics_addr(s->metrics));
		r = cap_ctl_run(c, err);
	}
	cap_ctl_free(c);
	cap_rpc_server_free(s);
	return r;
}
