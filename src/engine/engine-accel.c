/* Choosing between KVM and TCG. A host's /dev/kvm is not enough: on PVM
 * hosts (kvm_pvm, a paravirtual KVM) the device opens but a standard
 * guest kernel fails ("KVM internal error. Suberror: 1") or crawls, so
 * KVM is used only with hardware virtualization (vmx or svm). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "engine.h"
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

/* Why KVM cannot be used here, or NULL when it can. */
static const char *kvm_problem(char *buf, size_t len)
{
	struct stat st;
	bool pvm = stat("/sys/module/kvm_pvm", &st) == 0;

	if (!cpu_has_hw_virt()) {
		if (pvm)
			snprintf(buf, len, "/dev/kvm is PVM (module kvm_pvm, a paravirtual KVM without vmx/svm), on which standard guest kernels fail");
		else if (access("/dev/kvm", F_OK) == 0)
			snprintf(buf, len, "/dev/kvm exists but the CPU has no hardware virtualization (no vmx or svm flag in /proc/cpuinfo)");
		else
			snprintf(buf, len, "the CPU has no hardware virtualization (no vmx or svm flag in /proc/cpuinfo) and there is no /dev/kvm");
		return buf;
	}
	int fd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (fd < 0) {
		snprintf(buf, len, "/dev/kvm cannot be opened: %s (load kvm_intel or kvm_amd, or add this user to the kvm group)",
			 strerror(errno));
		return buf;
	}
	close(fd);
	return NULL;
}

int cap_engine_accel_choose(enum cap_accel want, struct cap_accel_choice *out,
			    struct cap_err *err)
{
	char why[400];
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

	const char *problem = kvm_problem(why, sizeof(why));
	switch (want) {
	case CAP_ACCEL_KVM:
		if (problem)
			return cap_err_set(err, ENODEV, "%s asks for KVM, but %s; refusing to start (TCG would not be a security boundary)",
					   source, problem);
		out->accel = CAP_ACCEL_KVM;
		snprintf(out->reason, sizeof(out->reason), "KVM requested by %s and usable", source);
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
		snprintf(out->reason, sizeof(out->reason), "hardware virtualization present and /dev/kvm opens");
	}
	return 0;
}
