/* Importing images: a directory, a tar archive, an OCI image layout
 * (directory or tar) or a `docker save` archive. Layers are applied in
 * order onto a staging tree with libarchive; whiteouts (.wh.NAME removes
 * NAME from the layers below, .wh..wh..opq empties its directory) are
 * applied before the layer's own entries. Nothing is extracted through a
 * symlink, to an absolute path or above the staging root. Device nodes,
 * FIFOs and sockets, and hard links to them, are left out and counted
 * (struct cap_import_report), and what they replaced in the layers below
 * is removed: the guest's /dev is its own devtmpfs, and its root is
 * mounted nodev. */
#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define WH_PREFIX ".wh."
#define WH_OPAQUE ".wh..wh..opq"

static struct archive *open_archive(const char *path, struct cap_err *err)
{
	struct archive *a = archive_read_new();
	archive_read_support_filter_all(a);
	archive_read_support_format_tar(a);
	archive_read_support_format_gnutar(a);
	if (archive_read_open_filename(a, path, 65536) != ARCHIVE_OK) {
		cap_err_set(err, EINVAL, "cannot read %s as a tar archive: %s", path, archive_error_string(a));
		archive_read_free(a);
		return NULL;
	}
	return a;
}

/* Normalise an entry path: strip "./" and leading "/", refuse "..". Empty
 * result (the root itself) returns 0 with *out = "". */
static int clean_path(const char *in, char *out, size_t len)
{
	while (in[0] == '.' && in[1] == '/')
		in += 2;
	while (*in == '/')
		in++;
	if (strcmp(in, ".") == 0)
		in = "";
	size_t n = strlen(in);
	if (n >= len)
		return -ENAMETOOLONG;
	memcpy(out, in, n + 1);
	while (n > 0 && out[n - 1] == '/')
		out[--n] = '\0';
	for (char *c = out; *c;) {
		size_t k = strcspn(c, "/");
		if (k == 2 && c[0] == '.' && c[1] == '.')
			return -EINVAL;
		c += k;
		if (*c == '/')
			c++;
	}
	return 0;
}

/* Open the directory rel under root without following any symlink; -1
 * (errno set) when a component is missing or not a directory. */
static int open_dir_under(int rootfd, const char *rel)
{
	int fd = fcntl(rootfd, F_DUPFD_CLOEXEC, 0);
	char buf[4096];
	snprintf(buf, sizeof(buf), "%s", rel);
	for (char *c = strtok(buf, "/"); c && fd >= 0; c = strtok(NULL, "/")) {
		int n = openat(fd, c, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		close(fd);
		fd = n;
	}
	return fd;
}

/* Apply one whiteout entry (path is cleaned, basename starts with .wh.). */
static int whiteout(int rootfd, const char *path)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	const char *base = slash ? slash + 1 : path;
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 0, path);
	int dfd = open_dir_under(rootfd, dir);
	if (dfd < 0)
		return 0;	/* nothing below to hide */
	int r = 0;
	if (strcmp(base, WH_OPAQUE) == 0) {
		DIR *d = fdopendir(dfd);
		if (!d) {
			close(dfd);
			return -errno;
		}
		struct dirent *e;
		while ((e = readdir(d)))
			if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
				if (cap_remove_at(dirfd(d), e->d_name) < 0 && r == 0)
					r = -errno;
		closedir(d);
		return r;
	}
	const char *victim = base + strlen(WH_PREFIX);
	if (*victim && strcmp(victim, ".") && strcmp(victim, ".."))
		r = cap_remove_at(dfd, victim);
	close(dfd);
	return r;
}

/* Write name into out (len bytes) with what a terminal would act on
 * escaped: C0 controls and DEL as \n, \t or \xNN, C1 controls (U+0080 to
 * U+009F) and bytes that are not UTF-8 as \xNN, and the backslash itself
 * doubled. Dropped names come from the image, not from the user. */
static void escape_name(const char *name, char *out, size_t len)
{
	const unsigned char *s = (const unsigned char *)name;
	size_t o = 0;
	while (*s && o + 5 < len) {
		unsigned char c = *s;
		size_t n = c < 0x80 ? 1 : (c & 0xe0) == 0xc0 ? 2 : (c & 0xf0) == 0xe0 ? 3 : (c & 0xf8) == 0xf0 ? 4 : 0;
		for (size_t i = 1; i < n; i++)
			if ((s[i] & 0xc0) != 0x80)
				n = 0;	/* also stops at the terminating NUL */
		if (n == 2 && c == 0xc2 && s[1] < 0xa0)
			n = 0;	/* C1 control, e.g. U+009B (CSI) */
		if (n == 1 && c >= 0x20 && c != 0x7f && c != '\\') {
			out[o++] = (char)c;
		} else if (n == 1 && (c == '\n' || c == '\t' || c == '\\')) {
			out[o++] = '\\';
			out[o++] = c == '\n' ? 'n' : c == '\t' ? 't' : '\\';
		} else if (n > 1 && o + n < len) {
			memcpy(out + o, s, n);
			o += n;
			s += n;
			continue;
		} else if (n > 1) {
			break;
		} else {
			o += (size_t)snprintf(out + o, len - o, "\\x%02x", c);
		}
		s++;
	}
	out[o] = '\0';
}

void cap_import_report_add(struct cap_import_report *report, const char *path)
{
	if (!report)
		return;
	char name[sizeof(report->shown)];
	escape_name(path, name, sizeof(name));
	size_t used = strlen(report->shown);
	if (report->dropped < 4 && used + strlen(name) + 3 < sizeof(report->shown))
		snprintf(report->shown + used, sizeof(report->shown) - used, "%s%s", used ? ", " : "", name);
	else if (!strstr(report->shown, ", ...") && used + 6 < sizeof(report->shown))
		snprintf(report->shown + used, sizeof(report->shown) - used, ", ...");
	report->dropped++;
}

char *cap_import_report_summary(const struct cap_import_report *report)
{
	bool one = report->dropped == 1;
	return xasprintf("dropped %zu %s: %s", report->dropped,
			 one ? "device node, FIFO or socket" : "device nodes, FIFOs or sockets", report->shown);
}

static bool is_whiteout(const char *path)
{
	const char *slash = strrchr(path, '/');
	return strncmp(slash ? slash + 1 : path, WH_PREFIX, strlen(WH_PREFIX)) == 0;
}

/* Remove what the stage holds at the cleaned path, as a whiteout would,
 * never following a symlink: an entry left out must not uncover the file
 * of a lower layer it replaced (overlayfs marks a deletion with a 0/0
 * character device, which docker layers may carry). */
static int remove_under(int rootfd, const char *path)
{
	char dir[4096];
	const char *slash = strrchr(path, '/');
	snprintf(dir, sizeof(dir), "%.*s", slash ? (int)(slash - path) : 0, path);
	int dfd = open_dir_under(rootfd, dir);
	if (dfd < 0)
		return 0;	/* nothing below at that path */
	int r = cap_remove_at(dfd, slash ? slash + 1 : path);
	close(dfd);
	return r;
}

/* The paths a layer left out, so that hard links to them are left out
 * too. Bounded: past the bound a hard link to a forgotten node fails the
 * layer with libarchive's message, as it did before. */
#define DROPPED_MAX 65536
struct dropped {
	char **v;
	size_t n, cap;
};

static bool dropped_has(const struct dropped *d, const char *path)
{
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->v[i], path) == 0)
			return true;
	return false;
}

static void dropped_add(struct dropped *d, const char *path)
{
	if (d->n == DROPPED_MAX || dropped_has(d, path))
		return;
	if (d->n == d->cap)
		d->v = xrealloc(d->v, (d->cap = d->cap ? 2 * d->cap : 16) * sizeof(char *));
	d->v[d->n++] = xstrdup(path);
}

/* A later entry at path puts something real there again. */
static void dropped_forget(struct dropped *d, const char *path)
{
	for (size_t i = 0; i < d->n; i++)
		if (strcmp(d->v[i], path) == 0) {
			free(d->v[i]);
			d->v[i] = d->v[--d->n];
			return;
		}
}

static void dropped_fini(struct dropped *d)
{
	for (size_t i = 0; i < d->n; i++)
		free(d->v[i]);
	free(d->v);
}

/* cap_store_apply_layer with the paths dropped so far carried in and
 * out, so that a hard link in a later layer to a node an earlier one
 * dropped is dropped too (and a real entry at a dropped path takes it
 * off the list). */
static int apply_layer(const char *root, const char *layer, struct cap_import_report *report,
		       struct dropped *dropped, struct cap_err *err);

int cap_store_apply_layer(const char *root, const char *layer,
			  struct cap_import_report *report,
			  struct cap_err *err)
{
	struct dropped dropped = { 0 };
	int r = apply_layer(root, layer, report, &dropped, err);
	dropped_fini(&dropped);
	return r;
}

static int apply_layer(const char *root, const char *layer, struct cap_import_report *report,
		       struct dropped *dropped, struct cap_err *err)
{
	struct archive *a;
	struct archive_entry *e;
	char clean[4096];
	int r = 0, k;

	_cleanup_close_ int rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0)
		return cap_err_set(err, errno, "cannot open %s: %s", root, strerror(errno));

	/* Pass 1: whiteouts hide what the layers below had. */
	if (!(a = open_archive(layer, err)))
		return -EINVAL;
	while ((k = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		if (clean_path(archive_entry_pathname(e), clean, sizeof(clean)) < 0) {
			r = cap_err_set(err, EINVAL, "%s: entry '%s' leaves the root (..) or is too long; refusing the layer",
					layer, archive_entry_pathname(e));
			break;
		}
		if (*clean && is_whiteout(clean) && (k = whiteout(rootfd, clean)) < 0) {
			r = cap_err_set(err, -k, "%s: applying whiteout %s: %s", layer, clean, strerror(-k));
			break;
		}
	}
	if (r == 0 && k != ARCHIVE_EOF)
		r = cap_err_set(err, EINVAL, "%s is not a readable tar archive: %s", layer, archive_error_string(a));
	archive_read_free(a);
	if (r < 0)
		return r;

	/* Pass 2: the layer's own entries, extracted with paths relative to
	 * the staging root (our cwd for the duration), so that libarchive's
	 * checks see only paths inside it. */
	if (!(a = open_archive(layer, err)))
		return -EINVAL;
	_cleanup_close_ int cwd = open(".", O_PATH | O_CLOEXEC);
	if (cwd < 0 || fchdir(rootfd) < 0) {
		archive_read_free(a);
		return cap_err_set(err, errno, "cannot enter %s: %s", root, strerror(errno));
	}
	struct archive *w = archive_write_disk_new();
	int flags = ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
		    ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS | ARCHIVE_EXTRACT_PERM |
		    ARCHIVE_EXTRACT_TIME | ARCHIVE_EXTRACT_UNLINK | ARCHIVE_EXTRACT_XATTR;
	bool root_user = geteuid() == 0;
	if (root_user)
		flags |= ARCHIVE_EXTRACT_OWNER;
	archive_write_disk_set_options(w, flags);
	archive_write_disk_set_standard_lookup(w);
	while ((k = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		clean_path(archive_entry_pathname(e), clean, sizeof(clean));
		if (!*clean || is_whiteout(clean))
			continue;
		mode_t type = archive_entry_filetype(e);
		bool special = type == AE_IFCHR || type == AE_IFBLK || type == AE_IFIFO || type == AE_IFSOCK;
		const char *hl = archive_entry_hardlink(e);
		char hclean[4096];
		if (hl && (clean_path(hl, hclean, sizeof(hclean)) < 0 || !*hclean)) {
			r = cap_err_set(err, EINVAL, "%s: hard link %s points outside the root", layer, clean);
			break;
		}
		if (special || (hl && dropped_has(dropped, hclean))) {
			/* devtmpfs provides devices; a hard link to a node
			 * left out is that node under another name. */
			if ((k = remove_under(rootfd, clean)) < 0) {
				r = cap_err_set(err, -k, "%s: removing what %s replaces: %s", layer, clean, strerror(-k));
				break;
			}
			char shown[4097];
			snprintf(shown, sizeof(shown), "/%s", clean);
			cap_import_report_add(report, shown);
			dropped_add(dropped, clean);
			continue;
		}
		dropped_forget(dropped, clean);
		archive_entry_set_pathname(e, clean);
		if (hl)
			archive_entry_set_hardlink(e, hclean);
		if (archive_write_header(w, e) < ARCHIVE_WARN) {
			r = cap_err_set(err, EIO, "%s: cannot extract %s: %s", layer, clean, archive_error_string(w));
			break;
		}
		const void *buf;
		size_t size;
		la_int64_t off;
		while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK)
			if (archive_write_data_block(w, buf, size, off) < ARCHIVE_WARN)
				break;
		if (k < ARCHIVE_WARN) {
			r = cap_err_set(err, EIO, "%s: reading %s: %s", layer, clean, archive_error_string(a));
			break;
		}
		archive_write_finish_entry(w);
		k = ARCHIVE_OK;
	}
	if (r == 0 && k != ARCHIVE_EOF)
		r = cap_err_set(err, EINVAL, "%s: %s", layer, archive_error_string(a));
	archive_write_free(w);
	archive_read_free(a);
	if (fchdir(cwd) < 0 && r == 0)
		r = cap_err_set(err, errno, "cannot return to the working directory: %s", strerror(errno));
	return r;
}

/* Does the archive hold a file at top level with this name? */
static int archive_has(const char *path, const char *const names[], size_t n,
		       bool *found, struct cap_err *err)
{
	struct archive *a = open_archive(path, err);
	struct archive_entry *e;
	char clean[4096];
	int k;
	if (!a)
		return -EINVAL;
	*found = false;
	while ((k = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		if (clean_path(archive_entry_pathname(e), clean, sizeof(clean)) < 0)
			continue;
		for (size_t i = 0; i < n; i++)
			if (strcmp(clean, names[i]) == 0)
				*found = true;
	}
	int r = k == ARCHIVE_EOF ? 0 : cap_err_set(err, EINVAL, "%s: %s", path, archive_error_string(a));
	archive_read_free(a);
	return r;
}

/* A relative path inside an unpacked image archive: refuse escapes. */
static char *inside(const char *dir, const char *rel, struct cap_err *err)
{
	char clean[4096];
	if (!rel || clean_path(rel, clean, sizeof(clean)) < 0 || !*clean) {
		cap_err_set(err, EINVAL, "image metadata names a path outside the archive: '%s'", rel ? rel : "(null)");
		return NULL;
	}
	char *p = xasprintf("%s/%s", dir, clean);
	struct stat st;
	if (lstat(p, &st) < 0 || !S_ISREG(st.st_mode)) {
		cap_err_set(err, ENOENT, "image metadata names %s, which is missing or not a file", clean);
		free(p);
		return NULL;
	}
	return p;
}

char *cap_store_oci_blob(const char *dir, const char *digest, struct cap_err *err)
{
	if (!digest || strncmp(digest, "sha256:", 7) != 0 || strlen(digest) != 71 ||
	    strspn(digest + 7, "0123456789abcdef") != 64) {
		cap_err_set(err, EINVAL, "unsupported or malformed digest '%s'", digest ? digest : "(null)");
		return NULL;
	}
	_cleanup_free_ char *rel = xasprintf("blobs/sha256/%s", digest + 7);
	char *p = inside(dir, rel, err);
	if (!p)
		return NULL;
	/* Content addressing means something only if it is checked. */
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	int r = cap_sha256_update_file(&h, p);
	cap_sha256_final_hex(&h, hex);
	if (r < 0 || strcmp(hex, digest + 7) != 0) {
		cap_err_set(err, EBADMSG, "blob %s does not match its digest (its bytes hash to sha256:%s)", digest, hex);
		free(p);
		return NULL;
	}
	return p;
}

/* Layers of an OCI layout: index.json -> (index ->) manifest -> layers. */
static int oci_layers(const char *dir, char ***layers, size_t *n,
		      struct cap_err *err)
{
	_cleanup_free_ char *ipath = xasprintf("%s/index.json", dir);
	json_t *j = json_load_file(ipath, 0, NULL);
	int r = 0;
	for (int depth = 0; j && depth < 3; depth++) {
		json_t *manifests = json_object_get(j, "manifests");
		if (!json_is_array(manifests)) {
			json_t *ls = json_object_get(j, "layers");
			if (!json_is_array(ls))
				break;
			*n = json_array_size(ls);
			*layers = xcalloc(*n + 1, sizeof(char *));
			for (size_t i = 0; i < *n; i++) {
				const char *d = json_string_value(json_object_get(json_array_get(ls, i), "digest"));
				if (!((*layers)[i] = cap_store_oci_blob(dir, d, err))) {
					r = -EBADMSG;
					break;
				}
			}
			json_decref(j);
			return r;
		}
		/* Prefer linux/amd64 when platforms are given. */
		json_t *pick = json_array_get(manifests, 0);
		size_t i;
		json_t *m;
		json_array_foreach(manifests, i, m) {
			json_t *pl = json_object_get(m, "platform");
			const char *os = json_string_value(json_object_get(pl, "os"));
			const char *arch = json_string_value(json_object_get(pl, "architecture"));
			if (os && arch && strcmp(os, "linux") == 0 && strcmp(arch, "amd64") == 0) {
				pick = m;
				break;
			}
		}
		_cleanup_free_ char *next = cap_store_oci_blob(dir, json_string_value(json_object_get(pick, "digest")), err);
		json_decref(j);
		if (!next)
			return -EBADMSG;
		j = json_load_file(next, 0, NULL);
	}
	json_decref(j);
	return cap_err_set(err, EBADMSG, "%s: index.json does not lead to an image manifest with layers", dir);
}

/* Layers of a `docker save` archive: manifest.json[0].Layers. */
static int docker_layers(const char *dir, char ***layers, size_t *n,
			 struct cap_err *err)
{
	_cleanup_free_ char *mpath = xasprintf("%s/manifest.json", dir);
	json_t *j = json_load_file(mpath, 0, NULL);
	json_t *ls = json_object_get(json_array_get(j, 0), "Layers");
	if (!json_is_array(ls)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s has no Layers list; is this a `docker save` archive?", mpath);
	}
	*n = json_array_size(ls);
	*layers = xcalloc(*n + 1, sizeof(char *));
	for (size_t i = 0; i < *n; i++) {
		if (!((*layers)[i] = inside(dir, json_string_value(json_array_get(ls, i)), err))) {
			json_decref(j);
			return -EBADMSG;
		}
	}
	json_decref(j);
	return 0;
}

static void free_layers(char **layers, size_t n)
{
	for (size_t i = 0; layers && i < n; i++)
		free(layers[i]);
	free(layers);
}

/* Apply the layers of an unpacked OCI layout or docker-save directory. */
static int import_layout(const char *dir, const char *stage, const char *what,
			 cap_progress_fn progress, void *ud, size_t *nlayers,
			 struct cap_import_report *report, struct cap_err *err)
{
	char **layers = NULL;
	size_t n = 0;
	_cleanup_free_ char *oci = xasprintf("%s/oci-layout", dir);
	_cleanup_free_ char *index = xasprintf("%s/index.json", dir);
	int r = access(oci, F_OK) == 0 && access(index, F_OK) == 0
			? oci_layers(dir, &layers, &n, err)
			: docker_layers(dir, &layers, &n, err);
	struct dropped dropped = { 0 };
	for (size_t i = 0; r == 0 && i < n; i++) {
		if (progress) {
			char msg[128];
			snprintf(msg, sizeof(msg), "applying layer %zu of %zu (%s)", i + 1, n, what);
			progress(ud, msg);
		}
		r = apply_layer(stage, layers[i], report, &dropped, err);
	}
	dropped_fini(&dropped);
	free_layers(layers, n);
	*nlayers = n;
	return r;
}

/* Unpack a whole archive (an OCI or docker-save tar) into dir. */
static int unpack(const char *path, const char *dir, struct cap_err *err)
{
	struct archive *a = open_archive(path, err);
	struct archive_entry *e;
	char clean[4096];
	int k, r = 0;
	if (!a)
		return -EINVAL;
	_cleanup_close_ int cwd = open(".", O_PATH | O_CLOEXEC);
	if (cwd < 0 || chdir(dir) < 0) {
		archive_read_free(a);
		return cap_err_set(err, errno, "cannot enter %s: %s", dir, strerror(errno));
	}
	struct archive *w = archive_write_disk_new();
	archive_write_disk_set_options(w, ARCHIVE_EXTRACT_SECURE_NODOTDOT | ARCHIVE_EXTRACT_SECURE_SYMLINKS |
					      ARCHIVE_EXTRACT_SECURE_NOABSOLUTEPATHS);
	while ((k = archive_read_next_header(a, &e)) == ARCHIVE_OK) {
		mode_t type = archive_entry_filetype(e);
		if (clean_path(archive_entry_pathname(e), clean, sizeof(clean)) < 0 || !*clean ||
		    (type != AE_IFREG && type != AE_IFDIR))
			continue;	/* metadata archives hold files and directories only */
		archive_entry_set_pathname(e, clean);
		if (archive_write_header(w, e) < ARCHIVE_WARN) {
			r = cap_err_set(err, EIO, "%s: cannot unpack %s: %s", path, clean, archive_error_string(w));
			break;
		}
		const void *buf;
		size_t size;
		la_int64_t off;
		while ((k = archive_read_data_block(a, &buf, &size, &off)) == ARCHIVE_OK)
			archive_write_data_block(w, buf, size, off);
		archive_write_finish_entry(w);
		k = ARCHIVE_OK;
	}
	if (r == 0 && k != ARCHIVE_EOF)
		r = cap_err_set(err, EINVAL, "%s: %s", path, archive_error_string(a));
	archive_write_free(w);
	archive_read_free(a);
	if (fchdir(cwd) < 0 && r == 0)
		r = cap_err_set(err, errno, "cannot return to the working directory: %s", strerror(errno));
	return r;
}

int cap_store_image_import(const char *path, const char *name,
			   cap_progress_fn progress, void *ud,
			   struct cap_image *out, struct cap_err *err)
{
	struct cap_import_opts o = { .name = name, .progress = progress, .ud = ud };
	return cap_store_image_import_with(path, &o, out, NULL, err);
}

int cap_store_image_import_with(const char *path,
				const struct cap_import_opts *o,
				struct cap_image *out,
				struct cap_import_report *report,
				struct cap_err *err)
{
	struct stat st;
	const char *name = o->name;
	cap_progress_fn progress = o->progress;
	void *ud = o->ud;
	struct cap_import_report own = { 0 };
	if (!report)
		report = &own;
	if (stat(path, &st) < 0)
		return cap_err_set(err, errno, "cannot import %s: %s", path, strerror(errno));
	if (name && !cap_store_image_name_valid(name))
		return cap_err_set(err, EINVAL, "image name '%s' is not valid: 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", name);

	_cleanup_free_ char *images = cap_store_images_dir();
	int r = cap_mkdir_p(images, 0755);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", images, strerror(-r));
	_cleanup_free_ char *work = NULL;
	_cleanup_close_ int lock = cap_store_tmpdir(images, "tmp-import", &work, err);
	if (lock < 0)
		return lock;
	_cleanup_free_ char *stage = xasprintf("%s/root", work);
	_cleanup_free_ char *meta = xasprintf("%s/meta", work);
	mkdir(stage, 0755);
	_cleanup_free_ char *source = NULL;
	size_t nlayers = 0;
	const char *tree = stage;

	if (S_ISDIR(st.st_mode)) {
		_cleanup_free_ char *oci = xasprintf("%s/oci-layout", path);
		if (access(oci, F_OK) == 0) {
			r = import_layout(path, stage, "OCI layout", progress, ud, &nlayers, report, err);
			source = xasprintf("import of %s (OCI layout, %zu layers)", path, nlayers);
		} else {
			tree = path;	/* a plain tree converts directly */
			source = xasprintf("import of directory %s", path);
		}
	} else if (S_ISREG(st.st_mode)) {
		static const char *const markers[] = { "manifest.json", "oci-layout" };
		bool layout = false;
		r = archive_has(path, markers, CAP_ARRAY_SIZE(markers), &layout, err);
		if (r == 0 && layout) {
			mkdir(meta, 0700);
			if (progress)
				progress(ud, "unpacking the image archive");
			r = unpack(path, meta, err);
			if (r == 0)
				r = import_layout(meta, stage, "image archive", progress, ud, &nlayers, report, err);
			source = xasprintf("import of %s (image archive, %zu layers)", path, nlayers);
		} else if (r == 0) {
			if (progress)
				progress(ud, "extracting the tar archive");
			r = cap_store_apply_layer(stage, path, report, err);
			source = xasprintf("import of tar archive %s", path);
		}
	} else {
		r = cap_err_set(err, EINVAL, "cannot import %s: not a directory or a file", path);
	}
	if (r == 0 && tree == stage && report->dropped && progress) {
		_cleanup_free_ char *sum = cap_import_report_summary(report);
		_cleanup_free_ char *msg = xasprintf("%s (the guest's /dev provides devices)", sum);
		progress(ud, msg);
	}
	if (r == 0) {
		struct cap_import_opts t = *o;
		if (!t.source)
			t.source = source;
		r = cap_store_image_from_tree(tree, &t, out, report, err);
	}
	cap_remove_tree(work);
	return r;
}

int cap_store_oci_layers(const char *dir, char ***layers, size_t *n, struct cap_err *err)
{
	return oci_layers(dir, layers, n, err);
}

int cap_store_docker_layers(const char *dir, char ***layers, size_t *n, struct cap_err *err)
{
	return docker_layers(dir, layers, n, err);
}
