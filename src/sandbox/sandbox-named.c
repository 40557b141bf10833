/* Named sandboxes' records on disk: names and directories, record.json
 * written and loaded, the list of sandboxes and their status. */
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/sysinfo.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "log.h"
#include "named.h"
#include "netd.h"
#include "sandbox-internal.h"
#include "policy.h"
#include "sandbox.h"
#include "paths.h"
#include "store.h"
#include "tree.h"
#include "util.h"

void cap_record_init(struct cap_record *r)
{
	*r = (struct cap_record){
		.cpus = 1, .memory_mib = 512, .root_size_mib = 256, .work_size_mib = 512,
	};
	snprintf(r->image_ref, sizeof(r->image_ref), "base");
}

int cap_named_check_name(const char *name, struct cap_err *err)
{
	size_t n = strlen(name);
	bool ok = n >= 1 && n <= CAP_NAME_MAX &&
		  (islower((unsigned char)name[0]) || isdigit((unsigned char)name[0]));
	for (size_t i = 0; ok && i < n; i++)
		ok = islower((unsigned char)name[i]) || isdigit((unsigned char)name[i]) ||
		     name[i] == '-' || name[i] == '_';
	if (!ok)
		return cap_err_set(err, EINVAL, "'%s' is not a valid sandbox name: use 1 to %d characters of a-z, 0-9, '-' and '_', starting with a letter or digit",
				   name, CAP_NAME_MAX);
	return 0;
}

char *cap_named_root(void)
{
	_cleanup_free_ char *home = cap_home_dir();
	return xasprintf("%s/sandboxes", home);
}

char *cap_named_dir(const char *name)
{
	_cleanup_free_ char *root = cap_named_root();
	return xasprintf("%s/%s", root, name);
}

char *cap_named_path(const char *name, const char *file)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	return xasprintf("%s/%s", dir, file);
}

/* What SETUP takes of a tmpfs mount, for create and load alike. */
int cap_named_tmpfs_check(const struct cap_setup_tmpfs *t, const char *where, size_t i, int code,
			  struct cap_err *err)
{
	if (cap_proto_setup_tmpfs_ok(t))
		return 0;
	return cap_err_set(err, code, "%s: tmpfs[%zu] (%.255s): not an absolute clean path of at most 255 bytes, or flags other than nosuid, nodev, noexec, ro and noatime",
			   where, i, t->destination);
}

int cap_named_write_record(const struct cap_record *rec, struct cap_err *err)
{
	_cleanup_free_ char *path = cap_named_path(rec->name, "record.json");
	return cap_record_write_file(rec, path, err);
}

int cap_record_write_file(const struct cap_record *rec, const char *path, struct cap_err *err)
{
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:I}",
			      "schema", 1, "name", rec->name, "image", rec->image,
			      "image_ref", rec->image_ref, "cpus", rec->cpus,
			      "memory_mib", rec->memory_mib, "root_size_mib", rec->root_size_mib,
			      "work_size_mib", rec->work_size_mib, "created", (json_int_t)rec->created);
	if (rec->source[0])
		json_object_set_new(j, "source", json_pack("{s:s, s:s, s:I, s:I}", "path", rec->source,
							    "fingerprint", rec->source_fp,
							    "entries", (json_int_t)rec->source_entries,
							    "bytes", (json_int_t)rec->source_bytes));
	if (rec->hostname[0])
		json_object_set_new(j, "hostname", json_string(rec->hostname));
	if (rec->root_readonly)
		json_object_set_new(j, "root_readonly", json_true());
	if (rec->tools_root)
		json_object_set_new(j, "tools_root", json_true());
	if (rec->pod_netns[0])
		json_object_set_new(j, "pod_netns", json_string(rec->pod_netns));
	if (rec->snapshot[0])
		json_object_set_new(j, "snapshot", json_string(rec->snapshot));
	if (rec->resume)
		json_object_set_new(j, "resume", json_true());
	if (rec->ntmpfs) {
		json_t *list = json_array();
		for (uint32_t i = 0; i < rec->ntmpfs && i < CAP_SETUP_MAX_TMPFS; i++)
			json_array_append_new(list, json_pack("{s:s, s:s, s:I}",
							      "destination", rec->tmpfs[i].destination,
							      "data", rec->tmpfs[i].data,
							      "flags", (json_int_t)rec->tmpfs[i].flags));
		json_object_set_new(j, "tmpfs", list);
	}
	if (rec->workspace[0]) {
		json_object_set_new(j, "workspace", json_string(rec->workspace));
		json_object_set_new(j, "workspace_size_mib", json_integer(rec->workspace_size_mib));
	}
	if (rec->net[0]) {
		json_t *words = json_array();
		char buf[sizeof(rec->net)], *save = NULL;
		snprintf(buf, sizeof(buf), "%s", rec->net);
		for (char *w = strtok_r(buf, " ", &save); w; w = strtok_r(NULL, " ", &save))
			json_array_append_new(words, json_string(w));
		json_object_set_new(j, "network", words);
	}
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	if (r < 0)
		return cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r));
	return 0;
}

/* A record's "tmpfs" list (none in records from before it). */
static int load_tmpfs(json_t *list, const char *path, struct cap_record *out, struct cap_err *err)
{
	size_t i;
	json_t *m;
	if (!list)
		return 0;
	if (!json_is_array(list) || json_array_size(list) > CAP_SETUP_MAX_TMPFS)
		return cap_err_set(err, EBADMSG, "%s: \"tmpfs\" must be a list of at most %d mounts",
				   path, CAP_SETUP_MAX_TMPFS);
	json_array_foreach(list, i, m) {
		struct cap_setup_tmpfs *t = &out->tmpfs[i];
		const char *d = json_string_value(json_object_get(m, "destination"));
		const char *data = json_string_value(json_object_get(m, "data"));
		json_t *fl = json_object_get(m, "flags");
		if (!d || !data || !json_is_integer(fl) || json_integer_value(fl) < 0 ||
		    json_integer_value(fl) > UINT32_MAX || strlen(d) >= sizeof(t->destination) ||
		    strlen(data) >= sizeof(t->data))
			return cap_err_set(err, EBADMSG, "%s: tmpfs[%zu] must be {\"destination\", \"data\", \"flags\"}",
					   path, i);
		snprintf(t->destination, sizeof(t->destination), "%s", d);
		snprintf(t->data, sizeof(t->data), "%s", data);
		t->flags = (uint32_t)json_integer_value(fl);
		int r = cap_named_tmpfs_check(t, path, i, EBADMSG, err);
		if (r < 0)
			return r;
	}
	out->ntmpfs = (uint32_t)json_array_size(list);
	return 0;
}

int cap_named_load(const char *name, struct cap_record *out,
		   struct cap_err *err)
{
	int r;
	if ((r = cap_named_check_name(name, err)) < 0)
		return r;
	_cleanup_free_ char *path = cap_named_path(name, "record.json");
	if (access(path, F_OK) != 0)
		return cap_err_set(err, ENOENT, "no sandbox named '%s'; `capsule ls` lists them, `capsule create %s` makes it",
				   name, name);
	return cap_record_load_file(path, name, out, err);
}

int cap_record_load_file(const char *path, const char *name, struct cap_record *out,
			 struct cap_err *err)
{
	int r;
	json_error_t je;
	json_t *j = json_load_file(path, 0, &je);
	if (!j)
		return cap_err_set(err, EBADMSG, "%s is unreadable: %s", path, je.text);
	cap_record_init(out);
	const char *s;
	if (!name)
		name = json_string_value(json_object_get(j, "name"));
	if (!name || cap_named_check_name(name, NULL) < 0) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"name\" is not a sandbox's name", path);
	}
	snprintf(out->name, sizeof(out->name), "%s", name);
	if ((s = json_string_value(json_object_get(j, "image"))))
		snprintf(out->image, sizeof(out->image), "%s", s);
	if ((s = json_string_value(json_object_get(j, "image_ref"))))
		snprintf(out->image_ref, sizeof(out->image_ref), "%s", s);
	out->cpus = (unsigned)json_integer_value(json_object_get(j, "cpus"));
	out->memory_mib = (unsigned)json_integer_value(json_object_get(j, "memory_mib"));
	out->root_size_mib = (unsigned)json_integer_value(json_object_get(j, "root_size_mib"));
	out->work_size_mib = (unsigned)json_integer_value(json_object_get(j, "work_size_mib"));
	out->created = json_integer_value(json_object_get(j, "created"));
	json_t *src = json_object_get(j, "source");
	if (json_is_object(src)) {
		if ((s = json_string_value(json_object_get(src, "path"))))
			snprintf(out->source, sizeof(out->source), "%s", s);
		if ((s = json_string_value(json_object_get(src, "fingerprint"))))
			snprintf(out->source_fp, sizeof(out->source_fp), "%s", s);
		out->source_entries = (uint64_t)json_integer_value(json_object_get(src, "entries"));
		out->source_bytes = (uint64_t)json_integer_value(json_object_get(src, "bytes"));
	}
	/* Records from before workspaces have none. */
	if ((s = json_string_value(json_object_get(j, "hostname"))) && cap_proto_valid_name(s))
		snprintf(out->hostname, sizeof(out->hostname), "%s", s);
	/* Records from before it have none: a writable root. */
	json_t *ro = json_object_get(j, "root_readonly");
	if (ro && !json_is_boolean(ro)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"root_readonly\" must be true or false", path);
	}
	out->root_readonly = json_is_true(ro);
	/* Nor this: commands as the tool user. */
	json_t *tr = json_object_get(j, "tools_root");
	if (tr && !json_is_boolean(tr)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"tools_root\" must be true or false", path);
	}
	out->tools_root = json_is_true(tr);
	if ((s = json_string_value(json_object_get(j, "pod_netns")))) {
		if (s[0] != '/' || strlen(s) >= sizeof(out->pod_netns)) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"pod_netns\" must be an absolute path", path);
		}
		snprintf(out->pod_netns, sizeof(out->pod_netns), "%s", s);
	}
	if ((s = json_string_value(json_object_get(j, "snapshot")))) {
		if (cap_named_check_name(s, NULL) < 0) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"snapshot\" is not a snapshot's name", path);
		}
		snprintf(out->snapshot, sizeof(out->snapshot), "%s", s);
	}
	out->resume = json_is_true(json_object_get(j, "resume")) && out->snapshot[0];
	if ((r = load_tmpfs(json_object_get(j, "tmpfs"), path, out, err)) < 0) {
		json_decref(j);
		return r;
	}
	if ((s = json_string_value(json_object_get(j, "workspace")))) {
		if (s[0] != '/' || strlen(s) >= sizeof(out->workspace)) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"workspace\" must be an absolute path", path);
		}
		snprintf(out->workspace, sizeof(out->workspace), "%s", s);
		out->workspace_size_mib = (unsigned)json_integer_value(json_object_get(j, "workspace_size_mib"));
	}
	json_t *net = json_object_get(j, "network");
	size_t i, used = 0;
	json_t *w;
	if (net && !json_is_array(net)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "%s: \"network\" must be a list of flags (docs/network.md)", path);
	}
	json_array_foreach(net, i, w) {
		const char *word = json_string_value(w);
		if (!word || strchr(word, ' ') ||
		    used + strlen(word) + 2 > sizeof(out->net)) {
			json_decref(j);
			return cap_err_set(err, EBADMSG, "%s: \"network\" must be a list of flags without spaces", path);
		}
		used += (size_t)snprintf(out->net + used, sizeof(out->net) - used, "%s%s", used ? " " : "", word);
	}
	json_decref(j);
	if (strncmp(out->image, "sha256:", 7) != 0 || out->cpus < 1 || out->memory_mib < 64)
		return cap_err_set(err, EBADMSG, "%s lacks a valid image digest, cpus or memory", path);
	struct cap_net_policy *check = xmalloc(sizeof(*check));
	r = cap_record_net(out, check, err);
	free(check);
	if (r < 0)
		cap_err_prefix(err, "%s", path);
	return r;
}

int cap_record_net(const struct cap_record *r, struct cap_net_policy *out,
		   struct cap_err *err)
{
	cap_net_policy_init(out);
	if (cap_net_policy_parse_line(out, r->net, err) < 0) {
		char why[sizeof(err->msg)];
		snprintf(why, sizeof(why), "%s", err->msg);
		return cap_err_set(err, EBADMSG, "recorded network flag %s", why);
	}
	return 0;
}

int cap_record_set_net(struct cap_record *r, const struct cap_net_policy *p,
		       struct cap_err *err)
{
	_cleanup_free_ char *line = cap_net_policy_line(p);
	if (strlen(line) >= sizeof(r->net))
		return cap_err_set(err, E2BIG, "the network policy is too long to record (over %zu bytes): use fewer rules, a CIDR for neighbouring addresses or *.DOMAIN for names under one domain", sizeof(r->net) - 1);
	snprintf(r->net, sizeof(r->net), "%s", line);
	return 0;
}

static int cmp_str(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int cap_named_list(char ***names, size_t *n)
{
	_cleanup_free_ char *root = cap_named_root();
	DIR *d = opendir(root);
	size_t cap = 8, k = 0;
	char **v = xcalloc(cap, sizeof(char *));
	struct dirent *e;
	while (d && (e = readdir(d))) {
		if (cap_named_check_name(e->d_name, NULL) < 0)
			continue;
		if (k == cap)
			v = xrealloc(v, (cap *= 2) * sizeof(char *));
		v[k++] = xstrdup(e->d_name);
	}
	if (d)
		closedir(d);
	qsort(v, k, sizeof(char *), cmp_str);
	*names = v;
	*n = k;
	return 0;
}

static uint64_t used_bytes(const char *path)
{
	struct stat st;
	return stat(path, &st) == 0 ? (uint64_t)st.st_blocks * 512 : 0;
}

/* The VM's engine and hypervisor process as the shim recorded them in
 * runtime.json j ("engine", "vmm_pid"); a file from before engines has
 * only "qemu_pid", of the one engine there was. */
void cap_named_runtime_vmm(json_t *j, char *engine, size_t len, pid_t *pid)
{
	const char *e = json_string_value(json_object_get(j, "engine"));
	json_t *p = json_object_get(j, "vmm_pid");
	if (!e) {
		e = "qemu";
		p = json_object_get(j, "qemu_pid");
	}
	snprintf(engine, len, "%s", e);
	*pid = (pid_t)json_integer_value(p);
}

int cap_named_net_counts(const char *name, struct cap_named_net_counts *out)
{
	_cleanup_free_ char *dir = cap_named_dir(name);
	_cleanup_free_ char *path = xasprintf("%s/net.counters", dir);
	struct cap_netd_counters n;
	memset(out, 0, sizeof(*out));
	int r = cap_netd_counters_read(path, &n);
	if (r < 0)
		return r;
	out->refused = n.refused;
	out->bytes_out = n.bytes_out;
	out->bytes_in = n.bytes_in;
	return 0;
}

int cap_named_status(const char *name, struct cap_named_status *out,
		     struct cap_err *err)
{
	struct cap_record rec;
	int r = cap_named_load(name, &rec, err);
	if (r < 0)
		return r;
	memset(out, 0, sizeof(*out));
	_cleanup_free_ char *upper = cap_named_disk_path(&rec, "root-upper.ext4", NULL);
	_cleanup_free_ char *work = cap_named_disk_path(&rec, "private.ext4", NULL);
	_cleanup_free_ char *ws = cap_named_disk_path(&rec, "workspace.ext4", NULL);
	out->disk_bytes = used_bytes(upper) + used_bytes(work) + used_bytes(ws);
	out->has_source = rec.source[0] != '\0';

	/* The shim holds shim.lock for its whole life: a lock we cannot take
	 * means a live shim, whatever files a crash may have left. */
	_cleanup_free_ char *lock = cap_named_path(name, "shim.lock");
	_cleanup_close_ int fd = open(lock, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || flock(fd, LOCK_SH | LOCK_NB) == 0) {
		out->state = CAP_NAMED_STOPPED;
		return 0;
	}
	out->state = CAP_NAMED_RUNNING;
	_cleanup_free_ char *rt = cap_named_path(name, "runtime.json");
	json_t *j = json_load_file(rt, 0, NULL);
	if (j) {
		if (json_is_true(json_object_get(j, "paused")))
			out->state = CAP_NAMED_PAUSED;
		out->shim_pid = (pid_t)json_integer_value(json_object_get(j, "shim_pid"));
		cap_named_runtime_vmm(j, out->engine, sizeof(out->engine), &out->vmm_pid);
		const char *c = json_string_value(json_object_get(j, "control"));
		snprintf(out->control, sizeof(out->control), "%s", c ? c : "");
		const char *net = json_string_value(json_object_get(j, "network"));
		const char *nerr = json_string_value(json_object_get(j, "network_error"));
		out->netd_pid = (pid_t)json_integer_value(json_object_get(j, "netd_pid"));
		out->nic = net || nerr;
		snprintf(out->network_error, sizeof(out->network_error), "%s", nerr ? nerr : "");
		json_decref(j);
	}
	return 0;
}

bool cap_named_uses_image(void *ud, const char *digest)
{
	(void)ud;
	char **names;
	size_t n;
	bool used = false;
	cap_named_list(&names, &n);
	for (size_t i = 0; i < n; i++) {
		struct cap_record rec;
		if (!used && cap_named_load(names[i], &rec, NULL) == 0 && strcmp(rec.image, digest) == 0)
			used = true;
		free(names[i]);
	}
	free(names);
	return used;
}
