/* Making cgroup folders (cgroup.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cgroup.h"
#include "util.h"

/* Whether word is one of the space-separated words of list. */
static bool has_word(const char *list, const char *word)
{
	size_t n = strlen(word);
	for (const char *p = list; (p = strstr(p, word)); p += n)
		if ((p == list || p[-1] == ' ' || p[-1] == '\n') &&
		    (p[n] == '\0' || p[n] == ' ' || p[n] == '\n'))
			return true;
	return false;
}

const char *cap_cgroup_rel_path(const char *p)
{
	while (*p == '/')
		p++;
	if (strstr(p, "//"))
		return NULL;
	for (const char *s = p; *s;) {
		size_t n = strcspn(s, "/");
		if ((n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return NULL;
		s += n;
		s += *s == '/';
	}
	return p;
}

int cap_cgroup_write(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = cap_write_all(fd, s, strlen(s));
	close(fd);
	return r;
}

int cap_cgroup_delegate(const char *dir, struct cap_err *err)
{
	static const char *const ctls[] = { "memory", "pids", "cpu" };
	_cleanup_free_ char *avail_path = xasprintf("%s/cgroup.controllers", dir);
	_cleanup_free_ char *sub_path = xasprintf("%s/cgroup.subtree_control", dir);
	_cleanup_free_ char *avail = NULL, *enabled = NULL;
	int r;
	if ((r = cap_read_file(avail_path, 4096, &avail)) < 0)
		return cap_err_set(err, -r, "cannot read %s: %s", avail_path, strerror(-r));
	if ((r = cap_read_file(sub_path, 4096, &enabled)) < 0)
		return cap_err_set(err, -r, "cannot read %s: %s", sub_path, strerror(-r));
	for (size_t i = 0; i < CAP_ARRAY_SIZE(ctls); i++) {
		if (!has_word(avail, ctls[i]) || has_word(enabled, ctls[i]))
			continue;
		char word[16];
		snprintf(word, sizeof(word), "+%s", ctls[i]);
		if ((r = cap_cgroup_write(sub_path, word)) < 0)
			return cap_err_set(err, -r, "cannot enable the %s controller in %s: %s",
					   ctls[i], sub_path, strerror(-r));
	}
	return 0;
}

int cap_cgroup_mkdir_p(const char *root, const char *rel, bool v2,
		       struct cap_err *err)
{
	int r;
	/* The hierarchy's root is handed down to best effort, as it always
	 * was: it may be delegated already by whoever owns it. */
	if (v2) {
		struct cap_err ignored = { 0 };
		cap_cgroup_delegate(root, &ignored);
	}
	for (const char *c = rel; *c;) {
		size_t n = strcspn(c, "/");
		if (n) {
			_cleanup_free_ char *p = xasprintf("%s/%.*s", root, (int)(c - rel + n), rel);
			if (mkdir(p, 0755) < 0 && errno != EEXIST)
				return cap_err_set(err, errno, "cannot create cgroup %s: %s", p, strerror(errno));
			if (v2 && (r = cap_cgroup_delegate(p, err)) < 0)
				return r;
		}
		c += n;
		c += *c == '/';
	}
	return 0;
}
