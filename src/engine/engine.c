/* The engines there are, and cap_vm_* dispatching to the engine each VM
 * was started with (engine-ops.h). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine-ops.h"
#include "util.h"

/* The first is the default. A second engine adds its table here. */
static const struct cap_engine_ops *const engines[] = {
	&cap_engine_qemu,
};

int cap_engine_get(const char *name, const struct cap_engine_ops **out,
		   struct cap_err *err)
{
	const char *env = getenv("CAPSULE_ENGINE");
	const char *want = name ? name : env && *env ? env : engines[0]->name;
	char list[256] = "";
	for (size_t i = 0; i < CAP_ARRAY_SIZE(engines); i++) {
		if (strcmp(engines[i]->name, want) == 0) {
			*out = engines[i];
			return 0;
		}
		size_t used = strlen(list);
		snprintf(list + used, sizeof(list) - used, "%s%s", i ? ", " : "", engines[i]->name);
	}
	return cap_err_set(err, ENOENT, "no engine called \"%s\"%s; the engines are: %s", want,
			   name ? "" : " (CAPSULE_ENGINE)", list);
}

const struct cap_engine_ops *cap_engine_default(void) { return engines[0]; }
const char *cap_engine_name(const struct cap_engine_ops *e) { return e->name; }
char *cap_engine_identity(const struct cap_engine_ops *e, enum cap_accel accel) { return e->identity(accel); }
int cap_engine_version(const struct cap_engine_ops *e, char **out, struct cap_err *err) { return e->version(out, err); }
bool cap_engine_wants_ram_fd(const struct cap_engine_ops *e) { return e->wants_ram_fd(); }
int cap_engine_end_leftover(const struct cap_engine_ops *e, const char *dir, pid_t pid) { return e->end_leftover(dir, pid); }

int cap_vm_start(const struct cap_vm_config *cfg, struct cap_vm **out,
		 struct cap_err *err)
{
	const struct cap_engine_ops *e = cfg->engine;
	int r;
	if (!e && (r = cap_engine_get(NULL, &e, err)) < 0)
		return r;
	if ((r = e->start(cfg, out, err)) < 0)
		return r;
	CAP_BUG_ON((*out)->ops != e);
	return 0;
}

const struct cap_engine_ops *cap_vm_engine(const struct cap_vm *vm) { return vm->ops; }
int cap_vm_event_fd(const struct cap_vm *vm) { return vm->ops->event_fd(vm); }
int cap_vm_io_errors(struct cap_vm *vm, struct cap_vm_io_error *last) { return vm->ops->io_errors(vm, last); }
int cap_vm_agent_fd(const struct cap_vm *vm) { return vm->ops->agent_fd(vm); }
int cap_vm_exit_fd(const struct cap_vm *vm) { return vm->ops->exit_fd(vm); }
pid_t cap_vm_pid(const struct cap_vm *vm) { return vm->ops->pid(vm); }
int cap_vm_net_control_fd(const struct cap_vm *vm) { return vm->ops->net_control_fd(vm); }
pid_t cap_vm_net_pid(const struct cap_vm *vm) { return vm->ops->net_pid(vm); }
const char *cap_vm_jail_note(const struct cap_vm *vm) { return vm->ops->jail_note(vm); }
const char *cap_vm_ram_note(const struct cap_vm *vm) { return vm->ops->ram_note(vm); }
int cap_vm_wait(struct cap_vm *vm, int timeout_ms) { return vm->ops->wait(vm, timeout_ms); }
const char *cap_vm_exit_reason(const struct cap_vm *vm) { return vm->ops->exit_reason(vm); }
int cap_vm_pause(struct cap_vm *vm, struct cap_err *err) { return vm->ops->pause(vm, err); }
int cap_vm_resume(struct cap_vm *vm, struct cap_err *err) { return vm->ops->resume(vm, err); }
int cap_vm_quit(struct cap_vm *vm) { return vm->ops->quit(vm); }
void cap_vm_kill(struct cap_vm *vm) { vm->ops->kill(vm); }
char *cap_vm_logs_tail(const struct cap_vm *vm, int lines) { return vm->ops->logs_tail(vm, lines); }

int cap_vm_net_deny(struct cap_vm *vm, const uint32_t (*deny)[2], unsigned n,
		    struct cap_err *err)
{
	return vm->ops->net_deny(vm, deny, n, err);
}

int cap_vm_net_forward(struct cap_vm *vm, uint16_t port, bool add,
		       struct cap_err *err)
{
	return vm->ops->net_forward(vm, port, add, err);
}

int cap_vm_save(struct cap_vm *vm, const char *state_path, struct cap_err *err)
{
	return vm->ops->save(vm, state_path, err);
}

int cap_vm_save_full(struct cap_vm *vm, const char *state_path, struct cap_err *err)
{
	return vm->ops->save_full(vm, state_path, err);
}

void cap_vm_free(struct cap_vm *vm)
{
	if (vm)
		vm->ops->free(vm);
}
