#include <errno.h>
#include <fcntl.h>
#include <unistd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <stdio.h>
#include <string.h>

#include "log.h"
#include "paths.h"
#include "layout.h"
#include "sandbox-internal.h"
#include "sandbox.h"
#include "sock.h"
#include "store.h"
#include "util.h"

struct cap_sandbox {
	struct cap_vm *vm;	/* NULL when attached to a shim */
	int fd;	/* agent channel, or the shim's control socket */
	struct cap_client client;
	struct cap_accel_choice accel;
	char *owned_run_dir;	/* temporary directory to remove, or NULL */
	bool dead;	/* VM or agent gone: only free is valid */
	bool restored;	/* from a template or a snapshot */
	/* Resuming a snapshot: every start_vm's HELLO keeps what runs
	 * (cap_client_keep). */
	bool keep;
	char boot_note[720];
	struct cap_sandbox_net *net;	/* owner of a VM with a NIC, else NULL */
	/* Connection to the RAM holder of the template this VM maps
	 * (sandbox-ramhold.c), kept while the VM runs; -1 when none. */
	int ram_conn;
	struct cap_vm_times vm_times;	/* of the last start_vm */
	int64_t ready_ns;	/* when start_vm last got its answers */
	struct cap_sandbox_times times;
	/* A pod's NIC: its namespace, the tap QEMU is given, what the veth
	 * is (to undo the filters); -1 when none. */
	int pod_ns, tap_fd;
	int cred_fd;	/* the credential files' watch (sandbox-net.c), -1 */
	struct cap_vm_tap tap;
	struct cap_pod_net pod;
	/* The template key a restore used ("" for none), and for a spare
	 * taken from `capsule spares` (vm NULL): the holder's connection
	 * (its close ends the VM), the VM's pid and its jail's note. */
	char template_key[65];
	int spare_conn;
	pid_t spare_vmm_pid;
	char spare_jail_note[512];
};

/* A sandbox with nothing yet: every descriptor -1, a fresh client. */
static struct cap_sandbox *sb_new(void)
{
	struct cap_sandbox *sb = xcalloc(1, sizeof(*sb));
	sb->fd = -1;
	sb->ram_conn = sb->spare_conn = -1;
	sb->pod_ns = sb->tap_fd = -1;
	sb->cred_fd = -1;
	cap_client_init(&sb->client);
	return sb;
}

void cap_sandbox_opts_init(struct cap_sandbox_opts *o)
{
	*o = (struct cap_sandbox_opts){
		.cpus = 1,
		.memory_mib = 512,
		.net_log_fd = -1,
		.net_counters_fd = -1,
		.accel = CAP_ACCEL_AUTO,
		.boot_timeout_ms = 60000,
		.use_template = true,
	};
}

const struct cap_accel_choice *cap_sandbox_accel(const struct cap_sandbox *sb)
{
	return &sb->accel;
}

const char *cap_sandbox_agent_version(const struct cap_sandbox *sb)
{
	return sb->client.agent_version;
}

pid_t cap_sandbox_vmm_pid(const struct cap_sandbox *sb)
{
	return sb->vm ? cap_vm_pid(sb->vm) : sb->spare_conn >= 0 ? sb->spare_vmm_pid : -1;
}

const char *cap_sandbox_engine(const struct cap_sandbox *sb)
{
	return sb->vm ? cap_engine_name(cap_vm_engine(sb->vm)) : NULL;
}

int cap_sandbox_pause(struct cap_sandbox *sb, bool pause, struct cap_err *err)
{
	if (!sb->vm)
		return cap_err_set(err, EINVAL, "only the owner of a VM can pause it");
	if (pause)
		return cap_vm_pause(sb->vm, err);
	int r = cap_vm_resume(sb->vm, err);
	/* The guest's clock stood still while it was paused (QEMU stops
	 * kvmclock and TCG's virtual clock with the vCPUs): it takes the
	 * host's before the next command, which follows on this channel. */
	if (r == 0)
		cap_client_clock(&sb->client);
	return r;
}

void cap_sandbox_vm_op(struct cap_sandbox *sb, bool pause)
{
	cap_client_vm_op(&sb->client, pause ? CAP_MSG_PAUSE : CAP_MSG_RESUME);
}

void cap_sandbox_snapshot_op(struct cap_sandbox *sb, const char *dir, bool paused)
{
	cap_client_snapshot(&sb->client, dir, paused ? CAP_SNAPSHOT_PAUSED : 0);
}

unsigned cap_sandbox_vm_op_pending(const struct cap_sandbox *sb)
{
	return sb->client.vm_ops_pending;
}

int cap_sandbox_vm_op_result(const struct cap_sandbox *sb)
{
	return -sb->client.vm_op_errno;
}

void cap_sandbox_stop_async(struct cap_sandbox *sb)
{
	cap_client_shutdown(&sb->client);
}

bool cap_sandbox_is_dead(const struct cap_sandbox *sb)
{
	return sb->dead || sb->client.shutdown_acked;
}

size_t cap_sandbox_backlog(const struct cap_sandbox *sb)
{
	return cap_buf_used(&sb->client.out);
}

unsigned cap_sandbox_running(const struct cap_sandbox *sb)
{
	return sb->client.nactive;
}

void cap_sandbox_pollfds(const struct cap_sandbox *sb, struct pollfd *pfd)
{
	short ev = POLLIN;
	if (cap_buf_used(&sb->client.out) > 0)
		ev |= POLLOUT;
	pfd[0] = (struct pollfd){ .fd = sb->fd, .events = ev };
	pfd[1] = (struct pollfd){ .fd = sb->vm ? cap_vm_exit_fd(sb->vm) : -1, .events = POLLIN };
	pfd[2] = (struct pollfd){ .fd = sb->vm && sb->net ? sb->cred_fd : -1, .events = POLLIN };
}

/* A credential file's copy written: a failure is logged (the guest keeps
 * the copy it had). */
static void cred_written(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	(void)ud;
	(void)id;
	if (!ex || ex->kind != CAP_EXIT_CODE || ex->value != 0)
		cap_log(CAP_LOG_WARN, "credential file: the guest's copy was not written: %s",
			msg ? msg : errnum ? strerror(errnum) : "the agent refused it");
}

static void cred_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)ud;
	(void)id;
	(void)fd;
	(void)p;
	(void)n;
}

static const struct cap_exec_events cred_events = { .output = cred_output, .done = cred_written };

/* Write the guest's copies of the credential files (all at start, else
 * those whose host file changed): private files under /work. */
static int write_creds(struct cap_sandbox *sb, bool all, struct cap_err *err)
{
	struct cap_sandbox_cred_copy copies[CAP_NET_MAX_SECRET_FILES];
	unsigned n = 0;
	int r = cap_sandbox_net_cred_copies(sb->net, sb->vm, all, copies, &n, err);
	for (unsigned i = 0; i < n; i++) {
		static const char home[] = CAP_GUEST_WORK "/";
		struct cap_file_req req = {
			.op = CAP_FILE_WRITE, .limit = CAP_FILE_PRIVATE, .root = CAP_GUEST_WORK,
			.path = copies[i].path + sizeof(home) - 1,
			.data = (const uint8_t *)copies[i].owned_text, .len = copies[i].len,
		};
		uint32_t id;
		struct cap_err e = { 0 };
		if (r == 0 && cap_sandbox_file(sb, &req, 0, &cred_events, NULL, &id, &e) < 0) {
			if (all)
				r = cap_err_set(err, e.code, "--secret-file %s: %s", copies[i].path, e.msg);
			else
				cap_log(CAP_LOG_WARN, "--secret-file %s: %s", copies[i].path, e.msg);
		}
		free(copies[i].owned_text);
	}
	if (r == 0 && all && n > 0 && (r = cap_sandbox_wait(sb, 30000, err)) < 0)
		cap_err_prefix(err, "--secret-file: writing the guest's copies: ");
	return r;
}

/* The VM is gone or unusable: say why, with the end of its logs. */
static int dead(struct cap_sandbox *sb, struct cap_err *err, int code,
		const char *what)
{
	sb->dead = true;
	if (!sb->vm && sb->spare_conn >= 0)
		return cap_err_set(err, code, "%s (the spare's VM, pid %d, is gone: see the log of `capsule spares`)", what,
				   (int)sb->spare_vmm_pid);
	if (!sb->vm)
		return cap_err_set(err, code, "%s (the sandbox's shim closed the connection; see shim.log and console.log in its directory)", what);
	cap_vm_wait(sb->vm, 100);
	_cleanup_free_ char *logs = cap_vm_logs_tail(sb->vm, 15);
	const char *how = cap_vm_wait(sb->vm, 0) ? cap_vm_exit_reason(sb->vm) : "QEMU is still running";
	return cap_err_set(err, code, "%s (%s)%s%s", what, how, *logs ? "\n" : "", logs);
}

static int flush(struct cap_sandbox *sb, struct cap_err *err)
{
	struct cap_buf *out = &sb->client.out;
	while (cap_buf_used(out) > 0) {
		ssize_t n = send(sb->fd, cap_buf_head(out), cap_buf_used(out), MSG_NOSIGNAL);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return 0;
			return dead(sb, err, EPIPE, "the guest agent's channel closed");
		}
		cap_buf_consume(out, (size_t)n);
	}
	return 0;
}

/* A shim that cannot take one more client says why in an ERROR on
 * stream 0 instead of its HELLO ("too many clients (N)"): that, not a
 * protocol error, is the answer. */
static bool refused(struct cap_sandbox *sb, const uint8_t *buf, size_t n,
		    struct cap_err *err)
{
	struct cap_frame f;
	int errnum;
	char msg[256];
	if (cap_proto_parse(buf, n, &f) <= 0 || f.type != CAP_MSG_ERROR || f.stream != 0 ||
	    cap_proto_error_decode(f.payload, f.len, &errnum, msg, sizeof(msg)) < 0)
		return false;
	sb->dead = true;
	cap_err_set(err, errnum > 0 && errnum < 4096 ? errnum : EAGAIN,
		    "the sandbox's shim refused the connection: %s", msg);
	return true;
}

int cap_sandbox_event_fd(const struct cap_sandbox *sb)
{
	return sb->vm && !sb->dead ? cap_vm_event_fd(sb->vm) : -1;
}

int cap_sandbox_io_errors(struct cap_sandbox *sb, struct cap_vm_io_error *last)
{
	return sb->vm ? cap_vm_io_errors(sb->vm, last) : 0;
}

int cap_sandbox_dispatch(struct cap_sandbox *sb, const struct pollfd *pfd,
			 struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has already stopped");
	if (pfd[0].revents & (POLLIN | POLLHUP | POLLERR)) {
		uint8_t buf[65536];
		ssize_t n = read(sb->fd, buf, sizeof(buf));
		if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
			return dead(sb, err, EPIPE, "the guest agent's channel closed");
		if (n > 0 && !sb->vm && !sb->client.hello && refused(sb, buf, (size_t)n, err))
			return -err->code;
		if (n > 0) {
			int r = cap_client_feed(&sb->client, buf, (size_t)n, err);
			if (r < 0) {
				sb->dead = true;
				cap_err_prefix(err, "guest protocol error");
				return r;
			}
		}
		if (sb->net && sb->vm && sb->client.listeners_changed) {
			struct cap_err nerr = { 0 };
			sb->client.listeners_changed = false;
			if (cap_sandbox_net_listeners(sb->net, sb->vm, sb->client.listeners,
						      sb->client.nlisteners, &nerr) < 0)
				cap_log(CAP_LOG_WARN, "auto-publish: %s", nerr.msg);
		}
	}
	if (sb->vm && (pfd[1].revents & POLLIN))
		return dead(sb, err, ECHILD, "the VM stopped unexpectedly");
	if (sb->vm && sb->net && (pfd[2].revents & POLLIN)) {
		struct cap_err cerr = { 0 };
		write_creds(sb, false, &cerr);
	}
	return flush(sb, err);
}

/* One round of poll + dispatch, waiting at most timeout_ms. */
static int step(struct cap_sandbox *sb, int timeout_ms, struct cap_err *err)
{
	struct pollfd pfd[CAP_SANDBOX_NPOLL];
	cap_sandbox_pollfds(sb, pfd);
	int r = poll(pfd, CAP_SANDBOX_NPOLL, timeout_ms);
	if (r < 0)
		return errno == EINTR ? 0 : cap_err_set(err, errno, "poll: %s", strerror(errno));
	return cap_sandbox_dispatch(sb, pfd, err);
}

int cap_sandbox_wait(struct cap_sandbox *sb, int timeout_ms,
		     struct cap_err *err)
{
	int64_t end = timeout_ms < 0 ? INT64_MAX : cap_now_ms() + timeout_ms;
	while (sb->client.nactive > 0 || cap_buf_used(&sb->client.out) > 0) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			return -ETIMEDOUT;
		int r = step(sb, timeout_ms < 0 ? -1 : (int)left, err);
		if (r < 0)
			return r;
	}
	return 0;
}

static int wait_hello(struct cap_sandbox *sb, int timeout_ms,
		      struct cap_err *err)
{
	int64_t end = cap_now_ms() + timeout_ms;
	while (!sb->client.hello) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			return dead(sb, err, ETIMEDOUT, sb->vm ? "the guest agent did not answer within the boot timeout"
							       : "the sandbox's shim did not answer");
		int r = step(sb, (int)left, err);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Queue SETUP, with the host's clock and fresh entropy (a VM restored
 * from a template has the template's). */
static int queue_setup(struct cap_sandbox *sb, const struct cap_setup *in,
		       struct cap_err *err)
{
	struct cap_setup setup = *in;
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	setup.realtime_ns = (int64_t)now.tv_sec * 1000000000 + now.tv_nsec;
	if (getrandom(setup.seed, sizeof(setup.seed), 0) != (ssize_t)sizeof(setup.seed))
		return cap_err_set(err, EIO, "getrandom: %s", strerror(errno));
	if (cap_client_setup(&sb->client, &setup) < 0)
		return cap_err_set(err, EINVAL, "a disk serial or hostname is not valid for the protocol");
	return 0;
}

/* Wait for the agent to have mounted what SETUP names. */
static int wait_setup(struct cap_sandbox *sb, int timeout_ms, struct cap_err *err)
{
	int64_t end = cap_now_ms() + timeout_ms;
	while (sb->client.setup_state != CAP_SETUP_DONE) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			return dead(sb, err, ETIMEDOUT, "the guest agent did not finish mounting its disks in time");
		int r = step(sb, (int)left, err);
		if (r < 0)
			return r;
	}
	if (sb->client.setup_errno)
		return cap_err_set(err, sb->client.setup_errno, "the guest could not mount its disks: %s",
				   sb->client.setup_msg);
	return 0;
}

int cap_sandbox_attach(const char *control, struct cap_sandbox **out,
		       struct cap_err *err)
{
	int fd = cap_unix_connect(control, SOCK_NONBLOCK, 0);
	if (fd == -ENAMETOOLONG)
		return cap_err_set(err, ENAMETOOLONG, "control socket path %s is too long", control);
	if (fd < 0)
		return cap_err_set(err, -fd, "cannot connect to the sandbox at %s: %s", control, strerror(-fd));
	struct cap_sandbox *sb = sb_new();
	sb->fd = fd;
	int r = wait_hello(sb, 10000, err);
	if (r < 0) {
		cap_sandbox_free(sb);
		return r;
	}
	*out = sb;
	return 0;
}

/* A message made one line (QEMU's words span several). */
static void one_line(char *s)
{
	for (; *s; s++)
		if (*s == '\n')
			*s = ';';
}

/* Whether the template's failure, as the boot note gives it on one line,
 * already says what the cold boot's error says: then it is not repeated. */
static bool same_cause(const char *note, const char *msg)
{
	char flat[sizeof(((struct cap_err *)0)->msg)];
	snprintf(flat, sizeof(flat), "%s", msg);
	one_line(flat);
	return *flat && strstr(note, flat) != NULL;
}

/* A fresh channel for the next start_vm (a failed one's is spent). */
static void client_reset(struct cap_sandbox *sb)
{
	cap_client_fini(&sb->client);
	cap_client_init(&sb->client);
	if (sb->keep)
		cap_client_keep(&sb->client);
}

/* Start QEMU with cfg and wait for the agent's HELLO; with setup, send it
 * right behind our HELLO (one round trip fewer) and wait for it too. On
 * failure the VM is gone and sb can start again. */
static int start_vm(struct cap_sandbox *sb, const struct cap_vm_config *cfg,
		    const struct cap_setup *setup, int timeout_ms, struct cap_err *err)
{
	int r;
	if (setup && (r = queue_setup(sb, setup, err)) < 0)
		return r;
	struct cap_vm_config c = *cfg;
	c.times = &sb->vm_times;
	if ((r = cap_vm_start(&c, &sb->vm, err)) < 0) {
		cap_err_prefix(err, "starting the VM");
		client_reset(sb);
		return r;
	}
	sb->fd = cap_vm_agent_fd(sb->vm);
	if ((r = cap_set_nonblock(sb->fd, 1)) < 0)
		r = cap_err_set(err, -r, "agent socket: %s", strerror(-r));
	else if ((r = wait_hello(sb, timeout_ms, err)) < 0)
		cap_err_prefix(err, "booting the VM");
	else if (setup)
		r = wait_setup(sb, 30000, err);
	sb->ready_ns = cap_now_ns();
	if (r < 0) {
		cap_vm_free(sb->vm);
		sb->vm = NULL;
		sb->fd = -1;
		sb->dead = false;
		client_reset(sb);
	}
	return r;
}

/* Resolve what a VM for o needs (engine, accelerator, kernel, initramfs)
 * into cfg; *kernel and *initrd are new strings cfg points into. */
static int prepare(const struct cap_sandbox_opts *o, struct cap_vm_config *cfg,
		   struct cap_accel_choice *accel, char **kernel, char **initrd,
		   struct cap_err *err)
{
	_cleanup_free_ char *agent = NULL;
	bool have_kernel, have_agent;
	int r;

	if (o->cpus < 1 || o->cpus > 64)
		return cap_err_set(err, EINVAL, "--cpus %u is out of range (1 to 64)", o->cpus);
	if (o->memory_mib < 64 || o->memory_mib > 65536)
		return cap_err_set(err, EINVAL, "--memory %u MiB is out of range (64 to 65536)", o->memory_mib);
	const struct cap_engine_ops *engine;
	if ((r = cap_engine_get(NULL, &engine, err)) < 0 ||
	    (r = cap_engine_accel_choose(o->accel, accel, err)) < 0)
		return r;
	*kernel = cap_store_kernel_path(&have_kernel);
	if (!have_kernel)
		return cap_err_set(err, ENOENT, "the guest kernel %s is missing: build it once with `capsule prepare` (or `make kernel` in a source tree; about 3 to 6 minutes)", *kernel);
	agent = cap_store_agent_path(&have_agent);
	if (!have_agent)
		return cap_err_set(err, ENOENT, "the guest agent %s is missing: build it with `make` (or set CAPSULE_AGENT)", agent);
	if ((r = cap_store_initramfs(agent, CAP_BUSYBOX, initrd, NULL, err)) < 0)
		return r;
	*cfg = (struct cap_vm_config){
		.kernel = *kernel,
		.initrd = *initrd,
		.disks = o->spec ? o->spec->disks : NULL,
		.ndisks = o->spec ? o->spec->ndisks : 0,
		.console_log = o->console_log,
		.cpus = o->cpus,
		.memory_mib = o->memory_mib,
		.accel = accel->accel,
		.append_extra = o->spec && o->spec->append[0] ? o->spec->append : NULL,
		/* Nothing connects to QEMU's sockets later, and files of a
		 * killed process would be left behind: unlink them at once. */
		.unlink_sockets = true,
		.engine = engine,
	};
	return 0;
}

/* Boot cfg, wait for HELLO, save the device state to state, stop. */
static int snapshot(const struct cap_vm_config *cfg, int timeout_ms, const char *state,
		    struct cap_err *err)
{
	struct cap_sandbox *sb = sb_new();
	int r = start_vm(sb, cfg, NULL, timeout_ms, err);
	if (r == 0)
		r = cap_vm_save(sb->vm, state, err);
	cap_sandbox_free(sb);
	return r;
}

/* Build key's template: boot base once with placeholders for its
 * per-sandbox disks and save it into a staging directory of the cache,
 * stored under key when complete (*dir, a new string). */
static int template_build(const struct cap_sandbox_opts *o, const struct cap_vm_config *base,
			  const char *key, char **dir, struct cap_err *err)
{
	_cleanup_free_ char *tmp = NULL, *rundir = NULL;
	_cleanup_free_ char *ram = NULL, *state = NULL, *console = NULL;
	struct cap_vm_disk disks[16];
	char *names[16] = { 0 };
	int r;

	if (base->ndisks > CAP_ARRAY_SIZE(disks))
		return cap_err_set(err, E2BIG, "too many disks for a template");
	if ((r = cap_template_stage(base->memory_mib, &tmp, err)) < 0)
		return r;
	ram = xasprintf("%s/ram", tmp);
	state = xasprintf("%s/state", tmp);
	console = xasprintf("%s/console.log", tmp);
	for (unsigned i = 0; i < base->ndisks; i++) {
		disks[i] = base->disks[i];
		if (!disks[i].per_sandbox)
			continue;
		if ((r = cap_template_placeholder(tmp, i, &names[i], err)) < 0)
			goto fail;
		disks[i].path = names[i];
	}
	if ((r = cap_make_run_dir(&rundir, err)) < 0)
		goto fail;
	struct cap_vm_config cfg = *base;
	cfg.disks = disks;
	cfg.dir = rundir;
	cfg.console_log = console;
	cfg.ram_file = ram;
	cfg.unlink_sockets = true;
	r = snapshot(&cfg, o->boot_timeout_ms, state, err);
	cap_remove_run_dir(rundir);
	if (r < 0) {
		cap_err_prefix(err, "building template %.16s", key);
		goto fail;
	}
	for (unsigned i = 0; i < base->ndisks; i++)
		if (names[i])
			unlink(names[i]);

	char desc[512];
	size_t used = (size_t)snprintf(desc, sizeof(desc), "%u vCPU, %u MiB, %s", cfg.cpus, cfg.memory_mib,
				       cap_engine_accel_name(cfg.accel));
	for (unsigned i = 0; i < base->ndisks && used < sizeof(desc); i++)
		used += (size_t)snprintf(desc + used, sizeof(desc) - used, ", %s%s", base->disks[i].serial,
					 base->disks[i].per_sandbox ? "" : " (shared)");
	if (base->net && used < sizeof(desc))
		snprintf(desc + used, sizeof(desc) - used, ", NIC");
	r = cap_template_store(tmp, key, desc, base, dir, err);
	goto out;
fail:
	cap_template_discard(tmp);
out:
	for (unsigned i = 0; i < CAP_ARRAY_SIZE(names); i++)
		free(names[i]);
	return r;
}

/* The template for cfg, built now if the cache has none: its key (made
 * here unless key holds it already) and directory (*dir a new string). */
static int template_for(const struct cap_sandbox_opts *o, const struct cap_vm_config *cfg,
			char key[65], char **dir, struct cap_err *err)
{
	if (!*key)
		cap_template_key(o, cfg, key);
	char *found = cap_template_lookup(key);
	if (found) {
		*dir = found;
		return 0;
	}
	return template_build(o, cfg, key, dir, err);
}

int cap_template_ensure(const struct cap_sandbox_opts *o, char *key_out,
			struct cap_err *err)
{
	struct cap_vm_config cfg;
	struct cap_accel_choice accel;
	_cleanup_free_ char *kernel = NULL, *initrd = NULL, *dir = NULL;
	int r = prepare(o, &cfg, &accel, &kernel, &initrd, err);
	if (r < 0)
		return r;
	*key_out = '\0';
	/* As cap_sandbox_boot builds one: a shape with a NIC gets the
	 * template's NIC, else its restores would not match. */
	if (o->spec && o->spec->net.enabled)
		cfg.net = cap_sandbox_net_template();
	return template_for(o, &cfg, key_out, &dir, err);
}

/* Restore rc from the template in tdir: its RAM shared through the
 * template's holder when there is one to be had (why says why not), else
 * copied; a restore that fails with the shared RAM is tried once more
 * with a copy. */
static int restore(struct cap_sandbox *sb, struct cap_vm_config *rc, const char *tdir,
		   const struct cap_setup *setup, int timeout_ms, char *why, size_t len,
		   struct cap_err *err)
{
	struct cap_err herr = { 0 };
	int conn = -1, mfd = -1;
	if (!cap_ramhold_enabled())
		snprintf(why, len, "CAPSULE_SHARED_RAM=0");
	else if (cap_engine_wants_ram_fd(rc->engine) && (mfd = cap_ramhold_get(tdir, &conn, &herr)) < 0)
		snprintf(why, len, "%.290s", herr.msg);
	rc->restore_ram_fd = mfd;
	int r = start_vm(sb, rc, setup, timeout_ms, err);
	if (mfd >= 0)
		close(mfd);	/* QEMU has its own */
	if (r == 0 && mfd >= 0) {
		sb->ram_conn = conn;
		return 0;
	}
	if (conn >= 0)
		close(conn);
	if (r == 0 || mfd < 0)
		return r;
	snprintf(why, len, "the restore from the shared RAM failed: %.250s", err->msg);
	one_line(why);
	cap_log(CAP_LOG_WARN, "template %s: %s; trying a copy of its RAM", tdir, why);
	*err = (struct cap_err){ 0 };
	rc->restore_ram_fd = -1;
	return start_vm(sb, rc, setup, timeout_ms, err);
}

/* Restore cfg from dir (a template's or a snapshot's: state, ram) with
 * setup; on success the boot note is "WHAT (how its RAM came)". */
static int restore_from(struct cap_sandbox *sb, const struct cap_vm_config *cfg, const char *dir,
			const struct cap_setup *setup, int timeout_ms, const char *what, struct cap_err *err)
{
	_cleanup_free_ char *state = xasprintf("%s/state", dir);
	_cleanup_free_ char *ram = xasprintf("%s/ram", dir);
	struct cap_vm_config rc = *cfg;
	rc.restore_state = state;
	rc.restore_ram = ram;
	char why[300] = "";
	int r = restore(sb, &rc, dir, setup, timeout_ms, why, sizeof(why), err);
	if (r < 0)
		return r;
	sb->restored = true;
	const char *how = cap_vm_ram_note(sb->vm);
	bool copied = strcmp(how, "RAM copied") == 0;
	snprintf(sb->boot_note, sizeof(sb->boot_note), "%.250s (%s%s%.300s)", what, how, *why && copied ? ": " : "",
		 copied ? why : "");
	return 0;
}

/* The phases of the start that began at t0 and just ended, from the
 * last (successful) start_vm's steps. */
static void set_times(struct cap_sandbox *sb, int64_t t0)
{
	const struct cap_vm_times *v = &sb->vm_times;
	int64_t now = cap_now_ns(), booted = v->restored ? v->restored : v->monitor;
	sb->times = (struct cap_sandbox_times){
		.total = (now - t0) / 1000,
		.prepare = (v->start - t0) / 1000,
		.jail = (v->spawned - v->start) / 1000,
		.qemu = (v->monitor - v->spawned) / 1000,
		.restore = v->restored ? (v->restored - v->monitor) / 1000 : 0,
		.agent = (sb->ready_ns - booted) / 1000,
	};
}

const struct cap_sandbox_times *cap_sandbox_times(const struct cap_sandbox *sb)
{
	return &sb->times;
}

static bool templates_enabled(const struct cap_sandbox_opts *o)
{
	const char *env = getenv("CAPSULE_TEMPLATES");
	/* A pod's NIC cold-boots (docs/architecture.md, "A pod's network"). */
	if (o->spec && o->spec->has_pod)
		return false;
	return o->use_template && !(env && strcmp(env, "0") == 0);
}

/* A pod's NIC: the tap in its namespace, for every QEMU this boot tries. */
static int pod_up(struct cap_sandbox *sb, const struct cap_sandbox_spec *spec, struct cap_vm_config *cfg,
		  struct cap_err *err)
{
	sb->pod_ns = open(spec->pod_netns, O_RDONLY | O_CLOEXEC);
	if (sb->pod_ns < 0)
		return cap_err_set(err, errno, "the pod's network namespace %s: %s", spec->pod_netns, strerror(errno));
	int r = cap_pod_net_tap(sb->pod_ns, &spec->pod, &sb->tap_fd, err);
	if (r < 0) {
		cap_err_prefix(err, "the pod's network namespace %s", spec->pod_netns);
		return r;
	}
	sb->pod = spec->pod;
	sb->tap.fd = sb->tap_fd;
	memcpy(sb->tap.mac, spec->pod.mac, 6);
	cfg->tap = &sb->tap;
	return 0;
}

/* Whether two SETUPs make the same guest, their clock and entropy
 * aside: their encodings are the same. */
static bool setup_same(const struct cap_setup *a, const struct cap_setup *b)
{
	struct cap_setup x = *a, y = *b;
	x.realtime_ns = y.realtime_ns = 0;
	memset(x.seed, 0, sizeof(x.seed));
	memset(y.seed, 0, sizeof(y.seed));
	struct cap_buf bx, by;
	cap_buf_init(&bx);
	cap_buf_init(&by);
	bool same = cap_proto_setup_encode(&bx, &x) == 0 && cap_proto_setup_encode(&by, &y) == 0 &&
		    cap_buf_used(&bx) == cap_buf_used(&by) && memcmp(cap_buf_head(&bx), cap_buf_head(&by), cap_buf_used(&bx)) == 0;
	cap_buf_fini(&bx);
	cap_buf_fini(&by);
	return same;
}

/* Whether o may take a spare of `capsule spares`: it asks for one, and
 * for the shape spares have (no disk, no NIC, nothing SETUP would make
 * differ from a bare VM's, no log of its own, a template restore). */
static bool spare_shape(const struct cap_sandbox_opts *o)
{
	const char *env = getenv("CAPSULE_SPARES");
	if (!o->use_spare || (env && strcmp(env, "0") == 0) || !templates_enabled(o) || o->resume_dir ||
	    o->console_log || o->vmm_log || o->dir)
		return false;
	if (!o->spec)
		return true;
	const struct cap_sandbox_spec *s = o->spec;
	if (s->ndisks || s->net.enabled || s->has_pod || s->append[0])
		return false;
	struct cap_sandbox_spec bare;
	cap_sandbox_spec_init(&bare);
	return setup_same(&s->setup, &bare.setup);
}

/* sb becomes the spare g describes: its agent channel agent, already
 * past HELLO and SETUP, and the holder's connection conn. The guest
 * takes the host's clock before the first command: it may have waited
 * long. Its entropy is its own already (SETUP's, at its restore). */
static void adopt_spare(struct cap_sandbox *sb, const struct cap_spare_given *g, int agent, int conn)
{
	sb->fd = agent;
	cap_set_nonblock(agent, 1);
	sb->spare_conn = conn;
	sb->spare_vmm_pid = g->vmm_pid;
	snprintf(sb->spare_jail_note, sizeof(sb->spare_jail_note), "%s", g->jail_note);
	memcpy(sb->template_key, g->key, sizeof(sb->template_key));
	cap_client_adopt(&sb->client, g->version, g->agent_version, g->next_id);
	sb->accel = g->accel;
	sb->restored = true;
	snprintf(sb->boot_note, sizeof(sb->boot_note), "a spare of `capsule spares` (pid %d): VM pid %d, %.500s, warmed",
		 (int)g->holder_pid, (int)g->vmm_pid, g->boot_note);
	cap_client_clock(&sb->client);
}

void cap_sandbox_spare_fill(const struct cap_sandbox *sb, struct cap_spare_given *g)
{
	memset(g, 0, sizeof(*g));
	memcpy(g->key, sb->template_key, sizeof(g->key));
	g->version = sb->client.version;
	g->next_id = sb->client.next_id;
	snprintf(g->agent_version, sizeof(g->agent_version), "%s", sb->client.agent_version);
	g->accel = sb->accel;
	snprintf(g->boot_note, sizeof(g->boot_note), "%s", sb->boot_note);
	snprintf(g->jail_note, sizeof(g->jail_note), "%s", cap_sandbox_jail_note(sb));
	g->vmm_pid = (int32_t)cap_sandbox_vmm_pid(sb);
}

int cap_sandbox_agent_channel(const struct cap_sandbox *sb)
{
	return sb->fd;
}

int cap_sandbox_boot(const struct cap_sandbox_opts *o, struct cap_sandbox **out,
		     struct cap_err *err)
{
	struct cap_sandbox *sb = sb_new();
	_cleanup_free_ char *kernel = NULL, *initrd = NULL;
	struct cap_vm_config cfg;
	int64_t t0 = cap_now_ns();
	int r;
	/* Kept as it was before sb_new, on purpose and for now: during
	 * the boot of a VM with a NIC, pfd[2] polls descriptor 0 (a shim's
	 * /dev/null, always readable), so the boot's waits never block in
	 * poll. With -1 here, `capsule start` of a sandbox with a policy
	 * hangs under nested KVM (tests/kvm/check-net.sh check 4, twice in
	 * a row; it passes with this line). The wake-up that this stands
	 * in for is not found yet. */
	sb->cred_fd = 0;

	if ((r = prepare(o, &cfg, &sb->accel, &kernel, &initrd, err)) < 0)
		goto fail;
	char spare_note[400] = "";
	char key[65] = "";	/* the template's, once made (by the spare's ask or template_for) */
	if (spare_shape(o)) {
		/* A spare of `capsule spares`, when one of this template is
		 * ready; else what follows, and the boot note says why not.
		 * Its shape has no NIC: the key is the template's below. */
		struct cap_spare_given *g = xmalloc(sizeof(*g));
		struct cap_err serr = { 0 };
		int afd, conn;
		int64_t t1 = cap_now_ns();
		cap_template_key(o, &cfg, key);
		int sr = cap_spare_take(key, g, &afd, &conn, &serr);
		if (sr == 0) {
			adopt_spare(sb, g, afd, conn);
			free(g);
			int64_t now = cap_now_ns();
			sb->times = (struct cap_sandbox_times){ .total = (now - t0) / 1000, .prepare = (t1 - t0) / 1000,
								.spare = (now - t1) / 1000 };
			*out = sb;
			return 0;
		}
		free(g);
		if (sr != -ENOENT) {
			one_line(serr.msg);
			snprintf(spare_note, sizeof(spare_note), "no spare: %.380s", serr.msg);
		}
	}
	if (o->spec && o->spec->has_pod && (r = pod_up(sb, o->spec, &cfg, err)) < 0)
		goto fail;
	if (!o->dir && (r = cap_make_run_dir(&sb->owned_run_dir, err)) < 0)
		goto fail;
	cfg.dir = o->dir ? o->dir : sb->owned_run_dir;
	/* Not in the template's configuration: the VM that builds one logs
	 * in its own run directory, never in a sandbox's file. */
	struct cap_vm_config tcfg = cfg;
	cfg.vmm_log = o->vmm_log;
	if (o->spec && o->spec->net.enabled) {
		if ((r = cap_sandbox_net_new(o, &sb->net, err)) < 0)
			goto fail;
		cfg.net = cap_sandbox_net_vm(sb->net);
		tcfg.net = cap_sandbox_net_template();
	}

	/* Always SETUP, if only for the clock and the entropy. */
	struct cap_sandbox_spec bare;
	cap_sandbox_spec_init(&bare);
	const struct cap_setup *setup = o->spec ? &o->spec->setup : &bare.setup;
	/* The spec is borrowed: this start's SETUP is a copy, with the
	 * secrets' CA and placeholders (never in a template, which is made
	 * without SETUP; SETUP reaches a VM after its restore). */
	struct cap_setup full = *setup;
	char *env[CAP_SETUP_MAX_ENV];
	if (sb->net && (r = cap_sandbox_net_setup(sb->net, &full, env, err)) < 0)
		goto fail;
	setup = &full;
	snprintf(sb->boot_note, sizeof(sb->boot_note), "cold boot");
	char snap_note[600] = "";
	if (o->resume_dir) {
		/* A snapshot: its guest goes on, re-identified. Should it not
		 * restore, the sandbox's disks boot: what ran is lost, never
		 * what they hold. */
		struct cap_err serr = { 0 };
		struct cap_setup forked = *setup;
		forked.forked = true;
		_cleanup_free_ char *what = xasprintf("resumed from snapshot %.200s", o->resume_dir);
		sb->keep = true;
		client_reset(sb);
		if (restore_from(sb, &cfg, o->resume_dir, &forked, o->boot_timeout_ms, what, &serr) < 0) {
			one_line(serr.msg);
			snprintf(snap_note, sizeof(snap_note), "snapshot %.200s did not restore, what ran in it is not kept: %.300s",
				 o->resume_dir, serr.msg);
			sb->keep = false;
			client_reset(sb);
		}
	}
	if (!sb->restored && templates_enabled(o)) {
		/* A template restore, and whatever goes wrong with it, a cold
		 * boot: never worse than booting. */
		struct cap_err terr = { 0 };
		_cleanup_free_ char *tdir = NULL;
		bool removed = false;
		if (template_for(o, &tcfg, key, &tdir, &terr) == 0) {
			memcpy(sb->template_key, key, sizeof(key));
			char what[48];
			snprintf(what, sizeof(what), "restored from template %.16s", key);
			if (restore_from(sb, &cfg, tdir, setup, o->boot_timeout_ms, what, &terr) < 0) {
				/* Its state did not load, or the guest did not
				 * come back: rebuilt on next use. */
				cap_template_discard(tdir);
				removed = true;
				sb->template_key[0] = '\0';
			}
		}
		if (!sb->restored) {
			one_line(terr.msg);	/* whatever QEMU said */
			snprintf(sb->boot_note, sizeof(sb->boot_note), "cold boot (template %.16s unusable%s: %.380s)",
				 *key ? key : "-", removed ? ", removed and built again at the next start" : "", terr.msg);
		}
	}
	if (!sb->restored && (r = start_vm(sb, &cfg, setup, o->boot_timeout_ms, err)) < 0) {
		/* Whatever stopped the template too, never lost. */
		if (err && strncmp(sb->boot_note, "cold boot (", 11) == 0 && !same_cause(sb->boot_note, err->msg)) {
			size_t used = strlen(err->msg);
			snprintf(err->msg + used, sizeof(err->msg) - used, "\n(before it: %s)", sb->boot_note);
		}
		goto fail;
	}
	if (*snap_note) {
		char note[sizeof(sb->boot_note)];
		snprintf(note, sizeof(note), "%.100s; %s", sb->boot_note, snap_note);
		memcpy(sb->boot_note, note, sizeof(note));
	}
	if (*spare_note) {
		char note[sizeof(sb->boot_note)];
		snprintf(note, sizeof(note), "%.300s; %s", sb->boot_note, spare_note);
		memcpy(sb->boot_note, note, sizeof(note));
	}
	if (sb->net) {
		cap_sandbox_net_started(sb->net);
		sb->cred_fd = cap_sandbox_net_watch_fd(sb->net);
		if ((r = write_creds(sb, true, err)) < 0)
			goto fail;
	}
	set_times(sb, t0);
	*out = sb;
	return 0;

fail:
	cap_sandbox_free(sb);
	return r;
}

int cap_sandbox_snapshot(struct cap_sandbox *sb, const struct cap_sandbox_spec *spec, const char *dir,
			 struct cap_err *err)
{
	if (!sb->vm)
		return cap_err_set(err, EINVAL, "only the owner of a VM can save it");
	_cleanup_free_ char *full = xasprintf("%s/full", dir);
	int r = cap_vm_save_full(sb->vm, full, err);
	if (r < 0) {
		cap_err_prefix(err, "saving the VM");
		return r;
	}
	/* QEMU flushed every disk as it stopped the guest: the copies are
	 * the disks at the instant of the RAM's. */
	for (unsigned i = 0; i < spec->ndisks; i++) {
		const struct cap_vm_disk *d = &spec->disks[i];
		const char *file = cap_snapshot_disk_file(d->serial);
		if (!d->per_sandbox || !file)
			continue;
		_cleanup_free_ char *to = xasprintf("%s/%s", dir, file);
		/* A read-only one (/source's image, only ever replaced by a
		 * rename) is linked. */
		if (d->readonly && link(d->path, to) == 0)
			continue;
		if ((r = cap_snapshot_copy_disk(d->path, d->backing != NULL, to, err)) < 0)
			return r;
	}
	return 0;
}

int cap_sandbox_seal(const struct cap_sandbox_opts *o, const char *dir, struct cap_err *err)
{
	struct cap_vm_config cfg;
	struct cap_accel_choice accel;
	_cleanup_free_ char *kernel = NULL, *initrd = NULL, *rundir = NULL;
	_cleanup_free_ char *full = xasprintf("%s/full", dir);
	_cleanup_free_ char *ram = xasprintf("%s/ram", dir);
	_cleanup_free_ char *state = xasprintf("%s/state", dir);
	_cleanup_free_ char *console = xasprintf("%s/seal-console.log", dir);
	struct cap_vm *vm = NULL;
	int r;

	if ((r = prepare(o, &cfg, &accel, &kernel, &initrd, err)) < 0 ||
	    (r = cap_make_run_dir(&rundir, err)) < 0)
		return r;
	/* The same devices as the VM saved: a NIC (the template's, nothing
	 * gets out: this VM never runs) when it had one. */
	if (o->spec && o->spec->net.enabled)
		cfg.net = cap_sandbox_net_template();
	cfg.dir = rundir;
	cfg.console_log = console;
	cfg.ram_file = ram;
	cfg.restore_state = full;
	cfg.restore_full = true;
	cfg.restore_ram_fd = -1;
	int fd = open(ram, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)cfg.memory_mib << 20) < 0) {
		r = cap_err_set(err, errno, "cannot make %s: %s", ram, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	close(fd);
	if ((r = cap_vm_start(&cfg, &vm, err)) < 0 || (r = cap_vm_save(vm, state, err)) < 0)
		cap_err_prefix(err, "sealing the snapshot in %s", dir);
	cap_vm_free(vm);
	if (r == 0)
		unlink(full);
	unlink(console);
out:
	cap_remove_run_dir(rundir);
	return r;
}

const char *cap_sandbox_boot_note(const struct cap_sandbox *sb)
{
	return sb->boot_note;
}

const char *cap_sandbox_jail_note(const struct cap_sandbox *sb)
{
	return sb->vm ? cap_vm_jail_note(sb->vm) : sb->spare_conn >= 0 ? sb->spare_jail_note : "";
}

int cap_sandbox_set_network(struct cap_sandbox *sb, const struct cap_net_policy *p,
			    struct cap_err *err)
{
	if (!sb->vm)
		return cap_err_set(err, EINVAL, "only the owner of a VM can change its network policy");
	if (!sb->net)
		return cap_err_set(err, EOPNOTSUPP, "the VM was started without a network interface: the new policy takes effect at its next start");
	return cap_sandbox_net_set_policy(sb->net, sb->vm, p, err);
}

pid_t cap_sandbox_net_pid(const struct cap_sandbox *sb)
{
	return sb->vm ? cap_vm_net_pid(sb->vm) : -1;
}

bool cap_sandbox_take_listeners(struct cap_sandbox *sb, const uint16_t **ports, uint32_t *n)
{
	if (sb->net || !sb->client.listeners_changed)
		return false;
	sb->client.listeners_changed = false;
	*ports = sb->client.listeners;
	*n = sb->client.nlisteners;
	return true;
}

int cap_sandbox_pod_netns(const struct cap_sandbox *sb)
{
	return sb->vm ? sb->pod_ns : -1;
}

int cap_sandbox_connect(struct cap_sandbox *sb, uint16_t port, const struct cap_exec_events *ev,
			void *ud, uint32_t *id, struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has stopped");
	return cap_client_connect(&sb->client, port, ev, ud, id, err);
}

bool cap_sandbox_restored(const struct cap_sandbox *sb)
{
	return sb->restored;
}

int cap_sandbox_exec(struct cap_sandbox *sb, const struct cap_exec_req *req,
		     const struct cap_exec_events *ev, void *ud, uint32_t *id,
		     struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has stopped");
	return cap_client_exec(&sb->client, req, ev, ud, id, err);
}

int cap_sandbox_file(struct cap_sandbox *sb, const struct cap_file_req *req,
		     uint32_t cap, const struct cap_exec_events *ev, void *ud,
		     uint32_t *id, struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has stopped");
	return cap_client_file(&sb->client, req, cap, ev, ud, id, err);
}

int cap_sandbox_update(struct cap_sandbox *sb, const struct cap_update *u,
		       const struct cap_exec_events *ev, void *ud, uint32_t *id,
		       struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has stopped");
	return cap_client_update(&sb->client, u, ev, ud, id, err);
}

int cap_sandbox_stats(struct cap_sandbox *sb, const char *name,
		      const struct cap_exec_events *ev, void *ud, uint32_t *id,
		      struct cap_err *err)
{
	if (sb->dead)
		return cap_err_set(err, EPIPE, "the VM has stopped");
	return cap_client_stats(&sb->client, name, ev, ud, id, err);
}

/* One UPDATE or STATS waited for: its output and end. */
struct ctl_wait {
	struct cap_buf out, errtext;
	bool done;
	struct cap_exit ex;
	int errnum;
	char msg[256];
};

static void ctl_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct ctl_wait *w = ud;
	(void)id;
	cap_buf_append(fd == 1 ? &w->out : &w->errtext, p, n);
}

static void ctl_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	struct ctl_wait *w = ud;
	(void)id;
	w->done = true;
	if (ex)
		w->ex = *ex;
	else {
		w->errnum = errnum;
		snprintf(w->msg, sizeof(w->msg), "%s", msg ? msg : strerror(errnum));
	}
}

static const struct cap_exec_events ctl_events = { ctl_output, ctl_done, NULL };

/* Drive sb until w is done: 0, or -errno with err set (the guest's
 * refusal: its STDERR line). */
static int ctl_pump(struct cap_sandbox *sb, struct ctl_wait *w, const char *what, int timeout_ms,
		    struct cap_err *err)
{
	int64_t until = cap_now_ms() + timeout_ms;
	while (!w->done) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		int64_t left = until - cap_now_ms();
		if (left <= 0)
			return cap_err_set(err, ETIMEDOUT, "%s: the VM did not answer within %d ms", what, timeout_ms);
		cap_sandbox_pollfds(sb, pfd);
		if (poll(pfd, CAP_SANDBOX_NPOLL, (int)CAP_MIN(left, 1000)) < 0 && errno != EINTR)
			return cap_err_set(err, errno, "poll: %s", strerror(errno));
		int r = cap_sandbox_dispatch(sb, pfd, err);
		if (r < 0)
			return r;
	}
	if (w->errnum)
		return cap_err_set(err, w->errnum, "%s: %s", what, w->msg);
	if (w->ex.kind != CAP_EXIT_CODE || w->ex.value != 0) {
		_cleanup_free_ char *text = xstrndup((const char *)cap_buf_head(&w->errtext),
						     CAP_MIN(cap_buf_used(&w->errtext), (size_t)400));
		text[strcspn(text, "\n")] = '\0';
		for (char *c = text; *c; c++)
			if ((unsigned char)*c < 0x20 || *c == 0x7f)
				*c = '?';
		const char *t = strncmp(text, "capsule: ", 9) == 0 ? text + 9 : text;
		int e = w->ex.kind == CAP_EXIT_START_FAILED ? w->ex.value : EIO;
		return cap_err_set(err, e, "%s: %s", what, *t ? t : "the guest refused it");
	}
	return 0;
}

int cap_sandbox_update_wait(struct cap_sandbox *sb, const struct cap_update *u, int timeout_ms,
			    struct cap_err *err)
{
	struct ctl_wait w;
	memset(&w, 0, sizeof(w));
	cap_buf_init(&w.out);
	cap_buf_init(&w.errtext);
	uint32_t id;
	_cleanup_free_ char *what = xasprintf("%s of container %s in the VM",
					     u->op == CAP_UPDATE_REMOVE ? "removal" : "update", u->name);
	int r = cap_sandbox_update(sb, u, &ctl_events, &w, &id, err);
	if (r == 0)
		r = ctl_pump(sb, &w, what, timeout_ms, err);
	cap_buf_fini(&w.out);
	cap_buf_fini(&w.errtext);
	return r;
}

int cap_sandbox_stats_wait(struct cap_sandbox *sb, const char *name, struct cap_stats *stats,
			   int timeout_ms, struct cap_err *err)
{
	struct ctl_wait w;
	memset(&w, 0, sizeof(w));
	cap_buf_init(&w.out);
	cap_buf_init(&w.errtext);
	uint32_t id;
	_cleanup_free_ char *what = *name ? xasprintf("the stats of container %s", name)
					  : xstrdup("the stats of the VM");
	int r = cap_sandbox_stats(sb, name, &ctl_events, &w, &id, err);
	if (r == 0)
		r = ctl_pump(sb, &w, what, timeout_ms, err);
	if (r == 0 && cap_proto_stats_decode(cap_buf_head(&w.out), cap_buf_used(&w.out), stats) < 0)
		r = cap_err_set(err, EBADMSG, "%s: the guest sent a malformed record (%zu bytes)", what,
				cap_buf_used(&w.out));
	cap_buf_fini(&w.out);
	cap_buf_fini(&w.errtext);
	return r;
}

int cap_sandbox_stdin(struct cap_sandbox *sb, uint32_t id, const void *p,
		      size_t n)
{
	return cap_client_stdin(&sb->client, id, p, n);
}

int cap_sandbox_signal(struct cap_sandbox *sb, uint32_t id, int sig)
{
	return cap_client_signal(&sb->client, id, sig);
}

int cap_sandbox_signal_scope(struct cap_sandbox *sb, uint32_t id, int sig,
			     enum cap_signal_scope scope)
{
	return cap_client_signal_scope(&sb->client, id, sig, scope);
}

int cap_sandbox_resize(struct cap_sandbox *sb, uint32_t id, uint16_t rows,
		       uint16_t cols)
{
	return cap_client_resize(&sb->client, id, rows, cols);
}

struct warm_wait {
	bool done;
	int errnum;
	char msg[256];
};

static void warm_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	(void)ud, (void)id, (void)fd, (void)p, (void)n;
}

static void warm_done(void *ud, uint32_t id, const struct cap_exit *ex, int errnum, const char *msg)
{
	(void)id;
	struct warm_wait *w = ud;
	w->done = true;
	w->errnum = ex ? 0 : errnum ? errnum : EIO;
	snprintf(w->msg, sizeof(w->msg), "%s", msg ? msg : "");
}

/* Run `true` once and wait for it (sandbox-internal.h). */
int cap_sandbox_warm(struct cap_sandbox *sb, struct cap_err *err)
{
	static const struct cap_exec_events ev = { warm_output, warm_done, NULL };
	char *argv[] = { "true", NULL };
	struct cap_exec_req req = { .argv = argv, .argc = 1, .timeout_ms = 60000, .flags = CAP_EXEC_NO_SYNC };
	struct warm_wait w = { 0 };
	uint32_t id;
	int r;
	if ((r = cap_sandbox_exec(sb, &req, &ev, &w, &id, err)) == 0 &&
	    (r = cap_sandbox_wait(sb, 60000, err)) == 0 && !w.done)
		r = cap_err_set(err, EIO, "`true` never ended");
	if (r >= 0 && w.errnum)
		r = cap_err_set(err, w.errnum, "`true` did not run: %s", w.msg);
	return r < 0 ? r : 0;
}

/* Attached: ask the shim to stop its VM and wait for it to say so. */
static int shutdown_attached(struct cap_sandbox *sb, int grace_ms,
			     struct cap_err *err)
{
	cap_client_shutdown(&sb->client);
	int64_t end = cap_now_ms() + grace_ms + 5000;
	struct cap_err ignored;
	while (!sb->client.shutdown_acked && !sb->dead) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			return cap_err_set(err, ETIMEDOUT, "the sandbox did not confirm that it stopped within %d ms", grace_ms + 5000);
		if (step(sb, (int)left, &ignored) < 0)
			break;
	}
	sb->dead = true;
	return 0;
}

int cap_sandbox_shutdown(struct cap_sandbox *sb, int grace_ms,
			 struct cap_err *err)
{
	if (!sb->vm)
		return shutdown_attached(sb, grace_ms, err);
	if (sb->dead || cap_vm_wait(sb->vm, 0)) {
		sb->dead = true;
		return 0;
	}
	cap_client_shutdown(&sb->client);
	int64_t end = cap_now_ms() + grace_ms;
	struct cap_err ignored;
	while (!cap_vm_wait(sb->vm, 0)) {
		int64_t left = end - cap_now_ms();
		if (left <= 0)
			break;
		/* Errors here mean the VM went away, which is the goal. */
		if (step(sb, (int)left, &ignored) < 0)
			cap_vm_wait(sb->vm, (int)CAP_MAX(left, 0));
	}
	bool acked = sb->client.shutdown_acked;
	sb->dead = true;
	if (cap_vm_wait(sb->vm, 0) && acked)
		return 0;
	if (!cap_vm_wait(sb->vm, 0)) {
		cap_vm_quit(sb->vm);
		if (!cap_vm_wait(sb->vm, 1000))
			cap_vm_kill(sb->vm);
	}
	return cap_err_set(err, ETIMEDOUT, acked ? "the guest synced but did not power off within %d ms; QEMU was stopped"
					       : "the guest did not confirm a clean shutdown within %d ms; QEMU was stopped",
			   grace_ms);
}

void cap_sandbox_free(struct cap_sandbox *sb)
{
	if (!sb)
		return;
	if (sb->vm)
		cap_vm_free(sb->vm);
	else if (sb->fd >= 0)
		close(sb->fd);
	if (sb->ram_conn >= 0)
		close(sb->ram_conn);
	if (sb->spare_conn >= 0)
		close(sb->spare_conn);	/* the holder ends the VM */
	/* The tap goes with its last descriptor (QEMU's is closed), then
	 * the veth's filter. */
	if (sb->tap_fd >= 0)
		close(sb->tap_fd);
	if (sb->pod_ns >= 0) {
		cap_pod_net_untap(sb->pod_ns, &sb->pod);
		close(sb->pod_ns);
	}
	cap_sandbox_net_free(sb->net);
	cap_client_fini(&sb->client);
	if (sb->owned_run_dir)
		cap_remove_run_dir(sb->owned_run_dir);
	free(sb->owned_run_dir);
	free(sb);
}
