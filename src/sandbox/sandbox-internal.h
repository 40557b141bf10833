/* Shared inside src/sandbox only. */
#ifndef CAP_SANDBOX_INTERNAL_H
#define CAP_SANDBOX_INTERNAL_H

#include <jansson.h>

#include "engine.h"
#include "named.h"
#include "sandbox.h"
#include "tree.h"
#include "xfer.h"

/* The template cache (sandbox-template.c): it never starts a VM;
 * sandbox-vm.c boots one and saves it into a staging directory.
 * The key of the template for o and cfg: everything that shapes the VM's
 * saved state (the engine's identity, kernel, initramfs, accelerator,
 * vCPUs, memory, the sandbox's shape and the files it shares). */
void cap_template_key(const struct cap_sandbox_opts *o, const struct cap_vm_config *cfg,
		      char key[65]);
/* The directory of key's complete template (a new string), or NULL when
 * there is none (an incomplete one is removed). */
char *cap_template_lookup(const char *key);
/* A new staging directory (*tmp, a new string) for a template of a
 * mem_mib VM, on a file system with room for one (-ENOSPC naming it
 * otherwise). It is to hold "state" and "ram", then be stored or
 * discarded. */
int cap_template_stage(unsigned mem_mib, char **tmp, struct cap_err *err);
/* A sparse placeholder for per-sandbox disk i in staging directory tmp
 * (*path, a new string). */
int cap_template_placeholder(const char *tmp, unsigned i, char **path, struct cap_err *err);
/* Store staging directory tmp as key's template, described by desc (for
 * `capsule template ls`), with the engine, accelerator and engine
 * identity of cfg, the VM it was made with: *dir its directory, a new
 * string. tmp is gone afterwards, stored or not (another process may have
 * stored the same key first: that one is kept). */
int cap_template_store(const char *tmp, const char *key, const char *desc,
		       const struct cap_vm_config *cfg, char **dir, struct cap_err *err);
/* Remove a staging directory, or a template that failed to restore. */
void cap_template_discard(const char *dir);

/* Snapshots (sandbox-snapshot.c): the file a sandbox's own disk of
 * this serial has in a snapshot ("private.ext4"), NULL for none; and
 * the copy of such a disk (a qcow2 overlay flattened) at dst. */
const char *cap_snapshot_disk_file(const char *serial);
int cap_snapshot_copy_disk(const char *src, bool qcow2, const char *dst, struct cap_err *err);

/* Shared template RAM (sandbox-ramhold.c, docs/architecture.md "Shared
 * template RAM"). A descriptor of the sealed memfd holding the RAM of the
 * template in directory tdir, from its holder (started now if there is
 * none): all four seals and the size are checked here. *conn is the
 * connection to the holder, to be kept open (and closed by the caller)
 * while a VM maps the memfd: the holder ends only once no connection has
 * been open for a while. Both are the caller's to close. -errno with err
 * saying why (the caller then copies the RAM instead). */
int cap_ramhold_get(const char *tdir, int *conn, struct cap_err *err);
/* False when CAPSULE_SHARED_RAM=0 asks for a per-VM copy. */
bool cap_ramhold_enabled(void);

/* Run `true` in sb's guest once and wait for it to end: the guest's
 * first command's translation done ahead (cap_named_warm, spares). */
int cap_sandbox_warm(struct cap_sandbox *sb, struct cap_err *err);

/* Spares for `capsule run` (sandbox-spare.c; docs/architecture.md,
 * "Spares for capsule run"): what a spare's holder gives the caller it
 * gives the VM to, with the agent channel's descriptor. */
struct cap_spare_given {
	char key[65];	/* the template it was restored from */
	uint32_t version, next_id;	/* its agent's protocol version; the next stream id */
	char agent_version[128];
	struct cap_accel_choice accel;
	char boot_note[720];
	char jail_note[512];
	int32_t vmm_pid, holder_pid;
};
/* What sb, booted and warmed, is to the caller that takes it over. */
void cap_sandbox_spare_fill(const struct cap_sandbox *sb, struct cap_spare_given *g);
/* sb's agent channel (borrowed). */
int cap_sandbox_agent_channel(const struct cap_sandbox *sb);
/* A spare of template key from the holder: 0 with *g, *agent (the VM's
 * agent channel, past HELLO and SETUP) and *conn (the holder's
 * connection: its close ends the VM), all the caller's; -ENOENT, with
 * nothing said, when no holder listens; another -errno with err saying
 * why no spare was taken (none ready, another template, ...). */
int cap_spare_take(const char *key, struct cap_spare_given *g, int *agent, int *conn, struct cap_err *err);

/* The owner's side of a sandbox's NIC (sandbox-net.c). */
struct cap_sandbox_net;
/* For o->spec's policy: bind the published ports on the host, compute
 * the denied ranges; with secrets, make or load the CA (o->ca_dir), load
 * the host's trust store and read every value (secret.h): any failure is
 * the start's, nothing kept. The engine's part is cap_sandbox_net_vm. */
int cap_sandbox_net_new(const struct cap_sandbox_opts *o, struct cap_sandbox_net **out,
			struct cap_err *err);
const struct cap_vm_net *cap_sandbox_net_vm(const struct cap_sandbox_net *n);
/* With secrets, SETUP's part: the CA certificate (ca_pem) and
 * "NAME=<placeholder>" for each secret after s's own env, in env (room
 * for CAP_SETUP_MAX_ENV). s then points into n and env: encode it before
 * cap_sandbox_net_started. Nothing without secrets. */
int cap_sandbox_net_setup(struct cap_sandbox_net *n, struct cap_setup *s,
			  char *env[CAP_SETUP_MAX_ENV], struct cap_err *err);
/* The NIC of a template being built: the same device, nothing gets out. */
const struct cap_vm_net *cap_sandbox_net_template(void);
/* The VM runs: the owner's copies of the published ports' listeners are
 * closed, and the secrets' values, the CA key and the trust store wiped
 * (the policy process has its own). */
void cap_sandbox_net_started(struct cap_sandbox_net *n);
void cap_sandbox_net_free(struct cap_sandbox_net *n);
/* Replace the policy of a running VM: the kernel's denied ranges, then
 * the policy process's rules (new connections). Published ports and the
 * NIC stay as they were. */
int cap_sandbox_net_set_policy(struct cap_sandbox_net *n, struct cap_vm *vm,
			       const struct cap_net_policy *p, struct cap_err *err);
/* Credential files (--secret-file). The descriptor to poll for a change
 * of a host file (inotify; -1 when there are none or it cannot be
 * watched). Then the guest's copies to write (path under /work, text
 * with placeholders, owned_text to free): at start all of them (all:
 * their values were read just before, for the policy process), later
 * those whose host file changed, after their new values were given to
 * the policy process. A file that cannot be read or checked later is
 * logged and keeps its values; at start it fails the start. */
struct cap_sandbox_cred_copy {
	char path[256];
	char *owned_text;
	size_t len;
};
int cap_sandbox_net_watch_fd(struct cap_sandbox_net *n);
int cap_sandbox_net_cred_copies(struct cap_sandbox_net *n, struct cap_vm *vm, bool all,
				struct cap_sandbox_cred_copy out[CAP_NET_MAX_SECRET_FILES], unsigned *nout,
				struct cap_err *err);
/* The guest's listeners changed: forward the new ones to the same port
 * on the host's 127.0.0.1, stop forwarding the gone ones (auto-publish). */
int cap_sandbox_net_listeners(struct cap_sandbox_net *n, struct cap_vm *vm,
			      const uint16_t *ports, uint32_t nports, struct cap_err *err);

/* PortForward for a VM with a pod's NIC (sandbox-podnet.c): the shim
 * listens on 127.0.0.1:PORT in the pod's network namespace for each
 * port the guest listens on, and relays each connection to the guest's
 * 127.0.0.1:PORT (CONNECT). Driven from the shim's poll loop. */
struct cap_portfwd;
struct cap_portfwd *cap_portfwd_new(void);
/* The guest's listeners are now ports[0..n) (cap_sandbox_take_listeners):
 * listen for the new ones, stop the gone ones (their connections go
 * on). sb is the VM they are relayed to (borrowed, kept). */
void cap_portfwd_listeners(struct cap_portfwd *pf, struct cap_sandbox *sb, const uint16_t *ports,
			   uint32_t n);
/* How many pollfds it wants; fill them (read_ok: the agent channel has
 * room, the clients may be read); handle their revents. */
size_t cap_portfwd_npoll(const struct cap_portfwd *pf);
void cap_portfwd_pollfds(const struct cap_portfwd *pf, struct pollfd *pfd, bool read_ok);
void cap_portfwd_dispatch(struct cap_portfwd *pf, const struct pollfd *pfd);
/* Whether a connection holds so much of the guest's output that the
 * agent channel should not be read for now. */
bool cap_portfwd_full(const struct cap_portfwd *pf);
/* Close every listener and connection (the VM is going: no callback
 * comes any more). */
void cap_portfwd_reset(struct cap_portfwd *pf);
void cap_portfwd_free(struct cap_portfwd *pf);

/* Named sandboxes on disk, in parts: records (sandbox-named.c), disks
 * (sandbox-named-disk.c), creation (sandbox-named-create.c) and running
 * (sandbox-named-run.c). */
/* The path of file in name's directory; new string. */
char *cap_named_path(const char *name, const char *file);
/* What SETUP takes of a tmpfs mount, for create and load alike. */
int cap_named_tmpfs_check(const struct cap_setup_tmpfs *t, const char *where, size_t i, int code,
			  struct cap_err *err);
/* Write rec's record.json (atomically). */
int cap_named_write_record(const struct cap_record *rec, struct cap_err *err);
/* The VM's engine and hypervisor process as the shim recorded them in
 * runtime.json j ("engine", "vmm_pid"); a file from before engines has
 * only "qemu_pid", of the one engine there was. */
void cap_named_runtime_vmm(json_t *j, char *engine, size_t len, pid_t *pid);
/* cap_named_check_size with the workspace's disk (ws_mib, 0: none)
 * counted in the host-space check with the other two. */
int cap_named_check_size_ws(unsigned cpus, unsigned memory_mib, unsigned root_mib,
			    unsigned work_mib, unsigned ws_mib, bool force, struct cap_err *err);
/* An ext4 disk of mib MiB at path (new, 0600): empty, or with a copy of
 * the host directory from (mke2fs -d: no root needed) and room for at
 * least inodes inodes (0: mke2fs's default). */
int cap_named_make_disk(const char *path, unsigned mib, bool tool_owned, const char *label,
			const char *from, uint64_t inodes, struct cap_err *err);
/* Build source.erofs from rec->source (or an empty tree, so that every
 * sandbox has the same devices) and note what it holds in rec. */
int cap_named_project(struct cap_record *rec, cap_progress_fn progress, void *ud,
		      struct cap_err *err);
/* What one entry of the project looked like on the host (sandbox-named-disk.c). */
struct cap_named_stamp;
/* A new sandbox's workspace, prepared before anything is made. */
struct cap_named_ws {
	struct cap_tree tree;	/* the base manifest */
	struct cap_named_stamp *st;	/* st[i] for tree.v[i], st[tree.n] for the root */
	uint64_t inodes;	/* for mke2fs -N */
	int dfd;	/* the project directory, O_PATH */
};
void cap_named_ws_fini(struct cap_named_ws *w);
/* rec->workspace made canonical and scanned by the copy-in rules, the
 * size of its disk chosen (or the one asked for checked), and every
 * entry stamped. */
int cap_named_ws_prepare(struct cap_record *rec, cap_progress_fn progress, void *ud,
			 struct cap_named_ws *w, struct cap_err *err);
/* Make workspace.ext4 holding a copy of the project, check that the
 * project did not change meanwhile, and save the base manifest. */
int cap_named_ws_make(const struct cap_record *rec, struct cap_named_ws *w, cap_progress_fn progress,
		      void *ud, struct cap_err *err);

/* Transfers over the agent channel, in parts: the FILE operation every
 * transfer runs, kind and manifest (sandbox-xfer.c), put
 * (sandbox-xfer-put.c), get and fetch (sandbox-xfer-get.c). */
/* Longest line accepted from a guest: an escaped path and its reason. */
#define CAP_XFER_LINE_MAX (3 * CAP_TREE_MAX_PATH + 1024)
/* Append s (owned) to the array *v of *n strings. */
void cap_xfer_push(char ***v, size_t *n, char *s);
/* Add a formatted line to res->refused. */
__attribute__((format(printf, 2, 3))) void cap_xfer_refuse(struct cap_xfer_result *res,
							   const char *fmt, ...);
/* "root/path", or root for the path "". New string. */
char *cap_xfer_shown_path(const char *root, const char *path);
/* Whether name is one path component we may give an entry. */
bool cap_xfer_component_ok(const char *name);
/* One FILE streaming operation: its stream, how it ended, its STDERR lines,
 * and where its STDOUT goes (out). */
struct cap_xfer_op {
	struct cap_sandbox *sb;
	uint32_t id;
	bool started, done;
	struct cap_exit ex;
	bool rejected;	/* the agent or the shim refused the stream */
	int rej_errno;
	char rej_msg[512];
	/* Takes the STDOUT bytes; < 0 stops the transfer: the stream is
	 * killed, the error kept in sink_err. */
	int (*out)(struct cap_xfer_op *o, const uint8_t *p, size_t n);
	int sink_err;
	struct cap_buf errbuf;
	struct cap_lines errst;
	char **msgs;	/* STDERR lines, "capsule: " taken off, sanitized */
	size_t nmsgs, dropped;
};
void cap_xfer_op_init(struct cap_xfer_op *o, struct cap_sandbox *sb,
		      int (*out)(struct cap_xfer_op *, const uint8_t *, size_t));
void cap_xfer_op_fini(struct cap_xfer_op *o);
int cap_xfer_op_start(struct cap_xfer_op *o, uint32_t file_op, const char *root, const char *path,
		      uint32_t limit, struct cap_err *err);
/* The one loop every transfer runs in: drive the agent channel until the
 * operation ends or, unless until_done, until what is queued for the
 * guest is down to XFER_BACKLOG (the flow control of STDIN). */
int cap_xfer_pump(struct cap_xfer_op *o, bool until_done, struct cap_err *err);
/* Queue bytes for the operation's STDIN, keeping the backlog bounded;
 * once the operation has ended they are dropped (its status says why). */
int cap_xfer_feed(struct cap_xfer_op *o, const void *p, size_t n, struct cap_err *err);
/* Up to a few of the guest's messages joined with "; " (for an error). */
void cap_xfer_messages(const struct cap_xfer_op *o, char *buf, size_t len);
/* How the guest ended the operation: its exit code 0 or 1 (some paths
 * refused, in msgs), or -errno with err naming what (the path missing,
 * nothing could be done, a signal). */
int cap_xfer_op_status(const struct cap_xfer_op *o, const char *what, struct cap_err *err);
/* Move the guest's messages into res->refused. */
void cap_xfer_take_messages(struct cap_xfer_op *o, struct cap_xfer_result *res);
/* After an error of ours: make sure the operation is over (kill it if it
 * runs) so that the connection can serve the next call. */
void cap_xfer_op_abort(struct cap_xfer_op *o);

#endif
