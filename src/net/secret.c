/* A secret's value, read on the host at start, and its placeholder
 * (secret.h). Messages name the secret and its source, never the value;
 * every buffer that held the value is wiped before it is freed. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "secret.h"
#include "sha256.h"
#include "util.h"

void cap_net_secret_wipe(char *value, size_t len)
{
	if (!value)
		return;
	explicit_bzero(value, len + 1);	/* the NUL we add too */
	free(value);
}

void cap_net_secret_forget_source(const struct cap_net_secret *s)
{
	if (strncmp(s->source, "env:", 4) != 0)
		return;
	char *v = getenv(s->source + 4);
	if (!v)
		return;
	explicit_bzero(v, strlen(v));
	unsetenv(s->source + 4);
}

/* Read file:PATH: symbolic links are followed (a token kept under a
 * dotfiles manager is a link), the target must be a regular file (never
 * a FIFO or a device: they could block or never end). *buf new, wiped by
 * the caller; n bytes, at most CAP_NET_SECRET_VALUE_MAX + 2 (a trailing
 * "\r\n" not yet dropped). */
static int read_file(const struct cap_net_secret *s, const char *path, const char *decl,
		     char **buf, size_t *n, struct cap_err *err)
{
	const size_t max = CAP_NET_SECRET_VALUE_MAX + 2;
	struct stat st;
	/* O_NONBLOCK: opening a FIFO must not wait for a writer; it is
	 * refused just after. */
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		int e = errno;
		return cap_err_set(err, e, "secret %s: cannot open %s (--secret %s): %s%s", s->name, path, decl,
				   strerror(e), e == ENOENT ? "; the file is read on the host at each start" : "");
	}
	if (fstat(fd, &st) < 0) {
		int e = errno;
		close(fd);
		return cap_err_set(err, e, "secret %s: cannot stat %s: %s", s->name, path, strerror(e));
	}
	if (!S_ISREG(st.st_mode)) {
		close(fd);
		return cap_err_set(err, EINVAL, "secret %s: %s is not a regular file (--secret %s)", s->name, path,
				   decl);
	}
	if ((uint64_t)st.st_size > max) {
		close(fd);
		return cap_err_set(err, E2BIG, "secret %s: %s is larger than %d bytes (--secret %s)", s->name, path,
				   CAP_NET_SECRET_VALUE_MAX, decl);
	}
	/* One byte more than allowed tells a file that grew meanwhile. */
	char *b = xmalloc(max + 2);
	size_t len = 0;
	for (;;) {
		ssize_t k = read(fd, b + len, max + 1 - len);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			int e = errno;
			close(fd);
			cap_net_secret_wipe(b, max + 1);
			return cap_err_set(err, e, "secret %s: cannot read %s: %s", s->name, path, strerror(e));
		}
		if (k == 0)
			break;
		len += (size_t)k;
		if (len > max) {
			close(fd);
			cap_net_secret_wipe(b, max + 1);
			return cap_err_set(err, E2BIG, "secret %s: %s is larger than %d bytes (--secret %s)", s->name,
					   path, CAP_NET_SECRET_VALUE_MAX, decl);
		}
	}
	close(fd);
	b[len] = '\0';
	*buf = b;
	*n = len;
	return 0;
}

int cap_net_secret_check(const struct cap_net_secret *s, const char *what, const char *v, size_t n,
			 struct cap_err *err)
{
	char decl[CAP_NET_SECRET_MAX_HOSTS * 256 + 640];

	cap_net_secret_text(s, decl, sizeof(decl));
	if (n > CAP_NET_SECRET_VALUE_MAX) {
		return cap_err_set(err, E2BIG, "secret %s: the value in %s is longer than %d bytes (--secret %s)", s->name,
				what, CAP_NET_SECRET_VALUE_MAX, decl);
	}
	if (n < CAP_NET_SECRET_VALUE_MIN) {
		return cap_err_set(err, EINVAL,
				   "secret %s: the value in %s is %s; a secret is at least %d bytes (--secret %s)",
				   s->name, what, n == 0 ? "empty" : "too short", CAP_NET_SECRET_VALUE_MIN, decl);
	}
	for (size_t i = 0; i < n; i++) {
		unsigned char c = (unsigned char)v[i];
		if (c < 0x20 || c == 0x7f) {
			/* Its position, never the byte's neighbours. */
			return cap_err_set(err, EINVAL,
					"secret %s: the value in %s has a control character at byte %zu (a value "
					"goes into HTTP header lines: no tabs, line ends inside, or NUL) (--secret %s)",
					s->name, what, i + 1, decl);
		}
	}
	if (memmem(v, n, CAP_NET_PLACEHOLDER_PREFIX, strlen(CAP_NET_PLACEHOLDER_PREFIX))) {
		return cap_err_set(err, EINVAL,
				"secret %s: the value in %s holds a capsule placeholder (\"" CAP_NET_PLACEHOLDER_PREFIX
				"...\"), not a real value: was it taken from inside a sandbox? (--secret %s)",
				s->name, what, decl);
	}
	return 0;
}

int cap_net_secret_value(const struct cap_net_secret *s, char **value, size_t *len,
			 struct cap_err *err)
{
	char decl[CAP_NET_SECRET_MAX_HOSTS * 256 + 640];
	char *v = NULL;
	size_t n = 0;
	const char *what;	/* the source, for messages */
	char whatbuf[600];
	int r;

	/* --secret as the user wrote it, for messages. */
	cap_net_secret_text(s, decl, sizeof(decl));
	if (!strncmp(s->source, "env:", 4)) {
		const char *var = s->source + 4;
		const char *e = getenv(var);
		if (!e)
			return cap_err_set(err, ENOENT,
					   "secret %s: environment variable %s is not set (--secret %s); set it in "
					   "the environment of the command that starts the sandbox",
					   s->name, var, decl);
		n = strlen(e);
		if (n > CAP_NET_SECRET_VALUE_MAX)
			return cap_err_set(err, E2BIG,
					   "secret %s: environment variable %s is longer than %d bytes (--secret %s)",
					   s->name, var, CAP_NET_SECRET_VALUE_MAX, decl);
		v = xmalloc(n + 1);
		memcpy(v, e, n + 1);
		snprintf(whatbuf, sizeof(whatbuf), "environment variable %s", var);
	} else if (!strncmp(s->source, "file:", 5)) {
		const char *path = s->source + 5;
		if ((r = read_file(s, path, decl, &v, &n, err)) < 0)
			return r;
		/* One trailing line end, as `echo TOKEN > file` leaves it. */
		if (n >= 2 && v[n - 2] == '\r' && v[n - 1] == '\n')
			n -= 2;
		else if (n >= 1 && v[n - 1] == '\n')
			n -= 1;
		explicit_bzero(v + n, strlen(v + n));
		snprintf(whatbuf, sizeof(whatbuf), "the file %s", path);
	} else {
		return cap_err_set(err, EINVAL, "secret %s: the source \"%.520s\" is neither env:VAR nor file:PATH",
				   s->name, s->source);
	}
	what = whatbuf;
	if ((r = cap_net_secret_check(s, what, v, n, err)) < 0)
		goto fail;
	*value = v;
	*len = n;
	return 0;
fail:
	cap_net_secret_wipe(v, n);
	return r;
}

void cap_net_secret_placeholder(const uint8_t fp[32], const char *name,
				char out[CAP_NET_PLACEHOLDER_LEN + 1])
{
	static const char tag[] = "capsule placeholder";	/* and its NUL */
	struct cap_sha256 h;
	char hex[65];
	const size_t plen = sizeof(CAP_NET_PLACEHOLDER_PREFIX) - 1;

	_Static_assert(sizeof(CAP_NET_PLACEHOLDER_PREFIX) - 1 + 40 == CAP_NET_PLACEHOLDER_LEN,
		       "a placeholder is the prefix and 40 hex digits");
	cap_sha256_init(&h);
	cap_sha256_update(&h, tag, sizeof(tag));
	cap_sha256_update(&h, fp, 32);
	cap_sha256_update(&h, name, strlen(name));
	cap_sha256_final_hex(&h, hex);
	memcpy(out, CAP_NET_PLACEHOLDER_PREFIX, plen);
	memcpy(out + plen, hex, 40);
	out[CAP_NET_PLACEHOLDER_LEN] = '\0';
}
