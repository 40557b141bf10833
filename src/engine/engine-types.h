/* The engine's types that the layers above it name (sandbox.h and its
 * users, front ends included): the accelerator, a disk, a disk's I/O
 * error. Types and constants only: no function of the engine and nothing
 * of the jail, so that a file can say what a sandbox is made of without
 * seeing how a VM is run (engine.h). */
#ifndef CAP_ENGINE_TYPES_H
#define CAP_ENGINE_TYPES_H

#include <stdbool.h>

enum cap_accel { CAP_ACCEL_AUTO, CAP_ACCEL_KVM, CAP_ACCEL_TCG };

struct cap_accel_choice {
	enum cap_accel accel;	/* KVM or TCG, never AUTO */
	char reason[1024];	/* why, in a sentence a user can act on */
};


/* A virtio-blk disk; the guest finds it by serial (a cap_proto_valid_name). */
struct cap_vm_disk {
	const char *path;
	const char *serial;
	bool readonly;
	/* A disk of its own per sandbox (not shared like an image): a
	 * template holds an empty placeholder in its slot. */
	bool per_sandbox;
	/* NULL: path is a raw disk file. Else path is a qcow2 overlay whose
	 * base is this raw file, opened read-only: a fork's disk
	 * (docs/architecture.md, "Snapshots and forks"), copy-on-write over
	 * its snapshot's copy of the parent's. */
	const char *backing;
};


/* An I/O error on a disk that QEMU passed to the guest (QMP
 * BLOCK_IO_ERROR). Every disk's policy is to report errors to the guest,
 * never to stop the VM: a full host file system becomes ENOSPC/EIO in the
 * guest, not a frozen sandbox. */
struct cap_vm_io_error {
	unsigned disk;	/* index in cfg.disks */
	bool write;	/* a write failed (else a read) */
	bool nospace;	/* the host's file system holding the disk is full */
	char reason[128];	/* QEMU's words ("No space left on device") */
};


/* A pod's network namespace as CNI left it (cap_pod_net_read): its one
 * veth, its IPv4 address and routes. Addresses in host order. */
#define CAP_POD_MAX_ROUTES 16
#define CAP_POD_TAP_NAME "tap0_capsule"
struct cap_pod_net {
	char ifname[16];	/* the veth ("eth0") */
	int ifindex;
	unsigned char mac[6];
	unsigned mtu;
	unsigned addr;	/* uint32_t */
	unsigned char prefix;
	unsigned gateway;	/* the default route's, 0: none */
	struct cap_pod_route {
		unsigned dst;
		unsigned char len;	/* 1 to 32 */
		unsigned gateway;	/* 0: on-link */
	} routes[CAP_POD_MAX_ROUTES];	/* the others, not the address's own subnet */
	unsigned nroutes;
};

#endif
