/* Making cgroup folders, shared by the jail (jail-cgroup.c) and the OCI
 * runtime's cgroupsPath (src/oci/oci-cgroup.c). Host only. */
#ifndef CAP_CGROUP_H
#define CAP_CGROUP_H

#include <stdbool.h>

#include "err.h"

/* A cgroup path below a hierarchy's root, as given by a caller (an OCI
 * cgroupsPath, CAPSULE_CGROUP_PARENT): p without its leading slashes, or
 * NULL when it has empty, "." or ".." components. */
const char *cap_cgroup_rel_path(const char *p);

/* Write s to an existing cgroup file (a limit, cgroup.procs): 0 or
 * -errno. */
int cap_cgroup_write(const char *path, const char *s);

/* cgroup v2: hand the memory, pids and cpu controllers down from dir to
 * its children, each one separately and only those dir offers (its
 * cgroup.controllers) and has not enabled yet, as runc does: a host that
 * does not delegate cpu still gets memory and pids. 0, or -errno with
 * err naming the file and the controller. */
int cap_cgroup_delegate(const char *dir, struct cap_err *err);

/* mkdir -p of root/rel ("a/b/c", relative), every level 0755; with v2,
 * every level made delegate (above; root too, best effort), so that
 * limits can be written in the last level's children. 0, or -errno with
 * err set. */
int cap_cgroup_mkdir_p(const char *root, const char *rel, bool v2,
		       struct cap_err *err);

#endif
