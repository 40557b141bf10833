/* serve's results to JSON: a tool method's answer from the core's typed
 * result, and the shapes other front ends print too (a diff, a
 * preparation, the private import). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base64.h"
#include "controller.h"
#include "jsonrpc.h"
#include "serve-conn.h"
#include "serve.h"
#include "store.h"
#include "tree.h"
#include "utf8.h"
#include "util.h"

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

json_t *serve_strings(const char *const *v, size_t n)
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
			      "bytes", (json_int_t)o->bytes, "conflicts", serve_strings(o->conflicts, o->nconflicts),
			      "refused", serve_strings(o->refused, o->nrefused));
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
int serve_answer(struct cap_rpc_server *s, struct pending *p, const struct cap_ctl_result *r)
{
	struct conn *k = p->conn;
	if (!k || !p->id)
		return r->code == CAP_CTL_OK ? 0 : code_of(r->code);
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
		if (p->size)
			json_object_set(res, "size", p->size);
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
	} else if (r->kind == CAP_CTL_SNAPSHOT) {
		res = json_pack("{s:s, s:s}", "sandbox", r->sandbox, "snapshot", r->snapshot);
	} else if (r->kind == CAP_CTL_FORK) {
		json_t *a = json_array();
		for (size_t c = 0; c < r->nchildren; c++)
			json_array_append_new(a, json_pack("{s:{s:s, s:s}, s:s}", "identity", "agent",
							   r->children[c].agent, "peer", r->children[c].peer,
							   "sandbox", r->children[c].sandbox));
		res = json_pack("{s:s, s:s, s:o}", "sandbox", r->sandbox, "snapshot", r->snapshot, "children", a);
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
		serve_result(k, p->id, res);
		return 0;
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
		json_object_set_new(data, "refused", serve_strings(r->xfer->refused, r->xfer->nrefused));
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
	return code;
}

static json_t *size_fields(const struct cap_ctl_size *z, bool disks)
{
	json_t *j = json_object();
	const struct {
		const char *key;
		unsigned v;
	} f[] = { { "cpus", z->cpus }, { "memory_mib", z->memory_mib }, { "root_mib", z->root_mib },
		  { "work_mib", z->work_mib } };
	for (size_t i = 0; i < (disks ? 4u : 2u); i++)
		if (f[i].v)
			json_object_set_new(j, f[i].key, json_integer(f[i].v));
	return j;
}

json_t *serve_size_json(const struct cap_ctl_size_out *o)
{
	json_t *j = size_fields(&o->size, true);
	json_object_set_new(j, "override", size_fields(&o->over, true));
	json_object_set_new(j, "running", o->running.cpus ? size_fields(&o->running, false) : json_null());
	json_object_set_new(j, "pending", json_boolean(o->pending));
	if (o->pending) {
		char note[256];
		snprintf(note, sizeof(note), "the sandbox runs with %u vCPUs and %u MiB until its next start; then %u vCPUs and %u MiB (a running VM is not resized: stop it to apply them sooner)",
			 o->running.cpus, o->running.memory_mib, o->size.cpus, o->size.memory_mib);
		json_object_set_new(j, "note", json_string(note));
	}
	return j;
}

json_t *serve_status_json(const struct cap_ctl_status *st)
{
	json_t *j = json_pack("{s:s, s:s, s:s, s:i, s:i}", "agent", st->agent, "peer", st->peer,
			      "state", cap_vm_state_name(st->state), "active", (int)st->active,
			      "queued", (int)st->queued);
	json_object_set_new(j, "sandbox", st->sandbox[0] ? json_string(st->sandbox) : json_null());
	json_object_set_new(j, "idle_ms", st->idle_ms >= 0 ? json_integer(st->idle_ms) : json_null());
	json_object_set_new(j, "imported", st->imported > 0 ? json_integer(st->imported) : json_null());
	return j;
}

/* v[0..n) as a JSON array of strings, or null when has is false. */
static json_t *strings_or_null(bool has, char *const *v, size_t n)
{
	return has ? serve_strings((const char *const *)v, n) : json_null();
}

json_t *cap_rpc_image_check_json(const struct cap_image_check *c)
{
	const struct cap_reg_manifest *m = &c->manifest;
	const struct cap_reg_config *g = &c->config;
	json_t *layers = json_array();
	for (size_t i = 0; i < m->n_layers; i++)
		json_array_append_new(layers, json_pack("{s:s, s:o, s:I}", "digest", m->owned_layers[i].digest,
							"media_type", cap_json_text(m->owned_layers[i].owned_media_type),
							"size_bytes", (json_int_t)m->owned_layers[i].size));
	json_t *config = json_pack("{s:s, s:o, s:I, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:o}", "digest", c->config_digest,
				   "media_type", cap_json_text(m->owned_config_media_type),
				   "size_bytes", (json_int_t)m->config_size, "os", cap_json_text(g->owned_os),
				   "architecture", cap_json_text(g->owned_arch),
				   "variant", g->owned_variant ? cap_json_text(g->owned_variant) : json_null(),
				   "entrypoint", strings_or_null(g->has_entrypoint, g->owned_entrypoint, g->n_entrypoint),
				   "cmd", strings_or_null(g->has_cmd, g->owned_cmd, g->n_cmd),
				   "env", strings_or_null(g->has_env, g->owned_env, g->n_env),
				   "working_dir", g->owned_workdir ? cap_json_text(g->owned_workdir) : json_null(),
				   "user", g->owned_user ? cap_json_text(g->owned_user) : json_null());
	return json_pack("{s:o, s:s, s:o, s:b, s:o, s:s, s:s, s:o, s:o, s:i, s:I, s:o}", "reference",
			 cap_json_text(c->owned_reference), "registry_digest", c->registry_digest, "media_type",
			 cap_json_text(c->owned_registry_media_type), "index", c->index, "platforms",
			 c->index ? serve_strings((const char *const *)c->owned_platforms, c->n_platforms) : json_array(),
			 "platform", c->platform, "platform_digest", c->platform_digest, "manifest_media_type",
			 cap_json_text(m->owned_media_type), "config", config, "layer_count", (int)m->n_layers,
			 "compressed_bytes", (json_int_t)m->layers_size, "layers", layers);
}

json_t *cap_rpc_check_error_data(int r, const char *ref)
{
	bool retry = r == -EHOSTUNREACH || r == -ETIMEDOUT;
	return json_pack("{s:o, s:s, s:i, s:b}", "reference", cap_json_text(ref), "reason", cap_store_check_reason(r),
			 "errno", -r, "retryable", retry);
}
