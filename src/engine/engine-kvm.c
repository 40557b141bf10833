/* What a VM saved under KVM depends on in its host (engine-kvm.h). A
 * guest under KVM with the host's CPU runs on what the CPU and KVM offer:
 * its kernel picked code paths for the CPU's features when it booted, and
 * its saved registers (the XSAVE area, MSRs) have the shape of that
 * CPU's. Restored where any of that differs, it may fail to load or
 * crash later; the template key therefore holds it all. */
#include <errno.h>
#include <fcntl.h>
#include <linux/kvm.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/utsname.h>
#include <unistd.h>
#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif

#include "engine-kvm.h"
#include "sha256.h"
#include "util.h"

static const struct cap_cpuid_entry *leaf(const struct cap_cpuid_entry *e, unsigned n, uint32_t function)
{
	for (unsigned i = 0; i < n; i++)
		if (e[i].function == function && e[i].index == 0)
			return &e[i];
	return NULL;
}

/* Linux's x86_family and x86_model (what /proc/cpuinfo shows). */
static unsigned family_of(uint32_t sig)
{
	unsigned f = (sig >> 8) & 0xf;
	return f == 0xf ? f + ((sig >> 20) & 0xff) : f;
}

static unsigned model_of(uint32_t sig)
{
	unsigned m = (sig >> 4) & 0xf;
	return family_of(sig) >= 0x6 ? m + (((sig >> 16) & 0xf) << 4) : m;
}

/* s without its leading and trailing blanks, at most n bytes of it, into buf. */
static void trimmed(char *buf, size_t len, const char *s, size_t n)
{
	while (n && (*s == ' ' || *s == '\t'))
		s++, n--;
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\0'))
		n--;
	snprintf(buf, len, "%.*s", (int)n, s);
}

static void describe(char *buf, size_t len, const char *vendor, unsigned family, unsigned model,
		     unsigned stepping, const char *name)
{
	snprintf(buf, len, "%s family %u model %u stepping %u%s%s%s", vendor, family, model, stepping,
		 *name ? " (" : "", name, *name ? ")" : "");
}

void cap_cpuid_describe(const struct cap_cpuid_entry *e, unsigned n, char *buf, size_t len)
{
	const struct cap_cpuid_entry *l0 = leaf(e, n, 0), *l1 = leaf(e, n, 1), *x0 = leaf(e, n, 0x80000000);
	if (!l0 || !l1) {
		snprintf(buf, len, "unknown");
		return;
	}
	char vendor[13], brand[49] = "", name[49] = "";
	memcpy(vendor, &l0->ebx, 4);
	memcpy(vendor + 4, &l0->edx, 4);
	memcpy(vendor + 8, &l0->ecx, 4);
	vendor[12] = '\0';
	for (size_t i = 0; i < 12; i++)
		if (vendor[i] < 0x20 || vendor[i] > 0x7e)
			vendor[i] = '?';
	if (x0 && x0->eax >= 0x80000004) {
		for (uint32_t f = 0; f < 3; f++) {
			const struct cap_cpuid_entry *b = leaf(e, n, 0x80000002 + f);
			if (!b)
				break;
			uint32_t r[4] = { b->eax, b->ebx, b->ecx, b->edx };
			memcpy(brand + 16 * f, r, 16);
		}
		brand[48] = '\0';
		for (size_t i = 0; brand[i]; i++)
			if (brand[i] < 0x20 || brand[i] > 0x7e)
				brand[i] = '?';
		trimmed(name, sizeof(name), brand, strlen(brand));
	}
	uint32_t sig = l1->eax;
	describe(buf, len, vendor, family_of(sig), model_of(sig), sig & 0xf, name);
}

/* Leaves of caches and topology: per core, and not the guest's. */
static bool per_core(uint32_t function)
{
	static const uint32_t skip[] = { 0x2, 0x4, 0xb, 0x18, 0x1a, 0x1f,
					 0x80000005, 0x80000006, 0x8000001d, 0x8000001e };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(skip); i++)
		if (skip[i] == function)
			return true;
	return false;
}

static int by_leaf(const void *a, const void *b)
{
	const struct cap_cpuid_entry *x = a, *y = b;
	if (x->function != y->function)
		return x->function < y->function ? -1 : 1;
	return x->index < y->index ? -1 : x->index > y->index;
}

void cap_cpuid_hash(const struct cap_cpuid_entry *e, unsigned n, char hex[65])
{
	struct cap_cpuid_entry *v = xcalloc(n ? n : 1, sizeof(*v));
	memcpy(v, e, n * sizeof(*v));
	qsort(v, n, sizeof(*v), by_leaf);
	struct cap_sha256 h;
	cap_sha256_init(&h);
	for (unsigned i = 0; i < n; i++) {
		if (per_core(v[i].function))
			continue;
		uint32_t ebx = v[i].function == 1 ? 0 : v[i].ebx;
		char line[96];
		int k = snprintf(line, sizeof(line), "%08x.%08x %x %08x %08x %08x %08x\n", v[i].function, v[i].index,
				 v[i].flags, v[i].eax, ebx, v[i].ecx, v[i].edx);
		cap_sha256_update(&h, line, (size_t)k);
	}
	cap_sha256_final_hex(&h, hex);
	free(v);
}

/* The value of "name<tabs>: value" in one processor's block [s, end), or NULL. */
static const char *field(const char *s, const char *end, const char *name, size_t *vlen)
{
	size_t n = strlen(name);
	for (const char *line = s; line < end;) {
		const char *nl = memchr(line, '\n', (size_t)(end - line));
		const char *stop = nl ? nl : end;
		const char *c = line + n;
		if ((size_t)(stop - line) > n && strncmp(line, name, n) == 0) {
			while (c < stop && (*c == '\t' || *c == ' '))
				c++;
			if (c < stop && *c == ':') {
				const char *v = c + 1;
				while (v < stop && *v == ' ')
					v++;
				*vlen = (size_t)(stop - v);
				return v;
			}
		}
		line = stop + 1;
	}
	return NULL;
}

int cap_cpuinfo_describe(const char *cpuinfo, char *desc, size_t len, char hex[65])
{
	const char *end = strstr(cpuinfo, "\n\n");
	end = end ? end + 1 : cpuinfo + strlen(cpuinfo);
	size_t lv, lf, lm, ls, ln = 0, lflags;
	const char *vendor = field(cpuinfo, end, "vendor_id", &lv);
	const char *fam = field(cpuinfo, end, "cpu family", &lf);
	const char *model = field(cpuinfo, end, "model", &lm);
	const char *step = field(cpuinfo, end, "stepping", &ls);
	const char *name = field(cpuinfo, end, "model name", &ln);
	const char *flags = field(cpuinfo, end, "flags", &lflags);
	if (!vendor || !fam || !model || !step || !flags)
		return -ENOENT;
	char v[32], f[16], m[16], st[16], nm[96] = "";
	trimmed(v, sizeof(v), vendor, lv);
	trimmed(f, sizeof(f), fam, lf);
	trimmed(m, sizeof(m), model, lm);
	trimmed(st, sizeof(st), step, ls);
	if (name)
		trimmed(nm, sizeof(nm), name, ln);
	snprintf(desc, len, "%s family %s model %s stepping %s%s%s%s", v, f, m, st, *nm ? " (" : "", nm, *nm ? ")" : "");
	struct cap_sha256 h;
	cap_sha256_init(&h);
	cap_sha256_update(&h, flags, lflags);
	cap_sha256_final_hex(&h, hex);
	return 0;
}

char *cap_kvm_identity_format(const struct cap_kvm_host *h)
{
	char cpu[256] = "unknown", hex[65], cpuid[96] = "none", api[256];
	if (h->cpuid) {
		cap_cpuid_describe(h->cpuid, h->ncpuid, cpu, sizeof(cpu));
		cap_cpuid_hash(h->cpuid, h->ncpuid, hex);
		snprintf(cpuid, sizeof(cpuid), "kvm:%s", hex);
	} else if (h->cpuinfo && cap_cpuinfo_describe(h->cpuinfo, cpu, sizeof(cpu), hex) == 0) {
		snprintf(cpuid, sizeof(cpuid), "cpuinfo:%s", hex);
	}
	if (h->api_version >= 0)
		snprintf(api, sizeof(api), "%d", h->api_version);
	else
		snprintf(api, sizeof(api), "none (%s)", h->why ? h->why : "no answer");
	return xasprintf("cpu=%s\ncpuid=%s\nkvm_api=%s\nkernel=%s %s\n", cpu, cpuid, api,
			 h->kernel_release ? h->kernel_release : "unknown", h->kernel_version ? h->kernel_version : "");
}

/* KVM gives the brand string's leaves (0x80000002-4) as zeros, and QEMU's
 * -cpu host gives its guest the host's (its model-id): fill them in from
 * the CPU itself, which is what the guest reads. */
static void host_brand(struct cap_cpuid_entry *e, unsigned n)
{
#if defined(__x86_64__) || defined(__i386__)
	unsigned a, b, c, d;
	if (!__get_cpuid(0x80000000, &a, &b, &c, &d) || a < 0x80000004)
		return;
	for (unsigned i = 0; i < n; i++) {
		uint32_t f = e[i].function;
		if (f < 0x80000002 || f > 0x80000004 || e[i].index || (e[i].eax | e[i].ebx | e[i].ecx | e[i].edx))
			continue;
		__get_cpuid(f, &a, &b, &c, &d);
		e[i].eax = a, e[i].ebx = b, e[i].ecx = c, e[i].edx = d;
	}
#else
	(void)e, (void)n;
#endif
}

/* KVM_GET_SUPPORTED_CPUID into *out (a new array), its count; -errno. */
static int supported_cpuid(int kvm, struct cap_cpuid_entry **out)
{
	for (unsigned cap = 128; cap <= 4096; cap *= 2) {
		struct kvm_cpuid2 *c = xcalloc(1, sizeof(*c) + cap * sizeof(c->entries[0]));
		c->nent = cap;
		if (ioctl(kvm, KVM_GET_SUPPORTED_CPUID, c) < 0) {
			int e = errno;
			free(c);
			if (e == E2BIG)
				continue;
			return -e;
		}
		struct cap_cpuid_entry *v = xcalloc(c->nent ? c->nent : 1, sizeof(*v));
		for (unsigned i = 0; i < c->nent; i++) {
			const struct kvm_cpuid_entry2 *k = &c->entries[i];
			v[i] = (struct cap_cpuid_entry){ k->function, k->index, k->flags, k->eax, k->ebx, k->ecx, k->edx };
		}
		int n = (int)c->nent;
		free(c);
		host_brand(v, (unsigned)n);
		*out = v;
		return n;
	}
	return -E2BIG;
}

char *cap_kvm_host_identity(void)
{
	struct cap_kvm_host h = { .api_version = -1 };
	_cleanup_free_ struct cap_cpuid_entry *cpuid = NULL;
	_cleanup_free_ char *cpuinfo = NULL;
	char why[160] = "";
	struct utsname u;
	if (uname(&u) == 0) {
		h.kernel_release = u.release;
		h.kernel_version = u.version;
	}
	int kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC);
	if (kvm < 0) {
		snprintf(why, sizeof(why), "/dev/kvm: %s", strerror(errno));
	} else {
		h.api_version = ioctl(kvm, KVM_GET_API_VERSION, 0);
		if (h.api_version < 0)
			snprintf(why, sizeof(why), "KVM_GET_API_VERSION: %s", strerror(errno));
		int n = supported_cpuid(kvm, &cpuid);
		if (n >= 0) {
			h.cpuid = cpuid;
			h.ncpuid = (unsigned)n;
		} else if (!*why) {
			snprintf(why, sizeof(why), "KVM_GET_SUPPORTED_CPUID: %s", strerror(-n));
		}
		close(kvm);
	}
	if (!h.cpuid && cap_read_file("/proc/cpuinfo", 16u << 20, &cpuinfo) > 0)
		h.cpuinfo = cpuinfo;
	h.why = *why ? why : NULL;
	return cap_kvm_identity_format(&h);
}
