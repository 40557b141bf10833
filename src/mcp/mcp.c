/* The MCP front end: JSON-RPC 2.0 on stdin/stdout, one message per line.
 * stdout carries protocol messages only; logs go to stderr. Tools run in
 * the sandbox of the identity (configured agent, peer from --peer or from
 * the orchestrator's _meta). One controller owns a home: when one runs
 * (capsule serve, or another capsule mcp), this is its client over its
 * socket; otherwise this process runs it, and listens on the home's
 * socket so that other front ends can join. */
#include <errno.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "log.h"
#include "mcp-server.h"
#include "mcp.h"
#include "paths.h"
#include "policy.h"
#include "serve.h"
#include "util.h"

static const char *const versions[] = { "2025-11-25", "2025-06-18" };

/* --- the server ------------------------------------------------------------------ */

void mcp_result(struct mcp *m, json_t *id, json_t *result)
{
	cap_rpc_put_result(&m->out, id, result);
}

void mcp_error(struct mcp *m, json_t *id, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_rpc_put_error(&m->out, id, code, msg, NULL);
}

/* --- reaching the controller ---------------------------------------------------- */

/* Hand a tool call to the controller: this process's, or the home's
 * controller over its socket. mc is on m->calls until mcp_tool_reply. */
void mcp_submit(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
		   const struct cap_ctl_req *req)
{
	mc->kind = req->kind;
	mc->next = m->calls;
	m->calls = mc;
	if (m->ctl)
		mc->call = cap_ctl_submit(m->ctl, m->fe, agent, peer, req, mc);
	else
		mcp_remote_send(m, mc, agent, peer, req);
}

static void cancel(struct mcp *m, json_t *request_id)
{
	for (struct mcp_call *mc = m->calls; mc; mc = mc->next) {
		if (mc->gone || !json_equal(mc->id, request_id))
			continue;
		mc->gone = true;
		if (m->ctl && mc->call)
			cap_ctl_cancel(m->ctl, mc->call);	/* may free mc */
		else if (!m->ctl)
			cap_rpc_put_request(&m->srv_out, m->next_rid++, "cancel",
					    json_pack("{s:I}", "id", (json_int_t)mc->rid));
		return;
	}
}

/* The preparation's progress for a tool call waiting for it (phase and
 * status by name: the controller's, here or over its socket). stderr
 * gets one line that the first call prepares; a call that sent
 * _meta.progressToken gets notifications/progress: progress grows with
 * each one (the MCP rule), done phases of total 4, a fraction while a
 * phase works; a build's lines at most one a second. */
void mcp_progress(struct mcp *m, struct mcp_call *mc, const char *phase, const char *status,
			unsigned done, const char *message)
{
	if (!m->said_preparing) {
		cap_log(CAP_LOG_INFO, "the first tool call prepares the guest kernel, the initramfs, the image and the template before it runs (minutes when the kernel is built)");
		m->said_preparing = true;
	}
	if (mc->gone || !mc->progress_token || done > CAP_PREP_NPHASES)
		return;
	double v;
	int64_t now = cap_now_ms();
	if (strcmp(status, "ready") == 0) {
		v = done;
	} else if (strcmp(status, "building") == 0) {
		v = done + 0.1;
	} else if (strcmp(status, "line") == 0) {
		if (now - mc->line_at < 1000)
			return;
		/* Closer to the phase's end with each, never reaching it. */
		double base = mc->progress > done ? mc->progress : done;
		v = base + (done + 0.9 - base) / 8;
	} else {
		return;	/* failed: the result says it */
	}
	if (v <= mc->progress)
		return;
	if (strcmp(status, "line") == 0)
		mc->line_at = now;
	mc->progress = v;
	char text[1400];
	snprintf(text, sizeof(text), "preparing: %s %s: %s", phase, status, message ? message : "");
	cap_rpc_put_request(&m->out, -1, "notifications/progress",
			    json_pack("{s:O, s:f, s:i, s:o}", "progressToken", mc->progress_token, "progress", v,
				      "total", CAP_PREP_NPHASES, "message", cap_json_text(text)));
}

/* --- MCP --------------------------------------------------------------------------- */

static void initialize(struct mcp *m, json_t *id, json_t *params)
{
	const char *want = json_string_value(json_object_get(params, "protocolVersion"));
	const char *use = versions[0];
	for (size_t i = 0; want && i < CAP_ARRAY_SIZE(versions); i++)
		if (strcmp(want, versions[i]) == 0)
			use = versions[i];
	m->initialized = true;
	mcp_result(m, id, json_pack("{s:s, s:{s:{s:b}}, s:{s:s, s:s, s:s}, s:s}",
		"protocolVersion", use, "capabilities", "tools", "listChanged", 0,
		"serverInfo", "name", "capsule", "title", "capsule sandboxes", "version", CAPSULE_VERSION,
		"instructions",
		"Tools run in your private sandbox (a microVM). Paths are relative: root \"public\" is the read-only public data (/source), root \"workspace\" your private /work."));
}

static void handle(struct mcp *m, const char *line, size_t len)
{
	struct cap_rpc_msg msg;
	json_t *bad_id;
	char text[600];
	int code = cap_rpc_parse(line, len, &msg, &bad_id, text, sizeof(text));
	if (code != 0) {
		mcp_error(m, bad_id, code, "%s", text);
		cap_rpc_msg_fini(&msg);
		return;
	}
	const char *method = msg.method;
	json_t *id = msg.id;
	json_t *params = msg.params;
	if (!method) {	/* a response to us: we send no requests; ignore */
	} else if (!id) {	/* notifications */
		if (strcmp(method, "notifications/cancelled") == 0)
			cancel(m, json_object_get(params, "requestId"));
	} else if (strcmp(method, "initialize") == 0) {
		initialize(m, id, params);
	} else if (strcmp(method, "ping") == 0) {
		mcp_result(m, id, json_object());
	} else if (!m->initialized) {
		mcp_error(m, id, CAP_RPC_INVALID, "the server is not initialized: send initialize first");
	} else if (strcmp(method, "tools/list") == 0) {
		mcp_tools_list(m, id);
	} else if (strcmp(method, "tools/call") == 0) {
		mcp_tools_call(m, id, params);
	} else {
		mcp_error(m, id, CAP_RPC_METHOD, "method '%s' not found", method);
	}
	cap_rpc_msg_fini(&msg);
}

static void on_line(void *ud, const char *p, size_t n)
{
	handle(ud, p, n);
}

static void on_too_long(void *ud)
{
	mcp_error(ud, NULL, CAP_RPC_INVALID, "message line over %u bytes; it was dropped", CAP_RPC_LINE_MAX);
}

/* Read stdin; false at its end. */
bool mcp_read_stdin(struct mcp *m)
{
	if (cap_rpc_read(&m->in, 0, on_line, on_too_long, m) == 0)
		m->eof = true;
	return !m->eof;
}

/* Write stdout; false when nobody reads it any more. */
bool mcp_write_stdout(struct mcp *m)
{
	if (cap_rpc_flush(&m->out, 1) < 0) {
		m->out.off = m->out.len = 0;
		return false;
	}
	return true;
}

/* --- local: this process runs the controller ------------------------------------------ */

static void fe_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct mcp *m = fe;
	(void)c;
	if (!m->eof)
		cap_ctl_poll_add(p, 0, POLLIN, NULL);
	if (cap_buf_used(&m->out))
		cap_ctl_poll_add(p, 1, POLLOUT, NULL);
}

static void fe_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct mcp *m = fe;
	(void)tag;
	if (!(revents & (POLLIN | POLLHUP | POLLERR)) || m->eof)
		return;
	if (!mcp_read_stdin(m))
		cap_ctl_shutdown(c, "the MCP client closed stdin");
}

static void fe_flush(void *fe, struct cap_ctl *c)
{
	struct mcp *m = fe;
	if (!mcp_write_stdout(m) && !m->eof) {
		m->eof = true;
		cap_ctl_shutdown(c, "the MCP client stopped reading");
	}
}

static void fe_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	(void)c;
	mcp_tool_reply(fe, tag, r);
}

static void fe_progress(void *fe, struct cap_ctl *c, void *tag, const struct cap_prep_event *ev)
{
	(void)c;
	mcp_progress(fe, tag, cap_prep_phase_name(ev->phase), cap_prep_status_name(ev->status), ev->done,
		    ev->message);
}

static const struct cap_ctl_frontend_ops mcp_ops = {
	.name = "mcp",
	.pollfds = fe_pollfds,
	.ready = fe_ready,
	.flush = fe_flush,
	.done = fe_done,
	.progress = fe_progress,
};

static int run_local(struct mcp *m, struct cap_err *err)
{
	struct cap_rpc_server *srv = NULL;
	_cleanup_free_ char *home = cap_home_dir();
	_cleanup_free_ char *sock = xasprintf("%s/serve.sock", home);
	struct cap_controller_cfg *cfg = &m->cfg->ctl;
	cfg->frontend = "mcp";
	cfg->socket_path = NULL;
	cap_ctl_check_image(cfg);
	int r = cap_ctl_new(cfg, &m->ctl, err);
	if (r < 0)
		return r;
	m->fe = cap_ctl_add_frontend(m->ctl, &mcp_ops, m);
	/* Other front ends (another capsule mcp, the CLI) reach this
	 * controller through the home's socket. */
	struct cap_err serr = { 0 };
	if (strlen(sock) >= 100)
		cap_log(CAP_LOG_WARN, "other front ends cannot join this controller: %s is too long for a socket", sock);
	else if (cap_rpc_server_new(m->ctl, sock, &srv, &serr) < 0 || cap_ctl_set_socket(m->ctl, sock, &serr) < 0)
		cap_log(CAP_LOG_WARN, "other front ends cannot join this controller: %s", serr.msg);
	r = cap_ctl_run(m->ctl, err);
	cap_ctl_free(m->ctl);
	m->ctl = NULL;
	cap_rpc_server_free(srv);
	return r;
}

int cap_mcp_run(struct cap_mcp_cfg *cfg, struct cap_err *err)
{
	if (!cfg->owned_agent || !cap_controller_id_valid(cfg->owned_agent))
		return cap_err_set(err, EINVAL, "an agent identity is required (--agent NAME or \"agent\" in the configuration file; 1 to 64 of A-Z a-z 0-9 . _ @ + = : -)");
	if (cfg->owned_peer && !cap_controller_id_valid(cfg->owned_peer))
		return cap_err_set(err, EINVAL, "--peer '%s' is not a valid identity part", cfg->owned_peer);
	/* Directory settings, resolved: compared with a running server's,
	 * and recorded in each new sandbox. */
	char **dirs[] = { &cfg->owned_workspace, &cfg->owned_private_import };
	const char *names[] = { "workspace", "private_import" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(dirs); i++) {
		char *real;
		int r;
		if (!*dirs[i])
			continue;
		if ((r = cap_resolve_dir(names[i], *dirs[i], &real, err)) < 0)
			return r;
		free(*dirs[i]);
		*dirs[i] = real;
	}
	struct mcp m = { .cfg = cfg, .srv_fd = -1, .next_rid = 1 };
	cap_rpc_reader_init(&m.in);
	cap_rpc_reader_init(&m.srv_in);
	/* The server's answers: a 64 MiB read, every byte escaped (6x). */
	m.srv_in.max = (size_t)6 * (64u << 20) + (1u << 20);
	cap_buf_init(&m.out);
	cap_buf_init(&m.srv_out);
	if (cfg->owned_image)
		cfg->ctl.image = cfg->owned_image;
	if (cfg->owned_source)
		cfg->ctl.source = cfg->owned_source;
	cfg->ctl.workspace = cfg->owned_workspace;
	cfg->ctl.private_import = cfg->owned_private_import;
	if (cfg->owned_network && cfg->owned_network->enabled)
		cfg->ctl.network = cfg->owned_network;
	cfg->has_network = cfg->ctl.network != NULL;
	cap_set_nonblock(0, 1);
	cap_set_nonblock(1, 1);
	/* One controller per home: join the one that runs, else be it. */
	int r = -EBUSY;
	for (int tries = 0; tries < 3 && r == -EBUSY; tries++) {
		int held = cap_ctl_holder(&m.holder);
		if (held < 0) {
			r = cap_err_set(err, -held, "cannot read the home's controller lock: %s", strerror(-held));
		} else if (held == 1 && m.holder.socket[0]) {
			if (cfg->ctl.size.cpus || cfg->ctl.size.memory_mib || cfg->ctl.size.root_mib ||
			    cfg->ctl.size.work_mib)
				cap_log(CAP_LOG_WARN, "joining capsule %s (pid %d): its sizes hold for the sandboxes, not this configuration's \"size\"",
					m.holder.frontend, (int)m.holder.pid);
			r = mcp_run_remote(&m, err);
		} else if (held == 1) {
			r = cap_err_set(err, EBUSY, "capsule %s (pid %d) owns this CAPSULE_HOME and listens on no socket; stop it or use another CAPSULE_HOME",
					m.holder.frontend, (int)m.holder.pid);
		} else {
			r = run_local(&m, err);	/* -EBUSY: lost a race to another controller */
		}
	}
	cap_set_nonblock(1, 0);
	mcp_write_stdout(&m);
	while (m.calls) {
		struct mcp_call *mc = m.calls;
		m.calls = mc->next;
		mcp_call_free(mc);
	}
	if (m.srv_fd >= 0)
		close(m.srv_fd);
	cap_rpc_reader_fini(&m.in);
	cap_rpc_reader_fini(&m.srv_in);
	cap_buf_fini(&m.out);
	cap_buf_fini(&m.srv_out);
	return r;
}
