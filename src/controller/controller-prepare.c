/* Preparation: the guest kernel, the initramfs, the image and the
 * template a first sandbox needs, each found or built in that order with
 * its progress told (docs/serve.md, "prepare"). Every builder here
 * writes atomically (the kernel script moves its vmlinux and link into
 * place, the initramfs and images are renamed when whole, templates are
 * built in a temporary directory), so a failed run leaves nothing that a
 * later one takes for made. */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include "controller-prepare.h"
#include "named.h"
#include "paths.h"
#include "policy.h"
#include "sandbox.h"
#include "store.h"
#include "util.h"

#define CAP_PREP_KILL_GRACE_MS 5000

static const char *const phase_names[CAP_PREP_NPHASES] = { "kernel", "initramfs", "image", "template" };
static const char *const status_names[] = { "building", "line", "ready", "failed" };

const char *cap_prep_phase_name(enum cap_prep_phase p)
{
	if (p == CAP_PREP_LOCK)
		return "lock";
	return (unsigned)p < CAP_PREP_NPHASES ? phase_names[p] : "?";
}

const char *cap_prep_status_name(enum cap_prep_status s)
{
	return (unsigned)s < CAP_ARRAY_SIZE(status_names) ? status_names[s] : "?";
}

void cap_prep_out_fini(struct cap_prep_out *o)
{
	free(o->owned_kernel);
	free(o->owned_initramfs);
	free(o->owned_image_name);
	o->owned_kernel = o->owned_initramfs = o->owned_image_name = NULL;
}

void cap_prep_cancel_init(struct cap_prep_cancel *x)
{
	pthread_mutex_init(&x->lock, NULL);
	x->cancelled = false;
	x->pid = 0;
}

void cap_prep_cancel_fini(struct cap_prep_cancel *x)
{
	pthread_mutex_destroy(&x->lock);
}

void cap_prep_cancel_request(struct cap_prep_cancel *x)
{
	pthread_mutex_lock(&x->lock);
	x->cancelled = true;
	if (x->pid > 0)
		kill(-x->pid, SIGTERM);
	pthread_mutex_unlock(&x->lock);
}

static bool cancelled(struct cap_prep_cancel *x)
{
	if (!x)
		return false;
	pthread_mutex_lock(&x->lock);
	bool c = x->cancelled;
	pthread_mutex_unlock(&x->lock);
	return c;
}

/* One run: where events go and how far it got. */
struct run {
	cap_prep_fn fn;
	void *ud;
	enum cap_prep_phase phase;
	unsigned done;
	struct cap_prep_cancel *cancel;
	char last[4][300];	/* the builder's last lines, for its error */
	unsigned nlast;
};

static void emit(struct run *x, enum cap_prep_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
static void emit(struct run *x, enum cap_prep_status st, const char *fmt, ...)
{
	char msg[1200];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (st == CAP_PREP_READY)
		x->done++;
	cap_log(st == CAP_PREP_FAILED ? CAP_LOG_WARN : CAP_LOG_INFO, "prepare %s: %s%s%s",
		cap_prep_phase_name(x->phase), st == CAP_PREP_LINE ? "" : status_names[st], st == CAP_PREP_LINE ? "" : ": ",
		msg);
	if (!x->fn)
		return;
	struct cap_prep_event ev = { .phase = x->phase, .status = st, .done = x->done, .message = msg };
	x->fn(x->ud, &ev);
}

static void on_line(void *ud, const char *line)
{
	struct run *x = ud;
	snprintf(x->last[x->nlast % 4], sizeof(x->last[0]), "%s", line);
	x->nlast++;
	emit(x, CAP_PREP_LINE, "%s", line);
}

/* One line of the builder: a terminal's updating line (\r) tells its
 * last part. */
static void line_out(struct run *x, char *line)
{
	size_t n = strlen(line);
	while (n > 0 && line[n - 1] == '\r')
		line[--n] = '\0';
	char *cr = strrchr(line, '\r');
	on_line(x, cr ? cr + 1 : line);
}

/* The builder's output, line by line, until the pipe's end. Once a cancel
 * is seen, the group has CAP_PREP_KILL_GRACE_MS after its SIGTERM, then
 * gets SIGKILL; a second later reading stops even if the pipe is still
 * open (a process that left the group holds it): a builder that ignores
 * SIGTERM never keeps a shutdown waiting. */
static void read_lines(struct run *x, int fd, pid_t pid)
{
	char buf[4096];
	size_t used = 0;
	int64_t term_at = 0, kill_at = 0;
	for (;;) {
		if (!term_at && cancelled(x->cancel))
			term_at = cap_now_ms();
		int64_t now = cap_now_ms();
		if (term_at && !kill_at && now - term_at >= CAP_PREP_KILL_GRACE_MS) {
			cap_log(CAP_LOG_WARN, "prepare kernel: the builder's group %d is still there %d s after SIGTERM: SIGKILL",
				(int)pid, CAP_PREP_KILL_GRACE_MS / 1000);
			kill(-pid, SIGKILL);
			kill_at = now;
		}
		if (kill_at && now - kill_at >= 1000)
			break;
		struct pollfd pfd = { .fd = fd, .events = POLLIN };
		int n = poll(&pfd, 1, 200);
		if (n < 0 && errno != EINTR)
			break;
		if (n <= 0)
			continue;
		ssize_t got = read(fd, buf + used, sizeof(buf) - 1 - used);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0)
			break;
		used += (size_t)got;
		char *start = buf, *nl;
		while ((nl = memchr(start, '\n', used - (size_t)(start - buf)))) {
			*nl = '\0';
			line_out(x, start);
			start = nl + 1;
		}
		used -= (size_t)(start - buf);
		memmove(buf, start, used);
		if (used == sizeof(buf) - 1) {	/* a line too long: in parts */
			buf[used] = '\0';
			line_out(x, buf);
			used = 0;
		}
	}
	if (used) {
		buf[used] = '\0';
		line_out(x, buf);
	}
}

/* Run the kernel builder in a process group of its own (a cancel kills
 * the group: make and its compilers with it), its output merged into
 * lines. */
static int run_builder(struct run *x, const char *builder, struct cap_err *err)
{
	int p[2];
	int null = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (null < 0 || pipe2(p, O_CLOEXEC) < 0) {
		int e = errno;
		if (null >= 0)
			close(null);
		return cap_err_set(err, e, "cannot run %s: %s", builder, strerror(e));
	}
	pthread_mutex_lock(&x->cancel->lock);
	pid_t pid = x->cancel->cancelled ? -1 : fork();
	if (pid == 0) {
		/* Between fork and exec, only what is async-signal-safe. */
		setpgid(0, 0);
		dup2(null, 0);
		dup2(p[1], 1);
		dup2(p[1], 2);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		signal(SIGPIPE, SIG_DFL);
		execl(builder, builder, (char *)NULL);
		execl("/bin/sh", "sh", builder, (char *)NULL);
		_exit(127);
	}
	int e = errno;
	if (pid > 0) {
		setpgid(pid, pid);	/* also here: no window before the child's own */
		x->cancel->pid = pid;
	}
	pthread_mutex_unlock(&x->cancel->lock);
	close(null);
	close(p[1]);
	if (pid < 0) {
		close(p[0]);
		return x->cancel->cancelled ? cap_err_set(err, ECANCELED, "the preparation was cancelled")
					    : cap_err_set(err, e, "cannot run %s: fork: %s", builder, strerror(e));
	}
	read_lines(x, p[0], pid);
	close(p[0]);
	int status = 0;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	pthread_mutex_lock(&x->cancel->lock);
	x->cancel->pid = 0;
	bool was_cancelled = x->cancel->cancelled;
	pthread_mutex_unlock(&x->cancel->lock);
	if (was_cancelled)
		return cap_err_set(err, ECANCELED, "the kernel build was cancelled (nothing half-built is kept; prepare again to build it)");
	if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
		return 0;
	char how[64];
	if (WIFEXITED(status))
		snprintf(how, sizeof(how), "exit %d", WEXITSTATUS(status));
	else
		snprintf(how, sizeof(how), "killed by signal %d", WTERMSIG(status));
	const char *last = x->nlast ? x->last[(x->nlast - 1) % 4] : "no output";
	return cap_err_set(err, EIO, "the kernel builder %s failed (%s): %s; fix that and prepare again", builder, how,
			   last);
}

static int phase_kernel(struct run *x, struct cap_prep_out *out, struct cap_err *err)
{
	bool have, have_builder;
	out->owned_kernel = cap_store_kernel_path(&have);
	emit(x, CAP_PREP_BUILDING, "looking for the guest kernel at %s", out->owned_kernel);
	if (have) {
		emit(x, CAP_PREP_READY, "already there: %s", out->owned_kernel);
		return 0;
	}
	_cleanup_free_ char *builder = cap_store_kernel_builder(&have_builder);
	if (!have_builder)
		return cap_err_set(err, ENOENT, "the guest kernel %s is missing and its build script %s is not there: in a capsule source tree run `make kernel` (3 to 6 minutes), or set CAPSULE_KERNEL to a built kernel (or CAPSULE_KERNEL_BUILDER to guest/build-kernel.sh)",
				   out->owned_kernel, builder);
	emit(x, CAP_PREP_LINE, "not there: building it with %s (3 to 6 minutes on 2 cores)", builder);
	int r = run_builder(x, builder, err);
	if (r < 0)
		return r;
	free(out->owned_kernel);
	out->owned_kernel = cap_store_kernel_path(&have);
	if (!have)
		return cap_err_set(err, ENOENT, "the kernel builder %s finished but %s is still missing (the script builds into the cache: unset CAPSULE_KERNEL, or point it at the vmlinux it built)",
				   builder, out->owned_kernel);
	out->built |= 1u << CAP_PREP_KERNEL;
	emit(x, CAP_PREP_READY, "built now: %s", out->owned_kernel);
	return 0;
}

static int phase_initramfs(struct run *x, struct cap_prep_out *out, struct cap_err *err)
{
	bool have_agent, built = false;
	_cleanup_free_ char *agent = cap_store_agent_path(&have_agent);
	emit(x, CAP_PREP_BUILDING, "looking for the initramfs of the guest agent %s", agent);
	if (!have_agent)
		return cap_err_set(err, ENOENT, "the guest agent %s is missing: build it with `make` (or set CAPSULE_AGENT)", agent);
	int r = cap_store_initramfs(agent, CAP_BUSYBOX, &out->owned_initramfs, &built, err);
	if (r < 0)
		return r;
	if (built)
		out->built |= 1u << CAP_PREP_INITRAMFS;
	emit(x, CAP_PREP_READY, "%s: %s", built ? "built now" : "already there", out->owned_initramfs);
	return 0;
}

static int phase_image(struct run *x, const char *ref, struct cap_prep_out *out, struct cap_err *err)
{
	struct cap_image img;
	struct cap_err ferr = { 0 };
	emit(x, CAP_PREP_BUILDING, "looking for image %s", ref);
	bool built = false;
	int r = cap_store_image_find(ref, &img, &ferr);
	if (r == -ENOENT) {
		r = cap_store_image_ensure(ref, on_line, x, &img, err);
		built = r == 0;
	} else if (r < 0) {
		*err = ferr;
	}
	if (r < 0)
		return r;
	out->owned_image_name = img.owned_name ? xstrdup(img.owned_name) : NULL;
	snprintf(out->image_digest, sizeof(out->image_digest), "%s", img.digest);
	if (built)
		out->built |= 1u << CAP_PREP_IMAGE;
	emit(x, CAP_PREP_READY, "%s: %s (%s)", built ? "built now" : "already there", ref, img.digest);
	cap_image_fini(&img);
	return 0;
}

static bool templates_off(void)
{
	const char *env = getenv("CAPSULE_TEMPLATES");
	return env && strcmp(env, "0") == 0;
}

static bool listed(const struct cap_template_info *v, size_t n, const char *key)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(v[i].key, key) == 0)
			return true;
	return false;
}

/* The template new sandboxes of this shape restore: the same options a
 * named sandbox's shim boots with (sandbox-shim.c), so the same key. */
static int phase_template(struct run *x, const struct cap_prep_req *req, struct cap_prep_out *out,
			  struct cap_err *err)
{
	emit(x, CAP_PREP_BUILDING, "looking for the template new sandboxes start from");
	if (templates_off()) {
		out->template_on = false;
		emit(x, CAP_PREP_READY, "templates are off (CAPSULE_TEMPLATES=0): sandboxes boot cold");
		return 0;
	}
	struct cap_image img;
	int r = cap_store_image_find(out->image_digest, &img, err);
	if (r < 0)
		return r;
	/* The shape of a new sandbox of this controller: a fresh record's
	 * vCPUs and memory, its network. Per-sandbox disks are placeholders
	 * in a template: their paths are not part of it. */
	struct cap_record rec;
	cap_record_init(&rec);
	struct cap_net_policy *closed = xmalloc(sizeof(*closed));
	cap_net_policy_init(closed);
	struct cap_sandbox_spec *spec = xmalloc(sizeof(*spec));
	struct cap_sandbox_opts o;
	cap_named_shape(&rec, img.owned_path, "upper", "work", "source", req->workspace ? "workspace" : NULL,
			"capsule", req->network ? req->network : closed, spec, &o);
	struct cap_template_info *v = NULL;
	size_t n = 0;
	cap_template_list(&v, &n);
	char key[65] = "";
	r = cap_template_ensure(&o, key, err);
	bool built = r == 0 && !listed(v, n, key);
	for (size_t i = 0; i < n; i++)
		cap_template_info_fini(&v[i]);
	free(v);
	free(spec);
	free(closed);
	cap_image_fini(&img);
	if (r < 0)
		return r;
	out->template_on = true;
	if (built)
		out->built |= 1u << CAP_PREP_TEMPLATE;
	emit(x, CAP_PREP_READY, "%s: %.16s", built ? "built now" : "already there", key);
	return 0;
}

/* One preparation at a time per cache (the kernel lives there): wait for
 * another process's, saying so, until it ends or this one is cancelled. */
static int lock_cache(struct run *x, int *fd, struct cap_err *err)
{
	_cleanup_free_ char *cache = cap_cache_dir();
	int r = cap_mkdir_p(cache, 0755);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create the cache %s for the preparation's lock: %s", cache, strerror(-r));
	_cleanup_free_ char *path = xasprintf("%s/prepare.lock", cache);
	*fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if (*fd < 0)
		return cap_err_set(err, errno, "cannot open the preparation's lock %s: %s", path, strerror(errno));
	bool said = false;
	while (flock(*fd, LOCK_EX | LOCK_NB) < 0) {
		if (errno != EWOULDBLOCK && errno != EINTR)
			return cap_err_set(err, errno, "cannot take the preparation's lock %s: %s", path, strerror(errno));
		if (cancelled(x->cancel))
			return cap_err_set(err, ECANCELED, "the preparation was cancelled while it waited for the lock %s (another process was preparing)",
					   path);
		if (!said) {
			/* Told as a line of the first phase: notifications
			 * name the four phases only; "lock" is a failure's. */
			x->phase = CAP_PREP_KERNEL;
			emit(x, CAP_PREP_LINE, "waiting for another preparation (%s is locked)", path);
			x->phase = CAP_PREP_LOCK;
		}
		said = true;
		usleep(100000);
	}
	return 0;
}

int cap_ctl_prepare(const struct cap_prep_req *req, cap_prep_fn fn, void *ud,
		    struct cap_prep_cancel *cancel, struct cap_prep_out *out, struct cap_err *err)
{
	struct cap_prep_cancel own;
	cap_prep_cancel_init(&own);
	struct run x = { .fn = fn, .ud = ud, .cancel = cancel ? cancel : &own };
	int64_t start = cap_now_ms();
	int lock = -1;
	int r;
	memset(out, 0, sizeof(*out));
	out->template_on = !templates_off();
	x.phase = CAP_PREP_LOCK;
	r = lock_cache(&x, &lock, err);
	for (unsigned p = 0; r == 0 && p < CAP_PREP_NPHASES; p++) {
		x.phase = (enum cap_prep_phase)p;
		if (cancelled(x.cancel)) {
			r = cap_err_set(err, ECANCELED, "the preparation was cancelled before its %s phase", phase_names[p]);
			break;
		}
		switch (x.phase) {
		case CAP_PREP_KERNEL: r = phase_kernel(&x, out, err); break;
		case CAP_PREP_INITRAMFS: r = phase_initramfs(&x, out, err); break;
		case CAP_PREP_IMAGE: r = phase_image(&x, req->image ? req->image : "base", out, err); break;
		case CAP_PREP_TEMPLATE: r = phase_template(&x, req, out, err); break;
		case CAP_PREP_LOCK: break;	/* not a phase of the loop */
		}
	}
	if (lock >= 0)
		close(lock);
	if (r < 0) {
		out->failed = x.phase;
		emit(&x, CAP_PREP_FAILED, "%s", err->msg);
		if (x.phase != CAP_PREP_LOCK)	/* the lock's message names its path */
			cap_err_prefix(err, "preparing the %s", phase_names[x.phase]);
	}
	out->duration_ms = cap_now_ms() - start;
	cap_prep_cancel_fini(&own);
	return r;
}
