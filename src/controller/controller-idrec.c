/* The identity → sandbox mapping: CAPSULE_HOME/workspaces/<agent>/<peer>/
 * record.json, written atomically before the sandbox it names is made, so
 * that a crash leaves a known sandbox and never an orphan disk. It also
 * notes the private import once it ran ("imported", "import"), and the
 * identity's own sizes ("size": cpus, memory_mib, root_mib, work_mib),
 * which may come before its sandbox. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "controller-internal.h"
#include "named.h"
#include "paths.h"
#include "util.h"

static char *record_path(const char *home, const char *agent, const char *peer)
{
	return xasprintf("%s/workspaces/%s/%s/record.json", home, agent, peer);
}

/* The identity's record, or NULL when it has none that parses as an
 * object (the readers: absent and unreadable both read as no record). */
static json_t *record_read(const char *home, const char *agent, const char *peer)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	json_t *j = json_load_file(path, 0, NULL);
	if (!json_is_object(j)) {
		json_decref(j);
		return NULL;
	}
	return j;
}

/* The record at path as an object (a new one when there is none or it
 * does not parse: a record is only ever written whole, atomically). */
static json_t *record_load(const char *path)
{
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, NULL);
	if (json_is_object(j))
		return j;
	json_decref(j);
	return json_object();
}

static int record_save(const char *path, json_t *j, struct cap_err *err)
{
	_cleanup_free_ char *dir = xstrdup(path);
	*strrchr(dir, '/') = '\0';
	int r = cap_mkdir_p(dir, 0700);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", dir, strerror(-r));
	char *text = json_dumps(j, JSON_INDENT(2));
	r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

int ctl_idrec_write(const char *home, const char *agent, const char *peer,
		    const char *sandbox, struct cap_err *err)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	/* A new mapping: of an earlier record (one whose sandbox was never
	 * made, or went away) only the identity's size override stays. */
	json_t *old = record_load(path);
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:I}", "schema", 1, "agent", agent, "peer", peer,
			      "sandbox", sandbox, "created", (json_int_t)time(NULL));
	json_t *size = json_object_get(old, "size");
	if (json_is_object(size))
		json_object_set(j, "size", size);
	json_decref(old);
	int r = record_save(path, j, err);
	json_decref(j);
	return r;
}

static const struct {
	const char *key;
	size_t off;
} size_keys[] = {
	{ "cpus", offsetof(struct cap_ctl_size, cpus) },
	{ "memory_mib", offsetof(struct cap_ctl_size, memory_mib) },
	{ "root_mib", offsetof(struct cap_ctl_size, root_mib) },
	{ "work_mib", offsetof(struct cap_ctl_size, work_mib) },
};

int ctl_idrec_set_size(const char *home, const char *agent, const char *peer,
		       const char *sandbox, const struct cap_ctl_size *over, struct cap_err *err)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	json_t *j = record_load(path);
	if (!json_object_get(j, "sandbox")) {
		/* No sandbox yet: the record names the one it will have. */
		json_object_set_new(j, "schema", json_integer(1));
		json_object_set_new(j, "agent", json_string(agent));
		json_object_set_new(j, "peer", json_string(peer));
		json_object_set_new(j, "sandbox", json_string(sandbox));
	}
	json_t *size = json_object();
	for (size_t k = 0; k < CAP_ARRAY_SIZE(size_keys); k++) {
		unsigned v = *(const unsigned *)((const char *)over + size_keys[k].off);
		if (v)
			json_object_set_new(size, size_keys[k].key, json_integer(v));
	}
	json_object_set_new(j, "size", size);
	int r = record_save(path, j, err);
	json_decref(j);
	return r;
}

int ctl_idrec_read_size(const char *home, const char *agent, const char *peer,
			struct cap_ctl_size *out)
{
	json_t *j = record_read(home, agent, peer);
	memset(out, 0, sizeof(*out));
	if (!j)
		return -ENOENT;
	json_t *size = json_object_get(j, "size");
	for (size_t k = 0; k < CAP_ARRAY_SIZE(size_keys); k++) {
		json_t *v = json_object_get(size, size_keys[k].key);
		/* What cap_ctl_set_size checked; anything else reads as not
		 * given (the default), never as a size of its own. */
		if (json_is_integer(v) && json_integer_value(v) > 0 && json_integer_value(v) <= CAP_DISK_MAX_MIB)
			*(unsigned *)((char *)out + size_keys[k].off) = (unsigned)json_integer_value(v);
	}
	json_decref(j);
	return 0;
}

int ctl_idrec_read(const char *home, const char *agent, const char *peer,
		   char name[CAP_NAME_MAX + 1])
{
	json_t *j = record_read(home, agent, peer);
	const char *s = json_string_value(json_object_get(j, "sandbox"));
	int r = -ENOENT;
	if (s && cap_named_check_name(s, NULL) == 0) {
		snprintf(name, CAP_NAME_MAX + 1, "%s", s);
		r = 0;
	}
	json_decref(j);
	return r;
}

int ctl_idrec_note_import(const char *home, const char *agent, const char *peer,
			  const struct ctl_idrec_import *note, struct cap_err *err)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	json_error_t je;
	json_t *j = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
	if (!json_is_object(j)) {
		json_decref(j);
		return cap_err_set(err, EBADMSG, "cannot read %s: %s", path, je.text);
	}
	json_object_set_new(j, "imported", json_integer((json_int_t)note->when));
	json_object_set_new(j, "import", json_pack("{s:I, s:I, s:I, s:I, s:I, s:b}",
						   "files", (json_int_t)note->files, "dirs", (json_int_t)note->dirs,
						   "bytes", (json_int_t)note->bytes,
						   "conflicts", (json_int_t)note->conflicts,
						   "refused", (json_int_t)note->refused, "absent", note->absent));
	int r = record_save(path, j, err);
	json_decref(j);
	return r;
}

int ctl_idrec_read_import(const char *home, const char *agent, const char *peer,
			  struct ctl_idrec_import *out)
{
	json_t *j = record_read(home, agent, peer);
	memset(out, 0, sizeof(*out));
	if (!j)
		return -ENOENT;
	json_t *when = json_object_get(j, "imported");
	json_t *what = json_object_get(j, "import");
	if (json_is_integer(when) && json_integer_value(when) > 0) {
		out->when = json_integer_value(when);
		out->files = (uint64_t)json_integer_value(json_object_get(what, "files"));
		out->dirs = (uint64_t)json_integer_value(json_object_get(what, "dirs"));
		out->bytes = (uint64_t)json_integer_value(json_object_get(what, "bytes"));
		out->conflicts = (uint64_t)json_integer_value(json_object_get(what, "conflicts"));
		out->refused = (uint64_t)json_integer_value(json_object_get(what, "refused"));
		out->absent = json_is_true(json_object_get(what, "absent"));
	}
	json_decref(j);
	return 0;
}

void ctl_idrec_remove(const char *home, const char *agent, const char *peer)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	unlink(path);
	*strrchr(path, '/') = '\0';
	rmdir(path);	/* the peer's directory, when empty */
	*strrchr(path, '/') = '\0';
	rmdir(path);	/* the agent's, when empty */
}

void ctl_idrec_each(const char *home,
		    void (*fn)(void *ud, const char *agent, const char *peer, const char *sandbox),
		    void *ud)
{
	_cleanup_free_ char *ws = xasprintf("%s/workspaces", home);
	DIR *da = opendir(ws);
	struct dirent *a;
	while (da && (a = readdir(da))) {
		if (!cap_controller_id_valid(a->d_name))
			continue;
		_cleanup_free_ char *adir = xasprintf("%s/%s", ws, a->d_name);
		DIR *dp = opendir(adir);
		struct dirent *p;
		while (dp && (p = readdir(dp))) {
			char name[CAP_NAME_MAX + 1];
			if (cap_controller_id_valid(p->d_name) &&
			    ctl_idrec_read(home, a->d_name, p->d_name, name) == 0)
				fn(ud, a->d_name, p->d_name, name);
		}
		if (dp)
			closedir(dp);
	}
	if (da)
		closedir(da);
}
