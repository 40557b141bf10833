/* A process's stdio: containerd gives FIFO paths (the client reads and
 * writes their other ends); the runtime gets pipes, whose other ends a
 * thread each copies to and from the FIFOs, as the runc shim does, so
 * that closing them at Delete is ours to do whatever the runtime's
 * processes still hold. With a terminal, the runtime sends the PTY's
 * master over a console socket, and the copies run between it and the
 * FIFOs. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "shim.h"
#include "util.h"

struct shim_copy {
	int src;          /* read end */
	int dst;          /* write end, or -1 until dst_path is opened */
	char *dst_path;   /* a FIFO opened for writing in the thread (it blocks until a reader) */
	bool close_src, close_dst;
	int stop;         /* eventfd: drain what is there, then end */
	pthread_t thread;
	bool joined;
};

static void *copy_run(void *arg)
{
	struct shim_copy *cp = arg;
	if (cp->dst < 0 && cp->dst_path) {
		/* Blocks until the client opens its reader; the stop event
		 * cannot interrupt an open, so it opens O_NONBLOCK and polls
		 * (ENXIO: no reader yet). */
		for (;;) {
			cp->dst = open(cp->dst_path, O_WRONLY | O_NONBLOCK | O_CLOEXEC);
			if (cp->dst >= 0) {
				cap_set_nonblock(cp->dst, 0);
				break;
			}
			if (errno != ENXIO) {
				shim_log("warning", "cannot open %s: %s", cp->dst_path, strerror(errno));
				break;
			}
			struct pollfd p = { .fd = cp->stop, .events = POLLIN };
			if (poll(&p, 1, 50) > 0)
				break;
		}
	}
	char buf[32768];
	bool stopping = false;
	for (;;) {
		/* Once stopped, the source alone, without waiting: the stop
		 * event stays readable, and polling it again would never let
		 * a source that is open but quiet (a stdin FIFO whose client
		 * still holds it) end the copy. */
		struct pollfd p[2] = { { .fd = cp->src, .events = POLLIN }, { .fd = cp->stop, .events = POLLIN } };
		int r = poll(p, stopping ? 1 : 2, stopping ? 0 : -1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			break;
		if (r == 0)
			break; /* stopping and nothing more to read */
		if (!stopping && (p[1].revents & POLLIN))
			stopping = true;
		if (!(p[0].revents & (POLLIN | POLLHUP | POLLERR)))
			continue; /* the stop alone: drain what is there */
		ssize_t n = read(cp->src, buf, sizeof(buf));
		if (n < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (n <= 0)
			break; /* EOF, or EIO from a master whose slave closed */
		if (cp->dst >= 0 && cap_write_all(cp->dst, buf, (size_t)n) < 0) {
			close(cp->dst);
			cp->dst = -1; /* the reader went: keep draining */
		}
	}
	if (cp->close_dst && cp->dst >= 0)
		close(cp->dst);
	cp->dst = -1;
	if (cp->close_src)
		close(cp->src);
	return NULL;
}

static struct shim_copy *copy_start(int src, bool close_src, int dst, bool close_dst, const char *dst_path)
{
	struct shim_copy *cp = xcalloc(1, sizeof(*cp));
	cp->src = src;
	cp->dst = dst;
	cp->dst_path = dst_path ? xstrdup(dst_path) : NULL;
	cp->close_src = close_src;
	cp->close_dst = close_dst;
	cp->stop = eventfd(0, EFD_CLOEXEC);
	if (pthread_create(&cp->thread, NULL, copy_run, cp) != 0)
		abort();
	return cp;
}

/* End a copy (after it drains) and free it. */
static void copy_end(struct shim_copy *cp)
{
	if (!cp)
		return;
	uint64_t one = 1;
	if (write(cp->stop, &one, sizeof(one)) < 0)
		shim_log("warning", "cannot stop a copy: %s", strerror(errno));
	pthread_join(cp->thread, NULL);
	close(cp->stop);
	free(cp->dst_path);
	free(cp);
}

/* Open a FIFO for reading, as containerd's fifo package does: without
 * blocking, then blocking reads. */
static int open_read(const char *path, struct shim_status *st)
{
	int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	if (fd < 0)
		return shim_fail(st, CAP_GRPC_INVALID_ARGUMENT, "cannot open the stdin FIFO %s: %s", path, strerror(errno));
	return fd;
}

int shim_io_prepare(struct shim_proc *p, int fds[3], char **console_sock, int *listener, struct shim_status *st)
{
	fds[0] = fds[1] = fds[2] = -1;
	*console_sock = NULL;
	*listener = -1;
	const char *paths[3] = { p->stdin_path, p->stdout_path, p->stderr_path };
	if (p->stdin_path && *p->stdin_path) {
		/* Our own writer keeps the FIFO from reading end-of-file before
		 * the client opens it, until CloseIO. */
		int rd = open_read(p->stdin_path, st);
		if (rd < 0)
			return -1;
		p->stdin_keep = open(p->stdin_path, O_WRONLY | O_CLOEXEC);
		if (!p->terminal) {
			int pp[2];
			if (pipe2(pp, O_CLOEXEC) < 0) {
				close(rd);
				return shim_fail(st, CAP_GRPC_INTERNAL, "pipe: %s", strerror(errno));
			}
			fds[0] = pp[0];
			p->copies[0] = copy_start(rd, true, pp[1], true, NULL);
		} else {
			fds[0] = rd; /* kept until the master comes */
		}
	}
	if (p->terminal) {
		char dir[] = "/tmp/capsule-shim-console.XXXXXX";
		if (!mkdtemp(dir))
			return shim_fail(st, CAP_GRPC_INTERNAL, "mkdtemp %s: %s", dir, strerror(errno));
		struct sockaddr_un sa = { .sun_family = AF_UNIX };
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/console.sock", dir);
		int l = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (l < 0 || bind(l, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(l, 1) < 0) {
			int e = errno;
			if (l >= 0)
				close(l);
			rmdir(dir);
			return shim_fail(st, CAP_GRPC_INTERNAL, "console socket %s: %s", sa.sun_path, strerror(e));
		}
		*listener = l;
		*console_sock = xstrdup(sa.sun_path);
		return 0;
	}
	for (int i = 1; i < 3; i++) {
		if (!paths[i] || !*paths[i])
			continue;
		int pp[2];
		if (pipe2(pp, O_CLOEXEC) < 0)
			return shim_fail(st, CAP_GRPC_INTERNAL, "pipe: %s", strerror(errno));
		fds[i] = pp[1];
		p->copies[i] = copy_start(pp[0], true, -1, true, paths[i]);
	}
	return 0;
}

/* The master from the console socket's first connection. */
static int receive_master(int listener, struct shim_status *st)
{
	struct pollfd pl = { .fd = listener, .events = POLLIN };
	if (poll(&pl, 1, 30000) <= 0)
		return shim_fail(st, CAP_GRPC_INTERNAL, "the runtime sent no console master in 30 s");
	int c = accept4(listener, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return shim_fail(st, CAP_GRPC_INTERNAL, "console socket accept: %s", strerror(errno));
	char data[256];
	union {
		char buf[CMSG_SPACE(sizeof(int))];
		struct cmsghdr align;
	} u;
	struct iovec iov = { .iov_base = data, .iov_len = sizeof(data) };
	struct msghdr msg = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	ssize_t n = recvmsg(c, &msg, MSG_CMSG_CLOEXEC);
	close(c);
	struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&msg) : NULL;
	if (!cm || cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
		return shim_fail(st, CAP_GRPC_INTERNAL, "the console socket's message holds no file descriptor");
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof(fd));
	return fd;
}

int shim_io_started(struct shim_proc *p, int fds[3], const char *console_sock, int listener, bool ok,
		    struct shim_status *st)
{
	int r = 0;
	if (p->terminal) {
		int stdin_rd = fds[0];
		if (ok) {
			int m = receive_master(listener, st);
			if (m < 0) {
				r = -1;
			} else {
				p->console = m;
				if (stdin_rd >= 0) {
					p->copies[0] = copy_start(stdin_rd, true, m, false, NULL);
					stdin_rd = -1;
				}
				if (p->stdout_path && *p->stdout_path)
					p->copies[1] = copy_start(m, false, -1, true, p->stdout_path);
			}
		}
		if (stdin_rd >= 0)
			close(stdin_rd);
		if (listener >= 0)
			close(listener);
		if (console_sock) {
			unlink(console_sock);
			char *dir = xstrdup(console_sock);
			*strrchr(dir, '/') = 0;
			rmdir(dir);
			free(dir);
		}
		return r;
	}
	for (int i = 0; i < 3; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	return 0;
}

void shim_io_exited(struct shim_proc *p)
{
	/* A PTY's master may not read EIO while another process holds the
	 * slave: end the copies once what is there is read. */
	uint64_t one = 1;
	for (int i = 0; i < 3; i++)
		if (p->copies[i] && write(p->copies[i]->stop, &one, sizeof(one)) < 0)
			shim_log("warning", "cannot stop a copy: %s", strerror(errno));
}

void shim_io_close_stdin(struct shim_proc *p)
{
	if (p->stdin_keep >= 0)
		close(p->stdin_keep);
	p->stdin_keep = -1;
}

void shim_io_close(struct shim_proc *p)
{
	shim_io_close_stdin(p);
	for (int i = 0; i < 3; i++) {
		copy_end(p->copies[i]);
		p->copies[i] = NULL;
	}
	if (p->console >= 0)
		close(p->console);
	p->console = -1;
}
