/* What a VM saved under KVM depends on in its host (engine-kvm.c): the
 * CPU and its features as KVM exposes them, KVM's API and the kernel it
 * lives in. An engine that runs guests on KVM with the host's CPU (QEMU's
 * -cpu host) puts it in its identity, so that a template made on one CPU,
 * KVM or kernel is never restored on another (docs/architecture.md,
 * "Acceleration"). Only src/engine and its unit tests include this. */
#ifndef CAP_ENGINE_KVM_H
#define CAP_ENGINE_KVM_H

#include <stddef.h>
#include <stdint.h>

/* One CPUID leaf (function) and subleaf (index), as struct
 * kvm_cpuid_entry2 holds it. */
struct cap_cpuid_entry {
	uint32_t function, index, flags;
	uint32_t eax, ebx, ecx, edx;
};

/* What the identity is made of; cap_kvm_host_identity gathers it from
 * this host, tests give it. Borrowed pointers. */
struct cap_kvm_host {
	/* KVM_GET_SUPPORTED_CPUID, in any order, with the brand string's
	 * leaves (zeros from KVM) the CPU's own, as -cpu host gives them to
	 * the guest; NULL when it could not be read (then cpuinfo stands in). */
	const struct cap_cpuid_entry *cpuid;
	unsigned ncpuid;
	/* /proc/cpuinfo's text, used only without cpuid; NULL: none. */
	const char *cpuinfo;
	/* KVM_GET_API_VERSION (12), or < 0 when /dev/kvm did not answer. */
	int api_version;
	/* Why cpuid is NULL or api_version < 0 ("/dev/kvm: Permission
	 * denied"); NULL when nothing failed. */
	const char *why;
	/* uname's release and version: KVM is part of the kernel. */
	const char *kernel_release, *kernel_version;
};

/* "AuthenticAMD family 25 model 1 stepping 1 (AMD EPYC 7B13 64-Core
 * Processor)": the vendor of leaf 0, family, model and stepping of leaf
 * 1's EAX as Linux computes them (/proc/cpuinfo's), the brand string of
 * leaves 0x80000002-4 when there is one. "unknown" without leaves 0 and 1. */
void cap_cpuid_describe(const struct cap_cpuid_entry *e, unsigned n, char *buf, size_t len);

/* The hex SHA-256 of the features in e a restored guest depends on: every
 * leaf but those that describe caches and topology (2, 4, 0xb, 0x18,
 * 0x1a, 0x1f, 0x80000005, 0x80000006, 0x8000001d, 0x8000001e), and leaf
 * 1's EBX zeroed (the APIC ID of the CPU that asked). Those differ from
 * core to core (hybrid CPUs, per-CPU IDs) and QEMU does not pass them to
 * its guest; with them the key would depend on where it was computed.
 * Independent of the entries' order. */
void cap_cpuid_hash(const struct cap_cpuid_entry *e, unsigned n, char hex[65]);

/* The same description and a hash of the "flags" line of the first
 * processor in a /proc/cpuinfo text: 0, or -ENOENT when a field is missing
 * (desc and hex then untouched). */
int cap_cpuinfo_describe(const char *cpuinfo, char *desc, size_t len, char hex[65]);

/* The identity lines of h, "name=value\n" each (the format of
 * cap_engine_identity, engine.h):
 *   cpu=<cap_cpuid_describe, or from cpuinfo>
 *   cpuid=kvm:<cap_cpuid_hash> | cpuinfo:<hash of the flags> | none
 *   kvm_api=<version> | none (<why>)
 *   kernel=<release> <version>
 * A new string. */
char *cap_kvm_identity_format(const struct cap_kvm_host *h);

/* This host's (/dev/kvm, /proc/cpuinfo only when KVM does not answer,
 * uname), formatted: a new string. Tens of microseconds: computed at
 * every start, so that a KVM module reloaded with other parameters counts. */
char *cap_kvm_host_identity(void);

#endif
