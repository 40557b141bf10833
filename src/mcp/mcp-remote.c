/* capsule mcp's remote mode: the home's controller runs in another
 * process (capsule serve, or another capsule mcp), reached over its
 * socket, its settings checked against ours first. */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "log.h"
#include "mcp-server.h"
#include "mcp.h"
#include "policy.h"
#include "serve.h"
#include "util.h"

/* --- remote: the home's controller runs elsewhere ---------------------------------------- */

void mcp_remote_send(struct mcp *m, struct mcp_call *mc, const char *agent, const char *peer,
			const struct cap_ctl_req *req)
{
	const char *method;
	json_t *params = cap_rpc_request_params(agent, peer, req, &method);
	mc->rid = m->next_rid++;
	cap_rpc_put_request(&m->srv_out, mc->rid, method, params);
}

static void on_answer(void *ud, const char *p, size_t n)
{
	struct mcp *m = ud;
	struct cap_rpc_msg msg;
	json_t *bad;
	char text[600];
	int code = cap_rpc_parse(p, n, &msg, &bad, text, sizeof(text));
	if (code == 0 && !msg.method && json_is_null(msg.id)) {
		/* The server refused a line of ours it could not read: which
		 * call it was is unknown, so none can be trusted to end. */
		cap_log(CAP_LOG_WARN, "the controller refused a request: %s",
			json_string_value(json_object_get(msg.error, "message")));
		m->srv_broken = true;
	}
	if (code == 0 && msg.method && strcmp(msg.method, "progress") == 0) {
		/* The controller's preparation, for one of our calls. */
		json_t *req = json_object_get(msg.params, "request");
		const char *ph = json_string_value(json_object_get(msg.params, "phase"));
		const char *st = json_string_value(json_object_get(msg.params, "status"));
		for (struct mcp_call *mc = m->calls; json_is_integer(req) && ph && st && mc; mc = mc->next)
			if (mc->rid == json_integer_value(req)) {
				mcp_progress(m, mc, ph, st, (unsigned)json_integer_value(json_object_get(msg.params, "done")),
					    json_string_value(json_object_get(msg.params, "message")));
				break;
			}
	}
	if (code != 0 || msg.method || !json_is_integer(msg.id)) {
		cap_rpc_msg_fini(&msg);
		return;	/* answers to cancels, or nothing of ours */
	}
	long long rid = json_integer_value(msg.id);
	for (struct mcp_call *mc = m->calls; mc; mc = mc->next) {
		if (mc->rid != rid)
			continue;
		struct cap_ctl_result r;
		void *owned;
		cap_rpc_result_parse(msg.owned_root, mc->kind, &r, &owned);
		mcp_tool_reply(m, mc, &r);
		free(owned);
		break;
	}
	cap_rpc_msg_fini(&msg);
}

static void on_answer_too_long(void *ud)
{
	struct mcp *m = ud;
	cap_log(CAP_LOG_WARN, "the controller sent an answer over %zu bytes", m->srv_in.max);
	m->srv_broken = true;	/* an answer lost: its call would never end */
}

static int connect_to(const char *path, struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(path) >= sizeof(sa.sun_path))
		return cap_err_set(err, ENAMETOOLONG, "the controller's socket path %s is too long", path);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		return cap_err_set(err, e, "cannot connect to the controller's socket %s: %s", path, strerror(e));
	}
	return fd;
}

/* The server decides image, public data and lifecycle: refuse settings
 * that it would silently override. */
/* Whether the server's "network" words (info) are this policy's; no
 * policy asked for here takes the server's, as --source does. */
static bool same_network(const struct cap_net_policy *p, json_t *theirs)
{
	char **words = NULL;
	size_t n = 0;
	if (!p || !p->enabled)
		return true;
	cap_net_policy_words(p, &words, &n);
	bool same = json_is_array(theirs) && json_array_size(theirs) == n;
	for (size_t i = 0; i < n; i++) {
		const char *s = json_string_value(json_array_get(theirs, i));
		same = same && s && strcmp(s, words[i]) == 0;
		free(words[i]);
	}
	free(words);
	return same || !json_is_array(theirs);	/* an older server says nothing */
}

/* A directory setting of the server's (info), "none" when it has none. */
static const char *setting(json_t *info, const char *key)
{
	const char *v = json_string_value(json_object_get(info, key));
	return v ? v : "nothing";
}

/* Whether the server has this directory setting (ours resolved by
 * cap_mcp_run); none asked for here takes the server's. */
static bool same_dir(const char *ours, json_t *info, const char *key)
{
	const char *theirs = json_string_value(json_object_get(info, key));
	return !ours || (theirs && strcmp(ours, theirs) == 0);
}

static int check_server(struct mcp *m, struct cap_err *err)
{
	json_t *info = NULL;
	int r = cap_rpc_call(m->holder.socket, "info", NULL, 10000, &info, err);
	if (r < 0)
		return r;
	const char *source = json_string_value(json_object_get(info, "source"));
	const char *image = json_string_value(json_object_get(info, "image"));
	/* Its sandboxes are ours: run_command says what they have. */
	m->cfg->has_network = json_array_size(json_object_get(info, "network")) > 0;
	char want[4096] = "";
	if (m->cfg->owned_source && !realpath(m->cfg->owned_source, want))
		snprintf(want, sizeof(want), "%s", m->cfg->owned_source);
	if (m->cfg->owned_source && (!source || strcmp(source, want) != 0))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and serves %s%s; capsule mcp --source %s cannot change that. Start it without --source, give that server --source, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, source ? "the public data " : "no public data",
				source ? source : "", m->cfg->owned_source);
	else if (!same_network(m->cfg->owned_network, json_object_get(info, "network")))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME with another network policy than this capsule mcp's; its sandboxes follow the server's. Give both the same network flags, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid);
	else if (!same_dir(m->cfg->owned_workspace, info, "workspace"))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and copies %s to new sandboxes' /workspace; capsule mcp's \"workspace\" %s cannot change that. Give both the same, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, setting(info, "workspace"), m->cfg->owned_workspace);
	else if (!same_dir(m->cfg->owned_private_import, info, "private_import"))
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME with private import from %s; capsule mcp's \"private_import\" %s cannot change that. Give both the same, or use another CAPSULE_HOME",
				m->holder.frontend, (int)m->holder.pid, setting(info, "private_import"),
				m->cfg->owned_private_import);
	else if (m->cfg->owned_image && image && strcmp(image, m->cfg->owned_image) != 0)
		r = cap_err_set(err, EINVAL,
				"capsule %s (pid %d) owns this CAPSULE_HOME and makes sandboxes from image %s; capsule mcp --image %s cannot change that",
				m->holder.frontend, (int)m->holder.pid, image, m->cfg->owned_image);
	json_decref(info);
	return r;
}

int mcp_run_remote(struct mcp *m, struct cap_err *err)
{
	int r = check_server(m, err);
	if (r < 0)
		return r;
	if ((m->srv_fd = connect_to(m->holder.socket, err)) < 0)
		return m->srv_fd;
	cap_set_nonblock(m->srv_fd, 1);
	cap_log(CAP_LOG_INFO, "using the controller of capsule %s (pid %d) at %s", m->holder.frontend,
		(int)m->holder.pid, m->holder.socket);
	static const int stops[] = { SIGTERM, SIGINT, SIGHUP };
	sigset_t sigs;
	int sfd = cap_signalfd(stops, CAP_ARRAY_SIZE(stops), &sigs);
	bool lost = false;
	while (!m->eof && !lost) {
		struct pollfd p[4] = {
			{ .fd = 0, .events = POLLIN },
			{ .fd = m->srv_fd, .events = (short)(POLLIN | (cap_buf_used(&m->srv_out) ? POLLOUT : 0)) },
			{ .fd = cap_buf_used(&m->out) ? 1 : -1, .events = POLLOUT },
			{ .fd = sfd, .events = POLLIN },
		};
		if (poll(p, 4, -1) < 0 && errno != EINTR)
			break;
		if (p[3].revents)
			break;
		if (p[0].revents)
			mcp_read_stdin(m);
		if (p[1].revents & (POLLIN | POLLHUP | POLLERR))
			lost = cap_rpc_read(&m->srv_in, m->srv_fd, on_answer, on_answer_too_long, m) == 0 ||
			       m->srv_broken;
		if (cap_rpc_flush(&m->srv_out, m->srv_fd) < 0)
			lost = true;
		if (!mcp_write_stdout(m))
			break;
	}
	if (lost) {
		cap_log(CAP_LOG_WARN, "the controller (capsule %s, pid %d) went away", m->holder.frontend,
			(int)m->holder.pid);
		struct cap_ctl_result res = { .code = CAP_CTL_ESANDBOX,
					      .msg = "the capsule controller this server used went away; restart capsule mcp" };
		while (m->calls)
			mcp_tool_reply(m, m->calls, &res);
		cap_set_nonblock(1, 0);
		mcp_write_stdout(m);
		r = cap_err_set(err, EPIPE, "the controller (capsule %s, pid %d) went away", m->holder.frontend,
				(int)m->holder.pid);
	}
	/* Calls still running stay with the server: their sandboxes are its. */
	if (sfd >= 0)
		close(sfd);
	return r;
}
