/* The image store: read-only root file systems as erofs files, named by
 * the SHA-256 of their bytes, under CAPSULE_HOME/images/<hex>/ with a
 * manifest.json beside. Names are symlinks images/names/<name> -> ../<hex>,
 * replaced atomically, so a name can move to a rebuilt image while
 * sandboxes keep the digest they were created with. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

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

void cap_image_fini(struct cap_image *img)
{
	free(img->owned_name);
	free(img->owned_path);
	free(img->owned_source);
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
		char target[512];
		ssize_t n = readlinkat(dirfd(d), e->d_name, target, sizeof(target) - 1);
		if (n <= 0)
			continue;
		target[n] = '\0';
		const char *base = strrchr(target, '/');
		if (strcmp(base ? base + 1 : target, hex) == 0)
			found = xstrdup(e->d_name);
	}
	if (d)
		closedir(d);
	return found;
}

static int load(const char *images, const char *hex, struct cap_image *out,
		struct cap_err *err)
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
	json_decref(m);
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

int cap_store_image_find(const char *ref, struct cap_image *out,
			 struct cap_err *err)
{
	_cleanup_free_ char *images = cap_store_images_dir();

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
		return load(images, match, out, err);
	}
	if (!cap_store_image_name_valid(ref))
		return cap_err_set(err, EINVAL, "'%s' is neither an image name (a-z, 0-9, '.', '_', '-') nor sha256:<digest>", ref);
	_cleanup_free_ char *link = xasprintf("%s/names/%s", images, ref);
	char target[512];
	ssize_t n = readlink(link, target, sizeof(target) - 1);
	if (n <= 0) {
		bool buildable = strcmp(ref, "base") == 0 || strcmp(ref, "python") == 0;
		return cap_err_set(err, ENOENT, "no image named '%s'; %s", ref,
				   buildable ? "build it with `capsule image build NAME`"
					     : "see `capsule image ls`, or `capsule image import PATH --name NAME`");
	}
	target[n] = '\0';
	const char *hex = strrchr(target, '/');
	hex = hex ? hex + 1 : target;
	if (!is_hex64(hex))
		return cap_err_set(err, EBADMSG, "image name link %s points at '%s', not a digest; remove it", link, target);
	return load(images, hex, out, err);
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
		if (load(images, e->d_name, &v[k], NULL) == 0)
			k++;
	}
	if (d)
		closedir(d);
	qsort(v, k, sizeof(*v), cmp_img);
	*out = v;
	*n = k;
	return 0;
}

/* Point images/names/<name> at hex, replacing any older link atomically. */
static int set_name(const char *images, const char *name, const char *hex)
{
	_cleanup_free_ char *names = xasprintf("%s/names", images);
	_cleanup_free_ char *tmp = xasprintf("%s/.%s.tmp.%d", names, name, (int)getpid());
	_cleanup_free_ char *link = xasprintf("%s/%s", names, name);
	_cleanup_free_ char *target = xasprintf("../%s", hex);
	int r = cap_mkdir_p(names, 0755);
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

int cap_store_image_from_dir(const char *dir, const char *name,
			     const char *source, cap_progress_fn progress,
			     void *ud, struct cap_image *out,
			     struct cap_err *err)
{
	_cleanup_free_ char *images = cap_store_images_dir();
	_cleanup_free_ char *tmpdir = xasprintf("%s/tmp-erofs-XXXXXX", images);
	_cleanup_free_ char *final = NULL;
	int r;

	if (name && !cap_store_image_name_valid(name))
		return cap_err_set(err, EINVAL, "image name '%s' is not valid: 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", name);
	struct stat st;
	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode))
		return cap_err_set(err, ENOTDIR, "%s is not a directory", dir);
	if ((r = cap_mkdir_p(images, 0755)) < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", images, strerror(-r));
	if (!mkdtemp(tmpdir))
		return cap_err_set(err, errno, "cannot create a directory in %s: %s", images, strerror(errno));
	_cleanup_free_ char *file = xasprintf("%s/" ROOTFS, tmpdir);

	if (progress)
		progress(ud, "converting the tree to erofs (mkfs.erofs)");
	/* Fixed timestamp and UUID: the same tree gives the same bytes, so
	 * the same digest. Unprivileged imports cannot know real owners. */
	char *argv[] = { "mkfs.erofs", "--quiet", "-T0",
			 "-U00000000-0000-0000-0000-000000000000",
			 geteuid() == 0 ? "-x2" : "--all-root", file, (char *)dir, NULL };
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
				      "source", source, "size", (json_int_t)0,
				      "created", (json_int_t)time(NULL));
		struct stat fst;
		if (stat(file, &fst) == 0)
			json_object_set_new(m, "size", json_integer((json_int_t)fst.st_size));
		char *text = json_dumps(m, JSON_INDENT(2));
		json_decref(m);
		_cleanup_free_ char *mpath = xasprintf("%s/manifest.json", tmpdir);
		r = cap_write_file_atomic(mpath, text, strlen(text), 0644);
		free(text);
		if (r < 0 || rename(tmpdir, final) < 0) {
			r = r < 0 ? r : -errno;
			r = cap_err_set(err, -r, "cannot store the image in %s: %s", final, strerror(-r));
			goto fail;
		}
	}
	if (name && (r = set_name(images, name, hex)) < 0)
		return cap_err_set(err, -r, "cannot name the image '%s': %s", name, strerror(-r));
	return load(images, hex, out, err);

fail:
	cap_remove_tree(tmpdir);
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
