/* `capsule mcp`: a Model Context Protocol server on stdio whose tools run
 * in the per-identity sandboxes of the controller (docs/mcp.md). */
#ifndef CAP_MCP_H
#define CAP_MCP_H

#include <stdbool.h>
#include <stdint.h>

#include "controller.h"
#include "err.h"

enum cap_mcp_tool { CAP_TOOL_READ_FILE, CAP_TOOL_LIST_DIRECTORY, CAP_TOOL_WRITE_FILE,
		    CAP_TOOL_RUN_COMMAND, CAP_TOOL_COUNT_ };

struct cap_mcp_cfg {
	struct cap_controller_cfg ctl;	/* lifecycle, capacity, image, source */
	char *owned_agent;	/* the agent identity (configuration), required */
	char *owned_peer;	/* a fixed peer (--peer), or NULL: from each request's _meta */
	bool tools[CAP_TOOL_COUNT_];	/* read_file on, the others off by default */
	uint32_t read_max_bytes;	/* 2 MiB */
	uint32_t read_max_chars;	/* 32000 */
	uint32_t read_max_lines;	/* 500 lines or entries */
	uint32_t run_timeout_s;	/* 30 */
	char *owned_image;
	char *owned_source;
	/* A host project copied to /workspace of each new sandbox, and the
	 * private import's directory (docs/serve.md); NULL: none. Resolved
	 * (realpath) by cap_mcp_run. */
	char *owned_workspace;
	char *owned_private_import;
	struct cap_net_policy *owned_network;	/* NULL: no network */
	/* The sandboxes have a network: this policy's, or that of the
	 * running controller this one joined. What run_command says. */
	bool has_network;
};

void cap_mcp_cfg_init(struct cap_mcp_cfg *c);
void cap_mcp_cfg_fini(struct cap_mcp_cfg *c);
const char *cap_mcp_tool_name(enum cap_mcp_tool t);
int cap_mcp_tool_parse(const char *name, enum cap_mcp_tool *out);

/* Read a JSON configuration file into c (docs/mcp.md lists the keys);
 * unknown keys and wrong types are errors naming the key. */
int cap_mcp_cfg_load(struct cap_mcp_cfg *c, const char *path, struct cap_err *err);

/* Serve MCP on stdin/stdout until stdin closes or a signal; then stop the
 * sandboxes this server runs. Logs go to stderr only. */
int cap_mcp_run(struct cap_mcp_cfg *c, struct cap_err *err);

#endif
