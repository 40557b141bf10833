/* A development driver for the policy process (not run by make test):
 * does what the engine does around cap_netd_main, in namespaces made by
 * run.sh. Started as root inside the "capsule" namespace, it creates the
 * listener and the DNS socket inside the jail's namespace, a connector
 * there, then runs cap_netd_main as an unprivileged user with
 * no_new_privs; its standard input is the control channel.
 *
 *   driver --jail /run/netns/NAME --port LPORT --uid UID [--resolv FILE]
 *          [--verbose] [WORD...]     (WORD: allow-public, allow-egress=R, ...)
 * Proxy settings come from HTTPS_PROXY, HTTP_PROXY, ALL_PROXY, NO_PROXY. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "netd.h"
#include "util.h"

static void die(const char *what)
{
	fprintf(stderr, "driver: %s: %s\n", what, strerror(errno));
	exit(2);
}

static int listen_in(int ns, int self, int type, uint16_t port)
{
	if (setns(ns, CLONE_NEWNET) < 0)
		die("setns jail");
	int fd = socket(AF_INET, type | SOCK_CLOEXEC | (type == SOCK_STREAM ? SOCK_NONBLOCK : 0), 0);
	int one = 1;
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
				  .sin_addr.s_addr = htonl(0x7f000001) };
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("bind in the jail");
	if (type == SOCK_STREAM && listen(fd, 128) < 0)
		die("listen");
	if (setns(self, CLONE_NEWNET) < 0)
		die("setns back");
	return fd;
}

/* The connector, as the engine's: one request at a time. */
static void connector(int fd)
{
	for (;;) {
		uint8_t req[2];
		if (cap_read_exact(fd, req, 2) < 0)
			_exit(0);
		uint16_t port = cap_get_u16(req);
		int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(port),
					  .sin_addr.s_addr = htonl(0x7f000002) };
		uint8_t st = 0;
		if (connect(s, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			st = (uint8_t)errno;
		union {
			struct cmsghdr h;
			char buf[CMSG_SPACE(sizeof(int))];
		} u;
		memset(&u, 0, sizeof(u));
		struct iovec iov = { &st, 1 };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
		if (!st) {
			m.msg_control = u.buf;
			m.msg_controllen = sizeof(u.buf);
			struct cmsghdr *c = CMSG_FIRSTHDR(&m);
			c->cmsg_level = SOL_SOCKET;
			c->cmsg_type = SCM_RIGHTS;
			c->cmsg_len = CMSG_LEN(sizeof(int));
			memcpy(CMSG_DATA(c), &s, sizeof(int));
		}
		if (sendmsg(fd, &m, MSG_NOSIGNAL) != 1)
			_exit(0);
		close(s);
	}
}

int main(int argc, char **argv)
{
	const char *jail = NULL, *resolv = NULL;
	uint16_t port = 0;
	uid_t uid = 65534;
	bool verbose = false;
	static struct cap_net_policy policy;
	struct cap_err err = { 0 };
	int pubfds[CAP_NET_MAX_PUBLISH];

	cap_net_policy_init(&policy);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--jail") && i + 1 < argc) {
			jail = argv[++i];
		} else if (!strcmp(argv[i], "--port") && i + 1 < argc) {
			port = (uint16_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--uid") && i + 1 < argc) {
			uid = (uid_t)atoi(argv[++i]);
		} else if (!strcmp(argv[i], "--resolv") && i + 1 < argc) {
			resolv = argv[++i];
		} else if (!strcmp(argv[i], "--verbose")) {
			verbose = true;
		} else {
			char *w = xstrdup(argv[i]), *eq = strchr(w, '=');
			if (eq)
				*eq = '\0';
			if (cap_net_policy_apply(&policy, w, eq ? eq + 1 : NULL, &err) < 0) {
				fprintf(stderr, "driver: %s\n", err.msg);
				return 2;
			}
			free(w);
		}
	}
	if (!jail || !port) {
		fprintf(stderr, "usage: driver --jail NS --port PORT [--uid UID] [--resolv F] [--verbose] WORD...\n");
		return 2;
	}
	int self = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	int ns = open(jail, O_RDONLY | O_CLOEXEC);
	if (self < 0 || ns < 0)
		die("open a namespace");
	int tcp = listen_in(ns, self, SOCK_STREAM, port);
	int dns = listen_in(ns, self, SOCK_DGRAM, 53);
	for (unsigned i = 0; i < policy.npublish; i++) {
		const struct cap_net_publish *p = &policy.publish[i];
		struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(p->host_port),
					  .sin_addr.s_addr = htonl(p->bind) };
		int one = 1;
		pubfds[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		setsockopt(pubfds[i], SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (bind(pubfds[i], (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(pubfds[i], 128) < 0)
			die("publish");
	}
	int ctl[2], con[2];
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ctl) < 0 ||
	    socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, con) < 0)
		die("socketpair");

	pid_t cpid = fork();
	if (cpid == 0) {
		close(con[0]);
		close(ctl[0]);
		close(ctl[1]);
		if (setns(ns, CLONE_NEWNET) < 0)
			die("setns connector");
		connector(con[1]);
	}
	close(con[1]);

	pid_t pid = fork();
	if (pid == 0) {
		close(ctl[0]);
		if (setgroups(0, NULL) < 0 || setresgid(uid, uid, uid) < 0 ||
		    setresuid(uid, uid, uid) < 0 || prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
			die("drop privileges");
		struct cap_netd_config c = {
			.name = "dev",
			.policy = &policy,
			.tcp_listen = tcp,
			.dns = dns,
			.connector = con[0],
			.control = ctl[1],
			.nflog = -1,
			.publish_fds = pubfds,
			.npublish = policy.npublish,
			.log_fd = STDERR_FILENO,
			.verbose = verbose,
			.resolv_conf = resolv,
			.https_proxy = getenv("HTTPS_PROXY"),
			.http_proxy = getenv("HTTP_PROXY"),
			.all_proxy = getenv("ALL_PROXY"),
			.no_proxy = getenv("NO_PROXY"),
		};
		_exit(cap_netd_main(&c));
	}
	close(ctl[1]);
	close(con[0]);
	close(tcp);
	close(dns);
	for (unsigned i = 0; i < policy.npublish; i++)
		close(pubfds[i]);
	/* Standard input is the control channel. */
	char buf[4096];
	ssize_t n;
	while ((n = read(STDIN_FILENO, buf, sizeof(buf))) > 0)
		if (cap_write_all(ctl[0], buf, (size_t)n) < 0)
			break;
	close(ctl[0]);
	int st = 0;
	waitpid(pid, &st, 0);
	kill(cpid, SIGKILL);
	waitpid(cpid, NULL, 0);
	fprintf(stderr, "driver: policy process exit %d\n", WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st));
	return WIFEXITED(st) ? WEXITSTATUS(st) : 1;
}
