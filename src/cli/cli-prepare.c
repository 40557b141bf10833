/* capsule prepare: make sure the guest kernel, the initramfs, an image and
 * its template are there, building what is missing (docs/serve.md,
 * "prepare"). A controller running on the home is asked over its socket,
 * so that its own view stays true; otherwise this process does it. */
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "controller.h"
#include "log.h"
#include "proc.h"
#include "serve.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule prepare [--image REF] [-q] [--json]\n"
	"\n"
	"Make sure everything a first sandbox needs is there, building what is\n"
	"missing, in this order: the guest kernel (minutes, with the kernel build\n"
	"script), the initramfs, the image (base is built; another image that is\n"
	"missing fails saying how to get it) and the template new sandboxes start\n"
	"from. Doing it again builds nothing; after a failure it retries from the\n"
	"phase that failed. When a controller (capsule serve, capsule mcp) runs\n"
	"on this home with a socket, it does the work for its own image.\n"
	"\n"
	"Options:\n"
	"  --image REF   The image to prepare (default: base, or the running\n"
	"                controller's); given, this process prepares it\n"
	"  -q, --quiet   No progress lines\n"
	"  --json        Print what was found or made as JSON on stdout\n"
	"\n"
	"Progress goes to stderr: one updating line on a terminal, else one line\n"
	"per phase. Exit status: 0 prepared, 125 a phase failed (named), 2 usage.\n";

static bool tty;

/* A phase's start and outcome are phase lines (proc.h); a line of its
 * build (the kernel's: thousands) is a detail line, which
 * cap_cli_progress rewrites in place on a terminal and drops elsewhere.
 * Off a terminal only the outcome is shown: one line per phase. */
static void show(const struct cap_prep_event *ev)
{
	char line[1400];
	if (cap_cli_quiet || ev->status == CAP_PREP_FAILED)
		return;	/* a failure is said once, as the error */
	if (ev->status == CAP_PREP_LINE) {
		snprintf(line, sizeof(line), CAP_PROGRESS_DETAIL "%s", ev->message);
		cap_cli_progress("prepare", line);
		return;
	}
	if (ev->status == CAP_PREP_BUILDING) {
		if (!tty)
			return;
		/* The phase's name alone, what it does as a detail: the
		 * build's lines that follow fit beside it. */
		snprintf(line, sizeof(line), "[%u/%u] %s", ev->done, CAP_PREP_NPHASES, cap_prep_phase_name(ev->phase));
		cap_cli_progress("prepare", line);
		snprintf(line, sizeof(line), CAP_PROGRESS_DETAIL "%s", ev->message);
		cap_cli_progress("prepare", line);
		return;
	}
	snprintf(line, sizeof(line), "[%u/%u] %s %s", ev->done, CAP_PREP_NPHASES, cap_prep_phase_name(ev->phase),
		 ev->message);
	cap_cli_progress("prepare", line);
	if (ev->status == CAP_PREP_READY && tty)
		cap_cli_progress_end();	/* a phase's outcome stays on screen */
}

static void on_event(void *ud, const struct cap_prep_event *ev)
{
	(void)ud;
	show(ev);
}

static int phase_of(const char *name)
{
	for (unsigned p = 0; name && p <= CAP_PREP_LOCK; p++)
		if (strcmp(name, cap_prep_phase_name((enum cap_prep_phase)p)) == 0)
			return (int)p;
	return -1;
}

static int status_of(const char *name)
{
	for (unsigned s = 0; name && s <= CAP_PREP_FAILED; s++)
		if (strcmp(name, cap_prep_status_name((enum cap_prep_status)s)) == 0)
			return (int)s;
	return -1;
}

/* A progress notification of the controller, shown like a local event. */
static void on_notify(void *ud, const char *method, json_t *params)
{
	(void)ud;
	if (strcmp(method, "progress") != 0)
		return;	/* unknown notifications are ignored */
	int ph = phase_of(json_string_value(json_object_get(params, "phase")));
	int st = status_of(json_string_value(json_object_get(params, "status")));
	const char *msg = json_string_value(json_object_get(params, "message"));
	if (ph < 0 || st < 0)
		return;
	struct cap_prep_event ev = {
		.phase = (enum cap_prep_phase)ph, .status = (enum cap_prep_status)st,
		.done = (unsigned)json_integer_value(json_object_get(params, "done")), .message = msg ? msg : "",
	};
	show(&ev);
}

static int failed_json(const char *phase, const char *msg, bool json)
{
	if (json)
		cap_cli_json_out(json_pack("{s:b, s:s, s:b, s:s}", "prepared", 0, "phase", phase, "retryable", 1,
					   "error", msg));
	cap_cli_error("%s", msg);
	return CAP_EXIT_FAILURE;
}

static int remote(const char *socket, bool json)
{
	struct cap_err err = { 0 };
	json_t *res = NULL, *data = NULL;
	/* The kernel's build says something at least every 30 s. */
	int r = cap_rpc_call_notify(socket, "prepare", NULL, 600000, on_notify, NULL, &res, &data, &err);
	cap_cli_progress_end();
	if (r < 0) {
		const char *phase = json_string_value(json_object_get(data, "phase"));
		if (!phase && r != -EIO)
			cap_err_prefix(&err, "asking the controller at %s to prepare", socket);
		r = failed_json(phase ? phase : "connection", err.msg, json);
		json_decref(data);
		return r;
	}
	if (json)
		return cap_cli_json_out(res);
	json_decref(res);
	return 0;
}

static int local(const char *image, bool json)
{
	struct cap_err err = { 0 };
	struct cap_prep_req req = { .image = image };
	struct cap_prep_out out;
	/* The events say it all; the library's log lines would repeat them. */
	cap_log_set(NULL, NULL);
	int r = cap_ctl_prepare(&req, on_event, NULL, NULL, &out, &err);
	cap_log_set(cap_log_stderr, NULL);
	cap_cli_progress_end();
	if (r < 0)
		r = failed_json(cap_prep_phase_name(out.failed), err.msg, json);
	else if (json)
		r = cap_cli_json_out(cap_rpc_prepare_json(&out));
	cap_prep_out_fini(&out);
	return r;
}

int cap_cli_prepare(int argc, char **argv)
{
	enum { O_JSON = 500 };
	static const struct option opts[] = {
		{ "image", required_argument, NULL, CAP_OPT_IMAGE },
		{ "quiet", no_argument, NULL, 'q' },
		{ "json", no_argument, NULL, O_JSON },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	const char *image = NULL;
	bool json = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "+qh", opts, NULL)) != -1) {
		switch (c) {
		case CAP_OPT_IMAGE: image = optarg; break;
		case 'q': cap_cli_quiet = true; break;
		case O_JSON: json = true; break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return CAP_EXIT_USAGE;
		}
	}
	if (optind != argc) {
		cap_cli_error("prepare takes no arguments ('%s'); the image is given with --image REF", argv[optind]);
		return CAP_EXIT_USAGE;
	}
	tty = cap_cli_progress_live();
	struct cap_ctl_holder h;
	if (!image && cap_ctl_holder(&h) == 1 && h.socket[0])
		return remote(h.socket, json);
	return local(image, json);
}
