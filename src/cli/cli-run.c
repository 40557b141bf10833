/* capsule run: one command in a fresh microVM, output streamed live, the
 * VM removed on every path (normal end, failure, Ctrl-C, SIGTERM). */
#include <errno.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "cli.h"
#include "sandbox.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule run [OPTIONS] -- COMMAND [ARG...]\n"
	"\n"
	"Boot a fresh microVM, run COMMAND in it as UID 1000, stream its stdout and\n"
	"stderr as they are produced, then stop and remove the VM. Exits with the\n"
	"command's exit code (128+N when killed by signal N, 124 on timeout, 125 when\n"
	"capsule itself fails, 126/127 when the command cannot run or is not found).\n"
	"Standard input is forwarded when it is not a terminal, or with -i.\n"
	"\n"
	"Options:\n"
	"  --cpus N            Virtual CPUs (default 1)\n"
	"  --memory MIB        Guest memory in MiB (default 512)\n"
	"  --timeout S         Wall-clock limit in seconds, 0 for none (default 30);\n"
	"                      the whole process group is killed when it expires\n"
	"  --output-cap BYTES  Limit on stdout+stderr (default 262144); the rest is\n"
	"                      dropped after a truncation marker\n"
	"  --accel MODE        auto, kvm or tcg (default auto; see `capsule doctor`)\n"
	"  -e, --env NAME=VAL  Set an environment variable (repeatable)\n"
	"  -w, --workdir DIR   Working directory in the guest (default /work)\n"
	"  -i, --interactive   Forward standard input even from a terminal\n"
	"  --console-log FILE  Keep the guest's serial console in FILE\n"
	"  -q, --quiet         Do not print the acceleration note\n"
	"  -h, --help          Show this help\n";

enum { OPT_CPUS = 256, OPT_MEMORY, OPT_TIMEOUT, OPT_CAP, OPT_ACCEL, OPT_CONSOLE };

struct run {
	struct cap_sandbox *sb;
	uint32_t id;
	bool done;
	struct cap_exit ex;
	bool rejected;
	char reject_msg[256];
	bool stdout_broken;
};

static void on_output(void *ud, uint32_t id, int fd, const uint8_t *p, size_t n)
{
	struct run *r = ud;
	if (fd == 1 && r->stdout_broken)
		return;
	if (cap_write_all(fd, p, n) == -EPIPE && fd == 1) {
		/* The reader of our stdout went away (`| head`): tell the
		 * command the same way a pipe would. */
		r->stdout_broken = true;
		cap_sandbox_signal(r->sb, id, SIGPIPE);
	}
}

static void on_done(void *ud, uint32_t id, const struct cap_exit *ex,
		    int errnum, const char *msg)
{
	struct run *r = ud;
	(void)id;
	r->done = true;
	if (ex) {
		r->ex = *ex;
	} else {
		r->rejected = true;
		snprintf(r->reject_msg, sizeof(r->reject_msg), "%s (%s)", msg, strerror(errnum));
	}
}

static const struct cap_exec_events events = { on_output, on_done };

/* Explain how the command ended, where the exit code alone would not. */
static void report(const struct run *r, const struct cap_exec_req *req)
{
	if (r->ex.flags & CAP_EXIT_TRUNCATED)
		cap_cli_error("output truncated at %u bytes (the output cap; change it with --output-cap)",
			      req->output_cap);
	if (r->ex.flags & CAP_EXIT_TIMED_OUT)
		cap_cli_error("the command timed out after %u s (--timeout) and was killed with its process group",
			      req->timeout_ms / 1000);
	else if (r->ex.kind == CAP_EXIT_SIGNAL && r->ex.value != SIGPIPE)
		cap_cli_error("the command was killed by signal %d (%s)", r->ex.value, strsignal(r->ex.value));
}

int cap_cli_run(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "cpus", required_argument, NULL, OPT_CPUS },
		{ "memory", required_argument, NULL, OPT_MEMORY },
		{ "timeout", required_argument, NULL, OPT_TIMEOUT },
		{ "output-cap", required_argument, NULL, OPT_CAP },
		{ "accel", required_argument, NULL, OPT_ACCEL },
		{ "console-log", required_argument, NULL, OPT_CONSOLE },
		{ "env", required_argument, NULL, 'e' },
		{ "workdir", required_argument, NULL, 'w' },
		{ "interactive", no_argument, NULL, 'i' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	struct cap_sandbox_opts so;
	struct cap_exec_req req = { .timeout_ms = 30000, .output_cap = 256 * 1024 };
	char *envv[CAP_PROTO_MAX_ARGS];
	bool interactive = false, quiet = false;
	unsigned long v;
	int c;

	cap_sandbox_opts_init(&so);
	optind = 1;
	while ((c = getopt_long(argc, argv, "+e:w:iqh", opts, NULL)) != -1) {
		switch (c) {
		case OPT_CPUS:
			if (cap_cli_parse_uint(optarg, 1, 64, &v) < 0) {
				cap_cli_error("--cpus '%s' is not a number from 1 to 64", optarg);
				return 2;
			}
			so.cpus = (unsigned)v;
			break;
		case OPT_MEMORY:
			if (cap_cli_parse_uint(optarg, 64, 65536, &v) < 0) {
				cap_cli_error("--memory '%s' is not a size in MiB from 64 to 65536", optarg);
				return 2;
			}
			so.memory_mib = (unsigned)v;
			break;
		case OPT_TIMEOUT:
			if (cap_cli_parse_uint(optarg, 0, 86400, &v) < 0) {
				cap_cli_error("--timeout '%s' is not a number of seconds from 0 to 86400", optarg);
				return 2;
			}
			req.timeout_ms = (uint32_t)(v * 1000);
			break;
		case OPT_CAP:
			if (cap_cli_parse_uint(optarg, 0, 1u << 30, &v) < 0) {
				cap_cli_error("--output-cap '%s' is not a number of bytes up to 1073741824", optarg);
				return 2;
			}
			req.output_cap = (uint32_t)v;
			break;
		case OPT_ACCEL:
			if (cap_engine_accel_parse(optarg, &so.accel) < 0) {
				cap_cli_error("--accel '%s' is not one of auto, kvm, tcg", optarg);
				return 2;
			}
			break;
		case OPT_CONSOLE:
			so.console_log = optarg;
			break;
		case 'e':
			if (!strchr(optarg, '=') || optarg[0] == '=') {
				cap_cli_error("--env '%s' is not NAME=VALUE", optarg);
				return 2;
			}
			if (req.envc == CAP_ARRAY_SIZE(envv)) {
				cap_cli_error("too many --env options (at most %zu)", CAP_ARRAY_SIZE(envv));
				return 2;
			}
			envv[req.envc++] = optarg;
			break;
		case 'w':
			req.cwd = optarg;
			break;
		case 'i':
			interactive = true;
			break;
		case 'q':
			quiet = true;
			break;
		case 'h':
			fputs(usage, stdout);
			return 0;
		default:
			fputs(usage, stderr);
			return 2;
		}
	}
	if (optind >= argc) {
		cap_cli_error("run needs a command: capsule run [OPTIONS] -- COMMAND [ARG...]");
		return 2;
	}
	req.argv = argv + optind;
	req.argc = (uint32_t)(argc - optind);
	req.env = envv;
	bool forward_stdin = interactive || !isatty(0);
	if (forward_stdin)
		req.flags |= CAP_EXEC_STDIN;

	/* Signals arrive through a descriptor so that every path, Ctrl-C
	 * included, goes through the same teardown below. */
	sigset_t sigs;
	sigemptyset(&sigs);
	sigaddset(&sigs, SIGINT);
	sigaddset(&sigs, SIGTERM);
	sigaddset(&sigs, SIGHUP);
	sigaddset(&sigs, SIGQUIT);
	sigprocmask(SIG_BLOCK, &sigs, NULL);
	signal(SIGPIPE, SIG_IGN);
	int sfd = signalfd(-1, &sigs, SFD_CLOEXEC | SFD_NONBLOCK);

	struct run r = { 0 };
	struct cap_err err = { 0 };
	int status = CAP_EXIT_FAILURE;

	if (cap_sandbox_boot(&so, &r.sb, &err) < 0) {
		cap_cli_error("%s", err.msg);
		goto out;
	}
	const struct cap_accel_choice *ac = cap_sandbox_accel(r.sb);
	if (!quiet && ac->accel == CAP_ACCEL_TCG)
		cap_cli_error("using TCG software emulation (%s); not a security boundary, see `capsule doctor`",
			      ac->reason);

	if (cap_sandbox_exec(r.sb, &req, &events, &r, &r.id, &err) < 0) {
		cap_cli_error("%s", err.msg);
		goto out;
	}

	int interrupts = 0;
	int64_t give_up = 0;
	bool stdin_open = forward_stdin;
	while (!r.done) {
		struct pollfd pfd[CAP_SANDBOX_NPOLL + 2];
		cap_sandbox_pollfds(r.sb, pfd);
		int n = CAP_SANDBOX_NPOLL;
		pfd[n++] = (struct pollfd){ .fd = sfd, .events = POLLIN };
		int in_slot = -1;
		if (stdin_open && cap_sandbox_backlog(r.sb) < (1u << 20)) {
			in_slot = n;
			pfd[n++] = (struct pollfd){ .fd = 0, .events = POLLIN };
		}
		int timeout = give_up ? (int)CAP_MAX(give_up - cap_now_ms(), 0) : -1;
		if (poll(pfd, (nfds_t)n, timeout) < 0 && errno != EINTR) {
			cap_cli_error("poll: %s", strerror(errno));
			goto out;
		}
		if (give_up && cap_now_ms() >= give_up) {
			cap_cli_error("the command did not stop; removing the VM");
			status = 128 + SIGINT;
			goto out;
		}
		if (pfd[CAP_SANDBOX_NPOLL].revents) {
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si)) {
				interrupts++;
				if (interrupts > 1) {
					cap_cli_error("interrupted again; removing the VM now");
					status = 128 + (int)si.ssi_signo;
					goto out;
				}
				cap_cli_error("%s: stopping the command (again to stop the VM at once)",
					      strsignal((int)si.ssi_signo));
				cap_sandbox_signal(r.sb, r.id, (int)si.ssi_signo);
				give_up = cap_now_ms() + 3000;
			}
		}
		if (in_slot >= 0 && pfd[in_slot].revents) {
			char buf[65536];
			ssize_t k = read(0, buf, sizeof(buf));
			if (k > 0) {
				cap_sandbox_stdin(r.sb, r.id, buf, (size_t)k);
			} else if (k == 0 || errno != EINTR) {
				cap_sandbox_stdin(r.sb, r.id, NULL, 0);
				stdin_open = false;
			}
		}
		if (cap_sandbox_dispatch(r.sb, pfd, &err) < 0) {
			cap_cli_error("%s", err.msg);
			goto out;
		}
	}

	if (r.rejected) {
		cap_cli_error("the guest refused the command: %s", r.reject_msg);
		goto out;
	}
	report(&r, &req);
	status = cap_exit_status(&r.ex);
	if (cap_sandbox_shutdown(r.sb, 5000, &err) < 0)
		cap_cli_error("warning: %s", err.msg);
out:
	cap_sandbox_free(r.sb);
	if (sfd >= 0)
		close(sfd);
	return status;
}
