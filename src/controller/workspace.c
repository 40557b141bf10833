/* The identity → sandbox mapping: CAPSULE_HOME/workspaces/<agent>/<peer>/
 * record.json, written atomically before the sandbox it names is made, so
 * that a crash leaves a known sandbox and never an orphan disk. */
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

int ctl_ws_write(const char *home, const char *agent, const char *peer,
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

int ctl_ws_read(const char *home, const char *agent, const char *peer,
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

void ctl_ws_remove(const char *home, const char *agent, const char *peer)
{
	_cleanup_free_ char *path = record_path(home, agent, peer);
	unlink(path);
	*strrchr(path, '/') = '\0';
	rmdir(path);	/* the peer's directory, when empty */
	*strrchr(path, '/') = '\0';
	rmdir(path);	/* the agent's, when empty */
}

void ctl_ws_each(const char *home,
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
			    ctl_ws_read(home, a->d_name, p->d_name, name) == 0)
				fn(ud, a->d_name, p->d_name, name);
		}
		if (dp)
			closedir(dp);
	}
	if (da)
		closedir(da);
}
