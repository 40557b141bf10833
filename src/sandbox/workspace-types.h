/* The workspace's types that front ends show (through the controller's
 * results) without the rest of workspace.h (which needs sandbox.h). */
#ifndef CAP_WORKSPACE_TYPES_H
#define CAP_WORKSPACE_TYPES_H

#include <stddef.h>

/* A plan's ops counted by what they do. */
struct cap_workspace_counts {
	size_t written, removed, links, created, chmod;	/* WRITE, REMOVE, LINK, MKDIR, CHMOD */
	size_t git;	/* changes inside .git or other repositories, left out (cap_merge_plan's ngit) */
};

#endif
