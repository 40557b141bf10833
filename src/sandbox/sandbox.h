/* One sandbox: a VM with a connected guest agent. Boot it, run commands
 * in it (several at once), shut it down. The caller drives I/O with
 * cap_sandbox_pollfds/cap_sandbox_dispatch inside its own poll loop, or
 * with cap_sandbox_wait when it has nothing else to wait for. */
#ifndef CAP_SANDBOX_H
#define CAP_SANDBOX_H

#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "client.h"
#include "engine-types.h"
#include "err.h"
#include "policy.h"

/* What one sandbox is made of, built in one place (sandbox-spec.c) for
 * every path that starts a VM: the device layout (disks in order, then
 * the NIC when the network policy has one), what SETUP tells the agent,
 * and the network policy. A template's key is derived from its shape
 * (cap_sandbox_spec_shape), so two paths that build the same sandbox
 * share templates, and a NIC is part of the shape. */
#define CAP_SPEC_MAX_DISKS 5
struct cap_sandbox_spec {
	struct cap_vm_disk disks[CAP_SPEC_MAX_DISKS];
	unsigned ndisks;
	struct cap_setup setup;	/* its strings point into the spec or are static */
	char hostname[21];
	struct cap_setup_tmpfs tmpfs[CAP_SETUP_MAX_TMPFS];	/* setup.tmpfs */
	struct cap_net_policy net;	/* net.enabled: a NIC */
	/* Kernel arguments of the shape: with a NIC, its address for the
	 * agent to configure at boot ("capsule.net=10.0.2.15/24,10.0.2.2"),
	 * so that a template holds it ready. "" otherwise. */
	char append[64];
	/* A pod's NIC (cap_sandbox_spec_pod), never with net.enabled: the
	 * pod's namespace (borrowed path) and what its veth holds. */
	bool has_pod;
	const char *pod_netns;
	struct cap_pod_net pod;
};

/* The bare initramfs root: no disk, no NIC. */
void cap_sandbox_spec_init(struct cap_sandbox_spec *s);
/* A named sandbox: the image (shared, read-only) as the root's lower
 * layer, its writable upper layer, /work, /source and, when workspace is
 * not NULL, /workspace (its own writable disk: docs/workspace.md), in
 * that order. A workspace changes the shape, and so the template. Paths
 * are borrowed; hostname is used when it is a valid one. */
void cap_sandbox_spec_named(struct cap_sandbox_spec *s, const char *image,
			    const char *upper, const char *work,
			    const char *source, const char *workspace,
			    const char *hostname);
/* Ask the agent for a read-only root (SETUP's root_readonly, after
 * cap_sandbox_spec_named): the overlay root is remounted read-only once
 * set up. Not part of the shape: SETUP reaches a VM after its restore,
 * so a template serves sandboxes with either. */
void cap_sandbox_spec_root_readonly(struct cap_sandbox_spec *s, bool readonly);
/* Run commands and file operations as root in the guest (SETUP's
 * tools_root): the VM is then the only boundary. Not part of the shape
 * either. */
void cap_sandbox_spec_tools_root(struct cap_sandbox_spec *s, bool root);
/* Ask the agent for these tmpfs mounts (SETUP's tmpfs list, copied; n at
 * most CAP_SETUP_MAX_TMPFS, each one cap_proto_setup_tmpfs_ok takes, or
 * the SETUP will not encode), made before a read-only root's remount.
 * Not part of the shape either. */
void cap_sandbox_spec_tmpfs(struct cap_sandbox_spec *s, const struct cap_setup_tmpfs *t,
			    uint32_t n);
/* A one-shot VM (capsule run) on the initramfs root, with /source from
 * source_image when it is not NULL. */
void cap_sandbox_spec_oneshot(struct cap_sandbox_spec *s, const char *source_image);
/* Give the sandbox this network policy (copied): a NIC when p->enabled,
 * eth0 and the proxy in SETUP. */
void cap_sandbox_spec_network(struct cap_sandbox_spec *s, const struct cap_net_policy *p);
/* Give the sandbox a pod's NIC (docs/oci.md, "The pod's network"): a
 * tap in the network namespace at netns (borrowed; made at each boot and
 * joined to the veth with tc), and SETUP's static network with the
 * veth's MAC, MTU, address and routes, listeners reported (PortForward),
 * no /etc file and no proxy. Such a VM always cold-boots (the device's
 * MAC is in a template's saved state). */
void cap_sandbox_spec_pod(struct cap_sandbox_spec *s, const char *netns, const struct cap_pod_net *p);
/* What the network namespace at path holds for a pod (one veth, one
 * IPv4 address: cap_pod_net_read's rules), refused with err naming path
 * and what was found; root only. */
int cap_sandbox_pod_net_read(const char *path, struct cap_pod_net *out, struct cap_err *err);
/* The shape, for the template key: serials, modes and ownership of the
 * disks in order, then "nic" when there is one. Never the paths. */
void cap_sandbox_spec_shape(const struct cap_sandbox_spec *s, char *buf, size_t len);
/* What a disk is to the guest, by its serial: its layout role (layout.h). */
const char *cap_sandbox_disk_role(const char *serial);

struct cap_sandbox_opts {
	unsigned cpus;	/* default 1 */
	unsigned memory_mib;	/* default 512 */
	enum cap_accel accel;	/* default AUTO */
	const char *console_log;	/* NULL: kept in the run dir, removed */
	const char *vmm_log;	/* NULL: the engine's, in dir, removed with the VM; else this file, kept */
	int boot_timeout_ms;	/* default 60000 */
	/* Disks, NIC and what the agent sets up (borrowed). NULL: the bare
	 * initramfs root, no disk, no NIC. */
	const struct cap_sandbox_spec *spec;
	/* With a NIC: the sandbox's name for the policy process's log lines,
	 * where they go (-1: stderr) and whether allowed connections are
	 * logged too. */
	const char *name;
	int net_log_fd;
	/* A file the policy process keeps its counters in (netd.h,
	 * cap_netd_counters), open read-write; -1: none. */
	int net_counters_fd;
	bool net_verbose;
	/* With secrets in spec->net: where the sandbox's CA is kept
	 * (ca.key 0600 and ca.pem, made on first use: ca.h); NULL: a CA in
	 * memory for this start only (capsule run). The values are read
	 * from their sources at start (secret.h), in this process. */
	const char *ca_dir;
	/* Directory for QEMU's sockets (unlinked once connected) and the
	 * logs not named above; the caller's, kept after free. NULL: a
	 * private temporary one, removed with the sandbox. */
	const char *dir;
	/* Start by restoring a template snapshot (built on first use) rather
	 * than booting; any problem with it falls back to a cold boot. On by
	 * default; CAPSULE_TEMPLATES=0 turns it off. */
	bool use_template;
	/* A snapshot's directory (state, ram: docs/architecture.md,
	 * "Snapshots and forks") to resume from instead: the guest goes on
	 * from the snapshot's instant, running commands included, and is
	 * re-identified (clock, entropy, hostname, CA, placeholders) before
	 * anything runs. Should it not restore, a cold boot with the
	 * sandbox's disks follows, and the boot note says why. NULL: none. */
	const char *resume_dir;
	/* Take a spare of `capsule spares` when it keeps one of this
	 * shape's template (the plain shape of capsule run: no disk, no
	 * NIC, no log of its own); CAPSULE_SPARES=0 turns it off. Off by
	 * default. */
	bool use_spare;
};

/* Keep count spares of o's shape ready for capsule run (sandbox-spare.c,
 * docs/architecture.md "Spares for capsule run"): each restored from
 * the template, warmed by one `true`, given to one caller and replaced.
 * Listens on CAPSULE_HOME/spares/run.sock; one holder per CAPSULE_HOME.
 * Runs until stop_fd is readable, then ends every spare's VM (given
 * ones too). Logs with cap_log. 0, or -errno with err set. */
int cap_spare_serve(const struct cap_sandbox_opts *o, unsigned count, int stop_fd, struct cap_err *err);

/* Templates: CAPSULE_HOME/templates/<key>/{state, ram, meta.json}, one per
 * combination of kernel, initramfs, engine and its host (QEMU, the
 * accelerator, under KVM the host's CPU, KVM and kernel), vCPUs, memory
 * and device layout (images included). */

/* One field of the engine's identity (cap_engine_identity): as recorded
 * when the template was made, and as this host gives it now. A template
 * whose fields differ is never restored here (its key is not this
 * host's); which fields differ says why. */
struct cap_template_host_field {
	char *owned_name;	/* "cpu", "cpuid", "kvm_api", "kernel", "qemu_version", ... */
	char *owned_made;	/* NULL: not recorded */
	char *owned_now;	/* NULL: this host has no such field, or the engine is unknown here */
	bool differs;	/* made and now are not the same value */
};

struct cap_template_info {
	char key[65];
	char *owned_dir;
	char *owned_desc;	/* what it was made for */
	int64_t created;
	uint64_t state_bytes, ram_bytes;	/* on disk */
	char engine[32];	/* "qemu"; "" when not recorded (made before issue 31) */
	char accel[8];	/* "kvm", "tcg"; "" when not recorded */
	/* The recorded fields in their order, then any field only this host
	 * has; NULL (nhost 0) when the template recorded none. */
	struct cap_template_host_field *host;
	size_t nhost;
	/* Names of the fields that differ, ", " between them; "" when none;
	 * NULL when host is. */
	char *owned_mismatch;
};
void cap_template_info_fini(struct cap_template_info *t);
/* Every complete template, in no order, its host fields compared with
 * this host's. *out is a new array of *n (cap_template_info_fini each,
 * then free). 0. */
int cap_template_list(struct cap_template_info **out, size_t *n);
/* Make sure the template for these options exists (boots once if not). */
int cap_template_ensure(const struct cap_sandbox_opts *o, char *key_out,
			struct cap_err *err);
/* Remove every template (they are rebuilt on demand). */
int cap_template_prune(size_t *removed, struct cap_err *err);

void cap_sandbox_opts_init(struct cap_sandbox_opts *o);

struct cap_sandbox;

/* Choose the accelerator, make sure the kernel and initramfs exist, start
 * the VM and wait until the agent says HELLO. On success *out is owned by
 * the caller (cap_sandbox_free). On failure nothing is left running or on
 * disk, and err names the cause with the end of the guest console. */
int cap_sandbox_boot(const struct cap_sandbox_opts *o, struct cap_sandbox **out,
		     struct cap_err *err);

/* Save an owned VM into dir, an existing empty directory: its whole
 * state (RAM included) as dir/full, and a copy of each of its own disks
 * of spec (the spec it was booted with) named after its role
 * (cap_snapshot_disk_file), made at the same instant. The VM is left
 * paused (cap_sandbox_pause continues it). */
int cap_sandbox_snapshot(struct cap_sandbox *sb, const struct cap_sandbox_spec *spec, const char *dir,
			 struct cap_err *err);
/* Queue SNAPSHOT to an attached sandbox's shim: save the VM into dir
 * (cap_sandbox_snapshot there), left paused when paused; answered like
 * cap_sandbox_vm_op. */
void cap_sandbox_snapshot_op(struct cap_sandbox *sb, const char *dir, bool paused);
/* Seal the snapshot in dir for o (its shape, its disks the snapshot's
 * copies): dir/full loaded once into dir/ram by a VM that never runs,
 * whose device state alone is then saved as dir/state, as a template's
 * is; dir/full is removed. Children map dir/ram copy-on-write. */
int cap_sandbox_seal(const struct cap_sandbox_opts *o, const char *dir, struct cap_err *err);

/* Connect to a running sandbox's shim at its control socket and wait for
 * its HELLO. The result speaks the same calls as a booted sandbox, except
 * that cap_sandbox_shutdown asks the shim to stop the VM. */
int cap_sandbox_attach(const char *control, struct cap_sandbox **out,
		       struct cap_err *err);

/* How the VM started: "restored from template KEY", "cold boot", or
 * "cold boot (template KEY unusable: WHY)". Borrowed from sb. */
const char *cap_sandbox_boot_note(const struct cap_sandbox *sb);
/* The jail protections this host could not give the VM, "" when none
 * (borrowed; see `capsule doctor`). */
const char *cap_sandbox_jail_note(const struct cap_sandbox *sb);
/* Replace the network policy of an owned VM started with a NIC: new
 * connections follow it (docs/network.md). -EOPNOTSUPP without a NIC
 * (the new policy applies at the next start). */
int cap_sandbox_set_network(struct cap_sandbox *sb, const struct cap_net_policy *p,
			    struct cap_err *err);
/* The policy process of an owned VM with a NIC, else -1. */
pid_t cap_sandbox_net_pid(const struct cap_sandbox *sb);
/* Whether the VM was restored from a template. */
bool cap_sandbox_restored(const struct cap_sandbox *sb);

/* Where the start of an owned VM went, in microseconds: its phases add
 * up to total. All 0 for an attached sandbox. */
struct cap_sandbox_times {
	int64_t total;	/* cap_sandbox_boot, from call to return */
	int64_t prepare;	/* kernel and initramfs, template lookup, RAM holder */
	int64_t jail;	/* the jail set up and QEMU exec'd in it */
	int64_t qemu;	/* QEMU's own start-up, to its monitor's answer */
	int64_t restore;	/* the template's device state loaded; 0 for a cold boot */
	int64_t agent;	/* guest running to the agent's HELLO and SETUP answered
			 * (a cold boot's whole boot) */
	int64_t spare;	/* a spare taken from `capsule spares`: its hand-over (jail,
			 * qemu, restore and agent are then 0) */
};
/* Borrowed from sb. */
const struct cap_sandbox_times *cap_sandbox_times(const struct cap_sandbox *sb);

/* The accelerator chosen and why. Borrowed from sb. */
const struct cap_accel_choice *cap_sandbox_accel(const struct cap_sandbox *sb);
/* Agent version reported in HELLO. Borrowed from sb. */
const char *cap_sandbox_agent_version(const struct cap_sandbox *sb);
/* Process id of the hypervisor, for tests and diagnostics. */
pid_t cap_sandbox_vmm_pid(const struct cap_sandbox *sb);
/* The engine running the VM ("qemu"); NULL when sb is attached to a shim. */
const char *cap_sandbox_engine(const struct cap_sandbox *sb);

/* The guest's TCP listeners when they changed since the last call
 * (true; *ports borrowed until the next dispatch), for a VM with a pod's
 * NIC (a NIC under a policy publishes its own). */
bool cap_sandbox_take_listeners(struct cap_sandbox *sb, const uint16_t **ports, uint32_t *n);
/* The pod's network namespace of an owned VM with a pod's NIC (borrowed
 * descriptor), else -1. */
int cap_sandbox_pod_netns(const struct cap_sandbox *sb);
/* Open a TCP stream to the guest's 127.0.0.1:port (cap_client_connect). */
int cap_sandbox_connect(struct cap_sandbox *sb, uint16_t port, const struct cap_exec_events *ev,
			void *ud, uint32_t *id, struct cap_err *err);

/* Start a command; see cap_client_exec for the callbacks' lifetimes. */
int cap_sandbox_exec(struct cap_sandbox *sb, const struct cap_exec_req *req,
		     const struct cap_exec_events *ev, void *ud, uint32_t *id,
		     struct cap_err *err);
/* Read, list or write a path inside /source or /work (docs/protocol.md,
 * FILE); answered through ev like an exec. cap bounds the answer. */
int cap_sandbox_file(struct cap_sandbox *sb, const struct cap_file_req *req,
		     uint32_t cap, const struct cap_exec_events *ev, void *ud,
		     uint32_t *id, struct cap_err *err);
/* UPDATE and STATS of a pod's container (cap_client_update,
 * cap_client_stats); answered through ev like a FILE op. */
int cap_sandbox_update(struct cap_sandbox *sb, const struct cap_update *u,
		       const struct cap_exec_events *ev, void *ud, uint32_t *id,
		       struct cap_err *err);
int cap_sandbox_stats(struct cap_sandbox *sb, const char *name,
		      const struct cap_exec_events *ev, void *ud, uint32_t *id,
		      struct cap_err *err);
/* The same, blocking (driving sb until the answer, at most timeout_ms):
 * 0, or -errno with err saying what the guest said. stats: filled on
 * success. For a caller with no other stream of sb waiting. */
int cap_sandbox_update_wait(struct cap_sandbox *sb, const struct cap_update *u, int timeout_ms,
			    struct cap_err *err);
int cap_sandbox_stats_wait(struct cap_sandbox *sb, const char *name, struct cap_stats *stats,
			   int timeout_ms, struct cap_err *err);
int cap_sandbox_stdin(struct cap_sandbox *sb, uint32_t id, const void *p,
		      size_t n);
int cap_sandbox_signal(struct cap_sandbox *sb, uint32_t id, int sig);
int cap_sandbox_signal_scope(struct cap_sandbox *sb, uint32_t id, int sig,
			     enum cap_signal_scope scope);
int cap_sandbox_resize(struct cap_sandbox *sb, uint32_t id, uint16_t rows,
		       uint16_t cols);
/* Bytes queued for the guest and not yet written. */
size_t cap_sandbox_backlog(const struct cap_sandbox *sb);
/* Freeze or continue an owned VM (not an attachment). */
int cap_sandbox_pause(struct cap_sandbox *sb, bool pause, struct cap_err *err);
/* Ask an attached shim to pause or resume its VM; the answer arrives
 * through dispatch (cap_sandbox_vm_op_pending drops to 0). */
void cap_sandbox_vm_op(struct cap_sandbox *sb, bool pause);
unsigned cap_sandbox_vm_op_pending(const struct cap_sandbox *sb);
/* The shim's answer to the last one: 0, or -errno (-EBUSY: commands run). */
int cap_sandbox_vm_op_result(const struct cap_sandbox *sb);
/* Ask an attached shim to stop its VM without waiting; the sandbox is
 * dead (dispatch fails) once the shim has stopped it. */
void cap_sandbox_stop_async(struct cap_sandbox *sb);
bool cap_sandbox_is_dead(const struct cap_sandbox *sb);
/* Number of commands still running. */
unsigned cap_sandbox_running(const struct cap_sandbox *sb);

#define CAP_SANDBOX_NPOLL 3
/* Fill CAP_SANDBOX_NPOLL pollfds for the caller's poll(). */
void cap_sandbox_pollfds(const struct cap_sandbox *sb, struct pollfd *pfd);
/* Handle the revents of those pollfds: read and write the agent channel
 * and run callbacks. -errno with err set when the VM or the agent is gone
 * or broke the protocol; the sandbox can then only be freed. */
int cap_sandbox_dispatch(struct cap_sandbox *sb, const struct pollfd *pfd,
			 struct cap_err *err);
/* Poll and dispatch until no command runs or timeout_ms passes (-1: no
 * limit). 0 when idle, -ETIMEDOUT, or a dispatch error. */
int cap_sandbox_wait(struct cap_sandbox *sb, int timeout_ms,
		     struct cap_err *err);

/* The hypervisor's event descriptor for the caller's poll (-1 when
 * attached to a shim, or once the VM is gone); when it is readable, and
 * after any pause or resume, call cap_sandbox_io_errors. */
int cap_sandbox_event_fd(const struct cap_sandbox *sb);
/* Disk I/O errors passed to the guest since the last call, without
 * waiting: their number (0 when none, or attached), the latest in *last
 * (its disk an index of the opts' disks); -errno once the VM is gone. */
int cap_sandbox_io_errors(struct cap_sandbox *sb, struct cap_vm_io_error *last);

/* Ask the agent to end all commands, sync and power off; wait up to
 * grace_ms, then make QEMU quit, then kill it. 0 when the guest confirmed
 * its file systems were synced, -ETIMEDOUT (err set) when it had to be
 * forced. The sandbox must still be freed. */
int cap_sandbox_shutdown(struct cap_sandbox *sb, int grace_ms,
			 struct cap_err *err);

/* Kill what is still running and remove the run directory. NULL is ok. */
void cap_sandbox_free(struct cap_sandbox *sb);

/* The holder of a template's shared RAM (`capsule ram-holder`, started
 * by the sandbox layer itself; src/sandbox/sandbox-ramhold.c): serves the
 * listening socket lfd until it is idle or its template in directory
 * tdir goes; logs through cap_log. The process's exit code. */
int cap_ramhold_serve(const char *tdir, int lfd);

#endif
