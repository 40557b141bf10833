/* QEMU microvm behind the engine interface. */
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <jansson.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "buf.h"
#include "engine-kvm.h"
#include "engine-ops.h"
#include "engine-net.h"
#include "jail.h"
#include "paths.h"
#include "proc.h"
#include "sock.h"
#include "util.h"

#define QEMU "qemu-system-x86_64"
#define CONNECT_TIMEOUT_MS 10000
#define QMP_TIMEOUT_MS 5000
/* Where things are in QEMU's private root (jail.h). */
#define JAIL_KERNEL "/vm/vmlinux"
#define JAIL_INITRD "/vm/initrd"
#define JAIL_RAM "/mem/ram"
/* QEMU's own memory on top of the guest's, for its jail's ceiling: TCG's
 * translation cache (bounded by tb-size), device state, page cache of
 * the disks. */
#define OVERHEAD_MIB 256

struct qemu_vm {
	struct cap_vm base;	/* first: this engine's struct cap_vm * is a struct qemu_vm * (QVM) */
	pid_t pid;
	int pidfd;
	int qmp_fd;
	struct cap_buf qmp_in;	/* bytes of QMP read, not yet a whole line */
	bool qmp_gone;	/* the monitor closed: no more events */
	int agent_fd;
	unsigned io_errors;	/* BLOCK_IO_ERROR events not yet taken */
	struct cap_vm_io_error io_last;	/* the latest of them */
	bool exited;
	int wstatus;
	char exit_reason[128];
	char *owned_dir;
	char *owned_console;
	char *owned_qemu_log;
	bool keep_qemu_log;	/* the caller's file (cfg.vmm_log), not ours */
	char *owned_qmp_path;
	char *owned_agent_path;
	char *owned_ram_path;	/* a template's RAM file being built, or NULL */
	bool ram_shared;	/* a restore mapping cfg.restore_ram_fd privately */
	const char *ram_note;	/* static: cap_vm_ram_note */
	struct cap_jail *jail;
	struct cap_jail_net *net;	/* a VM with a NIC: its namespace and policy process */
	uint16_t *owned_forwards;	/* guest ports QEMU forwards (hostfwd) */
	unsigned nforwards;
	int tap_slot;	/* a pod's NIC: the tap's descriptor slot, -1: none */
};

/* Descriptors QEMU gets, in this order, from 3 up (docs/architecture.md,
 * "The jail": QEMU opens no host path of its own). */
enum { FD_QMP, FD_AGENT, FD_CONSOLE, FD_DISK0 };
#define FD_NUM(i) (3 + (i))

#define QVM(v) ((struct qemu_vm *)(v))
#define CQVM(v) ((const struct qemu_vm *)(v))

static int agent_fd(const struct cap_vm *v) { return CQVM(v)->agent_fd; }
static int event_fd(const struct cap_vm *v) { return CQVM(v)->qmp_gone ? -1 : CQVM(v)->qmp_fd; }
static int exit_fd(const struct cap_vm *v) { return CQVM(v)->pidfd; }
static pid_t pid_of(const struct cap_vm *v) { return CQVM(v)->pid; }
static const char *exit_reason(const struct cap_vm *v) { return CQVM(v)->exit_reason; }
static const char *ram_note(const struct cap_vm *v) { return CQVM(v)->ram_note; }
static bool wants_ram_fd(void) { return cap_jail_would_confine(); }

static void first_line(void *ud, const char *line)
{
	char **out = ud;
	if (!*out)
		*out = xstrdup(line);
}

/* What the guest is told of its clock under TCG (docs/architecture.md,
 * "The guest's clock under TCG"): the TSC's rate, so that it keeps the
 * TSC as its clock; nothing (CAPSULE_GUEST_TSC=0: its own calibration
 * decides, which under TCG usually fails); or, to measure what that
 * costs, that its TSC is unstable (CAPSULE_GUEST_TSC=unstable: the
 * jiffies clock, as before issue 20). *khz: the rate given, else 0. */
static const char *guest_clock(enum cap_accel accel, unsigned *khz)
{
	const char *env = getenv("CAPSULE_GUEST_TSC");
	*khz = 0;
	if (accel != CAP_ACCEL_TCG)
		return "";
	if (env && strcmp(env, "unstable") == 0)
		return " tsc=unstable";
	*khz = cap_engine_tsc_khz();
	return *khz ? " tsc=reliable" : "";
}

static int version(char **out, struct cap_err *err)
{
	char *argv[] = { QEMU, "--version", NULL };
	char *s = NULL;
	if (cap_run(argv, first_line, &s, NULL) < 0 || !s) {
		free(s);
		return cap_err_set(err, ENOENT, "%s --version failed; install qemu-system-x86 (scripts/bootstrap.sh)", QEMU);
	}
	*out = s;
	return 0;
}

/* QEMU's version line for the binary whose identity (path, size, mtime)
 * is id: `--version` costs a QEMU start, and the identity is computed at
 * every start, so it is kept in the cache directory (qemu-version: id,
 * then the line) and asked again only when the binary changed. "unknown"
 * when QEMU does not answer. New string. */
static char *cached_version(const char *id)
{
	_cleanup_free_ char *dir = cap_cache_dir();
	_cleanup_free_ char *path = xasprintf("%s/qemu-version", dir);
	_cleanup_free_ char *s = NULL;
	size_t n = strlen(id);
	if (cap_read_file(path, 8192, &s) > 0 && strncmp(s, id, n) == 0 && s[n] == '\n') {
		const char *v = s + n + 1;
		size_t len = strcspn(v, "\n");
		if (len && v[len] == '\n')
			return xstrndup(v, len);
	}
	char *v = NULL;
	if (version(&v, NULL) < 0)
		return xstrdup("unknown");
	v[strcspn(v, "\n")] = '\0';
	_cleanup_free_ char *line = xasprintf("%s\n%s\n", id, v);
	if (cap_mkdir_p(dir, 0755) == 0)
		cap_write_file_atomic(path, line, strlen(line), 0644);
	return v;
}

/* docs/architecture.md, "Acceleration": QEMU's binary and version and
 * the accelerator; under KVM (-cpu host) the host's CPU as KVM exposes
 * it, KVM and the kernel; under TCG (-cpu max, the same CPU on any host)
 * the one thing of the host's a guest reads, the TSC's rate. */
static char *identity(enum cap_accel accel)
{
	_cleanup_free_ char *found = cap_find_program(QEMU);
	char id[PATH_MAX + 64];
	cap_file_id(found ? found : QEMU, id, sizeof(id));
	_cleanup_free_ char *ver = cached_version(id);
	if (accel == CAP_ACCEL_KVM) {
		_cleanup_free_ char *host = cap_kvm_host_identity();
		return xasprintf("qemu=%s\nqemu_version=%s\naccel=kvm\n%s", id, ver, host);
	}
	/* The guest's TSC rate to the MHz: measured again on each host
	 * boot, it may differ by a few kHz; a template keeps the rate its
	 * guest was given, a few parts per million from this boot's. */
	unsigned khz;
	const char *clock = guest_clock(accel, &khz);
	return xasprintf("qemu=%s\nqemu_version=%s\naccel=%s\ntsc_mhz=%u\nclock=%s\n", id, ver,
			 cap_engine_accel_name(accel), (khz + 500) / 1000, *clock ? clock + 1 : "the guest's own");
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

/* After the disks: the incoming state when restoring, then a read-only
 * twin of each writable disk (QEMU reopens a disk read-only while nothing
 * needs to write it, and a descriptor set must hold a descriptor of each
 * access mode it will be asked for). */
static unsigned state_slot(const struct cap_vm_config *cfg)
{
	return FD_DISK0 + cfg->ndisks;
}

static unsigned twin_slot(const struct cap_vm_config *cfg, unsigned disk)
{
	unsigned k = state_slot(cfg) + (cfg->restore_state ? 1 : 0);
	for (unsigned i = 0; i < disk; i++)
		k += !cfg->disks[i].readonly;
	return k;
}

/* Then the read-only base of each qcow2 overlay (a fork's disk). */
static unsigned backing_slot(const struct cap_vm_config *cfg, unsigned disk)
{
	unsigned k = twin_slot(cfg, cfg->ndisks);
	for (unsigned i = 0; i < disk; i++)
		k += cfg->disks[i].backing != NULL;
	return k;
}

/* The shared RAM's memfd comes last, after the bases. */
static unsigned ram_slot(const struct cap_vm_config *cfg)
{
	return backing_slot(cfg, cfg->ndisks);
}

/* TCG's translation buffer in MiB: 128, or CAPSULE_TCG_TB_MIB (8 to
 * 1024; `make bench` row (t) measures what it costs and saves). Its
 * touched pages are the largest part of an idle TCG VM's own memory;
 * once full, TCG flushes it and translates again what runs. */
static unsigned tb_mib(void)
{
	const char *e = getenv("CAPSULE_TCG_TB_MIB");
	char *end;
	unsigned long v = e && *e ? strtoul(e, &end, 10) : 0;
	return e && *e && !*end && v >= 8 && v <= 1024 ? (unsigned)v : 128;
}

static void build_argv(struct argv *a, const struct cap_vm_config *cfg,
		       const struct qemu_vm *vm)
{
	bool kvm = cfg->accel == CAP_ACCEL_KVM;
	bool jailed = cap_jail_confined(vm->jail);

	arg(a, xstrdup(QEMU));
	/* Its directory names the VM in `ps` (and for recovery). */
	_cleanup_free_ char *name = esc(cfg->dir);
	arg(a, xstrdup("-name"));
	arg(a, xasprintf("guest=%s", name));
	arg(a, xstrdup("-M"));
	arg(a, xstrdup("microvm,acpi=off,memory-backend=ram"));
	arg(a, xstrdup("-accel"));
	/* TCG's translation cache is bounded so that QEMU stays under its
	 * cgroup's memory ceiling (guest RAM + a fixed overhead). */
	arg(a, kvm ? xstrdup("kvm") : xasprintf("tcg,tb-size=%u", tb_mib()));
	arg(a, xstrdup("-cpu"));
	arg(a, xstrdup(kvm ? "host" : "max"));
	arg(a, xstrdup("-smp"));
	arg(a, xasprintf("%u", cfg->cpus));
	arg(a, xstrdup("-m"));
	arg(a, xasprintf("%uM", cfg->memory_mib));
	arg(a, xstrdup("-object"));
	if (vm->ram_shared) {
		/* One sealed memfd per template, mapped privately: the
		 * guest's writes are copy-on-write, the memfd cannot be
		 * written. QEMU 7.2 opens mem-path by path (not through a
		 * descriptor set): its descriptor through the jail's proc. */
		arg(a, xasprintf("memory-backend-file,id=ram,size=%uM,mem-path=/proc/self/fd/%d,share=off",
				 cfg->memory_mib, FD_NUM(ram_slot(cfg))));
	} else if (cfg->restore_state && !cfg->restore_full && !jailed) {
		/* Unconfined, a restored VM maps the template's RAM file
		 * privately: pages are shared with the template until the
		 * guest writes them, and the template is never changed. */
		_cleanup_free_ char *ram = esc(cfg->restore_ram);
		arg(a, xasprintf("memory-backend-file,id=ram,size=%uM,mem-path=%s,share=off",
				 cfg->memory_mib, ram));
	} else if (cfg->restore_state || vm->owned_ram_path) {
		/* A template being built shares its RAM file, and so does a
		 * snapshot being sealed; a confined restore gets the jail's
		 * own copy of the template's (QEMU 7.2 opens a RAM file
		 * read-write even to map it privately). */
		_cleanup_free_ char *ram = esc(jailed ? JAIL_RAM : vm->owned_ram_path);
		arg(a, xasprintf("memory-backend-file,id=ram,size=%uM,mem-path=%s,share=on",
				 cfg->memory_mib, ram));
	} else {
		arg(a, xasprintf("memory-backend-memfd,id=ram,size=%uM,share=on", cfg->memory_mib));
	}
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
	/* A restored guest's kernel is in its RAM already: loading the
	 * kernel and initramfs again (about 20 MiB, read and copied by QEMU
	 * at start) would be thrown away. The template key names both. */
	if (!cfg->restore_state) {
		/* Under TCG the guest's TSC is the host's, but its kernel's
		 * calibration fails: given the rate, it keeps the TSC as its
		 * clock and an idle guest's tick stops (cap_engine_tsc_khz). */
		unsigned tsc;
		const char *how = guest_clock(cfg->accel, &tsc);
		char clock[64] = "";
		if (tsc)
			snprintf(clock, sizeof(clock), " tsc_early_khz=%u", tsc);
		snprintf(clock + strlen(clock), sizeof(clock) - strlen(clock), "%s", how);
		arg(a, xstrdup("-kernel"));
		arg(a, xstrdup(jailed ? JAIL_KERNEL : cfg->kernel));
		arg(a, xstrdup("-initrd"));
		arg(a, xstrdup(jailed ? JAIL_INITRD : cfg->initrd));
		arg(a, xstrdup("-append"));
		arg(a, xasprintf("console=ttyS0 panic=-1 reboot=t quiet%s%s%s", clock,
				 cfg->append_extra ? " " : "",
				 cfg->append_extra ? cfg->append_extra : ""));
	}
	/* Descriptor sets: set N+1 holds descriptor slot N. */
	arg(a, xstrdup("-add-fd"));
	arg(a, xasprintf("fd=%d,set=%d", FD_NUM(FD_CONSOLE), FD_CONSOLE + 1));
	arg(a, xstrdup("-chardev"));
	arg(a, xasprintf("file,id=console,path=/dev/fdset/%d", FD_CONSOLE + 1));
	arg(a, xstrdup("-serial"));
	arg(a, xstrdup("chardev:console"));
	arg(a, xstrdup("-chardev"));
	arg(a, xasprintf("socket,id=qmp,fd=%d,server=on,wait=off", FD_NUM(FD_QMP)));
	arg(a, xstrdup("-mon"));
	arg(a, xstrdup("chardev=qmp,mode=control"));
	arg(a, xstrdup("-chardev"));
	arg(a, xasprintf("socket,id=agent,fd=%d,server=on,wait=off", FD_NUM(FD_AGENT)));
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
		int slot = FD_DISK0 + (int)i;
		arg(a, xstrdup("-add-fd"));
		arg(a, xasprintf("fd=%d,set=%d", FD_NUM(slot), slot + 1));
		if (!d->readonly) {
			arg(a, xstrdup("-add-fd"));
			arg(a, xasprintf("fd=%d,set=%d", FD_NUM(twin_slot(cfg, i)), slot + 1));
		}
		/* Errors are reported to the guest, never a reason to stop
		 * it: QEMU's default for writes stops the VM on ENOSPC, which
		 * froze a sandbox whose host disk filled up (the shim hears of
		 * each error through QMP, cap_vm_io_errors). */
		/* A fork's disk: a qcow2 overlay over its snapshot's copy,
		 * which QEMU opens read-only through its own set. */
		char format[96] = "format=raw";
		if (d->backing) {
			unsigned b = backing_slot(cfg, i);
			arg(a, xstrdup("-add-fd"));
			arg(a, xasprintf("fd=%d,set=%u", FD_NUM(b), b + 1));
			snprintf(format, sizeof(format),
				 "format=qcow2,backing.driver=raw,backing.file.driver=file,backing.file.filename=/dev/fdset/%u",
				 b + 1);
		}
		/* No image locking: after a snapshot's save (cap_vm_save_full)
		 * QEMU hands the disks back to itself, and 7.2 then fails on
		 * the locks its own two descriptors of the set hold ("Failed
		 * to get "write" lock"), leaving the VM stopped. One VM per
		 * sandbox is the shim's lock's to keep (shim.lock). */
		arg(a, xstrdup("-drive"));
		arg(a, xasprintf("id=disk%u,file=/dev/fdset/%d,%s,file.locking=off,if=none,readonly=%s,discard=unmap,"
				 "werror=report,rerror=report",
				 i, slot + 1, format, d->readonly ? "on" : "off"));
		arg(a, xstrdup("-device"));
		arg(a, xasprintf("virtio-blk-device,drive=disk%u,serial=%s", i, d->serial));
	}
	/* The NIC after the disks: a template's layout is "disks, then NIC". */
	if (cfg->net) {
		struct cap_buf nd;
		cap_buf_init(&nd);
		const char *base = "user,id=net0,ipv6=off";
		cap_buf_append(&nd, base, strlen(base));
		for (unsigned i = 0; i < vm->nforwards; i++) {
			char fwd[64];
			int n = snprintf(fwd, sizeof(fwd), ",hostfwd=tcp:127.0.0.2:%u-:%u",
					 vm->owned_forwards[i], vm->owned_forwards[i]);
			cap_buf_append(&nd, fwd, (size_t)n);
		}
		arg(a, xstrdup("-netdev"));
		arg(a, xstrndup((const char *)cap_buf_head(&nd), cap_buf_used(&nd)));
		cap_buf_fini(&nd);
		arg(a, xstrdup("-device"));
		arg(a, xstrdup("virtio-net-device,netdev=net0"));
	}
	/* A pod's NIC: the tap made in the pod's namespace is QEMU's only
	 * path out (its jail's namespace is empty). */
	if (cfg->tap && vm->tap_slot >= 0) {
		const uint8_t *m = cfg->tap->mac;
		arg(a, xstrdup("-netdev"));
		arg(a, xasprintf("tap,id=net0,fd=%d", FD_NUM(vm->tap_slot)));
		arg(a, xstrdup("-device"));
		arg(a, xasprintf("virtio-net-device,netdev=net0,mac=%02x:%02x:%02x:%02x:%02x:%02x",
				 m[0], m[1], m[2], m[3], m[4], m[5]));
	}
}

static void vm_reap(struct qemu_vm *vm, int status)
{
	vm->exited = true;
	vm->wstatus = status;
	if (WIFEXITED(status))
		snprintf(vm->exit_reason, sizeof(vm->exit_reason), "QEMU exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(vm->exit_reason, sizeof(vm->exit_reason), "QEMU was killed by signal %d (%s)",
			 WTERMSIG(status), strsignal(WTERMSIG(status)));
}

static int vm_wait(struct cap_vm *v, int timeout_ms)
{
	struct qemu_vm *vm = QVM(v);
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
	if (vm->pid <= 0)
		return 1;	/* never started: waitpid(-1) would reap another child */
	int status;
	pid_t r = waitpid(vm->pid, &status, WNOHANG);
	if (r == vm->pid) {
		vm_reap(vm, status);
		return 1;
	}
	return 0;
}

static void vm_kill(struct cap_vm *v)
{
	struct qemu_vm *vm = QVM(v);
	/* The policy process and the connector go with QEMU. */
	if (vm->net)
		cap_jail_net_stop(vm->net);
	/* Never kill(-1): that would be every process we may signal. */
	if (vm->exited || vm->pid <= 0)
		return;
	kill(vm->pid, SIGKILL);
	int status;
	while (waitpid(vm->pid, &status, 0) < 0 && errno == EINTR)
		;
	vm_reap(vm, status);
}

static int connect_unix(const char *path, struct qemu_vm *vm, int *out,
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
		if (vm_wait(&vm->base, 0))
			return cap_err_set(err, ECHILD, "%s before its socket %s was ready", vm->exit_reason, path);
		if ((e != ENOENT && e != ECONNREFUSED) || cap_now_ms() > end)
			return cap_err_set(err, e, "cannot connect to %s: %s", path, strerror(e));
		usleep(1000);
	}
}

/* Read one newline-terminated QMP message into buf, waiting up to
 * timeout_ms (0: only what has arrived). Reads in chunks: what follows
 * the line stays in vm->qmp_in for the next call. */
int cap_qmp_take_line(struct cap_buf *in, char *buf, size_t len)
{
	const uint8_t *h = cap_buf_head(in);
	size_t used = cap_buf_used(in);
	const uint8_t *nl = used ? memchr(h, '\n', used) : NULL;
	if (!nl && used < len)
		return -EAGAIN;
	size_t n = nl ? (size_t)(nl - h) : used;
	bool fits = n < len;
	if (fits) {
		memcpy(buf, h, n);
		buf[n] = '\0';
	}
	cap_buf_consume(in, nl ? n + 1 : n);
	return fits ? 0 : -EMSGSIZE;
}

static int qmp_read(struct qemu_vm *vm, char *buf, size_t len, int timeout_ms)
{
	int64_t end = cap_now_ms() + timeout_ms;
	for (;;) {
		int t = cap_qmp_take_line(&vm->qmp_in, buf, len);
		if (t != -EAGAIN)
			return t;
		if (vm->qmp_gone)
			return -EPIPE;
		struct pollfd p = { .fd = vm->qmp_fd, .events = POLLIN };
		int left = (int)CAP_MAX(end - cap_now_ms(), (int64_t)0);
		int r = poll(&p, 1, left);
		if (r < 0 && errno != EINTR)
			return -errno;
		if (r == 0 && left == 0)
			return -ETIMEDOUT;
		if (r <= 0)
			continue;
		uint8_t *w = cap_buf_reserve(&vm->qmp_in, 4096);
		ssize_t k = read(vm->qmp_fd, w, 4096);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0) {
			vm->qmp_gone = true;
			return k < 0 ? -errno : -EPIPE;
		}
		cap_buf_commit(&vm->qmp_in, (size_t)k);
	}
}

/* An event from QEMU: a disk's I/O error is counted and kept (the
 * latest) for cap_vm_io_errors; the rest does not concern us. */
void cap_qmp_event(json_t *j, unsigned *io_errors, struct cap_vm_io_error *io_last)
{
	const char *ev = json_string_value(json_object_get(j, "event"));
	json_t *d = json_object_get(j, "data");
	if (!ev || strcmp(ev, "BLOCK_IO_ERROR") != 0 || !json_is_object(d))
		return;
	const char *dev = json_string_value(json_object_get(d, "device"));
	const char *op = json_string_value(json_object_get(d, "operation"));
	const char *why = json_string_value(json_object_get(d, "reason"));
	unsigned disk;
	char end;
	/* build_argv names the drives disk<index>. */
	if (!dev || sscanf(dev, "disk%u%c", &disk, &end) != 1)
		return;
	(*io_errors)++;
	*io_last = (struct cap_vm_io_error){
		.disk = disk,
		.write = op && strcmp(op, "write") == 0,
		/* QEMU sets "nospace" only for drives that may stop on
		 * errors; ours report, so its reason (strerror in
		 * QEMU's C locale) tells. */
		.nospace = json_is_true(json_object_get(d, "nospace")) ||
			   (why && strcmp(why, "No space left on device") == 0),
	};
	snprintf(io_last->reason, sizeof(io_last->reason), "%s", why ? why : "I/O error");
}

static int io_errors(struct cap_vm *v, struct cap_vm_io_error *last)
{
	struct qemu_vm *vm = QVM(v);
	char line[8192];
	int r = 0;
	while (vm->qmp_fd >= 0 && (r = qmp_read(vm, line, sizeof(line), 0)) != -ETIMEDOUT) {
		if (r == -EMSGSIZE)
			continue;
		if (r < 0)
			break;
		json_t *j = json_loads(line, 0, NULL);
		if (j)
			cap_qmp_event(j, &vm->io_errors, &vm->io_last);
		json_decref(j);
		r = 0;
	}
	unsigned n = vm->io_errors;
	if (n > 0)
		*last = vm->io_last;
	vm->io_errors = 0;
	if (n == 0 && r < 0 && r != -ETIMEDOUT)
		return r;
	return (int)CAP_MIN(n, (unsigned)INT32_MAX);
}

static int qmp_call_fd(struct qemu_vm *vm, const char *cmd, json_t *args,
		       json_t **ret, int fd, struct cap_err *err);

/* Send one QMP command and wait for its return, skipping events. */
static int qmp_execute(struct qemu_vm *vm, const char *cmd, struct cap_err *err)
{
	return qmp_call_fd(vm, cmd, NULL, NULL, -1, err);
}

/* The same with arguments (owned by the call) and the "return" value
 * (*ret, owned by the caller, when ret is not NULL). */
static int qmp_call(struct qemu_vm *vm, const char *cmd, json_t *args, json_t **ret,
		    struct cap_err *err)
{
	return qmp_call_fd(vm, cmd, args, ret, -1, err);
}

/* Write a QMP request, with descriptor fd attached when fd >= 0 (for
 * `getfd`). 0 or -errno. */
static int qmp_send(struct qemu_vm *vm, const char *req, int fd)
{
	if (fd < 0)
		return cap_write_all(vm->qmp_fd, req, strlen(req));
	size_t len = strlen(req);
	ssize_t n = cap_send_fd(vm->qmp_fd, fd, req, len, 0);
	if (n < 0)
		return (int)n;
	/* The descriptor went with the first byte; the rest is plain. */
	return (size_t)n < len ? cap_write_all(vm->qmp_fd, req + n, len - (size_t)n) : 0;
}

static int qmp_call_fd(struct qemu_vm *vm, const char *cmd, json_t *args,
		       json_t **ret, int fd, struct cap_err *err)
{
	char line[8192];
	json_t *m = json_pack("{s:s}", "execute", cmd);
	if (args)
		json_object_set_new(m, "arguments", args);
	char *text = json_dumps(m, JSON_COMPACT);
	json_decref(m);
	char *req = xasprintf("%s\n", text);
	free(text);
	int r = qmp_send(vm, req, fd);
	free(req);
	if (r < 0)
		return cap_err_set(err, -r, "QMP %s: %s", cmd, strerror(-r));
	for (;;) {
		if ((r = qmp_read(vm, line, sizeof(line), QMP_TIMEOUT_MS)) < 0)
			return cap_err_set(err, -r, "QMP %s: no answer: %s", cmd, strerror(-r));
		if ((r = cap_qmp_reply(line, cmd, &vm->io_errors, &vm->io_last, ret, err)) <= 0)
			return r;
	}
}

int cap_qmp_reply(const char *line, const char *cmd, unsigned *io_errors,
		  struct cap_vm_io_error *io_last, json_t **ret, struct cap_err *err)
{
	json_t *j = json_loads(line, 0, NULL);
	if (!j)
		return cap_err_set(err, EPROTO, "QMP %s: unparsable answer", cmd);
	if (json_object_get(j, "event")) {
		cap_qmp_event(j, io_errors, io_last);	/* kept for cap_vm_io_errors */
		json_decref(j);
		return 1;
	}
	json_t *rv = json_object_get(j, "return");
	bool done = rv != NULL;
	if (done && ret)
		*ret = json_incref(rv);
	json_t *e = json_object_get(j, "error");
	if (e) {
		const char *desc = json_string_value(json_object_get(e, "desc"));
		int r = cap_err_set(err, EIO, "QMP %s failed: %s", cmd, desc ? desc : "unknown error");
		json_decref(j);
		return r;
	}
	json_decref(j);
	return done ? 0 : 1;
}

static int qmp_handshake(struct qemu_vm *vm, struct cap_err *err)
{
	char line[8192];
	/* The socket was listening before QEMU started: the greeting comes
	 * once QEMU has set the machine up. */
	int r = qmp_read(vm, line, sizeof(line), CONNECT_TIMEOUT_MS);
	if (r >= 0 && !strstr(line, "\"QMP\""))
		return cap_err_set(err, EPROTO, "QMP greeting not recognised");
	if (r >= 0)
		r = qmp_execute(vm, "qmp_capabilities", err);
	else if (r != -EPIPE && r != -ECONNRESET)
		return cap_err_set(err, -r, "QMP greeting: %s", strerror(-r));
	/* Greeted or not, a monitor that goes away here is QEMU exiting
	 * while it set the machine up; what it said follows. */
	if (r == -EPIPE || r == -ECONNRESET)
		return cap_err_set(err, -r, "QEMU exited while setting the machine up");
	return r;
}

static int ignore_shared(struct qemu_vm *vm, struct cap_err *err)
{
	return qmp_call(vm, "migrate-set-capabilities",
			json_pack("{s:[{s:s, s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", 1),
			NULL, err);
}

/* Wait until the migration in either direction has completed. */
static int migration_done(struct qemu_vm *vm, int timeout_ms, struct cap_err *err)
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

/* A VM an earlier migration left stopped (QEMU's run state
 * "postmigrate": a snapshot taken --paused) has let go of its disks, and
 * QEMU 7.2 refuses to migrate it again ("Can't migrate the vm that was
 * paused due to previous migration"); only `cont` takes them back. So
 * such a VM is continued and stopped again at once: its guest runs for
 * the instant between the two. Any other state is left as it is. */
static int take_back_disks(struct qemu_vm *vm, struct cap_err *err)
{
	json_t *ret = NULL;
	int r = qmp_call(vm, "query-status", NULL, &ret, err);
	if (r < 0)
		return r;
	const char *st = json_string_value(json_object_get(ret, "status"));
	bool post = st && strcmp(st, "postmigrate") == 0;
	json_decref(ret);
	if (!post)
		return 0;
	if ((r = qmp_execute(vm, "cont", err)) < 0)
		return r;
	return qmp_execute(vm, "stop", err);
}

/* Stop the guest and save its state into state_path. full: every RAM
 * block is sent (x-ignore-shared off, whatever an earlier restore set), at
 * no bandwidth limit (QEMU's default is 32 MiB/s, meant for a network;
 * this is a local file, the guest already stopped); else the device state
 * alone, the RAM being the shared file's. */
static int save_state(struct qemu_vm *vm, const char *state_path, bool full, struct cap_err *err)
{
	_cleanup_free_ char *tmp = xasprintf("%s.tmp", state_path);
	int r;

	if ((r = take_back_disks(vm, err)) < 0 || (r = qmp_execute(vm, "stop", err)) < 0)
		return r;
	if (!full && (r = ignore_shared(vm, err)) < 0)
		return r;
	if (full && ((r = qmp_call(vm, "migrate-set-capabilities",
				   json_pack("{s:[{s:s, s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", 0),
				   NULL, err)) < 0 ||
		     (r = qmp_call(vm, "migrate-set-parameters",
				   json_pack("{s:I}", "max-bandwidth", (json_int_t)1 << 40), NULL, err)) < 0))
		return r;
	/* QEMU writes the state straight into a file we open: it sees no
	 * path of ours. */
	int out = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (out < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", tmp, strerror(errno));
	if ((r = qmp_call_fd(vm, "getfd", json_pack("{s:s}", "fdname", "capsule-save"), NULL, out, err)) < 0 ||
	    (r = qmp_call(vm, "migrate", json_pack("{s:s}", "uri", "fd:capsule-save"), NULL, err)) < 0 ||
	    (r = migration_done(vm, full ? 120000 : 10000, err)) < 0)
		goto out;
	if (fsync(out) < 0 || rename(tmp, state_path) < 0)
		r = cap_err_set(err, errno, "cannot store %s: %s", state_path, strerror(errno));
out:
	close(out);
	unlink(tmp);
	return r;
}

static int save(struct cap_vm *v, const char *state_path, struct cap_err *err)
{
	return save_state(QVM(v), state_path, false, err);
}

static int save_full(struct cap_vm *v, const char *state_path, struct cap_err *err)
{
	return save_state(QVM(v), state_path, true, err);
}

/* Feed the saved state (passed to QEMU as a descriptor at start) into a
 * QEMU started with -incoming defer; the guest stays paused until `cont`. */
static int restore(struct qemu_vm *vm, const struct cap_vm_config *cfg, struct cap_err *err)
{
	_cleanup_free_ char *uri = xasprintf("fd:%d", FD_NUM(state_slot(cfg)));
	int r;
	if ((r = cap_jail_ready(vm->jail, err)) < 0 ||
	    (!cfg->restore_full && (r = ignore_shared(vm, err)) < 0) ||
	    (r = qmp_call(vm, "migrate-incoming", json_pack("{s:s}", "uri", uri), NULL, err)) < 0)
		return r;
	return migration_done(vm, cfg->restore_full ? 120000 : 10000, err);
}

static int pause_vm(struct cap_vm *v, struct cap_err *err)
{
	struct qemu_vm *vm = QVM(v);
	return qmp_execute(vm, "stop", err);
}

static int resume(struct cap_vm *v, struct cap_err *err)
{
	struct qemu_vm *vm = QVM(v);
	return qmp_execute(vm, "cont", err);
}

static int quit(struct cap_vm *v)
{
	struct qemu_vm *vm = QVM(v);
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

const char *cap_qemu_log_explain(const char *log, bool confined, char *buf, size_t len)
{
	static const char kvm[] = "Could not access KVM kernel module: ";
	const char *at = log ? strstr(log, kvm) : NULL;
	char advice[700];
	if (!at && log && strstr(log, "kvm version too old")) {
		/* It opened, but KVM_GET_API_VERSION failed: not KVM's node. */
		snprintf(buf, len, "QEMU's /dev/kvm did not answer as KVM: %s",
			 cap_engine_kvm_advice("/dev/kvm", ENOTTY, confined, advice, sizeof(advice)));
		return buf;
	}
	if (!at)
		return NULL;
	at += sizeof(kvm) - 1;
	size_t n = strcspn(at, "\n");
	/* QEMU printed strerror(errno) ("%m"): back to the number. */
	static const int known[] = { EACCES, EPERM, ENOENT, ENXIO, ENODEV, ENOTTY, EBUSY, ENOMEM };
	int e = 0;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(known) && !e; i++) {
		const char *m = strerror(known[i]);
		if (strlen(m) == n && strncmp(at, m, n) == 0)
			e = known[i];
	}
	if (e)
		cap_engine_kvm_advice("/dev/kvm", e, confined, advice, sizeof(advice));
	else
		snprintf(advice, sizeof(advice), "see `capsule doctor`");
	snprintf(buf, len, "QEMU could not open /dev/kvm (%.*s): %s", (int)CAP_MIN(n, (size_t)80), at, advice);
	return buf;
}

static char *logs_tail(const struct cap_vm *v, int lines)
{
	const struct qemu_vm *vm = CQVM(v);
	_cleanup_free_ char *q = tail_file(vm->owned_qemu_log, lines);
	_cleanup_free_ char *c = tail_file(vm->owned_console, lines);
	return xasprintf("%s%s%s%s%s%s", *q ? "QEMU said:\n" : "", q, *q ? "\n" : "",
			 *c ? "guest console (last lines):\n" : "", c, *c ? "\n" : "");
}

static void vm_close(struct qemu_vm *vm)
{
	int *fds[] = { &vm->qmp_fd, &vm->agent_fd, &vm->pidfd };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(fds); i++) {
		if (*fds[i] >= 0)
			close(*fds[i]);
		*fds[i] = -1;
	}
}

static void vm_free(struct cap_vm *v)
{
	struct qemu_vm *vm = QVM(v);
	if (!vm)
		return;
	vm_kill(v);
	vm_close(vm);
	/* QEMU and the VM's helpers are reaped: their namespaces, and with
	 * them the jail's mounts, are gone; the cgroups and the slot go now. */
	cap_jail_net_free(vm->net);
	cap_jail_free(vm->jail);
	unlink(vm->owned_qmp_path);
	unlink(vm->owned_agent_path);
	if (!vm->keep_qemu_log)
		unlink(vm->owned_qemu_log);
	free(vm->owned_dir);
	free(vm->owned_console);
	free(vm->owned_qemu_log);
	free(vm->owned_qmp_path);
	free(vm->owned_agent_path);
	free(vm->owned_ram_path);
	free(vm->owned_forwards);
	cap_buf_fini(&vm->qmp_in);
	free(vm);
}

/* Whether pid runs QEMU with -name guest=<dir> (as build_argv names it). */
static bool is_vm_of(pid_t pid, const char *dir)
{
	char buf[16384];
	size_t n = 0;
	ssize_t k;
	_cleanup_free_ char *path = xasprintf("/proc/%d/cmdline", (int)pid);
	_cleanup_close_ int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	while (n < sizeof(buf) - 1 && (k = read(fd, buf + n, sizeof(buf) - 1 - n)) != 0) {
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return false;
		}
		n += (size_t)k;
	}
	buf[n] = '\0';	/* a zombie's is empty */
	const char *prog = strrchr(buf, '/');
	if (n == 0 || strcmp(prog ? prog + 1 : buf, QEMU) != 0)
		return false;
	_cleanup_free_ char *name = esc(dir);
	_cleanup_free_ char *want = xasprintf("guest=%s", name);
	for (size_t i = strlen(buf) + 1; i < n; i += strlen(buf + i) + 1)
		if (strcmp(buf + i, want) == 0)
			return true;
	return false;
}

static int end_leftover(const char *dir, pid_t pid)
{
	/* The sockets first: whoever looks meanwhile finds none to try. */
	static const char *const socks[] = { "qmp.sock", "agent.sock" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(socks); i++) {
		_cleanup_free_ char *path = xasprintf("%s/%s", dir, socks[i]);
		unlink(path);
	}
	if (pid <= 0)
		return 0;
	/* A pidfd first, then the check: the signal goes to the process
	 * checked, never to another that got its pid meanwhile. */
	_cleanup_close_ int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd < 0)
		return errno == ESRCH ? 0 : -errno;
	if (!is_vm_of(pid, dir))
		return 0;
	if (syscall(SYS_pidfd_send_signal, pfd, SIGKILL, NULL, 0) < 0)
		return errno == ESRCH ? 0 : -errno;
	/* Not our child: whoever inherited it reaps it. */
	for (int i = 0; i < 200; i++) {
		if (!is_vm_of(pid, dir))
			return 1;
		usleep(10000);
	}
	return -ETIMEDOUT;
}

static int net_control_fd(const struct cap_vm *v)
{
	const struct qemu_vm *vm = CQVM(v);
	return vm->net ? cap_jail_net_control_fd(vm->net) : -1;
}

static pid_t net_pid(const struct cap_vm *v)
{
	const struct qemu_vm *vm = CQVM(v);
	return vm->net ? cap_jail_net_pid(vm->net) : -1;
}

static int net_deny(struct cap_vm *v, const uint32_t (*deny)[2], unsigned n,
		    struct cap_err *err)
{
	struct qemu_vm *vm = QVM(v);
	if (!vm->net)
		return cap_err_set(err, ENODEV, "this VM has no network interface");
	return cap_jail_net_deny(vm->net, deny, n, err);
}

static int forward_index(const struct qemu_vm *vm, uint16_t port)
{
	for (unsigned i = 0; i < vm->nforwards; i++)
		if (vm->owned_forwards[i] == port)
			return (int)i;
	return -1;
}

/* A monitor command through QMP: QEMU answers errors as text. */
static int hmp(struct qemu_vm *vm, const char *cmd, struct cap_err *err)
{
	json_t *ret = NULL;
	int r = qmp_call(vm, "human-monitor-command", json_pack("{s:s}", "command-line", cmd), &ret, err);
	if (r < 0)
		return r;
	const char *said = json_string_value(ret);
	if (said && *said) {
		char msg[300];
		snprintf(msg, sizeof(msg), "%s", said);
		msg[strcspn(msg, "\r\n")] = '\0';
		r = cap_err_set(err, EIO, "QEMU refused \"%s\": %s", cmd, msg);
	}
	json_decref(ret);
	return r;
}

static int net_forward(struct cap_vm *v, uint16_t port, bool add,
		       struct cap_err *err)
{
	struct qemu_vm *vm = QVM(v);
	if (!vm->net)
		return cap_err_set(err, ENODEV, "this VM has no network interface");
	if (port == 0)
		return cap_err_set(err, EINVAL, "port 0 cannot be forwarded");
	int i = forward_index(vm, port);
	if (add == (i >= 0))
		return 0;
	char cmd[80];
	if (add)
		snprintf(cmd, sizeof(cmd), "hostfwd_add net0 tcp:127.0.0.2:%u-:%u", port, port);
	else
		snprintf(cmd, sizeof(cmd), "hostfwd_remove net0 tcp:127.0.0.2:%u", port);
	int r = hmp(vm, cmd, err);
	if (r < 0)
		return r;
	if (add) {
		vm->owned_forwards = xrealloc(vm->owned_forwards, (vm->nforwards + 1) * sizeof(uint16_t));
		vm->owned_forwards[vm->nforwards++] = port;
	} else {
		vm->owned_forwards[i] = vm->owned_forwards[--vm->nforwards];
	}
	return 0;
}

static const char *jail_note(const struct cap_vm *v)
{
	const struct qemu_vm *vm = CQVM(v);
	return vm->jail ? cap_jail_note(vm->jail) : "";
}

/* How many descriptors QEMU is handed: the twins come last. */
static unsigned fd_count(const struct cap_vm_config *cfg)
{
	return ram_slot(cfg);
}

static int open_disk(const struct cap_vm_disk *d, int flags, struct cap_err *err)
{
	int fd = open(d->path, flags | O_CLOEXEC);
	if (fd < 0)
		return cap_err_set(err, errno, "cannot open disk %s (%s): %s", d->path, d->serial, strerror(errno));
	return fd;
}

/* Open what QEMU is handed, each in its slot of fds (fd_count of them,
 * all -1 on entry). 0, or -errno with err naming the file; what was
 * opened stays in fds for the caller to close. */
static int open_fds(const struct cap_vm_config *cfg, struct qemu_vm *vm, int *fds,
		    struct cap_err *err)
{
	if ((fds[FD_QMP] = cap_unix_listen(vm->owned_qmp_path, err)) < 0)
		return fds[FD_QMP];
	if ((fds[FD_AGENT] = cap_unix_listen(vm->owned_agent_path, err)) < 0)
		return fds[FD_AGENT];
	if ((fds[FD_CONSOLE] = open(vm->owned_console, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0)
		return cap_err_set(err, errno, "cannot create %s: %s", vm->owned_console, strerror(errno));
	for (unsigned i = 0; i < cfg->ndisks; i++) {
		const struct cap_vm_disk *d = &cfg->disks[i];
		if ((fds[FD_DISK0 + i] = open_disk(d, d->readonly ? O_RDONLY : O_RDWR, err)) < 0)
			return fds[FD_DISK0 + i];
		if (!d->readonly && (fds[twin_slot(cfg, i)] = open_disk(d, O_RDONLY, err)) < 0)
			return fds[twin_slot(cfg, i)];
		if (d->backing && (fds[backing_slot(cfg, i)] = open(d->backing, O_RDONLY | O_CLOEXEC)) < 0)
			return cap_err_set(err, errno, "cannot open %s, the base of disk %s (%s): %s", d->backing,
					   d->path, d->serial, strerror(errno));
	}
	if (cfg->restore_state &&
	    (fds[state_slot(cfg)] = open(cfg->restore_state, O_RDONLY | O_CLOEXEC)) < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", cfg->restore_state, strerror(errno));
	return 0;
}

/* ---- what QEMU's jail holds ------------------------------------------ */

struct lines {
	char **v;
	size_t n;
};

static void lines_add(struct lines *l, const char *s)
{
	for (size_t i = 0; i < l->n; i++)
		if (strcmp(l->v[i], s) == 0)
			return;
	l->v = xrealloc(l->v, (l->n + 1) * sizeof(char *));
	l->v[l->n++] = xstrdup(s);
}

static void lines_free(struct lines *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i]);
	free(l->v);
	l->v = NULL;
	l->n = 0;
}

/* ldd's answer, one path per line ("libz.so.1 => /lib/.../libz.so.1"). */
static void ldd_line(void *ud, const char *line)
{
	struct lines *l = ud;
	const char *p = strstr(line, "=> ");
	p = p ? p + 3 : line;
	while (*p == ' ' || *p == '\t')
		p++;
	if (*p != '/')
		return;
	size_t n = strcspn(p, " ");
	_cleanup_free_ char *path = xstrndup(p, n);
	lines_add(l, path);
}

/* QEMU's TCG accelerator is a loadable module in Debian's build. */
static const char *const modules[] = {
	"/usr/lib/x86_64-linux-gnu/qemu/accel-tcg-x86_64.so",
};
/* The microvm machine's firmware (Debian names it qboot.rom) and the
 * option ROM that boots a PVH kernel. */
static const char *const firmware[] = {
	"/usr/share/qemu/bios-microvm.bin",
	"/usr/share/qemu/qboot.rom",
	"/usr/share/qemu/pvh.bin",
};

/* The files QEMU needs, as paths valid both on the host and in the jail:
 * the binary, its libraries and loader, its modules and firmware. ldd
 * costs ~35 ms, so the list is cached, keyed by the files it was made
 * from. */
static int qemu_files(const char *qemu, struct lines *out, struct cap_err *err)
{
	struct stat st;
	/* Bump with the lists above. */
	unsigned long long key = 1469598103934665603ull + 2;
	const char *keyed[1 + CAP_ARRAY_SIZE(modules)] = { qemu };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(modules); i++)
		keyed[i + 1] = modules[i];
	for (size_t i = 0; i < CAP_ARRAY_SIZE(keyed); i++) {
		if (stat(keyed[i], &st) < 0)
			continue;
		unsigned long long parts[] = { st.st_dev, st.st_ino, (unsigned long long)st.st_size,
					       (unsigned long long)st.st_mtim.tv_sec, (unsigned long long)st.st_mtim.tv_nsec };
		for (size_t k = 0; k < CAP_ARRAY_SIZE(parts); k++)
			key = (key ^ parts[k]) * 1099511628211ull;
	}
	_cleanup_free_ char *cache = cap_cache_dir();
	_cleanup_free_ char *dir = xasprintf("%s/jail", cache);
	_cleanup_free_ char *file = xasprintf("%s/qemu-files-%016llx", dir, key);
	char *text = NULL;
	if (cap_read_file(file, 1 << 20, &text) > 0) {
		char *save = NULL;
		bool stale = false;
		for (char *l = strtok_r(text, "\n", &save); l; l = strtok_r(NULL, "\n", &save))
			if (*l == '/') {
				lines_add(out, l);
				stale |= access(l, R_OK) != 0;	/* a library moved */
			}
		free(text);
		if (out->n > 1 && !stale)
			return 0;
		lines_free(out);
		text = NULL;
	}
	free(text);

	lines_add(out, qemu);
	char *argv[] = { "ldd", (char *)qemu, NULL };
	struct cap_err lerr = { 0 };
	if (cap_run(argv, ldd_line, out, &lerr) < 0) {
		lines_free(out);
		return cap_err_set(err, lerr.code ? lerr.code : EIO, "cannot list the libraries of %s: %s", qemu, lerr.msg);
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(modules); i++) {
		if (access(modules[i], R_OK) != 0)
			continue;
		lines_add(out, modules[i]);
		char *margv[] = { "ldd", (char *)modules[i], NULL };
		cap_run(margv, ldd_line, out, NULL);
	}
	for (size_t i = 0; i < CAP_ARRAY_SIZE(firmware); i++)
		if (access(firmware[i], R_OK) == 0)
			lines_add(out, firmware[i]);
	size_t len = 0;
	for (size_t i = 0; i < out->n; i++)
		len += strlen(out->v[i]) + 1;
	_cleanup_free_ char *list = xmalloc(len + 1);
	char *p = list;
	for (size_t i = 0; i < out->n; i++)
		p += sprintf(p, "%s\n", out->v[i]);
	if (cap_mkdir_p(dir, 0755) == 0)
		cap_write_file_atomic(file, list, len, 0644);
	return 0;
}

/* A jail's spec for cfg, with what it points to (jail_fini). */
struct qemu_jail {
	struct cap_jail_spec spec;
	char *owned_exe;
	struct lines libs;	/* qemu_files */
	struct cap_jail_file *owned_files;
	const char *devices[1];
};

/* What QEMU's jail holds and how much it may use: QEMU, its files, the
 * guest's kernel and initramfs at JAIL_KERNEL and JAIL_INITRD, /dev/kvm
 * under KVM, the RAM file at JAIL_RAM (a template being built shares
 * cfg.ram_file; a restore gets a copy of the template's in a tmpfs of
 * the jail's own, as QEMU 7.2 opens a RAM file read-write even to map it
 * privately; or the sealed memfd cfg.restore_ram_fd, which it opens
 * through the jail's proc). The list of files only when the jail will
 * confine. 0, or -errno with err. */
static int jail_init(struct qemu_jail *q, const struct cap_vm_config *cfg, struct cap_err *err)
{
	memset(q, 0, sizeof(*q));
	if (!(q->owned_exe = cap_find_program(QEMU)))
		return cap_err_set(err, ENOENT, "%s is not installed (in PATH); run scripts/bootstrap.sh", QEMU);
	unsigned n = 0;
	if (cap_jail_would_confine()) {
		int r = qemu_files(q->owned_exe, &q->libs, err);
		if (r < 0)
			return r;
		q->owned_files = xcalloc(q->libs.n + 2, sizeof(*q->owned_files));
		for (size_t i = 0; i < q->libs.n; i++)
			q->owned_files[n++] = (struct cap_jail_file){ q->libs.v[i], NULL, true };
		/* A restore loads no kernel (build_argv): it is in the RAM. */
		if (!cfg->restore_state) {
			q->owned_files[n++] = (struct cap_jail_file){ cfg->kernel, JAIL_KERNEL, false };
			q->owned_files[n++] = (struct cap_jail_file){ cfg->initrd, JAIL_INITRD, false };
		}
	}
	bool kvm = cfg->accel == CAP_ACCEL_KVM;
	q->devices[0] = "/dev/kvm";
	int sealed = cfg->restore_state ? cfg->restore_ram_fd : -1;
	unsigned long long mib = (unsigned long long)cfg->memory_mib + OVERHEAD_MIB;
	/* A guest's first write to a page the template never touched fills
	 * that hole of the shared memfd with a zero page (shmem has no
	 * shared zero page), charged to the VM besides its private copy: up
	 * to guest RAM more, unreclaimable without swap. */
	if (sealed > 0)
		mib += cfg->memory_mib;
	q->spec = (struct cap_jail_spec){
		.exe = q->owned_exe,
		.files = q->owned_files,
		.nfiles = n,
		.devices = q->devices,
		.ndevices = kvm ? 1 : 0,
		.memory_max = mib << 20,
		/* QEMU's I/O thread pool alone may use 64. */
		.pids_max = 128 + 2 * cfg->cpus,
		.cpus = cfg->cpus,
		.rw_file = cfg->ram_file,
		.rw_at = cfg->ram_file ? JAIL_RAM : NULL,
		.copy_file = cfg->restore_state && cfg->restore_ram_fd <= 0 ? cfg->restore_ram : NULL,
		.copy_at = JAIL_RAM,
		.sealed_fd = sealed,
	};
	if (!q->spec.copy_file)
		q->spec.copy_at = NULL;
	return 0;
}

static void jail_fini(struct qemu_jail *q)
{
	free(q->owned_exe);
	free(q->owned_files);
	lines_free(&q->libs);
}

static void close_fds(int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		if (fds[i] >= 0) {
			close(fds[i]);
			fds[i] = -1;
		}
}

static int start(const struct cap_vm_config *cfg, struct cap_vm **out,
		 struct cap_err *err)
{
	struct qemu_vm *vm = xcalloc(1, sizeof(*vm));
	vm->base.ops = &cap_engine_qemu;
	struct argv a = { 0 };
	unsigned nfds = fd_count(cfg);
	int fds[nfds + 2], logfd = -1;	/* + the shared RAM, the tap */
	for (unsigned i = 0; i < nfds + 2; i++)
		fds[i] = -1;
	int r;

	vm->pid = -1;
	vm->tap_slot = -1;
	vm->pidfd = vm->qmp_fd = vm->agent_fd = -1;
	cap_buf_init(&vm->qmp_in);
	vm->owned_dir = xstrdup(cfg->dir);
	vm->owned_console = cfg->console_log ? xstrdup(cfg->console_log)
					     : xasprintf("%s/console.log", cfg->dir);
	vm->owned_qemu_log = cfg->vmm_log ? xstrdup(cfg->vmm_log) : xasprintf("%s/qemu.log", cfg->dir);
	vm->keep_qemu_log = cfg->vmm_log != NULL;
	vm->owned_qmp_path = xasprintf("%s/qmp.sock", cfg->dir);
	vm->owned_agent_path = xasprintf("%s/agent.sock", cfg->dir);
	vm->owned_ram_path = cfg->ram_file ? xstrdup(cfg->ram_file) : NULL;

	struct cap_vm_times ignored, *t = cfg->times ? cfg->times : &ignored;
	*t = (struct cap_vm_times){ .start = cap_now_ns() };
	if (access(cfg->kernel, R_OK) != 0) {
		r = cap_err_set(err, ENOENT, "guest kernel %s is missing: build it once with `capsule prepare` (or `make kernel` in a source tree)", cfg->kernel);
		goto fail;
	}
	if (access(cfg->initrd, R_OK) != 0) {
		r = cap_err_set(err, ENOENT, "initramfs %s is missing", cfg->initrd);
		goto fail;
	}
	struct qemu_jail qj;
	r = jail_init(&qj, cfg, err);
	if (r == 0)
		r = cap_jail_new(&qj.spec, &vm->jail, err);
	jail_fini(&qj);
	if (r < 0)
		goto fail;
	if (cfg->restore_state && !cfg->restore_full) {
		bool jailed = cap_jail_confined(vm->jail);
		vm->ram_shared = jailed && cfg->restore_ram_fd > 0;
		vm->ram_note = vm->ram_shared ? "shared RAM" : jailed ? "RAM copied" : "template file mapped privately";
		if (!jailed && cfg->restore_ram_fd > 0)
			vm->ram_note = "template file mapped privately: not confined";
	} else {
		vm->ram_note = "";
	}
	if (cfg->net) {
		/* Its namespace, rules and policy process exist before QEMU. */
		if ((r = cap_jail_net_new(vm->jail, cfg->net, &vm->net, err)) < 0)
			goto fail;
		cap_jail_set_netns(vm->jail, cap_jail_net_ns(vm->net));
		for (unsigned i = 0; i < cfg->net->nforward; i++) {
			uint16_t port = cfg->net->forward[i];
			if (port == 0) {
				r = cap_err_set(err, EINVAL, "port 0 cannot be forwarded");
				goto fail;
			}
			if (forward_index(vm, port) >= 0)
				continue;
			vm->owned_forwards = xrealloc(vm->owned_forwards, (vm->nforwards + 1) * sizeof(uint16_t));
			vm->owned_forwards[vm->nforwards++] = port;
		}
	}
	if ((r = open_fds(cfg, vm, fds, err)) < 0)
		goto fail;
	if (vm->ram_shared) {
		if ((fds[nfds] = fcntl(cfg->restore_ram_fd, F_DUPFD_CLOEXEC, 3)) < 0) {
			r = cap_err_set(err, errno, "cannot pass the shared RAM: %s", strerror(errno));
			goto fail;
		}
		nfds++;
	}
	if (cfg->tap && cfg->net) {
		r = cap_err_set(err, EINVAL, "a VM has one NIC: a pod's or one under a policy");
		goto fail;
	}
	if (cfg->tap) {
		if (!cap_jail_confined(vm->jail)) {
			r = cap_err_set(err, EPERM, "a pod's network needs the jail (capsule running as root, CAPSULE_JAIL not 0), which this VM lacks: %s",
					*cap_jail_note(vm->jail) ? cap_jail_note(vm->jail) : "not confined");
			goto fail;
		}
		if ((fds[nfds] = fcntl(cfg->tap->fd, F_DUPFD_CLOEXEC, 3)) < 0) {
			r = cap_err_set(err, errno, "cannot pass the pod's tap: %s", strerror(errno));
			goto fail;
		}
		vm->tap_slot = (int)nfds++;
	}
	if ((logfd = open(vm->owned_qemu_log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		r = cap_err_set(err, errno, "cannot create %s: %s", vm->owned_qemu_log, strerror(errno));
		goto fail;
	}

	build_argv(&a, cfg, vm);
	pid_t pid = cap_jail_spawn(vm->jail, a.v, logfd, fds, nfds, &vm->pidfd, err);
	if (pid < 0) {
		r = pid;
		goto fail;
	}
	vm->pid = pid;
	t->spawned = cap_now_ns();
	/* QEMU holds its own copies now. */
	close_fds(fds, nfds);
	close(logfd);
	logfd = -1;

	if ((r = connect_unix(vm->owned_qmp_path, vm, &vm->qmp_fd, err)) < 0 ||
	    (r = qmp_handshake(vm, err)) < 0)
		goto fail;
	t->monitor = cap_now_ns();
	if (cfg->restore_state) {
		if ((r = restore(vm, cfg, err)) < 0)
			goto fail;
		t->restored = cap_now_ns();
	}
	/* A snapshot being sealed never runs: no agent, no cont. */
	if (!cfg->restore_full && (r = connect_unix(vm->owned_agent_path, vm, &vm->agent_fd, err)) < 0)
		goto fail;
	/* A restored guest runs only once the agent's channel is connected,
	 * so it never sees its host missing. */
	if (cfg->restore_state && !cfg->restore_full && (r = qmp_execute(vm, "cont", err)) < 0)
		goto fail;
	t->running = cap_now_ns();
	if (cfg->unlink_sockets) {
		unlink(vm->owned_qmp_path);
		unlink(vm->owned_agent_path);
	}
	argv_free(&a);
	*out = &vm->base;
	return 0;

fail:
	close_fds(fds, nfds);
	if (logfd >= 0)
		close(logfd);
	if (vm->pid > 0) {
		vm_wait(&vm->base, 200);
		vm_kill(&vm->base);
		_cleanup_free_ char *logs = logs_tail(&vm->base, 15);
		_cleanup_free_ char *said = tail_file(vm->owned_qemu_log, 15);
		char why[900];
		/* The cause first; then what QEMU said. */
		if (err && cap_qemu_log_explain(said, vm->jail && cap_jail_confined(vm->jail), why, sizeof(why))) {
			size_t used = strlen(err->msg);
			snprintf(err->msg + used, sizeof(err->msg) - used, "\n%s", why);
		}
		if (*logs && err) {
			size_t used = strlen(err->msg);
			snprintf(err->msg + used, sizeof(err->msg) - used, "\n%s", logs);
		}
	}
	argv_free(&a);
	vm_free(&vm->base);
	return r;
}

const struct cap_engine_ops cap_engine_qemu = {
	.name = "qemu",
	.identity = identity,
	.version = version,
	.wants_ram_fd = wants_ram_fd,
	.end_leftover = end_leftover,
	.start = start,
	.event_fd = event_fd,
	.io_errors = io_errors,
	.agent_fd = agent_fd,
	.exit_fd = exit_fd,
	.pid = pid_of,
	.net_control_fd = net_control_fd,
	.net_pid = net_pid,
	.net_deny = net_deny,
	.net_forward = net_forward,
	.jail_note = jail_note,
	.ram_note = ram_note,
	.wait = vm_wait,
	.exit_reason = exit_reason,
	.pause = pause_vm,
	.resume = resume,
	.save = save,
	.save_full = save_full,
	.quit = quit,
	.kill = vm_kill,
	.logs_tail = logs_tail,
	.free = vm_free,
};
