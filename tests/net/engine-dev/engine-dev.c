/* Development harness for the engine's NIC (engine.h, struct cap_vm_net);
 * not part of the suite. Boots a VM (initramfs only) with a NIC under a
 * toy policy process that logs what reaches it, then reads commands on
 * stdin so that a driver script (check.sh) can look at everything from
 * the host while the VM runs:
 *   guest SCRIPT      run sh -c SCRIPT in the guest (as the tool user), print its output
 *   bg SCRIPT         start it without waiting
 *   ctl LINE          send LINE to the policy process's control socket
 *   fwd add|del PORT  cap_vm_net_forward
 *   deny A-B ...      cap_vm_net_deny with ranges a.b.c.d-e.f.g.h
 *   quit              free the VM
 * Each command's answer ends with a line "OK" or "ERR ...".
 *
 * The toy policy process: every TCP connection redirected to it gets
 * "policy saw A:P\n" (its SO_ORIGINAL_DST) and is closed; every DNS query
 * gets NXDOMAIN; control "dial PORT" asks the connector for 127.0.0.2:PORT,
 * writes "hello guest\n" and logs the first line answered; every packet
 * the kernel refused arrives on the NFLOG socket and is logged as
 * "nflog PREFIX proto P SRC:SPORT > DST:DPORT type T" and as the policy
 * process would say it under an empty policy, "nflog-line LINE" (the
 * first message also in hex, "nflog-raw HEX"). All of it, and its own credentials and
 * descriptors at start, is logged to LOG.
 *
 * Usage: engine-dev LOG [nonet | template DIR | restore DIR]
 * (CAPSULE_AGENT names the agent). "template" boots as a template build
 * does (NIC, no policy process, everything denied), saves DIR/state and
 * DIR/ram and exits; "restore" starts from them. At the end it prints
 * whether the process's descriptors and network namespace are as they
 * were before the VM. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/netfilter_ipv4.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "buf.h"
#include "client.h"
#include "engine.h"
#include "nflog.h"
#include "policy.h"
#include "store.h"
#include "util.h"

/* ---- the toy policy process -------------------------------------------- */

static int logfd = -1;

__attribute__((format(printf, 1, 2))) static void plog(const char *fmt, ...)
{
	char line[1024];
	va_list ap;
	va_start(ap, fmt);
	int n = vsnprintf(line, sizeof(line) - 1, fmt, ap);
	va_end(ap);
	n = CAP_MIN(n, (int)sizeof(line) - 2);
	line[n++] = '\n';
	cap_write_all(logfd, line, (size_t)n);
}

static void on_tcp(int l)
{
	int c = accept4(l, NULL, NULL, SOCK_CLOEXEC);
	if (c < 0)
		return;
	struct sockaddr_in o;
	socklen_t len = sizeof(o);
	char a[INET_ADDRSTRLEN] = "?", msg[128];
	if (getsockopt(c, SOL_IP, SO_ORIGINAL_DST, &o, &len) == 0)
		inet_ntop(AF_INET, &o.sin_addr, a, sizeof(a));
	plog("tcp %s:%u", a, ntohs(o.sin_port));
	int n = snprintf(msg, sizeof(msg), "policy saw %s:%u\n", a, ntohs(o.sin_port));
	cap_write_all(c, msg, (size_t)n);
	close(c);
}

static void on_dns(int d)
{
	uint8_t q[512];
	struct sockaddr_in from;
	socklen_t len = sizeof(from);
	ssize_t n = recvfrom(d, q, sizeof(q), 0, (struct sockaddr *)&from, &len);
	if (n < 12)
		return;
	char name[256];
	size_t k = 0;
	for (size_t i = 12; i < (size_t)n && q[i] && k < sizeof(name) - 65; i += q[i] + 1u) {
		size_t l = q[i];
		if (i + 1 + l > (size_t)n)
			break;
		memcpy(name + k, q + i + 1, l);
		k += l;
		name[k++] = '.';
	}
	name[k] = '\0';
	plog("dns %s", name);
	q[2] = 0x81;	/* QR, RD */
	q[3] = 0x83;	/* RA, NXDOMAIN */
	sendto(d, q, (size_t)n, 0, (struct sockaddr *)&from, len);
}

static void dial(int conn, unsigned port)
{
	uint8_t req[2];
	cap_put_u16(req, (uint16_t)port);
	if (cap_write_all(conn, req, 2) < 0) {
		plog("dial %u: connector gone", port);
		return;
	}
	uint8_t st = 0xff;
	union {
		struct cmsghdr h;
		char buf[CMSG_SPACE(sizeof(int))];
	} u;
	struct iovec iov = { &st, 1 };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf) };
	if (recvmsg(conn, &m, MSG_CMSG_CLOEXEC) != 1) {
		plog("dial %u: no answer", port);
		return;
	}
	struct cmsghdr *c = CMSG_FIRSTHDR(&m);
	if (st != 0 || !c || c->cmsg_type != SCM_RIGHTS) {
		plog("dial %u: error %s", port, strerror(st));
		return;
	}
	int fd;
	memcpy(&fd, CMSG_DATA(c), sizeof(int));
	int fl = fcntl(fd, F_GETFL);
	cap_write_all(fd, "hello guest\n", 12);
	char buf[200];
	size_t got = 0;
	int64_t end = cap_now_ms() + 5000;
	while (got < sizeof(buf) - 1 && cap_now_ms() < end) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (poll(&p, 1, 200) <= 0)
			continue;
		ssize_t k = read(fd, buf + got, sizeof(buf) - 1 - got);
		if (k <= 0)
			break;
		got += (size_t)k;
		if (memchr(buf, '\n', got))
			break;
	}
	buf[got] = '\0';
	buf[strcspn(buf, "\n")] = '\0';
	plog("dial %u: %s (socket %s)", port, buf, fl & O_NONBLOCK ? "nonblocking" : "blocking");
	close(fd);
}

static void on_refused(void *ud, const struct cap_nflog_pkt *p)
{
	(void)ud;
	char s[INET_ADDRSTRLEN], d[INET_ADDRSTRLEN];
	struct in_addr a = { htonl(p->saddr) }, b = { htonl(p->daddr) };
	inet_ntop(AF_INET, &a, s, sizeof(s));
	inet_ntop(AF_INET, &b, d, sizeof(d));
	plog("nflog %s proto %u %s:%u > %s:%u type %u", p->prefix, p->proto, s, p->sport, d, p->dport,
	     p->icmp_type);
	struct cap_net_policy none;
	char line[600];
	cap_net_policy_init(&none);
	plog("nflog-line %s", cap_nflog_describe(p, &none, NULL, 0, line, sizeof(line)));
}

static void on_nflog(int fd)
{
	static bool raw_done;
	uint8_t buf[8192];
	ssize_t n = recv(fd, buf, sizeof(buf), 0);
	if (n < 0) {
		if (errno != EAGAIN)
			plog("nflog: recv: %s", strerror(errno));
		return;
	}
	if (!raw_done) {
		char hex[2 * 256 + 1] = "";
		for (ssize_t i = 0; i < n && i < 256; i++)
			snprintf(hex + 2 * i, 3, "%02x", buf[i]);
		plog("nflog-raw %s", hex);
		raw_done = true;
	}
	int r = cap_nflog_parse(buf, (size_t)n, on_refused, NULL);
	if (r < 0)
		plog("nflog: parse: %s", strerror(-r));
}

static int policy(void *ud, const struct cap_vm_net_fds *f)
{
	logfd = *(int *)ud;
	char fds[512] = "";
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	while (d && (e = readdir(d)))
		if (e->d_name[0] != '.' && atoi(e->d_name) != dirfd(d))
			snprintf(fds + strlen(fds), sizeof(fds) - strlen(fds), " %s", e->d_name);
	if (d)
		closedir(d);
	plog("policy uid=%u gid=%u nnp=%d fds:%s (tcp %d dns %d connector %d control %d nflog %d log %d)", getuid(),
	     getgid(), prctl(PR_GET_NO_NEW_PRIVS, 0, 0, 0, 0), fds, f->tcp_listen, f->dns, f->connector, f->control,
	     f->nflog, logfd);
	/* What netd does for an upstream proxy given by name, in its root. */
	struct addrinfo hints = { .ai_family = AF_INET, .ai_socktype = SOCK_STREAM }, *res = NULL;
	int gai = getaddrinfo("localhost", NULL, &hints, &res);
	char a[INET_ADDRSTRLEN] = "?";
	if (!gai && res)
		inet_ntop(AF_INET, &((struct sockaddr_in *)res->ai_addr)->sin_addr, a, sizeof(a));
	plog("resolved localhost %s", gai ? gai_strerror(gai) : a);
	if (res)
		freeaddrinfo(res);
	char line[256];
	size_t used = 0;
	for (;;) {
		struct pollfd p[4] = { { f->tcp_listen, POLLIN, 0 }, { f->dns, POLLIN, 0 }, { f->control, POLLIN, 0 },
				       { f->nflog, POLLIN, 0 } };
		if (poll(p, 4, -1) < 0)
			continue;
		if (p[3].revents)
			on_nflog(f->nflog);
		if (p[0].revents)
			on_tcp(f->tcp_listen);
		if (p[1].revents)
			on_dns(f->dns);
		if (p[2].revents) {
			ssize_t k = read(f->control, line + used, sizeof(line) - 1 - used);
			if (k <= 0) {
				plog("control closed: exit");
				return 0;
			}
			used += (size_t)k;
			char *nl;
			while ((nl = memchr(line, '\n', used))) {
				*nl = '\0';
				unsigned port;
				if (sscanf(line, "dial %u", &port) == 1)
					dial(f->connector, port);
				else
					plog("control: %s", line);
				used -= (size_t)(nl + 1 - line);
				memmove(line, nl + 1, used);
			}
			if (used == sizeof(line) - 1)
				used = 0;
		}
	}
}

/* ---- the owner ---------------------------------------------------------- */

static struct cap_vm *vm;
static struct cap_client cl;

struct run {
	struct cap_buf out;
	bool done;
	int code;
};

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)id;
	(void)fd;
	struct run *r = ud;
	if (r)
		cap_buf_append(&r->out, p, n);
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	(void)id;
	struct run *r = ud;
	if (!r)
		return;
	r->done = true;
	r->code = ex ? ex->value : -errnum;
	if (msg)
		cap_buf_append(&r->out, msg, strlen(msg));
}

static const struct cap_exec_events ev = { on_output, on_done, NULL };

/* Move bytes both ways for up to ms. */
static int pump(int ms)
{
	int fd = cap_vm_agent_fd(vm);
	struct pollfd p = { .fd = fd, .events = POLLIN | (cap_buf_used(&cl.out) ? POLLOUT : 0) };
	if (poll(&p, 1, ms) < 0)
		return 0;
	if (p.revents & POLLOUT) {
		ssize_t k = write(fd, cap_buf_head(&cl.out), cap_buf_used(&cl.out));
		if (k > 0)
			cap_buf_consume(&cl.out, (size_t)k);
	}
	if (p.revents & (POLLIN | POLLHUP)) {
		uint8_t buf[65536];
		ssize_t k = read(fd, buf, sizeof(buf));
		if (k <= 0)
			return -EPIPE;
		struct cap_err err = { 0 };
		if (cap_client_feed(&cl, buf, (size_t)k, &err) < 0) {
			fprintf(stderr, "protocol: %s\n", err.msg);
			return -EPROTO;
		}
	}
	return 0;
}

static int guest(const char *script, bool wait, struct run *r)
{
	char *argv[] = { "sh", "-c", (char *)script, NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 3, .timeout_ms = 60000, .output_cap = 65536 };
	struct cap_err err = { 0 };
	uint32_t id;
	if (cap_client_exec(&cl, &req, &ev, wait ? r : NULL, &id, &err) < 0) {
		printf("ERR exec: %s\n", err.msg);
		return -1;
	}
	while (wait && !r->done)
		if (pump(1000) < 0)
			return -1;
	while (cap_buf_used(&cl.out))
		pump(100);
	return 0;
}

static int parse_range(const char *s, uint32_t out[2])
{
	char a[32], b[32];
	struct in_addr x, y;
	if (sscanf(s, "%31[0-9.]-%31[0-9.]", a, b) != 2 || inet_pton(AF_INET, a, &x) != 1 ||
	    inet_pton(AF_INET, b, &y) != 1)
		return -1;
	out[0] = ntohl(x.s_addr);
	out[1] = ntohl(y.s_addr);
	return 0;
}

static int count_fds(void)
{
	int n = 0;
	DIR *d = opendir("/proc/self/fd");
	while (d && readdir(d))
		n++;
	if (d)
		closedir(d);
	return n;
}

static void ns_of_thread(char out[64])
{
	ssize_t n = readlink("/proc/thread-self/ns/net", out, 63);
	out[n > 0 ? n : 0] = '\0';
}

int main(int argc, char **argv)
{
	if (argc < 2) {
		fprintf(stderr, "usage: engine-dev LOG [nonet]\n");
		return 2;
	}
	bool nonet = argc > 2 && strcmp(argv[2], "nonet") == 0;
	const char *tdir = argc > 3 ? argv[3] : NULL;
	bool template = tdir && strcmp(argv[2], "template") == 0;
	bool restore = tdir && strcmp(argv[2], "restore") == 0;
	char ns_before[64], ns_after[64];
	ns_of_thread(ns_before);
	int lfd = open(argv[1], O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	if (lfd < 0) {
		perror(argv[1]);
		return 1;
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	struct cap_err err = { 0 };
	bool have;
	_cleanup_free_ char *kernel = cap_store_kernel_path(&have);
	_cleanup_free_ char *agent = cap_store_agent_path(&have);
	char *initrd = NULL;
	if (cap_store_initramfs(agent, CAP_BUSYBOX, &initrd, NULL, &err) < 0) {
		fprintf(stderr, "initramfs: %s\n", err.msg);
		return 1;
	}
	char dir[] = "/tmp/engine-dev-XXXXXX";
	if (!mkdtemp(dir)) {
		perror("mkdtemp");
		return 1;
	}
	static const uint16_t fwd[] = { 8080 };
	static const uint32_t deny[][2] = {
		{ 0x7f000000u, 0x7fffffffu },	/* the host */
		{ 0xc6336400u, 0xc63364ffu },	/* 198.51.100.0/24 */
		{ 0xa9fe0000u, 0xa9feffffu },	/* link-local */
	};
	int keep[] = { lfd };
	struct cap_vm_net net = {
		.forward = fwd, .nforward = 1, .deny = deny, .ndeny = 3, .proxy_port = 3128,
		.policy_main = policy, .policy_ud = &lfd, .keep = keep, .nkeep = 1,
	};
	static const uint32_t all[][2] = { { 0, 0xffffffffu } };
	if (template) {
		net = (struct cap_vm_net){ .deny = all, .ndeny = 1, .proxy_port = 3128 };
	}
	_cleanup_free_ char *ram = tdir ? xasprintf("%s/ram", tdir) : NULL;
	_cleanup_free_ char *state = tdir ? xasprintf("%s/state", tdir) : NULL;
	struct cap_vm_config cfg = {
		.kernel = kernel, .initrd = initrd, .dir = dir, .cpus = 1, .memory_mib = 256,
		.accel = CAP_ACCEL_TCG, .net = nonet ? NULL : &net, .unlink_sockets = true,
		.ram_file = template ? ram : NULL,
		.restore_state = restore ? state : NULL, .restore_ram = restore ? ram : NULL,
	};
	int fds_before = count_fds();
	int64_t t0 = cap_now_ms();
	if (cap_vm_start(&cfg, &vm, &err) < 0) {
		printf("ERR start: %s\n", err.msg);
		char *console = xasprintf("%s/console.log", dir);
		unlink(console);
		free(console);
		rmdir(dir);
		return 1;
	}
	int64_t t1 = cap_now_ms();
	cap_client_init(&cl);
	while (!cl.hello)
		if (pump(1000) < 0) {
			printf("ERR no hello\n");
			return 1;
		}
	if (template) {
		int r = cap_vm_save(vm, state, &err);
		printf("%s policy=%d rules:\n", r < 0 ? err.msg : "SAVED", (int)cap_vm_net_pid(vm));
		char *cmd = xasprintf("nsenter -t %d -n nft list ruleset", (int)cap_vm_pid(vm));
		if (system(cmd) != 0)
			printf("nft failed\n");
		free(cmd);
		cap_vm_free(vm);
		cap_client_fini(&cl);
		char *console = xasprintf("%s/console.log", dir);
		unlink(console);
		free(console);
		rmdir(dir);
		return r < 0;
	}
	struct cap_setup s = {
		.root_image = "", .root_upper = "", .work = "", .source = "", .hostname = "dev",
		.net_addr = nonet ? 0 : 0x0a00020fu, .net_gateway = nonet ? 0 : 0x0a000202u,
		.net_dns = nonet ? 0 : 0x0a000203u, .net_prefix = nonet ? 0 : 24, .proxy_port = nonet ? 0 : 3128,
	};
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	s.realtime_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	if (getrandom(s.seed, sizeof(s.seed), 0) < 0)
		return 1;
	cap_client_setup(&cl, &s);
	while (cl.setup_state != CAP_SETUP_DONE)
		if (pump(1000) < 0)
			return 1;
	printf("READY qemu=%d policy=%d start_ms=%lld setup=%d %s\n", (int)cap_vm_pid(vm), (int)cap_vm_net_pid(vm),
	       (long long)(t1 - t0), cl.setup_errno, cl.setup_msg);

	char line[4096];
	while (fgets(line, sizeof(line), stdin)) {
		line[strcspn(line, "\n")] = '\0';
		if (strncmp(line, "guest ", 6) == 0 || strncmp(line, "bg ", 3) == 0) {
			bool wait = line[0] == 'g';
			struct run r = { .done = false };
			cap_buf_init(&r.out);
			if (guest(line + (wait ? 6 : 3), wait, &r) == 0) {
				if (wait) {
					fwrite(cap_buf_head(&r.out), 1, cap_buf_used(&r.out), stdout);
					printf("%sexit %d\n", cap_buf_used(&r.out) && cap_buf_head(&r.out)[cap_buf_used(&r.out) - 1] != '\n' ? "\n" : "", r.code);
				}
				printf("OK\n");
			}
			cap_buf_fini(&r.out);
		} else if (strncmp(line, "ctl ", 4) == 0) {
			char *l = xasprintf("%s\n", line + 4);
			int fd = cap_vm_net_control_fd(vm);
			printf(fd >= 0 && cap_write_all(fd, l, strlen(l)) == 0 ? "OK\n" : "ERR control\n");
			free(l);
		} else if (strncmp(line, "fwd ", 4) == 0) {
			char what[8];
			unsigned port;
			err = (struct cap_err){ 0 };
			if (sscanf(line + 4, "%7s %u", what, &port) != 2)
				printf("ERR usage\n");
			else if (cap_vm_net_forward(vm, (uint16_t)port, strcmp(what, "add") == 0, &err) < 0)
				printf("ERR %s\n", err.msg);
			else
				printf("OK\n");
		} else if (strncmp(line, "deny", 4) == 0) {
			uint32_t r[64][2];
			unsigned n = 0;
			char *save = NULL;
			bool bad = false;
			for (char *t = strtok_r(line + 4, " ", &save); t && n < 64; t = strtok_r(NULL, " ", &save))
				bad |= parse_range(t, r[n++]) < 0;
			err = (struct cap_err){ 0 };
			if (bad)
				printf("ERR usage\n");
			else if (cap_vm_net_deny(vm, (const uint32_t(*)[2])r, n, &err) < 0)
				printf("ERR %s\n", err.msg);
			else
				printf("OK\n");
		} else if (strcmp(line, "quit") == 0) {
			break;
		} else {
			printf("ERR unknown command\n");
		}
	}
	cap_vm_free(vm);
	cap_client_fini(&cl);
	char *console = xasprintf("%s/console.log", dir);
	if (getenv("ENGINE_DEV_CONSOLE"))
		printf("console: %s\n", console);
	else
		unlink(console);
	free(console);
	rmdir(dir);
	free(initrd);
	ns_of_thread(ns_after);
	printf("BYE fds before=%d after=%d netns %s\n", fds_before, count_fds(), strcmp(ns_before, ns_after) == 0 ? "unchanged" : "CHANGED");
	close(lfd);
	return 0;
}
