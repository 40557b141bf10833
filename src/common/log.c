#include "log.h"

#include <stdarg.h>
#include <stdio.h>

static cap_log_fn sink;
static void *sink_ud;

void cap_log_set(cap_log_fn fn, void *ud)
{
	sink = fn;
	sink_ud = ud;
}

void cap_log(enum cap_log_level level, const char *fmt, ...)
{
	char line[2048];
	va_list ap;
	if (!sink)
		return;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	sink(sink_ud, level, line);
}

void cap_log_stderr(void *ud, enum cap_log_level level, const char *line)
{
	const char *name = ud;
	(void)level;
	if (name && *name)
		fprintf(stderr, "capsule %s: %s\n", name, line);
	else
		fprintf(stderr, "capsule: %s\n", line);
}
