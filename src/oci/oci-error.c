/* Where the OCI runtime's words go, as runc sends them: errors to stderr
 * and, with --log, to the log file in its --log-format; the library's
 * lines (cap_log) to the log file only. */
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "oci-int.h"
#include "util.h"

/* "2006-01-02T15:04:05Z" (nanos: with .NNNNNNNNN trimmed as Go's
 * RFC3339Nano does). */
void cap_oci_rfc3339(char *buf, size_t len, bool nanos)
{
	struct timespec ts;
	struct tm tm;
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
	if (nanos && ts.tv_nsec) {
		char frac[16];
		snprintf(frac, sizeof(frac), ".%09ld", ts.tv_nsec);
		size_t k = strlen(frac);
		while (frac[k - 1] == '0')
			frac[--k] = '\0';
		snprintf(buf + n, len - n, "%sZ", frac);
	} else {
		snprintf(buf + n, len - n, "Z");
	}
}

void cap_oci_log_only(const char *level, const char *msg)
{
	if (!cap_oci_flags.log)
		return;
	char now[40];
	cap_oci_rfc3339(now, sizeof(now), false);
	char *line;
	if (cap_oci_flags.log_json) {
		json_t *o = json_pack("{s:s,s:s,s:s}", "level", level, "msg", msg, "time", now);
		char *s = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
		json_decref(o);
		line = xasprintf("%s\n", s ? s : "{}");
		free(s);
	} else {
		/* logrus's text form: msg quoted with " and \ escaped. */
		size_t n = strlen(msg);
		char *q = xmalloc(2 * n + 1), *p = q;
		for (size_t i = 0; i < n; i++) {
			if (msg[i] == '"' || msg[i] == '\\')
				*p++ = '\\';
			*p++ = msg[i] == '\n' ? ' ' : msg[i];
		}
		*p = '\0';
		line = xasprintf("time=\"%s\" level=%s msg=\"%s\"\n", now, level, q);
		free(q);
	}
	int fd = open(cap_oci_flags.log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
	if (fd >= 0) {
		cap_write_all(fd, line, strlen(line));
		close(fd);
	}
	free(line);
}

void cap_oci_error(const char *fmt, ...)
{
	char msg[2048];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	fprintf(stderr, "capsule-oci: %s\n", msg);
	fflush(stderr);
	cap_oci_log_only("error", msg);
}

/* The library's lines go to the log file only: our stderr is often the
 * container's (a monitor's), and runc prints nothing but errors. */
void cap_oci_log_sink(void *ud, enum cap_log_level level, const char *line)
{
	(void)ud;
	if (level == CAP_LOG_INFO && !cap_oci_flags.debug)
		return;
	cap_oci_log_only(level == CAP_LOG_ERROR ? "error" : level == CAP_LOG_WARN ? "warning" : "info", line);
}

int cap_oci_fail(const struct cap_err *err)
{
	cap_oci_error("%s", err->msg);
	return 1;
}
