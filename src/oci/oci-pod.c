/* Pods (docs/oci.md, "Pods"): one VM per pod. config.json's CRI
 * annotations say what a container is: the pod's sandbox (its pause
 * process; it makes the pod's VM, as any capsule-oci container makes
 * one) or a container of the pod, which runs inside the sandbox's VM:
 * its rootfs and bind-mounted files copied into the guest, its process
 * in a mount namespace rooted there and a cgroup of its own with the
 * config's limits. Here: reading that part of config.json (and runc's
 * update --resources JSON) into the guest's terms, and the copy-in. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "layout.h"
#include "oci-int.h"
#include "paths.h"
#include "sandbox.h"
#include "sha256.h"
#include "util.h"
#include "xfer.h"

#define ANN_TYPE "io.kubernetes.cri.container-type"
#define ANN_SANDBOX_ID "io.kubernetes.cri.sandbox-id"
#define ANN_SANDBOX_NAME "io.kubernetes.cri.sandbox-name"
#define ANN_SANDBOX_NS "io.kubernetes.cri.sandbox-namespace"

static const char *ann(json_t *config, const char *key)
{
	return json_string_value(json_object_get(json_object_get(config, "annotations"), key));
}

void cap_oci_ctr_name(const char *id, char out[CAP_CTR_NAME_MAX + 1])
{
	if (cap_proto_ctr_name_ok(id)) {
		snprintf(out, CAP_CTR_NAME_MAX + 1, "%s", id);
		return;
	}
	char hex[65];
	struct cap_sha256 h;
	cap_sha256_init(&h);
	cap_sha256_update(&h, id, strlen(id));
	cap_sha256_final_hex(&h, hex);
	snprintf(out, CAP_CTR_NAME_MAX + 1, "c%.40s", hex);
}

void cap_oci_pod_fini(struct cap_oci_pod *p)
{
	for (size_t i = 0; i < p->nfiles; i++) {
		free(p->files[i].dest);
		free(p->files[i].source);
	}
	free(p->files);
	memset(p, 0, sizeof(*p));
}

/* A JSON number as an int64 (engines write 2^64-1 for "none"): false
 * when v is there and not a number. */
static bool num64(json_t *v, int64_t *out, bool *given)
{
	*given = false;
	if (!v || json_is_null(v))
		return true;
	double d;
	if (json_is_integer(v))
		d = (double)json_integer_value(v);
	else if (json_is_real(v))
		d = json_real_value(v);
	else
		return false;
	*given = true;
	*out = d >= 9.2e18 ? INT64_MAX : d <= -9.2e18 ? INT64_MIN : (int64_t)d;
	return true;
}

int cap_oci_limits_json(json_t *res, const char *file, struct cap_limits *out, struct cap_err *err)
{
	memset(out, 0, sizeof(*out));
	if (!res || json_is_null(res))
		return 0;
	if (!json_is_object(res))
		return cap_err_set(err, EINVAL, "%s: the resources are not an object; fix the file", file);
	struct {
		const char *obj, *key;
		int64_t v;
		bool given;
	} f[] = {
		{ "memory", "limit", 0, false }, { "cpu", "quota", 0, false }, { "cpu", "period", 0, false },
		{ "cpu", "shares", 0, false }, { "pids", "limit", 0, false },
	};
	for (size_t i = 0; i < CAP_ARRAY_SIZE(f); i++)
		if (!num64(json_object_get(json_object_get(res, f[i].obj), f[i].key), &f[i].v, &f[i].given))
			return cap_err_set(err, EINVAL, "%s: %s.%s is not a number; fix the file", file, f[i].obj,
					   f[i].key);
	if (f[0].given) {
		out->set |= CAP_LIMIT_MEMORY;
		/* -1, 0 and cgroup v1's own "unlimited": no limit. */
		out->memory_max = f[0].v > 0 && f[0].v < (int64_t)1 << 62 ? (uint64_t)f[0].v : CAP_LIMIT_NONE;
		if (out->memory_max < 4096)
			return cap_err_set(err, ERANGE, "%s: memory.limit %" PRId64 " is below a page; give more", file, f[0].v);
	}
	if (f[1].given || f[2].given) {
		out->set |= CAP_LIMIT_CPU;
		out->cpu_period = f[2].given && f[2].v > 0 ? (uint64_t)f[2].v : 100000;
		out->cpu_quota = f[1].given && f[1].v > 0 ? (uint64_t)f[1].v : CAP_LIMIT_NONE;
		if (out->cpu_period < 1000 || out->cpu_period > 1000000 || out->cpu_quota < 1000)
			return cap_err_set(err, ERANGE, "%s: cpu.quota %" PRId64 " / cpu.period %" PRId64 ": the period must be 1000 to 1000000 us and the quota at least 1000 us",
					   file, f[1].v, f[2].v);
	}
	if (f[3].given && f[3].v > 0) {
		/* runc's shares to cgroup v2's weight. */
		uint64_t shares = (uint64_t)CAP_MAX(CAP_MIN(f[3].v, (int64_t)262144), (int64_t)2);
		out->set |= CAP_LIMIT_CPU_WEIGHT;
		out->cpu_weight = 1 + ((shares - 2) * 9999) / 262142;
	}
	if (f[4].given) {
		out->set |= CAP_LIMIT_PIDS;
		out->pids_max = f[4].v > 0 ? (uint64_t)f[4].v : CAP_LIMIT_NONE;
	}
	return 0;
}

/* Mount options into MS_ flags and the data a kind takes. */
static int mount_opts(json_t *m, enum cap_ctr_mount_kind kind, struct cap_ctr_mount *out)
{
	static const struct {
		const char *name;
		uint32_t set, clear;
	} flags[] = {
		{ "nosuid", MS_NOSUID, 0 }, { "suid", 0, MS_NOSUID },	{ "nodev", MS_NODEV, 0 },
		{ "dev", 0, MS_NODEV },	    { "noexec", MS_NOEXEC, 0 }, { "exec", 0, MS_NOEXEC },
		{ "ro", MS_RDONLY, 0 },	    { "rw", 0, MS_RDONLY },	{ "noatime", MS_NOATIME, 0 },
		{ "atime", 0, MS_NOATIME },
	};
	static const char *const tmpfs_keys[] = { "mode=", "size=", "nr_inodes=", "uid=", "gid=", NULL };
	static const char *const devpts_keys[] = { "newinstance", "ptmxmode=", "mode=", "gid=", NULL };
	const char *const *keys = kind == CAP_CTR_TMPFS ? tmpfs_keys : kind == CAP_CTR_DEVPTS ? devpts_keys : NULL;
	size_t i, used = 0;
	json_t *o;
	json_array_foreach(json_object_get(m, "options"), i, o) {
		const char *opt = json_string_value(o);
		if (!opt)
			continue;
		bool known = false;
		for (size_t f = 0; f < CAP_ARRAY_SIZE(flags); f++) {
			if (strcmp(opt, flags[f].name) == 0) {
				out->flags = (out->flags | flags[f].set) & ~flags[f].clear;
				known = true;
			}
		}
		bool data = false;
		for (size_t k = 0; !known && keys && keys[k]; k++)
			data |= strncmp(opt, keys[k], strlen(keys[k])) == 0;
		if (!data)
			continue;	/* propagation, atime modes, tmpcopyup...: the guest's */
		size_t n = strlen(opt);
		if (strchr(opt, ',') || used + !!used + n >= sizeof(out->data))
			return -EINVAL;
		used += (size_t)snprintf(out->data + used, sizeof(out->data) - used, "%s%s", used ? "," : "", opt);
	}
	return 0;
}

/* Whether host path s is one of CRI's emptyDir volumes. */
static bool empty_dir(const char *s)
{
	return strstr(s, "/volumes/kubernetes.io~empty-dir/") != NULL;
}

static int pod_mounts(json_t *mounts, const char *file, const char *bundle, struct cap_oci_pod *p,
		      struct cap_err *err)
{
	struct cap_exec_container *c = &p->ctr;
	size_t i;
	json_t *m;
	json_array_foreach(mounts, i, m) {
		const char *dest = json_string_value(json_object_get(m, "destination"));
		const char *type = json_string_value(json_object_get(m, "type"));
		const char *src = json_string_value(json_object_get(m, "source"));
		if (!dest || dest[0] != '/')
			return cap_err_set(err, EINVAL, "%s: mounts[%zu].destination is missing or not absolute; fix the file",
					   file, i);
		bool bind = (type && strcmp(type, "bind") == 0);
		size_t k;
		json_t *o;
		json_array_foreach(json_object_get(m, "options"), k, o)
			bind |= json_string_value(o) && (strcmp(json_string_value(o), "bind") == 0 ||
							  strcmp(json_string_value(o), "rbind") == 0);
		struct cap_ctr_mount cm = { 0 };
		if (strlen(dest) >= sizeof(cm.destination))
			return cap_err_set(err, EINVAL, "%s: mounts[%zu]: the destination is over 255 bytes", file, i);
		snprintf(cm.destination, sizeof(cm.destination), "%s", dest);
		if (bind) {
			struct stat st;
			_cleanup_free_ char *s = src && src[0] == '/' ? xstrdup(src) : xasprintf("%s/%s", bundle, src ? src : "");
			if (!src || stat(s, &st) < 0)
				return cap_err_set(err, src ? errno : EINVAL, "%s: bind mount %s -> %s: cannot read the source%s%s",
						   file, src ? s : "(none)", dest, src ? ": " : "", src ? strerror(errno) : "");
			if (S_ISREG(st.st_mode)) {
				if ((uint64_t)st.st_size > CAP_OCI_FILE_MAX)
					return cap_err_set(err, EFBIG, "bind mount %s -> %s: the file has %lld bytes; capsule copies bind-mounted files into the pod's VM, at most %u bytes each",
							   s, dest, (long long)st.st_size, CAP_OCI_FILE_MAX);
				p->files = xrealloc(p->files, (p->nfiles + 1) * sizeof(*p->files));
				p->files[p->nfiles++] = (struct cap_oci_file){ .dest = xstrdup(dest), .source = xstrdup(s) };
				continue;
			}
			if (!S_ISDIR(st.st_mode))
				return cap_err_set(err, EINVAL, "bind mount %s -> %s: not a file or a directory; remove the mount", s, dest);
			if (strcmp(dest, "/dev/shm") == 0) {
				cm.kind = CAP_CTR_SHM;	/* the pod's, shared */
			} else if (empty_dir(s)) {
				/* One directory of the pod's VM per source: the
				 * containers that name the same one share it. */
				char hex[65];
				struct cap_sha256 h;
				cap_sha256_init(&h);
				cap_sha256_update(&h, s, strlen(s));
				cap_sha256_final_hex(&h, hex);
				cm.kind = CAP_CTR_VOLUME;
				snprintf(cm.data, sizeof(cm.data), "v%.32s", hex);
			} else {
				return cap_err_set(err, EINVAL, "bind mount %s -> %s: a directory volume; a pod's containers run in a VM that cannot share a host directory yet (only emptyDir is given, as a directory of the pod's VM: docs/oci.md); remove the volume",
						   s, dest);
			}
			if (mount_opts(m, cm.kind, &cm) < 0)
				return cap_err_set(err, EINVAL, "%s: mounts[%zu] (%s): bad options", file, i, dest);
		} else {
			static const struct {
				const char *type;
				enum cap_ctr_mount_kind kind;
			} kinds[] = {
				{ "proc", CAP_CTR_PROC }, { "sysfs", CAP_CTR_SYSFS }, { "tmpfs", CAP_CTR_TMPFS },
				{ "devpts", CAP_CTR_DEVPTS }, { "mqueue", CAP_CTR_MQUEUE }, { "cgroup", CAP_CTR_CGROUP },
				{ "cgroup2", CAP_CTR_CGROUP },
			};
			for (size_t t = 0; type && t < CAP_ARRAY_SIZE(kinds); t++)
				if (strcmp(type, kinds[t].type) == 0)
					cm.kind = kinds[t].kind;
			if (!cm.kind)
				return cap_err_set(err, EINVAL, "%s: mounts[%zu] (%s) of type \"%s\": a pod's container gets proc, sysfs, tmpfs, devpts, mqueue and cgroup mounts, bind-mounted files (copied) and emptyDir; not this type; remove the mount",
						   file, i, dest, type ? type : "(none)");
			if (mount_opts(m, cm.kind, &cm) < 0)
				return cap_err_set(err, EINVAL, "%s: mounts[%zu] (%s): an option holds a ',' or they are over 255 bytes",
						   file, i, dest);
			if (cm.kind == CAP_CTR_CGROUP)
				cm.flags |= MS_RDONLY;
		}
		if (c->nmounts == CAP_CTR_MAX_MOUNTS)
			return cap_err_set(err, EINVAL, "%s: more than %d mounts for a pod's container; remove some", file,
					   CAP_CTR_MAX_MOUNTS);
		c->mounts[c->nmounts++] = cm;
	}
	return 0;
}

int cap_oci_pod_load(const char *bundle, const char *id, struct cap_oci_pod *out, struct cap_err *err)
{
	memset(out, 0, sizeof(*out));
	_cleanup_free_ char *file = xasprintf("%s/config.json", bundle);
	json_error_t je;
	json_t *j = json_load_file(file, JSON_DECODE_INT_AS_REAL, &je);
	if (!j)
		return cap_err_set(err, EINVAL, "%s: %s", file, je.text);
	const char *t = ann(j, ANN_TYPE), *sid = ann(j, ANN_SANDBOX_ID);
	const char *pname = ann(j, ANN_SANDBOX_NAME), *pns = ann(j, ANN_SANDBOX_NS);
	snprintf(out->pod, sizeof(out->pod), "%s%s%s", pns ? pns : "", pns ? "/" : "", pname ? pname : "");
	int r = 0;
	if (!t) {
		out->role = CAP_OCI_POD_NONE;
	} else if (strcmp(t, "sandbox") == 0) {
		out->role = CAP_OCI_POD_SANDBOX;
	} else if (strcmp(t, "container") == 0) {
		out->role = CAP_OCI_POD_CONTAINER;
		if (!sid || !*sid) {
			r = cap_err_set(err, EINVAL, "%s: annotation " ANN_TYPE " is \"container\" without " ANN_SANDBOX_ID ": the pod's sandbox must be named", file);
			goto out;
		}
	} else {
		r = cap_err_set(err, EINVAL, "%s: annotation " ANN_TYPE " is \"%s\"; capsule-oci knows sandbox and container", file, t);
		goto out;
	}
	snprintf(out->sandbox_id, sizeof(out->sandbox_id), "%s", sid ? sid : "");
	cap_oci_ctr_name(id, out->ctr.name);
	if (out->role != CAP_OCI_POD_CONTAINER)
		goto out;
	json_t *linux_ = json_object_get(j, "linux");
	if (json_is_true(json_object_get(json_object_get(j, "process"), "privileged")) ||
	    json_array_size(json_object_get(linux_, "devices")) > 0) {
		r = cap_err_set(err, EINVAL, "%s: linux.devices: a pod's container in capsule gets no host devices (a privileged container is not supported); remove them", file);
		goto out;
	}
	out->ctr.options = CAP_CTR_ROOT;
	if (json_is_true(json_object_get(json_object_get(j, "root"), "readonly")))
		out->ctr.options |= CAP_CTR_READONLY;
	if ((r = cap_oci_limits_json(json_object_get(linux_, "resources"), file, &out->ctr.limits, err)) < 0)
		goto out;
	r = pod_mounts(json_object_get(j, "mounts"), file, bundle, out, err);
out:
	json_decref(j);
	if (r < 0)
		cap_oci_pod_fini(out);
	return r;
}

/* --- the copy into the pod's VM --------------------------------------------- */

/* The bind-mounted files as a tree for the container's root: their
 * content and mode, root's, with the rootfs's directories' modes for
 * their parents. */
static int files_tree(const struct cap_oci_pod *p, const char *rootfs, const char *seed, struct cap_err *err)
{
	if (mkdir(seed, 0755) < 0)
		return cap_err_set(err, errno, "mkdir %s: %s", seed, strerror(errno));
	for (size_t i = 0; i < p->nfiles; i++) {
		const struct cap_oci_file *f = &p->files[i];
		_cleanup_free_ char *data = NULL;
		struct stat st;
		if (stat(f->source, &st) < 0)
			return cap_err_set(err, errno, "mount source %s (for %s): %s", f->source, f->dest, strerror(errno));
		ssize_t n = cap_read_file(f->source, CAP_OCI_FILE_MAX, &data);
		if (n < 0)
			return cap_err_set(err, (int)-n, "mount source %s (for %s): %s", f->source, f->dest, strerror((int)-n));
		char rel[PATH_MAX];
		snprintf(rel, sizeof(rel), "%s", f->dest);
		for (char *s = strchr(rel + 1, '/'); s; s = strchr(s + 1, '/')) {
			*s = '\0';
			_cleanup_free_ char *in = xasprintf("%s%s", seed, rel);
			_cleanup_free_ char *src = xasprintf("%s%s", rootfs, rel);
			struct stat ds;
			mode_t mode = lstat(src, &ds) == 0 && S_ISDIR(ds.st_mode) ? ds.st_mode & 07777 : 0755;
			if (mkdir(in, mode) == 0)
				chmod(in, mode);
			*s = '/';
		}
		_cleanup_free_ char *to = xasprintf("%s%s", seed, f->dest);
		int fd = open(to, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);
		if (fd < 0)
			return cap_err_set(err, errno, "%s: %s", to, strerror(errno));
		int r = cap_write_all(fd, data, (size_t)n);
		if (r == 0 && fchmod(fd, st.st_mode & 07777) < 0)
			r = -errno;
		close(fd);
		if (r < 0)
			return cap_err_set(err, -r, "%s: %s", to, strerror(-r));
	}
	return 0;
}

int cap_oci_pod_copy_in(const char *sandbox, const struct cap_oci_pod *p, const char *rootfs,
			const char *seed, struct cap_err *err)
{
	struct cap_named_status ns;
	struct cap_sandbox *sb = NULL;
	int r;
	if ((r = cap_named_status(sandbox, &ns, err)) < 0)
		return r;
	if (ns.state != CAP_NAMED_RUNNING)
		return cap_err_set(err, ESRCH, "the pod's VM (sandbox %s) is %s", sandbox,
				   ns.state == CAP_NAMED_PAUSED ? "paused" : "stopped");
	if ((r = cap_sandbox_attach(ns.control, &sb, err)) < 0)
		return r;
	/* What a create of the same id that died left there goes first. */
	struct cap_update rm = { .op = CAP_UPDATE_REMOVE };
	snprintf(rm.name, sizeof(rm.name), "%s", p->ctr.name);
	if ((r = cap_sandbox_update_wait(sb, &rm, 120000, err)) < 0)
		goto out;
	struct cap_xfer_result res = { 0 };
	r = cap_xfer_put(sb, rootfs, CAP_GUEST_CONTAINERS, "", p->ctr.name, CAP_XFER_RECURSIVE | CAP_XFER_OWNERS,
			 &res, err);
	for (size_t i = 0; i < res.nrefused && i < 5; i++)
		cap_log(CAP_LOG_WARN, "the pod's container %s: not copied: %s", p->ctr.name, res.refused[i]);
	cap_xfer_result_fini(&res);
	if (r < 0) {
		cap_err_prefix(err, "copying the container's root %s into the pod's VM", rootfs);
		goto out;
	}
	if (p->nfiles) {
		if ((r = files_tree(p, rootfs, seed, err)) < 0)
			goto out;
		memset(&res, 0, sizeof(res));
		r = cap_xfer_put(sb, seed, CAP_GUEST_CONTAINERS, p->ctr.name, "", CAP_XFER_RECURSIVE | CAP_XFER_OWNERS,
				 &res, err);
		cap_xfer_result_fini(&res);
		if (r < 0)
			cap_err_prefix(err, "copying the bind-mounted files into the pod's VM");
	}
out:
	cap_sandbox_free(sb);
	return r;
}

int cap_oci_pod_remove(const char *sandbox, const char *name, struct cap_err *err)
{
	struct cap_named_status ns;
	struct cap_sandbox *sb = NULL;
	int r;
	if ((r = cap_named_status(sandbox, &ns, err)) < 0)
		return r;
	if (ns.state != CAP_NAMED_RUNNING)
		return 0;	/* the VM went, and the container with it */
	if ((r = cap_sandbox_attach(ns.control, &sb, err)) < 0)
		return r;
	struct cap_update rm = { .op = CAP_UPDATE_REMOVE };
	snprintf(rm.name, sizeof(rm.name), "%s", name);
	r = cap_sandbox_update_wait(sb, &rm, 120000, err);
	cap_sandbox_free(sb);
	return r;
}
