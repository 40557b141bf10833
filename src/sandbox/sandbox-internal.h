/* Shared inside src/sandbox only. */
#ifndef CAP_SANDBOX_INTERNAL_H
#define CAP_SANDBOX_INTERNAL_H

#include <jansson.h>

#include "named.h"
#include "sandbox.h"
#include "tree.h"

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
/* The guest's listeners changed: forward the new ones to the same port
 * on the host's 127.0.0.1, stop forwarding the gone ones (auto-publish). */
int cap_sandbox_net_listeners(struct cap_sandbox_net *n, struct cap_vm *vm,
			      const uint16_t *ports, uint32_t nports, struct cap_err *err);

/* Named sandboxes on disk, in parts: records (sandbox-named.c), disks
 * (sandbox-named-disk.c), creation (sandbox-named-create.c) and running
 * (sandbox-named-run.c). */
/* The path of file in name's directory; new string. */
char *in_dir(const char *name, const char *file);
/* What SETUP takes of a tmpfs mount, for create and load alike. */
int tmpfs_check(const struct cap_setup_tmpfs *t, const char *where, size_t i, int code,
		struct cap_err *err);
/* Write rec's record.json (atomically). */
int write_record(const struct cap_record *rec, struct cap_err *err);
/* The VM's engine and hypervisor process as the shim recorded them in
 * runtime.json j ("engine", "vmm_pid"); a file from before engines has
 * only "qemu_pid", of the one engine there was. */
void runtime_vmm(json_t *j, char *engine, size_t len, pid_t *pid);
/* cap_named_check_size with the workspace's disk (ws_mib, 0: none)
 * counted in the host-space check with the other two. */
int check_size(unsigned cpus, unsigned memory_mib, unsigned root_mib,
	       unsigned work_mib, unsigned ws_mib, bool force, struct cap_err *err);
/* An ext4 disk of mib MiB at path (new, 0600): empty, or with a copy of
 * the host directory from (mke2fs -d: no root needed) and room for at
 * least inodes inodes (0: mke2fs's default). */
int make_disk(const char *path, unsigned mib, bool tool_owned, const char *label,
	      const char *from, uint64_t inodes, struct cap_err *err);
/* Build source.erofs from rec->source (or an empty tree, so that every
 * sandbox has the same devices) and note what it holds in rec. */
int project(struct cap_record *rec, cap_progress_fn progress, void *ud,
	    struct cap_err *err);
/* What one entry of the project looked like on the host (sandbox-named-disk.c). */
struct stamp;
/* A new sandbox's workspace, prepared before anything is made. */
struct ws_prep {
	struct cap_tree tree;	/* the base manifest */
	struct stamp *st;	/* st[i] for tree.v[i], st[tree.n] for the root */
	uint64_t inodes;	/* for mke2fs -N */
	int dfd;	/* the project directory, O_PATH */
};
void ws_prep_fini(struct ws_prep *w);
/* rec->workspace made canonical and scanned by the copy-in rules, the
 * size of its disk chosen (or the one asked for checked), and every
 * entry stamped. */
int ws_prepare(struct cap_record *rec, cap_progress_fn progress, void *ud,
	       struct ws_prep *w, struct cap_err *err);
/* Make workspace.ext4 holding a copy of the project, check that the
 * project did not change meanwhile, and save the base manifest. */
int ws_make(const struct cap_record *rec, struct ws_prep *w, cap_progress_fn progress,
	    void *ud, struct cap_err *err);

#endif
