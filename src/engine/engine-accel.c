/* Choosing between KVM and TCG. A host's /dev/kvm is not enough: on PVM
 * hosts (kvm_pvm, a paravirtual KVM) the device opens but a standard
 * guest kernel fails ("KVM internal error. Suberror: 1") or crawls, so
 * KVM is used only with hardware virtualization (vmx or svm), and only
 * when the VM's program could open /dev/kvm (cap_jail_device_probe). */
#include <errno.h>
#include <pthread.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/kvm.h>
#include <pwd.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>
#include <unistd.h>

#include "engine-ops.h"
#include "paths.h"
#include "util.h"

int cap_engine_accel_parse(const char *s, enum cap_accel *out)
{
	if (strcmp(s, "auto") == 0)
		*out = CAP_ACCEL_AUTO;
	else if (strcmp(s, "kvm") == 0)
		*out = CAP_ACCEL_KVM;
	else if (strcmp(s, "tcg") == 0)
		*out = CAP_ACCEL_TCG;
	else
		return -EINVAL;
	return 0;
}

const char *cap_engine_accel_name(enum cap_accel a)
{
	return a == CAP_ACCEL_KVM ? "kvm" : a == CAP_ACCEL_TCG ? "tcg" : "auto";
}

static bool cpu_has_hw_virt(void)
{
	char *s = NULL;
	if (cap_read_file("/proc/cpuinfo", 16u << 20, &s) < 0)
		return false;
	bool found = false;
	char *line_save = NULL;
	for (char *line = strtok_r(s, "\n", &line_save); line && !found; line = strtok_r(NULL, "\n", &line_save)) {
		if (strncmp(line, "flags", 5) != 0)
			continue;
		found = strstr(line, " vmx") || strstr(line, " svm");
		break;
	}
	free(s);
	return found;
}

#define KVM_DEV "/dev/kvm"

/* Why the VM's program is without the jail, for a message. */
static const char *why_unconfined(void)
{
	const char *v = getenv("CAPSULE_JAIL");
	return v && strcmp(v, "0") == 0 ? "CAPSULE_JAIL=0, a debug setting" : "capsule is not root";
}

const char *cap_engine_kvm_advice(const char *dev, int e, bool confined, char *buf, size_t len)
{
	static const char load[] = "load the KVM module for this CPU (modprobe kvm_intel or kvm_amd) and check that virtualization is enabled in the firmware";
	struct stat st;
	bool have = stat(dev, &st) == 0;
	if (e == ENOENT || !have) {
		snprintf(buf, len, "there is no %s: %s", dev, load);
	} else if (e == ENXIO || e == ENODEV) {
		snprintf(buf, len, "no KVM driver answers %s: %s", dev, load);
	} else if (e == ENOTTY) {
		snprintf(buf, len, "%s (%u:%u) is not KVM's device (it does not answer KVM_GET_API_VERSION): remove what is at that path and %s",
			 dev, major(st.st_rdev), minor(st.st_rdev), load);
	} else if ((e == EACCES || e == EPERM) && confined) {
		unsigned ma = major(st.st_rdev), mi = minor(st.st_rdev);
		snprintf(buf, len, "the jail makes a %s node of its own (%u:%u, its user's, mode 0600), so the host node's owner, group and mode are not the cause: "
			 "something above them refuses it (a device cgroup, a container without that device or CAP_MKNOD, or a security module such as AppArmor or SELinux); "
			 "allow character device %u:%u to capsule there, or run capsule on the host itself", dev, ma, mi, ma, mi);
	} else if (e == EACCES || e == EPERM) {
		/* The program opens the host's node as capsule's user. */
		char user[64] = "", name[64] = "", what[300];
		struct passwd pw, *pwp = NULL;
		struct group gr, *grp = NULL;
		char pbuf[2048], gbuf[4096];
		if (getpwuid_r(geteuid(), &pw, pbuf, sizeof(pbuf), &pwp) == 0 && pwp)
			snprintf(user, sizeof(user), "%s", pw.pw_name);
		else
			snprintf(user, sizeof(user), "%u", (unsigned)geteuid());
		if (st.st_gid != 0 && getgrgid_r(st.st_gid, &gr, gbuf, sizeof(gbuf), &grp) == 0 && grp)
			snprintf(name, sizeof(name), "%s", gr.gr_name);
		if (*name && (st.st_mode & 0060) == 0060)
			snprintf(what, sizeof(what), "add %s to group %s (usermod -aG %s %s, then log in again)", user, name, name, user);
		else
			snprintf(what, sizeof(what), "give %s a group of its own with a udev rule (KERNEL==\"kvm\", GROUP=\"kvm\", MODE=\"0660\", then udevadm trigger) and add %s to it",
				 dev, user);
		snprintf(buf, len, "without the jail (%s) QEMU opens the host's %s (mode %04o, owner %u, group %u) as this user (uid %u), which may not: "
			 "%s; or run capsule as root, where the jail makes a %s node of its own for each VM",
			 why_unconfined(), dev, (unsigned)(st.st_mode & 07777), (unsigned)st.st_uid, (unsigned)st.st_gid,
			 (unsigned)geteuid(), what, dev);
	} else {
		snprintf(buf, len, "%s cannot be opened: %s", dev, strerror(e));
	}
	return buf;
}

/* Whether fd is KVM's: it answers KVM_GET_API_VERSION with the only
 * version there is (12), as QEMU asks first. 0, or -ENOTTY. */
static int kvm_answers(int fd)
{
	int v = ioctl(fd, KVM_GET_API_VERSION, 0);
	return v == KVM_API_VERSION ? 0 : v < 0 && errno != ENOTTY && errno != EINVAL ? -errno : -ENOTTY;
}

/* Why KVM cannot be used here, or NULL when it can, with what was found
 * in ok. What counts is whether the VM's program could open /dev/kvm:
 * the jail's user on the node the jail makes, or capsule's own user
 * without the jail; never root on the host's node. */
static const char *kvm_problem(char *buf, size_t len, char *ok, size_t oklen)
{
	struct stat st;
	bool pvm = stat("/sys/module/kvm_pvm", &st) == 0;

	if (!cpu_has_hw_virt()) {
		if (pvm)
			snprintf(buf, len, KVM_DEV " is PVM (module kvm_pvm, a paravirtual KVM without vmx/svm), on which standard guest kernels fail");
		else if (access(KVM_DEV, F_OK) == 0)
			snprintf(buf, len, KVM_DEV " exists but the CPU has no hardware virtualization (no vmx or svm flag in /proc/cpuinfo)");
		else
			snprintf(buf, len, "the CPU has no hardware virtualization (no vmx or svm flag in /proc/cpuinfo) and there is no " KVM_DEV);
		return buf;
	}
	if (stat(KVM_DEV, &st) < 0)
		return cap_engine_kvm_advice(KVM_DEV, ENOENT, false, buf, len);
	bool confined = false;
	char detail[300], advice[600];
	int r = cap_jail_device_probe(KVM_DEV, kvm_answers, &confined, detail, sizeof(detail));
	if (r == 0) {
		snprintf(ok, oklen, "hardware virtualization present; %s", detail);
		return NULL;
	}
	cap_engine_kvm_advice(KVM_DEV, -r, confined, advice, sizeof(advice));
	snprintf(buf, len, "a VM's QEMU could not use " KVM_DEV " (%s): %s", detail, advice);
	return buf;
}

int cap_engine_accel_choose(enum cap_accel want, struct cap_accel_choice *out,
			    struct cap_err *err)
{
	char why[1000], found[450] = "";
	const char *env = getenv("CAPSULE_ACCEL");
	const char *req = getenv("CAPSULE_REQUIRE_KVM");
	const char *source = "--accel";

	if (want == CAP_ACCEL_AUTO && env && *env) {
		if (cap_engine_accel_parse(env, &want) < 0)
			return cap_err_set(err, EINVAL, "CAPSULE_ACCEL=%s is not one of auto, kvm, tcg", env);
		source = "CAPSULE_ACCEL";
	}
	if (want == CAP_ACCEL_AUTO && req && strcmp(req, "1") == 0) {
		want = CAP_ACCEL_KVM;
		source = "CAPSULE_REQUIRE_KVM=1";
	}

	const char *problem = kvm_problem(why, sizeof(why), found, sizeof(found));
	switch (want) {
	case CAP_ACCEL_KVM:
		if (problem)
			return cap_err_set(err, ENODEV, "%s asks for KVM, but %s; refusing to start (TCG would not be a security boundary; without %s%s, capsule would use TCG)",
					   source, problem, source, strcmp(source, "--accel") == 0 ? " kvm" : strcmp(source, "CAPSULE_ACCEL") == 0 ? "=kvm" : "");
		out->accel = CAP_ACCEL_KVM;
		snprintf(out->reason, sizeof(out->reason), "KVM requested by %s and usable: %s", source, found);
		return 0;
	case CAP_ACCEL_TCG:
		out->accel = CAP_ACCEL_TCG;
		snprintf(out->reason, sizeof(out->reason), "TCG requested by %s", source);
		return 0;
	case CAP_ACCEL_AUTO:
		break;
	}
	if (problem) {
		out->accel = CAP_ACCEL_TCG;
		snprintf(out->reason, sizeof(out->reason), "KVM not used: %s", problem);
	} else {
		out->accel = CAP_ACCEL_KVM;
		snprintf(out->reason, sizeof(out->reason), "%s", found);
	}
	return 0;
}

#if defined(__x86_64__)
static inline uint64_t rdtsc(void)
{
	uint32_t lo, hi;
	__asm__ volatile("rdtsc" : "=a"(lo), "=d"(hi));
	return ((uint64_t)hi << 32) | lo;
}

/* The TSC and CLOCK_MONOTONIC_RAW read together: the tightest of a few
 * brackets, the TSC at its middle. */
static void tsc_sample(uint64_t *tsc, int64_t *ns)
{
	uint64_t best = UINT64_MAX;
	for (int i = 0; i < 5; i++) {
		struct timespec t;
		uint64_t a = rdtsc();
		clock_gettime(CLOCK_MONOTONIC_RAW, &t);
		uint64_t b = rdtsc();
		if (b - a < best) {
			best = b - a;
			*tsc = a + (b - a) / 2;
			*ns = (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
		}
	}
}

/* Over 20 ms: a few parts per million. */
static unsigned tsc_calibrate_khz(void)
{
	uint64_t t0 = 0, t1 = 0;
	int64_t n0 = 0, n1 = 0;
	tsc_sample(&t0, &n0);
	struct timespec d = { 0, 20 * 1000 * 1000 };
	while (nanosleep(&d, &d) < 0 && errno == EINTR)
		;
	tsc_sample(&t1, &n1);
	if (n1 <= n0 || t1 <= t0)
		return 0;
	return (unsigned)((double)(t1 - t0) * 1e6 / (double)(n1 - n0));
}
#endif

/* Whether the host's TSC can be the guests' clock: it ticks at one rate,
 * also in deep idle states (/proc/cpuinfo's constant_tsc and nonstop_tsc),
 * and the host's own kernel keeps it as its clock (it found it in step
 * across CPUs: a guest's vCPU threads read it on any of them). */
static bool host_tsc_usable(void)
{
	char *s = NULL;
	bool ok = false;
	if (cap_read_file("/sys/devices/system/clocksource/clocksource0/current_clocksource", 64, &s) > 0)
		ok = strncmp(s, "tsc\n", 4) == 0;
	free(s);
	s = NULL;
	if (!ok || cap_read_file("/proc/cpuinfo", 16u << 20, &s) < 0)
		return false;
	const char *flags = strstr(s, "\nflags");
	const char *end = flags ? strchr(flags + 1, '\n') : NULL;
	ok = false;
	if (flags && end) {
		_cleanup_free_ char *line = xstrndup(flags, (size_t)(end - flags));
		ok = strstr(line, " constant_tsc") && strstr(line, " nonstop_tsc");
	}
	free(s);
	return ok;
}

/* A rate the guest can be given: 100 MHz to 10 GHz. */
static bool tsc_khz_sane(unsigned long khz)
{
	return khz >= 100000 && khz <= 10000000;
}

static unsigned tsc_khz;
static pthread_once_t tsc_once = PTHREAD_ONCE_INIT;

/* Once per process; measured once per host boot (the file in the cache
 * directory keeps it for the others, 0 when the TSC is not usable). */
static void tsc_probe(void)
{
#if defined(__x86_64__)
	char boot[64] = "";
	_cleanup_free_ char *b = NULL, *cached = NULL;
	if (cap_read_file("/proc/sys/kernel/random/boot_id", 64, &b) > 0)
		snprintf(boot, sizeof(boot), "%.*s", (int)strcspn(b, "\n"), b);
	_cleanup_free_ char *dir = cap_cache_dir();
	_cleanup_free_ char *path = xasprintf("%s/host-tsc", dir);
	if (*boot && cap_read_file(path, 256, &cached) > 0) {
		size_t n = strlen(boot);
		char *end = NULL;
		if (strncmp(cached, boot, n) == 0 && cached[n] == ' ') {
			errno = 0;
			unsigned long v = strtoul(cached + n + 1, &end, 10);
			if (!errno && end != cached + n + 1 && *end == '\n' && (v == 0 || tsc_khz_sane(v))) {
				tsc_khz = (unsigned)v;
				return;
			}
		}
	}
	unsigned long v = host_tsc_usable() ? tsc_calibrate_khz() : 0;
	tsc_khz = tsc_khz_sane(v) ? (unsigned)v : 0;
	if (*boot) {
		char line[128];
		int n = snprintf(line, sizeof(line), "%s %u\n", boot, tsc_khz);
		cap_mkdir_p(dir, 0755);
		cap_write_file_atomic(path, line, (size_t)n, 0644);
	}
#endif
}

unsigned cap_engine_tsc_khz(void)
{
	const char *env = getenv("CAPSULE_GUEST_TSC");
	if (env && *env && strcmp(env, "1") != 0)
		return 0;	/* "0", "unstable": no rate (engine-qemu.c) */
	pthread_once(&tsc_once, tsc_probe);
	return tsc_khz;
}
