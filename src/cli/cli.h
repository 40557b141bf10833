/* The capsule command line: one file per verb, each a thin layer that
 * parses arguments, calls the library and prints. Only these files print
 * and choose exit codes. */
#ifndef CAP_CLI_H
#define CAP_CLI_H

#include "sandbox.h"

/* Exit code when capsule itself fails (as docker run and env do). */
#define CAP_EXIT_FAILURE 125

int cap_cli_run(int argc, char **argv);
int cap_cli_doctor(int argc, char **argv);
int cap_cli_create(int argc, char **argv);
int cap_cli_start(int argc, char **argv);
int cap_cli_stop(int argc, char **argv);
int cap_cli_exec(int argc, char **argv);
int cap_cli_shell(int argc, char **argv);
int cap_cli_inspect(int argc, char **argv);
int cap_cli_rm(int argc, char **argv);
int cap_cli_ls(int argc, char **argv);
int cap_cli_image(int argc, char **argv);
int cap_cli_source(int argc, char **argv);
int cap_cli_serve(int argc, char **argv);
int cap_cli_shim(int argc, char **argv);
int cap_cli_mcp(int argc, char **argv);
int cap_cli_template(int argc, char **argv);

/* Options shared by the verbs that run a command. */
enum {
	CAP_OPT_TIMEOUT = 256, CAP_OPT_OUTPUT_CAP, CAP_OPT_CPUS, CAP_OPT_MEMORY,
	CAP_OPT_ACCEL, CAP_OPT_CONSOLE, CAP_OPT_IMAGE, CAP_OPT_ROOT_SIZE,
	CAP_OPT_WORK_SIZE, CAP_OPT_FORCE, CAP_OPT_NAME, CAP_OPT_SOURCE,
	CAP_OPT_FORCE_SIZE, CAP_OPT_PIDS_MAX,
};

/* Exit code of a usage error: a bad option or value, a size out of its
 * bounds (the library's -EINVAL and -ERANGE for what was asked). */
#define CAP_EXIT_USAGE 2

struct cap_cli_exec {
	struct cap_exec_req req;	/* argv borrowed from main's argv */
	char *envv[CAP_PROTO_MAX_ARGS];
	bool interactive;	/* forward stdin even from a terminal */
	bool quiet;
	bool pty;
	/* Set by cap_cli_stream: the guest did not end the command within
	 * its timeout plus CAP_SANDBOX_EXEC_GRACE_MS; the VM is not to be
	 * trusted with another command. */
	bool gave_up;
};

void cap_cli_exec_init(struct cap_cli_exec *x);
/* Handle one getopt result of the shared exec options (--timeout,
 * --output-cap, -e, -w, -i, -q): 1 handled, 0 not ours, -1 bad value
 * (already reported). */
int cap_cli_exec_opt(struct cap_cli_exec *x, int c, const char *arg);

/* Run x->req in sb, streaming its output to our stdout/stderr, forwarding
 * stdin (when not a terminal, or with -i / a PTY), signals and window
 * size. Returns the shell-style exit status, or CAP_EXIT_FAILURE. */
int cap_cli_stream(struct cap_sandbox *sb, struct cap_cli_exec *x);

/* Print progress lines of long work: on a terminal one updating line,
 * otherwise plain lines. ud is the verb's label. */
void cap_cli_progress(void *ud, const char *line);
void cap_cli_progress_end(void);

/* Print "capsule: <msg>" to stderr. */
__attribute__((format(printf, 1, 2))) void cap_cli_error(const char *fmt, ...);

/* Parse a decimal unsigned number in [min, max]; -EINVAL otherwise. */
int cap_cli_parse_uint(const char *s, unsigned long min, unsigned long max,
		       unsigned long *out);

#endif
