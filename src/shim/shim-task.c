/* containerd.task.v2.Task: one handler per method, each as the runc v2
 * shim's service does it (runtime/v2/runc/task), behind one table that
 * decodes each method's request and frees it (shim_task_call). */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <termios.h>
#include <unistd.h>

#include <jansson.h>

#include "empty.pb-c.h"
#include "events-task.pb-c.h"
#include "runc-options.pb-c.h"
#include "shim.h"
#include "util.h"

#define EMPTY_OUT                                                                                                      \
	do {                                                                                                           \
		*out = NULL;                                                                                           \
		*out_len = 0;                                                                                          \
	} while (0)

static void pack(const ProtobufCMessage *m, uint8_t **out, size_t *out_len)
{
	*out_len = protobuf_c_message_get_packed_size(m);
	*out = xmalloc(*out_len + 1);
	protobuf_c_message_pack(m, *out);
}

int shim_fail(struct shim_status *st, int code, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	st->code = code;
	vsnprintf(st->msg, sizeof(st->msg), fmt, ap);
	va_end(ap);
	return -1;
}

void shim_timestamp(Google__Protobuf__Timestamp *t, const struct timespec *ts)
{
	if (ts->tv_sec == 0 && ts->tv_nsec == 0) {
		t->seconds = -62135596800LL; /* Go's time.Time{} */
		t->nanos = 0;
		return;
	}
	t->seconds = ts->tv_sec;
	t->nanos = (int32_t)ts->tv_nsec;
}

/* Under mu. */
static struct shim_container *find(const char *id)
{
	for (struct shim_container *c = shim.containers; c; c = c->next)
		if (strcmp(c->id, id) == 0)
			return c;
	return NULL;
}

static struct shim_proc *find_proc(struct shim_container *c, const char *exec_id)
{
	if (!exec_id || !*exec_id)
		return &c->init;
	for (struct shim_proc *p = c->execs; p; p = p->next)
		if (strcmp(p->exec_id, exec_id) == 0)
			return p;
	return NULL;
}

/* Under mu: the container and process named, or st filled. */
static struct shim_proc *lookup(const char *id, const char *exec_id, struct shim_container **cp,
				struct shim_status *st)
{
	struct shim_container *c = find(id);
	if (!c || c->busy) {
		shim_fail(st, CAP_GRPC_NOT_FOUND, "container %s: not created", id);
		return NULL;
	}
	struct shim_proc *p = find_proc(c, exec_id);
	if (!p) {
		shim_fail(st, CAP_GRPC_NOT_FOUND, "container %s has no process %s", id, exec_id);
		return NULL;
	}
	*cp = c;
	c->refs++;
	return p;
}

/* Under mu: the end of a handler's use of c from lookup. */
static void release(struct shim_container *c)
{
	c->refs--;
	pthread_cond_broadcast(&shim.cond);
}

/* Not under mu: lookup of a container's init for a handler that runs
 * the runtime without holding mu; RELEASE(*cp) when not NULL. */
static struct shim_proc *hold_init(const char *id, struct shim_container **cp, struct shim_status *st)
{
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(id, "", cp, st);
	pthread_mutex_unlock(&shim.mu);
	return p;
}

#define RELEASE(c)                                                                                                     \
	do {                                                                                                           \
		pthread_mutex_lock(&shim.mu);                                                                          \
		release(c);                                                                                            \
		pthread_mutex_unlock(&shim.mu);                                                                        \
	} while (0)

static void proc_init(struct shim_proc *p, const char *exec_id, const char *in, const char *out, const char *err,
		      bool terminal)
{
	memset(p, 0, sizeof(*p));
	p->exec_id = xstrdup(exec_id ? exec_id : "");
	p->stdin_path = xstrdup(in ? in : "");
	p->stdout_path = xstrdup(out ? out : "");
	p->stderr_path = xstrdup(err ? err : "");
	p->terminal = terminal;
	p->console = -1;
	p->stdin_keep = -1;
	p->state = PROC_CREATED;
}

static void proc_fini(struct shim_proc *p)
{
	shim_io_close(p);
	free(p->exec_id);
	free(p->stdin_path);
	free(p->stdout_path);
	free(p->stderr_path);
	free(p->spec_json);
}

static void container_free(struct shim_container *c)
{
	proc_fini(&c->init);
	while (c->execs) {
		struct shim_proc *p = c->execs;
		c->execs = p->next;
		proc_fini(p);
		free(p);
	}
	free(c->id);
	free(c->bundle);
	free(c->runtime);
	free(c->root);
	free(c);
}

/* Under mu: unlink c from the list. */
static void unlink_container(struct shim_container *c)
{
	for (struct shim_container **x = &shim.containers; *x; x = &(*x)->next) {
		if (*x == c) {
			*x = c->next;
			return;
		}
	}
}

/* The bundle's record of the runtime and its root, for `delete` after
 * the shim is gone (the runc shim's options.json and runtime files). */
static void write_record(const struct shim_container *c)
{
	char *path = xasprintf("%s/capsule-shim-runtime", c->bundle);
	FILE *f = fopen(path, "we");
	if (f) {
		fprintf(f, "%s\n%s\n", c->runtime, c->root);
		fclose(f);
	}
	free(path);
}

static int start_proc(struct shim_container *c, struct shim_proc *p, struct shim_status *st);

static void task_create(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__CreateTaskRequest *r = req;
	Containerd__Runc__V1__Options *opts = NULL;
	if (r->checkpoint && *r->checkpoint) {
		shim_fail(st, CAP_GRPC_UNIMPLEMENTED, "Create %s: restoring a checkpoint is not supported by capsule", r->id);
		goto out;
	}
	const char *opt_binary = NULL, *opt_root = NULL;
	if (r->options && r->options->value.len) {
		const char *u = r->options->type_url ? r->options->type_url : "";
		if (strstr(u, "containerd.runc.v1.Options"))
			opts = containerd__runc__v1__options__unpack(NULL, r->options->value.len, r->options->value.data);
		if (opts) {
			opt_binary = opts->binary_name;
			opt_root = opts->root;
		}
	}
	pthread_mutex_lock(&shim.mu);
	if (find(r->id)) {
		pthread_mutex_unlock(&shim.mu);
		shim_fail(st, CAP_GRPC_ALREADY_EXISTS, "container %s: already exists", r->id);
		goto out;
	}
	struct shim_container *c = xcalloc(1, sizeof(*c));
	c->id = xstrdup(r->id);
	c->bundle = xstrdup(r->bundle);
	c->runtime = shim_runtime_binary(opt_binary);
	c->root = shim_runtime_root(opt_root);
	c->no_pivot = opts && opts->no_pivot_root;
	c->busy = true;
	proc_init(&c->init, "", r->stdin, r->stdout, r->stderr, r->terminal);
	c->next = shim.containers;
	shim.containers = c;
	pthread_mutex_unlock(&shim.mu);

	cap_mkdir_p(c->root, 0711);
	write_record(c);
	int ok = 0;
	char *rootfs = xasprintf("%s/rootfs", c->bundle);
	if (r->n_rootfs > 0) {
		mkdir(rootfs, 0711);
		ok = shim_mount_rootfs(rootfs, r->rootfs, r->n_rootfs, st);
		c->mounted = ok == 0;
	}
	if (ok == 0)
		ok = start_proc(c, &c->init, st);
	pthread_mutex_lock(&shim.mu);
	if (ok < 0) {
		unlink_container(c);
		pthread_mutex_unlock(&shim.mu);
		if (c->mounted)
			shim_unmount_all(rootfs);
		container_free(c);
		free(rootfs);
		goto out;
	}
	c->busy = false;
	Containerd__Events__TaskCreate ev = CONTAINERD__EVENTS__TASK_CREATE__INIT;
	Containerd__Events__TaskIO tio = CONTAINERD__EVENTS__TASK_IO__INIT;
	tio.stdin = r->stdin;
	tio.stdout = r->stdout;
	tio.stderr = r->stderr;
	tio.terminal = r->terminal;
	ev.container_id = r->id;
	ev.bundle = r->bundle;
	ev.n_rootfs = r->n_rootfs;
	ev.rootfs = r->rootfs;
	ev.io = &tio;
	ev.checkpoint = r->checkpoint;
	ev.pid = (uint32_t)c->init.pid;
	shim_publish("/tasks/create", &ev.base);
	Containerd__Task__V2__CreateTaskResponse resp = CONTAINERD__TASK__V2__CREATE_TASK_RESPONSE__INIT;
	resp.pid = (uint32_t)c->init.pid;
	pthread_mutex_unlock(&shim.mu);
	free(rootfs);
	pack(&resp.base, out, out_len);
out:
	if (opts)
		containerd__runc__v1__options__free_unpacked(opts, NULL);
}

/* Create the init (runtime create) or start an exec (runtime exec
 * --detach), its stdio set up, its pid claimed. Not under mu. */
static int start_proc(struct shim_container *c, struct shim_proc *p, struct shim_status *st)
{
	int fds[3];
	char *console = NULL;
	int listener = -1;
	if (shim_io_prepare(p, fds, &console, &listener, st) < 0)
		return -1;
	bool init = !*p->exec_id;
	char *pidfile = init ? xasprintf("%s/init.pid", c->bundle) : xasprintf("%s/%s.pid", c->bundle, p->exec_id);
	char *specfile = NULL;
	const char *args[16];
	size_t n = 0;
	unlink(pidfile);
	if (init) {
		args[n++] = "create";
		args[n++] = "--bundle";
		args[n++] = c->bundle;
		args[n++] = "--pid-file";
		args[n++] = pidfile;
		if (console) {
			args[n++] = "--console-socket";
			args[n++] = console;
		}
		if (c->no_pivot)
			args[n++] = "--no-pivot";
	} else {
		specfile = xasprintf("%s/.exec-%s.json", c->bundle, p->exec_id);
		int fd = open(specfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
		if (fd < 0 || cap_write_all(fd, p->spec_json, p->spec_len) < 0) {
			int e = errno;
			if (fd >= 0)
				close(fd);
			shim_io_started(p, fds, console, listener, false, st);
			shim_fail(st, CAP_GRPC_INTERNAL, "cannot write %s: %s", specfile, strerror(e));
			goto fail;
		}
		close(fd);
		args[n++] = "exec";
		args[n++] = "--process";
		args[n++] = specfile;
		args[n++] = "--pid-file";
		args[n++] = pidfile;
		args[n++] = "--detach";
		if (console) {
			args[n++] = "--console-socket";
			args[n++] = console;
		}
	}
	args[n++] = c->id;
	args[n] = NULL;
	int r = shim_runtime(c, args, fds[0] >= 0 && !p->terminal ? fds[0] : -1, fds[1], fds[2], NULL, 0, NULL, st);
	struct shim_status st2 = { 0 };
	int io = shim_io_started(p, fds, console, listener, r == 0, &st2);
	if (r < 0)
		goto fail;
	int pid = shim_read_pid(pidfile);
	if (pid < 0) {
		shim_fail(st, CAP_GRPC_INTERNAL, "the runtime wrote no pid to %s: %s", pidfile, strerror(-pid));
		goto fail;
	}
	if (io < 0) {
		*st = st2;
		goto fail;
	}
	pthread_mutex_lock(&shim.mu);
	shim_claim_pid(c, p, pid);
	if (!init && !p->exited)
		p->state = PROC_RUNNING;
	pthread_mutex_unlock(&shim.mu);
	if (specfile)
		unlink(specfile);
	free(specfile);
	free(pidfile);
	free(console);
	return 0;
fail:
	shim_io_close(p);
	if (specfile)
		unlink(specfile);
	free(specfile);
	free(pidfile);
	free(console);
	return -1;
}

static void task_start(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__StartRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p && p->state != PROC_CREATED) {
		shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "%s %s: cannot start a process that is not created", r->id,
			  *r->exec_id ? r->exec_id : "init");
		p = NULL;
	}
	if (p && *r->exec_id && c->init.exited) {
		shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "%s: the container's process has exited", r->id);
		p = NULL;
	}
	if (p)
		p->starting = true;
	pthread_mutex_unlock(&shim.mu);
	if (!p)
		goto out;
	int ok;
	if (!*r->exec_id) {
		const char *args[] = { "start", c->id, NULL };
		ok = shim_runtime(c, args, -1, -1, -1, NULL, 0, NULL, st);
	} else {
		ok = start_proc(c, p, st);
	}
	pthread_mutex_lock(&shim.mu);
	if (ok == 0) {
		if (!p->exited)
			p->state = PROC_RUNNING;
		Containerd__Task__V2__StartResponse resp = CONTAINERD__TASK__V2__START_RESPONSE__INIT;
		resp.pid = (uint32_t)p->pid;
		if (!*r->exec_id) {
			Containerd__Events__TaskStart ev = CONTAINERD__EVENTS__TASK_START__INIT;
			ev.container_id = c->id;
			ev.pid = (uint32_t)p->pid;
			shim_publish("/tasks/start", &ev.base);
		} else {
			Containerd__Events__TaskExecStarted ev = CONTAINERD__EVENTS__TASK_EXEC_STARTED__INIT;
			ev.container_id = c->id;
			ev.exec_id = p->exec_id;
			ev.pid = (uint32_t)p->pid;
			shim_publish("/tasks/exec-started", &ev.base);
		}
		pack(&resp.base, out, out_len);
	} else if (*r->exec_id) {
		/* runc's shim: a failed exec start leaves it stopped. */
		p->state = PROC_STOPPED;
		p->exited = true;
		p->exit_status = 255;
		clock_gettime(CLOCK_REALTIME, &p->exited_at);
	}
	p->starting = false;
	if (p->exit_deferred) {
		p->exit_deferred = false;
		shim_publish_exit(c, p);
	}
	pthread_cond_broadcast(&shim.cond);
	pthread_mutex_unlock(&shim.mu);
out:
	if (held)
		RELEASE(c);
}

static void answer_delete(struct shim_proc *p, uint8_t **out, size_t *out_len)
{
	Containerd__Task__V2__DeleteResponse resp = CONTAINERD__TASK__V2__DELETE_RESPONSE__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	shim_timestamp(&ts, &p->exited_at);
	resp.pid = (uint32_t)p->pid;
	resp.exit_status = (uint32_t)p->exit_status;
	resp.exited_at = &ts;
	pack(&resp.base, out, out_len);
}

static void task_delete(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__DeleteRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p && (p->state == PROC_RUNNING || p->state == PROC_PAUSED) && !p->exited) {
		shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "%s %s: cannot delete a running process", r->id,
			  *r->exec_id ? r->exec_id : "init");
		p = NULL;
	}
	if (!p) {
		pthread_mutex_unlock(&shim.mu);
		goto out;
	}
	if (*r->exec_id) {
		for (struct shim_proc **x = &c->execs; *x; x = &(*x)->next) {
			if (*x == p) {
				*x = p->next;
				break;
			}
		}
		while (p->waiters > 0)
			pthread_cond_wait(&shim.cond, &shim.mu);
		pthread_mutex_unlock(&shim.mu);
		shim_io_close(p);
		answer_delete(p, out, out_len);
		proc_fini(p);
		free(p);
		goto out;
	}
	c->busy = true;
	pthread_mutex_unlock(&shim.mu);
	/* A created init that never started: delete kills it (runc's
	 * created state's Delete); its exit comes through the reaper. */
	const char *args[] = { "delete", c->id, NULL };
	if (shim_runtime(c, args, -1, -1, -1, NULL, 0, NULL, st) < 0) {
		const char *force[] = { "delete", "--force", c->id, NULL };
		struct shim_status st2 = { 0 };
		if (shim_runtime(c, force, -1, -1, -1, NULL, 0, NULL, &st2) < 0) {
			pthread_mutex_lock(&shim.mu);
			c->busy = false;
			pthread_mutex_unlock(&shim.mu);
			goto out;
		}
	}
	pthread_mutex_lock(&shim.mu);
	if (!shim_wait_exit(&c->init, 10000)) {
		c->init.exited = true;
		c->init.exit_status = 128 + SIGKILL;
		clock_gettime(CLOCK_REALTIME, &c->init.exited_at);
	}
	/* Until the other handlers holding it (a Wait) are done with it. */
	while (c->refs > 1)
		pthread_cond_wait(&shim.cond, &shim.mu);
	unlink_container(c);
	pthread_mutex_unlock(&shim.mu);
	for (struct shim_proc *e = c->execs; e; e = e->next)
		shim_io_close(e);
	shim_io_close(&c->init);
	if (c->mounted) {
		char *rootfs = xasprintf("%s/rootfs", c->bundle);
		shim_unmount_all(rootfs);
		free(rootfs);
	}
	Containerd__Events__TaskDelete ev = CONTAINERD__EVENTS__TASK_DELETE__INIT;
	Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
	shim_timestamp(&ts, &c->init.exited_at);
	ev.container_id = c->id;
	ev.pid = (uint32_t)c->init.pid;
	ev.exit_status = (uint32_t)c->init.exit_status;
	ev.exited_at = &ts;
	ev.id = c->id;
	shim_publish("/tasks/delete", &ev.base);
	answer_delete(&c->init, out, out_len);
	container_free(c);
	held = false;
	pthread_mutex_lock(&shim.mu);
	pthread_cond_broadcast(&shim.cond);
	pthread_mutex_unlock(&shim.mu);
out:
	if (held)
		RELEASE(c);
}

static void task_exec(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__ExecProcessRequest *r = req;
	if (!r->spec || !r->spec->value.len) {
		shim_fail(st, CAP_GRPC_INVALID_ARGUMENT, "Exec %s %s: no process spec", r->id, r->exec_id);
		return;
	}
	if (!*r->exec_id) {
		shim_fail(st, CAP_GRPC_INVALID_ARGUMENT, "Exec %s: an empty exec id", r->id);
		return;
	}
	pthread_mutex_lock(&shim.mu);
	struct shim_container *c = find(r->id);
	if (!c || c->busy) {
		shim_fail(st, CAP_GRPC_NOT_FOUND, "container %s: not created", r->id);
	} else if (find_proc(c, r->exec_id)) {
		shim_fail(st, CAP_GRPC_ALREADY_EXISTS, "id %s: already exists", r->exec_id);
	} else if (c->init.exited) {
		shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "container %s: its process has exited", r->id);
	} else {
		struct shim_proc *p = xcalloc(1, sizeof(*p));
		proc_init(p, r->exec_id, r->stdin, r->stdout, r->stderr, r->terminal);
		p->spec_json = xmalloc(r->spec->value.len + 1);
		memcpy(p->spec_json, r->spec->value.data, r->spec->value.len);
		p->spec_len = r->spec->value.len;
		p->next = c->execs;
		c->execs = p;
		Containerd__Events__TaskExecAdded ev = CONTAINERD__EVENTS__TASK_EXEC_ADDED__INIT;
		ev.container_id = c->id;
		ev.exec_id = p->exec_id;
		shim_publish("/tasks/exec-added", &ev.base);
		EMPTY_OUT;
	}
	pthread_mutex_unlock(&shim.mu);
}

static void task_state(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__StateRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p) {
		Containerd__Task__V2__StateResponse resp = CONTAINERD__TASK__V2__STATE_RESPONSE__INIT;
		Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
		static const Containerd__V1__Types__Status map[] = {
			[PROC_CREATED] = CONTAINERD__V1__TYPES__STATUS__CREATED,
			[PROC_RUNNING] = CONTAINERD__V1__TYPES__STATUS__RUNNING,
			[PROC_PAUSED] = CONTAINERD__V1__TYPES__STATUS__PAUSED,
			[PROC_STOPPED] = CONTAINERD__V1__TYPES__STATUS__STOPPED,
		};
		shim_timestamp(&ts, &p->exited_at);
		resp.id = *p->exec_id ? p->exec_id : c->id;
		resp.bundle = c->bundle;
		resp.pid = (uint32_t)p->pid;
		resp.status = map[p->exited ? PROC_STOPPED : p->state];
		resp.stdin = p->stdin_path;
		resp.stdout = p->stdout_path;
		resp.stderr = p->stderr_path;
		resp.terminal = p->terminal;
		resp.exit_status = (uint32_t)p->exit_status;
		resp.exited_at = &ts;
		resp.exec_id = p->exec_id;
		pack(&resp.base, out, out_len);
	}
	pthread_mutex_unlock(&shim.mu);
	if (held)
		RELEASE(c);
}

static void task_kill(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__KillRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p && p->exited) {
		shim_fail(st, CAP_GRPC_NOT_FOUND, "%s %s: process already finished", r->id,
			  *r->exec_id ? r->exec_id : "init");
		p = NULL;
	}
	if (p && *r->exec_id) {
		/* As the runc shim: an exec is signalled by its pid (the
		 * runtime's monitor, which forwards it). */
		if (p->pid <= 0)
			shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "%s %s: not started", r->id, r->exec_id);
		else if (kill(p->pid, (int)r->signal) < 0)
			shim_fail(st, errno == ESRCH ? CAP_GRPC_NOT_FOUND : CAP_GRPC_UNKNOWN, "kill %s %s (pid %d): %s",
				  r->id, r->exec_id, p->pid, strerror(errno));
		else
			EMPTY_OUT;
		p = NULL;
		pthread_mutex_unlock(&shim.mu);
		goto out;
	}
	pthread_mutex_unlock(&shim.mu);
	if (p) {
		char sig[16];
		snprintf(sig, sizeof(sig), "%u", r->signal);
		const char *args[] = { "kill", c->id, sig, NULL };
		const char *all[] = { "kill", "--all", c->id, sig, NULL };
		if (shim_runtime(c, r->all ? all : args, -1, -1, -1, NULL, 0, NULL, st) == 0)
			EMPTY_OUT;
		else {
			/* The process may have exited meanwhile. */
			pthread_mutex_lock(&shim.mu);
			if (c->init.exited)
				shim_fail(st, CAP_GRPC_NOT_FOUND, "%s: process already finished", r->id);
			pthread_mutex_unlock(&shim.mu);
		}
	}
out:
	if (held)
		RELEASE(c);
}

static void task_wait(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__WaitRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p) {
		/* p stays valid: Delete waits for its waiters. */
		p->waiters++;
		shim_wait_exit(p, -1);
		p->waiters--;
		pthread_cond_broadcast(&shim.cond);
		Containerd__Task__V2__WaitResponse resp = CONTAINERD__TASK__V2__WAIT_RESPONSE__INIT;
		Google__Protobuf__Timestamp ts = GOOGLE__PROTOBUF__TIMESTAMP__INIT;
		shim_timestamp(&ts, &p->exited_at);
		resp.exit_status = (uint32_t)p->exit_status;
		resp.exited_at = &ts;
		pack(&resp.base, out, out_len);
	}
	pthread_mutex_unlock(&shim.mu);
	if (held)
		RELEASE(c);
}

static void task_pids(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__PidsRequest *r = req;
	struct shim_container *c;
	struct shim_proc *p = hold_init(r->id, &c, st);
	char *text = NULL;
	const char *args[] = { "ps", "--format", "json", r->id, NULL };
	if (p && shim_runtime(c, args, -1, -1, -1, NULL, 0, &text, st) == 0) {
		json_error_t je;
		json_t *a = json_loads(text, 0, &je);
		if (!json_is_array(a)) {
			shim_fail(st, CAP_GRPC_INTERNAL, "%s ps --format json %s printed no JSON array: %s", c->runtime,
				  r->id, je.text);
		} else {
			size_t n = json_array_size(a);
			Containerd__V1__Types__ProcessInfo *infos = xcalloc(n + 1, sizeof(*infos));
			Containerd__V1__Types__ProcessInfo **ptrs = xcalloc(n + 1, sizeof(*ptrs));
			for (size_t i = 0; i < n; i++) {
				containerd__v1__types__process_info__init(&infos[i]);
				infos[i].pid = (uint32_t)json_integer_value(json_array_get(a, i));
				ptrs[i] = &infos[i];
			}
			Containerd__Task__V2__PidsResponse resp = CONTAINERD__TASK__V2__PIDS_RESPONSE__INIT;
			resp.n_processes = n;
			resp.processes = ptrs;
			pack(&resp.base, out, out_len);
			free(infos);
			free(ptrs);
		}
		json_decref(a);
	}
	free(text);
	if (p)
		RELEASE(c);
}

static void task_resize(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__ResizePtyRequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p && p->console < 0) {
		shim_fail(st, CAP_GRPC_FAILED_PRECONDITION, "%s %s: the process has no terminal", r->id,
			  *r->exec_id ? r->exec_id : "init");
	} else if (p) {
		struct winsize ws = { .ws_row = (unsigned short)r->height, .ws_col = (unsigned short)r->width };
		if (ioctl(p->console, TIOCSWINSZ, &ws) < 0)
			shim_fail(st, CAP_GRPC_UNKNOWN, "resize %s: %s", r->id, strerror(errno));
		else
			EMPTY_OUT;
	}
	pthread_mutex_unlock(&shim.mu);
	if (held)
		RELEASE(c);
}

static void task_closeio(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__CloseIORequest *r = req;
	struct shim_container *c;
	pthread_mutex_lock(&shim.mu);
	struct shim_proc *p = lookup(r->id, r->exec_id, &c, st);
	bool held = p != NULL;
	if (p) {
		if (r->stdin)
			shim_io_close_stdin(p);
		EMPTY_OUT;
	}
	if (held)
		release(c);
	pthread_mutex_unlock(&shim.mu);
}

static void task_update(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__UpdateTaskRequest *r = req;
	struct shim_container *c;
	struct shim_proc *p = hold_init(r->id, &c, st);
	if (p && (!r->resources || !r->resources->value.len)) {
		shim_fail(st, CAP_GRPC_INVALID_ARGUMENT, "Update %s: no resources", r->id);
	} else if (p) {
		/* The Any holds the OCI LinuxResources as JSON (typeurl's JSON
		 * for a registered Go struct): runc update's input. */
		const char *args[] = { "update", "--resources", "-", r->id, NULL };
		if (shim_runtime(c, args, -1, -1, -1, (const char *)r->resources->value.data, r->resources->value.len,
				 NULL, st) == 0)
			EMPTY_OUT;
	}
	if (p)
		RELEASE(c);
}

static void task_stats(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__StatsRequest *r = req;
	struct shim_container *c;
	struct shim_proc *p = hold_init(r->id, &c, st);
	char *text = NULL;
	const char *args[] = { "events", "--stats", r->id, NULL };
	if (p && shim_runtime(c, args, -1, -1, -1, NULL, 0, &text, st) == 0) {
		size_t len;
		uint8_t *m = shim_stats_metrics(text, &len, st);
		if (m) {
			Google__Protobuf__Any any = GOOGLE__PROTOBUF__ANY__INIT;
			any.type_url = "io.containerd.cgroups.v2.Metrics";
			any.value.data = m;
			any.value.len = len;
			Containerd__Task__V2__StatsResponse resp = CONTAINERD__TASK__V2__STATS_RESPONSE__INIT;
			resp.stats = &any;
			pack(&resp.base, out, out_len);
			free(m);
		}
	}
	free(text);
	if (p)
		RELEASE(c);
}

static void task_connect(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__ConnectRequest *r = req;
	(void)st;
	Containerd__Task__V2__ConnectResponse resp = CONTAINERD__TASK__V2__CONNECT_RESPONSE__INIT;
	pthread_mutex_lock(&shim.mu);
	struct shim_container *c = find(r->id);
	resp.shim_pid = (uint32_t)getpid();
	resp.task_pid = c ? (uint32_t)c->init.pid : 0;
	resp.version = CAPSULE_VERSION;
	pack(&resp.base, out, out_len);
	pthread_mutex_unlock(&shim.mu);
}

static void task_shutdown(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	(void)req;
	(void)st;
	pthread_mutex_lock(&shim.mu);
	if (!shim.containers) {
		shim.shutdown = true;
		pthread_cond_broadcast(&shim.cond);
	}
	pthread_mutex_unlock(&shim.mu);
	EMPTY_OUT;
}

/* Pause and Resume: the runtime's pause / resume, with their events. */
static void pause_resume(bool pause, const char *id, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	struct shim_container *c;
	struct shim_proc *p = hold_init(id, &c, st);
	const char *args[] = { pause ? "pause" : "resume", id, NULL };
	if (p && shim_runtime(c, args, -1, -1, -1, NULL, 0, NULL, st) == 0) {
		pthread_mutex_lock(&shim.mu);
		if (!p->exited)
			p->state = pause ? PROC_PAUSED : PROC_RUNNING;
		pthread_mutex_unlock(&shim.mu);
		if (pause) {
			Containerd__Events__TaskPaused ev = CONTAINERD__EVENTS__TASK_PAUSED__INIT;
			ev.container_id = (char *)id;
			shim_publish("/tasks/paused", &ev.base);
		} else {
			Containerd__Events__TaskResumed ev = CONTAINERD__EVENTS__TASK_RESUMED__INIT;
			ev.container_id = (char *)id;
			shim_publish("/tasks/resumed", &ev.base);
		}
		EMPTY_OUT;
	}
	if (p)
		RELEASE(c);
}

static void task_pause(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__PauseRequest *r = req;
	pause_resume(true, r->id, out, out_len, st);
}

static void task_resume(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st)
{
	const Containerd__Task__V2__ResumeRequest *r = req;
	pause_resume(false, r->id, out, out_len, st);
}

/* The methods: each one's request message, decoded here (a request
 * that is not one is refused with INVALID_ARGUMENT) and freed after its
 * handler, which answers in *out (left empty for google.protobuf.Empty)
 * or fills st. */
#define TASK_MSG(m) &containerd__task__v2__##m##__descriptor
static const struct {
	const char *name;
	const ProtobufCMessageDescriptor *request;
	void (*fn)(const void *req, uint8_t **out, size_t *out_len, struct shim_status *st);
} methods[] = {
	{ "Create", TASK_MSG(create_task_request), task_create },
	{ "Start", TASK_MSG(start_request), task_start },
	{ "Delete", TASK_MSG(delete_request), task_delete },
	{ "Exec", TASK_MSG(exec_process_request), task_exec },
	{ "State", TASK_MSG(state_request), task_state },
	{ "Kill", TASK_MSG(kill_request), task_kill },
	{ "Wait", TASK_MSG(wait_request), task_wait },
	{ "Pids", TASK_MSG(pids_request), task_pids },
	{ "ResizePty", TASK_MSG(resize_pty_request), task_resize },
	{ "CloseIO", TASK_MSG(close_iorequest), task_closeio },
	{ "Update", TASK_MSG(update_task_request), task_update },
	{ "Stats", TASK_MSG(stats_request), task_stats },
	{ "Connect", TASK_MSG(connect_request), task_connect },
	{ "Shutdown", TASK_MSG(shutdown_request), task_shutdown },
	{ "Pause", TASK_MSG(pause_request), task_pause },
	{ "Resume", TASK_MSG(resume_request), task_resume },
};
#undef TASK_MSG

void shim_task_call(const char *method, const uint8_t *in, size_t in_len, uint8_t **out, size_t *out_len,
		    struct shim_status *st)
{
	*out = NULL;
	*out_len = 0;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(methods); i++) {
		if (strcmp(methods[i].name, method) != 0)
			continue;
		ProtobufCMessage *req = protobuf_c_message_unpack(methods[i].request, NULL, in_len, in);
		if (!req) {
			shim_fail(st, CAP_GRPC_INVALID_ARGUMENT, "%s: the request is not a %s", method,
				  methods[i].request->name);
			return;
		}
		methods[i].fn(req, out, out_len, st);
		protobuf_c_message_free_unpacked(req, NULL);
		return;
	}
	shim_fail(st, CAP_GRPC_UNIMPLEMENTED, "containerd.task.v2.Task/%s is not implemented by containerd-shim-capsule-v2",
		  method);
}
