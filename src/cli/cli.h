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
int cap_cli_pause(int argc, char **argv);
int cap_cli_resume(int argc, char **argv);
int cap_cli_snapshot(int argc, char **argv);
int cap_cli_fork(int argc, char **argv);
int cap_cli_ls(int argc, char **argv);
int cap_cli_image(int argc, char **argv);
int cap_cli_source(int argc, char **argv);
int cap_cli_serve(int argc, char **argv);
int cap_cli_spares(int argc, char **argv);
int cap_cli_shim(int argc, char **argv);
int cap_cli_mcp(int argc, char **argv);
int cap_cli_template(int argc, char **argv);
int cap_cli_cp(int argc, char **argv);	/* cli-cp.c */
int cap_cli_diff(int argc, char **argv);	/* cli-workspace.c */
int cap_cli_merge(int argc, char **argv);
/* What the sandbox NAME (attached as sb) changed in /workspace, on
 * stderr: at most `most` paths, then diff's summary line. The number of
 * changes, or -1 (said). */
int cap_cli_workspace_report(const char *name, struct cap_sandbox *sb, size_t most);
int cap_cli_code(int argc, char **argv);	/* cli-code.c */
int cap_cli_logs(int argc, char **argv);	/* cli-logs.c */
int cap_cli_prepare(int argc, char **argv);	/* cli-prepare.c */

/* Before a call on a named sandbox: refresh its public data if that
 * changed, start it if needed, and attach to it (cli-sandbox.c). */
int cap_cli_attach(const char *name, struct cap_sandbox **sb, struct cap_err *err);

/* Options shared by the verbs that run a command. */
enum {
	CAP_OPT_TIMEOUT = 256, CAP_OPT_OUTPUT_CAP, CAP_OPT_CPUS, CAP_OPT_MEMORY,
	CAP_OPT_ACCEL, CAP_OPT_CONSOLE, CAP_OPT_IMAGE, CAP_OPT_ROOT_SIZE,
	CAP_OPT_WORK_SIZE, CAP_OPT_FORCE, CAP_OPT_NAME, CAP_OPT_SOURCE,
	CAP_OPT_FORCE_SIZE, CAP_OPT_PIDS_MAX, CAP_OPT_ROOT,
	/* The network flags (cap_cli_net_opt). */
	CAP_OPT_ALLOW_EGRESS, CAP_OPT_ALLOW_PUBLIC, CAP_OPT_ALLOW_LAN,
	CAP_OPT_ALLOW_HOST, CAP_OPT_PUBLISH, CAP_OPT_AUTO_PUBLISH, CAP_OPT_SECRET,
	CAP_OPT_SECRET_FILE,
	CAP_OPT_NO_SYNC,	/* exec, run, cp: the result without the flush */
};

/* The network flags as getopt_long entries, for a verb's option table:
 * CAP_CLI_NET_OPTS, in the middle of it. */
#define CAP_CLI_NET_OPTS \
	{ "allow-egress", required_argument, NULL, CAP_OPT_ALLOW_EGRESS }, \
	{ "allow-public", no_argument, NULL, CAP_OPT_ALLOW_PUBLIC }, \
	{ "allow-lan", no_argument, NULL, CAP_OPT_ALLOW_LAN }, \
	{ "allow-host", no_argument, NULL, CAP_OPT_ALLOW_HOST }, \
	{ "publish", required_argument, NULL, CAP_OPT_PUBLISH }, \
	{ "auto-publish", no_argument, NULL, CAP_OPT_AUTO_PUBLISH }, \
	{ "secret", required_argument, NULL, CAP_OPT_SECRET }, \
	{ "secret-file", required_argument, NULL, CAP_OPT_SECRET_FILE }

/* Their help lines, the same on every verb. */
#define CAP_CLI_NET_HELP \
	"Network (none by default: no network interface; see docs/network.md):\n" \
	"  --allow-egress RULE\n" \
	"                      Open an IPv4 address or CIDR, HOST or *.DOMAIN, each\n" \
	"                      optionally :PORT (repeatable)\n" \
	"  --allow-public      Open every public address\n" \
	"  --allow-lan         Open the private ranges (10/8, 172.16/12, 192.168/16,\n" \
	"                      100.64/10): the guest can reach your LAN\n" \
	"  --allow-host        Open the host's loopback services at\n" \
	"                      host.capsule.internal: anything bound to the host's\n" \
	"                      127.0.0.1 becomes reachable from the guest\n" \
	"  --publish [BIND:]HOST_PORT:GUEST_PORT\n" \
	"                      Forward a host TCP port (BIND default 127.0.0.1) to\n" \
	"                      the guest (repeatable)\n" \
	"  --auto-publish      Mirror the guest's TCP listeners to the same port on\n" \
	"                      the host's 127.0.0.1 as they come and go\n" \
	"  --secret NAME=SOURCE@HOST[,HOST...][:body]\n" \
	"                      The guest gets NAME=<placeholder>; HTTPS requests to\n" \
	"                      HOST (or *.DOMAIN) carry the real value instead, read\n" \
	"                      at each start from SOURCE on the host: env:VAR or\n" \
	"                      file:PATH (\":body\": request bodies too). Opens\n" \
	"                      HOST:443. The value never enters the VM (repeatable)\n" \
	"  --secret-file GUESTPATH=HOSTFILE[:FIELD,...]@HOST[,HOST...]\n" \
	"                      The guest gets at GUESTPATH (under /work) a copy of\n" \
	"                      the JSON file HOSTFILE with each FIELD (a dotted path\n" \
	"                      such as claudeAiOauth.accessToken; none: every member\n" \
	"                      named like a token, key or secret) a placeholder;\n" \
	"                      HTTPS request headers to HOST carry the real values,\n" \
	"                      re-read when HOSTFILE changes. Opens HOST:443\n" \
	"                      (repeatable; docs/coding-agents.md)\n" \
	"  Link-local and cloud metadata (169.254.0.0/16) stay closed unless named\n" \
	"  exactly by --allow-egress; the host's loopback opens only with --allow-host.\n"

/* The guarantee of exec and run and its opt-out, the same on both. */
#define CAP_CLI_DURABLE_HELP \
	"Durable results: when the command ends (exit, signal or timeout), what it\n" \
	"wrote to /work, /workspace and the sandbox's root is on the host's disk\n" \
	"before capsule returns (the guest flushes it; when nothing in the sandbox\n" \
	"wrote since the last flush, nothing is paid). What a process the command\n" \
	"left behind writes after that\n" \
	"is not covered. --no-sync gives the guarantee up for a faster return:\n" \
	"writes not yet flushed are lost if QEMU or the host dies.\n"

/* Handle one getopt result of the network flags into p: 1 handled, 0 not
 * ours, -1 bad value (already reported, naming it). */
int cap_cli_net_opt(struct cap_net_policy *p, int c, const char *arg);
/* How allowed connections leave this host: "direct", or "through the
 * upstream proxy http://... (NO_PROXY: ...)" from the environment. */
const char *cap_cli_net_route(void);
int cap_cli_net(int argc, char **argv);

/* Exit code of a usage error: a bad option or value, a size out of its
 * bounds (the library's -EINVAL and -ERANGE for what was asked). */
#define CAP_EXIT_USAGE 2

struct cap_cli_exec {
	struct cap_exec_req req;	/* argv borrowed from main's argv */
	char *envv[CAP_PROTO_MAX_ARGS];
	bool interactive;	/* forward stdin even from a terminal */
	bool quiet;
	bool pty;
	/* -v: after the command, how long it ran and its flush took, and
	 * whether its writes are durable. */
	bool verbose;
	/* capsule run: no disk of the VM outlives it, so there is nothing
	 * to flush (and -v says so rather than "not durable"). */
	bool ephemeral;
	/* Set by cap_cli_stream: the guest did not end the command within
	 * its timeout plus CAP_SANDBOX_EXEC_GRACE_MS; the VM is not to be
	 * trusted with another command. */
	bool gave_up;
};

void cap_cli_exec_init(struct cap_cli_exec *x);
/* Handle one getopt result of the shared exec options (--timeout,
 * --output-cap, --pids-max, --no-sync, -e, -w, -i, -q): 1 handled, 0 not ours, -1 bad value
 * (already reported). */
int cap_cli_exec_opt(struct cap_cli_exec *x, int c, const char *arg);

/* Run x->req in sb, streaming its output to our stdout/stderr, forwarding
 * stdin (when not a terminal, or with -i / a PTY), signals and window
 * size. Returns the shell-style exit status, or CAP_EXIT_FAILURE. */
int cap_cli_stream(struct cap_sandbox *sb, struct cap_cli_exec *x);

/* What the CLI prints besides errors (cli-output.c). */

/* Set by a verb's -q: progress is not printed at all. */
extern bool cap_cli_quiet;

/* Print progress lines of long work: on a terminal one updating line,
 * otherwise plain lines. ud is the verb's label. */
void cap_cli_progress(void *ud, const char *line);
void cap_cli_progress_end(void);
/* Whether stderr takes a line rewritten in place (a terminal, TERM not
 * dumb): what cap_cli_progress decides by. */
bool cap_cli_progress_live(void);

/* Print v as JSON (indented, keys in insertion order) and a newline on
 * stdout, then drop the reference. 0, or CAP_EXIT_FAILURE when stdout
 * could not be written. */
struct json_t;
int cap_cli_json_out(struct json_t *v);

/* Docker's -v HOST:GUEST, --volume and --mount, refused with what to use
 * instead (cli-stream.c): true when arg looks like a volume, or argv
 * carries such a flag (the message is printed). */
bool cap_cli_volume_refused(const char *arg);
bool cap_cli_volume_flag(int argc, char **argv);

/* Print "capsule: <msg>" to stderr. */
__attribute__((format(printf, 1, 2))) void cap_cli_error(const char *fmt, ...);

/* Parse the options of a verb whose one option is the flag --FLAG (and
 * -SHORTC when not 0) besides -h/--help: *set says whether it was given.
 * -1 to go on, the operands at argv[optind..argc); else the exit code
 * after printing the usage (0 for --help, on stdout). */
int cap_cli_one_flag(int argc, char **argv, const char *usage, const char *flag,
		     char shortc, bool *set);

/* A size as "1.5G", "12.0M" or "300K"; an age from a Unix time as
 * "90s", "5m", "3h" or "2d". */
void cap_cli_human(uint64_t bytes, char *buf, size_t len);
void cap_cli_age(int64_t created, char *buf, size_t len);

/* Parse a decimal unsigned number in [min, max]; -EINVAL otherwise. */
int cap_cli_parse_uint(const char *s, unsigned long min, unsigned long max,
		       unsigned long *out);

#endif
