/* What the CLI prints besides errors: progress lines and JSON.
 *
 * Progress goes to stderr. On a terminal it is one line per phase, the
 * last of which a helper program's lines (detail lines, proc.h) keep
 * rewriting in place; anywhere else it is one plain line per phase and
 * the detail lines are dropped, so that a log holds no carriage returns,
 * no escape sequences and no debootstrap chatter. No colour is used
 * (NO_COLOR has nothing to turn off). */
#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "proc.h"

bool cap_cli_quiet;

static bool progress_open;	/* a line on the terminal awaits its newline */
static char phase[512];		/* the current phase line, as shown */
static const char *phase_label;

bool cap_cli_progress_live(void)
{
	static int tty = -1;
	if (tty < 0) {
		const char *term = getenv("TERM");
		tty = isatty(2) && !(term && strcmp(term, "dumb") == 0);
	}
	return tty;
}

static int width(void)
{
	struct winsize ws;
	if (ioctl(2, TIOCGWINSZ, &ws) == 0 && ws.ws_col >= 20)
		return ws.ws_col;
	return 80;
}

/* Everything after a control character would move the cursor or worse. */
static void printable(char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x20 || *s == 0x7f)
			*s = ' ';
}

void cap_cli_progress(void *ud, const char *line)
{
	const char *label = ud ? ud : "capsule";
	if (cap_cli_quiet)
		return;
	bool detail = cap_progress_is_detail(line);
	if (!cap_cli_progress_live()) {
		if (!detail) {
			char s[4096];
			snprintf(s, sizeof(s), "%s", line);
			printable(s);
			fprintf(stderr, "%s: %s\n", label, s);
		}
		return;
	}
	/* Cut to the terminal's width so that the line never wraps (a
	 * wrapped line cannot be rewritten with one \r). */
	char s[1024];
	int w = width() - 1;
	if (detail) {
		while (*line == ' ')
			line++;
		snprintf(s, sizeof(s), "%s: %s: %s", label, phase, line);
	} else {
		if (progress_open)
			fputc('\n', stderr);
		snprintf(phase, sizeof(phase), "%s", line);
		printable(phase);
		phase_label = label;
		snprintf(s, sizeof(s), "%s: %s", label, phase);
	}
	printable(s);
	if ((int)strlen(s) > w)
		s[w] = '\0';
	fprintf(stderr, "\r\033[K%s", s);
	progress_open = true;
}

void cap_cli_progress_end(void)
{
	if (progress_open) {
		/* The phase stays on the screen, not its last detail. */
		char s[1024];
		snprintf(s, sizeof(s), "%s: %s", phase_label ? phase_label : "capsule", phase);
		int w = width() - 1;
		if ((int)strlen(s) > w)
			s[w] = '\0';
		fprintf(stderr, "\r\033[K%s\n", s);
	}
	progress_open = false;
	phase[0] = '\0';
}

int cap_cli_json_out(struct json_t *v)
{
	int r = json_dumpf(v, stdout, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(v);
	if (r < 0 || fputc('\n', stdout) == EOF || fflush(stdout) == EOF) {
		cap_cli_error("cannot write JSON to stdout");
		return CAP_EXIT_FAILURE;
	}
	return 0;
}

void cap_cli_human(uint64_t bytes, char *buf, size_t len)
{
	if (bytes >= (1ull << 30))
		snprintf(buf, len, "%.1fG", bytes / (double)(1ull << 30));
	else if (bytes >= (1ull << 20))
		snprintf(buf, len, "%.1fM", bytes / (double)(1ull << 20));
	else
		snprintf(buf, len, "%lluK", (unsigned long long)(bytes >> 10));
}

void cap_cli_age(int64_t created, char *buf, size_t len)
{
	int64_t s = time(NULL) - created;
	if (s < 120)
		snprintf(buf, len, "%llds", (long long)s);
	else if (s < 7200)
		snprintf(buf, len, "%lldm", (long long)(s / 60));
	else if (s < 172800)
		snprintf(buf, len, "%lldh", (long long)(s / 3600));
	else
		snprintf(buf, len, "%lldd", (long long)(s / 86400));
}
