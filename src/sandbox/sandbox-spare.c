/* Spares for `capsule run` (docs/architecture.md, "Spares for capsule
 * run"). `capsule spares` keeps K VMs of the plain run shape (no disk,
 * no NIC, commands as the tool user) restored from their template and
 * warmed by one `true`, and gives each to one `capsule run`, which then
 * talks to the VM's agent itself.
 *
 * The holder (cap_spare_serve) listens on CAPSULE_HOME/spares/run.sock
 * and never waits for a VM. Each spare is a worker process of its own,
 * QEMU's parent: it boots and warms the VM, sends the holder a
 * struct answer and the agent channel's descriptor, and waits. The
 * holder gives a ready spare to the first caller asking for its template
 * key, closes its own copy of the channel, and starts another worker. A
 * given spare's VM lives as long as its caller's connection: when that
 * closes (the run ended, or was killed), the holder closes the worker's
 * socket and the worker kills the VM. A spare is never given twice: the
 * holder keeps no descriptor of it once given. Nothing outlives the
 * holder either: its workers see their sockets close, and QEMU has
 * PDEATHSIG. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sandbox-internal.h"
#include "sock.h"
#include "util.h"

#define MAGIC 0x6361707370617231ull	/* "capspar1" */
#define ASK_MS 2000	/* a caller's whole wait for an answer */
#define PENDING_MS 2000	/* the holder's wait for a caller's request */
#define MAX_GIVEN 256
#define MAX_PENDING 64

/* A caller's request: a spare of this template. */
struct request {
	uint64_t magic;
	uint32_t size;	/* sizeof(struct answer): both ends of one build */
	char key[65];
};

/* The answer, from the holder to a caller and from a worker to the
 * holder: status 0 with the agent channel, else an errno (ENOENT: none
 * ready; ESTALE: spares of another template, held_key) and, from a
 * worker, why in g.boot_note. */
struct answer {
	uint64_t magic;
	uint32_t size;
	int32_t status;
	char held_key[65];
	struct cap_spare_given g;
};

static char *spare_dir(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/spares", home);
}

/* --- the caller's side ----------------------------------------------- */

/* A string from the other end, made safe to print: terminated. */
#define TERMINATE(a) ((a)[sizeof(a) - 1] = '\0')

int cap_spare_take(const char *key, struct cap_spare_given *g, int *agent, int *conn, struct cap_err *err)
{
	_cleanup_free_ char *dir = spare_dir();
	_cleanup_free_ char *path = xasprintf("%s/run.sock", dir);
	/* The whole ask, connect included (a holder whose backlog is full
	 * makes connect wait), is bounded: then a run starts as usual. A
	 * path too long for a socket is one cap_spare_serve refuses to
	 * listen on: no holder. */
	_cleanup_close_ int fd = cap_unix_connect(path, 0, ASK_MS);
	if (fd == -ENOENT || fd == -ECONNREFUSED || fd == -ENAMETOOLONG)
		return -ENOENT;
	if (fd < 0)
		return cap_err_set(err, -fd, "cannot connect to %s: %s", path, strerror(-fd));
	struct request q = { .magic = MAGIC, .size = sizeof(struct answer) };
	snprintf(q.key, sizeof(q.key), "%s", key);
	if (send(fd, &q, sizeof(q), MSG_NOSIGNAL) != (ssize_t)sizeof(q))
		return cap_err_set(err, errno ? errno : EIO, "the spare holder at %s took no request: %s", path,
				   strerror(errno ? errno : EIO));
	struct answer *a = xcalloc(1, sizeof(*a));
	int afd = -1;
	ssize_t n = cap_recv_fd(fd, a, sizeof(*a), &afd);
	int r = 0;
	if (n < 0)
		r = cap_err_set(err, (int)-n, "the spare holder at %s did not answer: %s", path,
				n == -EAGAIN ? "it took over 2 s" : strerror((int)-n));
	else if (n != (ssize_t)sizeof(*a) || a->magic != MAGIC || a->size != sizeof(*a))
		r = cap_err_set(err, EPROTO, "the spare holder at %s is of another capsule build: restart `capsule spares`",
				path);
	else if (a->status == ESTALE) {
		TERMINATE(a->held_key);
		r = cap_err_set(err, ESTALE,
				"`capsule spares` keeps spares of template %.16s, this run needs %.16s (another size or "
				"accelerator, or an upgrade since it started: restart it)", a->held_key, key);
	} else if (a->status == ENOENT)
		r = cap_err_set(err, ENOENT, "no spare was ready (every one given, or starting)");
	else if (a->status != 0 || afd < 0)
		r = cap_err_set(err, EPROTO, "the spare holder at %s gave no VM", path);
	if (r == 0) {
		*g = a->g;
		TERMINATE(g->key);
		TERMINATE(g->agent_version);
		TERMINATE(g->accel.reason);
		TERMINATE(g->boot_note);
		TERMINATE(g->jail_note);
		const char *req = getenv("CAPSULE_REQUIRE_JAIL");
		if (req && strcmp(req, "1") == 0 && *g->jail_note)
			r = cap_err_set(err, EPERM, "the spare's QEMU runs without: %.300s (CAPSULE_REQUIRE_JAIL=1)",
					g->jail_note);
		else if (strcmp(g->key, key) != 0)
			r = cap_err_set(err, EPROTO, "the spare holder gave a spare of another template");
	}
	free(a);
	if (r < 0) {
		if (afd >= 0)
			close(afd);
		return r;
	}
	*agent = afd;
	*conn = fd;
	fd = -1;
	return 0;
}

/* --- the holder ------------------------------------------------------ */

struct worker {
	pid_t pid;
	int sock;	/* the holder's end of the worker's socket pair */
	enum { BOOTING, READY, GIVEN } state;
	int agent;	/* READY: the channel, to give */
	int caller;	/* GIVEN: the caller's connection */
	struct answer a;	/* READY: what the caller gets */
	int64_t started;
};

struct pending {
	int fd;
	int64_t since;
};

struct holder {
	const struct cap_sandbox_opts *o;
	int lfd;
	char key[65];	/* of the shape o asks for */
	struct worker *w;
	size_t nw, cap;
	struct pending p[MAX_PENDING];
	size_t np;
	unsigned failures;	/* boots that failed in a row */
	int64_t retry_at;	/* no boot before (after failures) */
};

/* The worker: boot and warm one spare, tell the holder, wait for the
 * end. Never returns. */
static void worker_main(const struct cap_sandbox_opts *o, int sock)
{
	struct answer *a = xcalloc(1, sizeof(*a));
	struct cap_sandbox *sb = NULL;
	struct cap_err err = { 0 };
	a->magic = MAGIC;
	a->size = sizeof(*a);
	int r = cap_sandbox_boot(o, &sb, &err);
	if (r == 0 && !cap_sandbox_restored(sb))
		r = cap_err_set(&err, EAGAIN, "it cold-booted: %s", cap_sandbox_boot_note(sb));
	if (r == 0 && (r = cap_sandbox_warm(sb, &err)) < 0)
		cap_err_prefix(&err, "warming it with `true`");
	if (r < 0) {
		a->status = -r;
		snprintf(a->g.boot_note, sizeof(a->g.boot_note), "%.700s", err.msg);
		(void)!send(sock, a, sizeof(*a), MSG_NOSIGNAL);
		cap_sandbox_free(sb);
		_exit(1);
	}
	cap_sandbox_spare_fill(sb, &a->g);
	a->g.holder_pid = (int32_t)getppid();
	if (cap_send_fd(sock, cap_sandbox_agent_channel(sb), a, sizeof(*a), 0) != (ssize_t)sizeof(*a)) {
		cap_sandbox_free(sb);
		_exit(1);
	}
	/* Never read the channel again: it is the caller's. The end is the
	 * holder's socket closing, or the VM's own. */
	struct pollfd pfd[CAP_SANDBOX_NPOLL];
	cap_sandbox_pollfds(sb, pfd);
	struct pollfd wait[2] = { { .fd = sock, .events = POLLIN }, { .fd = pfd[1].fd, .events = POLLIN } };
	while (poll(wait, 2, -1) < 0 && errno == EINTR)
		;
	cap_sandbox_free(sb);
	_exit(0);
}

static void start_worker(struct holder *h)
{
	int sp[2];
	if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
		cap_log(CAP_LOG_ERROR, "socketpair: %s", strerror(errno));
		h->retry_at = cap_now_ms() + 5000;
		return;
	}
	pid_t pid = fork();
	if (pid < 0) {
		cap_log(CAP_LOG_ERROR, "cannot start a spare (fork): %s", strerror(errno));
		close(sp[0]);
		close(sp[1]);
		h->retry_at = cap_now_ms() + 5000;
		return;
	}
	if (pid == 0) {
		/* Its own process group (a terminal's ^C is the holder's to
		 * handle), signals as a process starts with, nothing of the
		 * holder's but its log. */
		setpgid(0, 0);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		if (dup2(sp[1], 3) < 0)
			_exit(1);
		syscall(SYS_close_range, 4U, ~0U, 0U);
		worker_main(h->o, 3);
	}
	close(sp[1]);
	if (h->nw == h->cap) {
		h->cap = h->cap ? h->cap * 2 : 8;
		h->w = xrealloc(h->w, h->cap * sizeof(*h->w));
	}
	h->w[h->nw++] = (struct worker){ .pid = pid, .sock = sp[0], .state = BOOTING, .agent = -1, .caller = -1,
					 .started = cap_now_ms() };
}

/* Worker i is done with: its socket closed (its VM goes), its entry
 * dropped; the process is reaped by reap(). */
static void drop_worker(struct holder *h, size_t i)
{
	struct worker *w = &h->w[i];
	close(w->sock);
	if (w->agent >= 0)
		close(w->agent);
	if (w->caller >= 0)
		close(w->caller);
	h->w[i] = h->w[--h->nw];
}

static void reap(void)
{
	while (waitpid(-1, NULL, WNOHANG) > 0)
		;
}

/* A worker said something: its spare is ready, or its boot failed (or
 * it ended). */
static void worker_event(struct holder *h, size_t i)
{
	struct worker *w = &h->w[i];
	if (w->state != BOOTING) {
		/* A ready spare's VM ended, or a given one's worker: gone. */
		if (w->state == READY)
			cap_log(CAP_LOG_WARN, "spare (VM pid %d) ended before it was given", w->a.g.vmm_pid);
		drop_worker(h, i);
		return;
	}
	int fd = -1;
	ssize_t n = cap_recv_fd(w->sock, &w->a, sizeof(w->a), &fd);
	if (n == (ssize_t)sizeof(w->a) && w->a.status == 0 && fd >= 0) {
		w->state = READY;
		w->agent = fd;
		h->failures = 0;
		cap_log(CAP_LOG_INFO, "spare ready: VM pid %d, %s, in %lld ms", w->a.g.vmm_pid, w->a.g.boot_note,
			(long long)(cap_now_ms() - w->started));
		return;
	}
	if (fd >= 0)
		close(fd);
	TERMINATE(w->a.g.boot_note);
	h->failures++;
	int64_t backoff = 1000LL << (h->failures < 6 ? h->failures : 6);	/* 2 s to 64 s */
	h->retry_at = cap_now_ms() + backoff;
	cap_log(CAP_LOG_ERROR, "a spare did not start: %s; trying again in %lld s",
		n == (ssize_t)sizeof(w->a) && w->a.status ? w->a.g.boot_note : "its process ended",
		(long long)(backoff / 1000));
	drop_worker(h, i);
}

/* Answer caller fd's request. */
static void answer(struct holder *h, int fd)
{
	struct request q;
	ssize_t n = recv(fd, &q, sizeof(q), MSG_DONTWAIT);
	if (n != (ssize_t)sizeof(q) || q.magic != MAGIC) {
		close(fd);	/* not a capsule run: nothing to say to it */
		return;
	}
	struct answer a = { .magic = MAGIC, .size = sizeof(a), .status = ENOENT };
	snprintf(a.held_key, sizeof(a.held_key), "%s", h->key);
	q.key[sizeof(q.key) - 1] = '\0';
	size_t given = 0;
	struct worker *ready = NULL;
	for (size_t i = 0; i < h->nw; i++) {
		given += h->w[i].state == GIVEN;
		if (!ready && h->w[i].state == READY)
			ready = &h->w[i];
	}
	if (q.size != sizeof(a))
		a.status = EPROTO;
	else if (strcmp(q.key, h->key) != 0)
		a.status = ESTALE;
	else if (ready && given < MAX_GIVEN) {
		if (cap_send_fd(fd, ready->agent, &ready->a, sizeof(ready->a), MSG_DONTWAIT) !=
		    (ssize_t)sizeof(ready->a)) {
			close(fd);	/* the caller went: the spare stays ready */
			return;
		}
		close(ready->agent);
		ready->agent = -1;
		ready->state = GIVEN;
		ready->caller = fd;
		cap_log(CAP_LOG_INFO, "gave the spare of VM pid %d", ready->a.g.vmm_pid);
		return;
	}
	(void)!send(fd, &a, sizeof(a), MSG_NOSIGNAL | MSG_DONTWAIT);
	close(fd);
}

int cap_spare_serve(const struct cap_sandbox_opts *o, unsigned count, int stop_fd, struct cap_err *err)
{
	struct holder h = { .o = o, .lfd = -1 };
	_cleanup_free_ char *dir = spare_dir();
	_cleanup_free_ char *path = xasprintf("%s/run.sock", dir);
	_cleanup_free_ char *lockp = xasprintf("%s/lock", dir);
	/* The template's key, the template made now if need be (else every
	 * worker would make it at once). */
	int r = cap_template_ensure(o, h.key, err);
	if (r < 0)
		return r;
	if (cap_mkdir_p(dir, 0700) < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", dir, strerror(errno));
	_cleanup_close_ int lock = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (lock < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", lockp, strerror(errno));
	if (flock(lock, LOCK_EX | LOCK_NB) < 0) {
		char pid[32] = "";
		ssize_t n = pread(lock, pid, sizeof(pid) - 1, 0);
		pid[n > 0 ? n : 0] = '\0';
		pid[strcspn(pid, "\n")] = '\0';
		return cap_err_set(err, EBUSY, "another `capsule spares` (pid %s) keeps spares in %s: stop it first",
				   *pid ? pid : "?", dir);
	}
	char pid[32];
	int pn = snprintf(pid, sizeof(pid), "%d\n", (int)getpid());
	if (ftruncate(lock, 0) < 0 || pwrite(lock, pid, (size_t)pn, 0) != pn)
		cap_log(CAP_LOG_WARN, "cannot write this pid into %s", lockp);
	if ((h.lfd = cap_unix_listen(path, err)) < 0)
		return h.lfd;
	cap_log(CAP_LOG_INFO, "keeping %u spare%s of template %.16s at %s", count, count == 1 ? "" : "s", h.key, path);
	struct pollfd *pfd = NULL;
	size_t pcap = 0;
	for (;;) {
		int64_t now = cap_now_ms();
		size_t kept = 0;
		for (size_t i = 0; i < h.nw; i++)
			kept += h.w[i].state != GIVEN;
		while (kept < count && now >= h.retry_at) {
			start_worker(&h);
			kept++;
		}
		/* A caller that connected and asked nothing within
		 * PENDING_MS is dropped. */
		for (size_t i = 0; i < h.np;)
			if (now - h.p[i].since >= PENDING_MS) {
				close(h.p[i].fd);
				h.p[i] = h.p[--h.np];
			} else
				i++;
		size_t need = 2 + h.np + 2 * h.nw;
		if (need > pcap) {
			pcap = need * 2;
			pfd = xrealloc(pfd, pcap * sizeof(*pfd));
		}
		size_t n = 0;
		pfd[n++] = (struct pollfd){ .fd = stop_fd, .events = POLLIN };
		pfd[n++] = (struct pollfd){ .fd = h.np < MAX_PENDING ? h.lfd : -1, .events = POLLIN };
		for (size_t i = 0; i < h.np; i++)
			pfd[n++] = (struct pollfd){ .fd = h.p[i].fd, .events = POLLIN };
		for (size_t i = 0; i < h.nw; i++) {
			pfd[n++] = (struct pollfd){ .fd = h.w[i].sock, .events = POLLIN };
			pfd[n++] = (struct pollfd){ .fd = h.w[i].caller, .events = POLLIN };
		}
		int timeout = 1000;
		if (kept < count && h.retry_at > now)
			timeout = (int)CAP_MIN(h.retry_at - now, 1000);
		int pr = poll(pfd, n, timeout);
		reap();
		if (pr < 0 && errno != EINTR) {
			r = cap_err_set(err, errno, "poll: %s", strerror(errno));
			break;
		}
		if (pr <= 0)
			continue;
		if (pfd[0].revents)
			break;
		/* Workers and given callers first, from the end (drop_worker
		 * moves the last entry into the dropped one's place). */
		size_t base = 2 + h.np;
		for (size_t i = h.nw; i-- > 0;) {
			short ws = pfd[base + 2 * i].revents, cs = pfd[base + 2 * i + 1].revents;
			if (ws)
				worker_event(&h, i);
			else if (cs) {
				cap_log(CAP_LOG_INFO, "the run given VM pid %d ended: its VM goes", h.w[i].a.g.vmm_pid);
				drop_worker(&h, i);
			}
		}
		for (size_t i = h.np; i-- > 0;)
			if (pfd[2 + i].revents) {
				int fd = h.p[i].fd;
				h.p[i] = h.p[--h.np];
				answer(&h, fd);
			}
		if (pfd[1].revents & POLLIN) {
			int c;
			while (h.np < MAX_PENDING && (c = accept4(h.lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0)
				h.p[h.np++] = (struct pending){ c, cap_now_ms() };
		}
	}
	/* The end: no caller connects any more, every VM goes. */
	unlink(path);
	close(h.lfd);
	for (size_t i = 0; i < h.np; i++)
		close(h.p[i].fd);
	while (h.nw > 0)
		drop_worker(&h, h.nw - 1);
	while (waitpid(-1, NULL, 0) > 0 || errno == EINTR)
		;
	free(h.w);
	free(pfd);
	cap_log(CAP_LOG_INFO, "stopped: every spare's VM is gone");
	return r;
}
