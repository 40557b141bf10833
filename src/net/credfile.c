/* A JSON credential file for --secret-file (credfile.h). */
#include "credfile.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "secret.h"
#include "util.h"

struct cap_cred_file {
	json_t *doc;
	char where[520];
};

int cap_cred_file_parse(const char *where, const char *text, size_t len, struct cap_cred_file **out,
			struct cap_err *err)
{
	*out = NULL;
	if (len > CAP_CRED_FILE_MAX)
		return cap_err_set(err, EINVAL, "credential file %s: %zu bytes, over the limit of %u", where, len,
				   CAP_CRED_FILE_MAX);
	json_error_t je;
	json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!doc)
		return cap_err_set(err, EINVAL, "credential file %s is not JSON (line %d: %s)", where, je.line, je.text);
	if (!json_is_object(doc)) {
		json_decref(doc);
		return cap_err_set(err, EINVAL, "credential file %s is not a JSON object", where);
	}
	struct cap_cred_file *c = xcalloc(1, sizeof(*c));
	c->doc = doc;
	snprintf(c->where, sizeof(c->where), "%s", where);
	*out = c;
	return 0;
}

int cap_cred_file_read(const char *path, struct cap_cred_file **out, struct cap_err *err)
{
	*out = NULL;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return cap_err_set(err, errno, "credential file %s: %s", path, strerror(errno));
	struct stat st;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		close(fd);
		return cap_err_set(err, EINVAL, "credential file %s is not a regular file", path);
	}
	if (st.st_size > CAP_CRED_FILE_MAX) {
		close(fd);
		return cap_err_set(err, EINVAL, "credential file %s: %lld bytes, over the limit of %u", path,
				   (long long)st.st_size, CAP_CRED_FILE_MAX);
	}
	char *text = xmalloc((size_t)st.st_size + 1);
	size_t n = 0;
	for (;;) {
		ssize_t k = read(fd, text + n, (size_t)st.st_size + 1 - n);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0 || (n += (size_t)k) > (size_t)st.st_size)
			break;
	}
	close(fd);
	int r = n > (size_t)st.st_size ? cap_err_set(err, EAGAIN, "credential file %s changed while it was read", path)
				       : cap_cred_file_parse(path, text, n, out, err);
	explicit_bzero(text, (size_t)st.st_size + 1);
	free(text);
	return r;
}

/* Wipe every string of v (they may be values) and release it. */
static void wipe_decref(json_t *v)
{
	const char *k;
	json_t *m;
	size_t i;
	if (json_is_object(v))
		json_object_foreach(v, k, m)
			wipe_decref(json_incref(m));
	else if (json_is_array(v))
		json_array_foreach(v, i, m)
			wipe_decref(json_incref(m));
	else if (json_is_string(v) && v->refcount == 2)
		explicit_bzero((char *)json_string_value(v), json_string_length(v));
	json_decref(v);
}

void cap_cred_file_free(struct cap_cred_file *c)
{
	if (!c)
		return;
	json_incref(c->doc);
	wipe_decref(c->doc);
	json_decref(c->doc);
	free(c);
}

static json_t *at_path(json_t *doc, const char *field)
{
	char part[128];
	json_t *v = doc;
	for (const char *p = field; v && *p;) {
		size_t n = strcspn(p, ".");
		if (n >= sizeof(part) || !json_is_object(v))
			return NULL;
		memcpy(part, p, n);
		part[n] = '\0';
		v = json_object_get(v, part);
		p += n + (p[n] == '.');
	}
	return v == doc ? NULL : v;
}

const char *cap_cred_file_value(const struct cap_cred_file *c, const char *field, size_t *len)
{
	json_t *v = at_path(c->doc, field);
	if (!json_is_string(v))
		return NULL;
	*len = json_string_length(v);
	return json_string_value(v);
}

/* A member name as a field's part: the characters policy.c's field
 * paths take. */
static bool part_ok(const char *k)
{
	if (!*k)
		return false;
	for (; *k; k++)
		if (!((*k >= 'A' && *k <= 'Z') || (*k >= 'a' && *k <= 'z') || (*k >= '0' && *k <= '9') || *k == '_' ||
		      *k == '-'))
			return false;
	return true;
}

static bool credential_name(const char *k)
{
	char folded[128];
	size_t n = 0;
	for (; *k && n < sizeof(folded) - 1; k++) {
		char c = *k >= 'A' && *k <= 'Z' ? (char)(*k - 'A' + 'a') : *k;
		if (c != '_' && c != '-')
			folded[n++] = c;
	}
	folded[n] = '\0';
	return strstr(folded, "token") || strstr(folded, "secret") || strstr(folded, "password") ||
	       strstr(folded, "apikey") || !strcmp(folded, "key");
}

static int discover(json_t *obj, char *prefix, size_t plen, char (*out)[128], unsigned max, unsigned *n,
		    const char *where, struct cap_err *err)
{
	const char *k;
	json_t *v;
	json_object_foreach(obj, k, v) {
		size_t kl = strlen(k);
		if (!part_ok(k) || plen + (plen ? 1 : 0) + kl >= 128)
			continue;
		size_t np = plen;
		if (np)
			prefix[np++] = '.';
		memcpy(prefix + np, k, kl + 1);
		if (json_is_object(v)) {
			int r = discover(v, prefix, np + kl, out, max, n, where, err);
			if (r < 0)
				return r;
		} else if (json_is_string(v) && credential_name(k) && json_string_length(v) >= CAP_NET_SECRET_VALUE_MIN) {
			if (*n >= max)
				return cap_err_set(err, E2BIG, "credential file %s: more than %u credential fields (name them: GUESTPATH=HOSTFILE:FIELD,...)",
						   where, max);
			memcpy(out[(*n)++], prefix, np + kl + 1);
		}
		prefix[plen] = '\0';
	}
	return 0;
}

int cap_cred_file_fields(const struct cap_cred_file *c, const struct cap_net_secret_file *f,
			 char (*out)[128], unsigned max, unsigned *n, struct cap_err *err)
{
	*n = 0;
	if (f->nfields == 0) {
		char prefix[128] = "";
		return discover(c->doc, prefix, 0, out, max, n, c->where, err);
	}
	if (f->nfields > max)
		return cap_err_set(err, E2BIG, "credential file %s: more than %u fields", c->where, max);
	for (unsigned i = 0; i < f->nfields; i++) {
		if (!json_is_string(at_path(c->doc, f->fields[i])))
			return cap_err_set(err, ENOENT, "credential file %s has no string at %s (--secret-file %s=%s:...)",
					   c->where, f->fields[i], f->guest, f->host);
		memcpy(out[(*n)++], f->fields[i], sizeof(out[0]));
	}
	return 0;
}

/* s with every values[i] replaced by placeholders[i]; NULL when none is
 * in it. Longest values first would matter only for values inside one
 * another; each pass replaces whole occurrences, left to right. */
static char *replace_all(const char *s, size_t len, const char *const *values, const size_t *lens,
			 const char *const *ph, unsigned n, size_t *out_len)
{
	char *cur = NULL;
	size_t cl = len;
	const char *src = s;
	for (unsigned i = 0; i < n; i++) {
		if (lens[i] == 0 || !memmem(src, cl, values[i], lens[i]))
			continue;
		size_t pl = strlen(ph[i]), cap = cl / lens[i] * pl + cl + 1, o = 0;
		char *next = xmalloc(cap);
		for (size_t at = 0; at < cl;) {
			const char *hit = memmem(src + at, cl - at, values[i], lens[i]);
			size_t upto = hit ? (size_t)(hit - src) : cl;
			memcpy(next + o, src + at, upto - at);
			o += upto - at;
			if (!hit)
				break;
			memcpy(next + o, ph[i], pl);
			o += pl;
			at = upto + lens[i];
		}
		next[o] = '\0';
		if (cur) {
			explicit_bzero(cur, cl);
			free(cur);
		}
		cur = next;
		src = cur;
		cl = o;
	}
	*out_len = cl;
	return cur;
}

/* The string m with the values replaced, in place (the old bytes wiped). */
static void replace_in(json_t *m, const char *const *values, const size_t *lens, const char *const *ph, unsigned n)
{
	size_t nl;
	char *s = replace_all(json_string_value(m), json_string_length(m), values, lens, ph, n, &nl);
	if (s) {
		explicit_bzero((char *)json_string_value(m), json_string_length(m));
		json_string_setn_nocheck(m, s, nl);
		free(s);
	}
}

static int render(json_t *v, const char *const *values, const size_t *lens, const char *const *ph, unsigned n,
		  const char *where, struct cap_err *err)
{
	const char *k;
	json_t *m;
	size_t i, nl;
	if (json_is_object(v)) {
		json_object_foreach(v, k, m) {
			char *kn = replace_all(k, strlen(k), values, lens, ph, n, &nl);
			if (kn) {
				explicit_bzero(kn, nl);
				free(kn);
				return cap_err_set(err, EINVAL, "credential file %s: a member's name holds a credential's value",
						   where);
			}
			if (json_is_string(m))
				replace_in(m, values, lens, ph, n);
			else if (render(m, values, lens, ph, n, where, err) < 0) {
				return -EINVAL;
			}
		}
	} else if (json_is_array(v)) {
		json_array_foreach(v, i, m) {
			if (json_is_string(m))
				replace_in(m, values, lens, ph, n);
			else if (render(m, values, lens, ph, n, where, err) < 0) {
				return -EINVAL;
			}
		}
	}
	return 0;
}

int cap_cred_file_render(const struct cap_cred_file *c, const char *const *values, const size_t *lens,
			 const char *const *placeholders, unsigned n, char **out, size_t *len,
			 struct cap_err *err)
{
	*out = NULL;
	json_t *copy = json_deep_copy(c->doc);
	if (!copy)
		return cap_err_set(err, ENOMEM, "credential file %s: out of memory", c->where);
	int r = render(copy, values, lens, placeholders, n, c->where, err);
	if (r == 0) {
		char *text = json_dumps(copy, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		if (!text) {
			r = cap_err_set(err, ENOMEM, "credential file %s: cannot write its copy", c->where);
		} else {
			size_t tl = strlen(text);
			*out = xmalloc(tl + 2);
			memcpy(*out, text, tl);
			(*out)[tl] = '\n';
			(*out)[tl + 1] = '\0';
			*len = tl + 1;
			free(text);
		}
	}
	json_incref(copy);
	wipe_decref(copy);
	json_decref(copy);
	return r;
}
