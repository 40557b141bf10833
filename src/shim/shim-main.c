/* containerd-shim-capsule-v2: the entry points containerd calls, as its
 * shim v2 protocol (runtime/v2/shim) has them:
 *
 *   -namespace NS -address A -publish-binary B -id ID [-bundle DIR] [-debug] start
 *       start (or find) the pod's shim, print its address
 *   -namespace NS -address A -publish-binary B -id ID [-bundle DIR] delete
 *       clean up after a dead shim, print a DeleteResponse
 *   -namespace NS -id ID -address A [-debug]
 *       the shim itself (what start runs), serving ttrpc on fd 3
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <openssl/evp.h>

#include "shim.h"
#include "util.h"

struct shim shim = { .mu = PTHREAD_MUTEX_INITIALIZER, .cond = PTHREAD_COND_INITIALIZER };

static int log_fd = 2;
static bool debug;
static pthread_mutex_t log_mu = PTHREAD_MUTEX_INITIALIZER;

/* logrus's text format, which containerd copies into its own log. */
void shim_log(const char *level, const char *fmt, ...)
{
	if (!debug && strcmp(level, "debug") == 0)
		return;
	char msg[2048], line[2300];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	for (char *p = msg; *p; p++)
		if (*p == '"' || *p == '\n')
			*p = *p == '"' ? '\'' : ' ';
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME, &ts);
	struct tm tm;
	gmtime_r(&ts.tv_sec, &tm);
	char when[64];
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
	int n = snprintf(line, sizeof(line), "time=\"%s.%09ldZ\" level=%s msg=\"%s\" runtime=io.containerd.capsule.v2\n",
			 when, ts.tv_nsec, level, msg);
	pthread_mutex_lock(&log_mu);
	if (n > 0 && write(log_fd, line, (size_t)CAP_MIN(n, (int)sizeof(line) - 1)) < 0 && log_fd != 2)
		log_fd = 2; /* containerd went: stderr (/dev/null) */
	pthread_mutex_unlock(&log_mu);
}

static void die(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fputs("containerd-shim-capsule-v2: ", stderr);
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
	exit(1);
}

/* The socket of the shim of group (the pod's sandbox id, or the
 * container's own id), as the runc shim's SocketAddress makes it:
 * unix:///run/containerd/s/ + sha256(address/namespace/group), with
 * "capsule" in the hash so that it never meets the runc shim's. */
static char *socket_address(const char *address, const char *ns, const char *group)
{
	char *in = xasprintf("capsule:%s/%s/%s", address, ns, group);
	unsigned char d[32];
	unsigned int dl = 0;
	EVP_Digest(in, strlen(in), d, &dl, EVP_sha256(), NULL);
	free(in);
	char hex[65];
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", d[i]);
	const char *base = getenv("CAPSULE_SHIM_SOCKET_DIR");
	return xasprintf("unix://%s/%s", base && *base ? base : "/run/containerd/s", hex);
}

static const char *sock_path(const char *address)
{
	return strncmp(address, "unix://", 7) == 0 ? address + 7 : address;
}

static int listen_at(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	strcpy(sa.sun_path, path);
	char *dir = xstrdup(path);
	*strrchr(dir, '/') = 0;
	cap_mkdir_p(dir, 0700);
	free(dir);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0); /* inherited by the shim as fd 3 */
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 64) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	chmod(path, 0600);
	return fd;
}

static bool can_connect(const char *path)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return false;
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok = fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0;
	if (fd >= 0)
		close(fd);
	return ok;
}

/* Write the bundle's `address` file (through a temporary, as the runc
 * shim's WriteAddress). */
static int write_address(const char *address)
{
	FILE *f = fopen(".address", "we");
	if (!f)
		return -errno;
	fputs(address, f);
	if (fclose(f) != 0)
		return -errno;
	return rename(".address", "address") < 0 ? -errno : 0;
}

/* config.json's annotation name, or NULL (a new string). */
static char *annotation(const char *name)
{
	json_error_t je;
	json_t *c = json_load_file("config.json", 0, &je);
	if (!c)
		die("cannot read the bundle's config.json: %s", je.text);
	json_t *v = json_object_get(json_object_get(c, "annotations"), name);
	char *s = json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
	json_decref(c);
	return s;
}

static int cmd_start(const char *id, const char *argv0)
{
	/* One shim per pod: a container of a pod (the CRI's annotations) is
	 * served by the shim of its sandbox; the runc shim's grouping. */
	char *group = NULL;
	char *type = annotation("io.kubernetes.cri.container-type");
	if (type && strcmp(type, "container") == 0)
		group = annotation("io.kubernetes.cri.sandbox-id");
	if (!group)
		group = annotation("io.containerd.runc.v2.group");
	if (!group)
		group = xstrdup(id);
	free(type);
	char *address = socket_address(shim.address, shim.namespace_, group);
	const char *path = sock_path(address);
	int l = listen_at(path);
	if (l == -EADDRINUSE) {
		if (can_connect(path)) {
			int r = write_address(address);
			if (r < 0)
				die("cannot write the bundle's address file: %s", strerror(-r));
			fputs(address, stdout);
			return 0;
		}
		unlink(path);
		l = listen_at(path);
	}
	if (l < 0)
		die("cannot listen on %s: %s", path, strerror(-l));
	int r = write_address(address);
	if (r < 0) {
		unlink(path);
		die("cannot write the bundle's address file: %s", strerror(-r));
	}
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n <= 0)
		die("cannot read /proc/self/exe: %s", strerror(errno));
	self[n] = 0;
	pid_t pid = fork();
	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		setpgid(0, 0);
		int null = open("/dev/null", O_RDWR);
		dup2(null, 0);
		dup2(null, 1);
		dup2(null, 2);
		if (l != 3) {
			dup2(l, 3);
			close(l);
		}
		const char *args[] = { argv0, "-namespace", shim.namespace_, "-id", id, "-address", shim.address,
				       debug ? "-debug" : NULL, NULL };
		execv(self, (char *const *)args);
		_exit(127);
	}
	close(l);
	/* containerd may pass the runtime's options on stdin (the runc
	 * shim's shim cgroup): not used here; read so that it is taken. */
	char buf[4096];
	fcntl(0, F_SETFL, fcntl(0, F_GETFL) | O_NONBLOCK);
	while (read(0, buf, sizeof(buf)) > 0)
		;
	fputs(address, stdout);
	(void)argv0;
	return 0;
}

/* After a dead shim (containerd's cleanup, which gives it 5 s): the
 * runtime's delete --force (which kills what is left of the container),
 * the rootfs unmounted, the dead shim's socket removed, a DeleteResponse
 * on stdout (the runc manager's Stop). Run in the bundle. */
static int cmd_delete(const char *id)
{
	char *runtime = NULL, *root = NULL;
	char *rec = NULL;
	if (cap_read_file("capsule-shim-runtime", 4096, &rec) > 0) {
		char *nl = strchr(rec, '\n');
		if (nl) {
			*nl = 0;
			runtime = xstrdup(rec);
			char *r2 = nl + 1;
			char *nl2 = strchr(r2, '\n');
			if (nl2)
				*nl2 = 0;
			root = xstrdup(r2);
		}
	}
	free(rec);
	char cwd[PATH_MAX];
	if (!getcwd(cwd, sizeof(cwd)))
		die("getcwd: %s", strerror(errno));
	struct shim_container c = {
		.id = (char *)id,
		.bundle = cwd,
		.runtime = runtime ? runtime : shim_runtime_binary(NULL),
		.root = root ? root : shim_runtime_root(NULL),
	};
	/* shim_runtime waits for the runtime's exit through the reaper,
	 * which takes SIGCHLD with sigwait: blocked here as in serve, or
	 * the signal is discarded and the wait never ends. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	shim_reaper_start();
	struct shim_status st = { 0 };
	const char *args[] = { "delete", "--force", id, NULL };
	if (shim_runtime(&c, args, -1, -1, -1, NULL, 0, NULL, &st) < 0)
		fprintf(stderr, "containerd-shim-capsule-v2: %s\n", st.msg);
	char *rootfs = xasprintf("%s/rootfs", cwd);
	shim_unmount_all(rootfs);
	free(rootfs);
	/* The shim's socket, when nobody answers on it: the shim of a pod
	 * still serving its other containers keeps it. */
	char *addr = NULL;
	if (cap_read_file("address", 4096, &addr) > 0) {
		char *nl = strchr(addr, '\n');
		if (nl)
			*nl = 0;
		const char *path = sock_path(addr);
		struct stat sb;
		if (stat(path, &sb) == 0 && S_ISSOCK(sb.st_mode) && !can_connect(path) && unlink(path) < 0)
			fprintf(stderr, "containerd-shim-capsule-v2: cannot remove the dead shim's socket %s: %s\n", path,
				strerror(errno));
	}
	free(addr);
	int pid = shim_read_pid("init.pid");
	Containerd__Task__V2__DeleteResponse resp = CONTAINERD__TASK__V2__DELETE_RESPONSE__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	shim_timestamp(&ts, &now);
	resp.pid = pid > 0 ? (uint32_t)pid : 0;
	resp.exit_status = 128 + SIGKILL;
	resp.exited_at = &ts;
	size_t n = protobuf_c_message_get_packed_size(&resp.base);
	uint8_t *buf = xmalloc(n + 1);
	protobuf_c_message_pack(&resp.base, buf);
	int r = cap_write_all(1, buf, n);
	free(buf);
	free(c.runtime);
	free(c.root);
	return r < 0 ? 1 : 0;
}

/* One connection from containerd: requests in, each handled in a
 * thread of its own (Wait blocks; containerd sends others meanwhile),
 * responses written under the connection's lock. */
struct conn {
	int fd;
	pthread_mutex_t wmu;
	int refs;
	pthread_mutex_t rmu;
};

static void conn_unref(struct conn *c)
{
	pthread_mutex_lock(&c->rmu);
	int left = --c->refs;
	pthread_mutex_unlock(&c->rmu);
	if (left == 0) {
		close(c->fd);
		free(c);
	}
}

static void respond(struct conn *c, uint32_t stream, int code, const char *msg, const uint8_t *payload, size_t n)
{
	size_t len;
	uint8_t *f = cap_ttrpc_response_frame(stream, code, msg, payload, n, &len);
	if (!f)
		f = cap_ttrpc_response_frame(stream, CAP_GRPC_RESOURCE_EXHAUSTED, "the response is over 4 MiB", NULL, 0,
					     &len);
	pthread_mutex_lock(&c->wmu);
	if (cap_write_all(c->fd, f, len) < 0)
		shim_log("warning", "cannot answer containerd: %s", strerror(errno));
	pthread_mutex_unlock(&c->wmu);
	free(f);
}

struct call {
	struct conn *conn;
	uint32_t stream;
	Ttrpc__Request *req;
};

static void *call_run(void *arg)
{
	struct call *k = arg;
	struct shim_status st = { 0 };
	uint8_t *out = NULL;
	size_t out_len = 0;
	shim_log("debug", "%s/%s", k->req->service, k->req->method);
	if (strcmp(k->req->service, "containerd.task.v2.Task") != 0)
		shim_fail(&st, CAP_GRPC_UNIMPLEMENTED, "service %s: containerd-shim-capsule-v2 serves containerd.task.v2.Task",
			  k->req->service);
	else
		shim_task_call(k->req->method, k->req->payload.data, k->req->payload.len, &out, &out_len, &st);
	if (st.code)
		shim_log("info", "%s: %s", k->req->method, st.msg);
	respond(k->conn, k->stream, st.code, st.code ? st.msg : "", out, out_len);
	free(out);
	ttrpc__request__free_unpacked(k->req, NULL);
	conn_unref(k->conn);
	free(k);
	pthread_mutex_lock(&shim.mu);
	bool done = shim.shutdown;
	pthread_mutex_unlock(&shim.mu);
	if (done) {
		/* Shutdown answered: leave, the socket removed (the runc
		 * shim's end of serve). */
		shim_events_drain(5000);
		unlink(shim.socket_path);
		_exit(0);
	}
	return NULL;
}

static void *conn_run(void *arg)
{
	struct conn *c = arg;
	for (;;) {
		struct cap_ttrpc_header h;
		uint8_t *body;
		int r = cap_ttrpc_read_frame(c->fd, &h, &body);
		if (r == -EMSGSIZE) {
			respond(c, h.stream, CAP_GRPC_RESOURCE_EXHAUSTED, "message length exceeds the maximum of 4 MiB", NULL, 0);
			continue;
		}
		if (r < 0)
			break;
		if (h.type != CAP_TTRPC_REQUEST) {
			free(body);
			continue;
		}
		if (h.stream % 2 == 0) {
			free(body);
			respond(c, h.stream, CAP_GRPC_INVALID_ARGUMENT, "StreamID must be odd for client initiated streams", NULL, 0);
			continue;
		}
		Ttrpc__Request *req = cap_ttrpc_request_decode(body, h.length);
		free(body);
		if (!req) {
			respond(c, h.stream, CAP_GRPC_INVALID_ARGUMENT, "unmarshal request error: not a ttrpc Request", NULL, 0);
			continue;
		}
		struct call *k = xcalloc(1, sizeof(*k));
		k->conn = c;
		k->stream = h.stream;
		k->req = req;
		pthread_mutex_lock(&c->rmu);
		c->refs++;
		pthread_mutex_unlock(&c->rmu);
		pthread_t t;
		if (pthread_create(&t, NULL, call_run, k) != 0)
			abort();
		pthread_detach(t);
	}
	conn_unref(c);
	return NULL;
}

static int serve(const char *id)
{
	(void)id;
	/* Children's exits come to the reaper thread alone. */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	if (prctl(PR_SET_CHILD_SUBREAPER, 1) < 0)
		die("PR_SET_CHILD_SUBREAPER: %s", strerror(errno));
	/* containerd's shim log: the bundle's `log` FIFO, which containerd
	 * reads. */
	int lf = open("log", O_WRONLY | O_NONBLOCK | O_CLOEXEC);
	if (lf >= 0) {
		cap_set_nonblock(lf, 0);
		log_fd = lf;
	}
	char *addr = NULL;
	if (cap_read_file("address", 4096, &addr) > 0)
		shim.socket_path = xstrdup(sock_path(addr));
	free(addr);
	cap_set_cloexec(3);
	shim_reaper_start();
	shim_events_start();
	shim_log("info", "serving the task API (pid %d)", getpid());
	for (;;) {
		int fd = accept4(3, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			die("accept on the shim socket: %s", strerror(errno));
		}
		struct conn *c = xcalloc(1, sizeof(*c));
		c->fd = fd;
		c->refs = 1;
		pthread_mutex_init(&c->wmu, NULL);
		pthread_mutex_init(&c->rmu, NULL);
		pthread_t t;
		if (pthread_create(&t, NULL, conn_run, c) != 0)
			abort();
		pthread_detach(t);
	}
}

int main(int argc, char **argv)
{
	const char *id = "", *bundle = NULL;
	const char *action = NULL;
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		/* Go's flag package: -flag or --flag, a value after it or
		 * after '='. */
		if (a[0] == '-') {
			const char *name = a[1] == '-' ? a + 2 : a + 1;
			const char *eq = strchr(name, '=');
			size_t nl = eq ? (size_t)(eq - name) : strlen(name);
			const char *val = eq ? eq + 1 : NULL;
#define IS(s) (nl == strlen(s) && strncmp(name, s, nl) == 0)
			if (IS("debug")) {
				debug = true;
				continue;
			}
			if (IS("v") || IS("version")) {
				printf("%s:\n  Version:  %s\n", argv[0], CAPSULE_VERSION);
				return 0;
			}
			if (!val) {
				if (i + 1 >= argc)
					die("flag needs an argument: %s", a);
				val = argv[++i];
			}
			if (IS("namespace"))
				shim.namespace_ = xstrdup(val);
			else if (IS("address"))
				shim.address = xstrdup(val);
			else if (IS("id"))
				id = val;
			else if (IS("bundle"))
				bundle = val;
			else if (IS("publish-binary") || IS("socket"))
				; /* events go over TTRPC_ADDRESS; the socket is fd 3 */
			else
				die("flag provided but not defined: %s", a);
#undef IS
			continue;
		}
		action = a;
		break;
	}
	if (!shim.namespace_ || !*shim.namespace_)
		die("shim namespace cannot be empty");
	if (!shim.address)
		shim.address = xstrdup("");
	const char *t = getenv("TTRPC_ADDRESS");
	shim.ttrpc_address = xstrdup(t ? t : "");
	if (bundle && chdir(bundle) < 0)
		die("-bundle %s: %s", bundle, strerror(errno));
	if (action && strcmp(action, "start") == 0)
		return cmd_start(id, argv[0]);
	if (action && strcmp(action, "delete") == 0)
		return cmd_delete(id);
	if (action)
		die("unknown action %s: start, delete, or none to serve", action);
	return serve(id);
}
