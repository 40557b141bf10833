/* The image store: read-only root file systems as erofs files, named by
 * the SHA-256 of their bytes, under CAPSULE_HOME/images/<hex>/ with a
 * manifest.json beside. Names are symlinks images/names/<name> -> ../<hex>,
 * replaced atomically, so a name can move to a rebuilt image while
 * sandboxes keep the digest they were created with. References pulled
 * from registries are the same kind of link, images/refs/<ref with '/'
 * as %2F> -> ../<hex>. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define ROOTFS "rootfs.erofs"

char *cap_store_images_dir(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/images", home);
}

#define TMP_LOCK ".lock"

/* Temporary directories whose makers take the lock (cap_store_tmpdir):
 * only these are removed without a lock file, once old. Others (a
 * build's staging tree) may be long at work without one. */
static bool locking_prefix(const char *n)
{
	return strncmp(n, "tmp-pull-", 9) == 0 || strncmp(n, "tmp-import-", 11) == 0 ||
	       strncmp(n, "tmp-erofs-", 10) == 0 || strncmp(n, "tmp-stage-", 10) == 0;
}

void cap_store_tmp_sweep(const char *images)
{
	DIR *d = opendir(images);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "tmp-", 4) != 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode))
			continue;
		_cleanup_free_ char *dir = xasprintf("%s/%s", images, e->d_name);
		_cleanup_free_ char *lock = xasprintf("%s/" TMP_LOCK, dir);
		_cleanup_close_ int fd = open(lock, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		if (fd < 0) {
			/* No lock: one being made this instant, or an old one. */
			if (errno == ENOENT && locking_prefix(e->d_name) && time(NULL) - st.st_mtime > 60) {
				cap_log(CAP_LOG_INFO, "removing %s, a temporary directory left by an interrupted run", dir);
				cap_remove_tree(dir);
			}
			continue;
		}
		if (flock(fd, LOCK_EX | LOCK_NB) < 0)
			continue;	/* at work */
		cap_log(CAP_LOG_INFO, "removing %s, a temporary directory left by an interrupted run", dir);
		cap_remove_tree(dir);
	}
	if (d)
		closedir(d);
}

int cap_store_tmpdir(const char *images, const char *prefix, char **path,
		     struct cap_err *err)
{
	cap_store_tmp_sweep(images);
	char *dir = xasprintf("%s/%s-XXXXXX", images, prefix);
	if (!mkdtemp(dir)) {
		int e = errno;
		free(dir);
		return cap_err_set(err, e, "cannot create a directory in %s: %s", images, strerror(e));
	}
	_cleanup_free_ char *lock = xasprintf("%s/" TMP_LOCK, dir);
	int fd = open(lock, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0 || flock(fd, LOCK_EX) < 0) {
		int e = errno;
		if (fd >= 0)
			close(fd);
		cap_remove_tree(dir);
		free(dir);
		return cap_err_set(err, e, "cannot lock %s: %s", lock, strerror(e));
	}
	*path = dir;
	return fd;
}

void cap_image_fini(struct cap_image *img)
{
	free(img->owned_name);
	free(img->owned_path);
	free(img->owned_source);
	free(img->owned_reference);
	free(img->owned_oci_digest);
	free(img->owned_pinned_digest);
	free(img->owned_registry_digest);
	for (size_t i = 0; i < img->n_origins; i++) {
		struct cap_image_origin *o = &img->owned_origins[i];
		free(o->owned_reference);
		free(o->owned_oci_digest);
		free(o->owned_registry_digest);
		free(o->owned_pinned_digest);
		free(o->owned_platform_digest);
		free(o->owned_platform);
	}
	free(img->owned_origins);
	memset(img, 0, sizeof(*img));
}

bool cap_store_image_name_valid(const char *name)
{
	size_t n = strlen(name);
	if (n == 0 || n > 64 || !(islower((unsigned char)name[0]) || isdigit((unsigned char)name[0])))
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!(islower((unsigned char)c) || isdigit((unsigned char)c) || c == '.' || c == '_' || c == '-'))
			return false;
	}
	return true;
}

static bool is_hex64(const char *s)
{
	if (strlen(s) != 64)
		return false;
	for (int i = 0; i < 64; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return false;
	return true;
}

/* A reference as a file name in images/refs: '%' and '/' escaped. */
static char *ref_file(const char *images, const char *ref)
{
	_cleanup_free_ char *enc = xmalloc(3 * strlen(ref) + 1);
	char *w = enc;
	for (const char *c = ref; *c; c++) {
		if (*c == '/' || *c == '%')
			w += sprintf(w, "%%%02X", (unsigned char)*c);
		else
			*w++ = *c;
	}
	*w = '\0';
	return xasprintf("%s/refs/%s", images, enc);
}

static char *ref_unfile(const char *file)
{
	char *r = xstrdup(file), *w = r;
	for (const char *c = file; *c; c++) {
		unsigned x;
		if (c[0] == '%' && sscanf(c + 1, "%2X", &x) == 1 && isxdigit((unsigned char)c[1]) && isxdigit((unsigned char)c[2])) {
			*w++ = (char)x;
			c += 2;
		} else {
			*w++ = *c;
		}
	}
	*w = '\0';
	return r;
}

/* The hex digest a link (a name or a reference) points at, or false. */
bool cap_store_link_hex(const char *link, char hex[65])
{
	char target[512];
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return false;
	target[n] = '\0';
	const char *h = strrchr(target, '/');
	h = h ? h + 1 : target;
	if (!is_hex64(h))
		return false;
	memcpy(hex, h, 65);
	return true;
}

/* The name pointing at hex, if any (first found). New string or NULL. */
static char *name_of(const char *images, const char *hex)
{
	_cleanup_free_ char *names = xasprintf("%s/names", images);
	DIR *d = opendir(names);
	char *found = NULL;
	struct dirent *e;
	while (d && !found && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *link = xasprintf("%s/%s", names, e->d_name);
		char h[65];
		if (cap_store_link_hex(link, h) && strcmp(h, hex) == 0)
			found = xstrdup(e->d_name);
	}
	if (d)
		closedir(d);
	return found;
}

/* A reference in images/refs pointing at hex, one with a tag rather than
 * a digest when there is one. New string or NULL. */
static char *ref_of(const char *images, const char *hex)
{
	_cleanup_free_ char *refs = xasprintf("%s/refs", images);
	DIR *d = opendir(refs);
	char *found = NULL;
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *link = xasprintf("%s/%s", refs, e->d_name);
		char h[65];
		if (!cap_store_link_hex(link, h) || strcmp(h, hex) != 0)
			continue;
		char *ref = ref_unfile(e->d_name);
		if (!found || (strchr(found, '@') && !strchr(ref, '@'))) {
			free(found);
			found = ref;
		} else {
			free(ref);
		}
	}
	if (d)
		closedir(d);
	return found;
}

static char *json_dup(json_t *m, const char *key)
{
	const char *v = json_string_value(json_object_get(m, key));
	return v ? xstrdup(v) : NULL;
}

/* The origins of a manifest: its "origins" array, or for a manifest
 * written before there were several, its top-level fields as one. A new
 * reference to a JSON array. */
static json_t *origins_of(json_t *m)
{
	json_t *v = json_object_get(m, "origins");
	if (json_is_array(v))
		return json_incref(v);
	v = json_array();
	if (json_string_value(json_object_get(m, "reference"))) {
		json_t *o = json_object();
		const char *keys[] = { "reference", "oci_digest", "registry_digest", "pinned_digest" };
		for (size_t i = 0; i < CAP_ARRAY_SIZE(keys); i++)
			if (json_string_value(json_object_get(m, keys[i])))
				json_object_set(o, keys[i], json_object_get(m, keys[i]));
		json_object_set(o, "pulled", json_object_get(m, "created"));
		json_array_append_new(v, o);
	}
	return v;
}

/* Which origin a lookup meant: the one pulled as reference, or one
 * pulled from repo whose registry, OCI or pinned digest starts with
 * digest; all NULL: none in particular. */
struct pick {
	const char *reference;
	const char *repo;
	const char *digest;
};

static bool origin_has_digest(json_t *o, const char *repo, const char *digest)
{
	const char *ref = json_string_value(json_object_get(o, "reference"));
	struct cap_image_ref pr;
	if (!ref || cap_store_ref_parse(ref, &pr, NULL) < 0)
		return false;
	bool same = strcmp(pr.owned_repo, repo) == 0;
	cap_image_ref_fini(&pr);
	if (!same)
		return false;
	size_t dl = strlen(digest);
	const char *keys[] = { "registry_digest", "oci_digest", "pinned_digest", "platform_digest" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(keys); i++) {
		const char *d = json_string_value(json_object_get(o, keys[i]));
		if (d && strncmp(d, digest, dl) == 0)
			return true;
	}
	return false;
}

/* Is origin i the better choice than the best so far (-1: none)? */
static bool better(const struct cap_image_origin *v, int best, size_t i)
{
	if (best < 0)
		return true;
	const struct cap_image_origin *a = &v[i], *b = &v[best];
	if (a->current != b->current)
		return a->current;
	bool at = !strchr(a->owned_reference, '@'), bt = !strchr(b->owned_reference, '@');
	if (at != bt)
		return at;
	return a->pulled >= b->pulled;
}

static int load(const char *images, const char *hex, const struct pick *pick,
		struct cap_image *out, struct cap_err *err)
{
	_cleanup_free_ char *dir = xasprintf("%s/%s", images, hex);
	_cleanup_free_ char *mpath = xasprintf("%s/manifest.json", dir);
	json_error_t je;
	json_t *m = json_load_file(mpath, 0, &je);
	if (!m)
		return cap_err_set(err, EBADMSG, "image manifest %s is missing or unreadable (%s); remove the image with `capsule image rm sha256:%s`",
				   mpath, je.text, hex);
	const char *source = json_string_value(json_object_get(m, "source"));
	*out = (struct cap_image){
		.owned_path = xasprintf("%s/" ROOTFS, dir),
		.owned_name = name_of(images, hex),
		.owned_source = xstrdup(source ? source : "unknown"),
		.created = json_integer_value(json_object_get(m, "created")),
	};
	snprintf(out->digest, sizeof(out->digest), "sha256:%s", hex);
	json_t *origins = origins_of(m);
	size_t n = json_array_size(origins), k = 0;
	out->owned_origins = n ? xcalloc(n, sizeof(*out->owned_origins)) : NULL;
	int best = -1, picked = -1;
	for (size_t i = 0; i < n; i++) {
		json_t *o = json_array_get(origins, i);
		const char *ref = json_string_value(json_object_get(o, "reference"));
		if (!ref)
			continue;
		struct cap_image_origin *g = &out->owned_origins[k];
		_cleanup_free_ char *link = ref_file(images, ref);
		char h[65];
		*g = (struct cap_image_origin){
			.owned_reference = xstrdup(ref),
			.owned_oci_digest = json_dup(o, "oci_digest"),
			.owned_registry_digest = json_dup(o, "registry_digest"),
			.owned_pinned_digest = json_dup(o, "pinned_digest"),
			.owned_platform_digest = json_dup(o, "platform_digest"),
			.owned_platform = json_dup(o, "platform"),
			.pulled = json_integer_value(json_object_get(o, "pulled")),
			.current = cap_store_link_hex(link, h) && strcmp(h, hex) == 0,
		};
		bool wanted = pick && ((pick->reference && strcmp(ref, pick->reference) == 0) ||
				       (pick->digest && origin_has_digest(o, pick->repo, pick->digest)));
		if (wanted && better(out->owned_origins, picked, k))
			picked = (int)k;
		if (better(out->owned_origins, best, k))
			best = (int)k;
		k++;
	}
	out->n_origins = k;
	json_decref(origins);
	json_decref(m);
	if (picked >= 0)
		best = picked;
	if (best >= 0) {
		const struct cap_image_origin *g = &out->owned_origins[best];
		/* The reference only while it still points here. */
		out->owned_reference = g->current ? xstrdup(g->owned_reference) : NULL;
		out->owned_oci_digest = g->owned_oci_digest ? xstrdup(g->owned_oci_digest) : NULL;
		out->owned_registry_digest = g->owned_registry_digest ? xstrdup(g->owned_registry_digest) : NULL;
		out->owned_pinned_digest = g->owned_pinned_digest ? xstrdup(g->owned_pinned_digest) : NULL;
	}
	struct stat st;
	if (stat(out->owned_path, &st) < 0) {
		int e = errno;
		cap_image_fini(out);
		return cap_err_set(err, e, "image file %s/" ROOTFS " is missing (%s); rebuild or re-import the image",
				   dir, strerror(e));
	}
	out->size = (uint64_t)st.st_size;
	return 0;
}

/* The image one of whose origins was pulled from repo with digest (or a
 * prefix of it) as its registry, OCI manifest or pinned digest: how many
 * images match, hex set to one of them. */
static int find_by_oci_digest(const char *images, const char *repo,
			      const char *digest, char hex[65])
{
	DIR *d = opendir(images);
	struct dirent *e;
	int found = 0;
	while (d && (e = readdir(d))) {
		if (!is_hex64(e->d_name))
			continue;
		_cleanup_free_ char *mpath = xasprintf("%s/%s/manifest.json", images, e->d_name);
		json_t *m = json_load_file(mpath, 0, NULL);
		if (!m)
			continue;
		json_t *origins = origins_of(m);
		size_t i;
		json_t *o;
		json_array_foreach(origins, i, o) {
			if (origin_has_digest(o, repo, digest)) {
				memcpy(hex, e->d_name, 65);
				found++;
				break;
			}
		}
		json_decref(origins);
		json_decref(m);
	}
	if (d)
		closedir(d);
	return found;
}

/* Find by a registry reference: the link of that exact (normalized)
 * reference, else for REPO@sha256:X an image one of whose origins was
 * pulled from REPO with registry, OCI manifest or pinned digest X. */
static int find_ref(const char *images, const char *ref, struct cap_image *out,
		    struct cap_err *err)
{
	struct cap_image_ref pr;
	struct cap_err perr = { 0 };
	/* REPO@sha256:PREFIX (12 or more hex digits) finds a pulled image
	 * the way sha256:PREFIX does; a full digest is a reference. */
	_cleanup_free_ char *repo_part = xstrdup(ref);
	char *at = strrchr(repo_part, '@');
	const char *prefix = NULL;
	if (at && strncmp(at + 1, "sha256:", 7) == 0) {
		size_t n = strlen(at + 8);
		if (n >= 12 && n < 64 && strspn(at + 8, "0123456789abcdef") == n) {
			prefix = ref + (at - repo_part) + 1;
			*at = '\0';
		}
	}
	if (cap_store_ref_parse(prefix ? repo_part : ref, &pr, &perr) < 0)
		return cap_err_set(err, EINVAL, "'%s' is neither an image name (a-z, 0-9, '.', '_', '-'), sha256:<digest> nor a registry reference (%s)",
				   ref, perr.msg);
	char hex[65];
	int r;
	if (prefix) {
		int k = find_by_oci_digest(images, pr.owned_repo, prefix, hex);
		struct pick p = { .repo = pr.owned_repo, .digest = prefix };
		r = k == 1 ? load(images, hex, &p, out, err)
		    : k > 1 ? cap_err_set(err, EINVAL, "%s matches %d images; give more digits", ref, k)
			    : cap_err_set(err, ENOENT, "no image pulled from %s with digest %s...; see `capsule image ls`",
					  pr.owned_repo, prefix);
		cap_image_ref_fini(&pr);
		return r;
	}
	_cleanup_free_ char *link = ref_file(images, pr.owned_full);
	struct pick p = { .reference = pr.owned_full, .repo = pr.owned_repo, .digest = pr.owned_digest };
	bool found = cap_store_link_hex(link, hex) ||
		     (pr.owned_digest && find_by_oci_digest(images, pr.owned_repo, pr.owned_digest, hex) > 0);
	r = found ? load(images, hex, &p, out, err)
		  : cap_err_set(err, ENOENT, "no image pulled as %s; pull it with `capsule image pull %s` (see `capsule image ls`)",
				pr.owned_full, ref);
	cap_image_ref_fini(&pr);
	return r;
}

/* The image a name link points at: 0 with hex set, -ENOENT, or -EBADMSG
 * with err set for a link that is not an image's. */
static int name_hex(const char *images, const char *name, char hex[65],
		    struct cap_err *err)
{
	_cleanup_free_ char *link = xasprintf("%s/names/%s", images, name);
	char target[512];
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0)
		return -ENOENT;
	target[n] = '\0';
	const char *h = strrchr(target, '/');
	h = h ? h + 1 : target;
	if (!is_hex64(h))
		return cap_err_set(err, EBADMSG, "image name link %s points at '%s', not a digest; remove it", link, target);
	memcpy(hex, h, 65);
	return 0;
}

static int no_name(const char *ref, struct cap_err *err)
{
	bool buildable = strcmp(ref, "base") == 0 || strcmp(ref, "python") == 0;
	return cap_err_set(err, ENOENT, "no image named '%s'; %s", ref,
			   buildable ? "build it with `capsule image build NAME`"
				     : "see `capsule image ls`, or `capsule image import PATH --name NAME`");
}

int cap_store_image_find(const char *ref, struct cap_image *out,
			 struct cap_err *err)
{
	_cleanup_free_ char *images = cap_store_images_dir();
	char hex[65];
	int r;

	if (strncmp(ref, "sha256:", 7) == 0) {
		const char *want = ref + 7;
		size_t wl = strlen(want);
		if (wl < 12 || wl > 64 || strspn(want, "0123456789abcdef") != wl)
			return cap_err_set(err, EINVAL, "'%s' is not a digest: use sha256: and at least 12 lowercase hex digits", ref);
		DIR *d = opendir(images);
		char match[65] = "";
		int count = 0;
		struct dirent *e;
		while (d && (e = readdir(d))) {
			if (is_hex64(e->d_name) && strncmp(e->d_name, want, wl) == 0) {
				snprintf(match, sizeof(match), "%.64s", e->d_name);
				count++;
			}
		}
		if (d)
			closedir(d);
		if (count == 0)
			return cap_err_set(err, ENOENT, "no image %s in %s; see `capsule image ls`", ref, images);
		if (count > 1)
			return cap_err_set(err, EINVAL, "%s matches %d images; give more digits", ref, count);
		return load(images, match, NULL, out, err);
	}
	/* name:NAME is the name, never a reference. */
	if (strncmp(ref, "name:", 5) == 0 && cap_store_image_name_valid(ref + 5)) {
		if ((r = name_hex(images, ref + 5, hex, err)) < 0)
			return r == -ENOENT ? no_name(ref + 5, err) : r;
		return load(images, hex, NULL, out, err);
	}
	if (!cap_store_image_name_valid(ref))
		return find_ref(images, ref, out, err);
	r = name_hex(images, ref, hex, err);
	if (r < 0 && r != -ENOENT)
		return r;
	/* A valid name may also be a reference ("alpine" pulled as
	 * docker.io/library/alpine:latest). */
	struct cap_image_ref pr;
	char rhex[65];
	bool as_ref = false;
	if (cap_store_ref_parse(ref, &pr, NULL) == 0) {
		_cleanup_free_ char *rl = ref_file(images, pr.owned_full);
		as_ref = cap_store_link_hex(rl, rhex);
		if (as_ref && r == 0 && strcmp(rhex, hex) != 0) {
			r = cap_err_set(err, EINVAL, "'%s' is both the image named %s (sha256:%.12s) and the pull of %s (sha256:%.12s): "
					"say name:%s for the named one, or the full reference %s for the pulled one",
					ref, ref, hex, pr.owned_full, rhex, ref, pr.owned_full);
			cap_image_ref_fini(&pr);
			return r;
		}
		if (as_ref && r < 0) {
			struct pick p = { .reference = pr.owned_full };
			r = load(images, rhex, &p, out, err);
			cap_image_ref_fini(&pr);
			return r;
		}
		cap_image_ref_fini(&pr);
	}
	if (r < 0)
		return no_name(ref, err);
	return load(images, hex, NULL, out, err);
}

static int hash_file(const char *path, char hex[65])
{
	struct cap_sha256 h;
	cap_sha256_init(&h);
	int r = cap_sha256_update_file(&h, path);
	cap_sha256_final_hex(&h, hex);
	return r;
}

int cap_store_image_verify(const struct cap_image *img, struct cap_err *err)
{
	char hex[65];
	int r = hash_file(img->owned_path, hex);
	if (r < 0)
		return cap_err_set(err, -r, "cannot read image %s: %s", img->owned_path, strerror(-r));
	if (strcmp(hex, img->digest + 7) != 0)
		return cap_err_set(err, EBADMSG, "image %s is corrupt: it is stored as %s but its bytes hash to sha256:%s; remove it (`capsule image rm %s`) and build or import it again",
				   img->owned_path, img->digest, hex, img->digest);
	return 0;
}

static int cmp_img(const void *a, const void *b)
{
	const struct cap_image *x = a, *y = b;
	const char *nx = x->owned_name ? x->owned_name : "\x7f";
	const char *ny = y->owned_name ? y->owned_name : "\x7f";
	int c = strcmp(nx, ny);
	return c ? c : strcmp(x->digest, y->digest);
}

int cap_store_image_list(struct cap_image **out, size_t *n, struct cap_err *err)
{
	_cleanup_free_ char *images = cap_store_images_dir();
	DIR *d = opendir(images);
	size_t cap = 8, k = 0;
	struct cap_image *v = xcalloc(cap, sizeof(*v));
	struct dirent *e;
	(void)err;
	while (d && (e = readdir(d))) {
		if (!is_hex64(e->d_name))
			continue;
		if (k == cap)
			v = xrealloc(v, (cap *= 2) * sizeof(*v));
		if (load(images, e->d_name, NULL, &v[k], NULL) == 0)
			k++;
	}
	if (d)
		closedir(d);
	qsort(v, k, sizeof(*v), cmp_img);
	*out = v;
	*n = k;
	return 0;
}

int cap_store_link_set(const char *dir, const char *link, const char *hex)
{
	_cleanup_free_ char *tmp = xasprintf("%s/.tmp.%d", dir, (int)getpid());
	_cleanup_free_ char *target = xasprintf("../%s", hex);
	int r = cap_mkdir_p(dir, 0755);
	if (r < 0)
		return r;
	unlink(tmp);
	if (symlink(target, tmp) < 0 || rename(tmp, link) < 0) {
		r = -errno;
		unlink(tmp);
		return r;
	}
	return 0;
}

/* Point images/names/<name> at hex, replacing any older link atomically. */
static int set_name(const char *images, const char *name, const char *hex)
{
	_cleanup_free_ char *names = xasprintf("%s/names", images);
	_cleanup_free_ char *link = xasprintf("%s/%s", names, name);
	return cap_store_link_set(names, link, hex);
}

/* Point images/refs/<ref> at hex: a reference pulled again moves. */
static int set_ref(const char *images, const char *ref, const char *hex)
{
	_cleanup_free_ char *refs = xasprintf("%s/refs", images);
	_cleanup_free_ char *link = ref_file(images, ref);
	if (strlen(strrchr(link, '/') + 1) > 255)
		return -ENAMETOOLONG;
	return cap_store_link_set(refs, link, hex);
}

/* Paths of what an image leaves out, as mkfs.erofs --exclude-path
 * arguments (relative to the tree's top). */
struct special {
	char **argv;
	size_t n, cap;
};

static int scan_special(int dfd, const char *rel, int depth, struct special *sp,
			struct cap_import_report *report)
{
	if (depth > 256)
		return -ELOOP;
	DIR *d = fdopendir(dfd);
	if (!d) {
		close(dfd);
		return -errno;
	}
	struct dirent *e;
	int r = 0;
	while (r == 0 && (e = readdir(d))) {
		if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue;
		_cleanup_free_ char *path = *rel ? xasprintf("%s/%s", rel, e->d_name) : xstrdup(e->d_name);
		if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode) || S_ISFIFO(st.st_mode) || S_ISSOCK(st.st_mode)) {
			if (sp->n == sp->cap)
				sp->argv = xrealloc(sp->argv, (sp->cap = sp->cap ? 2 * sp->cap : 8) * sizeof(char *));
			sp->argv[sp->n++] = xasprintf("--exclude-path=%s", path);
			_cleanup_free_ char *shown = xasprintf("/%s", path);
			cap_import_report_add(report, shown);
		} else if (S_ISDIR(st.st_mode)) {
			int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				r = scan_special(sub, path, depth + 1, sp, report);
		}
	}
	closedir(d);
	return r;
}

/* Add the origin o describes to manifest m's origins, replacing the one
 * of the same reference; the top-level fields say the latest (what
 * readers from before origins show). */
static void add_origin(json_t *m, const struct cap_import_opts *o)
{
	json_t *origins = origins_of(m), *kept = json_array();
	size_t i;
	json_t *g;
	json_array_foreach(origins, i, g) {
		const char *ref = json_string_value(json_object_get(g, "reference"));
		if (ref && strcmp(ref, o->reference) != 0)
			json_array_append(kept, g);
	}
	json_decref(origins);
	g = json_object();
	const char *keys[] = { "reference", "oci_digest", "registry_digest", "pinned_digest", "platform_digest",
			       "platform" };
	const char *vals[] = { o->reference, o->oci_digest, o->registry_digest, o->pinned_digest,
			       o->platform_digest, o->platform };
	for (i = 0; i < CAP_ARRAY_SIZE(keys); i++) {
		if (vals[i]) {
			json_object_set_new(g, keys[i], json_string(vals[i]));
			json_object_set_new(m, keys[i], json_string(vals[i]));
		} else {
			json_object_del(m, keys[i]);
		}
	}
	json_object_set_new(g, "pulled", json_integer((json_int_t)time(NULL)));
	json_array_append_new(kept, g);
	json_object_set_new(m, "origins", kept);
}

/* Add the origin of a pull to an image's manifest (kept otherwise). */
static int record_origin(const char *mpath, const struct cap_import_opts *o)
{
	json_t *m = json_load_file(mpath, 0, NULL);
	if (!m)
		return -EBADMSG;
	add_origin(m, o);
	char *text = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
	json_decref(m);
	int r = cap_write_file_atomic(mpath, text, strlen(text), 0644);
	free(text);
	return r;
}

int cap_store_image_from_dir(const char *dir, const char *name,
			     const char *source, cap_progress_fn progress,
			     void *ud, struct cap_image *out,
			     struct cap_err *err)
{
	struct cap_import_opts o = { .name = name, .source = source, .progress = progress, .ud = ud };
	return cap_store_image_from_tree(dir, &o, out, NULL, err);
}

int cap_store_image_from_tree(const char *dir, const struct cap_import_opts *o,
			      struct cap_image *out,
			      struct cap_import_report *report,
			      struct cap_err *err)
{
	_cleanup_free_ char *images = cap_store_images_dir();
	_cleanup_free_ char *tmpdir = NULL;
	_cleanup_close_ int lock = -1;
	_cleanup_free_ char *final = NULL, *file = NULL;
	const char *name = o->name;
	struct cap_import_report own = { 0 };
	struct special sp = { 0 };
	char **argv = NULL;
	int r;

	if (!report)
		report = &own;
	if (name && !cap_store_image_name_valid(name))
		return cap_err_set(err, EINVAL, "image name '%s' is not valid: 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", name);
	struct stat st;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return cap_err_set(err, ENOTDIR, "%s is not a directory", dir);
	if ((r = cap_mkdir_p(images, 0755)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", images, strerror(-r));
	int top = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (top < 0 || (r = scan_special(top, "", 0, &sp, report)) < 0) {
		r = top < 0 ? -errno : r;
		return cap_err_set(err, -r, "cannot read the tree %s: %s", dir, strerror(-r));
	}
	if (sp.n && o->progress) {
		_cleanup_free_ char *sum = cap_import_report_summary(report);
		_cleanup_free_ char *msg = xasprintf("%s (the guest's /dev provides devices)", sum);
		o->progress(o->ud, msg);
	}
	if ((lock = cap_store_tmpdir(images, "tmp-erofs", &tmpdir, err)) < 0) {
		r = lock;
		goto out;
	}
	file = xasprintf("%s/" ROOTFS, tmpdir);

	if (o->progress)
		o->progress(o->ud, "converting the tree to erofs (mkfs.erofs)");
	/* Fixed timestamp and UUID: the same tree gives the same bytes, so
	 * the same digest. Unprivileged imports cannot know real owners. */
	const char *head[] = { "mkfs.erofs", "--quiet", "-T0",
			       "-U00000000-0000-0000-0000-000000000000",
			       geteuid() == 0 ? "-x2" : "--all-root" };
	size_t k = 0;
	argv = xcalloc(CAP_ARRAY_SIZE(head) + sp.n + 3, sizeof(char *));
	for (size_t i = 0; i < CAP_ARRAY_SIZE(head); i++)
		argv[k++] = (char *)head[i];
	for (size_t i = 0; i < sp.n; i++)
		argv[k++] = sp.argv[i];
	argv[k++] = file;
	argv[k++] = (char *)dir;
	if ((r = cap_run(argv, NULL, NULL, err)) < 0) {
		cap_err_prefix(err, "converting %s to an image", dir);
		goto fail;
	}
	char hex[65];
	if ((r = hash_file(file, hex)) < 0) {
		r = cap_err_set(err, -r, "cannot read %s: %s", file, strerror(-r));
		goto fail;
	}
	final = xasprintf("%s/%s", images, hex);
	if (access(final, F_OK) == 0) {
		cap_remove_tree(tmpdir);	/* same bytes already stored */
	} else {
		json_t *m = json_pack("{s:i, s:s+, s:s?, s:s, s:I, s:I}", "schema", 1,
				      "digest", "sha256:", hex, "name", name,
				      "source", o->source ? o->source : dir, "size", (json_int_t)0,
				      "created", (json_int_t)time(NULL));
		struct stat fst;
		if (stat(file, &fst) == 0)
			json_object_set_new(m, "size", json_integer((json_int_t)fst.st_size));
		char *text = json_dumps(m, JSON_INDENT(2) | JSON_PRESERVE_ORDER);
		json_decref(m);
		_cleanup_free_ char *mpath = xasprintf("%s/manifest.json", tmpdir);
		r = cap_write_file_atomic(mpath, text, strlen(text), 0644);
		free(text);
		if (r == 0 && rename(tmpdir, final) < 0) {
			r = -errno;
			/* Another import stored the same bytes meanwhile. */
			if ((r == -ENOTEMPTY || r == -EEXIST) && access(final, F_OK) == 0) {
				cap_remove_tree(tmpdir);
				r = 0;
			}
		}
		if (r < 0) {
			r = cap_err_set(err, -r, "cannot store the image in %s: %s", final, strerror(-r));
			goto fail;
		}
		_cleanup_free_ char *lockf = xasprintf("%s/" TMP_LOCK, final);
		unlink(lockf);
	}
	if (name && (r = set_name(images, name, hex)) < 0) {
		r = cap_err_set(err, -r, "cannot name the image '%s': %s", name, strerror(-r));
		goto out;
	}
	/* The link first: a reference that cannot be linked is not
	 * recorded as an origin. */
	if (o->reference && (r = set_ref(images, o->reference, hex)) < 0) {
		r = cap_err_set(err, -r, "cannot record the reference '%s': %s", o->reference, strerror(-r));
		goto out;
	}
	if (o->reference) {
		_cleanup_free_ char *mpath = xasprintf("%s/manifest.json", final);
		if ((r = record_origin(mpath, o)) < 0) {
			r = cap_err_set(err, -r, "cannot record the reference in %s: %s", mpath, strerror(-r));
			goto out;
		}
	}
	struct pick p = { .reference = o->reference };
	r = load(images, hex, &p, out, err);
	goto out;

fail:
	cap_remove_tree(tmpdir);
out:
	for (size_t i = 0; i < sp.n; i++)
		free(sp.argv[i]);
	free(sp.argv);
	free(argv);
	return r;
}

static bool in_use_default(void *ud, const char *digest)
{
	(void)ud, (void)digest;
	return false;
}

static void remove_names(const char *images, const char *hex)
{
	char *n;
	while ((n = name_of(images, hex))) {
		_cleanup_free_ char *link = xasprintf("%s/names/%s", images, n);
		free(n);
		if (unlink(link) < 0)
			break;
	}
	while ((n = ref_of(images, hex))) {
		_cleanup_free_ char *link = ref_file(images, n);
		free(n);
		if (unlink(link) < 0)
			break;
	}
	/* The rootfs cache's links to it (store-rootfs.c), and any left
	 * dangling by an older removal. */
	_cleanup_free_ char *cache = xasprintf("%s/rootfs", images);
	DIR *d = opendir(cache);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		char h[65];
		_cleanup_free_ char *link = xasprintf("%s/%s", cache, e->d_name);
		if (e->d_name[0] == '.' || !cap_store_link_hex(link, h))
			continue;
		_cleanup_free_ char *target = xasprintf("%s/%s", images, h);
		if (strcmp(h, hex) == 0 || access(target, F_OK) != 0)
			unlink(link);
	}
	if (d)
		closedir(d);
}

int cap_store_image_remove(const char *ref, cap_image_in_use_fn in_use,
			   void *ud, struct cap_err *err)
{
	struct cap_image img;
	int r = cap_store_image_find(ref, &img, err);
	if (r < 0 && r != -EBADMSG)
		return r;
	if (r == -EBADMSG && strncmp(ref, "sha256:", 7) != 0)
		return r;
	_cleanup_free_ char *images = cap_store_images_dir();
	char hex[65];
	if (r == 0) {
		snprintf(hex, sizeof(hex), "%.64s", img.digest + 7);
		cap_image_fini(&img);
	} else {
		/* A broken image (no manifest) can still be removed by digest. */
		snprintf(hex, sizeof(hex), "%.64s", ref + 7);
		if (!is_hex64(hex))
			return r;
	}
	char digest[72];
	snprintf(digest, sizeof(digest), "sha256:%s", hex);
	if ((in_use ? in_use : in_use_default)(ud, digest))
		return cap_err_set(err, EBUSY, "image %s is used by a sandbox; remove the sandbox first (`capsule ls` shows which)", digest);
	remove_names(images, hex);
	_cleanup_free_ char *dir = xasprintf("%s/%s", images, hex);
	if ((r = cap_remove_tree(dir)) < 0)
		return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
	return 0;
}

int cap_store_image_prune(cap_image_in_use_fn in_use, void *ud,
			  size_t *removed, struct cap_err *err)
{
	struct cap_image *v;
	size_t n;
	*removed = 0;
	int r = cap_store_image_list(&v, &n, err);
	if (r < 0)
		return r;
	for (size_t i = 0; i < n && r == 0; i++) {
		if (!(in_use ? in_use : in_use_default)(ud, v[i].digest)) {
			r = cap_store_image_remove(v[i].digest, in_use, ud, err);
			if (r == 0)
				(*removed)++;
		}
	}
	for (size_t i = 0; i < n; i++)
		cap_image_fini(&v[i]);
	free(v);
	return r;
}
