/* Building the named images: "base" (the busybox root capsule boots into
 * by default), and from this machine's Debian mirror "python" (minbase
 * with python3-minimal) and "docker" (minbase with Debian's docker.io). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "paths.h"
#include "store-internal.h"
#include "store.h"
#include "util.h"

static int put_file(const char *root, const char *rel, const void *data,
		    size_t len, unsigned mode)
{
	_cleanup_free_ char *p = xasprintf("%s/%s", root, rel);
	_cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
	if (fd < 0)
		return -errno;
	if (fchmod(fd, mode) < 0)
		return -errno;
	return cap_write_all(fd, data, len);
}

static int stage_base(const char *root, struct cap_err *err)
{
	static const char *const dirs[] = {
		"bin", "dev", "etc", "proc", "root", "run", "sbin", "source",
		"sys", "tmp", "usr", "usr/bin", "usr/sbin", "var", "var/tmp", "work",
	};
	int r;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(dirs); i++) {
		_cleanup_free_ char *d = xasprintf("%s/%s", root, dirs[i]);
		if (mkdir(d, 0755) < 0 && errno != EEXIST)
			return cap_err_set(err, errno, "mkdir %s: %s", d, strerror(errno));
	}
	_cleanup_free_ char *tmp = xasprintf("%s/tmp", root);
	_cleanup_free_ char *vartmp = xasprintf("%s/var/tmp", root);
	_cleanup_free_ char *rootdir = xasprintf("%s/root", root);
	chmod(tmp, 01777);
	chmod(vartmp, 01777);
	chmod(rootdir, 0700);

	char *bb = NULL;
	ssize_t n = cap_read_file(CAP_BUSYBOX, 64u << 20, &bb);
	if (n < 0)
		return cap_err_set(err, (int)-n, "cannot read %s: %s (install busybox-static)", CAP_BUSYBOX, strerror((int)-n));
	r = put_file(root, "bin/busybox", bb, (size_t)n, 0755);
	free(bb);
	if (r < 0 || (r = put_file(root, "etc/passwd", cap_store_passwd, strlen(cap_store_passwd), 0644)) < 0 ||
	    (r = put_file(root, "etc/group", cap_store_group, strlen(cap_store_group), 0644)) < 0 ||
	    (r = put_file(root, "etc/hostname", "capsule\n", 8, 0644)) < 0)
		return cap_err_set(err, -r, "cannot write into %s: %s", root, strerror(-r));

	_cleanup_free_ char *list = NULL;
	if ((r = cap_store_busybox_applets(CAP_BUSYBOX, &list, err)) < 0)
		return r;
	char *tok_save = NULL;
	for (char *tok = strtok_r(list, "\n", &tok_save); tok; tok = strtok_r(NULL, "\n", &tok_save)) {
		while (*tok == '/')
			tok++;
		if (!*tok || strcmp(tok, "bin/busybox") == 0 || strstr(tok, ".."))
			continue;
		_cleanup_free_ char *l = xasprintf("%s/%s", root, tok);
		if (symlink("/bin/busybox", l) < 0 && errno != EEXIST)
			return cap_err_set(err, errno, "symlink %s: %s", l, strerror(errno));
	}
	return 0;
}

/* Value of field name in one deb822 stanza (first line only), or NULL. */
static const char *field(const char *stanza, const char *end, const char *name,
			 char *buf, size_t len)
{
	size_t nl = strlen(name);
	for (const char *p = stanza; p && p < end; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
		if (strncmp(p, name, nl) == 0 && p[nl] == ':') {
			const char *v = p + nl + 1;
			while (*v == ' ' || *v == '\t')
				v++;
			size_t k = strcspn(v, "\n");
			if (k >= len)
				k = len - 1;
			memcpy(buf, v, k);
			buf[k] = '\0';
			return buf;
		}
	}
	return NULL;
}

static bool has_word(const char *list, const char *word)
{
	size_t wl = strlen(word);
	for (const char *p = list; *p;) {
		p += strspn(p, " \t");
		size_t k = strcspn(p, " \t");
		if (k == wl && strncmp(p, word, wl) == 0)
			return true;
		p += k;
	}
	return false;
}

/* The first http(s) URI of a "Types: deb" stanza whose Suites name the
 * release itself (not -updates or -security). */
static bool deb822_find(const char *text, const char *codename, char **mirror)
{
	const char *st = text;
	while (st && *st) {
		const char *end = strstr(st, "\n\n");
		if (!end)
			end = st + strlen(st);
		char types[128], uris[512], suites[256];
		if (field(st, end, "Types", types, sizeof(types)) && has_word(types, "deb") &&
		    field(st, end, "URIs", uris, sizeof(uris)) &&
		    field(st, end, "Suites", suites, sizeof(suites)) && has_word(suites, codename) &&
		    strncmp(uris, "http", 4) == 0) {
			uris[strcspn(uris, " \t")] = '\0';
			*mirror = xstrdup(uris);
			return true;
		}
		st = *end ? end + 2 : NULL;
	}
	return false;
}

/* The Debian mirror and suite this machine installs from, read from its
 * apt sources (never written into the project). */
static int apt_mirror(char **mirror, char **suite, struct cap_err *err)
{
	char *os = NULL;
	char codename[64] = "";
	if (cap_read_file("/etc/os-release", 65536, &os) >= 0) {
		char *p = strstr(os, "VERSION_CODENAME=");
		if (p)
			sscanf(p + 17, "%63[a-z]", codename);
		free(os);
	}
	if (!*codename)
		return cap_err_set(err, ENOENT, "cannot tell the Debian release from /etc/os-release (VERSION_CODENAME)");

	/* deb822 .sources files first, then the one-line format. */
	DIR *d = opendir("/etc/apt/sources.list.d");
	struct dirent *e;
	while (d && (e = readdir(d))) {
		size_t l = strlen(e->d_name);
		if (l < 9 || strcmp(e->d_name + l - 8, ".sources") != 0)
			continue;
		_cleanup_free_ char *path = xasprintf("/etc/apt/sources.list.d/%s", e->d_name);
		_cleanup_free_ char *text = NULL;
		if (cap_read_file(path, 1u << 20, &text) < 0)
			continue;
		if (deb822_find(text, codename, mirror)) {
			*suite = xstrdup(codename);
			closedir(d);
			return 0;
		}
	}
	if (d)
		closedir(d);
	char *list = NULL;
	if (cap_read_file("/etc/apt/sources.list", 1u << 20, &list) >= 0) {
		char *ln_save = NULL;
		for (char *ln = strtok_r(list, "\n", &ln_save); ln; ln = strtok_r(NULL, "\n", &ln_save)) {
			char uri[512], s[64];
			if (sscanf(ln, "deb %511s %63s", uri, s) == 2 && uri[0] != '[' &&
			    strcmp(s, codename) == 0) {
				*mirror = xstrdup(uri);
				*suite = xstrdup(codename);
				free(list);
				return 0;
			}
		}
		free(list);
	}
	return cap_err_set(err, ENOENT, "no Debian mirror for '%s' in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list", codename);
}

/* The images debootstrap makes: minbase and the packages named, then the
 * files the image needs of capsule's own. */
struct recipe {
	const char *name;
	const char *include;	/* debootstrap --include= */
	const char *takes;	/* for the progress line */
	int (*finish)(const char *root, struct cap_err *err);
};

/* dockerd keeps its images and containers on /work (ext4: an overlay2
 * upper layer cannot be on the overlay root), so they stay from one start
 * to the next; capsule-dockerd starts it in a --root sandbox's session. */
static const char docker_daemon_json[] = "{\n  \"data-root\": \"/work/.docker\"\n}\n";
static const char docker_start_sh[] =
	"#!/bin/sh\n"
	"# capsule-dockerd: start dockerd for this session unless one answers\n"
	"# already, and wait until it does (docs/coding-agents.md, \"Docker inside\").\n"
	"# Its log is /tmp/dockerd.log; it ends with the command that started it.\n"
	"if docker info >/dev/null 2>&1; then exit 0; fi\n"
	"if [ \"$(id -u)\" != 0 ]; then\n"
	"\techo 'capsule-dockerd: dockerd needs root in the guest: make the sandbox with --root' >&2\n"
	"\texit 1\n"
	"fi\n"
	"dockerd >/tmp/dockerd.log 2>&1 &\n"
	"pid=$!\n"
	"i=0\n"
	"until docker info >/dev/null 2>&1; do\n"
	"\tif ! kill -0 \"$pid\" 2>/dev/null || [ \"$i\" -ge 600 ]; then\n"
	"\t\techo 'capsule-dockerd: dockerd did not start; the end of /tmp/dockerd.log:' >&2\n"
	"\t\ttail -n 15 /tmp/dockerd.log >&2\n"
	"\t\texit 1\n"
	"\tfi\n"
	"\ti=$((i + 1))\n"
	"\tsleep 0.2\n"
	"done\n";

static int finish_docker(const char *root, struct cap_err *err)
{
	_cleanup_free_ char *etc = xasprintf("%s/etc/docker", root);
	int r = cap_mkdir_p(etc, 0755);
	if (r == 0)
		r = put_file(root, "etc/docker/daemon.json", docker_daemon_json, sizeof(docker_daemon_json) - 1, 0644);
	if (r == 0)
		r = put_file(root, "usr/local/bin/capsule-dockerd", docker_start_sh, sizeof(docker_start_sh) - 1, 0755);
	return r < 0 ? cap_err_set(err, -r, "cannot write the docker image's files into %s: %s", root, strerror(-r)) : 0;
}

static const struct recipe recipes[] = {
	{ "python", "python3-minimal", "about a minute", NULL },
	{ "docker", "docker.io,iptables,ca-certificates", "a few minutes", finish_docker },
};

static int stage_debootstrap(const struct recipe *rc, const char *root, cap_progress_fn progress, void *ud,
			     char **source, struct cap_err *err)
{
	_cleanup_free_ char *mirror = NULL, *suite = NULL;
	int r;
	if (geteuid() != 0)
		return cap_err_set(err, EPERM, "building the %s image runs debootstrap, which needs root; run `sudo capsule image build %s`",
				   rc->name, rc->name);
	if ((r = apt_mirror(&mirror, &suite, err)) < 0)
		return r;
	_cleanup_free_ char *include = xasprintf("--include=%s", rc->include);
	char *argv[] = { "debootstrap", "--variant=minbase", include, suite, (char *)root, mirror, NULL };
	if (progress) {
		char msg[700];
		snprintf(msg, sizeof(msg), "debootstrap --variant=minbase %s %s from %s (%s)", include, suite, mirror,
			 rc->takes);
		progress(ud, msg);
	}
	/* debootstrap's own lines are details of this one phase. */
	struct cap_progress_relay relay = { progress, ud };
	if ((r = cap_run(argv, cap_progress_relay_line, &relay, err)) < 0)
		return r;
	/* Package caches are not part of a root file system. */
	static const char *const caches[] = { "var/cache/apt/archives", "var/lib/apt/lists" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(caches); i++) {
		_cleanup_free_ char *d = xasprintf("%s/%s", root, caches[i]);
		DIR *dd = opendir(d);
		struct dirent *e;
		while (dd && (e = readdir(dd)))
			if (e->d_type == DT_REG)
				unlinkat(dirfd(dd), e->d_name, 0);
		if (dd)
			closedir(dd);
	}
	static const char *const mnt[] = { "work", "source" };
	for (size_t i = 0; i < CAP_ARRAY_SIZE(mnt); i++) {
		_cleanup_free_ char *d = xasprintf("%s/%s", root, mnt[i]);
		mkdir(d, 0755);
	}
	if (rc->finish && (r = rc->finish(root, err)) < 0)
		return r;
	*source = xasprintf("debootstrap --variant=minbase %s %s", include, suite);
	return 0;
}

int cap_store_image_build(const char *which, cap_progress_fn progress,
			  void *ud, struct cap_image *out, struct cap_err *err)
{
	bool base = strcmp(which, "base") == 0;
	const struct recipe *rc = NULL;
	for (size_t i = 0; i < CAP_ARRAY_SIZE(recipes) && !rc; i++)
		if (strcmp(which, recipes[i].name) == 0)
			rc = &recipes[i];
	if (!base && !rc)
		return cap_err_set(err, EINVAL, "no recipe for image '%s'; capsule can build 'base', 'python' and 'docker' (or use `capsule image import`)", which);

	_cleanup_free_ char *images = cap_store_images_dir();
	int r = cap_mkdir_p(images, 0755);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", images, strerror(-r));
	/* The root is staged below a temporary directory whose lock says it
	 * is in use (a killed build's is swept by the next one), so that
	 * the lock file is not part of the image. */
	_cleanup_free_ char *tmp = NULL;
	_cleanup_close_ int lock = cap_store_tmpdir(images, "tmp-stage", &tmp, err);
	if (lock < 0)
		return lock;
	_cleanup_free_ char *stage = xasprintf("%s/root", tmp);
	if (mkdir(stage, 0755) < 0) {
		r = cap_err_set(err, errno, "cannot create the staging directory %s: %s", stage, strerror(errno));
		cap_remove_tree(tmp);
		return r;
	}

	_cleanup_free_ char *source = NULL;
	if (base) {
		if (progress)
			progress(ud, "staging the busybox root");
		r = stage_base(stage, err);
		source = xstrdup("capsule image build base (busybox-static)");
	} else {
		r = stage_debootstrap(rc, stage, progress, ud, &source, err);
	}
	if (r == 0)
		r = cap_store_image_from_dir(stage, which, source, progress, ud, out, err);
	int k = cap_remove_tree(tmp);
	if (r == 0 && k < 0)
		r = cap_err_set(err, -k, "cannot remove the staging directory %s: %s", tmp, strerror(-k));
	return r;
}

int cap_store_image_ensure(const char *ref, cap_progress_fn progress, void *ud,
			   struct cap_image *out, struct cap_err *err)
{
	int r = cap_store_image_find(ref, out, err);
	if (r != -ENOENT || strcmp(ref, "base") != 0)
		return r;
	if (progress)
		progress(ud, "the base image is not built yet; building it now (busybox, about a second)");
	if (err)
		*err = (struct cap_err){ 0 };
	return cap_store_image_build("base", progress, ud, out, err);
}
