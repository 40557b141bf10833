/* Named, persistent sandboxes: CAPSULE_HOME/sandboxes/<name>/ holds the
 * record, the disks and, while it runs, the shim's sockets and logs. A
 * running sandbox is a shim process (one per sandbox) that owns QEMU and
 * the agent channel and serves the control socket; clients attach to it
 * with cap_sandbox_attach. */
#ifndef CAP_NAMED_H
#define CAP_NAMED_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include "err.h"
#include "log.h"	/* the shim and cap_named_reap report through cap_log */
#include "proc.h"
#include "proto.h"	/* struct cap_setup_tmpfs */

#define CAP_NAME_MAX 48

struct cap_record {
	char name[CAP_NAME_MAX + 1];
	char image[72];	/* sha256:<hex> the sandbox was created from */
	char image_ref[320];	/* what the user asked for ("python", a pulled REF[@sha256:...]) */
	unsigned cpus;
	unsigned memory_mib;
	unsigned root_size_mib;
	unsigned work_size_mib;
	int64_t created;	/* Unix time */
	/* Public data projected at /source: the host directory ("" for none)
	 * and what the last projection of it held. */
	char source[4096];
	char source_fp[65];
	uint64_t source_entries;
	uint64_t source_bytes;
	/* The network policy (docs/network.md) in cap_net_policy_words form,
	 * space-separated; "" for none (no NIC). cap_record_net reads it. */
	char net[16384];
	/* The host project copied to /workspace at creation ("" for none;
	 * docs/workspace.md), the default target of a merge, and the size
	 * of its disk (workspace.ext4 in the sandbox's directory; its base
	 * manifest is workspace.base there). */
	char workspace[4096];
	unsigned workspace_size_mib;
	/* The guest's hostname ("" for the sandbox's name when that is a
	 * valid one, else "capsule"): 1 to 20 of [A-Za-z0-9._-]. */
	char hostname[21];
	/* The root file system is read-only in the guest (an OCI config's
	 * root.readonly, Podman's --read-only): the agent remounts the
	 * overlay root read-only once the guest's own mounts (/dev, /proc,
	 * /sys, /tmp, /run, /work) and the seeded /etc files are in place.
	 * Recorded as "root_readonly": true only when set. */
	bool root_readonly;
	/* Commands and file operations run as root in the guest, not as
	 * the tool user (`capsule create --root`: Docker inside; the VM is
	 * then the only boundary). Recorded as "tools_root": true only when
	 * set; SETUP's tools_root at every start. */
	bool tools_root;
	/* tmpfs mounts the agent makes at every start, in order, before a
	 * read-only root's remount (an OCI config's tmpfs mounts, Podman's
	 * --tmpfs; SETUP's tmpfs list). Recorded as "tmpfs": [{"destination",
	 * "data", "flags"}...] only when there are some; cap_named_load
	 * refuses an entry cap_proto_setup_tmpfs_ok does not take. */
	struct cap_setup_tmpfs tmpfs[CAP_SETUP_MAX_TMPFS];
	uint32_t ntmpfs;
	/* A pod's network namespace (docs/oci.md, "The pod's network"):
	 * the VM's NIC is a tap there joined to its veth, made at each start
	 * from what the namespace holds then; "" for none. Recorded as
	 * "pod_netns" only when set, an absolute path. */
	char pod_netns[4096];
	/* Made from a snapshot (`create --from`, `fork`: docs/architecture.md,
	 * "Snapshots and forks"): its name, "" for none. Its root, /work
	 * and /workspace disks are then qcow2 overlays (root-upper.qcow2,
	 * private.qcow2, workspace.qcow2) over that snapshot's copies,
	 * which it depends on. Recorded as "snapshot" only when set. */
	char snapshot[CAP_NAME_MAX + 1];
	/* Its next start resumes the snapshot (what ran in it goes on)
	 * rather than booting; cleared once it has started. Recorded as
	 * "resume": true only when set. */
	bool resume;
	/* For cap_named_create only, never recorded: lift the host bounds
	 * of cap_named_check_size. */
	bool force_size;
	/* For cap_named_create only: a host directory whose tree becomes the
	 * root's upper layer when the disk is made (its files, owners and
	 * modes, as mke2fs -d copies them), so that they are in the root
	 * from the first start; NULL for none. */
	const char *root_seed;
};

/* Defaults of DESIGN §5: 1 vCPU, 512 MiB, 256 MiB root, 512 MiB /work. */
void cap_record_init(struct cap_record *r);

struct cap_net_policy;
/* The record's network policy. -EBADMSG (err naming the word) when a
 * recorded word does not parse. */
int cap_record_net(const struct cap_record *r, struct cap_net_policy *out,
		   struct cap_err *err);
/* Put p into the record. -E2BIG when it does not fit. */
int cap_record_set_net(struct cap_record *r, const struct cap_net_policy *p,
		       struct cap_err *err);

/* The VM shape of a named sandbox, in one place: spec (its disks by
 * role, its network p, which may be a closed policy) and o (initialized,
 * with rec's vCPUs and memory and spec). Its shim boots from it and
 * `prepare` builds the template from it, so that the template a
 * preparation makes is the one a sandbox's start restores. Paths are
 * borrowed; workspace NULL when the sandbox has none. */
struct cap_sandbox_spec;
struct cap_sandbox_opts;
void cap_named_shape(const struct cap_record *rec, const char *image, const char *upper,
		     const char *work, const char *source, const char *workspace,
		     const char *name, const struct cap_net_policy *p,
		     struct cap_sandbox_spec *spec, struct cap_sandbox_opts *o);

/* Give a stopped sandbox these vCPUs and memory from its next start on
 * (its record; nothing when they are its own already). -EBUSY while it
 * runs: a running VM is never resized. -ERANGE (err) beyond the fixed
 * bounds. */
/* Whether a stopped sandbox's commands run as root from its next start
 * (its record's tools_root; nothing when it is so already). -EBUSY while
 * it runs: whom a running VM's commands run as never changes. */
int cap_named_set_tools_root(const char *name, bool root, struct cap_err *err);
int cap_named_set_size(const char *name, unsigned cpus, unsigned memory_mib,
		       struct cap_err *err);

/* Replace a sandbox's network policy in its record. When it runs with a
 * NIC, its shim applies the new one to new connections without a
 * restart (this call waits up to 5 s for it to confirm) — a policy with
 * no NIC refuses everything there until the next start removes the
 * interface; one running without a NIC gets it at its next start, and so
 * do changed secrets (its policy process keeps those it started with).
 * *restart_needed says whether a restart changes anything more. */
int cap_named_set_network(const char *name, const struct cap_net_policy *p,
			  bool *restart_needed, struct cap_err *err);

/* Size bounds. Fixed: 1 to 16 vCPUs, 128 MiB to 1 TiB of memory, disks
 * of 16 MiB to 1 TiB. The host's, lifted by force: vCPUs up to its online
 * CPUs; memory up to its MemTotal less a reserve of the larger of 512 MiB
 * and a tenth of it; the two disks together up to the space free (to an
 * unprivileged user) on the file system holding CAPSULE_HOME — they are
 * sparse, but a guest may fill them, and a full host disk is what stops
 * every sandbox's writes. */
#define CAP_CPUS_MAX 16
#define CAP_MEMORY_MIN_MIB 128
#define CAP_MEMORY_MAX_MIB 1048576
#define CAP_MEMORY_RESERVE_MIB 512
#define CAP_DISK_MIN_MIB 16
#define CAP_DISK_MAX_MIB 1048576

/* The host's bounds, for checks with messages of their own (an
 * identity's size in capsule serve): its online CPUs (0: unknown); the
 * most memory a sandbox may have (MemTotal less the reserve), -errno when
 * it cannot be read; the MiB free on the file system holding
 * CAPSULE_HOME (*home: a new string, that directory). */
int cap_named_host_cpus(void);
int cap_named_host_memory(uint64_t *most, uint64_t *total, uint64_t *reserve);
int cap_named_host_disk(uint64_t *avail, char **home, struct cap_err *err);

/* Check a sandbox's sizes against those bounds (root_mib and work_mib 0:
 * no disks, as for capsule run). -ERANGE with err naming the value, the
 * bound and --force-size where it helps; -errno (err set) when the host
 * cannot be measured. */
int cap_named_check_size(unsigned cpus, unsigned memory_mib, unsigned root_mib,
			 unsigned work_mib, bool force, struct cap_err *err);

/* Check a sandbox name: 1 to 48 of a-z, 0-9, '_', '-', starting with a
 * letter or digit, so that it can never leave the sandboxes directory.
 * -EINVAL with a message stating the rule. */
int cap_named_check_name(const char *name, struct cap_err *err);

/* CAPSULE_HOME/sandboxes[/name]. New strings. */
char *cap_named_root(void);
char *cap_named_dir(const char *name);

/* Create the sandbox: check its name (-EINVAL) and sizes
 * (cap_named_check_size with rec->force_size: -ERANGE), resolve and verify
 * the image (rec->image_ref), make the directory and both disks (0600),
 * write record.json. Fails with -EEXIST if the name is taken; on failure
 * nothing is left behind. */
int cap_named_create(struct cap_record *rec, cap_progress_fn progress,
		     void *ud, struct cap_err *err);

/* Before a call: if the sandbox projects public data, fingerprint the
 * host tree; when it changed, stop the sandbox, rebuild the projection
 * and record it (the next start mounts the new one, with the same /work).
 * *changed tells whether that happened; *has_source (may be NULL) whether
 * the sandbox projects anything at all (it never changes afterwards). A
 * tree that breaks the rules fails here, with the sandbox and its disks
 * untouched. */
int cap_named_refresh_source(const char *name, bool *changed, bool *has_source,
			     struct cap_err *err);

/* The workspace (docs/workspace.md). Default size of its disk: the
 * project's bytes twice over plus CAP_WORKSPACE_HEADROOM_MIB, at least
 * CAP_WORKSPACE_MIN_DEFAULT_MIB, rounded up to 64 MiB; an explicit size
 * too small for the project is refused naming both. */
#define CAP_WORKSPACE_HEADROOM_MIB 256
#define CAP_WORKSPACE_MIN_DEFAULT_MIB 512
struct cap_tree;
/* The base manifest: what the sandbox's /workspace and the host project
 * last agreed on (made at creation, moved by each merge). */
int cap_named_workspace_base(const char *name, struct cap_tree *out,
			     struct cap_err *err);
int cap_named_workspace_set_base(const char *name, const struct cap_tree *t,
				 struct cap_err *err);

/* Read record.json. -ENOENT naming the sandbox when it does not exist. */
/* Load or write a record at path (a snapshot's copy); name NULL keeps
 * the recorded one. */
int cap_record_load_file(const char *path, const char *name, struct cap_record *out,
			 struct cap_err *err);
int cap_record_write_file(const struct cap_record *rec, const char *path, struct cap_err *err);
/* The file of a sandbox's disk called file ("private.ext4", ...) in its
 * directory: its qcow2 overlay for one made from a snapshot, whose base
 * is then *backing (a new string; NULL otherwise or when backing is
 * NULL). New string. */
char *cap_named_disk_path(const struct cap_record *rec, const char *file, char **backing);
int cap_named_load(const char *name, struct cap_record *out,
		   struct cap_err *err);

/* All sandbox names, sorted; array of n new strings (free each, then v). */
int cap_named_list(char ***names, size_t *n);

enum cap_named_state { CAP_NAMED_STOPPED, CAP_NAMED_RUNNING, CAP_NAMED_PAUSED };
struct cap_named_status {
	enum cap_named_state state;
	pid_t shim_pid;	/* when running */
	pid_t vmm_pid;	/* its VM's hypervisor process, when running */
	char engine[32];	/* the engine running it ("qemu"), when running */
	char control[256];	/* control socket path, when running */
	uint64_t disk_bytes;	/* space the disks use on the host */
	bool has_source;	/* it projects public data at /source */
	/* When running: whether the VM has a NIC, its policy process, and
	 * what is wrong with its network ("" when nothing). */
	bool nic;
	pid_t netd_pid;
	char network_error[160];
};
int cap_named_status(const char *name, struct cap_named_status *out,
		     struct cap_err *err);

/* What the sandbox's policy process counted since its VM last started
 * (kept after a stop, set to zero by the next start): refusals (its
 * net.log's "refused" and "dropped" lines) and TCP bytes each way. 0,
 * -ENOENT for a sandbox without a network or never started with one,
 * -EBADMSG while the process sets it up. */
struct cap_named_net_counts {
	uint64_t refused, bytes_out, bytes_in;
};
int cap_named_net_counts(const char *name, struct cap_named_net_counts *out);

/* Start the sandbox's shim (and so its VM) unless it runs already, after
 * cleaning up what a dead shim left (cap_named_reap); returns when the
 * guest is ready for commands. */
int cap_named_start(const char *name, struct cap_err *err);

/* The same in two steps, for callers with their own poll loop: _begin
 * forks the shim and returns a descriptor that becomes readable when it
 * is ready (or 0 with *fd = -1 when the sandbox already runs); _end reads
 * the outcome and closes fd. */
int cap_named_start_begin(const char *name, int *fd, struct cap_err *err);
int cap_named_start_end(const char *name, int fd, struct cap_err *err);

/* Ask the shim to stop the VM (agent sync and power-off; after grace_ms
 * QEMU is made to quit), then clean up what a shim that had to be killed
 * left (cap_named_reap). Stopping a stopped sandbox is not an error. */
int cap_named_stop(const char *name, int grace_ms, struct cap_err *err);

/* Clean up after a shim that died (cap_named_status says STOPPED): kill a
 * VM that survived it, remove runtime.json, the control socket it names
 * and the short run directory holding that socket, and the socket files
 * in the sandbox directory. Disks, the record and logs are never touched.
 * What it did goes to cap_log (INFO). 0, also when there was nothing to
 * do; -EBUSY (err set) when a shim is alive or starting; -errno (err set)
 * when a surviving VM could not be killed. */
int cap_named_reap(const char *name, struct cap_err *err);

/* Kill the sandbox's shim (its QEMU dies with it) without asking its
 * guest: for a guest that no longer answers. Waits up to 2 s for the
 * shim to be gone, then cleans up after it. Disks stay; what the guest
 * had not written out is lost. */
int cap_named_kill(const char *name, struct cap_err *err);

/* Delete the sandbox and its disks. -EBUSY when it runs and !force; with
 * force it is stopped first. A sandbox whose record is unreadable
 * (-EBADMSG) goes only with force and when no shim holds it. The only
 * call that deletes disks. */
int cap_named_remove(const char *name, bool force, struct cap_err *err);

/* Whether any sandbox was created from image digest (for image rm/prune). */
bool cap_named_uses_image(void *ud, const char *digest);

/* The shim itself: boot the VM, serve the control socket until told to
 * stop. Writes "ok\n" or an error message to ready_fd once the guest is
 * ready (or failed), then closes it. Returns when the VM has stopped. */
int cap_named_shim(const char *name, int ready_fd, struct cap_err *err);

/* Run `true` once in running sandbox name (no flush, its output
 * dropped) and wait for its end: a spare's warming, so that an
 * identity's first command finds what a first command goes through in
 * the guest already done (under TCG, translated: docs/architecture.md,
 * "Where a restore's time goes"). */
int cap_named_warm(const char *name, struct cap_err *err);

/* --- pause, snapshots and forks (sandbox-snapshot.c) --- */

/* Freeze or continue a running sandbox's VM (its memory kept). A paused
 * sandbox's next command resumes it. -ESRCH when it is stopped. */
int cap_named_pause(const char *name, bool pause, struct cap_err *err);
/* Snapshot names: as sandboxes'. */
int cap_snapshot_check_name(const char *name, struct cap_err *err);
char *cap_snapshot_root(void);
char *cap_snapshot_dir(const char *snap);
/* "<parent>-snapN" for the first N naming no snapshot. */
void cap_snapshot_default_name(const char *parent, char out[CAP_NAME_MAX + 1]);
/* Save running sandbox name as snapshot snap: its memory, device state
 * and disks at one instant, the VM paused only for the save (and left
 * paused when leave_paused, or when it was), then sealed into a
 * template's form children share. -ESRCH when it is stopped, -EEXIST
 * when snap exists; nothing is left of a snapshot that failed. */
int cap_named_snapshot(const char *name, const char *snap, bool leave_paused, struct cap_err *err);
/* A new stopped sandbox name from snapshot snap: the snapshot's record
 * under the new name (its own hostname), qcow2 overlays over the
 * snapshot's disks; its first start resumes the snapshot. */
int cap_named_create_from(const char *name, const char *snap, struct cap_err *err);
/* Snapshot name (snap: "<name>-forkN", filled in) and start count
 * children from it, named prefix + N for the first free N from 1
 * (prefix NULL: "<name>-"), filled into children[0..count). */
#define CAP_FORK_MAX 64
int cap_named_fork(const char *name, unsigned count, const char *prefix, bool leave_paused,
		   char (*children)[CAP_NAME_MAX + 1], char snap[CAP_NAME_MAX + 1], struct cap_err *err);
struct cap_snapshot_info {
	char name[CAP_NAME_MAX + 1];
	char parent[CAP_NAME_MAX + 1];
	char image[72];
	int64_t created;	/* Unix time */
	int64_t save_ms;	/* from the request to the parent going on */
	unsigned cpus, memory_mib;
	bool has_nic;
	uint64_t ram_bytes, disk_bytes;	/* allocated on the host */
	char **children;	/* sandboxes made from it, by name */
	size_t nchildren;
	char error[sizeof(((struct cap_err *)0)->msg)];	/* cap_snapshot_inspect_all: why it cannot be read, "" */
};
/* The complete snapshots, sorted (free each, then the array). */
int cap_snapshot_list(char ***names, size_t *n);
int cap_snapshot_inspect(const char *snap, struct cap_snapshot_info *out, struct cap_err *err);
/* Every complete snapshot's, sorted, *out a new array of *n (fini each,
 * then free); the records read once for all. One that cannot be read
 * has only its name and error. 0. */
int cap_snapshot_inspect_all(struct cap_snapshot_info **out, size_t *n);
void cap_snapshot_info_fini(struct cap_snapshot_info *i);
/* Remove a snapshot: -EBUSY naming them while sandboxes are made from
 * it. */
int cap_snapshot_remove(const char *snap, struct cap_err *err);

#endif
