/* The identity → sandbox mapping: CAPSULE_HOME/workspaces/<agent>/<peer>/
 * record.json, written atomically before the sandbox it names is made, so
 * that a crash leaves a known sandbox and never an orphan disk. It also
 * notes the private import once it ran ("imported", "import"). */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
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

int ctl_idrec_write(const char *home, const char *agent, const char *peer,
		    const char *sandbox, struct cap_err *err)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	_cleanup_free_ char *dir = xstrdup(path);
	*strrchr(dir, '/') = '\0';
	int r = cap_mkdir_p(dir, 0700);
	if (r < 0)
		return cap_err_set(err, -r, "cannot create %s: %s", dir, strerror(-r));
	json_t *j = json_pack("{s:i, s:s, s:s, s:s, s:I}", "schema", 1, "agent", agent, "peer", peer,
			      "sandbox", sandbox, "created", (json_int_t)time(NULL));
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

int ctl_idrec_read(const char *home, const char *agent, const char *peer,
		   char name[CAP_NAME_MAX + 1])
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	json_t *j = json_load_file(path, 0, NULL);
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
	char *text = json_dumps(j, JSON_INDENT(2));
	json_decref(j);
	int r = cap_write_file_atomic(path, text, strlen(text), 0600);
	free(text);
	return r < 0 ? cap_err_set(err, -r, "cannot write %s: %s", path, strerror(-r)) : 0;
}

int ctl_idrec_read_import(const char *home, const char *agent, const char *peer,
			  struct ctl_idrec_import *out)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	json_t *j = json_load_file(path, 0, NULL);
	memset(out, 0, sizeof(*out));
	if (!json_is_object(j)) {
		json_decref(j);
		return -ENOENT;
	}
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
