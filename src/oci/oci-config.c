/* config.json and process.json into struct cap_oci_config and struct
 * cap_oci_process (docs/oci.md): what this runtime honours, and a
 * refusal naming the field, the value and what to do for what it
 * cannot. */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <limits.h>
#include <linux/magic.h>
#include <linux/nsfs.h>
#include <net/if.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "layout.h"
#include "named.h"
#include "oci.h"
#include "sandbox.h"
#include "util.h"

/* The file being read, for messages ("BUNDLE/config.json"). */
struct ctx {
	const char *file;
	struct cap_err *err;
};

/* A number as jansson gives it: files are read with
 * JSON_DECODE_INT_AS_REAL, since engines write RLIM_INFINITY as
 * 18446744073709551615, which jansson cannot hold as an integer. */
static bool num(json_t *v, double *out)
{
	if (json_is_integer(v))
		*out = (double)json_integer_value(v);
	else if (json_is_real(v))
		*out = json_real_value(v);
	else
		return false;
	return true;
}

/* An unsigned integer field at most max; absent: *out untouched, 0. */
static int get_u64(struct ctx *x, json_t *obj, const char *key, const char *field,
		   uint64_t max, uint64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return 0;
	double d;
	uint64_t u = 0;
	bool ok = num(v, &d) && d >= 0;
	if (ok && d >= 18446744073709551615.0) {	/* 2^64: RLIM_INFINITY as written */
		ok = max == UINT64_MAX;
		u = UINT64_MAX;
	} else if (ok) {
		u = (uint64_t)d;
		ok = d == (double)u && (max == UINT64_MAX || u <= max);
	}
	if (!ok)
		return cap_err_set(x->err, EINVAL, "%s: %s is not an integer from 0 to %" PRIu64 "; fix the file", x->file, field, max);
	*out = u;
	return 0;
}

/* A signed integer field; absent: *out untouched. */
static int get_i64(struct ctx *x, json_t *obj, const char *key, const char *field,
		   int64_t *out)
{
	json_t *v = json_object_get(obj, key);
	if (!v || json_is_null(v))
		return 0;
	double d;
	/* 2^63 and above (INT64_MAX as written, rounded) is taken as
	 * INT64_MAX: what engines write for "no limit" besides -1. */
	if (!num(v, &d) || d < -9223372036854775807.0 ||
	    (d < 9223372036854775807.0 && d != (double)(int64_t)d))
		return cap_err_set(x->err, EINVAL, "%s: %s is not an integer; fix the file", x->file, field);
	*out = d >= 9223372036854775807.0 ? INT64_MAX : (int64_t)d;
	return 0;
}

/* A string field or NULL when absent; -EINVAL when not a string. */
static int get_str(struct ctx *x, json_t *obj, const char *key, const char *field,
		   const char **out)
{
	json_t *v = json_object_get(obj, key);
	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v))
		return cap_err_set(x->err, EINVAL, "%s: %s is not a string; fix the file", x->file, field);
	*out = json_string_value(v);
	return 0;
}

/* An array of strings into a new NULL-terminated vector. */
static int get_strv(struct ctx *x, json_t *obj, const char *key, const char *field,
		    char ***out, size_t *n)
{
	json_t *v = json_object_get(obj, key);
	*out = xcalloc(1, sizeof(char *));
	*n = 0;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v))
		return cap_err_set(x->err, EINVAL, "%s: %s is not an array of strings; fix the file", x->file, field);
	size_t len = json_array_size(v);
	*out = xrealloc(*out, (len + 1) * sizeof(char *));
	(*out)[0] = NULL;
	for (size_t i = 0; i < len; i++) {
		const char *s = json_string_value(json_array_get(v, i));
		if (!s)
			return cap_err_set(x->err, EINVAL, "%s: %s[%zu] is not a string; fix the file", x->file, field, i);
		(*out)[i] = xstrdup(s);
		(*out)[i + 1] = NULL;
		*n = i + 1;
	}
	return 0;
}

static const struct {
	const char *name;
	int resource;
} rlimit_names[] = {
	{ "RLIMIT_CPU", RLIMIT_CPU }, { "RLIMIT_FSIZE", RLIMIT_FSIZE },
	{ "RLIMIT_DATA", RLIMIT_DATA }, { "RLIMIT_STACK", RLIMIT_STACK },
	{ "RLIMIT_CORE", RLIMIT_CORE }, { "RLIMIT_RSS", RLIMIT_RSS },
	{ "RLIMIT_NPROC", RLIMIT_NPROC }, { "RLIMIT_NOFILE", RLIMIT_NOFILE },
	{ "RLIMIT_MEMLOCK", RLIMIT_MEMLOCK }, { "RLIMIT_AS", RLIMIT_AS },
	{ "RLIMIT_LOCKS", RLIMIT_LOCKS }, { "RLIMIT_SIGPENDING", RLIMIT_SIGPENDING },
	{ "RLIMIT_MSGQUEUE", RLIMIT_MSGQUEUE }, { "RLIMIT_NICE", RLIMIT_NICE },
	{ "RLIMIT_RTPRIO", RLIMIT_RTPRIO }, { "RLIMIT_RTTIME", RLIMIT_RTTIME },
};

static int parse_rlimits(struct ctx *x, json_t *v, const char *where,
			 struct cap_oci_process *p)
{
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_array(v))
		return cap_err_set(x->err, EINVAL, "%s: %s.rlimits is not an array; fix the file", x->file, where);
	size_t i;
	json_t *e;
	json_array_foreach(v, i, e) {
		const char *type = json_string_value(json_object_get(e, "type"));
		if (!type)
			return cap_err_set(x->err, EINVAL, "%s: %s.rlimits[%zu].type is missing; give a name such as \"RLIMIT_NOFILE\"", x->file, where, i);
		int res = -1;
		for (size_t k = 0; k < CAP_ARRAY_SIZE(rlimit_names); k++)
			if (strcmp(type, rlimit_names[k].name) == 0)
				res = rlimit_names[k].resource;
		if (res < 0)
			return cap_err_set(x->err, EINVAL, "%s: %s.rlimits[%zu].type \"%s\" is not a Linux resource limit; use one of RLIMIT_CPU, RLIMIT_NOFILE, RLIMIT_NPROC, ... (setrlimit(2))",
					   x->file, where, i, type);
		for (uint32_t k = 0; k < p->nrlimits; k++)
			if (p->rlimits[k].resource == (uint32_t)res)
				return cap_err_set(x->err, EINVAL, "%s: %s.rlimits has %s twice; keep one", x->file, where, type);
		if (p->nrlimits == CAP_OCI_MAX_RLIMITS)
			return cap_err_set(x->err, EINVAL, "%s: %s.rlimits has more than %d entries", x->file, where, CAP_OCI_MAX_RLIMITS);
		struct cap_exec_rlimit *rl = &p->rlimits[p->nrlimits];
		_cleanup_free_ char *fh = xasprintf("%s.rlimits[%zu].hard", where, i);
		_cleanup_free_ char *fs = xasprintf("%s.rlimits[%zu].soft", where, i);
		uint64_t hard = 0, soft = 0;
		int r;
		if ((r = get_u64(x, e, "hard", fh, UINT64_MAX, &hard)) < 0 ||
		    (r = get_u64(x, e, "soft", fs, UINT64_MAX, &soft)) < 0)
			return r;
		if (soft > hard)
			return cap_err_set(x->err, EINVAL, "%s: %s.rlimits[%zu] (%s): soft %" PRIu64 " is above hard %" PRIu64 "; lower it",
					   x->file, where, i, type, soft, hard);
		*rl = (struct cap_exec_rlimit){ .resource = (uint32_t)res, .soft = soft, .hard = hard };
		p->nrlimits++;
	}
	return 0;
}

/* A process object (config.json's "process", or a process.json). */
static int parse_process(struct ctx *x, json_t *pj, const char *where,
			 struct cap_oci_process *p)
{
	int r;
	if (!json_is_object(pj))
		return cap_err_set(x->err, EINVAL, "%s: %s is missing or not an object; give the process to run", x->file, where);
	_cleanup_free_ char *fargs = xasprintf("%s.args", where);
	_cleanup_free_ char *fenv = xasprintf("%s.env", where);
	if ((r = get_strv(x, pj, "args", fargs, &p->args, &p->nargs)) < 0)
		return r;
	if (p->nargs == 0)
		return cap_err_set(x->err, EINVAL, "%s: %s.args is missing or empty; give the command to run", x->file, where);
	if ((r = get_strv(x, pj, "env", fenv, &p->env, &p->nenv)) < 0)
		return r;
	for (size_t i = 0; i < p->nenv; i++)
		if (!strchr(p->env[i], '=') || p->env[i][0] == '=')
			return cap_err_set(x->err, EINVAL, "%s: %s.env[%zu] \"%s\" is not NAME=value; fix it", x->file, where, i, p->env[i]);
	const char *cwd;
	_cleanup_free_ char *fcwd = xasprintf("%s.cwd", where);
	if ((r = get_str(x, pj, "cwd", fcwd, &cwd)) < 0)
		return r;
	if (cwd && *cwd && cwd[0] != '/')
		return cap_err_set(x->err, EINVAL, "%s: %s.cwd \"%s\" is not an absolute path; give one starting with '/'", x->file, where, cwd);
	p->cwd = xstrdup(cwd && *cwd ? cwd : "/");

	p->umask = 0022;
	json_t *user = json_object_get(pj, "user");
	if (user && !json_is_null(user)) {
		if (!json_is_object(user))
			return cap_err_set(x->err, EINVAL, "%s: %s.user is not an object; fix the file", x->file, where);
		_cleanup_free_ char *fu = xasprintf("%s.user.uid", where);
		_cleanup_free_ char *fg = xasprintf("%s.user.gid", where);
		_cleanup_free_ char *fm = xasprintf("%s.user.umask", where);
		uint64_t uid = 0, gid = 0, um = 0022;
		if ((r = get_u64(x, user, "uid", fu, UINT32_MAX - 1, &uid)) < 0 ||
		    (r = get_u64(x, user, "gid", fg, UINT32_MAX - 1, &gid)) < 0 ||
		    (r = get_u64(x, user, "umask", fm, 0777, &um)) < 0)
			return r;
		p->uid = (uint32_t)uid;
		p->gid = (uint32_t)gid;
		p->umask = (uint32_t)um;
		json_t *g = json_object_get(user, "additionalGids");
		if (g && !json_is_null(g)) {
			if (!json_is_array(g))
				return cap_err_set(x->err, EINVAL, "%s: %s.user.additionalGids is not an array; fix the file", x->file, where);
			if (json_array_size(g) > CAP_OCI_MAX_GROUPS)
				return cap_err_set(x->err, EINVAL, "%s: %s.user.additionalGids has %zu groups, more than the %d this runtime passes; give fewer",
						   x->file, where, json_array_size(g), CAP_OCI_MAX_GROUPS);
			for (size_t i = 0; i < json_array_size(g); i++) {
				double d;
				if (!num(json_array_get(g, i), &d) || d < 0 || d >= (double)UINT32_MAX || d != (double)(uint32_t)d)
					return cap_err_set(x->err, EINVAL, "%s: %s.user.additionalGids[%zu] is not a group id; fix the file", x->file, where, i);
				p->groups[p->ngroups++] = (uint32_t)d;
			}
		}
	}
	json_t *t = json_object_get(pj, "terminal");
	if (t && !json_is_null(t) && !json_is_boolean(t))
		return cap_err_set(x->err, EINVAL, "%s: %s.terminal is not true or false; fix the file", x->file, where);
	p->terminal = json_is_true(t);
	json_t *cs = json_object_get(pj, "consoleSize");
	if (cs && !json_is_null(cs)) {
		uint64_t h = 0, w = 0;
		_cleanup_free_ char *fh = xasprintf("%s.consoleSize.height", where);
		_cleanup_free_ char *fw = xasprintf("%s.consoleSize.width", where);
		if ((r = get_u64(x, cs, "height", fh, UINT16_MAX, &h)) < 0 ||
		    (r = get_u64(x, cs, "width", fw, UINT16_MAX, &w)) < 0)
			return r;
		p->rows = (uint16_t)h;
		p->cols = (uint16_t)w;
	}
	return parse_rlimits(x, json_object_get(pj, "rlimits"), where, p);
}

void cap_oci_process_fini(struct cap_oci_process *p)
{
	if (!p)
		return;
	cap_strv_free(p->args, p->nargs);
	cap_strv_free(p->env, p->nenv);
	free(p->cwd);
	memset(p, 0, sizeof(*p));
}

void cap_oci_config_fini(struct cap_oci_config *c)
{
	if (!c)
		return;
	free(c->bundle);
	free(c->rootfs);
	cap_oci_process_fini(&c->process);
	free(c->hostname);
	cap_strv_free(c->ann_keys, c->nann);
	cap_strv_free(c->ann_values, c->nann);
	free(c->cgroups_path);
	for (size_t i = 0; i < c->nfiles; i++) {
		free(c->files[i].dest);
		free(c->files[i].source);
	}
	free(c->files);
	cap_strv_free(c->guest_mounts, c->nguest_mounts);
	free(c->netns_path);
	memset(c, 0, sizeof(*c));
}

static json_t *load_json(const char *path, struct cap_err *err)
{
	json_error_t je;
	json_t *j = json_load_file(path, JSON_DECODE_INT_AS_REAL, &je);
	if (j)
		return j;
	if (access(path, R_OK) < 0) {
		int e = errno;
		cap_err_set(err, e, "cannot read %s: %s", path, strerror(e));
	} else {
		cap_err_set(err, EINVAL, "%s is not valid JSON: %s (line %d, column %d)", path, je.text, je.line, je.column);
	}
	return NULL;
}

/* The process object of file path: the whole file, or its member key. */
static int process_from(const char *path, const char *key, struct cap_oci_process *out,
			struct cap_err *err)
{
	json_t *j = load_json(path, err);
	if (!j)
		return -err->code;
	struct ctx x = { .file = path, .err = err };
	struct cap_oci_process p = { 0 };
	int r = parse_process(&x, key ? json_object_get(j, key) : j, "process", &p);
	json_decref(j);
	if (r < 0) {
		cap_oci_process_fini(&p);
		return r;
	}
	*out = p;
	return 0;
}

int cap_oci_process_load(const char *path, struct cap_oci_process *out,
			 struct cap_err *err)
{
	return process_from(path, NULL, out, err);
}

int cap_oci_config_process(const char *bundle, struct cap_oci_process *out,
			   struct cap_err *err)
{
	_cleanup_free_ char *path = xasprintf("%s/config.json", bundle);
	return process_from(path, "process", out, err);
}

static bool hostname_ok(const char *h)
{
	size_t n = strlen(h);
	return n >= 1 && n <= 20 && strspn(h, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == n;
}

/* Count the CPUs of a cpuset list ("0-3,5"); -1 when malformed. */
static long cpuset_count(const char *s)
{
	long count = 0;
	while (*s) {
		char *end;
		if (!isdigit((unsigned char)*s))
			return -1;
		unsigned long a = strtoul(s, &end, 10), b = a;
		if (*end == '-') {
			if (!isdigit((unsigned char)end[1]))
				return -1;
			b = strtoul(end + 1, &end, 10);
		}
		if (b < a || b > 65535)
			return -1;
		count += (long)(b - a + 1);
		if (*end == ',')
			end++;
		else if (*end)
			return -1;
		s = end;
	}
	return count;
}

static int parse_resources(struct ctx *x, json_t *res, struct cap_oci_config *c)
{
	int r;
	int64_t limit = -1;
	json_t *mem = json_object_get(res, "memory");
	if ((r = get_i64(x, mem, "limit", "linux.resources.memory.limit", &limit)) < 0)
		return r;
	json_t *cpu = json_object_get(res, "cpu");
	int64_t quota = 0;
	uint64_t period = 0, shares = 0;
	const char *cpuset = NULL;
	if ((r = get_i64(x, cpu, "quota", "linux.resources.cpu.quota", &quota)) < 0 ||
	    (r = get_u64(x, cpu, "period", "linux.resources.cpu.period", UINT64_MAX, &period)) < 0 ||
	    (r = get_u64(x, cpu, "shares", "linux.resources.cpu.shares", UINT64_MAX, &shares)) < 0 ||
	    (r = get_str(x, cpu, "cpus", "linux.resources.cpu.cpus", &cpuset)) < 0)
		return r;
	c->cpu_quota = quota > 0 ? quota : 0;
	c->cpu_period = period;
	c->cpu_shares = shares;
	long online = sysconf(_SC_NPROCESSORS_ONLN);
	if (online < 1)
		online = 1;
	if (quota > 0) {
		/* The kernel's default period when none is given. */
		uint64_t p = period ? period : 100000;
		uint64_t n = ((uint64_t)quota + p - 1) / p;
		if (n > (uint64_t)online || n > CAP_CPUS_MAX)
			return cap_err_set(x->err, ERANGE, "%s: linux.resources.cpu.quota %" PRId64 " over period %" PRIu64 " asks for %" PRIu64 " CPUs, more than this host's %ld online CPUs (and capsule's %d vCPUs per VM); ask for at most %ld (--cpus)",
					   x->file, quota, p, n, online, CAP_CPUS_MAX, CAP_MIN(online, (long)CAP_CPUS_MAX));
		c->cpus = (unsigned)n;
	} else if (cpuset && *cpuset) {
		long n = cpuset_count(cpuset);
		if (n < 1)
			return cap_err_set(x->err, EINVAL, "%s: linux.resources.cpu.cpus \"%s\" is not a CPU list such as \"0-3,5\"; fix it", x->file, cpuset);
		if (n > online || n > CAP_CPUS_MAX)
			return cap_err_set(x->err, ERANGE, "%s: linux.resources.cpu.cpus \"%s\" names %ld CPUs, more than this host's %ld online CPUs (and capsule's %d vCPUs per VM); name at most %ld",
					   x->file, cpuset, n, online, CAP_CPUS_MAX, CAP_MIN(online, (long)CAP_CPUS_MAX));
		c->cpus = (unsigned)n;
	} else {
		c->cpus = 1;
	}

	/* cgroup v1's own "unlimited" (9223372036854771712), copied by some
	 * tools, means no limit, as -1 does. */
	if (limit > 0 && limit < (int64_t)1 << 62) {
		uint64_t limit_mib = (uint64_t)limit >> 20;
		uint64_t least = CAP_MEMORY_MIN_MIB + CAP_OCI_MEMORY_RESERVE_MIB;
		if (limit_mib < least)
			return cap_err_set(x->err, ERANGE, "%s: linux.resources.memory.limit %" PRId64 " bytes (%" PRIu64 " MiB) is too small for a VM: capsule keeps %d MiB of the limit for QEMU, the shim and the monitor, and a VM needs at least %d MiB; give at least %" PRIu64 " MiB (--memory %" PRIu64 "m)",
					   x->file, limit, limit_mib, CAP_OCI_MEMORY_RESERVE_MIB, CAP_MEMORY_MIN_MIB, least, least);
		if (limit_mib - CAP_OCI_MEMORY_RESERVE_MIB > CAP_MEMORY_MAX_MIB)
			return cap_err_set(x->err, ERANGE, "%s: linux.resources.memory.limit %" PRId64 " bytes is more than a VM can have (%d MiB); give less",
					   x->file, limit, CAP_MEMORY_MAX_MIB);
		c->memory_limit = (uint64_t)limit;
		c->memory_mib = (unsigned)(limit_mib - CAP_OCI_MEMORY_RESERVE_MIB);
		/* The host's bounds (its memory less a reserve). The cpus
		 * were checked above against the online CPUs already. */
		if ((r = cap_named_check_size(c->cpus, c->memory_mib, 0, 0, false, x->err)) < 0) {
			/* capsule's --force-size has no OCI equivalent. */
			char *f = strstr(x->err->msg, ", or add --force-size");
			if (f)
				memmove(f, f + 21, strlen(f + 21) + 1);
			cap_err_prefix(x->err, "%s: linux.resources.memory.limit %" PRId64 " bytes gives a VM of %u MiB",
				       x->file, limit, c->memory_mib);
			return r;
		}
	} else {
		c->memory_mib = CAP_OCI_MEMORY_DEFAULT_MIB;
	}

	int64_t pids = 0;
	if ((r = get_i64(x, json_object_get(res, "pids"), "limit", "linux.resources.pids.limit", &pids)) < 0)
		return r;
	c->pids_limit = pids > 0 ? pids : 0;
	return 0;
}

/* A path with no "." or ".." component. */
static bool path_clean(const char *p)
{
	for (const char *s = p; *s;) {
		size_t n = strcspn(s, "/");
		if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return false;
		s += n;
		s += *s == '/';
	}
	return true;
}

/* systemd's nested path of a slice, as runc's ExpandSlice:
 * "a-b-c.slice" -> "a.slice/a-b.slice/a-b-c.slice"; "-.slice" -> "". */
static int expand_slice(struct ctx *x, const char *cp, const char *slice, char **out)
{
	size_t n = strlen(slice);
	if (n < 6 || strcmp(slice + n - 6, ".slice") != 0 || strchr(slice, '/'))
		return cap_err_set(x->err, EINVAL, "%s: linux.cgroupsPath \"%s\": \"%s\" is not a systemd slice (NAME.slice); fix it", x->file, cp, slice);
	if (strcmp(slice, "-.slice") == 0) {
		*out = xstrdup("");
		return 0;
	}
	size_t base = n - 6;
	if (slice[0] == '-' || slice[base - 1] == '-' || strstr(slice, "--"))
		return cap_err_set(x->err, EINVAL, "%s: linux.cgroupsPath \"%s\": \"%s\" is not a valid systemd slice name; fix it", x->file, cp, slice);
	char *path = xstrdup("");
	for (size_t i = 0; i <= base; i++) {
		if (i == base || slice[i] == '-') {
			char *next = xasprintf("%s%s%.*s.slice", path, *path ? "/" : "", (int)i, slice);
			free(path);
			path = next;
		}
	}
	*out = path;
	return 0;
}

static int parse_cgroups_path(struct ctx *x, const char *cp, bool systemd,
			      struct cap_oci_config *c)
{
	if (!cp || !*cp) {
		c->cgroups_path = xstrdup("");
		return 0;
	}
	if (!systemd) {
		if (!path_clean(cp))
			return cap_err_set(x->err, EINVAL, "%s: linux.cgroupsPath \"%s\" has a \".\" or \"..\" component; give a path below the cgroup root", x->file, cp);
		c->cgroups_path = xstrdup(cp);
		return 0;
	}
	const char *a = strchr(cp, ':'), *b = a ? strchr(a + 1, ':') : NULL;
	if (!a || !b || strchr(b + 1, ':'))
		return cap_err_set(x->err, EINVAL, "%s: linux.cgroupsPath \"%s\" is not systemd's \"slice:prefix:name\", which --systemd-cgroup expects; give that form or drop --systemd-cgroup",
				   x->file, cp);
	_cleanup_free_ char *slice = xstrndup(cp, (size_t)(a - cp));
	_cleanup_free_ char *prefix = xstrndup(a + 1, (size_t)(b - a - 1));
	const char *name = b + 1;
	if (!*name || strchr(name, '/') || strchr(prefix, '/') || !path_clean(name))
		return cap_err_set(x->err, EINVAL, "%s: linux.cgroupsPath \"%s\": the name is empty or holds '/'; fix it", x->file, cp);
	_cleanup_free_ char *sp = NULL;
	int r = expand_slice(x, cp, *slice ? slice : "system.slice", &sp);
	if (r < 0)
		return r;
	c->cgroups_path = xasprintf("%s%s%s%s%s.scope", sp, *sp ? "/" : "", prefix, *prefix ? "-" : "", name);
	return 0;
}

static bool has_option(json_t *m, const char *opt)
{
	size_t i;
	json_t *o;
	json_array_foreach(json_object_get(m, "options"), i, o)
		if (json_string_value(o) && strcmp(json_string_value(o), opt) == 0)
			return true;
	return false;
}

static void add_guest_mount(struct cap_oci_config *c, const char *dest)
{
	c->guest_mounts = xrealloc(c->guest_mounts, (c->nguest_mounts + 2) * sizeof(char *));
	c->guest_mounts[c->nguest_mounts++] = xstrdup(dest);
	c->guest_mounts[c->nguest_mounts] = NULL;
}

/* Drop "//" and a trailing '/' from the absolute path d, in place. */
static void squeeze_slashes(char *d)
{
	size_t len = 0;
	for (const char *p = d; *p; p++)
		if (*p != '/' || (p[1] != '/' && (p[1] != '\0' || len == 0)))
			d[len++] = *p;
	d[len] = '\0';
}

/* Whether a tmpfs at d is one of the guest's own mounts (or under /dev,
 * /proc or /sys, which the guest fills itself): left out of the image
 * only, not made by the agent. */
static bool guest_tmpfs(const char *d)
{
	/* The mounts moved into the final root (/proc, /sys, /dev, /tmp,
	 * /run), and whatever is below the reserved ones that are not a disk
	 * (/dev/pts, /proc/...). */
	const struct cap_guest_mount *m = cap_guest_mount_at(d), *o = cap_guest_mount_over(d);
	return (m && (m->attr & CAP_GUEST_MOVED)) || (o && !o->serial);
}

/* A tmpfs mount for the agent: its options as flags and mount data. */
static int add_tmpfs(struct ctx *x, json_t *m, size_t i, const char *d, struct cap_oci_config *c,
		     size_t *count)
{
	static const struct {
		const char *name;
		uint32_t set, clear;
	} flags[] = {
		{ "nosuid", MS_NOSUID, 0 }, { "suid", 0, MS_NOSUID },
		{ "nodev", MS_NODEV, 0 },   { "dev", 0, MS_NODEV },
		{ "noexec", MS_NOEXEC, 0 }, { "exec", 0, MS_NOEXEC },
		{ "ro", MS_RDONLY, 0 },     { "rw", 0, MS_RDONLY },
		{ "noatime", MS_NOATIME, 0 }, { "atime", 0, MS_NOATIME },
	};
	static const char *const data_keys[] = { "mode=", "size=", "nr_inodes=", "uid=", "gid=" };
	if (++*count > CAP_SETUP_MAX_TMPFS)
		return 0;	/* refused once all are counted */
	struct cap_setup_tmpfs t = { .flags = 0 };
	if (strlen(d) >= sizeof(t.destination))
		return cap_err_set(x->err, EINVAL, "%s: mounts[%zu]: a tmpfs at %.64s...: the path is over 255 bytes; shorten it",
				   x->file, i, d);
	if (strcmp(d, "/") == 0 || cap_guest_file_root(d))
		return cap_err_set(x->err, EINVAL, "%s: mounts[%zu]: a tmpfs at %s: capsule's guest mounts its own file system there; choose another destination",
				   x->file, i, d);
	snprintf(t.destination, sizeof(t.destination), "%s", d);
	size_t k, used = 0;
	json_t *o;
	json_array_foreach(json_object_get(m, "options"), k, o) {
		const char *opt = json_string_value(o);
		if (!opt)
			continue;
		if (strchr(opt, ','))
			return cap_err_set(x->err, EINVAL, "%s: mounts[%zu] (tmpfs at %s): option \"%s\" holds a ','; give each option as its own string",
					   x->file, i, d, opt);
		bool flag = false, data = false;
		for (size_t f = 0; f < CAP_ARRAY_SIZE(flags) && !flag; f++) {
			if (strcmp(opt, flags[f].name) == 0) {
				t.flags = (t.flags | flags[f].set) & ~flags[f].clear;
				flag = true;
			}
		}
		for (size_t f = 0; f < CAP_ARRAY_SIZE(data_keys) && !data; f++)
			data = strncmp(opt, data_keys[f], strlen(data_keys[f])) == 0;
		/* Anything else (Podman's tmpcopyup, rprivate, strictatime,
		 * relatime...) is dropped: propagation and atime modes are the
		 * guest's, and tmpcopyup (the image's content there copied into
		 * the new tmpfs) is not done (docs/oci.md). */
		if (!data)
			continue;
		size_t n = strlen(opt);
		if (used + !!used + n >= sizeof(t.data))
			return cap_err_set(x->err, EINVAL, "%s: mounts[%zu] (tmpfs at %s): its options are over 255 bytes; shorten them",
					   x->file, i, d);
		used += (size_t)snprintf(t.data + used, sizeof(t.data) - used, "%s%s", used ? "," : "", opt);
	}
	if (!cap_proto_setup_tmpfs_ok(&t))
		return cap_err_set(x->err, EINVAL, "%s: mounts[%zu]: a tmpfs at %s: the guest cannot mount it there; fix the destination",
				   x->file, i, d);
	c->tmpfs[c->ntmpfs++] = t;
	return 0;
}

static int parse_mounts(struct ctx *x, json_t *mounts, struct cap_oci_config *c)
{
	static const char *const guest_types[] = { "proc", "sysfs", "tmpfs", "devpts", "mqueue", "cgroup", "cgroup2" };
	if (!mounts || json_is_null(mounts))
		return 0;
	if (!json_is_array(mounts))
		return cap_err_set(x->err, EINVAL, "%s: mounts is not an array; fix the file", x->file);
	size_t i, ntmpfs = 0;
	json_t *m;
	int r;
	json_array_foreach(mounts, i, m) {
		const char *dest = json_string_value(json_object_get(m, "destination"));
		const char *type = json_string_value(json_object_get(m, "type"));
		const char *src = json_string_value(json_object_get(m, "source"));
		if (!dest || !*dest)
			return cap_err_set(x->err, EINVAL, "%s: mounts[%zu].destination is missing; fix the file", x->file, i);
		_cleanup_free_ char *d = dest[0] == '/' ? xstrdup(dest) : xasprintf("/%s", dest);
		if (!path_clean(d))
			return cap_err_set(x->err, EINVAL, "%s: mounts[%zu].destination \"%s\" has a \".\" or \"..\" component; fix it", x->file, i, dest);
		squeeze_slashes(d);
		bool bind = (type && strcmp(type, "bind") == 0) || has_option(m, "bind") || has_option(m, "rbind");
		if (!bind) {
			bool guest = false;
			for (size_t k = 0; type && k < CAP_ARRAY_SIZE(guest_types); k++)
				guest |= strcmp(type, guest_types[k]) == 0;
			if (!guest)
				return cap_err_set(x->err, EINVAL, "%s: mounts[%zu] (%s) of type \"%s\": capsule's guest provides proc, sysfs, tmpfs, devpts, mqueue and cgroup mounts and copies bind-mounted files; it cannot mount this type; remove the mount",
						   x->file, i, d, type ? type : "(none)");
			if (strcmp(type, "tmpfs") == 0 && !guest_tmpfs(d) &&
			    (r = add_tmpfs(x, m, i, d, c, &ntmpfs)) < 0)
				return r;
			add_guest_mount(c, d);
			continue;
		}
		if (strcmp(d, "/dev/shm") == 0) {
			add_guest_mount(c, d);
			continue;
		}
		if (!src || !*src)
			return cap_err_set(x->err, EINVAL, "%s: mounts[%zu] (%s) is a bind mount without a source; fix the file", x->file, i, d);
		_cleanup_free_ char *s = src[0] == '/' ? xstrdup(src) : xasprintf("%s/%s", c->bundle, src);
		struct stat st;
		if (stat(s, &st) < 0)
			return cap_err_set(x->err, errno, "%s: bind mount %s -> %s: cannot read the source: %s", x->file, s, d, strerror(errno));
		if (!S_ISREG(st.st_mode))
			return cap_err_set(x->err, EINVAL, "bind mount %s -> %s: capsule runs containers in VMs and cannot share a host directory yet (docs/oci.md); remove the volume", s, d);
		if ((uint64_t)st.st_size > CAP_OCI_FILE_MAX)
			return cap_err_set(x->err, EFBIG, "bind mount %s -> %s: the file has %lld bytes; capsule copies bind-mounted files into the VM, at most %u bytes each; remove the mount or make the file smaller",
					   s, d, (long long)st.st_size, CAP_OCI_FILE_MAX);
		c->files = xrealloc(c->files, (c->nfiles + 1) * sizeof(*c->files));
		c->files[c->nfiles++] = (struct cap_oci_file){ .dest = xstrdup(d), .source = xstrdup(s) };
	}
	if (ntmpfs > CAP_SETUP_MAX_TMPFS)
		return cap_err_set(x->err, EINVAL, "%s: %zu tmpfs mounts: capsule's guest makes at most %d (besides its own /dev, /dev/shm, /tmp and /run); remove some",
				   x->file, ntmpfs, CAP_SETUP_MAX_TMPFS);
	/* A copied file lives in the root's upper layer, which a tmpfs over
	 * one of its parents would hide (runc mounts the file after the
	 * tmpfs, on top of it). */
	for (size_t f = 0; f < c->nfiles; f++) {
		for (size_t t = 0; t < c->ntmpfs; t++) {
			size_t n = strlen(c->tmpfs[t].destination);
			if (strncmp(c->files[f].dest, c->tmpfs[t].destination, n) == 0 && c->files[f].dest[n] == '/')
				return cap_err_set(x->err, EINVAL, "%s: the bind mount %s -> %s is inside the tmpfs at %s, which would hide it "
						   "(capsule copies a file into the root, below its tmpfs mounts); mount the file elsewhere",
						   x->file, c->files[f].source, c->files[f].dest, c->tmpfs[t].destination);
		}
	}
	return 0;
}

/* Open the network namespace at path: the descriptor, or -errno, with
 * -EINVAL and *why when path is not a namespace file or one of another
 * type. The path is first opened O_PATH, which neither blocks (a FIFO
 * would, until a writer came) nor acts on a device; it is reopened for
 * setns only once it is known to be nsfs. Links are followed: the usual
 * spelling, /proc/PID/ns/net, is one. */
static int netns_open(const char *path, const char **why)
{
	int p = open(path, O_PATH | O_CLOEXEC);
	if (p < 0)
		return -errno;
	struct statfs sf;
	if (fstatfs(p, &sf) < 0 || sf.f_type != NSFS_MAGIC) {
		close(p);
		*why = "it is not a namespace file (nsfs), such as /proc/PID/ns/net or a bind mount of one under /run/netns";
		return -EINVAL;
	}
	char self[64];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", p);
	int ns = open(self, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
	int e = errno;
	close(p);
	if (ns < 0)
		return -e;
	if (ioctl(ns, NS_GET_NSTYPE) != CLONE_NEWNET) {
		close(ns);
		*why = "it is a namespace of another type, not a network namespace";
		return -EINVAL;
	}
	return ns;
}

/* The interfaces of the network namespace ns (netns_open) other than
 * "lo", as one ", "-separated string (empty when none); a child joins
 * it, so that this process stays where it was. */
static int netns_interfaces(int ns, char *out, size_t size)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC) < 0)
		return -errno;
	pid_t pid = fork();
	if (pid < 0) {
		int e = errno;
		close(fds[0]);
		close(fds[1]);
		return -e;
	}
	if (pid == 0) {
		close(fds[0]);
		char err = 0;
		if (setns(ns, CLONE_NEWNET) < 0)
			err = (char)errno;
		if (err) {
			(void)!write(fds[1], &err, 1);
			_exit(1);
		}
		(void)!write(fds[1], "", 1);
		struct if_nameindex *ifs = if_nameindex();
		for (struct if_nameindex *i = ifs; i && i->if_name; i++) {
			if (strcmp(i->if_name, "lo") == 0)
				continue;
			(void)!write(fds[1], i->if_name, strlen(i->if_name));
			(void)!write(fds[1], ", ", 2);
		}
		_exit(ifs ? 0 : 2);
	}
	close(fds[1]);
	char buf[1024];
	size_t n = 0;
	ssize_t k;
	while (n < sizeof(buf) - 1 && ((k = read(fds[0], buf + n, sizeof(buf) - 1 - n)) > 0 || (k < 0 && errno == EINTR)))
		n += k > 0 ? (size_t)k : 0;
	close(fds[0]);
	int status;
	while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
		;
	buf[n] = '\0';
	if (n == 0)
		return -EIO;
	if (buf[0] != '\0')
		return -(unsigned char)buf[0];
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		return -EIO;
	size_t len = strlen(buf + 1);
	if (len >= 2)
		len -= 2;	/* the last ", " */
	snprintf(out, size, "%.*s", (int)len, buf + 1);
	return 0;
}

/* Hooks run in the runtime's namespaces at points of the container's
 * life inside them; the container is in a VM here. Refused, named. */
static int refuse_hooks(struct ctx *x, json_t *hooks)
{
	char names[256] = "";
	const char *k;
	json_t *v;
	json_object_foreach(hooks, k, v) {
		if (json_array_size(v) == 0)
			continue;
		size_t n = strlen(names);
		snprintf(names + n, sizeof(names) - n, "%s%s", n ? ", " : "", k);
	}
	if (names[0])
		return cap_err_set(x->err, EINVAL, "%s: hooks (%s) are not supported: the container runs in a VM "
				   "whose processes a host hook cannot reach; remove them", x->file, names);
	return 0;
}

/* The value of annotation key, NULL when absent. */
static const char *annotation(const struct cap_oci_config *c, const char *key)
{
	for (size_t i = 0; i < c->nann; i++)
		if (strcmp(c->ann_keys[i], key) == 0)
			return c->ann_values[i];
	return NULL;
}

/* A pod's sandbox container (CRI's container-type "sandbox") with the
 * network namespace CNI made at path: its one veth and IPv4 address are
 * carried into the VM (docs/oci.md, "The pod's network"); anything else
 * there is refused, naming the namespace and what it holds. */
static int pod_netns(struct ctx *x, const char *path, struct cap_oci_config *c)
{
	struct cap_pod_net p;
	int r = cap_sandbox_pod_net_read(path, &p, x->err);
	if (r < 0) {
		cap_err_prefix(x->err, "%s: linux.namespaces network path of the pod's sandbox", x->file);
		return r;
	}
	c->netns_path = xstrdup(path);
	c->pod_network = true;
	return 0;
}

static int parse_namespaces(struct ctx *x, json_t *linux_, struct cap_oci_config *c)
{
	json_t *um = json_object_get(linux_, "uidMappings");
	json_t *gm = json_object_get(linux_, "gidMappings");
	if (json_array_size(um) || json_array_size(gm))
		return cap_err_set(x->err, EINVAL, "%s: linux.uidMappings/gidMappings: user namespaces are not supported by capsule (the VM is the boundary; root in the container is root only in its VM); run without --userns or uid mappings",
				   x->file);
	const char *ctype = annotation(c, CAP_OCI_ANN_CONTAINER_TYPE);
	bool sandbox = ctype && strcmp(ctype, "sandbox") == 0;
	bool in_pod = ctype && strcmp(ctype, "container") == 0;
	json_t *ns = json_object_get(linux_, "namespaces");
	size_t i;
	json_t *n;
	bool net = false;
	json_array_foreach(ns, i, n) {
		const char *type = json_string_value(json_object_get(n, "type"));
		if (!type || strcmp(type, "network") != 0)
			continue;
		net = true;
		const char *path = json_string_value(json_object_get(n, "path"));
		if (!path || !*path)
			continue;	/* a new, empty namespace */
		char ifs[512];
		const char *why = NULL;
		int r = netns_open(path, &why);
		if (r < 0 && why)
			return cap_err_set(x->err, -r, "%s: linux.namespaces network path %s: %s; give a network namespace's path, or none for a new one",
					   x->file, path, why);
		if (r >= 0 && sandbox) {
			close(r);
			return pod_netns(x, path, c);
		}
		if (r >= 0 && in_pod) {
			/* A container of a pod: the pod's namespace, whose
			 * network is the sandbox's VM's. */
			close(r);
			c->netns_path = xstrdup(path);
			continue;
		}
		if (r >= 0) {
			int ns = r;
			r = netns_interfaces(ns, ifs, sizeof(ifs));
			close(ns);
		}
		if (r < 0)
			return cap_err_set(x->err, -r, "%s: linux.namespaces network path %s: cannot look into it: %s", x->file, path, strerror(-r));
		if (*ifs)
			return cap_err_set(x->err, EINVAL, "%s: the network namespace %s holds %s besides lo: capsule gives containers no network yet: use --network none",
					   x->file, path, ifs);
		c->netns_path = xstrdup(path);
	}
	if (!net && (sandbox || in_pod))
		return cap_err_set(x->err, EINVAL, "%s: hostNetwork pods are not supported: the pod has no network namespace of its own (linux.namespaces has none: the host's network), and capsule's VM never shares the host's; run the pod without hostNetwork",
				   x->file);
	if (!net)
		return cap_err_set(x->err, EINVAL, "%s: linux.namespaces has no network namespace, which means the host's network: capsule gives containers no network yet: use --network none",
				   x->file);
	return 0;
}

/* A pod's sandbox or container (CRI's container-type): the host's PID or
 * IPC namespace (hostPID, hostIPC: CRI leaves that namespace out of
 * linux.namespaces) and user mappings are refused, naming the field;
 * the pod's processes run in its VM, which shares nothing of the host's. */
static int pod_namespaces(struct ctx *x, json_t *linux_)
{
	static const struct { const char *type, *field; } needed[] = {
		{ "pid", "hostPID" }, { "ipc", "hostIPC" },
	};
	json_t *um = json_object_get(linux_, "uidMappings");
	json_t *gm = json_object_get(linux_, "gidMappings");
	if (json_array_size(um) || json_array_size(gm))
		return cap_err_set(x->err, EINVAL, "%s: linux.uidMappings/gidMappings: user namespaces are not supported in capsule's pods (the VM is the boundary; root in a container is root only in its pod's VM); run the pod without hostUsers: false",
				   x->file);
	json_t *ns = json_object_get(linux_, "namespaces");
	for (size_t k = 0; k < CAP_ARRAY_SIZE(needed); k++) {
		bool found = false;
		size_t i;
		json_t *n;
		json_array_foreach(ns, i, n) {
			const char *type = json_string_value(json_object_get(n, "type"));
			found = found || (type && strcmp(type, needed[k].type) == 0);
		}
		if (!found)
			return cap_err_set(x->err, EINVAL, "%s: %s pods are not supported: linux.namespaces has no %s namespace, which means the host's, and the pod's processes run in its VM, which never shares the host's; run the pod without %s",
					   x->file, needed[k].field, needed[k].type, needed[k].field);
	}
	return 0;
}

/* Whether config's CRI container-type is type. */
static bool cri_type_is(json_t *config, const char *type)
{
	json_t *a = json_object_get(config, "annotations");
	const char *t = json_string_value(json_object_get(a, CAP_OCI_ANN_CONTAINER_TYPE));
	return t && strcmp(t, type) == 0;
}

/* A pod's container (oci-pod.c reads the rest of its config). */
bool cap_oci_pod_member_json(json_t *config)
{
	return cri_type_is(config, "container");
}

int cap_oci_config_load(const char *bundle, bool systemd_cgroup,
			struct cap_oci_config *out, struct cap_err *err)
{
	struct cap_oci_config c = { 0 };
	_cleanup_free_ char *joined = NULL;
	char *abs = realpath(bundle, NULL);
	if (!abs)
		return cap_err_set(err, errno, "bundle %s: %s", bundle, strerror(errno));
	c.bundle = abs;
	_cleanup_free_ char *file = xasprintf("%s/config.json", abs);
	json_t *j = load_json(file, err);
	if (!j) {
		cap_oci_config_fini(&c);
		return -err->code;
	}
	struct ctx x = { .file = file, .err = err };
	int r = 0;
	bool member = cap_oci_pod_member_json(j);
	json_t *root = json_object_get(j, "root");
	const char *rp = NULL;
	if ((r = get_str(&x, root, "path", "root.path", &rp)) < 0)
		goto fail;
	if (!rp || !*rp) {
		r = cap_err_set(err, EINVAL, "%s: root.path is missing; give the container's root directory", file);
		goto fail;
	}
	joined = rp[0] == '/' ? xstrdup(rp) : xasprintf("%s/%s", abs, rp);
	struct stat st;
	int e = stat(joined, &st) < 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
	if (e) {
		r = cap_err_set(err, e, "%s: root.path %s: %s; give the container's root directory", file, joined, strerror(e));
		goto fail;
	}
	c.rootfs = realpath(joined, NULL);
	if (!c.rootfs)
		c.rootfs = xstrdup(joined);
	c.root_readonly = json_is_true(json_object_get(root, "readonly"));

	if ((r = parse_process(&x, json_object_get(j, "process"), "process", &c.process)) < 0)
		goto fail;
	const char *h = NULL;
	if ((r = get_str(&x, j, "hostname", "hostname", &h)) < 0)
		goto fail;
	if (h && *h && !member) {
		if (!hostname_ok(h)) {
			r = cap_err_set(err, EINVAL, "%s: hostname \"%s\" cannot be the VM's: give 1 to 20 of A-Z, a-z, 0-9, '.', '_', '-' (--hostname)", file, h);
			goto fail;
		}
		c.hostname = xstrdup(h);
	}
	json_t *ann = json_object_get(j, "annotations");
	if (ann && !json_is_null(ann)) {
		if (!json_is_object(ann)) {
			r = cap_err_set(err, EINVAL, "%s: annotations is not an object; fix the file", file);
			goto fail;
		}
		size_t n = json_object_size(ann);
		c.ann_keys = xcalloc(n + 1, sizeof(char *));
		c.ann_values = xcalloc(n + 1, sizeof(char *));
		const char *k;
		json_t *v;
		json_object_foreach(ann, k, v) {
			if (!json_is_string(v)) {
				r = cap_err_set(err, EINVAL, "%s: annotations.%s is not a string; fix the file", file, k);
				goto fail;
			}
			c.ann_keys[c.nann] = xstrdup(k);
			c.ann_values[c.nann++] = xstrdup(json_string_value(v));
		}
	}
	json_t *linux_ = json_object_get(j, "linux");
	if ((r = member ? 0 : parse_resources(&x, json_object_get(linux_, "resources"), &c)) < 0)
		goto fail;
	const char *cp = NULL;
	if ((r = get_str(&x, linux_, "cgroupsPath", "linux.cgroupsPath", &cp)) < 0 ||
	    (r = parse_cgroups_path(&x, cp, systemd_cgroup, &c)) < 0 ||
	    (r = member ? 0 : parse_mounts(&x, json_object_get(j, "mounts"), &c)) < 0 ||
	    (r = member ? 0 : parse_namespaces(&x, linux_, &c)) < 0 ||
	    (r = member || cri_type_is(j, "sandbox") ? pod_namespaces(&x, linux_) : 0) < 0 ||
	    (r = refuse_hooks(&x, json_object_get(j, "hooks"))) < 0)
		goto fail;
	json_decref(j);
	*out = c;
	return 0;
fail:
	json_decref(j);
	cap_oci_config_fini(&c);
	return r;
}

static const char *const signal_names[] = {
	[SIGHUP] = "HUP", [SIGINT] = "INT", [SIGQUIT] = "QUIT", [SIGILL] = "ILL",
	[SIGTRAP] = "TRAP", [SIGABRT] = "ABRT", [SIGBUS] = "BUS", [SIGFPE] = "FPE",
	[SIGKILL] = "KILL", [SIGUSR1] = "USR1", [SIGSEGV] = "SEGV", [SIGUSR2] = "USR2",
	[SIGPIPE] = "PIPE", [SIGALRM] = "ALRM", [SIGTERM] = "TERM", [SIGSTKFLT] = "STKFLT",
	[SIGCHLD] = "CHLD", [SIGCONT] = "CONT", [SIGSTOP] = "STOP", [SIGTSTP] = "TSTP",
	[SIGTTIN] = "TTIN", [SIGTTOU] = "TTOU", [SIGURG] = "URG", [SIGXCPU] = "XCPU",
	[SIGXFSZ] = "XFSZ", [SIGVTALRM] = "VTALRM", [SIGPROF] = "PROF", [SIGWINCH] = "WINCH",
	[SIGIO] = "IO", [SIGPWR] = "PWR", [SIGSYS] = "SYS",
};

int cap_oci_signal_parse(const char *s, struct cap_err *err)
{
	const char *n = s ? s : "";
	char *end;
	if (isdigit((unsigned char)*n)) {
		long v = strtol(n, &end, 10);
		if (!*end && v >= 1 && v <= 64)
			return (int)v;
		return cap_err_set(err, EINVAL, "signal \"%s\" is not valid: give a number from 1 to 64 or a name such as TERM, SIGKILL or SIGRTMIN+3", n);
	}
	if (strncasecmp(n, "SIG", 3) == 0)
		n += 3;
	for (int i = 1; i < (int)CAP_ARRAY_SIZE(signal_names); i++)
		if (signal_names[i] && strcasecmp(n, signal_names[i]) == 0)
			return i;
	/* SIGIOT, SIGCLD, SIGPOLL: aliases runc knows too. */
	if (strcasecmp(n, "IOT") == 0)
		return SIGABRT;
	if (strcasecmp(n, "CLD") == 0)
		return SIGCHLD;
	if (strcasecmp(n, "POLL") == 0)
		return SIGIO;
	/* Real-time signals by their Linux numbers (34 to 64), as glibc's
	 * SIGRTMIN and SIGRTMAX would be in the guest. */
	bool min = strncasecmp(n, "RTMIN", 5) == 0, max = strncasecmp(n, "RTMAX", 5) == 0;
	if (min || max) {
		const char *o = n + 5;
		long off = 0;
		if (*o == '+' || *o == '-') {
			if (!isdigit((unsigned char)o[1]))
				goto bad;
			off = strtol(o, &end, 10);
			if (*end)
				goto bad;
		} else if (*o) {
			goto bad;
		}
		long v = (min ? 34 : 64) + off;
		if (v >= 34 && v <= 64)
			return (int)v;
	}
bad:
	return cap_err_set(err, EINVAL, "signal \"%s\" is not valid: give a number from 1 to 64 or a name such as TERM, SIGKILL or SIGRTMIN+3", s ? s : "");
}
