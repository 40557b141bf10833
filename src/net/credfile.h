/* A JSON credential file on the host, for --secret-file (policy.h,
 * docs/coding-agents.md "Credential files"): its fields' values, read as
 * secrets, and the guest's copy, in which they are placeholders. Pure
 * but for cap_cred_file_read; fuzzed as cred-file. Never logs or quotes
 * a value: messages name the file and the field. */
#ifndef CAP_NET_CREDFILE_H
#define CAP_NET_CREDFILE_H

#include <stddef.h>

#include "err.h"
#include "policy.h"

#define CAP_CRED_FILE_MAX (1u << 20)	/* bytes */

struct cap_cred_file;

/* Parse text (len bytes; where names it in messages). 0, or -EINVAL
 * (not a JSON object, over CAP_CRED_FILE_MAX). */
int cap_cred_file_parse(const char *where, const char *text, size_t len, struct cap_cred_file **out,
			struct cap_err *err);
/* Read and parse the file at path now: -ENOENT, -EINVAL, -errno. */
int cap_cred_file_read(const char *path, struct cap_cred_file **out, struct cap_err *err);
void cap_cred_file_free(struct cap_cred_file *c);

/* The fields that are secrets: f's own, or (none given) every string
 * member, at any depth of objects, whose name says it is a credential
 * (it holds "token", "secret", "password", "apikey" or "api_key", or is
 * "key", case aside) and whose value is at least
 * CAP_NET_SECRET_VALUE_MIN bytes, in document order. At most max; -E2BIG
 * past it. A field f names that the file lacks, or that is not a string,
 * is -ENOENT naming it. */
int cap_cred_file_fields(const struct cap_cred_file *c, const struct cap_net_secret_file *f,
			 char (*out)[128], unsigned max, unsigned *n, struct cap_err *err);
/* The string at field (a dotted path), borrowed from c: NULL when there
 * is none. */
const char *cap_cred_file_value(const struct cap_cred_file *c, const char *field, size_t *len);
/* The guest's copy: c with, in every string of the document (members'
 * values and array elements, at any depth), each values[i] replaced by
 * placeholders[i] wherever it occurs, so that no value survives even
 * where the file repeats one under another name. *out is new (JSON, a
 * trailing newline). -EINVAL when a member's name holds a value. */
int cap_cred_file_render(const struct cap_cred_file *c, const char *const *values, const size_t *lens,
			 const char *const *placeholders, unsigned n, char **out, size_t *len,
			 struct cap_err *err);

#endif
