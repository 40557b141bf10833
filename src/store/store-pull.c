/* Pulling images from registries: references are normalized as Docker
 * does, the copy is skopeo's (the containers ecosystem's own resolver,
 * auth files, mirrors and digest checks: `skopeo copy docker://REF
 * oci:DIR`), and the OCI layout it writes goes through the import path
 * like any other. skopeo runs from argv built here, never a shell. */
#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "paths.h"
#include "sha256.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

#define PULL_TIMEOUT_S 1800
#define TAIL 6
#define SKOPEO_SAID "it failed; skopeo said:"
#define DIGEST_MISMATCH "the registry sent bytes that do not match the digest: refused, nothing was imported. Check the digest, or the registry (a mirror or proxy serving other content)"

void cap_image_ref_fini(struct cap_image_ref *ref)
{
	free(ref->owned_repo);
	free(ref->owned_tag);
	free(ref->owned_digest);
	free(ref->owned_full);
	free(ref->owned_host);
	memset(ref, 0, sizeof(*ref));
}

static bool is_digest(const char *s)
{
	return strncmp(s, "sha256:", 7) == 0 && strlen(s) == 71 &&
	       strspn(s + 7, "0123456789abcdef") == 64;
}

/* A repository path: components of [a-z0-9] separated by '.', '_', '__'
 * or '-' runs, joined by '/'. */
static bool path_valid(const char *p)
{
	if (!*p)
		return false;
	for (const char *c = p; *c; c++) {
		bool alnum = islower((unsigned char)*c) || isdigit((unsigned char)*c);
		bool sep = *c == '.' || *c == '_' || *c == '-' || *c == '/';
		if (!alnum && !sep)
			return false;
		bool at_start = c == p || c[-1] == '/';
		bool at_end = c[1] == '\0' || c[1] == '/';
		if (sep && (at_start || at_end))
			return false;
	}
	return true;
}

static bool tag_valid(const char *t)
{
	size_t n = strlen(t);
	if (n == 0 || n > 128 || !(isalnum((unsigned char)t[0]) || t[0] == '_'))
		return false;
	for (size_t i = 0; i < n; i++)
		if (!(isalnum((unsigned char)t[i]) || t[i] == '_' || t[i] == '.' || t[i] == '-'))
			return false;
	return true;
}

/* A registry host, lowercased in place: DNS labels or an IPv4 address,
 * then an optional :PORT. */
static bool host_valid(char *h)
{
	for (char *c = h; *c; c++)
		*c = (char)tolower((unsigned char)*c);
	char *port = strchr(h, ':');
	size_t hl = port ? (size_t)(port - h) : strlen(h);
	if (port) {
		char *end;
		errno = 0;
		unsigned long v = strtoul(port + 1, &end, 10);
		if (!isdigit((unsigned char)port[1]) || *end || errno || v == 0 || v > 65535)
			return false;
	}
	if (hl == 0 || hl > 253)
		return false;
	size_t label = 0;
	for (size_t i = 0; i <= hl; i++) {
		char c = i < hl ? h[i] : '.';
		if (c == '.') {
			if (label == 0 || label > 63 || h[i - 1] == '-')
				return false;
			label = 0;
		} else if (islower((unsigned char)c) || isdigit((unsigned char)c) || (c == '-' && label > 0)) {
			label++;
		} else {
			return false;
		}
	}
	return true;
}

/* The bytes a reference takes as a link name in images/refs. */
static size_t link_name_len(const char *full)
{
	size_t n = 0;
	for (const char *c = full; *c; c++)
		n += *c == '/' || *c == '%' ? 3 : 1;
	return n;
}

int cap_store_ref_parse(const char *ref, struct cap_image_ref *out,
			struct cap_err *err)
{
	if (strncmp(ref, "docker://", 9) == 0)
		ref += 9;
	size_t len = strlen(ref);
	if (len == 0 || len > 255)
		return cap_err_set(err, EINVAL, "a registry reference is 1 to 255 characters, like registry.example.com/org/image:tag");
	_cleanup_free_ char *s = xstrdup(ref);
	char *digest = NULL, *tag = NULL;
	char *at = strchr(s, '@');
	if (at) {
		*at = '\0';
		digest = at + 1;
		if (!is_digest(digest))
			return cap_err_set(err, EINVAL, "'%s' in '%s' is not a digest: sha256: and 64 lowercase hex digits", digest, ref);
	}
	char *slash = strrchr(s, '/');
	char *colon = strrchr(slash ? slash : s, ':');
	if (colon) {
		*colon = '\0';
		tag = colon + 1;
		if (!tag_valid(tag))
			return cap_err_set(err, EINVAL, "'%s' in '%s' is not a tag: up to 128 of letters, digits, '_', '.', '-'", tag, ref);
	}
	/* The first component names a registry when it looks like a host. */
	const char *domain = "docker.io", *path = s;
	char *first = strchr(s, '/');
	if (s[0] == '[')
		return cap_err_set(err, EINVAL, "'%s': IPv6 address hosts are not supported (skopeo cannot pull from them); use a host name or an IPv4 address", ref);
	if (first && (memchr(s, '.', (size_t)(first - s)) || memchr(s, ':', (size_t)(first - s)) ||
		      strncasecmp(s, "localhost/", 10) == 0)) {
		*first = '\0';
		domain = s;
		path = first + 1;
		if (!host_valid(s))
			return cap_err_set(err, EINVAL, "'%s' in '%s' is not a registry host: a DNS name (letters, digits, '-' inside dot-separated labels) or an IPv4 address, with an optional :PORT",
					   domain, ref);
		if (strcmp(domain, "index.docker.io") == 0 || strcmp(domain, "registry-1.docker.io") == 0)
			domain = "docker.io";
	}
	if (!path_valid(path))
		return cap_err_set(err, EINVAL, "'%s'%s%s%s is not a repository: lowercase letters, digits and '.', '_', '-' between them, parts joined by '/'",
				   path, strcmp(path, ref) ? " in '" : "", strcmp(path, ref) ? ref : "", strcmp(path, ref) ? "'" : "");
	bool library = strcmp(domain, "docker.io") == 0 && !strchr(path, '/');
	char *repo = xasprintf("%s/%s%s", domain, library ? "library/" : "", path);
	if (!tag && !digest)
		tag = "latest";
	_cleanup_free_ char *full = xasprintf("%s%s%s%s%s", repo, tag ? ":" : "", tag ? tag : "",
					      digest ? "@" : "", digest ? digest : "");
	size_t ln = link_name_len(full);
	if (ln > 255) {
		free(repo);
		return cap_err_set(err, EINVAL, "'%s' is too long: as %s it takes %zu bytes as a file name ('/' counts 3), over the limit of 255; use a shorter repository or tag",
				   ref, full, ln);
	}
	/* The host without its port. */
	char *host = xstrdup(domain);
	char *port = strchr(host, ':');
	if (port)
		*port = '\0';
	*out = (struct cap_image_ref){
		.owned_repo = repo,
		.owned_tag = tag ? xstrdup(tag) : NULL,
		.owned_digest = digest ? xstrdup(digest) : NULL,
		.owned_full = xstrdup(full),
		.owned_host = host,
	};
	return 0;
}

bool cap_store_ref_loopback(const char *host)
{
	struct in_addr a4;
	if (strcasecmp(host, "localhost") == 0)
		return true;
	return inet_pton(AF_INET, host, &a4) == 1 && (ntohl(a4.s_addr) >> 24) == 127;
}

struct watch;
static void watch_line(struct watch *w, const char *line);
static bool watching(const struct watch *w);

/* skopeo's lines: passed on as progress, the last ones kept for errors. */
struct lines {
	cap_progress_fn progress;
	void *ud;
	char tail[TAIL][512];
	int n;
	struct watch *watch;	/* told of each line, or NULL */
};

/* skopeo's fatal line is logrus's `time="..." level=fatal msg="..."`:
 * keep the message, unquoted. */
static void unlog(const char *line, char *out, size_t len)
{
	const char *m = strstr(line, "msg=\"");
	if (!m || strncmp(line, "time=", 5) != 0) {
		snprintf(out, len, "%s", line);
		return;
	}
	size_t k = 0;
	for (m += 5; *m && k + 1 < len; m++) {
		if (m[0] == '\\' && m[1]) {
			out[k++] = *++m;
			continue;
		}
		if (m[0] == '"' && m[1] == '\0')
			break;
		out[k++] = *m;
	}
	out[k] = '\0';
}

static void on_line(void *ud, const char *line)
{
	struct lines *l = ud;
	char clean[512];
	unlog(line, clean, sizeof(clean));
	snprintf(l->tail[l->n % TAIL], sizeof(l->tail[0]), "%s", clean);
	l->n++;
	if (l->watch)
		watch_line(l->watch, line);
	if (l->progress && strncmp(line, "time=", 5) != 0) {
		if (l->watch && watching(l->watch)) {
			/* The layers' bytes say more: skopeo's lines are details. */
			_cleanup_free_ char *d = xasprintf(CAP_PROGRESS_DETAIL "%s", line);
			l->progress(l->ud, d);
		} else {
			l->progress(l->ud, line);
		}
	}
}

static bool tail_has(const struct lines *l, const char *what)
{
	for (int i = l->n > TAIL ? l->n - TAIL : 0; i < l->n; i++)
		if (strcasestr(l->tail[i % TAIL], what))
			return true;
	return false;
}

/* What to do about a failed copy, from skopeo's reason. *code is set to
 * the errno that fits. */
static const char *advice(const struct lines *l, const struct cap_image_ref *r,
			  bool insecure, int *code)
{
	*code = EIO;
	if (tail_has(l, "does not match") || tail_has(l, "digest did not match") ||
	    tail_has(l, "digest mismatch") || tail_has(l, "manifest does not match")) {
		*code = EBADMSG;
		return DIGEST_MISMATCH;
	}
	if (tail_has(l, "i/o timeout") || tail_has(l, "deadline exceeded") || tail_has(l, "did not end in time")) {
		*code = ETIMEDOUT;
		return "the registry did not answer in time: check the host and port in the reference, that the registry runs, and HTTPS_PROXY/NO_PROXY if a proxy is needed; or give a longer --timeout";
	}
	if (tail_has(l, "connection refused") || tail_has(l, "no such host") ||
	    tail_has(l, "network is unreachable") || tail_has(l, "no route to host") ||
	    tail_has(l, "server misbehaving") || tail_has(l, "temporary failure in name resolution")) {
		*code = EHOSTUNREACH;
		return "the registry cannot be reached: check the host and port in the reference, that the registry runs, and HTTPS_PROXY/NO_PROXY if a proxy is needed";
	}
	if (tail_has(l, "unauthorized") || tail_has(l, "authentication required") ||
	    tail_has(l, "requested access to the resource is denied")) {
		*code = EACCES;
		return "the registry wants credentials, or the repository does not exist: log in with `skopeo login HOST` (or podman/docker login; skopeo reads ${XDG_RUNTIME_DIR}/containers/auth.json and ~/.docker/config.json), and check the name";
	}
	if (tail_has(l, "manifest unknown") || tail_has(l, "not found") || tail_has(l, "name unknown")) {
		*code = ENOENT;
		return r->owned_digest ? "the registry has no manifest with that digest (a digest the registry does not have, or a mistyped one): check it, or pull by tag"
				       : "the registry has no such repository or tag: check the name and tag";
	}
	if (tail_has(l, "no image found in manifest list for architecture") ||
	    tail_has(l, "choosing image instance")) {
		*code = ENOENT;
		return "the image has no build for the platform asked for: see --platform";
	}
	if (tail_has(l, "x509") || tail_has(l, "http response to https client") || tail_has(l, "tls")) {
		*code = EPROTO;
		return insecure ? "TLS failed even without verification; check the registry's address and port"
				: "the registry does not speak verified HTTPS: if you trust the network path to it, pass --insecure";
	}
	if (tail_has(l, "policy"))
		return "skopeo's signature policy refused the image: see /etc/containers/policy.json (or ~/.config/containers/policy.json)";
	return SKOPEO_SAID;
}

/* Read a blob of the layout whose digest is digest, checked; JSON. */
static json_t *layout_json(const char *layout, const char *digest, struct cap_err *err)
{
	if (!digest || !is_digest(digest)) {
		cap_err_set(err, EBADMSG, "%s/index.json names no valid digest; skopeo wrote an unexpected layout", layout);
		return NULL;
	}
	_cleanup_free_ char *p = cap_store_oci_blob(layout, digest, err);
	if (!p)
		return NULL;
	json_error_t je;
	json_t *j = json_load_file(p, 0, &je);
	if (!j)
		cap_err_set(err, EBADMSG, "blob %s in %s is not JSON: %s", digest, layout, je.text);
	return j;
}

/* The platform's manifest digest skopeo wrote into the layout, checked
 * against the platform asked for. *out is a new string. */
static int layout_manifest(const char *layout, const char *os, const char *arch,
			   char **out, struct cap_err *err)
{
	_cleanup_free_ char *ipath = xasprintf("%s/index.json", layout);
	json_t *index = json_load_file(ipath, 0, NULL);
	json_t *m0 = json_array_get(json_object_get(index, "manifests"), 0);
	const char *digest = json_string_value(json_object_get(m0, "digest"));
	const char *mt = json_string_value(json_object_get(m0, "mediaType"));
	int r = 0;
	if (!digest || (mt && strstr(mt, "index"))) {
		r = cap_err_set(err, EBADMSG, "%s does not name one image manifest; skopeo wrote an unexpected layout", ipath);
		goto out;
	}
	json_t *man = layout_json(layout, digest, err);
	if (!man) {
		r = -EBADMSG;
		goto out;
	}
	const char *cd = json_string_value(json_object_get(json_object_get(man, "config"), "digest"));
	json_t *cfg = layout_json(layout, cd, err);
	json_decref(man);
	if (!cfg) {
		r = -EBADMSG;
		goto out;
	}
	const char *cos = json_string_value(json_object_get(cfg, "os"));
	const char *carch = json_string_value(json_object_get(cfg, "architecture"));
	if ((cos && strcmp(cos, os) != 0) || (carch && strcmp(carch, arch) != 0))
		r = cap_err_set(err, ENOEXEC, "the image is for %s/%s, not %s/%s: it would not run here; pick another tag or --platform",
				cos ? cos : "?", carch ? carch : "?", os, arch);
	json_decref(cfg);
	if (r == 0)
		*out = xstrdup(digest);
out:
	json_decref(index);
	return r;
}

/* The error of a failed skopeo run: "WHAT: advice" and skopeo's last
 * lines (or, when it printed none, why it could not run: rerr). */
static int skopeo_failed(const struct lines *l, const struct cap_image_ref *pr, bool insecure,
			 const struct cap_err *rerr, const char *what, struct cap_err *err)
{
	int code;
	const char *adv = advice(l, pr, insecure, &code);
	char tail[700] = "";
	size_t used = 0;
	int first = l->n > 3 ? l->n - 3 : 0;
	for (int i = first; i < l->n && used < sizeof(tail) - 1; i++)
		used += (size_t)snprintf(tail + used, sizeof(tail) - used, "\n  %s%.300s",
					 strcmp(adv, SKOPEO_SAID) ? "skopeo: " : "", l->tail[i % TAIL]);
	if (l->n == 0)
		snprintf(tail, sizeof(tail), "\n  %.600s", rerr->msg);
	if (rerr->code == ETIMEDOUT)
		code = ETIMEDOUT;
	return cap_err_set(err, code, "%s: %s%s", what, adv, tail);
}

char *cap_store_bytes_digest(const struct cap_buf *b)
{
	struct cap_sha256 h;
	char hex[65];
	cap_sha256_init(&h);
	cap_sha256_update(&h, cap_buf_head(b), cap_buf_used(b));
	cap_sha256_final_hex(&h, hex);
	return xasprintf("sha256:%s", hex);
}

bool cap_store_bytes_match(const struct cap_buf *b, const char *digest)
{
	_cleanup_free_ char *d = cap_store_bytes_digest(b);
	return strcmp(d, digest) == 0;
}

int cap_store_skopeo_raw(const struct cap_image_ref *pr, const char *src, bool config, bool plain,
			 bool insecure, unsigned timeout_s, int64_t deadline_ms, const char *what,
			 struct cap_buf *out, struct cap_err *err)
{
	_cleanup_free_ char *skopeo = cap_find_program("skopeo");
	if (!skopeo)
		return cap_err_set(err, ENOENT, "%s: skopeo is not installed, and capsule reads registries through it: apt-get install skopeo",
				   what);
	if (deadline_ms) {
		/* skopeo gets the time left, rounded up; it is killed half a
		 * second after, should it not have ended itself. */
		int64_t left = deadline_ms - cap_monotonic_ms();
		timeout_s = left > 0 ? (unsigned)((left + 999) / 1000) : 1;
		deadline_ms += 500;
	}
	_cleanup_free_ char *timeout = xasprintf("%us", timeout_s);
	const char *argv[12] = { skopeo, "--command-timeout", timeout, "inspect", "--raw", "--retry-times", "0" };
	size_t k = 7;
	if (config)
		argv[k++] = "--config";
	if (plain)
		argv[k++] = "--tls-verify=false";
	argv[k++] = src;
	argv[k] = NULL;
	struct cap_buf eout;
	struct cap_err rerr = { 0 };
	struct lines lines = { 0 };
	int status = 0;
	cap_buf_init(&eout);
	int r = cap_run_capture_until((char *const *)argv, out, CAP_REG_DOC_MAX + 1, &eout, &status, deadline_ms, &rerr);
	if (r == -ETIMEDOUT || (r == 0 && !(WIFEXITED(status) && WEXITSTATUS(status) == 0))) {
		/* Its stderr as lines, for the reason and the advice. */
		cap_buf_append(&eout, "\n", 2);
		char *text = (char *)eout.owned_data, *save = NULL;
		for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
			on_line(&lines, line);
		if (r == -ETIMEDOUT)
			on_line(&lines, rerr.msg);
		r = skopeo_failed(&lines, pr, insecure, &rerr, what, err);
	} else if (r < 0) {
		r = cap_err_set(err, -r, "%s: %s", what, rerr.msg);
	} else if (cap_buf_used(out) == 0) {
		r = cap_err_set(err, EIO, "%s: skopeo inspect --raw %s printed nothing", what, src);
	} else if (cap_buf_used(out) > CAP_REG_DOC_MAX) {
		r = cap_err_set(err, E2BIG, "%s: the registry sent over %d bytes for %s", what, CAP_REG_DOC_MAX, src);
	}
	cap_buf_fini(&eout);
	return r;
}

/* --- progress: the layers' bytes, from the files skopeo writes ------- */

/* skopeo writes each blob it copies to a temporary file in the layout
 * (oci-put-blob*), renamed to blobs/sha256/<hex> once complete; it prints
 * "Copying blob sha256:<hex>" as each starts (several run at once).
 * The manifest gives each layer's size. A new temporary file is taken
 * to be the blob started earliest that has none yet. */
struct watch {
	struct cap_reg_manifest m;	/* the platform's; no layers: nothing told */
	const char *layout;
	cap_progress_fn progress;
	void *ud;
	size_t *order;	/* layers as they started */
	size_t nstarted;
	char (*temp)[64];	/* each layer's temporary file name, "" */
	uint64_t *bytes;
	bool *done, *told;	/* complete; its completion told */
	char last[1024];
};

static bool watching(const struct watch *w)
{
	return w->order != NULL;
}

static void watch_init(struct watch *w)
{
	size_t n = w->m.n_layers;
	w->order = xcalloc(n + 1, sizeof(*w->order));
	w->temp = xcalloc(n + 1, sizeof(*w->temp));
	w->bytes = xcalloc(n + 1, sizeof(*w->bytes));
	w->done = xcalloc(n + 1, sizeof(*w->done));
	w->told = xcalloc(n + 1, sizeof(*w->told));
}

static void watch_fini(struct watch *w)
{
	free(w->order);
	free(w->temp);
	free(w->bytes);
	free(w->done);
	free(w->told);
	cap_reg_manifest_fini(&w->m);
}

static void watch_line(struct watch *w, const char *line)
{
	const char *d = strstr(line, "Copying blob sha256:");
	if (!d || !w->order)
		return;
	d += strlen("Copying blob ");
	for (size_t i = 0; i < w->m.n_layers; i++)
		if (strncmp(w->m.owned_layers[i].digest, d, 71) == 0) {
			for (size_t k = 0; k < w->nstarted; k++)
				if (w->order[k] == i)
					return;
			w->order[w->nstarted++] = i;
			return;
		}
}

static void human(uint64_t b, char *buf, size_t n)
{
	if (b >= 1048576)
		snprintf(buf, n, "%.1f MiB", (double)b / 1048576.0);
	else if (b >= 1024)
		snprintf(buf, n, "%.1f KiB", (double)b / 1024.0);
	else
		snprintf(buf, n, "%llu B", (unsigned long long)b);
}

/* The temporary file taken for no layer yet, or NULL. */
static bool temp_taken(const struct watch *w, const char *name)
{
	for (size_t i = 0; i < w->m.n_layers; i++)
		if (strcmp(w->temp[i], name) == 0)
			return true;
	return false;
}

static void watch_tick(void *ud)
{
	struct watch *w = ud;
	if (!w->order || !w->progress)
		return;
	_cleanup_free_ char *blobs = xasprintf("%s/blobs/sha256", w->layout);
	for (size_t i = 0; i < w->m.n_layers; i++) {
		if (w->done[i])
			continue;
		_cleanup_free_ char *p = xasprintf("%s/%s", blobs, w->m.owned_layers[i].digest + 7);
		struct stat st;
		if (stat(p, &st) == 0) {
			w->done[i] = true;
			w->bytes[i] = w->m.owned_layers[i].size;
		}
	}
	DIR *d = opendir(w->layout);
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strncmp(e->d_name, "oci-put-blob", 12) != 0 || strlen(e->d_name) >= 64)
			continue;
		struct stat st;
		if (fstatat(dirfd(d), e->d_name, &st, 0) < 0)
			continue;
		if (!temp_taken(w, e->d_name)) {
			for (size_t k = 0; k < w->nstarted; k++) {
				size_t i = w->order[k];
				if (!w->done[i] && !w->temp[i][0]) {
					snprintf(w->temp[i], sizeof(w->temp[i]), "%s", e->d_name);
					break;
				}
			}
		}
		for (size_t i = 0; i < w->m.n_layers; i++)
			if (!w->done[i] && strcmp(w->temp[i], e->d_name) == 0)
				w->bytes[i] = CAP_MIN((uint64_t)st.st_size, w->m.owned_layers[i].size);
	}
	if (d)
		closedir(d);
	/* One detail line: the layers under way and those just completed. */
	char line[1024];
	size_t used = 0;
	for (size_t k = 0; k < w->nstarted && used < sizeof(line) - 1; k++) {
		size_t i = w->order[k];
		if (w->told[i])
			continue;
		uint64_t size = w->m.owned_layers[i].size;
		char got[32], all[32];
		human(w->bytes[i], got, sizeof(got));
		human(size, all, sizeof(all));
		used += (size_t)snprintf(line + used, sizeof(line) - used, "%slayer %zu/%zu %.12s %s of %s %u%%",
					 used ? "; " : "", i + 1, w->m.n_layers, w->m.owned_layers[i].digest + 7, got, all,
					 size ? (unsigned)(w->bytes[i] * 100 / size) : 100u);
		if (w->done[i])
			w->told[i] = true;
	}
	if (used == 0 || strcmp(line, w->last) == 0)
		return;
	snprintf(w->last, sizeof(w->last), "%s", line);
	_cleanup_free_ char *detail = xasprintf(CAP_PROGRESS_DETAIL "%s", line);
	w->progress(w->ud, detail);
}

/* The platform's manifest, for the digest recorded and the layer sizes
 * progress is told against: raw itself, or the one an index names for
 * the platform (fetched by digest and checked). Best effort: a document
 * capsule cannot decode is skopeo's to copy or refuse (a schema 1
 * image), and then there is neither. */
static void platform_manifest(const struct cap_image_ref *pr, const struct cap_buf *raw,
			      const char *registry_digest, const char *os, const char *arch,
			      const char *variant, bool plain, const struct cap_pull_opts *o,
			      char **platform_digest, struct cap_reg_manifest *out)
{
	struct cap_reg_manifest m;
	struct cap_err e = { 0 };
	if (cap_reg_manifest_parse(cap_buf_head(raw), cap_buf_used(raw), &m, &e) < 0)
		return;
	if (!m.index) {
		*platform_digest = xstrdup(registry_digest);
		*out = m;
		return;
	}
	size_t which;
	int r = cap_reg_index_pick(&m, os, arch, variant, &which, &e);
	if (r == 0) {
		_cleanup_free_ char *src = xasprintf("docker://%s@%s", pr->owned_repo, m.owned_entries[which].digest);
		struct cap_buf b;
		cap_buf_init(&b);
		if (cap_store_skopeo_raw(pr, src, false, plain, o->insecure, o->timeout_s ? o->timeout_s : PULL_TIMEOUT_S,
					 0, "", &b, &e) == 0 &&
		    cap_store_bytes_match(&b, m.owned_entries[which].digest)) {
			struct cap_reg_manifest pm;
			if (cap_reg_manifest_parse(cap_buf_head(&b), cap_buf_used(&b), &pm, &e) == 0) {
				if (!pm.index) {
					*platform_digest = xstrdup(m.owned_entries[which].digest);
					*out = pm;
				} else {
					cap_reg_manifest_fini(&pm);
				}
			}
		}
		cap_buf_fini(&b);
	}
	cap_reg_manifest_fini(&m);
}

static bool policy_present(void)
{
	const char *home = getenv("HOME");
	if (home) {
		_cleanup_free_ char *p = xasprintf("%s/.config/containers/policy.json", home);
		if (access(p, R_OK) == 0)
			return true;
	}
	return access("/etc/containers/policy.json", R_OK) == 0;
}

int cap_store_image_pull(const char *ref, const struct cap_pull_opts *o,
			 struct cap_image *out, struct cap_import_report *report,
			 struct cap_err *err)
{
	struct cap_image_ref pr = { 0 };
	int r = cap_store_ref_parse(ref, &pr, err);
	if (r < 0)
		return r;
	if (o->name && !cap_store_image_name_valid(o->name)) {
		cap_image_ref_fini(&pr);
		return cap_err_set(err, EINVAL, "image name '%s' is not valid: 1 to 64 of a-z, 0-9, '.', '_', '-', starting with a letter or digit", o->name);
	}

	/* OS/ARCH[/VARIANT] */
	char os[32] = "linux", arch[32] = "amd64", variant[32] = "";
	if (o->platform) {
		char extra;
		int k = sscanf(o->platform, "%31[a-z0-9_]/%31[a-z0-9_]/%31[a-z0-9_]%c", os, arch, variant, &extra);
		if (k < 2 || k > 3 || strlen(o->platform) != strlen(os) + strlen(arch) + 1 + (k == 3 ? strlen(variant) + 1 : 0)) {
			cap_image_ref_fini(&pr);
			return cap_err_set(err, EINVAL, "platform '%s' is not OS/ARCH[/VARIANT], like linux/amd64 or linux/arm64/v8", o->platform);
		}
	}
	_cleanup_free_ char *skopeo = cap_find_program("skopeo");
	if (!skopeo) {
		cap_image_ref_fini(&pr);
		return cap_err_set(err, ENOENT, "skopeo is not installed, and capsule pulls images through it: apt-get install skopeo");
	}

	_cleanup_free_ char *images = cap_store_images_dir();
	if ((r = cap_mkdir_p(images, 0755)) < 0) {
		cap_image_ref_fini(&pr);
		return cap_err_set(err, -r, "cannot create %s: %s", images, strerror(-r));
	}
	_cleanup_free_ char *work = NULL;
	_cleanup_close_ int lock = cap_store_tmpdir(images, "tmp-pull", &work, err);
	if (lock < 0) {
		cap_image_ref_fini(&pr);
		return lock;
	}
	_cleanup_free_ char *layout = xasprintf("%s/layout", work);
	_cleanup_free_ char *sktmp = xasprintf("%s/tmp", work);
	_cleanup_free_ char *policy = xasprintf("%s/policy.json", work);
	_cleanup_free_ char *timeout = xasprintf("%us", o->timeout_s ? o->timeout_s : PULL_TIMEOUT_S);
	_cleanup_free_ char *registry_digest = NULL, *src = NULL, *oci_digest = NULL, *source = NULL;
	_cleanup_free_ char *platform_digest = NULL, *platform = NULL;
	struct watch watch = { .layout = layout, .progress = o->progress, .ud = o->ud };
	_cleanup_free_ char *dst = xasprintf("oci:%s:capsule", layout);
	bool plain = o->insecure || cap_store_ref_loopback(pr.owned_host);
	struct lines lines = { .progress = o->progress, .ud = o->ud, .watch = &watch };
	struct cap_err rerr = { 0 };
	mkdir(sktmp, 0700);

	if (o->progress) {
		_cleanup_free_ char *msg = xasprintf("pulling %s for %s/%s%s%s%s", pr.owned_full, os, arch,
						     *variant ? "/" : "", variant,
						     plain ? " (plain HTTP allowed, no TLS verification)" : "");
		o->progress(o->ud, msg);
	}
	/* Resolve a tag to the digest of the registry's bytes (a manifest
	 * or an index), then copy that digest: what is pulled is what was
	 * resolved, whatever the tag does meanwhile. A digest is read too:
	 * its platform's manifest gives the digest recorded for `image
	 * outdated` and the layer sizes progress is told against. */
	_cleanup_free_ char *what = xasprintf("cannot pull %s", pr.owned_full);
	struct cap_buf raw;
	cap_buf_init(&raw);
	/* skopeo takes a tag or a digest, not both: the digest then. */
	_cleanup_free_ char *tagged = pr.owned_digest ? xasprintf("docker://%s@%s", pr.owned_repo, pr.owned_digest)
						      : xasprintf("docker://%s", pr.owned_full);
	r = cap_store_skopeo_raw(&pr, tagged, false, plain, o->insecure, o->timeout_s ? o->timeout_s : PULL_TIMEOUT_S, 0,
				 what, &raw, err);
	if (r == 0 && pr.owned_digest) {
		/* A reference with a tag and a digest is fetched by the digest. */
		registry_digest = xstrdup(pr.owned_digest);
		if (!cap_store_bytes_match(&raw, registry_digest))
			r = cap_err_set(err, EBADMSG, "%s: %s", what, DIGEST_MISMATCH);
	} else if (r == 0) {
		registry_digest = cap_store_bytes_digest(&raw);
		if (o->progress) {
			_cleanup_free_ char *msg = xasprintf("%s is %s@%s", pr.owned_full, pr.owned_repo, registry_digest);
			o->progress(o->ud, msg);
		}
	}
	if (r == 0)
		platform_manifest(&pr, &raw, registry_digest, os, arch, variant, plain, o, &platform_digest, &watch.m);
	cap_buf_fini(&raw);
	if (r < 0)
		goto out;
	src = xasprintf("docker://%s@%s", pr.owned_repo, registry_digest);

	const char *argv[32];
	size_t k = 0;
	argv[k++] = skopeo;
	argv[k++] = "--command-timeout";
	argv[k++] = timeout;
	argv[k++] = "--tmpdir";
	argv[k++] = sktmp;
	argv[k++] = "--override-os";
	argv[k++] = os;
	argv[k++] = "--override-arch";
	argv[k++] = arch;
	if (*variant) {
		argv[k++] = "--override-variant";
		argv[k++] = variant;
	}
	if (!policy_present()) {
		/* No policy at all: skopeo refuses to run. Accept what the
		 * registry serves, as docker does (digests are still checked). */
		static const char accept[] = "{\"default\":[{\"type\":\"insecureAcceptAnything\"}]}\n";
		cap_write_file_atomic(policy, accept, strlen(accept), 0600);
		argv[k++] = "--policy";
		argv[k++] = policy;
	}
	argv[k++] = "copy";
	argv[k++] = "--retry-times";
	argv[k++] = "0";
	argv[k++] = "--remove-signatures";
	if (plain)
		argv[k++] = "--src-tls-verify=false";
	argv[k++] = src;
	argv[k++] = dst;
	argv[k] = NULL;

	if (watch.m.n_layers && !watch.m.index) {
		watch_init(&watch);
		if (o->progress) {
			char all[32];
			human(watch.m.layers_size, all, sizeof(all));
			_cleanup_free_ char *msg = xasprintf("fetching %zu layer%s, %s", watch.m.n_layers,
							     watch.m.n_layers == 1 ? "" : "s", all);
			o->progress(o->ud, msg);
		}
	}
	r = cap_run_tick((char *const *)argv, on_line, &lines, watch_tick, &watch, 100, &rerr);
	if (r < 0) {
		r = skopeo_failed(&lines, &pr, o->insecure, &rerr, what, err);
		goto out;
	}
	watch_tick(&watch);
	if ((r = layout_manifest(layout, os, arch, &oci_digest, err)) < 0) {
		cap_err_prefix(err, "pulled %s, but", pr.owned_full);
		goto out;
	}
	/* What the reference pinned, when that is not the manifest stored:
	 * an index, or a Docker manifest skopeo converted to OCI. */
	const char *pinned = pr.owned_digest && strcmp(pr.owned_digest, oci_digest) != 0 ? pr.owned_digest : NULL;
	platform = xasprintf("%s/%s%s%s", os, arch, *variant ? "/" : "", variant);
	source = xasprintf("pull of %s (%s)", pr.owned_full, platform);
	struct cap_import_opts io = {
		.name = o->name, .source = source, .reference = pr.owned_full,
		.oci_digest = oci_digest, .registry_digest = registry_digest, .pinned_digest = pinned,
		.platform_digest = platform_digest, .platform = platform,
		.progress = o->progress, .ud = o->ud,
	};
	r = cap_store_image_import_with(layout, &io, out, report, err);
out:
	watch_fini(&watch);
	cap_remove_tree(work);
	cap_image_ref_fini(&pr);
	return r;
}

int cap_store_layout_manifest(const char *layout, const char *os, const char *arch, char **out,
			      struct cap_err *err)
{
	return layout_manifest(layout, os, arch, out, err);
}
