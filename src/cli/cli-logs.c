/* capsule logs: a named sandbox's console log (the guest's serial
 * console) and shim log (what the process that owns its VM said), whole,
 * the last lines, or followed as they grow. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "named.h"
#include "util.h"

static const char usage[] =
	"Usage: capsule logs [-f] [-n LINES] [--console | --shim] NAME\n"
	"\n"
	"Print the sandbox NAME's console log (the guest kernel's and init's\n"
	"serial console, console.log in its directory) and its shim log (the\n"
	"process that owns its VM: starts, stops, I/O errors; shim.log), each\n"
	"headed by \"==> FILE <==\" when both are shown. A log that does not exist\n"
	"yet (a sandbox never started) prints nothing.\n"
	"  -f, --follow     keep printing what is added, like tail -f (a log that\n"
	"                   is replaced, at the next start, is read from its\n"
	"                   beginning); ends on Ctrl-C or SIGTERM (exit 0) or when\n"
	"                   the sandbox is removed\n"
	"  -n, --lines N    only the last N lines of each log\n"
	"  --console        the console log only\n"
	"  --shim           the shim log only\n"
	"On a terminal, control characters from the guest other than tab and\n"
	"newline are shown as '?'. Exits 125 when NAME is not a sandbox.\n";

enum { OPT_CONSOLE = 0x1000, OPT_SHIM };

struct log {
	const char *label;
	char *owned_path;
	int fd;
	dev_t dev;
	ino_t ino;
	off_t off;
};

static bool sanitize;	/* stdout is a terminal */
static const struct log *last_shown;	/* whose header is on screen */
static bool headers;

/* What drain and emit return when stdout took no more (errno in
 * out_errno): a reader that left (EPIPE) is no error, and no read
 * error either. */
#define STDOUT_FAILED 1
static int out_errno;

/* Write p to stdout, made harmless for a terminal when it is one: the
 * console log is the guest's to write. 0 or STDOUT_FAILED. */
static int emit(const struct log *l, const char *p, size_t n)
{
	if (!n)
		return 0;
	if (headers && last_shown != l) {
		printf("%s==> %s <==\n", last_shown ? "\n" : "", l->owned_path);
		last_shown = l;
	}
	char buf[65536];
	size_t k = n < sizeof(buf) ? n : sizeof(buf);
	memcpy(buf, p, k);
	if (sanitize)
		for (size_t i = 0; i < k; i++) {
			unsigned char c = (unsigned char)buf[i];
			if ((c < 0x20 && c != '\n' && c != '\t') || c == 0x7f)
				buf[i] = '?';
		}
	if (fwrite(buf, 1, k, stdout) != k) {
		out_errno = errno ? errno : EIO;
		return STDOUT_FAILED;
	}
	return k < n ? emit(l, p + k, n - k) : 0;
}

/* Open l's file if it is there (or is another file than the one open):
 * 1 when (re)opened, 0 when unchanged or absent, -errno. */
static int reopen(struct log *l)
{
	struct stat st;
	if (stat(l->owned_path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		return -errno;
	}
	if (l->fd >= 0 && st.st_dev == l->dev && st.st_ino == l->ino)
		return 0;
	int fd = open(l->owned_path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0)
		return errno == ENOENT ? 0 : -errno;
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	if (l->fd >= 0)
		close(l->fd);
	l->fd = fd;
	l->dev = st.st_dev;
	l->ino = st.st_ino;
	l->off = 0;
	return 1;
}

/* Where the last n lines of l's open file begin. */
static off_t tail_start(const struct log *l, unsigned long n)
{
	struct stat st;
	if (fstat(l->fd, &st) < 0 || st.st_size == 0)
		return 0;
	off_t end = st.st_size, pos = end;
	unsigned long seen = 0;
	char buf[8192];
	/* A last line without its newline counts as a line. */
	char lastc;
	if (pread(l->fd, &lastc, 1, end - 1) == 1 && lastc == '\n')
		n++;
	while (pos > 0) {
		size_t k = pos < (off_t)sizeof(buf) ? (size_t)pos : sizeof(buf);
		pos -= (off_t)k;
		ssize_t r = pread(l->fd, buf, k, pos);
		if (r != (ssize_t)k)
			return 0;
		for (size_t i = k; i-- > 0;)
			if (buf[i] == '\n' && ++seen == n)
				return pos + (off_t)i + 1;
	}
	return 0;
}

/* Print what l's file holds past l->off. 0, STDOUT_FAILED or -errno (a
 * read error). A file cut shorter than what was read is read again
 * from its start. */
static int drain(struct log *l)
{
	if (l->fd < 0)
		return 0;
	struct stat st;
	if (fstat(l->fd, &st) == 0 && st.st_size < l->off)
		l->off = 0;
	char buf[65536];
	for (;;) {
		ssize_t n = pread(l->fd, buf, sizeof(buf), l->off);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0)
			return 0;
		if (emit(l, buf, (size_t)n) != 0)
			return STDOUT_FAILED;
		l->off += n;
	}
}

/* stdout took no more: a reader that left ends the command quietly
 * (exit 0, as Ctrl-C does); another write error is one. */
static int out_failed(void)
{
	if (out_errno == EPIPE)
		return 0;
	cap_cli_error("logs: cannot write to stdout: %s", strerror(out_errno));
	return CAP_EXIT_FAILURE;
}

int cap_cli_logs(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "follow", no_argument, NULL, 'f' },
		{ "lines", required_argument, NULL, 'n' },
		{ "console", no_argument, NULL, OPT_CONSOLE },
		{ "shim", no_argument, NULL, OPT_SHIM },
		{ "help", no_argument, NULL, 'h' },
		{ 0 },
	};
	bool follow = false, want_console = false, want_shim = false;
	unsigned long lines = 0;
	bool tail = false;
	int c;
	optind = 1;
	while ((c = getopt_long(argc, argv, "fn:h", opts, NULL)) != -1) {
		switch (c) {
		case 'f': follow = true; break;
		case 'n':
			if (cap_cli_parse_uint(optarg, 0, ULONG_MAX / 2, &lines) < 0) {
				cap_cli_error("logs: -n '%s' is not a number of lines", optarg);
				return CAP_EXIT_USAGE;
			}
			tail = true;
			break;
		case OPT_CONSOLE: want_console = true; break;
		case OPT_SHIM: want_shim = true; break;
		case 'h': fputs(usage, stdout); return 0;
		default: fputs(usage, stderr); return CAP_EXIT_USAGE;
		}
	}
	if (optind != argc - 1) {
		fputs(usage, stderr);
		return CAP_EXIT_USAGE;
	}
	if (!want_console && !want_shim)
		want_console = want_shim = true;
	const char *name = argv[optind];
	struct cap_record rec;
	struct cap_err err = { 0 };
	if (cap_named_check_name(name, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_USAGE;
	}
	if (cap_named_load(name, &rec, &err) < 0) {
		cap_cli_error("%s", err.msg);
		return CAP_EXIT_FAILURE;
	}
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *record = xasprintf("%s/record.json", dir);
	struct log logs[2];
	size_t nlogs = 0;
	if (want_console)
		logs[nlogs++] = (struct log){ "console", xasprintf("%s/console.log", dir), -1, 0, 0, 0 };
	if (want_shim)
		logs[nlogs++] = (struct log){ "shim", xasprintf("%s/shim.log", dir), -1, 0, 0, 0 };
	headers = nlogs > 1;
	sanitize = isatty(1);

	/* Signals end a follow through the same way out as the rest. */
	static const int handled[] = { SIGINT, SIGTERM, SIGHUP, SIGPIPE };
	sigset_t sigs;
	int sfd = follow ? cap_signalfd(handled, CAP_ARRAY_SIZE(handled), &sigs) : -1;
	if (follow && sfd < 0) {
		/* Blocked and never read, they could not stop -f. */
		sigprocmask(SIG_UNBLOCK, &sigs, NULL);
		cap_cli_error("logs: cannot follow: signalfd: %s", strerror(-sfd));
		for (size_t i = 0; i < nlogs; i++)
			free(logs[i].owned_path);
		return CAP_EXIT_FAILURE;
	}

	int rc = 0, r;
	for (size_t i = 0; i < nlogs && rc == 0; i++) {
		struct log *l = &logs[i];
		if ((r = reopen(l)) < 0) {
			cap_cli_error("logs: cannot read %s: %s", l->owned_path, strerror(-r));
			rc = CAP_EXIT_FAILURE;
			break;
		}
		if (headers && !follow) {
			/* Even over nothing, so that an empty section is no mystery. */
			printf("%s==> %s <==\n", last_shown ? "\n" : "", l->owned_path);
			last_shown = l;
		}
		if (l->fd >= 0 && tail)
			l->off = lines ? tail_start(l, lines) : lseek(l->fd, 0, SEEK_END);
		if ((r = drain(l)) == STDOUT_FAILED) {
			rc = out_failed();
			follow = false;
			break;
		}
		if (r < 0) {
			cap_cli_error("logs: cannot read %s: %s", l->owned_path, strerror(-r));
			rc = CAP_EXIT_FAILURE;
			break;
		}
	}
	fflush(stdout);
	while (follow && rc == 0) {
		struct pollfd p = { .fd = sfd, .events = POLLIN };
		int k = poll(&p, 1, 200);
		if (k < 0 && errno != EINTR) {
			cap_cli_error("poll: %s", strerror(errno));
			rc = CAP_EXIT_FAILURE;
			break;
		}
		if (k > 0) {
			/* Ctrl-C or SIGTERM: the end the user asked for. Read, so
			 * that unblocking it below does not deliver it. */
			struct signalfd_siginfo si;
			while (read(sfd, &si, sizeof(si)) == sizeof(si))
				;
			break;
		}
		if (access(record, F_OK) < 0) {
			fflush(stdout);
			cap_cli_error("sandbox '%s' was removed", name);
			break;
		}
		for (size_t i = 0; i < nlogs; i++) {
			/* What the old file still got is printed before the new one. */
			struct log *l = &logs[i];
			int e = drain(l);
			if (e == 0)
				e = reopen(l);
			if (e >= 0)
				e = drain(l);
			if (e == STDOUT_FAILED) {
				rc = out_failed();
				follow = false;
				break;
			}
			if (e < 0) {
				cap_cli_error("logs: cannot read %s: %s", l->owned_path, strerror(-e));
				rc = CAP_EXIT_FAILURE;
				break;
			}
		}
		if (fflush(stdout) == EOF)
			break;
	}
	for (size_t i = 0; i < nlogs; i++) {
		if (logs[i].fd >= 0)
			close(logs[i].fd);
		free(logs[i].owned_path);
	}
	if (sfd >= 0) {
		close(sfd);
		sigprocmask(SIG_UNBLOCK, &sigs, NULL);
	}
	return rc;
}
