/* QEMU microvm behind the engine interface. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "engine.h"
#include "sock.h"
#include "util.h"

#define QEMU "qemu-system-x86_64"
#define CONNECT_TIMEOUT_MS 10000
#define QMP_TIMEOUT_MS 5000

struct cap_vm {
	pid_t pid;
	int pidfd;
	int qmp_fd;
	int agent_fd;
	bool exited;
	int wstatus;
	char exit_reason[128];
	char *owned_dir;
	char *owned_console;
	char *owned_qemu_log;
	char *owned_qmp_path;
	char *owned_agent_path;
	char *owned_ram_path;
	bool keep_ram;	/* a template's RAM file: not ours to remove */
};

int cap_vm_agent_fd(const struct cap_vm *vm) { return vm->agent_fd; }
int cap_vm_exit_fd(const struct cap_vm *vm) { return vm->pidfd; }
pid_t cap_vm_pid(const struct cap_vm *vm) { return vm->pid; }
const char *cap_vm_exit_reason(const struct cap_vm *vm) { return vm->exit_reason; }

static int run_capture(char *const argv[], char **out)
{
	int p[2];
	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(p[0]);
		close(p[1]);
		return -e;
	}
	if (pid == 0) {
		dup2(p[1], 1);
		int null = open("/dev/null", O_WRONLY);
		if (null >= 0)
			dup2(null, 2);
		execvp(argv[0], argv);
		_exit(127);
	}
	close(p[1]);
	char buf[4096];
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(buf) - 1 && (n = read(p[0], buf + len, sizeof(buf) - 1 - len)) > 0)
		len += (size_t)n;
	buf[len] = '\0';
	close(p[0]);
	int st;
	waitpid(pid, &st, 0);
	if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
		return -ENOEXEC;
	*out = xstrdup(buf);
	return 0;
}

int cap_engine_version(char **out, struct cap_err *err)
{
	char *argv[] = { QEMU, "--version", NULL };
	char *s = NULL;
	if (run_capture(argv, &s) < 0)
		return cap_err_set(err, ENOENT, "%s --version failed; install qemu-system-x86 (scripts/bootstrap.sh)", QEMU);
	s[strcspn(s, "\n")] = '\0';
	*out = s;
	return 0;
}

struct argv {
	char **v;
	size_t n, cap;
};

static void arg(struct argv *a, char *s)
{
	if (a->n + 2 > a->cap) {
		a->cap = a->cap ? a->cap * 2 : 64;
		a->v = xrealloc(a->v, a->cap * sizeof(char *));
	}
	a->v[a->n++] = s;
	a->v[a->n] = NULL;
}

static void argv_free(struct argv *a)
{
	for (size_t i = 0; i < a->n; i++)
		free(a->v[i]);
	free(a->v);
}

/* QEMU option values double their commas. New string. */
static char *esc(const char *s)
{
	size_t n = strlen(s), k = 0;
	char *o = xmalloc(2 * n + 1);
	for (size_t i = 0; i < n; i++) {
		o[k++] = s[i];
		if (s[i] == ',')
			o[k++] = ',';
	}
	o[k] = '\0';
	return o;
}

static void build_argv(struct argv *a, const struct cap_vm_config *cfg,
		       const struct cap_vm *vm)
{
	bool kvm = cfg->accel == CAP_ACCEL_KVM;

	arg(a, xstrdup(QEMU));
	arg(a, xstrdup("-M"));
	arg(a, xstrdup("microvm,acpi=off,memory-backend=ram"));
	arg(a, xstrdup("-accel"));
	arg(a, xstrdup(kvm ? "kvm" : "tcg"));
	arg(a, xstrdup("-cpu"));
	arg(a, xstrdup(kvm ? "host" : "max"));
	arg(a, xstrdup("-smp"));
	arg(a, xasprintf("%u", cfg->cpus));
	arg(a, xstrdup("-m"));
	arg(a, xasprintf("%uM", cfg->memory_mib));
	/* Guest RAM in a shared file from the start (docs/architecture.md,
	 * "Fast start"): a template snapshot will need exactly this. */
	arg(a, xstrdup("-object"));
	/* A restored VM maps the template's RAM file privately: pages are
	 * shared with the template until the guest writes them, nothing is
	 * copied up front, and the template is never changed. */
	bool private_ram = cfg->restore_state != NULL;
	_cleanup_free_ char *ram = esc(private_ram ? cfg->restore_ram : vm->owned_ram_path);
	arg(a, xasprintf("memory-backend-file,id=ram,size=%uM,mem-path=%s,share=%s",
			 cfg->memory_mib, ram, private_ram ? "off" : "on"));
	if (cfg->restore_state) {
		arg(a, xstrdup("-incoming"));
		arg(a, xstrdup("defer"));
	}
	arg(a, xstrdup("-nodefaults"));
	arg(a, xstrdup("-no-user-config"));
	arg(a, xstrdup("-display"));
	arg(a, xstrdup("none"));
	/* QEMU's seccomp filter, with everything it can refuse refused:
	 * obsolete calls, setuid and friends, fork/exec, and scheduler or
	 * resource changes. */
	arg(a, xstrdup("-sandbox"));
	arg(a, xstrdup("on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny"));
	arg(a, xstrdup("-no-reboot"));
	arg(a, xstrdup("-kernel"));
	arg(a, xstrdup(cfg->kernel));
	arg(a, xstrdup("-initrd"));
	arg(a, xstrdup(cfg->initrd));
	arg(a, xstrdup("-append"));
	arg(a, xasprintf("console=ttyS0 panic=-1 reboot=t quiet%s%s",
			 cfg->append_extra ? " " : "",
			 cfg->append_extra ? cfg->append_extra : ""));
	arg(a, xstrdup("-serial"));
	_cleanup_free_ char *con = esc(vm->owned_console);
	_cleanup_free_ char *qmp = esc(vm->owned_qmp_path);
	_cleanup_free_ char *ag = esc(vm->owned_agent_path);
	arg(a, xasprintf("file:%s", con));
	arg(a, xstrdup("-qmp"));
	arg(a, xasprintf("unix:%s,server=on,wait=off", qmp));
	arg(a, xstrdup("-chardev"));
	arg(a, xasprintf("socket,id=agent,path=%s,server=on,wait=off", ag));
	arg(a, xstrdup("-device"));
	arg(a, xstrdup("virtio-serial-device"));
	arg(a, xstrdup("-device"));
	arg(a, xstrdup("virtserialport,chardev=agent,name=capsule.agent"));
	arg(a, xstrdup("-object"));
	arg(a, xstrdup("rng-random,id=rng,filename=/dev/urandom"));
	arg(a, xstrdup("-device"));
	arg(a, xstrdup("virtio-rng-device,rng=rng"));
	for (unsigned i = 0; i < cfg->ndisks; i++) {
		const struct cap_vm_disk *d = &cfg->disks[i];
		_cleanup_free_ char *file = esc(d->path);
		arg(a, xstrdup("-drive"));
		arg(a, xasprintf("id=disk%u,file=%s,format=raw,if=none,readonly=%s,discard=unmap",
				 i, file, d->readonly ? "on" : "off"));
		arg(a, xstrdup("-device"));
		arg(a, xasprintf("virtio-blk-device,drive=disk%u,serial=%s", i, d->serial));
	}
}

static void vm_reap(struct cap_vm *vm, int status)
{
	vm->exited = true;
	vm->wstatus = status;
	if (WIFEXITED(status))
		snprintf(vm->exit_reason, sizeof(vm->exit_reason), "QEMU exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(vm->exit_reason, sizeof(vm->exit_reason), "QEMU was killed by signal %d (%s)",
			 WTERMSIG(status), strsignal(WTERMSIG(status)));
}

int cap_vm_wait(struct cap_vm *vm, int timeout_ms)
{
	if (vm->exited)
		return 1;
	if (timeout_ms > 0) {
		struct pollfd p = { .fd = vm->pidfd, .events = POLLIN };
		int64_t end = cap_now_ms() + timeout_ms;
		int left;
		while ((left = (int)(end - cap_now_ms())) > 0 &&
		       poll(&p, 1, left) < 0 && errno == EINTR)
			;
	}
	int status;
	pid_t r = waitpid(vm->pid, &status, WNOHANG);
	if (r == vm->pid) {
		vm_reap(vm, status);
		return 1;
	}
	return 0;
}

void cap_vm_kill(struct cap_vm *vm)
{
	if (vm->exited)
		return;
	kill(vm->pid, SIGKILL);
	int status;
	while (waitpid(vm->pid, &status, 0) < 0 && errno == EINTR)
		;
	vm_reap(vm, status);
}

static int connect_unix(const char *path, struct cap_vm *vm, int *out,
			struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "socket path %s is longer than %zu bytes",
				   path, sizeof(sa.sun_path) - 1);
	strcpy(sa.sun_path, path);
	int64_t end = cap_now_ms() + CONNECT_TIMEOUT_MS;
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0)
			return cap_err_set(err, errno, "socket: %s", strerror(errno));
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			*out = fd;
			return 0;
		}
		int e = errno;
		close(fd);
		if (cap_vm_wait(vm, 0))
			return cap_err_set(err, ECHILD, "%s before its socket %s was ready", vm->exit_reason, path);
		if ((e != ENOENT && e != ECONNREFUSED) || cap_now_ms() > end)
			return cap_err_set(err, e, "cannot connect to %s: %s", path, strerror(e));
		usleep(1000);
	}
}

/* Read one newline-terminated QMP message into buf. */
static int qmp_read(struct cap_vm *vm, char *buf, size_t len)
{
	size_t n = 0;
	int64_t end = cap_now_ms() + QMP_TIMEOUT_MS;
	while (n < len - 1) {
		struct pollfd p = { .fd = vm->qmp_fd, .events = POLLIN };
		int left = (int)(end - cap_now_ms());
		if (left <= 0)
			return -ETIMEDOUT;
		int r = poll(&p, 1, left);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r <= 0)
			continue;
		ssize_t k = read(vm->qmp_fd, buf + n, 1);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EPIPE;
		if (buf[n] == '\n') {
			buf[n] = '\0';
			return 0;
		}
		n++;
	}
	return -EMSGSIZE;
}

static int qmp_call(struct cap_vm *vm, const char *cmd, json_t *args, json_t **ret,
		    struct cap_err *err);

/* Send one QMP command and wait for its return, skipping events. */
static int qmp_execute(struct cap_vm *vm, const char *cmd, struct cap_err *err)
{
	return qmp_call(vm, cmd, NULL, NULL, err);
}

/* The same with arguments (owned by the call) and the "return" value
 * (*ret, owned by the caller, when ret is not NULL). */
static int qmp_call(struct cap_vm *vm, const char *cmd, json_t *args, json_t **ret,
		    struct cap_err *err)
{
	char line[8192];
	json_t *m = json_pack("{s:s}", "execute", cmd);
	if (args)
		json_object_set_new(m, "arguments", args);
	char *text = json_dumps(m, JSON_COMPACT);
	json_decref(m);
	char *req = xasprintf("%s\n", text);
	free(text);
	int r = cap_write_all(vm->qmp_fd, req, strlen(req));
	free(req);
	if (r < 0)
		return cap_err_set(err, -r, "QMP %s: %s", cmd, strerror(-r));
	for (;;) {
		if ((r = qmp_read(vm, line, sizeof(line))) < 0)
			return cap_err_set(err, -r, "QMP %s: no answer: %s", cmd, strerror(-r));
		json_t *j = json_loads(line, 0, NULL);
		if (!j)
			return cap_err_set(err, EPROTO, "QMP %s: unparsable answer", cmd);
		json_t *rv = json_object_get(j, "return");
		bool done = rv != NULL;
		if (done && ret)
			*ret = json_incref(rv);
		json_t *e = json_object_get(j, "error");
		if (e) {
			const char *desc = json_string_value(json_object_get(e, "desc"));
			r = cap_err_set(err, EIO, "QMP %s failed: %s", cmd, desc ? desc : "unknown error");
			json_decref(j);
			return r;
		}
		json_decref(j);
		if (done)
			return 0;
	}
}

static int qmp_handshake(struct cap_vm *vm, struct cap_err *err)
{
	char line[8192];
	int r = qmp_read(vm, line, sizeof(line));
	if (r < 0)
		return cap_err_set(err, -r, "QMP greeting: %s", strerror(-r));
	if (!strstr(line, "\"QMP\""))
		return cap_err_set(err, EPROTO, "QMP greeting not recognised");
	return qmp_execute(vm, "qmp_capabilities", err);
}

static int ignore_shared(struct cap_vm *vm, struct cap_err *err)
{
	return qmp_call(vm, "migrate-set-capabilities",
			json_pack("{s:[{s:s, s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", 1),
			NULL, err);
}

/* Wait until the migration in either direction has completed. */
static int migration_done(struct cap_vm *vm, int timeout_ms, struct cap_err *err)
{
	int64_t end = cap_now_ms() + timeout_ms;
	for (;;) {
		json_t *ret = NULL;
		int r = qmp_call(vm, "query-migrate", NULL, &ret, err);
		if (r < 0)
			return r;
		const char *st = json_string_value(json_object_get(ret, "status"));
		char status[32];
		snprintf(status, sizeof(status), "%s", st ? st : "none");
		const char *why = json_string_value(json_object_get(ret, "error-desc"));
		char desc[256];
		snprintf(desc, sizeof(desc), "%s", why ? why : "");
		json_decref(ret);
		if (strcmp(status, "completed") == 0)
			return 0;
		if (strcmp(status, "failed") == 0 || strcmp(status, "cancelled") == 0)
			return cap_err_set(err, EIO, "migration %s%s%s", status, *desc ? ": " : "", desc);
		if (cap_now_ms() > end)
			return cap_err_set(err, ETIMEDOUT, "migration did not complete in %d ms (status %s)", timeout_ms, status);
		usleep(1000);
	}
}

int cap_vm_save(struct cap_vm *vm, const char *state_path, struct cap_err *err)
{
	_cleanup_free_ char *sock = xasprintf("%s/save.sock", vm->owned_dir);
	_cleanup_free_ char *tmp = xasprintf("%s.tmp", state_path);
	int r, lfd = -1, cfd = -1, out = -1;

	if ((r = qmp_execute(vm, "stop", err)) < 0 || (r = ignore_shared(vm, err)) < 0)
		return r;
	if ((lfd = cap_unix_listen(sock, err)) < 0)
		return lfd;
	_cleanup_free_ char *uri = xasprintf("unix:%s", sock);
	if ((r = qmp_call(vm, "migrate", json_pack("{s:s}", "uri", uri), NULL, err)) < 0)
		goto out;
	struct pollfd p = { .fd = lfd, .events = POLLIN };
	if (poll(&p, 1, 10000) <= 0 || (cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0) {
		r = cap_err_set(err, ETIMEDOUT, "QEMU did not send its state");
		goto out;
	}
	out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0) {
		r = cap_err_set(err, errno, "cannot create %s: %s", tmp, strerror(errno));
		goto out;
	}
	char buf[65536];
	ssize_t n;
	while ((n = read(cfd, buf, sizeof(buf))) > 0)
		if ((r = cap_write_all(out, buf, (size_t)n)) < 0) {
			r = cap_err_set(err, -r, "cannot write %s: %s", tmp, strerror(-r));
			goto out;
		}
	if ((r = migration_done(vm, 10000, err)) < 0)
		goto out;
	if (fsync(out) < 0 || rename(tmp, state_path) < 0)
		r = cap_err_set(err, errno, "cannot store %s: %s", state_path, strerror(errno));
out:
	if (out >= 0)
		close(out);
	if (cfd >= 0)
		close(cfd);
	close(lfd);
	unlink(sock);
	unlink(tmp);
	return r;
}

/* Feed a saved state into a QEMU started with -incoming defer; the guest
 * stays paused until `cont`. */
static int restore(struct cap_vm *vm, const char *state, struct cap_err *err)
{
	_cleanup_free_ char *sock = xasprintf("%s/incoming.sock", vm->owned_dir);
	_cleanup_free_ char *uri = xasprintf("unix:%s", sock);
	_cleanup_close_ int in = open(state, O_RDONLY | O_CLOEXEC);
	int r, fd = -1;
	if (in < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", state, strerror(errno));
	if ((r = ignore_shared(vm, err)) < 0 ||
	    (r = qmp_call(vm, "migrate-incoming", json_pack("{s:s}", "uri", uri), NULL, err)) < 0 ||
	    (r = connect_unix(sock, vm, &fd, err)) < 0)
		return r;
	char buf[65536];
	ssize_t n;
	while ((n = read(in, buf, sizeof(buf))) > 0)
		if (cap_write_all(fd, buf, (size_t)n) < 0)
			break;	/* QEMU gave up on it: the status says why */
	close(fd);
	unlink(sock);
	return migration_done(vm, 10000, err);
}

int cap_vm_pause(struct cap_vm *vm, struct cap_err *err)
{
	return qmp_execute(vm, "stop", err);
}

int cap_vm_resume(struct cap_vm *vm, struct cap_err *err)
{
	return qmp_execute(vm, "cont", err);
}

int cap_vm_quit(struct cap_vm *vm)
{
	if (vm->exited || vm->qmp_fd < 0)
		return 0;
	return qmp_execute(vm, "quit", NULL);
}

static char *tail_file(const char *path, int lines)
{
	char *s = NULL;
	ssize_t n = path ? cap_read_file(path, 4u << 20, &s) : -ENOENT;
	if (n <= 0) {
		free(s);
		return xstrdup("");
	}
	char *p = s + n;
	while (p > s && p[-1] == '\n')
		*--p = '\0';
	int seen = 0;
	while (p > s && seen < lines) {
		p--;
		if (*p == '\n')
			seen++;
	}
	if (*p == '\n')
		p++;
	char *out = xstrdup(p);
	free(s);
	return out;
}

char *cap_vm_logs_tail(const struct cap_vm *vm, int lines)
{
	_cleanup_free_ char *q = tail_file(vm->owned_qemu_log, lines);
	_cleanup_free_ char *c = tail_file(vm->owned_console, lines);
	return xasprintf("%s%s%s%s%s%s", *q ? "QEMU said:\n" : "", q, *q ? "\n" : "",
			 *c ? "guest console (last lines):\n" : "", c, *c ? "\n" : "");
}

static void vm_close(struct cap_vm *vm)
{
	int *fds[] = { &vm->qmp_fd, &vm->agent_fd, &vm->pidfd };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(fds); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

void cap_vm_free(struct cap_vm *vm)
{
	if (!vm)
		return;
	cap_vm_kill(vm);
	vm_close(vm);
	unlink(vm->owned_qmp_path);
	unlink(vm->owned_agent_path);
	if (!vm->keep_ram)
		unlink(vm->owned_ram_path);
	unlink(vm->owned_qemu_log);
	free(vm->owned_dir);
	free(vm->owned_console);
	free(vm->owned_qemu_log);
	free(vm->owned_qmp_path);
	free(vm->owned_agent_path);
	free(vm->owned_ram_path);
	free(vm);
}

/* In the child: QEMU gets no descriptor but stdio, its own log for
 * stdout/stderr, and dies with us. */
__attribute__((noreturn)) static void exec_qemu(char **argv, const char *log,
						 pid_t parent)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	if (getppid() != parent)
		_exit(127);
	/* Nothing QEMU execs could gain privileges, and a crash leaves no
	 * core file with guest memory in it. */
	prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0);
	struct rlimit nocore = { 0, 0 };
	setrlimit(RLIMIT_CORE, &nocore);
	int null = open("/dev/null", O_RDONLY);
	int out = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (null < 0 || out < 0)
		_exit(127);
	dup2(null, 0);
	dup2(out, 1);
	dup2(out, 2);
	syscall(SYS_close_range, 3U, ~0U, 0U);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	execvp(argv[0], argv);
	dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
	_exit(127);
}

int cap_vm_start(const struct cap_vm_config *cfg, struct cap_vm **out,
		 struct cap_err *err)
{
	struct cap_vm *vm = xcalloc(1, sizeof(*vm));
	struct argv a = { 0 };
	char rnd[8];
	int r;

	vm->pid = -1;
	vm->pidfd = vm->qmp_fd = vm->agent_fd = -1;
	vm->owned_dir = xstrdup(cfg->dir);
	vm->owned_console = cfg->console_log ? xstrdup(cfg->console_log)
					     : xasprintf("%s/console.log", cfg->dir);
	vm->owned_qemu_log = xasprintf("%s/qemu.log", cfg->dir);
	vm->owned_qmp_path = xasprintf("%s/qmp.sock", cfg->dir);
	vm->owned_agent_path = xasprintf("%s/agent.sock", cfg->dir);
	_cleanup_close_ int ur = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
	if (ur < 0 || cap_read_exact(ur, rnd, sizeof(rnd)) < 0)
		memset(rnd, 0, sizeof(rnd));
	vm->keep_ram = cfg->ram_file != NULL;
	vm->owned_ram_path = cfg->ram_file ? xstrdup(cfg->ram_file)
		: xasprintf("/dev/shm/capsule-%d-%02x%02x%02x%02x%02x%02x.ram",
			    (int)getpid(), (uint8_t)rnd[0], (uint8_t)rnd[1],
			    (uint8_t)rnd[2], (uint8_t)rnd[3], (uint8_t)rnd[4],
			    (uint8_t)rnd[5]);

	if (access(cfg->kernel, R_OK) != 0) {
		r = cap_err_set(err, ENOENT, "guest kernel %s is missing: build it with `make kernel` (guest/build-kernel.sh)", cfg->kernel);
		goto fail;
	}
	if (access(cfg->initrd, R_OK) != 0) {
		r = cap_err_set(err, ENOENT, "initramfs %s is missing", cfg->initrd);
		goto fail;
	}

	build_argv(&a, cfg, vm);
	pid_t parent = getpid();
	vm->pid = fork();
	if (vm->pid < 0) {
		r = cap_err_set(err, errno, "fork: %s", strerror(errno));
		goto fail;
	}
	if (vm->pid == 0)
		exec_qemu(a.v, vm->owned_qemu_log, parent);
	vm->pidfd = (int)syscall(SYS_pidfd_open, vm->pid, 0);
	if (vm->pidfd < 0) {
		r = cap_err_set(err, errno, "pidfd_open: %s (Linux 5.3 or newer is needed)", strerror(errno));
		goto fail;
	}

	if ((r = connect_unix(vm->owned_qmp_path, vm, &vm->qmp_fd, err)) < 0 ||
	    (r = qmp_handshake(vm, err)) < 0 ||
	    (cfg->restore_state && (r = restore(vm, cfg->restore_state, err)) < 0) ||
	    (r = connect_unix(vm->owned_agent_path, vm, &vm->agent_fd, err)) < 0)
		goto fail;
	/* A restored guest runs only once the agent's channel is connected,
	 * so it never sees its host missing. */
	if (cfg->restore_state && (r = qmp_execute(vm, "cont", err)) < 0)
		goto fail;
	/* QEMU has mapped guest RAM by now; a private name is no longer
	 * needed and must not outlive the VM. */
	if (!vm->keep_ram)
		unlink(vm->owned_ram_path);
	if (cfg->unlink_sockets) {
		unlink(vm->owned_qmp_path);
		unlink(vm->owned_agent_path);
	}
	argv_free(&a);
	*out = vm;
	return 0;

fail:
	if (vm->pid > 0) {
		cap_vm_wait(vm, 200);
		cap_vm_kill(vm);
		_cleanup_free_ char *logs = cap_vm_logs_tail(vm, 15);
		if (*logs && err) {
			size_t used = strlen(err->msg);
			snprintf(err->msg + used, sizeof(err->msg) - used, "\n%s", logs);
		}
	}
	argv_free(&a);
	cap_vm_free(vm);
	return r;
}
