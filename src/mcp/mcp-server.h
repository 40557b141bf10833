/* Inside src/mcp: the server's state and a tool call's, shared by its
 * files (mcp.c: MCP on stdio and the local controller; mcp-tools.c: the
 * tools; mcp-remote.c: a controller in another process; mcp-config.c:
 * the configuration). */
#ifndef CAP_MCP_SERVER_H
#define CAP_MCP_SERVER_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>

#include "controller.h"
#include "jsonrpc.h"
#include "mcp.h"
#include "serve.h"

struct mcp_call;

struct mcp {
	struct cap_mcp_cfg *cfg;
	struct cap_rpc_reader in;	/* stdin */
	struct cap_buf out;	/* stdout */
	bool initialized;
	bool eof;
	struct mcp_call *calls;	/* tool calls not answered yet */
	/* Local: this process runs the controller. */
	struct cap_ctl *ctl;
	struct cap_ctl_fe *fe;
	/* Remote: the home's controller runs in another process (capsule
	 * serve, or another capsule mcp); this one is its client. */
	int srv_fd;
	struct cap_ctl_holder holder;
	struct cap_rpc_reader srv_in;
	struct cap_buf srv_out;
	long long next_rid;
	bool srv_broken;	/* an answer was lost: give up on the server */
	bool said_preparing;	/* the preparation's line on stderr is out */
};

/* What a tool call needs to turn the controller's answer into a result. */
struct mcp_call {
	json_t *id;	/* the MCP request's */
	bool gone;	/* cancelled by the client: no answer */
	enum cap_mcp_tool tool;
	enum cap_ctl_kind kind;
	uint64_t offset;	/* first line or entry, 1-based */
	uint32_t limit;	/* lines or entries */
	uint32_t timeout_s;	/* run_command */
	char shown[4300];	/* the path as the model sees it, /source/... */
	struct cap_ctl_call *call;	/* local */
	long long rid;	/* remote: the request's id on the server's socket */
	json_t *progress_token;	/* params._meta.progressToken, or NULL */
	double progress;	/* the last progress sent (it must grow) */
	int64_t line_at;	/* when a build line was last sent (ms) */
	struct mcp_call *next;
};

/* mcp.c */
void mcp_result(struct mcp *m, json_t *id, json_t *result);
void mcp_error(struct mcp *m, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
/* Hand a tool call to the controller: this process's, or the home's
 * controller over its socket. mc is on m->calls until mcp_tool_reply. */
void mcp_submit(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
	    const struct cap_ctl_req *req);
void mcp_progress(struct mcp *m, struct mcp_call *mc, const char *phase, const char *status,
		 unsigned done, const char *message);
/* Read stdin; false at its end. */
bool mcp_read_stdin(struct mcp *m);
/* Write stdout; false when nobody reads it any more. */
bool mcp_write_stdout(struct mcp *m);

/* mcp-tools.c */
void mcp_call_free(struct mcp_call *mc);
/* The controller answered a tool call: make it an MCP tool result. */
void mcp_tool_reply(struct mcp *m, struct mcp_call *mc, const struct cap_ctl_result *r);
void mcp_tools_list(struct mcp *m, json_t *id);
void mcp_tools_call(struct mcp *m, json_t *id, json_t *params);

/* mcp-remote.c */
void mcp_remote_send(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
		 const struct cap_ctl_req *req);
int mcp_run_remote(struct mcp *m, struct cap_err *err);

#endif
