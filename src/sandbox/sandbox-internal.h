/* Shared inside src/sandbox only. */
#ifndef CAP_SANDBOX_INTERNAL_H
#define CAP_SANDBOX_INTERNAL_H

#include "sandbox.h"

/* Resolve what a VM for o needs (accelerator, kernel, initramfs) into cfg;
 * *kernel and *initrd are new strings cfg points into. */
int cap_sandbox_prepare(const struct cap_sandbox_opts *o, struct cap_vm_config *cfg,
			struct cap_accel_choice *accel, char **kernel, char **initrd,
			struct cap_err *err);

/* The template for cfg (built now if missing): its key and directory
 * (*dir a new string). */
int cap_template_for(const struct cap_sandbox_opts *o, const struct cap_vm_config *cfg,
		     char key[65], char **dir, struct cap_err *err);
/* Remove a template that failed to restore. */
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

/* Boot cfg, wait for the agent, save the device state to state, stop. */
int cap_sandbox_snapshot(const struct cap_vm_config *cfg, int timeout_ms,
			 const char *state, struct cap_err *err);

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

#endif
