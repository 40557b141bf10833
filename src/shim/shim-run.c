/* Running the runtime with runc's command line, and the reaper: the shim
 * is its children's subreaper, so the runtime's monitors (the processes
 * whose pids the pid files name) become its children and are reaped
 * here, their exits recorded on their processes. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "events-task.pb-c.h"
#include "shim.h"
#include "util.h"

char *shim_runtime_binary(const char *from_options)
{
	const char *env = getenv("CAPSULE_SHIM_RUNTIME");
	if (env && *env)
		return xstrdup(env);
	if (from_options && *from_options)
		return xstrdup(from_options);
	char self[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		self[n] = 0;
		char *slash = strrchr(self, '/');
		if (slash) {
			*slash = 0;
			char *beside = xasprintf("%s/capsule-oci", self);
			if (access(beside, X_OK) == 0)
				return beside;
			free(beside);
		}
	}
	return xstrdup("capsule-oci");
}

char *shim_runtime_root(const char *from_options)
{
	if (from_options && *from_options)
		return xstrdup(from_options);
	const char *base = getenv("CAPSULE_SHIM_ROOT");
	return xasprintf("%s/%s", base && *base ? base : "/run/containerd/capsule", shim.namespace_);
}

/* An exit the reaper saw that no process claimed yet. */
struct exit_rec {
	pid_t pid;
	int status;
	struct timespec at;
	struct exit_rec *next;
};
static struct exit_rec *unclaimed;

static int exit_code(int wstatus)
{
	if (WIFEXITED(wstatus))
		return WEXITSTATUS(wstatus);
	if (WIFSIGNALED(wstatus))
		return 128 + WTERMSIG(wstatus);
	return 255;
}

/* Under mu: take the unclaimed exit of pid; true when there was one. */
static bool take_exit(pid_t pid, int *status, struct timespec *at)
{
	for (struct exit_rec **e = &unclaimed; *e; e = &(*e)->next) {
		if ((*e)->pid != pid)
			continue;
		struct exit_rec *r = *e;
		*e = r->next;
		*status = r->status;
		if (at)
			*at = r->at;
		free(r);
		return true;
	}
	return false;
}

/* capsule-oci's monitor leaves an "oom" file in the container's state
 * directory when the guest's OOM killer ended its process (docs/oci.md,
 * "Pods"), before that process's exit: TaskOOM then, once, ahead of the
 * TaskExit, as the runc shim sends it from its cgroup's OOM events (CRI
 * makes the container's reason OOMKilled of it). */
static void publish_oom(struct shim_container *c)
{
	if (c->oom_sent || !c->root)
		return;
	_cleanup_free_ char *path = xasprintf("%s/%s/oom", c->root, c->id);
	if (access(path, F_OK) < 0)
		return;
	c->oom_sent = true;
	Containerd__Events__TaskOOM ev = CONTAINERD__EVENTS__TASK_OOM__INIT;
	ev.container_id = c->id;
	shim_publish("/tasks/oom", &ev.base);
}

void shim_publish_exit(struct shim_container *c, struct shim_proc *p)
{
	publish_oom(c);
	Containerd__Events__TaskExit ev = CONTAINERD__EVENTS__TASK_EXIT__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	shim_timestamp(&ts, &p->exited_at);
	ev.container_id = c->id;
	ev.id = *p->exec_id ? p->exec_id : c->id;
	ev.pid = (uint32_t)p->pid;
	ev.exit_status = (uint32_t)p->exit_status;
	ev.exited_at = &ts;
	shim_publish("/tasks/exit", &ev.base);
}

static void set_exited(struct shim_container *c, struct shim_proc *p, int status, const struct timespec *at)
{
	p->exited = true;
	p->exit_status = status;
	p->exited_at = *at;
	p->state = PROC_STOPPED;
	if (p->terminal)
		shim_io_exited(p);
	shim_log("info", "container %s process %s (pid %d) exited with status %d", c->id,
		 *p->exec_id ? p->exec_id : "init", p->pid, status);
	/* A start still answering publishes it after its own event (the
	 * runc shim's eventSendMu): TaskExit never comes before TaskStart. */
	if (p->starting)
		p->exit_deferred = true;
	else
		shim_publish_exit(c, p);
}

void shim_claim_pid(struct shim_container *c, struct shim_proc *p, pid_t pid)
{
	p->pid = pid;
	int status;
	struct timespec at;
	if (take_exit(pid, &status, &at))
		set_exited(c, p, status, &at);
}

/* Under mu: the process whose pid this is, if any. */
static bool match(pid_t pid, int status, const struct timespec *at)
{
	for (struct shim_container *c = shim.containers; c; c = c->next) {
		struct shim_proc *p = &c->init;
		for (; p; p = p == &c->init ? c->execs : p->next) {
			if (p->pid == pid && !p->exited) {
				set_exited(c, p, status, at);
				return true;
			}
		}
	}
	return false;
}

static void *reaper(void *arg)
{
	(void)arg;
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGCHLD);
	for (;;) {
		int sig;
		sigwait(&set, &sig);
		for (;;) {
			int ws;
			pid_t pid = waitpid(-1, &ws, WNOHANG);
			if (pid <= 0)
				break;
			struct timespec at;
			clock_gettime(CLOCK_REALTIME, &at);
			pthread_mutex_lock(&shim.mu);
			if (!match(pid, exit_code(ws), &at)) {
				/* Keep it for a runtime call or a pid file not yet
				 * read; drop what nobody claimed for a minute. */
				struct exit_rec *r = xcalloc(1, sizeof(*r));
				r->pid = pid;
				r->status = exit_code(ws);
				r->at = at;
				r->next = unclaimed;
				unclaimed = r;
				for (struct exit_rec **e = &r->next; *e;) {
					if (at.tv_sec - (*e)->at.tv_sec > 60) {
						struct exit_rec *old = *e;
						*e = old->next;
						free(old);
					} else {
						e = &(*e)->next;
					}
				}
			}
			pthread_cond_broadcast(&shim.cond);
			pthread_mutex_unlock(&shim.mu);
		}
	}
	return NULL;
}

void shim_reaper_start(void)
{
	pthread_t t;
	if (pthread_create(&t, NULL, reaper, NULL) != 0)
		abort();
	pthread_detach(t);
}

bool shim_wait_exit(struct shim_proc *p, int timeout_ms)
{
	struct timespec until;
	clock_gettime(CLOCK_REALTIME, &until);
	if (timeout_ms >= 0) {
		until.tv_sec += timeout_ms / 1000;
		until.tv_nsec += (long)(timeout_ms % 1000) * 1000000;
		if (until.tv_nsec >= 1000000000) {
			until.tv_sec++;
			until.tv_nsec -= 1000000000;
		}
	}
	while (!p->exited) {
		if (timeout_ms < 0)
			pthread_cond_wait(&shim.cond, &shim.mu);
		else if (pthread_cond_timedwait(&shim.cond, &shim.mu, &until) == ETIMEDOUT)
			break;
	}
	return p->exited;
}

int shim_read_pid(const char *path)
{
	char buf[32] = { 0 };
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EINVAL;
	char *end;
	long v = strtol(buf, &end, 10);
	if (v <= 0 || v > INT_MAX)
		return -EINVAL;
	return (int)v;
}

/* The last "error" line of the runtime's JSON log (runc's --log-format
 * json: {"level":"error","msg":"..."}), in buf. */
static bool log_error(const char *bundle, char *buf, size_t len)
{
	char *path = xasprintf("%s/log.json", bundle);
	char *text = NULL;
	ssize_t n = cap_read_file(path, 1 << 20, &text);
	free(path);
	if (n <= 0) {
		free(text);
		return false;
	}
	bool found = false;
	for (char *line = text, *next; line && *line; line = next) {
		next = strchr(line, '\n');
		if (next)
			*next++ = 0;
		if (!strstr(line, "\"level\":\"error\""))
			continue;
		char *m = strstr(line, "\"msg\":\"");
		if (!m)
			continue;
		m += 7;
		size_t o = 0;
		for (; *m && *m != '"' && o + 1 < len; m++) {
			if (*m == '\\' && m[1])
				m++;
			buf[o++] = *m;
		}
		buf[o] = 0;
		found = true;
	}
	free(text);
	return found;
}

int shim_runtime(const struct shim_container *c, const char *const *args, int stdin_fd, int stdout_fd,
		 int stderr_fd, const char *input, size_t input_len, char **out, struct shim_status *st)
{
	const char *argv[64];
	size_t n = 0;
	char *log = xasprintf("%s/log.json", c->bundle);
	argv[n++] = c->runtime;
	argv[n++] = "--root";
	argv[n++] = c->root;
	argv[n++] = "--log";
	argv[n++] = log;
	argv[n++] = "--log-format";
	argv[n++] = "json";
	for (; *args && n < CAP_ARRAY_SIZE(argv) - 1; args++)
		argv[n++] = *args;
	argv[n] = NULL;

	int capture = memfd_create("runtime-output", MFD_CLOEXEC);
	int in = stdin_fd;
	int own_in = -1;
	if (in < 0 && input) {
		own_in = memfd_create("runtime-input", MFD_CLOEXEC);
		if (own_in >= 0 && cap_write_all(own_in, input, input_len) == 0)
			lseek(own_in, 0, SEEK_SET);
		in = own_in;
	}
	int null = open("/dev/null", O_RDWR | O_CLOEXEC);
	if (capture < 0 || null < 0) {
		int e = errno;
		free(log);
		return shim_fail(st, CAP_GRPC_INTERNAL, "cannot run %s: %s", c->runtime, strerror(e));
	}
	int fds[3] = { in >= 0 ? in : null, stdout_fd >= 0 ? stdout_fd : capture, stderr_fd >= 0 ? stderr_fd : capture };
	sigset_t all;
	sigemptyset(&all);
	pid_t pid = fork();
	if (pid == 0) {
		/* Above the three first, so that no dup2 overwrites a source. */
		for (int i = 0; i < 3; i++)
			fds[i] = fcntl(fds[i], F_DUPFD_CLOEXEC, 10);
		for (int i = 0; i < 3; i++)
			dup2(fds[i], i);
		sigprocmask(SIG_SETMASK, &all, NULL);
		signal(SIGPIPE, SIG_DFL);
		execvp(argv[0], (char *const *)argv);
		dprintf(2, "cannot run %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	int e = errno;
	close(null);
	if (own_in >= 0)
		close(own_in);
	if (pid < 0) {
		close(capture);
		free(log);
		return shim_fail(st, CAP_GRPC_INTERNAL, "cannot fork for %s: %s", c->runtime, strerror(e));
	}
	int status;
	pthread_mutex_lock(&shim.mu);
	while (!take_exit(pid, &status, NULL))
		pthread_cond_wait(&shim.cond, &shim.mu);
	pthread_mutex_unlock(&shim.mu);

	char *text = xcalloc(1, 65536);
	ssize_t got = pread(capture, text, 65535, 0);
	if (got < 0)
		got = 0;
	text[got] = 0;
	close(capture);
	free(log);
	/* The verb and the id, to name the call. */
	const char *verb = argv[7];
	const char *id = argv[n - 1];
	if (status != 0) {
		char msg[900];
		while (got > 0 && (text[got - 1] == '\n' || text[got - 1] == ' '))
			text[--got] = 0;
		if (!log_error(c->bundle, msg, sizeof(msg)))
			snprintf(msg, sizeof(msg), "%s", got > 0 ? text : "no message");
		shim_log("warning", "%s %s %s: exit status %d: %s", c->runtime, verb, id, status, msg);
		shim_fail(st, CAP_GRPC_UNKNOWN, "%s %s %s failed (exit status %d): %s", c->runtime, verb, id, status, msg);
		free(text);
		return -1;
	}
	if (out)
		*out = text;
	else
		free(text);
	return 0;
}
