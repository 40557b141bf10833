#include "err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

int cap_err_set(struct cap_err *err, int code, const char *fmt, ...)
{
	if (code < 0)
		code = -code;
	if (err) {
		va_list ap;
		va_start(ap, fmt);
		vsnprintf(err->msg, sizeof(err->msg), fmt, ap);
		va_end(ap);
		err->code = code;
	}
	return -code;
}

void cap_err_prefix(struct cap_err *err, const char *fmt, ...)
{
	if (!err)
		return;
	char prefix[256];
	va_list ap;

	va_start(ap, fmt);
	int n = vsnprintf(prefix, sizeof(prefix) - 2, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	size_t pl = strlen(prefix);
	memcpy(prefix + pl, ": ", 3);
	pl += 2;
	size_t ml = strnlen(err->msg, sizeof(err->msg) - 1);
	if (pl + ml >= sizeof(err->msg))
		ml = sizeof(err->msg) - 1 - pl;
	memmove(err->msg + pl, err->msg, ml);
	memcpy(err->msg, prefix, pl);
	err->msg[pl + ml] = '\0';
}
