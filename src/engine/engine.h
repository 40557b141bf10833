/* The engine: starts and controls one hypervisor process per VM. An
 * engine is a table of operations (engine-ops.h) chosen at run time by
 * name; today's only one is "qemu" (QEMU's microvm machine driven over
 * QMP, engine-qemu.c). Nothing above src/engine names a hypervisor: it
 * picks an engine with cap_engine_get and drives its VMs through
 * cap_vm_*, which dispatch to the engine the VM was started with. */
#ifndef CAP_ENGINE_H
#define CAP_ENGINE_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "engine-probe.h"	/* what a front end may ask without a VM */
#include "engine-types.h"
#include "err.h"
#include "jail.h"	/* cap_jail_sweep is public */

/* What in the engine and its host shapes a VM's saved state under accel
 * (KVM or TCG), hashed into a template's key and recorded with the
 * template to show which part differs on another host: one "name=value\n"
 * per line, names [a-z_]+ in a fixed order, values without a newline.
 * QEMU's (docs/architecture.md, "Acceleration"): its binary's identity
 * and version, the accelerator, and under KVM the host's CPU, its
 * features as KVM exposes them, KVM's API version and the host kernel,
 * under TCG the guest's TSC rate and clock. Identities of two engines or
 * two accelerators always differ. New string. */
char *cap_engine_identity(const struct cap_engine_ops *e, enum cap_accel accel);

/* A NIC under a network policy (DESIGN §9, docs/network.md): a
 * virtio-net device on QEMU's user-mode stack inside the jail's network
 * namespace, which has no uplink (lo only, route "local 0.0.0.0/0 dev lo").
 * nftables rules installed before QEMU starts, default drop, matched on
 * QEMU's UID: TCP to a denied range is reset, 127.0.0.1:CAP_NET_PROXY_PORT
 * and every other TCP connection is redirected to the policy process's
 * listener, UDP to 127.0.0.1:53 reaches its DNS socket, anything else is
 * dropped. QEMU's DNS goes to 127.0.0.1:53. With a policy process, the
 * packets reset or dropped are logged first (NFLOG, at most 20 a second
 * per rule) to fds.nflog. */
struct cap_vm_net_fds {
	int tcp_listen;	/* 127.0.0.1:<any> in the VM's namespace, listening, nonblocking */
	int dns;	/* UDP 127.0.0.1:53 in the VM's namespace, nonblocking */
	int connector;	/* see cap_netd_config.connector; the sockets it passes are nonblocking */
	int control;	/* the policy process's end of cap_vm_net_control_fd */
	/* NETLINK_NETFILTER socket receiving NFLOG group 1: the packets of
	 * QEMU's UID that the rules reject or drop (nflog.h: the first
	 * CAP_NFLOG_COPY_RANGE bytes, the prefix naming the rule; parse with
	 * cap_nflog_parse); nonblocking; -1 when none. */
	int nflog;
};

struct cap_vm_net {
	/* Guest TCP ports QEMU forwards from 127.0.0.2:<same port> in the
	 * VM's namespace (hostfwd), for published ports. */
	const uint16_t *forward;
	unsigned nforward;
	/* Ranges [lo, hi] (host order) refused in the kernel with a TCP
	 * reset (cap_net_denied_ranges). */
	const uint32_t (*deny)[2];
	unsigned ndeny;
	/* The guest's HTTP proxy at the gateway (CAP_NET_PROXY_PORT): QEMU's
	 * connections to 127.0.0.1:proxy_port go to the policy process even
	 * when 127.0.0.0/8 is denied. */
	uint16_t proxy_port;
	/* The policy process, forked once the namespace and its rules exist
	 * and before QEMU starts; it runs as an unprivileged user of its own,
	 * in the VM's cgroups, with no_new_privs and rlimits, holding only
	 * fds' descriptors, keep[0..nkeep) and 0-2; its return value is its
	 * exit code. NULL: none (a template being built: nothing gets out). */
	int (*policy_main)(void *ud, const struct cap_vm_net_fds *fds);
	void *policy_ud;
	/* Called first in every other helper (the connector), in the child:
	 * what only the policy process may hold is wiped from the helper's
	 * copy of this process's memory. (QEMU is exec'd with an empty
	 * environment: nothing of this process remains there.) NULL: nothing. */
	void (*helper_scrub)(void *ud);
	const int *keep;
	unsigned nkeep;
};

/* A pod's NIC (docs/oci.md, "The pod's network"): a virtio-net device
 * whose backend is a tap the caller made in the pod's network namespace
 * (cap_pod_net_tap) and passes by descriptor: QEMU keeps its jail's own
 * empty namespace, and the tap is its only path. The guest's MAC is the
 * pod's (the veth's). */
struct cap_vm_tap {
	int fd;	/* borrowed for cap_vm_start (QEMU gets its own copy) */
	uint8_t mac[6];
};

/* The pod network's host side (engine-podnet.c), in the network
 * namespace netns (an open descriptor): what its one veth holds
 * (struct cap_pod_net, engine-types.h: refused, with a message naming
 * the namespace path shown and what was found, unless it is one veth
 * with one IPv4 address), a tap joined to the veth by tc (an ingress
 * qdisc on each and a u32 match-all filter redirecting to the other's
 * egress: Kata's "tcfilter"), and its undoing. The calling thread
 * enters netns and comes back; root only. */
int cap_pod_net_read(int netns, const char *shown, struct cap_pod_net *out, struct cap_err *err);
/* The tap (CAP_POD_TAP_NAME, with the veth's MTU, up, IFF_VNET_HDR) and
 * the filters both ways: *tap_fd is its descriptor (close-on-exec; the
 * tap goes when its last descriptor closes). */
int cap_pod_net_tap(int netns, const struct cap_pod_net *p, int *tap_fd, struct cap_err *err);
/* Remove the veth's ingress qdisc (and so its filter): after the tap is
 * closed. Errors are ignored (the veth may be gone: CNI's DEL). */
void cap_pod_net_untap(int netns, const struct cap_pod_net *p);

/* When cap_vm_start reached each step (cap_now_ns), for start-up
 * timings; 0 for a step not reached or not taken. */
struct cap_vm_times {
	int64_t start;	/* called */
	int64_t spawned;	/* the jail set up and the hypervisor exec'd in it */
	int64_t monitor;	/* the hypervisor's own start-up done (QMP answers) */
	int64_t restored;	/* the saved device state loaded (restore only) */
	int64_t running;	/* guest running, the agent's channel connected */
};

struct cap_vm_config {
	const char *kernel;	/* vmlinux with a PVH entry */
	const char *initrd;
	const char *dir;	/* existing private directory: sockets, logs */
	const char *console_log;	/* NULL: <dir>/console.log */
	/* The hypervisor's own stderr. NULL: in dir (QEMU's: qemu.log), removed
	 * with the VM; else this file, kept. */
	const char *vmm_log;
	unsigned cpus;
	unsigned memory_mib;
	enum cap_accel accel;	/* KVM or TCG (resolved) */
	const char *append_extra;	/* NULL or more kernel arguments */
	const struct cap_vm_disk *disks;	/* in device order */
	unsigned ndisks;
	/* NULL: no NIC at all. A VM with one has it after its disks, so a
	 * template's layout is "disks, then the NIC". */
	const struct cap_vm_net *net;
	/* NULL: none; else a pod's NIC (never with net), after the disks. */
	const struct cap_vm_tap *tap;
	/* Remove the socket files once connected, so that nothing is left
	 * behind even if this process is killed (nothing connects to them
	 * later: the VM is reached only through cap_vm_agent_fd and QMP). */
	bool unlink_sockets;
	/* Guest RAM: NULL for an anonymous memfd; else this file, shared and
	 * kept (a template's, being built). */
	const char *ram_file;
	/* Restore instead of booting: device state saved by cap_vm_save, and
	 * the RAM file saved with it (mapped privately: never changed). */
	const char *restore_state;
	const char *restore_ram;
	/* With restore_state, when > 0: a memfd holding restore_ram's
	 * contents, sealed against writes, growing and shrinking (F_SEAL_WRITE,
	 * F_SEAL_GROW, F_SEAL_SHRINK, F_SEAL_SEAL), shared by every VM of the
	 * template. A jailed QEMU maps it privately instead of a copy of its
	 * own; borrowed for the call. <= 0: none (a jailed restore copies). */
	int restore_ram_fd;
	/* With restore_state and ram_file: restore_state holds the guest's
	 * RAM too (cap_vm_save_full), loaded into ram_file (shared, kept),
	 * and the guest is left paused with no agent channel: a snapshot
	 * being sealed into a template's form (cap_vm_save then writes its
	 * device state alone). */
	bool restore_full;
	/* The engine that runs it (cap_engine_get); NULL: cap_engine_get(NULL). */
	const struct cap_engine_ops *engine;
	/* NULL, or filled in by cap_vm_start as it goes (borrowed). */
	struct cap_vm_times *times;
};

struct cap_vm;

/* Whether a VM that e starts now would map cfg.restore_ram_fd (it is
 * jailed): else getting one is not worth it. */
bool cap_engine_wants_ram_fd(const struct cap_engine_ops *e);

/* After the death of a VM's owner, end what is left of the VM e started
 * with cfg.dir = dir: the sockets it made there, and its hypervisor
 * process if that still runs (pid: cap_vm_pid as the owner recorded it,
 * <= 0 when unknown; it is checked to still be that VM's, since a pid may
 * have been reused): SIGKILL, then wait up to 2 s for it to be gone. 1
 * when a process was killed, 0 when none was left, -errno when it could
 * not be killed or did not go. */
int cap_engine_end_leftover(const struct cap_engine_ops *e, const char *dir, pid_t pid);

/* Start the VM's hypervisor (cfg.engine's) and connect to it. On success
 * *out owns the process and its connections; free with cap_vm_free. On
 * failure nothing is left running and err says what the hypervisor
 * reported (-ENOENT listing the engines when cfg.engine is NULL and
 * CAPSULE_ENGINE names none). The process gets SIGKILL if this process
 * dies. */
int cap_vm_start(const struct cap_vm_config *cfg, struct cap_vm **out,
		 struct cap_err *err);
/* The engine vm was started with. */
const struct cap_engine_ops *cap_vm_engine(const struct cap_vm *vm);

/* A descriptor that becomes readable when QEMU has events for us, for the
 * caller's poll (then call cap_vm_io_errors); -1 once QEMU's monitor has
 * closed. Owned by vm. */
int cap_vm_event_fd(const struct cap_vm *vm);
/* Take the disk I/O errors QEMU reported since the last call, without
 * waiting (events that arrived during other QMP calls are kept for it):
 * their number, 0 when none, with the latest in *last; -errno when the
 * monitor is gone and nothing was pending. */
int cap_vm_io_errors(struct cap_vm *vm, struct cap_vm_io_error *last);

/* Connected stream socket to the guest agent's port; owned by vm. */
int cap_vm_agent_fd(const struct cap_vm *vm);
/* A pidfd that becomes readable when QEMU exits; owned by vm. */
int cap_vm_exit_fd(const struct cap_vm *vm);
pid_t cap_vm_pid(const struct cap_vm *vm);

/* The owner's end of the policy process's control channel (lines of
 * cap_netd_config.control), -1 without a NIC; owned by vm. */
int cap_vm_net_control_fd(const struct cap_vm *vm);
/* The policy process, -1 without one. */
pid_t cap_vm_net_pid(const struct cap_vm *vm);
/* Replace the ranges refused in the kernel (a policy change). */
int cap_vm_net_deny(struct cap_vm *vm, const uint32_t (*deny)[2], unsigned n,
		    struct cap_err *err);
/* Start (add) or stop forwarding guest TCP port from 127.0.0.2:port in
 * the VM's namespace (auto-publish). Adding one already forwarded is 0. */
int cap_vm_net_forward(struct cap_vm *vm, uint16_t port, bool add,
		       struct cap_err *err);

/* The jail protections this host could not give this VM ("" when none):
 * each named with the reason. Borrowed. */
const char *cap_vm_jail_note(const struct cap_vm *vm);

/* How a restored VM got its RAM: "shared RAM" (restore_ram_fd mapped
 * privately), "RAM copied" (a copy in its jail), "template file mapped
 * privately" (not confined); "" when not restored. Borrowed. */
const char *cap_vm_ram_note(const struct cap_vm *vm);

/* Reap QEMU if it has exited, waiting up to timeout_ms (0: just check).
 * Returns 1 if it has exited, 0 if still running. */
int cap_vm_wait(struct cap_vm *vm, int timeout_ms);
/* Describe how QEMU ended ("exited with status 1"), valid after exit. */
const char *cap_vm_exit_reason(const struct cap_vm *vm);

/* Freeze / continue the guest through QMP (memory kept). 0 or -errno. */
int cap_vm_pause(struct cap_vm *vm, struct cap_err *err);
int cap_vm_resume(struct cap_vm *vm, struct cap_err *err);

/* Stop the guest and save its device state to state_path (RAM stays in
 * the shared RAM file, which must be a kept one: cfg.ram_file). The VM is
 * left paused. */
int cap_vm_save(struct cap_vm *vm, const char *state_path, struct cap_err *err);

/* Stop the guest and save its whole state, RAM included, to state_path:
 * a running sandbox's snapshot, whatever its RAM is mapped from. The VM
 * is left paused (cap_vm_resume continues it). */
int cap_vm_save_full(struct cap_vm *vm, const char *state_path, struct cap_err *err);

/* Ask QEMU to quit through QMP (no guest cooperation). */
int cap_vm_quit(struct cap_vm *vm);
/* SIGKILL QEMU and reap it. */
void cap_vm_kill(struct cap_vm *vm);

/* The last lines of the guest console and of QEMU's own stderr, for error
 * messages. New string the caller frees (empty when there is nothing). */
char *cap_vm_logs_tail(const struct cap_vm *vm, int lines);

/* Kill the hypervisor if still running, close everything and remove the
 * sockets and its log in dir. The directory itself, the console log and
 * a cfg.vmm_log stay (the caller owns them). */
void cap_vm_free(struct cap_vm *vm);

#endif
