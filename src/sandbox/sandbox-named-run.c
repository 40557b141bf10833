/* Running a named sandbox: its shim started and stopped, a dead one's
 * leftovers reaped, its network changed, the sandbox killed or removed. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "named.h"
#include "sandbox-internal.h"
#include "policy.h"
#include "sandbox.h"
#include "paths.h"
#include "store.h"
#include "tree.h"
#include "util.h"

/* Take the lock a shim holds for its whole life, retrying for a moment
 * (cap_named_status holds it shared for an instant). The descriptor, or
 * -1 when a shim (or another reaper) has it. */
static int lock_shim(const char *lockp)
{
	int fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	for (int i = 0; fd >= 0 && i < 50; i++) {
		if (flock(fd, LOCK_EX | LOCK_NB) == 0)
			return fd;
		usleep(2000);
	}
	if (fd >= 0)
		close(fd);
	return -1;
}

/* The directory a dead shim's control socket was in, when it is one we
 * may clean: the sandbox directory, or a run directory made by
 * cap_make_run_dir (<base>/capsule-XXXXXX, a real 0700 directory of
 * ours). New string, or NULL. */
static char *control_dir(const char *control, const char *dir, bool *run_dir)
{
	struct stat st;
	char *d = xstrdup(control);
	char *slash = strrchr(d, '/');
	*run_dir = false;
	if (d[0] != '/' || !slash || slash == d || strcmp(slash, "/control.sock") != 0)
		goto no;
	*slash = '\0';
	if (strcmp(d, dir) == 0)
		return d;
	const char *base = strrchr(d, '/') + 1;
	if (strncmp(base, "capsule-", 8) != 0 || strlen(base) != 14 ||
	    lstat(d, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 07777) != 0700)
		goto no;
	*run_dir = true;
	return d;
no:
	free(d);
	return NULL;
}

/* Remove file from the sandbox directory; when it was there, add its
 * name to the list (for the log). */
static void unlink_noted(const char *name, const char *file, char *list, size_t size)
{
	_cleanup_free_ char *p = cap_named_path(name, file);
	size_t used = strlen(list);
	if (unlink(p) == 0)
		snprintf(list + used, size - used, "%s%s", used ? ", " : "", file);
}

/* What a dead shim of a pod's sandbox left in the pod's namespace: its
 * tap went with the last of its descriptors, but the veth's ingress
 * qdisc and the filter redirecting to the tap stay (cap_pod_net_untap
 * never ran), and would drop what the veth receives. Nothing when the
 * namespace is gone (CNI's DEL came first). */
static void pod_net_leftover(const char *name)
{
	struct cap_record rec;
	if (cap_named_load(name, &rec, NULL) < 0 || !rec.pod_netns[0])
		return;
	int ns = open(rec.pod_netns, O_RDONLY | O_CLOEXEC);
	if (ns < 0)
		return;
	struct cap_pod_net pod;
	struct cap_err e = { 0 };
	if (cap_pod_net_read(ns, rec.pod_netns, &pod, &e) == 0)
		cap_pod_net_untap(ns, &pod);
	else
		cap_log(CAP_LOG_INFO, "sandbox %s: its pod's network namespace left as it is: %s", name, e.msg);
	close(ns);
}

int cap_named_reap(const char *name, struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *lockp = cap_named_path(name, "shim.lock");
	_cleanup_free_ char *rt = cap_named_path(name, "runtime.json");
	if (access(dir, F_OK) != 0)
		return 0;	/* no sandbox, nothing left */
	/* Holding the shim's lock, we know no shim runs, and none can start
	 * and write its files while we remove the old ones. */
	_cleanup_close_ int lock = lock_shim(lockp);
	if (lock < 0)
		return cap_err_set(err, EBUSY, "sandbox '%s' is running or starting (its shim holds %s); stop it first (`capsule stop %s`)",
				   name, lockp, name);

	pid_t vmm = 0;
	char ename[32] = "";
	_cleanup_free_ char *sockdir = NULL;
	bool run_dir = false;
	json_t *j = json_load_file(rt, 0, NULL);
	if (j) {
		cap_named_runtime_vmm(j, ename, sizeof(ename), &vmm);
		const char *c = json_string_value(json_object_get(j, "control"));
		if (c && (sockdir = control_dir(c, dir, &run_dir)) && run_dir)
			unlink(c);
		json_decref(j);
	}
	/* The sockets first (whoever looks meanwhile finds none to try),
	 * runtime.json once its VM is surely gone. */
	char removed[256] = "";
	unlink_noted(name, "control.sock", removed, sizeof(removed));
	/* The VM, if it outlived its shim (it has PDEATHSIG, so only if that
	 * failed), is named by the directory of its sockets: its engine ends
	 * it and removes what else it left there. */
	const struct cap_engine_ops *engine = cap_engine_default();
	if (*ename && (r = cap_engine_get(ename, &engine, err)) < 0) {
		cap_err_prefix(err, "sandbox '%s': %s names its VM's engine", name, rt);
		return r;
	}
	r = cap_engine_end_leftover(engine, sockdir ? sockdir : dir, vmm);
	if (r > 0)
		cap_log(CAP_LOG_INFO, "sandbox %s: killed VM process %d left running by its dead shim", name, (int)vmm);
	if (r >= 0) {
		unlink_noted(name, "runtime.json", removed, sizeof(removed));
		pod_net_leftover(name);
	}
	if (*removed)
		cap_log(CAP_LOG_INFO, "sandbox %s: removed %s left by its dead shim", name, removed);
	if (r < 0)
		return cap_err_set(err, -r, "the VM process %d of sandbox '%s' outlived its shim and could not be killed: %s",
				   (int)vmm, name, strerror(-r));
	if (run_dir) {
		cap_remove_run_dir(sockdir);
		cap_log(CAP_LOG_INFO, "sandbox %s: removed its dead shim's run directory %s", name, sockdir);
	}
	return 0;
}

/* The capsule executable that runs shims: $CAPSULE_BIN, else capsule next
 * to the running executable, else the running executable itself. */
static char *shim_exe(void)
{
	const char *env = getenv("CAPSULE_BIN");
	if (env && *env)
		return xstrdup(env);
	_cleanup_free_ char *dir = cap_exe_dir();
	char *p = xasprintf("%s/capsule", dir);
	if (access(p, X_OK) == 0)
		return p;
	free(p);
	return xstrdup("/proc/self/exe");
}

/* Another process started the shim: wait until it serves (runtime.json
 * names its control socket) or gives up (its lock goes away). */
static int wait_serving(const char *name, struct cap_err *err)
{
	struct cap_named_status st;
	int64_t end = cap_now_ms() + 120000;
	while (cap_now_ms() < end) {
		int r = cap_named_status(name, &st, err);
		if (r < 0)
			return r;
		if (st.state == CAP_NAMED_STOPPED) {
			_cleanup_free_ char *dir = cap_named_dir(name);
			return cap_err_set(err, EIO, "sandbox '%s' was being started by another process, which failed; see %s/shim.log",
					   name, dir);
		}
		if (st.control[0])
			return 0;
		usleep(20000);
	}
	return cap_err_set(err, ETIMEDOUT, "sandbox '%s' is starting but did not become ready in 120 s", name);
}

int cap_named_start(const char *name, struct cap_err *err)
{
	int fd;
	int r = cap_named_start_begin(name, &fd, err);
	if (r < 0)
		return r;
	if (fd < 0)
		return wait_serving(name, err);
	return cap_named_start_end(name, fd, err);
}

/* Whether a running sandbox's shim is serving: between taking its lock
 * and listening, or from its stop (the socket goes first) to its exit, a
 * shim holds the lock but cannot be attached to. */
static bool serving(const struct cap_named_status *st)
{
	struct stat sb;
	return st->control[0] && stat(st->control, &sb) == 0 && S_ISSOCK(sb.st_mode);
}

int cap_named_start_begin(const char *name, int *fd, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	*fd = -1;
	if (r < 0)
		return r;
	/* A shim starting or exiting: wait until it serves or is gone. Once
	 * stopped, clean up what a dead shim left; a shim that takes the lock
	 * meanwhile (a concurrent start) makes that fail with EBUSY, and we
	 * wait for it instead. */
	for (int i = 0;; i++) {
		if (st.state != CAP_NAMED_STOPPED && serving(&st))
			return 0;
		struct cap_err rerr = { 0 };
		if (st.state == CAP_NAMED_STOPPED) {
			if ((r = cap_named_reap(name, &rerr)) == 0)
				break;
			if (r != -EBUSY)
				return cap_err_set(err, rerr.code, "%s", rerr.msg);
		}
		if (i == 1000)
			return cap_err_set(err, EBUSY, "sandbox '%s' has been starting or stopping for 10 s (see its shim.log); try again",
					   name);
		usleep(10000);
		if ((r = cap_named_status(name, &st, err)) < 0)
			return r;
	}

	int ready[2];
	if (pipe2(ready, O_CLOEXEC) < 0)
		return cap_err_set(err, errno, "pipe: %s", strerror(errno));
	_cleanup_free_ char *log = cap_named_path(name, "shim.log");
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(ready[0]);
		close(ready[1]);
		return cap_err_set(err, e, "fork: %s", strerror(e));
	}
	if (pid == 0) {
		/* Detach twice so that the shim belongs to no terminal and
		 * no caller, then run it with only its own descriptors. */
		setsid();
		if (fork() != 0)
			_exit(0);
		close(ready[0]);
		/* Keep only the ready pipe (as fd 3) of what the caller had. */
		cap_child_keep_fd3(ready[1]);
		sigset_t none;
		sigemptyset(&none);
		sigprocmask(SIG_SETMASK, &none, NULL);
		for (int s = 1; s < NSIG; s++)
			signal(s, SIG_DFL);
		umask(077);
		int null = open("/dev/null", O_RDWR);
		int out = open(log, O_WRONLY | O_CREAT | O_APPEND, 0600);
		if (null >= 0 && out >= 0) {
			dup2(null, 0);
			dup2(out, 1);
			dup2(out, 2);
		}
		if (null > 3)
			close(null);
		if (out > 3)
			close(out);
		/* A fresh process image: the shim carries nothing of its
		 * caller (a controller's memory holds other identities). */
		_cleanup_free_ char *exe = shim_exe();
		execl(exe, "capsule", "shim", "--ready-fd=3", name, (char *)NULL);
		dprintf(3, "cannot run the shim %s: %s\n", exe, strerror(errno));
		_exit(127);
	}
	close(ready[1]);
	waitpid(pid, NULL, 0);	/* the first child exits at once */
	*fd = ready[0];
	return 0;
}

int cap_named_start_end(const char *name, int fd, struct cap_err *err)
{
	_cleanup_free_ char *log = cap_named_path(name, "shim.log");
	char msg[sizeof(err->msg)];
	size_t len = 0;
	ssize_t n;
	while (len < sizeof(msg) - 1 && (n = read(fd, msg + len, sizeof(msg) - 1 - len)) != 0) {
		if (n < 0) {
			if (errno == EINTR)
				continue;
			break;
		}
		len += (size_t)n;
	}
	msg[len] = '\0';
	close(fd);
	if (strcmp(msg, "ok\n") == 0)
		return 0;
	if (strcmp(msg, "busy\n") == 0)
		return wait_serving(name, err);	/* lost a race with another start */
	if (len == 0)
		return cap_err_set(err, EIO, "sandbox '%s' did not start and said nothing; see %s", name, log);
	while (len > 0 && msg[len - 1] == '\n')
		msg[--len] = '\0';
	return cap_err_set(err, EIO, "sandbox '%s' did not start: %s", name, msg);
}

/* For stop and remove: a shim that had to be killed (or crashed) leaves
 * files and maybe its VM. One that started again meanwhile is not ours
 * to judge (0). */
static int reap_stopped(const char *name, struct cap_err *err)
{
	struct cap_err rerr = { 0 };
	int r = cap_named_reap(name, &rerr);
	if (r < 0 && r != -EBUSY)
		return cap_err_set(err, rerr.code, "%s", rerr.msg);
	return 0;
}

int cap_named_stop(const char *name, int grace_ms, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return reap_stopped(name, err);
	struct cap_sandbox *sb = NULL;
	struct cap_err aerr = { 0 };
	if (*st.control && cap_sandbox_attach(st.control, &sb, &aerr) == 0) {
		cap_sandbox_shutdown(sb, grace_ms, &aerr);
		cap_sandbox_free(sb);
	}
	/* Wait for the shim to go (its lock is released when it exits,
	 * zombie or not); if it does not, kill it (its QEMU dies with it).
	 * Disks are never touched here. */
	int64_t end = cap_now_ms() + grace_ms + 5000;
	while (cap_now_ms() < end && cap_named_status(name, &st, NULL) == 0 &&
	       st.state != CAP_NAMED_STOPPED)
		usleep(10000);
	if (st.state != CAP_NAMED_STOPPED && st.shim_pid > 0) {
		kill(st.shim_pid, SIGKILL);
		for (int i = 0; i < 100 && cap_named_status(name, &st, NULL) == 0 &&
				st.state != CAP_NAMED_STOPPED; i++)
			usleep(10000);
	}
	if (cap_named_status(name, &st, err) == 0 && st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s' is still running (shim pid %d) after being stopped", name, (int)st.shim_pid);
	return reap_stopped(name, err);
}

/* A sandbox whose record cannot be read: removed only with force, and
 * only when no shim holds it (its lock is free). */
static int remove_broken(const char *name, bool force, struct cap_err *err)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	if (!force) {
		_cleanup_free_ char *why = xstrdup(err->msg);
		return cap_err_set(err, EBADMSG, "%s; `capsule rm --force %s` removes the sandbox and its disks (%s) anyway",
				   why, name, dir);
	}
	_cleanup_free_ char *lockp = cap_named_path(name, "shim.lock");
	_cleanup_close_ int fd = lock_shim(lockp);
	if (fd < 0)
		return cap_err_set(err, EBUSY, "sandbox '%s' has an unreadable record and its shim still runs (%s is locked); kill it first",
				   name, lockp);
	int r = cap_remove_tree(dir);
	if (r < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}

int cap_named_remove(const char *name, bool force, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r == -EBADMSG)
		return remove_broken(name, force, err);
	if (r < 0)
		return r;
	/* Paused is running too: its QEMU has the disks open. */
	if (st.state != CAP_NAMED_STOPPED) {
		if (!force)
			return cap_err_set(err, EBUSY, "sandbox '%s' is %s; stop it first (`capsule stop %s`) or use `capsule rm --force %s`",
					   name, st.state == CAP_NAMED_PAUSED ? "paused (its VM still runs)" : "running",
					   name, name);
		if ((r = cap_named_stop(name, 5000, err)) < 0)
			return r;
	} else if ((r = cap_named_reap(name, err)) < 0) {
		return r;	/* a shim started meanwhile, or a VM outlived its shim */
	}
	_cleanup_free_ char *dir = cap_named_dir(name);
	if ((r = cap_remove_tree(dir)) < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}

int cap_named_kill(const char *name, struct cap_err *err)
{
	struct cap_named_status st;
	int r = cap_named_status(name, &st, err);
	if (r < 0 || st.state == CAP_NAMED_STOPPED)
		return r;
	if (st.shim_pid > 0)
		kill(st.shim_pid, SIGKILL);
	for (int i = 0; i < 200 && cap_named_status(name, &st, NULL) == 0 && st.state != CAP_NAMED_STOPPED; i++)
		usleep(10000);
	if (st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s': its shim (pid %d) is still there after SIGKILL", name,
				   (int)st.shim_pid);
	return cap_named_reap(name, err);
}

/* runtime.json's "network": the policy a running shim has in force
 * (NULL when it runs without a NIC, or its policy process died), and
 * whether its "secrets" (those its policy process started with) are
 * secrets. */
static bool shim_network(const char *name, const char *words, bool *has_nic,
			 const char *secrets, bool *same_secrets)
{
	_cleanup_free_ char *rt = cap_named_path(name, "runtime.json");
	json_t *j = json_load_file(rt, 0, NULL);
	const char *s = j ? json_string_value(json_object_get(j, "network")) : NULL;
	const char *sec = j ? json_string_value(json_object_get(j, "secrets")) : NULL;
	bool same = s && strcmp(s, words) == 0;
	if (has_nic)
		*has_nic = s != NULL;
	if (same_secrets)
		*same_secrets = sec && secrets && strcmp(sec, secrets) == 0;
	json_decref(j);
	return same;
}

int cap_named_set_network(const char *name, const struct cap_net_policy *p,
			  bool *restart_needed, struct cap_err *err)
{
	struct cap_record rec;
	struct cap_named_status st;
	int r;
	*restart_needed = false;
	if ((r = cap_named_load(name, &rec, err)) < 0)
		return r;
	if ((r = cap_record_set_net(&rec, p, err)) < 0 || (r = cap_named_write_record(&rec, err)) < 0)
		return r;
	if ((r = cap_named_status(name, &st, err)) < 0)
		return r;
	if (st.state == CAP_NAMED_STOPPED)
		return 0;
	/* What the running VM has, not what the record said. A VM without
	 * a NIC gets one at its next start; one with a NIC follows the new
	 * policy now, and with none refuses everything until it restarts. */
	bool has_nic, same_secrets;
	_cleanup_free_ char *secrets = cap_net_policy_secrets_line(p);
	shim_network(name, "", &has_nic, secrets, &same_secrets);
	/* Its policy process keeps the secrets it started with. */
	*restart_needed = !has_nic ? p->enabled : !p->enabled || !same_secrets;
	if (!has_nic)
		return 0;
	if (kill(st.shim_pid, SIGUSR1) < 0)
		return cap_err_set(err, errno, "cannot reach sandbox '%s''s shim (pid %d): %s; the new policy applies at its next start",
				   name, (int)st.shim_pid, strerror(errno));
	for (int i = 0; i < 250; i++) {
		if (shim_network(name, rec.net, NULL, NULL, NULL))
			return 0;
		usleep(20000);
	}
	return cap_err_set(err, ETIMEDOUT, "sandbox '%s' did not confirm its new network policy within 5 s; see shim.log in its directory",
			   name);
}

int cap_named_set_size(const char *name, unsigned cpus, unsigned memory_mib,
		       struct cap_err *err)
{
	struct cap_named_status st;
	_cleanup_free_ struct cap_record *rec = xmalloc(sizeof(*rec));
	int r;
	if ((r = cap_named_load(name, rec, err)) < 0)
		return r;
	if (rec->cpus == cpus && rec->memory_mib == memory_mib)
		return 0;
	if (cpus < 1 || cpus > CAP_CPUS_MAX || memory_mib < CAP_MEMORY_MIN_MIB ||
	    memory_mib > CAP_MEMORY_MAX_MIB)
		return cap_err_set(err, ERANGE, "%u vCPUs and %u MiB are out of range for sandbox '%s' (1 to %d vCPUs, %d to %d MiB)",
				   cpus, memory_mib, name, CAP_CPUS_MAX, CAP_MEMORY_MIN_MIB, CAP_MEMORY_MAX_MIB);
	if ((r = cap_named_status(name, &st, err)) < 0)
		return r;
	if (st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s' runs with %u vCPUs and %u MiB; it gets %u and %u MiB at its next start, not now",
				   name, rec->cpus, rec->memory_mib, cpus, memory_mib);
	cap_log(CAP_LOG_INFO, "sandbox %s: %u vCPUs and %u MiB from this start (were %u and %u MiB)", name,
		cpus, memory_mib, rec->cpus, rec->memory_mib);
	rec->cpus = cpus;
	rec->memory_mib = memory_mib;
	return cap_named_write_record(rec, err);
}

int cap_named_set_tools_root(const char *name, bool root, struct cap_err *err)
{
	struct cap_named_status st;
	_cleanup_free_ struct cap_record *rec = xmalloc(sizeof(*rec));
	int r;
	if ((r = cap_named_load(name, rec, err)) < 0)
		return r;
	if (rec->tools_root == root)
		return 0;
	if ((r = cap_named_status(name, &st, err)) < 0)
		return r;
	if (st.state != CAP_NAMED_STOPPED)
		return cap_err_set(err, EBUSY, "sandbox '%s' runs its commands as %s; they run as %s from its next start, not now",
				   name, rec->tools_root ? "root" : "the tool user", root ? "root" : "the tool user");
	cap_log(CAP_LOG_INFO, "sandbox %s: commands as %s from this start", name, root ? "root" : "the tool user");
	rec->tools_root = root;
	return cap_named_write_record(rec, err);
}
