/* Pause or resume named sandboxes through their shims, as the serve
 * controller does to an idle one (the CLI has no verb for it):
 * `bench-pause pause|resume NAME...` in $CAPSULE_HOME. Exits 1 at the
 * first sandbox that does not answer. */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "named.h"
#include "sandbox.h"
#include "util.h"

static int vm_op(const char *name, bool pause, struct cap_err *err)
{
	struct cap_named_status ns;
	struct cap_sandbox *sb = NULL;
	int r;
	if ((r = cap_named_status(name, &ns, err)) < 0)
		return r;
	if (ns.state == CAP_NAMED_STOPPED)
		return cap_err_set(err, ESRCH, "sandbox %s is not running", name);
	if ((r = cap_sandbox_attach(ns.control, &sb, err)) < 0)
		return r;
	cap_sandbox_vm_op(sb, pause);
	int64_t until = cap_now_ms() + 30000;
	while (cap_sandbox_vm_op_pending(sb) > 0) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL];
		cap_sandbox_pollfds(sb, pfd);
		if (cap_now_ms() > until) {
			r = cap_err_set(err, ETIMEDOUT, "sandbox %s did not answer within 30 s", name);
			break;
		}
		if (poll(pfd, CAP_SANDBOX_NPOLL, 1000) < 0 && errno != EINTR) {
			r = cap_err_set(err, errno, "poll: %s", strerror(errno));
			break;
		}
		if ((r = cap_sandbox_dispatch(sb, pfd, err)) < 0)
			break;
	}
	if (r >= 0 && (r = cap_sandbox_vm_op_result(sb)) < 0)
		cap_err_set(err, -r, "cannot %s sandbox %s: %s", pause ? "pause" : "resume", name, strerror(-r));
	cap_sandbox_free(sb);
	return r;
}

int main(int argc, char **argv)
{
	if (argc < 3 || (strcmp(argv[1], "pause") != 0 && strcmp(argv[1], "resume") != 0)) {
		fprintf(stderr, "usage: bench-pause pause|resume NAME...\n");
		return 2;
	}
	bool pause = strcmp(argv[1], "pause") == 0;
	for (int i = 2; i < argc; i++) {
		struct cap_err err = { 0 };
		if (vm_op(argv[i], pause, &err) < 0) {
			fprintf(stderr, "bench-pause: %s\n", err.msg);
			return 1;
		}
	}
	return 0;
}
