/* The registry's documents, decoded from their bytes: an image manifest
 * or an index (OCI, or Docker v2 schema 2 and its manifest list) and an
 * image config. Pure: bytes in, a checked struct or a refusal out. The
 * bytes come from a registry (untrusted); tests/fuzz/fuzz-registry.c
 * holds them to their contract. */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "store.h"
#include "util.h"

#define MT_OCI_MANIFEST "application/vnd.oci.image.manifest.v1+json"
#define MT_OCI_INDEX "application/vnd.oci.image.index.v1+json"
#define MT_DOCKER_MANIFEST "application/vnd.docker.distribution.manifest.v2+json"
#define MT_DOCKER_LIST "application/vnd.docker.distribution.manifest.list.v2+json"
#define MT_OCI_CONFIG "application/vnd.oci.image.config.v1+json"
#define MT_DOCKER_CONFIG "application/vnd.docker.container.image.v1+json"

/* JSON sizes are integers of at most 2^53 (what a JSON reader in any
 * language keeps exactly). */
#define SIZE_MAX_JSON ((json_int_t)1 << 53)

static bool digest_ok(const char *s)
{
	return s && strncmp(s, "sha256:", 7) == 0 && strlen(s) == 71 &&
	       strspn(s + 7, "0123456789abcdef") == 64;
}

static const char *const layer_types[] = {
	"application/vnd.oci.image.layer.v1.tar",
	"application/vnd.oci.image.layer.v1.tar+gzip",
	"application/vnd.oci.image.layer.v1.tar+zstd",
	"application/vnd.oci.image.layer.nondistributable.v1.tar",
	"application/vnd.oci.image.layer.nondistributable.v1.tar+gzip",
	"application/vnd.oci.image.layer.nondistributable.v1.tar+zstd",
	"application/vnd.docker.image.rootfs.diff.tar.gzip",
	"application/vnd.docker.image.rootfs.foreign.diff.tar.gzip",
};

static bool one_of(const char *s, const char *const *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(s, v[i]) == 0)
			return true;
	return false;
}

/* A descriptor {mediaType, digest, size}: its fields checked. what names
 * it in a refusal ("layer 3"). */
static int descriptor(json_t *d, const char *what, const char **mt, const char **digest,
		      uint64_t *size, struct cap_err *err)
{
	json_t *sz = json_object_get(d, "size");
	*mt = json_string_value(json_object_get(d, "mediaType"));
	*digest = json_string_value(json_object_get(d, "digest"));
	if (!json_is_object(d))
		return cap_err_set(err, EBADMSG, "%s is not an object", what);
	if (!*mt || strlen(*mt) > 255)
		return cap_err_set(err, EBADMSG, "%s has no mediaType (a string of at most 255 bytes)", what);
	if (!digest_ok(*digest))
		return cap_err_set(err, EBADMSG, "%s's digest %.80s is not sha256: and 64 lowercase hex digits", what,
				   *digest ? *digest : "(none)");
	if (!json_is_integer(sz) || json_integer_value(sz) < 0 || json_integer_value(sz) > SIZE_MAX_JSON)
		return cap_err_set(err, EBADMSG, "%s's size is not an integer from 0 to 2^53", what);
	*size = (uint64_t)json_integer_value(sz);
	return 0;
}

void cap_reg_manifest_fini(struct cap_reg_manifest *m)
{
	free(m->owned_media_type);
	free(m->owned_config_media_type);
	for (size_t i = 0; i < m->n_layers; i++)
		free(m->owned_layers[i].owned_media_type);
	free(m->owned_layers);
	for (size_t i = 0; i < m->n_entries; i++) {
		struct cap_reg_entry *e = &m->owned_entries[i];
		free(e->owned_media_type);
		free(e->owned_os);
		free(e->owned_arch);
		free(e->owned_variant);
	}
	free(m->owned_entries);
	memset(m, 0, sizeof(*m));
}

/* The media type a document without one is (OCI makes the field
 * optional): an index holds "manifests", a manifest "config". */
static const char *guess_type(json_t *j)
{
	json_t *sv = json_object_get(j, "schemaVersion");
	if (json_is_integer(sv) && json_integer_value(sv) == 1)
		return "application/vnd.docker.distribution.manifest.v1+json";
	if (json_object_get(j, "manifests"))
		return MT_OCI_INDEX;
	if (json_object_get(j, "config"))
		return MT_OCI_MANIFEST;
	return NULL;
}

static int parse_index(json_t *j, struct cap_reg_manifest *m, struct cap_err *err)
{
	json_t *v = json_object_get(j, "manifests");
	if (!json_is_array(v))
		return cap_err_set(err, EBADMSG, "the index (%s) has no \"manifests\" array", m->owned_media_type);
	size_t n = json_array_size(v);
	if (n > CAP_REG_ENTRIES_MAX)
		return cap_err_set(err, E2BIG, "the index lists %zu manifests, over the %d a check reads", n,
				   CAP_REG_ENTRIES_MAX);
	m->owned_entries = n ? xcalloc(n, sizeof(*m->owned_entries)) : NULL;
	for (size_t i = 0; i < n; i++) {
		json_t *d = json_array_get(v, i);
		const char *mt, *dg;
		uint64_t size;
		char what[40];
		snprintf(what, sizeof(what), "index entry %zu", i + 1);
		int r = descriptor(d, what, &mt, &dg, &size, err);
		if (r < 0)
			return r;
		struct cap_reg_entry *e = &m->owned_entries[m->n_entries++];
		snprintf(e->digest, sizeof(e->digest), "%s", dg);
		e->size = size;
		e->owned_media_type = xstrdup(mt);
		json_t *p = json_object_get(d, "platform");
		const char *os = json_string_value(json_object_get(p, "os"));
		const char *arch = json_string_value(json_object_get(p, "architecture"));
		const char *var = json_string_value(json_object_get(p, "variant"));
		if ((os && strlen(os) > 31) || (arch && strlen(arch) > 31) || (var && strlen(var) > 31))
			return cap_err_set(err, EBADMSG, "%s's platform has a part over 31 bytes", what);
		e->owned_os = os ? xstrdup(os) : NULL;
		e->owned_arch = arch ? xstrdup(arch) : NULL;
		e->owned_variant = var ? xstrdup(var) : NULL;
	}
	return 0;
}

static int parse_image(json_t *j, struct cap_reg_manifest *m, struct cap_err *err)
{
	const char *mt, *dg;
	uint64_t size;
	int r = descriptor(json_object_get(j, "config"), "the manifest's config", &mt, &dg, &size, err);
	if (r < 0)
		return r;
	snprintf(m->config_digest, sizeof(m->config_digest), "%s", dg);
	m->config_size = size;
	m->owned_config_media_type = xstrdup(mt);
	json_t *v = json_object_get(j, "layers");
	if (!json_is_array(v))
		return cap_err_set(err, EBADMSG, "the manifest has no \"layers\" array");
	size_t n = json_array_size(v);
	if (n > CAP_REG_LAYERS_MAX)
		return cap_err_set(err, E2BIG, "the manifest lists %zu layers, over the %d an image may have here", n,
				   CAP_REG_LAYERS_MAX);
	m->owned_layers = n ? xcalloc(n, sizeof(*m->owned_layers)) : NULL;
	for (size_t i = 0; i < n; i++) {
		char what[40];
		snprintf(what, sizeof(what), "layer %zu", i + 1);
		if ((r = descriptor(json_array_get(v, i), what, &mt, &dg, &size, err)) < 0)
			return r;
		struct cap_reg_layer *l = &m->owned_layers[m->n_layers++];
		snprintf(l->digest, sizeof(l->digest), "%s", dg);
		l->size = size;
		l->owned_media_type = xstrdup(mt);
		m->layers_size += size;	/* at most 1000 * 2^53: no overflow */
	}
	return 0;
}

int cap_reg_manifest_parse(const void *data, size_t len, struct cap_reg_manifest *out,
			   struct cap_err *err)
{
	struct cap_reg_manifest m = { 0 };
	json_error_t je;
	if (len > CAP_REG_DOC_MAX)
		return cap_err_set(err, E2BIG, "the manifest is %zu bytes, over the %d a check reads", len,
				   CAP_REG_DOC_MAX);
	json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(j)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "the manifest is not a JSON object%s%s", j ? "" : ": ",
				   j ? "" : je.text);
	}
	int r;
	const char *mt = json_string_value(json_object_get(j, "mediaType"));
	if (json_object_get(j, "mediaType") && (!mt || strlen(mt) > 255)) {
		r = cap_err_set(err, EBADMSG, "the manifest's mediaType is not a string of at most 255 bytes");
		goto out;
	}
	if (!mt)
		mt = guess_type(j);
	if (!mt) {
		r = cap_err_set(err, EBADMSG, "the document is neither an image manifest nor an index (no mediaType, config or manifests)");
		goto out;
	}
	m.owned_media_type = xstrdup(mt);
	bool index = strcmp(mt, MT_OCI_INDEX) == 0 || strcmp(mt, MT_DOCKER_LIST) == 0;
	if (!index && strcmp(mt, MT_OCI_MANIFEST) != 0 && strcmp(mt, MT_DOCKER_MANIFEST) != 0) {
		r = cap_err_set(err, EMEDIUMTYPE, "the manifest's media type is %s; capsule takes OCI image manifests and indexes and Docker v2 schema 2 manifests and manifest lists",
				mt);
		goto out;
	}
	json_t *sv = json_object_get(j, "schemaVersion");
	if (!json_is_integer(sv) || json_integer_value(sv) != 2) {
		r = cap_err_set(err, EBADMSG, "the %s has schemaVersion %s, not 2", index ? "index" : "manifest",
				json_is_integer(sv) ? "other than 2" : "missing");
		goto out;
	}
	m.index = index;
	r = index ? parse_index(j, &m, err) : parse_image(j, &m, err);
out:
	json_decref(j);
	if (r < 0)
		cap_reg_manifest_fini(&m);
	else
		*out = m;
	return r;
}

int cap_reg_manifest_media_ok(const struct cap_reg_manifest *m, struct cap_err *err)
{
	if (m->index)
		return 0;
	static const char *const config_types[] = { MT_OCI_CONFIG, MT_DOCKER_CONFIG };
	if (!one_of(m->owned_config_media_type, config_types, CAP_ARRAY_SIZE(config_types)))
		return cap_err_set(err, EMEDIUMTYPE, "its config's media type is %.255s, not an image config (%s or %s): an artifact, not a container image",
				   m->owned_config_media_type, MT_OCI_CONFIG, MT_DOCKER_CONFIG);
	for (size_t i = 0; i < m->n_layers; i++)
		if (!one_of(m->owned_layers[i].owned_media_type, layer_types, CAP_ARRAY_SIZE(layer_types)))
			return cap_err_set(err, EMEDIUMTYPE, "layer %zu's media type is %.255s, not a tar layer (OCI tar, tar+gzip, tar+zstd, or Docker's tar.gzip)",
					   i + 1, m->owned_layers[i].owned_media_type);
	return 0;
}

/* "os/arch[/variant]" of an entry, into buf. */
static void platform_of(const struct cap_reg_entry *e, char *buf, size_t n)
{
	snprintf(buf, n, "%s/%s%s%s", e->owned_os ? e->owned_os : "?", e->owned_arch ? e->owned_arch : "?",
		 e->owned_variant ? "/" : "", e->owned_variant ? e->owned_variant : "");
}

int cap_reg_index_pick(const struct cap_reg_manifest *m, const char *os, const char *arch,
		       const char *variant, size_t *which, struct cap_err *err)
{
	for (size_t i = 0; i < m->n_entries; i++) {
		const struct cap_reg_entry *e = &m->owned_entries[i];
		bool manifest = strcmp(e->owned_media_type, MT_OCI_MANIFEST) == 0 ||
				strcmp(e->owned_media_type, MT_DOCKER_MANIFEST) == 0;
		if (!manifest || !e->owned_os || !e->owned_arch || strcmp(e->owned_os, os) != 0 ||
		    strcmp(e->owned_arch, arch) != 0)
			continue;
		if (variant && *variant && (!e->owned_variant || strcmp(e->owned_variant, variant) != 0))
			continue;
		*which = i;
		return 0;
	}
	/* Name what it offers (attestations, "unknown/unknown", left out). */
	char offered[600] = "";
	size_t used = 0, shown = 0;
	for (size_t i = 0; i < m->n_entries && used < sizeof(offered) - 1; i++) {
		char p[100];
		const struct cap_reg_entry *e = &m->owned_entries[i];
		if (e->owned_os && strcmp(e->owned_os, "unknown") == 0)
			continue;
		platform_of(e, p, sizeof(p));
		if (strstr(offered, p))
			continue;
		used += (size_t)snprintf(offered + used, sizeof(offered) - used, "%s%s", shown++ ? ", " : "", p);
	}
	if (used >= sizeof(offered))
		snprintf(offered + sizeof(offered) - 5, 5, "...");
	return cap_err_set(err, ENOEXEC, "the index has no manifest for %s/%s%s%s, the platform capsule runs; it offers %s",
			   os, arch, variant && *variant ? "/" : "", variant && *variant ? variant : "",
			   shown ? offered : "none");
}

void cap_reg_config_fini(struct cap_reg_config *c)
{
	free(c->owned_os);
	free(c->owned_arch);
	free(c->owned_variant);
	free(c->owned_workdir);
	free(c->owned_user);
	char **lists[] = { c->owned_entrypoint, c->owned_cmd, c->owned_env };
	size_t ns[] = { c->n_entrypoint, c->n_cmd, c->n_env };
	for (size_t k = 0; k < 3; k++) {
		for (size_t i = 0; i < ns[k]; i++)
			free(lists[k][i]);
		free(lists[k]);
	}
	memset(c, 0, sizeof(*c));
}

/* An array of strings, or null/absent (*v NULL, *has false). */
static int strings(json_t *a, const char *what, char ***v, size_t *n, bool *has, struct cap_err *err)
{
	*has = a && !json_is_null(a);
	if (!*has)
		return 0;
	if (!json_is_array(a))
		return cap_err_set(err, EBADMSG, "the config's %s is not an array of strings", what);
	size_t k = json_array_size(a);
	if (k > CAP_REG_STRINGS_MAX)
		return cap_err_set(err, E2BIG, "the config's %s has %zu strings, over %d", what, k, CAP_REG_STRINGS_MAX);
	*v = k ? xcalloc(k, sizeof(char *)) : NULL;
	for (size_t i = 0; i < k; i++) {
		const char *s = json_string_value(json_array_get(a, i));
		if (!s)
			return cap_err_set(err, EBADMSG, "the config's %s[%zu] is not a string", what, i);
		(*v)[(*n)++] = xstrdup(s);
	}
	return 0;
}

int cap_reg_config_parse(const void *data, size_t len, struct cap_reg_config *out,
			 struct cap_err *err)
{
	struct cap_reg_config c = { 0 };
	json_error_t je;
	if (len > CAP_REG_DOC_MAX)
		return cap_err_set(err, E2BIG, "the config is %zu bytes, over the %d a check reads", len, CAP_REG_DOC_MAX);
	json_t *j = json_loadb(data, len, JSON_REJECT_DUPLICATES, &je);
	int r = 0;
	if (!json_is_object(j)) {
		r = cap_err_set(err, EBADMSG, "the config is not a JSON object%s%s", j ? "" : ": ", j ? "" : je.text);
		goto out;
	}
	const char *os = json_string_value(json_object_get(j, "os"));
	const char *arch = json_string_value(json_object_get(j, "architecture"));
	const char *var = json_string_value(json_object_get(j, "variant"));
	if (!os || !arch || !*os || !*arch || strlen(os) > 31 || strlen(arch) > 31 || (var && strlen(var) > 31)) {
		r = cap_err_set(err, EBADMSG, "the config does not say its os and architecture (strings of 1 to 31 bytes)");
		goto out;
	}
	c.owned_os = xstrdup(os);
	c.owned_arch = xstrdup(arch);
	c.owned_variant = var ? xstrdup(var) : NULL;
	json_t *cfg = json_object_get(j, "config");
	if (cfg && !json_is_null(cfg) && !json_is_object(cfg)) {
		r = cap_err_set(err, EBADMSG, "the config's \"config\" is not an object");
		goto out;
	}
	if ((r = strings(json_object_get(cfg, "Entrypoint"), "Entrypoint", &c.owned_entrypoint, &c.n_entrypoint,
			 &c.has_entrypoint, err)) < 0 ||
	    (r = strings(json_object_get(cfg, "Cmd"), "Cmd", &c.owned_cmd, &c.n_cmd, &c.has_cmd, err)) < 0 ||
	    (r = strings(json_object_get(cfg, "Env"), "Env", &c.owned_env, &c.n_env, &c.has_env, err)) < 0)
		goto out;
	const char *wd = json_string_value(json_object_get(cfg, "WorkingDir"));
	const char *user = json_string_value(json_object_get(cfg, "User"));
	c.owned_workdir = wd && *wd ? xstrdup(wd) : NULL;
	c.owned_user = user && *user ? xstrdup(user) : NULL;
	json_t *ids = json_object_get(json_object_get(j, "rootfs"), "diff_ids");
	if (!json_is_array(ids)) {
		r = cap_err_set(err, EBADMSG, "the config has no rootfs.diff_ids array");
		goto out;
	}
	c.n_diff_ids = json_array_size(ids);
out:
	json_decref(j);
	if (r < 0)
		cap_reg_config_fini(&c);
	else
		*out = c;
	return r;
}
