/* The template cache: templates/<key>/{state, ram, meta.json}, a VM booted
 * once to the point where the agent is ready and nothing is mounted,
 * saved as the engine's device state plus its RAM file, and restored for
 * every new VM of the same shape instead of a boot (DESIGN §8). Only the
 * cache: key, lookup, staging and store, list and prune; booting and
 * saving one is sandbox-vm.c's. Per-sandbox disks sit in the template's
 * slots as sparse placeholders of PLACEHOLDER_BYTES; a restored guest
 * sees that capacity and uses only what the real disk's file system
 * declares, so one template serves every disk size. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "jsonrpc.h"
#include "paths.h"
#include "proc.h"
#include "sandbox-internal.h"
#include "sha256.h"
#include "util.h"

#define LAYOUT "capsule-template-v1"
#define PLACEHOLDER_BYTES (1ull << 40)	/* 1 TiB, sparse */

static char *templates_dir(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/templates", home);
}

/* Identity of a file for the key: real path, size, mtime. */
static void hash_file_id(struct cap_sha256 *h, const char *what, const char *path)
{
	char id[PATH_MAX + 64], line[PATH_MAX + 128];
	cap_file_id(path, id, sizeof(id));
	int n = snprintf(line, sizeof(line), "%s=%s\n", what, id);
	cap_sha256_update(h, line, (size_t)n);
}

/* Everything that shapes a VM's saved state goes into the key. */
void cap_template_key(const struct cap_sandbox_opts *o, const struct cap_vm_config *cfg,
		      char key[65])
{
	struct cap_sha256 h;
	char line[512];
	int n;
	/* The engine that will run it: its binary, its guest clock. */
	_cleanup_free_ char *engine = cap_engine_identity(cfg->engine, cfg->accel);

	cap_sha256_init(&h);
	n = snprintf(line, sizeof(line), "%s placeholder=%llu\n", LAYOUT, PLACEHOLDER_BYTES);
	cap_sha256_update(&h, line, (size_t)n);
	n = snprintf(line, sizeof(line), "engine=");
	cap_sha256_update(&h, line, (size_t)n);
	cap_sha256_update(&h, engine, strlen(engine));
	cap_sha256_update(&h, "\n", 1);
	hash_file_id(&h, "kernel", cfg->kernel);
	hash_file_id(&h, "initrd", cfg->initrd);
	n = snprintf(line, sizeof(line), "accel=%s cpus=%u mem=%u append=%s\n", cap_engine_accel_name(cfg->accel),
		     cfg->cpus, cfg->memory_mib, cfg->append_extra ? cfg->append_extra : "");
	cap_sha256_update(&h, line, (size_t)n);
	/* The sandbox's shape (disks, NIC), and the files it shares. */
	struct cap_sandbox_spec bare;
	cap_sandbox_spec_init(&bare);
	char shape[512];
	cap_sandbox_spec_shape(o->spec ? o->spec : &bare, shape, sizeof(shape));
	n = snprintf(line, sizeof(line), "shape=%s\n", shape);
	cap_sha256_update(&h, line, (size_t)n);
	for (unsigned i = 0; i < cfg->ndisks; i++)
		if (!cfg->disks[i].per_sandbox)
			hash_file_id(&h, "shared", cfg->disks[i].path);
	cap_sha256_final_hex(&h, key);
}

void cap_template_discard(const char *dir)
{
	cap_remove_tree(dir);
}

int cap_template_placeholder(const char *tmp, unsigned i, char **path, struct cap_err *err)
{
	char *p = xasprintf("%s/placeholder%u", tmp, i);
	_cleanup_close_ int fd = open(p, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0 || ftruncate(fd, (off_t)PLACEHOLDER_BYTES) < 0) {
		int r = cap_err_set(err, errno, "cannot create placeholder %s: %s", p, strerror(errno));
		free(p);
		return r;
	}
	*path = p;
	return 0;
}

/* The mount point of the file system holding path (an existing
 * directory): where "no space left" is to be fixed. New string. */
static char *mount_point(const char *path)
{
	char cur[PATH_MAX];
	struct stat st, up;
	if (!realpath(path, cur) || stat(cur, &st) < 0)
		return xstrdup(path);
	for (;;) {
		char *slash = strrchr(cur, '/');
		if (!slash || slash == cur) {
			if (stat("/", &up) == 0 && up.st_dev == st.st_dev)
				snprintf(cur, sizeof(cur), "/");
			return xstrdup(cur);
		}
		*slash = '\0';
		if (stat(cur, &up) < 0 || up.st_dev != st.st_dev) {
			*slash = '/';
			return xstrdup(cur);
		}
	}
}

/* What a template of mem_mib takes on disk, rounded up: the RAM file's
 * pages the guest touched before HELLO (50 MiB for 512 MiB here, 1.24 GB
 * for 64 GiB) and the device state (under 1 MiB). A build that runs out
 * of it has QEMU killed by SIGBUS on a page of its RAM file. */
static uint64_t template_need_mib(unsigned mem_mib)
{
	return 64 + mem_mib / 32;
}

/* Refuse to build on a file system without room for the template,
 * naming it; 0 when there is room. */
static int check_space(const char *root, unsigned mem_mib, struct cap_err *err)
{
	struct statvfs sv;
	if (statvfs(root, &sv) < 0)
		return 0;	/* unknown: the build says what goes wrong */
	uint64_t free_mib = (uint64_t)sv.f_bavail * sv.f_frsize >> 20;
	uint64_t need = template_need_mib(mem_mib);
	if (free_mib >= need)
		return 0;
	_cleanup_free_ char *mnt = mount_point(root);
	return cap_err_set(err, ENOSPC, "no space left on %s (the file system holding %s): need %" PRIu64 " MiB for a template of a %u MiB VM, %" PRIu64 " MiB free",
			   mnt, root, need, mem_mib, free_mib);
}

int cap_template_stage(unsigned mem_mib, char **tmp, struct cap_err *err)
{
	_cleanup_free_ char *root = templates_dir();
	char *t = xasprintf("%s/tmp-XXXXXX", root);
	int r;
	if ((r = cap_mkdir_p(root, 0700)) < 0)
		r = cap_err_set(err, -r, "cannot create %s: %s", root, strerror(-r));
	else if ((r = check_space(root, mem_mib, err)) < 0)
		;
	else if (!mkdtemp(t))
		r = cap_err_set(err, errno, "cannot create a directory in %s: %s", root, strerror(errno));
	if (r < 0) {
		free(t);
		return r;
	}
	*tmp = t;
	return 0;
}

/* An engine identity's "name=value" lines as a JSON object, in order. */
static json_t *identity_json(const char *id)
{
	json_t *o = json_object();
	for (const char *p = id; *p;) {
		size_t len = strcspn(p, "\n");
		const char *eq = memchr(p, '=', len);
		if (eq && eq > p) {
			_cleanup_free_ char *name = xstrndup(p, (size_t)(eq - p));
			json_object_set_new(o, name, cap_json_textn(eq + 1, len - (size_t)(eq + 1 - p)));
		}
		p += len + (p[len] == '\n');
	}
	return o;
}

int cap_template_store(const char *tmp, const char *key, const char *desc,
		       const struct cap_vm_config *cfg, char **dir, struct cap_err *err)
{
	_cleanup_free_ char *root = templates_dir();
	_cleanup_free_ char *meta = xasprintf("%s/meta.json", tmp);
	_cleanup_free_ char *id = cap_engine_identity(cfg->engine, cfg->accel);
	char *final = xasprintf("%s/%s", root, key);
	/* The host it was made for, so that `template ls` can say what
	 * differs on another (the key only says that something does). */
	json_t *m = json_pack("{s:i, s:s, s:s, s:I, s:s, s:s, s:o}", "schema", 1, "key", key, "desc", desc,
			      "created", (json_int_t)time(NULL), "engine", cap_engine_name(cfg->engine),
			      "accel", cap_engine_accel_name(cfg->accel), "host", identity_json(id));
	char *text = json_dumps(m, JSON_INDENT(2));
	json_decref(m);
	int r = cap_write_file_atomic(meta, text, strlen(text), 0600);
	free(text);
	if (r < 0)
		r = cap_err_set(err, -r, "cannot write %s: %s", meta, strerror(-r));
	else if (rename(tmp, final) < 0 && errno != ENOTEMPTY && errno != EEXIST)
		r = cap_err_set(err, errno, "cannot store template %s: %s", final, strerror(errno));
	cap_remove_tree(tmp);	/* gone if renamed; a loser of a race cleans up */
	if (r < 0) {
		free(final);
		return r;
	}
	*dir = final;
	return 0;
}

char *cap_template_lookup(const char *key)
{
	_cleanup_free_ char *root = templates_dir();
	char *dir = xasprintf("%s/%s", root, key);
	_cleanup_free_ char *state = xasprintf("%s/state", dir);
	_cleanup_free_ char *ram = xasprintf("%s/ram", dir);
	if (access(state, R_OK) == 0 && access(ram, R_OK) == 0)
		return dir;
	cap_remove_tree(dir);	/* incomplete: start over */
	free(dir);
	return NULL;
}

void cap_template_info_fini(struct cap_template_info *t)
{
	for (size_t i = 0; i < t->nhost; i++) {
		free(t->host[i].owned_name);
		free(t->host[i].owned_made);
		free(t->host[i].owned_now);
	}
	free(t->host);
	free(t->owned_mismatch);
	free(t->owned_dir);
	free(t->owned_desc);
	memset(t, 0, sizeof(*t));
}

static uint64_t used(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* This host's identity for an engine and accelerator, computed once per
 * listing: the last few asked (a listing holds one or two). */
struct host_cache {
	char engine[32], accel[8];
	json_t *id;	/* NULL: no such engine here */
};

static const json_t *host_now(struct host_cache *c, size_t *n, size_t cap, const char *engine,
			      const char *accel)
{
	for (size_t i = 0; i < *n; i++)
		if (strcmp(c[i].engine, engine) == 0 && strcmp(c[i].accel, accel) == 0)
			return c[i].id;
	const struct cap_engine_ops *e;
	enum cap_accel a;
	json_t *id = NULL;
	if (cap_engine_get(engine, &e, NULL) == 0 && cap_engine_accel_parse(accel, &a) == 0 && a != CAP_ACCEL_AUTO) {
		_cleanup_free_ char *text = cap_engine_identity(e, a);
		id = identity_json(text);
	}
	if (*n == cap) {
		json_decref(id);
		return NULL;
	}
	c[*n] = (struct host_cache){ .id = id };
	snprintf(c[*n].engine, sizeof(c[*n].engine), "%s", engine);
	snprintf(c[*n].accel, sizeof(c[*n].accel), "%s", accel);
	return c[(*n)++].id;
}

static char *dup_or_null(const json_t *s)
{
	const char *v = json_string_value(s);
	return v ? xstrdup(v) : NULL;
}

/* t's host fields from the recorded object made and this host's now. */
static void compare_host(struct cap_template_info *t, const json_t *made, const json_t *now)
{
	size_t cap = json_object_size(made) + json_object_size(now), k = 0;
	char mismatch[512] = "";
	size_t used_len = 0;
	const char *name;
	const json_t *v;
	t->host = xcalloc(cap ? cap : 1, sizeof(*t->host));
	json_object_foreach((json_t *)made, name, v) {
		t->host[k] = (struct cap_template_host_field){ .owned_name = xstrdup(name), .owned_made = dup_or_null(v),
							      .owned_now = dup_or_null(json_object_get(now, name)) };
		k++;
	}
	json_object_foreach((json_t *)now, name, v) {
		if (json_object_get(made, name))
			continue;
		t->host[k++] = (struct cap_template_host_field){ .owned_name = xstrdup(name), .owned_now = dup_or_null(v) };
	}
	t->nhost = k;
	for (size_t i = 0; i < k; i++) {
		struct cap_template_host_field *f = &t->host[i];
		f->differs = !f->owned_made || !f->owned_now || strcmp(f->owned_made, f->owned_now) != 0;
		if (f->differs && used_len < sizeof(mismatch))
			used_len += (size_t)snprintf(mismatch + used_len, sizeof(mismatch) - used_len, "%s%s",
						     used_len ? ", " : "", f->owned_name);
	}
	t->owned_mismatch = xstrdup(mismatch);
}

int cap_template_list(struct cap_template_info **out, size_t *n)
{
	_cleanup_free_ char *root = templates_dir();
	DIR *d = opendir(root);
	size_t cap = 8, k = 0, nhosts = 0;
	struct cap_template_info *v = xcalloc(cap, sizeof(*v));
	struct host_cache hosts[8];
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (strlen(e->d_name) != 64)
			continue;
		_cleanup_free_ char *dir = xasprintf("%s/%s", root, e->d_name);
		_cleanup_free_ char *meta = xasprintf("%s/meta.json", dir);
		json_t *j = json_load_file(meta, 0, NULL);
		if (!j)
			continue;
		if (k == cap)
			v = xrealloc(v, (cap *= 2) * sizeof(*v));
		const char *desc = json_string_value(json_object_get(j, "desc"));
		const char *engine = json_string_value(json_object_get(j, "engine"));
		const char *accel = json_string_value(json_object_get(j, "accel"));
		_cleanup_free_ char *state = xasprintf("%s/state", dir);
		_cleanup_free_ char *ram = xasprintf("%s/ram", dir);
		v[k] = (struct cap_template_info){
			.owned_dir = xstrdup(dir), .owned_desc = xstrdup(desc ? desc : ""),
			.created = json_integer_value(json_object_get(j, "created")),
			.state_bytes = used(state), .ram_bytes = used(ram),
		};
		snprintf(v[k].key, sizeof(v[k].key), "%s", e->d_name);
		snprintf(v[k].engine, sizeof(v[k].engine), "%s", engine ? engine : "");
		snprintf(v[k].accel, sizeof(v[k].accel), "%s", accel ? accel : "");
		const json_t *made = json_object_get(j, "host");
		if (json_is_object(made) && engine && accel)
			compare_host(&v[k], made, host_now(hosts, &nhosts, CAP_ARRAY_SIZE(hosts), engine, accel));
		k++;
		json_decref(j);
	}
	if (d)
		closedir(d);
	for (size_t i = 0; i < nhosts; i++)
		json_decref(hosts[i].id);
	*out = v;
	*n = k;
	return 0;
}

int cap_template_prune(size_t *removed, struct cap_err *err)
{
	_cleanup_free_ char *root = templates_dir();
	DIR *d = opendir(root);
	struct dirent *e;
	*removed = 0;
	while (d && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		_cleanup_free_ char *dir = xasprintf("%s/%s", root, e->d_name);
		int r = cap_remove_tree(dir);
		if (r < 0) {
			closedir(d);
			return cap_err_set(err, -r, "cannot remove %s: %s", dir, strerror(-r));
		}
		(*removed)++;
	}
	if (d)
		closedir(d);
	return 0;
}
