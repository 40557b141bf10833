/* JSON-RPC 2.0 for `capsule serve` and for any front end that shares a
 * controller: one message per line on a unix socket (0600). Tool methods
 * carry the identity {agent, peer} from the trusted caller; no parameter
 * of a tool method can name a sandbox. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "controller.h"
#include "log.h"
#include "jsonrpc.h"
#include "policy.h"
#include "paths.h"
#include "serve.h"
#include "tree.h"
#include "sock.h"
#include "utf8.h"
#include "util.h"

#define WRITE_MAX 60000	/* one FILE frame */
#define MAX_CONNS 512	/* connections at once; more are told so and closed */
/* A request line: room for an inline upload's base64 (4 bytes per 3)
 * and the rest of the message (a path of 4 KiB escaped 6 times over). */
#define REQUEST_MAX ((size_t)24 << 20)
_Static_assert(REQUEST_MAX >= 4 * (((size_t)CAP_CTL_INLINE_MAX + 2) / 3) + (1u << 20),
	       "an inline upload fits in a request line");

struct conn;

enum method { M_TOOL, M_UPLOAD, M_DOWNLOAD, M_PREPARE };

/* A call submitted for a connection; the tag the core gives back. */
struct pending {
	struct conn *conn;	/* NULL once the client went away */
	json_t *id;	/* NULL for a notification: no answer */
	char path[4200];	/* FILE, XFER: as asked */
	enum method method;
	char *owned_to;	/* download: where the copy went (resolved) */
	enum cap_file_op op;
	struct cap_ctl_call *call;
	struct pending *next;	/* in conn->calls */
};

struct conn {
	int fd;
	struct cap_rpc_reader rd;
	struct cap_buf out;
	bool closing;
	struct pending *calls;
	struct conn *next;
};

struct cap_rpc_server {
	struct cap_ctl *ctl;
	struct cap_ctl_fe *fe;
	char *path;
	int listen_fd, lock_fd;
	bool adopted;	/* handed over (socket activation): never unlinked here */
	bool stopped;	/* shutting down: no new connections or requests */
	int spare_fd;	/* held for refusing a connection when out of descriptors */
	struct conn *conns;
	int nconns;
};

static const struct cap_ctl_frontend_ops rpc_ops;

/* --- connections ------------------------------------------------------------- */

static void conn_free(struct cap_rpc_server *s, struct conn *k)
{
	/* Its calls are cancelled: queued ones end now (done() unlinks
	 * them), running ones when the guest says so, without an answer. */
	for (struct pending *p = k->calls; p; p = p->next)
		p->conn = NULL;
	struct pending *p = k->calls;
	k->calls = NULL;
	while (p) {
		struct pending *next = p->next;
		p->next = NULL;
		if (p->call)
			cap_ctl_cancel(s->ctl, p->call);
		p = next;
	}
	for (struct conn **q = &s->conns; *q; q = &(*q)->next)
		if (*q == k) {
			*q = k->next;
			break;
		}
	close(k->fd);
	cap_rpc_reader_fini(&k->rd);
	cap_buf_fini(&k->out);
	free(k);
	s->nconns--;
}

static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
	__attribute__((format(printf, 4, 5)));
static void error_to(struct conn *k, json_t *id, int code, const char *fmt, ...)
{
	char msg[700];
	va_list ap;
	if (!id)
		return;	/* a notification is never answered */
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	cap_rpc_put_error(&k->out, id, code, msg, NULL);
}

/* The answer to a request (none to a notification); result is stolen. */
static void result_to(struct conn *k, json_t *id, json_t *result)
{
	if (id)
		cap_rpc_put_result(&k->out, id, result);
	else
		json_decref(result);
}

/* --- base64 and transfer directories (pure helpers) ------------------------------ */

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

char *cap_base64_encode(const void *p, size_t n, size_t *len)
{
	const uint8_t *s = p;
	size_t out = 4 * ((n + 2) / 3), k = 0;
	char *d = xmalloc(out + 1);
	for (size_t i = 0; i < n; i += 3) {
		uint32_t v = (uint32_t)s[i] << 16;
		if (i + 1 < n)
			v |= (uint32_t)s[i + 1] << 8;
		if (i + 2 < n)
			v |= s[i + 2];
		d[k++] = b64[(v >> 18) & 63];
		d[k++] = b64[(v >> 12) & 63];
		d[k++] = i + 1 < n ? b64[(v >> 6) & 63] : '=';
		d[k++] = i + 2 < n ? b64[v & 63] : '=';
	}
	d[k] = '\0';
	*len = k;
	return d;
}

static int b64_value(char c)
{
	const char *at = c ? strchr(b64, c) : NULL;
	return at ? (int)(at - b64) : -1;
}

ssize_t cap_base64_decode(const char *s, size_t n, uint8_t **out, size_t *bad)
{
	if (n % 4) {
		*bad = n;
		return -EINVAL;
	}
	uint8_t *d = xmalloc(n / 4 * 3 + 1);
	size_t k = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		bool last = i + 4 == n;
		for (int j = 0; j < 4; j++) {
			v[j] = b64_value(s[i + j]);
			/* '=' only as the last one or two characters */
			bool pad = s[i + j] == '=' && last && (j == 3 || (j == 2 && s[i + 3] == '='));
			if (v[j] < 0 && !pad) {
				*bad = i + (size_t)j;
				free(d);
				return -EINVAL;
			}
			if (pad)
				v[j] = -2;
		}
		if (v[0] < 0 || v[1] < 0) {
			*bad = i;
			free(d);
			return -EINVAL;
		}
		uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (uint32_t)(v[2] < 0 ? 0 : v[2]) << 6 |
			     (uint32_t)(v[3] < 0 ? 0 : v[3]);
		d[k++] = (uint8_t)(w >> 16);
		if (v[2] >= 0)
			d[k++] = (uint8_t)(w >> 8);
		if (v[3] >= 0)
			d[k++] = (uint8_t)w;
	}
	*out = d;
	return (ssize_t)k;
}

bool cap_ctl_path_within(const char *dir, const char *path)
{
	size_t n = strlen(dir);
	if (strcmp(dir, "/") == 0)
		return path[0] == '/';
	return strncmp(path, dir, n) == 0 && (path[n] == '\0' || path[n] == '/');
}

int cap_ctl_resolve_dir(const char *what, const char *path, char **out, struct cap_err *err)
{
	struct stat st;
	char *real = realpath(path, NULL);
	int e = real ? 0 : errno;
	if (real && (stat(real, &st) < 0 || !S_ISDIR(st.st_mode)))
		e = ENOTDIR;
	if (e) {
		free(real);
		return cap_err_set(err, e, "%s %s: %s (give an existing directory)", what, path, strerror(e));
	}
	*out = real;
	return 0;
}

void cap_ctl_transfer_dirs_free(char **dirs)
{
	for (size_t i = 0; dirs && dirs[i]; i++)
		free(dirs[i]);
	free(dirs);
}

int cap_ctl_transfer_dirs_resolve(const char *const *dirs, size_t n, char ***out,
				  struct cap_err *err)
{
	char **v = xcalloc(n + 1, sizeof(char *));
	for (size_t i = 0; i < n; i++) {
		int r = cap_ctl_resolve_dir("--transfer-dir", dirs[i], &v[i], err);
		if (r < 0) {
			cap_ctl_transfer_dirs_free(v);
			return r;
		}
	}
	*out = v;
	return 0;
}

/* "DIR1, DIR2" or "none" into buf, for messages. */
static void dirs_list(const char *const *dirs, size_t n, char *buf, size_t len)
{
	size_t used = 0;
	buf[0] = '\0';
	for (size_t i = 0; i < n && used < len; i++)
		used += (size_t)snprintf(buf + used, len - used, "%s%s", i ? ", " : "", dirs[i]);
	if (!n)
		snprintf(buf, len, "none");
}

static bool within_any(const char *const *dirs, size_t n, const char *path)
{
	for (size_t i = 0; i < n; i++)
		if (cap_ctl_path_within(dirs[i], path))
			return true;
	return false;
}

int cap_ctl_transfer_source(const char *const *dirs, size_t n, const char *path, char **out,
			    struct cap_err *err)
{
	char list[2048];
	dirs_list(dirs, n, list, sizeof(list));
	if (path[0] != '/')
		return cap_err_set(err, EINVAL, "%s is not an absolute path; give a host path inside a transfer directory (%s)",
				   path, list);
	char *real = realpath(path, NULL);
	if (!real)
		return cap_err_set(err, errno, "cannot resolve %s: %s", path, strerror(errno));
	if (!within_any(dirs, n, real)) {
		int r = strcmp(real, path) != 0
			? cap_err_set(err, EACCES, "%s resolves to %s, outside the transfer directories (%s); the server copies only from beneath a --transfer-dir",
				      path, real, list)
			: cap_err_set(err, EACCES, "%s is outside the transfer directories (%s); the server copies only from beneath a --transfer-dir",
				      path, list);
		free(real);
		return r;
	}
	*out = real;
	return 0;
}

int cap_ctl_transfer_dest(const char *const *dirs, size_t n, const char *path, char **out,
			  struct cap_err *err)
{
	char list[2048];
	dirs_list(dirs, n, list, sizeof(list));
	if (path[0] != '/')
		return cap_err_set(err, EINVAL, "%s is not an absolute path; give a host path inside a transfer directory (%s)",
				   path, list);
	_cleanup_free_ char *copy = xstrdup(path);
	size_t len = strlen(copy);
	while (len > 1 && copy[len - 1] == '/')
		copy[--len] = '\0';
	char *slash = strrchr(copy, '/');
	const char *name = slash + 1;
	if (!*name || strcmp(name, ".") == 0 || strcmp(name, "..") == 0)
		return cap_err_set(err, EINVAL, "%s does not end in a name for the copy", path);
	struct stat st;
	if (lstat(copy, &st) == 0)
		return cap_err_set(err, EEXIST, "%s exists already; download to a new path", path);
	if (errno != ENOENT)
		return cap_err_set(err, errno, "cannot check %s: %s", path, strerror(errno));
	*slash = '\0';
	char *parent = realpath(slash == copy ? "/" : copy, NULL);
	if (!parent)
		return cap_err_set(err, errno, "the directory of %s cannot be resolved: %s (it must exist)", path,
				   strerror(errno));
	if (!within_any(dirs, n, parent)) {
		int r = cap_err_set(err, EACCES, "%s is outside the transfer directories (%s): its directory resolves to %s; the server writes only beneath a --transfer-dir",
				    path, list, parent);
		free(parent);
		return r;
	}
	*out = strcmp(parent, "/") == 0 ? xasprintf("/%s", name) : xasprintf("%s/%s", parent, name);
	free(parent);
	return 0;
}

/* --- results --------------------------------------------------------------------- */

static const char *type_name(char t)
{
	return t == 'd' ? "directory" : t == 'f' ? "file" : t == 'l' ? "symlink" : "other";
}

static int code_of(enum cap_ctl_code c)
{
	switch (c) {
	case CAP_CTL_ESANDBOX: return CAP_RPC_SANDBOX;
	case CAP_CTL_ECAPACITY: return CAP_RPC_CAPACITY;
	case CAP_CTL_ETOOL: return CAP_RPC_TOOL;
	case CAP_CTL_ECANCELLED: return CAP_RPC_CANCELLED;
	default: return CAP_RPC_INTERNAL;
	}
}

static json_t *strings(const char *const *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++)
		json_array_append_new(a, cap_json_text(v[i]));
	return a;
}

json_t *cap_rpc_import_json(const struct cap_ctl_import *imp)
{
	const struct cap_ctl_xfer_out *o = &imp->out;
	json_t *j = json_pack("{s:o, s:I, s:I, s:I, s:o, s:o}", "from", cap_json_text(imp->from),
			      "files", (json_int_t)o->files, "dirs", (json_int_t)o->dirs,
			      "bytes", (json_int_t)o->bytes, "conflicts", strings(o->conflicts, o->nconflicts),
			      "refused", strings(o->refused, o->nrefused));
	if (imp->r < 0)
		json_object_set_new(j, "error", cap_json_text(imp->msg ? imp->msg : strerror(-imp->r)));
	return j;
}

/* --- a workspace's diff (shared with `capsule diff --json`) ------------------------ */

static const char *tree_type_name(char t)
{
	switch (t) {
	case CAP_TREE_FILE: return "file";
	case CAP_TREE_DIR: return "dir";
	case CAP_TREE_LINK: return "link";
	default: return "other";
	}
}

/* A path as a JSON string: as it is when it is UTF-8, else with every
 * byte over 0x7f, control byte and '%' as %XX (and *escaped set). */
static json_t *json_path(const char *p, bool *escaped)
{
	json_t *s = json_string(p);
	if (s)
		return s;
	struct cap_buf b;
	cap_buf_init(&b);
	for (const unsigned char *c = (const unsigned char *)p; *c; c++) {
		char e[4];
		int n = *c >= 0x80 || *c < 0x20 || *c == '%' || *c == 0x7f ? snprintf(e, sizeof(e), "%%%02X", *c)
									  : snprintf(e, sizeof(e), "%c", *c);
		cap_buf_append(&b, e, (size_t)n);
	}
	cap_buf_append(&b, "", 1);
	s = json_string((const char *)cap_buf_head(&b));
	cap_buf_fini(&b);
	*escaped = true;
	return s;
}

static json_t *json_mode(const struct cap_tree_entry *e)
{
	char m[8];
	if (!e)
		return json_null();
	snprintf(m, sizeof(m), "%04o", e->mode & 07777);
	return json_string(m);
}

json_t *cap_rpc_diff_json(const char *sandbox, const struct cap_tree_change *ch, size_t n)
{
	json_t *arr = json_array();
	for (size_t i = 0; i < n; i++) {
		const struct cap_tree_entry *cur = ch[i].to ? ch[i].to : ch[i].from;
		bool escaped = false;
		json_t *o = json_object();
		json_object_set_new(o, "path", json_path(cur->path, &escaped));
		if (escaped)
			json_object_set_new(o, "path_escaped", json_true());
		json_object_set_new(o, "change", json_string(cap_tree_change_name(ch[i].kind)));
		json_object_set_new(o, "type", json_string(tree_type_name(cur->type)));
		if (ch[i].kind == CAP_TREE_TYPE)
			json_object_set_new(o, "old_type", json_string(tree_type_name(ch[i].from->type)));
		json_object_set_new(o, "mode", json_mode(ch[i].to));
		json_object_set_new(o, "old_mode", json_mode(ch[i].from));
		if (ch[i].to && (ch[i].to->type == CAP_TREE_FILE || ch[i].to->type == CAP_TREE_LINK)) {
			char h[65];
			for (int b = 0; b < 32; b++)
				snprintf(h + 2 * b, 3, "%02x", ch[i].to->hash[b]);
			json_object_set_new(o, "size", json_integer((json_int_t)ch[i].to->size));
			json_object_set_new(o, "sha256", json_string(h));
		} else {
			json_object_set_new(o, "size", json_null());
			json_object_set_new(o, "sha256", json_null());
		}
		if (ch[i].to && ch[i].to->type == CAP_TREE_LINK)
			json_object_set_new(o, "target", json_path(ch[i].to->target, &escaped));
		json_array_append_new(arr, o);
	}
	return json_pack("{s:o, s:o}", "sandbox", cap_json_text(sandbox), "changes", arr);
}

/* A merge's conflicts: [{"path", "why"[, "path_escaped"]}...]. */
static json_t *conflicts_json(const struct cap_merge_conflict *v, size_t n)
{
	json_t *a = json_array();
	for (size_t i = 0; i < n; i++) {
		bool escaped = false;
		json_t *o = json_pack("{s:o, s:s}", "path", json_path(v[i].path, &escaped), "why", v[i].why);
		if (escaped)
			json_object_set_new(o, "path_escaped", json_true());
		json_array_append_new(a, o);
	}
	return a;
}

/* What a transfer copied, into o. */
static void put_counts(json_t *o, const struct cap_ctl_xfer_out *x)
{
	json_object_set_new(o, "files", json_integer((json_int_t)x->files));
	json_object_set_new(o, "dirs", json_integer((json_int_t)x->dirs));
	json_object_set_new(o, "links", json_integer((json_int_t)x->links));
	json_object_set_new(o, "bytes", json_integer((json_int_t)x->bytes));
}

/* The phases in bits (1u << phase) as ["kernel", ...]. */
static json_t *phases_json(unsigned bits)
{
	json_t *a = json_array();
	for (unsigned ph = 0; ph < CAP_PREP_NPHASES; ph++)
		if (bits & (1u << ph))
			json_array_append_new(a, json_string(cap_prep_phase_name((enum cap_prep_phase)ph)));
	return a;
}

json_t *cap_rpc_prepare_json(const struct cap_prep_out *o)
{
	json_t *img = json_pack("{s:o, s:s}", "name", o->owned_image_name ? cap_json_text(o->owned_image_name) : json_null(),
				"digest", o->image_digest);
	return json_pack("{s:b, s:o, s:o, s:o, s:o, s:b, s:I}", "prepared", 1, "built", phases_json(o->built),
			 "kernel", o->owned_kernel ? cap_json_text(o->owned_kernel) : json_null(),
			 "initramfs", o->owned_initramfs ? cap_json_text(o->owned_initramfs) : json_null(),
			 "image", img, "template", o->template_on, "duration_ms", (json_int_t)o->duration_ms);
}

/* Whether what the call wrote is on the host's disk files (the guest
 * flushed it before it reported the end), and how long that took. */
static void durable_json(json_t *o, const struct cap_exit *ex)
{
	json_object_set_new(o, "durable", json_boolean((ex->flags & CAP_EXIT_DURABLE) != 0));
	json_object_set_new(o, "sync_ms", json_integer(ex->sync_ms));
}

/* The answer to a tool method: a result, or an error whose data carries
 * errno, refused paths and the private import when there are. */
static void answer(struct cap_rpc_server *s, struct pending *p, const struct cap_ctl_result *r)
{
	struct conn *k = p->conn;
	if (!k || !p->id)
		return;
	json_t *res = NULL;
	int code = code_of(r->code);
	char msg[5400] = "";
	const struct cap_exit *ex = &r->exit;
	if (r->code != CAP_CTL_OK) {
		snprintf(msg, sizeof(msg), "%s", r->msg ? r->msg : "the call failed");
		if (p->method == M_DOWNLOAD && r->kind == CAP_CTL_FILE && r->errnum == EFBIG)
			snprintf(msg, sizeof(msg), "%s; a file over %u bytes (16 MiB) is downloaded with \"to\", a new path in a --transfer-dir",
				 r->msg ? r->msg : "the file is too big", CAP_CTL_INLINE_MAX);
	} else if (r->kind == CAP_CTL_PREPARE) {
		res = cap_rpc_prepare_json(r->prep);
	} else if (r->kind == CAP_CTL_EXEC) {
		res = json_pack("{s:s, s:o, s:o, s:b, s:b, s:o, s:o, s:i}", "sandbox", r->sandbox,
				"exit_code", ex->kind == CAP_EXIT_SIGNAL ? json_null() : json_integer(cap_exit_status(ex)),
				"signal", ex->kind == CAP_EXIT_SIGNAL ? json_integer(ex->value) : json_null(),
				"timed_out", (ex->flags & CAP_EXIT_TIMED_OUT) != 0,
				"truncated", (ex->flags & CAP_EXIT_TRUNCATED) != 0,
				"stdout", cap_json_textn(r->out, r->out_len), "stderr", cap_json_textn(r->err, r->err_len),
				"duration_ms", (int)ex->duration_ms);
		durable_json(res, ex);
		if (r->note)
			json_object_set_new(res, "note", cap_json_text(r->note));
	} else if (r->kind == CAP_CTL_FILE && p->method == M_DOWNLOAD) {
		if (r->is_dir) {
			code = CAP_RPC_TOOL;
			snprintf(msg, sizeof(msg), "%s is a directory; download a directory with \"to\", a new path in a --transfer-dir",
				 p->path[0] ? p->path : "the root");
		} else {
			size_t n;
			char *text = cap_base64_encode(r->content, r->content_len, &n);
			res = json_pack("{s:s, s:s, s:I, s:s%, s:i, s:i}", "sandbox", r->sandbox, "path", p->path,
					"bytes", (json_int_t)r->content_len, "content_base64", text, n, "files", 1,
					"dirs", 0);
			free(text);
		}
	} else if (r->kind == CAP_CTL_FILE && p->op == CAP_FILE_WRITE) {
		res = json_pack("{s:s, s:s, s:I}", "sandbox", r->sandbox, "path", p->path,
				"bytes", (json_int_t)r->written);
		durable_json(res, ex);
	} else if (r->kind == CAP_CTL_FILE && r->is_dir) {
		json_t *a = json_array();
		for (size_t e = 0; e < r->nentries; e++) {
			json_t *o = json_pack("{s:s, s:o}", "type", type_name(r->entries[e].type),
					      "name", cap_json_textn((const uint8_t *)r->entries[e].name,
								strlen(r->entries[e].name)));
			if (r->entries[e].type == 'f')
				json_object_set_new(o, "size", json_integer((json_int_t)r->entries[e].size));
			json_array_append_new(a, o);
		}
		res = json_pack("{s:s, s:s, s:o, s:b}", "sandbox", r->sandbox, "kind", "directory",
				"entries", a, "truncated", r->entries_truncated);
	} else if (r->kind == CAP_CTL_FILE && p->op == CAP_FILE_LIST) {
		code = CAP_RPC_TOOL;
		snprintf(msg, sizeof(msg), "%s is not a directory", p->path);
	} else if (r->kind == CAP_CTL_FILE && !cap_utf8_valid((const char *)r->content, r->content_len)) {
		code = CAP_RPC_TOOL;
		snprintf(msg, sizeof(msg), "%s is not UTF-8 text; read_file reads text only (download gives any file's bytes, in base64)",
			 p->path);
	} else if (r->kind == CAP_CTL_FILE) {
		res = json_pack("{s:s, s:s, s:s%}", "sandbox", r->sandbox, "kind", "file", "content",
				(const char *)r->content, r->content_len);
	} else if (r->kind == CAP_CTL_DIFF) {
		res = cap_rpc_diff_json(r->sandbox, r->changes, r->nchanges);
	} else if (r->kind == CAP_CTL_MERGE && r->merge) {
		const struct cap_workspace_counts *c = &r->merge->n;
		res = json_pack("{s:s, s:o, s:b, s:I, s:I, s:I, s:I, s:I, s:I}", "sandbox", r->sandbox, "into",
				cap_json_text(r->merge->into), "dry_run", r->merge->dry_run,
				"written", (json_int_t)c->written, "removed", (json_int_t)c->removed,
				"created", (json_int_t)c->created, "chmod", (json_int_t)c->chmod,
				"links", (json_int_t)c->links, "git_left_out", (json_int_t)c->git);
	} else if (r->kind == CAP_CTL_XFER) {
		res = json_pack("{s:s, s:s}", "sandbox", r->sandbox, "path", p->path);
		if (r->xfer)
			put_counts(res, r->xfer);
		if (r->xfer && p->method == M_UPLOAD) {
			json_object_set_new(res, "durable", json_boolean(r->xfer->durable));
			json_object_set_new(res, "sync_ms", json_integer(r->xfer->sync_ms));
		}
		if (p->owned_to)
			json_object_set_new(res, "to", cap_json_text(p->owned_to));
	} else {
		res = json_pack("{s:s, s:s}", "sandbox", r->sandbox ? r->sandbox : "", "state", r->state);
	}
	if (res) {
		if (r->import)
			json_object_set_new(res, "import", cap_rpc_import_json(r->import));
		if (r->prepared && r->kind != CAP_CTL_PREPARE)
			json_object_set_new(res, "prepared", phases_json(r->prepared));
		result_to(k, p->id, res);
		return;
	}
	json_t *data = NULL;
	if (r->code == CAP_CTL_ECAPACITY)
		data = json_pack("{s:b, s:i}", "retryable", 1, "capacity", cap_ctl_cfg(s->ctl)->lc.capacity);
	else if (r->prep)	/* the preparation failed: calling again retries it */
		data = json_pack("{s:s, s:b}", "phase", cap_prep_phase_name(r->prep->failed), "retryable", 1);
	else if (r->errnum)
		data = json_pack("{s:i}", "errno", r->errnum);
	if (r->prep && r->errnum)
		json_object_set_new(data, "errno", json_integer(r->errnum));
	if (r->xfer && (r->xfer->nrefused || r->xfer->files || r->xfer->dirs)) {
		if (!data)
			data = json_object();
		json_object_set_new(data, "refused", strings(r->xfer->refused, r->xfer->nrefused));
		put_counts(data, r->xfer);
	}
	if (r->merge && r->merge->nconflicts) {
		if (!data)
			data = json_object();
		json_object_set_new(data, "conflicts", conflicts_json(r->merge->conflicts, r->merge->nconflicts));
		json_object_set_new(data, "into", cap_json_text(r->merge->into));
	}
	if (r->import) {
		if (!data)
			data = json_object();
		json_object_set_new(data, "import", cap_rpc_import_json(r->import));
	}
	cap_rpc_put_error(&k->out, p->id, code, msg, data);
}

static void rpc_done(void *fe, struct cap_ctl *c, void *tag, const struct cap_ctl_result *r)
{
	struct cap_rpc_server *s = fe;
	struct pending *p = tag;
	(void)c;
	answer(s, p, r);
	if (p->conn)
		for (struct pending **q = &p->conn->calls; *q; q = &(*q)->next)
			if (*q == p) {
				*q = p->next;
				break;
			}
	json_decref(p->id);
	free(p->owned_to);
	free(p);
}

/* --- methods ------------------------------------------------------------------------ */

/* identity: {"agent": "...", "peer": "..."}, both valid; or an error sent. */
static bool identity(struct conn *k, json_t *id, json_t *params, const char **agent, const char **peer)
{
	json_t *who = json_object_get(params, "identity");
	*agent = json_string_value(json_object_get(who, "agent"));
	*peer = json_string_value(json_object_get(who, "peer"));
	if (!*agent || !*peer) {
		error_to(k, id, CAP_RPC_PARAMS, "params.identity must be {\"agent\": string, \"peer\": string}");
		return false;
	}
	if (!cap_controller_id_valid(*agent) || !cap_controller_id_valid(*peer)) {
		error_to(k, id, CAP_RPC_PARAMS, "identity parts must be 1 to 64 of A-Z a-z 0-9 . _ @ + = : - and not start with '.'");
		return false;
	}
	return true;
}

/* Queue req for the identity; owned_to (a download's resolved
 * destination, or NULL) is stolen. */
static void submit_as(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *agent,
		      const char *peer, const struct cap_ctl_req *req, const char *path,
		      enum method method, char *owned_to)
{
	struct pending *p = xcalloc(1, sizeof(*p));
	p->conn = k;
	p->id = id ? json_incref(id) : NULL;
	p->op = req->op;
	p->method = method;
	p->owned_to = owned_to;
	if (path)
		snprintf(p->path, sizeof(p->path), "%s", path);
	p->next = k->calls;
	k->calls = p;
	p->call = cap_ctl_submit(s->ctl, s->fe, agent, peer, req, p);
}

static void submit(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *agent,
		   const char *peer, const struct cap_ctl_req *req, const char *path)
{
	submit_as(s, k, id, agent, peer, req, path, M_TOOL, NULL);
}

/* params.durable: absent or true, the call returns once what it wrote is
 * on the host's disk files; false gives that up (*no_sync). False with an
 * error sent when it is not a boolean. */
static bool durable_param(struct conn *k, json_t *id, json_t *params, bool *no_sync)
{
	json_t *v = json_object_get(params, "durable");
	if (v && !json_is_boolean(v)) {
		error_to(k, id, CAP_RPC_PARAMS,
			 "params.durable must be true (the default: the call returns once its writes are on the host's disk) or false (sooner, and they may be lost if the VM dies)");
		return false;
	}
	*no_sync = json_is_false(v);
	return true;
}

static void m_exec(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *argv = json_object_get(params, "argv");
	json_t *env = json_object_get(params, "env");
	json_t *cwd = json_object_get(params, "cwd");
	json_t *timeout = json_object_get(params, "timeout");
	json_t *in = json_object_get(params, "stdin");
	json_t *pids = json_object_get(params, "pids_max");
	size_t n = json_array_size(argv);
	const char *agent, *peer;
	bool no_sync;
	if (!json_is_array(argv) || n == 0 || n > CAP_PROTO_MAX_ARGS)
		return error_to(k, id, CAP_RPC_PARAMS, "params.argv must be a non-empty array of strings");
	if ((env && !json_is_object(env)) || (cwd && !json_is_string(cwd)) ||
	    (in && !json_is_string(in)) || (timeout && !json_is_number(timeout)))
		return error_to(k, id, CAP_RPC_PARAMS, "env must be an object of strings, cwd and stdin strings, timeout a number of seconds");
	if (pids && (!json_is_integer(pids) || json_integer_value(pids) < 1 || json_integer_value(pids) > (1 << 22)))
		return error_to(k, id, CAP_RPC_PARAMS, "pids_max must be an integer from 1 to %d", 1 << 22);
	double t = timeout ? json_number_value(timeout) : 30;
	if (t < 0 || t > 86400)
		return error_to(k, id, CAP_RPC_PARAMS, "timeout %g is out of range (0 to 86400 seconds)", t);
	for (size_t a = 0; a < n; a++)
		if (!json_is_string(json_array_get(argv, a)))
			return error_to(k, id, CAP_RPC_PARAMS, "params.argv[%zu] is not a string", a);
	const char *key;
	json_t *val;
	json_object_foreach(env, key, val)
		if (!json_is_string(val) || !*key || strchr(key, '='))
			return error_to(k, id, CAP_RPC_PARAMS, "env.%s must be a string value with a name without '='", key);
	if (!durable_param(k, id, params, &no_sync) || !identity(k, id, params, &agent, &peer))
		return;

	size_t ne = json_object_size(env);
	const char **av = xcalloc(n + 1, sizeof(char *));
	char **ev = xcalloc(ne + 1, sizeof(char *));
	for (size_t a = 0; a < n; a++)
		av[a] = json_string_value(json_array_get(argv, a));
	uint32_t envc = 0;
	json_object_foreach(env, key, val)
		ev[envc++] = xasprintf("%s=%s", key, json_string_value(val));
	struct cap_exec_req x = {
		.argv = (char **)av, .argc = (uint32_t)n, .env = ev, .envc = envc,
		.cwd = cwd ? (char *)json_string_value(cwd) : NULL,
		.timeout_ms = (uint32_t)(t * 1000), .output_cap = 256 * 1024,
		.pids_max = pids ? (uint32_t)json_integer_value(pids) : 0,
		.flags = no_sync ? CAP_EXEC_NO_SYNC : 0,
	};
	struct cap_ctl_req req = { .kind = CAP_CTL_EXEC, .exec = &x };
	if (in) {
		req.stdin_data = json_string_value(in);
		req.stdin_len = json_string_length(in);
	}
	submit(s, k, id, agent, peer, &req, NULL);
	for (uint32_t e = 0; e < envc; e++)
		free(ev[e]);
	free(ev);
	free(av);
}

/* read_file, list_directory, write_file: a path relative to the public
 * data (/source) or the identity's /work, free of "..". */
static void m_file(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params,
		   enum cap_file_op op)
{
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *root = json_string_value(json_object_get(params, "root"));
	json_t *content = json_object_get(params, "content");
	json_t *max = json_object_get(params, "max_bytes");
	const char *agent, *peer;
	if (!root)
		root = op == CAP_FILE_WRITE ? "workspace" : "public";
	bool pub = strcmp(root, "public") == 0;
	if (!pub && strcmp(root, "workspace") != 0)
		return error_to(k, id, CAP_RPC_PARAMS, "root must be \"public\" or \"workspace\"");
	if (op == CAP_FILE_WRITE && pub)
		return error_to(k, id, CAP_RPC_PARAMS, "the public data is read-only; write_file writes to root \"workspace\" (/work)");
	if (!path && op == CAP_FILE_LIST)
		path = "";
	if (!path || (!*path && op != CAP_FILE_LIST) || strlen(path) > 4096)
		return error_to(k, id, CAP_RPC_PARAMS, "path must be a non-empty string of at most 4096 bytes");
	if (path[0] == '/')
		return error_to(k, id, CAP_RPC_PARAMS, "path %s is absolute; give it relative to the %s root", path, root);
	if (!cap_proto_file_path_ok(path))
		return error_to(k, id, CAP_RPC_PARAMS, "path %s climbs out of its root with '..'", path);
	if (op == CAP_FILE_WRITE && !json_is_string(content))
		return error_to(k, id, CAP_RPC_PARAMS, "write_file needs \"content\", a string");
	if (op == CAP_FILE_WRITE && json_string_length(content) > WRITE_MAX)
		return error_to(k, id, CAP_RPC_PARAMS, "content is %zu bytes; write_file takes at most %u bytes per call",
				json_string_length(content), WRITE_MAX);
	if (max && (!json_is_integer(max) || json_integer_value(max) < 1 || json_integer_value(max) > (64 << 20)))
		return error_to(k, id, CAP_RPC_PARAMS, "max_bytes must be an integer from 1 to %d", 64 << 20);
	bool no_sync = false;
	if ((op == CAP_FILE_WRITE && !durable_param(k, id, params, &no_sync)) ||
	    !identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_req req = {
		.kind = CAP_CTL_FILE, .op = op, .root = pub ? "/source" : "/work", .path = path,
		.data = op == CAP_FILE_WRITE ? json_string_value(content) : NULL,
		.len = op == CAP_FILE_WRITE ? json_string_length(content) : 0,
		.limit = max ? (uint32_t)json_integer_value(max) : 0,
		.no_sync = no_sync,
	};
	submit(s, k, id, agent, peer, &req, path);
}

/* The guest root a transfer names: "workspace" (/work, the default),
 * "project" (/workspace) and, for a download, "public" (/source). NULL
 * with an error sent. */
static const char *xfer_root(struct conn *k, json_t *id, json_t *params, bool download)
{
	json_t *v = json_object_get(params, "root");
	const char *root = v ? json_string_value(v) : "workspace";
	if (root && strcmp(root, "workspace") == 0)
		return "/work";
	if (root && strcmp(root, "project") == 0)
		return "/workspace";
	if (root && strcmp(root, "public") == 0 && download)
		return "/source";
	if (root && strcmp(root, "public") == 0)
		error_to(k, id, CAP_RPC_PARAMS, "params.root: the public data is read-only; upload writes to root \"workspace\" (/work) or \"project\" (/workspace)");
	else
		error_to(k, id, CAP_RPC_PARAMS, "params.root must be %s", download ? "\"workspace\" (/work), \"project\" (/workspace) or \"public\" (/source)"
									       : "\"workspace\" (/work) or \"project\" (/workspace)");
	return NULL;
}

/* A transfer's guest path: relative, each component a name (no "", "."
 * or ".."); "" only when allowed. False with an error sent. */
static bool xfer_path(struct conn *k, json_t *id, const char *path, bool empty_ok)
{
	if (!path || strlen(path) > 4096)
		return error_to(k, id, CAP_RPC_PARAMS, "params.path must be a string of at most 4096 bytes"), false;
	if (!*path && !empty_ok)
		return error_to(k, id, CAP_RPC_PARAMS, "params.path must name a file (a relative path)"), false;
	if (path[0] == '/')
		return error_to(k, id, CAP_RPC_PARAMS, "params.path %s is absolute; give it relative to its root", path), false;
	for (const char *c = path; *path; c++) {
		const char *end = strchr(c, '/');
		size_t n = end ? (size_t)(end - c) : strlen(c);
		if (n == 0 || (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
			return error_to(k, id, CAP_RPC_PARAMS, "params.path %s: every component must be a name (no empty, '.' or '..' component)",
					path), false;
		if (!end)
			break;
		c = end;
	}
	return true;
}

/* A --transfer-dir path check that failed: the path is refused (named
 * in data.refused) with the directories the server allows. */
static void refuse_host(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *field,
			const char *path, const struct cap_err *err)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	char msg[1200];
	snprintf(msg, sizeof(msg), "params.%s: %s", field, err->msg);
	if (id)
		cap_rpc_put_error(&k->out, id, CAP_RPC_PARAMS, msg,
				  json_pack("{s:[o], s:o, s:i}", "refused", cap_json_text(path), "transfer_dirs",
					    strings(cfg->transfer_dirs, cfg->ntransfer_dirs), "errno", err->code));
}

static bool have_transfer_dirs(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *field)
{
	if (cap_ctl_cfg(s->ctl)->ntransfer_dirs)
		return true;
	error_to(k, id, CAP_RPC_PARAMS, "params.%s names a host path, and this server was given no directory for transfers: start capsule serve with --transfer-dir DIR (repeatable)",
		 field);
	return false;
}

/* upload: {identity, path, root, content_base64 [, mode] | from} into the
 * identity's /work (or /workspace). */
static void m_upload(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *content = json_object_get(params, "content_base64");
	json_t *from = json_object_get(params, "from");
	json_t *mode = json_object_get(params, "mode");
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *agent, *peer;
	const char *root = xfer_root(k, id, params, false);
	if (!root)
		return;
	if (!content == !from)
		return error_to(k, id, CAP_RPC_PARAMS, "upload needs exactly one of params.content_base64 (a file's bytes) and params.from (a host path in a --transfer-dir)");
	if ((content && !json_is_string(content)) || (from && !json_is_string(from)))
		return error_to(k, id, CAP_RPC_PARAMS, "params.%s must be a string", content ? "content_base64" : "from");
	if (!xfer_path(k, id, path, from != NULL))
		return;
	bool no_sync;
	if (!durable_param(k, id, params, &no_sync))
		return;
	unsigned bits = 0644;
	if (mode && from)
		return error_to(k, id, CAP_RPC_PARAMS, "params.mode applies to content_base64 only; an upload from the host keeps the host's modes");
	if (mode && json_is_integer(mode) && json_integer_value(mode) >= 0 && json_integer_value(mode) <= 07777) {
		bits = (unsigned)json_integer_value(mode);
	} else if (mode) {
		const char *m = json_string_value(mode);
		char *end = NULL;
		unsigned long v = m && *m ? strtoul(m, &end, 8) : 0;
		if (!m || !*m || *end || v > 07777 || strspn(m, "01234567") != strlen(m))
			return error_to(k, id, CAP_RPC_PARAMS, "params.mode must be permission bits: an octal string such as \"0755\" or a number from 0 to 4095");
		bits = (unsigned)v;
	}
	struct cap_ctl_req req = { .kind = CAP_CTL_XFER, .put = true, .root = root, .path = path, .mode = bits,
				   .no_sync = no_sync };
	uint8_t *bytes = NULL;
	char *host = NULL;
	if (content) {
		size_t n = json_string_length(content), bad = 0;
		if (n > 4 * (((size_t)CAP_CTL_INLINE_MAX + 2) / 3))
			return error_to(k, id, CAP_RPC_PARAMS, "params.content_base64 holds more than %u bytes (16 MiB), the cap of an inline upload; put the file in a --transfer-dir and upload it with \"from\"",
					CAP_CTL_INLINE_MAX);
		ssize_t len = cap_base64_decode(json_string_value(content), n, &bytes, &bad);
		if (len < 0)
			return error_to(k, id, CAP_RPC_PARAMS, "params.content_base64 is not base64 (RFC 4648, with padding, no line breaks): bad character or length at offset %zu",
					bad);
		if ((size_t)len > CAP_CTL_INLINE_MAX) {
			free(bytes);
			return error_to(k, id, CAP_RPC_PARAMS, "params.content_base64 holds %zd bytes, over the %u-byte (16 MiB) cap of an inline upload; put the file in a --transfer-dir and upload it with \"from\"",
					len, CAP_CTL_INLINE_MAX);
		}
		req.data = bytes;
		req.len = (size_t)len;
	} else {
		struct cap_err err = { 0 };
		if (!have_transfer_dirs(s, k, id, "from"))
			return;
		if (cap_ctl_transfer_source(cfg->transfer_dirs, cfg->ntransfer_dirs, json_string_value(from), &host,
					    &err) < 0)
			return refuse_host(s, k, id, "from", json_string_value(from), &err);
		req.host = host;
	}
	if (identity(k, id, params, &agent, &peer))
		submit_as(s, k, id, agent, peer, &req, path, M_UPLOAD, NULL);
	free(bytes);
	free(host);
}

/* download: {identity, path, root [, to]}: one file inline (base64), or
 * a file or tree written to a new host path in a --transfer-dir. */
static void m_download(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *to = json_object_get(params, "to");
	const char *path = json_string_value(json_object_get(params, "path"));
	const char *agent, *peer;
	const char *root = xfer_root(k, id, params, true);
	if (!root)
		return;
	if (to && !json_is_string(to))
		return error_to(k, id, CAP_RPC_PARAMS, "params.to must be a string: a new host path in a --transfer-dir");
	if (!xfer_path(k, id, path, to != NULL))
		return;
	if (!to) {
		if (!identity(k, id, params, &agent, &peer))
			return;
		struct cap_ctl_req req = { .kind = CAP_CTL_FILE, .op = CAP_FILE_READ, .root = root, .path = path,
					   .limit = CAP_CTL_INLINE_MAX };
		submit_as(s, k, id, agent, peer, &req, path, M_DOWNLOAD, NULL);
		return;
	}
	struct cap_err err = { 0 };
	char *dest = NULL;
	if (!have_transfer_dirs(s, k, id, "to"))
		return;
	if (cap_ctl_transfer_dest(cfg->transfer_dirs, cfg->ntransfer_dirs, json_string_value(to), &dest, &err) < 0)
		return refuse_host(s, k, id, "to", json_string_value(to), &err);
	if (!identity(k, id, params, &agent, &peer)) {
		free(dest);
		return;
	}
	struct cap_ctl_req req = { .kind = CAP_CTL_XFER, .put = false, .root = root, .path = path, .host = dest };
	submit_as(s, k, id, agent, peer, &req, path, M_DOWNLOAD, xstrdup(dest));
	free(dest);
}

/* diff and merge need the server's --workspace DIR; false with an error
 * sent. */
static bool have_workspace(struct cap_rpc_server *s, struct conn *k, json_t *id, const char *method)
{
	if (cap_ctl_cfg(s->ctl)->workspace)
		return true;
	error_to(k, id, CAP_RPC_PARAMS, "%s needs a project: this server was started without --workspace DIR (start capsule serve with --workspace DIR; each identity's sandbox then gets a copy of it at /workspace)",
		 method);
	return false;
}

/* diff: {identity}: what the identity's sandbox changed in /workspace
 * since its base, as `capsule diff --json` says it. */
static void m_diff(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	if (!have_workspace(s, k, id, "diff") || !identity(k, id, params, &agent, &peer))
		return;
	struct cap_ctl_req req = { .kind = CAP_CTL_DIFF };
	submit(s, k, id, agent, peer, &req, NULL);
}

/* merge: {identity [, pick] [, dry_run]}: the identity's sandbox's
 * changes into the server's --workspace DIR, three-way against the
 * sandbox's own base. */
static void m_merge(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	json_t *pick = json_object_get(params, "pick");
	json_t *dry = json_object_get(params, "dry_run");
	struct cap_ctl_req req = { .kind = CAP_CTL_MERGE, .pick = CAP_MERGE_REFUSE };
	if (!have_workspace(s, k, id, "merge"))
		return;
	if (pick) {
		const char *v = json_string_value(pick);
		if (v && strcmp(v, "theirs") == 0)
			req.pick = CAP_MERGE_THEIRS;
		else if (v && strcmp(v, "ours") == 0)
			req.pick = CAP_MERGE_OURS;
		else if (!v || strcmp(v, "refuse") != 0)
			return error_to(k, id, CAP_RPC_PARAMS, "params.pick must be \"refuse\" (conflicts refuse the merge; the default), \"theirs\" (the sandbox's version wins) or \"ours\" (the host's version stays)");
	}
	if (dry && !json_is_boolean(dry))
		return error_to(k, id, CAP_RPC_PARAMS, "params.dry_run must be true or false");
	req.dry_run = json_is_true(dry);
	if (!identity(k, id, params, &agent, &peer))
		return;
	submit(s, k, id, agent, peer, &req, NULL);
}

static json_t *status_json(const struct cap_ctl_status *st)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i}", "agent", st->agent, "peer", st->peer,
			      "state", cap_vm_state_name(st->state), "active", (int)st->active,
			      "queued", (int)st->queued);
	json_object_set_new(j, "sandbox", st->sandbox[0] ? json_string(st->sandbox) : json_null());
	json_object_set_new(j, "idle_ms", st->idle_ms >= 0 ? json_integer(st->idle_ms) : json_null());
	json_object_set_new(j, "imported", st->imported > 0 ? json_integer(st->imported) : json_null());
	return j;
}

static void m_status(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	const char *agent, *peer;
	struct cap_ctl_status st;
	if (!identity(k, id, params, &agent, &peer))
		return;
	cap_ctl_status(s->ctl, agent, peer, &st);	/* creates nothing */
	result_to(k, id, status_json(&st));
}

static void list_one(void *ud, const struct cap_ctl_status *st)
{
	json_array_append_new(ud, status_json(st));
}

static void m_list(struct cap_rpc_server *s, struct conn *k, json_t *id)
{
	json_t *a = json_array();
	struct cap_ctl_pool_info pool;
	cap_ctl_list(s->ctl, list_one, a, &pool);
	result_to(k, id, json_pack("{s:o, s:i, s:{s:i, s:i, s:i}}", "sandboxes", a,
						  "capacity", cap_ctl_cfg(s->ctl)->lc.capacity, "warm_pool",
						  "size", (int)pool.size, "members", (int)pool.members,
						  "ready", (int)pool.ready));
}

static void m_info(struct cap_rpc_server *s, struct conn *k, json_t *id)
{
	const struct cap_controller_cfg *cfg = cap_ctl_cfg(s->ctl);
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:I, s:I, s:i, s:b}", "pid", (int)getpid(),
			      "frontend", cfg->frontend ? cfg->frontend : "serve", "home", cap_ctl_home(s->ctl),
			      "image", cfg->image, "capacity", cfg->lc.capacity,
			      "idle_pause_ms", (json_int_t)cfg->lc.idle_pause_ms,
			      "idle_stop_ms", (json_int_t)cfg->lc.idle_stop_ms, "warm_pool", (int)cfg->warm_pool,
			      "manual_clock", cfg->manual_clock);
	json_object_set_new(j, "source", cfg->source ? json_string(cfg->source) : json_null());
	json_object_set_new(j, "workspace", cfg->workspace ? cap_json_text(cfg->workspace) : json_null());
	json_object_set_new(j, "private_import", cfg->private_import ? cap_json_text(cfg->private_import) : json_null());
	json_object_set_new(j, "transfer_dirs", strings(cfg->transfer_dirs, cfg->ntransfer_dirs));
	json_object_set_new(j, "inline_max", json_integer(CAP_CTL_INLINE_MAX));
	json_t *net = json_array();
	if (cfg->network) {
		char **words = NULL;
		size_t n = 0;
		cap_net_policy_words(cfg->network, &words, &n);
		for (size_t i = 0; i < n; i++) {
			json_array_append_new(net, json_string(words[i]));
			free(words[i]);
		}
		free(words);
	}
	json_object_set_new(j, "network", net);
	result_to(k, id, j);
}

static void m_stop_remove(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params,
			  bool remove)
{
	const char *agent, *peer;
	char a[65], p[65];
	const char *name = json_string_value(json_object_get(params, "sandbox"));
	if (name) {
		/* The administrative form (`capsule rm --force`, `capsule stop
		 * --force` on a sandbox this controller owns). */
		if (json_object_get(params, "identity"))
			return error_to(k, id, CAP_RPC_PARAMS, "give either identity or sandbox, not both");
		if (cap_ctl_identity_of(s->ctl, name, a, p) < 0)
			return error_to(k, id, CAP_RPC_PARAMS, "sandbox '%s' belongs to no identity of this controller", name);
		agent = a;
		peer = p;
	} else if (!identity(k, id, params, &agent, &peer)) {
		return;
	}
	struct cap_ctl_req req = { .kind = remove ? CAP_CTL_REMOVE : CAP_CTL_STOP };
	submit(s, k, id, agent, peer, &req, NULL);
}

/* prepare: {} (params may be omitted): kernel, initramfs, image and
 * template made sure of, with progress notifications on this connection. */
static void m_prepare(struct cap_rpc_server *s, struct conn *k, json_t *id)
{
	struct pending *p = xcalloc(1, sizeof(*p));
	p->conn = k;
	p->id = id ? json_incref(id) : NULL;
	p->method = M_PREPARE;
	p->next = k->calls;
	k->calls = p;
	p->call = cap_ctl_prepare_submit(s->ctl, s->fe, p);
}

/* A notification to the caller of a request waiting for the
 * preparation (none for a notification of its own: nothing to name). */
static void rpc_progress(void *fe, struct cap_ctl *c, void *tag, const struct cap_prep_event *ev)
{
	struct pending *p = tag;
	(void)fe, (void)c;
	if (!p->conn || !p->id || p->conn->closing)
		return;
	cap_rpc_put_request(&p->conn->out, -1, "progress",
			    json_pack("{s:O, s:s, s:s, s:i, s:i, s:o}", "request", p->id,
				      "phase", cap_prep_phase_name(ev->phase), "status", cap_prep_status_name(ev->status),
				      "done", (int)ev->done, "total", CAP_PREP_NPHASES,
				      "message", cap_json_text(ev->message ? ev->message : "")));
}

static void m_cancel(struct cap_rpc_server *s, struct conn *k, json_t *id, json_t *params)
{
	json_t *target = json_object_get(params, "id");
	bool done = false;
	if (!target || !(json_is_string(target) || json_is_integer(target)))
		return error_to(k, id, CAP_RPC_PARAMS, "params.id must be the id of one of your requests");
	for (struct pending *p = k->calls; p; p = p->next)
		if (p->id && p->call && json_equal(p->id, target)) {
			done = cap_ctl_cancel(s->ctl, p->call);	/* may free p */
			break;
		}
	result_to(k, id, json_pack("{s:b}", "cancelled", done));
}

static void handle(struct cap_rpc_server *s, struct conn *k, const char *line, size_t len)
{
	struct cap_rpc_msg m;
	json_t *bad_id;
	char msg[600];
	int code = cap_rpc_parse(line, len, &m, &bad_id, msg, sizeof(msg));
	if (code != 0 || !m.method) {
		if (code == 0)
			snprintf(msg, sizeof(msg), "this server takes requests only; it sent none that a response could answer");
		cap_rpc_put_error(&k->out, bad_id, code ? code : CAP_RPC_INVALID, msg, NULL);
		cap_rpc_msg_fini(&m);
		return;
	}
	/* A notification (no id) runs but is never answered, errors included. */
	json_t *id = m.id;
	json_t *empty = m.params ? NULL : json_object();
	json_t *params = m.params ? m.params : empty;
	const char *method = m.method;
	if (s->stopped)
		error_to(k, id, CAP_RPC_SANDBOX, "the controller is shutting down");
	else if (strcmp(method, "exec") == 0)
		m_exec(s, k, id, params);
	else if (strcmp(method, "read_file") == 0)
		m_file(s, k, id, params, CAP_FILE_READ);
	else if (strcmp(method, "list_directory") == 0)
		m_file(s, k, id, params, CAP_FILE_LIST);
	else if (strcmp(method, "write_file") == 0)
		m_file(s, k, id, params, CAP_FILE_WRITE);
	else if (strcmp(method, "upload") == 0)
		m_upload(s, k, id, params);
	else if (strcmp(method, "download") == 0)
		m_download(s, k, id, params);
	else if (strcmp(method, "diff") == 0)
		m_diff(s, k, id, params);
	else if (strcmp(method, "merge") == 0)
		m_merge(s, k, id, params);
	else if (strcmp(method, "status") == 0)
		m_status(s, k, id, params);
	else if (strcmp(method, "list") == 0)
		m_list(s, k, id);
	else if (strcmp(method, "info") == 0)
		m_info(s, k, id);
	else if (strcmp(method, "stop") == 0)
		m_stop_remove(s, k, id, params, false);
	else if (strcmp(method, "remove") == 0)
		m_stop_remove(s, k, id, params, true);
	else if (strcmp(method, "cancel") == 0)
		m_cancel(s, k, id, params);
	else if (strcmp(method, "prepare") == 0)
		m_prepare(s, k, id);
	else if (strcmp(method, "_test.advance") == 0 && cap_ctl_cfg(s->ctl)->manual_clock) {
		json_t *ms = json_object_get(params, "ms");
		int64_t now;
		if (!json_is_integer(ms) || json_integer_value(ms) < 0)
			error_to(k, id, CAP_RPC_PARAMS, "params.ms must be a non-negative integer");
		else if (cap_ctl_advance(s->ctl, json_integer_value(ms), &now) == 0)
			result_to(k, id, json_pack("{s:I}", "now", (json_int_t)now));
	} else
		error_to(k, id, CAP_RPC_METHOD, "method '%s' not found", method);
	json_decref(empty);
	cap_rpc_msg_fini(&m);
}

/* --- the front end ------------------------------------------------------------------- */

struct line_ctx {
	struct cap_rpc_server *s;
	struct conn *k;
};

static void on_line(void *ud, const char *p, size_t n)
{
	struct line_ctx *lc = ud;
	if (!lc->k->closing)
		handle(lc->s, lc->k, p, n);
}

static void on_too_long(void *ud)
{
	struct line_ctx *lc = ud;
	char msg[100];
	snprintf(msg, sizeof(msg), "request line over %zu bytes; it was dropped", REQUEST_MAX);
	cap_rpc_put_error(&lc->k->out, NULL, CAP_RPC_INVALID, msg, NULL);
}

static void rpc_pollfds(void *fe, struct cap_ctl *c, struct cap_ctl_poll *p)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	if (!s->stopped)
		cap_ctl_poll_add(p, s->listen_fd, POLLIN, NULL);
	for (struct conn *k = s->conns; k; k = k->next)
		if (!k->closing)
			cap_ctl_poll_add(p, k->fd, (short)(POLLIN | (cap_buf_used(&k->out) ? POLLOUT : 0)), k);
}

static void rpc_ready(void *fe, struct cap_ctl *c, void *tag, short revents)
{
	struct cap_rpc_server *s = fe;
	struct conn *k = tag;
	(void)c;
	if (!k) {
		int fd;
		while ((fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK)) >= 0) {
			if (s->nconns >= MAX_CONNS) {
				/* Said, not silently dropped: the client learns why. */
				struct cap_buf b;
				char msg[200];
				cap_buf_init(&b);
				snprintf(msg, sizeof(msg), "the controller serves at most %d connections at once; close one and retry",
					 MAX_CONNS);
				cap_rpc_put_error(&b, NULL, CAP_RPC_SANDBOX, msg, json_pack("{s:b}", "retryable", 1));
				cap_rpc_flush(&b, fd);
				cap_buf_fini(&b);
				close(fd);
				continue;
			}
			k = xcalloc(1, sizeof(*k));
			k->fd = fd;
			cap_rpc_reader_init(&k->rd);
			k->rd.max = REQUEST_MAX;	/* an inline upload */
			cap_buf_init(&k->out);
			k->next = s->conns;
			s->conns = k;
			s->nconns++;
		}
		if ((errno == EMFILE || errno == ENFILE) && s->spare_fd >= 0) {
			/* Out of descriptors: the pending connection would wake
			 * poll at once for ever. Take it with the spare
			 * descriptor and close it: the client sees it refused. */
			cap_log(CAP_LOG_WARN, "refused a connection: %s", strerror(errno));
			close(s->spare_fd);
			fd = accept4(s->listen_fd, NULL, NULL, SOCK_CLOEXEC);
			if (fd >= 0)
				close(fd);
			s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
		}
		return;
	}
	if (k->closing || !(revents & (POLLIN | POLLHUP | POLLERR)))
		return;
	struct line_ctx lc = { s, k };
	if (cap_rpc_read(&k->rd, k->fd, on_line, on_too_long, &lc) == 0)
		k->closing = true;	/* freed in flush: this round's slots name it */
}

static void rpc_flush(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	for (struct conn *k = s->conns, *next; k; k = next) {
		next = k->next;
		if (!k->closing && cap_rpc_flush(&k->out, k->fd) < 0)
			k->closing = true;
		if (k->closing)
			conn_free(s, k);
	}
}

static void rpc_shutdown(void *fe, struct cap_ctl *c)
{
	struct cap_rpc_server *s = fe;
	(void)c;
	s->stopped = true;
}

static const struct cap_ctl_frontend_ops rpc_ops = {
	.name = "serve",
	.pollfds = rpc_pollfds,
	.ready = rpc_ready,
	.flush = rpc_flush,
	.done = rpc_done,
	.shutdown = rpc_shutdown,
	.progress = rpc_progress,
};

static int server_new(struct cap_ctl *c, const char *path, int fd, struct cap_rpc_server **out,
		      struct cap_err *err)
{
	struct cap_rpc_server *s = xcalloc(1, sizeof(*s));
	_cleanup_free_ char *lockp = xasprintf("%s.lock", path);
	s->ctl = c;
	s->listen_fd = fd;
	s->adopted = fd >= 0;
	s->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	s->path = xstrdup(path);
	/* One server per socket (two homes could name the same one). A
	 * service manager that hands the socket over makes sure of that
	 * itself: a lock that cannot be made beside it is not needed. */
	s->lock_fd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
	if ((s->lock_fd < 0 && !s->adopted) || (s->lock_fd >= 0 && flock(s->lock_fd, LOCK_EX | LOCK_NB) < 0)) {
		cap_rpc_server_free(s);
		return cap_err_set(err, EBUSY, "another capsule controller is using %s (%s is locked)", path, lockp);
	}
	if (!s->adopted)
		s->listen_fd = cap_unix_listen(path, err);
	if (s->listen_fd < 0) {
		int r = s->listen_fd;
		cap_rpc_server_free(s);
		return r;
	}
	s->fe = cap_ctl_add_frontend(c, &rpc_ops, s);
	*out = s;
	return 0;
}

int cap_rpc_server_new(struct cap_ctl *c, const char *path, struct cap_rpc_server **out,
		       struct cap_err *err)
{
	return server_new(c, path, -1, out, err);
}

int cap_rpc_server_adopt(struct cap_ctl *c, int fd, const char *path, struct cap_rpc_server **out,
			 struct cap_err *err)
{
	return server_new(c, path, fd, out, err);
}

void cap_rpc_server_free(struct cap_rpc_server *s)
{
	if (!s)
		return;
	while (s->conns) {
		struct conn *k = s->conns;
		s->conns = k->next;
		for (struct pending *p = k->calls, *next; p; p = next) {
			next = p->next;	/* the core is gone: nothing will answer */
			json_decref(p->id);
			free(p->owned_to);
			free(p);
		}
		close(k->fd);
		cap_rpc_reader_fini(&k->rd);
		cap_buf_fini(&k->out);
		free(k);
	}
	if (s->listen_fd >= 0) {
		close(s->listen_fd);
		if (!s->adopted)
			unlink(s->path);	/* a handed-over socket stays its manager's */
	}
	if (s->lock_fd >= 0)
		close(s->lock_fd);
	if (s->spare_fd >= 0)
		close(s->spare_fd);
	free(s->path);
	free(s);
}

int cap_serve_run(struct cap_controller_cfg *cfg, const char *socket_path, struct cap_err *err)
{
	struct cap_ctl *c = NULL;
	struct cap_rpc_server *s = NULL;
	_cleanup_free_ char *home = cap_home_dir();
	char cwd[4096];
	_cleanup_free_ char *path = !socket_path ? xasprintf("%s/serve.sock", home)
			: socket_path[0] == '/' || !getcwd(cwd, sizeof(cwd)) ? xstrdup(socket_path)
			: xasprintf("%s/%s", cwd, socket_path);	/* others find it by this name */
	cfg->frontend = "serve";
	cfg->socket_path = NULL;	/* named once it listens */
	/* Socket activation: the service manager's socket, whatever
	 * --socket says. */
	char *apath = NULL;
	int afd = cap_unix_activated(&apath, err);
	if (afd < 0 && afd != -ENOENT)
		return afd;
	if (afd >= 0) {
		if (socket_path && strcmp(socket_path, apath) != 0)
			cap_log(CAP_LOG_WARN, "--socket %s is not used: the service manager passed %s", socket_path, apath);
		free(path);
		path = apath;
	}
	cap_ctl_check_image(cfg);
	int r = cap_ctl_new(cfg, &c, err);
	if (r < 0 && afd >= 0)
		close(afd);
	if (r == 0)
		r = afd >= 0 ? cap_rpc_server_adopt(c, afd, path, &s, err) : cap_rpc_server_new(c, path, &s, err);
	if (r == 0 && (r = cap_ctl_set_socket(c, path, err)) == 0) {
		cap_log(CAP_LOG_INFO, "listening on %s%s", path, afd >= 0 ? " (passed by the service manager)" : "");
		r = cap_ctl_run(c, err);
	}
	cap_ctl_free(c);
	cap_rpc_server_free(s);
	return r;
}

/* --- the client side ---------------------------------------------------------------------- */

static enum cap_ctl_code code_from(int code)
{
	switch (code) {
	case CAP_RPC_CAPACITY: return CAP_CTL_ECAPACITY;
	case CAP_RPC_TOOL: return CAP_CTL_ETOOL;
	case CAP_RPC_CANCELLED: return CAP_CTL_ECANCELLED;
	default: return CAP_CTL_ESANDBOX;
	}
}

/* Everything a parsed answer points to beyond the answer itself, in one
 * allocation (freed with one free()). */
struct parsed {
	struct cap_ctl_import imp;
	struct cap_ctl_xfer_out xfer;
	/* then: the import's conflicts and refused, the transfer's refused
	 * (const char *), then the entries */
};

static size_t list_count(json_t *a)
{
	return json_is_array(a) ? json_array_size(a) : 0;
}

/* Point v[0..n) at the strings of a ("" for what is not one). */
static void list_fill(json_t *a, const char **v, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		const char *s = json_string_value(json_array_get(a, i));
		v[i] = s ? s : "";
	}
}

static void counts_from(json_t *o, struct cap_ctl_xfer_out *x)
{
	x->files = (uint64_t)json_integer_value(json_object_get(o, "files"));
	x->dirs = (uint64_t)json_integer_value(json_object_get(o, "dirs"));
	x->links = (uint64_t)json_integer_value(json_object_get(o, "links"));
	x->bytes = (uint64_t)json_integer_value(json_object_get(o, "bytes"));
	x->durable = json_is_true(json_object_get(o, "durable"));
	x->sync_ms = (uint32_t)json_integer_value(json_object_get(o, "sync_ms"));
}

static uint16_t sync_ms_of(json_t *res)
{
	json_int_t v = json_integer_value(json_object_get(res, "sync_ms"));
	return (uint16_t)(v < 0 ? 0 : v > 65535 ? 65535 : v);
}

void cap_rpc_result_parse(json_t *answer, enum cap_ctl_kind kind, struct cap_ctl_result *out,
			  void **owned)
{
	json_t *error = json_object_get(answer, "error");
	json_t *res = json_object_get(answer, "result");
	json_t *data = json_object_get(error, "data");
	json_t *where = error ? data : res;	/* what carries import and counts */
	json_t *imp = json_object_get(where, "import");
	json_t *ic = json_object_get(imp, "conflicts"), *ir = json_object_get(imp, "refused");
	json_t *xr = json_object_get(where, "refused");
	json_t *entries = json_object_get(res, "entries");
	bool is_dir = !error && kind == CAP_CTL_FILE && json_is_object(res) &&
		      json_string_value(json_object_get(res, "kind")) &&
		      strcmp(json_string_value(json_object_get(res, "kind")), "directory") == 0;
	size_t nic = list_count(ic), nir = list_count(ir), nxr = list_count(xr);
	size_t ne = is_dir ? list_count(entries) : 0;
	memset(out, 0, sizeof(*out));
	struct parsed *p = xcalloc(1, sizeof(*p) + (nic + nir + nxr) * sizeof(char *) +
					  (ne + 1) * sizeof(struct cap_ctl_entry));
	const char **lists = (const char **)(p + 1);
	struct cap_ctl_entry *v = (struct cap_ctl_entry *)(lists + nic + nir + nxr);
	*owned = p;
	out->kind = kind;
	if (json_is_object(imp)) {
		list_fill(ic, lists, nic);
		list_fill(ir, lists + nic, nir);
		counts_from(imp, &p->imp.out);
		p->imp.out.conflicts = lists;
		p->imp.out.nconflicts = nic;
		p->imp.out.refused = lists + nic;
		p->imp.out.nrefused = nir;
		p->imp.from = json_string_value(json_object_get(imp, "from"));
		p->imp.msg = json_string_value(json_object_get(imp, "error"));
		p->imp.r = p->imp.msg ? -EIO : 0;
		out->import = &p->imp;
	}
	if (kind == CAP_CTL_XFER) {
		list_fill(xr, lists + nic + nir, nxr);
		counts_from(where, &p->xfer);
		p->xfer.refused = lists + nic + nir;
		p->xfer.nrefused = nxr;
		out->xfer = &p->xfer;
	}
	if (error || !json_is_object(res)) {
		const char *msg = json_string_value(json_object_get(error, "message"));
		out->code = code_from((int)json_integer_value(json_object_get(error, "code")));
		out->msg = msg ? msg : "the controller sent an answer without a result";
		out->errnum = (int)json_integer_value(json_object_get(data, "errno"));
		return;
	}
	out->sandbox = json_string_value(json_object_get(res, "sandbox"));
	out->state = json_string_value(json_object_get(res, "state"));
	json_t *prepared = json_object_get(res, "prepared"), *ph;
	size_t k;
	if (json_is_array(prepared))	/* a tool call that prepared first: its phases */
		json_array_foreach(prepared, k, ph)
			for (unsigned p = 0; p < CAP_PREP_NPHASES; p++)
				if (json_is_string(ph) && strcmp(json_string_value(ph), cap_prep_phase_name((enum cap_prep_phase)p)) == 0)
					out->prepared |= 1u << p;
	if (kind == CAP_CTL_EXEC) {
		json_t *ec = json_object_get(res, "exit_code");
		out->exit.kind = json_is_integer(ec) ? CAP_EXIT_CODE : CAP_EXIT_SIGNAL;
		out->exit.value = (int32_t)(json_is_integer(ec) ? json_integer_value(ec)
							       : json_integer_value(json_object_get(res, "signal")));
		out->exit.flags = (json_is_true(json_object_get(res, "timed_out")) ? CAP_EXIT_TIMED_OUT : 0) |
				  (json_is_true(json_object_get(res, "truncated")) ? CAP_EXIT_TRUNCATED : 0) |
				  (json_is_true(json_object_get(res, "durable")) ? CAP_EXIT_DURABLE : 0);
		out->exit.sync_ms = sync_ms_of(res);
		out->exit.duration_ms = (uint32_t)json_integer_value(json_object_get(res, "duration_ms"));
		out->note = json_string_value(json_object_get(res, "note"));
		out->out = (const uint8_t *)json_string_value(json_object_get(res, "stdout"));
		out->out_len = json_string_length(json_object_get(res, "stdout"));
		out->err = (const uint8_t *)json_string_value(json_object_get(res, "stderr"));
		out->err_len = json_string_length(json_object_get(res, "stderr"));
		if (!out->out)
			out->out = (const uint8_t *)"";
		if (!out->err)
			out->err = (const uint8_t *)"";
		return;
	}
	if (kind != CAP_CTL_FILE)
		return;
	out->written = (uint64_t)json_integer_value(json_object_get(res, "bytes"));
	if (json_is_true(json_object_get(res, "durable")))	/* write_file */
		out->exit.flags |= CAP_EXIT_DURABLE;
	out->exit.sync_ms = sync_ms_of(res);
	if (is_dir) {
		for (size_t e = 0; e < ne; e++) {
			json_t *o = json_array_get(entries, e);
			const char *t = json_string_value(json_object_get(o, "type"));
			const char *name = json_string_value(json_object_get(o, "name"));
			v[e].type = !t ? 'o' : strcmp(t, "directory") == 0 ? 'd' : strcmp(t, "file") == 0 ? 'f' :
				    strcmp(t, "symlink") == 0 ? 'l' : 'o';
			v[e].name = name ? name : "";
			v[e].size = (uint64_t)json_integer_value(json_object_get(o, "size"));
		}
		out->is_dir = true;
		out->entries = v;
		out->nentries = ne;
		out->entries_truncated = json_is_true(json_object_get(res, "truncated"));
	} else {
		json_t *content = json_object_get(res, "content");
		out->content = (const uint8_t *)(json_string_value(content) ? json_string_value(content) : "");
		out->content_len = json_string_length(content);
	}
}

int cap_rpc_call_notify(const char *socket_path, const char *method, json_t *params, int timeout_ms,
			cap_rpc_notify_fn notify, void *ud, json_t **result, json_t **error_data,
			struct cap_err *err)
{
	struct sockaddr_un sa = { .sun_family = AF_UNIX };
	if (strlen(socket_path) >= sizeof(sa.sun_path)) {
		json_decref(params);
		return cap_err_set(err, ENAMETOOLONG, "socket path %s is too long", socket_path);
	}
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", socket_path);
	_cleanup_close_ int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		json_decref(params);
		return cap_err_set(err, errno, "cannot connect to the controller at %s: %s", socket_path, strerror(errno));
	}
	struct cap_buf out;
	cap_buf_init(&out);
	cap_rpc_put_request(&out, 1, method, params);
	int r = 0;
	while (cap_buf_used(&out) > 0 && r == 0) {
		ssize_t n = send(fd, cap_buf_head(&out), cap_buf_used(&out), MSG_NOSIGNAL);
		if (n < 0 && errno != EINTR)
			r = cap_err_set(err, errno, "cannot write to %s: %s", socket_path, strerror(errno));
		else if (n > 0)
			cap_buf_consume(&out, (size_t)n);
	}
	cap_buf_fini(&out);
	struct cap_buf in;
	cap_buf_init(&in);
	int64_t end = cap_now_ms() + timeout_ms;
	bool answered = false;
	while (r == 0 && !answered) {
		const uint8_t *nl = cap_buf_used(&in) ? memchr(cap_buf_head(&in), '\n', cap_buf_used(&in)) : NULL;
		if (nl) {
			size_t len = (size_t)(nl - cap_buf_head(&in));
			struct cap_rpc_msg m;
			json_t *bad;
			char msg[600];
			int pr = cap_rpc_parse((const char *)cap_buf_head(&in), len, &m, &bad, msg, sizeof(msg));
			if (pr == 0 && m.method && !m.id) {
				/* A notification (progress): the wait starts again. */
				if (notify)
					notify(ud, m.method, m.params);
				end = cap_now_ms() + timeout_ms;
			} else if (pr != 0 || m.method) {
				r = cap_err_set(err, EPROTO, "the controller at %s sent a malformed answer", socket_path);
			} else if (m.error) {
				const char *em = json_string_value(json_object_get(m.error, "message"));
				r = cap_err_set(err, EIO, "%s", em ? em : "the controller refused");
				if (error_data && json_object_get(m.error, "data"))
					*error_data = json_incref(json_object_get(m.error, "data"));
				answered = true;
			} else {
				*result = json_incref(m.result);
				answered = true;
			}
			cap_rpc_msg_fini(&m);
			cap_buf_consume(&in, len + 1);
			continue;
		}
		int64_t left = end - cap_now_ms();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		if (left <= 0 || poll(&p, 1, (int)left) == 0) {
			r = cap_err_set(err, ETIMEDOUT, "the controller at %s did not answer %s in %d s", socket_path,
					method, timeout_ms / 1000);
			break;
		}
		uint8_t *w = cap_buf_reserve(&in, 65536);
		ssize_t n = read(fd, w, 65536);
		if (n == 0 || (n < 0 && errno != EINTR))
			r = cap_err_set(err, EPIPE, "the controller at %s closed the connection", socket_path);
		else if (n > 0)
			cap_buf_commit(&in, (size_t)n);
	}
	cap_buf_fini(&in);
	return r;
}

int cap_rpc_call(const char *socket_path, const char *method, json_t *params, int timeout_ms,
		 json_t **result, struct cap_err *err)
{
	return cap_rpc_call_notify(socket_path, method, params, timeout_ms, NULL, NULL, result, NULL, err);
}
