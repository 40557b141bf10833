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

/* Boot cfg, wait for the agent, save the device state to state, stop. */
int cap_sandbox_snapshot(const struct cap_vm_config *cfg, int timeout_ms,
			 const char *state, struct cap_err *err);

#endif
