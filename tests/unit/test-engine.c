/* Unit tests of the engine table (src/engine/engine.c): engines chosen
 * by name or $CAPSULE_ENGINE, an unknown name refused with the list,
 * QEMU's identity under each accelerator and the host's under KVM
 * (engine-kvm.c, from fixed CPUID leaves and /proc/cpuinfo texts), and
 * QEMU's end_leftover on a directory whose VM is gone. No VM starts. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <unistd.h>
#include <cmocka.h>

#include "engine-kvm.h"
#include "engine-ops.h"
#include "jail-internal.h"
#include "paths.h"
#include "util.h"

#define BUSYBOX "/bin/busybox"	/* static: the jail binds it alone */

static void get_by_name_and_default(void **state)
{
	(void)state;
	const struct cap_engine_ops *e = NULL, *d = NULL;
	struct cap_err err = { 0 };
	unsetenv("CAPSULE_ENGINE");
	assert_int_equal(cap_engine_get("qemu", &e, &err), 0);
	assert_string_equal(cap_engine_name(e), "qemu");
	assert_int_equal(cap_engine_get(NULL, &d, &err), 0);
	assert_ptr_equal(d, e);	/* the default */
	setenv("CAPSULE_ENGINE", "qemu", 1);
	assert_int_equal(cap_engine_get(NULL, &d, &err), 0);
	assert_ptr_equal(d, e);
	unsetenv("CAPSULE_ENGINE");
}

static void unknown_is_refused_with_the_list(void **state)
{
	(void)state;
	const struct cap_engine_ops *e = NULL;
	struct cap_err err = { 0 };
	assert_int_equal(cap_engine_get("firecracker", &e, &err), -ENOENT);
	assert_null(e);	/* *out written only on success */
	assert_non_null(strstr(err.msg, "\"firecracker\""));
	assert_non_null(strstr(err.msg, "the engines are: qemu"));
	setenv("CAPSULE_ENGINE", "nope", 1);
	err = (struct cap_err){ 0 };
	assert_int_equal(cap_engine_get(NULL, &e, &err), -ENOENT);
	assert_non_null(strstr(err.msg, "CAPSULE_ENGINE"));
	unsetenv("CAPSULE_ENGINE");
}

/* A private cache directory for the identity's qemu-version file. */
static char *private_cache(void)
{
	char *dir = xstrdup("/tmp/test-engine-cache.XXXXXX");
	assert_non_null(mkdtemp(dir));
	setenv("CAPSULE_CACHE", dir, 1);
	return dir;
}

static void end_private_cache(char *dir)
{
	unsetenv("CAPSULE_CACHE");
	assert_int_equal(cap_remove_tree(dir), 0);
	free(dir);
}

/* The identity names the engine, so templates never cross engines. */
static void identity_names_the_engine(void **state)
{
	(void)state;
	char *cache = private_cache();
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char *id = cap_engine_identity(e, CAP_ACCEL_KVM);
	assert_true(strncmp(id, "qemu=", 5) == 0);
	free(id);
	end_private_cache(cache);
}

/* Every line "name=value", names [a-z_]+: the format engine.h promises. */
static void assert_identity_lines(const char *id)
{
	assert_true(*id);
	for (const char *p = id; *p;) {
		size_t len = strcspn(p, "\n");
		assert_int_equal(p[len], '\n');	/* ends with one */
		size_t name = strspn(p, "abcdefghijklmnopqrstuvwxyz_");
		assert_true(name > 0 && name < len && p[name] == '=');
		p += len + 1;
	}
}

static bool has_line(const char *id, const char *prefix)
{
	size_t n = strlen(prefix);
	for (const char *p = id; *p; p += strcspn(p, "\n") + 1) {
		if (strncmp(p, prefix, n) == 0)
			return true;
		if (!p[strcspn(p, "\n")])
			break;
	}
	return false;
}

/* A template never crosses accelerators: QEMU's identity under TCG
 * (-cpu max: the guest's clock) is not its identity under KVM (-cpu host:
 * the host's CPU, KVM, the kernel). Here /dev/kvm may be missing: the
 * CPU then comes from /proc/cpuinfo and KVM's API is "none (why)". */
static void identity_differs_between_accelerators(void **state)
{
	(void)state;
	char *cache = private_cache();
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char *tcg = cap_engine_identity(e, CAP_ACCEL_TCG), *kvm = cap_engine_identity(e, CAP_ACCEL_KVM);
	assert_identity_lines(tcg);
	assert_identity_lines(kvm);
	assert_string_not_equal(tcg, kvm);
	assert_true(has_line(tcg, "accel=tcg\n") && has_line(kvm, "accel=kvm\n"));
	assert_true(has_line(tcg, "tsc_mhz=") && has_line(tcg, "clock="));
	assert_false(has_line(tcg, "cpu="));	/* -cpu max is the same CPU on any host */
	assert_true(has_line(kvm, "cpu=") && has_line(kvm, "cpuid=") && has_line(kvm, "kvm_api=") &&
		    has_line(kvm, "kernel="));
	assert_false(has_line(kvm, "tsc_mhz="));
	assert_true(has_line(tcg, "qemu_version=") && has_line(kvm, "qemu_version="));
	char *again = cap_engine_identity(e, CAP_ACCEL_KVM);
	assert_string_equal(again, kvm);	/* stable from one start to the next */
	free(again);
	free(tcg);
	free(kvm);
	end_private_cache(cache);
}

/* QEMU's version line is asked once per binary and kept beside the
 * binary's identity: a line kept for this binary is used as it is, one
 * kept for another binary (an update) is asked again. */
static void qemu_version_is_kept_per_binary(void **state)
{
	(void)state;
	char *cache = private_cache();
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char *id = cap_engine_identity(e, CAP_ACCEL_TCG);
	/* The first line's value is the binary's identity. */
	char *bin = xstrndup(id + 5, strcspn(id + 5, "\n"));
	char *path = xasprintf("%s/qemu-version", cache);
	char *kept = NULL;
	assert_true(cap_read_file(path, 8192, &kept) > 0);
	assert_true(strncmp(kept, bin, strlen(bin)) == 0 && kept[strlen(bin)] == '\n');
	free(kept);
	char *fake = xasprintf("%s\nQEMU emulator version 0.0.1 (kept)\n", bin);
	assert_int_equal(cap_write_file_atomic(path, fake, strlen(fake), 0644), 0);
	char *id2 = cap_engine_identity(e, CAP_ACCEL_TCG);
	assert_true(has_line(id2, "qemu_version=QEMU emulator version 0.0.1 (kept)\n"));
	free(fake);
	fake = xstrdup("/usr/bin/another:1:2.000000000\nQEMU emulator version 0.0.2\n");
	assert_int_equal(cap_write_file_atomic(path, fake, strlen(fake), 0644), 0);
	char *id3 = cap_engine_identity(e, CAP_ACCEL_TCG);
	assert_false(has_line(id3, "qemu_version=QEMU emulator version 0.0.2"));
	free(id3);
	free(fake);
	free(id2);
	free(path);
	free(bin);
	free(id);
	end_private_cache(cache);
}

/* Leaf registers spelling text (the vendor in EBX, EDX, ECX; a brand in
 * EAX..EDX of three leaves). */
static uint32_t word(const char *s)
{
	uint32_t w;
	memcpy(&w, s, 4);
	return w;
}

/* A CPU's leaves as KVM_GET_SUPPORTED_CPUID gives them, in e (at least
 * 12 entries); the count. */
static unsigned fixed_cpu(struct cap_cpuid_entry *e, const char *vendor, uint32_t sig, const char *brand)
{
	char b[49] = { 0 };
	snprintf(b, sizeof(b), "%-48s", brand);
	unsigned n = 0;
	e[n++] = (struct cap_cpuid_entry){ 0, 0, 0, 0x10, word(vendor), word(vendor + 8), word(vendor + 4) };
	e[n++] = (struct cap_cpuid_entry){ 1, 0, 0, sig, 0x00000800, 0xfed83203, 0x178bfbff };
	e[n++] = (struct cap_cpuid_entry){ 7, 0, 1, 0, 0x219c97a9, 0x0040069c, 0x00000010 };
	e[n++] = (struct cap_cpuid_entry){ 0xb, 0, 1, 1, 1, 0x100, 0 };	/* EDX: this CPU's x2APIC ID */
	e[n++] = (struct cap_cpuid_entry){ 0xd, 0, 1, 0x207, 0x340, 0x988, 0 };
	e[n++] = (struct cap_cpuid_entry){ 0xd, 1, 1, 0xf, 0x340, 0, 0 };
	e[n++] = (struct cap_cpuid_entry){ 0x80000000, 0, 0, 0x80000021, 0, 0, 0 };
	for (int i = 0; i < 3; i++)
		e[n++] = (struct cap_cpuid_entry){ 0x80000002 + i, 0, 0, word(b + 16 * i), word(b + 16 * i + 4),
						   word(b + 16 * i + 8), word(b + 16 * i + 12) };
	e[n++] = (struct cap_cpuid_entry){ 0x80000008, 0, 0, 0x3030, 0x791ef257, 0x1f, 0 };
	e[n++] = (struct cap_cpuid_entry){ 0x8000001e, 0, 0, 0, 0x100, 0, 0 };	/* this core's IDs */
	return n;
}

/* Family, model and stepping as Linux computes them from leaf 1's EAX:
 * the extended family only for family 15, the extended model from
 * family 6 up; the brand string without its padding. */
static void cpuid_describes_the_cpu(void **state)
{
	(void)state;
	struct cap_cpuid_entry e[16];
	char d[256];
	unsigned n = fixed_cpu(e, "AuthenticAMD", 0x00a00f11, "AMD EPYC 7B13 64-Core Processor");
	cap_cpuid_describe(e, n, d, sizeof(d));
	assert_string_equal(d, "AuthenticAMD family 25 model 1 stepping 1 (AMD EPYC 7B13 64-Core Processor)");
	n = fixed_cpu(e, "GenuineIntel", 0x00050657, "  Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz");
	cap_cpuid_describe(e, n, d, sizeof(d));
	assert_string_equal(d, "GenuineIntel family 6 model 85 stepping 7 (Intel(R) Xeon(R) Platinum 8259CL CPU @ 2.50GHz)");
	n = fixed_cpu(e, "GenuineIntel", 0x00000f29, "");	/* a Pentium 4: family 15, model 2 */
	cap_cpuid_describe(e, n, d, sizeof(d));
	assert_string_equal(d, "GenuineIntel family 15 model 2 stepping 9");
	/* Without the brand leaves (0x80000000's EAX below 0x80000004). */
	n = fixed_cpu(e, "AuthenticAMD", 0x00a00f11, "AMD EPYC");
	e[6].eax = 0x80000001;
	cap_cpuid_describe(e, n, d, sizeof(d));
	assert_string_equal(d, "AuthenticAMD family 25 model 1 stepping 1");
	cap_cpuid_describe(e + 2, 1, d, sizeof(d));
	assert_string_equal(d, "unknown");
}

/* The hash keeps what a restored guest depends on and nothing that
 * changes with the CPU that asked: the order of the entries, leaf 1's
 * APIC ID, the topology leaves. A feature bit, an XSAVE size, the
 * physical address width change it. */
static void cpuid_hash_sees_features_not_cores(void **state)
{
	(void)state;
	struct cap_cpuid_entry e[16], f[16];
	char a[65], b[65];
	unsigned n = fixed_cpu(e, "AuthenticAMD", 0x00a00f11, "AMD EPYC 7B13 64-Core Processor");
	cap_cpuid_hash(e, n, a);
	assert_int_equal(strlen(a), 64);
	/* Reversed, on another core (APIC IDs, x2APIC ID, core IDs). */
	for (unsigned i = 0; i < n; i++)
		f[i] = e[n - 1 - i];
	for (unsigned i = 0; i < n; i++) {
		if (f[i].function == 1)
			f[i].ebx |= 0x07000000;
		if (f[i].function == 0xb)
			f[i].edx = 7;
		if (f[i].function == 0x8000001e)
			f[i].eax = 7, f[i].ebx = 0x103;
	}
	cap_cpuid_hash(f, n, b);
	assert_string_equal(a, b);
	/* One feature less (AVX2, leaf 7 EBX bit 5). */
	memcpy(f, e, sizeof(f));
	f[2].ebx &= ~(1u << 5);
	cap_cpuid_hash(f, n, b);
	assert_string_not_equal(a, b);
	/* A larger XSAVE area (leaf 0xd). */
	memcpy(f, e, sizeof(f));
	f[4].ecx = 0xa88;
	cap_cpuid_hash(f, n, b);
	assert_string_not_equal(a, b);
	/* Another physical address width (leaf 0x80000008 EAX). */
	memcpy(f, e, sizeof(f));
	f[10].eax = 0x3028;
	cap_cpuid_hash(f, n, b);
	assert_string_not_equal(a, b);
	/* Another stepping (leaf 1 EAX). */
	memcpy(f, e, sizeof(f));
	f[1].eax = 0x00a00f12;
	cap_cpuid_hash(f, n, b);
	assert_string_not_equal(a, b);
	/* A leaf fewer (leaf 0); the topology leaf 0x8000001e fewer is the same. */
	cap_cpuid_hash(e + 1, n - 1, b);
	assert_string_not_equal(a, b);
	cap_cpuid_hash(e, n - 1, b);
	assert_string_equal(a, b);
}

static const char cpuinfo_amd[] =
	"processor\t: 0\n"
	"vendor_id\t: AuthenticAMD\n"
	"cpu family\t: 25\n"
	"model\t\t: 1\n"
	"model name\t: AMD EPYC 7B13 64-Core Processor\n"
	"stepping\t: 1\n"
	"microcode\t: 0xa001173\n"
	"cpu MHz\t\t: 2449.998\n"
	"flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep avx2 svm\n"
	"bugs\t\t: sysret_ss_attrs spectre_v1\n"
	"\n"
	"processor\t: 1\n"
	"vendor_id\t: GenuineIntel\n"
	"cpu family\t: 6\n"
	"model\t\t: 85\n"
	"stepping\t: 7\n"
	"flags\t\t: fpu\n"
	"\n";

/* From /proc/cpuinfo (when KVM does not answer): the first processor's
 * fields, described as the CPUID leaves are; its flags hashed. */
static void cpuinfo_describes_the_first_cpu(void **state)
{
	(void)state;
	char d[256], h[65], h2[65];
	assert_int_equal(cap_cpuinfo_describe(cpuinfo_amd, d, sizeof(d), h), 0);
	assert_string_equal(d, "AuthenticAMD family 25 model 1 stepping 1 (AMD EPYC 7B13 64-Core Processor)");
	struct cap_cpuid_entry e[16];
	unsigned n = fixed_cpu(e, "AuthenticAMD", 0x00a00f11, "AMD EPYC 7B13 64-Core Processor");
	char c[256];
	cap_cpuid_describe(e, n, c, sizeof(c));
	assert_string_equal(c, d);
	/* Another flag, another hash; the MHz line does not count. */
	char *other = xstrdup(cpuinfo_amd);
	memcpy(strstr(other, "avx2"), "avx3", 4);
	assert_int_equal(cap_cpuinfo_describe(other, d, sizeof(d), h2), 0);
	assert_string_not_equal(h, h2);
	free(other);
	other = xstrdup(cpuinfo_amd);
	memcpy(strstr(other, "2449.998"), "1500.000", 8);
	assert_int_equal(cap_cpuinfo_describe(other, d, sizeof(d), h2), 0);
	assert_string_equal(h, h2);
	free(other);
	assert_int_equal(cap_cpuinfo_describe("processor\t: 0\nvendor_id\t: X\n", d, sizeof(d), h2), -ENOENT);
}

/* The identity lines of a host, from either source, and what a change of
 * CPU, KVM or kernel does to them. */
static void kvm_identity_names_cpu_kvm_and_kernel(void **state)
{
	(void)state;
	struct cap_cpuid_entry e[16];
	unsigned n = fixed_cpu(e, "AuthenticAMD", 0x00a00f11, "AMD EPYC 7B13 64-Core Processor");
	char hex[65];
	cap_cpuid_hash(e, n, hex);
	struct cap_kvm_host h = { .cpuid = e, .ncpuid = n, .api_version = 12, .kernel_release = "6.1.0-18-amd64",
				  .kernel_version = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)" };
	char *id = cap_kvm_identity_format(&h);
	char *want = xasprintf("cpu=AuthenticAMD family 25 model 1 stepping 1 (AMD EPYC 7B13 64-Core Processor)\n"
			       "cpuid=kvm:%s\nkvm_api=12\n"
			       "kernel=6.1.0-18-amd64 #1 SMP PREEMPT_DYNAMIC Debian 6.1.76-1 (2024-02-01)\n", hex);
	assert_string_equal(id, want);
	assert_identity_lines(id);
	/* Each change shows. */
	struct cap_kvm_host g = h;
	g.kernel_version = "#1 SMP PREEMPT_DYNAMIC Debian 6.1.85-1 (2024-04-11)";
	char *other = cap_kvm_identity_format(&g);
	assert_string_not_equal(id, other);
	free(other);
	g = h;
	g.api_version = 13;
	other = cap_kvm_identity_format(&g);
	assert_string_not_equal(id, other);
	free(other);
	e[1].eax = 0x00a00f12;	/* the same model, another stepping */
	other = cap_kvm_identity_format(&h);
	assert_true(strstr(other, "stepping 2") != NULL);
	assert_string_not_equal(id, other);
	free(other);
	/* No KVM: /proc/cpuinfo stands in, and says so; nothing at all. */
	g = (struct cap_kvm_host){ .cpuinfo = cpuinfo_amd, .api_version = -1, .why = "/dev/kvm: No such file or directory",
				   .kernel_release = "6.1.0-18-amd64", .kernel_version = "#1" };
	other = cap_kvm_identity_format(&g);
	assert_true(has_line(other, "cpu=AuthenticAMD family 25 model 1 stepping 1 (AMD EPYC 7B13 64-Core Processor)\n"));
	assert_true(has_line(other, "cpuid=cpuinfo:"));
	assert_true(has_line(other, "kvm_api=none (/dev/kvm: No such file or directory)\n"));
	assert_identity_lines(other);
	free(other);
	g.cpuinfo = NULL;
	other = cap_kvm_identity_format(&g);
	assert_true(has_line(other, "cpu=unknown\n") && has_line(other, "cpuid=none\n"));
	free(other);
	free(want);
	free(id);
}

/* A leftover whose process is gone (or is not that VM's: this test's own
 * pid) is not killed; the sockets it left are removed, nothing else. */
static void end_leftover_spares_other_processes(void **state)
{
	(void)state;
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char dir[] = "/tmp/test-engine.XXXXXX";
	assert_non_null(mkdtemp(dir));
	const char *files[] = { "qmp.sock", "agent.sock", "console.log" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(files); i++) {
		char *p = xasprintf("%s/%s", dir, files[i]);
		assert_int_equal(cap_write_file_atomic(p, "x", 1, 0600), 0);
		free(p);
	}
	assert_int_equal(cap_engine_end_leftover(e, dir, getpid()), 0);
	assert_int_equal(cap_engine_end_leftover(e, dir, 0), 0);
	char *p = xasprintf("%s/qmp.sock", dir);
	assert_int_not_equal(access(p, F_OK), 0);
	free(p);
	p = xasprintf("%s/agent.sock", dir);
	assert_int_not_equal(access(p, F_OK), 0);
	free(p);
	p = xasprintf("%s/console.log", dir);
	assert_int_equal(access(p, F_OK), 0);
	free(p);
	assert_int_equal(cap_remove_tree(dir), 0);
}

/* A process that looks like the VM of dir (QEMU's name, -name
 * guest=<dir>) is killed and reported; one of another directory is not. */
static pid_t fake_vm(const char *dir)
{
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char *guest = xasprintf("guest=%s", dir);
		char *argv[] = { "/usr/bin/qemu-system-x86_64", "-c", "while :; do sleep 1; done", "-name", guest, NULL };
		execv("/bin/sh", argv);
		_exit(127);
	}
	/* Until it runs sh (its cmdline is QEMU's name). */
	char *path = xasprintf("/proc/%d/cmdline", (int)pid);
	for (int i = 0; i < 200; i++) {
		char *s = NULL;
		ssize_t n = cap_read_file(path, 4096, &s);
		bool ready = n > 0 && strstr(s, "qemu-system-x86_64");
		free(s);
		if (ready)
			break;
		usleep(5000);
	}
	free(path);
	return pid;
}

static void end_leftover_kills_the_vm_of_that_directory(void **state)
{
	(void)state;
	const struct cap_engine_ops *e;
	assert_int_equal(cap_engine_get("qemu", &e, NULL), 0);
	char dir[] = "/tmp/test-engine.XXXXXX";
	assert_non_null(mkdtemp(dir));
	pid_t pid = fake_vm(dir);
	int status;
	/* Another directory's VM is left alone. */
	assert_int_equal(cap_engine_end_leftover(e, "/tmp/elsewhere", pid), 0);
	assert_int_equal(waitpid(pid, &status, WNOHANG), 0);
	assert_int_equal(cap_engine_end_leftover(e, dir, pid), 1);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	assert_int_equal(cap_remove_tree(dir), 0);
}

/* The copier (as root) opens the jail's copy, /mem/ram below the
 * program's root, whose folder the jailed program owns: a link planted
 * at any level, another file type, another owner or a hard link are
 * refused; a temporary directory stands in for the root. */
static void jail_copy_is_opened_without_links(void **state)
{
	(void)state;
	char dir[] = "/tmp/test-engine-jail.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char *mem = xasprintf("%s/mem", dir), *ram = xasprintf("%s/mem/ram", dir);
	char *target = xasprintf("%s/target", dir), *other = xasprintf("%s/other", dir);
	assert_int_equal(mkdir(mem, 0700), 0);
	int t = open(target, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	int root = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
	assert_true(root >= 0);
	uid_t me = geteuid();

	/* The file itself a link (to a host file): refused, target untouched. */
	assert_int_equal(symlink(target, ram), 0);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me), -ELOOP);
	unlink(ram);
	/* The folder a link (to one holding a file of that name). */
	assert_int_equal(mkdir(other, 0700), 0);
	char *oram = xasprintf("%s/ram", other);
	t = open(oram, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	assert_int_equal(rmdir(mem), 0);
	assert_int_equal(symlink(other, mem), 0);
	int r = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(r == -ENOTDIR || r == -ELOOP);
	unlink(mem);
	assert_int_equal(mkdir(mem, 0700), 0);
	/* A FIFO (opened without blocking, refused), a directory. */
	assert_int_equal(mkfifo(ram, 0600), 0);
	r = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(r == -ENXIO || r == -EINVAL);
	unlink(ram);
	assert_int_equal(mkdir(ram, 0700), 0);
	assert_true(jail_root_open_copy(root, "/mem/ram", me) < 0);
	rmdir(ram);
	/* A hard link to another file, another owner. */
	assert_int_equal(link(target, ram), 0);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me), -EPERM);
	unlink(ram);
	t = open(ram, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(t >= 0);
	close(t);
	assert_int_equal(jail_root_open_copy(root, "/mem/ram", me + 1), -EPERM);
	assert_int_equal(jail_root_open_copy(root, "/mem/../target", me), -EINVAL);
	assert_int_equal(jail_root_open_copy(root, "", me), -EINVAL);
	/* The real thing: a regular file of its owner, open for writing. */
	int fd = jail_root_open_copy(root, "/mem/ram", me);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), 1);
	close(fd);
	struct stat st;
	assert_int_equal(stat(target, &st), 0);
	assert_int_equal(st.st_size, 0);
	close(root);
	assert_int_equal(cap_remove_tree(dir), 0);
	free(oram);
	free(mem);
	free(ram);
	free(target);
	free(other);
}

/* A character device node like devtmpfs's /dev/kvm without udev (root's,
 * group root, 0600), with /dev/zero's numbers, in a new temporary folder
 * *dir; its path (new string). */
static char *private_zero(char *dir)
{
	assert_non_null(mkdtemp(dir));
	assert_int_equal(chmod(dir, 0755), 0);	/* only the node keeps others out */
	char *dev = xasprintf("%s/kvm", dir);
	assert_int_equal(mknod(dev, S_IFCHR | 0600, makedev(1, 5)), 0);
	assert_int_equal(chown(dev, 0, 0), 0);
	assert_int_equal(chmod(dev, 0600), 0);
	return dev;
}

/* The value of field (e.g. "Groups:") in /proc/PID/status, spaces
 * trimmed; new string, NULL when there is none. */
static char *status_field(pid_t pid, const char *field)
{
	char *path = xasprintf("/proc/%d/status", (int)pid), *s = NULL, *v = NULL;
	if (cap_read_file(path, 1u << 16, &s) > 0) {
		char *at = strstr(s, field);
		if (at) {
			at += strlen(field);
			at += strspn(at, " \t");
			size_t n = strcspn(at, "\n");
			while (n && (at[n - 1] == ' ' || at[n - 1] == '\t'))
				n--;
			v = xstrndup(at, n);
		}
	}
	free(s);
	free(path);
	return v;
}

/* Issue 31: a jailed program opens its device read-write whatever the
 * host's node's owner, group and mode. The jail used to bind the host's
 * node and give its user the node's group: for a root:root 0600 node
 * (devtmpfs's /dev/kvm without udev) that was gid 0, and the open still
 * failed. Now it sees a node of its own (its UID and GID, 0600, the
 * host's major:minor) and holds no supplementary group at all. */
static void jail_makes_its_own_device_node(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();	/* the jail needs root */
	char dir[] = "/tmp/test-engine-dev.XXXXXX";
	char *dev = private_zero(dir);
	char *log = xasprintf("%s/log", dir);
	int logfd = open(log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	assert_true(logfd >= 0);
	const char *devs[] = { dev };
	struct cap_jail_spec spec = {
		.exe = BUSYBOX, .devices = devs, .ndevices = 1,
		.memory_max = 64u << 20, .pids_max = 16, .cpus = 1,
	};
	unsetenv("CAPSULE_JAIL");
	unsetenv("CAPSULE_REQUIRE_JAIL");
	struct cap_jail *j = NULL;
	struct cap_err err = { 0 };
	assert_int_equal(cap_jail_new(&spec, &j, &err), 0);
	assert_true(cap_jail_confined(j));
	char *script = xasprintf(BUSYBOX " stat -c 'node %%u:%%g %%a %%t:%%T' %s; "
				 BUSYBOX " head -c 4 %s | " BUSYBOX " od -An -tx1 | " BUSYBOX " tr -d ' ' && "
				 "echo x >%s && echo wrote; echo done; exec " BUSYBOX " sleep 30",
				 dev, dev, dev);
	char *argv[] = { "sh", "-c", script, NULL };
	int pidfd = -1;
	pid_t pid = cap_jail_spawn(j, argv, logfd, NULL, 0, &pidfd, &err);
	if (pid < 0)
		fail_msg("spawn: %s", err.msg);
	close(logfd);
	char *out = NULL;
	for (int i = 0; i < 500; i++) {
		free(out);
		out = NULL;
		if (cap_read_file(log, 4096, &out) > 0 && strstr(out, "done\n"))
			break;
		usleep(10000);
	}
	char *groups = status_field(pid, "Groups:");
	char *want = xasprintf("node %u:%u 600 1:5\n00000000\nwrote\ndone\n", (unsigned)cap_jail_uid(j), (unsigned)cap_jail_uid(j));
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	close(pidfd);
	cap_jail_free(j);
	assert_non_null(out);
	assert_string_equal(out, want);
	assert_non_null(groups);
	assert_string_equal(groups, "");
	/* The host's node is untouched. */
	struct stat st;
	assert_int_equal(stat(dev, &st), 0);
	assert_true(st.st_uid == 0 && st.st_gid == 0 && (st.st_mode & 07777) == 0600);
	assert_int_equal(cap_remove_tree(dir), 0);
	free(want);
	free(groups);
	free(out);
	free(script);
	free(log);
	free(dev);
}

/* A device that is not a character device is refused, naming it. */
static void jail_refuses_what_is_not_a_char_device(void **state)
{
	(void)state;
	char dir[] = "/tmp/test-engine-dev.XXXXXX";
	assert_non_null(mkdtemp(dir));
	char *file = xasprintf("%s/file", dir), *missing = xasprintf("%s/missing", dir);
	assert_int_equal(cap_write_file_atomic(file, "x", 1, 0600), 0);
	const char *cases[] = { file, dir, missing };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(cases); i++) {
		const char *devs[] = { cases[i] };
		struct cap_jail_spec spec = { .exe = BUSYBOX, .devices = devs, .ndevices = 1 };
		struct cap_jail *j = NULL;
		struct cap_err err = { 0 };
		int r = cap_jail_new(&spec, &j, &err);
		assert_true(r < 0);
		assert_null(j);
		assert_non_null(strstr(err.msg, cases[i]));
		assert_non_null(strstr(err.msg, i < 2 ? "not a character device" : "No such file"));
	}
	assert_int_equal(cap_remove_tree(dir), 0);
	free(file);
	free(missing);
}

/* A probe's use of the device runs as a jail's user with no group. */
static int use_as_jail_user(int fd)
{
	(void)fd;
	return geteuid() >= 1900000000u && getgroups(0, NULL) == 0 ? 0 : -EPERM;
}

static int use_not_what_was_asked(int fd)
{
	(void)fd;
	return -ENOTTY;
}

/* What doctor and the choice of accelerator ask (cap_jail_device_probe):
 * whether the VM's program could open a device. Jailed, a root:root 0600
 * node opens (the jail makes its own); not jailed, it opens for root and
 * not for another user, whose failure says so. */
static void device_probe_tries_what_the_program_would(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();
	char dir[] = "/tmp/test-engine-dev.XXXXXX";
	char *dev = private_zero(dir);
	char *file = xasprintf("%s/file", dir), *missing = xasprintf("%s/missing", dir);
	assert_int_equal(cap_write_file_atomic(file, "x", 1, 0600), 0);
	char detail[600];
	bool confined = false;
	unsetenv("CAPSULE_JAIL");
	assert_int_equal(cap_jail_device_probe(dev, NULL, &confined, detail, sizeof(detail)), 0);
	assert_true(confined);
	assert_non_null(strstr(detail, "its own node"));
	assert_non_null(strstr(detail, "1:5"));
	assert_int_equal(cap_jail_device_probe(dev, use_as_jail_user, &confined, detail, sizeof(detail)), 0);
	/* A host whose umask is 077 makes the jail's directories 0700: the
	 * jail's user opens the node from its root, as the program does
	 * after pivot_root, not through the host's directories. */
	struct stat run;
	assert_int_equal(stat("/run/capsule", &run), 0);
	assert_int_equal(chmod("/run/capsule", 0700), 0);
	int r = cap_jail_device_probe(dev, use_as_jail_user, &confined, detail, sizeof(detail));
	assert_int_equal(chmod("/run/capsule", run.st_mode & 07777), 0);
	if (r < 0)
		print_message("# %s\n", detail);
	assert_int_equal(r, 0);
	assert_int_equal(cap_jail_device_probe(dev, use_not_what_was_asked, &confined, detail, sizeof(detail)), -ENOTTY);
	assert_non_null(strstr(detail, "opens, but does not answer as expected"));
	assert_int_equal(cap_jail_device_probe(missing, NULL, &confined, detail, sizeof(detail)), -ENOENT);
	assert_non_null(strstr(detail, missing));
	assert_int_equal(cap_jail_device_probe(file, NULL, &confined, detail, sizeof(detail)), -ENODEV);
	assert_non_null(strstr(detail, "not a character device"));
	/* Without the jail (a debug setting): the host's node, as root. */
	setenv("CAPSULE_JAIL", "0", 1);
	assert_int_equal(cap_jail_device_probe(dev, NULL, &confined, detail, sizeof(detail)), 0);
	assert_false(confined);
	unsetenv("CAPSULE_JAIL");
	/* As another user, no jail: the host's 0600 node does not open. */
	int p[2];
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		close(p[0]);
		if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
			_exit(1);
		bool c = true;
		char d[600];
		int r = cap_jail_device_probe(dev, NULL, &c, d, sizeof(d));
		dprintf(p[1], "%d %d %s", r, c, d);
		_exit(0);
	}
	close(p[1]);
	char got[700] = "";
	assert_true(read(p[0], got, sizeof(got) - 1) > 0);
	close(p[0]);
	waitpid(pid, NULL, 0);
	char *want = xasprintf("%d 0 opening %s as uid 65534 (no jail): %s", -EACCES, dev, strerror(EACCES));
	assert_string_equal(got, want);
	assert_int_equal(cap_remove_tree(dir), 0);
	free(want);
	free(file);
	free(missing);
	free(dev);
}

/* What a user is told when a VM's program cannot open /dev/kvm (a
 * stand-in node here): jailed, that the host's permissions are not the
 * cause and what is; unjailed, the node's mode and owners, the group or
 * udev rule to add, or root; a missing node or driver, the module. */
static void kvm_advice_says_why_and_what_to_do(void **state)
{
	(void)state;
	if (geteuid() != 0)
		skip();	/* makes a device node */
	char dir[] = "/tmp/test-engine-dev.XXXXXX";
	char *dev = private_zero(dir);
	char buf[1000];
	unsetenv("CAPSULE_JAIL");
	assert_ptr_equal(cap_engine_kvm_advice(dev, EACCES, true, buf, sizeof(buf)), buf);
	assert_non_null(strstr(buf, "the jail makes a"));
	assert_non_null(strstr(buf, "(1:5, its user's, mode 0600)"));
	assert_non_null(strstr(buf, "not the cause"));
	assert_non_null(strstr(buf, "device cgroup"));
	cap_engine_kvm_advice(dev, EACCES, false, buf, sizeof(buf));
	assert_non_null(strstr(buf, "(mode 0600, owner 0, group 0)"));
	assert_non_null(strstr(buf, "udev rule"));
	assert_non_null(strstr(buf, "run capsule as root, where the jail makes"));
	/* A group that may read and write it: join that group. */
	assert_int_equal(chown(dev, 0, 0), 0);
	struct group *g = getgrnam("disk");
	if (g) {
		assert_int_equal(chown(dev, 0, g->gr_gid), 0);
		assert_int_equal(chmod(dev, 0660), 0);
		cap_engine_kvm_advice(dev, EACCES, false, buf, sizeof(buf));
		assert_non_null(strstr(buf, "to group disk (usermod -aG disk "));
	}
	cap_engine_kvm_advice(dev, ENOTTY, true, buf, sizeof(buf));
	assert_non_null(strstr(buf, "(1:5) is not KVM's device"));
	cap_engine_kvm_advice(dev, ENXIO, true, buf, sizeof(buf));
	assert_non_null(strstr(buf, "no KVM driver answers"));
	assert_non_null(strstr(buf, "modprobe kvm_intel or kvm_amd"));
	char *missing = xasprintf("%s/missing", dir);
	cap_engine_kvm_advice(missing, EACCES, true, buf, sizeof(buf));
	assert_non_null(strstr(buf, "there is no "));
	assert_non_null(strstr(buf, "modprobe"));
	assert_int_equal(cap_remove_tree(dir), 0);
	free(missing);
	free(dev);
}

/* QEMU's own "Could not access KVM kernel module" becomes a cause and
 * what to do; a log without it gets nothing. */
static void qemu_log_kvm_failure_is_explained(void **state)
{
	(void)state;
	char buf[1000], want[1000];
	const char *log = "qemu-system-x86_64: -accel kvm: Could not access KVM kernel module: Permission denied\n"
			  "qemu-system-x86_64: -accel kvm: failed to initialize kvm: Permission denied\n";
	assert_ptr_equal(cap_qemu_log_explain(log, true, buf, sizeof(buf)), buf);
	char advice[700];
	cap_engine_kvm_advice("/dev/kvm", EACCES, true, advice, sizeof(advice));
	snprintf(want, sizeof(want), "QEMU could not open /dev/kvm (Permission denied): %s", advice);
	assert_string_equal(buf, want);
	assert_non_null(cap_qemu_log_explain("Could not access KVM kernel module: Something new\n", false, buf, sizeof(buf)));
	assert_string_equal(buf, "QEMU could not open /dev/kvm (Something new): see `capsule doctor`");
	assert_non_null(cap_qemu_log_explain("kvm version too old\nqemu-system-x86_64: -accel kvm: failed to initialize kvm: Inappropriate ioctl for device\n",
					     true, buf, sizeof(buf)));
	assert_true(strncmp(buf, "QEMU's /dev/kvm did not answer as KVM: ", 39) == 0);
	assert_null(cap_qemu_log_explain("qemu-system-x86_64: -drive: file not found\n", true, buf, sizeof(buf)));
	assert_null(cap_qemu_log_explain("", true, buf, sizeof(buf)));
	assert_null(cap_qemu_log_explain(NULL, true, buf, sizeof(buf)));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(get_by_name_and_default),
		cmocka_unit_test(unknown_is_refused_with_the_list),
		cmocka_unit_test(identity_names_the_engine),
		cmocka_unit_test(identity_differs_between_accelerators),
		cmocka_unit_test(qemu_version_is_kept_per_binary),
		cmocka_unit_test(cpuid_describes_the_cpu),
		cmocka_unit_test(cpuid_hash_sees_features_not_cores),
		cmocka_unit_test(cpuinfo_describes_the_first_cpu),
		cmocka_unit_test(kvm_identity_names_cpu_kvm_and_kernel),
		cmocka_unit_test(end_leftover_spares_other_processes),
		cmocka_unit_test(end_leftover_kills_the_vm_of_that_directory),
		cmocka_unit_test(jail_copy_is_opened_without_links),
		cmocka_unit_test(jail_makes_its_own_device_node),
		cmocka_unit_test(jail_refuses_what_is_not_a_char_device),
		cmocka_unit_test(device_probe_tries_what_the_program_would),
		cmocka_unit_test(kvm_advice_says_why_and_what_to_do),
		cmocka_unit_test(qemu_log_kvm_failure_is_explained),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
