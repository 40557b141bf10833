/* Inside the controller: the real backend and the identity records. */
#ifndef CAP_CONTROLLER_INTERNAL_H
#define CAP_CONTROLLER_INTERNAL_H

#include "controller-backend.h"
#include "controller.h"
#include "err.h"
#include "log.h"
#include "named.h"

extern const struct cap_ctl_backend ctl_named_backend;

/* workspaces/<agent>/<peer>/record.json: identity → sandbox name. */
int ctl_idrec_write(const char *home, const char *agent, const char *peer,
		    const char *sandbox, struct cap_err *err);
int ctl_idrec_read(const char *home, const char *agent, const char *peer,
		   char name[CAP_NAME_MAX + 1]);
void ctl_idrec_remove(const char *home, const char *agent, const char *peer);
/* The identity's size override ("size"; fields 0: not given), kept
 * across new mappings; written with the record's sandbox name (sandbox:
 * the one it will have, when the record names none yet). */
int ctl_idrec_set_size(const char *home, const char *agent, const char *peer,
		       const char *sandbox, const struct cap_ctl_size *over, struct cap_err *err);
/* 0 with *out (zeroed fields: none), -ENOENT without a record. */
int ctl_idrec_read_size(const char *home, const char *agent, const char *peer,
			struct cap_ctl_size *out);

/* The private import's note in the record: when it ran (Unix time; 0:
 * it has not) and what it did. */
struct ctl_idrec_import {
	int64_t when;
	uint64_t files, dirs, bytes, conflicts, refused;
	bool absent;	/* there was nothing to import */
};
/* Add the note to the identity's record (atomically; the rest kept). */
int ctl_idrec_note_import(const char *home, const char *agent, const char *peer,
			  const struct ctl_idrec_import *note, struct cap_err *err);
/* The note: 0 with *out filled (when 0 if none), -ENOENT without a record. */
int ctl_idrec_read_import(const char *home, const char *agent, const char *peer,
			  struct ctl_idrec_import *out);
void ctl_idrec_each(const char *home,
		    void (*fn)(void *ud, const char *agent, const char *peer, const char *sandbox),
		    void *ud);

#endif
