/* A jail: its spec, spawning its program and helpers, the probe
 * (jail.h; docs/architecture.md, "The jail"). The parts: jail-cgroup.c,
 * jail-root.c, jail-user.c (jail-internal.h). */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/sched.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include "jail-internal.h"
#include "paths.h"
#include "util.h"

bool jail_env_is(const char *name, const char *value)
{
	const char *v = getenv(name);
	return v && strcmp(v, value) == 0;
}

/* ---- probing ---------------------------------------------------------- */

/* Can we make the namespaces? 0 or -errno. */
static int probe_namespaces(void)
{
	struct clone_args ca = { .flags = NS_FLAGS, .exit_signal = SIGCHLD };
	long pid = syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid < 0)
		return -errno;
	if (pid == 0)
		_exit(0);
	int st;
	while (waitpid((pid_t)pid, &st, 0) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

int cap_jail_probe(struct cap_jail_check c[CAP_JAIL_NCHECKS])
{
	static const char *const names[CAP_JAIL_NCHECKS] = {
		"namespaces", "private root", "unprivileged user", "cgroup limits", "seccomp", "no_new_privs, rlimits",
	};
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++) {
		c[i].name = names[i];
		c[i].active = false;
		c[i].detail[0] = '\0';
	}
	bool off = jail_env_is("CAPSULE_JAIL", "0");
	int ns = off ? -EPERM : probe_namespaces();
	const char *why_off = "the jail is off (CAPSULE_JAIL=0, a debug setting)";
	char why_ns[200];
	snprintf(why_ns, sizeof(why_ns), "cannot create namespaces: %s (the jail needs capsule to run as root)", strerror(-ns));

	if (off)
		snprintf(c[0].detail, sizeof(c[0].detail), "%s", why_off);
	else if (ns < 0)
		snprintf(c[0].detail, sizeof(c[0].detail), "%s", why_ns);
	else {
		c[0].active = true;
		snprintf(c[0].detail, sizeof(c[0].detail), "new mount, PID, IPC, UTS and network namespaces (network: loopback only)");
	}

	jail_root_probe(&c[1], &c[0]);
	jail_user_probe(&c[2], &c[4], &c[5], &c[0]);
	jail_cg_probe(&c[3], off);

	int missing = 0;
	for (int i = 0; i < CAP_JAIL_NCHECKS; i++)
		missing += !c[i].active;
	return missing;
}

/* ---- one jail --------------------------------------------------------- */

bool cap_jail_confined(const struct cap_jail *j) { return j->confined; }
const char *cap_jail_note(const struct cap_jail *j) { return j->note; }
uid_t cap_jail_uid(const struct cap_jail *j) { return j->uid; }
uid_t cap_jail_helper_uid(const struct cap_jail *j) { return j->uid + CAP_JAIL_HELPER_OFFSET; }

void cap_jail_set_netns(struct cap_jail *j, int netns)
{
	CAP_BUG_ON(!j->confined);
	j->netns = netns;
}

bool cap_jail_would_confine(void)
{
	return !jail_env_is("CAPSULE_JAIL", "0") && jail_user_may_confine();
}

void jail_note_missing(struct cap_jail *j, const char *what, const char *why)
{
	size_t used = strlen(j->note);
	snprintf(j->note + used, sizeof(j->note) - used, "%s%s (%s)", used ? "; " : "", what, why);
}

static bool absolute(const char *path)
{
	return path && path[0] == '/' && strlen(path) < PATH_MAX - 64;
}

/* Whether spec can be confined as it says; -EINVAL with err if not. */
static int spec_check(const struct cap_jail_spec *spec, struct cap_err *err)
{
	if (!absolute(spec->exe))
		return cap_err_set(err, EINVAL, "a jail's program must be an absolute path, not %s",
				   spec->exe ? spec->exe : "(none)");
	for (unsigned i = 0; i < spec->nfiles; i++) {
		const struct cap_jail_file *f = &spec->files[i];
		if (!absolute(f->host) || (f->at && !absolute(f->at)))
			return cap_err_set(err, EINVAL, "a jail cannot hold %s%s%s: not an absolute path",
					   f->host ? f->host : "(none)", f->at ? " at " : "", f->at ? f->at : "");
	}
	if (spec->ndevices > CAP_JAIL_MAX_DEVICES)
		return cap_err_set(err, EINVAL, "a jail holds at most %d devices, not %u", CAP_JAIL_MAX_DEVICES,
				   spec->ndevices);
	for (unsigned i = 0; i < spec->ndevices; i++)
		if (!absolute(spec->devices[i]))
			return cap_err_set(err, EINVAL, "a jail cannot hold device %s: not an absolute path",
					   spec->devices[i] ? spec->devices[i] : "(none)");
	int mems = !!spec->rw_file + !!spec->copy_file + (spec->sealed_fd > 0);
	if (mems > 1)
		return cap_err_set(err, EINVAL, "a jail takes one memory file: rw_file, copy_file or sealed_fd");
	if (spec->rw_file && (!absolute(spec->rw_file) || !absolute(spec->rw_at)))
		return cap_err_set(err, EINVAL, "a jail's read-write file and its place must be absolute paths");
	const char *slash = spec->copy_at ? strrchr(spec->copy_at, '/') : NULL;
	if (spec->copy_file && (!absolute(spec->copy_file) || !absolute(spec->copy_at) ||
				slash == spec->copy_at || !slash[1]))
		return cap_err_set(err, EINVAL, "a jail's copied file must go to /dir/name, not %s",
				   spec->copy_at ? spec->copy_at : "(none)");
	return 0;
}

static void bind_add(struct cap_jail *j, const char *host, const char *at, unsigned long flags)
{
	for (unsigned i = 0; i < j->nbinds; i++)
		if (strcmp(j->owned_binds[i].owned_at, at) == 0)
			return;
	j->owned_binds = xrealloc(j->owned_binds, (j->nbinds + 1) * sizeof(*j->owned_binds));
	j->owned_binds[j->nbinds++] = (struct bind){ xstrdup(host), xstrdup(at), flags };
}

static char *dup_or_null(const char *s) { return s ? xstrdup(s) : NULL; }

int cap_jail_new(const struct cap_jail_spec *spec, struct cap_jail **out,
		 struct cap_err *err)
{
	int r = spec_check(spec, err);
	if (r < 0)
		return r;
	struct cap_jail *j = xcalloc(1, sizeof(*j));
	j->slot = -1;
	j->lock_fd = -1;
	j->copier = -1;
	j->pid = -1;
	j->netns = -1;
	j->owned_exe = xstrdup(spec->exe);
	j->name = strrchr(j->owned_exe, '/') + 1;
	unsigned long ro = MS_RDONLY | MS_NOSUID | MS_NODEV;
	bind_add(j, spec->exe, spec->exe, ro);
	for (unsigned i = 0; i < spec->nfiles; i++) {
		const struct cap_jail_file *f = &spec->files[i];
		bind_add(j, f->host, f->at ? f->at : f->host, ro | (f->exec ? 0 : MS_NOEXEC));
	}
	for (unsigned i = 0; i < spec->ndevices; i++) {
		bool have = false;
		for (unsigned k = 0; k < j->nnodes; k++)
			have |= strcmp(j->nodes[k].owned_at, spec->devices[i]) == 0;
		if (have)
			continue;
		if ((r = jail_root_node(spec->devices[i], &j->nodes[j->nnodes].rdev, err)) < 0)
			goto fail;
		j->nodes[j->nnodes++].owned_at = xstrdup(spec->devices[i]);
	}
	j->owned_rw_file = dup_or_null(spec->rw_file);
	j->owned_rw_at = dup_or_null(spec->rw_at);
	j->owned_copy_file = dup_or_null(spec->copy_file);
	j->owned_copy_at = dup_or_null(spec->copy_at);

	if (jail_env_is("CAPSULE_JAIL", "0"))
		jail_note_missing(j, "the jail", "CAPSULE_JAIL=0, a debug setting");
	else if (!jail_user_may_confine())
		jail_note_missing(j, "namespaces, private root, unprivileged user, cgroup limits",
			     "capsule lacks CAP_SYS_ADMIN, CAP_SETUID or CAP_SETGID: the jail needs root");
	else
		j->confined = true;
	if (!j->confined)
		goto done;
	if (spec->sealed_fd > 0) {
		/* The one thing that keeps a compromised program from
		 * rewriting what every later VM starts from: looked at here. */
		int seals = fcntl(spec->sealed_fd, F_GET_SEALS);
		int need = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL;
		if (seals < 0 || (seals & need) != need) {
			r = cap_err_set(err, EPERM, "refusing to give %s a memory descriptor not sealed against writes (seals %#x)",
					j->name, seals < 0 ? 0 : seals);
			goto fail;
		}
		j->own_proc = true;
	}

	cap_jail_sweep(NULL, NULL);	/* cgroups of owners that died */
	if ((r = jail_user_take_slot(j, err)) < 0)
		goto fail;
	jail_cg_setup(j, spec);
done:
	if (*j->note && jail_env_is("CAPSULE_REQUIRE_JAIL", "1")) {
		r = cap_err_set(err, EPERM, "CAPSULE_REQUIRE_JAIL=1 and this host cannot confine %s fully: missing %s; `capsule doctor` lists each protection",
				j->name, j->note);
		goto fail;
	}
	*out = j;
	return 0;
fail:
	cap_jail_free(j);
	return r;
}

void cap_jail_free(struct cap_jail *j)
{
	if (!j)
		return;
	if (j->copier > 0) {
		kill(j->copier, SIGKILL);
		cap_jail_ready(j, NULL);
	}
	for (int i = 0; i < 3; i++) {
		if (j->owned_cg[i])
			jail_cg_remove(j->owned_cg[i]);
		free(j->owned_cg[i]);
	}
	/* A template's RAM goes back to root. Should that fail, the file
	 * stays in root's 0700 template folder, out of every jail. */
	if (j->confined && j->owned_rw_file && chown(j->owned_rw_file, 0, 0) < 0)
		errno = 0;
	if (j->lock_fd >= 0)
		close(j->lock_fd);
	for (unsigned i = 0; i < j->nbinds; i++) {
		free(j->owned_binds[i].owned_host);
		free(j->owned_binds[i].owned_at);
	}
	free(j->owned_binds);
	for (unsigned i = 0; i < j->nnodes; i++)
		free(j->nodes[i].owned_at);
	free(j->owned_exe);
	free(j->owned_rw_file);
	free(j->owned_rw_at);
	free(j->owned_copy_file);
	free(j->owned_copy_at);
	free(j);
}

size_t jail_read_failure(int fd, char *msg, size_t size)
{
	size_t len = 0;
	while (len < size - 1) {
		ssize_t k = read(fd, msg + len, size - 1 - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		len += (size_t)k;
	}
	msg[len] = '\0';
	return len;
}

__attribute__((noreturn)) void jail_die(const struct child *c, const char *what, int e)
{
	char msg[512];
	int len = snprintf(msg, sizeof(msg), "%s: %s", what, strerror(e));
	if (write(c->errfd, msg, (size_t)CAP_MIN(len, (int)sizeof(msg) - 1)) < 0)
		(void)0;
	_exit(e > 0 && e < 127 ? e : 127);
}

void jail_parent_alive(const struct child *c)
{
	struct pollfd p = { .fd = c->errfd, .events = POLLOUT };
	if (poll(&p, 1, 0) == 1 && (p.revents & POLLERR))
		_exit(127);
}

/* Move fds[0..n) (and the slot lock after them) to 3, 4, ... and close
 * everything else but errfd. */
static void place_fds(struct child *c)
{
	int hi = 3 + (int)c->n + 64;
	int tmp[c->n + 1];
	unsigned total = c->n + (c->j->lock_fd >= 0 ? 1 : 0);
	for (unsigned i = 0; i < total; i++) {
		int src = i < c->n ? c->fds[i] : c->j->lock_fd;
		if ((tmp[i] = fcntl(src, F_DUPFD_CLOEXEC, hi)) < 0)
			jail_die(c, "passing descriptors", errno);
	}
	int efd = fcntl(c->errfd, F_DUPFD_CLOEXEC, hi + 64);
	if (efd < 0)
		jail_die(c, "passing descriptors", errno);
	c->errfd = efd;
	if (dup2(c->nullfd, 0) < 0 || dup2(c->logfd, 1) < 0 || dup2(c->logfd, 2) < 0)
		jail_die(c, "setting up stdio", errno);
	for (unsigned i = 0; i < total; i++)
		if (dup2(tmp[i], 3 + (int)i) < 0)
			jail_die(c, "passing descriptors", errno);
	syscall(SYS_close_range, 3U + total, (unsigned)efd - 1, 0U);
	syscall(SYS_close_range, (unsigned)efd + 1, ~0U, 0U);
}


/* First steps of every jailed child: die with the parent, join the
 * network namespace netns (-1: keep the one it has) and the jail's
 * cgroups. */
static void jail_enter(const struct child *c, const struct cap_jail *j, int netns)
{
	prctl(PR_SET_PDEATHSIG, SIGKILL);
	jail_parent_alive(c);
	if (netns >= 0 && setns(netns, CLONE_NEWNET) < 0)
		jail_die(c, "joining the VM's network namespace", errno);
	int failed = 0, r = jail_cg_join(j, &failed);
	if (r < 0) {
		char what[PATH_MAX + 64];
		snprintf(what, sizeof(what), "joining cgroup %s", j->owned_cg[failed]);
		jail_die(c, what, -r);
	}
}
__attribute__((noreturn)) static void child_main(struct child *c)
{
	const struct cap_jail *j = c->j;

	jail_enter(c, j, j->confined ? j->netns : -1);
	if (j->confined) {
		umask(022);	/* the jail's user must traverse what we make */
		jail_root_build(c);
	}

	/* RLIMIT_NPROC counts per user: only for a user of its own. */
	jail_user_limit(c, j->confined ? NPROC : 0);
	if (j->confined)
		jail_user_become(c, j->uid, j->gid, "the jail's user");
	/* Nothing it execs could gain privileges. */
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		jail_die(c, "setting no_new_privs", errno);
	place_fds(c);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	char *envp[] = { NULL };
	execve(j->owned_exe, c->argv, envp);
	jail_die(c, j->owned_exe, errno);
}

/* ---- helpers of a VM ------------------------------------------------ */

static int cmp_int(const void *a, const void *b)
{
	int x = *(const int *)a, y = *(const int *)b;
	return (x > y) - (x < y);
}

/* Close every descriptor but the n in keep. */
static void keep_only(int *keep, unsigned n)
{
	qsort(keep, n, sizeof(int), cmp_int);
	unsigned from = 0;
	for (unsigned i = 0; i < n; i++) {
		if ((unsigned)keep[i] > from)
			syscall(SYS_close_range, from, (unsigned)keep[i] - 1, 0U);
		from = (unsigned)keep[i] + 1;
	}
	syscall(SYS_close_range, from, ~0U, 0U);
}

/* The helper's side: confine itself, report a failed step on c->errfd
 * (closing it means ready), then run fn. */
__attribute__((noreturn)) static void helper_main(struct child *c, int netns,
						  const char *const *files, unsigned nfiles,
						  const int *keep, unsigned nkeep,
						  int (*fn)(void *ud), void *ud)
{
	const struct cap_jail *j = c->j;
	uid_t uid = cap_jail_helper_uid(j);
	gid_t gid = (gid_t)uid;

	/* The cgroup files are reached by path: before the new root. */
	jail_enter(c, j, netns);
	jail_root_helper(c, files, nfiles);
	jail_user_limit(c, HELPER_NPROC);
	jail_user_become(c, uid, gid, "the jail's helper user");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		jail_die(c, "setting no_new_privs", errno);
	/* The owner's handlers and mask are its own business. */
	struct sigaction dfl = { .sa_handler = SIG_DFL }, ign = { .sa_handler = SIG_IGN };
	for (int sig = 1; sig < NSIG; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			sigaction(sig, sig == SIGPIPE ? &ign : &dfl, NULL);
	sigset_t none;
	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);

	int kept[nkeep + 4];
	for (unsigned i = 0; i < nkeep; i++)
		kept[i] = keep[i];
	kept[nkeep] = 0;
	kept[nkeep + 1] = 1;
	kept[nkeep + 2] = 2;
	kept[nkeep + 3] = c->errfd;
	keep_only(kept, nkeep + 4);
	close(c->errfd);	/* ready */
	_exit(fn(ud));
}

pid_t cap_jail_helper(struct cap_jail *j, int netns, const char *const *files,
		      unsigned nfiles, const int *keep, unsigned nkeep,
		      int (*fn)(void *ud), void *ud, int *pidfd, struct cap_err *err)
{
	CAP_BUG_ON(!j->confined);
	int r = cap_mkdir_p(ROOT_MNT, 0755);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", ROOT_MNT, strerror(-r));
	for (unsigned i = 0; i < nfiles; i++)
		if (files[i][0] != '/' || strlen(files[i]) >= PATH_MAX)
			return cap_err_set(err, EINVAL, "a VM's helper cannot be given %s: not an absolute path", files[i]);
	if (nkeep > NOFILE)
		return cap_err_set(err, EINVAL, "a VM's helper cannot keep %u descriptors (at most %d)", nkeep, NOFILE);
	for (unsigned i = 0; i < nkeep; i++)
		if (keep[i] < 0 || fcntl(keep[i], F_GETFD) < 0)
			return cap_err_set(err, EBADF, "descriptor %d given to a VM's helper is not open", keep[i]);
	int ep[2];
	if (pipe2(ep, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(ep[0]);
		close(ep[1]);
		return cap_err_set(err, e, "cannot start a helper of the VM (fork): %s", strerror(e));
	}
	if (pid == 0) {
		close(ep[0]);
		struct child c = { .j = j, .errfd = ep[1], .logfd = -1, .nullfd = -1, .copyfd = -1 };
		helper_main(&c, netns, files, nfiles, keep, nkeep, fn, ud);
	}
	close(ep[1]);
	/* Our child, not reaped yet: its pid cannot have been reused. */
	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	int e = pfd < 0 ? errno : 0;
	char msg[512] = "";
	size_t len = pfd >= 0 ? jail_read_failure(ep[0], msg, sizeof(msg)) : 0;
	close(ep[0]);
	if (pfd < 0 || len > 0) {
		kill(pid, SIGKILL);
		while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
			;
		if (pfd < 0)
			return cap_err_set(err, e, "pidfd_open: %s", strerror(e));
		close(pfd);
		return cap_err_set(err, EPERM, "cannot confine a helper of the VM: %s", msg);
	}
	*pidfd = pfd;
	return pid;
}

pid_t cap_jail_spawn(struct cap_jail *j, char *const argv[], int logfd,
		     const int *fds, unsigned n, int *pidfd,
		     struct cap_err *err)
{
	_cleanup_close_ int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
	_cleanup_close_ int copyfd = -1;
	int ep[2] = { -1, -1 }, r;
	pid_t pid = -1;

	if (nullfd < 0)
		return cap_err_set(err, errno, "/dev/null: %s", strerror(errno));
	if (j->confined) {
		if ((r = cap_mkdir_p(ROOT_MNT, 0755)) < 0)
			return cap_err_set(err, -r, "cannot create %s: %s", ROOT_MNT, strerror(-r));
		if (j->nnodes && (r = cap_mkdir_p(DEV_MNT, 0700)) < 0)
			return cap_err_set(err, -r, "cannot create %s: %s", DEV_MNT, strerror(-r));
		if (j->owned_copy_file && (copyfd = open(j->owned_copy_file, O_RDONLY | O_CLOEXEC)) < 0)
			return cap_err_set(err, errno, "cannot open %s: %s", j->owned_copy_file, strerror(errno));
	}
	if (pipe2(ep, O_CLOEXEC) < 0) {
		r = cap_err_set(err, errno, "pipe: %s", strerror(errno));
		goto out;
	}
	struct clone_args ca = {
		.flags = CLONE_PIDFD | (!j->confined ? 0 : j->netns >= 0 ? NS_FLAGS & ~CLONE_NEWNET : NS_FLAGS),
		.pidfd = (uint64_t)(uintptr_t)pidfd,
		.exit_signal = SIGCHLD,
	};
	pid = (pid_t)syscall(SYS_clone3, &ca, sizeof(ca));
	if (pid < 0) {
		r = cap_err_set(err, errno, "cannot start %s in its jail (clone3): %s", j->name, strerror(errno));
		goto out;
	}
	if (pid == 0) {
		close(ep[0]);
		struct child c = { j, argv, ep[1], logfd, nullfd, copyfd, fds, n };
		child_main(&c);
	}
	close(ep[1]);
	ep[1] = -1;
	/* The child reports a failed step on the pipe; end of file means
	 * the program is running. */
	char msg[512];
	size_t len = jail_read_failure(ep[0], msg, sizeof(msg));
	if (len > 0) {
		int st;
		while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
			;
		close(*pidfd);
		*pidfd = -1;
		r = cap_err_set(err, EPERM, "cannot confine %s: %s", j->name, msg);
		pid = -1;
		goto out;
	}
	j->pid = pid;
	if (copyfd >= 0 && (r = jail_root_start_copier(j, pid, copyfd, err)) < 0) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		close(*pidfd);
		*pidfd = -1;
		pid = -1;
		goto out;
	}
	r = 0;
out:
	if (ep[0] >= 0)
		close(ep[0]);
	if (ep[1] >= 0)
		close(ep[1]);
	return r < 0 ? r : pid;
}
