/* Checking references against their registry without pulling: `image
 * check` (the reference resolved, its platform's manifest and config
 * fetched and decoded, no layer) and `image outdated` (each pulled tag's
 * platform manifest digest now, against the one recorded at pull). The
 * registry is read through skopeo (store-pull.c's cap_store_skopeo_raw),
 * its bytes decoded by store-registry.c. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "buf.h"
#include "proc.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define OUTDATED_PARALLEL 8

void cap_image_check_fini(struct cap_image_check *c)
{
	free(c->owned_reference);
	free(c->owned_registry_media_type);
	for (size_t i = 0; i < c->n_platforms; i++)
		free(c->owned_platforms[i]);
	free(c->owned_platforms);
	cap_reg_manifest_fini(&c->manifest);
	cap_reg_config_fini(&c->config);
	memset(c, 0, sizeof(*c));
}

const char *cap_store_check_reason(int r)
{
	switch (-r) {
	case EHOSTUNREACH: return "offline";
	case ETIMEDOUT: return "timeout";
	case EACCES: return "auth";
	case ENOENT: return "not_found";
	case EMEDIUMTYPE: return "media_type";
	case ENOEXEC: return "platform";
	case EINVAL: return "bad_reference";
	case EBADMSG: case E2BIG: return "invalid";
	default: return "error";
	}
}

/* Fetch src's bytes (a manifest by digest, or a config) and check them
 * against digest when one is given. */
static int fetch(const struct cap_image_ref *pr, const char *src, bool config, const char *digest,
		 bool plain, const struct cap_check_opts *o, int64_t deadline, const char *what,
		 struct cap_buf *out, struct cap_err *err)
{
	int r = cap_store_skopeo_raw(pr, src, config, plain, o->insecure, 0, deadline, what, out, err);
	if (r == 0 && digest && !cap_store_bytes_match(out, digest))
		r = cap_err_set(err, EBADMSG, "%s: the registry sent bytes for %s that do not match the digest %s: check the registry (a mirror or proxy serving other content)",
				what, config ? "the config" : "the manifest", digest);
	return r;
}

/* Decode a manifest; its faults prefixed by what. */
static int decode(const struct cap_buf *b, const char *what, const char *whose,
		  struct cap_reg_manifest *m, struct cap_err *err)
{
	int r = cap_reg_manifest_parse(cap_buf_head(b), cap_buf_used(b), m, err);
	if (r < 0)
		cap_err_prefix(err, "%s: %s", what, whose);
	return r;
}

int cap_store_image_check(const char *ref, const struct cap_check_opts *o,
			  struct cap_image_check *out, struct cap_err *err)
{
	struct cap_image_ref pr = { 0 };
	struct cap_image_check c = { 0 };
	struct cap_buf raw;
	int r = cap_store_ref_parse(ref, &pr, err);
	if (r < 0)
		return r;
	char os[32] = "linux", arch[32] = "amd64", variant[32] = "";
	if (o->platform) {
		char extra;
		int k = sscanf(o->platform, "%31[a-z0-9_]/%31[a-z0-9_]/%31[a-z0-9_]%c", os, arch, variant, &extra);
		if (k < 2 || k > 3 ||
		    strlen(o->platform) != strlen(os) + strlen(arch) + 1 + (k == 3 ? strlen(variant) + 1 : 0)) {
			cap_image_ref_fini(&pr);
			return cap_err_set(err, EINVAL, "platform '%s' is not OS/ARCH[/VARIANT], like linux/amd64 or linux/arm64/v8",
					   o->platform);
		}
	}
	int64_t deadline = o->deadline_ms ? o->deadline_ms
					  : cap_monotonic_ms() + 1000 * (int64_t)(o->timeout_s ? o->timeout_s : CAP_CHECK_TIMEOUT_S);
	bool plain = o->insecure || cap_store_ref_loopback(pr.owned_host);
	_cleanup_free_ char *what = xasprintf("cannot check %s", pr.owned_full);
	/* skopeo takes a tag or a digest, not both: the digest then. */
	_cleanup_free_ char *src = pr.owned_digest ? xasprintf("docker://%s@%s", pr.owned_repo, pr.owned_digest)
						   : xasprintf("docker://%s", pr.owned_full);
	_cleanup_free_ char *rd = NULL, *csrc = NULL;
	c.owned_reference = xstrdup(pr.owned_full);
	snprintf(c.platform, sizeof(c.platform), "%s/%s%s%s", os, arch, *variant ? "/" : "", variant);
	cap_buf_init(&raw);

	if ((r = fetch(&pr, src, false, pr.owned_digest, plain, o, deadline, what, &raw, err)) < 0)
		goto out;
	rd = cap_store_bytes_digest(&raw);
	snprintf(c.registry_digest, sizeof(c.registry_digest), "%s", rd);
	struct cap_reg_manifest top;
	if ((r = decode(&raw, what, "what the registry serves for it", &top, err)) < 0)
		goto out;
	c.owned_registry_media_type = xstrdup(top.owned_media_type);
	if (top.index) {
		size_t which;
		c.index = true;
		c.n_platforms = top.n_entries;
		c.owned_platforms = top.n_entries ? xcalloc(top.n_entries, sizeof(char *)) : NULL;
		for (size_t i = 0; i < top.n_entries; i++) {
			const struct cap_reg_entry *e = &top.owned_entries[i];
			c.owned_platforms[i] = xasprintf("%s/%s%s%s", e->owned_os ? e->owned_os : "?",
							 e->owned_arch ? e->owned_arch : "?", e->owned_variant ? "/" : "",
							 e->owned_variant ? e->owned_variant : "");
		}
		r = cap_reg_index_pick(&top, os, arch, variant, &which, err);
		if (r == 0)
			snprintf(c.platform_digest, sizeof(c.platform_digest), "%s", top.owned_entries[which].digest);
		cap_reg_manifest_fini(&top);
		if (r < 0) {
			cap_err_prefix(err, "%s", what);
			goto out;
		}
		_cleanup_free_ char *psrc = xasprintf("docker://%s@%s", pr.owned_repo, c.platform_digest);
		cap_buf_fini(&raw);
		cap_buf_init(&raw);
		if ((r = fetch(&pr, psrc, false, c.platform_digest, plain, o, deadline, what, &raw, err)) < 0 ||
		    (r = decode(&raw, what, "the platform's manifest", &c.manifest, err)) < 0)
			goto out;
		if (c.manifest.index) {
			r = cap_err_set(err, EMEDIUMTYPE, "%s: the index names another index (%s) for %s; capsule takes an index of image manifests",
					what, c.manifest.owned_media_type, c.platform);
			goto out;
		}
	} else {
		c.manifest = top;
		snprintf(c.platform_digest, sizeof(c.platform_digest), "%s", c.registry_digest);
	}
	if ((r = cap_reg_manifest_media_ok(&c.manifest, err)) < 0) {
		cap_err_prefix(err, "%s", what);
		goto out;
	}

	/* The config, by the platform manifest's digest: what was checked. */
	csrc = xasprintf("docker://%s@%s", pr.owned_repo, c.platform_digest);
	snprintf(c.config_digest, sizeof(c.config_digest), "%s", c.manifest.config_digest);
	cap_buf_fini(&raw);
	cap_buf_init(&raw);
	if ((r = fetch(&pr, csrc, true, c.config_digest, plain, o, deadline, what, &raw, err)) < 0)
		goto out;
	if ((r = cap_reg_config_parse(cap_buf_head(&raw), cap_buf_used(&raw), &c.config, err)) < 0) {
		cap_err_prefix(err, "%s", what);
		goto out;
	}
	if (strcmp(c.config.owned_os, os) != 0 || strcmp(c.config.owned_arch, arch) != 0) {
		r = cap_err_set(err, ENOEXEC, "%s: its config is for %s/%s, not %s: it would not run here; pick another tag",
				what, c.config.owned_os, c.config.owned_arch, c.platform);
		goto out;
	}
	if (c.config.n_diff_ids != c.manifest.n_layers) {
		r = cap_err_set(err, EBADMSG, "%s: its config lists %zu layers (rootfs.diff_ids) and its manifest %zu: the image is malformed",
				what, c.config.n_diff_ids, c.manifest.n_layers);
		goto out;
	}
out:
	cap_buf_fini(&raw);
	cap_image_ref_fini(&pr);
	if (r < 0)
		cap_image_check_fini(&c);
	else
		*out = c;
	return r;
}

/* --- outdated ------------------------------------------------------------------------ */

void cap_outdated_fini(struct cap_outdated *o)
{
	free(o->owned_name);
	free(o->owned_reference);
	free(o->owned_recorded);
	free(o->owned_current);
	free(o->owned_message);
	free(o->owned_platform);
	memset(o, 0, sizeof(*o));
}

struct job {
	struct cap_outdated *o;
	struct cap_check_opts opts;	/* with the platform pulled for */
	pthread_t thread;
	bool started;
};

static void *compare(void *arg)
{
	struct job *j = arg;
	struct cap_outdated *o = j->o;
	struct cap_image_check c;
	struct cap_err err = { 0 };
	if (!o->owned_recorded) {
		o->state = CAP_OUTDATED_UNKNOWN;
		o->reason = "not_recorded";
		o->owned_message = xstrdup("pulled before digests were recorded: pull it again to record one");
		return NULL;
	}
	int r = cap_store_image_check(o->owned_reference, &j->opts, &c, &err);
	if (r < 0) {
		o->state = CAP_OUTDATED_UNKNOWN;
		o->reason = cap_store_check_reason(r);
		o->owned_message = xstrdup(err.msg);
		return NULL;
	}
	o->owned_current = xstrdup(c.platform_digest);
	o->state = strcmp(o->owned_recorded, c.platform_digest) == 0 ? CAP_OUTDATED_UP_TO_DATE : CAP_OUTDATED_OUTDATED;
	cap_image_check_fini(&c);
	return NULL;
}

/* The current tags of img, appended to *v. */
static void tags_of(const struct cap_image *img, struct cap_outdated **v, size_t *n)
{
	for (size_t i = 0; i < img->n_origins; i++) {
		const struct cap_image_origin *g = &img->owned_origins[i];
		if (!g->current || strchr(g->owned_reference, '@'))
			continue;
		*v = xrealloc(*v, (*n + 1) * sizeof(**v));
		struct cap_outdated *o = &(*v)[(*n)++];
		*o = (struct cap_outdated){
			.owned_name = img->owned_name ? xstrdup(img->owned_name) : NULL,
			.owned_reference = xstrdup(g->owned_reference),
			.owned_recorded = g->owned_platform_digest ? xstrdup(g->owned_platform_digest) : NULL,
			.owned_platform = g->owned_platform ? xstrdup(g->owned_platform) : NULL,
		};
		snprintf(o->image, sizeof(o->image), "%s", img->digest);
	}
}

int cap_store_image_outdated(const char *image, const struct cap_check_opts *o,
			     struct cap_outdated **out, size_t *n, struct cap_err *err)
{
	struct cap_outdated *v = NULL;
	size_t k = 0;
	if (image) {
		struct cap_image img;
		int r = cap_store_image_find(image, &img, err);
		if (r < 0)
			return r;
		tags_of(&img, &v, &k);
		cap_image_fini(&img);
	} else {
		struct cap_image *all;
		size_t na;
		int r = cap_store_image_list(&all, &na, err);
		if (r < 0)
			return r;
		for (size_t i = 0; i < na; i++) {
			tags_of(&all[i], &v, &k);
			cap_image_fini(&all[i]);
		}
		free(all);
	}
	/* Side by side, OUTDATED_PARALLEL at a time, all by one deadline. */
	struct cap_check_opts co = *o;
	co.deadline_ms = cap_monotonic_ms() + 1000 * (int64_t)(o->timeout_s ? o->timeout_s : CAP_CHECK_TIMEOUT_S);
	struct job *jobs = k ? xcalloc(k, sizeof(*jobs)) : NULL;
	for (size_t start = 0; start < k; start += OUTDATED_PARALLEL) {
		size_t end = CAP_MIN(k, start + OUTDATED_PARALLEL);
		for (size_t i = start; i < end; i++) {
			jobs[i] = (struct job){ .o = &v[i], .opts = co };
			jobs[i].opts.platform = v[i].owned_platform;
			if (cap_monotonic_ms() >= co.deadline_ms) {
				v[i].state = CAP_OUTDATED_UNKNOWN;
				v[i].reason = "timeout";
				v[i].owned_message = xstrdup("not asked: the timeout was reached checking the others");
				continue;
			}
			jobs[i].started = pthread_create(&jobs[i].thread, NULL, compare, &jobs[i]) == 0;
			if (!jobs[i].started)
				compare(&jobs[i]);
		}
		for (size_t i = start; i < end; i++)
			if (jobs[i].started)
				pthread_join(jobs[i].thread, NULL);
	}
	free(jobs);
	*out = v;
	*n = k;
	return 0;
}
