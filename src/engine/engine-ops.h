/* What an engine implements: one const table of operations per kind of
 * hypervisor process (QEMU's is in engine-qemu.c), chosen at run time by
 * name (engine.c, cap_engine_get). Only src/engine includes this (and
 * tests/fuzz/fuzz-qmp.c, for the QMP reader at its end, and
 * tests/unit/test-engine.c): above
 * it, an engine is an opaque const struct cap_engine_ops * and a VM a
 * struct cap_vm driven through engine.h's cap_vm_* calls, which dispatch
 * here. Contracts are engine.h's, under the cap_vm_* or cap_engine_*
 * call of the same name. */
#ifndef CAP_ENGINE_OPS_H
#define CAP_ENGINE_OPS_H

#include "engine.h"

/* The part of every engine's VM that engine.c reads: an engine's own
 * struct starts with it (struct qemu_vm { struct cap_vm base; ... }) and
 * gets back to itself with container_of. */
struct cap_vm {
	const struct cap_engine_ops *ops;
};

struct cap_engine_ops {
	const char *name;	/* "qemu": CAPSULE_ENGINE, runtime.json's "engine" */

	/* Engine-wide, no VM needed. */
	char *(*identity)(enum cap_accel accel);
	int (*version)(char **out, struct cap_err *err);
	bool (*wants_ram_fd)(void);
	int (*end_leftover)(const char *dir, pid_t pid);

	/* One VM. start fills *out with a VM whose base.ops is this table. */
	int (*start)(const struct cap_vm_config *cfg, struct cap_vm **out, struct cap_err *err);
	int (*event_fd)(const struct cap_vm *vm);
	int (*io_errors)(struct cap_vm *vm, struct cap_vm_io_error *last);
	int (*agent_fd)(const struct cap_vm *vm);
	int (*exit_fd)(const struct cap_vm *vm);
	pid_t (*pid)(const struct cap_vm *vm);
	int (*net_control_fd)(const struct cap_vm *vm);
	pid_t (*net_pid)(const struct cap_vm *vm);
	int (*net_deny)(struct cap_vm *vm, const uint32_t (*deny)[2], unsigned n, struct cap_err *err);
	int (*net_forward)(struct cap_vm *vm, uint16_t port, bool add, struct cap_err *err);
	const char *(*jail_note)(const struct cap_vm *vm);
	const char *(*ram_note)(const struct cap_vm *vm);
	int (*wait)(struct cap_vm *vm, int timeout_ms);
	const char *(*exit_reason)(const struct cap_vm *vm);
	int (*pause)(struct cap_vm *vm, struct cap_err *err);
	int (*resume)(struct cap_vm *vm, struct cap_err *err);
	int (*save)(struct cap_vm *vm, const char *state_path, struct cap_err *err);
	int (*save_full)(struct cap_vm *vm, const char *state_path, struct cap_err *err);
	int (*quit)(struct cap_vm *vm);
	void (*kill)(struct cap_vm *vm);
	char *(*logs_tail)(const struct cap_vm *vm, int lines);
	void (*free)(struct cap_vm *vm);
};

/* The engines, in engine.c's table. */
extern const struct cap_engine_ops cap_engine_qemu;

/* Why a VM's program could not open the host's KVM device dev
 * ("/dev/kvm") and what to do, in buf (returned): e is the errno it met,
 * confined whether it ran in the jail (cap_jail_device_probe;
 * cap_jail_confined). engine-accel.c; for the choice of accelerator and
 * for an engine explaining its process's failure. */
const char *cap_engine_kvm_advice(const char *dev, int e, bool confined, char *buf, size_t len);

/* What QEMU's log (its stderr) says went wrong, as a cause and what to do
 * in buf (returned), or NULL when it says nothing this knows: "Could not
 * access KVM kernel module: ...", "kvm version too old" (a /dev/kvm that
 * is not KVM's) (confined: whether QEMU ran in the jail).
 * engine-qemu.c. */
const char *cap_qemu_log_explain(const char *log, bool confined, char *buf, size_t len);

/* QEMU's QMP reader (engine-qemu.c), its parts that see QEMU's bytes (a
 * jailed QEMU is untrusted), callable alone for tests/fuzz/fuzz-qmp.c. */
struct cap_buf;
struct json_t;
/* Take one newline-terminated message from in: 0 with it in buf (len
 * bytes, NUL-terminated, without its newline); -EMSGSIZE when it does not
 * fit (the line, or len bytes of it without an end yet, consumed all the
 * same); -EAGAIN when in holds no whole one and fewer than len bytes. */
int cap_qmp_take_line(struct cap_buf *in, char *buf, size_t len);
/* An event message: a disk's BLOCK_IO_ERROR is counted in *io_errors and
 * kept in *io_last; the rest does not concern us. */
void cap_qmp_event(struct json_t *j, unsigned *io_errors, struct cap_vm_io_error *io_last);
/* One message read while waiting for the answer to cmd: 1 when it is not
 * the answer (an event, taken as cap_qmp_event does), 0 for the answer
 * (*ret, when ret is not NULL, a new reference to its "return" value),
 * -EIO for an error answer, -EPROTO for a line that is not JSON; err
 * names cmd. */
int cap_qmp_reply(const char *line, const char *cmd, unsigned *io_errors,
		  struct cap_vm_io_error *io_last, struct json_t **ret, struct cap_err *err);

#endif
